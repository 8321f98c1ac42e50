"""The "triton" backend: thin wrappers that plan layouts, allocate outputs and call the launch
functions in triton_src/ (imported on first use, so importing dualk never imports Triton).

Triton launches on the current device's current stream; when the input lives on another device
the launch runs under that device's guard."""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
from collections.abc import Sequence

import torch

from ..core import alloc as _alloc
from ..core.layout import as_rows, fit_plan, plan_elementwise
from . import allow_tf32
from .torch_ref import split_glu_parameters

_import_error: str | None = None
_triton_checked = False


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def triton_importable() -> str | None:
    """Why Triton cannot be imported here, or None (the import is tried once)."""
    global _triton_checked, _import_error
    if not _triton_checked:
        try:
            importlib.import_module("triton")
        except Exception as exc:  # ImportError, or a broken install raising something else
            _import_error = f"Triton cannot be imported ({type(exc).__name__}: {exc})"
        _triton_checked = True
    return _import_error


def unavailable_reason(device: torch.device) -> str | None:
    if device.type == "cpu" and not interpreter_enabled():
        return (
            "the Triton backend needs CUDA tensors (or TRITON_INTERPRET=1 set before import, "
            "to run on the CPU through Triton's interpreter); the input is on cpu"
        )
    if device.type not in ("cuda", "cpu"):
        return f"the Triton backend needs CUDA tensors; the input is on {device}"
    return triton_importable()


@functools.cache
def kernel_module(name: str):
    """triton_src/<name>.py, the launcher module (imported on first use)."""
    return importlib.import_module(f"dualk.triton_src.{name}")


def _device_guard(t: torch.Tensor):
    index = t.get_device()  # -1 off CUDA; cheaper than t.device, which builds an object
    if index >= 0 and index != torch.cuda.current_device():
        return torch.cuda.device(index)
    return contextlib.nullcontext()


# ---------------------------------------------------------------------------- operators
def _output(plan, like: torch.Tensor) -> torch.Tensor:
    """The contiguous output of `plan`; empty_like (~1 us less host time than empty(shape, ...))
    when an operand has the output's shape."""
    if like.shape == plan.out_shape:
        return _alloc.empty_like_contiguous(like)
    return _alloc.empty(plan.out_shape, like.dtype, like.device)


def add(a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    plan = plan_elementwise(a, b)
    out = _output(plan, a)
    if plan.numel:
        a, b, plan = fit_plan(plan, kernel_module("elementwise").MAX_DIMS, a, b)
        with _device_guard(out):
            kernel_module("add").add(a, b, out, alpha, plan)
    return out


def relu_scale(x: torch.Tensor, scale: float) -> torch.Tensor:
    plan = plan_elementwise(x)
    out = _output(plan, x)
    if plan.numel:
        x, plan = fit_plan(plan, kernel_module("elementwise").MAX_DIMS, x)
        with _device_guard(out):
            kernel_module("relu_scale").relu_scale(x, out, scale, plan)
    return out


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    with _device_guard(a):
        return kernel_module("matmul").matmul(a, b, allow_tf32=allow_tf32(a.dtype))


def linear_gelu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    approximate: str = "tanh",
) -> torch.Tensor:
    x2d = as_rows(x)
    out, out_rows = _alloc.rows_output(x, weight.shape[0])
    with _device_guard(x):
        kernel_module("linear_gelu").linear_gelu(
            x2d, weight, bias, approximate=approximate, allow_tf32=allow_tf32(x.dtype),
            out=out_rows,
        )  # fmt: skip
    return out


def fused_mlp_unsupported_reason(widths: Sequence[int], dtype: torch.dtype) -> str | None:
    return kernel_module("fused_mlp").fused_mlp_unsupported_reason(widths, dtype)


def fused_mlp(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None],
    activation: str = "relu",
) -> torch.Tensor:
    x2d = as_rows(x)
    out, out_rows = _alloc.rows_output(x, weights[-1].shape[0])
    with _device_guard(x):
        kernel_module("fused_mlp").fused_mlp(
            x2d, weights, biases, activation=activation, out=out_rows
        )  # fmt: skip
    return out


def linear_glu(
    x: torch.Tensor,
    weight_gate: torch.Tensor,
    weight_up: torch.Tensor | None = None,
    bias_gate: torch.Tensor | None = None,
    bias_up: torch.Tensor | None = None,
    activation: str = "silu",
    approximate: str = "tanh",
) -> torch.Tensor:
    wg, wu, bg, bu = split_glu_parameters(weight_gate, weight_up, bias_gate, bias_up)
    x2d = as_rows(x)
    out, out_rows = _alloc.rows_output(x, wg.shape[0])
    with _device_guard(x):
        kernel_module("linear_glu").linear_glu(
            x2d, wg, wu, bg, bu, activation=activation, approximate=approximate,
            allow_tf32=allow_tf32(x.dtype), out=out_rows,
        )  # fmt: skip
    return out


def linear_glu_train(
    x: torch.Tensor,
    weight_gate: torch.Tensor,
    weight_up: torch.Tensor | None = None,
    bias_gate: torch.Tensor | None = None,
    bias_up: torch.Tensor | None = None,
    activation: str = "silu",
    approximate: str = "tanh",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """linear_glu's training forward: (out, gate, up) from one launch of the same kernel, which
    also stores both pre-activations (out is linear_glu's answer bit for bit)."""
    wg, wu, bg, bu = split_glu_parameters(weight_gate, weight_up, bias_gate, bias_up)
    x2d = as_rows(x)
    out, out_rows = _alloc.rows_output(x, wg.shape[0])
    with _device_guard(x):
        _, gate, up = kernel_module("linear_glu").linear_glu(
            x2d, wg, wu, bg, bu, activation=activation, approximate=approximate,
            allow_tf32=allow_tf32(x.dtype), store_pre=True, out=out_rows,
        )  # fmt: skip
    shape = (*x.shape[:-1], wg.shape[0])
    return out, gate.reshape(shape), up.reshape(shape)


def linear_glu_grad_pre(
    grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str, approximate: str
) -> torch.Tensor:
    """linear_glu's backward, elementwise part, in one pass (triton_src/linear_glu_backward.py):
    [d_gate | d_up] (M, 2N) from grad, gate, up (M, N)."""
    with _device_guard(gate):
        return kernel_module("linear_glu_backward").glu_backward(
            grad, gate, up, activation, approximate
        )
