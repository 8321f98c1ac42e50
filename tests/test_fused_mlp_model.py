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
                      "silu": torch.nn.SiLU}  # fmt: skip


def build_model(widths, activation, dtype):
    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(torch.nn.Linear(fan_in, fan_out))
        if i != len(widths) - 2:
            layers.append(ACTIVATION_MODULES[activation]())
    return torch.nn.Sequential(*layers).to(device=DEVICE, dtype=dtype).eval()


@pytest.mark.parametrize("backend", ["cuda", "triton", "torch"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
def test_sequential_model_through_fused_mlp(backend, dtype, activation):
    reason = unavailable_reason(backend, DEVICE)
    if reason is not None:
        pytest.skip(reason)
    torch.manual_seed(0)
    model = build_model((100, 128, 64, 10), activation, dtype)
    x = torch.randn(33, 100).to(device=DEVICE, dtype=dtype)
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    weights = [m.weight.detach() for m in linears]
    biases = [m.bias.detach() for m in linears]
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
