"""dualk.nn modules (FusedMLP, LinearGELU) against the nn.Linear models they stand for: outputs
and gradients against the float64 reference of the unfused model, nn.Linear's init and
state_dict keys, state_dicts both ways, parameters shared (not copied) by from_sequential /
from_linear, errors naming the offending module, torch.compile without graph breaks."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import DEVICE, stand_in_fast_path
from torch import nn

import dualk
from dualk.backends import unavailable_reason
from dualk.dispatch import autotune
from dualk.nn import FusedMLP, LinearGELU

BACKENDS = ("torch", "triton", "cuda")
ACTIVATIONS = [("relu", "tanh"), ("gelu", "tanh"), ("gelu", "none"), ("silu", "tanh"),
               ("none", "tanh")]  # fmt: skip


@pytest.fixture(autouse=True)
def _final_decisions(monkeypatch):
    """On a GPU, auto's decisions here are final at once (Triton tuned in the call, as before the
    background tuner): these tests are about the modules' plans, not about when Triton joins
    (tests/test_triton_tune.py)."""
    monkeypatch.setattr(autotune, "BACKGROUND_DEVICE_TYPES", ())


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal within fp32 rounding: a plan and a full call may run different backends."""
    return torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def _skip(backend):
    reason = unavailable_reason(backend, DEVICE)
    if reason is not None:
        pytest.skip(reason)


def assert_close_to_float64(what, out, ref, ref64):
    """`out` (dualk) within 2x the error of `ref` (PyTorch in the same dtype) against the
    float64 reference, plus 4 ulps of the dtype at the reference's largest magnitude."""
    ref64 = ref64.double()
    err = (out.double() - ref64).abs().max().item() if out.numel() else 0.0
    torch_err = (ref.double() - ref64).abs().max().item() if ref.numel() else 0.0
    floor = 4 * torch.finfo(out.dtype).eps * (ref64.abs().max().item() if ref64.numel() else 0)
    assert err <= 2 * torch_err + floor, (
        f"{what}: error {err:.3g} vs PyTorch's {torch_err:.3g} (+{floor:.3g})"
    )


def check_against_unfused(fused: nn.Module, unfused: nn.Module, x: torch.Tensor) -> None:
    """fused(x) and its gradients (to x and to every parameter of `unfused`, which `fused`
    shares) against `unfused` in x's dtype and in float64."""
    params = list(unfused.parameters())
    g = torch.Generator().manual_seed(7)
    x = x.detach().requires_grad_()
    for p in params:
        p.grad = None
    out = fused(x)
    assert out.grad_fn is not None
    gout = torch.randn(out.shape, generator=g).to(out.dtype).to(out.device)
    out.backward(gout)
    assert all(p.grad is not None for p in params), "a parameter got no gradient"
    got = [x.grad, *(p.grad for p in params)]

    ref = unfused(x)
    want = torch.autograd.grad(ref, [x, *params], gout)
    model64 = copy.deepcopy(unfused).double()
    x64 = x.detach().double().requires_grad_()
    ref64 = model64(x64)
    want64 = torch.autograd.grad(ref64, [x64, *model64.parameters()], gout.double())

    assert_close_to_float64("output", out, ref, ref64)
    names = ["x", *(n for n, _ in unfused.named_parameters())]
    for name, a, b, c in zip(names, got, want, want64):
        assert_close_to_float64(f"grad of {name}", a, b, c)


# ------------------------------------------------------------------------------- FusedMLP
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("activation,approximate", ACTIVATIONS)
def test_fused_mlp_matches_its_sequential(backend, activation, approximate):
    _skip(backend)
    torch.manual_seed(0)
    mlp = FusedMLP((24, 40, 16, 8), activation, backend=backend, approximate=approximate)
    mlp = mlp.to(DEVICE)
    seq = mlp.to_sequential()
    assert all(p is q for p, q in zip(mlp.parameters(), seq.parameters()))
    check_against_unfused(mlp, seq, torch.randn(19, 24, device=DEVICE))


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_mlp_half_precision(backend, dtype):
    _skip(backend)
    torch.manual_seed(1)
    mlp = FusedMLP((16, 32, 8), "gelu", backend=backend, device=DEVICE, dtype=dtype)
    assert mlp.layers[0].weight.dtype == dtype
    check_against_unfused(
        mlp, mlp.to_sequential(), torch.randn(2, 5, 16, device=DEVICE, dtype=dtype)
    )


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_fused_mlp_without_bias_and_one_layer(backend):
    _skip(backend)
    torch.manual_seed(2)
    mlp = FusedMLP((12, 20, 6), "silu", bias=False, backend=backend, device=DEVICE)
    assert all(lin.bias is None for lin in mlp.layers)
    assert sorted(mlp.state_dict()) == ["layers.0.weight", "layers.1.weight"]
    check_against_unfused(mlp, mlp.to_sequential(), torch.randn(7, 12, device=DEVICE))
    one = FusedMLP((12, 5), backend=backend, device=DEVICE)
    check_against_unfused(one, one.to_sequential(), torch.randn(3, 12, device=DEVICE))


def test_fused_mlp_initialises_like_nn_linear():
    torch.manual_seed(3)
    mlp = FusedMLP((10, 30, 20, 4), "relu")
    torch.manual_seed(3)
    linears = [nn.Linear(10, 30), nn.Linear(30, 20), nn.Linear(20, 4)]
    for lin, ref in zip(mlp.layers, linears):
        assert type(lin) is nn.Linear
        assert torch.equal(lin.weight, ref.weight) and torch.equal(lin.bias, ref.bias)
    assert isinstance(mlp.layers, nn.ModuleList)
    assert sorted(mlp.state_dict()) == sorted(
        f"layers.{i}.{k}" for i in range(3) for k in ("weight", "bias")
    )
    assert mlp.widths == [10, 30, 20, 4]


