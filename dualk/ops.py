"""dualk's public operators.

Each public function has two routes to the same code:
- eager and direct (the common inference call: plain tensors or nn.Parameters, no gradient
  needed, not under torch.compile): validate (dualk/validate.py), ask the dispatcher which backend
  runs (dualk/dispatch.py), call that backend's implementation (dualk/registry.py maps the names).
  This skips PyTorch's op dispatcher, which costs several microseconds per call by itself;
- through the registered custom op `torch.ops.dualk.<op>` (dualk/library.py) whenever autograd
  must record the call, under torch.compile / export tracing (fake tensors, no graph break), and
  for tensor subclasses. The op's implementation is `_run_<op>` below, the same function the
  direct route calls, so both routes give bit-identical results.

The backend is decided inside `_run_<op>`, at run time: tracing never reads environment
variables, config files or autotuning caches, and a compiled graph follows the backend settings
in force when it runs. Inputs are never modified; outputs are fresh contiguous tensors.

Every operator takes `backend="auto" | "cuda" | "triton" | "torch"` (see dualk.dispatch for the
precedence of arguments, environment variables, scopes and the config file).

Why one file of ~700 lines: the five operators' public functions and their hot-path checks sit
together so that each route's cost is visible in one place (validation itself is validate.py)."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence

import torch
from torch.nn import Parameter, ParameterList

from . import dispatch
from .core import validate
from .core.errors import InvalidArgumentError, InvalidTypeError, ShapeError
from .core.layout import as_rows
from .dispatch import autotune
from .registry import OPS

_ADD, _RELU_SCALE, _MATMUL, _LINEAR_GELU, _FUSED_MLP, _LINEAR_GLU = (
    OPS[n] for n in ("add", "relu_scale", "matmul", "linear_gelu", "fused_mlp", "linear_glu")
)
# "gelu" is the tanh approximation (as the CUDA seed's kernel); "gelu_erf" is nn.GELU()'s default.
MLP_ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "gelu_erf", "silu", "none")
GELU_APPROXIMATIONS = ("tanh", "none")
GLU_ACTIVATIONS = ("silu", "gelu", "relu")

_FLOAT_DTYPES = frozenset(validate.FLOAT_DTYPES)
# torch.autocast: one C call when it is off (the common case); Dynamo traces the per-device
# checks in _autocast_dtype itself, so under torch.compile those are asked directly.
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)
# torch.func transforms (vmap, grad, jacrev, ...) wrap tensors that have no storage for a kernel
# to read, and dualk's autograd.Function does not compose with them: under a transform the ops
# run PyTorch's implementation, which does (0.04 us a call to ask).
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)
_F64 = torch.float64
_is_compiling = torch.compiler.is_compiling
# torch.jit.trace: a direct call's kernel launch would be missing from the trace (its outputs
# frozen as constants), so traced calls take the registered op, which the trace records.
_is_tracing = torch._C._is_tracing
_is_grad_enabled = torch.is_grad_enabled
_Tensor = torch.Tensor
_F32 = torch.float32


def _autocast_dtype(t) -> torch.dtype | None:
    """The dtype torch.autocast runs matmul-like ops in on t's device type, or None when autocast
    is off there (or t is no tensor: the checks then name it)."""
    if not isinstance(t, torch.Tensor):
        return None
    device_type = t.device.type
    # Autocast knows cuda and cpu (dualk's devices); asking it about others (meta) raises.
    if device_type in ("cuda", "cpu") and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def _autocast(dtype: torch.dtype, t):
    """Autocast's cast for matmul-like ops (as for F.linear / torch.mm): floating tensors other
    than float64 to the autocast dtype; differentiable, so gradients reach fp32 parameters."""
    if (
        isinstance(t, torch.Tensor)
        and t.dtype is not dtype
        and t.dtype is not _F64
        and t.is_floating_point()
    ):
        return t.to(dtype)
    return t


def _reference_under_transform(spec, backend):
    """What runs under a torch.func transform (callers test `not _is_compiling() and
    _transforms_active()` inline: one C call on the hot path): the operator's PyTorch reference,
    which composes with transforms, after the backend name is checked."""
    dispatch.check_name(backend, "the backend= argument")
    return spec.reference


def _check_before_op(backend, check, *args) -> None:
    """Before a registered op (the route of tensor subclasses and jit traces), unless
    torch.compile traces: the direct route's checks and messages, which name the argument (the
    op's schema check would not)."""
    if not _is_compiling():
        check(*args)
        dispatch.check_name(backend, "the backend= argument")


