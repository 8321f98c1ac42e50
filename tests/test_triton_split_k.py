"""Split-K in the Triton GEMM core (triton_src/matmul.py: split_k_plan, the SPLIT_K batch entries of
gemm_kernel and split_k_reduce_kernel) for matmul and linear_gelu, fp32 / fp16 / bf16, against a
float64 reference with the GEMM rule of dualk/testing.py (within 2x PyTorch's own error).

The registry's split-K cases are GPU-only; here the shapes are interpreter-sized and the SM count
is faked (64), so that a handful of 32x32 tiles count as "few" and k = 600-1200 is cut into 2-4
slices (16-bit) or up to ~18 (exact fp32, slices of at least 64). Every case checks that the reduce kernel ran (its launch counter), with the workspace
poisoned with NaN, so a slice that wrote nothing cannot pass."""

import math
import zlib

import dualk.triton_src.matmul as mm
import pytest
import torch
from conftest import DEVICE
from dualk.triton_src.common import ACT_RELU

import dualk
from dualk.backends import unavailable_reason
from dualk.registry import OPS, Sample
from dualk.testing import judge

pytestmark = pytest.mark.skipif(
    unavailable_reason("triton", DEVICE) is not None,
    reason=str(unavailable_reason("triton", DEVICE)),
)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
KIND = {torch.float32: "fp32", torch.float16: "tensor_core", torch.bfloat16: "tensor_core"}


def _randn(shape, gen, dtype, scale=1.0):
    """Standard normal values (never zeros), drawn on the CPU for reproducibility."""
    return (torch.randn(shape, generator=gen) * scale).to(DEVICE, dtype)


@pytest.fixture
def split_k(monkeypatch):
    """64 SMs (few tiles below 32), NaN-poisoned workspaces; yields a counter of reduce launches."""
    monkeypatch.setattr(mm, "num_sms", lambda device: 64)
    monkeypatch.setattr(mm, "POISON_WORKSPACE", [float("nan")])
    monkeypatch.setattr(mm, "SPLIT_K", [True])
    launcher = mm._reduce_launcher

    def reduces():
        return launcher.slow_launches + launcher.fast_launches

    return reduces


def _run(op, sample, dtype, reduces, splits_expected):
    before = reduces()
    out = getattr(dualk, op)(*sample.args, **sample.kwargs, backend="triton")
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    assert reduces() == before + 1, f"{op} [{sample.label}] did not take split-K"
    verdict = judge(OPS[op], sample, out)
    assert verdict.ok, (
        f"{op} [{sample.label}] {dtype} (splits {splits_expected}): {verdict.message}"
    )


