"""The operator contract: an operator that only a registry entry describes (registry.register)
is dispatched, tuned by auto, explained and run like the built-in ones."""

from __future__ import annotations

import pytest
import torch

import dualk
from dualk import registry
from dualk.core import validate
from dualk.core.errors import InvalidArgumentError
from dualk.dispatch import autotune
from dualk.registry import OpSpec
from dualk.runtime import operators

TOY = "toy_scale"


def _reference(x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
    return x * scale


def _key(args) -> tuple:
    x = args[0]
    n = x.numel()
    return (TOY, x.get_device(), x.dtype, False, (n - 1).bit_length() if n else -1)


def _check(x, scale) -> None:
    validate.tensor(TOY, "x", x)
    validate.real_number(TOY, "scale", scale)


class Timer:
    """auto's timer with preset microseconds per backend (each candidate still runs once)."""

    def __init__(self, times):
        self.times = times

    def __call__(self, run, backend, budget_ms):
        run()
        return self.times[backend]


@pytest.fixture
def toy(monkeypatch):
    """The toy operator registered from one entry; every backend a candidate on the CPU; its
    implementations record their backend's name."""
    calls: list[str] = []

    def impl(backend):
        def run(x, scale):
            calls.append(backend)
            return _reference(x, scale)

        return run

    spec = registry.register(
        OpSpec(
            TOY,
            _reference,
            {b: impl(b) for b in ("cuda", "triton", "torch")},
            ("triton", "cuda", "torch"),
            (),
            lambda sample: None,
            "elementwise",
            key=_key,
            key_fields=("n",),
            check=_check,
        )  # fmt: skip
    )
    monkeypatch.setattr(autotune, "candidate_reason", lambda backend, device: None)
    monkeypatch.setattr(dualk.dispatch, "unavailable_reason", lambda b, device, op=None: None)
    autotune.set_timer(Timer({"cuda": 5.0, "triton": 3.0, "torch": 9.0}))
    yield spec, calls
    registry.unregister(TOY)
    autotune.clear_memory()
    autotune.set_timer(None)


def test_named_backend_runs_that_implementation(toy):
    spec, calls = toy
    x = torch.randn(100)
    out = operators.run(spec, (x, 3.0), "cuda")
    assert calls == ["cuda"]
    torch.testing.assert_close(out, x * 3.0)


def test_auto_times_the_candidates_keys_and_remembers(toy):
    spec, calls = toy
    x = torch.randn(100)
    torch.testing.assert_close(operators.run(spec, (x, 0.5), "auto"), x * 0.5)
    assert set(calls[:-1]) == {"cuda", "triton", "torch"} and calls[-1] == "triton"
    key = autotune.make_key(spec, (x, 0.5))
    assert autotune.key_string(key) == "toy_scale|float32|n<=128"
    calls.clear()
    operators.run(spec, (torch.randn(120), 0.5), "auto")  # same shape class: no timing
    assert calls == ["triton"]


def test_explain_and_checks_come_from_the_entry(toy):
    x = torch.randn(1000)  # a shape class of its own (the other tests tune n <= 128)
    expl = dualk.explain(TOY, x, scale=1.5, backend="torch")
    assert expl.backend == "torch"
    assert set(expl.availability) >= {"cuda", "triton", "torch"}
    before = dualk.explain(TOY, x)  # auto, untuned: the first call will time the candidates
    assert before.source.startswith("auto") and any("not tuned" in n for n in before.notes)
    operators.run(dualk.OPS[TOY], (x, 2.0), "auto")
    after = dualk.explain(TOY, x)
    assert after.backend == "triton" and after.source == "auto, tuned"
    assert any("measured: cuda 5.0 us, triton 3.0 us, torch 9.0 us" in n for n in after.notes)
    with pytest.raises(dualk.InvalidTypeError):
        dualk.explain(TOY, "not a tensor")
    with pytest.raises(InvalidArgumentError):
        dualk.explain(TOY, x, 1.0, 2.0)  # too many arguments for the reference


def test_register_refuses_an_incomplete_entry(toy):
    spec, _ = toy
    with pytest.raises(InvalidArgumentError, match="already registered"):
        registry.register(spec)
    incomplete = OpSpec("toy_two", _reference, {"torch": _reference}, ("torch",), (),
                        lambda sample: None, "elementwise")  # fmt: skip
    with pytest.raises(InvalidArgumentError, match="key"):
        registry.register(incomplete)
