// The one tiled GEMM core behind matmul.cu and linear_gelu.cu:
//   C[b] = act(A[b] @ B[b] + bias), fp32 accumulation, bias and activation applied to the fp32
//   accumulator before the down-cast (compile-time parameters kAct, kHasBias).
//
// Three kernel templates and the host-side choice between them (select_gemm_kernel, launch_simt):
//   * gemm_tensor_core_kernel: fp16/bf16, mma.sync.m16n8k16 fed by ldmatrix from a kStages-deep
//     cp.async shared-memory pipeline. Needs 16-byte aligned operand rows (see a_rows_aligned).
//   * gemm_simt_wide_kernel: exact fp32 FMA, 128x128x8 block tile, 128 threads of 8x16 outputs,
//     register-staged float4 loads. The fp32 path where operand rows are 16-byte aligned.
//   * gemm_simt_kernel: exact fp32 FMA, 128x128x8 block tile, 8x8 outputs per thread, register
//     double buffering. The general fallback: fp32 rows the wide kernel cannot take, and fp16/bf16
//     operands that cp.async cannot serve (k % 8 != 0, odd strides, misaligned base pointers).
// gemm_tensor_core_kernel and gemm_simt_kernel walk tiles with a grid-stride loop over a flat
// (batch, tile) index, so any batch and any number of tiles fit in gridDim.x; the wide kernel runs
// one block per tile (the host falls back past 2^31-1 tiles). All index memory with 64-bit offsets.
//
// Instantiation: each .cu file calls run_gemm<kAct, kHasBias> with its own activation and bias
// flags, so no kernel is compiled in two files.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common.cuh"