# (label, M, K, N, A maker, B maker): K tails that are and are not multiples of BLOCK_SIZE_K and
# of the slice; M and N not multiples of the tile; column-major, sliced and strided operands.
MATMUL_CASES = {
    "odd": lambda g, dt: (_randn((40, 1000), g, dt), _randn((1000, 50), g, dt, 1 / 32)),
    "even_k": lambda g, dt: (_randn((33, 1024), g, dt), _randn((1024, 17), g, dt, 1 / 32)),
    "kmajor_b": lambda g, dt: (_randn((37, 777), g, dt), _randn((45, 777), g, dt, 1 / 28).t()),
    "colmajor_a_strided_b": lambda g, dt: (
        _randn((650, 29), g, dt).t(),
        _randn((650, 82), g, dt, 1 / 25)[:, ::2],
    ),
    "sliced": lambda g, dt: (
        _randn((30, 905), g, dt)[:, 3:-2],
        _randn((902, 41), g, dt, 1 / 30)[1:-1, 1:],
    ),
    # batched A times a shared B: folded into one (40, 700) x (700, 30) GEMM
    "batched_a_shared_b": lambda g, dt: (_randn((2, 20, 700), g, dt), _randn((700, 30), g, dt, 0.04)),
}  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("case", sorted(MATMUL_CASES))
def test_matmul_split_k(case, dtype, split_k):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{case}/{dtype}".encode()))
    a, b = MATMUL_CASES[case](gen, dtype)
    M, K = a.shape[-2], a.shape[-1]
    batch = a.shape[0] if a.dim() == 3 else 1
    plan = mm.split_k_plan(KIND[dtype], 1, batch * M, b.shape[-1], K, mm.num_sms(DEVICE))
    assert plan is not None and plan[1] > 1
    _run("matmul", Sample((a, b), {}, case), dtype, split_k, plan[1])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize(
    "bias,approximate,weight_view",
    [(True, "tanh", False), (False, "tanh", False), (True, "none", True)],
    ids=["bias-tanh", "no_bias-tanh", "bias-erf-weight_view"],
)
def test_linear_gelu_split_k(bias, approximate, weight_view, dtype, split_k):
    gen = torch.Generator().manual_seed(17 + 2 * bias + weight_view)
    M, K, N = 37, 900, 45
    x = _randn((M, K), gen, dtype)
    scale = 1 / math.sqrt(K)
    w = _randn((K, N), gen, dtype, scale).t() if weight_view else _randn((N, K), gen, dtype, scale)
    b = _randn(N, gen, dtype, 0.5) if bias else None
    plan = mm.split_k_plan(KIND[dtype], 1, M, N, K, mm.num_sms(DEVICE))
    assert plan is not None and plan[1] > 1
    sample = Sample((x, w, b), {"approximate": approximate}, f"{M}x{K}x{N} bias={bias}")
    _run("linear_gelu", sample, dtype, split_k, plan[1])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_strided_output_and_bias(dtype, split_k):
    """launch_gemm into a NaN-poisoned column-strided C: the reduce writes every element of C and
    nothing between them; bias + relu after the sum."""
    gen = torch.Generator().manual_seed(5)
    M, K, N = 35, 700, 33
    a = _randn((1, M, K), gen, dtype)
    b = _randn((1, K, N), gen, dtype, 1 / 26)
    bias = _randn(N, gen, dtype, 0.5)
    full = torch.full((1, M, 2 * N), float("nan"), dtype=dtype, device=DEVICE)
    c = full[:, :, ::2]
    before = split_k()
    mm.launch_gemm(a, b, bias, c, activation=ACT_RELU, allow_tf32=False)
    assert split_k() == before + 1
    assert torch.isnan(full[:, :, 1::2]).all(), "the reduce wrote between C's columns"
    ref = torch.relu(a[0].double() @ b[0].double() + bias.double())
    torch_out = torch.relu((a[0] @ b[0]).float() + bias.float()).to(dtype).double()
    allowed = 2 * (torch_out - ref).abs().max().item() + 4 * torch.finfo(dtype).eps * ref.abs().max().item()  # fmt: skip
    err = (c[0].double() - ref).abs().max().item()
    assert err <= allowed, f"max error {err:.3g} > {allowed:.3g}"


def test_fp32_long_k_splits_with_many_tiles(monkeypatch, split_k):
    """Exact fp32 with k > FP32_ORDERED_MAX_K splits even when the tiles fill the (here 4) SMs,
    for accuracy; 16-bit and TF32 do not."""
    monkeypatch.setattr(mm, "num_sms", lambda device: 4)
    M, K, N = 70, 4100, 70
    plan = mm.split_k_plan("fp32", 1, M, N, K, 4)
    assert plan is not None and plan[1] == math.ceil(K / plan[2]) >= 4
    assert mm.split_k_plan("tensor_core", 1, M, N, K, 4) is None
    assert mm.split_k_plan("tf32", 1, M, N, K, 4) is None
    gen = torch.Generator().manual_seed(11)
    a = _randn((M, K), gen, torch.float32)
    b = _randn((K, N), gen, torch.float32, 1 / 64)
    _run("matmul", Sample((a, b), {}, f"{M}x{K}x{N}"), torch.float32, split_k, plan[1])


