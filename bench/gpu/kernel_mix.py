#!/usr/bin/env python3
"""A record's kernels by GPU time (a record made with `record --gpu-times`): per kernel name its
count, GPU time, mean duration, grid (blocks) and block size, and, over all kernels, the GPU time
in kernels of fewer blocks than the GPU has SMs (HTA's "estimated SM efficiency": each kernel's
blocks / SMs, at most 1, weighted by its time). For telling a GPU kept busy by small kernels from
one its kernels fill.

    python3 bench/gpu/kernel_mix.py RECORD [--sms 132] [--top 12] [--since MONOTONIC_S]
"""
import argparse
import sqlite3
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("record")
    ap.add_argument("--sms", type=int, default=132, help="the GPU's SMs (H100 and H200 SXM: 132)")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--since", type=float, default=0, help="only kernels from this CLOCK_MONOTONIC time (s)")
    a = ap.parse_args()
    db = sqlite3.connect(f"file:{a.record}?mode=ro", uri=True)
    rows = db.execute("SELECT name, end_ns - start_ns, grid_x * grid_y * grid_z, block_x * block_y * block_z, start_ns "
                      "FROM gpu_activities WHERE kind = 'kernel' AND end_ns > start_ns AND start_ns >= ? ORDER BY start_ns",
                      (int(a.since * 1e9),)).fetchall()
    if not rows:
        sys.exit(f"{a.record}: no kernels with GPU times (record with --gpu-times)")
    span = rows[-1][4] - rows[0][4]
    total = sum(r[1] for r in rows)
    by = {}
    eff = 0.0
    under = 0
    for name, dur, blocks, threads, _ in rows:
        k = by.setdefault(name, [0, 0, {}, {}])
        k[0] += 1
        k[1] += dur
        k[2][blocks] = k[2].get(blocks, 0) + dur
        k[3][threads] = k[3].get(threads, 0) + dur
        eff += dur * min(1.0, (blocks or 0) / a.sms)
        if (blocks or 0) < a.sms:
            under += dur
    print(f"{a.record}: {len(rows)} kernels over {span / 1e9:.2f} s, GPU busy in kernels {total / max(span, 1) * 100:.0f}% "
          f"(overlaps counted twice); est. SM efficiency {eff / total * 100:.1f}%; "
          f"{under / total * 100:.1f}% of kernel time in grids under {a.sms} blocks")
    print(f"{'GPU ms':>9} {'share':>6} {'count':>7} {'mean us':>8} {'blocks':>8} {'thr/blk':>7}  name")
    for name, (n, dur, blocks, threads) in sorted(by.items(), key=lambda kv: -kv[1][1])[:a.top]:
        b = max(blocks, key=blocks.get)
        t = max(threads, key=threads.get)
        print(f"{dur / 1e6:9.1f} {dur / total * 100:5.1f}% {n:7d} {dur / n / 1e3:8.1f} {b:8d} {t:7d}  {name[:90]}")


if __name__ == "__main__":
    main()