def test_fused_mlp_state_dict_both_ways():
    torch.manual_seed(4)
    seq = nn.Sequential(nn.Linear(12, 20), nn.GELU(), nn.Linear(20, 9), nn.GELU(), nn.Linear(9, 6))
    mlp = FusedMLP((12, 20, 9, 6), "gelu", approximate="none", backend="torch")
    missing, unexpected = mlp.load_sequential_state_dict(seq.state_dict())
    assert missing == [] and unexpected == []
    x = torch.randn(3, 12)
    torch.testing.assert_close(mlp(x), seq(x), rtol=0, atol=0)
    # ... and back: the FusedMLP's own keys, and the Sequential layout through to_sequential().
    twin = FusedMLP((12, 20, 9, 6), "gelu", approximate="none", backend="torch")
    twin.load_state_dict(mlp.state_dict())
    torch.testing.assert_close(twin(x), seq(x), rtol=0, atol=0)
    fresh = nn.Sequential(
        nn.Linear(12, 20), nn.GELU(), nn.Linear(20, 9), nn.GELU(), nn.Linear(9, 6)
    )
    fresh.load_state_dict(mlp.to_sequential().state_dict())
    torch.testing.assert_close(fresh(x), seq(x), rtol=0, atol=0)
    # Other numberings of the Linears (an Identity or a Dropout between) load too.
    odd = nn.Sequential(nn.Linear(12, 20), nn.Identity(), nn.GELU(), nn.Linear(20, 9), nn.GELU(),
                        nn.Linear(9, 6))  # fmt: skip
    mlp.load_sequential_state_dict(odd.state_dict())
    torch.testing.assert_close(mlp(x), FusedMLP.from_sequential(odd, backend="torch")(x))
    with pytest.raises(ValueError, match="holds 2 Linear weight"):
        mlp.load_sequential_state_dict(
            nn.Sequential(nn.Linear(12, 20), nn.Linear(20, 6)).state_dict()
        )
    with pytest.raises(RuntimeError, match="Unexpected key"):
        mlp.load_sequential_state_dict({**seq.state_dict(), "extra": torch.zeros(1)})
    _, unexpected = mlp.load_sequential_state_dict(
        {**seq.state_dict(), "extra": torch.zeros(1)}, strict=False
    )
    assert unexpected == ["extra"]


def test_from_sequential_shares_parameters():
    torch.manual_seed(5)
    seq = nn.Sequential(nn.Linear(6, 10), nn.SiLU(), nn.Linear(10, 8), nn.SiLU(), nn.Linear(8, 3))
    mlp = FusedMLP.from_sequential(seq, backend="torch")
    assert mlp.layers[0] is seq[0] and mlp.layers[2] is seq[4]
    assert mlp.layers[1].weight is seq[2].weight and mlp.layers[1].bias is seq[2].bias
    assert (mlp.activation, mlp.widths) == ("silu", [6, 10, 8, 3])
    x = torch.randn(4, 6)
    torch.testing.assert_close(mlp(x), seq(x), rtol=0, atol=0)
    # An optimizer over the Sequential trains the FusedMLP: they are the same parameters.
    before = mlp(x).detach()
    opt = torch.optim.SGD(seq.parameters(), lr=0.1)
    mlp(x).square().sum().backward()
    opt.step()
    assert not torch.equal(mlp(x), before)
    torch.testing.assert_close(mlp(x), seq(x), rtol=0, atol=0)

    gelu = FusedMLP.from_sequential(
        nn.Sequential(nn.Linear(4, 4), nn.GELU("tanh"), nn.Linear(4, 2))
    )
    assert (gelu.activation, gelu.approximate, gelu.kernel_activation) == (
        "gelu",
        "tanh",
        "gelu_tanh",
    )
    erf = FusedMLP.from_sequential(nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 2)))
    assert erf.kernel_activation == "gelu_erf"
    plain = FusedMLP.from_sequential(nn.Sequential(nn.Linear(4, 4), nn.Identity(), nn.Linear(4, 2)))
    assert plain.activation == "none"
    single = FusedMLP.from_sequential(nn.Sequential(nn.Linear(4, 2)))
    assert single.widths == [4, 2]


class _MyLinear(nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2


@pytest.mark.parametrize(
    "modules,match",
    [
        ([nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3)], r"module '1' \(Tanh\)"),
        ([nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 6), nn.SiLU(), nn.Linear(6, 2)],
         r"module '3' \(silu\) differs from module '1' \(relu\)"),
        ([nn.Linear(6, 6), nn.GELU(), nn.Linear(6, 6), nn.GELU("tanh"), nn.Linear(6, 2)],
         r"module '3' \(gelu\(approximate='tanh'\)\) differs"),
        ([nn.Linear(6, 6), nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 2)],
         r"module '2' \(relu\) differs from nothing between '0' and '1'"),
        ([nn.Linear(6, 10), nn.ReLU(), nn.Linear(7, 3)], "module '2' .* takes 7 features but module '0' gives 10"),
        ([nn.Linear(6, 6), nn.ReLU()], "module '1' follows the last nn.Linear"),
        ([nn.ReLU(), nn.Linear(6, 6)], "module '0' .* must sit between two"),
        ([nn.Linear(6, 6), nn.ReLU(), nn.ReLU(), nn.Linear(6, 6)], "module '2' .* must sit between two"),
        ([nn.Linear(6, 6), nn.Dropout(0.1), nn.Linear(6, 6)], r"module '1' \(Dropout\)"),
        ([nn.Linear(6, 6), nn.ReLU(), _MyLinear(6, 6)], "module '2': _MyLinear overrides nn.Linear.forward"),
        ([], "has no nn.Linear"),
    ],
)  # fmt: skip
def test_from_sequential_names_what_does_not_fit(modules, match):
    with pytest.raises(ValueError, match=match):
        FusedMLP.from_sequential(nn.Sequential(*modules))


