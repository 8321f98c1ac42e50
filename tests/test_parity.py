"""Every operator x backend x dtype x shape case of the registry against a float64 reference.
Elementwise ops use the per-dtype tolerance table; GEMM-family ops must stay within 2x PyTorch's
own error in the same dtype (dualk/testing.py). Inputs are random (never zeros), outputs are
poisoned with NaN before launch (conftest), and inputs must come back unchanged."""

import pytest
import torch
from conftest import DEVICE, HAS_CUDA

import dualk
from dualk.backends import unavailable_reason
from dualk.registry import DTYPES, OPS
from dualk.testing import clone_inputs, float64_reference, inputs_unchanged, judge

CASES = [
    pytest.param(op, case.name, backend, dtype, id=f"{op}-{case.name}-{backend}-{str(dtype)[6:]}")
    for op, spec in OPS.items()
    for case in spec.cases
    for backend in spec.backends
    for dtype in DTYPES
    if not case.bench or not case.gpu_only or case.quick  # the big benchmark shapes stay in bench
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
    gen = torch.Generator().manual_seed(hash((op, case_name, str(dtype))) % 2**31)
    sample = case.make(dtype, DEVICE, gen)
    before = clone_inputs(sample)
    out = getattr(dualk, op)(*sample.args, **sample.kwargs, backend=backend)
    if HAS_CUDA:
        torch.cuda.synchronize()
    verdict = judge(spec, sample, out, float64_reference(spec, sample))
    assert verdict.ok, f"{op} [{sample.label}] on {backend}/{dtype}: {verdict.message}"
    assert inputs_unchanged(before, sample), f"{op} [{sample.label}] on {backend} modified its inputs"


@pytest.mark.skipif(not HAS_CUDA, reason="compares the two GPU backends with each other")
@pytest.mark.parametrize("op", ["matmul", "linear_gelu", "fused_mlp"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_cuda_and_triton_agree(op, dtype):
    spec = OPS[op]
    for case in spec.cases:
        if case.bench and not case.quick:
            continue
        sample = case.make(dtype, DEVICE, torch.Generator().manual_seed(7))
        ref = float64_reference(spec, sample)
        outs = {b: getattr(dualk, op)(*sample.args, **sample.kwargs, backend=b) for b in ("cuda", "triton")}
        scale = max(ref.abs().max().item(), 1e-30) if ref.numel() else 1.0
        diff = (outs["cuda"].double() - outs["triton"].double()).abs().max().item() if ref.numel() else 0.0
        # Both are within 2x PyTorch's error of the reference, so they agree within 4x of it.
        tv = judge(spec, sample, outs["triton"], ref)
        cv = judge(spec, sample, outs["cuda"], ref)
        assert tv.ok and cv.ok, f"{case.name}: triton {tv.message}; cuda {cv.message}"
        assert diff <= tv.max_abs_err + cv.max_abs_err + torch.finfo(dtype).eps * scale, case.name
