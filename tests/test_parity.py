"""Every operator x backend x dtype x shape case of the registry against a float64 reference.
Elementwise ops use the per-dtype tolerance table; GEMM-family ops must stay within 2x PyTorch's
own error in the same dtype (dualk/testing.py). Inputs are random (never zeros), outputs are
poisoned with NaN before launch (conftest), and inputs must come back unchanged."""

import zlib

import pytest
import torch
from conftest import DEVICE, HAS_CUDA

import dualk
from dualk.backends import unavailable_reason
from dualk.registry import DTYPES, OPS
from dualk.testing import (
    clone_inputs,
    float64_reference,
    gemm_error_budget,
    inputs_unchanged,
    judge,
)

CASES = [
    pytest.param(op, case.name, backend, dtype, id=f"{op}-{case.name}-{backend}-{str(dtype)[6:]}")
    for op, spec in OPS.items()
    for case in spec.cases
    for backend in spec.backends
    for dtype in DTYPES
    if not case.bench or not case.gpu_only or case.quick  # the big benchmark shapes stay in bench
    if case.test_dtypes is None or dtype in case.test_dtypes  # registry.ShapeCase says why
]


@pytest.mark.parametrize("op,case_name,backend,dtype", CASES)
def test_matches_float64_reference(op, case_name, backend, dtype):
    spec = OPS[op]
    case = spec.case(case_name)
    if case.gpu_only and not HAS_CUDA:
        pytest.skip("shape reserved for the GPU run (too slow for Triton's CPU interpreter)")
    reason = unavailable_reason(backend, DEVICE)
    if reason is not None:
        pytest.skip(reason)
    # crc32, not hash(): str hashes change per process, and a sample must be reproducible.
    gen = torch.Generator().manual_seed(zlib.crc32(f"{op}/{case_name}/{dtype}".encode()))
    sample = case.make(dtype, DEVICE, gen)
    before = clone_inputs(sample)
    out = getattr(dualk, op)(*sample.args, **sample.kwargs, backend=backend)
    if HAS_CUDA:
        torch.cuda.synchronize()
    if backend == "torch" and spec.implementation("torch") is spec.reference:
        # The torch backend is PyTorch's own arithmetic (on the CPU, bf16 add rounds alpha * b
        # before adding, for one): it must be exactly the reference, which is judged below for
        # the kernels.
        expected = spec.reference(*sample.args, **sample.kwargs)
        assert torch.equal(out.nan_to_num(), expected.nan_to_num()) and out.shape == expected.shape
        return
    verdict = judge(spec, sample, out, float64_reference(spec, sample))
    assert verdict.ok, f"{op} [{sample.label}] on {backend}/{dtype}: {verdict.message}"
    assert inputs_unchanged(before, sample), (
        f"{op} [{sample.label}] on {backend} modified its inputs"
    )


# One test per (operator, case): a loop over the cases made one 82 s test (fp32 fused_mlp, a
# Triton compile per case) that the GPU run's xdist workers could not share.
AGREE_CASES = [
    (op, case.name)
    for op in ("matmul", "linear_gelu", "fused_mlp")
    for case in OPS[op].cases
    if not (case.bench and not case.quick)
]


@pytest.mark.skipif(not HAS_CUDA, reason="compares the two GPU backends with each other")
@pytest.mark.parametrize("op,case_name", AGREE_CASES, ids=[f"{o}-{c}" for o, c in AGREE_CASES])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_cuda_and_triton_agree(op, case_name, dtype):
    """The two backends agree with each other within twice the error budget each has against
    the float64 reference (testing.gemm_error_budget: 2x PyTorch's own same-dtype error plus the
    ulp floor). Their summation orders differ (split-K slices, tile sizes chosen per GPU), so in
    fp32 each may sit near its own budget on the opposite side of the reference."""
    spec = OPS[op]
    case = next(c for c in spec.cases if c.name == case_name)
    sample = case.make(dtype, DEVICE, torch.Generator().manual_seed(7))
    ref = float64_reference(spec, sample)
    if ref.numel() == 0:
        return
    outs = [
        getattr(dualk, op)(*sample.args, **sample.kwargs, backend=b).double()
        for b in ("cuda", "triton")
    ]
    torch_err = (spec.reference(*sample.args, **sample.kwargs).double() - ref).abs().max().item()
    allowed = 2 * gemm_error_budget(dtype, torch_err, ref.abs().max().item())
    diff = (outs[0] - outs[1]).abs()
    assert diff.max().item() <= allowed, (
        f"{case.name}: cuda and triton differ by {diff.max().item():.3g} "
        f"(PyTorch's own error {torch_err:.3g}) at {divmod(int(diff.argmax()), ref.shape[-1])}"
    )


