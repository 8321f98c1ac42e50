"""Property-based tests (hypothesis): every operator on drawn shapes, layouts and values against the
float64 reference.

Drawn: shapes (0-size dims included), broadcasting (add), ranks, layouts (contiguous, permuted
dims, sliced with a step, a storage offset that breaks alignment, expand's stride-0 views),
dtypes, and in the `*_special_values` tests NaN, +-Inf, -0.0, subnormals and values near the
dtype's overflow. The slots between the elements of a sliced view hold NaN, so a kernel that
reads outside the view fails.

How a result is judged:
- "torch" backend whose implementation is the PyTorch reference: bit-identical to the reference
  in the same dtype (NaN where it has NaN);
- finite values: dualk.testing.judge against dualk.testing.float64_reference (elementwise: the
  per-dtype tolerance; matrix ops: within 2x PyTorch's own error + the ulp floor). Two oracle
  details: GELU is taken in a stable float64 form (`oracle`: PyTorch's float64 GELU cancels below
  about -5, and an accurate kernel then "fails" a budget of 0), and when judge fails a matrix op,
  PyTorch's error is also measured as the larger of its own and that of plain fp32 sums (k
  ascending, k descending), since over a handful of outputs PyTorch's one summation order can
  be far luckier than any other correct one; the kernel must be within the rule against that;
- special values: every output element falls in the same class (finite, +inf, -inf, NaN) as the
  float64 reference rounded to the dtype, and the finite ones pass the same rule as above. The
  exemptions are arithmetic the operators' contract leaves open: "computed in fp32, rounded
  once" means an element whose finite terms can overflow fp32 on the way (|a| + |alpha b|, or
  sum_k |a_ik b_kj|, reaching fp32's largest value; for fused_mlp any hidden layer reaching the
  dtype's), or whose exact value lies within fp32's rounding error of the dtype's overflow
  threshold, may come out either way (counted in a note, not judged); and for matrix ops with
  huge inputs that cancel (3e38 - 3e38 + 0.5), an element may differ by the fp32 accumulation
  bound (K + 2) ulps of sum_k |a_ik b_kj| (FMA or not decides it).
- Triton's CPU interpreter is not the GPU: it converts fp32 to bf16 by truncation (bf16 on the
  Triton backend is fuzzed on the GPU only) and does not fuse a + alpha * b into an FMA (add's
  reference there rounds alpha * b to fp32 first: `interpreter_add_reference`).
Tolerances are the library's own, never widened here.

Profiles (tests/conftest.py): "ci" (the default: few examples, small shapes, derandomized so CI
is reproducible) and "gpu" (DUALK_HYPOTHESIS_PROFILE=gpu: many more examples and larger shapes,
including batches that take the CUDA fused MLP's 3xTF32 path). Backends: "triton" (Triton's CPU
interpreter here) and "torch" everywhere, "cuda" on a GPU.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from conftest import DEVICE, HAS_CUDA

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, note, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import dualk  # noqa: E402
from dualk.backends import unavailable_reason  # noqa: E402
from dualk.core.layout import as_rows  # noqa: E402
from dualk.registry import OPS, Sample  # noqa: E402
from dualk.testing import float64_reference, judge  # noqa: E402

# NaN and inf are drawn on purpose: numpy's warnings about them (Triton's interpreter) are noise.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

GPU_PROFILE = HAS_CUDA or os.environ.get("DUALK_HYPOTHESIS_PROFILE") == "gpu"
BACKENDS = ["triton", "torch"] + (["cuda"] if HAS_CUDA else [])
DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Shape limits: the CPU interpreter is slow, the GPU is not.
EW_DIM = 12 if GPU_PROFILE else 6  # elementwise: size of one dim
EW_LONG = 1 << 17 if GPU_PROFILE else 2000  # elementwise: a long 1-D case
MM_DIM = 160 if GPU_PROFILE else 24  # matmul / linear_gelu: M, K, N
MLP_WIDTH = 300 if GPU_PROFILE else 40  # fused_mlp widths (> 256 runs the per-layer chain)
MLP_BIG_BATCH = (4096, 6000) if GPU_PROFILE else None  # fp32 3xTF32 path on Hopper
# fp32 GEMMs with TF32 off take Triton's 3xTF32 path from this k; shorter sums stay exact FMAs.
try:
    from dualk.triton_src.matmul import FP32_TF32X3_MIN_K as TF32X3_MIN_K
except ImportError:  # no Triton: the other backends get the same long sums
    TF32X3_MIN_K = 256

FP32_LIMIT = 2.0**128 * (1 - 2.0**-25)  # fp32 rounds to inf from here
EPS32 = 2.0**-23
# A few cheap ops here and there (an FMA or not, the order of a sum): "rounding error of fp32".
FP32_SLACK = 8 * EPS32


def overflow_threshold(dtype: torch.dtype) -> float:
    """The magnitude from which round-to-nearest gives inf in `dtype`: max + half an ulp."""
    fi = torch.finfo(dtype)  # max = 2^e (2 - eps); half its ulp is 2^e eps / 2
    return float(fi.max) * (2 - fi.eps / 2) / (2 - fi.eps)


def subnormal(dtype: torch.dtype) -> float:
    fi = torch.finfo(dtype)
    return float(fi.tiny) * 0.25


def special_values(dtype: torch.dtype) -> list[float]:
    fi = torch.finfo(dtype)
    big = float(fi.max)
    return [
        math.nan, math.inf, -math.inf, -0.0, 0.0,
        subnormal(dtype), -subnormal(dtype), float(fi.tiny) * fi.eps,  # the smallest subnormal
        big, -big, big * 0.75, -big * 0.6, big / 2, float(fi.tiny),
    ]  # fmt: skip


# ---------------------------------------------------------------------------- strategies
def _device_tensor(cpu: torch.Tensor) -> torch.Tensor:
    return cpu.to(DEVICE)


@st.composite
def tensors(
    draw, shape, dtype, special: bool, scale: float = 1.0, layouts=None, powers=(0, 0, 1, 2, -2)
):
    """A tensor of `shape`/`dtype` on DEVICE, its layout drawn: contiguous, storage offset, dims
    permuted in memory, one dim sliced with a step (NaN in between), or expanded (stride 0)."""
    shape = tuple(shape)
    n = math.prod(shape)
    choices = layouts or ["contiguous", "offset", "permuted", "sliced", "expanded"]
    if len(shape) < 2:
        choices = [c for c in choices if c != "permuted"]
    if not any(s > 1 for s in shape):
        choices = [c for c in choices if c != "expanded"]
    if len(shape) == 0:
        choices = [c for c in choices if c != "sliced"]
    layout = draw(st.sampled_from(choices or ["contiguous"]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    magnitude = scale * 10.0 ** draw(st.sampled_from(powers))
    values = torch.randn(shape, generator=gen) * magnitude
    values = values.to(dtype)
    if special and n:
        pool = special_values(dtype)
        picks = draw(
            st.lists(
                st.tuples(st.integers(0, n - 1), st.sampled_from(pool)),
                min_size=1,
                max_size=min(6, n),
            )
        )
        flat = values.reshape(-1)
        for i, v in picks:
            flat[i] = v
        values = flat.reshape(shape)
    if layout == "contiguous":
        t = _device_tensor(values)
    elif layout == "offset":
        off = draw(st.integers(1, 3))
        buf = torch.full((n + off,), math.nan, dtype=dtype)
        buf[off:] = values.reshape(-1)
        t = _device_tensor(buf)[off:].view(shape)
    elif layout == "permuted":
        perm = draw(st.permutations(range(len(shape))))
        inverse = [perm.index(i) for i in range(len(shape))]
        t = _device_tensor(values.permute(perm).contiguous()).permute(inverse)
    elif layout == "sliced":
        dim = draw(st.integers(0, len(shape) - 1))
        step = draw(st.integers(2, 3))
        start = draw(st.integers(0, 2))
        big = list(shape)
        big[dim] = start + step * shape[dim] + draw(st.integers(0, 2))
        buf = torch.full(big, math.nan, dtype=dtype)
        index = [slice(None)] * len(shape)
        index[dim] = slice(start, start + step * shape[dim], step)
        buf[tuple(index)] = values
        t = _device_tensor(buf)[tuple(index)]
    else:  # expanded: one dim of size > 1 becomes a stride-0 view of its first slice
        dims = [d for d, s in enumerate(shape) if s > 1]
        dim = draw(st.sampled_from(dims))
        t = _device_tensor(values.narrow(dim, 0, 1).contiguous()).expand(shape)
    assert tuple(t.shape) == shape
    return t


def scalars(special: bool):
    """alpha / scale: fp32-representable (the kernels compute in fp32), specials when asked."""
    finite = st.one_of(
        st.sampled_from([1.0, -1.0, 0.5, 2.0, -0.75, 0.0]),
        st.floats(-8, 8, width=32, allow_subnormal=False),
    )
    if not special:
        return finite
    huge = [2.0**100, -(2.0**127), 3.0e38]  # the last rounds to fp32 3.0000000054977558e38
    return st.one_of(finite, st.sampled_from([math.inf, -math.inf, math.nan, -0.0, *huge]))


def describe(t) -> str:
    if t is None:
        return "None"
    if isinstance(t, list):
        return "[" + ", ".join(describe(x) for x in t) + "]"
    if not isinstance(t, torch.Tensor):
        return repr(t)
    return (
        f"{str(t.dtype)[6:]}{tuple(t.shape)} stride={t.stride()} offset={t.storage_offset()} "
        f"nan={int(t.isnan().sum())} inf={int(t.isinf().sum())}"
    )


def note_sample(sample: Sample, backend: str) -> None:
    note(f"backend={backend} {sample.label}")
    for i, a in enumerate(sample.args):
        note(f"  arg{i}: {describe(a)}")
    for k, v in sample.kwargs.items():
        note(f"  {k}: {describe(v)}")


@st.composite
def add_samples(draw, special: bool, dtypes=DTYPES):
    dtype = draw(st.sampled_from(dtypes))
    if draw(st.integers(0, 9)) == 0:  # a long 1-D run: vectorized bodies and tails
        out = [draw(st.integers(EW_LONG // 2, EW_LONG))]
    else:
        out = draw(st.lists(st.integers(0, EW_DIM), min_size=0, max_size=4))
    a_shape, b_shape = [], []
    for s in out:  # each operand has the dim or broadcasts it
        a_shape.append(s if draw(st.integers(0, 3)) else 1)
        b_shape.append(s if draw(st.integers(0, 3)) else 1)
    b_shape = b_shape[draw(st.integers(0, len(b_shape))) :]  # fewer leading dims
    a = draw(tensors(a_shape, dtype, special))
    b = draw(tensors(b_shape, dtype, special))
    alpha = float(torch.tensor(draw(scalars(special)), dtype=torch.float32))
    return Sample((a, b), {"alpha": alpha}, f"add {tuple(a_shape)} + {alpha} * {tuple(b_shape)}")


@st.composite
def relu_scale_samples(draw, special: bool, dtypes=DTYPES):
    dtype = draw(st.sampled_from(dtypes))
    if draw(st.integers(0, 9)) == 0:
        shape = [draw(st.integers(EW_LONG // 2, EW_LONG))]
    else:
        shape = draw(st.lists(st.integers(0, EW_DIM), min_size=0, max_size=4))
    x = draw(tensors(shape, dtype, special))
    scale = draw(scalars(special))
    return Sample((x, scale), {}, f"relu_scale {tuple(shape)} * {scale}")


def _size(draw, limit: int) -> int:
    """0 now and then, 1 often (degenerate tiles), else up to `limit`."""
    return draw(st.one_of(st.just(1), st.integers(0, limit), st.integers(2, 17)))


def _k(draw, dtype: torch.dtype) -> int:
    """A GEMM's k: as _size, and for fp32 one draw in four long enough for the 3xTF32 path."""
    if dtype == torch.float32 and draw(st.integers(0, 3)) == 3:  # shrinks to the short k
        return draw(st.integers(TF32X3_MIN_K, TF32X3_MIN_K + 64))
    return _size(draw, MM_DIM)


