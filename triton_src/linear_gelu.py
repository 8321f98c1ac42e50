"""linear_gelu: gelu(x @ weight.T + bias) in one launch of the shared GEMM core
(triton_src/matmul.py), with the bias and GELU applied to the fp32 accumulator."""

from __future__ import annotations

import torch

from dualk.core import alloc as _alloc

from .common import ACT_GELU_ERF, ACT_GELU_TANH
from .matmul import _gemm

_GELU_ACTIVATIONS = {"tanh": ACT_GELU_TANH, "none": ACT_GELU_ERF}


def linear_gelu(
    x2d: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    approximate: str,
    allow_tf32: bool,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """gelu(x2d @ weight.T + bias, approximate=approximate) as a new contiguous (M, N) tensor,
    or written into ``out`` (a contiguous (M, N) tensor) and returned.

    x2d (M, K), weight (N, K) in nn.Linear layout, bias (N,) or None; any strides, one dtype
    among fp32/fp16/bf16 (validated by dualk). ``approximate``: "tanh" or "none" (erf), as in
    torch.nn.functional.gelu. ``allow_tf32``: fp32 inputs may use TF32 tensor cores.
    """
    activation = _GELU_ACTIVATIONS[approximate]
    M, K = x2d.shape
    N = weight.shape[0]
    c = _alloc.empty((M, N), x2d.dtype, x2d.device) if out is None else out  # NaN when poisoned
    if M == 0 or N == 0:
        return c
    if K == 0:
        # x2d @ weight.T is all zeros: the result is gelu(bias) on every row (gelu(0) = 0).
        if bias is None:
            return c.zero_()
        row = torch.nn.functional.gelu(bias.float(), approximate=approximate).to(x2d.dtype)
        return c.copy_(row.expand(M, N))

    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()  # (N,): the kernel reads it with unit stride
    # weight.t() is B (K, N) with stride_bk = weight.stride(1) (1 for a contiguous weight): the
    # kernel reads nn.Linear's layout directly, no transposed copy (and no tensor views: each
    # costs a microsecond or two of host time).
    sx, sw = x2d.stride(), weight.stride()
    _gemm(
        x2d, weight, bias, c, 1, M, N, K, 0, sx[0], sx[1], 0, sw[1], sw[0], 0, N, 1, activation,
        allow_tf32,
    )  # fmt: skip
    return c
