"""Modules over dualk's operators, drop-in for the nn.Linear stacks they replace.

- `LinearGELU`: nn.Linear + GELU in one kernel (`dualk.linear_gelu`); parameters, init and
  state_dict keys ("weight", "bias") exactly as nn.Linear's.
- `FusedMLP`: a whole Linear/activation stack in one launch (`dualk.fused_mlp`); its layers are
  plain nn.Linear modules in `self.layers` (keys "layers.0.weight", ...), so init, optimizers,
  DDP and checkpoints treat it as the nn.Linear stack it is. A state_dict saved from the
  equivalent nn.Sequential ("0.weight", "2.weight", ...) loads with
  `FusedMLP.load_sequential_state_dict` (explicitly: `load_state_dict` itself takes only this
  module's own keys); `to_sequential().state_dict()` writes one.

- `GatedMLP`: the LLaMA-style feed-forward block `down_proj(act(gate_proj(x)) * up_proj(x))`
  with the gated part in one kernel (`dualk.linear_glu`); `gate_proj`, `up_proj` and
  `down_proj` are plain nn.Linear modules, so LLaMA / Mistral / Qwen checkpoints load as they
  are.

All keep autograd (the ops' registered backward) and take `backend=` like every dualk op.
"""

from __future__ import annotations

import numbers
import re
import time
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from . import dispatch, module_choice, ops
from .backends import cuda
from .backends.torch_ref import ACTIVATIONS
from .core import alloc
from .core.errors import DtypeError, InvalidArgumentError, InvalidTypeError
from .core.guards import Guards
from .core.validate import FLOAT_DTYPES, FLOAT_DTYPES_TEXT
from .dispatch import autotune, check_name
from .dispatch.autotune import tf32_allowed as _tf32
from .registry import OPS
from .runtime import operators, route

GELU_APPROXIMATIONS = ("tanh", "none")
MODULE_ACTIVATIONS = ("relu", "gelu", "silu", "none")
_ACTIVATION_TYPES = {nn.ReLU: "relu", nn.GELU: "gelu", nn.SiLU: "silu"}


def kernel_activation(activation: str, approximate: str = "tanh") -> str:
    """fused_mlp's activation name for a module-level (activation, approximate) pair:
    ("gelu", "tanh") -> "gelu_tanh", ("gelu", "none") -> "gelu_erf", others unchanged."""
    if activation not in MODULE_ACTIVATIONS:
        raise InvalidArgumentError(
            f"dualk.nn: activation must be one of {MODULE_ACTIVATIONS}, got {activation!r}"
        )
    if approximate not in GELU_APPROXIMATIONS:
        raise InvalidArgumentError(
            f"dualk.nn: approximate must be 'tanh' or 'none' (as nn.GELU), got {approximate!r}"
        )
    if activation == "gelu":
        return "gelu_tanh" if approximate == "tanh" else "gelu_erf"
    return activation


# Activation classes of other libraries that compute exactly one of dualk's activations, by
# (module, class name): transformers' ACT2FN entries and timm's layers. Matched by the class
# itself, so a subclass (another forward) is not taken.
_LIBRARY_ACTIVATIONS = {
    ("transformers.activations", "GELUActivation"): ("gelu", "none"),  # F.gelu or its erf form
    ("transformers.activations", "NewGELUActivation"): ("gelu", "tanh"),  # GPT-2's "gelu_new"
    ("transformers.activations", "FastGELUActivation"): ("gelu", "tanh"),
    ("transformers.activations", "PytorchGELUTanh"): ("gelu", "tanh"),
    ("transformers.activations", "GELUTanh"): ("gelu", "tanh"),
    ("transformers.activations", "SiLUActivation"): ("silu", "tanh"),
    # BLOOM's: the tanh form (its backward is that form's derivative)
    ("transformers.models.bloom.modeling_bloom", "BloomGelu"): ("gelu", "tanh"),
    ("timm.layers.activations", "GELU"): ("gelu", "none"),
    ("timm.layers.activations", "GELUTanh"): ("gelu", "tanh"),
    ("timm.layers.activations", "Swish"): ("silu", "tanh"),
}


def module_activation(m: nn.Module) -> tuple[str, str] | None:
    """(activation, approximate) of an activation module dualk can fuse (nn.ReLU, nn.GELU,
    nn.SiLU, not a subclass with its own forward; transformers' and timm's GELU and SiLU
    classes), else None."""
    for cls, name in _ACTIVATION_TYPES.items():
        if isinstance(m, cls) and type(m).forward is cls.forward:
            return (name, m.approximate if name == "gelu" else "tanh")
    cls = type(m)
    act = _LIBRARY_ACTIVATIONS.get((cls.__module__, cls.__qualname__))
    if act is not None and cls.__qualname__ == "GELUActivation":
        # transformers' GELUActivation(use_gelu_python=...): F.gelu or its erf formula; any
        # other function set on it is not a GELU we know
        fn = getattr(m, "act", None)
        if (
            fn is not None
            and fn is not torch.nn.functional.gelu
            and "gelu" not in getattr(fn, "__name__", "")
        ):
            return None
    return act


def activation_module(activation: str, approximate: str = "tanh") -> nn.Module:
    """The torch.nn module of a module-level activation name."""
    if activation == "gelu":
        return nn.GELU(approximate=approximate)
    return {"relu": nn.ReLU, "silu": nn.SiLU, "none": nn.Identity}[activation]()


def linear_problem(m: nn.Linear, check_dtype: bool = True) -> str | None:
    """Why running this nn.Linear inside a fused kernel would change what the model computes or
    fail where the model runs (None when it would not)."""
    if type(m).forward is not nn.Linear.forward:
        return f"{type(m).__name__} overrides nn.Linear.forward"
    if hooks_of(m):
        return f"it has {hooks_of(m)} (a fused kernel would skip them)"
    dtype = m.weight.dtype
    if check_dtype and dtype not in FLOAT_DTYPES:
        return f"its weight is {dtype}; dualk's kernels take float32, float16 and bfloat16"
    return None


def hooks_of(m: nn.Module) -> str:
    """'forward hooks, ...' for the per-module hooks a fused kernel would bypass ('' if none)."""
    kinds = {
        "forward hooks": "_forward_hooks",
        "forward pre-hooks": "_forward_pre_hooks",
        "backward hooks": "_backward_hooks",
        "backward pre-hooks": "_backward_pre_hooks",
    }
    return ", ".join(k for k, attr in kinds.items() if getattr(m, attr, None))


