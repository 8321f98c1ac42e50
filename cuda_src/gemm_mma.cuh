// Portable tensor-core GEMM (fp16/bf16, sm_80 and later): gemm_tensor_core_kernel runs
// mma.sync.m16n8k16 fed by ldmatrix from a kStages-deep cp.async shared-memory pipeline, with the
// bias + activation epilogue straight from the fp32 accumulators. Needs 16-byte aligned operand
// rows (a_rows_aligned / b_rows_aligned) and k < 2^31; walks tiles with a grid-stride loop over a
// flat (batch, tile) index, so any batch and any number of tiles fit in gridDim.x.
// Its two tile configs (TcLarge, TcSmall) and launch_tensor_core are here; which one runs is
// decided in gemm_select.cuh. On sm_90a devices gemm_sm90.cuh (TMA + wgmma) takes 16-bit GEMMs
// first, and this kernel serves the rest.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "gemm_common.cuh"

namespace dualk {
namespace gemm {

// ------------------------------------------------------------------ tensor-core kernel (fp16/bf16)

// Shared-memory tiles are stored unpadded with 16-byte chunks XOR-swizzled inside each 128-byte
// line, so the 8 row addresses of one ldmatrix 8x8 matrix (8 rows, one logical chunk) and the
// cp.async chunk stores of a warp land on 8 distinct 16-byte bank groups:
//   rows of >= 8 chunks (>= 128 bytes): physical chunk = chunk ^ (row % 8);
//   rows of 4 chunks (64 bytes, two rows per 128-byte line): chunk ^ ((row / 2) % 4).
template <int kChunks> __device__ __forceinline__ int swizzled_offset(int row, int chunk) {
  static_assert(kChunks == 4 || kChunks % 8 == 0,
                "swizzle needs 4 or a multiple of 8 chunks per row");
  if constexpr (kChunks >= 8)
    return row * kChunks * 8 + ((chunk ^ (row & 7)) * 8);
  else
    return row * 32 + ((chunk ^ ((row >> 1) & 3)) * 8);
}

// Tile: kBlockM x kBlockN x kBlockK block tile, kWarpsM x kWarpsN warps, kStages-deep cp.async
// pipeline, kMinBlocks for __launch_bounds__ (see TcLarge/TcMedium/TcSmall below).
template <typename Tile, bool kBKMajor> struct TensorCoreConfig {
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
// Main loop (per k tile, kKSteps mma steps of k16): the fragments of step s+1 are loaded from
// shared memory (ldmatrix) while the mma of step s run; the wait for the next stage and the one
// barrier per k tile sit before the last step, so the next stage's first fragments also overlap the
// last mma. Epilogue straight from the accumulators: bias and activation in fp32 registers, two
// outputs per 32-bit store. TOut: the output's element type, T (the operands') or float (split-K
// partial products).
template <typename T, typename Tile, bool kBKMajor, Activation kAct, bool kHasBias,
          typename TOut = T>
__global__ void __launch_bounds__(Tile::kWarpsM* Tile::kWarpsN * 32, Tile::kMinBlocks)
    gemm_tensor_core_kernel(const GemmArgs args) {
  using Cfg = TensorCoreConfig<Tile, kBKMajor>;
  constexpr int kStages = Cfg::kStages;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);

  const T* __restrict__ a = static_cast<const T*>(args.a);
  const T* __restrict__ b = static_cast<const T*>(args.b);
  const T* __restrict__ bias = static_cast<const T*>(args.bias);
  TOut* __restrict__ c = static_cast<TOut*>(args.c);
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
  // B k-major, sB[n][k]: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k
  // 8-15) are b0, b1 of n-tile j and b0, b1 of n-tile j+1. B (k, n), sB[k][n] transposed on load:
  // (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15), the same four fragments;
  // its chunk does not depend on the k step.
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
        ldmatrix_x4_u32(a_frag[buf][i],
                        sa + a_ld_row_off + i * 16 * kRowBytesA + (((2 * ks) ^ a_ld_hx) * 16));
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
          load_frags((ks + 1) % 2, smem_base + read_stage * (Cfg::kStageElems * 2),
                     (ks + 1) % Cfg::kKSteps);
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
    TOut* c_batch = c + coord.batch * args.stride_c_batch;
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
          TOut* dst = c_batch + (m0 + row) * args.stride_cm + n0 + col;
          if constexpr (std::is_same_v<TOut, float>) {
            dst[0] = v0;
            if (pair) dst[1] = v1;
          } else if (c_vec && pair) {
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

// ------------------------------------------------------------------ host side

// Tensor-core tile configs (kBlockM x kBlockN x kBlockK, warps, stages, blocks per SM).
//   large: 128 x 256 x 32, 8 warps of 64 x 64, 4 stages: 96 KB; one block per SM (~255 registers).
//          Measured on an H200 (experiments/NOTES-gemm.md) against BK = 64 with 3 or 4 stages,
//          256 x 128, and 128 x 128 at two blocks per SM (4 warps of 64 x 64, or 8 warps of 64 x
//          32, which spill at the 128-register cap): this one was fastest or tied on every case.
//   small: 64 x 64 x 32, 4 warps of 32 x 32, 4 stages: 32 KB, up to 4 blocks per SM; for grids the
//          large tile cannot fill.
struct TcLarge {
  static constexpr int kBlockM = 128, kBlockN = 256, kBlockK = 32, kWarpsM = 2, kWarpsN = 4,
                       kStages = 4;
  static constexpr int kMinBlocks = 1;
};
struct TcSmall {
  static constexpr int kBlockM = 64, kBlockN = 64, kBlockK = 32, kWarpsM = 2, kWarpsN = 2,
                       kStages = 4;
  static constexpr int kMinBlocks = 4;  // <= 128 registers: 16 warps per SM to hide latency
};

template <typename Tile> constexpr int tensor_core_smem_bytes() {
  return TensorCoreConfig<Tile, true>::kSmemBytes;  // the same for both B layouts
}

template <typename T, typename Tile, bool kBKMajor, Activation kAct, bool kHasBias,
          typename TOut = T>
cudaError_t launch_tensor_core(const GemmArgs& args, cudaStream_t stream) {
  using Cfg = TensorCoreConfig<Tile, kBKMajor>;
  auto kernel = gemm_tensor_core_kernel<T, Tile, kBKMajor, kAct, kHasBias, TOut>;
  cudaError_t err = ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const int64_t num_tiles =
      args.batch * ceil_div(args.m, Tile::kBlockM) * ceil_div(args.n, Tile::kBlockN);
  kernel<<<grid_for(num_tiles), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace gemm
}  // namespace dualk
