// Which GEMM kernel runs: the family's host-side entry points for matmul.cu and linear_gelu.cu.
//   run_gemm_best: split-K (below) for few tiles and a long k when the caller gave a workspace,
//     else the Hopper kernel (gemm_sm90.cuh) where it can run, else run_gemm;
//   run_gemm: validates the arguments, then per dtype select_gemm_kernel picks the tensor-core
//     tile (gemm_mma.cuh: TcLarge, TcSmall) or the SIMT path, and launch_simt picks
//     gemm_simt_skinny_kernel (gemm_simt_skinny.cuh, fp32 with few rows), gemm_simt_wide_kernel
//     (gemm_simt_wide.cuh) or the gemm_simt_kernel fallback (gemm_simt.cuh).
// Instantiation: each .cu file calls run_gemm_best<kAct, kHasBias> with its own activation and
// bias flags, so no kernel is compiled in two files.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "gemm_common.cuh"
#include "gemm_mma.cuh"
#include "gemm_simt.cuh"
#include "gemm_simt_skinny.cuh"
#include "gemm_simt_wide.cuh"
#include "gemm_sm90.cuh"

namespace dualk {
namespace gemm {

enum class GemmKernel { kTensorCoreLarge, kTensorCoreSmall, kSimt };

// The one config heuristic: which kernel and tile serve C[b] = A[b] @ B[b] for these sizes.
inline GemmKernel select_gemm_kernel(const GemmArgs& args, const DeviceProps& device) {
  if (args.dtype == DType::kFloat32) return GemmKernel::kSimt;
  if (!a_rows_aligned(args, 2) || !b_rows_aligned(args, 2)) return GemmKernel::kSimt;
  if (args.k >= (int64_t{1} << 31)) return GemmKernel::kSimt;  // tensor-core k offsets are 32-bit
  const int64_t large_tiles =
      args.batch * ceil_div(args.m, TcLarge::kBlockM) * ceil_div(args.n, TcLarge::kBlockN);
  // Half a wave of large tiles still beats many small ones (2048^2: 128 large tiles on 132 SMs);
  // below that, or when n <= 128 would leave half of a 256-wide tile idle, the 64 x 64 tile
  // spreads the work over more SMs.
  // The large tile needs 96 KB of shared memory (sm_80/sm_90 have 163/227 KB; sm_86/89 99 KB).
  const bool large = 2 * large_tiles >= device.num_sms && args.n > 128 &&
                     tensor_core_smem_bytes<TcLarge>() <= device.smem_optin;
  return large ? GemmKernel::kTensorCoreLarge : GemmKernel::kTensorCoreSmall;
}

// The SIMT path: for fp32 the skinny kernel (at most 32 rows) or the wide one where they fit, else
// gemm_simt_kernel.
template <typename T, Activation kAct, bool kHasBias>
cudaError_t launch_simt(const GemmArgs& args, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    if (simt_skinny_fits(args)) return launch_simt_skinny<kAct, kHasBias>(args, stream);
    if (simt_wide_fits(args)) return launch_simt_wide<kAct, kHasBias>(args, stream);
  }
  return launch_simt_fallback<T, kAct, kHasBias>(args, stream);
}

template <typename T, Activation kAct, bool kHasBias>
cudaError_t run_gemm_typed(const GemmArgs& args, cudaStream_t stream) {
  const GemmKernel kernel = select_gemm_kernel(args, device_props());
  if constexpr (!std::is_same_v<T, float>) {
    if (kernel == GemmKernel::kTensorCoreLarge) {
      return args.b_k_major ? launch_tensor_core<T, TcLarge, true, kAct, kHasBias>(args, stream)
                            : launch_tensor_core<T, TcLarge, false, kAct, kHasBias>(args, stream);
    }
    if (kernel == GemmKernel::kTensorCoreSmall) {
      return args.b_k_major ? launch_tensor_core<T, TcSmall, true, kAct, kHasBias>(args, stream)
                            : launch_tensor_core<T, TcSmall, false, kAct, kHasBias>(args, stream);
    }
  }
  return launch_simt<T, kAct, kHasBias>(args, stream);
}

// ------------------------------------------------------------------ split-K
// Few output tiles and a long k (a tall batch's weight gradients, 64 x 2^18 x 64; 128 x 8192 x
// 128): one tile per CTA leaves most SMs idle for the whole k loop. k is cut into slices, each a
// batch entry of the portable tensor-core kernel (16-bit) or the SIMT kernels (fp32) writing fp32
// partial products into a workspace (launch_split_k_partials, matmul.cu), and
// split_k_reduce_kernel sums them in fp32, adds the bias, applies the activation and rounds once:
// the same arithmetic as one pass, reordered. For fp32 the reordering is also the accuracy fix:
// one pass sums k in order (at k = 65536, 20x cuBLAS's error), slices sum ~k / splits terms each.
constexpr int64_t kSplitKMinSlice = 256;  // k per slice: 8 k-tiles of 32
// fp32 slices run the SIMT kernels, whose 64 k of FMA per output (128 FLOPs) cost about as much as
// the 8 bytes of workspace each slice writes and reads; 256 capped linear_gelu 32x768->3072 at
// 3 slices (72 CTAs of a 128-row tile for 32 rows: 45 us on an H100, cuBLAS 39; 8 slices of 96:
// 29-30 us). Only the slices are shorter: k < 2 * kSplitKMinSlice still runs in one pass (a
// small GEMM would pay a workspace and a second launch for little).
constexpr int64_t kSplitKMinSliceFp32 = 64;
constexpr int64_t kSplitKMaxSplits = 128;

struct SplitK {
  int64_t splits, slice;  // ceil(k / slice) slices of `slice` (a multiple of 32), the last shorter
};

inline SplitK split_k_plan(const GemmArgs& args, const DeviceProps& device) {
  const SplitK none{1, args.k};
  if (args.a == nullptr || args.b == nullptr || args.c == nullptr) return none;
  if (args.batch != 1 || args.m <= 0 || args.n <= 0) return none;
  if (args.k < 2 * kSplitKMinSlice || args.k >= (int64_t{1} << 31)) return none;
  const bool fp32 = args.dtype == DType::kFloat32;
  const int64_t min_slice = fp32 ? kSplitKMinSliceFp32 : kSplitKMinSlice;
  // 16-bit slices run the tensor-core kernel, which needs its 16-byte rows; fp32 slices run
  // launch_simt, which takes any rows (slices of a multiple of 32 keep the rows' alignment).
  if (!fp32 && (!a_rows_aligned(args, 2) || !b_rows_aligned(args, 2))) return none;
  // fp32: the SIMT kernels' 128-wide tiles (the skinny kernel's 32-row tiles count the same for
  // the m <= 32 it takes; it fits 3 blocks per SM, not 2, so a 32-row GEMM of 66-131 tiles runs
  // in one pass with SMs idle: not measured).
  const int64_t tiles =
      fp32 ? ceil_div(args.m, kSimtBlockM) * ceil_div(args.n, kSimtBlockN)
           : ceil_div(args.m, TcSmall::kBlockM) * ceil_div(args.n, TcSmall::kBlockN);
  if (2 * tiles >= device.num_sms) return none;  // the one-pass kernels fill the GPU
  int64_t splits = ceil_div(int64_t{2} * device.num_sms, tiles);  // ~2 CTAs per SM
  splits = std::min(std::min(splits, args.k / min_slice), kSplitKMaxSplits);
  if (splits < 2) return none;
  const int64_t slice = ceil_div(ceil_div(args.k, splits), TcSmall::kBlockK) * TcSmall::kBlockK;
  return {ceil_div(args.k, slice), slice};
}

// The fp32 partial products of every slice into args.workspace ((splits, m, n), contiguous).
cudaError_t launch_split_k_partials(const GemmArgs& args, const SplitK& plan, cudaStream_t stream);

template <typename T, Activation kAct, bool kHasBias>
__global__ void split_k_reduce_kernel(const float* __restrict__ partials, int64_t splits, int64_t m,
                                      int64_t n, const T* __restrict__ bias, T* __restrict__ c,
                                      int64_t stride_cm) {
  const int64_t total = m * n;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    float acc = 0.f;
    for (int64_t s = 0; s < splits; ++s) acc += partials[s * total + i];
    const int64_t row = i / n, col = i - row * n;
    c[row * stride_cm + col] = from_float<T>(epilogue_value<T, kAct, kHasBias>(acc, bias, col));
  }
}

