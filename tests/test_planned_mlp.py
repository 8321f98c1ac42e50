"""fused_mlp's host paths: planned calls (dualk/runtime/operators.py run_planned_mlp, the mlp
extension's PlannedCalls in cuda_src/binding_mlp.cpp) and dualk::fused_mlp_infer, the op compiled
inference graphs call (dualk/autograd/library.py; its CUDA kernel is C++).

On the CPU: which op a traced graph holds (fused_mlp_infer for inference, the autograd op
fused_mlp for training and exports), the op's schema and fake (opcheck), the backend read when
the compiled graph runs. On a GPU also: a planned call gives the full call's answer bit for bit,
every wrong call still raises the full call's error, gradients still record, the precedence of
the backend= argument, the environment, scopes and auto holds, the C++ kernel of the op falls
back to the full route (errors included), and the host cost of both is below the routes they
replace (a smoke test: bench/host_cost.py measures)."""

from __future__ import annotations

import statistics
import time

import pytest
import torch
from conftest import DEVICE, HAS_CUDA, graph_targets, recording_backend
from torch import nn

import dualk
from dualk import ops as dualk_ops
from dualk.backends import cuda as cuda_backend
from dualk.backends import unavailable_reason
from dualk.core import alloc as _alloc
from dualk.dispatch import autotune
from dualk.runtime import operators

INFER = torch.ops.dualk.fused_mlp_infer
GENERIC = torch.ops.dualk.fused_mlp


def _mlp(widths=(12, 24, 16, 6), dtype=torch.float32, biases=(True, False, True), seed=0):
    g = torch.Generator().manual_seed(seed)
    ws, bs = [], []
    for (k, n), has_bias in zip(zip(widths[:-1], widths[1:]), biases):
        ws.append((torch.randn(n, k, generator=g) / k**0.5).to(DEVICE, dtype))
        bs.append((torch.randn(n, generator=g) * 0.1).to(DEVICE, dtype) if has_bias else None)
    return ws, bs


# ------------------------------------------------------------------ the traced graphs (CPU too)
def test_compiled_inference_graph_calls_the_infer_op():
    """Dynamo traces dualk.fused_mlp under no_grad to fused_mlp_infer (no autograd wrappers per
    call); with a gradient to record it keeps the autograd op. Both give eager's answer."""
    torch._dynamo.reset()
    ws, bs = _mlp()
    x = torch.randn(9, 12, device=DEVICE)
    seen: list = []
    f = torch.compile(lambda x: dualk.fused_mlp(x, ws, bs), backend=recording_backend(seen))
    with torch.no_grad():
        out = f(x)
    assert INFER.default in seen[-1] or INFER in seen[-1], seen
    assert GENERIC not in seen[-1] and GENERIC.default not in seen[-1]
    torch.testing.assert_close(out, dualk.fused_mlp(x, ws, bs, backend="torch"))
    wg = [w.detach().requires_grad_() for w in ws]
    g = torch.compile(lambda x: dualk.fused_mlp(x, wg, bs), backend=recording_backend(seen))
    out = g(x)
    assert GENERIC in seen[-1] or GENERIC.default in seen[-1], seen
    assert out.grad_fn is not None


