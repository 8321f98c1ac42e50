// Definitions shared by the fused_mlp translation units (fused_mlp.cu: planner, launcher and the
// fp32 SIMT kernel; fused_mlp_mma.cu: the fp16/bf16 mma.sync kernels; fused_mlp_sm90.cu: the
// Hopper wgmma kernel; fused_mlp_tf32.cu: the Hopper fp32 3xTF32 kernel; fused_mlp_wide.cu: the
// Hopper kernel for 16-bit widths 129-256, declared in fused_mlp_wide.cuh). One file would take
// over a minute to compile for sm_90a; five compile in parallel.
#pragma once

#include <cstdint>

#include "common.cuh"

namespace dualk {
namespace mlp {

constexpr int kMaxOnChipWidth = 256;
constexpr int kSimtThreads = 256;

__host__ __device__ constexpr int round_up(int value, int multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// A shared-memory row pitch whose size in 16-byte units is odd: 8 consecutive rows then start in
// 8 distinct 16-byte bank groups, so ldmatrix and LDS.128 over consecutive rows are conflict-free.
//   fp16/bf16 rows (cols_pad16 a multiple of 16 elements = 32 bytes): + 8 elements.
__host__ __device__ constexpr int mma_row_pitch(int cols_pad16) { return cols_pad16 + 8; }
//   fp32 rows: round to 4 floats (16 bytes), then + 4 floats if the 16-byte count is even.
__host__ __device__ constexpr int simt_row_pitch(int cols) {
  return (round_up(cols, 4) / 4) % 2 == 1 ? round_up(cols, 4) : round_up(cols, 4) + 4;
}

// Everything the kernels need, computed once on the host by plan_fused_mlp.
struct MlpKernelParams {
  const void* x;
  int64_t stride_xm;
  void* out;
  int64_t m;
  int64_t num_tiles;
  int num_layers;
  int widths[kMaxMlpLayers + 1];
  const void* weights[kMaxMlpLayers];
  const void* biases[kMaxMlpLayers];
  int weight_offset[kMaxMlpLayers];  // elements from the start of the weight area (per group)
  int weight_pitch[kMaxMlpLayers];   // elements per shared-memory weight row
  int bias_offset[kMaxMlpLayers];    // floats from the start of the bias area
  int group_first_layer[kMaxMlpLayers + 1];  // mma kernel: group g = layers [first[g], first[g+1])
  int num_groups;
  int weight_area_offset;  // bytes; the bias area starts at 0
  int act_area_offset;     // bytes; mma: per-warp x buffers, simt: the two activation buffers
  int act_pitch;           // elements per activation-buffer row
  int tile_rows;           // simt: rows per block tile (2, or a multiple of 4)
  int k_slab;              // simt: 0 = all weights resident, else k columns streamed per pass
  int slab_pitch;          // simt: pitch of a streamed slab
  bool x_vectorized;       // x and its row stride allow 16-byte cp.async
  int out_pitch;           // mma: elements per output staging row
  bool out_vectorized;     // mma: out 16-byte aligned and its rows a multiple of 16 bytes
  int out_chunks_shift;  // padded mma: log2(16-byte chunks per output row), -1 if not a power of 2
  int last_chunks;       // padded mma: 32-column chunks of the last layer
  bool bulk_weights;     // simt, resident: weight rows arrive by sm_90 bulk copies (see below)
  int barrier_offset;    // bytes; simt with bulk_weights: one mbarrier per layer
  int last_panel_rows;   // sm90 wgmma: rows of the last layer's weight panels (0: kWidth, padded)
};

// A 16-byte chunk holding only `elems` (< 16 bytes' worth) real elements at the end of a tensor's
// last row, whose 16-byte window may pass the end of the tensor. cp.async with a short src-size
// reads only the real bytes, but memcheck flags the window and no access should leave the tensor:
// plain loads instead, zero-padded to the chunk (visible after the caller's barrier, as cp.async
// data is). Other rows' windows end inside the next row, within the tensor. Once per kernel, so
// the loads are not unrolled (no registers held across them).
template <typename T>
__device__ __forceinline__ void copy_partial_chunk(T* smem_dst, const T* src, int elems) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
#pragma unroll 1
  for (int k = 0; k < kVec; ++k) smem_dst[k] = k < elems ? src[k] : from_float<T>(0.f);
}

// True when the chunk of row r (of a tile's `rows` valid rows; `tile_ends_tensor`: its last valid
// row is the tensor's last row) with `elems` real elements must take copy_partial_chunk.
template <typename T>
__device__ __forceinline__ bool partial_tail_chunk(int r, int rows, int elems,
                                                   bool tile_ends_tensor) {
  return tile_ends_tensor && r == rows - 1 && elems > 0 && elems < 16 / static_cast<int>(sizeof(T));
}

// Copies the top-left rows x cols of a row-major global matrix (row stride ld) into a
// rows_pad x cols_pad shared tile (row pitch `pitch`), zero-filling everything outside, with
// threads [thread, num_threads) sharing the work. Vectorized: 16-byte cp.async per chunk (src and
// ld*sizeof(T) 16-byte aligned, cols_pad a multiple of 16/sizeof(T)); the caller commits and
// waits (`tile_ends_tensor`: the tile's last valid row is the tensor's last, whose partial chunk
// takes plain loads, see copy_partial_chunk). Otherwise plain element copies, complete once the
// caller's barrier passes.
template <typename T>
__device__ __forceinline__ void stage_tile(T* smem, int pitch, const T* src, int64_t ld, int rows,
                                           int cols, int rows_pad, int cols_pad,
                                           const void* safe_src, bool tile_ends_tensor,
                                           bool vectorized, int thread, int num_threads) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  if (vectorized) {
    const int chunks_per_row = cols_pad / kVec;
    const int total = rows_pad * chunks_per_row;
    for (int i = thread; i < total; i += num_threads) {
      const int r = i / chunks_per_row;
      const int c = (i - r * chunks_per_row) * kVec;
      const int valid = r < rows ? max(0, min(cols - c, kVec)) : 0;
      const T* chunk = src + r * ld + c;
      if (partial_tail_chunk<T>(r, rows, valid, tile_ends_tensor)) {
        copy_partial_chunk(smem + r * pitch + c, chunk, valid);
        continue;
      }
      // A zero-byte copy reads nothing, but still gets a mapped address.
      const void* g = valid > 0 ? static_cast<const void*>(chunk) : safe_src;
      cp_async_16(smem + r * pitch + c, g, valid * static_cast<int>(sizeof(T)));
    }
  } else {
    const int total = rows_pad * cols_pad;
    for (int i = thread; i < total; i += num_threads) {
      const int r = i / cols_pad;
      const int c = i - r * cols_pad;
      smem[r * pitch + c] = (r < rows && c < cols) ? src[r * ld + c] : from_float<T>(0.f);
    }
  }
}

// The widest copy, 8 or 4 bytes, that rows starting at `src` with `row_bytes` between them can
// take whole: src, row_bytes and a row's `cols_bytes` all multiples of it (no copy passes a
// row's end); 0 when none (2-byte rows: element copies). Rows of 16-byte multiples take the
// 16-byte paths before this is asked. The seed's 100-wide fp16 input (200-byte rows) took element
// copies: its weights' prologue made the sm90 kernel 3x slower (16 against 5.4 us, H200).
__device__ __forceinline__ int copy_piece_bytes(const void* src, int64_t row_bytes,
                                                int cols_bytes) {
  const uint64_t bits = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(src)) |
                        static_cast<uint64_t>(row_bytes) | static_cast<uint64_t>(cols_bytes);
  return (bits & 7) == 0 ? 8 : (bits & 3) == 0 ? 4 : 0;
}