def _recorded(*tensors) -> bool:
    """The call needs autograd and may take the eager autograd.Function route (not tracing,
    plain tensors or parameters only): dualk/eager_autograd.py."""
    if _is_compiling() or _is_tracing():
        return False
    for t in tensors:
        cls = type(t)
        if cls is not torch.Tensor and cls is not Parameter and isinstance(t, torch.Tensor):
            return False
    return _is_grad_enabled()


def _direct(*tensors) -> bool:
    """True when the call can skip PyTorch's dispatcher: not tracing, every tensor a plain
    torch.Tensor or nn.Parameter (fake tensors and other subclasses go through the custom op),
    and no gradient to record. Non-tensors also take the direct route, whose validation names
    them (the custom op's schema check would not)."""
    if _is_compiling() or _transforms_active() or _is_tracing():
        return False
    grad = _is_grad_enabled()
    for t in tensors:
        cls = type(t)
        if cls is not torch.Tensor and cls is not Parameter:
            if isinstance(t, torch.Tensor):
                return False
            continue
        if grad and t.requires_grad:
            return False
    return True


_dualk = torch.ops.dualk  # the registered ops (dualk/library.py registers them on import)
_auto_unforced = dispatch.auto_unforced
_EXACT_HITS = autotune.exact_hits  # exact call signature -> auto's remembered winner
_choose_exact = autotune.choose_exact  # on a miss of _EXACT_HITS
_tf32 = autotune.tf32_allowed  # the TF32 switch, as autotune's keys read it


class _LazyModule:
    """dualk.eager_autograd, imported on first use (it imports dualk.library, which imports
    this module)."""

    def __getattr__(self, name):
        from .autograd import eager as module

        globals()["eager_autograd"] = module
        return getattr(module, name)


eager_autograd = _LazyModule()


def _library_pack_biases(biases) -> tuple[list, int]:
    """fused_mlp's biases as the registered op takes them (dualk/library.py pack_biases)."""
    present = [b for b in biases if b is not None]
    return present, sum(1 << i for i, b in enumerate(biases) if b is not None)


# ---------------------------------------------------------------------------------------- add
def add(
    a: torch.Tensor, b: torch.Tensor, *, alpha: float = 1.0, backend: str = "auto"
) -> torch.Tensor:
    """`a + alpha * b` with torch.add's broadcasting, for floating tensors of one dtype
    (float32, float16, bfloat16) on one device. Computed in fp32, rounded once."""
    # _direct(a, b) inlined for two plain tensors (-0.14 us a call on a CPU-only host); any
    # other pair asks _direct itself.
    if (
        not _is_compiling()
        and ((cls := type(a)) is _Tensor or cls is Parameter)
        and ((cls := type(b)) is _Tensor or cls is Parameter)
        and not (_is_grad_enabled() and (a.requires_grad or b.requires_grad))
        and not _transforms_active()
        and not _is_tracing()
    ) or _direct(a, b):
        return _run_add(a, b, alpha, backend)
    if not _is_compiling() and _transforms_active():
        _check_add(a, b, alpha)
        return _reference_under_transform(_ADD, backend)(a, b, float(alpha))
    alpha = validate.real_number("add", "alpha", alpha)
    if _recorded(a, b):
        return eager_autograd.apply("add", a, b, alpha, backend)
    _check_before_op(backend, _check_add, a, b, alpha)
    return _dualk.add(a, b, alpha, backend)


def _run_add(a, b, alpha, backend: str) -> torch.Tensor:
    # The common call passes one test (same dtype, a supported one, same device, same shape, a
    # float alpha); anything else gets the full checks and their messages. get_device() is an
    # int (-1 on every non-CUDA device, compared exactly there), .device a new object per read.
    try:
        dtype = a.dtype
        shape = a.shape
        index = a.get_device()
        common = (
            b.dtype is dtype
            and dtype in _FLOAT_DTYPES
            and type(alpha) is float
            and b.shape == shape
            and b.get_device() == index
            and (index >= 0 or a.device == b.device)
        )
    except AttributeError:  # not tensors: the full checks say so
        common = False
    if not common:
        _check_add(a, b, alpha)
        alpha = float(alpha)
    elif backend == "auto" and _auto_unforced(_ADD):
        # auto's remembered winner per exact signature (one shape: numel and "not broadcast";
        # the contiguity flags: the layout), without building autotune's key.
        sig = ("add", shape, dtype, index, a.is_contiguous(), b.is_contiguous())
        name = _EXACT_HITS.get(sig) or _choose_exact(_ADD, (a, b, alpha), sig)
        return _ADD.implementation(name)(a, b, alpha)
    args = (a, b, alpha)
    return _ADD.implementation(dispatch.choose(_ADD, backend, args))(*args)


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
            raise ShapeError(
                f"dualk.add: shapes {tuple(a.shape)} ('a') and {tuple(b.shape)} ('b') do not broadcast"
            ) from None


