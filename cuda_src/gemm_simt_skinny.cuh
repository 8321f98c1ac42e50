// The fp32 GEMM for few rows, gemm_simt_skinny_kernel: exact fp32 FMA as gemm_simt_wide_kernel,
// but a 32 x 128 block tile (128 threads of 4 x 8 outputs) for m <= kSimtSkinnyMaxM, where the
// wide kernel's 128-row tile computes 3/4 or more padding rows. linear_gelu fp32 32x768->3072 on
// an H200 (192 split-K CTAs): 18.2 us with this one, Triton's 18.2 in the same run, where 33 rows
// on the wide kernel take 29.5; 32x4096->4096: 67 against 141 (33 rows). Same preconditions as
// the wide kernel (16-byte rows); launch_simt (gemm_select.cuh) takes it when simt_skinny_fits,
// for one-pass calls and for split-K slices alike.
// Not done: a GEMV for m <= 8 (1x4096->11008 matmul: 167 us here, cuBLAS 53; the tile computes
// 32 rows for one).
#pragma once

#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "gemm_common.cuh"

namespace dualk {
namespace gemm {

constexpr int64_t kSimtSkinnyMaxM = 32;  // rows per batch entry this kernel is chosen for
constexpr int kSimtSkinnyBlockM = 32;
constexpr int kSimtSkinnyBlockN = 128;
// k per tile. The wide kernel's 8 would give 256 FMAs per thread between two global loads of a
// 32-row tile, too few to cover a load's latency at the 1-3 CTAs per SM these grids have; what
// limits is the bytes in flight per SM. Measured on an H200 (fp32, CUDA events, L2 flushed;
// experiments/results/2026-11-29-h200-fp32-skinny-s38-bk{16,32}.json), k tile 16 -> 32:
// linear_gelu 32x4096->4096 74.8 -> 67.3 us, 1x4096->4096 71.4 -> 60.9, 32x768->3072 18.6 -> 18.2;
// matmul 1x4096->11008 226 -> 167 (every case of the probe as fast or faster).
constexpr int kSimtSkinnyBlockK = 32;
constexpr int kSimtSkinnyThreads = 128;  // 4 warps side by side along n, lanes 8 (m) x 4 (n)
constexpr int kSimtSkinnyMinBlocks = 3;  // 143-157 registers (ptxas, sm_90a / sm_80)
constexpr int kSimtSkinnyThreadM = 4;    // rows r..r+3
constexpr int kSimtSkinnyThreadN = 8;    // two runs of 4 columns, 16 apart
// Rows of sA[k][m] / sB[k][n] padded by 4 floats: 16-byte aligned for float4, and the transposing
// stores of k-contiguous loads (4 lanes per row, below) hit 16 banks per store: 2-way, against
// 32 FMAs per thread per k of the tile.
constexpr int kSimtSkinnyStrideA = kSimtSkinnyBlockM + 4;
constexpr int kSimtSkinnyStrideB = kSimtSkinnyBlockN + 4;
constexpr int kSimtSkinnySmemBytes =  // 43,008 bytes: two buffers of both operands
    2 * kSimtSkinnyBlockK * (kSimtSkinnyStrideA + kSimtSkinnyStrideB) * 4;
static_assert(kSimtSkinnyBlockM == 8 * kSimtSkinnyThreadM &&
                  kSimtSkinnyBlockN == 4 * 4 * kSimtSkinnyThreadN,
              "4 warps of 8 x 4 lanes cover the block tile");
static_assert(kSimtSkinnySmemBytes <= 48 * 1024,
              "dynamic shared memory above 48 KB needs an opt-in");

// k-contiguous operand tile (A (m, k) or B k-major (n, k)), kRows rows x 32 k: thread t loads the
// float4s at row t/4 + 32 h, k 4 (t % 4) + 16 c (four lanes read 64 bytes of a row per load).
// With 16-byte rows and k % 4 == 0 a float4 is wholly inside or outside k.
template <int kRows> struct SimtSkinnyKLoader {
  static constexpr int kRowChunks = kRows / 32, kKChunks = kSimtSkinnyBlockK / 16;
  static constexpr int kChunks = kRowChunks * kKChunks;  // chunk h * kKChunks + c
  const float* src;  // row t/4, k 4 (t % 4) of the next k tile to load
  int64_t row_step;  // elements from chunk h's row to chunk h + 1's
  unsigned row_ok;   // bit h: chunk h's row is inside
  int k_off;         // 4 (t % 4)

  __device__ __forceinline__ void init(const float* base, int64_t stride, int64_t outer0,
                                       int64_t outer_size, int tid) {
    const int64_t row = outer0 + tid / 4;
    row_ok = 0;
#pragma unroll
    for (int h = 0; h < kRowChunks; ++h)
      if (row + 32 * h < outer_size) row_ok |= 1u << h;
    k_off = (tid % 4) * 4;
    src = base + (row < outer_size ? row * stride : 0) + k_off;
    row_step = 32 * stride;
  }
  // k_left: k minus the first k of the tile to load; <= 0 loads zeros.
  __device__ __forceinline__ void load(float4 (&v)[kChunks], int k_left) const {
#pragma unroll
    for (int h = 0; h < kRowChunks; ++h)
#pragma unroll
      for (int c = 0; c < kKChunks; ++c) {
        float4& x = v[h * kKChunks + c];
        x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (((row_ok >> h) & 1) && k_off + 16 * c < k_left)
          x = __ldg(reinterpret_cast<const float4*>(src + h * row_step + 16 * c));
      }
  }
  __device__ __forceinline__ void advance() { src += kSimtSkinnyBlockK; }
  // Transposed into s[k][row] (row stride kStride).
  template <int kStride>
  __device__ __forceinline__ void store(float* s, const float4 (&v)[kChunks], int tid) const {
#pragma unroll
    for (int h = 0; h < kRowChunks; ++h)
#pragma unroll
      for (int c = 0; c < kKChunks; ++c) {
        const float4& x = v[h * kKChunks + c];
        float* p = s + ((tid % 4) * 4 + 16 * c) * kStride + tid / 4 + 32 * h;
        p[0] = x.x;
        p[kStride] = x.y;
        p[2 * kStride] = x.z;
        p[3 * kStride] = x.w;
      }
  }
};

// B (k, n) tile, 32 k x 128 n: thread t loads the float4s at k rows t/32 + 4 h and columns
// 4 (t % 32), stored as they are (a warp writes one 512-byte row run).
struct SimtSkinnyNLoader {
  static constexpr int kChunks = kSimtSkinnyBlockK * kSimtSkinnyBlockN / 4 / kSimtSkinnyThreads;
  static constexpr int kRowStep = kSimtSkinnyThreads / 32;  // k rows between chunks
  const float* src;  // k row t/32 of the next k tile to load, column n0 + 4 (t % 32)
  int64_t stride_k;
  int k_row;  // t / 32
  bool col_ok;

