// fused_mlp, fp32, on Hopper tensor cores: 3xTF32 mma.sync for 32-row tiles (large batches).
//
// Its own translation unit; shared definitions (MlpKernelParams, MlpTf32Params, stage_tile,
// load_biases_async, round_up) in fused_mlp_kernels.cuh. fused_mlp.cu's planner calls
// plan_fused_mlp_tf32x3 where it would give a 32-row tile to the SIMT kernel.
//
// Why: the SIMT kernel spends its time on shared-memory loads and issue slots (one FFMA per
// multiply-add per lane), and on sm_90 it fetches padded weight rows by one bulk copy per row,
// which a warp issues one lane at a time (~150 cycles each; the seed model's 202 rows at 32-row
// tiles kept 7 warps busy for ~1.5 us). Here:
//   * Weights arrive by TMA, a handful of box copies per layer issued by one thread: boxes of 32
//     k (128 bytes) x round_up(out, 8) rows, 128-byte swizzled, so ldmatrix reads 8 rows at one k
//     conflict-free without padding the rows. TMA zero-fills k >= in and rows >= out.
//   * Products run on the tensor cores (mma.sync m16n8k8 .tf32) with fp32 accuracy: every operand
//     is split into hi = tf32(v) and lo = tf32(v - hi), and a*b ~ a_lo*b_hi + a_hi*b_lo +
//     a_hi*b_hi (a_lo*b_lo is below fp32 rounding; split_tf32_weight says how inf stays inf).
//     The tensor core is modelled as rounding its fp32 sums toward zero (published measurements
//     of Volta..Ampere), so each k step of 8 starts from a zero accumulator and is added to the
//     running sum with an ordinary FADD. A CPU model of the 100-128-64-10 seed model at batch
//     4096 (experiments/tf32x3_error_model.py) then puts the max error at 1.1e-7 (PyTorch
//     fp32: 1.2e-7; the rule allows 2x + 4 ulp, 4.8e-7), against 9e-7 when one mma accumulator
//     runs through the whole k loop.
//   * Activations of the 32-row tile live in shared memory already split (an hi and a lo buffer,
//     ping-pong between layers): each warp reads them by ldmatrix as A fragments. A layer's
//     output columns are cut into units of 32 rows x 8 or 16 columns, one warp per unit; weights
//     are split as they are loaded (each B fragment feeds both 16-row halves of the tile).
// Device code exists for sm_90 and later; the planner picks the kernel only on compute capability
// 9.x, where it was measured.
#include <cstdint>

#include "fused_mlp_kernels.cuh"

namespace dualk {
namespace mlp {
namespace {

// Bench override: a harness variant of this file (or -D) setting it to 0 keeps fp32 on SIMT.
#ifndef DUALK_FP32_TENSOR_CORES
#define DUALK_FP32_TENSOR_CORES 1
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// v ~ hi + lo, both tf32 (fp32 bit patterns whose low 13 mantissa bits are zero).
// Activations: hi rounded to nearest; an infinite v keeps lo = 0 (inf - inf would make it NaN).
__device__ __forceinline__ void split_tf32(float v, uint32_t& hi, uint32_t& lo) {
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(hi) : "f"(v));
  const float rest = v - __uint_as_float(hi);
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(lo) : "f"(rest));
  if (!isfinite(rest)) lo = 0u;
}
// Weights: hi truncated, so lo has w's sign, and a lo that would be 0 becomes +-2^-126 with w's
// sign (a product with a finite activation then vanishes below fp32 resolution). An infinite
// activation then meets three terms of one sign, inf * w as PyTorch computes it, not inf - inf.
// (A truncated hi leaves lo up to twice as large, but the CPU model, tf32x3_error_model.py, puts
// the seed model at 1.1e-7 either way.)
__device__ __forceinline__ void split_tf32_weight(float w, uint32_t& hi, uint32_t& lo) {
  hi = __float_as_uint(w) & 0xffffe000u;
  const float rest = w - __uint_as_float(hi);
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(lo) : "f"(rest));
  if ((lo & 0x7fffffffu) == 0u) lo = (__float_as_uint(w) & 0x80000000u) | 0x00800000u;
}

// d = a * b + c on one m16n8k8 tile, fp32 accumulation of tf32 operands.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2], const float (&c)[4]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
}

