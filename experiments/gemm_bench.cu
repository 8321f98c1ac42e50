// Standalone GEMM harness: dualk's CUDA GEMM family (cuda_src/gemm*.cuh via matmul.cu and
// linear_gelu.cu) against cuBLAS / cuBLASLt, no torch. Build and run (on the GPU machine):
//   nvcc -O3 -std=c++17 -Icuda_src -Iexperiments -gencode=arch=compute_90a,code=sm_90a \
//        experiments/gemm_bench.cu cuda_src/matmul.cu cuda_src/linear_gelu.cu -lcublas -lcublasLt -o /tmp/gb
//   /tmp/gb [--quick]
// Every timed case is checked against cuBLAS (output poisoned with NaN first). Tile variants are
// instantiated here directly through gemm::launch_tensor_core, so trying a config needs no change
// to select_gemm_kernel. -DDUALK_BENCH_BASELINE also times experiments/gemm_v0.cuh, the
// pre-optimisation gemm.cuh in namespace gemm_v0 (not kept in the tree: recreate it with
// `git show 69b4139:cuda_src/gemm.cuh | sed 's/namespace gemm /namespace gemm_v0 /'`).
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
#ifdef DUALK_BENCH_BASELINE
#include "gemm_v0.cuh"
#endif

using namespace dualk;

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)
#define CB(x)                                                                              \
  do {                                                                                     \
    int s_ = static_cast<int>(x);                                                          \
    if (s_ != 0) {                                                                         \
      fprintf(stderr, "%s:%d %s: status %d\n", __FILE__, __LINE__, #x, s_);                \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

// ---------------------------------------------------------------- tile variants under test
namespace dualk::gemm {
#define TILE(name, bm, bn, bk, wm, wn, st, mb)                                                         \
  struct name {                                                                                         \
    static constexpr int kBlockM = bm, kBlockN = bn, kBlockK = bk, kWarpsM = wm, kWarpsN = wn, kStages = st; \
    static constexpr int kMinBlocks = mb;                                                               \
  };
TILE(V_128x256x32_s4, 128, 256, 32, 2, 4, 4, 1)
TILE(V_128x256x64_s3, 128, 256, 64, 2, 4, 3, 1)
TILE(V_128x256x64_s4, 128, 256, 64, 2, 4, 4, 1)
TILE(V_256x128x64_s3, 256, 128, 64, 4, 2, 3, 1)
TILE(V_128x128x64_s3_4w, 128, 128, 64, 2, 2, 3, 2)
TILE(V_128x128x32_s4_4w, 128, 128, 32, 2, 2, 4, 2)
TILE(V_128x128x32_s4_8w, 128, 128, 32, 2, 4, 4, 2)
TILE(V_128x128x64_s3_8w, 128, 128, 64, 2, 4, 3, 2)
}  // namespace dualk::gemm

// ---------------------------------------------------------------- helpers
template <typename T>
__global__ void fill_random(T* p, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed * 0x9E3779B9u ^ static_cast<uint32_t>(i >> 32);
    x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16;
    float v = (static_cast<float>(x & 0xffffff) / 16777216.f * 2.f - 1.f) * scale;
    p[i] = from_float<T>(v);
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

static uint32_t g_seed = 1;
template <typename T>
T* dalloc_random(int64_t n, float scale = 1.f) {
  T* p;
  CK(cudaMalloc(&p, std::max<int64_t>(n, 1) * sizeof(T)));
  fill_random<T><<<1024, 256>>>(p, n, g_seed++, scale);
  CK(cudaGetLastError());
  return p;
}

template <typename T>
std::vector<float> to_host(const T* p, int64_t n) {
  float* f;
  CK(cudaMalloc(&f, std::max<int64_t>(n, 1) * 4));
  to_f32<T><<<1024, 256>>>(p, f, n);
  CK(cudaGetLastError());
  std::vector<float> h(n);
  CK(cudaMemcpy(h.data(), f, n * 4, cudaMemcpyDeviceToHost));
  CK(cudaFree(f));
  return h;
}

static float median_us(const std::function<void()>& fn, int warm = 3, int reps = 25) {
  for (int i = 0; i < warm; ++i) fn();
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(reps + 1);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  std::vector<float> t(reps);
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(ev[i]));
    fn();
    CK(cudaEventRecord(ev[i + 1]));
  }
  CK(cudaEventSynchronize(ev[reps]));
  CK(cudaGetLastError());
  for (int i = 0; i < reps; ++i) CK(cudaEventElapsedTime(&t[i], ev[i], ev[i + 1]));
  for (auto& e : ev) CK(cudaEventDestroy(e));
  std::sort(t.begin(), t.end());
  return t[reps / 2] * 1000.f;
}

// Max |x - ref| over max |ref|; NaN anywhere counts as failure (returns inf).
static double rel_err(const std::vector<float>& x, const std::vector<float>& ref) {
  double md = 0, mr = 1e-30;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) return INFINITY;
    md = std::max(md, (double)std::fabs(x[i] - ref[i]));
    mr = std::max(mr, (double)std::fabs(ref[i]));
  }
  return md / mr;
}

