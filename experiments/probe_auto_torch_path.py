"""Why dualk's torch path of matmul can time slower than the bench's own torch.matmul row.

The H100 default run of session 19 (bench/results/2026-11-26-h100-default-s19) had auto run the
torch path at matmul 128x8192x128 bf16 in 11.93 us, where the cuBLAS row (torch.matmul on the same
operands) took 10.79; the H200 s17-b run had 11.2 against 10.4. dualk's torch backend is
torch.matmul itself, so either the kernels differ (cuBLAS's heuristic sees something else) or the
timing does. Per shape, alternating rounds of: torch.matmul, dualk.matmul(backend="torch") and
(backend="auto"), each timed as `dualk bench` times a row (dualk.tools.bench.time_device), then the
kernels each one launches (torch.profiler).

    python3 experiments/probe_auto_torch_path.py
"""

from __future__ import annotations

import torch

import dualk
from dualk.backends import torch_ref
from dualk.tools.bench import time_device
from probe_linear_gelu import kernel_names  # experiments/ is the script's directory

SHAPES = [
    (128, 8192, 128, torch.bfloat16),
    (4096, 4096, 4096, torch.float16),
    (1024, 1024, 1024, torch.bfloat16),
]
ROUNDS = 3


def main() -> None:
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for m, k, n, dtype in SHAPES:
        a = torch.randn((m, k), device="cuda", dtype=dtype, generator=gen)
        b = torch.randn((k, n), device="cuda", dtype=dtype, generator=gen)
        paths = {
            "torch.matmul": lambda: torch.matmul(a, b),
            "dualk torch": lambda: dualk.matmul(a, b, backend="torch"),
            "dualk auto": lambda: dualk.matmul(a, b, backend="auto"),
            "dualk torch_ref direct": lambda: torch_ref.matmul(a, b),
        }
        for fn in paths.values():  # warm-up (auto tunes here)
            fn()
        times: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(ROUNDS):
            for name, fn in paths.items():
                times[name].append(time_device(fn)[0])
        print(f"{m}x{k}x{n} {str(dtype)[6:]}:")
        print("    auto:", dualk.explain("matmul", a, b, backend="auto"))
        for name, fn in paths.items():
            rounds = ", ".join(f"{t:.2f}" for t in times[name])
            print(f"    {name:24s} {rounds} us   kernels {kernel_names(fn)}")


if __name__ == "__main__":
    main()
