"""add: out = a + alpha * b in one pass, computed in fp32 and rounded once to the dtype."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import KernelLauncher, cdiv, ptr_spec
from .elementwise import NUM_WARPS, block_size, plan_arguments, strided_offset


@triton.jit
def add_kernel(
    # pointers
    a_ptr,
    b_ptr,
    out_ptr,
    # sizes: element count and the inner three sizes of the 4-dim plan
    numel,
    size1,
    size2,
    size3,
    # strides of a and b over the plan, in elements (0 where broadcast)
    stride_a0,
    stride_a1,
    stride_a2,
    stride_a3,
    stride_b0,
    stride_b1,
    stride_b2,
    stride_b3,
    # scalar
    alpha,
    # meta-parameters
    DENSE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < numel
    if DENSE:
        a_offs = offs
        b_offs = offs
    else:
        a_offs = strided_offset(
            offs, size1, size2, size3, stride_a0, stride_a1, stride_a2, stride_a3
        )
        b_offs = strided_offset(
            offs, size1, size2, size3, stride_b0, stride_b1, stride_b2, stride_b3
        )
    a = tl.load(a_ptr + a_offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + b_offs, mask=mask).to(tl.float32)
    out = a + alpha * b
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


_launcher = KernelLauncher(add_kernel)


def add(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, alpha: float, plan) -> None:
    """Writes a + alpha * b into the contiguous `out` following `plan` (dualk.core.layout)."""
    block = block_size(out.element_size())
    ints, specs = plan_arguments(plan)
    # Everything Triton specializes the compiled kernel on (see KernelLauncher).
    key = (out.dtype, plan.dense, *specs, ptr_spec(a), ptr_spec(b), ptr_spec(out))
    grid = (cdiv(plan.numel, block), 1, 1)
    args = (a, b, out, *ints, float(alpha), plan.dense, block)
    _launcher.launch(key, grid, args, NUM_WARPS, 3)
