"""The CUDA backend's Python wrappers for the GEMM family (dualk/backends/cuda.py) against a
stand-in extension that enforces the launcher's contract (cuda_src/binding_gemm.cpp: operands 2-dim,
or 3-dim with batch; A with unit stride along k; B with unit stride along n or along k; an
nn.Linear weight as it is, read as B = weight^T; a fresh contiguous output of the result's shape)
and computes with PyTorch. Runs on the CPU: what it checks is what the wrappers hand the
launcher, for every layout the public ops accept; the kernels themselves are the GPU suite's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dualk.backends import cuda as cuda_backend


def _unit(t: torch.Tensor, dim: int) -> bool:
    return t.stride(dim) == 1 or t.size(dim) <= 1


def _as3(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() == 3 else t.unsqueeze(0)


class _Launcher:
    """binding_gemm.cpp's matmul, linear_gelu and linear_glu checks, then PyTorch's result
    written into out."""

    def __init__(self):
        self.calls: list[str] = []

    def _check(self, a3, b3, out):
        assert out.is_contiguous(), "the output must be contiguous"
        assert _unit(a3, 2), "'a' needs unit stride along k"
        assert _unit(b3, 2) or _unit(b3, 1), "'b' needs unit stride along n or along k"
        assert a3.shape[2] == b3.shape[1]
        c3 = _as3(out)
        assert c3.shape[1:] == (a3.shape[1], b3.shape[2])
        assert a3.shape[0] in (1, c3.shape[0]) and b3.shape[0] in (1, c3.shape[0])

    def matmul(self, a, b, out, allow_tf32):
        assert a.dim() in (2, 3) and b.dim() in (2, 3) and out.dim() in (2, 3)
        self._check(_as3(a), _as3(b), out)
        self.calls.append("matmul")
        out.copy_(torch.matmul(a.double(), b.double()).reshape(out.shape).to(out.dtype))

    def linear_gelu(self, x, weight, bias, out, activation, allow_tf32):
        assert x.dim() == 2 and weight.dim() == 2 and out.dim() == 2
        self._check(_as3(x), weight.t().unsqueeze(0), out)
        assert bias is None or (bias.is_contiguous() and bias.numel() == weight.shape[0])
        approximate = {2: "tanh", 3: "none"}[activation]
        z = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
        self.calls.append("linear_gelu")
        out.copy_(F.gelu(z, approximate=approximate).to(out.dtype))

    def linear_glu(
        self, x, weight_gate, weight_up, bias_gate, bias_up, out, activation, allow_tf32
    ):
        assert x.dim() == 2 and weight_gate.dim() == 2 and weight_up.dim() == 2 and out.dim() == 2
        assert weight_gate.shape == weight_up.shape
        pre = []
        for w, b in ((weight_gate, bias_gate), (weight_up, bias_up)):
            self._check(_as3(x), w.t().unsqueeze(0), out)
            assert b is None or (b.is_contiguous() and b.numel() == w.shape[0])
            pre.append(F.linear(x.double(), w.double(), None if b is None else b.double()))
        act = {1: torch.relu, 2: lambda v: F.gelu(v, approximate="tanh"), 3: F.gelu, 4: F.silu}
        self.calls.append("linear_glu")
        out.copy_((act[activation](pre[0]) * pre[1]).to(out.dtype))


@pytest.fixture
def launcher(monkeypatch):
    fake = _Launcher()
    monkeypatch.setattr(cuda_backend, "extension", lambda family="elementwise", verbose=None: fake)
    torch.manual_seed(0)
    return fake


def _r(*shape):
    return torch.randn(*shape, dtype=torch.float64).float()


MATMUL_CASES = {
    "2d": lambda: (_r(5, 7), _r(7, 3)),
    "a transposed": lambda: (_r(7, 5).t(), _r(7, 3)),
    "b transposed (k-major)": lambda: (_r(5, 7), _r(3, 7).t()),
    "b neither (copied)": lambda: (_r(5, 7), _r(7, 6)[:, ::2]),
    "a sliced rows": lambda: (_r(5, 10)[:, 2:9], _r(7, 3)),
    "batched": lambda: (_r(4, 5, 7), _r(4, 7, 3)),
    "3d @ 2d": lambda: (_r(4, 5, 7), _r(7, 3)),
    "2d @ 3d": lambda: (_r(5, 7), _r(4, 7, 3)),
    "batched, b transposed": lambda: (_r(4, 5, 7), _r(4, 3, 7).transpose(1, 2)),
    "one row, one column": lambda: (_r(1, 7), _r(7, 1)),
}


@pytest.mark.parametrize("case", list(MATMUL_CASES))
def test_matmul_wrapper_hands_the_launcher_valid_operands(launcher, case):
    a, b = MATMUL_CASES[case]()
    out = cuda_backend.matmul(a, b)
    expected = torch.matmul(a.double(), b.double())
    assert out.shape == expected.shape and out.is_contiguous()
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-6)
    assert launcher.calls == ["matmul"]


LINEAR_CASES = {
    "2d": lambda: (_r(5, 7), _r(3, 7), _r(3)),
    "no bias": lambda: (_r(5, 7), _r(3, 7), None),
    "batched x": lambda: (_r(2, 4, 7), _r(3, 7), _r(3)),
    "1-dim x": lambda: (_r(7), _r(3, 7), _r(3)),
    "x transposed": lambda: (_r(7, 5).t(), _r(3, 7), _r(3)),
    "weight transposed view": lambda: (_r(5, 7), _r(7, 3).t(), _r(3)),
    "weight strided both ways (copied)": lambda: (_r(5, 7), _r(6, 14)[::2, ::2], _r(3)),
    "bias strided": lambda: (_r(5, 7), _r(3, 7), _r(6)[::2]),
}


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("case", list(LINEAR_CASES))
def test_linear_gelu_wrapper_hands_the_launcher_valid_operands(launcher, case, approximate):
    x, weight, bias = LINEAR_CASES[case]()
    out = cuda_backend.linear_gelu(x, weight, bias, approximate)
    z = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    expected = F.gelu(z, approximate=approximate)
    assert out.shape == expected.shape and out.is_contiguous()
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-6)
    assert launcher.calls == ["linear_gelu"]


GLU_CASES = {
    "separate": lambda: (_r(5, 7), _r(3, 7), _r(3, 7), _r(3), _r(3)),
    "packed [gate; up]": lambda: (_r(5, 7), _r(6, 7), None, _r(6), None),
    "gate bias only": lambda: (_r(5, 7), _r(3, 7), _r(3, 7), _r(3), None),
    "batched x": lambda: (_r(2, 4, 7), _r(3, 7), _r(3, 7), None, None),
    "x strided": lambda: (_r(5, 14)[:, ::2], _r(3, 7), _r(3, 7), None, _r(3)),
    "weights transposed views": lambda: (_r(5, 7), _r(7, 3).t(), _r(7, 3).t(), None, None),
    "weights strided both ways (copied)": lambda: (
        _r(5, 7), _r(6, 14)[::2, ::2], _r(6, 14)[::2, ::2], None, None,
    ),
    "biases strided": lambda: (_r(5, 7), _r(3, 7), _r(3, 7), _r(6)[::2], _r(6)[::2]),
}  # fmt: skip


@pytest.mark.parametrize(
    "activation,approximate",
    [("silu", "tanh"), ("gelu", "tanh"), ("gelu", "none"), ("relu", "tanh")],
)
@pytest.mark.parametrize("case", list(GLU_CASES))
def test_linear_glu_wrapper_hands_the_launcher_valid_operands(
    launcher, case, activation, approximate
):
    from dualk.backends.torch_ref import linear_glu as reference

    args = GLU_CASES[case]()
    out = cuda_backend.linear_glu(*args, activation, approximate)
    expected = reference(
        *(a.double() if a is not None else None for a in args), activation, approximate
    )
    assert out.shape == expected.shape and out.is_contiguous()
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-6)
    assert launcher.calls == ["linear_glu"]


def test_empty_results_launch_nothing(launcher):
    assert cuda_backend.matmul(_r(0, 7), _r(7, 3)).shape == (0, 3)
    assert cuda_backend.linear_gelu(_r(0, 7), _r(3, 7), _r(3)).shape == (0, 3)
    assert cuda_backend.linear_glu(_r(0, 7), _r(3, 7), _r(3, 7)).shape == (0, 3)
    assert cuda_backend.linear_glu(_r(2, 5, 7), _r(0, 7), _r(0, 7)).shape == (2, 5, 0)
    assert launcher.calls == []
