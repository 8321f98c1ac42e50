"""Exceptions dualk raises, so callers can catch dualk's own failures apart from PyTorch's.

Every validation error is a `DualkError` that is also the builtin a Python user expects:
`except TypeError` catches a wrong dtype or a non-tensor argument, `except ValueError` a wrong
shape, device or option, and `except dualk.DualkError` catches all of them."""

import os
import sys

import torch


class DualkError(RuntimeError):
    """Base class for dualk's errors."""


class BackendUnavailableError(DualkError):
    """An explicitly requested backend cannot run this call; the message says why."""


class UnknownBackendError(DualkError, ValueError):
    """A backend name that dualk does not know."""


class InvalidArgumentError(DualkError, ValueError):
    """An argument has the wrong value: shape, rank, option, count of layers."""


class InvalidTypeError(DualkError, TypeError):
    """An argument has the wrong type: not a tensor, an unsupported or mixed dtype."""


class ShapeError(InvalidArgumentError):
    """Shapes that do not fit together (sizes, ranks, broadcasting)."""


class DeviceMismatchError(InvalidArgumentError):
    """Operands on different devices."""


class DtypeError(InvalidTypeError):
    """An unsupported dtype, or operands of different dtypes."""


class ConfigError(DualkError, ValueError):
    """A config file (DUALK_CONFIG or the default path) that cannot be used; names the file."""


class BackendWarning(UserWarning):
    """A backend cannot be used in this process (e.g. the CUDA extension failed to build), so
    backend="auto" runs the others; given once, with the reason (and the build log's path)."""


def user_stacklevel() -> int:
    """warnings.warn's stacklevel, for a dualk function about to warn, that names the first frame
    above it outside dualk and torch: a warning raised deep in dispatch (a config read on the
    first call, the autotune cache) points at the user's line whichever route got there."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the dualk package
    inside = (here, os.path.dirname(os.path.abspath(torch.__file__)))
    frame, level = sys._getframe(2), 2  # frame 1 is the function calling warnings.warn
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 1


class BuildNotice(UserWarning):
    """A CUDA extension family is being built: in the background for backend="auto" (which runs
    the other backends meanwhile), or in the call for an explicit backend="cuda". One line naming
    the family, where it is built, its log and how long such a build usually takes; given once
    per family and process. Silence it with warnings.filterwarnings("ignore",
    category=dualk.BuildNotice)."""
