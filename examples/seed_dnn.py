"""The seed article's model (a 100-128-64-10 DNN) fused into one kernel with dualk.fuse: build,
fuse, compare the outputs, time both per call (wall clock, synchronised: one inference request),
then export the fused model's state_dict and load it into a fresh DNNModel.

    python examples/seed_dnn.py [--batch 32] [--cpu]
"""

import argparse
import time

import torch
from torch import nn

import dualk


class DNNModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = nn.Linear(100, 128)
        self.relu1 = nn.ReLU()
        self.layer2 = nn.Linear(128, 64)
        self.relu2 = nn.ReLU()
        self.layer3 = nn.Linear(64, 10)

    def forward(self, x):
        x = self.relu1(self.layer1(x))
        x = self.relu2(self.layer2(x))
        return self.layer3(x)


def per_call_us(fn, device, calls=200):
    for _ in range(10):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--cpu", action="store_true", help="run on the CPU (torch backend)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    torch.manual_seed(0)
    model = DNNModel().to(device).eval()
    fused = dualk.fuse(model)
    print(fused.dualk_fuse_report)
    x = torch.randn(args.batch, 100, device=device)
    with torch.no_grad():
        diff = (fused(x) - model(x)).abs().max().item()
        print(f"max |fused - original| = {diff:.3g}")
        if device.type == "cpu":
            print("on the CPU: dualk runs its torch backend, so timings say nothing about kernels")
        t_orig = per_call_us(lambda: model(x), device)
        t_fused = per_call_us(lambda: fused(x), device)
    print(f"{device}: original {t_orig:.1f} us/call, fused {t_fused:.1f} us/call "
          f"({t_orig / t_fused:.2f}x)")  # fmt: skip
    fresh = DNNModel().to(device)
    fresh.load_state_dict(fused.state_dict())  # the fused model keeps the original keys
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))
    print("state_dict of the fused model loads into a fresh DNNModel: ok")


if __name__ == "__main__":
    main()
