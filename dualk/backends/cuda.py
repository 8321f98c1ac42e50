"""The "cuda" backend: torch extensions JIT-built (ninja) from cuda_src/, one per operator family
(FAMILIES: "elementwise" = add + relu_scale, "gemm" = matmul + linear_gelu + linear_glu, "mlp" =
fused_mlp and
its kernel variants), each built on first use of one of its operators, plus thin wrappers that
shape each operator's tensors for its launcher.

Kernels and launchers in cuda_src/*.cu are plain CUDA C++; cuda_src/binding_<family>.cpp (with
binding.h) are the only files that include torch: they check arguments, take the tensor's device
guard and the current stream.

Builds (README "The CUDA build"):
- a family's build directory is `<root>/cuda/<family>-<key>-<arch>`: `key` hashes the relative
  names and bytes of the files that family compiles (its sources and every header they include,
  found by following `#include "..."`), torch's and CUDA's versions and Python's (`source_key`);
  `<arch>` names the target architectures, by default only the visible GPUs' (Hopper: sm_90a),
  else DUALK_CUDA_ARCH or `dualk build --arch`. No absolute path enters a key or a module name,
  so a cache or a prebuilt directory copied to another machine is found there. A built
  directory holds `dualk-build.json` (the manifest: family, key, architectures, versions, each
  file's hash, the build's seconds);
- where a built family is looked for, first to last, without compiling: every directory of
  DUALK_PREBUILT_DIR (os.pathsep-separated; `dualk build --out DIR` writes one), the package's
  `dualk/prebuilt/`, then the cache (`$DUALK_CACHE_DIR`, default ~/.cache/dualk). A manifest whose
  key differs from these sources' (other sources, torch, CUDA or Python) or that lacks this GPU's
  architecture, or a library that is not whole or does not load, is ignored with its reason
  (`ignored(family)`, shown by dualk.explain), never loaded;
- backend="auto" never waits for a build (`auto_state`): it starts one in a separate process
  (`python -m dualk.backends.cuda_build <family>`, its output in `<build dir>/build.log`), gives
  one BuildNotice, and runs the other backends until the process has finished (polled on the
  calls that meet a provisional decision, dualk/dispatch/autotune.py); `generation()` changes when a
  family becomes ready or fails. An explicit backend="cuda" builds in the call (`extension`),
  after a BuildNotice naming the family, the directory and how long its last build took
  (DUALK_VERBOSE=1: the compiler's output on the terminal); a background build already running
  is waited for instead.

Build and cache faults (tests/test_faults.py, tests/test_background_build.py):
- no GPU, no nvcc, a failing compile, a cache directory that cannot be created or written: the
  family is unavailable with a reason naming the build log (`<build dir>/build.log`, or a file
  in the temporary directory when the cache cannot be written). The failure is remembered for the
  process; the first one also gives one BackendWarning (the reason "auto" skips the backend),
  except for a machine without a GPU, where the CUDA backend is simply not expected;
- one builder per build directory across processes: an exclusive flock on `<build dir>/.lock`
  around the build, so a second process (or builder process) waits, then finds the first one's
  manifest and loads its library, building nothing. A builder killed midway releases the flock
  with its process; a `lock` file left by torch's own FileBaton is stale while we hold the flock
  and is removed (torch would wait on it forever);
- a built library that cannot be loaded (truncated, corrupt): the directory's artefacts are
  removed and the family is rebuilt once; a second failure is an error naming the log.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..core import alloc as _alloc
from ..core.errors import BackendUnavailableError, BackendWarning, BuildNotice, user_stacklevel
from ..core.layout import MAX_DIMS, as_rows, fit_plan, plan_elementwise
from . import allow_tf32, torch_ref
from .torch_ref import split_glu_parameters


@dataclass(frozen=True)
class Family:
    """One extension: the operators it serves, its binding and its kernel files (cuda_src/)."""

    name: str
    ops: tuple[str, ...]
    binding: str
    kernels: tuple[str, ...]
    usual_s: int  # a first build's seconds on a 16-core host, until this cache has measured one

    @property
    def sources(self) -> tuple[str, ...]:
        return (self.binding, *self.kernels)


FAMILIES = {
    f.name: f
    for f in (
        Family("elementwise", ("add", "relu_scale"), "binding_elementwise.cpp",
               ("add.cu", "relu_scale.cu"), 20),
        Family("gemm", ("matmul", "linear_gelu", "linear_glu"), "binding_gemm.cpp",
               ("matmul.cu", "linear_gelu.cu", "linear_glu.cu"), 100),
        # fused_mlp: one operator, five translation units sharing fused_mlp_kernels.cuh
        Family("mlp", ("fused_mlp",), "binding_mlp.cpp",
               ("fused_mlp.cu", "fused_mlp_mma.cu", "fused_mlp_sm90.cu", "fused_mlp_tf32.cu",
                "fused_mlp_wide.cu"), 120),
    )
}  # fmt: skip
OP_FAMILY = {op: f.name for f in FAMILIES.values() for op in f.ops}
KERNEL_SOURCES = tuple(k for f in FAMILIES.values() for k in f.kernels)
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # launchers.h DType
ACTIVATION_CODES = {"none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 2, "gelu_erf": 3, "silu": 4}

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: torch's own FileBaton still serialises builds
    fcntl = None

_lock = threading.RLock()
_extensions: dict[str, object] = {}  # family -> its loaded module
_loaded_from: dict[str, Path] = {}  # family -> the directory it was loaded from
_errors: dict[str, str] = {}  # family -> why it cannot be had in this process
_ignored: dict[str, list[tuple[str, str]]] = {}  # family -> [(directory, why not loaded)]
_jobs: dict[str, Job] = {}  # family -> its background builder
_noticed: set[str] = set()
_generation = 0
NO_DEVICE = "no CUDA device is visible to PyTorch"
LOG_NAME = "build.log"
LOCK_NAME = ".lock"  # ours (flock); torch's FileBaton uses "lock"
MANIFEST_NAME = "dualk-build.json"
MANIFEST_SCHEMA = 1


def source_dir() -> Path:
    """cuda_src/, inside the installed package (or the checkout for an editable install)."""
    try:
        from importlib.resources import files

        path = Path(str(files("dualk.cuda_src")))
        if (path / "launchers.h").is_file():
            return path
    except (ModuleNotFoundError, TypeError):
        pass
    return Path(__file__).resolve().parents[2] / "cuda_src"


def cache_root() -> Path:
    explicit = os.environ.get("DUALK_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dualk"


def verbose_requested() -> bool:
    return os.environ.get("DUALK_VERBOSE", "").strip().lower() in ("1", "true", "yes", "on")


# ---------------------------------------------------------------------------- architectures
def normalize_arch(text: str) -> str:
    """An architecture as nvcc names it: sm_90a, 90a, 9.0a, sm90a, compute_90a -> sm_90a;
    raises ValueError."""
    t = text.strip().lower().removeprefix("sm_").removeprefix("sm").removeprefix("compute_")
    m = re.fullmatch(r"(\d+)\.?(\d)([a-z]?)", t)
    if m is None:
        raise ValueError(f"not a CUDA architecture: {text!r} (e.g. sm_90a, sm_80, 8.6)")
    return f"sm_{m.group(1)}{m.group(2)}{m.group(3)}"


def parse_archs(text: str) -> list[str]:
    return sorted({normalize_arch(a) for a in text.replace(";", ",").split(",") if a.strip()})


def device_archs() -> list[str]:
    """One architecture per distinct compute capability among the visible GPUs; Hopper gets
    sm_90a (wgmma and setmaxnreg need the arch-specific target)."""
    caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    return [f"sm_{ma}{mi}" + ("a" if (ma, mi) == (9, 0) else "") for ma, mi in caps]


def target_archs() -> list[str]:
    """What a build here targets: DUALK_CUDA_ARCH (e.g. "sm_90a,sm_80") when set, else only the
    visible GPUs' architectures."""
    explicit = os.environ.get("DUALK_CUDA_ARCH", "").strip()
    return parse_archs(explicit) if explicit else device_archs()


