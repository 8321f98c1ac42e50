"""The elementwise walk shared by add and relu_scale (the Triton twin of cuda_src/elementwise.cuh):
a dense path over flat offsets, and a strided path that unravels each output index over a
coalesced plan of up to four dims (dualk.core.layout makes the plan; deeper plans are made dense by
one copy before launch)."""

from __future__ import annotations

import triton
import triton.language as tl  # noqa: F401  (jit functions need tl in their module, even unused)

from .common import int_spec

MAX_DIMS = 4
NUM_WARPS = 4


def block_size(element_size: int) -> int:
    # 4 KiB of each operand per program, 4 warps: one or two 16-byte vectors per thread. Measured
    # best among 1K-16K elements x 4-16 warps on an H200 (experiments/elementwise_triton.py:
    # relu_scale fp32 2^28 508.5 us = copy speed, vs 527.8 us at 4096 x 8 warps).
    return 4096 // element_size


def padded_plan(sizes, strides_per_operand):
    """Plan sizes/strides left-padded to MAX_DIMS (a size-1 dim adds nothing to any offset)."""
    pad = MAX_DIMS - len(sizes)
    sizes = (1,) * pad + tuple(sizes)
    strides = [(0,) * pad + tuple(s) for s in strides_per_operand]
    return sizes, strides


_DENSE_STRIDES = (0, 0, 0, 1)  # a dense plan's unit stride, padded to MAX_DIMS
_DENSE_STRIDE_SPECS = tuple(map(int_spec, _DENSE_STRIDES))


def plan_arguments(plan) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The kernels' integer arguments for `plan` (numel, the inner three padded sizes, then each
    operand's four padded strides) and what Triton specializes each on (common.int_spec). A
    dense plan (sizes (numel,), unit strides: every same-shape contiguous call) is answered from
    constants: the padding and ~10 int_spec calls cost ~1.5 us of host time per call."""
    n = plan.numel
    if plan.dense:
        n_spec, count = int_spec(n), len(plan.strides)
        ints = (n, 1, 1, n, *_DENSE_STRIDES * count)
        return ints, (n_spec, 1, 1, n_spec, *_DENSE_STRIDE_SPECS * count)
    sizes, strides = padded_plan(plan.sizes, plan.strides)
    ints = (n, sizes[1], sizes[2], sizes[3], *(v for st in strides for v in st))
    return ints, tuple(map(int_spec, ints))


@triton.jit
def strided_offset(offs, size1, size2, size3, stride0, stride1, stride2, stride3):
    """Offset of flat output index `offs` in an operand with the given strides (4-dim plan; the
    outermost size is implied by the element count)."""
    i3 = offs % size3
    rest = offs // size3
    i2 = rest % size2
    rest = rest // size2
    i1 = rest % size1
    i0 = rest // size1
    return i0 * stride0 + i1 * stride1 + i2 * stride2 + i3 * stride3
