// fused_mlp on Hopper (sm_90a): the padded, resident fp16/bf16 MLP (every width <= 64 or <= 128,
// all layers' weights in shared memory) with wgmma.mma_async instead of mma.sync.
// Why it stays one file of ~550 lines: it is one kernel (about 300 lines, the layer loop with its
// descriptors and register fragments) plus its wgmma helpers and its small planner, and none of
// them has another user.
//
// Its own translation unit; shared definitions (MlpKernelParams, store_warp_rows, stage_tile,
// mma_row_pitch, KernelFn, pick_by_activation) in fused_mlp_kernels.cuh. fused_mlp.cu's planner
// calls plan_fused_mlp_wgmma where it has chosen the padded kernel.
//
// Per block (one per SM, persistent): up to 6 warpgroups, each walking 64-row tiles on its own
// (no block barrier after the prologue).
//   * Weights: every layer zero-padded to kWidth x kWidth and staged once per block, by cp.async,
//     straight into the layout wgmma reads B from: W (n, k) row-major is B "K-major" (no
//     transpose), stored as 128-byte-swizzled panels of 64 k (128 bytes per n row, 8-row groups
//     1024 bytes apart): element (n, k) of panel k / 64 at byte n * 128 + (((k % 64) / 8) ^ (n %
//     8))
//     * 16 + (k % 8) * 2. Descriptor: SBO 1024, 128B swizzle; the k16 step j starts at panel j / 4,
//     +32 (j % 4) bytes (the hardware applies the XOR to the computed address, as for
//     gemm_sm90.cuh's TMA tiles).
//   * Biases go through the tensor core: each layer's first wgmma is an extra k16 step with A = all
//     ones (registers) and B = the layer's bias block (k column 0 = the bias, the rest zero; same
//     panel layout, 4 layers per panel) and scale-d 0, so the accumulators need no initial value
//     and no bias is loaded per tile. (Loading them from shared memory, 8 LDS.128 per warp and
//     layer, kept the shared-memory pipe ~75% busy: 79 us against 66 us, H200.)
//   * Activations never leave registers between layers: wgmma m64nNk16 takes A from registers with
//     exactly mma.sync's m16n8k16 A layout per warp (warp w of the warpgroup owns rows 16 w..16 w +
//     15), and its fp32 accumulator holds, per n8 tile j, d[4 j + 0, 1] = (row lane / 4, cols 8 j +
//     2 (lane % 4) + {0, 1}), d[4 j + 2, 3] = (row lane / 4 + 8, same cols) (PTX ISA figures
//     wgmma-64N16-A / -D). So after activation + down-cast, the next layer's A fragment of k-tile
//     kt is {pack(d[8kt], d[8kt+1]), pack(d[8kt+2], d[8kt+3]), pack(d[8kt+4], d[8kt+5]),
//     pack(d[8kt+6], d[8kt+7])}: no shuffles, no shared memory. Hidden layers use N = kWidth; the
//     last layer the smallest N in {16, 32, 64, kWidth} that covers its width. relu is folded into
//     the down-cast (cvt.rn.relu.f16x2). The hidden-layer loop is unrolled (compile-time
//     descriptors).
//   * x: each warp stages only its own 16 rows (cp.async into a kStages-deep per-warp ring, padded
//     pitch for conflict-free ldmatrix), so no warpgroup barrier is needed; a slot is refilled
//     with the tile kStages ahead as soon as its A fragments are in registers. Outputs of <= 16
//     columns go from the accumulators straight to global memory; wider ones through
//     store_warp_rows.
// Each warpgroup's layers form one dependent chain (wgmma, wait, epilogue, next wgmma); the SM
// overlaps the chains of its warpgroups, so the block takes as many as registers and shared
// memory allow (see wgmma_mlp_max_warpgroups).
//
// Device code exists only in the sm_90a pass (__CUDA_ARCH_FEAT_SM90_ALL); other device passes
// compile a trap, and plan_fused_mlp_wgmma picks this kernel only on compute capability 9.0.
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "fused_mlp_kernels.cuh"

