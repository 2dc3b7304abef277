"""A PyTorch loop with three kinds of pageable copies, for `gpuscope advise` on a real GPU record
(issue 35): weights kept in host memory and copied every step, a new batch made every step, and a
checkpoint read back once. Each allocation is on a line of its own.

    sudo gpuscope record -o /tmp/t.gpuscope -- python3 bench/pin/advise_torch.py
    gpuscope advise /tmp/t.gpuscope"""
import torch

STEPS = 30


def main():
    dev = torch.device("cuda")
    weights = torch.randn(16 * 1024 * 1024)  # 64 MiB, reused every step
    total = torch.zeros((), device=dev)
    for _ in range(STEPS):
        batch = torch.randn(256, 3, 64, 64)  # 12 MiB, new every step
        x = batch.to(dev)
        w = weights.to(dev)
        total += x.sum() + w[:10].sum()
    state = w.repeat(4).cpu()  # 256 MiB read back once
    torch.cuda.synchronize()
    print(f"steps {STEPS}, checkpoint {state.numel() * 4 >> 20} MiB, total {total.item():.1f}")


if __name__ == "__main__":
    main()