def test_from_linears_and_hooks_are_checked():
    with pytest.raises(ValueError, match="layer 0 gives 10 features but layer 1 takes 7"):
        FusedMLP.from_linears([nn.Linear(6, 10), nn.Linear(7, 2)])
    with pytest.raises(ValueError, match="share one dtype and device"):
        FusedMLP.from_linears([nn.Linear(6, 6), nn.Linear(6, 2, dtype=torch.float16)])
    with pytest.raises(TypeError, match="layer 1 must be an nn.Linear"):
        FusedMLP.from_linears([nn.Linear(6, 6), nn.ReLU()])
    hooked = nn.Linear(6, 6)
    hooked.register_forward_hook(lambda m, i, o: o * 0)
    with pytest.raises(ValueError, match="forward hooks"):
        FusedMLP.from_sequential(nn.Sequential(hooked, nn.ReLU(), nn.Linear(6, 2)))
    with pytest.raises(TypeError, match="nn.Sequential"):
        FusedMLP.from_sequential([nn.Linear(6, 6)])


def test_constructor_arguments_are_checked():
    with pytest.raises(ValueError, match="activation must be one of"):
        FusedMLP((4, 4), "tanh")
    with pytest.raises(ValueError, match="approximate must be 'tanh' or 'none'"):
        FusedMLP((4, 4), "gelu", approximate="erf")
    with pytest.raises(TypeError, match="bias must be True or False"):
        FusedMLP((4, 4), "gelu", "none")  # approximate passed by position
    with pytest.raises(ValueError, match="at least two positive ints"):
        FusedMLP((4,))
    with pytest.raises(ValueError, match="at least two positive ints"):
        FusedMLP((4, 0, 2))
    with pytest.raises(TypeError, match="sequence of ints"):
        FusedMLP(4)
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        FusedMLP((4, 4), backend="gpu")
    with pytest.raises(ValueError, match="approximate must be"):
        LinearGELU(4, 4, approximate="erf")
    with pytest.raises(ValueError, match="unknown backend"):
        LinearGELU(4, 4, backend="tpu")


def test_extra_repr():
    text = repr(FusedMLP((12, 20, 6), "gelu", approximate="none", backend="triton"))
    assert "widths=[12, 20, 6], activation=gelu(approximate='none'), backend='triton'" in text
    assert "(0): Linear(in_features=12, out_features=20, bias=True)" in text
    assert "activation=relu, backend='auto'" in repr(FusedMLP((3, 3)))
    text = repr(LinearGELU(4, 5, bias=False))
    assert "in_features=4, out_features=5, bias=False, approximate='tanh', backend='auto'" in text


# ----------------------------------------------------------------------------- LinearGELU
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_linear_gelu_module(backend, approximate):
    _skip(backend)
    torch.manual_seed(6)
    lin = nn.Linear(20, 12).to(DEVICE)
    mod = LinearGELU.from_linear(lin, approximate=approximate, backend=backend)
    assert mod.weight is lin.weight and mod.bias is lin.bias
    assert sorted(mod.state_dict()) == ["bias", "weight"]
    check_against_unfused(
        mod, nn.Sequential(lin, nn.GELU(approximate)), torch.randn(2, 5, 20, device=DEVICE)
    )


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_linear_gelu_without_bias(backend):
    _skip(backend)
    torch.manual_seed(7)
    mod = LinearGELU(16, 8, bias=False, backend=backend, device=DEVICE)
    assert mod.bias is None and mod.weight.shape == (8, 16)
    lin = nn.Linear(16, 8, bias=False, device=DEVICE)
    lin.weight = mod.weight  # the same Parameter
    check_against_unfused(
        mod, nn.Sequential(lin, nn.GELU("tanh")), torch.randn(6, 16, device=DEVICE)
    )


def test_linear_gelu_reads_weight_and_bias_wherever_they_live():
    # forward reads its parameter dict first (host time); a plain-tensor weight or bias, or a
    # bias set to None after construction, lives in the module's __dict__ instead and is used
    torch.manual_seed(9)
    mod = LinearGELU(10, 7, device=DEVICE)
    x = torch.randn(3, 10, device=DEVICE)
    weight, bias = torch.randn(7, 10, device=DEVICE), torch.randn(7, device=DEVICE)
    del mod._parameters["weight"], mod._parameters["bias"]
    mod.weight, mod.bias = weight, bias  # (plain tensors: attributes, not parameters)
    assert "bias" in mod.__dict__ and "bias" not in mod._parameters
    gelu = nn.functional.gelu
    torch.testing.assert_close(
        mod(x), gelu(nn.functional.linear(x, weight, bias), approximate="tanh")
    )
    mod.bias = None
    torch.testing.assert_close(mod(x), gelu(nn.functional.linear(x, weight), approximate="tanh"))


def test_linear_gelu_is_nn_linear_compatible():
    torch.manual_seed(8)
    mod = LinearGELU(10, 7)
    torch.manual_seed(8)
    ref = nn.Linear(10, 7)
    assert torch.equal(mod.weight, ref.weight) and torch.equal(mod.bias, ref.bias)
    assert isinstance(mod.weight, nn.Parameter)
    # state_dicts cross both ways: nn.Linear -> LinearGELU and back.
    other = nn.Linear(10, 7)
    mod.load_state_dict(other.state_dict())
    x = torch.randn(3, 10)
    torch.testing.assert_close(mod(x), nn.functional.gelu(other(x), approximate="tanh"))
    back = nn.Linear(10, 7)
    back.load_state_dict(mod.state_dict())
    assert torch.equal(back.weight, other.weight)
    mod.reset_parameters()
    assert not torch.equal(mod.weight, other.weight)
    bound = 1 / 10**0.5
    assert mod.weight.abs().max() <= bound and mod.bias.abs().max() <= bound


