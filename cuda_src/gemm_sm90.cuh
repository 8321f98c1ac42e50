// Hopper (sm_90a) GEMM: C[b] = act(A[b] @ B[b] + bias) with TMA loads, wgmma and a persistent,
// warp-specialized CTA. Framework-free (no torch); the same GemmArgs as gemm_mma.cuh's mma.sync
// path.
//
// Per CTA (one per SM, persistent over output tiles, grouped tile order as gemm_common.cuh's
// tile_coord):
//   * warpgroup 0, the producer: after setmaxnreg.dec to 40 registers, one thread walks the CTA's
//     tiles and k tiles and issues cp.async.bulk.tensor loads (128-byte swizzle, TMA zero-fills
//     outside the tensor) into a kStages-deep shared-memory ring. Stage s has two mbarriers:
//     full[s] (1 arrival + the stage's transaction bytes) and empty[s] (one arrival per consumer
//     warp, after the wgmma that read the stage retired; clusters: per consumer warp of every
//     CTA whose producer writes the stage, kWriters of them: both of a pair, three of a 2 x 2).
//   * warpgroups 1 and 2, the consumers (setmaxnreg.inc to 232): cooperative configs give each
//     kBlockM/2 rows of every tile and the whole kBlockN width (ping-pong: below); per k tile
//     of 64 it issues 4 (k16) x kMSub wgmma m64nNk16 with both operands from shared memory, keeps
//     one wgmma group in flight (the stage of k tile t-1 is released once the group of t is issued
//     and t-1 has retired). Its accumulators start from the bias (each consumer stages the tile's
//     bias slice in shared memory, loaded during the previous tile's main loop), so the epilogue
//     from registers is the activation in fp32 (epilogue_pair: apply_activation_16bit, the math of
//     the portable kernels' epilogue), down-cast, and stores: by TMA from a swizzled staging buffer
//     where C allows it (kTmaStore configs), else bounds-checked 32-bit stores. The producer
//     meanwhile fills the ring with the next tile, so loads overlap the epilogue.
//   * Ping-pong configs (kPingPong): each consumer owns whole tiles instead of half of each, the
//     CTA's tiles alternating between the two, and order barriers make their main loops take
//     turns, so one consumer's epilogue overlaps the other's wgmma (TileConfig says when).
// The ring position (stage, phase) runs on across tiles in both roles, so it never resets.
//
// B layouts: k-major (b_k_major, W (n, k) row-major: "TN") is loaded as rows of 64 k, like A;
// n-major (B (k, n) row-major) as kBlockN / 64 boxes of 64 n x 64 k and fed to wgmma transposed
// (imm-trans-b = 1, MN-major descriptor).
//
// Shared-memory descriptors (PTX ISA "matrix descriptor"): start address >> 4 (bits 0-13), leading
// byte offset >> 4 (16-29), stride byte offset >> 4 (32-45), swizzle mode in bits 62-63 (1 = 128B).
//   K-major tiles (A; B k-major): rows of 64 elements = 128 bytes, 8-row core groups 1024 bytes
//     apart (SBO = 1024; LBO unused with swizzle, set to 1); the k16 step j starts 32 j bytes in
//     (the hardware applies the 128B XOR swizzle to the computed address, as TMA wrote it).
//   MN-major B: ((8 n, 8 chunks, N / 64 boxes), (8 k, k groups)): LBO = box stride 8192 bytes,
//     SBO = 8 k rows = 1024 bytes; the k16 step j starts 2048 j bytes in.
// Every stage buffer is 1024-byte aligned, so the swizzle phase (base offset 0) matches TMA's.
//
// Tensor maps are encoded on the host per launch through cuTensorMapEncodeTiled, fetched with
// cudaGetDriverEntryPointByVersion (no libcuda link), and passed as __grid_constant__ params.
// Device code exists only in the sm_90a pass (__CUDA_ARCH_FEAT_SM90_ALL); other targets compile
// an empty kernel body, and can_run() is false on any device but compute capability 9.0.
// run_gemm_best (gemm_select.cuh) calls launch() where can_run() holds.
// Why it stays one file of ~700 lines: one kernel (producer and consumer roles share the ring,
// the barriers and the descriptors) and its host side (tensor maps, config choice), with no other
// user; the other GEMM family members are in gemm_mma.cuh, gemm_simt*.cuh.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "common.cuh"

namespace dualk {
namespace gemm_sm90 {

// ------------------------------------------------------------------ configuration

// kBlockM x kBlockN x 64 tile, kStages-deep ring, 2 consumer warpgroups + 1 producer warpgroup,
// one CTA per SM.
// kPingPong = false ("cooperative"): both consumer warpgroups work on one tile, kBlockM / 2 rows
// each, and the tensor cores idle while they run the epilogue together.
// kPingPong = true: each consumer owns whole tiles, the CTA's tiles alternating between them, and
// their main loops take turns (order barriers): one consumer's epilogue runs while the other's
// wgmma keep the tensor cores busy, which pays most for short k (linear_gelu, k = 768).
// kTmaStore: the epilogue writes each consumer's rows into a shared-memory staging buffer
// (128-byte swizzled boxes of 64 columns, conflict-free for the accumulator layout) and one
// thread stores them with TMA: whole 128-byte lines instead of 32-bit pieces of 8 rows, issued
// asynchronously (the store drains during the next tile's main loop) and clipped by TMA at the
// matrix edges. Taken at run time only where C suits TMA (KernelParams::c_tma), else the direct
// stores.
template <int kBlockM_, int kBlockN_, int kStages_, bool kPingPong_ = false,
          bool kTmaStore_ = false, int kCluster_ = 1, int kClusterN_ = (kCluster_ == 4 ? 2 : 1)>
struct TileConfig {
  static constexpr int kBlockM = kBlockM_, kBlockN = kBlockN_, kStages = kStages_;
  static constexpr bool kPingPong = kPingPong_;
  static constexpr bool kTmaStore = kTmaStore_;
  // kCluster = 2 (kClusterN = 1): CTA pairs (a thread-block cluster) take vertically adjacent
  // tiles of one tile column and multicast B's boxes, each loading half of them into both CTAs'
  // rings, so B is read from L2 once per pair. A stage is then refilled only when both CTAs'
  // consumers released it.
  // kCluster = 4: 2 x 2 tiles, CTA rank r at (r % 2, r / 2); the two CTAs of a tile column share
  // B's boxes as pairs do, the two of a tile row A's, each loading half of each; a stage is
  // refilled when the three CTAs that write into it released it.
  // kCluster = 2 with kClusterN = 2: pairs along n instead, multicasting A (cuBLASLt's choice at
  // linear_gelu 1000^3: 128 x 64 tiles in 1 x 2 clusters).
  static constexpr int kCluster = kCluster_;
  static constexpr int kClusterN = kClusterN_;                // CTAs along n (sharing A)
  static constexpr int kClusterM = kCluster / kClusterN;      // CTAs along m (sharing B)
  static constexpr int kWriters = kClusterM + kClusterN - 1;  // CTAs loading into one ring
  static constexpr int kBlockK = 64;  // 64 x 2 bytes = one 128-byte swizzle row
  static constexpr int kConsumerWGs = 2;
  static constexpr int kThreads = 128 * (kConsumerWGs + 1);
  static constexpr int kWgRows = kPingPong ? kBlockM : kBlockM / kConsumerWGs;  // rows per consumer
  static constexpr int kMSub = kWgRows / 64;    // m64 wgmma rows per consumer
  static constexpr int kAccRegs = kBlockN / 2;  // fp32 accumulators per m64 per thread
  static constexpr int kStageBytesA = kBlockM * kBlockK * 2;
  static constexpr int kStageBytesB = kBlockN * kBlockK * 2;
  static constexpr int kStageBytes = kStageBytesA + kStageBytesB;
  // A stage is released by every warp that read it: both consumers' (cooperative) or one's.
  static constexpr int kEmptyArrivals = (kPingPong ? 4 : 4 * kConsumerWGs) * kWriters;
  // One staging buffer per consumer: kWgRows x kBlockN as kBlockN / 64 boxes of kWgRows x 128 B.
  static constexpr int kCBufBytes = kTmaStore ? kWgRows * kBlockN * 2 : 0;
  // One bias slice per consumer (kBlockN fp32): the accumulators start from it (see the kernel).
  static constexpr int kBiasBufBytes = kBlockN * 4;
  // Ring, C staging, bias slices, then full[], empty[] and the two order mbarriers; +1024 for
  // aligning the dynamic base to 1024 bytes.
  static constexpr int kSmemBytes = kStages * kStageBytes +
                                    kConsumerWGs * (kCBufBytes + kBiasBufBytes) + 2 * kStages * 8 +
                                    2 * 8 + 1024;
  // setmaxnreg moves registers inside the CTA's launch allocation (168 x 384 = 64512 at the
  // __launch_bounds__(384, 1) cap): the producer frees 128 x (168 - 40) = 16384, exactly the
  // 256 x (232 - 168) the consumers take. ptxas still compiles the whole kernel under the entry cap
  // of 168 (a 2-CTA/SM variant, cap 80, fails with C7602 "insufficient registers" at the wgmma),
  // so the consumers' extra registers are headroom, not used by this code.
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static_assert(128 * (168 - kProducerRegs) >= 256 * (kConsumerRegs - 168), "register pool");

