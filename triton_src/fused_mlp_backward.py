"""fused_mlp_backward: gradients of a whole Linear/activation stack (1 to 8 layers) in one
persistent kernel launch, plus one small reduction launch.

Why: eager autograd of an MLP moves every activation, pre-activation and gradient tensor through
HBM (~58 activation-sized tensors a step for a 5-layer MLP). Here HBM sees x and grad_out once
and grad_x once; everything else stays on chip.
Why one file of ~800 lines: the kernel, its reduction kernel and the host planner (register
budget, workspace layout, configs) are one design whose parts change together; the layer walk is
unrolled by hand because Triton cannot index a list of tensors by a loop variable.

Design
------
- Weights resident: each program loads every layer's W^T once (zero-padded to powers of two
  >= 16, as in triton_src/fused_mlp.py) and reuses it for all of its row tiles, for the forward
  dot (h @ W^T) and the backward dot (dZ @ W, the same block transposed).
- Per row tile (BLOCK_M rows, persistent loop over tiles): recompute the forward on chip with
  the forward kernel's rounding (fp32 accumulation, each layer's activation rounded to the
  operand dtype before the next dot), keeping each layer's input H_i in the operand dtype, and
  its pre-activation Z_i (rounded to the operand dtype, as eager autograd saves it) only for
  activations whose derivative needs it (gelu, silu; relu tests H <= 0, as
  torch.threshold_backward does). Then walk the layers backwards: dZ_L = grad_out;
  dW_i += dZ_{i+1}^T @ H_i, db_i += column sums of dZ_{i+1} (fp32 accumulation of the rounded
  dZ, as eager's matmul and sum do); dH_i = dZ_{i+1} @ W_i (fp32); dZ_i = dH_i * act'(Z_i)
  (fp32, rounded to the operand dtype once, as the next dots' operand); grad_x = dH_0. No
  prefetch of the next tile (it would hold a tile in registers across the loop); grad_out is
  loaded before the forward recompute, which hides its latency.
- Weight/bias gradient accumulation, per layer (REG_MASK bit i):
  * in registers: dW_i is a tl.dot accumulator carried across the persistent loop; db_i is
    accumulated as ones(16, BLOCK_M) @ dZ (a 16-row MMA accumulator, 16 * P / (32 * warps)
    registers a thread) instead of tl.sum, whose 1-D result would be replicated across the
    threads of the MMA layout (16 registers a thread per 64-wide layer at 4 warps).
  * in the program's private slice of the fp32 workspace: each tile adds its dW_i / db_i with a
    plain load + add + store (the slice belongs to one program, so no atomics; it stays in L2).
    A CTA barrier at the top of each tile orders one tile's stores before the next tile's loads
    (threads of one program may read elements another thread of it stored).
  The host picks the layers kept in registers greedily (largest first) under a per-config budget
  of accumulator registers a thread (dW: P_out * P_in / threads, db: 16 * P_out / threads); the
  rest go to the workspace. 64-64-64-64-64-16 with bias at 8 warps: all five layers take ~85.
  Each program writes one partial (its register accumulators once, after its last tile) into
  workspace[pid, :]; a second tiny kernel sums the partials in a fixed order (deterministic)
  and writes all gradients, in the weight dtype, into one flat buffer that the returned
  grad_weights / grad_biases are views of (as torch's own results: fp32 sums, one rounding).
- fp32 dots use input_precision="ieee" (exact fp32, CUDA cores); fp16/bf16 run on tensor cores
  with fp32 accumulation. fp16/bf16 activations and derivatives use the forward's fast exp/rcp.
- Registers are the limit: see fused_mlp_backward_configs for the counts per config, measured
  by compiling for sm_90a (Triton 3.9's ptxas) on a machine without a GPU. The widths allowed
  (padded <= 128, <= 64 in fp32; resident weights <= 128 KiB, fp16/bf16 counted twice) are the
  ones that compiled without large spills.
- Configs (BLOCK_M, num_warps, programs per SM, accumulator-register budget): a short list per
  dtype class, timed once per (shape, batch bucket) key like the forward. Under the interpreter
  one small config (BLOCK_M=16, 4 programs) so test batches give several tiles per program.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from dualk.core import alloc as _alloc

from .common import (
    ACT_NONE,
    PRECISE_MATH,
    KernelLauncher,
    _fast_exp2,
    _fast_rcp,
    activation_id,
    apply_activation,
    cdiv,
    dot_in_fp32,
    int_spec,
    interpreting,
    libdevice,
    num_sms,
    pow2_bucket,
    ptr_spec,
    tuned_config,
)
from .fused_mlp import MAX_LAYERS, _load_rows, _load_weight, _m_bucket, _padded, fit_reason

# Widest padded layer: the backward holds a tile's activations of every layer plus dZ / dH
# blocks in registers at once; 256 (the forward's limit) leaves no room at any BLOCK_M. fp32
# (CUDA-core dots that unroll K): a 128-wide layer spilled KiBs a thread at every config.
MAX_PADDED_WIDTH_BWD = 128
MAX_PADDED_WIDTH_BWD_FP32 = 64
# Shared memory the resident weights may take (leaving ~90 KiB of a Hopper SM for the layout
# conversions of the per-tile operands). fp16/bf16 count twice: with mma.sync (the row tiles of
# <= 32 that keep the accumulators in registers) Triton keeps W^T for the forward dot and W for
# the backward dot in two layouts. Checked by compiling for sm_90a with Triton 3.9: 64x8 fp16
# takes 172 KiB, 128-128-128-16 fp16 (68 KiB of weights, rejected) would take 220 KiB.
MAX_RESIDENT_WEIGHT_BYTES_BWD = 128 * 1024


def fused_mlp_backward_unsupported_reason(widths: Sequence[int], dtype: torch.dtype) -> str | None:
    """None when ``fused_mlp_backward`` can run the MLP with these widths ([in, hidden..., out])
    and dtype in one kernel, else why not (the caller then runs a per-layer chain). Remembered
    per (widths, dtype): every training step asks."""
    key = (tuple(widths), dtype)
    if key not in _unsupported_reasons:
        _unsupported_reasons[key] = _unsupported_reason(list(widths), dtype)
    return _unsupported_reasons[key]


_unsupported_reasons: dict = {}


def _unsupported_reason(widths: list, dtype: torch.dtype) -> str | None:
    fp32 = dtype == torch.float32
    return fit_reason(
        "fused_mlp_backward", widths, dtype,
        MAX_PADDED_WIDTH_BWD_FP32 if fp32 else MAX_PADDED_WIDTH_BWD,
        f" ({str(dtype)[6:]}): the backward keeps every layer's activations of a row tile in "
        "registers",
        MAX_RESIDENT_WEIGHT_BYTES_BWD,
        f" of shared memory{'' if fp32 else ' (two layouts)'} > {{}} KiB that fit on chip with "
        "the backward's row tiles",
        weight_copies=1 if fp32 else 2,
    )  # fmt: skip


# ----------------------------------------------------------------------------- device helpers
@triton.jit
def _round(x, dtype: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """fp32 x rounded to ``dtype``, to nearest even. EMULATE_RTNE: bf16 under the interpreter,
    whose fp32 -> bf16 cast truncates (Triton 3.9; also with fp_downcast_rounding="rtne"),
    which biased bf16 gradients by ~1 ulp per rounding: round the fp32 bits by hand first."""
    if EMULATE_RTNE:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _sigmoid_parts(x, FAST: tl.constexpr):
    """(e, s) = (exp(-x), 1 / (1 + e)) in fp32; FAST as in common.apply_activation."""
    if FAST == 2 and PRECISE_MATH:
        e = _fast_exp2(-1.4426950408889634 * x)
        s = _fast_rcp(1.0 + e)
    elif FAST:
        e = tl.exp2(-1.4426950408889634 * x)
        s = 1.0 / (1.0 + e)
    elif PRECISE_MATH:
        e = libdevice.exp(-x)
        s = 1.0 / (1.0 + e)
    else:
        e = tl.exp(-x)
        s = 1.0 / (1.0 + e)
    return e, s


@triton.jit
def _activation_grad(dh, z, h, ACTIVATION: tl.constexpr, FAST: tl.constexpr):
    """dh * act'(z) in fp32 (dh fp32; z the pre-activation, h the activation, operand dtype).

    1 - s is computed as e * s (no cancellation near s = 1); where s is 0 (e = inf), 1 - s = 1.
    Derivatives as PyTorch's: gelu_tanh' = s + 2 x s (1 - s) beta (1 + 3 kappa x^2) with
    s = sigmoid(2 beta (x + kappa x^3)) (== 0.5 (1 + tanh)); gelu_erf' = Phi(x) + x phi(x);
    silu' = s (1 + x (1 - s)); relu' = [h > 0] (NaN passes, as threshold_backward's h <= 0 test).
    """
    if ACTIVATION == 1:
        dh = tl.where(h <= 0.0, 0.0, dh)
    elif ACTIVATION == 2:
        x = z.to(tl.float32)
        e, s = _sigmoid_parts(1.5957691216057308 * (x + 0.044715 * x * x * x), FAST)
        one_minus_s = tl.where(s > 0.0, e * s, 1.0)
        dh = dh * (s + 1.5957691216057308 * x * s * one_minus_s * (1.0 + 0.134145 * x * x))
    elif ACTIVATION == 3:
        x = z.to(tl.float32)
        cdf = 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476))
        if PRECISE_MATH:
            pdf = 0.3989422804014327 * libdevice.exp(-0.5 * x * x)
        else:
            pdf = 0.3989422804014327 * tl.exp(-0.5 * x * x)
        dh = dh * (cdf + x * pdf)
    elif ACTIVATION == 4:
        x = z.to(tl.float32)
        e, s = _sigmoid_parts(x, FAST)
        one_minus_s = tl.where(s > 0.0, e * s, 1.0)
        dh = dh * (s * (1.0 + x * one_minus_s))
    return dh


@triton.jit
def _forward_layer(
    h,  # (BLOCK_M, P_IN) layer input, operand dtype
    w_t,  # (P_IN, P_OUT) resident W^T
    b_ptr,
    D_OUT: tl.constexpr,
    P_OUT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    FAST_ACT: tl.constexpr,
):
    """A hidden layer as fused_mlp computes it: (act(h @ w_t + b) rounded to the operand dtype,
    z = h @ w_t + b rounded to the operand dtype). For relu / none, z is not kept (the
    derivative reads h), and the second value is the first."""
    dtype = h.dtype
    if DOT_IN_FP32:
        h = h.to(tl.float32)
        w_t = w_t.to(tl.float32)
    z = tl.dot(h, w_t, input_precision=INPUT_PRECISION)
    offs_n = tl.arange(0, P_OUT)
    if HAS_BIAS:
        z += tl.load(b_ptr + offs_n, mask=offs_n < D_OUT, other=0.0).to(tl.float32)[None, :]
    a = apply_activation(z, ACTIVATION, FAST_ACT)
    if P_OUT != D_OUT:
        # Padded columns stay exactly 0 (an inf input would make them inf * 0 = NaN).
        a = tl.where(offs_n[None, :] < D_OUT, a, 0.0)
    a = _round(a, dtype, DOT_IN_FP32)
    if ACTIVATION == 2 or ACTIVATION == 3 or ACTIVATION == 4:
        return a, _round(z, dtype, DOT_IN_FP32)
    return a, a


@triton.jit
def _backprop(
    dzc,  # (BLOCK_M, P_OUT) dZ_{i+1}, operand dtype
    w_t,  # (P_IN, P_OUT) resident W_i^T
    z,  # (BLOCK_M, P_IN) Z_i (or H_i for relu / none)
    h,  # (BLOCK_M, P_IN) H_i
    D_IN: tl.constexpr,
    P_IN: tl.constexpr,
    ACTIVATION: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    FAST_ACT: tl.constexpr,
):
    """dZ_i = (dZ_{i+1} @ W_i) * act'(Z_i), rounded to the operand dtype; padded columns 0."""
    dtype = dzc.dtype
    if DOT_IN_FP32:
        dzc = dzc.to(tl.float32)
        w_t = w_t.to(tl.float32)
    dh = tl.dot(dzc, tl.trans(w_t), input_precision=INPUT_PRECISION)
    dh = _activation_grad(dh, z, h, ACTIVATION, FAST_ACT)
    if P_IN != D_IN:
        # Padded columns would meet zero weight rows in the next dot; keep them 0, not NaN.
        offs_k = tl.arange(0, P_IN)
        dh = tl.where(offs_k[None, :] < D_IN, dh, 0.0)
    return _round(dh, dtype, DOT_IN_FP32)


@triton.jit
def _grads_into_regs(
    dzc,  # (BLOCK_M, P_OUT) dZ_{i+1}, operand dtype
    h,  # (BLOCK_M, P_IN) H_i
    dw,  # (P_OUT, P_IN) fp32 accumulator
    db,  # (16, P_OUT) fp32 accumulator (16 equal rows)
    HAS_BIAS: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """dw += dZ^T @ H; db += ones(16, BLOCK_M) @ dZ (column sums on the tensor cores)."""
    ones = tl.full((16, BLOCK_M), 1.0, dzc.dtype)
    if DOT_IN_FP32:
        dzc = dzc.to(tl.float32)
        h = h.to(tl.float32)
        ones = ones.to(tl.float32)
    dw = tl.dot(tl.trans(dzc), h, dw, input_precision=INPUT_PRECISION)
    if HAS_BIAS:
        db = tl.dot(ones, dzc, db, input_precision=INPUT_PRECISION)
    return dw, db


@triton.jit
def _grads_into_workspace(
    dzc,  # (BLOCK_M, P_OUT) dZ_{i+1}, operand dtype
    h,  # (BLOCK_M, P_IN) H_i
    slice_ptr,  # this program's fp32 partial of layer i: dW (D_OUT, D_IN) then db (D_OUT,)
    D_IN: tl.constexpr,
    D_OUT: tl.constexpr,
    P_IN: tl.constexpr,
    P_OUT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
    """The program's partial dW (and db) += this tile's; the caller put a CTA barrier between
    the previous tile's stores and these loads."""
    if DOT_IN_FP32:
        dzc = dzc.to(tl.float32)
        h = h.to(tl.float32)
    dw = tl.dot(tl.trans(dzc), h, input_precision=INPUT_PRECISION)
    offs_o = tl.arange(0, P_OUT)
    offs_i = tl.arange(0, P_IN)
    ptrs = slice_ptr + offs_o[:, None] * D_IN + offs_i[None, :]
    mask = (offs_o[:, None] < D_OUT) & (offs_i[None, :] < D_IN)
    tl.store(ptrs, tl.load(ptrs, mask=mask, other=0.0) + dw, mask=mask)
    if HAS_BIAS:
        db = tl.sum(dzc.to(tl.float32), axis=0)
        b_ptrs = slice_ptr + D_OUT * D_IN + offs_o
        b_mask = offs_o < D_OUT
        tl.store(b_ptrs, tl.load(b_ptrs, mask=b_mask, other=0.0) + db, mask=b_mask)


@triton.jit
def _store_partial(
    slice_ptr,
    dw,  # (P_OUT, P_IN) fp32; zeros for a workspace layer's initial value
    db,  # (16, P_OUT) fp32, 16 equal rows
    D_IN: tl.constexpr,
    D_OUT: tl.constexpr,
    P_IN: tl.constexpr,
    P_OUT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    offs_o = tl.arange(0, P_OUT)
    offs_i = tl.arange(0, P_IN)
    ptrs = slice_ptr + offs_o[:, None] * D_IN + offs_i[None, :]
    mask = (offs_o[:, None] < D_OUT) & (offs_i[None, :] < D_IN)
    tl.store(ptrs, dw, mask=mask)
    if HAS_BIAS:
        offs_r = tl.arange(0, 16)
        b_ptrs = slice_ptr + D_OUT * D_IN + offs_r[:, None] * 0 + offs_o[None, :]
        b_mask = (offs_r[:, None] == 0) & (offs_o[None, :] < D_OUT)
        tl.store(b_ptrs, db, mask=b_mask)


# Each layer's block of the kernel below is the same code with the layer's index; a helper per
# step keeps a block to a few calls. Layer i maps H_i (width D_i) to Z_{i+1} (width D_{i+1}).
@triton.jit(do_not_specialize=["M"])
def fused_mlp_backward_kernel(
    x_ptr,  # (M, D0) input
    g_ptr,  # (M, D_OUT) grad of the output
    dx_ptr,  # (M, D0) grad of the input; not written unless NEED_DX
    ws_ptr,  # (num_programs, WS_TOTAL) fp32 partials
    w0_ptr,
    w1_ptr,
    w2_ptr,
    w3_ptr,
    w4_ptr,
    w5_ptr,
    w6_ptr,
    w7_ptr,
    b0_ptr,
    b1_ptr,
    b2_ptr,
    b3_ptr,
    b4_ptr,
    b5_ptr,
    b6_ptr,
    b7_ptr,
    M,
    stride_xm,
    stride_xk,
    stride_gm,
    stride_gn,
    stride_dxm,
    NUM_LAYERS: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    D2: tl.constexpr,
    D3: tl.constexpr,
    D4: tl.constexpr,
    D5: tl.constexpr,
    D6: tl.constexpr,
    D7: tl.constexpr,
    D8: tl.constexpr,
    P0: tl.constexpr,
    P1: tl.constexpr,
    P2: tl.constexpr,
    P3: tl.constexpr,
    P4: tl.constexpr,
    P5: tl.constexpr,
    P6: tl.constexpr,
    P7: tl.constexpr,
    P8: tl.constexpr,
    D_OUT: tl.constexpr,
    P_OUT: tl.constexpr,
    # Offsets of layer i's partial (dW then db) in a workspace row, and the row length.
    OFF0: tl.constexpr,
    OFF1: tl.constexpr,
    OFF2: tl.constexpr,
    OFF3: tl.constexpr,
    OFF4: tl.constexpr,
    OFF5: tl.constexpr,
    OFF6: tl.constexpr,
    OFF7: tl.constexpr,
    WS_TOTAL: tl.constexpr,
    BIAS_MASK: tl.constexpr,  # bit i: layer i has a bias
    REG_MASK: tl.constexpr,  # bit i: layer i's dW / db accumulate in registers (else workspace)
    ACTIVATION: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,  # bf16 under the interpreter: fp32 dots, rounding by hand
    FAST_ACT: tl.constexpr,
    NEED_DX: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    dtype = x_ptr.dtype.element_ty
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    num_tiles = tl.cdiv(M, BLOCK_M)
    ws_row = ws_ptr + pid.to(tl.int64) * WS_TOTAL

    # Resident weights and the register accumulators (workspace layers start at 0 instead).
    w0 = _load_weight(w0_ptr, D0, D1, P0, P1)
    if (REG_MASK >> 0) & 1:
        dw0 = tl.zeros((P1, P0), tl.float32)
        db0 = tl.zeros((16, P1), tl.float32)
    else:
        _store_partial(ws_row + OFF0, tl.zeros((P1, P0), tl.float32), tl.zeros((16, P1), tl.float32), D0, D1, P0, P1, (BIAS_MASK >> 0) & 1)  # fmt: skip
    if NUM_LAYERS > 1:
        w1 = _load_weight(w1_ptr, D1, D2, P1, P2)
        if (REG_MASK >> 1) & 1:
            dw1 = tl.zeros((P2, P1), tl.float32)
            db1 = tl.zeros((16, P2), tl.float32)
        else:
            _store_partial(ws_row + OFF1, tl.zeros((P2, P1), tl.float32), tl.zeros((16, P2), tl.float32), D1, D2, P1, P2, (BIAS_MASK >> 1) & 1)  # fmt: skip
    if NUM_LAYERS > 2:
        w2 = _load_weight(w2_ptr, D2, D3, P2, P3)
        if (REG_MASK >> 2) & 1:
            dw2 = tl.zeros((P3, P2), tl.float32)
            db2 = tl.zeros((16, P3), tl.float32)
        else:
            _store_partial(ws_row + OFF2, tl.zeros((P3, P2), tl.float32), tl.zeros((16, P3), tl.float32), D2, D3, P2, P3, (BIAS_MASK >> 2) & 1)  # fmt: skip
    if NUM_LAYERS > 3:
        w3 = _load_weight(w3_ptr, D3, D4, P3, P4)
        if (REG_MASK >> 3) & 1:
            dw3 = tl.zeros((P4, P3), tl.float32)
            db3 = tl.zeros((16, P4), tl.float32)
        else:
            _store_partial(ws_row + OFF3, tl.zeros((P4, P3), tl.float32), tl.zeros((16, P4), tl.float32), D3, D4, P3, P4, (BIAS_MASK >> 3) & 1)  # fmt: skip
    if NUM_LAYERS > 4:
        w4 = _load_weight(w4_ptr, D4, D5, P4, P5)
        if (REG_MASK >> 4) & 1:
            dw4 = tl.zeros((P5, P4), tl.float32)
            db4 = tl.zeros((16, P5), tl.float32)
        else:
            _store_partial(ws_row + OFF4, tl.zeros((P5, P4), tl.float32), tl.zeros((16, P5), tl.float32), D4, D5, P4, P5, (BIAS_MASK >> 4) & 1)  # fmt: skip
    if NUM_LAYERS > 5:
        w5 = _load_weight(w5_ptr, D5, D6, P5, P6)
        if (REG_MASK >> 5) & 1:
            dw5 = tl.zeros((P6, P5), tl.float32)
            db5 = tl.zeros((16, P6), tl.float32)
        else:
            _store_partial(ws_row + OFF5, tl.zeros((P6, P5), tl.float32), tl.zeros((16, P6), tl.float32), D5, D6, P5, P6, (BIAS_MASK >> 5) & 1)  # fmt: skip
    if NUM_LAYERS > 6:
        w6 = _load_weight(w6_ptr, D6, D7, P6, P7)
        if (REG_MASK >> 6) & 1:
            dw6 = tl.zeros((P7, P6), tl.float32)
            db6 = tl.zeros((16, P7), tl.float32)
        else:
            _store_partial(ws_row + OFF6, tl.zeros((P7, P6), tl.float32), tl.zeros((16, P7), tl.float32), D6, D7, P6, P7, (BIAS_MASK >> 6) & 1)  # fmt: skip
    if NUM_LAYERS > 7:
        w7 = _load_weight(w7_ptr, D7, D8, P7, P8)
        if (REG_MASK >> 7) & 1:
            dw7 = tl.zeros((P8, P7), tl.float32)
            db7 = tl.zeros((16, P8), tl.float32)
        else:
            _store_partial(ws_row + OFF7, tl.zeros((P8, P7), tl.float32), tl.zeros((16, P8), tl.float32), D7, D8, P7, P8, (BIAS_MASK >> 7) & 1)  # fmt: skip

    offs_gn = tl.arange(0, P_OUT)
    for tile in range(pid, num_tiles, num_programs):
        # No prefetch of the next tile (as the forward does): it would hold a tile in registers
        # across the loop; two programs per SM hide this load's latency instead.
        h0 = _load_rows(x_ptr, tile, M, stride_xm, stride_xk, D0, P0, BLOCK_M)
        # grad_out is first needed after the forward recompute, which hides its latency; rows
        # past M (and padded columns) read as 0, so they add nothing to dW / db.
        offs_m = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        g_ptrs = g_ptr + offs_m[:, None] * stride_gm + offs_gn[None, :].to(tl.int64) * stride_gn
        g_mask = (offs_m[:, None] < M) & (offs_gn[None, :] < D_OUT)
        dzc = tl.load(g_ptrs, mask=g_mask, other=0.0).to(dtype)
        if REG_MASK != (1 << NUM_LAYERS) - 1:
            # The previous tile's workspace stores (or the zero fill) before this tile's loads.
            tl.debug_barrier()
        # ws_row again, but through the loop variable (tile >> 31 is 0): loop-invariant workspace
        # pointer blocks would be hoisted out of the loop and held in registers across it (the
        # 5-layer 64-wide fp16 kernel at BLOCK_M=64 spilled without this).
        ws_tile = ws_row + (tile >> 31)

        # Forward recompute of the hidden layers (the last layer's output is not needed).
        if NUM_LAYERS > 1:
            h1, z1 = _forward_layer(h0, w0, b0_ptr, D1, P1, (BIAS_MASK >> 0) & 1, ACTIVATION, INPUT_PRECISION, DOT_IN_FP32, FAST_ACT)  # fmt: skip
        if NUM_LAYERS > 2:
            h2, z2 = _forward_layer(h1, w1, b1_ptr, D2, P2, (BIAS_MASK >> 1) & 1, ACTIVATION, INPUT_PRECISION, DOT_IN_FP32, FAST_ACT)  # fmt: skip
        if NUM_LAYERS > 3:
            h3, z3 = _forward_layer(h2, w2, b2_ptr, D3, P3, (BIAS_MASK >> 2) & 1, ACTIVATION, INPUT_PRECISION, DOT_IN_FP32, FAST_ACT)  # fmt: skip
        if NUM_LAYERS > 4:
            h4, z4 = _forward_layer(h3, w3, b3_ptr, D4, P4, (BIAS_MASK >> 3) & 1, ACTIVATION, INPUT_PRECISION, DOT_IN_FP32, FAST_ACT)  # fmt: skip
        if NUM_LAYERS > 5:
            h5, z5 = _forward_layer(h4, w4, b4_ptr, D5, P5, (BIAS_MASK >> 4) & 1, ACTIVATION, INPUT_PRECISION, DOT_IN_FP32, FAST_ACT)  # fmt: skip
        if NUM_LAYERS > 6:
            h6, z6 = _forward_layer(h5, w5, b5_ptr, D6, P6, (BIAS_MASK >> 5) & 1, ACTIVATION, INPUT_PRECISION, DOT_IN_FP32, FAST_ACT)  # fmt: skip
        if NUM_LAYERS > 7:
            h7, z7 = _forward_layer(h6, w6, b6_ptr, D7, P7, (BIAS_MASK >> 6) & 1, ACTIVATION, INPUT_PRECISION, DOT_IN_FP32, FAST_ACT)  # fmt: skip

        # Backward, last layer first; dzc holds dZ_{i+1} in the operand dtype on entry to layer i.
        if NUM_LAYERS > 7:
            if (REG_MASK >> 7) & 1:
                dw7, db7 = _grads_into_regs(dzc, h7, dw7, db7, (BIAS_MASK >> 7) & 1, INPUT_PRECISION, DOT_IN_FP32, BLOCK_M)  # fmt: skip
            else:
                _grads_into_workspace(dzc, h7, ws_tile + OFF7, D7, D8, P7, P8, (BIAS_MASK >> 7) & 1, INPUT_PRECISION, DOT_IN_FP32)  # fmt: skip
            dzc = _backprop(dzc, w7, z7, h7, D7, P7, ACTIVATION, INPUT_PRECISION, DOT_IN_FP32, FAST_ACT)  # fmt: skip
        if NUM_LAYERS > 6:
            if (REG_MASK >> 6) & 1:
                dw6, db6 = _grads_into_regs(dzc, h6, dw6, db6, (BIAS_MASK >> 6) & 1, INPUT_PRECISION, DOT_IN_FP32, BLOCK_M)  # fmt: skip
            else:
                _grads_into_workspace(dzc, h6, ws_tile + OFF6, D6, D7, P6, P7, (BIAS_MASK >> 6) & 1, INPUT_PRECISION, DOT_IN_FP32)  # fmt: skip
            dzc = _backprop(dzc, w6, z6, h6, D6, P6, ACTIVATION, INPUT_PRECISION, DOT_IN_FP32, FAST_ACT)  # fmt: skip
        if NUM_LAYERS > 5:
            if (REG_MASK >> 5) & 1:
                dw5, db5 = _grads_into_regs(dzc, h5, dw5, db5, (BIAS_MASK >> 5) & 1, INPUT_PRECISION, DOT_IN_FP32, BLOCK_M)  # fmt: skip
            else:
                _grads_into_workspace(dzc, h5, ws_tile + OFF5, D5, D6, P5, P6, (BIAS_MASK >> 5) & 1, INPUT_PRECISION, DOT_IN_FP32)  # fmt: skip
            dzc = _backprop(dzc, w5, z5, h5, D5, P5, ACTIVATION, INPUT_PRECISION, DOT_IN_FP32, FAST_ACT)  # fmt: skip
        if NUM_LAYERS > 4:
            if (REG_MASK >> 4) & 1:
                dw4, db4 = _grads_into_regs(dzc, h4, dw4, db4, (BIAS_MASK >> 4) & 1, INPUT_PRECISION, DOT_IN_FP32, BLOCK_M)  # fmt: skip
            else:
                _grads_into_workspace(dzc, h4, ws_tile + OFF4, D4, D5, P4, P5, (BIAS_MASK >> 4) & 1, INPUT_PRECISION, DOT_IN_FP32)  # fmt: skip
            dzc = _backprop(dzc, w4, z4, h4, D4, P4, ACTIVATION, INPUT_PRECISION, DOT_IN_FP32, FAST_ACT)  # fmt: skip
        if NUM_LAYERS > 3:
            if (REG_MASK >> 3) & 1:
                dw3, db3 = _grads_into_regs(dzc, h3, dw3, db3, (BIAS_MASK >> 3) & 1, INPUT_PRECISION, DOT_IN_FP32, BLOCK_M)  # fmt: skip
            else:
                _grads_into_workspace(dzc, h3, ws_tile + OFF3, D3, D4, P3, P4, (BIAS_MASK >> 3) & 1, INPUT_PRECISION, DOT_IN_FP32)  # fmt: skip
            dzc = _backprop(dzc, w3, z3, h3, D3, P3, ACTIVATION, INPUT_PRECISION, DOT_IN_FP32, FAST_ACT)  # fmt: skip
        if NUM_LAYERS > 2:
            if (REG_MASK >> 2) & 1:
                dw2, db2 = _grads_into_regs(dzc, h2, dw2, db2, (BIAS_MASK >> 2) & 1, INPUT_PRECISION, DOT_IN_FP32, BLOCK_M)  # fmt: skip
            else:
                _grads_into_workspace(dzc, h2, ws_tile + OFF2, D2, D3, P2, P3, (BIAS_MASK >> 2) & 1, INPUT_PRECISION, DOT_IN_FP32)  # fmt: skip
            dzc = _backprop(dzc, w2, z2, h2, D2, P2, ACTIVATION, INPUT_PRECISION, DOT_IN_FP32, FAST_ACT)  # fmt: skip
        if NUM_LAYERS > 1:
            if (REG_MASK >> 1) & 1:
                dw1, db1 = _grads_into_regs(dzc, h1, dw1, db1, (BIAS_MASK >> 1) & 1, INPUT_PRECISION, DOT_IN_FP32, BLOCK_M)  # fmt: skip
            else:
                _grads_into_workspace(dzc, h1, ws_tile + OFF1, D1, D2, P1, P2, (BIAS_MASK >> 1) & 1, INPUT_PRECISION, DOT_IN_FP32)  # fmt: skip
            dzc = _backprop(dzc, w1, z1, h1, D1, P1, ACTIVATION, INPUT_PRECISION, DOT_IN_FP32, FAST_ACT)  # fmt: skip
        if (REG_MASK >> 0) & 1:
            dw0, db0 = _grads_into_regs(dzc, h0, dw0, db0, (BIAS_MASK >> 0) & 1, INPUT_PRECISION, DOT_IN_FP32, BLOCK_M)  # fmt: skip
        else:
            _grads_into_workspace(dzc, h0, ws_tile + OFF0, D0, D1, P0, P1, (BIAS_MASK >> 0) & 1, INPUT_PRECISION, DOT_IN_FP32)  # fmt: skip
        if NEED_DX:
            if DOT_IN_FP32:
                dx = tl.dot(dzc.to(tl.float32), tl.trans(w0.to(tl.float32)), input_precision=INPUT_PRECISION)  # fmt: skip
            else:
                dx = tl.dot(dzc, tl.trans(w0), input_precision=INPUT_PRECISION)
            offs_k = tl.arange(0, P0)
            dx_ptrs = dx_ptr + offs_m[:, None] * stride_dxm + offs_k[None, :]
            dx_mask = (offs_m[:, None] < M) & (offs_k[None, :] < D0)
            tl.store(dx_ptrs, _round(dx, dx_ptr.dtype.element_ty, DOT_IN_FP32), mask=dx_mask)

    # One partial per program: the register accumulators (workspace layers are already there).
    # REG_MASK has no bits past NUM_LAYERS.
    if (REG_MASK >> 0) & 1:
        _store_partial(ws_row + OFF0, dw0, db0, D0, D1, P0, P1, (BIAS_MASK >> 0) & 1)
    if (REG_MASK >> 1) & 1:
        _store_partial(ws_row + OFF1, dw1, db1, D1, D2, P1, P2, (BIAS_MASK >> 1) & 1)
    if (REG_MASK >> 2) & 1:
        _store_partial(ws_row + OFF2, dw2, db2, D2, D3, P2, P3, (BIAS_MASK >> 2) & 1)
    if (REG_MASK >> 3) & 1:
        _store_partial(ws_row + OFF3, dw3, db3, D3, D4, P3, P4, (BIAS_MASK >> 3) & 1)
    if (REG_MASK >> 4) & 1:
        _store_partial(ws_row + OFF4, dw4, db4, D4, D5, P4, P5, (BIAS_MASK >> 4) & 1)
    if (REG_MASK >> 5) & 1:
        _store_partial(ws_row + OFF5, dw5, db5, D5, D6, P5, P6, (BIAS_MASK >> 5) & 1)
    if (REG_MASK >> 6) & 1:
        _store_partial(ws_row + OFF6, dw6, db6, D6, D7, P6, P7, (BIAS_MASK >> 6) & 1)
    if (REG_MASK >> 7) & 1:
        _store_partial(ws_row + OFF7, dw7, db7, D7, D8, P7, P8, (BIAS_MASK >> 7) & 1)


@triton.jit
def reduce_partials_kernel(
    ws_ptr,  # (P, TOTAL) fp32 partials
    out_ptr,  # (TOTAL,) sums, in out's dtype
    P,
    TOTAL,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EMULATE_RTNE: tl.constexpr,  # see _round
):
    """out[n] = sum_p ws[p, n], fp32, in a fixed order (deterministic)."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < TOTAL
    acc = tl.zeros((BLOCK_P, BLOCK_N), tl.float32)
    for p0 in range(0, P, BLOCK_P):
        offs_p = p0 + tl.arange(0, BLOCK_P)
        ptrs = ws_ptr + offs_p[:, None].to(tl.int64) * TOTAL + offs_n[None, :]
        acc += tl.load(ptrs, mask=(offs_p[:, None] < P) & n_mask[None, :], other=0.0)
    out = _round(tl.sum(acc, axis=0), out_ptr.dtype.element_ty, EMULATE_RTNE)
    tl.store(out_ptr + offs_n, out, mask=n_mask)


# ----------------------------------------------------------------------------- host side
class MlpBackwardConfig(NamedTuple):
    """One launch configuration of fused_mlp_backward_kernel (a tuple: stored choices compare
    equal)."""

    block_m: int  # BLOCK_M: rows per tile
    num_warps: int
    programs_per_sm: int  # persistent programs per SM
    register_budget: int  # fp32 accumulator registers a thread may hold dW / db in


def fused_mlp_backward_configs(dtype: torch.dtype) -> list[MlpBackwardConfig]:
    """Candidate configs, written below as (block_m, num_warps, programs_per_sm,
    register_budget); each new (shape, batch bucket) key compiles and times the ones that fit once.

    Checked by compiling for sm_90a with Triton 3.9's ptxas (CUDA 13.4), 64-64-64-64-64-16:
    - fp16/bf16, relu / gelu / silu: (32, 8, 1, 96) keeps every layer's dW / db in registers
      (mma.sync for the row-tile dots, wgmma for the 64x64 dW dots): 223-247 registers, no
      spills; (32, 4, 2, 24) 192 and (32, 4, 2, 0) 162 registers leave room for two programs
      per SM; (64, 4, 2, 0) and (128, 8, 1, 0) run every dot on wgmma with dW / db in the
      workspace: 255 registers, no spills (a budget > 0 there spills). (16, 8, 1, 96) serves
      batches <= 16. 64x8 (eight 64-wide layers): (32, 8, 1, 96) and (32, 4, 2, 0) ~250, no
      spills; (128, 8, 1, 0) spills ~1 KiB.
    - fp32 (exact, CUDA-core dots, which unroll K): (16, 8, 1, 0) 214 registers, (16, 8, 1, 20)
      234, no spills; BLOCK_M=32 or 4 warps spill ~800 B.
    """
    if dtype == torch.float32:
        return [
            MlpBackwardConfig(block_m=16, num_warps=8, programs_per_sm=1, register_budget=0),
            MlpBackwardConfig(block_m=16, num_warps=8, programs_per_sm=1, register_budget=20),
        ]
    return [
        MlpBackwardConfig(block_m=32, num_warps=8, programs_per_sm=1, register_budget=96),
        MlpBackwardConfig(block_m=32, num_warps=4, programs_per_sm=2, register_budget=24),
        MlpBackwardConfig(block_m=32, num_warps=4, programs_per_sm=2, register_budget=0),
        MlpBackwardConfig(block_m=64, num_warps=4, programs_per_sm=2, register_budget=0),
        MlpBackwardConfig(block_m=128, num_warps=8, programs_per_sm=1, register_budget=0),
        MlpBackwardConfig(block_m=16, num_warps=8, programs_per_sm=1, register_budget=96),
    ]


_INTERPRETER_CONFIG = MlpBackwardConfig(
    block_m=16, num_warps=4, programs_per_sm=1, register_budget=1 << 30
)  # every layer in registers; tests force others

_launcher = KernelLauncher(fused_mlp_backward_kernel)
_reduce_launcher = KernelLauncher(reduce_partials_kernel)
_plans: dict = {}
_best_config: dict = {}
TUNING_LOG: dict = {}  # tuning key -> [(ms, config)], fastest first
FORCE_CONFIG: list = []  # tests / benchmarks: [config] overrides the tuned choice


class _Plan:
    """What one MLP shape needs on the host: kernel constexprs and the flat output layout."""

    def __init__(self, widths, dtype, act, bias_mask):
        reason = fused_mlp_backward_unsupported_reason(widths, dtype)
        if reason is not None:
            raise ValueError(reason)
        self.widths = tuple(widths)
        self.num_layers = n = len(widths) - 1
        d = list(widths) + [widths[-1]] * (MAX_LAYERS + 1 - len(widths))
        p = [_padded(w) for w in d]
        self.padded = p
        self.bias_mask = bias_mask
        # Flat layout (workspace row and output): layer i's dW (D_{i+1}, D_i) then its db.
        offsets, off = [], 0
        for i in range(n):
            offsets.append(off)
            off += widths[i + 1] * widths[i] + (widths[i + 1] if (bias_mask >> i) & 1 else 0)
        self.offsets = offsets
        self.total = off
        # The same layout as split_with_sizes parts: (part index, shape) per weight gradient,
        # part index (or None) per bias gradient.
        self.part_sizes, self.weight_parts, self.bias_parts = [], [], []
        for i in range(n):
            self.weight_parts.append((len(self.part_sizes), (widths[i + 1], widths[i])))
            self.part_sizes.append(widths[i + 1] * widths[i])
            if (bias_mask >> i) & 1:
                self.bias_parts.append(len(self.part_sizes))
                self.part_sizes.append(widths[i + 1])
            else:
                self.bias_parts.append(None)
        self._launch_records: dict = {}
        act = act if n > 1 else ACT_NONE
        self.head = (n, *d, *p, widths[-1], p[n], *offsets, *[0] * (MAX_LAYERS - n), off, bias_mask)  # fmt: skip
        self.tail = (
            act,
            "ieee" if dtype == torch.float32 else "tf32",
            dot_in_fp32(dtype),
            0 if dtype == torch.float32 else 2,
        )

    def reg_mask(self, warps: int, budget: int) -> int:
        """Layers whose dW / db accumulate in registers: largest first, while their fp32
        accumulators (dW plus the 16-row db block) fit ``budget`` registers a thread."""
        threads = 32 * warps
        cost = []
        for i in range(self.num_layers):
            pi, po = self.padded[i], self.padded[i + 1]
            db = 16 * po if (self.bias_mask >> i) & 1 else 0
            cost.append(((pi * po + db + threads - 1) // threads, i))
        mask, used = 0, 0
        for c, i in sorted(cost, key=lambda t: -t[0]):
            if used + c <= budget:
                mask |= 1 << i
                used += c
        return mask


def _candidate_configs(m: int, dtype: torch.dtype) -> list[MlpBackwardConfig]:
    configs = fused_mlp_backward_configs(dtype)
    limit = max(16, pow2_bucket(m))
    fitting = [c for c in configs if c[0] <= limit]
    return fitting or [min(configs, key=lambda c: c[0])]


def fused_mlp_backward(
    x2d: torch.Tensor,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None],
    activation: str,
    grad_out2d: torch.Tensor,
    need_input_grad: bool = True,
) -> tuple[torch.Tensor | None, list[torch.Tensor], list[torch.Tensor | None]]:
    """Gradients of y = L_n(act(... act(L_1(x2d)))) (L_i(h) = h @ weights[i].T + biases[i]) for
    the output gradient ``grad_out2d``: (grad_x or None, grad_weights, grad_biases).

    x2d (M, in) and grad_out2d (M, out) with any strides; weights[i] (out_i, in_i), biases[i]
    (out_i,) or None; one dtype among fp32/fp16/bf16; ``fused_mlp_backward_unsupported_reason``
    is None for the widths. ``activation``: "relu", "gelu" / "gelu_tanh", "gelu_erf", "silu" or
    "none", after every layer but the last. grad_x is a new contiguous tensor; the weight and
    bias gradients are contiguous views of one new buffer, in the weights' dtype.

    On a GPU the first call of a (shape, batch bucket) times the candidate configs; if none
    compiles for the device, bench_configs raises RuntimeError (the caller may fall back).
    """
    dtype = x2d.dtype
    device = x2d.device
    num_layers = len(weights)
    widths = (x2d.shape[1], *[w.shape[0] for w in weights])
    bias_mask = 0
    for i, b in enumerate(biases):
        if b is not None:
            bias_mask |= 1 << i
    plan_key = (widths, dtype, activation, bias_mask)
    plan = _plans.get(plan_key)
    if plan is None:
        plan = _plans[plan_key] = _Plan(list(widths), dtype, activation_id(activation), bias_mask)
    M = x2d.shape[0]
    if tuple(grad_out2d.shape) != (M, widths[-1]):
        raise ValueError(
            f"grad_out2d must have shape {(M, widths[-1])}, got {tuple(grad_out2d.shape)}"
        )

    flat = _alloc.empty((plan.total,), dtype, device)
    # One split into views (a slice per gradient costs a dispatcher call each).
    parts = flat.split_with_sizes(plan.part_sizes)
    grad_w = [parts[j].view(shape) for j, shape in plan.weight_parts]
    grad_b = [None if j is None else parts[j] for j in plan.bias_parts]
    grad_x = _alloc.empty((M, widths[0]), dtype, device) if need_input_grad else None
    if M == 0:
        flat.zero_()
        return grad_x, grad_w, grad_b

    ws_ = [w if w.is_contiguous() else w.contiguous() for w in weights]
    bs = [x2d if b is None else (b if b.stride(0) == 1 else b.contiguous()) for b in biases]
    pad = [x2d] * (MAX_LAYERS - num_layers)
    if grad_out2d.dtype != dtype:
        grad_out2d = grad_out2d.to(dtype)
    dx = grad_x if grad_x is not None else x2d  # never written when need_input_grad is False
    strides = (*x2d.stride(), *grad_out2d.stride(), dx.stride(0))
    spec = (
        dtype, M > 0x7FFFFFFF, need_input_grad, *[int_spec(s) for s in strides],
        ptr_spec(x2d), ptr_spec(grad_out2d), ptr_spec(dx),
        *[ptr_spec(w) for w in ws_], *[ptr_spec(b) for b in bs],
    )  # fmt: skip
    args = (x2d, grad_out2d, dx, ws_, bs, pad, M, strides)

    if FORCE_CONFIG:
        cfg = FORCE_CONFIG[0]
    elif interpreting():
        cfg = _INTERPRETER_CONFIG
    else:
        tune_key = (device, plan_key, _m_bucket(M), spec)
        cfg = _best_config.get(tune_key)
        if cfg is None:
            # One persistent record per problem class (dualk/dispatch/autotune.py's cache file): a later
            # process reuses it instead of compiling and timing every config again.
            class_key = "|".join(str(v) for v in (plan_key, _m_bucket(M), *spec[:3]))
            candidates = _candidate_configs(M, dtype)
            cfg, timings, keep = tuned_config(
                x2d.device, "fused_mlp_backward", class_key, candidates,
                lambda cfg: _launch(cfg, plan, spec, need_input_grad, flat, *args),
                set(fused_mlp_backward_configs(dtype)),
            )  # fmt: skip
            if keep:
                TUNING_LOG[tune_key] = timings
                _best_config[tune_key] = cfg
    _launch(cfg, plan, spec, need_input_grad, flat, *args)
    return grad_x, grad_w, grad_b


def _launch(cfg, plan, spec, need_dx, flat, x2d, g, dx, ws_, bs, pad, M, strides):
    block_m, warps, per_sm, budget = cfg
    device = x2d.device
    # Per (config, specialization): the constexprs and the launcher's cache key, built once.
    record = plan._launch_records.get((cfg, spec, need_dx))
    if record is None:
        reg_mask = plan.reg_mask(warps, budget)
        consts = (*plan.head, reg_mask, *plan.tail, need_dx, block_m)
        key = (cfg, spec, plan.head, plan.tail, reg_mask)
        record = plan._launch_records[(cfg, spec, need_dx)] = (consts, key)
    consts, key = record
    tiles = (M + block_m - 1) // block_m
    programs = max(1, min(tiles, num_sms(device) * per_sm))
    workspace = _alloc.empty((programs, plan.total), torch.float32, device)
    args = (x2d, g, dx, workspace, *ws_, *pad, *bs, *pad, M, *strides, *consts)
    _launcher.launch((key, ptr_spec(workspace)), (programs, 1, 1), args, warps, 1)
    block_p, block_n = 32, 128
    _reduce_launcher.launch(
        (flat.dtype, block_p, block_n, int_spec(programs), int_spec(plan.total), ptr_spec(flat)),
        (cdiv(plan.total, block_n), 1, 1),
        (workspace, flat, programs, plan.total, block_p, block_n, dot_in_fp32(flat.dtype)),
        4,
        1,
    )
