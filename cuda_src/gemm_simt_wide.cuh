// The fp32 GEMM wherever its preconditions hold, gemm_simt_wide_kernel: exact fp32 FMA, 128x128x8
// block tile, 128 threads of 8x16 outputs, register-staged float4 loads, one block per output
// tile, two blocks per SM (0.90-0.92x cuBLAS SGEMM on an H200; the measurements behind the shape
// are in its comment below). simt_wide_fits is the host-side precondition; anything else goes to
// gemm_simt_kernel (gemm_simt.cuh), as launch_simt in gemm_select.cuh decides.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "gemm_common.cuh"

namespace dualk {
namespace gemm {

// ------------------------------------------------------------------ wide SIMT kernel (fp32)

// The fp32 kernel wherever its preconditions hold (simt_wide_fits): 128 x 128 x 8 block tile,
// 128 threads as 2 x 2 warps of 64 x 64, 8 x 16 outputs per thread, two blocks per SM. Measured on
// an H200 (experiments/NOTES-simt.md, "simt_v3", config Mid8Late): 0.90-0.92x cuBLAS SGEMM on
// every timed case (4096^3: 2937 / 2988 us, B (k, n) / B k-major), where gemm_simt_kernel reaches
// 0.71-0.77x, and 0.90x against 0.55x with the gelu + bias epilogue. 217-235 registers, no spills
// on sm_80 / sm_90a. Against the other shapes tried: 8 x 8 per thread at 256 threads came within
// ~3% either way (ahead on B k-major with BK 16, behind on gelu + bias) but sits at the
// 128-register cap; one 128 x 256 block per SM was 3-5% slower (at two per SM one block's barrier
// hides behind the other's FMAs); BK 16 at 128 threads was slower on every case.
constexpr int kSimtWideBlockM = 128;
constexpr int kSimtWideBlockN = 128;
constexpr int kSimtWideBlockK = 8;
constexpr int kSimtWideThreadM = 8;    // outputs per thread along m: rows r..r+3 and r+32..r+35
constexpr int kSimtWideThreadN = 16;   // along n: four runs of 4 columns, 16 apart
constexpr int kSimtWideThreads = 128;  // 2 x 2 warps, lanes 8 (m) x 4 (n)
constexpr int kSimtWideMinBlocks = 2;
// sA[k][m] and sB[k][n] rows padded by 4 floats (as gemm_simt.cuh's kSimtStride): 132 = 4 mod 32
// banks keeps the transposing stores conflict-free, and rows stay 16-byte aligned for float4.
constexpr int kSimtWideStride = kSimtWideBlockM + 4;
constexpr int kSimtWideBufFloats = kSimtWideBlockK * kSimtWideStride;  // one buffer of one operand
constexpr int kSimtWideSmemBytes = 2 * 2 * kSimtWideBufFloats * 4;     // 16,896 bytes
static_assert(kSimtWideBlockM == kSimtWideBlockN, "one row stride for sA and sB");
static_assert(kSimtWideBlockM == 2 * 8 * kSimtWideThreadM &&
                  kSimtWideBlockN == 2 * 4 * kSimtWideThreadN,
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

  __device__ __forceinline__ void init(const float* base, int64_t stride, int64_t outer0,
                                       int64_t outer_size, int tid) {
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
  static constexpr int kPerRow = kSimtWideBlockN / 4;          // threads per k row
  static constexpr int kRowStep = kSimtWideThreads / kPerRow;  // k rows between chunks
  const float* src;  // k row t/32 of the next k tile to load, column n0 + 4 (t % 32)
  int64_t stride_k;
  int k_row;  // t / 32
  bool col_ok;

  __device__ __forceinline__ void init(const float* base, int64_t stride, int64_t n0, int64_t n,
                                       int tid) {
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
      *reinterpret_cast<float4*>(s + (k_row + kRowStep * h) * kSimtWideStride +
                                 (tid % kPerRow) * 4) = v[h];
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
// double-buffered in registers across kk. No branches: loads past k are masked off (k_left <= 0)
// and their zeros go to the idle buffer. Loading a whole tile earlier instead (staging registers
// live through the loop) measured 0.87x instead of 0.90x cuBLAS on B k-major and spilled on sm_80.
// k == 0 runs no k tile and writes act(bias).
template <bool kBKMajor, Activation kAct, bool kHasBias>
__global__ void __launch_bounds__(kSimtWideThreads, kSimtWideMinBlocks)
    gemm_simt_wide_kernel(const GemmArgs args) {
  constexpr int kBK = kSimtWideBlockK, kStride = kSimtWideStride, kTN = kSimtWideThreadN;
  // float, not the tensor-core kernel's byte array: that form changes the fragment address
  // arithmetic (different SASS and register counts) from the code that was measured.
  extern __shared__ __align__(16) float smem_f32[];
  float* const s_a = smem_f32;                           // [2][kBK][kStride]: sA[k][m]
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
      *reinterpret_cast<float4*>(&fb[f][4 * g]) =
          *reinterpret_cast<const float4*>(sb + col_base + 16 * g);
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
    gemm_simt_wide_kernel<true, kAct, kHasBias>
        <<<grid, kSimtWideThreads, kSimtWideSmemBytes, stream>>>(args);
  else
    gemm_simt_wide_kernel<false, kAct, kHasBias>
        <<<grid, kSimtWideThreads, kSimtWideSmemBytes, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace gemm
}  // namespace dualk
