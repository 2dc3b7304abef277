"""A launch-bound PyTorch job for the agent's budget check: tiny eager ops through Python for a
fixed time after warm-up. Prints one JSON line with the mean µs per op over the timed part (the
mean, not a median of steps: under a duty cycle some seconds are traced and others are not).

    python3 launch_bound.py [--seconds 60] [--warmup 5]"""
import argparse
import json
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--warmup", type=float, default=5)
    args = ap.parse_args()
    x = torch.zeros(1024, device="cuda")

    def burst(n=1000):
        for _ in range(n):
            x.add_(1)
        torch.cuda.synchronize()
        return n
    end = time.time() + args.warmup
    while time.time() < end:
        burst()
    ops, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        ops += burst()
    took = time.perf_counter() - start
    print(json.dumps({"ops": ops, "seconds": took, "us_per_op": took * 1e6 / ops}), flush=True)


if __name__ == "__main__":
    main()
