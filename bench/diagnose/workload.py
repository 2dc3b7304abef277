"""Three PyTorch workloads with a fault injected from inside, for `diagnose`'s fault-injection suite
(bench/diagnose/run.py starts them; faults from outside the process are injected there).

    python3 workload.py --workload train|cnn|infer [--fault F] [--intensity 1|2] [--seconds 8]
                        [--ready FILE] [--cpu N] [--port P] [--dir DIR] [--scale X]
Workloads, each meant to keep the GPU busy when nothing is wrong (the host launches ahead):
  train  an MLP training step (16 layers of 2048, batch 384) on input copied from pinned memory
  cnn    a small CNN (72 channels) trained from a DataLoader (4 workers, pin_memory, non_blocking copies)
  infer  a Transformer encoder's inference loop (batch 16); each step's output is copied back to
         pinned memory and waited for one step later (pipelined: the GPU never waits for the host's read)
Sized on the H100 so that the GPU is busy >90% of a clean step while the host's work per step is
more than a third of the GPU's: a job tuned to keep its GPU fed, which host faults then slow.
(train was batch 256 until 2026-11-29: its clean step left the GPU 84-85% busy on an H100 and an
H200, launch-bound in part, and diagnose said so: launch_bound 14%, true of it, not of a clean run.)
Faults from inside (intensity 2 is the stronger):
  pageable     the input comes from pageable memory (16 MB; 64 MB)
  fsync        a checkpoint written and fsynced every step (8 MB; 32 MB)
  item         loss.item() once a step; twice (after the forward pass too)
  workers      train/infer: the input comes from a child process through a pipe, one every 1.5x (3x)
               the clean step; cnn: 2 DataLoader workers whose __getitem__ is slow enough that a
               batch comes every 1.5x (3x) the clean step
  gil          preprocessing threads in the process, in pure Python (1; 3)
  small_batch  the batch divided by 16; by 128 (launch-bound)
  remote       the input read from a TCP server on --port (run.py's, throttled in user space to a
               batch every 1.5x (3x) the clean step); cnn's too, instead of its DataLoader
  sleep        time.sleep of 5 ms; 15 ms a step
  dataset      reads its dataset, a 512 MB file it wrote at start, 8 MB a step (cached: no cost; for
               run.py's memory scenario, which then limits the job's memory)
Never synchronises in the loop unless the fault does; times the loop by throughput. Writes --ready
(with the monotonic time) once warm, pins its main thread to --cpu then (so that a hog can be put
beside it, and the DataLoader's workers are not), and prints the mean step time."""
import argparse
import array
import os
import socket
import threading
import time

import torch


def pipe_worker(conn, nbytes, period_s):
    blob = os.urandom(nbytes)
    while True:
        time.sleep(period_s)
        conn.send_bytes(blob)
    conn.close()


def gil_hog(stop):
    x = 0
    while not stop.is_set():
        for i in range(10000):
            x = (x * 31 + i) % 1000003


