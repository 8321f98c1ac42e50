// fused_mlp: a whole Linear/activation stack in one launch.
//   out = L_{n-1}(act(... act(L_0(x)))),  L_i(h) = h @ W_i^T + b_i,  W_i: (out_i, in_i) row-major.
//
// Six kernels behind one launcher:
//   * fp16/bf16, every width <= 128 and all weights resident: on Hopper (sm_90a),
//     fused_mlp_wgmma_kernel (fused_mlp_sm90.cu: wgmma with the activations as the register A
//     operand); elsewhere fused_mlp_mma_padded_kernel (fused_mlp_mma.cu). Each layer is zero-padded
//     to the 64/128 bucket so that all loops and offsets are compile-time.
//   * fp16/bf16 with a width in 129-256 on Hopper, where TMA can read x and the weights
//     (wide::unfit_reason): fused_mlp_wide_kernel (fused_mlp_wide.cu: weights streamed through a
//     TMA ring, m64n256 wgmma, activations in registers. H100, 256-256-256-64 bf16 at 2^18 rows:
//     150 us in its harness, where the mma.sync kernel below took 579 us and eager PyTorch 471).
//   * fp16/bf16 otherwise (fused_mlp_mma.cu): tensor cores (mma.sync m16n8k16, fp32 accumulation).
//   Each warp owns 16*kMTiles
//     rows and keeps their activations in registers from the first layer to the last: the m16n8
//     C fragments of layer i, after bias + activation + down-cast, are exactly the m16k16 A
//     fragments of layer i+1 (see pack_a_fragment). Weights (zero-padded to multiples of 16) live
//     in shared memory: all layers loaded once per block when they fit, otherwise in groups of
//     consecutive layers reloaded per row tile. x tiles arrive by cp.async into a per-warp buffer;
//     the next tile's copy is issued as soon as this tile's A fragments are in registers, so it
//     overlaps all the layers' math.
//   * fp32 in 32-row tiles (batches of >= ~31 rows per SM) on compute capability 9.x, weights
//     TMA-compatible and all resident: fused_mlp_tf32.cu, 3xTF32 products on the tensor cores
//     (fp32 accuracy), weights by TMA.
//   * fp32 otherwise: exact fp32 on the SIMT cores (below). Activations of a row tile ping-pong
//   between
//     two shared buffers; each thread computes a 4-, 2- or 1-row x 4-column block of outputs per
//     item (per layer, the widest that still gives every thread an item), or single outputs where 1
//     x 4 items would leave most warps idle (small tiles, narrow layers). Weights are resident in
//     shared memory when they fit (on sm_90 fetched by bulk copies: rows padded for conflict-free
//     reads, or, for 2-row tiles, dense with a per-lane k rotation and one copy per layer), else
//     streamed per layer in k-slabs.
// Widths and layer count are runtime values; kernels are templated only on dtype, a width bucket
// (fp16/bf16: 64/128/256) and the activation.
// This file: the planner, the launcher and the SIMT kernel; shared definitions in
// fused_mlp_kernels.cuh.
// Why it stays one file of ~600 lines: the planner sets the tile rows, weight pitches (dense or
// padded) and k-slabs that the SIMT kernel's loops are written against, so the two change
// together; the other kernels already have their own units, and the harness variants under
// experiments/ (mlp_v_*.cu, mkstamp.py) replace this unit whole.
#include <cstdio>

#include "fused_mlp_kernels.cuh"
#include "fused_mlp_wide.cuh"

