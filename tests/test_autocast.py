"""dualk under torch.autocast: the matmul-like operators (matmul, linear_gelu, fused_mlp,
linear_glu) cast their floating inputs to the autocast dtype as F.linear / torch.mm do, so an
autocast model can call them with fp32 parameters, or with an activation that an autocast op
before them produced in 16-bit (which would otherwise be a mixed-dtype error); gradients reach
the fp32 parameters."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, HAS_CUDA

import dualk
from dualk.backends import unavailable_reason

DEVICE_TYPE = DEVICE.type
BACKENDS = ("torch", "triton", "cuda")
AUTOCAST_DTYPES = (torch.bfloat16, torch.float16)


def _skip_unavailable(backend):
    reason = unavailable_reason(backend, DEVICE)
    if reason is not None:
        pytest.skip(reason)


def _params(*shapes):
    gen = torch.Generator().manual_seed(hash(shapes) % 2**31)
    return [
        torch.nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64).float().to(DEVICE))
        for s in shapes
    ]


def _calls(backend):
    """op -> (call on tensors, the fp32 tensors it takes)."""
    x, w1, b1, w2, b2, bm, wu = _params((9, 16), (24, 16), (24,), (8, 24), (8,), (16, 5), (24, 16))
    return {
        "matmul": (lambda t: dualk.matmul(t[0], t[1], backend=backend), [x, bm]),
        "linear_gelu": (lambda t: dualk.linear_gelu(*t, backend=backend), [x, w1, b1]),
        "fused_mlp": (
            lambda t: dualk.fused_mlp(t[0], [t[1], t[3]], [t[2], t[4]], backend=backend),
            [x, w1, b1, w2, b2],
        ),
        "linear_glu": (
            lambda t: dualk.linear_glu(t[0], t[1], t[2], t[3], None, backend=backend),
            [x, w1, wu, b1],
        ),
    }


@pytest.mark.parametrize("dtype", AUTOCAST_DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["matmul", "linear_gelu", "fused_mlp", "linear_glu"])
def test_autocast_runs_the_op_in_its_dtype_with_fp32_gradients(op, backend, dtype):
    _skip_unavailable(backend)
    call, tensors = _calls(backend)[op]
    with torch.autocast(DEVICE_TYPE, dtype=dtype):
        out = call(tensors)
    assert out.dtype == dtype
    weight = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (out.double() * weight.to(DEVICE)).sum().backward()
    grads = [t.grad.clone() for t in tensors]
    for t in tensors:
        t.grad = None
    # The same op on inputs cast by hand, outside autocast: the same values and gradients.
    expected = call([t.to(dtype) for t in tensors])
    assert torch.equal(out, expected)
    (expected.double() * weight.to(DEVICE)).sum().backward()
    for t, g in zip(tensors, grads):
        assert t.grad.dtype == torch.float32 and g.dtype == torch.float32
        assert torch.equal(g, t.grad)
    with torch.no_grad():  # autocast off again: fp32 as before
        assert call(tensors).dtype == torch.float32


@pytest.mark.parametrize("backend", BACKENDS)
def test_autocast_model_feeding_a_fused_module_a_16bit_activation(backend):
    """An autocast nn.Linear produces bf16; the FusedMLP after it (fp32 parameters) takes it, in
    training and in inference (where FusedMLP's inference plan must step aside for autocast)."""
    _skip_unavailable(backend)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), dualk.nn.FusedMLP((32, 24, 8), activation="gelu", backend=backend)
    ).to(DEVICE)
    reference = torch.nn.Sequential(model[0], model[1].to_sequential())
    x = torch.randn(7, 16, device=DEVICE)
    with torch.no_grad():
        model(x)  # an fp32 call plans FusedMLP's inference path
    for grad in (False, True):
        with torch.set_grad_enabled(grad), torch.autocast(DEVICE_TYPE, dtype=torch.bfloat16):
            out, ref = model(x), reference(x)
        assert out.dtype == ref.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    out.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())


def test_autocast_under_compile_fullgraph():
    """The casts trace without a graph break and the compiled call matches eager."""
    call, tensors = _calls("torch")["fused_mlp"]
    compiled = torch.compile(call, fullgraph=True, backend="inductor" if HAS_CUDA else "aot_eager")
    with torch.no_grad(), torch.autocast(DEVICE_TYPE, dtype=torch.bfloat16):
        out, eager = compiled(tensors), call(tensors)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), eager.float(), rtol=1e-2, atol=1e-2)


def test_devices_autocast_does_not_know_are_left_alone():
    """A meta-device dry run inside an autocast region: autocast is not asked about 'meta'."""
    a, b = torch.randn(4, 5, device="meta"), torch.randn(5, 3, device="meta")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = dualk.matmul(a, b)
    assert out.device.type == "meta" and out.shape == (4, 3)
