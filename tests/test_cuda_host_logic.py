"""Host-side planning code of the CUDA GEMM family and of the wide fused-MLP kernel, compiled with
nvcc and run on the CPU (no GPU needed: split_k_plan, gemm_sm90::choose_tiles and
wide::unfit_reason are arithmetic over the launch arguments and DeviceProps). The GPU tests
check the results of these plans; this checks the plans themselves, which only the GPU
exercised."""

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
          {DType::kBFloat16, 64, 64, 511, 1, 0, false},     // 16-bit k < 2 x 256: one pass
          {DType::kFloat32, 64, 64, 511, 1, 0, false},      // fp32 k < 2 x 256: one pass too
          {DType::kFloat32, 64, 64, 512, 1, 0, false},      // 1 tile: slices of 64
          {DType::kFloat32, 32, 3072, 768, 1, 0, true},     // linear_gelu 32x768->3072
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
    (128, 64),  # fp32: 1 tile of 128 x 128 -> 264 wanted, at most 128 slices (of 64)
    (53, 96),  # fp32: k / 64 = 78 wanted: slices of 96 (a multiple of 32), 52 full and a tail of 8
    (18, 288),  # 16-bit: 19 wanted: slices of 288, 17 full and a tail of 104
    (128, 512),  # at most 128 slices
    (1, 4096),
    (1, 4096),
    (1, 511),
    (1, 511),
    (8, 64),  # 512 / 64 = 8 wanted: slices of 64
    (8, 96),  # 24 tiles -> 11 wanted: slices of 96, 8 of them
    (1, 4001),
    (42, 96),  # 4001 / 64 = 62 wanted: slices of 96, 41 full and a tail of 65
]