namespace dualk {
namespace gemm {

// ------------------------------------------------------------------ shared device pieces

// Tile order inside one batch: blocks launched together cover kGroupM tile-rows, column by column,
// so they share the same B columns and a small set of A rows in L2.
constexpr int64_t kGroupM = 8;

struct TileCoord {
  int64_t batch, tile_m, tile_n;
};

__device__ __forceinline__ TileCoord tile_coord(int64_t tile, int64_t tiles_m, int64_t tiles_n) {
  const int64_t tiles_per_batch = tiles_m * tiles_n;
  TileCoord coord;
  coord.batch = tile / tiles_per_batch;
  const int64_t t = tile - coord.batch * tiles_per_batch;
  const int64_t tiles_per_group = kGroupM * tiles_n;
  const int64_t first_m = (t / tiles_per_group) * kGroupM;
  const int64_t group_rows = min(tiles_m - first_m, kGroupM);
  const int64_t in_group = t - (t / tiles_per_group) * tiles_per_group;
  coord.tile_m = first_m + in_group % group_rows;
  coord.tile_n = in_group / group_rows;
  return coord;
}

// act(acc + bias[col]) in fp32; the caller checks col < n.
template <typename T, Activation kAct, bool kHasBias>
__device__ __forceinline__ float epilogue_value(float acc, const T* bias, int64_t col) {
  if constexpr (kHasBias) acc += to_float<T>(bias[col]);
  return apply_activation<kAct>(acc);
}

// ------------------------------------------------------------------ tensor-core kernel (fp16/bf16)

// Shared-memory tiles are stored unpadded with 16-byte chunks XOR-swizzled inside each 128-byte
// line, so the 8 row addresses of one ldmatrix 8x8 matrix (8 rows, one logical chunk) and the
// cp.async chunk stores of a warp land on 8 distinct 16-byte bank groups:
//   rows of >= 8 chunks (>= 128 bytes): physical chunk = chunk ^ (row % 8);
//   rows of 4 chunks (64 bytes, two rows per 128-byte line): chunk ^ ((row / 2) % 4).
template <int kChunks>
__device__ __forceinline__ int swizzled_offset(int row, int chunk) {
  static_assert(kChunks == 4 || kChunks % 8 == 0, "swizzle needs 4 or a multiple of 8 chunks per row");
  if constexpr (kChunks >= 8)
    return row * kChunks * 8 + ((chunk ^ (row & 7)) * 8);
  else
    return row * 32 + ((chunk ^ ((row >> 1) & 3)) * 8);
}

// 32-bit shared-memory address forms of the common.cuh copy/ldmatrix wrappers: the main loop keeps
// one 32-bit base per operand instead of 64-bit generic pointers.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async_16_u32(uint32_t dst, const void* gmem_src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(src_bytes));
}
__device__ __forceinline__ void ldmatrix_x4_u32(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans_u32(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Tile: kBlockM x kBlockN x kBlockK block tile, kWarpsM x kWarpsN warps, kStages-deep cp.async
// pipeline, kMinBlocks for __launch_bounds__ (see TcLarge/TcMedium/TcSmall below).
template <typename Tile, bool kBKMajor>
struct TensorCoreConfig {
  static constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN, kBlockK = Tile::kBlockK;
  static constexpr int kWarpsM = Tile::kWarpsM, kWarpsN = Tile::kWarpsN, kStages = Tile::kStages;
  static constexpr int kThreads = kWarpsM * kWarpsN * 32;
  static constexpr int kWarpTileM = kBlockM / kWarpsM;
  static constexpr int kWarpTileN = kBlockN / kWarpsN;
  static constexpr int kMmaTilesM = kWarpTileM / 16;  // m16 tiles per warp
  static constexpr int kMmaTilesN = kWarpTileN / 8;   // n8 tiles per warp
  static constexpr int kKSteps = kBlockK / 16;        // mma k16 steps per stage
  // sA[m][k]; sB[n][k] when B is k-major (ldmatrix), sB[k][n] otherwise (ldmatrix.trans).
  static constexpr int kChunksRowA = kBlockK / 8;  // 16-byte chunks of 8 elements
  static constexpr int kChunksRowB = kBKMajor ? kBlockK / 8 : kBlockN / 8;
  static constexpr int kRowsB = kBKMajor ? kBlockN : kBlockK;
  static constexpr int kStageElemsA = kBlockM * kBlockK;
  static constexpr int kStageElemsB = kBlockN * kBlockK;
  static constexpr int kStageElems = kStageElemsA + kStageElemsB;
  static constexpr int kSmemBytes = kStages * kStageElems * 2;  // 2-byte elements
  // Each thread copies one fixed chunk column, kLoads rows kRowsPerPass apart.
  static constexpr int kRowsPerPassA = kThreads / kChunksRowA;
  static constexpr int kRowsPerPassB = kThreads / kChunksRowB;
  static constexpr int kLoadsA = kBlockM / kRowsPerPassA;
  static constexpr int kLoadsB = kRowsB / kRowsPerPassB;

  static_assert(kWarpTileM % 16 == 0 && kWarpTileN % 16 == 0, "warp tile shape");
  static_assert(kMmaTilesN % 2 == 0, "B fragments are loaded two n8 tiles per ldmatrix_x4");
  static_assert(kBlockK % 32 == 0, "k tile: 4 or a multiple of 8 chunks per row");
  static_assert(kThreads % kChunksRowA == 0 && kBlockM % kRowsPerPassA == 0, "A chunks per thread");
  static_assert(kThreads % kChunksRowB == 0 && kRowsB % kRowsPerPassB == 0, "B chunks per thread");
  static_assert(kStages >= 2, "pipeline depth");
};

// Host-checked precondition (a_rows_aligned, b_rows_aligned): every 16-byte chunk of A and B rows
// starts on a 16-byte boundary, and k (and n for B (k, n)) is a multiple of 8, so each chunk is
// either wholly inside the matrix or wholly outside (then zero-filled).
//
// Main loop (per k tile, kKSteps mma steps of k16): the fragments of step s+1 are loaded from shared
// memory (ldmatrix) while the mma of step s run; the wait for the next stage and the one barrier per
// k tile sit before the last step, so the next stage's first fragments also overlap the last mma.
// Epilogue straight from the accumulators: bias and activation in fp32 registers, two outputs per
// 32-bit store.
template <typename T, typename Tile, bool kBKMajor, Activation kAct, bool kHasBias>
__global__ void __launch_bounds__(Tile::kWarpsM* Tile::kWarpsN * 32, Tile::kMinBlocks)
    gemm_tensor_core_kernel(const GemmArgs args) {
  using Cfg = TensorCoreConfig<Tile, kBKMajor>;
  constexpr int kStages = Cfg::kStages;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);

  const T* __restrict__ a = static_cast<const T*>(args.a);
  const T* __restrict__ b = static_cast<const T*>(args.b);
  const T* __restrict__ bias = static_cast<const T*>(args.bias);
  T* __restrict__ c = static_cast<T*>(args.c);
  const int64_t m = args.m, n = args.n, k = args.k;

  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int warp_m = warp / Cfg::kWarpsN;
  const int warp_n = warp % Cfg::kWarpsN;

  const int64_t tiles_m = ceil_div(m, Cfg::kBlockM);
  const int64_t tiles_n = ceil_div(n, Cfg::kBlockN);
  const int64_t num_tiles = args.batch * tiles_m * tiles_n;
  // Host-checked: k < 2^31 (select_gemm_kernel), so k offsets fit in int.
  const int k_tiles = static_cast<int>(ceil_div(k, Cfg::kBlockK));
  const int k_int = static_cast<int>(k);
  // 32-bit stores of two C elements need 4-byte aligned element pairs.
  const bool c_vec = ((reinterpret_cast<uintptr_t>(c) & 3) | (args.stride_cm & 1) |
                      (args.batch > 1 ? (args.stride_c_batch & 1) : 0)) == 0;

  // This thread's copy slots: chunk column and first row of each operand tile.
  const int a_chunk = tid % Cfg::kChunksRowA;
  const int a_row0 = tid / Cfg::kChunksRowA;
  const int b_chunk = tid % Cfg::kChunksRowB;
  const int b_row0 = tid / Cfg::kChunksRowB;

  // Byte offsets inside one stage. Every row a lane addresses has row % 8 == lane % 8 (and
  // (row / 2) % 4 == (lane / 2) % 4), and logical chunks 2 ks + h with h < 2, so the swizzled chunk
  // of k step ks is (2 ks) ^ (h ^ swizzle(lane)), a compile-time XOR per step.
  constexpr int kRowBytesA = Cfg::kChunksRowA * 16;
  constexpr int kRowBytesB = Cfg::kChunksRowB * 16;
  const int lane_swz_a = Cfg::kChunksRowA >= 8 ? lane % 8 : (lane / 2) % 4;
  const int lane_swz_b = Cfg::kChunksRowB >= 8 ? lane % 8 : (lane / 2) % 4;
  // A (m16 x k16 per x4): lanes 0-15 rows 0-15 at k 0-7, lanes 16-31 at k 8-15.
  const uint32_t a_ld_row_off = (warp_m * Cfg::kWarpTileM + lane % 16) * kRowBytesA;
  const int a_ld_hx = (lane / 16) ^ lane_swz_a;
  // B k-major, sB[n][k]: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
  // are b0, b1 of n-tile j and b0, b1 of n-tile j+1.
  // B (k, n), sB[k][n] transposed on load: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15),
  // (k 8-15, n 8-15), the same four fragments; its chunk does not depend on the k step.
  uint32_t b_ld_row_off;
  int b_ld_hx = 0;
  uint32_t b_ld_col_off[Cfg::kMmaTilesN / 2];
  if constexpr (kBKMajor) {
    b_ld_row_off = (warp_n * Cfg::kWarpTileN + lane % 8 + (lane / 16) * 8) * kRowBytesB;
    b_ld_hx = ((lane / 8) % 2) ^ lane_swz_b;
  } else {
    b_ld_row_off = (lane % 16) * kRowBytesB;
#pragma unroll
    for (int j = 0; j < Cfg::kMmaTilesN; j += 2)
      b_ld_col_off[j / 2] = ((warp_n * (Cfg::kWarpTileN / 8) + lane / 16 + j) ^ lane_swz_b) * 16;
  }
  const uint32_t smem_base = smem_u32(smem);

  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const TileCoord coord = tile_coord(tile, tiles_m, tiles_n);
    const int64_t m0 = coord.tile_m * Cfg::kBlockM;
    const int64_t n0 = coord.tile_n * Cfg::kBlockN;
    const T* a_batch = a + coord.batch * args.stride_a_batch;
    const T* b_batch = b + coord.batch * args.stride_b_batch;
    const int64_t m_left = m - m0;
    const int64_t n_left = n - n0;

    // Source of this thread's first chunk at k tile 0; rows kRowsPerPass apart follow by a stride.
    const T* a_src = a_batch + (m0 + a_row0) * args.stride_am + a_chunk * 8;
    const int64_t a_pass_stride = static_cast<int64_t>(Cfg::kRowsPerPassA) * args.stride_am;
    const T* b_src;
    int64_t b_pass_stride, b_tile_step;
    bool b_col_ok = true;  // (k, n): this thread's n chunk is inside
    if constexpr (kBKMajor) {
      b_src = b_batch + (n0 + b_row0) * args.stride_b_outer + b_chunk * 8;
      b_pass_stride = static_cast<int64_t>(Cfg::kRowsPerPassB) * args.stride_b_outer;
      b_tile_step = Cfg::kBlockK;
    } else {
      b_col_ok = b_chunk * 8 < n_left;
      b_src = b_batch + b_row0 * args.stride_b_outer + n0 + b_chunk * 8;
      b_pass_stride = static_cast<int64_t>(Cfg::kRowsPerPassB) * args.stride_b_outer;
      b_tile_step = Cfg::kBlockK * args.stride_b_outer;
    }

    auto load_stage = [&](int stage, int k_tile) {
      const uint32_t sa = smem_base + stage * (Cfg::kStageElems * 2);
      const uint32_t sb = sa + Cfg::kStageElemsA * 2;
      const int k0 = k_tile * Cfg::kBlockK;
      const T* a_tile = a_src + k0;
      const bool a_k_ok = k0 + a_chunk * 8 < k_int;
#pragma unroll
      for (int i = 0; i < Cfg::kLoadsA; ++i) {
        const int row = a_row0 + i * Cfg::kRowsPerPassA;
        const bool ok = a_k_ok && row < m_left;
        // A zero-byte copy reads nothing; the pointer still stays inside the allocation.
        cp_async_16_u32(sa + 2 * swizzled_offset<Cfg::kChunksRowA>(row, a_chunk),
                        ok ? a_tile + i * a_pass_stride : a, ok ? 16 : 0);
      }
      const T* b_tile = b_src + k_tile * b_tile_step;
#pragma unroll
      for (int i = 0; i < Cfg::kLoadsB; ++i) {
        const int row = b_row0 + i * Cfg::kRowsPerPassB;
        bool ok;
        if constexpr (kBKMajor)
          ok = row < n_left && k0 + b_chunk * 8 < k_int;
        else
          ok = b_col_ok && k0 + row < k_int;
        cp_async_16_u32(sb + 2 * swizzled_offset<Cfg::kChunksRowB>(row, b_chunk),
                        ok ? b_tile + i * b_pass_stride : b, ok ? 16 : 0);
      }
    };

    float acc[Cfg::kMmaTilesM][Cfg::kMmaTilesN][4];
#pragma unroll
    for (int i = 0; i < Cfg::kMmaTilesM; ++i)
#pragma unroll
      for (int j = 0; j < Cfg::kMmaTilesN; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;

    uint32_t a_frag[2][Cfg::kMmaTilesM][4];
    uint32_t b_frag[2][Cfg::kMmaTilesN][2];
    // Fragments of mma step `ks` (k16 slice) of the stage at shared address sa into buffer `buf`.
    auto load_frags = [&](int buf, uint32_t sa, int ks) {
      const uint32_t sb = sa + Cfg::kStageElemsA * 2;
#pragma unroll
      for (int i = 0; i < Cfg::kMmaTilesM; ++i)
        ldmatrix_x4_u32(a_frag[buf][i], sa + a_ld_row_off + i * 16 * kRowBytesA + (((2 * ks) ^ a_ld_hx) * 16));
#pragma unroll
      for (int j = 0; j < Cfg::kMmaTilesN; j += 2) {
        uint32_t r[4];
        if constexpr (kBKMajor)
          ldmatrix_x4_u32(r, sb + b_ld_row_off + j * 8 * kRowBytesB + (((2 * ks) ^ b_ld_hx) * 16));
        else
          ldmatrix_x4_trans_u32(r, sb + b_ld_row_off + ks * 16 * kRowBytesB + b_ld_col_off[j / 2]);
        b_frag[buf][j][0] = r[0];
        b_frag[buf][j][1] = r[1];
        b_frag[buf][j + 1][0] = r[2];
        b_frag[buf][j + 1][1] = r[3];
      }
    };

    // Prologue: tiles 0 .. kStages-2 in flight, one commit group each (empty groups keep the
    // group count equal to the tile index, which the waits below rely on).
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < k_tiles) load_stage(s, s);
      cp_async_commit();
    }
    cp_async_wait<kStages - 2>();
    __syncthreads();
    int read_stage = 0;
    int write_stage = kStages - 1;
    if (k_tiles > 0) load_frags(0, smem_base, 0);

    for (int kt = 0; kt < k_tiles; ++kt) {
#pragma unroll
      for (int ks = 0; ks < Cfg::kKSteps; ++ks) {
        if (ks == Cfg::kKSteps - 1) {
          // Groups committed: kStages-1+kt+1; at most kStages-2 pending means tile kt+1 landed.
          // The barrier publishes it, and ends every warp's reads of tile kt's stage (its last
          // fragments were loaded in step kKSteps-2, or before the previous barrier), which the
          // copy issued in step 0 of the next k tile overwrites.
          cp_async_wait<kStages - 2>();
          __syncthreads();
          read_stage = read_stage + 1 == kStages ? 0 : read_stage + 1;
        }
        if (ks < Cfg::kKSteps - 1 || kt + 1 < k_tiles)
          load_frags((ks + 1) % 2, smem_base + read_stage * (Cfg::kStageElems * 2), (ks + 1) % Cfg::kKSteps);
        if (ks == 0) {
          // Overwrites the stage of tile kt-1, free since the barrier of step kKSteps-1 of kt-1.
          const int next = kt + kStages - 1;
          if (next < k_tiles) load_stage(write_stage, next);
          cp_async_commit();
          write_stage = write_stage + 1 == kStages ? 0 : write_stage + 1;
        }
#pragma unroll
        for (int i = 0; i < Cfg::kMmaTilesM; ++i)
#pragma unroll
          for (int j = 0; j < Cfg::kMmaTilesN; ++j)
            mma_16816<T>(acc[i][j], a_frag[ks % 2][i], b_frag[ks % 2][j]);
      }
    }
    // Only empty groups can remain; every read of shared memory is behind the last barrier (the
    // next tile's prologue may overwrite any stage).
    cp_async_wait<0>();

    // Epilogue: lane (g = lane / 4, t = lane % 4) holds rows g and g + 8, columns 2t and 2t + 1 of
    // every m16n8 tile; bias + activation in fp32, down-cast, one 32-bit store per pair (masked
    // element stores at the right edge or when C pairs are not 4-byte aligned).
    T* c_batch = c + coord.batch * args.stride_c_batch;
    const int row_base = warp_m * Cfg::kWarpTileM + lane / 4;
    const int col_base = warp_n * Cfg::kWarpTileN + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < Cfg::kMmaTilesN; ++j) {
      const int col = col_base + j * 8;
      if (col >= n_left) continue;
      const bool pair = col + 1 < n_left;
      float bias0 = 0.f, bias1 = 0.f;
      if constexpr (kHasBias) {
        bias0 = to_float<T>(bias[n0 + col]);
        if (pair) bias1 = to_float<T>(bias[n0 + col + 1]);
      }
#pragma unroll
      for (int i = 0; i < Cfg::kMmaTilesM; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = row_base + i * 16 + h * 8;
          if (row >= m_left) continue;
          float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
          if constexpr (kHasBias) {
            v0 += bias0;
            v1 += bias1;
          }
          v0 = apply_activation<kAct>(v0);
          v1 = apply_activation<kAct>(v1);
          T* dst = c_batch + (m0 + row) * args.stride_cm + n0 + col;
          if (c_vec && pair) {
            *reinterpret_cast<uint32_t*>(dst) = pack2<T>(v0, v1);
          } else {
            dst[0] = from_float<T>(v0);
            if (pair) dst[1] = from_float<T>(v1);
          }
        }
      }
    }
  }
}

