"""The config file's public names (README, "Configuration"); the reader is dualk.dispatch.config."""

from .dispatch.config import (
    ConfigWarning,
    backend_defaults,
    config_path,
    invalidate,
    loaded_from,
    reload,
)

__all__ = [
    "ConfigWarning",
    "backend_defaults",
    "config_path",
    "invalidate",
    "loaded_from",
    "reload",
]
