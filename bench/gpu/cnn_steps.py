"""A small CNN trained for STEPS steps on random data, as a user's script is: torch imported at the
top (seconds of start-up before the first kernel), then the model built and moved to the GPU, then
the steps. For bench/gpu/python_flame_views_check.py.

    python3 bench/gpu/cnn_steps.py [STEPS]"""
import sys
import time

t0 = time.monotonic()
import torch  # noqa: E402  (start-up: what the report must keep apart from idle gaps)
from torch import nn  # noqa: E402

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20


def model():
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 10)).cuda()


def train(net, opt, x, y):
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()


def main():
    print(f"cnn_steps: import torch took {time.monotonic() - t0:.2f} s", flush=True)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")
    train(net, opt, x, y)
    print(f"cnn_steps: {steps} steps done", flush=True)


main()