// One cp.async of `piece_bytes` (8 or 4, copy_piece_bytes); src_bytes 0 writes zeros.
__device__ __forceinline__ void cp_async_piece(void* smem_dst, const void* gmem_src,
                                               int piece_bytes, bool valid) {
  if (piece_bytes == 8)
    cp_async_8(smem_dst, gmem_src, valid ? 8 : 0);
  else
    cp_async_4(smem_dst, gmem_src, valid ? 4 : 0);
}

// stage_tile for rows that do not allow 16-byte copies: 8- or 4-byte cp.async pieces where the
// rows allow them (copy_piece_bytes; the caller commits and waits, as for the vectorized path),
// else element copies; the same rows_pad x cols_pad zero-filled tile (cols_pad and pitch
// multiples of 16 bytes). `src` is the tile's first row; `base` the tensor's (its alignment).
template <typename T>
__device__ __forceinline__ void stage_tile_narrow(T* smem, int pitch, const T* src, int64_t ld,
                                                  int rows, int cols, int rows_pad, int cols_pad,
                                                  const T* base, int thread, int num_threads) {
  constexpr int kElem = static_cast<int>(sizeof(T));
  const int piece_bytes = copy_piece_bytes(base, ld * kElem, cols * kElem);
  if (piece_bytes == 0) {
    stage_tile<T>(smem, pitch, src, ld, rows, cols, rows_pad, cols_pad, base, true, false, thread,
                  num_threads);
    return;
  }
  const int piece = piece_bytes / kElem;
  const int per_row = cols_pad / piece;
  const int total = rows_pad * per_row;
#pragma unroll 1
  for (int i = thread; i < total; i += num_threads) {
    const int r = i / per_row;
    const int c = (i - r * per_row) * piece;
    const bool valid = r < rows && c < cols;
    const void* g =
        valid ? static_cast<const void*>(src + r * ld + c) : static_cast<const void*>(base);
    cp_async_piece(smem + r * pitch + c, g, piece_bytes, valid);
  }
}

