// Harness of the one-launch 16-bit MLP for widths up to 256 on Hopper (the kernel, its design
// and register budget: cuda_src/fused_mlp_wide.cuh, which this file includes; fused_mlp.cu's
// planner picks it for dualk.fused_mlp). Standalone (no torch): checks the kernel against a CPU
// reference with the same roundings, then times it against a cuBLAS + bias/activation chain.
//   nvcc -O3 -std=c++17 -Icuda_src -gencode=arch=compute_90a,code=sm_90a -Xptxas -v \
//        experiments/mlp_wide_sm90.cu -lcublas -o /tmp/mlp_wide && /tmp/mlp_wide
// H100 (session 10, experiments/results/2026-11-25-h100-mlp-wide-s10.txt): every check passes;
// 256-256-256-64 bf16 at 2^18 rows, relu 150 us (5.3x the chain), gelu 219 us (3.8x).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <random>
#include <vector>

#if __has_include(<cublas_v2.h>)  // the GPU image has it; a CPU-only toolkit may not (no peer then)
#include <cublas_v2.h>
#define WIDE_HAS_CUBLAS 1
#endif

#include "fused_mlp_wide.cuh"

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);          \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

namespace wide = dualk::mlp::wide;

// ---------------------------------------------------------------- host side
using namespace dualk;
using bf16 = __nv_bfloat16;

static float bf(float v) { return __bfloat162float(__float2bfloat16(v)); }
static float act_ref(float v, Activation a) {
  switch (a) {
    case Activation::kRelu: return v > 0 ? v : 0;
    case Activation::kGeluTanh: return 0.5f * v * (1.f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
    case Activation::kSilu: return v / (1.f + std::exp(-v));
    default: return v;
  }
}

#ifdef WIDE_HAS_CUBLAS
static cublasHandle_t g_cublas;
#endif

// bias + activation in place over a row-major (rows, n) bf16 tensor (the peer's second kernel).
__global__ void bias_act_kernel(bf16* y, const bf16* bias, int64_t total, int n, int act) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    float v = __bfloat162float(y[i]) + __bfloat162float(bias[i % n]);
    if (act == static_cast<int>(Activation::kRelu)) v = v > 0.f ? v : 0.f;
    else if (act == static_cast<int>(Activation::kGeluTanh)) v = 0.5f * v * (1.f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
    else if (act == static_cast<int>(Activation::kSilu)) v = v / (1.f + __expf(-v));
    y[i] = __float2bfloat16(v);
  }
}

// Median of 20 timed calls after 3 untimed ones (CUDA events around each call).
template <typename F>
static float median_us(F&& fn) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) CK(fn());
  std::vector<float> ts;
  for (int i = 0; i < 20; ++i) {
    CK(cudaEventRecord(e0));
    CK(fn());
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ts.push_back(ms * 1e3f);
  }
  std::sort(ts.begin(), ts.end());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ts[ts.size() / 2];
}

struct Case {
  const char* name;
  std::vector<int> widths;
  int m;
  Activation act;
  bool time;
};