namespace dualk {
namespace mlp {
namespace {

// Warpgroups per block (one block per SM) and the depth of each warp's x ring. Every warpgroup
// runs one dependent wgmma chain (layer after layer), so throughput grows with the number of
// warpgroups per SM until registers or shared memory run out. H200, fp16 64-64-64-64-16 B2^20
// (NOTES-mlp.md): two interleaved m64 chains per warpgroup, 2 / 3 / 4 warpgroups: 146 / 109 /
// 94 us, one chain x 4 warpgroups: 84 us (a second chain inside a warpgroup does not overlap, more
// warpgroups do); after trimming the epilogue and x staging, one chain x 4 / 5 / 6 warpgroups:
// 82.0 / 78.4 / 78.3 us; with biases through the tensor core, 6 warpgroups x 3 / 2 stages:
// 62.1 / 60.3 us.
//   64-wide relu / none: 6 warpgroups (80 registers), 2 stages; gelu / silu (114-128 registers):
//   4 warpgroups, 4 stages. 128-wide: 3 warpgroups (<= 168 registers) with 1 stage (the slot is
//   refilled with the next tile as soon as its A fragments are in registers), which fits beside 4
//   layers of weights (192 KB).
// Bench overrides: -DDUALK_WGMMA64_WARPGROUPS=.. -DDUALK_WGMMA64_STAGES=.. (relu / none only) and
// -DDUALK_WGMMA128_WARPGROUPS / _STAGES.
#ifndef DUALK_WGMMA64_WARPGROUPS
#define DUALK_WGMMA64_WARPGROUPS 6
#endif
#ifndef DUALK_WGMMA64_STAGES
#define DUALK_WGMMA64_STAGES 2
#endif
#ifndef DUALK_WGMMA128_WARPGROUPS
#define DUALK_WGMMA128_WARPGROUPS 3
#endif
#ifndef DUALK_WGMMA128_STAGES
#define DUALK_WGMMA128_STAGES 1
#endif
__host__ __device__ constexpr bool wgmma_mlp_light_act(Activation act) {
  return act == Activation::kNone || act == Activation::kRelu;
}
__host__ __device__ constexpr int wgmma_mlp_max_warpgroups(int width, Activation act) {
  return width == 64 ? (wgmma_mlp_light_act(act) ? DUALK_WGMMA64_WARPGROUPS : 4)
                     : DUALK_WGMMA128_WARPGROUPS;
}
__host__ __device__ constexpr int wgmma_mlp_stages(int width, Activation act) {
  return width == 64 ? (wgmma_mlp_light_act(act) ? DUALK_WGMMA64_STAGES : 4)
                     : DUALK_WGMMA128_STAGES;
}

constexpr int kWgmmaTileRows = 64;  // rows per warpgroup tile (wgmma m64)
constexpr int kWgmmaWarpRows = 16;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace mlp_sm90 {

using namespace ::dualk::sm90;  // smem_u32, fence_proxy_async, wgmma_fence / commit / wait,
                                // fence_acc (common.cuh)

// Shared-memory matrix descriptor of a K-major operand with 128-byte swizzle, split in its two
// 32-bit words: low = start address >> 4 (bits 0-13) | LBO 1 (unused with swizzle, bits 16-29);
// high = SBO 1024 >> 4 (8-row groups, bits 32-45) | swizzle mode 1 (bits 62-63). Offsets inside
// shared memory (< 256 KB) only change the address field of the low word.
constexpr uint32_t kDescHigh = (1024 >> 4) | (1u << 30);
__device__ __forceinline__ uint32_t desc_low(uint32_t smem_address) {
  return ((smem_address & 0x3FFFF) >> 4) | (1u << 16);
}

// d (fp32, m64 x N) = a (registers, m64 x k16) x B (shared memory, descriptor, K-major)
// + (scale_d ? d : 0). One overload per (N, type); the CTYPE argument only selects the type.
// Operands: N/2 accumulators, 4 A registers, desc_b, the scale-d register.
#define DUALK_MLP_DEFINE_WGMMA(N, CTYPE, PTX_TYPE, REGS, ACCS, A0, A1, A2, A3, DESC, SCALE)        \
  __device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4],              \
                                           uint64_t desc_b, CTYPE, int scale_d = 1) {              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE                                         \
                 ", 0;\n"                                                                          \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_TYPE "." PTX_TYPE " {" REGS \
                 "}, {" A0 ", " A1 ", " A2 ", " A3 "}, " DESC ", p, 1, 1, 0;\n}\n"                 \
                 : ACCS                                                                            \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));         \
  }
DUALK_MLP_DEFINE_WGMMA(16, __half, "f16", DUALK_ASM_REGS_0_7, DUALK_ASM_ACC_0_7, "%8", "%9", "%10",
                       "%11", "%12", "%13")
DUALK_MLP_DEFINE_WGMMA(16, __nv_bfloat16, "bf16", DUALK_ASM_REGS_0_7, DUALK_ASM_ACC_0_7, "%8", "%9",
                       "%10", "%11", "%12", "%13")
DUALK_MLP_DEFINE_WGMMA(32, __half, "f16", DUALK_ASM_REGS_0_15, DUALK_ASM_ACC_0_15, "%16", "%17",
                       "%18", "%19", "%20", "%21")
DUALK_MLP_DEFINE_WGMMA(32, __nv_bfloat16, "bf16", DUALK_ASM_REGS_0_15, DUALK_ASM_ACC_0_15, "%16",
                       "%17", "%18", "%19", "%20", "%21")
DUALK_MLP_DEFINE_WGMMA(64, __half, "f16", DUALK_ASM_REGS_0_31, DUALK_ASM_ACC_0_31, "%32", "%33",
                       "%34", "%35", "%36", "%37")
