// The one tiled GEMM core behind matmul.cu and linear_gelu.cu:
//   C[b] = act(A[b] @ B[b] + bias), fp32 accumulation, bias and activation applied to the fp32
//   accumulator before the down-cast (compile-time parameters kAct, kHasBias).
//
// Two kernel templates and one host-side choice between them (select_gemm_kernel):
//   * gemm_tensor_core_kernel: fp16/bf16, mma.sync.m16n8k16 fed by ldmatrix from a kStages-deep
//     cp.async shared-memory pipeline. Needs 16-byte aligned operand rows (see a_rows_aligned).
//   * gemm_simt_kernel: exact fp32 FMA, 128x128x8 block tile, 8x8 outputs per thread, register
//     double buffering. The fp32 path, and the general fallback for fp16/bf16 operands that
//     cp.async cannot serve (k % 8 != 0, odd strides, misaligned base pointers).
// Both walk tiles with a grid-stride loop over a flat (batch, tile) index, so any batch and any
// number of tiles fit in gridDim.x, and both index memory with 64-bit offsets.
//
// Instantiation: each .cu file calls run_gemm<kAct, kHasBias> with its own activation and bias
// flags, so no kernel is compiled in two files.
#pragma once

#include <algorithm>
#include <atomic>
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

constexpr int kTcBlockK = 32;
// Shared-memory rows are padded by 8 elements (16 bytes): a row of 32 + 8 elements is 80 bytes, so
// the 8 row addresses of one ldmatrix 8x8 matrix land on 8 distinct 16-byte bank groups
// ((row * 5 + chunk) % 8 differs for 8 consecutive rows). Same for the (k, n) layout of B:
// (kBlockN + 8) * 2 bytes is an odd number of 16-byte chunks.
constexpr int kTcPad = 8;

template <int kBlockM, int kBlockN, int kWarpsM, int kWarpsN, int kStages, bool kBKMajor>
struct TensorCoreConfig {
  static constexpr int kBlockK = kTcBlockK;
  static constexpr int kThreads = kWarpsM * kWarpsN * 32;
  static constexpr int kWarpTileM = kBlockM / kWarpsM;
  static constexpr int kWarpTileN = kBlockN / kWarpsN;
  static constexpr int kMmaTilesM = kWarpTileM / 16;  // m16 tiles per warp
  static constexpr int kMmaTilesN = kWarpTileN / 8;   // n8 tiles per warp
  static constexpr int kStrideA = kBlockK + kTcPad;   // sA[m][k]
  // sB[n][k] when B is k-major (ldmatrix), sB[k][n] otherwise (ldmatrix.trans).
  static constexpr int kStrideB = kBKMajor ? kBlockK + kTcPad : kBlockN + kTcPad;
  static constexpr int kStageElemsA = kBlockM * kStrideA;
  static constexpr int kStageElemsB = kBKMajor ? kBlockN * kStrideB : kBlockK * kStrideB;
  static constexpr int kStageElems = kStageElemsA + kStageElemsB;
  // The epilogue stages the fp32 C tile through the same memory; +8 floats for conflict-free stores.
  static constexpr int kStrideC = kBlockN + 8;
  static constexpr int kPipelineBytes = kStages * kStageElems * 2;  // 2-byte elements
  static constexpr int kEpilogueBytes = kBlockM * kStrideC * 4;
  static constexpr int kSmemBytes = kPipelineBytes > kEpilogueBytes ? kPipelineBytes : kEpilogueBytes;

  static constexpr int kChunksPerRowA = kBlockK / 8;  // 16-byte chunks of 8 elements
  static constexpr int kChunksA = kBlockM * kChunksPerRowA;
  static constexpr int kChunksPerRowB = kBKMajor ? kBlockK / 8 : kBlockN / 8;
  static constexpr int kChunksB = kBlockN * kBlockK / 8;
  static constexpr int kLoadsA = kChunksA / kThreads;
  static constexpr int kLoadsB = kChunksB / kThreads;

  static_assert(kBlockM % (16 * kWarpsM) == 0 && kBlockN % (16 * kWarpsN) == 0, "warp tile shape");
  static_assert(kMmaTilesN % 2 == 0, "B fragments are loaded two n8 tiles per ldmatrix_x4");
  static_assert(kChunksA % kThreads == 0 && kChunksB % kThreads == 0, "whole chunks per thread");
  static_assert(kStages >= 2, "pipeline depth");
};

