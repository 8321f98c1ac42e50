"""The autotuned backend="auto": time the candidates once per shape class and device, remember the
winner in memory and on disk.

`choose(spec, args)` (called by the dispatcher for "auto", with the positional arguments exactly
as `spec.implementation(name)(*args)` takes them) builds a key and looks it up in a dict; only a
miss does more:

1. Candidates: every backend that can run on the input's device (`dualk.backends
   .unavailable_reason`), torch included; never Triton's CPU interpreter, so on CPU tensors the
   only candidate is torch and nothing is timed or written.
2. The on-disk cache (below): a winner recorded there by any earlier process is used as is.
3. Timing, unless it is not allowed now: each candidate runs once untimed (Triton loads its
   tuned config and kernel, the CUDA extension loads), then a few repetitions timed with CUDA
   events within a budget of about TUNE_BUDGET_MS per key (fewer repetitions for slow candidates), in
   TUNE_ROUNDS passes that take the candidates in turn; each pass gives a candidate's device time
   (the interquartile mean of its samples) and host time (per call, over a burst of calls in a
   row); the median device time and the least host time over the passes make its score
   (`scores`: kernel time, plus launch time beyond the cheapest path's where that exceeds the
   kernel), and the lowest score wins; scores within 3% (at least 0.25 us) tie, and the tie
   goes to the cheapest launch (`pick`). A candidate that raises is skipped and recorded with
   its reason. Inputs are never modified (each implementation allocates fresh outputs).
4. No timing under CUDA-graph capture, torch.compile or torch.jit tracing, or with
   DUALK_AUTOTUNE=0: the
   heuristic below decides, and its choice is not recorded as tuned (the next call outside
   capture or tracing tunes). Nothing is started in the background then either.
5. Never waiting for a build (`backend_state`, README "First contact"): on a GPU, a CUDA
   family that is not built is not a candidate; the call that finds it so starts its build in a
   separate process (dualk/backends/cuda.py `auto_state`) and is decided among the others. Nor
   does any call spend Triton's compile and config search: a class's first timed decision in a
   process (no cache file entry) queues it for the background Triton tuner (a separate process,
   dualk/dispatch/triton_tune.py) and is decided without Triton; the class's first call after the tuner
   has finished it loads Triton's kernel (`triton_tune.loaded`: its config from the cache file,
   its kernel from Triton's cache) and the next decides again with Triton timed among the
   others; Triton's runs there are made under `triton_tune.no_config_search()`: a launch that
   would still search sends the class back to the tuner instead. A tuner that fails
   leaves the class to the others (the reason in explain). A decision made while a candidate was
   missing is provisional: kept in memory only (never in the cache file, nor in exact_hits, nor
   answered by `decided`), and decided again on the class's next call once the tuner is done
   with it (a waitpid and a stat), or once a build has finished (cuda.generation() changed: one
   waitpid per running builder on those calls). `dualk tune` (explicit) waits for builds and
   tunes Triton in the call instead.

Heuristic (measured on H100 and H200): torch for add/relu_scale (the CUDA kernels match its
bandwidth at large n but cost more host time at small n), matmul (cuBLAS wins most shapes) and
linear_gelu (cuBLASLt wins small M and square shapes; Triton only ties at 8192x768->3072 bf16);
for fused_mlp the CUDA fused kernel when every width is <= 128 and the batch is not empty
(fp32 seed model at B32/B4096, 16-bit 64/128 wide at B=2^20), or when the CUDA planner takes
its wide Hopper kernel (16-bit, widths 129-256: 3.0x eager at 256x3 bf16 on an H100), else torch
(eager beats the mma.sync kernel at 256 wide, 16-bit).

Key (shape class): made by the operator's registry entry (`OpSpec.key`, its fields named by
`OpSpec.key_fields`; the built-in operators' are in dualk/registry.py beside their shape cases);
its text in the cache file is dualk/dispatch/keys.py's `key_string`.

Disk: $DUALK_CACHE_DIR/autotune/ (default ~/.cache/dualk/autotune/), one JSON file per device
and software fingerprint (GPU name, compute capability, SM count, driver and CUDA versions,
torch, Triton, a hash of dualk's Python, Triton and CUDA sources): a new driver or an edited
kernel starts a new file. Sections: "backend" (the winners, with the times per candidate) and
"triton.<module>" (the Triton launchers' tuned configs, through triton_src.common.tuned_config).
Writes are atomic (temporary file + os.replace) and merge with the file's current content under
an advisory lock (fcntl.flock on <file>.lock), so concurrent processes lose nothing. A corrupt,
truncated or wrong-version file is moved aside (<file>.corrupt-<time>) with one
AutotuneCacheWarning and rebuilt; an unwritable directory gives one warning and the cache stays
in memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import hashlib
import inspect
import json
import os
import platform
import re
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import torch

from .. import backends
from ..backends import cuda
from ..core import timing
from ..core.errors import user_stacklevel
from ..core.layout import row_count
from ..registry import OpSpec
from . import triton_tune

# Re-exported: autotune.FIELDS, KEY_FUNCTIONS, make_key, key_string and timing_blocked, as before
# they moved below it.
from .keys import FIELDS as FIELDS
from .keys import KEY_FUNCTIONS as KEY_FUNCTIONS
from .keys import key_string as key_string
from .keys import make_key as make_key
from .shared import file_lock, timing_blocked, warned

SCHEMA = 1
# Timing budget per key, split among the candidates, flushes and sleeps included (the first call
# on an unseen class pays it plus one untimed run of each candidate: goal <= 100 ms).
TUNE_BUDGET_MS = 45.0
TUNE_ROUNDS = 3  # passes over the candidates (_measure)
MAX_REPS = 25
BURST_SHARE = 0.25  # of a timer call's budget: the back-to-back calls that give the host time
BACKEND_SECTION = "backend"

Timer = Callable[[Callable[[], object], str, float], "float | tuple[float, float]"]


class AutotuneCacheWarning(UserWarning):
    """The autotune cache file was unusable (set aside and rebuilt) or cannot be written."""


# PyTorch's TF32 switch, as the matrix ops' keys read it (dualk.registry: patch it there).
tf32_allowed = backends.tf32_allowed


# ---------------------------------------------------------------------------- state
_memory: dict[tuple, str] = {}  # key -> winner: the hit path
_details: dict[tuple, dict] = {}  # key -> how the winner was decided (explain)
_heuristics: dict[tuple, dict] = {}  # key -> the heuristic decision, while timing is blocked
# key -> {"pending": {backend: why}, "gen": cuda.generation()} for a decision made while a
# candidate was missing (module docstring, 5.); the hot path tests this dict's truth only.
_provisional: dict[tuple, dict] = {}
# Device types on which builds and Triton's background tuning apply (tests add "cpu").
BACKGROUND_DEVICE_TYPES: tuple[str, ...] = ("cuda",)
_lock = threading.RLock()
_timer: Timer | None = None
# The first-level table of the hit path: an exact signature of the call (dualk/ops.py builds it
# from values its checks already read; it determines the key) -> the winner remembered in
# _memory. Skips building the key: 0.8 -> 0.3 us per auto call on a CPU-only host
# (experiments/host_dispatch_cpu.py). Emptied whenever a decision is made or forgotten, so an
# entry is always _memory's answer; never rebound (dualk/ops.py holds a reference).
exact_hits: dict[tuple, str] = {}
EXACT_HITS_MAX = 4096  # exact shapes are many more than keys: emptied when it grows past this


def choose(spec: OpSpec, args: tuple) -> str:
    """The backend "auto" runs for `spec.implementation(name)(*args)`."""
    key = spec.key(args)
    name = _memory.get(key)
    if name is None or (_provisional and key in _provisional and _stale(key, spec, args)):
        name = _decide(spec, args, key, tune=True, revisit=True)["backend"]
    return name


def _stale(key: tuple, spec: OpSpec, args: tuple) -> bool:
    """Whether a provisional decision is due again: Triton's background tuner has finished this
    class (ready or failed: dualk/dispatch/triton_tune.py, a waitpid and a stat) and its kernel is loaded
    (`triton_tune.loaded`: the first call after ready loads it, the next decides, so that neither
    pays both), or a CUDA build finished since (poll_builds: a waitpid per running builder)."""
    entry = _provisional.get(key)
    if entry is None:
        return False
    pending = entry["pending"]
    if "triton" in pending and triton_tune.settled(key):
        # False when this call has just loaded Triton's kernel: the next call decides
        return triton_tune.loaded(spec, args, key)
    if "cuda" in pending:
        return _cuda_generation(poll=True) != entry["gen"]
    return False


def choose_exact(spec: OpSpec, args: tuple, sig: tuple) -> str:
    """choose(spec, args), remembered in exact_hits under `sig` when it is a remembered decision
    (not a heuristic answer under capture or tracing).

    `sig` is a cheap exact signature of args that the caller (dualk/ops.py) builds from values
    its checks already read; it must determine the key (an op tag, then every shape, stride or
    flag the key reads), so one entry never answers for another key. Callers look `sig` up in
    exact_hits themselves and call this on a miss, only when dispatch.auto_unforced(spec)."""
    key = spec.key(args)
    name = _memory.get(key)
    if name is None or (_provisional and key in _provisional and _stale(key, spec, args)):
        name = _decide(spec, args, key, tune=True, revisit=True)["backend"]
    with _lock:  # the decision is still the remembered one (not a heuristic, not provisional)
        if _memory.get(key) == name and key not in _provisional:
            if len(exact_hits) >= EXACT_HITS_MAX:
                exact_hits.clear()
            exact_hits[sig] = name
    return name


def explain(spec: OpSpec, args: tuple, *, tune: bool = True) -> dict:
    """How "auto" decides this call: {"op", "key", "device", "backend", "source", ...}.

    source: "tuned" (timed in this process; "times_us" per candidate), "cache" (recorded in the
    cache file by an earlier run; its "times_us"), "heuristic" ("rule", and "reason" why there is
    no timing) or "only candidate". "rejected" maps each other backend to why it is not a
    candidate (unavailable, or raised when tried). With tune=False a key that is not decided yet
    is not timed: the answer is the heuristic's, with "pending": True."""
    key = spec.key(args)
    with _lock:
        if key in _memory:
            return dict(_details[key])
        return _decide(spec, args, key, tune=tune)