def _without_memo(module: nn.Module) -> dict:
    """A module's state for deepcopy and pickle without its choice memo (a provisional one holds
    a time.monotonic() deadline, meaningless in another process: asked again on the first call)."""
    state = dict(nn.Module.__getstate__(module))  # (a copy: the default is the live __dict__)
    state.pop("_choice_memo", None)
    return state


class LinearGELU(nn.Module):
    """`gelu(x @ weight.T + bias)` in one kernel. x (..., in_features) -> (..., out_features),
    float32, float16 or bfloat16 (the parameters' dtype). `approximate` as nn.GELU ("tanh" or
    "none"). Parameters `weight` (out_features, in_features) and `bias` (out_features,) or None,
    initialised and named as nn.Linear's."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        approximate: str = "tanh",
        backend: str = "auto",
        device=None,
        dtype=None,
    ):
        super().__init__()
        kernel_activation("gelu", approximate)
        _check_bias_flag("LinearGELU", bias)
        _check_dtype("LinearGELU", dtype)
        # nn.Linear's own constructor: the same init and the same random draws.
        lin = nn.Linear(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.in_features, self.out_features = in_features, out_features
        self.weight, self.bias = lin.weight, lin.bias
        self.approximate, self.backend = approximate, check_name(backend, "LinearGELU(backend=)")

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, approximate: str = "tanh", backend: str = "auto"
    ) -> LinearGELU:
        """A LinearGELU over `linear`'s parameters (the same nn.Parameter objects, not copies):
        `LinearGELU.from_linear(lin)(x) == gelu(lin(x))`."""
        _check_linears("LinearGELU.from_linear", [linear])
        kernel_activation("gelu", approximate)
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.in_features, module.out_features = linear.in_features, linear.out_features
        module.weight, module.bias = linear.weight, linear.bias
        module.approximate = approximate
        module.backend = check_name(backend, "LinearGELU.from_linear(backend=)")
        return module

    def reset_parameters(self) -> None:
        """nn.Linear's initialisation."""
        nn.Linear.reset_parameters(self)  # type: ignore[arg-type]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (from the parameter dict, not nn.Module.__getattr__: -0.3 us a call on a CPU-only
        # host; a plain-tensor weight or bias, or no bias, lives in __dict__ instead)
        # (not params.get(k, self.k): that reads the attribute on every call)
        params = self._parameters
        weight = params["weight"] if "weight" in params else self.weight  # noqa: SIM401
        bias = params["bias"] if "bias" in params else self.bias  # noqa: SIM401
        path = _choose_path(self, "linear_gelu", x, [weight], [bias])
        self.__dict__["_last_path"] = path
        if path == "original":
            return F.gelu(F.linear(x, weight, bias), approximate=self.approximate)
        return ops.linear_gelu(x, weight, bias, approximate=self.approximate, backend=self.backend)

    def _choice_shape(self, weights, biases) -> tuple:
        return module_choice.shape_of_linear_gelu(weights[0], biases[0], self.approximate)

    def __getstate__(self):
        return _without_memo(self)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, approximate={self.approximate!r}, "
            f"backend={self.backend!r}"
        )


GLU_ACTIVATIONS = ("silu", "gelu", "relu")


def _check_glu_activation(where: str, activation, approximate) -> None:
    if activation not in GLU_ACTIVATIONS:
        raise InvalidArgumentError(
            f"dualk.nn.{where}: activation must be one of {GLU_ACTIVATIONS}, got {activation!r}"
        )
    if approximate not in GELU_APPROXIMATIONS:
        raise InvalidArgumentError(
            f"dualk.nn.{where}: approximate must be 'tanh' or 'none' (as nn.GELU), got "
            f"{approximate!r}"
        )


