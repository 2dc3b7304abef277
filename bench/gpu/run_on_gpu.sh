#!/usr/bin/env bash
# What the issues ask of the GPU machine, in stages that fit the device tool's 10-minute calls.
# Writes to ${OUT:-/tmp/gpuscope-out}.
#   BUILD=build-static STAGES="validate cost" bench/gpu/run_on_gpu.sh
#   BUILD=build-static STAGES=overhead ROUNDS=5 bench/gpu/run_on_gpu.sh
# validate: the PyTorch training loop recorded by gpuscope against torch.profiler's own count,
#           with the default launch probes (driver only) and with both levels; BPF program runs
#           per launch (traps per launch).
# cost:     per-launch cost against the empty-program floor; zero-loss event rate; own CPU/RSS.
# overhead: issue 3's suite (bench/gpu/overhead.py), all configurations interleaved.
# nvml:     what each NVML query costs while the GPU is busy (bench/nvml_refresh).
# agent:    the agent's own CPU and memory idle and at 10k and 100k launches/s (bench/agent_cost.py).
# budget:   a launch-bound PyTorch job alone and under the agent (bench/agent_cost.py --budget-check).
# soak:     the agent beside a PyTorch training job for SOAK_SECONDS: its CPU and memory over time.
# stacks:   stack completeness on the training loop for each of CALL_MODES (STACK_EXTRA: more
#           record flags, e.g. --stack-every 1; the default takes stacks by budget).
# cupti:    what --gpu-times costs the training step, by CUPTI activity (bench/gpu/cupti_api_cost.py).
# ab:       each configuration's added time inside one process of each AB_WORKLOADS workload
#           (bench/gpu/attach_ab.py: gpuscope attached and detached, torch.profiler switched on
#           and off), with the traps alone (--floor-probes) beside; AB_CONFIGS, ROUNDS, AB_WINDOW,
#           AB_GPUSCOPE_B (a second build), AB_EXTRA (more attach_ab.py flags, e.g. the CPU sets).
# gputimes: GPU times per kernel name against torch.profiler (bench/gpu/gpu_times_check.py),
#           GPUTIMES_RUNS runs of each of GPUTIMES_STEPS steps; with GPUTIMES_BLOCKING=1 every
#           launch waits for its kernel (CUDA_LAUNCH_BLOCKING), so kernels run alone in both;
#           with GPUTIMES_PACING=profiler gpuscope's runs launch at the profiler's pace (--pacing);
#           with GPUTIMES_NSYS=1 Nsight Systems measures the same steps as a third reference.
# parts:    what each part of the launch probe costs inside the training step (bench/gpu/probe_parts.py:
#           stages of the probe attached in turn to the driver's launch functions; gpuscope's own beside).
# copies:   each member of CUDA's copy family once ($BUILD/bench/copy_family, and its per-thread
#           default stream build) under record --gpu-times: the record's copies against CUPTI's
#           (bench/gpu/copy_family_check.py).
# counts:   issue 29's agent counts: the default agent beside $BUILD/targets/launch_count (1,007
#           launches of one kernel; 4,000 over 4 s), COUNTS_RUNS runs each, alone and with two shell
#           loops starting /bin/true and ls (bench/agent_counts.py): exact and marked exact, or
#           estimates within 5% marked as such; the runs that are neither are printed WRONG.
# defaults: issue 29's default stacks (bench/gpu/default_stacks.py): the share of launch, copy and
#           allocation stacks reaching main or the Python module on $BUILD/bench/launch_sites (plain
#           nvcc -O2) and on the training step (DEFAULTS_STEPS steps), the tables' first-run cost
#           with an empty cache and a warm one, and start-up, the old default (fp) beside.
# hooks:    issue 33's cost per launch: the hooks' inside one process (bench/launch_hooks_ab,
#           HOOKS_AB_BATCHES), then each way to collect launches (bench/gpu/launch_hooks_cost.py,
#           HOOKS_ROUNDS rounds; 0 skips it).
# hooksab:  issue 33's added step time inside one process: one workload per run under record, the
#           hooks switched off and on in windows, torch.profiler+stack after (bench/gpu/hooks_ab.py;
#           HOOKSAB_WORKLOADS, HOOKSAB_ROUNDS rounds of HOOKSAB_WINDOW s windows).
# attachring: issue 33's services started another way: a workload started with the hooks
#           preloaded (standby), recorded by record --pid with its ring claimed, against the probes
#           on the same process (bench/gpu/attach_ring_check.py, ATTACHRING_WORKLOADS); then what each
#           adds to the step inside one process (attach_ab.py --preload-hooks, ATTACHRING_AB_WORKLOADS,
#           ROUNDS rounds of AB_WINDOW s).
# views:    issue 29's flame graph views and GPU summary on a PyTorch CNN (bench/gpu/cnn_steps.py,
#           VIEWS_STEPS steps) under record --gpu-times --cpu-profile 99: frames per view, no
#           frame per address, the interpreter's frames gone by default; start-up apart from idle
#           gaps (bench/gpu/python_flame_views_check.py; gpu-time flame graphs as HTML in $OUT).
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-static}
OUT=${OUT:-/tmp/gpuscope-out}
STAGES=${STAGES:-validate cost}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
TORCH_LIB=$($PY -c 'import os, nvidia.cu13 as m; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64:${TORCH_LIB}"
# The agent links Debian's cpp-httplib (a shared library, with its OpenSSL); carried in $BUILD/lib,
# with Debian's libdw.so.1 and libelf.so.1, which Nsight's QdstrmImporter needs and the machine lacks.
AGENT_LIBS="$(pwd)/$BUILD/lib"
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$AGENT_LIBS"

{
  echo "== machine"; date -u; uname -r; nvidia-smi -L; lscpu | grep -E "Model name|^CPU\(s\)|L2|L3"; echo "commit: ${GPUSCOPE_COMMIT:-unknown (set GPUSCOPE_COMMIT)}"
  echo "nsys: $($PY -c 'import sys; sys.path.insert(0, "bench/gpu"); from overhead import find_nsys; print(find_nsys() or "not installed")' 2>/dev/null)"
} 2>&1 | tee "$OUT/machine.txt"

traps_per_launch() {  # BPF program runs per recorded launch, from a --bpf-stats record
  $PY - "$1" <<'EOF'
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
meta = dict(db.execute("SELECT key, value FROM meta"))
stats = json.loads(meta.get("bpf_program_stats", "{}"))
launches = db.execute("SELECT count(*) FROM calls c JOIN functions f ON f.id = c.func WHERE f.kind = 'launch'").fetchone()[0]
folded = db.execute("SELECT count(*) FROM calls WHERE driver_func IS NOT NULL").fetchone()[0]
emit = stats.get("call_entry_emit", {})
print(f"launch probes: {meta.get('launch_probes')}; launch rows {launches} (of them {folded} runtime rows with "
      f"their driver launch folded in); entry-only probe runs {emit.get('runs')} = "
      f"{emit.get('runs', 0) / max(launches, 1):.2f} per launch row, "
      f"{emit.get('run_time_ns', 0) / max(emit.get('runs', 1), 1):.0f} ns of BPF per run")
ring = {k: meta[k] for k in ("launch_ring_launches", "launch_ring_lost", "launch_ring_processes",
                              "launch_probed_processes") if k in meta}
if ring:
    print("in-process rings: " + ", ".join(f"{k} {v}" for k, v in ring.items()))
for name, s in sorted(stats.items()):
    print(f"  {name:18} runs {s['runs']:>9}  avg {s['run_time_ns'] / s['runs']:8.0f} ns")
EOF
}

if [[ " $STAGES " == *" validate "* ]]; then
{
  for probes in ${VALIDATE_PROBES:-auto both in-process}; do
    echo "== validation: PyTorch training loop vs torch.profiler, --launch-probes $probes"
    $BUILD/gpuscope record --bpf-stats --launch-probes $probes -o "$OUT/train-$probes.gpuscope" -- \
        $PY bench/gpu/train_step.py "$OUT/truth-$probes.json" --steps 5
    echo "gpuscope exit: $?"
    $PY bench/gpu/compare.py "$OUT/train-$probes.gpuscope" "$OUT/truth-$probes.json"
    traps_per_launch "$OUT/train-$probes.gpuscope"
  done
  $BUILD/gpuscope report --top 8 "$OUT/train-auto.gpuscope" > "$OUT/train-report.txt"
  head -40 "$OUT/train-report.txt"
} 2>&1 | tee "$OUT/validation.txt"
fi

if [[ " $STAGES " == *" hooks "* ]]; then
{
  echo "== the hooks' cost per launch inside one process: bench/launch_hooks_ab (hooked and libcuda's entry point in turns)"
  for i in 1 2 3; do
    echo "control, no hooks: $($BUILD/bench/launch_hooks_ab --batches ${HOOKS_AB_BATCHES:-400})"
    echo "hooks, ring drained: $($BUILD/bench/launch_ring_drain --lib $BUILD/libgpuscope_launches.so -- \
        $BUILD/bench/launch_hooks_ab --batches ${HOOKS_AB_BATCHES:-400} | tr '\n' ' ')"
  done
  if [ "${HOOKS_ROUNDS:-3}" -gt 0 ]; then
    echo "== cost per launch: bench/launch_loop, each way to collect launches, one process each"
    $PY bench/gpu/launch_hooks_cost.py --build "$BUILD" --rounds ${HOOKS_ROUNDS:-3}
  fi
} 2>&1 | tee "$OUT/hooks.txt"
fi

if [[ " $STAGES " == *" hooksab "* ]]; then
  $PY bench/gpu/hooks_ab.py --gpuscope "$BUILD/gpuscope" --python "$PY" \
      --workloads ${HOOKSAB_WORKLOADS:-generation,lstm_infer,multi_stream,eager_add} --rounds ${HOOKSAB_ROUNDS:-7} \
      --window ${HOOKSAB_WINDOW:-3} --settle ${HOOKSAB_SETTLE:-1} 2>&1 | tee "$OUT/hooksab.txt"
fi

if [[ " $STAGES " == *" attachring "* ]]; then
  for w in ${ATTACHRING_WORKLOADS:-train_step}; do
    echo "== $w: record --pid, ring claimed, against the probes"
    $PY bench/gpu/attach_ring_check.py --gpuscope "$BUILD/gpuscope" --hooks "$BUILD/libgpuscope_launches.so" \
        --python "$PY" --workload "$w" --window ${ATTACHRING_WINDOW:-6} --count-steps ${ATTACHRING_STEPS:-10}
  done 2>&1 | tee "$OUT/attachring.txt"
  for w in ${ATTACHRING_AB_WORKLOADS:-eager_add}; do
    $PY bench/gpu/attach_ab.py --gpuscope "$BUILD/gpuscope" --python "$PY" --workload "$w" --rounds ${ROUNDS:-4} \
        --window ${AB_WINDOW:-3} --settle ${AB_SETTLE:-2} --preload-hooks "$BUILD/libgpuscope_launches.so" \
        --configs "${ATTACHRING_AB_CONFIGS:-baseline,calls,+stacks budget,in-process calls,in-process budget}" \
        --out "$OUT" 2>&1 | tee "$OUT/attachring-ab-$w.txt"
  done
fi

if [[ " $STAGES " == *" cost "* ]]; then
{
  echo "== overhead per launch and event rate: real <<<1,32>>> launches"
  $PY bench/uprobe_cost.py --build "$BUILD" --mode real --calls 50000 --rounds ${ROUNDS:-5} --streams ${STREAMS:-8} \
      --rate-threads ${RATE_THREADS:-1,4,16} --rate-calls ${RATE_CALLS:-1600000} --json "$OUT/cost-real.json"
} 2>&1 | tee "$OUT/cost.txt"
fi

if [[ " $STAGES " == *" stacks "* ]]; then
{
  for calls in ${CALL_MODES:-fp dwarf eh-frame}; do
    # eh-frame: samples walked in BPF from the same tables as the calls.
    samples=""; [ "$calls" = eh-frame ] && samples="--sample-unwind eh-frame --unwind-table-mb ${UNWIND_MB:-128}"
    echo "== stacks: PyTorch training loop with CPU sampling at 99 Hz, --call-stacks $calls $samples ${STACK_EXTRA:-}"
    /usr/bin/time -f "gpuscope record: %e s wall" $BUILD/gpuscope record --bpf-stats --cpu-profile 99 \
        --call-stacks $calls $samples ${STACK_EXTRA:-} -o "$OUT/stacks-$calls.gpuscope" -- \
        $PY bench/gpu/train_step.py "$OUT/truth-stacks-$calls.json" --steps ${STACK_STEPS:-20} --no-profile
    $PY bench/gpu/stack_completeness.py "$OUT/stacks-$calls.gpuscope" --gpuscope $BUILD/gpuscope
    traps_per_launch "$OUT/stacks-$calls.gpuscope"
    $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); print("step time: %.2f ms over %d steps" % ((d["t1"] - d["t0"]) / d["steps"] / 1e6, d["steps"]))' \
        "$OUT/truth-stacks-$calls.json"
  done
  first=${CALL_MODES:-fp}; first=${first%% *}
  echo "== the Python lines the report gives the top kernels and the biggest allocations (--call-stacks $first)"
  $BUILD/gpuscope report --top 5 "$OUT/stacks-$first.gpuscope" > "$OUT/stacks-report.txt"
  sed -n '/== Kernels/,/== Copies/p;/== Biggest allocation/,/== Failed/p' "$OUT/stacks-report.txt"
  for calls in dwarf ${CALL_MODES:-fp dwarf eh-frame}; do
    [ -f "$OUT/stacks-$calls.gpuscope" ] && { ln -sf "$OUT/stacks-$calls.gpuscope" "$OUT/stacks.gpuscope"; break; }
  done
  for m in launches cpu inuse-bytes; do $BUILD/gpuscope flamegraph "$OUT/stacks.gpuscope" -m $m -o "$OUT/train-$m.html"; done
  $BUILD/gpuscope flamegraph "$OUT/stacks.gpuscope" -m cpu -o "$OUT/train-cpu.folded"
} 2>&1 | tee "$OUT/stacks.txt"
fi

