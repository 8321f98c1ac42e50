// The fp32 GEMM with few rows: gemm_simt_skinny_kernel (cuda_src/gemm_simt_skinny.cuh) against
// gemm_simt_wide_kernel and candidate kernels below (cand::skinny_cp_kernel: the skinny tile fed by
// a 3- or 4-stage cp.async pipeline, and its 16- and 8-row forms), each in one pass and over
// split-K slices of every count worth trying, and the library's own fp32 route (split_k_plan's
// count, launch_simt's kernel), on linear-layer shapes (B = W k-major, no bias, no activation).
// The questions it answers (NOTES-simt.md, session 38):
//   * up to which m the skinny kernel beats the wide one (the library takes it for m <= 32);
//   * whether split_k_plan's count (about 2 CTAs per SM, and one pass once 2 x tiles >= SMs) is
//     right for the skinny kernel, which fits 3 blocks per SM on 4x smaller tiles;
//   * whether more bytes in flight (the cp.async stages) lift the ~1 TB/s at 4096-wide k.
// No cuBLAS (the machines that build this without a GPU have no cuBLAS headers): PyTorch's times
// for the same shapes are experiments/fp32_skinny_probe.py's. Build + run on the GPU machine:
//   nvcc -O3 -std=c++17 -Icuda_src -gencode=arch=compute_90a,code=sm_90a \
//     experiments/skinny_bench.cu -o /tmp/skinny_bench && /tmp/skinny_bench [reps]
// (bench/gpu_session.sh step "skinnyh" does this). Every output is checked against a float64
// reference kernel (NaN-poisoned before each checked launch); times are medians of event-timed
// launches, each after a 256 MB memset (> L2). Written without a GPU (session 38): not run yet.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "gemm.cuh"

using namespace dualk;

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

__global__ void fill_uniform(float* p, int64_t n, uint32_t seed) {  // [-1, 1), a hash per index
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed * 0x9E3779B9u;
    x ^= x >> 16;
    x *= 0x7feb352d;
    x ^= x >> 15;
    x *= 0x846ca68b;
    x ^= x >> 16;
    p[i] = static_cast<float>(x & 0xffffff) / 16777216.f * 2.f - 1.f;
  }
}

__global__ void fill_nan(float* p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    p[i] = __int_as_float(0x7fc00000);
}

// C (m, n) = A (m, k) @ W (n, k)^T in float64, one output per thread.
__global__ void reference(const float* a, const float* w, double* c, int64_t m, int64_t n,
                          int64_t k) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= m * n) return;
  const int64_t row = i / n, col = i % n;
  double acc = 0.0;
  for (int64_t j = 0; j < k; ++j) acc += double(a[row * k + j]) * double(w[col * k + j]);
  c[i] = acc;
}

constexpr size_t kFlushBytes = size_t{256} << 20;
static void* g_flush;

static float median_us(const std::function<void()>& fn, int reps) {
  fn();
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> t(reps);
  for (int i = 0; i < reps; ++i) {
    CK(cudaMemsetAsync(g_flush, i & 0xff, kFlushBytes));
    CK(cudaEventRecord(e0));
    fn();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&t[i], e0, e1));
  }
  CK(cudaGetLastError());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(t.begin(), t.end());
  return t[reps / 2] * 1000.f;
}

using Launcher = cudaError_t (*)(const GemmArgs&, cudaStream_t);

// As launch_split_k_partials + run_split_k (gemm_select.cuh, matmul.cu), with the slices' kernel
// and the slice count chosen here: slices of a multiple of 32 k, the last one shorter (as
// split_k_plan cuts them for a given count).
static void run_split(Launcher kernel, const GemmArgs& g, int64_t splits, float* workspace) {
  if (splits <= 1) {
    CK(kernel(g, 0));
    return;
  }
  const int64_t slice = ceil_div(ceil_div(g.k, splits), int64_t{32}) * 32;
  const int64_t full = g.k / slice, tail = g.k - full * slice, used = full + (tail > 0);
  GemmArgs part = g;
  part.bias = nullptr;
  part.activation = Activation::kNone;
  part.workspace = nullptr;
  part.workspace_floats = 0;
  part.c = workspace;
  part.stride_cm = g.n;
  part.stride_c_batch = g.m * g.n;
  part.k = slice;
  part.batch = full;
  part.stride_a_batch = slice;
  part.stride_b_batch = slice;  // B k-major: the next slice of k
  if (full > 0) CK(kernel(part, 0));
  if (tail > 0) {
    part.batch = 1;
    part.k = tail;
    part.a = static_cast<const float*>(g.a) + full * slice;
    part.b = static_cast<const float*>(g.b) + full * slice;
    part.c = workspace + full * g.m * g.n;
    part.stride_a_batch = part.stride_b_batch = 0;
    CK(kernel(part, 0));
  }
  const int64_t blocks = std::min<int64_t>(ceil_div(g.m * g.n, int64_t{256}),
                                           int64_t{device_props().num_sms} * 8);
  gemm::split_k_reduce_kernel<float, Activation::kNone, false>
      <<<static_cast<unsigned>(blocks), 256>>>(workspace, used, g.m, g.n, nullptr,
                                               static_cast<float*>(g.c), g.stride_cm);
  CK(cudaGetLastError());
}