template <typename T, Activation kAct, bool kHasBias>
cudaError_t run_split_k(const GemmArgs& args, const SplitK& plan, cudaStream_t stream) {
  cudaError_t err = launch_split_k_partials(args, plan, stream);
  if (err != cudaSuccess) return err;
  constexpr int kThreads = 256;
  const int64_t blocks =
      std::min<int64_t>(ceil_div(args.m * args.n, kThreads), int64_t{device_props().num_sms} * 8);
  split_k_reduce_kernel<T, kAct, kHasBias><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      args.workspace, plan.splits, args.m, args.n, static_cast<const T*>(args.bias),
      static_cast<T*>(args.c), args.stride_cm);
  return cudaGetLastError();
}

// Validates what every GEMM launcher needs, then dispatches on dtype.
template <Activation kAct, bool kHasBias>
cudaError_t run_gemm(const GemmArgs& args, cudaStream_t stream) {
  if (args.batch < 0 || args.m < 0 || args.n < 0 || args.k < 0) return cudaErrorInvalidValue;
  if (args.batch == 0 || args.m == 0 || args.n == 0) return cudaSuccess;  // nothing to write
  if (args.c == nullptr || (args.k > 0 && (args.a == nullptr || args.b == nullptr)))
    return cudaErrorInvalidValue;
  switch (args.dtype) {
    case DType::kFloat32:
      return run_gemm_typed<float, kAct, kHasBias>(args, stream);
    case DType::kFloat16:
      return run_gemm_typed<__half, kAct, kHasBias>(args, stream);
    case DType::kBFloat16:
      return run_gemm_typed<__nv_bfloat16, kAct, kHasBias>(args, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace gemm

// The GEMM family's entry point: the Hopper kernel where it can run (16-bit, sm_90a build on a
// 9.0 device, TMA-compatible strides), else the portable kernels through run_gemm (which also
// owns the k == 0 and empty cases).
template <Activation kAct, bool kHasBias>
cudaError_t run_gemm_best(const GemmArgs& args, cudaStream_t stream) {
  const bool nonempty = args.batch > 0 && args.m > 0 && args.n > 0 && args.k > 0 &&
                        args.a != nullptr && args.b != nullptr && args.c != nullptr;
  if (args.workspace != nullptr) {  // the caller asked gemm_split_k_workspace_floats
    const gemm::SplitK plan = gemm::split_k_plan(args, device_props());
    if (plan.splits > 1 && args.workspace_floats >= plan.splits * args.m * args.n) {
      switch (args.dtype) {
        case DType::kFloat32:
          return gemm::run_split_k<float, kAct, kHasBias>(args, plan, stream);
        case DType::kFloat16:
          return gemm::run_split_k<__half, kAct, kHasBias>(args, plan, stream);
        case DType::kBFloat16:
          return gemm::run_split_k<__nv_bfloat16, kAct, kHasBias>(args, plan, stream);
      }
    }
  }
  if (nonempty && args.dtype != DType::kFloat32 && gemm_sm90::can_run(args)) {
    return args.dtype == DType::kFloat16
               ? gemm_sm90::launch<__half, kAct, kHasBias>(args, stream)
               : gemm_sm90::launch<__nv_bfloat16, kAct, kHasBias>(args, stream);
  }
  return gemm::run_gemm<kAct, kHasBias>(args, stream);
}

}  // namespace dualk