@st.composite
def matmul_samples(draw, special: bool, dtypes=DTYPES):
    dtype = draw(st.sampled_from(dtypes))
    m, k, n = _size(draw, MM_DIM), _k(draw, dtype), _size(draw, MM_DIM)
    kind = draw(st.sampled_from(["2d", "2d", "3d", "3d@2d", "2d@3d"]))
    batch = draw(st.integers(0 if draw(st.integers(0, 9)) == 0 else 1, 3))
    a_shape = (batch, m, k) if kind in ("3d", "3d@2d") else (m, k)
    b_shape = (batch, k, n) if kind in ("3d", "2d@3d") else (k, n)
    a = draw(tensors(a_shape, dtype, special))
    b = draw(tensors(b_shape, dtype, special, scale=1.0 / math.sqrt(max(k, 1))))
    return Sample((a, b), {}, f"matmul {a_shape} @ {b_shape}")


@st.composite
def linear_gelu_samples(draw, special: bool, dtypes=DTYPES):
    dtype = draw(st.sampled_from(dtypes))
    lead = draw(st.lists(st.integers(0, 6), min_size=0, max_size=2))
    if not lead or draw(st.booleans()):
        lead = [_size(draw, MM_DIM)] + lead[:1]
    k, n = _k(draw, dtype), _size(draw, MM_DIM)
    x = draw(tensors((*lead, k), dtype, special))
    w = draw(tensors((n, k), dtype, special, scale=1.0 / math.sqrt(max(k, 1))))
    bias = draw(st.none() | tensors((n,), dtype, special, scale=0.5))
    approximate = draw(st.sampled_from(["tanh", "none"]))
    return Sample(
        (x, w, bias),
        {"approximate": approximate},
        f"linear_gelu x{(*lead, k)} W{(n, k)} {approximate}",
    )


