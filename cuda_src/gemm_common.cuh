// Pieces every portable GEMM kernel of the family shares (gemm_mma.cuh, gemm_simt.cuh,
// gemm_simt_wide.cuh), kept apart so each kernel's file holds only that kernel:
//   * tile_coord: the grouped tile order (kGroupM tile rows walked column by column, so blocks
//     launched together share B columns and a few A rows in L2); the Hopper kernel
//     (gemm_sm90.cuh) walks the same order in 32-bit form;
//   * epilogue_value: act(acc + bias) in fp32, before the down-cast;
//   * the host-side row-alignment checks (a_rows_aligned, b_rows_aligned) behind every 16-byte
//     load path, and grid_for for the grid-stride kernels.
// All index memory with 64-bit offsets.
#pragma once

#include <algorithm>
#include <cstdint>

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

// ------------------------------------------------------------------ host-side checks

inline bool aligned_to(const void* p, int64_t elem_stride_a, int64_t elem_stride_b, int64_t elems,
                       int64_t elem_bytes, int64_t bytes) {
  const int64_t elem_align = bytes / elem_bytes;
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0 &&
         elem_stride_a % elem_align == 0 && elem_stride_b % elem_align == 0 &&
         elems % elem_align == 0;
}

// 16-byte rows for A (along k) and B (along k or n): the precondition of cp.async tiles and of the
// fp32 float4 loads. A stride only matters when its dimension has more than one index (PyTorch
// gives size-1 dims arbitrary strides, and m == 1 is the common decode shape).
inline bool a_rows_aligned(const GemmArgs& args, int64_t elem_bytes) {
  return aligned_to(args.a, args.m > 1 ? args.stride_am : 0,
                    args.batch > 1 ? args.stride_a_batch : 0, args.k, elem_bytes, 16);
}
inline bool b_rows_aligned(const GemmArgs& args, int64_t elem_bytes) {
  const int64_t outer_size = args.b_k_major ? args.n : args.k;
  return aligned_to(args.b, outer_size > 1 ? args.stride_b_outer : 0,
                    args.batch > 1 ? args.stride_b_batch : 0, args.b_k_major ? args.k : args.n,
                    elem_bytes, 16);
}

inline unsigned grid_for(int64_t num_tiles) {
  // The kernels loop over tiles, so the grid may be smaller than the tile count.
  return static_cast<unsigned>(std::min<int64_t>(num_tiles, 0x7fffffff));
}

}  // namespace gemm
}  // namespace dualk
