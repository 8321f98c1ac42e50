// Experiment (session 9; its first GPU run failed at launch, then restructured to 384 threads +
// setmaxnreg: compiled here, NOT yet run on a GPU in this form): a 16-bit MLP whose widths are up to
// 256 in one launch on Hopper, the design of NOTES-mlp.md "Next: 16-bit widths 129-256". Standalone
// (no torch): checks the kernel against a CPU reference with the same roundings, then times it.
//   nvcc -O3 -std=c++17 -Icuda_src -gencode=arch=compute_90a,code=sm_90a -Xptxas -v \
//        experiments/mlp_wide_sm90.cu -lcublas -o /tmp/mlp_wide && /tmp/mlp_wide
// What it needs of the MLP: 2 to kMaxLayers layers, widths multiples of 8 (TMA rows of 16 bytes)
// and at most 256, contiguous weights (out, in) and x rows with a 16-byte aligned stride.
//
// Per CTA (persistent over 128-row tiles): warpgroup 0 produces (one thread issues TMA),
// warpgroups 1 and 2 consume (64 rows each, wgmma m64n256k16 with 128 fp32 accumulators per thread).
//   * Layer 0 reads A (x) from shared memory: the tile's x arrives as 64-column panels (128-byte
//     swizzle; TMA zero-fills columns past the width), in its own buffer with full/empty barriers,
//     so the next tile's x loads while this tile's later layers run.
//   * Layers >= 1 take A from registers: after bias + activation + down-cast, the accumulators of
//     layer l are the A fragments of layer l+1 (the identity fused_mlp_sm90.cu documents), so
//     activations never leave registers.
//   * Weights stream through a kStages ring of 64-k x 256-n panels (32 KB; zero-filled past a
//     layer's width, so every hidden layer runs as 256 x 256); both consumers read every panel.
//   * Biases are staged once per CTA as fp32 (zero past each width: padded columns stay 0 through
//     relu / gelu / silu, and meet zero weight columns in the next layer).
// Registers: 384 threads (the layout of gemm_sm90.cuh), __launch_bounds__(384, 1) (entry cap 168,
// what ptxas -v reports), then setmaxnreg: the producer warpgroup drops to 24, the consumers rise
// to 240, and ptxas allocates the code after setmaxnreg.inc under 240 (128 accumulators + 64
// A-fragment registers need ~216; the SASS uses up to R237 there, the producer's code R0-R4 and
// uniform registers). The register file is 4 sub-partitions of 16384 and warp w lives in
// sub-partition w % 4, so the limit holds per sub-partition: each has one producer warp and one
// warp of each consumer, 32 x 24 + 2 x 32 x 240 = 16128 <= 16384. (The first GPU run, 288
// threads at __maxnreg__(224), failed "too many resources requested for launch": 3 of the 9 warps
// share a sub-partition, 3 x 32 x 224 = 21504 > 16384; 168 is the most that 9 warps can have,
// which is why __launch_bounds__(288, 1) capped ptxas at 168.) 24 / 240 rather than 40 / 232:
// at 232 the gelu kernel with a 64-wide last layer spilled its tile counter (8 bytes); at 240
// every 64-wide-last-layer kernel has no spills (FA3's Hopper kernels use the same 24 / 240).
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

#include "common.cuh"

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);          \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

