"""The "cuda" backend: a torch extension JIT-built (ninja) from cuda_src/ on first use, cached on
disk under a key of the sources, the toolchain and the GPU architectures, plus thin wrappers that
shape each operator's tensors for its launcher.

Kernels and launchers in cuda_src/*.cu are plain CUDA C++; cuda_src/binding.cpp is the one file
that includes torch: it checks arguments, takes the tensor's device guard and the current stream.

Build and cache faults (tests/test_faults.py):
- no GPU, no nvcc, a failing compile, a cache directory that cannot be created or written: the
  backend is unavailable with a reason naming the build log (`<build dir>/build.log`, or a file
  in the temporary directory when the cache cannot be written). The failure is remembered for the
  process; the first one also gives one BackendWarning (the reason "auto" skips the backend),
  except for a machine without a GPU, where the CUDA backend is simply not expected;
- one builder per build directory across processes: an exclusive flock on `<build dir>/.lock`
  around the build, so a second process waits and then loads the first one's result. A `lock`
  file left by torch's own FileBaton (a build killed midway) is stale while we hold the flock and
  is removed (torch would wait on it forever);
- a built library that cannot be loaded (truncated, corrupt): the directory's artefacts are
  removed and the extension is rebuilt once; a second failure is an error naming the log;
- the build directory is keyed by a hash of every source byte, the toolchain and the target
  architectures (`build_key`), so edited sources never load an old library.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import struct
import sys
import tempfile
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from .. import _alloc
from ..errors import BackendUnavailableError, BackendWarning
from ..layout import MAX_DIMS, as_rows, fit_plan, plan_elementwise
from . import allow_tf32

KERNEL_SOURCES = (
    "add.cu", "relu_scale.cu", "matmul.cu", "linear_gelu.cu",
    # fused_mlp: one operator, five translation units sharing fused_mlp_kernels.cuh (compile time)
    "fused_mlp.cu", "fused_mlp_mma.cu", "fused_mlp_sm90.cu", "fused_mlp_tf32.cu", "fused_mlp_wide.cu",
)  # fmt: skip
BINDING_SOURCE = "binding.cpp"
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # launchers.h DType
ACTIVATION_CODES = {"none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 2, "gelu_erf": 3, "silu": 4}

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: torch's own FileBaton still serialises builds
    fcntl = None

_lock = threading.Lock()
_extension = None
_build_error: str | None = None
NO_DEVICE = "no CUDA device is visible to PyTorch"
LOG_NAME = "build.log"
LOCK_NAME = ".lock"  # ours (flock); torch's FileBaton uses "lock"


def source_dir() -> Path:
    """cuda_src/, inside the installed package (or the checkout for an editable install)."""
    try:
        from importlib.resources import files

        path = Path(str(files("dualk.cuda_src")))
        if (path / BINDING_SOURCE).is_file():
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


def arch_flags() -> list[str]:
    """One -gencode per distinct architecture among the visible GPUs; Hopper gets sm_90a (wgmma,
    setmaxnreg need the arch-specific target)."""
    caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    flags = []
    for major, minor in caps:
        arch = f"{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")
        flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
    return flags


def _nvcc() -> str | None:
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME and (Path(CUDA_HOME) / "bin" / "nvcc").exists():
        return str(Path(CUDA_HOME) / "bin" / "nvcc")
    return shutil.which("nvcc")


def build_key(arch: Sequence[str]) -> str:
    """Hash of every source byte, the toolchain and the target architectures."""
    h = hashlib.sha256()
    src = source_dir()
    for path in sorted(src.iterdir()):
        if path.suffix in (".cu", ".cuh", ".h", ".cpp"):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    h.update(f"{torch.__version__}|{torch.version.cuda}|{sys.version_info[:2]}|{arch}".encode())
    return h.hexdigest()[:16]


def build_directory() -> Path:
    return cache_root() / "cuda" / build_key(arch_flags())


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
    """Everything a build left in `directory` (library, objects, ninja files, torch's lock),
    but our lock file, which other processes may be waiting on."""
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


def _build(verbose: bool = False):
    from torch.utils import cpp_extension

    src = source_dir()
    arch = arch_flags()
    key = build_key(arch)
    directory = cache_root() / "cuda" / key

    def load():
        return cpp_extension.load(
            name=f"dualk_cuda_{key}",
            sources=[str(src / BINDING_SOURCE)] + [str(src / f) for f in KERNEL_SOURCES],
            extra_include_paths=[str(src)],
            extra_cflags=["-O3", "-std=c++17"],
            # No --use_fast_math: its tanh.approx put fp32 GELU 10x outside PyTorch's error.
            extra_cuda_cflags=["-O3", "-std=c++17", "-lineinfo", *arch],
            build_directory=str(directory),
            verbose=verbose,
        )

    with contextlib.ExitStack() as stack:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            stack.enter_context(_build_lock(directory))
        except OSError as exc:
            log = _write_log(
                None, key, f"cannot create or write {directory}: {type(exc).__name__}: {exc}\n"
            )
            raise BackendUnavailableError(
                f"the CUDA build cache {directory} cannot be created or written "
                f"({type(exc).__name__}: {exc}); set DUALK_CACHE_DIR to a writable directory; "
                f"{_log_note(log)}"
            ) from exc
        # We hold the flock, so no dualk process is building here: a torch FileBaton left by a
        # killed build is stale, and torch would wait on it forever.
        with contextlib.suppress(FileNotFoundError):
            (directory / "lock").unlink()
        history = ""  # what was repaired on the way (kept in the log)
        for so in sorted(directory.glob("*.so")):
            damage = _truncated_library(so)
            if damage is not None:  # loading it could kill the process (SIGBUS): start afresh
                history += (
                    f"the cached library {so.name} {damage}; removed the build directory's "
                    "artefacts and rebuilt\n"
                )
                _remove_artefacts(directory)
                break
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
                    f"the CUDA extension in {directory} {what} ({type(exc).__name__}: "
                    f"{_first_line(exc)}); {_log_note(log)}"
                ) from exc
        # A log from an earlier failure would mislead now; a repair's note is worth keeping.
        if history:
            _write_log(directory, key, history)
        else:
            with contextlib.suppress(OSError):
                (directory / LOG_NAME).unlink()
        return module


def _first_line(exc: BaseException, limit: int = 200) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:limit] if text else ""


def extension(verbose: bool = False):
    """The built extension module, building it on first use (raises when that cannot work).
    A failure is remembered for the process; the first one warns once (BackendWarning)."""
    global _extension, _build_error
    if _extension is not None:
        return _extension
    with _lock:
        if _extension is None:
            if _build_error is not None:
                raise BackendUnavailableError(_build_error)
            reason = _toolchain_reason()
            if reason is None:
                try:
                    _extension = _build(verbose)
                except BackendUnavailableError as exc:
                    reason = str(exc)
                except Exception as exc:  # anything else on the way (a device query, sources)
                    reason = f"preparing the CUDA build failed ({type(exc).__name__}: {exc})"
            if reason is not None:
                _build_error = reason
                if reason != NO_DEVICE:
                    warnings.warn(
                        f"dualk: the CUDA backend is unavailable: {reason}. backend='auto' runs "
                        "the other backends; backend='cuda' raises BackendUnavailableError.",
                        BackendWarning,
                        stacklevel=2,
                    )
                raise BackendUnavailableError(reason)
    return _extension


def _toolchain_reason() -> str | None:
    if not torch.cuda.is_available():
        return NO_DEVICE
    if _nvcc() is None:
        return "nvcc was not found (set CUDA_HOME or put nvcc on PATH) so the CUDA kernels cannot be built"
    return None


def unavailable_reason(device: torch.device) -> str | None:
    if device.type != "cuda":
        return f"the CUDA backend needs CUDA tensors; the input is on {device}"
    if _extension is not None:
        return None
    try:
        extension()
    except BackendUnavailableError as exc:
        return str(exc)
    return None


# ---------------------------------------------------------------------------- operators
def add(a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    if (  # the common call: one C++ round trip allocates and launches
        _extension is not None
        and not _alloc.poisoning()
        and a.shape == b.shape
        and a.is_contiguous()
        and b.is_contiguous()
    ):
        return _extension.add_dense(a, b, alpha)
    plan = plan_elementwise(a, b)
    out = _alloc.empty(plan.out_shape, a.dtype, a.device)
    if plan.numel:
        a, b, plan = fit_plan(plan, MAX_DIMS, a, b)
        extension().add(a, b, out, alpha, plan.sizes, *plan.strides, plan.dense)
    return out


def relu_scale(x: torch.Tensor, scale: float) -> torch.Tensor:
    if _extension is not None and not _alloc.poisoning() and x.is_contiguous():
        return _extension.relu_scale_dense(x, scale)
    plan = plan_elementwise(x)
    out = _alloc.empty(plan.out_shape, x.dtype, x.device)
    if plan.numel:
        x, plan = fit_plan(plan, MAX_DIMS, x)
        extension().relu_scale(x, out, scale, plan.sizes, plan.strides[0], plan.dense)
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
        extension().matmul(_as_gemm_a(a), _as_gemm_b(b), out, allow_tf32(a.dtype))
    return out


def linear_gelu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    approximate: str = "tanh",
) -> torch.Tensor:
    x2d = as_rows(x)
    out = _alloc.empty((x2d.shape[0], weight.shape[0]), x.dtype, x.device)
    if out.numel():
        act = ACTIVATION_CODES["gelu_tanh" if approximate == "tanh" else "gelu_erf"]
        if not (_unit_stride(weight, 1) or _unit_stride(weight, 0)):
            weight = weight.contiguous()  # B = weight^T needs unit stride along k or n
        bias = None if bias is None else bias.contiguous()
        extension().linear_gelu(
            _as_gemm_a(x2d), weight, bias, out, act, allow_tf32(x.dtype)
        )  # fmt: skip
    if x.dim() == 2:
        return out
    return out.reshape(*x.shape[:-1], weight.shape[0])


def fused_mlp_runner(
    weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None], activation: str
):
    """fused_mlp(x, weights, biases, activation) for a contiguous 2-dim x with rows, as one
    allocation and one launcher call (dualk.nn.FusedMLP's planned path: the weights were checked
    once and are contiguous)."""
    launch = extension().fused_mlp
    weights, biases, code = list(weights), list(biases), ACTIVATION_CODES[activation]
    out_features, dtype, device = weights[-1].shape[0], weights[0].dtype, weights[0].device

    def run(x: torch.Tensor) -> torch.Tensor:
        out = _alloc.empty((x.shape[0], out_features), dtype, device)
        launch(x, weights, biases, out, code)
        return out

    return run


def fused_mlp_unsupported_reason(widths: Sequence[int], dtype: torch.dtype) -> str | None:
    return extension().fused_mlp_unsupported_reason(list(widths), DTYPE_CODES[dtype], 0)


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
    return extension().fused_mlp_kernel(x2d, weights, biases, out, ACTIVATION_CODES[activation])


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
    out = _alloc.empty((x2d.shape[0], weights[-1].shape[0]), x.dtype, x.device)
    if out.numel():
        extension().fused_mlp(x2d, weights, biases, out, ACTIVATION_CODES[activation])
    if x.dim() == 2:  # the common case: no reshape (a dispatcher call) on the hot path
        return out
    return out.reshape(*x.shape[:-1], weights[-1].shape[0])
