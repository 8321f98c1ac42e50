"""`dualk.fuse(model)`: find chains of nn.Linear and activations in a model and run each chain
as one fused dualk module.

The model is traced with torch.fx. A chain is Linear -> act -> Linear -> ... -> Linear where
every value between two Linears has exactly one user (an intermediate used anywhere else, a
branch, ends the chain there), every activation is the same (nn.ReLU / nn.GELU / nn.SiLU modules,
or torch.relu, F.relu, F.gelu(approximate=...), F.silu, Tensor.relu calls; or none at all), and
the Linears share one dtype (float32, float16 or bfloat16) and device. A chain of >= 2 Linears
becomes a `dualk.nn.FusedMLP` (split into pieces of at most 8 layers, what one fused kernel
holds), a single Linear followed by GELU a `dualk.nn.LinearGELU`. A gated MLP (LLaMA's
`down(act(gate(x)) * up(x))`, timm's SwiGLU: two Linears of one shape on the same input, a
SiLU / GELU / ReLU on the gate's output alone, their product going into a Linear, directly or
through nn.Dropout / nn.Identity modules) has its gated part (gate, act, up, mul) run as one
`dualk.linear_glu` (report kind "LinearGLU"); `down` (and those modules) stay in the graph. So
does timm's GluMlp, one Linear whose output is split in halves (`x.chunk(2, dim=-1)`) with the
activation on one of them: its weight is passed packed where the gate is the first half (timm's
SwiGLUPacked), as views of its halves where it is the second (GluMlp's default gate_last=True).
Linears and activations that are subclasses with their own forward, or have hooks, are not
fused.

The fused modules use the model's own nn.Linear modules (the same nn.Parameter objects), and
every original submodule stays registered where it was: optimizers over `model.parameters()`,
`state_dict()` keys and checkpoints of the original model keep working with the fused one.
What cannot be fused is left untouched and listed in the report with the reason.

When the model cannot be traced (data-dependent control flow), its children are fused instead:
an nn.Sequential runs its fused chains inside its own forward (still an nn.Sequential: indexing,
len, state_dict unchanged), another child module traced on its own runs the fused graph as its
forward, and an untraceable child is searched in turn. The report says so.

As with any torch.fx trace, Python decisions in `forward` (shapes read as ints) are fixed at
trace time; a forward that reads `self.training` or computes otherwise when an argument that
defaults to None is omitted is found by a second trace and fused child by child instead, except
a forward whose graph depends on its own `self.training` only (a third trace): that module is
fused in place for the mode it is in, and runs its class forward in the other.

Why one file of ~700 lines: finding chains, building the replacement modules and the fallback
for untraceable models share the chain record and the report; split, each part would need the
other's internals.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import math
import operator
import re
import statistics
import textwrap
import threading
import time
import types
import weakref
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import fx, nn

from . import module_choice, ops
from .core.errors import InvalidArgumentError, InvalidTypeError
from .core.validate import FLOAT_DTYPES
from .dispatch import autotune, check_name
from .nn import (
    FusedMLP,
    GatedBase,
    GatedMLP,
    LinearGELU,
    call_guards,
    choice_final,
    compiled_choice,
    compiling_with_dynamo,
    hooks_of,
    kernel_activation,
    linear_problem,
    module_activation,
    traced_rows_bucket,
)
from .runtime import route

# torch.nn.functional.relu is F.relu; Tensor.relu() is a call_method node, handled apart.
_FUNCTION_ACTIVATIONS = {torch.relu: "relu", F.relu: "relu", F.silu: "silu", F.gelu: "gelu"}
MAX_FUSED_LAYERS = 8  # fused_mlp's kernels (Triton and CUDA) hold 1 to 8 layers
_NONE = ("none", "tanh")

Activation = tuple[str, str]  # (activation, approximate) as dualk.nn.FusedMLP takes them


@dataclass
class FusedChain:
    """One fused chain: the new module, what it replaced and what it computes."""

    name: str  # the new module's name (in the fused GraphModule, or in a child's fused graph)
    kind: str  # "FusedMLP", "LinearGELU" or "LinearGLU"
    nodes: list[str]  # what it replaced, in order: module names, or the fx node names of calls
    modules: list[str]  # the qualified names of its nn.Linear modules
    widths: list[int]
    activation: str  # "relu", "gelu(tanh)", "gelu(none)", "silu" or "none"
    backend: str = "auto"


class Skipped(NamedTuple):
    """A candidate left unfused: where (module or fx node name) and why."""

    where: str
    reason: str


@dataclass
class FuseReport:
    """What `dualk.fuse` did: `fused` chains, `skipped` candidates with reasons, `notes`
    (tracing fallbacks, split chains); `traced` is False when the model itself could not be
    traced with torch.fx and its children were fused instead. `str(report)` reads as text."""

    model: str = ""
    traced: bool = True
    fused: list[FusedChain] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        how = "traced with torch.fx" if self.traced else "not traceable: children fused"
        lines = [
            f"dualk.fuse({self.model}): {how}; {len(self.fused)} chain(s) fused, "
            f"{len(self.skipped)} candidate(s) not fused"
        ]
        for c in self.fused:
            lines.append(
                f"  fused {c.name}: {c.kind} widths={c.widths} activation={c.activation} "
                f"backend={c.backend!r}"
            )
            lines.append(f"      <- {' -> '.join(c.nodes)}")
        for s in self.skipped:
            lines.append(f"  not fused: {s.where}: {s.reason}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def fuse(
    model: nn.Module,
    *,
    backend: str = "auto",
    min_layers: int = 1,
    inplace: bool = False,
    report: bool = False,
) -> nn.Module | tuple[nn.Module, FuseReport]:
    """A module computing what `model` computes, whose Linear/activation chains run as dualk
    fused modules (`dualk.nn.FusedMLP`, `dualk.nn.LinearGELU`) on `backend`.

    Returns, where every chain lies inside a submodule, a copy of the model whose submodules
    are fused in place (its class and forward kept); else the rewritten torch.fx GraphModule;
    for a model with hooks of its own, a copy of the model whose forward runs the fused graph
    (its hooks kept); for a model fx cannot trace as one graph, a copy of the model whose
    children are fused (see the module docstring). The
    result shares `model`'s parameters and buffers (the same objects: train either one, save
    either one's state_dict, same keys) but not its module objects, so `model` is left as it
    was; with `inplace=True` the result uses `model`'s own submodules (and `model` itself is
    modified and returned where a copy would be). The report (`FuseReport`) is the result's
    `dualk_fuse_report` attribute, and with `report=True` the return value is `(module,
    report)`.

    min_layers: chains of fewer nn.Linear modules are left alone (1: a single Linear + GELU
    becomes a LinearGELU; 2: only FusedMLPs).
    Inputs and outputs are those of `model` (fused chains take float32, float16, bfloat16)."""
    if not isinstance(model, nn.Module):
        raise InvalidTypeError(f"dualk.fuse: expected an nn.Module, got {type(model).__name__}")
    check_name(backend, "dualk.fuse(backend=)")
    if isinstance(min_layers, bool) or not isinstance(min_layers, int) or min_layers < 1:
        raise InvalidArgumentError(
            f"dualk.fuse: min_layers must be an int >= 1, got {min_layers!r}"
        )
    rep = FuseReport(model=type(model).__name__)
    ctx = _Context(backend, min_layers, rep)
    source = model if inplace else _copy_sharing_tensors(model)
    try:
        gm = _trace_for_fusing(source, ctx)
    except Exception as exc:  # data-dependent control flow and the like
        rep.traced = False
        rep.notes.append(
            f"torch.fx could not trace {type(model).__name__} ({_first_line(exc)}); "
            "fused its children instead"
        )
        _fuse_untraceable(source, ctx, "")
        result = source
    else:
        owners = _chain_owners(source, gm, ctx)
        if owners:
            # Every chain lies inside a submodule (timm's Mlp, a transformer block's MLP):
            # those are fused in place and the model keeps its own class, forward and Python
            # cost (a whole-model GraphModule called its ~800 submodules through nested
            # getattr: ViT-S/16 eager 6.5 against 5.5 ms per forward on an H100 host).
            for owner in owners:
                _fuse_child(source.get_submodule(owner), ctx, owner)
            rep.notes.append(
                f"fused inside {len(owners)} submodule(s) ({', '.join(owners[:3])}"
                f"{', ...' if len(owners) > 3 else ''}); the model keeps its class and forward"
            )
            result = source
        elif hooks_of(source) or "dualk_mode" in gm.meta:
            # A GraphModule would drop the hooks, or hold one mode of a forward that reads
            # self.training: the module keeps its class (its forward runs the other mode) and
            # runs the fused graph as its forward.
            _fuse_in_place(source, gm, ctx, "")
            result = source
        else:
            # The unfused graph over the same modules, before fusing: where every fused module
            # runs original for a call (module_choice measured PyTorch's ops faster), that call
            # runs it and costs no dualk layer (a FusedMLP on "original" in the graph cost 10-25
            # us more host time per call than the nn.Sequential it replaced, H200).
            unfused = _unfused_copy(gm)
            if _fuse_graph(gm, ctx, ""):
                if unfused is not None:
                    object.__setattr__(
                        gm, "forward", _FusedForward(gm, gm, original=unfused, pool=ctx.pool)
                    )
                # nn.Module's call without fx's wrapper around it (which only words errors of
                # the generated code: 0.9 us a call on a CPU-only host), and where the graph is
                # one FusedMLP with a C++ plan, that plan without nn.Module's call at all; the
                # copies that keep the model's state. The class is this GraphModule's own;
                # recompile() and fx's copies restore fx's.
                _install_graph_call(gm)
            result = gm
    # A node where one chain stopped may start a chain of its own: fused, it is not "not fused".
    fused_nodes = {node for chain in rep.fused for node in chain.nodes}
    rep.skipped = [s for s in rep.skipped if s.where not in fused_nodes]
    _report_every_linear(result, ctx)
    result.dualk_fuse_report = rep
    return (result, rep) if report else result


def _chain_owners(source: nn.Module, gm: fx.GraphModule, ctx: _Context) -> list[str] | None:
    """The submodules that hold the whole-model trace's chains, when every chain lies inside a
    submodule (not the model itself) and each such submodule, traced alone, finds the same
    chains; else None (the whole model is rewritten as one graph)."""
    probe = _Context(ctx.backend, ctx.min_layers, FuseReport())
    chains = _find_chains(gm, probe, "")
    if not chains:
        return None
    for where, why in probe.lone.items():  # Linears outside the owners: why, from this trace
        ctx.lone.setdefault(where, why)
    owners: set[str] = set()
    for chain in chains:
        paths = [str(n.target).split(".")[:-1] for n in chain.nodes if n.op == "call_module"]
        common = paths[0]
        for p in paths[1:]:
            k = 0
            while k < min(len(common), len(p)) and common[k] == p[k]:
                k += 1
            common = common[:k]
        if not common:
            return None
        owners.add(".".join(common))
    ordered = sorted(owners)
    ordered = [o for o in ordered if not any(o.startswith(f"{p}.") for p in ordered if p != o)]
    expected = {str(n.target) for c in chains for n in (c.nodes[i] for i in c.linear_at)}
    found: set[str] = set()
    for owner in ordered:
        child = source.get_submodule(owner)
        if type(child).forward is nn.Sequential.forward or hooks_of(child):
            return None
        try:
            child_gm = _trace(child)
        except Exception:
            return None
        child_probe = _Context(ctx.backend, ctx.min_layers, FuseReport())
        for c in _find_chains(child_gm, child_probe, f"{owner}."):
            found.update(f"{owner}.{c.nodes[i].target}" for i in c.linear_at)
    return ordered if found == expected else None


def _report_every_linear(result: nn.Module, ctx: _Context) -> None:
    """Every nn.Linear of the result is fused or listed in report.skipped with a reason."""
    rep = ctx.report
    fused = {name for chain in rep.fused for name in chain.modules}
    listed = {s.where for s in rep.skipped}
    already = set()  # Linears an earlier fuse (or the user) put in dualk's modules
    for m in result.modules():
        if isinstance(m, FusedMLP):
            already.update(id(lin) for lin in m.layers)
        elif isinstance(m, (LinearGELU, GatedBase)) and isinstance(
            getattr(m, "_shared", None), tuple
        ):
            already.update(id(lin) for lin in m._shared)
        elif isinstance(m, GatedMLP):
            already.update(id(lin) for lin in (m.gate_proj, m.up_proj, m.down_proj))
    seen: set[int] = set()
    for name, m in result.named_modules(remove_duplicate=False):
        if not linear_like(m) or name in fused or name in listed:
            continue
        if id(m) in seen or id(m) in already:
            continue
        seen.add(id(m))
        reason = ctx.lone.get(name)
        if reason is None:
            reason = (
                "not reached by a traced graph (inside a module whose forward torch.fx could "
                "not trace, or not called by the forward)"
            )
        rep.skipped.append(Skipped(name, reason))


# -------------------------------------------------------------------------------- tracing
class _Tracer(fx.Tracer):
    """fx's tracer, with dualk's modules as leaves (fuse() of a fused model works) and dualk's
    public ops recorded as calls when a forward calls them by a global name."""

    def __init__(self, all_leaves: bool = False, own: _OwnForward | None = None):
        funcs = (
            ops.add,
            ops.relu_scale,
            ops.matmul,
            ops.linear_gelu,
            ops.fused_mlp,
            ops.linear_glu,
            # (a fused graph traced again, as fx's unpickling does: one call, not into its
            # spread of a Proxy)
            _spread_call,
        )
        super().__init__(autowrap_functions=funcs)
        self.all_leaves = all_leaves
        # (_own_forward's: its function traced in place of the class's wrapped forward)
        self.own = own

    def trace(self, root, concrete_args=None):  # type: ignore[override]
        own = self.own
        if own is None:
            return super().trace(root, concrete_args)
        fn, varkw, cls = own.fn, own.varkw, type(root)
        concrete = dict(concrete_args or {})
        if varkw is not None and not own.spread:
            concrete["**" + varkw] = {}
        # fx traces getattr(type(root), traced_func_name): the function set on the class for the
        # trace only. (Not a subclass set as the instance's class: the forward's own type(self)
        # checks would see it, and so would other threads calling the module meanwhile.)
        setattr(cls, _OWN_FORWARD, fn)
        self.traced_func_name = _OWN_FORWARD
        try:
            graph = super().trace(root, concrete)
        finally:
            self.traced_func_name = "forward"
            delattr(cls, _OWN_FORWARD)
        if own.spread:
            _splice_spreads(graph, "**" + varkw)
        return _plain_codegen(graph)

    def create_args_for_root(self, root_fn, is_module, concrete_args=None):
        fn, args = super().create_args_for_root(root_fn, is_module, concrete_args)
        if self.own is not None and self.own.spread:
            # **kwargs as one marked keyword holding its placeholder: each call that spreads it
            # gets that keyword, which _splice_spreads turns back into a spread of the dict
            args = [*args[:-1], {_SPREAD_KEY: args[-1]}]
        return fn, args

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if self.all_leaves:
            return True
        return (
            isinstance(m, FUSED_TYPES)
            or module_activation(m) is not None
            or _is_conv1d(m)
            or super().is_leaf_module(m, qualname)
        )


# Wrappers of a forward (functools.wraps) that _own_forward looks through, by the file that
# defines them: transformers' gradient-checkpointing wrapper of every layer (it acts only where
# the layer checkpoints: _FusedForward.accepts sends those calls to the class's forward) and its
# deprecated-keyword renames (a call by an old name is a keyword the graph does not accept).
_KNOWN_WRAPPERS = ("transformers/modeling_layers.py", "transformers/utils/deprecation.py")
_OWN_FORWARD = "_dualk_own_forward"  # (the class attribute _Tracer traces, for one trace)


class _OwnForward(NamedTuple):
    """A module's forward as its own code (_own_forward)."""

    fn: object  # the function under the known wrappers
    varkw: str | None  # its **kwargs parameter's name
    renamed: frozenset  # the old names deprecated-keyword wrappers rename (never the graph's)
    spread: bool  # its **kwargs only passed on, whole, to its children's calls (_spreads_only)


