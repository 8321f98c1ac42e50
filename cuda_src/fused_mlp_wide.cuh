// fused_mlp on Hopper (sm_90a) for 16-bit MLPs whose widest layer is 129-256 wide: the whole MLP
// in one persistent launch, weights streamed by TMA, activations kept in registers.
// The kernel and the host helpers its launcher and experiments/mlp_wide_sm90.cu (the standalone
// harness that measured it) share; fused_mlp_wide.cu instantiates it and plans it, fused_mlp.cu's
// planner calls plan_fused_mlp_wide for the bucket-256 case.
// Why: the mma.sync kernel reloads weight groups per row tile when 256-wide layers do not fit in
// shared memory together (256-256-256-64 bf16 at 2^18 rows, H100, dualk bench: 579 us, eager
// PyTorch 471 us); this kernel takes 150 us there in its harness
// (experiments/mlp_wide_sm90.cu; a cuBLAS + bias/activation chain: 794 us).
// What it needs of the MLP (unfit_reason checks it): 2 to kMaxLayers layers, every layer's input
// width a multiple of 8 (TMA rows of 16 bytes) and every width at most 256, contiguous weights
// (out, in) with 16-byte aligned bases, x rows with a 16-byte aligned base and stride.
//
// Per CTA (persistent over 128-row tiles): warpgroup 0 produces (one thread issues TMA),
// warpgroups 1 and 2 consume (64 rows each, wgmma m64n256k16 with 128 fp32 accumulators per
// thread).
//   * Layer 0 reads A (x) from shared memory: the tile's x arrives as 64-column panels (128-byte
//     swizzle; TMA zero-fills columns past the width and rows past m), in its own buffer with
//     full/empty barriers, so the next tile's x loads while this tile's later layers run.
//   * Layers >= 1 take A from registers: after bias + activation + down-cast, the accumulators of
//     layer l are the A fragments of layer l+1 (the identity fused_mlp_sm90.cu documents), so
//     activations never leave registers.
//   * Weights stream through a kStages ring of 64-k x 256-n panels (32 KB; zero-filled past a
//     layer's width, so every hidden layer runs as 256 x 256); both consumers read every panel.
//   * Biases are staged once per CTA as fp32 (zero past each width, and for a missing bias:
//     padded columns stay 0 through every activation, and meet zero weight columns in the next
//     layer).
//   * Output: the last layer's accumulators + bias, stored element by element, masked by m and
//     the output width (no alignment needed beyond the element's).
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
// none, relu, tanh-gelu and silu with a 64-wide last layer have no spills, and none, relu and
// silu with a 256-wide one neither (FA3's Hopper kernels use the same 24 / 240). Two builds
// still spill at 240 (ptxas 13.0): tanh-gelu with a last layer wider than 64 (96 bytes, at the
// layer boundary) and erf-gelu at any last width (220 bytes with a 64-wide one: erff's
// polynomial beside 128 accumulators and 64 A registers). They are not built: those MLPs keep
// the mma.sync kernel (kernel_built).
//
// Device code exists only in the sm_90a pass (__CUDA_ARCH_FEAT_SM90_ALL); other device passes
// compile an empty body, and the planner picks the kernel only on compute capability 9.0.
#pragma once

#include <climits>
#include <cstdint>

#include "fused_mlp_kernels.cuh"

namespace dualk {
namespace mlp {
namespace wide {

constexpr int kRows = 128;  // rows per tile
constexpr int kStages = 4;  // weight ring depth
constexpr int kMaxLayers = kMaxMlpLayers;
constexpr int kMaxWidth = 256;
constexpr int kXPanelBytes = kRows * 128;      // 64 columns x 128 rows, 16 KB
constexpr int kWPanelBytes = kMaxWidth * 128;  // 64 k x 256 n, 32 KB
constexpr int kThreads = 384;                  // warpgroup 0 produces, warpgroups 1 and 2 consume
constexpr int kEntryRegs =
    168;  // ptxas cap for 384 threads at one CTA per SM (65536 / 384, floor 8)
constexpr int kProducerRegs = 24;  // setmaxnreg's minimum; the producer's SASS uses R0-R4
constexpr int kConsumerRegs = 240;
// setmaxnreg.inc blocks until the CTA's pool holds the registers it asks for, which only the
// producer's .dec puts there: the pool must cover the consumers' increase (at 168 it does, with
// nothing to spare), and each sub-partition (one producer warp + two consumer warps) must fit
// its 16384 registers.
static_assert(128 * (kEntryRegs - kProducerRegs) >= 256 * (kConsumerRegs - kEntryRegs),
              "register pool");
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
  int w_box_rows[kMaxLayers];  // rows (n) of each layer's weight box: 256, or 64 for a narrow last
                               // layer
  const void* biases[kMaxLayers];
  void* out;
  int64_t stride_om;
  int num_tiles;
};
struct Maps {
  CUtensorMap x;
  CUtensorMap w[kMaxLayers];
};
using KernelFn = void (*)(Maps, Params);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
using namespace ::dualk::sm90;

// K-major shared-memory descriptor, 128-byte swizzle, SBO 1024 (8-row groups), LBO unused.
__device__ __forceinline__ uint64_t desc_k_major(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// d (m64 x N, fp32) += A x B, B K-major from shared memory; A from shared memory (ss) or from four
// registers per thread (rs). scale_d 0 overwrites d.
#define WIDE_DEFINE_SS(N, CTYPE, PTX, REGS, ACCS, DA, DB, SC)                                     \
  __device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t da, uint64_t db, CTYPE,    \
                                           int scale_d) {                                         \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SC                                           \
                 ", 0;\n"                                                                         \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX " {" REGS "}, " DA \
                 ", " DB ", p, 1, 1, 0, 0;\n}\n"                                                  \
                 : ACCS                                                                           \
                 : "l"(da), "l"(db), "r"(scale_d));                                               \
  }
#define WIDE_DEFINE_RS(N, CTYPE, PTX, REGS, ACCS, A0, A1, A2, A3, DB, SC)                          \
  __device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db, \
                                           CTYPE, int scale_d) {                                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SC                                            \
                 ", 0;\n"                                                                          \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX " {" REGS "}, {" A0 \
                 ", " A1 ", " A2 ", " A3 "}, " DB ", p, 1, 1, 0;\n}\n"                             \
                 : ACCS                                                                            \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));             \
  }