def build_and_run(tmp_path: Path, program: str) -> list[str]:
    """The program's output lines (host code only: built for sm_80, run on the CPU)."""
    src = tmp_path / "host_logic.cu"
    src.write_text(program)
    exe = tmp_path / "host_logic"
    build = subprocess.run(
        [str(NVCC), "-std=c++17", f"-I{SRC}", "-gencode=arch=compute_80,code=sm_80", "-o", str(exe),
         str(src)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_split_k_plans(tmp_path: Path):
    plans = [tuple(int(v) for v in line.split()) for line in build_and_run(tmp_path, PROGRAM)]
    assert plans == EXPECTED


WIDE_PROGRAM = textwrap.dedent(
    r"""
    #include <climits>
    #include <cstdio>
    #include <utility>
    #include <vector>
    #include "fused_mlp_wide.cuh"
    using namespace dualk;
    static char buf[1 << 12] __attribute__((aligned(256)));
    int main() {
      DeviceProps h100;
      h100.num_sms = 132; h100.smem_optin = 232448; h100.cc_major = 9; h100.cc_minor = 0;
      DeviceProps a100 = h100;
      a100.cc_major = 8; a100.smem_optin = 166912;
      DeviceProps sm90_small_smem = h100;
      sm90_small_smem.smem_optin = 101376;
      const auto args = [](std::initializer_list<int> widths, Activation act, long long m) {
        FusedMlpArgs a{};
        a.num_layers = static_cast<int>(widths.size()) - 1;
        int i = 0;
        for (int w : widths) a.widths[i++] = w;
        a.x = buf; a.out = buf; a.m = m; a.stride_xm = a.widths[0];
        for (int l = 0; l < a.num_layers; ++l) { a.weights[l] = buf; a.biases[l] = nullptr; }
        a.activation = act; a.dtype = DType::kBFloat16;
        return a;
      };
      const Activation relu = Activation::kRelu;
      std::vector<std::pair<FusedMlpArgs, DeviceProps>> cases;
      const auto add = [&](const FusedMlpArgs& a, const DeviceProps& d) { cases.emplace_back(a, d); };
      add(args({256, 256, 256, 64}, relu, 4133), h100);
      { auto a = args({256, 256, 256, 64}, relu, 4133); a.dtype = DType::kFloat16; add(a, h100); }
      { auto a = args({256, 256, 256, 64}, relu, 4133); a.dtype = DType::kFloat32; add(a, h100); }
      add(args({256, 256, 256, 64}, relu, 4133), a100);
      add(args({256, 256, 256, 64}, relu, 4133), sm90_small_smem);
      add(args({128, 128, 128, 64}, relu, 4133), h100);               // the resident kernels' case
      add(args({256, 64}, relu, 300), h100);                          // one layer
      add(args({256, 256, 64}, Activation::kGeluTanh, 300), h100);
      add(args({256, 256, 128}, Activation::kGeluTanh, 300), h100);   // spills: not built
      add(args({256, 256, 64}, Activation::kGeluErf, 300), h100);     // spills: not built
      add(args({256, 256, 128}, Activation::kSilu, 300), h100);
      add(args({200, 250, 64}, relu, 300), h100);                     // hidden width % 8 != 0
      add(args({256, 256, 10}, Activation::kNone, 300), h100);        // any output width
      add(args({32, 320, 16}, relu, 300), h100);
      { auto a = args({256, 256, 64}, relu, 300); a.x = buf + 2; add(a, h100); }
      { auto a = args({256, 256, 64}, relu, 300); a.weights[1] = buf + 8; add(a, h100); }
      { auto a = args({256, 256, 64}, relu, 300); a.stride_xm = 260; add(a, h100); }
      { auto a = args({256, 256, 64}, relu, 300); a.stride_xm = 264; add(a, h100); }
      { auto a = args({256, 256, 64}, relu, 300); a.stride_xm = 128; add(a, h100); }  // rows overlap
      { auto a = args({256, 256, 64}, relu, 1); a.stride_xm = 3; add(a, h100); }      // one row
      add(args({256, 256, 64}, relu, INT_MAX - 127LL), h100);
      add(args({256, 256, 64}, relu, INT_MAX - 128LL), h100);
      add(args({256, 256, 64}, relu, 0), h100);
      for (const auto& [a, device] : cases) {
        const char* why = mlp::wide::unfit_reason(a, device);
        printf("%s\n", why == nullptr ? "ok" : why);
      }
      return 0;
    }
    """
)

WIDE_EXPECTED = [
    "ok",
    "ok",
    "not fp16 / bf16",
    "not compute capability 9.0 (sm_90a code)",
    "shared memory",
    "no width above 128",
    "layer count",
    "ok",
    "no spill-free build for this activation and output width",
    "no spill-free build for this activation and output width",
    "ok",
    "an input width not a multiple of 8",
    "ok",
    "width out of 1..256",
    "x not 16-byte aligned",
    "weights not 16-byte aligned",
    "x row stride",
    "ok",
    "x row stride",
    "ok",
    "rows",
    "ok",
    "ok",
]


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_wide_mlp_eligibility(tmp_path: Path):
    """Which MLPs fused_mlp_wide.cu's kernel takes (wide::unfit_reason): the planner falls back to
    the mma.sync kernel for every other one."""
    assert build_and_run(tmp_path, WIDE_PROGRAM) == WIDE_EXPECTED


TILES_PROGRAM = textwrap.dedent(
    r"""
    #include <cstdio>
    #include "gemm_select.cuh"
    using namespace dualk;
    static char buf[1 << 12] __attribute__((aligned(256)));
    int main() {
      // op: 0 matmul (B n-major, row pitch n), 1 linear_gelu (W k-major, row pitch k)
      const struct { int lg; long batch, m, n, k; int quads; } cases[] = {
          {0, 1, 4096, 4096, 4096, 30},  // many tiles: 128 x 256
          {1, 1, 8192, 3072, 768, 30},   // gelu, k <= 1024: ping-pong 128 x 128
          {1, 1, 4096, 16384, 4096, 30}, // gelu, long k: 128 x 256
          {0, 1, 3000, 5000, 2000, 30},  // B rows of 10000 bytes (16 off a sector): pairs
          {0, 1, 1024, 1024, 1024, 30},  // few tiles: ping-pong 64 x 128
          {1, 1, 1024, 1024, 1024, 30},  // few tiles, gelu: 128 x 128
          {1, 1, 1000, 1000, 1000, 30},  // 32 clusters of 2 x 2 needed, 30 fit: pairs
          {1, 1, 1000, 1000, 1000, 32},  // all 32 fit: 2 x 2
          {1, 1, 896, 1024, 1000, 30},   // 28 clusters: 2 x 2
          {1, 1, 896, 1024, 1000, 0},    // no cluster of 4 fits: pairs
          {0, 1, 64, 1000, 1000, 30},    // one tile row: no cluster
          {0, 1, 300, 120, 1000, 30},    // one tile column (B rows of 240 bytes): pairs
          {0, 3, 300, 200, 264, 30},     // batch 3: 9 clusters of 2 x 2
      };
      for (const auto& c : cases) {
        GemmArgs g{};
        g.a = g.b = g.c = buf;
        g.dtype = DType::kBFloat16;
        g.batch = c.batch; g.m = c.m; g.n = c.n; g.k = c.k;
        g.stride_am = c.k;
        g.b_k_major = c.lg != 0;
        g.stride_b_outer = c.lg ? c.k : c.n;
        int asked = 0;
        const auto quads = [&] { ++asked; return c.quads; };
        const auto choice = gemm_sm90::choose_tiles(g, c.lg != 0, 132, quads);
        printf("%d %d\n", static_cast<int>(choice), asked);
      }
      return 0;
    }
    """
)

# gemm_sm90::TileChoice in declaration order
K128x256, K128x256_PAIR, PP128x128, PP64x128, PP64x128_PAIR, PP64x128_QUAD, K128x128 = range(7)

TILES_EXPECTED = [
    (K128x256, 0),
    (PP128x128, 0),
    (K128x256, 0),
    (K128x256_PAIR, 0),
    (PP64x128, 0),
    (K128x128, 0),
    (PP64x128_PAIR, 1),
    (PP64x128_QUAD, 1),
    (PP64x128_QUAD, 1),
    (PP64x128_PAIR, 1),
    (PP64x128, 0),
    (PP64x128_PAIR, 0),  # n <= 128: the count is not asked for
    (PP64x128_QUAD, 1),
]


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_sm90_tile_choice(tmp_path: Path):
    """launch()'s config choice on 132 SMs; the cluster occupancy query is asked only where a
    2 x 2 cluster could be taken."""
    got = [tuple(int(v) for v in line.split()) for line in build_and_run(tmp_path, TILES_PROGRAM)]
    assert got == TILES_EXPECTED


GLU_TILES_PROGRAM = textwrap.dedent(
    r"""
    #include <cstdio>
    #include "linear_glu.cu"
    using namespace dualk;
    // (defined in matmul.cu, which this program does not link; the portable route never runs)
    cudaError_t gemm::launch_split_k_partials(const GemmArgs&, const gemm::SplitK&, cudaStream_t) {
      return cudaErrorInvalidValue;
    }
    int main() {
      const long cases[][2] = {  // rows, n
          {16, 11008}, {64, 11008}, {512, 11008}, {512, 14336}, {8192, 11008}, {8192, 14336},
          {256, 11008}, {300, 5640}, {1100, 3712}, {200, 640},
      };
      for (const auto& c : cases) printf("%d\n", static_cast<int>(glu::choose_tiles(c[0], c[1], 132)));
      return 0;
    }
    """
)
# linear_glu's Hopper tile on 132 SMs (0 wide 128 x (2 x 128), 1 mid 128 x (2 x 112), 2 narrow
# 128 x (2 x 32)): narrow at <= 64 rows and where wide tiles would not cover the SMs once; else
# the tile giving the busiest CTA fewer columns, wide on a tie.
GLU_TILES_EXPECTED = [
    2,  # 16 rows: decode
    2,  # 64 rows
    1,  # 344 wide tiles: 3 rounds x 128 columns; 396 mid: 3 x 112
    1,  # 448 wide: 4 x 128; 512 mid: 4 x 112
    0,  # 5504 wide: 42 x 128 = 5376; 6336 mid: 48 x 112 = 5376 (a tie)
    0,  # 7168 wide: 55 x 128 = 7040; 8192 mid: 63 x 112 = 7056
    1,  # 172 wide: 2 x 128; 198 mid: 2 x 112
    1,  # 135 wide: 2 x 128; 153 mid: 2 x 112
    0,  # 261 wide: 2 x 128 = 256; 306 mid: 3 x 112 = 336
    2,  # 10 wide tiles: fewer than the SMs
]


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_linear_glu_tile_choice(tmp_path: Path):
    got = [int(line) for line in build_and_run(tmp_path, GLU_TILES_PROGRAM)]
    assert got == GLU_TILES_EXPECTED


SKINNY_PROGRAM = textwrap.dedent(
    r"""
    #include <cstdio>
    #include "gemm_select.cuh"
    using namespace dualk;
    static char buf[1 << 12] __attribute__((aligned(256)));
    int main() {
      // dtype-free: simt_skinny_fits is asked for fp32 only; m n k batch, B k-major, A pointer
      // offset (floats), A row stride, B row stride
      const struct { long m, n, k, batch; bool kmaj; int a_off; long lda, ldb; } cases[] = {
          {32, 3072, 768, 1, true, 0, 768, 768},    // the default suite's row
          {33, 3072, 768, 1, true, 0, 768, 768},    // one row too many
          {1, 130, 260, 1, true, 0, 260, 260},      // decode, n % 4 != 0 (k-major B: fine)
          {8, 130, 260, 1, false, 0, 260, 130},     // B (k, n) with n % 4 != 0
          {8, 128, 258, 1, true, 0, 258, 258},      // k % 4 != 0
          {8, 128, 256, 1, true, 1, 256, 256},      // A 4 bytes off 16
          {8, 128, 256, 1, true, 0, 258, 256},      // A row stride not a multiple of 4
          {1, 128, 256, 1, true, 0, 258, 256},      // ... ignored for one row
          {8, 128, 1L << 30, 1, true, 0, 1L << 30, 1L << 30},  // k >= 2^30
          {32, 128, 64, 3, false, 0, 64, 128},      // batch
      };
      for (const auto& c : cases) {
        GemmArgs g{};
        g.a = reinterpret_cast<const float*>(buf) + c.a_off;
        g.b = g.c = buf;
        g.dtype = DType::kFloat32;
        g.m = c.m; g.n = c.n; g.k = c.k; g.batch = c.batch;
        g.stride_am = c.lda;
        g.b_k_major = c.kmaj;
        g.stride_b_outer = c.ldb;
        g.stride_a_batch = c.m * c.lda;
        g.stride_b_batch = c.k * c.n;
        g.stride_cm = c.n;
        printf("%d\n", gemm::simt_skinny_fits(g) ? 1 : 0);
      }
      return 0;
    }
    """
)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_skinny_kernel_eligibility(tmp_path: Path):
    """Which fp32 GEMMs launch_simt gives gemm_simt_skinny_kernel (simt_skinny_fits): at most 32
    rows and the wide kernel's 16-byte rows; the GPU tests check the outputs, this the choice."""
    fits = [int(line) for line in build_and_run(tmp_path, SKINNY_PROGRAM)]
    assert fits == [1, 0, 1, 0, 0, 0, 0, 1, 0, 1]
