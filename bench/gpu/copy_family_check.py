#!/usr/bin/env python3
"""Issue 29, point 5: every copy CUPTI sees is in the record, with its bytes. Runs copy_family
(tests/targets/copy_family.cu: each member of CUDA's copy family once, each of a size of its own:
3-D copies of pitched pointers, arrays and a mipmapped array's level, peer copies, copies into, out
of and between arrays, symbol copies, batch copies, through the runtime and the driver, and a
0-byte cudaMemcpy) and its per-thread default stream build (the _ptds/_ptsz forms) under
`gpuscope record --gpu-times`, and prints PASS/FAIL

  - per copy: the record's top-level row (function, bytes, direction, host memory, batch count)
    against what the program made (its --json list); CUPTI's memcpy activities tied to that call or
    to the calls inside it against the copies the record says it was made of: its own, or those
    the runtime staged it through (cudaMemcpyArrayToArray: an AtoD and a DtoA copy, recorded as
    cudaMemcpyFromArray and cudaMemcpyToArray inside it, each with its driver copy), bytes exactly;
    a count of one activity per copy, except that CUPTI may merge a batch's copies into fewer
    activities (seen on the H100: cudaMemcpyBatchAsync's 3 copies in one activity), which the line
    says. A copy in the record that the program did not make fails;
  - per direction: the copies each top-level call that moved bytes was made of, a batch counted as
    CUPTI counted it (the copies asked for are said beside), and their bytes, against CUPTI's
    memcpy records (HtoA counts as HtoD, AtoH as DtoH, AtoA/AtoD/DtoA/PtoP as DtoD: an array is
    device memory).

A 0-byte copy moves nothing: the record keeps the call (mergeSort's 24 0-byte cudaMemcpy calls),
CUPTI has no activity for it; the line for it says what CUPTI did. The comparison (compare()) is
tested on the H100 run's numbers by tests/runtime/test_copy_family_check.py.

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


def is_batch(name):
    return "Batch" in name


class Call:
    """A recorded call: a row of `calls` with what the check needs."""

    def __init__(self, id, name, kind, bytes, dir, host_mem, copies, ret, parent_id):
        self.id, self.name, self.kind, self.bytes, self.dir = id, name, kind, bytes, dir
        self.host_mem, self.copies, self.ret, self.parent_id = host_mem, copies, ret, parent_id

    def asked(self):
        """Copies it asked for: a batch's count, else one."""
        return (self.copies or 1) if is_batch(self.name) else 1


class Record:
    """A record's calls as a tree, and CUPTI's memcpy activities tied to them."""

    def __init__(self, calls, acts):
        self.by_id = {c.id: c for c in calls}
        self.children = {}
        for c in calls:
            if c.parent_id is not None:
                self.children.setdefault(c.parent_id, []).append(c)
        self.acts = acts  # (call_id or None, bytes, CUpti_ActivityMemcpyKind)
        self.tied = {}
        for a in acts:
            self.tied.setdefault(a[0], []).append(a)

    def top_level_copies(self):
        return [c for c in self.by_id.values() if c.kind == "memcpy" and c.parent_id is None]

    def subtree(self, call):
        out, todo = [], [call]
        while todo:
            c = todo.pop()
            out.append(c)
            todo += self.children.get(c.id, [])
        return out

    def copies_made(self, call):
        """The copies the call was made of, as the record says: its innermost copy calls (a runtime
        copy's driver copy; cudaMemcpyArrayToArray's two, through cudaMemcpyFromArray and
        cudaMemcpyToArray), a call itself where the copies inside it are not all of known size."""
        inner = [d for d in self.children.get(call.id, []) if d.kind == "memcpy"]
        made_of = [leaf for d in inner for leaf in self.copies_made(d)]
        return made_of if inner and all(c.bytes is not None for c in made_of) else [call]

    def tied_to(self, call):
        return [a for c in self.subtree(call) for a in self.tied.get(c.id, [])]

    def as_cupti_counts(self, call, leaves, n_tied):
        """How many activities the call's copies should be in CUPTI's records: one per copy,
        except that CUPTI may merge a batch's copies into fewer activities (observed on the H100:
        one activity for cudaMemcpyBatchAsync's 3 copies in one direction). A batch's copies count
        as the activities CUPTI has for the call when that is between one per batch and one per
        copy; else as the copies asked for (and the count fails)."""
        single = sum(1 for c in leaves if not is_batch(c.name))
        lo = single + sum(1 for c in leaves if is_batch(c.name))
        hi = single + sum(c.asked() for c in leaves if is_batch(c.name))
        return n_tied if lo <= n_tied <= hi else hi


