// Rejected fp32 SIMT GEMM candidates for dualk (bench only). simt_v1 / simt_v2: first attempt (spills
// at 2 blocks/SM). The second attempt, simt_v3 (one generic register-staged kernel, several tile
// configs), won with its Mid8Late config, which now lives in cuda_src/gemm.cuh as
// gemm_simt_wide_kernel (the fp32 path of gemm::launch_simt); the generic kernel and its other
// configs (Small8, Small16, Mid16Split, Mid8, Big*, Tall8) are in simt_v3_configs.patch
// (`git apply bench/standalone/simt_v3_configs.patch` adds them back here). Every launcher has
// launch_simt's signature and semantics:
//   C[b] = act(A[b] @ B[b] + bias), exact fp32 (fmaf in k order per output, no TF32), any m/n/k,
//   both B layouts, batch (strides may be 0), k == 0 writes act(bias).
// The variants need 16-byte rows (gemm::a_rows_aligned / b_rows_aligned, 4 bytes per element) and
// fall back to gemm::launch_simt_fallback (gemm_simt_kernel) otherwise, and for 16-bit T (they are
// fp32 only).
//
// Shared shape of both kernels: 128 x 128 block tile, BK = 16, 256 threads = 8 warps arranged
// 2 (m) x 4 (n), warp tile 64 x 32, lanes 8 (m) x 4 (n), 8 x 8 outputs per thread. Compared with
// gemm_simt_kernel (warp tile 16 x 128) a warp reads 96 instead of 144 floats of shared memory per
// k, and every 16-byte shared load of a warp touches at most 128 contiguous bytes (one wavefront).
//
//   simt_v1<kMinBlocks>: register-staged global loads (float4) transposed into sA[k][m] / sB[k][n]
//     (two buffers), fragments double-buffered across k, one barrier per 16 k. The next tile's
//     loads are split in two halves (issued at k 0 and 8, stored at k 8 and 15) so only 8 staging
//     registers are live: the 128-register cap of 2 blocks/SM must hold 64 accumulators plus
//     2 x 16 fragments.
//   simt_v2<kStages, kMinBlocks>: cp.async (16 B) kStages-deep pipeline, no staging registers.
//     cp.async cannot transpose, so k-contiguous operands stay [outer][k] in shared memory (row
//     stride 20 floats: 8 consecutive rows' 16-byte chunks land in 8 distinct bank quads), and a
//     thread reads 4 k at once per row: thread rows are strided (lane_m + 8 i) so a warp's load
//     covers 8 consecutive rows. n-major B stays [k][n] and is read as float4 along n.
#pragma once

#include "gemm.cuh"

namespace dualk {
namespace simt_common {

constexpr int kBM = 128, kBN = 128, kBK = 16, kThreads = 256;

// Epilogue store of one output. c_vec: C rows 16-byte aligned and n % 4 == 0 (host-independent,
// checked in the kernel), so a 4-wide run starting at a multiple of 4 is wholly inside or outside.
template <Activation kAct, bool kHasBias>
__device__ __forceinline__ float epi(float v, const float* bias, int64_t col) {
  return gemm::epilogue_value<float, kAct, kHasBias>(v, bias, col);
}

__device__ __forceinline__ bool c_rows_vec(const GemmArgs& args) {
  return reinterpret_cast<uintptr_t>(args.c) % 16 == 0 && args.n % 4 == 0 &&
         (args.m <= 1 || args.stride_cm % 4 == 0) && (args.batch <= 1 || args.stride_c_batch % 4 == 0);
}

// Also k < 2^30, so the kernels keep k indices in 32 bits (register pressure at the 128 cap).
inline bool fp32_rows_aligned(const GemmArgs& args) {
  return args.k < (int64_t{1} << 30) && gemm::a_rows_aligned(args, 4) && gemm::b_rows_aligned(args, 4);
}

}  // namespace simt_common

// ==================================================================================== simt_v1
namespace simt_v1 {
using namespace simt_common;

constexpr int kStride = kBM + 4;  // sA[k][m], sB[k][n]; float4-aligned rows, see store banks below

// One k tile = two halves ("slots"); slot s of thread t holds one float4 of A and one of B.
//   k-contiguous operand (A, or B k-major): row = t / 2, k chunk = t % 2 + 2 s (4 k each).
//     Global: 2 threads read 32 contiguous bytes of a row. Transposing store of element i goes to
//     s[(chunk*4 + i)*132 + row]: bank = (16 chunk + 4 i + row) % 32; a warp has rows 0..15 (+c)
//     and chunks {2s, 2s+1} -> 32 distinct banks.
//   n-major B: k row = t / 32 + 8 s, n chunk = t % 32: one float4 store, conflict-free.
struct Loader {
  const float* src;     // slot 0's element of the current k tile
  int64_t slot_step;    // elements from slot 0 to slot 1
  int64_t tile_step;    // elements from one k tile to the next
  int k_off0;           // k of slot 0 inside the tile (slot 1: +8)
  bool outer_ok;
  bool k_contiguous;

