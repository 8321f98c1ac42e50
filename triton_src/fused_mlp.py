"""fused_mlp: a whole Linear/activation stack (1 to 8 layers) in one kernel launch.

Each program loads every layer's weights once (padded to powers of two >= 16, zero-filled), then
walks row tiles of the input in a persistent loop; a tile's activations stay on chip from the
first layer to the last, so HBM sees only the input and the output. fp16/bf16 layers run on
tensor cores with fp32 accumulation; fp32 layers use exact fp32 dots (input_precision="ieee").
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
    KernelLauncher,
    activation_id,
    apply_activation,
    dot_in_fp32,
    int_spec,
    interpreting,
    num_sms,
    pow2_bucket,
    ptr_spec,
    tuned_config,
)

MAX_LAYERS = 8
# Largest padded width of one layer: a (BLOCK_M, 256) fp32 tile is already 64 registers a thread
# at BLOCK_M=64 with 4 warps.
MAX_PADDED_WIDTH = 256
# Padded weights (and biases) of all layers stay resident in shared memory for the whole
# persistent loop; leave room on a 228 KiB Hopper SM (227 KiB per block) for the input tile.
MAX_RESIDENT_WEIGHT_BYTES = 160 * 1024


def _padded(width: int) -> int:
    """Width as the kernel holds it: a power of two, at least 16 (tl.dot's smallest K and N)."""
    return max(16, pow2_bucket(width))


def fit_reason(
    op: str,
    widths: Sequence[int],
    dtype: torch.dtype,
    width_limit: int,
    width_why: str,
    byte_limit: int,
    bytes_why: str,
    weight_copies: int = 1,
) -> str | None:
    """Why the one-kernel MLP ``op`` (the forward here, the backward in fused_mlp_backward.py)
    cannot run these widths ([in, hidden..., out]) and dtype, or None: 1..MAX_LAYERS layers, a
    supported dtype, every padded width <= width_limit (registers), the padded weights (times
    weight_copies layouts) <= byte_limit bytes (shared memory)."""
    widths = list(widths)
    layers = len(widths) - 1
    if not 1 <= layers <= MAX_LAYERS:
        return f"{op} runs 1 to {MAX_LAYERS} layers in one kernel, got {layers}"
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return f"{op} supports float32, float16 and bfloat16, got {dtype}"
    if min(widths) < 1:
        return f"{op} needs every width >= 1, got widths {widths}"
    padded = [_padded(w) for w in widths]
    if max(padded) > width_limit:
        return f"width {max(widths)} pads to {max(padded)} > {width_limit}{width_why}"
    element = torch.empty((), dtype=dtype).element_size()
    weight_bytes = sum(padded[i] * padded[i + 1] * element for i in range(layers)) * weight_copies
    if weight_bytes > byte_limit:
        return (
            f"padded weights take {weight_bytes // 1024} KiB{bytes_why.format(byte_limit // 1024)}"
        )
    return None


def fused_mlp_unsupported_reason(widths: Sequence[int], dtype: torch.dtype) -> str | None:
    """None when ``fused_mlp`` can run the MLP with these widths ([in, hidden..., out]) and dtype
    in one kernel, else why not (dualk then runs a per-layer chain)."""
    return fit_reason(
        "fused_mlp", widths, dtype,
        MAX_PADDED_WIDTH, ": one row tile of activations would not fit in registers",
        MAX_RESIDENT_WEIGHT_BYTES, " > {} KiB that fit on chip with a row tile",
    )  # fmt: skip


@triton.jit
def _load_weight(
    w_ptr,  # (D_OUT, D_IN) row-major weight
    D_IN: tl.constexpr,
    D_OUT: tl.constexpr,
    P_IN: tl.constexpr,  # padded widths
    P_OUT: tl.constexpr,
):
    """W^T as a zero-padded (P_IN, P_OUT) block, ready as tl.dot's right operand."""
    offs_k = tl.arange(0, P_IN)
    offs_n = tl.arange(0, P_OUT)
    w_mask = (offs_k[:, None] < D_IN) & (offs_n[None, :] < D_OUT)
    return tl.load(w_ptr + offs_n[None, :] * D_IN + offs_k[:, None], mask=w_mask, other=0.0)


@triton.jit
def _load_rows(
    x_ptr,
    tile,  # row tile index; rows past M (and columns past D0) read as 0
    M,
    stride_xm,
    stride_xk,
    D0: tl.constexpr,
    P0: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """Input rows [tile * BLOCK_M, (tile + 1) * BLOCK_M) as a zero-padded (BLOCK_M, P0) block."""
    # int64 rows: row * stride_xm can pass 2^31 at large batch (tile * BLOCK_M itself stays
    # below M + 2 * BLOCK_M * num_programs, within M's own type).
    offs_m = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_k = tl.arange(0, P0)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :].to(tl.int64) * stride_xk
    mask = (offs_m[:, None] < M) & (offs_k[None, :] < D0)
    return tl.load(x_ptrs, mask=mask, other=0.0)


@triton.jit
def _apply_layer(
    h,  # (BLOCK_M, P_IN) activations in the operand dtype
    w_t,  # (P_IN, P_OUT) from _load_weight
    b_ptr,  # (D_OUT,) bias; not read when HAS_BIAS is False
    D_OUT: tl.constexpr,
    P_OUT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,  # common.ACT_* id
    IS_LAST: tl.constexpr,  # the last layer has no activation
    INPUT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,  # interpreter only, see common.dot_in_fp32
    FAST_ACT: tl.constexpr,  # cheap exp/division in the activation (fp16/bf16)
):
    """act(h @ w_t + bias) in fp32, padded columns forced to 0 (their weights and bias are 0, but
    inf * 0 is NaN)."""
    if DOT_IN_FP32:
        h = h.to(tl.float32)
        w_t = w_t.to(tl.float32)
    acc = tl.dot(h, w_t, input_precision=INPUT_PRECISION)
    if HAS_BIAS:
        # Loaded per tile (an L1 hit) rather than hoisted with the weights: a hoisted bias is
        # held in registers in the MMA layout across the loop (+40 registers a thread at width
        # 128, enough to spill the 128-wide MLP on sm_90).
        offs_n = tl.arange(0, P_OUT)
        bias = tl.load(b_ptr + offs_n, mask=offs_n < D_OUT, other=0.0).to(tl.float32)
        acc += bias[None, :]
    if not IS_LAST:
        acc = apply_activation(acc, ACTIVATION, FAST_ACT)
        if P_OUT != D_OUT:
            # Padded columns must stay exactly 0 for the next layer: an inf input makes them
            # inf * 0 = NaN, which the next dot would spread over the whole row.
            offs_out = tl.arange(0, P_OUT)
            acc = tl.where(offs_out[None, :] < D_OUT, acc, 0.0)
    return acc


@triton.jit(do_not_specialize=["M"])
def fused_mlp_kernel(
    # Pointers: input x (M, D0), output (M, D_last); weights w_i (D_{i+1}, D_i) row-major, and
    # biases b_i (D_{i+1},). Entries past NUM_LAYERS (or without a bias) are never read.
    x_ptr,
    out_ptr,
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
    # Sizes: M (rows) is not specialized, so every batch size shares one compiled kernel.
    M,
    # Strides in elements.
    stride_xm,
    stride_xk,
    stride_om,
    # Meta-parameters: layer count, widths D_i and their padded powers of two P_i.
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
    D_OUT: tl.constexpr,  # D_{NUM_LAYERS}
    P_OUT: tl.constexpr,  # P_{NUM_LAYERS}
    BIAS_MASK: tl.constexpr,  # bit i set: layer i has a bias
    ACTIVATION: tl.constexpr,  # common.ACT_* id, after every layer but the last
    INPUT_PRECISION: tl.constexpr,  # "ieee" for fp32, "tf32" (ignored) for fp16/bf16
    DOT_IN_FP32: tl.constexpr,  # interpreter only, see common.dot_in_fp32
    FAST_ACT: tl.constexpr,  # fp16/bf16: cheap exp/division in the activation
    BLOCK_M: tl.constexpr,  # rows per tile
):
    dtype = x_ptr.dtype.element_ty

    # Weights first, once per program: the persistent loop below reuses them for every tile.
    w0 = _load_weight(w0_ptr, D0, D1, P0, P1)
    if NUM_LAYERS > 1:
        w1 = _load_weight(w1_ptr, D1, D2, P1, P2)
    if NUM_LAYERS > 2:
        w2 = _load_weight(w2_ptr, D2, D3, P2, P3)
    if NUM_LAYERS > 3:
        w3 = _load_weight(w3_ptr, D3, D4, P3, P4)
    if NUM_LAYERS > 4:
        w4 = _load_weight(w4_ptr, D4, D5, P4, P5)
    if NUM_LAYERS > 5:
        w5 = _load_weight(w5_ptr, D5, D6, P5, P6)
    if NUM_LAYERS > 6:
        w6 = _load_weight(w6_ptr, D6, D7, P6, P7)
    if NUM_LAYERS > 7:
        w7 = _load_weight(w7_ptr, D7, D8, P7, P8)

    # Persistent loop over row tiles. The next tile's input is loaded before this tile's layers
    # run, so its global-load latency hides behind the MMAs (Triton's own pipeliner did not
    # turn this load into cp.async for fp16 on sm_90: checked in the TTGIR of Triton 3.9).
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    num_tiles = tl.cdiv(M, BLOCK_M)
    h_next = _load_rows(x_ptr, pid, M, stride_xm, stride_xk, D0, P0, BLOCK_M)
    for tile in range(pid, num_tiles, num_programs):
        h = h_next
        h_next = _load_rows(x_ptr, tile + num_programs, M, stride_xm, stride_xk, D0, P0, BLOCK_M)

        # Layer i: a static branch per layer, unrolled at compile time; h feeds the next dot
        # in the operand dtype, as the eager per-layer chain would.
        acc = _apply_layer(
            h, w0, b0_ptr, D1, P1, (BIAS_MASK >> 0) & 1, ACTIVATION, NUM_LAYERS == 1,
            INPUT_PRECISION, DOT_IN_FP32, FAST_ACT,
        )  # fmt: skip
        if NUM_LAYERS > 1:
            acc = _apply_layer(
                acc.to(dtype), w1, b1_ptr, D2, P2, (BIAS_MASK >> 1) & 1, ACTIVATION,
                NUM_LAYERS == 2, INPUT_PRECISION, DOT_IN_FP32, FAST_ACT,
            )  # fmt: skip
        if NUM_LAYERS > 2:
            acc = _apply_layer(
                acc.to(dtype), w2, b2_ptr, D3, P3, (BIAS_MASK >> 2) & 1, ACTIVATION,
                NUM_LAYERS == 3, INPUT_PRECISION, DOT_IN_FP32, FAST_ACT,
            )  # fmt: skip
        if NUM_LAYERS > 3:
            acc = _apply_layer(
                acc.to(dtype), w3, b3_ptr, D4, P4, (BIAS_MASK >> 3) & 1, ACTIVATION,
                NUM_LAYERS == 4, INPUT_PRECISION, DOT_IN_FP32, FAST_ACT,
            )  # fmt: skip
        if NUM_LAYERS > 4:
            acc = _apply_layer(
                acc.to(dtype), w4, b4_ptr, D5, P5, (BIAS_MASK >> 4) & 1, ACTIVATION,
                NUM_LAYERS == 5, INPUT_PRECISION, DOT_IN_FP32, FAST_ACT,
            )  # fmt: skip
        if NUM_LAYERS > 5:
            acc = _apply_layer(
                acc.to(dtype), w5, b5_ptr, D6, P6, (BIAS_MASK >> 5) & 1, ACTIVATION,
                NUM_LAYERS == 6, INPUT_PRECISION, DOT_IN_FP32, FAST_ACT,
            )  # fmt: skip
        if NUM_LAYERS > 6:
            acc = _apply_layer(
                acc.to(dtype), w6, b6_ptr, D7, P7, (BIAS_MASK >> 6) & 1, ACTIVATION,
                NUM_LAYERS == 7, INPUT_PRECISION, DOT_IN_FP32, FAST_ACT,
            )  # fmt: skip
        if NUM_LAYERS > 7:
            acc = _apply_layer(
                acc.to(dtype), w7, b7_ptr, D8, P8, (BIAS_MASK >> 7) & 1, ACTIVATION,
                NUM_LAYERS == 8, INPUT_PRECISION, DOT_IN_FP32, FAST_ACT,
            )  # fmt: skip

        offs_m = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        offs_out = tl.arange(0, P_OUT)
        out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_out[None, :]
        out_mask = (offs_m[:, None] < M) & (offs_out[None, :] < D_OUT)
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)


