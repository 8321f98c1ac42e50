"""Where the host time of one `dualk.linear_gelu` / `dualk.linear_glu` call goes (GPU only):
each layer of the call timed alone, from the extension's launcher with a preallocated output to
the operator on "auto", beside PyTorch's own ops on the same tensors, and a cProfile of the
operator's CUDA route sorted by own time.

    python3 experiments/host_gemm_pieces.py [--json F]

Why: bench/host_cost.py (H200, sessions 32 and 34) put `dualk.linear_gelu` (cuda) at 30.8 / 40.5
us of host per call against F.gelu(F.linear) 27.0 / 35.2, and `dualk.linear_glu` at 28.0 / 38.2,
while fused_mlp's planned call (one C++ crossing) takes 11: whether a planned call would pay for
these two operators depends on how much of their time is Python and how much the launcher.
Timing as bench/host_cost.py: N calls back to back without synchronising, wall time / N, the
rows interleaved within each repeat, median of the repeats. Shapes: host_cost's module rows
(x (2, 8, 768) -> 3072 bf16 for linear_gelu; (2, 8, 1024) -> 2816 silu for linear_glu).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import dualk  # noqa: E402
from dualk.backends import cuda as cuda_backend  # noqa: E402
from host_cost import host_us  # noqa: E402  (bench/host_cost.py's timer)

CALLS = 200
REPEATS = 9


def interleaved(rows: dict) -> dict:
    samples = {name: [] for name in rows}
    for fn in rows.values():  # warm: builds, tunes, caches
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    for _ in range(REPEATS):
        for name, fn in rows.items():
            samples[name].append(host_us(fn, CALLS))
    return {name: round(statistics.median(s), 2) for name, s in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a GPU")
        return 1
    torch.manual_seed(0)
    kw = {"device": "cuda", "dtype": torch.bfloat16}
    ext = cuda_backend.extension("gemm")
    x = torch.randn(2, 8, 768, **kw)
    x2d = x.reshape(16, 768)
    w = torch.randn(3072, 768, **kw) / 28
    b = torch.randn(3072, **kw)
    out = torch.empty(16, 3072, **kw)
    gelu = cuda_backend.ACTIVATION_CODES["gelu_tanh"]
    xg = torch.randn(2, 8, 1024, **kw)
    xg2d = xg.reshape(16, 1024)
    wg = torch.randn(2816, 1024, **kw) / 32
    wu = torch.randn(2816, 1024, **kw) / 32
    outg = torch.empty(16, 2816, **kw)
    silu = cuda_backend.GLU_ACTIVATION_CODES[("silu", "tanh")]
    rows = {
        "torch.empty (16, 3072)": lambda: torch.empty((16, 3072), **kw),
        "torch.add 16 elements": lambda: torch.add(b[:16], b[:16]),
        "F.linear": lambda: F.linear(x, w, b),
        "F.gelu(F.linear)": lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
        "gelu launcher alone (out given)": lambda: ext.linear_gelu(x2d, w, b, out, gelu, False),
        "gelu backend function (cuda.linear_gelu)": lambda: cuda_backend.linear_gelu(x, w, b),
        "gelu dualk.linear_gelu cuda": lambda: dualk.linear_gelu(x, w, b, backend="cuda"),
        "gelu dualk.linear_gelu auto": lambda: dualk.linear_gelu(x, w, b),
        "silu(linear) * linear": lambda: F.silu(F.linear(xg, wg)) * F.linear(xg, wu),
        "glu launcher alone (out given)": lambda: ext.linear_glu(
            xg2d, wg, wu, None, None, outg, silu, False
        ),
        "glu backend function (cuda.linear_glu)": lambda: cuda_backend.linear_glu(xg, wg, wu),
        "glu dualk.linear_glu cuda": lambda: dualk.linear_glu(xg, wg, wu, backend="cuda"),
        "glu dualk.linear_glu auto": lambda: dualk.linear_glu(xg, wg, wu),
    }
    with torch.no_grad():
        host = interleaved(rows)
        profiles = {}
        for name, fn in (
            ("linear_gelu cuda", rows["gelu dualk.linear_gelu cuda"]),
            ("linear_glu cuda", rows["glu dualk.linear_glu cuda"]),
        ):
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(2000):
                fn()
            prof.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
            profiles[name] = text.getvalue()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; host us per call, "
          f"median of {REPEATS} x {CALLS} calls")  # fmt: skip
    for name, us in host.items():
        print(f"  {name:44s} {us:8.2f}")
    for name, text in profiles.items():
        print(f"\n== cProfile, 2000 calls of {name} (own time)\n{text}")
    if args.json:
        args.json.write_text(json.dumps({
            "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "host_us": host, "profiles": profiles,
        }, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