def test_compiled_fused_module_calls_the_infer_op():
    """A fuse'd model compiled for inference holds fused_mlp_infer, without a graph break."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 6)).to(DEVICE).eval()
    # a named backend keeps dualk's op (auto on a GPU measures this tiny MLP and may keep
    # PyTorch's ops in the compiled graph: tests/test_fuse_patterns.py covers that choice)
    fused = dualk.fuse(model, backend="cuda" if HAS_CUDA else "auto")
    seen: list = []
    compiled = torch.compile(fused, backend=recording_backend(seen), fullgraph=True)
    x = torch.randn(7, 12, device=DEVICE)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert any(INFER.default in s or INFER in s for s in seen), seen


@pytest.mark.skipif(
    tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 13),
    reason="torch < 2.13 cannot tell an export from a compile (dualk/runtime/route.py)",
)
@pytest.mark.parametrize("strict", [False, True])
def test_export_keeps_the_autograd_op(strict):
    """An exported program keeps dualk::fused_mlp (it may be run, or trained, anywhere)."""
    ws, bs = _mlp()

    class M(nn.Module):
        def forward(self, x):
            return dualk.fused_mlp(x, ws, bs)

    with torch.no_grad():
        ep = torch.export.export(M(), (torch.randn(5, 12, device=DEVICE),), strict=strict)
    targets = graph_targets(ep.graph_module)
    assert GENERIC.default in targets and INFER.default not in targets, targets


def test_infer_op_opcheck():
    """Schema, fake and AOT dispatch of fused_mlp_infer (inputs that need no gradient: the op
    has no autograd formula; dualk.fused_mlp emits it only where none is needed)."""
    ws, bs = _mlp()
    x = torch.randn(5, 12, device=DEVICE)
    torch.library.opcheck(INFER.default, (x, ws, bs, "silu", "torch"))
    torch.library.opcheck(INFER.default, (x.reshape(5, 1, 12), ws, bs, "relu", "auto"))


def test_infer_op_validates_like_the_public_function():
    ws, bs = _mlp()
    with pytest.raises(dualk.ShapeError, match="expects 12"):
        INFER(torch.randn(5, 11, device=DEVICE), ws, bs, "relu", "auto")
    with pytest.raises(dualk.UnknownBackendError):
        INFER(torch.randn(5, 12, device=DEVICE), ws, bs, "relu", "bogus")
    with pytest.raises(dualk.InvalidArgumentError, match="activation"):
        INFER(torch.randn(5, 12, device=DEVICE), ws, bs, "tanh", "auto")


@pytest.mark.parametrize("poison", [True, False])
def test_compiled_inference_graph_decides_the_backend_at_run_time(monkeypatch, poison):
    """As for the autograd op: DUALK_BACKEND_FUSED_MLP set after compiling is read when the
    graph runs (on a GPU with poisoning off: through the op's C++ kernel, whose planned calls
    step aside), without a recompile."""
    from torch._dynamo.testing import CompileCounter

    monkeypatch.setattr(_alloc, "_poison", poison)
    torch._dynamo.reset()
    counter = CompileCounter()
    ws, bs = _mlp()
    f = torch.compile(lambda x: dualk.fused_mlp(x, ws, bs), backend=counter, fullgraph=True)
    x = torch.randn(8, 12, device=DEVICE)
    with torch.no_grad():
        ref = dualk.fused_mlp(x, ws, bs, backend="torch")
        for _ in range(3):  # (plans the class where the CUDA kernel runs)
            torch.testing.assert_close(f(x), ref, rtol=1e-4, atol=1e-5)
        monkeypatch.setenv("DUALK_BACKEND_FUSED_MLP", "bogus")
        with pytest.raises(dualk.UnknownBackendError, match="DUALK_BACKEND_FUSED_MLP"):
            f(x)
        monkeypatch.setenv("DUALK_BACKEND_FUSED_MLP", "torch")
        assert torch.equal(f(x), ref)
    assert counter.frame_count == 1


# ---------------------------------------------------------- planned calls: GPU only from here
def _need_cuda():
    reason = unavailable_reason("cuda", DEVICE)
    if reason is not None:
        pytest.skip(reason)
    if not cuda_backend.PLANNED_MLP.registered:
        cuda_backend.extension("mlp")
    if cuda_backend.PLANNED_MLP.run is None:
        pytest.skip("this mlp extension has no planned calls")


@pytest.fixture
def planned(monkeypatch):
    """Poisoning off (planned calls never poison), an empty plan table and a count of the full
    route's calls through dualk.fused_mlp (ops binds operators.run_fused_mlp)."""
    _need_cuda()
    monkeypatch.setattr(_alloc, "_poison", False)
    cuda_backend.PLANNED_MLP.clear()
    full: list = []
    real = dualk_ops._run_fused_mlp
    monkeypatch.setattr(dualk_ops, "_run_fused_mlp", lambda *a: (full.append(1), real(*a))[1])
    return full


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("backend", ["cuda", "auto"])
def test_planned_call_gives_the_full_calls_answer(planned, dtype, backend):
    ws, bs = _mlp(dtype=dtype)
    spec = dualk.registry.OPS["fused_mlp"]
    any_served = False
    for shape in ((32, 12), (4, 8, 12), (12,)):
        x = torch.randn(shape, device=DEVICE, dtype=dtype)
        with torch.no_grad():
            full = dualk.fused_mlp(x, ws, bs, backend=backend)
            # "auto" is planned where its remembered decision is cuda (else each call is a full
            # one, on a backend that may change while Triton tunes in the background)
            served = backend == "cuda" or autotune.decided(spec, (x, ws, bs, "relu")) == "cuda"
            any_served = any_served or served
            calls = len(planned)
            outs = [dualk.fused_mlp(x, ws, bs, backend=backend) for _ in range(3)]
        for out in outs:
            assert out.shape == full.shape
            if served:
                assert torch.equal(out, full)
            else:
                torch.testing.assert_close(out, full, rtol=2e-2, atol=2e-2)
        if served:
            assert len(planned) == calls, "a planned class took the full route"
    if any_served:  # (auto on a GPU may decide triton or torch for these small shapes)
        assert cuda_backend._extensions["mlp"].planned_size() >= 1