class GatedBase(nn.Module):
    """The gated part `act(x @ Wg.T + bg) * (x @ Wu.T + bu)` of a gated MLP, fused
    (`dualk.linear_glu`) or by PyTorch's ops, chosen by dualk.module_choice (kind
    "linear_glu"). Subclasses provide `_gate_up()` -> (gate Linear, up Linear) and call
    `_glu`, or call `_halves_glu` with one Linear computing both; they set `activation`,
    `approximate` and `backend`."""

    def _gate_up(self) -> tuple[nn.Linear, nn.Linear]:
        raise NotImplementedError

    def _glu(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self._gate_up()
        # (from the parameter dicts, as LinearGELU.forward: 4 nn.Module.__getattr__ calls less;
        # a plain-tensor weight or bias, or no bias, lives in __dict__ instead)
        gp, upp = gate._parameters, up._parameters
        wg = gp["weight"] if "weight" in gp else gate.weight  # noqa: SIM401
        wu = upp["weight"] if "weight" in upp else up.weight  # noqa: SIM401
        bg = gp["bias"] if "bias" in gp else gate.bias  # noqa: SIM401
        bu = upp["bias"] if "bias" in upp else up.bias  # noqa: SIM401
        path = _choose_path(self, "linear_glu", x, [wg, wu], [bg, bu])
        self.__dict__["_last_path"] = path
        if path == "original":
            return module_choice.original_glu(x, wg, wu, bg, bu, self.activation, self.approximate)
        return ops.linear_glu(
            x, wg, wu, bg, bu, activation=self.activation, approximate=self.approximate,
            backend=self.backend,
        )  # fmt: skip

    def _halves_glu(self, x: torch.Tensor, linear: nn.Linear, gate_first: bool) -> torch.Tensor:
        """The gated part where one Linear computes both projections, its output split in halves
        (timm's GluMlp: `fc1(x).chunk(2, dim=-1)`): [gate | up] when gate_first, else [up |
        gate] (GluMlp's gate_last=True). Fused on the Linear's own parameters: the packed weight
        as it is when the gate comes first, else views of its halves; the original path is the
        model's own computation (one GEMM, then the halves)."""
        w, b = linear.weight, linear.bias
        path = _choose_path(self, "linear_glu", x, [w], [b])
        self.__dict__["_last_path"] = path
        act, approximate = self.activation, self.approximate
        if path == "original":
            return module_choice.original_glu(x, w, None, b, None, act, approximate, not gate_first)
        if gate_first:
            return ops.linear_glu(
                x, w, None, b, None, activation=act, approximate=approximate, backend=self.backend
            )
        n = w.shape[0] // 2
        bg, bu = (None, None) if b is None else (b[n:], b[:n])
        return ops.linear_glu(
            x, w[n:], w[:n], bg, bu, activation=act, approximate=approximate, backend=self.backend
        )

    def __getstate__(self):
        return _without_memo(self)

    def _choice_shape(self, weights, biases) -> tuple:
        if len(weights) == 1:  # one Linear computing both halves: each half's shape
            w, b = weights[0], biases[0]
            n = w.shape[0] // 2
            weights, biases = [w[:n], w[n:]], [None, None] if b is None else [b[:n], b[n:]]
        return module_choice.shape_of_linear_glu(
            *weights, *biases, self.activation, self.approximate
        )


class GatedMLP(GatedBase):
    """`down_proj(act(gate_proj(x)) * up_proj(x))` (LLaMA's MLP; SwiGLU with "silu", GeGLU with
    "gelu", ReGLU with "relu"), the gated part in one kernel (`dualk.linear_glu`). x (...,
    in_features) -> (..., out_features, default in_features); float32, float16 or bfloat16.
    `gate_proj` and `up_proj` (in -> hidden) and `down_proj` (hidden -> out) are nn.Linear
    modules, initialised and named as in transformers' LlamaMLP, so its state_dict keys load
    as they are. `approximate` as nn.GELU, for "gelu"."""

    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        out_features: int | None = None,
        activation: str = "silu",
        bias: bool = False,
        backend: str = "auto",
        device=None,
        dtype=None,
        *,
        approximate: str = "tanh",
    ):
        super().__init__()
        _check_glu_activation("GatedMLP", activation, approximate)
        _check_bias_flag("GatedMLP", bias)
        _check_dtype("GatedMLP", dtype)
        out_features = in_features if out_features is None else out_features
        kw = {"bias": bias, "device": device, "dtype": dtype}
        self.gate_proj = nn.Linear(in_features, hidden_features, **kw)
        self.up_proj = nn.Linear(in_features, hidden_features, **kw)
        self.down_proj = nn.Linear(hidden_features, out_features, **kw)
        self.activation, self.approximate = activation, approximate
        self.backend = check_name(backend, "GatedMLP(backend=)")

    @classmethod
    def from_linears(
        cls,
        gate: nn.Linear,
        up: nn.Linear,
        down: nn.Linear,
        activation: str = "silu",
        *,
        approximate: str = "tanh",
        backend: str = "auto",
    ) -> GatedMLP:
        """A GatedMLP over these modules (the same objects, not copies): its output is
        `down(act(gate(x)) * up(x))`."""
        # each projection into down (widths chain, one dtype and device)
        _check_linears("GatedMLP.from_linears", [gate, down])
        _check_linears("GatedMLP.from_linears", [up, down])
        _check_glu_activation("GatedMLP.from_linears", activation, approximate)
        if gate.weight.shape != up.weight.shape or (gate.bias is None) != (up.bias is None):
            raise InvalidArgumentError(
                "dualk.nn.GatedMLP.from_linears: 'gate' and 'up' must have the same shape and "
                f"both or neither a bias; got {tuple(gate.weight.shape)} and "
                f"{tuple(up.weight.shape)}"
            )
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.gate_proj, module.up_proj, module.down_proj = gate, up, down
        module.activation, module.approximate = activation, approximate
        module.backend = check_name(backend, "GatedMLP.from_linears(backend=)")
        return module

    def _gate_up(self) -> tuple[nn.Linear, nn.Linear]:
        modules = self._modules  # (not nn.Module.__getattr__: host time)
        if "gate_proj" in modules and "up_proj" in modules:
            return modules["gate_proj"], modules["up_proj"]
        return self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self._glu(x))

    def extra_repr(self) -> str:
        act = f"gelu({self.approximate})" if self.activation == "gelu" else self.activation
        return f"activation={act!r}, backend={self.backend!r}"


_is_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling
_is_dynamo_compiling = getattr(torch.compiler, "is_dynamo_compiling", _is_compiling)
# torch < 2.13 answers is_exporting() True inside torch.compile's Dynamo trace too (seen on
# torch 2.11: every compiled fused module kept dualk's op); there route.exporting() is False,
# and export of a fused module on the GPU is measured like a compile.
_exporting = route.exporting
_fused_mlp = ops.fused_mlp  # (read as ops.fused_mlp while Dynamo traces, the ops module would be
# one object under two names: route.py says what that costs)
_is_tracing = route.is_tracing  # torch.jit.trace: the registered op, which the trace records
_any_autocast = route.any_autocast
_transforms_active = route.transforms_active
_FUSED_MLP_SPEC = OPS["fused_mlp"]
_poisoning, _generation = alloc.poisoning, autotune.generation  # (one global read each)
_clears = autotune.clears
_Tensor = torch.Tensor
_auto_unforced = dispatch.auto_unforced
_monotonic = time.monotonic
PROVISIONAL_PLAN_S = 0.25  # how long a plan of a provisional auto decision serves calls


# nn.Module's global hooks: dicts that registering a hook adds to in place, so bound once
_module_globals = torch.nn.modules.module
_global_hook_dicts = tuple(
    getattr(_module_globals, name)
    for name in (
        "_global_forward_hooks",
        "_global_forward_pre_hooks",
        "_global_backward_hooks",
        "_global_backward_pre_hooks",
    )
    if isinstance(getattr(_module_globals, name, None), dict)
)