DUALK_MLP_DEFINE_WGMMA(64, __nv_bfloat16, "bf16", DUALK_ASM_REGS_0_31, DUALK_ASM_ACC_0_31, "%32",
                       "%33", "%34", "%35", "%36", "%37")
DUALK_MLP_DEFINE_WGMMA(128, __half, "f16", DUALK_ASM_REGS_0_63, DUALK_ASM_ACC_0_63, "%64", "%65",
                       "%66", "%67", "%68", "%69")
DUALK_MLP_DEFINE_WGMMA(128, __nv_bfloat16, "bf16", DUALK_ASM_REGS_0_63, DUALK_ASM_ACC_0_63, "%64",
                       "%65", "%66", "%67", "%68", "%69")
#undef DUALK_MLP_DEFINE_WGMMA

// One layer for the warpgroup, start to finish: acc = bias + a @ W^T over the full kWidth of k,
// N = kN output columns (weight rows 0..kN-1 of the layer's panels). `desc_lo` is the low word of
// the layer's descriptor (panel 0, k 0), `bias_desc_lo` that of its bias block (a K-major k16
// block whose first column is the bias, the rest zero): the bias is the first k16 step, with A =
// all ones and scale-d 0, so the accumulators need no initial value.
template <typename T>
constexpr uint32_t kOnesPair = std::is_same<T, __half>::value ? 0x3C003C00u : 0x3F803F80u;
// kPanelRows: the rows of B's 64-k panels in shared memory (kWidth, or kN for a compact last
// layer: p.last_panel_rows).
template <typename T, int kN, int kWidth, int kPanelRows = kWidth>
__device__ __forceinline__ void wgmma_layer(float (&acc)[kN / 2],
                                            const uint32_t (&a)[kWidth / 16][4], uint32_t desc_lo,
                                            uint32_t bias_desc_lo) {
  static_assert(kPanelRows == kWidth || kPanelRows == kN, "panels of kWidth or of kN rows");
  constexpr int kPanelBytes = kPanelRows * 128;
  // Recomputed per call (volatile), like the ones: hoisted out of the tile loop, the last layer's
  // kWidth / 16 64-bit step descriptors held 16 registers (the 128-wide build spilled).
  uint32_t lo, blo, ones[4];
  asm volatile("mov.b32 %0, %1;\n" : "=r"(lo) : "r"(desc_lo));
  asm volatile("mov.b32 %0, %1;\n" : "=r"(blo) : "r"(bias_desc_lo));
  asm volatile("mov.b32 %0, %4;\nmov.b32 %1, %4;\nmov.b32 %2, %4;\nmov.b32 %3, %4;\n"
               : "=r"(ones[0]), "=r"(ones[1]), "=r"(ones[2]), "=r"(ones[3])
               : "n"(kOnesPair<T>));
  fence_acc(acc);
  wgmma_fence();  // the A registers were written by ordinary instructions
  wgmma_rs(acc, ones, (static_cast<uint64_t>(kDescHigh) << 32) | blo, T{}, 0);
#pragma unroll
  for (int kt = 0; kt < kWidth / 16; ++kt)
    wgmma_rs(acc, a[kt],
             (static_cast<uint64_t>(kDescHigh) << 32) |
                 (lo + (((kt / 4) * kPanelBytes + (kt % 4) * 32) >> 4)),
             T{});
  wgmma_commit();
  wgmma_wait<0>();
  fence_acc(acc);
}

// 16-byte global -> shared copy (no zero-fill form), issued only where `pred` holds.
__device__ __forceinline__ void cp_async_16_if(uint32_t dst, const void* src, bool pred) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p cp.async.cg.shared.global [%0], [%1], "
      "16;\n}\n" ::"r"(dst),
      "l"(src), "r"(static_cast<int>(pred))
      : "memory");
}