  static_assert(kWgRows % 64 == 0 && kMSub >= 1, "each consumer owns whole m64 slices");
  static_assert(kBlockM <= 256 && kBlockN <= 256, "TMA box dimensions are at most 256");
  static_assert(kBlockN == 64 || kBlockN == 128 || kBlockN == 192 || kBlockN == 256,
                "wgmma wrappers exist for n64, n128, n192, n256");
  static_assert(kMSub * kAccRegs <= 128, "accumulators must fit the consumer register budget");
  static_assert(kSmemBytes <= 227 * 1024, "sm_90 opt-in shared memory per block");
  static_assert(kCluster == 1 || kCluster == 2 || kCluster == 4, "clusters of 1, 2 or 2 x 2 CTAs");
  static_assert(kClusterM * kClusterN == kCluster && kClusterN <= 2 && kClusterM <= 2,
                "1 x 1, 2 x 1, 1 x 2, 2 x 2");
  static_assert(kClusterN == 1 || kBlockM % 16 == 0,
                "A splits into halves of whole 8-row swizzle atoms");
  // B's halves: k-major, kBlockN / 2 rows of whole 8-row swizzle atoms; n-major, the 64-wide
  // boxes alternate between the two CTAs (n192: two and one).
  static_assert(kClusterM == 1 || kBlockN % 128 == 0 || kBlockN == 192,
                "B splits into whole atoms and boxes");
};

// What launch() uses: the *Tma configs Tile128x256Tma, Tile128x128Tma, PingPong128x128Tma and
// PingPong64x128Tma, the pairs Tile128x256TmaC2 and PingPong64x128TmaC2, and the 2 x 2 clusters
// PingPong64x128TmaC4. The others are the candidates experiments/gemm_sm90_bench.cu compares them
// with (experiments/NOTES-gemm-sm90.md), kept so that a new GPU can be swept again.
// 128 x 256, 4 stages (193 KB): the brief's starting point, one wgmma m64n256 per k16 per consumer.
using Tile128x256 = TileConfig<128, 256, 4>;
// 128 x 128, 6 stages (193 KB): more CTAs for grids the 128 x 256 tile cannot fill.
using Tile128x128 = TileConfig<128, 128, 6>;
// Ping-pong tiles (candidates measured in experiments/gemm_sm90_bench.cu): 128 x 128 per consumer
// (6 stages of 32 KB), 64 x 256 (5 stages of 40 KB) and 64 x 128 (8 stages of 24 KB, for grids
// of few tiles: twice the CTAs of 128 x 128).
using PingPong128x128 = TileConfig<128, 128, 6, true>;
using PingPong64x256 = TileConfig<64, 256, 5, true>;
using PingPong64x128 = TileConfig<64, 128, 8, true>;
// The same with TMA stores (stages traded for the staging buffers).
using Tile128x256Tma = TileConfig<128, 256, 3, false, true>;
using Tile256x128Tma = TileConfig<256, 128, 3, false, true>;
using Tile128x128Tma = TileConfig<128, 128, 5, false, true>;
using PingPong128x128Tma = TileConfig<128, 128, 4, true, true>;
using PingPong64x256Tma = TileConfig<64, 256, 3, true, true>;  // (4 stages before the bias slices)
using PingPong64x128Tma = TileConfig<64, 128, 6, true, true>;
// The same in CTA pairs multicasting B (kCluster = 2). launch() takes Tile128x256TmaC2 and
// PingPong64x128TmaC2 where B's rows sit 16 bytes off a 32-byte sector (see launch()); the other
// two are harness candidates (experiments/gemm_sm90_bench.cu), not compiled into the extension.
using Tile128x256TmaC2 = TileConfig<128, 256, 3, false, true, 2>;
using Tile128x128TmaC2 = TileConfig<128, 128, 5, false, true, 2>;
using PingPong128x128TmaC2 = TileConfig<128, 128, 4, true, true, 2>;
using PingPong64x128TmaC2 = TileConfig<64, 128, 6, true, true, 2>;
// 2 x 2 clusters multicasting A and B, for few-tile grids whose time tracks the bytes each CTA
// pulls from L2 (NOTES-gemm-sm90.md, sessions 17 and 18); launch() takes it where every cluster
// is resident at once.
using PingPong64x128TmaC4 = TileConfig<64, 128, 6, true, true, 4>;
// The same three with 8 stages, the most that fit beside two staging buffers (226 KB of 227):
// harness candidates for few-tile grids, where cuBLAS's own 64 x 128 pairs keep 8 k-blocks in
// flight (nvjet_sm90_tst_64x128_64x8_2x1 at matmul 700x512x1000; experiments/NOTES-gemm-sm90.md).
using PingPong64x128TmaS8 = TileConfig<64, 128, 8, true, true>;
using PingPong64x128TmaC2S8 = TileConfig<64, 128, 8, true, true, 2>;
using PingPong64x128TmaC4S8 = TileConfig<64, 128, 8, true, true, 4>;
// Cooperative 128 x 64 tiles in pairs along n multicasting A, 8 stages of 24 KB: what cuBLASLt
// runs at linear_gelu 1000^3 (nvjet_sm90_tst_128x64_64x8_1x2, 12.7 us against our pairs' 13.4 on
// an H100); a harness candidate (experiments/NOTES-gemm-sm90.md).
using Tile128x64TmaPairN = TileConfig<128, 64, 8, false, true, 2, 2>;
using Tile128x64Tma = TileConfig<128, 64, 8, false, true>;  // the same tile without clusters
// 2 x 2 clusters of ping-pong 64 x 192 tiles, 5 stages of 32 KB: 1000 columns in 6 tiles, so
// linear_gelu 1000^3 needs 24 clusters (one wave of the 30 that fit on an H100 or H200) where 64 x
// 128 tiles need 32; a harness candidate (experiments/NOTES-gemm-sm90.md).
using PingPong64x192TmaC4 = TileConfig<64, 192, 5, true, true, 4>;
using PingPong64x192Tma = TileConfig<64, 192, 5, true, true>;  // the same tile without clusters
// 256 x 128, 4 stages: launch()'s gelu config before the TMA stores (0.66x / 0.89x cuBLASLt
// against 0.61x / 0.87x for 128 x 256 on the two linear_gelu benchmark shapes, H200); with TMA
// stores 128 x 256 or ping-pong 128 x 128 win on the H100.
using Tile256x128 = TileConfig<256, 128, 4>;

constexpr int kGroupM = 8;  // tile rows walked together (L2 reuse of B columns)

// Everything the kernel needs besides the two tensor maps.
struct KernelParams {
  const void* bias;  // (n,) or nullptr
  void* c;
  int64_t stride_cm, stride_c_batch;
  int m, n;
  int k_tiles;
  int tiles_m, tiles_n, num_tiles;
  int a_batched, b_batched;  // 0: the operand's tensor map is 2-D (batch 1 or batch stride 0)
  int c_vec;                 // C element pairs are 4-byte aligned
  int c_tma;                 // tmap_c is valid: C suits TMA (configs with kTmaStore only)
  int c_batched;             // tmap_c is 3-D
};

// ------------------------------------------------------------------ sm_90a device primitives
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace sm90 {

// smem_u32 and the mbarrier primitives live in common.cuh (the fp32 MLP kernel uses them too).
using namespace ::dualk::sm90;

// prefetch_tensor_map and tma_load_2d live in common.cuh (the fp32 MLP uses them too).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// The same loads multicast to the cluster's CTAs in `mask`: the box lands at `dst` in each, and
// completes its bytes on each one's mbarrier at `bar`.
__device__ __forceinline__ void tma_load_2d_mc(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                               uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::"
      "cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d_mc(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                               int c2, uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::"
      "cluster"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(mask)
      : "memory");
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Arrive on the mbarrier at `bar` in CTA `rank` of the cluster (this CTA's own included), with
// the default (.release.cta) semantics: the ".release.cluster" form measured ~1.5 us per k tile
// on an H100 (experiments/NOTES-gemm-sm90.md); this one is what CUTLASS's ClusterBarrier uses.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
}

// TMA store of one box from shared memory (bulk-group completion, no mbarrier).
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(c0), "r"(c1), "r"(src)
      : "memory");
}
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, uint32_t src, int c0, int c1,
                                             int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(c0), "r"(c1), "r"(c2), "r"(src)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// The committed stores have read their shared memory (the buffer may be rewritten).
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// The committed stores are complete.
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// Named barrier `id` over `threads` threads (a consumer warpgroup: id 1 + cw, 128).
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared_f32(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ float2 ld_shared_f32x2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}

// setmaxnreg_dec / inc, wgmma_fence / commit / wait and fence_acc live in common.cuh (the fused
// MLP uses them too).

// Shared-memory matrix descriptor with 128-byte swizzle; byte offsets as in the header comment.
__device__ __forceinline__ uint64_t make_desc(uint32_t smem_addr, uint32_t lbo_bytes,
                                              uint32_t sbo_bytes) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32) | (uint64_t{1} << 62);
}

