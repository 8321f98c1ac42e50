"""dualk's public operators: each public function checks only what picks the route, then takes it.

Each public function has two routes to the same code:
- eager and direct (the common inference call: plain tensors or nn.Parameters, no gradient
  needed, not under torch.compile): `run_<op>` of dualk/runtime/operators.py validates, asks the
  dispatcher which backend runs (dualk/dispatch/) and calls that backend's implementation
  (dualk/registry.py maps the names). This skips PyTorch's op dispatcher, which costs several
  microseconds per call by itself;
- through the registered custom op `torch.ops.dualk.<op>` (dualk/autograd/library.py) whenever
  autograd must record the call, under torch.compile / export tracing (fake tensors, no graph
  break), and for tensor subclasses; calls that autograd records on plain tensors take the eager
  autograd route (dualk/autograd/eager.py). The op's implementation is the same `run_<op>` the
  direct route calls, so both routes give bit-identical results. (fused_mlp, traced by Dynamo
  for inference, becomes `torch.ops.dualk.fused_mlp_infer`: the same route without autograd,
  its CUDA kernel in C++; and a direct fused_mlp call first tries a planned call, one C++
  crossing, where an earlier call ran the fused CUDA kernel: dualk/runtime/operators.py.)

The backend is decided inside `run_<op>`, at run time: tracing never reads environment
variables, config files or autotuning caches, and a compiled graph follows the backend settings
in force when it runs. Inputs are never modified; outputs are fresh contiguous tensors.

Every operator takes `backend="auto" | "cuda" | "triton" | "torch"` (see dualk.dispatch for the
precedence of arguments, environment variables, scopes and the config file).

The runtime's functions and the route switches are bound to module-level names here, as the
hot paths read them: one global lookup each, as when they were defined in this file."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from torch.nn import Parameter

from . import dispatch
from .autograd import eager as eager_autograd
from .backends import cuda as cuda_backend
from .core import validate
from .core.errors import InvalidArgumentError
from .registry import OPS, get
from .runtime import operators, route
from .runtime.operators import (
    GELU_APPROXIMATIONS,
    GLU_ACTIVATIONS,
    MLP_ACTIVATIONS,
    mlp_fallback_reason,
)

__all__ = ["add", "relu_scale", "matmul", "linear_gelu", "linear_glu", "fused_mlp", "explain",
           "implementation_args", "mlp_fallback_reason", "MLP_ACTIVATIONS",
           "GELU_APPROXIMATIONS", "GLU_ACTIVATIONS"]  # fmt: skip

_ADD, _RELU_SCALE, _MATMUL, _LINEAR_GELU, _FUSED_MLP, _LINEAR_GLU = (
    OPS[n] for n in ("add", "relu_scale", "matmul", "linear_gelu", "fused_mlp", "linear_glu")
)
_any_autocast = route.any_autocast
_transforms_active = route.transforms_active
_F64 = torch.float64
_is_compiling = route.is_compiling
_is_tracing = route.is_tracing
_is_grad_enabled = route.is_grad_enabled
_exporting = route.exporting
_Tensor = torch.Tensor
_direct = route.direct
_recorded = route.recorded
_run_add, _check_add = operators.run_add, operators.check_add
_run_relu_scale, _check_relu_scale = operators.run_relu_scale, operators.check_relu_scale
_run_matmul, _check_matmul = operators.run_matmul, operators.check_matmul
_run_linear_gelu, _check_linear = operators.run_linear_gelu, operators.check_linear
_run_linear_glu, _check_linear_glu = operators.run_linear_glu, operators.check_linear_glu
_check_glu_options = operators.check_glu_options
_run_fused_mlp, _check_mlp, _mlp_lists = (
    operators.run_fused_mlp, operators.check_mlp, operators.mlp_lists
)  # fmt: skip
_device_of = operators.device_of
_run_planned_mlp = operators.run_planned_mlp
_is_dynamo_compiling = route.is_dynamo_compiling
_autocast_dtype = route.autocast_dtype
_autocast = route.autocast_cast


def _reference_under_transform(spec, backend):
    """What runs under a torch.func transform (callers test `_transforms_active()` inline: one C
    call on the hot path), compiled ones included (torch.compile(torch.func.grad(f)) traces the
    reference; dualk's ops there raised or, as an _infer op, gave zero gradients): the operator's
    PyTorch reference, which composes with transforms, after the backend name is checked."""
    dispatch.check_name(backend, "the backend= argument")
    return spec.reference


def _check_before_op(backend, check, *args) -> None:
    """Before a registered op (the route of tensor subclasses and jit traces), unless
    torch.compile traces: the direct route's checks and messages, which name the argument (the
    op's schema check would not)."""
    if not _is_compiling():
        check(*args)
        dispatch.check_name(backend, "the backend= argument")


_Proxy = torch.fx.Proxy
_is_fx_tracing = route.is_fx_tracing


def _fx_node(fn, operands: tuple, args: tuple, kwargs: dict):
    """Under torch.fx.symbolic_trace (an fx Proxy among `operands`, which the direct route
    declines): the public operator `fn` as one call_function node, as torch.fx.wrap makes a
    leaf function, so the traced module calls dualk as the module did; else None. (Without it
    the trace ran into the operator with Proxies and raised.) A tensor x outside a trace: one
    flag read (calls that autograd records come this way too)."""
    if type(operands[0]) is _Tensor and not _is_fx_tracing():
        return None  # (a Proxy made by hand, outside a trace, comes as x: looked for below)
    for t in operands:
        if isinstance(t, _Proxy):
            return t.tracer.create_proxy("call_function", fn, args, kwargs)
    return None


_dualk = torch.ops.dualk  # the registered ops (dualk/autograd/library.py registers them)


def _compiled_inference(*tensors) -> bool:
    """Whether Dynamo is tracing a call that needs no gradient: the compiled graph then calls the
    operator's `<op>_infer` op, without custom_op's autograd and backend wrappers on every call
    (dualk/autograd/library.py). Exports keep the autograd op (strict ones on torch < 2.13
    excepted: route.exporting cannot tell them from a compile). Calls under a torch.func
    transform never come here (they run the reference): a grad transform's tensors report
    requires_grad False, and an op without autograd gave all-zero gradients."""
    return (
        _is_compiling()
        and _is_dynamo_compiling()
        and not _exporting()
        and not (_is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors))
    )


