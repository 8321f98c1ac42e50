"""dualk.fuse on the patterns real models use (timm's Mlp, torchvision's MLP, transformers'
activation classes, models fx cannot trace), and the fused modules' measured choice between
the fused path and the original one (dualk.module_choice)."""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import pickle
import re
import sys
import time
import types

import pytest
import torch
import torch.nn.functional as F
from conftest import stand_in_fast_path
from torch import nn

import dualk
from dualk import module_choice
from dualk.dispatch import autotune
from dualk.fuse import fuse
from dualk.nn import FusedMLP, LinearGELU


def _fused_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, (FusedMLP, LinearGELU))]


class TimmMlp(nn.Module):
    """timm.layers.Mlp's structure: fc1, act, drop1, norm, fc2, drop2."""

    def __init__(self, d=8, hidden=16, p=0.0):
        super().__init__()
        self.fc1, self.act, self.drop1 = nn.Linear(d, hidden), nn.GELU(), nn.Dropout(p)
        self.norm, self.fc2, self.drop2 = nn.Identity(), nn.Linear(hidden, d), nn.Dropout(p)

    def forward(self, x):
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1(x))))))


def _torchvision_style_mlp(p=0.0) -> nn.Sequential:
    """torchvision.ops.MLP(8, [16, 16, 8], dropout=p)'s layers."""
    return nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Dropout(p),
        nn.Linear(16, 16), nn.ReLU(), nn.Dropout(p),
        nn.Linear(16, 8), nn.Dropout(p),
    )  # fmt: skip


def test_timm_mlp_fuses_through_dropout_and_identity():
    torch.manual_seed(0)
    model = TimmMlp().eval()
    fused, rep = fuse(model, report=True)
    [chain] = rep.fused
    assert chain.kind == "FusedMLP" and chain.widths == [8, 16, 8]
    assert chain.nodes == ["fc1", "act", "drop1", "norm", "fc2"]
    x = torch.randn(5, 8)
    torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
    assert not rep.skipped  # every Linear is in the chain


def test_torchvision_mlp_fuses_and_reports():
    torch.manual_seed(1)
    model = _torchvision_style_mlp().eval()
    fused, rep = fuse(model, report=True)
    [chain] = rep.fused
    assert chain.widths == [8, 16, 16, 8] and chain.activation == "relu"
    x = torch.randn(4, 8)
    torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)


def test_active_dropout_runs_the_original_ops():
    # Dropout with p > 0 in training: the fused module runs PyTorch's ops (the same random
    # draws as the original model under the same seed), and the fused kernel again in eval.
    torch.manual_seed(2)
    model = _torchvision_style_mlp(p=0.5).train()
    fused = fuse(model)
    x = torch.randn(6, 8)
    torch.manual_seed(7)
    expected = model(x)
    torch.manual_seed(7)
    got = fused(x)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    assert (got == 0).any()  # the dropout did drop
    [module] = _fused_modules(fused)
    assert module._between_active()
    fused.eval()
    model.eval()
    assert not module._between_active()
    torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------- timm's gated MLPs
# Stand-ins with timm's structure and forward code (timm 1.0.31, timm/layers/mlp.py, use_conv
# False): timm needs torchvision, whose PyPI wheels do not load against a local torch build, so
# the suite does not depend on it; test_real_timm_gated_mlps runs the real classes where timm
# imports.
class TimmSwiGLU(nn.Module):
    """timm.layers.SwiGLU: fc1_g and fc1_x (split fc1), act (nn.SiLU), drop1, norm
    (nn.Identity without a norm layer), fc2, drop2."""

    def __init__(self, d=8, hidden=12, bias=True, p=0.0, act_layer=nn.SiLU):
        super().__init__()
        self.fc1_g = nn.Linear(d, hidden, bias=bias)
        self.fc1_x = nn.Linear(d, hidden, bias=bias)
        self.act, self.drop1, self.norm = act_layer(), nn.Dropout(p), nn.Identity()
        self.fc2, self.drop2 = nn.Linear(hidden, d, bias=bias), nn.Dropout(p)

    def forward(self, x):
        x_gate = self.fc1_g(x)
        x = self.fc1_x(x)
        x = self.act(x_gate) * x
        x = self.drop1(x)
        x = self.norm(x)
        x = self.fc2(x)
        x = self.drop2(x)
        return x


class TimmGluMlp(nn.Module):
    """timm.layers.GluMlp (use_conv=False): fc1 computes both halves, chunked; the activation
    (nn.Sigmoid by default: the original GLU) on the second half when gate_last (the default),
    else on the first (timm's SwiGLUPacked: nn.SiLU, gate_last=False); then drop1, norm, fc2,
    drop2."""

    def __init__(self, d=8, hidden=24, bias=True, p=0.0, act_layer=nn.Sigmoid, gate_last=True):
        super().__init__()
        self.chunk_dim = -1
        self.gate_last = gate_last
        self.fc1 = nn.Linear(d, hidden, bias=bias)
        self.act, self.drop1, self.norm = act_layer(), nn.Dropout(p), nn.Identity()
        self.fc2, self.drop2 = nn.Linear(hidden // 2, d, bias=bias), nn.Dropout(p)

    def forward(self, x):
        x = self.fc1(x)
        x1, x2 = x.chunk(2, dim=self.chunk_dim)
        x = x1 * self.act(x2) if self.gate_last else self.act(x1) * x2
        x = self.drop1(x)
        x = self.norm(x)
        x = self.fc2(x)
        x = self.drop2(x)
        return x


def _timm_mlp_layers():
    """timm.layers.mlp, or a skip saying why it cannot be used here."""
    try:
        from timm.layers import mlp
    except Exception as exc:  # not installed, or torchvision broken against this torch
        pytest.skip(
            f"timm cannot be imported here ({type(exc).__name__}: {str(exc)[:120]}); the "
            "stand-ins above cover its structure"
        )
    return mlp


def _same_outputs_and_gradients(model, fused, x, seed=None):
    """The fused model's output and gradients (x and every parameter) are the original's, its
    parameters and state_dict keys the original's own."""
    assert list(fused.state_dict()) == list(model.state_dict())
    assert {id(p) for p in fused.parameters()} == {id(p) for p in model.parameters()}
    x = x.clone().requires_grad_()
    leaves = [x, *model.parameters()]
    outs, grads = [], []
    for m in (fused, model):
        if seed is not None:
            torch.manual_seed(seed)
        out = m(x)
        outs.append(out)
        grads.append(torch.autograd.grad(out.square().sum(), leaves))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)
    for g, e in zip(*grads):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    return outs[0]


# The timm pattern tests run on CPU tensors: Triton there is its interpreter, which a GPU machine's
# test run does not enable (tests/test_linear_glu.py runs linear_glu's Triton kernel on the GPU).
TORCH_AND_INTERPRETED_TRITON = [
    "torch",
    pytest.param("triton", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="CPU tensors: Triton's interpreter, off on a GPU machine")),
]  # fmt: skip


@pytest.mark.parametrize("backend", TORCH_AND_INTERPRETED_TRITON)
@pytest.mark.parametrize("bias", [True, False])
def test_timm_swiglu_gated_part_fuses(bias, backend):
    """SwiGLU's gated part (fc1_g, act, fc1_x, the product) runs as one dualk.linear_glu on its
    own Linears; drop1, norm (nn.Identity), fc2 and drop2 stay in the graph."""
    torch.manual_seed(9)
    model = TimmSwiGLU(bias=bias)
    fused, rep = fuse(model, backend=backend, report=True)
    [chain] = rep.fused
    assert chain.kind == "LinearGLU" and chain.modules == ["fc1_g", "fc1_x"], str(rep)
    assert chain.nodes == ["fc1_g", "act", "fc1_x", "mul"] and chain.widths == [8, 12]
    assert chain.activation == "silu" and chain.backend == backend
    assert dict(rep.skipped).keys() == {"fc2"}
    _same_outputs_and_gradients(model, fused, torch.randn(2, 3, 8))


def test_timm_swiglu_active_dropout_stays_in_the_graph():
    """drop1 (p > 0, training) is not absorbed: it drops the fused product as it dropped the
    original one (the same random draws under the same seed)."""
    torch.manual_seed(10)
    model = TimmSwiGLU(p=0.5).train()
    fused, rep = fuse(model, backend="torch", report=True)
    assert [c.kind for c in rep.fused] == ["LinearGLU"]
    out = _same_outputs_and_gradients(model, fused, torch.randn(6, 8), seed=11)
    assert (out == 0).any()  # drop2 dropped


def test_gated_product_not_into_a_linear_is_left_alone():
    """A gated product that goes through something other than nn.Dropout / nn.Identity before
    the down projection (a LayerNorm: timm's SwiGLU with a norm layer) is not taken."""
    model = TimmSwiGLU()
    model.norm = nn.LayerNorm(12)
    _, rep = fuse(model, report=True)
    assert not any(c.kind == "LinearGLU" for c in rep.fused), str(rep)


@pytest.mark.parametrize("backend", TORCH_AND_INTERPRETED_TRITON)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("gate_last", [True, False])
def test_timm_glu_mlp_gated_part_fuses(gate_last, bias, backend, monkeypatch):
    """GluMlp's gated part (fc1, chunk, act on the gate half, the product) runs as one
    dualk.linear_glu on fc1's own parameters: packed as they are where the gate is the first
    half, the halves' views swapped where it is the second (gate_last)."""
    torch.manual_seed(13)
    model = TimmGluMlp(bias=bias, act_layer=nn.GELU, gate_last=gate_last)
    fused, rep = fuse(model, backend=backend, report=True)
    [chain] = rep.fused
    assert chain.kind == "LinearGLU" and chain.modules == ["fc1"], str(rep)
    assert chain.nodes == ["fc1", "chunk", "getitem", "getitem_1", "act", "mul"]
    assert chain.widths == [8, 12] and chain.activation == "gelu(none)"
    [module] = [m for m in fused.modules() if type(m).__name__ == "_SharedHalvesGLU"]
    assert module.gate_first is not gate_last
    calls = []
    real = dualk.ops.linear_glu

    def spy(x, weight_gate, weight_up=None, bias_gate=None, bias_up=None, **kwargs):
        calls.append((weight_gate, weight_up, bias_gate, bias_up))
        return real(x, weight_gate, weight_up, bias_gate, bias_up, **kwargs)

    monkeypatch.setattr(dualk.ops, "linear_glu", spy)
    _same_outputs_and_gradients(model, fused, torch.randn(2, 3, 8))
    wg, wu, bg, bu = calls[0]
    w, b = model.fc1.weight, model.fc1.bias
    if not gate_last:  # [gate | up]: the packed weight itself
        assert wg is w and wu is None and bg is b and bu is None
    else:  # [up | gate]: views of fc1's weight, the gate the second half
        assert wg.data_ptr() == w[12:].data_ptr() and wu.data_ptr() == w.data_ptr()
        assert bias is (bg is not None) and (not bias or bg.data_ptr() == b[12:].data_ptr())


def test_timm_glu_mlp_sigmoid_is_reported_not_fused():
    """GluMlp's default gate activation, nn.Sigmoid (the original GLU), is none of
    linear_glu's: nothing is fused and the report says why."""
    _, rep = fuse(TimmGluMlp(), report=True)
    assert rep.fused == []
    skipped = dict(rep.skipped)
    assert "act (Sigmoid), which dualk.linear_glu cannot take" in skipped["fc1"], str(rep)


@pytest.mark.parametrize("gate_last", [True, False])
def test_timm_glu_mlp_original_path(measured, gate_last):
    """Where the measured choice takes the original path (PyTorch's ops), the fused GluMlp
    computes as the model does: one GEMM, its halves in the model's order."""
    torch.manual_seed(14)
    model = TimmGluMlp(act_layer=nn.SiLU, gate_last=gate_last)
    fused = fuse(model)
    [module] = [m for m in fused.modules() if type(m).__name__ == "_SharedHalvesGLU"]
    x = torch.randn(5, 8)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x), rtol=1e-6, atol=1e-6)
    assert module._last_path == "original"
    [(key, entry)] = module_choice.details().items()
    assert "linear_glu" in key and entry["path"] == "original"
    _same_outputs_and_gradients(model, fused, x)


def test_real_timm_gated_mlps():
    """timm's own SwiGLU, GluMlp (SiLU, both gate halves) and SwiGLUPacked fuse as their
    stand-ins do; GluMlp's default (Sigmoid) does not (skips where timm cannot be imported)."""
    mlp = _timm_mlp_layers()
    torch.manual_seed(12)
    models = {
        "SwiGLU": (mlp.SwiGLU(8, 12), ["fc1_g", "fc1_x"]),
        "GluMlp gate_last": (mlp.GluMlp(8, 24, act_layer=nn.SiLU), ["fc1"]),
        "GluMlp gate first": (mlp.GluMlp(8, 24, act_layer=nn.SiLU, gate_last=False), ["fc1"]),
        "SwiGLUPacked": (mlp.SwiGLUPacked(8, 24), ["fc1"]),
    }
    for name, (model, modules) in models.items():
        fused, rep = fuse(model, backend="torch", report=True)
        assert [(c.kind, c.modules) for c in rep.fused] == [("LinearGLU", modules)], name
        _same_outputs_and_gradients(model, fused, torch.randn(3, 8))
    _, rep = fuse(mlp.GluMlp(8, 24), report=True)
    assert rep.fused == [] and "Sigmoid" in dict(rep.skipped)["fc1"]