// wgmma.mma_async m64nNk16, fp32 += A (smem, K-major) x B (smem, K-major or N-major when
// kTransB), scale-d = 1 (the caller zeroes the accumulators). d[i] of thread t (warp w = t / 32
// of the warpgroup, lane l): row 16 w + l / 4 + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (l % 4) + i
// % 2. One overload per (n, element type), stamped out by DUALK_DEFINE_WGMMA: the PTX type name is
// part of the instruction string, which a template parameter cannot supply. The last argument
// only selects the type. Operands: the accumulators, then desc_a, desc_b, scale-d, trans-b.
#define DUALK_DEFINE_WGMMA(ACC_COUNT, N, CTYPE, PTX_TYPE, REGS, ACCS, DESC_A, DESC_B, SCALE_D,     \
                           TRANS_B)                                                                \
  template <int kTransB>                                                                           \
  __device__ __forceinline__ void wgmma_m64k16(float (&d)[ACC_COUNT], uint64_t desc_a,             \
                                               uint64_t desc_b, CTYPE) {                           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE_D                                       \
                 ", 0;\n"                                                                          \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_TYPE "." PTX_TYPE " {" REGS \
                 "}, " DESC_A ", " DESC_B ", p, 1, 1, 0, " TRANS_B ";\n}\n"                        \
                 : ACCS                                                                            \
                 : "l"(desc_a), "l"(desc_b), "r"(1), "n"(kTransB));                                \
  }

DUALK_DEFINE_WGMMA(32, 64, __half, "f16", DUALK_ASM_REGS_0_31, DUALK_ASM_ACC_0_31, "%32", "%33",
                   "%34", "%35")
DUALK_DEFINE_WGMMA(32, 64, __nv_bfloat16, "bf16", DUALK_ASM_REGS_0_31, DUALK_ASM_ACC_0_31, "%32",
                   "%33", "%34", "%35")
DUALK_DEFINE_WGMMA(64, 128, __half, "f16", DUALK_ASM_REGS_0_63, DUALK_ASM_ACC_0_63, "%64", "%65",
                   "%66", "%67")
DUALK_DEFINE_WGMMA(64, 128, __nv_bfloat16, "bf16", DUALK_ASM_REGS_0_63, DUALK_ASM_ACC_0_63, "%64",
                   "%65", "%66", "%67")
DUALK_DEFINE_WGMMA(96, 192, __half, "f16", DUALK_ASM_REGS_0_95, DUALK_ASM_ACC_0_95, "%96", "%97",
                   "%98", "%99")
DUALK_DEFINE_WGMMA(96, 192, __nv_bfloat16, "bf16", DUALK_ASM_REGS_0_95, DUALK_ASM_ACC_0_95, "%96",
                   "%97", "%98", "%99")
DUALK_DEFINE_WGMMA(112, 224, __half, "f16", DUALK_ASM_REGS_0_111, DUALK_ASM_ACC_0_111, "%112",
                   "%113", "%114", "%115")
DUALK_DEFINE_WGMMA(112, 224, __nv_bfloat16, "bf16", DUALK_ASM_REGS_0_111, DUALK_ASM_ACC_0_111,
                   "%112", "%113", "%114", "%115")
DUALK_DEFINE_WGMMA(128, 256, __half, "f16", DUALK_ASM_REGS_0_127, DUALK_ASM_ACC_0_127, "%128",
                   "%129", "%130", "%131")
DUALK_DEFINE_WGMMA(128, 256, __nv_bfloat16, "bf16", DUALK_ASM_REGS_0_127, DUALK_ASM_ACC_0_127,
                   "%128", "%129", "%130", "%131")
#undef DUALK_DEFINE_WGMMA
}  // namespace sm90
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// ------------------------------------------------------------------ kernel

// The epilogue's math, shared by its two store paths: act(acc) in fp32 per element (the bias is
// already in the accumulators).
template <Activation kAct> __device__ __forceinline__ float2 epilogue_pair(float acc0, float acc1) {
  return make_float2(apply_activation_16bit<kAct>(acc0), apply_activation_16bit<kAct>(acc1));
}