// ------------------------------------------------------------------ SIMT kernel (fallback, any type)

constexpr int kSimtBlockM = 128;
constexpr int kSimtBlockN = 128;
constexpr int kSimtBlockK = 8;
constexpr int kSimtThreads = 256;  // 16 x 16 threads, 8 x 8 outputs each
// sA[k][m] and sB[k][n] rows padded by 4 floats: the transposing stores of a k-contiguous operand
// (4 k values from one thread) then hit distinct banks, and rows stay 16-byte aligned for float4.
constexpr int kSimtStride = kSimtBlockM + 4;

// Operand tile loads of one k step: 4 values of A and 4 of B per thread, held in registers while
// the previous k step is computed (register double buffering), then stored to the other buffer.
//   kVec (fp32 with host-checked 16-byte rows): one float4 per operand and thread, from a source
//     pointer fixed for the whole k loop; a chunk is wholly inside or outside (k or n % 4 == 0).
//   otherwise: 4 scalar loads per operand, each masked; any alignment, any element type.
// B's layout is a run-time flag: it only changes index arithmetic, once per k step of 8.
template <typename T, bool kVec>
struct SimtOperandLoader {
  const T* src;        // this thread's first element of the next k tile to load
  int64_t tile_step;   // elements from one k tile to the next (kSimtBlockK rows of k)
  int64_t elem_step;   // scalar path: elements between this thread's 4 loads
  int k_offset;        // k of this thread's first element inside the tile
  int k_stride_i;      // scalar path: k distance between the 4 loads (0 or 2)
  int outer_ok;        // vec: 1 if the row/chunk is inside; scalar: bit i for load i
  bool k_contiguous;