def compare(made, rec):
    """Lines to print, and whether everything agreed. `made`: the program's --json list."""
    lines, ok = [], True
    lines.append(f"  {'function':34} {'made':>8} {'record':>8} {'dir':5} {'host':9} {'copies':>6} "
                 f"{'CUPTI n':>7} {'CUPTI B':>8} {'kinds':10} result")
    unmatched = sorted(rec.top_level_copies(), key=lambda c: c.id)
    for c in made["copies"]:
        mine = [r for r in unmatched if r.name == c["function"]]
        row = next((r for r in mine if r.bytes == c["bytes"]), mine[0] if mine else None)
        problems, notes = [], []
        if row is None:
            problems.append("not in the record")
            lines.append(f"  {c['function']:34} {c['bytes']:8d} {'':>8} {'-':5} {'-':9} {'-':>6} {0:7d} {0:8d} {'':10} "
                         f"FAIL: {', '.join(problems)}")
            ok = False
            continue
        unmatched.remove(row)
        if row.ret != 0:
            problems.append(f"returned {row.ret}")
        if row.bytes != c["bytes"]:
            problems.append("bytes")
        if row.dir != c["dir"]:
            problems.append("direction")
        if (row.host_mem or "") != c["host_mem"]:
            problems.append("host memory")
        if row.asked() != c["copies"]:
            problems.append("copies")
        tied = rec.tied_to(row)
        cupti_bytes = sum(b for _, b, _ in tied)
        kinds = ",".join(sorted({CUPTI_KINDS.get(k, ("?",))[0] for _, _, k in tied}))
        leaves = rec.copies_made(row)
        if c["bytes"] == 0:
            notes.append(f"0-byte copy: CUPTI has {len(tied)} activities for it")
            problems += ["CUPTI bytes"] if cupti_bytes else []
        else:
            # CUPTI sees the copies the call was made of: its own bytes, or those of the copies the
            # runtime staged it through (recorded as rows inside it).
            leaf_bytes = None if any(l.bytes is None for l in leaves) else sum(l.bytes for l in leaves)
            if cupti_bytes != leaf_bytes:
                problems.append("CUPTI bytes")
            if leaves != [row]:
                made_of = sum(l.asked() for l in leaves)
                if made_of > 1 or leaf_bytes != row.bytes:
                    notes.append(f"made by the runtime as {made_of} copies inside it ("
                                 + ", ".join(f"{l.name} {l.bytes} B" for l in leaves) + ")")
            asked = sum(l.asked() for l in leaves)
            if rec.as_cupti_counts(row, leaves, len(tied)) != len(tied):
                problems.append("CUPTI count")
            elif len(tied) < asked:
                notes.append(f"CUPTI merged the batch's {asked} copies into {len(tied)} "
                             f"activit{'y' if len(tied) == 1 else 'ies'} of the same bytes")
        ok &= not problems
        lines.append(f"  {row.name:34} {c['bytes']:8d} {'' if row.bytes is None else row.bytes:>8} {row.dir or '-':5} "
                     f"{row.host_mem or '-':9} {row.asked():>6} {len(tied):7d} {cupti_bytes:8d} {kinds:10} "
                     f"{'PASS' if not problems else 'FAIL: ' + ', '.join(problems)} {'; '.join(notes)}".rstrip())
    for r in unmatched:
        lines.append(f"  FAIL: a copy in the record the program did not make: {r.name} {r.bytes} B {r.dir} "
                     f"(call {r.id}, copies {r.copies}, returned {r.ret})")
        ok = False

    # Per direction, like with like: the copies each call that moved bytes was made of (a staged
    # copy's inner copies, in their directions), a batch counted as CUPTI counted it; against
    # CUPTI's memcpy records (HtoA as HtoD, AtoH as DtoH, AtoA/AtoD/DtoA/PtoP as DtoD).
    rec_dir, gpu_dir, asked_dir = {}, {}, {}
    for row in rec.top_level_copies():
        if row.ret != 0 or not row.bytes:
            continue
        leaves = rec.copies_made(row)
        counted = rec.as_cupti_counts(row, leaves, len(rec.tied_to(row)))
        singles = [l for l in leaves if not is_batch(l.name)]
        batches = [l for l in leaves if is_batch(l.name)]
        for l in leaves:
            if is_batch(l.name):  # what CUPTI's count leaves for the batches, given to the first
                n = counted - len(singles) - (len(batches) - 1) if l is batches[0] else 1
            else:
                n = 1
            d = l.dir if l.dir in ("HtoD", "DtoH", "DtoD", "HtoH") else row.dir
            rn, rb = rec_dir.get(d, (0, 0))
            rec_dir[d] = (rn + n, rb + l.bytes)
            asked_dir[d] = asked_dir.get(d, 0) + l.asked()
    for _, nbytes, kind in rec.acts:
        d = CUPTI_KINDS.get(kind, ("?", "unknown"))[1]
        n, b = gpu_dir.get(d, (0, 0))
        gpu_dir[d] = (n + 1, b + nbytes)
    untied = sum(1 for a in rec.acts if a[0] is None)
    lines.append(f"  CUPTI memcpy activities: {len(rec.acts)}, not tied to a recorded call: {untied}")
    for d in sorted(set(rec_dir) | set(gpu_dir)):
        r, g = rec_dir.get(d, (0, 0)), gpu_dir.get(d, (0, 0))
        good = r == g
        ok &= good
        asked = asked_dir.get(d, 0)
        merged = f" ({asked} asked for: CUPTI merged batch copies)" if asked != r[0] else ""
        lines.append(f"  {d:5}: record {r[0]:3d} copies {r[1]:9d} B{merged}, CUPTI {g[0]:3d} copies {g[1]:9d} B: "
                     f"{'PASS' if good else 'FAIL'}")
    if untied:
        ok = False
    return lines, ok


