"""dualk under torch.func transforms (vmap, grad, jacrev): every operator gives PyTorch's answer,
whatever backend is asked for. Transforms wrap tensors that have no storage for a kernel to read
and do not compose with dualk's autograd.Function, so under a transform the operators run
PyTorch's implementation (README: "torch.func")."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE

import dualk

BACKENDS = ("auto", "cuda", "triton", "torch")


def _r(*shape, seed=0):
    gen = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=gen, dtype=torch.float64).float().to(DEVICE)


def _cases(backend):
    """name -> (dualk call, PyTorch's call, per-sample inputs stacked on dim 0, shared inputs)."""
    w1, b1, w2 = _r(16, 8, seed=1), _r(16, seed=2), _r(4, 16, seed=3)
    return {
        "add": (lambda x, y: dualk.add(x, y, alpha=0.5, backend=backend),
                lambda x, y: torch.add(x, y, alpha=0.5), (_r(5, 3, 8), _r(5, 3, 8, seed=4))),
        "relu_scale": (lambda x: dualk.relu_scale(x, 1.5, backend=backend),
                       lambda x: torch.relu(x) * 1.5, (_r(5, 3, 8),)),
        "matmul": (lambda x: dualk.matmul(x, w1.t(), backend=backend),
                   lambda x: x @ w1.t(), (_r(5, 3, 8),)),
        "linear_gelu": (lambda x: dualk.linear_gelu(x, w1, b1, backend=backend),
                        lambda x: F.gelu(F.linear(x, w1, b1), approximate="tanh"), (_r(5, 3, 8),)),
        "fused_mlp": (lambda x: dualk.fused_mlp(x, [w1, w2], [b1, None], activation="gelu", backend=backend),
                      lambda x: F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2),
                      (_r(5, 3, 8),)),
    }  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["add", "relu_scale", "matmul", "linear_gelu", "fused_mlp"])
def test_vmap_grad_and_jacrev_give_pytorchs_answer(op, backend):
    ours, theirs, inputs = _cases(backend)[op]
    with torch.no_grad():
        torch.testing.assert_close(torch.vmap(ours)(*inputs), torch.vmap(theirs)(*inputs))
    first = tuple(t[0] for t in inputs)
    torch.testing.assert_close(
        torch.func.jacrev(ours)(*first), torch.func.jacrev(theirs)(*first), rtol=1e-5, atol=1e-5
    )

    # Per-sample gradients, the common use: vmap over grad of a scalar loss.
    def loss(f):
        return lambda *a: f(*a).square().sum()

    torch.testing.assert_close(
        torch.vmap(torch.func.grad(loss(ours)))(*inputs),
        torch.vmap(torch.func.grad(loss(theirs)))(*inputs),
        rtol=1e-5,
        atol=1e-5,
    )


def test_bad_input_under_vmap_is_still_a_dualk_error():
    b = _r(5, 4)
    with pytest.raises(dualk.DualkError, match="inner sizes differ"):
        torch.vmap(lambda x: dualk.matmul(x, b))(_r(2, 3, 8))


@pytest.mark.parametrize("backend", BACKENDS)
def test_vmap_over_a_planned_fused_mlp_module(backend):
    """FusedMLP's inference plan (made by an earlier no-grad call) steps aside under vmap."""
    torch.manual_seed(0)
    module = dualk.nn.FusedMLP((8, 16, 4), activation="relu", backend=backend).to(DEVICE)
    reference = module.to_sequential()
    xs = _r(3, 5, 8)
    with torch.no_grad():
        with contextlib.suppress(dualk.DualkError):  # a backend that cannot run here
            module(xs[0])  # plans
        torch.testing.assert_close(torch.vmap(module)(xs), reference(xs))


def test_unknown_backend_name_under_vmap_is_an_error():
    with pytest.raises(dualk.DualkError, match="unknown backend"):
        torch.vmap(lambda x: dualk.relu_scale(x, 2.0, backend="cdua"))(_r(2, 3))
