"""auto's decision file on disk: one JSON file per device and software fingerprint, its lock, and
what reads and writes it.

$DUALK_CACHE_DIR/autotune/ (default ~/.cache/dualk/autotune/), one file per device and software
fingerprint (GPU name, compute capability, SM count, driver and CUDA versions, torch, Triton, a
hash of dualk's Python, Triton and CUDA sources): a new driver or an edited kernel starts a new
file. Sections: "backend" (auto's winners by key text, with the times per candidate), "triton.<module>"
(the Triton launchers' tuned configs, through triton_src.common.tuned_config) and "module.<mode>"
(dualk.module_choice). Writes are atomic (temporary file + os.replace) and merge with the file's
current content under an advisory lock (fcntl.flock on <file>.lock), so concurrent processes lose
nothing. A corrupt, truncated or wrong-version file is moved aside (<file>.corrupt-<time>) with
one AutotuneCacheWarning and rebuilt; an unwritable directory gives one warning and the cache
stays in memory.

Every access goes through LOCK, the lock dualk.dispatch.autotune also decides under.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import platform
import re
import threading
import time
import warnings
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import torch

from ..backends import cuda
from ..core.errors import user_stacklevel
from .shared import file_lock, warned

SCHEMA = 1
BACKEND_SECTION = "backend"
# Held while the in-memory copies of the files (and autotune's decisions) are read or changed.
LOCK = threading.RLock()


class AutotuneCacheWarning(UserWarning):
    """The autotune cache file was unusable (set aside and rebuilt) or cannot be written."""


# ---------------------------------------------------------------------------- fingerprint
_source_hash: list[str] = []
_device_fingerprints: dict[str, dict] = {}


def source_files() -> list[Path]:
    """dualk's Python files, the Triton sources and the CUDA sources (the dualk source hash)."""
    package = Path(__file__).resolve().parents[1]  # dualk/, with its layer subpackages
    subpackages = sorted(d for d in package.iterdir() if (d / "__init__.py").is_file())
    dirs = [package, *subpackages, cuda.source_dir()]
    try:
        found = find_spec("dualk.triton_src")
        if found is not None and found.submodule_search_locations:
            dirs.append(Path(next(iter(found.submodule_search_locations))))
    except (ImportError, ValueError):
        pass
    dirs.append(package.parent / "triton_src")
    files = {}
    for d in dirs:
        if d.is_dir():
            for p in d.iterdir():
                if p.is_file() and p.suffix in (".py", ".cu", ".cuh", ".h", ".cpp"):
                    files[p.resolve()] = p
    return sorted(files, key=lambda p: (p.parent.name, p.name))


def source_hash() -> str:
    """sha256 (16 hex digits) of the source files' names and contents, once per process."""
    if not _source_hash:
        h = hashlib.sha256()
        for p in source_files():
            h.update(f"{p.parent.name}/{p.name}\0".encode())
            with contextlib.suppress(OSError):
                h.update(p.read_bytes())
        _source_hash.append(h.hexdigest()[:16])
    return _source_hash[0]


def _driver_version() -> str | None:
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() == 0:
            try:
                buf = ctypes.create_string_buffer(96)
                if nvml.nvmlSystemGetDriverVersion(buf, 96) == 0:
                    return buf.value.decode()
            finally:
                nvml.nvmlShutdown()
    except (OSError, AttributeError):
        pass
    try:
        version = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0:
            return f"cuda {version.value // 1000}.{version.value % 1000 // 10}"
    except (OSError, AttributeError):
        pass
    return None


def _package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except Exception:  # not installed
        return None


