// linear_gelu: C[b] = gelu(A[b] @ B[b] + bias) with B = W^T of an nn.Linear weight W (n, k).
// The kernels live in the gemm_*.cuh family (gemm.cuh lists them); this file compiles the
// gelu (tanh and erf) x bias / no-bias instantiations.
#include "gemm.cuh"

namespace dualk {

cudaError_t launch_linear_gelu(const GemmArgs& args, cudaStream_t stream) {
  const bool has_bias = args.bias != nullptr;
  switch (args.activation) {
    case Activation::kGeluTanh:
      return has_bias ? run_gemm_best<Activation::kGeluTanh, true>(args, stream)
                      : run_gemm_best<Activation::kGeluTanh, false>(args, stream);
    case Activation::kGeluErf:
      return has_bias ? run_gemm_best<Activation::kGeluErf, true>(args, stream)
                      : run_gemm_best<Activation::kGeluErf, false>(args, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace dualk