WIDE_DEFINE_SS(256, __half, "f16", DUALK_ASM_REGS_0_127, DUALK_ASM_ACC_0_127, "%128", "%129",
               "%130")
WIDE_DEFINE_SS(256, __nv_bfloat16, "bf16", DUALK_ASM_REGS_0_127, DUALK_ASM_ACC_0_127, "%128",
               "%129", "%130")
WIDE_DEFINE_RS(256, __half, "f16", DUALK_ASM_REGS_0_127, DUALK_ASM_ACC_0_127, "%128", "%129",
               "%130", "%131", "%132", "%133")
WIDE_DEFINE_RS(256, __nv_bfloat16, "bf16", DUALK_ASM_REGS_0_127, DUALK_ASM_ACC_0_127, "%128",
               "%129", "%130", "%131", "%132", "%133")
WIDE_DEFINE_RS(64, __half, "f16", DUALK_ASM_REGS_0_31, DUALK_ASM_ACC_0_31, "%32", "%33", "%34",
               "%35", "%36", "%37")
WIDE_DEFINE_RS(64, __nv_bfloat16, "bf16", DUALK_ASM_REGS_0_31, DUALK_ASM_ACC_0_31, "%32", "%33",
               "%34", "%35", "%36", "%37")
#undef WIDE_DEFINE_SS
#undef WIDE_DEFINE_RS

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
__device__ __forceinline__ void layer_mainloop(float (&acc)[kAccN], int panels, uint32_t& pos,
                                               uint32_t w_full, uint32_t w_empty, int lane,
                                               const Issue& issue) {
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
__global__ void __launch_bounds__(kThreads, 1)
    fused_mlp_wide_kernel(const __grid_constant__ Maps maps, const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t x_buf = base;
  const uint32_t ring = x_buf + kXBytes;
  float* bias_s = reinterpret_cast<float*>(smem_raw + (ring + kRingBytes - smem_u32(smem_raw)));
  const uint32_t bars = ring + kRingBytes + kBiasBytes;
  const uint32_t x_full = bars, x_empty = bars + 8;
  const uint32_t w_full = bars + 16, w_empty = bars + 16 + 8 * kStages;

  // Biases as fp32, zero past each layer's width (and for a missing bias).
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
      for (int q = 0; q < x_panels; ++q)
        tma_load_2d(x_buf + q * kXPanelBytes, &maps.x, q * 64, tile * kRows, x_full);
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
          wgmma_rs(acc, a[4 * q + ks], desc_k_major(ring + s * kWPanelBytes + ks * 32), T{},
                   q > 0 || ks > 0);
      };
      const auto narrow = [&](int q, int s) {
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
          wgmma_rs(acc64, a[4 * q + ks], desc_k_major(ring + s * kWPanelBytes + ks * 32), T{},
                   q > 0 || ks > 0);
      };
      if (kLastN == 256 || l < p.num_layers - 1)
        layer_mainloop(acc, 4, pos, w_full, w_empty, lane, hidden);
      else
        layer_mainloop(acc64, 4, pos, w_full, w_empty, lane, narrow);
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

// ---------------------------------------------------------------- host side
// The last layer's wgmma N: 64 where the output is at most 64 wide (a quarter of a 256-wide
// layer's work), else 256.
constexpr int last_layer_n(int out_width) { return out_width <= 64 ? 64 : 256; }

// Which instantiations exist: those that spill at 240 registers (see the top of this file),
// erf-gelu at either last width and tanh-gelu at 256, are not built; their MLPs keep the old path.
constexpr bool kernel_built(Activation act, int last_n) {
  return act != Activation::kGeluErf && (last_n == 64 || act != Activation::kGeluTanh);
}

// nullptr when the kernel can run `a` on `device`, else why not. Host logic only (tested on the
// CPU by tests/test_cuda_host_logic.py); plan_fused_mlp_wide also asks the driver.
inline const char* unfit_reason(const FusedMlpArgs& a, const DeviceProps& device) {
  if (a.dtype != DType::kFloat16 && a.dtype != DType::kBFloat16) return "not fp16 / bf16";
  if (device.cc_major != 9 || device.cc_minor != 0)
    return "not compute capability 9.0 (sm_90a code)";
  if (device.smem_optin < kSmemBytes) return "shared memory";
  if (a.num_layers < 2 || a.num_layers > kMaxLayers) return "layer count";
  int max_width = 0;
  for (int i = 0; i <= a.num_layers; ++i) {
    if (a.widths[i] < 1 || a.widths[i] > kMaxWidth) return "width out of 1..256";
    max_width = max_width > a.widths[i] ? max_width : a.widths[i];
  }
  // Up to 128 wide the resident kernels are faster (every weight stays in shared memory).
  if (max_width <= 128) return "no width above 128";
  const int out_w = a.widths[a.num_layers];
  if (!kernel_built(a.activation, last_layer_n(out_w)))
    return "no spill-free build for this activation and output width";
  // Tile rows are int, and TMA coordinates 32-bit.
  if (a.m < 0 || a.m > INT_MAX - kRows) return "rows";
  // TMA: global addresses 16-byte aligned, row strides multiples of 16 bytes below 2^40. The
  // output width is any (its weight map's rows past it read as zeros, its stores are masked).
  for (int i = 0; i < a.num_layers; ++i) {
    if (a.widths[i] % 8 != 0) return "an input width not a multiple of 8";
    if (!is_aligned16(a.weights[i])) return "weights not 16-byte aligned";
  }
  if (!is_aligned16(a.x)) return "x not 16-byte aligned";
  if (a.m > 1 &&
      (a.stride_xm % 8 != 0 || a.stride_xm < a.widths[0] || a.stride_xm >= (int64_t{1} << 39)))
    return "x row stride";
  return nullptr;
}

// The kernel's arguments for `a` (which unfit_reason accepted): tensor maps of x and every weight,
// 64-column boxes of 128 bytes (the 128-byte swizzle span). false if the driver cannot encode them.
inline bool make_launch_args(const FusedMlpArgs& a, Maps& maps, Params& p) {
  const EncodeTiledFn encode = encode_tiled_fn();
  if (encode == nullptr) return false;
  const CUtensorMapDataType type = a.dtype == DType::kFloat16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                              : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  // inner x outer elements, row stride in elements, box of 64 x box_rows.
  const auto encode_2d = [&](CUtensorMap* map, const void* base, int64_t inner, int64_t outer,
                             int64_t stride, int box_rows) {
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(stride) * 2};
    const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
    const cuuint32_t elem_strides[2] = {1, 1};
    return encode(map, type, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  };
  const int layers = a.num_layers, out_w = a.widths[layers];
  p = Params{};
  p.m = static_cast<int>(a.m);
  p.num_layers = layers;
  p.out = a.out;
  p.stride_om = out_w;
  p.num_tiles = static_cast<int>(ceil_div(a.m, kRows));
  for (int l = 0; l <= layers; ++l) p.widths[l] = a.widths[l];
  // One row's stride is never used: the map still wants a valid one.
  const int64_t stride_xm = a.m > 1 ? a.stride_xm : a.widths[0];
  if (!encode_2d(&maps.x, a.x, a.widths[0], a.m, stride_xm, kRows)) return false;
  for (int l = 0; l < layers; ++l) {
    p.biases[l] = a.biases[l];
    p.w_box_rows[l] = (l == layers - 1 && last_layer_n(out_w) == 64) ? 64 : 256;
    if (!encode_2d(&maps.w[l], a.weights[l], a.widths[l], a.widths[l + 1], a.widths[l],
                   p.w_box_rows[l]))
      return false;
  }
  return true;
}

}  // namespace wide

// fused_mlp_wide.cu: the kernel for `a`, or nullptr where wide::unfit_reason refuses it, the
// driver has no tensor-map encoder, or the build's register count would not let setmaxnreg
// complete; sets p.num_tiles (for the launcher's grid) and smem.
wide::KernelFn plan_fused_mlp_wide(const FusedMlpArgs& a, const DeviceProps& device,
                                   MlpKernelParams& p, int& smem);

}  // namespace mlp
}  // namespace dualk