def _choose_path(module, op_name: str, x, weights, biases) -> str:
    """ "fused" (dualk's operator) or "original" (PyTorch's ops) for this call of a fused module:
    measured per shape class, device and mode by dualk.module_choice where the module's backend
    is "auto" and nothing overrides auto; "fused" for any other call (a named backend, autocast,
    torch.func transforms, torch.jit tracing, and input the operator itself must judge: it
    raises with its own message). A call like the module's last one (shape, dtype, device,
    gradient mode) reuses its answer."""
    if _is_compiling():
        return _compiled_path(module, x, weights, biases)
    if module.backend != "auto" or _any_autocast() or _transforms_active() or _is_tracing():
        return "fused"
    w0 = weights[0]
    if type(x) is not _Tensor and not isinstance(x, _Tensor):
        return "fused"
    grad_mode = _is_grad_enabled()
    # (names bound once, -0.1 us: on a CPU-only host the memoized call costs 1.9 us, of which
    # reading these nine fields 0.55 and auto_unforced 0.3)
    # (contiguity too: a strided input is measured as a class of its own below)
    sig = (x.shape, x.dtype, x.get_device(), x.requires_grad, grad_mode, w0.requires_grad,
           w0.dtype, w0.get_device(), _clears(), x.is_contiguous())  # fmt: skip
    memo = module.__dict__.get("_choice_memo")
    if (
        memo is not None
        and memo[0] == sig
        and (memo[2] is None or _monotonic() < memo[2])
        and _auto_unforced(OPS[op_name])
    ):
        return memo[1]
    if not (
        x.dim() >= 1 and x.shape[-1] == w0.shape[1] and x.dtype is w0.dtype
        and x.device == w0.device and x.numel() and _auto_unforced(OPS[op_name])
    ):  # fmt: skip
        return "fused"
    x_grad = x.requires_grad
    grad = grad_mode and (
        x_grad or any(t is not None and t.requires_grad for t in (*weights, *biases))
    )
    mode, shape = "train" if grad else "infer", module._choice_shape(weights, biases)
    if not x.is_contiguous():  # measured on a strided input of its own
        shape = (*shape, "strided")
    elif x.dim() > 2:  # and on a batched one (dualk's path reshapes it: module_choice.Shape)
        shape = (*shape, "batched")
    rows = x.numel() // x.shape[-1]
    path = module_choice.choose(mode, shape, rows, grad and x_grad)
    if module_choice.decided(mode, shape, rows, grad and x_grad) is not None:
        module.__dict__["_choice_memo"] = (sig, path, None)
    else:
        # Provisional (a backend still building or tuning) or not measurable now: asked again
        # after PROVISIONAL_PLAN_S. Asking on every call polled the background builds and tuner
        # each time: on an H100 host, BERT's four LinearGELUs cost ~127 us of host time per call
        # more than the original path while linear_gelu's Triton class was still tuning.
        module.__dict__["_choice_memo"] = (sig, path, _monotonic() + PROVISIONAL_PLAN_S)
    return path


def choice_final(module: nn.Module) -> str | None:
    """The module's remembered path ("fused" or "original") for calls like its last one where
    that choice is final (measured, no backend still building or tuning), else None."""
    memo = module.__dict__.get("_choice_memo")
    return memo[1] if memo is not None and memo[2] is None else None


def traced_rows_bucket(x: torch.Tensor) -> int:
    """x's rows (all dimensions but the last) rounded up to a power of two, by comparisons: under
    dynamic shapes each one is a guard on the size's range, so a traced graph (and a constant
    answer that depends on the bucket) holds for one bucket."""
    rows = 1
    for d in x.shape[:-1]:
        rows = rows * d
    bucket = 1
    while bucket < rows:
        bucket *= 2
    return bucket


def compiling_with_dynamo() -> bool:
    """torch.compile's Dynamo traces (not an export, which keeps dualk's ops)."""
    return _is_dynamo_compiling() and not _exporting()


def _compiled_path(module, x, weights, biases) -> str:
    """_choose_path under torch.compile: the answer is a constant of the traced graph."""
    if module.backend != "auto" or not compiling_with_dynamo():
        return "fused"  # an exported program (traced without Dynamo) keeps dualk's ops
    if not x.is_contiguous():
        # dualk's op would copy it first; Inductor folds the layout into its own GEMM (timm
        # Mixer's token MLP on a transposed input: 0.33x with dualk's op on an H200)
        return "original"
    return compiled_choice(
        module, weights, biases, traced_rows_bucket(x), _is_grad_enabled(), x.requires_grad
    )


def compiled_choice(module, weights, biases, bucket: int, grad_mode: bool, x_grad: bool) -> str:
    """module_choice's compiled path for a fused module with backend "auto" on a contiguous input
    of `bucket` rows (traced_rows_bucket) under Dynamo."""
    grad = grad_mode and (
        x_grad or any(t is not None and t.requires_grad for t in (*weights, *biases))
    )
    return module_choice.compiled_path(module._choice_shape(weights, biases), bucket, grad)


class _FastPath:
    """FusedMLP's planned CUDA call in one C++ crossing (cuda_src/binding_mlp.cpp MlpPlan) for the
    row buckets whose plan runs the CUDA kernel. The C++ side checks on every call what the
    plan's Python checks would (x; the parameters and layers still the ones planned, through
    their modules' _parameters and _modules dicts; their dtype, shape and storage read afresh;
    gradient mode, autocast, jit tracing; with poisoning on, it NaN-fills the output first) and
    the Python-side state the plan was made under, as guards (_fast_guards, dualk/core/guards.py):
    torch.func transforms, the poisoning switch, the module's backend and auto's decisions and
    overrides, the TF32 flag of an fp32 plan, an absorbed Dropout that drops now. `run` (for
    FusedMLP.__call__) also checks what nn.Module's call would do besides forward (hooks, a
    module.compile()); `run_in_forward` leaves that to the call that ran forward. In Python
    these checks cost 1-3 us per call (H100 host: the fuse'd seed model 15.2 us against the
    functional call's 11.9); in C++ they are a few dict reads."""

    __slots__ = ("plan", "run", "run_in_forward", "owner", "tf32", "buckets", "poison")

    def __init__(self, plan, owner, tf32, buckets, poison):
        self.plan, self.owner, self.tf32, self.buckets, self.poison = (
            plan, owner, tf32, buckets, poison
        )  # fmt: skip
        # (bound once: FusedMLP.__call__ reads fast.run on every call)
        self.run, self.run_in_forward = plan.run, plan.run_in_forward

    @classmethod
    def add(cls, module, owner, slot, weights, biases, activation) -> None:
        """Adds `slot`'s row bucket (planned to run the CUDA kernel) to the module's fast path."""
        bucket, tf32 = slot
        tf32 = tf32 if weights[0].dtype is torch.float32 else None
        fast = module.__dict__.get("_fast")
        buckets = 1 << bucket
        poison = alloc.poisoning()
        if (
            fast is not None
            and fast.owner is owner
            and fast.tf32 == tf32
            and fast.poison is poison
            and fast.plan.guards_hold()  # (else made afresh: a guard broken by an equal value)
        ):
            if fast.buckets & buckets:
                return
            buckets |= fast.buckets
        guards = plan_guards(module, owner, tf32, weights, biases)
        if guards is None:
            return
        try:
            plan = cuda.fused_mlp_plan(
                list(weights), list(biases), activation, buckets, poison, *guards
            )  # fmt: skip
        except Exception:  # an extension without MlpPlan (an older prebuilt): the Python plan
            return
        module.__dict__["_fast"] = cls(plan, owner, tf32, buckets, poison)


