"""Modules over dualk's operators, drop-in for the nn.Linear stacks they replace.

- `LinearGELU`: nn.Linear + GELU in one kernel (`dualk.linear_gelu`); parameters, init and
  state_dict keys ("weight", "bias") exactly as nn.Linear's.
- `FusedMLP`: a whole Linear/activation stack in one launch (`dualk.fused_mlp`); its layers are
  plain nn.Linear modules in `self.layers` (keys "layers.0.weight", ...), so init, optimizers,
  DDP and checkpoints treat it as the nn.Linear stack it is.

Both keep autograd (the ops' registered backward) and take `backend=` like every dualk op.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from . import ops
from .errors import InvalidArgumentError

GELU_APPROXIMATIONS = ("tanh", "none")
MODULE_ACTIVATIONS = ("relu", "gelu", "silu", "none")


def kernel_activation(activation: str, approximate: str = "tanh") -> str:
    """fused_mlp's activation name for a module-level (activation, approximate) pair."""
    if activation not in MODULE_ACTIVATIONS:
        raise InvalidArgumentError(
            f"dualk.nn: activation must be one of {MODULE_ACTIVATIONS}, got {activation!r}"
        )
    if activation == "gelu":
        if approximate not in GELU_APPROXIMATIONS:
            raise InvalidArgumentError(
                f"dualk.nn: approximate must be 'tanh' or 'none' (as nn.GELU), got {approximate!r}"
            )
        return "gelu_tanh" if approximate == "tanh" else "gelu_erf"
    return activation


class LinearGELU(nn.Module):
    """`gelu(x @ weight.T + bias)` in one kernel. x (..., in_features) -> (..., out_features);
    float32, float16 or bfloat16. `approximate` as nn.GELU ("tanh" or "none")."""

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
        lin = nn.Linear(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.in_features, self.out_features = in_features, out_features
        self.weight, self.bias = lin.weight, lin.bias
        self.approximate, self.backend = approximate, backend

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, approximate: str = "tanh", backend: str = "auto"
    ) -> LinearGELU:
        """A LinearGELU sharing `linear`'s parameters (the same nn.Parameter objects)."""
        kernel_activation("gelu", approximate)
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.in_features, module.out_features = linear.in_features, linear.out_features
        module.weight, module.bias = linear.weight, linear.bias
        module.approximate, module.backend = approximate, backend
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear_gelu(
            x, self.weight, self.bias, approximate=self.approximate, backend=self.backend
        )

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, approximate={self.approximate!r}, "
            f"backend={self.backend!r}"
        )