def _library_pack_biases(biases) -> tuple[list, int]:
    """fused_mlp's biases as the registered op takes them (dualk/autograd/library.py pack_biases)."""
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
    if (node := _fx_node(add, (a, b), (a, b), {"alpha": alpha, "backend": backend})) is not None:
        return node
    if _transforms_active():
        _check_add(a, b, alpha)
        return _reference_under_transform(_ADD, backend)(a, b, float(alpha))
    alpha = validate.real_number("add", "alpha", alpha)
    if _recorded(a, b):
        return eager_autograd.apply("add", a, b, alpha, backend)
    _check_before_op(backend, _check_add, a, b, alpha)
    return _dualk.add(a, b, alpha, backend)


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
    if (node := _fx_node(relu_scale, (x,), (x, scale), {"backend": backend})) is not None:
        return node
    if _transforms_active():
        _check_relu_scale(x, scale)
        return _reference_under_transform(_RELU_SCALE, backend)(x, float(scale))
    scale = validate.real_number("relu_scale", "scale", scale)
    if _recorded(x):
        return eager_autograd.apply("relu_scale", x, scale, backend)
    _check_before_op(backend, _check_relu_scale, x, scale)
    return _dualk.relu_scale(x, scale, backend)


# -------------------------------------------------------------------------------------- matmul
def matmul(a: torch.Tensor, b: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """`a @ b` for (M, K) @ (K, N) -> (M, N) and (B, M, K) @ (B, K, N) -> (B, M, N) (a 2-dim
    operand is broadcast over the other's batch). fp32 accumulation; fp32 inputs use TF32 only
    when torch.backends.cuda.matmul.allow_tf32 allows it. Under torch.autocast the inputs are
    cast to its dtype first, as for torch.matmul."""
    if (_is_compiling() or _any_autocast()) and (dtype := _autocast_dtype(a)) is not None:
        a, b = _autocast(dtype, a), _autocast(dtype, b)
    if _transforms_active():
        _check_matmul(a, b)
        return _reference_under_transform(_MATMUL, backend)(a, b)
    if _direct(a, b):
        return _run_matmul(a, b, backend)
    if (node := _fx_node(matmul, (a, b), (a, b), {"backend": backend})) is not None:
        return node
    if _recorded(a, b):
        return eager_autograd.apply("matmul", a, b, backend)
    _check_before_op(backend, _check_matmul, a, b)
    return _dualk.matmul(a, b, backend)


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
    if _transforms_active():
        _check_linear("linear_gelu", x, weight, bias)
        validate.choice("linear_gelu", "approximate", approximate, GELU_APPROXIMATIONS)
        return _reference_under_transform(_LINEAR_GELU, backend)(x, weight, bias, approximate)
    if _direct(x, weight, bias):
        return _run_linear_gelu(x, weight, bias, approximate, backend)
    kwargs = {"approximate": approximate, "backend": backend}
    if (node := _fx_node(linear_gelu, (x, weight, bias), (x, weight, bias), kwargs)) is not None:
        return node
    validate.choice("linear_gelu", "approximate", approximate, GELU_APPROXIMATIONS)
    if _recorded(x, weight, bias):
        return eager_autograd.apply("linear_gelu", x, weight, bias, approximate, backend)
    if _compiled_inference(x, weight, bias):
        return _dualk.linear_gelu_infer(x, weight, bias, approximate, backend)
    _check_before_op(backend, _check_linear, "linear_gelu", x, weight, bias)
    return _dualk.linear_gelu(x, weight, bias, approximate, backend)


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
    as for F.linear. When autograd records the call, the forward also keeps both
    pre-activations (2 x rows x N elements, as eager PyTorch keeps them) so that the backward
    runs the gradient GEMMs only (dualk::linear_glu_train)."""
    if (_is_compiling() or _any_autocast()) and (dtype := _autocast_dtype(x)) is not None:
        x, weight_gate, weight_up, bias_gate, bias_up = (
            _autocast(dtype, t) for t in (x, weight_gate, weight_up, bias_gate, bias_up)
        )
    args = (x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate)
    if _transforms_active():
        _check_linear_glu(*args)
        return _reference_under_transform(_LINEAR_GLU, backend)(*args)
    if _direct(x, weight_gate, weight_up, bias_gate, bias_up):
        return _run_linear_glu(*args, backend)
    kwargs = {"activation": activation, "approximate": approximate, "backend": backend}
    if (node := _fx_node(linear_glu, args[:5], args[:5], kwargs)) is not None:
        return node
    _check_glu_options(activation, approximate)
    # Training: the forward also keeps both pre-activations (dualk::linear_glu_train), so that
    # the backward runs the four gradient GEMMs only (as eager PyTorch, which saves them too)
    # instead of recomputing the two forward GEMMs first.
    if _recorded(x, weight_gate, weight_up, bias_gate, bias_up):
        return eager_autograd.linear_glu(*args, backend)
    if _compiled_inference(x, weight_gate, weight_up, bias_gate, bias_up):
        return _dualk.linear_glu_infer(*args, backend)
    _check_before_op(backend, _check_linear_glu, *args)
    # torch.export (a graph to deploy, not to train) keeps the plain op, whose backward reruns
    # the training forward for any caller that does differentiate it.
    if (
        _is_grad_enabled()
        and not _exporting()
        and any(
            isinstance(t, _Tensor) and t.requires_grad
            for t in (x, weight_gate, weight_up, bias_gate, bias_up)
        )
    ):
        return _dualk.linear_glu_train(*args, backend)[0]
    return _dualk.linear_glu(*args, backend)


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
    if not _is_compiling() and not _transforms_active():
        # An inference call of a class an earlier call planned (the fused CUDA kernel ran): one
        # C++ crossing that checks every operand; None for anything else.
        out = _run_planned_mlp(x, weights, biases, activation, backend)
        if out is not None:
            return out
    weights, biases = _mlp_lists(weights, biases)
    if (_is_compiling() or _any_autocast()) and (dtype := _autocast_dtype(x)) is not None:
        x = _autocast(dtype, x)
        weights = [_autocast(dtype, w) for w in weights]
        biases = [_autocast(dtype, b) for b in biases]
    if _transforms_active():
        _check_mlp(x, weights, biases, activation)
        return _reference_under_transform(_FUSED_MLP, backend)(x, weights, biases, activation)
    if _direct(x, *weights, *biases):
        return _run_fused_mlp(x, weights, biases, activation, backend, True)
    kwargs = {"activation": activation, "backend": backend}
    operands = (x, *weights, *biases)
    if (node := _fx_node(fused_mlp, operands, (x, weights, biases), kwargs)) is not None:
        return node
    validate.choice("fused_mlp", "activation", activation, MLP_ACTIVATIONS)
    if _recorded(x, *weights, *biases):
        return eager_autograd.fused_mlp(x, weights, biases, activation, backend)
    if _compiled_inference(x, *weights, *biases):
        # (its CUDA kernel is C++: dualk/autograd/library.py fused_mlp_infer)
        return _dualk.fused_mlp_infer(x, weights, biases, activation, backend)
    _check_before_op(backend, _check_mlp, x, weights, biases, activation)
    present, mask = _library_pack_biases(biases)
    return _dualk.fused_mlp(x, weights, present, mask, activation, backend)


# ------------------------------------------------------------------------------------- explain
_PUBLIC = {"add": add, "relu_scale": relu_scale, "matmul": matmul,
           "linear_gelu": linear_gelu, "fused_mlp": fused_mlp,
           "linear_glu": linear_glu}  # fmt: skip


def implementation_args(op_name: str, *args, **kwargs) -> tuple[tuple, str]:
    """(the backend implementation's positional arguments, the backend= value) of a public call
    `dualk.<op_name>(*args, **kwargs)`, validated; positional and keyword arguments alike."""
    get(op_name)
    if op_name not in _PUBLIC:  # added by registry.register()
        return _registered_args(op_name, args, kwargs, backend_default="auto")
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


def _registered_args(op_name: str, args: tuple, kwargs: dict, backend_default: str) -> tuple:
    """An operator known from its registry entry alone: the arguments bound to its reference's
    signature (backend= apart), checked by the entry's check."""
    spec = get(op_name)
    kwargs = dict(kwargs)
    backend = kwargs.pop("backend", backend_default)
    try:
        bound = inspect.signature(spec.reference).bind(*args, **kwargs)
    except TypeError as exc:
        raise InvalidArgumentError(f"dualk.explain({op_name!r}, ...): {exc}") from None
    bound.apply_defaults()
    impl_args = tuple(bound.args)
    if spec.check is not None:
        spec.check(*impl_args)
    return impl_args, backend


def explain(op_name: str, *args, **kwargs) -> dispatch.Explanation:
    """Which backend `dualk.<op_name>(*args, **kwargs)` would run on, where that choice came
    from, and why each other backend is or is not available. Arguments as in the call itself,
    positional or by keyword (backend= included). Runs no kernel and never times: for "auto" on
    a shape class not tuned yet it says so (the first call will time the candidates). For
    fused_mlp on the CUDA backend it names the kernel the planner takes."""
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
            with _device_of(impl_args[0]):
                kernel = cuda_backend.fused_mlp_kernel(*impl_args)
            expl.notes.append(f"CUDA kernel: {kernel}")
    return expl