WIDE_CASES = [c.name for c in OPS["fused_mlp"].cases if c.name.startswith("wide_")]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("case_name", WIDE_CASES)
def test_wide_fused_mlp_cases_take_the_kernel_they_test(case_name, dtype):
    """The wide_* cases above pass on any kernel; this one checks that on Hopper the planner
    gives the one-launch wide kernel every case not named *_fallback, and the others not (a
    planner slip would otherwise cost 3-4x silently: 155 vs 579 us at 256x3, H100), and that
    dualk.explain names that kernel."""
    if not HAS_CUDA or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wide fused MLP kernel is built for compute capability 9.0 only")
    reason = unavailable_reason("cuda", DEVICE)
    if reason is not None:
        pytest.skip(reason)
    from dualk.backends import cuda as cuda_backend

    gen = torch.Generator().manual_seed(zlib.crc32(f"wide-kernel/{case_name}".encode()))
    sample = OPS["fused_mlp"].case(case_name).make(dtype, DEVICE, gen)
    x, weights, biases = sample.args
    activation = sample.kwargs.get("activation", "relu")
    kernel = cuda_backend.fused_mlp_kernel(x, weights, biases, activation)
    wide = kernel is not None and "wide" in kernel
    assert wide != case_name.endswith("_fallback"), f"{case_name}/{dtype}: planner took {kernel!r}"
    notes = dualk.explain("fused_mlp", x, weights, biases, activation=activation, backend="cuda")
    assert f"CUDA kernel: {kernel}" in notes.notes, notes
    # auto's untimed rule (capture, tracing, DUALK_AUTOTUNE=0) follows the planner.
    from dualk.dispatch import autotune

    args = (x, weights, biases, activation)
    chosen, rule = autotune.heuristic(OPS["fused_mlp"], args, ["cuda", "triton", "torch"])
    assert chosen == ("cuda" if wide else "torch"), rule


_COMPACT_LAST_SCRIPT = """
import torch, dualk
from dualk.backends import cuda as cuda_backend
from dualk.registry import OPS, Sample, mlp_parameters, randn
from dualk.testing import judge
spec = OPS["fused_mlp"]
gen = torch.Generator().manual_seed(36)
for widths, act, dtype, rows in [
    ((128,) * 5 + (16,), "relu", torch.float16, 5003),
    ((128,) * 5 + (10,), "gelu", torch.bfloat16, 777),
    ((100,) + (128,) * 4 + (32,), "silu", torch.float16, 4133),
    ((128,) * 5 + (24,), "none", torch.bfloat16, 129),
    ((128,) * 5 + (16,), "relu", torch.bfloat16, 1),
]:
    weights, biases = mlp_parameters(widths, dtype, "cuda", gen)
    x = randn((rows, widths[0]), dtype, "cuda", gen)
    kernel = cuda_backend.fused_mlp_kernel(x, weights, biases, act)
    assert kernel == "sm90 wgmma, resident weights, compact last layer", (widths, kernel)
    sample = Sample((x, weights, biases), {"activation": act}, f"{widths} {act}")
    out = dualk.fused_mlp(x, weights, biases, activation=act, backend="cuda")
    verdict = judge(spec, sample, out)
    assert verdict.ok, (widths, act, dtype, verdict.message)
print("compact last layer: ok")
"""


def test_compact_last_layer_when_enabled():
    """The compact last layer of the Hopper wgmma MLP kernel (on unless DUALK_MLP_COMPACT_LAST=0;
    set to 1 here): 5 layers of 128 with outputs of 10-32 columns take it (2-3 warpgroups, where
    the padded layouts of both kernels fit too few; 64 columns fit one warpgroup, which the
    launcher leaves to the mma.sync kernel) and match the float64 reference, tails and one row
    included."""
    import os
    import subprocess
    import sys

    if not HAS_CUDA or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma MLP kernel is built for compute capability 9.0 only")
    reason = unavailable_reason("cuda", DEVICE)
    if reason is not None:
        pytest.skip(reason)
    env = {**os.environ, "DUALK_MLP_COMPACT_LAST": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _COMPACT_LAST_SCRIPT], env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0 and "compact last layer: ok" in done.stdout, (
        done.stdout[-2000:] + done.stderr[-4000:]
    )


@pytest.mark.parametrize("backend", ["cuda", "triton", "torch"])
@pytest.mark.parametrize("op", list(OPS))
def test_matches_without_poisoning(op, backend):
    """Users run with outputs unpoisoned (no NaN fill; on a GPU add/relu_scale then allocate and
    launch in one C++ call): that path gives the float64 reference's answer too, and for the
    elementwise ops the poisoned path's, bit for bit."""
    from dualk.core import alloc as _alloc

    spec = OPS[op]
    reason = unavailable_reason(backend, DEVICE)
    if reason is not None:
        pytest.skip(reason)
    case = next(c for c in spec.cases if not c.gpu_only)
    sample = case.make(
        torch.float32, DEVICE, torch.Generator().manual_seed(zlib.crc32(op.encode()))
    )
    poisoned = getattr(dualk, op)(*sample.args, **sample.kwargs, backend=backend)
    _alloc.set_poison(False)
    try:
        plain = getattr(dualk, op)(*sample.args, **sample.kwargs, backend=backend)
    finally:
        _alloc.set_poison(True)
    if spec.judged_by == "elementwise":  # (a GEMM's split-K sums may differ in order)
        assert torch.equal(plain, poisoned)
    verdict = judge(spec, sample, plain, float64_reference(spec, sample))
    assert verdict.ok, f"{op} on {backend} without poisoning: {verdict.message}"