namespace wide {
using namespace dualk;

constexpr int kRows = 128;                  // rows per tile
constexpr int kStages = 4;                  // weight ring depth
constexpr int kMaxLayers = 8;
constexpr int kMaxWidth = 256;
constexpr int kXPanelBytes = kRows * 128;   // 64 columns x 128 rows, 16 KB
constexpr int kWPanelBytes = kMaxWidth * 128;  // 64 k x 256 n, 32 KB
constexpr int kThreads = 384;        // warpgroup 0 produces, warpgroups 1 and 2 consume
constexpr int kEntryRegs = 168;      // ptxas cap for 384 threads at one CTA per SM (65536 / 384, floor 8)
constexpr int kProducerRegs = 24;    // setmaxnreg's minimum; the producer's SASS uses R0-R4
constexpr int kConsumerRegs = 240;
// setmaxnreg.inc blocks until the CTA's pool holds the registers it asks for, which only the
// producer's .dec puts there: the pool must cover the consumers' increase (at 168 it does, with
// nothing to spare), and each sub-partition (one producer warp + two consumer warps) must fit
// its 16384 registers.
static_assert(128 * (kEntryRegs - kProducerRegs) >= 256 * (kConsumerRegs - kEntryRegs), "register pool");
static_assert(32 * kProducerRegs + 2 * 32 * kConsumerRegs <= 16384, "registers per sub-partition");
constexpr int kXBytes = 4 * kXPanelBytes;
constexpr int kRingBytes = kStages * kWPanelBytes;
constexpr int kBiasBytes = kMaxLayers * kMaxWidth * 4;
constexpr int kBarrierBytes = (2 + 2 * kStages) * 8;
constexpr int kSmemBytes = kXBytes + kRingBytes + kBiasBytes + kBarrierBytes + 1024;
static_assert(kSmemBytes <= 227 * 1024, "sm_90 opt-in shared memory");

struct Params {
  int m;
  int num_layers;
  int widths[kMaxLayers + 1];
  int w_box_rows[kMaxLayers];  // rows (n) of each layer's weight box: 256, or 64 for a narrow last layer
  const void* biases[kMaxLayers];
  void* out;
  int64_t stride_om;
  int num_tiles;
};
struct Maps {
  CUtensorMap x;
  CUtensorMap w[kMaxLayers];
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
using namespace ::dualk::sm90;

// K-major shared-memory descriptor, 128-byte swizzle, SBO 1024 (8-row groups), LBO unused.
__device__ __forceinline__ uint64_t desc_k_major(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

// d (m64 x N, fp32) += A x B, B K-major from shared memory; A from shared memory (ss) or from four
// registers per thread (rs). scale_d 0 overwrites d.
#define WIDE_DEFINE_SS(N, CTYPE, PTX, REGS, ACCS, DA, DB, SC)                                          \
  __device__ __forceinline__ void wgmma_ss(float(&d)[N / 2], uint64_t da, uint64_t db, CTYPE, int scale_d) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SC ", 0;\n"                                      \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX " {" REGS "}, " DA ", " DB \
                 ", p, 1, 1, 0, 0;\n}\n"                                                               \
                 : ACCS                                                                                \
                 : "l"(da), "l"(db), "r"(scale_d));                                                    \
  }
#define WIDE_DEFINE_RS(N, CTYPE, PTX, REGS, ACCS, A0, A1, A2, A3, DB, SC)                              \
  __device__ __forceinline__ void wgmma_rs(float(&d)[N / 2], const uint32_t(&a)[4], uint64_t db, CTYPE, \
                                           int scale_d) {                                              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SC ", 0;\n"                                      \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX " {" REGS "}, {" A0 ", " A1 \
                 ", " A2 ", " A3 "}, " DB ", p, 1, 1, 0;\n}\n"                                          \
                 : ACCS                                                                                \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));                \
  }
WIDE_DEFINE_SS(256, __half, "f16", DUALK_ASM_REGS_0_127, DUALK_ASM_ACC_0_127, "%128", "%129", "%130")
WIDE_DEFINE_SS(256, __nv_bfloat16, "bf16", DUALK_ASM_REGS_0_127, DUALK_ASM_ACC_0_127, "%128", "%129", "%130")
WIDE_DEFINE_RS(256, __half, "f16", DUALK_ASM_REGS_0_127, DUALK_ASM_ACC_0_127, "%128", "%129", "%130", "%131", "%132", "%133")
WIDE_DEFINE_RS(256, __nv_bfloat16, "bf16", DUALK_ASM_REGS_0_127, DUALK_ASM_ACC_0_127, "%128", "%129", "%130", "%131", "%132", "%133")
WIDE_DEFINE_RS(64, __half, "f16", DUALK_ASM_REGS_0_31, DUALK_ASM_ACC_0_31, "%32", "%33", "%34", "%35", "%36", "%37")
WIDE_DEFINE_RS(64, __nv_bfloat16, "bf16", DUALK_ASM_REGS_0_31, DUALK_ASM_ACC_0_31, "%32", "%33", "%34", "%35", "%36", "%37")
#undef WIDE_DEFINE_SS
#undef WIDE_DEFINE_RS