def arch_flags(archs: Sequence[str] | None = None) -> list[str]:
    """One -gencode per architecture (default: target_archs())."""
    archs = target_archs() if archs is None else archs
    return [f"-gencode=arch=compute_{a[3:]},code={a}" for a in archs]


def _arch_tag(archs: Sequence[str]) -> str:
    return "+".join(sorted(archs)) or "none"


# ---------------------------------------------------------------------------- keys
_INCLUDE = re.compile(rb'^\s*#\s*include\s+"([^"]+)"', re.M)


def family_files(family: str, src: Path | None = None) -> list[str]:
    """The files (names relative to cuda_src/) that `family` compiles: its sources and, followed
    transitively, every local header they include; sorted."""
    src = source_dir() if src is None else src
    seen: set[str] = set()
    todo = list(FAMILIES[family].sources)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        with contextlib.suppress(OSError):
            todo += [m.decode() for m in _INCLUDE.findall((src / name).read_bytes())]
    return sorted(seen)


def _toolchain() -> dict:
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": "{}.{}".format(*sys.version_info[:2]),
    }


def file_hashes(family: str) -> dict[str, str]:
    src = source_dir()
    out = {}
    for name in family_files(family, src):
        try:
            out[name] = hashlib.sha256((src / name).read_bytes()).hexdigest()[:16]
        except OSError:
            out[name] = "missing"
    return out


def source_key(family: str) -> str:
    """Hash of the family's files (relative names and bytes), the toolchain's versions and the
    family's name: no absolute path, no architecture."""
    h = hashlib.sha256(f"{family}|".encode())
    for name, digest in sorted(file_hashes(family).items()):
        h.update(f"{name}={digest}|".encode())
    h.update(json.dumps(_toolchain(), sort_keys=True).encode())
    return h.hexdigest()[:16]


def build_key(family: str, archs: Sequence[str] | None = None) -> str:
    """`<source key>-<architectures>`: the name of the family's build directory (after
    `<family>-`)."""
    archs = target_archs() if archs is None else archs
    return f"{source_key(family)}-{_arch_tag(archs)}"


def module_name(family: str) -> str:
    return f"dualk_cuda_{family}_{source_key(family)}"


def build_directory(family: str = "elementwise", archs: Sequence[str] | None = None,
                    root: Path | None = None) -> Path:  # fmt: skip
    root = cache_root() if root is None else Path(root)
    return root / "cuda" / f"{family}-{build_key(family, archs)}"


def _write_log(directory: Path | None, key: str, text: str) -> Path | None:
    """Write the build log into the build directory, else into the temporary directory (an
    unwritable cache); the path written, or None when neither can be written."""
    candidates = [] if directory is None else [directory / LOG_NAME]
    candidates.append(Path(tempfile.gettempdir()) / f"dualk-cuda-build-{key}.log")
    for path in candidates:
        try:
            path.write_text(text)
            return path
        except OSError:
            continue
    return None


def _log_note(log: Path | None) -> str:
    return f"log: {log}" if log is not None else "no log could be written"


