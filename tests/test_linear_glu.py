"""dualk.linear_glu (issue 35): the gated projection act(x @ Wg.T + bg) * (x @ Wu.T + bu) on the
torch, Triton and CUDA backends (CUDA tests skip without a GPU), its autograd formula, the registered op,
dualk.nn.GatedMLP and dualk.fuse's gated-MLP pattern. The registry-driven suites (test_parity,
test_library, test_validation) cover its sample cases too; this file covers what is specific:
every activation x dtype x layout class, packed weights, fuse on LLaMA-style blocks."""

import math
import zlib

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import dualk
from dualk.autograd import calls as formula_calls
from dualk.backends import unavailable_reason
from dualk.backends.torch_ref import glu_activation, split_glu_parameters
from dualk.core.errors import (
    BackendUnavailableError,
    DeviceMismatchError,
    DtypeError,
    InvalidArgumentError,
    ShapeError,
)
from dualk.registry import DTYPES, OPS, Sample, randn
from dualk.testing import clone_inputs, float64_reference, inputs_unchanged, judge

SPEC = OPS["linear_glu"]
NO_GPU = "the CUDA backend needs a GPU"
CUDA = pytest.param("cuda", marks=pytest.mark.skipif(DEVICE.type != "cuda", reason=NO_GPU))
BACKENDS = ("torch", "triton", CUDA)
ACTIVATIONS = [("silu", "tanh"), ("gelu", "tanh"), ("gelu", "none"), ("relu", "tanh")]
LAYOUTS = ("contiguous", "packed", "transposed_weights", "strided_x", "batched_x")


def _gen(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32("/".join(map(str, key)).encode()))


def _sample(layout, activation, approximate, dtype, bias=True, m=13, k=24, n=20) -> Sample:
    g = _gen(layout, activation, approximate, dtype, bias)
    s = 1.0 / math.sqrt(k)
    x = randn((m, k), dtype, DEVICE, g)
    wg, wu = randn((n, k), dtype, DEVICE, g, s), randn((n, k), dtype, DEVICE, g, s)
    bg = randn(n, dtype, DEVICE, g, 0.5) if bias else None
    bu = randn(n, dtype, DEVICE, g, 0.5) if bias else None
    if layout == "packed":
        wg, wu = torch.cat((wg, wu)), None
        bg, bu = (torch.cat((bg, bu)), None) if bias else (None, None)
    elif layout == "transposed_weights":
        wg, wu = wg.t().contiguous().t(), wu.t().contiguous().t()
    elif layout == "strided_x":
        x = randn((m, 2 * k), dtype, DEVICE, g)[:, ::2]
    elif layout == "batched_x":
        x = randn((2, 3, k), dtype, DEVICE, g)
    kwargs = {"activation": activation, "approximate": approximate}
    return Sample((x, wg, wu, bg, bu), kwargs, f"{layout} {activation}({approximate})")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("activation,approximate", ACTIVATIONS, ids=lambda v: v)
def test_matches_float64_reference(activation, approximate, layout, dtype, backend):
    """Outputs (poisoned before the launch, conftest) within the GEMM family's budget of the
    float64 reference; inputs unchanged; a fresh contiguous output of the right shape."""
    sample = _sample(layout, activation, approximate, dtype, bias=layout != "batched_x")
    before = clone_inputs(sample)
    out = dualk.linear_glu(*sample.args, **sample.kwargs, backend=backend)
    assert out.is_contiguous() and out.dtype == dtype
    assert out.shape == (*sample.args[0].shape[:-1], 20)
    verdict = judge(SPEC, sample, out, float64_reference(SPEC, sample))
    assert verdict.ok, f"[{sample.label}] {backend}/{dtype}: {verdict.message}"
    assert inputs_unchanged(before, sample)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_packed_equals_separate_weights(dtype, backend):
    """[gate; up] packed (biases too) gives bit for bit the separate call's result."""
    s = _sample("contiguous", "silu", "tanh", dtype)
    x, wg, wu, bg, bu = s.args
    separate = dualk.linear_glu(x, wg, wu, bg, bu, backend=backend)
    packed = dualk.linear_glu(x, torch.cat((wg, wu)), None, torch.cat((bg, bu)), backend=backend)
    assert torch.equal(separate, packed)


def _params(args, dtype=None):
    return [
        nn.Parameter(a.detach().to(dtype or a.dtype).clone()) if isinstance(a, torch.Tensor) else a
        for a in args
    ]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("layout", ["contiguous", "packed"])
@pytest.mark.parametrize("activation,approximate", ACTIVATIONS, ids=lambda v: v)
def test_gradients_match_float64_autograd(activation, approximate, layout, dtype, backend):
    """Every input's gradient within 2x PyTorch's own same-dtype gradient error against float64
    autograd, plus a few ulps of the largest gradient (as tests/test_library.py)."""
    sample = _sample(layout, activation, approximate, dtype, m=9, k=16, n=12)
    ours, theirs, ref = (
        _params(sample.args),
        _params(sample.args),
        _params(sample.args, torch.float64),
    )
    out = dualk.linear_glu(*ours, **sample.kwargs, backend=backend)
    weight = torch.randn(out.shape, generator=_gen("w", layout), dtype=torch.float64).to(DEVICE)
    (out.double() * weight).sum().backward()
    (SPEC.reference(*theirs, **sample.kwargs).double() * weight).sum().backward()
    (SPEC.reference(*ref, **sample.kwargs) * weight).sum().backward()
    for i, (g, t, r) in enumerate(zip(ours, theirs, ref)):
        if not isinstance(g, torch.Tensor):
            continue
        assert g.grad is not None and g.grad.shape == r.shape and g.grad.dtype == dtype, i
        err = (g.grad.double() - r.grad).abs().max().item()
        torch_err = (t.grad.double() - r.grad).abs().max().item()
        floor = (
            torch.finfo(dtype).eps
            * r.grad.abs().max().item()
            * (8.0 if dtype == torch.float32 else 2.0)
        )
        assert math.isfinite(err) and err <= 2 * torch_err + floor, (
            f"[{sample.label}] {backend}/{dtype} grad of input {i}: {err:.3g} vs PyTorch's "
            f"{torch_err:.3g} (+{floor:.3g})"
        )