// cp.async.wait_group takes an immediate; layers are runtime, so switch over the few cases.
__device__ __forceinline__ void cp_async_wait_dynamic(int pending) {
  switch (pending) {
    case 0:
      cp_async_wait<0>();
      break;
    case 1:
      cp_async_wait<1>();
      break;
    case 2:
      cp_async_wait<2>();
      break;
    case 3:
      cp_async_wait<3>();
      break;
    case 4:
      cp_async_wait<4>();
      break;
    case 5:
      cp_async_wait<5>();
      break;
    case 6:
      cp_async_wait<6>();
      break;
    default:
      cp_async_wait<7>();
      break;
  }
}

// All biases, as fp32, zero beyond each layer's width up to its padded width.
template <typename T>
__device__ __forceinline__ void load_biases(const MlpKernelParams& p, float* bias_smem, int pad) {
  for (int layer = 0; layer < p.num_layers; ++layer) {
    const int out = p.widths[layer + 1];
    const int out_pad = round_up(out, pad);
    const T* bias = static_cast<const T*>(p.biases[layer]);
    for (int c = threadIdx.x; c < out_pad; c += blockDim.x)
      bias_smem[p.bias_offset[layer] + c] = (bias != nullptr && c < out) ? to_float(bias[c]) : 0.f;
  }
}

// The same for fp32 biases, by cp.async: all layers' loads in flight at once instead of one
// global-load latency per layer (~0.75 us for the seed model's three, H200). The caller commits
// and waits; `safe_src` is any mapped address (zero-byte copies still need one).
__device__ __forceinline__ void load_biases_async(const MlpKernelParams& p, float* bias_smem,
                                                  int pad, const void* safe_src) {
  for (int layer = 0; layer < p.num_layers; ++layer) {
    const int out = p.widths[layer + 1];
    const float* bias = static_cast<const float*>(p.biases[layer]);
    for (int c = threadIdx.x; c < round_up(out, pad); c += blockDim.x) {
      const bool valid = bias != nullptr && c < out;
      cp_async_4(bias_smem + p.bias_offset[layer] + c, valid ? bias + c : safe_src, valid ? 4 : 0);
    }
  }
}

// ============================================================== fp16 / bf16: tensor cores
// Padding of the mma kernel's shared-memory tiles: k (a layer's input width) to 64 columns, so the
// k loop branches only once per 4 k-tiles (never for the 64 bucket); n (output width) to 32 rows,
// so every 32-column output chunk runs both of its 16-row ldmatrix/mma halves without a branch.
// The padding is zeros: zero weights and zero bias give act(0) = 0 in padded columns, which then
// meet zero weights in the next layer.
constexpr int kMmaKPad = 64;
constexpr int kMmaNPad = 32;
constexpr int kMaxMmaWarps = 8;

template <int kMaxWidth> struct MmaConfig;
// 32 rows per warp: each B fragment read from shared memory feeds two mma (half the shared-memory
// traffic per flop of 16 rows); capped at 128 registers for 2 blocks of 8 warps per SM.
template <> struct MmaConfig<64> {
  static constexpr int kMTiles = 2, kMinBlocks = 2;
};
// act + next activations take 2 x 64 registers: one block of 8 warps per SM.
template <> struct MmaConfig<128> {
  static constexpr int kMTiles = 2, kMinBlocks = 1;
};
// 16 rows per warp keeps act + next at 2 x 64 registers.
template <> struct MmaConfig<256> {
  static constexpr int kMTiles = 1, kMinBlocks = 1;
};

// ---- the register-resident chaining of the mma.sync kernels (fused_mlp_mma.cu), per 32-column
// chunk of a layer's outputs: acc[mt][j] (j = 0..3) holds the chunk's n-tiles j as C fragments.

