"""dualk.fuse on real models: the seed's DNNModel (hand-written forward), nn.Sequential,
functional activations, branches and reused intermediates (never fused across), mismatched
activations, what must stay unfused (hooks, subclasses, float64, min_layers), long chains,
untraceable models; outputs and gradients against the float64 reference of the unfused model,
parameters shared, state_dict keys kept, and the report's contents."""

from __future__ import annotations

import copy
import io
import threading

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE
from test_nn import assert_close_to_float64, check_against_unfused
from torch import fx, nn

from dualk.backends import unavailable_reason
from dualk.fuse import FuseReport, fuse
from dualk.nn import FusedMLP, LinearGELU


def _skip(backend):
    reason = unavailable_reason(backend, DEVICE)
    if reason is not None:
        pytest.skip(reason)


def _fused_modules(gm: nn.Module) -> list[nn.Module]:
    return [m for m in gm.modules() if isinstance(m, (FusedMLP, LinearGELU))]


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


class Functional(nn.Module):
    """Activations as calls: F.silu, Tensor.relu, torch.relu, F.relu(inplace=True),
    F.gelu(approximate="tanh")."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 12)
        self.d, self.e, self.f = nn.Linear(12, 12), nn.Linear(12, 12), nn.Linear(12, 6)
        self.g, self.h = nn.Linear(6, 10), nn.Linear(10, 4)

    def forward(self, x):
        x = self.c(F.silu(self.b(F.silu(self.a(x)))))
        x = self.g(F.relu(self.f(torch.relu(self.e(self.d(x * 2).relu()))), inplace=True))
        return F.gelu(self.h(x * 2), approximate="tanh")


class Branchy(nn.Module):
    """`h` feeds two Linears and `u` is used twice: no chain may run across either."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 16)
        self.c, self.d = nn.Linear(16, 4), nn.Linear(16, 4)
        self.e, self.f = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        h = F.relu(self.a(x))
        y = self.c(F.gelu(self.b(h), approximate="tanh")) + self.d(h)
        u = self.e(y)
        return self.f(u) * u


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.c(torch.relu(self.b(F.silu(self.a(x)))))


def _same_objects(a, b) -> bool:
    a, b = list(a), list(b)
    return len(a) == len(b) and all(p is q for p, q in zip(a, b))


def _report(gm) -> FuseReport:
    rep = gm.dualk_fuse_report
    assert isinstance(rep, FuseReport)
    return rep


# ------------------------------------------------------------------------ the seed's model
@pytest.mark.parametrize("backend", ["torch", "triton", "cuda"])
def test_fuse_seed_dnn_model(backend):
    _skip(backend)
    torch.manual_seed(0)
    model = DNNModel().to(DEVICE)
    fused, rep = fuse(model, backend=backend, report=True)
    assert fused.dualk_fuse_report is rep and rep.traced
    assert isinstance(fused, fx.GraphModule)
    [chain] = rep.fused
    assert (chain.kind, chain.widths, chain.activation) == ("FusedMLP", [100, 128, 64, 10], "relu")
    assert chain.nodes == ["layer1", "relu1", "layer2", "relu2", "layer3"]
    assert chain.modules == ["layer1", "layer2", "layer3"] and chain.backend == backend
    assert rep.skipped == []
    text = str(rep)
    assert "1 chain(s) fused" in text and "layer1 -> relu1 -> layer2 -> relu2 -> layer3" in text
    [mlp] = _fused_modules(fused)
    assert mlp.backend == backend and mlp.kernel_activation == "relu"
    # One call does the whole model.
    calls = [n for n in fused.graph.nodes if n.op == "call_module"]
    assert [n.target for n in calls] == [chain.name]

    # The same parameters, the same state_dict keys; the original model is untouched.
    assert fused.layer1.weight is model.layer1.weight and fused.layer3.bias is model.layer3.bias
    assert _same_objects(fused.parameters(), model.parameters())
    assert list(fused.state_dict()) == list(model.state_dict())
    assert type(model.layer1) is nn.Linear and not hasattr(model, "dualk_fuse_report")

    check_against_unfused(fused, model, torch.randn(33, 100, device=DEVICE))

    # A state_dict saved from the fused model loads into a fresh DNNModel, and the other way.
    fresh = DNNModel().to(DEVICE)
    buf = io.BytesIO()
    torch.save(fused.state_dict(), buf)
    buf.seek(0)
    fresh.load_state_dict(torch.load(buf))
    x = torch.randn(4, 100, device=DEVICE)
    torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)
    other = DNNModel().to(DEVICE)
    fused.load_state_dict(other.state_dict())  # copies into the shared parameters
    assert torch.equal(model.layer2.weight, other.layer2.weight)


