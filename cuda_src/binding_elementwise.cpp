// The elementwise family's extension (dualk/backends/cuda.py FAMILIES["elementwise"]): add and
// relu_scale. Torch-side helpers: binding.h.
#include "binding.h"

namespace {

using dualk_binding::check_launch;
using dualk_binding::check_operand;
using dualk_binding::dtype_code;

dualk::ElementwiseShape elementwise_shape(const std::vector<int64_t>& sizes, int64_t numel) {
  TORCH_CHECK(!sizes.empty() && sizes.size() <= static_cast<size_t>(dualk::kMaxDims),
              "dualk: elementwise plans take 1..", dualk::kMaxDims, " dims, got ", sizes.size());
  dualk::ElementwiseShape shape{};
  shape.ndim = static_cast<int>(sizes.size());
  for (size_t d = 0; d < sizes.size(); ++d) shape.sizes[d] = sizes[d];
  shape.numel = numel;
  return shape;
}

dualk::StridedOperand strided_operand(const at::Tensor& t, const std::vector<int64_t>& strides,
                                      const dualk::ElementwiseShape& shape) {
  TORCH_CHECK(static_cast<int>(strides.size()) == shape.ndim, "dualk: stride list of length ",
              strides.size(), " for a ", shape.ndim, "-dim plan");
  dualk::StridedOperand op{};
  op.data = t.data_ptr();
  for (size_t d = 0; d < strides.size(); ++d) op.strides[d] = strides[d];
  return op;
}

void add(const at::Tensor& a, const at::Tensor& b, at::Tensor& out, double alpha,
         const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides_a,
         const std::vector<int64_t>& strides_b, bool dense) {
  check_operand("add", "a", a, out);
  check_operand("add", "b", b, out);
  TORCH_CHECK(out.is_contiguous(), "dualk.add: the output must be contiguous");
  const c10::cuda::CUDAGuard guard(out.device());
  auto shape = elementwise_shape(sizes, out.numel());
  check_launch("add", dualk::launch_add(strided_operand(a, strides_a, shape),
                                        strided_operand(b, strides_b, shape), out.data_ptr(), shape,
                                        dense, static_cast<float>(alpha), dtype_code(out),
                                        at::cuda::getCurrentCUDAStream()));
}

void relu_scale(const at::Tensor& x, at::Tensor& out, double scale,
                const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides_x,
                bool dense) {
  check_operand("relu_scale", "x", x, out);
  TORCH_CHECK(out.is_contiguous(), "dualk.relu_scale: the output must be contiguous");
  const c10::cuda::CUDAGuard guard(out.device());
  auto shape = elementwise_shape(sizes, out.numel());
  check_launch("relu_scale",
               dualk::launch_relu_scale(strided_operand(x, strides_x, shape), out.data_ptr(), shape,
                                        dense, static_cast<float>(scale), dtype_code(out),
                                        at::cuda::getCurrentCUDAStream()));
}

// Same-shape contiguous operands (the common call): allocation and launch in one C++ call, no
// plan lists crossing pybind. Host time per call is most of a small op's cost; the Python route
// (plan, torch.empty, list arguments) cost ~7 us more than torch.add on an H200 host.
dualk::ElementwiseShape dense_shape(int64_t numel) {
  dualk::ElementwiseShape shape{};
  shape.ndim = 1;
  shape.sizes[0] = numel;
  shape.numel = numel;
  return shape;
}

dualk::StridedOperand dense_operand(const at::Tensor& t) {
  dualk::StridedOperand op{};
  op.data = t.data_ptr();
  op.strides[0] = 1;
  return op;
}

at::Tensor add_dense(const at::Tensor& a, const at::Tensor& b, double alpha) {
  TORCH_CHECK(a.sizes() == b.sizes() && a.is_contiguous() && b.is_contiguous(),
              "dualk.add: the dense entry takes two contiguous tensors of one shape");
  check_operand("add", "b", b, a);
  const c10::cuda::CUDAGuard guard(a.device());
  at::Tensor out = at::empty(a.sizes(), a.options());
  if (out.numel() == 0) return out;
  check_launch(
      "add", dualk::launch_add(dense_operand(a), dense_operand(b), out.data_ptr(),
                               dense_shape(out.numel()), /*dense=*/true, static_cast<float>(alpha),
                               dtype_code(out), at::cuda::getCurrentCUDAStream()));
  return out;
}

at::Tensor relu_scale_dense(const at::Tensor& x, double scale) {
  TORCH_CHECK(x.is_contiguous(), "dualk.relu_scale: the dense entry takes a contiguous tensor");
  TORCH_CHECK(x.is_cuda(), "dualk.relu_scale: 'x' must be a CUDA tensor, got ", x.device());
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty(x.sizes(), x.options());
  if (out.numel() == 0) return out;
  check_launch("relu_scale",
               dualk::launch_relu_scale(dense_operand(x), out.data_ptr(), dense_shape(out.numel()),
                                        /*dense=*/true, static_cast<float>(scale), dtype_code(out),
                                        at::cuda::getCurrentCUDAStream()));
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "dualk CUDA kernels, elementwise family (see cuda_src/launchers.h)";
  m.def("add", &add, "out = a + alpha * b over a coalesced plan");
  m.def("relu_scale", &relu_scale, "out = relu(x) * scale over a coalesced plan");
  m.def("add_dense", &add_dense, "a + alpha * b for same-shape contiguous operands (new output)");
  m.def("relu_scale_dense", &relu_scale_dense, "relu(x) * scale for a contiguous x (new output)");
}