def _fake_transformers_activations(monkeypatch):
    """Classes with transformers.activations' names and forwards (transformers is not a test
    dependency): fuse matches them by module and class name."""
    mod = types.ModuleType("transformers.activations")

    class NewGELUActivation(nn.Module):
        def forward(self, x):
            return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))

    class GELUActivation(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = F.gelu

        def forward(self, x):
            return self.act(x)

    class QuickGELUActivation(nn.Module):  # x * sigmoid(1.702 x): not one of dualk's
        def forward(self, x):
            return x * torch.sigmoid(1.702 * x)

    for cls in (NewGELUActivation, GELUActivation, QuickGELUActivation):
        cls.__module__ = mod.__name__
        cls.__qualname__ = cls.__name__
        setattr(mod, cls.__name__, cls)
    monkeypatch.setitem(sys.modules, "transformers.activations", mod)
    return mod


@pytest.mark.parametrize(
    "name, expected",
    [("NewGELUActivation", "gelu(tanh)"), ("GELUActivation", "gelu(none)"),
     ("QuickGELUActivation", None)],
)  # fmt: skip
def test_transformers_activation_classes(monkeypatch, name, expected):
    acts = _fake_transformers_activations(monkeypatch)

    class HFBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.dense = nn.Linear(8, 32)
            self.intermediate_act_fn = getattr(acts, name)()
            self.out = nn.Linear(32, 8)

        def forward(self, x):
            return self.out(self.intermediate_act_fn(self.dense(x)))

    torch.manual_seed(3)
    model = HFBlock()
    fused, rep = fuse(model, report=True)
    x = torch.randn(3, 8)
    torch.testing.assert_close(fused(x), model(x), rtol=1e-4, atol=1e-5)
    if expected is None:
        assert rep.fused == []
        skipped = dict(rep.skipped)
        assert set(skipped) == {"dense", "out"}  # every Linear named, with why
        assert "2 users" in skipped["dense"]  # x * sigmoid(1.702 x) reads it twice
    else:
        [chain] = rep.fused
        assert chain.activation == expected and chain.nodes == [
            "dense",
            "intermediate_act_fn",
            "out",
        ]


class _Untraceable(nn.Module):
    """A forward fx cannot trace (data-dependent control flow), holding a traceable block."""

    def __init__(self):
        super().__init__()
        self.block = TimmMlp()
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        if x.sum() > 0:  # fx cannot trace this
            x = x * 2
        return self.head(self.block(x))


def test_untraceable_models_children_are_registered_and_reported():
    torch.manual_seed(4)
    model = _Untraceable().eval()
    fused, rep = fuse(model, report=True)
    assert not rep.traced and len(rep.fused) == 1
    # the fused module is a registered submodule of the block: modules(), hooks, .to() see it
    names = [n for n, m in fused.named_modules() if isinstance(m, FusedMLP)]
    assert names == ["block." + rep.fused[0].name.split(".")[-1]]
    assert list(fused.state_dict()) == list(model.state_dict())
    calls = []
    fused.get_submodule(names[0]).register_forward_hook(lambda *a: calls.append(1))
    x = torch.randn(3, 8)
    torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
    assert calls == [1]
    skipped = dict(rep.skipped)
    assert "head" in skipped and "not reached by a traced graph" in skipped["head"]


# --------------------------------------------------------------------- the measured choice
@pytest.fixture
def measured(monkeypatch):
    """Measurement allowed on the CPU with a fake timer: "original" costs `costs["original"]`
    us, "fused" `costs["fused"]`; counts the timed calls per path."""
    costs = {"fused": 20.0, "original": 10.0}
    timed = {"fused": 0, "original": 0}

    def timer(run, name, budget_ms):
        run()
        path = name.split(":")[1]
        timed[path] += 1
        return (costs[path], 1.0)

    monkeypatch.setattr(module_choice, "measurable", lambda device: None)
    autotune.set_timer(timer)
    autotune.clear_memory()
    yield costs, timed
    autotune.set_timer(None)
    autotune.clear_memory()


def test_batched_input_is_measured_as_called(measured, monkeypatch):
    # A call with batch dims (..., rows, in), as transformers call their MLPs, is a class of its
    # own, measured on a batched input: dualk's path reshapes it in and out, host time that a
    # 2-dim measurement missed (BERT on an H100 chose dualk's path and ran 0.89x).
    seen = []
    real = module_choice._paths

    def paths(shape, x, *args, **kwargs):
        seen.append(tuple(x.shape))
        return real(shape, x, *args, **kwargs)

    monkeypatch.setattr(module_choice, "_paths", paths)
    torch.manual_seed(6)
    m = LinearGELU(8, 16)
    with torch.no_grad():
        out = m(torch.randn(2, 3, 8))
        m(torch.randn(6, 8))
        m(torch.randn(3, 2, 8))  # (the class of the first call: 6 rows, batched)
    assert out.shape == (2, 3, 16)
    assert seen == [(1, 6, 8), (6, 8)]
    keys = list(module_choice.details())
    assert len(keys) == 2 and sum("batched" in k for k in keys) == 1


def test_choice_runs_the_faster_path_per_mode(measured):
    costs, timed = measured
    torch.manual_seed(5)
    model = FusedMLP((8, 16, 8))
    x = torch.randn(6, 8)
    with torch.no_grad():
        y = model(x)  # measured: the original path is faster
    assert timed["original"] > 0 and timed["fused"] > 0
    [(key, entry)] = module_choice.details().items()
    assert key.startswith("infer ") and entry["path"] == "original"
    assert entry["times_us"]["original"][1] == 10.0
    torch.testing.assert_close(y, model.to_sequential()(x), rtol=1e-6, atol=1e-6)
    before = dict(timed)
    with torch.no_grad():
        model(x)  # remembered (the inference plan runs the original ops)
    assert timed == before
    # training is its own class, timed forward + backward
    costs["original"] = 30.0
    out = model(x.requires_grad_())
    out.sum().backward()
    paths = {k.split()[0]: v["path"] for k, v in module_choice.details().items()}
    assert paths == {"infer": "original", "train": "fused"}
    assert all(lin.weight.grad is not None for lin in model.layers)


def test_choice_is_remembered_in_the_cache_file(measured):
    costs, timed = measured
    model = FusedMLP((8, 16, 8))
    with torch.no_grad():
        model(torch.randn(4, 8))
    autotune.clear_memory()  # a new process: the file answers
    count = sum(timed.values())
    with torch.no_grad():
        model(torch.randn(4, 8))
    assert sum(timed.values()) == count
    [entry] = module_choice.details().values()
    assert entry["source"] == "cache" and entry["path"] == "original"


def test_choice_respects_named_backends_and_overrides(measured, monkeypatch):
    costs, timed = measured
    monkeypatch.setattr(module_choice, "measurable", lambda device: autotune.timing_blocked())
    x = torch.randn(4, 9)
    with torch.no_grad():
        FusedMLP((9, 16, 8), backend="torch")(x)
        monkeypatch.setenv("DUALK_BACKEND", "torch")
        FusedMLP((9, 16, 8))(x)
        monkeypatch.delenv("DUALK_BACKEND")
        monkeypatch.setenv("DUALK_AUTOTUNE", "0")
        FusedMLP((9, 16, 8))(x)
    assert timed == {"fused": 0, "original": 0} and module_choice.details() == {}


def test_choice_is_a_constant_of_a_compiled_graph(measured):
    costs, timed = measured
    torch.manual_seed(6)
    model = LinearGELU(8, 16)
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(2, 3, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), F.gelu(model.weight.new_tensor(0) + F.linear(
            x, model.weight, model.bias), approximate="tanh"), rtol=1e-5, atol=1e-6)  # fmt: skip
    keys = list(module_choice.details())
    assert len(keys) == 1 and keys[0].startswith("compiled ") and "rows<=8" in keys[0]
    # compiled: the fused op must beat the original's GEMMs by MARGIN_COMPILED
    assert module_choice.details()[keys[0]]["path"] == "original"


def test_fused_model_choice_keeps_outputs_and_gradients(measured):
    # A fused model whose modules run the original path gives the original's outputs and
    # gradients (the same parameters).
    costs, timed = measured
    torch.manual_seed(8)
    model = _torchvision_style_mlp()
    fused = fuse(model)
    x = torch.randn(5, 8)
    out_f = fused(x)
    out_f.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    out_o = model(x)
    out_o.square().sum().backward()
    torch.testing.assert_close(out_f, out_o)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad)


def test_readme_fuse_on_cpu_runs_dualk_ops():
    # Off the GPU nothing is measured: the fused modules run dualk's operators (as before).
    model = _torchvision_style_mlp().eval()
    fused = fuse(model)
    before = dict(module_choice.details())  # (a GPU test process holds others' choices)
    with torch.no_grad():
        fused(torch.randn(3, 8))
    assert module_choice.details() == before
    assert dualk.fuse is fuse


def test_choice_made_while_a_backend_builds_is_provisional(measured, monkeypatch):
    # The operator ran without a backend still building: the choice is not written to the file
    # and is measured again once a build finishes (the CUDA build generation moves).
    from dualk.backends import cuda

    costs, timed = measured
    generation = [0]
    monkeypatch.setattr(module_choice, "_op_provisional", lambda *a: True)
    monkeypatch.setattr(cuda, "generation", lambda: generation[0])
    monkeypatch.setattr(cuda, "poll_builds", lambda: generation[0])
    from dualk import nn as dnn

    now = [1000.0]
    monkeypatch.setattr(dnn, "_monotonic", lambda: now[0])
    polls = []
    monkeypatch.setattr(cuda, "poll_builds", lambda: (polls.append(1), generation[0])[1])
    model = FusedMLP((8, 12, 8))
    x = torch.randn(4, 8)
    with torch.no_grad():
        model(x)
        count = sum(timed.values())
        model(x)
        assert sum(timed.values()) == count  # remembered in memory while nothing changed
        assert dnn.choice_final(model) is None and "_plan" not in model.__dict__
        before = len(polls)
        for _ in range(5):  # like calls within PROVISIONAL_PLAN_S: the module's memo, no polling
            model(x)
        assert len(polls) == before
        generation[0] += 1  # a build finished
        monkeypatch.setattr(module_choice, "_op_provisional", lambda *a: False)
        model(x)
        assert sum(timed.values()) == count  # (until the provisional memo expires)
        now[0] += dnn.PROVISIONAL_PLAN_S + 0.01
        model(x)
        assert sum(timed.values()) > count  # measured again, now final
        assert dnn.choice_final(model) == "original"  # (the fake timer: original faster)
    [entry] = module_choice.details().values()
    assert entry["provisional"] is False
    autotune.clear_memory()  # a new process: the final choice is in the file
    with torch.no_grad():
        model(x)
    [entry] = module_choice.details().values()
    assert entry["source"] == "cache"


def test_a_provisional_fused_choice_is_asked_again_once_due(measured, monkeypatch):
    # The module's choice "fused" while provisional (a backend building), the operator's own
    # decision final: the inference plan made from that call must expire with the choice. A plan
    # that never expired served every later call, the choice stayed provisional for good, and
    # fuse's in-model check (which waits for final choices) never started (H200, session 34).
    costs, timed = measured
    costs.update(fused=5.0, original=10.0)
    from dualk import nn as dnn

    monkeypatch.setattr(module_choice, "_op_provisional", lambda *a: True)
    monkeypatch.setattr(autotune, "build_generation", lambda poll=False: 3)
    clock = [800.0]
    monkeypatch.setattr(module_choice, "_clock", lambda: clock[0])
    monkeypatch.setattr(dnn, "_monotonic", lambda: clock[0])
    model = FusedMLP((8, 11, 7))  # (a class no other test's cache file holds)
    x = torch.randn(4, 8)
    with torch.no_grad():
        ref = model(x)
        assert dnn.choice_final(model) is None and model.__dict__["_last_path"] == "fused"
        monkeypatch.setattr(module_choice, "_op_provisional", lambda *a: False)
        clock[0] += module_choice.RECHECK_S + 0.01
        for _ in range(3):
            assert torch.equal(model(x), ref)
        assert dnn.choice_final(model) == "fused"
    assert "_fast" not in model.__dict__  # (no C++ plan on a CPU: the Python plan served)


def test_provisional_choice_is_measured_again_on_a_clock(measured, monkeypatch):
    # No build generation moves (the operator's missing backend arrived without one, or its
    # decision became final on a later call): the provisional choice is still measured again,
    # after RECHECK_S, then after twice that, and turns final once the operator's decision is.
    costs, timed = measured
    from dualk import nn as dnn

    monkeypatch.setattr(module_choice, "_op_provisional", lambda *a: True)
    monkeypatch.setattr(autotune, "build_generation", lambda poll=False: 7)
    clock = [500.0]
    monkeypatch.setattr(module_choice, "_clock", lambda: clock[0])
    monkeypatch.setattr(dnn, "_monotonic", lambda: clock[0])
    model = FusedMLP((8, 13, 7))  # (a class no other test's cache file holds)
    x = torch.randn(4, 8)
    with torch.no_grad():
        model(x)
        count = sum(timed.values())
        clock[0] += module_choice.RECHECK_S / 2  # (past the module's own memo, not the recheck)
        model(x)
        assert sum(timed.values()) == count
        clock[0] += module_choice.RECHECK_S / 2 + 0.01
        model(x)
        assert sum(timed.values()) > count  # measured again: still provisional
        count = sum(timed.values())
        clock[0] += module_choice.RECHECK_S + 0.01  # (the next look waits twice as long)
        model(x)
        assert sum(timed.values()) == count and dnn.choice_final(model) is None
        monkeypatch.setattr(module_choice, "_op_provisional", lambda *a: False)
        clock[0] += module_choice.RECHECK_S
        model(x)
        assert sum(timed.values()) > count
        assert dnn.choice_final(model) is not None
    [entry] = module_choice.details().values()
    assert entry["provisional"] is False