def _own_forward(root: nn.Module) -> _OwnForward | None:
    """type(root).forward's function under the _KNOWN_WRAPPERS around it (itself where none),
    or None where another wrapper is there (what it does to a call is unknown), or where a
    deprecated-keyword wrapper's old name cannot be read (a call by it must reach the wrapper)."""
    fn, renamed = type(root).forward, set()
    while hasattr(fn, "__wrapped__"):
        code = getattr(fn, "__code__", None)
        where = "" if code is None else code.co_filename.replace("\\", "/")
        if not where.endswith(_KNOWN_WRAPPERS):
            return None
        if where.endswith(_KNOWN_WRAPPERS[1]):
            old = inspect.getclosurevars(fn).nonlocals.get("old_name")
            if not isinstance(old, str):
                return None
            renamed.add(old)
        fn = fn.__wrapped__
    if not inspect.isfunction(fn):
        return None
    varkw = next((p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind is inspect.Parameter.VAR_KEYWORD), None)  # fmt: skip
    # (not behind a keyword-renaming wrapper: a call by an old name must reach the wrapper,
    # which only a call outside the graph's names does)
    spread = varkw is not None and not renamed and _spreads_only(fn, varkw, root)
    return _OwnForward(fn, varkw, frozenset(renamed), spread)


_SPREAD_KEY = "_dualk_spread_kwargs"


def _spreads_only(fn, varkw: str, root: nn.Module) -> bool:
    """Whether fn's source uses its **kwargs only to pass them on, whole, to calls of root's
    child modules (`self.self_attn(h, **kwargs)`, as ALBERT's layer passes position_ids to its
    attention): a graph can then take any keywords and pass them to those calls as they come.
    A forward that reads a key (`kwargs.get(...)`), or passes them to a function it runs, would
    have the trace take the keys as absent."""
    tree = _method_tree(fn)
    if tree is None or not tree.args.args:
        return False
    me = tree.args.args[0].arg
    spread = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for kw in node.keywords:
            if kw.arg is None and isinstance(kw.value, ast.Name) and kw.value.id == varkw:
                func = node.func
                if not (
                    isinstance(func, ast.Attribute)
                    and isinstance(func.value, ast.Name)
                    and func.value.id == me
                    and func.attr in root._modules
                ):
                    return False
                spread.add(id(kw.value))
    uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == varkw]
    return bool(spread) and all(id(n) in spread for n in uses)


def _spread_call(module, extra: dict, /, *args, **kwargs):
    """module(*args, **kwargs, **extra): a child's call that the forward passed its **kwargs."""
    return module(*args, **kwargs, **extra)


def _splice_spreads(graph: fx.Graph, target: str) -> None:
    """Each call_module node holding the **kwargs placeholder under _SPREAD_KEY becomes a call of
    _spread_call with that child and the dict; raises where the placeholder went elsewhere."""
    ph = next(n for n in graph.nodes if n.op == "placeholder" and n.target == target)
    for user in list(ph.users):
        others = {k: v for k, v in user.kwargs.items() if k != _SPREAD_KEY}
        if (
            user.op != "call_module"
            or user.kwargs.get(_SPREAD_KEY) is not ph
            or ph in user.args
            or ph in others.values()
        ):
            raise _TraceCannotHold("its **kwargs reach more than its children's calls")
        with graph.inserting_before(user):
            module = graph.get_attr(user.target)
            call = graph.call_function(_spread_call, (module, ph, *user.args), others)
        user.replace_all_uses_with(call)
        graph.erase_node(user)


def _plain_codegen(graph: fx.Graph) -> fx.Graph:
    """graph with fx's plain code generation where a trace with concrete arguments made the
    pytree one (a **kwargs traced as {} flattens to nothing): the forward then takes the
    placeholders by name, as the class's did, without flattening its arguments on every call."""
    codegen = graph._codegen
    info = getattr(codegen, "pytree_info", None)
    if info is None:
        return graph
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    if info.out_spec is not None:
        flat = out.args[0]
        out.args = (torch.utils._pytree.tree_unflatten(list(flat), info.out_spec),)
    graph._codegen = fx.graph.CodeGen()
    return graph


