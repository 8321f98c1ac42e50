"""dualk's operators as the backward formulas call them: the route dualk.ops would take, from
below it (the formulas never import dualk.ops).

A call runs the runtime directly when nothing must be recorded or traced (the common backward,
grad mode off); under a torch.func transform PyTorch's reference; otherwise the registered op
`torch.ops.dualk.<op>`, which records the call for a double backward (create_graph=True) and is
what torch.compile traces."""

from __future__ import annotations

import torch

from .. import dispatch
from ..registry import OPS
from ..runtime.operators import check_matmul, check_mlp, run_fused_mlp, run_matmul
from ..runtime.route import (
    any_autocast,
    autocast_cast,
    autocast_dtype,
    direct,
    is_compiling,
    transforms_active,
)

_MATMUL, _FUSED_MLP = OPS["matmul"], OPS["fused_mlp"]
_dualk = torch.ops.dualk  # registered by dualk.autograd.library


def matmul(a: torch.Tensor, b: torch.Tensor, backend: str) -> torch.Tensor:
    """`dualk.matmul(a, b, backend=backend)`."""
    if (is_compiling() or any_autocast()) and (dtype := autocast_dtype(a)) is not None:
        a, b = autocast_cast(dtype, a), autocast_cast(dtype, b)
    if not is_compiling() and transforms_active():
        check_matmul(a, b)
        dispatch.check_name(backend, "the backend= argument")
        return _MATMUL.reference(a, b)
    if direct(a, b):
        return run_matmul(a, b, backend)
    return _dualk.matmul(a, b, backend)


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, backend: str
) -> torch.Tensor:
    """`dualk.fused_mlp(x, [weight], [bias], activation="none", backend=backend)`: one layer,
    `x @ weight.T + bias` rounded once."""
    if (is_compiling() or any_autocast()) and (dtype := autocast_dtype(x)) is not None:
        x, weight, bias = (autocast_cast(dtype, t) for t in (x, weight, bias))
    if not is_compiling() and transforms_active():
        check_mlp(x, [weight], [bias], "none")
        dispatch.check_name(backend, "the backend= argument")
        return _FUSED_MLP.reference(x, [weight], [bias], "none")
    if direct(x, weight, bias):
        return run_fused_mlp(x, [weight], [bias], "none", backend)
    present = [] if bias is None else [bias]
    return _dualk.fused_mlp(x, [weight], present, len(present), "none", backend)