def test_plan_on_an_h100(monkeypatch):
    """The GPU plan (64x64 tiles) on an H100's 132 SMs: the rule of cuda_src/gemm_select.cuh
    (about 2 programs per SM, slices of at least 256, 64 for exact fp32), though Triton's slices are multiples of
    its 64-wide k tile where CUDA's are multiples of 32."""
    monkeypatch.setattr(mm, "interpreting", lambda: False)
    monkeypatch.setattr(mm, "SPLIT_K", [True])
    tc = "tensor_core"
    cfg, splits, k_slice = mm.split_k_plan(tc, 1, 128, 128, 8192, 132)
    assert cfg[1:4] == (64, 64, 64) and (splits, k_slice) == (32, 256)  # 4 tiles x 32 slices
    assert mm.split_k_plan(tc, 1, 64, 64, 2**18, 132)[1:] == (128, 2048)
    _, splits, k_slice = mm.split_k_plan(tc, 1, 72, 40, 5000, 132)
    assert splits > 1 and k_slice % 64 == 0 and (splits - 1) * k_slice < 5000 <= splits * k_slice
    assert mm.split_k_plan(tc, 1, 1000, 1000, 1000, 132) is None  # 256 tiles fill the GPU
    assert mm.split_k_plan(tc, 1, 128, 128, 511, 132) is None  # k too short to cut twice
    assert mm.split_k_plan(tc, 2, 128, 128, 8192, 132) is None  # the batch axis carries slices
    assert mm.split_k_plan("tf32", 1, 128, 128, 8192, 132)[1] == 32
    # exact fp32, few tiles: slices of at least 64 (CUDA cores), linear_gelu 32x768->3072
    assert mm.split_k_plan("fp32", 1, 32, 3072, 768, 132)[1:] == (6, 128)  # 48 tiles x 6
    assert mm.split_k_plan("fp32", 1, 128, 128, 511, 132) is None  # k < 2 x 256: one pass
    assert mm.split_k_plan("fp32", 1, 128, 128, 512, 132)[1:] == (8, 64)  # 1 tile: k / 64
    assert mm.split_k_plan(tc, 1, 32, 3072, 768, 132)[1:] == (3, 256)  # 16-bit: slices of 256
    # exact fp32, many tiles: slices of about FP32_SLICE, the large class's tile
    cfg, splits, _ = mm.split_k_plan("fp32", 1, 2048, 2048, 16384, 132)
    assert cfg[1:3] == (128, 64) and splits == 16
    assert mm.split_k_plan("fp32", 1, 2048, 2048, 4096, 132) is None
    # exact fp32, few tiles but a long k: at least the accuracy fix's slices (occupancy alone
    # gave 5 slices of 13120 here: 60 tiles, 2 x 132 / 60)
    _, splits, k_slice = mm.split_k_plan("fp32", 1, 384, 640, 65536, 132)
    assert (splits, k_slice) == (64, 1024)
    assert mm.split_k_plan("tf32", 1, 384, 640, 65536, 132)[1] == 5  # TF32: occupancy only
    monkeypatch.setattr(mm, "SPLIT_K", [False])
    assert mm.split_k_plan(tc, 1, 128, 128, 8192, 132) is None


# ---- split-K in one launch (split_k_fixup_kernel): 16-bit, M and N <= 128, 2048 <= k <= 32768


@pytest.fixture
def one_launch(monkeypatch):
    """NaN-poisoned workspaces and counters the test can inspect; yields (fixup launches, reduce
    launches, the last counters handed to a launch)."""
    monkeypatch.setattr(mm, "POISON_WORKSPACE", [float("nan")])
    monkeypatch.setattr(mm, "SPLIT_K", [True])
    monkeypatch.setattr(mm, "SPLIT_K_ONE_LAUNCH", [True])
    handed = []
    counters = mm._tile_counters

    def spy(device, tiles):
        counts = counters(device, tiles)
        handed.append(counts)
        return counts

    monkeypatch.setattr(mm, "_tile_counters", spy)

    def launches(launcher):
        return launcher.slow_launches + launcher.fast_launches

    return lambda: (launches(mm._fixup_launcher), launches(mm._reduce_launcher), handed[-1] if handed else None)  # fmt: skip