def test_optimizer_over_the_original_trains_the_fused_model():
    torch.manual_seed(1)
    model = DNNModel()
    fused = fuse(model, backend="torch")
    x = torch.randn(8, 100)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = fused(x).detach()
    fused(x).square().mean().backward()
    opt.step()
    after = fused(x).detach()
    assert not torch.equal(after, before)
    torch.testing.assert_close(after, model(x), rtol=1e-5, atol=1e-6)


def test_inplace_uses_the_models_own_modules():
    model = DNNModel()
    kept = fuse(model, inplace=True)
    assert kept.layer1 is model.layer1
    copied = fuse(model)
    assert copied.layer1 is not model.layer1 and copied.layer1.weight is model.layer1.weight


# ------------------------------------------------------------------- other model shapes
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_fuse_sequential(approximate):
    torch.manual_seed(2)
    seq = nn.Sequential(
        nn.Linear(16, 32), nn.GELU(approximate), nn.Linear(32, 32), nn.GELU(approximate),
        nn.Linear(32, 8),
    ).to(DEVICE)  # fmt: skip
    fused = fuse(seq, backend="triton" if unavailable_reason("triton", DEVICE) is None else "torch")
    [chain] = _report(fused).fused
    assert chain.activation == f"gelu({approximate})" and chain.nodes == ["0", "1", "2", "3", "4"]
    assert _fused_modules(fused)[0].kernel_activation == (
        "gelu_tanh" if approximate == "tanh" else "gelu_erf"
    )
    assert list(fused.state_dict()) == list(seq.state_dict())
    check_against_unfused(fused, seq, torch.randn(5, 16, device=DEVICE))


def test_fuse_functional_activations():
    torch.manual_seed(3)
    model = Functional()
    fused = fuse(model, backend="torch")
    rep = _report(fused)
    assert [(c.kind, c.activation, c.modules) for c in rep.fused] == [
        ("FusedMLP", "silu", ["a", "b", "c"]),
        ("FusedMLP", "relu", ["d", "e", "f", "g"]),
        ("LinearGELU", "gelu(tanh)", ["h"]),
    ]
    assert rep.fused[0].nodes == ["a", "silu", "b", "silu_1", "c"]
    assert rep.fused[1].nodes == ["d", "relu", "e", "relu_1", "f", "relu_2", "g"]
    assert rep.fused[2].nodes == ["h", "gelu"] and rep.skipped == []
    check_against_unfused(fused, model, torch.randn(7, 8))


def test_branches_and_reused_values_are_not_fused_across():
    torch.manual_seed(4)
    model = Branchy()
    fused = fuse(model, backend="torch")
    rep = _report(fused)
    # a's output (after relu) feeds b and d: only b -> gelu -> c is a chain; d, e, f stay.
    assert [c.nodes for c in rep.fused] == [["b", "gelu", "c"]]
    skipped = dict(rep.skipped)
    assert "2 users" in skipped["relu"] and "2 users" in skipped["e"]
    for name in ("a", "d", "e", "f"):
        assert isinstance(getattr(fused, name), nn.Linear)
        assert any(n.op == "call_module" and n.target == name for n in fused.graph.nodes)
    check_against_unfused(fused, model, torch.randn(6, 8))


def test_mismatched_activations():
    torch.manual_seed(5)
    model = Mixed()
    fused = fuse(model, backend="torch")
    rep = _report(fused)
    # a -> silu -> b fuses; relu differs, so c stays a plain Linear after it.
    assert [c.nodes for c in rep.fused] == [["a", "silu", "b"]]
    (where, why), (lone, lone_why) = rep.skipped
    assert where == "relu" and "activation relu differs from silu" in why and "from a" in why
    # every nn.Linear is fused or listed: c, alone after the chain stopped
    assert lone == "c" and "the output" in lone_why
    assert "not fused: relu:" in str(rep)
    check_against_unfused(fused, model, torch.randn(3, 8))