class FusedMLP(nn.Module):
    """`L_n(act(... act(L_1(x))))` in one kernel launch. `widths` = (in, hidden..., out), 1 to 8
    layers in one kernel (wider MLPs run as a per-layer chain, see dualk.explain); activation
    "relu" | "gelu" (with `approximate` "tanh" | "none", as nn.GELU) | "silu" | "none", after
    every layer but the last. x (..., widths[0]) -> (..., widths[-1])."""

    def __init__(
        self,
        widths: Sequence[int],
        activation: str = "relu",
        approximate: str = "tanh",
        bias: bool = True,
        backend: str = "auto",
        device=None,
        dtype=None,
    ):
        super().__init__()
        widths = [int(w) for w in widths]
        if len(widths) < 2:
            raise InvalidArgumentError(
                f"dualk.nn.FusedMLP: widths must list at least (in, out), got {widths}"
            )
        self.kernel_activation = kernel_activation(activation, approximate)
        self.activation, self.approximate, self.backend = activation, approximate, backend
        self.layers = nn.ModuleList(
            nn.Linear(i, o, bias=bias, device=device, dtype=dtype)
            for i, o in zip(widths[:-1], widths[1:])
        )

    @property
    def widths(self) -> list[int]:
        return [self.layers[0].in_features, *(lin.out_features for lin in self.layers)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layers = self.layers
        return ops.fused_mlp(
            x,
            [lin.weight for lin in layers],
            [lin.bias for lin in layers],
            activation=self.kernel_activation,
            backend=self.backend,
        )

    @classmethod
    def from_linears(
        cls,
        linears: Sequence[nn.Linear],
        activation: str = "relu",
        approximate: str = "tanh",
        backend: str = "auto",
    ) -> FusedMLP:
        """A FusedMLP whose layers ARE these nn.Linear modules (parameters shared)."""
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.kernel_activation = kernel_activation(activation, approximate)
        module.activation, module.approximate, module.backend = activation, approximate, backend
        module.layers = nn.ModuleList(linears)
        _check_chain("FusedMLP.from_linears", list(linears))
        return module

    @classmethod
    def from_sequential(cls, seq: nn.Sequential, backend: str = "auto") -> FusedMLP:
        """From nn.Sequential(Linear, act, Linear, act, ..., Linear), sharing its parameters.
        Activations: nn.ReLU, nn.GELU(approximate=...), nn.SiLU, or none between Linears (all
        the same); nn.Identity and nn.Dropout in eval mode are skipped."""
        linears, acts = [], []
        pending = None
        for name, m in seq.named_children():
            if isinstance(m, nn.Linear):
                if linears:
                    acts.append(pending or ("none", "tanh"))
                linears.append(m)
                pending = None
                continue
            if isinstance(m, nn.Identity) or (isinstance(m, nn.Dropout) and not m.training):
                continue
            act = module_activation(m)
            if act is None or not linears or pending is not None:
                raise InvalidArgumentError(
                    f"dualk.nn.FusedMLP.from_sequential: module {name!r} ({type(m).__name__}) "
                    "does not fit Linear, activation, Linear, ..., Linear"
                )
            pending = act
        if not linears or pending is not None:
            raise InvalidArgumentError(
                "dualk.nn.FusedMLP.from_sequential: the Sequential must start and end with "
                "nn.Linear (a trailing activation is not part of fused_mlp)"
            )
        if len(set(acts)) > 1:
            raise InvalidArgumentError(
                f"dualk.nn.FusedMLP.from_sequential: all activations must be the same, got {acts}"
            )
        activation, approximate = acts[0] if acts else ("none", "tanh")
        return cls.from_linears(linears, activation, approximate, backend)

    def to_sequential(self) -> nn.Sequential:
        """The equivalent nn.Sequential, sharing this module's parameters."""
        modules: list[nn.Module] = []
        for i, lin in enumerate(self.layers):
            if i:
                modules.append(activation_module(self.activation, self.approximate))
            modules.append(lin)
        return nn.Sequential(*modules)

    def load_sequential_state_dict(self, state_dict: Mapping[str, torch.Tensor], strict=True):
        """Load a state_dict saved from the equivalent nn.Sequential (keys "0.weight",
        "2.weight", ...: Linears at the even positions between activations)."""
        return self.to_sequential().load_state_dict(state_dict, strict=strict)

    def extra_repr(self) -> str:
        act = self.activation + (
            f"(approximate={self.approximate!r})" if self.activation == "gelu" else ""
        )
        return f"widths={self.widths}, activation={act}, backend={self.backend!r}"


def module_activation(m: nn.Module) -> tuple[str, str] | None:
    """(activation, approximate) of an activation module dualk fuses, else None."""
    if isinstance(m, nn.ReLU):
        return ("relu", "tanh")
    if isinstance(m, nn.GELU):
        return ("gelu", m.approximate)
    if isinstance(m, nn.SiLU):
        return ("silu", "tanh")
    return None


def activation_module(activation: str, approximate: str = "tanh") -> nn.Module:
    return {
        "relu": nn.ReLU,
        "gelu": lambda: nn.GELU(approximate=approximate),
        "silu": nn.SiLU,
        "none": nn.Identity,
    }[activation]()


def _check_chain(where: str, linears: list[nn.Linear]) -> None:
    if not linears:
        raise InvalidArgumentError(f"dualk.nn.{where}: no nn.Linear layers")
    for i, (a, b) in enumerate(zip(linears[:-1], linears[1:])):
        if a.out_features != b.in_features:
            raise InvalidArgumentError(
                f"dualk.nn.{where}: layer {i} gives {a.out_features} features but layer {i + 1} "
                f"takes {b.in_features}"
            )
