"""The PyTorch reference of every operator: the "torch" backend and, on float64 inputs, the
oracle the tests and the benchmark's correctness column compare against."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F


def gelu(h: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """F.gelu; in float64 (the tests' oracle) in forms free of 1 + tanh(u)'s cancellation, whose
    float64 result is 0 for h below about -6 where the true value (-5e-20 at h = -7.8) is still
    a normal fp32/bf16 number that a correct kernel returns."""
    if h.dtype != torch.float64:
        return F.gelu(h, approximate=approximate)
    if approximate == "tanh":  # 0.5 h (1 + tanh u) = h sigmoid(2u)
        inner = math.sqrt(2.0 / math.pi) * (h + 0.044715 * h * h * h)
        stable = h * torch.sigmoid(2.0 * inner)
    else:  # 0.5 h (1 + erf(h / sqrt 2)) = 0.5 h erfc(-h / sqrt 2)
        stable = 0.5 * h * torch.erfc(-h * math.sqrt(0.5))
    return torch.where(h.isinf(), F.gelu(h, approximate=approximate), stable)


ACTIVATIONS = {
    "relu": torch.relu,
    "gelu": lambda h: gelu(h, "tanh"),
    "gelu_tanh": lambda h: gelu(h, "tanh"),
    "gelu_erf": lambda h: gelu(h, "none"),
    "silu": F.silu,
    "none": lambda h: h,
}


# Outputs are contiguous on every backend (ops.py's promise): PyTorch's elementwise ops keep a
# transposed input's layout, so a transposed pair gave a transposed sum here and a contiguous one
# on the CUDA and Triton backends (.view() worked on one backend and failed on the other).
def add(a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    if alpha == 1.0:  # the same sum (1.0 * b is b); the alpha= keyword alone cost ~0.45 us
        return torch.add(a, b).contiguous()
    if abs(alpha) > _F32_MAX and a.dtype is not torch.float64:
        # The kernels use alpha as an fp32 number: beyond fp32's range that is +-inf (PyTorch's
        # add raises instead). float64 inputs (the tests' oracle) keep the exact alpha.
        alpha = torch.tensor(alpha, dtype=torch.float64).float().item()
    if a.dtype in _HALF and abs(alpha) > _HALF[a.dtype]:
        # PyTorch's CPU add refuses an alpha the dtype cannot hold (70000 in fp16); the sum is
        # computed in fp32 as on every other backend, so the answer is the same everywhere.
        return torch.add(a.float(), b.float(), alpha=alpha).to(torch.result_type(a, b)).contiguous()
    return torch.add(a, b, alpha=alpha).contiguous()


_HALF = {t: float(torch.finfo(t).max) for t in (torch.float16, torch.bfloat16)}
_F32_MAX = float(torch.finfo(torch.float32).max)


def relu_scale(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (torch.relu(x) * scale).contiguous()


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a, b)


def linear_gelu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    approximate: str = "tanh",
) -> torch.Tensor:
    return gelu(F.linear(x, weight, bias), approximate)


def linear_gelu_fastest(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    approximate: str = "tanh",
) -> torch.Tensor:
    """The "torch" backend's linear_gelu: PyTorch's fastest path, cuBLASLt's fused bias + GELU
    (tanh) epilogue (torch._addmm_activation) on CUDA where it applies, else F.gelu(F.linear).
    "auto" compares dualk's kernels with this, so it is never slower than what a user had.
    16-bit only: the epilogue's GELU is an approximation whose error (5e-6 on O(1) outputs,
    H100) is 10x PyTorch's own in fp32 but far below one bf16/fp16 rounding."""
    if (
        x.dtype in (torch.float16, torch.bfloat16)
        and bias is not None
        and approximate == "tanh"
        and x.is_cuda
        and x.numel() > 0
        and weight.numel() > 0
    ):
        if x.dim() == 2:  # no reshapes (a dispatcher call each) on the launch-bound path
            return torch._addmm_activation(bias, x, weight.t(), use_gelu=True)
        x2d = x.reshape(-1, x.shape[-1])
        out = torch._addmm_activation(bias, x2d, weight.t(), use_gelu=True)
        return out.reshape(*x.shape[:-1], weight.shape[0])
    return linear_gelu(x, weight, bias, approximate)


def fused_mlp(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None],
    activation: str = "relu",
) -> torch.Tensor:
    act = ACTIVATIONS[activation]
    h = x
    last = len(weights) - 1
    for i, (w, b) in enumerate(zip(weights, biases)):
        h = F.linear(h, w, b)
        if i != last:
            h = act(h)
    return h


GLU_ACTIVATIONS = ("silu", "gelu", "relu")


def glu_activation(h: torch.Tensor, activation: str, approximate: str = "tanh") -> torch.Tensor:
    """linear_glu's gate activation ("silu", "gelu" with `approximate`, "relu"); float64-safe."""
    if activation == "gelu":
        return gelu(h, approximate)
    return F.silu(h) if activation == "silu" else torch.relu(h)


def split_glu_parameters(weight_gate, weight_up, bias_gate, bias_up) -> tuple:
    """(weight_gate, weight_up, bias_gate, bias_up) as separate tensors: a packed `weight_gate`
    ([gate; up], 2N x K, `weight_up` None) and its packed `bias_gate` (2N,) split into views."""
    if weight_up is not None:
        return weight_gate, weight_up, bias_gate, bias_up
    n = weight_gate.shape[0] // 2
    if bias_gate is not None:
        bias_gate, bias_up = bias_gate[:n], bias_gate[n:]
    return weight_gate[:n], weight_gate[n:], bias_gate, bias_up


def linear_glu(
    x: torch.Tensor,
    weight_gate: torch.Tensor,
    weight_up: torch.Tensor | None = None,
    bias_gate: torch.Tensor | None = None,
    bias_up: torch.Tensor | None = None,
    activation: str = "silu",
    approximate: str = "tanh",
) -> torch.Tensor:
    """act(x @ weight_gate.T + bias_gate) * (x @ weight_up.T + bias_up) (packed weights split
    first, see split_glu_parameters)."""
    wg, wu, bg, bu = split_glu_parameters(weight_gate, weight_up, bias_gate, bias_up)
    return glu_activation(F.linear(x, wg, bg), activation, approximate) * F.linear(x, wu, bu)


def linear_glu_train(
    x: torch.Tensor,
    weight_gate: torch.Tensor,
    weight_up: torch.Tensor | None = None,
    bias_gate: torch.Tensor | None = None,
    bias_up: torch.Tensor | None = None,
    activation: str = "silu",
    approximate: str = "tanh",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """linear_glu's training forward: (out, gate, up), gate and up the pre-activations
    (..., N) that the backward reads instead of recomputing two GEMMs; out is linear_glu's
    answer bit for bit (the same operations)."""
    wg, wu, bg, bu = split_glu_parameters(weight_gate, weight_up, bias_gate, bias_up)
    gate, up = F.linear(x, wg, bg), F.linear(x, wu, bu)
    return glu_activation(gate, activation, approximate) * up, gate, up
