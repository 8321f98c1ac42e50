"""triton_src/fused_mlp_backward.py: gradients of a Linear/activation stack in one persistent
kernel, against torch autograd of the same MLP in float64.

The rule is the one dualk uses for matrix ops: for every gradient, max |ours - float64| must stay
within 2x PyTorch's own max error in the same dtype (torch autograd of the same model), plus one
ulp of the largest reference value (four in fp32). Outputs and the workspace are poisoned (NaN)
before launch. On the CPU the kernel runs under TRITON_INTERPRET with BLOCK_M=16 and 4 programs,
so batches of 37 and 130 rows give partial tiles and several tiles per program.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE, HAS_CUDA

from dualk.backends import unavailable_reason

pytestmark = pytest.mark.skipif(
    unavailable_reason("triton", DEVICE) is not None,
    reason=str(unavailable_reason("triton", DEVICE)),
)

ACTS = {
    "relu": F.relu,
    "gelu": lambda t: F.gelu(t, approximate="tanh"),
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "gelu_erf": F.gelu,
    "silu": F.silu,
    "none": lambda t: t,
}


@pytest.fixture
def bwd():
    from dualk.triton_src import fused_mlp_backward as module

    yield module
    module.FORCE_CONFIG.clear()


# The interpreter's config: every layer's dW / db in registers, BLOCK_M=16 over 4 programs.
CPU_CFG = (16, 4, 1, 1 << 30)


def _force(module, dtype, cfg_cpu=CPU_CFG, cfg_gpu=None):
    """Run ``cfg_cpu`` under the interpreter, ``cfg_gpu`` on a GPU (default: the dtype's first
    candidate, so that the GPU suite does not time every candidate for every shape)."""
    gpu_cfg = cfg_gpu or module.fused_mlp_backward_configs(dtype)[0]
    module.FORCE_CONFIG[:] = [gpu_cfg if HAS_CUDA else cfg_cpu]


def _params(widths, dtype, gen, bias_pattern):
    """nn.Linear-like weights (uniform +-1/sqrt(fan_in)); biases where bias_pattern[i]."""
    weights, biases = [], []
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
        bound = 1.0 / math.sqrt(fan_in)
        weights.append(((torch.rand((fan_out, fan_in), generator=gen) * 2 - 1) * bound).to(dtype))
        if bias_pattern[i]:
            biases.append(((torch.rand(fan_out, generator=gen) * 2 - 1) * bound).to(dtype))
        else:
            biases.append(None)
    return [w.to(DEVICE) for w in weights], [None if b is None else b.to(DEVICE) for b in biases]


def _autograd(x, weights, biases, activation, grad_out, need_input_grad=True, dtype=None):
    """torch autograd of the MLP, in ``dtype`` (default: the inputs' own)."""
    cast = (lambda t: t.to(dtype)) if dtype is not None else (lambda t: t)
    x = cast(x.detach()).requires_grad_(need_input_grad)
    ws = [cast(w.detach()).requires_grad_() for w in weights]
    bs = [None if b is None else cast(b.detach()).requires_grad_() for b in biases]
    h = x
    for i, (w, b) in enumerate(zip(ws, bs)):
        h = F.linear(h, w, b)
        if i != len(ws) - 1:
            h = ACTS[activation](h)
    h.backward(cast(grad_out))
    return (
        x.grad if need_input_grad else None,
        [w.grad for w in ws],
        [None if b is None else b.grad for b in bs],
    )


def _check(name, ours, same_dtype, ref):
    """ours / same_dtype (torch in the inputs' dtype) against ref (float64)."""
    assert ours.shape == ref.shape, f"{name}: shape {tuple(ours.shape)} vs {tuple(ref.shape)}"
    assert ours.dtype == same_dtype.dtype, f"{name}: dtype {ours.dtype}"
    if ref.numel() == 0:
        return
    err = (ours.double() - ref).abs().max().item()
    torch_err = (same_dtype.double() - ref).abs().max().item()
    scale = ref.abs().max().item()
    ulps = 4.0 if ours.dtype == torch.float32 else 1.0
    budget = 2.0 * torch_err + ulps * torch.finfo(ours.dtype).eps * scale
    assert torch.isfinite(ours).all(), f"{name}: non-finite values (unwritten output?)"
    assert err <= budget, f"{name}: max error {err:.3g} > 2 x PyTorch's {torch_err:.3g} + ulps"


def _run_and_check(
    bwd, widths, batch, activation, dtype=torch.float32, bias_pattern=None, x_cols=None,
    need_input_grad=True, grad_view=None, seed=0, cfg_cpu=CPU_CFG, cfg_gpu=None,
):  # fmt: skip
    _force(bwd, dtype, cfg_cpu, cfg_gpu)
    gen = torch.Generator().manual_seed(seed)
    bias_pattern = bias_pattern if bias_pattern is not None else [True] * (len(widths) - 1)
    weights, biases = _params(widths, dtype, gen, bias_pattern)
    if x_cols is None:
        x = torch.randn((batch, widths[0]), generator=gen).to(DEVICE, dtype)
    else:  # a wider row buffer, every x_cols // widths[0]-th column: row and column strides > 1
        step = x_cols // widths[0]
        x = torch.randn((batch, x_cols), generator=gen).to(DEVICE, dtype)[:, ::step][:, : widths[0]]
    grad_out = torch.randn((batch, widths[-1]), generator=gen).to(DEVICE, dtype)
    if grad_view is not None:
        grad_out = grad_view(grad_out)

    before = [t.clone() for t in (x, grad_out, *weights, *[b for b in biases if b is not None])]
    gx, gw, gb = bwd.fused_mlp_backward(x, weights, biases, activation, grad_out, need_input_grad)
    after = (x, grad_out, *weights, *[b for b in biases if b is not None])
    assert all(torch.equal(a, b) for a, b in zip(before, after)), "an input was modified"

    args = (x, weights, biases, activation, grad_out, need_input_grad)
    ref = _autograd(*args, dtype=torch.float64)
    same = _autograd(*args)
    if need_input_grad:
        _check("grad_x", gx, same[0], ref[0])
        assert gx.is_contiguous()
    else:
        assert gx is None
    for i in range(len(weights)):
        _check(f"grad_w[{i}]", gw[i], same[1][i], ref[1][i])
        if biases[i] is None:
            assert gb[i] is None
        else:
            _check(f"grad_b[{i}]", gb[i], same[2][i], ref[2][i])
    return gx, gw, gb


FP32_CASES = [
    # (widths, batch, activation, bias pattern)
    ((27, 50, 16), 130, "relu", None),  # odd widths, 9 tiles over 4 programs, partial tile
    ((27, 50, 16), 37, "gelu", [False, True]),
    ((27, 50, 16), 1, "silu", [True, False]),
    ((64, 64, 64, 64, 64, 16), 37, "relu", None),  # the shape, 5 layers
    ((64, 64, 64, 64, 64, 16), 130, "gelu_erf", [True, False, True, False, True]),
    ((16, 16), 130, "relu", None),  # one layer: no activation at all
    ((5, 3), 37, "none", [False]),
    ((20, 33, 7), 37, "gelu_tanh", None),
    ((20, 33, 7), 130, "silu", [False, False]),
    ((20, 33, 7), 37, "none", None),
    ((48, 17, 24, 9), 37, "gelu", None),
]


@pytest.mark.parametrize(
    "widths,batch,activation,bias_pattern", FP32_CASES, ids=lambda v: str(v).replace(" ", "")
)
def test_fp32_matches_float64_autograd(bwd, widths, batch, activation, bias_pattern):
    _run_and_check(bwd, widths, batch, activation, torch.float32, bias_pattern)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    "widths,batch,activation",
    [((64, 64, 64, 64, 64, 16), 130, "relu"), ((27, 50, 16), 37, "gelu"), ((20, 33, 7), 37, "silu"),
     ((20, 33, 7), 37, "gelu_erf")],
    ids=lambda v: str(v).replace(" ", ""),
)  # fmt: skip
def test_half_matches_float64_autograd(bwd, dtype, widths, batch, activation):
    _run_and_check(bwd, widths, batch, activation, dtype)


