#!/usr/bin/env python3
"""Issue 29, point 5: every copy CUPTI sees is in the record, with its bytes. Runs copy_family
(tests/targets/copy_family.cu: each member of CUDA's copy family once, each of a size of its own:
3-D copies of pitched pointers, arrays and a mipmapped array's level, peer copies, copies into, out
of and between arrays, symbol copies, batch copies, through the runtime and the driver, and a
0-byte cudaMemcpy) and its per-thread default stream build (the _ptds/_ptsz forms) under
`gpuscope record --gpu-times`, and prints PASS/FAIL

  - per copy: the record's row (function, bytes, direction, host memory, batch count) against what
    the program made (its --json list), and the bytes and count of CUPTI's memcpy activities tied
    to that call against both;
  - per direction: the record's copies (calls that moved bytes, batch copies counted one by one)
    and bytes against CUPTI's memcpy records (HtoA counts as HtoD, AtoH as DtoH, AtoA/AtoD/DtoA/PtoP
    as DtoD: an array is device memory).

A 0-byte copy moves nothing: the record keeps the call (mergeSort's 24 0-byte cudaMemcpy calls),
CUPTI has no activity for it; the line for it says what CUPTI did.

    python3 bench/gpu/copy_family_check.py --gpuscope build-static/gpuscope [--bench build-static/bench]

The programs are built by bench/CMakeLists.txt into BUILD/bench (nvcc, -cudart shared): on the GPU
machine their libcudart.so.13 is PyTorch's (nvidia/cu13/lib, put on LD_LIBRARY_PATH here)."""
import argparse
import json
import os
import pathlib
import sqlite3
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
# CUpti_ActivityMemcpyKind -> (its name, the record's direction)
CUPTI_KINDS = {0: ("unknown", "unknown"), 1: ("HtoD", "HtoD"), 2: ("DtoH", "DtoH"), 3: ("HtoA", "HtoD"),
               4: ("AtoH", "DtoH"), 5: ("AtoA", "DtoD"), 6: ("AtoD", "DtoD"), 7: ("DtoA", "DtoD"),
               8: ("DtoD", "DtoD"), 9: ("HtoH", "HtoH"), 10: ("PtoP", "DtoD")}


def cuda_library_path():
    """LD_LIBRARY_PATH with the CUDA runtime PyTorch's wheel carries, and the toolkit's if any."""
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    try:
        import nvidia.cu13 as m  # noqa: the wheel's libcudart.so.13 and libcupti.so.13
        dirs.append(os.path.join(list(m.__path__)[0], "lib"))
    except ImportError:
        pass
    dirs.append("/usr/local/cuda/lib64")
    return ":".join(dirs)


