#!/usr/bin/env python3
"""Checks Python frames on this machine's interpreter (3.12 on the GPU machine): records
tests/targets/py_cuda.py calling the real CUDA runtime, and compares each call's Python frames
with the lines the script marks; then tests/targets/py_deep.py, 60 levels deep with an entry from
C every tenth level (3.12's shim frames on the C stack). Prints one line per call and PASS/FAIL.

    python3 bench/gpu/python_frames_check.py --gpuscope build-static/gpuscope --cudart .../libcudart.so.13"""
import argparse
import os
import pathlib
import re
import sqlite3
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "targets" / "py_cuda.py"
DEEP = ROOT / "tests" / "targets" / "py_deep.py"
DEEP_NEST = 60


def marked(script):
    return {m.group(1): n for n, text in enumerate(script.read_text().splitlines(), 1)
            if (m := re.search(r"# line: (\w+)", text))}


def record_python_frames(args, script, script_args):
    """Records the script with gpuscope: each call's Python frames, innermost first, as
    {(call id, function, pid, returned): [(function, file, line), ...]}, and the losses."""
    with tempfile.TemporaryDirectory() as tmp:
        rec = os.path.join(tmp, "py.gpuscope")
        out = subprocess.run([args.gpuscope, "record", "-o", rec, "--", args.python, str(script), args.cudart,
                              *script_args], capture_output=True, text=True, timeout=300)
        print(out.stderr.strip())
        db = sqlite3.connect(rec)
        rows = db.execute(
            "SELECT c.id, f.name, c.pid, c.ret, p.function, p.file, p.line FROM calls c JOIN functions f ON f.id = c.func "
            "JOIN stack_frames sf ON sf.stack_id = c.stack_id JOIN modules m ON m.id = sf.module_id "
            "AND m.path = '[python]' JOIN python_frames p ON p.id = sf.offset ORDER BY c.id, sf.depth").fetchall()
        lost = dict(db.execute("SELECT cause, count FROM lost WHERE count > 0"))
    calls = {}
    for cid, name, pid, ret, fn, file, line in rows:
        calls.setdefault((cid, name, pid, ret), []).append((fn, file, line))
    return calls, lost


def check_deep(args):
    """py_deep.py's one cudaMalloc: its whole Python stack, frame by frame."""
    at, script = marked(DEEP), str(DEEP)
    calls, _ = record_python_frames(args, DEEP, [str(DEEP_NEST)])
    want = [("from_generator", script, at["malloc"]), ("nest", script, at["leaf"])]
    want += [("nest", script, at["through_c" if d % 10 == 5 else "nest"]) for d in range(1, DEEP_NEST + 1)]
    want.append(("<module>", script, at["module"]))
    got = [f for (_, name, _, _), frames in calls.items() if name == "cudaMalloc" for f in frames]
    ok = got == want
    print(f"{'ok ' if ok else 'BAD'} py_deep.py cudaMalloc: {len(got)} Python frames ({len(want)} expected), "
          f"{sum(1 for f in got if f[2] == at['through_c'])} entered from C")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpuscope", default="build-static/gpuscope")
    ap.add_argument("--cudart", required=True)
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    at, script = marked(SCRIPT), str(SCRIPT)
    # With a GPU, cudaMalloc calls the driver's cuMemAlloc_v2 with the same Python stack.
    expected = {
        "cuMemAlloc_v2": [("allocate", at["malloc"]), ("Model.step", at["step"]), ("main", at["main"]),
                          ("<module>", at["module"])],
        "cudaMalloc": [("allocate", at["malloc"]), ("Model.step", at["step"]), ("main", at["main"]),
                       ("<module>", at["module"])],
        "cudaDeviceSynchronize": [("in_thread", at["sync"]), ("Thread.run", None), ("Thread._bootstrap_inner", None),
                                  ("Thread._bootstrap", None)],
        "cudaFree": [("in_child", at["child"]), ("main", at["fork"]), ("<module>", at["module"])],
    }
    calls, lost = record_python_frames(args, SCRIPT, [])
    ok = bool(calls)
    for (cid, name, pid, ret), frames in calls.items():
        want = expected.get(name)
        good = want is not None and len(frames) == len(want) and all(
            f[0] == w[0] and (w[1] is None or (f[1] == script and f[2] == w[1])) for f, w in zip(frames, want))
        ok &= good
        shown = " < ".join(f"{fn} ({os.path.basename(file)}:{line})" for fn, file, line in frames)
        print(f"{'ok ' if good else 'BAD'} {name} (pid {pid}, returned {ret}): {shown}")
    print(f"lost: {lost or 'none'}")
    runtime = sum(1 for (_, name, _, _) in calls if name.startswith("cuda"))
    ok &= runtime == 5
    if runtime != 5:
        print(f"{runtime} runtime calls with Python frames, 5 expected")
    ok &= check_deep(args)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