class _Blocks(nn.Module):
    """Chains inside submodules (a transformer's MLPs): fused in place, the model keeps its
    class, forward and attributes."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.mlps = nn.ModuleList(TimmMlp() for _ in range(2))
        self.scale = 2.0

    def forward(self, x):
        for mlp in self.mlps:
            x = x + mlp(self.norm(x))
        return x * self.scale


def test_chains_inside_submodules_are_fused_in_place():
    torch.manual_seed(9)
    model = _Blocks().eval()
    fused, rep = fuse(model, report=True)
    assert type(fused) is _Blocks and fused.scale == 2.0  # not a GraphModule
    assert [c.name for c in rep.fused] == ["mlps.0.dualk_fused_mlp_0", "mlps.1.dualk_fused_mlp_0"]
    assert [n for n, m in fused.named_modules() if isinstance(m, FusedMLP)] == [
        "mlps.0.dualk_fused_mlp_0",
        "mlps.1.dualk_fused_mlp_0",
    ]
    assert list(fused.state_dict()) == list(model.state_dict())
    assert fused.mlps[0].fc1.weight is model.mlps[0].fc1.weight
    assert model.mlps[0].forward.__func__ is TimmMlp.forward  # the model itself is untouched
    x = torch.randn(4, 8)
    torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
    assert not rep.skipped


def test_submodule_whose_fused_modules_run_original_runs_its_own_forward(measured):
    # Every fused module in the submodule measured the original ops faster: a like call then
    # runs the submodule's own forward (no dualk layer on the host at all).
    torch.manual_seed(10)
    model = _Blocks().eval()
    fused = fuse(model)
    calls = []
    for m in fused.modules():
        if isinstance(m, FusedMLP):
            m.register_forward_hook(lambda *a: calls.append(1))
    x = torch.randn(4, 8)
    with torch.no_grad():
        first = fused(x)
        assert calls == [1, 1]  # measured, ran the original ops inside the fused modules
        second = fused(x)
        assert calls == [1, 1]  # the blocks' own forwards
    torch.testing.assert_close(first, model(x), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    with torch.no_grad():
        fused(torch.randn(5, 8))  # another signature: through the fused graph again
    assert calls == [1, 1, 1, 1]


def test_owner_gets_its_original_forward_back(measured, monkeypatch):
    # Many like inference calls on the original path, every fused module's choice final: the
    # owner's forward is its own again (no dualk code per call). Training calls, and fused
    # modules with hooks, never restore.
    fuse_module = sys.modules["dualk.fuse"]
    monkeypatch.setattr(fuse_module, "RESTORE_AFTER", 3)
    torch.manual_seed(31)
    model = _Blocks().eval()
    fused = fuse(model)
    blocks = list(fused.mlps)
    assert all(_fused_forward(b) for b in blocks)  # (the forward objects fuse set)
    x = torch.randn(4, 8)
    for _ in range(6):  # gradients on: no restore
        fused(x).sum().backward()
    assert all("forward" in b.__dict__ for b in blocks)
    hooked = next(m for m in blocks[1].modules() if isinstance(m, FusedMLP))
    handle = hooked.register_forward_hook(lambda *a: None)
    with torch.no_grad():
        for _ in range(6):
            y = torch.randn(4, 8)
            torch.testing.assert_close(fused(y), model(y), rtol=1e-5, atol=1e-6)
    restored = fuse_module.forward_restored
    assert "forward" not in blocks[0].__dict__ and restored(blocks[0])  # the class's forward
    assert "forward" in blocks[1].__dict__ and not restored(blocks[1])  # (a hook)
    handle.remove()
    with torch.no_grad():
        y = torch.randn(9, 8)  # another shape: the restored block is its original module
        torch.testing.assert_close(fused(y), model(y), rtol=1e-5, atol=1e-6)
    assert copy.deepcopy(fused)(y).shape == (9, 8)
    # fuse's whole-model GraphModule: the unfused graph's forward
    seq = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    gm = fuse(seq)
    ff = _fused_forward(gm)
    with torch.no_grad():
        for _ in range(4):
            torch.testing.assert_close(gm(x), seq(x), rtol=1e-5, atol=1e-6)
    # (the unfused graph's forward, not the module chain the original path runs before the
    # restore: torch.compile and torch.export read a GraphModule's forward.__code__)
    assert fuse_module.forward_restored(gm) and gm.forward == ff.original.forward
    torch.testing.assert_close(torch.compile(gm, backend="eager")(x), seq(x), rtol=1e-5, atol=1e-6)
    (inner,) = [m for m in gm.modules() if isinstance(m, FusedMLP)]
    inner.__dict__["_last_path"] = None
    with torch.no_grad():
        torch.testing.assert_close(gm(x), seq(x), rtol=1e-5, atol=1e-6)
        assert inner.__dict__["_last_path"] is None  # not called
        torch.testing.assert_close(copy.deepcopy(gm)(x), seq(x), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(pickle.loads(pickle.dumps(gm))(x), seq(x), rtol=1e-5, atol=1e-6)


def test_the_original_path_of_a_fused_sequential_calls_its_modules_in_turn(measured, monkeypatch):
    # The original path of fuse's whole-model result whose unfused graph is a chain of modules
    # calls them in turn (as nn.Sequential), in training too, hooks and all; a graph with other
    # nodes (a norm and a residual add) runs the unfused graph's forward.
    costs, _ = measured
    costs.update(fused=20.0, original=10.0)  # (the original path measured faster)
    torch.manual_seed(41)
    seq = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    gm = fuse(copy.deepcopy(seq))
    ff = _fused_forward(gm)
    assert type(ff.original_run).__name__ == "_ModuleChain"
    seen = []
    gm.get_submodule("2").register_forward_hook(lambda m, i, o: seen.append(o.shape))
    x = torch.randn(5, 8, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    for _ in range(3):
        out = gm(x)
        torch.testing.assert_close(out, seq(x_ref), rtol=1e-5, atol=1e-6)
        out.square().sum().backward()
        seq(x_ref).square().sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-5, atol=1e-6)
    # (the first call ran the fused graph, whose FusedMLP chose PyTorch's ops; its like calls
    # then ran the chain, which calls the hooked Linear)
    assert seen == [(5, 16)] * 2
    assert ff.original_calls  # (those calls ran the original path)
    with torch.no_grad():  # (by keyword: the unfused graph's forward, the chain takes one input)
        for _ in range(3):
            torch.testing.assert_close(gm(input=x), seq(x), rtol=1e-5, atol=1e-6)
    wide = _fused_forward(fuse(_WideBlock().eval()))
    assert type(wide.original_run).__name__ == "method"
    # not copied or pickled (a copy's chain must hold the copy's modules): made again
    assert "original_run" not in ff.__getstate__()
    twin = copy.deepcopy(ff)
    first = twin._original_forward().modules[0]
    assert first is twin.original.get_submodule("0")
    assert first is not ff.original.get_submodule("0")


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save"])
def test_a_copy_of_a_fused_graph_module_keeps_its_fused_forward_and_its_call(
    how, measured, monkeypatch
):
    # fx's own __deepcopy__ rebuilds a GraphModule from its graph and drops instance attributes,
    # and its __reduce__ (pickle, torch.save) rebuilds it from its code: a copy of fuse's
    # whole-model result ran its fused graph as a plain GraphModule (no in-model check, no
    # restore); and the recompile() that pickling runs put fx's call back on the pickled
    # module's class (its planned call lost). A copy keeps a copy of its forward object, bound to
    # the copy's modules, a restored one its restored forward and verdicts; the model its call.
    fuse_module = sys.modules["dualk.fuse"]
    monkeypatch.setattr(fuse_module, "RESTORE_AFTER", 3)
    costs, _ = measured
    costs.update(fused=20.0, original=10.0)  # (the original path measured faster: restored)

    def copy_of(module):
        if how == "deepcopy":
            return copy.deepcopy(module)
        if how == "pickle":
            return pickle.loads(pickle.dumps(module))
        buffer = io.BytesIO()
        torch.save(module, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=False)

    torch.manual_seed(42)
    seq = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    gm = fuse(copy.deepcopy(seq))
    twin = copy_of(gm)
    assert type(gm).__call__.dualk_graph_call and type(twin).__call__.dualk_graph_call
    ff, tf = _fused_forward(gm), _fused_forward(twin)
    assert tf is not ff and tf.owner is twin and tf.graph is twin
    assert tf.original.get_submodule("0") is twin.get_submodule("0") is not gm.get_submodule("0")
    assert isinstance(tf.fused[0], FusedMLP) and tf.fused[0] is not ff.fused[0]
    assert tf.fused[0] is next(m for m in twin.modules() if isinstance(m, FusedMLP))
    x = torch.randn(5, 8)
    with torch.no_grad():
        for _ in range(6):
            torch.testing.assert_close(twin(x), seq(x), rtol=1e-5, atol=1e-6)
        assert fuse_module.forward_restored(twin) and not fuse_module.forward_restored(gm)
        again = copy_of(twin)
        assert fuse_module.forward_restored(again)
        assert fuse_module.audit_verdicts(again) == fuse_module.audit_verdicts(twin)
        unfused = again.forward.__self__  # (the copy's unfused graph, over the copy's modules)
        assert unfused.get_submodule("0") is again.get_submodule("0")
        assert again.get_submodule("0") is not twin.get_submodule("0")
        torch.testing.assert_close(again(x), seq(x), rtol=1e-5, atol=1e-6)


def test_a_shallow_copy_of_a_fused_graph_module_keeps_the_model_state_and_its_forward(
    measured, monkeypatch
):
    # fx's __copy__ kept only the modules the graph calls: the model's Linears (held by the
    # fused module) left the copy's state_dict, and the forward object was dropped. The copy
    # shares the modules (a shallow copy) and has its own forward object, or the restored one.
    fuse_module = sys.modules["dualk.fuse"]
    monkeypatch.setattr(fuse_module, "RESTORE_AFTER", 3)
    costs, _ = measured
    costs.update(fused=20.0, original=10.0)  # (the original path measured faster: restored)
    torch.manual_seed(57)
    seq = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    gm = fuse(copy.deepcopy(seq))
    twin = copy.copy(gm)
    assert list(twin.state_dict()) == list(gm.state_dict()) == list(seq.state_dict())
    assert twin.get_submodule("0") is gm.get_submodule("0")
    assert type(twin).__call__.dualk_graph_call
    ff, tf = _fused_forward(gm), _fused_forward(twin)
    assert tf is not ff and tf.owner is twin and tf.graph is twin and tf.audits is not ff.audits
    x = torch.randn(5, 8)
    with torch.no_grad():
        for _ in range(6):
            torch.testing.assert_close(twin(x), seq(x), rtol=1e-5, atol=1e-6)
        assert fuse_module.forward_restored(twin) and not fuse_module.forward_restored(gm)
        again = copy.copy(twin)
        assert fuse_module.forward_restored(again)
        assert list(again.state_dict()) == list(seq.state_dict())
        torch.testing.assert_close(again(x), seq(x), rtol=1e-5, atol=1e-6)


def test_owner_is_restored_once_a_provisional_choice_turns_final(measured, monkeypatch):
    # A choice measured while the operator's own decision was provisional (Triton still tuning):
    # like calls run the original path without reaching the fused module, so restoring asks it
    # again (its graph runs once) and succeeds once module_choice has measured it as final.
    from dualk import nn as dnn

    fuse_module = sys.modules["dualk.fuse"]
    monkeypatch.setattr(fuse_module, "RESTORE_AFTER", 3)
    monkeypatch.setattr(module_choice, "_op_provisional", lambda *a: True)
    monkeypatch.setattr(autotune, "build_generation", lambda poll=False: 3)
    monkeypatch.setattr(autotune, "store_for", lambda device: _NoFile())  # (no earlier test's)
    clock = [100.0]
    monkeypatch.setattr(module_choice, "_clock", lambda: clock[0])
    monkeypatch.setattr(dnn, "_monotonic", lambda: clock[0])
    torch.manual_seed(32)
    model = _Blocks().eval()
    fused = fuse(model)
    block = fused.mlps[0]
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(8):
            torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
        assert not fuse_module.forward_restored(block)  # provisional: not restored
        monkeypatch.setattr(module_choice, "_op_provisional", lambda *a: False)
        clock[0] += module_choice.RECHECK_S + 0.01  # (module_choice's clock for another look)
        for _ in range(8):
            torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
    assert fuse_module.forward_restored(block) and "forward" not in block.__dict__


class _NoFile:
    """A cache file that holds nothing and keeps nothing (autotune.store_for's stand-in)."""

    def get(self, section, key):
        return None

    def put(self, section, key, value):
        pass


def _fused_forward(module: nn.Module):
    """The _FusedForward dualk.fuse installed as `module`'s forward."""
    ff = module.forward
    assert type(ff).__name__ == "_FusedForward"
    return ff


def _count_calls(monkeypatch, owner, name: str) -> list:
    calls = []
    real = getattr(owner, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return calls


def _counted_blocks(monkeypatch, seed: int):
    """_Blocks and fuse(_Blocks), with the first block's graph runs and every signature built
    counted."""
    torch.manual_seed(seed)
    model = _Blocks().eval()
    fused = fuse(model)
    graph_calls = _count_calls(monkeypatch, _fused_forward(fused.mlps[0]).graph, "forward")
    signatures = _count_calls(monkeypatch, sys.modules["dualk.fuse"], "_call_signature")
    return model, fused, graph_calls, signatures


def test_like_calls_take_the_shortcut_without_building_a_signature(measured, monkeypatch):
    # The host-cost goal (issue 32): a call like the last one served by the submodule's own
    # forward compares its fields, without running the graph or building a signature.
    model, fused, graph_calls, signatures = _counted_blocks(monkeypatch, seed=15)
    x = torch.randn(4, 8)
    with torch.no_grad():
        fused(x)  # measured: the fused modules run original, the signature is recorded
        assert len(graph_calls) == 1 and len(signatures) == 2  # (one per block)
        for _ in range(3):
            y = torch.randn(4, 8)
            torch.testing.assert_close(fused(y), model(y), rtol=1e-5, atol=1e-6)
    assert len(graph_calls) == 1 and len(signatures) == 2


def test_like_calls_on_the_fused_path_skip_the_bookkeeping(measured, monkeypatch):
    # The fused path measured faster: a call like the last one runs the fused graph without
    # building a signature; a decision made since (module_choice.changes()) or a replaced child
    # sends the next call through the bookkeeping (and the class's forward) again.
    costs, _ = measured
    costs.update(fused=5.0, original=10.0)
    model, fused, graph_calls, signatures = _counted_blocks(monkeypatch, seed=21)
    x = torch.randn(24, 8)  # (rows no other test here decides: the cache file)
    with torch.no_grad():
        fused(x)
        assert len(graph_calls) == 1 and len(signatures) == 2
        for _ in range(3):
            y = torch.randn(24, 8)
            torch.testing.assert_close(fused(y), model(y), rtol=1e-5, atol=1e-6)
        assert len(graph_calls) == 4 and len(signatures) == 2
        fused(torch.randn(40, 8))  # a new signature (and a new decision: rows bucket 64)
        assert len(graph_calls) == 5 and len(signatures) == 4
        module_choice.clear()
        fused(x)
        assert len(graph_calls) == 6 and len(signatures) == 6
        fused.mlps[0].act = nn.ReLU()  # a replaced child: the block's own forward
        y = torch.randn(24, 8)
        block = fused.mlps[0]
        torch.testing.assert_close(block(y), block.fc2(F.relu(block.fc1(y))), rtol=1e-5, atol=1e-6)
        assert len(graph_calls) == 6


def test_one_module_graph_on_the_fused_path_calls_its_module(measured, monkeypatch):
    # A whole chain fused (fuse's GraphModule is `return self.dualk_fused_mlp_0(x)`): a like
    # call on dualk's path calls the fused module itself (its hooks run), not the graph's code.
    costs, _ = measured
    costs.update(fused=5.0, original=10.0)
    torch.manual_seed(22)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    fused = fuse(model)
    ff = _fused_forward(fused)
    (inner,) = _fused_modules(fused)
    assert ff.single is inner
    hooked = []
    inner.register_forward_hook(lambda *a: hooked.append(1))
    graph_code = _count_calls(monkeypatch, type(fused), "forward")
    x = torch.randn(24, 8)  # (rows no other test here decides: the cache file)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
    assert len(graph_code) == 1 and hooked == [1, 1, 1]


class _ScaledMlp(nn.Module):
    """A block whose forward also takes a keyword argument."""

    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)

    def forward(self, x, scale: float = 1.0):
        return self.fc2(self.act(self.fc1(x))) * scale


class _WithScaledMlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = _ScaledMlp()
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.block(x))


def test_a_changed_call_is_not_served_by_the_shortcut(measured, monkeypatch):
    # Each call below follows one served by the block's own forward and differs from it in one
    # thing the fused modules' choice depends on: it runs the fused graph (which measures and
    # records it), then a like call does not.
    torch.manual_seed(16)
    model = _WithScaledMlp().eval()
    fused = fuse(model)
    block, ref = fused.block, model.block
    graph_calls = _count_calls(monkeypatch, _fused_forward(block).graph, "forward")

    def call(args, grad=False, **kwargs):
        with torch.set_grad_enabled(grad):
            out, expected = block(*args, **kwargs), ref(*args, **kwargs)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)

    x = torch.randn(4, 8)
    one, two = (x,), (x, 2.0)
    call(one)
    call((x.clone(),))
    assert len(graph_calls) == 1
    x_grad, x_strided = x.clone().requires_grad_(), x.t().contiguous().t()
    changed = {  # what: (the call it follows, the call)
        "another shape": (one, {"args": (x[:3],)}),
        "grad mode on": (one, {"args": one, "grad": True}),
        "x requires grad": (one, {"args": (x_grad,)}),
        "x strided": (one, {"args": (x_strided,)}),
        "a keyword argument": (one, {"args": one, "scale": 2.0}),
        "another argument count": (one, {"args": two}),
        "another shape, two arguments": (two, {"args": (x[:3], 2.0)}),
        "grad mode on, two arguments": (two, {"args": two, "grad": True}),
        "strided, two arguments": (two, {"args": (x_strided, 2.0)}),
        "x requires grad, two arguments": (two, {"args": (x_grad, 2.0)}),
        "a non-tensor of another type": (two, {"args": (x, 2)}),
    }
    for what, (follows, changed_call) in changed.items():
        before = len(graph_calls)
        call(follows)
        assert len(graph_calls) == before, what
        call(**changed_call)
        assert len(graph_calls) == before + 1, what
        call(**changed_call)
        assert len(graph_calls) == before + 1, what
    for follows in (one, two):
        call(follows)
        autotune.clear_memory()  # (dualk.module_choice forgets its choices with it)
        before = len(graph_calls)
        call(follows)
        call(follows)
        assert len(graph_calls) == before + 1
    for follows in (one, two):  # x of another dtype (the parameters, shared, converted too)
        model.float()
        call(follows)
        model.bfloat16()
        before = len(graph_calls)
        call((x.bfloat16(), *follows[1:]))
        call((x.bfloat16(), *follows[1:]))
        assert len(graph_calls) == before + 1