class _CountGemms(TorchDispatchMode):
    """Records the shapes of the GEMMs (aten mm / addmm / bmm) that run under it."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm):
            self.shapes.append(tuple(out.shape))
        return out


def _glu_train_routes(backend):
    """linear_glu's recorded routes: the eager autograd.Function, the registered training op
    (what torch.compile and tensor subclasses record) and the plain registered op called
    directly (which recomputes the pre-activations with the training implementation)."""
    return {
        "eager": lambda x, wg, wu, bg, bu, activation, approximate: dualk.linear_glu(
            x, wg, wu, bg, bu, activation=activation, approximate=approximate, backend=backend
        ),
        "train op": lambda x, wg, wu, bg, bu, activation, approximate: (
            torch.ops.dualk.linear_glu_train(x, wg, wu, bg, bu, activation, approximate, backend)[0]
        ),
        "plain op": lambda x, wg, wu, bg, bu, activation, approximate: torch.ops.dualk.linear_glu(
            x, wg, wu, bg, bu, activation, approximate, backend
        ),
    }


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("layout", ["contiguous", "packed"])
def test_backward_runs_the_gradient_gemms_only(layout, backend, monkeypatch):
    """Training keeps both pre-activations (x's dtype, (M, N) each), as eager PyTorch does, and
    the backward runs the gradient GEMMs only (dX from dG and dU, dWg, dWu; with packed weights
    and Triton's packed [dG | dU], one GEMM for dX and one for d[Wg; Wu]) and no product of shape
    (M, N): the two forward GEMMs are not run again (issue 35's backward goal). Counted at
    dualk.matmul as the formula calls it (dualk/autograd/calls.py) and, on the torch backend, at
    ATen's mm / addmm."""
    s = _sample(layout, "silu", "tanh", torch.float32)
    calls = []
    real = formula_calls.matmul

    def counting(a, b, backend):
        out = real(a, b, backend)
        calls.append(tuple(out.shape))
        return out

    monkeypatch.setattr(formula_calls, "matmul", counting)
    one_gemm = layout == "packed" and backend == "triton"
    for route in ("eager", "train op"):
        x, wg, wu, bg, bu = _params(s.args)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(
            lambda t, saved=saved: saved.append(tuple(t.shape)) or t, lambda t: t
        ):
            out = _glu_train_routes(backend)[route](x, wg, wu, bg, bu, "silu", "tanh")
        m, n = out.shape
        assert saved.count((m, n)) == 2, (route, saved)
        calls.clear()
        with _CountGemms() as gemms:
            out.backward(torch.randn(out.shape, generator=_gen("g", route)).to(out.device))
        want = [x.shape, (2 * n, 24)] if one_gemm else [x.shape, x.shape, (n, 24), (n, 24)]
        assert sorted(calls) == sorted(want), (route, calls)
        if backend == "torch":
            assert sorted(gemms.shapes) == sorted(want), (route, gemms.shapes)
        else:
            assert gemms.shapes == [], (route, gemms.shapes)  # Triton's GEMMs, no ATen one


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_training_forward_equals_inference_forward(dtype, backend):
    """linear_glu_train's output is the no-grad call's bit for bit (same kernel, same
    accumulators on Triton; the same operations on torch), its pre-activations those of the
    float64 reference within the GEMM budget; every recorded route gives the same gradients bit
    for bit (one formula from the same saved tensors)."""
    if backend == "cuda":
        pytest.skip("the CUDA training forward is eager's GEMMs: within tolerance, not bit-equal")
    for layout in ("contiguous", "packed", "batched_x"):
        s = _sample(layout, "gelu", "none", dtype, bias=layout != "batched_x")
        with torch.no_grad():
            ref = dualk.linear_glu(*s.args, **s.kwargs, backend=backend)
        out, gate, up = torch.ops.dualk.linear_glu_train(*s.args, "gelu", "none", backend)
        assert torch.equal(out, ref), (layout, backend)
        assert gate.shape == up.shape == out.shape and gate.dtype == dtype
        x, wg, wu, bg, bu = (a.double() if a is not None else None for a in s.args)
        wg, wu, bg, bu = split_glu_parameters(wg, wu, bg, bu)
        tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
        torch.testing.assert_close(gate.double(), F.linear(x, wg, bg), rtol=tol, atol=tol)
        torch.testing.assert_close(up.double(), F.linear(x, wu, bu), rtol=tol, atol=tol)
        weight = torch.randn(out.shape, generator=_gen("w", layout)).to(DEVICE, dtype)
        grads = {}
        for route, fn in _glu_train_routes(backend).items():
            args = _params(s.args)
            fn(*args, "gelu", "none").mul(weight).sum().backward()
            grads[route] = [a.grad for a in args if isinstance(a, torch.Tensor)]
        for route, got in grads.items():
            for a, b in zip(got, grads["eager"]):
                assert torch.equal(a, b), (layout, backend, route)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["empty", "k0", "tiny"])
def test_training_route_on_degenerate_shapes(case, backend):
    """No rows, K = 0 (the output is act(bias_gate) * bias_up) and 1 x 1 x 1: the training
    forward gives the inference answer, and gradients of the right shapes, equal to PyTorch's
    autograd of the reference (exact for these shapes)."""
    sample = SPEC.case(case).make(torch.float32, DEVICE, _gen("degenerate", case))
    with torch.no_grad():
        ref = dualk.linear_glu(*sample.args, **sample.kwargs, backend=backend)
    ours, theirs = _params(sample.args), _params(sample.args)
    out = dualk.linear_glu(*ours, **sample.kwargs, backend=backend)
    torch.testing.assert_close(out, ref.detach(), rtol=1e-6, atol=1e-6)
    weight = torch.randn(out.shape, generator=_gen("degenerate-w", case)).to(DEVICE)
    (out * weight).sum().backward()
    (SPEC.reference(*theirs, **sample.kwargs) * weight).sum().backward()
    for a, b in zip(ours, theirs):
        if isinstance(a, torch.Tensor):
            assert a.grad is not None and a.grad.shape == a.shape, case
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck_training_op(backend):
    """torch.library.opcheck of dualk::linear_glu_train (schema, fake, autograd registration
    with its two non-differentiable outputs, AOT dispatch), separate and packed weights."""
    for layout, act, approx, bias in (
        ("contiguous", "silu", "tanh", True),
        ("packed", "gelu", "none", False),
        ("batched_x", "relu", "tanh", False),
    ):
        s = _sample(layout, act, approx, torch.float32, bias=bias, m=5, k=8, n=6)
        args = _params(s.args)
        torch.library.opcheck(
            torch.ops.dualk.linear_glu_train.default, (*args, act, approx, backend)
        )


def test_compile_records_the_training_op_only_when_training():
    """Under torch.compile, a call whose inputs need gradients records dualk::linear_glu_train
    (so the compiled backward reads its saved pre-activations); under no_grad the inference op
    (dualk::linear_glu_infer: no autograd wrappers per call)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm.forward

    s = _sample("packed", "silu", "tanh", torch.float32)
    args = _params(s.args)
    fn = torch.compile(
        lambda *a: dualk.linear_glu(*a, backend="torch"), backend=backend, fullgraph=True
    )
    out = fn(*args)
    with torch.no_grad():
        torch.testing.assert_close(fn(*args), out.detach(), rtol=0, atol=0)
    assert any("dualk.linear_glu_train" in t for t in graphs[0]), graphs[0]
    assert any(t in ("dualk.linear_glu_infer", "dualk.linear_glu_infer.default") for t in graphs[1])
    assert not any("linear_glu_train" in t for t in graphs[1]), graphs[1]
    out.sum().backward()
    assert all(a.grad is not None for a in args if isinstance(a, torch.Tensor))


@pytest.mark.skipif(
    tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 13),
    reason="torch < 2.13 cannot tell an export from a compile (dualk/runtime/route.py)",
)
def test_export_keeps_the_inference_op():
    """torch.export of a GatedMLP (parameters that need gradients, grad mode on) records the
    plain dualk::linear_glu, not the training op that also writes the pre-activations."""
    torch.manual_seed(3)
    mlp = dualk.nn.GatedMLP(16, 24, 12, bias=True, backend="torch", device=DEVICE)
    x = torch.randn(3, 16, device=DEVICE)
    ep = torch.export.export(mlp, (x,))
    targets = [str(n.target) for n in ep.graph.nodes if "dualk" in str(n.target)]
    assert targets == ["dualk.linear_glu.default"], targets
    torch.testing.assert_close(ep.module()(x), mlp(x))


def test_gated_mlp_reads_its_parameters_wherever_they_live():
    """The gated part reads weights and biases from the Linears' parameter dicts (host time); a
    plain-tensor weight or bias, a bias set to None, or a projection replaced by a plain
    attribute still reach it."""
    torch.manual_seed(4)
    mlp = dualk.nn.GatedMLP(16, 24, 12, bias=True, backend="torch", device=DEVICE)
    x = torch.randn(3, 16, device=DEVICE)
    f = torch.nn.functional

    def expected():
        g, u = mlp.gate_proj, mlp.up_proj
        return mlp.down_proj(f.silu(f.linear(x, g.weight, g.bias)) * f.linear(x, u.weight, u.bias))

    torch.testing.assert_close(mlp(x), expected())
    wg, bu = torch.randn(24, 16, device=DEVICE), torch.randn(24, device=DEVICE)
    del mlp.gate_proj._parameters["weight"], mlp.up_proj._parameters["bias"]
    mlp.gate_proj.weight, mlp.up_proj.bias = wg, bu  # (plain tensors: attributes)
    assert "weight" in mlp.gate_proj.__dict__ and "bias" in mlp.up_proj.__dict__
    torch.testing.assert_close(mlp(x), expected())
    mlp.gate_proj.bias = None
    torch.testing.assert_close(mlp(x), expected())
    up = mlp.up_proj
    del mlp._modules["up_proj"]
    object.__setattr__(mlp, "up_proj", up)  # (not a registered child: found as an attribute)
    torch.testing.assert_close(mlp(x), expected())


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_fused_elementwise_backward(dtype):
    """The backward's one Triton pass ([d_gate | d_up] from grad, gate, up; registered as
    dualk::linear_glu_grad_pre for traced backwards) against float64 for every activation, with
    an expanded upstream gradient (stride 0, what sum().backward() hands over); opcheck."""
    if unavailable_reason("triton", DEVICE) is not None:
        pytest.skip(unavailable_reason("triton", DEVICE))
    g = _gen("elementwise", dtype)
    m, n = 7, 45
    gate = (3 * randn((m, n), dtype, DEVICE, g)).to(dtype)
    up = randn((m, n), dtype, DEVICE, g)
    ones = torch.ones((), dtype=dtype, device=DEVICE).expand(m, n)
    for grad in (randn((m, n), dtype, DEVICE, g), ones):
        for activation, approximate in ACTIVATIONS:
            args = (grad.to(DEVICE), gate, up, activation, approximate)
            d_pre = torch.ops.dualk.linear_glu_grad_pre(*args)
            assert d_pre.shape == (m, 2 * n) and d_pre.dtype == dtype
            z = gate.double().requires_grad_()
            out = glu_activation(z, activation, approximate) * up.double()
            (d_gate,) = torch.autograd.grad(out, z, grad.double())
            d_up = grad.double() * glu_activation(gate.double(), activation, approximate)
            tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
            want = torch.cat((d_gate, d_up), 1)
            torch.testing.assert_close(d_pre.double(), want, rtol=tol, atol=tol)
    torch.library.opcheck(torch.ops.dualk.linear_glu_grad_pre.default, args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck(backend):
    """torch.library.opcheck (schema, fake, autograd registration, AOT dispatch): separate
    weights on one backend, packed ones on the other (test_library checks the registry's
    samples on both)."""
    layout, act, approx = (
        ("contiguous", "silu", "tanh") if backend == "torch" else ("packed", "gelu", "none")
    )
    s = _sample(layout, act, approx, torch.float32, m=5, k=8, n=6)
    args = _params(s.args)
    torch.library.opcheck(torch.ops.dualk.linear_glu.default, (*args, act, approx, backend))


def test_registered_op_and_direct_route_agree():
    s = _sample("packed", "gelu", "tanh", torch.float32)
    direct = dualk.linear_glu(*s.args, **s.kwargs, backend="triton")
    registered = torch.ops.dualk.linear_glu(*s.args, "gelu", "tanh", "triton")
    assert torch.equal(direct, registered)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_gated_mlp_fullgraph(backend):
    """torch.compile(fullgraph=True) of a GatedMLP (a graph break would raise): the eager answer
    and gradients. aot_eager on the CPU (Dynamo + AOT autograd, what must not break)."""
    torch.manual_seed(0)
    mlp = dualk.nn.GatedMLP(
        16, 24, 12, activation="silu", bias=True, backend=backend, device=DEVICE
    )
    x = torch.randn(2, 5, 16, device=DEVICE)
    compiled = torch.compile(
        mlp, fullgraph=True, backend="aot_eager" if DEVICE.type == "cpu" else "inductor"
    )
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), mlp(x), rtol=1e-5, atol=1e-6)
    compiled(x).square().sum().backward()
    grads = [p.grad.clone() for p in mlp.parameters()]
    mlp.zero_grad()
    mlp(x).square().sum().backward()
    for g, p in zip(grads, mlp.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------- GatedMLP
def test_gated_mlp_matches_llama_mlp_and_loads_its_keys():
    """GatedMLP's keys are LlamaMLP's; its output is down(act(gate(x)) * up(x))."""
    torch.manual_seed(1)
    for act, approx, fn in (
        ("silu", "tanh", F.silu),
        ("gelu", "none", F.gelu),
        ("relu", "tanh", F.relu),
    ):
        mlp = dualk.nn.GatedMLP(
            16, 40, activation=act, approximate=approx, backend="triton", device=DEVICE
        )
        assert set(mlp.state_dict()) == {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}
        x = torch.randn(3, 16, device=DEVICE)
        ref = mlp.down_proj(fn(mlp.gate_proj(x)) * mlp.up_proj(x))
        torch.testing.assert_close(mlp(x), ref, rtol=1e-5, atol=1e-6)
        other = dualk.nn.GatedMLP(16, 40, activation=act, approximate=approx, device=DEVICE)
        other.load_state_dict(mlp.state_dict())
        torch.testing.assert_close(other(x), ref, rtol=1e-5, atol=1e-6)


def test_gated_mlp_from_linears_shares_modules():
    gate, up, down = nn.Linear(8, 20), nn.Linear(8, 20), nn.Linear(20, 6)
    mlp = dualk.nn.GatedMLP.from_linears(gate, up, down, "gelu", backend="torch")
    assert mlp.gate_proj is gate and mlp.up_proj is up and mlp.down_proj is down
    x = torch.randn(4, 8)
    torch.testing.assert_close(mlp(x), down(F.gelu(gate(x), approximate="tanh") * up(x)))
    with pytest.raises(InvalidArgumentError, match="same shape"):
        dualk.nn.GatedMLP.from_linears(gate, nn.Linear(9, 20), down)
    with pytest.raises(InvalidArgumentError, match="activation must be one of"):
        dualk.nn.GatedMLP(8, 20, activation="tanh")


# ---------------------------------------------------------------------------- fuse
class _LlamaMLP(nn.Module):
    """transformers' LlamaMLP in plain PyTorch."""

    def __init__(self, hidden=16, inter=40, act=None, bias=False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=bias)
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)
        self.act_fn = act

    def forward(self, x):
        gate = self.gate_proj(x)
        gate = F.silu(gate) if self.act_fn is None else self.act_fn(gate)
        return self.down_proj(gate * self.up_proj(x))