  // A tile (or B^T tile) of 128 rows (m or n) x 8 k, k contiguous in memory.
  __device__ __forceinline__ void init_k_contiguous(const T* base, int64_t stride_outer, int64_t outer0,
                                                    int64_t outer_size, int tid) {
    k_contiguous = true;
    tile_step = kSimtBlockK;
    k_stride_i = 0;
    if constexpr (kVec) {
      const int64_t row = outer0 + tid / 2;  // 2 chunks of 4 per row
      outer_ok = row < outer_size;
      k_offset = (tid % 2) * 4;
      elem_step = 0;
      src = base + (outer_ok ? row * stride_outer : 0) + k_offset;
    } else {
      const int64_t row = outer0 + tid / 8;  // 8 threads per row, rows +32 i
      outer_ok = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) outer_ok |= (row + 32 * i < outer_size) << i;
      k_offset = tid % 8;
      elem_step = 32 * stride_outer;
      src = base + (outer_ok & 1 ? row * stride_outer : 0) + k_offset;
    }
  }

  // B tile of 8 k x 128 n, n contiguous in memory.
  __device__ __forceinline__ void init_n_contiguous(const T* base, int64_t stride_k, int64_t n0, int64_t n,
                                                    int tid) {
    k_contiguous = false;
    tile_step = kSimtBlockK * stride_k;
    if constexpr (kVec) {
      const int64_t col = n0 + (tid % 32) * 4;  // rows k = tid / 32
      outer_ok = col < n;
      k_offset = tid / 32;
      k_stride_i = 0;
      elem_step = 0;
      src = base + k_offset * stride_k + (outer_ok ? col : 0);
    } else {
      const int64_t col = n0 + tid % 128;  // rows k = tid / 128 + 2 i
      outer_ok = col < n ? 0xf : 0;
      k_offset = tid / 128;
      k_stride_i = 2;
      elem_step = 2 * stride_k;
      src = base + k_offset * stride_k + (outer_ok ? col : 0);
    }
  }

  // Loads the next k tile (k_left = k - its first k) and steps to the one after.
  __device__ __forceinline__ void load(float (&regs)[4], int64_t k_left) {
    if constexpr (kVec) {
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (outer_ok && k_offset < k_left) v = *reinterpret_cast<const float4*>(src);
      regs[0] = v.x;
      regs[1] = v.y;
      regs[2] = v.z;
      regs[3] = v.w;
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool ok = ((outer_ok >> i) & 1) && k_offset + k_stride_i * i < k_left;
        regs[i] = ok ? to_float<T>(src[i * elem_step]) : 0.f;
      }
    }
    src += tile_step;
  }

  // Into s[k][outer] (row stride kSimtStride); tid decides the position as in init_*.
  __device__ __forceinline__ void store(float* s, const float (&regs)[4], int tid) const {
    if (k_contiguous) {
      if constexpr (kVec) {
#pragma unroll
        for (int i = 0; i < 4; ++i) s[((tid % 2) * 4 + i) * kSimtStride + tid / 2] = regs[i];
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) s[(tid % 8) * kSimtStride + tid / 8 + 32 * i] = regs[i];
      }
    } else {
      if constexpr (kVec) {
        *reinterpret_cast<float4*>(s + (tid / 32) * kSimtStride + (tid % 32) * 4) =
            make_float4(regs[0], regs[1], regs[2], regs[3]);
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) s[(tid / 128 + 2 * i) * kSimtStride + tid % 128] = regs[i];
      }
    }
  }
};

// Two blocks per SM (<= 128 registers) only for the plain fp32 matmul: the scalar loaders and the
// gelu epilogue (64 tanhf/erff in flight) spill at that cap on sm_90a, so those run one per SM.
template <typename T, bool kVec, Activation kAct>
constexpr int simt_min_blocks() {
  return kVec && kAct == Activation::kNone ? 2 : 1;
}