// relu(lo), relu(hi) rounded and packed in one instruction (cvt.rn.relu: negative -> 0, NaN
// stays NaN as torch.relu keeps it); the first operand of cvt.f16x2 fills the upper half.
template <typename T> __device__ __forceinline__ uint32_t pack2_relu(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2_relu<__half>(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.relu.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
template <> __device__ __forceinline__ uint32_t pack2_relu<__nv_bfloat16>(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.relu.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

}  // namespace mlp_sm90
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <typename T, int kWidth, Activation kAct>
__global__ void __launch_bounds__(wgmma_mlp_max_warpgroups(kWidth, kAct) * 128, 1)
    fused_mlp_wgmma_kernel(const __grid_constant__ MlpKernelParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace mlp_sm90;
  constexpr int kStages = wgmma_mlp_stages(kWidth, kAct);
  constexpr int kKTiles = kWidth / 16;
  constexpr int kPitch = mma_row_pitch(kWidth);   // x ring rows: conflict-free ldmatrix
  constexpr int kSlot = kWgmmaWarpRows * kPitch;  // elements per ring slot
  constexpr int kSlotBytes = kSlot * static_cast<int>(sizeof(T));
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  constexpr int kChunksPerRow = kWidth / kVec;      // 16-byte chunks per padded x / weight row
  constexpr int kRowsPerPass = 32 / kChunksPerRow;  // x rows one cp.async per lane covers
  constexpr int kPassBytes = kRowsPerPass * kPitch * static_cast<int>(sizeof(T));
  constexpr int kLayerBytes = kWidth * kWidth * 2;
  constexpr int kPanelBytes = kWidth * 128;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Swizzled panels need 1024-byte alignment; the plan reserves the slack.
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  unsigned char* weight_smem = smem + p.weight_area_offset;  // the bias panels start at 0
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warpgroup = warp / 4;
  const int warp_in_wg = warp % 4;
  const int num_warpgroups = blockDim.x / 128;
  const int out_pitch = p.out_pitch;
  T* x_ring = reinterpret_cast<T*>(smem + p.act_area_offset +
                                   warp * (kStages * kSlot + kWgmmaWarpRows * out_pitch) *
                                       static_cast<int>(sizeof(T)));
  T* out_smem = x_ring + kStages * kSlot;

  const T* x = static_cast<const T*>(p.x);
  T* out = static_cast<T*>(p.out);
  const int in0 = p.widths[0];
  const int num_layers = p.num_layers;
  const int out_w = p.widths[num_layers];
  const int64_t stride = p.stride_xm;
  const int64_t row_tiles = ceil_div(p.m, kWgmmaTileRows);
  const int64_t full_tiles = p.m / kWgmmaTileRows;  // tiles whose 64 rows all exist
  const int64_t tile_step = static_cast<int64_t>(gridDim.x) * num_warpgroups;
  int64_t tile = static_cast<int64_t>(blockIdx.x) * num_warpgroups + warpgroup;

  auto warp_rows = [&](int64_t row0) {
    const int64_t remaining = p.m - row0;
    return remaining <= 0               ? 0
           : remaining < kWgmmaWarpRows ? static_cast<int>(remaining)
                                        : kWgmmaWarpRows;
  };

  // ---- x staging. Lane l copies the 16-byte chunk at column x_col of rows x_row, x_row +
  // kRowsPerPass, ... of its warp's 16 rows. Fast path (16-byte aligned rows holding whole 16-byte
  // chunks of x): plain 16-byte copies from a pointer that steps by tile_step tiles per call
  // (calls come in tile order), rows past m skipped (their stale values only reach output rows
  // that are never stored), chunks past in0 never copied (zeroed once below).
  const bool x_fast = p.x_vectorized && in0 % kVec == 0;
  const int x_row = lane / kChunksPerRow;
  const int x_col = (lane % kChunksPerRow) * kVec;
  const bool lane_copies = x_col < in0;
  const uint32_t ring_u32 = smem_u32(x_ring);
  const uint32_t ring_lane_u32 = ring_u32 + (x_row * kPitch + x_col) * static_cast<int>(sizeof(T));
  const int64_t x_tile_step = tile_step * kWgmmaTileRows * stride;
  const T* gx = x + (tile * kWgmmaTileRows + warp_in_wg * kWgmmaWarpRows + x_row) * stride + x_col;
  // This warp's 16 rows of 64-row tile `t` into the ring slot at byte offset `slot_off`.
  auto stage_x = [&](int64_t t, int slot_off) {
    if (x_fast) {
      const uint32_t dst = ring_lane_u32 + slot_off;
      if (t < full_tiles) {
#pragma unroll
        for (int i = 0; i < kWgmmaWarpRows / kRowsPerPass; ++i)
          cp_async_16_if(dst + i * kPassBytes, gx + i * kRowsPerPass * stride, lane_copies);
      } else if (t < row_tiles) {
        const int rows = warp_rows(t * kWgmmaTileRows + warp_in_wg * kWgmmaWarpRows);
#pragma unroll
        for (int i = 0; i < kWgmmaWarpRows / kRowsPerPass; ++i)
          cp_async_16_if(dst + i * kPassBytes, gx + i * kRowsPerPass * stride,
                         lane_copies && x_row + i * kRowsPerPass < rows);
      }
      gx += x_tile_step;
      return;
    }
    if (t >= row_tiles) return;
    const int64_t row0 = t * kWgmmaTileRows + warp_in_wg * kWgmmaWarpRows;
    const int rows = warp_rows(row0);
    T* buf = reinterpret_cast<T*>(reinterpret_cast<unsigned char*>(x_ring) + slot_off);
    if (p.x_vectorized) {  // in0 not a multiple of 16 bytes: zero-filling copies
      const T* g = x + (row0 + x_row) * stride + x_col;
      const int x_bytes = max(0, min(in0 - x_col, kVec)) * static_cast<int>(sizeof(T));
#pragma unroll
      for (int i = 0; i < kWgmmaWarpRows / kRowsPerPass; ++i) {
        const int r = x_row + i * kRowsPerPass;
        const int bytes = r < rows ? x_bytes : 0;
        const T* chunk = g + i * kRowsPerPass * stride;
        if (partial_tail_chunk<T>(r, rows, bytes / static_cast<int>(sizeof(T)),
                                  row0 + rows == p.m)) {
          copy_partial_chunk(buf + r * kPitch + x_col, chunk, bytes / static_cast<int>(sizeof(T)));
          continue;
        }
        // A zero-byte copy reads nothing, but still gets a mapped address.
        cp_async_16(buf + r * kPitch + x_col, bytes > 0 ? static_cast<const void*>(chunk) : p.x,
                    bytes);
      }
    } else {  // 8- or 4-byte copies where x's rows allow (in0 = 100 fp16: 200-byte rows)
      const T* src = rows > 0 ? x + row0 * stride : x;
      stage_tile_narrow<T>(buf, kPitch, src, stride, rows, in0, kWgmmaWarpRows, kWidth, x, lane,
                           32);
    }
  };

  // ---- prologue: weights (swizzled panels) for the whole block, then each warp's ring, then the
  // bias panels (plain loads: issued after the x copies, so their latency overlaps)
  for (int layer = 0; layer < num_layers; ++layer) {
    const T* w = static_cast<const T*>(p.weights[layer]);
    const int in = p.widths[layer], out_l = p.widths[layer + 1];
    unsigned char* dst = weight_smem + layer * kLayerBytes;
    // A compact last layer (the plan's last_panel_rows) keeps only the rows its wgmma reads, in
    // panels of that many rows; every other layer is padded to kWidth rows.
    const int panel_rows =
        layer == num_layers - 1 && p.last_panel_rows > 0 ? p.last_panel_rows : kWidth;
    const int panel_bytes = panel_rows * 128;
    if (is_aligned16(w) && (in * static_cast<int>(sizeof(T))) % 16 == 0) {
      for (int i = threadIdx.x; i < panel_rows * kChunksPerRow; i += blockDim.x) {
        const int n = i / kChunksPerRow;
        const int c = i % kChunksPerRow;  // 16-byte chunk along k
        const int valid = n < out_l ? max(0, min(in - c * kVec, kVec)) : 0;
        const void* g = valid > 0 ? static_cast<const void*>(w + n * in + c * kVec)
                                  : static_cast<const void*>(w);
        cp_async_16(dst + (c / 8) * panel_bytes + n * 128 + (((c % 8) ^ (n % 8)) << 4), g,
                    valid * static_cast<int>(sizeof(T)));
      }
    } else if (const int piece_bytes = copy_piece_bytes(w, in * static_cast<int>(sizeof(T)),
                                                        in * static_cast<int>(sizeof(T)));
               piece_bytes > 0) {
      // Rows aligned to 8 or 4 bytes: cp.async pieces of a 16-byte chunk, zero-filled as above.
      const int piece = piece_bytes / static_cast<int>(sizeof(T));
      const int per_chunk = kVec / piece;
      for (int i = threadIdx.x; i < panel_rows * kChunksPerRow * per_chunk; i += blockDim.x) {
        const int n = i / (kChunksPerRow * per_chunk);
        const int j = i - n * (kChunksPerRow * per_chunk);
        const int c = j / per_chunk, h = j - c * per_chunk;  // chunk along k, piece in it
        const int k = c * kVec + h * piece;
        const bool valid = n < out_l && k < in;
        const void* g =
            valid ? static_cast<const void*>(w + n * in + k) : static_cast<const void*>(w);
        cp_async_piece(
            dst + (c / 8) * panel_bytes + n * 128 + (((c % 8) ^ (n % 8)) << 4) + h * piece_bytes, g,
            piece_bytes, valid);
      }
    } else {
      for (int e = threadIdx.x; e < panel_rows * kWidth; e += blockDim.x) {
        const int n = e / kWidth, k = e % kWidth;
        const T v = (n < out_l && k < in) ? w[n * in + k] : from_float<T>(0.f);
        *reinterpret_cast<T*>(dst + (k / 64) * panel_bytes + n * 128 +
                              ((((k % 64) / 8) ^ (n % 8)) << 4) + (k % 8) * 2) = v;
      }
    }
  }
  cp_async_commit();
  if (x_fast && in0 < kWidth) {
    // Zero the padding chunks (columns >= in0) of every slot once; copies never touch them.
    for (int i = lane; i < kStages * kWgmmaWarpRows * kChunksPerRow; i += 32) {
      const int row = i / kChunksPerRow, c = i % kChunksPerRow;
      if (c * kVec >= in0)
        *reinterpret_cast<uint4*>(x_ring + row * kPitch + c * kVec) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    stage_x(tile + s * tile_step, s * kSlotBytes);
    cp_async_commit();
  }
  {
    // Bias panels (K-major, 128-byte swizzle like the weights): layer l's block is k columns
    // 16 (l % 4) .. + 15 of panel l / 4, its first column the bias (zero past the layer's width
    // or without bias), the rest zero. Whole 16-byte chunks, each written once.
    const int panels = (num_layers + 3) / 4;
    for (int i = threadIdx.x; i < panels * kWidth * 8; i += blockDim.x) {
      const int panel = i / (kWidth * 8), n = (i / 8) % kWidth, kc = i % 8;  // kc: 8-column chunk
      const int layer = 4 * panel + kc / 2;
      uint32_t first = 0;
      if (kc % 2 == 0 && layer < num_layers && n < p.widths[layer + 1] &&
          p.biases[layer] != nullptr)
        first = static_cast<const unsigned short*>(p.biases[layer])[n];
      *reinterpret_cast<uint4*>(smem + panel * kPanelBytes + n * 128 + ((kc ^ (n % 8)) << 4)) =
          make_uint4(first, 0u, 0u, 0u);
    }
  }
  cp_async_wait<kStages>();  // the weights (the oldest group) have landed
  fence_proxy_async();
  __syncthreads();

  const uint32_t desc_w = desc_low(smem_u32(weight_smem));
  const uint32_t desc_b = desc_low(smem_u32(smem));
  auto weight_desc = [&](int layer) { return desc_w + ((layer * kLayerBytes) >> 4); };
  auto bias_desc = [&](int layer) {
    return desc_b + (((layer / 4) * kPanelBytes + (layer % 4) * 32) >> 4);
  };
  const int quad_col = 2 * (lane % 4);
  const int q_row = lane / 4;

  // Activation + down-cast of a hidden layer's accumulators into the next layer's A.
  auto epilogue = [&](const float (&acc)[kWidth / 2], uint32_t (&a)[kKTiles][4], int layer) {
    // Columns past the layer's width must be exactly 0 for the next layer: with an inf input,
    // their zero weights give inf * 0 = NaN.
    const int width = p.widths[layer + 1];
    const bool mask = width < kWidth;
    const int keep_below =
        width - quad_col;  // this thread's column j + quad_col is kept iff j < this
#pragma unroll
    for (int kt = 0; kt < kKTiles; ++kt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float lo = acc[8 * kt + 2 * i], hi = acc[8 * kt + 2 * i + 1];
        if constexpr (kAct == Activation::kRelu) {
          a[kt][i] = pack2_relu<T>(lo, hi);
        } else {
          a[kt][i] = pack2<T>(apply_activation_16bit<kAct>(lo), apply_activation_16bit<kAct>(hi));
        }
      }
      if (mask) {
        // Register i holds columns 16 kt + 8 (i / 2) + quad_col, +1 (compared against
        // keep_below with immediates: per-lane column values hoisted out of the loops held
        // 24 registers).
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int j = kt * 16 + half * 8;
          const uint32_t keep =
              (j < keep_below ? 0xffffu : 0u) | (j + 1 < keep_below ? 0xffff0000u : 0u);
          a[kt][2 * half] &= keep;
          a[kt][2 * half + 1] &= keep;
        }
      }
    }
  };

  // Last layer: no activation; N just covers the output width. Outputs of at most 16 columns go
  // from the accumulators straight to global memory (a thread holds columns quad_col, +1, +8, +9
  // of rows lane / 4 and lane / 4 + 8); wider ones through the warp's staging rows.
  const int last = num_layers - 1;
  const bool out_pairs = out_w % 2 == 0 && (reinterpret_cast<uintptr_t>(out) & 3) == 0;
  const bool out_quads = out_w % 4 == 0 && (reinterpret_cast<uintptr_t>(out) & 7) == 0;
  auto last_layer = [&](const uint32_t (&a)[kKTiles][4], int64_t row0) {
    const int rows = warp_rows(row0);
    T* out_rows = out + row0 * out_w;
    auto wide = [&](auto n_tag) {
      constexpr int kN = decltype(n_tag)::value;
      float acc[kN / 2];
      if (p.last_panel_rows == kN)
        wgmma_layer<T, kN, kWidth, kN>(acc, a, weight_desc(last), bias_desc(last));
      else
        wgmma_layer<T, kN, kWidth>(acc, a, weight_desc(last), bias_desc(last));
      uint32_t o[1][kN / 16][4];
#pragma unroll
      for (int kt = 0; kt < kN / 16; ++kt)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          o[0][kt][i] = pack2<T>(acc[8 * kt + 2 * i], acc[8 * kt + 2 * i + 1]);
      store_warp_rows<T, 1, kN / 16>(o, p, out_smem, out_rows, rows, lane);
    };
    if (out_w <= 16) {
      float acc[8];
      if (p.last_panel_rows == 16)
        wgmma_layer<T, 16, kWidth, 16>(acc, a, weight_desc(last), bias_desc(last));
      else
        wgmma_layer<T, 16, kWidth>(acc, a, weight_desc(last), bias_desc(last));
      const uint32_t lo0 = pack2<T>(acc[0], acc[1]), lo1 = pack2<T>(acc[4], acc[5]);  // row lo
      const uint32_t hi0 = pack2<T>(acc[2], acc[3]), hi1 = pack2<T>(acc[6], acc[7]);  // row lo + 8
      const bool lo_ok = q_row < rows, hi_ok = q_row + 8 < rows;
      if (out_quads) {
        // Lane pairs swap one word per row so that each lane writes 4 consecutive columns (a
        // row's 32 bytes in one instruction): even lanes columns quad_col .. + 3, odd lanes
        // quad_col + 6 .. + 9.
        const bool even = (lane & 1) == 0;
        const uint32_t lo_in = __shfl_xor_sync(0xffffffffu, even ? lo1 : lo0, 1);
        const uint32_t hi_in = __shfl_xor_sync(0xffffffffu, even ? hi1 : hi0, 1);
        const int col = even ? quad_col : quad_col + 6;
        if (col < out_w) {
          T* o = out_rows + q_row * out_w + col;
          if (lo_ok)
            *reinterpret_cast<uint2*>(o) = even ? make_uint2(lo0, lo_in) : make_uint2(lo_in, lo1);
          if (hi_ok)
            *reinterpret_cast<uint2*>(o + 8 * out_w) =
                even ? make_uint2(hi0, hi_in) : make_uint2(hi_in, hi1);
        }
        return;
      }
      T* o_lo = out_rows + q_row * out_w + quad_col;
      T* o_hi = o_lo + 8 * out_w;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint32_t lo = j == 0 ? lo0 : lo1, hi = j == 0 ? hi0 : hi1;
        const int col = 8 * j + quad_col;
        if (out_pairs) {
          if (col < out_w) {
            if (lo_ok) *reinterpret_cast<uint32_t*>(o_lo + 8 * j) = lo;
            if (hi_ok) *reinterpret_cast<uint32_t*>(o_hi + 8 * j) = hi;
          }
        } else {
          unsigned short* lo16 = reinterpret_cast<unsigned short*>(o_lo + 8 * j);
          unsigned short* hi16 = reinterpret_cast<unsigned short*>(o_hi + 8 * j);
          if (col < out_w) {
            if (lo_ok) lo16[0] = static_cast<unsigned short>(lo);
            if (hi_ok) hi16[0] = static_cast<unsigned short>(hi);
          }
          if (col + 1 < out_w) {
            if (lo_ok) lo16[1] = static_cast<unsigned short>(lo >> 16);
            if (hi_ok) hi16[1] = static_cast<unsigned short>(hi >> 16);
          }
        }
      }
    } else if (out_w <= 32) {
      wide(std::integral_constant<int, 32>{});
    } else if constexpr (kWidth == 64) {
      wide(std::integral_constant<int, 64>{});
    } else if (out_w <= 64) {
      wide(std::integral_constant<int, 64>{});
    } else {
      wide(std::integral_constant<int, 128>{});
    }
  };

  // ---- the tiles
  const uint32_t a_lane_u32 =
      ring_u32 + ((lane % 16) * kPitch + (lane / 16) * 8) * static_cast<int>(sizeof(T));
  int slot_off = 0;  // bytes
  for (; tile < row_tiles; tile += tile_step) {
    const int64_t row0 = tile * kWgmmaTileRows + warp_in_wg * kWgmmaWarpRows;
    cp_async_wait<kStages - 1>();  // this tile's group: the oldest of the kStages in flight
    __syncwarp();
    uint32_t a[kKTiles][4];
#pragma unroll
    for (int kt = 0; kt < kKTiles; ++kt) ldmatrix_x4_u32(a[kt], a_lane_u32 + slot_off + kt * 32);
    __syncwarp();  // every lane has read the slot: refill it with the tile kStages ahead
    stage_x(tile + kStages * tile_step, slot_off);
    cp_async_commit();
    slot_off = slot_off + kSlotBytes == kStages * kSlotBytes ? 0 : slot_off + kSlotBytes;

    // Unrolled: every layer's descriptors and width are compile-time offsets.
#pragma unroll
    for (int layer = 0; layer < kMaxMlpLayers - 1; ++layer) {
      if (layer + 1 >= num_layers) break;
      float acc[kWidth / 2];
      wgmma_layer<T, kWidth, kWidth>(acc, a, weight_desc(layer), bias_desc(layer));
      epilogue(acc, a, layer);
    }
    last_layer(a, row0);
  }
  cp_async_wait<0>();  // no copy may still target shared memory when the block exits
#elif defined(__CUDA_ARCH__)
  // Built for a target without wgmma: the planner never launches this kernel off compute
  // capability 9.0, so an sm_90 image without the "a" features is a build error made loud.
  __trap();
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// ------------------------------------------------------------------ host side
// Shared memory of fused_mlp_wgmma_kernel, from a 1024-byte-aligned base (1024 bytes of slack are
// added for aligning the dynamic base): the bias panels at 0 (one kWidth x 64 k panel per 4
// layers), the weights at weight_area_offset (layers x kWidth x kWidth), then per warp a
// kStages-deep x ring (slots of 16 rows x mma_row_pitch(kWidth)) followed by its 16 output
// staging rows (out_pitch).
struct WgmmaMlpSmem {
  int weight_area_offset, act_area_offset, per_warp_bytes;
  int bytes(int warpgroups) const {
    return 1024 + act_area_offset + warpgroups * 4 * per_warp_bytes;
  }
};

// last_rows: the last layer's weight rows in shared memory (width, or its wgmma N when compact).
inline WgmmaMlpSmem wgmma_mlp_smem(int width, Activation act, int num_layers, int out_pitch,
                                   int last_rows) {
  constexpr int kElem = 2;
  WgmmaMlpSmem s;
  s.weight_area_offset = (num_layers + 3) / 4 * width * 128;
  s.act_area_offset = s.weight_area_offset + ((num_layers - 1) * width + last_rows) * width * kElem;
  s.per_warp_bytes =
      (wgmma_mlp_stages(width, act) * mma_row_pitch(width) + out_pitch) * kWgmmaWarpRows * kElem;
  return s;
}

template <typename T, int kWidth> struct WgmmaPick {
  template <Activation kAct> struct By {
    static KernelFn kernel() { return fused_mlp_wgmma_kernel<T, kWidth, kAct>; }
  };
};

template <typename T> KernelFn pick_wgmma_kernel(int bucket, Activation act) {
  return bucket == 64 ? pick_by_activation<WgmmaPick<T, 64>::template By>(act)
                      : pick_by_activation<WgmmaPick<T, 128>::template By>(act);
}

// The compact last layer is on unless DUALK_MLP_COMPACT_LAST=0 (read once per process: the
// A/B switch of experiments/compact_probe.py and the tests).
inline bool compact_last_layer_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("DUALK_MLP_COMPACT_LAST");
    return v == nullptr || v[0] != '0';
  }();
  return on;
}

}  // namespace