class _Block(nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.mlp = mlp

    def forward(self, x):
        return x + self.mlp(self.norm(x))


def _act2fn_gelu_class():
    """An ACT2FN-style activation class, as transformers.activations defines it (module and name
    are what dualk.nn.module_activation matches)."""

    class NewGELUActivation(nn.Module):
        def forward(self, x):
            return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))

    NewGELUActivation.__module__ = "transformers.activations"
    NewGELUActivation.__qualname__ = "NewGELUActivation"
    return NewGELUActivation()


def _check_fused_like_original(model, fused, x, backend_note=""):
    """Same outputs and gradients as the original, parameters shared, state_dict keys kept."""
    assert list(fused.state_dict()) == list(model.state_dict())
    assert {id(p) for p in fused.parameters()} == {id(p) for p in model.parameters()}
    out = fused(x)
    ref = model(x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    w = torch.randn(out.shape, generator=_gen("fuse-grad")).to(DEVICE)
    grads = torch.autograd.grad((out * w).sum(), list(model.parameters()))
    expected = torch.autograd.grad((ref * w).sum(), list(model.parameters()))
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("act", [None, "module_silu", "act2fn_gelu", "mul_method"], ids=str)
def test_fuse_llama_style_block(act):
    torch.manual_seed(2)
    module_act = {None: None, "module_silu": nn.SiLU(), "act2fn_gelu": _act2fn_gelu_class(),
                  "mul_method": None}[act]  # fmt: skip
    mlp = _LlamaMLP(act=module_act, bias=act == "module_silu")
    if act == "mul_method":

        def forward(x, self=mlp):  # Tensor.mul, up first
            return self.down_proj(self.up_proj(x).mul(F.silu(self.gate_proj(x))))

        mlp.forward = forward
    model = _Block(mlp).to(DEVICE)
    fused, report = dualk.fuse(model, backend="triton", report=True)
    assert [c.kind for c in report.fused] == ["LinearGLU"], str(report)
    chain = report.fused[0]
    assert chain.modules == ["mlp.gate_proj", "mlp.up_proj"] and chain.widths == [16, 40]
    assert chain.activation == ("gelu(tanh)" if act == "act2fn_gelu" else "silu")
    assert not any(s.where == "mlp.gate_proj" for s in report.skipped)
    _check_fused_like_original(model, fused, torch.randn(2, 3, 16, device=DEVICE))


def test_fuse_leaves_non_gated_patterns_alone():
    """The activation on the up projection's output too, or a gate output used twice: no GLU."""

    class Both(_LlamaMLP):
        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * F.silu(self.up_proj(x)))

    class Reused(_LlamaMLP):
        def forward(self, x):
            g = self.gate_proj(x)
            return self.down_proj(F.silu(g) * self.up_proj(x) + g)

    for cls in (Both, Reused):
        _, report = dualk.fuse(cls(), report=True)
        assert not any(c.kind == "LinearGLU" for c in report.fused), str(report)