  __device__ __forceinline__ void init_k_contiguous(const float* base, int64_t stride_outer, int64_t outer0,
                                                    int64_t outer_size, int tid) {
    k_contiguous = true;
    const int64_t row = outer0 + tid / 2;
    outer_ok = row < outer_size;
    k_off0 = (tid % 2) * 4;
    slot_step = 8;
    tile_step = kBK;
    src = base + (outer_ok ? row * stride_outer : 0) + k_off0;
  }
  __device__ __forceinline__ void init_n_contiguous(const float* base, int64_t stride_k, int64_t n0, int64_t n,
                                                    int tid) {
    k_contiguous = false;
    const int64_t col = n0 + (tid % 32) * 4;
    outer_ok = col < n;
    k_off0 = tid / 32;
    slot_step = 8 * stride_k;
    tile_step = kBK * stride_k;
    src = base + k_off0 * stride_k + (outer_ok ? col : 0);
  }
  // k_left: k minus the first k of the tile being loaded.
  template <int kSlot>
  __device__ __forceinline__ float4 load(int k_left) const {
    const int k_off = k_off0 + 8 * kSlot;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (outer_ok && k_off < k_left) v = __ldg(reinterpret_cast<const float4*>(src + (kSlot ? slot_step : 0)));
    return v;
  }
  __device__ __forceinline__ void advance() { src += tile_step; }
  template <int kSlot>
  __device__ __forceinline__ void store(float* s, float4 v, int tid) const {
    if (k_contiguous) {
      const int chunk = tid % 2 + 2 * kSlot;
      float* p = s + chunk * 4 * kStride + tid / 2;
      p[0] = v.x;
      p[kStride] = v.y;
      p[2 * kStride] = v.z;
      p[3 * kStride] = v.w;
    } else {
      *reinterpret_cast<float4*>(s + (tid / 32 + 8 * kSlot) * kStride + (tid % 32) * 4) = v;
    }
  }
};

template <int kMinBlocks, Activation kAct, bool kHasBias>
__global__ void __launch_bounds__(kThreads, kMinBlocks) kernel(const GemmArgs args) {
  __shared__ __align__(16) float s_a[2][kBK * kStride];
  __shared__ __align__(16) float s_b[2][kBK * kStride];

  const float* __restrict__ a = static_cast<const float*>(args.a);
  const float* __restrict__ b = static_cast<const float*>(args.b);
  const float* __restrict__ bias = static_cast<const float*>(args.bias);
  float* __restrict__ c = static_cast<float*>(args.c);
  const int64_t m = args.m, n = args.n;
  const int k = static_cast<int>(args.k);  // host: k < 2^30

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  // Thread rows: wm*64 + lm*4 + {0..3} and +32; columns: wn*32 + ln*4 + {0..3} and +16.
  const int row_base = (warp / 4) * 64 + (lane / 4) * 4;
  const int col_base = (warp % 4) * 32 + (lane % 4) * 4;
  const bool c_vec = simt_common::c_rows_vec(args);

  const int64_t tiles_m = ceil_div(m, kBM), tiles_n = ceil_div(n, kBN);
  const int64_t num_tiles = args.batch * tiles_m * tiles_n;
  const int k_tiles = (k + kBK - 1) / kBK;

  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const gemm::TileCoord coord = gemm::tile_coord(tile, tiles_m, tiles_n);
    const int64_t m0 = coord.tile_m * kBM, n0 = coord.tile_n * kBN;

    Loader la, lb;
    la.init_k_contiguous(a + coord.batch * args.stride_a_batch, args.stride_am, m0, m, tid);
    if (args.b_k_major)
      lb.init_k_contiguous(b + coord.batch * args.stride_b_batch, args.stride_b_outer, n0, n, tid);
    else
      lb.init_n_contiguous(b + coord.batch * args.stride_b_batch, args.stride_b_outer, n0, n, tid);

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;

    __syncthreads();  // the previous tile's last fragment reads are done before buffer 0 is refilled
    float a_frag[2][8], b_frag[2][8];
    if (k_tiles > 0) {
      la.store<0>(s_a[0], la.load<0>(k), tid);
      lb.store<0>(s_b[0], lb.load<0>(k), tid);
      la.store<1>(s_a[0], la.load<1>(k), tid);
      lb.store<1>(s_b[0], lb.load<1>(k), tid);
      la.advance();
      lb.advance();
      __syncthreads();
      const float* sa = s_a[0];
      const float* sb = s_b[0];
      *reinterpret_cast<float4*>(&a_frag[0][0]) = *reinterpret_cast<const float4*>(sa + row_base);
      *reinterpret_cast<float4*>(&a_frag[0][4]) = *reinterpret_cast<const float4*>(sa + row_base + 32);
      *reinterpret_cast<float4*>(&b_frag[0][0]) = *reinterpret_cast<const float4*>(sb + col_base);
      *reinterpret_cast<float4*>(&b_frag[0][4]) = *reinterpret_cast<const float4*>(sb + col_base + 16);
    }

    int buf = 0;
    for (int kt = 0; kt < k_tiles; ++kt) {
      const bool has_next = kt + 1 < k_tiles;
      const int k_left = k - (kt + 1) * kBK;  // of the next tile
      const float* sa = s_a[buf];
      const float* sb = s_b[buf];
      float* sa_next = s_a[buf ^ 1];
      float* sb_next = s_b[buf ^ 1];
      float4 stage_a, stage_b;
#pragma unroll
      for (int kk = 0; kk < kBK; ++kk) {
        // Buffer buf ^ 1 was last read before the barrier that ended the previous k tile, so the
        // staged halves can be stored into it at any point of this one.
        if (kk == 0 && has_next) {
          stage_a = la.load<0>(k_left);
          stage_b = lb.load<0>(k_left);
        }
        if (kk == kBK / 2 && has_next) {
          la.store<0>(sa_next, stage_a, tid);
          lb.store<0>(sb_next, stage_b, tid);
          stage_a = la.load<1>(k_left);
          stage_b = lb.load<1>(k_left);
        }
        const int cur = kk % 2, nxt = cur ^ 1;
        if (kk < kBK - 1) {
          const float* pa = sa + (kk + 1) * kStride;
          const float* pb = sb + (kk + 1) * kStride;
          *reinterpret_cast<float4*>(&a_frag[nxt][0]) = *reinterpret_cast<const float4*>(pa + row_base);
          *reinterpret_cast<float4*>(&a_frag[nxt][4]) = *reinterpret_cast<const float4*>(pa + row_base + 32);
          *reinterpret_cast<float4*>(&b_frag[nxt][0]) = *reinterpret_cast<const float4*>(pb + col_base);
          *reinterpret_cast<float4*>(&b_frag[nxt][4]) = *reinterpret_cast<const float4*>(pb + col_base + 16);
        } else if (has_next) {
          la.store<1>(sa_next, stage_a, tid);
          lb.store<1>(sb_next, stage_b, tid);
          la.advance();
          lb.advance();
          __syncthreads();  // has_next is uniform over the block
          *reinterpret_cast<float4*>(&a_frag[nxt][0]) = *reinterpret_cast<const float4*>(sa_next + row_base);
          *reinterpret_cast<float4*>(&a_frag[nxt][4]) = *reinterpret_cast<const float4*>(sa_next + row_base + 32);
          *reinterpret_cast<float4*>(&b_frag[nxt][0]) = *reinterpret_cast<const float4*>(sb_next + col_base);
          *reinterpret_cast<float4*>(&b_frag[nxt][4]) = *reinterpret_cast<const float4*>(sb_next + col_base + 16);
        }
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a_frag[cur][i], b_frag[cur][j], acc[i][j]);
      }
      buf ^= 1;
    }