# ---------------------------------------------------------------------------------- relu_scale
def relu_scale(x: torch.Tensor, scale: float, *, backend: str = "auto") -> torch.Tensor:
    """`relu(x) * scale` in one pass; `scale` is a Python number. NaN stays NaN (as torch.relu)."""
    if (
        not _is_compiling()
        and ((cls := type(x)) is _Tensor or cls is Parameter)
        and not (_is_grad_enabled() and x.requires_grad)
        and not _transforms_active()
        and not _is_tracing()
    ) or _direct(x):  # as in add
        return _run_relu_scale(x, scale, backend)
    if not _is_compiling() and _transforms_active():
        _check_relu_scale(x, scale)
        return _reference_under_transform(_RELU_SCALE, backend)(x, float(scale))
    scale = validate.real_number("relu_scale", "scale", scale)
    if _recorded(x):
        return eager_autograd.apply("relu_scale", x, scale, backend)
    _check_before_op(backend, _check_relu_scale, x, scale)
    return _dualk.relu_scale(x, scale, backend)


def _run_relu_scale(x, scale, backend: str) -> torch.Tensor:
    if not (
        isinstance(x, torch.Tensor) and (dtype := x.dtype) in _FLOAT_DTYPES and type(scale) is float
    ):
        _check_relu_scale(x, scale)
        scale = float(scale)
    elif backend == "auto" and _auto_unforced(_RELU_SCALE):  # as in _run_add
        sig = ("relu_scale", x.shape, dtype, x.get_device(), x.is_contiguous())
        name = _EXACT_HITS.get(sig) or _choose_exact(_RELU_SCALE, (x, scale), sig)
        return _RELU_SCALE.implementation(name)(x, scale)
    args = (x, scale)
    return _RELU_SCALE.implementation(dispatch.choose(_RELU_SCALE, backend, args))(*args)


def _check_relu_scale(x, scale) -> None:
    validate.tensor("relu_scale", "x", x)
    validate.real_number("relu_scale", "scale", scale)


# -------------------------------------------------------------------------------------- matmul
def matmul(a: torch.Tensor, b: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """`a @ b` for (M, K) @ (K, N) -> (M, N) and (B, M, K) @ (B, K, N) -> (B, M, N) (a 2-dim
    operand is broadcast over the other's batch). fp32 accumulation; fp32 inputs use TF32 only
    when torch.backends.cuda.matmul.allow_tf32 allows it. Under torch.autocast the inputs are
    cast to its dtype first, as for torch.matmul."""
    if (_is_compiling() or _any_autocast()) and (dtype := _autocast_dtype(a)) is not None:
        a, b = _autocast(dtype, a), _autocast(dtype, b)
    if not _is_compiling() and _transforms_active():
        _check_matmul(a, b)
        return _reference_under_transform(_MATMUL, backend)(a, b)
    if _direct(a, b):
        return _run_matmul(a, b, backend)
    if _recorded(a, b):
        return eager_autograd.apply("matmul", a, b, backend)
    _check_before_op(backend, _check_matmul, a, b)
    return _dualk.matmul(a, b, backend)


def _run_matmul(a, b, backend: str) -> torch.Tensor:
    dtype, index, a_shape, b_shape = _check_matmul(a, b)
    args = (a, b)
    if backend == "auto" and _auto_unforced(_MATMUL):  # as in _run_add
        # Both shapes give the dims, batch, m, k and n of the key; "contiguous, else the
        # strides" its layouts (cheaper to hash than strides every call).
        sig = (
            "matmul", a_shape, a.is_contiguous() or a.stride(), b_shape,
            b.is_contiguous() or b.stride(), dtype, index,
            dtype is _F32 and _tf32(),
        )  # fmt: skip
        name = _EXACT_HITS.get(sig) or _choose_exact(_MATMUL, args, sig)
        return _MATMUL.implementation(name)(*args)
    return _MATMUL.implementation(dispatch.choose(_MATMUL, backend, args))(*args)


def _check_matmul(a, b) -> tuple:
    """Raises unless a @ b is a valid call; returns (dtype, a's get_device(), a's shape, b's
    shape) for the caller's dispatch."""
    tensor = torch.Tensor
    # One expression for the common case, as in _check_linear; the checks below explain the rest.
    if (
        isinstance(a, tensor)
        and isinstance(b, tensor)
        and (dtype := a.dtype) in validate.FLOAT_DTYPES
        and b.dtype is dtype
        and b.get_device() == (index := a.get_device())
        and (index >= 0 or a.device == b.device)
        and 2 <= len(sa := a.shape) <= 3
        and 2 <= len(sb := b.shape) <= 3
        and sa[-1] == sb[-2]
        and (len(sa) == 2 or len(sb) == 2 or sa[0] == sb[0])
    ):
        return dtype, index, sa, sb
    validate.tensor("matmul", "a", a)
    validate.tensor("matmul", "b", b)
    validate.same_dtype_and_device("matmul", {"a": a, "b": b})
    for name, t in (("a", a), ("b", b)):
        if t.dim() not in (2, 3):
            raise ShapeError(
                f"dualk.matmul: '{name}' must be 2-dim or 3-dim (batched), got shape {tuple(t.shape)}"
            )
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(
            f"dualk.matmul: inner sizes differ: 'a' {tuple(a.shape)} has K={a.shape[-1]}, "
            f"'b' {tuple(b.shape)} has K={b.shape[-2]}"
        )
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] != b.shape[0]:
        raise ShapeError(
            f"dualk.matmul: batch sizes differ: 'a' has {a.shape[0]}, 'b' has {b.shape[0]}"
        )
    return a.dtype, a.get_device(), a.shape, b.shape