template <typename T, bool kVec, Activation kAct, bool kHasBias>
__global__ void __launch_bounds__(kSimtThreads, simt_min_blocks<T, kVec, kAct>())
    gemm_simt_kernel(const GemmArgs args) {
  __shared__ __align__(16) float s_a[2][kSimtBlockK * kSimtStride];
  __shared__ __align__(16) float s_b[2][kSimtBlockK * kSimtStride];

  const T* __restrict__ a = static_cast<const T*>(args.a);
  const T* __restrict__ b = static_cast<const T*>(args.b);
  const T* __restrict__ bias = static_cast<const T*>(args.bias);
  T* __restrict__ c = static_cast<T*>(args.c);
  const int64_t m = args.m, n = args.n, k = args.k;

  const int tid = threadIdx.x;
  // Thread (ty, tx) owns rows {ty*4 .. ty*4+3, 64+ty*4 .. 64+ty*4+3} and the same for columns with
  // tx: its smem reads are float4s, and the 16 tx of a warp read 256 contiguous bytes.
  const int tx = tid % 16;
  const int ty = tid / 16;

  const int64_t tiles_m = ceil_div(m, kSimtBlockM);
  const int64_t tiles_n = ceil_div(n, kSimtBlockN);
  const int64_t num_tiles = args.batch * tiles_m * tiles_n;
  const int64_t k_tiles = ceil_div(k, kSimtBlockK);

  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const TileCoord coord = tile_coord(tile, tiles_m, tiles_n);
    const int64_t m0 = coord.tile_m * kSimtBlockM;
    const int64_t n0 = coord.tile_n * kSimtBlockN;

    SimtOperandLoader<T, kVec> a_loader, b_loader;
    a_loader.init_k_contiguous(a + coord.batch * args.stride_a_batch, args.stride_am, m0, m, tid);
    if (args.b_k_major)
      b_loader.init_k_contiguous(b + coord.batch * args.stride_b_batch, args.stride_b_outer, n0, n, tid);
    else
      b_loader.init_n_contiguous(b + coord.batch * args.stride_b_batch, args.stride_b_outer, n0, n, tid);

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;

    float a_regs[4], b_regs[4];
    if (k_tiles > 0) {
      a_loader.load(a_regs, k);
      b_loader.load(b_regs, k);
      a_loader.store(s_a[0], a_regs, tid);
      b_loader.store(s_b[0], b_regs, tid);
    }
    __syncthreads();

    for (int64_t kt = 0; kt < k_tiles; ++kt) {
      const int buf = static_cast<int>(kt & 1);
      const bool has_next = kt + 1 < k_tiles;
      if (has_next) {
        const int64_t k_left = k - (kt + 1) * kSimtBlockK;
        a_loader.load(a_regs, k_left);
        b_loader.load(b_regs, k_left);
      }
      const float* sa = s_a[buf];
      const float* sb = s_b[buf];
#pragma unroll
      for (int kk = 0; kk < kSimtBlockK; ++kk) {
        float a_frag[8], b_frag[8];
        const float4 a_lo = *reinterpret_cast<const float4*>(sa + kk * kSimtStride + ty * 4);
        const float4 a_hi = *reinterpret_cast<const float4*>(sa + kk * kSimtStride + 64 + ty * 4);
        const float4 b_lo = *reinterpret_cast<const float4*>(sb + kk * kSimtStride + tx * 4);
        const float4 b_hi = *reinterpret_cast<const float4*>(sb + kk * kSimtStride + 64 + tx * 4);
        a_frag[0] = a_lo.x; a_frag[1] = a_lo.y; a_frag[2] = a_lo.z; a_frag[3] = a_lo.w;
        a_frag[4] = a_hi.x; a_frag[5] = a_hi.y; a_frag[6] = a_hi.z; a_frag[7] = a_hi.w;
        b_frag[0] = b_lo.x; b_frag[1] = b_lo.y; b_frag[2] = b_lo.z; b_frag[3] = b_lo.w;
        b_frag[4] = b_hi.x; b_frag[5] = b_hi.y; b_frag[6] = b_hi.z; b_frag[7] = b_hi.w;
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a_frag[i], b_frag[j], acc[i][j]);
      }
      if (has_next) {
        // The other buffer was last read in step kt-1, and the barrier ending that step is behind
        // every thread, so it can be overwritten now.
        a_loader.store(s_a[buf ^ 1], a_regs, tid);
        b_loader.store(s_b[buf ^ 1], b_regs, tid);
      }
      __syncthreads();
    }

    T* c_batch = c + coord.batch * args.stride_c_batch;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t row = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
      if (row >= m) continue;
      T* c_row = c_batch + row * args.stride_cm;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int64_t col = n0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + (j - 4));
        if (col < n) c_row[col] = from_float<T>(epilogue_value<T, kAct, kHasBias>(acc[i][j], bias, col));
      }
    }
  }
}

// ------------------------------------------------------------------ wide SIMT kernel (fp32)

// The fp32 kernel wherever its preconditions hold (simt_wide_fits): 128 x 128 x 8 block tile,
// 128 threads as 2 x 2 warps of 64 x 64, 8 x 16 outputs per thread, two blocks per SM. Measured on
// an H200 (bench/standalone/NOTES-simt.md, "simt_v3", config Mid8Late): 0.90-0.92x cuBLAS SGEMM on
// every timed case (4096^3: 2937 / 2988 us, B (k, n) / B k-major), where gemm_simt_kernel reaches
// 0.71-0.77x, and 0.90x against 0.55x with the gelu + bias epilogue. 217-235 registers, no spills on
// sm_80 / sm_90a. Against the other shapes tried: 8 x 8 per thread at 256 threads came within ~3%
// either way (ahead on B k-major with BK 16, behind on gelu + bias) but sits at the 128-register
// cap; one 128 x 256 block per SM was 3-5% slower (at two per SM one block's barrier hides behind
// the other's FMAs); BK 16 at 128 threads was slower on every case.
constexpr int kSimtWideBlockM = 128;
constexpr int kSimtWideBlockN = 128;
constexpr int kSimtWideBlockK = 8;
constexpr int kSimtWideThreadM = 8;    // outputs per thread along m: rows r..r+3 and r+32..r+35
constexpr int kSimtWideThreadN = 16;   // along n: four runs of 4 columns, 16 apart
constexpr int kSimtWideThreads = 128;  // 2 x 2 warps, lanes 8 (m) x 4 (n)
constexpr int kSimtWideMinBlocks = 2;
// sA[k][m] and sB[k][n] rows padded by 4 floats (as kSimtStride): 132 = 4 mod 32 banks keeps the
// transposing stores conflict-free, and rows stay 16-byte aligned for float4.
constexpr int kSimtWideStride = kSimtWideBlockM + 4;
constexpr int kSimtWideBufFloats = kSimtWideBlockK * kSimtWideStride;     // one buffer of one operand
constexpr int kSimtWideSmemBytes = 2 * 2 * kSimtWideBufFloats * 4;        // 16,896 bytes
static_assert(kSimtWideBlockM == kSimtWideBlockN, "one row stride for sA and sB");
static_assert(kSimtWideBlockM == 2 * 8 * kSimtWideThreadM && kSimtWideBlockN == 2 * 4 * kSimtWideThreadN,
              "2 x 2 warps of 8 x 4 lanes cover the block tile");
static_assert(kSimtWideSmemBytes <= 48 * 1024, "dynamic shared memory above 48 KB needs an opt-in");

// k-contiguous operand tile (A (m, k), or B k-major (n, k)), 128 rows x 8 k: thread t loads the
// float4s at rows t/2 and t/2 + 64, k 4 (t % 2) (two threads read a row's 32 bytes). With 16-byte
// rows and k % 4 == 0 a float4 is wholly inside or outside k.
struct SimtWideKLoader {
  static constexpr int kChunks = 2;
  static constexpr int kRowStep = kSimtWideThreads / 2;
  const float* src;  // row t/2, k 4 (t % 2) of the next k tile to load
  int64_t row_step;  // elements from chunk 0's row to chunk 1's
  unsigned row_ok;   // bit h: chunk h's row is inside
  int k_off;         // 4 (t % 2)