// acc += the activations' k-tile kt times the chunk's 32 weight rows, read from shared memory at
// w_lo (rows 0-15 of the chunk, columns 16 kt..) and w_hi (rows 16-31).
template <typename T, int kMTiles, int kKTiles>
__device__ __forceinline__ void mma_chunk_k_tile(float (&acc)[kMTiles][4][4],
                                                 const uint32_t (&act)[kMTiles][kKTiles][4], int kt,
                                                 const T* w_lo, const T* w_hi) {
  uint32_t b[2][4];
  ldmatrix_x4(b[0], w_lo);
  ldmatrix_x4(b[1], w_hi);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t b_lo[2] = {b[h][0], b[h][1]};
    const uint32_t b_hi[2] = {b[h][2], b[h][3]};
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      mma_16816<T>(acc[mt][2 * h], act[mt][kt], b_lo);
      mma_16816<T>(acc[mt][2 * h + 1], act[mt][kt], b_hi);
    }
  }
}

// C fragments of n-tiles (2q, 2q+1) (q = 0, 1) = the A fragment of next k-tile 2*chunk + q,
// g = quad_row, 2t = quad_col:
//   a0 = (row g, k 2t..2t+1) = C(2q)[0,1]      a1 = (row g+8, k 2t..) = C(2q)[2,3]
//   a2 = (row g, k 8+2t..)   = C(2q+1)[0,1]    a3 = (row g+8, k 8+2t..) = C(2q+1)[2,3]
template <typename T, int kKTiles>
__device__ __forceinline__ void pack_chunk(uint32_t (&next)[kKTiles][4], int chunk,
                                           const float (&acc)[4][4]) {
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    next[2 * chunk + q][0] = pack2<T>(acc[2 * q][0], acc[2 * q][1]);
    next[2 * chunk + q][1] = pack2<T>(acc[2 * q][2], acc[2 * q][3]);
    next[2 * chunk + q][2] = pack2<T>(acc[2 * q + 1][0], acc[2 * q + 1][1]);
    next[2 * chunk + q][3] = pack2<T>(acc[2 * q + 1][2], acc[2 * q + 1][3]);
  }
}

// A chunk past the layer's width: zeros, which the next layer's k padding expects.
template <int kMTiles, int kKTiles>
__device__ __forceinline__ void zero_chunk(uint32_t (&next)[kMTiles][kKTiles][4], int chunk) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
      for (int i = 0; i < 4; ++i) next[mt][2 * chunk + q][i] = 0u;
}

template <int kMTiles, int kKTiles>
__device__ __forceinline__ void copy_fragments(uint32_t (&dst)[kMTiles][kKTiles][4],
                                               const uint32_t (&src)[kMTiles][kKTiles][4]) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int kt = 0; kt < kKTiles; ++kt)
#pragma unroll
      for (int i = 0; i < 4; ++i) dst[mt][kt][i] = src[mt][kt][i];
}

__device__ __forceinline__ void store_shared_u32(void* smem, uint32_t v) {
  *reinterpret_cast<uint32_t*>(smem) = v;
}

// A warp's output rows: its register-resident fragments (act[mt][kt]: rows 16 mt.., columns
// 16 kt.., in the m16k16 A layout) -> its staging rows in shared memory -> `out_rows` as whole
// rows (the warp's rows are contiguous in `out`), 16-byte vectors where the width and pointer
// allow, indexed by shifts when a row holds a power-of-two number of them.
template <typename T, int kMTiles, int kKTiles>
__device__ __forceinline__ void store_warp_rows(const uint32_t (&act)[kMTiles][kKTiles][4],
                                                const MlpKernelParams& p, T* out_smem, T* out_rows,
                                                int rows, int lane) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  const int out_w = p.widths[p.num_layers];
  const int out_pitch = p.out_pitch;
  const int out_tiles = round_up(out_w, 16) / 16;
  const int quad_row = lane / 4;
  const int quad_col = 2 * (lane % 4);
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int kt = 0; kt < kKTiles; ++kt) {
      if (kt < out_tiles) {
        T* lo = out_smem + (mt * 16 + quad_row) * out_pitch + kt * 16 + quad_col;
        T* hi = lo + 8 * out_pitch;
        store_shared_u32(lo, act[mt][kt][0]);
        store_shared_u32(hi, act[mt][kt][1]);
        store_shared_u32(lo + 8, act[mt][kt][2]);
        store_shared_u32(hi + 8, act[mt][kt][3]);
      }
    }
  __syncwarp();
  if (p.out_vectorized && p.out_chunks_shift >= 0) {
    const int shift = p.out_chunks_shift;
    const int mask_c = (1 << shift) - 1;
    for (int i = lane; i < (rows << shift); i += 32) {
      const int r = i >> shift;
      const int c = (i & mask_c) * kVec;
      *reinterpret_cast<uint4*>(out_rows + static_cast<int64_t>(r) * out_w + c) =
          *reinterpret_cast<const uint4*>(out_smem + r * out_pitch + c);
    }
  } else if (p.out_vectorized) {
    const int chunks_per_row = out_w / kVec;
    for (int i = lane; i < rows * chunks_per_row; i += 32) {
      const int r = i / chunks_per_row;
      const int c = (i - r * chunks_per_row) * kVec;
      *reinterpret_cast<uint4*>(out_rows + static_cast<int64_t>(r) * out_w + c) =
          *reinterpret_cast<const uint4*>(out_smem + r * out_pitch + c);
    }
  } else {
    for (int i = lane; i < rows * out_w; i += 32) {
      const int r = i / out_w;
      const int c = i - r * out_w;
      out_rows[static_cast<int64_t>(r) * out_w + c] = out_smem[r * out_pitch + c];
    }
  }
}

