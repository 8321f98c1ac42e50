"""Two open questions of issue 14, on a GPU (one device call):

1. matmul 3000 x 5000 x 2000 bf16 (B (k, n) rows of 10000 bytes) runs ~45% slower than its
   twin with n = 5120. Is it B's loads or C's stores? B is given once contiguous and once as a
   view of a (2000, 5120) buffer (row stride 10240 bytes, the same values); C is always dualk's
   contiguous output. Same time for both B's: the stores; faster with the padded B: the loads.
2. Where the Triton GEMM's host time goes (linear_gelu 8192x768->3072 bf16, ~110 us a call on
   an H100 host): a cProfile of 200 calls, sorted by own time.

    python3 experiments/probe_gemm_n5000.py [--out FILE]
    python3 experiments/probe_gemm_n5000.py --ncu-cases   # under ncu: experiments/ncu_gemm_n5000.sh

--ncu-cases runs dualk's CUDA GEMM once per B layout (n = 5120 contiguous, n = 5000 contiguous,
n = 5000 as a view with rows of 10240 bytes), after one warm-up each, for Nsight Compute to
profile (the wrapper filters on gemm_sm90_kernel and skips the warm-ups).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dualk.backends import cuda as cuda_backend  # noqa: E402
from dualk.backends import triton as triton_backend  # noqa: E402
from dualk.tools.bench import time_device  # noqa: E402


def alignment(lines: list[str]) -> None:
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    m, k = 3000, 2000
    a = torch.randn(m, k, device=dev, dtype=dt)
    wide = torch.randn(k, 5120, device=dev, dtype=dt)
    cases = {
        "n=5120 contiguous B": wide,
        "n=5000 contiguous B": wide[:, :5000].contiguous(),
        "n=5000 B view, row stride 5120": wide[:, :5000],
        "n=5000 B^T view (k-major, rows of 4000 bytes)": wide[:, :5000].t().contiguous().t(),
    }
    lines.append("| B operand | dualk cuda us | cuBLAS us | ratio | max abs err vs cuBLAS |")
    lines.append("|---|---|---|---|---|")
    for name, b in cases.items():
        ours = cuda_backend.matmul(a, b)
        ref = torch.matmul(a, b)
        err = (ours.float() - ref.float()).abs().max().item()
        t_ours = [time_device(lambda: cuda_backend.matmul(a, b))[0] for _ in range(3)]
        t_ref = [time_device(lambda: torch.matmul(a, b))[0] for _ in range(3)]
        mo, mr = sorted(t_ours)[1], sorted(t_ref)[1]
        lines.append(f"| {name} | {mo:.1f} | {mr:.1f} | {mr / mo:.2f}x | {err:.3g} |")


def ncu_cases() -> None:
    """One warm-up and one profiled launch per B layout, in the table's order."""
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    a = torch.randn(3000, 2000, device=dev, dtype=dt)
    wide = torch.randn(2000, 5120, device=dev, dtype=dt)
    for b in (wide, wide[:, :5000].contiguous(), wide[:, :5000]):
        cuda_backend.matmul(a, b)  # warm-up (skipped by the wrapper's --launch-skip pattern)
        cuda_backend.matmul(a, b)
    torch.cuda.synchronize()


def triton_host(lines: list[str]) -> None:
    dev, dt = torch.device("cuda"), torch.bfloat16
    x = torch.randn(8192, 768, device=dev, dtype=dt)
    w = torch.randn(3072, 768, device=dev, dtype=dt)
    bias = torch.randn(3072, device=dev, dtype=dt)
    for _ in range(3):
        triton_backend.linear_gelu(x, w, bias)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        triton_backend.linear_gelu(x, w, bias)
    host = (time.perf_counter() - t0) / 200 * 1e6
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        triton_backend.linear_gelu(x, w, bias)
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    lines.append(
        f"\nTriton linear_gelu 8192x768->3072 bf16: host {host:.1f} us per call (200 calls)"
    )
    lines.append(buf.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--ncu-cases", action="store_true", help="the launches for ncu only")
    args = parser.parse_args()
    if args.ncu_cases:
        ncu_cases()
        return
    lines = [f"{torch.cuda.get_device_name()} torch {torch.__version__}", ""]
    alignment(lines)
    triton_host(lines)
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