// Host-checked precondition (a_rows_aligned, b_rows_aligned): every 16-byte chunk of A and B rows starts on a
// 16-byte boundary, and k (and n for B (k, n)) is a multiple of 8, so each chunk is either wholly
// inside the matrix or wholly outside (then zero-filled).
template <typename T, int kBlockM, int kBlockN, int kWarpsM, int kWarpsN, int kStages, int kMinBlocks,
          bool kBKMajor, Activation kAct, bool kHasBias>
__global__ void __launch_bounds__(kWarpsM* kWarpsN * 32, kMinBlocks)
    gemm_tensor_core_kernel(const GemmArgs args) {
  using Cfg = TensorCoreConfig<kBlockM, kBlockN, kWarpsM, kWarpsN, kStages, kBKMajor>;
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
  const int warp_m = warp / kWarpsN;
  const int warp_n = warp % kWarpsN;

  const int64_t tiles_m = ceil_div(m, kBlockM);
  const int64_t tiles_n = ceil_div(n, kBlockN);
  const int64_t num_tiles = args.batch * tiles_m * tiles_n;
  const int64_t k_tiles = ceil_div(k, Cfg::kBlockK);
  // 16-byte stores of C need 16-byte aligned rows.
  const bool c_vec16 = ((reinterpret_cast<uintptr_t>(c) & 15) | (args.stride_cm & 7) |
                        (args.batch > 1 ? (args.stride_c_batch & 7) : 0)) == 0;

  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const TileCoord coord = tile_coord(tile, tiles_m, tiles_n);
    const int64_t m0 = coord.tile_m * kBlockM;
    const int64_t n0 = coord.tile_n * kBlockN;
    const T* a_batch = a + coord.batch * args.stride_a_batch;
    const T* b_batch = b + coord.batch * args.stride_b_batch;

    // Per-thread source rows, fixed for the whole k loop: the k offset is added per tile.
    const T* a_src[Cfg::kLoadsA];
    bool a_row_ok[Cfg::kLoadsA];
#pragma unroll
    for (int i = 0; i < Cfg::kLoadsA; ++i) {
      const int chunk = tid + i * Cfg::kThreads;
      const int row = chunk / Cfg::kChunksPerRowA;
      const int col = (chunk % Cfg::kChunksPerRowA) * 8;
      a_row_ok[i] = m0 + row < m;
      a_src[i] = a_batch + (a_row_ok[i] ? (m0 + row) * args.stride_am : 0) + col;
    }
    const T* b_src[Cfg::kLoadsB];
    bool b_row_ok[Cfg::kLoadsB];  // k-major: n row inside; (k, n): n chunk inside
#pragma unroll
    for (int i = 0; i < Cfg::kLoadsB; ++i) {
      const int chunk = tid + i * Cfg::kThreads;
      const int row = chunk / Cfg::kChunksPerRowB;
      const int col = (chunk % Cfg::kChunksPerRowB) * 8;
      if constexpr (kBKMajor) {
        b_row_ok[i] = n0 + row < n;
        b_src[i] = b_batch + (b_row_ok[i] ? (n0 + row) * args.stride_b_outer : 0) + col;
      } else {
        b_row_ok[i] = n0 + col < n;
        b_src[i] = b_batch + row * args.stride_b_outer + (b_row_ok[i] ? n0 + col : 0);
      }
    }

    auto load_stage = [&](int stage, int64_t k_tile) {
      T* sa = smem + stage * Cfg::kStageElems;
      T* sb = sa + Cfg::kStageElemsA;
      const int64_t k0 = k_tile * Cfg::kBlockK;
#pragma unroll
      for (int i = 0; i < Cfg::kLoadsA; ++i) {
        const int chunk = tid + i * Cfg::kThreads;
        const int row = chunk / Cfg::kChunksPerRowA;
        const int col = (chunk % Cfg::kChunksPerRowA) * 8;
        const bool ok = a_row_ok[i] && k0 + col < k;
        // A zero-byte copy reads nothing; the pointer still stays inside the allocation.
        cp_async_16(sa + row * Cfg::kStrideA + col, ok ? a_src[i] + k0 : a_batch, ok ? 16 : 0);
      }
#pragma unroll
      for (int i = 0; i < Cfg::kLoadsB; ++i) {
        const int chunk = tid + i * Cfg::kThreads;
        const int row = chunk / Cfg::kChunksPerRowB;
        const int col = (chunk % Cfg::kChunksPerRowB) * 8;
        if constexpr (kBKMajor) {
          const bool ok = b_row_ok[i] && k0 + col < k;
          cp_async_16(sb + row * Cfg::kStrideB + col, ok ? b_src[i] + k0 : b_batch, ok ? 16 : 0);
        } else {
          const bool ok = b_row_ok[i] && k0 + row < k;
          cp_async_16(sb + row * Cfg::kStrideB + col,
                      ok ? b_src[i] + k0 * args.stride_b_outer : b_batch, ok ? 16 : 0);
        }
      }
    };

    float acc[Cfg::kMmaTilesM][Cfg::kMmaTilesN][4];
#pragma unroll
    for (int i = 0; i < Cfg::kMmaTilesM; ++i)
#pragma unroll
      for (int j = 0; j < Cfg::kMmaTilesN; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;

    // Prologue: tiles 0 .. kStages-2 in flight, one commit group each (empty groups keep the
    // group count equal to the tile index, which the wait below relies on).
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < k_tiles) load_stage(s, s);
      cp_async_commit();
    }

    for (int64_t kt = 0; kt < k_tiles; ++kt) {
      // Groups committed so far: kStages-1+kt; at most kStages-2 pending means tile kt landed.
      cp_async_wait<kStages - 2>();
      // Makes tile kt visible to all warps, and guarantees every warp finished computing on tile
      // kt-1, whose stage the load below overwrites.
      __syncthreads();
      const int64_t next = kt + kStages - 1;
      if (next < k_tiles) load_stage(static_cast<int>(next % kStages), next);
      cp_async_commit();

      const T* sa = smem + static_cast<int>(kt % kStages) * Cfg::kStageElems;
      const T* sb = sa + Cfg::kStageElemsA;
#pragma unroll
      for (int kk = 0; kk < Cfg::kBlockK; kk += 16) {
        uint32_t a_frag[Cfg::kMmaTilesM][4];
        uint32_t b_frag[Cfg::kMmaTilesN][2];
#pragma unroll
        for (int i = 0; i < Cfg::kMmaTilesM; ++i) {
          // Lanes 0-15 address rows 0-15 at k 0-7, lanes 16-31 rows 0-15 at k 8-15: the four 8x8
          // matrices come back as a0 (rows 0-7, k 0-7), a1 (rows 8-15), a2 (k 8-15), a3.
          const int row = warp_m * Cfg::kWarpTileM + i * 16 + (lane % 16);
          const int col = kk + (lane / 16) * 8;
          ldmatrix_x4(a_frag[i], sa + row * Cfg::kStrideA + col);
        }
#pragma unroll
        for (int j = 0; j < Cfg::kMmaTilesN; j += 2) {
          uint32_t r[4];
          if constexpr (kBKMajor) {
            // sB[n][k]: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
            // are b0, b1 of n-tile j and b0, b1 of n-tile j+1.
            const int row = warp_n * Cfg::kWarpTileN + j * 8 + (lane % 8) + (lane / 16) * 8;
            const int col = kk + ((lane / 8) % 2) * 8;
            ldmatrix_x4(r, sb + row * Cfg::kStrideB + col);
          } else {
            // sB[k][n], transposed on load: matrices (k 0-7, n 0-7), (k 8-15, n 0-7),
            // (k 0-7, n 8-15), (k 8-15, n 8-15), the same four fragments.
            const int row = kk + (lane % 16);
            const int col = warp_n * Cfg::kWarpTileN + j * 8 + (lane / 16) * 8;
            ldmatrix_x4_trans(r, sb + row * Cfg::kStrideB + col);
          }
          b_frag[j][0] = r[0];
          b_frag[j][1] = r[1];
          b_frag[j + 1][0] = r[2];
          b_frag[j + 1][1] = r[3];
        }
#pragma unroll
        for (int i = 0; i < Cfg::kMmaTilesM; ++i)
#pragma unroll
          for (int j = 0; j < Cfg::kMmaTilesN; ++j) mma_16816<T>(acc[i][j], a_frag[i], b_frag[j]);
      }
    }
    // Drain (only empty groups can remain) and let every warp finish reading the pipeline buffers
    // before the epilogue reuses them.
    cp_async_wait<0>();
    __syncthreads();

    // Epilogue, stage 1: the fp32 accumulators into a C tile in shared memory (the pipeline buffers
    // are free now). Lane (g = lane / 4, t = lane % 4) holds rows g and g + 8, columns 2t and 2t + 1
    // of every m16n8 tile; a row stride of 8 (mod 32) words puts each half-warp's 16 float2 stores
    // on 32 distinct banks.
    float* s_c = reinterpret_cast<float*>(smem_raw);
    const int g = lane / 4;
    const int t = lane % 4;
