// fused_mlp: a whole Linear/activation stack in one launch.
//   out = L_{n-1}(act(... act(L_0(x)))),  L_i(h) = h @ W_i^T + b_i,  W_i: (out_i, in_i) row-major.
//
// Five kernels behind one launcher:
//   * fp16/bf16, every width <= 128 and all weights resident: on Hopper (sm_90a),
//     fused_mlp_wgmma_kernel (fused_mlp_sm90.cuh: wgmma with the activations as the register A
//     operand); elsewhere fused_mlp_mma_padded_kernel, below. Each layer is zero-padded to the
//     64/128 bucket so that all loops and offsets are compile-time.
//   * fp16/bf16 otherwise: tensor cores (mma.sync m16n8k16, fp32 accumulation). Each warp owns 16*kMTiles
//     rows and keeps their activations in registers from the first layer to the last: the m16n8
//     C fragments of layer i, after bias + activation + down-cast, are exactly the m16k16 A
//     fragments of layer i+1 (see pack_a_fragment). Weights (zero-padded to multiples of 16) live
//     in shared memory: all layers loaded once per block when they fit, otherwise in groups of
//     consecutive layers reloaded per row tile. x tiles arrive by cp.async into a per-warp buffer;
//     the next tile's copy is issued as soon as this tile's A fragments are in registers, so it
//     overlaps all the layers' math.
//   * fp32 in 32-row tiles (batches of >= ~31 rows per SM) on compute capability 9.x, weights
//     TMA-compatible and all resident: fused_mlp_tf32.cuh, 3xTF32 products on the tensor cores
//     (fp32 accuracy), weights by TMA.
//   * fp32 otherwise: exact fp32 on the SIMT cores. Activations of a row tile ping-pong between
//     two shared buffers; each thread computes a 4-, 2- or 1-row x 4-column block of outputs per item (per
//     layer, the widest that still gives every thread an item), or single outputs where 1 x 4
//     items would leave most warps idle (small tiles, narrow layers). Weights are resident in
//     shared memory when they fit (on sm_90 fetched by bulk copies: rows padded for conflict-free
//     reads, or, for 2-row tiles, dense with a per-lane k rotation and one copy per layer), else
//     streamed per layer in k-slabs.
// Widths and layer count are runtime values; kernels are templated only on dtype, a width bucket
// (fp16/bf16: 64/128/256) and the activation.
#include <cstdio>

#include "common.cuh"