def test_forgotten_signatures_are_not_served(measured, monkeypatch):
    # At MAX_SIGNATURES the recorded signatures are forgotten, the last one served with them
    torch.manual_seed(17)
    model = _WithScaledMlp().eval()
    fused = fuse(model)
    ff = _fused_forward(fused.block)
    ff.MAX_SIGNATURES = 2
    graph_calls = _count_calls(monkeypatch, ff.graph, "forward")
    x = torch.randn(4, 8)
    with torch.no_grad():
        fused.block(x)
        fused.block(x[:3])
        fused.block(x[:3], scale=2.0)  # the third: the first two forgotten
        assert len(graph_calls) == 3
        fused.block(x[:3])
        assert len(graph_calls) == 4


def test_children_changed_after_fusing_run_the_class_forward(measured):
    torch.manual_seed(18)
    model = _WithScaledMlp().eval()
    fused = fuse(model)
    block = fused.block
    x = torch.randn(4, 8)
    with torch.no_grad():
        fused(x)
        fused(x)  # the shortcut: the block's own forward
        block.act = nn.ReLU()
        for y in (x, torch.randn(5, 8)):  # a like call and a new one
            assert block(y).equal(block.fc2(F.relu(block.fc1(y))))


def test_compiled_submodule_fusion_after_the_shortcut(measured):
    # Under torch.compile the fused graph is traced whatever eager calls recorded (its modules'
    # choice is a constant of the compiled graph), without a graph break.
    torch.manual_seed(19)
    model = _Blocks().eval()
    fused = fuse(model)
    x = torch.randn(4, 8)
    with torch.no_grad():
        fused(x)
        fused(x)
        torch._dynamo.reset()
        compiled = torch.compile(fused, fullgraph=True, backend="aot_eager")
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)


def _aliasing_guards(model, x) -> int:
    """How many object-aliasing guards ("a is b", checked in Python on every call of the
    compiled model) torch.compile installs for `model`: one per object its trace reached by
    two paths."""
    guards = pytest.importorskip("torch._dynamo.guards")
    builder = getattr(guards, "GuardBuilder", None)
    if builder is None or not hasattr(builder, "DUPLICATE_INPUT"):
        pytest.skip("this torch's Dynamo has no GuardBuilder.DUPLICATE_INPUT")
    count = [0]
    duplicate_input = builder.DUPLICATE_INPUT

    def counted(self, guard, source_b):
        count[0] += 1
        return duplicate_input(self, guard, source_b)

    torch._dynamo.reset()
    builder.DUPLICATE_INPUT = counted
    try:
        torch.compile(model, backend="eager")(x)
    finally:
        builder.DUPLICATE_INPUT = duplicate_input
        torch._dynamo.reset()
    return count[0]


def test_compiled_fused_model_reaches_each_module_by_one_path(measured, monkeypatch):
    # Each object a Dynamo trace reaches by two paths costs a Python "a is b" check per call.
    # A fused forward that compared its owner's children while traced had ~16 per fused Mlp
    # (a compiled timm ViT ran 0.92x its original on an H200): the compiled fused model may
    # have only the original's and a few global ones (torch.nn.functional imported by dualk).
    monkeypatch.setattr(module_choice, "compiled_path", lambda *args: "original")
    torch.manual_seed(20)
    blocks = _Blocks().eval()
    sequential = _torchvision_style_mlp()
    with torch.no_grad():
        for model, x in ((blocks, torch.randn(4, 8)), (sequential.eval(), torch.randn(4, 8))):
            fused = fuse(copy.deepcopy(model))
            assert _fused_modules(fused)
            assert _aliasing_guards(fused, x) <= _aliasing_guards(model, x) + 6
            torch._dynamo.reset()
            torch.testing.assert_close(
                torch.compile(fused, backend="eager")(x), model(x), rtol=1e-5, atol=1e-6
            )
        # A child replaced after fusing: the next compile traces the class's own forward.
        fused = fuse(copy.deepcopy(blocks))
        fused.mlps[0].act = nn.ReLU()
        x = torch.randn(4, 8)
        want = fused.mlps[0].fc2(F.relu(fused.mlps[0].fc1(fused.norm(x))))
        torch._dynamo.reset()
        got = torch.compile(fused.mlps[0], backend="eager")(fused.norm(x))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        torch._dynamo.reset()


def test_compiled_one_module_graph_on_the_original_path_traces_the_unfused_graph(
    measured, monkeypatch
):
    # fuse's GraphModule is one FusedMLP whose compiled choice is the original path: Dynamo
    # traces the unfused graph (the original's code and guards), not the fused module.
    # So does a graph whose one FusedMLP takes its input and is followed by unfused modules
    # (torchvision's MLP ends in a Dropout the chain leaves out): no object aliasing checked.
    torch.manual_seed(23)
    single = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    trailing = _torchvision_style_mlp().eval()
    for model in (single, trailing):
        monkeypatch.setattr(module_choice, "compiled_path", lambda *args: "original")
        fused = fuse(model)
        ff = _fused_forward(fused)
        assert ff.traces_original and ff.single_mlp == (model is single)
        x = torch.randn(5, 8)
        with torch.no_grad():
            torch._dynamo.reset()
            explained = torch._dynamo.explain(fused)(x)
            guards = " ".join(str(g) for g in explained.out_guards)
            assert "original" in guards and "dualk_fused_mlp" not in guards
            assert _aliasing_guards(fused, x) <= _aliasing_guards(model, x)
            torch._dynamo.reset()
            got = torch.compile(fused, backend="eager", fullgraph=True)(x)
            torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-6)
        monkeypatch.setattr(module_choice, "compiled_path", lambda *args: "fused")
        with torch.no_grad():
            torch._dynamo.reset()
            guards = " ".join(str(g) for g in torch._dynamo.explain(fused)(x).out_guards)
            assert "dualk_fused_mlp" in guards
            torch._dynamo.reset()
            got = torch.compile(fused, backend="eager", fullgraph=True)(x)
            torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-6)
        torch._dynamo.reset()


def test_whole_model_graph_whose_fused_modules_run_original_runs_the_unfused_graph(measured):
    # fuse's GraphModule result (chains at the model's top level: an nn.Sequential MLP): where
    # its fused modules all run original, a like call runs the unfused graph over the same
    # Linears, for inference and for training (gradients reach the model's parameters).
    torch.manual_seed(16)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                          nn.Linear(16, 4))  # fmt: skip
    fused = fuse(model)
    assert isinstance(fused, torch.fx.GraphModule)
    ff = _fused_forward(fused)
    assert ff.original is not None and ff.owner is fused
    calls = []
    (inner,) = [m for m in fused.modules() if isinstance(m, FusedMLP)]
    inner.register_forward_hook(lambda *a: calls.append(1))
    x = torch.randn(5, 8)
    with torch.no_grad():
        first = fused(x)  # measured: original, through the fused graph
        assert calls == [1]
        for _ in range(2):
            torch.testing.assert_close(fused(x), first, rtol=0, atol=0)
        assert calls == [1]  # the unfused graph: no FusedMLP call
        fused(torch.randn(3, 8))  # another signature: through the fused graph again
        assert calls == [1, 1]
    torch.testing.assert_close(first, model(x), rtol=1e-5, atol=1e-6)
    for _ in range(3):  # training calls: a signature of their own, then the shortcut
        loss = fused(x).square().sum()
        loss.backward()
        want = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model(x).square().sum().backward()
        for got, ref in zip(want, model.parameters()):
            torch.testing.assert_close(got, ref.grad, rtol=1e-5, atol=1e-6)
        model.zero_grad()
    assert calls == [1, 1, 1]
    copied = copy.deepcopy(fused)
    torch.testing.assert_close(copied(x), model(x), rtol=1e-5, atol=1e-6)
    compiled = torch.compile(fused, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)


def test_one_mlp_graph_runs_the_modules_plan_directly(monkeypatch):
    # A fuse'd MLP whose FusedMLP has a C++ plan (on a GPU: dualk/nn.py _FastPath) runs it from
    # the fused forward, without calling the module, where the module has no hooks and the
    # graph's children are as fused; otherwise the module is called (and may use the plan
    # itself). On the CPU the plan is a stand-in that counts its calls.
    torch.manual_seed(24)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    fused = fuse(model)
    (inner,) = _fused_modules(fused)
    x = torch.randn(3, 8)
    planned = torch.full((3, 4), 7.0)
    served = []

    stand_in_fast_path(inner, x, planned, served)
    forwards = _count_calls(monkeypatch, type(inner), "forward")
    with torch.no_grad():
        assert fused(x) is planned
        assert served == [True] and forwards == []
        hooked = []
        handle = inner.register_forward_hook(lambda *a: hooked.append(1))
        assert fused(x) is planned  # a hook: the module is called (its forward takes the plan)
        assert hooked == [1] and len(forwards) == 1 and len(served) == 2
        handle.remove()
        assert fused(x) is planned and len(forwards) == 1 and len(served) == 3
        fused.extra = nn.Identity()  # the graph's children changed: the class's forward,
        # which calls the module; its own call takes the plan (no hooks), not its forward
        assert fused(x) is planned and len(forwards) == 1 and len(served) == 4
        del inner.__dict__["_fast"]  # no plan: the module's own forward, PyTorch's answer
        torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
        assert len(forwards) == 2 and len(served) == 4


def test_one_mlp_graph_with_a_child_replaced_before_its_first_call():
    # The GraphModule's guarded copy of the plan takes its children as fused: a child swapped
    # before the copy is made (here: before the first call) makes the call decline, not serve
    # the old MLP (the graph calls the new child).
    torch.manual_seed(25)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    fused = fuse(model)
    (inner,) = _fused_modules(fused)
    name = next(k for k, v in fused._modules.items() if v is inner)
    x = torch.randn(3, 8)
    served: list = []
    stand_in_fast_path(inner, x, torch.full((3, 4), 7.0), served)
    setattr(fused, name, nn.Identity())
    with torch.no_grad():
        out = fused(x)
    assert served == [] and torch.equal(out, x)


class _Intermediate(nn.Module):
    """BERT's intermediate: dense + GELU (fused alone: a LinearGELU)."""

    def __init__(self):
        super().__init__()
        self.dense, self.act = nn.Linear(8, 16), nn.GELU()

    def forward(self, x):
        return self.act(self.dense(x))


class _UntraceableLayers(nn.Module):
    """A model torch.fx cannot trace (Python control flow on a tensor's value): its children
    are fused one by one, as BERT's are."""

    def __init__(self):
        super().__init__()
        self.inter = nn.ModuleList(_Intermediate() for _ in range(2))
        self.out = nn.ModuleList(nn.Linear(16, 8) for _ in range(2))

    def forward(self, x):
        for inter, out in zip(self.inter, self.out):
            x = x + out(inter(x))
        return x if bool(x.sum() != 0) else -x


def test_compiled_submodule_graphs_on_the_original_path_trace_their_unfused_graph(
    measured, monkeypatch
):
    # Chains fused inside submodules (timm's Mlp: a FusedMLP; BERT's intermediate: a
    # LinearGELU) whose compiled choice is original: Dynamo traces each submodule's unfused
    # graph (a copy of its trace before fusing, over its own children), not the fused modules,
    # and reaches no object by a second path.
    torch.manual_seed(25)
    for model in (_Blocks().eval(), _UntraceableLayers().eval()):
        fused = fuse(copy.deepcopy(model))
        inner = _fused_modules(fused)
        assert inner and all(
            _fused_forward(owner).traces_original
            for owner in fused.modules()
            if type(owner.__dict__.get("forward")).__name__ == "_FusedForward"
        )
        x = torch.randn(4, 8)
        for choice in ("original", "fused"):
            monkeypatch.setattr(module_choice, "compiled_path", lambda *args, c=choice: c)
            with torch.no_grad():
                torch._dynamo.reset()
                explained = torch._dynamo.explain(fused)(x)
                guards = " ".join(str(g) for g in explained.out_guards)
                reached = re.search(r"dualk_(fused_mlp|linear_gelu)_\d", guards) is not None
                assert reached == (choice == "fused"), choice
                if choice == "original":
                    assert _aliasing_guards(fused, x) <= _aliasing_guards(model, x)
                torch._dynamo.reset()
                got = torch.compile(fused, backend="eager")(x)
                torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


def _choices_on_dualks_path(measured, monkeypatch):
    """module_choice (timing each module alone, with the fixture's fake timer) picks dualk's
    path, nothing from an earlier test's cache file; returns dualk.fuse's module."""
    costs, _ = measured
    costs["fused"], costs["original"] = 5.0, 10.0
    monkeypatch.setattr(autotune, "store_for", lambda device: _NoFile())
    return sys.modules["dualk.fuse"]


def _fake_audit_clock(monkeypatch, fuse_module, fused_cost=None, original_cost=None) -> list:
    """The in-model check's marks read `now[0]`, which the fused module's forward (FusedMLP) and
    the owner's original forward (TimmMlp) advance by their cost: a number, or a function of the
    module and the input; None leaves that forward as it is."""
    now = [0.0]
    monkeypatch.setattr(fuse_module, "_audit_mark", lambda device: now[0])
    monkeypatch.setattr(fuse_module, "_audit_ms", lambda start, end: end - start)

    def costing(real, cost):  # (forward(self, x) exactly: fx traces the owner's signature)
        def forward(self, x):
            now[0] += cost(self, x) if callable(cost) else cost
            return real(self, x)

        return forward

    for cls, cost in ((FusedMLP, fused_cost), (TimmMlp, original_cost)):
        if cost is not None:
            monkeypatch.setattr(cls, "forward", costing(cls.forward, cost))
    return now


