"""Does a fuse'd small MLP's call wait for the GPU? (issue 32, small batch)

On an H200 (session 27) the fuse'd 112-128-128-10 fp16 module cost 11.9 us per call at 256 rows
and 18.6 at 4096, while dualk.fused_mlp(backend="cuda") cost 7.7 host us at both sizes. Extra
host time that grows with the kernel's own time looks like a wait for the GPU on every call.
This probe queues a long GPU sleep, then enqueues N calls of each path and reads the host time:
a path that never waits enqueues in microseconds; one that waits shows the sleep. It also
sets the C++ plan's run (MlpPlan.run) beside the extension's plain launch: the plan does less
work per call, yet the module cost more host time than the functional call.

    python experiments/module_sync_probe.py [--rows 256 4096] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import dualk  # noqa: E402
from dualk.backends import cuda as cuda_backend  # noqa: E402
from dualk.core import timing  # noqa: E402
from dualk.dispatch import triton_tune  # noqa: E402
from host_cost import host_us  # noqa: E402  (bench/host_cost.py: back to back, synchronized)

SLEEP_US = 3000.0
CALLS = 20


def host_us_behind_sleep(fn) -> float:
    """Host microseconds per call of CALLS calls enqueued behind a SLEEP_US GPU sleep."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(SLEEP_US * timing.CYCLES_PER_US))
    t0 = time.perf_counter()
    for _ in range(CALLS):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / CALLS * 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[256, 4096])
    ap.add_argument("--json")
    a = ap.parse_args()
    dev = torch.device("cuda")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": {}}
    for rows in a.rows:
        torch.manual_seed(0)
        model = (
            nn.Sequential(
                nn.Linear(112, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
            )
            .to(dev, torch.float16)
            .eval()
        )
        fused = dualk.fuse(model)
        fm = next(m for m in fused.modules() if isinstance(m, dualk.nn.FusedMLP))
        x = torch.randn(rows, 112, device=dev, dtype=torch.float16)
        ws = [m.weight for m in model if isinstance(m, nn.Linear)]
        bs = [m.bias for m in model if isinstance(m, nn.Linear)]
        with torch.no_grad():
            for _ in range(60):
                fused(x)
                dualk.fused_mlp(x, ws, bs, activation="relu", backend="cuda")
            # auto's final decisions (Triton's background tuner done): before that the module's
            # decision is provisional and its C++ plan is not built (session 27's first run of
            # this probe timed that state)
            triton_tune.settle(lambda: (fused(x), torch.cuda.synchronize()), 90.0)
            for _ in range(60):
                fused(x)
            torch.cuda.synchronize()
            fast = fm.__dict__.get("_fast")
            launch = cuda_backend.extension("mlp").fused_mlp
            out_buf = torch.empty(rows, 10, device=dev, dtype=torch.float16)
            paths = {
                "functional cuda": lambda: dualk.fused_mlp(
                    x, ws, bs, activation="relu", backend="cuda"
                ),
                "functional auto": lambda: dualk.fused_mlp(x, ws, bs, activation="relu"),
                "fuse'd model": lambda: fused(x),
                "FusedMLP module": lambda: fm(x),
                "empty + nothing": lambda: torch.empty(rows, 10, device=dev, dtype=torch.float16),
                "extension launch": lambda: launch(x, ws, bs, out_buf, 1),  # (1: relu)
            }
            if fast is not None:
                paths["MlpPlan.run"] = lambda: fast.plan.run(x)
            res = {}
            for name, fn in paths.items():
                behind = [host_us_behind_sleep(fn) for _ in range(5)]
                free = [host_us(fn, 200) for _ in range(5)]
                res[name] = {
                    "host_us_behind_sleep": statistics.median(behind),
                    "host_us_free": statistics.median(free),
                    "waits": statistics.median(behind) > 0.5 * SLEEP_US / CALLS,
                }
                print(f"rows {rows:5d} {name:18s} behind a {SLEEP_US:.0f} us sleep: "
                      f"{res[name]['host_us_behind_sleep']:8.1f} us/call, free "
                      f"{res[name]['host_us_free']:6.1f} us/call"
                      f"{'  <- WAITS FOR THE GPU' if res[name]['waits'] else ''}")  # fmt: skip
            res["fast_plan"] = fast is not None
        out["rows"][rows] = res
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