if [[ " $STAGES " == *" overhead "* ]]; then
  # MERGE: overhead.json files of earlier calls (the device tool's calls are limited to 10 minutes).
  BUILD=$BUILD $PY bench/gpu/overhead.py --rounds ${ROUNDS:-5} --max-seconds ${MAX_SECONDS:-0} --out "$OUT" \
      ${CONFIGS:+--configs "$CONFIGS"} ${MERGE:+--merge $MERGE} 2>&1 | tee "$OUT/overhead.txt"
fi
if [[ " $STAGES " == *" nvml "* ]]; then
{
  echo "== NVML query costs while the GPU is busy"
  $PY bench/gpu/gpu_load.py --busy ${NVML_LOAD_SECONDS:-40} --idle 0 > /dev/null 2>&1 &
  LOAD=$!
  sleep 8
  $BUILD/bench/nvml_refresh 6 100
  kill $LOAD 2>/dev/null; wait $LOAD 2>/dev/null
} 2>&1 | tee "$OUT/nvml.txt"
fi

if [[ " $STAGES " == *" agent "* ]]; then
  LD_LIBRARY_PATH="$AGENT_LIBS:$LD_LIBRARY_PATH" $PY bench/agent_cost.py --build "$BUILD" --mode real \
      --seconds ${AGENT_SECONDS:-15} --rates ${AGENT_RATES:-0,10000,100000} 2>&1 | tee "$OUT/agent.txt"