# --------------------------------------------------------------------------------- linear_gelu
def linear_gelu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    approximate: str = "tanh",
    backend: str = "auto",
) -> torch.Tensor:
    """`gelu(x @ weight.T + bias)` with nn.Linear's layout: x (..., in), weight (out, in), bias
    (out,) or None; `approximate` as in torch.nn.functional.gelu ("tanh" or "none"). Under
    torch.autocast the inputs are cast to its dtype first, as for F.linear."""
    if (_is_compiling() or _any_autocast()) and (dtype := _autocast_dtype(x)) is not None:
        x, weight, bias = _autocast(dtype, x), _autocast(dtype, weight), _autocast(dtype, bias)
    if not _is_compiling() and _transforms_active():
        _check_linear("linear_gelu", x, weight, bias)
        validate.choice("linear_gelu", "approximate", approximate, GELU_APPROXIMATIONS)
        return _reference_under_transform(_LINEAR_GELU, backend)(x, weight, bias, approximate)
    if _direct(x, weight, bias):
        return _run_linear_gelu(x, weight, bias, approximate, backend)
    validate.choice("linear_gelu", "approximate", approximate, GELU_APPROXIMATIONS)
    if _recorded(x, weight, bias):
        return eager_autograd.apply("linear_gelu", x, weight, bias, approximate, backend)
    _check_before_op(backend, _check_linear, "linear_gelu", x, weight, bias)
    return _dualk.linear_gelu(x, weight, bias, approximate, backend)


def _run_linear_gelu(x, weight, bias, approximate, backend: str) -> torch.Tensor:
    dtype, weight_shape, index, x_shape = _check_linear("linear_gelu", x, weight, bias)
    if approximate not in GELU_APPROXIMATIONS:
        validate.choice("linear_gelu", "approximate", approximate, GELU_APPROXIMATIONS)
    args = (x, weight, bias, approximate)
    if backend == "auto" and _auto_unforced(_LINEAR_GELU):  # as in _run_add
        # Shapes give the rows, k and n; "contiguous, else the strides" both layouts (as in
        # _run_matmul); the TF32 switch is read per call, as autotune's key does. dtype, both
        # shapes and the device index come from the check (reading them again cost 0.3 us of
        # the ~0.8 us an auto hit paid here on a CPU-only host; x.shape alone 0.1 us).
        sig = (
            "linear_gelu", x_shape, x.is_contiguous() or x.stride(), weight_shape,
            weight.is_contiguous() or weight.stride(), dtype, index,
            bias is None, approximate, dtype is _F32 and _tf32(),
        )  # fmt: skip
        name = _EXACT_HITS.get(sig) or _choose_exact(_LINEAR_GELU, args, sig)
        return _LINEAR_GELU.implementation(name)(*args)
    return _LINEAR_GELU.implementation(dispatch.choose(_LINEAR_GELU, backend, args))(*args)


