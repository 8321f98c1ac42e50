"""Triton GEMM on rows that are 16-byte but not 32-byte aligned (k = 1000; triton_src/matmul.py
ALIGN / ALIGNED hints, gemm_tma.MIN_MACS = 2^33): device time of three variants next to torch
(cuBLAS / cuBLASLt), bf16, and the error against a float64 reference next to PyTorch's.

    python3 experiments/triton_alignment_bench.py [--json PATH]

Variants: "before" = no alignment hints and the TMA kernel only from 2^34 multiply-adds (the
code before this change); "hints" = hints, TMA from 2^34; "after" = hints, TMA from 2^33. Each
variant tunes afresh (tuning caches emptied, memory-only config store); the tuner's pick is
printed. Times are triton.testing.do_bench medians (L2 flushed), the first call (compile,
tuning) outside the timing. Shapes are M x K x N; linear_gelu is gelu_tanh(x @ w.T + bias).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from triton_src import common, gemm_tma  # noqa: E402
from triton_src import matmul as mm  # noqa: E402
from triton_split_k_sweep import problem, rel_err, us  # noqa: E402  (this directory)

CASES = [  # (op, M, K, N)
    ("matmul", 4096, 1000, 4096),  # H100 before: 125 us vs cuBLAS 54
    ("matmul", 3000, 2000, 5000),  # 130 us vs 96
    ("linear_gelu", 1000, 1000, 1000),  # 41 us vs cuBLASLt 12.5
    ("linear_gelu", 8192, 768, 3072),  # aligned control: should not move
]
VARIANTS = {  # name: (alignment hints, TMA MIN_MACS)
    "before": (False, 1 << 34),
    "hints": (True, 1 << 34),
    "after": (True, 1 << 33),
}


def set_variant(hints: bool, min_macs: int) -> None:
    mm.align_mask = common.align_mask if hints else (lambda *args: 0)
    gemm_tma.MIN_MACS = min_macs
    mm._best_config.clear()
    mm.TUNING_LOG.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    common.set_config_store(None)  # every variant tunes; nothing read from or left in a cache
    dev = torch.device("cuda")
    dt = torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, {common.num_sms(dev)} SMs, bf16")
    print(f"{'op':<12}{'M x K x N':<18}{'variant':<8}{'us':>9}{'torch us':>10}{'x torch':>9}{'err':>10}{'err torch':>11}  config")  # fmt: skip
    rows = []
    for op, M, K, N in CASES:
        ours, theirs, ref = problem(op, M, K, N, dt, gen, allow_tf32=False)
        torch_us = us(theirs)
        torch_err = rel_err(theirs(), ref)
        for name, (hints, min_macs) in VARIANTS.items():
            set_variant(hints, min_macs)
            t = us(ours)
            err = rel_err(ours(), ref)
            picks = [(round(ms * 1e3, 1), cfg) for ms, cfg in next(iter(mm.TUNING_LOG.values()), [])]  # fmt: skip
            row = {"op": op, "M": M, "K": K, "N": N, "variant": name, "us": t, "torch_us": torch_us,
                   "err": err, "torch_err": torch_err, "tuning": picks}  # fmt: skip
            rows.append(row)
            pick = picks[0][1] if picks else "?"
            print(f"{op:<12}{f'{M}x{K}x{N}':<18}{name:<8}{t:>9.1f}{torch_us:>10.1f}{t / torch_us:>8.2f}x{err:>10.2e}{torch_err:>11.2e}  {pick}")  # fmt: skip
    set_variant(True, VARIANTS["after"][1])
    if args.json:
        meta = {"device": torch.cuda.get_device_name(), "sms": common.num_sms(dev)}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