@pytest.mark.parametrize("fused_cost, kept", [(5.0, "original"), (1.0, "fused")])
def test_in_model_check_keeps_the_faster_path(measured, monkeypatch, fused_cost, kept):
    # module_choice measures each module alone; inside a model its Python runs between the
    # model's own code, and a host-bound model paid more than the device saved (BERT on an H200:
    # 0.91x with dualk's path chosen). Like inference calls on dualk's path are timed in place
    # against the original path, alternating, and the slower one is dropped for that signature.
    # A fake clock: the fused module's call costs `fused_cost`, the owner's original forward 2.
    fuse_module = _choices_on_dualks_path(measured, monkeypatch)
    monkeypatch.setattr(fuse_module, "RESTORE_AFTER", 3)
    fused_calls = _count_calls(monkeypatch, FusedMLP, "forward")
    _fake_audit_clock(monkeypatch, fuse_module, fused_cost=fused_cost, original_cost=2.0)
    torch.manual_seed(33)
    model = _Blocks().eval()
    fused = fuse(model)
    forwards = [_fused_forward(block) for block in fused.mlps]
    x = torch.randn(4, 8)
    calls = 2 + fuse_module.AUDIT_WARM + 2 * fuse_module.AUDIT_PAIRS
    with torch.no_grad():
        for _ in range(calls):
            torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
        verdicts = [forward.audits for forward in forwards]
        assert [[v[0] for v in audits.values()] for audits in verdicts] == [[kept], [kept]]
        assert fuse_module.audit_verdicts(fused) == {kept: 2}
        fused_calls.clear()
        for _ in range(5):
            torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
    assert len(fused_calls) == (0 if kept == "original" else 10)
    # an owner whose every check said original gets its own forward back, as one whose modules
    # all chose the original path
    assert [fuse_module.forward_restored(b) for b in fused.mlps] == [kept == "original"] * 2
    assert fuse_module.audit_verdicts(fused) == {kept: 2}  # (restored owners' verdicts too)
    # the medians behind the verdict (the zoo's note): one check shared by the identical owners
    ((path, fused_ms, original_ms),) = fuse_module.audit_times(fused)
    assert path == kept and (fused_ms < original_ms) == (kept == "fused")
    # training calls are not checked (module_choice times forward + backward there)
    x_grad = torch.randn(4, 8, requires_grad=True)
    fused.train()
    for _ in range(calls):
        fused(x_grad).sum().backward()
    assert all(len(forward.audits) == 1 for forward in forwards)


def test_in_model_check_goes_on_between_calls_of_another_shape(measured, monkeypatch):
    # A model called with two shapes in turn: the check of the first signature still concludes
    # (its calls reach it through the general path too), and then the second one is checked.
    fuse_module = _choices_on_dualks_path(measured, monkeypatch)
    _fake_audit_clock(monkeypatch, fuse_module, original_cost=-1.0)  # (the original: faster)
    torch.manual_seed(34)
    model = _Blocks().eval()
    fused = fuse(model)
    a, b = torch.randn(4, 8), torch.randn(6, 8)
    calls = 2 * (2 + fuse_module.AUDIT_WARM + 2 * fuse_module.AUDIT_PAIRS)
    with torch.no_grad():
        for _ in range(calls):
            for x in (a, b):
                torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
    for block in fused.mlps:
        audits = _fused_forward(block).audits
        assert sorted(sig[2][0][0][0] for sig in audits) == [4, 6]
        assert {v[0] for v in audits.values()} == {"original"}


def test_in_model_check_times_only_its_own_signature(measured, monkeypatch):
    # One call of shape a starts a check, then shape b is called many times in a row: b's calls
    # are not timed into a's check (the graph is faster for a, slower for b). a's check, no longer
    # called, is dropped unjudged after AUDIT_OTHERS calls; b is then checked, and a again later.
    fuse_module = _choices_on_dualks_path(measured, monkeypatch)
    monkeypatch.setattr(fuse_module, "AUDIT_OTHERS", 6)
    _fake_audit_clock(
        monkeypatch,
        fuse_module,
        fused_cost=lambda module, x: 1.0 if x.shape[0] == 4 else 5.0,
        original_cost=2.0,
    )
    torch.manual_seed(35)
    model = _Blocks().eval()
    fused = fuse(model)
    a, b = torch.randn(4, 8), torch.randn(6, 8)
    calls = 2 + fuse_module.AUDIT_OTHERS + fuse_module.AUDIT_WARM + 2 * fuse_module.AUDIT_PAIRS
    with torch.no_grad():
        for x in [a] + [b] * (calls + 4) + [a] * (calls + 4):
            torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
    for block in fused.mlps:
        verdicts = {sig[2][0][0][0]: v[0] for sig, v in _fused_forward(block).audits.items()}
        assert verdicts == {4: "fused", 6: "original"}
    assert fuse_module.audit_verdicts(fused) == {"fused": 2, "original": 2}


def test_fx_symbolic_trace_during_an_in_model_check_leaves_it_alone(measured, monkeypatch):
    """torch.fx.symbolic_trace of a fused model whose in-model check is under way: the graph
    calls dualk's operators (the fused graph), gives the model's outputs, and the trace's
    Proxies reach no signature, check or mark of the model."""
    fuse_module = _choices_on_dualks_path(measured, monkeypatch)
    torch.manual_seed(37)
    model = _Blocks().eval()
    fused = fuse(copy.deepcopy(model))
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(3):
            fused(x)
        forwards = [_fused_forward(b) for b in fused.mlps]
        before = [(f.audit, list(f.audit.marks), f.last_graph, dict(f.audits)) for f in forwards]
        assert all(b[0] is not None for b in before)
        traced = torch.fx.symbolic_trace(fused)
        after = [(f.audit, list(f.audit.marks), f.last_graph, dict(f.audits)) for f in forwards]
        assert after == before
        called = [n.target for n in traced.graph.nodes if n.op == "call_function"]
        assert called.count(dualk.fused_mlp) == len(fused.mlps), traced.code
        torch.testing.assert_close(traced(x), model(x), rtol=1e-5, atol=1e-6)
    assert fuse_module.audit_verdicts(fused) == {"pending": len(fused.mlps)}


def test_a_copy_made_during_an_in_model_check_checks_again(measured, monkeypatch):
    fuse_module = _choices_on_dualks_path(measured, monkeypatch)
    torch.manual_seed(36)
    fused = fuse(_Blocks().eval())
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(3):
            fused(x)
        assert all(_fused_forward(b).audit is not None for b in fused.mlps)
        twin = copy.deepcopy(fused)
        assert all(_fused_forward(b).audit is None for b in twin.mlps)
        calls = 3 + fuse_module.AUDIT_WARM + 2 * fuse_module.AUDIT_PAIRS
        for _ in range(calls):
            twin(x)
        # one check at a time in the process: the copy's waits for the model's, which is still
        # under way (its model not called meanwhile), until that one goes stale
        assert all(not _fused_forward(b).audits for b in twin.mlps)
        # (both bounds: on a slow host the model's 20 periods can exceed the 0.05 s floor)
        monkeypatch.setattr(fuse_module, "AUDIT_STALE_S", 0.05)
        monkeypatch.setattr(fuse_module, "AUDIT_STALE_MAX_S", 0.05)
        time.sleep(0.1)  # (the model's check: no mark for longer than that)
        twin(x)
        # (the copy's own check must not go stale in turn between two calls of a slow host)
        monkeypatch.setattr(fuse_module, "AUDIT_STALE_S", 2.0)
        monkeypatch.setattr(fuse_module, "AUDIT_STALE_MAX_S", 30.0)
        for _ in range(calls):
            twin(x)
    assert all(len(_fused_forward(b).audits) == 1 for b in twin.mlps)
    assert all(_fused_forward(b).audit.dropped for b in fused.mlps)  # (stale: dropped)


def test_fused_models_pickle_and_copy_during_and_after_a_check(measured, monkeypatch):
    # A check's key names the owner's class, for fuse's whole-model result a GraphModule class
    # local to fx (not picklable): pickling such a model mid-check raised. Copies and pickles
    # work during and after checks, whole-model results and models fused in place alike.
    fuse_module = _choices_on_dualks_path(measured, monkeypatch)
    for model, x in (
        (_WideBlock().eval(), torch.randn(4, 64)),
        (_Blocks().eval(), torch.randn(4, 8)),
    ):
        fused = fuse(model)
        with torch.no_grad():
            for call in range(3 + fuse_module.AUDIT_WARM + 2 * fuse_module.AUDIT_PAIRS):
                fused(x)
                if call in (3, 2 + fuse_module.AUDIT_WARM + 2 * fuse_module.AUDIT_PAIRS):
                    for twin in (pickle.loads(pickle.dumps(fused)), copy.deepcopy(fused)):
                        torch.testing.assert_close(twin(x), model(x), rtol=1e-5, atol=1e-6)
        assert sum(fuse_module.audit_verdicts(fused).values()) >= 1


def test_identical_owners_share_one_in_model_check(measured, monkeypatch):
    # Checked apart, LLaMA's four identical decoder MLPs got different verdicts (H200: 1 fused, 3
    # original). Identical owners of one fuse call share one check: the first leads (its calls
    # mark the periods), the other follows the lead's path, and both get its verdict. Here owner
    # 0's fused module costs 1 and owner 1's 3, the original path 2 each: apart they would split
    # (fused, original); the periods hold both owners' calls (fused 4, original 4: not 1% faster)
    # and both get "original".
    fuse_module = _choices_on_dualks_path(measured, monkeypatch)
    fused_runs = [0, 0]

    def cost(module, x):
        index = fused_mlps.index(module)
        fused_runs[index] += 1
        return 1.0 if index == 0 else 3.0

    _fake_audit_clock(monkeypatch, fuse_module, fused_cost=cost, original_cost=2.0)
    torch.manual_seed(39)
    model = _Blocks().eval()
    fused = fuse(model)
    fused_mlps = [next(m for m in b.modules() if isinstance(m, FusedMLP)) for b in fused.mlps]
    forwards = [_fused_forward(block) for block in fused.mlps]
    x = torch.randn(4, 8)
    calls = 3 + fuse_module.AUDIT_WARM + 2 * fuse_module.AUDIT_PAIRS
    with torch.no_grad():
        for _ in range(calls):
            torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
            if (audit := forwards[0].audit) is not None and audit.verdict is None:
                assert forwards[1].audit is audit and audit.lead is forwards[0]
    verdicts = [[v[0] for v in f.audits.values()] for f in forwards]
    assert verdicts == [["original"], ["original"]]
    assert fuse_module.audit_verdicts(fused) == {"original": 2}
    # both owners ran the original path in the same periods (the first call measured them)
    assert fused_runs[0] == fused_runs[1] <= calls - fuse_module.AUDIT_PAIRS


def test_owners_of_other_shapes_are_checked_apart(measured, monkeypatch):
    # Owners of one class whose parameters differ in shape are not identical: each has its own
    # check and verdict (the narrow one's fused module is faster here, the wide one's slower),
    # one after the other (a period holds both owners' calls: two checks alternating together
    # would time each other's paths).
    fuse_module = _choices_on_dualks_path(measured, monkeypatch)
    _fake_audit_clock(
        monkeypatch,
        fuse_module,
        fused_cost=lambda module, x: 1.0 if module.layers[0].out_features == 16 else 5.0,
        original_cost=2.0,
    )
    torch.manual_seed(40)
    model = _Blocks()
    model.mlps[1] = TimmMlp(8, 32)
    model.eval()
    fused = fuse(model)
    forwards = [_fused_forward(block) for block in fused.mlps]
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(2 * (3 + fuse_module.AUDIT_WARM + 2 * fuse_module.AUDIT_PAIRS)):
            torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
            active = [f.audit for f in forwards if f.audit is not None and f.audit.verdict is None]
            assert len(active) <= 1
    assert [[v[0] for v in f.audits.values()] for f in forwards] == [["fused"], ["original"]]


def _three_blocks(seed: int) -> nn.Module:
    """_Blocks with a third owner of another shape (another check, after the first)."""
    torch.manual_seed(seed)
    model = _Blocks()
    model.mlps.append(TimmMlp(8, 32))
    return model.eval()


def test_a_check_whose_lead_stops_does_not_block_the_others(measured, monkeypatch):
    # The lead's children are replaced mid-check (an adapter injected into some layers): it
    # leaves and drops the check, whose follower starts another; the owner of another shape is
    # checked after it. A lead that is no longer called at all (the model calls one block
    # directly) hands the check to a follower after AUDIT_LEAD_WAIT calls per member.
    fuse_module = _choices_on_dualks_path(measured, monkeypatch)
    _fake_audit_clock(monkeypatch, fuse_module, original_cost=2.0)
    model = _three_blocks(50)
    fused = fuse(model)
    forwards = [_fused_forward(b) for b in fused.mlps]
    x = torch.randn(4, 8)
    calls = 3 + fuse_module.AUDIT_WARM + 2 * fuse_module.AUDIT_PAIRS
    with torch.no_grad():
        for _ in range(2 + fuse_module.AUDIT_WARM + 2):
            fused(x)
        audit = forwards[0].audit
        assert audit.lead is forwards[0] and forwards[1].audit is audit and not forwards[2].audit
        fused.mlps[0].fc2 = model.mlps[0].fc2 = nn.Linear(16, 8)
        for _ in range(3 * calls):
            torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
    assert audit.dropped and forwards[0].audit is None
    assert [[v[0] for v in f.audits.values()] for f in forwards[1:]] == [["fused"], ["fused"]]
    assert fuse_module._active_check() is None
    # the lead no longer called
    twin = fuse(_three_blocks(50))
    forwards = [_fused_forward(b) for b in twin.mlps]
    with torch.no_grad():
        for _ in range(3):
            twin(x)
        audit = forwards[0].audit
        assert audit.lead is forwards[0] and forwards[1].audit is audit
        for _ in range(fuse_module.AUDIT_LEAD_WAIT * audit.members + calls):
            twin.mlps[1](x)
    assert audit.lead is forwards[1] and audit.verdict is not None
    assert [v[0] for v in forwards[1].audits.values()] == ["fused"]


def test_an_owner_restored_mid_check_leaves_it(measured, monkeypatch):
    # The 16-wide owners' check of shape a is under way when shape b (the original path faster
    # for them: module_choice's fake timer) restores them; the lead leaves its check, so the
    # 32-wide owner (dualk's path faster at both shapes) is checked at once, not after the
    # abandoned check goes stale.
    fuse_module = _choices_on_dualks_path(measured, monkeypatch)
    monkeypatch.setattr(fuse_module, "RESTORE_AFTER", 3)

    def timer(run, name, budget_ms):
        run()
        cells = dict(zip(run.__code__.co_freevars, (c.cell_contents for c in run.__closure__)))
        wide, rows = cells["weights"][0].shape[0], cells["x"].shape[0]
        faster = "original" if (wide == 16 and rows == 64) else "fused"
        return (5.0 if name.endswith(faster) else 10.0, 1.0)

    autotune.set_timer(timer)
    _fake_audit_clock(monkeypatch, fuse_module, original_cost=2.0)
    model = _three_blocks(56)
    fused = fuse(model)
    forwards = [_fused_forward(b) for b in fused.mlps]
    a, b = torch.randn(4, 8), torch.randn(64, 8)
    with torch.no_grad():
        fused(a)
        fused(a)
        audit = forwards[0].audit
        assert audit is not None and audit.lead is forwards[0]
        for _ in range(10):
            fused(b)
        restored = [fuse_module.forward_restored(m) for m in fused.mlps]
        assert restored == [True, True, False] and audit.dropped
        for _ in range(2 * (3 + fuse_module.AUDIT_WARM + 2 * fuse_module.AUDIT_PAIRS)):
            for x in (a, b):
                torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
    assert sorted(v[0] for v in forwards[2].audits.values()) == ["fused", "fused"]


