#!/usr/bin/env python3
"""The timeline on a long recording: how big the trace gets, how long `gpuscope timeline`
takes and how much memory it needs, for the whole recording and for a time window.

    sudo bench/timeline_size.py [--build build] [--iterations 50000] [--threads 4]

Records `cuda_ops` (real libcudart; no GPU needed) with CPU sampling at 99 Hz, then writes the
timeline whole and for a 1-second window, and loads each with Python's json module (a reader
that is not gpuscope) to count its events."""
import argparse
import json
import os
import pathlib
import subprocess
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def timed(cmd):
    """Runs cmd; returns (wall seconds, peak RSS MiB of the child)."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read()
    if proc.returncode not in (0, 3):
        raise SystemExit(f"{cmd[:3]} failed ({proc.returncode}): {err}")
    return time.monotonic() - start, usage.ru_maxrss / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=pathlib.Path, default=ROOT / "build")
    ap.add_argument("--iterations", type=int, default=50000)
    ap.add_argument("--threads", type=int, default=4)
    args = ap.parse_args()
    gs = str(args.build.resolve() / "gpuscope")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        rec = tmp / "long.gpuscope"
        wall, rss = timed([gs, "record", "-q", "--cpu-profile", "99", "-o", rec, "--",
                           args.build.resolve() / "targets/cuda_ops", "--iterations", str(args.iterations),
                           "--threads", str(args.threads)])
        import sqlite3
        db = sqlite3.connect(rec)
        calls = db.execute("SELECT count(*) FROM calls").fetchone()[0]
        samples = db.execute("SELECT count(*) FROM samples").fetchone()[0]
        lo, hi = db.execute("SELECT min(ts_ns), max(ts_ns) FROM calls").fetchone()
        start = int(dict(db.execute("SELECT key, value FROM meta")).get("start_ns", lo))
        lost = db.execute("SELECT coalesce(sum(count), 0) FROM lost").fetchone()[0]
        db.close()
        span = (hi - lo) / 1e9
        print(f"recording: {calls:,} calls, {samples:,} CPU samples, {lost} lost, {span:.1f} s of calls, "
              f"{rec.stat().st_size / 2**20:.1f} MiB record file ({wall:.1f} s to record)")
        mid = (lo - start) / 1e9 + span / 2
        # Both written before either is loaded: a child's peak RSS counts the parent's pages it
        # starts with, and a loaded trace makes this process big.
        runs = []
        for label, extra in (("whole", []), ("1 s window", ["--from", f"{mid:.3f}", "--to", f"{mid + 1:.3f}"])):
            out = tmp / f"trace-{len(runs)}.json"
            runs.append((label, out, *timed([gs, "timeline", rec, "-o", out, *extra])))
        for label, out, wall, rss in runs:
            size = out.stat().st_size
            t0 = time.monotonic()
            events = json.loads(out.read_text())["traceEvents"]
            load = time.monotonic() - t0
            kinds = {}
            for e in events:
                kinds[e["ph"]] = kinds.get(e["ph"], 0) + 1
            print(f"timeline, {label}: {size / 2**20:.1f} MiB, {len(events):,} events "
                  f"({', '.join(f'{k} {v:,}' for k, v in sorted(kinds.items()))}); written in {wall:.1f} s, "
                  f"peak RSS {rss:.0f} MiB; json.loads {load:.1f} s; {size / max(1, len(events)):.0f} bytes/event")
            del events

if __name__ == "__main__":
    main()
