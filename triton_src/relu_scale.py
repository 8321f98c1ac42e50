"""relu_scale: out = relu(x) * scale in one pass (eager PyTorch needs two). relu keeps NaN."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import KernelLauncher, cdiv, ptr_spec
from .elementwise import NUM_WARPS, block_size, plan_arguments, strided_offset


@triton.jit
def relu_scale_kernel(
    # pointers
    x_ptr,
    out_ptr,
    # sizes: element count and the inner three sizes of the 4-dim plan
    numel,
    size1,
    size2,
    size3,
    # strides of x over the plan, in elements
    stride_x0,
    stride_x1,
    stride_x2,
    stride_x3,
    # scalar
    scale,
    # meta-parameters
    DENSE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < numel
    if DENSE:
        x_offs = offs
    else:
        x_offs = strided_offset(
            offs, size1, size2, size3, stride_x0, stride_x1, stride_x2, stride_x3
        )
    x = tl.load(x_ptr + x_offs, mask=mask).to(tl.float32)
    out = tl.where(x < 0, 0.0, x) * scale
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


_launcher = KernelLauncher(relu_scale_kernel)


def relu_scale(x: torch.Tensor, out: torch.Tensor, scale: float, plan) -> None:
    """Writes relu(x) * scale into the contiguous `out` following `plan` (dualk.core.layout)."""
    block = block_size(out.element_size())
    ints, specs = plan_arguments(plan)
    # Everything Triton specializes the compiled kernel on (see KernelLauncher).
    key = (out.dtype, plan.dense, *specs, ptr_spec(x), ptr_spec(out))
    grid = (cdiv(plan.numel, block), 1, 1)
    args = (x, out, *ints, float(scale), plan.dense, block)
    _launcher.launch(key, grid, args, NUM_WARPS, 3)