@contextlib.contextmanager
def _build_lock(directory: Path):
    """Exclusive flock on <directory>/.lock for the whole build-and-load: one builder per build
    directory across processes; the others wait here, then load what it built. The lock goes
    with the process, so a killed builder never leaves it held."""
    with open(directory / LOCK_NAME, "a") as handle:  # OSError: the cache is not writable
        locked = False
        if fcntl is not None:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
                locked = True
            except OSError:  # a file system without locks: torch's FileBaton still serialises
                pass
        try:
            yield
        finally:
            if locked:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _remove_artefacts(directory: Path) -> None:
    """Everything a build left in `directory` (library, objects, ninja files, torch's lock, the
    manifest), but our lock file, which other processes may be waiting on."""
    for path in directory.iterdir():
        if path.name == LOCK_NAME:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _truncated_library(path: Path) -> str | None:
    """Why the ELF shared library at `path` cannot be whole (None when its headers fit the file).

    dlopen maps segments by the sizes the headers promise; a file cut short (a build killed while
    linking, a full disk) maps past its end and the first touch of the missing pages kills the
    process with SIGBUS instead of raising. So a library is checked before torch loads it: every
    program header's segment, every section's bytes and both header tables must lie inside the
    file; a file that is not ELF at all (empty, garbage) is not whole either. Reads the headers
    only (a few KB), not the library."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(64)
            if (
                len(head) < 52
                or head[:4] != b"\x7fELF"
                or head[4] not in (1, 2)
                or head[5] not in (1, 2)
            ):
                return f"is not a complete ELF file ({size} bytes)"
            end = "<" if head[5] == 1 else ">"
            is64 = head[4] == 2
            if is64:
                phoff, shoff = struct.unpack_from(end + "QQ", head, 32)
                phentsize, phnum, shentsize, shnum = struct.unpack_from(end + "HHHH", head, 54)
            else:
                phoff, shoff = struct.unpack_from(end + "II", head, 28)
                phentsize, phnum, shentsize, shnum = struct.unpack_from(end + "HHHH", head, 42)
            need = max(phoff + phnum * phentsize, shoff + shnum * shentsize)
            if need > size:
                return f"is truncated: {size} bytes, its header tables end at byte {need}"
            f.seek(phoff)
            phdrs = f.read(phnum * phentsize)
            f.seek(shoff)
            shdrs = f.read(shnum * shentsize)
    except (OSError, struct.error) as exc:
        return f"cannot be read ({exc})"
    for i in range(phnum):  # segments: (offset, size in the file)
        at = i * phentsize
        if is64:
            off, filesz = (
                struct.unpack_from(end + "Q", phdrs, at + 8)[0],
                struct.unpack_from(end + "Q", phdrs, at + 32)[0],
            )
        else:
            off, filesz = (
                struct.unpack_from(end + "I", phdrs, at + 4)[0],
                struct.unpack_from(end + "I", phdrs, at + 16)[0],
            )
        if off + filesz > size:
            return f"is truncated: {size} bytes, segment {i} ends at byte {off + filesz}"
    for i in range(shnum):  # sections but SHT_NOBITS (8, e.g. .bss): (offset, size)
        at = i * shentsize
        if struct.unpack_from(end + "I", shdrs, at + 4)[0] == 8:
            continue
        if is64:
            off, sz = struct.unpack_from(end + "QQ", shdrs, at + 24)
        else:
            off, sz = struct.unpack_from(end + "II", shdrs, at + 16)
        if off + sz > size:
            return f"is truncated: {size} bytes, section {i} ends at byte {off + sz}"
    return None


def _load_failed(exc: BaseException, directory: Path) -> bool:
    """A built library is there but does not load (truncated or corrupt .so: dlopen's
    ImportError or OSError), as opposed to a compile failure (torch raises RuntimeError with the
    compiler's output): only the former is worth one rebuild."""
    return isinstance(exc, (ImportError, OSError)) and any(directory.glob("*.so"))


def _first_line(exc: BaseException, limit: int = 200) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:limit] if text else ""