  __device__ __forceinline__ void init(const float* base, int64_t stride, int64_t outer0, int64_t outer_size,
                                       int tid) {
    const int64_t row = outer0 + tid / 2;
    row_ok = 0;
#pragma unroll
    for (int h = 0; h < kChunks; ++h)
      if (row + kRowStep * h < outer_size) row_ok |= 1u << h;
    k_off = (tid % 2) * 4;
    src = base + (row < outer_size ? row * stride : 0) + k_off;
    row_step = kRowStep * stride;
  }
  // k_left: k minus the first k of the tile to load; <= 0 loads zeros.
  __device__ __forceinline__ void load(float4 (&v)[kChunks], int k_left) const {
#pragma unroll
    for (int h = 0; h < kChunks; ++h) {
      v[h] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (((row_ok >> h) & 1) && k_off < k_left)
        v[h] = __ldg(reinterpret_cast<const float4*>(src + h * row_step));
    }
  }
  __device__ __forceinline__ void advance() { src += kSimtWideBlockK; }
  // Transposed into s[k][row]: element i of lane t lands in bank (16 (t % 2) + 4 i + t / 2) % 32,
  // 32 distinct banks per warp store.
  __device__ __forceinline__ void store(float* s, const float4 (&v)[kChunks], int tid) const {
#pragma unroll
    for (int h = 0; h < kChunks; ++h) {
      float* p = s + (tid % 2) * 4 * kSimtWideStride + tid / 2 + kRowStep * h;
      p[0] = v[h].x;
      p[kSimtWideStride] = v[h].y;
      p[2 * kSimtWideStride] = v[h].z;
      p[3 * kSimtWideStride] = v[h].w;
    }
  }
};

// B (k, n) tile, 8 k x 128 n: thread t loads the float4s at k rows t/32 and t/32 + 4, columns
// 4 (t % 32); stored as they are (a warp writes one 512-byte row run).
struct SimtWideNLoader {
  static constexpr int kChunks = 2;
  static constexpr int kPerRow = kSimtWideBlockN / 4;           // threads per k row
  static constexpr int kRowStep = kSimtWideThreads / kPerRow;   // k rows between chunks
  const float* src;  // k row t/32 of the next k tile to load, column n0 + 4 (t % 32)
  int64_t stride_k;
  int k_row;         // t / 32
  bool col_ok;

  __device__ __forceinline__ void init(const float* base, int64_t stride, int64_t n0, int64_t n, int tid) {
    const int64_t col = n0 + (tid % kPerRow) * 4;
    col_ok = col < n;
    k_row = tid / kPerRow;
    stride_k = stride;
    src = base + k_row * stride + (col_ok ? col : 0);
  }
  __device__ __forceinline__ void load(float4 (&v)[kChunks], int k_left) const {
#pragma unroll
    for (int h = 0; h < kChunks; ++h) {
      v[h] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (col_ok && k_row + kRowStep * h < k_left)
        v[h] = __ldg(reinterpret_cast<const float4*>(src + kRowStep * h * stride_k));
    }
  }
  __device__ __forceinline__ void advance() { src += kSimtWideBlockK * stride_k; }
  __device__ __forceinline__ void store(float* s, const float4 (&v)[kChunks], int tid) const {
#pragma unroll
    for (int h = 0; h < kChunks; ++h)
      *reinterpret_cast<float4*>(s + (k_row + kRowStep * h) * kSimtWideStride + (tid % kPerRow) * 4) = v[h];
  }
};

// Host-checked preconditions (simt_wide_fits): fp32, 16-byte rows, k < 2^30 (k indices and k_left
// in 32 bits), one block per output tile (grid = batch x tiles <= 2^31-1), in tile_coord order.
//
// Thread (warp w, lane l) owns rows 64 (w / 2) + 4 (l / 4) + {0..3} and +32, columns 64 (w % 2) +
// 4 (l % 4) + 16 g + {0..3}, g < 4: each float4 fragment load of a warp covers 128 (A) or 64 (B)
// contiguous bytes, one shared-memory wavefront (gemm_simt_kernel's 16 x 128 warp tile needs two
// for B and reads 144 instead of 128 floats per k).
//
// Main loop, per k tile: the next tile's float4s are loaded into registers at kk = 0, stored into
// the idle buffer (sA / sB double-buffered) at kk = 7, then the one barrier; fragments are
// double-buffered in registers across kk. No branches: loads past k are masked off (k_left <= 0) and
// their zeros go to the idle buffer. Loading a whole tile earlier instead (staging registers live
// through the loop) measured 0.87x instead of 0.90x cuBLAS on B k-major and spilled on sm_80.
// k == 0 runs no k tile and writes act(bias).
template <bool kBKMajor, Activation kAct, bool kHasBias>
__global__ void __launch_bounds__(kSimtWideThreads, kSimtWideMinBlocks)
    gemm_simt_wide_kernel(const GemmArgs args) {
  constexpr int kBK = kSimtWideBlockK, kStride = kSimtWideStride, kTN = kSimtWideThreadN;
  // float, not the tensor-core kernel's byte array: that form changes the fragment address
  // arithmetic (different SASS and register counts) from the code that was measured.
  extern __shared__ __align__(16) float smem_f32[];
  float* const s_a = smem_f32;                      // [2][kBK][kStride]: sA[k][m]
  float* const s_b = smem_f32 + 2 * kSimtWideBufFloats;  // [2][kBK][kStride]: sB[k][n]

  const float* __restrict__ a = static_cast<const float*>(args.a);
  const float* __restrict__ b = static_cast<const float*>(args.b);
  const int64_t m = args.m, n = args.n;
  const int k = static_cast<int>(args.k);

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int row_base = (warp / 2) * 64 + (lane / 4) * 4;
  const int col_base = (warp % 2) * (4 * kTN) + (lane % 4) * 4;

  const int64_t tiles_m = ceil_div(m, kSimtWideBlockM), tiles_n = ceil_div(n, kSimtWideBlockN);
  const TileCoord coord = tile_coord(blockIdx.x, tiles_m, tiles_n);
  const int64_t m0 = coord.tile_m * kSimtWideBlockM, n0 = coord.tile_n * kSimtWideBlockN;

  SimtWideKLoader la;
  la.init(a + coord.batch * args.stride_a_batch, args.stride_am, m0, m, tid);
  std::conditional_t<kBKMajor, SimtWideKLoader, SimtWideNLoader> lb;
  lb.init(b + coord.batch * args.stride_b_batch, args.stride_b_outer, n0, n, tid);

  float acc[kSimtWideThreadM][kTN];
#pragma unroll
  for (int i = 0; i < kSimtWideThreadM; ++i)
#pragma unroll
    for (int j = 0; j < kTN; ++j) acc[i][j] = 0.f;

  // Prologue: k tile 0 into buffer 0; the loaders then point at k tile 1.
  float4 st_a[SimtWideKLoader::kChunks], st_b[decltype(lb)::kChunks];
  la.load(st_a, k);
  lb.load(st_b, k);
  la.store(s_a, st_a, tid);
  lb.store(s_b, st_b, tid);
  la.advance();
  lb.advance();
  __syncthreads();

  float fa[2][kSimtWideThreadM], fb[2][kTN];
  auto load_frags = [&](int f, const float* sa, const float* sb) {
    *reinterpret_cast<float4*>(&fa[f][0]) = *reinterpret_cast<const float4*>(sa + row_base);
    *reinterpret_cast<float4*>(&fa[f][4]) = *reinterpret_cast<const float4*>(sa + row_base + 32);
#pragma unroll
    for (int g = 0; g < kTN / 4; ++g)
      *reinterpret_cast<float4*>(&fb[f][4 * g]) = *reinterpret_cast<const float4*>(sb + col_base + 16 * g);
  };
  load_frags(0, s_a, s_b);

  const int k_tiles = (k + kBK - 1) / kBK;
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int k_left = k - (kt + 1) * kBK;  // of tile kt + 1, where the loaders point
    const int buf = kt & 1;
    const float* sa = s_a + buf * kSimtWideBufFloats;
    const float* sb = s_b + buf * kSimtWideBufFloats;
    float* sa_next = s_a + (buf ^ 1) * kSimtWideBufFloats;
    float* sb_next = s_b + (buf ^ 1) * kSimtWideBufFloats;
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      if (kk == 0) {
        la.load(st_a, k_left);
        lb.load(st_b, k_left);
      }
      const int cur = kk % 2;
      if (kk < kBK - 1) {
        load_frags(cur ^ 1, sa + (kk + 1) * kStride, sb + (kk + 1) * kStride);
      } else {
        // The idle buffer's last fragment reads were issued before the previous k tile's barrier.
        la.store(sa_next, st_a, tid);
        lb.store(sb_next, st_b, tid);
        __syncthreads();
        la.advance();
        lb.advance();
        load_frags(cur ^ 1, sa_next, sb_next);
      }
#pragma unroll
      for (int i = 0; i < kSimtWideThreadM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i][j] = fmaf(fa[cur][i], fb[cur][j], acc[i][j]);
    }
  }

  // Epilogue: bias loaded once per column; float4 stores when C rows are 16-byte aligned and
  // n % 4 == 0, so that a 4-column run (starting at a multiple of 4) is wholly inside or outside.
  const float* __restrict__ bias = static_cast<const float*>(args.bias);
  float* __restrict__ c = static_cast<float*>(args.c) + coord.batch * args.stride_c_batch;
  const bool c_vec = reinterpret_cast<uintptr_t>(args.c) % 16 == 0 && args.n % 4 == 0 &&
                     (args.m <= 1 || args.stride_cm % 4 == 0) &&
                     (args.batch <= 1 || args.stride_c_batch % 4 == 0);
  float bias_v[kTN];