// Before an instantiation's first launch: what the driver says about the kernel, and whether a
// CTA fits an SM, so that a failed launch's log says why. false: do not launch (it would fail, or
// could hang in setmaxnreg.inc).
static bool check_kernel(const void* kernel, const char* name) {
  cudaFuncAttributes fa;
  int dev = 0, regs_sm = 0, smem_optin = 0, blocks = 0;
  if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess || cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&regs_sm, cudaDevAttrMaxRegistersPerMultiprocessor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, wide::kThreads, wide::kSmemBytes) != cudaSuccess) {
    printf("%s: attribute/occupancy query failed: %s\n", name, cudaGetErrorString(cudaGetLastError()));
    return false;
  }
  // Registers are allocated per warp in units of 256, and warp w sits in sub-partition w % 4,
  // which holds a quarter of the SM's registers.
  const int warps = wide::kThreads / 32;
  const int warp_regs = (fa.numRegs * 32 + 255) / 256 * 256;
  const int part_need = (warps + 3) / 4 * warp_regs, part_have = regs_sm / 4;
  // setmaxnreg.inc waits for registers that the producer's .dec returned to the CTA's pool.
  const int pool = 128 * (fa.numRegs - wide::kProducerRegs);
  const int pool_need = 256 * (wide::kConsumerRegs - fa.numRegs);
  printf("%s: numRegs %d, maxThreadsPerBlock %d, localSizeBytes %zu (spills), block %d threads, dyn smem %d "
         "(opt-in max %d), registers per sub-partition %d of %d, setmaxnreg %d -> %d / %d -> %d (pool %d, "
         "needs %d), CTAs per SM %d\n",
         name, fa.numRegs, fa.maxThreadsPerBlock, fa.localSizeBytes, wide::kThreads, wide::kSmemBytes, smem_optin,
         part_need, part_have, fa.numRegs, wide::kProducerRegs, fa.numRegs, wide::kConsumerRegs, pool, pool_need,
         blocks);
  bool ok = true;
  if (wide::kThreads > fa.maxThreadsPerBlock) {
    printf("  LAUNCH WOULD FAIL: %d threads > maxThreadsPerBlock %d (%d registers per thread)\n", wide::kThreads,
           fa.maxThreadsPerBlock, fa.numRegs);
    ok = false;
  }
  if (part_need > part_have) {
    printf("  LAUNCH WOULD FAIL: %d warps x %d registers put %d registers in one sub-partition, which has %d\n",
           warps, fa.numRegs, part_need, part_have);
    ok = false;
  }
  if (wide::kSmemBytes > smem_optin) {
    printf("  LAUNCH WOULD FAIL: %d bytes of dynamic shared memory > opt-in max %d\n", wide::kSmemBytes, smem_optin);
    ok = false;
  }
  if (ok && blocks < 1) {
    printf("  LAUNCH WOULD FAIL: the occupancy calculator fits no CTA on an SM\n");
    ok = false;
  }
  if (pool < pool_need) {
    printf("  NOT LAUNCHED, MAY HANG: the producer's setmaxnreg.dec frees %d registers, the consumers' .inc "
           "waits for %d (numRegs %d < %d)\n",
           pool, pool_need, fa.numRegs, wide::kEntryRegs);
    ok = false;
  }
  return ok;
}

template <Activation kAct, int kLastN>
static cudaError_t launch_built(const wide::Maps& maps, const wide::Params& p, int grid) {
  auto kernel = wide::fused_mlp_wide_kernel<bf16, kAct, kLastN>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, wide::kSmemBytes);
  if (e != cudaSuccess) return e;
  static const bool fits = [&] {  // once per instantiation, after the shared-memory attribute
    char name[64];
    snprintf(name, sizeof name, "fused_mlp_wide_kernel<bf16, act %d, last N %d>", static_cast<int>(kAct), kLastN);
    return check_kernel(reinterpret_cast<const void*>(kernel), name);
  }();
  if (!fits) return cudaErrorLaunchOutOfResources;
  kernel<<<grid, wide::kThreads, wide::kSmemBytes>>>(maps, p);
  return cudaGetLastError();
}

// The builds the library has (wide::kernel_built; the others spill).
template <Activation kAct, int kLastN>
static cudaError_t launch(const wide::Maps& maps, const wide::Params& p, int grid) {
  if constexpr (wide::kernel_built(kAct, kLastN)) return launch_built<kAct, kLastN>(maps, p, grid);
  return cudaErrorNotSupported;
}

template <int kLastN>
static cudaError_t launch_act(Activation a, const wide::Maps& maps, const wide::Params& p, int grid) {
  switch (a) {
    case Activation::kRelu: return launch<Activation::kRelu, kLastN>(maps, p, grid);
    case Activation::kGeluTanh: return launch<Activation::kGeluTanh, kLastN>(maps, p, grid);
    case Activation::kSilu: return launch<Activation::kSilu, kLastN>(maps, p, grid);
    default: return cudaErrorInvalidValue;
  }
}