def test_single_linear_gelu_keeps_state_dict_keys():
    class OneLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 12)

        def forward(self, x):
            return F.gelu(self.fc(x))

    torch.manual_seed(6)
    model = OneLayer()
    fused = fuse(model, backend="torch")
    [chain] = _report(fused).fused
    assert (chain.kind, chain.activation) == ("LinearGELU", "gelu(none)")
    assert list(fused.state_dict()) == ["fc.weight", "fc.bias"]
    assert _same_objects(fused.parameters(), [model.fc.weight, model.fc.bias])
    check_against_unfused(fused, model, torch.randn(3, 8))
    # min_layers=2: only FusedMLP chains; the single Linear + GELU is reported, not fused.
    kept = fuse(model, min_layers=2)
    assert _report(kept).fused == []
    assert "fewer than min_layers=2" in _report(kept).skipped[0].reason


def test_min_layers_and_plain_linear_chains():
    seq = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    rep = _report(fuse(seq))
    # Linear -> Linear is a chain with no activation; relu then differs from "none".
    assert [(c.modules, c.activation) for c in rep.fused] == [(["0", "1"], "none")]
    assert "activation relu differs from none" in rep.skipped[0].reason
    three = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    assert _report(fuse(three, min_layers=3)).fused[0].widths == [4, 8, 8, 2]
    assert _report(fuse(three, min_layers=4)).fused == []


def test_long_chains_are_split_into_kernel_sized_pieces():
    torch.manual_seed(7)
    mods = []
    for _ in range(11):
        mods += [nn.Linear(6, 6), nn.SiLU()]
    seq = nn.Sequential(*mods[:-1])
    fused = fuse(seq, backend="torch")
    rep = _report(fused)
    assert [len(c.modules) for c in rep.fused] == [6, 5]
    assert "11 Linears" in rep.notes[0]
    # The SiLU between the pieces still runs.
    assert any(n.op == "call_module" and n.target == "11" for n in fused.graph.nodes)
    check_against_unfused(fused, seq, torch.randn(4, 6))