#pragma unroll
  for (int g = 0; g < kTN / 4; ++g)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t col = n0 + col_base + 16 * g + j;
      bias_v[4 * g + j] = kHasBias && col < n ? bias[col] : 0.f;
    }
#pragma unroll
  for (int i = 0; i < kSimtWideThreadM; ++i) {
    const int64_t row = m0 + row_base + (i % 4) + 32 * (i / 4);
    if (row >= m) continue;
    float* c_row = c + row * args.stride_cm;
#pragma unroll
    for (int g = 0; g < kTN / 4; ++g) {
      const int64_t col = n0 + col_base + 16 * g;
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float x = acc[i][4 * g + j];
        if constexpr (kHasBias) x += bias_v[4 * g + j];
        v[j] = apply_activation<kAct>(x);
      }
      if (c_vec) {
        if (col < n) *reinterpret_cast<float4*>(c_row + col) = make_float4(v[0], v[1], v[2], v[3]);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (col + j < n) c_row[col + j] = v[j];
      }
    }
  }
}

// ------------------------------------------------------------------ host side

enum class GemmKernel { kTensorCoreLarge, kTensorCoreSmall, kSimt };

inline bool aligned_to(const void* p, int64_t elem_stride_a, int64_t elem_stride_b, int64_t elems,
                       int64_t elem_bytes, int64_t bytes) {
  const int64_t elem_align = bytes / elem_bytes;
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0 &&
         elem_stride_a % elem_align == 0 && elem_stride_b % elem_align == 0 && elems % elem_align == 0;
}

// 16-byte rows for A (along k) and B (along k or n): the precondition of cp.async tiles and of the
// fp32 float4 loads. A stride only matters when its dimension has more than one index (PyTorch
// gives size-1 dims arbitrary strides, and m == 1 is the common decode shape).
inline bool a_rows_aligned(const GemmArgs& args, int64_t elem_bytes) {
  return aligned_to(args.a, args.m > 1 ? args.stride_am : 0, args.batch > 1 ? args.stride_a_batch : 0,
                    args.k, elem_bytes, 16);
}
inline bool b_rows_aligned(const GemmArgs& args, int64_t elem_bytes) {
  const int64_t outer_size = args.b_k_major ? args.n : args.k;
  return aligned_to(args.b, outer_size > 1 ? args.stride_b_outer : 0,
                    args.batch > 1 ? args.stride_b_batch : 0, args.b_k_major ? args.k : args.n,
                    elem_bytes, 16);
}

// Tensor-core tile configs (kBlockM x kBlockN x kBlockK, warps, stages, blocks per SM).
//   large: 128 x 256 x 32, 8 warps of 64 x 64, 4 stages: 96 KB; one block per SM (~255 registers).
//          Measured on an H200 (bench/standalone/NOTES-gemm.md) against BK = 64 with 3 or 4 stages,
//          256 x 128, and 128 x 128 at two blocks per SM (4 warps of 64 x 64, or 8 warps of 64 x 32,
//          which spill at the 128-register cap): this one was fastest or tied on every case.
//   small: 64 x 64 x 32, 4 warps of 32 x 32, 4 stages: 32 KB, up to 4 blocks per SM; for grids the
//          large tile cannot fill.
struct TcLarge {
  static constexpr int kBlockM = 128, kBlockN = 256, kBlockK = 32, kWarpsM = 2, kWarpsN = 4, kStages = 4;
  static constexpr int kMinBlocks = 1;
};
struct TcSmall {
  static constexpr int kBlockM = 64, kBlockN = 64, kBlockK = 32, kWarpsM = 2, kWarpsN = 2, kStages = 4;
  static constexpr int kMinBlocks = 4;  // <= 128 registers: 16 warps per SM to hide latency
};

template <typename Tile>
constexpr int tensor_core_smem_bytes() {
  return TensorCoreConfig<Tile, true>::kSmemBytes;  // the same for both B layouts
}

