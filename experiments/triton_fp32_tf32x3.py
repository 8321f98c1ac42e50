"""Issue 14, fp32 with TF32 off: can Triton's tl.dot(input_precision="tf32x3") (each fp32 operand
split into a TF32 high part and a TF32 remainder, three tensor-core products) stand in for the
exact-fp32 CUDA-core path? Per shape: the time of the best of a few configs against cuBLAS SGEMM
(torch, allow_tf32 False), and the max abs error against a float64 reference next to cuBLAS's
own, judged by dualk's GEMM rule (<= 2x PyTorch's max error + 4 ulp of max |ref|). Accumulation
as dualk's exact-fp32 Triton path does it: a fresh tl.dot per BLOCK_K, added to the running sum
(FRESH), or chained through tl.dot's accumulator; "dualk" is dualk's own split
(triton_src.matmul.split_tf32 via accumulate_dot), "dualk-chained" the same split with all three
products chained into the running sum. Also: what inf, inf * 0 and FLT_MAX in A become.
Session 17's H200 files: in `-s17-chained.txt` "dualk" was a cvt.rna.satfinite (inline PTX)
split, in `-s17.txt` "dualk" is that one and "dualk-clamped" today's split_tf32.

    python3 experiments/triton_fp32_tf32x3.py [--json PATH]      # on a GPU
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from dualk.tools.bench import time_device
from dualk.triton_src.matmul import accumulate_dot, split_tf32


@triton.jit
def _mm(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
        PREC: tl.constexpr, FRESH: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    group = pid // (GROUP * num_n)
    first_m = group * GROUP
    rows = min(num_m - first_m, GROUP)
    pid_m = first_m + (pid % (GROUP * num_n)) % rows
    pid_n = (pid % (GROUP * num_n)) // rows
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    a_ptrs = a_ptr + offs_m[:, None] * sam + offs_k[None, :] * sak
    b_ptrs = b_ptr + offs_k[:, None] * sbk + offs_n[None, :] * sbn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        k_left = K - k * BK
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
        if PREC == "dualk":  # dualk's own split (triton_src.matmul.split_tf32), block sums apart
            acc = accumulate_dot(acc, a, b, "tf32x3")
        elif PREC == "dualk-chained":  # the same split, every product into the running sum
            a_hi, a_lo = split_tf32(a)
            b_hi, b_lo = split_tf32(b)
            acc = tl.dot(a_lo, b_hi, acc, input_precision="tf32")
            acc = tl.dot(a_hi, b_lo, acc, input_precision="tf32")
            acc = tl.dot(a_hi, b_hi, acc, input_precision="tf32")
        elif FRESH:
            acc += tl.dot(a, b, input_precision=PREC)
        else:
            acc = tl.dot(a, b, acc, input_precision=PREC)
        a_ptrs += BK * sak
        b_ptrs += BK * sbk
    c_ptrs = c_ptr + offs_m[:, None] * scm + offs_n[None, :] * scn
    tl.store(c_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


CONFIGS = [  # BM, BN, BK, stages, warps
    (128, 128, 32, 3, 4),
    (128, 128, 32, 3, 8),
    (128, 256, 32, 3, 8),
    (256, 128, 32, 3, 8),
    (128, 64, 32, 4, 4),
    (64, 128, 32, 4, 4),
]


def run(a, b, c, cfg, prec, fresh):
    BM, BN, BK, stages, warps = cfg
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
    _mm[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
              c.stride(1), BM, BN, BK, 8, prec, fresh, num_stages=stages, num_warps=warps)  # fmt: skip
    return c


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = [  # (label, M, K, N, B k-major)
        ("4096^3 B(k,n)", 4096, 4096, 4096, False),
        ("4096^3 B=W^T", 4096, 4096, 4096, True),
        ("8192x768->3072 x@W^T", 8192, 768, 3072, True),
        ("1024^3", 1024, 1024, 1024, False),
        ("2048x16384x2048 (long k)", 2048, 16384, 2048, False),
    ]
    rows = []
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    for label, M, K, N, kmaj in shapes:
        a = torch.randn((M, K), device="cuda", generator=gen)
        b = (torch.randn((N, K), device="cuda", generator=gen).t() if kmaj
             else torch.randn((K, N), device="cuda", generator=gen))  # fmt: skip
        ref = a.double() @ b.double()
        scale = ref.abs().max().item()
        ulp = torch.finfo(torch.float32).eps * 2.0 ** torch.tensor(scale).log2().floor().item()
        torch_out = a @ b
        torch_err = (torch_out.double() - ref).abs().max().item()
        budget = 2 * torch_err + 4 * ulp
        torch_us = time_device(lambda: a @ b)[0]
        row = {"shape": label, "cublas_us": torch_us, "cublas_err": torch_err, "budget": budget}
        c = torch.empty((M, N), device="cuda")
        for prec, fresh in (
            ("tf32x3", True),
            ("dualk", True),
            ("dualk-chained", True),
            ("ieee", True),
        ):
            best = None
            for cfg in CONFIGS:
                try:
                    c.fill_(float("nan"))
                    run(a, b, c, cfg, prec, fresh)
                    torch.cuda.synchronize()
                    err = (c.double() - ref).abs().max().item()
                    us = time_device(lambda: run(a, b, c, cfg, prec, fresh))[0]
                except Exception as exc:  # noqa: BLE001 - a config that does not fit
                    print(f"  {label} {prec} fresh={fresh} {cfg}: {type(exc).__name__}")
                    continue
                if best is None or us < best[0]:
                    best = (us, err, cfg)
            if best is None:
                continue
            us, err, cfg = best
            key = f"{prec}{'-fresh' if fresh else '-chained'}"
            row[key] = {"us": us, "err": err, "cfg": cfg}
            verdict = "ok" if err <= budget else "OVER BUDGET"
            print(f"{label}: {key} {us:.1f} us ({torch_us / us:.2f}x cuBLAS {torch_us:.1f}), err {err:.2e} "
                  f"(cuBLAS {torch_err:.2e}, budget {budget:.2e}) {verdict}  cfg {cfg}")  # fmt: skip
        rows.append(row)
    # Special values: an inf in A's first row (cuBLAS: +-inf or nan along that row).
    a = torch.randn((256, 256), device="cuda", generator=gen)
    b = torch.randn((256, 256), device="cuda", generator=gen)
    a[0, 3] = float("inf")
    a[1, 5] = torch.finfo(torch.float32).max  # finite, but cvt.rna rounds it into inf
    b[5, :] = b[5, :].clamp(-0.9, 0.9)  # so that row 1 stays finite
    b[3, 7] = 0.0  # inf * 0: NaN in column 7 of row 0
    c = torch.empty((256, 256), device="cuda")
    want = a @ b
    for prec in ("tf32x3", "dualk"):
        run(a, b, c, CONFIGS[0], prec, True)
        for row in (0, 1):
            same = ((c.isnan() == want.isnan()) & (c.isposinf() == want.isposinf())
                    & (c.isneginf() == want.isneginf()))[row]  # fmt: skip
            print(f"{prec}: special value in row {row}: matches cuBLAS's inf/nan pattern in {int(same.sum())} of "
                  f"256 columns ({prec} nan: {int(c[row].isnan().sum())}, inf: {int(c[row].isinf().sum())}; "
                  f"cuBLAS nan: {int(want[row].isnan().sum())}, inf: {int(want[row].isinf().sum())})")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
