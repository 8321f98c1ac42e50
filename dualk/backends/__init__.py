"""The three implementations of every operator: "cuda" (JIT-built C++), "triton" and "torch" (the
PyTorch reference, also the test oracle). `unavailable_reason` answers, per backend and device,
whether it can run at all; operator-specific limits live in the registry."""

from __future__ import annotations

import torch

BACKENDS = ("cuda", "triton", "torch")


def unavailable_reason(backend: str, device: torch.device) -> str | None:
    """None when `backend` can run on tensors of `device`, else a sentence saying why not."""
    if backend in ("torch", "auto"):  # "auto" always has torch to fall back on
        return None
    if backend == "cuda":
        from . import cuda

        return cuda.unavailable_reason(device)
    if backend == "triton":
        from . import triton

        return triton.unavailable_reason(device)
    raise ValueError(f"unknown backend {backend!r}")


def allow_tf32(dtype: torch.dtype) -> bool:
    """Whether an fp32 matrix op may use TF32: PyTorch's own switch
    (torch.backends.cuda.matmul.allow_tf32, set by torch.set_float32_matmul_precision)."""
    return dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
