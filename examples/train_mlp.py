"""Train dualk.nn.FusedMLP and its nn.Sequential twin (same initial weights) side by side: the
losses match step for step, within the dtype's rounding.

    python examples/train_mlp.py [--steps 20] [--cpu]
"""

import argparse

import torch
from torch import nn

from dualk.nn import FusedMLP


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    torch.manual_seed(0)
    fused = FusedMLP((32, 64, 64, 8), activation="gelu", approximate="tanh", device=device)
    twin = FusedMLP((32, 64, 64, 8), activation="gelu", device=device)
    twin.load_state_dict(fused.state_dict())
    plain = twin.to_sequential()  # nn.Linear / nn.GELU, the same initial weights
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (fused, plain)]
    x = torch.randn(256, 32, device=device)
    y = torch.sin(x[:, :8])
    for step in range(args.steps):
        losses = []
        for model, opt in zip((fused, plain), opts):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        if step % 5 == 0 or step == args.steps - 1:
            print(f"step {step:3d}: dualk {losses[0]:.6f}  nn.Sequential {losses[1]:.6f}")
        assert abs(losses[0] - losses[1]) <= 1e-4 * max(1.0, losses[1]), losses
    print("losses match")


if __name__ == "__main__":
    main()
