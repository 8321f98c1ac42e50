"""dualk.nn modules and dualk.fuse on real nn.Module models: outputs against the float64
reference of the unfused model, parameters shared (not copied), state_dict compatibility both
ways, gradients reaching the original parameters, and fuse()'s report."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE
from torch import nn

import dualk
from dualk.backends import unavailable_reason
from dualk.fuse import fuse
from dualk.nn import FusedMLP, LinearGELU

BACKENDS = ("torch", "triton", "cuda")


def _skip(backend):
    reason = unavailable_reason(backend, DEVICE)
    if reason is not None:
        pytest.skip(reason)


def _close_to_float64(model: nn.Module, out: torch.Tensor, x: torch.Tensor) -> None:
    """out within 2x the float32 model's own error against the float64 model (+4 ulps)."""
    ref32 = model(x).double()
    with torch.no_grad():
        ref64 = _double_copy(model)(x.double())
    err = (out.double() - ref64).abs().max().item()
    torch_err = (ref32 - ref64).abs().max().item()
    floor = 4 * torch.finfo(torch.float32).eps * ref64.abs().max().item()
    assert err <= 2 * torch_err + floor, f"error {err:.3g} vs PyTorch's {torch_err:.3g}"


def _double_copy(model):
    import copy

    return copy.deepcopy(model).double()


class DNNModel(nn.Module):
    """The seed article's model: a hand-written forward over named layers."""

    def __init__(self):
        super().__init__()
        self.layer1 = nn.Linear(100, 128)
        self.relu1 = nn.ReLU()
        self.layer2 = nn.Linear(128, 64)
        self.relu2 = nn.ReLU()
        self.layer3 = nn.Linear(64, 10)

    def forward(self, x):
        x = self.relu1(self.layer1(x))
        x = self.relu2(self.layer2(x))
        return self.layer3(x)


