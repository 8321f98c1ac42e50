"""Tiled GEMM core shared by matmul and linear_gelu: C[b] = act(A[b] @ B[b] + bias).

One kernel, ``gemm_kernel``: grouped tile ordering, batch folded into program axis 0, any strides
for A, B and C (transposed and sliced views run natively), masked M/N/K tails, and a bias +
activation epilogue applied to the fp32 accumulator before the down-cast. Large fp16/bf16
problems on Hopper also time the TMA kernel of triton_src/gemm_tma.py among the candidates.
Few output tiles with a long k take split-K instead (``split_k_plan``): gemm_kernel computes
fp32 partial products of k slices, and ``split_k_reduce_kernel`` sums them and runs the epilogue.
The fewest tiles (16-bit, M and N <= 128, see ``one_launch_plan``) do both in one launch,
``split_k_fixup_kernel``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from dualk.core import alloc as _alloc

from .common import (
    ACT_NONE,
    KernelLauncher,
    align_mask,
    apply_activation,
    cdiv,
    dot_in_fp32,
    grouped_tile,
    int_spec,
    interpreting,
    num_sms,
    pow2_bucket,
    ptr_spec,
    tuned_config,
)
from .gemm_tma import launch_tma, tma_configs


@triton.jit
def split_tf32(x):
    """x = hi + lo for 3xTF32: hi is x rounded to TF32 (nearest, ties away, as cvt.rna.tf32),
    clamped to +-MAX_TF32 (0x7F7FE000) where cvt.rna would round a finite |x| >= 3.4011e38
    into inf; lo = x - hi, exact, left for the tensor core to truncate to TF32.

    The clamp also turns +-inf into hi = +-MAX_TF32 and lo = +-inf, and the rounding add is
    unguarded (a NaN's hi may become anything, but its lo = x - hi is NaN): finite inputs near
    the fp32 maximum stay finite, and every inf or NaN input makes a non-finite sum. Its value
    may still be wrong (MAX_TF32 times a negative remainder overflows to -inf beside lo * b_hi's
    +inf: NaN), so gemm_kernel sums a tile with any non-finite value again with exact fp32 FMAs.
    Four instructions (IADD, LOP3, two FMNMX) and the FADD: Triton's own "tf32x3" (cvt.rna,
    NaNs dropped from the small products) was 4-8% slower on an H200 and turns FLT_MAX into inf
    (experiments/triton_fp32_tf32x3.py)."""
    hi = ((x.to(tl.int32, bitcast=True) + 0x1000) & -8192).to(tl.float32, bitcast=True)
    hi = tl.minimum(tl.maximum(hi, -3.4011621342146535e38), 3.4011621342146535e38)
    return hi, x - hi


@triton.jit
def accumulate_dot(accumulator, a, b, INPUT_PRECISION: tl.constexpr):
    """accumulator + a @ b. Exact fp32 ("ieee") runs on CUDA cores as one FMA chain per output
    when the accumulator is passed into tl.dot; summing each K block apart and then adding keeps
    the rounding error growing with K / BLOCK_SIZE_K rather than K (the chained form was 3x
    cuBLAS's error at K=320 on an H200). fp32 as "tf32x3" (FP32_INPUT_PRECISION): three TF32
    tensor-core products of split_tf32's parts, the small ones first, one block's sum added to
    the accumulator. Tensor-core dtypes keep the chained form (no extra adds)."""
    if INPUT_PRECISION == "tf32x3":  # fp32 as 3xTF32: lo*hi + hi*lo + hi*hi
        a_hi, a_lo = split_tf32(a)
        b_hi, b_lo = split_tf32(b)
        block = tl.dot(a_lo, b_hi, input_precision="tf32")
        block = tl.dot(a_hi, b_lo, block, input_precision="tf32")
        accumulator += tl.dot(a_hi, b_hi, block, input_precision="tf32")
    elif INPUT_PRECISION == "ieee":
        if a.dtype == tl.float32:
            accumulator += tl.dot(a, b, input_precision=INPUT_PRECISION)
        else:
            accumulator = tl.dot(a, b, accumulator, input_precision=INPUT_PRECISION)
    else:
        accumulator = tl.dot(a, b, accumulator, input_precision=INPUT_PRECISION)
    return accumulator


@triton.jit
def hinted(value, ALIGN: tl.constexpr, FLAGGED: tl.constexpr):
    """`value` rebuilt as value // ALIGN * ALIGN when the host flagged it (common.align_mask: a
    multiple of 16 bytes that Triton's own specialization misses), so the divisibility analysis
    sees it; else `value` itself (a unit stride stays a constexpr)."""
    if FLAGGED:
        return value // ALIGN * ALIGN
    else:
        return value


@triton.jit
def k_loop(
    a_ptrs, b_ptrs, a_row_ok, b_col_ok, offs_k, K, stride_ak, stride_bk,
    INPUT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    STAGES: tl.constexpr,
):  # fmt: skip
    """gemm_kernel's (and split_k_fixup_kernel's) sum over k of one tile, from the tile's first
    A and B pointers: the fp32 accumulator of A[rows, :K] @ B[:K, cols] (rows past M and
    columns past N read as 0).
    STAGES: the loop's software-pipeline depth (None: the launch's num_stages)."""
    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_SIZE_K), num_stages=STAGES):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=a_row_ok, other=0.0)
            b = tl.load(b_ptrs, mask=b_col_ok, other=0.0)
        else:
            k_left = K - k * BLOCK_SIZE_K
            a = tl.load(a_ptrs, mask=a_row_ok & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=b_col_ok & (offs_k[:, None] < k_left), other=0.0)
        if DOT_IN_FP32:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        accumulator = accumulate_dot(accumulator, a, b, INPUT_PRECISION)
        a_ptrs += BLOCK_SIZE_K * tl.cast(stride_ak, tl.int64)  # a stride of 1 is a constexpr
        b_ptrs += BLOCK_SIZE_K * tl.cast(stride_bk, tl.int64)
    return accumulator


@triton.jit
def gemm_kernel(
    # Pointers: A (batch, M, K), B (batch, K, N), bias (N,) (any pointer when HAS_BIAS is
    # False: never read), C (batch, M, N).
    a_ptr,
    b_ptr,
    bias_ptr,
    c_ptr,
    # Sizes. K_SLICE: the k extent of one slice when SPLIT_K (else unused; pass K).
    M,
    N,
    K,
    K_SLICE,
    # Strides in elements; a batch stride of 0 broadcasts that operand.
    stride_ab,
    stride_am,
    stride_ak,
    stride_bb,
    stride_bk,
    stride_bn,
    stride_cb,
    stride_cm,
    stride_cn,
    # Meta-parameters.
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,  # common.ACT_* id, applied after the bias, in fp32
    FAST_ACT: tl.constexpr,  # cheap exp/division in the activation (fp16/bf16 outputs)
    INPUT_PRECISION: tl.constexpr,  # tl.dot's: "tf32x3" or "ieee" (fp32, TF32 off) or "tf32"
    DOT_IN_FP32: tl.constexpr,  # interpreter only, see common.dot_in_fp32
    EVEN_K: tl.constexpr,  # K % BLOCK_SIZE_K == 0 (and K_SLICE's): the K loop needs no mask
    SPLIT_K: tl.constexpr,  # batch entry s is k slice [s * K_SLICE, min((s + 1) * K_SLICE, K))
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    ALIGN: tl.constexpr,  # elements per 16 bytes
    ALIGNED: tl.constexpr,  # common.align_mask(ALIGN, M, N, K, the 9 strides in order)
):
    # Batch folded into axis 0 (axis 1 is limited to 65535 programs). int64: tile offsets times
    # strides can pass 2^31 for large or batched operands.
    # Sizes and strides the host found to be multiples of 16 bytes that Triton's own
    # specialization misses (bit i of ALIGNED for the i-th of M, N, K and the 9 strides; see
    # common.align_mask), rebuilt as v // ALIGN * ALIGN so the divisibility analysis sees them:
    # with K = 1000 (bf16), A's row stride gave 64 scalar 2-byte loads per thread per k step and
    # no cp.async, so the k loop was not pipelined (128x128x64 tile, sm_90 PTX, Triton 3.9).
    M = hinted(M, ALIGN, ALIGNED & 1)
    N = hinted(N, ALIGN, ALIGNED & 2)
    K = hinted(K, ALIGN, ALIGNED & 4)
    stride_ab = hinted(stride_ab, ALIGN, ALIGNED & 8)
    stride_am = hinted(stride_am, ALIGN, ALIGNED & 16)
    stride_ak = hinted(stride_ak, ALIGN, ALIGNED & 32)
    stride_bb = hinted(stride_bb, ALIGN, ALIGNED & 64)
    stride_bk = hinted(stride_bk, ALIGN, ALIGNED & 128)
    stride_bn = hinted(stride_bn, ALIGN, ALIGNED & 256)
    stride_cb = hinted(stride_cb, ALIGN, ALIGNED & 512)
    stride_cm = hinted(stride_cm, ALIGN, ALIGNED & 1024)
    stride_cn = hinted(stride_cn, ALIGN, ALIGNED & 2048)
    pid = tl.program_id(axis=0).to(tl.int64)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    tiles_per_batch = num_pid_m * num_pid_n
    pid_batch = pid // tiles_per_batch
    pid_m, pid_n = grouped_tile(pid % tiles_per_batch, num_pid_m, num_pid_n, GROUP_SIZE_M)
    if SPLIT_K:  # the batch strides of A and B step K_SLICE along k; the last slice is shorter
        K = tl.minimum(K - pid_batch * K_SLICE, K_SLICE)

    # Rows past M and columns past N are masked on load (zero-fill) rather than wrapped with
    # % M / % N as in Triton's tutorial: the wrap hides the contiguity of B's N axis, and for
    # 2-byte types the loads then cannot become 16-byte cp.async, so the K loop was not software
    # pipelined at all on sm_90 (Triton 3.9 TTGIR, bf16). With masks that are constant over
    # 16-element runs (M, N divisible by 16) the loads vectorize and pipeline.
    offs_am = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_bn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    offs_k64 = offs_k.to(tl.int64)  # k * stride can pass 2^31 (e.g. a column-major A)
    a_ptrs = (
        a_ptr
        + pid_batch * stride_ab
        + (offs_am[:, None] * stride_am + offs_k64[None, :] * stride_ak)
    )
    b_ptrs = (
        b_ptr
        + pid_batch * stride_bb
        + (offs_k64[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    )
    a_row_ok = offs_am[:, None] < M
    b_col_ok = offs_bn[None, :] < N

    accumulator = k_loop(
        a_ptrs, b_ptrs, a_row_ok, b_col_ok, offs_k, K, stride_ak, stride_bk,
        INPUT_PRECISION, DOT_IN_FP32, EVEN_K, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, None,
    )  # fmt: skip
    if INPUT_PRECISION == "tf32x3":  # noqa: SIM102 - compile-time branch around a runtime one
        # 3xTF32's small products can overflow, or meet an infinity, with the other sign than
        # the full product: NaN where IEEE fp32 gives +-inf (inf times 8197, whose TF32 remainder
        # is negative). Any non-finite sum in the tile, whatever made it, is summed again with
        # exact fp32 FMAs, which give IEEE's inf / NaN; finite tiles pay one reduction.
        # The re-sum is unpipelined (STAGES 1): no shared memory of its own beside the main loop's.
        if tl.max(tl.where(tl.abs(accumulator) <= 3.4028234663852886e38, 0, 1)) > 0:
            accumulator = k_loop(
                a_ptrs, b_ptrs, a_row_ok, b_col_ok, offs_k, K, stride_ak, stride_bk,
                "ieee", DOT_IN_FP32, EVEN_K, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, 1,
            )  # fmt: skip

    # Epilogue in fp32, then one down-cast.
    offs_cm = offs_am
    offs_cn = offs_bn
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_cn, mask=offs_cn < N, other=0.0)
        accumulator += bias.to(tl.float32)[None, :]
    accumulator = apply_activation(accumulator, ACTIVATION, FAST_ACT)
    c = accumulator.to(c_ptr.dtype.element_ty)

    c_ptrs = (
        c_ptr
        + pid_batch * stride_cb
        + (offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn)
    )
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, c, mask=c_mask)


@triton.jit
def split_k_reduce_kernel(
    # Pointers: partials (SPLITS, M, N) fp32 contiguous, bias (N,) (any pointer when HAS_BIAS is
    # False: never read), C (M, N).
    partials_ptr,
    bias_ptr,
    c_ptr,
    # Sizes.
    SPLITS,
    M,
    N,
    # Strides of C in elements.
    stride_cm,
    stride_cn,
    # Meta-parameters, as gemm_kernel's.
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    FAST_ACT: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr,  # slices summed per step
    BLOCK_SIZE: tl.constexpr,  # outputs per program
):
    """C = act(sum over s of partials[s] + bias): the slices summed in order in fp32, then the
    epilogue of gemm_kernel and one rounding, as cuda_src/gemm_select.cuh's split_k_reduce_kernel
    (which adds the slices one by one; here SPLIT_BLOCK at a time, as a tree, then in order)."""
    pid = tl.program_id(axis=0).to(tl.int64)
    total = tl.cast(M, tl.int64) * N  # (splits, m, n) can pass 2^31 elements
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < total
    # SPLIT_BLOCK slices per step: that many independent loads in flight per element (one load
    # per step would wait out an L2 round trip per slice, 128 of them at most).
    slices = tl.arange(0, SPLIT_BLOCK)
    acc = tl.zeros((BLOCK_SIZE,), dtype=tl.float32)
    for s0 in range(0, SPLITS, SPLIT_BLOCK):
        s = s0 + slices
        ptrs = partials_ptr + s[:, None].to(tl.int64) * total + offs[None, :]
        part = tl.load(ptrs, mask=(s[:, None] < SPLITS) & mask[None, :], other=0.0)
        acc += tl.sum(part, axis=0)
    row = offs // N
    col = offs - row * N
    if HAS_BIAS:
        acc += tl.load(bias_ptr + col, mask=mask, other=0.0).to(tl.float32)
    acc = apply_activation(acc, ACTIVATION, FAST_ACT)
    c_ptrs = c_ptr + row * stride_cm + col * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def split_k_fixup_kernel(
    # Pointers: A (M, K), B (K, N), bias (N,) (any pointer when HAS_BIAS is False), C (M, N),
    # the fp32 workspace (SPLITS, M, N) contiguous, and one int32 counter per output tile, 0 at
    # launch (left at 0 again).
    a_ptr,
    b_ptr,
    bias_ptr,
    c_ptr,
    ws_ptr,
    count_ptr,
    M,
    N,
    K,
    K_SLICE,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    FAST_ACT: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,  # interpreter only, see common.dot_in_fp32
    SPLITS: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
    """Split-K in one launch: program (slice s, tile t) writes the fp32 partial product of k
    slice s of tile t into the workspace, then counts itself in on t's counter (acq_rel); the
    last of the tile's SPLITS programs sums the tile's slices in slice order (the same bits
    whichever program came last), applies gemm_kernel's epilogue, writes C and resets the
    counter. No second launch (split_k_reduce_kernel) for problems of a few tiles."""
    pid = tl.program_id(axis=0)
    tiles_n = tl.cdiv(N, BLOCK_SIZE_N)
    tiles = tl.cdiv(M, BLOCK_SIZE_M) * tiles_n
    tile = pid % tiles
    split = pid // tiles
    offs_m = (tile // tiles_n) * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = (tile % tiles_n) * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    k0 = split.to(tl.int64) * K_SLICE
    k_len = tl.minimum(K - k0, K_SLICE)
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + (k0 + offs_k[None, :]) * stride_ak
    b_ptrs = b_ptr + (k0 + offs_k[:, None]) * stride_bk + offs_n[None, :].to(tl.int64) * stride_bn
    row_ok = offs_m[:, None] < M
    col_ok = offs_n[None, :] < N
    # 16-bit operands: tl.dot ignores "tf32" (its default); k_len masked on every k step
    acc = k_loop(
        a_ptrs, b_ptrs, row_ok, col_ok, offs_k, k_len, stride_ak, stride_bk,
        "tf32", DOT_IN_FP32, False, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, None,
    )  # fmt: skip
    mask = row_ok & col_ok
    ws_tile = ws_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    total = tl.cast(M, tl.int64) * N
    tl.store(ws_tile + split * total, acc, mask=mask)
    tl.debug_barrier()  # every thread's part is written before the count below releases it
    arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
    if arrived == SPLITS - 1:
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for s in range(0, SPLITS):  # .cg: from L2, where the other programs' parts are
            acc += tl.load(ws_tile + s * total, mask=mask, other=0.0, cache_modifier=".cg")
        if HAS_BIAS:
            bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
            acc += bias.to(tl.float32)[None, :]
        acc = apply_activation(acc, ACTIVATION, FAST_ACT)
        c_ptrs = (
            c_ptr
            + offs_m[:, None].to(tl.int64) * stride_cm
            + offs_n[None, :].to(tl.int64) * stride_cn
        )
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
        tl.atomic_xchg(count_ptr + tile, 0)  # ready for the next launch on this stream


@triton.jit
def gemm_persistent_kernel(
    # Same arguments and meaning as gemm_kernel, plus the batch count: each program walks tiles
    # pid, pid + num_programs, ... of all batches.
    a_ptr,
    b_ptr,
    bias_ptr,
    c_ptr,
    BATCH,
    M,
    N,
    K,
    stride_ab,
    stride_am,
    stride_ak,
    stride_bb,
    stride_bk,
    stride_bn,
    stride_cb,
    stride_cm,
    stride_cn,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    FAST_ACT: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    ALIGN: tl.constexpr,
    ALIGNED: tl.constexpr,
):
    """Persistent form of gemm_kernel: one program per SM (or fewer) loops over output tiles.
    The tile loop is flattened with the K loop (tl.range(flatten=True)), so the software
    pipeline runs across tile boundaries: the next tile's first loads are in flight while this
    tile's epilogue (bias, GELU, store) runs, which matters when K is short."""
    # 16-byte aligned sizes and strides, as in gemm_kernel.
    M = hinted(M, ALIGN, ALIGNED & 1)
    N = hinted(N, ALIGN, ALIGNED & 2)
    K = hinted(K, ALIGN, ALIGNED & 4)
    stride_ab = hinted(stride_ab, ALIGN, ALIGNED & 8)
    stride_am = hinted(stride_am, ALIGN, ALIGNED & 16)
    stride_ak = hinted(stride_ak, ALIGN, ALIGNED & 32)
    stride_bb = hinted(stride_bb, ALIGN, ALIGNED & 64)
    stride_bk = hinted(stride_bk, ALIGN, ALIGNED & 128)
    stride_bn = hinted(stride_bn, ALIGN, ALIGNED & 256)
    stride_cb = hinted(stride_cb, ALIGN, ALIGNED & 512)
    stride_cm = hinted(stride_cm, ALIGN, ALIGNED & 1024)
    stride_cn = hinted(stride_cn, ALIGN, ALIGNED & 2048)
    start = tl.program_id(axis=0)
    num_programs = tl.num_programs(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    tiles_per_batch = num_pid_m * num_pid_n
    num_tiles = BATCH * tiles_per_batch
    k_tiles = tl.cdiv(K, BLOCK_SIZE_K)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    for tile_id in tl.range(start, num_tiles, num_programs, flatten=True):
        pid_batch = (tile_id // tiles_per_batch).to(tl.int64)
        pid_m, pid_n = grouped_tile(tile_id % tiles_per_batch, num_pid_m, num_pid_n, GROUP_SIZE_M)
        offs_am = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
        offs_bn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        a_base = a_ptr + pid_batch * stride_ab + offs_am[:, None].to(tl.int64) * stride_am
        b_base = b_ptr + pid_batch * stride_bb + offs_bn[None, :].to(tl.int64) * stride_bn
        a_row_ok = offs_am[:, None] < M
        b_col_ok = offs_bn[None, :] < N
        accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for ki in range(k_tiles):
            k0 = ki * BLOCK_SIZE_K
            k64 = (k0 + offs_k).to(tl.int64)  # k * stride can pass 2^31
            a_ptrs = a_base + k64[None, :] * stride_ak
            b_ptrs = b_base + k64[:, None] * stride_bk
            if EVEN_K:
                a = tl.load(a_ptrs, mask=a_row_ok, other=0.0)
                b = tl.load(b_ptrs, mask=b_col_ok, other=0.0)
            else:
                a = tl.load(a_ptrs, mask=a_row_ok & ((k0 + offs_k)[None, :] < K), other=0.0)
                b = tl.load(b_ptrs, mask=b_col_ok & ((k0 + offs_k)[:, None] < K), other=0.0)
            if DOT_IN_FP32:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            accumulator = accumulate_dot(accumulator, a, b, INPUT_PRECISION)

        if HAS_BIAS:
            bias = tl.load(bias_ptr + offs_bn, mask=offs_bn < N, other=0.0)
            accumulator += bias.to(tl.float32)[None, :]
        accumulator = apply_activation(accumulator, ACTIVATION, FAST_ACT)
        c = accumulator.to(c_ptr.dtype.element_ty)
        c_ptrs = (
            c_ptr
            + pid_batch * stride_cb
            + (offs_am[:, None].to(tl.int64) * stride_cm + offs_bn[None, :] * stride_cn)
        )
        tl.store(c_ptrs, c, mask=(offs_am[:, None] < M) & (offs_bn[None, :] < N))


class GemmConfig(NamedTuple):
    """One launch configuration of gemm_kernel / gemm_persistent_kernel. A tuple, so stored
    choices (JSON lists in the autotune cache) and launch-cache keys compare equal to it."""

    persistent: bool = False  # launch min(tiles, SMs) programs of gemm_persistent_kernel
    block_m: int = 128  # BLOCK_SIZE_M
    block_n: int = 128  # BLOCK_SIZE_N
    block_k: int = 64  # BLOCK_SIZE_K
    group_m: int = 8  # GROUP_SIZE_M: row tiles per group (L2 reuse of B's column tiles)
    num_stages: int = 3
    num_warps: int = 4


#
# Candidates per (kind, problem class): at most 6 with the TMA configs, so a class's first call
# compiles and times a bounded set (compiling all 16 + 3 TMA configs made a first linear_gelu take
# 21 s on an H100). "large": at least one wave of 128x128 tiles; "small": fewer. Each list starts
# with its best general choice (used untimed under CUDA-graph capture). Winners from the H200
# tuning logs (experiments/NOTES-triton.md) are kept: tensor_core large 128x128 s3
# w4 (linear_gelu 8192x768x3072 and 4096x4096x16384), 128x256 s3 w8 and its persistent twin
# (matmul 4096^3; s4 tied s3 within 0.2% and is gone); small 64x64 and 32x64 (32x64x64).
GEMM_CONFIGS: dict[tuple[str, str], tuple[GemmConfig, ...]] = {
    ("tensor_core", "large"): (
        GemmConfig(block_m=128, block_n=128, block_k=64, num_stages=3, num_warps=4),
        GemmConfig(block_m=128, block_n=256, block_k=64, num_stages=3, num_warps=8),
        GemmConfig(
            persistent=True, block_m=128, block_n=256, block_k=64, num_stages=3, num_warps=8
        ),
    ),
    ("tensor_core", "small"): (
        GemmConfig(block_m=64, block_n=64, block_k=64, num_stages=4, num_warps=4),
        GemmConfig(block_m=32, block_n=64, block_k=64, num_stages=5, num_warps=2),
        GemmConfig(block_m=64, block_n=128, block_k=64, num_stages=4, num_warps=4),
        GemmConfig(block_m=128, block_n=64, block_k=64, num_stages=4, num_warps=4),
        GemmConfig(block_m=64, block_n=256, block_k=64, num_stages=4, num_warps=4),
        GemmConfig(block_m=128, block_n=128, block_k=64, num_stages=3, num_warps=4),
    ),
    # tf32 halves BLOCK_SIZE_K so a stage holds as many bytes as a 16-bit one.
    ("tf32", "large"): (
        GemmConfig(block_m=128, block_n=128, block_k=32, num_stages=3, num_warps=4),
        GemmConfig(block_m=128, block_n=256, block_k=32, num_stages=3, num_warps=8),
        GemmConfig(
            persistent=True, block_m=128, block_n=256, block_k=32, num_stages=3, num_warps=8
        ),
        GemmConfig(block_m=256, block_n=128, block_k=32, num_stages=3, num_warps=8),
    ),
    ("tf32", "small"): (
        GemmConfig(block_m=64, block_n=64, block_k=32, num_stages=4, num_warps=4),
        GemmConfig(block_m=64, block_n=128, block_k=32, num_stages=4, num_warps=4),
        GemmConfig(block_m=128, block_n=64, block_k=32, num_stages=4, num_warps=4),
        GemmConfig(block_m=64, block_n=256, block_k=32, num_stages=4, num_warps=4),
        GemmConfig(block_m=128, block_n=128, block_k=32, num_stages=3, num_warps=4),
    ),
    # fp32 with TF32 off, as 3xTF32 (FP32_INPUT_PRECISION): tensor-core tiles of BLOCK_SIZE_K 32,
    # run by gemm_kernel only (its exact re-sum of non-finite tiles; _gemm_launch makes sure).
    # 128x64 with 4 stages and 4 warps was the fastest of six on every shape of
    # experiments/triton_fp32_tf32x3.py (H100: 4096^3, 8192x768x3072, 1024^3, 2048x16384x2048).
    ("fp32", "large"): (
        GemmConfig(block_m=128, block_n=64, block_k=32, num_stages=4, num_warps=4),
        GemmConfig(block_m=128, block_n=128, block_k=32, num_stages=3, num_warps=4),
        GemmConfig(block_m=128, block_n=128, block_k=32, num_stages=3, num_warps=8),
        GemmConfig(block_m=64, block_n=128, block_k=32, num_stages=4, num_warps=4),
    ),
    ("fp32", "small"): (
        GemmConfig(block_m=64, block_n=64, block_k=32, num_stages=4, num_warps=4),
        GemmConfig(block_m=128, block_n=64, block_k=32, num_stages=4, num_warps=4),
        GemmConfig(block_m=64, block_n=128, block_k=32, num_stages=4, num_warps=4),
        GemmConfig(block_m=128, block_n=128, block_k=32, num_stages=3, num_warps=4),
    ),
}


def gemm_configs(kind: str) -> list[GemmConfig]:
    """Every config of ``kind``: "tensor_core" (fp16/bf16), "tf32" or "fp32" (TF32 off: tl.dot as
    3xTF32, FP32_INPUT_PRECISION). Any of them runs any problem; a stored choice must be one of
    them.

    tensor_core follows the shapes that suit Hopper's wgmma (128x256x64 with 8 warps, 3 stages:
    48 KiB of smem a stage, 144 KiB in all). Configs that do not fit a device's shared memory
    fail to compile and are dropped.
    """
    if not any(k == kind for k, _ in GEMM_CONFIGS):
        raise ValueError(f"unknown GEMM config kind {kind!r}")
    return list(
        dict.fromkeys(c for (k, _), cfgs in GEMM_CONFIGS.items() if k == kind for c in cfgs)
    )


def problem_class(batch, M, N, device) -> str:
    """ "large" from one wave of 128x128 output tiles on, else "small"."""
    return "large" if batch * cdiv(M, 128) * cdiv(N, 128) >= num_sms(device) else "small"


def _candidate_configs(kind, batch, M, N, device):
    """The class's configs less those that only pad a small problem: tiles wider than the
    problem (rounded up to a power of two, at least 64), and persistent configs when there are
    fewer tiles than SMs (each program then runs one tile anyway). A large problem that is thin
    along M or N (no large tile fits) takes the small class's configs."""
    limit_m = max(64, pow2_bucket(M))
    limit_n = max(64, pow2_bucket(N))
    sms = num_sms(device)
    out = []
    for cls in dict.fromkeys((problem_class(batch, M, N, device), "small")):
        for cfg in GEMM_CONFIGS[(kind, cls)]:
            persistent, bm, bn = cfg[:3]
            if bm > limit_m or bn > limit_n:
                continue
            if persistent and batch * cdiv(M, bm) * cdiv(N, bn) <= sms:
                continue
            out.append(cfg)
        if out:
            return out
    return [min(GEMM_CONFIGS[(kind, "small")], key=lambda c: c[1] * c[2])]


# One interpreter config: small tiles keep the CPU interpreter fast, and a 32-wide tile still
# exercises masked M/N/K tails and several tiles per batch on small test shapes. The
# interpreter alternates the two kernels per call so both stay tested.
_INTERPRETER_CONFIGS = (
    GemmConfig(block_m=32, block_n=32, block_k=16, group_m=2, num_stages=1, num_warps=4),
    GemmConfig(True, block_m=32, block_n=32, block_k=16, group_m=2, num_stages=1, num_warps=4),
)
_interpreter_turn = [0]

_launchers = {False: KernelLauncher(gemm_kernel), True: KernelLauncher(gemm_persistent_kernel)}
# The kernels' ALIGN: elements per 16 bytes.
_ALIGN = {torch.float16: 8, torch.bfloat16: 8, torch.float32: 4}
_best_config: dict = {}  # tuning key -> config
TUNING_LOG: dict = {}  # tuning key -> [(ms, config)], fastest first (for benchmarks)
FORCE_CONFIG: list = []  # benchmarks: [config] overrides the tuned choice when set
# fp32 with TF32 off ("fp32" kind): each fp32 operand split into a TF32 high part and the
# remainder and three tensor-core products summed (lo*hi + hi*lo + hi*hi), each block's sum added
# to the running fp32 sum (accumulate_dot; chaining all three into the running sum instead was
# 1.1-1.7x faster, through larger tiles, but the tensor core's truncating adds left 6-60x the
# error budget). The split is dualk's own (split_tf32, IEEE's inf / NaN results). Measured on an
# H200 (experiments/triton_fp32_tf32x3.py, experiments/NOTES-triton.md), best config of six
# against cuBLAS SGEMM: 1.11x at 4096^3, 1.58x with B = W^T and at 8192x768x3072, 1.02x at
# 1024^3, 1.06x at k = 16384, with max errors 4-6x *below* cuBLAS's (4096^3: 1.9e-4 vs 9.5e-4;
# k = 16384: 6.1e-4 vs 3.6e-3), where "ieee" (exact fp32 FMAs on CUDA cores) ran 0.46-0.86x at
# cuBLAS's error. "ieee" stays selectable here for comparison.
FP32_INPUT_PRECISION = "tf32x3"
# Below this k, fp32 keeps exact FMAs ("ieee"): 3xTF32 adds ~3 * 2^-22 of |a b| per product, where
# an fp32 sum's own rounding error grows like k * 2^-24 of it; they meet near k = 144, so a short
# sum would carry more error than PyTorch's (the measured shapes have k >= 768, with errors 4-6x
# below cuBLAS's), and short sums are not where the tensor cores pay.
FP32_TF32X3_MIN_K = 256


def fp32_input_precision(K: int) -> str:
    """tl.dot's input precision for an fp32 GEMM with TF32 off over a k of K."""
    return FP32_INPUT_PRECISION if K >= FP32_TF32X3_MIN_K else "ieee"


# fp16/bf16 activation math: 2 = PTX MUFU ex2/rcp, 1 = tl.exp2 + div.full (common.apply_activation)
FAST_ACT_LEVEL = [2]


def _gemm(
    a, b, bias, c, batch, M, N, K, sa0, sa1, sa2, sb0, sb1, sb2, sc0, sc1, sc2, activation,
    allow_tf32,
):  # fmt: skip
    """act(A @ B + bias) into c for raw (batch, M, K) x (batch, K, N) -> (batch, M, N) strides;
    bias (N,) contiguous or None. The hot path: no tensor views, one dict lookup per launch."""
    dtype = a.dtype
    fast_act = 0 if dtype == torch.float32 else FAST_ACT_LEVEL[0]
    kind = "tensor_core" if dtype != torch.float32 else ("tf32" if allow_tf32 else "fp32")
    has_bias = bias is not None
    spec = (
        dtype, int_spec(M), int_spec(N), int_spec(K), int_spec(sa0), int_spec(sa1),
        int_spec(sa2), int_spec(sb0), int_spec(sb1), int_spec(sb2), int_spec(sc0),
        int_spec(sc1), int_spec(sc2), ptr_spec(a), ptr_spec(b), ptr_spec(c),
        has_bias and ptr_spec(bias), int_spec(batch), 0,
    )  # fmt: skip
    # Sizes and strides that are multiples of 16 bytes but not of 16 elements (K = 1000): hinted
    # to the kernel (ALIGNED, common.align_mask). One test when every size and stride is a
    # multiple of 16 elements or a unit stride (the product of a row's two strides).
    if (M | N | K | sa0 | sb0 | sc0 | sa1 * sa2 | sb1 * sb2 | sc1 * sc2) & 15:
        aligned = align_mask(
            _ALIGN[dtype], M, N, K, sa0, sa1, sa2, sb0, sb1, sb2, sc0, sc1, sc2
        )  # fmt: skip
        if aligned:
            spec = (*spec[:-1], aligned)
    if K >= 2 * SPLIT_K_MIN_SLICE:  # short k never splits: one comparison on that hot path
        plan = one_launch_plan(kind, batch, M, N, K, sa1 * sa2 | sb1 * sb2)
        if plan is not None:
            _one_launch(
                plan, spec, a, b, bias, c, M, N, K, sa1, sa2, sb1, sb2, sc1, sc2, activation,
                fast_act,
            )  # fmt: skip
            return
        plan = split_k_plan(kind, batch, M, N, K, num_sms(a.device))
        if plan is not None:
            _split_k_launch(
                plan, spec, a, b, bias, c, M, N, K, sa1, sa2, sb1, sb2, sc1, sc2, activation,
                fast_act, kind,
            )  # fmt: skip
            return
    if interpreting():
        cfg = _INTERPRETER_CONFIGS[_interpreter_turn[0] % 2]
        _interpreter_turn[0] += 1
    elif FORCE_CONFIG:
        cfg = FORCE_CONFIG[0]
    else:
        tune_key = (a.device, kind, batch, M, N, K, has_bias, activation, fast_act, spec)
        cfg = _best_config.get(tune_key)
        if cfg is None:

            def launch_with(cfg):
                _gemm_launch(
                    cfg, spec, a, b, bias, c, batch, M, N, K, sa0, sa1, sa2, sb0, sb1, sb2,
                    sc0, sc1, sc2, activation, fast_act, kind,
                )  # fmt: skip

            tma = tma_configs(a, b, c, batch, M, N, K, sa1, sa2, sb1, sb2, sc1, sc2)
            candidates = _candidate_configs(kind, batch, M, N, a.device) + list(tma)
            # The persistent class: batch and M rounded up to powers of two; N, K, epilogue,
            # dtype and layout exact (strides that scale with M, sa0 and sc0, left out).
            class_key = "|".join(
                str(v)
                for v in (
                    kind, str(dtype)[6:], pow2_bucket(batch), pow2_bucket(M), N, K, has_bias,
                    activation, fast_act, int_spec(sa1), int_spec(sa2), sa0 == 0,
                    int_spec(sb0), int_spec(sb1), int_spec(sb2), int_spec(sc1), int_spec(sc2),
                    *spec[13:17],
                    # the alignment flags but M's, sa0's and sc0's (left out as above); classes
                    # without flags keep the keys they had before the flags existed
                    *((f"aligned{spec[18] & ~0x209}",) if spec[18] & ~0x209 else ()),
                )
            )  # fmt: skip
            allowed = set(gemm_configs(kind)) | set(tma)
            cfg, timings, keep = tuned_config(
                a.device, "matmul", class_key, candidates, launch_with, allowed
            )
            if keep:
                TUNING_LOG[tune_key] = timings
                _best_config[tune_key] = cfg
    _gemm_launch(
        cfg, spec, a, b, bias, c, batch, M, N, K, sa0, sa1, sa2, sb0, sb1, sb2, sc0, sc1, sc2,
        activation, fast_act, kind,
    )  # fmt: skip


def _gemm_launch(
    cfg, spec, a, b, bias, c, batch, M, N, K, sa0, sa1, sa2, sb0, sb1, sb2, sc0, sc1, sc2,
    activation, fast_act, kind,
):  # fmt: skip
    if cfg[0] == "tma":
        launch_tma(cfg, a, b, bias, c, M, N, K, sa1, sb1, sb2, sc1, activation, num_sms(c.device))
        return
    persistent, bm, bn, bk, group, stages, warps = cfg
    tiles = batch * ((M + bm - 1) // bm) * ((N + bn - 1) // bn)
    # tl.dot ignores input_precision for fp16/bf16; "tf32" is its default there.
    input_precision = fp32_input_precision(K) if kind == "fp32" else "tf32"
    if persistent and input_precision == "tf32x3":  # the exact re-sum of non-finite tiles is
        persistent = False  # gemm_kernel's (no fp32 config is persistent; the interpreter's is)
    head = (
        bias is not None, activation, fast_act, input_precision, dot_in_fp32(a.dtype), K % bk == 0,
    )  # fmt: skip
    tail = (_ALIGN[a.dtype], spec[18])  # ALIGN, ALIGNED
    bias_arg = bias if bias is not None else c
    if persistent:
        consts = (*head, bm, bn, bk, group, *tail)
        grid = (min(tiles, num_sms(c.device)), 1, 1)
        args = (a, b, bias_arg, c, batch, M, N, K, sa0, sa1, sa2, sb0, sb1, sb2, sc0, sc1, sc2)
    else:
        consts = (*head, False, bm, bn, bk, group, *tail)  # SPLIT_K off; K_SLICE = K (spec'd as K)
        grid = (tiles, 1, 1)
        args = (a, b, bias_arg, c, M, N, K, K, sa0, sa1, sa2, sb0, sb1, sb2, sc0, sc1, sc2)
    _launchers[persistent].launch((cfg, spec, consts), grid, args + consts, warps, stages)


# ------------------------------------------------------------------ split-K
# Few output tiles and a long k (a tall batch's weight gradients, 64 x 2^18 x 64; 128 x 8192 x
# 128): one program per tile leaves most SMs idle for the whole k loop (128x8192x128 bf16: 37 us
# vs cuBLAS's 11.7 on an H100). As CUDA's split_k_plan (cuda_src/gemm_select.cuh): a k of at
# least 2 * SPLIT_K_MIN_SLICE is cut into slices of at least SPLIT_K_MIN_SLICE (exact fp32:
# SPLIT_K_MIN_SLICE_FP32), at most SPLIT_K_MAX_SPLITS of them, about 2 programs per SM over the
# tiles; the slices are gemm_kernel's batch entries (SPLIT_K), writing fp32 partial products
# into a (splits, M, N) workspace, and split_k_reduce_kernel sums them, adds the bias,
# applies the activation and rounds once. One batch only: the batch axis carries the slices
# (matmul's batched A times a shared B is folded into one batch before this).
#
# The two fp32 rules below date from when fp32 ran on CUDA cores ("ieee"); with 3xTF32
# (FP32_INPUT_PRECISION) they are kept unmeasured: its error at k = 16384 without slices was
# already 6x below cuBLAS's, and its faster k loop makes the workspace's share larger.
# Exact fp32 ("fp32" kind, not TF32) also splits a long k when the tiles fill the GPU, for
# accuracy: gemm_kernel adds k blocks in order, K / BLOCK_SIZE_K additions per output, which put
# dualk's fp32 error at 3-20x cuBLAS's (which splits k) for k = 5000-65536. Slices of FP32_SLICE
# make that FP32_SLICE / BLOCK_SIZE_K + splits. The cost is the workspace, written and read
# once: 8 bytes per output and slice against 2 * FP32_SLICE CUDA-core FLOPs per output and
# slice, about 5% (an estimate, unmeasured), capped at SPLIT_K_MAX_WORKSPACE floats. From
# k > 4096 only, which leaves the 4096^3 benchmark as it was. TF32 keeps one pass: its 2^-11
# input rounding dwarfs the summation order's error.
SPLIT_K_MIN_SLICE = 256
# Exact fp32 runs on CUDA cores: 64 k of FMA per output (128 FLOPs) cost about what the 8 bytes of
# workspace a slice writes and reads do, and 256 left linear_gelu 32x768->3072 at 3 slices
# (144 programs, 52 us on an H100 against cuBLAS's 39; 6 slices of 128: 42-43 us). Only the
# slices are shorter: k < 2 * SPLIT_K_MIN_SLICE runs in one pass for every kind. As CUDA's
# kSplitKMinSliceFp32.
SPLIT_K_MIN_SLICE_FP32 = 64
SPLIT_K_MAX_SPLITS = 128
FP32_ORDERED_MAX_K = 4096
FP32_SLICE = 1024
SPLIT_K_MAX_WORKSPACE = 1 << 26  # floats (256 MiB)
SPLIT_K = [True]  # benchmarks: [False] turns split-K off
POISON_WORKSPACE: list = []  # tests: [value] fills each workspace before the partials kernel
_reduce_launcher = KernelLauncher(split_k_reduce_kernel)


def split_k_plan(kind: str, batch: int, M: int, N: int, K: int, sms: int):
    """(config, splits, slice) when this GEMM takes split-K, else None: ``splits`` slices of
    ``slice`` k (a multiple of the config's BLOCK_SIZE_K), the last one shorter. The config is the
    small class's first (64x64; the interpreter's 32x32), or the large class's first for exact
    fp32 with many tiles. Untimed: the path is chosen by this rule, not by the tuner."""
    if not SPLIT_K[0] or batch != 1 or K < 2 * SPLIT_K_MIN_SLICE:
        return None
    min_slice = SPLIT_K_MIN_SLICE_FP32 if kind == "fp32" else SPLIT_K_MIN_SLICE
    cfg = _INTERPRETER_CONFIGS[0] if interpreting() else GEMM_CONFIGS[(kind, "small")][0]
    tiles = cdiv(M, cfg[1]) * cdiv(N, cfg[2])
    # the accuracy fix's slice count (exact fp32, long k), within the workspace cap
    ordered = (
        min(cdiv(K, FP32_SLICE), SPLIT_K_MAX_SPLITS, SPLIT_K_MAX_WORKSPACE // (M * N))
        if kind == "fp32" and K > FP32_ORDERED_MAX_K
        else 0
    )
    if 2 * tiles < sms:  # one pass would leave over half the SMs idle
        splits = min(cdiv(2 * sms, tiles), K // min_slice, SPLIT_K_MAX_SPLITS)
        # occupancy alone may cut a long k into few long slices (60 tiles: 5 of 13k at k = 65536)
        splits = max(splits, ordered)
    elif ordered:  # the accuracy fix
        if not interpreting() and M >= 128 and N >= 128:
            cfg = GEMM_CONFIGS[("fp32", "large")][0]
        splits = ordered
    else:
        return None
    if splits < 2:
        return None
    bk = cfg[3]
    k_slice = cdiv(cdiv(K, splits), bk) * bk
    return cfg, cdiv(K, k_slice), k_slice


# One launch for the fewest tiles (split_k_fixup_kernel): 16-bit, M and N <= 128, k in
# [2048, 32768], up to 16 slices (k cut into FIXUP_SPLITS slices rounded up to whole k tiles:
# 9-16 of them) of 32x32 tiles. Measured on an H100 (bf16, contiguous,
# experiments/triton_splitk_fixup.py): for M = N in {32, 64,
# 128} and k 2048-32768 it beat the two-launch plan in all 15 cases, by 2-22% (128x8192x128:
# 11.89 vs 12.94 us, cuBLAS 11.90); at 256 x k x 256 (many 32x32 tiles) and at k = 65536
# (64x65536x64: 25.2 vs 21.2 us) it lost, hence the bounds. Untried below k = 2048. The kernel
# has none of gemm_kernel's alignment hints, so it is taken only where A's and B's non-unit
# strides (k itself for a row-major A) are multiples of 16 elements (as in the measurements).
FIXUP_MAX_MN = 128
FIXUP_MIN_K, FIXUP_MAX_K = 2048, 32768
FIXUP_SPLITS = 16


class FixupConfig(NamedTuple):
    """split_k_fixup_kernel's launch configuration."""

    block_m: int  # BLOCK_SIZE_M
    block_n: int  # BLOCK_SIZE_N
    block_k: int  # BLOCK_SIZE_K
    num_warps: int
    num_stages: int


FIXUP_CONFIG = FixupConfig(block_m=32, block_n=32, block_k=128, num_warps=4, num_stages=3)
_INTERPRETER_FIXUP_CONFIG = FixupConfig(
    block_m=16, block_n=16, block_k=32, num_warps=4, num_stages=1
)
SPLIT_K_ONE_LAUNCH = [True]  # benchmarks and tests: [False] takes the two-launch plan
_fixup_launcher = KernelLauncher(split_k_fixup_kernel)
_tile_counts: dict = {}  # (device, stream handle) -> int32 zeros that every launch leaves at 0


def one_launch_plan(kind: str, batch: int, M: int, N: int, K: int, row_strides: int = 0):
    """(config, splits, slice) when this GEMM takes split_k_fixup_kernel, else None.
    ``row_strides``: A's and B's non-unit strides or'ed together (sa1 * sa2 | sb1 * sb2)."""
    if kind != "tensor_core" or batch != 1 or M > FIXUP_MAX_MN or N > FIXUP_MAX_MN:
        return None
    if row_strides & 15:  # no alignment hints in the kernel: 16-element rows, as measured
        return None
    if not FIXUP_MIN_K <= K <= FIXUP_MAX_K or not (SPLIT_K_ONE_LAUNCH[0] and SPLIT_K[0]):
        return None
    cfg = _INTERPRETER_FIXUP_CONFIG if interpreting() else FIXUP_CONFIG
    k_slice = cdiv(cdiv(K, FIXUP_SPLITS), cfg[2]) * cfg[2]
    return cfg, cdiv(K, k_slice), k_slice


def _tile_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """Zeroed int32 tile counters for one launch on the current stream. Outside a capture, one
    buffer per (device, stream), which each launch leaves at 0 for the next launch on its stream
    (launches on one stream run in order; another stream gets its own). Inside a CUDA-graph
    capture, the graph's own buffer, zeroed by a captured memset at each replay (a graph replayed
    on another stream must not share a stream's buffer). Keyed by the stream's handle: a stream
    destroyed with a launch in flight whose handle a new stream reuses at once, or per-thread
    default streams (one handle, concurrent threads), would share counters; PyTorch's streams
    are neither."""
    if device.type != "cuda":
        return torch.zeros(tiles, dtype=torch.int32, device=device)
    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(tiles, dtype=torch.int32, device=device)
    from triton.runtime import driver

    # the handle of the stream the launcher launches on (KernelLauncher asks the same driver)
    key = (device.index, driver.active.get_current_stream(device.index))
    counts = _tile_counts.get(key)
    if counts is None or counts.numel() < tiles:
        if len(_tile_counts) >= 64:  # streams come and go: forget the old ones
            _tile_counts.clear()
        counts = torch.zeros(max(tiles, 64), dtype=torch.int32, device=device)
        _tile_counts[key] = counts
    return counts


def _one_launch(plan, spec, a, b, bias, c, M, N, K, sa1, sa2, sb1, sb2, sc1, sc2, activation, fast_act):  # fmt: skip
    """split_k_fixup_kernel into c, with an fp32 workspace from PyTorch's caching allocator."""
    cfg, splits, k_slice = plan
    bm, bn, bk, warps, stages = cfg
    tiles = cdiv(M, bm) * cdiv(N, bn)
    ws = torch.empty((splits, M, N), dtype=torch.float32, device=c.device)
    if POISON_WORKSPACE:
        ws.fill_(POISON_WORKSPACE[0])
    counts = _tile_counters(c.device, tiles)
    consts = (bias is not None, activation, fast_act, dot_in_fp32(a.dtype), splits, bm, bn, bk)
    args = (a, b, bias if bias is not None else c, c, ws, counts, M, N, K, k_slice, sa1, sa2, sb1, sb2, sc1, sc2)  # fmt: skip
    key = (cfg, spec, int_spec(k_slice), ptr_spec(ws), consts)
    _fixup_launcher.launch(key, (splits * tiles, 1, 1), args + consts, warps, stages)


def _split_k_launch(
    plan, spec, a, b, bias, c, M, N, K, sa1, sa2, sb1, sb2, sc1, sc2, activation, fast_act, kind,
):  # fmt: skip
    """The partials kernel (gemm_kernel, one batch entry per k slice) into an fp32 workspace from
    PyTorch's caching allocator, then split_k_reduce_kernel into c; both on the current stream."""
    cfg, splits, k_slice = plan
    _, bm, bn, bk, group, stages, warps = cfg
    ws = torch.empty((splits, M, N), dtype=torch.float32, device=c.device)
    if POISON_WORKSPACE:
        ws.fill_(POISON_WORKSPACE[0])
    input_precision = fp32_input_precision(K) if kind == "fp32" else "tf32"
    sab, sbb = k_slice * sa2, k_slice * sb1  # slice s starts s * k_slice along k
    align = _ALIGN[a.dtype]
    aligned = spec[18] and align_mask(align, M, N, K, sab, sa1, sa2, sbb, sb1, sb2, M * N, N, 1)
    consts = (False, ACT_NONE, 0, input_precision, dot_in_fp32(a.dtype), K % bk == 0, True, bm, bn, bk, group, align, aligned)  # fmt: skip
    grid = (splits * cdiv(M, bm) * cdiv(N, bn), 1, 1)
    args = (a, b, ws, ws, M, N, K, k_slice, sab, sa1, sa2, sbb, sb1, sb2, M * N, N, 1)
    key = ("split", cfg, spec, int_spec(k_slice), int_spec(sab), int_spec(sbb), int_spec(M * N), ptr_spec(ws), consts)  # fmt: skip
    _launchers[False].launch(key, grid, args + consts, warps, stages)

    # Outputs per reduce program: about two programs per SM, 32-256 outputs each.
    total = M * N
    block = max(32, min(256, pow2_bucket(max(1, total // (2 * num_sms(c.device))))))
    rconsts = (bias is not None, activation, fast_act, 8, block)
    rkey = (c.dtype, int_spec(splits), int_spec(M), int_spec(N), int_spec(sc1), int_spec(sc2),
            ptr_spec(c), bias is not None and ptr_spec(bias), ptr_spec(ws), rconsts)  # fmt: skip
    rargs = (ws, bias if bias is not None else ws, c, splits, M, N, sc1, sc2)
    _reduce_launcher.launch(rkey, (cdiv(total, block), 1, 1), rargs + rconsts, 4, 1)


def launch_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    c: torch.Tensor,
    *,
    activation: int,
    allow_tf32: bool,
) -> None:
    """Write act(a @ b + bias) into ``c`` with one kernel launch.

    a (batch, M, K), b (batch, K, N), c (batch, M, N), any strides (batch stride 0 broadcasts);
    bias (N,) or None. Caller guarantees M, N, K > 0 and one dtype throughout.
    """
    batch, M, K = a.shape
    N = b.shape[2]
    if bias is not None:
        bias = bias.contiguous()  # (N,): the kernel reads it with unit stride
    sa, sb, sc = a.stride(), b.stride(), c.stride()
    _gemm(
        a, b, bias, c, batch, M, N, K, sa[0], sa[1], sa[2], sb[0], sb[1], sb[2], sc[0], sc[1],
        sc[2], activation, allow_tf32,
    )  # fmt: skip


def matmul(a: torch.Tensor, b: torch.Tensor, *, allow_tf32: bool) -> torch.Tensor:
    """a @ b for a (M, K) or (B, M, K) and b (K, N) or (B, K, N), any strides, one dtype among
    fp32/fp16/bf16 (validated by dualk). A 2-D operand next to a 3-D one is broadcast over the
    batch. Returns a new contiguous (M, N) or (B, M, N) tensor of a's dtype; fp32 accumulation.
    ``allow_tf32``: fp32 inputs may use TF32 tensor cores (else 3xTF32, fp32-accurate:
    FP32_INPUT_PRECISION).
    """
    a_dim, b_dim = a.dim(), b.dim()
    M, K = a.shape[-2], a.shape[-1]
    N = b.shape[-1]
    if a_dim == 2 and b_dim == 2:
        if M == 0 or N == 0:
            return torch.empty((M, N), dtype=a.dtype, device=a.device)
        if K == 0:
            return torch.zeros((M, N), dtype=a.dtype, device=a.device)
        c = _alloc.empty((M, N), a.dtype, a.device)  # NaN under DUALK_POISON
        sa, sb = a.stride(), b.stride()
        _gemm(
            a, b, None, c, 1, M, N, K, 0, sa[0], sa[1], 0, sb[0], sb[1], 0, N, 1, ACT_NONE,
            allow_tf32,
        )  # fmt: skip
        return c

    batch = a.shape[0] if a_dim == 3 else b.shape[0]
    out_shape = (batch, M, N)
    if M == 0 or N == 0 or batch == 0:
        return torch.empty(out_shape, dtype=a.dtype, device=a.device)
    if K == 0:
        return torch.zeros(out_shape, dtype=a.dtype, device=a.device)

    sa = a.stride() if a_dim == 3 else (0, *a.stride())
    sb = b.stride() if b_dim == 3 else (0, *b.stride())
    # A batched A times a shared 2-D B whose batch rows are evenly spaced is one tall GEMM:
    # bigger tiles along M and no per-batch tail tiles.
    if a_dim == 3 and b_dim == 2 and sa[0] == M * sa[1]:
        c = _alloc.empty(out_shape, a.dtype, a.device)
        _gemm(
            a, b, None, c, 1, batch * M, N, K, 0, sa[1], sa[2], 0, sb[1], sb[2], 0, N, 1,
            ACT_NONE, allow_tf32,
        )  # fmt: skip
        return c

    c = _alloc.empty(out_shape, a.dtype, a.device)
    _gemm(
        a, b, None, c, batch, M, N, K, sa[0], sa[1], sa[2], sb[0], sb[1], sb[2], M * N, N, 1,
        ACT_NONE, allow_tf32,
    )  # fmt: skip
    return c
