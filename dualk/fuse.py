"""`dualk.fuse(model)`: find chains of nn.Linear and activations in a model and run each chain
as one fused dualk module.

The model is traced with torch.fx. A chain is Linear -> act -> Linear -> ... -> Linear where
every value between two Linears has exactly one user (an intermediate used anywhere else, a
branch, ends the chain there), every activation is the same (nn.ReLU / nn.GELU / nn.SiLU modules,
or torch.relu, F.relu, F.gelu(approximate=...), F.silu, Tensor.relu calls; or none at all), and
the Linears share one dtype and device. A chain of >= 2 Linears becomes a `dualk.nn.FusedMLP`,
a single Linear followed by GELU a `dualk.nn.LinearGELU`. The fused modules hold the model's own
nn.Linear modules (the same nn.Parameter objects), and the original submodules stay where they
were, so optimizers, `state_dict()` keys and checkpoints of the original model keep working.
What cannot be fused is left untouched and listed in the report with the reason.

When tracing fails (data-dependent control flow), each child module is fused on its own
instead, and the report says so.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import fx, nn

from .nn import FusedMLP, LinearGELU, module_activation

_FUNCTION_ACTIVATIONS = {
    torch.relu: "relu",
    F.relu: "relu",
    torch.nn.functional.relu: "relu",
    F.silu: "silu",
    F.gelu: "gelu",
}


@dataclass
class FusedChain:
    name: str  # the new submodule's name
    kind: str  # "FusedMLP" or "LinearGELU"
    nodes: list[str]  # the graph nodes it replaced, in order
    widths: list[int]
    activation: str


@dataclass
class FuseReport:
    fused: list[FusedChain] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (node or module, reason)
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"dualk.fuse: {len(self.fused)} chain(s) fused"]
        for c in self.fused:
            lines.append(
                f"  {c.name}: {c.kind} widths={c.widths} activation={c.activation} "
                f"<- {' -> '.join(c.nodes)}"
            )
        for where, why in self.skipped:
            lines.append(f"  not fused: {where}: {why}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def fuse(
    model: nn.Module, *, backend: str = "auto", min_layers: int = 1, inplace: bool = False
) -> nn.Module:
    """A module computing what `model` computes, whose Linear/activation chains run as dualk
    fused modules sharing `model`'s parameters (the same nn.Parameter objects: train either one,
    save either one's state_dict). `model` itself is not modified unless `inplace` (which only
    matters when tracing fails and children are fused one by one). The report is the returned
    module's `dualk_fuse_report` attribute (`print(...)` it).

    min_layers: the fewest Linears a FusedMLP chain needs (single Linear + GELU chains always
    become LinearGELU)."""
    report = FuseReport()
    source = model if inplace else _tree_copy(model)
    try:
        gm = fx.symbolic_trace(source)
    except Exception as exc:  # data-dependent control flow and the like
        report.notes.append(
            f"torch.fx could not trace {type(model).__name__} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:120]}); fused its children one by one instead"
        )
        _fuse_children(source, backend, min_layers, report)
        source.dualk_fuse_report = report
        return source
    _fuse_graph(gm, backend, min_layers, report)
    gm.dualk_fuse_report = report
    return gm


def _fuse_children(module: nn.Module, backend, min_layers, report: FuseReport) -> None:
    for name, child in list(module.named_children()):
        try:
            gm = fx.symbolic_trace(child)
        except Exception:
            _fuse_children(child, backend, min_layers, report)
            continue
        before = len(report.fused)
        _fuse_graph(gm, backend, min_layers, report, prefix=f"{name}.")
        if len(report.fused) > before:
            setattr(module, name, gm)


def _activation_of(gm: fx.GraphModule, node: fx.Node) -> tuple[str, str] | None:
    """(activation, approximate) when `node` is a fusable activation of one input."""
    if node.op == "call_module":
        return module_activation(gm.get_submodule(node.target))
    if node.op == "call_function" and node.target in _FUNCTION_ACTIVATIONS:
        kind = _FUNCTION_ACTIVATIONS[node.target]
        extra = {k: v for k, v in node.kwargs.items() if k not in ("approximate", "inplace")}
        if len(node.args) != 1 or extra:
            return None
        return (kind, node.kwargs.get("approximate", "none") if kind == "gelu" else "tanh")
    if node.op == "call_method" and node.target == "relu" and len(node.args) == 1:
        return ("relu", "tanh")
    return None


def _linear_of(gm: fx.GraphModule, node: fx.Node) -> nn.Linear | None:
    if node.op == "call_module":
        m = gm.get_submodule(node.target)
        if isinstance(m, nn.Linear):
            return m
    return None


def _single_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _fuse_graph(gm, backend, min_layers, report: FuseReport, prefix: str = "") -> None:
    consumed: set[fx.Node] = set()
    chains = []
    for node in list(gm.graph.nodes):
        if node in consumed or _linear_of(gm, node) is None:
            continue
        nodes, linears, acts = [node], [_linear_of(gm, node)], []
        cur = node
        while True:
            nxt = _single_user(cur)
            if nxt is None:
                if len(cur.users) > 1 and len(linears) >= 1:
                    report.skipped.append(
                        (
                            f"{prefix}{cur.name}",
                            "its output has several users (a branch): the chain stops here",
                        )
                    )
                break
            act = _activation_of(gm, nxt)
            if act is not None:
                after = _single_user(nxt)
                lin = _linear_of(gm, after) if after is not None else None
                if lin is None or after in consumed:
                    if after is None and len(nxt.users) > 1:
                        report.skipped.append(
                            (
                                f"{prefix}{nxt.name}",
                                f"its output has {len(nxt.users)} users (a branch): the chain stops before it",
                            )
                        )
                    if act[0] == "gelu" and len(linears) == 1:
                        acts.append(act)
                        nodes.append(nxt)  # Linear + GELU: a LinearGELU
                    break
                if acts and act != acts[-1]:
                    report.skipped.append(
                        (
                            f"{prefix}{nxt.name}",
                            f"activation {act} differs from {acts[-1]} earlier in the chain",
                        )
                    )
                    break
                nodes += [nxt, after]
                linears.append(lin)
                acts.append(act)
                cur = after
                continue
            lin = _linear_of(gm, nxt)
            if lin is not None and nxt not in consumed and (not acts or acts[-1][0] == "none"):
                nodes.append(nxt)
                linears.append(lin)
                acts.append(("none", "tanh"))
                cur = nxt
                continue
            break
        reason = _unfusable(linears, acts, min_layers)
        if reason is not None:
            if len(linears) > 1 or acts:
                report.skipped.append((f"{prefix}{node.name}", reason))
            continue
        consumed.update(nodes)
        chains.append((nodes, linears, acts))
    for k, (nodes, linears, acts) in enumerate(chains):
        _replace(gm, k, nodes, linears, acts, backend, report, prefix)
    gm.graph.lint()
    gm.recompile()


def _unfusable(linears, acts, min_layers) -> str | None:
    layer_acts = acts[: len(linears) - 1]
    if len(linears) == 1:
        if acts and acts[0][0] == "gelu":
            return None
        return "a single Linear without a following GELU (nothing to fuse)"
    if len(linears) < min_layers:
        return f"{len(linears)} Linear(s) < min_layers={min_layers}"
    if len(set(layer_acts)) > 1:
        return f"mixed activations {layer_acts}"
    params = [p for lin in linears for p in lin.parameters()]
    if len({(p.dtype, p.device) for p in params}) > 1:
        return "the Linears do not share one dtype and device"
    return None


def _replace(gm, k, nodes, linears, acts, backend, report, prefix) -> None:
    first, last = nodes[0], nodes[-1]
    if len(linears) == 1:
        name, kind = f"dualk_linear_gelu_{k}", "LinearGELU"
        module = LinearGELU.from_linear(linears[0], approximate=acts[0][1], backend=backend)
        activation = f"gelu({acts[0][1]})"
    else:
        activation, approximate = acts[0]
        name, kind = f"dualk_fused_mlp_{k}", "FusedMLP"
        module = _SharedFusedMLP(linears, activation, approximate, backend)
        activation = activation + (f"({approximate})" if activation == "gelu" else "")
    gm.add_submodule(name, module)
    with gm.graph.inserting_after(last):
        new = gm.graph.call_module(name, args=(first.args[0],))
    last.replace_all_uses_with(new)
    for node in reversed(nodes):
        gm.graph.erase_node(node)
    widths = [linears[0].in_features, *(lin.out_features for lin in linears)]
    report.fused.append(
        FusedChain(f"{prefix}{name}", kind, [n.name for n in nodes], widths, activation)
    )


class _SharedFusedMLP(FusedMLP):
    """A FusedMLP over Linears that stay registered where the model had them: it holds them
    in a plain tuple, so the fused model's state_dict() keeps exactly the original keys."""

    def __init__(self, linears, activation, approximate, backend):
        nn.Module.__init__(self)
        from .nn import kernel_activation

        self.kernel_activation = kernel_activation(activation, approximate)
        self.activation, self.approximate, self.backend = activation, approximate, backend
        object.__setattr__(self, "_shared", tuple(linears))

    @property
    def layers(self):  # type: ignore[override]
        return self._shared


def _tree_copy(module: nn.Module) -> nn.Module:
    """A copy of the module tree whose modules are new objects but whose parameters and
    buffers are the original ones (so children can be swapped without touching `module`)."""
    clone = copy.copy(module)
    clone._modules = {name: _tree_copy(child) for name, child in module._modules.items()}
    return clone
