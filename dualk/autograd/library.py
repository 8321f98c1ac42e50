"""dualk's operators as `torch.library` custom ops (`torch.ops.dualk.<op>`), with fake (shape-only)
implementations for torch.compile / export and autograd formulas.

Also `fused_mlp_infer`, `linear_gelu_infer` and `linear_glu_infer`, the ops compiled inference
graphs call for those operators (defined without custom_op's per-call wrappers, no autograd;
below, with their kernels).

Schemas: every op takes its tensors, its options and `backend: str` last. The implementation of
each op is `run_<op>` of dualk/runtime/operators.py: it validates, resolves the backend (argument, environment,
scope, config, autotuning) and runs the kernel, when the op *runs*, so a traced graph holds only
`dualk::<op>(..., backend)` and never the dispatcher's lookups. Outputs are always fresh and
contiguous (the fake implementations promise exactly that).

Backward formulas run on dualk's own operators with the forward's `backend=` value, so a
backend named for the forward also computes its gradients: matmul and linear_gelu use
`dualk.matmul` (through dualk/autograd/calls.py); fused_mlp has a fused Triton backward (triton_src/fused_mlp_backward.py) where
its kernel fits, else recomputes the layers and walks them back with `dualk.matmul`;
linear_glu's training forward (`dualk::linear_glu_train`) keeps both pre-activations, so its
backward runs the gradient GEMMs (`dualk.matmul`) and one fused elementwise pass only. The
elementwise derivatives (sums over broadcast dims, masks, GELU/SiLU derivatives) are PyTorch's
own ATen backward functions, so they round exactly as PyTorch's autograd does.
"""

# No `from __future__ import annotations` here: torch.library infers each op's schema from the
# annotations, which must be real types (Optional[...] rather than "X | None" strings).
from typing import Optional

import torch

from ..backends import cuda as cuda_backend
from ..backends import triton as triton_backend
from ..backends import unavailable_reason
from ..backends.torch_ref import glu_activation, split_glu_parameters
from ..core.layout import as_rows
from ..runtime import operators
from . import calls
from .mlp_backward import fused_mlp_backward as _mlp_backward_run
from .mlp_backward import recorded_backward

LIB = "dualk"
_aten = torch.ops.aten


def fresh(out: torch.Tensor) -> torch.Tensor:
    return out if out.is_contiguous() else out.contiguous()


def owned(out: torch.Tensor) -> torch.Tensor:
    """An op's output as the user gets it: contiguous and not a view, which an autograd Function
    cannot return for in-place use (`y.add_(1)` raises). dualk's kernels make such tensors; the
    torch backend's F.linear (a (..., k) input with a bias) and the per-layer MLP chain end in a
    reshape, a view of all of a fresh tensor: re-labelled without a copy (aten._unsafe_view, as
    torch.matmul returns its own). A view of part of a tensor (which would pin, and share, the
    rest) or a strided one is copied."""
    base = out._base
    if base is None:
        return out if out.is_contiguous() else out.contiguous()
    if out.is_contiguous() and out.numel() == base.numel() and base.is_contiguous():
        return _unsafe_view(out, out.shape)
    return out.clone(memory_format=torch.contiguous_format)


_unsafe_view = torch.ops.aten._unsafe_view


# ---------------------------------------------------------------------------------------- add
def run_add(a, b, alpha, backend):
    return owned(operators.run_add(a, b, alpha, backend))


@torch.library.custom_op(f"{LIB}::add", mutates_args=())
def add(a: torch.Tensor, b: torch.Tensor, alpha: float, backend: str) -> torch.Tensor:
    return run_add(a, b, alpha, backend)


@add.register_fake
def _(a, b, alpha, backend):
    operators.check_add(a, b, alpha)
    return a.new_empty(torch.broadcast_shapes(a.shape, b.shape))