def _check_linear(op, x, weight, bias, wname="weight", bname="bias") -> tuple:
    """Raises unless x, weight and bias make one nn.Linear call; returns (x's dtype, weight's
    shape, x's get_device(), x's shape) for the caller's dispatch."""
    tensor = torch.Tensor
    # One expression for the common case (tensors that fit); the checks below explain the
    # rest. get_device() is -1 for every non-CUDA device, so those are compared exactly (on the
    # CPU this took the slow checks: 2.8 us). The same layer test is inlined in _check_mlp's
    # loop: a shared helper measured +0.23 us per layer.
    if (
        isinstance(x, tensor)
        and isinstance(weight, tensor)
        and (dtype := x.dtype) in validate.FLOAT_DTYPES
        and weight.dtype is dtype
        and x.dim() >= 1
        and len(ws := weight.shape) == 2
        and (xs := x.shape)[-1] == ws[1]
        and weight.get_device() == (index := x.get_device())
        and (index >= 0 or weight.device == x.device)
        and (
            bias is None
            or (
                isinstance(bias, tensor)
                and bias.dtype is dtype
                and bias.get_device() == index
                and (index >= 0 or bias.device == x.device)
                and len(bs := bias.shape) == 1
                and bs[0] == ws[0]
            )
        )
    ):
        return dtype, ws, index, xs
    validate.tensor(op, "x", x)
    validate.tensor(op, wname, weight)
    if bias is not None:
        validate.tensor(op, bname, bias)
    validate.same_dtype_and_device(op, {"x": x, wname: weight, bname: bias})
    validate.ndim_at_least(op, "x", x, 1)
    if weight.dim() != 2:
        raise ShapeError(
            f"dualk.{op}: '{wname}' must be 2-dim (out, in), got shape {tuple(weight.shape)}"
        )
    if x.shape[-1] != weight.shape[1]:
        raise ShapeError(
            f"dualk.{op}: 'x' has {x.shape[-1]} features (shape {tuple(x.shape)}) but '{wname}' "
            f"expects {weight.shape[1]} (shape {tuple(weight.shape)})"
        )
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ShapeError(
            f"dualk.{op}: '{bname}' must have shape ({weight.shape[0]},), got {tuple(bias.shape)}"
        )
    return x.dtype, weight.shape, x.get_device(), x.shape


# ---------------------------------------------------------------------------------- linear_glu
def linear_glu(
    x: torch.Tensor,
    weight_gate: torch.Tensor,
    weight_up: torch.Tensor | None = None,
    bias_gate: torch.Tensor | None = None,
    bias_up: torch.Tensor | None = None,
    *,
    activation: str = "silu",
    approximate: str = "tanh",
    backend: str = "auto",
) -> torch.Tensor:
    """The gated feed-forward projection of LLaMA-style MLPs (SwiGLU, GeGLU, ReGLU):
    `act(x @ weight_gate.T + bias_gate) * (x @ weight_up.T + bias_up)` in one kernel.

    x (..., K); weight_gate and weight_up (N, K) in nn.Linear layout, biases (N,) or None ->
    (..., N). A packed weight (fused gate_up projections): `weight_up=None` and weight_gate
    `[gate; up]` (2N, K), its bias likewise packed in `bias_gate` (2N,) (bias_up None).
    activation: "silu", "gelu" (`approximate` "tanh" or "none", as nn.GELU) or "relu";
    float32, float16 or bfloat16. Under torch.autocast the inputs are cast to its dtype first,
    as for F.linear. No CUDA kernel yet: backend="cuda" raises, "auto" never picks it."""
    if (_is_compiling() or _any_autocast()) and (dtype := _autocast_dtype(x)) is not None:
        x, weight_gate, weight_up, bias_gate, bias_up = (
            _autocast(dtype, t) for t in (x, weight_gate, weight_up, bias_gate, bias_up)
        )
    args = (x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate)
    if not _is_compiling() and _transforms_active():
        _check_linear_glu(*args)
        return _reference_under_transform(_LINEAR_GLU, backend)(*args)
    if _direct(x, weight_gate, weight_up, bias_gate, bias_up):
        return _run_linear_glu(*args, backend)
    _check_glu_options(activation, approximate)
    if _recorded(x, weight_gate, weight_up, bias_gate, bias_up):
        return eager_autograd.apply("linear_glu", *args, backend)
    _check_before_op(backend, _check_linear_glu, *args)
    return _dualk.linear_glu(*args, backend)


def _run_linear_glu(
    x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate, backend: str
) -> torch.Tensor:
    dtype, index, x_shape, n = _check_linear_glu(
        x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate
    )
    args = (x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate)
    if backend == "auto" and _auto_unforced(_LINEAR_GLU):  # as in _run_linear_gelu
        sig = (
            "linear_glu", x_shape, x.is_contiguous() or x.stride(), weight_gate.shape,
            weight_gate.is_contiguous() or weight_gate.stride(),
            weight_up is None or weight_up.is_contiguous() or weight_up.stride(), dtype, index,
            bias_gate is None, bias_up is None, activation, approximate,
            dtype is _F32 and _tf32(),
        )  # fmt: skip
        name = _EXACT_HITS.get(sig) or _choose_exact(_LINEAR_GLU, args, sig)
        return _LINEAR_GLU.implementation(name)(*args)
    return _LINEAR_GLU.implementation(dispatch.choose(_LINEAR_GLU, backend, args))(*args)


