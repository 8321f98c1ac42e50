// linear_glu: out = act(x @ Wg^T + bg) * (x @ Wu^T + bu), the gated projection of LLaMA-style
// MLPs (SwiGLU, GeGLU, ReGLU), with nn.Linear weights Wg, Wu (n, k). Three routes (plan_route):
//   * Hopper (sm_90a build on a 9.0 device, 16-bit, TMA-compatible x and k-major weights):
//     linear_glu_sm90_kernel, gemm_sm90.cuh's warp-specialized TMA + wgmma pipeline with a
//     B tile of [gate rows; up rows]: per stage the producer issues one TMA load of x's box and
//     one of each weight's box into the two halves of B, the consumers run one wgmma m64nNk16 per
//     k16 over both halves (N = 2 x the output tile's width), so one accumulator holds gate
//     (columns [0, N/2)) and up ([N/2, N)) of the same output columns in the same thread. The
//     epilogue adds the biases, applies act(gate) * up in fp32 and rounds once; TMA stores.
//   * elsewhere, fp32 (any alignment) and 16-bit with 16-byte rows: the two pre-activations in
//     fp32 into a workspace by the family's split-K partial-product kernels (one slice: the
//     portable mma.sync kernel for 16-bit, the SIMT kernels for fp32, exactly as linear_gelu's
//     fp32 path, whatever the TF32 switch says), then glu_epilogue_kernel: bias, act(g) * u in
//     fp32, one rounding. Rows are processed in chunks that bound the workspace.
//   * the rest (16-bit rows not on 16 bytes, k >= 2^31, no workspace): glu_simt_kernel, exact
//     fp32 FMAs of both products in one pass, any stride and alignment.
// Every route rounds once from fp32, as the torch reference does per GEMM (the product of two
// rounded GEMM outputs in eager PyTorch rounds three times).
#include <cstdlib>
#include <cstring>

#include "gemm.cuh"

namespace dualk {
namespace glu {

// ------------------------------------------------------------------ portable pieces

// out[r, c] = act(pre_g[r, c] + bg[c]) * (pre_u[r, c] + bu[c]) over a chunk of `m` rows;
// pre (2, m, n) fp32 or nullptr (k == 0: both products are zero); biases optional.
template <typename T, Activation kAct>
__global__ void glu_epilogue_kernel(const float* __restrict__ pre, int64_t m, int64_t n,
                                    const T* __restrict__ bias_gate, const T* __restrict__ bias_up,
                                    T* __restrict__ out, int64_t stride_om) {
  const int64_t total = m * n;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / n, col = i - row * n;
    float g = pre != nullptr ? pre[i] : 0.f;
    float u = pre != nullptr ? pre[total + i] : 0.f;
    if (bias_gate != nullptr) g += to_float<T>(bias_gate[col]);
    if (bias_up != nullptr) u += to_float<T>(bias_up[col]);
    out[row * stride_om + col] = from_float<T>(apply_activation<kAct>(g) * u);
  }
}

// The general fallback: a 64 x 64 output tile per iteration, 256 threads of 4 x 4 outputs, each
// with a gate and an up accumulator; k in steps of 16 through shared memory (fp32). Operands as
// GemmArgs describe them (A unit stride along k; B k-major or n-major), any alignment.
constexpr int kSimtTile = 64;
constexpr int kSimtK = 16;
constexpr int kSimtThreads = 256;

template <typename T>
__device__ __forceinline__ float load_b(const T* b, const GemmArgs& args, int64_t kk, int64_t col) {
  return to_float<T>(args.b_k_major ? b[col * args.stride_b_outer + kk]
                                    : b[kk * args.stride_b_outer + col]);
}

template <typename T, Activation kAct>
__global__ void __launch_bounds__(kSimtThreads)
    glu_simt_kernel(const GemmArgs gate, const GemmArgs up) {
  __shared__ float xs[kSimtK][kSimtTile + 1];
  __shared__ float gs[kSimtK][kSimtTile + 1];
  __shared__ float us[kSimtK][kSimtTile + 1];
  const T* __restrict__ x = static_cast<const T*>(gate.a);
  const T* __restrict__ wg = static_cast<const T*>(gate.b);
  const T* __restrict__ wu = static_cast<const T*>(up.b);
  const T* __restrict__ bg = static_cast<const T*>(gate.bias);
  const T* __restrict__ bu = static_cast<const T*>(up.bias);
  T* __restrict__ out = static_cast<T*>(gate.c);
  const int64_t m = gate.m, n = gate.n, k = gate.k;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t tiles_n = ceil_div(n, kSimtTile);
  const int64_t num_tiles = ceil_div(m, kSimtTile) * tiles_n;
  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const int64_t m0 = (tile / tiles_n) * kSimtTile, n0 = (tile % tiles_n) * kSimtTile;
    float acc_g[4][4] = {}, acc_u[4][4] = {};
    for (int64_t k0 = 0; k0 < k; k0 += kSimtK) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int e = tid + kSimtThreads * i, r = e / kSimtK, kk = e % kSimtK;
        const int64_t kidx = k0 + kk, row = m0 + r, col = n0 + r;
        const bool k_ok = kidx < k;
        xs[kk][r] = k_ok && row < m ? to_float<T>(x[row * gate.stride_am + kidx]) : 0.f;
        gs[kk][r] = k_ok && col < n ? load_b<T>(wg, gate, kidx, col) : 0.f;
        us[kk][r] = k_ok && col < n ? load_b<T>(wu, up, kidx, col) : 0.f;
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kSimtK; ++kk) {
        float a[4], bgv[4], buv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          a[i] = xs[kk][ty + 16 * i];
          bgv[i] = gs[kk][tx + 16 * i];
          buv[i] = us[kk][tx + 16 * i];
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            acc_g[i][j] = fmaf(a[i], bgv[j], acc_g[i][j]);
            acc_u[i][j] = fmaf(a[i], buv[j], acc_u[i][j]);
          }
      }
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = m0 + ty + 16 * i;
      if (row >= m) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t col = n0 + tx + 16 * j;
        if (col >= n) continue;
        float g = acc_g[i][j], u = acc_u[i][j];
        if (bg != nullptr) g += to_float<T>(bg[col]);
        if (bu != nullptr) u += to_float<T>(bu[col]);
        out[row * gate.stride_cm + col] = from_float<T>(apply_activation<kAct>(g) * u);
      }
    }
  }
}

