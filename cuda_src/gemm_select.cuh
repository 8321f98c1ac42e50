// Which GEMM kernel runs: the family's host-side entry points for matmul.cu and linear_gelu.cu.
//   run_gemm_best: the Hopper kernel (gemm_sm90.cuh) where it can run, else run_gemm;
//   run_gemm: validates the arguments, then per dtype select_gemm_kernel picks the tensor-core
//     tile (gemm_mma.cuh: TcLarge, TcSmall) or the SIMT path, and launch_simt picks
//     gemm_simt_wide_kernel (gemm_simt_wide.cuh) or the gemm_simt_kernel fallback (gemm_simt.cuh).
// Instantiation: each .cu file calls run_gemm_best<kAct, kHasBias> with its own activation and
// bias flags, so no kernel is compiled in two files.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "gemm_common.cuh"
#include "gemm_mma.cuh"
#include "gemm_simt.cuh"
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

// The SIMT path: the wide kernel for fp32 where it fits, else gemm_simt_kernel.
template <typename T, Activation kAct, bool kHasBias>
cudaError_t launch_simt(const GemmArgs& args, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
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
  if (nonempty && args.dtype != DType::kFloat32 && gemm_sm90::can_run(args)) {
    return args.dtype == DType::kFloat16
               ? gemm_sm90::launch<__half, kAct, kHasBias>(args, stream)
               : gemm_sm90::launch<__nv_bfloat16, kAct, kHasBias>(args, stream);
  }
  return gemm::run_gemm<kAct, kHasBias>(args, stream);
}

}  // namespace dualk