# -------------------------------------------------------------------------------- compile
def test_modules_compile_fullgraph():
    torch._dynamo.reset()
    torch.manual_seed(9)
    model = nn.Sequential(
        FusedMLP((8, 16, 4), "relu"), nn.Tanh(), LinearGELU(4, 6), FusedMLP((6, 6), "none")
    ).to(DEVICE)
    x = torch.randn(5, 8, device=DEVICE)
    # aot_eager: Dynamo + AOT autograd without code generation (no C++ compiler needed on CPU).
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    out, ref = compiled(x), model(x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    out.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref.sum().backward()
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-6)


# ---- FusedMLP's inference plan (dualk/nn.py _InferencePlan): later no-grad calls skip the full
# checks and dispatch; every way the plan could go stale must take the full call instead.
def _count_full_calls(monkeypatch):
    """Counts FusedMLP's full calls (each asks dualk.nn._choose_path for its path; planned
    calls do not). A plan of a provisional auto decision (a GPU whose Triton tuner or CUDA build
    is still running) lasts an hour here instead of PROVISIONAL_PLAN_S."""
    from dualk import nn as dnn

    calls = []
    real = dnn._choose_path

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(dnn, "_choose_path", counting)
    monkeypatch.setattr(dnn, "PROVISIONAL_PLAN_S", 3600.0)
    return calls


@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_inference_plan_gives_the_full_calls_answer(backend, mode, monkeypatch):
    if backend != "auto":
        _skip(backend)
    torch.manual_seed(0)
    m = FusedMLP([24, 40, 16, 9], activation="silu", backend=backend, device=DEVICE)
    context = torch.no_grad if mode == "no_grad" else torch.inference_mode
    with context():  # a twin decides the shape class first (on a GPU, dualk.module_choice
        # times the fused path: those calls are not the module's)
        FusedMLP([24, 40, 16, 9], activation="silu", backend=backend, device=DEVICE)(
            torch.randn(33, 24, device=DEVICE)
        )
    calls = _count_full_calls(monkeypatch)
    with context():
        x = torch.randn(33, 24, device=DEVICE)
        full = m(x)
        planned = [m(x) for _ in range(3)]
        other_rows = m(torch.randn(40, 24, device=DEVICE))  # same rows bucket: planned too
    assert len(calls) == 1, f"{len(calls)} full calls; later calls should take the plan"
    for out in planned:
        assert torch.equal(out, full)
    ref = m.to_sequential()(torch.randn(1, 24, device=DEVICE))  # the module still works
    assert ref.shape == (1, 9) and other_rows.shape == (40, 9)


def test_inference_plan_follows_parameter_changes(monkeypatch):
    torch.manual_seed(1)
    m = FusedMLP([16, 32, 8], backend="torch", device=DEVICE)
    seq = m.to_sequential()  # shares the parameters
    x = torch.randn(5, 16, device=DEVICE)
    calls = _count_full_calls(monkeypatch)
    with torch.no_grad():
        m(x)
        m.layers[0].weight.mul_(0.5)  # in place (an optimizer step): the plan stays valid
        assert torch.allclose(m(x), seq(x), atol=1e-5, rtol=1e-5)
        assert len(calls) == 1
        m.layers[1].weight = nn.Parameter(torch.randn(8, 32, device=DEVICE))  # replaced
        assert torch.allclose(m(x), m.to_sequential()(x), atol=1e-5, rtol=1e-5)
        assert len(calls) == 2
        m.layers[1].bias.data = torch.randn(8, device=DEVICE)  # new storage, same object
        assert torch.allclose(m(x), m.to_sequential()(x), atol=1e-5, rtol=1e-5)
        assert len(calls) == 3
        # Another dtype at the same address (a .data assignment of a reinterpreting view): the
        # dtype check of the full call, never the plan's launcher on reinterpreted bytes.
        buf = torch.randn(8 * 32, device=DEVICE)
        m.layers[1].weight.data = buf.view(8, 32)
        m(x)
        assert len(calls) == 4
        m.layers[1].weight.data = buf.view(torch.bfloat16)[: 8 * 32].view(8, 32)
        with pytest.raises(TypeError, match="dtype"):
            m(x)
        m.layers[1].weight.data = buf.view(8, 32)
        m.to(torch.bfloat16)  # new dtype: a float32 x is an error again, never a silent answer
        with pytest.raises(TypeError, match="dtype"):
            m(x)
        out = m(x.to(torch.bfloat16))
        assert out.dtype == torch.bfloat16


def test_inference_plan_steps_aside(monkeypatch):
    """Gradients to record, a non-contiguous or 3-dim x, another module backend, and an
    environment override set after planning all take the full call."""
    torch.manual_seed(2)
    m = FusedMLP([12, 20, 6], device=DEVICE)
    x = torch.randn(7, 12, device=DEVICE)
    calls = _count_full_calls(monkeypatch)
    with torch.no_grad():
        m(x)
        m(x.t().contiguous().t())  # non-contiguous
        m(x.unsqueeze(0))  # 3-dim
    assert len(calls) == 3
    out = m(x)  # gradients on
    assert out.grad_fn is not None and len(calls) == 4
    with torch.no_grad():
        m(x)  # auto decided new keys above (other layouts): plans made before are rebuilt once
        n = len(calls)
        m(x)
        assert len(calls) == n  # planned
        monkeypatch.setenv("DUALK_BACKEND_FUSED_MLP", "torch")
        m(x)
        assert len(calls) == n + 1  # the override is honoured by the full call
        monkeypatch.delenv("DUALK_BACKEND_FUSED_MLP")
        m.backend = "torch"
        m(x)
        assert len(calls) == n + 2