class MlpConfig(NamedTuple):
    """One launch configuration of fused_mlp_kernel (a tuple: stored choices compare equal)."""

    block_m: int  # BLOCK_M: rows per tile
    num_warps: int
    programs_per_sm: int  # persistent programs per SM


def fused_mlp_configs() -> list[MlpConfig]:
    """Candidate configs for ``fused_mlp_kernel``; each new
    (widths, biases, activation, dtype, batch bucket) key times the fitting ones once and keeps
    the fastest (a coarse batch bucket, not the batch size: every batch size of a bucket reuses
    the choice and the compiled kernel).

    Small BLOCK_M and several programs per SM keep more row tiles in flight to hide the
    dependent layer chain; the kernel prefetches the next input tile by hand (num_stages=1).
    """
    return [
        # fp16/bf16 (wgmma on Hopper). Checked by compiling for sm_90 with Triton 3.9's ptxas:
        # 64-64-64-64-16 uses 128-203 registers and 35-59 KiB smem, no spills; 128-wide layers
        # spill at 4 warps for BLOCK_M >= 128 (the 8-warp configs use 214 registers, no spills).
        MlpConfig(block_m=128, num_warps=8, programs_per_sm=1),
        MlpConfig(block_m=128, num_warps=8, programs_per_sm=2),
        MlpConfig(block_m=64, num_warps=4, programs_per_sm=2),
        MlpConfig(block_m=64, num_warps=4, programs_per_sm=4),
        MlpConfig(block_m=64, num_warps=4, programs_per_sm=6),
        MlpConfig(block_m=64, num_warps=4, programs_per_sm=8),
        MlpConfig(block_m=128, num_warps=8, programs_per_sm=3),
        MlpConfig(block_m=128, num_warps=4, programs_per_sm=2),
        MlpConfig(block_m=128, num_warps=4, programs_per_sm=3),
        MlpConfig(block_m=256, num_warps=8, programs_per_sm=1),
        MlpConfig(block_m=256, num_warps=8, programs_per_sm=2),
        MlpConfig(block_m=64, num_warps=8, programs_per_sm=2),
        # fp32 (exact, CUDA-core dots; also the small-batch picks): the FMA dot unrolls the
        # whole K, so small row tiles and 8 warps: seed model 100-128-64-10 at BLOCK_M=16 uses
        # 80 registers, no spills; at BLOCK_M=32 it spills ~600 B a thread.
        MlpConfig(block_m=16, num_warps=8, programs_per_sm=4),
        MlpConfig(block_m=32, num_warps=8, programs_per_sm=4),
        MlpConfig(block_m=16, num_warps=4, programs_per_sm=4),
    ]


