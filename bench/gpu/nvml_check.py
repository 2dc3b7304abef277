#!/usr/bin/env python3
"""NVML values gpuscope records, checked against nvidia-smi read in the same run (issue 5).

Runs `gpuscope record --gpu-sample-hz HZ -- python3 gpu_load.py` while nvidia-smi polls the same
GPU every 100 ms, then compares, per phase of the load (busy, idle, busy), the means of each metric
both saw over the middle of the phase, and the load's device memory as each reports it.

    python3 bench/gpu/nvml_check.py --gpuscope build-static/gpuscope [--hz 10]"""
import argparse
import datetime
import json
import os
import pathlib
import sqlite3
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
QUERY = ["utilization.gpu", "utilization.memory", "memory.used", "power.draw", "temperature.gpu", "clocks.sm",
         "clocks.mem"]
# nvidia-smi's column -> (gpuscope column, factor to nvidia-smi's unit)
COLUMNS = {"utilization.gpu": ("gpu_util", 1), "utilization.memory": ("mem_util", 1),
           "memory.used": ("mem_used", 1 / 2**20), "power.draw": ("power_mw", 1e-3),
           "temperature.gpu": ("temperature_c", 1), "clocks.sm": ("sm_clock_mhz", 1),
           "clocks.mem": ("mem_clock_mhz", 1)}


def mean(v):
    return sum(v) / len(v) if v else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpuscope", default="build-static/gpuscope")
    ap.add_argument("--hz", type=float, default=10)
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rec = os.path.join(tmp, "nvml.gpuscope")
        smi_out = open(os.path.join(tmp, "smi.csv"), "w")
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp," + ",".join(QUERY), "--format=csv,noheader,nounits",
                                "-lms", "100", "-i", "0"], stdout=smi_out, stderr=subprocess.DEVNULL)
        apps = []
        load = subprocess.Popen([args.gpuscope, "record", "-q", "--gpu-sample-hz", str(args.hz), "-o", rec, "--",
                                 args.python, str(HERE / "gpu_load.py")], stdout=subprocess.PIPE, text=True)
        # The load's memory as nvidia-smi lists compute processes, while it runs.
        while load.poll() is None:
            q = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True)
            apps += [l.split(", ") for l in q.stdout.strip().splitlines() if l]
            time.sleep(0.5)
        out = load.stdout.read()
        smi.terminate()
        smi.wait()
        smi_out.close()
        phases = json.loads(out.strip().splitlines()[-1])
        db = sqlite3.connect(rec)
        meta = dict(db.execute("SELECT key, value FROM meta"))
        offset = int(meta["realtime_offset_ns"])
        cols = ", ".join(c for c, _ in COLUMNS.values())
        ours = db.execute(f"SELECT ts_ns, {cols} FROM gpu_samples WHERE gpu = 0 ORDER BY ts_ns").fetchall()
        procs = db.execute("SELECT pid, max(used_memory), avg(sm_util) FROM gpu_process_samples WHERE gpu = 0 "
                           "GROUP BY pid").fetchall()
        smi_rows = []
        for line in open(os.path.join(tmp, "smi.csv")):
            parts = [p.strip() for p in line.split(",")]
            try:
                ts = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                smi_rows.append((int(ts * 1e9) - offset, [float(p) for p in parts[1:]]))
            except ValueError:
                continue
    print(f"gpuscope: {len(ours)} samples at {args.hz} Hz ({meta.get('gpu_metrics')}); nvidia-smi: {len(smi_rows)} "
          f"readings at 10 Hz (its timestamps are wall-clock, put on gpuscope's clock with the record's offset)")
    for ph in phases:
        # The middle of each phase: values that lag (utilisation is an average over a window) settle.
        lo = ph["start_ns"] + (ph["end_ns"] - ph["start_ns"]) // 4
        hi = ph["end_ns"] - (ph["end_ns"] - ph["start_ns"]) // 4
        print(f"== {ph['phase']} ({(hi - lo) / 1e9:.1f} s in the middle of the phase)")
        print(f"  {'metric':20} {'gpuscope':>12} {'nvidia-smi':>12} {'difference':>12}")
        for i, (name, (col, factor)) in enumerate(COLUMNS.items()):
            g = [r[1 + i] * factor for r in ours if lo <= r[0] <= hi and r[1 + i] is not None]
            s = [vals[i] for ts, vals in smi_rows if lo <= ts <= hi]
            gm, sm = mean(g), mean(s)
            diff = gm - sm
            print(f"  {name:20} {gm:12.1f} {sm:12.1f} {diff:+12.1f}  ({len(g)} / {len(s)} readings)")
    print("== per process (GPU 0)")
    smi_mem = {}
    for pid, mib in apps:
        smi_mem[int(pid)] = max(smi_mem.get(int(pid), 0), float(mib))
    for pid, used, sm in procs:
        print(f"  PID {pid}: gpuscope {used / 2**20 if used else float('nan'):.0f} MiB max, SM {sm or 0:.0f}% mean; "
              f"nvidia-smi --query-compute-apps {smi_mem.get(pid, float('nan')):.0f} MiB max")
    return 0


if __name__ == "__main__":
    sys.exit(main())
