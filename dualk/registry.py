"""The operator registry: one table that the dispatcher, the tests, the benchmarks and the CLI
all read. What an operator needs besides its kernels is listed in CONTRIBUTING.md ("Adding an
operator"); an entry alone is enough for dispatch, auto, explain and the benchmark.

Each entry says: the operator's name; its PyTorch reference (the "torch" backend, and on float64
inputs the oracle); its implementation per backend; the order "auto" tries them in; its shape
cases (random-input makers) for tests and benchmarks; its cost model (FLOPs and the fewest bytes
moved, for roofline percentages); how its results are judged (a per-dtype tolerance table for
elementwise ops, "within 2x PyTorch's own error" for the GEMM family); and auto's shape-class key
(`key`, `key_fields`).
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from .backends import tf32_allowed, torch_ref
from .core.errors import InvalidArgumentError
from .core.layout import layout_code, row_count

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ALL_DTYPES = DTYPES
HALF_DTYPES = (torch.bfloat16, torch.float16)
FP32, FP16, BF16 = (torch.float32,), (torch.float16,), (torch.bfloat16,)

# |out - ref| <= atol + rtol * |ref| against a float64 reference, for ops that round once
# (compute in fp32, store in the dtype): rtol is twice the dtype's half-ulp.
ELEMENTWISE_TOLERANCE: Mapping[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-6, 2.4e-7),
    torch.float16: (1e-7, 1e-3),
    torch.bfloat16: (1e-7, 8e-3),
}


@dataclass(frozen=True)
class Sample:
    """Positional and keyword arguments of one call (without `backend`)."""

    args: tuple
    kwargs: dict
    label: str

    def first_tensor(self) -> torch.Tensor:
        return self.args[0]


@dataclass(frozen=True)
class ShapeCase:
    """A named family of inputs; `make(dtype, device, generator)` draws a fresh random Sample."""

    name: str
    make: Callable[[torch.dtype, torch.device, torch.Generator], Sample]
    gpu_only: bool = False  # too large for Triton's CPU interpreter
    bench: bool = False  # part of the benchmark suites (default and up)
    quick: bool = False  # part of the quick benchmark suite
    bench_dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
    # The dtypes the parity tests check (None: all). Every case checks all three today; the long-k
    # split-K cases were 16-bit only until both backends split fp32's k too (one pass summed k in
    # order: 20x cuBLAS's error at k = 65536 on an H100, above the parity rule's fp32 floor).
    test_dtypes: tuple[torch.dtype, ...] | None = None


@dataclass(frozen=True)
class Cost:
    flops: float
    bytes: float


@dataclass(frozen=True)
class OpSpec:
    name: str
    reference: Callable[..., torch.Tensor]
    implementations: Mapping[str, str]  # backend -> "module:function" under dualk.backends
    auto_order: tuple[str, ...]  # the order "auto" tries backends in ...
    cases: tuple[ShapeCase, ...]
    cost: Callable[[Sample], Cost]
    judged_by: Literal["elementwise", "gemm"]
    # ... unless this dtype has its own order (measured winners differ by dtype)
    auto_order_by_dtype: Mapping[torch.dtype, tuple[str, ...]] = field(default_factory=dict)
    # backends that have no implementation of this op yet -> why (dispatch reports it)
    missing: Mapping[str, str] = field(default_factory=dict)
    # auto's shape-class key of the implementations' arguments: (name, device index, dtype,
    # tf32, *fields), key_fields naming the fields (the built-in operators' are below, beside
    # their cases); required of an operator added by register()
    key: Callable[[tuple], tuple] | None = None
    key_fields: tuple[str, ...] = ()
    # raises a DualkError unless the implementations' arguments make a valid call (explain and
    # runtime.operators.run call it; the built-in operators check in dualk/runtime/operators.py)
    check: Callable[..., Any] | None = None
    # (backend, the implementations' arguments) -> why that backend's kernel cannot run this
    # shape, or None; asked by auto only where the answer needs no build (Triton: its background
    # tuner would only fail on such a class)
    kernel_limit: Callable[[str, tuple], str | None] | None = None
    _resolved: dict = field(default_factory=dict, compare=False, repr=False)

    @functools.cached_property
    def env_var(self) -> str:
        return f"DUALK_BACKEND_{self.name.upper()}"

    @functools.cached_property
    def env_key(self) -> bytes:
        """env_var as os.environ's POSIX bytes key (dualk.dispatch looks it up directly)."""
        return self.env_var.encode()

    @property
    def backends(self) -> tuple[str, ...]:
        return tuple(self.implementations)

    def missing_reason(self, backend: str) -> str | None:
        """Why `backend` has no implementation of this operator (None when it has one)."""
        if backend in self.implementations:
            return None
        return self.missing.get(backend, f"the {backend} backend has no {self.name} kernel")

    def implementation(self, backend: str) -> Callable[..., Any]:
        fn = self._resolved.get(backend)
        if fn is None:
            target = self.implementations[backend]  # "module:function", or the function itself
            if callable(target):
                fn = target
            else:
                module, name = target.split(":")
                fn = getattr(importlib.import_module(f"dualk.backends.{module}"), name)
            self._resolved[backend] = fn
        return fn

    def auto_order_for(self, dtype: torch.dtype) -> tuple[str, ...]:
        return self.auto_order_by_dtype.get(dtype, self.auto_order)

    def backend_function(self, backend: str, function: str) -> Callable[..., Any]:
        """Another function of the module that implements this op on `backend` (e.g. a limit
        check beside the kernel wrapper)."""
        module = self.implementations[backend].split(":")[0]
        return getattr(importlib.import_module(f"dualk.backends.{module}"), function)

    def case(self, name: str) -> ShapeCase:
        for c in self.cases:
            if c.name == name:
                return c
        raise KeyError(
            f"{self.name} has no shape case {name!r}; known: {[c.name for c in self.cases]}"
        )


