"""The Triton elementwise launch arguments of a dense plan (every same-shape contiguous call) are
answered from constants (triton_src/elementwise.plan_arguments): they must be exactly what the
general padding computes for that plan, so one compiled kernel serves both. Runs on the CPU: the
launcher is replaced by a recorder where a launch is involved, nothing executes."""

import pytest
import torch

from dualk.backends import triton as triton_backend
from dualk.core.layout import plan_elementwise

elementwise = pytest.importorskip("dualk.triton_src.elementwise")
add_module = pytest.importorskip("dualk.triton_src.add")
relu_scale_module = pytest.importorskip("dualk.triton_src.relu_scale")


@pytest.mark.parametrize("shape", [(1,), (16,), (3, 5, 7), (4097,), ()])
@pytest.mark.parametrize("operands", [1, 2])
def test_dense_plan_arguments_are_the_general_ones(shape, operands):
    tensors = [torch.randn(shape) for _ in range(operands)]
    plan = plan_elementwise(*tensors)
    assert plan.dense
    assert elementwise.plan_arguments(plan) == elementwise.plan_arguments(
        plan._replace(dense=False)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_launches_the_dense_plan_arguments(dtype, monkeypatch):
    calls = []
    monkeypatch.setattr(add_module._launcher, "launch", lambda *args: calls.append(args))
    a, b = torch.randn(3, 5, 7).to(dtype), torch.randn(3, 5, 7).to(dtype)
    out = torch.empty_like(a)
    plan = plan_elementwise(a, b)
    add_module.add(a, b, out, 0.5, plan)
    key, grid, args, warps, stages = calls[0]
    ints, specs = elementwise.plan_arguments(plan._replace(dense=False))
    assert args[:3] == (a, b, out) and args[3:-3] == ints
    assert key[:2] == (dtype, True) and key[2:-3] == specs
    assert grid == (1, 1, 1) and args[-3:] == (0.5, True, 4096 // a.element_size())


def test_backend_plans_and_outputs(monkeypatch):
    plans = []
    monkeypatch.setattr(add_module, "add", lambda a, b, out, alpha, plan: plans.append(plan.dense))
    monkeypatch.setattr(
        relu_scale_module, "relu_scale", lambda x, out, s, plan: plans.append(plan.dense)
    )
    a = torch.randn(8, 6)
    outs = [
        triton_backend.add(a, torch.randn(8, 6)),
        triton_backend.add(a, torch.randn(6)),  # broadcast
        triton_backend.add(a, torch.randn(6, 8).t()),  # strided
        triton_backend.relu_scale(a, 2.0),
        triton_backend.relu_scale(a.t(), 2.0),
        triton_backend.add(torch.randn(0, 3), torch.randn(0, 3)),  # empty: no launch at all
        triton_backend.add(torch.randn(6), a),  # the output takes the larger operand's shape
    ]
    assert plans == [True, False, False, True, False, False]
    assert [tuple(o.shape) for o in outs] == [(8, 6)] * 3 + [(8, 6), (6, 8), (0, 3), (8, 6)]
    assert all(o.is_contiguous() and o.dtype == a.dtype for o in outs)
