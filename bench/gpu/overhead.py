#!/usr/bin/env python3
"""Issue 3's overhead suite: what gpuscope adds to real GPU workloads, side by side with the
tools people would use instead, configurations interleaved round by round so that machine noise
hits all of them alike.

    BUILD=build-static python3 bench/gpu/overhead.py [--rounds 5] [--out DIR]

Workloads: a C++ loop of tiny launches (bench/launch_loop.cu: the worst case per call) and the
PyTorch workloads of workloads.py (all of them in one process per run, so that the seconds of
`import torch` and CUDA start-up are paid once and not measured). Configurations: baseline,
gpuscope calls only, + stacks, + stacks with both runtime and driver launch probes (two traps per
launch, the old default), torch.profiler (CPU + CUDA activities) without and with stacks, and
Nsight Systems when `nsys` is installed. gpuscope configurations for later features (CPU sampling,
NVML, GPU times) are added when `gpuscope record --help` offers them.

Prints a table per workload (median, min..max, ratio to baseline, added time), gpuscope's
recording figures (events/s, lost, its own CPU time and peak RSS) and the comparison with
torch.profiler; writes overhead.json and overhead.png to --out."""
import argparse
import json
import os
import pathlib
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from uprobe_cost import own_cost  # noqa: E402  gpuscope's own CPU, recording time and RSS from a record
TORCH_WORKLOADS = "eager_add,train_step,generation,copy_mix,lstm_infer,multi_stream"
CPP = "cpp_launch"


def find_nsys():
    found = shutil.which("nsys")
    if found:
        return found
    for base in ("/usr/local/cuda/bin", "/opt/nvidia", "/usr/local"):
        for p in pathlib.Path(base).glob("**/nsys") if pathlib.Path(base).is_dir() else []:
            if os.access(p, os.X_OK) and p.is_file():
                return str(p)
    return None


def configurations(gpuscope, nsys, nsys_backtraces):
    """name -> how to run it: ("gpuscope", [record flags]) / ("profiler", mode) / ("nsys", flags)."""
    helptext = subprocess.run([gpuscope, "record", "--help"], capture_output=True, text=True).stdout
    # "+stacks" rows take every call's stack, as torch.profiler+stack does (the same fidelity);
    # "+stacks budget" is record's default once it has one: launches', copies' and memsets'
    # stacks for one call in N, their walks within 1% of the process's time.
    every = ["--stack-every", "1"] if "--stack-budget" in helptext else []
    c = {"baseline": ("plain", None),
         "gpuscope calls": ("gpuscope", ["--no-stacks"]),
         "gpuscope +stacks": ("gpuscope", every),
         "gpuscope +stacks, 2 traps/launch": ("gpuscope", ["--launch-probes", "both", *every])}
    if every:
        c["gpuscope +stacks budget"] = ("gpuscope", [])
    # Later capabilities join the suite as soon as the binary offers them.
    if "probes->" in helptext:
        # record's default is in-process (issue 33: launches through the preloaded hooks' rings, no
        # trap each; 1 launch in N through a probe for its stack): the "+stacks budget" row. The
        # probes it replaced (a trap per launch), and the hooks without stacks, beside it.
        c["gpuscope probes +stacks budget"] = ("gpuscope", ["--launch-probes", "probes"])
        c["gpuscope in-process calls"] = ("gpuscope", ["--launch-probes", "in-process", "--no-stacks"])
    elif "in-process" in helptext:
        # Launches through the preloaded hooks' rings, no trap each (issue 33): calls only, and
        # with record's stack budget (1 launch in N through a probe for its stack).
        c["gpuscope in-process calls"] = ("gpuscope", ["--launch-probes", "in-process", "--no-stacks"])
        c["gpuscope in-process +stacks budget"] = ("gpuscope", ["--launch-probes", "in-process"])
    if "--no-python" in helptext:
        # "+stacks" walks Python frames too; this one shows what that walk costs.
        c["gpuscope +stacks native only"] = ("gpuscope", ["--no-python", *every])
    if "--call-stacks" in helptext:
        c["gpuscope +stacks dwarf"] = ("gpuscope", ["--call-stacks", "dwarf", *every])
    if "eh-frame" in helptext:
        # Stacks walked in BPF from .eh_frame: complete through libtorch (issue 4's 99%).
        c["gpuscope +stacks eh-frame"] = ("gpuscope", ["--call-stacks", "eh-frame", *every])
    full = []
    if "--cpu-profile" in helptext:
        c["gpuscope +stacks +cpu 99Hz"] = ("gpuscope", ["--cpu-profile", "99", *every])
        full += ["--cpu-profile", "99"]
    if "--gpu-sample-hz" in helptext:
        # NVML sampling is on by default (10 Hz): every gpuscope row above includes it; this one
        # shows what it costs.
        c["gpuscope +stacks no NVML"] = ("gpuscope", ["--gpu-sample-hz", "0", *every])
        full += ["--gpu-sample-hz", "10"]
    if "--gpu-times" in helptext:
        c["gpuscope +stacks +gpu times"] = ("gpuscope", ["--gpu-times", *every])
        full += ["--gpu-times"]
    if len(full) > 2:
        c["gpuscope everything"] = ("gpuscope", full)
    c["torch.profiler"] = ("profiler", "cuda")
    c["torch.profiler+stack"] = ("profiler", "cuda+stack")
    if nsys:
        c["nsys (cuda trace)"] = ("nsys", ["-t", "cuda", "--sample=none", "--cpuctxsw=none"])
    if nsys and nsys_backtraces:
        c["nsys (cuda trace + backtraces)"] = ("nsys", ["-t", "cuda", "--sample=none", "--cpuctxsw=none",
                                                       "--cudabacktrace=all"])
    return c