@st.composite
def fused_mlp_samples(draw, special: bool, dtypes=DTYPES):
    dtype = draw(st.sampled_from(dtypes))
    layers = draw(st.integers(1, 4))
    widths = [draw(st.integers(1, MLP_WIDTH)) for _ in range(layers + 1)]
    if MLP_BIG_BATCH and dtype == torch.float32 and draw(st.integers(0, 4)) == 0:
        lead = [draw(st.integers(*MLP_BIG_BATCH))]
    else:
        lead = [draw(st.integers(0, 40))]
        if draw(st.integers(0, 3)) == 0:
            lead = [draw(st.integers(1, 3)), *lead]
    # Special values go into x only, at moderate magnitudes: overflow inside a deep chain is
    # the contract's grey zone (see the module docstring), NaN/inf propagation is not.
    x = draw(
        tensors(
            (*lead, widths[0]),
            dtype,
            special=False,
            layouts=["contiguous", "sliced", "offset", "expanded"],
            powers=(0, 0, 1, -2),
        )
    )
    if special and x.numel():
        flat = x.contiguous().reshape(-1).clone()
        pool = [math.nan, math.inf, -math.inf, -0.0, subnormal(dtype), 300.0, -300.0]
        for i, v in draw(
            st.lists(
                st.tuples(st.integers(0, flat.numel() - 1), st.sampled_from(pool)),
                min_size=1,
                max_size=4,
            )
        ):
            flat[i] = v
        x = flat.view(x.shape)
    weights, biases = [], []
    for fan_in, fan_out in zip(widths[:-1], widths[1:]):
        weights.append(draw(tensors((fan_out, fan_in), dtype, False, scale=1.0 / math.sqrt(fan_in),
                                    layouts=["contiguous", "permuted", "offset"], powers=(0,))))  # fmt: skip
        biases.append(draw(st.none() | tensors((fan_out,), dtype, False, scale=0.5, powers=(0, 1))))
    activation = draw(st.sampled_from(["relu", "gelu", "gelu_tanh", "gelu_erf", "silu", "none"]))
    return Sample(
        (x, weights, biases), {"activation": activation},
        f"fused_mlp x{tuple(x.shape)} widths {widths} {activation}",
    )  # fmt: skip