def test_checks_of_two_fused_models_called_in_turn_run_one_at_a_time(measured, monkeypatch):
    # Two models fused apart and called in turn: a period of one holds the other's calls, so
    # their checks run one after the other (two alternating together timed each other's paths:
    # dualk's path strictly faster here, yet the first model's checks said "original").
    fuse_module = _choices_on_dualks_path(measured, monkeypatch)
    _fake_audit_clock(monkeypatch, fuse_module, original_cost=2.0)
    torch.manual_seed(54)
    a = fuse(_Blocks().eval())
    torch.manual_seed(55)
    b = fuse(_Blocks().eval())
    x = torch.randn(4, 8)
    signatures = _count_calls(monkeypatch, fuse_module, "_call_signature")
    with torch.no_grad():
        a(x)
        b(x)  # (b's owners: a's check is under way, they wait for it)
        assert all(_fused_forward(m).waiting_for is not None for m in b.mlps)
        assert fuse_module.audit_verdicts(b) == {"waiting": 2}
        for _ in range(2 + fuse_module.AUDIT_WARM + 2 * fuse_module.AUDIT_PAIRS):
            a(x)
            b(x)
            active = [c for c in fuse_module._CHECKS_UNDER_WAY if fuse_module._check_active(c)]
            assert len(active) <= 1
        # (the waiting owners kept their shortcut: no signature built while they waited, only
        # for the first calls and when a's check ended)
        assert len(signatures) <= 8
        for _ in range(3 + fuse_module.AUDIT_WARM + 2 * fuse_module.AUDIT_PAIRS):
            a(x)
            b(x)
    assert fuse_module.audit_verdicts(a) == fuse_module.audit_verdicts(b) == {"fused": 2}


def test_a_follower_of_a_dropped_check_joins_the_next(measured, monkeypatch):
    # The lead alone drops the check (calls of another shape reach it only); the follower's next
    # call takes the general path, joins the lead's next check and gets its verdict.
    fuse_module = _choices_on_dualks_path(measured, monkeypatch)
    monkeypatch.setattr(fuse_module, "AUDIT_OTHERS", 2)
    _fake_audit_clock(monkeypatch, fuse_module, fused_cost=5.0, original_cost=2.0)
    torch.manual_seed(51)
    model = _Blocks().eval()
    fused = fuse(model)
    forwards = [_fused_forward(m) for m in fused.mlps]
    a, b = torch.randn(4, 8), torch.randn(6, 8)
    with torch.no_grad():
        fused(a)
        fused(a)
        for _ in range(6):
            fused.mlps[0](b)  # (only the lead sees other calls)
        for _ in range(3 * (3 + fuse_module.AUDIT_WARM + 2 * fuse_module.AUDIT_PAIRS)):
            torch.testing.assert_close(fused(a), model(a), rtol=1e-5, atol=1e-6)
    verdicts = [{sig[2][0][0][0]: v[0] for sig, v in f.audits.items()} for f in forwards]
    assert verdicts[0][4] == verdicts[1][4] == "original"


def test_an_in_model_check_concludes_once_with_two_threads(measured, monkeypatch):
    # Two threads make the lead's last mark at once: one concludes, the other takes the verdict
    # (the marks no longer grow past the last period, the check does not stay under way).
    import threading

    fuse_module = _choices_on_dualks_path(measured, monkeypatch)
    now = _fake_audit_clock(monkeypatch, fuse_module, original_cost=2.0)
    barrier = threading.Barrier(2, timeout=5)

    def measurable(device):  # (asked before the lead's lock: both threads meet here)
        audit = forwards[0].audit
        if audit is not None and len(audit.marks) == 2 * fuse_module.AUDIT_PAIRS:
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait()

    torch.manual_seed(52)
    fused = fuse(_Blocks().eval())
    forwards = [_fused_forward(m) for m in fused.mlps]
    x = torch.randn(4, 8)

    def loop(n):
        with torch.no_grad():
            for _ in range(n):
                fused(x)

    loop(1 + fuse_module.AUDIT_WARM + 2 * fuse_module.AUDIT_PAIRS)
    audit = forwards[0].audit
    assert len(audit.marks) == 2 * fuse_module.AUDIT_PAIRS
    monkeypatch.setattr(module_choice, "measurable", measurable)
    threads = [threading.Thread(target=loop, args=(1,)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert audit.verdict is not None and len(audit.marks) == 2 * fuse_module.AUDIT_PAIRS + 1
    assert fuse_module.audit_verdicts(fused) == {"fused": 2} and now[0] > 0


class _WideBlock(nn.Module):
    """A residual MLP block whose fused graph (norm, FusedMLP, add) is not a lone FusedMLP: its
    owner's calls go through the in-model check."""

    def __init__(self, d=64):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Sequential(
            nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d)
        )  # fmt: skip

    def forward(self, x):
        return x + self.mlp(self.norm(x))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA events: needs a GPU")
def test_in_model_check_on_a_gpu_keeps_a_large_win_and_allows_capture():
    # Real CUDA events: a block whose fused MLP saves most of its device time (2^18 rows, three
    # 64-wide layers: memory-bound GEMMs in PyTorch) keeps dualk's path; a CUDA-graph capture
    # in the middle of a check neither raises nor counts. The check starts once every choice is
    # final (a background tuning may keep one provisional for a while: calls go on until the
    # verdict, at most 90 s; the first GPU run, which made 33 calls after settling, had none).
    from dualk.dispatch import triton_tune

    torch.manual_seed(37)
    model = _WideBlock().cuda().half().eval()
    fused = fuse(model)
    forward = _fused_forward(fused)
    x = torch.randn(2**18, 64, device="cuda", dtype=torch.half)
    captured_mid_check = False
    with torch.no_grad():
        settled = triton_tune.settle(lambda: (fused(x), torch.cuda.synchronize()), 90.0)
        deadline = time.monotonic() + 90.0
        while not forward.audits and time.monotonic() < deadline:
            out = fused(x)
            audit = forward.audit
            if audit is not None and not captured_mid_check and len(audit.marks) >= 2:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
                    captured = fused(x)
                torch.cuda.current_stream().wait_stream(side)
                graph.replay()
                torch.cuda.synchronize()
                torch.testing.assert_close(
                    captured.float(), model(x).float(), rtol=2e-2, atol=2e-2
                )  # fmt: skip
                captured_mid_check = True
        torch.testing.assert_close(out.float(), model(x).float(), rtol=2e-2, atol=2e-2)
    verdicts = list(forward.audits.values())
    state = {
        "settled": settled,
        "choice_final": [dualk.nn.choice_final(m) for m in forward.fused],
        "audit": None if forward.audit is None else vars(forward.audit),
        "module_choice": module_choice.details(),
    }
    assert [v[0] for v in verdicts] == ["fused"], (verdicts, state)
    assert captured_mid_check, state
    path, fused_ms, original_ms = verdicts[0]
    assert 0 < fused_ms < original_ms


def test_in_model_check_is_dropped_when_timing_is_switched_off(measured, monkeypatch):
    fuse_module = _choices_on_dualks_path(measured, monkeypatch)
    torch.manual_seed(38)
    fused = fuse(_Blocks().eval())
    forwards = [_fused_forward(b) for b in fused.mlps]
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(3):
            fused(x)
        assert all(f.audit is not None for f in forwards)
        monkeypatch.setattr(module_choice, "measurable", lambda device: "DUALK_AUTOTUNE=0")
        for _ in range(2 + fuse_module.AUDIT_WARM + 2 * fuse_module.AUDIT_PAIRS):
            fused(x)
    assert all(f.audit is None and not f.audits for f in forwards)


def _module_runs(modules, types) -> list:
    """The modules of `types` among `modules` as they run: each call appends the module."""
    runs: list = []
    for m in modules:
        if isinstance(m, types):
            m.register_forward_pre_hook(lambda mod, args: runs.append(mod))
    return runs


def _fused_runs(modules) -> list:
    """The FusedMLPs among `modules` as they run: each call appends the module to the list."""
    return _module_runs(modules, FusedMLP)


class _DropoutTailMlp(nn.Module):
    """Starcoder2's / MPT's MLP: its forward ends in F.dropout(..., training=self.training),
    so its graph differs between train() and eval(); `tail` a module the forward traces into
    (a custom dropout reading its own flag) instead, where given."""

    def __init__(self, tail: nn.Module | None = None):
        super().__init__()
        self.c_fc, self.act, self.c_proj = nn.Linear(8, 32), nn.GELU("tanh"), nn.Linear(32, 8)
        self.tail = tail

    def forward(self, x):
        h = self.c_proj(self.act(self.c_fc(x)))
        if self.tail is not None:
            return self.tail(h)
        return F.dropout(h, p=0.5, training=self.training)


class _CustomDropout(nn.Module):  # (not a torch.nn class: fx traces into it)
    def forward(self, x):
        return F.dropout(x, p=0.5, training=self.training)


class _UntraceableBlocks(nn.Module):
    """A model fx cannot trace (a branch on a tensor's value): its children are fused."""

    def __init__(self, mlps):
        super().__init__()
        self.mlps = nn.ModuleList(mlps)

    def forward(self, x):
        for mlp in self.mlps:
            x = x + mlp(x) if x.sum() > -1e9 else x
        return x


@pytest.mark.parametrize("fused_in", ["eval", "train"])
def test_a_forward_reading_its_own_training_flag_is_fused_for_the_mode_it_was_fused_in(fused_in):
    # Starcoder2's, MPT's and BLOOM's MLPs end in F.dropout(..., training=self.training): fuse
    # refused them ("computes otherwise in train() and eval()") and their models fused nothing.
    # A forward whose graph depends on its own flag only now runs the fused graph in the mode it
    # was fused in and its class forward in the other: the original's outputs and gradients in
    # both (same random stream for the dropout).
    torch.manual_seed(44)
    model = _UntraceableBlocks([_DropoutTailMlp(), _DropoutTailMlp()])
    model.train(fused_in == "train")
    fused, rep = fuse(model, report=True)
    assert len(rep.fused) == 2, rep
    assert (
        sum(f"in {fused_in}() mode (its forward reads self.training" in n for n in rep.notes) == 2
    )
    runs = _fused_runs(fused.modules())
    x = torch.randn(4, 8)
    for mode in ("eval", "train", "eval", "train"):
        for m in (model, fused):
            m.train(mode == "train")
        runs.clear()
        xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
        outs = []
        for m, xi in zip((model, fused), xs):
            torch.manual_seed(45)
            outs.append(m(xi))
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-6)
        grads = [torch.autograd.grad(o.square().sum(), xi) for o, xi in zip(outs, xs)]
        torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-5)
        assert len(runs) == (2 if mode == fused_in else 0), mode
        if mode == "train":
            assert not torch.equal(outs[0], model.eval()(x)), "dropout dropped nothing in train()"


def test_a_forward_whose_traced_child_reads_its_flag_is_fused_with_that_child_as_a_leaf():
    # The graph depends on a traced-into child's flag, not the owner's: the owner's flag alone
    # cannot tell which graph holds, so that trace is refused (and says why). Since session 34
    # the owner's own code is traced with its children as leaves (_fuse_own_forward): the child
    # then reads its flag as it runs, so the one graph holds in both modes.
    torch.manual_seed(46)
    model = _UntraceableBlocks([_DropoutTailMlp(tail=_CustomDropout())]).eval()
    fused, rep = fuse(copy.deepcopy(model), report=True)
    assert [c.kind for c in rep.fused] == ["FusedMLP"], str(rep)
    assert any("computes otherwise in train() and eval()" in n for n in rep.notes), rep.notes
    runs = _fused_runs(fused.modules())
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
    fused.train(), model.train()
    torch.manual_seed(47)
    want = model(x)
    torch.manual_seed(47)
    torch.testing.assert_close(fused(x), want, rtol=1e-5, atol=1e-6)
    assert len(runs) == 2  # (the fused graph in both modes: the child drops as it runs)


def test_real_transformers_mlps_that_read_their_training_flag_are_fused():
    # (fused as the whole model: the MLP itself keeps its class and runs the fused graph in eval)
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (the real MLP classes are optional)"
    )
    from transformers.models.bloom.modeling_bloom import BloomMLP
    from transformers.models.starcoder2.modeling_starcoder2 import Starcoder2MLP

    torch.manual_seed(47)
    starcoder = Starcoder2MLP(
        transformers.Starcoder2Config(hidden_size=16, intermediate_size=64, residual_dropout=0.1)
    )
    bloom = BloomMLP(transformers.BloomConfig(hidden_size=16, hidden_dropout=0.1))
    for mlp, args in ((starcoder, 1), (bloom, 2)):
        mlp.eval()
        fused_mlp = fuse(copy.deepcopy(mlp))
        runs = _fused_runs(fused_mlp.modules())
        xs = [torch.randn(2, 3, 16) for _ in range(args)]
        with torch.no_grad():
            torch.testing.assert_close(fused_mlp(*xs), mlp(*xs), rtol=1e-5, atol=1e-6)
        assert len(runs) == 1, type(mlp).__name__  # (the fused graph ran in eval())
        fused_mlp.train(), mlp.train()
        torch.manual_seed(48)
        want = mlp(*xs)
        torch.manual_seed(48)
        torch.testing.assert_close(fused_mlp(*xs), want, rtol=1e-5, atol=1e-6)
        assert len(runs) == 1  # (train(): the class's forward)


class _Conv1D(nn.Module):
    """transformers' Conv1D as GPT-2 uses it (`x @ weight + bias`, weight (in, out)), with its
    module and class name (fuse matches it by them; transformers is optional)."""

    def __init__(self, nf: int, nx: int):
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = nn.Parameter(torch.randn(nx, nf) * nx**-0.5)
        self.bias = nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


_Conv1D.__module__, _Conv1D.__qualname__ = "transformers.pytorch_utils", "Conv1D"


class _Gpt2Mlp(nn.Module):
    """GPT-2's MLP: c_fc, GELU, c_proj, dropout, as transformers writes it."""

    def __init__(self, conv=_Conv1D, width: int = 16, hidden: int = 64):
        super().__init__()
        self.c_fc, self.c_proj = conv(hidden, width), conv(width, hidden)
        self.act, self.dropout = nn.GELU("tanh"), nn.Dropout(0.0)

    def forward(self, x):
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


def _gpt2_mlps(conv=_Conv1D) -> nn.Module:
    return _UntraceableBlocks([_Gpt2Mlp(conv), _Gpt2Mlp(conv)])


