"""Fused-MLP forward per backend on the training step's shapes (GPU only): device time of each
backend's kernel(s) with the launches queued back to back (host cost hidden), beside eager, and
what "auto" picks and why.

    python3 experiments/mlp_forward_probe.py [--json F]

Why: bench/integration.py's training step measured the forward alone (64x5 fp16, 2^18 rows, last
width 16) at 0.163 ms on the CUDA backend and 0.303 ms on "auto" on the H100, while the default
suite's 64x4 at 2^20 rows takes 0.076 ms: either the 16-wide last layer takes a slow path or
"auto" picks badly here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from integration import _device_ms  # noqa: E402

import dualk  # noqa: E402

SHAPES = [
    ((64, 64, 64, 64, 64, 16), 2**18),
    ((64, 64, 64, 64, 64, 64), 2**18),
    ((64, 64, 64, 64, 64), 2**20),
    ((64, 64, 64, 64, 64, 16), 2**20),
]


def queued_us(fn, calls=50) -> float:
    """Device microseconds per call with `calls` calls queued between two events (bench/
    integration.py's _device_ms over the batch, median of its repeats)."""
    return _device_ms(lambda: [fn() for _ in range(calls)], reps=5, warmup=1) * 1e3 / calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    opts = parser.parse_args()
    rows = []
    torch.manual_seed(0)
    for widths, batch in SHAPES:
        layers = [torch.nn.Linear(i, o).cuda().half() for i, o in zip(widths[:-1], widths[1:])]
        ws = [m.weight for m in layers]
        bs = [m.bias for m in layers]
        x = torch.randn(batch, widths[0], device="cuda", dtype=torch.float16)

        def eager():
            h = x
            for i, m in enumerate(layers):
                h = m(h)
                if i != len(layers) - 1:
                    h = F.relu(h)
            return h

        row = {"widths": widths, "batch": batch}
        with torch.no_grad():
            for backend in ("cuda", "triton", "torch", "auto"):
                row[backend] = queued_us(
                    lambda b=backend: dualk.fused_mlp(x, ws, bs, activation="relu", backend=b)
                )
            row["eager"] = queued_us(eager)
            row["auto's choice"] = str(dualk.explain("fused_mlp", x, ws, bs, activation="relu"))
        rows.append(row)
        print(json.dumps(row, indent=1), flush=True)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