// This CTA's tile of cluster tile `tile` in the flat (batch, tile_m, tile_n) order of cluster
// tiles (kGroupM rows of them column by column): tile row kClusterM i + rank_m, column
// kClusterN j + rank_n (past the last row or column: a tile of zeros, stored nowhere).
template <typename Cfg>
__device__ __forceinline__ void tile_coord(int tile, const KernelParams& p, int rank_m, int rank_n,
                                           int& batch, int& tile_m, int& tile_n) {
  const int per_batch = p.tiles_m * p.tiles_n;
  batch = tile / per_batch;
  const int t = tile - batch * per_batch;
  const int per_group = kGroupM * p.tiles_n;
  const int group = t / per_group;
  const int first_m = group * kGroupM;
  const int group_rows = min(p.tiles_m - first_m, kGroupM);
  const int in_group = t - group * per_group;
  tile_m = (first_m + in_group % group_rows) * Cfg::kClusterM + rank_m;
  tile_n = (in_group / group_rows) * Cfg::kClusterN + rank_n;
}

// Tensor maps (host-built, see make_operand_map): A (k, m[, batch]) box 64 x kBlockM / kClusterN
// (a CTA of a 2 x 2 cluster or of a pair along n loads half of A's rows); B k-major (k, n[,
// batch]) box 64 x kBlockN / kClusterM (a CTA of a pair along m loads half of B's rows); B n-major
// (n, k[, batch]) box 64 x 64, kBlockN / 64 per stage.
template <typename T, typename Cfg, bool kBKMajor, Activation kAct, bool kHasBias>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap tmap_a,
                     const __grid_constant__ CUtensorMap tmap_b,
                     const __grid_constant__ CUtensorMap tmap_c, const KernelParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace sm90;
  constexpr int kStages = Cfg::kStages;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem = (smem_u32(smem_raw) + 1023u) & ~1023u;  // swizzle atoms need 1024 B
  const uint32_t c_buf = smem + kStages * Cfg::kStageBytes;     // kConsumerWGs x kCBufBytes
  const uint32_t bias_buf =
      c_buf + Cfg::kConsumerWGs * Cfg::kCBufBytes;  // kConsumerWGs x kBiasBufBytes
  const uint32_t full_bar = bias_buf + Cfg::kConsumerWGs * Cfg::kBiasBufBytes;
  const uint32_t empty_bar = full_bar + kStages * 8;
  // Ping-pong only: order_bar + 8 c is where consumer c waits for its turn at the main loop.
  const uint32_t order_bar = empty_bar + kStages * 8;

  const int wg = threadIdx.x / 128;
  const int tid_wg = threadIdx.x % 128;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_bar + 8 * s, 1);
      mbar_init(empty_bar + 8 * s, Cfg::kEmptyArrivals);  // lane 0 of every reading warp
    }
    mbar_init(order_bar, 1);
    mbar_init(order_bar + 8, 1);
    fence_barrier_init();
  }
  // Pairs: the peer's multicast and arrivals may target this CTA's barriers once it passes here.
  if constexpr (Cfg::kCluster > 1)
    cluster_sync();
  else
    __syncthreads();
  // Clusters walk cluster tiles: p.tiles_m (p.tiles_n) counts them along m (n), and CTA rank r
  // takes tile row kClusterM i + rank_m and tile column kClusterN j + rank_n (pairs along m:
  // (2 i + r, j); along n: (i, 2 j + r)).
  const int rank = Cfg::kCluster > 1 ? static_cast<int>(cluster_rank()) : 0;
  const int rank_m = Cfg::kClusterM == Cfg::kCluster ? rank : rank % Cfg::kClusterM;
  const int rank_n = Cfg::kClusterN == 1 ? 0 : rank / Cfg::kClusterM;
  const int first_tile = blockIdx.x / Cfg::kCluster, tile_stride = gridDim.x / Cfg::kCluster;

  if (wg == 0) {
    // ---------------- producer
    setmaxnreg_dec<Cfg::kProducerRegs>();
    if (tid_wg != 0) return;
    prefetch_tensor_map(&tmap_a);
    prefetch_tensor_map(&tmap_b);
    int stage = 0;
    uint32_t phase = 0;
    for (int tile = first_tile; tile < p.num_tiles; tile += tile_stride) {
      int batch, tile_m, tile_n;
      tile_coord<Cfg>(tile, p, rank_m, rank_n, batch, tile_m, tile_n);
      const int m0 = tile_m * Cfg::kBlockM;
      const int n0 = tile_n * Cfg::kBlockN;
      for (int kt = 0; kt < p.k_tiles; ++kt) {
        // Wait until the consumers released this stage's previous contents (round r - 1).
        mbar_wait(empty_bar + 8 * stage, phase ^ 1);
        const uint32_t bar = full_bar + 8 * stage;
        mbar_arrive_expect_tx(bar, Cfg::kStageBytes);  // whole boxes count, zero-filled parts too
        const uint32_t sa = smem + stage * Cfg::kStageBytes;
        const uint32_t sb = sa + Cfg::kStageBytesA;
        const int k0 = kt * Cfg::kBlockK;
        if constexpr (Cfg::kClusterN > 1) {
          // This CTA's half of A's rows (the map's box), into both CTAs of its tile row.
          const int half = rank_n * (Cfg::kBlockM / 2);
          const uint16_t row_mates =
              static_cast<uint16_t>((1u << rank) | (1u << (rank ^ Cfg::kClusterM)));
          if (p.a_batched)
            tma_load_3d_mc(sa + half * 128, &tmap_a, k0, m0 + half, batch, bar, row_mates);
          else
            tma_load_2d_mc(sa + half * 128, &tmap_a, k0, m0 + half, bar, row_mates);
        } else {
          if (p.a_batched)
            tma_load_3d(sa, &tmap_a, k0, m0, batch, bar);
          else
            tma_load_2d(sa, &tmap_a, k0, m0, bar);
        }
        if constexpr (Cfg::kClusterM > 1) {
          // This CTA's half of B, into both CTAs of its tile column (k-major: rows
          // [rank_m, rank_m + 1) x kBlockN / 2 of the tile, the map's box; n-major: boxes
          // rank_m, rank_m + 2, ...).
          const uint16_t kBoth =
              Cfg::kCluster == 2 ? 0x3 : static_cast<uint16_t>((1u << rank) | (1u << (rank ^ 1)));
          if constexpr (kBKMajor) {
            const int half = rank_m * (Cfg::kBlockN / 2);
            if (p.b_batched)
              tma_load_3d_mc(sb + half * 128, &tmap_b, k0, n0 + half, batch, bar, kBoth);
            else
              tma_load_2d_mc(sb + half * 128, &tmap_b, k0, n0 + half, bar, kBoth);
          } else {
#pragma unroll
            for (int nb = rank_m; nb < Cfg::kBlockN / 64; nb += 2) {
              if (p.b_batched)
                tma_load_3d_mc(sb + nb * 8192, &tmap_b, n0 + nb * 64, k0, batch, bar, kBoth);
              else
                tma_load_2d_mc(sb + nb * 8192, &tmap_b, n0 + nb * 64, k0, bar, kBoth);
            }
          }
        } else if constexpr (kBKMajor) {
          if (p.b_batched)
            tma_load_3d(sb, &tmap_b, k0, n0, batch, bar);
          else
            tma_load_2d(sb, &tmap_b, k0, n0, bar);
        } else {
#pragma unroll
          for (int nb = 0; nb < Cfg::kBlockN / 64; ++nb) {
            if (p.b_batched)
              tma_load_3d(sb + nb * 8192, &tmap_b, n0 + nb * 64, k0, batch, bar);
            else
              tma_load_2d(sb + nb * 8192, &tmap_b, n0 + nb * 64, k0, bar);
          }
        }
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
    if constexpr (Cfg::kCluster > 1) {
      // Stay until every stage's last round was released by the consumers of every CTA that
      // loads into it: the peers' arrivals on this CTA's empty barriers must land before it exits.
      for (int i = 0; i < kStages; ++i) {
        mbar_wait(empty_bar + 8 * stage, phase ^ 1);
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
  } else {
    // ---------------- consumers
    setmaxnreg_inc<Cfg::kConsumerRegs>();
    // Consumer warpgroup cw: cooperative, tile rows [cw * kWgRows, (cw + 1) * kWgRows) of every
    // tile; ping-pong, every row of the CTA's tiles number cw, cw + 2, cw + 4, ...
    const int cw = wg - 1;
    const int row0 = Cfg::kPingPong ? 0 : cw * Cfg::kWgRows;
    const int warp = tid_wg / 32;
    const int lane = tid_wg % 32;
    const T* __restrict__ bias = static_cast<const T*>(p.bias);
    // A stage this warp has read may be refilled: tell every CTA whose producer writes it (pairs:
    // both CTAs).
    // 2 x 2 clusters: this CTA, its column mate (rank ^ 1, B) and its row mate (rank ^ 2, A).
    auto release_stage = [rank](uint32_t bar) {
      if constexpr (Cfg::kCluster == 4) {
        mbar_arrive_cluster(bar, rank);
        mbar_arrive_cluster(bar, rank ^ 1);
        mbar_arrive_cluster(bar, rank ^ 2);
      } else if constexpr (Cfg::kCluster > 1) {
        mbar_arrive_cluster(bar, 0);
        mbar_arrive_cluster(bar, 1);
      } else {
        mbar_arrive(bar);
      }
    };
    T* __restrict__ c = static_cast<T*>(p.c);

    // Descriptors of stage 0, k16 step 0; stage s and step j add (s * kStageBytes + offset) >> 4
    // to the start-address field (addresses stay below 256 KB, so the 14-bit field never carries).
    const uint64_t desc_a0 = make_desc(smem + row0 * 128, 16, 1024);
    const uint64_t desc_b0 = kBKMajor ? make_desc(smem + Cfg::kStageBytesA, 16, 1024)
                                      : make_desc(smem + Cfg::kStageBytesA, 8192, 1024);
    constexpr uint32_t kStepB = kBKMajor ? 32 : 2048;  // bytes per k16 step inside a stage

    int stage = 0;
    uint32_t phase = 0;
    float acc[Cfg::kMSub][Cfg::kAccRegs];
    constexpr int kTileStep = Cfg::kPingPong ? 2 : 1;
    // The bias: the accumulators start from it, so the epilogue (which a cooperative tile pays
    // with idle tensor cores) has no bias loads or adds; columns past n start from 0. Each
    // thread loads column tid_wg + 128 i of the next tile for every i with that column inside the
    // tile (n64: threads 0-63 one each; n192: threads 0-63 two, the rest one) during this tile's
    // main loop (its latency hidden there) and stages them in this consumer's slice at the next
    // tile's start.
    const uint32_t my_bias = bias_buf + cw * Cfg::kBiasBufBytes;
    constexpr int kBiasCols = (Cfg::kBlockN + 127) / 128;
    auto in_tile = [tid_wg](int i) {
      return Cfg::kBlockN % 128 == 0 || tid_wg + 128 * i < Cfg::kBlockN;
    };
    float bias_next[kBiasCols];
    auto load_bias = [&](int64_t tile_of) {
      int b_ = 0, tm_ = 0, tn_ = 0;
      if (tile_of < p.num_tiles)
        tile_coord<Cfg>(static_cast<int>(tile_of), p, rank_m, rank_n, b_, tm_, tn_);
#pragma unroll
      for (int i = 0; i < kBiasCols; ++i) {
        const int col = tn_ * Cfg::kBlockN + tid_wg + 128 * i;
        bias_next[i] =
            tile_of < p.num_tiles && in_tile(i) && col < p.n ? to_float<T>(bias[col]) : 0.f;
      }
    };
    if constexpr (kHasBias)
      load_bias(first_tile + static_cast<int64_t>(Cfg::kPingPong ? cw : 0) * tile_stride);
    for (int local = Cfg::kPingPong ? cw : 0;; local += kTileStep) {
      const int64_t tile64 = first_tile + static_cast<int64_t>(local) * tile_stride;
      if (tile64 >= p.num_tiles) break;
      const int tile = static_cast<int>(tile64);
      int batch, tile_m, tile_n;
      tile_coord<Cfg>(tile, p, rank_m, rank_n, batch, tile_m, tile_n);
      // The accumulators' start (before a ping-pong consumer waits for its turn: no wgmma here).
      if constexpr (kHasBias) {
        named_barrier(1 + cw, 128);  // every thread has read the previous tile's slice
#pragma unroll
        for (int i = 0; i < kBiasCols; ++i)
          if (in_tile(i)) st_shared_f32(my_bias + 4 * (tid_wg + 128 * i), bias_next[i]);
        named_barrier(1 + cw, 128);
        // Thread (warp, lane)'s accumulator columns: 8 j + 2 (lane % 4) + {0, 1} (epilogue below).
#pragma unroll
        for (int j = 0; j < Cfg::kBlockN / 8; ++j) {
          const float2 b = ld_shared_f32x2(my_bias + 4 * (8 * j + 2 * (lane % 4)));
#pragma unroll
          for (int ms = 0; ms < Cfg::kMSub; ++ms)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              acc[ms][4 * j + 2 * h] = b.x;
              acc[ms][4 * j + 2 * h + 1] = b.y;
            }
        }
        load_bias(tile64 + static_cast<int64_t>(kTileStep) * tile_stride);
      } else {
#pragma unroll
        for (int ms = 0; ms < Cfg::kMSub; ++ms)
#pragma unroll
          for (int i = 0; i < Cfg::kAccRegs; ++i) acc[ms][i] = 0.f;
      }
      if constexpr (Cfg::kPingPong) {
        // This consumer skipped the other's tiles: its ring position is local * k_tiles. Waiting
        // for the other consumer's main loop to finish (local >= 1) also keeps the full[] waits
        // below from seeing a stage's earlier round: that round belonged to a tile whose loads
        // the other consumer has already waited for.
        const int64_t pos = static_cast<int64_t>(local) * p.k_tiles;
        stage = static_cast<int>(pos % kStages);
        phase = static_cast<uint32_t>((pos / kStages) & 1);
        if (local >= 1)
          mbar_wait(order_bar + 8 * cw, static_cast<uint32_t>(((local - 1) >> 1) & 1));
      }

      int prev_stage = 0;
      for (int kt = 0; kt < p.k_tiles; ++kt) {
        mbar_wait(full_bar + 8 * stage, phase);
        const uint64_t stage_off = static_cast<uint64_t>((stage * Cfg::kStageBytes) >> 4);
#pragma unroll
        for (int ms = 0; ms < Cfg::kMSub; ++ms) fence_acc(acc[ms]);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < Cfg::kBlockK / 16; ++ks) {
          const uint64_t db = desc_b0 + stage_off + ((ks * kStepB) >> 4);
#pragma unroll
          for (int ms = 0; ms < Cfg::kMSub; ++ms) {
            const uint64_t da = desc_a0 + stage_off + ((ms * 64 * 128 + ks * 32) >> 4);
            wgmma_m64k16<kBKMajor ? 0 : 1>(acc[ms], da, db, T{});
          }
        }
        wgmma_commit();
#pragma unroll
        for (int ms = 0; ms < Cfg::kMSub; ++ms) fence_acc(acc[ms]);
        if (kt > 0) {
          // The group of k tile kt-1 has retired: its stage can be refilled.
          wgmma_wait<1>();
          if (lane == 0) release_stage(empty_bar + 8 * prev_stage);
        }
        prev_stage = stage;
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
      // Ping-pong: every wgmma of this tile is issued; the other consumer's main loop may start.
      if (Cfg::kPingPong && tid_wg == 0) mbar_arrive(order_bar + 8 * (1 - cw));
      wgmma_wait<0>();
#pragma unroll
      for (int ms = 0; ms < Cfg::kMSub; ++ms) fence_acc(acc[ms]);
      if (p.k_tiles > 0 && lane == 0) release_stage(empty_bar + 8 * prev_stage);

      // Epilogue from registers. Thread (warp w, lane l) holds, per m64 slice ms and n8 column
      // block j, rows 16 w + l / 4 (+ 8) and columns 8 j + 2 (l % 4) (+ 1): acc[ms][4 j + 2 h + e].
      const int m_left = p.m - tile_m * Cfg::kBlockM;
      const int n_left = p.n - tile_n * Cfg::kBlockN;
      T* c_tile = c + batch * p.stride_c_batch +
                  static_cast<int64_t>(tile_m) * Cfg::kBlockM * p.stride_cm +
                  static_cast<int64_t>(tile_n) * Cfg::kBlockN;
      const int row_base = row0 + warp * 16 + lane / 4;
      const int col_base = 2 * (lane % 4);
      if constexpr (Cfg::kTmaStore) {
        if (p.c_tma) {
          // Thread (warp, lane)'s pair (row r, columns 8 j + 2 (lane % 4) + {0, 1}) goes to box
          // j / 8, 16-byte chunk (j % 8) ^ (r % 8) of row r (the 128-byte swizzle TMA undoes).
          const uint32_t my_buf = c_buf + cw * Cfg::kCBufBytes;
          if (tid_wg == 0) bulk_wait_read();  // this consumer's previous tile has left the buffer
          named_barrier(1 + cw, 128);
#pragma unroll
          for (int j = 0; j < Cfg::kBlockN / 8; ++j) {
#pragma unroll
            for (int ms = 0; ms < Cfg::kMSub; ++ms) {
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const int r = warp * 16 + lane / 4 + ms * 64 + h * 8;  // row within my rows
                const float2 v =
                    epilogue_pair<kAct>(acc[ms][4 * j + 2 * h], acc[ms][4 * j + 2 * h + 1]);
                const uint32_t addr = my_buf + (j / 8) * (Cfg::kWgRows * 128) + r * 128 +
                                      (((j % 8) ^ (r % 8)) * 16) + 4 * (lane % 4);
                st_shared_u32(addr, pack2<T>(v.x, v.y));
              }
            }
          }
          fence_proxy_async();
          named_barrier(1 + cw, 128);
          if (tid_wg == 0 && row0 < m_left) {  // (a cooperative tile's second half may lie below C)
            const int m0 = tile_m * Cfg::kBlockM + row0;
#pragma unroll
            for (int b = 0; b < Cfg::kBlockN / 64; ++b) {
              if (b * 64 >= n_left) break;  // boxes wholly right of C: nothing to store
              const int n0 = tile_n * Cfg::kBlockN + b * 64;
              const uint32_t src = my_buf + b * (Cfg::kWgRows * 128);
              if (p.c_batched)
                tma_store_3d(&tmap_c, src, n0, m0, batch);
              else
                tma_store_2d(&tmap_c, src, n0, m0);
            }
            bulk_commit();
          }
          continue;
        }
      }
      // Interior tiles (all but the right/bottom edge) skip every per-element check.
      const bool full = m_left >= Cfg::kBlockM && n_left >= Cfg::kBlockN && p.c_vec;
#pragma unroll
      for (int j = 0; j < Cfg::kBlockN / 8; ++j) {
        const int col = col_base + 8 * j;
        if (!full && col >= n_left) continue;
        const bool pair = full || col + 1 < n_left;
#pragma unroll
        for (int ms = 0; ms < Cfg::kMSub; ++ms) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = row_base + ms * 64 + h * 8;
            if (!full && row >= m_left) continue;
            const float2 v =
                epilogue_pair<kAct>(acc[ms][4 * j + 2 * h], acc[ms][4 * j + 2 * h + 1]);
            const float v0 = v.x, v1 = v.y;
            T* dst = c_tile + row * p.stride_cm + col;
            if (full || (p.c_vec && pair)) {
              *reinterpret_cast<uint32_t*>(dst) = pack2<T>(v0, v1);
            } else {
              dst[0] = from_float<T>(v0);
              if (pair) dst[1] = from_float<T>(v1);
            }
          }
        }
      }
    }
    // The last tile's stores must finish reading shared memory before the CTA exits.
    if (Cfg::kTmaStore && p.c_tma && tid_wg == 0) bulk_wait_all();
  }