def test_inference_plan_is_not_pickled():
    torch.manual_seed(3)
    m = FusedMLP([8, 8, 4], device=DEVICE)
    with torch.no_grad():
        m(torch.randn(3, 8, device=DEVICE))
    copied = copy.deepcopy(m)
    assert "_plan" not in copied.__dict__
    with torch.no_grad():
        x = torch.randn(3, 8, device=DEVICE)
        assert torch.equal(copied(x), m(x))


def test_torch_export_keeps_dualk_ops_with_a_dynamic_batch():
    """torch.export of a model using dualk's modules and ops: one dualk custom-op node per call
    (no decomposition into PyTorch ops), a dynamic batch dimension, and the eager answer."""

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = dualk.nn.LinearGELU(8, 16)
            self.mlp = dualk.nn.FusedMLP((16, 32, 4), activation="relu")

        def forward(self, x):
            h = self.mlp(self.block(x))
            return dualk.add(h, dualk.relu_scale(h, 2.0))

    torch.manual_seed(0)
    model = Model().to(DEVICE)
    x = torch.randn(5, 8, device=DEVICE)
    batch = torch.export.Dim("batch")
    program = torch.export.export(model, (x,), dynamic_shapes={"x": {0: batch}})
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert targets == ["dualk.linear_gelu.default", "dualk.fused_mlp.default",
                       "dualk.relu_scale.default", "dualk.add.default"], targets  # fmt: skip
    with torch.no_grad():
        for rows in (5, 11):
            x = torch.randn(rows, 8, device=DEVICE)
            # (auto may pick another backend between the two calls on a GPU, while the background
            # tuner finishes: same values within fp32 rounding)
            torch.testing.assert_close(program.module()(x), model(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_activation_checkpointing_gives_the_same_gradients(backend, use_reentrant):
    """torch.utils.checkpoint over a FusedMLP (the forward runs again in the backward): the
    gradients of the parameters and the input equal those of the nn.Linear stack."""
    from torch.utils.checkpoint import checkpoint

    _skip(backend)
    torch.manual_seed(0)
    module = FusedMLP((8, 16, 4), activation="gelu", backend=backend).to(DEVICE)
    reference = module.to_sequential()
    x = torch.randn(6, 8, device=DEVICE, requires_grad=True)
    checkpoint(module, x, use_reentrant=use_reentrant).square().sum().backward()
    ours = [t.grad.clone() for t in (*module.parameters(), x)]
    for t in (*module.parameters(), x):
        t.grad = None
    reference(x).square().sum().backward()
    for g, t in zip(ours, (*module.parameters(), x)):
        torch.testing.assert_close(g, t.grad, rtol=1e-4, atol=1e-5)


def test_inference_plan_checks_the_device_of_every_call():
    """A planned module called with x on another non-CUDA device (get_device() is -1 for all of
    them) raises the same DeviceMismatchError as its first call, not an ATen error."""
    m = FusedMLP([4, 6, 3], device=DEVICE)
    x = torch.randn(5, 4, device=DEVICE)
    with torch.no_grad():
        m(x)
        m(x)
        assert "_plan" in m.__dict__
        with pytest.raises(dualk.DeviceMismatchError, match="'x' is on meta"):
            m(x.to("meta"))


def test_activation_set_after_construction_is_followed():
    """activation / approximate set on a built (and planned) module: forward, to_sequential and
    the repr agree, and a bad value raises at the assignment."""
    torch.manual_seed(4)
    m = FusedMLP([6, 10, 4], device=DEVICE)
    x = torch.randn(3, 6, device=DEVICE)
    with torch.no_grad():
        m(x)
        m(x)  # planned with relu
        for activation, approximate in (("gelu", "tanh"), ("gelu", "none"), ("silu", "tanh")):
            m.activation = activation
            m.approximate = approximate
            torch.testing.assert_close(m(x), m.to_sequential()(x), rtol=1e-5, atol=1e-6)
        assert "silu" in repr(m)
    with pytest.raises(dualk.InvalidArgumentError, match="activation"):
        m.activation = "tanh"
    assert m.activation == "silu"


def test_fused_mlp_takes_parameter_lists():
    torch.manual_seed(5)
    ws = nn.ParameterList([nn.Parameter(torch.randn(6, 4)), nn.Parameter(torch.randn(3, 6))])
    bs = nn.ParameterList([nn.Parameter(torch.randn(6)), nn.Parameter(torch.randn(3))])
    ws, bs = ws.to(DEVICE), bs.to(DEVICE)
    x = torch.randn(5, 4, device=DEVICE)
    out = dualk.fused_mlp(x, ws, bs)
    assert torch.equal(out, dualk.fused_mlp(x, list(ws), list(bs)))
    out.sum().backward()
    assert ws[0].grad is not None and bs[1].grad is not None


@pytest.mark.parametrize("cls,args", [(FusedMLP, ((4, 8, 2),)), (LinearGELU, (4, 8))])
def test_modules_refuse_a_dtype_no_kernel_takes(cls, args):
    """A float64 or integer module could never run a forward: the constructor says so."""
    for dtype in (torch.float64, torch.int32):
        with pytest.raises(
            dualk.DtypeError, match="dtype must be None, float32, float16 or bfloat16"
        ):
            cls(*args, dtype=dtype)
    assert next(cls(*args, dtype=torch.bfloat16).parameters()).dtype == torch.bfloat16


# ---- FusedMLP's C++ fast path (dualk/nn.py _FastPath, cuda_src/binding_mlp.cpp MlpPlan): GPU only
def _fast_module(dtype=torch.float16, widths=(100, 128, 64, 10), backend="cuda"):
    _skip("cuda")
    torch.manual_seed(3)
    m = FusedMLP(list(widths), backend=backend, device=DEVICE, dtype=dtype)
    x = torch.randn(32, widths[0], device=DEVICE, dtype=dtype)
    with torch.no_grad():
        full = m(x)
        m(x)  # the plan (and its fast path) exist from here on
    assert "_fast" in m.__dict__, "the CUDA plan made no fast path"
    return m, x, full


class _CountingPlan:
    """Wraps a C++ MlpPlan: appends True to `served` for each call it served (a declined call
    appends nothing); the copies with_call_guards makes (dualk.fuse's one-MLP model) count too."""

    def __init__(self, real, served):
        self.real, self.served = real, served

    def run(self, x):
        return self._count(self.real.run(x))

    def run_in_forward(self, x):
        return self._count(self.real.run_in_forward(x))

    def with_call_guards(self, guards):
        return _CountingPlan(self.real.with_call_guards(guards), self.served)

    def guards_hold(self):
        return self.real.guards_hold()

    def _count(self, out):
        if out is not None:
            self.served.append(True)
        return out


def _fast_calls(m) -> list:
    """Counts the calls the fast path served (one True each)."""
    fast = m.__dict__["_fast"]
    served: list = []
    # A new fast path object over the counting plan (dualk.fuse's one-MLP model makes its
    # guarded copy of the plan again for a new object)
    m.__dict__["_fast"] = dualk.nn._FastPath(
        _CountingPlan(fast.plan, served), fast.owner, fast.tf32, fast.buckets, fast.poison
    )
    return served


def test_fast_path_module_and_fused_model_are_collected():
    # The C++ plan holds its module's __dict__ (guards) and sits in it: a cycle the garbage
    # collector breaks only because MlpPlan takes part in collection (cuda_src/plan_guards.h
    # plan_gc_type_setup); the fuse'd one-MLP model's guarded copy too.
    import gc
    import weakref

    m, x, _ = _fast_module()
    model = nn.Sequential(nn.Linear(100, 128), nn.ReLU(), nn.Linear(128, 10)).to(DEVICE).half()
    fused = dualk.fuse(model, backend="cuda")
    with torch.no_grad():
        for _ in range(3):
            fused(x)
    (inner,) = [q for q in fused.modules() if isinstance(q, FusedMLP)]
    assert "_fast" in inner.__dict__ and fused.forward.graph_fast is not None
    alive = [weakref.ref(m), weakref.ref(fused), weakref.ref(inner)]
    del m, fused, inner, model
    gc.collect()
    assert [ref() for ref in alive] == [None, None, None]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fast_path_gives_the_full_calls_answer(dtype, monkeypatch):
    m, x, full = _fast_module(dtype)
    served = _fast_calls(m)
    with torch.no_grad():
        outs = [m(x) for _ in range(3)]
    assert served == [True] * 3
    for out in outs:
        assert torch.equal(out, full)
    seq = m.to_sequential()
    with torch.no_grad():
        ref = seq.double()(x.double())
    tol = {torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 8e-2}[dtype]
    assert torch.allclose(outs[0].double(), ref, atol=tol, rtol=tol)


def test_fast_path_steps_aside_for_what_it_cannot_serve(monkeypatch):
    m, x, full = _fast_module()
    served = _fast_calls(m)
    hooked = []
    with torch.no_grad():
        assert torch.equal(m(x), full) and served == [True]
        handle = m.register_forward_hook(lambda *a: hooked.append(1))
        # a hook: nn.Module's call, whose forward takes the plan
        assert torch.equal(m(x), full) and served == [True, True] and hooked == [1]
        handle.remove()
        m(x.float().half().t().contiguous().t())  # strided: the full call
        m(torch.randn(300, 100, device=DEVICE, dtype=torch.float16))  # another rows bucket
    assert served == [True, True]
    served = _fast_calls(m)  # (the new bucket's full call made a new fast path)
    m(x)  # gradients on: the autograd route, not the plan
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        m(x)
    assert served == []
    with torch.no_grad():
        assert torch.equal(m(x), full) and served == [True]


def test_fast_path_follows_parameter_changes():
    m, x, full = _fast_module()
    seq = m.to_sequential()  # shares the parameters
    with torch.no_grad():
        m.layers[0].weight.mul_(0.5)  # in place: still served, with the new values
        assert torch.allclose(m(x), seq(x), atol=2e-2, rtol=2e-2)
        m.layers[1].weight = nn.Parameter(torch.randn_like(m.layers[1].weight))  # replaced
        assert torch.allclose(m(x), m.to_sequential()(x), atol=2e-2, rtol=2e-2)
        m.layers[2] = nn.Linear(64, 10, device=DEVICE, dtype=torch.float16)  # layer replaced
        assert torch.allclose(m(x), m.to_sequential()(x), atol=2e-2, rtol=2e-2)
        m.layers[0].bias = None  # bias removed
        assert torch.allclose(m(x), m.to_sequential()(x), atol=2e-2, rtol=2e-2)
        m.layers[1].weight.data = m.layers[1].weight.data.float()  # .data: another dtype
        with pytest.raises(dualk.DtypeError):
            m(x)  # the full call's dtype check, not a launch on float32 weights
    m.float()
    with torch.no_grad():
        assert torch.allclose(m(x.float()), m.to_sequential()(x.float()), atol=1e-3, rtol=1e-3)


def test_fast_path_follows_the_poisoning_switch_and_the_backend(monkeypatch):
    from dualk.core import alloc as _alloc

    m, x, full = _fast_module()
    served = _fast_calls(m)
    planned = _alloc.poisoning()  # the test suite poisons: the plan NaN-fills its outputs
    monkeypatch.setattr(_alloc, "_poison", not planned)
    with torch.no_grad():
        assert torch.equal(m(x), full)
    assert served == []  # planned under the other switch: the Python path
    monkeypatch.setattr(_alloc, "_poison", planned)
    with torch.no_grad():
        m(x)  # (a full call plans again: a new fast path)
    served = _fast_calls(m)
    with torch.no_grad():
        assert torch.equal(m(x), full)
    assert served == [True]
    m.backend = "torch"
    with torch.no_grad():
        assert torch.allclose(m(x), full, atol=2e-2, rtol=2e-2)
    assert served == [True]
    m.backend = "cuda"
    with torch.no_grad():
        m(x)  # (planned again under backend="cuda")
    served = _fast_calls(m)
    with torch.no_grad(), dualk.use_backend("torch"):  # a scope: named backends keep their plan
        assert torch.equal(m(x), full)
    assert served == [True]


def test_module_call_takes_the_plan_without_nn_modules_call(monkeypatch):
    # FusedMLP.__call__ serves a call from its C++ plan (on a GPU: _FastPath) before nn.Module's
    # call, where that would only call forward; hooks, torch.fx tracing and torch.compile still
    # see a module called as before. On the CPU the plan is a stand-in that counts its calls.
    torch.manual_seed(11)
    m = FusedMLP([8, 16, 4])
    x = torch.randn(3, 8)
    planned = torch.full((3, 4), 7.0)
    served, forwards, hooked = [], [], []

    real_forward = FusedMLP.forward

    def counting_forward(self, arg):
        forwards.append(1)
        return real_forward(self, arg)

    monkeypatch.setattr(FusedMLP, "forward", counting_forward)
    stand_in_fast_path(m, x, planned, served)
    with torch.no_grad():
        assert m(x) is planned and served == [True] and forwards == []
        handle = m.register_forward_hook(lambda *a: hooked.append(1))
        assert m(x) is planned  # a hook: nn.Module's call, whose forward takes the plan
        assert hooked == [1] and forwards == [1] and served == [True, True]
        handle.remove()
        pre = m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
        assert m(x) is planned and served[-1] is False  # the hook's input reached the plan
        pre.remove()

    # torch.fx sees a module call (FusedMLP a leaf, as dualk.fuse traces it), not the plan
    class Tracer(torch.fx.Tracer):
        def is_leaf_module(self, mod, name):
            return isinstance(mod, FusedMLP) or super().is_leaf_module(mod, name)

    graph = Tracer().trace(nn.Sequential(m, nn.ReLU()))
    assert [n.op for n in graph.nodes].count("call_module") == 2
    assert len(served) == 3
    # gradients on: the plan declines (the stand-in serves anything, so forget it first)
    del m.__dict__["_fast"]
    out = m(x)
    assert out.requires_grad and len(forwards) == 3
    with torch.no_grad():
        ref = m.to_sequential().double()(x.double())
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_module_call_plan_steps_aside_for_every_change(monkeypatch):
    # The state FusedMLP's fast path is planned under, as the guards its C++ plan checks on
    # every call (dualk/nn.py _fast_guards, call_guards; dualk/core/guards.py): on the CPU a
    # stand-in plan checks the same guards in Python. A change by any route after planning
    # makes the plan decline: the poisoning switch, the module's backend, auto's decisions
    # (forgotten) and overrides (environment, scope, process default), torch.func transforms,
    # TF32, an absorbed Dropout that drops, hooks (their call: forward then takes the plan).
    from dualk.core import alloc as _alloc

    torch.manual_seed(12)
    m = FusedMLP([8, 16, 4])
    x = torch.randn(3, 8)
    planned = torch.full((3, 4), 7.0)
    log: list = []

    def install(module=m, tf32=None) -> bool:
        return stand_in_fast_path(module, x, planned, log, tf32)

    def served(module=m, arg=x) -> bool:
        with torch.no_grad():
            return module(arg) is planned

    # (a declined call runs the full call, which plans afresh: installed again after each)
    assert install() and served()
    monkeypatch.setattr(_alloc, "_poison", not _alloc.poisoning())
    assert not served()
    monkeypatch.undo()
    assert install() and served()
    m.backend = "torch"
    assert not served()
    m.backend = "auto"
    assert install() and served()
    autotune.clear_memory()  # auto's decisions forgotten: a new generation
    assert not served()
    assert install()
    monkeypatch.setenv("DUALK_BACKEND", "torch")
    assert not served() and not install()
    monkeypatch.delenv("DUALK_BACKEND")
    monkeypatch.setenv("DUALK_BACKEND_FUSED_MLP", "cuda")
    assert not install()
    monkeypatch.delenv("DUALK_BACKEND_FUSED_MLP")
    assert install()
    with dualk.use_backend("torch"):  # a scoped override
        assert not served()
    assert install()
    dualk.set_default_backend("torch")
    try:
        assert not served()
    finally:
        dualk.set_default_backend(None)
    assert install() and served()
    with torch.no_grad():
        out = torch.func.vmap(m)(torch.randn(2, 3, 8))  # a transform: the full call
    assert out.shape == (2, 3, 4) and not (out == 7.0).all()
    # an fp32 plan under the TF32 switch as planned
    tf32 = autotune.tf32_allowed()
    assert install(tf32=tf32) and served()
    torch.backends.cuda.matmul.allow_tf32 = not tf32
    try:
        assert autotune.tf32_allowed() is not tf32 and not served()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    assert install(tf32=tf32) and served()
    # a layer appended or replaced after planning: the plan declines (the full call then
    # explains or runs the new stack)
    assert install() and served()
    m.layers.append(nn.Linear(4, 4))
    assert not served()
    del m.layers[2]
    assert install() and served()
    m.layers[1] = nn.Linear(16, 4)
    assert not served()
    assert install() and served()
    # hooks: nn.Module's call runs them, then forward takes the plan
    hooked: list = []
    handle = m.register_forward_hook(lambda *a: hooked.append(1))
    n = len(log)
    assert served() and hooked == [1] and len(log) == n + 1
    handle.remove()
    # dualk.fuse's shared FusedMLP with an absorbed Dropout: served in eval, not when it drops
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 4))
    fused = dualk.fuse(model).eval()
    (inner,) = [q for q in fused.modules() if isinstance(q, FusedMLP)]
    assert install(inner) and served(inner)
    fused.train()  # (its Dropout is not its child: the guard reads the Dropout itself)
    assert not served(inner) and not install(inner)
    fused.eval()
    assert install(inner) and served(inner)
    (drop,) = [q for q in fused.modules() if isinstance(q, nn.Dropout)]
    drop.p = 0.25  # (a changed p: declined too)
    assert not served(inner)


