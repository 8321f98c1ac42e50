// fused_mlp, fp16/bf16 with a width in 129-256, on Hopper: the instantiations of
// fused_mlp_wide_kernel and its planner. The kernel and the host helpers it shares with
// experiments/mlp_wide_sm90.cu are in fused_mlp_wide.cuh; fused_mlp.cu's planner calls
// plan_fused_mlp_wide where it would otherwise give a 256-bucket MLP to the mma.sync kernel.
// Its own translation unit: its 14 kernels (fp16 / bf16 x none, relu, silu x last N 64 / 256, and
// tanh-gelu at 64; see kernel_built) take ~30 s to compile, in parallel with the other units.
#include <cstdint>
#include <map>
#include <mutex>

#include "fused_mlp_wide.cuh"

namespace dualk {
namespace mlp {
namespace {

template <typename T, int kLastN> struct WidePick {
  template <Activation kAct> struct By {
    static wide::KernelFn kernel() {
      if constexpr (wide::kernel_built(kAct, kLastN))
        return wide::fused_mlp_wide_kernel<T, kAct, kLastN>;
      return nullptr;
    }
  };
};

template <typename T> wide::KernelFn pick_wide_kernel(int last_n, Activation act) {
  return last_n == 64 ? pick_by_activation<WidePick<T, 64>::template By>(act)
                      : pick_by_activation<WidePick<T, 256>::template By>(act);
}

// setmaxnreg.inc waits until the producer's setmaxnreg.dec has put the registers it asks for in
// the CTA's pool, which holds exactly enough only at kEntryRegs registers per thread at launch
// (and more would not fit 3 warps in a sub-partition): a build of any other count (another ptxas)
// could hang or fail to launch, so it is never picked. Asked once per kernel.
bool registers_as_planned(wide::KernelFn kernel) {
  static std::mutex mutex;
  static std::map<const void*, bool> checked;
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = checked.find(reinterpret_cast<const void*>(kernel));
  if (it != checked.end()) return it->second;
  cudaFuncAttributes attributes;
  if (cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kernel)) != cudaSuccess) {
    cudaGetLastError();
    return false;  // not cached: a later call may succeed
  }
  const bool ok =
      attributes.numRegs == wide::kEntryRegs && attributes.maxThreadsPerBlock >= wide::kThreads;
  checked[reinterpret_cast<const void*>(kernel)] = ok;
  return ok;
}

}  // namespace

wide::KernelFn plan_fused_mlp_wide(const FusedMlpArgs& a, const DeviceProps& device,
                                   MlpKernelParams& p, int& smem) {
  if (wide::unfit_reason(a, device) != nullptr || encode_tiled_fn() == nullptr) return nullptr;
  const int last_n = wide::last_layer_n(a.widths[a.num_layers]);
  const wide::KernelFn kernel = a.dtype == DType::kFloat16
                                    ? pick_wide_kernel<__half>(last_n, a.activation)
                                    : pick_wide_kernel<__nv_bfloat16>(last_n, a.activation);
  if (kernel == nullptr || !registers_as_planned(kernel)) return nullptr;
  p.num_tiles = ceil_div(a.m, wide::kRows);
  smem = wide::kSmemBytes;
  return kernel;
}

}  // namespace mlp
}  // namespace dualk
