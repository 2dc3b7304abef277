#!/usr/bin/env python3
"""What a launch's stack costs in BPF on the PyTorch training loop, by stack mode: `record
--bpf-stats` of train_step.py with --no-stacks, --call-stacks fp and --call-stacks eh-frame,
rounds interleaved (the GPU machine's noise moves whole runs), medians and spreads printed.

    python3 bench/gpu/stack_probe_cost.py --gpuscope build-static/gpuscope [--rounds 3] [--steps 20]

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
MODES = {"no stacks": ["--no-stacks"], "fp": ["--call-stacks", "fp"], "eh-frame": ["--call-stacks", "eh-frame"]}


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
            "step_ms": (t["t1"] - t["t0"]) / t["steps"] / 1e6, "walks": meta.get("unwind_walks") or meta.get("fp_walks", "")}


def fmt(xs, digits=0):
    return f"{statistics.median(xs):.{digits}f} ({min(xs):.{digits}f}..{max(xs):.{digits}f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpuscope", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run(args.gpuscope, MODES["eh-frame"], 2, tmp)  # tables into the cache
        res = {m: [] for m in MODES}
        for r in range(args.rounds):
            for m, flags in MODES.items():
                res[m].append(run(args.gpuscope, flags, args.steps, tmp))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    base = [x["emit_avg"] for x in res["no stacks"]]
    print(f"train_step.py, {args.steps} steps, {args.rounds} interleaved rounds; BPF ns (median, min..max)")
    print(f"{'mode':10} {'launch probe avg':>22} {'call_entry avg':>22} {'stack per launch':>22} {'step ms':>20}")
    for m, rs in res.items():
        # Each round's stack cost against the same round's --no-stacks run.
        per = [(x["emit_avg"] - b) * x["emit_runs"] / max(x["launches"], 1) for x, b in zip(rs, base)]
        print(f"{m:10} {fmt([x['emit_avg'] for x in rs]):>22} {fmt([x['entry_avg'] for x in rs]):>22} "
              f"{fmt(per) if m != 'no stacks' else '':>22} {fmt([x['step_ms'] for x in rs], 2):>20}")
    for m in ("fp", "eh-frame"):
        for x in res[m]:
            print(f"{m} walks: {x['walks']}")
    x = res["no stacks"][0]
    print(f"launch probe runs {x['emit_runs']} for {x['launches']} launch rows (the rest: registrations at import)")
    print(json.dumps({m: rs for m, rs in res.items()}))


if __name__ == "__main__":
    sys.exit(main())
