#!/usr/bin/env python3
"""What a launch's stack costs in BPF on the PyTorch training loop, by stack mode: `record
--bpf-stats` of train_step.py with --no-stacks, --call-stacks fp and --call-stacks eh-frame,
rounds interleaved (the GPU machine's noise moves whole runs), medians and spreads printed; with
several builds (--gpuscope A B), every build runs every mode in each round.

    python3 bench/gpu/stack_probe_cost.py --gpuscope build-static/gpuscope [B ...] [--rounds 3] [--steps 20]
        [--modes "no stacks,fp,fp no python,eh-frame,fp 1/4,eh-frame 1/4"]

The launch probe (call_entry_emit) also runs for the kernel registrations at import, which take
no stack, so its average mixes both; a stack's own cost per launch is derived as
(mode's average - --no-stacks' average) x probe runs / launch rows. Run once with eh-frame before
timing (the first run compiles the tables into the cache; this script does so itself)."""
import argparse
import json
import os
import pathlib
import sqlite3
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
MODES = {"no stacks": ["--no-stacks"], "fp": ["--call-stacks", "fp"],
         "fp no python": ["--call-stacks", "fp", "--no-python"], "eh-frame": ["--call-stacks", "eh-frame"],
         "fp 1/4": ["--call-stacks", "fp", "--stack-every", "4"],
         "fp 1/16": ["--call-stacks", "fp", "--stack-every", "16"],
         "eh-frame 1/4": ["--call-stacks", "eh-frame", "--stack-every", "4"]}


def run(gpuscope, flags, steps, tmp):
    rec, truth = os.path.join(tmp, "r.gpuscope"), os.path.join(tmp, "t.json")
    cmd = [gpuscope, "record", "-q", "--bpf-stats", *flags, "-o", rec, "--", sys.executable,
           str(HERE / "train_step.py"), truth, "--steps", str(steps), "--no-profile"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {out.stderr.strip()[-500:]}")
    db = sqlite3.connect(rec)
    meta = dict(db.execute("SELECT key, value FROM meta"))
    stats = json.loads(meta["bpf_program_stats"])
    launches = db.execute("SELECT count(*) FROM calls c JOIN functions f ON f.id = c.func "
                          "WHERE f.kind = 'launch'").fetchone()[0]
    db.close()
    t = json.load(open(truth))
    emit = stats.get("call_entry_emit", {"runs": 0, "run_time_ns": 0})
    entry = stats.get("call_entry", {"runs": 0, "run_time_ns": 0})
    return {"emit_avg": emit["run_time_ns"] / max(emit["runs"], 1), "emit_runs": emit["runs"],
            "entry_avg": entry["run_time_ns"] / max(entry["runs"], 1), "launches": launches,
            "step_ms": (t["t1"] - t["t0"]) / t["steps"] / 1e6, "walks": meta.get("unwind_walks") or meta.get("fp_walks", ""),
            "python_walks": meta.get("python_walks", "")}


def fmt(xs, digits=0):
    return f"{statistics.median(xs):.{digits}f} ({min(xs):.{digits}f}..{max(xs):.{digits}f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpuscope", nargs="+", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--modes", default="no stacks,fp,eh-frame", help=f"of: {', '.join(MODES)}")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",")]
    if "no stacks" not in modes or any(m not in MODES for m in modes):
        ap.error(f"--modes: 'no stacks' and any of {', '.join(MODES)}")
    runs = [(b, m) for m in modes for b in args.gpuscope]
    with tempfile.TemporaryDirectory() as tmp:
        if any(m.startswith("eh-frame") for m in modes):
            run(args.gpuscope[0], MODES["eh-frame"], 2, tmp)  # tables into the cache
        res = {k: [] for k in runs}
        for r in range(args.rounds):
            for b, m in runs:
                res[(b, m)].append(run(b, MODES[m], args.steps, tmp))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"train_step.py, {args.steps} steps, {args.rounds} interleaved rounds; BPF ns (median, min..max)")
    print(f"{'build':24} {'mode':12} {'launch probe avg':>22} {'call_entry avg':>22} {'stack per launch':>22} {'step ms':>20}")
    for b, m in runs:
        rs = res[(b, m)]
        # Each round's stack cost against the same build's --no-stacks run of that round.
        base = [x["emit_avg"] for x in res[(b, "no stacks")]]
        per = [(x["emit_avg"] - a) * x["emit_runs"] / max(x["launches"], 1) for x, a in zip(rs, base)]
        print(f"{b[-24:]:24} {m:12} {fmt([x['emit_avg'] for x in rs]):>22} {fmt([x['entry_avg'] for x in rs]):>22} "
              f"{fmt(per) if m != 'no stacks' else '':>22} {fmt([x['step_ms'] for x in rs], 2):>20}")
    for b, m in runs:
        for x in res[(b, m)]:
            if x["walks"] or x["python_walks"]:
                print(f"{b[-24:]} {m}: native walks: {x['walks'] or '-'}; Python walks: {x['python_walks'] or '-'}")
    x = res[(args.gpuscope[0], "no stacks")][0]
    print(f"launch probe runs {x['emit_runs']} for {x['launches']} launch rows (the rest: registrations at import)")
    print(json.dumps({f"{b} | {m}": rs for (b, m), rs in res.items()}))


if __name__ == "__main__":
    sys.exit(main())
