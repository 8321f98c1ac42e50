// fused_mlp's fp16/bf16 mma.sync kernels (see fused_mlp.cu's header comment): the runtime-width
// kernel and the padded, resident one. Its own translation unit; shared definitions in
// fused_mlp_kernels.cuh.
#include "fused_mlp_kernels.cuh"

namespace dualk {
namespace mlp {
namespace {

template <typename T, int kMaxWidth, Activation kAct>
__global__ void __launch_bounds__(kMaxMmaWarps * 32, MmaConfig<kMaxWidth>::kMinBlocks)
    fused_mlp_mma_kernel(const __grid_constant__ MlpKernelParams p) {
  constexpr int kMTiles = MmaConfig<kMaxWidth>::kMTiles;
  constexpr int kKTiles = kMaxWidth / 16;  // 16-column tiles of the widest layer
  constexpr int kWarpRows = 16 * kMTiles;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* bias_smem = reinterpret_cast<float*>(smem_raw);
  T* weight_smem = reinterpret_cast<T*>(smem_raw + p.weight_area_offset);
  const int num_warps = blockDim.x / 32;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int x_pitch = p.act_pitch;
  const int out_pitch = p.out_pitch;
  // Per-warp buffers: the warp's x rows (cp.async target), then its output rows (staging for
  // coalesced stores).
  T* x_smem = reinterpret_cast<T*>(smem_raw + p.act_area_offset) + warp * kWarpRows * x_pitch;
  T* out_smem = reinterpret_cast<T*>(smem_raw + p.act_area_offset) +
                num_warps * kWarpRows * x_pitch + warp * kWarpRows * out_pitch;

  const T* x = static_cast<const T*>(p.x);
  T* out = static_cast<T*>(p.out);
  const int in0 = p.widths[0];
  const int num_layers = p.num_layers;
  const int out_w = p.widths[num_layers];
  const int64_t block_rows = static_cast<int64_t>(num_warps) * kWarpRows;

  auto valid_rows = [&](int64_t row0) {
    const int64_t remaining = p.m - row0;
    return remaining <= 0 ? 0 : remaining < kWarpRows ? static_cast<int>(remaining) : kWarpRows;
  };
  // Stages this warp's rows of row tile `tile` into its x buffer (rows past m zero-filled).
  auto stage_x = [&](int64_t tile) {
    const int64_t row0 = tile * block_rows + warp * kWarpRows;
    const int rows = valid_rows(row0);
    const T* src = rows > 0 ? x + row0 * p.stride_xm : x;
    stage_tile<T>(x_smem, x_pitch, src, p.stride_xm, rows, in0, kWarpRows, round_up(in0, kMmaKPad),
                  x, row0 + rows == p.m, p.x_vectorized, lane, 32);
  };
  // Stages the weights of layer group g (whole block).
  auto stage_group = [&](int g) {
    for (int layer = p.group_first_layer[g]; layer < p.group_first_layer[g + 1]; ++layer) {
      const int in = p.widths[layer], out_l = p.widths[layer + 1];
      const T* w = static_cast<const T*>(p.weights[layer]);
      const bool vec = is_aligned16(w) && (in * static_cast<int>(sizeof(T))) % 16 == 0;
      stage_tile<T>(weight_smem + p.weight_offset[layer], p.weight_pitch[layer], w, in, out_l, in,
                    round_up(out_l, kMmaNPad), round_up(in, kMmaKPad), w, true, vec, threadIdx.x,
                    blockDim.x);
    }
  };

  const bool weights_resident = p.num_groups == 1;
  load_biases<T>(p, bias_smem, kMmaNPad);
  if (weights_resident) stage_group(0);
  int64_t tile = blockIdx.x;
  stage_x(tile);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  // ldmatrix lane roles. A (x tile, 16x16): lanes 0-15 address rows 0-15 at k 0, lanes 16-31
  // rows 0-15 at k 8 -> registers a0..a3 = (r0-7,k0-7), (r8-15,k0-7), (r0-7,k8-15), (r8-15,k8-15),
  // the m16n8k16 A fragment order.
  const int a_row = lane % 16;
  const int a_col = (lane / 16) * 8;
  // B (16 weight rows n x 16 k; W's rows are B's columns): matrix j = lane/8 covers
  // n 8*(j/2).., k 8*(j%2).. -> {b0,b1} = the two k halves of n-tile 0, {b2,b3} of n-tile 1.
  const int b_row = (lane / 16) * 8 + (lane % 8);
  const int b_col = ((lane / 8) % 2) * 8;
  const int quad_col = 2 * (lane % 4);  // C fragment: columns quad_col, quad_col + 1 of an n-tile

  for (; tile < p.num_tiles; tile += gridDim.x) {
    const int64_t warp_row0 = tile * block_rows + warp * kWarpRows;
    uint32_t act[kMTiles][kKTiles][4];
    {
      const int k_groups = round_up(in0, kMmaKPad) / kMmaKPad;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int kt = 0; kt < kKTiles; ++kt) {
          if (kt / 4 < k_groups) {
            ldmatrix_x4(act[mt][kt], x_smem + (mt * 16 + a_row) * x_pitch + kt * 16 + a_col);
          } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) act[mt][kt][i] = 0u;
          }
        }
    }
    // Every lane's ldmatrix has read the buffer: refill it with the next tile while we compute.
    __syncwarp();
    if (tile + gridDim.x < p.num_tiles) stage_x(tile + gridDim.x);
    cp_async_commit();

