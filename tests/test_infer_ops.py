"""dualk::linear_gelu_infer and dualk::linear_glu_infer, the ops compiled inference graphs call
for linear_gelu and linear_glu (dualk/autograd/library.py): Library ops whose kernel is the
operator's own route, without custom_op's autograd and backend wrappers on every call (the zoo's
compiled LLaMA with linear_glu in its graph paid 0.67 ms of host time per forward more on an
H200). fused_mlp_infer has its own tests (tests/test_planned_mlp.py).

Which op a traced graph holds (the _infer op for inference, the autograd op where a gradient is
recorded and in exports), schema and fake (opcheck), the operator's errors, the answer against a
float64 reference, and the backend read when the compiled graph runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE, graph_targets, recording_backend
from torch import nn

import dualk

GELU_INFER, GELU = torch.ops.dualk.linear_gelu_infer, torch.ops.dualk.linear_gelu
GLU_INFER, GLU = torch.ops.dualk.linear_glu_infer, torch.ops.dualk.linear_glu
GLU_TRAIN = torch.ops.dualk.linear_glu_train


def _holds(seen_graph: set, op) -> bool:
    return op in seen_graph or op.default in seen_graph


def _gelu_operands(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(24, 12, generator=g) / 12**0.5).to(DEVICE, dtype)
    b = (torch.randn(24, generator=g) * 0.1).to(DEVICE, dtype)
    return w, b


def _glu_operands(seed=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    wg = (torch.randn(20, 12, generator=g) / 12**0.5).to(DEVICE, dtype)
    wu = (torch.randn(20, 12, generator=g) / 12**0.5).to(DEVICE, dtype)
    bg = (torch.randn(20, generator=g) * 0.1).to(DEVICE, dtype)
    return wg, wu, bg


def _gelu64(x, w, b, approximate="tanh"):
    return F.gelu(F.linear(x.double(), w.double(), b.double()), approximate=approximate)


def _glu64(x, wg, wu, bg):
    return F.silu(F.linear(x.double(), wg.double(), bg.double())) * F.linear(
        x.double(), wu.double()
    )


def test_compiled_inference_graphs_call_the_infer_ops():
    """Under no_grad Dynamo traces dualk.linear_gelu / linear_glu to their _infer ops; with a
    gradient to record it keeps the autograd ops. Both give the float64 reference's answer."""
    torch._dynamo.reset()
    w, b = _gelu_operands()
    wg, wu, bg = _glu_operands()
    x = torch.randn(3, 5, 12, device=DEVICE)
    seen: list = []
    gelu = torch.compile(lambda x: dualk.linear_gelu(x, w, b), backend=recording_backend(seen))
    glu = torch.compile(lambda x: dualk.linear_glu(x, wg, wu, bg), backend=recording_backend(seen))
    with torch.no_grad():
        out = gelu(x)
        assert _holds(seen[-1], GELU_INFER) and not _holds(seen[-1], GELU), seen[-1]
        torch.testing.assert_close(out.double(), _gelu64(x, w, b), rtol=1e-5, atol=1e-5)
        out = glu(x)
        assert _holds(seen[-1], GLU_INFER) and not _holds(seen[-1], GLU), seen[-1]
        torch.testing.assert_close(out.double(), _glu64(x, wg, wu, bg), rtol=1e-5, atol=1e-5)
    wr = w.detach().requires_grad_()
    out = torch.compile(lambda x: dualk.linear_gelu(x, wr, b), backend=recording_backend(seen))(x)
    assert _holds(seen[-1], GELU) and not _holds(seen[-1], GELU_INFER), seen[-1]
    assert out.grad_fn is not None
    wgr = wg.detach().requires_grad_()
    out = torch.compile(
        lambda x: dualk.linear_glu(x, wgr, wu, bg), backend=recording_backend(seen)
    )(x)
    assert _holds(seen[-1], GLU_TRAIN) and not _holds(seen[-1], GLU_INFER), seen[-1]
    assert out.grad_fn is not None
    torch._dynamo.reset()


def test_compiled_gated_module_calls_the_infer_op():
    """dualk.nn.GatedMLP compiled for inference holds linear_glu_infer, in one graph."""
    torch._dynamo.reset()
    torch.manual_seed(4)
    mlp = dualk.nn.GatedMLP(12, 20, activation="silu", backend="torch").to(DEVICE).eval()
    seen: list = []
    compiled = torch.compile(mlp, backend=recording_backend(seen), fullgraph=True)
    x = torch.randn(6, 12, device=DEVICE)
    with torch.no_grad():
        out = compiled(x)
        ref = mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert any(_holds(s, GLU_INFER) for s in seen), seen
    torch._dynamo.reset()


def test_infer_ops_opcheck():
    """Schema, fake and AOT dispatch (inputs that need no gradient: the ops have no autograd
    formula; dualk's operators emit them only where none is needed)."""
    w, b = _gelu_operands()
    wg, wu, bg = _glu_operands()
    x = torch.randn(5, 12, device=DEVICE)
    torch.library.opcheck(GELU_INFER.default, (x, w, b, "tanh", "torch"))
    torch.library.opcheck(GELU_INFER.default, (x.reshape(5, 1, 12), w, None, "none", "auto"))
    torch.library.opcheck(GLU_INFER.default, (x, wg, wu, bg, None, "silu", "tanh", "torch"))
    packed = torch.cat([wg, wu])
    torch.library.opcheck(GLU_INFER.default, (x, packed, None, None, None, "gelu", "none", "auto"))