SAMPLES = {
    "add": add_samples,
    "relu_scale": relu_scale_samples,
    "matmul": matmul_samples,
    "linear_gelu": linear_gelu_samples,
    "fused_mlp": fused_mlp_samples,
}


# ---------------------------------------------------------------------------- judging
def _finite_part(t: torch.Tensor) -> torch.Tensor:
    """|t| in float64 with non-finite entries as 0: what can overflow along the way."""
    t = t.double().abs()
    return torch.where(t.isfinite(), t, torch.zeros_like(t))


def grey_zone(op: str, sample: Sample, ref: torch.Tensor) -> torch.Tensor:
    """Elements whose class (finite or not) the contract "fp32 arithmetic, rounded once to the
    dtype" leaves open: the finite terms' magnitude `bound` reaches fp32's overflow, or the
    exact value lies within fp32's rounding error of the dtype's overflow threshold."""
    args = sample.args
    dtype = sample.first_tensor().dtype
    if op == "add":
        a, b = args
        alpha = float(sample.kwargs["alpha"])
        term = b.double() * alpha
        term = torch.where(term.isfinite(), term.abs(), torch.zeros_like(term))
        bound, terms = _finite_part(a) + term, 2
    elif op == "relu_scale":
        x, scale = args
        prod = torch.relu(x.double()) * float(scale)
        bound, terms = torch.where(prod.isfinite(), prod.abs(), torch.zeros_like(prod)), 1
    elif op == "matmul":
        a, b = args
        bound, terms = torch.matmul(_finite_part(a), _finite_part(b)), a.shape[-1] + 1
    elif op == "linear_gelu":
        x, w, bias = args
        bound = _finite_part(x) @ _finite_part(w).t()
        if bias is not None:
            bound = bound + _finite_part(bias)
        terms = x.shape[-1] + 2
    else:  # fused_mlp: the bound of every layer; a row is grey if any layer's is
        x, weights, biases = args
        h = _finite_part(x)
        worst = torch.zeros(h.shape[:-1], dtype=torch.float64)
        limit = min(FP32_LIMIT, overflow_threshold(dtype))  # hidden values may be rounded to dtype
        for w, b in zip(weights, biases):
            h = h @ _finite_part(w).t() + (0 if b is None else _finite_part(b))
            worst = torch.maximum(worst, h.amax(-1) / limit if h.shape[-1] else worst)
        grey_rows = worst >= 1 - 1e-3
        bound = h
        terms = max(w.shape[1] for w in weights) + 2
        near = (ref.abs() - overflow_threshold(dtype)).abs() <= terms * FP32_SLACK * bound
        return (grey_rows.unsqueeze(-1) & torch.ones_like(near)) | near
    bound = bound.expand(ref.shape) if bound.shape != ref.shape else bound
    overflow32 = bound >= FP32_LIMIT * (1 - FP32_SLACK)
    near = (ref.abs() - overflow_threshold(dtype)).abs() <= terms * FP32_SLACK * bound + 1e-300
    return overflow32 | near