using KernelFn = void (*)(MlpKernelParams);

// Pick<act>::kernel() for a runtime activation (any kernel pointer type: KernelFn, Tf32KernelFn).
template <template <Activation> class Pick>
auto pick_by_activation(Activation act) -> decltype(Pick<Activation::kNone>::kernel()) {
  switch (act) {
    case Activation::kNone:
      return Pick<Activation::kNone>::kernel();
    case Activation::kRelu:
      return Pick<Activation::kRelu>::kernel();
    case Activation::kGeluTanh:
      return Pick<Activation::kGeluTanh>::kernel();
    case Activation::kGeluErf:
      return Pick<Activation::kGeluErf>::kernel();
    case Activation::kSilu:
      return Pick<Activation::kSilu>::kernel();
  }
  return nullptr;
}

// ---- kernels of the other translation units, by what the planner knows
// fused_mlp_mma.cu: the runtime-width mma.sync kernel (bucket 64/128/256) and the padded resident
// one (bucket 64/128), fp16 or bf16.
KernelFn pick_mma_kernel(DType dtype, int bucket, Activation act);
KernelFn pick_padded_kernel(DType dtype, int bucket, Activation act);
// fused_mlp_sm90.cu: replaces the padded kernel's plan with the wgmma kernel's when the device is
// compute capability 9.0 and at least one warpgroup fits beside the weights; returns false and
// leaves everything as it was otherwise. Expects p.out_pitch set.
bool plan_fused_mlp_wgmma(const FusedMlpArgs& a, int bucket, int smem_limit, MlpKernelParams& p,
                          KernelFn& kernel, int& threads, int& smem);

// fused_mlp_tf32.cu: fp32 in 32-row tiles on Hopper tensor cores.
// 8 warps. (16 warps, with 32 x 8 and 16 x 8 units, measured no faster on the seed model, whose
// layers are bound by mma.sync throughput, ~19 cycles per m16n8k8 tf32 per scheduler on an H200,
// and 45% slower on the 64-wide fp32 MLP at batch 64K: more shared-memory traffic per mma.)
constexpr int kTf32Threads = 256;
constexpr int kTf32Warps = kTf32Threads / 32;
constexpr int kTf32TileRows = 32;  // two m16 tiles: every B fragment feeds two mma
constexpr int kTf32BoxK = 32;      // floats per TMA box row: 128 bytes, the 128B swizzle span

struct MlpTf32Params {
  MlpKernelParams p;
  CUtensorMap weight_maps[kMaxMlpLayers];  // (in, out) fp32, box kTf32BoxK x round_up(out, 8)
};
using Tf32KernelFn = void (*)(MlpTf32Params);

// Shared-memory bytes of one layer's weights: ceil(in / 32) boxes of round_up(out, 8) rows x 128 B.
__host__ __device__ constexpr int tf32_box_bytes(int out) {
  return round_up(out, 8) * kTf32BoxK * 4;
}
__host__ __device__ constexpr int tf32_layer_bytes(int in, int out) {
  return (in + kTf32BoxK - 1) / kTf32BoxK * tf32_box_bytes(out);
}

// Fills p's layout for the 3xTF32 kernel and smem (bytes, with 1024 of alignment slack) and
// returns the kernel, or nullptr where it cannot run (then p and smem are unchanged).
Tf32KernelFn plan_fused_mlp_tf32x3(const FusedMlpArgs& a, const DeviceProps& device,
                                   MlpKernelParams& p, int& smem);
// The weight maps of every layer into params (false if the driver cannot encode them).
bool encode_tf32x3_maps(const FusedMlpArgs& a, MlpTf32Params& params);

}  // namespace mlp
}  // namespace dualk