template <typename T> constexpr cudaDataType cuda_type();
template <> constexpr cudaDataType cuda_type<float>() { return CUDA_R_32F; }
template <> constexpr cudaDataType cuda_type<__half>() { return CUDA_R_16F; }
template <> constexpr cudaDataType cuda_type<__nv_bfloat16>() { return CUDA_R_16BF; }
template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::kFloat32; }
template <> constexpr DType dtype_of<__half>() { return DType::kFloat16; }
template <> constexpr DType dtype_of<__nv_bfloat16>() { return DType::kBFloat16; }
template <typename T> const char* tname();
template <> const char* tname<float>() { return "fp32"; }
template <> const char* tname<__half>() { return "fp16"; }
template <> const char* tname<__nv_bfloat16>() { return "bf16"; }

static cublasHandle_t g_cublas;
static cublasLtHandle_t g_lt;
static void* g_lt_ws;
constexpr size_t kLtWs = 64 << 20;

// Row-major C (batch x m x n) = A (m x k) @ B; B (k x n) row-major, or W (n x k) row-major when k_major.
template <typename T>
void cublas_gemm(const GemmArgs& g) {
  const float one = 1.f, zero = 0.f;
  const cublasOperation_t opb = g.b_k_major ? CUBLAS_OP_T : CUBLAS_OP_N;
  CB(cublasGemmStridedBatchedEx(g_cublas, opb, CUBLAS_OP_N, (int)g.n, (int)g.m, (int)g.k, &one, g.b, cuda_type<T>(),
                                (int)g.stride_b_outer, g.stride_b_batch, g.a, cuda_type<T>(), (int)g.stride_am,
                                g.stride_a_batch, &zero, g.c, cuda_type<T>(), (int)g.stride_cm, g.stride_c_batch,
                                (int)g.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// cuBLASLt gelu(A @ W^T + bias) (GELU_BIAS epilogue, tanh gelu), batch 1, k-major B.
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
  // Column-major view: C^T (n x m) = W (k x n col-major, transposed) x A^T (k x m).
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

// ---------------------------------------------------------------- cases
struct Problem {
  int64_t batch, m, n, k;
  bool b_k_major;
  bool b_batch_broadcast;
};

template <typename T>
struct Buffers {
  GemmArgs g{};
  T *a, *b, *bias, *c, *ref;
  int64_t c_elems;
  Buffers(const Problem& p, bool with_bias) {
    g.batch = p.batch; g.m = p.m; g.n = p.n; g.k = p.k;
    g.stride_am = p.k; g.stride_a_batch = p.m * p.k;
    g.b_k_major = p.b_k_major;
    g.stride_b_outer = p.b_k_major ? p.k : p.n;
    g.stride_b_batch = p.b_batch_broadcast ? 0 : p.k * p.n;
    g.stride_cm = p.n; g.stride_c_batch = p.m * p.n;
    g.dtype = dtype_of<T>();
    g.activation = Activation::kNone;
    g.allow_tf32 = false;
    const float scale = 1.f;
    a = dalloc_random<T>(p.batch * p.m * p.k, scale);
    b = dalloc_random<T>((p.b_batch_broadcast ? 1 : p.batch) * p.k * p.n, scale);
    bias = with_bias ? dalloc_random<T>(p.n, 1.f) : nullptr;
    c_elems = p.batch * p.m * p.n;
    CK(cudaMalloc(&c, std::max<int64_t>(c_elems, 1) * sizeof(T)));
    CK(cudaMalloc(&ref, std::max<int64_t>(c_elems, 1) * sizeof(T)));
    g.a = a; g.b = b; g.bias = bias; g.c = c;
  }
  ~Buffers() {
    cudaFree(a); cudaFree(b); if (bias) cudaFree(bias); cudaFree(c); cudaFree(ref);
  }
  void poison() { fill_nan<T><<<1024, 256>>>(c, c_elems); CK(cudaGetLastError()); }
};

static int g_failures = 0;
struct Row { std::string name; double us, tflops, vs_ref, err; };
static std::vector<Row> g_summary;

static void report(const char* label, const char* variant, double flops, float us, float ref_us, double err, double tol) {
  const bool ok = err <= tol;
  if (!ok) ++g_failures;
  printf("  %-34s %9.1f us %7.1f TFLOP/s  %5.2fx ref  err %.2e %s\n", variant, us, flops / us * 1e-6, ref_us / us, err,
         ok ? "ok" : "FAIL");
  fflush(stdout);
  g_summary.push_back({std::string(label) + " | " + variant, us, flops / us * 1e-6, ref_us / us, err});
}

template <typename T> double tol_of() { return std::is_same_v<T, float> ? 1e-4 : 2e-2; }

// Reference: C = A @ B (cuBLAS), or gelu_tanh(C + bias) via cuBLASLt when gelu.
template <typename T>
float make_reference(Buffers<T>& buf, bool gelu, LtGelu* lt, bool time_it) {
  GemmArgs r = buf.g;
  r.c = buf.ref;
  std::function<void()> fn;
  if (gelu) {
    fn = [&] { lt_gelu_run<T>(*lt, r); };
  } else {
    fn = [&] { cublas_gemm<T>(r); };
  }
  fn();
  CK(cudaDeviceSynchronize());
  return time_it ? median_us(fn) : 0.f;
}

using Launch = std::function<cudaError_t(const GemmArgs&)>;
struct Variant { const char* name; Launch fn; };

template <typename T>
void run_case(const char* label, const Problem& p, bool gelu, const std::vector<Variant>& variants, bool time_it) {
  Buffers<T> buf(p, gelu);
  buf.g.activation = gelu ? Activation::kGeluTanh : Activation::kNone;
  LtGelu lt;
  if (gelu) {
    lt = lt_gelu_plan<T>(buf.g);
    if (!lt.ok || p.batch != 1) { printf("%s: cuBLASLt GELU_BIAS unavailable\n", label); return; }
  }
  const double flops = 2.0 * p.batch * p.m * p.n * p.k;
  const float ref_us = make_reference(buf, gelu, &lt, time_it);
  const std::vector<float> ref = to_host(buf.ref, buf.c_elems);
  printf("%s  %s  batch %ld m %ld n %ld k %ld  B %s%s  reference %s: %.1f us (%.1f TFLOP/s)\n", label, tname<T>(),
         (long)p.batch, (long)p.m, (long)p.n, (long)p.k, p.b_k_major ? "k-major" : "n-major",
         p.b_batch_broadcast ? " (batch stride 0)" : "", gelu ? "cuBLASLt gelu_bias" : "cuBLAS", ref_us,
         time_it ? flops / ref_us * 1e-6 : 0.0);
  for (const Variant& v : variants) {
    buf.poison();
    CK(v.fn(buf.g));
    CK(cudaDeviceSynchronize());
    const double err = rel_err(to_host(buf.c, buf.c_elems), ref);
    const float us = time_it ? median_us([&] { CK(v.fn(buf.g)); }) : 0.f;
    report(label, v.name, flops, us, ref_us, err, tol_of<T>());
  }
}

template <typename T, typename Tile, bool kKMajor, Activation kAct>
Variant tile_variant(const char* name) {
  return {name, [](const GemmArgs& g) {
            if (g.bias) return gemm::launch_tensor_core<T, Tile, kKMajor, kAct, true>(g, 0);
            return gemm::launch_tensor_core<T, Tile, kKMajor, kAct, false>(g, 0);
          }};
}

template <typename T, bool kKMajor, Activation kAct>
std::vector<Variant> tile_variants() {
  using namespace gemm;
  return {
      tile_variant<T, V_128x256x32_s4, kKMajor, kAct>("128x256x32 s4 8w 1/SM"),
      tile_variant<T, V_128x256x64_s3, kKMajor, kAct>("128x256x64 s3 8w 1/SM"),
      tile_variant<T, V_128x256x64_s4, kKMajor, kAct>("128x256x64 s4 8w 1/SM"),
      tile_variant<T, V_256x128x64_s3, kKMajor, kAct>("256x128x64 s3 8w 1/SM"),
      tile_variant<T, V_128x128x64_s3_4w, kKMajor, kAct>("128x128x64 s3 4w 2/SM"),
      tile_variant<T, V_128x128x32_s4_4w, kKMajor, kAct>("128x128x32 s4 4w 2/SM"),
      tile_variant<T, V_128x128x32_s4_8w, kKMajor, kAct>("128x128x32 s4 8w 2/SM"),
      tile_variant<T, V_128x128x64_s3_8w, kKMajor, kAct>("128x128x64 s3 8w 2/SM"),
  };
}

static Variant production(bool gelu) {
  if (gelu) return {"dualk launch_linear_gelu", [](const GemmArgs& g) { return launch_linear_gelu(g, 0); }};
  return {"dualk launch_matmul", [](const GemmArgs& g) { return launch_matmul(g, 0); }};
}
static Variant baseline(bool gelu) {
#ifdef DUALK_BENCH_BASELINE
  if (gelu)
    return {"v0 (before)", [](const GemmArgs& g) {
              return g.bias ? gemm_v0::run_gemm<Activation::kGeluTanh, true>(g, 0)
                            : gemm_v0::run_gemm<Activation::kGeluTanh, false>(g, 0);
            }};
  return {"v0 (before)", [](const GemmArgs& g) { return gemm_v0::run_gemm<Activation::kNone, false>(g, 0); }};
#else
  return production(gelu);
#endif
}

template <typename T, bool kKMajor, Activation kAct>
std::vector<Variant> all_variants(bool with_tiles) {
  std::vector<Variant> v;
#ifdef DUALK_BENCH_BASELINE
  v.push_back(baseline(kAct != Activation::kNone));
#endif
  v.push_back(production(kAct != Activation::kNone));
  if constexpr (!std::is_same_v<T, float>) {
    if (with_tiles)
      for (auto& t : tile_variants<T, kKMajor, kAct>()) v.push_back(t);
  }
  return v;
}

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const bool tiles = !(argc > 1 && std::string(argv[1]) == "--no-tiles");
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device %s, %d SMs, %d KB smem/block opt-in\n", prop.name, prop.multiProcessorCount,
         (int)(prop.sharedMemPerBlockOptin / 1024));
  CB(cublasCreate(&g_cublas));
  CB(cublasSetMathMode(g_cublas, CUBLAS_DEFAULT_MATH));  // no TF32 for fp32
  CB(cublasLtCreate(&g_lt));
  CK(cudaMalloc(&g_lt_ws, kLtWs));
  constexpr auto kNone = Activation::kNone;
  constexpr auto kGelu = Activation::kGeluTanh;
  using bf16 = __nv_bfloat16;

  // --- correctness on odd shapes (production launchers; all tile variants on the tensor-core ones)
  printf("== odd shapes (correctness only)\n");
  run_case<bf16>("odd", {1, 1000, 4097, 17, false, false}, false, all_variants<bf16, false, kNone>(false), false);
  run_case<bf16>("odd", {1, 257, 129, 4096, false, false}, false, all_variants<bf16, false, kNone>(false), false);
  run_case<bf16>("odd", {1, 257, 129, 4096, true, false}, false, all_variants<bf16, true, kNone>(true), false);
  run_case<bf16>("odd", {1, 1000, 1000, 1000, false, false}, false, all_variants<bf16, false, kNone>(true), false);
  run_case<bf16>("odd", {1, 333, 200, 72, true, false}, false, all_variants<bf16, true, kNone>(true), false);
  run_case<__half>("odd", {3, 300, 264, 200, false, true}, false, all_variants<__half, false, kNone>(true), false);
  run_case<bf16>("odd", {1, 1000, 1000, 1000, true, false}, true, all_variants<bf16, true, kGelu>(true), false);
  run_case<bf16>("odd", {1, 8, 4096, 4096, true, false}, true, all_variants<bf16, true, kGelu>(false), false);
  run_case<float>("odd", {1, 1000, 4097, 17, false, false}, false, all_variants<float, false, kNone>(false), false);
  run_case<float>("odd", {2, 129, 130, 131, true, true}, false, all_variants<float, true, kNone>(false), false);
  {  // k == 0: act(bias)
    Buffers<bf16> buf({1, 64, 96, 0, true, false}, true);
    buf.g.activation = kGelu;
    buf.poison();
    CK(launch_linear_gelu(buf.g, 0));
    CK(cudaDeviceSynchronize());
    auto c = to_host(buf.c, buf.c_elems);
    auto bias = to_host(buf.bias, 96);
    double md = 0;
    for (int i = 0; i < 64 * 96; ++i) {
      float x = bias[i % 96];
      float gl = 0.5f * x * (1.f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
      md = std::isfinite(c[i]) ? std::max(md, (double)std::fabs(c[i] - gl)) : INFINITY;
    }
    printf("odd  k=0 linear_gelu: max abs err %.2e %s\n", md, md < 1e-2 ? "ok" : "FAIL");
    if (!(md < 1e-2)) ++g_failures;
  }

  // --- timed cases
  printf("== timed\n");
  run_case<bf16>("matmul bf16 4096^3", {1, 4096, 4096, 4096, false, false}, false,
                 all_variants<bf16, false, kNone>(tiles), true);
  run_case<bf16>("linear_gelu bf16 8192x768x3072", {1, 8192, 3072, 768, true, false}, true,
                 all_variants<bf16, true, kGelu>(tiles), true);
  run_case<bf16>("linear_gelu bf16 4096x4096x16384", {1, 4096, 16384, 4096, true, false}, true,
                 all_variants<bf16, true, kGelu>(tiles && !quick), true);
  run_case<__half>("matmul fp16 8192^3", {1, 8192, 8192, 8192, false, false}, false,
                   all_variants<__half, false, kNone>(tiles && !quick), true);
  run_case<float>("matmul fp32 4096^3", {1, 4096, 4096, 4096, false, false}, false,
                  all_variants<float, false, kNone>(false), true);

  printf("\n== summary (median of 25, us / TFLOP/s / x reference / rel err)\n");
  for (auto& r : g_summary)
    if (r.us > 0) printf("%-70s %9.1f %7.1f %5.2f %.1e\n", r.name.c_str(), r.us, r.tflops, r.vs_ref, r.err);
  printf("failures: %d\n", g_failures);
  return g_failures ? 1 : 0;
}
