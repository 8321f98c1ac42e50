"""Each operator's check and run, the one implementation behind every route of a call.

`run_<op>(...inputs, backend)`: validate (the common call passes one cheap test; anything else
gets the full checks of `check_<op>` and their messages), resolve the backend (argument,
environment, scope, config, autotuning: dualk.dispatch) and call that backend's implementation
(the registry maps the names). `check_<op>` raises unless the call is valid and returns what
the run's dispatch needs. dualk.ops' direct route and the registered ops of
dualk.autograd.library call the same functions, so both routes give bit-identical results.

The hot paths were tuned to the tenth of a microsecond: the specs, the autotune lookups and the
TF32 switch are module-level names, and checks are inlined where a helper measured slower."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch
from torch.nn import ParameterList

from .. import dispatch
from ..backends import cuda as _cuda
from ..backends.torch_ref import ACTIVATIONS
from ..core import alloc, validate
from ..core.errors import InvalidArgumentError, InvalidTypeError, ShapeError
from ..core.layout import as_rows
from ..dispatch import autotune
from ..registry import OPS

_ADD, _RELU_SCALE, _MATMUL, _LINEAR_GELU, _FUSED_MLP, _LINEAR_GLU = (
    OPS[n] for n in ("add", "relu_scale", "matmul", "linear_gelu", "fused_mlp", "linear_glu")
)
# "gelu" is the tanh approximation (as the CUDA seed's kernel); "gelu_erf" is nn.GELU()'s default.
MLP_ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "gelu_erf", "silu", "none")
GELU_APPROXIMATIONS = ("tanh", "none")
GLU_ACTIVATIONS = ("silu", "gelu", "relu")

_FLOAT_DTYPES = frozenset(validate.FLOAT_DTYPES)
_F32 = torch.float32
_auto_unforced = dispatch.auto_unforced
_EXACT_HITS = autotune.exact_hits  # exact call signature -> auto's remembered winner
_choose_exact = autotune.choose_exact  # on a miss of _EXACT_HITS
_tf32 = autotune.tf32_allowed  # the TF32 switch, as autotune's keys read it
_fallback_reasons: dict[tuple, str | None] = {}
_PLANNED = _cuda.PLANNED_MLP  # fused_mlp's planned CUDA calls (cuda_src/binding_mlp.cpp)
_generation = autotune.generation
_poisoning = alloc.poisoning
_is_grad_enabled = torch.is_grad_enabled
_LIST_TYPES = (list, tuple)


def run_add(a, b, alpha, backend: str) -> torch.Tensor:
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
        check_add(a, b, alpha)
        alpha = float(alpha)
    elif backend == "auto" and _auto_unforced(_ADD):
        # auto's remembered winner per exact signature (one shape: numel and "not broadcast";
        # the contiguity flags: the layout), without building autotune's key.
        sig = ("add", shape, dtype, index, a.is_contiguous(), b.is_contiguous())
        name = _EXACT_HITS.get(sig) or _choose_exact(_ADD, (a, b, alpha), sig)
        return _ADD.implementation(name)(a, b, alpha)
    args = (a, b, alpha)
    return _ADD.implementation(dispatch.choose(_ADD, backend, args))(*args)


def check_add(a, b, alpha) -> None:
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


def run_relu_scale(x, scale, backend: str) -> torch.Tensor:
    if not (
        isinstance(x, torch.Tensor) and (dtype := x.dtype) in _FLOAT_DTYPES and type(scale) is float
    ):
        check_relu_scale(x, scale)
        scale = float(scale)
    elif backend == "auto" and _auto_unforced(_RELU_SCALE):  # as in run_add
        sig = ("relu_scale", x.shape, dtype, x.get_device(), x.is_contiguous())
        name = _EXACT_HITS.get(sig) or _choose_exact(_RELU_SCALE, (x, scale), sig)
        return _RELU_SCALE.implementation(name)(x, scale)
    args = (x, scale)
    return _RELU_SCALE.implementation(dispatch.choose(_RELU_SCALE, backend, args))(*args)


def check_relu_scale(x, scale) -> None:
    validate.tensor("relu_scale", "x", x)
    validate.real_number("relu_scale", "scale", scale)


def run_matmul(a, b, backend: str) -> torch.Tensor:
    dtype, index, a_shape, b_shape = check_matmul(a, b)
    args = (a, b)
    if backend == "auto" and _auto_unforced(_MATMUL):  # as in run_add
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


def check_matmul(a, b) -> tuple:
    """Raises unless a @ b is a valid call; returns (dtype, a's get_device(), a's shape, b's
    shape) for the caller's dispatch."""
    tensor = torch.Tensor
    # One expression for the common case, as in check_linear; the checks below explain the rest.
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


