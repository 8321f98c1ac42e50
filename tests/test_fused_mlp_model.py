"""fused_mlp reproduces an nn.Sequential of nn.Linear / activation modules with its own weights
(the seed use: a 100-128-64-10 DNN exported from PyTorch and run as one fused op)."""

import pytest
import torch
from conftest import DEVICE

import dualk
from dualk.backends import unavailable_reason
from dualk.registry import DTYPES, OPS, Sample
from dualk.testing import judge

ACTIVATION_MODULES = {"relu": torch.nn.ReLU, "gelu": lambda: torch.nn.GELU(approximate="tanh"),
                      "gelu_erf": torch.nn.GELU, "silu": torch.nn.SiLU}  # fmt: skip


def build_model(widths, activation, dtype):
    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(torch.nn.Linear(fan_in, fan_out))
        if i != len(widths) - 2:
            layers.append(ACTIVATION_MODULES[activation]())
    return torch.nn.Sequential(*layers).to(device=DEVICE, dtype=dtype).eval()


@pytest.mark.parametrize("backend", ["cuda", "triton", "torch"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_erf", "silu"])
def test_sequential_model_through_fused_mlp(backend, dtype, activation):
    reason = unavailable_reason(backend, DEVICE)
    if reason is not None:
        pytest.skip(reason)
    torch.manual_seed(0)
    model = build_model((100, 128, 64, 10), activation, dtype)
    x = torch.randn(33, 100).to(device=DEVICE, dtype=dtype)
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    # The module's own nn.Parameters, as a user passes them (no .detach()).
    weights = [m.weight for m in linears]
    biases = [m.bias for m in linears]
    with torch.no_grad():
        expected = model(x)
        out = dualk.fused_mlp(x, weights, biases, activation=activation, backend=backend)
    if backend == "torch":
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        return
    # The same rule as every matrix op: within 2x PyTorch's own error against float64.
    verdict = judge(
        OPS["fused_mlp"], Sample((x, weights, biases), {"activation": activation}, "seq"), out
    )
    assert verdict.ok, verdict.message


# The inf is meant: the interpreter's numpy matmul warns about the inf * 0 it is given.
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("hidden", [10, 200])
def test_inf_input_stays_out_of_padded_columns(backend, dtype, hidden):
    """An inf that relu turns into 0 must not reach padded (zero-weight) columns as inf * 0 = NaN:
    PyTorch's answer here is finite. Hidden width 10 runs the CUDA padded kernel (widths <= 128),
    200 the runtime-width one."""
    reason = unavailable_reason(backend, DEVICE)
    if reason is not None:
        pytest.skip(reason)
    gen = torch.Generator().manual_seed(3)
    w0 = torch.rand((hidden, 4), generator=gen) + 0.1
    w0[:, 0] = -w0[:, 0]  # x[:, 0] = +inf -> -inf pre-activations -> relu -> 0
    weights = [w0, torch.rand((3, hidden), generator=gen) - 0.5]
    biases = [torch.rand(hidden, generator=gen), torch.rand(3, generator=gen)]
    weights = [w.to(DEVICE, dtype) for w in weights]
    biases = [b.to(DEVICE, dtype) for b in biases]
    x = torch.tensor([[float("inf"), 1.0, 2.0, 3.0], [0.5, 1.0, -1.0, 2.0]]).to(DEVICE, dtype)
    expected = dualk.fused_mlp(x, weights, biases, backend="torch")
    out = dualk.fused_mlp(x, weights, biases, backend=backend)
    assert torch.isfinite(expected).all()
    assert torch.isfinite(out).all(), f"{backend}/{dtype}: {out}"
    verdict = judge(OPS["fused_mlp"], Sample((x, weights, biases), {}, "inf"), out)
    assert verdict.ok, f"{backend}/{dtype}: {verdict.message}"


@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_inf_input_at_a_large_fp32_batch(backend):
    """The inf case at a batch of 32-row tiles: fp32 on Hopper runs the 3xTF32 tensor-core kernel,
    which splits x and W into hi + lo parts; inf * (w_hi + w_lo) must stay inf, not inf - inf."""
    if DEVICE.type != "cuda":
        pytest.skip("a GPU-sized batch")
    reason = unavailable_reason(backend, DEVICE)
    if reason is not None:
        pytest.skip(reason)
    gen = torch.Generator().manual_seed(4)
    w0 = torch.rand((24, 8), generator=gen) + 0.1
    w0[:, 0] = -w0[:, 0]  # x[:, 0] = +inf -> -inf pre-activations -> relu -> 0
    weights = [w0.to(DEVICE), (torch.rand((3, 24), generator=gen) - 0.5).to(DEVICE)]
    biases = [torch.rand(24, generator=gen).to(DEVICE), torch.rand(3, generator=gen).to(DEVICE)]
    x = torch.rand((8192, 8), generator=gen).to(DEVICE)
    x[::7, 0] = float("inf")
    expected = dualk.fused_mlp(x, weights, biases, backend="torch")
    out = dualk.fused_mlp(x, weights, biases, backend=backend)
    assert torch.isfinite(expected).all()
    assert torch.isfinite(out).all(), (
        f"{backend}: {int((~torch.isfinite(out)).sum())} non-finite outputs"
    )
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
