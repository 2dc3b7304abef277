#!/usr/bin/env python3
"""Issue 5: kernels launched by Triton, CuPy and JAX (driver API, modules loaded at run time) are
named and timed. Each workload in bench/gpu/frameworks/ runs under `gpuscope record --gpu-times`;
this reads the record back and prints, per kernel name: launches seen by the uprobes, kernels timed
by CUPTI, how many of those are tied to their launch call, and the Python line of the launch.

    python3 bench/gpu/frameworks_check.py --gpuscope build-static/gpuscope [--only triton,cupy,jax]"""
import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import pathlib

HERE = pathlib.Path(__file__).resolve().parent / "frameworks"


def python_line(db, call_id, in_file=None):
    """The innermost Python frame of the call's stack, or the innermost one in `in_file` (a
    framework's own launcher, e.g. Triton's CudaLauncher, sits between the user's line and the launch)."""
    rows = db.execute(
        "SELECT p.function, p.file, p.line FROM calls c JOIN stack_frames sf ON sf.stack_id = c.stack_id "
        "JOIN modules m ON m.id = sf.module_id AND m.path = '[python]' JOIN python_frames p ON p.id = sf.offset "
        "WHERE c.id = ? ORDER BY sf.depth", (call_id,)).fetchall()
    rows = [r for r in rows if in_file is None or os.path.basename(r[1]) == os.path.basename(in_file)]
    return f"{rows[0][0]} ({os.path.basename(rows[0][1])}:{rows[0][2]})" if rows else "[no Python frame]"


def check(args, name, tmp):
    truth_path, rec = os.path.join(tmp, f"{name}.json"), os.path.join(tmp, f"{name}.gpuscope")
    cmd = [args.gpuscope, "record", "--gpu-times", "-o", rec, "--", args.python, str(HERE / f"fw_{name}.py"),
           truth_path, "--launches", str(args.launches)]
    print(f"== {name}: {' '.join(cmd)}", flush=True)
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    print("\n".join("  | " + l for l in (run.stderr.strip().splitlines()[-12:])))
    if run.returncode != 0 or not os.path.exists(truth_path):
        print(f"{name}: FAIL (exit {run.returncode}; the workload did not finish)")
        return False
    truth = json.load(open(truth_path))
    db = sqlite3.connect(rec)
    meta = dict(db.execute("SELECT key, value FROM meta"))
    print(f"{truth['framework']} {truth['version']}; gpu_times: {meta.get('gpu_times')}")
    funcs = db.execute("SELECT f.name, count(*) FROM calls c JOIN functions f ON f.id = c.func "
                       "WHERE f.kind IN ('launch', 'graph_launch') AND c.parent_id IS NULL GROUP BY 1 ORDER BY 2 DESC").fetchall()
    print("launch calls by function: " + ", ".join(f"{f} {n}" for f, n in funcs))
    # Host side: launches by kernel name (from the handle's cuModuleGetFunction/cuLibraryGetKernel).
    host = dict(db.execute("SELECT coalesce(k.name, '[unnamed]'), count(*) FROM calls c JOIN functions f ON f.id = c.func "
                           "LEFT JOIN kernels k ON k.id = c.kernel_id WHERE f.kind = 'launch' AND c.parent_id IS NULL "
                           "GROUP BY 1").fetchall())
    gpu = {n: (cnt, tied, ns, bad) for n, cnt, tied, ns, bad in db.execute(
        "SELECT coalesce(name, '[unnamed]'), count(*), count(call_id), sum(end_ns - start_ns), "
        "sum(end_ns <= start_ns) FROM gpu_activities WHERE kind = 'kernel' GROUP BY 1")}
    total = sum(v[0] for v in gpu.values())
    tied = sum(v[1] for v in gpu.values())
    print(f"GPU kernels timed: {total}, tied to a launch call: {tied}; named: {total - gpu.get('[unnamed]', (0,))[0]}")
    print(f"launch calls whose kernel the uprobes could not name: {host.get('[unnamed]', 0)} of {sum(host.values())}; "
          f"lost: {dict(db.execute('SELECT cause, count FROM lost WHERE count > 0').fetchall()) or 'none'}")
    print(f"  {'launches':>8} {'GPU n':>7} {'tied':>7} {'GPU us':>10}  kernel  <- Python line of a launch")
    demangled = dict(db.execute("SELECT name, demangled FROM kernels"))
    names = sorted(set(host) | set(gpu), key=lambda n: -gpu.get(n, (0, 0, 0))[2])
    for n in names[:args.top]:
        cnt, t, ns, _ = gpu.get(n, (0, 0, 0, 0))
        call = db.execute("SELECT c.id FROM calls c JOIN kernels k ON k.id = c.kernel_id WHERE k.name = ? "
                          "AND c.parent_id IS NULL LIMIT 1", (n,)).fetchone()
        where = python_line(db, call[0]) if call else ""
        print(f"  {host.get(n, 0):8d} {cnt:7d} {t:7d} {ns / 1e3:10.1f}  {demangled.get(n, n)[:70]}  <- {where}")
    ok = total > 0 and tied == total and "[unnamed]" not in gpu and not any(v[3] for v in gpu.values())
    for n, want in truth["expected"].items():
        h, g = host.get(n, 0), gpu.get(n, (0, 0, 0, 0))
        call = db.execute("SELECT c.id FROM calls c JOIN kernels k ON k.id = c.kernel_id WHERE k.name = ? "
                          "LIMIT 1", (n,)).fetchone()
        line = python_line(db, call[0], truth["launch_file"]) if call else "[no launch]"
        good = h == want and g[0] == want and g[1] == want and os.path.basename(truth["launch_file"]) in line
        if call:
            line += f" (innermost: {python_line(db, call[0])})"
        print(f"  expected {n}: {want} launched; seen {h} launches, {g[0]} timed, {g[1]} tied, from {line}: "
              f"{'ok' if good else 'MISMATCH'}")
        ok &= good
    if not truth["expected"]:
        lines = {python_line(db, c) for (c,) in db.execute(
            "SELECT c.id FROM calls c JOIN functions f ON f.id = c.func WHERE f.kind IN ('launch', 'graph_launch') "
            "AND c.parent_id IS NULL AND c.tid = (SELECT tid FROM calls ORDER BY id LIMIT 1) LIMIT 50")}
        print(f"  launch lines on the main thread: {sorted(lines)[:5]}")
        ok &= total >= truth.get("steps", 0)
    print(f"{name}: {'PASS' if ok else 'FAIL'}")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpuscope", default="build-static/gpuscope")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--only", default="triton,cupy,jax")
    ap.add_argument("--launches", type=int, default=200)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--timeout", type=int, default=240)
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only.split(","):
            try:
                results[name] = check(args, name, tmp)
            except Exception as e:  # one framework's failure must not hide the others'
                print(f"{name}: FAIL ({type(e).__name__}: {e})")
                results[name] = False
    print("summary: " + ", ".join(f"{k} {'PASS' if v else 'FAIL'}" for k, v in results.items()))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
