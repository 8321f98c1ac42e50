"""Where the host time of a dualk training step goes (GPU only): the 64x5 fp16 MLP at 2^18 rows
of bench/integration.py's training step, cut into pieces, each timed as host microseconds per
call without synchronisation (20 calls, median of 5), plus a cProfile of the fused backward's
launcher sorted by own time.

    python3 experiments/host_pieces.py [--json F]

Why: the step is host-bound on the H100 machines (GPU work ~0.3 ms, host ~1.4 ms), so the
speedup over eager is set by Python and autograd overhead, not by the kernels.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from integration import _host_us  # noqa: E402

from dualk.nn import FusedMLP  # noqa: E402


def host_us(fn, calls=20, prepare=None) -> float:
    """bench/integration.py's host timer (20 calls, no sync inside, median of 5), rounded."""
    return round(_host_us(fn, calls, prepare), 1)


class _Given(torch.autograd.Function):
    """y from precomputed values; backward returns precomputed gradients (engine + accumulate
    cost without any kernel of ours)."""

    @staticmethod
    def forward(ctx, y, grads, *params):
        ctx.grads = grads
        return y.clone()

    @staticmethod
    def backward(ctx, g):
        return (None, None, *ctx.grads)


def main() -> dict:
    from dualk.autograd import library
    from dualk.autograd import mlp_backward
    from dualk.triton_src import fused_mlp_backward as kernel
    from dualk.triton_src.common import ptr_spec

    dev, dtype = torch.device("cuda"), torch.float16
    torch.manual_seed(0)
    fused = FusedMLP((64, 64, 64, 64, 64, 16), device=dev, dtype=dtype)
    seq = fused.to_sequential()
    x = torch.randn(2**18, 64, device=dev, dtype=dtype)
    target = torch.randn(2**18, 16, device=dev, dtype=dtype)
    mse = torch.nn.functional.mse_loss
    params = list(fused.parameters())
    ws = [lin.weight for lin in fused.layers]
    bs = [lin.bias for lin in fused.layers]
    g = torch.randn(2**18, 16, device=dev, dtype=dtype)
    given_grads = [torch.randn_like(p) for p in params]
    with torch.no_grad():
        y0 = fused(x)

    def step(model):
        for p in model.parameters():
            p.grad = None
        mse(model(x), target).backward()

    for _ in range(5):
        step(fused)
        step(seq)
    torch.cuda.synchronize()

    def clear(_=None):
        for p in params:
            p.grad = None

    out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    import triton

    out["triton"] = triton.__version__
    try:
        from triton import knobs

        out["triton launch_enter_hook"] = repr(knobs.runtime.launch_enter_hook)
    except Exception as exc:  # older Triton
        out["triton launch_enter_hook"] = f"n/a ({exc})"
    pieces = {}
    pieces["step eager"] = host_us(lambda _: step(seq))
    pieces["step dualk"] = host_us(lambda _: step(fused))
    pieces["p.grad = None x10"] = host_us(clear)
    pieces["forward dualk grad on"] = host_us(lambda _: fused(x))
    pieces["forward dualk no_grad"] = host_us(lambda _: _nograd(fused, x))
    pieces["mse forward"] = host_us(lambda _: mse(y0, target))
    yl = y0.detach().requires_grad_()
    pieces["mse backward alone (leaf y)"] = host_us(
        lambda loss: loss.backward(), prepare=lambda n: [mse(yl, target) for _ in range(n)]
    )

    def given_loss(n):
        clear()
        return [mse(_Given.apply(y0, given_grads, *params), target) for _ in range(n)]

    pieces["backward: Function w/ given grads (engine+accumulate x10)"] = host_us(
        lambda loss: (loss.backward(), clear()), prepare=given_loss
    )

    def real_loss(n):
        clear()
        return [mse(fused(x), target) for _ in range(n)]

    pieces["backward: dualk (real)"] = host_us(
        lambda loss: (loss.backward(), clear()), prepare=real_loss
    )
    pieces["library.run_fused_mlp_backward direct"] = host_us(
        lambda _: library.run_fused_mlp_backward(
            x, ws, bs, 0b11111, "relu", g, "auto", True, own_outputs=False
        )
    )
    pieces["mlp_backward.fused_mlp_backward"] = host_us(
        lambda _: mlp_backward.fused_mlp_backward(x, ws, bs, "relu", g, "auto", True)
    )
    pieces["mlp_backward._resolved"] = host_us(lambda _: mlp_backward._resolved("auto"))
    pieces["mlp_backward._fused_kernel"] = host_us(
        lambda _: mlp_backward._fused_kernel(x, ws, "auto")
    )
    pieces["triton launcher"] = host_us(
        lambda _: kernel.fused_mlp_backward(x, ws, bs, "relu", g, True)
    )
    flat = torch.empty(20000, dtype=dtype, device=dev)
    pieces["10 slices of a flat buffer"] = host_us(
        lambda _: [flat[i * 100 : i * 100 + 64] for i in range(10)]
    )
    pieces["split_with_sizes (10)"] = host_us(lambda _: flat.split_with_sizes([64] * 10 + [19360]))
    pieces["torch.empty 32MB"] = host_us(
        lambda _: torch.empty((2**18, 64), dtype=dtype, device=dev)
    )
    pieces["ptr_spec x12"] = host_us(lambda _: [ptr_spec(w) for w in ws + bs + [x, g]])
    pieces["is_contiguous x5"] = host_us(lambda _: [w.is_contiguous() for w in ws])
    out["host us per call"] = pieces

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(100):
        kernel.fused_mlp_backward(x, ws, bs, "relu", g, True)
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    out["cProfile triton launcher x100 (tottime)"] = text.getvalue()

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        step(fused)
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
    out["cProfile dualk step x50 (tottime)"] = text.getvalue()
    return out


def _nograd(model, x):
    with torch.no_grad():
        return model(x)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    result = main()
    for key, value in result.items():
        if isinstance(value, dict):
            print(key)
            for k, v in value.items():
                print(f"  {k:60s} {v}")
        else:
            print(key, value if isinstance(value, str) else json.dumps(value))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