// ------------------------------------------------------------------ Hopper kernel

// kBlockM x (2 x kHalfN) x 64 tiles: x's box of kBlockM rows, then kHalfN gate rows and kHalfN up
// rows of the weights (both k-major), as one B tile of 2 kHalfN rows; the output tile is
// kBlockM x kHalfN. Two consumer warpgroups (cooperative, kBlockM / 2 = 64 rows each) and one
// producer warpgroup, one CTA per SM, persistent over output tiles (gemm_sm90's tile order).
// kCluster = 2: CTA pairs (a thread-block cluster) on vertically adjacent tiles of one tile column
// (tile rows 2 i and 2 i + 1), which read the same weight rows: rank 0 loads the gate box, rank 1
// the up box, each multicast into both CTAs' rings, so the weights leave L2 once per pair (as
// gemm_sm90's Tile128x256TmaC2 does with B). A stage is refilled only when the consumers of both
// CTAs have released it.
template <int kBlockM_, int kHalfN_, int kStages_, bool kTmaStore_, int kCluster_ = 1>
struct GluTile {
  static constexpr int kBlockM = kBlockM_, kHalfN = kHalfN_, kStages = kStages_;
  static constexpr bool kTmaStore = kTmaStore_;
  static constexpr int kCluster = kCluster_;  // CTAs along m sharing the weight boxes
  static constexpr int kBlockN = 2 * kHalfN;  // accumulator columns: [gate | up]
  static constexpr int kBlockK = 64;          // 64 x 2 bytes = one 128-byte swizzle row
  static constexpr int kConsumerWGs = 2;
  static constexpr int kThreads = 128 * (kConsumerWGs + 1);
  static constexpr int kWgRows = kBlockM / kConsumerWGs;
  static constexpr int kAccRegs = kBlockN / 2;  // fp32 accumulators per thread (one m64 slice)
  static constexpr int kStageBytesA = kBlockM * kBlockK * 2;
  static constexpr int kHalfBytesB = kHalfN * kBlockK * 2;
  static constexpr int kStageBytes = kStageBytesA + 2 * kHalfBytesB;
  // Lane 0 of every consumer warp of every CTA whose producer writes into the ring (pairs: both).
  static constexpr int kEmptyArrivals = 4 * kConsumerWGs * kCluster;
  // One staging buffer per consumer: kWgRows x kHalfN as kHalfN / 64 boxes of kWgRows x 128 B.
  static constexpr int kCBufBytes = kTmaStore ? kWgRows * kHalfN * 2 : 0;
  // Ring, C staging, full[] and empty[]; +1024 for aligning the dynamic base to 1024 bytes.
  static constexpr int kSmemBytes =
      kStages * kStageBytes + kConsumerWGs * kCBufBytes + 2 * kStages * 8 + 1024;
  // As gemm_sm90::TileConfig: the producer's registers go to the consumers.
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;

  static_assert(kWgRows == 64, "each consumer owns one m64 slice");
  static_assert(kBlockN == 64 || kBlockN == 128 || kBlockN == 192 || kBlockN == 224 ||
                    kBlockN == 256,
                "wgmma wrappers exist for n64, n128, n192, n224, n256");
  static_assert(kHalfN % 8 == 0 && kHalfBytesB % 1024 == 0, "the up half starts on a swizzle atom");
  static_assert(!kTmaStore || kHalfN % 64 == 0, "TMA stores write boxes of 64 columns");
  static_assert(kSmemBytes <= 227 * 1024, "sm_90 opt-in shared memory per block");
  static_assert(kCluster == 1 || kCluster == 2, "single CTAs or pairs along m");
};

// The configs (host choice: choose_tiles). Wide: 128 x (2 x 128), the accumulator of the
// GEMM's 128 x 256 tile (128 fp32 per consumer thread), 4 stages of 48 KB (226 KB with the
// staging buffers: the biases are read in the epilogue, no shared slice, to fit the 4th stage).
// Mid: 128 x (2 x 112), for a tile count the wide tile would spread unevenly over the SMs: LLaMA's
// n = 11008 at 512 rows makes 344 wide tiles, 2.6 rounds of 132 SMs, so the CTAs with a third
// tile set the time (H200: 147 us, cuBLAS's one GEMM of the same work 127 us); 396 mid tiles are
// 3 whole rounds of 7/8 the work each. Direct stores (TMA boxes are 64 columns wide); 5 stages
// of 44 KB.
// Narrow: 128 x (2 x 32) for few rows (decode), where the weights' bytes set the time: 4x the
// wide config's tiles, so every SM streams weights; 8 stages of 24 KB (16 KB of it x's box,
// mostly zero-filled rows at 16 rows: TMA reads nothing for them) keep 64 KB of weights in
// flight per SM; direct stores (the output is small). Unmeasured: the first GPU run decides.
using GluWide = GluTile<128, 128, 4, true>;
using GluMid = GluTile<128, 112, 5, false>;
using GluNarrow = GluTile<128, 32, 8, false>;
// The wide tile in CTA pairs (the same 226 KB): each SM pulls half of the weights' bytes per tile
// from L2. The H200 runs 8192-row prefill at its power limit, where fewer L2 -> SM bytes per tile
// may buy clock; taken unless DUALK_GLU_CLUSTER=0 (experiments/NOTES-linear-glu.md, session 35).
using GluWideC2 = GluTile<128, 128, 4, true, 2>;