# ---------------------------------------------------------------------------- input makers
def randn(shape, dtype, device, gen, scale: float = 1.0) -> torch.Tensor:
    """Standard normal values (never zeros), drawn on the CPU for reproducibility."""
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * scale).to(dtype).to(device)


def _misaligned(shape, dtype, device, gen) -> torch.Tensor:
    """A contiguous view whose data starts one element past an allocation (not 16-byte aligned)."""
    n = math.prod(shape)
    return randn((n + 1,), dtype, device, gen)[1:].view(shape)


def _case(name, make, **flags) -> ShapeCase:
    return ShapeCase(name, make, **flags)


# ---- add
def _add_sample(a, b, label, alpha=1.0) -> Sample:
    return Sample((a, b), {"alpha": alpha}, label)


def _add_cases() -> tuple[ShapeCase, ...]:
    def flat(n, **flags):
        return _case(
            f"n={n}" if n < 2**20 else f"n=2^{int(math.log2(n))}",
            lambda dt, dev, g: _add_sample(randn(n, dt, dev, g), randn(n, dt, dev, g), f"n={n}"),
            **flags,
        )

    return (
        flat(1),
        flat(1023),
        flat(4097),
        _case("empty", lambda dt, dev, g: _add_sample(randn(0, dt, dev, g), randn(0, dt, dev, g), "n=0")),
        _case("alpha", lambda dt, dev, g: _add_sample(randn(777, dt, dev, g), randn(777, dt, dev, g), "n=777 alpha=-1.5", -1.5)),
        _case("noncontig", lambda dt, dev, g: _add_sample(randn((33, 64), dt, dev, g)[:, ::2], randn((33, 32), dt, dev, g), "(33,64)[:, ::2] + (33,32)")),
        _case("transposed", lambda dt, dev, g: _add_sample(randn((40, 24), dt, dev, g).t(), randn((24, 40), dt, dev, g), "(40,24).T + (24,40)")),
        _case("misaligned", lambda dt, dev, g: _add_sample(_misaligned((1031,), dt, dev, g), randn(1031, dt, dev, g), "offset-1 view n=1031")),
        _case("broadcast", lambda dt, dev, g: _add_sample(randn((16, 1, 33), dt, dev, g), randn((9, 33), dt, dev, g), "(16,1,33) + (9,33)")),
        _case("scalar_operand", lambda dt, dev, g: _add_sample(randn((5, 7), dt, dev, g), randn((), dt, dev, g), "(5,7) + ()")),
        _case("deep", lambda dt, dev, g: _add_sample(randn((2, 3, 2, 3, 2, 3, 2, 3, 2, 4), dt, dev, g)[..., ::2], randn((3, 1, 2), dt, dev, g), "10-dim strided + broadcast")),
        flat(2**16),
        flat(2**22, gpu_only=True),
        flat(2**20, gpu_only=True, bench=True, quick=True),
        flat(2**24, gpu_only=True, bench=True),
        flat(2**28, gpu_only=True, bench=True),
    )  # fmt: skip


def _add_cost(s: Sample) -> Cost:
    a, b = s.args
    out_numel = torch.broadcast_shapes(a.shape, b.shape).numel()
    return Cost(2.0 * out_numel, (a.numel() + b.numel() + out_numel) * a.element_size())


# Auto's shape-class key of an operator's implementation arguments (OpSpec.key): (name, device
# index, dtype, TF32 allowed, *fields), OpSpec.key_fields naming the fields for the key's text in
# the cache file (dualk/dispatch/keys.py). Sizes that are bucketed are stored as exponents e
# (n <= 2^e; -1 for 0); the device and the dtype are always part of the key; fp32 with TF32
# allowed is its own class for the matrix ops; layouts are core.layout.layout_code's letters;
# scalars (alpha, scale) are not part of the key: they do not change the cost. The cache file,
# explain and `dualk cache show` name each class by the key's text (tests/test_autotune_keys.py
# pins it).
_F32 = torch.float32
_shape_of = torch.Tensor.shape.__get__