# k and A's and B's row strides multiples of 16 elements (else two launches, see below); M and N
# tails; k tails: 2064 = 12 slices of 160 + 144 (interpreter tiles 16x16x32)
ONE_LAUNCH_CASES = {
    "matmul": lambda g, dt: Sample(
        (_randn((24, 2064), g, dt), _randn((2064, 48), g, dt, 1 / 45)), {}, "24x2064x48"
    ),
    "matmul_kmajor_b": lambda g, dt: Sample(
        (_randn((17, 2112), g, dt), _randn((33, 2112), g, dt, 1 / 45).t()),
        {},
        "17x2112x33 B k-major",
    ),
    "linear_gelu": lambda g, dt: Sample(
        (_randn((20, 2112), g, dt), _randn((24, 2112), g, dt, 1 / 45), _randn(24, g, dt, 0.5)),
        {"approximate": "tanh"},
        "20x2112->24 bias gelu",
    ),
}


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("case", sorted(ONE_LAUNCH_CASES))
def test_one_launch_split_k(case, dtype, one_launch):
    """One launch, no reduce kernel; every slice written (NaN-poisoned workspace); the tile
    counters back at 0; the same bits on a second call."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"one/{case}/{dtype}".encode()))
    sample = ONE_LAUNCH_CASES[case](gen, dtype)
    op = "linear_gelu" if case == "linear_gelu" else "matmul"
    fixups, reduces, _ = one_launch()
    out = getattr(dualk, op)(*sample.args, **sample.kwargs, backend="triton")
    again = getattr(dualk, op)(*sample.args, **sample.kwargs, backend="triton")
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    after_fixups, after_reduces, counts = one_launch()
    assert (after_fixups, after_reduces) == (fixups + 2, reduces), "not the one-launch path"
    assert counts is not None and not counts.any(), "tile counters left non-zero"
    verdict = judge(OPS[op], sample, out)
    assert verdict.ok, f"{op} [{sample.label}] {dtype}: {verdict.message}"
    assert torch.equal(out, again), "two calls gave different bits"


def test_one_launch_plan(monkeypatch):
    """Where one launch is taken (GPU configs): the measured box, 16-bit only, batch 1."""
    monkeypatch.setattr(mm, "interpreting", lambda: False)
    monkeypatch.setattr(mm, "SPLIT_K", [True])
    monkeypatch.setattr(mm, "SPLIT_K_ONE_LAUNCH", [True])
    tc = "tensor_core"
    cfg, splits, k_slice = mm.one_launch_plan(tc, 1, 128, 128, 8192)
    assert cfg == mm.FIXUP_CONFIG and (splits, k_slice) == (16, 512)
    _, splits, k_slice = mm.one_launch_plan(tc, 1, 72, 40, 5000)  # 13 slices of 384 + 8
    assert (splits, k_slice) == (14, 384)
    assert mm.one_launch_plan(tc, 1, 129, 128, 8192) is None  # M > 128
    assert mm.one_launch_plan(tc, 1, 128, 129, 8192) is None  # N > 128
    assert mm.one_launch_plan(tc, 1, 128, 128, 2047) is None  # k below the measured range
    assert mm.one_launch_plan(tc, 1, 64, 64, 65536) is None  # k above it (two launches won)
    assert mm.one_launch_plan(tc, 2, 128, 128, 8192) is None
    assert mm.one_launch_plan("fp32", 1, 128, 128, 8192) is None
    assert mm.one_launch_plan("tf32", 1, 128, 128, 8192) is None
    monkeypatch.setattr(mm, "SPLIT_K", [False])
    assert mm.one_launch_plan(tc, 1, 128, 128, 8192) is None


@pytest.mark.parametrize("shape", [(24, 2056, 48), (24, 2064, 40)], ids=["k_2056", "n_40"])
def test_one_launch_needs_16_element_strides(shape, one_launch, monkeypatch):
    """k = 2056 or B's rows of 40 elements: the fix-up kernel has no alignment hints, so the
    two-launch plan (with them) runs instead."""
    monkeypatch.setattr(mm, "num_sms", lambda device: 64)
    M, K, N = shape
    gen = torch.Generator().manual_seed(K + N)
    a = _randn((M, K), gen, torch.bfloat16)
    b = _randn((K, N), gen, torch.bfloat16, 1 / 45)
    sample = Sample((a, b), {}, str(shape))
    fixups, reduces, _ = one_launch()
    out = dualk.matmul(a, b, backend="triton")
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    after_fixups, after_reduces, _ = one_launch()
    assert (after_fixups, after_reduces) == (fixups, reduces + 1)
    verdict = judge(OPS["matmul"], sample, out)
    assert verdict.ok, verdict.message


def test_fp32_3xtf32_precision_rule():
    """fp32 with TF32 off: 3xTF32 from k = FP32_TF32X3_MIN_K, exact FMAs ("ieee") below."""
    assert mm.fp32_input_precision(mm.FP32_TF32X3_MIN_K) == "tf32x3"
    assert mm.fp32_input_precision(mm.FP32_TF32X3_MIN_K - 1) == "ieee"


def test_fp32_3xtf32_runs_in_gemm_kernel_only():
    """The exact re-sum of non-finite tiles is in gemm_kernel; no fp32 config is persistent."""
    assert all(not cfg[0] for cfg in mm.gemm_configs("fp32"))


@pytest.mark.parametrize("op", ["matmul", "linear_gelu"])
def test_fp32_3xtf32_split(op):
    """The 3xTF32 path (k >= FP32_TF32X3_MIN_K) on random fp32 operands, judged by the GEMM rule;
    then special values in A and B must give PyTorch's inf / NaN pattern, signs included, and its
    values elsewhere: FLT_MAX (which cvt.rna.tf32 would round into inf), +-inf times B of both
    signs, times 0, times 8197 (whose TF32 remainder is negative: MAX_TF32 * -3 overflows to
    -inf) and times the smallest subnormal (whose TF32 part is 0), inf - inf, NaN, -0.0, an inf
    and a NaN in B, and a finite product at fp32's maximum whose TF32 parts overflow."""
    gen = torch.Generator().manual_seed(5)
    M, K, N = 40, mm.FP32_TF32X3_MIN_K + 44, 36
    a = _randn((M, K), gen, torch.float32)
    w = _randn((N, K), gen, torch.float32, 1 / 16)
    if op == "matmul":
        sample = Sample((a, w.t()), {}, f"{M}x{K}x{N}")
    else:
        sample = Sample(
            (a, w, _randn((N,), gen, torch.float32)), {"approximate": "tanh"}, f"{M}x{K}->{N}"
        )
    out = getattr(dualk, op)(*sample.args, **sample.kwargs, backend="triton")
    verdict = judge(OPS[op], sample, out)
    assert verdict.ok, verdict.message

    a = a.cpu()
    big, inf, nan = torch.finfo(torch.float32).max, float("inf"), float("nan")
    a[0, 0], a[1, 1], a[2, 2], a[3, 3], a[4, 4] = big, inf, -inf, nan, -0.0
    a[5, 1], a[5, 2] = inf, -inf  # NaN where b[1] and b[2] share a sign
    a[6, 11] = 2.0**64 * (1 - 2.0**-24)  # times b[11, 10]: fp32's maximum, finite
    # B random, both signs, 0.1 <= |b| < 0.9 (row 0 stays finite), and under the infinities of
    # rows 1 and 2: 0, +-8197, the smallest subnormal.
    b = (torch.rand((K, N), generator=gen) * 0.8 + 0.1) * (
        torch.randint(0, 2, (K, N), generator=gen) * 2 - 1
    )
    b[1, 3] = b[2, 5] = 0.0
    b[1, 4], b[1, 6], b[2, 7] = 8197.0, -8197.0, 1.4e-45
    b[9, 8], b[10, 9] = inf, nan
    b[11, 10] = 2.0**64 * (1 - 2.0**-24)
    b[11, :10] = b[11, 11:] = 0.0
    if op == "matmul":
        want = a @ b
        out = dualk.matmul(a.to(DEVICE), b.to(DEVICE), backend="triton").cpu()
    else:
        want = torch.nn.functional.gelu(a @ b, approximate="tanh")
        zeros = torch.zeros(N, device=DEVICE)
        out = dualk.linear_gelu(a.to(DEVICE), b.t().to(DEVICE), zeros, backend="triton").cpu()
    for pattern in (torch.isnan, torch.isposinf, torch.isneginf):
        assert torch.equal(pattern(out), pattern(want)), pattern.__name__
    prod = a @ b  # the cases are there
    assert prod[1, 3].isnan() and prod[1, 4] == inf and prod[1, 6] == -inf and prod[2, 7] == -inf
    assert prod[5].isnan().any() and prod[:, 8].isinf().any() and prod[:, 9].isnan().all()
    assert prod[6, 10].isfinite() and prod[6, 10] > 1e38
    finite = want.isfinite()
    assert torch.allclose(out[finite], want[finite], rtol=1e-5, atol=1e-4)
    assert out[0, :8].isfinite().all()  # FLT_MAX * b + ..., not inf (gelu: x or 0)
    assert (out[0, :8].abs() > 1e37).all() if op == "matmul" else (out[0, :8].amax() > 1e37)