def check(args, target, tmp):
    made_path, rec = os.path.join(tmp, f"{target}.json"), os.path.join(tmp, f"{target}.gpuscope")
    cmd = [args.gpuscope, "record", "--gpu-times", "-o", rec, "--", str(pathlib.Path(args.bench) / target),
           "--json", made_path]
    print(f"== {target}: {' '.join(cmd)}", flush=True)
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                         env={**os.environ, "LD_LIBRARY_PATH": cuda_library_path()})
    print("\n".join("  | " + line for line in (run.stdout + run.stderr).strip().splitlines()[-10:]))
    if not os.path.exists(made_path) or not os.path.exists(rec):
        print(f"{target}: FAIL (exit {run.returncode}: the program or the recording did not finish)")
        return False
    made = json.load(open(made_path))
    ok = True
    if not made["allocated"] or made["failed_calls"]:
        print(f"  the program's calls failed ({made['failed_calls']}; allocated: {made['allocated']}): is there a GPU?")
        ok = False
    db = sqlite3.connect(rec)
    meta = dict(db.execute("SELECT key, value FROM meta"))
    print(f"  gpu_times: {meta.get('gpu_times')}; lost: "
          f"{dict(db.execute('SELECT cause, count FROM lost WHERE count > 0').fetchall()) or 'none'}")
    rows = db.execute(
        "SELECT c.id, f.name, c.bytes, c.dir, c.host_mem, c.copies, c.ret FROM calls c JOIN functions f ON f.id = c.func "
        "WHERE f.kind = 'memcpy' AND c.parent_id IS NULL ORDER BY c.id").fetchall()
    children = {}
    for cid, parent in db.execute("SELECT id, parent_id FROM calls WHERE parent_id IS NOT NULL"):
        children.setdefault(parent, []).append(cid)
    acts = db.execute("SELECT call_id, bytes, copy_kind FROM gpu_activities WHERE kind = 'memcpy'").fetchall()
    by_call = {}
    for call_id, nbytes, kind in acts:
        by_call.setdefault(call_id, []).append((nbytes, kind))

    print(f"  {'function':34} {'made':>8} {'record':>8} {'dir':5} {'host':9} {'copies':>6} "
          f"{'CUPTI n':>7} {'CUPTI B':>8} {'kinds':10} result")
    unmatched = list(rows)
    for c in made["copies"]:
        mine = [r for r in unmatched if r[1] == c["function"]]
        row = next((r for r in mine if r[2] == c["bytes"]), mine[0] if mine else None)
        problems = []
        if row is None:
            problems.append("not in the record")
            row = (None, c["function"], None, None, None, None, None)
        else:
            unmatched.remove(row)
        _, fn, rbytes, rdir, rhost, rcopies, ret = row
        batch = "Batch" in fn
        if row[0] is not None:
            if ret != 0:
                problems.append(f"returned {ret}")
            if rbytes != c["bytes"]:
                problems.append("bytes")
            if rdir != c["dir"]:
                problems.append("direction")
            if (rhost or "") != c["host_mem"]:
                problems.append("host memory")
            if (rcopies if batch else 1) != c["copies"]:
                problems.append("copies")
        ids = [row[0]] + children.get(row[0], []) if row[0] is not None else []
        tied = [a for i in ids for a in by_call.get(i, [])]
        cupti_bytes = sum(b for b, _ in tied)
        kinds = ",".join(sorted({CUPTI_KINDS.get(k, ("?",))[0] for _, k in tied}))
        if c["bytes"] == 0:
            note = f"0-byte copy: CUPTI has {len(tied)} activities for it"
            problems += ["CUPTI bytes"] if cupti_bytes else []
        else:
            note = ""
            if cupti_bytes != c["bytes"]:
                problems.append("CUPTI bytes")
            if len(tied) != c["copies"]:
                problems.append("CUPTI count")
        ok &= not problems
        print(f"  {fn:34} {c['bytes']:8d} {'' if rbytes is None else rbytes:>8} {rdir or '-':5} {rhost or '-':9} "
              f"{(rcopies if batch else 1) or '-':>6} {len(tied):7d} {cupti_bytes:8d} {kinds:10} "
              f"{'PASS' if not problems else 'FAIL: ' + ', '.join(problems)} {note}")
    for r in unmatched:
        print(f"  a copy in the record the program did not list: {r}")

    # Per direction: the record's copies that moved bytes (ret 0) against CUPTI's records.
    rec_dir, gpu_dir = {}, {}
    for _, fn, nbytes, d, _, copies, ret in rows:
        if ret == 0 and nbytes:
            n, b = rec_dir.get(d, (0, 0))
            rec_dir[d] = (n + (copies or 1), b + nbytes)
    for _, nbytes, kind in acts:
        d = CUPTI_KINDS.get(kind, ("?", "unknown"))[1]
        n, b = gpu_dir.get(d, (0, 0))
        gpu_dir[d] = (n + 1, b + nbytes)
    untied = sum(1 for a in acts if a[0] is None)
    print(f"  CUPTI memcpy activities: {len(acts)}, not tied to a recorded call: {untied}")
    for d in sorted(set(rec_dir) | set(gpu_dir)):
        r, g = rec_dir.get(d, (0, 0)), gpu_dir.get(d, (0, 0))
        good = r == g
        ok &= good
        print(f"  {d:5}: record {r[0]:3d} copies {r[1]:9d} B, CUPTI {g[0]:3d} copies {g[1]:9d} B: "
              f"{'PASS' if good else 'FAIL'}")
    ok &= untied == 0
    print(f"{target}: {'PASS' if ok else 'FAIL'}")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpuscope", default="build-static/gpuscope")
    ap.add_argument("--bench", default=None, help="folder with copy_family and copy_family_ptds (default: "
                    "the gpuscope binary's folder's bench/)")
    ap.add_argument("--only", default="copy_family,copy_family_ptds")
    ap.add_argument("--timeout", type=int, default=120)
    args = ap.parse_args()
    args.bench = args.bench or str(pathlib.Path(args.gpuscope).resolve().parent / "bench")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for target in args.only.split(","):
            try:
                results[target] = check(args, target, tmp)
            except Exception as e:  # one program's failure must not hide the other's
                print(f"{target}: FAIL ({type(e).__name__}: {e})")
                results[target] = False
    print("summary: " + ", ".join(f"{k} {'PASS' if v else 'FAIL'}" for k, v in results.items()))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
