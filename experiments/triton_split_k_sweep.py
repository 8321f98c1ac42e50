"""Triton split-K (triton_src/matmul.py split_k_plan) on a GPU: device time with and without it,
next to torch (cuBLAS / cuBLASLt), and the error against a float64 reference next to PyTorch's.

    python3 experiments/triton_split_k_sweep.py [--json PATH]
    python3 experiments/triton_split_k_sweep.py --plans [--json PATH]

--plans: on PLAN_CASES, every small tensor-core config x split count forced in place of
split_k_plan's choice, timed as `dualk bench` times (dualk.tools.bench.time_device: an L2 flush and a
GPU sleep before each call, so the two launches' host time stays out), next to torch.

Imports triton_src directly (repo root on sys.path), as experiments/triton_bench.py does. Times are
triton.testing.do_bench medians (warm-up 25 ms, 100 ms of repetitions, L2 flushed); the first
call of each variant (compile, tuning) is outside the timing. Shapes are M x K x N.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from triton_src import linear_gelu as lg  # noqa: E402
from triton_src import matmul as mm  # noqa: E402
from triton_src.common import cdiv, num_sms  # noqa: E402

CASES = [  # (op, M, K, N, dtype)
    *(("matmul", 128, 8192, 128, dt) for dt in ("bf16", "fp16", "fp32")),
    *(("matmul", 64, 262144, 64, dt) for dt in ("bf16", "fp16", "fp32")),
    *(("matmul", 256, 16384, 256, dt) for dt in ("bf16", "fp16", "fp32")),
    ("linear_gelu", 128, 8192, 128, "bf16"),
    ("matmul", 1024, 16384, 1024, "fp32"),  # many tiles: the fp32 accuracy split's cost
]
PLAN_CASES = [  # (op, M, K, N, dtype): issue 14's long-k case and its neighbours
    ("matmul", 128, 8192, 128, "bf16"),
    ("matmul", 128, 8192, 128, "fp16"),
    ("linear_gelu", 128, 8192, 128, "bf16"),
    ("matmul", 256, 16384, 256, "bf16"),
]
PLAN_SPLITS = (8, 16, 32, 64, 128)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    ms = do_bench(fn, warmup=25, rep=100, quantiles=[0.5])
    return (ms[0] if isinstance(ms, (list, tuple)) else ms) * 1e3  # Triton 3.6 returns a float


def rel_err(out, ref) -> float:
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


def problem(op: str, M: int, K: int, N: int, dt, gen, allow_tf32: bool):
    """(ours, theirs, ref): the Triton call, PyTorch's (x @ b, or gelu_tanh(F.linear)) and the
    float64 reference, on random inputs scaled so outputs stay O(1)."""
    dev = gen.device
    x = torch.randn((M, K), device=dev, dtype=dt, generator=gen)
    if op == "matmul":
        b = torch.randn((K, N), device=dev, dtype=dt, generator=gen) / K**0.5
        return (
            lambda: mm.matmul(x, b, allow_tf32=allow_tf32),
            lambda: x @ b,
            x.double() @ b.double(),
        )
    w = torch.randn((N, K), device=dev, dtype=dt, generator=gen) / K**0.5
    bias = torch.randn(N, device=dev, dtype=dt, generator=gen) * 0.5
    return (
        lambda: lg.linear_gelu(x, w, bias, approximate="tanh", allow_tf32=allow_tf32),
        lambda: F.gelu(F.linear(x, w, bias), approximate="tanh"),
        F.gelu(x.double() @ w.double().t() + bias.double(), approximate="tanh"),
    )


def plan_sweep(gen, tf32) -> list[dict]:
    """Every small tensor-core config x PLAN_SPLITS forced on PLAN_CASES (16-bit only)."""
    from dualk.tools.bench import time_device

    chosen = mm.split_k_plan
    rows = []
    print(f"{'op':<12}{'dtype':<6}{'M x K x N':<18}{'config':<34}{'splits':>7}{'us':>9}{'torch us':>10}{'torch/us':>9}{'err':>10}")  # fmt: skip
    for op, M, K, N, name in PLAN_CASES:
        ours, theirs, ref = problem(op, M, K, N, DTYPES[name], gen, tf32)
        torch_us = time_device(theirs)[0]
        default = chosen("tensor_core", 1, M, N, K, num_sms(gen.device))
        plans = [("default", default)]
        for cfg in mm.GEMM_CONFIGS[("tensor_core", "small")]:
            bk = cfg[3]
            for splits in PLAN_SPLITS:
                k_slice = cdiv(cdiv(K, splits), bk) * bk
                plans.append((str(cfg), (cfg, cdiv(K, k_slice), k_slice)))
        for label, plan in plans:
            mm.split_k_plan = lambda *_, plan=plan: plan
            try:
                t = time_device(ours)[0]
                err = rel_err(ours(), ref)
            except Exception as e:  # a config that does not compile here
                print(f"  {label} {plan[1]}: {type(e).__name__}")
                continue
            finally:
                mm.split_k_plan = chosen
            row = {"op": op, "dtype": name, "M": M, "K": K, "N": N, "config": label,
                   "plan_config": list(plan[0]), "splits": plan[1], "us": t, "torch_us": torch_us, "err": err}  # fmt: skip
            rows.append(row)
            print(f"{op:<12}{name:<6}{f'{M}x{K}x{N}':<18}{label:<34}{plan[1]:>7}{t:>9.2f}{torch_us:>10.2f}{torch_us / t:>8.2f}x{err:>10.2e}")  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--plans", action="store_true", help="force config x splits on PLAN_CASES")
    args = parser.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    print(f"{torch.cuda.get_device_name()}, {num_sms(dev)} SMs, allow_tf32={tf32}")
    if args.plans:
        rows = plan_sweep(gen, tf32)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {"meta": {"device": torch.cuda.get_device_name()}, "rows": rows}, f, indent=1
                )
        return
    head = f"{'op':<12}{'dtype':<6}{'M x K x N':<20}{'splits':>7}{'split us':>10}{'one-pass us':>13}{'torch us':>10}{'split/torch':>12}{'err split':>11}{'err 1-pass':>11}{'err torch':>11}"  # fmt: skip
    print(head)
    rows = []
    for op, M, K, N, name in CASES:
        dt = DTYPES[name]
        ours, theirs, ref = problem(op, M, K, N, dt, gen, tf32)
        kind = "fp32" if dt == torch.float32 and not tf32 else ("tf32" if dt == torch.float32 else "tensor_core")  # fmt: skip
        plan = mm.split_k_plan(kind, 1, M, N, K, num_sms(dev))
        row = {"op": op, "dtype": name, "M": M, "K": K, "N": N, "splits": plan[1] if plan else 1}
        for label, on in (("split", True), ("one_pass", False)):
            mm.SPLIT_K[:] = [on]
            row[f"{label}_us"] = us(ours)
            row[f"{label}_err"] = rel_err(ours(), ref)
        mm.SPLIT_K[:] = [True]
        row["torch_us"] = us(theirs)
        row["torch_err"] = rel_err(theirs(), ref)
        rows.append(row)
        print(f"{op:<12}{name:<6}{f'{M}x{K}x{N}':<20}{row['splits']:>7}{row['split_us']:>10.1f}{row['one_pass_us']:>13.1f}{row['torch_us']:>10.1f}{row['split_us'] / row['torch_us']:>11.2f}x{row['split_err']:>11.2e}{row['one_pass_err']:>11.2e}{row['torch_err']:>11.2e}")  # fmt: skip
    if args.json:
        meta = {"device": torch.cuda.get_device_name(), "sms": num_sms(dev), "allow_tf32": tf32}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