def test_gpt2_conv1d_and_gelu_run_as_a_linear_gelu_over_the_transposed_weight():
    # GPT-2's MLP fused nothing: transformers' Conv1D (weight in x out) was no candidate, and
    # the report did not list it. c_fc + GELU now run as a LinearGELU over the Conv1D's weight
    # transposed (a view), c_proj is reported with the reason, state_dict keys are unchanged.
    torch.manual_seed(49)
    model = _gpt2_mlps().eval()
    fused, rep = fuse(model, report=True)
    assert [(c.kind, c.widths, c.activation) for c in rep.fused] == [
        ("LinearGELU", [16, 64], "gelu(tanh)")
    ] * 2, rep
    skipped = {s.where: s.reason for s in rep.skipped}
    assert set(skipped) == {"mlps.0.c_proj", "mlps.1.c_proj"}
    assert all("Conv1D is fused only with a GELU" in r for r in skipped.values())
    assert list(fused.state_dict()) == list(model.state_dict())
    gelu = next(m for m in fused.modules() if isinstance(m, LinearGELU))
    conv = fused.mlps[0].c_fc
    assert gelu.weight.shape == (64, 16) and gelu.weight.data_ptr() == conv.weight.data_ptr()
    x = torch.randn(3, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-5)
        # an in-place update reaches the kept view (same memory); a replaced parameter, a new
        # dtype and `.data` make a new one
        for m in (model, fused):
            m.mlps[0].c_fc.weight.mul_(1.5)
        torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-5)
        new = nn.Parameter(torch.randn(16, 64))
        model.mlps[1].c_fc.weight = new
        fused.mlps[1].c_fc.weight = new
        torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-5)
        data = torch.randn(16, 64)
        model.mlps[0].c_fc.weight.data = data
        fused.mlps[0].c_fc.weight.data = data.clone()
        torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-5)
        model.to(torch.bfloat16), fused.to(torch.bfloat16)
        xb = x.to(torch.bfloat16)
        torch.testing.assert_close(fused(xb), model(xb), rtol=2e-2, atol=2e-2)
    # training: the gradients reach the Conv1D's own weight and bias
    model.float().train(), fused.float().train()
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    outs = [m(xi) for m, xi in zip((model, fused), xs)]
    wants = torch.autograd.grad(outs[0].square().sum(), (xs[0], *model.parameters()))
    gots = torch.autograd.grad(outs[1].square().sum(), (xs[1], *fused.parameters()))
    for got, want in zip(gots, wants):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_a_conv1d_with_hooks_or_without_a_gelu_is_left_alone_with_the_reason():
    torch.manual_seed(50)
    model = _gpt2_mlps().eval()
    model.mlps[0].c_fc.register_forward_hook(lambda m, i, o: None)
    model.mlps[1].act = nn.ReLU()
    fused, rep = fuse(model, report=True)
    assert not rep.fused
    skipped = {s.where: s.reason for s in rep.skipped}
    assert "forward hooks" in skipped["mlps.0.c_fc"], skipped
    assert "fused only with a GELU" in skipped["mlps.1.c_fc"], skipped
    x = torch.randn(3, 16)
    torch.testing.assert_close(fused(x), model(x))


def test_real_transformers_gpt2_mlp_is_fused():
    pytest.importorskip(
        "transformers", reason="transformers is not installed (the real Conv1D is optional)"
    )
    from transformers.pytorch_utils import Conv1D

    assert Conv1D.__module__ in sys.modules["dualk.fuse"]._CONV1D_MODULES
    torch.manual_seed(51)
    model = _gpt2_mlps(conv=Conv1D).eval()
    fused, rep = fuse(model, report=True)
    assert [c.kind for c in rep.fused] == ["LinearGELU"] * 2, rep
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-5)


def test_fx_trace_of_a_fused_model_follows_changed_children_and_fused_containers():
    # (review, session 33) fx's branch ran the fused graph where eager calls run the class's
    # forward: after a child was replaced the trace computed the old graph; and a container
    # fused in place (its fused modules not its submodules: len and order kept) raised NameError
    torch.manual_seed(52)
    model = _Blocks().eval()
    fused = fuse(copy.deepcopy(model))
    model.mlps[0].act = nn.ReLU()
    fused.mlps[0].act = nn.ReLU()
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(
            torch.fx.symbolic_trace(fused)(x), model(x), rtol=1e-5, atol=1e-6
        )

    class Wrap(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x) + 1

    seq = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    untraceable = _UntraceableBlocks([seq]).eval()
    fused = fuse(untraceable)
    assert _fused_forward(fused.mlps[0]) is not None  # (the Sequential fused in place)
    with torch.no_grad():
        traced = torch.fx.symbolic_trace(Wrap(fused.mlps[0]))
        torch.testing.assert_close(traced(x), seq(x) + 1, rtol=1e-5, atol=1e-6)


def test_conv1d_fused_models_trace_with_fx_and_jit_and_follow_data_swaps():
    # (review, session 33) the LinearGELU over a Conv1D kept its transposed view across calls:
    # fx tracing hit the Proxy in its cache check, torch.jit.trace froze the view as a constant,
    # and a `.data` swap keeping the pointer (a square weight transposed) served the old view.
    torch.manual_seed(53)
    model = nn.Sequential(_Conv1D(16, 16), nn.GELU("tanh"), _Conv1D(16, 16)).eval()
    fused = fuse(copy.deepcopy(model))
    x = torch.randn(4, 16)
    with torch.no_grad():
        traced = torch.fx.symbolic_trace(fused)
        assert dualk.linear_gelu in [n.target for n in traced.graph.nodes], traced.code
        torch.testing.assert_close(traced(x), model(x), rtol=1e-5, atol=1e-5)
        scripted = torch.jit.trace(fused, x)
        torch.testing.assert_close(scripted(x * 2), model(x * 2), rtol=1e-5, atol=1e-5)
        fused(x)
        for m in (model, fused):  # (same memory, other strides)
            m.get_submodule("0").weight.data = m.get_submodule("0").weight.data.t()
        torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-5)
    _, rep = fuse(model, min_layers=2, report=True)
    assert not rep.fused
    assert "fewer than min_layers=2" in {s.where: s.reason for s in rep.skipped}["0"]


class _DropoutOverMlp(nn.Module):
    """A forward that reads self.training around a child holding the whole chain."""

    def __init__(self):
        super().__init__()
        self.mlp = TimmMlp()

    def forward(self, x):
        return F.dropout(self.mlp(x), p=0.5, training=self.training)


def test_a_training_flag_reader_whose_chains_lie_in_its_children_fuses_those_in_both_modes():
    # Fusing such a forward for one mode would leave its children's chains unfused in the other
    # (a model fused in train() and then used in eval()); its children are fused instead, as
    # before the mode guard, and run fused in both modes.
    torch.manual_seed(54)
    model = _UntraceableBlocks([_DropoutOverMlp(), _DropoutOverMlp()]).train()
    fused, rep = fuse(model, report=True)
    assert len(rep.fused) == 2 and not any("in train() mode" in n for n in rep.notes), rep
    runs = _fused_runs(fused.modules())
    x = torch.randn(4, 8)
    for mode in ("train", "eval"):
        model.train(mode == "train"), fused.train(mode == "train")
        runs.clear()
        torch.manual_seed(55)
        want = model(x)
        torch.manual_seed(55)
        torch.testing.assert_close(fused(x), want, rtol=1e-5, atol=1e-6)
        assert len(runs) == 2, mode


# Real transformers architectures at tiny sizes (random init from a config, fp32, CPU): what
# fuse replaces in each decoder / encoder layer, the original's outputs in eval(), and in
# train() the original's outputs and gradients (dropout off: the random streams would differ
# only by where the fused graph draws). Session 33's survey
# (experiments/fuse_survey_transformers.py) found GPT-2, Starcoder2, MPT and BLOOM fusing nothing.
_TINY = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=64, max_position_embeddings=32, n_embd=32, n_layer=2,
    n_head=4, n_inner=64, n_positions=32, expansion_ratio=2, pad_token_id=0, bos_token_id=1,
    eos_token_id=2,
)  # fmt: skip
_DROPOUT_OFF = dict(
    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, residual_dropout=0.0, embedding_dropout=0.0,
    attention_dropout=0.0, hidden_dropout=0.0, hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0, dropout=0.0, activation_dropout=0.0,
)  # fmt: skip


@pytest.mark.parametrize(
    "model_type, kind",
    [("gpt2", "LinearGELU"), ("starcoder2", "FusedMLP"), ("mpt", "FusedMLP"),
     ("bloom", "FusedMLP"), ("llama", "LinearGLU"), ("bert", "LinearGELU"),
     # (session 34: MLPs inline in a layer fx could not trace, behind wrappers and **kwargs)
     # (ALBERT: one layer, its weights shared, run twice; its **kwargs carry position_ids)
     ("opt", "FusedMLP"), ("biogpt", "LinearGELU"), ("albert", "FusedMLP:1")],
)  # fmt: skip
def test_real_transformers_architectures_fuse_their_mlps(model_type, kind):
    kind, _, count = kind.partition(":")
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (the real classes are optional)"
    )
    config = transformers.AutoConfig.for_model(model_type)
    for key, value in {**_TINY, **_DROPOUT_OFF}.items():
        if hasattr(config, key):
            with contextlib.suppress(AttributeError, TypeError):  # (some are properties)
                setattr(config, key, value)
    config._attn_implementation = "eager"
    torch.manual_seed(56)
    model = transformers.AutoModel.from_config(config).eval()
    fused, rep = fuse(model, report=True)
    assert [c.kind for c in rep.fused] == [kind] * int(count or 2), str(rep)
    runs = _module_runs(fused.modules(), (FusedMLP, LinearGELU, dualk.nn.GatedBase))
    ids = torch.randint(3, 64, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(fused(input_ids=ids)[0], model(input_ids=ids)[0])
    assert len(runs) == 2, model_type  # (the fused modules ran, one in each layer)
    model.train(), fused.train()
    outs = [m(input_ids=ids)[0] for m in (model, fused)]
    torch.testing.assert_close(outs[1], outs[0])
    wants, gots = (
        torch.autograd.grad(o.square().sum(), list(m.parameters()), allow_unused=True)
        for o, m in zip(outs, (model, fused))
    )  # (BERT's pooler is not in the first output)
    for got, want in zip(gots, wants):
        assert (got is None) == (want is None)
        if got is not None:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


class _LayerScaledMlp(nn.Module):
    """An MLP whose forward reads a plain attribute (a layer scale), which fx's trace takes as a
    constant of the graph."""

    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)
        self.alpha = 0.5

    def forward(self, x):
        return self._scaled(self.fc2(self.act(self.fc1(x))))

    def _scaled(self, h):  # (a helper the forward calls reads it)
        return h * self.alpha


def test_a_plain_attribute_changed_after_fusing_is_followed():
    # The fused graph held `* 0.5` after `alpha` was set to 1.0 on the model: a silent wrong
    # answer. The attributes an owner's methods may read are recorded when fused, and a changed
    # one (by identity) runs the class's forward, as a replaced child does.
    torch.manual_seed(58)
    model = _UntraceableBlocks([_LayerScaledMlp(), _LayerScaledMlp()]).eval()
    fused = fuse(copy.deepcopy(model))
    runs = _fused_runs(fused.modules())
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
        assert len(runs) == 2
        twin = copy.deepcopy(fused)
        for m in (model, fused):
            m.mlps[0].alpha = 1.0
        runs.clear()
        torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
        assert len(runs) == 1  # (the other owner unchanged: still fused)
        # the copy has its own record, of its own modules: unchanged, it runs fused
        model.mlps[0].alpha = 0.5
        torch.testing.assert_close(twin(x), model(x), rtol=1e-5, atol=1e-6)
        for m in (model, twin):
            m.mlps[1].alpha = float("0.5") + 0.0  # (an equal value, another object: class forward)
        torch.testing.assert_close(twin(x), model(x), rtol=1e-5, atol=1e-6)


class _PrivateScaledMlp(nn.Module):
    """Reads a private attribute through a property, a class default, and passes self on."""

    shift = 0.0  # (a class default, set on the instance later)

    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)
        self._scale = 0.5

    @property
    def scale(self):
        return self._scale

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x))) * self.scale + self.shift


class _PassesSelf(_PrivateScaledMlp):
    def forward(self, x):
        return _scaled_by(self, self.fc2(self.act(self.fc1(x))))


def _scaled_by(module, h):
    return h * module.factor


def test_attributes_read_privately_by_default_or_through_a_helper_are_followed():
    # (review, session 33) the first scan skipped `_` names (a property over `self._scale`),
    # names the instance did not have yet (a class default set later), and reads through a
    # function that takes self (every plain attribute is watched there); and pickle gave equal
    # floats new identities, which turned every pickled owner back to its class forward
    torch.manual_seed(59)
    passes = _PassesSelf()
    passes.factor = 0.25
    model = _UntraceableBlocks([_PrivateScaledMlp(), _PrivateScaledMlp(), passes]).eval()
    fused = fuse(copy.deepcopy(model))
    loaded = pickle.loads(pickle.dumps(fused))
    assert not any(_fused_forward(b)._children_changed() for b in loaded.mlps)
    runs = _fused_runs(fused.modules())
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
        assert len(runs) == 3
        for m in (model, fused):
            m.mlps[0]._scale = 2.0
            m.mlps[1].shift = 1.0
            m.mlps[2].factor = 3.0
        runs.clear()
        torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
        assert runs == []


def test_a_copy_of_a_fused_graph_module_reading_a_buffer_keeps_the_model_state():
    # (review, session 33) a graph that reads a buffer has no unfused copy (so no forward
    # object): copy.copy of it was fx's, which left the Linears out of the state_dict
    class WithBuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)
            self.register_buffer("b", torch.randn(8))

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x))) + self.b

    torch.manual_seed(60)
    model = WithBuffer().eval()
    gm = fuse(model)
    twin = copy.copy(gm)
    assert sorted(twin.state_dict()) == sorted(model.state_dict())
    assert twin.dualk_fuse_report is gm.dualk_fuse_report
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(twin(x), model(x), rtol=1e-5, atol=1e-6)


class _CountsCalls(nn.Module):
    """A child that fx cannot trace and that counts its calls in a plain attribute."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls = self.calls + 1
        return x if x.sum() > -1e9 else -x


def test_a_sequential_fused_with_leaf_children_ignores_their_attributes():
    # (review, session 33) the attribute scan walked into the children of a Sequential traced
    # with every child a leaf: a child whose forward updates a counter sent every call back to
    # the class's forward
    torch.manual_seed(61)
    seq = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8), _CountsCalls())
    model = _UntraceableBlocks([seq]).eval()
    fused = fuse(copy.deepcopy(model))
    assert _fused_forward(fused.mlps[0]).attributes == ()
    runs = _fused_runs(_fused_forward(fused.mlps[0]).fused)  # (a container's: not submodules)
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
    assert len(runs) == 3


class _BufferScaledMlp(nn.Module):
    """An MLP whose forward reads a buffer and a parameter of its own (get_attr in the graph)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)
        self.register_buffer("scale", torch.full((8,), 0.5))
        self.gamma = nn.Parameter(torch.rand(8))

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x))) * self.scale * self.gamma