def test_fuse_real_transformers_llama_mlp():
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (the real LlamaMLP is optional)"
    )
    from transformers.models.llama.modeling_llama import LlamaMLP

    config = transformers.LlamaConfig(
        hidden_size=16,
        intermediate_size=40,
        hidden_act="silu",
        num_attention_heads=2,
        num_key_value_heads=2,
    )  # (transformers 5 checks the heads divide the hidden size)
    torch.manual_seed(3)
    model = LlamaMLP(config).to(DEVICE)
    fused, report = dualk.fuse(model, backend="triton", report=True)
    assert [c.kind for c in report.fused] == ["LinearGLU"], str(report)
    _check_fused_like_original(model, fused, torch.randn(2, 3, 16, device=DEVICE))


# ---------------------------------------------------------------------------- errors
def _good():
    return (torch.randn(4, 3), torch.randn(5, 3), torch.randn(5, 3), torch.randn(5), torch.randn(5))


@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
@pytest.mark.parametrize(
    "where,value,cls,message",
    [
        (0, torch.randn(4, 3, dtype=torch.float64), DtypeError, "'x' has dtype torch.float64"),
        (1, torch.randn(5, 3, dtype=torch.float16), DtypeError, "'weight_gate' has dtype torch.float16 but 'x'"),
        (2, torch.randn(5, 3, device="meta"), DeviceMismatchError, "'weight_up' is on meta but 'x' is on cpu"),
        (2, torch.randn(6, 3), ShapeError, r"'weight_up' must have the shape of 'weight_gate' \(5, 3\)"),
        (1, torch.randn(5, 4), ShapeError, "'x' has 3 features"),
        (3, torch.randn(6), ShapeError, r"'bias_gate' must have shape \(5,\)"),
        (4, torch.randn(5, 1), ShapeError, r"'bias_up' must have shape \(5,\)"),
        (4, 3, TypeError, "'bias_up' must be a torch.Tensor, got int"),
    ],
    ids=["x-f64", "wg-mixed", "wu-meta", "wu-shape", "features", "bg-shape", "bu-2d", "bu-int"],
)  # fmt: skip
def test_bad_input_raises_a_clear_error(where, value, cls, message, backend):
    args = list(_good())
    args[where] = value
    with pytest.raises(cls, match=message) as info:
        dualk.linear_glu(*args, backend=backend)
    assert str(info.value).startswith("dualk.linear_glu: ")
    with pytest.raises(cls, match=message):
        dualk.explain("linear_glu", *args, backend=backend)