# Candidates per class (at most 5, so a class's first call compiles a bounded set), each a
# subset of fused_mlp_configs() with its best general choice first (used untimed under capture).
# Winners on an H200 (the Triton tuning logs, experiments/NOTES-triton.md), as (block_m,
# num_warps, programs_per_sm): fp32 seed model (16, 4, 4); 16-bit 64 wide at batch 2^20
# (64, 4, 8) then (64, 4, 4), (128, 8, 2); 128 wide (128, 8, 3), (128, 8, 1/2). Batches <= 64 are one tile: programs per SM do not matter there.
# Wider than 128 (not measured): 64-row tiles or 128 rows with 8 warps keep the (BLOCK_M, 256)
# fp32 accumulator within registers.
_CLASS_CONFIGS = {
    "fp32": (
        MlpConfig(block_m=16, num_warps=4, programs_per_sm=4),
        MlpConfig(block_m=16, num_warps=8, programs_per_sm=4),
        MlpConfig(block_m=32, num_warps=8, programs_per_sm=4),
    ),
    "small_batch": (
        MlpConfig(block_m=16, num_warps=4, programs_per_sm=4),
        MlpConfig(block_m=16, num_warps=8, programs_per_sm=4),
        MlpConfig(block_m=32, num_warps=8, programs_per_sm=4),
        MlpConfig(block_m=64, num_warps=4, programs_per_sm=2),
        MlpConfig(block_m=64, num_warps=8, programs_per_sm=2),
    ),
    "w64": (
        MlpConfig(block_m=64, num_warps=4, programs_per_sm=8),
        MlpConfig(block_m=64, num_warps=4, programs_per_sm=4),
        MlpConfig(block_m=128, num_warps=8, programs_per_sm=2),
        MlpConfig(block_m=64, num_warps=4, programs_per_sm=6),
        MlpConfig(block_m=128, num_warps=8, programs_per_sm=3),
    ),
    "w128": (
        MlpConfig(block_m=128, num_warps=8, programs_per_sm=3),
        MlpConfig(block_m=128, num_warps=8, programs_per_sm=2),
        MlpConfig(block_m=128, num_warps=8, programs_per_sm=1),
        MlpConfig(block_m=64, num_warps=4, programs_per_sm=4),
        MlpConfig(block_m=64, num_warps=4, programs_per_sm=2),
    ),
    "w256": (
        MlpConfig(block_m=64, num_warps=4, programs_per_sm=2),
        MlpConfig(block_m=64, num_warps=4, programs_per_sm=4),
        MlpConfig(block_m=64, num_warps=8, programs_per_sm=2),
        MlpConfig(block_m=128, num_warps=8, programs_per_sm=1),
        MlpConfig(block_m=128, num_warps=8, programs_per_sm=2),
    ),
}


