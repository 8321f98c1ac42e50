"""Tensors past 2^31 elements (GPU only): 64-bit indexing in every kernel that walks them, for
every operator. Elementwise ops compare bit for bit with PyTorch (both compute in fp32 and round
once); the GEMM family compares its last rows (where 32-bit offsets would wrap) with an fp32
computation of the same rows."""

import fcntl
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import HAS_CUDA

import dualk
from dualk.backends import unavailable_reason

pytestmark = pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU with > 16 GiB free")

BIG = 2**31 + 4099  # elements: past int32, not a multiple of any block size


@pytest.fixture(autouse=True)
def _one_at_a_time():
    """xdist workers share one GPU: these tests take turns (a lock file), and free their memory."""
    with open(Path(tempfile.gettempdir()) / "dualk-large-tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            torch.cuda.empty_cache()
            fcntl.flock(lock, fcntl.LOCK_UN)


def _need_gib(gib: float) -> None:
    free, _ = torch.cuda.mem_get_info()
    if free < gib * 2**30:
        pytest.skip(f"needs {gib} GiB of free GPU memory, {free / 2**30:.1f} free")


def _backend(name: str) -> None:
    reason = unavailable_reason(name, torch.device("cuda"))
    if reason is not None:
        pytest.skip(reason)


@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_add_past_int32(backend):
    _backend(backend)
    _need_gib(18)
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(BIG, device="cuda", dtype=torch.float16, generator=gen)
    b = torch.randn(BIG, device="cuda", dtype=torch.float16, generator=gen)
    out = dualk.add(a, b, alpha=0.5, backend=backend)
    expected = torch.add(a, b, alpha=0.5)
    del a, b
    assert out.shape == (BIG,)
    assert torch.equal(out, expected), f"{int((out != expected).sum())} elements differ"


@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_relu_scale_past_int32(backend):
    _backend(backend)
    _need_gib(14)
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(BIG, device="cuda", dtype=torch.float16, generator=gen)
    out = dualk.relu_scale(x, 1.75, backend=backend)
    expected = torch.relu(x) * 1.75
    del x
    assert torch.equal(out, expected), f"{int((out != expected).sum())} elements differ"


@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_fused_mlp_input_past_int32(backend):
    """x has 2^25 + 37 rows of 64 (> 2^31 elements): the last rows' offsets need 64 bits."""
    _backend(backend)
    _need_gib(8)
    rows = 2**25 + 37
    torch.manual_seed(2)
    layers = [torch.nn.Linear(i, o).to("cuda", torch.float16) for i, o in ((64, 64), (64, 16))]
    x = torch.randn(rows, 64, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        out = dualk.fused_mlp(
            x, [m.weight for m in layers], [m.bias for m in layers], activation="relu",
            backend=backend,
        )  # fmt: skip
        tail = x[-4096:].float()
        expected = F.linear(
            torch.relu(F.linear(tail, layers[0].weight.float(), layers[0].bias.float())),
            layers[1].weight.float(), layers[1].bias.float(),
        )  # fmt: skip
    assert out.shape == (rows, 16)
    # fp16 operands, fp32 accumulation, one hidden rounding to fp16: well inside 1e-2.
    torch.testing.assert_close(out[-4096:].float(), expected, atol=1e-2, rtol=1e-2)
    assert out[: rows - 4096].isfinite().all()


@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_matmul_input_past_int32(backend):
    """a has 2^21 + 37 rows of 1024 (> 2^31 elements): the last rows of the product need 64-bit
    offsets into a."""
    _backend(backend)
    _need_gib(8)
    rows = 2**21 + 37
    gen = torch.Generator(device="cuda").manual_seed(3)
    a = torch.randn(rows, 1024, device="cuda", dtype=torch.float16, generator=gen)
    b = torch.randn(1024, 48, device="cuda", dtype=torch.float16, generator=gen) / 32
    out = dualk.matmul(a, b, backend=backend)
    assert out.shape == (rows, 48)
    expected = a[-4096:].float() @ b.float()
    torch.testing.assert_close(out[-4096:].float(), expected, atol=2e-2, rtol=2e-2)
    assert out.isfinite().all()


@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_matmul_output_past_int32(backend):
    """(131077 x 64) @ (64 x 16387): the product has 2^31 + 475151 elements."""
    _backend(backend)
    _need_gib(10)
    m, k, n = 131077, 64, 16387
    gen = torch.Generator(device="cuda").manual_seed(4)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen) / 8
    out = dualk.matmul(a, b, backend=backend)
    assert out.shape == (m, n) and out.numel() > 2**31
    expected = a[-64:].float() @ b.float()
    # bf16 output: one rounding (2^-8 relative) of values of size ~3.
    torch.testing.assert_close(out[-64:].float(), expected, atol=5e-2, rtol=1e-2)
    assert out[:, -7:].float().isfinite().all()


@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_linear_gelu_input_past_int32(backend):
    """x has 2^21 + 37 rows of 1024: bias + GELU on the last rows through 64-bit offsets."""
    _backend(backend)
    _need_gib(8)
    rows = 2**21 + 37
    torch.manual_seed(5)
    layer = torch.nn.Linear(1024, 40).to("cuda", torch.float16)
    x = torch.randn(rows, 1024, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        out = dualk.linear_gelu(x, layer.weight, layer.bias, backend=backend)
        pre = F.linear(x[-4096:].float(), layer.weight.float(), layer.bias.float())
        expected = F.gelu(pre, approximate="tanh")
    assert out.shape == (rows, 40)
    torch.testing.assert_close(out[-4096:].float(), expected, atol=1e-2, rtol=1e-2)
    assert out.isfinite().all()
