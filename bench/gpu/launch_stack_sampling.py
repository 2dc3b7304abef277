#!/usr/bin/env python3
"""What taking launches' stacks for one launch in N (`record --stack-every N`, or N set by record's
default stack budget: `--every ...,b`) costs and
loses on the PyTorch training loop: each N's run of train_step.py against runs that take every
launch's stack.

    python3 bench/gpu/launch_stack_sampling.py --gpuscope build-static/gpuscope [--every 1,1,4] [--steps 200]
        [--call-stacks fp|eh-frame]

Every run records the same program, whose launches repeat step after step. The launches flame
graph of each run is compared with the first run's (every stack taken):
- total: the launches the graph counts (taken stacks x N) against the launch rows;
- tvd: the total variation distance between the two graphs' distributions, over whole stacks and
  over (innermost Python line, kernel): the share of launches the graph puts in the wrong place.
  A second run with N = 1 gives the distance two runs of the program have without sampling;
- the ten largest stacks' estimate against the first run's count.
BPF time per launch row (the launch probe's run time, --bpf-stats) says what the stacks cost."""
import argparse
import json
import os
import pathlib
import re
import sqlite3
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from stack_completeness import folded as folded_stacks, is_python, reaches_entry  # noqa: E402


def folded(gpuscope, rec):
    paths, err = folded_stacks(gpuscope, rec, "launches")
    if paths is None:
        raise SystemExit(f"flamegraph of {rec}: {err}")
    stacks = {}
    for path, value in paths:
        # Without the process (its pid differs) and with addresses in no file made alike: they
        # differ from run to run.
        key = tuple("[unknown]" if re.fullmatch(r"0x[0-9a-f]+", f) else f for f in path[1:])
        stacks[key] = stacks.get(key, 0) + value
    return stacks


def python_line(stack):
    """(innermost Python frame, kernel): what the report's call sites show."""
    py = [f for f in stack[:-1] if is_python(f)]
    return (py[-1] if py else "[no Python frame]", stack[-1])


def by(stacks, key):
    out = {}
    for k, v in stacks.items():
        out[key(k)] = out.get(key(k), 0) + v
    return out


def tvd(a, b):
    ta, tb = sum(a.values()), sum(b.values())
    return 0.5 * sum(abs(a.get(k, 0) / ta - b.get(k, 0) / tb) for k in set(a) | set(b))


def run(args, every, tmp, i):
    rec, truth = os.path.join(tmp, f"r{i}.gpuscope"), os.path.join(tmp, f"t{i}.json")
    # "b": record's default, the stacks within a budget of the process's time (N varies).
    sampling = [] if every == "b" else ["--stack-every", str(every)]
    cmd = [args.gpuscope, "record", "-q", "--bpf-stats", "--call-stacks", args.call_stacks,
           *sampling, "-o", rec, "--",
           sys.executable, str(HERE / "train_step.py"), truth, "--steps", str(args.steps), "--no-profile"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {out.stderr.strip()[-500:]}")
    db = sqlite3.connect(rec)
    meta = dict(db.execute("SELECT key, value FROM meta"))
    launches = db.execute("SELECT count(*) FROM calls c JOIN functions f ON f.id = c.func "
                          "WHERE f.kind = 'launch' AND c.parent_id IS NULL").fetchone()[0]
    db.close()
    emit = json.loads(meta["bpf_program_stats"]).get("call_entry_emit", {"run_time_ns": 0})
    t = json.load(open(truth))
    if every == "b":  # the largest N the budget set
        every = f"b{meta.get('stack_every_max', '?')}"
    return {"every": every, "rec": rec, "launches": launches, "stacks": folded(args.gpuscope, rec),
            "bpf_ns_per_launch": emit["run_time_ns"] / max(launches, 1),
            "step_ms": (t["t1"] - t["t0"]) / t["steps"] / 1e6}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpuscope", default="build/gpuscope")
    ap.add_argument("--every", default="1,1,4",
                    help="N of each run, or b for record's default stack budget (shown as b and its largest N); "
                         "the first must be 1")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--call-stacks", default="fp", help="record's --call-stacks: fp or eh-frame")
    ap.add_argument("--json", type=pathlib.Path, help="write the figures here too")
    args = ap.parse_args()
    everies = [x if x == "b" else int(x) for x in args.every.split(",")]
    if everies[0] != 1:
        ap.error("--every: the first run is the reference and takes every stack (1)")
    with tempfile.TemporaryDirectory() as tmp:
        runs = [run(args, n, tmp, i) for i, n in enumerate(everies)]
    ref = runs[0]
    ref_lines = by(ref["stacks"], python_line)
    top = sorted(ref["stacks"].items(), key=lambda kv: -kv[1])[:10]
    print(f"train_step.py, {args.steps} steps a run, --call-stacks {args.call_stacks}; the reference is run 1 "
          "(every launch's stack)")
    print(f"{'run':>3} {'N':>3} {'launch rows':>11} {'graph total':>11} {'stacks':>7} {'tvd stacks':>10} "
          f"{'tvd py line':>11} {'BPF ns/launch':>13} {'step ms':>8} {'entry':>6} {'cut':>6}")
    figures = []
    for i, r in enumerate(runs):
        total = sum(r["stacks"].values())
        f = {"every": r["every"], "launch_rows": r["launches"], "graph_total": total, "distinct_stacks": len(r["stacks"]),
             "tvd_stacks": tvd(ref["stacks"], r["stacks"]), "tvd_python_line": tvd(ref_lines, by(r["stacks"], python_line)),
             "bpf_ns_per_launch": r["bpf_ns_per_launch"], "step_ms": r["step_ms"],
             "top10_estimate_over_reference": [r["stacks"].get(k, 0) / v for k, v in top],
             # Of the launches the graph counts: those whose stack reaches main or a Python module,
             # and those the walk marked cut short (the rest end at their thread's start).
             "reach_entry": sum(v for k, v in r["stacks"].items() if reaches_entry(k)) / max(total, 1),
             "truncated": sum(v for k, v in r["stacks"].items() if "[truncated stack]" in k) / max(total, 1)}
        figures.append(f)
        print(f"{i + 1:>3} {r['every']!s:>3} {r['launches']:>11} {total:>11} {len(r['stacks']):>7} "
              f"{f['tvd_stacks']:>10.4f} {f['tvd_python_line']:>11.4f} {r['bpf_ns_per_launch']:>13.0f} {r['step_ms']:>8.3f} "
              f"{100 * f['reach_entry']:>5.1f}% {100 * f['truncated']:>5.1f}%")
    print("\nthe reference's ten largest stacks (launches): each run's count over the reference's")
    for j, (k, v) in enumerate(top):
        line, kernel = python_line(k)
        ratios = " ".join(f"{f['top10_estimate_over_reference'][j]:5.3f}" for f in figures[1:])
        print(f"  {v:>7}  {ratios}  {kernel[:60]} <- {line[:70]}")
    if args.json:
        args.json.write_text(json.dumps({"steps": args.steps, "runs": figures}, indent=1))


if __name__ == "__main__":
    main()
