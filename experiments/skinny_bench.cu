// The fp32 GEMM with few rows: gemm_simt_skinny_kernel (cuda_src/gemm_simt_skinny.cuh) against
// gemm_simt_wide_kernel, each in one pass and over split-K slices of every count worth trying, and
// the library's own route (run_gemm_best with its split plan), on linear-layer shapes (B = W
// k-major, no bias, no activation). The questions it answers (NOTES-simt.md, session 38):
//   * up to which m the skinny kernel beats the wide one (the library takes it for m <= 32);
//   * whether split_k_plan's count (about 2 CTAs per SM, and one pass once 2 x tiles >= SMs) is
//     right for the skinny kernel, which fits 3 blocks per SM on 4x smaller tiles.
// No cuBLAS (the machines that build this without a GPU have no cuBLAS headers): PyTorch's times
// for the same shapes are experiments/fp32_skinny_probe.py's. Build + run on the GPU machine:
//   nvcc -O3 -std=c++17 -Icuda_src -gencode=arch=compute_90a,code=sm_90a \
//     experiments/skinny_bench.cu -o /tmp/skinny_bench && /tmp/skinny_bench
// (bench/gpu_session.sh step "skinnyh" does this). Every output is checked against a float64
// reference kernel (NaN-poisoned before each checked launch); times are medians of event-timed
// launches, each after a 256 MB memset (> L2).
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
  printf("%-18s %13s %9s %16s %16s %9s %9s\n", "m x k -> n", "library", "lib/best", "skinny best",
         "wide best", "skinny 1", "wide 1");
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
      float best[2] = {INFINITY, INFINITY}, one_pass[2] = {0, 0};
      int64_t best_splits[2] = {0, 0};
      const Launcher kernels[2] = {skinny, wide};
      const char* names[2] = {"skinny", "wide"};
      for (int v = 0; v < 2; ++v) {
        for (int64_t s : split_counts) {
          if (s > 1 && k / s < 64) continue;  // kSplitKMinSliceFp32
          auto run = [&] { run_split(kernels[v], g, s, workspace); };
          check((std::string(names[v]) + " splits " + std::to_string(s)).c_str(), run);
          const float t = median_us(run, reps);
          if (s == 1) one_pass[v] = t;
          if (t < best[v]) best[v] = t, best_splits[v] = s;
        }
      }
      char sk[32], wd[32];
      snprintf(sk, sizeof sk, "%.2f (%lld)", best[0], (long long)best_splits[0]);
      snprintf(wd, sizeof wd, "%.2f (%lld)", best[1], (long long)best_splits[1]);
      char lb[32];
      snprintf(lb, sizeof lb, "%.2f (%lld)", t_lib, (long long)lib_splits);
      printf("%4lld x %5lld -> %5lld %13s %9.2f %16s %16s %9.2f %9.2f\n", (long long)m,
             (long long)k, (long long)n, lb, t_lib / std::min(best[0], best[1]), sk, wd,
             one_pass[0], one_pass[1]);
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
