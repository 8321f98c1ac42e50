"""The autotuned backend="auto": time the candidates once per shape class and device, remember the
winner in memory and on disk. This module holds the decisions and composes the parts, each a
module of its own:

- dualk/dispatch/keys.py: the shape-class key (made by the operator's registry entry, `OpSpec.key`)
  and its text in the cache file;
- dualk/dispatch/measure.py: timing the candidates and picking the winner;
- dualk/dispatch/heuristic.py: the rules used when nothing may be timed;
- dualk/dispatch/store.py: the decision file on disk (fingerprint, lock, merge, recovery), also
  holding the Triton launchers' configs and dualk.module_choice's decisions.

`choose(spec, args)` (called by the dispatcher for "auto", with the positional arguments exactly
as `spec.implementation(name)(*args)` takes them) builds a key and looks it up in a dict; only a
miss does more:

1. Candidates: every backend that can run on the input's device (`dualk.backends
   .unavailable_reason`), torch included; never Triton's CPU interpreter, so on CPU tensors the
   only candidate is torch and nothing is timed or written.
2. The on-disk cache (store): a winner recorded there by any earlier process is used as is.
3. Timing (measure), unless it is not allowed now: each candidate once untimed, then a few
   timed passes within about TUNE_BUDGET_MS per key; the lowest score wins, near-ties going to
   the cheapest launch. A candidate that raises is skipped and recorded with its reason.
4. No timing under CUDA-graph capture, torch.compile or torch.jit tracing, or with
   DUALK_AUTOTUNE=0: the heuristic decides, and its choice is not recorded as tuned (the next
   call outside capture or tracing tunes). Nothing is started in the background then either.
5. Never waiting for a build (`backend_state`, README "First contact"): on a GPU, a CUDA
   family that is not built is not a candidate; the call that finds it so starts its build in a
   separate process (dualk/backends/cuda.py `auto_state`) and is decided among the others. Nor
   does any call spend Triton's compile and config search: a class's first timed decision in a
   process (no cache file entry) queues it for the background Triton tuner (a separate process,
   dualk/dispatch/triton_tune.py) and is decided without Triton; the class's first call after
   the tuner has finished it loads Triton's kernel (`triton_tune.loaded`: its config from the
   cache file, its kernel from Triton's cache) and the next decides again with Triton timed among
   the others; Triton's runs there are made under `triton_tune.no_config_search()`: a launch that
   would still search sends the class back to the tuner instead. A tuner that fails
   leaves the class to the others (the reason in explain). A decision made while a candidate was
   missing is provisional: kept in memory only (never in the cache file, nor in exact_hits, nor
   answered by `decided`), and decided again on the class's next call once the tuner is done
   with it (a waitpid and a stat), or once a build has finished (cuda.generation() changed: one
   waitpid per running builder on those calls). `dualk tune` (explicit) waits for builds and
   tunes Triton in the call instead.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect

import torch

from .. import backends
from ..backends import cuda
from ..registry import OpSpec
from . import store, triton_tune
from .heuristic import backend_for as heuristic

# Each `from .part import X as X` re-exports a part's public name, as callers knew it here before
# the parts moved out; patch a name where it is defined (dualk.dispatch.keys, .measure,
# .heuristic, .store, dualk.registry), not here.
from .keys import FIELDS as FIELDS
from .keys import KEY_FUNCTIONS as KEY_FUNCTIONS
from .keys import key_string as key_string
from .keys import make_key as make_key
from .measure import BURST_SHARE as BURST_SHARE
from .measure import MAX_REPS as MAX_REPS
from .measure import TIE_FRACTION as TIE_FRACTION
from .measure import TIE_US as TIE_US
from .measure import TUNE_BUDGET_MS as TUNE_BUDGET_MS
from .measure import TUNE_ROUNDS as TUNE_ROUNDS
from .measure import Timer as Timer
from .measure import cuda_event_timer as cuda_event_timer
from .measure import current_timer as current_timer
from .measure import pick as pick
from .measure import scores as scores
from .measure import set_timer as set_timer
from .measure import time_candidates
from .shared import timing_blocked as timing_blocked
from .shared import warned
from .store import BACKEND_SECTION as BACKEND_SECTION
from .store import CACHE_FILE_NAME as CACHE_FILE_NAME
from .store import SCHEMA as SCHEMA
from .store import TRITON_STORE as TRITON_STORE
from .store import AutotuneCacheWarning as AutotuneCacheWarning
from .store import SectionStore as SectionStore
from .store import TritonConfigStore as TritonConfigStore
from .store import cache_dir as cache_dir
from .store import cache_file as cache_file
from .store import fingerprint as fingerprint
from .store import read_cache_file as read_cache_file
from .store import source_files as source_files
from .store import source_hash as source_hash
from .store import store_for as store_for
from .store import triton_config_store as triton_config_store

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
_lock = store.LOCK  # the decision path and the cache files' in-memory copies share it
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
        store.for_device(device).reload()


triton_tune.READY_HOOKS.append(reload_cache)  # the tuner wrote a class's config into the file


def provisional(spec: OpSpec, args: tuple) -> bool:
    """Whether this call's class holds a provisional decision (a candidate still building)."""
    return spec.key(args) in _provisional


def provisional_now() -> dict[str, dict]:
    """Every decision of this process that is still provisional: {key text: {"backend",
    "pending": {backend: why, as recorded}, "triton_now": Triton's state of the class now}}
    (benchmarks report it: a decision that stays provisional keeps the modules above it asking)."""
    with _lock:
        return {
            str(key): {
                "backend": _memory.get(key),
                "pending": dict(entry["pending"]),
                "triton_now": triton_tune.state_of(key),
            }
            for key, entry in _provisional.items()
        }


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


def generation_guard() -> tuple:
    """generation() as it is now, as a guard (dualk/core/guards.py): (dict, key, value); the
    counter is rebound to a new int object whenever it changes."""
    return (globals(), "_generation", _generation)


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
        store.forget()
        warned.clear()


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
            if reason is None and name == "triton" and spec.kernel_limit is not None:
                # (before backend_state queues the class for the background tuner, which would
                # only fail on it: fused_mlp wider than 256 on a 2-GPU DDP run, session 27)
                reason = spec.kernel_limit(name, args)
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

        cache = store.for_device(device)
        entry = None if force else cache.get(BACKEND_SECTION, skey)
        if entry is not None and entry.get("winner") in available:
            return _remember(
                key,
                {
                    **base, "backend": entry["winner"], "source": "cache",
                    "times_us": dict(entry.get("times_us", {})),
                    "device_host_us": dict(entry.get("device_host_us", {})),
                    "rejected": {**entry.get("rejected", {}), **rejected},
                    "cache_file": str(cache.path),
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
            times, errors = time_candidates(spec, args, device, available)
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
        cache.put(
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
             "device_host_us": parts_us, "rejected": rejected, "cache_file": str(cache.path)},
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