namespace dualk {
namespace mlp {
namespace {

// ============================================================== fp32: SIMT
// One k-slab pass of one layer over a row tile, as seen by the item loop.
struct SimtPass {
  const float* src;   // activations in (tile_rows x in, pitch h_pitch)
  float* dst;         // activations out (or partial sums between slabs)
  const float* w;     // weight rows of this layer (or slab), pitch w_pitch
  const float* bias;  // this layer's biases (padded to 4)
  float* out;         // the output's first row of this tile (last layer)
  int h_pitch, w_pitch, col_groups, tile_rows, rows, out_w;
  int s0, s_end;  // k range of this slab
  bool final_slab, last;
  bool rotate;  // dense weight rows whose pitch is an even number of 16-byte units (below)
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
      for (int i = 0; i < kRows; ++i)
        o.h[i] = *reinterpret_cast<const float4*>(h_rows + i * q.h_pitch + k);
#pragma unroll
      for (int j = 0; j < kCols; ++j)
        o.w[j] = *reinterpret_cast<const float4*>(w_rows + j * w_stride + k);
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
          q.dst[r * q.h_pitch + c] =
              (q.final_slab && !q.last) ? apply_activation<kAct>(acc[i][j]) : acc[i][j];
        }
      }
    }
  }
}

// Two blocks per SM (128 registers) where the weights leave room for two; silu's expf needs a
// few more registers than that (12 bytes of spills at the cap on sm_90a), so its build takes one.
template <Activation kAct> constexpr int simt_min_blocks() {
  return kAct == Activation::kSilu ? 1 : 2;
}

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

  // Resident weights on sm_90: bulk copies (whole layers or rows), all issued at once, each layer's
  // rows signalling that layer's mbarrier. A bulk copy is not bounded by the per-SM limit on
  // outstanding loads: with cp.async, 88 KB of cold weights (the seed model) took one block ~10 us
  // to arrive, a few load latencies per thread in sequence.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const bool bulk = resident && p.bulk_weights;
  uint64_t* layer_bars = reinterpret_cast<uint64_t*>(smem_raw + p.barrier_offset);
  if (bulk) {
    if (threadIdx.x == 0) {
      for (int layer = 0; layer < num_layers; ++layer)
        sm90::mbar_init(sm90::smem_u32(layer_bars + layer), 1);
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
          sm90::bulk_copy_g2s(sm90::smem_u32(weight_smem + p.weight_offset[layer]),
                              p.weights[layer], p.widths[layer + 1] * p.widths[layer] * 4,
                              sm90::smem_u32(layer_bars + layer));
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
      const float* src =
          static_cast<const float*>(p.weights[layer]) + static_cast<int64_t>(row - layer_row0) * in;
      float* dst =
          weight_smem + p.weight_offset[layer] + (row - layer_row0) * p.weight_pitch[layer];
      sm90::bulk_copy_g2s(sm90::smem_u32(dst), src, in * 4, sm90::smem_u32(layer_bars + layer));
    }
    // Rows padded up to a multiple of 4 read as zeros (the columns need no padding: in % 4 == 0).
    for (int layer = 0; layer < num_layers; ++layer) {
      const int in = p.widths[layer], out_l = p.widths[layer + 1],
                pad_rows = round_up(out_l, 4) - out_l;
      for (int e = threadIdx.x; e < pad_rows * in; e += kSimtThreads)
        weight_smem[p.weight_offset[layer] + (out_l + e / in) * p.weight_pitch[layer] + e % in] =
            0.f;
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
                      p.tile_rows, round_up(p.widths[0], 4), x, row0 + rows == p.m, p.x_vectorized,
                      threadIdx.x, kSimtThreads);
    cp_async_commit();
    if (resident && first_tile && !bulk) {
      // One commit group per layer, so layer i starts as soon as its own weights have landed.
      for (int layer = 0; layer < num_layers; ++layer) {
        const int in = p.widths[layer], out_l = p.widths[layer + 1];
        const float* w = static_cast<const float*>(p.weights[layer]);
        stage_tile<float>(weight_smem + p.weight_offset[layer], p.weight_pitch[layer], w, in, out_l,
                          in, round_up(out_l, 4), round_up(in, 4), w, true,
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
                            s_end - s0, wg, true, is_aligned16(wg) && in % 4 == 0, threadIdx.x,
                            kSimtThreads);
          cp_async_commit();
          cp_async_wait<0>();
          __syncthreads();
        }
        // Item shape, per layer: 4 rows x 4 columns (8 LDS.128 per 64 FMA) while that still gives
        // every thread an item, else 2 x 4, 1 x 4, and 1 x 1 where 1 x 4 items would keep at
        // most 2 warps busy (the seed model at batch 32, 2-row tiles: 10.4 -> 9.9 us on an H200;
        // 1 x 1 for the 16-wide last layer of a 64-wide MLP at batch 64K cost 5%). (Measured
        // against two alternatives, experiments/NOTES-mlp.md: warp tiles of 4 x 8 items,
        // and k ranges split over lanes; neither was faster.)
        const SimtPass q{src,
                         dst,
                         w,
                         bias,
                         out + row0 * out_w,
                         h_pitch,
                         w_pitch,
                         col_groups,
                         p.tile_rows,
                         rows,
                         out_w,
                         s0,
                         s_end,
                         final_slab,
                         last,
                         resident && w_pitch == in && (w_pitch / 4) % 2 == 0};
        if (col_groups * (p.tile_rows / 4) >= kSimtThreads)
          simt_items<4, 4, kAct>(q);
        else if (col_groups * (p.tile_rows / 2) >= kSimtThreads)
          simt_items<2, 4, kAct>(q);
        else if (col_groups * p.tile_rows > 64)
          simt_items<1, 4, kAct>(q);
        else
          simt_items<1, 1, kAct>(q);  // at most 2 warps would have a 1 x 4 item
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

// ============================================================== host: planning and launch
struct MlpPlan {
  MlpKernelParams params;
  KernelFn kernel;
  Tf32KernelFn
      tf32_kernel;  // when set, launched instead of `kernel` (with the weights' tensor maps)
  wide::KernelFn
      wide_kernel;  // likewise (with its own arguments: tensor maps of x and the weights)
  int threads;
  int smem_bytes;
  const char* kernel_name;  // what fused_mlp_kernel_name reports (tests and dualk.explain)
};

thread_local char g_reason[256];

template <typename... Args> const char* reason(const char* format, Args... args) {
  snprintf(g_reason, sizeof(g_reason), format, args...);
  return g_reason;
}

template <Activation kAct> struct SimtPick {
  static KernelFn kernel() { return fused_mlp_simt_kernel<kAct>; }
};

// The name explain shows for a wgmma plan (fused_mlp_sm90.cu's plan_fused_mlp_wgmma).
const char* wgmma_kernel_name(const MlpKernelParams& p) {
  return p.last_panel_rows > 0 ? "sm90 wgmma, resident weights, compact last layer"
                               : "sm90 wgmma, resident weights";
}

// Fills `plan` (when not null) or returns why the fused kernel cannot run these arguments.
// Shape-only callers (plan == nullptr) may leave pointers, m and num_sms zero. allow_wide false
// leaves fused_mlp_wide.cu's kernel out (the launcher's fallback when its tensor maps fail).
const char* plan_fused_mlp(const FusedMlpArgs& a, MlpPlan* plan, bool allow_wide = true) {
  if (a.num_layers < 1 || a.num_layers > kMaxMlpLayers)
    return reason("the fused CUDA kernel takes 1 to %d layers, got %d", kMaxMlpLayers,
                  a.num_layers);
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
  const bool x_aligned = is_aligned16(a.x) && (a.m <= 1 || ((a.stride_xm * elem) & 15) == 0);
  p.x_vectorized = x_aligned;
  int threads = 0, smem = 0;
  KernelFn kernel = nullptr;
  Tf32KernelFn tf32_kernel = nullptr;
  wide::KernelFn wide_kernel = nullptr;
  const char* kernel_name = nullptr;

  if (a.dtype != DType::kFloat32) {
    const int bucket = max_width <= 64 ? 64 : max_width <= 128 ? 128 : 256;
    const int out_w = a.widths[a.num_layers];
    p.out_pitch = mma_row_pitch(round_up(out_w, 16));
    p.out_vectorized = is_aligned16(a.out) && (out_w * elem) % 16 == 0;
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
        kernel = pick_padded_kernel(a.dtype, bucket, a.activation);
        // Hopper: the same MLP on wgmma (fused_mlp_sm90.cu) when its plan fits; else as above.
        kernel_name = plan_fused_mlp_wgmma(a, bucket, smem_limit, p, kernel, threads, smem)
                          ? wgmma_kernel_name(p)
                          : "mma.sync, resident padded weights";
      } else if (plan_fused_mlp_wgmma(a, bucket, smem_limit, p, kernel, threads, smem) &&
                 threads >= 2 * 128) {
        // Hopper: layers the padded kernel cannot hold may still fit the wgmma kernel with its
        // compact last layer (tiny-cuda-nn's 128-128-128-128-128-16: 3 warpgroups); with fewer
        // than 2 warpgroups the per-layer-group mma.sync kernel below stays (it ran 756 us there).
        kernel_name = wgmma_kernel_name(p);
      } else {
        kernel = nullptr;  // (a refused plan may have set it)
      }
    }
  }
  if (allow_wide && a.dtype != DType::kFloat32 && max_width > 128) {
    // Hopper: one launch that streams the weights (fused_mlp_wide.cu), where TMA allows.
    wide_kernel = plan_fused_mlp_wide(a, device, p, smem);
    if (wide_kernel != nullptr) {
      threads = wide::kThreads;
      kernel_name = "sm90 wgmma wide, TMA-streamed weights";
    }
  }
  if (kernel == nullptr && wide_kernel == nullptr && a.dtype != DType::kFloat32) {
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
        return reason(
            "layer %d (%d x %d) needs %d KB of shared memory for its weights, more than "
            "this GPU's %d KB per block leaves",
            too_big, a.widths[too_big + 1], a.widths[too_big], too_big_bytes / 1024,
            smem_limit / 1024);
    }
    threads = warps * 32;
    p.weight_area_offset = bias_bytes;
    p.act_area_offset = bias_bytes + max_group_bytes;
    smem = p.act_area_offset + warps * per_warp_bytes;
    p.num_tiles = ceil_div(a.m, static_cast<int64_t>(warps) * warp_rows);
    kernel = pick_mma_kernel(a.dtype, bucket, a.activation);
    kernel_name = p.num_groups == 1 ? "mma.sync, resident weights" : "mma.sync, weight groups";
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
      bulk = bulk && a.widths[i] % 4 == 0 && is_aligned16(a.weights[i]);
    const bool dense_rows = bulk && p.tile_rows <= 2;
    int resident_bytes = 0, max_out_pad = 0, max_in_pad = 0;
    for (int i = 0; i < a.num_layers; ++i) {
      p.weight_pitch[i] = dense_rows ? a.widths[i] : simt_row_pitch(a.widths[i]);
      p.weight_offset[i] = resident_bytes / 4;
      resident_bytes += round_up(a.widths[i + 1], 4) * p.weight_pitch[i] * 4;
      max_out_pad =
          max_out_pad > round_up(a.widths[i + 1], 4) ? max_out_pad : round_up(a.widths[i + 1], 4);
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
    kernel_name = p.k_slab > 0 ? "fp32 SIMT, k-slab weights" : "fp32 SIMT, resident weights";
    // 32-row tiles (batches of >= ~31 rows per SM) on Hopper: the tensor-core kernel, when the
    // weights allow TMA and everything fits in shared memory (fused_mlp_tf32.cu).
    if (p.tile_rows == 32) {
      tf32_kernel = plan_fused_mlp_tf32x3(a, device, p, smem);
      if (tf32_kernel != nullptr) {
        threads = kTf32Threads;
        kernel_name = "sm90 3xTF32 wgmma";
      }
    }
  }
  if (smem > smem_limit)
    return reason("the fused kernel needs %d KB of shared memory; this GPU allows %d KB",
                  smem / 1024, smem_limit / 1024);
  if (plan != nullptr) {
    plan->params = p;
    plan->kernel = kernel;
    plan->tf32_kernel = tf32_kernel;
    plan->wide_kernel = wide_kernel;
    plan->threads = threads;
    plan->smem_bytes = smem;
    plan->kernel_name = kernel_name;
  }
  return nullptr;
}