def plan_guards(module, owner, tf32, weights, biases) -> tuple[Guards, Guards] | None:
    """(state, call) guards of a fast path planned now for `module` with these parameters (what
    MlpPlan checks on every call, and what only its run checks: call_guards), or None where no
    fast path would serve now. The CPU tests' stand-in plan takes the same."""
    state = _layer_guards(module, weights, biases)
    more = _fast_guards(module, owner, tf32)
    if state is None or more is None:
        return None
    return state.extend(more), call_guards(module)


def _layer_guards(module, weights, biases) -> Guards | None:
    """The module's layers and parameters as guards (their _modules and _parameters entries: a
    parameter or layer replaced, or a layer appended, through any route breaks one), or None
    where they are not `weights` and `biases` now."""
    guards = Guards()
    layers = module._modules.get("layers")
    if isinstance(layers, nn.ModuleList):  # FusedMLP's own layers
        guards.identities.append((module._modules, "layers", layers))
        guards.identities += [(layers._modules, key, lin) for key, lin in layers._modules.items()]
        guards.sizes.append((layers._modules, len(layers._modules)))
    elif type(shared := module.__dict__.get("_shared")) is tuple:  # dualk.fuse's, shared
        layers = shared
        guards.identities.append((module.__dict__, "_shared", shared))
    else:
        return None
    if len(layers) != len(weights):
        return None
    for lin, w, b in zip(layers, weights, biases):
        params = lin._parameters
        if params.get("weight") is not w or params.get("bias") is not b:
            return None
        guards.identities += [(params, "weight", w), (params, "bias", b)]
    return guards


def _fast_guards(module, owner, tf32) -> Guards | None:
    """The state a fast path is planned under, as guards (dualk/core/guards.py), or None where
    the plan would not serve now: the module's plan and backend, the poisoning switch, no
    torch.func transform, an fp32 plan's TF32 switch, its absorbed Dropouts as they are (none
    dropping), and for "auto" auto's decisions as planned and nothing overriding auto."""
    d = module.__dict__
    backend = d.get("backend")
    if (
        d.get("_plan") is not owner
        or backend != owner.backend
        or module._between_active()
        or _transforms_active()
        or (tf32 is not None and _tf32() != tf32)
    ):
        return None
    guards = Guards()
    if backend == "auto":
        unforced = dispatch.unforced_guards(_FUSED_MLP_SPEC)
        gen = autotune.generation_guard()
        if unforced is None or gen[2] != owner.generation:
            return None
        guards.extend(unforced).identities.append(gen)
    guards.identities += [(d, "_plan", owner), (d, "backend", backend), alloc.poisoning_guard()]
    guards.identities += module._between_guards()
    guards.calls.append((_transforms_active, False))
    if tf32 is not None:
        guards.calls.append((_tf32, tf32))
    return guards


def call_guards(module: nn.Module) -> Guards:
    """module(x) would be module.forward(x) and nothing else (no hooks of its own or global ones,
    not compiled in place), as guards: `call_guards(m).hold()` asks it now."""
    guards = Guards()
    guards.empty += [
        module._forward_hooks,
        module._forward_pre_hooks,
        module._backward_hooks,
        module._backward_pre_hooks,
        *_global_hook_dicts,
    ]
    guards.absent.append((module.__dict__, "_compiled_call_impl"))
    return guards


