"""How an elementwise operator walks its operands: broadcast them to the output's shape, then merge
dimensions that are contiguous in every operand so kernels index as few dims as possible (most
inputs collapse to one dense dim; a broadcast or a strided view keeps a few)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

MAX_DIMS = 8  # cuda_src/launchers.h kMaxDims


class ElementwisePlan(NamedTuple):  # a NamedTuple: built on every call, so cheap to make
    out_shape: torch.Size
    numel: int
    sizes: tuple[int, ...]  # coalesced iteration shape (outermost first)
    strides: tuple[tuple[int, ...], ...]  # per operand, in elements, 0 where broadcast
    dense: bool  # every operand is one contiguous run in output order

    @property
    def ndim(self) -> int:
        return len(self.sizes)


_UNIT_STRIDES = {1: ((1,),), 2: ((1,), (1,))}


def plan_elementwise(*operands: torch.Tensor) -> ElementwisePlan:
    """Iteration plan for an output of the operands' broadcast shape, written contiguously."""
    first = operands[0]
    shape = first.shape
    # The common case (operands of one shape, contiguous), answered without building stride
    # lists; written out for the one- and two-operand calls every operator makes (a generator
    # over the operands cost ~0.8 us of host time per call).
    if len(operands) == 1:
        same_dense = first.is_contiguous()
    elif len(operands) == 2:
        second = operands[1]
        same_dense = second.shape == shape and first.is_contiguous() and second.is_contiguous()
    else:
        same_dense = all(t.shape == shape and t.is_contiguous() for t in operands)
    if same_dense:
        n = first.numel()
        return ElementwisePlan(shape, n, (n,), _UNIT_STRIDES[len(operands)], True)

    out_shape = torch.broadcast_shapes(*(t.shape for t in operands))
    numel = out_shape.numel()
    expanded = [t.expand(out_shape) for t in operands]
    # Keep dims of size > 1 (size-1 dims contribute nothing to any offset).
    dims = [d for d, s in enumerate(out_shape) if s != 1]
    sizes = [out_shape[d] for d in dims]
    strides = [[e.stride(d) for d in dims] for e in expanded]
    # Merge dim i into dim i+1 (inner) when every operand steps over it as one run.
    i = len(sizes) - 2
    while i >= 0:
        if all(st[i] == st[i + 1] * sizes[i + 1] for st in strides):
            sizes[i + 1] *= sizes[i]
            del sizes[i]
            for st in strides:
                del st[i]
        i -= 1
    dense = len(sizes) <= 1 and all(not st or st[0] == 1 for st in strides)
    if not sizes:
        sizes, strides = [1], [[1] for _ in strides]
    return ElementwisePlan(out_shape, numel, tuple(sizes), tuple(tuple(s) for s in strides), dense)


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """(..., features) as (rows, features): a view when the strides allow (reshape copies
    otherwise); well defined for zero features too, unlike reshape(-1, 0)."""
    if x.dim() == 2:  # already rows: skip the reshape (a microsecond of host time)
        return x
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def row_count(x: torch.Tensor) -> int:
    """Rows of a (..., features) tensor: the product of its leading dims (for zero features too)."""
    k = x.shape[-1]
    if k:
        return x.numel() // k
    n = 1
    for s in x.shape[:-1]:
        n *= s
    return n


def layout_code(t: torch.Tensor) -> str:
    """The layout letter of auto's keys: "c" contiguous, "r" unit stride along the last dim
    (sliced or padded rows), "s" other strides (transposed)."""
    if t.is_contiguous():
        return "c"
    return "r" if t.stride(-1) == 1 else "s"


def fit_plan(plan: ElementwisePlan, max_dims: int, *operands: torch.Tensor):
    """(*operands, plan) unchanged when a kernel can index the plan's dims; else one documented
    copy makes every operand dense in output order (plans that deep are rare: dims merge)."""
    if plan.ndim <= max_dims:
        return (*operands, plan)
    dense = [t.expand(plan.out_shape).contiguous() for t in operands]
    return (*dense, plan_elementwise(*dense))
