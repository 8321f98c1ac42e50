"""Exceptions dualk raises, so callers can catch dualk's own failures apart from PyTorch's."""


class DualkError(RuntimeError):
    """Base class for dualk's errors."""


class BackendUnavailableError(DualkError):
    """An explicitly requested backend cannot run this call; the message says why."""


class UnknownBackendError(DualkError, ValueError):
    """A backend name that dualk does not know."""