def run_linear_gelu(x, weight, bias, approximate, backend: str) -> torch.Tensor:
    dtype, weight_shape, index, x_shape = check_linear("linear_gelu", x, weight, bias)
    if approximate not in GELU_APPROXIMATIONS:
        validate.choice("linear_gelu", "approximate", approximate, GELU_APPROXIMATIONS)
    args = (x, weight, bias, approximate)
    if backend == "auto" and _auto_unforced(_LINEAR_GELU):  # as in run_add
        # Shapes give the rows, k and n; "contiguous, else the strides" both layouts (as in
        # run_matmul); the TF32 switch is read per call, as autotune's key does. dtype, both
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


def check_linear(op, x, weight, bias, wname="weight", bname="bias") -> tuple:
    """Raises unless x, weight and bias make one nn.Linear call; returns (x's dtype, weight's
    shape, x's get_device(), x's shape) for the caller's dispatch."""
    tensor = torch.Tensor
    # One expression for the common case (tensors that fit); the checks below explain the
    # rest. get_device() is -1 for every non-CUDA device, so those are compared exactly (on the
    # CPU this took the slow checks: 2.8 us). The same layer test is inlined in check_mlp's
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


def run_linear_glu(
    x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate, backend: str
) -> torch.Tensor:
    args = (x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate)
    return _LINEAR_GLU.implementation(linear_glu_backend(*args, backend))(*args)