#elif defined(__CUDA_ARCH__)
  // Built for a target without wgmma (sm_80, or plain sm_90 without the "a"): can_run() keeps
  // launches off such builds on every device but 9.0; should an sm_90 image ever run here, fail
  // loudly rather than leave C unwritten.
  __trap();
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// ------------------------------------------------------------------ host side
namespace detail {

// cuTensorMapEncodeTiled: encode_tiled_fn() in common.cuh (the fp32 MLP encodes maps too).

// device_is_sm90() (common.cuh): wgmma and setmaxnreg need compute capability 9.0 exactly.

constexpr int64_t kMaxInt = 0x7fffffff;
constexpr int64_t kMaxStrideBytes = int64_t{1} << 40;

// A stride TMA can use for a dimension of `size` indices: a dimension of one index is never
// stepped, so its (arbitrary, PyTorch-given) stride is not checked.
inline bool tma_stride_ok(int64_t size, int64_t stride_elems) {
  if (size <= 1) return true;
  return stride_elems > 0 && (stride_elems * 2) % 16 == 0 && stride_elems * 2 < kMaxStrideBytes;
}

// 2-D (inner, outer) or, when `batched`, 3-D (inner, outer, batch) map over a 16-bit tensor with
// unit stride along `inner`; box 64 (inner) x box_outer, 128-byte swizzle, zero fill outside.
// Operands (A, B) are read with L2 promotion; C's map (TMA stores from the epilogue's staging
// layout, clipped at C's edges) passes CU_TENSOR_MAP_L2_PROMOTION_NONE.
inline bool make_operand_map(
    CUtensorMap* map, DType dtype, const void* base, int64_t inner, int64_t outer,
    int64_t stride_outer, bool batched, int64_t batch, int64_t stride_batch, uint32_t box_outer,
    CUtensorMapL2promotion promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B) {
  const EncodeTiledFn encode = encode_tiled_fn();
  if (encode == nullptr) return false;
  const int64_t row_bytes = (inner * 2 + 15) / 16 * 16;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer),
                              static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(outer > 1 ? stride_outer * 2 : row_bytes),
                                 static_cast<cuuint64_t>(stride_batch * 2)};
  const cuuint32_t box[3] = {64, box_outer, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(map,
                            dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                      : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                            batched ? 3 : 2, const_cast<void*>(base), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

// How many clusters of this config fit on the device at once (cached per process after the first
// ask); 0 where its shared memory cannot be granted or the query fails.
template <typename T, typename Cfg, bool kBKMajor, Activation kAct, bool kHasBias>
int resident_clusters() {
  static_assert(Cfg::kCluster > 1, "single CTAs need no cluster query");
  const void* kernel =
      reinterpret_cast<const void*>(gemm_sm90_kernel<T, Cfg, kBKMajor, kAct, kHasBias>);
  if (ensure_dynamic_smem(kernel, Cfg::kSmemBytes) != cudaSuccess) return 0;
  return max_active_clusters(kernel, Cfg::kThreads, Cfg::kSmemBytes, Cfg::kCluster);
}

// One config, one B layout: encodes the maps and launches a persistent grid (<= one CTA per SM).
// The bench calls this directly to compare tile configs; launch() picks the config.
template <typename T, typename Cfg, bool kBKMajor, Activation kAct, bool kHasBias>
cudaError_t launch_config(const GemmArgs& args, cudaStream_t stream) {
  auto kernel = gemm_sm90_kernel<T, Cfg, kBKMajor, kAct, kHasBias>;
  // Clusters: as many as fit at once (resident_clusters grants the shared memory too). None, or
  // a failed grant or query: cudaErrorInvalidConfiguration before any map is encoded, and
  // launch() runs the single config, which reports a failed grant itself.
  int max_clusters = 0;
  if constexpr (Cfg::kCluster > 1) {
    max_clusters = resident_clusters<T, Cfg, kBKMajor, kAct, kHasBias>();
    if (max_clusters < 1) return cudaErrorInvalidConfiguration;
  } else {
    const cudaError_t err =
        ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes);
    if (err != cudaSuccess) return err;
  }
  const bool a_batched = args.batch > 1 && args.stride_a_batch != 0;
  const bool b_batched = args.batch > 1 && args.stride_b_batch != 0;
  CUtensorMap map_a, map_b;
  if (!make_operand_map(&map_a, args.dtype, args.a, args.k, args.m, args.stride_am, a_batched,
                        args.batch, args.stride_a_batch, Cfg::kBlockM / Cfg::kClusterN))
    return cudaErrorInvalidValue;
  const bool b_ok =
      kBKMajor ? make_operand_map(&map_b, args.dtype, args.b, args.k, args.n, args.stride_b_outer,
                                  b_batched, args.batch, args.stride_b_batch,
                                  Cfg::kBlockN / Cfg::kClusterM)
               : make_operand_map(&map_b, args.dtype, args.b, args.n, args.k, args.stride_b_outer,
                                  b_batched, args.batch, args.stride_b_batch, 64);
  if (!b_ok) return cudaErrorInvalidValue;

  // C by TMA (configs with kTmaStore): 16-byte aligned base and row / batch strides, as for A
  // and B; else the kernel's direct stores (tmap_c unused).
  CUtensorMap map_c{};
  const bool c_batched = args.batch > 1;
  bool c_tma = false;
  if constexpr (Cfg::kTmaStore) {
    c_tma = is_aligned16(args.c) && tma_stride_ok(args.m, args.stride_cm) &&
            (!c_batched || tma_stride_ok(args.batch, args.stride_c_batch)) &&
            make_operand_map(&map_c, args.dtype, args.c, args.n, args.m, args.stride_cm, c_batched,
                             args.batch, args.stride_c_batch, Cfg::kWgRows,
                             CU_TENSOR_MAP_L2_PROMOTION_NONE);
  }

  KernelParams p;
  p.c_tma = c_tma;
  p.c_batched = c_batched;
  p.bias = args.bias;
  p.c = args.c;
  p.stride_cm = args.stride_cm;
  p.stride_c_batch = args.stride_c_batch;
  p.m = static_cast<int>(args.m);
  p.n = static_cast<int>(args.n);
  p.k_tiles = static_cast<int>(ceil_div(args.k, Cfg::kBlockK));
  // Clusters: tiles counted in cluster tiles (an odd last row's or column's second CTA computes
  // zeros and stores nothing).
  p.tiles_m = static_cast<int>(ceil_div(ceil_div(args.m, Cfg::kBlockM), Cfg::kClusterM));
  p.tiles_n = static_cast<int>(ceil_div(ceil_div(args.n, Cfg::kBlockN), Cfg::kClusterN));
  const int64_t num_tiles = args.batch * p.tiles_m * p.tiles_n;
  if (num_tiles > kMaxInt) return cudaErrorInvalidValue;
  p.num_tiles = static_cast<int>(num_tiles);
  p.a_batched = a_batched;
  p.b_batched = b_batched;
  p.c_vec = ((reinterpret_cast<uintptr_t>(args.c) & 3) | (args.m > 1 ? args.stride_cm & 1 : 0) |
             (args.batch > 1 ? (args.stride_c_batch & 1) : 0)) == 0;

  if constexpr (Cfg::kCluster == 1) {
    const int grid = static_cast<int>(std::min<int64_t>(num_tiles, device_props().num_sms));
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(map_a, map_b, map_c, p);
    return cudaGetLastError();
  } else {
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
    return cudaLaunchKernelEx(&config, kernel, map_a, map_b, map_c, p);
  }
}

}  // namespace detail

