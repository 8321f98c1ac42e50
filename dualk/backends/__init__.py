"""The three implementations of every operator: "cuda" (JIT-built C++), "triton" and "torch" (the
PyTorch reference, also the test oracle). `unavailable_reason` answers, per backend and device,
whether it can run at all; operator-specific limits live in the registry."""

from __future__ import annotations

import importlib

import torch

BACKENDS = ("cuda", "triton", "torch")


_modules: dict = {}  # "cuda" / "triton" -> its module, imported on first use


def unavailable_reason(backend: str, device: torch.device, op: str | None = None) -> str | None:
    """None when `backend` can run on tensors of `device`, else a sentence saying why not. With
    `op`, the CUDA backend answers for that operator's extension family, building it in this
    call when it is not built yet (an explicit request may wait; "auto" never asks this way)."""
    if backend in ("torch", "auto"):  # "auto" always has torch to fall back on
        return None
    module = _modules.get(backend)
    if module is None:  # an import statement per call cost ~0.2 us of a named-backend call
        if backend not in ("cuda", "triton"):
            raise ValueError(f"unknown backend {backend!r}")
        module = _modules[backend] = importlib.import_module(f"{__name__}.{backend}")
    if op is not None and backend == "cuda":
        return module.unavailable_reason(device, op)
    return module.unavailable_reason(device)


# PyTorch's TF32 switch for matrix ops (torch.backends.cuda.matmul.allow_tf32, set by
# torch.set_float32_matmul_precision): that attribute costs ~0.6 us (a module __getattr__), the
# getter it calls ~0.07 us.
tf32_allowed = getattr(torch._C, "_get_cublas_allow_tf32", None) or (
    lambda: torch.backends.cuda.matmul.allow_tf32
)


def allow_tf32(dtype: torch.dtype) -> bool:
    """Whether an fp32 matrix op may use TF32 (PyTorch's own switch, tf32_allowed)."""
    return dtype == torch.float32 and tf32_allowed()