def _candidate_configs(m: int, dtype: torch.dtype, widths=None) -> list[MlpConfig]:
    """fp32: only BLOCK_M <= 32 (larger tiles spill heavily on the FMA path). 16-bit: by the
    widest layer (``widths``; None: every config), or the small-tile set for batches <= 64.
    BLOCK_M past the batch only pads; keep the tiles that do not exceed it."""
    if dtype == torch.float32:
        configs = list(_CLASS_CONFIGS["fp32"])
    elif m <= 64:
        configs = list(_CLASS_CONFIGS["small_batch"])
    elif widths is None:
        configs = fused_mlp_configs()
    else:
        widest = max(_padded(w) for w in widths)
        configs = list(
            _CLASS_CONFIGS["w64" if widest <= 64 else "w128" if widest <= 128 else "w256"]
        )
    limit = max(16, pow2_bucket(m))
    fitting = [c for c in configs if c[0] <= limit]
    return fitting or [min(configs, key=lambda c: c[0])]


# Interpreter: one config; BLOCK_M=16 with 4 "SMs" gives several tiles per program on test
# batches, so the persistent loop is exercised.
_INTERPRETER_CONFIG = MlpConfig(block_m=16, num_warps=4, programs_per_sm=1)

_launcher = KernelLauncher(fused_mlp_kernel)
_plans: dict = {}  # (widths, dtype, activation, bias pattern) -> constexpr tuple
_best_config: dict = {}  # (plan key, batch bucket, alignment) -> config
TUNING_LOG: dict = {}  # tuning key -> [(ms, config)], fastest first (for benchmarks)
FORCE_CONFIG: list = []  # benchmarks: [config] overrides the tuned choice when set