def test_planned_call_takes_tuples_parameters_and_no_biases(planned):
    torch.manual_seed(1)
    lin = [nn.Linear(12, 16).to(DEVICE), nn.Linear(16, 4, bias=False).to(DEVICE)]
    ws, bs = tuple(m.weight for m in lin), tuple(m.bias for m in lin)
    x = torch.randn(10, 12, device=DEVICE)
    with torch.no_grad():
        for biases in (bs, None):
            full = dualk.fused_mlp(x, ws, biases, backend="cuda")
            calls = len(planned)
            assert torch.equal(dualk.fused_mlp(x, ws, biases, backend="cuda"), full)
            assert len(planned) == calls


def test_planned_class_still_raises_the_full_calls_errors(planned):
    """Every call is checked afresh: a planned class never serves a wrong call."""
    ws, bs = _mlp(dtype=torch.float16)
    x = torch.randn(32, 12, device=DEVICE, dtype=torch.float16)
    with torch.no_grad():
        dualk.fused_mlp(x, ws, bs, backend="cuda")  # plans
        with pytest.raises(dualk.DtypeError):
            dualk.fused_mlp(x.float(), ws, bs, backend="cuda")
        with pytest.raises(dualk.DeviceMismatchError):
            dualk.fused_mlp(x.cpu(), ws, bs, backend="cuda")
        with pytest.raises(dualk.ShapeError):
            dualk.fused_mlp(x[:, :11], ws, bs, backend="cuda")
        with pytest.raises(dualk.ShapeError):
            dualk.fused_mlp(x, [ws[0], ws[2], ws[1]], bs, backend="cuda")
        with pytest.raises(dualk.ShapeError):
            dualk.fused_mlp(x, ws, [bs[0][:-1], *bs[1:]], backend="cuda")
        with pytest.raises(dualk.InvalidArgumentError):
            dualk.fused_mlp(x, ws, bs[:2], backend="cuda")
        with pytest.raises(dualk.InvalidArgumentError, match="activation"):
            dualk.fused_mlp(x, ws, bs, activation="tanh", backend="cuda")
        with pytest.raises(dualk.UnknownBackendError):
            dualk.fused_mlp(x, ws, bs, backend="bogus")
        calls = len(planned)
        # A strided x or weight, and another activation: the full route (which copies / plans)
        ref = dualk.fused_mlp(x.t().contiguous().t(), ws, bs, backend="cuda")
        assert torch.equal(ref, dualk.fused_mlp(x, ws, bs, backend="cuda"))
        assert len(planned) == calls + 1