def _add_key(args) -> tuple:
    """numel of the larger input rounded up to a power of two (the output's numel unless both
    inputs broadcast); broadcast (shapes differ) or not; dense (both contiguous) or strided."""
    a = args[0]
    b = args[1]
    na = a.numel()
    nb = b.numel()
    n = na if na >= nb else nb
    return (
        "add", a.get_device(), a.dtype, False, (n - 1).bit_length() if n else -1,
        na != nb or a.shape != b.shape,
        "c" if a.is_contiguous() and b.is_contiguous() else "s",
    )  # fmt: skip


# ---- relu_scale
def _relu_cases() -> tuple[ShapeCase, ...]:
    def s(x, label, scale=1.5) -> Sample:
        return Sample((x, scale), {}, label)

    def flat(n, **flags):
        return _case(
            f"n={n}" if n < 2**20 else f"n=2^{int(math.log2(n))}",
            lambda dt, dev, g: s(randn(n, dt, dev, g), f"n={n}"),
            **flags,
        )

    return (
        flat(1),
        flat(1023),
        flat(4097),
        _case("empty", lambda dt, dev, g: s(randn((0, 5), dt, dev, g), "(0,5)")),
        _case("negative_scale", lambda dt, dev, g: s(randn(333, dt, dev, g), "n=333 scale=-0.75", -0.75)),
        _case("noncontig", lambda dt, dev, g: s(randn((33, 64), dt, dev, g)[:, ::2], "(33,64)[:, ::2]")),
        _case("transposed", lambda dt, dev, g: s(randn((40, 24), dt, dev, g).t(), "(40,24).T")),
        _case("misaligned", lambda dt, dev, g: s(_misaligned((1031,), dt, dev, g), "offset-1 view n=1031")),
        _case("expanded", lambda dt, dev, g: s(randn((1, 33), dt, dev, g).expand(16, 33), "(1,33).expand(16,33)")),
        flat(2**16),
        flat(2**22, gpu_only=True),
        flat(2**20, gpu_only=True, bench=True, quick=True),
        flat(2**24, gpu_only=True, bench=True),
        flat(2**28, gpu_only=True, bench=True),
    )  # fmt: skip


def _relu_cost(s: Sample) -> Cost:
    x = s.args[0]
    return Cost(2.0 * x.numel(), 2.0 * x.numel() * x.element_size())


def _relu_key(args) -> tuple:
    """numel rounded up to a power of two; contiguous or strided."""
    x = args[0]
    n = x.numel()
    return (
        "relu_scale", x.get_device(), x.dtype, False, (n - 1).bit_length() if n else -1,
        "c" if x.is_contiguous() else "s",
    )  # fmt: skip


