"""What dualk.dispatch.autotune and the background Triton tuner (dualk.dispatch.triton_tune and
its worker) both use, below them both: the text of a key as the cache file stores it, the gate on
timing (timing_blocked) and the advisory file lock."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..core.errors import user_stacklevel
from ..registry import OPS

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: writes still merge, without the lock
    fcntl = None

# The warnings given once (DUALK_AUTOTUNE's value here, the cache file's in autotune): cleared by
# autotune.clear_memory().
warned: set[tuple[str, str]] = set()


# ---------------------------------------------------------------------------- keys
class FromRegistry(dict):
    """The built-in operators' entries; another operator's come from its registry entry."""

    def __init__(self, attribute: str, entries: dict):
        super().__init__(entries)
        self.attribute = attribute

    def __missing__(self, op: str):
        value = getattr(OPS[op], self.attribute) if op in OPS else None
        if not value:
            raise KeyError(op)
        return value


# Each key's fields after (op, device index, dtype, tf32), named for the disk key; an operator
# added with registry.register() brings its own.
FIELDS = FromRegistry(
    "key_fields",
    {
        "add": ("n", "broadcast", "layout"),
        "relu_scale": ("n", "layout"),
        "matmul": ("dims", "batch", "m", "k", "n_exact", "layout"),
        "linear_gelu": ("m", "k", "n_exact", "bias", "approximate", "layout"),
        "fused_mlp": ("m", "widths", "biases", "activation", "layout"),
        "linear_glu": ("m", "k", "n_exact", "biases", "activation", "layout"),
    },
)


def _bucket(e: int) -> str:
    if e < 0:
        return "0"
    return f"<={1 << e}" if e <= 16 else f"<=2^{e}"


def _field_text(field: str, value: Any) -> str:
    if field in ("n", "m", "batch"):
        return f"{field}{_bucket(value)}"
    if field == "broadcast":
        return "broadcast" if value else "same-shape"
    if field == "dims":
        return f"{value // 10}d@{value % 10}d"
    if field in ("k", "n_exact"):
        return f"{field[0]}={value}"
    if field == "bias":
        return "bias" if value else "no-bias"
    if field == "widths":
        return "w=" + "-".join(str(v) for v in [value[0][1], *(s[0] for s in value)])
    if field == "biases":
        return "bias=" + "".join("1" if v else "0" for v in value)
    if field == "layout":
        return f"layout={value}"
    return str(value)


def key_string(key: tuple) -> str:
    """The device-independent text of a key, as the cache file stores it, e.g.
    "linear_gelu|bfloat16|m<=32|k=768|n=3072|bias|tanh|layout=cc"."""
    op, _, dtype, tf32, *fields = key
    parts = [op, str(dtype).removeprefix("torch.") + ("+tf32" if tf32 else "")]
    parts += [_field_text(f, v) for f, v in zip(FIELDS[op], fields)]
    return "|".join(parts)


# ---------------------------------------------------------------------------- timing gate
def timing_blocked() -> str | None:
    """Why no timing may happen now (None when it may)."""
    flag = os.environ.get("DUALK_AUTOTUNE", "").strip().lower()
    if flag in ("0", "false", "no", "off"):
        return "DUALK_AUTOTUNE=0"
    if flag not in ("", "1", "true", "yes", "on") and ("DUALK_AUTOTUNE", flag) not in warned:
        warned.add(("DUALK_AUTOTUNE", flag))  # once per value, as autotune's cache warnings
        warnings.warn(
            f"DUALK_AUTOTUNE={os.environ['DUALK_AUTOTUNE']!r} is neither on (1, true, yes, on) "
            "nor off (0, false, no, off); autotuning stays on",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
    if torch.compiler.is_compiling():
        return "torch.compile is tracing"
    if torch.jit.is_tracing():
        return "torch.jit is tracing"
    try:
        capturing = torch.cuda.is_current_stream_capturing()
    except (RuntimeError, AssertionError):  # a CPU-only build
        capturing = False
    if capturing:
        return "a CUDA graph is being captured"
    return None


# ---------------------------------------------------------------------------- lock
@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on `path` (created); without fcntl, or where the file system
    refuses locks, no lock (the merge still keeps other writers' entries most of the time)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