def tune(spec: OpSpec, args: tuple, *, force: bool = False) -> dict:
    """Decide this call's class now, timing even with DUALK_AUTOTUNE=0 (for `dualk tune`); a
    class already decided is kept unless `force`. Returns explain()'s dict."""
    key = spec.key(args)
    with _lock:
        if force:
            exact_hits.clear()
            _memory.pop(key, None)
            _details.pop(key, None)
        elif key in _memory:
            return dict(_details[key])
        return _decide(spec, args, key, tune=True, force=force, explicit=True)


def _cuda_generation(poll: bool = False) -> int:
    """The CUDA backend's build generation (it changes when a family becomes ready or fails);
    with `poll`, running builders are reaped first (one waitpid each)."""
    return cuda.poll_builds() if poll else cuda.generation()


def build_generation(poll: bool = False) -> int:
    """Changes when a CUDA family or a class's background Triton tuning becomes ready or fails;
    with `poll`, running builders and the Triton tuner are polled first (a waitpid each).
    Decisions made while a candidate was missing compare it (dualk.module_choice)."""
    if poll:
        return _cuda_generation(poll=True) + triton_tune.poll()
    return _cuda_generation() + triton_tune.generation()


def reload_cache(device: torch.device) -> None:
    """Read the device's cache file again, keeping what this process knows (another process, the
    background Triton tuner, wrote to it)."""
    with _lock:
        _store_for(device).reload()