def run_linear_glu_train(
    x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate, backend: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """linear_glu's training forward: (out, gate, up), gate and up the pre-activations (..., N)
    in x's dtype, on the backend the forward itself would run on (its `linear_glu_train`,
    beside `linear_glu` in the backend's module)."""
    args = (x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate)
    name = linear_glu_backend(*args, backend)
    train = _glu_train.get(name)
    if train is None:  # the registry resolves by module name: once per backend
        train = _glu_train[name] = _LINEAR_GLU.backend_function(name, "linear_glu_train")
    return train(*args)


_glu_train: dict[str, Callable] = {}  # backend -> its linear_glu_train


def linear_glu_backend(
    x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate, backend: str
) -> str:
    """The backend linear_glu runs on (the call validated first); the inference and the
    training forward run on the same one."""
    dtype, index, x_shape, n = check_linear_glu(
        x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate
    )
    if backend == "auto" and _auto_unforced(_LINEAR_GLU):  # as in run_linear_gelu
        args = (x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate)
        sig = (
            "linear_glu", x_shape, x.is_contiguous() or x.stride(), weight_gate.shape,
            weight_gate.is_contiguous() or weight_gate.stride(),
            weight_up is None or weight_up.is_contiguous() or weight_up.stride(), dtype, index,
            bias_gate is None, bias_up is None, activation, approximate,
            dtype is _F32 and _tf32(),
        )  # fmt: skip
        return _EXACT_HITS.get(sig) or _choose_exact(_LINEAR_GLU, args, sig)
    args = (x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate)
    return dispatch.choose(_LINEAR_GLU, backend, args)


def check_glu_options(activation, approximate) -> None:
    if activation not in GLU_ACTIVATIONS:
        validate.choice("linear_glu", "activation", activation, GLU_ACTIVATIONS)
    if approximate not in GELU_APPROXIMATIONS:
        validate.choice("linear_glu", "approximate", approximate, GELU_APPROXIMATIONS)


def check_linear_glu(x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate):
    """Raises unless the call is one valid linear_glu; returns (x's dtype, x's get_device(),
    x's shape, N) for the caller's dispatch."""
    check_glu_options(activation, approximate)
    op = "linear_glu"
    dtype, wg_shape, index, x_shape = check_linear(
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
        check_linear(op, x, weight_up, None, "weight_up")  # a tensor, dtype, device, features
        if weight_up.shape != wg_shape:
            raise ShapeError(
                f"dualk.linear_glu: 'weight_up' must have the shape of 'weight_gate' "
                f"{tuple(wg_shape)}, got {tuple(weight_up.shape)}"
            )
    check_linear(op, x, weight_up, bias_up, "weight_up", "bias_up")
    return dtype, index, x_shape, wg_shape[0]


def mlp_lists(weights, biases) -> tuple[list, list]:
    """weights and biases as lists (any sequence or an nn.ParameterList, not a tensor or a
    one-shot iterator)."""
    if type(weights) is ParameterList:  # a Module, not a Sequence, but holds the parameters
        weights = list(weights)
    if type(biases) is ParameterList:
        biases = list(biases)
    # (list and tuple first: torch.Tensor read here too would make Dynamo guard the torch module's
    # aliases with Python lambdas on every call of a compiled graph; runtime/route.py says more)
    if type(weights) not in _LIST_TYPES and (
        isinstance(weights, torch.Tensor) or not isinstance(weights, Sequence)
    ):
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
    if type(biases) not in _LIST_TYPES and (
        isinstance(biases, torch.Tensor) or not isinstance(biases, Sequence)
    ):
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


def planned_usable(is_auto: bool) -> bool:
    """Whether planned CUDA calls may serve a call now: a backend= "cuda" call (the argument wins
    over every other source) or an "auto" one with nothing overriding auto and auto's decisions
    as they were planned; never while outputs are poisoned (the planned call does not fill them).
    dualk::fused_mlp_infer's C++ kernel asks this on every call."""
    if _poisoning():
        return False
    return not is_auto or (_auto_unforced(_FUSED_MLP) and _generation() == _PLANNED.generation)


def run_planned_mlp(x, weights, biases, activation, backend):
    """mlp(x) for a call of a class planned by an earlier full call (run_fused_mlp with
    plan=True), in one C++ crossing that checks every operand afresh; None for any other call
    (the caller takes the full route, which raises where the call is wrong). Callers test
    compiling and torch.func transforms first; the C++ side tests the types, gradient mode,
    autocast and jit tracing."""
    run = _PLANNED.run
    if run is None or _poisoning():
        return None
    if backend != "cuda" and not (
        backend == "auto" and _auto_unforced(_FUSED_MLP) and _generation() == _PLANNED.generation
    ):
        return None
    return run(x, weights, biases, activation, backend)


def _plan_mlp(x, weights, biases, activation, backend, dtype, index, no_bias) -> None:
    """After a full call that ran the fused CUDA kernel: plan its class when a planned call
    would run exactly what this one did (backend= "cuda", or "auto" whose remembered, final
    decision for the class is cuda; contiguous operands; no gradient to record)."""
    planned = _PLANNED
    if planned.add is None or _poisoning() or backend not in ("cuda", "auto") or index < 0:
        return
    if not x.is_contiguous() or not x.numel():
        return
    tensors = (*weights, *[b for b in biases if b is not None])
    if not all(t.is_contiguous() for t in tensors):
        return
    if _is_grad_enabled() and (x.requires_grad or any(t.requires_grad for t in tensors)):
        return
    gen = _generation()
    if backend == "auto":
        args = (x, weights, biases, activation)
        if not _auto_unforced(_FUSED_MLP) or autotune.decided(_FUSED_MLP, args) != "cuda":
            return
    if planned.generation != gen:  # auto's decisions were forgotten since: plan afresh
        planned.clear()
        planned.generation = gen
    width = x.shape[-1]
    rows = x.numel() // width
    layers = len(weights)
    planned.add(
        1 if backend == "auto" else 0, _cuda.ACTIVATION_CODES[activation], _cuda.DTYPE_CODES[dtype],
        index, [width, *(w.shape[0] for w in weights)], ~no_bias & ((1 << layers) - 1),
        (rows - 1).bit_length(), dtype is _F32 and _tf32(),
    )  # fmt: skip


def run_fused_mlp(x, weights, biases, activation, backend: str, plan: bool = False) -> torch.Tensor:
    """The full route. plan: where the fused CUDA kernel ran, plan the call's class for
    run_planned_mlp (callers that try it first: inference calls)."""
    dtype, index, shapes, no_bias = check_mlp(x, weights, biases, activation)
    args = (x, weights, biases, activation)
    if backend == "auto" and _auto_unforced(_FUSED_MLP):  # as in run_add
        # x's shape and layout (as in run_matmul) give the rows and layout; the weights'
        # shapes (read by the check, as the bit mask of absent biases) the widths and biases
        # of the key (autotune's fused_mlp key). Comprehensions here cost 1.2 us, the check's
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
    out = _FUSED_MLP.implementation(name)(*args)
    if plan and name == "cuda":
        _plan_mlp(x, weights, biases, activation, backend, dtype, index, no_bias)
    return out


def check_mlp(x, weights, biases, activation) -> tuple:
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
        with device_of(x):
            _fallback_reasons[key] = check(list(widths), x.dtype)
    return _fallback_reasons[key]


def device_of(x: torch.Tensor):
    """The input's device as the current one (a device query inside a limit check reads it)."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _mlp_chain(backend, x, weights, biases, activation) -> torch.Tensor:
    """Per-layer chain of `backend`'s kernels: its matmul for every layer (its linear_gelu where
    the activation is a GELU), bias and the other activations through PyTorch."""
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


# ------------------------------------------------------------------------- any registered op
def run(spec, args: tuple, backend: str) -> torch.Tensor:
    """An operator that its registry entry alone describes (registry.register): its check, the
    dispatcher's choice (argument, environment, scope, config, auto with the entry's key), and
    that backend's implementation on the implementation's arguments `args`."""
    if spec.check is not None:
        spec.check(*args)
    return spec.implementation(dispatch.choose(spec, backend, args))(*args)