@pytest.mark.parametrize("op", ["matmul", "linear_gelu"])
def test_the_tf32_switch_reaches_the_triton_kernels(op, monkeypatch):
    """PyTorch's TF32 switch (torch.backends.cuda.matmul.allow_tf32, as
    set_float32_matmul_precision sets it) decides the fp32 kernels' dot: "tf32" when on, exact
    fp32 when off; either way the answer stays within TF32's error bound of the float64
    reference (10-bit mantissas, truncated by Triton on NVIDIA: 2^-9 of sum |a_i b_i| per
    element, the fp32 sum's own error included)."""
    if unavailable_reason("triton", DEVICE) is not None:
        pytest.skip(unavailable_reason("triton", DEVICE))
    kinds = []
    real = mm._gemm_launch

    def spy(*args):
        kinds.append(args[-1])
        return real(*args)

    monkeypatch.setattr(mm, "_gemm_launch", spy)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(16, 40, generator=gen).to(DEVICE)
    w = torch.randn(24, 40, generator=gen).to(DEVICE)
    bias = torch.randn(24, generator=gen).to(DEVICE)
    if op == "matmul":
        call = lambda: dualk.matmul(x, w.t(), backend="triton")  # noqa: E731
        ref, bound_terms = x.double() @ w.t().double(), x.double().abs() @ w.t().double().abs()
    else:
        call = lambda: dualk.linear_gelu(x, w, bias, backend="triton")  # noqa: E731
        z = x.double() @ w.t().double() + bias.double()
        ref = torch.nn.functional.gelu(z, approximate="tanh")
        bound_terms = x.double().abs() @ w.t().double().abs() + bias.double().abs()
    was = torch.backends.cuda.matmul.allow_tf32
    try:
        for allowed, kind in ((True, "tf32"), (False, "fp32")):
            torch.backends.cuda.matmul.allow_tf32 = allowed
            kinds.clear()
            out = call()
            assert kinds and set(kinds) == {kind}, (allowed, kinds)  # (a GPU tunes configs first)
            # gelu's slope is at most ~1.13: the bound carries through it
            assert ((out.double() - ref).abs() <= 2.0**-9 * 1.2 * bound_terms + 1e-6).all()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = was
