// matmul: C[b] = A[b] @ B[b], no bias, no activation. The kernels live in the gemm_*.cuh family
// (gemm.cuh lists them); this file compiles the activation-free instantiations and the split-K
// partial products that matmul and linear_gelu share.
#include "gemm.cuh"

namespace dualk {

cudaError_t launch_matmul(const GemmArgs& args, cudaStream_t stream) {
  if (args.activation != Activation::kNone || args.bias != nullptr) return cudaErrorInvalidValue;
  return run_gemm_best<Activation::kNone, /*kHasBias=*/false>(args, stream);
}

int64_t gemm_split_k_workspace_floats(const GemmArgs& args) {
  const gemm::SplitK plan = gemm::split_k_plan(args, device_props());
  return plan.splits > 1 ? plan.splits * args.m * args.n : 0;
}

namespace gemm {
namespace {

template <typename T> cudaError_t launch_partials(const GemmArgs& part, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    return launch_simt<float, Activation::kNone, false>(part, stream);
  } else {
    return part.b_k_major
               ? launch_tensor_core<T, TcSmall, true, Activation::kNone, false, float>(part, stream)
               : launch_tensor_core<T, TcSmall, false, Activation::kNone, false, float>(part,
                                                                                        stream);
  }
}

}  // namespace

// Here, not in gemm_select.cuh: matmul.cu and linear_gelu.cu both split, and the partial-product
// kernels (no bias, no activation, fp32 out) are the same for both, so they compile once.
cudaError_t launch_split_k_partials(const GemmArgs& args, const SplitK& plan, cudaStream_t stream) {
  const int64_t elem = element_size(args.dtype);
  const int64_t full = args.k / plan.slice;  // slices of plan.slice; then one shorter, if any
  const int64_t tail = args.k - full * plan.slice;
  const int64_t b_slice_step = args.b_k_major ? plan.slice : plan.slice * args.stride_b_outer;
  GemmArgs part = args;
  part.bias = nullptr;
  part.activation = Activation::kNone;
  part.workspace = nullptr;
  part.workspace_floats = 0;
  part.c = args.workspace;
  part.stride_cm = args.n;
  part.stride_c_batch = args.m * args.n;
  part.k = plan.slice;
  part.batch = full;
  part.stride_a_batch = plan.slice;  // the next slice of k: A is k-contiguous
  part.stride_b_batch = b_slice_step;
  auto launch = args.dtype == DType::kFloat32   ? launch_partials<float>
                : args.dtype == DType::kFloat16 ? launch_partials<__half>
                                                : launch_partials<__nv_bfloat16>;
  cudaError_t err = full > 0 ? launch(part, stream) : cudaSuccess;
  if (err != cudaSuccess || tail == 0) return err;
  part.batch = 1;
  part.k = tail;
  part.a = static_cast<const char*>(args.a) + full * plan.slice * elem;
  part.b = static_cast<const char*>(args.b) + full * b_slice_step * elem;
  part.c = args.workspace + full * args.m * args.n;
  part.stride_a_batch = part.stride_b_batch = 0;
  return launch(part, stream);
}

}  // namespace gemm
}  // namespace dualk
