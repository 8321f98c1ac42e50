"""Host cost of dualk's Python layer on a CPU-only machine: microseconds per call of an eager
call with the kernel launch replaced by a stub, next to torch's own call.

    python3 experiments/host_dispatch_cpu.py [--number 20000] [--repeat 15]

Two stub levels:
- "impl": the implementation the registry returns (spec._resolved[backend]) returns a
  preallocated tensor: ops.py + dispatch + autotune only;
- "launch": the CUDA backend's extension (backends/cuda.py `_extension`) and the Triton
  backend's launch modules (`_module`) are fakes that return at once: the backend wrapper's
  Python (checks, plan, allocation) is included, the C++/Triton launch is not.
The CPU tensors pass for CUDA ones: both backends' availability checks are replaced by ones
that accept the CPU, and "auto" gets a decision planted in autotune's memory for the call's key
("torch", which the H100 hosts pick for these tiny calls, then "cuda"), so an auto call is a
cache hit as on a GPU. Min and median of `repeat` runs of
`number` calls each (timeit; no GPU, no sync).

Why: the GPU hosts are ~2x slower than this CPU and measured dualk.add at +4.7 to +7.8 us over
torch.add; the Python layer is what can be cut here, and this table is the yardstick."""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit
import types
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dualk  # noqa: E402
from dualk.dispatch import autotune
from dualk.backends import cuda as cuda_backend  # noqa: E402
from dualk.backends import triton as triton_backend  # noqa: E402
from dualk.registry import OPS  # noqa: E402


def _us(fn, number: int, repeat: int) -> tuple[float, float]:
    runs = timeit.repeat(fn, number=number, repeat=repeat)
    per = [t / number * 1e6 for t in runs]
    return min(per), statistics.median(per)


def _pretend_gpu() -> None:
    """CPU tensors pass both backends' availability checks (the GPU path's cost: a device type
    test, then a module global); the launches return at once."""

    def cuda_ok(device):
        return None if device.type == "cpu" else f"not the CPU: {device}"

    def triton_ok(device):
        if device.type not in ("cuda", "cpu"):
            return f"not the CPU: {device}"
        return triton_backend._triton_importable()

    cuda_backend.unavailable_reason = cuda_ok
    triton_backend.unavailable_reason = triton_ok


def _fake_launchers(outs: dict) -> None:
    ext = types.SimpleNamespace(
        add_dense=lambda a, b, alpha: outs["add"],
        relu_scale_dense=lambda x, scale: outs["relu_scale"],
        add=lambda *args: None,
        relu_scale=lambda *args: None,
        linear_gelu=lambda *args: None,
    )
    cuda_backend._extension = ext
    mods = {
        "elementwise": types.SimpleNamespace(MAX_DIMS=4),
        "add": types.SimpleNamespace(add=lambda *args: None),
        "relu_scale": types.SimpleNamespace(relu_scale=lambda *args: None),
        "linear_gelu": types.SimpleNamespace(
            linear_gelu=lambda x2d, w, b, approximate, allow_tf32: outs["linear_gelu"]
        ),
    }
    triton_backend._module = mods.__getitem__  # a dict lookup, as functools.cache's hit


def _decide(spec, args, name: str) -> None:
    """auto's remembered decision for args' key, as a timing on a GPU host would leave it."""
    key = autotune.make_key(spec, args)
    autotune._remember(key, {"op": spec.name, "key": autotune.key_string(key), "backend": name,
                             "source": "planted by host_dispatch_cpu.py"})  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=15)
    opt = parser.parse_args()
    torch.manual_seed(0)
    a, b = torch.randn(16), torch.randn(16)
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    w = torch.randn(128, 64, dtype=torch.bfloat16)
    bias = torch.randn(128, dtype=torch.bfloat16)
    outs = {"add": torch.empty(16), "relu_scale": torch.empty(16),
            "linear_gelu": torch.empty(8, 128, dtype=torch.bfloat16)}  # fmt: skip
    calls = {
        "add": (lambda be: dualk.add(a, b, backend=be), (a, b, 1.0), lambda: torch.add(a, b)),
        "relu_scale": (lambda be: dualk.relu_scale(a, 2.0, backend=be), (a, 2.0),
                       lambda: torch.relu(a) * 2.0),
        "linear_gelu": (lambda be: dualk.linear_gelu(x, w, bias, backend=be),
                        (x, w, bias, "tanh"),
                        lambda: F.gelu(F.linear(x, w, bias), approximate="tanh")),
    }  # fmt: skip
    _pretend_gpu()
    rows = []
    timing = (opt.number, opt.repeat)
    with torch.no_grad():
        for op, (call, args, eager) in calls.items():
            spec = OPS[op]
            rows.append((op, "torch eager (real compute)", *_us(eager, *timing)))
            rows.append((op, "dualk backend='torch' (real)", *_us(lambda: call("torch"), *timing)))
            _decide(spec, args, "torch")  # what a GPU host decides for these tiny calls
            rows.append((op, "dualk auto -> torch (real)", *_us(lambda: call("auto"), *timing)))
            _decide(spec, args, "cuda")
            saved = dict(spec._resolved)
            for be in ("cuda", "triton"):
                out = outs[op]
                spec._resolved[be] = lambda *args, out=out: out
            for be in ("auto", "cuda", "triton"):
                rows.append((op, f"dualk {be} (impl stub)", *_us(lambda: call(be), *timing)))
            spec._resolved.clear()
            spec._resolved.update(saved)
            _fake_launchers(outs)
            for be in ("auto", "cuda", "triton"):
                rows.append((op, f"dualk {be} (launch stub)", *_us(lambda: call(be), *timing)))
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}; "
          f"us per call, {opt.repeat} x {opt.number} calls")  # fmt: skip
    print(f"{'op':12s} {'call':32s} {'min':>7s} {'median':>7s}")
    for op, what, lo, med in rows:
        print(f"{op:12s} {what:32s} {lo:7.3f} {med:7.3f}")


if __name__ == "__main__":
    main()