    float* c_batch = c + coord.batch * args.stride_c_batch;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t row = m0 + row_base + (i < 4 ? i : 32 + i - 4);
      if (row >= m) continue;
      float* c_row = c_batch + row * args.stride_cm;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t col = n0 + col_base + 16 * h;
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = epi<kAct, kHasBias>(acc[i][4 * h + j], bias, col + j < n ? col + j : 0);
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
}

template <int kMinBlocks>
struct Launcher {
  template <typename T, Activation kAct, bool kHasBias>
  static cudaError_t launch(const GemmArgs& args, cudaStream_t stream) {
    if constexpr (std::is_same_v<T, float>) {
      if (args.batch > 0 && args.m > 0 && args.n > 0 && simt_common::fp32_rows_aligned(args)) {
        const int64_t num_tiles = args.batch * ceil_div(args.m, kBM) * ceil_div(args.n, kBN);
        kernel<kMinBlocks, kAct, kHasBias><<<gemm::grid_for(num_tiles), kThreads, 0, stream>>>(args);
        return cudaGetLastError();
      }
    }
    return gemm::launch_simt_fallback<T, kAct, kHasBias>(args, stream);
  }
};

// 2 blocks/SM (<= 128 registers) and 1 block/SM (compiler's choice up to 255).
template <typename T, Activation kAct, bool kHasBias>
cudaError_t launch(const GemmArgs& args, cudaStream_t stream) {
  return Launcher<2>::launch<T, kAct, kHasBias>(args, stream);
}
template <typename T, Activation kAct, bool kHasBias>
cudaError_t launch_1sm(const GemmArgs& args, cudaStream_t stream) {
  return Launcher<1>::launch<T, kAct, kHasBias>(args, stream);
}

}  // namespace simt_v1