triton_tune.READY_HOOKS.append(reload_cache)  # the tuner wrote a class's config into the file


def provisional(spec: OpSpec, args: tuple) -> bool:
    """Whether this call's class holds a provisional decision (a candidate still building)."""
    return spec.key(args) in _provisional


def provisional_winner(spec: OpSpec, args: tuple) -> str | None:
    """The winner of this call's class while its decision is provisional (a candidate still
    building or tuning), else None."""
    key = spec.key(args)
    return _memory.get(key) if key in _provisional else None


def decided(spec: OpSpec, args: tuple) -> str | None:
    """The in-memory winner for this call's key, or None (nothing is timed or loaded; a
    provisional decision, made while a candidate was missing, is None too)."""
    key = spec.key(args)
    return None if key in _provisional else _memory.get(key)


def generation() -> int:
    """Changes whenever in-memory decisions are forgotten (callers that cache a decision check
    it)."""
    return _generation


_generation = 0
_clears = 0


def clears() -> int:
    """Changes whenever clear_memory() forgets everything (decisions kept elsewhere, such as
    dualk.module_choice's, are dropped with them)."""
    return _clears


def clear_memory() -> None:
    """Forget every in-memory decision and loaded cache file (tests)."""
    global _generation, _clears
    _generation += 1
    _clears += 1
    with _lock:
        exact_hits.clear()
        _memory.clear()
        _details.clear()
        _heuristics.clear()
        _provisional.clear()
        triton_tune.clear()
        _stores.clear()
        _warned.clear()


def set_timer(timer: Timer | None) -> None:
    """Replace the timer: `timer(run, backend, budget_ms)` -> microseconds per call, or a
    (device, host) pair of them; `run()` makes one call. None restores the CUDA-event timer.
    Tests pass a fake."""
    global _timer
    _timer = timer


def candidate_reason(backend: str, device: torch.device) -> str | None:
    """None when `backend` is a candidate for auto on `device`, else why not."""
    if backend == "triton" and device.type == "cpu":
        return "auto does not use Triton's CPU interpreter"
    return backends.unavailable_reason(backend, device)


def _device_of(args: tuple) -> torch.device:
    return args[0].device


def backend_state(
    name: str, spec: OpSpec, device: torch.device, start: bool
) -> tuple[str, str | None]:
    """("ok", None), ("pending", why: a candidate once its build finishes) or ("rejected", why)
    for a backend that candidate_reason admits. The CUDA backend on a GPU asks its family's
    state, starting its build in the background when `start` (never waiting for it)."""
    if name != "cuda" or device.type not in BACKGROUND_DEVICE_TYPES:
        return "ok", None
    state, why = cuda.auto_state(cuda.OP_FAMILY[spec.name], start=start)
    if state == "ready":
        return "ok", None
    if state in ("building", "not built"):
        return "pending", why
    return "rejected", why


def _takes_wide_mlp_kernel(args: tuple) -> bool:
    """Whether the CUDA planner gives this fused_mlp call the wide Hopper kernel (16-bit, 129-256
    wide, TMA-addressable operands: its own rule, asked rather than restated here)."""
    x, weights, biases, activation = args
    if not x.is_cuda:  # the extension takes CUDA tensors only
        return False
    try:
        with torch.cuda.device(x.device):
            kernel = cuda.fused_mlp_kernel(x, weights, biases, activation)
    except RuntimeError:  # the extension cannot say: the rule stays with torch
        return False
    return kernel is not None and "wide" in kernel


