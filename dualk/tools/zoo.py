"""The model zoo: `dualk.fuse` on real model architectures (dualk/tools/zoo_models.py), each model timed
against its original in one process, its output judged against the original's, and what fuse
replaced taken from its report. `dualk bench --models` runs it from the command line.

Modes (per model: `ModelSpec.modes`; `run(modes=...)` picks among them):
- "eager": model.eval() under torch.no_grad(), fused vs original.
- "compiled": torch.compile(fused) vs torch.compile(original), both eval + no_grad; compilation
  happens in the warm-up, outside the timings (`Result.fullgraph` says how each was compiled).
- "train": one step, forward, loss = output.float().square().mean(), backward, SGD(lr=1e-6),
  on two deep copies of the model with the same initial weights (the fused one is
  `dualk.fuse(copy.deepcopy(m))`), so one's optimizer steps never touch the other's weights.

Method (GPU). The two are timed in alternating rounds (`rounds`, the order swapped each round;
with the default rounds, enough for MIN_TIMED_S seconds of bursts, up to MAX_ROUNDS), so a clock
or host drifting during the run weighs on both alike. In each round, per model:
- wall: N calls in a row after an L2 flush, then one synchronise; wall time / N is what a user
  calling the model in a loop sees per call. The ratio is original wall / fused wall (> 1: fused
  is faster).
- host: the same loop's time up to the last call's return, before the synchronise, / N: the time
  to *enqueue* a call. It is the Python and launch cost of a call while the GPU keeps up with
  the queue; where the GPU is the bottleneck the launch queue fills and it approaches wall.
- device: CUDA events around each of min(N, 20) calls, each after a GPU sleep longer than the
  call's host time (dualk/core/timing.py), L2 flushed once before them: the GPU's own time per call,
  without the gaps in which it waits for the host (events around N back-to-back calls of a
  host-bound model would time the host instead).
Each round runs SPLIT bursts per model, alternating, of N calls each: about `target_ms` per round
and at least MIN_BURST calls per burst; every figure is the median over the bursts (the JSON keeps
every sample). Device samples are taken once per round, after its first pair of bursts and
followed by an untimed burst of each model: no timed burst follows one (_rounds). Compiled models are compiled through a function of their own (`_own_frame`). On a CPU the same loop runs (device time none, host = wall) with one round: the CPU
sizes are for correctness and the fuse report, and their times say nothing about a GPU.
The ratio is paired: the median over the bursts of original / fused, each burst against the other
model's burst next to it (paired_ratio; the JSON keeps median / median too). The garbage collector
stays on, with what existed before the rounds frozen (gc.freeze: out of its scans).

Error: the fused output against the original's (max abs, relative norm ||f - o|| / ||o||), and
the verdict by dualk's GEMM-family rule (dualk/testing.py): against a copy of the original in a
wider dtype (float64 for fp32 models, float32 for 16-bit ones), the fused output's relative-norm
error must stay within twice the original's own plus one unit of the dtype's precision (four in
fp32). In train mode the output, loss and every gradient are judged before the first step.
"""

from __future__ import annotations

import copy
import datetime
import gc
import math
import platform
import random
import socket
import statistics
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

import dualk

from .. import module_choice
from ..core import timing
from ..dispatch import autotune, triton_tune
from ..fuse import FUSED_TYPES, audit_times, audit_verdicts, forward_restored, fuse, linear_like
from ..nn import choice_final
from ..testing import gemm_error_budget
from .zoo_models import MODELS, ModelSpec, unavailable

MODES = ("eager", "compiled", "train")
SPLIT = 4  # bursts per round on the GPU (_time)
Progress = Callable[[int, int, str], None]

# GPU: rounds, and the target length of one burst of calls (ms); --quick halves the run.
ROUNDS, TARGET_MS, MAX_CALLS, DEVICE_CALLS = 8, 25.0, 100, 20
QUICK_ROUNDS, QUICK_TARGET_MS = 3, 12.0
# With the default rounds, a row whose rounds would time less than MIN_TIMED_S seconds of bursts
# gets more rounds, up to MAX_ROUNDS: the training steps (~1.2-1.5 ms, 8-call bursts) had 32
# burst pairs in 0.7 s, whose paired ratios scattered 0.93-1.04 with equal medians, and the
# 95% interval of their median spanned 0.95-1.01 (H200, session 32)
MIN_TIMED_S, MAX_ROUNDS = 2.0, 32
# Calls per burst at least: a burst's first call starts on an idle GPU and its last call's GPU
# tail ends it, and both are part of its wall time; with 2-call bursts they were a third of it.
MIN_BURST = 8
LR = 1e-6
# On a CPU, torch.compile uses aot_eager: it traces what Inductor would (dynamo, the fused ops'
# fake implementations, AOT autograd) without Inductor's C++ build, minutes for the whole zoo.
CPU_COMPILE_BACKEND = "aot_eager"


