#!/usr/bin/env bash
# Session 19's device calls (issue 30), run from the repository root on the GPU machine with
# build-static/ (stripped static gpuscope, its shared libraries, bench/launch_loop,
# targets/launch_count) and build-fuzz-dev/ (fuzz.tar.xz: the nine fuzz binaries, clang -O1,
# ASan + UBSan; runs.tar.xz: corpora of earlier runs) carried. Writes under $OUT.
#   run.sh fuzz "fuzz_record_reader:170 fuzz_agent_config:130"   (target:seconds, each on all cores)
#   run.sh agent                                                  (bench/agent_stress.py flood and churn)
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/build-static/lib
case $1 in
  fuzz)
    (cd build-fuzz-dev && tar xJf fuzz.tar.xz && tar xJf runs.tar.xz)
    jobs=$(( $(nproc) - 2 ))
    mode=${MODE:-JOBS}  # JOBS: libFuzzer -fork; WORKERS: independent fuzzers (-jobs)
    for spec in $2; do
      t=${spec%:*} s=${spec#*:}
      env "$mode=$jobs" NO_BUILD=1 BUILD=build-fuzz-dev OUT=$PWD/build-fuzz-dev/runs TARGETS=$t bash bench/fuzz.sh "$s" \
        | tee -a "$OUT/fuzz-summary.txt"
      echo "== $t ($jobs $mode): $(tail -1 "build-fuzz-dev/runs/$t.log")" >> "$OUT/fuzz-last-status-lines.txt"
      mkdir -p "$OUT/crashes" && cp -r "build-fuzz-dev/runs/crashes/$t" "$OUT/crashes/" 2>/dev/null
    done
    (cd build-fuzz-dev && tar cJf "$OUT/runs.tar.xz" runs/corpus) ;;
  agent)
    nproc > "$OUT/machine.txt"; nvidia-smi -L >> "$OUT/machine.txt" 2>&1
    b=(--build build-static)
    python3 bench/agent_stress.py flood --threads 12 --seconds 20 "${b[@]}" > "$OUT/flood.txt" 2>&1
    for a in --no-agent ""; do
      python3 bench/agent_stress.py churn --processes 300 --parallel 16 "${b[@]}" $a > "$OUT/churn300$a.txt" 2>&1
      # CUDA initialisation fails at once without a visible device: the programs still load the
      # CUDA libraries, are held at their load and attached to, and exit within milliseconds.
      CUDA_VISIBLE_DEVICES= python3 bench/agent_stress.py churn --processes 10000 --parallel 16 "${b[@]}" $a \
        > "$OUT/churn10000-no-device$a.txt" 2>&1
    done ;;
esac
