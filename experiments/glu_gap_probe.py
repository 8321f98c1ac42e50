"""Where linear_glu's CUDA forward loses its margin over eager (issue 35), on a GPU, in one run.

For bf16, K = 4096, N = 11008 / 14336, rows 512 / 8192 (no bias, silu), device time of:
  eager        F.silu(F.linear(x, Wg)) * F.linear(x, Wu)   (two cuBLAS GEMMs + two passes)
  two_gemms    F.linear(x, Wg); F.linear(x, Wu)            (eager's GEMMs alone)
  packed_cublas  F.linear(x, [Wg; Wu])                     (one cuBLAS GEMM of 2N columns)
  packed_dualk   dualk.matmul(x, [Wg; Wu].T, backend="cuda") (dualk's Hopper GEMM, same work)
  glu_cuda     dualk.linear_glu(x, Wg, Wu, backend="cuda") (the gated kernel)
so the gated kernel is compared with the same FLOPs on cuBLAS and on dualk's own GEMM: if
packed_dualk matches packed_cublas and glu_cuda does not, the gap is in the gated kernel; if
packed_dualk is short too, it is the GEMM's main loop on this shape.

    python3 experiments/glu_gap_probe.py --json OUT.json
    python3 experiments/glu_gap_probe.py --ncu-cases   # for experiments/ncu_glu.sh: 8192 x 14336,
                                                       # dualk's GEMM then the gated kernel, twice
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

import dualk
from dualk.core import timing


def device_us(fn, reps=15, rounds=3):
    flush = torch.empty(2**25, dtype=torch.int32, device="cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    host_ms = timing.burst_host_ms(fn, 3)
    cycles = timing.sleep_cycles(host_ms * 1e3)
    per_round = []
    for _ in range(rounds):
        ms = timing.timed_calls(fn, reps, flush, cycles)
        per_round.append(timing.interquartile_mean(ms))
    return statistics.median(per_round) * 1e3, [round(v * 1e3, 1) for v in per_round]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument(
        "--ncu-cases", action="store_true", help="two launches of each kernel, no timing"
    )
    a = p.parse_args()
    if a.ncu_cases:
        ncu_cases()
        return
    dt = torch.bfloat16
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M"), "rows": []}  # fmt: skip
    torch.manual_seed(0)
    with torch.no_grad():
        for n in (11008, 14336):
            wg = torch.randn(n, 4096, device="cuda", dtype=dt) * 0.02
            wu = torch.randn(n, 4096, device="cuda", dtype=dt) * 0.02
            packed = torch.cat([wg, wu])
            packed_t = packed.t()
            for m in (512, 8192):
                x = torch.randn(m, 4096, device="cuda", dtype=dt)
                paths = {
                    "eager": lambda: F.silu(F.linear(x, wg)) * F.linear(x, wu),
                    "two_gemms": lambda: (F.linear(x, wg), F.linear(x, wu)),
                    "packed_cublas": lambda: F.linear(x, packed),
                    "packed_dualk": lambda: dualk.matmul(x, packed_t, backend="cuda"),
                    "glu_cuda": lambda: dualk.linear_glu(x, wg, wu, backend="cuda"),
                }
                row = {"rows": m, "n": n, "k": 4096}
                # two passes in alternating order: a GPU that warms (clocks, power) hits both
                for order in (list(paths), list(paths)[::-1]):
                    for name in order:
                        us, rounds = device_us(paths[name])
                        row.setdefault(name, []).append(round(us, 1))
                        row.setdefault(name + "_rounds", []).extend(rounds)
                for name in paths:
                    row[name + "_us"] = statistics.median(row[name])
                flops = 2 * m * 4096 * 2 * n
                row["tflops"] = {k: round(flops / (row[k + "_us"] * 1e-6) / 1e12, 1)
                                 for k in paths if k != "eager"}  # fmt: skip
                row["glu_vs_eager"] = round(row["eager_us"] / row["glu_cuda_us"], 3)
                print(json.dumps({k: v for k, v in row.items() if not k.endswith("_rounds")}),
                      flush=True)  # fmt: skip
                out["rows"].append(row)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)


def ncu_cases():
    """8192 x 4096 -> 14336 (bf16, silu): dualk's Hopper GEMM on the packed weight (2N columns),
    then the gated kernel, each launched twice (a warm-up, then the one to read), so that ncu's
    kernel filter sees gemm_sm90_kernel, gemm_sm90_kernel, linear_glu_sm90_kernel x 2."""
    torch.manual_seed(0)
    dt = torch.bfloat16
    wg = torch.randn(14336, 4096, device="cuda", dtype=dt) * 0.02
    wu = torch.randn(14336, 4096, device="cuda", dtype=dt) * 0.02
    packed_t = torch.cat([wg, wu]).t()
    x = torch.randn(8192, 4096, device="cuda", dtype=dt)
    with torch.no_grad():
        for _ in range(2):
            dualk.matmul(x, packed_t, backend="cuda")
        for _ in range(2):
            dualk.linear_glu(x, wg, wu, backend="cuda")
    torch.cuda.synchronize()
    print(dualk.explain("linear_glu", x, wg, wu, backend="cuda"))


if __name__ == "__main__":
    main()
