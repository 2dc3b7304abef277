#!/usr/bin/env python3
"""GPU times (issue 5): per kernel name, the total GPU time `gpuscope record --gpu-times` measures
for train_step.py's profiled steps against torch.profiler's for the same steps, run separately
(two CUPTI users cannot share a process), and the kernel counts of both.

    python3 bench/gpu/gpu_times_check.py --gpuscope build-static/gpuscope [--steps 5]"""
import argparse
import json
import os
import pathlib
import sqlite3
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpuscope", default="build-static/gpuscope")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        truth_path, ours_path, rec = (os.path.join(tmp, n) for n in ("truth.json", "ours.json", "run.gpuscope"))
        subprocess.run([args.python, str(HERE / "train_step.py"), truth_path, "--steps", str(args.steps)], check=True)
        run = subprocess.run([args.gpuscope, "record", "--gpu-times", "-o", rec, "--", args.python,
                              str(HERE / "train_step.py"), ours_path, "--steps", str(args.steps), "--no-profile"],
                             capture_output=True, text=True)
        print(run.stderr.strip())
        truth, ours_run = json.load(open(truth_path)), json.load(open(ours_path))
        db = sqlite3.connect(rec)
        meta = dict(db.execute("SELECT key, value FROM meta"))
        # Kernels whose launch call lies in the profiled window (or, untied, that started in it).
        rows = db.execute(
            "SELECT a.name, count(*), sum(a.end_ns - a.start_ns) FROM gpu_activities a LEFT JOIN calls c ON c.id = a.call_id "
            "WHERE a.kind = 'kernel' AND a.pid = ?1 AND coalesce(c.ts_ns, a.start_ns) BETWEEN ?2 AND ?3 GROUP BY 1",
            (ours_run["pid"], ours_run["t0"], ours_run["t1"])).fetchall()
        tied = db.execute("SELECT count(*), count(call_id) FROM gpu_activities WHERE kind = 'kernel'").fetchone()
        lines = db.execute(
            "SELECT p.function || ' (' || p.file || ':' || p.line || ')', sum(a.end_ns - a.start_ns) FROM gpu_activities a "
            "JOIN calls c ON c.id = a.call_id JOIN stack_frames sf ON sf.stack_id = c.stack_id "
            "JOIN modules m ON m.id = sf.module_id AND m.path = '[python]' JOIN python_frames p ON p.id = sf.offset "
            "WHERE a.kind = 'kernel' AND sf.depth = (SELECT min(depth) FROM stack_frames f2 JOIN modules m2 ON "
            "m2.id = f2.module_id AND m2.path = '[python]' WHERE f2.stack_id = c.stack_id) GROUP BY 1 ORDER BY 2 DESC "
            "LIMIT 5").fetchall()
    print(f"gpu_times meta: {meta.get('gpu_times')}")
    print(f"kernels recorded: {tied[0]}, tied to their launch call: {tied[1]}")
    ours = {n: (c, ns / 1e3) for n, c, ns in rows}
    theirs = {n: (truth["kernels"][n], truth["kernel_us"].get(n, 0)) for n in truth["kernels"]}
    names = sorted(set(ours) | set(theirs), key=lambda n: -theirs.get(n, ours.get(n, (0, 0)))[1])
    equal_counts = sum(1 for n in names if ours.get(n, (0,))[0] == theirs.get(n, (0,))[0])
    within = 0
    total_ours = sum(v[1] for v in ours.values())
    total_theirs = sum(v[1] for v in theirs.values())
    print(f"{len(names)} kernel names; {equal_counts} with equal counts; GPU time in all: gpuscope {total_ours:.0f} us, "
          f"torch.profiler {total_theirs:.0f} us ({100 * (total_ours - total_theirs) / max(total_theirs, 1e-9):+.2f}%)")
    print(f"  {'gpuscope n':>10} {'profiler n':>10} {'gpuscope us':>12} {'profiler us':>12} {'diff':>8}  kernel")
    for n in names:
        oc, ous = ours.get(n, (0, 0.0))
        tc, tus = theirs.get(n, (0, 0.0))
        diff = 100 * (ous - tus) / tus if tus else float("nan")
        within += abs(diff) <= 2
        print(f"  {oc:10d} {tc:10d} {ous:12.1f} {tus:12.1f} {diff:+7.2f}%  {n[:110]}")
    print(f"{within} of {len(names)} kernel names within 2% of torch.profiler's GPU time")
    print("GPU time by Python line (innermost Python frame of the launch):")
    for line, ns in lines:
        print(f"  {ns / 1e3:10.1f} us  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