def heuristic(spec: OpSpec, args: tuple, available: list[str]) -> tuple[str, str]:
    """(backend, rule) without timing; see the module docstring."""
    if spec.name == "fused_mlp" and "cuda" in available:
        x, weights = args[0], args[1]
        widths = [x.shape[-1], *(w.shape[0] for w in weights)]
        if max(widths) <= 128 and row_count(x) > 0:
            return "cuda", (
                "fused_mlp with every width <= 128: the CUDA fused kernel (one launch) beats "
                "eager torch on H100/H200"
            )
        if max(widths) <= 256 and row_count(x) > 0 and _takes_wide_mlp_kernel(args):
            return "cuda", (
                "fused_mlp 129-256 wide, 16-bit, on Hopper: the CUDA planner takes the wide "
                "one-launch kernel (3.0x eager at 256x3 bf16, B=2^18, H100)"
            )
        return "torch", (
            "fused_mlp wider than 128 off the wide kernel, or empty: eager torch (beats the "
            "mma.sync kernel at 256 wide, 16-bit)"
        )
    rules = {
        "matmul": "matmul: cuBLAS (torch) wins most shapes on H100/H200",
        "linear_gelu": "linear_gelu: cuBLASLt (torch) wins small M and square shapes on H100/H200",
        "fused_mlp": "fused_mlp without the CUDA backend: torch",
        "linear_glu": "linear_glu: not measured on a GPU yet: PyTorch's GEMMs (torch)",
    }
    return "torch", rules.get(
        spec.name,
        f"{spec.name}: torch matches the dualk kernels' bandwidth at large n and costs less host "
        "time at small n",
    )


def _decide(
    spec, args, key, *, tune: bool, force: bool = False, explicit: bool = False,
    revisit: bool = False,
) -> dict:  # fmt: skip
    with _lock:
        if revisit and key in _provisional:  # a provisional decision is due again
            exact_hits.clear()
            _memory.pop(key, None)
            _details.pop(key, None)
            _provisional.pop(key, None)
        if not force and key in _memory:
            return dict(_details[key])
        # Timing blocked (DUALK_AUTOTUNE=0 for the whole run): a decided heuristic is cheap.
        cached = _heuristics.get(key)
        if cached is not None and tune and not explicit:
            blocked = timing_blocked()
            if blocked is not None:
                return {**cached, "reason": f"not timed: {blocked}"}
        device = _device_of(args)
        blocked = timing_blocked()
        if explicit and blocked == "DUALK_AUTOTUNE=0":
            blocked = None
        rejected: dict[str, str] = dict(spec.missing)  # backends without this operator
        pending: dict[str, str] = {}  # candidates that will come (a build running, Triton)
        available = []
        for name in spec.backends:
            reason = candidate_reason(name, device)
            if reason is None and not explicit:  # `dualk tune` waits for builds instead
                state, why = backend_state(name, spec, device, start=tune and blocked is None)
                if state == "pending":
                    pending[name] = why
                    continue
                reason = why
            if reason is None:
                available.append(name)
            else:
                rejected[name] = reason
        skey = key_string(key)
        base = {"op": spec.name, "key": skey, "device": str(device), "rejected": rejected}
        if pending:
            base["pending_backends"] = dict(pending)
        if len(available) <= 1 and not pending:
            only = available[0] if available else "torch"
            return _remember(key, {**base, "backend": only, "source": "only candidate"})

        store = _store_for(device)
        entry = None if force else store.get(BACKEND_SECTION, skey)
        if entry is not None and entry.get("winner") in available:
            return _remember(
                key,
                {
                    **base, "backend": entry["winner"], "source": "cache",
                    "times_us": dict(entry.get("times_us", {})),
                    "device_host_us": dict(entry.get("device_host_us", {})),
                    "rejected": {**entry.get("rejected", {}), **rejected},
                    "cache_file": str(store.path),
                },
            )  # fmt: skip

        if blocked is not None or not tune:
            cached = _heuristics.get(key)
            if cached is None:
                name, rule = heuristic(spec, args, available)
                cached = {**base, "backend": name, "source": "heuristic", "rule": rule}
                _heuristics[key] = cached
            out = dict(cached)
            if blocked is not None:
                out["reason"] = f"not timed: {blocked}"
            else:
                out["pending"] = True
                out["reason"] = f"not tuned yet: the first call times {', '.join(available)}"
            return out

        # Triton joins once the background tuner has compiled and tuned this class (module
        # docstring; dualk/dispatch/triton_tune.py): until then it is pending, queued here.
        background = not explicit and device.type in BACKGROUND_DEVICE_TYPES
        if "triton" in available and background:
            state, why = triton_tune.auto_state(spec, args, key, start=True)
            if state != "ready":
                available.remove("triton")
                if state == "pending":
                    pending["triton"] = why
                    base["pending_backends"] = dict(pending)
                else:
                    rejected["triton"] = why
        if len(available) <= 1:  # the others are coming: this one serves until then
            only = available[0] if available else "torch"
            return _remember(key, {**base, "backend": only, "source": "only candidate"}, pending)

        with triton_tune.no_config_search() if background else contextlib.nullcontext():
            times, errors = _measure(spec, args, device, available)
        if triton_tune.is_deferral(errors.get("triton")):
            # Its run here would have searched configs (a launch unlike the tuned one): back to
            # the background tuner with this call, decided among the others meanwhile.
            state, why = triton_tune.requeue(spec, args, key)
            if state == "pending":
                del errors["triton"]
                pending["triton"] = why
                base["pending_backends"] = dict(pending)
            else:
                errors["triton"] = why
        rejected = {**rejected, **errors}
        if not times:  # every candidate raised: the call itself will say why
            winner = "torch"
            return {**base, "backend": winner, "source": "heuristic", "rejected": rejected,
                    "rule": "every candidate raised when tried"}  # fmt: skip
        winner = pick(times)
        times_us = {name: round(t[0], 3) for name, t in times.items()}
        # What each score was made of (a real timer's device median, least host time): explain.
        parts_us = {name: [round(t[1], 3), round(t[2], 3)] for name, t in times.items()
                    if (t[1], t[2]) != (t[0], t[0])}  # fmt: skip
        if pending:  # provisional: in memory only, decided again when the others come
            return _remember(
                key,
                {**base, "backend": winner, "source": "tuned", "times_us": times_us,
                 "device_host_us": parts_us, "rejected": rejected},
                pending,
            )  # fmt: skip
        store.put(
            BACKEND_SECTION,
            skey,
            {
                "winner": winner, "times_us": times_us, "device_host_us": parts_us,
                "rejected": errors,
                "tuned_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds"),
            },
        )  # fmt: skip
        _heuristics.pop(key, None)
        return _remember(
            key,
            {**base, "backend": winner, "source": "tuned", "times_us": times_us,
             "device_host_us": parts_us, "rejected": rejected, "cache_file": str(store.path)},
        )  # fmt: skip