def _sum_to(grad: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    return grad if grad.shape == shape else grad.sum_to_size(shape)


def add_setup(ctx, inputs, output):
    a, b, alpha, _ = inputs
    ctx.shapes, ctx.alpha = (a.shape, b.shape), alpha


def add_formula(ctx, grad):
    shape_a, shape_b = ctx.shapes
    grad_a = _sum_to(grad, shape_a) if ctx.needs_input_grad[0] else None
    grad_b = None
    if ctx.needs_input_grad[1]:
        grad_b = _sum_to(grad * ctx.alpha if ctx.alpha != 1.0 else grad, shape_b)
    return grad_a, grad_b, None, None


add.register_autograd(add_formula, setup_context=add_setup)


# ---------------------------------------------------------------------------------- relu_scale
def run_relu_scale(x, scale, backend):
    return owned(operators.run_relu_scale(x, scale, backend))


@torch.library.custom_op(f"{LIB}::relu_scale", mutates_args=())
def relu_scale(x: torch.Tensor, scale: float, backend: str) -> torch.Tensor:
    return run_relu_scale(x, scale, backend)


@relu_scale.register_fake
def _(x, scale, backend):
    operators.check_relu_scale(x, scale)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def relu_scale_setup(ctx, inputs, output):
    x, scale, _ = inputs
    ctx.save_for_backward(x)
    ctx.scale = scale


def relu_scale_formula(ctx, grad):
    (x,) = ctx.saved_tensors
    # As autograd of relu(x) * scale: (grad * scale) where x > 0, else 0 (NaN x gives 0).
    return _aten.threshold_backward(grad * ctx.scale, x, 0), None, None


relu_scale.register_autograd(relu_scale_formula, setup_context=relu_scale_setup)


# -------------------------------------------------------------------------------------- matmul
def run_matmul(a, b, backend):
    return owned(operators.run_matmul(a, b, backend))


@torch.library.custom_op(f"{LIB}::matmul", mutates_args=())
def matmul(a: torch.Tensor, b: torch.Tensor, backend: str) -> torch.Tensor:
    return run_matmul(a, b, backend)


@matmul.register_fake
def _(a, b, backend):
    operators.check_matmul(a, b)
    batch = a.shape[:1] if a.dim() == 3 else b.shape[:1] if b.dim() == 3 else ()
    return a.new_empty((*batch, a.shape[-2], b.shape[-1]))


def matmul_setup(ctx, inputs, output):
    a, b, backend = inputs
    ctx.save_for_backward(a, b)
    ctx.backend = backend


def matmul_formula(ctx, grad):
    a, b = ctx.saved_tensors
    mm = _matmul_with(ctx.backend)
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_a = mm(grad, b.mT)
        if a.dim() == 2 and grad_a.dim() == 3:  # a was broadcast over b's batch
            grad_a = grad_a.sum(0)
    if ctx.needs_input_grad[1]:
        if b.dim() == 2 and a.dim() == 3:  # b was broadcast: one GEMM over the folded batch
            k, n = b.shape
            grad_b = mm(a.reshape(-1, k).mT, grad.reshape(-1, n))
        else:
            grad_b = mm(a.mT, grad)
    return grad_a, grad_b, None


def _matmul_with(backend: str):
    return lambda p, q: calls.matmul(p, q, backend)


matmul.register_autograd(matmul_formula, setup_context=matmul_setup)


# --------------------------------------------------------------------------------- linear_gelu
def run_linear_gelu(x, weight, bias, approximate, backend):
    return owned(operators.run_linear_gelu(x, weight, bias, approximate, backend))


@torch.library.custom_op(f"{LIB}::linear_gelu", mutates_args=())
def linear_gelu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],  # noqa: UP045 (schema inference on torch 2.11)
    approximate: str,
    backend: str,
) -> torch.Tensor:
    return run_linear_gelu(x, weight, bias, approximate, backend)


@linear_gelu.register_fake
def _(x, weight, bias, approximate, backend):
    operators.check_linear("linear_gelu", x, weight, bias)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def linear_gelu_setup(ctx, inputs, output):
    x, weight, bias, approximate, backend = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.approximate, ctx.backend = approximate, backend


