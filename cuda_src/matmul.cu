// matmul: C[b] = A[b] @ B[b], no bias, no activation. The kernels live in the gemm_*.cuh family
// (gemm.cuh lists them); this file compiles the activation-free instantiations.
#include "gemm.cuh"

namespace dualk {

cudaError_t launch_matmul(const GemmArgs& args, cudaStream_t stream) {
  if (args.activation != Activation::kNone || args.bias != nullptr) return cudaErrorInvalidValue;
  return run_gemm_best<Activation::kNone, /*kHasBias=*/false>(args, stream);
}

}  // namespace dualk
