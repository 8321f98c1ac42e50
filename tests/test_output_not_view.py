"""Outputs of inputs with more than two dims are plain tensors, as PyTorch's own ops return: not
views of a (rows, n) tensor. A view returned from dualk's autograd Function cannot be modified in
place (`y.add_(1)` under autograd raised "Output 0 of _Function is a view and is being modified
inplace"), which broke models that add a residual in place (review finding, session 35)."""

import pytest
import torch
from conftest import DEVICE
from torch import nn

import dualk

NO_GPU = "the CUDA backend needs a GPU"
CUDA = pytest.param("cuda", marks=pytest.mark.skipif(DEVICE.type != "cuda", reason=NO_GPU))
BACKENDS = ("torch", "triton", CUDA)


def _layers(widths, seed):
    torch.manual_seed(seed)
    return [nn.Linear(a, b, device=DEVICE) for a, b in zip(widths, widths[1:])]


def _linear_gelu(x, backend):
    (lin,) = _layers((8, 12), 1)
    run = lambda x, b: dualk.linear_gelu(x, lin.weight, lin.bias, backend=b)  # noqa: E731
    return run, list(lin.parameters())


def _fused_mlp(x, backend):
    layers = _layers((8, 16, 16, 4), 2)
    ws, bs = [m.weight for m in layers], [m.bias for m in layers]
    run = lambda x, b: dualk.fused_mlp(x, ws, bs, activation="relu", backend=b)  # noqa: E731
    return run, ws + bs


def _linear_glu(x, backend):
    gate, up = _layers((8, 12), 3)[0], _layers((8, 12), 4)[0]
    run = lambda x, b: dualk.linear_glu(  # noqa: E731
        x, gate.weight, up.weight, gate.bias, up.bias, activation="silu", backend=b
    )
    return run, [gate.weight, up.weight, gate.bias, up.bias]


OPS = {"linear_gelu": _linear_gelu, "fused_mlp": _fused_mlp, "linear_glu": _linear_glu}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "autograd"])
def test_batched_output_is_not_a_view(op, backend, grad):
    """A (2, 3, k) input: the output (2, 3, n) takes an in-place op under autograd, and the
    gradients through it match PyTorch's path (float32); on dualk's kernels it has no base
    tensor (PyTorch's F.linear may return a view, which autograd itself made, so in place works
    on it)."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, device=DEVICE, requires_grad=grad)
    run, params = OPS[op](x, backend)
    with torch.set_grad_enabled(grad):
        y = run(x, backend)
        assert y.is_contiguous() and y.shape[:-1] == (2, 3)
        assert y._base is None or backend == "torch"
        y.mul_(3.0)  # raised on the Triton and CUDA backends before the fix
    ref = run(x, "torch") * 3.0
    torch.testing.assert_close(y, ref, rtol=1e-3, atol=1e-3)
    if not grad:
        return
    grads = torch.autograd.grad(y.square().sum(), [x, *params])
    grads_ref = torch.autograd.grad(ref.square().sum(), [x, *params])
    for g, r in zip(grads, grads_ref):
        torch.testing.assert_close(g, r, rtol=2e-3, atol=2e-3)


def test_training_forward_adds_no_copy_of_the_output(monkeypatch):
    """The views PyTorch's own paths return (F.linear with a bias on a (..., k) input; fused_mlp's
    per-layer chain, taken where the fused kernels do not fit, ends in a reshape) are relabelled,
    not cloned: a training forward copies no full output to make it a tensor of its own."""
    clones = []
    real_clone = torch.Tensor.clone

    def spy(self, *args, **kwargs):
        clones.append(tuple(self.shape))
        return real_clone(self, *args, **kwargs)

    torch.manual_seed(0)
    wide = _layers((8, 300, 4), 5)  # 300 wide: past Triton's fused kernel, the per-layer chain
    ws, bs = [m.weight for m in wide], [m.bias for m in wide]
    (lin,) = _layers((8, 12), 6)
    monkeypatch.setattr(torch.Tensor, "clone", spy)
    for shape in ((4, 8), (2, 3, 8)):
        x = torch.randn(*shape, device=DEVICE, requires_grad=True)
        for backend in ("torch", "triton"):
            y = dualk.fused_mlp(x, ws, bs, activation="relu", backend=backend)
            z = dualk.linear_gelu(x, lin.weight, lin.bias, backend=backend)
            assert y._base is None and z._base is None
            y.add_(1.0)
            z.add_(1.0)
            (y.sum() + z.sum()).backward()
    assert clones == []