    int group = 0;  // the next layer group to stage when the weights are not resident
    for (int layer = 0; layer < num_layers; ++layer) {
      if (!weights_resident && layer == p.group_first_layer[group]) {
        __syncthreads();  // every warp is done with the previous group's weights
        stage_group(group);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        ++group;
      }
      const int k_groups = round_up(p.widths[layer], kMmaKPad) / kMmaKPad;
      const int out_chunks = round_up(p.widths[layer + 1], kMmaNPad) / kMmaNPad;
      const int pitch = p.weight_pitch[layer];
      const T* w = weight_smem + p.weight_offset[layer];
      const float* bias = bias_smem + p.bias_offset[layer];
      const bool hidden = layer + 1 < num_layers;
      uint32_t next[kMTiles][kKTiles][4];

      // 32 output columns per chunk: two ldmatrix_x4 of 16 weight rows feed 4 n-tiles x kMTiles.
#pragma unroll
      for (int chunk = 0; chunk < kKTiles / 2; ++chunk) {
        if (chunk < out_chunks) {
          float acc[kMTiles][4][4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float b0 = bias[chunk * 32 + j * 8 + quad_col];
            const float b1 = bias[chunk * 32 + j * 8 + quad_col + 1];
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
              acc[mt][j][0] = b0;
              acc[mt][j][1] = b1;
              acc[mt][j][2] = b0;
              acc[mt][j][3] = b1;
            }
          }
          const T* w_rows = w + (chunk * 32 + b_row) * pitch + b_col;
#pragma unroll
          for (int kt = 0; kt < kKTiles; ++kt)
            if (kt / 4 < k_groups)
              mma_chunk_k_tile<T>(acc, act, kt, w_rows + kt * 16, w_rows + 16 * pitch + kt * 16);
          // The C fragments become the next layer's A fragments (pack_chunk); the last layer
          // packs too (no activation): the output is stored from the same layout.
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            if (hidden) {
              // Columns past a hidden layer's width must be exactly 0 for the next layer: with an
              // inf input their zero weights give inf * 0 = NaN. acc[.][j][e] is column
              // chunk*32 + 8j + quad_col + (e & 1); `room` is how many columns from 8j + quad_col
              // on are real (as in the padded kernel below).
              const int room = p.widths[layer + 1] - chunk * 32 - quad_col;
#pragma unroll
              for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                  acc[mt][j][e] =
                      j * 8 + (e & 1) < room ? apply_activation<kAct>(acc[mt][j][e]) : 0.0f;
            }
            pack_chunk<T>(next[mt], chunk, acc[mt]);
          }
        } else {
          zero_chunk(next, chunk);  // past this layer's width
        }
      }
      copy_fragments(act, next);
    }

    store_warp_rows<T, kMTiles, kKTiles>(act, p, out_smem, out + warp_row0 * out_w,
                                         valid_rows(warp_row0), lane);
    // The next tile's x has landed (own copies) and every lane sees every lane's copies; the
    // staging rows have been read before the next tile writes them.
    cp_async_wait<0>();
    __syncwarp();
  }
}

