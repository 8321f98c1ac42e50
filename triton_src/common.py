"""Helpers shared by the dualk Triton kernels: activation ids and epilogue, tile ordering, launch
context (interpreter or GPU, SM count).

Activation ids use the numbering of ``cuda_src/launchers.h`` (``enum class Activation``) and
``dualk/registry.py``, so one integer means the same function in both backends.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading

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
def _fast_exp2(x):
    """2^x by ex2.approx.ftz.f32 (2 ulp; denormal results flush to 0, +inf past 128)."""
    return tl.inline_asm_elementwise(
        "ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit
def _fast_rcp(x):
    """1/x by rcp.approx.ftz.f32 (1 ulp; 1/inf = 0)."""
    return tl.inline_asm_elementwise(
        "rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit
def apply_activation(x, ACTIVATION: tl.constexpr, FAST: tl.constexpr):
    """Activation ``ACTIVATION`` (one of the ACT_* ids) of an fp32 block; fp32 out.

    FAST (for fp16/bf16 outputs, whose rounding dwarfs a few fp32 ulps): gelu_tanh and silu as
    x * sigmoid(.): 1 = tl.exp2 and an approximate division (div.full.f32); 2 = PTX
    ex2.approx.ftz and rcp.approx.ftz (two MUFU instructions, no range fix-ups; the
    interpreter, which cannot run PTX, uses 1). 0 = precise (PRECISE_MATH below), for fp32.

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
        if FAST == 2 and PRECISE_MATH:  # one MUFU.EX2 and one MUFU.RCP, no range fix-ups
            x = x * _fast_rcp(1.0 + _fast_exp2(-2.8853900817779268 * z))
        elif FAST:  # exp(-2 z) = 2^(-2 log2(e) z)
            x = tl.fdiv(x, 1.0 + tl.exp2(-2.8853900817779268 * z), ieee_rounding=False)
        elif PRECISE_MATH:
            x = 0.5 * x * (1.0 + libdevice.tanh(z))
        else:
            x = x / (1.0 + tl.exp(-2.0 * z))
    elif ACTIVATION == 3:  # gelu, approximate="none"
        x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    elif ACTIVATION == 4:  # silu
        if FAST == 2 and PRECISE_MATH:
            x = x * _fast_rcp(1.0 + _fast_exp2(-1.4426950408889634 * x))
        elif FAST:
            x = tl.fdiv(x, 1.0 + tl.exp2(-1.4426950408889634 * x), ieee_rounding=False)
        elif PRECISE_MATH:
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


