// Standalone harness for the Hopper GEMM (cuda_src/gemm_sm90.cuh) against cuBLAS / cuBLASLt and the
// mma.sync path of cuda_src/gemm_mma.cuh, no torch. Build and run on an H200 / H100:
//   bash experiments/gemm_sm90_run.sh OUT_DIR
// or by hand:
//   nvcc -O3 -std=c++17 -Icuda_src -gencode=arch=compute_90a,code=sm_90a
//        experiments/gemm_sm90_bench.cu -lcublas -lcublasLt -o /tmp/g90 && /tmp/g90 [--quick]
//
// Correctness: every checked launch writes into a NaN-poisoned C; inputs are uniform in [-1, 1).
// Reference = cuBLAS with fp32 output (fp32 compute, no TF32), then bias + activation in fp32 with
// the same common.cuh functions the kernels use. Error = max|out - ref| / max|ref|; the gate is
// 1.5 half-ulps of the output type at max|ref| (bf16 1.5 * 2^-8, fp16 1.5 * 2^-11): rounding the
// exact result to T already costs up to one half-ulp, and any layout / pipeline bug costs O(1).
// cuBLAS's own 16-bit output is scored the same way where it is timed ("cuBLAS err").
// Timing: median of event-timed runs, each after an L2 flush (a 256 MB memset outside the events).
#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "gemm.cuh"
#include "gemm_sm90.cuh"

using namespace dualk;
using bf16 = __nv_bfloat16;

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)
#define CB(x)                                                                 \
  do {                                                                        \
    int s_ = static_cast<int>(x);                                             \
    if (s_ != 0) {                                                            \
      fprintf(stderr, "%s:%d %s: status %d\n", __FILE__, __LINE__, #x, s_);   \
      exit(1);                                                                \
    }                                                                         \
  } while (0)

// ---------------------------------------------------------------- device helpers
template <typename T>
__global__ void fill_random(T* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed * 0x9E3779B9u ^ static_cast<uint32_t>(i >> 32);
    x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16;
    p[i] = from_float<T>(static_cast<float>(x & 0xffffff) / 16777216.f * 2.f - 1.f);
  }
}
template <typename T>
__global__ void fill_nan(T* p, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    p[i] = from_float<T>(__int_as_float(0x7fc00000));
}
template <typename T>
__global__ void to_f32(const T* p, float* q, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    q[i] = to_float<T>(p[i]);
}
// ref[b][r][c] = act(acc + bias[c]) in fp32, in place over a dense (rows x n) fp32 matrix.
template <typename T, Activation kAct>
__global__ void bias_act_f32(float* acc, const T* bias, int64_t total, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    float v = acc[i];
    if (bias) v += to_float<T>(bias[i % n]);
    acc[i] = apply_activation<kAct>(v);
  }
}

static uint32_t g_seed = 1;
template <typename T>
T* dalloc_random(int64_t n) {
  T* p;
  CK(cudaMalloc(&p, std::max<int64_t>(n, 1) * sizeof(T)));
  fill_random<T><<<1024, 256>>>(p, n, g_seed++);
  CK(cudaGetLastError());
  return p;
}
template <typename T>
std::vector<float> to_host(const T* p, int64_t n) {
  std::vector<float> h(n);
  if constexpr (std::is_same_v<T, float>) {
    CK(cudaMemcpy(h.data(), p, n * 4, cudaMemcpyDeviceToHost));
  } else {
    float* f;
    CK(cudaMalloc(&f, std::max<int64_t>(n, 1) * 4));
    to_f32<T><<<1024, 256>>>(p, f, n);
    CK(cudaGetLastError());
    CK(cudaMemcpy(h.data(), f, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaFree(f));
  }
  return h;
}

static void* g_flush;
constexpr size_t kFlushBytes = size_t{256} << 20;  // > 2x the 50 MB L2 (H100) / 60 MB (H200)

static float median_us(const std::function<void()>& fn, int reps) {
  for (int i = 0; i < 3; ++i) fn();
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> start(reps), stop(reps);
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventCreate(&start[i]));
    CK(cudaEventCreate(&stop[i]));
  }
  for (int i = 0; i < reps; ++i) {
    CK(cudaMemsetAsync(g_flush, i & 0xff, kFlushBytes));
    CK(cudaEventRecord(start[i]));
    fn();
    CK(cudaEventRecord(stop[i]));
  }
  CK(cudaDeviceSynchronize());
  CK(cudaGetLastError());
  std::vector<float> t(reps);
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventElapsedTime(&t[i], start[i], stop[i]));
    CK(cudaEventDestroy(start[i]));
    CK(cudaEventDestroy(stop[i]));
  }
  std::sort(t.begin(), t.end());
  return t[reps / 2] * 1000.f;
}

