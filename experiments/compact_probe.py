"""fused_mlp's compact last layer (DUALK_MLP_COMPACT_LAST, cuda_src/fused_mlp_sm90.cu): which CUDA
kernel runs 128-128-128-128-128-16 and 64-64-64-64-64-16 (fp16, relu, 2^20 rows) in this process,
and its time (CUDA events around 50 back-to-back calls, median of 5). Run it once with the switch
off and once on: the kernel name says whether the compact layout was taken.

    DUALK_MLP_COMPACT_LAST=1 python experiments/compact_probe.py
"""

from __future__ import annotations

import os
import statistics

import torch

import dualk
from dualk.backends import cuda as cuda_backend
from dualk.registry import mlp_parameters, randn


def main() -> None:
    gen = torch.Generator().manual_seed(36)
    switch = os.environ.get("DUALK_MLP_COMPACT_LAST", "")
    for widths in ((128,) * 5 + (16,), (64,) * 5 + (16,), (128,) * 4 + (16,)):
        weights, biases = mlp_parameters(widths, torch.float16, "cuda", gen)
        x = randn((1 << 20, widths[0]), torch.float16, "cuda", gen)
        kernel = cuda_backend.fused_mlp_kernel(x, weights, biases, "relu")
        run = lambda: dualk.fused_mlp(x, weights, biases, activation="relu", backend="cuda")  # noqa: E731
        for _ in range(5):
            run()
        times = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(50):
                run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / 50)
        print(
            f"DUALK_MLP_COMPACT_LAST={switch or '-'} {'-'.join(map(str, widths))}: "
            f"{statistics.median(times):8.1f} us  kernel: {kernel}"
        )


if __name__ == "__main__":
    main()