namespace dualk {
namespace {

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
  int out_chunks_shift;    // padded mma: log2(16-byte chunks per output row), -1 if not a power of 2
  int last_chunks;         // padded mma: 32-column chunks of the last layer
  bool bulk_weights;       // simt, resident: weight rows arrive by sm_90 bulk copies (see below)
  int barrier_offset;      // bytes; simt with bulk_weights: one mbarrier per layer
};

__device__ __forceinline__ bool is_aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// Copies the top-left rows x cols of a row-major global matrix (row stride ld) into a
// rows_pad x cols_pad shared tile (row pitch `pitch`), zero-filling everything outside, with
// threads [thread, num_threads) sharing the work. Vectorized: 16-byte cp.async per chunk (src and
// ld*sizeof(T) 16-byte aligned, cols_pad a multiple of 16/sizeof(T)); the caller commits and
// waits. Otherwise plain element copies, complete once the caller's barrier passes.
template <typename T>
__device__ __forceinline__ void stage_tile(T* smem, int pitch, const T* src, int64_t ld, int rows,
                                           int cols, int rows_pad, int cols_pad, const void* safe_src,
                                           bool vectorized, int thread, int num_threads) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  if (vectorized) {
    const int chunks_per_row = cols_pad / kVec;
    const int total = rows_pad * chunks_per_row;
    for (int i = thread; i < total; i += num_threads) {
      const int r = i / chunks_per_row;
      const int c = (i - r * chunks_per_row) * kVec;
      const int valid = r < rows ? max(0, min(cols - c, kVec)) : 0;
      // A zero-byte copy reads nothing, but still gets a mapped address.
      const void* g = valid > 0 ? static_cast<const void*>(src + r * ld + c) : safe_src;
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

// cp.async.wait_group takes an immediate; layers are runtime, so switch over the few cases.
__device__ __forceinline__ void cp_async_wait_dynamic(int pending) {
  switch (pending) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    case 6: cp_async_wait<6>(); break;
    default: cp_async_wait<7>(); break;
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
__device__ __forceinline__ void load_biases_async(const MlpKernelParams& p, float* bias_smem, int pad,
                                                  const void* safe_src) {
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
                  x, p.x_vectorized, lane, 32);
  };
  // Stages the weights of layer group g (whole block).
  auto stage_group = [&](int g) {
    for (int layer = p.group_first_layer[g]; layer < p.group_first_layer[g + 1]; ++layer) {
      const int in = p.widths[layer], out_l = p.widths[layer + 1];
      const T* w = static_cast<const T*>(p.weights[layer]);
      const bool vec = is_aligned16(w) && (in * static_cast<int>(sizeof(T))) % 16 == 0;
      stage_tile<T>(weight_smem + p.weight_offset[layer], p.weight_pitch[layer], w, in, out_l, in,
                    round_up(out_l, kMmaNPad), round_up(in, kMmaKPad), w, vec, threadIdx.x,
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
          for (int kt = 0; kt < kKTiles; ++kt) {
            if (kt / 4 < k_groups) {
              uint32_t b[2][4];
              ldmatrix_x4(b[0], w_rows + kt * 16);
              ldmatrix_x4(b[1], w_rows + 16 * pitch + kt * 16);
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
          }
          // C fragments of n-tiles (2q, 2q+1) (q = 0, 1) = the A fragment of next k-tile
          // 2*chunk + q, g = quad_row, 2t = quad_col:
          //   a0 = (row g, k 2t..2t+1) = C(2q)[0,1]      a1 = (row g+8, k 2t..) = C(2q)[2,3]
          //   a2 = (row g, k 8+2t..)   = C(2q+1)[0,1]    a3 = (row g+8, k 8+2t..) = C(2q+1)[2,3]
          // The last layer packs too (no activation): the output is stored from the same layout.
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            if (hidden) {
#pragma unroll
              for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[mt][j][e] = apply_activation<kAct>(acc[mt][j][e]);
            }
#pragma unroll
            for (int q = 0; q < 2; ++q) {
              next[mt][2 * chunk + q][0] = pack2<T>(acc[mt][2 * q][0], acc[mt][2 * q][1]);
              next[mt][2 * chunk + q][1] = pack2<T>(acc[mt][2 * q][2], acc[mt][2 * q][3]);
              next[mt][2 * chunk + q][2] = pack2<T>(acc[mt][2 * q + 1][0], acc[mt][2 * q + 1][1]);
              next[mt][2 * chunk + q][3] = pack2<T>(acc[mt][2 * q + 1][2], acc[mt][2 * q + 1][3]);
            }
          }
        } else {
          // Past this layer's width: zeros, which the next layer's k padding expects.
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
            for (int q = 0; q < 2; ++q)
#pragma unroll
              for (int i = 0; i < 4; ++i) next[mt][2 * chunk + q][i] = 0u;
        }
      }
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int kt = 0; kt < kKTiles; ++kt)
#pragma unroll
          for (int i = 0; i < 4; ++i) act[mt][kt][i] = next[mt][kt][i];
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
    if (p.x_vectorized) {
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
      stage_tile<T>(x_smem, kPitch, src, p.stride_xm, rows, in0, kWarpRows, kWidth, x, false, lane,
                    32);
    }
  };

  load_biases<T>(p, bias_smem, kWidth);
  for (int layer = 0; layer < num_layers; ++layer) {
    const T* w = static_cast<const T*>(p.weights[layer]);
    const int in = p.widths[layer], out_l = p.widths[layer + 1];
    const bool vec = is_aligned16(w) && (in * static_cast<int>(sizeof(T))) % 16 == 0;
    stage_tile<T>(weight_smem + layer * kWidth * kPitch, kPitch, w, in, out_l, in, kWidth, kWidth,
                  w, vec, threadIdx.x, blockDim.x);
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
          for (int kt = 0; kt < kKTiles; ++kt) {
            uint32_t b[2][4];
            ldmatrix_x4(b[0], w_rows + (chunk * 32) * kPitch + kt * 16);
            ldmatrix_x4(b[1], w_rows + (chunk * 32 + 16) * kPitch + kt * 16);
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
          for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
            for (int q = 0; q < 2; ++q) {
              next[mt][2 * chunk + q][0] = pack2<T>(acc[mt][2 * q][0], acc[mt][2 * q][1]);
              next[mt][2 * chunk + q][1] = pack2<T>(acc[mt][2 * q][2], acc[mt][2 * q][3]);
              next[mt][2 * chunk + q][2] = pack2<T>(acc[mt][2 * q + 1][0], acc[mt][2 * q + 1][1]);
              next[mt][2 * chunk + q][3] = pack2<T>(acc[mt][2 * q + 1][2], acc[mt][2 * q + 1][3]);
            }
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
                const uint32_t keep = (col < width ? 0xffffu : 0u) | (col + 1 < width ? 0xffff0000u : 0u);
#pragma unroll
                for (int mt = 0; mt < kMTiles; ++mt) {
                  next[mt][2 * chunk + q][2 * half] &= keep;
                  next[mt][2 * chunk + q][2 * half + 1] &= keep;
                }
              }
          }
        } else {
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
            for (int q = 0; q < 2; ++q)
#pragma unroll
              for (int i = 0; i < 4; ++i) next[mt][2 * chunk + q][i] = 0u;
        }
      }
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int kt = 0; kt < kKTiles; ++kt)
#pragma unroll
          for (int i = 0; i < 4; ++i) act[mt][kt][i] = next[mt][kt][i];
    }

    store_warp_rows<T, kMTiles, kKTiles>(act, p, out_smem, out + warp_row0 * out_w,
                                         valid_rows(warp_row0), lane);
    cp_async_wait<0>();
    __syncwarp();
  }
}

// ============================================================== fp32: SIMT
// One k-slab pass of one layer over a row tile, as seen by the item loop.
struct SimtPass {
  const float* src;   // activations in (tile_rows x in, pitch h_pitch)
  float* dst;         // activations out (or partial sums between slabs)
  const float* w;     // weight rows of this layer (or slab), pitch w_pitch
  const float* bias;  // this layer's biases (padded to 4)
  float* out;         // the output's first row of this tile (last layer)
  int h_pitch, w_pitch, col_groups, tile_rows, rows, out_w;
  int s0, s_end;      // k range of this slab
  bool final_slab, last;
  bool rotate;        // dense weight rows whose pitch is an even number of 16-byte units (below)
};

// Every thread takes items of kRows rows x kCols columns (columns col_group + j * groups, groups =
// padded columns / kCols): bias (or the previous slab's partial sums) in, the slab's k range
// accumulated from shared memory, activation out to dst (or to out for the last layer).
template <int kRows, int kCols> struct SimtOperands {
  float4 h[kRows];
  float4 w[kCols];
};

