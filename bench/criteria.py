"""Checks the issues' "done when" performance criteria against a `dualk bench` JSON, printing one
line per criterion with the measured ratio; exits 1 when a timed result was wrong (a missed
target only prints MISS). Usage: python3 bench/criteria.py RESULTS.json"""

from __future__ import annotations

import json
import sys

WRONG = "wrong"  # us() of a row whose result failed its check


def main(path: str) -> int:
    with open(path) as f:
        data = json.load(f)
    rows = data["rows"]
    ceilings = data["ceilings"]

    def us(op, case, dtype, impl):
        for r in rows:
            if (
                r["op"] == op
                and r["case"] == case
                and r["dtype"] == dtype
                and r["impl"] == impl
                and r["us"]
            ):
                return r["us"] if r.get("ok") is not False else WRONG
        return None

    failed = wrong = 0

    def check(label, num, den, target, higher_is_better=True):
        nonlocal failed, wrong
        if num is WRONG or den is WRONG:
            print(f"  WRONG {label}: a timed result failed its correctness check")
            failed += 1
            wrong += 1
            return
        if num is None or den is None:
            print(f"  n/a   {label}: not measured")
            failed += 1
            return
        ratio = den / num  # speed ratio: peer time / ours
        ok = ratio >= target if higher_is_better else ratio <= target
        failed += not ok
        print(
            f"  {'PASS' if ok else 'MISS'}  {label}: {ratio:.2f}x (target {target}x; {num:.1f} us vs {den:.1f} us)"
        )

    print(
        f"{data['env'].get('gpu')} torch {data['env']['torch']} triton {data['env'].get('triton')} {data['env']['date']}"
    )
    print("issue 2 (add, relu_scale):")
    for case in ("n=2^24", "n=2^28"):
        for dt in ("float32", "bfloat16"):
            for b in ("cuda", "triton"):
                check(
                    f"add {case} {dt} {b} vs torch.add",
                    us("add", case, dt, f"dualk:{b}"),
                    us("add", case, dt, "torch eager"),
                    0.95,
                )
                ours = us("relu_scale", case, dt, f"dualk:{b}")
                check(
                    f"relu_scale {case} {dt} {b} vs eager",
                    ours,
                    us("relu_scale", case, dt, "torch eager relu(x)*s"),
                    1.9,
                )
                check(
                    f"relu_scale {case} {dt} {b} vs torch.compile",
                    ours,
                    us("relu_scale", case, dt, "torch.compile"),
                    0.95,
                )
    print("issue 3 (matmul, linear_gelu):")
    for case in ("4096^3", "8192^3"):
        for dt in ("bfloat16", "float16"):
            cublas = us("matmul", case, dt, "cuBLAS (torch.matmul)")
            check(
                f"matmul {case} {dt} triton vs cuBLAS",
                us("matmul", case, dt, "dualk:triton"),
                cublas,
                0.90,
            )
            check(
                f"matmul {case} {dt} cuda vs cuBLAS",
                us("matmul", case, dt, "dualk:cuda"),
                cublas,
                0.60,
            )
    cublas = us("matmul", "4096^3", "float32", "cuBLAS (torch.matmul)")
    check(
        "matmul 4096^3 fp32 cuda vs cuBLAS SGEMM",
        us("matmul", "4096^3", "float32", "dualk:cuda"),
        cublas,
        0.80,
    )
    check(
        "matmul 4096^3 fp32 triton vs cuBLAS SGEMM",
        us("matmul", "4096^3", "float32", "dualk:triton"),
        cublas,
        0.60,
    )
    for case in ("B8192_768_3072", "B4096_4096_16384"):
        lt = us("linear_gelu", case, "bfloat16", "cuBLASLt addmm+gelu")
        check(
            f"linear_gelu {case} triton vs cuBLASLt",
            us("linear_gelu", case, "bfloat16", "dualk:triton"),
            lt,
            1.0,
        )
        check(
            f"linear_gelu {case} cuda vs cuBLASLt",
            us("linear_gelu", case, "bfloat16", "dualk:cuda"),
            lt,
            0.6,
        )
    check(
        "linear_gelu B8192_768_3072 triton vs eager",
        us("linear_gelu", "B8192_768_3072", "bfloat16", "dualk:triton"),
        us("linear_gelu", "B8192_768_3072", "bfloat16", "torch eager gelu(linear)"),
        1.3,
    )
    print("issue 4 (fused_mlp; best dualk backend):")

    def best_of(op, case, dt):
        """The faster dualk backend's time (None when neither was measured; WRONG when one was
        wrong: a fast wrong answer is no answer)."""
        times = [us(op, case, dt, f"dualk:{b}") for b in ("cuda", "triton")]
        if WRONG in times:
            return WRONG
        times = [t for t in times if t]
        return min(times) if times else None

    def best(case, dt):
        return best_of("fused_mlp", case, dt)

    check(
        "seed b32 fp32 vs eager",
        best("seed_b32", "float32"),
        us("fused_mlp", "seed_b32", "float32", "torch eager nn.Sequential"),
        5.0,
    )
    check(
        "seed b32 fp32 vs CUDA-graph eager",
        best("seed_b32", "float32"),
        us("fused_mlp", "seed_b32", "float32", "torch eager +cudagraph"),
        1.0,
    )
    check(
        "seed b4096 fp32 vs eager",
        best("seed_b4096", "float32"),
        us("fused_mlp", "seed_b4096", "float32", "torch eager nn.Sequential"),
        2.0,
    )
    for dt in ("float16", "bfloat16"):
        b = best("64x4_b2^20", dt)
        check(
            f"64x4 b2^20 {dt} vs eager",
            b,
            us("fused_mlp", "64x4_b2^20", dt, "torch eager nn.Sequential"),
            4.0,
        )
        check(
            f"64x4 b2^20 {dt} vs torch.compile",
            b,
            us("fused_mlp", "64x4_b2^20", dt, "torch.compile"),
            4.0,
        )
        floor_us = (2**20 * 64 * 2 + 2**20 * 16 * 2) / (ceilings["copy_gbs"] * 1e3)
        cuda = us("fused_mlp", "64x4_b2^20", dt, "dualk:cuda")
        check(
            f"64x4 b2^20 {dt} cuda within 2x of the I/O floor ({floor_us:.1f} us)",
            cuda,
            2 * floor_us,
            1.0,
        )
    check(
        "128x4 b2^20 fp16 vs eager",
        best("128x4_b2^20", "float16"),
        us("fused_mlp", "128x4_b2^20", "float16", "torch eager nn.Sequential"),
        2.5,
    )
    print("issue 14 (GEMM family at cuBLAS; best = the faster dualk backend):")

    for case in ("4096^3", "8192^3"):
        for dt in ("bfloat16", "float16"):
            cublas = us("matmul", case, dt, "cuBLAS (torch.matmul)")
            check(f"matmul {case} {dt} best vs cuBLAS", best_of("matmul", case, dt), cublas, 1.0)
            check(
                f"matmul {case} {dt} cuda vs cuBLAS",
                us("matmul", case, dt, "dualk:cuda"),
                cublas,
                0.95,
            )
    for case, dts in (
        ("1024^3", ("bfloat16", "float16")),
        ("4096x1000x4096", ("bfloat16",)),
        ("3000x2000x5000", ("bfloat16",)),
        ("128x8192x128", ("bfloat16",)),
    ):
        for dt in dts:
            check(
                f"matmul {case} {dt} best vs cuBLAS",
                best_of("matmul", case, dt),
                us("matmul", case, dt, "cuBLAS (torch.matmul)"),
                0.9,
            )
    for case in ("B8192_768_3072", "B4096_4096_16384"):
        lt = us("linear_gelu", case, "bfloat16", "cuBLASLt addmm+gelu")
        check(
            f"linear_gelu {case} cuda vs cuBLASLt",
            us("linear_gelu", case, "bfloat16", "dualk:cuda"),
            lt,
            1.0,
        )
        check(
            f"linear_gelu {case} best vs cuBLASLt",
            best_of("linear_gelu", case, "bfloat16"),
            lt,
            1.05,
        )
    check(
        "linear_gelu B1000_1000_1000 bf16 best vs cuBLASLt",
        best_of("linear_gelu", "B1000_1000_1000", "bfloat16"),
        us("linear_gelu", "B1000_1000_1000", "bfloat16", "cuBLASLt addmm+gelu"),
        1.0,
    )
    check(
        "matmul 4096^3 fp32 best vs cuBLAS SGEMM",
        best_of("matmul", "4096^3", "float32"),
        us("matmul", "4096^3", "float32", "cuBLAS (torch.matmul)"),
        0.95,
    )
    check(
        "linear_gelu B8192_768_3072 fp32 best vs eager",
        best_of("linear_gelu", "B8192_768_3072", "float32"),
        us("linear_gelu", "B8192_768_3072", "float32", "torch eager gelu(linear)"),
        0.95,
    )
    check(
        "fused_mlp 256x3 b2^18 bf16 best vs eager",
        best("256x3_b2^18", "bfloat16"),
        us("fused_mlp", "256x3_b2^18", "bfloat16", "torch eager nn.Sequential"),
        1.5,
    )
    print(f"{failed} criteria missed or not measured, {wrong} of them on a wrong result")
    return 1 if wrong else 0  # misses are reported; a wrong result fails the run


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
