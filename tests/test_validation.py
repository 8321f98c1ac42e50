"""Bad inputs raise errors that name the argument, what was expected and what was given."""

import pytest
import torch
from conftest import DEVICE, HAS_CUDA

import dualk


def r(*shape, dtype=torch.float32, device=DEVICE):
    return torch.randn(*shape, dtype=torch.float32, device=device).to(dtype)


@pytest.mark.parametrize("backend", ["torch", "triton", "auto"])
def test_integer_dtype_rejected(backend):
    with pytest.raises(
        TypeError, match=r"'a' has dtype torch.int32; expected float32, float16 or bfloat16"
    ):
        dualk.add(
            torch.ones(3, dtype=torch.int32), torch.ones(3, dtype=torch.int32), backend=backend
        )
    with pytest.raises(TypeError, match="'x' has dtype torch.int64"):
        dualk.relu_scale(torch.ones(3, dtype=torch.int64), 2.0, backend=backend)


def test_mixed_dtypes_rejected():
    with pytest.raises(TypeError, match="'b' has dtype torch.float16 but 'a' has torch.float32"):
        dualk.add(r(3), r(3, dtype=torch.float16))
    with pytest.raises(TypeError, match="'weight' has dtype torch.bfloat16"):
        dualk.linear_gelu(r(2, 4), r(3, 4, dtype=torch.bfloat16))


def test_float64_rejected():
    with pytest.raises(TypeError, match="float64"):
        dualk.matmul(r(2, 2).double(), r(2, 2).double())


def test_non_tensor_rejected():
    with pytest.raises(TypeError, match="'b' must be a torch.Tensor, got float"):
        dualk.add(r(3), 1.0)
    with pytest.raises(TypeError, match="'scale' must be a real number, got Tensor"):
        dualk.relu_scale(r(3), torch.tensor(2.0))


def test_shapes_that_do_not_broadcast():
    with pytest.raises(
        ValueError, match=r"shapes \(3,\) \('a'\) and \(4,\) \('b'\) do not broadcast"
    ):
        dualk.add(r(3), r(4))


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA tensor beside a CPU one")
def test_wrong_device_rejected():
    with pytest.raises(ValueError, match="'b' is on cpu but 'a' is on cuda"):
        dualk.add(r(3), r(3, device="cpu"))


def test_cuda_backend_rejects_cpu_tensors():
    if HAS_CUDA:
        pytest.skip("CPU-only message")
    with pytest.raises(dualk.BackendUnavailableError, match="needs CUDA tensors"):
        dualk.matmul(r(2, 2), r(2, 2), backend="cuda")


def test_matmul_shape_errors():
    with pytest.raises(ValueError, match="inner sizes differ"):
        dualk.matmul(r(2, 3), r(4, 5))
    with pytest.raises(ValueError, match="2-dim or 3-dim"):
        dualk.matmul(r(2, 3, 4, 5), r(5, 2))
    with pytest.raises(ValueError, match="batch sizes differ"):
        dualk.matmul(r(2, 3, 4), r(3, 4, 5))


def test_linear_gelu_shape_errors():
    with pytest.raises(ValueError, match="'x' has 5 features"):
        dualk.linear_gelu(r(2, 5), r(3, 4))
    with pytest.raises(ValueError, match=r"'bias' must have shape \(3,\)"):
        dualk.linear_gelu(r(2, 4), r(3, 4), r(4))
    with pytest.raises(ValueError, match="'approximate' must be one of"):
        dualk.linear_gelu(r(2, 4), r(3, 4), approximate="erf")


def test_fused_mlp_errors():
    x = r(2, 8)
    with pytest.raises(
        ValueError, match=r"layer 0 \(its output\) has 6 features but 'weights\[1\]'"
    ):
        dualk.fused_mlp(x, [r(6, 8), r(4, 5)], [None, None])
    with pytest.raises(TypeError, match="one entry"):
        dualk.fused_mlp(x, [r(6, 8)], [])
    with pytest.raises(ValueError, match="'activation' must be one of"):
        dualk.fused_mlp(x, [r(6, 8)], [None], activation="tanh")
    with pytest.raises(ValueError, match=r"'biases\[0\]' must have shape \(6,\)"):
        dualk.fused_mlp(x, [r(6, 8)], [r(5)])
    with pytest.raises(ValueError, match=r"'x' has 8 features but 'weights\[0\]'"):
        dualk.fused_mlp(x, [r(6, 7)], [None])
    with pytest.raises(TypeError, match=r"'weights\[1\]' has dtype torch.float16"):
        dualk.fused_mlp(x, [r(6, 8), r(4, 6, dtype=torch.float16)], [None, None])
    with pytest.raises(ValueError, match=r"'weights\[0\]' must be 2-dim"):
        dualk.fused_mlp(x, [r(6, 8, 1)], [None])