def value_class(t: torch.Tensor) -> torch.Tensor:
    """0 finite, 1 +inf, 2 -inf, 3 NaN."""
    c = torch.zeros(t.shape, dtype=torch.int8)
    c[t == math.inf] = 1
    c[t == -math.inf] = 2
    c[t.isnan()] = 3
    return c


def _where(mask: torch.Tensor, out, expected, k: int = 5) -> str:
    idx = mask.nonzero()[:k].tolist()
    return "; ".join(
        f"at {tuple(i)}: got {out[tuple(i)].item()}, expected {expected[tuple(i)].item()}"
        for i in idx
    )


def accumulation_bound(op: str, sample: Sample) -> torch.Tensor | None:
    """Per element, the error any correct fp32 accumulation may make in some order: (K + 2) fp32
    ulps of sum_k |a_ik b_kj| (GELU's slope is below 1.13). With huge inputs that cancel
    (3e38 - 3e38 + 0.5), the exact value is far below it, and whether the products are rounded
    or fused (FMA) decides the answer; PyTorch's own error there can be exactly 0."""
    if op == "matmul":
        a, b = sample.args
        return (a.shape[-1] + 2) * EPS32 * torch.matmul(_finite_part(a), _finite_part(b))
    if op == "linear_gelu":
        x, w, bias = sample.args
        s = _finite_part(x) @ _finite_part(w).t()
        if bias is not None:
            s = s + _finite_part(bias)
        return 1.13 * (x.shape[-1] + 2) * EPS32 * s
    return None


def _sequential_dot(a: torch.Tensor, b: torch.Tensor, reverse: bool) -> torch.Tensor:
    """a @ b (a (..., m, k), b (..., k, n), batch dims broadcast) in fp32, one k at a time
    (ascending or descending), each step rounded."""
    a, b = a.float(), b.float()
    acc = torch.matmul(a[..., :0], b[..., :0, :])  # zeros of the output's shape
    steps = range(a.shape[-1])
    for i in reversed(steps) if reverse else steps:
        acc = acc + a[..., :, i : i + 1] * b[..., i : i + 1, :]
    return acc


