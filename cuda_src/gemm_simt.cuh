// The general SIMT GEMM, gemm_simt_kernel: exact fp32 FMA (any element type is converted to fp32
// on load), 128x128x8 block tile, 256 threads of 8x8 outputs, register double buffering, a
// grid-stride loop over tiles. The fallback of the family: fp32 rows the wide kernel
// (gemm_simt_wide.cuh) cannot take, and fp16/bf16 operands cp.async cannot serve (k % 8 != 0, odd
// strides, misaligned base pointers). Any alignment, size and stride; float4 loads where fp32
// rows are 16-byte aligned (SimtOperandLoader's kVec).
#pragma once

#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "gemm_common.cuh"

namespace dualk {
namespace gemm {

// ------------------------------------------------------------------ SIMT kernel (fallback, any
// type)

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
template <typename T, bool kVec> struct SimtOperandLoader {
  const T* src;       // this thread's first element of the next k tile to load
  int64_t tile_step;  // elements from one k tile to the next (kSimtBlockK rows of k)
  int64_t elem_step;  // scalar path: elements between this thread's 4 loads
  int k_offset;       // k of this thread's first element inside the tile
  int k_stride_i;     // scalar path: k distance between the 4 loads (0 or 2)
  int outer_ok;       // vec: 1 if the row/chunk is inside; scalar: bit i for load i
  bool k_contiguous;

  // A tile (or B^T tile) of 128 rows (m or n) x 8 k, k contiguous in memory.
  __device__ __forceinline__ void init_k_contiguous(const T* base, int64_t stride_outer,
                                                    int64_t outer0, int64_t outer_size, int tid) {
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
  __device__ __forceinline__ void init_n_contiguous(const T* base, int64_t stride_k, int64_t n0,
                                                    int64_t n, int tid) {
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
template <typename T, bool kVec, Activation kAct> constexpr int simt_min_blocks() {
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
      b_loader.init_k_contiguous(b + coord.batch * args.stride_b_batch, args.stride_b_outer, n0, n,
                                 tid);
    else
      b_loader.init_n_contiguous(b + coord.batch * args.stride_b_batch, args.stride_b_outer, n0, n,
                                 tid);

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
        a_frag[0] = a_lo.x;
        a_frag[1] = a_lo.y;
        a_frag[2] = a_lo.z;
        a_frag[3] = a_lo.w;
        a_frag[4] = a_hi.x;
        a_frag[5] = a_hi.y;
        a_frag[6] = a_hi.z;
        a_frag[7] = a_hi.w;
        b_frag[0] = b_lo.x;
        b_frag[1] = b_lo.y;
        b_frag[2] = b_lo.z;
        b_frag[3] = b_lo.w;
        b_frag[4] = b_hi.x;
        b_frag[5] = b_hi.y;
        b_frag[6] = b_hi.z;
        b_frag[7] = b_hi.w;
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
        if (col < n)
          c_row[col] = from_float<T>(epilogue_value<T, kAct, kHasBias>(acc[i][j], bias, col));
      }
    }
  }
}

// ------------------------------------------------------------------ host side

// gemm_simt_kernel: any element type, alignment and size (float4 loads where fp32 rows allow).
template <typename T, Activation kAct, bool kHasBias>
cudaError_t launch_simt_fallback(const GemmArgs& args, cudaStream_t stream) {
  const int64_t num_tiles =
      args.batch * ceil_div(args.m, kSimtBlockM) * ceil_div(args.n, kSimtBlockN);
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

}  // namespace gemm
}  // namespace dualk
