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
        self.served_new: list[str] = []  # calls whose output the extension made

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

    # The calls whose output binding_gemm.cpp makes (linear_gelu_new, linear_glu_new): None where
    # x's rows need a copy or a reshape (not 2-dim with unit stride along k, nor contiguous), a
    # weight lacks unit stride along both dims, a bias is strided, or nothing is to be computed;
    # else the output (rows, n), NaN-filled when poisoning, through the launcher's own contract,
    # returned as (..., n).
    @staticmethod
    def _rows(x):
        if x.dim() < 2 or x.shape[-1] == 0 or x.numel() == 0:
            return None
        if x.dim() == 2:
            return x if _unit(x, 1) else None
        return x.view(-1, x.shape[-1]) if x.is_contiguous() else None

    def _new(self, x, weights, biases, poison):
        rows = self._rows(x)
        if rows is None or any(w.dim() != 2 or w.shape[0] == 0 or not (_unit(w, 1) or _unit(w, 0))
                               for w in weights):  # fmt: skip
            return None, None
        if any(b is not None and not b.is_contiguous() for b in biases):
            return None, None
        out = torch.empty(rows.shape[0], weights[0].shape[0], dtype=x.dtype)
        if poison:
            out.fill_(float("nan"))
        return rows, out

    def linear_gelu_new(self, x, weight, bias, activation, allow_tf32, poison):
        rows, out = self._new(x, [weight], [bias], poison)
        if rows is None:
            return None
        self.linear_gelu(rows, weight, bias, out, activation, allow_tf32)
        self.served_new.append("linear_gelu")
        return out.view(*x.shape[:-1], out.shape[1])

    def linear_glu_new(self, x, wg, wu, bg, bu, activation, allow_tf32, poison):
        rows, out = self._new(x, [wg, wu], [bg, bu], poison)
        if rows is None:
            return None
        self.linear_glu(rows, wg, wu, bg, bu, out, activation, allow_tf32)
        self.served_new.append("linear_glu")
        return out.view(*x.shape[:-1], out.shape[1])


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
    # the common layouts take the extension's own allocation, the rest Python's copies / reshapes
    common = case in ("2d", "no bias", "batched x", "weight transposed view")
    assert launcher.served_new == (["linear_gelu"] if common else [])


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
    common = case in ("separate", "packed [gate; up]", "gate bias only", "batched x",
                      "weights transposed views")  # fmt: skip
    assert launcher.served_new == (["linear_glu"] if common else [])


def test_outputs_made_by_the_extension_are_poisoned_in_test_mode(launcher, monkeypatch):
    """With dualk's output poisoning on, the extension's own allocation is poisoned too (the
    launcher then overwrites every element; a kernel that skipped some would leave NaN)."""
    from dualk.core import alloc

    seen = []
    real = launcher._new

    def spy(x, weights, biases, poison):
        seen.append(poison)
        return real(x, weights, biases, poison)

    monkeypatch.setattr(launcher, "_new", spy)
    monkeypatch.setattr(alloc, "_poison", True)
    out = cuda_backend.linear_gelu(_r(2, 4, 7), _r(3, 7), _r(3))
    assert out.shape == (2, 4, 3) and not out.isnan().any()
    monkeypatch.setattr(alloc, "_poison", False)
    cuda_backend.linear_glu(_r(5, 7), _r(3, 7), _r(3, 7))
    assert seen == [True, False] and launcher.served_new == ["linear_gelu", "linear_glu"]


def test_empty_results_launch_nothing(launcher):
    assert cuda_backend.matmul(_r(0, 7), _r(7, 3)).shape == (0, 3)
    assert cuda_backend.linear_gelu(_r(0, 7), _r(3, 7), _r(3)).shape == (0, 3)
    assert cuda_backend.linear_glu(_r(0, 7), _r(3, 7), _r(3, 7)).shape == (0, 3)
    assert cuda_backend.linear_glu(_r(2, 5, 7), _r(0, 7), _r(0, 7)).shape == (2, 5, 0)
    assert launcher.calls == []
