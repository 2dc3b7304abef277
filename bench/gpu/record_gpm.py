#!/usr/bin/env python3
"""NVML's utilisation beside GPM's SM activity, as `gpuscope record` kept them: the mean of each
over a record's readings that have GPM (one a second), per GPU, for each record named.

    python3 bench/gpu/record_gpm.py RUN.gpuscope [...]
"""
import sqlite3
import sys

for path in sys.argv[1:]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    cols = {r[1] for r in db.execute("PRAGMA table_info(gpu_samples)")}
    if "sm_active" not in cols:
        print(f"{path}: no GPM columns (a record made before them)")
        continue
    for gpu, n, util, sm, occ, tensor, dram in db.execute(
            "SELECT gpu, count(sm_active), avg(gpu_util), avg(sm_active), avg(sm_occupancy), avg(tensor_active), "
            "avg(dram_active) FROM gpu_samples WHERE sm_active IS NOT NULL GROUP BY gpu"):
        print(f"{path}: GPU {gpu}: {n} GPM readings; NVML busy {util:.1f}%, SM active {sm:.1f}%, "
              f"occupancy {occ:.1f}%, tensor {tensor:.1f}%, DRAM bandwidth {dram:.1f}%")