def _m_bucket(m: int) -> int:
    """Coarse batch class for the tuning key: <=64, <=1024, <=16384, <=262144, larger."""
    for bucket, limit in enumerate((64, 1024, 16384, 262144)):
        if m <= limit:
            return bucket
    return 4


def _plan(widths, dtype, act, bias_mask):
    """The kernel's constexprs (all but BLOCK_M) for one MLP shape; raises ValueError for
    unsupported shapes."""
    reason = fused_mlp_unsupported_reason(widths, dtype)
    if reason is not None:
        raise ValueError(reason)
    num_layers = len(widths) - 1
    d = list(widths) + [widths[-1]] * (MAX_LAYERS + 1 - len(widths))
    p = [_padded(w) for w in d]
    return (
        num_layers, *d, *p, widths[-1], _padded(widths[-1]), bias_mask,
        act if num_layers > 1 else ACT_NONE, "ieee" if dtype == torch.float32 else "tf32",
        dot_in_fp32(dtype), 0 if dtype == torch.float32 else 2,
    )  # fmt: skip


def fused_mlp(
    x2d: torch.Tensor,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None],
    *,
    activation: str,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The MLP y = L_n(act(... act(L_1(x2d)))) with L_i(h) = h @ weights[i].T + biases[i], in one
    kernel launch; returns a new contiguous (M, weights[-1].shape[0]) tensor of x2d's dtype, or
    ``out`` (such a tensor) written.

    x2d (M, in) with any strides; weights[i] (out_i, in_i) in nn.Linear layout, biases[i]
    (out_i,) or None; 1 to 8 layers; one dtype among fp32/fp16/bf16 (validated by dualk, and
    ``fused_mlp_unsupported_reason`` is None for these widths). ``activation``: "relu", "gelu"
    (tanh approximation), "silu" or "none", applied after every layer but the last.
    """
    dtype = x2d.dtype
    num_layers = len(weights)
    widths = (x2d.shape[1], *[w.shape[0] for w in weights])
    bias_mask = 0
    for i, b in enumerate(biases):
        if b is not None:
            bias_mask |= 1 << i
    plan_key = (widths, dtype, activation, bias_mask)
    consts = _plans.get(plan_key)
    if consts is None:
        consts = _plans[plan_key] = _plan(list(widths), dtype, activation_id(activation), bias_mask)
    M = x2d.shape[0]
    if out is None:
        out = _alloc.empty((M, widths[-1]), dtype, x2d.device)  # NaN under DUALK_POISON
    if M == 0:
        return out

    # The kernel indexes weights with constexpr row stride D_in and biases with unit stride;
    # .contiguous() is free (and skipped) for nn.Linear parameters.
    ws = [w if w.is_contiguous() else w.contiguous() for w in weights]
    bs = [x2d if b is None else (b if b.stride(0) == 1 else b.contiguous()) for b in biases]
    pad = [x2d] * (MAX_LAYERS - num_layers)
    sxm, sxk = x2d.stride()
    som = out.stride(0)
    # The dtype is part of the key: fp16 and bf16 share every other constexpr.
    spec = (
        dtype, M > 0x7FFFFFFF,  # M is not specialized, but its width (i32 / i64) is
        int_spec(sxm), int_spec(sxk), int_spec(som), ptr_spec(x2d), ptr_spec(out),
        *[ptr_spec(w) for w in ws], *[ptr_spec(b) for b in bs],
    )  # fmt: skip
    if interpreting():
        cfg = _INTERPRETER_CONFIG
    elif FORCE_CONFIG:
        cfg = FORCE_CONFIG[0]
    else:
        tune_key = (x2d.device, plan_key, _m_bucket(M), spec)
        cfg = _best_config.get(tune_key)
        if cfg is None:
            # The persistent class: the tuning key without the device (the cache file is per GPU).
            class_key = "|".join(
                str(v) for v in (widths, str(dtype)[6:], activation, bias_mask, _m_bucket(M),
                                 *spec[1:])
            )  # fmt: skip
            cfg, timings, keep = tuned_config(
                x2d.device, "fused_mlp", class_key, _candidate_configs(M, dtype, widths),
                lambda cfg: _launch(cfg, spec, consts, x2d, out, ws, bs, pad, M, sxm, sxk, som),
                set(fused_mlp_configs()),
            )  # fmt: skip
            if keep:
                TUNING_LOG[tune_key] = timings
                _best_config[tune_key] = cfg
    _launch(cfg, spec, consts, x2d, out, ws, bs, pad, M, sxm, sxk, som)
    return out


def _launch(cfg, spec, consts, x2d, out, ws, bs, pad, M, sxm, sxk, som):
    block_m, warps, per_sm = cfg
    tiles = (M + block_m - 1) // block_m
    programs = max(1, min(tiles, num_sms(x2d.device) * per_sm))
    args = (x2d, out, *ws, *pad, *bs, *pad, M, sxm, sxk, som, *consts, block_m)
    _launcher.launch((cfg, spec, consts), (programs, 1, 1), args, warps, 1)