class _InferencePlan:
    """FusedMLP's inference fast path. dualk.fused_mlp checks every weight and bias, resolves the
    backend (overrides, then auto's cache) and shapes the call on every call: ~25 us of host time
    on an H100 machine for the seed model, most of a batch-32 call's wall time. Once a full call
    has succeeded with gradients off, the plan remembers, per (rows bucket, tf32 flag), the
    backend that ran and a launcher bound to the weights, and later calls check only what can
    change between calls:
      - x: a plain contiguous 2-dim tensor with rows, of the weights' dtype, device and width;
      - the parameters: the same objects, storage (data_ptr), shapes and dtypes as when planned
        (a replaced parameter, .to()/.half() and .data assignments change one of them; in-place
        updates, as optimizers and load_state_dict do, keep the plan valid);
      - the decision: the module's backend, or for "auto" no override now
        (dispatch.auto_unforced) and auto's decisions unchanged (autotune.generation()).
    Anything else takes the full call, which (re)builds the plan. Results are the same kernels'
    on the same inputs (tests/test_nn.py checks equality with the full call)."""

    __slots__ = (
        "ptrs",
        "dtype",
        "device",
        "device_index",
        "in_features",
        "backend",
        "generation",
        "runners",
    )

    def __init__(self, ptrs, dtype, device, in_features, backend, generation):
        # get_device()'s value for x on `device` (-1 on every non-CUDA device: those compare
        # whole devices)
        self.ptrs, self.dtype, self.device = ptrs, dtype, device
        self.device_index = device.index if device.type == "cuda" else -1
        self.in_features, self.backend, self.generation = in_features, backend, generation
        self.runners: dict = {}

    @staticmethod
    def _ptrs(weights, biases) -> tuple:
        """The parameters as planned: each one's identity, storage, shape and dtype (a replaced
        parameter, .to()/.half() and a .data assignment change one of them; the dtype too, since
        a .data assignment can give a parameter another dtype at the address it had)."""
        out: list = []
        for t in weights:
            out += (id(t), t.data_ptr(), t.shape, t.dtype)
        for b in biases:
            out += (None,) if b is None else (id(b), b.data_ptr(), b.shape, b.dtype)
        return tuple(out)

    @staticmethod
    def _slot(x: torch.Tensor, dtype) -> tuple:
        m = x.shape[0]
        return ((m - 1).bit_length(), dtype is torch.float32 and _tf32())

    def run(self, module, x, weights, biases) -> torch.Tensor | None:
        if not (
            type(x) is torch.Tensor
            and x.dtype is self.dtype
            and x.get_device() == self.device_index
            and (self.device_index >= 0 or x.device == self.device)
            and x.dim() == 2
            and x.shape[1] == self.in_features
            and x.shape[0] > 0
            and x.is_contiguous()
            and module.backend == self.backend
            and (self.backend != "auto" or (
                dispatch.auto_unforced(_FUSED_MLP_SPEC) and autotune.generation() == self.generation
            ))
            and self._ptrs(weights, biases) == self.ptrs
        ):  # fmt: skip
            return None
        entry = self.runners.get(self._slot(x, self.dtype))
        if entry is None or (entry[2] is not None and _monotonic() > entry[2]):
            return None
        module.__dict__["_last_path"] = entry[1]
        return entry[0](x)

    @classmethod
    def update(cls, module, x, weights, biases, original: bool = False) -> None:
        """After a successful full call with gradients off: remember the path (dualk's backend,
        or with `original` PyTorch's ops) that ran for x's slot, when the fast path can
        reproduce it exactly."""
        if not (
            type(x) is torch.Tensor and x.dim() == 2 and x.shape[0] > 0 and x.is_contiguous()
            and all(type(t) in (torch.Tensor, nn.Parameter) and t.is_contiguous() and t.numel()
                    for t in (*weights, *[b for b in biases if b is not None]))
        ):  # fmt: skip
            return
        activation, backend = module.kernel_activation, module.backend
        args = (x, weights, biases, activation)
        # The module's own path choice (module_choice) still provisional: the plan expires with
        # it, and no C++ fast path, so a full call asks again when it is due. A plan that never
        # expired served every later call without asking, the choice stayed provisional for
        # good and fuse's in-model check never started (an H200 GPU test, session 34).
        memo = module.__dict__.get("_choice_memo") if backend == "auto" else None
        expires = memo[2] if memo is not None else None
        if original:
            name = "original"
        elif backend == "auto":
            if not dispatch.auto_unforced(_FUSED_MLP_SPEC):
                return
            name = autotune.decided(_FUSED_MLP_SPEC, args)
            if name is None:
                # A provisional decision (CUDA building, Triton tuning in the background) is
                # planned for PROVISIONAL_PLAN_S at a time: the full call after that asks
                # autotune again, which takes the final decision in when it is due.
                name = autotune.provisional_winner(_FUSED_MLP_SPEC, args)
                if name is None:  # a heuristic answer (not remembered): keep taking the full call
                    return
                due = _monotonic() + PROVISIONAL_PLAN_S
                expires = due if expires is None else min(expires, due)
        else:
            name = backend
        if name not in ("torch", "original") and operators.mlp_fallback_reason(name, x, weights):
            return  # the per-layer chain: not planned
        ptrs = cls._ptrs(weights, biases)
        plan = module.__dict__.get("_plan")
        gen = autotune.generation()
        # (dtype and device follow from ptrs, dtypes included: the full call checked x against
        # these weights)
        if plan is None or plan.ptrs != ptrs or plan.backend != backend or plan.generation != gen:
            plan = _InferencePlan(ptrs, x.dtype, x.device, x.shape[1], backend, gen)
            module.__dict__["_plan"] = plan
            module.__dict__.pop("_fast", None)
        if name == "original":
            runner = module._original_forward
        elif name == "cuda":
            runner = cuda.fused_mlp_runner(weights, biases, activation)
            if expires is None:  # (a provisional plan stays in Python: it expires)
                _FastPath.add(module, plan, cls._slot(x, x.dtype), weights, biases, activation)
        else:
            impl = _FUSED_MLP_SPEC.implementation(name)
            ws, bs = list(weights), list(biases)

            def runner(x, impl=impl, ws=ws, bs=bs, activation=activation):
                return impl(x, ws, bs, activation)

        plan.runners[cls._slot(x, x.dtype)] = (
            runner,
            "original" if name == "original" else "fused",
            expires,
        )