// The one config heuristic: which kernel and tile serve C[b] = A[b] @ B[b] for these sizes.
inline GemmKernel select_gemm_kernel(const GemmArgs& args, const DeviceProps& device) {
  if (args.dtype == DType::kFloat32) return GemmKernel::kSimt;
  if (!a_rows_aligned(args, 2) || !b_rows_aligned(args, 2)) return GemmKernel::kSimt;
  if (args.k >= (int64_t{1} << 31)) return GemmKernel::kSimt;  // tensor-core k offsets are 32-bit
  const int64_t large_tiles =
      args.batch * ceil_div(args.m, TcLarge::kBlockM) * ceil_div(args.n, TcLarge::kBlockN);
  // Half a wave of large tiles still beats many small ones (2048^2: 128 large tiles on 132 SMs);
  // below that, or when n <= 128 would leave half of a 256-wide tile idle, the 64 x 64 tile
  // spreads the work over more SMs.
  // The large tile needs 96 KB of shared memory (sm_80/sm_90 have 163/227 KB; sm_86/89 99 KB).
  const bool large = 2 * large_tiles >= device.num_sms && args.n > 128 &&
                     tensor_core_smem_bytes<TcLarge>() <= device.smem_optin;
  return large ? GemmKernel::kTensorCoreLarge : GemmKernel::kTensorCoreSmall;
}

inline unsigned grid_for(int64_t num_tiles) {
  // The kernels loop over tiles, so the grid may be smaller than the tile count.
  return static_cast<unsigned>(std::min<int64_t>(num_tiles, 0x7fffffff));
}

template <typename T, typename Tile, bool kBKMajor, Activation kAct, bool kHasBias>
cudaError_t launch_tensor_core(const GemmArgs& args, cudaStream_t stream) {
  using Cfg = TensorCoreConfig<Tile, kBKMajor>;
  auto kernel = gemm_tensor_core_kernel<T, Tile, kBKMajor, kAct, kHasBias>;
  cudaError_t err = ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const int64_t num_tiles =
      args.batch * ceil_div(args.m, Tile::kBlockM) * ceil_div(args.n, Tile::kBlockN);
  kernel<<<grid_for(num_tiles), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(args);
  return cudaGetLastError();
}

// gemm_simt_wide_kernel's preconditions, for fp32 operands: 16-byte rows (float4 loads: k % 4 == 0,
// and n % 4 == 0 for B (k, n)), k < 2^30 (32-bit k indices), and one block per output tile within
// gridDim.x's 2^31-1.
inline bool simt_wide_fits(const GemmArgs& args) {
  const int64_t num_tiles =
      args.batch * ceil_div(args.m, kSimtWideBlockM) * ceil_div(args.n, kSimtWideBlockN);
  return args.k < (int64_t{1} << 30) && num_tiles <= 0x7fffffff && a_rows_aligned(args, 4) &&
         b_rows_aligned(args, 4);
}

template <Activation kAct, bool kHasBias>
cudaError_t launch_simt_wide(const GemmArgs& args, cudaStream_t stream) {
  const int64_t num_tiles =
      args.batch * ceil_div(args.m, kSimtWideBlockM) * ceil_div(args.n, kSimtWideBlockN);
  const unsigned grid = static_cast<unsigned>(num_tiles);  // one block per tile (simt_wide_fits)
  if (args.b_k_major)
    gemm_simt_wide_kernel<true, kAct, kHasBias><<<grid, kSimtWideThreads, kSimtWideSmemBytes, stream>>>(args);
  else
    gemm_simt_wide_kernel<false, kAct, kHasBias><<<grid, kSimtWideThreads, kSimtWideSmemBytes, stream>>>(args);
  return cudaGetLastError();
}

// gemm_simt_kernel: any element type, alignment and size (float4 loads where fp32 rows allow).
template <typename T, Activation kAct, bool kHasBias>
cudaError_t launch_simt_fallback(const GemmArgs& args, cudaStream_t stream) {
  const int64_t num_tiles = args.batch * ceil_div(args.m, kSimtBlockM) * ceil_div(args.n, kSimtBlockN);
  const unsigned grid = grid_for(num_tiles);
  if constexpr (std::is_same_v<T, float>) {
    if (a_rows_aligned(args, 4) && b_rows_aligned(args, 4)) {
      gemm_simt_kernel<T, true, kAct, kHasBias><<<grid, kSimtThreads, 0, stream>>>(args);
      return cudaGetLastError();
    }
  }
  gemm_simt_kernel<T, false, kAct, kHasBias><<<grid, kSimtThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

// The SIMT path: the wide kernel for fp32 where it fits, else gemm_simt_kernel.
template <typename T, Activation kAct, bool kHasBias>
cudaError_t launch_simt(const GemmArgs& args, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    if (simt_wide_fits(args)) return launch_simt_wide<kAct, kHasBias>(args, stream);
  }
  return launch_simt_fallback<T, kAct, kHasBias>(args, stream);
}

template <typename T, Activation kAct, bool kHasBias>
cudaError_t run_gemm_typed(const GemmArgs& args, cudaStream_t stream) {
  const GemmKernel kernel = select_gemm_kernel(args, device_props());
  if constexpr (!std::is_same_v<T, float>) {
    if (kernel == GemmKernel::kTensorCoreLarge) {
      return args.b_k_major ? launch_tensor_core<T, TcLarge, true, kAct, kHasBias>(args, stream)
                            : launch_tensor_core<T, TcLarge, false, kAct, kHasBias>(args, stream);
    }
    if (kernel == GemmKernel::kTensorCoreSmall) {
      return args.b_k_major ? launch_tensor_core<T, TcSmall, true, kAct, kHasBias>(args, stream)
                            : launch_tensor_core<T, TcSmall, false, kAct, kHasBias>(args, stream);
    }
  }
  return launch_simt<T, kAct, kHasBias>(args, stream);
}

// Validates what every GEMM launcher needs, then dispatches on dtype.
template <Activation kAct, bool kHasBias>
cudaError_t run_gemm(const GemmArgs& args, cudaStream_t stream) {
  if (args.batch < 0 || args.m < 0 || args.n < 0 || args.k < 0) return cudaErrorInvalidValue;
  if (args.batch == 0 || args.m == 0 || args.n == 0) return cudaSuccess;  // nothing to write
  if (args.c == nullptr || (args.k > 0 && (args.a == nullptr || args.b == nullptr)))
    return cudaErrorInvalidValue;
  switch (args.dtype) {
    case DType::kFloat32:
      return run_gemm_typed<float, kAct, kHasBias>(args, stream);
    case DType::kFloat16:
      return run_gemm_typed<__half, kAct, kHasBias>(args, stream);
    case DType::kBFloat16:
      return run_gemm_typed<__nv_bfloat16, kAct, kHasBias>(args, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace gemm
}  // namespace dualk