def linear_gelu_formula(ctx, grad):
    x, weight, bias = ctx.saved_tensors
    mm = _matmul_with(ctx.backend)
    x2d = as_rows(x)
    # Recompute the pre-activation (one GEMM) rather than keep it: the forward is one fused
    # kernel that never writes it, and inference calls must not pay for training.
    z = mm(x2d, weight.t())
    if bias is not None:
        z = z + bias
    dz = _aten.gelu_backward(as_rows(grad), z, approximate=ctx.approximate)
    grad_x = mm(dz, weight).reshape(x.shape) if ctx.needs_input_grad[0] else None
    grad_w = mm(dz.t(), x2d) if ctx.needs_input_grad[1] else None
    grad_b = dz.sum(0) if bias is not None and ctx.needs_input_grad[2] else None
    return grad_x, grad_w, grad_b, None, None


linear_gelu.register_autograd(linear_gelu_formula, setup_context=linear_gelu_setup)


# ----------------------------------------------------------------------------------- fused_mlp
# Biases travel as the present ones plus a bit mask of their layers (bit i: layer i has one):
# autograd of a custom op sees Tensor?[] as one opaque argument and could not return bias
# gradients through it.
def pack_biases(biases) -> tuple[list[torch.Tensor], int]:
    present = [b for b in biases if b is not None]
    return present, sum(1 << i for i, b in enumerate(biases) if b is not None)


def _bias_layers(layers: int, bias_mask: int) -> list[int]:
    return [i for i in range(layers) if (bias_mask >> i) & 1]


def _unpack_biases(layers: int, biases, bias_mask: int) -> list:
    full: list = [None] * layers
    for i, b in zip(_bias_layers(layers, bias_mask), biases):
        full[i] = b
    return full


def run_fused_mlp(x, weights, biases, bias_mask, activation, backend):
    full = _unpack_biases(len(weights), biases, bias_mask)
    return owned(operators.run_fused_mlp(x, list(weights), full, activation, backend))


@torch.library.custom_op(f"{LIB}::fused_mlp", mutates_args=())
def fused_mlp(
    x: torch.Tensor,
    weights: list[torch.Tensor],
    biases: list[torch.Tensor],
    bias_mask: int,
    activation: str,
    backend: str,
) -> torch.Tensor:
    return run_fused_mlp(x, weights, biases, bias_mask, activation, backend)


@fused_mlp.register_fake
def _(x, weights, biases, bias_mask, activation, backend):
    weights, full = operators.mlp_lists(weights, _unpack_biases(len(weights), biases, bias_mask))
    operators.check_mlp(x, weights, full, activation)
    return x.new_empty((*x.shape[:-1], weights[-1].shape[0]))


def fused_mlp_setup(ctx, inputs, output):
    x, weights, biases, bias_mask, activation, backend = inputs
    ctx.layers, ctx.bias_mask = len(weights), bias_mask
    ctx.save_for_backward(x, *weights, *biases)
    ctx.activation, ctx.backend = activation, backend


def fused_mlp_formula(ctx, grad):
    saved = ctx.saved_tensors
    n = ctx.layers
    x, weights, biases = saved[0], list(saved[1 : 1 + n]), list(saved[1 + n :])
    # The eager route (dualk/autograd/eager.py) calls the implementation itself; traced
    # backwards need the registered op.
    args = (x, weights, biases, ctx.bias_mask, ctx.activation, grad, ctx.backend,
            ctx.needs_input_grad[0])  # fmt: skip
    if torch.is_grad_enabled():  # create_graph=True: a backward autograd records
        full = _unpack_biases(n, biases, ctx.bias_mask)
        grad_x, grad_w, grad_full = recorded_backward(
            x, weights, full, ctx.activation, grad, ctx.needs_input_grad[0]
        )
        grad_b = [grad_full[i] for i in _bias_layers(n, ctx.bias_mask)]
    elif getattr(ctx, "direct", False):
        # Autograd takes the gradients as they come: views of one buffer need no copies.
        grad_x, grad_w, grad_b = run_fused_mlp_backward(*args, own_outputs=False)
    else:
        grad_x, grad_w, grad_b = fused_mlp_backward(*args)
    return (grad_x if ctx.needs_input_grad[0] else None), grad_w, grad_b, None, None, None