  __device__ __forceinline__ void init(const float* base, int64_t stride, int64_t n0, int64_t n,
                                       int tid) {
    const int64_t col = n0 + (tid % 32) * 4;
    col_ok = col < n;
    k_row = tid / 32;
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
  __device__ __forceinline__ void advance() { src += kSimtSkinnyBlockK * stride_k; }
  template <int kStride>
  __device__ __forceinline__ void store(float* s, const float4 (&v)[kChunks], int tid) const {
#pragma unroll
    for (int h = 0; h < kChunks; ++h)
      *reinterpret_cast<float4*>(s + (k_row + kRowStep * h) * kStride + (tid % 32) * 4) = v[h];
  }
};

// Host-checked preconditions (simt_skinny_fits): fp32, 16-byte rows, k < 2^30, one block per
// output tile (grid = batch x tiles <= 2^31-1), in tile_coord order. Any m is computed correctly
// (tiles of 32 rows); the host chooses the kernel for m <= kSimtSkinnyMaxM only.
//
// Thread (warp w, lane l) owns rows 4 (l / 4) + {0..3} and columns 32 w + 4 (l % 4) + 16 g +
// {0..3}, g < 2: a warp's fragment loads read 8 distinct float4s of sA (128 bytes) and 4 of sB per
// run, each one shared-memory wavefront with broadcast.
//
// Main loop as gemm_simt_wide_kernel's: the next k tile's float4s are loaded into registers at
// kk = 0 and stored into the idle buffer at the last kk, then the one barrier; fragments are
// double-buffered in registers. k == 0 runs no k tile and writes act(bias).
template <bool kBKMajor, Activation kAct, bool kHasBias>
__global__ void __launch_bounds__(kSimtSkinnyThreads, kSimtSkinnyMinBlocks)
    gemm_simt_skinny_kernel(const GemmArgs args) {
  constexpr int kBK = kSimtSkinnyBlockK, kTM = kSimtSkinnyThreadM, kTN = kSimtSkinnyThreadN;
  constexpr int kStrideA = kSimtSkinnyStrideA, kStrideB = kSimtSkinnyStrideB;
  constexpr int kBufA = kBK * kStrideA, kBufB = kBK * kStrideB;  // floats, one buffer
  extern __shared__ __align__(16) float smem_f32[];
  float* const s_a = smem_f32;              // [2][kBK][kStrideA]: sA[k][m]
  float* const s_b = smem_f32 + 2 * kBufA;  // [2][kBK][kStrideB]: sB[k][n]

  const float* __restrict__ a = static_cast<const float*>(args.a);
  const float* __restrict__ b = static_cast<const float*>(args.b);
  const int64_t m = args.m, n = args.n;
  const int k = static_cast<int>(args.k);

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int row_base = (lane / 4) * kTM;
  const int col_base = warp * 32 + (lane % 4) * 4;

  const int64_t tiles_m = ceil_div(m, kSimtSkinnyBlockM), tiles_n = ceil_div(n, kSimtSkinnyBlockN);
  const TileCoord coord = tile_coord(blockIdx.x, tiles_m, tiles_n);
  const int64_t m0 = coord.tile_m * kSimtSkinnyBlockM, n0 = coord.tile_n * kSimtSkinnyBlockN;

  SimtSkinnyKLoader<kSimtSkinnyBlockM> la;
  la.init(a + coord.batch * args.stride_a_batch, args.stride_am, m0, m, tid);
  std::conditional_t<kBKMajor, SimtSkinnyKLoader<kSimtSkinnyBlockN>, SimtSkinnyNLoader> lb;
  lb.init(b + coord.batch * args.stride_b_batch, args.stride_b_outer, n0, n, tid);

  float acc[kTM][kTN];
#pragma unroll
  for (int i = 0; i < kTM; ++i)
#pragma unroll
    for (int j = 0; j < kTN; ++j) acc[i][j] = 0.f;

  // Prologue: k tile 0 into buffer 0; the loaders then point at k tile 1.
  float4 st_a[decltype(la)::kChunks], st_b[decltype(lb)::kChunks];
  la.load(st_a, k);
  lb.load(st_b, k);
  la.template store<kStrideA>(s_a, st_a, tid);
  lb.template store<kStrideB>(s_b, st_b, tid);
  la.advance();
  lb.advance();
  __syncthreads();

  float fa[2][kTM], fb[2][kTN];
  auto load_frags = [&](int f, const float* sa, const float* sb) {
    *reinterpret_cast<float4*>(&fa[f][0]) = *reinterpret_cast<const float4*>(sa + row_base);
#pragma unroll
    for (int g = 0; g < kTN / 4; ++g)
      *reinterpret_cast<float4*>(&fb[f][4 * g]) =
          *reinterpret_cast<const float4*>(sb + col_base + 16 * g);
  };
  load_frags(0, s_a, s_b);

  const int k_tiles = (k + kBK - 1) / kBK;
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int k_left = k - (kt + 1) * kBK;  // of tile kt + 1, where the loaders point
    const int buf = kt & 1;
    const float* sa = s_a + buf * kBufA;
    const float* sb = s_b + buf * kBufB;
    float* sa_next = s_a + (buf ^ 1) * kBufA;
    float* sb_next = s_b + (buf ^ 1) * kBufB;
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      if (kk == 0) {
        la.load(st_a, k_left);
        lb.load(st_b, k_left);
      }
      const int cur = kk % 2;
      if (kk < kBK - 1) {
        load_frags(cur ^ 1, sa + (kk + 1) * kStrideA, sb + (kk + 1) * kStrideB);
      } else {
        // The idle buffer's last fragment reads were issued before the previous k tile's barrier.
        la.template store<kStrideA>(sa_next, st_a, tid);
        lb.template store<kStrideB>(sb_next, st_b, tid);
        __syncthreads();
        la.advance();
        lb.advance();
        load_frags(cur ^ 1, sa_next, sb_next);
      }
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i][j] = fmaf(fa[cur][i], fb[cur][j], acc[i][j]);
    }
  }

