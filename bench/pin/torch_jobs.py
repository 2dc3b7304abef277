#!/usr/bin/env python3
"""PyTorch jobs with pageable host memory, run plainly and under libgpuscope_pin.so (issue 35).

  dataloader   a DataLoader over an in-memory dataset, pin_memory=False, batches moved with
               .to(device, non_blocking=True): H2D throughput (bytes / time in the copies) and
               pinned memory, against pin_memory=True and against pinning everything
  weights      layers' weights kept in host memory and streamed to the GPU every step
  checkpoint   a model's state copied to host memory once (pinning should be declined)

  bench/pin/torch_jobs.py [--build build] [--rounds 3]   (each job in its own process; under the
                                                        library through `gpuscope pin`: online,
                                                        use (after one --profile run) and all)
  bench/pin/torch_jobs.py --job NAME [--pin-memory]      (one run; prints one JSON line)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def job_dataloader(pin_memory):
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    dev = torch.device("cuda")
    torch.ones(1).to(dev)  # the program's first CUDA work comes before its data, as a model's would
    n, batch = 24576, 256
    data = torch.randn(n, 3, 64, 64)          # 1.2 GB in host memory
    labels = torch.randint(0, 1000, (n,))
    loader = DataLoader(TensorDataset(data, labels), batch_size=batch, shuffle=True, num_workers=0,
                        pin_memory=pin_memory)
    w = torch.randn(3 * 64 * 64, 256, device=dev)
    copy_s, moved, checksum = 0.0, 0, 0.0
    t0 = time.perf_counter()
    for epoch in range(2):
        for x, y in loader:
            c0 = time.perf_counter()
            xd = x.to(dev, non_blocking=True)
            yd = y.to(dev, non_blocking=True)
            torch.cuda.current_stream().synchronize()
            copy_s += time.perf_counter() - c0
            moved += x.numel() * x.element_size() + y.numel() * y.element_size()
            checksum += float((xd.view(xd.shape[0], -1) @ w).sum()) * 0 + float(xd[0, 0, 0, 0]) + float(yd[0])
            # the bytes that arrived are the host's
            if abs(float(xd[-1].sum()) - float(x[-1].sum())) > 1e-2 * max(1.0, abs(float(x[-1].sum()))):
                raise SystemExit("dataloader: a batch arrived wrong")
    wall = time.perf_counter() - t0
    out = {"h2d_gbps": moved / copy_s / 1e9, "copy_s": copy_s, "wall_s": wall, "moved_gb": moved / 1e9}
    try:
        st = torch.cuda.host_memory_stats()
        out["torch_pinned_peak_bytes"] = st.get("reserved_bytes.all.peak") or st.get("allocated_bytes.all.peak")
    except Exception:
        pass
    return out


def job_weights(pin_memory):
    import torch
    dev = torch.device("cuda")
    torch.ones(1).to(dev)
    layers = [torch.randn(4096, 4096) for _ in range(8)]  # 64 MiB each, in host memory
    if pin_memory:
        layers = [l.pin_memory() for l in layers]
    x = torch.randn(512, 4096, device=dev)
    torch.cuda.synchronize()
    steps = []
    for step in range(12):
        t0 = time.perf_counter()
        h = x
        for l in layers:
            h = torch.tanh(h @ l.to(dev, non_blocking=True))
        torch.cuda.synchronize()
        steps.append(time.perf_counter() - t0)
    ref = x
    for l in layers:
        ref = torch.tanh(ref @ l.to(dev))
    if not torch.allclose(ref, h):
        raise SystemExit("weights: results differ")
    return {"step_ms_median": statistics.median(steps[2:]) * 1e3, "first_steps_ms": [s * 1e3 for s in steps[:3]]}


def job_checkpoint(pin_memory):
    import torch
    dev = torch.device("cuda")
    state = {f"layer{i}.weight": torch.randn(4096, 4096, device=dev) for i in range(16)}  # 1 GiB
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    host = {k: v.to("cpu") for k, v in state.items()}
    wall = time.perf_counter() - t0
    for k in state:
        if not torch.equal(host[k], state[k].cpu()):
            raise SystemExit("checkpoint: a tensor came back wrong")
    return {"copy_ms": wall * 1e3}


JOBS = {"dataloader": job_dataloader, "weights": job_weights, "checkpoint": job_checkpoint}


def run(build, job, variant, report_dir):
    env = dict(os.environ)
    args = [sys.executable, os.path.abspath(__file__), "--job", job]
    if variant == "pin_memory":
        args.append("--pin-memory")
    report = os.path.join(report_dir, f"{job}-{variant}.json")
    if variant in ("online", "all", "use", "profile"):
        # As users run it: gpuscope pin -- CMD (the "use" runs start from one online run's profile).
        pin = [os.path.join(build, "gpuscope"), "pin", "--mode", "all" if variant == "all" else "online",
               "--report", report]
        if variant == "use":
            pin += ["--use", os.path.join(report_dir, f"{job}.profile")]
        if variant == "profile":
            pin += ["--profile", os.path.join(report_dir, f"{job}.profile")]
        args = pin + ["--"] + args
    t0 = time.perf_counter()
    out = subprocess.run(args, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["process_s"] = time.perf_counter() - t0
    reps = []
    if os.path.exists(report):
        with open(report) as f:
            reps = json.load(f)["processes"]
        os.unlink(report)
    main = [r for r in reps if not r.get("child") and r.get("buffers")]
    if main:
        r = max(main, key=lambda r: r["buffers"])
        row.update({"peak_pinned_bytes": r["peak_pinned_bytes"], "registrations": r["registrations"],
                    "pinned_copies": r["pinned_copies"], "pageable_copies": r["pageable_copies"],
                    "pool_hits": r["pool_hits"], "fresh_pins": r["fresh_pins"], "waits": r["waits"]})
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", choices=sorted(JOBS))
    ap.add_argument("--pin-memory", action="store_true")
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", default="dataloader,weights,checkpoint")
    args = ap.parse_args()
    if args.job:
        print(json.dumps(JOBS[args.job](args.pin_memory)))
        return
    report_dir = tempfile.mkdtemp(prefix="pin-jobs-")
    variants = {"dataloader": ["pageable", "pin_memory", "online", "use", "all"],
                "weights": ["pageable", "pin_memory", "online", "use", "all"],
                "checkpoint": ["pageable", "online", "use", "all"]}
    for job in args.jobs.split(","):
        run(args.build, job, "profile", report_dir)  # writes the profile the "use" runs start from
        rows = {v: [] for v in variants[job]}
        for r in range(args.rounds):
            vs = variants[job]
            for v in vs[r % len(vs):] + vs[:r % len(vs)]:
                rows[v].append(run(args.build, job, v, report_dir))
        for v, rs in rows.items():
            ok = [x for x in rs if "error" not in x]
            errs = [x["error"] for x in rs if "error" in x]
            if not ok:
                print(f"{job:>10} {v:>10}: failed: {errs[0]}")
                continue
            keys = [k for k in ok[0] if isinstance(ok[0][k], (int, float)) and not isinstance(ok[0][k], bool)]
            med = {k: statistics.median(x[k] for x in ok if k in x) for k in keys}
            spread = ""
            main_key = {"dataloader": "h2d_gbps", "weights": "step_ms_median", "checkpoint": "copy_ms"}[job]
            if main_key in med:
                vals = [x[main_key] for x in ok]
                spread = f" ({main_key} {min(vals):.2f}-{max(vals):.2f} over {len(vals)})"
            print(f"{job:>10} {v:>10}: " + ", ".join(f"{k} {med[k]:.4g}" for k in keys) + spread +
                  (f"; failed {len(errs)}: {errs[0]}" if errs else ""))


if __name__ == "__main__":
    main()
