"""Host-side planning code of the CUDA GEMM family, compiled with nvcc and run on the CPU (no GPU
needed: split_k_plan is integer arithmetic over GemmArgs and DeviceProps). The GPU tests check
the results of these plans; this checks the plans themselves, which only the GPU exercised."""

import subprocess
import textwrap
from pathlib import Path

import pytest
from test_cuda_compile import NVCC, SRC

PROGRAM = textwrap.dedent(
    r"""
    #include <cstdio>
    #include "gemm_select.cuh"
    using namespace dualk;
    int main() {
      static char buf[1 << 12] __attribute__((aligned(256)));
      DeviceProps h100;
      h100.num_sms = 132;
      // dtype m n k batch lda(k+pad) ldb_outer k_major
      const struct { DType dt; long m, n, k, batch, lda_pad; bool kmaj; } cases[] = {
          {DType::kBFloat16, 128, 128, 8192, 1, 0, false},  // 128x8192x128
          {DType::kFloat32, 128, 128, 8192, 1, 0, false},
          {DType::kFloat32, 72, 40, 5000, 1, 0, false},     // split_k_odd
          {DType::kFloat16, 72, 40, 5000, 1, 0, false},
          {DType::kFloat32, 64, 64, 65536, 1, 0, false},    // weight_grad
          {DType::kFloat32, 4096, 4096, 4096, 1, 0, false}, // many tiles: one pass
          {DType::kBFloat16, 64, 64, 4096, 2, 0, false},    // batch 2: one pass
          {DType::kFloat32, 64, 64, 511, 1, 0, false},      // k < 2 x 256: one pass
          {DType::kBFloat16, 64, 48, 4001, 1, 1, true},     // 16-bit rows not 16-byte aligned
          {DType::kFloat32, 64, 48, 4001, 1, 1, true},      // fp32: any rows
      };
      for (const auto& c : cases) {
        GemmArgs g{};
        g.a = g.b = buf;
        g.c = buf;
        g.dtype = c.dt;
        g.m = c.m; g.n = c.n; g.k = c.k; g.batch = c.batch;
        g.stride_am = c.k + c.lda_pad;
        g.b_k_major = c.kmaj;
        g.stride_b_outer = c.kmaj ? c.k + c.lda_pad : c.n;
        g.stride_a_batch = c.m * g.stride_am;
        g.stride_b_batch = c.k * c.n;
        g.stride_cm = c.n;
        const gemm::SplitK plan = gemm::split_k_plan(g, h100);
        printf("%lld %lld\n", (long long)plan.splits, (long long)plan.slice);
      }
      return 0;
    }
    """
)

EXPECTED = [
    (32, 256),  # 16-bit: 4 tiles of 64 x 64 -> 66 wanted, k / 256 = 32 slices of 256
    (32, 256),  # fp32: 1 tile of 128 x 128 -> 264 wanted, 32 slices of 256
    (18, 288),  # 19 wanted: slices of 288 (a multiple of 32), 17 full and a tail of 104
    (18, 288),
    (128, 512),  # at most 128 slices
    (1, 4096),
    (1, 4096),
    (1, 511),
    (1, 4001),
    (14, 288),  # 4001 / 256 = 15 wanted: slices of 288, 13 full and a tail of 257
]


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_split_k_plans(tmp_path: Path):
    src = tmp_path / "plans.cu"
    src.write_text(PROGRAM)
    exe = tmp_path / "plans"
    build = subprocess.run(
        [str(NVCC), "-std=c++17", f"-I{SRC}", "-gencode=arch=compute_80,code=sm_80", "-o", str(exe),
         str(src)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    plans = [tuple(int(v) for v in line.split()) for line in run.stdout.splitlines()]
    assert plans == EXPECTED
