"""Host cost of the Triton GEMM launch path (triton_src/matmul.py `_gemm`, split-K included) on a
CPU-only machine: microseconds per call with KernelLauncher.launch stubbed (its dict lookup kept),
a fixed config (no tuning) and 132 SMs, then a cProfile of the linear_gelu call.

    python3 experiments/host_triton_gemm_cpu.py [--number 20000]

Why: `dualk bench` on an H100 host measured the Triton backend's host time per call at 36-41 us
for matmul 1024^3 and 92 us for linear_gelu 32x768->3072 bf16 (a split-K launch), against 24-27
and 51 us for the CUDA backend; on launch-bound shapes the device times then include that host
time. What is cut here is Python: the compiled kernel's own launch (CompiledKernel.run) is not
measured."""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import timeit
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # the GPU path's Python, not the interpreter's
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import triton_src.linear_gelu as lg  # noqa: E402
import triton_src.matmul as mm  # noqa: E402
from triton_src.common import KernelLauncher  # noqa: E402


def _stub_launch(self, key, grid, args, num_warps, num_stages, device_index=None):
    self.compiled.get((key, 0))  # the fast path's lookup, then CompiledKernel.run (not here)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--number", type=int, default=20000)
    n = parser.parse_args().number
    KernelLauncher.launch = _stub_launch
    mm.num_sms = lambda device: 132
    mm.FORCE_CONFIG[:] = [mm.GEMM_CONFIGS[("tensor_core", "small")][0]]
    bf16 = torch.bfloat16
    x, w, b = (
        torch.randn(32, 768, dtype=bf16),
        torch.randn(3072, 768, dtype=bf16),
        torch.randn(3072, dtype=bf16),
    )
    a = torch.randn(1024, 1024, dtype=bf16)
    cases = {
        "linear_gelu 32x768->3072 bf16 (split-K: 48 tiles)": lambda: lg.linear_gelu(x, w, b, approximate="tanh", allow_tf32=False),
        "matmul 1024^3 bf16": lambda: mm.matmul(a, a, allow_tf32=False),
    }  # fmt: skip
    print(f"torch {torch.__version__}; us per call, best of 5 x {n} calls (launch stubbed)")
    for label, fn in cases.items():
        fn()
        us = min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6
        print(f"{label:55s} {us:7.2f}")
    profile = cProfile.Profile()
    fn = next(iter(cases.values()))
    profile.enable()
    for _ in range(n):
        fn()
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(10)


if __name__ == "__main__":
    main()
