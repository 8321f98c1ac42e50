"""The Triton TMA GEMM (triton_src/gemm_tma.py) on Hopper: every config it can be tuned to, forced
in turn, on shapes with M / N / K tails, both B layouts, bias, tanh-gelu, fp16 and bf16. The
registry's parity cases are too small to reach it (it only joins the tuner above MIN_MACS)."""

import pytest
import torch
from conftest import HAS_CUDA

import dualk
from dualk.registry import OPS, Sample
from dualk.testing import judge

pytestmark = pytest.mark.skipif(
    not HAS_CUDA or torch.cuda.get_device_capability()[0] < 9, reason="TMA needs an sm_90+ GPU"
)


def _tma():
    from triton_src import gemm_tma, matmul

    if gemm_tma.TensorDescriptor is None:
        pytest.skip("this Triton has no host-side tensor descriptors")
    return gemm_tma, matmul


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cfg_index", [0, 1, 2])
@pytest.mark.parametrize("op", ["matmul", "linear_gelu"])
def test_tma_config(op, cfg_index, dtype):
    gemm_tma, matmul_mod = _tma()
    cfg = gemm_tma.TMA_CONFIGS[cfg_index]
    gen = torch.Generator().manual_seed(1000 + cfg_index)
    M, K, N = 1000, 4104, 776  # tails in every dimension; rows stay 16-byte aligned
    x = (torch.rand((M, K), generator=gen) * 2 - 1).to("cuda", dtype)
    if op == "matmul":
        b = (torch.rand((K, N), generator=gen) * 2 - 1).to("cuda", dtype)
        sample = Sample((x, b), {}, "tma")
    else:
        w = ((torch.rand((N, K), generator=gen) * 2 - 1) / K**0.5).to("cuda", dtype)
        bias = (torch.rand(N, generator=gen) * 2 - 1).to("cuda", dtype)
        sample = Sample((x, w, bias), {"approximate": "tanh"}, "tma")
    matmul_mod.FORCE_CONFIG[:] = [cfg]
    try:
        out = getattr(dualk, op)(*sample.args, **sample.kwargs, backend="triton")
        torch.cuda.synchronize()
    finally:
        matmul_mod.FORCE_CONFIG.clear()
    verdict = judge(OPS[op], sample, out)
    assert verdict.ok, f"{op} {cfg} {dtype}: {verdict.message}"


def test_tma_joins_the_tuner_only_where_it_can_run():
    gemm_tma, _ = _tma()
    big = torch.empty((4096, 4096), device="cuda", dtype=torch.bfloat16)
    strides = (4096, 1, 4096, 1, 4096, 1)  # sa1, sa2, sb1, sb2, sc1, sc2: row-major A, B, C
    assert (
        gemm_tma.tma_configs(big, big, big, 1, 4096, 4096, 4096, *strides) == gemm_tma.TMA_CONFIGS
    )
    small = big[:64, :64]
    assert gemm_tma.tma_configs(small, small, small, 1, 64, 64, 64, 4096, 1, 4096, 1, 4096, 1) == ()
    assert gemm_tma.tma_configs(big.float(), big.float(), big.float(), 1, 4096, 4096, 4096,
                                4096, 1, 4096, 1, 4096, 1) == ()  # fmt: skip
