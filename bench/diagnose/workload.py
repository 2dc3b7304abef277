"""A small PyTorch training loop with one injected fault, for `diagnose`'s checks on the GPU machine.

    python3 workload.py --fault none|sleep|pageable|fsync|worker|item [--steps 300] [--dir DIR]
The model is a 4-layer MLP on batches of 1024; the input comes from pinned host memory, copied with
non_blocking=True, and the loop never synchronises (it is timed over all its steps), so that each
fault shows as itself:
  sleep     5 ms of host-side "preprocessing" (time.sleep) a step
  pageable  the input comes from 16 MB of pageable memory
  fsync     a 16 MB checkpoint written and fsynced every step
  worker    the input comes from a worker process that makes one every 10 ms (a slow data loader)
  item      loss.item() every step (a sync)
Prints the mean step time."""
import argparse
import multiprocessing as mp
import os
import time

import torch


def slow_worker(conn, steps):
    x = torch.randn(1024, 1024)
    for _ in range(steps):
        time.sleep(0.010)
        conn.send_bytes(x.numpy().tobytes())
    conn.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fault", default="none")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--dir", default="/tmp")
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(1024, 1024), torch.nn.ReLU())]).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    pinned = torch.randn(1024, 1024).pin_memory()
    pageable = torch.randn(4096, 1024)  # 16 MB
    target = torch.randn(1024, 1024, device=dev)
    recv = None
    if a.fault == "worker":
        recv, send = mp.Pipe(duplex=False)
        mp.Process(target=slow_worker, args=(send, a.steps + 10), daemon=True).start()
    ckpt = os.path.join(a.dir, "workload.ckpt")
    blob = os.urandom(16 << 20) if a.fault == "fsync" else b""

    def step():
        if a.fault == "pageable":
            x = pageable.to(dev)[:1024]
        elif a.fault == "worker":
            x = torch.frombuffer(bytearray(recv.recv_bytes()), dtype=torch.float32).view(1024, 1024).to(dev)
        else:
            x = pinned.to(dev, non_blocking=True)
        loss = torch.nn.functional.mse_loss(model(x), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if a.fault == "item":
            loss.item()
        if a.fault == "sleep":
            time.sleep(0.005)
        if a.fault == "fsync":
            with open(ckpt, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())

    for _ in range(10):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    print(f"workload {a.fault}: {(time.perf_counter() - t0) / a.steps * 1e3:.2f} ms a step")


if __name__ == "__main__":
    main()
