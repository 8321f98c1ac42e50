"""How a call may travel: the switches (tracing, torch.compile, torch.func transforms, grad
mode, autocast) and the two tests built on them that dualk.ops and the backward formulas ask.

The switches are bound once to module-level names: each is one C call on the hot path."""

from __future__ import annotations

import torch
import torch.fx
from torch.nn import Parameter

# torch.autocast: one C call when it is off (the common case); Dynamo traces the per-device
# checks in autocast_dtype itself, so under torch.compile those are asked directly.
any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)
# torch.func transforms (vmap, grad, jacrev, ...) wrap tensors that have no storage for a kernel
# to read, and dualk's autograd.Function does not compose with them: under a transform the ops
# run PyTorch's implementation, which does (0.04 us a call to ask).
transforms_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)
is_compiling = torch.compiler.is_compiling
# Dynamo itself is tracing (torch.compile, or a strict export); False where an export traces
# without it
is_dynamo_compiling = getattr(torch.compiler, "is_dynamo_compiling", is_compiling)
# torch.jit.trace: a direct call's kernel launch would be missing from the trace (its outputs
# frozen as constants), so traced calls take the registered op, which the trace records.
is_tracing = torch._C._is_tracing
_TENSOR_OR_PROXY = (torch.Tensor, torch.fx.Proxy)
# torch.fx.symbolic_trace under way, not torch.compile / export (fx's is_fx_tracing() logs a
# warning on its first call and answers True under export too)
is_fx_tracing = getattr(torch.fx._symbolic_trace, "is_fx_symbolic_tracing", None) or (
    lambda: torch.fx._symbolic_trace._is_fx_tracing_flag and not is_compiling()
)
is_grad_enabled = torch.is_grad_enabled
_is_exporting = getattr(torch.compiler, "is_exporting", lambda: False)
# torch < 2.13 answers is_exporting() True inside torch.compile's Dynamo trace too (seen on
# torch 2.11); there it is not asked (never True).
_EXPORTING_IS_ACCURATE = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 13)
_F64 = torch.float64
# torch's functions and classes that code Dynamo traces reads, bound here: read as `torch.X` in
# several modules, the torch module would be one object under several names, which Dynamo guards
# with Python lambdas on every call of a compiled graph (~1 us each on a CPU-only host).
_Tensor = torch.Tensor
_is_autocast_enabled = torch.is_autocast_enabled
_get_autocast_dtype = torch.get_autocast_dtype


def recorded(*tensors) -> bool:
    """The call needs autograd and may take the eager autograd.Function route (not tracing,
    plain tensors or parameters only): dualk/autograd/eager.py."""
    if is_compiling() or is_tracing():
        return False
    for t in tensors:
        cls = type(t)
        if cls is not torch.Tensor and cls is not Parameter and isinstance(t, torch.Tensor):
            return False
    return is_grad_enabled()


def direct(*tensors) -> bool:
    """True when the call can skip PyTorch's dispatcher: not tracing, every tensor a plain
    torch.Tensor or nn.Parameter (fake tensors and other subclasses go through the custom op),
    and no gradient to record. Non-tensors also take the direct route, whose validation names
    them (the custom op's schema check would not)."""
    if is_compiling() or transforms_active() or is_tracing():
        return False
    grad = is_grad_enabled()
    for t in tensors:
        cls = type(t)
        if cls is not torch.Tensor and cls is not Parameter:
            if isinstance(t, _TENSOR_OR_PROXY):  # (torch.fx.symbolic_trace: the op's node)
                return False
            continue
        if grad and t.requires_grad:
            return False
    return True


def autocast_dtype(t) -> torch.dtype | None:
    """The dtype torch.autocast runs matmul-like ops in on t's device type, or None when autocast
    is off there (or t is no tensor: the checks then name it)."""
    if not isinstance(t, _Tensor):
        return None
    device_type = t.device.type
    # Autocast knows cuda and cpu (dualk's devices); asking it about others (meta) raises.
    if device_type in ("cuda", "cpu") and _is_autocast_enabled(device_type):
        return _get_autocast_dtype(device_type)
    return None


def autocast_cast(dtype: torch.dtype, t):
    """Autocast's cast for matmul-like ops (as for F.linear / torch.mm): floating tensors other
    than float64 to the autocast dtype; differentiable, so gradients reach fp32 parameters."""
    if (
        isinstance(t, torch.Tensor)
        and t.dtype is not dtype
        and t.dtype is not _F64
        and t.is_floating_point()
    ):
        return t.to(dtype)
    return t


def exporting() -> bool:
    """torch.export traces the call (a graph to deploy: dualk.ops keeps inference ops there);
    always False on a torch whose answer would include torch.compile's trace."""
    return _EXPORTING_IS_ACCURATE and _is_exporting()