def sequential_reference(op: str, sample: Sample, reverse: bool) -> torch.Tensor:
    """The operator evaluated plainly in fp32 (every sum one k at a time, in `reverse` order or
    not; activations in fp32; each layer's output rounded to the dtype, as PyTorch does): what a
    straightforward correct kernel gives, a second and third sample of "fp32 arithmetic's own
    error" beside PyTorch's blocked sums."""
    args, kwargs = sample.args, sample.kwargs
    dtype = sample.first_tensor().dtype
    if op == "matmul":
        a, b = args
        return _sequential_dot(a, b, reverse).to(dtype)
    from dualk.backends.torch_ref import ACTIVATIONS

    if op == "linear_gelu":
        x, w, bias = args
        h = _sequential_dot(as_rows(x), w.t(), reverse).reshape(*x.shape[:-1], w.shape[0])
        if bias is not None:
            h = h + bias.float()
        return torch.nn.functional.gelu(h, approximate=kwargs["approximate"]).to(dtype)
    x, weights, biases = args
    h = x
    for i, (w, b) in enumerate(zip(weights, biases)):
        h = _sequential_dot(as_rows(h), w.t(), reverse).reshape(*h.shape[:-1], w.shape[0])
        if b is not None:
            h = h + b.float()
        if i != len(weights) - 1:
            h = ACTIVATIONS[kwargs["activation"]](h)
        h = h.to(dtype)
    return h


def gemm_rule_on(spec, sample, out64, ref, torch_outs, mask, floor=None) -> str | None:
    """judge's GEMM rule (within 2x PyTorch's own error + the ulp floor) on the elements in
    `mask` only (judge itself takes whole outputs, where a NaN makes every max NaN), "PyTorch's
    error" being the largest over `torch_outs` (PyTorch's results, plain fp32 sums). `floor`:
    per-element errors allowed anyway (accumulation_bound, special values only)."""
    if not mask.any():
        return None
    dtype = sample.first_tensor().dtype
    err = (out64 - ref).abs()
    torch_err = max((t - ref).abs()[mask].max().item() for t in torch_outs)
    scale = ref.abs()[mask].max().item()
    ulp_floor = torch.finfo(dtype).eps * scale * (4.0 if dtype == torch.float32 else 1.0)
    budget = 2.0 * torch_err + ulp_floor
    allowed = torch.full_like(ref, budget)
    if floor is not None:
        allowed = torch.maximum(allowed, floor.expand(ref.shape))
    bad = mask & (err > allowed)
    if not bad.any():
        return None
    return (
        f"{int(bad.sum())} finite elements exceed 2 x PyTorch's error {torch_err:.3g} (the largest "
        f"of its and plain fp32 sums') + {ulp_floor:.3g}"
        + (" or the fp32 accumulation bound" if floor is not None else "")
        + ": "
        + _where(bad, out64, ref)
    )


INTERPRETER = DEVICE.type == "cpu"  # the Triton backend runs on Triton's CPU interpreter


def _gelu64(h: torch.Tensor, approximate: str) -> torch.Tensor:
    """GELU in float64 without the cancellation of PyTorch's formula: 0.5 h (1 + tanh y) is
    h sigmoid(2y), 0.5 h (1 + erf(h / sqrt 2)) is 0.5 h erfc(-h / sqrt 2). For h below about -5,
    1 + tanh y rounds to 0 in float64 where the exact value (1e-18 and less, a normal fp32
    number) is what an accurate kernel returns. Same NaN/inf classes as PyTorch's."""
    if approximate == "tanh":
        y = math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)
        return h * torch.sigmoid(2 * y)
    return 0.5 * h * torch.special.erfc(-h / math.sqrt(2))


_GELU64 = {"gelu": "tanh", "gelu_tanh": "tanh", "gelu_erf": "none"}


def oracle(op: str, sample: Sample) -> torch.Tensor:
    """dualk.testing.float64_reference, but with GELU (linear_gelu, fused_mlp's gelu
    activations) in its stable float64 form (_gelu64)."""
    spec = OPS[op]
    if op == "linear_gelu":
        x, w, bias = (None if t is None else t.double() for t in sample.args)
        return _gelu64(torch.nn.functional.linear(x, w, bias), sample.kwargs["approximate"])
    if op == "fused_mlp" and sample.kwargs["activation"] in _GELU64:
        x, weights, biases = sample.args
        h = x.double()
        for i, (w, b) in enumerate(zip(weights, biases)):
            h = torch.nn.functional.linear(h, w.double(), None if b is None else b.double())
            if i != len(weights) - 1:
                h = _gelu64(h, _GELU64[sample.kwargs["activation"]])
        return h
    return float64_reference(spec, sample)