fi

if [[ " $STAGES " == *" budget "* ]]; then
  LD_LIBRARY_PATH="$AGENT_LIBS:$LD_LIBRARY_PATH" $PY bench/agent_cost.py --build "$BUILD" --budget-check \
      --rounds ${ROUNDS:-3} --workload "$PY bench/gpu/launch_bound.py --seconds ${BUDGET_SECONDS:-40}" 2>&1 | tee "$OUT/budget.txt"
fi

if [[ " $STAGES " == *" soak "* ]]; then
  LD_LIBRARY_PATH="$AGENT_LIBS:$LD_LIBRARY_PATH" $PY bench/agent_soak.py --build "$BUILD" \
      --profile-agent "$OUT/agent-profile.folded" --seconds ${SOAK_SECONDS:-420} -- $PY bench/gpu/train_step.py /dev/null --steps 1000000 --no-profile 2>&1 | tee "$OUT/soak.txt"
fi
if [[ " $STAGES " == *" cupti "* ]]; then
  $PY bench/gpu/cupti_api_cost.py --gpuscope "$BUILD/gpuscope" --rounds ${ROUNDS:-2} --steps ${CUPTI_STEPS:-30} 2>&1 | tee "$OUT/cupti.txt"
fi
if [[ " $STAGES " == *" ab "* ]]; then
  for w in ${AB_WORKLOADS:-train_step}; do
    $PY bench/gpu/attach_ab.py --gpuscope "$BUILD/gpuscope" --workload "$w" --rounds ${ROUNDS:-5} \
        --window ${AB_WINDOW:-5} --settle ${AB_SETTLE:-2} --out "$OUT" \
        ${AB_CONFIGS:+--configs "$AB_CONFIGS"} ${AB_GPUSCOPE_B:+--gpuscope-b "$AB_GPUSCOPE_B"} \
        ${AB_EXTRA:-} 2>&1 | tee "$OUT/ab-$w.txt"
  done