  // Epilogue: bias loaded once per column; float4 stores when C rows are 16-byte aligned and
  // n % 4 == 0, so that a 4-column run (starting at a multiple of 4) is wholly inside or outside.
  const float* __restrict__ bias = static_cast<const float*>(args.bias);
  float* __restrict__ c = static_cast<float*>(args.c) + coord.batch * args.stride_c_batch;
  const bool c_vec = is_aligned16(args.c) && args.n % 4 == 0 &&
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
  for (int i = 0; i < kTM; ++i) {
    const int64_t row = m0 + row_base + i;
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

inline int64_t simt_skinny_tiles(const GemmArgs& args) {
  return args.batch * ceil_div(args.m, kSimtSkinnyBlockM) * ceil_div(args.n, kSimtSkinnyBlockN);
}

// Chosen for fp32 operands with at most kSimtSkinnyMaxM rows per batch entry and the wide kernel's
// preconditions: 16-byte rows, k < 2^30, one block per tile within gridDim.x's 2^31-1.
inline bool simt_skinny_fits(const GemmArgs& args) {
  return args.m <= kSimtSkinnyMaxM && args.k < (int64_t{1} << 30) &&
         simt_skinny_tiles(args) <= 0x7fffffff && a_rows_aligned(args, 4) &&
         b_rows_aligned(args, 4);
}

template <Activation kAct, bool kHasBias>
cudaError_t launch_simt_skinny(const GemmArgs& args, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(simt_skinny_tiles(args));  // simt_skinny_fits
  if (args.b_k_major)
    gemm_simt_skinny_kernel<true, kAct, kHasBias>
        <<<grid, kSimtSkinnyThreads, kSimtSkinnySmemBytes, stream>>>(args);
  else
    gemm_simt_skinny_kernel<false, kAct, kHasBias>
        <<<grid, kSimtSkinnyThreads, kSimtSkinnySmemBytes, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace gemm
}  // namespace dualk