# ---- matmul
def _mm_cases() -> tuple[ShapeCase, ...]:
    def mm(m, k, n, label=None, batch=None, a_view=None, b_view=None, **flags):
        def make(dt, dev, g):
            ashape = (m, k) if batch is None else (batch, m, k)
            bshape = (k, n) if batch is None else (batch, k, n)
            scale = 1.0 / math.sqrt(max(k, 1))
            a = randn(ashape, dt, dev, g) if a_view is None else a_view(dt, dev, g)
            b = randn(bshape, dt, dev, g, scale) if b_view is None else b_view(dt, dev, g)
            return Sample(
                (a, b), {}, label or f"{m}x{k}x{n}" + (f" batch {batch}" if batch else "")
            )

        return _case(label or f"{m}x{k}x{n}" + (f"_b{batch}" if batch else ""), make, **flags)

    return (
        mm(1, 1, 1, "tiny"),
        mm(17, 33, 9, "odd"),
        mm(64, 64, 64, "square"),
        mm(200, 24, 8, "tall_skinny"),
        mm(8, 40, 200, "wide"),
        mm(17, 24, 10, "batched", batch=3),
        mm(20, 30, 12, "transposed", a_view=lambda dt, dev, g: randn((30, 20), dt, dev, g).t(),
           b_view=lambda dt, dev, g: randn((12, 30), dt, dev, g, 0.2).t()),
        mm(20, 29, 12, "sliced", a_view=lambda dt, dev, g: randn((20, 30), dt, dev, g)[:, 1:],
           b_view=lambda dt, dev, g: randn((30, 13), dt, dev, g, 0.2)[1:, 1:]),
        mm(0, 8, 5, "empty"),
        mm(6, 0, 5, "k0"),
        mm(1000, 17, 4097, "odd_large", gpu_only=True),
        # Few output tiles, long k: CUDA split-K (16-bit: 17 slices of 288 and a tail of 104;
        # fp32: 52 slices of 96 and a tail of 8; a second
        # row of tiles cut short; k-major B), and a broadcast-free weight-gradient shape.
        mm(72, 5000, 40, "split_k_odd", gpu_only=True),
        mm(64, 4000, 48, "split_k_kmajor", gpu_only=True,
           b_view=lambda dt, dev, g: randn((48, 4000), dt, dev, g, 1 / 64).t()),
        mm(64, 65536, 64, "weight_grad", gpu_only=True),
        # Hopper GEMM configs (gemm_sm90.cuh launch() on 132 SMs): cooperative 128x256 with TMA
        # stores, and cooperative 128x128 with n = 1001 (k-major B), whose C rows TMA cannot store.
        mm(2048, 256, 2048, "sm90_wide_tiles", gpu_only=True),
        mm(2048, 264, 1001, "sm90_direct_store", gpu_only=True,
           b_view=lambda dt, dev, g: randn((1001, 264), dt, dev, g, 1 / 16).t()),
        # Rows that do not start on 32-byte sectors (16-bit rows of 1000, 200 and 264 elements),
        # which TMA reads at a fraction of its rate (NOTES-gemm-sm90.md, sessions 12 and 14): A and
        # n-major B, B alone, and batched.
        mm(1000, 1000, 1000, "sm90_rows_16b_off", gpu_only=True),
        mm(700, 512, 1000, "sm90_rows_16b_off_b", gpu_only=True),
        mm(300, 200, 264, "sm90_rows_16b_off_batched", batch=3, gpu_only=True),
        # B rows 16 bytes off a sector with 128 x 256 tiles: CTA pairs; 17 tile rows, so the last
        # pair's second CTA computes zeros and stores nothing
        mm(2100, 520, 3000, "sm90_pairs_odd_tile_rows", gpu_only=True),
        mm(1024, 1024, 1024, "1024^3", gpu_only=True, bench=True, quick=True, bench_dtypes=ALL_DTYPES),
        mm(4096, 4096, 4096, "4096^3", gpu_only=True, bench=True, bench_dtypes=ALL_DTYPES),
        mm(8192, 8192, 8192, "8192^3", gpu_only=True, bench=True, bench_dtypes=HALF_DTYPES),
        # Few tiles / long K / odd sizes, where cuBLAS's own heuristics shine (issue 14).
        mm(4096, 1000, 4096, "4096x1000x4096", gpu_only=True, bench=True, bench_dtypes=BF16),
        mm(3000, 2000, 5000, "3000x2000x5000", gpu_only=True, bench=True, bench_dtypes=BF16),
        mm(128, 8192, 128, "128x8192x128", gpu_only=True, bench=True, bench_dtypes=BF16),
    )  # fmt: skip


def _mm_cost(s: Sample) -> Cost:
    a, b = s.args
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = a.shape[0] if a.dim() == 3 else b.shape[0] if b.dim() == 3 else 1
    return Cost(2.0 * batch * m * n * k, (a.numel() + b.numel() + batch * m * n) * a.element_size())


def _mm_key(args) -> tuple:
    """M and the batch rounded up to a power of two; K and N exact; 2-D/3-D operands; the
    layout of each operand."""
    a = args[0]
    b = args[1]
    sa = _shape_of(a)
    sb = _shape_of(b)
    da = len(sa)
    db = len(sb)
    batch = sa[0] if da == 3 else (sb[0] if db == 3 else 1)
    m = sa[-2]
    dtype = a.dtype
    return (
        "matmul", a.get_device(), dtype, dtype is _F32 and tf32_allowed(), da * 10 + db,
        (batch - 1).bit_length() if batch else -1, (m - 1).bit_length() if m else -1,
        sa[-1], sb[-1], layout_code(a) + layout_code(b),
    )  # fmt: skip