fi
if [[ " $STAGES " == *" parts "* ]]; then
  $PY bench/gpu/probe_parts.py --build "$BUILD" --workload ${PARTS_WORKLOAD:-train_step} --rounds ${ROUNDS:-3} \
      --ring-mb ${PARTS_RING_MB:-64} --window ${PARTS_WINDOW:-3} ${PARTS_EXTRA:-} \
      2>&1 | tee "$OUT/parts.txt"
fi
if [[ " $STAGES " == *" gputimes "* ]]; then
  # The library's benchmark knobs, when set, name the output too (the device tool takes back
  # only names of letters, digits, '.', '-' and '_').
  knobs=${GPUSCOPE_CUPTI_API:+-api-${GPUSCOPE_CUPTI_API//,/_}}${GPUSCOPE_CUPTI_CLOCK:+-clock-$GPUSCOPE_CUPTI_CLOCK}
  name="gputimes-blocking${GPUTIMES_BLOCKING:-0}-${GPUTIMES_PACING:-free}${knobs}"
  CUDA_LAUNCH_BLOCKING=${GPUTIMES_BLOCKING:-0} $PY bench/gpu/gpu_times_check.py --gpuscope "$BUILD/gpuscope" \
      --steps ${GPUTIMES_STEPS:-100} --runs ${GPUTIMES_RUNS:-3} --pacing ${GPUTIMES_PACING:-free} \
      ${GPUTIMES_NSYS:+--nsys} --json "$OUT/$name.json" 2>&1 | tee "$OUT/$name.txt"
fi
if [[ " $STAGES " == *" defaults "* ]]; then
  $PY bench/gpu/default_stacks.py --gpuscope "$BUILD/gpuscope" --bench "$BUILD/bench" --python "$PY" \
      --steps ${DEFAULTS_STEPS:-20} --out "$OUT/defaults" 2>&1 | tee "$OUT/defaults.txt"
fi
if [[ " $STAGES " == *" views "* ]]; then
  $PY bench/gpu/python_flame_views_check.py --gpuscope "$BUILD/gpuscope" --steps ${VIEWS_STEPS:-20} --out "$OUT" \
      2>&1 | tee "$OUT/views.txt"
fi
if [[ " $STAGES " == *" counts "* ]]; then
  for args in "" "--churn" "--churn --launches 4000 --seconds 4"; do
    echo "== agent_counts.py $args" | tee -a "$OUT/counts.txt"
    LD_LIBRARY_PATH="$AGENT_LIBS:$LD_LIBRARY_PATH" $PY bench/agent_counts.py --build "$BUILD" --runs ${COUNTS_RUNS:-10} \
        $args 2>&1 | tee -a "$OUT/counts.txt"
  done
fi
if [[ " $STAGES " == *" copies "* ]]; then
  $PY bench/gpu/copy_family_check.py --gpuscope "$BUILD/gpuscope" --bench "$BUILD/bench" 2>&1 | tee "$OUT/copies.txt"
fi
rm -f "$OUT"/*.gpuscope "$OUT"/truth-*.json "$OUT"/*.nsys-rep "$OUT"/*.sqlite