// ---- candidate: the same tile fed by a kStages-deep cp.async pipeline (B k-major only) ----
// The library's skinny kernel stages one k tile per CTA in registers: at 4096-wide k it moves ~1
// TB/s of weights, bound by the bytes each SM has in flight. Here kStages - 1 k tiles of 32 are in
// flight per CTA (kStages x 23 KB of shared memory with kBM = 32). Shared tiles stay k-contiguous
// (rows of 32 floats padded to 36), read as float4 along k: a thread owns rows lane/4 + 8 i and
// columns 32 w + lane%4 + 4 j, so each warp-wide read touches 8 consecutive A rows or 4
// consecutive B rows: 4 x (4 row + k) mod 32 covers distinct bank groups. Exact fp32: one fmaf
// per k in k order. kBM = 8 / 16 are the few-row forms (one / two rows per thread).
namespace cand {
constexpr int kBN = 128, kBK = 32, kThreads = 128, kStride = kBK + 4;

template <int kBM, int kStages> constexpr int smem_bytes() {
  return kStages * (kBM + kBN) * kStride * 4;
}

template <int kBM, int kStages>
__global__ void __launch_bounds__(kThreads) skinny_cp_kernel(const GemmArgs args) {
  constexpr int kTM = kBM / 8, kTN = 8;
  extern __shared__ __align__(16) float smem[];
  float* const s_a = smem;                                // [kStages][kBM][kStride]
  float* const s_b = smem + kStages * kBM * kStride;      // [kStages][kBN][kStride]
  const int64_t m = args.m, n = args.n;
  const int k = static_cast<int>(args.k);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t tiles_m = ceil_div(m, int64_t{kBM}), tiles_n = ceil_div(n, int64_t{kBN});
  const gemm::TileCoord coord = gemm::tile_coord(blockIdx.x, tiles_m, tiles_n);
  const int64_t m0 = coord.tile_m * kBM, n0 = coord.tile_n * kBN;
  const float* a = static_cast<const float*>(args.a) + coord.batch * args.stride_a_batch;
  const float* b = static_cast<const float*>(args.b) + coord.batch * args.stride_b_batch;

  // 16-byte chunks, 8 per 32-k row; k % 4 == 0, so a chunk is wholly inside or outside k.
  auto load_stage = [&](int stage, int kt) {
    const int k0 = kt * kBK;
    for (int idx = tid; idx < kBM * 8; idx += kThreads) {
      const int row = idx / 8, kc = k0 + (idx % 8) * 4;
      const bool ok = m0 + row < m && kc < k;
      cp_async_16(s_a + (stage * kBM + row) * kStride + (idx % 8) * 4,
                  ok ? a + (m0 + row) * args.stride_am + kc : a, ok ? 16 : 0);
    }
#pragma unroll
    for (int h = 0; h < kBN * 8 / kThreads; ++h) {
      const int idx = tid + kThreads * h, row = idx / 8, kc = k0 + (idx % 8) * 4;
      const bool ok = n0 + row < n && kc < k;
      cp_async_16(s_b + (stage * kBN + row) * kStride + (idx % 8) * 4,
                  ok ? b + (n0 + row) * args.stride_b_outer + kc : b, ok ? 16 : 0);
    }
  };

  float acc[kTM][kTN];
#pragma unroll
  for (int i = 0; i < kTM; ++i)
#pragma unroll
    for (int j = 0; j < kTN; ++j) acc[i][j] = 0.f;

  const int k_tiles = (k + kBK - 1) / kBK;
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < k_tiles) load_stage(st, st);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile kt landed for all; every thread is done with tile kt - 1's stage
    const int next = kt + kStages - 1;
    if (next < k_tiles) load_stage(next % kStages, next);
    cp_async_commit();
    const float* sa = s_a + (kt % kStages) * kBM * kStride + (lane / 4) * kStride;
    const float* sb = s_b + (kt % kStages) * kBN * kStride + (warp * 32 + lane % 4) * kStride;
#pragma unroll
    for (int k4 = 0; k4 < kBK / 4; ++k4) {
      float4 av[kTM], bv[kTN];
#pragma unroll
      for (int i = 0; i < kTM; ++i)
        av[i] = *reinterpret_cast<const float4*>(sa + 8 * i * kStride + 4 * k4);
#pragma unroll
      for (int j = 0; j < kTN; ++j)
        bv[j] = *reinterpret_cast<const float4*>(sb + 4 * j * kStride + 4 * k4);
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) {
          float x = acc[i][j];
          x = fmaf(av[i].x, bv[j].x, x);
          x = fmaf(av[i].y, bv[j].y, x);
          x = fmaf(av[i].z, bv[j].z, x);
          acc[i][j] = fmaf(av[i].w, bv[j].w, x);
        }
    }
  }
  cp_async_wait<0>();

  float* c = static_cast<float*>(args.c) + coord.batch * args.stride_c_batch;
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int64_t row = m0 + lane / 4 + 8 * i;
    if (row >= m) continue;
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      const int64_t col = n0 + warp * 32 + lane % 4 + 4 * j;
      if (col < n) c[row * args.stride_cm + col] = acc[i][j];
    }
  }
}

