"""Tiled GEMM core shared by matmul and linear_gelu: C[b] = act(A[b] @ B[b] + bias).

One kernel, ``gemm_kernel``: grouped tile ordering, batch folded into program axis 0, any strides
for A, B and C (transposed and sliced views run natively), masked M/N/K tails, and a bias +
activation epilogue applied to the fp32 accumulator before the down-cast.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from triton_src.common import (
    ACT_NONE,
    apply_activation,
    dot_in_fp32,
    grouped_tile,
    interpreting,
)


@triton.jit
def gemm_kernel(
    # Pointers: A (batch, M, K), B (batch, K, N), bias (N,) (any pointer when HAS_BIAS is
    # False: never read), C (batch, M, N).
    a_ptr,
    b_ptr,
    bias_ptr,
    c_ptr,
    # Sizes.
    M,
    N,
    K,
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
    INPUT_PRECISION: tl.constexpr,  # tl.dot's: "ieee" (exact fp32) or "tf32"
    DOT_IN_FP32: tl.constexpr,  # interpreter only, see common.dot_in_fp32
    EVEN_K: tl.constexpr,  # K % BLOCK_SIZE_K == 0: the K loop needs no mask
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
):
    # Batch folded into axis 0 (axis 1 is limited to 65535 programs). int64: tile offsets times
    # strides can pass 2^31 for large or batched operands.
    pid = tl.program_id(axis=0).to(tl.int64)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    tiles_per_batch = num_pid_m * num_pid_n
    pid_batch = pid // tiles_per_batch
    pid_m, pid_n = grouped_tile(pid % tiles_per_batch, num_pid_m, num_pid_n, GROUP_SIZE_M)

    # Rows past M and columns past N are masked on load (zero-fill) rather than wrapped with
    # % M / % N as in Triton's tutorial: the wrap hides the contiguity of B's N axis, and for
    # 2-byte types the loads then cannot become 16-byte cp.async, so the K loop was not software
    # pipelined at all on sm_90 (Triton 3.9 TTGIR, bf16). With masks that are constant over
    # 16-element runs (M, N divisible by 16) the loads vectorize and pipeline.
    offs_am = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_bn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = (
        a_ptr + pid_batch * stride_ab + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    )
    b_ptrs = (
        b_ptr + pid_batch * stride_bb + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    )
    a_row_ok = offs_am[:, None] < M
    b_col_ok = offs_bn[None, :] < N

    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
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
        accumulator = tl.dot(a, b, accumulator, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    # Epilogue in fp32, then one down-cast.
    offs_cm = offs_am
    offs_cn = offs_bn
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_cn, mask=offs_cn < N, other=0.0)
        accumulator += bias.to(tl.float32)[None, :]
    accumulator = apply_activation(accumulator, ACTIVATION)
    c = accumulator.to(c_ptr.dtype.element_ty)

    c_ptrs = (
        c_ptr
        + pid_batch * stride_cb
        + (offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn)
    )
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, c, mask=c_mask)


def gemm_configs(kind: str) -> list[triton.Config]:
    """Autotune configs for ``gemm_kernel``; ``kind`` is "tensor_core" (fp16/bf16), "tf32" or
    "fp32" (exact fp32: tl.dot on CUDA cores). Keyed on M, N, K, the epilogue and the dtypes.

    Untimed here (written on a machine without a GPU): tensor_core follows the shapes that suit
    Hopper's wgmma (128x256x64 with 8 warps, 3 stages: 48 KiB of smem a stage, 144 KiB in all);
    tf32 halves BLOCK_SIZE_K so a stage holds as many bytes. Configs that do not fit a device's
    shared memory fail to compile and the autotuner drops them.
    """

    def cfg(bm, bn, bk, stages, warps, group=8):
        meta = dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=group)
        return triton.Config(meta, num_stages=stages, num_warps=warps)

    if kind == "tensor_core":
        return [
            cfg(128, 256, 64, 3, 8),
            cfg(256, 128, 64, 3, 8),
            cfg(128, 256, 64, 4, 8),
            cfg(128, 128, 64, 4, 8),
            cfg(128, 128, 64, 3, 4),
            cfg(64, 256, 64, 4, 4),
            cfg(128, 64, 64, 4, 4),
            cfg(64, 128, 64, 4, 4),
            cfg(64, 64, 64, 4, 4),
            cfg(32, 64, 64, 5, 2),
        ]
    if kind == "tf32":
        return [
            cfg(128, 256, 32, 3, 8),
            cfg(256, 128, 32, 3, 8),
            cfg(128, 128, 32, 4, 8),
            cfg(128, 128, 32, 3, 4),
            cfg(64, 256, 32, 4, 4),
            cfg(128, 64, 32, 4, 4),
            cfg(64, 128, 32, 4, 4),
            cfg(64, 64, 32, 4, 4),
        ]
    if kind == "fp32":
        # CUDA-core FMA path: moderate tiles keep the per-thread accumulator (BM*BN / threads)
        # at 32-64 registers; shallow BLOCK_SIZE_K keeps operand fragments small. tl.dot needs
        # BLOCK_SIZE_K >= 16 (Triton 3.6 asserts it at compile time).
        return [
            cfg(128, 128, 16, 3, 8),
            cfg(128, 128, 32, 3, 8),
            cfg(128, 64, 32, 3, 4),
            cfg(64, 128, 32, 3, 4),
            cfg(64, 64, 32, 3, 4),
            cfg(256, 128, 16, 3, 8),
        ]
    raise ValueError(f"unknown GEMM config kind {kind!r}")


# One interpreter config: small tiles keep the CPU interpreter fast, and a 32-wide tile still
# exercises masked M/N/K tails and several tiles per batch on small test shapes.
_INTERPRETER_META = dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=32, BLOCK_SIZE_K=16, GROUP_SIZE_M=2)

_GEMM_KEY = ["M", "N", "K", "HAS_BIAS", "ACTIVATION", "INPUT_PRECISION"]
_even_k = triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_SIZE_K"] == 0})
_gemm_untuned = _even_k(gemm_kernel)
_gemm_tuned = {
    kind: triton.autotune(configs=gemm_configs(kind), key=_GEMM_KEY)(_even_k(gemm_kernel))
    for kind in ("tensor_core", "tf32", "fp32")
}


def launch_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    c: torch.Tensor,
    *,
    activation: int,
    allow_tf32: bool,
) -> None:
    """Write act(a @ b + bias) into ``c`` with one launch of ``gemm_kernel``.

    a (batch, M, K), b (batch, K, N), c (batch, M, N), any strides (batch stride 0 broadcasts);
    bias (N,) or None. Caller guarantees M, N, K > 0 and one dtype throughout.
    """
    batch, M, K = a.shape
    N = b.shape[2]
    kind = "tensor_core" if a.dtype != torch.float32 else ("tf32" if allow_tf32 else "fp32")
    # tl.dot ignores input_precision for fp16/bf16; "tf32" is its default there.
    input_precision = "ieee" if kind == "fp32" else "tf32"
    if bias is not None:
        bias = bias.contiguous()  # (N,): the kernel reads it with unit stride
    args = (
        a,
        b,
        bias if bias is not None else c,
        c,
        M,
        N,
        K,
        a.stride(0),
        a.stride(1),
        a.stride(2),
        b.stride(0),
        b.stride(1),
        b.stride(2),
        c.stride(0),
        c.stride(1),
        c.stride(2),
    )
    meta = dict(
        HAS_BIAS=bias is not None,
        ACTIVATION=activation,
        INPUT_PRECISION=input_precision,
        DOT_IN_FP32=dot_in_fp32(a.dtype),
    )

    def grid(META):
        tiles = triton.cdiv(M, META["BLOCK_SIZE_M"]) * triton.cdiv(N, META["BLOCK_SIZE_N"])
        return (batch * tiles,)

    if interpreting():
        _gemm_untuned[grid](*args, **meta, **_INTERPRETER_META)
    else:
        _gemm_tuned[kind][grid](*args, **meta)


def as_batched(t: torch.Tensor, batch: int) -> torch.Tensor:
    """View a 2-D operand as (batch, rows, cols) with batch stride 0 (no copy)."""
    if t.dim() == 3:
        return t
    return t.unsqueeze(0).expand(batch, *t.shape)


def matmul(a: torch.Tensor, b: torch.Tensor, *, allow_tf32: bool) -> torch.Tensor:
    """a @ b for a (M, K) or (B, M, K) and b (K, N) or (B, K, N), any strides, one dtype among
    fp32/fp16/bf16 (validated by dualk). A 2-D operand next to a 3-D one is broadcast over the
    batch. Returns a new contiguous (M, N) or (B, M, N) tensor of a's dtype; fp32 accumulation.
    ``allow_tf32``: fp32 inputs may use TF32 tensor cores (else exact fp32 on CUDA cores).
    """
    batched = a.dim() == 3 or b.dim() == 3
    batch = a.shape[0] if a.dim() == 3 else (b.shape[0] if b.dim() == 3 else 1)
    M, K = a.shape[-2], a.shape[-1]
    N = b.shape[-1]
    out_shape = (batch, M, N) if batched else (M, N)
    if M == 0 or N == 0 or batch == 0:
        return torch.empty(out_shape, dtype=a.dtype, device=a.device)
    if K == 0:
        return torch.zeros(out_shape, dtype=a.dtype, device=a.device)

    # A batched A times a shared 2-D B whose batch rows are evenly spaced is one tall GEMM:
    # bigger tiles along M and no per-batch tail tiles.
    if a.dim() == 3 and b.dim() == 2 and a.stride(0) == M * a.stride(1):
        c = torch.empty((batch * M, N), dtype=a.dtype, device=a.device)
        a2 = a.as_strided((batch * M, K), (a.stride(1), a.stride(2)))
        launch_gemm(
            a2.unsqueeze(0), b.unsqueeze(0), None, c.unsqueeze(0),
            activation=ACT_NONE, allow_tf32=allow_tf32,
        )  # fmt: skip
        return c.view(out_shape)

    c = torch.empty((batch, M, N), dtype=a.dtype, device=a.device)
    launch_gemm(
        as_batched(a, batch), as_batched(b, batch), None, c,
        activation=ACT_NONE, allow_tf32=allow_tf32,
    )  # fmt: skip
    return c.view(out_shape)