def _remember(key: tuple, details: dict, pending: dict | None = None) -> dict:
    """Remember a decision; with `pending` (candidates still to come) as provisional."""
    global _generation
    _generation += 1  # a new or changed decision: cached ones elsewhere are checked again
    exact_hits.clear()
    if pending:
        details = {**details, "provisional": True, "pending_backends": dict(pending)}
        _provisional[key] = {"pending": dict(pending), "gen": _cuda_generation()}
    else:
        _provisional.pop(key, None)
    _details[key] = details
    _memory[key] = details["backend"]
    return dict(details)


def _measure(
    spec, args, device, available
) -> tuple[dict[str, tuple[float, float, float]], dict[str, str]]:
    """Each candidate's (score, device, host) times (`scores`) from, over TUNE_ROUNDS passes, the
    median of each pass's device time (interquartile mean) and the least of its host times
    (per call over a burst). The passes take the candidates in turn, so that the GPU's clock
    drift during tuning falls on all of them alike (timed one after the other, 8192^3 GEMMs 5-9%
    apart were ranked by whichever ran first on a cool GPU)."""
    timer = _timer or cuda_event_timer
    budget = TUNE_BUDGET_MS / len(available) / TUNE_ROUNDS
    runs: dict[str, Callable[[], object]] = {}
    errors: dict[str, str] = {}
    guard = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with guard:
        for name in available:
            fn = spec.implementation(name)

            def run(fn=fn):
                return fn(*args)

            try:
                run()  # untimed: compiles, builds, tunes Triton configs
                runs[name] = run
            except Exception as exc:  # any failure only removes this candidate
                errors[name] = f"raised {type(exc).__name__}: {str(exc)[:300]}"
        passes: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
        for _ in range(TUNE_ROUNDS):
            for name, run in runs.items():
                if name in errors:
                    continue
                try:
                    measured = timer(run, name, budget)
                    if not isinstance(measured, (tuple, list)):  # one number (a fake timer)
                        measured = (measured, measured)
                    passes[name].append((float(measured[0]), float(measured[1])))
                except Exception as exc:
                    errors[name] = f"raised {type(exc).__name__}: {str(exc)[:300]}"
    # Host time: the least over the passes, since host noise (another thread, an interrupt, a
    # page fault) only ever adds time. The median needed two quiet bursts of three: on an H100
    # whose host was busy, cuBLASLt's linear_gelu 32x768->3072 bf16 read 47.3 us per call against
    # dualk's CUDA 33.5 (the bench's 200-call bursts: 30.0 and 36.1), and auto ran the CUDA
    # kernel, 14.3 us on the GPU against 9.25 (`dualk bench`, default suite).
    parts = {
        name: (statistics.median(p[0] for p in ps), min(p[1] for p in ps))
        for name, ps in passes.items() if name not in errors
    }  # fmt: skip
    return scores(parts), errors


# Scores this close to the lowest are a tie (the CUDA-event timings of a 2-10 us call scatter by
# ~0.5-0.9 us between modes on an H100), and the tie goes to the cheaper launch.
TIE_FRACTION = 0.03
TIE_US = 0.25


def pick(times: dict[str, tuple[float, float, float]]) -> str:
    """The winner among (score, device, host) times: the lowest score, unless another scores
    within the tie margin with less host time (then the cheapest launch among the tied)."""
    best = min(times.values())[0]
    margin = max(TIE_FRACTION * best, TIE_US)
    tied = [name for name, t in times.items() if t[0] <= best + margin]
    return min(tied, key=lambda name: (times[name][2], times[name][0]))