struct Sm90Params {
  const void* bias_gate;  // (n,) or nullptr
  const void* bias_up;    // (n,) or nullptr
  void* c;
  int64_t stride_cm;
  int m, n, k_tiles;
  int tiles_m, tiles_n, num_tiles;
  int c_vec;  // C element pairs are 4-byte aligned
  int c_tma;  // tmap_c is valid (kTmaStore configs only)
};

// The Hopper epilogue's activation (16-bit outputs only): the fast tanh-gelu and silu, one MUFU op
// each (silu two for fp16; common.cuh says what they cost in accuracy); both consumer warpgroups
// run the epilogue while the tensor cores idle, so its instructions count.
template <typename T, Activation kAct> __device__ __forceinline__ float gate_activation(float v) {
  if constexpr (kAct == Activation::kSilu && std::is_same_v<T, __nv_bfloat16>)
    return silu_tanh_fast(v);
  else if constexpr (kAct == Activation::kSilu)
    return silu_fast(v);
  else
    return apply_activation_16bit<kAct>(v);
}

template <typename T> __device__ __forceinline__ float bias_at(const void* bias, int64_t col) {
  return bias != nullptr ? to_float<T>(static_cast<const T*>(bias)[col]) : 0.f;
}

// The same grouped order as gemm_sm90 (kGroupM tile rows walked column by column). Pairs walk
// cluster tiles as gemm_sm90's tile_coord does: p.tiles_m counts pairs of tile rows, and rank r
// takes tile row kCluster i + r (past the last row: a tile of zeros, stored nowhere).
template <int kCluster>
__device__ __forceinline__ void glu_tile_coord(int tile, const Sm90Params& p, int rank, int& tile_m,
                                               int& tile_n) {
  constexpr int kGroupM = gemm_sm90::kGroupM;
  const int per_group = kGroupM * p.tiles_n;
  const int first_m = (tile / per_group) * kGroupM;
  const int group_rows = min(p.tiles_m - first_m, kGroupM);
  const int in_group = tile - (tile / per_group) * per_group;
  tile_m = (first_m + in_group % group_rows) * kCluster + rank;
  tile_n = in_group / group_rows;
}

