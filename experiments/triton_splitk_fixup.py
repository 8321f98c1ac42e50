"""Experiment (issue 14, 128x8192x128): split-K in ONE Triton launch. Each program computes the
fp32 partial product of one k slice of one output tile into a workspace (splits, M, N), then
counts itself in on a per-tile counter (atomic, acq_rel); the last program of a tile sums the
tile's slices in slice order (so the result does not depend on which program came last: the same
bits every run), writes C and resets the counter to 0 for the next launch on the stream.

Prediction: dualk's split-K is two launches (partials, then a reduce kernel over the workspace);
with small tiles and few slices the fix-up reads little (32x32 tiles, 8 slices: 28 KB a tile), so
one launch saves the second kernel's launch gap and tail: 128x8192x128 bf16 from ~12.7 us
(Triton, H100) toward cuBLAS's ~11.

    python3 experiments/triton_splitk_fixup.py [--json PATH]   (GPU; TRITON_INTERPRET=1 on a CPU
                                                               checks correctness on small shapes)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@triton.jit
def splitk_fixup_kernel(
    a_ptr, b_ptr, c_ptr, ws_ptr, count_ptr, M, N, K, K_SLICE, stride_am, stride_bk, stride_cm,
    SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,  # the interpreter's bf16 dot is wrong (triton_src.common.dot_in_fp32)
):  # fmt: skip
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    tile = pid % tiles
    split = pid // tiles
    offs_m = (tile // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (tile % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    k0 = split * K_SLICE
    k_len = tl.minimum(K - k0, K_SLICE)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + (k0 + offs_k)[None, :]
    b_ptrs = b_ptr + (k0 + offs_k)[:, None] * stride_bk + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(k_len, BLOCK_K)):
        left = k_len - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < left) & (offs_n[None, :] < N), other=0.0)
        if DOT_IN_FP32:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * stride_bk
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ws_tile = ws_ptr + offs_m[:, None] * N + offs_n[None, :]
    tl.store(ws_tile + split * M * N, acc, mask=mask)
    tl.debug_barrier()  # every thread's partial is written before the count (release below)
    arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
    if arrived == SPLITS - 1:  # the last program of this tile: sum the slices in slice order
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in range(0, SPLITS):
            total += tl.load(ws_tile + s * M * N, mask=mask, other=0.0, cache_modifier=".cg")
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=mask)
        tl.atomic_xchg(count_ptr + tile, 0)  # ready for the next launch on this stream


def fixup_matmul(a, b, splits, block_m, block_n, block_k, warps, stages, counts=None):
    M, K = a.shape
    N = b.shape[1]
    k_slice = triton.cdiv(triton.cdiv(K, splits), block_k) * block_k
    splits = triton.cdiv(K, k_slice)
    tiles = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
    if counts is None:
        counts = torch.zeros(tiles, dtype=torch.int32, device=a.device)
    ws = torch.empty((splits, M, N), dtype=torch.float32, device=a.device)
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    splitk_fixup_kernel[(splits * tiles,)](
        a, b, c, ws, counts, M, N, K, k_slice, a.stride(0), b.stride(0), c.stride(0),
        SPLITS=splits, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        DOT_IN_FP32=os.environ.get("TRITON_INTERPRET") == "1", num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return c


# --grid: where one launch wins (M = N, K), with the configs that won at 128x8192x128.
GRID_SHAPES = [(mn, k, mn) for mn in (32, 64, 128, 256) for k in (2048, 4096, 8192, 16384, 32768)]
GRID_CONFIGS = [
    (8, 32, 32, 128, 4, 3),
    (16, 32, 32, 128, 4, 3),
    (32, 32, 32, 128, 4, 3),
    (8, 64, 64, 128, 4, 3),
]


def rel_err(out, ref) -> float:
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


CONFIGS = [  # (splits, block_m, block_n, block_k, warps, stages)
    *((s, 32, 32, 64, 4, 4) for s in (4, 8, 16)),
    *((s, 32, 64, 64, 4, 4) for s in (4, 8, 16)),
    *((s, 64, 64, 64, 4, 4) for s in (8, 16, 32)),
    *((s, 32, 32, 128, 4, 3) for s in (4, 8, 16)),
    *((s, 64, 64, 128, 4, 3) for s in (8, 16)),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--grid", action="store_true", help="GRID_SHAPES x GRID_CONFIGS, bf16")
    args = parser.parse_args()
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    dev = torch.device("cpu" if interpret else "cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    shapes = (
        [(48, 640, 40)] if interpret else [(128, 8192, 128), (256, 16384, 256), (64, 65536, 64)]
    )
    configs, dtypes = CONFIGS, (torch.bfloat16, torch.float16)
    if args.grid:
        shapes, configs, dtypes = GRID_SHAPES, GRID_CONFIGS, (torch.bfloat16,)
    rows = []
    for M, K, N in shapes:
        for dt in dtypes:
            a = torch.randn((M, K), device=dev, dtype=dt, generator=gen)
            b = torch.randn((K, N), device=dev, dtype=dt, generator=gen) / K**0.5
            ref = a.double() @ b.double()
            row = {"M": M, "K": K, "N": N, "dtype": str(dt)[6:]}
            if not interpret:
                from dualk.tools.bench import time_device
                from triton_src import matmul as mm

                row["torch_us"] = time_device(lambda: a @ b)[0]
                row["torch_err"] = rel_err(a @ b, ref)
                row["dualk_triton_us"] = time_device(lambda: mm.matmul(a, b, allow_tf32=False))[0]
            print(f"{M}x{K}x{N} {row['dtype']}: torch {row.get('torch_us', 0):.2f} us, dualk triton {row.get('dualk_triton_us', 0):.2f} us")  # fmt: skip
            for cfg in configs if not interpret else [(4, 16, 16, 32, 4, 1), (3, 32, 32, 64, 4, 1)]:
                tiles = triton.cdiv(M, cfg[1]) * triton.cdiv(N, cfg[2])
                counts = torch.zeros(tiles, dtype=torch.int32, device=dev)
                try:
                    out1 = fixup_matmul(a, b, *cfg, counts=counts)
                    out2 = fixup_matmul(a, b, *cfg, counts=counts)
                except Exception as e:  # noqa: BLE001 - a config that does not compile here
                    print(f"  {cfg}: {type(e).__name__}: {str(e)[:200]}")
                    continue
                entry = {
                    "config": list(cfg),
                    "err": rel_err(out1, ref),
                    "same_bits_twice": bool(torch.equal(out1, out2)),
                    "counts_reset": bool((counts == 0).all().item()),
                }
                if not interpret:
                    entry["us"] = time_device(lambda cfg=cfg, counts=counts: fixup_matmul(a, b, *cfg, counts=counts))[0]  # fmt: skip
                rows.append({**row, **entry})
                print(f"  splits {cfg[0]:>3} tile {cfg[1]}x{cfg[2]}x{cfg[3]} w{cfg[4]} s{cfg[5]}: {entry.get('us', 0):7.2f} us  err {entry['err']:.2e}  same bits {entry['same_bits_twice']}  counts reset {entry['counts_reset']}")  # fmt: skip
    if args.json:
        name = torch.cuda.get_device_name() if not interpret else "cpu"
        with open(args.json, "w") as f:
            json.dump({"device": name, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