def test_infer_ops_validate_like_the_public_functions():
    w, b = _gelu_operands()
    wg, wu, bg = _glu_operands()
    bad = torch.randn(5, 11, device=DEVICE)
    with pytest.raises(dualk.ShapeError):
        GELU_INFER(bad, w, b, "tanh", "auto")
    with pytest.raises(dualk.ShapeError):
        GLU_INFER(bad, wg, wu, bg, None, "silu", "tanh", "auto")
    x = torch.randn(5, 12, device=DEVICE)
    with pytest.raises(dualk.UnknownBackendError):
        GELU_INFER(x, w, b, "tanh", "bogus")
    with pytest.raises(dualk.UnknownBackendError):
        GLU_INFER(x, wg, wu, bg, None, "silu", "tanh", "bogus")
    with pytest.raises(dualk.InvalidArgumentError, match="activation"):
        GLU_INFER(x, wg, wu, bg, None, "tanh", "tanh", "auto")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_infer_ops_give_the_operators_answers(dtype):
    """The _infer ops run the operators' own route: bit for bit what the public functions give
    for the same backend."""
    w, b = _gelu_operands(dtype=dtype)
    wg, wu, bg = _glu_operands(dtype=dtype)
    x = torch.randn(2, 7, 12, device=DEVICE, dtype=dtype)
    with torch.no_grad():
        for backend in ("torch", "auto"):
            # bit for bit on a named backend; "auto" may revisit a provisional decision between
            # two calls on a GPU, so within the dtype's tolerance there
            tol = {} if backend == "auto" else {"rtol": 0, "atol": 0}
            got = GELU_INFER(x, w, b, "tanh", backend)
            torch.testing.assert_close(got, dualk.linear_gelu(x, w, b, backend=backend), **tol)
            got = GLU_INFER(x, wg, wu, bg, None, "silu", "tanh", backend)
            want = dualk.linear_glu(x, wg, wu, bg, backend=backend)
            torch.testing.assert_close(got, want, **tol)
            assert got.shape == (2, 7, 20) and got.is_contiguous() and got._base is None


def test_compiled_inference_graph_reads_the_backend_when_it_runs(monkeypatch):
    """As for the autograd ops: a backend forced after compiling (DUALK_BACKEND) is read when the
    graph runs, without a recompile: an unknown name raises from inside the compiled graph."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    wg, wu, bg = _glu_operands()
    f = torch.compile(lambda x: dualk.linear_glu(x, wg, wu, bg), backend=counter)
    x = torch.randn(4, 12, device=DEVICE)
    with torch.no_grad():
        f(x)
        monkeypatch.setenv("DUALK_BACKEND", "bogus")
        with pytest.raises(dualk.UnknownBackendError):
            f(x)
    assert counter.frame_count == 1
    torch._dynamo.reset()


@pytest.mark.skipif(
    tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 13),
    reason="torch < 2.13 cannot tell an export from a compile (dualk/runtime/route.py)",
)
def test_export_keeps_the_autograd_ops():
    """An exported program keeps dualk::linear_gelu / linear_glu (it may be trained anywhere)."""
    w, b = _gelu_operands()
    wg, wu, bg = _glu_operands()

    class M(nn.Module):
        def forward(self, x):
            return dualk.linear_gelu(x, w, b) + dualk.linear_glu(x, wg, wu, bg).sum()

    with torch.no_grad():
        ep = torch.export.export(M(), (torch.randn(5, 12, device=DEVICE),), strict=False)
    targets = graph_targets(ep.graph_module)
    assert GELU.default in targets and GLU.default in targets, targets
    assert GELU_INFER.default not in targets and GLU_INFER.default not in targets, targets


@pytest.mark.parametrize("op", ["linear_gelu", "linear_glu", "fused_mlp"])
def test_compiled_grad_transform_is_never_silently_wrong(op):
    """torch.compile(torch.func.grad(f)): a grad transform's tensors report requires_grad False,
    and the _infer ops (no autograd) gave all-zero gradients. The compiled transform must give
    float64 autograd's gradient or raise, never a wrong answer."""
    torch._dynamo.reset()
    w, b = _gelu_operands()
    wg, wu, bg = _glu_operands()
    x = torch.randn(4, 12, device=DEVICE)
    w2 = torch.randn(6, 24, device=DEVICE) / 24**0.5
    calls = {
        "linear_gelu": (lambda w_: dualk.linear_gelu(x, w_, b), w,
                        lambda w_: F.gelu(F.linear(x.double(), w_, b.double()), approximate="tanh")),
        "linear_glu": (lambda w_: dualk.linear_glu(x, w_, wu, bg), wg,
                       lambda w_: F.silu(F.linear(x.double(), w_, bg.double()))
                       * F.linear(x.double(), wu.double())),
        "fused_mlp": (lambda w_: dualk.fused_mlp(x, [w_, w2], [b, None]), w,
                      lambda w_: F.linear(F.relu(F.linear(x.double(), w_, b.double())),
                                          w2.double())),
    }  # fmt: skip
    f, weight, reference = calls[op]
    w64 = weight.detach().double().requires_grad_()
    reference(w64).sum().backward()
    try:
        got = torch.compile(torch.func.grad(lambda w_: f(w_).sum()))(weight)
    except Exception:  # noqa: BLE001 (an error is an honest answer here)
        torch._dynamo.reset()
        return
    torch._dynamo.reset()
    assert got.abs().max() > 0, "all-zero gradient"
    torch.testing.assert_close(got.double(), w64.grad, rtol=1e-4, atol=1e-5)