class FusedMLP(nn.Module):
    """`L_n(act(... act(L_1(x))))` in one kernel launch. `widths` = (in, hidden..., out): 1 to 8
    layers run in one kernel (more, or wider than the kernels hold, run as a per-layer chain:
    see dualk.explain). activation "relu" | "gelu" (with `approximate` "tanh" | "none", as
    nn.GELU) | "silu" | "none", after every layer but the last. x (..., widths[0]) ->
    (..., widths[-1]), float32, float16 or bfloat16 (the parameters' dtype).

    `layers` is an nn.ModuleList of plain nn.Linear (nn.Linear's init; state_dict keys
    "layers.<i>.weight" / "layers.<i>.bias")."""

    def __init__(
        self,
        widths: Sequence[int],
        activation: str = "relu",
        bias: bool = True,
        backend: str = "auto",
        device=None,
        dtype=None,
        *,
        approximate: str = "tanh",
    ):
        super().__init__()
        try:
            widths = [w.item() if isinstance(w, torch.Tensor) else w for w in widths]
        except TypeError:
            raise InvalidTypeError(
                f"dualk.nn.FusedMLP: widths must be a sequence of ints, got {type(widths).__name__}"
            ) from None
        if len(widths) < 2 or any(
            isinstance(w, bool) or not isinstance(w, numbers.Integral) or w < 1 for w in widths
        ):
            raise InvalidArgumentError(
                f"dualk.nn.FusedMLP: widths must be (in, hidden..., out), at least two positive "
                f"ints, got {list(widths)}"
            )
        widths = [int(w) for w in widths]
        _check_bias_flag("FusedMLP", bias)
        _check_dtype("FusedMLP", dtype)
        self._set_options(activation, approximate, backend, "FusedMLP")
        self.layers = nn.ModuleList(
            nn.Linear(i, o, bias=bias, device=device, dtype=dtype)
            for i, o in zip(widths[:-1], widths[1:])
        )

    def _set_options(self, activation, approximate, backend, where) -> None:
        self._set_activation(activation, approximate)
        self.backend = check_name(backend, f"{where}(backend=)")

    def _set_activation(self, activation, approximate) -> None:
        """Checks the pair, sets the kernel's activation and drops the inference plan (whose
        runners hold the old one): activation and approximate stay settable after construction."""
        self.kernel_activation = kernel_activation(activation, approximate)
        self._activation, self._approximate = activation, approximate
        self.__dict__.pop("_plan", None)
        self.__dict__.pop("_fast", None)

    @property
    def activation(self) -> str:
        return self._activation

    @activation.setter
    def activation(self, value: str) -> None:
        self._set_activation(value, self._approximate)

    @property
    def approximate(self) -> str:
        return self._approximate

    @approximate.setter
    def approximate(self, value: str) -> None:
        self._set_activation(self._activation, value)

    @property
    def widths(self) -> list[int]:
        """(in, hidden..., out) of the current layers."""
        return [self.layers[0].in_features, *(lin.out_features for lin in self.layers)]

    def __call__(self, *args, **kwargs):
        # The planned CUDA call (_FastPath.run, whose guards include nn.Module's call doing
        # nothing but forward: no hooks, not compiled in place) without nn.Module's call
        # machinery around it: 1.1 of a small-batch call's few us of host time on a CPU-only
        # host. Anything else is nn.Module's call, looked up now (torch.fx patches it while
        # tracing). (compiling first: a trace reads nothing here, so it guards on nothing more)
        if (
            not _is_compiling()
            and (fast := self.__dict__.get("_fast")) is not None
            and len(args) == 1
            and not kwargs
            and (out := fast.run(args[0])) is not None
        ):
            return out
        return nn.Module.__call__(self, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _is_compiling():
            return self._compiled_forward(x)
        fast = self.__dict__.get("_fast")
        if fast is not None and (out := fast.run_in_forward(x)) is not None:
            return out
        layers = self.layers
        weights = [lin.weight for lin in layers]
        biases = [lin.bias for lin in layers]
        if self._between_active():  # an absorbed Dropout that drops now: only PyTorch's ops
            return self._original_forward(x)
        # Inference (no gradient to record, not tracing, no autocast, no torch.func transform):
        # the plan from an earlier full call.
        planned = not (
            _is_grad_enabled()
            or _is_compiling()
            or _any_autocast()
            or _transforms_active()
            or _is_tracing()
        )
        if planned:
            plan = self.__dict__.get("_plan")
            if plan is not None:
                out = plan.run(self, x, weights, biases)
                if out is not None:
                    return out
        path = _choose_path(self, "fused_mlp", x, weights, biases)
        self.__dict__["_last_path"] = path
        if path == "original":
            out = self._original_forward(x)
        else:
            out = ops.fused_mlp(
                x, weights, biases, activation=self.kernel_activation, backend=self.backend
            )
        if planned and (path == "fused" or choice_final(self) is not None):
            # (the original path is planned only once its choice is final)
            _InferencePlan.update(self, x, weights, biases, original=path == "original")
        return out

    def _compiled_forward(self, x: torch.Tensor) -> torch.Tensor:
        """forward while torch.compile or export traces: the path is a constant of the graph
        (_compiled_path); no plans, and no `_last_path` store (a side effect the compiled graph
        would replay on every call: ~7 us of a compiled call on a CPU-only host)."""
        layers = self.layers
        weights = [lin.weight for lin in layers]
        biases = [lin.bias for lin in layers]
        if self._between_active() or _compiled_path(self, x, weights, biases) == "original":
            return self._original_forward(x)
        return _fused_mlp(
            x, weights, biases, activation=self.kernel_activation, backend=self.backend
        )

    def _choice_shape(self, weights, biases) -> tuple:
        return module_choice.shape_of_mlp(weights, biases, self.kernel_activation)

    def _between_modules(self) -> tuple:
        """Modules that run between two layers after the activation on the original path (the
        nn.Dropout / nn.Identity of a chain dualk.fuse absorbed): one tuple per gap, or ()."""
        return ()

    def _between_active(self) -> bool:
        return False

    def _between_guards(self) -> list:
        """Guards (dualk/core/guards.py identities) that hold while _between_active() stays
        as it is now."""
        return []

    def _original_forward(self, x: torch.Tensor) -> torch.Tensor:
        """What the nn.Linear stack computes, with PyTorch's ops (the "original" path)."""
        act = ACTIVATIONS[self.kernel_activation]
        between = self._between_modules()
        layers = self.layers
        last = len(layers) - 1
        for i, lin in enumerate(layers):
            x = F.linear(x, lin.weight, lin.bias)
            if i < last:
                x = act(x)
                for m in between[i] if between else ():
                    x = m(x)
        return x

    def __getstate__(self):
        state = _without_memo(self)
        state.pop("_plan", None)  # launch closures: rebuilt on the first call of the copy
        state.pop("_fast", None)
        return state

    @classmethod
    def from_linears(
        cls,
        linears: Sequence[nn.Linear],
        activation: str = "relu",
        backend: str = "auto",
        *,
        approximate: str = "tanh",
    ) -> FusedMLP:
        """A FusedMLP whose layers ARE these nn.Linear modules (parameters shared, not
        copied). They must chain (out_features of one = in_features of the next) and share one
        dtype and device."""
        linears = list(linears)
        _check_linears("FusedMLP.from_linears", linears)
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module._set_options(activation, approximate, backend, "FusedMLP.from_linears")
        module.layers = nn.ModuleList(linears)
        return module

    @classmethod
    def from_sequential(cls, seq: nn.Sequential, backend: str = "auto") -> FusedMLP:
        """From nn.Sequential(Linear, act, Linear, act, ..., Linear), sharing its nn.Linear
        modules (and so its parameters). Activations: nn.ReLU, nn.GELU(approximate=...),
        nn.SiLU, all the same; nn.Identity (and nn.Dropout with p=0) count as nothing, and two
        Linears with nothing between make activation "none". Anything else raises ValueError
        naming the module."""
        where = "dualk.nn.FusedMLP.from_sequential"
        if not isinstance(seq, nn.Sequential):
            raise InvalidTypeError(f"{where}: expected an nn.Sequential, got {type(seq).__name__}")
        linears: list[nn.Linear] = []
        # (where, activation) between consecutive Linears
        acts: list[tuple[str, tuple[str, str]]] = []
        pending: tuple[str, tuple[str, str]] | None = None
        last_linear = ""
        for name, m in seq.named_children():
            if isinstance(m, nn.Linear):
                if linears:
                    prev = linears[-1]
                    if prev.out_features != m.in_features:
                        raise InvalidArgumentError(
                            f"{where}: module {name!r} ({m}) takes {m.in_features} features but "
                            f"module {last_linear!r} gives {prev.out_features}"
                        )
                    none = (f"nothing between {last_linear!r} and {name!r}", ("none", "tanh"))
                    acts.append(pending or none)
                    if acts[-1][1] != acts[0][1]:
                        raise InvalidArgumentError(
                            f"{where}: all activations must be the same: {acts[-1][0]} "
                            f"({_describe(acts[-1][1])}) differs from {acts[0][0]} "
                            f"({_describe(acts[0][1])})"
                        )
                problem = linear_problem(m, check_dtype=False)
                if problem is not None:
                    raise InvalidArgumentError(f"{where}: module {name!r}: {problem}")
                linears.append(m)
                last_linear, pending = name, None
                continue
            if type(m) is nn.Identity or (type(m) is nn.Dropout and m.p == 0):
                continue
            act = module_activation(m)
            if act is None:
                raise InvalidArgumentError(
                    f"{where}: module {name!r} ({type(m).__name__}) is not nn.Linear, nn.ReLU, "
                    "nn.GELU, nn.SiLU or nn.Identity"
                )
            if hooks_of(m):
                raise InvalidArgumentError(
                    f"{where}: module {name!r} has {hooks_of(m)} (a fused kernel would skip them)"
                )
            if not linears or pending is not None:
                raise InvalidArgumentError(
                    f"{where}: module {name!r} ({type(m).__name__}) must sit between two "
                    "nn.Linear modules (Linear, activation, Linear, ..., Linear)"
                )
            pending = (f"module {name!r}", act)
        if not linears:
            raise InvalidArgumentError(f"{where}: the Sequential has no nn.Linear")
        if pending is not None:
            raise InvalidArgumentError(
                f"{where}: {pending[0]} follows the last nn.Linear; fused_mlp applies "
                "no activation after its last layer (fuse the Sequential without it)"
            )
        activation, approximate = acts[0][1] if acts else ("none", "tanh")
        return cls.from_linears(linears, activation, backend, approximate=approximate)

    def to_sequential(self) -> nn.Sequential:
        """The equivalent nn.Sequential(Linear, act, ..., Linear), sharing this module's
        nn.Linear modules; its state_dict has the Sequential's keys ("0.weight", "2.weight")."""
        modules: list[nn.Module] = []
        for i, lin in enumerate(self.layers):
            if i:
                modules.append(activation_module(self.activation, self.approximate))
            modules.append(lin)
        return nn.Sequential(*modules)

    def load_sequential_state_dict(
        self, state_dict: Mapping[str, torch.Tensor], strict: bool = True, assign: bool = False
    ):
        """Load a state_dict saved from the equivalent nn.Sequential: keys "<i>.weight" and
        "<i>.bias" where the i holding a weight, in increasing order, are this module's layers
        ("0.", "2.", "4." with activations between; any other numbering of the Linears works
        too). Returns load_state_dict's (missing_keys, unexpected_keys), in this module's
        names. Tensors are copied into the parameters (unless `assign`)."""
        numbered: dict[int, dict[str, torch.Tensor]] = {}
        other: dict[str, torch.Tensor] = {}
        for key, value in state_dict.items():
            m = re.fullmatch(r"(\d+)\.(.+)", key)
            if m is None:
                other[key] = value  # load_state_dict reports it as unexpected
            else:
                numbered.setdefault(int(m.group(1)), {})[m.group(2)] = value
        linear_ids = sorted(i for i, entries in numbered.items() if "weight" in entries)
        if len(linear_ids) != len(self.layers):
            raise InvalidArgumentError(
                f"dualk.nn.FusedMLP.load_sequential_state_dict: the state_dict holds "
                f"{len(linear_ids)} Linear weight(s) (at {linear_ids}), this module has "
                f"{len(self.layers)} layers"
            )
        remapped = {f"layers.{k}.{rest}": v
                    for k, i in enumerate(linear_ids) for rest, v in numbered[i].items()}  # fmt: skip
        for i in sorted(set(numbered) - set(linear_ids)):  # e.g. an activation with a buffer
            other.update({f"{i}.{rest}": v for rest, v in numbered[i].items()})
        return self.load_state_dict({**remapped, **other}, strict=strict, assign=assign)

    def extra_repr(self) -> str:
        return (
            f"widths={self.widths}, activation={_describe((self.activation, self.approximate))}"
            f", backend={self.backend!r}"
        )


def _check_bias_flag(where: str, bias) -> None:
    # A string here is most likely an `approximate` passed by position.
    if not isinstance(bias, bool):
        raise InvalidTypeError(
            f"dualk.nn.{where}: bias must be True or False, got {bias!r} (approximate= is a "
            "keyword argument)"
        )


def _check_dtype(where: str, dtype) -> None:
    # Caught here, not at every forward call: a float64 or integer module could never run.
    # (from_sequential / from_linears take float64 layers: a model may be converted after.)
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise DtypeError(f"dualk.nn.{where}: dtype must be None, {FLOAT_DTYPES_TEXT}, got {dtype}")


def _describe(act: tuple[str, str]) -> str:
    return f"gelu(approximate={act[1]!r})" if act[0] == "gelu" else act[0]


def _check_linears(where: str, linears: list[nn.Linear]) -> None:
    if not linears:
        raise InvalidArgumentError(f"dualk.nn.{where}: no nn.Linear layers")
    for i, lin in enumerate(linears):
        if not isinstance(lin, nn.Linear):
            raise InvalidTypeError(
                f"dualk.nn.{where}: layer {i} must be an nn.Linear, got {type(lin).__name__}"
            )
        problem = linear_problem(lin, check_dtype=False)
        if problem is not None:
            raise InvalidArgumentError(f"dualk.nn.{where}: layer {i}: {problem}")
    for i, (a, b) in enumerate(zip(linears[:-1], linears[1:])):
        if a.out_features != b.in_features:
            raise InvalidArgumentError(
                f"dualk.nn.{where}: layer {i} gives {a.out_features} features but layer {i + 1} "
                f"takes {b.in_features}"
            )
    first = linears[0].weight
    for i, lin in enumerate(linears):
        for name, p in lin.named_parameters():
            if p.dtype != first.dtype or p.device != first.device:
                raise InvalidArgumentError(
                    f"dualk.nn.{where}: layer {i}'s {name} is {p.dtype} on {p.device}, layer 0's "
                    f"weight {first.dtype} on {first.device}: the layers must share one dtype "
                    "and device"
                )
