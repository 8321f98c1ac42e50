"""Sweep of TMA / persistent / epilogue variants for dualk's Triton linear_gelu (and the same
kernel with the epilogue off, as a plain matmul), against PyTorch's paths in the same run.

    python3 experiments/linear_gelu_sweep.py [--out sweep.json] [--quick]
    TRITON_INTERPRET=1 python3 experiments/linear_gelu_sweep.py --cpu-check

GPU run: linear_gelu bf16 (x @ w.T + b, tanh GELU) at (M, K, N) = (8192, 768, 3072) and
(4096, 4096, 16384), then bf16 / fp16 matmul 4096^3 and 8192^3 for the best variants. Every
result is checked against a float64 reference first: max|out - ref| / max|ref| must be within
2x cuBLAS's own error in the same dtype plus one ulp of max|ref| in that dtype ("ok"); the
repo's test gate, 2x cuBLAS's error alone, is printed as "strict". Times are
triton.testing.do_bench medians (L2 flushed before each call). Needs Triton >= 3.4
(tensor descriptors); written for 3.6 (the H200) and 3.9 (this repo's CPU venv).

--cpu-check: every variant at M=37, K=80, N=48 in fp32 and bf16 under TRITON_INTERPRET=1
(inline-asm activations fall back to the exp2 form there, as in triton_src/common.py).

Variant names: tma_<grid>_<BMxBNxBK>_s<stages>_w<warps>_e<epilogue subtiles>_a<act level>
[_nf: tile loop not flattened][_ws: warp_specialize][_dev: in-kernel descriptors]. grid p1 / p2:
persistent with 1 or 2 programs per SM; np: one program per tile. act level (16-bit outputs):
2 = ex2.approx + rcp.approx (dualk today), 3 = tanh.approx.f32, 4 = tanh.approx.bf16x2.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from triton_src.common import (  # noqa: E402
    PRECISE_MATH,
    apply_activation,
    grouped_tile,
    interpreting,
    num_sms,
)

from triton_src.gemm_tma import _tanh_approx_f32  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

HAS_DEVICE_DESC = hasattr(tl, "make_tensor_descriptor")


# --- Kernels ---------------------------------------------------------------------------------


@triton.jit
def _tanh_approx_bf16x2(x):
    """tanh of two bf16 values per MUFU op (sm_90+); bf16 input, bf16 out (about 2^-8)."""
    return tl.inline_asm_elementwise(
        "tanh.approx.bf16x2 $0, $1;", "=r,r", [x], dtype=tl.bfloat16, is_pure=True, pack=2
    )


@triton.jit
def _epilogue(acc, bias_ptr, offs_n, N, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
              FAST_ACT: tl.constexpr):  # fmt: skip
    """bias + activation on an fp32 (BM, BN) block. FAST_ACT 3 / 4 (gelu_tanh only, GPU only):
    gelu = h + h * tanh(z), h = x / 2, with tanh from one MUFU op; the interpreter, which cannot
    run PTX, takes common.apply_activation's FAST=1 form instead."""
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    if ACTIVATION == 2 and FAST_ACT >= 3 and PRECISE_MATH:
        # z = sqrt(2/pi) * (x + 0.044715 x^3) = x * (c0 + c1 x^2)
        z = acc * (0.7978845608028654 + 0.035677408136300125 * acc * acc)
        h = 0.5 * acc
        if FAST_ACT == 3:
            t = _tanh_approx_f32(z)
        else:
            t = _tanh_approx_bf16x2(z.to(tl.bfloat16)).to(tl.float32)
        acc = h + h * t
    else:
        acc = apply_activation(acc, ACTIVATION, 1 if FAST_ACT >= 3 else FAST_ACT)
    return acc