def interpreter_add_reference(sample: Sample) -> torch.Tensor:
    """add's float64 reference as Triton's CPU interpreter computes it: numpy rounds alpha * b to
    fp32 before the sum, where the GPU compilers contract a + alpha * b into one FMA (one
    rounding, which the fp32 tolerance assumes). With a and alpha * b nearly cancelling, the
    product's rounding is most of the answer's error; the sum is judged as tightly as ever."""
    a, b = sample.args
    alpha = torch.tensor(float(sample.kwargs["alpha"]), dtype=torch.float32)
    product = (b.float() * alpha).double()  # IEEE fp32 products, as numpy's
    return a.double() + product


def check(op: str, sample: Sample, out: torch.Tensor, backend: str, special: bool) -> None:
    spec = OPS[op]
    like = sample.first_tensor()
    cpu = Sample(
        tuple(_cpu(a) for a in sample.args),
        {k: _cpu(v) for k, v in sample.kwargs.items()},
        sample.label,
    )
    out_cpu = out.detach().cpu()
    assert out.dtype == like.dtype and out.device == like.device, (out.dtype, out.device)
    if backend == "torch" and spec.implementation("torch") is spec.reference:
        expected = spec.reference(*sample.args, **sample.kwargs).cpu()
        assert out_cpu.shape == expected.shape
        assert torch.equal(out_cpu.isnan(), expected.isnan()), "NaN positions differ from PyTorch"
        assert torch.equal(out_cpu.nan_to_num(), expected.nan_to_num()), "differs from PyTorch"
        return
    ref = oracle(op, cpu)
    if op == "add" and backend == "triton" and INTERPRETER:
        ref = interpreter_add_reference(cpu)
    assert tuple(out.shape) == tuple(ref.shape), (tuple(out.shape), tuple(ref.shape))
    # Values that overflow the dtype (drawn large, or grown by a sum or a hidden layer) are judged
    # as special ones: the reference rounded to the dtype says inf there, or the element is in
    # the grey zone, which judge's whole-output rule cannot express.
    grey = grey_zone(op, cpu, ref)
    special = special or bool(grey.any()) or not bool(ref.to(like.dtype).isfinite().all())
    if not special:
        verdict = judge(spec, cpu, out_cpu, ref)
        if not verdict.ok and spec.judged_by == "gemm":
            # judge's yardstick is PyTorch's error in its own summation order; over a handful of
            # outputs, or where an output is much smaller than the terms it sums, that one order
            # can be far luckier than any other correct one (test_parity's fp32 floor says the
            # same). The kernel passes when it is within the rule against the larger of PyTorch's
            # error and that of plain fp32 sums (k ascending, k descending), or PyTorch's error
            # on the device the call ran on (PyTorch's CUDA erf-GELU loses ~0.4% in the far
            # tail, h ~ -4.4, where its CPU one does not: an H100 run); else judge's message
            # is the failure.
            torch_outs = [
                spec.reference(*cpu.args, **cpu.kwargs).double(),
                spec.reference(*sample.args, **sample.kwargs).double().cpu(),
                sequential_reference(op, cpu, False).double(),
                sequential_reference(op, cpu, True).double(),
            ]
            everything = torch.ones_like(ref, dtype=torch.bool)
            problem = gemm_rule_on(spec, cpu, out_cpu.double(), ref, torch_outs, everything)
            assert problem is None, f"{verdict.message}; {problem}"
            note(f"judge: {verdict.message}; within the rule against plain fp32 sums")
            return
        assert verdict.ok, verdict.message
        return
    out64 = out_cpu.double()
    expected = ref.to(like.dtype).double()  # the reference rounded to the dtype: inf on overflow
    if backend == "torch":
        # The torch backend is PyTorch's arithmetic (linear_gelu's fastest path: the same
        # classes as F.gelu(F.linear)); PyTorch's own special-value quirks (CPU fp32 erf-GELU
        # of +inf is NaN) are its yardstick, not the float64 reference's.
        # On a GPU that path is cuBLASLt's fused epilogue, whose classes (inf where F.gelu's
        # CPU arithmetic gives NaN) are again PyTorch's own: the device's answer is the yardstick.
        expected = spec.implementation("torch")(*sample.args, **sample.kwargs).cpu().double()
    if grey.any():
        note(f"{int(grey.sum())} of {ref.numel()} elements in fp32's grey zone (not judged)")
    wrong = (value_class(out64) != value_class(expected)) & ~grey
    assert not wrong.any(), (
        f"{int(wrong.sum())} of {ref.numel()} elements differ from the float64 reference in "
        "NaN/inf/finite: " + _where(wrong, out64, expected)
    )
    finite = out64.isfinite() & expected.isfinite() & ~grey
    if spec.judged_by == "elementwise":
        if finite.any():
            verdict = judge(spec, cpu, out_cpu[finite], ref[finite])
            assert verdict.ok, verdict.message
        return
    torch_out = spec.reference(*cpu.args, **cpu.kwargs).double()
    floor = accumulation_bound(op, cpu)
    mask = finite & torch_out.isfinite()
    problem = gemm_rule_on(spec, cpu, out64, ref, [torch_out], mask, floor)
    if problem is not None:  # as in the finite case: PyTorch's one order may be the lucky one
        plain = [sequential_reference(op, cpu, r).double() for r in (False, True)]
        mask = mask & plain[0].isfinite() & plain[1].isfinite()
        problem = gemm_rule_on(spec, cpu, out64, ref, [torch_out, *plain], mask, floor)
    assert problem is None, problem