// ------------------------------------------------------------- fp16 / bf16: padded, resident
// The same register-resident chaining as fused_mlp_mma_kernel, for MLPs whose every width fits a
// bucket (64 or 128) and whose weights, each zero-padded to bucket x bucket, all fit in shared
// memory. Padding every layer to the bucket makes the k loop, the hidden layers' n loop, the
// weight pitch and every shared-memory offset compile-time constants: the runtime-width kernel
// spent ~3.4k instructions per 224 mma (H200 profile) on branches, register copies and index math.
template <typename T, int kWidth, Activation kAct>
__global__ void __launch_bounds__(kMaxMmaWarps * 32, MmaConfig<kWidth>::kMinBlocks)
    fused_mlp_mma_padded_kernel(const __grid_constant__ MlpKernelParams p) {
  constexpr int kMTiles = MmaConfig<kWidth>::kMTiles;
  constexpr int kKTiles = kWidth / 16;
  constexpr int kChunks = kWidth / 32;
  constexpr int kPitch = mma_row_pitch(kWidth);
  constexpr int kWarpRows = 16 * kMTiles;
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  constexpr int kChunksPerRow = kWidth / kVec;  // 16-byte chunks per padded x row

  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* bias_smem = reinterpret_cast<float*>(smem_raw);
  T* weight_smem = reinterpret_cast<T*>(smem_raw + p.weight_area_offset);
  const int num_warps = blockDim.x / 32;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int out_pitch = p.out_pitch;
  T* x_smem = reinterpret_cast<T*>(smem_raw + p.act_area_offset) + warp * kWarpRows * kPitch;
  T* out_smem = reinterpret_cast<T*>(smem_raw + p.act_area_offset) +
                num_warps * kWarpRows * kPitch + warp * kWarpRows * out_pitch;

  const T* x = static_cast<const T*>(p.x);
  T* out = static_cast<T*>(p.out);
  const int in0 = p.widths[0];
  const int num_layers = p.num_layers;
  const int out_w = p.widths[num_layers];
  const int64_t block_rows = static_cast<int64_t>(num_warps) * kWarpRows;

  auto valid_rows = [&](int64_t row0) {
    const int64_t remaining = p.m - row0;
    return remaining <= 0 ? 0 : remaining < kWarpRows ? static_cast<int>(remaining) : kWarpRows;
  };
  // This warp's rows of row tile `tile` into its x buffer, zero beyond in0 and past m.
  auto stage_x = [&](int64_t tile) {
    const int64_t row0 = tile * block_rows + warp * kWarpRows;
    const int rows = valid_rows(row0);
    const T* src = rows > 0 ? x + row0 * p.stride_xm : x;
    // The tile holding x's last row, when rows end in a partial 16-byte chunk, takes the element
    // copies: a 16-byte cp.async window there would pass the end of x (see copy_partial_chunk).
    if (p.x_vectorized && (in0 % kVec == 0 || row0 + rows < p.m)) {
#pragma unroll
      for (int i = 0; i < kWarpRows * kChunksPerRow / 32; ++i) {
        const int chunk = lane + 32 * i;
        const int r = chunk / kChunksPerRow;  // constant divisor: a shift
        const int c = (chunk % kChunksPerRow) * kVec;
        const int valid = r < rows ? max(0, min(in0 - c, kVec)) : 0;
        const void* g = valid > 0 ? static_cast<const void*>(src + r * p.stride_xm + c)
                                  : static_cast<const void*>(x);
        cp_async_16(x_smem + r * kPitch + c, g, valid * static_cast<int>(sizeof(T)));
      }
    } else {
      stage_tile<T>(x_smem, kPitch, src, p.stride_xm, rows, in0, kWarpRows, kWidth, x, true, false,
                    lane, 32);
    }
  };

  load_biases<T>(p, bias_smem, kWidth);
  for (int layer = 0; layer < num_layers; ++layer) {
    const T* w = static_cast<const T*>(p.weights[layer]);
    const int in = p.widths[layer], out_l = p.widths[layer + 1];
    const bool vec = is_aligned16(w) && (in * static_cast<int>(sizeof(T))) % 16 == 0;
    stage_tile<T>(weight_smem + layer * kWidth * kPitch, kPitch, w, in, out_l, in, kWidth, kWidth,
                  w, true, vec, threadIdx.x, blockDim.x);
  }
  int64_t tile = blockIdx.x;
  stage_x(tile);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  // Lane roles as in fused_mlp_mma_kernel.
  const int a_row = lane % 16;
  const int a_col = (lane / 16) * 8;
  const int b_row = (lane / 16) * 8 + (lane % 8);
  const int b_col = ((lane / 8) % 2) * 8;
  const int quad_col = 2 * (lane % 4);
  const int last_chunks = p.last_chunks;

  for (; tile < p.num_tiles; tile += gridDim.x) {
    const int64_t warp_row0 = tile * block_rows + warp * kWarpRows;
    uint32_t act[kMTiles][kKTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int kt = 0; kt < kKTiles; ++kt)
        ldmatrix_x4(act[mt][kt], x_smem + (mt * 16 + a_row) * kPitch + kt * 16 + a_col);
    __syncwarp();  // every lane has read the buffer: refill it with the next tile
    if (tile + gridDim.x < p.num_tiles) stage_x(tile + gridDim.x);
    cp_async_commit();

    for (int layer = 0; layer < num_layers; ++layer) {
      const T* w_rows = weight_smem + layer * (kWidth * kPitch) + b_row * kPitch + b_col;
      const float* bias = bias_smem + layer * kWidth + quad_col;
      const bool hidden = layer + 1 < num_layers;
      const int chunks = hidden ? kChunks : last_chunks;
      // Columns past a hidden layer's width must be exactly 0 for the next layer: with an inf
      // input, their zero weights give inf * 0 = NaN.
      const int width = p.widths[layer + 1];
      const bool mask = hidden && width < kWidth;
      uint32_t next[kMTiles][kKTiles][4];
#pragma unroll
      for (int chunk = 0; chunk < kChunks; ++chunk) {
        if (chunk < chunks) {
          float acc[kMTiles][4][4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float2 b = *reinterpret_cast<const float2*>(bias + chunk * 32 + j * 8);
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
              acc[mt][j][0] = b.x;
              acc[mt][j][1] = b.y;
              acc[mt][j][2] = b.x;
              acc[mt][j][3] = b.y;
            }
          }
#pragma unroll
          for (int kt = 0; kt < kKTiles; ++kt)
            mma_chunk_k_tile<T>(acc, act, kt, w_rows + (chunk * 32) * kPitch + kt * 16,
                                w_rows + (chunk * 32 + 16) * kPitch + kt * 16);
          // relu runs on the packed pairs (one instruction per two values); other activations on
          // the fp32 accumulator.
          if constexpr (kAct != Activation::kRelu) {
            if (hidden) {
#pragma unroll
              for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                  for (int e = 0; e < 4; ++e) acc[mt][j][e] = apply_activation<kAct>(acc[mt][j][e]);
            }
          }
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) pack_chunk<T>(next[mt], chunk, acc[mt]);
          if constexpr (kAct == Activation::kRelu) {
            if (hidden) {
#pragma unroll
              for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
                for (int q = 0; q < 2; ++q)
#pragma unroll
                  for (int i = 0; i < 4; ++i)
                    next[mt][2 * chunk + q][i] = relu2<T>(next[mt][2 * chunk + q][i]);
            }
          }
          if (mask) {
            // Register i of k-tile 2*chunk+q holds columns 16*(2*chunk+q) + 8*(i/2) + quad_col, +1.
#pragma unroll
            for (int q = 0; q < 2; ++q)
#pragma unroll
              for (int half = 0; half < 2; ++half) {
                const int col = chunk * 32 + q * 16 + half * 8 + quad_col;
                const uint32_t keep =
                    (col < width ? 0xffffu : 0u) | (col + 1 < width ? 0xffff0000u : 0u);
#pragma unroll
                for (int mt = 0; mt < kMTiles; ++mt) {
                  next[mt][2 * chunk + q][2 * half] &= keep;
                  next[mt][2 * chunk + q][2 * half + 1] &= keep;
                }
              }
          }
        } else {
          zero_chunk(next, chunk);
        }
      }
      copy_fragments(act, next);
    }

    store_warp_rows<T, kMTiles, kKTiles>(act, p, out_smem, out + warp_row0 * out_w,
                                         valid_rows(warp_row0), lane);
    cp_async_wait<0>();
    __syncwarp();
  }
}

