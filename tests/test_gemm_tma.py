"""The Triton TMA GEMM (triton_src/gemm_tma.py) on Hopper: every config it can be tuned to, forced
in turn, on shapes with M / N / K tails, both B layouts, bias, tanh-gelu, fp16 and bf16. The
registry's parity cases are too small to reach it (it only joins the tuner above MIN_MACS).

The modules are dualk.triton_src.*, the ones dualk's Triton backend imports: the repository's
top-level ``triton_src`` package is a second module object, so setting its FORCE_CONFIG did
not reach dualk's calls (the forced TMA configs never ran). Each case counts launch_tma calls."""

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
    from dualk.triton_src import gemm_tma, matmul

    if gemm_tma.TensorDescriptor is None:
        pytest.skip("this Triton has no host-side tensor descriptors")
    return gemm_tma, matmul


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cfg_index", [0, 1, 2])
@pytest.mark.parametrize("op", ["matmul", "linear_gelu"])
def test_tma_config(op, cfg_index, dtype, monkeypatch):
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
    launched = []

    def counting_launch_tma(cfg, *args):
        launched.append(cfg)
        return gemm_tma.launch_tma(cfg, *args)

    monkeypatch.setattr(matmul_mod, "FORCE_CONFIG", [cfg])
    monkeypatch.setattr(matmul_mod, "launch_tma", counting_launch_tma)
    out = getattr(dualk, op)(*sample.args, **sample.kwargs, backend="triton")
    torch.cuda.synchronize()
    assert launched == [cfg], f"{op}: the forced TMA config did not run ({launched})"
    verdict = judge(OPS[op], sample, out)
    assert verdict.ok, f"{op} {cfg} {dtype}: {verdict.message}"

    # Again with other values and another M of the same specialization (1000 and 1003: neither
    # a multiple of 16): the launcher's cached CompiledKernel runs it (no kernel[grid]), and must
    # not have kept anything of the first call but its specialization.
    fast_before = gemm_tma._launcher.fast_launches
    x2 = (torch.rand((1003, K), generator=gen) * 2 - 1).to("cuda", dtype)
    sample2 = Sample((x2, *sample.args[1:]), sample.kwargs, "tma")
    out2 = getattr(dualk, op)(*sample2.args, **sample2.kwargs, backend="triton")
    torch.cuda.synchronize()
    assert gemm_tma._launcher.fast_launches == fast_before + 1, "the second call was not direct"
    verdict = judge(OPS[op], sample2, out2)
    assert verdict.ok, f"{op} {cfg} {dtype}, direct launch: {verdict.message}"


def test_tma_joins_the_tuner_only_where_it_can_run():
    gemm_tma, _ = _tma()
    big = torch.empty((4096, 4096), device="cuda", dtype=torch.bfloat16)
    strides = (4096, 1, 4096, 1, 4096, 1)  # sa1, sa2, sb1, sb2, sc1, sc2: row-major A, B, C
    assert (
        gemm_tma.tma_configs(big, big, big, 1, 4096, 4096, 4096, *strides) == gemm_tma.TMA_CONFIGS
    )
    # 4096 x 1000 x 4096 (0.98 x 2^34 multiply-adds): rows of 2000 bytes, 16-byte aligned
    strides_k1000 = (1000, 1, 4096, 1, 4096, 1)
    assert gemm_tma.tma_configs(big, big, big, 1, 4096, 4096, 1000, *strides_k1000)
    assert gemm_tma.MIN_MACS <= 4096 * 4096 * 1000
    small = big[:64, :64]
    assert gemm_tma.tma_configs(small, small, small, 1, 64, 64, 64, 4096, 1, 4096, 1, 4096, 1) == ()
    assert gemm_tma.tma_configs(big.float(), big.float(), big.float(), 1, 4096, 4096, 4096,
                                4096, 1, 4096, 1, 4096, 1) == ()  # fmt: skip