// One layer over the block's 32-row tile.
struct Tf32Layer {
  const float* src_hi;
  const float* src_lo;
  float* dst_hi;  // hidden layers: the next layer's split activations
  float* dst_lo;
  const unsigned char* w;  // this layer's first weight box (shared)
  const float* bias;       // padded to 8 with zeros
  float* out;              // last layer: the tile's first output row (global)
  int pitch;               // floats per activation row
  int box_bytes;           // bytes from one 32-k weight box to the next
  int k_steps;             // ceil(in / 8)
  int n_tiles;             // round_up(out, 8) / 8
  int out_l;
  int rows;  // valid rows of this tile (last layer stores)
  bool last;
};

// Warp w takes output units w, w + 8, ...: all 32 rows (2 m16 tiles: each B fragment feeds both)
// x kN n8 tiles each, fp32 accumulators in registers, then bias + activation, split, into dst (or
// bias only, straight to out for the last layer).
template <int kN, Activation kAct>
__device__ __forceinline__ void tf32x3_layer(const Tf32Layer& L) {
  constexpr int kM = kTf32TileRows / 16;
  const int lane = threadIdx.x & 31;
  const int quad = lane >> 3, r8 = lane & 7;  // ldmatrix: lanes 8q..8q+7 address matrix q's rows
  // A (activations, row-major): matrix q = rows (q & 1) * 8.., k (q >> 1) * 4.. of a 16 x 8 step,
  // which are a0..a3 of mma.m16n8k8 (row g / g + 8, k t / t + 4).
  const int a_off = ((quad & 1) * 8 + r8) * L.pitch + (quad >> 1) * 4;
  // B (weights, n rows of k): matrix q = n tile (q >> 1), k half (q & 1): b0, b1 of each tile.
  const int b_half = quad & 1;
  const int units = L.n_tiles / kN;
  for (int unit = threadIdx.x >> 5; unit < units; unit += kTf32Warps) {
    const int n0 = unit * kN * 8;
    const int b_row = n0 + (kN == 2 ? (quad >> 1) * 8 : 0) + r8;
    const unsigned char* b_rows = L.w + b_row * (kTf32BoxK * 4);
    const float* a_hi_rows = L.src_hi + a_off;
    const float* a_lo_rows = L.src_lo + a_off;
    float acc[kM][kN][4] = {};
#pragma unroll 2
    for (int ks = 0; ks < L.k_steps; ++ks) {
      const int k0 = ks * 8;
      uint32_t a_hi[kM][4], a_lo[kM][4];
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        ldmatrix_x4(a_hi[m], a_hi_rows + m * 16 * L.pitch + k0);
        ldmatrix_x4(a_lo[m], a_lo_rows + m * 16 * L.pitch + k0);
      }
      // 128B swizzle: 16-byte unit j of row n sits at unit j ^ (n % 8) (b_row % 8 == r8).
      const unsigned char* b_addr =
          b_rows + (k0 / kTf32BoxK) * L.box_bytes + ((((k0 % kTf32BoxK) >> 2) + b_half) ^ r8) * 16;
      uint32_t b_raw[kN][2];
      if constexpr (kN == 2) {
        uint32_t t[4];
        ldmatrix_x4(t, b_addr);
        b_raw[0][0] = t[0], b_raw[0][1] = t[1], b_raw[1][0] = t[2], b_raw[1][1] = t[3];
      } else {
        uint32_t t[2];
        ldmatrix_x2(t, b_addr);
        b_raw[0][0] = t[0], b_raw[0][1] = t[1];
      }
      uint32_t b_hi[kN][2], b_lo[kN][2];
#pragma unroll
      for (int j = 0; j < kN; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          split_tf32_weight(__uint_as_float(b_raw[j][h]), b_hi[j][h], b_lo[j][h]);
      const float zero[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int m = 0; m < kM; ++m)
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          float part[4];  // this k step alone: small terms first, then hi * hi
          mma_tf32(part, a_lo[m], b_hi[j], zero);
          mma_tf32(part, a_hi[m], b_lo[j], part);
          mma_tf32(part, a_hi[m], b_hi[j], part);
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[m][j][e] += part[e];
        }
    }
    // C fragment: acc[m][j][2 h + e] = (row 16 m + g + 8 h, column n0 + 8 j + 2 t + e).
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      const int col = n0 + j * 8 + 2 * t;
      const float2 bias = *reinterpret_cast<const float2*>(L.bias + col);
#pragma unroll
      for (int m = 0; m < kM; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = m * 16 + g + 8 * h;
          float v0 = acc[m][j][2 * h] + bias.x, v1 = acc[m][j][2 * h + 1] + bias.y;
          if (L.last) {
            if (row < L.rows) {
              float* o = L.out + row * L.out_l + col;
              if (col < L.out_l) o[0] = v0;
              if (col + 1 < L.out_l) o[1] = v1;
            }
          } else {
            // Padded columns stay exactly 0 (an inf input would make them inf * 0 = NaN).
            v0 = col < L.out_l ? apply_activation<kAct>(v0) : 0.f;
            v1 = col + 1 < L.out_l ? apply_activation<kAct>(v1) : 0.f;
            uint32_t h0, l0, h1, l1;
            split_tf32(v0, h0, l0);
            split_tf32(v1, h1, l1);
            *reinterpret_cast<float2*>(L.dst_hi + row * L.pitch + col) =
                make_float2(__uint_as_float(h0), __uint_as_float(h1));
            *reinterpret_cast<float2*>(L.dst_lo + row * L.pitch + col) =
                make_float2(__uint_as_float(l0), __uint_as_float(l1));
          }
        }
    }
  }
}
#endif  // __CUDA_ARCH__ >= 900

