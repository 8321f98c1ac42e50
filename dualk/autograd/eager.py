"""The eager route for calls that autograd must record: one torch.autograd.Function that runs an
operator's implementation and its registered backward formula (dualk/autograd/library.py) directly.

Why not the registered op: torch.library's autograd wrapper (pytree flattening, redispatch, the
aliasing checks, the dynamo-disable wrappers) cost ~0.5 ms per call on CPU and ~1 ms on an H100
host per forward + backward of fused_mlp, several times the GPU time of a whole 2^18-row training
step. The formulas and the implementations are the same functions the registered op uses, so
both routes compute the same gradients; torch.compile and other tracing still go through the
registered op (dualk/ops.py decides).
"""

from __future__ import annotations

import torch

from ..runtime.operators import run_fused_mlp
from . import library, mlp_backward

# Each op: (run(*inputs) -> output, setup_context, backward), inputs in the registered op's order.
_OPS = {
    "add": (library.run_add, library.add_setup, library.add_formula),
    "relu_scale": (library.run_relu_scale, library.relu_scale_setup, library.relu_scale_formula),
    "matmul": (library.run_matmul, library.matmul_setup, library.matmul_formula),
    "linear_gelu": (library.run_linear_gelu, library.linear_gelu_setup, library.linear_gelu_formula),
    "fused_mlp": (library.run_fused_mlp, library.fused_mlp_setup, library.fused_mlp_formula),
    "linear_glu": (library.run_linear_glu, library.linear_glu_setup, library.linear_glu_formula),
}  # fmt: skip


class _OpCtx:
    """The registered op's view of a Function's ctx: saved tensors go to the real ctx, and
    needs_input_grad is in the op's input layout (a list input: any of its tensors)."""

    direct = True  # backward formulas call implementations directly, not registered ops

    def __init__(self, ctx):
        self._ctx = ctx

    def save_for_backward(self, *tensors):
        self._ctx.save_for_backward(*tensors)

    @property
    def saved_tensors(self):
        return self._ctx.saved_tensors


def _flatten(inputs: tuple) -> tuple[tuple, tuple]:
    """(layout, flat): list inputs expanded, layout[i] = its length, or -1 for a single value."""
    layout, flat = [], []
    for value in inputs:
        if isinstance(value, (list, tuple)):
            layout.append(len(value))
            flat.extend(value)
        else:
            layout.append(-1)
            flat.append(value)
    return tuple(layout), tuple(flat)


def _unflatten(layout: tuple, flat) -> list:
    out, i = [], 0
    for n in layout:
        if n < 0:
            out.append(flat[i])
            i += 1
        else:
            out.append(list(flat[i : i + n]))
            i += n
    return out


class _Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name: str, layout: tuple, *flat):
        inputs = _unflatten(layout, flat)
        run, setup, _ = _OPS[name]
        out = run(*inputs)
        op_ctx = _OpCtx(ctx)
        setup(op_ctx, inputs, out)
        ctx.op_ctx, ctx.name, ctx.layout = op_ctx, name, layout
        return out

    @staticmethod
    def backward(ctx, grad):
        op_ctx, layout = ctx.op_ctx, ctx.layout
        needs = _unflatten(layout, ctx.needs_input_grad[2:])
        op_ctx.needs_input_grad = [any(n) if isinstance(n, list) else n for n in needs]
        grads = _OPS[ctx.name][2](op_ctx, grad)
        flat: list = [None, None]
        for n, g in zip(layout, grads):
            if n < 0:
                flat.append(g)
            else:
                flat.extend(g if g is not None else [None] * n)
        return tuple(flat)


def apply(name: str, *inputs):
    """`torch.ops.dualk.<name>(*inputs)` with autograd, on the eager route."""
    layout, flat = _flatten(inputs)
    return _Function.apply(name, layout, *flat)


class _FusedMlpFunction(torch.autograd.Function):
    """fused_mlp's eager route without the generic packing above: the training hot path (one
    call per step of every dualk.nn.FusedMLP). Same implementation and backward as the
    registered op (runtime.operators.run_fused_mlp, mlp_backward.fused_mlp_backward, which
    library.run_fused_mlp / run_fused_mlp_backward wrap)."""

    @staticmethod
    def forward(ctx, x, activation: str, backend: str, layers: int, *params):
        weights, biases = list(params[:layers]), list(params[layers:])
        out = library.owned(run_fused_mlp(x, weights, biases, activation, backend))
        ctx.save_for_backward(x, *params)  # None biases are saved as None
        ctx.activation, ctx.backend, ctx.layers = activation, backend, layers
        return out

    @staticmethod
    def backward(ctx, grad):
        saved = ctx.saved_tensors
        n = ctx.layers
        need_x = ctx.needs_input_grad[0]
        x, weights, biases = saved[0], list(saved[1 : 1 + n]), list(saved[1 + n :])
        if torch.is_grad_enabled():  # create_graph=True: a backward autograd records
            grad_x, grad_w, grad_b = mlp_backward.recorded_backward(
                x, weights, biases, ctx.activation, grad, need_x
            )
        else:
            grad_x, grad_w, grad_b = mlp_backward.fused_mlp_backward(
                x, weights, biases, ctx.activation, grad, ctx.backend, need_x
            )
        # Gradients of the parameters come as views of one buffer: autograd takes them as they
        # are (no copies); one for an input that needs none is dropped by autograd.
        return (grad_x if need_x else None), None, None, None, *grad_w, *grad_b


def fused_mlp(x, weights: list, biases: list, activation: str, backend: str):
    """`dualk.fused_mlp` with autograd on the eager route (biases: one entry per layer, or
    None)."""
    return _FusedMlpFunction.apply(x, activation, backend, len(weights), *weights, *biases)


class _LinearGluFunction(torch.autograd.Function):
    """linear_glu's eager route when autograd records: the registered linear_glu_train op's
    implementation and backward (library.run_linear_glu_train, library.glu_backward) without
    torch.library's wrapper; the pre-activations are saved, not returned."""

    @staticmethod
    def forward(ctx, x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate,
                backend):  # fmt: skip
        out, gate, up = library.run_linear_glu_train(
            x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate, backend
        )
        ctx.save_for_backward(x, weight_gate, weight_up, bias_gate, bias_up, gate, up)
        ctx.activation, ctx.approximate, ctx.backend = activation, approximate, backend
        ctx.direct = True  # glu_backward calls kernels, not registered ops
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight_gate, weight_up, bias_gate, bias_up, gate, up = ctx.saved_tensors
        return library.glu_backward(
            ctx, grad, x, weight_gate, weight_up, bias_gate, bias_up, gate, up
        )


def linear_glu(x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate, backend):
    """`dualk.linear_glu` with autograd on the eager route (the pre-activations kept)."""
    return _LinearGluFunction.apply(
        x, weight_gate, weight_up, bias_gate, bias_up, activation, approximate, backend
    )