#pragma unroll
    for (int i = 0; i < Cfg::kMmaTilesM; ++i) {
#pragma unroll
      for (int j = 0; j < Cfg::kMmaTilesN; ++j) {
        const int row = warp_m * Cfg::kWarpTileM + i * 16 + g;
        const int col = warp_n * Cfg::kWarpTileN + j * 8 + 2 * t;
        *reinterpret_cast<float2*>(s_c + row * Cfg::kStrideC + col) = make_float2(acc[i][j][0], acc[i][j][1]);
        *reinterpret_cast<float2*>(s_c + (row + 8) * Cfg::kStrideC + col) =
            make_float2(acc[i][j][2], acc[i][j][3]);
      }
    }
    __syncthreads();

    // Stage 2: per 8-column chunk of a row, bias + activation in fp32, down-cast, one 16-byte store
    // (coalesced across the warp); masked element stores at the edges or when C rows are not
    // 16-byte aligned. Kept rolled: the activation is inlined once, not once per accumulator.
    T* c_batch = c + coord.batch * args.stride_c_batch;
    constexpr int kChunksPerRowC = kBlockN / 8;
#pragma unroll 1
    for (int chunk = tid; chunk < kBlockM * kChunksPerRowC; chunk += Cfg::kThreads) {
      const int row = chunk / kChunksPerRowC;
      const int col = (chunk % kChunksPerRowC) * 8;
      const int64_t g_row = m0 + row;
      const int64_t g_col = n0 + col;
      if (g_row >= m || g_col >= n) continue;
      const float4 lo = *reinterpret_cast<const float4*>(s_c + row * Cfg::kStrideC + col);
      const float4 hi = *reinterpret_cast<const float4*>(s_c + row * Cfg::kStrideC + col + 4);
      const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      T* dst = c_batch + g_row * args.stride_cm + g_col;
      if (c_vec16 && g_col + 8 <= n) {
        uint4 packed;
        uint32_t* words = reinterpret_cast<uint32_t*>(&packed);
#pragma unroll
        for (int e = 0; e < 8; e += 2)
          words[e / 2] = pack2<T>(epilogue_value<T, kAct, kHasBias>(v[e], bias, g_col + e),
                                  epilogue_value<T, kAct, kHasBias>(v[e + 1], bias, g_col + e + 1));
        *reinterpret_cast<uint4*>(dst) = packed;
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (g_col + e < n) dst[e] = from_float<T>(epilogue_value<T, kAct, kHasBias>(v[e], bias, g_col + e));
      }
    }
    // The next tile's prologue overwrites shared memory.
    __syncthreads();
  }
}