def test_fast_path_serves_a_fused_model():
    _skip("cuda")
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(100, 128), nn.ReLU(), nn.Linear(128, 10)).to(DEVICE).half()
    fused = dualk.fuse(model, backend="cuda")
    x = torch.randn(32, 100, device=DEVICE, dtype=torch.float16)
    with torch.no_grad():
        outs = [fused(x) for _ in range(3)]
        ref = copy.deepcopy(model).double()(x.double())  # (fused shares model's parameters)
    inner = [m for m in fused.modules() if isinstance(m, FusedMLP)]
    assert len(inner) == 1 and "_fast" in inner[0].__dict__
    for out in outs:
        assert torch.allclose(out.double(), ref, atol=2e-2, rtol=2e-2)
    # A like call runs the plan from the fused model's forward, without FusedMLP.forward; a hook
    # registered on the fused module since then still runs (the module is called as before).
    served = _fast_calls(inner[0])
    forwards, hooked = [], []
    real_forward = FusedMLP.forward

    def counting_forward(self, x):
        forwards.append(1)
        return real_forward(self, x)

    with torch.no_grad(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(FusedMLP, "forward", counting_forward)
        assert torch.equal(fused(x), outs[0])
        assert served == [True] and forwards == []
        handle = inner[0].register_forward_hook(lambda *a: hooked.append(1))
        assert torch.equal(fused(x), outs[0])
        assert hooked == [1] and forwards == [1] and served == [True, True]
        handle.remove()
    # Parameters changed under the plan (shared with model): the plan must not serve them.
    model.double()
    with torch.no_grad(), pytest.raises(dualk.DtypeError, match="float64"):
        fused(x)


def test_a_provisional_decision_is_planned_for_a_while(monkeypatch):
    """While auto's decision for the class is provisional (a CUDA build or Triton tuning in the
    background), the plan serves calls for PROVISIONAL_PLAN_S, then a full call asks again."""
    from dualk import nn as dnn
    from dualk.dispatch import autotune

    torch.manual_seed(5)
    m = FusedMLP([10, 16, 4], device=DEVICE)
    x = torch.randn(6, 10, device=DEVICE)
    monkeypatch.setattr(autotune, "decided", lambda spec, args: None)
    monkeypatch.setattr(autotune, "provisional_winner", lambda spec, args: "torch")
    monkeypatch.setattr(dnn, "_choose_path", lambda *a: "fused")  # (no module_choice timing)
    now = [1000.0]
    monkeypatch.setattr(dnn, "_monotonic", lambda: now[0])
    full = []
    real = dnn.ops.fused_mlp
    monkeypatch.setattr(dnn.ops, "fused_mlp", lambda *a, **k: (full.append(1), real(*a, **k))[1])
    with torch.no_grad():
        ref = m(x)
        assert _close(m(x), ref) and len(full) == 1  # planned, provisionally
        now[0] += dnn.PROVISIONAL_PLAN_S + 0.01
        assert _close(m(x), ref) and len(full) == 2  # expired: the full call asks again
        assert _close(m(x), ref) and len(full) == 2  # planned again
    assert "_fast" not in m.__dict__  # a provisional plan never takes the C++ fast path


@pytest.mark.parametrize("mode", ["infer", "train"])
def test_module_choice_margin_and_training_step(mode, monkeypatch):
    """dualk.module_choice's measurement with a fake timer (no GPU needed): the fused path must
    beat the original by MARGIN for inference and by the larger MARGIN_TRAIN for training, whose
    passes run forward + backward as a step does (gradients accumulated into the leaves' .grad,
    then dropped), with ROUNDS["train"] passes."""
    from dualk import module_choice

    fused_us = 96.0  # 4% faster than the original's 100: kept for inference, not for training
    calls: dict[str, int] = {}
    grads_after: list[bool] = []

    def timer(run, label, budget_ms):
        run()
        calls[label] = calls.get(label, 0) + 1
        grads_after.append(any(t.grad is not None for t in leaves))
        us = fused_us if label == "module:fused" else 100.0
        return us, us

    leaves: list[torch.Tensor] = []
    real_random = module_choice._random_parameters

    def keep(shape, device, grad):
        weights, biases = real_random(shape, device, grad)
        leaves.extend(t for t in (*weights, *biases) if t is not None)
        return weights, biases

    shape = module_choice.Shape("mlp", (8, 16, 4), "relu", (True, True), "torch.float32", "cpu")
    monkeypatch.setattr(module_choice, "_random_parameters", keep)
    autotune.set_timer(timer)
    try:
        details = module_choice._measure(mode, shape, 32, False, torch.device("cpu"))
    finally:
        autotune.set_timer(None)
    assert details["path"] == ("fused" if mode == "infer" else "original"), details
    assert calls == {"module:fused": module_choice.ROUNDS[mode],
                     "module:original": module_choice.ROUNDS[mode]}  # fmt: skip
    assert not any(grads_after)  # each training pass leaves no gradient behind