class Gate(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it."""

    def forward(self, x):
        return x if x.mean() > 0 else x * 0.5


def test_what_must_stay_unfused_is_reported():
    class Doubled(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    hooked = nn.Linear(6, 6)
    hooked.register_forward_pre_hook(lambda m, args: None)
    mods = [
        nn.Linear(6, 6),
        nn.ReLU(),
        Doubled(6, 6),
        nn.ReLU(),
        hooked,
        nn.ReLU(),
        nn.Linear(6, 6),
    ]
    x = torch.randn(2, 6)
    # Traced: fx runs through Doubled's forward (F.linear and a multiplication, no Linear
    # module call); the hooked Linear is a module call, left alone.
    seq = nn.Sequential(*mods)
    fused = fuse(seq)
    rep = _report(fused)
    assert rep.fused == [] and "forward pre-hooks" in dict(rep.skipped)["4"]
    torch.testing.assert_close(fused(x), seq(x), rtol=0, atol=0)
    # Untraceable (Gate): the Sequential's children are leaves, Doubled is seen as a Linear.
    seq = nn.Sequential(*mods, Gate())
    fused = fuse(seq)
    rep = _report(fused)
    assert rep.fused == [] and not rep.traced
    skipped = dict(rep.skipped)
    assert "Doubled overrides nn.Linear.forward" in skipped["2"]
    assert "forward pre-hooks" in skipped["4"]
    torch.testing.assert_close(fused(x), seq(x), rtol=0, atol=0)

    double = DNNModel().double()
    rep = _report(fuse(double))
    assert rep.fused == [] and "torch.float64" in dict(rep.skipped)["layer1"]

    class TwoDtypes(nn.Module):  # fuse only reads the graph here; the model is not run
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4, dtype=torch.bfloat16)

        def forward(self, x):
            return self.b(F.relu(self.a(x)))

    skipped = dict(_report(fuse(TwoDtypes())).skipped)
    assert "must share one dtype and device" in skipped["relu"]
    # every nn.Linear is fused or listed with a reason
    assert "stops at relu" in skipped["a"] and "the output" in skipped["b"]
    assert set(skipped) == {"relu", "a", "b"}


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(100, 100)
        self.unused_p = nn.Parameter(torch.ones(2))  # the forward never reads these
        self.register_buffer("steps", torch.zeros(1))
        self.register_buffer("scratch", torch.zeros(1), persistent=False)


class _Holder(nn.Module):
    """A fused model inside another, a module that shares its name with a second one, a
    parameter and buffers the forward never uses, and a tensor the forward makes."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.block, self.unused = inner, _Block(), nn.Linear(3, 3)
        self.alias = self.block

    def forward(self, x):
        return self.block.fc(self.inner(x).repeat(1, 10)) + torch.ones(100)


def test_fuse_again_and_models_holding_dualk_modules():
    torch.manual_seed(8)
    model = DNNModel()
    once = fuse(model)
    twice = fuse(once)
    assert _report(twice).traced and _report(twice).fused == []
    x = torch.randn(3, 100)
    torch.testing.assert_close(twice(x), model(x), rtol=0, atol=0)
    # The parameters stay registered (the graph calls only the fused module, which holds the
    # Linears in a tuple), at their keys, as the same tensors; so does state the forward never
    # uses (a module, a parameter and buffers of a module it does use, a second name), and a
    # tensor the forward makes adds no key.
    assert list(twice.state_dict()) == list(model.state_dict())
    assert {id(p) for p in twice.parameters()} == {id(p) for p in model.parameters()}
    wrapper = _Holder(once)
    fused = fuse(wrapper)
    assert _report(fused).traced
    assert sorted(fused.state_dict()) == sorted(wrapper.state_dict())
    assert len(list(fused.parameters())) == len(list(wrapper.parameters()))
    torch.testing.assert_close(fused(x), wrapper(x), rtol=0, atol=0)
    holder = nn.Sequential(FusedMLP((4, 8, 4)), nn.Linear(4, 4), nn.GELU("tanh"))
    rep = _report(fuse(holder))
    assert rep.traced and [c.kind for c in rep.fused] == ["LinearGELU"]


def test_fused_model_copies_pickles_and_compiles():
    torch.manual_seed(9)
    model = DNNModel()
    fused = fuse(model, backend="torch")
    x = torch.randn(5, 100)
    ref = model(x)
    clone = copy.deepcopy(fused)
    torch.testing.assert_close(clone(x), ref, rtol=0, atol=0)
    with torch.no_grad():
        clone.layer1.weight.zero_()  # the copy owns its parameters, and its fused module follows
    assert not torch.equal(clone(x), ref) and torch.equal(fused(x), ref)
    buf = io.BytesIO()
    torch.save(fused, buf)
    buf.seek(0)
    torch.testing.assert_close(torch.load(buf, weights_only=False)(x), ref, rtol=0, atol=0)
    torch._dynamo.reset()
    compiled = torch.compile(fused, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), ref, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------- untraceable models
class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
        self.proj = nn.Linear(8, 100)
        self.dnn = DNNModel()

    def forward(self, x):
        h = self.body(x)
        if h.sum() > 0:  # fx cannot trace this
            h = -h
        return self.dnn(self.proj(h))


def test_untraceable_model_has_its_children_fused():
    torch.manual_seed(10)
    model = DataDependent()
    fused = fuse(model, backend="torch")
    rep = _report(fused)
    assert not rep.traced and "could not trace DataDependent" in rep.notes[0]
    assert [(c.name, c.modules) for c in rep.fused] == [
        ("body.dualk_fused_mlp_0", ["body.0", "body.2"]),
        ("dnn.dualk_fused_mlp_0", ["dnn.layer1", "dnn.layer2", "dnn.layer3"]),
    ]
    assert "not traceable: children fused" in str(rep)
    # Still the model's own classes (a Sequential indexes), keys and shared parameters.
    assert type(fused) is DataDependent and type(fused.body) is nn.Sequential
    assert fused.body[0].weight is model.body[0].weight and len(fused.body) == 3
    assert list(fused.state_dict()) == list(model.state_dict())
    assert type(model.body) is nn.Sequential and "forward" not in vars(model.body)
    x = torch.randn(4, 8)
    check_against_unfused(fused, model, x)
    # A Sequential changed after fusing runs its modules as they now are.
    fused.body.append(nn.Tanh())
    torch.testing.assert_close(fused.body(x), torch.tanh(model.body(x)))


def test_untraceable_sequential_and_inplace():
    torch.manual_seed(11)
    seq = nn.Sequential(nn.Linear(6, 12), nn.SiLU(), nn.Linear(12, 6), Gate(), nn.Linear(6, 3))
    x = torch.randn(5, 6)
    ref = seq(x).detach()
    fused = fuse(seq, inplace=True)
    assert fused is seq and "forward" in vars(seq)
    rep = _report(fused)
    assert not rep.traced and rep.fused[0].modules == ["0", "2"]
    assert any("Gate) is not traceable either" in n for n in rep.notes)
    torch.testing.assert_close(fused(x), ref)
    assert _same_objects(fused.parameters(), seq.parameters())


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="unknown backend"):
        fuse(DNNModel(), backend="gpu")
    with pytest.raises(ValueError, match="min_layers"):
        fuse(DNNModel(), min_layers=0)
    with pytest.raises(TypeError, match="expected an nn.Module"):
        fuse(lambda x: x)

    class Locked(DNNModel):
        def __init__(self):
            super().__init__()
            self.lock = threading.Lock()  # deepcopy cannot copy it

    with pytest.raises(ValueError, match="inplace=True"):
        fuse(Locked())
    assert _report(fuse(Locked(), inplace=True)).fused[0].widths == [100, 128, 64, 10]


