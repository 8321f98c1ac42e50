// relu_scale: out = relu(x) * scale in one pass (eager PyTorch needs two: relu, then mul).
// relu keeps NaN, as torch.relu does. Walks and vectorization live in elementwise.cuh.
#include "elementwise.cuh"

namespace dualk {
namespace {

struct ReluScaleOp {
  float scale;
  __device__ __forceinline__ float operator()(const float (&v)[1]) const {
    return relu(v[0]) * scale;
  }
};

}  // namespace

cudaError_t launch_relu_scale(const StridedOperand& x, void* out, const ElementwiseShape& shape,
                              bool dense, float scale, DType dtype, cudaStream_t stream) {
  const StridedOperand operands[1] = {x};
  return elementwise::launch<1>(operands, out, shape, dense, dtype, ReluScaleOp{scale}, stream);
}

}  // namespace dualk