def scores(parts: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float, float]]:
    """(score, device, host) microseconds per candidate from its (device, host) times.

    score = max(device, host - the lowest host time among the candidates). The host time that
    the cheapest launch path needs is paid whichever candidate runs, so it does not rank them;
    what a candidate needs beyond it counts once it exceeds the candidate's own kernel time (the
    GPU would then wait for the launch). So launch-bound calls are ranked by their kernels unless
    one path's launch is far slower (the Triton GEMM's ~40-80 us on a slow host). Scoring by
    max(device, host) instead ranked launch-bound calls by host-time noise: on an H100 whose host
    took 21-39 us per GEMM call, auto ran dualk's CUDA linear_gelu at 32x768->3072 bf16 (device
    14.6 us, host 27.5) over cuBLASLt's fused epilogue (9.1 us, host 28.7), 1.48x slower on the
    GPU (`dualk bench`, default suite, auto against the best path)."""
    if not parts:
        return {}
    floor = min(host for _, host in parts.values())
    return {
        name: (max(device, host - floor), device, host) for name, (device, host) in parts.items()
    }


# Microseconds of GPU sleep queued before each timed call at the least (with the flush, well past
# a fast call's host time; a slow launch gets more: timing.sleep_cycles).
_MIN_SLEEP_US = 100.0


def _l2_flush_buffer() -> torch.Tensor | None:
    """Scratch bytes on the current GPU, twice its L2, whose zeroing before a timed call evicts
    the operands from L2; None where that memory cannot be had (then timing runs L2-warm)."""
    device = torch.cuda.current_device()
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 << 20
    try:
        return torch.empty(2 * l2, dtype=torch.uint8, device=device)
    except RuntimeError:  # torch.cuda.OutOfMemoryError is one
        return None


def cuda_event_timer(
    run: Callable[[], object], backend: str, budget_ms: float
) -> tuple[float, float]:
    """Microseconds per call (the interquartile mean of the device times; the host time per call
    of a burst of back-to-back calls); `scores` ranks the candidates by them. Device time: CUDA
    events around the call, each call after an L2 flush and a GPU sleep that outlasts the call's
    host time (at least _MIN_SLEEP_US, more for a slow launch path: `timing`), so the window
    holds the kernels only and they start from a cold L2, as `dualk bench` measures and as in a
    model whose other layers evict this call's operands (timed L2-warm, add 2^20 fp32 and
    linear_gelu 32x768->3072 fp32 picked kernels that lose once the 4-9 MB operands come from
    HBM); host time: wall clock per call
    over 1 to MAX_REPS calls in a row (up to BURST_SHARE of `budget_ms`), without
    synchronising. As many timed calls as fit the rest of `budget_ms` after one probe (1 to
    MAX_REPS)."""
    flush = _l2_flush_buffer()
    torch.cuda.synchronize()
    flushed, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    flushed.record()
    if flush is not None:
        flush.zero_()
    start.record()
    t0 = time.perf_counter()
    run()
    probe_host_us = (time.perf_counter() - t0) * 1e6
    end.record()
    end.synchronize()
    probe = start.elapsed_time(end)
    cycles = timing.sleep_cycles(probe_host_us, at_least_us=_MIN_SLEEP_US)
    # A repetition costs its flush and sleep too (0.15-0.3 ms for a launch-bound call): counted,
    # so the budget holds (counting the kernel alone, a first call cost 96 ms on an H100).
    rep_ms = probe + flushed.elapsed_time(start) + timing.sleep_ms(cycles)
    # Host time from back-to-back calls, as `dualk bench` reports it and a model issues them:
    # each call isolated behind a flush and a sleep measured cuBLAS's matmul 1024^3 fp16 at
    # 46.8 us of host on an H100 (12.3 us back to back), and auto ran dualk's slower kernel.
    # The burst takes up to BURST_SHARE of the budget (at least one call), timed calls the rest.
    call_ms = max(probe, probe_host_us / 1e3, 1e-3)  # one call in a row
    calls = int(max(1, min(MAX_REPS, BURST_SHARE * budget_ms / call_ms)))
    left_ms = budget_ms - calls * call_ms
    reps = int(max(1, min(MAX_REPS, left_ms / max(rep_ms, call_ms))))
    device = timing.timed_calls(run, reps, flush, cycles)
    return timing.interquartile_mean(device) * 1e3, timing.burst_host_ms(run, calls) * 1e3


# ---------------------------------------------------------------------------- fingerprint
_source_hash: list[str] = []
_device_fingerprints: dict[str, dict] = {}


def source_files() -> list[Path]:
    """dualk's Python files, the Triton sources and the CUDA sources (the dualk source hash)."""
    package = Path(__file__).resolve().parents[1]  # dualk/, with its layer subpackages
    subpackages = sorted(d for d in package.iterdir() if (d / "__init__.py").is_file())
    dirs = [package, *subpackages, cuda.source_dir()]
    try:
        found = find_spec("dualk.triton_src")
        if found is not None and found.submodule_search_locations:
            dirs.append(Path(next(iter(found.submodule_search_locations))))
    except (ImportError, ValueError):
        pass
    dirs.append(package.parent / "triton_src")
    files = {}
    for d in dirs:
        if d.is_dir():
            for p in d.iterdir():
                if p.is_file() and p.suffix in (".py", ".cu", ".cuh", ".h", ".cpp"):
                    files[p.resolve()] = p
    return sorted(files, key=lambda p: (p.parent.name, p.name))