# ---- linear_gelu
def _lg_cases() -> tuple[ShapeCase, ...]:
    def lg(batch_shape, k, n, label, bias=True, approximate="tanh", w_view=None, **flags):
        def make(dt, dev, g):
            x = randn((*batch_shape, k), dt, dev, g)
            w = (
                randn((n, k), dt, dev, g, 1.0 / math.sqrt(max(k, 1)))
                if w_view is None
                else w_view(dt, dev, g)
            )
            b = randn(n, dt, dev, g, 0.5) if bias else None
            return Sample((x, w, b), {"approximate": approximate}, label)

        return _case(label, make, **flags)

    return (
        lg((1,), 1, 1, "tiny"),
        lg((17,), 33, 20, "odd"),
        lg((2, 5), 24, 16, "batched_x"),
        lg((9,), 40, 24, "no_bias", bias=False),
        lg((9,), 40, 24, "erf", approximate="none"),
        lg((12,), 30, 20, "weight_view", w_view=lambda dt, dev, g: randn((30, 20), dt, dev, g, 0.2).t()),
        lg((0,), 16, 8, "empty"),
        lg((5,), 0, 8, "k0"),
        lg((64,), 64, 64, "square"),
        lg((50,), 6000, 24, "split_k", gpu_only=True),  # bias + GELU after the sum
        # Hopper GEMM configs (gemm_sm90.cuh launch() on 132 SMs): ping-pong 128x128 with ~3 tiles
        # per CTA (both consumers, the order barriers), and the same with n = 3001, whose rows
        # TMA cannot store (the direct stores inside a TMA-store config).
        lg((2048,), 512, 3072, "sm90_pingpong", gpu_only=True),
        lg((4096,), 512, 3001, "sm90_pingpong_direct_store", gpu_only=True),
        lg((600,), 1000, 1256, "sm90_rows_16b_off", gpu_only=True),  # x and W rows of 2000 bytes
        # W rows of 2064 bytes, k > 1024 and 17 tile rows: the 128 x 256 CTA pairs, W k-major
        lg((2100,), 1032, 3000, "sm90_pairs_odd_tile_rows", gpu_only=True),
        lg((32,), 768, 3072, "B32_768_3072", gpu_only=True, bench=True, quick=True, bench_dtypes=(*FP32, *BF16)),
        lg((8192,), 768, 3072, "B8192_768_3072", gpu_only=True, bench=True, bench_dtypes=(*FP32, *BF16)),
        lg((4096,), 4096, 16384, "B4096_4096_16384", gpu_only=True, bench=True, bench_dtypes=BF16),
        lg((1000,), 1000, 1000, "B1000_1000_1000", gpu_only=True, bench=True, bench_dtypes=ALL_DTYPES),
    )  # fmt: skip


def _lg_cost(s: Sample) -> Cost:
    x, w, b = s.args
    m = x.numel() // max(x.shape[-1], 1)
    n, k = w.shape
    nbytes = (x.numel() + w.numel() + (n if b is not None else 0) + m * n) * x.element_size()
    return Cost(2.0 * m * n * k + 8.0 * m * n, nbytes)


def _lg_key(args) -> tuple:
    """M (rows of x) rounded up to a power of two; K and N exact; bias or not; `approximate`;
    the layouts of x and weight."""
    x = args[0]
    w = args[1]
    m = row_count(x)
    dtype = x.dtype
    return (
        "linear_gelu", x.get_device(), dtype, dtype is _F32 and tf32_allowed(),
        (m - 1).bit_length() if m else -1, x.shape[-1], w.shape[0], args[2] is not None,
        args[3], layout_code(x) + layout_code(w),
    )  # fmt: skip


# ---- fused_mlp
def mlp_parameters(widths, dtype, device, gen, bias=True):
    """nn.Linear-like weights (uniform +-1/sqrt(fan_in)) and biases for the given widths; `bias`
    is one flag for every layer or one per layer (None where it is false)."""
    weights, biases = [], []
    layers = len(widths) - 1
    has_bias = tuple(bias) if isinstance(bias, (tuple, list)) else (bias,) * layers
    for fan_in, fan_out, with_bias in zip(widths[:-1], widths[1:], has_bias, strict=True):
        bound = 1.0 / math.sqrt(fan_in)
        w = (torch.rand((fan_out, fan_in), generator=gen) * 2 - 1) * bound
        weights.append(w.to(dtype).to(device))
        if with_bias:
            b = (torch.rand(fan_out, generator=gen) * 2 - 1) * bound
            biases.append(b.to(dtype).to(device))
        else:
            biases.append(None)
    return weights, biases