# The backward is an op of its own, so that the choice between the fused Triton backward and
# the layer chain is made when it runs (never while AOT autograd traces the backward graph) and
# so that traced backward graphs see fake tensors only.
def run_fused_mlp_backward(
    x, weights, biases, bias_mask, activation, grad, backend, need_x_grad, own_outputs=True
):
    """(grad_x (empty when not needed), grad of each weight, grad of each present bias).
    own_outputs: copy gradients that are views (of the fused kernel's one output buffer) into
    tensors of their own, as a registered op's outputs must be."""
    n = len(weights)
    full = _unpack_biases(n, biases, bias_mask)
    grad_x, grad_w, grad_b = _mlp_backward_run(
        x, list(weights), full, activation, grad, backend, need_x_grad
    )
    if grad_x is None:
        grad_x = x.new_empty((0,))
    grad_b = [grad_b[i] for i in _bias_layers(n, bias_mask)]
    grad_x = fresh(grad_x)
    if own_outputs:  # an op's outputs may alias neither its inputs nor one another
        taken = {t.untyped_storage().data_ptr() for t in (x, *weights, *biases, grad, grad_x)}
        grad_w = [_own(g, taken) for g in grad_w]
        grad_b = [_own(g, taken) for g in grad_b]
    return grad_x, grad_w, grad_b