def source_hash() -> str:
    """sha256 (16 hex digits) of the source files' names and contents, once per process."""
    if not _source_hash:
        h = hashlib.sha256()
        for p in source_files():
            h.update(f"{p.parent.name}/{p.name}\0".encode())
            with contextlib.suppress(OSError):
                h.update(p.read_bytes())
        _source_hash.append(h.hexdigest()[:16])
    return _source_hash[0]


def _driver_version() -> str | None:
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() == 0:
            try:
                buf = ctypes.create_string_buffer(96)
                if nvml.nvmlSystemGetDriverVersion(buf, 96) == 0:
                    return buf.value.decode()
            finally:
                nvml.nvmlShutdown()
    except (OSError, AttributeError):
        pass
    try:
        version = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0:
            return f"cuda {version.value // 1000}.{version.value % 1000 // 10}"
    except (OSError, AttributeError):
        pass
    return None


def _package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except Exception:  # not installed
        return None


def fingerprint(device: torch.device) -> dict:
    """What a cache file's times are valid for, per torch device (cached per process)."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    name = str(device)
    fp = _device_fingerprints.get(name)
    if fp is None:
        if device.type == "cuda":
            p = torch.cuda.get_device_properties(device)
            fp = {
                "device": p.name, "capability": f"{p.major}.{p.minor}",
                "sms": p.multi_processor_count, "driver": _driver_version(),
                "cuda": torch.version.cuda,
            }  # fmt: skip
        else:
            fp = {"device": device.type, "machine": platform.machine()}
        fp.update(
            torch=torch.__version__, triton=_package_version("triton"), dualk_source=source_hash()
        )
        _device_fingerprints[name] = fp
    return fp


def cache_dir() -> Path:
    """$DUALK_CACHE_DIR/autotune (default ~/.cache/dualk/autotune)."""
    return cuda.cache_root() / "autotune"


# The cache's files: the cache itself (cache_file), its lock, one moved aside as corrupt, a write
# in progress. `dualk cache show` / `clear` know dualk's own files by CACHE_FILE_NAME.
def _lock_name(name: str) -> str:
    return f"{name}.lock"


def _aside_name(name: str) -> str:
    return f"{name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def _write_name(name: str) -> str:
    return f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"


CACHE_FILE_NAME = re.compile(
    r"\.?[a-z0-9.-]+-[0-9a-f]{12}\.json(\.lock|\.corrupt-[0-9-]+|\.\d+\.\d+\.tmp)?"
)


def cache_file(device: torch.device) -> Path:
    fp = fingerprint(device)
    digest = hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:12]
    label = "".join(c if c.isalnum() else "-" for c in str(fp["device"]).lower()).strip("-")
    if "capability" in fp:
        label += f"-cc{fp['capability']}-{fp['sms']}sm"
    return cache_dir() / f"{label}-{digest}.json"


# ---------------------------------------------------------------------------- disk
_stores: dict[tuple[Path, str], _Store] = {}
_warned = warned  # dualk.dispatch.shared's: the DUALK_AUTOTUNE flag's warnings and the cache's


def _warn_once(kind: str, path: Path, message: str) -> None:
    if (kind, str(path)) not in _warned:
        _warned.add((kind, str(path)))
        warnings.warn(message, AutotuneCacheWarning, stacklevel=user_stacklevel())


def _store_for(device: torch.device) -> _Store:
    path = cache_file(device)
    fp = fingerprint(device)
    key = (path, json.dumps(fp, sort_keys=True))
    store = _stores.get(key)
    if store is None:
        store = _stores[key] = _Store(path, fp)
    return store


class _Store:
    """One cache file: its entries in memory, merged into the file on every write."""

    def __init__(self, path: Path, fp: dict):
        self.path = path
        self.fingerprint = fp
        self.entries: dict[str, dict[str, Any]] = {}
        self.loaded = False
        self.writable = True

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(_lock_name(self.path.name))

    def _parse(self, raw: bytes) -> tuple[dict | None, str | None]:
        """(entries, None) for a valid file, else (None, what is wrong)."""
        try:
            data = json.loads(raw)
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            return None, f"not valid JSON ({exc})"
        if not isinstance(data, dict):
            return None, "not a JSON object"
        if data.get("schema") != SCHEMA:
            return None, f"schema {data.get('schema')!r}, this dualk reads {SCHEMA}"
        if data.get("fingerprint") != self.fingerprint:
            return None, "its fingerprint does not match its name"
        entries = data.get("entries")
        if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
            return None, "'entries' is not a table of tables"
        return entries, None

    def _read(self, locked: bool) -> dict:
        """The file's entries ({} when absent). A bad file is moved aside (under the lock) with
        one warning."""
        try:
            raw = self.path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):  # absent (or the directory is a file)
            return {}
        except OSError as exc:
            _warn_once("read", self.path, f"cannot read the autotune cache {self.path}: {exc}")
            return {}
        entries, problem = self._parse(raw)
        if problem is None:
            return entries
        if not locked:  # confirm under the lock: another process may be replacing it
            try:
                with file_lock(self.lock_path):
                    return self._read(locked=True)
            except OSError:
                return {}
        aside = self.path.with_name(_aside_name(self.path.name))
        try:
            os.replace(self.path, aside)
            where = f"moved it to {aside.name}"
        except FileNotFoundError:
            return {}
        except OSError as exc:
            where = f"could not move it aside ({exc})"
        _warn_once(
            "corrupt",
            self.path,
            f"dualk autotune cache {self.path} is unusable ({problem}); {where} and starting a "
            "new one",
        )
        return {}

    def _load(self) -> None:
        if not self.loaded:
            self.loaded = True
            for section, table in self._read(locked=False).items():
                self.entries.setdefault(section, {}).update(table)

    def get(self, section: str, key: str) -> Any:
        self._load()
        return self.entries.get(section, {}).get(key)

    def items(self) -> dict[str, dict[str, Any]]:
        self._load()
        return self.entries

    def reload(self) -> None:
        """Read the file again: its entries, then what this process holds that it lacks."""
        known = self.entries
        self.entries = {}
        self.loaded = False
        self._load()
        for section, table in known.items():
            target = self.entries.setdefault(section, {})
            for k, v in table.items():
                target.setdefault(k, v)

    def put(self, section: str, key: str, value: Any) -> None:
        self._load()
        self.entries.setdefault(section, {})[key] = value
        if not self.writable:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with file_lock(self.lock_path):
                # Union of the file (what other processes wrote) and what this process knows.
                merged = {sec: dict(table) for sec, table in self._read(locked=True).items()}
                for sec, table in self.entries.items():
                    target = merged.setdefault(sec, {})
                    for k, v in table.items():
                        target.setdefault(k, v)
                merged[section][key] = value
                self.entries = {sec: dict(table) for sec, table in merged.items()}
                data = {"schema": SCHEMA, "fingerprint": self.fingerprint, "entries": merged}
                tmp = self.path.with_name(_write_name(self.path.name))
                try:
                    with open(tmp, "w") as f:
                        json.dump(data, f, indent=1, sort_keys=True)
                        f.flush()
                        os.fsync(f.fileno())
                    os.replace(tmp, self.path)
                finally:
                    with contextlib.suppress(OSError):
                        tmp.unlink()
        except OSError as exc:
            self.writable = False
            _warn_once(
                "write",
                self.path,
                f"cannot write the autotune cache under {self.path.parent} ({exc}); tuning "
                "results stay in memory for this process",
            )


def read_cache_file(path: Path) -> dict:
    """A cache file's raw content (for `dualk cache show`); raises ValueError when unusable."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        raise ValueError("not a dualk autotune cache file")
    return data