def _mlp_cases() -> tuple[ShapeCase, ...]:
    def mlp(batch, widths, label, activation="relu", bias=True, x_view=None, **flags):
        def make(dt, dev, g):
            x = randn((batch, widths[0]), dt, dev, g) if x_view is None else x_view(dt, dev, g)
            weights, biases = mlp_parameters(widths, dt, dev, g, bias)
            return Sample((x, weights, biases), {"activation": activation}, label)

        return _case(label, make, **flags)

    seed = (100, 128, 64, 10)
    wide = {"gpu_only": True, "bench_dtypes": BF16, "test_dtypes": HALF_DTYPES}
    return (
        mlp(1, seed, "seed_b1"),
        mlp(32, seed, "seed_b32", bench=True, quick=True, bench_dtypes=FP32),
        mlp(257, (27, 50, 100, 16), "odd_widths_b257"),
        mlp(33, (16, 16), "one_layer"),
        mlp(20, (64, 32, 48, 16, 256, 64, 40, 24, 8), "eight_layers"),
        mlp(40, (50, 100, 50), "gelu", activation="gelu"),
        mlp(40, (50, 100, 50), "silu", activation="silu"),
        mlp(40, (50, 100, 50), "no_activation", activation="none"),
        mlp(40, (64, 64, 32), "no_bias", bias=False),
        mlp(12, (48, 64, 16), "strided_x", x_view=lambda dt, dev, g: randn((12, 96), dt, dev, g)[:, ::2]),
        mlp(24, (32, 320, 16), "too_wide_fallback"),
        mlp(0, (16, 32, 8), "empty"),
        mlp(4096, seed, "seed_b4096", gpu_only=True, bench=True, bench_dtypes=FP32),
        mlp(2**16, (64, 64, 64, 64, 16), "64x4_b65536", gpu_only=True),
        # Batches of >= ~31 rows per SM: fp32 on Hopper takes the 3xTF32 tensor-core kernel.
        mlp(5003, (96, 160, 40, 12), "tc_silu_tail_b5003", activation="silu", gpu_only=True),
        mlp(4133, seed, "tc_gelu_row_stride_b4133", activation="gelu", bias=False, gpu_only=True,
            x_view=lambda dt, dev, g: randn((4133, 104), dt, dev, g)[:, :100]),
        mlp(70001, (16, 8, 4), "tc_narrow_b70001", activation="none", gpu_only=True),
        mlp(2**16, (256, 256, 256, 10), "256_b65536", gpu_only=True),
        mlp(2**20, (64, 64, 64, 64, 16), "64x4_b2^20", gpu_only=True, bench=True, bench_dtypes=HALF_DTYPES),
        mlp(2**20, (128, 128, 128, 128, 16), "128x4_b2^20", gpu_only=True, bench=True, bench_dtypes=FP16),
        mlp(2**18, (256, 256, 256, 64), "256x3_b2^18", gpu_only=True, bench=True, bench_dtypes=BF16),
        # 16-bit, a width in 129-256, on Hopper: fused_mlp_wide.cu (tails of the 128-row tile, one
        # hidden layer, x narrower than a 64-column box, a 256-wide output, missing biases, a
        # strided x, one row), then shapes it must leave to the mma.sync kernel
        # (wide::unfit_reason): erf-gelu and tanh-gelu into more than 64 outputs (their builds
        # spill), a hidden width not a multiple of 8, an x off 16 bytes.
        mlp(4133, (256, 256, 256, 64), "wide_relu_tail_b4133", **wide),
        mlp(1000, (200, 256, 136, 16), "wide_gelu_b1000", activation="gelu", **wide),
        mlp(777, (256, 256, 256, 256), "wide_silu_out256_b777", activation="silu", **wide),
        mlp(300, (136, 144, 40), "wide_two_layers_b300", **wide),
        mlp(300, (24, 256, 256, 32), "wide_narrow_input_b300", activation="gelu", **wide),
        mlp(1, (256, 256, 64), "wide_b1", **wide),
        mlp(513, (256, 192, 256, 10), "wide_partial_bias_b513", activation="none",
            bias=(True, False, True), **wide),
        mlp(129, (256, 256, 72), "wide_no_bias_b129", activation="silu", bias=False, **wide),
        mlp(1000, (256, 256, 64), "wide_row_stride_b1000", **wide,
            x_view=lambda dt, dev, g: randn((1000, 264), dt, dev, g)[:, :256]),
        mlp(300, (256, 256, 64), "wide_gelu_erf_fallback", activation="gelu_erf", **wide),
        mlp(300, (256, 256, 128), "wide_gelu_out128_fallback", activation="gelu", **wide),
        mlp(300, (200, 250, 64), "wide_width250_fallback", **wide),
        mlp(300, (256, 256, 64), "wide_misaligned_x_fallback", **wide,
            x_view=lambda dt, dev, g: _misaligned((300, 256), dt, dev, g)),
    )  # fmt: skip


def _mlp_cost(s: Sample) -> Cost:
    x, weights, biases = s.args
    m = x.numel() // max(x.shape[-1], 1)
    flops = sum(2.0 * m * w.numel() for w in weights)
    params = sum(w.numel() for w in weights) + sum(b.numel() for b in biases if b is not None)
    nbytes = (x.numel() + m * weights[-1].shape[0] + params) * x.element_size()
    return Cost(flops, nbytes)


_mlp_limits: dict = {}


def _mlp_kernel_limit(backend: str, args) -> str | None:
    """Why `backend`'s one-kernel MLP cannot hold these widths on chip (the Triton kernel pads
    every width to at most 256), remembered per (backend, widths, dtype)."""
    x, weights = args[0], args[1]
    widths = (weights[0].shape[1], *(w.shape[0] for w in weights))
    key = (backend, widths, x.dtype)
    if key not in _mlp_limits:
        check = OPS["fused_mlp"].backend_function(backend, "fused_mlp_unsupported_reason")
        _mlp_limits[key] = check(list(widths), x.dtype)
    return _mlp_limits[key]


def _mlp_key(args) -> tuple:
    """M rounded up to a power of two; every width exact; which layers have a bias; the
    activation; the layout of x."""
    x = args[0]
    m = row_count(x)
    dtype = x.dtype
    return (
        "fused_mlp", x.get_device(), dtype, dtype is _F32 and tf32_allowed(),
        (m - 1).bit_length() if m else -1, tuple(map(_shape_of, args[1])),
        tuple([b is not None for b in args[2]]), args[3], layout_code(x),
    )  # fmt: skip


