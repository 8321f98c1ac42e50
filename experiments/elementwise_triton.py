"""Times triton_src's relu_scale and add kernels with several BLOCK_SIZE / num_warps choices at
2^24 and 2^28 elements (fp32, bf16), beside torch eager and a copy of the same bytes. GPU only:
    python3 experiments/elementwise_triton.py
"""

import sys
from pathlib import Path

import torch
import triton
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dualk.core.layout import plan_elementwise  # noqa: E402
from dualk.triton_src import add as add_mod  # noqa: E402
from dualk.triton_src import relu_scale as relu_mod  # noqa: E402
from dualk.triton_src.elementwise import padded_plan  # noqa: E402

VARIANTS = [(1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 4), (8192, 8), (16384, 16)]


def us(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def main():
    for n in (2**24, 2**28):
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(n, device="cuda").to(dtype)
            y = torch.randn(n, device="cuda").to(dtype)
            out = torch.empty_like(x)
            plan = plan_elementwise(x)
            sizes, (st,) = padded_plan(plan.sizes, plan.strides)
            print(
                f"relu_scale n={n} {dtype}: eager {us(lambda: torch.relu(x) * 1.5):.2f} us, copy {us(lambda: out.copy_(x)):.2f} us"
            )
            for block, warps in VARIANTS:
                t = us(
                    lambda b=block, w=warps: relu_mod.relu_scale_kernel[(triton.cdiv(n, b),)](
                        x,
                        out,
                        n,
                        sizes[1],
                        sizes[2],
                        sizes[3],
                        *st,
                        1.5,
                        DENSE=True,
                        BLOCK_SIZE=b,
                        num_warps=w,
                    )
                )
                print(f"   BLOCK {block:6d} warps {warps:2d}: {t:8.2f} us")
            plan2 = plan_elementwise(x, y)
            sizes, (sa, sb) = padded_plan(plan2.sizes, plan2.strides)
            print(f"add n={n} {dtype}: eager {us(lambda: torch.add(x, y)):.2f} us")
            for block, warps in VARIANTS:
                t = us(
                    lambda b=block, w=warps: add_mod.add_kernel[(triton.cdiv(n, b),)](
                        x,
                        y,
                        out,
                        n,
                        sizes[1],
                        sizes[2],
                        sizes[3],
                        *sa,
                        *sb,
                        1.0,
                        DENSE=True,
                        BLOCK_SIZE=b,
                        num_warps=w,
                    )
                )
                print(f"   BLOCK {block:6d} warps {warps:2d}: {t:8.2f} us")


if __name__ == "__main__":
    main()
