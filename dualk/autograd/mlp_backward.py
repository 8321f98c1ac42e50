"""The backward of `dualk.fused_mlp` (used by its autograd formulas in dualk/autograd/library.py and eager.py).

Two ways, chosen per call:
- fused (Triton, triton_src/fused_mlp_backward.py): one persistent kernel recomputes each row
  tile's forward on chip from x and walks the layers back, so HBM sees x, the output gradient and
  the input gradient only (plus small per-program weight-gradient partials). Used when the
  forward's backend is "triton", or "auto" on a GPU, and the MLP fits the kernel;
- a layer chain on dualk's own matmul of the forward's backend (`backend="cuda"` gets CUDA
  GEMMs): recompute the pre-activations layer by layer, then dW_i = dZ_i^T H_i, dH = dZ_i W_i,
  dZ = dH * act'(Z). Activation derivatives are PyTorch's ATen backward functions.

The forward never saves activations: inference pays nothing for training, and the fused
backward does not need them.
"""

from __future__ import annotations

import warnings

import torch

from .. import dispatch
from ..backends import torch_ref, unavailable_reason
from ..backends.torch_ref import ACTIVATIONS
from ..core.layout import as_rows
from ..registry import OPS
from . import calls

_aten = torch.ops.aten


def _activation(name: str, z: torch.Tensor) -> torch.Tensor:
    return ACTIVATIONS[name](z)


def _activation_backward(name: str, grad: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    if name == "relu":
        return _aten.threshold_backward(grad, z, 0)
    if name in ("gelu", "gelu_tanh"):
        return _aten.gelu_backward(grad, z, approximate="tanh")
    if name == "gelu_erf":
        return _aten.gelu_backward(grad, z, approximate="none")
    if name == "silu":
        return _aten.silu_backward(grad, z)
    return grad


_kernel_choice: dict = {}


def _fused_kernel(x: torch.Tensor, weights, backend: str):
    """triton_src/fused_mlp_backward.py's launcher when it should run this backward, else None;
    remembered per (backend, GPU, dtype, widths): every training step asks. Off the GPU (the
    Triton interpreter, which tests switch on and off) it is decided each time."""
    if not x.is_cuda:
        return _find_fused_kernel(x, weights, backend)
    key = (backend, x.get_device(), x.dtype, weights[0].shape[1], *(w.shape[0] for w in weights))
    if key not in _kernel_choice:
        _kernel_choice[key] = _find_fused_kernel(x, weights, backend)
    return _kernel_choice[key]


def _find_fused_kernel(x: torch.Tensor, weights, backend: str):
    if backend not in ("triton", "auto") or (backend == "auto" and not x.is_cuda):
        return None
    if unavailable_reason("triton", x.device) is not None:
        return None
    try:
        from ..triton_src import fused_mlp_backward as kernel
    except ImportError:
        return None
    widths = [weights[0].shape[1], *(w.shape[0] for w in weights)]
    if kernel.fused_mlp_backward_unsupported_reason(widths, x.dtype) is not None:
        return None
    return kernel.fused_mlp_backward


def fused_mlp_backward(x, weights, biases, activation, grad, backend: str, need_x_grad: bool):
    """(grad_x or None, [grad_W_i], [grad_b_i or None]) of fused_mlp at (x, weights, biases),
    on dualk's kernels (not differentiable: autograd formulas that must record their backward
    call recorded_backward instead)."""
    name, _ = _resolved(backend)
    x2d, g2d = as_rows(x), as_rows(grad)
    kernel = _fused_kernel(x, weights, name)
    result = None
    if kernel is not None:
        try:
            result = kernel(x2d, weights, biases, activation, g2d, need_x_grad)
        except RuntimeError as exc:  # e.g. no config of the fused kernel compiles here
            if name == "triton":
                raise
            _warn_once(f"the fused Triton backward failed ({exc}); using the layer chain")
    if result is None:
        result = _layer_chain(x2d, weights, biases, activation, g2d, name, need_x_grad)
    grad_x, grad_w, grad_b = result
    if grad_x is not None:
        grad_x = grad_x.reshape(x.shape)
    return grad_x, grad_w, grad_b


def recorded_backward(x, weights, biases, activation, grad, need_x_grad):
    """fused_mlp's backward for an autograd formula running with grad mode on (create_graph=True,
    a double backward to follow): dualk's backward kernels are not differentiable, so their
    gradients would enter the next backward as constants and the second derivatives would be
    silently wrong. PyTorch's own ops on the reference MLP give recorded gradients instead
    (slower; taken only then). Each position gets its own alias, so a tensor passed twice (tied
    layers) gets each position's gradient once, as from any other backward."""
    x_alias = x.view_as(x)
    w_alias = [w.view_as(w) for w in weights]
    b_alias = [None if b is None else b.view_as(b) for b in biases]
    aliases = [x_alias, *w_alias, *(b for b in b_alias if b is not None)]
    needed = [a for a in aliases if a.requires_grad]
    found = torch.autograd.grad(
        torch_ref.fused_mlp(x_alias, w_alias, b_alias, activation), needed, grad,
        create_graph=True, allow_unused=True,
    )  # fmt: skip
    by_alias = {id(a): g for a, g in zip(needed, found)}
    grad_w = [by_alias.get(id(w)) for w in w_alias]
    grad_b = [None if b is None else by_alias.get(id(b)) for b in b_alias]
    return (by_alias.get(id(x_alias)) if need_x_grad else None), grad_w, grad_b


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(f"dualk.fused_mlp backward: {message}", RuntimeWarning, stacklevel=3)


def _resolved(backend: str) -> tuple[str, str]:
    """The backend= value as the forward resolved it before auto (argument, env, scope...)."""
    return dispatch.requested(OPS["fused_mlp"], backend)


def _layer_chain(x2d, weights, biases, activation, g2d, backend, need_x_grad):
    def mm(p, q):
        return calls.matmul(p, q, backend)

    last = len(weights) - 1
    inputs, pre = [x2d], []  # H_i (each layer's input) and Z_i (hidden pre-activations)
    for i, (w, b) in enumerate(zip(weights[:-1], biases[:-1])):
        # One layer of the backend's fused MLP: x W^T + b rounded once, as the forward kernel
        # and F.linear do (a matmul then "+ b" rounds twice in 16-bit, which can flip the sign
        # of a pre-activation near 0 and with it a ReLU mask).
        z = calls.linear(inputs[i], w, b, backend)
        pre.append(z)
        inputs.append(_activation(activation, z))
    grad_w: list = [None] * len(weights)
    grad_b: list = [None] * len(weights)
    dz, grad_x = g2d, None
    for i in range(last, -1, -1):
        grad_w[i] = mm(dz.t(), inputs[i])
        if biases[i] is not None:
            grad_b[i] = dz.sum(0)
        if i > 0:
            dz = _activation_backward(activation, mm(dz, weights[i]), pre[i - 1])
        elif need_x_grad:
            grad_x = mm(dz, weights[0])
    return grad_x, grad_w, grad_b
