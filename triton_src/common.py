"""Helpers shared by the dualk Triton kernels: activation ids and epilogue, tile ordering, launch
context (interpreter or GPU, SM count).

Activation ids use the numbering of ``cuda_src/launchers.h`` (``enum class Activation``) and
``dualk/registry.py``, so one integer means the same function in both backends.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

try:  # libdevice's correctly-rounded-ish tanh/exp on the GPU; the CPU interpreter lacks it
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - very old Triton
    libdevice = None

# tl.exp lowers to ex2.approx (a few ulp off), which took fp32 GELU outside 2x PyTorch's error on
# an H200 (3.2e-7 vs 3.0e-7 allowed); libdevice.tanh matches torch's own formula. The
# interpreter has no libdevice, so it keeps the exp form.
PRECISE_MATH: tl.constexpr = tl.constexpr(
    libdevice is not None and os.environ.get("TRITON_INTERPRET", "") in ("", "0")
)

ACT_NONE = 0
ACT_RELU = 1
ACT_GELU_TANH = 2
ACT_GELU_ERF = 3
ACT_SILU = 4


@triton.jit
def apply_activation(x, ACTIVATION: tl.constexpr):
    """Activation ``ACTIVATION`` (one of the ACT_* ids) of an fp32 block; fp32 out.

    gelu_tanh uses 0.5 * (1 + tanh(z)) == sigmoid(2 z), so gelu(x) = x / (1 + exp(-2 z)): no
    tanh intrinsic (its availability differs across Triton versions) and no cancellation near 0.
    Overflow is benign: exp(-2 z) = inf gives -0, exp(-2 z) = 0 gives x.
    The ids are literals here because a @triton.jit body may only read constexpr globals; they
    match ACT_* above. Constants: sqrt(2/pi) and 1/sqrt(2), as in cuda_src/common.cuh.
    """
    if ACTIVATION == 1:  # relu; NaN < 0 is false, so NaN passes through as with torch.relu
        x = tl.where(x < 0.0, 0.0, x)
    elif ACTIVATION == 2:  # gelu, approximate="tanh"
        z = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        if PRECISE_MATH:
            x = 0.5 * x * (1.0 + libdevice.tanh(z))
        else:
            x = x / (1.0 + tl.exp(-2.0 * z))
    elif ACTIVATION == 3:  # gelu, approximate="none"
        x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    elif ACTIVATION == 4:  # silu
        if PRECISE_MATH:
            x = x / (1.0 + libdevice.exp(-x))
        else:
            x = x / (1.0 + tl.exp(-x))
    return x


@triton.jit
def grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    """(pid_m, pid_n) of linear tile ``tile_id`` in grouped order: GROUP_SIZE_M tile rows are
    walked column by column, so consecutive programs share A rows and B columns in L2."""
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((tile_id % num_pid_in_group) % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


def activation_id(name: str) -> int:
    """ACT_* id of an activation name as dualk spells it ("none", "relu", "gelu" / "gelu_tanh",
    "gelu_erf", "silu")."""
    ids = {
        "none": ACT_NONE,
        "relu": ACT_RELU,
        "gelu": ACT_GELU_TANH,
        "gelu_tanh": ACT_GELU_TANH,
        "gelu_erf": ACT_GELU_ERF,
        "silu": ACT_SILU,
    }
    try:
        return ids[name]
    except KeyError:
        raise ValueError(f"activation must be one of {sorted(ids)}, got {name!r}") from None


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1): launchers then
    use one small fixed config instead of autotuning, which would take minutes there."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def dot_in_fp32(dtype: torch.dtype) -> bool:
    """Whether kernels must upcast ``dtype`` operands to fp32 before tl.dot: only for bfloat16
    in the interpreter, whose tl.dot runs np.matmul on bf16's raw uint16 bits (Triton 3.9).
    bf16 x bf16 products are exact in fp32, so the result matches tensor cores' fp32 accumulation.
    """
    return dtype == torch.bfloat16 and interpreting()


@functools.cache
def _num_sms_cuda(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (persistent grids); 4 off the GPU (interpreter)."""
    if device.type != "cuda":
        return 4
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _num_sms_cuda(index)