def test_float64_reference_helper_catches_a_wrong_model():
    # The checks above would notice a fused model that computes something else.
    torch.manual_seed(12)
    seq = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    wrong = FusedMLP.from_sequential(seq)
    wrong.kernel_activation = "gelu_tanh"  # the tanh approximation instead of erf
    x = torch.randn(64, 4)
    with pytest.raises(AssertionError, match="output"):
        assert_close_to_float64("output", wrong(x), seq(x), copy.deepcopy(seq).double()(x.double()))


def test_hooks_on_the_model_itself_are_kept():
    """A forward hook on the model's own module (which a GraphModule would drop): the module is
    kept, with its hooks, and its forward runs the fused graph."""
    torch.manual_seed(14)
    model = DNNModel()
    calls = []
    model.register_forward_hook(lambda module, args, out: calls.append(1) or out * 2)
    fused, rep = fuse(model, report=True)
    x = torch.randn(3, 100)
    torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
    assert len(calls) == 2 and [c.kind for c in rep.fused] == ["FusedMLP"]
    assert list(fused.state_dict()) == list(model.state_dict())


class _MaskedMLP(nn.Module):
    """A Hugging Face-style block: an MLP, then a mask applied only when one is given."""

    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = (
            nn.Linear(8, 16),
            nn.GELU(approximate="tanh"),
            nn.Linear(16, 8),
        )

    def forward(self, h, attention_mask=None):
        h = self.fc2(self.act(self.fc1(h)))
        if attention_mask is not None:
            h = h * attention_mask[..., None]
        return h


class _PassesMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer, self.out = _MaskedMLP(), nn.Linear(8, 2)

    def forward(self, x, mask=None):
        return self.out(self.layer(x, attention_mask=mask))


class _UnusedOption(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x, scale=None):
        return self.fc2(torch.relu(self.fc1(x)))


def test_forwards_that_branch_on_an_omitted_argument_are_not_traced_as_one_graph():
    """fx traces an argument as given, so `if mask is not None:` would always take the mask
    branch and fail (or compute otherwise) when the mask is omitted: such forwards are searched
    child by child instead, and both calls give the model's answer. An optional argument the
    forward only ignores does not stop fusion."""
    torch.manual_seed(15)
    x, mask = torch.randn(3, 8), torch.rand(3)
    model = _PassesMask()
    fused, rep = fuse(model, report=True)
    assert not rep.traced and any("is None" in n for n in rep.notes), rep.notes
    torch.testing.assert_close(fused(x), model(x), rtol=0, atol=0)
    torch.testing.assert_close(fused(x, mask), model(x, mask), rtol=0, atol=0)
    plain = _UnusedOption()
    fused, rep = fuse(plain, report=True)
    assert rep.traced and [c.kind for c in rep.fused] == ["FusedMLP"]
    torch.testing.assert_close(fused(x), plain(x), rtol=1e-5, atol=1e-6)


class _ReadsTraining(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x):
        return self.fc2(F.dropout(F.gelu(self.fc1(x), approximate="tanh"), 0.5, self.training))


@pytest.mark.parametrize("fused_in", ["train", "eval"])
def test_a_forward_reading_self_training_follows_the_mode(fused_in):
    """fx would freeze self.training at fuse time (dropout on in eval, or never on in train):
    such a forward runs its fused graph in the mode it was fused in only (the module keeps its
    class; a GraphModule would hold one mode) and its own forward in the other, so the fused
    model follows the mode it is in. Every module's own mode is left as it was."""
    torch.manual_seed(16)
    model = _ReadsTraining().train(fused_in == "train")
    model.fc2.train(fused_in != "train")  # a submodule in the other mode: left so
    modes = {name: m.training for name, m in model.named_modules()}
    fused, rep = fuse(model, report=True)
    assert type(fused) is _ReadsTraining and rep.fused, rep
    assert any(f"in {fused_in}() mode (its forward reads self.training" in n for n in rep.notes)
    assert {name: m.training for name, m in model.named_modules()} == modes
    x = torch.randn(4, 16)
    exact = {"rtol": 0, "atol": 0}
    fused.eval(), model.eval()
    torch.testing.assert_close(fused(x), model(x), **({} if fused_in == "eval" else exact))
    fused.train(), model.train()
    torch.manual_seed(17)
    dropped = fused(x)
    torch.manual_seed(17)
    # the same dropout mask
    torch.testing.assert_close(dropped, model(x), **({} if fused_in == "train" else exact))
    assert not torch.allclose(dropped, fused.eval()(x))  # dropout is on in train()