def _check_glu_options(activation, approximate) -> None:
    if activation not in GLU_ACTIVATIONS:
        validate.choice("linear_glu", "activation", activation, GLU_ACTIVATIONS)
    if approximate not in GELU_APPROXIMATIONS:
        validate.choice("linear_glu", "approximate", approximate, GELU_APPROXIMATIONS)


def _check_linear_glu(x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate):
    """Raises unless the call is one valid linear_glu; returns (x's dtype, x's get_device(),
    x's shape, N) for the caller's dispatch."""
    _check_glu_options(activation, approximate)
    op = "linear_glu"
    dtype, wg_shape, index, x_shape = _check_linear(
        op, x, weight_gate, bias_gate, "weight_gate", "bias_gate"
    )
    if weight_up is None:
        rows = wg_shape[0]
        if rows % 2:
            raise ShapeError(
                f"dualk.linear_glu: a packed 'weight_gate' ([gate; up], weight_up=None) must have "
                f"an even number of rows (2N, K), got shape {tuple(wg_shape)}"
            )
        if bias_up is not None:
            raise InvalidArgumentError(
                "dualk.linear_glu: with a packed 'weight_gate' (weight_up=None) the biases are "
                "packed too: pass [gate; up] as 'bias_gate' (2N,) and leave 'bias_up' None"
            )
        return dtype, index, x_shape, rows // 2
    if not (isinstance(weight_up, torch.Tensor) and weight_up.shape == wg_shape):
        _check_linear(op, x, weight_up, None, "weight_up")  # a tensor, dtype, device, features
        if weight_up.shape != wg_shape:
            raise ShapeError(
                f"dualk.linear_glu: 'weight_up' must have the shape of 'weight_gate' "
                f"{tuple(wg_shape)}, got {tuple(weight_up.shape)}"
            )
    _check_linear(op, x, weight_up, bias_up, "weight_up", "bias_up")
    return dtype, index, x_shape, wg_shape[0]


# ----------------------------------------------------------------------------------- fused_mlp
def fused_mlp(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None] | None = None,
    *,
    activation: str = "relu",
    backend: str = "auto",
) -> torch.Tensor:
    """A whole MLP in one kernel launch: `L_n(act(... act(L_1(x))))`, `L_i(h) = h @ W_i.T + b_i`.

    weights[i] in nn.Linear layout (out_i, in_i); biases[i] (out_i,) or None (or `biases=None`
    for none at all); the activation ("relu", "gelu" = "gelu_tanh", "gelu_erf", "silu" or "none")
    follows every layer but the last; x (..., in_0). Widths too large for the fused kernels run
    as a per-layer chain of the same backend's kernels (dualk.explain says so). Under
    torch.autocast x, the weights and the biases are cast to its dtype first, as for F.linear."""
    weights, biases = _mlp_lists(weights, biases)
    if (_is_compiling() or _any_autocast()) and (dtype := _autocast_dtype(x)) is not None:
        x = _autocast(dtype, x)
        weights = [_autocast(dtype, w) for w in weights]
        biases = [_autocast(dtype, b) for b in biases]
    if not _is_compiling() and _transforms_active():
        _check_mlp(x, weights, biases, activation)
        return _reference_under_transform(_FUSED_MLP, backend)(x, weights, biases, activation)
    if _direct(x, *weights, *biases):
        return _run_fused_mlp(x, weights, biases, activation, backend)
    validate.choice("fused_mlp", "activation", activation, MLP_ACTIVATIONS)
    if _recorded(x, *weights, *biases):
        return eager_autograd.fused_mlp(x, weights, biases, activation, backend)
    _check_before_op(backend, _check_mlp, x, weights, biases, activation)
    present, mask = _library_pack_biases(biases)
    return _dualk.fused_mlp(x, weights, present, mask, activation, backend)


def _mlp_lists(weights, biases) -> tuple[list, list]:
    """weights and biases as lists (any sequence or an nn.ParameterList, not a tensor or a
    one-shot iterator)."""
    if type(weights) is ParameterList:  # a Module, not a Sequence, but holds the parameters
        weights = list(weights)
    if type(biases) is ParameterList:
        biases = list(biases)
    if isinstance(weights, torch.Tensor) or not isinstance(weights, Sequence):
        raise InvalidTypeError(
            "dualk.fused_mlp: 'weights' must be a non-empty list (or tuple) of 2-dim tensors, "
            f"got {type(weights).__name__}"
        )
    if not weights:  # the right type with the wrong count of layers: a ValueError
        raise InvalidArgumentError(
            "dualk.fused_mlp: 'weights' must be a non-empty list (or tuple) of 2-dim tensors, "
            "got an empty one"
        )
    if biases is None:
        biases = [None] * len(weights)
    if isinstance(biases, torch.Tensor) or not isinstance(biases, Sequence):
        raise InvalidTypeError(
            f"dualk.fused_mlp: 'biases' must be a list with one entry (tensor or None) per layer "
            f"({len(weights)} layers), or None; got {type(biases).__name__}"
        )
    if len(biases) != len(weights):
        got = f"{len(biases)} entries"
        raise InvalidArgumentError(
            f"dualk.fused_mlp: 'biases' must be a list with one entry (tensor or None) per layer "
            f"({len(weights)} layers), or None; got {got}"
        )
    return list(weights), list(biases)


