"""linear_glu's backward, elementwise part: from the upstream gradient g and the forward's saved
pre-activations (gate, up), one pass writes d_pre = [d_gate | d_up] (M, 2N), with
d_gate = g * up * act'(gate) and d_up = g * act(gate) computed in fp32 and rounded once.

Eager PyTorch's autograd makes three passes over (M, N) tensors here (mul's two products and
the activation's backward: 9 tensor reads and writes); this one reads three and writes two. The
packed layout lets the GEMMs that follow (dualk/autograd/library.py glu_backward) take both halves at once
where the weights are packed: dX = d_pre @ [Wg; Wu] and d[Wg; Wu] = d_pre^T @ X, one GEMM each.

The activation and its derivative are the forward's and fused_mlp's backward's Triton code
(common.apply_activation, fused_mlp_backward._activation_grad).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from dualk.core import alloc as _alloc

from .common import KernelLauncher, apply_activation, cdiv, int_spec, interpreting, ptr_spec
from .fused_mlp_backward import _activation_grad, _round
from .linear_glu import _ACTIVATIONS
from .matmul import FAST_ACT_LEVEL


@triton.jit
def glu_backward_kernel(
    g_ptr,  # (M, N), any strides (autograd's gradients may be expanded)
    gate_ptr,  # (M, N), row stride stride_pm, unit column stride
    up_ptr,
    d_ptr,  # (M, 2 N) contiguous: [d_gate | d_up]
    M,
    N,
    stride_gm,
    stride_gn,
    stride_pm,
    ACTIVATION: tl.constexpr,
    FAST_ACT: tl.constexpr,
    EMULATE_RTNE: tl.constexpr,  # bf16 under the interpreter (see fused_mlp_backward._round)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(axis=0).to(tl.int64)
    pid_n = tl.program_id(axis=1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    g = tl.load(g_ptr + offs_m[:, None] * stride_gm + offs_n[None, :] * stride_gn, mask=mask)
    pre = offs_m[:, None] * stride_pm + offs_n[None, :]
    z = tl.load(gate_ptr + pre, mask=mask)
    u = tl.load(up_ptr + pre, mask=mask).to(tl.float32)
    g = g.to(tl.float32)
    h = apply_activation(z.to(tl.float32), ACTIVATION, FAST_ACT)
    d_gate = _activation_grad(g * u, z, h, ACTIVATION, FAST_ACT)
    d_up = g * h
    dty = d_ptr.dtype.element_ty
    out = d_ptr + (offs_m[:, None] * (2 * N) + offs_n[None, :])
    tl.store(out, _round(d_gate, dty, EMULATE_RTNE), mask=mask)
    tl.store(out + N, _round(d_up, dty, EMULATE_RTNE), mask=mask)


class GluBackwardConfig(NamedTuple):
    """One launch configuration of glu_backward_kernel."""

    block_m: int  # BLOCK_M: rows per program
    block_n: int  # BLOCK_N: columns per program (of each half)
    num_warps: int


_launcher = KernelLauncher(glu_backward_kernel)
# Not measured on a GPU yet: 16-byte loads along N, 8 KB of each operand per program (fp16).
CONFIG = GluBackwardConfig(block_m=32, block_n=128, num_warps=4)
_INTERPRETER_CONFIG = GluBackwardConfig(block_m=16, block_n=32, num_warps=4)


def glu_backward(
    grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str, approximate: str
) -> torch.Tensor:
    """[d_gate | d_up] (M, 2N) in gate's dtype from grad, gate, up (M, N) (gate and up with one
    row stride and unit column stride)."""
    M, N = gate.shape
    dtype, device = gate.dtype, gate.device
    d_pre = _alloc.empty((M, 2 * N), dtype, device)
    if M == 0 or N == 0:
        return d_pre
    if gate.stride(1) != 1 or up.stride() != gate.stride():
        gate, up = gate.contiguous(), up.contiguous()
    act = _ACTIVATIONS[(activation, approximate)]
    fast = 0 if dtype == torch.float32 else FAST_ACT_LEVEL[0]
    interp = interpreting()
    cfg = _INTERPRETER_CONFIG if interp else CONFIG
    block_m, block_n = cfg.block_m, cfg.block_n
    rtne = interp and dtype == torch.bfloat16
    ints = (M, N, grad.stride(0), grad.stride(1), gate.stride(0))
    consts = (act, fast, rtne, block_m, block_n)
    key = (
        dtype, grad.dtype, *(int_spec(v) for v in ints), *(ptr_spec(t) for t in (grad, gate, up,
        d_pre)), consts,
    )  # fmt: skip
    grid = (cdiv(M, block_m), cdiv(N, block_n), 1)
    _launcher.launch(key, grid, (grad, gate, up, d_pre, *ints, *consts), cfg.num_warps, 1)
    return d_pre