// True when this path can serve `args` on the current device: compute capability 9.0, fp16/bf16,
// non-empty sizes below 2^31 (k == 0 is the caller's), and what TMA needs of A and B: 16-byte
// aligned base pointers, positive strides that are multiples of 16 bytes (below 2^40 bytes) on
// every dimension with more than one index; batch stride 0 (broadcast) is allowed. C and bias
// have no alignment requirement (plain stores and loads).
inline bool can_run(const GemmArgs& args) {
  if (args.dtype != DType::kFloat16 && args.dtype != DType::kBFloat16) return false;
  if (args.batch < 1 || args.m < 1 || args.n < 1 || args.k < 1) return false;
  if (args.m > detail::kMaxInt || args.n > detail::kMaxInt || args.k > detail::kMaxInt ||
      args.batch > detail::kMaxInt)
    return false;
  if (args.a == nullptr || args.b == nullptr || args.c == nullptr) return false;
  if ((reinterpret_cast<uintptr_t>(args.a) | reinterpret_cast<uintptr_t>(args.b)) % 16 != 0)
    return false;
  if (!detail::tma_stride_ok(args.m, args.stride_am)) return false;
  if (!detail::tma_stride_ok(args.b_k_major ? args.n : args.k, args.stride_b_outer)) return false;
  if (args.stride_a_batch != 0 && !detail::tma_stride_ok(args.batch, args.stride_a_batch))
    return false;
  if (args.stride_b_batch != 0 && !detail::tma_stride_ok(args.batch, args.stride_b_batch))
    return false;
  if (args.stride_a_batch < 0 || args.stride_b_batch < 0) return false;
  // Tile counts (of the smallest tile launch() may pick) must fit the kernel's int tile index.
  if (args.batch * ceil_div(args.m, 64) * ceil_div(args.n, 128) > detail::kMaxInt) return false;
  if (!device_is_sm90()) return false;
  return encode_tiled_fn() != nullptr;
}