def _run_fused_mlp(x, weights, biases, activation, backend: str) -> torch.Tensor:
    dtype, index, shapes, no_bias = _check_mlp(x, weights, biases, activation)
    args = (x, weights, biases, activation)
    if backend == "auto" and _auto_unforced(_FUSED_MLP):  # as in _run_add
        # x's shape and layout (as in _run_matmul) give the rows and layout; the weights'
        # shapes (read by the check, as the bit mask of absent biases) the widths and biases
        # of the key (autotune._key_fused_mlp). Comprehensions here cost 1.2 us, the check's
        # lists 0.1.
        sig = (
            "fused_mlp", x.shape, x.is_contiguous() or x.stride(), dtype, index, activation,
            dtype is _F32 and _tf32(), no_bias, *shapes,
        )  # fmt: skip
        name = _EXACT_HITS.get(sig) or _choose_exact(_FUSED_MLP, args, sig)
    else:
        name = dispatch.choose(_FUSED_MLP, backend, args)
    if name != "torch" and mlp_fallback_reason(name, x, weights) is not None:
        return _mlp_chain(name, x, weights, biases, activation)
    return _FUSED_MLP.implementation(name)(*args)


def _check_mlp(x, weights, biases, activation) -> tuple:
    """Raises unless the call is one valid MLP; returns (x's dtype, x's get_device(), the
    weights' shapes, a bit mask of the layers without a bias) for the caller's dispatch."""
    if activation not in MLP_ACTIVATIONS:
        validate.choice("fused_mlp", "activation", activation, MLP_ACTIVATIONS)
    validate.tensor("fused_mlp", "x", x)
    validate.ndim_at_least("fused_mlp", "x", x, 1)
    dtype, width = x.dtype, x.shape[-1]
    # get_device() (an int) instead of .device (a new object per call): -1 on every non-CUDA
    # device, so off the GPU the exact devices are compared below.
    index = x.get_device()
    tensor = torch.Tensor
    shapes = []
    no_bias = 0
    for i, (w, b) in enumerate(zip(weights, biases)):
        # One cheap test per layer on the hot path; the detailed checks only explain a failure.
        if not (
            isinstance(w, tensor)
            and w.dtype is dtype
            and w.get_device() == index
            and len(ws := w.shape) == 2
            and ws[1] == width
            and (
                b is None
                or (
                    isinstance(b, tensor)
                    and b.dtype is dtype
                    and b.get_device() == index
                    and len(bs := b.shape) == 1
                    and bs[0] == ws[0]
                )
            )
        ):
            _explain_bad_layer(x, i, width, w, b)
        width = ws[0]
        shapes.append(ws)
        if b is None:
            no_bias |= 1 << i
    if index < 0:
        for i, (w, b) in enumerate(zip(weights, biases)):
            validate.same_pair("fused_mlp", ("x", x), (f"weights[{i}]", w), (f"biases[{i}]", b))
    return dtype, index, shapes, no_bias


def _explain_bad_layer(x, i, width, w, b) -> None:
    name, bname = f"weights[{i}]", f"biases[{i}]"
    validate.tensor("fused_mlp", name, w)
    if b is not None:
        validate.tensor("fused_mlp", bname, b)
    validate.same_pair("fused_mlp", ("x", x), (name, w), (bname, b))
    if w.dim() != 2:
        raise ShapeError(
            f"dualk.fused_mlp: '{name}' must be 2-dim (out, in), got shape {tuple(w.shape)}"
        )
    if w.shape[1] != width:
        source = "'x'" if i == 0 else f"layer {i - 1} (its output)"
        raise ShapeError(
            f"dualk.fused_mlp: {source} has {width} features but '{name}' (shape "
            f"{tuple(w.shape)}) expects {w.shape[1]}"
        )
    raise ShapeError(
        f"dualk.fused_mlp: '{bname}' must have shape ({w.shape[0]},), got {tuple(b.shape)}"
    )


_fallback_reasons: dict[tuple, str | None] = {}