@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
def test_packed_and_option_errors(backend):
    x = torch.randn(4, 3)
    with pytest.raises(ShapeError, match=r"even number of rows \(2N, K\), got shape \(5, 3\)"):
        dualk.linear_glu(x, torch.randn(5, 3), backend=backend)
    with pytest.raises(InvalidArgumentError, match="the biases are packed too"):
        dualk.linear_glu(
            x, torch.randn(6, 3), None, torch.randn(6), torch.randn(3), backend=backend
        )
    with pytest.raises(ShapeError, match=r"'bias_gate' must have shape \(6,\)"):
        dualk.linear_glu(x, torch.randn(6, 3), None, torch.randn(3), backend=backend)
    with pytest.raises(InvalidArgumentError, match=r"'activation' must be one of \('silu'"):
        dualk.linear_glu(x, *_good()[1:3], activation="tanh", backend=backend)
    with pytest.raises(InvalidArgumentError, match="'approximate' must be one of"):
        dualk.linear_glu(x, *_good()[1:3], activation="gelu", approximate="erf", backend=backend)
    grad_x = x.clone().requires_grad_()  # the autograd route checks the same
    with pytest.raises(ShapeError, match="even number of rows"):
        dualk.linear_glu(grad_x, torch.randn(5, 3), backend=backend)


