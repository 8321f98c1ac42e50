"""auto's rules for a class that is not timed (under CUDA-graph capture, torch.compile or
torch.jit tracing, with DUALK_AUTOTUNE=0, or for explain before the first call): a backend chosen
without running anything, never recorded as tuned.

The rules, measured on H100 and H200: torch for add/relu_scale (the CUDA kernels match its
bandwidth at large n but cost more host time at small n), matmul (cuBLAS wins most shapes) and
linear_gelu (cuBLASLt wins small M and square shapes; Triton only ties at 8192x768->3072 bf16);
for fused_mlp the CUDA fused kernel when every width is <= 128 and the batch is not empty
(fp32 seed model at B32/B4096, 16-bit 64/128 wide at B=2^20), or when the CUDA planner takes
its wide Hopper kernel (16-bit, widths 129-256: 3.0x eager at 256x3 bf16 on an H100), else torch
(eager beats the mma.sync kernel at 256 wide, 16-bit); linear_glu: CUDA where its planner takes
the Hopper wgmma route with more than 64 rows (session 27, LLaMA shapes at 512 and 8192 rows: 1.07-
1.22x eager on an H100 and an H200; at 16 rows its narrow tile trails eager, Triton wins), else
torch; any other operator: torch.
"""

from __future__ import annotations

import torch

from ..backends import cuda
from ..core.layout import row_count
from ..registry import OpSpec

# The rule for an operator that reaches its default (torch, no condition), by operator.
TORCH_RULES = {
    "matmul": "matmul: cuBLAS (torch) wins most shapes on H100/H200",
    "linear_gelu": "linear_gelu: cuBLASLt (torch) wins small M and square shapes on H100/H200",
    "fused_mlp": "fused_mlp without the CUDA backend: torch",
    "linear_glu": "linear_glu off the CUDA Hopper route or with at most 64 rows: PyTorch's GEMMs "
    "(torch)",
}

GLU_MIN_ROWS = 65  # the Hopper route's tiles are 128 rows; at 16 rows eager beat them (s27)


def _takes_hopper_glu_route(args: tuple) -> bool:
    """Whether the CUDA planner gives this linear_glu call its Hopper wgmma route (16-bit, TMA-
    addressable operands, a 9.0 GPU: its own rule, asked rather than restated here)."""
    x = args[0]
    if not x.is_cuda:  # the extension takes CUDA tensors only
        return False
    try:
        with torch.cuda.device(x.device):
            route = cuda.linear_glu_route(*args[:5])
    except Exception:  # the extension cannot say (a fake tensor, an older build): torch
        return False
    return route is not None and route.startswith("sm90 wgmma")


def _takes_wide_mlp_kernel(args: tuple) -> bool:
    """Whether the CUDA planner gives this fused_mlp call the wide Hopper kernel (16-bit, 129-256
    wide, TMA-addressable operands: its own rule, asked rather than restated here)."""
    x, weights, biases, activation = args
    if not x.is_cuda:  # the extension takes CUDA tensors only
        return False
    try:
        with torch.cuda.device(x.device):
            kernel = cuda.fused_mlp_kernel(x, weights, biases, activation)
    except RuntimeError:  # the extension cannot say: the rule stays with torch
        return False
    return kernel is not None and "wide" in kernel


def backend_for(spec: OpSpec, args: tuple, available: list[str]) -> tuple[str, str]:
    """(backend, rule) without timing, among `available`; see the module docstring."""
    if spec.name == "fused_mlp" and "cuda" in available:
        x, weights = args[0], args[1]
        widths = [x.shape[-1], *(w.shape[0] for w in weights)]
        if max(widths) <= 128 and row_count(x) > 0:
            return "cuda", (
                "fused_mlp with every width <= 128: the CUDA fused kernel (one launch) beats "
                "eager torch on H100/H200"
            )
        if max(widths) <= 256 and row_count(x) > 0 and _takes_wide_mlp_kernel(args):
            return "cuda", (
                "fused_mlp 129-256 wide, 16-bit, on Hopper: the CUDA planner takes the wide "
                "one-launch kernel (3.0x eager at 256x3 bf16, B=2^18, H100)"
            )
        return "torch", (
            "fused_mlp wider than 128 off the wide kernel, or empty: eager torch (beats the "
            "mma.sync kernel at 256 wide, 16-bit)"
        )
    if (
        spec.name == "linear_glu"
        and "cuda" in available
        and row_count(args[0]) >= GLU_MIN_ROWS
        and _takes_hopper_glu_route(args)
    ):
        return "cuda", (
            "linear_glu on the CUDA Hopper route, more than 64 rows: one kernel for both "
            "projections (1.07-1.22x eager at LLaMA's shapes, 512 and 8192 rows, H100 and H200)"
        )
    return "torch", TORCH_RULES.get(
        spec.name,
        f"{spec.name}: torch matches the dualk kernels' bandwidth at large n and costs less host "
        "time at small n",
    )