// Max |x - ref| over max |ref| on the logical (batch, m, n) elements of a C with row stride ldc;
// NaN anywhere (an unwritten element) counts as failure (inf). Also returns the first bad index.
static double rel_err(const std::vector<float>& x, const std::vector<float>& ref, int64_t batch, int64_t m,
                      int64_t n, int64_t ldc, double tol, std::string* first_bad) {
  double md = 0, mr = 1e-30;
  for (float r : ref) mr = std::max(mr, (double)std::fabs(r));
  bool bad_seen = false;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const float v = x[(b * m + i) * ldc + j];
        const float r = ref[(b * m + i) * n + j];
        const double d = std::isfinite(v) ? std::fabs((double)v - r) : INFINITY;
        if (!bad_seen && d > tol * mr) {
          bad_seen = true;
          char buf[160];
          snprintf(buf, sizeof buf, "first bad (b %ld, row %ld, col %ld): got %g want %g", (long)b, (long)i,
                   (long)j, v, r);
          *first_bad = buf;
        }
        md = std::max(md, d);
      }
  return md / mr;
}

template <typename T> constexpr cudaDataType cuda_type();
template <> constexpr cudaDataType cuda_type<float>() { return CUDA_R_32F; }
template <> constexpr cudaDataType cuda_type<__half>() { return CUDA_R_16F; }
template <> constexpr cudaDataType cuda_type<bf16>() { return CUDA_R_16BF; }
template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<__half>() { return DType::kFloat16; }
template <> constexpr DType dtype_of<bf16>() { return DType::kBFloat16; }
template <typename T> const char* tname();
template <> const char* tname<__half>() { return "fp16"; }
template <> const char* tname<bf16>() { return "bf16"; }
template <typename T> double tol_of() { return std::is_same_v<T, bf16> ? 1.5 / 256 : 1.5 / 2048; }
static const char* act_name(Activation a) {
  return a == Activation::kNone       ? "none"
         : a == Activation::kRelu     ? "relu"
         : a == Activation::kGeluTanh ? "gelu_tanh"
                                      : "gelu_erf";
}

static cublasHandle_t g_cublas;
static cublasLtHandle_t g_lt;
static void* g_lt_ws;
constexpr size_t kLtWs = 64 << 20;