def test_planned_class_leaves_gradients_to_the_autograd_route(planned):
    ws, bs = _mlp()
    x = torch.randn(16, 12, device=DEVICE)
    with torch.no_grad():
        dualk.fused_mlp(x, ws, bs, backend="cuda")
    wg = [w.detach().requires_grad_() for w in ws]
    out = dualk.fused_mlp(x, wg, bs, backend="cuda")
    assert out.grad_fn is not None
    out.sum().backward()
    assert all(w.grad is not None for w in wg)
    with torch.no_grad():  # parameters that require grad, no gradient mode: planned
        calls = len(planned)
        out = dualk.fused_mlp(x, wg, bs, backend="cuda")
        assert not out.requires_grad and len(planned) == calls


def test_planned_call_keeps_the_backend_precedence(planned, monkeypatch):
    """The argument wins over everything; "auto" is planned only while nothing overrides it and
    auto's decisions stand."""
    ws, bs = _mlp()
    x = torch.randn(16, 12, device=DEVICE)
    spec = dualk.registry.OPS["fused_mlp"]
    ran_torch: list = []
    real_torch = spec.implementation("torch")
    monkeypatch.setitem(
        spec._resolved, "torch", lambda *a: (ran_torch.append(1), real_torch(*a))[1]
    )
    with torch.no_grad():
        for backend in ("cuda", "auto", "cuda", "auto"):
            dualk.fused_mlp(x, ws, bs, backend=backend)
        base = len(ran_torch)  # (auto may have picked torch for this small class)
        monkeypatch.setenv("DUALK_BACKEND", "torch")
        dualk.fused_mlp(x, ws, bs)  # auto overridden: the environment's torch
        assert len(ran_torch) == base + 1
        calls = len(planned)
        dualk.fused_mlp(x, ws, bs, backend="cuda")  # the argument wins, planned
        assert len(ran_torch) == base + 1 and len(planned) == calls
        monkeypatch.delenv("DUALK_BACKEND")
        with dualk.use_backend("torch"):
            dualk.fused_mlp(x, ws, bs)
        assert len(ran_torch) == base + 2
        dualk.set_default_backend("torch")
        try:
            dualk.fused_mlp(x, ws, bs)
        finally:
            dualk.set_default_backend(None)
        assert len(ran_torch) == base + 3
        autotune.clear_memory()  # auto's decisions forgotten: the full route decides again
        calls = len(planned)
        dualk.fused_mlp(x, ws, bs)
        assert len(planned) == calls + 1


def test_planned_calls_step_aside_while_poisoning(planned, monkeypatch):
    ws, bs = _mlp()
    x = torch.randn(16, 12, device=DEVICE)
    with torch.no_grad():
        dualk.fused_mlp(x, ws, bs, backend="cuda")
        monkeypatch.setattr(_alloc, "_poison", True)
        calls = len(planned)
        dualk.fused_mlp(x, ws, bs, backend="cuda")
        assert len(planned) == calls + 1


# ------------------------------------------------ fused_mlp_infer's C++ kernel: GPU only
@pytest.fixture
def full_route(planned, monkeypatch):
    """Counts the op's full route (its C++ kernel's fallback calls operators.run_fused_mlp)."""
    calls: list = []
    real = operators.run_fused_mlp
    monkeypatch.setattr(operators, "run_fused_mlp", lambda *a: (calls.append(1), real(*a))[1])
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_infer_op_cpp_kernel_serves_planned_calls(full_route, dtype):
    ws, bs = _mlp(dtype=dtype)
    x = torch.randn(64, 12, device=DEVICE, dtype=dtype)
    with torch.no_grad():
        first = INFER(x, ws, bs, "gelu_tanh", "cuda")  # the full route: plans the class
        assert full_route == [1]
        again = [INFER(x, ws, bs, "gelu_tanh", "cuda") for _ in range(3)]
    assert full_route == [1], "the C++ kernel did not serve the planned class"
    ref = dualk.fused_mlp(x, ws, bs, activation="gelu_tanh", backend="cuda")
    for out in (first, *again):
        assert torch.equal(out, ref)