// The config heuristic, from the H100 sweep of experiments/gemm_sm90_bench.cu
// (experiments/NOTES-gemm-sm90.md). Every production config stores C by TMA (2-12% faster on
// large shapes and 1.5x on short k than the direct stores, which remain its fallback for C that
// TMA cannot address). t256 / t128 count 128 x 256 / 128 x 128 tiles:
//   * 128 x 256 (cooperative) when its tiles fill at least 3/4 of the SMs in a wave; with an
//     activation epilogue and k <= 1024 the ping-pong 128 x 128 instead, whose epilogue (gelu's
//     tanh on every element) runs under the other consumer's main loop
//     (linear_gelu 8192 x 768 -> 3072: 73.6 vs 85.2 us; at k = 4096 128 x 256 wins, 762 vs 790 us);
//   * else, without an activation and when 128 x 128 tiles would leave at least half the SMs
//     idle, ping-pong 64 x 128 (twice the CTAs: 1024^3 9.9 vs 11.8 us). Here every CTA gets one
//     tile, so the second consumer idles: the gain is the CTA count, not the overlap (a
//     one-consumer 64 x 128 config with more stages is untried);
//   * else 128 x 128 (cooperative).
// CTA pairs: where B's row pitch is an odd multiple of 16 bytes, every other row
// starts 16 bytes off a 32-byte sector and TMA splits its box rows into many small L2 requests
// (ncu at m3000 n5000 k2000: 12.2 M requests instead of 4.6 M, experiments/NOTES-gemm-sm90.md).
// Pairs multicasting B read it from L2 half as often: the 128 x 256 branch then runs
// Tile128x256TmaC2 (m3000 n5000 k2000 on an H200: 99.6 vs 124.2 us, cuBLAS 93.0) and the
// few-tile branch PingPong64x128TmaC2, with an activation too (linear_gelu 1000^3: 13.2 vs
// 15.2 us). On aligned rows pairs gained nothing (4096^3 178.5 vs 177.7 us; 1024^3 10.3 vs 9.5),
// so they are taken only there, and only with two tile rows or more (else one CTA of each pair
// would only compute zeros). If the device cannot run clusters, the single configs run.
// 2 x 2 clusters: in the same few-tile case, with two tile columns or more too,
// PingPong64x128TmaC4 multicasts A as well, where all its clusters are resident at once
// (linear_gelu 896 x 1000 -> 1024, 28 clusters on an H100: 12.0 us, pairs 13.2, cuBLASLt 12.5).
// A GPC holds whole clusters, so only 30 of them fit on an H100's 132 SMs; a second wave for the
// last few costs more than the multicast saves (1000^3 needs 32: 15.8 us against pairs' 13.5).
enum class TileChoice {
  k128x256,             // Tile128x256Tma
  k128x256Pair,         // Tile128x256TmaC2, else Tile128x256Tma
  kPingPong128x128,     // PingPong128x128Tma
  kPingPong64x128,      // PingPong64x128Tma
  kPingPong64x128Pair,  // PingPong64x128TmaC2, else the few-tile single config below
  kPingPong64x128Quad,  // PingPong64x128TmaC4, else as kPingPong64x128Pair
  k128x128,             // Tile128x128Tma
};

