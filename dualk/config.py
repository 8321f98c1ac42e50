"""Default backends from a config file (TOML), the lowest-precedence source before "auto".

Looked up once per process (`reload()` reads it again): the path in DUALK_CONFIG, else
$XDG_CONFIG_HOME/dualk/config.toml (~/.config/dualk/config.toml)::

    [backend]
    default = "triton"      # every operator
    relu_scale = "cuda"     # one operator
"""

from __future__ import annotations

import os
from pathlib import Path

_cache: dict[str, str] | None = None
_cache_path: Path | None = None


def config_path() -> Path:
    explicit = os.environ.get("DUALK_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "dualk" / "config.toml"


def _read(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    with path.open("rb") as f:
        data = tomllib.load(f)
    table = data.get("backend", {})
    if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
        raise ValueError(f"dualk config {path}: [backend] must map names to strings, got {table!r}")
    return dict(table)


def backend_defaults() -> dict[str, str]:
    """The [backend] table: operator name (or "default") -> backend name."""
    global _cache, _cache_path
    if _cache is None:
        _cache_path = config_path()
        _cache = _read(_cache_path)
    return _cache


def loaded_from() -> Path | None:
    backend_defaults()
    return _cache_path


def reload() -> dict[str, str]:
    global _cache
    _cache = None
    return backend_defaults()
