"""Hopper GEMM core with TMA tensor descriptors: act(A @ B + bias) for large fp16/bf16 problems.

A persistent program loop whose tile loop and k loop are flattened into one software pipeline
(``tl.range(..., flatten=True)``), so the next tile's TMA loads are in flight while this tile's
epilogue runs; TMA zero-fills the K / M / N tails and clips the stores, so there are no masks.
It joins the tuner's candidates in triton_src/matmul.py only where it can run (sm_90+, 16-byte
aligned unit-stride rows, one batch) and only for large problems, where the host cost of three
descriptors per call is hidden behind the kernel. Measured on an H200
(experiments/NOTES-triton-linear-gelu.md): 0.99-1.05x cuBLAS at 4096^3 (bf16 / fp16), and
1.03x cuBLASLt's fused gelu epilogue at 8192 x 768 x 3072 with two programs per SM.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .common import (
    PRECISE_MATH,
    KernelLauncher,
    apply_activation,
    cdiv,
    grouped_tile,
    int_spec,
    interpreting,
    ptr_spec,
)

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # Triton without host-side descriptors: the path stays off
    TensorDescriptor = None

# Below this many multiply-adds the three descriptors and the plain Triton launch (20-30 us of
# host time on Triton 3.6) would show next to the kernel. 2^33 rather than 2^34 so that 4096 x
# 1000 x 4096 (0.98 x 2^34) times this kernel too: 53.5 us against gemm_kernel's 65.2 and
# cuBLAS's 54.2 on an H100, bf16 (experiments/NOTES-triton.md). A 2^33 problem takes about 25 us
# of device time at 700 TFLOP/s, still at or above that host time; the tuner times device time
# only, so a call stream bound by host time near 2^33 would not show (unmeasured).
MIN_MACS = 1 << 33


class TmaConfig(NamedTuple):
    """One launch configuration of gemm_tma_kernel. A tuple whose first field is "tma", so the
    matmul launcher tells it from a GemmConfig and stored choices compare equal to it."""

    tag: str  # always "tma"
    block_m: int  # BLOCK_M
    block_n: int  # BLOCK_N
    block_k: int  # BLOCK_K
    group_m: int  # GROUP_M
    num_stages: int
    num_warps: int
    programs_per_sm: int
    epilogue_slices: int  # the output tile is stored in this many column slices
    fast_activation: int  # level 3: tanh-gelu with one tanh.approx.f32 (for 16-bit outputs)


def _tma(**fields) -> TmaConfig:
    return TmaConfig("tma", **fields)


TMA_CONFIGS = (
    # plain matmul: 0.99x / 1.05x cuBLAS bf16 / fp16 4096^3
    _tma(block_m=128, block_n=256, block_k=64, group_m=8, num_stages=4, num_warps=8,
         programs_per_sm=1, epilogue_slices=2, fast_activation=3),
    # short-k linear_gelu: 1.03x cuBLASLt (8192x768x3072)
    _tma(block_m=128, block_n=128, block_k=64, group_m=8, num_stages=3, num_warps=4,
         programs_per_sm=2, epilogue_slices=2, fast_activation=3),
    # long-k linear_gelu: 0.975x cuBLASLt (4096x4096x16384)
    _tma(block_m=128, block_n=256, block_k=64, group_m=8, num_stages=3, num_warps=8,
         programs_per_sm=1, epilogue_slices=2, fast_activation=2),
)  # fmt: skip


@triton.jit
def _tanh_approx_f32(x):
    """tanh by PTX tanh.approx.f32: one MUFU.TANH, relative error about 2^-11."""
    return tl.inline_asm_elementwise(
        "tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit
def _epilogue(acc, bias_ptr, offs_n, N, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
              FAST_ACT: tl.constexpr):  # fmt: skip
    """bias + activation on an fp32 block. FAST_ACT 3 (tanh-gelu, GPU only): gelu = h + h tanh(z),
    h = x / 2, tanh from one MUFU op; otherwise common.apply_activation at level min(FAST_ACT, 2)."""
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    if ACTIVATION == 2 and FAST_ACT == 3 and PRECISE_MATH:
        z = acc * (0.7978845608028654 + 0.035677408136300125 * acc * acc)
        h = 0.5 * acc
        acc = h + h * _tanh_approx_f32(z)
    else:
        acc = apply_activation(acc, ACTIVATION, 2 if FAST_ACT >= 2 else FAST_ACT)
    return acc


@triton.jit
def _store_tile(c_desc, acc, bias_ptr, off_m, off_n, N, HAS_BIAS: tl.constexpr,
                ACTIVATION: tl.constexpr, FAST_ACT: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                EPI_SUBTILE: tl.constexpr):  # fmt: skip
    """Epilogue and TMA store of one fp32 tile in EPI_SUBTILE (1 or 2) column slices: two slices
    keep half the fp32 temporaries live and halve the staging buffer."""
    dtype = c_desc.dtype
    if EPI_SUBTILE == 1:
        offs_n = off_n + tl.arange(0, BLOCK_SIZE_N)
        c = _epilogue(acc, bias_ptr, offs_n, N, HAS_BIAS, ACTIVATION, FAST_ACT)
        c_desc.store([off_m, off_n], c.to(dtype))
    else:
        tl.static_assert(EPI_SUBTILE == 2)
        HALF: tl.constexpr = BLOCK_SIZE_N // 2
        acc3 = tl.permute(tl.reshape(acc, (acc.shape[0], 2, HALF)), (0, 2, 1))
        acc0, acc1 = tl.split(acc3)
        offs0 = off_n + tl.arange(0, HALF)
        c0 = _epilogue(acc0, bias_ptr, offs0, N, HAS_BIAS, ACTIVATION, FAST_ACT)
        c_desc.store([off_m, off_n], c0.to(dtype))
        c1 = _epilogue(acc1, bias_ptr, offs0 + HALF, N, HAS_BIAS, ACTIVATION, FAST_ACT)
        c_desc.store([off_m, off_n + HALF], c1.to(dtype))


@triton.jit
def gemm_tma_kernel(a_desc, b_desc, c_desc, bias_ptr, M, N, K,
                    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, FAST_ACT: tl.constexpr,
                    B_NK: tl.constexpr, BLOCK_SIZE_M: tl.constexpr,
                    BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                    GROUP_SIZE_M: tl.constexpr, EPI_SUBTILE: tl.constexpr):  # fmt: skip
    """A (M, K), B (N, K) if B_NK (an nn.Linear weight) else (K, N), C (M, N) with block
    (BM, BN / EPI_SUBTILE); bias (N,). Program p runs tiles p, p + num_programs, ...; the
    epilogue's tile index is a second counter, as in Triton's persistent-matmul tutorial (its
    pipeliner mishandled one value used by both the loads and the epilogue)."""
    start = tl.program_id(axis=0)
    num_programs = tl.num_programs(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_SIZE_K)
    tile_id_c = start - num_programs
    for tile_id in tl.range(start, num_tiles, num_programs, flatten=True):
        pid_m, pid_n = grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M)
        off_m = pid_m * BLOCK_SIZE_M
        off_n = pid_n * BLOCK_SIZE_N
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for ki in range(k_tiles):
            off_k = ki * BLOCK_SIZE_K
            a = a_desc.load([off_m, off_k])
            if B_NK:  # noqa: SIM108  K-major B, transposed in shared memory by wgmma
                b = b_desc.load([off_n, off_k]).T
            else:
                b = b_desc.load([off_k, off_n])
            acc = tl.dot(a, b, acc)
        tile_id_c += num_programs
        pid_m, pid_n = grouped_tile(tile_id_c, num_pid_m, num_pid_n, GROUP_SIZE_M)
        _store_tile(c_desc, acc, bias_ptr, pid_m * BLOCK_SIZE_M, pid_n * BLOCK_SIZE_N, N,
                    HAS_BIAS, ACTIVATION, FAST_ACT, BLOCK_SIZE_N, EPI_SUBTILE)  # fmt: skip


_capability_cache: dict = {}


def _capability_major(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    major = _capability_cache.get(index)
    if major is None:
        major = _capability_cache[index] = torch.cuda.get_device_capability(index)[0]
    return major


def _aligned(ptr: int, *row_strides: int) -> bool:
    return ptr % 16 == 0 and all((s * 2) % 16 == 0 for s in row_strides)


def tma_configs(a, b, c, batch, M, N, K, sa1, sa2, sb1, sb2, sc1, sc2) -> tuple:
    """TMA_CONFIGS when this GEMM can take the TMA kernel, else (): fp16/bf16 on an sm_90+ GPU,
    one batch, unit-stride rows (A along k, B along k or n, C along n), 16-byte aligned bases
    and row strides, and at least MIN_MACS multiply-adds."""
    if TensorDescriptor is None or interpreting() or batch != 1:
        return ()
    if a.dtype not in (torch.float16, torch.bfloat16) or M * N * K < MIN_MACS:
        return ()
    if sa2 != 1 or sc2 != 1 or (sb1 != 1 and sb2 != 1):
        return ()
    b_row_stride = sb1 if sb2 == 1 else sb2
    if not (_aligned(a.data_ptr(), sa1) and _aligned(b.data_ptr(), b_row_stride)):
        return ()
    if not _aligned(c.data_ptr(), sc1) or _capability_major(a.device) < 9:
        return ()
    return TMA_CONFIGS


_launcher = KernelLauncher(gemm_tma_kernel)


def launch_tma(cfg, a, b, bias, c, M, N, K, sa1, sb1, sb2, sc1, activation, sms):
    """One launch of gemm_tma_kernel with config ``cfg`` (an entry of TMA_CONFIGS), through
    KernelLauncher: after the first call of a key, the CompiledKernel is launched directly
    (``kernel[grid]`` costs 20-30 us of host time a call on Triton 3.6; the three descriptors are
    still built per call)."""
    _, bm, bn, bk, group, stages, warps, per_sm, sub, fast = cfg
    b_nk = sb2 != 1  # B (K, N) viewed from an (N, K) row-major weight
    a_desc = TensorDescriptor(a, [M, K], [sa1, 1], [bm, bk])
    if b_nk:
        b_desc = TensorDescriptor(b, [N, K], [sb2, 1], [bn, bk])
    else:
        b_desc = TensorDescriptor(b, [K, N], [sb1, 1], [bk, bn])
    c_desc = TensorDescriptor(c, [M, N], [sc1, 1], [bm, bn // sub])
    tiles = cdiv(M, bm) * cdiv(N, bn)
    has_bias = bias is not None
    bias_arg = bias if has_bias else c
    # Everything Triton could specialize this launch on, more than it needs: each descriptor's
    # dtype and block (cfg, dtypes, b_nk: all a host descriptor is specialized on, Triton 3.6 and
    # 3.9), how each size and row stride divides (int_spec), the bias pointer (alignment, dtype)
    # and M, N, K.
    key = (
        cfg, a.dtype, b.dtype, c.dtype, b_nk, has_bias, activation, int_spec(M), int_spec(N),
        int_spec(K), int_spec(sa1), int_spec(sb1), int_spec(sb2), int_spec(sc1),
        ptr_spec(bias_arg), bias_arg.dtype,
    )  # fmt: skip
    args = (
        a_desc, b_desc, c_desc, bias_arg, M, N, K,
        has_bias, activation, fast, b_nk, bm, bn, bk, group, sub,
    )  # fmt: skip
    _launcher.launch(key, (min(tiles, per_sm * sms), 1, 1), args, warps, stages)