# ---- linear_glu
def _glu_cases() -> tuple[ShapeCase, ...]:
    def glu(batch_shape, k, n, label, activation="silu", approximate="tanh", bias=False,
            packed=False, w_view=None, x_view=None, **flags):  # fmt: skip
        def make(dt, dev, g):
            x = randn((*batch_shape, k), dt, dev, g) if x_view is None else x_view(dt, dev, g)
            scale = 1.0 / math.sqrt(max(k, 1))
            if w_view is not None:
                wg, wu = w_view(dt, dev, g), w_view(dt, dev, g)
            elif packed:
                wg, wu = randn((2 * n, k), dt, dev, g, scale), None
            else:
                wg, wu = randn((n, k), dt, dev, g, scale), randn((n, k), dt, dev, g, scale)
            bg = bu = None
            if bias:
                bg = randn(2 * n if packed else n, dt, dev, g, 0.5)
                bu = None if packed else randn(n, dt, dev, g, 0.5)
            kwargs = {"activation": activation, "approximate": approximate}
            return Sample((x, wg, wu, bg, bu), kwargs, label)

        return _case(label, make, **flags)

    llama = {"gpu_only": True, "bench": True, "bench_dtypes": BF16}
    return (
        glu((1,), 1, 1, "tiny"),
        glu((17,), 33, 20, "odd"),
        glu((2, 5), 24, 16, "batched_x"),
        glu((9,), 40, 24, "bias", bias=True),
        glu((9,), 40, 24, "gelu_tanh", activation="gelu", bias=True),
        glu((9,), 40, 24, "gelu_erf", activation="gelu", approximate="none"),
        glu((9,), 40, 24, "relu", activation="relu", bias=True),
        glu((11,), 24, 18, "packed", packed=True),
        glu((11,), 24, 18, "packed_bias", packed=True, bias=True, activation="gelu"),
        glu((12,), 30, 20, "weight_view", w_view=lambda dt, dev, g: randn((30, 20), dt, dev, g, 0.2).t()),
        glu((12,), 24, 20, "noncontig_x", x_view=lambda dt, dev, g: randn((12, 48), dt, dev, g)[:, ::2]),
        glu((0,), 16, 8, "empty"),
        glu((5,), 0, 8, "k0", bias=True),
        glu((64,), 64, 64, "square"),
        # LLaMA-7B and LLaMA-3-8B feed-forward projections (issue 35's targets)
        glu((8192,), 4096, 11008, "B8192_4096_11008", **llama),
        glu((512,), 4096, 11008, "B512_4096_11008", **llama),
        glu((16,), 4096, 11008, "B16_4096_11008", **llama),
        glu((8192,), 4096, 14336, "B8192_4096_14336", **llama),
    )  # fmt: skip


def _glu_cost(s: Sample) -> Cost:
    x, wg, wu, bg, bu = s.args
    m = x.numel() // max(x.shape[-1], 1)
    k = x.shape[-1]
    n = wg.shape[0] if wu is not None else wg.shape[0] // 2
    params = wg.numel() + (wu.numel() if wu is not None else 0)
    params += sum(b.numel() for b in (bg, bu) if b is not None)
    return Cost(4.0 * m * n * k + 10.0 * m * n, (x.numel() + params + m * n) * x.element_size())


def _glu_key(args) -> tuple:
    """M rounded up to a power of two; K and N exact; which of the gate and up projections have
    a bias; the activation (with GELU's approximation); the layouts of x and both weights ("p"
    for the up half of a packed weight)."""
    x, wg, wu, bg, bu, activation, approximate = args
    m = row_count(x)
    dtype = x.dtype
    packed = wu is None
    return (
        "linear_glu", x.get_device(), dtype, dtype is _F32 and tf32_allowed(),
        (m - 1).bit_length() if m else -1, x.shape[-1],
        wg.shape[0] // 2 if packed else wg.shape[0], (bg is not None, bu is not None),
        f"gelu({approximate})" if activation == "gelu" else activation,
        layout_code(x) + layout_code(wg) + ("p" if packed else layout_code(wu)),
    )  # fmt: skip


def _impls(function: str) -> dict[str, str]:
    """Each backend module (dualk/backends/<module>.py) names the operator's function alike."""
    return {
        "cuda": f"cuda:{function}",
        "triton": f"triton:{function}",
        "torch": f"torch_ref:{function}",
    }


