"""Triton fused MLP, fp32: exact fp32 dots (input_precision="ieee", the default) against 3xTF32
tensor-core dots ("tf32x3"), on the GPU: accuracy by dualk's GEMM rule (within 2x PyTorch's own
error against float64) and time (dualk.tools.bench.time_device, L2 flushed) per shape.
Usage (GPU machine): python experiments/triton_mlp_precision.py"""

import torch

import dualk
import dualk.triton_src.fused_mlp as tmlp
from dualk.tools.bench import time_device
from dualk.registry import OPS, Sample, mlp_parameters
from dualk.testing import judge

plan = tmlp._plan


def with_precision(precision):
    def patched(widths, dtype, act, bias_mask):
        consts = plan(widths, dtype, act, bias_mask)
        return tuple(precision if c == "ieee" else c for c in consts)

    return patched


SHAPES = [((100, 128, 64, 10), 32, "relu"), ((100, 128, 64, 10), 4096, "relu"),
          ((100, 128, 64, 10), 65536, "relu"), ((64, 64, 64, 64, 16), 65536, "relu"),
          ((27, 50, 100, 16), 257, "relu"), ((50, 100, 50), 4096, "gelu"),
          ((96, 160, 40, 12), 5003, "silu"), ((256, 256, 256, 10), 65536, "relu")]  # fmt: skip
print(torch.cuda.get_device_name(), "torch", torch.__version__)
for widths, m, act in SHAPES:
    gen = torch.Generator().manual_seed(m)
    x = torch.randn((m, widths[0]), generator=gen).cuda()
    ws, bs = mlp_parameters(widths, torch.float32, "cuda", gen)
    sample = Sample((x, ws, bs), {"activation": act}, "p")
    row = []
    for precision in ("ieee", "tf32x3"):
        tmlp._plan = with_precision(precision)
        tmlp._plans.clear()
        out = dualk.fused_mlp(x, ws, bs, activation=act, backend="triton")
        v = judge(OPS["fused_mlp"], sample, out)
        t, _ = time_device(lambda: dualk.fused_mlp(x, ws, bs, activation=act, backend="triton"))
        row.append(
            f"{precision}: {t:8.2f} us  err {v.max_abs_err:.2e} {'ok' if v.ok else 'FAIL ' + v.message[:60]}"
        )
    tmlp._plan = plan
    tmlp._plans.clear()
    print(f"{'-'.join(map(str, widths)):>20} B{m:<6} {act:5}  " + "  |  ".join(row))
