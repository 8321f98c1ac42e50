"""Which backend runs a call.

Precedence, first match wins (README has the same table; tests/test_dispatch.py checks it):
  1. the call's own `backend=` argument, when it is not "auto"
  2. DUALK_BACKEND_<OP> (e.g. DUALK_BACKEND_RELU_SCALE=triton), read at call time
  3. DUALK_BACKEND, read at call time
  4. the innermost `with dualk.use_backend(name):` scope (per thread / task)
  5. the process-wide default from `dualk.set_default_backend(name)`
  6. the config file's [backend] table: the operator's key, then "default" (dualk/dispatch/config.py)
  7. "auto"
A named backend (from any of 1-6) that cannot run this call is an error that says why. "auto"
asks dualk/dispatch/autotune.py: the winner of timing every available backend (torch included) once per
shape class and device, remembered in memory and on disk; a documented heuristic where timing is
not allowed (CUDA-graph capture, torch.compile tracing, DUALK_AUTOTUNE=0).

This module runs only when a call executes (the eager route, or inside the registered op's
implementation), never while torch.compile traces: see dualk/ops.py.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from ..backends import BACKENDS, cuda, unavailable_reason
from ..core.errors import BackendUnavailableError, UnknownBackendError
from ..core.guards import Guards
from ..registry import OpSpec
from . import autotune, config, keys, triton_tune

BACKEND_NAMES = (*BACKENDS, "auto")

# os.environ.get costs ~0.6 us on a miss (it encodes the key and catches a KeyError); two of them
# were a third of dispatch. On POSIX, os.environ keeps its live bytes dict in _data: look there.
_ENV_BYTES = getattr(os.environ, "_data", None) if os.name == "posix" else None


def _getenv(name: str) -> str | None:
    if _ENV_BYTES is None:
        return os.environ.get(name)
    raw = _ENV_BYTES.get(name.encode())
    return None if raw is None else os.fsdecode(raw)


_scoped: contextvars.ContextVar[str | None] = contextvars.ContextVar("dualk_backend", default=None)
_scoped_get = _scoped.get  # bound once: auto_unforced runs on every auto call
_process_default: str | None = None


def check_name(name: object, source: str) -> str:
    if name not in BACKEND_NAMES:
        raise UnknownBackendError(
            f"unknown backend {name!r} (from {source}); valid names: {', '.join(BACKEND_NAMES)}"
        )
    return name  # type: ignore[return-value]


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Within the block, operators without an explicit backend (and no environment override)
    use `name`."""
    token = _scoped.set(check_name(name, "use_backend()"))
    try:
        yield
    finally:
        _scoped.reset(token)


def set_default_backend(name: str | None) -> None:
    """Process-wide default below use_backend scopes; None removes it."""
    global _process_default
    _process_default = None if name is None else check_name(name, "set_default_backend()")


def requested(spec: OpSpec, backend: str) -> tuple[str, str]:
    """(backend name, where it came from) by the precedence above, before availability."""
    if backend != "auto":
        return check_name(backend, "the backend= argument"), "the backend= argument"
    var = spec.env_var
    value = _getenv(var) or _getenv(var := "DUALK_BACKEND")
    if value:
        return check_name(value, var), var
    value = _scoped.get()
    if value is not None:
        return value, "use_backend()"
    if _process_default is not None:
        return _process_default, "set_default_backend()"
    table = config.backend_defaults()
    for key in (spec.name, "default"):
        if key in table:
            return check_name(table[key], f"config {config.loaded_from()} [{key}]"), "config"
    return "auto", "default"


def auto_candidates(
    spec: OpSpec, device: torch.device, dtype: torch.dtype | None = None
) -> list[tuple[str, str | None]]:
    """(backend, reason it cannot run or None) in the operator's fallback order for `dtype`.
    Auto never picks Triton's CPU interpreter: it is for tests, not speed."""
    out = []
    for name in spec.auto_order if dtype is None else spec.auto_order_for(dtype):
        if name == "triton" and device.type == "cpu":
            out.append((name, "auto does not use Triton's CPU interpreter"))
        else:
            out.append((name, unavailable_reason(name, device)))
    return out


def _first_tensor(args: tuple) -> torch.Tensor:
    return args[0]


def auto_unforced(spec: OpSpec) -> bool:
    """True when nothing overrides "auto" for `spec` right now (no environment variable, scope,
    process default or config entry): a cached auto decision may stand."""
    # The config table is read through its cache (config.backend_defaults() only on the first
    # call): one function call less per auto call.
    return (
        _process_default is None
        and _scoped_get() is None
        and _ENV_BYTES is not None
        and spec.env_key not in _ENV_BYTES
        and b"DUALK_BACKEND" not in _ENV_BYTES
        and not (config.loaded if config.loaded is not None else config.backend_defaults())
    )