template <typename T, int kMaxWidth> struct MmaPick {
  template <Activation kAct> struct By {
    static KernelFn kernel() { return fused_mlp_mma_kernel<T, kMaxWidth, kAct>; }
  };
};
template <typename T, int kWidth> struct PaddedPick {
  template <Activation kAct> struct By {
    static KernelFn kernel() { return fused_mlp_mma_padded_kernel<T, kWidth, kAct>; }
  };
};

template <typename T> KernelFn pick_padded_kernel_for(int bucket, Activation act) {
  return bucket == 64 ? pick_by_activation<PaddedPick<T, 64>::template By>(act)
                      : pick_by_activation<PaddedPick<T, 128>::template By>(act);
}

template <typename T> KernelFn pick_mma_kernel_for(int bucket, Activation act) {
  switch (bucket) {
    case 64:
      return pick_by_activation<MmaPick<T, 64>::template By>(act);
    case 128:
      return pick_by_activation<MmaPick<T, 128>::template By>(act);
    default:
      return pick_by_activation<MmaPick<T, 256>::template By>(act);
  }
}

}  // namespace

KernelFn pick_mma_kernel(DType dtype, int bucket, Activation act) {
  return dtype == DType::kFloat16 ? pick_mma_kernel_for<__half>(bucket, act)
                                  : pick_mma_kernel_for<__nv_bfloat16>(bucket, act);
}

KernelFn pick_padded_kernel(DType dtype, int bucket, Activation act) {
  return dtype == DType::kFloat16 ? pick_padded_kernel_for<__half>(bucket, act)
                                  : pick_padded_kernel_for<__nv_bfloat16>(bucket, act);
}

}  // namespace mlp
}  // namespace dualk
