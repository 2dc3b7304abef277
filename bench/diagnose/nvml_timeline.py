#!/usr/bin/env python3
"""A record's NVML readings as a timeline beside the job's pace: what `diagnose` weighs when it
names a tenant or the GPU's clocks. One line per GPU reading: seconds from the record's start, GPU
busy %, PCIe GB/s (both ways), SM clock, the other processes' SM % (NVML per process, readings
within half a second), and the job's launches a second since the reading before (its pace: fewer
while its steps are slower). The job: the process with the most launches. For checking a
diagnosis on the GPU machine, where records cannot be brought back whole.

    python3 bench/diagnose/nvml_timeline.py RUN.gpuscope [--every N]"""
import argparse
import bisect
import sqlite3
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("record")
    ap.add_argument("--every", type=int, default=1, help="print one reading in N")
    a = ap.parse_args()
    db = sqlite3.connect(a.record)
    start = int(dict(db.execute("SELECT key, value FROM meta")).get("start_ns", 0))
    launch = "f.kind IN ('launch', 'graph_launch')"
    row = db.execute(f"SELECT c.pid, count(*) FROM calls c JOIN functions f ON f.id = c.func WHERE {launch} "
                     "GROUP BY 1 ORDER BY 2 DESC LIMIT 1").fetchone()
    if not row:
        print("no launches in the record")
        return 1
    job = row[0]
    ts_launch = [t for (t,) in db.execute(f"SELECT c.ts_ns FROM calls c JOIN functions f ON f.id = c.func "
                                          f"WHERE {launch} AND c.pid = ? ORDER BY 1", (job,))]
    readings = db.execute("SELECT ts_ns, gpu_util, pcie_tx_kbs, pcie_rx_kbs, sm_clock_mhz FROM gpu_samples "
                          "ORDER BY ts_ns").fetchall()
    procs = db.execute("SELECT ts_ns, pid, sm_util FROM gpu_process_samples ORDER BY ts_ns").fetchall()
    print(f"job: pid {job}, {len(ts_launch)} launches; {len(readings)} GPU readings, "
          f"{len(procs)} per-process readings")
    print(f"{'t s':>8} {'busy':>4} {'PCIe GB/s':>9} {'MHz':>5}  {'others SM % (pid:%)':22} launches/s")
    prev = None
    for k, (ts, util, tx, rx, mhz) in enumerate(readings):
        rate = ""
        if prev is not None and ts > prev:
            n = bisect.bisect_right(ts_launch, ts) - bisect.bisect_right(ts_launch, prev)
            rate = f"{n / ((ts - prev) / 1e9):.0f}"
        prev = ts
        if k % a.every:
            continue
        others = {pid: sm for pts, pid, sm in procs if abs(pts - ts) < 500_000_000 and pid != job}
        gbs = (tx + rx) * 1024 / 1e9 if tx is not None and rx is not None else float("nan")
        print(f"{(ts - start) / 1e9:8.2f} {util if util is not None else -1:4} {gbs:9.2f} {mhz or 0:5}  "
              f"{','.join(f'{p}:{s}' for p, s in sorted(others.items())) or '-':22} {rate}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