@dataclass
class FuseSummary:
    """What `dualk.fuse` replaced, from `dualk_fuse_report`: chains by kind, how many of the
    model's nn.Linear modules they hold, the candidates it skipped (with reasons) and any
    nn.Linear neither fused nor named in the report."""

    chains: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    linears: int = 0
    linears_fused: int = 0
    traced: bool = True
    skipped: list[dict] = field(default_factory=list)  # {"where": ..., "reason": ...}
    unreported: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Result:
    """One model in one mode. `status`: "ok" (measured and judged), "skipped" (a package
    missing: `reason`) or "error" (`reason`: what raised). Times per call: *_ms wall clock,
    *_device_ms GPU time, *_host_us enqueue time (module docstring); `ratio` is original wall /
    fused wall. `ok` is the output verdict (train: output, loss and gradients)."""

    model: str
    mode: str
    family: str
    dtype: str
    rows: str
    size: str
    device: str
    status: str = "ok"
    reason: str = ""
    note: str = ""
    timed_on: str = ""  # "cuda" or "cpu" (CPU times say nothing about the GPU)
    rounds: int = 0
    calls: int = 0
    orig_ms: float | None = None
    fused_ms: float | None = None
    orig_device_ms: float | None = None
    fused_device_ms: float | None = None
    orig_host_us: float | None = None
    fused_host_us: float | None = None
    # the median over the rounds' burst pairs of original wall / fused wall (paired_ratio)
    ratio: float | None = None
    # median(original wall) / median(fused wall): the unpaired figure (the zoo's headline before
    # session 30), kept beside the paired one
    ratio_of_medians: float | None = None
    # 95% interval of the ratio (resampling the rounds' paired bursts): where it holds 1.0, the
    # run cannot tell the two models apart on this host
    ratio_ci: list[float] | None = None
    device_ratio: float | None = None
    warmup_s: dict[str, float] = field(default_factory=dict)  # first calls: compile, autotune
    # every burst's wall and host ms per call and every device sample, per model (the spread
    # behind the medians)
    samples: dict = field(default_factory=dict)
    fullgraph: dict[str, bool] = field(default_factory=dict)  # compiled mode, per model
    ok: bool | None = None
    max_abs_err: float | None = None
    rel_err: float | None = None  # ||fused - orig|| / ||orig||
    fused_ref_err: float | None = None  # relative-norm error against the wide reference
    orig_ref_err: float | None = None
    err_budget: float | None = None
    loss_rel_err: float | None = None  # train
    grad_rel_err: float | None = None  # train: all gradients, concatenated
    grad_ok: bool | None = None
    verdict: str = ""
    fuse: FuseSummary | None = None
    # the fused modules' measured choices made during this row (dualk.module_choice): key ->
    # {"path", "times_us": {path: [score, device, host]}}
    choices: dict[str, dict] = field(default_factory=dict)
    # autotune.provisional_now() at the row's end where not empty (operators' decisions still
    # waiting for a backend: the fused modules above them stay provisional too)
    provisional_ops: dict[str, dict] = field(default_factory=dict)
    # dualk's background work (Triton's tuner processes running, anything pending) just before
    # and after the timed rounds: work left at "before" is settled first (settle_s)
    background: dict[str, dict] = field(default_factory=dict)


# ---------------------------------------------------------------------------- selection
def select(
    models: Iterable[str] | None = None, modes: Sequence[str] = MODES
) -> list[tuple[ModelSpec, str]]:
    """(model, mode) pairs in registry order: `models` None or containing "all" means every
    model; each runs in those of `modes` it is registered for."""
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"unknown mode(s) {', '.join(bad)}; the modes are {', '.join(MODES)}")
    names = list(models) if models is not None else ["all"]
    if "all" in names:
        names = list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(unknown)}; the zoo has: {', '.join(MODELS)}")
    return [
        (MODELS[n], m)
        for n in dict.fromkeys(names)
        for m in MODES
        if m in modes and m in MODELS[n].modes
    ]