// Maps: x (k, m) box 64 x kBlockM; Wg and Wu (k, n) box 64 x kHalfN; out (n, m) box 64 x kWgRows
// (kTmaStore). The ring, the barriers, the descriptors and the main loop are gemm_sm90_kernel's
// cooperative, k-major-B case (pairs: its kClusterM = 2 case, with the gate box as one half of B
// and the up box as the other); only the producer's B loads and the epilogue differ.
template <typename T, typename Cfg, Activation kAct>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    linear_glu_sm90_kernel(const __grid_constant__ CUtensorMap tmap_x,
                           const __grid_constant__ CUtensorMap tmap_g,
                           const __grid_constant__ CUtensorMap tmap_u,
                           const __grid_constant__ CUtensorMap tmap_c, const Sm90Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace gemm_sm90::sm90;
  constexpr int kStages = Cfg::kStages;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem = (smem_u32(smem_raw) + 1023u) & ~1023u;  // swizzle atoms need 1024 B
  const uint32_t c_buf = smem + kStages * Cfg::kStageBytes;     // kConsumerWGs x kCBufBytes
  const uint32_t full_bar = c_buf + Cfg::kConsumerWGs * Cfg::kCBufBytes;
  const uint32_t empty_bar = full_bar + kStages * 8;

  const int wg = threadIdx.x / 128;
  const int tid_wg = threadIdx.x % 128;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_bar + 8 * s, 1);
      mbar_init(empty_bar + 8 * s, Cfg::kEmptyArrivals);
    }
    fence_barrier_init();
  }
  // Pairs: the peer's multicast and arrivals may target this CTA's barriers once it passes here.
  if constexpr (Cfg::kCluster > 1)
    cluster_sync();
  else
    __syncthreads();
  // Pairs walk cluster tiles (blocks 2 c and 2 c + 1 form cluster c), both CTAs the same ones.
  const int rank = Cfg::kCluster > 1 ? static_cast<int>(cluster_rank()) : 0;
  const int first_tile = blockIdx.x / Cfg::kCluster, tile_stride = gridDim.x / Cfg::kCluster;

  if (wg == 0) {
    // ---------------- producer: one thread, x's box and both weights' boxes per stage (pairs:
    // x's box and one weight's box, which lands in both CTAs)
    setmaxnreg_dec<Cfg::kProducerRegs>();
    if (tid_wg != 0) return;
    prefetch_tensor_map(&tmap_x);
    // Pairs: rank 0 loads the gate box into B's first half, rank 1 the up box into its second.
    const CUtensorMap* my_weight = rank == 0 ? &tmap_g : &tmap_u;
    if constexpr (Cfg::kCluster > 1) {
      prefetch_tensor_map(my_weight);
    } else {
      prefetch_tensor_map(&tmap_g);
      prefetch_tensor_map(&tmap_u);
    }
    int stage = 0;
    uint32_t phase = 0;
    for (int tile = first_tile; tile < p.num_tiles; tile += tile_stride) {
      int tile_m, tile_n;
      glu_tile_coord<Cfg::kCluster>(tile, p, rank, tile_m, tile_n);
      const int m0 = tile_m * Cfg::kBlockM;
      const int n0 = tile_n * Cfg::kHalfN;
      for (int kt = 0; kt < p.k_tiles; ++kt) {
        // Released by the consumers (round r - 1); pairs: by both CTAs' consumers, since this
        // producer's weight box lands in both rings.
        mbar_wait(empty_bar + 8 * stage, phase ^ 1);
        const uint32_t bar = full_bar + 8 * stage;
        // Whole boxes count, zero-filled parts too; pairs: the peer's weight box completes its
        // half of the bytes on this barrier.
        mbar_arrive_expect_tx(bar, Cfg::kStageBytes);
        const uint32_t sa = smem + stage * Cfg::kStageBytes;
        const uint32_t sb = sa + Cfg::kStageBytesA;
        const int k0 = kt * Cfg::kBlockK;
        tma_load_2d(sa, &tmap_x, k0, m0, bar);
        if constexpr (Cfg::kCluster > 1) {
          tma_load_2d_mc(sb + rank * Cfg::kHalfBytesB, my_weight, k0, n0, bar, 0x3);
        } else {
          tma_load_2d(sb, &tmap_g, k0, n0, bar);                     // B rows [0, kHalfN): gate
          tma_load_2d(sb + Cfg::kHalfBytesB, &tmap_u, k0, n0, bar);  // [kHalfN, 2 kHalfN): up
        }
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
    if constexpr (Cfg::kCluster > 1) {
      // Stay until every stage's last round was released by the consumers of both CTAs: the
      // peer's arrivals on this CTA's empty barriers must land before it exits.
      for (int i = 0; i < kStages; ++i) {
        mbar_wait(empty_bar + 8 * stage, phase ^ 1);
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
  } else {
    // ---------------- consumers: rows [cw * 64, cw * 64 + 64) of every tile
    setmaxnreg_inc<Cfg::kConsumerRegs>();
    const int cw = wg - 1;
    const int row0 = cw * Cfg::kWgRows;
    const int warp = tid_wg / 32;
    const int lane = tid_wg % 32;
    T* __restrict__ c = static_cast<T*>(p.c);
    // A stage this warp has read may be refilled: tell every CTA whose producer writes it (pairs:
    // both; a tile of zeros too, or its peer would wait forever).
    auto release_stage = [](uint32_t bar) {
      if constexpr (Cfg::kCluster > 1) {
        mbar_arrive_cluster(bar, 0);
        mbar_arrive_cluster(bar, 1);
      } else {
        mbar_arrive(bar);
      }
    };
    const uint64_t desc_a0 = make_desc(smem + row0 * 128, 16, 1024);
    const uint64_t desc_b0 = make_desc(smem + Cfg::kStageBytesA, 16, 1024);
    constexpr uint32_t kStepB = 32;             // bytes per k16 step inside a k-major row
    constexpr int kHalfCols = Cfg::kHalfN / 8;  // n8 column blocks per half

    int stage = 0;
    uint32_t phase = 0;
    float acc[Cfg::kAccRegs];
    for (int tile = first_tile; tile < p.num_tiles; tile += tile_stride) {
      int tile_m, tile_n;
      glu_tile_coord<Cfg::kCluster>(tile, p, rank, tile_m, tile_n);
#pragma unroll
      for (int i = 0; i < Cfg::kAccRegs; ++i) acc[i] = 0.f;

      int prev_stage = 0;
      for (int kt = 0; kt < p.k_tiles; ++kt) {
        mbar_wait(full_bar + 8 * stage, phase);
        const uint64_t stage_off = static_cast<uint64_t>((stage * Cfg::kStageBytes) >> 4);
        fence_acc(acc);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < Cfg::kBlockK / 16; ++ks) {
          const uint64_t db = desc_b0 + stage_off + ((ks * kStepB) >> 4);
          const uint64_t da = desc_a0 + stage_off + ((ks * 32) >> 4);
          wgmma_m64k16<0>(acc, da, db, T{});
        }
        wgmma_commit();
        fence_acc(acc);
        if (kt > 0) {
          wgmma_wait<1>();  // the group of k tile kt-1 has retired: its stage can be refilled
          if (lane == 0) release_stage(empty_bar + 8 * prev_stage);
        }
        prev_stage = stage;
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
      wgmma_wait<0>();
      fence_acc(acc);
      if (p.k_tiles > 0 && lane == 0) release_stage(empty_bar + 8 * prev_stage);

      // Gated epilogue from registers. Thread (warp w, lane l) holds rows 16 w + l / 4 (+ 8) and,
      // per n8 block j < kHalfCols, gate columns 8 j + 2 (l % 4) (+ 1) in acc[4 j + 2 h + e]
      // and the same columns' up values in acc[4 (j + kHalfCols) + 2 h + e].
      const int m_left = p.m - tile_m * Cfg::kBlockM;
      const int n_left = p.n - tile_n * Cfg::kHalfN;
      const int64_t col0 = static_cast<int64_t>(tile_n) * Cfg::kHalfN;
      const int col_base = 2 * (lane % 4);
      auto gated = [&](int j, int h) {
        const int col = col_base + 8 * j;
        float g0 = acc[4 * j + 2 * h], g1 = acc[4 * j + 2 * h + 1];
        float u0 = acc[4 * (j + kHalfCols) + 2 * h], u1 = acc[4 * (j + kHalfCols) + 2 * h + 1];
        if (p.bias_gate != nullptr || p.bias_up != nullptr) {
          const bool ok0 = col < n_left, ok1 = col + 1 < n_left;
          g0 += ok0 ? bias_at<T>(p.bias_gate, col0 + col) : 0.f;
          g1 += ok1 ? bias_at<T>(p.bias_gate, col0 + col + 1) : 0.f;
          u0 += ok0 ? bias_at<T>(p.bias_up, col0 + col) : 0.f;
          u1 += ok1 ? bias_at<T>(p.bias_up, col0 + col + 1) : 0.f;
        }
        return make_float2(gate_activation<T, kAct>(g0) * u0, gate_activation<T, kAct>(g1) * u1);
      };
      if constexpr (Cfg::kTmaStore) {
        if (p.c_tma) {
          // Pair (row r, columns 8 j + 2 (l % 4) + {0, 1}) goes to box j / 8, 16-byte chunk
          // (j % 8) ^ (r % 8) of row r (the 128-byte swizzle TMA undoes), as gemm_sm90_kernel.
          const uint32_t my_buf = c_buf + cw * Cfg::kCBufBytes;
          if (tid_wg == 0) bulk_wait_read();  // this consumer's previous tile has left the buffer
          named_barrier(1 + cw, 128);
#pragma unroll
          for (int j = 0; j < kHalfCols; ++j) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int r = warp * 16 + lane / 4 + h * 8;
              const float2 v = gated(j, h);
              const uint32_t addr = my_buf + (j / 8) * (Cfg::kWgRows * 128) + r * 128 +
                                    (((j % 8) ^ (r % 8)) * 16) + 4 * (lane % 4);
              st_shared_u32(addr, pack2<T>(v.x, v.y));
            }
          }
          fence_proxy_async();
          named_barrier(1 + cw, 128);
          // The second consumer's rows may lie below C (a pair's tile of zeros: all rows).
          if (tid_wg == 0 && row0 < m_left) {
            const int m0 = tile_m * Cfg::kBlockM + row0;
#pragma unroll
            for (int b = 0; b < Cfg::kHalfN / 64; ++b) {
              if (b * 64 >= n_left) break;  // boxes wholly right of C: nothing to store
              tma_store_2d(&tmap_c, my_buf + b * (Cfg::kWgRows * 128),
                           static_cast<int>(col0) + b * 64, m0);
            }
            bulk_commit();
          }
          continue;
        }
      }
      const bool full = m_left >= Cfg::kBlockM && n_left >= Cfg::kHalfN && p.c_vec;
      T* c_tile = c + static_cast<int64_t>(tile_m) * Cfg::kBlockM * p.stride_cm + col0;
#pragma unroll
      for (int j = 0; j < kHalfCols; ++j) {
        const int col = col_base + 8 * j;
        if (!full && col >= n_left) continue;
        const bool pair = full || col + 1 < n_left;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = row0 + warp * 16 + lane / 4 + h * 8;
          if (!full && row >= m_left) continue;
          const float2 v = gated(j, h);
          T* dst = c_tile + row * p.stride_cm + col;
          if (full || (p.c_vec && pair)) {
            *reinterpret_cast<uint32_t*>(dst) = pack2<T>(v.x, v.y);
          } else {
            dst[0] = from_float<T>(v.x);
            if (pair) dst[1] = from_float<T>(v.y);
          }
        }
      }
    }
    if (Cfg::kTmaStore && p.c_tma && tid_wg == 0) bulk_wait_all();  // before the CTA exits
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built without wgmma (sm_80, plain sm_90): can_run_sm90 keeps launches off it
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// ------------------------------------------------------------------ host side

enum class GluTiles { kWide, kMid, kNarrow };

// The tile table's rule (host arithmetic): the narrow tile for at most 64 rows (decode: the
// weights' stream sets the time, and 4x as many tiles spread it over every SM and balance the
// last round: LLaMA's n = 11008 / 14336 at 16 rows make 344 / 448 narrow tiles, 86 / 112 wide
// ones, fewer than 132 SMs), and wherever the wide tiles would not cover every SM once. Else the
// wide or the mid tile, whichever gives the busiest CTA fewer output columns to compute (rounds
// of tiles per SM x tile width), the wide one on a tie (it loads fewer bytes per FLOP): LLaMA at
// 512 rows takes the mid tile (n = 11008: 3 x 112 against 3 x 128 columns; 14336: 4 x 112
// against 4 x 128), at 8192 rows the wide one (42 x 128 = 48 x 112; 55 x 128 < 63 x 112).
inline GluTiles choose_tiles(int64_t m, int64_t n, int64_t num_sms) {
  if (m <= GluWide::kWgRows) return GluTiles::kNarrow;
  const int64_t wide = ceil_div(m, GluWide::kBlockM) * ceil_div(n, GluWide::kHalfN);
  if (wide < num_sms) return GluTiles::kNarrow;
  const int64_t mid = ceil_div(m, GluMid::kBlockM) * ceil_div(n, GluMid::kHalfN);
  const int64_t wide_cols = ceil_div(wide, num_sms) * GluWide::kHalfN;
  const int64_t mid_cols = ceil_div(mid, num_sms) * GluMid::kHalfN;
  return mid_cols < wide_cols ? GluTiles::kMid : GluTiles::kWide;
}

// The Hopper route's preconditions: a 9.0 device, 16-bit, sizes below 2^31, both weights
// k-major (nn.Linear's layout), and what TMA needs of x and the weights (16-byte aligned bases,
// row strides of a multiple of 16 bytes). C and the biases: no requirement.
inline bool can_run_sm90(const GluArgs& args) {
  const GemmArgs& g = args.gate;
  const GemmArgs& u = args.up;
  if (g.dtype != DType::kFloat16 && g.dtype != DType::kBFloat16) return false;
  if (g.batch != 1 || g.m < 1 || g.n < 1 || g.k < 1) return false;
  if (g.m > gemm_sm90::detail::kMaxInt || g.n > gemm_sm90::detail::kMaxInt ||
      g.k > gemm_sm90::detail::kMaxInt)
    return false;
  if (!g.b_k_major || !u.b_k_major) return false;
  if (g.a == nullptr || g.b == nullptr || u.b == nullptr || g.c == nullptr) return false;
  if (!is_aligned16(g.a) || !is_aligned16(g.b) || !is_aligned16(u.b)) return false;
  if (!gemm_sm90::detail::tma_stride_ok(g.m, g.stride_am)) return false;
  if (!gemm_sm90::detail::tma_stride_ok(g.n, g.stride_b_outer)) return false;
  if (!gemm_sm90::detail::tma_stride_ok(g.n, u.stride_b_outer)) return false;
  if (ceil_div(g.m, 128) * ceil_div(g.n, GluNarrow::kHalfN) > gemm_sm90::detail::kMaxInt)
    return false;
  if (!device_is_sm90()) return false;
  return encode_tiled_fn() != nullptr;
}

// The wide tile runs in CTA pairs (GluWideC2) unless DUALK_GLU_CLUSTER=0 (the single-CTA configs
// only). Read at every launch (and by the route name), so one process can time both
// (experiments/glu_gap_probe.py --cluster-ab). On by default since session 35's H200 A/B: in
// back-to-back calls at 2048-8192 rows the pairs ran 1.6-5.8% faster in 5 of 5 rows over two runs
// (isolated calls: -1.3% to +2%, within the A/A rows' 3-4% spread), and bench/linear_glu_llama.py
// with them gave 1.11-1.13x eager at 8192 rows (1.06x before; experiments/NOTES-linear-glu.md).
inline bool cta_pairs_switched_on() {
  const char* value = std::getenv("DUALK_GLU_CLUSTER");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

// Pairs are tried where the switch is on and there is a second tile row to pair with (else every
// pair's second CTA would only compute zeros, as gemm_sm90's choose_tiles avoids too).
inline bool cta_pairs_requested(int64_t m) {
  return m > GluWideC2::kBlockM && cta_pairs_switched_on();
}

// How many clusters of Cfg fit on the device at once (the cached occupancy query; it grants the
// shared memory first); 0 where the grant or the query fails: the caller falls back to single
// CTAs.
template <typename T, typename Cfg, Activation kAct> int resident_clusters() {
  static_assert(Cfg::kCluster > 1, "single CTAs need no cluster query");
  const void* kernel = reinterpret_cast<const void*>(linear_glu_sm90_kernel<T, Cfg, kAct>);
  if (ensure_dynamic_smem(kernel, Cfg::kSmemBytes) != cudaSuccess) {
    cudaGetLastError();  // the fallback's own launch decides what to report
    return 0;
  }
  return max_active_clusters(kernel, Cfg::kThreads, Cfg::kSmemBytes, Cfg::kCluster);
}

// One config: encodes the maps and launches a persistent grid (<= one CTA per SM; pairs: as many
// pairs as are resident at once). Clusters that cannot run (none fits, a failed grant or query):
// cudaErrorInvalidConfiguration before any map is encoded, and launch_sm90 runs the single config.
template <typename T, typename Cfg, Activation kAct>
cudaError_t launch_sm90_config(const GluArgs& args, cudaStream_t stream) {
  using gemm_sm90::detail::make_operand_map;
  auto kernel = linear_glu_sm90_kernel<T, Cfg, kAct>;
  int max_clusters = 0;
  if constexpr (Cfg::kCluster > 1) {
    max_clusters = resident_clusters<T, Cfg, kAct>();
    if (max_clusters < 1) return cudaErrorInvalidConfiguration;
  } else {
    const cudaError_t err =
        ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes);
    if (err != cudaSuccess) return err;
  }
  const GemmArgs& g = args.gate;
  CUtensorMap map_x, map_g, map_u, map_c{};
  if (!make_operand_map(&map_x, g.dtype, g.a, g.k, g.m, g.stride_am, false, 1, 0, Cfg::kBlockM) ||
      !make_operand_map(&map_g, g.dtype, g.b, g.k, g.n, g.stride_b_outer, false, 1, 0,
                        Cfg::kHalfN) ||
      !make_operand_map(&map_u, g.dtype, args.up.b, g.k, g.n, args.up.stride_b_outer, false, 1, 0,
                        Cfg::kHalfN))
    return cudaErrorInvalidValue;
  bool c_tma = false;
  if constexpr (Cfg::kTmaStore) {
    c_tma = is_aligned16(g.c) && gemm_sm90::detail::tma_stride_ok(g.m, g.stride_cm) &&
            make_operand_map(&map_c, g.dtype, g.c, g.n, g.m, g.stride_cm, false, 1, 0, Cfg::kWgRows,
                             CU_TENSOR_MAP_L2_PROMOTION_NONE);
  }
  Sm90Params p;
  p.bias_gate = g.bias;
  p.bias_up = args.up.bias;
  p.c = g.c;
  p.stride_cm = g.stride_cm;
  p.m = static_cast<int>(g.m);
  p.n = static_cast<int>(g.n);
  p.k_tiles = static_cast<int>(ceil_div(g.k, Cfg::kBlockK));
  // Pairs: tile rows counted in pairs (an odd last row's second CTA computes zeros).
  p.tiles_m = static_cast<int>(ceil_div(ceil_div(g.m, Cfg::kBlockM), Cfg::kCluster));
  p.tiles_n = static_cast<int>(ceil_div(g.n, Cfg::kHalfN));
  const int64_t num_tiles = int64_t{p.tiles_m} * p.tiles_n;
  if (num_tiles > gemm_sm90::detail::kMaxInt) return cudaErrorInvalidValue;
  p.num_tiles = static_cast<int>(num_tiles);
  p.c_vec = ((reinterpret_cast<uintptr_t>(g.c) & 3) | (g.m > 1 ? g.stride_cm & 1 : 0)) == 0;
  p.c_tma = c_tma;
  if constexpr (Cfg::kCluster == 1) {
    const int grid = static_cast<int>(std::min<int64_t>(num_tiles, device_props().num_sms));
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(map_x, map_g, map_u, map_c, p);
    return cudaGetLastError();
  } else {
    // As gemm_sm90's launch_config: cluster dims by launch attribute, the grid a whole number of
    // clusters, all of them resident at once (the persistent loop strides over cluster tiles).
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = Cfg::kCluster;
    cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.attrs = &cluster;
    config.numAttrs = 1;
    config.blockDim = dim3(Cfg::kThreads);
    config.dynamicSmemBytes = Cfg::kSmemBytes;
    config.stream = stream;
    config.gridDim =
        dim3(static_cast<unsigned>(Cfg::kCluster * std::min<int64_t>(num_tiles, max_clusters)));
    return cudaLaunchKernelEx(&config, kernel, map_x, map_g, map_u, map_c, p);
  }
}

template <typename T, Activation kAct>
cudaError_t launch_sm90(const GluArgs& args, cudaStream_t stream) {
  switch (choose_tiles(args.gate.m, args.gate.n, device_props().num_sms)) {
    case GluTiles::kWide:
      if (cta_pairs_requested(args.gate.m)) {
        const cudaError_t err = launch_sm90_config<T, GluWideC2, kAct>(args, stream);
        if (err != cudaErrorInvalidConfiguration) return err;
        cudaGetLastError();  // no pair fits: the single wide config below
      }
      return launch_sm90_config<T, GluWide, kAct>(args, stream);
    case GluTiles::kMid:
      return launch_sm90_config<T, GluMid, kAct>(args, stream);
    case GluTiles::kNarrow:
      break;
  }
  return launch_sm90_config<T, GluNarrow, kAct>(args, stream);
}

// Whether launch_sm90 would run the wide tile in pairs (the route name's question; the occupancy
// does not depend on the activation: every instantiation has the same threads, registers and
// shared memory, so silu's answers for all).
inline bool takes_cta_pairs(const GluArgs& args) {
  if (!cta_pairs_requested(args.gate.m)) return false;
  return (args.gate.dtype == DType::kFloat16
              ? resident_clusters<__half, GluWideC2, Activation::kSilu>()
              : resident_clusters<__nv_bfloat16, GluWideC2, Activation::kSilu>()) > 0;
}

// Which route serves the call (host logic; the workspace size and the launcher agree on it).
enum class Route { kNothing, kSm90, kPreActivations, kSimt };

// Rows per pre-activation chunk: the workspace holds 2 x rows x n floats, at most 2^26 (256 MB).
constexpr int64_t kMaxWorkspaceFloats = int64_t{1} << 26;
inline int64_t chunk_rows(const GluArgs& args) {
  return std::max<int64_t>(1,
                           std::min<int64_t>(args.gate.m, kMaxWorkspaceFloats / (2 * args.gate.n)));
}

inline Route plan_route(const GluArgs& args) {
  const GemmArgs& g = args.gate;
  if (g.m == 0 || g.n == 0) return Route::kNothing;
  if (g.k == 0) return Route::kPreActivations;  // the epilogue alone (no GEMM, no workspace)
  if (can_run_sm90(args)) return Route::kSm90;
  if (g.dtype == DType::kFloat32) return Route::kPreActivations;
  const bool aligned =
      gemm::a_rows_aligned(g, 2) && gemm::b_rows_aligned(g, 2) && gemm::b_rows_aligned(args.up, 2);
  return aligned && g.k < (int64_t{1} << 31) ? Route::kPreActivations : Route::kSimt;
}

template <typename T, Activation kAct>
cudaError_t launch_simt(const GluArgs& args, cudaStream_t stream) {
  const int64_t tiles = ceil_div(args.gate.m, kSimtTile) * ceil_div(args.gate.n, kSimtTile);
  const int64_t blocks = std::min<int64_t>(tiles, int64_t{device_props().num_sms} * 8);
  glu_simt_kernel<T, kAct>
      <<<static_cast<unsigned>(blocks), kSimtThreads, 0, stream>>>(args.gate, args.up);
  return cudaGetLastError();
}

// The two products of each chunk of rows into the workspace (fp32, no bias), then the epilogue.
template <typename T, Activation kAct>
cudaError_t launch_pre_activations(const GluArgs& args, cudaStream_t stream) {
  const GemmArgs& g = args.gate;
  const int64_t rows_per_chunk = chunk_rows(args);
  const int64_t elem = element_size(g.dtype);
  for (int64_t r0 = 0; r0 < g.m; r0 += rows_per_chunk) {
    const int64_t rows = std::min(rows_per_chunk, g.m - r0);
    const float* pre = nullptr;
    if (g.k > 0) {
      const gemm::SplitK one_slice{1, g.k};
      GemmArgs part = g;
      part.m = rows;
      part.a = static_cast<const char*>(g.a) + r0 * g.stride_am * elem;
      part.workspace = args.workspace;
      cudaError_t err = gemm::launch_split_k_partials(part, one_slice, stream);
      if (err != cudaSuccess) return err;
      GemmArgs part_up = args.up;
      part_up.m = rows;
      part_up.a = part.a;
      part_up.workspace = args.workspace + rows * g.n;
      err = gemm::launch_split_k_partials(part_up, one_slice, stream);
      if (err != cudaSuccess) return err;
      pre = args.workspace;
    }
    constexpr int kThreads = 256;
    const int64_t blocks =
        std::min<int64_t>(ceil_div(rows * g.n, kThreads), int64_t{device_props().num_sms} * 8);
    glu_epilogue_kernel<T, kAct><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        pre, rows, g.n, static_cast<const T*>(g.bias), static_cast<const T*>(args.up.bias),
        static_cast<T*>(g.c) + r0 * g.stride_cm, g.stride_cm);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

template <typename T, Activation kAct>
cudaError_t run_typed(const GluArgs& args, Route route, cudaStream_t stream) {
  if constexpr (!std::is_same_v<T, float>) {
    if (route == Route::kSm90) return launch_sm90<T, kAct>(args, stream);
  }
  if (route == Route::kSimt) return launch_simt<T, kAct>(args, stream);
  return launch_pre_activations<T, kAct>(args, stream);
}

template <Activation kAct> cudaError_t run(const GluArgs& args, Route route, cudaStream_t stream) {
  switch (args.gate.dtype) {
    case DType::kFloat32:
      return run_typed<float, kAct>(args, route, stream);
    case DType::kFloat16:
      return run_typed<__half, kAct>(args, route, stream);
    case DType::kBFloat16:
      return run_typed<__nv_bfloat16, kAct>(args, route, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace glu

int64_t linear_glu_workspace_floats(const GluArgs& args) {
  if (glu::plan_route(args) != glu::Route::kPreActivations || args.gate.k == 0) return 0;
  return 2 * glu::chunk_rows(args) * args.gate.n;
}

const char* linear_glu_route_name(const GluArgs& args) {
  switch (glu::plan_route(args)) {
    case glu::Route::kNothing:
      return "nothing to compute";
    case glu::Route::kSm90:
      switch (glu::choose_tiles(args.gate.m, args.gate.n, device_props().num_sms)) {
        case glu::GluTiles::kWide:
          return glu::takes_cta_pairs(args) ? "sm90 wgmma 128x(2x128), CTA pairs"
                                            : "sm90 wgmma 128x(2x128)";
        case glu::GluTiles::kMid:
          return "sm90 wgmma 128x(2x112)";
        case glu::GluTiles::kNarrow:
          return "sm90 wgmma 128x(2x32)";
      }
      return "sm90 wgmma";
    case glu::Route::kPreActivations:
      return args.gate.k == 0 ? "bias epilogue (k = 0)"
                              : "portable: two fp32 GEMMs + gated epilogue";
    case glu::Route::kSimt:
      return "portable: one-pass SIMT";
  }
  return "unknown";
}

cudaError_t launch_linear_glu(const GluArgs& args, cudaStream_t stream) {
  const GemmArgs& g = args.gate;
  const GemmArgs& u = args.up;
  if (g.batch != 1 || u.batch != 1 || g.m < 0 || g.n < 0 || g.k < 0) return cudaErrorInvalidValue;
  if (u.m != g.m || u.n != g.n || u.k != g.k || u.dtype != g.dtype || u.a != g.a)
    return cudaErrorInvalidValue;
  glu::Route route = glu::plan_route(args);
  if (route == glu::Route::kNothing) return cudaSuccess;
  if (g.c == nullptr || (g.k > 0 && (g.a == nullptr || g.b == nullptr || u.b == nullptr)))
    return cudaErrorInvalidValue;
  // No (or too small a) workspace for the pre-activations: the one-pass SIMT kernel instead.
  if (route == glu::Route::kPreActivations && g.k > 0 &&
      (args.workspace == nullptr || args.workspace_floats < 2 * glu::chunk_rows(args) * g.n))
    route = glu::Route::kSimt;
  switch (g.activation) {
    case Activation::kSilu:
      return glu::run<Activation::kSilu>(args, route, stream);
    case Activation::kGeluTanh:
      return glu::run<Activation::kGeluTanh>(args, route, stream);
    case Activation::kGeluErf:
      return glu::run<Activation::kGeluErf>(args, route, stream);
    case Activation::kRelu:
      return glu::run<Activation::kRelu>(args, route, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace dualk
