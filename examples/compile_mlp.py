"""torch.compile(model, fullgraph=True) of models built from dualk modules, and of a model
fused by dualk.fuse: one graph, no break (every dualk op is a torch.library custom op), the
same forward and gradients as eager.

    python examples/compile_mlp.py [--backend auto|cuda|triton|torch] [--cpu]

On a GPU the compiler is Inductor; on the CPU (no GPU, or --cpu) it is "aot_eager" (Dynamo and
AOT autograd without code generation, so no C++ compiler is needed).
"""

import argparse

import torch
from torch import nn

import dualk
from dualk.nn import FusedMLP, LinearGELU


def check(name, model, x, compiler):
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=compiler)
    out, ref = compiled(x), model(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    out.square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref.square().mean().backward()
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5)
    model.zero_grad()
    print(f"{name}: compiled (fullgraph, {compiler}) == eager, forward and gradients")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto", choices=["auto", "cuda", "triton", "torch"])
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even with a GPU")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    compiler = "inductor" if device.type == "cuda" else "aot_eager"
    torch.manual_seed(0)

    blocks = nn.Sequential(
        LinearGELU(32, 64, backend=args.backend),
        FusedMLP((64, 64, 32), activation="silu", backend=args.backend),
        nn.LayerNorm(32),
    ).to(device)
    check("LinearGELU + FusedMLP + LayerNorm", blocks, torch.randn(16, 32, device=device), compiler)

    seq = nn.Sequential(nn.Linear(100, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                        nn.Linear(64, 10)).to(device)  # fmt: skip
    fused = dualk.fuse(seq, backend=args.backend)
    check("dualk.fuse(nn.Sequential)", fused, torch.randn(16, 100, device=device), compiler)


if __name__ == "__main__":
    main()
