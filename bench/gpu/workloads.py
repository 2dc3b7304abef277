"""Self-contained GPU workloads for the overhead benchmark (no downloads; random weights).

    python3 workloads.py NAME[,NAME...] [--profiler none|cuda|cuda+stack]
Prints one JSON line per workload: {"workload", "unit", "per_step", "steps"} where per_step is
the median time of a timed step. Several workloads in one process share its start-up (import
torch, CUDA init: seconds), which is not what is measured. With --profiler the timed steps run under torch.profiler (CPU + CUDA activities),
the configuration users would pick instead of gpuscope."""
import argparse
import contextlib
import json
import statistics
import time

import torch


def eager_add(steps=20, ops=2000):
    """Launch-bound eager loop of tiny ops, through Python: µs per op."""
    x = torch.zeros(1024, device="cuda")

    def step():
        for _ in range(ops):
            x.add_(1)
        torch.cuda.synchronize()
    return step, steps, "us_per_op", 1e6 / ops


def train_step(steps=20):
    """A transformer encoder training step: ms per step."""
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=8, dim_feedforward=1024, batch_first=True)
    model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, num_layers=4), torch.nn.Linear(256, 10)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 128, 256, device="cuda")
    y = torch.randint(0, 10, (32,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x).mean(dim=1), y).backward()
        opt.step()
        torch.cuda.synchronize()
    return step, steps, "ms_per_step", 1e3


def generation(steps=10, tokens=64):
    """Autoregressive generation with a small decoder (no KV cache): ms per token."""
    vocab, d = 1000, 256
    emb = torch.nn.Embedding(vocab, d).cuda()
    layer = torch.nn.TransformerEncoderLayer(d_model=d, nhead=8, dim_feedforward=1024, batch_first=True)
    body = torch.nn.TransformerEncoder(layer, num_layers=4).cuda().eval()
    head = torch.nn.Linear(d, vocab).cuda()

    @torch.no_grad()
    def step():
        seq = torch.zeros(1, 1, dtype=torch.long, device="cuda")
        for _ in range(tokens):
            mask = torch.nn.Transformer.generate_square_subsequent_mask(seq.shape[1], device="cuda")
            logits = head(body(emb(seq), mask=mask, is_causal=True)[:, -1])
            seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
        torch.cuda.synchronize()
    return step, steps, "ms_per_token", 1e3 / tokens


def copy_mix(steps=20, copies=50):
    """Host-to-device and back, half from pageable and half from pinned memory: ms per step."""
    n = 1 << 20
    pageable = torch.randn(n)
    pinned = torch.randn(n).pin_memory()
    dev = torch.empty(n, device="cuda")

    def step():
        for i in range(copies):
            src = pinned if i % 2 else pageable
            dev.copy_(src, non_blocking=bool(i % 2))
            src.copy_(dev, non_blocking=False)
        torch.cuda.synchronize()
    return step, steps, "ms_per_step", 1e3


def lstm_infer(steps=50):
    """cuDNN LSTM inference, batch 1, 32 time steps, 2 layers (launch-bound, issue 33): ms per step."""
    model = torch.nn.LSTM(input_size=128, hidden_size=256, num_layers=2, batch_first=True).cuda().eval()
    x = torch.randn(1, 32, 128, device="cuda")

    def step():
        with torch.no_grad():
            for _ in range(4):
                model(x)
        torch.cuda.synchronize()
    return step, steps, "ms_per_step", 1e3


def multi_stream(steps=50, streams=4, rounds=16):
    """Small kernels on several streams joined by events, with small pinned copies in and out
    (issue 33): ms per step."""
    ss = [torch.cuda.Stream() for _ in range(streams)]
    xs = [torch.randn(4096, device="cuda") for _ in range(streams)]
    host = torch.randn(4096).pin_memory()
    back = torch.empty(4096).pin_memory()

    def step():
        main = torch.cuda.current_stream()
        for _ in range(rounds):
            done = []
            for s, x in zip(ss, xs):
                s.wait_stream(main)
                with torch.cuda.stream(s):
                    x.copy_(host, non_blocking=True)
                    x.mul_(1.0001).add_(0.5)
                    e = torch.cuda.Event()
                    e.record(s)
                    done.append(e)
            for e in done:
                main.wait_event(e)
            back.copy_(xs[0], non_blocking=True)
        torch.cuda.synchronize()
    return step, steps, "ms_per_step", 1e3


WORKLOADS = {"eager_add": eager_add, "train_step": train_step, "generation": generation, "copy_mix": copy_mix,
             "lstm_infer": lstm_infer, "multi_stream": multi_stream}


def run(name, profiler):
    torch.manual_seed(0)
    step, steps, unit, scale = WORKLOADS[name]()
    for _ in range(3):
        step()  # warm-up: allocator, cuBLAS handles, kernel loading
    ctx = contextlib.nullcontext()
    if profiler != "none":
        from torch.profiler import ProfilerActivity, profile
        ctx = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                      with_stack=profiler == "cuda+stack")
    times = []
    with ctx:
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
    return {"workload": name, "unit": unit, "per_step": statistics.median(times) * scale, "steps": steps}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workloads", help="comma-separated: " + ",".join(WORKLOADS))
    ap.add_argument("--profiler", default="none", choices=["none", "cuda", "cuda+stack"])
    args = ap.parse_args()
    for name in args.workloads.split(","):
        if name not in WORKLOADS:
            raise SystemExit(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
        print(json.dumps(run(name, args.profiler)), flush=True)


if __name__ == "__main__":
    main()