// Host arithmetic only (tests/test_cuda_host_logic.py runs it on the CPU). resident_quads() is
// how many 2 x 2 clusters of PingPong64x128TmaC4 fit at once (an occupancy query, asked only
// where the answer matters; < 1 where clusters cannot run).
template <typename ResidentQuads>
TileChoice choose_tiles(const GemmArgs& args, bool has_activation, int64_t num_sms,
                        ResidentQuads resident_quads) {
  const int64_t t256 = args.batch * ceil_div(args.m, 128) * ceil_div(args.n, 256);
  const int64_t t128 = args.batch * ceil_div(args.m, 128) * ceil_div(args.n, 128);
  const bool b_rows_off_sector =
      args.stride_b_outer % 16 != 0;  // can_run: a multiple of 8 elements
  if (args.n > 128 && 4 * t256 >= 3 * num_sms) {
    if (has_activation && args.k <= 1024) return TileChoice::kPingPong128x128;
    if (b_rows_off_sector && args.m > 128) return TileChoice::k128x256Pair;
    return TileChoice::k128x256;
  }
  if (2 * t128 <= num_sms) {
    if (b_rows_off_sector && args.m > 64) {
      const int64_t quads =
          args.batch * ceil_div(ceil_div(args.m, 64), 2) * ceil_div(ceil_div(args.n, 128), 2);
      if (args.n > 128 && quads <= static_cast<int64_t>(resident_quads()))
        return TileChoice::kPingPong64x128Quad;
      return TileChoice::kPingPong64x128Pair;
    }
    if (!has_activation) return TileChoice::kPingPong64x128;
  }
  return TileChoice::k128x128;
}

// Returns cudaErrorInvalidValue for arguments can_run() rejects.
template <typename T, Activation kAct, bool kHasBias>
cudaError_t launch(const GemmArgs& args, cudaStream_t stream) {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "16-bit types only");
  if (!can_run(args)) return cudaErrorInvalidValue;
  if (args.dtype != (std::is_same_v<T, __half> ? DType::kFloat16 : DType::kBFloat16))
    return cudaErrorInvalidValue;
  // A config is passed as a value of its (empty) type: run(Tile128x128Tma{}).
  auto run = [&](auto config) {
    using Cfg = decltype(config);
    return args.b_k_major ? detail::launch_config<T, Cfg, true, kAct, kHasBias>(args, stream)
                          : detail::launch_config<T, Cfg, false, kAct, kHasBias>(args, stream);
  };
  // Clusters first; cudaErrorInvalidConfiguration: no cluster fits, or the query failed.
  auto run_cluster_or = [&](auto cluster, auto fallback) {
    const cudaError_t err = run(cluster);
    if (err != cudaErrorInvalidConfiguration) return err;
    cudaGetLastError();
    return fallback();
  };
  auto resident_quads = [&] {
    return args.b_k_major
               ? detail::resident_clusters<T, PingPong64x128TmaC4, true, kAct, kHasBias>()
               : detail::resident_clusters<T, PingPong64x128TmaC4, false, kAct, kHasBias>();
  };
  // The few-tile branch's single-CTA config where clusters cannot run: ping-pong 64 x 128, or
  // with an activation cooperative 128 x 128 (as choose_tiles picks on aligned rows).
  auto few_tile_single = [&] {
    if constexpr (kAct == Activation::kNone)
      return run(PingPong64x128Tma{});
    else
      return run(Tile128x128Tma{});
  };
  auto pair = [&] { return run_cluster_or(PingPong64x128TmaC2{}, few_tile_single); };
  switch (choose_tiles(args, kAct != Activation::kNone, device_props().num_sms, resident_quads)) {
    case TileChoice::k128x256:
      return run(Tile128x256Tma{});
    case TileChoice::k128x256Pair:
      return run_cluster_or(Tile128x256TmaC2{}, [&] { return run(Tile128x256Tma{}); });
    // (choose_tiles gives these two only with / without an activation: one kernel fewer to build)
    case TileChoice::kPingPong128x128:
      if constexpr (kAct != Activation::kNone) return run(PingPong128x128Tma{});
      break;
    case TileChoice::kPingPong64x128:
      if constexpr (kAct == Activation::kNone) return run(PingPong64x128Tma{});
      break;
    case TileChoice::kPingPong64x128Pair:
      return pair();
    case TileChoice::kPingPong64x128Quad:
      return run_cluster_or(PingPong64x128TmaC4{}, pair);
    case TileChoice::k128x128:
      break;
  }
  return run(Tile128x128Tma{});
}

}  // namespace gemm_sm90
}  // namespace dualk