@torch.library.custom_op(f"{LIB}::fused_mlp_backward", mutates_args=())
def fused_mlp_backward(
    x: torch.Tensor,
    weights: list[torch.Tensor],
    biases: list[torch.Tensor],
    bias_mask: int,
    activation: str,
    grad: torch.Tensor,
    backend: str,
    need_x_grad: bool,
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """(grad_x (empty when not needed), grad of each weight, grad of each present bias)."""
    return run_fused_mlp_backward(
        x, weights, biases, bias_mask, activation, grad, backend, need_x_grad
    )


def _own(t: torch.Tensor, taken: set[int]) -> torch.Tensor:
    """t, or a copy where its storage is taken or larger than t (views of the fused kernel's one
    output buffer: the first kept as a view would pin the whole buffer). By storage, not t._base:
    views made under a TorchDispatchMode (opcheck's SchemaCheckMode) have no _base."""
    storage = t.untyped_storage()
    shared = storage.data_ptr() in taken or storage.nbytes() != t.numel() * t.element_size()
    t = t.clone() if shared else fresh(t)
    taken.add(t.untyped_storage().data_ptr())
    return t


@fused_mlp_backward.register_fake
def _(x, weights, biases, bias_mask, activation, grad, backend, need_x_grad):
    grad_x = x.new_empty(x.shape) if need_x_grad else x.new_empty((0,))
    return grad_x, [w.new_empty(w.shape) for w in weights], [b.new_empty(b.shape) for b in biases]


fused_mlp.register_autograd(fused_mlp_formula, setup_context=fused_mlp_setup)


# The op compiled inference graphs call (dualk.ops.fused_mlp emits it where Dynamo traces a call
# that needs no gradient; exports keep fused_mlp above). Defined with torch.library.Library, not
# custom_op: no Python autograd and backend wrappers run per call (on a 2-core CPU-only host, per
# call above the kernel's own work: custom_op's wrappers ~43 us, a Library op's Python kernel
# ~7 us, a C++ kernel ~3 us; every call of a compiled graph pays them). Its kernels: the mlp extension's C++ CUDA kernel (cuda_src/binding_mlp.cpp: a
# planned call straight from the dispatcher, else run_fused_mlp_full below), registered when
# the extension loads; and, for every other device and before the extension loads, the Python
# kernel run_fused_mlp_infer (CompositeExplicitAutograd). Biases as Tensor?[]: without autograd
# there is nothing to return their gradients through.
_LIBRARY = torch.library.Library(LIB, "FRAGMENT")  # kept for the process
_LIBRARY.define(
    "fused_mlp_infer(Tensor x, Tensor[] weights, Tensor?[] biases, str activation, str backend) "
    "-> Tensor"
)


def run_fused_mlp_full(x, weights, biases, activation, backend):
    """fused_mlp_infer's full route (validate, resolve the backend, run; plans the class where
    the fused CUDA kernel ran): what its C++ kernel falls back to."""
    return fresh(operators.run_fused_mlp(x, list(weights), list(biases), activation, backend, True))


def run_fused_mlp_infer(x, weights, biases, activation, backend):
    out = operators.run_planned_mlp(x, weights, biases, activation, backend)
    return out if out is not None else run_fused_mlp_full(x, weights, biases, activation, backend)


_LIBRARY.impl("fused_mlp_infer", run_fused_mlp_infer, "CompositeExplicitAutograd")


@torch.library.register_fake(f"{LIB}::fused_mlp_infer", lib=_LIBRARY)
def _(x, weights, biases, activation, backend):
    weights, biases = list(weights), list(biases)
    operators.check_mlp(x, weights, biases, activation)
    return x.new_empty((*x.shape[:-1], weights[-1].shape[0]))


cuda_backend.set_mlp_op_hooks(operators.planned_usable, run_fused_mlp_full)


# ---------------------------------------------------------------------------------- linear_glu
def run_linear_glu(x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate, backend):
    return owned(
        operators.run_linear_glu(
            x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate, backend
        )
    )


@torch.library.custom_op(f"{LIB}::linear_glu", mutates_args=())
def linear_glu(
    x: torch.Tensor,
    weight_gate: torch.Tensor,
    weight_up: Optional[torch.Tensor],  # noqa: UP045 (schema inference on torch 2.11)
    bias_gate: Optional[torch.Tensor],  # noqa: UP045
    bias_up: Optional[torch.Tensor],  # noqa: UP045
    activation: str,
    approximate: str,
    backend: str,
) -> torch.Tensor:
    return run_linear_glu(
        x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate, backend
    )


@linear_glu.register_fake
def _(x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate, backend):
    _, _, _, n = operators.check_linear_glu(
        x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate
    )
    return x.new_empty((*x.shape[:-1], n))


def linear_glu_setup(ctx, inputs, output):
    x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate, backend = inputs
    ctx.save_for_backward(x, weight_gate, weight_up, bias_gate, bias_up)
    ctx.activation, ctx.approximate, ctx.backend = activation, approximate, backend


def _glu_act_backward(grad, pre, activation: str, approximate: str):
    """grad * act'(pre), by PyTorch's own backward functions (its rounding)."""
    if activation == "silu":
        return _aten.silu_backward(grad, pre)
    if activation == "gelu":
        return _aten.gelu_backward(grad, pre, approximate=approximate)
    return _aten.threshold_backward(grad, pre, 0)


def linear_glu_formula(ctx, grad):
    """The plain op's backward (torch.ops.dualk.linear_glu called directly with inputs that need
    gradients; dualk.linear_glu itself records linear_glu_train, which keeps the pre-activations):
    the pre-activations come from the training forward's implementation run again, so the
    gradients are those of the training route bit for bit."""
    x, weight_gate, weight_up, bias_gate, bias_up = ctx.saved_tensors
    gate = up = None
    if not torch.is_grad_enabled():  # else glu_backward recomputes them differentiably
        args = (x, weight_gate, weight_up, bias_gate, bias_up, ctx.activation, ctx.approximate,
                ctx.backend)  # fmt: skip
        if getattr(ctx, "direct", False):  # the eager route: the implementation itself
            _, gate, up = operators.run_linear_glu_train(*args)
        else:  # a traced backward graph sees fake tensors: the registered op
            _, gate, up = torch.ops.dualk.linear_glu_train(*args)
    return glu_backward(ctx, grad, x, weight_gate, weight_up, bias_gate, bias_up, gate, up)


def glu_backward(ctx, grad, x, weight_gate, weight_up, bias_gate, bias_up, gate, up):
    """linear_glu's gradients (x, weight_gate, weight_up, bias_gate, bias_up, then None for the
    options) from the forward's pre-activations `gate` and `up` ((..., N), x's dtype): the
    elementwise part (one pass writing [d_gate | d_up]) and the four gradient GEMMs (two with
    packed weights). gate / up None, or a backward that autograd
    records (create_graph=True): they are recomputed with dualk.matmul, differentiably.
    ctx: needs_input_grad, activation, approximate, backend."""
    packed = weight_up is None
    wg, wu, bg, bu = split_glu_parameters(weight_gate, weight_up, bias_gate, bias_up)
    mm = _matmul_with(ctx.backend)
    x2d = as_rows(x)
    g = as_rows(grad)
    if gate is None or torch.is_grad_enabled():
        pre_g = mm(x2d, wg.t())
        pre_u = mm(x2d, wu.t())
        if bg is not None:
            pre_g = pre_g + bg
        if bu is not None:
            pre_u = pre_u + bu
    else:
        pre_g, pre_u = as_rows(gate), as_rows(up)
    d_pre = None  # [d_gate | d_up] (M, 2N) from the fused elementwise pass
    if not torch.is_grad_enabled() and _fused_glu_grads(ctx.backend, pre_g):
        args = (g, pre_g, pre_u, ctx.activation, ctx.approximate)
        if getattr(ctx, "direct", False):  # the eager route: the kernel itself
            d_pre = triton_backend.linear_glu_grad_pre(*args)
        else:  # a traced backward graph needs the registered op
            d_pre = torch.ops.dualk.linear_glu_grad_pre(*args)
        n = pre_g.shape[1]
        d_gate, d_up = d_pre[:, :n], d_pre[:, n:]
    else:
        d_gate, d_up = glu_elementwise_backward(g, pre_g, pre_u, ctx.activation, ctx.approximate)
    # Packed weights with a packed d_pre: one GEMM each for dX and d[Wg; Wu].
    one_gemm = packed and d_pre is not None
    need = ctx.needs_input_grad
    grad_x = None
    if need[0]:
        if one_gemm:
            grad_x = mm(d_pre, weight_gate).reshape(x.shape)
        else:
            grad_x = mm(d_gate, wg)
            grad_x = (grad_x + mm(d_up, wu)).reshape(x.shape)
    grad_wg = grad_wu = grad_bg = grad_bu = None
    if one_gemm and need[1]:
        grad_wg = mm(d_pre.t(), x2d)
    elif need[1] or (not packed and need[2]):
        dwg = mm(d_gate.t(), x2d) if need[1] or packed else None
        dwu = mm(d_up.t(), x2d) if packed or need[2] else None
        if packed:
            grad_wg = torch.cat((dwg, dwu))
        else:
            grad_wg, grad_wu = (dwg if need[1] else None), (dwu if need[2] else None)
    if bias_gate is not None and need[3]:
        if one_gemm:
            grad_bg = d_pre.sum(0)
        else:
            dbg = d_gate.sum(0)
            grad_bg = torch.cat((dbg, d_up.sum(0))) if packed else dbg
    if bias_up is not None and need[4]:
        grad_bu = d_up.sum(0)
    return grad_x, grad_wg, grad_wu, grad_bg, grad_bu, None, None, None


def glu_elementwise_backward(grad, gate, up, activation: str, approximate: str):
    """(d_gate, d_up) = (grad * up * act'(gate), grad * act(gate)) for 2-dim (M, N) tensors."""
    d_up = grad * glu_activation(gate, activation, approximate)
    if activation == "silu" and torch.is_grad_enabled():
        # A backward that autograd records (create_graph=True): aten.silu_backward has no
        # derivative, so silu' = s (1 + x (1 - s)) by differentiable ops.
        s = torch.sigmoid(gate)
        return grad * up * (s * (1 + gate * (1 - s))), d_up
    return _glu_act_backward(grad * up, gate, activation, approximate), d_up


def _fused_glu_grads(backend: str, t: torch.Tensor) -> bool:
    """Whether the backward's elementwise part runs as Triton's one fused pass (backend "triton";
    "auto" and "cuda" on a GPU where Triton runs) rather than PyTorch's ops (backend "torch",
    CPU tensors off backend "triton", no Triton)."""
    if backend == "torch":
        return False
    if backend == "triton":
        return True
    return t.is_cuda and unavailable_reason("triton", t.device) is None


@torch.library.custom_op(f"{LIB}::linear_glu_grad_pre", mutates_args=())
def linear_glu_grad_pre(
    grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str, approximate: str
) -> torch.Tensor:
    """linear_glu's backward, elementwise part, on Triton: [d_gate | d_up] (M, 2N) from the
    upstream gradient and the pre-activations, all (M, N) (what traced backward graphs call)."""
    return triton_backend.linear_glu_grad_pre(grad, gate, up, activation, approximate)


@linear_glu_grad_pre.register_fake
def _(grad, gate, up, activation, approximate):
    return gate.new_empty((gate.shape[0], 2 * gate.shape[1]))


linear_glu.register_autograd(linear_glu_formula, setup_context=linear_glu_setup)


# --------------------------------------------------------------------------- linear_glu_train
# linear_glu's training forward: the output and both pre-activations, which the backward reads
# (as eager PyTorch's autograd keeps them) instead of recomputing the two forward GEMMs.
# dualk.linear_glu records this op (or its eager twin, dualk/autograd/eager.py) whenever an
# input needs a gradient; the plain op stays the inference path (one fused kernel, nothing kept).
def run_linear_glu_train(
    x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate, backend
):
    out, gate, up = operators.run_linear_glu_train(
        x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate, backend
    )
    return owned(out), fresh(gate), fresh(up)


@torch.library.custom_op(f"{LIB}::linear_glu_train", mutates_args=())
def linear_glu_train(
    x: torch.Tensor,
    weight_gate: torch.Tensor,
    weight_up: Optional[torch.Tensor],  # noqa: UP045 (schema inference on torch 2.11)
    bias_gate: Optional[torch.Tensor],  # noqa: UP045
    bias_up: Optional[torch.Tensor],  # noqa: UP045
    activation: str,
    approximate: str,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, gate, up): linear_glu's output and its pre-activations x @ Wg.T + bg, x @ Wu.T + bu
    (each (..., N), x's dtype)."""
    return run_linear_glu_train(
        x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate, backend
    )


@linear_glu_train.register_fake
def _(x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate, backend):
    _, _, _, n = operators.check_linear_glu(
        x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate
    )
    shape = (*x.shape[:-1], n)
    return x.new_empty(shape), x.new_empty(shape), x.new_empty(shape)


def linear_glu_train_setup(ctx, inputs, output):
    x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate, backend = inputs
    _, gate, up = output
    ctx.save_for_backward(x, weight_gate, weight_up, bias_gate, bias_up, gate, up)
    ctx.activation, ctx.approximate, ctx.backend = activation, approximate, backend
    ctx.mark_non_differentiable(gate, up)  # saved for the backward, not results of the call


def linear_glu_train_formula(ctx, grad, grad_gate=None, grad_up=None):
    """grad_gate / grad_up: None or zeros (gate and up are not differentiable outputs)."""
    x, weight_gate, weight_up, bias_gate, bias_up, gate, up = ctx.saved_tensors
    return glu_backward(ctx, grad, x, weight_gate, weight_up, bias_gate, bias_up, gate, up)


linear_glu_train.register_autograd(linear_glu_train_formula, setup_context=linear_glu_train_setup)


# ------------------------------------------- linear_gelu_infer, linear_glu_infer (compiled inference)
# The ops compiled inference graphs call for linear_gelu and linear_glu, as fused_mlp_infer: Library
# ops whose kernel is the operator's own route (CompositeExplicitAutograd), without custom_op's
# autograd and backend wrappers on every call of the graph. The zoo's compiled LLaMA with dualk's
# linear_glu in its graph cost 0.67 ms more host time per forward (four calls, H200, session 37).
_LIBRARY.define(
    "linear_gelu_infer(Tensor x, Tensor weight, Tensor? bias, str approximate, str backend) "
    "-> Tensor"
)
_LIBRARY.define(
    "linear_glu_infer(Tensor x, Tensor weight_gate, Tensor? weight_up, Tensor? bias_gate, "
    "Tensor? bias_up, str activation, str approximate, str backend) -> Tensor"
)
_LIBRARY.impl("linear_gelu_infer", run_linear_gelu, "CompositeExplicitAutograd")
_LIBRARY.impl("linear_glu_infer", run_linear_glu, "CompositeExplicitAutograd")


@torch.library.register_fake(f"{LIB}::linear_gelu_infer", lib=_LIBRARY)
def _(x, weight, bias, approximate, backend):
    operators.check_linear("linear_gelu", x, weight, bias)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.register_fake(f"{LIB}::linear_glu_infer", lib=_LIBRARY)
def _(x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate, backend):
    _, _, _, n = operators.check_linear_glu(
        x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate
    )
    return x.new_empty((*x.shape[:-1], n))
