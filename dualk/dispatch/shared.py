"""What dualk.dispatch.autotune (and its store) and the background Triton tuner
(dualk.dispatch.triton_tune and its worker) both use, below them all: the gate on timing
(timing_blocked) and the advisory file lock."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from ..core.errors import user_stacklevel

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: writes still merge, without the lock
    fcntl = None

# The warnings given once (DUALK_AUTOTUNE's value here, the cache file's in dualk.dispatch.store):
# cleared by autotune.clear_memory().
warned: set[tuple[str, str]] = set()


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