// Preconditions as the library's skinny kernel (16-byte rows, k < 2^30), and B k-major.
template <int kBM, int kStages>
cudaError_t launch(const GemmArgs& g, cudaStream_t stream) {
  if (!g.b_k_major) return cudaErrorInvalidValue;
  static const cudaError_t attr = cudaFuncSetAttribute(
      skinny_cp_kernel<kBM, kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      smem_bytes<kBM, kStages>());
  if (attr != cudaSuccess) return attr;
  const int64_t tiles = g.batch * ceil_div(g.m, int64_t{kBM}) * ceil_div(g.n, int64_t{kBN});
  skinny_cp_kernel<kBM, kStages>
      <<<static_cast<unsigned>(tiles), kThreads, smem_bytes<kBM, kStages>(), stream>>>(g);
  return cudaGetLastError();
}
}  // namespace cand

static cudaError_t library_simt(const GemmArgs& g, cudaStream_t s) {
  return gemm::launch_simt<float, Activation::kNone, false>(g, s);
}
static cudaError_t skinny(const GemmArgs& g, cudaStream_t s) {
  return gemm::launch_simt_skinny<Activation::kNone, false>(g, s);
}
static cudaError_t wide(const GemmArgs& g, cudaStream_t s) {
  return gemm::launch_simt_wide<Activation::kNone, false>(g, s);
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 30;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s, %d SMs; fp32 C (m, n) = A (m, k) @ W (n, k)^T, no bias; us = median of %d\n",
         prop.name, prop.multiProcessorCount, reps);
  CK(cudaMalloc(&g_flush, kFlushBytes));
  const int64_t rows[] = {1, 8, 16, 32, 33, 48, 64, 96, 128};
  const int64_t kn[][2] = {{768, 3072}, {4096, 4096}, {4096, 11008}, {11008, 4096}};
  const int64_t split_counts[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48};
  int failures = 0;
  struct Variant {
    const char* name;
    Launcher launch;
    int64_t max_m;  // timed up to this m (each computes any m correctly)
  };
  const Variant variants[] = {
      {"skinny", skinny, 1 << 30},         {"wide", wide, 1 << 30},
      {"cp32x3", cand::launch<32, 3>, 1 << 30}, {"cp32x4", cand::launch<32, 4>, 1 << 30},
      {"cp16x4", cand::launch<16, 4>, 16}, {"cp8x4", cand::launch<8, 4>, 8},
  };
  printf("per variant: best us over the split counts (that count), then its one-pass us\n");
  for (const auto& shape : kn) {
    const int64_t k = shape[0], n = shape[1];
    const int64_t m_max = rows[sizeof(rows) / sizeof(rows[0]) - 1];
    float *a, *w, *c, *workspace;
    double* ref;
    CK(cudaMalloc(&a, m_max * k * 4));
    CK(cudaMalloc(&w, n * k * 4));
    CK(cudaMalloc(&c, m_max * n * 4));
    CK(cudaMalloc(&ref, m_max * n * 8));
    CK(cudaMalloc(&workspace, 48 * m_max * n * 4));
    fill_uniform<<<1024, 256>>>(a, m_max * k, 1);
    fill_uniform<<<1024, 256>>>(w, n * k, 2);
    std::vector<float> h_c(m_max * n);
    std::vector<double> h_ref(m_max * n);
    for (int64_t m : rows) {
      GemmArgs g{};
      g.a = a;
      g.b = w;
      g.c = c;
      g.batch = 1;
      g.m = m;
      g.n = n;
      g.k = k;
      g.stride_am = k;
      g.b_k_major = true;
      g.stride_b_outer = k;
      g.stride_cm = n;
      g.stride_c_batch = m * n;
      g.dtype = DType::kFloat32;
      g.activation = Activation::kNone;
      reference<<<static_cast<unsigned>(ceil_div(m * n, int64_t{256})), 256>>>(a, w, ref, m,
                                                                                    n, k);
      CK(cudaMemcpy(h_ref.data(), ref, m * n * 8, cudaMemcpyDeviceToHost));
      double ref_max = 0.0;
      for (int64_t i = 0; i < m * n; ++i) ref_max = std::max(ref_max, std::fabs(h_ref[i]));
      // Checked once (outputs poisoned first), then timed.
      auto check = [&](const char* what, const std::function<void()>& fn) {
        fill_nan<<<1024, 256>>>(c, m * n);
        fn();
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(h_c.data(), c, m * n * 4, cudaMemcpyDeviceToHost));
        double err = 0.0;
        for (int64_t i = 0; i < m * n; ++i) {
          const double d = std::fabs(double(h_c[i]) - h_ref[i]);
          err = std::isnan(d) ? INFINITY : std::max(err, d);
        }
        if (!(err <= 1e-5 * ref_max)) {
          ++failures;
          printf("FAILED %s m=%lld k=%lld n=%lld: max err %.3g of max|ref| %.3g\n", what,
                 (long long)m, (long long)k, (long long)n, err, ref_max);
        }
      };
      // The library's route for fp32 (run_gemm_best without its 16-bit branches, so that this file
      // builds in seconds): split_k_plan's count, launch_simt's kernel.
      GemmArgs planned = g;
      planned.workspace = workspace;
      const int64_t lib_splits = gemm::split_k_plan(planned, device_props()).splits;
      auto run_library = [&] { run_split(library_simt, g, lib_splits, workspace); };
      check("library", run_library);
      const float t_lib = median_us(run_library, reps);
      printf("%4lld x %5lld -> %5lld  library %8.2f (%lld)", (long long)m, (long long)k,
             (long long)n, t_lib, (long long)lib_splits);
      float overall = INFINITY;
      const char* overall_name = "";
      for (const Variant& v : variants) {
        if (m > v.max_m) continue;
        float best = INFINITY, one_pass = 0.f;
        int64_t best_splits = 0;
        for (int64_t s : split_counts) {
          if (s > 1 && k / s < 64) continue;  // kSplitKMinSliceFp32
          auto run = [&] { run_split(v.launch, g, s, workspace); };
          check((std::string(v.name) + " splits " + std::to_string(s)).c_str(), run);
          const float t = median_us(run, reps);
          if (s == 1) one_pass = t;
          if (t < best) best = t, best_splits = s;
        }
        printf("  %s %.2f (%lld) 1-pass %.2f", v.name, best, (long long)best_splits, one_pass);
        if (best < overall) overall = best, overall_name = v.name;
      }
      printf("  | best %s, library / best %.2f\n", overall_name, t_lib / overall);
      fflush(stdout);
    }
    CK(cudaFree(a));
    CK(cudaFree(w));
    CK(cudaFree(c));
    CK(cudaFree(ref));
    CK(cudaFree(workspace));
  }
  printf("(best: us (slice count); 1 = one pass)\nfailures: %d\n", failures);
  return failures == 0 ? 0 : 1;
}