def test_infer_op_cpp_kernel_falls_back_with_the_full_routes_errors(full_route, monkeypatch):
    ws, bs = _mlp(dtype=torch.float16)
    x = torch.randn(64, 12, device=DEVICE, dtype=torch.float16)
    with torch.no_grad():
        INFER(x, ws, bs, "relu", "auto")
        with pytest.raises(dualk.ShapeError):  # raised in Python, through the C++ kernel
            INFER(x, [ws[1], ws[0], ws[2]], bs, "relu", "cuda")
        with pytest.raises(dualk.DtypeError):
            INFER(x, [w.float() for w in ws], bs, "relu", "cuda")
        monkeypatch.setenv("DUALK_BACKEND_FUSED_MLP", "bogus")
        with pytest.raises(dualk.UnknownBackendError):
            INFER(x, ws, bs, "relu", "auto")
        monkeypatch.setenv("DUALK_BACKEND_FUSED_MLP", "torch")
        n = len(full_route)
        torch.testing.assert_close(
            INFER(x, ws, bs, "relu", "auto"), dualk.fused_mlp(x, ws, bs, backend="torch")
        )
        assert len(full_route) == n + 1


def test_compiled_nerf_runs_the_cpp_kernel(full_route):
    """A fuse'd NeRF MLP compiled by Inductor for inference: eager's answer, and after the
    first calls no Python route at all."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    widths = [32, 64, 64, 64, 16]
    layers: list = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(widths) - 2 else [])
    model = nn.Sequential(*layers).to(DEVICE).half().eval()
    fused = dualk.fuse(model, backend="cuda")
    compiled = torch.compile(fused)
    x = torch.randn(4096, 32, device=DEVICE, dtype=torch.float16)
    with torch.no_grad():
        ref = fused(x)
        for _ in range(3):
            out = compiled(x)
        n = len(full_route)
        for _ in range(5):
            out = compiled(x)
    assert len(full_route) == n
    assert torch.equal(out, ref)


# ------------------------------------------------------------------ host cost: GPU smoke test
def _host_us(fn, calls=300, repeats=7) -> float:
    samples = []
    for _ in range(20):
        fn()
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


@pytest.mark.skipif(not HAS_CUDA, reason="host cost is measured on a GPU")
def test_host_cost_smoke(planned, monkeypatch):
    """Planned calls cost well under the routes they replace (measured against each other in
    this process; bench/host_cost.py has the numbers): the functional call against its full
    route, fused_mlp_infer's C++ kernel against the autograd op's Python wrappers."""
    ws, bs = _mlp(widths=(100, 128, 64, 10), biases=(True, True, True))
    x = torch.randn(32, 100, device=DEVICE)
    present, mask = [b for b in bs if b is not None], 0b111
    with torch.no_grad():
        planned_fn = _host_us(lambda: dualk.fused_mlp(x, ws, bs, backend="cuda"))
        infer = _host_us(lambda: INFER(x, ws, bs, "relu", "cuda"))
        generic = _host_us(lambda: GENERIC(x, ws, present, mask, "relu", "cuda"))
        monkeypatch.setattr(cuda_backend.PLANNED_MLP, "run", None)  # (the full route alone)
        full_fn = _host_us(lambda: dualk.fused_mlp(x, ws, bs, backend="cuda"))
    report = f"planned {planned_fn:.1f} full {full_fn:.1f} infer op {infer:.1f} op {generic:.1f} us"
    assert planned_fn < 0.75 * full_fn, report
    assert infer < 0.6 * generic, report