// Row-major C (batch x m x n, row stride ldc) = A @ B via cuBLAS's column-major C^T = B^T A^T.
// TC is the output type (T for timing cuBLAS, float for the reference).
template <typename T, typename TC>
void cublas_gemm(const GemmArgs& g, TC* c, int64_t ldc, int64_t c_batch_stride) {
  const float one = 1.f, zero = 0.f;
  const cublasOperation_t opb = g.b_k_major ? CUBLAS_OP_T : CUBLAS_OP_N;
  CB(cublasGemmStridedBatchedEx(g_cublas, opb, CUBLAS_OP_N, (int)g.n, (int)g.m, (int)g.k, &one, g.b, cuda_type<T>(),
                                (int)g.stride_b_outer, g.stride_b_batch, g.a, cuda_type<T>(), (int)g.stride_am,
                                g.stride_a_batch, &zero, c, cuda_type<TC>(), (int)ldc, c_batch_stride, (int)g.batch,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// cuBLASLt gelu_tanh(A @ W^T + bias) (GELU_BIAS epilogue), batch 1, k-major B.
struct LtGelu {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulAlgo_t algo;
  bool ok = false;
};
template <typename T>
LtGelu lt_gelu_plan(const GemmArgs& g) {
  LtGelu p;
  CB(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CB(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CB(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_GELU_BIAS;
  CB(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  CB(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
  CB(cublasLtMatrixLayoutCreate(&p.la, cuda_type<T>(), g.k, g.n, g.stride_b_outer));
  CB(cublasLtMatrixLayoutCreate(&p.lb, cuda_type<T>(), g.k, g.m, g.stride_am));
  CB(cublasLtMatrixLayoutCreate(&p.lc, cuda_type<T>(), g.n, g.m, g.stride_cm));
  cublasLtMatmulPreference_t pref;
  CB(cublasLtMatmulPreferenceCreate(&pref));
  CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kLtWs, sizeof(kLtWs)));
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  if (cublasLtMatmulAlgoGetHeuristic(g_lt, p.op, p.la, p.lb, p.lc, p.lc, pref, 1, &res, &found) == 0 && found > 0) {
    p.algo = res.algo;
    p.ok = true;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  return p;
}
template <typename T>
void lt_gelu_run(const LtGelu& p, const GemmArgs& g) {
  const float one = 1.f, zero = 0.f;
  CB(cublasLtMatmul(g_lt, p.op, &one, g.b, p.la, g.a, p.lb, &zero, g.c, p.lc, g.c, p.lc, &p.algo, g_lt_ws, kLtWs, 0));
}

// ---------------------------------------------------------------- problems and buffers
struct Problem {
  int64_t batch, m, n, k;
  bool b_k_major;
  bool b_broadcast;  // batch stride 0 for B
  Activation act;
  bool bias;
  int64_t c_pad = 0;  // extra elements per C row (odd: C pairs not 4-byte aligned)
};

static int64_t round8(int64_t x) { return (x + 7) / 8 * 8; }

// Operand rows padded to multiples of 8 elements (16 bytes, the TMA stride rule), so odd k and
// (for n-major B) odd n are reachable.
template <typename T>
struct Buffers {
  Problem p;
  GemmArgs g{};
  T *a, *b, *bias, *c;
  float* ref;  // dense (batch, m, n) fp32
  int64_t c_elems, ref_elems;
  explicit Buffers(const Problem& pr) : p(pr) {
    const int64_t lda = round8(p.k);
    const int64_t ldb = round8(p.b_k_major ? p.k : p.n);
    const int64_t b_rows = p.b_k_major ? p.n : p.k;
    const int64_t ldc = p.n + p.c_pad;
    g.batch = p.batch; g.m = p.m; g.n = p.n; g.k = p.k;
    g.stride_am = lda; g.stride_a_batch = p.m * lda;
    g.b_k_major = p.b_k_major;
    g.stride_b_outer = ldb;
    g.stride_b_batch = p.b_broadcast ? 0 : b_rows * ldb;
    g.stride_cm = ldc; g.stride_c_batch = p.m * ldc;
    g.dtype = dtype_of<T>();
    g.activation = p.act;
    g.allow_tf32 = false;
    a = dalloc_random<T>(p.batch * p.m * lda);
    b = dalloc_random<T>((p.b_broadcast ? 1 : p.batch) * b_rows * ldb);
    bias = p.bias ? dalloc_random<T>(p.n) : nullptr;
    c_elems = p.batch * p.m * ldc;
    ref_elems = p.batch * p.m * p.n;
    CK(cudaMalloc(&c, std::max<int64_t>(c_elems, 1) * sizeof(T)));
    CK(cudaMalloc(&ref, std::max<int64_t>(ref_elems, 1) * sizeof(float)));
    g.a = a; g.b = b; g.bias = bias; g.c = c;
  }
  ~Buffers() {
    cudaFree(a); cudaFree(b); if (bias) cudaFree(bias); cudaFree(c); cudaFree(ref);
  }
  void poison() {
    fill_nan<T><<<1024, 256>>>(c, c_elems);
    CK(cudaGetLastError());
  }
  std::vector<float> reference() {
    cublas_gemm<T, float>(g, ref, p.n, p.m * p.n);
    if (p.act != Activation::kNone || p.bias) {
      if (p.act == Activation::kNone) bias_act_f32<T, Activation::kNone><<<1024, 256>>>(ref, bias, ref_elems, p.n);
      if (p.act == Activation::kRelu) bias_act_f32<T, Activation::kRelu><<<1024, 256>>>(ref, bias, ref_elems, p.n);
      if (p.act == Activation::kGeluTanh) bias_act_f32<T, Activation::kGeluTanh><<<1024, 256>>>(ref, bias, ref_elems, p.n);
      if (p.act == Activation::kGeluErf) bias_act_f32<T, Activation::kGeluErf><<<1024, 256>>>(ref, bias, ref_elems, p.n);
      CK(cudaGetLastError());
    }
    CK(cudaDeviceSynchronize());
    return to_host(ref, ref_elems);
  }
};

// ---------------------------------------------------------------- variants
using Launch = std::function<cudaError_t(const GemmArgs&)>;
struct Variant {
  std::string name;
  Launch fn;
};

// The production entry point with run-time activation / bias, as the integration will call it.
template <typename T>
cudaError_t sm90_production(const GemmArgs& g) {
  const bool bias = g.bias != nullptr;
  switch (g.activation) {
    case Activation::kNone:
      return bias ? gemm_sm90::launch<T, Activation::kNone, true>(g, 0) : gemm_sm90::launch<T, Activation::kNone, false>(g, 0);
    case Activation::kGeluTanh:
      return bias ? gemm_sm90::launch<T, Activation::kGeluTanh, true>(g, 0)
                  : gemm_sm90::launch<T, Activation::kGeluTanh, false>(g, 0);
    case Activation::kRelu:
      return bias ? gemm_sm90::launch<T, Activation::kRelu, true>(g, 0) : gemm_sm90::launch<T, Activation::kRelu, false>(g, 0);
    case Activation::kGeluErf:
      return bias ? gemm_sm90::launch<T, Activation::kGeluErf, true>(g, 0)
                  : gemm_sm90::launch<T, Activation::kGeluErf, false>(g, 0);
    default:
      return cudaErrorInvalidValue;
  }
}

// One explicit tile config (both B layouts), for (none, no bias) or (gelu_tanh, bias) problems.
template <typename T, typename Cfg>
Variant sm90_config(const char* name) {
  return {name, [](const GemmArgs& g) -> cudaError_t {
            if (!gemm_sm90::can_run(g)) return cudaErrorInvalidValue;
            const bool gelu = g.activation == Activation::kGeluTanh;
            if (!gelu && (g.activation != Activation::kNone || g.bias)) return cudaErrorInvalidValue;
            if (gelu && !g.bias) return cudaErrorInvalidValue;
            using namespace gemm_sm90::detail;
            if (g.b_k_major)
              return gelu ? launch_config<T, Cfg, true, Activation::kGeluTanh, true>(g, 0)
                          : launch_config<T, Cfg, true, Activation::kNone, false>(g, 0);
            return gelu ? launch_config<T, Cfg, false, Activation::kGeluTanh, true>(g, 0)
                        : launch_config<T, Cfg, false, Activation::kNone, false>(g, 0);
          }};
}


template <typename T>
std::vector<Variant> config_variants() {
  using namespace gemm_sm90;
  return {
      sm90_config<T, Tile128x256>("sm90 128x256 s4"),
      sm90_config<T, Tile256x128>("sm90 256x128 s4"),
      sm90_config<T, Tile128x128>("sm90 128x128 s6"),
      sm90_config<T, PingPong128x128>("pp 128x128 s6"),
      sm90_config<T, PingPong64x256>("pp 64x256 s5"),
      sm90_config<T, Tile128x256Tma>("tma 128x256 s3"),
      sm90_config<T, Tile256x128Tma>("tma 256x128 s3"),
      sm90_config<T, Tile128x128Tma>("tma 128x128 s5"),
      sm90_config<T, PingPong128x128Tma>("tma pp 128x128 s4"),
      sm90_config<T, PingPong64x256Tma>("tma pp 64x256 s3"),
      sm90_config<T, PingPong64x128Tma>("tma pp 64x128 s6"),
      sm90_config<T, Tile128x256TmaC2>("pair tma 128x256 s3"),
      sm90_config<T, Tile128x128TmaC2>("pair tma 128x128 s5"),
      sm90_config<T, PingPong128x128TmaC2>("pair tma pp 128x128 s4"),
      sm90_config<T, PingPong64x128TmaC2>("pair tma pp 64x128 s6"),
      sm90_config<T, PingPong64x128TmaC4>("quad tma pp 64x128 s6"),
      sm90_config<T, PingPong64x128TmaS8>("tma pp 64x128 s8"),
      sm90_config<T, PingPong64x128TmaC2S8>("pair tma pp 64x128 s8"),
      sm90_config<T, PingPong64x128TmaC4S8>("quad tma pp 64x128 s8"),
      sm90_config<T, Tile128x64Tma>("tma 128x64 s8"),
      sm90_config<T, Tile128x64TmaPairN>("pairN tma 128x64 s8"),
      sm90_config<T, PingPong64x192Tma>("tma pp 64x192 s5"),
      sm90_config<T, PingPong64x192TmaC4>("quad tma pp 64x192 s5"),
  };
}


// The existing mma.sync path (gemm.cuh) at its own heuristic, for (none) and (gelu_tanh, bias).
static Variant mma_sync_variant() {
  return {"mma.sync gemm.cuh", [](const GemmArgs& g) -> cudaError_t {
            if (g.activation == Activation::kGeluTanh)
              return g.bias ? gemm::run_gemm<Activation::kGeluTanh, true>(g, 0)
                            : gemm::run_gemm<Activation::kGeluTanh, false>(g, 0);
            return gemm::run_gemm<Activation::kNone, false>(g, 0);
          }};
}

// ---------------------------------------------------------------- cases
static int g_checked = 0, g_failures = 0;
struct Row {
  std::string label, variant;
  double us, tflops, vs_ref, err;
};
static std::vector<Row> g_summary;

template <typename T>
std::string describe(const Problem& p) {
  char buf[200];
  snprintf(buf, sizeof buf, "%s b%ld m%ld n%ld k%ld B %s%s act %s%s%s", tname<T>(), (long)p.batch, (long)p.m,
           (long)p.n, (long)p.k, p.b_k_major ? "k-major" : "n-major", p.b_broadcast ? " (bcast)" : "",
           act_name(p.act), p.bias ? " +bias" : "", p.c_pad ? " ldc+pad" : "");
  return buf;
}

// Checks each variant (poisoned C) against the fp32 reference; times them when reps > 0.
template <typename T>
void run_case(const char* label, const Problem& p, const std::vector<Variant>& variants, int reps,
              bool verbose = true) {
  Buffers<T> buf(p);
  const std::vector<float> ref = buf.reference();
  const double flops = 2.0 * p.batch * p.m * p.n * p.k;
  const double tol = tol_of<T>();
  float ref_us = 0.f;
  if (reps > 0) {
    // The vendor reference: cuBLASLt GELU_BIAS for gelu_tanh + bias (batch 1, k-major), else cuBLAS.
    std::function<void()> fn;
    LtGelu lt;
    const bool use_lt = p.act == Activation::kGeluTanh && p.bias && p.batch == 1 && p.b_k_major;
    if (use_lt) {
      lt = lt_gelu_plan<T>(buf.g);
      if (!lt.ok) printf("  cuBLASLt GELU_BIAS: no algorithm\n");
    }
    if (use_lt && lt.ok) fn = [&] { lt_gelu_run<T>(lt, buf.g); };
    else fn = [&] { cublas_gemm<T, T>(buf.g, buf.c, buf.g.stride_cm, buf.g.stride_c_batch); };
    buf.poison();
    fn();
    CK(cudaDeviceSynchronize());
    std::string bad;
    const double err = rel_err(to_host(buf.c, buf.c_elems), ref, p.batch, p.m, p.n, buf.g.stride_cm, tol, &bad);
    ref_us = median_us(fn, reps);
    const char* rname = use_lt && lt.ok ? "cuBLASLt GELU_BIAS" : (use_lt ? "cuBLAS (no act)" : "cuBLAS");
    printf("%s: %s\n  %-26s %9.1f us %7.1f TFLOP/s  1.00x       err %.2e (vendor, for scale)\n", label,
           describe<T>(p).c_str(), rname, ref_us, flops / ref_us * 1e-6, err);
    g_summary.push_back({label, rname, ref_us, flops / ref_us * 1e-6, 1.0, err});
  } else if (verbose) {
    printf("%s: %s\n", label, describe<T>(p).c_str());
  }
  for (const Variant& v : variants) {
    buf.poison();
    const cudaError_t launch_err = v.fn(buf.g);
    CK(cudaDeviceSynchronize());
    ++g_checked;
    if (launch_err != cudaSuccess) {
      printf("  %-26s launch error: %s  FAIL\n", v.name.c_str(), cudaGetErrorString(launch_err));
      ++g_failures;
      continue;
    }
    std::string bad;
    const double err = rel_err(to_host(buf.c, buf.c_elems), ref, p.batch, p.m, p.n, buf.g.stride_cm, tol, &bad);
    const bool ok = err <= tol;
    if (!ok) ++g_failures;
    if (reps > 0) {
      const float us = median_us([&] { CK(v.fn(buf.g)); }, reps);
      printf("  %-26s %9.1f us %7.1f TFLOP/s  %5.2fx ref  err %.2e %s %s\n", v.name.c_str(), us, flops / us * 1e-6,
             ref_us / us, err, ok ? "ok" : "FAIL", bad.c_str());
      g_summary.push_back({label, v.name, us, flops / us * 1e-6, ref_us / us, err});
    } else if (verbose || !ok) {
      if (!verbose) printf("%s: %s\n", label, describe<T>(p).c_str());
      printf("  %-26s err %.2e %s %s\n", v.name.c_str(), err, ok ? "ok" : "FAIL", bad.c_str());
    }
    fflush(stdout);
  }
}

template <typename T>
void correctness_sweep(bool quick) {
  const std::vector<Variant> prod = {{"sm90 launch", sm90_production<T>}};
  struct Shape {
    int64_t batch, m, n, k;
    bool bcast;
    int64_t c_pad;
  };
  std::vector<Shape> shapes = {
      {1, 1, 17, 1, false, 0},       {1, 17, 1000, 4097, false, 0}, {1, 1000, 4097, 17, false, 0},
      {1, 4097, 1, 1000, false, 0},  {1, 257, 129, 4096, false, 0}, {3, 300, 264, 200, false, 0},
      {3, 300, 264, 200, true, 0},   {2, 129, 513, 72, true, 1},    {1, 8, 4096, 4096, false, 0},
      {1, 1000, 1000, 1000, false, 1}, {1, 128, 256, 64, false, 0}, {1, 1024, 768, 520, false, 0},
  };
  if (quick) shapes.resize(6);
  const std::pair<Activation, bool> epilogues[] = {
      {Activation::kNone, false},     {Activation::kNone, true},     {Activation::kGeluTanh, true},
      {Activation::kGeluTanh, false}, {Activation::kGeluErf, true},  {Activation::kGeluErf, false},
  };
  const int before = g_failures, checked = g_checked;
  for (const Shape& s : shapes) {
    // Progress (a hang shows which shape): failures print their own lines below this one.
    printf("check %s b%ld m%ld n%ld k%ld%s%s\n", tname<T>(), (long)s.batch, (long)s.m, (long)s.n, (long)s.k,
           s.bcast ? " bcast-B" : "", s.c_pad ? " ldc+pad" : "");
    fflush(stdout);
    for (bool kmaj : {true, false})
      for (auto [act, bias] : epilogues)
        run_case<T>("check", {s.batch, s.m, s.n, s.k, kmaj, s.bcast, act, bias, s.c_pad}, prod, 0, false);
  }
  // Every tile config on a few shapes (odd edges, batch + broadcast, both epilogues).
  const std::vector<Variant> configs = config_variants<T>();
  // 1000^3 and 1000 x 4097 x 17 give ping-pong CTAs several tiles of both consumers (k 1 to 16
  // tiles per tile: the order barriers and ring positions across skipped tiles).
  const Shape config_shapes[] = {{1, 1000, 1000, 1000, false, 0}, {3, 300, 264, 200, true, 1},
                                 {1, 17, 1000, 4097, false, 0},   {1, 1000, 4097, 17, false, 0},
                                 {1, 2048, 2048, 520, false, 0},  {2, 1100, 904, 130, false, 0}};
  printf("check %s: every tile config\n", tname<T>());
  fflush(stdout);
  for (const Shape& s : config_shapes)
    for (bool kmaj : {true, false})
      for (auto [act, bias] : {std::pair{Activation::kNone, false}, std::pair{Activation::kGeluTanh, true}})
        run_case<T>("check", {s.batch, s.m, s.n, s.k, kmaj, s.bcast, act, bias, s.c_pad}, configs, 0, false);
  printf("%s correctness: %d launches checked, %d failed\n", tname<T>(), g_checked - checked, g_failures - before);
  fflush(stdout);
}

template <typename T>
std::vector<Variant> timed_variants(bool sweep) {
  std::vector<Variant> v = {{"sm90 launch", sm90_production<T>}};
  if (sweep)
    for (auto& c : config_variants<T>()) v.push_back(c);
  v.push_back(mma_sync_variant());
  return v;
}

int main(int argc, char** argv) {
  // --quick: fewer shapes; --epilogue: the linear_gelu cases only (every config, with and without
  // the bias + gelu epilogue on the same operands), after the quick correctness sweep.
  const bool epilogue_only = argc > 1 && std::string(argv[1]) == "--epilogue";
  const bool quick = argc > 1 && (std::string(argv[1]) == "--quick" || epilogue_only);
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device %s (cc %d.%d), %d SMs, %d KB smem/block opt-in, L2 %d MB\n", prop.name, prop.major, prop.minor,
         prop.multiProcessorCount, (int)(prop.sharedMemPerBlockOptin / 1024), prop.l2CacheSize >> 20);
  CB(cublasCreate(&g_cublas));
  CB(cublasSetMathMode(g_cublas, CUBLAS_DEFAULT_MATH));
  CB(cublasLtCreate(&g_lt));
  CK(cudaMalloc(&g_lt_ws, kLtWs));
  CK(cudaMalloc(&g_flush, kFlushBytes));
  {
    GemmArgs probe{};
    probe.batch = 1; probe.m = probe.n = probe.k = 64; probe.stride_am = probe.stride_b_outer = probe.stride_cm = 64;
    probe.a = probe.b = probe.c = g_flush;
    probe.dtype = DType::kBFloat16;
    printf("gemm_sm90::can_run on this device: %s\n", gemm_sm90::can_run(probe) ? "yes" : "NO");
    if (!gemm_sm90::can_run(probe)) return 1;
  }

  printf("== correctness (production launch: 6 epilogues x 2 B layouts per shape; then every tile config)\n");
  correctness_sweep<bf16>(quick);
  correctness_sweep<__half>(quick);

  {  // How many clusters fit at once (the cluster configs' persistent grids): GPCs hold whole
     // clusters and may strand SMs, so fewer 2 x 2 clusters may fit than SMs / 4.
    using namespace gemm_sm90;
    const int pairs = detail::resident_clusters<bf16, Tile128x256TmaC2, false, Activation::kNone, false>();
    const int quads = detail::resident_clusters<bf16, PingPong64x128TmaC4, true, Activation::kGeluTanh, true>();
    printf("CTA pairs resident at once (%d KB smem per CTA): %d of %d SMs\n", Tile128x256TmaC2::kSmemBytes / 1024,
           pairs, prop.multiProcessorCount);
    printf("2 x 2 clusters resident at once (%d KB smem per CTA): %d (%d SMs) of %d SMs\n",
           PingPong64x128TmaC4::kSmemBytes / 1024, quads, 4 * quads, prop.multiProcessorCount);
  }
  printf("== timed (median of %d, L2 flushed before each run)\n", quick ? 10 : 20);
  const int reps = quick && !epilogue_only ? 10 : 20;
  const auto kNone = Activation::kNone, kGelu = Activation::kGeluTanh;
  if (epilogue_only) {
    // 896 x 1024: 28 clusters of 2 x 2 64 x 128 tiles, one wave on an H100 (30 resident).
    // 600 x 1256: the registry's linear_gelu sm90_rows_16b_off (2 x 2 clusters in launch()).
    const int64_t shapes[][3] = {{1000, 1000, 1000}, {896, 1024, 1000}, {600, 1256, 1000},
                                 {8192, 3072, 768},  {4096, 16384, 4096}};  // m, n, k
    const std::vector<Variant> launch_only = {{"sm90 launch", sm90_production<bf16>}};
    for (const auto& mnk : shapes) {
      char label[96];
      snprintf(label, sizeof label, "linear_gelu bf16 %ldx%ldx%ld", (long)mnk[0], (long)mnk[2], (long)mnk[1]);
      run_case<bf16>(label, {1, mnk[0], mnk[1], mnk[2], true, false, kGelu, true}, timed_variants<bf16>(true), reps);
      snprintf(label, sizeof label, "x @ W^T bf16 %ldx%ldx%ld (no epilogue)", (long)mnk[0], (long)mnk[2], (long)mnk[1]);
      run_case<bf16>(label, {1, mnk[0], mnk[1], mnk[2], true, false, kNone, false}, timed_variants<bf16>(true), reps);
      // What the gap between the two is made of (launch() only, same config): the bias alone,
      // then a cheap activation with it (relu: no MUFU), against gelu above.
      snprintf(label, sizeof label, "x @ W^T + bias bf16 %ldx%ldx%ld", (long)mnk[0], (long)mnk[2], (long)mnk[1]);
      run_case<bf16>(label, {1, mnk[0], mnk[1], mnk[2], true, false, kNone, true}, launch_only, reps);
      snprintf(label, sizeof label, "relu(x @ W^T + bias) bf16 %ldx%ldx%ld", (long)mnk[0], (long)mnk[2], (long)mnk[1]);
      run_case<bf16>(label, {1, mnk[0], mnk[1], mnk[2], true, false, Activation::kRelu, true}, launch_only, reps);
    }
    // The few-tile matmuls whose B rows sit 16 bytes off a sector (the registry's matmul
    // sm90_rows_16b_off_b and sm90_rows_16b_off): launch() runs 2 x 2 clusters at 700 rows (24
    // clusters) and pairs at 1000^3 (32 would not fit); cuBLAS ran 64 x 128 pairs with 8 stages.
    run_case<bf16>("matmul bf16 m700 n1000 k512 B(k,n)", {1, 700, 1000, 512, false, false, kNone, false},
                   timed_variants<bf16>(true), reps);
    run_case<bf16>("matmul bf16 m1000 n1000 k1000 B(k,n)", {1, 1000, 1000, 1000, false, false, kNone, false},
                   timed_variants<bf16>(true), reps);
  } else {
  run_case<bf16>("matmul bf16 4096^3 B(k,n)", {1, 4096, 4096, 4096, false, false, kNone, false}, timed_variants<bf16>(true), reps);
  run_case<bf16>("matmul bf16 4096^3 B=W^T", {1, 4096, 4096, 4096, true, false, kNone, false}, timed_variants<bf16>(true), reps);
  run_case<__half>("matmul fp16 4096^3 B(k,n)", {1, 4096, 4096, 4096, false, false, kNone, false}, timed_variants<__half>(!quick), reps);
  run_case<bf16>("linear_gelu bf16 8192x768x3072", {1, 8192, 3072, 768, true, false, kGelu, true}, timed_variants<bf16>(true), reps);
  run_case<bf16>("linear_gelu bf16 4096x4096x16384", {1, 4096, 16384, 4096, true, false, kGelu, true}, timed_variants<bf16>(!quick), reps);
  run_case<bf16>("matmul bf16 8192^3 B(k,n)", {1, 8192, 8192, 8192, false, false, kNone, false}, timed_variants<bf16>(!quick), reps);
  run_case<__half>("matmul fp16 8192^3 B(k,n)", {1, 8192, 8192, 8192, false, false, kNone, false}, timed_variants<__half>(!quick), reps);
  // The issue-14 odd shapes (m, n, k): dualk's bench names them m x k x n.
  run_case<bf16>("matmul bf16 1024^3 B(k,n)", {1, 1024, 1024, 1024, false, false, kNone, false}, timed_variants<bf16>(true), reps);
  run_case<bf16>("matmul bf16 m4096 n4096 k1000", {1, 4096, 4096, 1000, false, false, kNone, false}, timed_variants<bf16>(true), reps);
  run_case<bf16>("matmul bf16 m3000 n5000 k2000", {1, 3000, 5000, 2000, false, false, kNone, false}, timed_variants<bf16>(true), reps);
  run_case<bf16>("matmul bf16 m4096 n4096 k1024", {1, 4096, 4096, 1024, false, false, kNone, false}, timed_variants<bf16>(true), reps);
  run_case<bf16>("matmul bf16 m3000 n5000 k2048", {1, 3000, 5000, 2048, false, false, kNone, false}, timed_variants<bf16>(true), reps);
  run_case<bf16>("matmul bf16 m3000 n5120 k2000", {1, 3000, 5120, 2000, false, false, kNone, false}, timed_variants<bf16>(true), reps);
  run_case<bf16>("matmul bf16 m3072 n5120 k2048", {1, 3072, 5120, 2048, false, false, kNone, false}, timed_variants<bf16>(true), reps);
  run_case<bf16>("linear_gelu bf16 1000x1000x1000", {1, 1000, 1000, 1000, true, false, kGelu, true}, timed_variants<bf16>(true), reps);
  run_case<bf16>("linear_gelu bf16 32x768x3072", {1, 32, 3072, 768, true, false, kGelu, true}, timed_variants<bf16>(true), reps);
  }

  printf("\n== summary (us / TFLOP/s / speed vs vendor (cuBLAS or cuBLASLt GELU_BIAS) / rel err)\n");
  std::string last;
  for (const Row& r : g_summary) {
    if (r.label != last) printf("%s\n", r.label.c_str());
    last = r.label;
    printf("    %-26s %9.1f %7.1f %5.2fx %.1e\n", r.variant.c_str(), r.us, r.tflops, r.vs_ref, r.err);
  }
  printf("checked launches: %d, failures: %d\n", g_checked, g_failures);
  return g_failures ? 1 : 0;
}