// Executed by every thread of a warpgroup (.sync.aligned): moves registers between the warpgroup
// and the CTA's pool (gemm_sm90.cuh has the same two, in a header this file does not include).
template <int kRegs> __device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs> __device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// bias + activation in fp32 on this thread's accumulators (columns 8 j + 2 (lane % 4) + e), then
// the down-cast into the next layer's A fragments: k16 step kt takes n8 blocks 2 kt and 2 kt + 1.
template <typename T, Activation kAct>
__device__ __forceinline__ void to_a_fragments(float (&acc)[128], const float* bias, int lane,
                                               uint32_t (&a)[16][4]) {
#pragma unroll
  for (int kt = 0; kt < 16; ++kt) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {  // q: (n8 block 2 kt + q / 2, row half q % 2)
      const int i = 8 * kt + 2 * q;
      const int col = 8 * (2 * kt + q / 2) + 2 * (lane % 4);
      const float2 b2 = *reinterpret_cast<const float2*>(bias + col);  // one LDS.64 per pair
      const float v0 = apply_activation_16bit<kAct>(acc[i] + b2.x);
      const float v1 = apply_activation_16bit<kAct>(acc[i + 1] + b2.y);
      a[kt][q] = pack2<T>(v0, v1);
    }
  }
}
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// One layer's main loop over `panels` (<= 4) weight panels of the ring: wait for each, let
// issue(q, stage) issue its 4 k16 wgmma, keep one group in flight and release a stage once its
// group retired; returns with every wgmma of the layer complete. Unrolled, so that issue's
// register A fragments are indexed with constants. `pos` counts the panels this consumer took from
// the ring (stage pos % kStages, parity (pos / kStages) % 2): one register where stage + phase
// took two, which at 240 registers cost the relu kernel with a 64-wide last layer ptxas C7511
// ("wgmma.mma_async instructions are serialized due to insufficient register resources").
template <int kAccN, typename Issue>
__device__ __forceinline__ void layer_mainloop(float (&acc)[kAccN], int panels, uint32_t& pos, uint32_t w_full,
                                               uint32_t w_empty, int lane, const Issue& issue) {
  int prev = 0;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    if (q >= panels) break;
    const int stage = pos % kStages;
    mbar_wait(w_full + 8 * stage, (pos / kStages) & 1);
    fence_acc(acc);
    wgmma_fence();
    issue(q, stage);
    wgmma_commit();
    fence_acc(acc);
    if (q > 0) {
      wgmma_wait<1>();
      if (lane == 0) mbar_arrive(w_empty + 8 * prev);
    }
    prev = stage;
    ++pos;
  }
  wgmma_wait<0>();
  fence_acc(acc);
  if (lane == 0) mbar_arrive(w_empty + 8 * prev);
}
#endif

