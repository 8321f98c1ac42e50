"""torch.compile(model, fullgraph=True) of a model built from dualk modules: one graph, no
break, the same answer as eager (forward and gradients).

    python examples/compile_mlp.py [--cpu]
"""

import argparse

import torch
from torch import nn

from dualk.nn import FusedMLP, LinearGELU


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    torch.manual_seed(0)
    model = nn.Sequential(
        LinearGELU(32, 64), FusedMLP((64, 64, 32), activation="relu"), nn.LayerNorm(32)
    ).to(device)
    # On the CPU, Dynamo + AOT autograd without code generation (no C++ compiler needed).
    compiled = torch.compile(
        model, fullgraph=True, backend="inductor" if device.type == "cuda" else "aot_eager"
    )
    x = torch.randn(128, 32, device=device)
    out, ref = compiled(x), model(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    out.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref.sum().backward()
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5)
    print(f"{device}: compiled (fullgraph) == eager, forward and gradients")


if __name__ == "__main__":
    main()
