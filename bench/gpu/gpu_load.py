#!/usr/bin/env python3
"""A GPU load with phases NVML should see: busy (matmuls) for BUSY s, idle for IDLE s, busy again.
Prints each phase's start and end in CLOCK_MONOTONIC nanoseconds, as JSON on its last line.

    python3 gpu_load.py [--busy 3] [--idle 2]"""
import argparse
import json
import time

import torch


def busy(seconds, a, b):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            a = torch.mm(a, b).tanh_()
        torch.cuda.synchronize()
    return a


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--busy", type=float, default=3)
    ap.add_argument("--idle", type=float, default=2)
    args = ap.parse_args()
    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda") / 64
    keep = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")  # 1 GiB more in use, to see
    torch.cuda.synchronize()
    phases = []
    for name, secs in (("busy", args.busy), ("idle", args.idle), ("busy", args.busy)):
        t0 = time.monotonic_ns()
        if name == "busy":
            a = busy(secs, a, b)
        else:
            time.sleep(secs)
        phases.append({"phase": name, "start_ns": t0, "end_ns": time.monotonic_ns()})
    del keep
    print(json.dumps(phases))


if __name__ == "__main__":
    main()
