"""Default backends from a config file (TOML), the lowest-precedence source before "auto".

Looked up once per process (`reload()` reads it again): the path in DUALK_CONFIG, else
$XDG_CONFIG_HOME/dualk/config.toml (~/.config/dualk/config.toml)::

    [backend]
    default = "triton"      # every operator
    relu_scale = "cuda"     # one operator

Faults name the file: a DUALK_CONFIG path that does not exist, malformed TOML, a [backend] that
is not a table of strings, or an unknown backend name raise dualk.ConfigError (the user asked
for that file, so ignoring it would be a silent wrong choice). An unknown operator key or an
unknown top-level table only warns (ConfigWarning), once per file: a config written for a newer
dualk keeps working. The default path is optional: a missing file there means "no config".
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from ..core.errors import ConfigError, user_stacklevel
from ..registry import OPS

BACKEND_NAMES = ("cuda", "triton", "torch", "auto")
KNOWN_TABLES = ("backend",)


class ConfigWarning(UserWarning):
    """A config entry dualk ignores (an unknown operator or table); names the file and key."""


# The [backend] table once read (None: not yet). dispatch.auto_unforced reads it directly, one
# function call less on every auto call; everything else goes through backend_defaults().
loaded: dict[str, str] | None = None
_cache_path: Path | None = None


def config_path() -> Path:
    explicit = os.environ.get("DUALK_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "dualk" / "config.toml"


def _read(path: Path, explicit: bool) -> dict[str, str]:
    if not path.is_file():
        if explicit:
            raise ConfigError(
                f"dualk config {path} (from DUALK_CONFIG) does not exist or is not a file"
            )
        return {}
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"dualk config {path}: cannot be read as TOML: {exc}") from None
    for key in data:
        if key not in KNOWN_TABLES:
            warnings.warn(
                f"dualk config {path}: unknown table or key [{key}] ignored "
                f"(known: {', '.join(KNOWN_TABLES)})",
                ConfigWarning,
                stacklevel=user_stacklevel(),
            )
    table = data.get("backend", {})
    if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
        raise ConfigError(
            f"dualk config {path}: [backend] must map operator names to backend names "
            f"(strings), got {table!r}"
        )
    for key, value in table.items():
        if value not in BACKEND_NAMES:
            raise ConfigError(
                f"dualk config {path}: [backend] {key} = {value!r} is not a backend; "
                f"valid names: {', '.join(BACKEND_NAMES)}"
            )
        if key != "default" and key not in OPS:
            warnings.warn(
                f"dualk config {path}: [backend] key {key!r} is not an operator and is ignored "
                f"(operators: {', '.join(sorted(OPS))}, or 'default')",
                ConfigWarning,
                stacklevel=user_stacklevel(),
            )
    return dict(table)


def backend_defaults() -> dict[str, str]:
    """The [backend] table: operator name (or "default") -> backend name."""
    global loaded, _cache_path
    if loaded is None:
        _cache_path = config_path()
        loaded = _read(_cache_path, explicit=bool(os.environ.get("DUALK_CONFIG")))
    return loaded


def loaded_from() -> Path | None:
    backend_defaults()
    return _cache_path


def invalidate() -> None:
    """Forget the table; the next lookup reads the file again."""
    global loaded
    loaded = None


def reload() -> dict[str, str]:
    invalidate()
    return backend_defaults()
