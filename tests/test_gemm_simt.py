"""The CUDA fp32 GEMM (cuda_src/gemm.cuh): gemm_simt_wide_kernel serves fp32 operands with 16-byte
rows (k % 4 == 0, n % 4 == 0 for a row-major B, strides multiples of 4), gemm_simt_skinny_kernel
the same with at most 32 rows, gemm_simt_kernel the rest. The registry's parity cases reach the
wide kernel only with k % 8 == 0, batch 1 and C rows that allow float4 stores; these add the
masked k tail (k % 8 == 4), m / n tails across several tiles, strided rows, batch (also with a
broadcast B), n % 4 != 0 with a k-major B (scalar C stores), k == 0 (act(bias)), every
linear_gelu epilogue, and the skinny kernel's one-pass and split-K uses. Which kernel runs is
not observable from Python: each case is placed by its sizes (launch_simt, split_k_plan)."""

import math
import zlib

import pytest
import torch
from conftest import HAS_CUDA

import dualk
from dualk.backends import unavailable_reason
from dualk.registry import OPS, Sample
from dualk.testing import judge

pytestmark = pytest.mark.skipif(not HAS_CUDA, reason="runs the CUDA kernels")


def _randn(shape, gen, scale=1.0):
    return (torch.randn(shape, generator=gen) * scale).to("cuda")


def _mm(a_shape, b_shape, a_cols=None, b_cols=None, b_k_major=False):
    """matmul; a_cols / b_cols: allocate wider rows and slice (row stride != row length);
    b_k_major: B is the transpose of a (..., n, k) tensor (unit stride along k)."""

    def make(gen):
        k = a_shape[-1]
        a = _randn((*a_shape[:-1], a_cols or k), gen)[..., :k]
        n = b_shape[-1]
        if b_k_major:
            b = _randn((*b_shape[:-2], n, k), gen, 1 / math.sqrt(max(k, 1))).transpose(-1, -2)
        else:
            b = _randn((*b_shape[:-1], b_cols or n), gen, 1 / math.sqrt(max(k, 1)))[..., :n]
        return "matmul", Sample((a, b), {}, f"{tuple(a.shape)} @ {tuple(b.shape)}")

    return make


def _lg(m, k, n, bias=True, approximate="tanh", k_cols=None):
    """linear_gelu, W (n, k) k-major; k_cols: rows of x and W allocated wider than k."""

    def make(gen):
        x = _randn((m, k_cols or k), gen)[:, :k]
        w = _randn((n, k_cols or k), gen, 1 / math.sqrt(max(k, 1)))[:, :k]
        b = _randn(n, gen, 0.5) if bias else None
        label = f"x {tuple(x.shape)}, W {tuple(w.shape)}, bias {bias}, {approximate}"
        return "linear_gelu", Sample((x, w, b), {"approximate": approximate}, label)

    return make


CASES = {
    # wide kernel (m > 32)
    "mm_tails": _mm((1000, 132), (132, 4100)),  # m, n tails over many tiles; k % 8 == 4
    "mm_strided_rows": _mm((300, 132), (132, 256), a_cols=136, b_cols=260),
    "mm_batched": _mm((3, 129, 36), (3, 36, 260)),
    "mm_broadcast_b": _mm((2, 130, 20), (20, 68)),  # B batch stride 0
    "mm_k0_wide": _mm((40, 0), (0, 12), a_cols=4),  # writes zeros
    "lg_tanh_bias_n_tail": _lg(300, 132, 130),  # n % 4 == 2: scalar C stores
    "lg_tanh_no_bias": _lg(129, 68, 260, bias=False),
    "lg_erf_bias": _lg(257, 516, 200, approximate="none"),
    "lg_erf_no_bias": _lg(64, 132, 132, bias=False, approximate="none"),
    "lg_k0_bias_wide": _lg(40, 0, 8, k_cols=4),  # gelu(bias)
    "mm_rows_33": _mm((33, 516), (516, 260)),  # split-K slices, one row past the skinny kernel
    # gemm_simt_skinny_kernel (m <= 32): split-K slices (k >= 512) with either B layout, one pass
    # with k and n tails, strided rows, batch (B per batch entry, broadcast, k-major), scalar C
    # stores, k == 0
    "lg_skinny_split": _lg(32, 768, 3072),  # the default suite's fp32 row, split-K slices of 96
    "mm_skinny_split": _mm((32, 768), (768, 3072)),  # B (k, n)
    "mm_skinny_split_k_tail": _mm((5, 1000), (1000, 260)),  # slices and a shorter last one
    "lg_skinny_one_pass_tails": _lg(7, 132, 300, approximate="none"),  # k % 32 == 4, n tile tail
    "lg_skinny_k_tail_20": _lg(9, 148, 136),  # k % 32 == 20: two float4 columns of k masked
    "lg_skinny_decode_n_tail": _lg(1, 260, 130, bias=False),  # n % 4 == 2: scalar C stores
    "lg_skinny_strided_rows": _lg(17, 516, 200, k_cols=520),  # split-K slices of strided rows
    "mm_skinny_batched": _mm((3, 20, 36), (3, 36, 260)),
    "mm_skinny_broadcast_b": _mm((2, 20, 36), (36, 68)),  # B batch stride 0
    "mm_skinny_batched_b_k_major": _mm((3, 12, 164), (3, 164, 200), b_k_major=True),
    "mm_skinny_strided": _mm((31, 132), (132, 256), a_cols=136, b_cols=260),
    "mm_k0": _mm((8, 0), (0, 12), a_cols=4),  # writes zeros
    "lg_k0_bias": _lg(5, 0, 8, k_cols=4),  # gelu(bias)
    # gemm_simt_kernel fallback: k % 4 != 0, n % 4 != 0 with B (k, n)
    "mm_fallback_k": _mm((130, 131), (131, 260)),
    "mm_fallback_n": _mm((130, 132), (132, 258)),
    "lg_fallback_k": _lg(130, 131, 260),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fp32_gemm_matches_float64_reference(case):
    reason = unavailable_reason("cuda", torch.device("cuda"))
    if reason is not None:
        pytest.skip(reason)
    op, sample = CASES[case](torch.Generator().manual_seed(zlib.crc32(case.encode())))
    out = getattr(dualk, op)(*sample.args, **sample.kwargs, backend="cuda")
    torch.cuda.synchronize()
    verdict = judge(OPS[op], sample, out)
    assert verdict.ok, f"{op} [{sample.label}]: {verdict.message}"