def unforced_guards(spec: OpSpec) -> Guards | None:
    """auto_unforced(spec)'s state as guards (dualk/core/guards.py) that hold while nothing
    overrides "auto" for `spec`, or None where something does now: no process default, no scope
    (in any context: the context variable is read on every check), neither environment variable,
    the config's [backend] table the one read and empty."""
    if not auto_unforced(spec):
        return None
    table = config.backend_defaults()  # (the loaded table: auto_unforced has read it)
    guards = Guards()
    guards.identities += [(globals(), "_process_default", None), (vars(config), "loaded", table)]
    guards.absent += [(_ENV_BYTES, spec.env_key), (_ENV_BYTES, b"DUALK_BACKEND")]
    guards.empty.append(table)
    guards.calls.append((_scoped_get, None))
    return guards


def choose(spec: OpSpec, backend: str, args: tuple) -> str:
    """The backend that runs `spec`'s implementation on `args` (its positional arguments);
    raises when a named one cannot. "auto" asks the autotuner (dualk/dispatch/autotune.py)."""
    if backend == "auto":
        if auto_unforced(spec):  # the common call: no tuple building
            return autotune.choose(spec, args)
    elif backend in BACKENDS:  # the argument wins over every other source: requested()'s answer
        reason = spec.missing_reason(backend) or unavailable_reason(
            backend, _first_tensor(args).device, spec.name
        )
        if reason is None:
            return backend
        raise BackendUnavailableError(
            f"dualk.{spec.name}: backend {backend!r} (requested by the backend= argument) cannot "
            f"run: {reason}"
        )
    name, source = requested(spec, backend)
    if name == "auto":
        return autotune.choose(spec, args)
    reason = spec.missing_reason(name) or unavailable_reason(
        name, _first_tensor(args).device, spec.name
    )
    if reason is not None:
        raise BackendUnavailableError(
            f"dualk.{spec.name}: backend {name!r} (requested by {source}) cannot run: {reason}"
        )
    return name


def explain(spec: OpSpec, backend: str, args: tuple) -> Explanation:
    """What choose() would do for these arguments, and why (runs no kernel)."""
    like = _first_tensor(args)
    name, source = requested(spec, backend)
    notes: list[str] = []
    if name == "auto":
        availability = dict(auto_candidates(spec, like.device, like.dtype))
        info = autotune.explain(spec, args, tune=False)  # explain runs no kernel
        chosen = info["backend"]
        source = f"auto, {info['source']}"
        if info.get("pending"):
            notes.append("this shape class is not tuned yet: the first call times the candidates")
        for cand, reason in info.get("rejected", {}).items():
            availability[cand] = reason
        for cand, reason in info.get("pending_backends", {}).items():
            if cand == "triton":  # its state now, not when the decision was made
                reason = triton_tune.pending_reason(keys.make_key(spec, args))
            availability[cand] = f"not a candidate yet: {reason}"
        if info.get("provisional"):
            notes.append(
                "provisional decision (made while "
                + ", ".join(info["pending_backends"])
                + " could not take part): decided again once they can, never stored on disk"
            )
        if info.get("times_us"):
            parts = info.get("device_host_us", {})
            times = ", ".join(
                f"{b} {t:.1f} us"
                + (" (device {:.1f}, host {:.1f})".format(*parts[b]) if b in parts else "")
                for b, t in info["times_us"].items()
            )
            notes.append(f"measured: {times}")
        if info.get("rule"):
            notes.append(f"rule: {info['rule']}")
    else:  # a named backend: whether each one could run if named (auto's own rules aside)
        chosen = name
        availability = {b: unavailable_reason(b, like.device) for b in spec.backends}
        if source == "config":
            notes.append(f"named in the config file {config.loaded_from()}")
    for missing, why in spec.missing.items():  # backends without this operator
        availability.setdefault(missing, why)
    if "cuda" in spec.backends and like.device.type in autotune.BACKGROUND_DEVICE_TYPES:
        family = cuda.OP_FAMILY[spec.name]
        notes.append(f"cuda backend, {family} family: {cuda.describe_state(family)}")
    if (
        name == "auto" and "triton" in spec.backends
        and like.device.type in autotune.BACKGROUND_DEVICE_TYPES
    ):  # fmt: skip
        key = keys.make_key(spec, args)
        if triton_tune.state_of(key) is None and info["source"] == "cache":
            text = "not needed: the class's decision comes from the cache file"
        else:
            text = triton_tune.describe(key)
        notes.append(f"triton backend, this class: {text}")
    expl = Explanation(spec.name, chosen, source, availability, notes)
    if availability.get(chosen) is not None:
        expl.notes.append(f"{chosen!r} cannot run this call, so the call would raise")
    return expl


def clear_auto_cache() -> None:
    """Forget in-memory auto decisions (the on-disk autotuning cache stays)."""
    autotune.clear_memory()


@dataclass
class Explanation:
    op: str
    backend: str
    source: str
    availability: dict[str, str | None]
    notes: list[str] = field(default_factory=list)

    @property
    def runnable(self) -> bool:
        return self.availability.get(self.backend) is None

    def __str__(self) -> str:
        lines = [f"dualk.{self.op}: runs on {self.backend!r} (chosen by {self.source})"]
        for name, reason in self.availability.items():
            lines.append(
                f"  {name:7s} {'available' if reason is None else 'unavailable: ' + reason}"
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)