def fingerprint(device: torch.device) -> dict:
    """What a cache file's times are valid for, per torch device (cached per process)."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    name = str(device)
    fp = _device_fingerprints.get(name)
    if fp is None:
        if device.type == "cuda":
            p = torch.cuda.get_device_properties(device)
            fp = {
                "device": p.name, "capability": f"{p.major}.{p.minor}",
                "sms": p.multi_processor_count, "driver": _driver_version(),
                "cuda": torch.version.cuda,
            }  # fmt: skip
        else:
            fp = {"device": device.type, "machine": platform.machine()}
        fp.update(
            torch=torch.__version__, triton=_package_version("triton"), dualk_source=source_hash()
        )
        _device_fingerprints[name] = fp
    return fp


def cache_dir() -> Path:
    """$DUALK_CACHE_DIR/autotune (default ~/.cache/dualk/autotune)."""
    return cuda.cache_root() / "autotune"


# The cache's files: the cache itself (cache_file), its lock, one moved aside as corrupt, a write
# in progress. `dualk cache show` / `clear` know dualk's own files by CACHE_FILE_NAME.
def _lock_name(name: str) -> str:
    return f"{name}.lock"


def _aside_name(name: str) -> str:
    return f"{name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def _write_name(name: str) -> str:
    return f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"


CACHE_FILE_NAME = re.compile(
    r"\.?[a-z0-9.-]+-[0-9a-f]{12}\.json(\.lock|\.corrupt-[0-9-]+|\.\d+\.\d+\.tmp)?"
)


def cache_file(device: torch.device) -> Path:
    fp = fingerprint(device)
    digest = hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:12]
    label = "".join(c if c.isalnum() else "-" for c in str(fp["device"]).lower()).strip("-")
    if "capability" in fp:
        label += f"-cc{fp['capability']}-{fp['sms']}sm"
    return cache_dir() / f"{label}-{digest}.json"


# ---------------------------------------------------------------------------- disk
_stores: dict[tuple[Path, str], Store] = {}


def _warn_once(kind: str, path: Path, message: str) -> None:
    if (kind, str(path)) not in warned:
        warned.add((kind, str(path)))
        warnings.warn(message, AutotuneCacheWarning, stacklevel=user_stacklevel())


def for_device(device: torch.device) -> Store:
    """The cache file of `device` (its fingerprint's), loaded on first use; call under LOCK."""
    path = cache_file(device)
    fp = fingerprint(device)
    key = (path, json.dumps(fp, sort_keys=True))
    store = _stores.get(key)
    if store is None:
        store = _stores[key] = Store(path, fp)
    return store


def forget() -> None:
    """Drop every loaded file (autotune.clear_memory): the next use reads it again."""
    _stores.clear()


class Store:
    """One cache file: its entries in memory, merged into the file on every write."""

    def __init__(self, path: Path, fp: dict):
        self.path = path
        self.fingerprint = fp
        self.entries: dict[str, dict[str, Any]] = {}
        self.loaded = False
        self.writable = True

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(_lock_name(self.path.name))

    def _parse(self, raw: bytes) -> tuple[dict | None, str | None]:
        """(entries, None) for a valid file, else (None, what is wrong)."""
        try:
            data = json.loads(raw)
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            return None, f"not valid JSON ({exc})"
        if not isinstance(data, dict):
            return None, "not a JSON object"
        if data.get("schema") != SCHEMA:
            return None, f"schema {data.get('schema')!r}, this dualk reads {SCHEMA}"
        if data.get("fingerprint") != self.fingerprint:
            return None, "its fingerprint does not match its name"
        entries = data.get("entries")
        if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
            return None, "'entries' is not a table of tables"
        return entries, None

    def _read(self, locked: bool) -> dict:
        """The file's entries ({} when absent). A bad file is moved aside (under the lock) with
        one warning."""
        try:
            raw = self.path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):  # absent (or the directory is a file)
            return {}
        except OSError as exc:
            _warn_once("read", self.path, f"cannot read the autotune cache {self.path}: {exc}")
            return {}
        entries, problem = self._parse(raw)
        if problem is None:
            return entries
        if not locked:  # confirm under the lock: another process may be replacing it
            try:
                with file_lock(self.lock_path):
                    return self._read(locked=True)
            except OSError:
                return {}
        aside = self.path.with_name(_aside_name(self.path.name))
        try:
            os.replace(self.path, aside)
            where = f"moved it to {aside.name}"
        except FileNotFoundError:
            return {}
        except OSError as exc:
            where = f"could not move it aside ({exc})"
        _warn_once(
            "corrupt",
            self.path,
            f"dualk autotune cache {self.path} is unusable ({problem}); {where} and starting a "
            "new one",
        )
        return {}

    def _load(self) -> None:
        if not self.loaded:
            self.loaded = True
            for section, table in self._read(locked=False).items():
                self.entries.setdefault(section, {}).update(table)

    def get(self, section: str, key: str) -> Any:
        self._load()
        return self.entries.get(section, {}).get(key)

    def items(self) -> dict[str, dict[str, Any]]:
        self._load()
        return self.entries

    def reload(self) -> None:
        """Read the file again: its entries, then what this process holds that it lacks."""
        known = self.entries
        self.entries = {}
        self.loaded = False
        self._load()
        for section, table in known.items():
            target = self.entries.setdefault(section, {})
            for k, v in table.items():
                target.setdefault(k, v)

    def put(self, section: str, key: str, value: Any) -> None:
        self._load()
        self.entries.setdefault(section, {})[key] = value
        if not self.writable:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with file_lock(self.lock_path):
                # Union of the file (what other processes wrote) and what this process knows.
                merged = {sec: dict(table) for sec, table in self._read(locked=True).items()}
                for sec, table in self.entries.items():
                    target = merged.setdefault(sec, {})
                    for k, v in table.items():
                        target.setdefault(k, v)
                merged[section][key] = value
                self.entries = {sec: dict(table) for sec, table in merged.items()}
                data = {"schema": SCHEMA, "fingerprint": self.fingerprint, "entries": merged}
                tmp = self.path.with_name(_write_name(self.path.name))
                try:
                    with open(tmp, "w") as f:
                        json.dump(data, f, indent=1, sort_keys=True)
                        f.flush()
                        os.fsync(f.fileno())
                    os.replace(tmp, self.path)
                finally:
                    with contextlib.suppress(OSError):
                        tmp.unlink()
        except OSError as exc:
            self.writable = False
            _warn_once(
                "write",
                self.path,
                f"cannot write the autotune cache under {self.path.parent} ({exc}); tuning "
                "results stay in memory for this process",
            )