// ==================================================================================== simt_v2
namespace simt_v2 {
using namespace simt_common;

constexpr int kKStride = kBK + 4;          // [outer][k] rows: 80 bytes, 16-byte aligned
constexpr int kNStride = kBN + 4;          // n-major B [k][n] rows
constexpr int kATileFloats = kBM * kKStride;                      // 2560
constexpr int kBTileFloats = kBN * kKStride > kBK * kNStride ? kBN * kKStride : kBK * kNStride;  // 2560
constexpr int kStageFloats = kATileFloats + kBTileFloats;

template <int kStages>
constexpr int smem_bytes() { return kStages * kStageFloats * 4; }

// cp.async of one k tile into one stage. Each operand tile is 512 16-byte chunks, 2 per thread.
//   [outer][k] tile (A, B k-major): chunk q -> row q / 4, k chunk q % 4 (4 threads per 64-byte row).
//   [k][n] tile (B n-major): chunk q -> k row q / 32, n chunk q % 32.
// A chunk outside m/n/k is zero-filled (src-size 0; the source address is then the valid base).
struct AsyncLoader {
  const float* base;  // this batch's operand
  int64_t stride_outer;
  int64_t outer0, outer_size;
  bool k_contiguous;

  __device__ __forceinline__ void issue(float* s, int kt, int k, int tid) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int q = tid + kThreads * h;
      if (k_contiguous) {
        const int r = q / 4, kc = (q % 4) * 4;
        const int64_t row = outer0 + r;
        const int kg = kt * kBK + kc;
        const bool ok = row < outer_size && kg < k;
        cp_async_16(s + r * kKStride + kc, ok ? base + row * stride_outer + kg : base, ok ? 16 : 0);
      } else {
        const int r = q / 32, nc = (q % 32) * 4;
        const int kg = kt * kBK + r;
        const int64_t col = outer0 + nc;
        const bool ok = kg < k && col < outer_size;
        cp_async_16(s + r * kNStride + nc, ok ? base + kg * stride_outer + col : base, ok ? 16 : 0);
      }
    }
  }
};