# Accumulation of dW / db in the program's workspace slice (load + add + store every tile),
# alone and mixed with register accumulation: budget 0 puts every layer in the workspace; the
# small budgets keep the largest layers that fit in registers and the rest in the workspace.
@pytest.mark.parametrize(
    "cfg_cpu,cfg_gpu",
    [((16, 4, 1, 0), (32, 4, 2, 0)), ((16, 4, 1, 40), (32, 4, 2, 24)),
     ((16, 4, 1, 12), (128, 8, 1, 0))],
    ids=["workspace", "mixed", "mixed_small"],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_workspace_accumulation(bwd, cfg_cpu, cfg_gpu, dtype):
    if dtype == torch.float32:
        cfg_gpu = (16, 8, 1, cfg_gpu[3])
    _run_and_check(
        bwd, (64, 32, 48, 64, 16), 130, "relu", dtype, [True, False, True, True],
        cfg_cpu=cfg_cpu, cfg_gpu=cfg_gpu,
    )  # fmt: skip


def test_many_programs(bwd):
    """More programs than the reduction's BLOCK_P (32): the partials are summed in chunks."""
    _run_and_check(bwd, (20, 33, 7), 700, "relu", cfg_cpu=(16, 4, 16, 1 << 30),
                   cfg_gpu=(16, 8, 8, 96))  # fmt: skip


def _gpu_configs():
    from dualk.triton_src.fused_mlp_backward import fused_mlp_backward_configs

    # bf16 shares fp16's code paths: its first config only (each compile takes seconds).
    pairs = [(torch.float16, c) for c in fused_mlp_backward_configs(torch.float16)]
    pairs += [(torch.bfloat16, fused_mlp_backward_configs(torch.bfloat16)[0])]
    pairs += [(torch.float32, c) for c in fused_mlp_backward_configs(torch.float32)]
    return [pytest.param(d, c, id=f"{str(d)[6:]}-{c}".replace(" ", "")) for d, c in pairs]


@pytest.mark.skipif(not HAS_CUDA, reason="the GPU configs (the interpreter runs one)")
@pytest.mark.parametrize("dtype,cfg", _gpu_configs())
def test_every_gpu_config(bwd, dtype, cfg):
    """Each candidate compiles (with this Triton) and is right: the issue's shape, a batch with
    a partial tile over several waves of tiles."""
    _run_and_check(bwd, (64, 64, 64, 64, 64, 16), 5003, "gelu", dtype, cfg_gpu=cfg)


@pytest.mark.skipif(not HAS_CUDA, reason="tuning runs on the GPU only")
def test_tuned_choice(bwd):
    """No forced config: the candidates are timed once and the fastest is used."""
    bwd.FORCE_CONFIG.clear()
    gen = torch.Generator().manual_seed(0)
    widths = (64, 64, 64, 64, 64, 16)
    weights, biases = _params(widths, torch.float16, gen, [True] * 5)
    x = torch.randn((4096, 64), generator=gen).to(DEVICE, torch.float16)
    g = torch.randn((4096, 16), generator=gen).to(DEVICE, torch.float16)
    before = len(bwd.TUNING_LOG)
    gx, gw, gb = bwd.fused_mlp_backward(x, weights, biases, "relu", g)
    assert len(bwd.TUNING_LOG) == before + 1
    ref = _autograd(x, weights, biases, "relu", g, dtype=torch.float64)
    same = _autograd(x, weights, biases, "relu", g)
    _check("grad_x", gx, same[0], ref[0])
    for i in range(5):
        _check(f"grad_w[{i}]", gw[i], same[1][i], ref[1][i])
        _check(f"grad_b[{i}]", gb[i], same[2][i], ref[2][i])


def test_strided_input_and_grad(bwd):
    """x with row and column strides > 1; grad_out transposed (column-major)."""
    _run_and_check(
        bwd, (24, 40, 10), 37, "gelu", x_cols=72, grad_view=lambda g: g.t().contiguous().t()
    )


def test_broadcast_grad_out(bwd):
    """grad_out with stride 0 (what y.sum().backward() hands over)."""
    _run_and_check(bwd, (24, 40, 10), 37, "relu", grad_view=lambda g: g[:1].expand_as(g))


def test_without_input_grad(bwd):
    _run_and_check(bwd, (27, 50, 16), 37, "silu", need_input_grad=False)
    _run_and_check(bwd, (16, 16), 37, "relu", need_input_grad=False, bias_pattern=[False])


def test_empty_batch(bwd):
    gen = torch.Generator().manual_seed(0)
    weights, biases = _params((8, 12, 4), torch.float32, gen, [True, False])
    x = torch.empty((0, 8), device=DEVICE)
    g = torch.empty((0, 4), device=DEVICE)
    gx, gw, gb = bwd.fused_mlp_backward(x, weights, biases, "relu", g)
    assert gx.shape == (0, 8)
    assert [tuple(w.shape) for w in gw] == [(12, 8), (4, 12)]
    assert all((w == 0).all() for w in gw) and (gb[0] == 0).all() and gb[1] is None


def test_gradients_are_separate_contiguous_tensors(bwd):
    _, gw, gb = _run_and_check(bwd, (20, 33, 7), 37, "relu")
    for t in (*gw, *gb):
        assert t.is_contiguous()
    gw[0].zero_()  # views of one buffer, but never overlapping
    assert gw[1].abs().sum() > 0 and gb[0].abs().sum() > 0


def test_unsupported_reason(bwd):
    reason = bwd.fused_mlp_backward_unsupported_reason
    assert reason((64, 64, 64, 64, 64, 16), torch.float16) is None
    assert reason((64, 64, 64, 64, 64, 16), torch.float32) is None
    assert reason((100, 128, 64, 10), torch.float16) is None
    assert "pads to 128 > 64 (float32)" in reason((100, 128, 64, 10), torch.float32)
    assert reason([64] * 9, torch.float16) is None  # 8 layers
    assert reason([64] * 9, torch.float32) is None
    assert "pads to 256" in reason((32, 200, 16), torch.float16)
    assert "pads to 512" in reason((300, 16), torch.bfloat16)
    assert "1 to 8 layers" in reason([16] * 10, torch.float16)
    assert "1 to 8 layers" in reason([16], torch.float16)
    assert "KiB" in reason((128, 128, 128, 16), torch.float16)
    assert reason((128, 128, 16), torch.float16) is None
    assert "float32, float16 and bfloat16" in reason((16, 16), torch.float64)
    with pytest.raises(ValueError, match="pads to 256"):
        gen = torch.Generator().manual_seed(0)
        weights, biases = _params((8, 200, 4), torch.float32, gen, [True, True])
        x = torch.randn((4, 8)).to(DEVICE)
        bwd.fused_mlp_backward(x, weights, biases, "relu", torch.randn((4, 4)).to(DEVICE))


def test_unknown_activation(bwd):
    gen = torch.Generator().manual_seed(0)
    weights, biases = _params((8, 12, 4), torch.float32, gen, [True, True])
    x = torch.randn((4, 8)).to(DEVICE)
    with pytest.raises(ValueError, match="activation"):
        bwd.fused_mlp_backward(x, weights, biases, "tanh", torch.randn((4, 4)).to(DEVICE))