// ------------------------------------------------------------------ SIMT kernel (fp32, fallback)

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

struct DeviceLimits {
  int num_sms;
  int max_smem_per_block;  // opt-in limit for dynamic shared memory
};

// Cached per device: the attribute queries are cheap but not free on every launch.
inline DeviceLimits device_limits() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> sms_cache[kMaxDevices] = {};
  static std::atomic<int> smem_cache[kMaxDevices] = {};
  DeviceLimits limits{132, 227 * 1024};  // H100 values if a query fails
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return limits;
  const bool cacheable = device >= 0 && device < kMaxDevices;
  if (cacheable && sms_cache[device].load(std::memory_order_relaxed) > 0) {
    limits.num_sms = sms_cache[device].load(std::memory_order_relaxed);
    limits.max_smem_per_block = smem_cache[device].load(std::memory_order_relaxed);
    return limits;
  }
  int value = 0;
  if (cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, device) == cudaSuccess && value > 0)
    limits.num_sms = value;
  if (cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess &&
      value > 0)
    limits.max_smem_per_block = value;
  if (cacheable) {
    smem_cache[device].store(limits.max_smem_per_block, std::memory_order_relaxed);
    sms_cache[device].store(limits.num_sms, std::memory_order_relaxed);
  }
  return limits;
}