# ---------------------------------------------------------------------------- run
def run(
    models: Iterable[str] | None = None,
    modes: Sequence[str] = MODES,
    device: str | torch.device | None = None,
    size: str = "auto",
    rounds: int | None = None,
    target_ms: float | None = None,
    quick: bool = False,
    progress: Progress | None = None,
    on_result: Callable[[Result], None] | None = None,
) -> list[Result]:
    """Run the zoo: each selected model in each of its selected modes (see `select`), fused
    against the original. `device`: default the GPU if there is one; `size`: "gpu", "cpu" or
    "auto" (the GPU sizes on a GPU). `rounds` and `target_ms` (one burst's length) default to
    8 and 25 ms on a GPU (`quick`: 3 and 12 ms) and 1 round on a CPU; with the default rounds on
    a GPU, a row whose rounds would time less than MIN_TIMED_S seconds gets more, up to
    MAX_ROUNDS. `progress(i, n, what)` is
    called before each row and once at the end, `on_result(result)` after each row (the command
    line saves the JSON there, so a run cut short keeps its rows). A model that fails is a row
    with status "error", and the run goes on."""
    dev = torch.device(
        device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    if size == "auto":
        size = "gpu" if dev.type == "cuda" else "cpu"
    if size not in ("gpu", "cpu"):
        raise ValueError(f"size must be 'gpu', 'cpu' or 'auto', got {size!r}")
    on_gpu = dev.type == "cuda"
    min_timed_s = MIN_TIMED_S if rounds is None and on_gpu and not quick else 0.0
    if rounds is None:
        rounds = (QUICK_ROUNDS if quick else ROUNDS) if on_gpu else 1
    if target_ms is None:
        target_ms = (QUICK_TARGET_MS if quick else TARGET_MS) if on_gpu else 0.0
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    pairs = select(models, modes)
    results = []
    for i, (spec, mode) in enumerate(pairs):
        if progress is not None:
            progress(i, len(pairs), f"{spec.name} {mode}")
        results.append(_run_one(spec, mode, dev, size, rounds, target_ms, min_timed_s))
        _release(dev, compiled=mode == "compiled")
        if on_result is not None:
            on_result(results[-1])
    if progress is not None:
        progress(len(pairs), len(pairs), "done")
    return results


def _release(device: torch.device, compiled: bool) -> None:
    if compiled:
        torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _run_one(
    spec: ModelSpec,
    mode: str,
    device: torch.device,
    size: str,
    rounds: int,
    target_ms: float,
    min_timed_s: float = 0.0,
) -> Result:
    result = Result(
        model=spec.name,
        mode=mode,
        family=spec.family,
        dtype=str(spec.dtype).removeprefix("torch."),
        rows=spec.rows[size],
        size=size,
        device=str(device),
    )
    why = unavailable(spec)
    if why is not None:
        result.status, result.reason = "skipped", why
        return result
    before = set(module_choice.details())
    try:
        _measure(spec, mode, device, size, rounds, target_ms, result, min_timed_s)
        # operator decisions still waiting for a backend at the row's end
        result.provisional_ops = autotune.provisional_now()
        result.choices = {
            k: {
                "path": v["path"],
                "times_us": v.get("times_us", {}),
                "provisional": bool(v.get("provisional")),
                "source": v.get("source"),
            }
            for k, v in module_choice.details().items()
            if k not in before
        }
    except Exception as exc:  # one broken model must not end the run: the row says what raised
        result.status, result.reason = "error", _first_line(exc)
        frames = traceback.extract_tb(exc.__traceback__)
        if frames:  # where, for a GPU run read from its JSON alone
            last = frames[-1]
            result.note = _join(
                result.note, f"raised at {last.filename}:{last.lineno} ({last.name})"
            )
    return result


def _measure(
    spec, mode, device, size, rounds, target_ms, result: Result, min_timed_s: float = 0.0
) -> None:
    torch.manual_seed(0)
    built = spec.build(device, spec.dtype, size)
    result.note = built.note
    original = built.model
    torch.manual_seed(1)
    args, kwargs = built.make_inputs()
    ref_dtype = torch.float64 if spec.dtype == torch.float32 else torch.float32
    reference = copy.deepcopy(original).to(ref_dtype)
    ref_inputs = _cast(args, ref_dtype), _cast(kwargs, ref_dtype)
    if mode == "train":
        original.train()
        reference.train()
        twin = copy.deepcopy(original)  # same initial weights; fused shares twin's parameters
        fused = fuse(twin)
        fused.train()
        result.fuse = summarize(original, fused)
        _judge_train(
            original, twin, fused, reference, (args, kwargs), ref_inputs, spec.dtype, result
        )
        del reference
        # The step timed against fused's is a deep copy too, made the same way as twin: the
        # original module itself against a copy compared placement as well (session 25, CPU: a
        # ViT-like model's deep copy ran 9% slower than the model it was copied from)
        original = copy.deepcopy(original)
        opt_o = torch.optim.SGD(original.parameters(), lr=LR)
        opt_f = torch.optim.SGD(fused.parameters(), lr=LR)
        run_o = lambda: _step(original, opt_o, args, kwargs)
        run_f = lambda: _step(fused, opt_f, args, kwargs)
        _time(run_o, run_f, device, rounds, target_ms, result, grad=True, min_timed_s=min_timed_s)
        return
    fused = fuse(original)  # shares original's parameters: no second copy of the weights
    result.fuse = summarize(original, fused)
    with torch.no_grad():
        ref_out = _output_tensor(reference(*ref_inputs[0], **ref_inputs[1]))
    del reference
    call_o, call_f = original, fused
    if mode == "compiled":
        call_o = _compile(original, spec, device, "original", result)
        call_f = _compile(fused, spec, device, "fused", result)
    run_o = lambda: call_o(*args, **kwargs)
    run_f = lambda: call_f(*args, **kwargs)
    with torch.no_grad():
        _time(
            run_o,
            run_f,
            device,
            rounds,
            target_ms,
            result,
            grad=False,
            ref=ref_out,
            dtype=spec.dtype,
            min_timed_s=min_timed_s,
        )
    restored = sum(1 for m in fused.modules() if forward_restored(m))
    if restored:  # (dualk.fuse gave them their own forward back: original-path calls, no dualk)
        result.note = _join(result.note, f"{restored} fused owner(s) back on their own forward")
    checks = audit_verdicts(fused)
    if checks:  # fused owners' in-model checks: which path each kept
        result.note = _join(
            result.note,
            "in-model check kept: " + ", ".join(f"{k} {n}" for k, n in sorted(checks.items())),
        )
        # the medians behind them (ms per period of the model's calls: fused / original)
        times = "; ".join(f"{path} ({f:.3f} / {o:.3f} ms)" for path, f, o in audit_times(fused))
        if times:
            result.note = _join(result.note, f"check medians fused / original: {times}")
    if mode == "eager":  # what kept an owner on its fused forward (read from the JSON)
        finals = Counter(
            str(choice_final(m)) for m in fused.modules() if isinstance(m, FUSED_TYPES)
        )
        if finals:
            result.note = _join(
                result.note,
                "final choices: " + ", ".join(f"{k} {n}" for k, n in sorted(finals.items())),
            )


def _cast(obj, dtype):
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cast(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: _cast(v, dtype) for k, v in obj.items()}
    return obj


def _output_tensor(out) -> torch.Tensor:
    """The tensor a model's output is judged (and trained) by: the output itself, a transformers
    output's last_hidden_state, or the first element of a tuple."""
    if isinstance(out, torch.Tensor):
        return out
    hidden = getattr(out, "last_hidden_state", None)
    if isinstance(hidden, torch.Tensor):
        return hidden
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise TypeError(f"cannot find the output tensor in a {type(out).__name__}")


def _compile(model: nn.Module, spec: ModelSpec, device, which: str, result: Result):
    """torch.compile(model), fullgraph as the spec asks; where one graph cannot be had, compiled
    again without fullgraph (recorded in result.fullgraph and the note) at the first call."""
    backend = "inductor" if device.type == "cuda" else CPU_COMPILE_BACKEND
    model = _own_frame(model, which)
    state = {"fn": torch.compile(model, fullgraph=spec.fullgraph, backend=backend)}
    result.fullgraph[which] = spec.fullgraph

    def call(*args, **kwargs):
        try:
            return state["fn"](*args, **kwargs)
        except Exception as exc:
            if not result.fullgraph[which]:
                raise
            result.fullgraph[which] = False
            result.note = _join(result.note, f"{which}: fullgraph=False ({_first_line(exc)[:120]})")
            state["fn"] = torch.compile(model, fullgraph=False, backend=backend)
            return state["fn"](*args, **kwargs)

    cpu_note = f"compiled with backend={backend!r} on the CPU"
    if backend != "inductor" and cpu_note not in result.note:
        result.note = _join(result.note, cpu_note)
    return call


def _own_frame(model: nn.Module, which: str) -> Callable:
    """model(*args, **kwargs) as a function with a code object of its own. Dynamo keeps compiled
    graphs per code object: compiled as modules, the original and the fused model of one class
    share their forward's, so one's calls can run the other's graph or check its guards first
    (two compiled copies of one GPT-2, nothing fused, read 1.10 and 1.31 ms per call on an H100),
    which a user compiling one model never pays."""

    def call(*args, **kwargs):
        return model(*args, **kwargs)

    call.__code__ = call.__code__.replace(co_name=f"dualk_zoo_{which}")
    return call


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


def _step(model: nn.Module, opt: torch.optim.Optimizer, args, kwargs) -> None:
    opt.zero_grad(set_to_none=True)
    loss = _output_tensor(model(*args, **kwargs)).float().square().mean()
    loss.backward()
    opt.step()


# ---------------------------------------------------------------------------- fuse report
def summarize(original: nn.Module, fused: nn.Module) -> FuseSummary:
    """What `fuse` did to `original`, from the result's `dualk_fuse_report`."""
    rep = fused.dualk_fuse_report
    linears = [n for n, m in original.named_modules() if linear_like(m)]
    in_chains = {name for c in rep.fused for name in c.modules}
    skipped = [{"where": s.where, "reason": s.reason} for s in rep.skipped]
    named = in_chains | {s["where"] for s in skipped}
    return FuseSummary(
        chains=len(rep.fused),
        kinds=dict(Counter(c.kind for c in rep.fused)),
        linears=len(linears),
        linears_fused=sum(len(c.modules) for c in rep.fused),
        traced=rep.traced,
        skipped=skipped,
        unreported=[n for n in linears if n not in named],
        notes=list(rep.notes),
    )


# ---------------------------------------------------------------------------- errors
def _rel_norm(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 (||a - b|| where b is all zero); NaN where either is."""
    a, b = a.double(), b.double()
    diff = torch.linalg.vector_norm(a - b).item()
    scale = torch.linalg.vector_norm(b).item()
    return diff / scale if scale > 0 else diff


def _verdict(dtype: torch.dtype, fused_err: float, orig_err: float) -> tuple[bool, float]:
    """(ok, budget): the fused relative-norm error against the wide reference within twice the
    original's plus one unit of `dtype`'s precision (four in fp32), testing.gemm_error_budget's
    rule on relative errors. NaN fails."""
    budget = gemm_error_budget(dtype, orig_err, 1.0)
    return bool(fused_err <= budget), budget


def _judge(result: Result, out: torch.Tensor, orig: torch.Tensor, ref: torch.Tensor, dtype) -> None:
    if out.shape != orig.shape:
        result.ok = False
        result.verdict = f"fused output shape {tuple(out.shape)}, original {tuple(orig.shape)}"
        return
    result.max_abs_err = (out.double() - orig.double()).abs().max().item() if out.numel() else 0.0
    result.rel_err = _rel_norm(out, orig)
    result.fused_ref_err = _rel_norm(out, ref)
    result.orig_ref_err = _rel_norm(orig, ref)
    result.ok, result.err_budget = _verdict(dtype, result.fused_ref_err, result.orig_ref_err)
    result.verdict = (
        f"{'ok' if result.ok else 'FAIL'}: fused {result.fused_ref_err:.3g}, original "
        f"{result.orig_ref_err:.3g} from the reference (budget {result.err_budget:.3g})"
    )
    if not ref.count_nonzero():
        result.verdict += "; the reference output is all zeros: the check compares nothing"


def _forward_backward(model: nn.Module, named_params: nn.Module, args, kwargs):
    """Output, loss and {name: grad} of one forward + backward, without an optimizer step; the
    gradients are cleared again."""
    model.zero_grad(set_to_none=True)
    out = _output_tensor(model(*args, **kwargs))
    loss = out.float().square().mean()
    loss.backward()
    grads = {
        n: p.grad.detach().clone() for n, p in named_params.named_parameters() if p.grad is not None
    }
    model.zero_grad(set_to_none=True)
    return out.detach(), loss.detach(), grads


def _judge_train(original, twin, fused, reference, inputs, ref_inputs, dtype, result: Result):
    """Output, loss and gradients of the fused model against the original's, before any step
    (twin holds the parameters fused trains, under the original's names)."""
    out_o, loss_o, g_o = _forward_backward(original, original, *inputs)
    out_f, loss_f, g_f = _forward_backward(fused, twin, *inputs)
    out_r, _, g_r = _forward_backward(reference, reference, *ref_inputs)
    _judge(result, out_f, out_o, out_r, dtype)
    result.loss_rel_err = abs(loss_f.item() - loss_o.item()) / max(abs(loss_o.item()), 1e-30)
    names = [n for n in g_o if n in g_f and n in g_r]
    missing = sorted(set(g_o) ^ set(g_f))
    if missing or not names:
        result.grad_ok = False
        result.verdict += f"; gradients differ in which parameters have one: {missing[:4]}"
        result.ok = False
        return
    flat = lambda g: torch.cat([g[n].double().flatten() for n in names])
    gf, go, gr = flat(g_f), flat(g_o), flat(g_r)
    result.grad_rel_err = _rel_norm(gf, go)
    fused_err, orig_err = _rel_norm(gf, gr), _rel_norm(go, gr)
    result.grad_ok, budget = _verdict(dtype, fused_err, orig_err)
    result.verdict += (
        f"; gradients {'ok' if result.grad_ok else 'FAIL'}: fused {fused_err:.3g}, original "
        f"{orig_err:.3g} (budget {budget:.3g})"
    )
    result.ok = bool(result.ok and result.grad_ok)


# ---------------------------------------------------------------------------- timing
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(
    run_o,
    run_f,
    device,
    rounds,
    target_ms,
    result: Result,
    grad: bool,
    ref=None,
    dtype=None,
    min_timed_s: float = 0.0,
):
    """Warm up both (compilation, autotuning: result.warmup_s), judge the outputs (inference),
    then time both in alternating rounds (module docstring)."""
    outs = {}
    for which, fn in (("original", run_o), ("fused", run_f)):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        if which == "fused":
            _settle(fn, device)
        result.warmup_s[which] = round(time.perf_counter() - t0, 3)
        for _ in range(2 if grad else INFER_WARM_CALLS):
            out = fn()
        outs[which] = out
    if not grad:
        _judge(result, _output_tensor(outs["fused"]), _output_tensor(outs["original"]), ref, dtype)
    del outs
    on_gpu = device.type == "cuda"
    # one call's time: the least of three (a first synchronised call can be several times
    # slower), the larger model's
    one = max(min(_wall_once(fn, device) for _ in range(3)) for fn in (run_o, run_f))
    calls = 2 if not on_gpu else max(3, min(MAX_CALLS, math.ceil(target_ms / max(one, 1e-3))))
    flush = torch.empty(2**25, dtype=torch.int32, device=device) if on_gpu else None  # 128 MiB
    samples: dict[str, dict[str, list[float]]] = {
        w: {"wall": [], "host": [], "device": []} for w in ("original", "fused")
    }
    # Each round's bursts are split in SPLIT shorter ones, alternating: a host that slows down
    # for a while (another tenant, a GC pause) then falls on both models, not on one (two
    # copies of one GPT-2, nothing fused, read 5.0 and 2.8 ms per forward in 5 rounds).
    burst_calls = max(MIN_BURST, calls // SPLIT) if on_gpu else calls
    if on_gpu:
        rounds = rounds_for(rounds, burst_calls, one, min_timed_s)
    # Earlier rows leave a large heap (compiled graphs, Dynamo's caches): a full collection that
    # scans it falls on one burst of one model now and then (mlp256x4's training step, H100: the
    # fused copy's bursts 1.67-2.21 ms, the original's 1.65-2.05, equal device time). Frozen,
    # those objects are out of the scans; the collector still runs on what the calls allocate.
    result.background["before"] = _background()
    if result.background["before"]["pending"]:
        # work queued after the warm-up's settle (the one-call timings above; a decision asked
        # again on its clock): a tuner compiling and timing on this GPU during the rounds would
        # fall on some bursts and not others
        t0 = time.perf_counter()
        _settle(run_f, device)
        result.background["before"]["settle_s"] = round(time.perf_counter() - t0, 3)
        if not grad:  # (choices final only now: fuse's in-model checks run here, not timed)
            for _ in range(INFER_WARM_CALLS):
                run_o()
                run_f()
    gc.collect()
    gc.freeze()
    try:
        _rounds(run_o, run_f, device, rounds, calls, burst_calls, flush, samples)
    finally:
        gc.unfreeze()
    result.background["after"] = _background()
    med = lambda xs: statistics.median(xs) if xs else None
    result.timed_on, result.rounds, result.calls = device.type, rounds, burst_calls
    result.samples = {
        w: {k: [round(v, 4) for v in vs] for k, vs in d.items()} for w, d in samples.items()
    }
    o, f = samples["original"], samples["fused"]
    result.orig_ms, result.fused_ms = med(o["wall"]), med(f["wall"])
    result.orig_host_us, result.fused_host_us = med(o["host"]) * 1e3, med(f["host"]) * 1e3
    result.orig_device_ms, result.fused_device_ms = med(o["device"]), med(f["device"])
    result.ratio = paired_ratio(o["wall"], f["wall"])
    result.ratio_of_medians = result.orig_ms / result.fused_ms if result.fused_ms else None
    result.ratio_ci = ratio_interval(o["wall"], f["wall"])
    if result.orig_device_ms and result.fused_device_ms:
        result.device_ratio = result.orig_device_ms / result.fused_device_ms


def _rounds(run_o, run_f, device, rounds, calls, burst_calls, flush, samples) -> None:
    """The timed rounds (module docstring): SPLIT bursts per model per round, alternating, the
    order swapped each burst pair; device samples once per round, after that round's first pair
    of bursts, followed by one untimed burst of each model.

    No timed burst follows a device sample directly: the burst right after one ran slower. With
    each model's device sample taken right after its own burst, the fused model's bursts were the
    ones after a sample (the original's sample precedes the fused burst of the pair, the fused
    one precedes the next pair, which the fused model starts), and the H200's mlp256x4 training
    row read 0.87-0.92x in those two pairs of every four and 0.95-1.03x in the other two
    (session 31; back-to-back bursts without samples, in the same process: 1.00x)."""
    on_gpu = device.type == "cuda"
    models = (("original", run_o), ("fused", run_f))
    for r in range(rounds * SPLIT if on_gpu else rounds):
        # each round of SPLIT bursts starts with the other model than the round before (SPLIT is
        # even: with one order for all, the first timed burst after the samples, the next pair's,
        # would always be the same model's)
        order = models if (r // SPLIT) % 2 == 0 else models[::-1]
        pair = order if r % 2 == 0 else order[::-1]
        host_ms = {}
        for which, fn in pair:
            wall, host = _burst(fn, burst_calls, device, flush)
            samples[which]["wall"].append(wall)
            samples[which]["host"].append(host)
            host_ms[which] = host
        if on_gpu and r % SPLIT == 0:
            for which, fn in pair:
                flush.zero_()
                cycles = timing.sleep_cycles(host_ms[which] * 1e3)
                ms = timing.timed_calls(fn, min(calls, DEVICE_CALLS), None, cycles)
                samples[which]["device"].append(statistics.mean(ms))
            for _, fn in pair[::-1]:  # (the next pair's order)
                _burst(fn, burst_calls, device, flush)


def paired_ratio(orig: list[float], fused: list[float]) -> float | None:
    """The median over the burst pairs (the i-th burst of each model, run next to each other in one
    round) of orig / fused. A host that slows down for a while (H100 hosts: BERT's forward 1.9 ->
    3.3 ms within one run, session 29) moves both bursts of a pair, so their ratio keeps what the
    models differ by, where median / median mixes fast and slow periods unevenly."""
    ratios = _pair_ratios(orig, fused)
    return statistics.median(ratios) if ratios else None


def _pair_ratios(orig: list[float], fused: list[float]) -> list[float]:
    return [o / f for o, f in zip(orig, fused) if f > 0]


def ratio_interval(orig: list[float], fused: list[float], draws: int = 2000) -> list[float] | None:
    """[low, high]: the 2.5th and 97.5th percentiles of the paired ratio (paired_ratio) over `draws`
    resamples of the burst pairs. Seeded: a run's interval is reproducible from its samples. None
    for fewer than 4 pairs."""
    ratios_of_pairs = _pair_ratios(orig, fused)
    if len(ratios_of_pairs) < 4:
        return None
    rng = random.Random(0)
    n = len(ratios_of_pairs)
    ratios = []
    for _ in range(draws):
        ratios.append(statistics.median(ratios_of_pairs[rng.randrange(n)] for _ in range(n)))
    ratios.sort()
    return [ratios[int(0.025 * (draws - 1))], ratios[int(0.975 * (draws - 1))]]


# Inference calls of each model before timing: a fused owner's in-model check (fuse's
# AUDIT_WARM + 2 * AUDIT_PAIRS like calls) and its restore (RESTORE_AFTER more) happen in them, as
# in a user's first calls, not in the timed rounds.
INFER_WARM_CALLS = 64
SETTLE_S = 120.0  # at most this long waiting for background builds / Triton tuning


def _settle(fn, device) -> None:
    """Call the fused model until nothing auto waits for runs in the background (a CUDA family
    building, Triton's tuner), at most SETTLE_S: its decisions are then final, not the
    provisional ones of a fresh process, and a few more calls let auto and the fused modules
    decide again with every backend. A user's long-running model gets there the same way."""
    if triton_tune.background_pending():
        triton_tune.settle(lambda: (fn(), _sync(device)), SETTLE_S)
        for _ in range(3):
            fn()
        _sync(device)


def _background() -> dict:
    """Triton tuner processes running now, and whether anything auto waits for is pending."""
    return {"tuners": len(triton_tune.running()), "pending": triton_tune.background_pending()}


def rounds_for(rounds: int, burst_calls: int, call_ms: float, min_timed_s: float) -> int:
    """`rounds`, or more where they would time less than `min_timed_s` seconds of bursts (a
    round: SPLIT bursts of `burst_calls` calls of each model, `call_ms` each), up to MAX_ROUNDS;
    never fewer than asked."""
    if min_timed_s <= 0:
        return rounds
    round_s = 2 * SPLIT * burst_calls * call_ms / 1e3
    return max(rounds, min(MAX_ROUNDS, math.ceil(min_timed_s / max(round_s, 1e-9))))


def _wall_once(fn, device) -> float:
    """Milliseconds of one synchronised call."""
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return (time.perf_counter() - t0) * 1e3


def _burst(fn, calls: int, device, flush) -> tuple[float, float]:
    """(wall ms, host ms) per call of `calls` calls in a row after an L2 flush: wall up to the
    synchronise after the last, host up to the last call's return."""
    if flush is not None:
        flush.zero_()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    _sync(device)
    t2 = time.perf_counter()
    return (t2 - t0) / calls * 1e3, (t1 - t0) / calls * 1e3


# ---------------------------------------------------------------------------- JSON
def environment(device: str | torch.device | None = None) -> dict:
    """Where the run happened (the zoo's own: dualk.tools.bench's environment is the command line's
    layer, which the library does not import)."""
    dev = torch.device(
        device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "dualk": dualk.__version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "device": torch.cuda.get_device_name(dev)
        if dev.type == "cuda"
        else f"CPU ({platform.processor() or platform.machine()})",
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception as exc:
        env["triton"] = f"unavailable ({type(exc).__name__})"
    for package in ("transformers", "timm", "torchvision"):
        try:
            env[package] = __import__(package).__version__
        except Exception:
            env[package] = None
    return env


METHOD = {
    "ratio": "median over the rounds' burst pairs (the i-th burst of each model, run next to each "
    "other) of original wall ms / fused wall ms per call (> 1: fused is faster)",
    "ratio_of_medians": "median original wall / median fused wall (unpaired)",
    "ratio_ci": "95% bootstrap interval of the ratio: 2000 resamples of the burst pairs",
    "gc": "gc.collect() then gc.freeze() before the timed rounds (the objects of earlier rows out "
    "of the collector's scans), gc.unfreeze() after; the collector stays on",
    "wall": "N calls in a row after an L2 flush, then a synchronise; elapsed / N; median of rounds",
    "host": "the same loop up to the last call's return (enqueue time), before the synchronise, / N",
    "device": "CUDA events around each of min(N, 20) calls, each after a GPU sleep longer than its "
    "host time; L2 flushed before them; mean per call, median of rounds",
    "rounds": "original and fused alternate, the order swapped each round, in one process; with "
    "the default rounds, at least MIN_TIMED_S (2) s of bursts per row, up to MAX_ROUNDS (32)",
    "error": "rel_err = ||fused - orig|| / ||orig||; ok: fused's relative-norm error against a "
    "float64 (fp32 models) or float32 (16-bit) copy within 2x the original's + eps(dtype) "
    "(4 eps in fp32); train: output, loss and gradients before the first step",
    "train": "forward, loss = output.float().square().mean(), backward, SGD(lr=1e-6) step",
}


def to_json(results: Sequence[Result], env: dict | None = None) -> dict:
    """The run as a JSON-ready dict: environment, method, one entry per result."""
    device = next((r.device for r in results), None)
    return {
        "env": env if env is not None else environment(device),
        "method": METHOD,
        "results": [asdict(r) for r in results],
    }