// Shared memory (offsets from a 1024-byte aligned base): biases at 0, one mbarrier per layer at
// barrier_offset, four activation buffers (hi, lo) x 2 at act_area_offset, weights at
// weight_area_offset (each layer weight_offset[l] floats in, its boxes tf32_box_bytes apart).
// At most 128 registers: two blocks per SM where shared memory allows (the 64-wide fp32 MLP at
// batch 64K: 81.8 us; at 132 registers, one block per SM, 113 us).
template <Activation kAct>
__global__ void __launch_bounds__(kTf32Threads, 2)
    fused_mlp_tf32x3_kernel(const __grid_constant__ MlpTf32Params params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const MlpKernelParams& p = params.p;
  extern __shared__ __align__(16) unsigned char smem_raw[];  // aligned to 1024 below (128B swizzle)
  unsigned char* smem = smem_raw + ((1024 - (sm90::smem_u32(smem_raw) & 1023)) & 1023);
  float* bias_smem = reinterpret_cast<float*>(smem);
  uint64_t* layer_bars = reinterpret_cast<uint64_t*>(smem + p.barrier_offset);
  float* act = reinterpret_cast<float*>(smem + p.act_area_offset);
  const unsigned char* weights = smem + p.weight_area_offset;
  const int pitch = p.act_pitch;
  const int buf_floats = kTf32TileRows * pitch;
  const int num_layers = p.num_layers;
  const int in0_pad = round_up(p.widths[0], 8);

  // The last warp fetches the weights: barriers, then every layer's boxes, issued at entry (each
  // tensor map's first use waits on a cold fetch of its descriptor); the other warps stage x
  // meanwhile. (Seed model, B4096, H200 harness: 14.4 -> 13.9 us against thread 0 issuing them
  // before its share of x. Thread-block clusters of 2 or 4 multicasting every box, so that a
  // cluster reads the weights from L2 once, measured no faster: the weights still landed ~4.2 us
  // after entry.)
  constexpr int kStageThreads = (kTf32Warps - 1) * 32;
  if (threadIdx.x >= kStageThreads) {
    const int lane = threadIdx.x - kStageThreads;
    if (lane < num_layers) sm90::prefetch_tensor_map(&params.weight_maps[lane]);
    if (lane == 0) {
      for (int layer = 0; layer < num_layers; ++layer)
        sm90::mbar_init(sm90::smem_u32(layer_bars + layer), 1);
      sm90::fence_barrier_init();
      for (int layer = 0; layer < num_layers; ++layer) {
        const int in = p.widths[layer], out_l = p.widths[layer + 1];
        const uint32_t bar = sm90::smem_u32(layer_bars + layer);
        const uint32_t dst = sm90::smem_u32(weights + p.weight_offset[layer] * 4);
        sm90::mbar_arrive_expect_tx(bar, tf32_layer_bytes(in, out_l));
        for (int k = 0; k < in; k += kTf32BoxK)
          sm90::tma_load_2d(dst + k / kTf32BoxK * tf32_box_bytes(out_l), &params.weight_maps[layer],
                            k, 0, bar);
      }
    }
  }

  const float* x = static_cast<const float*>(p.x);
  float* out = static_cast<float*>(p.out);
  const int out_w = p.widths[num_layers];
  load_biases_async(p, bias_smem, 8, x);  // lands with the first x tile's copy group
  for (int64_t tile = blockIdx.x; tile < p.num_tiles; tile += gridDim.x) {
    const int64_t row0 = tile * kTf32TileRows;
    const int64_t remaining = p.m - row0;  // > 0: tile < num_tiles
    const int rows = remaining < kTf32TileRows ? static_cast<int>(remaining) : kTf32TileRows;
    // x straight from global memory into its hi / lo buffers (zeros beyond the tile's rows and
    // in0): loads, split, stores, one barrier.
    float* x_hi = act;
    float* x_lo = act + buf_floats;
    const float* x_tile = x + row0 * p.stride_xm;
    const int chunks = in0_pad / 4;  // 16-byte chunks per row; in0 % 4 == 0 (planner)
    const auto store_split = [&](int e, float4 v) {
      const int r = e / chunks, c = (e - r * chunks) * 4;
      uint32_t h[4], l[4];
      split_tf32(v.x, h[0], l[0]);
      split_tf32(v.y, h[1], l[1]);
      split_tf32(v.z, h[2], l[2]);
      split_tf32(v.w, h[3], l[3]);
      *reinterpret_cast<uint4*>(x_hi + r * pitch + c) = make_uint4(h[0], h[1], h[2], h[3]);
      *reinterpret_cast<uint4*>(x_lo + r * pitch + c) = make_uint4(l[0], l[1], l[2], l[3]);
    };
    if (threadIdx.x < kStageThreads) {
      if (p.x_vectorized) {
        // All of a thread's loads in flight before the first split.
        constexpr int kMaxChunks =
            (kTf32TileRows * kMaxOnChipWidth / 4 + kStageThreads - 1) / kStageThreads;
        float4 v[kMaxChunks];
#pragma unroll
        for (int i = 0; i < kMaxChunks; ++i) {
          const int e = threadIdx.x + i * kStageThreads;
          const int r = e / chunks, c = (e - r * chunks) * 4;
          v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
          if (r < rows && c < p.widths[0])
            v[i] = *reinterpret_cast<const float4*>(x_tile + r * p.stride_xm + c);
        }
#pragma unroll
        for (int i = 0; i < kMaxChunks; ++i) {
          const int e = threadIdx.x + i * kStageThreads;
          if (e < kTf32TileRows * chunks) store_split(e, v[i]);
        }
      } else {
        for (int e = threadIdx.x; e < kTf32TileRows * chunks; e += kStageThreads) {
          const int r = e / chunks, c = (e - r * chunks) * 4;
          float f[4];
#pragma unroll
          for (int j = 0; j < 4; ++j)
            f[j] = r < rows && c + j < p.widths[0] ? x_tile[r * p.stride_xm + c + j] : 0.f;
          store_split(e, make_float4(f[0], f[1], f[2], f[3]));
        }
      }
    }
    cp_async_commit();
    cp_async_wait<0>();  // the biases (first tile)
    __syncthreads();     // x split (and, the first time, the biases and barrier inits) complete

    for (int layer = 0; layer < num_layers; ++layer) {
      const int out_l = p.widths[layer + 1];
      const float* src = act + (layer % 2) * 2 * buf_floats;
      float* dst = act + ((layer + 1) % 2) * 2 * buf_floats;
      const Tf32Layer L{src,
                        src + buf_floats,
                        dst,
                        dst + buf_floats,
                        weights + p.weight_offset[layer] * 4,
                        bias_smem + p.bias_offset[layer],
                        out + row0 * out_w,
                        pitch,
                        tf32_box_bytes(out_l),
                        (p.widths[layer] + 7) / 8,
                        round_up(out_l, 8) / 8,
                        out_l,
                        rows,
                        layer == num_layers - 1};
      sm90::mbar_wait(sm90::smem_u32(layer_bars + layer), 0);  // phase 0 stays complete
      // Units of 32 rows x 16 columns where that still gives every warp one (each A fragment then
      // feeds 2 n8 tiles; an even count keeps the second tile inside the layer's boxes), else x 8.
      if (L.n_tiles % 2 == 0 && L.n_tiles >= 2 * kTf32Warps)
        tf32x3_layer<2, kAct>(L);
      else
        tf32x3_layer<1, kAct>(L);
      __syncthreads();  // dst complete before the next layer reads it; src free for its writes
    }
  }
#endif
}