def load(db):
    calls = [Call(*r) for r in db.execute(
        "SELECT c.id, f.name, f.kind, c.bytes, c.dir, c.host_mem, c.copies, c.ret, c.parent_id "
        "FROM calls c JOIN functions f ON f.id = c.func")]
    acts = db.execute("SELECT call_id, bytes, copy_kind FROM gpu_activities WHERE kind = 'memcpy'").fetchall()
    return Record(calls, acts)


def check(args, target, tmp):
    made_path, rec_path = os.path.join(tmp, f"{target}.json"), os.path.join(tmp, f"{target}.gpuscope")
    cmd = [args.gpuscope, "record", "--gpu-times", "-o", rec_path, "--", str(pathlib.Path(args.bench) / target),
           "--json", made_path]
    print(f"== {target}: {' '.join(cmd)}", flush=True)
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                         env={**os.environ, "LD_LIBRARY_PATH": cuda_library_path()})
    print("\n".join("  | " + line for line in (run.stdout + run.stderr).strip().splitlines()[-10:]))
    if not os.path.exists(made_path) or not os.path.exists(rec_path):
        print(f"{target}: FAIL (exit {run.returncode}: the program or the recording did not finish)")
        return False
    made = json.load(open(made_path))
    ok = True
    if not made["allocated"] or made["failed_calls"]:
        print(f"  the program's calls failed ({made['failed_calls']}; allocated: {made['allocated']}): is there a GPU?")
        ok = False
    db = sqlite3.connect(rec_path)
    meta = dict(db.execute("SELECT key, value FROM meta"))
    print(f"  gpu_times: {meta.get('gpu_times')}; lost: "
          f"{dict(db.execute('SELECT cause, count FROM lost WHERE count > 0').fetchall()) or 'none'}")
    if meta.get("runtime_probes_removed"):
        print(f"  runtime probes removed: {meta['runtime_probes_removed']}")
    lines, agreed = compare(made, load(db))
    print("\n".join(lines))
    ok &= agreed
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