def test_cuda_backend_registered():
    """The CUDA kernel is an implementation "auto" considers; on a machine without a GPU,
    backend="cuda" raises saying why, and auto still answers."""
    args = _good()
    assert "cuda" in SPEC.backends and "cuda" in SPEC.auto_order and not SPEC.missing
    if DEVICE.type != "cuda":
        with pytest.raises(BackendUnavailableError, match="CUDA"):
            dualk.linear_glu(*args, backend="cuda")
    assert dualk.linear_glu(*args, backend="auto").shape == (4, 5)


def test_autotune_key_names_the_class():
    from dualk.dispatch import autotune

    x, wg, wu, bg, bu = _good()
    key = autotune.make_key(SPEC, (x, torch.cat((wg, wu)), None, bg, None, "gelu", "none"))
    text = autotune.key_string(key)
    assert text == "linear_glu|float32|m<=4|k=3|n=5|bias=10|gelu(none)|layout=ccp", text


@pytest.mark.skipif(DEVICE.type != "cuda", reason="CUDA-graph capture needs a GPU")
@pytest.mark.parametrize("backend", ["triton", "torch", "auto", "cuda"])
def test_cuda_graph_capture_and_replay(backend, monkeypatch, tmp_path):
    """Captured (auto meeting its class inside the capture takes its heuristic: no timing) and
    replayed on new inputs copied into the captured ones: the float64 reference's answer."""
    from dualk.dispatch import autotune

    monkeypatch.setenv("DUALK_CACHE_DIR", str(tmp_path))
    autotune.clear_memory()
    sample = SPEC.case("packed_bias").make(torch.float16, DEVICE, _gen("graph", backend))
    fn = lambda: dualk.linear_glu(*sample.args, **sample.kwargs, backend=backend)  # noqa: E731
    if backend != "auto":
        fn()  # compile and tune outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = fn()
    fresh = SPEC.case("packed_bias").make(torch.float16, DEVICE, _gen("graph-new", backend))
    for old, new in zip(sample.args, fresh.args):
        if isinstance(old, torch.Tensor):
            old.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    verdict = judge(SPEC, sample, out, float64_reference(SPEC, sample))
    assert verdict.ok, verdict.message


# ---- the CUDA kernel's routes (GPU only): cuda_src/linear_glu.cu
def _cuda_route(x, wg, wu) -> str:
    from dualk.backends import cuda

    out = torch.empty((x.shape[0], wg.shape[0]), dtype=x.dtype, device=x.device)
    return cuda.extension("gemm").linear_glu_route(x, wg, wu, out)


# (rows, k, n, weights): odd sizes (n, k not multiples of 8 or 16), rows 1..300, weights
# separate / packed / transposed, x strided; 16-bit calls with 16-byte rows take the Hopper
# kernel on an H100 / H200 (wide 128 x (2 x 128) tiles once they cover every SM, else narrow),
# others the portable routes.
ROUTE_SHAPES = [
    (1, 64, 64, "separate"),
    (7, 40, 24, "separate"),
    (13, 33, 20, "separate"),  # k odd: no 16-byte rows (one-pass SIMT for 16-bit)
    (64, 72, 136, "packed"),
    (100, 200, 1000, "separate"),  # k not a multiple of 64: TMA zero-fills the last k tile
    (129, 256, 250, "packed"),  # n not a multiple of 8: the direct stores
    (257, 96, 520, "transposed"),
    (300, 136, 5640, "separate"),  # 3 x 51 mid tiles > 132 SMs: two per CTA, the last partial
    (1100, 72, 3712, "separate"),  # 9 x 29 wide tiles (fewer columns per CTA than mid): two per CTA
    (16, 520, 5000, "separate"),  # narrow tiles, 157 of them: more than one per CTA
    (300, 64, 72, "strided_x"),
]