OPS: Mapping[str, OpSpec] = {
    spec.name: spec
    for spec in (
        # auto orders come from H200 measurements (`dualk bench`): the CUDA elementwise path has
        # the lowest host cost per call (11 us vs Triton's 26 us for a 16-element add) at equal
        # bandwidth; no dualk matmul beats cuBLAS on every shape yet (16-bit at 4096-8192, two
        # runs: Triton 0.92-1.03x, CUDA 0.88-0.99x; fp32: CUDA 0.91x, Triton 0.86x), so
        # matmul's auto is PyTorch; Triton wins linear_gelu.
        OpSpec("add", torch_ref.add, _impls("add"),
               ("cuda", "triton", "torch"), _add_cases(), _add_cost, "elementwise",
               key=_add_key, key_fields=("n", "broadcast", "layout")),
        OpSpec("relu_scale", torch_ref.relu_scale, _impls("relu_scale"),
               ("cuda", "triton", "torch"), _relu_cases(), _relu_cost, "elementwise",
               key=_relu_key, key_fields=("n", "layout")),
        OpSpec("matmul", torch_ref.matmul, _impls("matmul"),
               ("torch", "triton", "cuda"), _mm_cases(), _mm_cost, "gemm",
               key=_mm_key, key_fields=("dims", "batch", "m", "k", "n_exact", "layout")),
        OpSpec("linear_gelu", torch_ref.linear_gelu,
               {**_impls("linear_gelu"), "torch": "torch_ref:linear_gelu_fastest"},
               ("triton", "cuda", "torch"), _lg_cases(), _lg_cost, "gemm",
               key=_lg_key, key_fields=("m", "k", "n_exact", "bias", "approximate", "layout")),
        # fused_mlp: the CUDA kernels win every benchmarked case on an H200
        # (`dualk bench`, default suite): fp32 seed model 9.6 vs 22.9 us
        # at batch 32, 14.3 vs 37.9 us at 4096 (3xTF32 kernel); fp16/bf16 at batch 2^20 (Hopper
        # wgmma kernel) 60.4 vs 86.4 us at 64 wide, 176.5 vs 257.2 us at 128 wide. 16-bit widths
        # 129-256 on Hopper (the wide kernel, fused_mlp_wide.cu), H100: 256x3_b2^18 bf16 CUDA 155 us,
        # Triton 848, eager 471 (`dualk bench --op fused_mlp`). Not benchmarked: the
        # wide kernel on an H200, and GPUs before Hopper, where the padded mma.sync kernel (100 us
        # at 64 wide on the H200) trails Triton.
        OpSpec("fused_mlp", torch_ref.fused_mlp, _impls("fused_mlp"),
               ("cuda", "triton", "torch"), _mlp_cases(), _mlp_cost, "gemm",
               key=_mlp_key, key_fields=("m", "widths", "biases", "activation", "layout"),
               kernel_limit=_mlp_kernel_limit),
        # linear_glu: "auto" times the CUDA kernel (Hopper: cuda_src/linear_glu.cu's wgmma
        # kernel), Triton and PyTorch's two GEMMs and gate. bench/linear_glu_llama.py, LLaMA
        # shapes, session 27 (H100 and H200): CUDA wins 512 and 8192 rows, Triton 16 rows.
        OpSpec("linear_glu", torch_ref.linear_glu, _impls("linear_glu"),
               ("cuda", "triton", "torch"), _glu_cases(), _glu_cost, "gemm",
               key=_glu_key, key_fields=("m", "k", "n_exact", "biases", "activation", "layout")),
    )
}  # fmt: skip


def register(spec: OpSpec) -> OpSpec:
    """Add an operator to OPS: from then on dispatch, auto, explain, `runtime.operators.run`,
    the benchmark and the parity tests know it. Its entry must carry `key` and `key_fields`
    (auto's shape classes, as the built-in entries do) and `check` (argument checks, which the
    built-in operators keep in dualk/runtime/operators.py).
    The public function, the registered custom op (fake and autograd formula) and auto's
    exact-signature fast path are per-operator code (CONTRIBUTING.md, "Adding an operator")."""
    if not isinstance(spec, OpSpec):
        raise InvalidArgumentError(f"register() takes an OpSpec, got {type(spec).__name__}")
    if spec.name in OPS:
        raise InvalidArgumentError(f"operator {spec.name!r} is already registered")
    if spec.key is None or not spec.key_fields:
        raise InvalidArgumentError(f"operator {spec.name!r} needs key and key_fields (autotune)")
    unknown = [b for b in spec.auto_order if b not in spec.implementations]
    if unknown:
        raise InvalidArgumentError(
            f"operator {spec.name!r}: auto_order names backends without an implementation: "
            f"{unknown}"
        )
    OPS[spec.name] = spec  # type: ignore[index]
    return spec


def unregister(name: str) -> None:
    """Remove an operator that register() added (tests)."""
    OPS.pop(name)  # type: ignore[attr-defined]


def get(name: str) -> OpSpec:
    """The operator `name`; an unknown name (or a non-string) is an InvalidArgumentError."""
    spec = OPS.get(name) if isinstance(name, str) else None
    if spec is None:
        raise InvalidArgumentError(f"unknown operator {name!r}; dualk has {', '.join(OPS)}")
    return spec