def test_a_tensor_the_graph_reads_replaced_on_the_owner_is_followed():
    # (review, session 33) the fused graph holds its own reference to the tensors it reads: after
    # `.double()` (which replaces buffers) it kept the float32 buffer; a reassigned parameter was
    # not seen either. A replaced one runs the class's forward; pickling keeps them the same.
    torch.manual_seed(62)
    model = _UntraceableBlocks([_BufferScaledMlp(), _BufferScaledMlp()]).eval()
    fused = fuse(copy.deepcopy(model))
    forwards = [_fused_forward(b) for b in fused.mlps]
    assert [(kind, name) for _, kind, name, _ in forwards[0].tensors] == [
        ("_buffers", "scale"), ("_parameters", "gamma")
    ]  # fmt: skip
    loaded = pickle.loads(pickle.dumps(fused))
    assert not any(_fused_forward(b)._children_changed() for b in loaded.mlps)
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
        assert not any(f._children_changed() for f in forwards)
        gamma = nn.Parameter(torch.rand(8))
        model.mlps[1].gamma, fused.mlps[1].gamma = gamma, gamma
        torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
        model.double(), fused.double()
        out = fused(x.double())
        assert out.dtype == torch.float64
        torch.testing.assert_close(out, model(x.double()), rtol=1e-9, atol=1e-9)


class _WritesSelf(nn.Module):
    """An MLP whose forward keeps a call counter that its output depends on."""

    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)
        self.calls = 0

    def forward(self, x):
        self._count()
        return self.fc2(self.act(self.fc1(x))) * (self.calls % 2)

    def _count(self):
        self.calls = self.calls + 1


def test_a_forward_that_writes_to_self_is_not_traced():
    # (review, session 33) fx ran the write once while tracing (the model's counter moved) and the
    # graph never again: the fused model's outputs followed a frozen counter. Such a forward
    # (here through a method it calls) is not traced; its children are searched instead.
    torch.manual_seed(63)
    model = _UntraceableBlocks([_WritesSelf()]).eval()
    fused, rep = fuse(copy.deepcopy(model), report=True)
    assert not rep.fused and fused.mlps[0].calls == 0
    assert any("assigns to self.calls (_WritesSelf)" in n for n in rep.notes), rep.notes
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)


class _BranchyAttention(nn.Module):
    """An attention stand-in fx cannot trace (a branch on a tensor's value) that takes extra
    keyword arguments, as transformers' attention classes do."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, h, mask=None, scale=None, **kwargs):
        out = self.proj(h) if h.sum() > -1e9 else h
        return (out if scale is None else out * scale), None


class _InlineMlpLayer(nn.Module):
    """A decoder layer as OPT's: its MLP called inline beside the attention child, its
    **kwargs passed on to that child."""

    def __init__(self):
        super().__init__()
        self.attn = _BranchyAttention()
        self.fc1, self.act, self.fc2 = nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8)

    def forward(self, h, mask=None, **kwargs):
        a, _ = self.attn(h, mask, **kwargs)
        h = h + a
        return h + self.fc2(self.act(self.fc1(h)))


def _unknown_wrapper(fn):
    """A wrapper fuse does not know (it could change any call)."""

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        return fn(self, *args, **kwargs)

    return wrapper


def _as_if_in(wrapper, path: str):
    """`wrapper` as if defined in transformers' file `path` (fuse knows wrappers by their file)."""
    wrapper.__code__ = wrapper.__code__.replace(co_filename=f"/site-packages/transformers/{path}")
    return wrapper


def _deprecated_keyword(fn, old_name: str, new_name: str):
    """transformers' deprecate_kwarg as it wraps a layer's forward (fuse reads `old_name` from
    its closure)."""

    @functools.wraps(fn)
    def wrapped_func(self, *args, **kwargs):
        if old_name in kwargs:
            kwargs[new_name] = kwargs.pop(old_name)
        return fn(self, *args, **kwargs)

    return _as_if_in(wrapped_func, "utils/deprecation.py")


class _WrappedInlineMlpLayer(_InlineMlpLayer):
    forward = _unknown_wrapper(_InlineMlpLayer.forward)


class _KeyReadingLayer(_InlineMlpLayer):
    """As _InlineMlpLayer, but its forward reads a key of its **kwargs: a trace would take the
    key as absent, so calls that pass any keyword run the class's forward."""

    def forward(self, h, mask=None, **kwargs):
        a, _ = self.attn(h, mask, **kwargs)
        h = h + a * (1.0 if kwargs.get("scale") is None else 0.5)
        return h + self.fc2(self.act(self.fc1(h)))


def test_an_mlp_inline_in_an_untraceable_layer_is_fused_and_other_calls_run_the_class_forward():
    # OPT's, BioGPT's and ALBERT's layers call fc1, the activation and fc2 inline, beside an
    # attention fx cannot trace and behind **kwargs: their models fused nothing. The layer's own
    # code is traced with its children as leaves. Where the forward only passes its **kwargs
    # on to its children's calls (ALBERT passes position_ids that way), the graph does too, for
    # any keywords; otherwise it takes them as none given, and a call that passes one runs the
    # class's forward. A forward behind a wrapper fuse does not know is left alone.
    torch.manual_seed(61)
    for layer_type, spread in ((_InlineMlpLayer, True), (_KeyReadingLayer, False)):
        model = _UntraceableBlocks([layer_type(), layer_type()]).eval()
        fused, rep = fuse(copy.deepcopy(model), report=True)
        assert [c.kind for c in rep.fused] == ["FusedMLP"] * 2, str(rep)
        assert any("its own forward traced" in n for n in rep.notes), str(rep)
        runs = _fused_runs(fused.modules())
        x = torch.randn(4, 8)
        with torch.no_grad():
            torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
            assert len(runs) == 2
            runs.clear()
            layer, twin = fused.mlps[0], model.mlps[0]
            torch.testing.assert_close(layer(x, None), twin(x, None), rtol=1e-5, atol=1e-6)
            assert len(runs) == 1  # (a keyword the trace took: served)
            for kwargs in ({"scale": 2.0}, {"mask": None, "scale": 3.0}):
                runs.clear()
                torch.testing.assert_close(
                    layer(x, **kwargs), twin(x, **kwargs), rtol=1e-5, atol=1e-6
                )
                assert len(runs) == (1 if spread else 0), (layer_type, kwargs)
    wrapped = _UntraceableBlocks([_WrappedInlineMlpLayer()]).eval()
    _, rep = fuse(wrapped, report=True)
    assert rep.fused == [], str(rep)


class _CheckpointingLayer(_InlineMlpLayer):
    """A layer as transformers' GradientCheckpointingLayer makes them (its forward wrapped by a
    function of transformers/modeling_layers.py, a `gradient_checkpointing` flag), without
    dropout: its graph holds in both modes."""

    gradient_checkpointing = False


def _checkpointing_wrapper(fn):
    @functools.wraps(fn)
    def forward_with_checkpointing(self, *args, **kwargs):
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(fn, self, *args, use_reentrant=False, **kwargs)
        return fn(self, *args, **kwargs)

    return _as_if_in(forward_with_checkpointing, "modeling_layers.py")


_CheckpointingLayer.forward = _checkpointing_wrapper(_InlineMlpLayer.forward)


def test_a_layer_that_checkpoints_runs_its_class_forward():
    torch.manual_seed(62)
    model = _UntraceableBlocks([_CheckpointingLayer()]).train()
    fused, rep = fuse(copy.deepcopy(model), report=True)
    assert [c.kind for c in rep.fused] == ["FusedMLP"], str(rep)
    runs = _fused_runs(fused.modules())
    x = torch.randn(4, 8, requires_grad=True)
    torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
    assert len(runs) == 1
    runs.clear()
    fused.mlps[0].gradient_checkpointing = True
    model.mlps[0].gradient_checkpointing = True
    out = fused(x)
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-6)
    assert runs == []  # (transformers' wrapper checkpoints: the class's forward ran)
    out.sum().backward()


class _RenamingLayer(_InlineMlpLayer):
    forward = _deprecated_keyword(_InlineMlpLayer.forward, "past", "mask")


def test_a_call_by_a_deprecated_keyword_runs_the_class_forward():
    # The graph traces the function under the renaming wrapper, so it does not pass its other
    # keywords on (a call by the old name would reach the child under that name): such a call
    # runs the class's forward, which renames it.
    torch.manual_seed(63)
    model = _UntraceableBlocks([_RenamingLayer()]).eval()
    fused, rep = fuse(copy.deepcopy(model), report=True)
    assert [c.kind for c in rep.fused] == ["FusedMLP"], str(rep)
    runs = _fused_runs(fused.modules())
    x, mask = torch.randn(4, 8), torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(fused.mlps[0](x, mask=mask), model.mlps[0](x, mask=mask))
        assert len(runs) == 1
        runs.clear()
        torch.testing.assert_close(fused.mlps[0](x, past=mask), model.mlps[0](x, past=mask))
        assert runs == []


class _SelfTypedLayer(_InlineMlpLayer):
    """Reads its own type in forward, and passes a keyword named as _spread_call's parameters."""

    def forward(self, h, mask=None, **kwargs):
        a, _ = self.attn(h, mask, extra=None, module=None, **kwargs)
        if type(self) is _SelfTypedLayer:  # (the trace must see the instance's own class)
            h = h + a
        return h + self.fc2(self.act(self.fc1(h)))


def test_an_inline_mlp_layer_keeps_its_type_pickles_and_passes_any_keyword_names():
    # Review of the own-forward trace: the trace swapped the instance's class, so `type(self)`
    # read another class and the graph froze the other branch (a silent wrong answer); a fused
    # graph that passes **kwargs on could not be unpickled (fx traced its spread of a Proxy);
    # a child's keyword named `extra` or `module` collided with the spreading call's own.
    torch.manual_seed(64)
    model = _UntraceableBlocks([_SelfTypedLayer(), _SelfTypedLayer()]).eval()
    fused, rep = fuse(copy.deepcopy(model), report=True)
    assert [c.kind for c in rep.fused] == ["FusedMLP"] * 2, str(rep)
    assert type(fused.mlps[0]) is _SelfTypedLayer
    x = torch.randn(4, 8)
    with torch.no_grad():
        want = model(x)
        torch.testing.assert_close(fused(x), want, rtol=1e-5, atol=1e-6)
        loaded = pickle.loads(pickle.dumps(fused))
        runs = _fused_runs(loaded.modules())
        torch.testing.assert_close(loaded(x), want, rtol=1e-5, atol=1e-6)
        assert len(runs) == 2
        runs.clear()
        layer, twin = loaded.mlps[0], model.mlps[0]
        torch.testing.assert_close(layer(x, scale=2.0), twin(x, scale=2.0), rtol=1e-5, atol=1e-6)
        assert len(runs) == 1  # (passed on to the attention by the graph)


class _OldNameLayer(_InlineMlpLayer):
    """A deprecated keyword that is still a parameter of the forward (`old_scale` renamed to
    `scale` by the wrapper)."""

    def forward(self, h, old_scale=None, scale=None, **kwargs):
        a, _ = self.attn(h, None, scale)
        return h + a + self.fc2(self.act(self.fc1(h)))


_OldNameLayer.forward = _deprecated_keyword(_OldNameLayer.forward, "old_scale", "scale")


def test_a_deprecated_keyword_that_is_still_a_parameter_reaches_its_wrapper():
    # `layer(x, mask=m)` matched a parameter of the traced function, so the graph ran without
    # the wrapper's rename (a silent wrong answer): the wrapper's old names are not the graph's.
    torch.manual_seed(65)
    model = _UntraceableBlocks([_OldNameLayer()]).eval()
    fused = fuse(copy.deepcopy(model))
    runs = _fused_runs(fused.modules())
    x, m = torch.randn(4, 8), torch.randn(4, 8)
    with torch.no_grad():
        for kwargs, served in (({"scale": m}, 1), ({"old_scale": m}, 0)):
            runs.clear()
            torch.testing.assert_close(
                fused.mlps[0](x, **kwargs), model.mlps[0](x, **kwargs), rtol=1e-5, atol=1e-6
            )  # fmt: skip
            assert len(runs) == served, kwargs


class _IdentityTestMlp(nn.Module):
    """An MLP whose forward tests an argument with a scalar default by identity: fx's Proxy is
    never `True`, so a trace takes the other branch for good."""

    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8)

    def forward(self, h, residual=True):
        out = self.fc2(self.act(self.fc1(h)))
        return h + out if residual is True else out


def test_an_identity_test_on_a_scalar_default_is_not_frozen_into_the_graph():
    # `residual is True` read False on the Proxy: the fused graph dropped the residual in the
    # default call (a silent wrong answer, older than session 34 and reachable from the
    # whole-model trace too). A trace given the scalar defaults is compared now; where it
    # computes otherwise, the forward is not traced.
    torch.manual_seed(66)
    model = _IdentityTestMlp().eval()
    fused, rep = fuse(copy.deepcopy(model), report=True)
    x = torch.randn(4, 8)
    with torch.no_grad():
        for kwargs in ({}, {"residual": True}, {"residual": False}):
            torch.testing.assert_close(fused(x, **kwargs), model(x, **kwargs))
    assert any("take their defaults" in n for n in rep.notes), str(rep)


def test_fused_models_of_many_classes_each_compile():
    # Dynamo keeps at most recompile_limit compiled entries per code object. Every fused
    # whole-model GraphModule's call shared one code object, so with the default limit (8) the
    # 9th fused model compiled in a process ran eagerly while its original (its own class's
    # forward) compiled. Each GraphModule class now has its own copy of the call.
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    config = torch._dynamo.config
    limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    source = (
        "class Mlp{i}(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc1, self.act, self.fc2 = nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)\n"
        "    def forward(self, x):\n"
        "        return self.fc2(self.act(self.fc1(x)))\n"
    )
    torch.manual_seed(21)
    x = torch.randn(3, 8)
    counter = CompileCounter()
    torch._dynamo.reset()
    with config.patch(**{limit: 2}), torch.no_grad(), contextlib.ExitStack() as stack:
        stack.callback(torch._dynamo.reset)
        for i in range(4):  # twice the limit
            scope = {"nn": nn}
            exec(compile(source.format(i=i), f"<mlp{i}>", "exec"), scope)
            model = scope[f"Mlp{i}"]().eval()
            fused = fuse(copy.deepcopy(model))
            assert type(fused).__call__.dualk_graph_call
            out = torch.compile(fused, backend=counter)(x)
            torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-6)
            assert counter.frame_count == i + 1, (i, counter.frame_count)


def test_saving_a_fused_model_keeps_its_class_call():
    # Each fused GraphModule class has its own copy of the call (Dynamo's compiled entries are per
    # code object); a pickle or torch.save reinstalls the class's methods, and a new copy there
    # made a compiled model of the class compile again.
    torch.manual_seed(23)
    fused = fuse(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
    call = type(fused).__call__
    assert call.dualk_graph_call and call.__code__ is not fuse_module_call_code()
    pickle.dumps(fused)
    torch.save(fused, io.BytesIO())
    assert type(fused).__call__ is call


def fuse_module_call_code():
    return sys.modules["dualk.fuse"]._fused_graph_call.__code__