class SectionStore:
    """One named section of the cache file of a device (for decisions other than the operators'
    backends: dualk.module_choice's "module.<mode>"), under the same lock and merge."""

    def __init__(self, device: torch.device):
        self.device = device

    def get(self, section: str, key: str) -> Any:
        with _lock:
            return _store_for(self.device).get(section, key)

    def put(self, section: str, key: str, value: Any) -> None:
        with _lock:
            _store_for(self.device).put(section, key, value)


def store_for(device: torch.device) -> SectionStore:
    """The cache file of `device`, by section."""
    return SectionStore(device)


def current_timer() -> Timer:
    """The timer in force (set_timer's, else the CUDA-event timer)."""
    return _timer or cuda_event_timer


# ---------------------------------------------------------------------------- Triton configs
class TritonConfigStore:
    """The Triton launchers' tuned configs (triton_src.common.tuned_config) in the same cache
    files, section "triton.<namespace>": {class key: {"config": [...], "timings_ms": [[ms,
    [...]], ...]}}."""

    def get(self, device: torch.device, namespace: str, key: str) -> list | None:
        with _lock:
            value = _store_for(device).get(f"triton.{namespace}", key)
        try:
            timings = [(float(ms), tuple(cfg)) for ms, cfg in value["timings_ms"]]
            best = tuple(value["config"])
        except (TypeError, KeyError, ValueError):
            return None
        if not timings or timings[0][1] != best:
            return [(0.0, best)]
        return timings

    def put(self, device: torch.device, namespace: str, key: str, timings: list) -> None:
        value = {
            "config": list(timings[0][1]),
            "timings_ms": [[round(float(ms), 5), list(cfg)] for ms, cfg in timings],
        }
        with _lock:
            _store_for(device).put(f"triton.{namespace}", key, value)


TRITON_STORE = TritonConfigStore()


def triton_config_store() -> TritonConfigStore:
    return TRITON_STORE


# ---------------------------------------------------------------------------- CLI helpers
def implementation_args(spec: OpSpec, args: tuple, kwargs: dict) -> tuple:
    """A registry Sample's (args, kwargs) as the positional tuple the implementations take."""
    bound = inspect.signature(spec.reference).bind(*args, **kwargs)
    bound.apply_defaults()
    out = []
    for name, value in bound.arguments.items():
        if name in ("alpha", "scale"):
            value = float(value)
        elif name in ("weights", "biases"):
            value = list(value)
        out.append(value)
    return tuple(out)