@triton.jit
def _store_tile(c_desc, acc, bias_ptr, off_m, off_n, N, HAS_BIAS: tl.constexpr,
                ACTIVATION: tl.constexpr, FAST_ACT: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                EPI_SUBTILE: tl.constexpr):  # fmt: skip
    """Epilogue and TMA store of one (BM, BN) fp32 tile in EPI_SUBTILE column slices (1, 2, 4):
    smaller slices keep fewer fp32 temporaries live at once and need a smaller smem staging
    buffer (the c_desc block is (BM, BN / EPI_SUBTILE))."""
    dtype = c_desc.dtype
    if EPI_SUBTILE == 1:
        offs_n = off_n + tl.arange(0, BLOCK_SIZE_N)
        c = _epilogue(acc, bias_ptr, offs_n, N, HAS_BIAS, ACTIVATION, FAST_ACT)
        c_desc.store([off_m, off_n], c.to(dtype))
    elif EPI_SUBTILE == 2:
        HALF: tl.constexpr = BLOCK_SIZE_N // 2
        acc3 = tl.permute(tl.reshape(acc, (acc.shape[0], 2, HALF)), (0, 2, 1))
        acc0, acc1 = tl.split(acc3)
        offs0 = off_n + tl.arange(0, HALF)
        c0 = _epilogue(acc0, bias_ptr, offs0, N, HAS_BIAS, ACTIVATION, FAST_ACT)
        c_desc.store([off_m, off_n], c0.to(dtype))
        c1 = _epilogue(acc1, bias_ptr, offs0 + HALF, N, HAS_BIAS, ACTIVATION, FAST_ACT)
        c_desc.store([off_m, off_n + HALF], c1.to(dtype))
    else:
        tl.static_assert(EPI_SUBTILE == 4)
        HALF: tl.constexpr = BLOCK_SIZE_N // 2
        QUARTER: tl.constexpr = BLOCK_SIZE_N // 4
        acc3 = tl.permute(tl.reshape(acc, (acc.shape[0], 2, HALF)), (0, 2, 1))
        left, right = tl.split(acc3)
        l3 = tl.permute(tl.reshape(left, (acc.shape[0], 2, QUARTER)), (0, 2, 1))
        q0, q1 = tl.split(l3)
        r3 = tl.permute(tl.reshape(right, (acc.shape[0], 2, QUARTER)), (0, 2, 1))
        q2, q3 = tl.split(r3)
        offs = off_n + tl.arange(0, QUARTER)
        c0 = _epilogue(q0, bias_ptr, offs, N, HAS_BIAS, ACTIVATION, FAST_ACT)
        c_desc.store([off_m, off_n], c0.to(dtype))
        c1 = _epilogue(q1, bias_ptr, offs + QUARTER, N, HAS_BIAS, ACTIVATION, FAST_ACT)
        c_desc.store([off_m, off_n + QUARTER], c1.to(dtype))
        c2 = _epilogue(q2, bias_ptr, offs + HALF, N, HAS_BIAS, ACTIVATION, FAST_ACT)
        c_desc.store([off_m, off_n + HALF], c2.to(dtype))
        c3 = _epilogue(q3, bias_ptr, offs + HALF + QUARTER, N, HAS_BIAS, ACTIVATION, FAST_ACT)
        c_desc.store([off_m, off_n + HALF + QUARTER], c3.to(dtype))


@triton.jit
def _gemm_tma_body(a_desc, b_desc, c_desc, bias_ptr, M, N, K,
                   HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, FAST_ACT: tl.constexpr,
                   B_NK: tl.constexpr, DOT_IN_FP32: tl.constexpr,
                   BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                   BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
                   EPI_SUBTILE: tl.constexpr, FLATTEN: tl.constexpr,
                   WARP_SPECIALIZE: tl.constexpr):  # fmt: skip
    """Persistent tile loop: program p runs tiles p, p + num_programs, ... (one tile when the
    grid has a program per tile). With FLATTEN the tile and K loops are pipelined as one loop,
    so the next tile's TMA loads are issued while this tile's epilogue runs. TMA zero-fills
    out-of-bounds rows / columns / K and clips the store, so there are no masks.
    The epilogue's tile index is a second counter (tile_id_c), as in Triton's persistent-matmul
    tutorial, whose pipeliner mishandled a value used in both the prologue and the epilogue."""
    start = tl.program_id(axis=0)
    num_programs = tl.num_programs(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_SIZE_K)
    tile_id_c = start - num_programs
    for tile_id in tl.range(start, num_tiles, num_programs, flatten=FLATTEN,
                            warp_specialize=WARP_SPECIALIZE):  # fmt: skip
        pid_m, pid_n = grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M)
        off_m = pid_m * BLOCK_SIZE_M
        off_n = pid_n * BLOCK_SIZE_N
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for ki in range(k_tiles):
            off_k = ki * BLOCK_SIZE_K
            a = a_desc.load([off_m, off_k])
            if B_NK:  # noqa: SIM108  nn.Linear weight (N, K): K-major B, transposed in smem by wgmma
                b = b_desc.load([off_n, off_k]).T
            else:
                b = b_desc.load([off_k, off_n])
            if DOT_IN_FP32:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc)
        tile_id_c += num_programs
        pid_m, pid_n = grouped_tile(tile_id_c, num_pid_m, num_pid_n, GROUP_SIZE_M)
        _store_tile(c_desc, acc, bias_ptr, pid_m * BLOCK_SIZE_M, pid_n * BLOCK_SIZE_N, N,
                    HAS_BIAS, ACTIVATION, FAST_ACT, BLOCK_SIZE_N, EPI_SUBTILE)  # fmt: skip


