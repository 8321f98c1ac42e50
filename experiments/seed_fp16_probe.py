"""Why auto measures the seed MLP's CUDA kernel at 31.7 us (fp16, 32 rows, H200) where 200 calls
back to back take 16.6 us each (issue 32, small batch): per backend and rows, device time of an
isolated call with a cold L2 (auto's timer), with a warm L2, and per call of 200 back to back;
the kernels one call launches (torch.profiler) and what dualk.explain names.

    python experiments/seed_fp16_probe.py [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import dualk
from dualk.core import timing


def isolated(fn, flush, reps=30):
    cycles = timing.sleep_cycles(60.0, at_least_us=100.0)
    ms = timing.timed_calls(fn, reps, flush, cycles)
    return timing.interquartile_mean(ms) * 1e3


def back_to_back(fn, calls=200):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    s.record()
    for _ in range(calls):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / calls * 1e3


def kernels(fn):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    return [
        (e.key[:90], e.count, round(e.device_time_total / max(e.count, 1), 2))
        for e in prof.key_averages()
        if e.device_time_total > 0
    ]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    a = p.parse_args()
    dev = torch.device("cuda")
    flush = torch.empty(2 * 60 * 2**20, dtype=torch.uint8, device=dev)
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M"), "rows": []}  # fmt: skip
    for widths, dtype in (([100, 128, 64, 10], torch.float16), ([112, 128, 128, 10], torch.float16),
                          ([100, 128, 64, 10], torch.float32), ([104, 128, 64, 16], torch.float16)):  # fmt: skip
        torch.manual_seed(0)
        ws = [
            torch.randn(n, k, device=dev, dtype=dtype) / k**0.5 for k, n in zip(widths, widths[1:])
        ]
        bs = [torch.randn(n, device=dev, dtype=dtype) * 0.1 for n in widths[1:]]
        for rows in (32, 256, 1024, 4096):
            x = torch.randn(rows, widths[0], device=dev, dtype=dtype)
            row = {"widths": widths, "dtype": str(dtype)[6:], "rows": rows}
            with torch.no_grad():
                for backend in ("cuda", "triton", "torch"):
                    fn = lambda b=backend: dualk.fused_mlp(x, ws, bs, activation="relu", backend=b)
                    for _ in range(5):
                        fn()
                    row[backend] = {
                        "cold_us": round(isolated(fn, flush), 2),
                        "warm_us": round(isolated(fn, None), 2),
                        "b2b_us": round(back_to_back(fn), 2),
                    }
                    if rows in (32, 4096) and backend != "torch":
                        row[backend]["kernels"] = kernels(fn)
                auto = lambda: dualk.fused_mlp(x, ws, bs, activation="relu")
                for _ in range(3):
                    auto()
                row["explain"] = str(dualk.explain("fused_mlp", x, ws, bs, activation="relu"))
                row["explain_cuda"] = str(
                    dualk.explain("fused_mlp", x, ws, bs, activation="relu", backend="cuda")
                )
            print(json.dumps(row))
            out["rows"].append(row)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