class _ReadsTwoFlags(nn.Module):
    """A forward whose dropout follows its own flag or its Dropout child's."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.drop = nn.Linear(16, 32), nn.Linear(32, 16), nn.Dropout(0.5)

    def forward(self, x):
        h = F.dropout(F.gelu(self.fc1(x)), 0.5, self.training or self.drop.training)
        return self.fc2(h)


def test_a_forward_reading_two_flags_fused_in_mixed_modes_is_not_frozen():
    """Fused with the model in eval() but its Dropout child in train(), flipping every flag gave
    the same graph (dropout on: `eval or train`, `train or eval`), so fuse took the graph for
    both modes and the model kept dropping in eval() (a silent wrong answer). With mixed modes
    the graph is compared with a trace in each uniform mode too."""
    torch.manual_seed(18)
    model = _ReadsTwoFlags().eval()
    model.drop.train()
    fused, rep = fuse(model, report=True)
    assert any("self.training" in n for n in rep.notes), rep.notes
    x = torch.randn(4, 16)
    model.eval(), fused.eval()
    torch.testing.assert_close(fused(x), model(x), rtol=0, atol=0)
    model.train(), fused.train()
    torch.manual_seed(19)
    want = model(x)
    torch.manual_seed(19)
    torch.testing.assert_close(fused(x), want, rtol=0, atol=0)


class _OutputsByMode(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x, scale=None):
        h = self.fc2(torch.relu(self.fc1(x)))
        extra = scale if scale is not None else x
        return (h, extra) if self.training else h


class _MakesAndRequiresMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x, mask=None):  # mask is required in practice: no None check
        return (self.fc2(torch.relu(self.fc1(x))) + torch.ones(8)) * mask.unsqueeze(-1)


class _TrainOverride(_MakesAndRequiresMask):
    def train(self, mode=True):
        super().train(mode)
        self.fc1.weight.requires_grad_(mode)  # more than a flag: fuse must not call it
        return self


def test_the_second_traces_compare_outputs_and_ignore_what_each_trace_names_anew():
    """The checks compare the output too (a forward returning other things by mode, or an
    omitted argument returned in its place, falls back); a tensor the forward makes (named anew
    by each trace) or an argument used without a None check does not stop fusion; a train()
    override is not called."""
    torch.manual_seed(18)
    x, mask = torch.randn(3, 8), torch.rand(3)
    model = _OutputsByMode()
    fused, rep = fuse(model, report=True)
    assert not rep.traced, rep.notes
    for mode in (True, False):
        fused.train(mode), model.train(mode)
        torch.testing.assert_close(fused(x), model(x), rtol=0, atol=0)
    for cls in (_MakesAndRequiresMask, _TrainOverride):
        model = cls().eval()
        frozen = model.fc1.weight.requires_grad
        fused, rep = fuse(model, report=True)
        assert rep.traced and [c.kind for c in rep.fused] == ["FusedMLP"], (cls, rep.notes)
        torch.testing.assert_close(fused(x, mask), model(x, mask), rtol=1e-5, atol=1e-6)
        assert sorted(fused.state_dict()) == sorted(model.state_dict())
        assert model.fc1.weight.requires_grad == frozen


class _ReusesItsMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return self.mlp(torch.relu(self.fc(self.mlp(x))))


def test_a_node_where_one_chain_stopped_and_another_began_is_not_reported_unfused():
    """The chain from mlp.0 stops at fc (another activation), and fc starts a chain of its own:
    the report lists fc as fused, not as a candidate left unfused."""
    torch.manual_seed(19)
    model = _ReusesItsMLP()
    fused, rep = fuse(model, report=True)
    assert [c.nodes[0] for c in rep.fused] == ["mlp.0", "fc"] and rep.skipped == [], str(rep)
    x = torch.randn(2, 16)
    torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