template <typename T, Activation kAct, int kLastN>
__global__ void __launch_bounds__(kThreads, 1) mlp_wide_kernel(const __grid_constant__ Maps maps, const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t x_buf = base;
  const uint32_t ring = x_buf + kXBytes;
  float* bias_s = reinterpret_cast<float*>(smem_raw + (ring + kRingBytes - smem_u32(smem_raw)));
  const uint32_t bars = ring + kRingBytes + kBiasBytes;
  const uint32_t x_full = bars, x_empty = bars + 8;
  const uint32_t w_full = bars + 16, w_empty = bars + 16 + 8 * kStages;

  // Biases as fp32, zero past each layer's width.
  for (int i = threadIdx.x; i < p.num_layers * kMaxWidth; i += blockDim.x) {
    const int l = i / kMaxWidth, c = i % kMaxWidth;
    const T* b = static_cast<const T*>(p.biases[l]);
    bias_s[i] = (b != nullptr && c < p.widths[l + 1]) ? to_float<T>(b[c]) : 0.f;
  }
  if (threadIdx.x == 0) {
    mbar_init(x_full, 1);
    // full: the producer's arrive_expect_tx + the TMA bytes; empty: lane 0 of each of the 8
    // consumer warps (warps 4-11). No named barriers: the roles meet only at these mbarriers.
    mbar_init(x_empty, 8);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(w_full + 8 * s, 1);
      mbar_init(w_empty + 8 * s, 8);
    }
    fence_barrier_init();
  }
  __syncthreads();

  const int warp_id = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (warp_id < 4) {
    // ---------------- producer (warpgroup 0): x panels, then every layer's weight panels, tile
    // by tile. All 128 threads give registers back; thread 0 alone issues the TMA.
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x != 0) return;
    prefetch_tensor_map(&maps.x);
    int stage = 0;
    uint32_t phase = 0;
    const int x_panels = (p.widths[0] + 63) / 64;
    int it = 0;
    for (int tile = blockIdx.x; tile < p.num_tiles; tile += gridDim.x, ++it) {
      mbar_wait(x_empty, (it & 1) ^ 1);
      mbar_arrive_expect_tx(x_full, x_panels * kXPanelBytes);
      for (int q = 0; q < x_panels; ++q) tma_load_2d(x_buf + q * kXPanelBytes, &maps.x, q * 64, tile * kRows, x_full);
      for (int l = 0; l < p.num_layers; ++l) {
        const int panels = l == 0 ? x_panels : 4;
        for (int q = 0; q < panels; ++q) {
          mbar_wait(w_empty + 8 * stage, phase ^ 1);
          mbar_arrive_expect_tx(w_full + 8 * stage, p.w_box_rows[l] * 128);
          tma_load_2d(ring + stage * kWPanelBytes, &maps.w[l], q * 64, 0, w_full + 8 * stage);
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    }
    return;
  }

  // ---------------- consumers (warpgroups 1, 2): consumer wg owns rows [64 wg, 64 wg + 64) of
  // each tile
  setmaxnreg_inc<kConsumerRegs>();
  const int wg = warp_id / 4 - 1;
  const int warp = warp_id % 4;
  uint32_t pos = 0;  // weight panels consumed: ring stage pos % kStages, parity (pos / kStages) % 2
  const int x_panels = (p.widths[0] + 63) / 64;
  float acc[128];
  uint32_t a[16][4];
  float (&acc64)[32] = *reinterpret_cast<float (*)[32]>(acc);  // a narrow last layer's N = 64
  int it = 0;
  for (int tile = blockIdx.x; tile < p.num_tiles; tile += gridDim.x, ++it) {
    // Layer 0: A = x from shared memory.
    mbar_wait(x_full, it & 1);
    layer_mainloop(acc, x_panels, pos, w_full, w_empty, lane, [&](int q, int s) {
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const uint64_t da = desc_k_major(x_buf + q * kXPanelBytes + wg * 64 * 128 + ks * 32);
        wgmma_ss(acc, da, desc_k_major(ring + s * kWPanelBytes + ks * 32), T{}, q > 0 || ks > 0);
      }
    });
    if (lane == 0) mbar_arrive(x_empty);  // this warp's reads of the x tile are done
    // Hidden layers 1 .. L-2 (A from registers, N = 256), then the last layer.
    for (int l = 1; l < p.num_layers; ++l) {
      to_a_fragments<T, kAct>(acc, bias_s + (l - 1) * kMaxWidth, lane, a);
      const auto hidden = [&](int q, int s) {
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
          wgmma_rs(acc, a[4 * q + ks], desc_k_major(ring + s * kWPanelBytes + ks * 32), T{}, q > 0 || ks > 0);
      };
      const auto narrow = [&](int q, int s) {
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
          wgmma_rs(acc64, a[4 * q + ks], desc_k_major(ring + s * kWPanelBytes + ks * 32), T{}, q > 0 || ks > 0);
      };
      if (kLastN == 256 || l < p.num_layers - 1) layer_mainloop(acc, 4, pos, w_full, w_empty, lane, hidden);
      else layer_mainloop(acc64, 4, pos, w_full, w_empty, lane, narrow);
    }
    // Output: the last layer's accumulators + bias (no activation), rows and columns clipped.
    const int out_w = p.widths[p.num_layers];
    const float* bias_last = bias_s + (p.num_layers - 1) * kMaxWidth;
    T* out = static_cast<T*>(p.out);
    const int row_base = tile * kRows + wg * 64 + warp * 16 + lane / 4;
    constexpr int kBlocks = kLastN / 8;
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) {
      const int col = 8 * j + 2 * (lane % 4);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row_base + 8 * h;
        if (row >= p.m) continue;
        T* dst = out + static_cast<int64_t>(row) * p.stride_om + col;
        if (col < out_w) dst[0] = from_float<T>(acc[4 * j + 2 * h] + bias_last[col]);
        if (col + 1 < out_w) dst[1] = from_float<T>(acc[4 * j + 2 * h + 1] + bias_last[col + 1]);
      }
    }
  }