template <int kStages, int kMinBlocks, bool kBKMajor, Activation kAct, bool kHasBias>
__global__ void __launch_bounds__(kThreads, kMinBlocks) kernel(const GemmArgs args) {
  extern __shared__ __align__(16) float smem[];

  const float* __restrict__ a = static_cast<const float*>(args.a);
  const float* __restrict__ b = static_cast<const float*>(args.b);
  const float* __restrict__ bias = static_cast<const float*>(args.bias);
  float* __restrict__ c = static_cast<float*>(args.c);
  const int64_t m = args.m, n = args.n;
  const int k = static_cast<int>(args.k);  // host: k < 2^30

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int lm = lane / 4, ln = lane % 4;
  // Rows: wm*64 + lm + 8 i (i = 0..7). Columns: B k-major: wn*32 + ln + 4 j; B n-major:
  // wn*32 + ln*4 + {0..3} and +16 (float4 reads along n).
  const int row_base = (warp / 4) * 64 + lm;
  const int col_base = (warp % 4) * 32 + (kBKMajor ? ln : ln * 4);
  const bool c_vec = simt_common::c_rows_vec(args);

  const int64_t tiles_m = ceil_div(m, kBM), tiles_n = ceil_div(n, kBN);
  const int64_t num_tiles = args.batch * tiles_m * tiles_n;
  const int k_tiles = (k + kBK - 1) / kBK;

  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const gemm::TileCoord coord = gemm::tile_coord(tile, tiles_m, tiles_n);
    const int64_t m0 = coord.tile_m * kBM, n0 = coord.tile_n * kBN;
    const AsyncLoader la{a + coord.batch * args.stride_a_batch, args.stride_am, m0, m, true};
    const AsyncLoader lb{b + coord.batch * args.stride_b_batch, args.stride_b_outer, n0, n, kBKMajor};

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;

    // Every stage's last reader (previous tile) is done before the prologue overwrites it.
    __syncthreads();
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < k_tiles) {
        float* st = smem + s * kStageFloats;
        la.issue(st, s, k, tid);
        lb.issue(st + kATileFloats, s, k, tid);
      }
      cp_async_commit();  // empty groups keep the group count = tiles issued
    }

    for (int kt = 0; kt < k_tiles; ++kt) {
      cp_async_wait<kStages - 2>();  // tile kt has landed (this thread's copies)
      __syncthreads();               // ... everyone's; and stage (kt-1) % kStages is free
      {
        const int nt = kt + kStages - 1;
        if (nt < k_tiles) {
          float* st = smem + (nt % kStages) * kStageFloats;
          la.issue(st, nt, k, tid);
          lb.issue(st + kATileFloats, nt, k, tid);
        }
        cp_async_commit();
      }
      const float* sa = smem + (kt % kStages) * kStageFloats;
      const float* sb = sa + kATileFloats;
#pragma unroll
      for (int kc = 0; kc < kBK; kc += 4) {
        if constexpr (!kBKMajor) {
          float a4[8][4];
#pragma unroll
          for (int i = 0; i < 8; ++i)
            *reinterpret_cast<float4*>(a4[i]) =
                *reinterpret_cast<const float4*>(sa + (row_base + 8 * i) * kKStride + kc);
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            float bf[8];
            const float* pb = sb + (kc + kk) * kNStride + col_base;
            *reinterpret_cast<float4*>(&bf[0]) = *reinterpret_cast<const float4*>(pb);
            *reinterpret_cast<float4*>(&bf[4]) = *reinterpret_cast<const float4*>(pb + 16);
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
              for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a4[i][kk], bf[j], acc[i][j]);
          }
        } else {
          float b4[8][4];
#pragma unroll
          for (int j = 0; j < 8; ++j)
            *reinterpret_cast<float4*>(b4[j]) =
                *reinterpret_cast<const float4*>(sb + (col_base + 4 * j) * kKStride + kc);
          // A two rows at a time (8 registers): b4 (32) + acc (64) leave little under the 128 cap.
#pragma unroll
          for (int h = 0; h < 4; ++h) {
            float a4[2][4];
#pragma unroll
            for (int i = 0; i < 2; ++i)
              *reinterpret_cast<float4*>(a4[i]) =
                  *reinterpret_cast<const float4*>(sa + (row_base + 8 * (2 * h + i)) * kKStride + kc);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
#pragma unroll
              for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[2 * h + i][j] = fmaf(a4[i][kk], b4[j][kk], acc[2 * h + i][j]);
          }
        }
      }
    }
    cp_async_wait<0>();  // only empty groups can be pending here; keeps the next prologue simple

    float* c_batch = c + coord.batch * args.stride_c_batch;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t row = m0 + row_base + 8 * i;
      if (row >= m) continue;
      float* c_row = c_batch + row * args.stride_cm;
      if constexpr (kBKMajor) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int64_t col = n0 + col_base + 4 * j;
          if (col < n) c_row[col] = epi<kAct, kHasBias>(acc[i][j], bias, col);
        }
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t col = n0 + col_base + 16 * h;
          float v[4];
