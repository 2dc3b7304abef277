"""A PyTorch training loop whose middle steps are also profiled by torch.profiler: the
ground truth that gpuscope's record of the same steps is checked against.

    python3 train_step.py OUT.json [--steps 5] [--warmup 3]
Writes the profiled window (CLOCK_MONOTONIC ns, the clock gpuscope records in), kernel
launches per name as torch.profiler saw them, and torch.cuda.memory_reserved() at the end."""
import argparse
import collections
import contextlib
import json
import os
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile


NVTX_WINDOW = "train_step window"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-profile", action="store_true",
                    help="run the same steps without torch.profiler (for gpuscope --gpu-times: one CUPTI user at a time)")
    ap.add_argument("--nvtx", action="store_true",
                    help=f"with --no-profile: an NVTX range '{NVTX_WINDOW}' spans the steps (for Nsight Systems)")
    ap.add_argument("--profile-cpu-only", action="store_true",
                    help="with --no-profile: torch.profiler records CPU activity alone over the steps (no CUPTI), "
                         "so that the host paces the GPU as it does under the full profiler")
    args = ap.parse_args()

    torch.manual_seed(0)
    dev = torch.device("cuda")
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=8, dim_feedforward=1024, batch_first=True)
    model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, num_layers=4), torch.nn.Linear(256, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 128, 256, device=dev)
    y = torch.randint(0, 10, (32,), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x).mean(dim=1), y)
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()

    if args.no_profile:
        pacing = profile(activities=[ProfilerActivity.CPU]) if args.profile_cpu_only else contextlib.nullcontext()
        with pacing:
            if args.nvtx:
                torch.cuda.nvtx.range_push(NVTX_WINDOW)
            t0 = time.monotonic_ns()
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
            t1 = time.monotonic_ns()
            if args.nvtx:
                torch.cuda.nvtx.range_pop()
        events = []
    else:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.monotonic_ns()
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
            t1 = time.monotonic_ns()
        trace = os.path.join(tempfile.mkdtemp(), "trace.json")
        prof.export_chrome_trace(trace)
        with open(trace) as f:
            events = json.load(f)["traceEvents"]
    kernels = collections.Counter(e["name"] for e in events if e.get("cat") == "kernel")
    # GPU time per kernel name, microseconds, as torch.profiler (CUPTI) measured it.
    kernel_us = collections.Counter()
    for e in events:
        if e.get("cat") == "kernel":
            kernel_us[e["name"]] += e.get("dur", 0)
    torch.cuda.synchronize()
    result = {"pid": os.getpid(), "t0": t0, "t1": t1, "steps": args.steps, "kernels": kernels, "kernel_us": kernel_us,
              "memory_reserved": torch.cuda.memory_reserved(), "torch": torch.__version__}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"train_step: {sum(kernels.values())} kernel launches in {args.steps} profiled steps, "
          f"{(t1 - t0) / 1e6 / args.steps:.3f} ms a step, memory_reserved={result['memory_reserved']}")


if __name__ == "__main__":
    main()