def _trace(
    root: nn.Module, all_leaves: bool = False, mode_guard: bool = False, own: bool = False
) -> fx.GraphModule:
    """root's forward as one fx graph; raises where one graph cannot stand for it. With
    `mode_guard` (a submodule fused in place, whose class forward runs the other mode), a
    forward whose graph depends on its own `self.training` only is traced in its current mode,
    recorded as the GraphModule's meta["dualk_mode"] (_check_training_mode). With `own`, the
    forward's own function under known wrappers (_own_forward) with any **kwargs as none given:
    meta["dualk_accepts"] says which calls the graph serves (_FusedForward.accepts)."""
    own_forward = None
    if own:
        own_forward = _own_forward(root)
        if own_forward is None:
            raise _TraceCannotHold("its forward is wrapped by a function fuse does not know")
    written = _self_write(root, all_leaves)
    if written is not None:  # (checked before tracing: the trace would run the write once)
        raise _TraceCannotHold(
            f"its forward assigns to {written}, which a traced graph would not repeat"
        )
    tracer = _Tracer(all_leaves, own_forward)
    graph = tracer.trace(root)
    attributes = set(vars(root))
    mode = None
    try:
        _check_defaults(root, graph, all_leaves, own_forward)
        mode = _check_training_mode(root, graph, all_leaves, mode_guard, own_forward)
    finally:  # the check traces' tensor constants, set on the root as each trace names them
        for name in set(vars(root)) - attributes:
            if name.startswith("_tensor_constant"):
                delattr(root, name)
    gm = fx.GraphModule(tracer.root, graph, type(root).__name__)
    if mode is not None:
        gm.meta["dualk_mode"] = mode
    if all_leaves:  # (what the trace read: the root's forward alone)
        gm.meta["dualk_all_leaves"] = True
    if own_forward is not None:
        fn = own_forward.fn
        params = list(inspect.signature(fn).parameters.values())[1:]
        named = [p for p in params if p.kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]  # fmt: skip
        positional = sum(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
        checkpoints = fn is not type(root).forward and hasattr(root, "gradient_checkpointing")
        # (None: any keyword, the graph passing the others on as the forward does)
        # (a deprecated name that is still a parameter too: only its wrapper renames it)
        names = (
            None if own_forward.spread else frozenset(p.name for p in named) - own_forward.renamed
        )
        gm.meta["dualk_accepts"] = (names, positional, checkpoints)
    _keep_unreferenced_state(tracer.root, gm)
    for name in gm._buffers:  # tensors the forward makes (torch.ones(8)): not the model's state
        if name.startswith("_tensor_constant"):
            gm._non_persistent_buffers_set.add(name)
    return gm


def _is_assert_is_none(target) -> bool:
    """What a trace with an argument fixed at None calls to check it (not a computation)."""
    return getattr(target, "__name__", "") == "_assert_is_none"


def _graph_signature(graph: fx.Graph, as_value: dict | None = None) -> list[tuple]:
    """The graph's computation, comparable between two traces of one forward: every call and
    the output with their arguments; nodes by position, tensor constants by kind (each trace
    names them anew); the placeholders of the arguments in `as_value` as their values there,
    so an argument a trace took as given compares equal to a trace given it as that value (an
    optional one only passed on, None)."""
    tokens: dict[fx.Node, object] = {}
    signature: list[tuple] = []
    as_value = as_value or {}
    # (a trace given a non-None argument checks it: `_assert(eq(flag, True), "flag has been
    # specialized...")`, not a computation; fx of torch 2.13 writes it)
    checks = set()
    for n in graph.nodes:
        if n.op == "call_function" and n.target is torch._assert:
            checks.add(n)
            if isinstance(cond := n.args[0], fx.Node) and len(cond.users) == 1:
                checks.add(cond)
    for n in graph.nodes:
        if n in checks or (n.op == "call_function" and _is_assert_is_none(n.target)):
            continue
        if n.op == "placeholder":  # a trace with concrete args names them `mask_1`
            name = str(n.target)
            base = re.sub(r"_\d+$", "", name)
            if name in as_value or base in as_value:
                tokens[n] = as_value[name if name in as_value else base]
            else:
                tokens[n] = ("arg", name)
            continue
        if n.op == "get_attr":
            tokens[n] = ("attr", re.sub(r"_tensor_constant\d+", "_tensor_constant", str(n.target)))
            continue
        tokens[n] = ("node", len(signature))
        args = fx.node.map_arg((n.args, n.kwargs), tokens.__getitem__)
        target = n.target if n.op != "call_module" else str(n.target)
        signature.append((n.op, target, repr(args)))
    return signature


def _forward_parameters(root: nn.Module) -> list[inspect.Parameter]:
    """The parameters of the forward fx traces (the class's, without self)."""
    try:
        return list(inspect.signature(type(root).forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return []


def _check_defaults(
    root: nn.Module, graph: fx.Graph, all_leaves: bool, own: _OwnForward | None = None
) -> None:
    """Raises where the forward computes otherwise when its arguments take their defaults: fx
    traces each argument as given (a Proxy), so the one graph would fail or compute otherwise
    without it. Those that default to None (`if mask is not None:`), then those with another
    scalar default (an identity or type test on the Proxy, `if residual is True:`, takes one
    branch for good, which the default call need not take: a silent wrong answer), each set
    compared with a trace given those defaults, where the graph's uses of the arguments read as
    their values (a forward that fails that way needs the arguments anyway: its graph stands)."""
    named = [p for p in _forward_parameters(root) if p.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]  # fmt: skip
    nones = {p.name: None for p in named if p.default is None}
    scalars = {p.name: p.default for p in named
               if p.default is not None and type(p.default) in _SCALARS}  # fmt: skip
    for defaults, when in (
        (nones, "is None"),
        (scalars, "take their defaults (an identity or type test on an argument)"),
    ):
        if not defaults:
            continue
        try:
            given = _Tracer(all_leaves, own).trace(root, concrete_args=dict(defaults))
        except Exception:
            continue
        if _graph_signature(given, defaults) != _graph_signature(graph, defaults):
            raise _TraceCannotHold(
                f"its forward computes otherwise when {', '.join(defaults)} {when}, and one "
                "traced graph cannot hold both"
            )


def _check_training_mode(
    root: nn.Module,
    graph: fx.Graph,
    all_leaves: bool,
    mode_guard: bool = False,
    own: _OwnForward | None = None,
) -> bool | None:
    """Raises where the forward reads `self.training` (F.dropout(x, p, self.training), `if
    self.training:`): fx would freeze the mode the model had when fused. Compared with a trace
    in the other mode, or where the modules' modes are mixed (a Dropout left in train() in an
    eval() model) with a trace in each uniform mode (a forward reading two modules' flags, `a
    or b`, gave the same graph with every flag flipped, and the fused model kept the dropout in
    eval()): the flags are set directly (a train() override may do more) and every module's own
    flag is restored after.

    With `mode_guard`, a forward whose graph depends on root's own flag only (traces with every
    other module's flag flipped, and with mixed modes set to each mode, give `graph`: Starcoder2's,
    MPT's and BLOOM's MLPs end in F.dropout(..., training=self.training)) does not raise:
    returns root's mode, in which `graph` holds (its owner runs its class forward in the other).
    None where the graph holds in both modes."""
    modes = {m: m.training for m in root.modules()}
    uniform = len(set(modes.values())) == 1

    def trace_with(mode_of) -> fx.Graph:
        try:
            for m in modes:
                m.training = mode_of(m)
            return _Tracer(all_leaves, own).trace(root)
        finally:
            for m, mode in modes.items():
                m.training = mode

    # the other uniform mode; with mixed modes, each uniform mode
    others = [lambda m: not modes[m]] if uniform else [lambda m: False, lambda m: True]
    same = True
    for mode_of in others:
        try:
            other = trace_with(mode_of)
        except Exception as exc:
            other_mode = "train" if mode_of(root) else "eval"
            raise _TraceCannotHold(
                f"its forward cannot be traced in {other_mode}() mode ({_first_line(exc)}), so "
                "one traced graph cannot stand for both modes"
            ) from None
        same = same and _graph_signature(other) == _graph_signature(graph)
    if same:
        return None
    if mode_guard:
        # root's flag kept, every other module's flipped (and, with mixed modes, set to each
        # uniform mode too): the same graph each time, so root's flag alone decides
        variants = [lambda m: not modes[m]] + ([] if uniform else others)
        try:
            held = all(
                _graph_signature(trace_with(lambda m, v=v: modes[m] if m is root else v(m)))
                == _graph_signature(graph)
                for v in variants
            )
        except Exception:
            held = False
        if held:
            return root.training
    raise _TraceCannotHold(
        "its forward computes otherwise in train() and eval() (it reads self.training), "
        "and one traced graph cannot hold both"
    )


class _Missing:
    """What an attribute a method reads was when fused, where the instance had none: one object
    also after pickling (a reference to this module's _MISSING) and copying."""

    def __reduce__(self):
        return "_MISSING"


_MISSING = _Missing()
# Attributes a trace never takes as a constant of the graph: nn.Module's own fields (modules,
# parameters and buffers are read through them), training (the mode guard's), forward (fuse's)
_NOT_READ = frozenset(nn.Module().__dict__) | {"training", "forward", "dualk_fuse_report"}
_SCALARS = (int, float, complex, bool, str, bytes, type(None))


def _same_scalar(a, b) -> bool:
    """Equal immutable scalars of one type (pickle does not keep a float's identity)."""
    return type(a) is type(b) and type(a) in _SCALARS and a == b


def _traced_modules(root: nn.Module, all_leaves: bool):
    """root and the modules in it whose forwards fx traces into (none below a leaf; with
    `all_leaves` root alone): the code a trace of root runs once and takes as its graph."""
    tracer = _Tracer(all_leaves)
    stack = [root]
    while stack:
        m = stack.pop()
        yield m
        if not all_leaves:
            stack += [
                c
                for n, c in m._modules.items()
                if c is not None and not tracer.is_leaf_module(c, n)
            ]


def _read_attributes(owner: nn.Module, all_leaves: bool = False) -> tuple:
    """(module, name, value) of each plain attribute (not a module, parameter or tensor) that the
    forward of `owner`, or of a module it traces into, may read: names loaded from `self`
    anywhere in the module's methods (a helper the forward calls too), or all its plain
    attributes where its methods use `self` otherwise (passed on, aliased, `getattr(self,
    name)`) or cannot be read; a name the instance does not have yet (a class default) as
    _MISSING. fx takes such a value as a constant of the graph (`x * self.alpha`, `if
    self.use_bias:`); a later change is seen by identity, or equality for scalars
    (_FusedForward._children_changed)."""
    out = []
    for m in _traced_modules(owner, all_leaves):
        reads = _self_reads(type(m))
        state = m.__dict__
        names = reads if reads is not None else [k for k in state if k not in _NOT_READ]
        for key in names:
            if key in _NOT_READ or key in m._modules or key in m._parameters or key in m._buffers:
                continue
            value = state.get(key, _MISSING)
            if not isinstance(value, (nn.Module, torch.Tensor)):
                out.append((m, key, value))
    return tuple(out)


def _graph_tensors(owner: nn.Module, graph: fx.GraphModule) -> tuple:
    """(module, "_parameters" | "_buffers" | "__dict__", name, tensor) of each tensor that
    `graph` reads with get_attr where `owner` holds it (the same object)."""
    out = []
    for node in graph.graph.nodes:
        if node.op != "get_attr":
            continue
        path, _, name = str(node.target).rpartition(".")
        try:
            module = owner.get_submodule(path)
            tensor = getattr(graph.get_submodule(path), name)
        except AttributeError:
            continue
        if not isinstance(tensor, torch.Tensor):
            continue
        for kind in ("_parameters", "_buffers", "__dict__"):
            if getattr(module, kind).get(name, _MISSING) is tensor:
                out.append((module, kind, name, tensor))
                break
    return tuple(out)


def _self_write(root: nn.Module, all_leaves: bool) -> str | None:
    """`self.attr (Class)` where the forward of `root`, or of a module it traces into, assigns to
    an attribute of its own (`self.calls += 1`, a cache): fx runs that Python once while
    tracing and the graph never again, so the fused model would not keep it up (and the outputs
    that depend on it would be wrong). None where none does."""
    for m in _traced_modules(root, all_leaves):
        written = _forward_writes(type(m))
        if written:
            return f"self.{written} ({type(m).__name__})"
    return None


# Methods a forward never calls (their reads and writes do not reach a traced graph)
_NOT_CALLED = ("__init__", "extra_repr")


def _own_methods(cls: type) -> list | None:
    """(name, function) of every method of `cls` and of its bases outside torch, overridden ones
    too (a subclass's forward may call its base's through super()); a property by its getter.
    None where one is a callable that is no plain function (a lambda's or a wrapper's source
    cannot be read as a method)."""
    methods = []
    for klass in cls.__mro__:
        if klass is object or klass.__module__.split(".")[0] == "torch":
            continue
        for key, member in vars(klass).items():
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            elif isinstance(member, property):
                member = member.fget
            if inspect.isfunction(member):
                methods.append((key, member))
            elif callable(member) and not isinstance(member, type):
                return None
    return methods


def _method_tree(fn) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """fn's own source as a function definition (read from its code object's lines: a class's
    source is found by its name, and a file may define two classes of one name), or None."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    node = tree.body[0] if tree.body else None
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _self_uses(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[set, set, set, bool]:
    """What `fn` does with its first argument (`self`): the attribute names it loads (as
    `self.x` or `getattr(self, "x")`), those it assigns to, the methods it calls on it, and
    whether it uses `self` otherwise (passed on, aliased, subscripted)."""
    loads, stores, calls = set(), set(), set()
    if not fn.args.args:
        return loads, stores, calls, False
    me = fn.args.args[0].arg
    plain = set()  # the Name nodes of those attribute uses
    for node in ast.walk(fn):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == me:
                plain.add(id(node.value))
                (stores if isinstance(node.ctx, ast.Store) else loads).add(node.attr)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == me
            and isinstance(node.args[1], ast.Constant)
        ):
            plain.add(id(node.args[0]))
            loads.add(str(node.args[1].value))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == me
        ):
            calls.add(node.func.attr)
    other = any(
        isinstance(node, ast.Name) and node.id == me and id(node) not in plain
        for node in ast.walk(fn)
    )
    return loads, stores, calls, other


@functools.lru_cache(maxsize=512)
def _forward_writes(cls: type) -> str | None:
    """The first attribute of `self` that a forward of `cls` (its bases' too), or a method of
    the class it calls as `self.<method>(...)`, assigns to (outside torch's own classes); None
    where none does or the source cannot be read."""
    methods = _own_methods(cls) or []
    trees = [t for k, fn in methods if k == "forward" and (t := _method_tree(fn)) is not None]
    stores, calls = set(), set()
    for tree in trees:
        _, written, called, _ = _self_uses(tree)
        stores |= written
        calls |= called
    for key, fn in methods:
        if key in calls and key not in _NOT_CALLED and (tree := _method_tree(fn)) is not None:
            stores |= _self_uses(tree)[1]
    return min(stores) if stores else None


@functools.lru_cache(maxsize=512)
def _self_reads(cls: type) -> frozenset | None:
    """The attribute names a method of `cls` (or of a base class outside torch) loads from its
    first argument (`self.alpha`, `getattr(self, "alpha")`); None where a method's source cannot
    be read or uses `self` otherwise (then every attribute counts)."""
    methods = _own_methods(cls)
    if methods is None:
        return None
    names: set[str] = set()
    for key, member in methods:
        if key in _NOT_CALLED:
            continue
        fn = _method_tree(member)
        if fn is None:
            return None
        loads, _, _, other = _self_uses(fn)
        if other:
            return None
        names |= loads
    return frozenset(names)


class _TraceCannotHold(Exception):
    """One fx graph cannot stand for the forward (the caller fuses the children instead)."""


def _keep_unreferenced_state(root: nn.Module, gm: fx.GraphModule) -> None:
    """A GraphModule copies only what its graph refers to: state that nothing in the graph
    refers to (the Linears of an earlier fuse, which its fused modules hold in a tuple; a module
    or parameter the forward never uses; a shared module's second name) would leave
    state_dict. Registered again at its own path: a missing module as it is, a missing parameter
    or buffer on the stand-in module fx made for a path (which holds only what the graph uses)."""
    for name, module in root.named_modules(remove_duplicate=False):
        if not name:
            continue
        try:
            present = gm.get_submodule(name)
        except AttributeError:
            if _has_state(module):
                gm.add_submodule(name, module)
            continue
        if present is module:
            continue
        for key, param in module.named_parameters(recurse=False):
            if key not in present._parameters:
                present.register_parameter(key, param)
        for key, buf in module.named_buffers(recurse=False):
            if key not in present._buffers:
                persistent = key not in module._non_persistent_buffers_set
                present.register_buffer(key, buf, persistent=persistent)


def _has_state(module: nn.Module) -> bool:
    return any(True for _ in module.parameters()) or any(True for _ in module.buffers())


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160] if text else ''}"


@dataclass
class _Context:
    backend: str
    min_layers: int
    report: FuseReport
    lone: dict[str, str] = field(default_factory=dict)  # a Linear left alone: why
    pool: _CheckPool = field(default_factory=lambda: _CheckPool())  # the owners' shared checks

    def skip(self, where: str, reason: str) -> None:
        entry = Skipped(where, reason)
        if entry not in self.report.skipped:  # a chain walked again from a later start
            self.report.skipped.append(entry)


# ------------------------------------------------------------------------ finding chains
@dataclass
class _Chain:
    nodes: list[fx.Node]  # Linear, act, Linear, ..., Linear (+ GELU for a LinearGELU)
    linear_at: list[int]  # index in `nodes` of each Linear
    linears: list[nn.Linear]
    activation: Activation | None = None  # between the Linears, or the LinearGELU's GELU
    trailing_gelu: bool = False
    stop: str = ""  # a lone Linear: what its output goes to (the report's reason)
    # per gap between two Linears: the nn.Dropout / nn.Identity modules after the activation
    between: list[tuple[nn.Module, ...]] = field(default_factory=list)
    glu: bool = False  # a gated part: nodes (gate, act, up, mul), linears (gate, up)
    # a gated part of one Linear whose output is split in halves (timm's GluMlp): linears
    # (that Linear,), and which half the gate is (0: [gate | up], 1: [up | gate])
    gate_half: int = 0


def _linear_module(gm: fx.GraphModule, node: fx.Node) -> nn.Linear | None:
    if node.op == "call_module":
        m = gm.get_submodule(node.target)
        if isinstance(m, nn.Linear):
            return m
    return None


def _call_problem(node: fx.Node, src: fx.Node | None) -> str | None:
    if len(node.args) != 1 or node.kwargs or (src is not None and node.args[0] is not src):
        return "called with arguments other than one input"
    return None


def _activation_of(gm: fx.GraphModule, node: fx.Node, src: fx.Node) -> Activation | None:
    """(activation, approximate) when `node` applies a fusable activation to `src` alone."""
    if node.op == "call_module":
        m = gm.get_submodule(node.target)
        act = module_activation(m)
        if act is None or hooks_of(m) or _call_problem(node, src):
            return None
        return act
    if node.op == "call_function" and node.target in _FUNCTION_ACTIVATIONS:
        kind = _FUNCTION_ACTIVATIONS[node.target]
        args, kwargs = list(node.args), dict(node.kwargs)
        kwargs.pop("inplace", None)  # in place or not: src has no other user
        approximate = "tanh"
        if kind == "gelu":
            approximate = kwargs.pop("approximate", args[1] if len(args) == 2 else "none")
            args = args[:1]
        if len(args) != 1 or args[0] is not src or kwargs or approximate not in ("tanh", "none"):
            return None
        return (kind, approximate)
    if node.op == "call_method" and node.target == "relu" and node.args == (src,):
        return ("relu", "tanh") if not node.kwargs else None
    return None


def _label(node: fx.Node, prefix: str) -> str:
    return prefix + str(node.target) if node.op == "call_module" else prefix + node.name


def _describe(act: Activation) -> str:
    return f"gelu({act[1]})" if act[0] == "gelu" else act[0]


def _walk(gm, start: fx.Node, lin0: nn.Linear, consumed, ctx: _Context, prefix) -> _Chain:
    """The longest chain starting at the Linear `start` (greedy, forward through single users)."""
    chain = _Chain([start], [0], [lin0])
    key0 = _dtype_device(lin0)
    branch = "its output has {} users (a branch or a reused value): no chain runs past it"
    cur = start
    while True:
        users = list(cur.users)
        if len(users) != 1:
            if len(users) > 1:
                ctx.skip(_label(cur, prefix), branch.format(len(users)))
            return chain
        nxt = users[0]
        act = _activation_of(gm, nxt, cur)
        tail = cur if act is None else nxt  # the last node before Dropout / Identity modules
        if act is None:
            after, between = nxt, _NONE  # Linear -> Linear with nothing between
        else:
            after_users = list(nxt.users)
            after = after_users[0] if len(after_users) == 1 else None
            between = act
            if len(after_users) > 1:
                ctx.skip(_label(nxt, prefix), branch.format(len(after_users)))
        passes: list[fx.Node] = []
        while after is not None and _passthrough(gm, after, tail) is not None:
            passes.append(after)
            pass_users = list(after.users)
            if len(pass_users) > 1:
                ctx.skip(_label(after, prefix), branch.format(len(pass_users)))
            tail, after = after, (pass_users[0] if len(pass_users) == 1 else None)
        lin = None if after is None or after in consumed else _linear_module(gm, after)
        if lin is not None and (_call_problem(after, tail) or _linear_reject(lin)):
            lin = None  # reported when that Linear is visited as the start of a chain
        if lin is not None:
            problem = None
            if _dtype_device(lin) != key0:
                problem = (
                    f"{_dtype_device(lin)} differs from the chain's {key0} (the Linears must "
                    "share one dtype and device)"
                )
            elif chain.activation not in (None, between):
                problem = (
                    f"activation {_describe(between)} differs from "
                    f"{_describe(chain.activation)} earlier in the chain"
                )
            if problem is not None:
                where = _label(after if act is None else nxt, prefix)
                ctx.skip(where, f"the chain from {_label(start, prefix)} stops: {problem}")
                chain.stop = f"its chain stops at {where} (see there)"
                lin = None
        if lin is None:
            if act is not None and act[0] == "gelu" and len(chain.linears) == 1:
                chain.nodes.append(nxt)
                chain.activation, chain.trailing_gelu = act, True
            elif len(chain.linears) == 1 and not chain.stop:
                chain.stop = _what_follows(gm, nxt, act, after)
            return chain
        if act is not None:
            chain.nodes.append(nxt)
        chain.nodes.extend(passes)
        chain.between.append(tuple(gm.get_submodule(p.target) for p in passes))
        chain.linear_at.append(len(chain.nodes))
        chain.nodes.append(after)
        chain.linears.append(lin)
        chain.activation = between
        cur = after


def _passthrough(gm: fx.GraphModule, node: fx.Node, src: fx.Node) -> nn.Module | None:
    """The module when `node` calls an nn.Identity or an nn.Dropout (its own forward, no hooks)
    on `src` alone: a chain runs through it (the fused module runs PyTorch's ops whenever such a
    Dropout drops, in training with p > 0)."""
    if node.op != "call_module":
        return None
    m = gm.get_submodule(node.target)
    if type(m) not in (nn.Identity, nn.Dropout) or hooks_of(m) or _call_problem(node, src):
        return None
    return m


def _what_follows(gm, nxt: fx.Node, act: Activation | None, after: fx.Node | None) -> str:
    """Why a Linear stands alone: what its output goes to."""
    if act is not None:
        then = "nothing" if after is None else _node_text(gm, after)
        return (
            f"followed by {_describe(act)} and then {then}, not another nn.Linear (a single "
            "Linear is fused only with a GELU after it)"
        )
    return f"its output goes to {_node_text(gm, nxt)}, not an activation or an nn.Linear"


def _node_text(gm: fx.GraphModule, node: fx.Node) -> str:
    if node.op == "call_module":
        return f"{node.target} ({type(gm.get_submodule(node.target)).__name__})"
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    if node.op == "call_method":
        return f".{node.target}()"
    return "the output" if node.op == "output" else node.name


def _dtype_device(lin: nn.Linear) -> str:
    return f"{lin.weight.dtype} on {lin.weight.device}"


def _linear_reject(lin: nn.Linear) -> str | None:
    problem = linear_problem(lin)
    w, b = lin.weight, lin.bias
    if problem is None and b is not None and (b.dtype, b.device) != (w.dtype, w.device):
        problem = "its weight and bias differ in dtype or device"
    return problem


def linear_like(m: nn.Module) -> bool:
    """Whether `m` is a module fuse can run as a GEMM: an nn.Linear or transformers' Conv1D
    (the report names each one that is not fused, with the reason)."""
    return isinstance(m, nn.Linear) or _is_conv1d(m)


def _is_conv1d(m: nn.Module) -> bool:
    """transformers' Conv1D (GPT-2's c_fc, c_proj, c_attn): `x @ weight + bias` with weight
    (in, out), nn.Linear with its weight transposed. The class itself (a subclass may compute
    otherwise), recognised by name so that transformers need not be imported."""
    cls = type(m)
    return cls.__qualname__ == "Conv1D" and cls.__module__ in _CONV1D_MODULES


_CONV1D_MODULES = ("transformers.pytorch_utils", "transformers.modeling_utils")


def _conv1d_reject(conv: nn.Module) -> str | None:
    """Why a Conv1D cannot run as a LinearGELU's GEMM (None when it can)."""
    w, b = getattr(conv, "weight", None), getattr(conv, "bias", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not isinstance(b, torch.Tensor):
        return "a Conv1D without a 2-dim weight and a bias"
    if hooks_of(conv):
        return f"it has {hooks_of(conv)} (a fused kernel would skip them)"
    if w.dtype not in FLOAT_DTYPES:
        return f"its weight is {w.dtype}; dualk's kernels take float32, float16 and bfloat16"
    if (b.dtype, b.device) != (w.dtype, w.device) or b.shape != w.shape[1:]:
        return "its weight and bias differ in dtype, device or width"
    return None


def _in_out(lin: nn.Module) -> tuple[int, int]:
    """(in, out) widths of an nn.Linear or a Conv1D."""
    if _is_conv1d(lin):
        return tuple(lin.weight.shape)
    return lin.in_features, lin.out_features


_MULS = (operator.mul, torch.mul)


def _single_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _other_factor(mul: fx.Node | None, act_node: fx.Node) -> fx.Node | None:
    """The other factor when `mul` is a product of `act_node` and one other node (operator.mul,
    torch.mul or Tensor.mul, either order), else None."""
    if mul is None or mul.kwargs or len(mul.args) != 2 or act_node not in mul.args:
        return None
    if not (
        (mul.op == "call_function" and mul.target in _MULS)
        or (mul.op == "call_method" and mul.target == "mul")
    ):
        return None
    other = mul.args[1] if mul.args[0] is act_node else mul.args[0]
    return other if isinstance(other, fx.Node) and other is not act_node else None


def _goes_into_linear(gm: fx.GraphModule, mul: fx.Node) -> bool:
    """Whether the product goes into an nn.Linear (the down projection), through nn.Dropout /
    nn.Identity modules (timm's SwiGLU and GluMlp: drop1, then norm, an nn.Identity unless a
    norm layer is asked for), which stay in the graph."""
    tail, down_node = mul, _single_user(mul)
    while down_node is not None and _passthrough(gm, down_node, tail) is not None:
        tail, down_node = down_node, _single_user(down_node)
    down = None if down_node is None else _linear_module(gm, down_node)
    return down is not None and _call_problem(down_node, tail) is None


def _glu_at(gm: fx.GraphModule, gate_node: fx.Node, gate: nn.Linear) -> _Chain | None:
    """The gated part `act(gate(x)) * up(x)` (followed by a Linear) starting at the Linear call
    `gate_node`, or None: the activation applies to the gate's output alone, `up` is an
    nn.Linear of the gate's shape, bias presence, dtype and device called on the same input,
    each value has one user, and the product goes into an nn.Linear (the down projection;
    nn.Dropout / nn.Identity modules between them stay, as in timm's SwiGLU)."""
    act_node = _single_user(gate_node)
    if act_node is None or _call_problem(gate_node, None):
        return None
    act = _activation_of(gm, act_node, gate_node)
    mul = _single_user(act_node) if act is not None else None
    up_node = _other_factor(mul, act_node)
    if up_node is None:
        return None
    up = _linear_module(gm, up_node)
    if (
        up is None
        or up is gate
        or _call_problem(up_node, None)
        or up_node.args[0] is not gate_node.args[0]
        or _single_user(up_node) is not mul
        or _linear_reject(up)
        or up.weight.shape != gate.weight.shape
        or (up.bias is None) != (gate.bias is None)
        or _dtype_device(up) != _dtype_device(gate)
        or not _goes_into_linear(gm, mul)
    ):
        return None
    return _Chain([gate_node, act_node, up_node, mul], [0, 2], [gate, up], act, glu=True)


def _halves(node: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node] | None:
    """(split, first half, second half) when `node`'s one user splits it in two along the last
    dim (`node.chunk(2, dim=-1)` or `torch.chunk(node, 2, -1)`) and both halves are taken
    (`[0]`, `[1]`, as `a, b = ...` does), each used once."""
    split = _single_user(node)
    if split is None or not (
        (split.op == "call_method" and split.target == "chunk")
        or (split.op == "call_function" and split.target is torch.chunk)
    ):
        return None
    bound = dict(zip(("input", "chunks", "dim"), split.args))
    for key, value in split.kwargs.items():
        if key in bound or key not in ("chunks", "dim"):
            return None
        bound[key] = value
    if bound.get("input") is not node or bound.get("chunks") != 2 or bound.get("dim") != -1:
        return None
    taken: dict[int, fx.Node] = {}
    for user in split.users:
        if not (
            user.op == "call_function"
            and user.target is operator.getitem
            and len(user.args) == 2
            and user.args[0] is split
            and user.args[1] in (0, 1)
            and user.args[1] not in taken
            and _single_user(user) is not None
        ):
            return None
        taken[user.args[1]] = user
    if len(taken) != 2:
        return None
    return split, taken[0], taken[1]


def _halves_glu_at(gm: fx.GraphModule, node: fx.Node, lin: nn.Linear) -> _Chain | str | None:
    """The gated part of timm's GluMlp starting at the Linear call `node`: its output split in
    halves, an activation on one half alone (the gate), the product of that and the other half
    going into an nn.Linear (through nn.Dropout / nn.Identity modules). A _Chain, or a sentence
    saying why such a product cannot be fused (its activation), or None (another pattern)."""
    halves = _halves(node)
    if halves is None or _call_problem(node, None) or lin.out_features % 2:
        return None
    split, first, second = halves
    for gate_half, (gate, up) in enumerate(((first, second), (second, first))):
        act_node = _single_user(gate)
        act = _activation_of(gm, act_node, gate)
        mul = _single_user(act_node)
        if _other_factor(mul, act_node) is not up or _single_user(up) is not mul:
            continue
        if not _goes_into_linear(gm, mul):
            return None
        if act is None:
            return (
                f"its output halves make a gated product whose gate goes through "
                f"{_node_text(gm, act_node)}, which dualk.linear_glu cannot take (its "
                "activations: silu, gelu, relu, as modules without hooks or functions)"
            )
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        nodes = sorted((node, split, first, second, act_node, mul), key=order.__getitem__)
        return _Chain(nodes, [0], [lin], act, glu=True, gate_half=gate_half)
    return None


def _find_glus(
    gm: fx.GraphModule, consumed: set[fx.Node], reasons: dict[fx.Node, str]
) -> list[_Chain]:
    """The gated parts: two Linears (LLaMA's MLP, timm's SwiGLU) or one split in halves (timm's
    GluMlp). reasons: a Linear whose gated product cannot be fused, with why."""
    chains = []
    for node in gm.graph.nodes:
        lin = _linear_module(gm, node)
        if lin is None or node in consumed or _linear_reject(lin):
            continue
        chain = _glu_at(gm, node, lin) or _halves_glu_at(gm, node, lin)
        if isinstance(chain, str):
            reasons[node] = chain
        elif chain is not None and not consumed.intersection(chain.nodes):
            consumed.update(chain.nodes)
            chains.append(chain)
    return chains


def _find_chains(gm: fx.GraphModule, ctx: _Context, prefix: str) -> list[_Chain]:
    consumed: set[fx.Node] = set()
    glu_reasons: dict[fx.Node, str] = {}
    # gated MLPs first: their Linears are no chain's start
    chains = _find_glus(gm, consumed, glu_reasons)
    for node in gm.graph.nodes:
        if node in consumed:
            continue
        lin = _linear_module(gm, node)
        if lin is None:
            continue
        problem = _call_problem(node, None) or _linear_reject(lin)
        if problem is not None:
            ctx.skip(_label(node, prefix), problem)
            continue
        chain = _walk(gm, node, lin, consumed, ctx, prefix)
        n = len(chain.linears)
        if n == 1 and not chain.trailing_gelu:  # a lone Linear: nothing to fuse
            why = glu_reasons.get(node) or chain.stop or "nothing to fuse it with"
            ctx.lone.setdefault(_label(node, prefix), why)
            continue
        if n < ctx.min_layers:
            ctx.skip(_label(node, prefix), _too_short(n, ctx))
            continue
        consumed.update(chain.nodes)
        chains.append(chain)
    chains += _conv1d_gelus(gm, consumed, ctx, prefix)
    return chains


def _too_short(n: int, ctx: _Context) -> str:
    return f"a chain of {n} Linear(s), fewer than min_layers={ctx.min_layers}"


def _conv1d_gelus(gm: fx.GraphModule, consumed: set, ctx: _Context, prefix: str) -> list[_Chain]:
    """GPT-2's `act(c_fc(x))`: a transformers Conv1D whose only user is a GELU, as a LinearGELU
    over the Conv1D's transposed weight (a view: the GEMM kernels read either layout). Conv1D
    runs in no FusedMLP (whose kernels and planned call take nn.Linear's layout)."""
    chains = []
    for node in gm.graph.nodes:
        if node in consumed or node.op != "call_module":
            continue
        conv = gm.get_submodule(node.target)
        if not _is_conv1d(conv):
            continue
        problem = _call_problem(node, None) or _conv1d_reject(conv)
        if problem is not None:
            ctx.skip(_label(node, prefix), problem)
            continue
        if ctx.min_layers > 1:
            ctx.skip(_label(node, prefix), _too_short(1, ctx))
            continue
        user = _single_user(node)
        act = _activation_of(gm, user, node) if user is not None else None
        if act is None or act[0] != "gelu" or user in consumed:
            ctx.lone.setdefault(
                _label(node, prefix),
                "a transformers Conv1D is fused only with a GELU right after it (LinearGELU)",
            )
            continue
        chain = _Chain([node, user], [0], [conv], act, trailing_gelu=True)
        consumed.update(chain.nodes)
        chains.append(chain)
    return chains


# ------------------------------------------------------------------------------ rewriting
def _fuse_graph(gm: fx.GraphModule, ctx: _Context, prefix: str) -> bool:
    """Replace every chain in `gm` by a fused module; True when something was fused."""
    chains = _find_chains(gm, ctx, prefix)
    for chain in chains:
        for piece in _split(chain, ctx, prefix):
            _replace(gm, piece, ctx, prefix)
    if chains:
        gm.graph.lint()
        gm.recompile()
    return bool(chains)


def _split(chain: _Chain, ctx: _Context, prefix: str) -> list[_Chain]:
    """Chains longer than one kernel holds, as balanced pieces; the activation node between two
    pieces stays in the graph on its own."""
    n = len(chain.linears)
    if n <= MAX_FUSED_LAYERS:
        return [chain]
    parts = math.ceil(n / MAX_FUSED_LAYERS)
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    pieces = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        first, last = chain.linear_at[lo], chain.linear_at[hi - 1]
        at = [i - first for i in chain.linear_at[lo:hi]]
        piece = _Chain(chain.nodes[first : last + 1], at, chain.linears[lo:hi], chain.activation)
        piece.between = chain.between[lo : hi - 1]
        pieces.append(piece)
    ctx.report.notes.append(
        f"the chain from {_label(chain.nodes[0], prefix)} has {n} Linears, more than one fused "
        f"kernel holds ({MAX_FUSED_LAYERS}): {parts} FusedMLPs, the activation between them "
        "runs on its own"
    )
    return pieces


def _unique_name(gm: nn.Module, base: str) -> str:
    k = 0
    while hasattr(gm, f"{base}_{k}"):
        k += 1
    return f"{base}_{k}"


def _replace(gm: fx.GraphModule, chain: _Chain, ctx: _Context, prefix: str) -> None:
    first, last = chain.nodes[0], chain.nodes[-1]
    act = chain.activation or _NONE
    if chain.glu:
        kind, name = "LinearGLU", _unique_name(gm, "dualk_linear_glu")
        if len(chain.linears) == 1:
            module: nn.Module = _SharedHalvesGLU(
                chain.linears[0], chain.gate_half == 0, act, ctx.backend
            )
        else:
            module = _SharedLinearGLU(*chain.linears, act, ctx.backend)
    elif len(chain.linears) == 1:
        kind, name = "LinearGELU", _unique_name(gm, "dualk_linear_gelu")
        shared = _SharedConv1DGELU if _is_conv1d(chain.linears[0]) else _SharedLinearGELU
        module = shared(chain.linears[0], act[1], ctx.backend)
    else:
        kind, name = "FusedMLP", _unique_name(gm, "dualk_fused_mlp")
        module = _SharedFusedMLP(chain.linears, act[0], act[1], ctx.backend, chain.between)
    linears = [chain.nodes[i] for i in chain.linear_at]
    module.shared_names = [str(n.target) for n in linears]
    gm.add_submodule(name, module)
    with gm.graph.inserting_after(last):
        new = gm.graph.call_module(name, args=(first.args[0],))
    last.replace_all_uses_with(new)
    for node in reversed(chain.nodes):
        gm.graph.erase_node(node)
    widths = [_in_out(chain.linears[0])[0], *(_in_out(lin)[1] for lin in chain.linears)]
    if chain.glu:
        n = chain.linears[0].out_features // (2 if len(chain.linears) == 1 else 1)
        widths = [chain.linears[0].in_features, n]
    ctx.report.fused.append(
        FusedChain(
            prefix + name,
            kind,
            [_label(n, prefix) for n in chain.nodes],
            [prefix + str(n.target) for n in linears],
            widths,
            _describe(act),
            ctx.backend,
        )
    )


class _SharedFusedMLP(FusedMLP):
    """A FusedMLP over Linears that stay registered where the model has them: it holds them in
    a plain tuple, so the fused model's state_dict() keeps exactly the original keys."""

    def __init__(self, linears, activation, approximate, backend, between=()):
        nn.Module.__init__(self)
        self._set_options(activation, approximate, backend, "dualk.fuse")
        object.__setattr__(self, "_shared", tuple(linears))
        # The chain's nn.Dropout / nn.Identity modules, per gap (not registered here either)
        between = tuple(tuple(gap) for gap in between)
        object.__setattr__(self, "_between", between if any(between) else ())
        object.__setattr__(
            self, "_dropouts", tuple(m for gap in between for m in gap if type(m) is nn.Dropout)
        )
        self.shared_names = [""] * len(linears)  # set by _replace: the Linears' module names

    @property
    def layers(self):  # type: ignore[override]
        return self._shared

    def _between_modules(self) -> tuple:
        return self._between

    def _between_active(self) -> bool:
        # A Dropout that drops now (training, p > 0): the fused kernels have no dropout.
        if not self._between:  # nothing between the layers (the common chain): 0.54 -> 0.08 us
            return False
        if _is_compiling():  # through _between, as _original_forward: one path per module
            return any(
                type(m) is nn.Dropout and m.training and m.p > 0
                for gap in self._between
                for m in gap
            )
        return any(d.training and d.p > 0 for d in self._dropouts)

    def _between_guards(self) -> list:
        return [
            (d.__dict__, key, d.__dict__.get(key))
            for d in self._dropouts
            for key in ("training", "p")
        ]

    def _get_name(self) -> str:
        return "FusedMLP"

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, layers={', '.join(self.shared_names)} (shared)"


class _SharedLinearGELU(LinearGELU):
    """A LinearGELU over a Linear that stays registered where the model has it (no second
    registration of its parameters, so state_dict() keeps the original keys)."""

    def __init__(self, linear: nn.Module, approximate: str, backend: str):
        nn.Module.__init__(self)
        kernel_activation("gelu", approximate)
        self.in_features, self.out_features = _in_out(linear)
        self.approximate, self.backend = approximate, check_name(backend, "dualk.fuse(backend=)")
        object.__setattr__(self, "_shared", (linear,))
        self.shared_names = [""]

    @property
    def weight(self):  # type: ignore[override]
        return self._shared[0].weight

    @property
    def bias(self):  # type: ignore[override]
        return self._shared[0].bias

    def _get_name(self) -> str:
        return "LinearGELU"

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, linear={self.shared_names[0]} (shared)"


class _SharedConv1DGELU(_SharedLinearGELU):
    """A LinearGELU over a transformers Conv1D that stays registered where the model has it:
    its weight is the Conv1D's (in, out) weight transposed, a view made on each call (no copy:
    the GEMM kernels read either layout; ~0.5 us of host time on a CPU-only host). A view kept
    across calls saved 0.2-0.35 us once checked against `.data` swaps, `.to()`, autograd, fx
    proxies and jit traces (review, session 33), and held the old weight alive after a move."""

    @property
    def weight(self):  # type: ignore[override]
        return self._shared[0].weight.t()

    def extra_repr(self) -> str:
        return f"{super().extra_repr()[: -len(' (shared)')]} (a Conv1D's, shared)"


class _SharedLinearGLU(GatedBase):
    """The gated part `act(gate(x)) * up(x)` of a model's gated MLP over its own gate and up
    Linears, which stay registered where the model has them (held in a tuple, as
    _SharedLinearGELU: state_dict() keeps the original keys)."""

    def __init__(self, gate: nn.Linear, up: nn.Linear, act: Activation, backend: str):
        nn.Module.__init__(self)
        self.activation, self.approximate = act
        self.backend = check_name(backend, "dualk.fuse(backend=)")
        object.__setattr__(self, "_shared", (gate, up))
        self.shared_names = ["", ""]

    def _gate_up(self) -> tuple[nn.Linear, nn.Linear]:
        return self._shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._glu(x)

    def _get_name(self) -> str:
        return "LinearGLU"

    def extra_repr(self) -> str:
        act = _describe((self.activation, self.approximate))
        return (
            f"activation={act}, backend={self.backend!r}, gate={self.shared_names[0]}, "
            f"up={self.shared_names[1]} (shared)"
        )


class _SharedHalvesGLU(GatedBase):
    """The gated part of timm's GluMlp, `act(gate) * up` with `gate, up` the halves of one
    Linear's output ([gate | up], or [up | gate] for GluMlp's gate_last=True), over that Linear,
    which stays registered where the model has it (held in a tuple, as _SharedLinearGLU)."""

    def __init__(self, linear: nn.Linear, gate_first: bool, act: Activation, backend: str):
        nn.Module.__init__(self)
        self.activation, self.approximate = act
        self.backend = check_name(backend, "dualk.fuse(backend=)")
        self.gate_first = gate_first
        object.__setattr__(self, "_shared", (linear,))
        self.shared_names = [""]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._halves_glu(x, self._shared[0], self.gate_first)

    def _get_name(self) -> str:
        return "LinearGLU"

    def extra_repr(self) -> str:
        act = _describe((self.activation, self.approximate))
        halves = "[gate | up]" if self.gate_first else "[up | gate]"
        return (
            f"activation={act}, backend={self.backend!r}, linear={self.shared_names[0]} "
            f"{halves} (shared)"
        )


# Modules fuse() keeps as leaves and counts as fused.
FUSED_TYPES = (FusedMLP, LinearGELU, GatedBase, GatedMLP)


# ------------------------------------------------------------------------ untraceable models
class _FusedForward:
    """The forward of a module whose body runs as a fused GraphModule (chains inside
    submodules, untraceable models: the module object, its attributes, hooks and state_dict
    stay as they are). If the module's children change afterwards (append, replace), the
    class's own forward runs instead, and so it does for a call like one where every fused
    module in the graph ran the original PyTorch ops (dualk.module_choice measured them
    faster): the model's own code then costs no dualk layer at all. A plain object, not a
    function, so deepcopy and pickle follow it."""

    MAX_SIGNATURES = 64
    # Like inference calls served by the original path (last_original's branch): at
    # RESTORE_AFTER the owner gets its original forward back (_restore).
    original_streak = 0
    # The signature of the last positional-only call served by the class's forward (one in
    # original_calls), or None. A like call, the common one, is told by comparing its fields to
    # it, without building a signature: on a CPU-only host, a BertIntermediate whose LinearGELU
    # runs original costs 1.3 us of Python over its own forward (4.1 us building one; in a
    # timing loop 6.5 vs 16-20 us, the Python between calls evicting the kernels' code). A
    # class attribute, so an instance pickled without it loads.
    last_original: tuple | None = None
    # The signature of the last positional-only call that ran the fused graph with some fused
    # module on dualk's path, and module_choice.changes() after it, or None: a like call runs
    # the graph without the bookkeeping below (a new decision sends it through once more).
    last_graph: tuple | None = None
    # What an all-original call runs instead of the owner's class forward: the unfused
    # GraphModule where the owner is itself the fused one (fuse's whole-model result), else None.
    original: fx.GraphModule | None = None
    # The graph's one module where its code is `return self.<module>(x)` (a whole chain fused:
    # the seed's MLP), which a like call on dualk's path calls directly, else None.
    single: nn.Module | None = None
    single_mlp = False
    # The unfused graph that a compile traces where the graph's fused modules run original: the
    # GraphModule of the owner's forward as traced before fusing, over the owner's own children
    # (`original` for fuse's whole-model result; for a submodule fused in place a copy of its
    # trace, which the eager calls never run: they run the class's forward), or None.
    traced: fx.GraphModule | None = None
    # What runs the original path where `original` is set: the unfused GraphModule's forward,
    # or where that graph is a plain chain of its modules (a fused nn.Sequential: the seed's
    # MLP, torchvision's, a training MLP) those modules called in turn, as nn.Sequential does:
    # the generated code looks each one up through nn.Module.__getattr__ (CPU-only host, 256x4
    # MLP at 4 rows with gradients: 74.4 vs nn.Sequential's 70.4 us). Not pickled or copied:
    # made again on the first call.
    original_run = None
    # The graph's only fused module where it is a FusedMLP or LinearGELU called on the graph's
    # input (single's, or one with unfused modules around it: torchvision's MLP ends in a
    # Dropout; timm's Mlp, BERT's intermediate), where `traced` exists: under compile, where its
    # compiled choice is original, Dynamo traces `traced`. None otherwise.
    input_mlp: nn.Module | None = None
    traces_original = False  # (input_mlp is not None: a bool, Dynamo reads no module)
    # graph_run's: the single FusedMLP's fast path it was made for, and the guarded plan's run
    # (neither pickled nor copied: made again on the first call)
    graph_fast = None
    graph_plan_run = None
    # The in-model check of an inference signature that runs the graph with some fused module on
    # dualk's path (_Audit; None when none is under way), and its verdicts: signature ->
    # (path, fused ms, original ms) per call. A class attribute, so an instance pickled without
    # them loads; __init__ gives each object its own dict.
    audit: _Audit | None = None
    audits: dict = {}
    # The checks and verdicts this object shares with the other owners one dualk.fuse call made
    # (_CheckPool), or None (pickled before the field: checked alone); the check under way that
    # this owner's own waits for (one at a time in the process), or None
    pool: _CheckPool | None = None
    waiting_for: _Audit | None = None
    # (module, name, value) of the plain attributes that the owner's forward, and the forwards
    # it traces into, may read (_read_attributes), as they were when fused
    attributes: tuple = ()
    tensors: tuple = ()
    # The training mode the graph was traced in where the owner's forward reads self.training
    # (_check_training_mode: Starcoder2's MLP); in the other mode the class's forward runs. None
    # where the graph holds in both.
    mode: bool | None = None
    # Where the graph is a trace of the owner's own function under its wrappers with **kwargs
    # as none given (an untraceable transformers layer: _trace's `own`): (the keyword names it
    # takes, how many positional arguments, whether the owner may checkpoint); a call outside
    # them, or while transformers' wrapper would checkpoint, runs the class's forward. Else None.
    accepts: tuple | None = None

    def __init__(
        self,
        owner: nn.Module,
        graph: fx.GraphModule,
        original: fx.GraphModule | None = None,
        traced: fx.GraphModule | None = None,
        pool: _CheckPool | None = None,
    ):
        self.owner, self.graph, self.original, self.pool = owner, graph, original, pool
        self.mode = graph.meta.get("dualk_mode") if original is None else None
        self.accepts = graph.meta.get("dualk_accepts") if original is None else None
        self.traced = original if original is not None else traced
        if original is not None:
            self._original_forward()
        # fuse's whole-model GraphModule result; a bool, so that a trace reads one of the two
        self.graph_is_owner = graph is owner
        self.children = tuple(owner._modules.values())
        # (a submodule fused in place: its class forward is the original path; fuse's
        # whole-model GraphModule has only the graph's modules)
        self.attributes = (
            _read_attributes(owner, graph.meta.get("dualk_all_leaves", False))
            if original is None
            else ()
        )
        # (module, kind, name, tensor) of each tensor the graph reads (get_attr) from the owner's
        # modules: the graph holds its own reference, so a replaced one (a buffer after .to(),
        # a reassigned parameter or tensor attribute) runs the class's forward
        self.tensors = _graph_tensors(owner, graph) if original is None else ()
        self.fused = tuple(m for m in graph.modules() if isinstance(m, FUSED_TYPES))
        self.single = _single_module(graph)
        self.single_mlp = isinstance(self.single, FusedMLP)  # (a bool: Dynamo reads no module)
        self.input_mlp = _input_mlp(graph) if self.traced is not None else None
        self.traces_original = self.input_mlp is not None
        # Call signatures whose fused modules all ran original; changed only by __call__, which
        # keeps last_original one of them.
        self.original_calls: set = set()
        self.audits = {}
        _FUSED_FORWARDS[id(self)] = self

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("graph_fast", None)
        state.pop("graph_plan_run", None)
        state.pop("original_run", None)
        if state.pop("waiting_for", None) is not None:  # (another model's check, maybe)
            state["last_graph"] = None
        if state.pop("audit", None) is not None:  # (CUDA events: checked again in the copy,
            state["last_graph"] = None  # whose next call takes the general path to start it)
        return state

    def __setstate__(self, state: dict) -> None:  # (deepcopy and pickle)
        self.__dict__.update(state)
        if "graph_is_owner" not in state:  # pickled before the field
            self.graph_is_owner = self.graph is self.owner
        if "audits" not in state:  # (pickled before the field: not the class's shared dict)
            self.audits = {}
        _FUSED_FORWARDS[id(self)] = self

    def __call__(self, *args, **kwargs):
        if (mode := self.mode) is not None and self.owner.training is not mode:
            # (traced in the other mode: its forward reads self.training)
            owner = self.owner
            return type(owner).forward(owner, *args, **kwargs)
        if (accepts := self.accepts) is not None and not self._accepted(accepts, args, kwargs):
            owner = self.owner
            return type(owner).forward(owner, *args, **kwargs)
        if _is_compiling():
            # Dynamo guards every object the trace reaches by two paths with a Python "a is b"
            # check on each call (object aliasing guards): this branch reaches each module by
            # one path, the graph's, and asks about the owner's children outside the trace. A
            # ViT whose 12 Mlp forwards compared their children here ran 0.92x compiled (H200):
            # ~190 such checks per call.
            if not _children_unchanged(id(self)):
                owner = self.owner
                return type(owner).forward(owner, *args, **kwargs)
            # A whole-model graph whose one fused module, a FusedMLP on the graph's input, has
            # the original path as its compiled choice: the trace is the unfused graph's (the
            # original model's code, guards and all; through the fused graph the seed MLP's
            # compiled call cost 8 us more, CPU-only, and torchvision's MLP, whose last Dropout
            # stays out of the chain, checked two object aliases in Python on every call).
            if self.traces_original and len(args) == 1 and not kwargs and compiling_with_dynamo():
                x = args[0]
                if isinstance(x, _Tensor) and _input_mlp_compiled_path(
                    id(self), traced_rows_bucket(x), _is_grad_enabled(), x.requires_grad,
                    x.is_contiguous(),
                ) == "original":  # fmt: skip
                    return self.traced.forward(x)
            return self._run_graph(*args, **kwargs)
        owner = self.owner
        if (
            self.single_mlp
            and len(args) == 1
            and not kwargs
            and (out := self.serve_single(args[0])) is not None
        ):
            return out
        if len(args) == 1 and not kwargs and isinstance(a := args[0], _Tensor):
            # A call like the last one served by the original path or by the fused graph, told by
            # its fields (_call_signature's, inline: as a function, its frame and loop cost 1.1
            # of 5.5 us on a CPU-only host)
            fields = ((a.shape, a.dtype, a.get_device(), a.is_contiguous(), a.requires_grad),)
            grad, clears = _is_grad_enabled(), _clears()
            last = self.last_original
            if last is not None and last[2] == fields and last[0] is grad and last[1] == clears:
                if not grad:
                    self.original_streak += 1
                    if self.original_streak == RESTORE_AFTER:
                        self._restore()
                if self.original is not None:
                    return (self.original_run or self._original_forward())(a)
                return type(owner).forward(owner, a)
            last = self.last_graph
            if (
                last is not None
                and last[1] == _choice_changes()
                and (sig := last[0])[2] == fields
                and sig[0] is grad
                and sig[1] == clears
                and not self._children_changed()
            ):
                if (audit := self.audit) is not None and not grad:
                    if audit.sig == sig:
                        return self._audited(a)
                    self._other_call(audit)
                elif (awaited := self.waiting_for) is not None and not _check_active(awaited):
                    self.waiting_for = self.last_graph = None  # (the next call asks again)
                # (the graph's one module called directly: its code cost 1.4 us more)
                single = self.single
                return single(a) if single is not None else self._run_graph(a)
        elif _is_fx_tracing():
            # torch.fx.symbolic_trace: the fused graph (dualk's operators as calls), without
            # signatures, checks or bookkeeping of the Proxies; the class's forward where the
            # children changed since fusing, or where the fused modules are not the owner's
            # submodules (a fused container keeps its len and order): fx records a module only
            # by its path from the traced root
            if self._children_changed() or isinstance(owner, _CONTAINERS):
                return type(owner).forward(owner, *args, **kwargs)
            return self._run_graph(*args, **kwargs)
        elif not kwargs and (last := self.last_original) is not None and _is_like(last, args):
            return self._run_original(*args)
        sig = _call_signature(args, kwargs)
        original_calls = self.original_calls
        if sig in original_calls or self.audits.get(sig, ("",))[0] == "original":
            if not kwargs:
                self.last_original = sig
            return self._run_original(*args, **kwargs)
        # Changed children run the class's forward: checked only where the graph would run (a
        # call served above runs the class's forward either way).
        if self._children_changed():
            if self.audit is not None:
                self._leave_check()
            return type(owner).forward(owner, *args, **kwargs)
        if (audit := self.audit) is not None:
            if audit.sig == sig:
                # (the checked signature between calls of another one: the check goes on)
                self.last_graph = (sig, _choice_changes())
                return self._audited(args[0])
            self._other_call(audit)
        fused = self.fused
        for m in fused:
            m.__dict__["_last_path"] = None
        # (the GraphModule's forward itself: it has no hooks of its own to run)
        out = self._run_graph(*args, **kwargs)
        if not fused:
            return out
        for m in fused:  # (a loop, not all() over a generator: the fused path's common exit)
            if m.__dict__.get("_last_path") != "original":
                if len(args) == 1 and not kwargs:
                    self.last_graph = (sig, _choice_changes())
                    if not sig[0] and sig not in self.audits and self.audit is None:
                        self._start_audit(sig, args[0])
                return out
        if len(original_calls) >= self.MAX_SIGNATURES:
            original_calls.clear()
            self.last_original = None
        original_calls.add(sig)
        if not kwargs:
            self.last_original = sig
        return out

    def _accepted(self, accepts: tuple, args: tuple, kwargs: dict) -> bool:
        """Whether the graph serves this call (accepts)."""
        names, positional, checkpoints = accepts
        if len(args) > positional or (
            kwargs and names is not None and not names.issuperset(kwargs)
        ):
            return False
        owner = self.owner
        return not (
            checkpoints
            and getattr(owner, "gradient_checkpointing", False)
            and owner.training
            and _is_grad_enabled()
        )

    @property
    def __code__(self):
        """The fused graph's forward code: torch.compile of a GraphModule reads its forward's
        __code__ (a GraphModule owner's forward is this object)."""
        return type(self.graph).forward.__code__

    def serve_single(self, x):
        """The graph is `return self.<FusedMLP>(x)` (single_mlp): what its forward does first, its
        planned CUDA call (the C++ side checks x, the layers, gradient mode, the module's hooks
        and state: dualk/nn.py _FastPath), without nn.Module's call and FusedMLP.forward around
        it, where the graph's children are as fused (H100, seed shape on a slow host: module 20
        us, the functional call 9); None where the plan cannot serve x."""
        fast = self.single.__dict__.get("_fast")
        if fast is None or self._children_changed():
            return None
        return fast.run(x)

    def graph_run(self, fast):
        """The owner's call by `fast`, its one FusedMLP's fast path (_fused_graph_call): a copy of
        the plan that also checks, in C++, what the owner's call would do besides this forward
        (its hooks; its forward still this object; its children as fused). Made once per fast
        path of the module; None (nothing made) where the children changed since fusing."""
        if self.graph_fast is not fast:
            if self._children_changed():  # (the guards below take the children as fused)
                return None
            owner = self.owner
            guards = call_guards(owner)
            guards.identities.append((owner.__dict__, "forward", self))
            children = owner._modules
            guards.identities += [(children, key, child) for key, child in children.items()]
            guards.sizes.append((children, len(children)))
            self.graph_fast = fast
            self.graph_plan_run = fast.plan.with_call_guards(guards.args()).run
        return self.graph_plan_run

    def _start_audit(self, sig: tuple, x) -> None:
        """Starts the in-model check of an inference signature whose graph runs some fused module
        on dualk's path, once every fused module's choice is final (_audited); only where
        module_choice may measure (a GPU, auto's timing not switched off, no torch.jit trace)."""
        if (
            not isinstance(x, _Tensor)
            # (a lone FusedMLP's planned call serves its like calls before any check could run)
            or self.single_mlp
            or module_choice.measurable(x.device) is not None
            or any(choice_final(m) is None for m in self.fused)
        ):
            return
        pool = self.pool
        key = None
        if pool is not None:
            key = self._pool_key(sig)
            verdict = pool.verdicts.get(key)
            if verdict is not None:  # (an identical owner's check has concluded: no new one)
                self._take_verdict(sig, verdict)
                return
        with _REGISTRY_LOCK:  # (the test and the claim at once: threads)
            audit = pool.under_way.get(key) if pool is not None else None
            if audit is not None and _check_active(audit):
                audit.members += 1  # (a follower: the periods so far did not include its path)
                audit.restart()
                self.audit = audit
                return
            active = _active_check()
            if active is not None:
                # One check at a time in the process: a period holds everything between two of
                # the lead's calls, and two checks alternating together (another owner's,
                # another fused model's called in turn) would time each other's paths too. Like
                # calls keep their shortcut and look at that check; once it has ended, the next
                # one takes the general path and asks again.
                self.waiting_for = active
                return
            audit = _Audit(sig, x.device, key, self)
            if pool is not None:
                pool.under_way[key] = audit
            _CHECKS_UNDER_WAY.add(audit)
        self.audit = audit

    def _pool_key(self, sig: tuple) -> tuple:
        """What makes owners identical for one shared check: the owner's class, its parameters'
        shapes and dtypes, its fused modules' classes and activations, and the call signature
        (LLaMA's four decoder MLPs, BERT's four intermediates, ViT's twelve Mlps)."""
        owner = self.owner
        params = tuple((tuple(p.shape), p.dtype) for p in owner.parameters())
        fused = tuple((type(m).__name__, getattr(m, "activation", None)) for m in self.fused)
        return (type(owner), params, fused, sig)

    def _take_verdict(self, sig: tuple, verdict: tuple) -> None:
        """This owner's verdict for `sig` (its own check's, or its pool's): "original" sends the
        signature's like calls to the original path from now on."""
        self.audit = None
        if len(self.audits) >= self.MAX_SIGNATURES:  # (as original_calls)
            self.audits.clear()
        self.audits[sig] = verdict
        if verdict[0] == "original":
            self.last_graph = None
            self.last_original = sig

    def _audited(self, a):
        """A like call during the in-model check. The check times whole periods of the model's
        calls, not this call alone: a mark (a CUDA event on a GPU: its time is when the GPU
        reaches it) at each call of the check's lead owner, so that one period holds everything
        the model does between two of its calls, all of it on one path. After AUDIT_WARM periods
        on the graph, the next 2 * AUDIT_PAIRS periods alternate between the graph and the
        original path; the medians decide, and where the graph is not faster by AUDIT_MARGIN the
        signature runs the original path from then on. Where the GPU has work queued a period
        is the GPU's time for it, where the GPU waits for the host the host's.

        Why periods: module_choice measures each module alone, in a loop, and a host-bound model
        paid more than the device saved (BERT's four LinearGELUs chose dualk's path, 44.6 vs
        56.0 us per call measured alone, and the model ran 0.91x, +355 us of host per forward;
        H200, session 31). Timing the owner's call alone (session 31's check) still missed what
        the fused path costs outside it: LLaMA's four MLPs all kept dualk's path and the model
        ran 0.96x (device -224 us, host +305 us per forward; H200, session 32).

        Identical owners of one dualk.fuse call (_pool_key) share one check and its verdict:
        the first to start it leads (its calls mark the periods), the others follow the path
        the lead chose for the period. Checked apart, LLaMA's four identical MLPs got different
        verdicts (1 fused, 3 original; session 31). The outputs of the calls in between come
        from either path (both within the dtype's tolerance of each other)."""
        audit = self.audit
        if audit is None:  # (another thread concluded it)
            return self._graph_path(a)
        if audit.verdict is not None:  # (the lead concluded the check)
            self._take_verdict(audit.sig, audit.verdict)
            return self._path(a, audit.verdict[0] == "original")
        if audit.dropped:  # (the next call takes the general path: a check of its own)
            self.audit = self.last_graph = None
            return self._graph_path(a)
        if audit.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return self._graph_path(a)  # (no timed events in a CUDA graph capture)
        if module_choice.measurable(audit.device) is not None:
            # (auto's timing switched off, a torch.jit trace: dropped unjudged, pool and all)
            self.audit = None
            _end_check(audit, self.pool, dropped=True)
            return self._graph_path(a)
        if audit.lead is not self:
            audit.follower_calls += 1
            if audit.follower_calls > AUDIT_LEAD_WAIT * audit.members:
                # The lead no longer marks periods (its children were replaced, it was restored,
                # the model stopped calling it): this owner leads from here, timing afresh.
                audit.lead = self
                audit.restart()
            else:
                return self._path(a, audit.original_turn)
        with _AUDIT_LOCK:  # (threads: one mark per lead call, one conclusion)
            if audit.verdict is not None:
                verdict = audit.verdict
            else:
                now = _monotonic()
                audit.gap, audit.progress, audit.follower_calls = now - audit.progress, now, 0
                marks = audit.marks
                verdict = None
                if audit.warm:
                    audit.warm -= 1
                    audit.original_turn = False
                elif len(marks) >= 2 * AUDIT_PAIRS:  # (this mark closes the last period)
                    marks.append((_audit_mark(audit.device), False))
                    self._conclude(audit)
                    verdict = audit.verdict
                else:
                    audit.original_turn = len(marks) % 2 == 1  # (the graph first in each pair)
                    marks.append((_audit_mark(audit.device), audit.original_turn))
        if verdict is not None:
            self._take_verdict(audit.sig, verdict)
            return self._path(a, verdict[0] == "original")
        return self._path(a, audit.original_turn)

    def _conclude(self, audit: _Audit) -> None:
        """The check's verdict from its periods, for this owner, its pool and its followers."""
        marks = audit.marks
        periods: dict[bool, list] = {False: [], True: []}
        for (start, original), (end, _) in zip(marks, marks[1:]):
            periods[original].append(_audit_ms(start, end))
        fused_ms = statistics.median(periods[False])
        original_ms = statistics.median(periods[True])
        path = "fused" if fused_ms < original_ms * (1 - AUDIT_MARGIN) else "original"
        audit.verdict = (path, fused_ms, original_ms)
        pool = self.pool
        if pool is not None and audit.key is not None:
            if len(pool.verdicts) >= self.MAX_SIGNATURES:
                pool.verdicts.clear()
            pool.verdicts[audit.key] = audit.verdict
        _end_check(audit, pool)

    def _other_call(self, audit: _Audit) -> None:
        """A call of another signature while `audit` is under way: after AUDIT_OTHERS of them the
        check is dropped unjudged (its signature is no longer called, and one check runs at a
        time), and the next call takes the general path, where a check of its own starts."""
        if audit.verdict is not None:  # (concluded by an identical owner meanwhile)
            self._take_verdict(audit.sig, audit.verdict)
            return
        if audit.dropped:  # (by its lead: the next call takes the general path, as below)
            self.audit = None
            self.last_graph = None
            return
        audit.others += 1
        if audit.others > AUDIT_OTHERS * audit.members:
            self.last_graph = None
            self._leave_check()

    def _leave_check(self) -> None:
        """This owner leaves the check under way: a lead drops it (its followers' next calls
        take the general path, where another check starts), a follower just goes."""
        audit, self.audit = self.audit, None
        if audit is None or audit.verdict is not None or audit.dropped:
            return
        if audit.lead is self:
            _end_check(audit, self.pool, dropped=True)
        else:
            audit.members = max(1, audit.members - 1)

    def _graph_path(self, a):
        single = self.single
        return single(a) if single is not None else self._run_graph(a)

    def _path(self, a, original: bool):
        return self._run_original(a) if original else self._graph_path(a)

    def _restore(self) -> None:
        """Gives the owner back its original forward (the class's, or for fuse's whole-model
        GraphModule the unfused graph's) once RESTORE_AFTER like inference calls have run the
        original path and every fused module's choice is final and "original": such a call
        then runs no dualk code at all (on an H200 host, ViT-S's 12 Mlp forward objects cost
        3-4% of its host-bound eager forward). Not where a fused module may still be measured
        (a provisional or missing decision: tried again RESTORE_AFTER like calls later) or has
        hooks. Likewise where fused modules chose dualk's path but every in-model check of this
        owner sent its signature back to the original path (_audited; BERT's four owners on an
        H200). From then on the owner is its original module: `dualk.fuse` the model again to
        measure other shapes."""
        audits = self.audits
        checked_original = (
            self.audit is None
            and self.last_original in audits
            and all(verdict[0] == "original" for verdict in audits.values())
        )
        for m in self.fused:
            final = choice_final(m)
            if final is None:
                # A provisional choice (an operator's backend was still tuning when it was
                # measured): the like calls above never reach the fused module again, so it
                # would stay provisional and the owner on this object for good (H200 zoo,
                # session 30: BERT's four, the seed's at 65536 rows). The next like call runs
                # the graph, whose modules ask module_choice again (measured again on its clock),
                # and restoring is tried again RESTORE_AFTER calls later.
                self.last_original = None
                self.original_calls.clear()
                self.original_streak = 0
                return
            if (final != "original" and not checked_original) or not call_guards(m).hold():
                return
        owner = self.owner
        if owner.__dict__.get("forward") is not self:
            return
        self._leave_check()
        if self.original is not None:  # (a GraphModule: its class forward is the fused graph)
            # (the unfused graph's forward, not the module chain: torch.compile and
            # torch.export read a GraphModule's forward.__code__)
            object.__setattr__(owner, "forward", self.original.forward)
        else:
            del owner.__dict__["forward"]
        _RESTORED[owner] = self.audits

    def _run_graph(self, *args, **kwargs):
        if self.graph_is_owner:  # the fused GraphModule itself: its forward is this object
            graph = self.owner
            return type(graph).forward(graph, *args, **kwargs)
        return self.graph.forward(*args, **kwargs)

    def _run_original(self, *args, **kwargs):
        original = self.original
        if original is not None:
            if len(args) == 1 and not kwargs:  # (the module chain takes one input)
                return self._original_forward()(args[0])
            return original.forward(*args, **kwargs)
        return type(self.owner).forward(self.owner, *args, **kwargs)

    def _original_forward(self):
        """The original path's callable where the owner is fuse's whole-model GraphModule
        (original_run; made again here in a copy or a pickled object)."""
        run = self.original_run
        if run is None:
            chain = _module_chain(self.original)
            run = self.original_run = chain if chain is not None else self.original.forward
        return run

    def _children_changed(self) -> bool:
        """Whether the owner changed since fusing: its children (replaced, added, removed), or a
        plain attribute that its forward (or a module it traces into) may read, which the
        trace took as a constant (`x * self.alpha`): the class's forward runs instead."""
        modules, children = self.owner._modules, self.children
        # (map and all: no Python frame per child)
        if len(modules) != len(children) or not all(map(operator.is_, modules.values(), children)):
            return True
        for module, name, value in self.attributes:  # (most owners: none)
            now = module.__dict__.get(name, _MISSING)
            if now is not value and not _same_scalar(now, value):
                return True
        for module, kind, name, tensor in self.tensors:  # (most owners: none)
            if getattr(module, kind).get(name, _MISSING) is not tensor:
                return True
        return False


def _install_graph_call(gm: fx.GraphModule) -> None:
    """fuse's whole-model GraphModule's call, deepcopy and pickling, on its class (each
    GraphModule has its own: recompile() and fx's copies restore fx's)."""
    cls = type(gm)
    # (made once per class: a pickle or save reinstalls it over fx's recompile(), and a new code
    # object there made a compiled model of the class compile again)
    call = cls.__dict__.get("_dualk_graph_call")
    if call is None:
        call = cls._dualk_graph_call = _graph_call_of_its_own()
    cls.__call__ = call
    cls.__deepcopy__ = _fused_graph_deepcopy
    cls.__copy__ = _fused_graph_copy
    cls.__reduce__ = _fused_graph_reduce
    cls.__setstate__ = _fused_graph_setstate


def _graph_call_of_its_own():
    """_fused_graph_call with a code object of its own, for one GraphModule class: Dynamo keeps
    compiled entries per code object, at most torch._dynamo.config.recompile_limit (8), and fused
    models of different classes sharing one code object ran eagerly from the 9th one compiled in
    a process on (their originals, each class's forward, compiled)."""
    base = _fused_graph_call
    call = types.FunctionType(
        base.__code__.replace(), base.__globals__, base.__name__, base.__defaults__,
        base.__closure__,
    )  # fmt: skip
    call.__kwdefaults__, call.__qualname__ = base.__kwdefaults__, base.__qualname__
    call.__doc__, call.__module__ = base.__doc__, base.__module__
    call.__dict__.update(base.__dict__)
    call.dualk_graph_call = True  # (what tests and copies recognise)
    return call


def _fused_graph_copy(self):
    """copy.copy of fuse's whole-model GraphModule: fx's keeps only the modules its graph calls
    (the model's Linears, held by the fused modules, left the copy's state_dict) and drops the
    forward object. The copy has the model's children (shared, as a shallow copy does) and its
    own forward object (fresh checks, the verdicts so far) or the restored forward, and this
    class's call."""
    res = fx.GraphModule.__copy__(self)
    # the model's own children, parameters and buffers (shared, in the model's order: the forward
    # object's record of the children compares them in order)
    res._modules.clear()
    res._modules.update(self._modules)
    for key, param in self._parameters.items():
        res._parameters.setdefault(key, param)
    for key, buf in self._buffers.items():
        res._buffers.setdefault(key, buf)
    res._non_persistent_buffers_set |= self._non_persistent_buffers_set
    if "dualk_fuse_report" in self.__dict__:
        res.dualk_fuse_report = self.dualk_fuse_report
    forward = self.__dict__.get("forward")
    if forward is not None:
        if type(forward) is _FusedForward:
            twin = _FusedForward.__new__(_FusedForward)
            twin.__setstate__(forward.__getstate__())
            twin.owner = res
            if forward.graph is self:
                twin.graph = res
            twin.audits, twin.original_calls = dict(forward.audits), set(forward.original_calls)
            forward = twin
        object.__setattr__(res, "forward", forward)
        if self in _RESTORED:
            _RESTORED[res] = dict(_RESTORED[self])
    _install_graph_call(res)
    return res


def _fused_graph_reduce(self):
    """__reduce__ (pickle, torch.save, copy.copy) of fuse's whole-model GraphModule: fx's, which
    rebuilds the module from its generated code and dropped the instance's _FusedForward (the
    copy ran the fused graph without checks or restore), and whose recompile() put fx's call
    back on this module's class (the original lost its planned call to pickling). The forward
    object (or the restored forward, and the restored verdicts) travel as the state, set on the
    rebuilt module (_fused_graph_setstate), so that its references to the module are to that
    one; this class keeps its call."""
    reduced = fx.GraphModule.__reduce__(self)
    _install_graph_call(self)
    rebuild, args = reduced[0], reduced[1]
    body = args[0] if args and isinstance(args[0], dict) else None
    if body is None or "forward" not in body:
        return reduced
    body = dict(body)
    state = {"forward": body.pop("forward"), "restored": _RESTORED.get(self)}
    return _rebuilt_fused_graph, (rebuild, (body, *args[1:])), state


def _rebuilt_fused_graph(rebuild, args: tuple) -> fx.GraphModule:
    """A pickled whole-model GraphModule of fuse's, rebuilt by fx (`rebuild`), with this module's
    call and pickling on its class; its forward comes with the state."""
    gm = rebuild(*args)
    _install_graph_call(gm)
    return gm


def _fused_graph_setstate(self, state: dict) -> None:
    """The state of _fused_graph_reduce: the forward object and the restored verdicts."""
    object.__setattr__(self, "forward", state["forward"])
    if state.get("restored") is not None:
        _RESTORED[self] = state["restored"]


def _fused_graph_deepcopy(self, memo: dict):
    """__deepcopy__ of fuse's whole-model GraphModule: fx's own rebuilds the module from its graph
    and drops instance attributes, so a copy lost its _FusedForward (no in-model check, no
    restore: the fused graph as its class forward). The copy gets a copy of it (or of the
    restored forward), bound to the copy through `memo`, and this class's call."""
    forward = self.__dict__.get("forward")
    res = fx.GraphModule.__deepcopy__(self, memo)
    if forward is not None:
        object.__setattr__(res, "forward", copy.deepcopy(forward, memo))
        _install_graph_call(res)
        if self in _RESTORED:
            _RESTORED[res] = copy.deepcopy(_RESTORED[self], memo)
    return res


def _fused_graph_call(self, *args, **kwargs):
    """__call__ of fuse's whole-model GraphModule: where its graph is `return self.<FusedMLP>(x)`
    (the seed's MLP), the FusedMLP's planned call through the copy of its plan that also
    checks, in C++, the GraphModule's own hooks and children and its forward (graph_run), before
    nn.Module's call: nn.Module's call was ~2 of a fuse'd small-batch model's ~17 us of host time
    per call on an H200 host, and these checks in Python ~2.3 us on a CPU-only host. Else (the
    plan declines) nn.Module's call (looked up now: torch.fx patches it while tracing)."""
    # (compiling first: a trace reads nothing here, so it guards on nothing more)
    if (
        not _is_compiling()
        and len(args) == 1
        and not kwargs
        and type(forward := self.__dict__.get("forward")) is _FusedForward
        and forward.single_mlp
        and (fast := forward.single.__dict__.get("_fast")) is not None
        and (
            run := (
                forward.graph_plan_run if forward.graph_fast is fast else forward.graph_run(fast)
            )
        )
        is not None
        and (out := run(args[0])) is not None
    ):
        return out
    return nn.Module.__call__(self, *args, **kwargs)


def _input_mlp(graph: fx.GraphModule) -> nn.Module | None:
    """The graph's only fused module where it is a FusedMLP or a LinearGELU called on the graph's
    one input, else None."""
    nodes = list(graph.graph.nodes)
    inputs = [n for n in nodes if n.op == "placeholder"]
    if len(inputs) != 1:
        return None
    found = None
    for node in nodes:
        if node.op != "call_module":
            continue
        module = graph.get_submodule(str(node.target))
        if not isinstance(module, FUSED_TYPES):
            continue
        if found is not None or not isinstance(module, (FusedMLP, LinearGELU)):
            return None
        if node.args != (inputs[0],) or node.kwargs:
            return None
        found = module
    return found


def _single_module(graph: fx.GraphModule) -> nn.Module | None:
    """The module a graph's code only calls on its one input and returns, else None."""
    nodes = list(graph.graph.nodes)
    if [n.op for n in nodes] != ["placeholder", "call_module", "output"]:
        return None
    x, call, out = nodes
    if call.args != (x,) or call.kwargs or out.args != (call,) or x.kwargs or x.args:
        return None
    return graph.get_submodule(str(call.target))


class _ModuleChain:
    """Calls its modules in turn on one input (nn.Sequential's forward over a tuple): the
    original path of a fused GraphModule whose unfused graph is such a chain. A plain object,
    so deepcopy and pickle carry its modules as they carry the model's."""

    __slots__ = ("modules",)

    def __init__(self, modules: tuple):
        self.modules = modules

    def __call__(self, x):
        for module in self.modules:
            x = module(x)
        return x

    def __getstate__(self):
        return self.modules

    def __setstate__(self, modules) -> None:
        self.modules = modules


def _module_chain(gm: fx.GraphModule) -> _ModuleChain | None:
    """The modules of `gm`'s graph where it is placeholder -> call_module -> ... -> output, each
    module called on the previous node alone; else None."""
    nodes = list(gm.graph.nodes)
    if len(nodes) < 3 or nodes[0].op != "placeholder" or nodes[-1].op != "output":
        return None
    modules, previous = [], nodes[0]
    for node in nodes[1:-1]:
        if node.op != "call_module" or node.args != (previous,) or node.kwargs:
            return None
        modules.append(gm.get_submodule(str(node.target)))
        previous = node
    if nodes[-1].args != (previous,):
        return None
    return _ModuleChain(tuple(modules))


class _Audit:
    """One in-model check under way (_FusedForward._audited): the call signature, the device, the
    lead owner (its calls mark the periods), the periods left before timing, the marks (mark,
    whether its period runs the original path) and the current period's path; shared by the
    identical owners that joined it (`members`; `key` their _CheckPool key, None for a check of
    one owner alone) until `verdict` is set or it is `dropped` unjudged."""

    def __init__(self, sig: tuple, device: torch.device, key: tuple | None, lead):
        self.sig, self.device, self.key, self.lead = sig, device, key, lead
        self.warm = AUDIT_WARM
        self.others = 0  # calls of other signatures meanwhile
        self.members = 1
        self.marks: list = []
        self.original_turn = False
        self.verdict: tuple | None = None  # (path, fused ms, original ms)
        self.dropped = False
        self.progress = _monotonic()  # the lead's last mark (or the start)
        self.gap = 0.0  # seconds between the lead's last two marks
        self.follower_calls = 0  # followers' calls since the lead's last mark

    def restart(self) -> None:
        """Times afresh (a follower joined, or took the lead): one warm period first."""
        self.marks.clear()
        self.warm = max(self.warm, 1)
        self.follower_calls = 0


def _check_active(audit: _Audit) -> bool:
    """Whether `audit` is under way; one whose lead has marked no period for AUDIT_STALE_S
    seconds, or 20 of its periods if longer, at most AUDIT_STALE_MAX_S (the model is no longer
    called, or was dropped and not yet collected), is marked dropped here."""
    if audit.verdict is not None or audit.dropped:
        return False
    limit = min(max(AUDIT_STALE_S, 20 * audit.gap), AUDIT_STALE_MAX_S)
    if _monotonic() - audit.progress > limit:
        audit.dropped = True
        return False
    return True


def _active_check() -> _Audit | None:
    """The check under way in the process, if any (stale ones leave the registry here)."""
    with _REGISTRY_LOCK:
        for audit in list(_CHECKS_UNDER_WAY):
            if _check_active(audit):
                return audit
            _CHECKS_UNDER_WAY.discard(audit)
    return None


def _end_check(audit: _Audit, pool: _CheckPool | None, dropped: bool = False) -> None:
    """`audit` has concluded (its verdict set) or is dropped unjudged: out of the registries."""
    if dropped:
        audit.dropped = True
    with _REGISTRY_LOCK:
        _CHECKS_UNDER_WAY.discard(audit)
        if pool is not None and pool.under_way.get(audit.key) is audit:
            del pool.under_way[audit.key]


class _CheckPool:
    """The in-model checks that one dualk.fuse call's owners share: the one under way and the
    verdicts reached, by _FusedForward._pool_key. A copy of the model (deepcopy, pickle) starts
    with an empty pool, shared by the copy's owners: it checks again."""

    def __init__(self):
        self.under_way: dict[tuple, _Audit] = {}
        self.verdicts: dict[tuple, tuple] = {}

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()


# The in-model check (_FusedForward._audited): like calls on the graph before it, timed pairs, and
# how much faster per call the graph must be to keep dualk's path (module constants: tests lower
# them)
AUDIT_WARM = 4
AUDIT_PAIRS = 12
AUDIT_MARGIN = 0.01
# Calls of other signatures after which a check whose own signature is no longer called is dropped
AUDIT_OTHERS = 256
# Followers' calls (per member) without a mark of the lead after which a follower leads; seconds
# without a mark after which a check is dropped (when another would start)
AUDIT_LEAD_WAIT, AUDIT_STALE_S, AUDIT_STALE_MAX_S = 8, 2.0, 30.0
# Every check under way in the process (one at a time) and its lock (taken after _AUDIT_LOCK
# where both are: _conclude ends a check), and the lock of the lead's marks
_CHECKS_UNDER_WAY: weakref.WeakSet = weakref.WeakSet()
_REGISTRY_LOCK = threading.RLock()
_AUDIT_LOCK = threading.Lock()
_monotonic = time.monotonic


def _audit_mark(device: torch.device):
    """A point in the call sequence: a recorded CUDA event on a GPU (when the GPU reaches it),
    the host clock elsewhere."""
    if device.type == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(device))
        return event
    return time.perf_counter()


def _audit_ms(start, end) -> float:
    """Milliseconds between two _audit_mark marks (waits for the GPU to reach `end`)."""
    if isinstance(start, float):
        return (end - start) * 1e3
    end.synchronize()
    return start.elapsed_time(end)


def audit_verdicts(model: nn.Module) -> dict[str, int]:
    """How many in-model checks (_FusedForward._audited) in `model` kept dualk's path ("fused"),
    how many sent their signature back to the original path ("original"), how many are under
    way ("pending") and how many owners wait for another's check to end ("waiting")."""
    counts: dict[str, int] = {}
    for m in model.modules():
        forward = m.__dict__.get("forward")
        if type(forward) is _FusedForward:
            audits, audit = forward.audits, forward.audit
            if audit is not None and audit.verdict is not None:  # (its pool's, not yet taken)
                audits = {**audits, audit.sig: audit.verdict}
            elif audit is not None and not audit.dropped:
                counts["pending"] = counts.get("pending", 0) + 1
            elif forward.waiting_for is not None and _check_active(forward.waiting_for):
                counts["waiting"] = counts.get("waiting", 0) + 1  # (for another's check)
        else:  # (an owner given its own forward back keeps its verdicts here)
            audits = _RESTORED.get(m, {})
        for path, *_ in audits.values():
            counts[path] = counts.get(path, 0) + 1
    return counts


def audit_times(model: nn.Module) -> list[tuple[str, float, float]]:
    """The in-model checks' verdicts in `model` that were reached, each once: (the path kept,
    the median period on dualk's path, the median period on the original path), in ms; the
    numbers behind audit_verdicts' counts (identical owners share one verdict)."""
    seen: list[tuple[str, float, float]] = []
    for m in model.modules():
        forward = m.__dict__.get("forward")
        if type(forward) is _FusedForward:
            audits, audit = forward.audits, forward.audit
            if audit is not None and audit.verdict is not None:
                audits = {**audits, audit.sig: audit.verdict}
        else:
            audits = _RESTORED.get(m, {})
        for verdict in audits.values():
            entry = (verdict[0], float(verdict[1]), float(verdict[2]))
            if entry not in seen:
                seen.append(entry)
    return seen


# Every _FusedForward by id(): _children_unchanged finds one while Dynamo traces.
# Where to give an owner back its original forward (_FusedForward._restore); a module constant
# that tests lower.
RESTORE_AFTER = 32
# The owners whose forward was restored, for tests and the report (weak: models come and go)
# (each with its in-model checks' verdicts, for audit_verdicts: the dict holds no module)
_RESTORED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def forward_restored(module: nn.Module) -> bool:
    """Whether dualk.fuse gave `module` its own forward back (every fused module in it chose the
    original path: _FusedForward._restore)."""
    return module in _RESTORED


_FUSED_FORWARDS: weakref.WeakValueDictionary[int, _FusedForward] = weakref.WeakValueDictionary()


def _children_unchanged(key: int) -> bool:
    """Whether the _FusedForward `key` (its id) still has its owner's children, called by Dynamo
    while it traces (a constant of the graph, as module_choice.compiled_path): the trace then
    reads no child through the owner, only through the graph. A child replaced after
    torch.compile is seen by the next compile (torch._dynamo.reset()), and by every eager call."""
    fused_forward = _FUSED_FORWARDS.get(key)
    return fused_forward is not None and not fused_forward._children_changed()


_children_unchanged._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _input_mlp_compiled_path(
    key: int, bucket: int, grad_mode: bool, x_grad: bool, contiguous: bool
) -> str:
    """The compiled path ("fused" | "original") of the input module of the _FusedForward `key`
    (its id) on an input of `bucket` rows, or "graph" where that module decides in the graph
    (a named backend, another module kind). Called by Dynamo while it traces: a constant of the
    graph, as module_choice.compiled_path; what it reads of the module's parameters (dtype,
    shape, requires_grad) the trace guards on as graph inputs in either branch."""
    fused_forward = _FUSED_FORWARDS.get(key)
    module = fused_forward.input_mlp if fused_forward is not None else None
    if module is None or module.backend != "auto":
        return "graph"
    if isinstance(module, FusedMLP):
        if module._between_active() or not contiguous:
            return "original"
        layers = module.layers
        weights, biases = [lin.weight for lin in layers], [lin.bias for lin in layers]
    else:  # LinearGELU
        if not contiguous:
            return "original"
        weights, biases = [module.weight], [module.bias]
    return compiled_choice(module, weights, biases, bucket, grad_mode, x_grad)


_input_mlp_compiled_path._dynamo_marked_constant = True  # type: ignore[attr-defined]
_is_compiling = torch.compiler.is_compiling
_is_fx_tracing = route.is_fx_tracing
_is_grad_enabled = torch.is_grad_enabled
_clears = autotune.clears
_choice_changes = module_choice.changes
_Tensor = torch.Tensor


def _arg_signature(a) -> tuple | type:
    if isinstance(a, _Tensor):
        return (a.shape, a.dtype, a.get_device(), a.is_contiguous(), a.requires_grad)
    return type(a)


def _call_signature(args, kwargs) -> tuple:
    """What a fused module's choice depends on, for every tensor argument (shape, dtype,
    device, layout, requires_grad), with the grad mode and autotune's reset count."""
    return (
        _is_grad_enabled(),
        _clears(),
        tuple(map(_arg_signature, args)),
        tuple([(k, _arg_signature(v)) for k, v in kwargs.items()]) if kwargs else (),
    )


def _is_like(sig: tuple, args: tuple) -> bool:
    """`_call_signature(args, {}) == sig`, field by field, stopping at the first difference."""
    grad, clears, fields, _ = sig
    if len(args) != len(fields) or _is_grad_enabled() is not grad or _clears() != clears:
        return False
    for a, f in zip(args, fields):
        if type(f) is tuple:  # a tensor's (shape, dtype, device, contiguous, requires_grad)
            if not (
                isinstance(a, _Tensor)
                and a.shape == f[0]
                and a.dtype is f[1]
                and a.get_device() == f[2]
                and a.is_contiguous() is f[3]
                and a.requires_grad is f[4]
            ):
                return False
        elif type(a) is not f:  # (a non-tensor's type, never a Tensor class)
            return False
    return True


def _unfused_copy(gm: fx.GraphModule) -> fx.GraphModule | None:
    """A GraphModule of gm's graph as it is (before fusing) over the same submodules, or None
    where gm's graph reads attributes (get_attr): a copy would hold its own references to them,
    which a later .to() on the fused model would not update."""
    if any(node.op == "get_attr" for node in gm.graph.nodes):
        return None
    return fx.GraphModule(gm, copy.deepcopy(gm.graph), type(gm).__name__)


def _fuse_untraceable(module: nn.Module, ctx: _Context, path: str) -> None:
    """Fuse inside `module`, which torch.fx cannot trace as a whole."""
    if type(module).forward is nn.Sequential.forward:
        # A Sequential's data flow is its order: trace it with every child as a leaf.
        _fuse_in_place(module, _trace(module, all_leaves=True), ctx, path)
    for name, child in module.named_children():
        if isinstance(child, (nn.Linear, *FUSED_TYPES)) or module_activation(child):
            continue
        _fuse_child(child, ctx, f"{path}{name}")


def _trace_for_fusing(module: nn.Module, ctx: _Context) -> fx.GraphModule:
    """_trace with the mode guard, where it pays: a forward that reads its own self.training and
    whose every chain lies inside one of its children raises instead (its children are then
    fused, in both modes, rather than its forward in one)."""
    gm = _trace(module, mode_guard=True)
    if "dualk_mode" in gm.meta and _all_chains_in_children(gm, ctx):
        raise _TraceCannotHold(
            "its forward computes otherwise in train() and eval() (it reads self.training), and "
            "every chain lies inside its children, fused in both modes instead"
        )
    return gm


def _chains_unreported(gm: fx.GraphModule, ctx: _Context) -> list[_Chain]:
    """The chains gm has, found with a report of their own (ctx's is left alone)."""
    return _find_chains(gm, _Context(ctx.backend, ctx.min_layers, FuseReport()), "")


def _all_chains_in_children(gm: fx.GraphModule, ctx: _Context) -> bool:
    """Whether gm has chains and each one's modules all lie inside one child of gm's root."""
    chains = _chains_unreported(gm, ctx)
    for chain in chains:
        paths = [str(n.target).split(".") for n in chain.nodes if n.op == "call_module"]
        if any(len(p) < 2 for p in paths) or len({p[0] for p in paths}) != 1:
            return False
    return bool(chains)


def _fuse_child(child: nn.Module, ctx: _Context, path: str) -> None:
    if type(child).forward is not nn.Sequential.forward:
        try:
            gm = _trace_for_fusing(child, ctx)
        except Exception as exc:
            ctx.report.notes.append(
                f"{path} ({type(child).__name__}) is not traceable either ({_first_line(exc)}): "
                "searched its children"
            )
            if _fuse_own_forward(child, ctx, path):
                return
        else:
            _fuse_in_place(child, gm, ctx, path)
            return
    _fuse_untraceable(child, ctx, f"{path}.")


def _fuse_own_forward(module: nn.Module, ctx: _Context, path: str) -> bool:
    """Chains called inline by a forward fx cannot trace into its children (a transformers
    decoder layer: `fc2(act(fc1(h)))` beside an attention child fx cannot trace, behind the
    layers' wrappers and `**kwargs`): the forward's own code traced with every child a leaf,
    under known wrappers, its **kwargs as none given (_trace's `own`); calls it does not serve
    run the class's forward (_FusedForward.accepts). Then the children are searched as
    _fuse_untraceable does. False where that trace fails or finds no chain."""
    before = len(ctx.report.fused)
    try:
        gm = _trace(module, all_leaves=True, mode_guard=True, own=True)
    except Exception:
        return False
    if not _chains_unreported(gm, ctx):
        return False
    _fuse_in_place(module, gm, ctx, path)
    if len(ctx.report.fused) == before:
        return False
    ctx.report.notes.append(
        f"{path} ({type(module).__name__}): its own forward traced with its children as leaves; "
        "calls with other keyword arguments, or while it checkpoints, run its class forward"
    )
    _fuse_untraceable(module, ctx, f"{path}.")
    return True


def _fuse_in_place(module: nn.Module, gm: fx.GraphModule, ctx: _Context, path: str) -> None:
    prefix = path if not path or path.endswith(".") else f"{path}."
    before = len(ctx.report.fused)
    unfused = _unfused_copy(gm)  # (before fusing: what a compile traces on the original path)
    if _fuse_graph(gm, ctx, prefix):
        # The fused modules registered on the module too: modules(), named_modules(), hooks
        # and .to() see them (they hold no tensors of their own: state_dict() is unchanged).
        # (not on a container: its len() and order)
        for chain in ctx.report.fused[before:] if not isinstance(module, _CONTAINERS) else ():
            local = chain.name[len(prefix) :]
            if local not in module._modules and not hasattr(module, local):
                module.add_module(local, gm.get_submodule(local))
        # An instance attribute: nn.Module.__call__ (hooks included) runs it as the forward.
        object.__setattr__(
            module, "forward", _FusedForward(module, gm, traced=unfused, pool=ctx.pool)
        )
        mode = gm.meta.get("dualk_mode")
        in_mode = "" if mode is None else (
            f" in {'train' if mode else 'eval'}() mode (its forward reads self.training; in "
            f"{'eval' if mode else 'train'}() its own forward runs)"
        )  # fmt: skip
        ctx.report.notes.append(
            f"{prefix.rstrip('.') or type(module).__name__} ({type(module).__name__}) keeps its "
            f"modules and state_dict; its forward runs the fused graph{in_mode}"
        )


_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def _copy_sharing_tensors(model: nn.Module) -> nn.Module:
    """A deep copy of the module tree whose parameters and buffers are the original objects."""
    memo = {id(t): t for _, t in model.named_parameters(remove_duplicate=False)}
    memo.update({id(t): t for _, t in model.named_buffers(remove_duplicate=False)})
    try:
        return copy.deepcopy(model, memo)
    except Exception as exc:
        raise InvalidArgumentError(
            f"dualk.fuse: could not copy {type(model).__name__} ({_first_line(exc)}); "
            "fuse(model, inplace=True) fuses it without a copy"
        ) from exc