def _cpu(v):
    if isinstance(v, torch.Tensor):
        return v.cpu()
    if isinstance(v, list):
        return [_cpu(x) for x in v]
    return v


# ---------------------------------------------------------------------------- tests
@pytest.fixture(autouse=True)
def _no_triton_config_timing(monkeypatch):
    """Every drawn shape is a new problem class, which the Triton launchers would time with each
    candidate config (minutes over a GPU run): the fuzz runs each class's first candidate."""
    if HAS_CUDA:
        from dualk.triton_src import common

        monkeypatch.setattr(common, "_timing_forbidden", lambda: True)


SETTINGS = settings(
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)  # fmt: skip


def _run(op: str, backend: str, special: bool, sample: Sample) -> None:
    reason = unavailable_reason(backend, DEVICE)
    if reason is not None:
        pytest.skip(reason)
    note_sample(sample, backend)
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in sample.args]
    out = getattr(dualk, op)(*sample.args, **sample.kwargs, backend=backend)
    if HAS_CUDA:
        torch.cuda.synchronize()
    check(op, sample, out, backend, special)
    for old, new in zip(before, sample.args):
        if isinstance(old, torch.Tensor):
            assert torch.equal(old.nan_to_num(), new.nan_to_num()), "an input was modified"


class Drawn:
    """A drawn Sample whose repr (in hypothesis's report) is its description, not its values."""

    def __init__(self, sample: Sample):
        self.sample = sample

    def __repr__(self) -> str:
        parts = [self.sample.label]
        parts += [f"arg{i}={describe(a)}" for i, a in enumerate(self.sample.args)]
        parts += [f"{k}={describe(v)}" for k, v in self.sample.kwargs.items()]
        return "<" + "; ".join(parts) + ">"


@st.composite
def _drawn(draw, op: str, special: bool, backend: str) -> Drawn:
    return Drawn(draw(SAMPLES[op](special, dtypes_for(backend))))


def dtypes_for(backend: str) -> tuple[torch.dtype, ...]:
    """Triton's CPU interpreter converts fp32 to bf16 by truncation (round toward zero:
    triton/runtime/interpreter.py _convert_float without a rounding mode), where the GPU rounds to
    nearest even: its bf16 results are off by up to an ulp per rounding, and never overflow to
    inf. bf16 on the Triton backend is fuzzed on the GPU only."""
    if backend == "triton" and DEVICE.type == "cpu":
        return (torch.float32, torch.float16)
    return DTYPES


def _make_test(op: str, special: bool):
    @pytest.mark.parametrize("backend", BACKENDS)
    @SETTINGS
    @given(data=st.data())
    def test(backend, data):
        drawn = data.draw(_drawn(op, special, backend), label="sample")
        _run(op, backend, special, drawn.sample)

    test.__name__ = f"test_{op}{'_special_values' if special else ''}"
    test.__doc__ = (
        f"dualk.{op} on drawn shapes and layouts"
        + (" with NaN, +-inf, -0.0, subnormals, near-overflow values" if special else "")
        + " matches the float64 reference."
    )
    return test


for _op in SAMPLES:
    for _special in (False, True):
        _t = _make_test(_op, _special)
        globals()[_t.__name__] = _t
del _t, _op, _special