template <int kRows, int kCols, Activation kAct>
__device__ __forceinline__ void simt_items(const SimtPass& q) {
  // Loads of several k steps in flight: narrow items are latency-bound (seed model, H200:
  // B32 12.5 -> 11.8 us, B4096 18.6 -> 18.1 us with 8 / 4 steps instead of 2). (A two-stage
  // register pipeline instead, next steps loaded while the current ones multiply, measured
  // slower: the kernel then needs ~250 registers, one block per SM.)
  constexpr int kUnroll = kRows * kCols >= 16 ? 2 : kRows == 1 ? 8 : 4;
  const int groups = q.col_groups * 4 / kCols;
  const int items = groups * (q.tile_rows / kRows);
  const int w_stride = groups * q.w_pitch;  // from one of an item's weight rows to the next
  for (int item = threadIdx.x; item < items; item += kSimtThreads) {
    const int col_group = item % groups;
    const int row_base = (item / groups) * kRows;
    float acc[kRows][kCols];
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const int c = col_group + j * groups;
#pragma unroll
      for (int i = 0; i < kRows; ++i)
        acc[i][j] = q.s0 == 0 ? q.bias[c] : q.dst[(row_base + i) * q.h_pitch + c];
    }
    const float* h_rows = q.src + row_base * q.h_pitch;
    const float* w_rows = q.w + col_group * q.w_pitch - q.s0;
    const auto load = [&](SimtOperands<kRows, kCols>& o, int k) {
#pragma unroll
      for (int i = 0; i < kRows; ++i) o.h[i] = *reinterpret_cast<const float4*>(h_rows + i * q.h_pitch + k);
#pragma unroll
      for (int j = 0; j < kCols; ++j) o.w[j] = *reinterpret_cast<const float4*>(w_rows + j * w_stride + k);
    };
    const auto multiply = [&](const SimtOperands<kRows, kCols>& o) {
#pragma unroll
      for (int i = 0; i < kRows; ++i)
#pragma unroll
        for (int j = 0; j < kCols; ++j) {
          if constexpr (kRows == 1) {
            // Blocked summation: each group of 4 products is summed on its own, then added, so
            // rounding error grows with k/4 rather than k (one serial chain put a silu MLP at 3x
            // PyTorch's cuBLAS error on an H200). The wider items keep the serial chain: the
            // extra temporaries make their gelu/silu builds spill.
            float part = o.h[i].x * o.w[j].x;
            part = fmaf(o.h[i].y, o.w[j].y, part);
            part = fmaf(o.h[i].z, o.w[j].z, part);
            part = fmaf(o.h[i].w, o.w[j].w, part);
            acc[i][j] += part;
          } else {
            acc[i][j] = fmaf(o.h[i].x, o.w[j].x, acc[i][j]);
            acc[i][j] = fmaf(o.h[i].y, o.w[j].y, acc[i][j]);
            acc[i][j] = fmaf(o.h[i].z, o.w[j].z, acc[i][j]);
            acc[i][j] = fmaf(o.h[i].w, o.w[j].w, acc[i][j]);
          }
        }
    };
    // Dense weight rows (pitch == in) with an even pitch in 16-byte units put the same k of 8
    // consecutive rows in the same banks, so each lane starts its k walk (col_group % 8) steps in
    // and wraps around: the 8 lanes of an LDS.128 phase then read 8 different bank groups. (An
    // item's rows are col_group + j * groups; j * groups shifts all lanes of a phase alike, so one
    // start per lane serves all of them. The activation loads of the phase then read 8
    // consecutive 16-byte chunks: conflict-free too.)
    // A loop of its own: a wrap test per step cost the unrotated (throughput-bound) cases 3-5%,
    // and two plain loops (start..end, then 0..start) made the small batches 25-60% slower. Only
    // 1-row items need it: rotation is planned for 2-row tiles only, which never take 2 or 4 rows
    // per item (that needs >= 256 column groups).
    if (kRows == 1 && q.rotate) {
      const int steps = (q.s_end - q.s0) / 4;
      int k = q.s0 + 4 * ((col_group & 7) % steps);
#pragma unroll kUnroll
      for (int t = 0; t < steps; ++t) {
        SimtOperands<kRows, kCols> o;
        load(o, k);
        multiply(o);
        k += 4;
        if (k == q.s_end) k = q.s0;
      }
    } else {
#pragma unroll kUnroll
      for (int k = q.s0; k < q.s_end; k += 4) {
        SimtOperands<kRows, kCols> o;
        load(o, k);
        multiply(o);
      }
    }
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const int c = col_group + j * groups;
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const int r = row_base + i;
        if (q.final_slab && q.last) {
          if (r < q.rows && c < q.out_w) q.out[static_cast<int64_t>(r) * q.out_w + c] = acc[i][j];
        } else {
          q.dst[r * q.h_pitch + c] = (q.final_slab && !q.last) ? apply_activation<kAct>(acc[i][j]) : acc[i][j];
        }
      }
    }
  }
}

// Two blocks per SM (128 registers) where the weights leave room for two; silu's expf needs a
// few more registers than that (12 bytes of spills at the cap on sm_90a), so its build takes one.
template <Activation kAct>
constexpr int simt_min_blocks() { return kAct == Activation::kSilu ? 1 : 2; }

