"""linear_glu: act(x @ Wg.T + bg) * (x @ Wu.T + bu) in one launch: one k loop that reads each x
tile once and multiplies it by the gate and the up weight tiles into two fp32 accumulators; the
biases, the gate's activation and the product are applied in fp32 before the one down-cast. The
two pre-activations never reach memory (eager PyTorch writes both and reads them back for the
activation and the multiply).

Reuses the GEMM core's pieces (triton_src/matmul.py: accumulate_dot, the fp32 input-precision
rule; triton_src/common.py: apply_activation, grouped_tile, the launcher and the config store).
No split-K and no TMA kernel yet: those are measured on a GPU first (issue 35).
"""

from __future__ import annotations

from dataclasses import astuple, dataclass

import torch
import triton
import triton.language as tl

from dualk.core import alloc as _alloc

from .common import (
    ACT_GELU_ERF,
    ACT_GELU_TANH,
    ACT_RELU,
    ACT_SILU,
    KernelLauncher,
    apply_activation,
    dot_in_fp32,
    grouped_tile,
    int_spec,
    interpreting,
    pow2_bucket,
    ptr_spec,
    tuned_config,
)
from .matmul import FAST_ACT_LEVEL, accumulate_dot, fp32_input_precision


@dataclass(frozen=True)
class GluConfig:
    """One launch configuration (the store keeps it as astuple's list)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    stages: int
    warps: int


# Not measured yet on a GPU (issue 35): the GEMM core's tensor-core shapes with the N tile
# halved where two accumulators would double the registers of matmul's 128x256 tile.
CONFIGS: dict[str, tuple[GluConfig, ...]] = {
    "tensor_core": (
        GluConfig(128, 128, 64, 8, 3, 8),
        GluConfig(128, 64, 64, 8, 4, 4),
        GluConfig(64, 128, 64, 8, 4, 4),
        GluConfig(64, 64, 64, 8, 4, 4),
    ),
    "fp32": (
        GluConfig(64, 64, 32, 8, 3, 4),
        GluConfig(128, 64, 32, 8, 3, 8),
        GluConfig(64, 32, 32, 8, 4, 4),
    ),
}
# Small tiles keep the CPU interpreter fast; 32 still gives masked tails and several tiles.
INTERPRETER_CONFIG = GluConfig(32, 32, 16, 2, 1, 4)

_ACTIVATIONS = {
    ("silu", "tanh"): ACT_SILU,
    ("silu", "none"): ACT_SILU,
    ("relu", "tanh"): ACT_RELU,
    ("relu", "none"): ACT_RELU,
    ("gelu", "tanh"): ACT_GELU_TANH,
    ("gelu", "none"): ACT_GELU_ERF,
}


@triton.jit
def _glu_k_loop(
    x_ptrs, g_ptrs, u_ptrs, row_ok, col_ok, offs_k, K, stride_xk, stride_gk, stride_uk,
    INPUT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
):  # fmt: skip
    """The two fp32 accumulators x[rows] @ Wg[cols].T and x[rows] @ Wu[cols].T, one x tile per k
    step for both."""
    acc_g = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        if EVEN_K:
            a = tl.load(x_ptrs, mask=row_ok, other=0.0)
            bg = tl.load(g_ptrs, mask=col_ok, other=0.0)
            bu = tl.load(u_ptrs, mask=col_ok, other=0.0)
        else:
            k_left = K - k * BLOCK_SIZE_K
            a = tl.load(x_ptrs, mask=row_ok & (offs_k[None, :] < k_left), other=0.0)
            bg = tl.load(g_ptrs, mask=col_ok & (offs_k[:, None] < k_left), other=0.0)
            bu = tl.load(u_ptrs, mask=col_ok & (offs_k[:, None] < k_left), other=0.0)
        if DOT_IN_FP32:
            a = a.to(tl.float32)
            bg = bg.to(tl.float32)
            bu = bu.to(tl.float32)
        acc_g = accumulate_dot(acc_g, a, bg, INPUT_PRECISION)
        acc_u = accumulate_dot(acc_u, a, bu, INPUT_PRECISION)
        x_ptrs += BLOCK_SIZE_K * tl.cast(stride_xk, tl.int64)
        g_ptrs += BLOCK_SIZE_K * tl.cast(stride_gk, tl.int64)
        u_ptrs += BLOCK_SIZE_K * tl.cast(stride_uk, tl.int64)
    return acc_g, acc_u


@triton.jit
def linear_glu_kernel(
    # Pointers: x (M, K), Wg and Wu (N, K) in nn.Linear layout (read as B = W.T), biases (N,)
    # contiguous (any pointer when absent: never read), out (M, N) contiguous.
    x_ptr,
    wg_ptr,
    wu_ptr,
    bg_ptr,
    bu_ptr,
    out_ptr,
    gate_ptr,  # (M, N) contiguous, written when STORE_PRE (the training forward), else unused
    up_ptr,
    # Sizes.
    M,
    N,
    K,
    # Strides in elements.
    stride_xm,
    stride_xk,
    stride_gn,
    stride_gk,
    stride_un,
    stride_uk,
    stride_om,
    # Meta-parameters.
    HAS_BIAS_G: tl.constexpr,
    HAS_BIAS_U: tl.constexpr,
    ACTIVATION: tl.constexpr,  # common.ACT_* id of the gate's activation, in fp32
    FAST_ACT: tl.constexpr,  # cheap exp/division in the activation (fp16/bf16 outputs)
    INPUT_PRECISION: tl.constexpr,  # tl.dot's: "tf32x3", "ieee" or "tf32"
    STORE_PRE: tl.constexpr,  # also store both pre-activations (biases added) for the backward
    DOT_IN_FP32: tl.constexpr,  # interpreter only, see common.dot_in_fp32
    EVEN_K: tl.constexpr,  # K % BLOCK_SIZE_K == 0: the k loop needs no mask
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
):
    pid = tl.program_id(axis=0).to(tl.int64)  # int64: offsets times strides can pass 2^31
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    pid_m, pid_n = grouped_tile(pid, num_pid_m, num_pid_n, GROUP_SIZE_M)

    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    offs_k64 = offs_k.to(tl.int64)
    x_ptrs = x_ptr + (offs_m[:, None] * stride_xm + offs_k64[None, :] * stride_xk)
    g_ptrs = wg_ptr + (offs_k64[:, None] * stride_gk + offs_n[None, :] * stride_gn)
    u_ptrs = wu_ptr + (offs_k64[:, None] * stride_uk + offs_n[None, :] * stride_un)
    row_ok = offs_m[:, None] < M
    col_ok = offs_n[None, :] < N

    acc_g, acc_u = _glu_k_loop(
        x_ptrs, g_ptrs, u_ptrs, row_ok, col_ok, offs_k, K, stride_xk, stride_gk, stride_uk,
        INPUT_PRECISION, DOT_IN_FP32, EVEN_K, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K,
    )  # fmt: skip
    if INPUT_PRECISION == "tf32x3":  # noqa: SIM102 - compile-time branch around a runtime one
        # As matmul.gemm_kernel: a tile with any non-finite sum is summed again with exact fp32
        # FMAs, which give IEEE's inf / NaN (3xTF32's small products can turn inf into NaN).
        finite = (tl.abs(acc_g) <= 3.4028234663852886e38) & (tl.abs(acc_u) <= 3.4028234663852886e38)
        if tl.max(tl.where(finite, 0, 1)) > 0:
            acc_g, acc_u = _glu_k_loop(
                x_ptrs, g_ptrs, u_ptrs, row_ok, col_ok, offs_k, K, stride_xk, stride_gk,
                stride_uk, "ieee", DOT_IN_FP32, EVEN_K, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K,
            )  # fmt: skip

    # Gated epilogue in fp32, then one down-cast.
    n_ok = offs_n < N
    if HAS_BIAS_G:
        acc_g += tl.load(bg_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS_U:
        acc_u += tl.load(bu_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out = apply_activation(acc_g, ACTIVATION, FAST_ACT) * acc_u
    tile = offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptr + tile, out.to(out_ptr.dtype.element_ty), mask=row_ok & col_ok)
    if STORE_PRE:  # the same accumulators: out above is the no-grad kernel's, bit for bit
        tl.store(gate_ptr + tile, acc_g.to(gate_ptr.dtype.element_ty), mask=row_ok & col_ok)
        tl.store(up_ptr + tile, acc_u.to(up_ptr.dtype.element_ty), mask=row_ok & col_ok)


_launcher = KernelLauncher(linear_glu_kernel)
_best_config: dict = {}  # exact launch key -> GluConfig


def _candidates(kind: str, M: int, N: int) -> list[GluConfig]:
    """The kind's configs less tiles wider than the problem (rounded up to a power of two, at
    least 64); at least the smallest."""
    limit_m, limit_n = max(64, pow2_bucket(M)), max(64, pow2_bucket(N))
    configs = CONFIGS[kind]
    out = [c for c in configs if c.block_m <= limit_m and c.block_n <= limit_n]
    return out or [min(configs, key=lambda c: c.block_m * c.block_n)]


def linear_glu(
    x2d: torch.Tensor,
    weight_gate: torch.Tensor,
    weight_up: torch.Tensor,
    bias_gate: torch.Tensor | None,
    bias_up: torch.Tensor | None,
    *,
    activation: str,
    approximate: str,
    allow_tf32: bool,
    store_pre: bool = False,
    out: torch.Tensor | None = None,
):
    """act(x2d @ weight_gate.T + bias_gate) * (x2d @ weight_up.T + bias_up) as a new contiguous
    (M, N) tensor. x2d (M, K), both weights (N, K) (any strides: views of one packed weight
    too), biases (N,) or None; one dtype among fp32/fp16/bf16 (validated by dualk).
    activation: "silu", "gelu" (`approximate` "tanh" or "none") or "relu".
    store_pre (the training forward): (out, gate, up) instead, gate and up the pre-activations
    (biases added) in x2d's dtype, new contiguous (M, N) tensors written by the same launch from
    the same accumulators (out is the store_pre=False answer bit for bit).
    out: a contiguous (M, N) tensor to write the answer into, or None for a new one."""
    act = _ACTIVATIONS[(activation, approximate)]
    M, K = x2d.shape
    N = weight_gate.shape[0]
    dtype, device = x2d.dtype, x2d.device
    if out is None:
        out = _alloc.empty((M, N), dtype, device)  # NaN under DUALK_POISON
    if M == 0 or N == 0:
        return (out, torch.empty_like(out), torch.empty_like(out)) if store_pre else out
    if K == 0:  # both products are zero: act(bias_gate) * bias_up on every row
        from dualk.backends.torch_ref import glu_activation

        zeros = torch.zeros(N, dtype=torch.float32, device=device)
        g = bias_gate.float() if bias_gate is not None else zeros
        u = bias_up.float() if bias_up is not None else zeros
        row = (glu_activation(g, activation, approximate) * u).to(dtype)
        out.copy_(row.expand(M, N))
        if not store_pre:
            return out
        return out, g.to(dtype).expand(M, N).contiguous(), u.to(dtype).expand(M, N).contiguous()

    gate = _alloc.empty((M, N), dtype, device) if store_pre else out
    up = _alloc.empty((M, N), dtype, device) if store_pre else out
    bias_gate = bias_gate.contiguous() if bias_gate is not None else None
    bias_up = bias_up.contiguous() if bias_up is not None else None
    kind = "fp32" if dtype == torch.float32 else "tensor_core"
    if dtype != torch.float32:
        precision = "tf32"  # tl.dot ignores it for 16-bit inputs
    else:
        precision = "tf32" if allow_tf32 else fp32_input_precision(K)
    fast_act = 0 if dtype == torch.float32 else FAST_ACT_LEVEL[0]
    sx, sg, su = x2d.stride(), weight_gate.stride(), weight_up.stride()
    ints = (M, N, K, sx[0], sx[1], sg[0], sg[1], su[0], su[1], N)
    spec = (
        dtype, *(int_spec(v) for v in ints), ptr_spec(x2d), ptr_spec(weight_gate),
        ptr_spec(weight_up), ptr_spec(out), bias_gate is not None, bias_up is not None,
    )  # fmt: skip
    epilogue = (bias_gate is not None, bias_up is not None, act, fast_act, precision)
    head = (*epilogue, store_pre)
    args = (
        x2d, weight_gate, weight_up, bias_gate if bias_gate is not None else out,
        bias_up if bias_up is not None else out, out, gate, up, *ints,
    )  # fmt: skip

    def launch_with(cfg: GluConfig) -> None:
        consts = (*head, dot_in_fp32(dtype), K % cfg.block_k == 0, cfg.block_m, cfg.block_n,
                  cfg.block_k, cfg.group_m)  # fmt: skip
        grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n), 1, 1)
        _launcher.launch((cfg, spec, consts), grid, args + consts, cfg.warps, cfg.stages)

    if interpreting():
        launch_with(INTERPRETER_CONFIG)
        return (out, gate, up) if store_pre else out
    # One config for the inference and the training kernel (store_pre is in neither key): the
    # same tiles sum in the same order, so the training output is the inference one bit for bit.
    key = (device, kind, spec, act, fast_act, precision)
    cfg = _best_config.get(key)
    if cfg is None:
        candidates = _candidates(kind, M, N)
        # The class: M rounded up to a power of two; N, K, epilogue, dtype and layout exact.
        class_key = "|".join(
            str(v) for v in (kind, str(dtype)[6:], pow2_bucket(M), N, K, *epilogue, *spec[4:])
        )
        best, _, keep = tuned_config(
            device, "linear_glu", class_key, [astuple(c) for c in candidates],
            lambda t: launch_with(GluConfig(*t)), {astuple(c) for c in CONFIGS[kind]},
        )  # fmt: skip
        cfg = GluConfig(*best)
        if keep:
            _best_config[key] = cfg
    launch_with(cfg)
    return (out, gate, up) if store_pre else out