def record_figures(path):
    """What gpuscope's record says about the run: events, loss, its own cost."""
    with sqlite3.connect(path) as db:
        calls = db.execute("SELECT count(*) FROM calls").fetchone()[0]
        lost_by = dict(db.execute("SELECT cause, count FROM lost WHERE count > 0"))
    # As `record` says it: eh-frame walks cut short keep their first frames (stacks_cut), and a
    # frame without a table is walked on with frame pointers; neither is an event lost.
    stacks_cut = sum(n for c, n in lost_by.items() if c.startswith("unwind_") and c != "unwind_no_table")
    lost = sum(n for c, n in lost_by.items() if not c.startswith("unwind_"))
    cpu_s, secs, rss_mb = own_cost(path)
    return {"calls": calls, "lost": lost, "stacks_cut": stacks_cut, "lost_by_cause": lost_by, "seconds": secs, "events_per_s": calls / secs if secs else 0,
            "recorder_cpu_s": cpu_s, "recorder_max_rss_mb": rss_mb}


def run_one(workload, config, how, args, tmp):
    """Runs one configuration of one workload group; returns ({workload: per_step}, units, figures)."""
    kind, extra = how
    if workload == CPP:
        cmd = [str(args.build / "bench" / "launch_loop"), "--mode", "real", "--calls", str(args.cpp_calls),
               "--streams", str(args.cpp_streams)]
    else:
        cmd = [sys.executable, str(HERE / "workloads.py"), args.workloads]
        if kind == "profiler":
            cmd += ["--profiler", extra]
    if args.cpus:
        cmd = ["taskset", "-c", args.cpus, *cmd]
    record = tmp / "run.gpuscope"
    if kind == "gpuscope":
        cmd = [str(args.build / "gpuscope"), "record", "-q", *extra, "-o", str(record), "--"] + cmd
    elif kind == "nsys":
        cmd = [args.nsys, "profile", *extra, "--force-overwrite=true", "-o", str(tmp / "nsys"), "--"] + cmd
    # numpy's OpenBLAS threads (torch imports numpy) spin beside the launching thread on the
    # H100 VM's 16 vCPUs: one process in three ran its steps 40% slower, in every configuration
    # alike (session 31). One BLAS thread: no GPU work changes.
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{config} / {workload} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    per_step, units = {}, {}
    for line in proc.stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if workload == CPP:
            per_step[CPP], units[CPP] = r["ns_per_call"], "ns_per_launch"
        else:
            per_step[r["workload"]], units[r["workload"]] = r["per_step"], r["unit"]
    figures = record_figures(record) if kind == "gpuscope" else None
    if kind == "gpuscope":
        record.unlink()
    return per_step, units, figures