static int run_case(const Case& c, int num_sms) {
  const int layers = static_cast<int>(c.widths.size()) - 1;
  std::mt19937 gen(1234);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<std::vector<bf16>> w(layers), b(layers);
  std::vector<bf16> x(static_cast<size_t>(c.m) * c.widths[0]);
  for (auto& v : x) v = __float2bfloat16(nd(gen));
  for (int l = 0; l < layers; ++l) {
    const float s = 1.f / std::sqrt(static_cast<float>(c.widths[l]));
    w[l].resize(static_cast<size_t>(c.widths[l + 1]) * c.widths[l]);
    for (auto& v : w[l]) v = __float2bfloat16(nd(gen) * s);
    b[l].resize(c.widths[l + 1]);
    for (auto& v : b[l]) v = __float2bfloat16(0.5f * nd(gen));
  }
  const int out_w = c.widths[layers];
  bf16 *dx, *dout;
  std::vector<bf16*> dw(layers), db(layers);
  CK(cudaMalloc(&dx, x.size() * 2));
  CK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&dout, static_cast<size_t>(c.m) * out_w * 2));
  CK(cudaMemset(dout, 0xFF, static_cast<size_t>(c.m) * out_w * 2));  // NaN poison
  FusedMlpArgs args{};
  args.x = dx;
  args.stride_xm = c.widths[0];
  args.out = dout;
  args.m = c.m;
  args.num_layers = layers;
  args.activation = c.act;
  args.dtype = DType::kBFloat16;
  for (int l = 0; l <= layers; ++l) args.widths[l] = c.widths[l];
  for (int l = 0; l < layers; ++l) {
    CK(cudaMalloc(&dw[l], w[l].size() * 2));
    CK(cudaMemcpy(dw[l], w[l].data(), w[l].size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&db[l], b[l].size() * 2));
    CK(cudaMemcpy(db[l], b[l].data(), b[l].size() * 2, cudaMemcpyHostToDevice));
    args.weights[l] = dw[l];
    args.biases[l] = db[l];
  }
  wide::Maps maps;
  wide::Params p;
  if (!wide::make_launch_args(args, maps, p)) {
    printf("tensor map encoding failed\n");
    return 1;
  }
  const int last_n = wide::last_layer_n(out_w);
  const int grid = p.num_tiles < num_sms ? p.num_tiles : num_sms;
  auto run = [&]() { return last_n == 64 ? launch_act<64>(c.act, maps, p, grid) : launch_act<256>(c.act, maps, p, grid); };
  CK(run());
  CK(cudaDeviceSynchronize());
  std::vector<bf16> out(static_cast<size_t>(c.m) * out_w);
  CK(cudaMemcpy(out.data(), dout, out.size() * 2, cudaMemcpyDeviceToHost));

  // Reference on up to 2048 rows (all of a small m): fp32 sums, the kernel's roundings (bias +
  // activation in fp32, one rounding to bf16 per hidden layer; the output rounded once).
  const int check_rows = c.m < 2048 ? c.m : 2048;
  double max_err = 0, max_ref = 0;
  int nan_count = 0;
  std::vector<float> h, hn;
  for (int r = 0; r < check_rows; ++r) {
    const int row = c.m <= 2048 ? r : static_cast<int>((static_cast<int64_t>(r) * 2654435761u) % c.m);
    h.assign(c.widths[0], 0.f);
    for (int k = 0; k < c.widths[0]; ++k) h[k] = __bfloat162float(x[static_cast<size_t>(row) * c.widths[0] + k]);
    for (int l = 0; l < layers; ++l) {
      hn.assign(c.widths[l + 1], 0.f);
      for (int n = 0; n < c.widths[l + 1]; ++n) {
        float s = 0.f;
        for (int k = 0; k < c.widths[l]; ++k) s += h[k] * __bfloat162float(w[l][static_cast<size_t>(n) * c.widths[l] + k]);
        s += __bfloat162float(b[l][n]);
        hn[n] = l == layers - 1 ? s : bf(act_ref(s, c.act));
      }
      h.swap(hn);
    }
    for (int n = 0; n < out_w; ++n) {
      const float got = __bfloat162float(out[static_cast<size_t>(row) * out_w + n]);
      if (!std::isfinite(got)) ++nan_count;
      max_err = std::fmax(max_err, std::fabs(got - h[n]));
      max_ref = std::fmax(max_ref, std::fabs(h[n]));
    }
  }
  // bf16 output rounding (2^-8 relative) plus the fp32 summation-order and fast-gelu differences.
  const double tol = 2e-2 * max_ref;
  const bool ok = nan_count == 0 && max_err <= tol;
  printf("%-28s m=%-7d check %d rows: max err %.3e (max |ref| %.3f, tol %.3e)%s %s\n", c.name, c.m, check_rows,
         max_err, max_ref, tol, nan_count ? " NaN/unwritten!" : "", ok ? "ok" : "FAIL");
  if (c.time) {
    double flops = 0;
    for (int l = 0; l < layers; ++l) flops += 2.0 * c.m * c.widths[l] * c.widths[l + 1];
#ifdef WIDE_HAS_CUBLAS
    // The eager-like peer, timed in the same run: per layer a cuBLAS GEMM, then one elementwise
    // kernel for bias + activation (eager's addmm + activation move the same bytes).
    std::vector<bf16*> hidden(layers);
    for (int l = 0; l < layers; ++l) CK(cudaMalloc(&hidden[l], static_cast<size_t>(c.m) * c.widths[l + 1] * 2));
    auto eager = [&]() -> cudaError_t {
      const bf16* in = dx;
      for (int l = 0; l < layers; ++l) {
        const float one = 1.f, zero = 0.f;
        const int n = c.widths[l + 1], k = c.widths[l];
        if (cublasGemmEx(g_cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, c.m, k, &one, dw[l], CUDA_R_16BF, k, in,
                         CUDA_R_16BF, k, &zero, hidden[l], CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
          return cudaErrorUnknown;
        const int64_t total = static_cast<int64_t>(c.m) * n;
        const Activation a = l == layers - 1 ? Activation::kNone : c.act;
        bias_act_kernel<<<1024, 256>>>(hidden[l], db[l], total, n, static_cast<int>(a));
        in = hidden[l];
      }
      return cudaGetLastError();
    };
    const float ours = median_us(run), peer = median_us(eager);
    printf("    time: median %.1f us, %.1f TFLOP/s; eager-like cuBLAS chain %.1f us: %.2fx\n", ours,
           flops / ours * 1e-6, peer, peer / ours);
    for (bf16* h : hidden) cudaFree(h);
#else
    const float ours = median_us(run);
    printf("    time: median %.1f us, %.1f TFLOP/s (no cuBLAS headers at build time: no peer)\n", ours,
           flops / ours * 1e-6);
#endif
  }
  cudaFree(dx);
  cudaFree(dout);
  for (int l = 0; l < layers; ++l) {
    cudaFree(dw[l]);
    cudaFree(db[l]);
  }
  return ok ? 0 : 1;
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  if (prop.major != 9 || prop.minor != 0) {
    printf("needs compute capability 9.0\n");
    return 1;
  }
  const Case cases[] = {
      {"256-256-256-64 relu", {256, 256, 256, 64}, 4133, Activation::kRelu, false},
      {"200-256-136-16 gelu", {200, 256, 136, 16}, 1000, Activation::kGeluTanh, false},
      {"256-256-256-256 silu", {256, 256, 256, 256}, 777, Activation::kSilu, false},
      {"136-144 relu (1 hidden)", {136, 144, 40}, 300, Activation::kRelu, false},
      {"256x3-64 relu B2^18", {256, 256, 256, 64}, 1 << 18, Activation::kRelu, true},
      {"256x3-64 gelu B2^18", {256, 256, 256, 64}, 1 << 18, Activation::kGeluTanh, true},
  };
#ifdef WIDE_HAS_CUBLAS
  if (cublasCreate(&g_cublas) != CUBLAS_STATUS_SUCCESS) {
    printf("cublasCreate failed\n");
    return 1;
  }
#endif
  int failures = 0;
  for (const Case& c : cases) failures += run_case(c, prop.multiProcessorCount);
  printf("%d case(s) failed\n", failures);
  return failures ? 1 : 0;
}
