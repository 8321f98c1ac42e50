"""The seed article's model (a 100-128-64-10 DNN, layer1/relu1/layer2/relu2/layer3) fused into
one kernel with dualk.fuse: build, fuse, compare the outputs, time both per call (wall clock,
synchronised: one inference request at a time), then export the fused model's state_dict (and
the seed's per-parameter .bin files) and load it into a fresh DNNModel.

    python examples/seed_dnn.py [--batch 32] [--backend auto|cuda|triton|torch] [--cpu]

Without a GPU (or with --cpu) it runs on the CPU: the torch backend, or --backend triton under
TRITON_INTERPRET=1 (Triton's interpreter); CPU timings say nothing about the GPU kernels.
"""

import argparse
import os
import pathlib
import tempfile
import time

import numpy as np
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


def per_call_us(fn, device, calls):
    """Mean wall time of one synchronised call, after warm-up (autotuning, compilation)."""
    for _ in range(max(3, calls // 10)):
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
    parser.add_argument("--backend", default="auto", choices=["auto", "cuda", "triton", "torch"])
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even with a GPU")
    args = parser.parse_args()
    if args.batch < 1:
        parser.error(f"--batch must be at least 1, got {args.batch}")
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    interpreter = os.environ.get("TRITON_INTERPRET") == "1"
    if device.type == "cpu" and (
        args.backend == "cuda" or (args.backend == "triton" and not interpreter)
    ):
        parser.error(
            f"--backend {args.backend} needs a GPU (on the CPU: --backend auto or torch; Triton "
            "also runs under its interpreter with TRITON_INTERPRET=1)"
        )
    torch.manual_seed(0)
    model = DNNModel().to(device).eval()

    fused = dualk.fuse(
        model, backend=args.backend
    )  # a torch.fx GraphModule sharing model's parameters
    print(fused.dualk_fuse_report)
    x = torch.randn(args.batch, 100, device=device)
    with torch.no_grad():
        out, ref = fused(x), model(x)
        print(f"max |fused - original| = {(out - ref).abs().max().item():.3g}")
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
        linears = [model.layer1, model.layer2, model.layer3]
        weights, biases = [lin.weight for lin in linears], [lin.bias for lin in linears]
        print(dualk.explain("fused_mlp", x, weights, biases, backend=args.backend))
        if device.type == "cpu":
            print("on the CPU: these timings say nothing about the GPU kernels")
        calls = 200 if device.type == "cuda" else 10
        t_orig = per_call_us(lambda: model(x), device, calls)
        t_fused = per_call_us(lambda: fused(x), device, calls)
    line = (
        f"{device}, batch {args.batch}: original {t_orig:.1f} us/call, fused {t_fused:.1f} us/call"
    )
    print(line + (f" ({t_orig / t_fused:.2f}x)" if device.type == "cuda" else ""))

    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        # The fused model keeps the original state_dict keys (layer1.weight, ...).
        torch.save(fused.state_dict(), tmp / "fused.pt")
        fresh = DNNModel().to(device)
        fresh.load_state_dict(torch.load(tmp / "fused.pt"))
        # The seed's export: one raw float32 file per named parameter, same names.
        for name, param in fused.named_parameters():
            param.detach().cpu().numpy().tofile(tmp / f"{name}.bin")
        seed = DNNModel()
        with torch.no_grad():
            for name, param in seed.named_parameters():
                raw = np.fromfile(tmp / f"{name}.bin", dtype=np.float32)
                param.copy_(torch.from_numpy(raw).view(param.shape))
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))
        assert torch.equal(seed.to(device)(x), model(x))
    print("state_dict (and .bin files) of the fused model load into a fresh DNNModel: ok")


if __name__ == "__main__":
    main()