def summarise(samples, units, figures, configs):
    results = {}
    for w, by_config in samples.items():
        base = statistics.median(by_config["baseline"])
        results[w] = {"unit": units[w], "configs": {}}
        print(f"\n{w} ({units[w]}), {len(by_config['baseline'])} interleaved rounds")
        print(f"  {'configuration':34} {'median':>10} {'min..max':>21} {'x baseline':>10} {'added':>9}")
        for c, xs in by_config.items():
            med = statistics.median(xs)
            results[w]["configs"][c] = {"samples": xs, "median": med, "min": min(xs), "max": max(xs),
                                        "ratio": med / base, "added": med - base}
            print(f"  {c:34} {med:10.3f} {min(xs):10.3f}..{max(xs):<9.3f} {med / base:10.3f} {med - base:9.3f}")
        theirs = results[w]["configs"].get("torch.profiler+stack", {}).get("added")
        # Against every stack (the profiler's fidelity) and against record's default (stacks by budget).
        for ours_name, key in (("gpuscope +stacks", "profiler_stack_over_gpuscope"),
                               ("gpuscope +stacks budget", "profiler_stack_over_gpuscope_default")):
            if theirs is None or ours_name not in results[w]["configs"]:
                continue
            ours = results[w]["configs"][ours_name]["added"]
            verdict = (f"{theirs / ours:.1f}x what {ours_name} adds" if ours > 0
                       else f"time; {ours_name} added none measurable")
            print(f"  torch.profiler+stack adds {verdict} (aim: >= 5x)")
            results[w][key] = theirs / ours if ours > 0 else None
    print("\ngpuscope's recording per configuration (median over rounds; CPU and RSS are gpuscope's own)")
    print(f"  {'workload group':16} {'configuration':34} {'events/s':>10} {'lost':>6} {'cut':>6} {'CPU s':>7} "
          f"{'CPU % of 1 core':>15} {'RSS MiB':>8}   (cut: eh-frame stacks cut short, kept)")
    for (group, c), fs in figures.items():
        med = lambda k: statistics.median(f[k] for f in fs)
        cpu_share = 100 * med("recorder_cpu_s") / med("seconds") if med("seconds") else 0
        print(f"  {group:16} {c:34} {med('events_per_s'):10.0f} {max(f['lost'] for f in fs):6d} {max(f.get('stacks_cut', 0) for f in fs):6d} "
              f"{med('recorder_cpu_s'):7.2f} {cpu_share:15.1f} {med('recorder_max_rss_mb'):8.0f}")
    return results