class Images(torch.utils.data.Dataset):
    """Synthetic 3x96x96 images with a random crop and flip; `cost_s` of extra work a sample."""

    def __init__(self, n, cost_s):
        self.n, self.cost_s = n, cost_s  # a multiprocessing.Value, read each sample
        self.base = torch.randint(0, 255, (64, 3, 112, 112), dtype=torch.uint8)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.cost_s.value:
            end = time.perf_counter() + self.cost_s.value
            while time.perf_counter() < end:
                pass
        img = self.base[i % 64]
        y, x = (i * 7) % 16, (i * 13) % 16
        img = img[:, y:y + 96, x:x + 96]
        if i % 2:
            img = img.flip(2)
        return img.float().div_(255), i % 10


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="train", choices=["train", "cnn", "infer"])
    ap.add_argument("--fault", default="none")
    ap.add_argument("--intensity", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--ready", default="")
    ap.add_argument("--cpu", type=int, default=-1)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the batch (calibration)")
    ap.add_argument("--series", default="", help="write each step's end (time.monotonic(), doubles) to this file")
    a = ap.parse_args()
    hi = a.intensity >= 2
    dev = torch.device("cuda")
    torch.manual_seed(0)
    batch_div = (128 if hi else 16) if a.fault == "small_batch" else 1

    # The model and its step; `inp()` gives the next input on the GPU.
    if a.workload == "train":
        batch = max(1, int(384 * a.scale) // batch_div)
        model = torch.nn.Sequential(*[m for _ in range(16) for m in (torch.nn.Linear(2048, 2048), torch.nn.ReLU())]).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        target = torch.randn(batch, 2048, device=dev)
        in_shape = (batch, 2048)
    elif a.workload == "cnn":
        batch = max(1, int(128 * a.scale) // batch_div)
        c = 72
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, c, 3, padding=1), torch.nn.ReLU(),
            *[m for _ in range(6) for m in (torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.BatchNorm2d(c), torch.nn.ReLU())],
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(c, 10)).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        in_shape = (batch, 3, 96, 96)
    else:
        batch = max(1, int(16 * a.scale) // batch_div)
        layer = torch.nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, 6, enable_nested_tensor=False).to(dev).eval()
        in_shape = (batch, 128, 1024)
    nbytes = 4
    for d in in_shape:
        nbytes *= d

    pinned = torch.randn(*in_shape).pin_memory()
    pageable = torch.randn(max(1, ((64 if hi else 16) << 20) // 4))
    out_host = [None, None]
    done_events = [None, None]
    stop = threading.Event()
    recv = sock = loader = None

    paced = a.fault in ("workers", "remote")  # input paced by a measured clean step
    if a.fault == "workers" and a.workload != "cnn":
        import multiprocessing as mp
        recv_conn, send_conn = mp.Pipe(duplex=False)
    cost = None
    if a.workload == "cnn":
        import multiprocessing as mp
        cost = mp.Value("d", 0.0)  # seconds of extra work a sample, set once the clean step is known
        loader = torch.utils.data.DataLoader(Images(1 << 30, cost), batch_size=batch,
                                             num_workers=2 if a.fault == "workers" else 4, pin_memory=True,
                                             prefetch_factor=4, persistent_workers=True)
        batches = iter(loader)
    ckpt = os.path.join(a.dir, f"ckpt-{os.getpid()}.bin")
    dataset = os.path.join(a.dir, f"dataset-{os.getpid()}.bin")
    data_fd, data_off, chunk = -1, [0], 8 << 20
    if a.fault == "dataset":
        with open(dataset, "wb") as f:
            for _ in range(64):
                f.write(os.urandom(chunk))
        data_fd = os.open(dataset, os.O_RDONLY)
    blob = os.urandom((32 if hi else 8) << 20) if a.fault == "fsync" else b""
    buf = bytearray(nbytes)

    labels = torch.randint(0, 10, (in_shape[0],), device=dev)

    def inp():
        if a.workload == "cnn" and sock is None:
            x, y = next(batches)
            x = x.to(dev, non_blocking=True)
            if a.fault == "pageable":
                x = x + pageable.to(dev)[:1].view(1, 1, 1, 1)
            return x, y.to(dev, non_blocking=True)
        if a.fault == "pageable":
            return pageable.to(dev)[: pinned.numel()].view(in_shape), None
        if recv is not None:
            data = recv.recv_bytes()
            return torch.frombuffer(bytearray(data), dtype=torch.float32).view(in_shape).to(dev), None
        if sock is not None:
            view = memoryview(buf)
            got = 0
            while got < nbytes:
                n = sock.recv_into(view[got:], nbytes - got)
                if n == 0:
                    raise SystemExit("remote: the server closed")
                got += n
            return torch.frombuffer(buf, dtype=torch.float32).view(in_shape).to(dev), labels
        return pinned.to(dev, non_blocking=True), None

    step_no = [0]

    def step():
        x, y = inp()
        if a.workload == "infer":
            with torch.inference_mode():
                out = model(x)
                if a.fault == "item":
                    out[0, 0, 0].item()
                    if hi:
                        out[-1, -1, -1].item()
                # Copied back, and waited for a step later: the loop stays ahead of the GPU.
                k = step_no[0] % 2
                if done_events[k] is not None:
                    done_events[k].synchronize()
                if out_host[k] is None:
                    out_host[k] = torch.empty(out.shape, pin_memory=True)
                out_host[k].copy_(out, non_blocking=True)
                done_events[k] = torch.cuda.Event()
                done_events[k].record()
        else:
            if a.workload == "train":
                out = model(x)
                loss = torch.nn.functional.mse_loss(out, target)
            else:
                loss = torch.nn.functional.cross_entropy(model(x), y)
            if a.fault == "item" and hi:
                loss.item()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if a.fault == "item":
                loss.item()
        if a.fault == "sleep":
            time.sleep(0.015 if hi else 0.005)
        if data_fd >= 0:
            os.pread(data_fd, chunk, data_off[0])
            data_off[0] = (data_off[0] + chunk) % (64 * chunk)
        if a.fault == "fsync":
            with open(ckpt, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
        step_no[0] += 1

    # Warm up on clean input; where the fault paces the input, measure the clean step to pace it by.
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20 if paced else 0):
        step()
    torch.cuda.synchronize()
    clean = (time.perf_counter() - t0) / 20
    factor = 3 if hi else 1.5
    if a.fault == "workers" and a.workload == "cnn":
        # Two workers whose samples cost enough that they deliver a batch every `factor` steps.
        cost.value = clean * factor * 2 / batch
    elif a.fault == "workers":
        import multiprocessing as mp
        mp.Process(target=pipe_worker, args=(send_conn, nbytes, clean * factor), daemon=True).start()
        recv = recv_conn
    elif a.fault == "remote":
        sock = socket.create_connection(("127.0.0.1", a.port))
        sock.sendall(nbytes.to_bytes(8, "little") + int(clean * factor * 1e9).to_bytes(8, "little"))
    if a.cpu >= 0:
        os.sched_setaffinity(0, {a.cpu})
    threads = []
    if a.fault == "gil":
        threads = [threading.Thread(target=gil_hog, args=(stop,), daemon=True) for _ in range(3 if hi else 1)]
        for t in threads:
            t.start()
    t_ready = time.monotonic()
    if a.ready:
        with open(a.ready + ".tmp", "w") as f:
            f.write(f"{t_ready:.6f}\n")
        os.rename(a.ready + ".tmp", a.ready)
    steps = 0
    ends = array.array("d")
    t0 = time.perf_counter()
    end = t0 + a.seconds
    while time.perf_counter() < end:
        step()
        steps += 1
        if a.series:
            ends.append(time.monotonic())
    torch.cuda.synchronize()
    if a.series:
        with open(a.series, "wb") as f:
            ends.tofile(f)
    dt = time.perf_counter() - t0
    stop.set()
    for f in (ckpt, dataset):
        if os.path.exists(f):
            os.unlink(f)
    print(f"workload {a.workload} fault {a.fault}/{a.intensity}: {steps} steps, {dt / steps * 1e3:.2f} ms a step",
          flush=True)
    import multiprocessing as mp
    for child in mp.active_children():  # a pipe feeder holds both ends of its pipe: it would block for ever
        child.kill()
    os._exit(0)  # DataLoader workers see their parent go


if __name__ == "__main__":
    main()