bool plan_fused_mlp_wgmma(const FusedMlpArgs& a, int bucket, int smem_limit, MlpKernelParams& p,
                          KernelFn& kernel, int& threads, int& smem) {
  if (bucket != 64 && bucket != 128) return false;
  if (!device_is_sm90()) return false;
  const int max_warpgroups = wgmma_mlp_max_warpgroups(bucket, a.activation);
  auto fitting = [&](const WgmmaMlpSmem& layout) {
    int warpgroups = max_warpgroups;
    while (warpgroups > 0 && layout.bytes(warpgroups) > smem_limit) --warpgroups;
    return warpgroups;
  };
  WgmmaMlpSmem s = wgmma_mlp_smem(bucket, a.activation, a.num_layers, p.out_pitch, bucket);
  int warpgroups = fitting(s);
  p.last_panel_rows = 0;
  if (warpgroups < max_warpgroups && compact_last_layer_enabled()) {
    // The last layer's panels with only the rows its wgmma reads: 128-128-128-128-128-16 (5
    // layers, tiny-cuda-nn's shape) takes 3 warpgroups instead of 1 (the padded 16 x 128 layer
    // alone is 32 KB; issue 36's CUDA 751 us against Triton's 306).
    const int out_w = a.widths[a.num_layers];
    const int n_last = out_w <= 16 ? 16 : out_w <= 32 ? 32 : out_w <= 64 ? 64 : bucket;
    const WgmmaMlpSmem compact =
        wgmma_mlp_smem(bucket, a.activation, a.num_layers, p.out_pitch, n_last);
    if (const int more = fitting(compact); more > warpgroups) {
      s = compact;
      warpgroups = more;
      p.last_panel_rows = n_last;
    }
  }
  if (warpgroups == 0) return false;
  p.weight_area_offset = s.weight_area_offset;
  p.act_area_offset = s.act_area_offset;
  p.act_pitch = mma_row_pitch(bucket);
  // Block tiles (for the launcher's grid size): warpgroups x 64 rows.
  p.num_tiles = ceil_div(a.m, static_cast<int64_t>(warpgroups) * kWgmmaTileRows);
  threads = warpgroups * 128;
  smem = s.bytes(warpgroups);
  kernel = a.dtype == DType::kFloat16 ? pick_wgmma_kernel<__half>(bucket, a.activation)
                                      : pick_wgmma_kernel<__nv_bfloat16>(bucket, a.activation);
  return true;
}

}  // namespace mlp
}  // namespace dualk