@pytest.mark.skipif(DEVICE.type != "cuda", reason=NO_GPU)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("rows,k,n,weights", ROUTE_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("activation,approximate", ACTIVATIONS, ids=lambda v: v)
def test_cuda_odd_shapes_and_routes(activation, approximate, rows, k, n, weights, dtype):
    """Every route of the CUDA kernel against the float64 reference (outputs poisoned), with and
    without biases (one of the two only, too)."""
    g = _gen("cuda-route", rows, k, n, weights, dtype, activation, approximate)
    s = 1.0 / math.sqrt(k)
    x = randn((rows, k), dtype, DEVICE, g)
    if weights == "strided_x":
        x = randn((rows, 2 * k), dtype, DEVICE, g)[:, ::2]
    wg, wu = randn((n, k), dtype, DEVICE, g, s), randn((n, k), dtype, DEVICE, g, s)
    if weights == "transposed":
        wg, wu = wg.t().contiguous().t(), wu.t().contiguous().t()
    bg = randn(n, dtype, DEVICE, g, 0.5) if rows % 2 else None
    bu = randn(n, dtype, DEVICE, g, 0.5) if rows % 3 else None
    args = (x, wg, wu, bg, bu)
    if weights == "packed":
        both = None if bg is None or bu is None else torch.cat((bg, bu))
        args = (x, torch.cat((wg, wu)), None, both, None)
    sample = Sample(
        args, {"activation": activation, "approximate": approximate}, f"{rows}x{k}->{n}"
    )
    out = dualk.linear_glu(*sample.args, **sample.kwargs, backend="cuda")
    assert out.shape == (rows, n) and out.dtype == dtype
    verdict = judge(SPEC, sample, out, float64_reference(SPEC, sample))
    assert verdict.ok, f"[{sample.label} {weights}] {dtype}: {verdict.message}"


@pytest.mark.skipif(DEVICE.type != "cuda", reason=NO_GPU)
def test_cuda_route_names(monkeypatch):
    """On Hopper, aligned 16-bit calls take the wgmma kernel (wide or mid tiles at LLaMA's
    prefill, narrow at decode); fp32 and rows off 16 bytes take the portable routes; anywhere
    else, portable. (With the CTA pairs off: test_cuda_route_names_with_cta_pairs has them.)"""
    monkeypatch.setenv("DUALK_GLU_CLUSTER", "0")
    bf16 = torch.bfloat16
    hopper = torch.cuda.get_device_capability() == (9, 0)

    def route(m, k, n, dtype=bf16):
        x = torch.randn(m, k, device=DEVICE).to(dtype)
        w = torch.randn(n, k, device=DEVICE).to(dtype)
        return _cuda_route(x, w, w)

    if hopper:
        # 344 wide tiles are 2.6 rounds of 132 SMs, 396 mid ones 3 whole rounds of 7/8 the work
        assert route(512, 4096, 11008) == "sm90 wgmma 128x(2x112)"
        assert route(8192, 4096, 11008) == WIDE_ROUTE
        assert route(16, 4096, 11008) == "sm90 wgmma 128x(2x32)"
    else:
        assert route(512, 4096, 11008).startswith("portable")
    assert route(64, 64, 64, torch.float32) == "portable: two fp32 GEMMs + gated epilogue"
    assert route(64, 33, 64, torch.float16) == "portable: one-pass SIMT"


# ---- CTA pairs (the default; DUALK_GLU_CLUSTER=0 turns them off; GPU only): the wide tile's
# clustered variant GluWideC2
WIDE_ROUTE = "sm90 wgmma 128x(2x128)"
PAIRS_ROUTE = "sm90 wgmma 128x(2x128), CTA pairs"
# (rows, k, n, the tile on 132 SMs), k off 64 and n off 128 throughout. 4136 rows = 33 tile rows:
# the last pair's first CTA has 40 rows, its second lies past the last row (computes zeros, stores
# nothing); 4264 = 34 tile rows: the last pair's second CTA has 40 rows (its second consumer none).
# Mid and narrow shapes: the switch on must leave them as they are.
PAIR_SHAPES = [
    (4136, 520, 1000, "wide"),  # 17 x 8 = 136 pair tiles: 3 rounds of an H200's 66 pairs
    (4136, 200, 1928, "wide"),
    (4264, 200, 1800, "wide"),
    (4136, 136, 2056, "mid"),
    (300, 136, 5640, "mid"),
    (16, 520, 5000, "narrow"),
]
TILE_ROUTES = {
    "wide": WIDE_ROUTE,
    "mid": "sm90 wgmma 128x(2x112)",
    "narrow": "sm90 wgmma 128x(2x32)",
}


@pytest.mark.skipif(DEVICE.type != "cuda", reason=NO_GPU)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("activation,approximate", ACTIVATIONS[:2], ids=lambda v: v)
@pytest.mark.parametrize("rows,k,n,tile", PAIR_SHAPES, ids=lambda v: str(v))
def test_cuda_cta_pairs(rows, k, n, tile, activation, approximate, bias, dtype, monkeypatch):
    """DUALK_GLU_CLUSTER=1 (read by the launcher on every call): the float64 reference's answer
    (outputs poisoned: a pair's CTA past the last row must store nothing), and bit for bit the
    single-CTA answer (the same wgmma sequence over the same shared-memory tiles, the same
    epilogue); the route names the pairs exactly where the wide tile runs."""
    g = _gen("cta-pairs", rows, k, n, dtype, activation, approximate, bias)
    s = 1.0 / math.sqrt(k)
    x = randn((rows, k), dtype, DEVICE, g)
    wg, wu = randn((n, k), dtype, DEVICE, g, s), randn((n, k), dtype, DEVICE, g, s)
    bg = randn(n, dtype, DEVICE, g, 0.5) if bias else None
    bu = randn(n, dtype, DEVICE, g, 0.5) if bias else None
    sample = Sample(
        (x, wg, wu, bg, bu), {"activation": activation, "approximate": approximate},
        f"{rows}x{k}->{n} pairs",
    )  # fmt: skip
    monkeypatch.setenv("DUALK_GLU_CLUSTER", "0")
    single_route = _cuda_route(x, wg, wu)
    single = dualk.linear_glu(*sample.args, **sample.kwargs, backend="cuda")
    monkeypatch.setenv("DUALK_GLU_CLUSTER", "1")
    route = _cuda_route(x, wg, wu)
    out = dualk.linear_glu(*sample.args, **sample.kwargs, backend="cuda")
    hopper = torch.cuda.get_device_capability() == (9, 0)
    if hopper and torch.cuda.get_device_properties(DEVICE).multi_processor_count == 132:
        assert single_route == TILE_ROUTES[tile], single_route  # (the shapes are for 132 SMs)
    assert route == (PAIRS_ROUTE if single_route == WIDE_ROUTE else single_route), route
    assert out.shape == (rows, n) and out.dtype == dtype
    verdict = judge(SPEC, sample, out, float64_reference(SPEC, sample))
    assert verdict.ok, f"[{sample.label}] {dtype} {route}: {verdict.message}"
    assert torch.equal(out, single), f"[{sample.label}] {dtype}: pairs differ from single CTAs"


@pytest.mark.skipif(DEVICE.type != "cuda", reason=NO_GPU)
def test_cuda_route_names_with_cta_pairs(monkeypatch):
    """The switch is read on every call: unset (the default) and "1" name the pairs where the
    wide tile runs (LLaMA's 8192 rows), not the mid or narrow tiles, nor a wide tile of one tile
    row (nothing to pair with); "0" names the single-CTA wide tile."""
    hopper = torch.cuda.get_device_capability() == (9, 0)

    def route(m, k, n):
        x = torch.zeros(m, k, device=DEVICE, dtype=torch.bfloat16)
        w = torch.zeros(n, k, device=DEVICE, dtype=torch.bfloat16)
        return _cuda_route(x, w, w)

    monkeypatch.setenv("DUALK_GLU_CLUSTER", "0")
    off = route(8192, 4096, 11008)
    assert (off == WIDE_ROUTE) if hopper else off.startswith("portable"), off
    monkeypatch.delenv("DUALK_GLU_CLUSTER", raising=False)
    assert route(8192, 4096, 11008) == (PAIRS_ROUTE if hopper else off)
    monkeypatch.setenv("DUALK_GLU_CLUSTER", "1")
    if hopper:
        assert route(8192, 4096, 11008) == PAIRS_ROUTE
        assert route(8192, 4096, 14336) == PAIRS_ROUTE
        assert route(512, 4096, 11008) == "sm90 wgmma 128x(2x112)"
        assert route(16, 4096, 11008) == "sm90 wgmma 128x(2x32)"
        assert route(128, 64, 16896) != PAIRS_ROUTE  # 132 wide tiles of one tile row
    else:
        assert route(8192, 4096, 11008) == off


@pytest.mark.skipif(DEVICE.type != "cuda", reason=NO_GPU)
def test_untimed_heuristic_asks_the_real_route():
    """auto's untimed rule (capture, DUALK_AUTOTUNE=0) asks the CUDA planner for its route: the
    Hopper wgmma route for aligned 16-bit calls on a 9.0 GPU, never for fp32 or a packed x's
    off-16-byte rows; the answer is the same route the call then takes."""
    from dualk.backends import cuda as cuda_backend
    from dualk.dispatch import heuristic

    if unavailable_reason("cuda", DEVICE) is not None:
        pytest.skip(unavailable_reason("cuda", DEVICE))
    hopper = torch.cuda.get_device_capability() == (9, 0)

    def args(m, k, n, dtype=torch.bfloat16, packed=False):
        x = torch.randn(m, k, device=DEVICE).to(dtype)
        if packed:
            return (x, torch.randn(2 * n, k, device=DEVICE).to(dtype), None, None, None)
        w = torch.randn(n, k, device=DEVICE).to(dtype)
        return (x, w, w.clone(), None, None)

    for a in (args(512, 256, 320), args(300, 128, 96, packed=True)):
        route = cuda_backend.linear_glu_route(*a)
        assert route == _cuda_route(a[0], *(a[1].chunk(2) if a[2] is None else a[1:3]))
        assert heuristic._takes_hopper_glu_route((*a, "silu", "tanh")) == hopper, route
    assert not heuristic._takes_hopper_glu_route(
        (*args(256, 64, 64, torch.float32), "silu", "tanh")
    )
    assert not heuristic._takes_hopper_glu_route(
        (*args(256, 33, 64, torch.float16), "silu", "tanh")
    )