def read_cache_file(path: Path) -> dict:
    """A cache file's raw content (for `dualk cache show`); raises ValueError when unusable."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        raise ValueError("not a dualk autotune cache file")
    return data


class SectionStore:
    """One named section of the cache file of a device (for decisions other than the operators'
    backends: dualk.module_choice's "module.<mode>"), under the same lock and merge."""

    def __init__(self, device: torch.device):
        self.device = device

    def get(self, section: str, key: str) -> Any:
        with LOCK:
            return for_device(self.device).get(section, key)

    def put(self, section: str, key: str, value: Any) -> None:
        with LOCK:
            for_device(self.device).put(section, key, value)


def store_for(device: torch.device) -> SectionStore:
    """The cache file of `device`, by section."""
    return SectionStore(device)


# ---------------------------------------------------------------------------- Triton configs
class TritonConfigStore:
    """The Triton launchers' tuned configs (triton_src.common.tuned_config) in the same cache
    files, section "triton.<namespace>": {class key: {"config": [...], "timings_ms": [[ms,
    [...]], ...]}}."""

    def get(self, device: torch.device, namespace: str, key: str) -> list | None:
        with LOCK:
            value = for_device(device).get(f"triton.{namespace}", key)
        try:
            timings = [(float(ms), tuple(cfg)) for ms, cfg in value["timings_ms"]]
            best = tuple(value["config"])
        except (TypeError, KeyError, ValueError):
            return None
        if not timings or timings[0][1] != best:
            return [(0.0, best)]
        return timings

    def put(self, device: torch.device, namespace: str, key: str, timings: list) -> None:
        value = {
            "config": list(timings[0][1]),
            "timings_ms": [[round(float(ms), 5), list(cfg)] for ms, cfg in timings],
        }
        with LOCK:
            for_device(device).put(f"triton.{namespace}", key, value)


TRITON_STORE = TritonConfigStore()


def triton_config_store() -> TritonConfigStore:
    return TRITON_STORE
