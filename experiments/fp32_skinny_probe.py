"""fp32 GEMMs with few rows (TF32 off): dualk's CUDA path (gemm_simt_skinny_kernel for m <= 32,
the wide kernel above), its Triton path and PyTorch's, timed in one run.

    python3 experiments/fp32_skinny_probe.py [--json out.json]

Per (op, m, k, n): device us (interquartile mean of CUDA-event timings, L2 flushed and a GPU sleep
before each call, as the bench; host time is not measured) and the max error against a float64 reference
relative to max|ref|. Rows 33 and 64 run the wide kernel: the stand-in for what m <= 32 ran before.
linear_gelu: x (m, k), W (n, k), bias, tanh GELU; matmul: A (m, k) @ B (k, n)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dualk  # noqa: E402
from dualk.core.timing import interquartile_mean, sleep_cycles, timed_calls  # noqa: E402
from dualk.tools.bench import environment  # noqa: E402

SHAPES = [(768, 3072), (4096, 4096), (4096, 11008)]
ROWS = [1, 8, 16, 32, 33, 64]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path)
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(0)
    flush = torch.empty(64 * 2**20, dtype=torch.int32, device="cuda")  # 256 MB > L2
    cycles = sleep_cycles(40.0)
    rows = []
    for k, n in SHAPES:
        w = torch.randn(n, k, device="cuda", generator=gen) / k**0.5
        b = torch.randn(n, device="cuda", generator=gen)
        bt = torch.randn(k, n, device="cuda", generator=gen) / k**0.5
        for m in ROWS:
            x = torch.randn(m, k, device="cuda", generator=gen)
            ref_lg = F.gelu(F.linear(x.double(), w.double(), b.double()), approximate="tanh")
            ref_mm = x.double() @ bt.double()
            paths = {
                ("linear_gelu", "cuda"): lambda: dualk.linear_gelu(x, w, b, backend="cuda"),
                ("linear_gelu", "triton"): lambda: dualk.linear_gelu(x, w, b, backend="triton"),
                ("linear_gelu", "torch"): lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
                ("matmul", "cuda"): lambda: dualk.matmul(x, bt, backend="cuda"),
                ("matmul", "triton"): lambda: dualk.matmul(x, bt, backend="triton"),
                ("matmul", "torch"): lambda: x @ bt,
            }
            for (op, path), run in paths.items():
                ref = ref_lg if op == "linear_gelu" else ref_mm
                out = run()
                torch.cuda.synchronize()
                err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
                for _ in range(3):
                    run()
                us = interquartile_mean(timed_calls(run, args.reps, flush, cycles)) * 1e3
                rows.append(
                    {"op": op, "m": m, "k": k, "n": n, "path": path, "us": us, "rel_err": err}
                )
                print(f"{op:12s} m={m:3d} k={k:5d} n={n:6d} {path:7s} {us:9.2f} us  err {err:.1e}",
                      flush=True)  # fmt: skip
    env = environment()  # (the bench's: GPU, versions, date, estimator)
    env["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                   text=True, cwd=Path(__file__).parent).stdout.strip() or None  # fmt: skip
    # device time only: Triton's host cost per call (tens of us) is not in these numbers
    print("\nratio torch / cuda and triton / cuda, device time (above 1: the CUDA path is faster)")
    for op in ("linear_gelu", "matmul"):
        for k, n in SHAPES:
            for m in ROWS:
                t = {
                    r["path"]: r["us"]
                    for r in rows
                    if (r["op"], r["m"], r["k"], r["n"]) == (op, m, k, n)
                }
                print(f"{op:12s} {m:3d}x{k}->{n:<6d} cuda {t['cuda']:8.2f}  torch/cuda "
                      f"{t['torch'] / t['cuda']:5.2f}  triton/cuda {t['triton'] / t['cuda']:5.2f}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
