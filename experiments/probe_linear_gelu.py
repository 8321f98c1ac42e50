"""Issue 14: where the CUDA backend's linear_gelu loses to cuBLASLt's fused bias + GELU epilogue.
Per shape (x (M, K), W (N, K), bias (N,), bf16), device times of: dualk linear_gelu (cuda), dualk
matmul of the same operands without the epilogue (x @ W^T, cuda: the same Hopper kernel and
layout), cuBLASLt's epilogue (torch._addmm_activation) and cuBLAS's matmul; the epilogue's share
is linear_gelu minus matmul, on each side.

    python3 experiments/probe_linear_gelu.py [--json PATH]   # timings (dualk.tools.bench.time_device)
    python3 experiments/probe_linear_gelu.py --ncu-cases     # for ncu: per shape, a warm-up and
                                                             # one launch of each dualk case
    python3 experiments/probe_linear_gelu.py --kernels       # the kernels (names: tile shapes,
                                                             # clusters) every case launches, and
                                                             # the peers' on 4096^3 fp16 / fp32
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

import dualk

SHAPES = [(8192, 768, 3072), (4096, 4096, 16384), (1000, 1000, 1000)]  # (M, K, N)


def operands(M, K, N, gen):
    x = torch.randn((M, K), device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn((N, K), device="cuda", dtype=torch.bfloat16, generator=gen) / K**0.5
    b = torch.randn((N,), device="cuda", dtype=torch.bfloat16, generator=gen) * 0.5
    return x, w, b


def cases(x, w, b):
    return {
        "dualk linear_gelu (cuda)": lambda: dualk.linear_gelu(x, w, b, backend="cuda"),
        "dualk matmul x @ W^T (cuda)": lambda: dualk.matmul(x, w.t(), backend="cuda"),
        "cuBLASLt bias+gelu epilogue": lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True),
        "cuBLAS x @ W^T": lambda: x @ w.t(),
    }


def kernel_names(fn) -> list[str]:
    """The CUDA kernels one call of fn launches (after a warm-up), in order."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.key for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    return names or [e.key for e in prof.key_averages()]  # (all events, should the filter miss)


def print_kernels(gen) -> None:
    for M, K, N in SHAPES:
        for name, fn in cases(*operands(M, K, N, gen)).items():
            print(f"{M}x{K}->{N} {name}: {kernel_names(fn)}")
    torch.backends.cuda.matmul.allow_tf32 = False
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        a = torch.randn((4096, 4096), device="cuda", dtype=dtype, generator=gen)
        b = torch.randn((4096, 4096), device="cuda", dtype=dtype, generator=gen)
        for backend in ("cuda", "triton"):
            print(
                f"4096^3 {dtype} dualk {backend}: {kernel_names(lambda: dualk.matmul(a, b, backend=backend))}"
            )
        print(f"4096^3 {dtype} cuBLAS a @ b: {kernel_names(lambda: a @ b)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--ncu-cases", action="store_true", help="launches for ncu, no timing")
    parser.add_argument(
        "--kernels", action="store_true", help="print the kernels each case launches"
    )
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    if args.kernels:
        print_kernels(gen)
        return
    rows = []
    for M, K, N in SHAPES:
        x, w, b = operands(M, K, N, gen)
        pre = x.double() @ w.double().t() + b.double()
        ref = F.gelu(pre, approximate="tanh")
        named = cases(x, w, b)
        if args.ncu_cases:
            for name in ("dualk linear_gelu (cuda)", "dualk matmul x @ W^T (cuda)"):
                named[name]()  # warm-up (build, first launch)
                named[name]()  # the profiled one
            torch.cuda.synchronize()
            continue
        from dualk.tools.bench import time_device

        row = {"M": M, "K": K, "N": N}
        for name, fn in named.items():
            row[name] = time_device(fn)[0]
        out = named["dualk linear_gelu (cuda)"]()
        row["lg err"] = ((out.double() - ref).abs().max() / ref.abs().max()).item()
        # Where gelu is near 0 (pre-activation < -2): the largest absolute error of each side.
        neg = pre < -2
        for name in ("dualk linear_gelu (cuda)", "cuBLASLt bias+gelu epilogue"):
            err = (named[name]().double() - ref).abs()
            row[f"{name} max err"] = err.max().item()
            row[f"{name} max err at pre < -2"] = err[neg].max().item() if neg.any() else 0.0
        rows.append(row)
        ours = row["dualk linear_gelu (cuda)"] - row["dualk matmul x @ W^T (cuda)"]
        theirs = row["cuBLASLt bias+gelu epilogue"] - row["cuBLAS x @ W^T"]
        print(f"{M}x{K}->{N}: " + ", ".join(f"{k} {v:.1f} us" for k, v in row.items() if k.endswith(")") or k.startswith("cuBLAS")))  # fmt: skip
        print(f"    epilogue share: dualk {ours:+.1f} us, cuBLASLt {theirs:+.1f} us; err {row['lg err']:.1e}")  # fmt: skip
        print(
            "    max abs err (all / where pre-activation < -2): "
            + ", ".join(
                f"{name} {row[f'{name} max err']:.2e} / {row[f'{name} max err at pre < -2']:.2e}"
                for name in ("dualk linear_gelu (cuda)", "cuBLASLt bias+gelu epilogue")
            )
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
