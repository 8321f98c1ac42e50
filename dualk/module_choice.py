"""Fused or original: the path a fused module (`FusedMLP`, `LinearGELU`, and so every chain that
`dualk.fuse` made) runs, decided by measurement per shape class, device and mode.

A fused module can always compute what it replaced with PyTorch's own ops (`F.linear` and the
activation, the "original" path). The operators' own "auto" already has PyTorch as a candidate,
but it sees one call of one operator; a model sees more:
  - "infer" (no gradient recorded): the whole module call, dualk's Python layer included, against
    the original ops called directly. In a host-bound forward the launch path decides.
  - "train" (autograd records the call): forward + backward of each path. A fused forward can win
    while its backward loses (wide layers), and the step is what a training loop pays.
  - "compiled" (torch.compile is tracing): dualk's custom op is opaque to Inductor, which would
    otherwise fuse the bias and activation into its GEMMs; the fused op is kept only where it
    beats the original GEMMs alone (Inductor's floor) by MARGIN_COMPILED. Decided while Dynamo
    traces (`assume_constant_result`: a constant in the graph), so the compiled graph holds one
    path.

The paths are timed on random tensors of the module's shapes (never on the model's own tensors:
a measurement must not touch what autograd or DDP hooks see), with autotune's timer, in passes
that alternate the candidates, and scored as autotune scores backends. Nothing is measured off
the GPU, with DUALK_AUTOTUNE=0, under CUDA-graph capture or under torch.jit tracing: then the
fused path runs (the operators decide their backend as before). Decisions are remembered in
memory and in autotune's cache file (section "module.<mode>"), and forgotten with it.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from . import dispatch, ops
from .backends.torch_ref import ACTIVATIONS
from .dispatch import autotune
from .registry import OPS

PATHS = ("fused", "original")
MODES = ("infer", "train", "compiled")
# The fused op must beat the original by this much to be kept (a tie keeps the original: it is
# what the model had, and Inductor and PyTorch improve it without dualk).
MARGIN = 0.02
MARGIN_COMPILED = 0.10
# A training step is host-bound at these sizes and a fused backward costs more host time than
# autograd's own (mlp256x4 bf16, H200: 1.80 against 1.20 ms per forward + backward). Three passes
# of one call each (40 ms) read it the other way round on an H100 (1.35 against 1.51 ms) and the
# step ran 22% slower: training decisions, made once per shape for a long run, get more passes,
# more calls per pass, and must win by more.
MARGIN_TRAIN = 0.05
BUDGET_MS = {"infer": 40.0, "compiled": 40.0, "train": 160.0}  # per decision, all passes, paths
ROUNDS = {"infer": 3, "compiled": 3, "train": 5}
SECTION = "module."  # + mode, in autotune's cache file

_lock = threading.RLock()
_memory: dict[tuple, str] = {}
_details: dict[tuple, dict] = {}
# key -> (the build generation it was measured in, monotonic time of the next look, the interval
# it waited) for a provisional decision: measured again when a build generation moves or on a
# clock, RECHECK_S doubling up to RECHECK_MAX_S. On an H200 zoo run (session 30) BERT's and the
# seed's decisions stayed provisional through whole rows with no generation left to move, and
# their owners never got their own forward back.
_provisional: dict[tuple, tuple[int, float, float]] = {}
RECHECK_S, RECHECK_MAX_S = 1.0, 30.0
_clock = time.monotonic
_generation = [autotune.clears()]
_changes = [0]  # counts every decision remembered, measured again or forgotten (changes())


def changes() -> int:
    """Changes whenever a decision is made, measured again (a provisional one) or forgotten:
    callers that cache what the decisions led to check it."""
    return _changes[0]


class Shape:
    """What a decision depends on, as constants (Dynamo passes them to `compiled_path`):
    kind ("mlp" | "linear_gelu" | "linear_glu"), widths (in, ..., out; linear_glu: in and N),
    activation (fused_mlp's name, linear_gelu's approximate, or linear_glu's as fused_mlp
    names it: "silu", "relu", "gelu_tanh", "gelu_erf"), which layers have a bias (linear_glu:
    gate and up), dtype name, device text."""

    __slots__ = ("kind", "widths", "activation", "biases", "dtype", "device", "strided", "batched")

    def __init__(self, kind, widths, activation, biases, dtype, device, layout=""):
        self.kind, self.widths, self.activation = kind, tuple(widths), activation
        self.biases, self.dtype, self.device = tuple(biases), dtype, device
        self.strided = layout == "strided"  # x's rows not contiguous (a transposed input)
        # x contiguous with batch dims (..., rows, in), as transformers call their MLPs: dualk's
        # path then reshapes in and out (10 us of host time per linear_gelu call on an H100
        # host), which a 2-dim measurement missed: BERT's LinearGELUs chose dualk's path on
        # that host and the model ran 0.89x
        self.batched = layout == "batched"


def rows_bucket(rows: int | None) -> int:
    """Rows rounded up to a power of two (as autotune's keys); 0 for unknown (dynamic shapes)."""
    return 0 if rows is None else max(1, 1 << max(0, (int(rows) - 1).bit_length()))


def _key(mode: str, shape: tuple, rows: int | None, x_grad: bool) -> tuple:
    tf32 = shape[4] == "torch.float32" and autotune.tf32_allowed()
    return (mode, shape, rows_bucket(rows), bool(x_grad), tf32)


def key_text(key: tuple) -> str:
    mode, (kind, widths, act, biases, dtype, device, *layout), rows, x_grad, tf32 = key
    bias = "".join("b" if b else "-" for b in biases)
    return (
        f"{kind} widths={'-'.join(map(str, widths))} act={act} bias={bias} {dtype} {device} "
        f"{layout[0] + ' ' if layout else ''}"
        f"rows<={rows or '?'}{' grad' if x_grad else ''}{' tf32' if tf32 else ''}"
    )


def _forget_if_stale() -> None:
    gen = autotune.clears()
    if gen != _generation[0]:
        _memory.clear()
        _details.clear()
        _provisional.clear()
        _generation[0] = gen
        _changes[0] += 1


def measurable(device: torch.device) -> str | None:
    """Why nothing may be measured now on `device` (None when it may)."""
    if device.type != "cuda":
        return "not on a CUDA device"
    if torch._C._is_tracing():
        return "torch.jit is tracing"
    return autotune.timing_blocked()


def decided(mode: str, shape: tuple, rows: int | None, x_grad: bool) -> str | None:
    """The remembered path for this class, or None (nothing is measured; a provisional
    decision, made while a backend was still building, is None too)."""
    _forget_if_stale()
    key = _key(mode, shape, rows, x_grad)
    return None if key in _provisional else _memory.get(key)


def choose(mode: str, shape: tuple, rows: int | None, x_grad: bool = False) -> str:
    """ "fused" or "original" for a module of `shape` called on `rows` rows in `mode`."""
    _forget_if_stale()
    key = _key(mode, shape, rows, x_grad)
    path = _memory.get(key)
    if path is not None and (not _provisional or not _stale(key)):
        return path
    with _lock:
        if key in _memory and not _stale(key):
            return _memory[key]
        device = torch.device(shape[5])
        blocked = measurable(device)
        if blocked is not None and device.type != "cuda":
            _memory[key] = "fused"  # nothing to measure off the GPU: dualk's ops, as before
            _changes[0] += 1
            return "fused"
        store = autotune.store_for(device)
        cached = store.get(SECTION + mode, key_text(key))
        if isinstance(cached, dict) and cached.get("path") in PATHS:
            _memory[key], _details[key] = cached["path"], dict(cached, source="cache")
            _changes[0] += 1
            return cached["path"]
        if blocked is not None:
            return "fused"  # not remembered: the next call that may measure decides
        details = _measure(mode, Shape(*shape), rows or 4096, x_grad, device)
        _memory[key], _details[key] = details["path"], dict(details, source="measured")
        _changes[0] += 1
        if details["provisional"]:
            # dualk's operator ran without a backend that is still building: measured again
            # once a build finishes or its clock runs out, and not written to the file
            interval = min(RECHECK_MAX_S, _provisional.get(key, (0, 0.0, RECHECK_S / 2))[2] * 2)
            _provisional[key] = (autotune.build_generation(), _clock() + interval, interval)
        else:
            _provisional.pop(key, None)
            store.put(SECTION + mode, key_text(key), details)
        return details["path"]


def _stale(key: tuple) -> bool:
    """A provisional decision whose missing backend may have arrived since (a build ended), or
    whose clock for another look has run out."""
    entry = _provisional.get(key)
    if entry is None:
        return False
    generation, next_look, _ = entry
    return _clock() >= next_look or autotune.build_generation(poll=True) != generation


def compiled_path(shape: tuple, rows: int | None, grad: bool) -> str:
    """choose("compiled", ...), called while Dynamo traces: its answer is a constant of the
    graph (rows is None where the trace has dynamic shapes: measured at 4096 rows)."""
    if not auto_allowed(_OP_OF_KIND[shape[0]], "auto"):
        return "fused"
    return choose("compiled", shape, rows, grad)


_OP_OF_KIND = {"mlp": "fused_mlp", "linear_gelu": "linear_gelu", "linear_glu": "linear_glu"}
_GLU_ACTIVATION = {"silu": ("silu", "tanh"), "relu": ("relu", "tanh"),
                   "gelu_tanh": ("gelu", "tanh"), "gelu_erf": ("gelu", "none")}  # fmt: skip


# What torch._dynamo.assume_constant_result sets (importing torch._dynamo here would import
# Triton with dualk): Dynamo calls the function while tracing and keeps its answer as a constant.
compiled_path._dynamo_marked_constant = True  # type: ignore[attr-defined]


def details() -> dict[str, dict]:
    """Every decision this process holds: {key text: {"path", "times_us", "source", ...}}."""
    _forget_if_stale()
    return {f"{k[0]} {key_text(k)}": dict(v) for k, v in _details.items()}


def clear() -> None:
    with _lock:
        _changes[0] += 1
        _memory.clear()
        _details.clear()
        _provisional.clear()


# ------------------------------------------------------------------------------ measuring
def _random_parameters(shape: Shape, device, grad: bool):
    dtype = getattr(torch, shape.dtype.replace("torch.", ""))
    weights, biases = [], []
    pairs = zip(shape.widths[:-1], shape.widths[1:])
    if shape.kind == "linear_glu":  # the gate and the up projection, both (N, K)
        pairs = [(shape.widths[0], shape.widths[1])] * 2
    for (k, n), has_bias in zip(pairs, shape.biases):
        bound = 1.0 / math.sqrt(k)
        w = torch.empty(n, k, device=device, dtype=dtype).uniform_(-bound, bound)
        b = torch.empty(n, device=device, dtype=dtype).uniform_(-bound, bound) if has_bias else None
        weights.append(w.requires_grad_(grad))
        biases.append(None if b is None else b.requires_grad_(grad))
    return weights, biases


def _original_mlp(x, weights, biases, activation: str, gemm_only: bool) -> torch.Tensor:
    act = ACTIVATIONS[activation]
    last = len(weights) - 1
    for i, (w, b) in enumerate(zip(weights, biases)):
        x = F.linear(x, w, b)
        if i < last and not gemm_only:
            x = act(x)
    return x


def _paths(shape: Shape, x, weights, biases, compiled: bool) -> dict[str, Callable]:
    """The two paths as calls on these tensors. Under "compiled" the original is its GEMMs
    alone (with bias, as Inductor's addmm), the floor of what Inductor makes of it."""
    if shape.kind == "mlp":
        fused = lambda: ops.fused_mlp(x, weights, biases, activation=shape.activation)
        original = lambda: _original_mlp(x, weights, biases, shape.activation, compiled)
    elif shape.kind == "linear_glu":
        (wg, wu), (bg, bu) = weights, biases
        act, approximate = _GLU_ACTIVATION[shape.activation]
        fused = lambda: ops.linear_glu(x, wg, wu, bg, bu, activation=act, approximate=approximate)
        if compiled:
            # The GEMMs alone, though Inductor's graph also has a pointwise pass (silu * up) that
            # it cannot fold into cuBLAS's GEMMs: with that pass timed too, the zoo's compiled
            # LLaMA chose dualk's op and ran 0.88x (H200, session 37: device 2.99 -> 2.81 ms, host
            # 2.89 -> 3.55 ms; the op's host cost inside a compiled graph, through torch.library's
            # dispatch, is not what this eager-timed decision sees). This floor and
            # MARGIN_COMPILED keep the original there (1.00x).
            original = lambda: (F.linear(x, wg, bg), F.linear(x, wu, bu))
        else:
            original = lambda: original_glu(x, wg, wu, bg, bu, act, approximate)
    else:
        w, b = weights[0], biases[0]
        fused = lambda: ops.linear_gelu(x, w, b, approximate=shape.activation)
        if compiled:
            original = lambda: F.linear(x, w, b)
        else:
            original = lambda: F.gelu(F.linear(x, w, b), approximate=shape.activation)
    return {"fused": fused, "original": original}


def _op_provisional(shape: Shape, x, weights, biases) -> bool:
    """Whether the operator's own auto decision for these tensors is provisional."""
    if not hasattr(autotune, "provisional"):
        return False
    if shape.kind == "mlp":
        return autotune.provisional(OPS["fused_mlp"], (x, weights, biases, shape.activation))
    if shape.kind == "linear_glu":
        act, approximate = _GLU_ACTIVATION[shape.activation]
        args = (x, *weights, *biases, act, approximate)
        return autotune.provisional(OPS["linear_glu"], args)
    return autotune.provisional(OPS["linear_gelu"], (x, weights[0], biases[0], shape.activation))


def _with_backward(run: Callable, inputs: Sequence[torch.Tensor]) -> Callable:
    """Forward and backward as a training step runs them: gradients accumulated into the
    leaves' .grad (AccumulateGrad included), then dropped as zero_grad(set_to_none) does."""
    grad_out: list[torch.Tensor] = []

    def step():
        out = run()
        outs = out if isinstance(out, tuple) else (out,)  # linear_glu's floor: two GEMMs
        if not grad_out:
            grad_out.extend(torch.randn_like(o) for o in outs)
        torch.autograd.backward(outs, grad_out)
        for t in inputs:
            t.grad = None

    return step


def _measure(mode: str, shape: Shape, rows: int, x_grad: bool, device) -> dict:
    train = mode == "train" or (mode == "compiled" and x_grad)
    dtype = getattr(torch, shape.dtype.replace("torch.", ""))
    timer = autotune.current_timer()
    guard = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with guard, torch.no_grad() if not train else torch.enable_grad():
        weights, biases = _random_parameters(shape, device, train)
        if shape.strided:
            x = torch.randn(shape.widths[0], rows, device=device, dtype=dtype).t()
        elif shape.batched:
            x = torch.randn(1, rows, shape.widths[0], device=device, dtype=dtype)
        else:
            x = torch.randn(rows, shape.widths[0], device=device, dtype=dtype)
        x.requires_grad_(train and x_grad)
        runs = _paths(shape, x, weights, biases, compiled=mode == "compiled")
        if train:
            inputs = [t for t in (x, *weights, *biases) if t is not None and t.requires_grad]
            runs = {name: _with_backward(run, inputs) for name, run in runs.items()}
        errors: dict[str, str] = {}
        for name, run in list(runs.items()):
            try:
                # untimed, twice: the op's own auto decides its backend (Triton is tuned in the
                # background and joins once ready: provisional until then), kernels load
                run()
                run()
            except Exception as exc:  # a path that fails is not a candidate
                errors[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
                del runs[name]
        provisional = _op_provisional(shape, x, weights, biases)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
        kind = "train" if train else mode  # (compiled with gradients: a training decision)
        rounds = ROUNDS[kind]
        budget = BUDGET_MS[kind] / max(1, len(runs)) / rounds
        for _ in range(rounds):
            for name, run in runs.items():
                measured = timer(run, f"module:{name}", budget)
                if not isinstance(measured, (tuple, list)):
                    measured = (measured, measured)
                samples[name].append((float(measured[0]), float(measured[1])))
    parts = {
        name: (sorted(s[0] for s in ss)[len(ss) // 2], min(s[1] for s in ss))
        for name, ss in samples.items()
    }
    # Wall time of back-to-back calls, max(device, host): in a host-bound model (a training
    # step's optimizer, a transformer's Python) a path's host time is not hidden behind the GPU.
    scored = {name: (max(dev, host), dev, host) for name, (dev, host) in parts.items()}
    margin = MARGIN_COMPILED if mode == "compiled" else MARGIN_TRAIN if train else MARGIN
    if "fused" in scored and "original" in scored:
        path = "fused" if scored["fused"][0] < (1 - margin) * scored["original"][0] else "original"
    else:
        path = "original" if "original" in scored else "fused"
    return {
        "path": path,
        "provisional": provisional,
        "rows": rows,
        "times_us": {n: [round(v, 3) for v in t] for n, t in scored.items()},
        "errors": errors,
    }


def shape_of_mlp(weights, biases, activation: str) -> tuple:
    w0 = weights[0]
    widths = (w0.shape[1], *(w.shape[0] for w in weights))
    return ("mlp", widths, activation, tuple(b is not None for b in biases), str(w0.dtype),
            str(w0.device))  # fmt: skip


def shape_of_linear_gelu(weight, bias, approximate: str) -> tuple:
    widths = (weight.shape[1], weight.shape[0])
    return ("linear_gelu", widths, approximate, (bias is not None,), str(weight.dtype),
            str(weight.device))  # fmt: skip


def shape_of_linear_glu(weight_gate, weight_up, bias_gate, bias_up, activation: str,
                        approximate: str) -> tuple:  # fmt: skip
    """linear_glu's Shape (separate gate and up weights, (N, K) each)."""
    name = (
        ("gelu_tanh" if approximate == "tanh" else "gelu_erf")
        if activation == "gelu"
        else activation
    )
    widths = (weight_gate.shape[1], weight_gate.shape[0])
    return ("linear_glu", widths, name, (bias_gate is not None, bias_up is not None),
            str(weight_gate.dtype), str(weight_gate.device))  # fmt: skip


def original_glu(
    x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate, gate_last=False
):
    """linear_glu by PyTorch's own ops: act(F.linear(x, Wg, bg)) * F.linear(x, Wu, bu). With
    weight_up None, one Linear (weight_gate, bias_gate) computes both: one GEMM whose output
    halves are [gate | up] ([up | gate] with gate_last, as timm's GluMlp), as the model does."""
    if weight_up is None:
        first, second = F.linear(x, weight_gate, bias_gate).chunk(2, dim=-1)
        gate, up = (second, first) if gate_last else (first, second)
    else:
        gate, up = F.linear(x, weight_gate, bias_gate), None
    if activation == "gelu":
        gate = F.gelu(gate, approximate=approximate)
    else:
        gate = F.silu(gate) if activation == "silu" else F.relu(gate)
    return gate * (F.linear(x, weight_up, bias_up) if up is None else up)


def auto_allowed(spec_name: str, backend: str) -> bool:
    """Whether the module may choose: its backend is "auto" and nothing overrides auto now."""
    return backend == "auto" and dispatch.auto_unforced(OPS[spec_name])