@functools.cache
def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1): launchers then
    use one small fixed config instead of autotuning, which would take minutes there. Read once
    (the first launch), as Triton itself decides at @triton.jit time."""
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


# --- Cheap launches -------------------------------------------------------------------------
#
# ``kernel[grid](...)`` costs 20-30 us of Python per call in Triton 3.6 (argument binding,
# specialization key, option parsing), and ``triton.autotune`` adds its key and hooks on top.
# KernelLauncher keeps the CompiledKernel of each (caller key, argument specialization) and
# launches it through its C launcher directly, which is what JITFunction.run does after its
# cache lookup (same call in Triton 3.6 and 3.9). The first call of a key goes through
# ``kernel[grid]`` (compiling if needed) and records the CompiledKernel it returns.

try:
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - older Triton: always the ordinary path
    _knobs = None


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for launch grids: triton.cdiv costs ~2 us of host time a call (Triton 3.9)."""
    return -(-a // b)


def int_spec(v: int) -> int:
    """What Triton specializes an int argument on: == 1, divisible by 16, needs 64 bits."""
    if v == 1:
        return 1
    return (2 if v % 16 == 0 else 0) | (0 if -0x80000000 <= v <= 0x7FFFFFFF else 4)


def ptr_spec(t: torch.Tensor) -> bool:
    """What Triton specializes a tensor argument on (besides its dtype): 16-byte alignment."""
    return t.data_ptr() % 16 == 0


def align_mask(align: int, *values: int) -> int:
    """Bit i set when ``values[i]`` is a multiple of ``align`` (elements per 16 bytes: 8 for
    fp16/bf16, 4 for fp32) that Triton's own specialization misses (not a multiple of 16). The
    kernel rebuilds such a value as v // ALIGN * ALIGN, a product with a constant, which its
    divisibility analysis sees; tl.multiple_of on a kernel argument changed nothing in the
    compiled code (Triton 3.9). 0 (no hints) is always correct.

    Why: a bf16 row stride of 1000 (2000 bytes, 16-byte aligned) counts as unaligned to Triton,
    and the 128x128x64 GEMM tile then loaded A with scalar 2-byte loads and no cp.async (sm_90
    PTX, Triton 3.9; experiments/NOTES-triton.md)."""
    if align <= 1:
        return 0
    mask = 0
    bit = 1
    for v in values:
        if v & 15 and not v % align:
            mask |= bit
        bit <<= 1
    return mask


class KernelLauncher:
    """Launch ``kernel`` (a @triton.jit function) with cached CompiledKernels.

    ``launch(key, grid, args, num_warps, num_stages)``: ``args`` are all the kernel's parameters
    in signature order, constexprs included; ``key`` must determine every constexpr, the launch
    options, the specialization of the runtime arguments (see int_spec / ptr_spec) and the
    dtypes of the tensor arguments (a key without the dtype once ran an fp16 kernel on bf16
    data). Under the interpreter it is always ``kernel[grid]``.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        self.compiled: dict = {}
        self._stream = None
        self.fast_launches = 0  # counters for benchmarks
        self.slow_launches = 0

    def launch(self, key, grid, args, num_warps, num_stages, device_index=None):
        if interpreting():
            self.kernel[grid](*args, num_warps=num_warps, num_stages=num_stages)
            self.slow_launches += 1
            return
        if self._stream is None:
            from triton.runtime import driver

            self._stream = driver.active.get_current_stream
            self._device = driver.active.get_current_device
        device = self._device() if device_index is None else device_index
        # A CompiledKernel's function handle belongs to the device it was loaded on.
        compiled = self.compiled.get((key, device))
        if compiled is not None:
            stream = self._stream(device)
            # As JITFunction.run launches after its cache lookup (hooks: profilers).
            runtime = _knobs.runtime
            enter, exit_ = runtime.launch_enter_hook, runtime.launch_exit_hook
            metadata = None if enter is None else compiled.launch_metadata(grid, stream, *args)
            compiled.run(
                grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata,
                metadata, enter, exit_, *args,
            )  # fmt: skip
            self.fast_launches += 1
            return
        result = self.kernel[grid](*args, num_warps=num_warps, num_stages=num_stages)
        self.slow_launches += 1
        if _knobs is not None and hasattr(result, "packed_metadata"):
            self.compiled[(key, device)] = result


def bench_configs(launch_with, configs, quantile=0.5):
    """Time ``launch_with(config)`` for each config (as triton.autotune does, with do_bench);
    configs that fail to compile or do not fit are skipped. Returns [(ms, config)], fastest
    first."""
    from triton.testing import do_bench

    timings = []
    for cfg in configs:
        try:
            launch_with(cfg)  # compile and load outside the timing
            ms = do_bench(lambda cfg=cfg: launch_with(cfg), warmup=10, rep=40, quantiles=[quantile])
        except Exception as e:  # OutOfResources, PTXASError, CompileTimeAssertionFailure, ...
            name = type(e).__name__
            optional = isinstance(cfg, tuple) and cfg[:1] == ("tma",)  # any failure: skip it
            if (
                optional
                or name in ("OutOfResources", "PTXASError", "CompileTimeAssertionFailure")
                or ("out of resource" in str(e).lower())
            ):
                continue
            raise
        if isinstance(ms, (list, tuple)):
            ms = ms[0]
        timings.append((ms, cfg))
    if not timings:
        raise RuntimeError("no kernel configuration compiled for this device")
    timings.sort(key=lambda t: t[0])
    return timings


# --- Tuned configs that outlive the process ---------------------------------------------------
#
# Each launcher keeps its choices in a module dict keyed by the exact call (the hot path). On a
# miss, tuned_config asks a persistent store by problem class first (dualk.autotune's cache
# file per GPU and software fingerprint), so a process never re-tunes a class tuned before, and a
# new shape inside a known class costs no timing. Without dualk (triton_src imported alone) the
# choices stay in memory.
_config_store: list = []  # [store or None] once resolved


def config_store():
    """The persistent config store (dualk.autotune.TRITON_STORE), or None."""
    if not _config_store:
        store = None
        try:
            from dualk.dispatch import autotune

            store = autotune.triton_config_store()
        except Exception:  # dualk not importable: memory only
            store = None
        _config_store.append(store)
    return _config_store[0]


def set_config_store(store) -> None:
    """Replace the store (None: memory only); benchmarks and tests."""
    _config_store[:] = [store]


def _timing_forbidden() -> bool:
    """CUDA-graph capture or torch.compile tracing: no timing (do_bench synchronizes)."""
    try:
        if torch.compiler.is_compiling():
            return True
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except (RuntimeError, AttributeError):
        return False


class ConfigSearchDeferred(RuntimeError):
    """Raised by tuned_config on a class without a stored config inside no_config_search():
    dualk's backend="auto" tunes that class in a background process instead (dualk/dispatch/triton_tune.py)."""


_search = threading.local()


@contextlib.contextmanager
def no_config_search():
    """Within the block (this thread only), tuned_config never searches: a class without a
    stored config raises ConfigSearchDeferred (auto's timing in a user's call)."""
    before = getattr(_search, "off", False)
    _search.off = True
    try:
        yield
    finally:
        _search.off = before


def tuned_config(device, namespace, class_key, candidates, launch_with, allowed=None):
    """(config, timings [(ms, config)] fastest first, keep) for one problem class: recalled from
    the store when it holds a config in ``allowed`` (default: ``candidates``), else timed with
    bench_configs and recorded. Under capture or tracing nothing is timed: the first candidate
    (each list puts its best general choice first) with keep=False, so the caller does not cache
    it and the next ordinary call tunes. Inside no_config_search() a class without a stored
    config raises ConfigSearchDeferred (nothing compiled or timed)."""
    store = config_store()
    allowed = set(candidates) if allowed is None else allowed
    if store is not None:
        try:
            timings = store.get(device, namespace, class_key)
        except Exception:  # an unusable store never stops a launch
            timings = None
        if timings and timings[0][1] in allowed:
            return timings[0][1], timings, True
    if getattr(_search, "off", False):
        raise ConfigSearchDeferred(f"{namespace} class {class_key}: no stored config")
    if _timing_forbidden():
        return candidates[0], [], False
    timings = bench_configs(launch_with, candidates)
    if store is not None:
        with contextlib.suppress(Exception):
            store.put(device, namespace, class_key, timings)
    return timings[0][1], timings, True


def pow2_bucket(n: int) -> int:
    """n rounded up to a power of two (0 stays 0), as triton.next_power_of_2, which costs ~2.7 us
    of host time a call (Triton 3.9, a constexpr function): launch paths round with this."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
