// The library's fp32 SIMT GEMM (gemm::launch_simt: gemm_simt_wide_kernel where it fits, from
// cuda_src/gemm_simt_wide.cuh) against the previous kernel (gemm::launch_simt_fallback,
// gemm_simt_kernel) and cuBLAS SGEMM (CUBLAS_COMPUTE_32F; pedantic math for the checks, so no TF32
// anywhere). The rejected candidates (simt_v1, simt_v2, simt_v3 configs) are in git history only
// (NOTES-simt.md, "Rejected candidates", says how to bring them back into variants()). Build + run:
// bash experiments/simt_run.sh OUT
//   checks: odd shapes (m/n/k from 1, 7, 17, 129, 1000, 4097 and aligned tails), both B layouts,
//           batch 2 (one with a broadcast B), bias + gelu tanh against cuBLAS + a plain epilogue
//           kernel, k == 0. Output NaN-poisoned before every launch; inputs uniform in [-1, 1).
//   timing: median of event-timed runs, each after an L2 flush (256 MB memset).
#include <cublas_v2.h>

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
#define CB(x)                                                                            \
  do {                                                                                   \
    int s_ = static_cast<int>(x);                                                        \
    if (s_ != 0) {                                                                       \
      fprintf(stderr, "%s:%d %s: status %d\n", __FILE__, __LINE__, #x, s_);              \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

__global__ void fill_random(float* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed * 0x9E3779B9u ^ static_cast<uint32_t>(i >> 32);
    x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16;
    p[i] = static_cast<float>(x & 0xffffff) / 16777216.f * 2.f - 1.f;
  }
}
__global__ void fill_nan(float* p, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    p[i] = __int_as_float(0x7fc00000);
}
// The plain reference epilogue: c = gelu_tanh(c + bias[col]) over a dense (rows x n) matrix.
__global__ void bias_gelu(float* c, const float* bias, int64_t rows, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * n; i += (int64_t)gridDim.x * blockDim.x)
    c[i] = gelu_tanh(c[i] + (bias ? bias[i % n] : 0.f));
}

static uint32_t g_seed = 1;
static float* dalloc_random(int64_t n) {
  float* p;
  CK(cudaMalloc(&p, std::max<int64_t>(n, 1) * 4));
  fill_random<<<1024, 256>>>(p, n, g_seed++);
  CK(cudaGetLastError());
  return p;
}
static std::vector<float> to_host(const float* p, int64_t n) {
  std::vector<float> h(n);
  CK(cudaMemcpy(h.data(), p, n * 4, cudaMemcpyDeviceToHost));
  return h;
}

static void* g_flush;
constexpr size_t kFlushBytes = size_t{256} << 20;  // > H200's 60 MB L2

static float median_us(const std::function<void()>& fn, int reps) {
  for (int i = 0; i < 2; ++i) fn();
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

static cublasHandle_t g_cublas;

// Row-major C (batch x m x n) = A (m x k) @ B; B (k x n) row-major, or W (n x k) row-major when k-major.
static void cublas_sgemm(const GemmArgs& g) {
  const float one = 1.f, zero = 0.f;
  const cublasOperation_t opb = g.b_k_major ? CUBLAS_OP_T : CUBLAS_OP_N;
  CB(cublasGemmStridedBatchedEx(g_cublas, opb, CUBLAS_OP_N, (int)g.n, (int)g.m, (int)g.k, &one, g.b, CUDA_R_32F,
                                (int)g.stride_b_outer, g.stride_b_batch, g.a, CUDA_R_32F, (int)g.stride_am,
                                g.stride_a_batch, &zero, g.c, CUDA_R_32F, (int)g.stride_cm, g.stride_c_batch,
                                (int)g.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

struct Problem {
  int64_t batch, m, n, k;
  bool b_k_major, b_broadcast, gelu_bias;
};

struct Buffers {
  GemmArgs g{};
  float *a, *b, *bias = nullptr, *c, *ref;
  int64_t c_elems;
  explicit Buffers(const Problem& p) {
    g.batch = p.batch; g.m = p.m; g.n = p.n; g.k = p.k;
    g.stride_am = p.k; g.stride_a_batch = p.m * p.k;
    g.b_k_major = p.b_k_major;
    g.stride_b_outer = p.b_k_major ? p.k : p.n;
    g.stride_b_batch = p.b_broadcast ? 0 : p.k * p.n;
    g.stride_cm = p.n; g.stride_c_batch = p.m * p.n;
    g.dtype = DType::kFloat32;
    g.activation = p.gelu_bias ? Activation::kGeluTanh : Activation::kNone;
    g.allow_tf32 = false;
    a = dalloc_random(p.batch * p.m * p.k);
    b = dalloc_random((p.b_broadcast ? 1 : p.batch) * p.k * p.n);
    if (p.gelu_bias) bias = dalloc_random(p.n);
    c_elems = p.batch * p.m * p.n;
    CK(cudaMalloc(&c, std::max<int64_t>(c_elems, 1) * 4));
    CK(cudaMalloc(&ref, std::max<int64_t>(c_elems, 1) * 4));
    g.a = a; g.b = b; g.bias = bias; g.c = c;
  }
  ~Buffers() {
    cudaFree(a); cudaFree(b); if (bias) cudaFree(bias); cudaFree(c); cudaFree(ref);
  }
  void poison() { fill_nan<<<1024, 256>>>(c, c_elems); CK(cudaGetLastError()); }
  void reference() {
    GemmArgs r = g;
    r.c = ref;
    if (g.k == 0) CK(cudaMemset(ref, 0, c_elems * 4));  // cuBLAS rejects lda = 0
    else cublas_sgemm(r);
    if (g.activation == Activation::kGeluTanh) {
      bias_gelu<<<1024, 256>>>(ref, bias, g.batch * g.m, g.n);
      CK(cudaGetLastError());
    }
    CK(cudaDeviceSynchronize());
  }
};

// Max |x - ref| / max |ref|; any non-finite output is a failure (inf).
static double rel_err(const std::vector<float>& x, const std::vector<float>& ref, int64_t* first_bad) {
  double md = 0, mr = 1e-30;
  *first_bad = -1;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) { *first_bad = (int64_t)i; return INFINITY; }
    const double d = std::fabs((double)x[i] - ref[i]);
    if (d > md) { md = d; *first_bad = (int64_t)i; }
    mr = std::max(mr, (double)std::fabs(ref[i]));
  }
  return md / mr;
}

using Launch = cudaError_t (*)(const GemmArgs&, cudaStream_t);
struct Variant {
  const char* name;
  Launch plain, gelu_bias;
};
// Every gelu case of this harness has a bias, so only <kGeluTanh, true> is instantiated (build time).
#define VARIANT(label, fn)                                                                       \
  Variant {                                                                                      \
    label, [](const GemmArgs& g, cudaStream_t s) { return fn<float, Activation::kNone, false>(g, s); }, \
        [](const GemmArgs& g, cudaStream_t s) {                                                  \
          return g.bias ? fn<float, Activation::kGeluTanh, true>(g, s) : cudaErrorInvalidValue;  \
        }                                                                                        \
  }

// Runs 1-2 (NOTES-simt.md) compared simt_v1 / simt_v2 and the simt_v3 configs (now in git history);
// since Mid8Late moved into the library this checks and times the library path against the previous one.
static std::vector<Variant> variants() {
  return {
      VARIANT("launch_simt (wide kernel)", gemm::launch_simt),
      VARIANT("gemm_simt_kernel (fallback)", gemm::launch_simt_fallback),
  };
}

static int g_failures = 0;
constexpr double kTol = 1e-5;  // fp32, k <= 8192, entries in [-1, 1): observed ~1e-7

static void check(const Problem& p) {
  Buffers buf(p);
  buf.reference();
  const std::vector<float> ref = to_host(buf.ref, buf.c_elems);
  printf("check batch %ld m %ld n %ld k %ld B %s%s%s:", (long)p.batch, (long)p.m, (long)p.n, (long)p.k,
         p.b_k_major ? "k-major" : "n-major", p.b_broadcast ? " (bcast)" : "", p.gelu_bias ? " +bias gelu" : "");
  for (const Variant& v : variants()) {
    buf.poison();
    CK((p.gelu_bias ? v.gelu_bias : v.plain)(buf.g, 0));
    CK(cudaDeviceSynchronize());
    int64_t bad;
    const std::vector<float> out = to_host(buf.c, buf.c_elems);
    const double err = rel_err(out, ref, &bad);
    const bool ok = err <= kTol;
    printf("  %.1e%s", err, ok ? "" : " FAIL");
    if (!ok) {
      ++g_failures;
      const int64_t col = bad % p.n, row = (bad / p.n) % p.m, bt = bad / (p.m * p.n);
      printf(" [%s: first worst at b %ld r %ld c %ld: %g vs %g]", v.name, (long)bt, (long)row, (long)col,
             out[bad], ref[bad]);
    }
  }
  printf("\n");
  fflush(stdout);
}

struct Row {
  std::string label, variant;
  double us, tflops, ratio;
};
static std::vector<Row> g_rows;

static void timed(const char* label, const Problem& p, int reps) {
  Buffers buf(p);
  buf.reference();
  const std::vector<float> ref = to_host(buf.ref, buf.c_elems);
  const double flops = 2.0 * p.batch * p.m * p.n * p.k;
  GemmArgs r = buf.g;
  r.c = buf.ref;
  // cuBLAS reference time: SGEMM alone (the gelu + bias case adds nothing for cuBLAS, so its ratio
  // is a lower bound on cuBLAS + a separate epilogue).
  CB(cublasSetMathMode(g_cublas, CUBLAS_DEFAULT_MATH));
  const float ref_us = median_us([&] { cublas_sgemm(r); }, reps);
  CB(cublasSetMathMode(g_cublas, CUBLAS_PEDANTIC_MATH));
  g_rows.push_back({label, "cuBLAS SGEMM", ref_us, flops / ref_us * 1e-6, 1.0});
  printf("%s: cuBLAS %.1f us\n", label, ref_us);
  for (const Variant& v : variants()) {
    const Launch fn = p.gelu_bias ? v.gelu_bias : v.plain;
    buf.poison();
    CK(fn(buf.g, 0));
    CK(cudaDeviceSynchronize());
    int64_t bad;
    const double err = rel_err(to_host(buf.c, buf.c_elems), ref, &bad);
    if (err > kTol) ++g_failures;
    const float us = median_us([&] { CK(fn(buf.g, 0)); }, reps);
    printf("  %-28s %9.1f us  %6.2f TFLOP/s  %5.3fx cuBLAS  err %.1e%s\n", v.name, us, flops / us * 1e-6,
           ref_us / us, err, err > kTol ? " FAIL" : "");
    fflush(stdout);
    g_rows.push_back({label, v.name, us, flops / us * 1e-6, ref_us / us});
  }
}

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  printf("device %s, %d SMs, max SM clock %d MHz\n", prop.name, prop.multiProcessorCount, clock_khz / 1000);
  CB(cublasCreate(&g_cublas));
  CB(cublasSetMathMode(g_cublas, CUBLAS_PEDANTIC_MATH));  // checks: no TF32, no reduced precision
  CK(cudaMalloc(&g_flush, kFlushBytes));

  printf("== checks (rel err = max|out-ref|/max|ref| per variant, order as in the table; tol %.0e)\n", kTol);
  for (const Variant& v : variants()) printf("   %s\n", v.name);
  const int64_t sizes[] = {1, 7, 17, 129, 1000, 4097};
  // m x n x k over the size lists (k <= 1000 for the cube to stay quick), both layouts. k and n
  // (n-major B) multiples of 4 take the wide kernel (tails: k 4 / 132 leave 4 k in the last k tile
  // of 8; n 4 / 132 leave partial 128-wide tiles); k 7 and n 17 / 4097 with B n-major exercise the
  // fallback inside launch_simt.
  for (int64_t m : sizes)
    for (int64_t n : {int64_t{4}, int64_t{17}, int64_t{132}, int64_t{1000}, int64_t{4097}})
      for (int64_t k : {int64_t{4}, int64_t{132}, int64_t{1000}})
        for (bool km : {false, true})
          if (!quick || (m == 129 && k == 1000)) check({1, m, n, k, km, false, false});
  for (bool km : {false, true}) {
    check({1, 129, 1000, 7, km, false, false});
    check({1, 1000, 132, 129, km, false, false});
    check({1, 1, 17, 1, km, false, false});
  }
  // Aligned tails the fast paths take (k % 4 == 0; n % 4 == 0 for n-major B), deep k, batch.
  check({1, 4097, 1000, 132, false, false, false});
  check({1, 129, 4097, 4096, true, false, false});
  check({1, 300, 520, 4100, false, false, false});
  check({1, 520, 300, 4100, true, false, false});
  check({1, 1, 1000, 4096, true, false, false});
  check({1, 7, 4, 4097, false, false, false});
  check({2, 129, 1000, 1000, false, false, false});
  check({2, 129, 1000, 1000, true, false, false});
  check({2, 1000, 129, 1000, true, true, false});
  check({2, 300, 264, 200, false, true, false});
  // bias + gelu tanh
  check({1, 1000, 1000, 1000, true, false, true});
  check({1, 1000, 1000, 1000, false, false, true});
  check({2, 129, 1000, 132, false, false, true});
  check({1, 17, 129, 1000, true, false, true});
  check({1, 4097, 17, 17, true, false, true});
  check({1, 64, 96, 0, true, false, true});  // k == 0: gelu(bias)

  printf("== timed (median of %d, L2 flushed before each run)\n", quick ? 5 : 15);
  const int reps = quick ? 5 : 15;
  timed("fp32 4096^3 B n-major", {1, 4096, 4096, 4096, false, false, false}, reps);
  timed("fp32 4096^3 B k-major", {1, 4096, 4096, 4096, true, false, false}, reps);
  timed("fp32 8192^3 B n-major", {1, 8192, 8192, 8192, false, false, false}, quick ? 3 : 7);
  timed("fp32 gelu+bias 8192x3072 k768 k-major", {1, 8192, 3072, 768, true, false, true}, reps);
  timed("fp32 8192^3 B k-major", {1, 8192, 8192, 8192, true, false, false}, quick ? 3 : 7);
  timed("fp32 2048^3 B k-major", {1, 2048, 2048, 2048, true, false, false}, reps);
  timed("fp32 1000x4096 k4096 B k-major", {1, 1000, 4096, 4096, true, false, false}, reps);

  printf("\n== summary\n%-40s %-28s %10s %8s %7s\n", "case", "kernel", "us", "TFLOP/s", "x cuBLAS");
  for (const Row& r : g_rows)
    printf("%-40s %-28s %10.1f %8.2f %7.3f\n", r.label.c_str(), r.variant.c_str(), r.us, r.tflops, r.ratio);
  // Pivot: one line per kernel, x cuBLAS per case (cases in the order timed).
  std::vector<std::string> cases, kernels;
  for (const Row& r : g_rows) {
    if (std::find(cases.begin(), cases.end(), r.label) == cases.end()) cases.push_back(r.label);
    if (std::find(kernels.begin(), kernels.end(), r.variant) == kernels.end()) kernels.push_back(r.variant);
  }
  printf("\n== x cuBLAS (columns: ");
  for (size_t i = 0; i < cases.size(); ++i) printf("%s%s", i ? " | " : "", cases[i].c_str());
  printf(")\n");
  for (const std::string& kname : kernels) {
    printf("%-30s", kname.c_str());
    for (const std::string& cs : cases)
      for (const Row& r : g_rows)
        if (r.label == cs && r.variant == kname) printf(" %6.3f (%7.0f us)", r.ratio, r.us);
    printf("\n");
  }
  printf("failures: %d\n", g_failures);
  return g_failures ? 1 : 0;
}