// Tensor-core tile configs (kBlockM x kBlockN x 32, warps, stages).
//   large: 128 x 256, 8 warps of 64 x 64, 4 stages: 120 KB of pipeline (k-major B), 132 KB with
//          the fp32 C tile of the epilogue; one block per SM;
//          the 64 x 64 warp tile gives the best mma-to-ldmatrix ratio mma.sync allows.
//   small: 64 x 64, 4 warps of 32 x 32, 4 stages: 40 KB, up to 4 blocks per SM; for grids the
//          large tile cannot fill.
struct TcLarge {
  static constexpr int kBlockM = 128, kBlockN = 256, kWarpsM = 2, kWarpsN = 4, kStages = 4;
  static constexpr int kMinBlocks = 1;  // ~240 registers x 256 threads
};
struct TcSmall {
  static constexpr int kBlockM = 64, kBlockN = 64, kWarpsM = 2, kWarpsN = 2, kStages = 4;
  static constexpr int kMinBlocks = 4;  // <= 128 registers: 16 warps per SM to hide latency
};

template <typename Tile>
constexpr int tensor_core_smem_bytes() {
  // The larger of the two B layouts.
  return std::max(TensorCoreConfig<Tile::kBlockM, Tile::kBlockN, Tile::kWarpsM, Tile::kWarpsN, Tile::kStages,
                                   true>::kSmemBytes,
                  TensorCoreConfig<Tile::kBlockM, Tile::kBlockN, Tile::kWarpsM, Tile::kWarpsN, Tile::kStages,
                                   false>::kSmemBytes);
}

// The one config heuristic: which kernel and tile serve C[b] = A[b] @ B[b] for these sizes.
inline GemmKernel select_gemm_kernel(const GemmArgs& args, const DeviceLimits& device) {
  if (args.dtype == DType::kFloat32) return GemmKernel::kSimt;
  if (!a_rows_aligned(args, 2) || !b_rows_aligned(args, 2)) return GemmKernel::kSimt;
  const int64_t large_tiles =
      args.batch * ceil_div(args.m, TcLarge::kBlockM) * ceil_div(args.n, TcLarge::kBlockN);
  // Half a wave of large tiles still beats many small ones (2048^2: 128 large tiles on 132 SMs);
  // below that, or when n <= 128 would leave half of a 256-wide tile idle, the 64 x 64 tile
  // spreads the work over more SMs.
  // The large tile needs 132 KB of shared memory (sm_80/sm_90 have 163/227 KB; sm_86/89 99 KB).
  const bool large = 2 * large_tiles >= device.num_sms && args.n > 128 &&
                     tensor_core_smem_bytes<TcLarge>() <= device.max_smem_per_block;
  return large ? GemmKernel::kTensorCoreLarge : GemmKernel::kTensorCoreSmall;
}

inline unsigned grid_for(int64_t num_tiles) {
  // The kernels loop over tiles, so the grid may be smaller than the tile count.
  return static_cast<unsigned>(std::min<int64_t>(num_tiles, 0x7fffffff));
}

template <typename T, typename Tile, bool kBKMajor, Activation kAct, bool kHasBias>
cudaError_t launch_tensor_core(const GemmArgs& args, cudaStream_t stream) {
  using Cfg = TensorCoreConfig<Tile::kBlockM, Tile::kBlockN, Tile::kWarpsM, Tile::kWarpsN, Tile::kStages,
                               kBKMajor>;
  auto kernel = gemm_tensor_core_kernel<T, Tile::kBlockM, Tile::kBlockN, Tile::kWarpsM, Tile::kWarpsN,
                                        Tile::kStages, Tile::kMinBlocks, kBKMajor, kAct, kHasBias>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const int64_t num_tiles =
      args.batch * ceil_div(args.m, Tile::kBlockM) * ceil_div(args.n, Tile::kBlockN);
  kernel<<<grid_for(num_tiles), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(args);
  return cudaGetLastError();
}

template <typename T, Activation kAct, bool kHasBias>
cudaError_t launch_simt(const GemmArgs& args, cudaStream_t stream) {
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

template <typename T, Activation kAct, bool kHasBias>
cudaError_t run_gemm_typed(const GemmArgs& args, cudaStream_t stream) {
  const GemmKernel kernel = select_gemm_kernel(args, device_limits());
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