template <Activation kAct>
__global__ void __launch_bounds__(kSimtThreads, simt_min_blocks<kAct>())
    fused_mlp_simt_kernel(const __grid_constant__ MlpKernelParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* bias_smem = reinterpret_cast<float*>(smem_raw);
  float* weight_smem = reinterpret_cast<float*>(smem_raw + p.weight_area_offset);
  const int h_pitch = p.act_pitch;
  float* h0 = reinterpret_cast<float*>(smem_raw + p.act_area_offset);
  float* h1 = h0 + p.tile_rows * h_pitch;
  const float* x = static_cast<const float*>(p.x);
  float* out = static_cast<float*>(p.out);
  const int num_layers = p.num_layers;
  const int out_w = p.widths[num_layers];
  const bool resident = p.k_slab == 0;

  // Resident weights on sm_90: bulk copies (whole layers or rows), all issued at once, each layer's rows
  // signalling that layer's mbarrier. A bulk copy is not bounded by the per-SM limit on outstanding
  // loads: with cp.async, 88 KB of cold weights (the seed model) took one block ~10 us to arrive,
  // a few load latencies per thread in sequence.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const bool bulk = resident && p.bulk_weights;
  uint64_t* layer_bars = reinterpret_cast<uint64_t*>(smem_raw + p.barrier_offset);
  if (bulk) {
    if (threadIdx.x == 0) {
      for (int layer = 0; layer < num_layers; ++layer) sm90::mbar_init(sm90::smem_u32(layer_bars + layer), 1);
      sm90::fence_barrier_init();
      for (int layer = 0; layer < num_layers; ++layer)
        sm90::mbar_arrive_expect_tx(sm90::smem_u32(layer_bars + layer),
                                    p.widths[layer + 1] * p.widths[layer] * 4);
    }
    __syncthreads();  // barriers initialized and armed before any copy can complete on them
    // A warp issues bulk copies one lane at a time (the compiler wraps cp.async.bulk in an
    // ELECT loop, ~150 cycles per copy on an H200: 32 row copies held warp 0 for 2.3-2.75 us
    // before it could stage x). So a layer whose shared rows are unpadded (pitch == in) goes as
    // one copy, from thread 0; the other layers' rows are spread over warps 1.. (row r to warp
    // 1 + r % (warps - 1)), leaving warp 0 free to stage x and the biases.
    const auto dense = [&](int layer) { return p.weight_pitch[layer] == p.widths[layer]; };
    if (threadIdx.x == 0)
      for (int layer = 0; layer < num_layers; ++layer)
        if (dense(layer))
          sm90::bulk_copy_g2s(sm90::smem_u32(weight_smem + p.weight_offset[layer]), p.weights[layer],
                              p.widths[layer + 1] * p.widths[layer] * 4, sm90::smem_u32(layer_bars + layer));
    constexpr int kCopyWarps = kSimtThreads / 32 - 1;
    const int copy_warp = static_cast<int>(threadIdx.x / 32) - 1;  // -1: warp 0, no row copies
    int layer = 0, layer_row0 = 0;
    for (int row = copy_warp + kCopyWarps * static_cast<int>(threadIdx.x % 32); copy_warp >= 0;
         row += kCopyWarps * 32) {
      while (layer < num_layers && (dense(layer) || row >= layer_row0 + p.widths[layer + 1])) {
        if (!dense(layer)) layer_row0 += p.widths[layer + 1];
        ++layer;
      }
      if (layer == num_layers) break;
      const int in = p.widths[layer];
      const float* src = static_cast<const float*>(p.weights[layer]) + static_cast<int64_t>(row - layer_row0) * in;
      float* dst = weight_smem + p.weight_offset[layer] + (row - layer_row0) * p.weight_pitch[layer];
      sm90::bulk_copy_g2s(sm90::smem_u32(dst), src, in * 4, sm90::smem_u32(layer_bars + layer));
    }
    // Rows padded up to a multiple of 4 read as zeros (the columns need no padding: in % 4 == 0).
    for (int layer = 0; layer < num_layers; ++layer) {
      const int in = p.widths[layer], out_l = p.widths[layer + 1], pad_rows = round_up(out_l, 4) - out_l;
      for (int e = threadIdx.x; e < pad_rows * in; e += kSimtThreads)
        weight_smem[p.weight_offset[layer] + (out_l + e / in) * p.weight_pitch[layer] + e % in] = 0.f;
    }
  }
#else
  constexpr bool bulk = false;
#endif

  load_biases_async(p, bias_smem, 4, x);  // lands with the first x tile's copy group
  bool first_tile = true;
  for (int64_t tile = blockIdx.x; tile < p.num_tiles; tile += gridDim.x) {
    const int64_t row0 = tile * p.tile_rows;
    const int64_t remaining = p.m - row0;  // > 0: tile < num_tiles
    const int rows = remaining < p.tile_rows ? static_cast<int>(remaining) : p.tile_rows;
    stage_tile<float>(h0, h_pitch, x + row0 * p.stride_xm, p.stride_xm, rows, p.widths[0],
                      p.tile_rows, round_up(p.widths[0], 4), x, p.x_vectorized, threadIdx.x,
                      kSimtThreads);
    cp_async_commit();
    if (resident && first_tile && !bulk) {
      // One commit group per layer, so layer i starts as soon as its own weights have landed.
      for (int layer = 0; layer < num_layers; ++layer) {
        const int in = p.widths[layer], out_l = p.widths[layer + 1];
        const float* w = static_cast<const float*>(p.weights[layer]);
        stage_tile<float>(weight_smem + p.weight_offset[layer], p.weight_pitch[layer], w, in,
                          out_l, in, round_up(out_l, 4), round_up(in, 4), w,
                          is_aligned16(w) && in % 4 == 0, threadIdx.x, kSimtThreads);
        cp_async_commit();
      }
    }

    for (int layer = 0; layer < num_layers; ++layer) {
      const float* src = (layer % 2 == 0) ? h0 : h1;
      float* dst = (layer % 2 == 0) ? h1 : h0;
      const int in = p.widths[layer], out_l = p.widths[layer + 1];
      const int in_pad = round_up(in, 4);
      const int col_groups = round_up(out_l, 4) / 4;
      const bool last = layer == num_layers - 1;
      const float* bias = bias_smem + p.bias_offset[layer];
      const float* w = resident ? weight_smem + p.weight_offset[layer] : weight_smem;
      const int w_pitch = resident ? p.weight_pitch[layer] : p.slab_pitch;
      const int slab = resident ? in_pad : p.k_slab;
      // Resident: x and weights 0..layer have landed; later layers may still be in flight.
      cp_async_wait_dynamic(resident && first_tile && !bulk ? num_layers - 1 - layer : 0);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      if (bulk) sm90::mbar_wait(sm90::smem_u32(layer_bars + layer), 0);  // phase 0 stays complete
#endif
      __syncthreads();  // src complete (x copies or the previous layer's stores)

      for (int s0 = 0; s0 < in_pad; s0 += slab) {
        const int s_end = min(s0 + slab, in_pad);
        const bool final_slab = s_end == in_pad;
        if (!resident) {
          __syncthreads();  // everyone is done with the previous slab
          const float* wg = static_cast<const float*>(p.weights[layer]);
          stage_tile<float>(weight_smem, w_pitch, wg + s0, in, out_l, in - s0, round_up(out_l, 4),
                            s_end - s0, wg, is_aligned16(wg) && in % 4 == 0, threadIdx.x,
                            kSimtThreads);
          cp_async_commit();
          cp_async_wait<0>();
          __syncthreads();
        }
        // Item shape, per layer: 4 rows x 4 columns (8 LDS.128 per 64 FMA) while that still gives
        // every thread an item, else 2 x 4, 1 x 4, and 1 x 1 where 1 x 4 items would keep at
        // most 2 warps busy (the seed model at batch 32, 2-row tiles: 10.4 -> 9.9 us on an H200;
        // 1 x 1 for the 16-wide last layer of a 64-wide MLP at batch 64K cost 5%). (Measured
        // against two alternatives, bench/standalone/NOTES-mlp.md: warp tiles of 4 x 8 items,
        // and k ranges split over lanes; neither was faster.)
        const SimtPass q{src, dst, w, bias, out + row0 * out_w, h_pitch, w_pitch, col_groups,
                         p.tile_rows, rows, out_w, s0, s_end, final_slab, last,
                         resident && w_pitch == in && (w_pitch / 4) % 2 == 0};
        if (col_groups * (p.tile_rows / 4) >= kSimtThreads) simt_items<4, 4, kAct>(q);
        else if (col_groups * (p.tile_rows / 2) >= kSimtThreads) simt_items<2, 4, kAct>(q);
        else if (col_groups * p.tile_rows > 64) simt_items<1, 4, kAct>(q);
        else simt_items<1, 1, kAct>(q);  // at most 2 warps would have a 1 x 4 item
      }
      if (!last && out_l % 4 != 0) {
        // Padded columns (out_l .. round_up(out_l, 4)) must be exactly 0 for the next layer: an
        // inf input makes them inf * 0 = NaN, which the next layer would spread over the row.
        // (A pass after a barrier: a select in the store loop above made the 4-row build spill.)
        __syncthreads();
        const int pad = round_up(out_l, 4) - out_l;
        for (int e = threadIdx.x; e < p.tile_rows * pad; e += kSimtThreads)
          dst[(e / pad) * h_pitch + out_l + e % pad] = 0.f;
      }
    }
    first_tile = false;
    __syncthreads();  // all reads of h0/h1 done before the next tile's x overwrites h0
  }
}

}  // namespace
}  // namespace dualk
#include "fused_mlp_tf32.cuh"  // fp32 on tensor cores (3xTF32) for 32-row tiles; uses the above
namespace dualk {
namespace {

// ============================================================== host: planning and launch
using KernelFn = void (*)(MlpKernelParams);

struct MlpPlan {
  MlpKernelParams params;
  KernelFn kernel;
  Tf32KernelFn tf32_kernel;  // when set, launched instead of `kernel` (with the weights' tensor maps)
  int threads;
  int smem_bytes;
};

thread_local char g_reason[256];

template <typename... Args>
const char* reason(const char* format, Args... args) {
  snprintf(g_reason, sizeof(g_reason), format, args...);
  return g_reason;
}

int element_size(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

template <template <Activation> class Pick>
KernelFn pick_by_activation(Activation act) {
  switch (act) {
    case Activation::kNone: return Pick<Activation::kNone>::kernel();
    case Activation::kRelu: return Pick<Activation::kRelu>::kernel();
    case Activation::kGeluTanh: return Pick<Activation::kGeluTanh>::kernel();
    case Activation::kGeluErf: return Pick<Activation::kGeluErf>::kernel();
    case Activation::kSilu: return Pick<Activation::kSilu>::kernel();
  }
  return nullptr;
}

template <typename T, int kMaxWidth> struct MmaPick {
  template <Activation kAct> struct By {
    static KernelFn kernel() { return fused_mlp_mma_kernel<T, kMaxWidth, kAct>; }
  };
};
template <Activation kAct> struct SimtPick {
  static KernelFn kernel() { return fused_mlp_simt_kernel<kAct>; }
};

template <typename T, int kWidth> struct PaddedPick {
  template <Activation kAct> struct By {
    static KernelFn kernel() { return fused_mlp_mma_padded_kernel<T, kWidth, kAct>; }
  };
};

template <typename T>
KernelFn pick_padded_kernel(int bucket, Activation act) {
  return bucket == 64 ? pick_by_activation<PaddedPick<T, 64>::template By>(act)
                      : pick_by_activation<PaddedPick<T, 128>::template By>(act);
}

template <typename T>
KernelFn pick_mma_kernel(int bucket, Activation act) {
  switch (bucket) {
    case 64: return pick_by_activation<MmaPick<T, 64>::template By>(act);
    case 128: return pick_by_activation<MmaPick<T, 128>::template By>(act);
    default: return pick_by_activation<MmaPick<T, 256>::template By>(act);
  }
}

}  // namespace
}  // namespace dualk
#include "fused_mlp_sm90.cuh"  // the sm_90a padded kernel; uses the definitions above
namespace dualk {
namespace {

// Fills `plan` (when not null) or returns why the fused kernel cannot run these arguments.
// Shape-only callers (plan == nullptr) may leave pointers, m and num_sms zero.
const char* plan_fused_mlp(const FusedMlpArgs& a, MlpPlan* plan) {
  if (a.num_layers < 1 || a.num_layers > kMaxMlpLayers)
    return reason("the fused CUDA kernel takes 1 to %d layers, got %d", kMaxMlpLayers, a.num_layers);
  if (a.dtype != DType::kFloat32 && a.dtype != DType::kFloat16 && a.dtype != DType::kBFloat16)
    return reason("the fused CUDA kernel takes float32, float16 or bfloat16 (dtype code %d given)",
                  static_cast<int>(a.dtype));
  const int act = static_cast<int>(a.activation);
  if (act < 0 || act > static_cast<int>(Activation::kSilu))
    return reason("unknown activation code %d", act);
  if (a.m < 0) return reason("the batch size must be >= 0, got %lld", static_cast<long long>(a.m));
  int max_width = 0;
  for (int i = 0; i <= a.num_layers; ++i) {
    if (a.widths[i] < 1) return reason("width %d is %d; every width must be >= 1", i, a.widths[i]);
    if (a.widths[i] > kMaxOnChipWidth)
      return reason("layer %d width %d exceeds the fused kernel's on-chip limit of %d",
                    i == 0 ? 0 : i - 1, a.widths[i], kMaxOnChipWidth);
    max_width = max_width > a.widths[i] ? max_width : a.widths[i];
  }

  const DeviceProps device = device_props();
  const int smem_limit = device.smem_optin;
  MlpKernelParams p{};
  p.x = a.x;
  p.stride_xm = a.stride_xm;
  p.out = a.out;
  p.m = a.m;
  p.num_layers = a.num_layers;
  for (int i = 0; i <= a.num_layers; ++i) p.widths[i] = a.widths[i];
  for (int i = 0; i < a.num_layers; ++i) {
    p.weights[i] = a.weights[i];
    p.biases[i] = a.biases[i];
  }
  const int elem = element_size(a.dtype);
  const bool x_aligned = (reinterpret_cast<uintptr_t>(a.x) & 15) == 0 &&
                         (a.m <= 1 || ((a.stride_xm * elem) & 15) == 0);
  p.x_vectorized = x_aligned;
  int threads = 0, smem = 0;
  KernelFn kernel = nullptr;
  Tf32KernelFn tf32_kernel = nullptr;

  if (a.dtype != DType::kFloat32) {
    const int bucket = max_width <= 64 ? 64 : max_width <= 128 ? 128 : 256;
    const int out_w = a.widths[a.num_layers];
    p.out_pitch = mma_row_pitch(round_up(out_w, 16));
    p.out_vectorized = (reinterpret_cast<uintptr_t>(a.out) & 15) == 0 && (out_w * elem) % 16 == 0;
    p.out_chunks_shift = -1;
    if (p.out_vectorized) {
      const int chunks = out_w * elem / 16;
      if ((chunks & (chunks - 1)) == 0)
        for (p.out_chunks_shift = 0; (1 << p.out_chunks_shift) < chunks;) ++p.out_chunks_shift;
    }
    p.last_chunks = round_up(out_w, kMmaNPad) / kMmaNPad;
    if (bucket <= 128) {
      // Every layer padded to bucket x bucket, all resident: the padded kernel, when it fits.
      const int warp_rows = 16 * (bucket == 64 ? MmaConfig<64>::kMTiles : MmaConfig<128>::kMTiles);
      const int pitch = mma_row_pitch(bucket);
      const int bias_bytes = a.num_layers * bucket * 4;
      const int weight_bytes = a.num_layers * bucket * pitch * elem;
      const int per_warp_bytes = warp_rows * (pitch + p.out_pitch) * elem;
      const int padded_smem = bias_bytes + weight_bytes + kMaxMmaWarps * per_warp_bytes;
      if (padded_smem <= smem_limit) {
        for (int i = 0; i < a.num_layers; ++i) {
          p.bias_offset[i] = i * bucket;
          p.weight_offset[i] = i * bucket * pitch;
          p.weight_pitch[i] = pitch;
        }
        p.num_groups = 1;
        p.group_first_layer[0] = 0;
        p.group_first_layer[1] = a.num_layers;
        p.act_pitch = pitch;
        p.weight_area_offset = bias_bytes;
        p.act_area_offset = bias_bytes + weight_bytes;
        p.num_tiles = ceil_div(a.m, static_cast<int64_t>(kMaxMmaWarps) * warp_rows);
        threads = kMaxMmaWarps * 32;
        smem = padded_smem;
        kernel = a.dtype == DType::kFloat16 ? pick_padded_kernel<__half>(bucket, a.activation)
                                            : pick_padded_kernel<__nv_bfloat16>(bucket, a.activation);
        // Hopper: the same MLP on wgmma (fused_mlp_sm90.cuh) when its plan fits; else as above.
        plan_fused_mlp_wgmma(a, bucket, smem_limit, p, kernel, threads, smem);
      }
    }
  }
  if (kernel == nullptr && a.dtype != DType::kFloat32) {
    const int bucket = max_width <= 64 ? 64 : max_width <= 128 ? 128 : 256;
    const int warp_rows = 16 * (bucket == 64    ? MmaConfig<64>::kMTiles
                                : bucket == 128 ? MmaConfig<128>::kMTiles
                                                : MmaConfig<256>::kMTiles);
    int bias_floats = 0;
    for (int i = 0; i < a.num_layers; ++i) {
      p.bias_offset[i] = bias_floats;
      bias_floats += round_up(a.widths[i + 1], kMmaNPad);
    }
    const int bias_bytes = bias_floats * 4;  // a multiple of 128
    p.act_pitch = mma_row_pitch(round_up(a.widths[0], kMmaKPad));
    // The most warps (8, else 4, 2, 1) whose per-warp buffers leave room for the widest layer.
    int warps = kMaxMmaWarps, max_group_bytes = 0, per_warp_bytes = 0;
    for (;; warps /= 2) {
      per_warp_bytes = warp_rows * (p.act_pitch + p.out_pitch) * elem;
      const int weight_budget = smem_limit - bias_bytes - warps * per_warp_bytes;
      // Greedy groups of consecutive layers that fit in shared memory together.
      int group_bytes = 0, groups = 0, too_big = -1, too_big_bytes = 0;
      max_group_bytes = 0;
      for (int i = 0; i < a.num_layers; ++i) {
        p.weight_pitch[i] = mma_row_pitch(round_up(a.widths[i], kMmaKPad));
        const int bytes = round_up(a.widths[i + 1], kMmaNPad) * p.weight_pitch[i] * elem;
        if (bytes > weight_budget) {
          too_big = i;
          too_big_bytes = bytes;
          break;
        }
        if (i == 0 || group_bytes + bytes > weight_budget) {
          p.group_first_layer[groups++] = i;
          group_bytes = 0;
        }
        p.weight_offset[i] = group_bytes / elem;
        group_bytes += bytes;
        max_group_bytes = max_group_bytes > group_bytes ? max_group_bytes : group_bytes;
      }
      if (too_big < 0) {
        p.group_first_layer[groups] = a.num_layers;
        p.num_groups = groups;
        break;
      }
      if (warps == 1)
        return reason("layer %d (%d x %d) needs %d KB of shared memory for its weights, more than "
                      "this GPU's %d KB per block leaves",
                      too_big, a.widths[too_big + 1], a.widths[too_big], too_big_bytes / 1024,
                      smem_limit / 1024);
    }
    threads = warps * 32;
    p.weight_area_offset = bias_bytes;
    p.act_area_offset = bias_bytes + max_group_bytes;
    smem = p.act_area_offset + warps * per_warp_bytes;
    p.num_tiles = ceil_div(a.m, static_cast<int64_t>(warps) * warp_rows);
    kernel = a.dtype == DType::kFloat16 ? pick_mma_kernel<__half>(bucket, a.activation)
                                        : pick_mma_kernel<__nv_bfloat16>(bucket, a.activation);
  }
  if (a.dtype == DType::kFloat32) {
    // Rows per block tile: one tile per SM, so a batch fills the GPU in one wave and each SM
    // copies the weights from L2 once (88 KB for the 100-128-64-10 seed model); at most 32, and
    // a multiple of 4 (the widest item) except for batches of at most one row per SM, which
    // take 2-row tiles: twice the blocks, each reading its weights for 2 rows instead of 4
    // (seed model, B32 on an H200: 11.4 -> 10.9 us; B256 prefers 4-row tiles, 11.0 vs 11.5).
    const int num_sms = a.num_sms > 0 ? a.num_sms : device.num_sms;
    const int64_t rows_per_sm = ceil_div(a.m > 0 ? a.m : 1, static_cast<int64_t>(num_sms));
    p.tile_rows = rows_per_sm >= 32  ? 32
                  : rows_per_sm == 1 ? 2
                                     : round_up(static_cast<int>(rows_per_sm), 4);
    threads = kSimtThreads;
    int bias_floats = 0;
    for (int i = 0; i < a.num_layers; ++i) {
      p.bias_offset[i] = bias_floats;
      bias_floats += round_up(a.widths[i + 1], 4);
    }
    const int bias_bytes = round_up(bias_floats * 4, 16);
    p.act_pitch = simt_row_pitch(max_width);
    const int h_bytes = 2 * p.tile_rows * p.act_pitch * 4;
    // sm_90 bulk copies need 16-byte aligned rows of whole 16-byte units (in % 4 == 0). Rows are
    // padded to an odd number of 16-byte units (conflict-free reads), except for 2-row tiles
    // (batches of at most one row per SM), where every layer is stored dense (pitch == in): one
    // bulk copy per layer instead of one per row, and the kernel's k rotation keeps the reads
    // conflict-free. (H200, seed model: B32 9.2-9.3 -> 8.6-9.0 us in the harness, 10.5 -> 9.7 us
    // in `dualk bench`; dense rows cost 4-row tiles (B256) 4%, 8-row tiles 4% and 32-row tiles
    // 5-10%: the rotation spreads each activation load over 4 wavefronts where it was one
    // broadcast.)
    bool bulk = device.cc_major >= 9;
    for (int i = 0; i < a.num_layers; ++i)
      bulk = bulk && a.widths[i] % 4 == 0 && (reinterpret_cast<uintptr_t>(a.weights[i]) & 15) == 0;
    const bool dense_rows = bulk && p.tile_rows <= 2;
    int resident_bytes = 0, max_out_pad = 0, max_in_pad = 0;
    for (int i = 0; i < a.num_layers; ++i) {
      p.weight_pitch[i] = dense_rows ? a.widths[i] : simt_row_pitch(a.widths[i]);
      p.weight_offset[i] = resident_bytes / 4;
      resident_bytes += round_up(a.widths[i + 1], 4) * p.weight_pitch[i] * 4;
      max_out_pad = max_out_pad > round_up(a.widths[i + 1], 4) ? max_out_pad : round_up(a.widths[i + 1], 4);
      max_in_pad = max_in_pad > round_up(a.widths[i], 4) ? max_in_pad : round_up(a.widths[i], 4);
    }
    const int weight_budget = smem_limit - bias_bytes - h_bytes - 8 * kMaxMlpLayers;
    int weight_bytes = resident_bytes;
    p.k_slab = 0;
    if (resident_bytes > weight_budget) {
      // Stream each layer in k-slabs: the widest slab (multiple of 4) whose rows fit.
      int slab = max_in_pad;
      while (slab > 4 && max_out_pad * simt_row_pitch(slab) * 4 > weight_budget) slab -= 4;
      if (max_out_pad * simt_row_pitch(slab) * 4 > weight_budget)
        return reason("the fp32 fused kernel cannot fit a %d-row weight slab in shared memory",
                      max_out_pad);
      p.k_slab = slab;
      p.slab_pitch = simt_row_pitch(slab);
      weight_bytes = max_out_pad * p.slab_pitch * 4;
    }
    p.num_groups = 1;
    p.weight_area_offset = bias_bytes;
    p.act_area_offset = bias_bytes + weight_bytes;
    p.barrier_offset = p.act_area_offset + h_bytes;  // a multiple of 16
    smem = p.barrier_offset + 8 * kMaxMlpLayers;
    p.bulk_weights = bulk && p.k_slab == 0;
    p.num_tiles = ceil_div(a.m, p.tile_rows);
    kernel = pick_by_activation<SimtPick>(a.activation);
    // 32-row tiles (batches of >= ~31 rows per SM) on Hopper: the tensor-core kernel, when the
    // weights allow TMA and everything fits in shared memory (fused_mlp_tf32.cuh).
    if (p.tile_rows == 32) {
      tf32_kernel = plan_fused_mlp_tf32x3(a, device, p, smem);
      if (tf32_kernel != nullptr) threads = kTf32Threads;
    }
  }
  if (smem > smem_limit)
    return reason("the fused kernel needs %d KB of shared memory; this GPU allows %d KB",
                  smem / 1024, smem_limit / 1024);
  if (plan != nullptr) {
    plan->params = p;
    plan->kernel = kernel;
    plan->tf32_kernel = tf32_kernel;
    plan->threads = threads;
    plan->smem_bytes = smem;
  }
  return nullptr;
}

}  // namespace

const char* fused_mlp_unsupported_reason(const FusedMlpArgs& args) {
  return plan_fused_mlp(args, nullptr);
}

cudaError_t launch_fused_mlp(const FusedMlpArgs& args, cudaStream_t stream) {
  MlpPlan plan;
  if (plan_fused_mlp(args, &plan) != nullptr) return cudaErrorInvalidValue;
  if (args.m == 0) return cudaSuccess;
  if (args.x == nullptr || args.out == nullptr) return cudaErrorInvalidValue;
  for (int i = 0; i < args.num_layers; ++i)
    if (args.weights[i] == nullptr) return cudaErrorInvalidValue;

  const void* kernel = plan.tf32_kernel != nullptr ? reinterpret_cast<const void*>(plan.tf32_kernel)
                                                   : reinterpret_cast<const void*>(plan.kernel);
  cudaError_t err = ensure_dynamic_smem(kernel, plan.smem_bytes);
  if (err != cudaSuccess) return err;
  const int num_sms = args.num_sms > 0 ? args.num_sms : device_props().num_sms;
  // Persistent grid: no more blocks than fit on the GPU at once, each looping over row tiles.
  int64_t grid = plan.params.num_tiles;
  if (grid > num_sms) {
    int blocks_per_sm = 0;
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, plan.threads, plan.smem_bytes);
    if (err != cudaSuccess) return err;
    if (blocks_per_sm < 1) return cudaErrorInvalidConfiguration;
    const int64_t resident = static_cast<int64_t>(num_sms) * blocks_per_sm;
    grid = grid < resident ? grid : resident;
  }
  if (plan.tf32_kernel != nullptr) {
    MlpTf32Params params;
    params.p = plan.params;
    if (!encode_tf32x3_maps(args, params)) return cudaErrorInvalidValue;
    plan.tf32_kernel<<<static_cast<unsigned>(grid), plan.threads, plan.smem_bytes, stream>>>(params);
    return cudaGetLastError();
  }
  plan.kernel<<<static_cast<unsigned>(grid), plan.threads, plan.smem_bytes, stream>>>(plan.params);
  return cudaGetLastError();
}

}  // namespace dualk