def _import_library(name: str, path: Path):
    """Import a built extension module from its library, as torch's JIT loader does after a
    build (no ninja run, no compiler needed)."""
    spec = importlib.util.spec_from_file_location(name, str(path))
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not an importable extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------- manifests
def read_manifest(directory: Path) -> dict | None:
    try:
        data = json.loads((Path(directory) / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_manifest(directory: Path, family: str, archs: Sequence[str], seconds: float) -> None:
    data = {
        "schema": MANIFEST_SCHEMA, "family": family, "key": source_key(family),
        "arch": sorted(archs), "module": module_name(family),
        "library": f"{module_name(family)}.so", "toolchain": _toolchain(),
        "files": file_hashes(family), "seconds": round(seconds, 1),
        "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }  # fmt: skip
    tmp = directory / f".{MANIFEST_NAME}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, directory / MANIFEST_NAME)


def manifest_problem(directory: Path, family: str, archs: Sequence[str]) -> str | None:
    """Why the build in `directory` must not be loaded for `family` on a GPU of `archs` (None:
    it may): no or another manifest, other sources or tools, other architectures, a library that
    is missing or not whole."""
    m = read_manifest(directory)
    if m is None:
        return f"no readable {MANIFEST_NAME}"
    if m.get("schema") != MANIFEST_SCHEMA or m.get("family") != family:
        return f"its manifest is for {m.get('family')!r}, schema {m.get('schema')!r}"
    want = source_key(family)
    if m.get("key") != want:
        theirs_tc = m.get("toolchain") or {}
        tools = [f"{k} {theirs_tc.get(k)} (here {v})" for k, v in _toolchain().items()
                 if theirs_tc.get(k) != v]  # fmt: skip
        ours, theirs = file_hashes(family), m.get("files") or {}
        changed = sorted(n for n in set(ours) | set(theirs) if ours.get(n) != theirs.get(n))
        what = [f"built with {', '.join(tools)}"] if tools else []
        if changed:
            what.append(f"sources differ: {', '.join(changed[:6])}")
        return (
            f"built from other sources or tools (key {m.get('key')}; these sources give {want}"
            + (f": {'; '.join(what)}" if what else "")
            + ")"
        )
    built_for = list(m.get("arch") or [])
    missing = [a for a in archs if a not in built_for]
    if missing:
        return f"built for {', '.join(built_for) or 'no architecture'}, not for this GPU's {', '.join(missing)}"
    library = Path(directory) / str(m.get("library", ""))
    if not library.is_file():
        return f"its library {library.name} is missing"
    damage = _truncated_library(library)
    if damage is not None:
        return f"its library {library.name} {damage}"
    return None


def prebuilt_roots() -> list[Path]:
    """Where built families are looked for before the cache: DUALK_PREBUILT_DIR's directories
    (os.pathsep-separated), then the package's dualk/prebuilt/."""
    roots = [Path(p).expanduser() for p in os.environ.get("DUALK_PREBUILT_DIR", "").split(os.pathsep)
             if p.strip()]  # fmt: skip
    roots.append(Path(__file__).resolve().parents[1] / "prebuilt")
    return roots


def _candidates(family: str) -> list[tuple[Path, bool]]:
    """(directory, prebuilt?) that may hold `family`, in search order. The cache is searched for
    this source key only (stale keys are normal there, not worth a reason)."""
    out = []
    for root in prebuilt_roots():
        for base in (root / "cuda", root):
            if base.is_dir():
                out += [(d, True) for d in sorted(base.glob(f"{family}-*")) if d.is_dir()]
    base = cache_root() / "cuda"
    if base.is_dir():
        out += [(d, False) for d in sorted(base.glob(f"{family}-{source_key(family)}-*"))
                if (d / MANIFEST_NAME).is_file()]  # fmt: skip
    return out


def locate(family: str, archs: Sequence[str] | None = None) -> tuple[Path | None, list]:
    """(the first directory whose build may be loaded for this GPU, [(directory, why not) for the
    prebuilt ones passed over]); loads nothing."""
    archs = device_archs() if archs is None else archs
    ignored = []
    for directory, prebuilt in _candidates(family):
        problem = manifest_problem(directory, family, archs)
        if problem is None:
            return directory, ignored
        if prebuilt or (directory / MANIFEST_NAME).is_file():
            ignored.append((str(directory), problem))
    return None, ignored


def _load_built(family: str):
    """The family's module from a prebuilt directory or the cache, without compiling; None when
    none fits. What was passed over is kept for ignored()."""
    passed: list[tuple[str, str]] = []
    while True:
        directory, ignored = locate(family)
        passed += [i for i in ignored if i not in passed]
        if directory is None:
            _ignored[family] = passed
            return None
        m = read_manifest(directory) or {}
        try:
            module = _import_library(module_name(family), directory / m["library"])
        except Exception as exc:
            passed.append((str(directory), f"its library does not load ({type(exc).__name__}: "
                                           f"{_first_line(exc)})"))  # fmt: skip
            # Not this one again: a manifest that points at a library that does not load.
            with contextlib.suppress(OSError):
                (directory / MANIFEST_NAME).rename(directory / f"{MANIFEST_NAME}.bad")
            if (directory / MANIFEST_NAME).is_file():  # read-only prebuilt: stop looking
                _ignored[family] = passed
                return None
            continue
        _ignored[family] = passed
        _loaded_from[family] = directory
        return module


def ignored(family: str) -> list[tuple[str, str]]:
    """The builds passed over when the family was last looked for: [(directory, why)]."""
    return list(_ignored.get(family, []))


# ---------------------------------------------------------------------------- building
def build(
    family: str,
    archs: Sequence[str] | None = None,
    root: Path | None = None,
    verbose: bool = False,
):
    """Build `family` for `archs` (default target_archs()) into `<root>/cuda/<family>-<key>`
    (default root: the cache) and return its module; in this process, under the directory's
    flock. A build another process finished meanwhile is loaded, not repeated."""
    from torch.utils import cpp_extension

    archs = sorted(target_archs() if archs is None else archs)
    fam = FAMILIES[family]
    src = source_dir()
    key = build_key(family, archs)
    name = module_name(family)
    directory = build_directory(family, archs, root)

    def load():
        return cpp_extension.load(
            name=name,
            sources=[str(src / f) for f in fam.sources],
            extra_include_paths=[str(src)],
            extra_cflags=["-O3", "-std=c++17"],
            # No --use_fast_math: its tanh.approx put fp32 GELU 10x outside PyTorch's error.
            extra_cuda_cflags=["-O3", "-std=c++17", "-lineinfo", *arch_flags(archs)],
            build_directory=str(directory),
            verbose=verbose,
        )

    with contextlib.ExitStack() as stack:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            stack.enter_context(_build_lock(directory))
        except OSError as exc:
            log = _write_log(
                None, f"{family}-{key}",
                f"cannot create or write {directory}: {type(exc).__name__}: {exc}\n",
            )  # fmt: skip
            raise BackendUnavailableError(
                f"the CUDA build cache {directory} cannot be created or written "
                f"({type(exc).__name__}: {exc}); set DUALK_CACHE_DIR to a writable directory; "
                f"{_log_note(log)}"
            ) from exc
        history = ""  # what was repaired on the way (kept in the log)
        # Another process (or builder) may have finished while this one waited on the lock.
        if manifest_problem(directory, family, archs) is None:
            try:
                module = _import_library(name, directory / f"{name}.so")
                _loaded_from[family] = directory
                return module
            except Exception as exc:
                history += (
                    f"loading the built library failed ({type(exc).__name__}: {exc}); "
                    "removed the build directory's artefacts and rebuilt\n"
                )
                _remove_artefacts(directory)
        # We hold the flock, so no dualk process is building here: a torch FileBaton left by a
        # killed build is stale, and torch would wait on it forever.
        with contextlib.suppress(FileNotFoundError):
            (directory / "lock").unlink()
        for so in sorted(directory.glob("*.so")):
            damage = _truncated_library(so)
            if damage is not None:  # loading it could kill the process (SIGBUS): start afresh
                history += (
                    f"the cached library {so.name} {damage}; removed the build directory's "
                    "artefacts and rebuilt\n"
                )
                _remove_artefacts(directory)
                break
        t0 = time.perf_counter()
        for attempt in (1, 2):
            try:
                module = load()
                break
            except Exception as exc:
                broken = _load_failed(exc, directory)
                if attempt == 1 and broken and not history:
                    # A library that does not load although its headers fit (corrupt bytes, a
                    # foreign file): start the directory afresh and build once more.
                    history += (
                        f"loading the cached library failed ({type(exc).__name__}: {exc}); "
                        "removed the build directory's artefacts and rebuilt\n"
                    )
                    _remove_artefacts(directory)
                    continue
                log = _write_log(directory, key, f"{history}{type(exc).__name__}: {exc}\n")
                what = (
                    "could not be loaded, nor rebuilt" if broken and history else "failed to build"
                )
                raise BackendUnavailableError(
                    f"the CUDA {family} extension in {directory} {what} ({type(exc).__name__}: "
                    f"{_first_line(exc)}); {_log_note(log)}"
                ) from exc
        with contextlib.suppress(OSError):
            _write_manifest(directory, family, archs, time.perf_counter() - t0)
        # A log from an earlier failure would mislead now; a repair's note is worth keeping.
        if history:
            _write_log(directory, key, history)
        else:
            with contextlib.suppress(OSError):
                (directory / LOG_NAME).unlink()
        _loaded_from[family] = directory
        return module


def usual_seconds(family: str) -> tuple[float, bool]:
    """(seconds, measured?): the last build of `family` recorded in this cache (any sources),
    else the family's estimate for a 16-core host."""
    best: tuple[float, float] | None = None  # (mtime, seconds)
    base = cache_root() / "cuda"
    with contextlib.suppress(OSError):
        for manifest in base.glob(f"{family}-*/{MANIFEST_NAME}"):
            m = read_manifest(manifest.parent) or {}
            if isinstance(m.get("seconds"), (int, float)):
                mtime = manifest.stat().st_mtime
                if best is None or mtime > best[0]:
                    best = (mtime, float(m["seconds"]))
    return (best[1], True) if best is not None else (float(FAMILIES[family].usual_s), False)


def _describe_family(family: str) -> str:
    return f"the CUDA backend's {family} family ({', '.join(FAMILIES[family].ops)})"


def _notice(family: str, message: str) -> None:
    if family in _noticed:
        return
    _noticed.add(family)
    warnings.warn(message, BuildNotice, stacklevel=user_stacklevel())


def _usual_text(family: str) -> str:
    seconds, measured = usual_seconds(family)
    return f"~{seconds:.0f} s" + ("" if measured else " on a 16-core host")


def _ready(family: str, module) -> None:
    global _generation
    _extensions[family] = module
    _errors.pop(family, None)
    _generation += 1
    if family == "mlp":
        _register_mlp_ops(module)


# ---------------------------------------------------------------------- planned fused_mlp calls
class PlannedMlp:
    """The mlp extension's planned calls (cuda_src/binding_mlp.cpp PlannedCalls): `run` is its
    planned_run (None until an extension that has it is loaded and its ops registered), which
    dualk/runtime/operators.py calls after its own checks; `generation` is autotune's generation
    the planned "auto" classes were decided in (the runtime layer keeps it)."""

    __slots__ = ("run", "add", "clear", "generation", "hooks", "registered")

    def __init__(self):
        self.run = self.add = self.clear = None
        self.generation = -1
        self.hooks: tuple | None = None  # (usable, fallback) from the layers above
        self.registered = False


PLANNED_MLP = PlannedMlp()


def set_mlp_op_hooks(usable: Callable[[bool], bool], fallback: Callable) -> None:
    """What the C++ kernel of dualk::fused_mlp_infer asks the layers above (dualk/autograd/
    library.py sets them at import): usable(is_auto) -> whether planned calls may serve a call
    now; fallback(x, weights, biases, activation, backend) -> the op's full route."""
    PLANNED_MLP.hooks = (usable, fallback)
    module = _extensions.get("mlp")
    if module is not None:
        _register_mlp_ops(module)


def _register_mlp_ops(module) -> None:
    """Registers dualk::fused_mlp_infer's CUDA kernel from the first mlp extension loaded that
    has one (an older prebuilt, or a stand-in, has none: the op's Python kernel serves)."""
    planned = PLANNED_MLP
    register = getattr(module, "register_ops", None)
    if planned.registered or planned.hooks is None or register is None:
        return
    planned.registered = True
    try:
        register(ACTIVATION_CODES, torch.nn.Parameter, *planned.hooks)
    except Exception as exc:  # the op's Python kernel serves; planned calls work regardless
        warnings.warn(
            f"dualk: dualk::fused_mlp_infer's CUDA kernel could not be registered ({exc}); "
            "compiled graphs call its Python kernel",
            BackendWarning,
            stacklevel=user_stacklevel(),
        )
    planned.add, planned.clear = module.planned_add, module.planned_clear
    planned.run = module.planned_run


def _fail(family: str, reason: str) -> None:
    global _generation
    first = family not in _errors
    _errors[family] = reason
    _generation += 1
    if first and reason != NO_DEVICE:
        warnings.warn(
            f"dualk: {_describe_family(family)} is unavailable: {reason}. backend='auto' runs "
            "the other backends; backend='cuda' raises BackendUnavailableError.",
            BackendWarning,
            stacklevel=user_stacklevel(),
        )


def generation() -> int:
    """Changes whenever a family becomes ready or fails (autotune re-decides provisional
    choices then)."""
    return _generation


def extension(family: str = "elementwise", verbose: bool | None = None):
    """The family's built extension module: loaded from a prebuilt directory or the cache, else
    built in this call after one BuildNotice (an explicit backend="cuda" may wait; a background
    build already running is waited for). Raises BackendUnavailableError when that cannot work;
    a failure is remembered for the process, the first one warns once (BackendWarning).
    verbose (default DUALK_VERBOSE=1): the compiler's output on the terminal."""
    module = _extensions.get(family)
    if module is not None:
        return module
    with _lock:
        module = _extensions.get(family)
        if module is not None:
            return module
        if family in _errors:
            raise BackendUnavailableError(_errors[family])
        reason = None
        try:
            if not torch.cuda.is_available():
                reason = NO_DEVICE
            else:
                job = _jobs.get(family)
                if job is not None and job.proc.poll() is None:
                    _notice(family, f"dualk: waiting for the background build of "
                                    f"{_describe_family(family)} in {job.directory} (started "
                                    f"{job.since()}; progress: {job.log})")  # fmt: skip
                    job.proc.wait()
                if job is not None:
                    _poll(family)
                    if family in _extensions:
                        return _extensions[family]
                    if family in _errors:
                        raise BackendUnavailableError(_errors[family])
                module = _load_built(family)
                if module is None:
                    reason = _toolchain_reason()
                if module is None and reason is None:
                    archs = target_archs()
                    _notice(
                        family,
                        f"dualk: building {_describe_family(family)} for {', '.join(archs)} in "
                        f"{build_directory(family, archs)}; this usually takes "
                        f"{_usual_text(family)} (DUALK_VERBOSE=1 shows the compiler; "
                        "`dualk build` builds ahead of time)",
                    )
                    module = build(family, archs, verbose=verbose_requested() if verbose is None
                                   else verbose)  # fmt: skip
        except BackendUnavailableError as exc:
            reason = str(exc)
        except Exception as exc:  # anything else on the way (a device query, sources)
            reason = f"preparing the CUDA build failed ({type(exc).__name__}: {exc})"
        if reason is not None:
            _fail(family, reason)
            raise BackendUnavailableError(reason)
        _ready(family, module)
    return module


def _nvcc() -> str | None:
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME and (Path(CUDA_HOME) / "bin" / "nvcc").exists():
        return str(Path(CUDA_HOME) / "bin" / "nvcc")
    return shutil.which("nvcc")


def nvcc_path() -> str | None:
    """nvcc's path (CUDA_HOME's, else the one on PATH), or None when there is none."""
    return _nvcc()


def _toolchain_reason() -> str | None:
    if not torch.cuda.is_available():
        return NO_DEVICE
    if _nvcc() is None:
        return "nvcc was not found (set CUDA_HOME or put nvcc on PATH) so the CUDA kernels cannot be built"
    return None


# ---------------------------------------------------------------------------- background builds
PROGRESS_LOG = "progress.log"  # a background builder's output (the compiler's, with verbose)
# The builder's argv for (family, architectures, root or None); tests put a stand-in here.
BUILDER: Callable[[str, list[str], Path | None], list[str]] | None = None


def builder_command(family: str, archs: Sequence[str], root: Path | None = None) -> list[str]:
    if BUILDER is not None:
        return list(BUILDER(family, list(archs), root))
    cmd = [sys.executable, "-m", "dualk.backends.cuda_build", family, "--arch", ",".join(archs)]
    return cmd + ([] if root is None else ["--out", str(root)])


def builder_env() -> dict[str, str]:
    """The builder's environment: this one, dualk importable from where this process imports
    it, and no GPU (it compiles for named architectures; no CUDA context, no GPU memory)."""
    env = dict(os.environ)
    package_parent = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


@dataclass
class Job:
    proc: subprocess.Popen
    started: float  # time.time()
    directory: Path
    log: Path

    def since(self) -> str:
        return time.strftime("%H:%M:%S", time.localtime(self.started))

    def describe(self) -> str:
        return (
            f"being built in the background since {self.since()} "
            f"({time.time() - self.started:.0f} s; pid {self.proc.pid}; progress: {self.log})"
        )

    def last_line(self) -> str:
        with contextlib.suppress(OSError):
            lines = [ln.strip() for ln in self.log.read_text(errors="replace").splitlines()]
            for ln in reversed(lines):
                if ln.startswith("dualk-build: failed:"):
                    return ln.removeprefix("dualk-build: failed:").strip()
            lines = [ln for ln in lines if ln]
            if lines:
                return lines[-1][:300]
        return "no output"


def start_build(family: str) -> Job:
    """Start the family's builder process (it writes its output to <build dir>/progress.log)."""
    archs = target_archs()
    directory = build_directory(family, archs)
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / PROGRESS_LOG
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            builder_command(family, archs), stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, env=builder_env(), start_new_session=True,
        )  # fmt: skip
    job = _jobs[family] = Job(proc, time.time(), directory, log)
    return job


def building() -> list[str]:
    """The families whose builder process this process started and has not yet seen finish."""
    return list(_jobs)


def _poll(family: str) -> None:
    """A finished builder's outcome: the family ready (loaded from what it built) or failed."""
    job = _jobs.get(family)
    if job is None:
        return
    rc = job.proc.poll()
    if rc is None:
        return
    del _jobs[family]
    if rc == 0:
        try:
            module = _load_built(family)
        except Exception as exc:
            module, why = None, f"{type(exc).__name__}: {exc}"
        else:
            why = "; ".join(f"{d}: {w}" for d, w in ignored(family)) or "nothing found"
        if module is not None:
            _ready(family, module)
        else:
            _fail(family, f"the background build of {_describe_family(family)} ended without a "
                          f"loadable library ({why}); log: {job.log}")  # fmt: skip
        return
    how = f"exited with status {rc}" if rc > 0 else f"was killed by signal {-rc}"
    _fail(family, f"the background build of {_describe_family(family)} {how} after "
                  f"{time.time() - job.started:.0f} s: {job.last_line()}; log: {job.log}")  # fmt: skip


def poll_builds() -> int:
    """Check the running builders (a waitpid each); the generation after."""
    if _jobs:
        with _lock:
            for family in list(_jobs):
                _poll(family)
    return _generation


def auto_state(family: str, start: bool = True) -> tuple[str, str | None]:
    """(state, why) of a family for backend="auto", never waiting for a build: "ready" (loaded,
    or loaded now from a prebuilt directory or the cache), "building" (a builder process is
    running: started here when `start`, with one BuildNotice), "not built" (not started: `start`
    is False), "failed" or "unavailable" (no GPU)."""
    if family in _extensions:
        return "ready", None
    with _lock:
        if family in _extensions:
            return "ready", None
        if family in _errors:
            return ("unavailable" if _errors[family] == NO_DEVICE else "failed"), _errors[family]
        if not torch.cuda.is_available():
            return "unavailable", NO_DEVICE
        if family in _jobs:
            _poll(family)
            if family in _jobs:
                return "building", _jobs[family].describe()
            return auto_state(family, start)
        try:
            module = _load_built(family)
        except Exception as exc:
            _fail(family, f"looking for a built CUDA {family} extension failed "
                          f"({type(exc).__name__}: {exc})")  # fmt: skip
            return "failed", _errors[family]
        if module is not None:
            _ready(family, module)
            return "ready", None
        reason = _toolchain_reason()
        if reason is not None:
            _fail(family, reason)
            return "failed", reason
        if not start:
            return "not built", (
                "not built yet (auto's first timed call starts a background build; "
                "backend='cuda' builds in the call)"
            )
        try:
            job = start_build(family)
        except Exception as exc:  # OSError: an unwritable cache; a builder that cannot start
            _fail(family, f"the background build of {_describe_family(family)} could not start "
                          f"({type(exc).__name__}: {exc})")  # fmt: skip
            return "failed", _errors[family]
        _notice(
            family,
            f"dualk: {_describe_family(family)} is being built in the background for "
            f"{', '.join(target_archs())} in {job.directory} (usually {_usual_text(family)}; "
            f"progress: {job.log}); backend='auto' runs the other backends until it is ready",
        )
        return "building", job.describe()


def describe_state(family: str) -> str:
    """One line for dualk.explain: ready (where from), building (since when, its log), failed
    (why, with the log), built but not loaded, or not built; and the prebuilt builds passed over.
    Starts nothing (a builder that has finished is taken in: its library loaded)."""
    if family in _jobs:
        _poll(family)
    if family in _extensions:
        where = _loaded_from.get(family)
        text = "ready" + (f" (loaded from {where})" if where is not None else "")
    elif family in _errors:
        text = f"failed: {_errors[family]}"
    elif family in _jobs:
        text = _jobs[family].describe()
    elif not torch.cuda.is_available():
        text = f"unavailable: {NO_DEVICE}"
    else:
        try:
            directory, passed = locate(family)
        except Exception as exc:
            directory, passed = None, [("?", f"{type(exc).__name__}: {exc}")]
        _ignored[family] = passed
        text = (f"built, loads on first use: {directory}" if directory is not None
                else "not built yet (auto's first timed call starts a background build; "
                     "backend='cuda' builds in the call)")  # fmt: skip
    for directory, why in ignored(family):
        text += f"; ignored {directory}: {why}"
    return text


def unavailable_reason(device: torch.device, op: str | None = None) -> str | None:
    """None when the CUDA backend can run `op` on `device` (building its family in this call
    when needed: an explicit request may wait), else why not. Without `op`: whether the backend
    can exist here at all (a GPU, and nvcc or a prebuilt build); builds nothing."""
    if device.type != "cuda":
        return f"the CUDA backend needs CUDA tensors; the input is on {device}"
    if op is not None:
        family = OP_FAMILY[op]
        if family in _extensions:
            return None
        try:
            extension(family)
        except BackendUnavailableError as exc:
            return str(exc)
        return None
    if not torch.cuda.is_available():
        return NO_DEVICE
    if _extensions:
        return None
    if _nvcc() is None:
        with contextlib.suppress(Exception):
            if any(locate(f)[0] is not None for f in FAMILIES):
                return None
        return _toolchain_reason()
    return None


# ---------------------------------------------------------------------------- operators
def add(a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    ext = _extensions.get("elementwise")
    if (  # the common call: one C++ round trip allocates and launches
        ext is not None
        and not _alloc.poisoning()
        and a.shape == b.shape
        and a.is_contiguous()
        and b.is_contiguous()
    ):
        return ext.add_dense(a, b, alpha)
    plan = plan_elementwise(a, b)
    out = _alloc.empty(plan.out_shape, a.dtype, a.device)
    if plan.numel:
        a, b, plan = fit_plan(plan, MAX_DIMS, a, b)
        extension("elementwise").add(a, b, out, alpha, plan.sizes, *plan.strides, plan.dense)
    return out


def relu_scale(x: torch.Tensor, scale: float) -> torch.Tensor:
    ext = _extensions.get("elementwise")
    if ext is not None and not _alloc.poisoning() and x.is_contiguous():
        return ext.relu_scale_dense(x, scale)
    plan = plan_elementwise(x)
    out = _alloc.empty(plan.out_shape, x.dtype, x.device)
    if plan.numel:
        x, plan = fit_plan(plan, MAX_DIMS, x)
        extension("elementwise").relu_scale(x, out, scale, plan.sizes, plan.strides[0], plan.dense)
    return out


def _unit_stride(t: torch.Tensor, dim: int) -> bool:
    return t.stride(dim) == 1 or t.size(dim) <= 1


def _as_gemm_a(a: torch.Tensor) -> torch.Tensor:
    """(m, k) or (batch, m, k) with unit stride along k: native for row-major and sliced views; a
    transposed A is copied once (the kernels read A along k)."""
    return a if _unit_stride(a, -1) else a.contiguous()


def _as_gemm_b(b: torch.Tensor) -> torch.Tensor:
    """(k, n) or (batch, k, n) with unit stride along n (row-major B) or along k (an nn.Linear
    weight's transpose): both native; anything else is copied once."""
    return b if _unit_stride(b, -1) or _unit_stride(b, -2) else b.contiguous()


# The launchers take 2-dim operands as one batch entry and an nn.Linear weight as it is: no view
# ops here (unsqueeze, t(), out[0], reshape cost ~1 us of host time each).
def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    m, n = a.shape[-2], b.shape[-1]
    if a.dim() == 2 and b.dim() == 2:
        out = _alloc.empty((m, n), a.dtype, a.device)
    else:
        batch = a.shape[0] if a.dim() == 3 else b.shape[0]  # a 2-dim operand is broadcast
        out = _alloc.empty((batch, m, n), a.dtype, a.device)
    if out.numel():
        extension("gemm").matmul(_as_gemm_a(a), _as_gemm_b(b), out, allow_tf32(a.dtype))
    return out


def linear_gelu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    approximate: str = "tanh",
) -> torch.Tensor:
    act = ACTIVATION_CODES["gelu_tanh" if approximate == "tanh" else "gelu_erf"]
    # The output made, x read as its rows and the result shaped in C++ (one crossing: ~15 us less
    # host time per call on an H200 host than the Python below); None for the layouts below.
    out = extension("gemm").linear_gelu_new(
        x, weight, bias, act, allow_tf32(x.dtype), _alloc.poisoning()
    )  # fmt: skip
    if out is not None:
        return out
    x2d = as_rows(x)
    out, out_rows = _alloc.rows_output(x, weight.shape[0])
    if out.numel():
        if not (_unit_stride(weight, 1) or _unit_stride(weight, 0)):
            weight = weight.contiguous()  # B = weight^T needs unit stride along k or n
        bias = None if bias is None else bias.contiguous()
        extension("gemm").linear_gelu(
            _as_gemm_a(x2d), weight, bias, out_rows, act, allow_tf32(x.dtype)
        )  # fmt: skip
    return out


# linear_glu's gate activations as launchers.h numbers them, by (activation, approximate).
GLU_ACTIVATION_CODES = {
    ("silu", "tanh"): ACTIVATION_CODES["silu"],
    ("silu", "none"): ACTIVATION_CODES["silu"],
    ("relu", "tanh"): ACTIVATION_CODES["relu"],
    ("relu", "none"): ACTIVATION_CODES["relu"],
    ("gelu", "tanh"): ACTIVATION_CODES["gelu_tanh"],
    ("gelu", "none"): ACTIVATION_CODES["gelu_erf"],
}


def linear_glu(
    x: torch.Tensor,
    weight_gate: torch.Tensor,
    weight_up: torch.Tensor | None = None,
    bias_gate: torch.Tensor | None = None,
    bias_up: torch.Tensor | None = None,
    activation: str = "silu",
    approximate: str = "tanh",
) -> torch.Tensor:
    """act(x @ weight_gate.T + bias_gate) * (x @ weight_up.T + bias_up) (cuda_src/linear_glu.cu);
    a packed weight_gate ([gate; up], weight_up None) is passed as its two halves' views."""
    wg, wu, bg, bu = split_glu_parameters(weight_gate, weight_up, bias_gate, bias_up)
    act = GLU_ACTIVATION_CODES[(activation, approximate)]
    # As linear_gelu: the output made and shaped in C++ where x's rows need no copy.
    out = extension("gemm").linear_glu_new(
        x, wg, wu, bg, bu, act, allow_tf32(x.dtype), _alloc.poisoning()
    )  # fmt: skip
    if out is not None:
        return out
    x2d = as_rows(x)
    out, out_rows = _alloc.rows_output(x, wg.shape[0])
    if out.numel():
        # As linear_gelu: B = W^T needs unit stride along k or n; the biases contiguous.
        wg, wu = (
            w if _unit_stride(w, 1) or _unit_stride(w, 0) else w.contiguous() for w in (wg, wu)
        )
        bg = None if bg is None else bg.contiguous()
        bu = None if bu is None else bu.contiguous()
        extension("gemm").linear_glu(
            _as_gemm_a(x2d), wg, wu, bg, bu, out_rows, act, allow_tf32(x.dtype)
        )  # fmt: skip
    return out


def linear_glu_route(
    x: torch.Tensor,
    weight_gate: torch.Tensor,
    weight_up: torch.Tensor | None = None,
    bias_gate: torch.Tensor | None = None,
    bias_up: torch.Tensor | None = None,
) -> str | None:
    """The route cuda_src/linear_glu.cu would take for these tensors (e.g. "sm90 wgmma
    128x(2x128)"), as linear_glu passes them; launches nothing (the untimed heuristic asks it)."""
    wg, wu, _, _ = split_glu_parameters(weight_gate, weight_up, bias_gate, bias_up)
    x2d = as_rows(x)
    wg, wu = (w if _unit_stride(w, 1) or _unit_stride(w, 0) else w.contiguous() for w in (wg, wu))
    out = torch.empty((x2d.shape[0], wg.shape[0]), dtype=x.dtype, device=x.device)
    return extension("gemm").linear_glu_route(_as_gemm_a(x2d), wg, wu, out)


def linear_glu_train(
    x: torch.Tensor,
    weight_gate: torch.Tensor,
    weight_up: torch.Tensor | None = None,
    bias_gate: torch.Tensor | None = None,
    bias_up: torch.Tensor | None = None,
    activation: str = "silu",
    approximate: str = "tanh",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """linear_glu's training forward (out, gate, up): cuda_src/linear_glu.cu does not store the
    pre-activations yet (experiments/NOTES-linear-glu.md, "Next"), so this is eager PyTorch's
    forward (two cuBLAS GEMMs, the gate's activation and the product), whose pre-activations the
    backward reads instead of recomputing them. out is therefore NOT the fused kernel's answer bit
    for bit (16-bit: the products are rounded before the epilogue), only within its tolerance."""
    return torch_ref.linear_glu_train(
        x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate
    )


def fused_mlp_runner(
    weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None], activation: str
):
    """fused_mlp(x, weights, biases, activation) for a contiguous 2-dim x with rows, as one
    allocation and one launcher call (dualk.nn.FusedMLP's planned path: the weights were checked
    once and are contiguous)."""
    launch = extension("mlp").fused_mlp
    weights, biases, code = list(weights), list(biases), ACTIVATION_CODES[activation]
    out_features, dtype, device = weights[-1].shape[0], weights[0].dtype, weights[0].device

    def run(x: torch.Tensor) -> torch.Tensor:
        out = _alloc.empty((x.shape[0], out_features), dtype, device)
        launch(x, weights, biases, out, code)
        return out

    return run


def fused_mlp_plan(
    weights: list, biases: list, activation: str, row_buckets: int, poison: bool, state, call
):
    """The mlp extension's MlpPlan: FusedMLP's planned inference call in one C++ crossing
    (cuda_src/binding_mlp.cpp says what it checks on every call); state and call are
    dualk/core/guards.py Guards. `run(x)` returns mlp(x) or None where the call no longer fits
    the plan."""
    return extension("mlp").MlpPlan(
        weights, biases, ACTIVATION_CODES[activation], row_buckets, poison, state.args(),
        call.args(),
    )  # fmt: skip


def fused_mlp_unsupported_reason(widths: Sequence[int], dtype: torch.dtype) -> str | None:
    return extension("mlp").fused_mlp_unsupported_reason(list(widths), DTYPE_CODES[dtype], 0)


def fused_mlp_kernel(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None],
    activation: str = "relu",
) -> str | None:
    """Which CUDA kernel fused_mlp would launch for these tensors (the planner's choice, with its
    fallbacks; alignment and the GPU decide some), e.g. "sm90 wgmma wide, TMA-streamed weights";
    None where it would refuse them. Launches nothing (dualk.explain and the tests ask it)."""
    x2d, weights, biases = _mlp_operands(x, weights, biases)
    out = torch.empty((x2d.shape[0], weights[-1].shape[0]), dtype=x.dtype, device=x.device)
    return extension("mlp").fused_mlp_kernel(
        x2d, weights, biases, out, ACTIVATION_CODES[activation]
    )


def _mlp_operands(x, weights, biases) -> tuple[torch.Tensor, list, list]:
    """fused_mlp's operands as the launcher takes them: x as rows with unit inner stride, the
    weights and biases contiguous."""
    x2d = as_rows(x)
    if not _unit_stride(x2d, 1):
        x2d = x2d.contiguous()
    return (
        x2d, [w.contiguous() for w in weights],
        [None if b is None else b.contiguous() for b in biases],
    )  # fmt: skip


def fused_mlp(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None],
    activation: str = "relu",
) -> torch.Tensor:
    x2d, weights, biases = _mlp_operands(x, weights, biases)
    out, out_rows = _alloc.rows_output(x, weights[-1].shape[0])
    if out.numel():
        extension("mlp").fused_mlp(x2d, weights, biases, out_rows, ACTIVATION_CODES[activation])
    return out