// The launcher's plan for these arguments, with its fallback when the driver refuses the wide
// kernel's tensor maps (a null kernel name and the reason when nothing can run them).
const char* launch_plan(const FusedMlpArgs& args, MlpPlan& plan, wide::Maps& maps,
                        wide::Params& params) {
  const char* why = plan_fused_mlp(args, &plan);
  // The wide kernel's tensor maps: should the driver refuse one that wide::unfit_reason let
  // through, the MLP takes the kernel it took before the wide one existed, not an error.
  if (why == nullptr && plan.wide_kernel != nullptr && !wide::make_launch_args(args, maps, params))
    why = plan_fused_mlp(args, &plan, /*allow_wide=*/false);
  return why;
}

}  // namespace
}  // namespace mlp

const char* fused_mlp_unsupported_reason(const FusedMlpArgs& args) {
  return mlp::plan_fused_mlp(args, nullptr);
}

const char* fused_mlp_kernel_name(const FusedMlpArgs& args) {
  mlp::MlpPlan plan;
  mlp::wide::Maps maps;
  mlp::wide::Params params;
  return mlp::launch_plan(args, plan, maps, params) == nullptr ? plan.kernel_name : nullptr;
}

cudaError_t launch_fused_mlp(const FusedMlpArgs& args, cudaStream_t stream) {
  using namespace mlp;
  if (args.m == 0)
    return plan_fused_mlp(args, nullptr) == nullptr ? cudaSuccess : cudaErrorInvalidValue;
  if (args.x == nullptr || args.out == nullptr) return cudaErrorInvalidValue;
  for (int i = 0; i < args.num_layers; ++i)
    if (args.weights[i] == nullptr) return cudaErrorInvalidValue;
  MlpPlan plan;
  wide::Maps wide_maps;
  wide::Params wide_params;
  if (launch_plan(args, plan, wide_maps, wide_params) != nullptr) return cudaErrorInvalidValue;

  const void* kernel = plan.tf32_kernel != nullptr ? reinterpret_cast<const void*>(plan.tf32_kernel)
                       : plan.wide_kernel != nullptr
                           ? reinterpret_cast<const void*>(plan.wide_kernel)
                           : reinterpret_cast<const void*>(plan.kernel);
  cudaError_t err = ensure_dynamic_smem(kernel, plan.smem_bytes);
  if (err != cudaSuccess) return err;
  const int num_sms = args.num_sms > 0 ? args.num_sms : device_props().num_sms;
  // Persistent grid: no more blocks than fit on the GPU at once, each looping over row tiles.
  int64_t grid = plan.params.num_tiles;
  if (grid > num_sms) {
    const int blocks_per_sm = max_blocks_per_sm(kernel, plan.threads, plan.smem_bytes);
    if (blocks_per_sm < 1) return cudaErrorInvalidConfiguration;
    const int64_t resident = static_cast<int64_t>(num_sms) * blocks_per_sm;
    grid = grid < resident ? grid : resident;
  }
  if (plan.tf32_kernel != nullptr) {
    MlpTf32Params params;
    params.p = plan.params;
    if (!encode_tf32x3_maps(args, params)) return cudaErrorInvalidValue;
    plan.tf32_kernel<<<static_cast<unsigned>(grid), plan.threads, plan.smem_bytes, stream>>>(
        params);
    return cudaGetLastError();
  }
  if (plan.wide_kernel != nullptr) {
    plan.wide_kernel<<<static_cast<unsigned>(grid), plan.threads, plan.smem_bytes, stream>>>(
        wide_maps, wide_params);
    return cudaGetLastError();
  }
  plan.kernel<<<static_cast<unsigned>(grid), plan.threads, plan.smem_bytes, stream>>>(plan.params);
  return cudaGetLastError();
}

}  // namespace dualk