@triton.jit
def gemm_tma_kernel(a_desc, b_desc, c_desc, bias_ptr, M, N, K,
                    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, FAST_ACT: tl.constexpr,
                    B_NK: tl.constexpr, DOT_IN_FP32: tl.constexpr,
                    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                    BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
                    EPI_SUBTILE: tl.constexpr, FLATTEN: tl.constexpr,
                    WARP_SPECIALIZE: tl.constexpr):  # fmt: skip
    """Host-side descriptors (triton.tools.tensor_descriptor.TensorDescriptor): A (M, K),
    B (N, K) if B_NK else (K, N), C (M, N) with block (BM, BN / EPI_SUBTILE); bias (N,)."""
    _gemm_tma_body(a_desc, b_desc, c_desc, bias_ptr, M, N, K, HAS_BIAS, ACTIVATION, FAST_ACT,
                   B_NK, DOT_IN_FP32, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M,
                   EPI_SUBTILE, FLATTEN, WARP_SPECIALIZE)  # fmt: skip


@triton.jit
def gemm_tma_dev_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K, stride_am, stride_b, stride_cm,
                        HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
                        FAST_ACT: tl.constexpr, B_NK: tl.constexpr, DOT_IN_FP32: tl.constexpr,
                        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                        BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
                        EPI_SUBTILE: tl.constexpr, FLATTEN: tl.constexpr,
                        WARP_SPECIALIZE: tl.constexpr):  # fmt: skip
    """In-kernel descriptors (tl.make_tensor_descriptor; needs triton.set_allocator for the
    descriptors' global scratch): no host-side descriptor objects per call. Unit inner strides;
    stride_b is B's row stride (N, K) if B_NK else (K, N)."""
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1],
                                       block_shape=[BLOCK_SIZE_M, BLOCK_SIZE_K])  # fmt: skip
    if B_NK:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_b, 1],
                                           block_shape=[BLOCK_SIZE_N, BLOCK_SIZE_K])  # fmt: skip
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_b, 1],
                                           block_shape=[BLOCK_SIZE_K, BLOCK_SIZE_N])  # fmt: skip
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1],
                                       block_shape=[BLOCK_SIZE_M, BLOCK_SIZE_N // EPI_SUBTILE])  # fmt: skip
    _gemm_tma_body(a_desc, b_desc, c_desc, bias_ptr, M, N, K, HAS_BIAS, ACTIVATION, FAST_ACT,
                   B_NK, DOT_IN_FP32, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M,
                   EPI_SUBTILE, FLATTEN, WARP_SPECIALIZE)  # fmt: skip


# --- Variants and launch -------------------------------------------------------------------

# A variant: dict(grid, bm, bn, bk, stages, warps, sub, act, flatten, ws, dev, group).
# grid: 1 / 2 = persistent with that many programs per SM; 0 = one program per tile.


def V(grid, bm, bn, bk, stages, warps, sub, act, flatten=True, ws=False, dev=False, group=8):
    return dict(grid=grid, bm=bm, bn=bn, bk=bk, stages=stages, warps=warps, sub=sub, act=act,
                flatten=flatten, ws=ws, dev=dev, group=group)  # fmt: skip


def vname(v) -> str:
    g = {0: "np", 1: "p1", 2: "p2"}[v["grid"]]
    s = f"tma_{g}_{v['bm']}x{v['bn']}x{v['bk']}_s{v['stages']}_w{v['warps']}_e{v['sub']}_a{v['act']}"
    s += "" if v["flatten"] else "_nf"
    s += "_ws" if v["ws"] else ""
    s += "_dev" if v["dev"] else ""
    s += "" if v["group"] == 8 else f"_g{v['group']}"
    return s


# About 20 compiles at 3-5 s each plus timing keeps the GPU run near 3 minutes. Shared memory
# per stage: (BM + BN) * BK * 2 bytes = 48 KiB at 128x256x64, 32 KiB at 128x128x64; plus the
# C staging buffer BM * BN / sub * 2 bytes. A config that does not fit fails to compile and is
# reported as such.
LG_VARIANTS = [
    # The tutorial-09 shape: persistent, flattened, one program per SM.
    V(1, 128, 256, 64, 3, 8, 1, 2),
    V(1, 128, 256, 64, 3, 8, 2, 2),
    V(1, 128, 256, 64, 3, 8, 1, 3),
    V(1, 128, 256, 64, 3, 8, 2, 3),
    V(1, 128, 256, 64, 3, 8, 4, 3),
    V(1, 128, 256, 64, 4, 8, 2, 3),
    V(1, 128, 256, 64, 3, 8, 2, 3, flatten=False),
    V(1, 128, 256, 64, 3, 8, 2, 4),
    V(1, 128, 256, 64, 3, 8, 2, 3, dev=True),
    V(1, 256, 128, 64, 3, 8, 2, 3),
    V(1, 128, 128, 64, 4, 4, 1, 3),
    V(1, 128, 128, 64, 5, 8, 2, 3),
    # Two programs per SM: one program's epilogue overlaps the other's main loop (the reason
    # 128x128x64 / 4 warps / non-persistent wins in dualk today). 2 x (3 x 32 + 16) KiB fits.
    V(2, 128, 128, 64, 3, 4, 2, 3),
    V(2, 128, 128, 64, 3, 8, 2, 3),
    V(0, 128, 128, 64, 3, 4, 2, 3),
    V(0, 128, 128, 64, 4, 4, 1, 3),
    V(0, 128, 256, 64, 3, 8, 2, 3),
    # Warp specialization (producer warp + consumer warp groups) if Triton's Hopper pass
    # accepts this loop nest; a compile failure here is an answer too.
    V(1, 128, 256, 64, 3, 8, 2, 3, ws=True),
    V(1, 128, 256, 64, 3, 8, 2, 3, flatten=False, ws=True),
    V(1, 128, 128, 64, 4, 4, 1, 3, ws=True),
    V(1, 128, 128, 64, 4, 8, 2, 3, ws=True),
]

# Extra matmul candidates (epilogue off) besides the best linear_gelu variants.
MM_EXTRA = [
    V(1, 128, 256, 64, 3, 8, 2, 0),
    V(1, 128, 256, 64, 4, 8, 2, 0),
    V(0, 128, 256, 64, 3, 8, 2, 0),
    V(1, 128, 256, 64, 3, 8, 2, 0, ws=True),
]

# Tiny tiles for the interpreter (tl.dot needs 16 in each dimension).
CPU_TILES = dict(bm=32, bn=32, bk=32, stages=1, warps=4)

_desc_cache: dict = {}


def _allocator(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def make_launch(v, a, b, bias, c, activation: int, b_nk: bool):
    """A no-argument closure that writes act(a @ B + bias) into c with variant v; B is b.T when
    b_nk (b is an nn.Linear weight (N, K)) else b (K, N). Descriptors are built here, outside
    the timed call."""
    M, K = a.shape
    N = c.shape[1]
    bm, bn, bk, sub = v["bm"], v["bn"], v["bk"], v["sub"]
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    progs = tiles if v["grid"] == 0 else min(tiles, v["grid"] * num_sms(a.device))
    grid = (progs,)
    dtype = a.dtype
    fast = 0 if dtype == torch.float32 else v["act"]
    if fast == 4 and dtype != torch.bfloat16:
        fast = 3
    dot_fp32 = dtype == torch.bfloat16 and interpreting()
    consts = dict(
        HAS_BIAS=bias is not None, ACTIVATION=activation, FAST_ACT=fast, B_NK=b_nk,
        DOT_IN_FP32=dot_fp32, BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk,
        GROUP_SIZE_M=v["group"], EPI_SUBTILE=sub, FLATTEN=v["flatten"],
        WARP_SPECIALIZE=v["ws"], num_warps=v["warps"], num_stages=v["stages"],
    )  # fmt: skip
    bias_arg = bias if bias is not None else c
    if v["dev"]:

        def run():
            gemm_tma_dev_kernel[grid](
                a, b, c, bias_arg, M, N, K, a.stride(0), b.stride(0), c.stride(0), **consts
            )

        return run
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(b, [bn, bk] if b_nk else [bk, bn])
    c_desc = TensorDescriptor.from_tensor(c, [bm, bn // sub])

    def run():
        gemm_tma_kernel[grid](a_desc, b_desc, c_desc, bias_arg, M, N, K, **consts)

    return run


# --- Measurement helpers ---------------------------------------------------------------------

_DO_BENCH_MEDIAN = "return_mode" in inspect.signature(triton.testing.do_bench).parameters


def bench_us(fn) -> float:
    """do_bench median in microseconds (L2 flushed before each call)."""
    if _DO_BENCH_MEDIAN:
        ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    else:
        ms = triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=[0.5])
    if isinstance(ms, (list, tuple)):
        ms = ms[0]
    return ms * 1e3


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


def ulp_rel(ref: torch.Tensor, dtype: torch.dtype) -> float:
    """One ulp of max|ref| in ``dtype``, relative to max|ref| (0 for fp32: no allowance)."""
    mant = {torch.bfloat16: 7, torch.float16: 10}.get(dtype)
    if mant is None:
        return 0.0
    m = ref.abs().max().item()
    return 2.0 ** (math.floor(math.log2(m)) - mant) / m


def judge(err: float, peer_err: float, ulp: float) -> tuple[bool, bool]:
    """(ok, strict): ok = within 2x the peer's error + 1 ulp of max|ref|; strict = within 2x
    the peer's error (dualk's test gate; 1e-6 absolute slack for exact fp32 peers)."""
    return err <= 2 * peer_err + ulp, err <= 2 * peer_err + 1e-6


def gelu_ref(x, w, b):
    """float64 gelu_tanh(x @ w.T + b) on x's device."""
    return F.gelu(torch.addmm(b.double(), x.double(), w.double().t()), approximate="tanh")


def make_inputs(M, K, N, dtype, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(M, K, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)
    w = (torch.randn(N, K, generator=g, dtype=torch.float32) / math.sqrt(K)).to(device, dtype)
    b = torch.randn(N, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)
    return x, w, b


# --- GPU sweep -------------------------------------------------------------------------------

LG_SHAPES = [(8192, 768, 3072), (4096, 4096, 16384)]
MM_SHAPES = [4096, 8192]
RESULTS: dict = {"linear_gelu": {}, "matmul": {}}


def log(s=""):
    print(s, flush=True)


def run_lg(variants, quick: bool):
    dev = torch.device("cuda")
    dtype = torch.bfloat16
    for M, K, N in LG_SHAPES:
        key = f"{M}x{K}x{N}"
        res = RESULTS["linear_gelu"].setdefault(key, {})
        x, w, b = make_inputs(M, K, N, dtype, dev)
        ref = gelu_ref(x, w, b)
        ulp = ulp_rel(ref, dtype)
        flops = 2.0 * M * N * K

        peers = {
            "cublaslt_addmm_act": lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True),
            "eager": lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
            "torch_mm": lambda: torch.mm(x, w.t()),
        }
        lt_err = rel_err(peers["cublaslt_addmm_act"](), ref)
        log(f"\n== linear_gelu bf16 {key}: cuBLASLt err {lt_err:.2e}, 1 ulp {ulp:.2e}")
        for name, fn in peers.items():
            us = bench_us(fn)
            err = rel_err(fn(), ref) if name != "torch_mm" else None
            res[name] = dict(us=us, tflops=flops / us * 1e-6, err=err, ok=True, peer=True)
            log(f"  {name:44s} {us:9.1f} us  {flops / us * 1e-6:6.1f} TFLOP/s")

        # dualk's current kernel (autotuned on its first call; tuning runs outside the timing).
        try:
            from triton_src.linear_gelu import linear_gelu

            fn = lambda: linear_gelu(x, w, b, approximate="tanh", allow_tf32=False)  # noqa: E731
            out = fn()
            err = rel_err(out, ref)
            ok, strict = judge(err, lt_err, ulp)
            us = bench_us(fn)
            res["dualk_current"] = dict(us=us, tflops=flops / us * 1e-6, err=err, ok=ok,
                                        strict=strict)  # fmt: skip
            log(f"  {'dualk_current':44s} {us:9.1f} us  err {err:.2e} {'ok' if ok else 'FAIL'}")
        except Exception as e:  # noqa: BLE001
            res["dualk_current"] = dict(error=f"{type(e).__name__}: {e}"[:300])
            log(f"  dualk_current: {type(e).__name__}: {str(e)[:200]}")

        for v in variants:
            name = vname(v)
            c = torch.empty(M, N, dtype=dtype, device=dev)
            t0 = time.perf_counter()
            try:
                launch = make_launch(v, x, w, b, c, 2, True)
                c.fill_(float("nan"))
                launch()
                torch.cuda.synchronize()
                err = rel_err(c, ref)
                ok, strict = judge(err, lt_err, ulp)
                us = bench_us(launch) if ok or not quick else float("nan")
                res[name] = dict(us=us, tflops=flops / us * 1e-6, err=err, ok=ok, strict=strict,
                                 variant=v)  # fmt: skip
                log(f"  {name:44s} {us:9.1f} us  err {err:.2e} {'ok' if ok else 'FAIL'}"
                    f"{'' if strict else ' (not strict)'}  [{time.perf_counter() - t0:.1f}s]")  # fmt: skip
            except Exception as e:  # noqa: BLE001
                msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                res[name] = dict(error=msg, variant=v)
                log(f"  {name:44s} FAILED {msg}")
        torch.cuda.empty_cache()


def best_lg_variants(n: int):
    """The n variants with the lowest summed time over both shapes (passing both)."""
    scores = []
    by_shape = list(RESULTS["linear_gelu"].values())
    for v in LG_VARIANTS:
        name = vname(v)
        rows = [r.get(name, {}) for r in by_shape]
        if all(r.get("ok") and math.isfinite(r.get("us", float("nan"))) for r in rows):
            lt = [r["cublaslt_addmm_act"]["us"] for r in by_shape]
            scores.append((sum(row["us"] / t for row, t in zip(rows, lt)), v))
    scores.sort(key=lambda s: s[0])
    return [v for _, v in scores[:n]]


def run_mm(variants):
    dev = torch.device("cuda")
    for dtype in (torch.bfloat16, torch.float16):
        for S in MM_SHAPES:
            key = f"{str(dtype).split('.')[-1]} {S}^3"
            res = RESULTS["matmul"].setdefault(key, {})
            g = torch.Generator(device="cpu").manual_seed(1)
            a = torch.randn(S, S, generator=g).to(dev, dtype)
            bm = (torch.randn(S, S, generator=g) / math.sqrt(S)).to(dev, dtype)
            ref = a.double() @ bm.double()
            ulp = ulp_rel(ref, dtype)
            flops = 2.0 * S**3
            mm_err = rel_err(torch.mm(a, bm), ref)
            us = bench_us(lambda: torch.mm(a, bm))
            res["torch_mm"] = dict(us=us, tflops=flops / us * 1e-6, err=mm_err, peer=True)
            log(f"\n== matmul {key}: cuBLAS {us:.1f} us ({flops / us * 1e-6:.0f} TFLOP/s), "
                f"err {mm_err:.2e}")  # fmt: skip
            try:
                from triton_src.matmul import matmul

                fn = lambda: matmul(a, bm, allow_tf32=False)  # noqa: E731
                err = rel_err(fn(), ref)
                ok, strict = judge(err, mm_err, ulp)
                us = bench_us(fn)
                res["dualk_current"] = dict(us=us, tflops=flops / us * 1e-6, err=err, ok=ok,
                                            strict=strict)  # fmt: skip
                log(f"  {'dualk_current':44s} {us:9.1f} us  err {err:.2e}")
            except Exception as e:  # noqa: BLE001
                res["dualk_current"] = dict(error=f"{type(e).__name__}: {e}"[:300])
                log(f"  dualk_current: {type(e).__name__}: {str(e)[:200]}")
            for v in variants:
                name = vname(dict(v, act=0))
                c = torch.empty(S, S, dtype=dtype, device=dev)
                try:
                    launch = make_launch(v, a, bm, None, c, 0, False)
                    c.fill_(float("nan"))
                    launch()
                    torch.cuda.synchronize()
                    err = rel_err(c, ref)
                    ok, strict = judge(err, mm_err, ulp)
                    us = bench_us(launch) if ok else float("nan")
                    res[name] = dict(us=us, tflops=flops / us * 1e-6, err=err, ok=ok,
                                     strict=strict, variant=v)  # fmt: skip
                    log(f"  {name:44s} {us:9.1f} us  {flops / us * 1e-6:6.0f} TFLOP/s  "
                        f"err {err:.2e} {'ok' if ok else 'FAIL'}")  # fmt: skip
                except Exception as e:  # noqa: BLE001
                    msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                    res[name] = dict(error=msg, variant=v)
                    log(f"  {name:44s} FAILED {msg}")
            torch.cuda.empty_cache()


def print_table():
    log("\n" + "=" * 100)
    log("linear_gelu bf16: us (speed-up vs cuBLASLt addmm_activation / vs eager), err")
    shapes = list(RESULTS["linear_gelu"])
    names = []
    for r in RESULTS["linear_gelu"].values():
        names += [n for n in r if n not in names]
    log(f"{'variant':46s}" + "".join(f"{s:>34s}" for s in shapes))
    for n in names:
        cells = []
        for s in shapes:
            r = RESULTS["linear_gelu"][s].get(n, {})
            lt = RESULTS["linear_gelu"][s]["cublaslt_addmm_act"]["us"]
            ea = RESULTS["linear_gelu"][s]["eager"]["us"]
            if "us" not in r or not math.isfinite(r["us"]):
                cells.append(f"{'error' if 'error' in r else ('FAIL' if r else '-'):>34s}")
                continue
            flag = "" if r.get("ok", True) else " FAIL"
            cells.append(f"{r['us']:8.1f} ({lt / r['us']:.3f}x / {ea / r['us']:.2f}x){flag:>5s}")
        log(f"{n:46s}" + "".join(f"{c:>34s}" for c in cells))
    if RESULTS["matmul"]:
        log("\nmatmul (epilogue off): us (speed-up vs torch.mm)")
        shapes = list(RESULTS["matmul"])
        names = []
        for r in RESULTS["matmul"].values():
            names += [n for n in r if n not in names]
        log(f"{'variant':46s}" + "".join(f"{s:>22s}" for s in shapes))
        for n in names:
            cells = []
            for s in shapes:
                r = RESULTS["matmul"][s].get(n, {})
                base = RESULTS["matmul"][s]["torch_mm"]["us"]
                if "us" not in r or not math.isfinite(r["us"]):
                    cells.append(f"{'error' if 'error' in r else '-':>22s}")
                    continue
                flag = "" if r.get("ok", True) else " FAIL"
                cells.append(f"{r['us']:8.1f} ({base / r['us']:.3f}x){flag}")
            log(f"{n:46s}" + "".join(f"{c:>22s}" for c in cells))
    log("Failed compiles / launches:")
    for op in RESULTS:
        for s, rows in RESULTS[op].items():
            for n, r in rows.items():
                if "error" in r:
                    log(f"  {op} {s} {n}: {r['error']}")


# --- CPU (interpreter) check -----------------------------------------------------------------


def cpu_check() -> bool:
    """Every variant (tiles shrunk to CPU_TILES, launch options kept) at M=37, K=80, N=48 in fp32
    and bf16, linear_gelu (B = weight.T) and plain matmul (B row-major)."""
    assert interpreting(), "run with TRITON_INTERPRET=1"
    M, K, N = 37, 80, 48
    all_ok = True
    seen = set()
    for v0 in LG_VARIANTS + MM_EXTRA:
        v = dict(v0, **CPU_TILES)
        v["sub"] = min(v["sub"], 2)  # 32 / 4 = 8-wide slices are below TMA's 16-byte box
        k = vname(v)
        if k in seen:
            continue
        seen.add(k)
        for dtype in (torch.float32, torch.bfloat16):
            x, w, b = make_inputs(M, K, N, dtype, "cpu", seed=3)
            ref = gelu_ref(x, w, b)
            peer = F.gelu(F.linear(x, w, b).float(), approximate="tanh").to(dtype)
            peer_err = rel_err(peer, ref)
            c = torch.full((M, N), float("nan"), dtype=dtype)
            try:
                make_launch(v, x, w, b, c, 2, True)()
                err = rel_err(c, ref)
                ok, _ = judge(err, peer_err, ulp_rel(ref, dtype))
                # matmul form: B (K, N) row-major, no bias, no activation
                wt = w.t().contiguous()
                c2 = torch.full((M, N), float("nan"), dtype=dtype)
                make_launch(v, x, wt, None, c2, 0, False)()
                mref = x.double() @ wt.double()
                merr = rel_err(c2, mref)
                mok, _ = judge(merr, rel_err(x @ wt, mref), ulp_rel(mref, dtype))
                ok = ok and mok
                log(f"  {k:44s} {str(dtype):15s} lg err {err:.2e} (torch {peer_err:.2e}) "
                    f"mm err {merr:.2e}  {'ok' if ok else 'FAIL'}")  # fmt: skip
            except Exception as e:  # noqa: BLE001
                ok = False
                log(f"  {k:44s} {str(dtype):15s} ERROR {type(e).__name__}: {e}")
                traceback.print_exc()
            all_ok &= ok
    return all_ok


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="write results as JSON here")
    p.add_argument("--cpu-check", action="store_true", help="interpreter check on tiny shapes")
    p.add_argument("--quick", action="store_true", help="skip timing of failing variants")
    p.add_argument("--only", default="", help="comma-separated substrings of variant names")
    p.add_argument("--mm-best", type=int, default=3, help="best linear_gelu variants for matmul")
    args = p.parse_args()
    log(f"Triton {triton.__version__}, torch {torch.__version__}, "
        f"device descriptors {'yes' if HAS_DEVICE_DESC else 'no'}")  # fmt: skip
    if args.cpu_check:
        ok = cpu_check()
        log("cpu-check: " + ("all ok" if ok else "FAILURES"))
        sys.exit(0 if ok else 1)

    assert torch.cuda.is_available(), "the sweep needs a GPU (or --cpu-check)"
    log(f"device {torch.cuda.get_device_name()}, {num_sms(torch.device('cuda'))} SMs")
    if hasattr(triton, "set_allocator"):
        triton.set_allocator(_allocator)
    variants = LG_VARIANTS
    if args.only:
        keys = args.only.split(",")
        variants = [v for v in variants if any(k in vname(v) for k in keys)]
    t0 = time.perf_counter()
    run_lg(variants, args.quick)
    log(f"[linear_gelu sweep {time.perf_counter() - t0:.0f}s]")
    mm = []
    for v in best_lg_variants(args.mm_best) + MM_EXTRA:
        if vname(dict(v, act=0)) not in [vname(dict(u, act=0)) for u in mm]:
            mm.append(v)
    run_mm(mm)
    log(f"[total {time.perf_counter() - t0:.0f}s]")
    print_table()
    if args.out:
        meta = dict(triton=triton.__version__, torch=torch.__version__,
                    device=torch.cuda.get_device_name(), seconds=time.perf_counter() - t0)  # fmt: skip
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, **RESULTS), f, indent=1, default=str)
        log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