def chart(results, configs, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not available: no chart")
        return
    fig, axes = plt.subplots(1, len(results), figsize=(3.6 * len(results), 4.2), squeeze=False)
    for ax, (w, r) in zip(axes[0], results.items()):
        names = [c for c in configs if c in r["configs"]]
        meds = [r["configs"][c]["ratio"] for c in names]
        base = r["configs"]["baseline"]["median"]
        lo = [m - r["configs"][c]["min"] / base for c, m in zip(names, meds)]
        hi = [r["configs"][c]["max"] / base - m for c, m in zip(names, meds)]
        colors = ["grey" if c == "baseline" else "tab:blue" if c.startswith("gpuscope") else "tab:orange"
                  if c.startswith("torch") else "tab:green" for c in names]
        ax.bar(range(len(names)), meds, yerr=[lo, hi], color=colors, capsize=2)
        ax.set_xticks(range(len(names)), [c.replace(" ", "\n", 1) for c in names], fontsize=6, rotation=90)
        ax.set_title(f"{w} ({r['unit']})", fontsize=8)
        ax.set_ylabel("time / baseline (median, min..max)", fontsize=7)
        ax.axhline(1.0, color="black", linewidth=0.5)
    fig.tight_layout()
    fig.savefig(out / "overhead.png", dpi=110)


def save(out, args, configs, samples, units, figures, dropped, rounds_done):
    """Writes overhead.json (raw samples included, so that later runs can --merge them) and the
    chart; called after every round so that a run cut short keeps what it measured."""
    by_config = {w: {c: cs[c] for c in configs if c in cs and c not in dropped and cs[c]} for w, cs in samples.items()}
    results = summarise(by_config, units, figures, configs)
    doc = {"rounds": rounds_done, "configs": {c: list(map(str, v)) for c, v in configs.items() if c not in dropped},
           "nsys": args.nsys, "dropped": sorted(dropped), "workloads": results, "units": units,
           "recording": {f"{g} / {c}": fs for (g, c), fs in figures.items()}}
    (out / "overhead.json").write_text(json.dumps(doc, indent=1))
    chart(results, [c for c in configs if c not in dropped], out)


def merge(paths, samples, units, figures):
    """Adds the raw samples of earlier runs (their overhead.json) to this one's. Returns the rounds."""
    rounds = 0
    for path in paths:
        doc = json.loads(pathlib.Path(path).read_text())
        rounds += doc["rounds"]
        units.update(doc["units"])
        for w, r in doc["workloads"].items():
            for c, v in r["configs"].items():
                samples.setdefault(w, {}).setdefault(c, []).extend(v["samples"])
        for key, fs in doc["recording"].items():
            group, c = key.split(" / ", 1)
            figures.setdefault((group, c), []).extend(fs)
    return rounds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workloads", default=TORCH_WORKLOADS, help="PyTorch workloads (workloads.py), '' for none")
    ap.add_argument("--cpp-calls", type=int, default=200000, help="launches per C++ loop run; 0 to skip it")
    ap.add_argument("--cpp-streams", type=int, default=8,
                    help="streams the C++ loop launches over (several keep it bound by the CPU, not the GPU)")
    ap.add_argument("--nsys-backtraces", action="store_true", help="also run Nsight Systems with CUDA backtraces")
    ap.add_argument("--configs", default="", help="comma-separated configuration names to run (default: all)")
    ap.add_argument("--max-seconds", type=float, default=0, help="start no round after this many seconds")
    ap.add_argument("--cpus", default="", help="run the workloads on these CPUs (taskset -c), e.g. 2-7: the same "
                                               "CPUs for every configuration")
    ap.add_argument("--merge", nargs="*", default=[], help="overhead.json files of earlier runs to add to this one")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args()
    args.build = pathlib.Path(os.environ.get("BUILD", ROOT / "build")).resolve()
    args.nsys = find_nsys()
    print(f"Nsight Systems: {args.nsys or 'not installed on this machine: its configurations are skipped'}")
    configs = configurations(str(args.build / "gpuscope"), args.nsys, args.nsys_backtraces)
    if args.configs:
        wanted = ["baseline"] + [c for c in args.configs.split(",") if c != "baseline"]
        unknown = [c for c in wanted if c not in configs]
        if unknown:
            raise SystemExit(f"unknown configurations {unknown}; known: {list(configs)}")
        configs = {c: configs[c] for c in configs if c in wanted}
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="gpuscope-overhead-"))
    groups = ([CPP] if args.cpp_calls else []) + ([args.workloads] if args.workloads else [])
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    samples, units, figures, dropped = {}, {}, {}, set()
    done = merge(args.merge, samples, units, figures)
    started = time.monotonic()
    for r in range(args.rounds):
        if args.max_seconds and r and time.monotonic() - started > args.max_seconds * r / (r + 1):
            print(f"stopping after {r} rounds: another would pass --max-seconds", file=sys.stderr)
            break
        # Rotate the order each round too, so that no configuration always runs first or last.
        shift = (done + r) % len(configs)
        order = list(configs)[shift:] + list(configs)[:shift]
        for group in groups:
            for c in order:
                if (group == CPP and configs[c][0] == "profiler") or c in dropped:
                    continue  # torch.profiler profiles Python programs only
                try:
                    per_step, u, f = run_one(group, c, configs[c], args, tmp)
                except RuntimeError as e:
                    if configs[c][0] != "nsys":
                        raise
                    print(f"dropping {c}: {e}", flush=True)  # a tool we do not own: say so, go on
                    dropped.add(c)
                    continue
                units.update(u)
                for w, v in per_step.items():
                    samples.setdefault(w, {}).setdefault(c, []).append(v)
                if f:
                    figures.setdefault(("c++ loop" if group == CPP else "pytorch", c), []).append(f)
        print(f"round {r + 1}/{args.rounds} done ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
        save(out, args, configs, samples, units, figures, dropped, done + r + 1)


if __name__ == "__main__":
    main()