class Branchy(nn.Module):
    """`h` feeds two Linears: no chain may run across it."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 16)
        self.c, self.d = nn.Linear(16, 4), nn.Linear(16, 4)

    def forward(self, x):
        h = F.relu(self.a(x))
        return self.c(F.gelu(self.b(h), approximate="tanh")) + self.d(h)


class Functional(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.c(F.silu(self.b(F.silu(self.a(x)))))


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.c(torch.relu(self.b(F.silu(self.a(x)))))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "activation,approximate",
    [("relu", "tanh"), ("gelu", "tanh"), ("gelu", "none"), ("silu", "tanh"), ("none", "tanh")],
)
def test_fused_mlp_module_matches_its_sequential(backend, activation, approximate):  # fmt: skip
    _skip(backend)
    torch.manual_seed(0)
    mlp = FusedMLP((24, 40, 16, 8), activation, approximate, backend=backend).to(DEVICE)
    seq = mlp.to_sequential()
    assert all(p is q for p, q in zip(mlp.parameters(), seq.parameters()))
    x = torch.randn(19, 24, device=DEVICE)
    out = mlp(x)
    assert out.grad_fn is not None
    _close_to_float64(seq, out, x)
    out.square().sum().backward()
    grads = [p.grad.clone() for p in mlp.parameters()]
    mlp.zero_grad()
    seq(x).square().sum().backward()
    for g, p in zip(grads, seq.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5)


def test_fused_mlp_state_dict_is_an_nn_linear_stack():
    mlp = FusedMLP((12, 20, 6), "gelu", "none")
    assert sorted(mlp.state_dict()) == ["layers.0.bias", "layers.0.weight", "layers.1.bias", "layers.1.weight"]  # fmt: skip
    seq = nn.Sequential(nn.Linear(12, 20), nn.GELU(), nn.Linear(20, 6))
    mlp.load_sequential_state_dict(seq.state_dict())
    x = torch.randn(3, 12)
    torch.testing.assert_close(mlp(x), seq(x), rtol=0, atol=0)
    twin = FusedMLP((12, 20, 6), "gelu", "none")
    twin.load_state_dict(mlp.state_dict())
    torch.testing.assert_close(twin(x), seq(x), rtol=0, atol=0)
    assert "widths=[12, 20, 6]" in repr(mlp) and "gelu(approximate='none')" in repr(mlp)


def test_from_sequential_shares_parameters_and_rejects_what_does_not_fit():
    seq = nn.Sequential(nn.Linear(6, 10), nn.SiLU(), nn.Linear(10, 3))
    mlp = FusedMLP.from_sequential(seq)
    assert mlp.layers[0].weight is seq[0].weight and mlp.activation == "silu"
    x = torch.randn(4, 6)
    torch.testing.assert_close(mlp(x), seq(x), rtol=0, atol=0)
    with pytest.raises(ValueError, match="Tanh"):
        FusedMLP.from_sequential(nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3)))
    with pytest.raises(ValueError, match="all activations must be the same"):
        FusedMLP.from_sequential(
            nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 6), nn.SiLU(), nn.Linear(6, 2))
        )
    with pytest.raises(ValueError, match="trailing activation"):
        FusedMLP.from_sequential(nn.Sequential(nn.Linear(6, 6), nn.ReLU()))
    with pytest.raises(ValueError, match="layer 0 gives 10 features but layer 1 takes 7"):
        FusedMLP.from_linears([nn.Linear(6, 10), nn.Linear(7, 2)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_gelu_module(backend):
    _skip(backend)
    torch.manual_seed(1)
    lin = nn.Linear(20, 12).to(DEVICE)
    mod = LinearGELU.from_linear(lin, approximate="none", backend=backend)
    assert mod.weight is lin.weight and sorted(mod.state_dict()) == ["bias", "weight"]
    x = torch.randn(2, 5, 20, device=DEVICE)
    out = mod(x)
    _close_to_float64(nn.Sequential(lin, nn.GELU()), out, x)
    out.sum().backward()
    assert lin.weight.grad is not None and lin.bias.grad is not None
    fresh = LinearGELU(20, 12, bias=False)
    assert fresh.bias is None and fresh.weight.shape == (12, 20)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_fuse_seed_dnn_model(backend):
    _skip(backend)
    torch.manual_seed(2)
    model = DNNModel().to(DEVICE)
    fused = fuse(model, backend=backend)
    report = fused.dualk_fuse_report
    assert [c.kind for c in report.fused] == ["FusedMLP"]
    assert report.fused[0].widths == [100, 128, 64, 10]
    assert report.fused[0].nodes == ["layer1", "relu1", "layer2", "relu2", "layer3"]
    assert sorted(fused.state_dict()) == sorted(model.state_dict())
    x = torch.randn(32, 100, device=DEVICE)
    out = fused(x)
    _close_to_float64(model, out, x)
    # Training the fused model trains the original's parameters.
    out.sum().backward()
    assert model.layer1.weight.grad is not None
    # A state_dict saved from the fused model loads into a fresh DNNModel.
    fresh = DNNModel().to(DEVICE)
    fresh.load_state_dict(fused.state_dict())
    torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)
    assert "layer1 -> relu1" in str(report)


def test_fuse_sequential_functional_and_branches():
    torch.manual_seed(3)
    seq = nn.Sequential(nn.Linear(16, 32), nn.GELU(approximate="tanh"), nn.Linear(32, 8))
    f = fuse(seq)
    assert f.dualk_fuse_report.fused[0].activation == "gelu(tanh)"
    x = torch.randn(5, 16)
    torch.testing.assert_close(f(x), seq(x), rtol=0, atol=0)

    fm = Functional()
    f = fuse(fm)
    assert f.dualk_fuse_report.fused[0].nodes == ["a", "silu", "b", "silu_1", "c"]
    x8 = torch.randn(7, 8)
    torch.testing.assert_close(f(x8), fm(x8), rtol=0, atol=0)

    br = Branchy()
    f = fuse(br)
    rep = f.dualk_fuse_report
    assert [c.nodes for c in rep.fused] == [["b", "gelu", "c"]]  # a's output is used twice
    assert any("users" in why for _, why in rep.skipped)
    torch.testing.assert_close(f(x8), br(x8), rtol=0, atol=0)

    mixed = Mixed()
    f = fuse(mixed)
    # a -> silu -> b fuses; relu differs, so c stays a plain Linear after it.
    assert [c.nodes for c in f.dualk_fuse_report.fused] == [["a", "silu", "b"]]
    assert any("differs" in why for _, why in f.dualk_fuse_report.skipped)
    torch.testing.assert_close(f(x8), mixed(x8), rtol=0, atol=0)


def test_fuse_single_linear_gelu_and_untraceable_models():
    class OneLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 12)

        def forward(self, x):
            return F.gelu(self.fc(x))

    m = OneLayer()
    f = fuse(m)
    assert f.dualk_fuse_report.fused[0].kind == "LinearGELU"
    x = torch.randn(3, 8)
    torch.testing.assert_close(f(x), m(x), rtol=0, atol=0)

    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))

        def forward(self, x):
            if x.sum() > 0:  # fx cannot trace this
                return self.body(x)
            return -self.body(x)

    dd = DataDependent()
    f = fuse(dd)
    assert "could not trace" in str(f.dualk_fuse_report)
    assert f.dualk_fuse_report.fused[0].name == "body.dualk_fused_mlp_0"
    assert isinstance(dd.body, nn.Sequential)  # the original model is untouched
    torch.testing.assert_close(f(x), dd(x), rtol=0, atol=0)
    assert f.body.get_submodule("0").weight is dd.body[0].weight


def test_modules_compile_fullgraph():
    torch._dynamo.reset()
    model = nn.Sequential(FusedMLP((8, 16, 4), "relu"), nn.Tanh(), LinearGELU(4, 6)).to(DEVICE)
    x = torch.randn(5, 8, device=DEVICE)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)


def test_exported_from_dualk_namespace():
    assert dualk.nn.FusedMLP is FusedMLP and dualk.fuse is fuse
