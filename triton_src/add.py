"""add: out = a + alpha * b in one pass, computed in fp32 and rounded once to the dtype."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import KernelLauncher, int_spec, ptr_spec
from .elementwise import NUM_WARPS, block_size, padded_plan, strided_offset


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
    """Writes a + alpha * b into the contiguous `out` following `plan` (dualk.layout)."""
    sizes, (st_a, st_b) = padded_plan(plan.sizes, plan.strides)
    block = block_size(out.element_size())
    ints = (plan.numel, sizes[1], sizes[2], sizes[3], *st_a, *st_b)
    # Everything Triton specializes the compiled kernel on (see KernelLauncher).
    key = (out.dtype, plan.dense, *map(int_spec, ints), ptr_spec(a), ptr_spec(b), ptr_spec(out))
    grid = ((plan.numel + block - 1) // block, 1, 1)  # triton.cdiv costs ~2 us of host time
    args = (a, b, out, *ints, float(alpha), plan.dense, block)
    _launcher.launch(key, grid, args, NUM_WARPS, 3)


# The dense plan (operands of the output's shape, contiguous) padded to 4 dims: sizes (1, 1, 1, n),
# strides (0, 0, 0, 1). add_dense launches exactly what add() launches for it (same arguments,
# same key, so the same compiled kernel) without building the plan: ~5 us less host time.
_DENSE_STRIDES = (0, 0, 0, 1)
_DENSE_STRIDE_SPECS = tuple(map(int_spec, _DENSE_STRIDES))


def add_dense(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, alpha: float) -> None:
    """Writes a + alpha * b into `out`; every tensor contiguous and of out's shape, out non-empty."""
    n = out.numel()
    block = block_size(out.element_size())
    n_spec = int_spec(n)
    specs = (n_spec, 1, 1, n_spec, *_DENSE_STRIDE_SPECS, *_DENSE_STRIDE_SPECS)
    key = (out.dtype, True, *specs, ptr_spec(a), ptr_spec(b), ptr_spec(out))
    ints = (n, 1, 1, n, *_DENSE_STRIDES, *_DENSE_STRIDES)
    grid = ((n + block - 1) // block, 1, 1)
    _launcher.launch(key, grid, (a, b, out, *ints, float(alpha), True, block), NUM_WARPS, 3)
