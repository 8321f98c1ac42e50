"""Which backend runs a call.

Precedence, first match wins (README has the same table; tests/test_dispatch.py checks it):
  1. the call's own `backend=` argument, when it is not "auto"
  2. DUALK_BACKEND_<OP> (e.g. DUALK_BACKEND_RELU_SCALE=triton), read at call time
  3. DUALK_BACKEND, read at call time
  4. the innermost `with dualk.use_backend(name):` scope (per thread / task)
  5. the process-wide default from `dualk.set_default_backend(name)`
  6. the config file's [backend] table: the operator's key, then "default" (dualk/config.py)
  7. "auto"
A named backend (from any of 1-6) that cannot run this call is an error that says why. "auto"
takes the first backend in the operator's `auto_order` that can run on the input's device and
remembers that per (operator, device, dtype), so later calls cost a dict lookup.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from . import config
from .backends import BACKENDS, unavailable_reason
from .errors import BackendUnavailableError, UnknownBackendError
from .registry import OpSpec

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
_process_default: str | None = None
_auto_choices: dict[tuple[str, torch.device, torch.dtype], str] = {}


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
    """(backend, reason it cannot run or None) in auto order for `dtype`. Auto never picks
    Triton's CPU interpreter: it is for tests, not speed."""
    out = []
    for name in spec.auto_order if dtype is None else spec.auto_order_for(dtype):
        if name == "triton" and device.type == "cpu":
            out.append((name, "auto does not use Triton's CPU interpreter"))
        else:
            out.append((name, unavailable_reason(name, device)))
    return out


def choose(spec: OpSpec, backend: str, like: torch.Tensor) -> str:
    """The backend that runs this call (raises when a named one cannot)."""
    name, source = requested(spec, backend)
    device = like.device
    if name == "auto":
        key = (spec.name, device, like.dtype)
        chosen = _auto_choices.get(key)
        if chosen is None:
            chosen = next(
                n for n, reason in auto_candidates(spec, device, like.dtype) if reason is None
            )
            _auto_choices[key] = chosen
        return chosen
    reason = unavailable_reason(name, device)
    if reason is not None:
        raise BackendUnavailableError(
            f"dualk.{spec.name}: backend {name!r} (requested by {source}) cannot run: {reason}"
        )
    return name


def clear_auto_cache() -> None:
    _auto_choices.clear()


@dataclass
class Explanation:
    op: str
    backend: str
    source: str
    availability: dict[str, str | None]
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"dualk.{self.op}: runs on {self.backend!r} (chosen by {self.source})"]
        for name, reason in self.availability.items():
            lines.append(
                f"  {name:7s} {'available' if reason is None else 'unavailable: ' + reason}"
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)
