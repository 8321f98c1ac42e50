"""dualk's public operators. Each validates its inputs once (dualk/validate.py), asks the
dispatcher which backend runs (dualk/dispatch.py), and calls that backend's implementation
(dualk/registry.py maps the names). Inputs are never modified; outputs are fresh tensors.

Every operator takes `backend="auto" | "cuda" | "triton" | "torch"` (see dualk.dispatch for the
precedence of arguments, environment variables, scopes and the config file)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch

from . import dispatch, validate
from .layout import as_rows
from .registry import OPS

_ADD, _RELU_SCALE, _MATMUL, _LINEAR_GELU, _FUSED_MLP = (
    OPS[n] for n in ("add", "relu_scale", "matmul", "linear_gelu", "fused_mlp")
)
MLP_ACTIVATIONS = ("relu", "gelu", "silu", "none")
GELU_APPROXIMATIONS = ("tanh", "none")


def add(
    a: torch.Tensor, b: torch.Tensor, *, alpha: float = 1.0, backend: str = "auto"
) -> torch.Tensor:
    """`a + alpha * b` with torch.add's broadcasting, for floating tensors of one dtype
    (float32, float16, bfloat16) on one device. Computed in fp32, rounded once."""
    _check_add(a, b, alpha)
    name = dispatch.choose(_ADD, backend, a)
    return _ADD.implementation(name)(a, b, float(alpha))


def _check_add(a, b, alpha) -> None:
    validate.tensor("add", "a", a)
    validate.tensor("add", "b", b)
    if a.dtype is not b.dtype or a.device != b.device:
        validate.same_pair("add", ("a", a), ("b", b))
    validate.real_number("add", "alpha", alpha)
    if a.shape != b.shape:
        try:
            torch.broadcast_shapes(a.shape, b.shape)
        except RuntimeError:
            raise ValueError(
                f"dualk.add: shapes {tuple(a.shape)} ('a') and {tuple(b.shape)} ('b') do not broadcast"
            ) from None


def relu_scale(x: torch.Tensor, scale: float, *, backend: str = "auto") -> torch.Tensor:
    """`relu(x) * scale` in one pass; `scale` is a Python number. NaN stays NaN (as torch.relu)."""
    _check_relu_scale(x, scale)
    name = dispatch.choose(_RELU_SCALE, backend, x)
    return _RELU_SCALE.implementation(name)(x, float(scale))


def _check_relu_scale(x, scale) -> None:
    validate.tensor("relu_scale", "x", x)
    validate.real_number("relu_scale", "scale", scale)


def matmul(a: torch.Tensor, b: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """`a @ b` for (M, K) @ (K, N) -> (M, N) and (B, M, K) @ (B, K, N) -> (B, M, N) (a 2-dim
    operand is broadcast over the other's batch). fp32 accumulation; fp32 inputs use TF32 only
    when torch.backends.cuda.matmul.allow_tf32 allows it."""
    _check_matmul(a, b)
    name = dispatch.choose(_MATMUL, backend, a)
    return _MATMUL.implementation(name)(a, b)


def _check_matmul(a, b) -> None:
    validate.tensor("matmul", "a", a)
    validate.tensor("matmul", "b", b)
    validate.same_dtype_and_device("matmul", {"a": a, "b": b})
    for name, t in (("a", a), ("b", b)):
        if t.dim() not in (2, 3):
            raise ValueError(
                f"dualk.matmul: '{name}' must be 2-dim or 3-dim (batched), got shape {tuple(t.shape)}"
            )
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"dualk.matmul: inner sizes differ: 'a' {tuple(a.shape)} has K={a.shape[-1]}, "
            f"'b' {tuple(b.shape)} has K={b.shape[-2]}"
        )
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] != b.shape[0]:
        raise ValueError(
            f"dualk.matmul: batch sizes differ: 'a' has {a.shape[0]}, 'b' has {b.shape[0]}"
        )


def linear_gelu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    approximate: str = "tanh",
    backend: str = "auto",
) -> torch.Tensor:
    """`gelu(x @ weight.T + bias)` with nn.Linear's layout: x (..., in), weight (out, in), bias
    (out,) or None; `approximate` as in torch.nn.functional.gelu ("tanh" or "none")."""
    _check_linear("linear_gelu", x, weight, bias)
    validate.choice("linear_gelu", "approximate", approximate, GELU_APPROXIMATIONS)
    name = dispatch.choose(_LINEAR_GELU, backend, x)
    return _LINEAR_GELU.implementation(name)(x, weight, bias, approximate)


def _check_linear(op, x, weight, bias, wname="weight", bname="bias") -> None:
    validate.tensor(op, "x", x)
    validate.tensor(op, wname, weight)
    if bias is not None:
        validate.tensor(op, bname, bias)
    validate.same_dtype_and_device(op, {"x": x, wname: weight, bname: bias})
    validate.ndim_at_least(op, "x", x, 1)
    if weight.dim() != 2:
        raise ValueError(
            f"dualk.{op}: '{wname}' must be 2-dim (out, in), got shape {tuple(weight.shape)}"
        )
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"dualk.{op}: 'x' has {x.shape[-1]} features (shape {tuple(x.shape)}) but '{wname}' "
            f"expects {weight.shape[1]} (shape {tuple(weight.shape)})"
        )
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(
            f"dualk.{op}: '{bname}' must have shape ({weight.shape[0]},), got {tuple(bias.shape)}"
        )


def fused_mlp(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None],
    *,
    activation: str = "relu",
    backend: str = "auto",
) -> torch.Tensor:
    """A whole MLP in one kernel launch: `L_n(act(... act(L_1(x))))`, `L_i(h) = h @ W_i.T + b_i`.

    weights[i] in nn.Linear layout (out_i, in_i); biases[i] (out_i,) or None; the activation
    ("relu", "gelu" (tanh), "silu" or "none") follows every layer but the last; x (..., in_0).
    Widths too large for the fused kernels run as a per-layer chain of the same backend's
    kernels (dualk.explain says so)."""
    _check_mlp(x, weights, biases, activation)
    name = dispatch.choose(_FUSED_MLP, backend, x)
    if name != "torch":
        reason = mlp_fallback_reason(name, x, weights)
        if reason is not None:
            return _mlp_chain(name, x, weights, biases, activation)
    return _FUSED_MLP.implementation(name)(x, list(weights), list(biases), activation)


def _check_mlp(x, weights, biases, activation) -> None:
    if isinstance(weights, torch.Tensor) or not isinstance(weights, Sequence) or not weights:
        raise TypeError("dualk.fused_mlp: 'weights' must be a non-empty list of 2-dim tensors")
    if (
        isinstance(biases, torch.Tensor)
        or not isinstance(biases, Sequence)
        or len(biases) != len(weights)
    ):
        raise TypeError(
            f"dualk.fused_mlp: 'biases' must be a list with one entry (tensor or None) per layer "
            f"({len(weights)} layers)"
        )
    if activation not in MLP_ACTIVATIONS:
        validate.choice("fused_mlp", "activation", activation, MLP_ACTIVATIONS)
    validate.tensor("fused_mlp", "x", x)
    validate.ndim_at_least("fused_mlp", "x", x, 1)
    dtype, device, width = x.dtype, x.device, x.shape[-1]
    for i, (w, b) in enumerate(zip(weights, biases)):
        # One cheap test per layer on the hot path; the detailed checks only explain a failure.
        if not (
            type(w) is torch.Tensor
            and w.dim() == 2
            and w.shape[1] == width
            and w.dtype is dtype
            and w.device == device
            and (
                b is None
                or (
                    type(b) is torch.Tensor
                    and b.shape == (w.shape[0],)
                    and b.dtype is dtype
                    and b.device == device
                )
            )
        ):
            _explain_bad_layer(x, i, width, w, b)
        width = w.shape[0]


def _explain_bad_layer(x, i, width, w, b) -> None:
    name, bname = f"weights[{i}]", f"biases[{i}]"
    validate.tensor("fused_mlp", name, w)
    if b is not None:
        validate.tensor("fused_mlp", bname, b)
    validate.same_pair("fused_mlp", ("x", x), (name, w), (bname, b))
    if w.dim() != 2:
        raise ValueError(
            f"dualk.fused_mlp: '{name}' must be 2-dim (out, in), got shape {tuple(w.shape)}"
        )
    if w.shape[1] != width:
        source = "'x'" if i == 0 else f"layer {i - 1} (its output)"
        raise ValueError(
            f"dualk.fused_mlp: {source} has {width} features but '{name}' (shape "
            f"{tuple(w.shape)}) expects {w.shape[1]}"
        )
    raise ValueError(
        f"dualk.fused_mlp: '{bname}' must have shape ({w.shape[0]},), got {tuple(b.shape)}"
    )


_fallback_reasons: dict[tuple, str | None] = {}


def mlp_fallback_reason(
    backend: str, x: torch.Tensor, weights: Sequence[torch.Tensor]
) -> str | None:
    """Why `backend`'s fused kernel cannot hold this MLP on chip (None when it can); remembered
    per (backend, widths, dtype, device) so the hot path pays a dict lookup."""
    widths = (weights[0].shape[1], *(w.shape[0] for w in weights))
    key = (backend, widths, x.dtype, x.device)
    if key not in _fallback_reasons:
        check = _FUSED_MLP.backend_function(backend, "fused_mlp_unsupported_reason")
        with _device_of(x):
            _fallback_reasons[key] = check(list(widths), x.dtype)
    return _fallback_reasons[key]


def _device_of(x: torch.Tensor):
    """The input's device as the current one (a device query inside a limit check reads it)."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _mlp_chain(backend, x, weights, biases, activation) -> torch.Tensor:
    """Per-layer chain of `backend`'s kernels: its matmul for every layer (its linear_gelu where
    the activation is gelu), bias and the other activations through PyTorch."""
    from .backends.torch_ref import ACTIVATIONS

    matmul_impl = _MATMUL.implementation(backend)
    linear_gelu_impl = _LINEAR_GELU.implementation(backend)
    h = as_rows(x)
    last = len(weights) - 1
    for i, (w, b) in enumerate(zip(weights, biases)):
        if activation == "gelu" and i != last:
            h = linear_gelu_impl(h, w, b, "tanh")
            continue
        h = matmul_impl(h, w.t())
        if b is not None:
            h = h + b
        if i != last:
            h = ACTIVATIONS[activation](h)
    return h.reshape(*x.shape[:-1], weights[-1].shape[0])


_CHECKS = {
    "add": lambda a, b, alpha=1.0: _check_add(a, b, alpha),
    "relu_scale": _check_relu_scale,
    "matmul": _check_matmul,
    "linear_gelu": lambda x, w, b=None, approximate="tanh": _check_linear("linear_gelu", x, w, b),
    "fused_mlp": lambda x, w, b, activation="relu": _check_mlp(x, w, b, activation),
}


def explain(op_name: str, *args, backend: str = "auto", **kwargs) -> dispatch.Explanation:
    """Which backend `dualk.<op_name>(*args, **kwargs)` would run on, where that choice came
    from, and why each other backend is or is not available. Runs nothing."""
    from .registry import get

    spec = get(op_name)
    _CHECKS[op_name](*args, **kwargs)
    like = args[0]
    name, source = dispatch.requested(spec, backend)
    availability = dict(dispatch.auto_candidates(spec, like.device, like.dtype))
    if name != "auto":
        from .backends import unavailable_reason

        availability[name] = unavailable_reason(name, like.device)
    chosen = (
        dispatch.choose(spec, backend, like)
        if name == "auto" or availability[name] is None
        else name
    )
    if name == "auto":
        source = f"auto (first available of {', '.join(spec.auto_order_for(like.dtype))})"
    expl = dispatch.Explanation(op_name, chosen, source, availability)
    if availability.get(chosen) is not None:
        expl.notes.append(f"{chosen!r} cannot run this call, so the call would raise")
    elif op_name == "fused_mlp" and chosen != "torch":
        reason = mlp_fallback_reason(chosen, like, args[1])
        if reason is not None:
            expl.notes.append(f"not fused: {reason}; runs as a per-layer chain of {chosen} kernels")
    return expl
