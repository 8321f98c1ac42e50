"""The "cuda" backend: a torch extension JIT-built (ninja) from cuda_src/ on first use, cached on
disk under a key of the sources, the toolchain and the GPU architectures, plus thin wrappers that
shape each operator's tensors for its launcher.

Kernels and launchers in cuda_src/*.cu are plain CUDA C++; cuda_src/binding.cpp is the one file
that includes torch: it checks arguments, takes the tensor's device guard and the current stream.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import torch

from .. import _alloc
from ..errors import BackendUnavailableError
from ..layout import MAX_DIMS, as_rows, fit_plan, plan_elementwise
from . import allow_tf32

KERNEL_SOURCES = (
    "add.cu", "relu_scale.cu", "matmul.cu", "linear_gelu.cu",
    # fused_mlp: one operator, four translation units sharing fused_mlp_kernels.cuh (compile time)
    "fused_mlp.cu", "fused_mlp_mma.cu", "fused_mlp_sm90.cu", "fused_mlp_tf32.cu",
)  # fmt: skip
BINDING_SOURCE = "binding.cpp"
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # launchers.h DType
ACTIVATION_CODES = {"none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 2, "gelu_erf": 3, "silu": 4}

_lock = threading.Lock()
_extension = None
_build_error: str | None = None


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


def _build(verbose: bool = False):
    from torch.utils.cpp_extension import load

    src = source_dir()
    arch = arch_flags()
    key = build_key(arch)
    directory = cache_root() / "cuda" / key
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "build.log"
    try:
        module = load(
            name=f"dualk_cuda_{key}",
            sources=[str(src / BINDING_SOURCE)] + [str(src / f) for f in KERNEL_SOURCES],
            extra_include_paths=[str(src)],
            extra_cflags=["-O3", "-std=c++17"],
            # No --use_fast_math: its tanh.approx put fp32 GELU 10x outside PyTorch's error.
            extra_cuda_cflags=["-O3", "-std=c++17", "-lineinfo", *arch],
            build_directory=str(directory),
            verbose=verbose,
        )
    except Exception as exc:  # the compiler's output is in the exception text
        log.write_text(f"{type(exc).__name__}: {exc}\n")
        raise BackendUnavailableError(
            f"building the CUDA extension failed ({type(exc).__name__}); log: {log}"
        ) from exc
    return module


def extension(verbose: bool = False):
    """The built extension module, building it on first use (raises when that cannot work)."""
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
            if reason is not None:
                _build_error = reason
                raise BackendUnavailableError(reason)
    return _extension


def _toolchain_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device is visible to PyTorch"
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


def _as_gemm_a(a3: torch.Tensor) -> torch.Tensor:
    """(batch, m, k) with unit stride along k: native for row-major and sliced views; a
    transposed A is copied once (the kernels read A along k)."""
    return a3 if _unit_stride(a3, 2) else a3.contiguous()


def _as_gemm_b(b3: torch.Tensor) -> torch.Tensor:
    """(batch, k, n) with unit stride along n (row-major B) or along k (an nn.Linear weight's
    transpose): both native; anything else is copied once."""
    return b3 if _unit_stride(b3, 2) or _unit_stride(b3, 1) else b3.contiguous()


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    batched = a.dim() == 3 or b.dim() == 3
    a3 = a if a.dim() == 3 else a.unsqueeze(0)
    b3 = b if b.dim() == 3 else b.unsqueeze(0)
    batch = max(a3.shape[0], b3.shape[0])
    m, n = a3.shape[1], b3.shape[2]
    out = _alloc.empty((batch, m, n), a.dtype, a.device)
    if out.numel():
        extension().matmul(_as_gemm_a(a3), _as_gemm_b(b3), out, allow_tf32(a.dtype))
    return out if batched else out[0]


def linear_gelu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    approximate: str = "tanh",
) -> torch.Tensor:
    x2d = as_rows(x)
    out = _alloc.empty((1, x2d.shape[0], weight.shape[0]), x.dtype, x.device)
    if out.numel():
        act = ACTIVATION_CODES["gelu_tanh" if approximate == "tanh" else "gelu_erf"]
        bias = None if bias is None else bias.contiguous()
        extension().linear_gelu(
            _as_gemm_a(x2d.unsqueeze(0)), _as_gemm_b(weight.t().unsqueeze(0)), bias, out, act,
            allow_tf32(x.dtype),
        )  # fmt: skip
    return out.reshape(*x.shape[:-1], weight.shape[0])


def fused_mlp_unsupported_reason(widths: Sequence[int], dtype: torch.dtype) -> str | None:
    return extension().fused_mlp_unsupported_reason(list(widths), DTYPE_CODES[dtype], 0)


def fused_mlp(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None],
    activation: str = "relu",
) -> torch.Tensor:
    x2d = as_rows(x)
    if not _unit_stride(x2d, 1):
        x2d = x2d.contiguous()
    out = _alloc.empty((x2d.shape[0], weights[-1].shape[0]), x.dtype, x.device)
    if out.numel():
        extension().fused_mlp(
            x2d, [w.contiguous() for w in weights],
            [None if b is None else b.contiguous() for b in biases], out,
            ACTIVATION_CODES[activation],
        )  # fmt: skip
    return out.reshape(*x.shape[:-1], weights[-1].shape[0])