// ------------------------------------------------------------------ host side
template <Activation kAct> struct Tf32Pick {
  static Tf32KernelFn kernel() { return fused_mlp_tf32x3_kernel<kAct>; }
};

}  // namespace

// Fills p's tf32 layout and smem (bytes, with 1024 of alignment slack) and returns the kernel, or
// nullptr where the 3xTF32 kernel cannot run (then p and smem are unchanged): not compute
// capability 9.x, a layer input width not a multiple of 4 or an unaligned weight (TMA needs
// 16-byte aligned rows), no driver entry point, or too little shared memory.
Tf32KernelFn plan_fused_mlp_tf32x3(const FusedMlpArgs& a, const DeviceProps& device,
                                   MlpKernelParams& p, int& smem) {
  if (!DUALK_FP32_TENSOR_CORES || device.cc_major != 9) return nullptr;
  int max_width = 0;
  for (int i = 0; i < a.num_layers; ++i) {
    if (a.widths[i] % 4 != 0 || a.weights[i] == nullptr || !is_aligned16(a.weights[i]))
      return nullptr;
    max_width = max_width > a.widths[i] ? max_width : a.widths[i];
  }
  max_width = max_width > a.widths[a.num_layers] ? max_width : a.widths[a.num_layers];
  if (encode_tiled_fn() == nullptr) return nullptr;
  MlpKernelParams q = p;
  int bias_floats = 0, weight_bytes = 0;
  for (int i = 0; i < a.num_layers; ++i) {
    q.bias_offset[i] = bias_floats;
    bias_floats += round_up(a.widths[i + 1], 8);
    q.weight_offset[i] = weight_bytes / 4;
    weight_bytes += tf32_layer_bytes(a.widths[i], a.widths[i + 1]);
  }
  // Rows of an odd number of 16-byte units: ldmatrix's 8 rows at one k hit 8 distinct bank groups.
  q.act_pitch = round_up(max_width, 8) + 4;
  q.barrier_offset = round_up(bias_floats * 4, 8);
  q.act_area_offset = round_up(q.barrier_offset + 8 * a.num_layers, 16);
  q.weight_area_offset = round_up(q.act_area_offset + 4 * kTf32TileRows * q.act_pitch * 4, 1024);
  q.num_tiles = (a.m + kTf32TileRows - 1) / kTf32TileRows;
  const int bytes = q.weight_area_offset + weight_bytes + 1024;
  if (bytes > device.smem_optin) return nullptr;
  p = q;
  smem = bytes;
  return pick_by_activation<Tf32Pick>(a.activation);
}

// The weight maps: layer i as a 2-D fp32 tensor (in_i fastest, out_i rows), 128-byte boxes.
bool encode_tf32x3_maps(const FusedMlpArgs& a, MlpTf32Params& params) {
  const EncodeTiledFn encode = encode_tiled_fn();
  if (encode == nullptr) return false;
  for (int i = 0; i < a.num_layers; ++i) {
    const int in = a.widths[i], out = a.widths[i + 1];
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(in), static_cast<cuuint64_t>(out)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(in) * 4};
    const cuuint32_t box[2] = {kTf32BoxK, static_cast<cuuint32_t>(round_up(out, 8))};
    const cuuint32_t elem_strides[2] = {1, 1};
    if (encode(&params.weight_maps[i], CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2,
               const_cast<void*>(a.weights[i]), dims, strides, box, elem_strides,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return false;
  }
  return true;
}

}  // namespace mlp
}  // namespace dualk