def mlp_fallback_reason(
    backend: str, x: torch.Tensor, weights: Sequence[torch.Tensor]
) -> str | None:
    """Why `backend`'s fused kernel cannot hold this MLP on chip (None when it can); remembered
    per (backend, widths, dtype, device) so the hot path pays a dict lookup."""
    widths = (weights[0].shape[1], *(w.shape[0] for w in weights))
    # get_device(): an int (-1 off CUDA), not a new torch.device per call; the checks depend on
    # the GPU only.
    key = (backend, widths, x.dtype, x.get_device())
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
    the activation is a GELU), bias and the other activations through PyTorch."""
    from .backends.torch_ref import ACTIVATIONS

    matmul_impl = _MATMUL.implementation(backend)
    linear_gelu_impl = _LINEAR_GELU.implementation(backend)
    gelu = {"gelu": "tanh", "gelu_tanh": "tanh", "gelu_erf": "none"}.get(activation)
    h = as_rows(x)
    last = len(weights) - 1
    for i, (w, b) in enumerate(zip(weights, biases)):
        if gelu is not None and i != last:
            h = linear_gelu_impl(h, w, b, gelu)
            continue
        h = matmul_impl(h, w.t())
        if b is not None:
            h = h + b
        if i != last:
            h = ACTIVATIONS[activation](h)
    return h.reshape(*x.shape[:-1], weights[-1].shape[0])


# ------------------------------------------------------------------------------------- explain
_PUBLIC = {"add": add, "relu_scale": relu_scale, "matmul": matmul,
           "linear_gelu": linear_gelu, "fused_mlp": fused_mlp,
           "linear_glu": linear_glu}  # fmt: skip


def implementation_args(op_name: str, *args, **kwargs) -> tuple[tuple, str]:
    """(the backend implementation's positional arguments, the backend= value) of a public call
    `dualk.<op_name>(*args, **kwargs)`, validated; positional and keyword arguments alike."""
    from .registry import get

    get(op_name)
    try:
        bound = inspect.signature(_PUBLIC[op_name]).bind(*args, **kwargs)
    except TypeError as exc:
        raise InvalidArgumentError(f"dualk.explain({op_name!r}, ...): {exc}") from None
    bound.apply_defaults()
    a = bound.arguments
    backend = a.pop("backend")
    if op_name == "add":
        _check_add(a["a"], a["b"], a["alpha"])
        return (a["a"], a["b"], float(a["alpha"])), backend
    if op_name == "relu_scale":
        _check_relu_scale(a["x"], a["scale"])
        return (a["x"], float(a["scale"])), backend
    if op_name == "matmul":
        _check_matmul(a["a"], a["b"])
        return (a["a"], a["b"]), backend
    if op_name == "linear_gelu":
        _check_linear("linear_gelu", a["x"], a["weight"], a["bias"])
        validate.choice("linear_gelu", "approximate", a["approximate"], GELU_APPROXIMATIONS)
        return (a["x"], a["weight"], a["bias"], a["approximate"]), backend
    if op_name == "linear_glu":
        glu = tuple(a[k] for k in ("x", "weight_gate", "weight_up", "bias_gate", "bias_up",
                                   "activation", "approximate"))  # fmt: skip
        _check_linear_glu(*glu)
        return glu, backend
    if op_name == "fused_mlp":
        weights, biases = _mlp_lists(a["weights"], a["biases"])
        _check_mlp(a["x"], weights, biases, a["activation"])
        return (a["x"], weights, biases, a["activation"]), backend
    raise NotImplementedError(f"dualk.explain: no argument mapping for operator {op_name!r}")


def explain(op_name: str, *args, **kwargs) -> dispatch.Explanation:
    """Which backend `dualk.<op_name>(*args, **kwargs)` would run on, where that choice came
    from, and why each other backend is or is not available. Arguments as in the call itself,
    positional or by keyword (backend= included). Runs no kernel and never times: for "auto" on
    a shape class not tuned yet it says so (the first call will time the candidates). For
    fused_mlp on the CUDA backend it names the kernel the planner takes."""
    from .registry import get

    spec = get(op_name)
    impl_args, backend = implementation_args(op_name, *args, **kwargs)
    expl = dispatch.explain(spec, backend, impl_args)
    if op_name == "fused_mlp" and expl.backend != "torch" and expl.runnable:
        reason = mlp_fallback_reason(expl.backend, impl_args[0], impl_args[1])
        if reason is not None:
            expl.notes.append(
                f"not fused: {reason}; runs as a per-layer chain of {expl.backend} kernels"
            )
        elif expl.backend == "cuda" and impl_args[0].is_cuda:
            from .backends import cuda as cuda_backend

            with _device_of(impl_args[0]):
                kernel = cuda_backend.fused_mlp_kernel(*impl_args)
            expl.notes.append(f"CUDA kernel: {kernel}")
    return expl