#endif
}

}  // namespace wide

// ---------------------------------------------------------------- host side
using namespace dualk;
using bf16 = __nv_bfloat16;

static bool encode(CUtensorMap* map, const void* base, int64_t inner, int64_t outer, int64_t stride_elems,
                   uint32_t box_inner, uint32_t box_outer) {
  const EncodeTiledFn fn = encode_tiled_fn();
  if (fn == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(stride_elems * 2)};
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t elem[2] = {1, 1};
  return fn(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box, elem,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

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
static cudaError_t launch(const wide::Maps& maps, const wide::Params& p, int grid) {
  auto kernel = wide::mlp_wide_kernel<bf16, kAct, kLastN>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, wide::kSmemBytes);
  if (e != cudaSuccess) return e;
  static const bool fits = [&] {  // once per instantiation, after the shared-memory attribute
    char name[64];
    snprintf(name, sizeof name, "mlp_wide_kernel<bf16, act %d, last N %d>", static_cast<int>(kAct), kLastN);
    return check_kernel(reinterpret_cast<const void*>(kernel), name);
  }();
  if (!fits) return cudaErrorLaunchOutOfResources;
  kernel<<<grid, wide::kThreads, wide::kSmemBytes>>>(maps, p);
  return cudaGetLastError();
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
  wide::Maps maps;
  wide::Params p{};
  p.m = c.m;
  p.num_layers = layers;
  p.out = dout;
  p.stride_om = out_w;
  p.num_tiles = (c.m + wide::kRows - 1) / wide::kRows;
  const int last_n = out_w <= 64 ? 64 : 256;
  if (!encode(&maps.x, dx, c.widths[0], c.m, c.widths[0], 64, wide::kRows)) { printf("x map failed\n"); return 1; }
  for (int l = 0; l <= layers; ++l) p.widths[l] = c.widths[l];
  for (int l = 0; l < layers; ++l) {
    CK(cudaMalloc(&dw[l], w[l].size() * 2));
    CK(cudaMemcpy(dw[l], w[l].data(), w[l].size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&db[l], b[l].size() * 2));
    CK(cudaMemcpy(db[l], b[l].data(), b[l].size() * 2, cudaMemcpyHostToDevice));
    p.biases[l] = db[l];
    p.w_box_rows[l] = (l == layers - 1 && last_n == 64) ? 64 : 256;
    if (!encode(&maps.w[l], dw[l], c.widths[l], c.widths[l + 1], c.widths[l], 64, p.w_box_rows[l])) {
      printf("w map %d failed\n", l);
      return 1;
    }
  }
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
