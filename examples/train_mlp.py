"""Train dualk.nn.FusedMLP beside its nn.Sequential twin: the same seed gives both the same
initial weights (FusedMLP's layers are nn.Linear modules), the same optimizer and data give
the same losses step after step (within float32 rounding).

    python examples/train_mlp.py [--steps 20] [--backend auto|cuda|triton|torch] [--cpu]

Without a GPU (or with --cpu) it runs on the CPU: the torch backend, or --backend triton under
TRITON_INTERPRET=1 (Triton's interpreter, slow: use few --steps).
"""

import argparse

import torch
from torch import nn

from dualk.nn import FusedMLP

WIDTHS = (32, 64, 64, 8)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--backend", default="auto", choices=["auto", "cuda", "triton", "torch"])
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even with a GPU")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")

    torch.manual_seed(0)
    fused = FusedMLP(WIDTHS, activation="gelu", approximate="tanh", backend=args.backend,
                     device=device)  # fmt: skip
    torch.manual_seed(0)
    plain = nn.Sequential(  # created on the device too: a CUDA init draws from CUDA's generator
        nn.Linear(32, 64, device=device), nn.GELU(approximate="tanh"),
        nn.Linear(64, 64, device=device), nn.GELU(approximate="tanh"),
        nn.Linear(64, 8, device=device),
    )  # fmt: skip
    for p, q in zip(fused.parameters(), plain.parameters()):
        assert torch.equal(p, q), "same seed, same nn.Linear init"
    print(fused)

    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (fused, plain)]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, 32, generator=g).to(device)
    y = torch.sin(x[:, :8]) + 0.1 * torch.randn(args.batch, 8, generator=g).to(device)
    worst = 0.0
    for step in range(args.steps):
        losses = []
        for model, opt in zip((fused, plain), opts):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        worst = max(worst, abs(losses[0] - losses[1]) / losses[1])
        if step % 5 == 0 or step == args.steps - 1:
            print(
                f"step {step:3d}: dualk.nn.FusedMLP {losses[0]:.6f}  nn.Sequential {losses[1]:.6f}"
            )
        assert abs(losses[0] - losses[1]) <= 1e-4 * losses[1] + 1e-6, losses
    print(
        f"losses match (largest relative difference {worst:.2g}); the state_dicts load "
        "into each other through FusedMLP.load_sequential_state_dict"
    )
    fused.load_sequential_state_dict(plain.state_dict())


if __name__ == "__main__":
    main()
