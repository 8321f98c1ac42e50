// add: out = a + alpha * b, computed in fp32 and rounded once to the tensor's dtype
// (what torch.add does for fp16/bf16). Walks and vectorization live in elementwise.cuh.
#include "elementwise.cuh"

namespace dualk {
namespace {

struct AddOp {
  float alpha;
  __device__ __forceinline__ float operator()(const float (&v)[2]) const {
    return v[0] + alpha * v[1];
  }
};

}  // namespace

cudaError_t launch_add(const StridedOperand& a, const StridedOperand& b, void* out,
                       const ElementwiseShape& shape, bool dense, float alpha, DType dtype,
                       cudaStream_t stream) {
  const StridedOperand operands[2] = {a, b};
  return elementwise::launch<2>(operands, out, shape, dense, dtype, AddOp{alpha}, stream);
}

}  // namespace dualk