#pragma unroll
          for (int j = 0; j < 4; ++j)
            v[j] = epi<kAct, kHasBias>(acc[i][4 * h + j], bias, col + j < n ? col + j : 0);
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
  }
}

template <int kStages, int kMinBlocks>
struct Launcher {
  template <bool kBKMajor, Activation kAct, bool kHasBias>
  static cudaError_t go(const GemmArgs& args, cudaStream_t stream) {
    auto kern = kernel<kStages, kMinBlocks, kBKMajor, kAct, kHasBias>;
    constexpr int kSmem = smem_bytes<kStages>();
    cudaError_t err = ensure_dynamic_smem(reinterpret_cast<const void*>(kern), kSmem);
    if (err != cudaSuccess) return err;
    const int64_t num_tiles = args.batch * ceil_div(args.m, kBM) * ceil_div(args.n, kBN);
    kern<<<gemm::grid_for(num_tiles), kThreads, kSmem, stream>>>(args);
    return cudaGetLastError();
  }
  template <typename T, Activation kAct, bool kHasBias>
  static cudaError_t launch(const GemmArgs& args, cudaStream_t stream) {
    if constexpr (std::is_same_v<T, float>) {
      if (args.batch > 0 && args.m > 0 && args.n > 0 && simt_common::fp32_rows_aligned(args))
        return args.b_k_major ? go<true, kAct, kHasBias>(args, stream) : go<false, kAct, kHasBias>(args, stream);
    }
    return gemm::launch_simt_fallback<T, kAct, kHasBias>(args, stream);
  }
};

// 3 stages, 2 blocks/SM (60 KB each); 4 stages, 1 block/SM (80 KB, up to 255 registers).
template <typename T, Activation kAct, bool kHasBias>
cudaError_t launch(const GemmArgs& args, cudaStream_t stream) {
  return Launcher<3, 2>::launch<T, kAct, kHasBias>(args, stream);
}
template <typename T, Activation kAct, bool kHasBias>
cudaError_t launch_s4_1sm(const GemmArgs& args, cudaStream_t stream) {
  return Launcher<4, 1>::launch<T, kAct, kHasBias>(args, stream);
}

}  // namespace simt_v2
}  // namespace dualk
