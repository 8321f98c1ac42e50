"""The Triton elementwise entries for dense operands (add_dense, relu_scale_dense) launch exactly
what the general entries launch for the same call (same key, grid and arguments, so the same
compiled kernel), and dualk's Triton backend takes them for contiguous same-shape inputs. Runs on
the CPU: the launcher is replaced by a recorder, nothing executes."""

import pytest
import torch

from dualk.backends import triton as triton_backend
from dualk.layout import plan_elementwise

add_module = pytest.importorskip("dualk.triton_src.add")
relu_scale_module = pytest.importorskip("dualk.triton_src.relu_scale")


def _recorded(module, monkeypatch):
    calls = []
    monkeypatch.setattr(
        module._launcher,
        "launch",
        lambda key, grid, args, w, s: calls.append((key, grid, args, w, s)),
    )
    return calls


def _same_launch(first, second):
    (k1, g1, a1, *rest1), (k2, g2, a2, *rest2) = first, second
    assert k1 == k2 and g1 == g2 and rest1 == rest2
    assert len(a1) == len(a2)
    for x, y in zip(a1, a2):
        assert x is y if isinstance(x, torch.Tensor) else x == y and type(x) is type(y)


@pytest.mark.parametrize("shape", [(1,), (16,), (3, 5, 7), (4097,), ()])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_dense_launches_what_add_launches(shape, dtype, monkeypatch):
    calls = _recorded(add_module, monkeypatch)
    a, b = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    out = torch.empty_like(a)
    add_module.add(a, b, out, 0.5, plan_elementwise(a, b))
    add_module.add_dense(a, b, out, 0.5)
    assert len(calls) == 2
    _same_launch(*calls)


@pytest.mark.parametrize("shape", [(1,), (16,), (3, 5, 7), (4097,)])
def test_relu_scale_dense_launches_what_relu_scale_launches(shape, monkeypatch):
    calls = _recorded(relu_scale_module, monkeypatch)
    x = torch.randn(shape, dtype=torch.float16)
    out = torch.empty_like(x)
    relu_scale_module.relu_scale(x, out, 2.5, plan_elementwise(x))
    relu_scale_module.relu_scale_dense(x, out, 2.5)
    assert len(calls) == 2
    _same_launch(*calls)


def test_backend_takes_the_dense_entries_only_for_dense_operands(monkeypatch):
    taken = []
    monkeypatch.setattr(add_module, "add_dense", lambda *args: taken.append("add_dense"))
    monkeypatch.setattr(add_module, "add", lambda *args: taken.append("add"))
    monkeypatch.setattr(relu_scale_module, "relu_scale_dense", lambda *a: taken.append("rs_dense"))
    monkeypatch.setattr(relu_scale_module, "relu_scale", lambda *args: taken.append("rs"))
    a = torch.randn(8, 6)
    triton_backend.add(a, torch.randn(8, 6))
    triton_backend.add(a, torch.randn(6))  # broadcast
    triton_backend.add(a, torch.randn(6, 8).t())  # strided
    triton_backend.relu_scale(a, 2.0)
    triton_backend.relu_scale(a.t(), 2.0)
    triton_backend.add(torch.randn(0, 3), torch.randn(0, 3))  # empty: no launch at all
    assert taken == ["add_dense", "add", "add", "rs_dense", "rs"]
