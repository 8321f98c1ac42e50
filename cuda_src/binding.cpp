// The one file of dualk's CUDA backend that includes torch: it checks what the Python layer
// hands over (a second line of defence: dualk/validate.py already gave the user-facing errors),
// takes the output tensor's device guard and current stream, and calls the plain-C++ launchers.
#include <torch/extension.h>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <optional>
#include <vector>

#include "launchers.h"

namespace {

dualk::DType dtype_code(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return dualk::DType::kFloat32;
    case at::kHalf: return dualk::DType::kFloat16;
    case at::kBFloat16: return dualk::DType::kBFloat16;
    default: TORCH_CHECK(false, "dualk: unsupported dtype ", t.scalar_type());
  }
}

// `t` is a CUDA tensor on `like`'s device with `like`'s dtype.
void check_operand(const char* op, const char* name, const at::Tensor& t, const at::Tensor& like) {
  TORCH_CHECK(t.is_cuda(), "dualk.", op, ": '", name, "' must be a CUDA tensor, got ", t.device());
  TORCH_CHECK(t.device() == like.device(), "dualk.", op, ": '", name, "' is on ", t.device(),
              " but the output is on ", like.device());
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), "dualk.", op, ": '", name, "' has dtype ",
              t.scalar_type(), " but the output has ", like.scalar_type());
}

void check_launch(const char* op, cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, "dualk.", op, ": CUDA launch failed: ", cudaGetErrorString(err));
}

// ------------------------------------------------------------------ elementwise
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
  check_launch("add", dualk::launch_add(dense_operand(a), dense_operand(b), out.data_ptr(),
                                        dense_shape(out.numel()), /*dense=*/true,
                                        static_cast<float>(alpha), dtype_code(out),
                                        at::cuda::getCurrentCUDAStream()));
  return out;
}

at::Tensor relu_scale_dense(const at::Tensor& x, double scale) {
  TORCH_CHECK(x.is_contiguous(), "dualk.relu_scale: the dense entry takes a contiguous tensor");
  TORCH_CHECK(x.is_cuda(), "dualk.relu_scale: 'x' must be a CUDA tensor, got ", x.device());
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty(x.sizes(), x.options());
  if (out.numel() == 0) return out;
  check_launch("relu_scale", dualk::launch_relu_scale(dense_operand(x), out.data_ptr(),
                                                      dense_shape(out.numel()), /*dense=*/true,
                                                      static_cast<float>(scale), dtype_code(out),
                                                      at::cuda::getCurrentCUDAStream()));
  return out;
}

// ------------------------------------------------------------------ GEMM family
// A dim of size <= 1 has no meaningful stride, so it counts as unit-stride.
bool unit_stride(const at::Tensor& t, int dim) { return t.stride(dim) == 1 || t.size(dim) <= 1; }

// Sizes and strides of a GEMM operand as (batch, rows, cols): a 2-dim tensor is one batch entry
// (batch stride 0), so the Python layer passes its tensors without view ops (each costs about a
// microsecond of host time there, a few hundred nanoseconds less here).
struct Dims3 {
  int64_t size[3];
  int64_t stride[3];
};

Dims3 dims3(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.dim() == 2 || t.dim() == 3, "dualk.", op, ": '", name,
              "' must be 2-dim or 3-dim (batch, rows, cols), got ", t.dim(), " dims");
  if (t.dim() == 2) return {{1, t.size(0), t.size(1)}, {0, t.stride(0), t.stride(1)}};
  return {{t.size(0), t.size(1), t.size(2)}, {t.size(0) == 1 ? 0 : t.stride(0), t.stride(1), t.stride(2)}};
}

// An nn.Linear weight (n, k) read as the GEMM's B = weight^T: (1, k, n).
Dims3 transposed_weight(const char* op, const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2, "dualk.", op, ": 'weight' must be 2-dim (out, in), got ", w.dim(), " dims");
  return {{1, w.size(1), w.size(0)}, {0, w.stride(1), w.stride(0)}};
}

bool unit_stride(const Dims3& t, int dim) { return t.stride[dim] == 1 || t.size[dim] <= 1; }

// a: (batch, m, k) unit stride along k; b: (batch, k, n) unit stride along n or along k;
// out: (batch, m, n) contiguous; 2-dim forms are batch 1. Batch strides may be 0.
dualk::GemmArgs gemm_args(const char* op, const at::Tensor& a_t, const Dims3& a,
                          const at::Tensor& b_t, const Dims3& b, const at::Tensor& out,
                          bool allow_tf32) {
  check_operand(op, "a", a_t, out);
  check_operand(op, "b", b_t, out);
  const Dims3 c = dims3(op, "out", out);
  TORCH_CHECK(a.size[2] == b.size[1] && c.size[1] == a.size[1] && c.size[2] == b.size[2] &&
                  (a.size[0] == c.size[0] || a.size[0] == 1) &&
                  (b.size[0] == c.size[0] || b.size[0] == 1),
              "dualk.", op, ": operand shapes do not chain (batch, m, k) @ (batch, k, n)");
  TORCH_CHECK(unit_stride(a, 2), "dualk.", op, ": 'a' needs unit stride along k");
  TORCH_CHECK(out.is_contiguous(), "dualk.", op, ": the output must be contiguous");
  dualk::GemmArgs args{};
  args.a = a_t.data_ptr();
  args.b = b_t.data_ptr();
  args.c = out.data_ptr();
  args.batch = c.size[0];
  args.m = c.size[1];
  args.n = c.size[2];
  args.k = a.size[2];
  args.stride_a_batch = a.size[0] == 1 ? 0 : a.stride[0];
  args.stride_am = a.stride[1];
  args.stride_b_batch = b.size[0] == 1 ? 0 : b.stride[0];
  if (unit_stride(b, 2)) {
    args.b_k_major = false;
    args.stride_b_outer = b.stride[1];
  } else {
    TORCH_CHECK(unit_stride(b, 1), "dualk.", op, ": 'b' needs unit stride along n or along k");
    args.b_k_major = true;
    args.stride_b_outer = b.stride[2];
  }
  args.stride_c_batch = out.dim() == 3 ? out.stride(0) : args.m * args.n;  // contiguous C
  args.stride_cm = c.stride[1];
  args.dtype = dtype_code(out);
  args.activation = dualk::Activation::kNone;
  args.allow_tf32 = allow_tf32;
  return args;
}

// Split-K scratch from PyTorch's caching allocator when the GEMM family wants one (freed at the
// end of the call: the kernels run first on this stream, so the block is reused in order).
at::Tensor split_k_workspace(dualk::GemmArgs& args, const at::Tensor& out) {
  const int64_t floats = dualk::gemm_split_k_workspace_floats(args);
  if (floats == 0) return {};
  at::Tensor workspace = at::empty({floats}, out.options().dtype(at::kFloat));
  args.workspace = workspace.data_ptr<float>();
  args.workspace_floats = floats;
  return workspace;
}

// a: (m, k) or (batch, m, k); b: (k, n) or (batch, k, n); out: (m, n) or (batch, m, n).
void matmul(const at::Tensor& a, const at::Tensor& b, at::Tensor& out, bool allow_tf32) {
  auto args = gemm_args("matmul", a, dims3("matmul", "a", a), b, dims3("matmul", "b", b), out,
                        allow_tf32);
  const c10::cuda::CUDAGuard guard(out.device());
  const at::Tensor workspace = split_k_workspace(args, out);
  check_launch("matmul", dualk::launch_matmul(args, at::cuda::getCurrentCUDAStream()));
}

// x: (m, k); weight: (n, k) as nn.Linear holds it; bias: (n,) or None; out: (m, n).
void linear_gelu(const at::Tensor& x, const at::Tensor& weight,
                 const std::optional<at::Tensor>& bias, at::Tensor& out, int64_t activation,
                 bool allow_tf32) {
  auto args = gemm_args("linear_gelu", x, dims3("linear_gelu", "x", x), weight,
                        transposed_weight("linear_gelu", weight), out, allow_tf32);
  if (bias.has_value()) {
    check_operand("linear_gelu", "bias", *bias, out);
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == args.n,
                "dualk.linear_gelu: 'bias' must be contiguous with out_features elements");
    args.bias = bias->data_ptr();
  }
  args.activation = static_cast<dualk::Activation>(activation);
  const c10::cuda::CUDAGuard guard(out.device());
  const at::Tensor workspace = split_k_workspace(args, out);
  check_launch("linear_gelu", dualk::launch_linear_gelu(args, at::cuda::getCurrentCUDAStream()));
}

// ------------------------------------------------------------------ fused MLP
dualk::FusedMlpArgs mlp_shape(const std::vector<int64_t>& widths, dualk::DType dtype,
                              int64_t activation) {
  dualk::FusedMlpArgs args{};
  args.num_layers = static_cast<int>(widths.size()) - 1;
  for (size_t i = 0; i < widths.size() && i <= static_cast<size_t>(dualk::kMaxMlpLayers); ++i)
    args.widths[i] = static_cast<int>(widths[i]);
  args.dtype = dtype;
  args.activation = static_cast<dualk::Activation>(activation);
  return args;
}

py::object fused_mlp_unsupported_reason(const std::vector<int64_t>& widths, int64_t dtype,
                                        int64_t activation) {
  if (widths.size() < 2 || widths.size() > static_cast<size_t>(dualk::kMaxMlpLayers) + 1)
    return py::str("the fused CUDA kernel takes 1 to " + std::to_string(dualk::kMaxMlpLayers) +
                   " layers");
  auto args = mlp_shape(widths, static_cast<dualk::DType>(dtype), activation);
  const char* reason = dualk::fused_mlp_unsupported_reason(args);
  if (reason == nullptr) return py::none();
  return py::str(reason);
}

// The launcher's arguments for these tensors (checked); the caller holds a device guard.
dualk::FusedMlpArgs mlp_args(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                             const std::vector<std::optional<at::Tensor>>& biases,
                             const at::Tensor& out, int64_t activation) {
  const size_t layers = weights.size();
  TORCH_CHECK(layers >= 1 && layers <= static_cast<size_t>(dualk::kMaxMlpLayers) &&
                  biases.size() == layers,
              "dualk.fused_mlp: 1..", dualk::kMaxMlpLayers, " layers with one bias entry each");
  check_operand("fused_mlp", "x", x, out);
  TORCH_CHECK(x.dim() == 2 && unit_stride(x, 1), "dualk.fused_mlp: x must be 2-dim, unit stride");
  TORCH_CHECK(out.is_contiguous(), "dualk.fused_mlp: the output must be contiguous");
  std::vector<int64_t> widths{x.size(1)};
  for (const auto& w : weights) {
    check_operand("fused_mlp", "weights[i]", w, out);
    TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.size(1) == widths.back(),
                "dualk.fused_mlp: weights must be contiguous (out_i, in_i) chained by width");
    widths.push_back(w.size(0));
  }
  auto args = mlp_shape(widths, dtype_code(out), activation);
  args.x = x.data_ptr();
  args.stride_xm = x.stride(0);
  args.out = out.data_ptr();
  args.m = x.size(0);
  for (size_t i = 0; i < layers; ++i) {
    args.weights[i] = weights[i].data_ptr();
    if (biases[i].has_value()) {
      check_operand("fused_mlp", "biases[i]", *biases[i], out);
      TORCH_CHECK(biases[i]->is_contiguous() && biases[i]->numel() == widths[i + 1],
                  "dualk.fused_mlp: biases[", i, "] must be contiguous with ", widths[i + 1],
                  " elements");
      args.biases[i] = biases[i]->data_ptr();
    }
  }
  args.num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  return args;
}

void fused_mlp(const at::Tensor& x, const std::vector<at::Tensor>& weights,
               const std::vector<std::optional<at::Tensor>>& biases, at::Tensor& out,
               int64_t activation) {
  const c10::cuda::CUDAGuard guard(out.device());
  const auto args = mlp_args(x, weights, biases, out, activation);
  // The launcher plans the launch itself and refuses what it cannot hold; only then is the
  // (second) planning pass for the message worth its cost.
  const cudaError_t err = dualk::launch_fused_mlp(args, at::cuda::getCurrentCUDAStream());
  if (err == cudaErrorInvalidValue) {
    const char* reason = dualk::fused_mlp_unsupported_reason(args);
    TORCH_CHECK(false, "dualk.fused_mlp: ", reason != nullptr ? reason : "invalid arguments");
  }
  check_launch("fused_mlp", err);
}

py::object fused_mlp_kernel(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                            const std::vector<std::optional<at::Tensor>>& biases,
                            const at::Tensor& out, int64_t activation) {
  const c10::cuda::CUDAGuard guard(out.device());
  const char* name = dualk::fused_mlp_kernel_name(mlp_args(x, weights, biases, out, activation));
  if (name == nullptr) return py::none();
  return py::str(name);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "dualk CUDA kernels (see cuda_src/launchers.h)";
  m.def("add", &add, "out = a + alpha * b over a coalesced plan");
  m.def("relu_scale", &relu_scale, "out = relu(x) * scale over a coalesced plan");
  m.def("add_dense", &add_dense, "a + alpha * b for same-shape contiguous operands (new output)");
  m.def("relu_scale_dense", &relu_scale_dense, "relu(x) * scale for a contiguous x (new output)");
  m.def("matmul", &matmul, "out[b] = a[b] @ b[b]");
  m.def("linear_gelu", &linear_gelu, "out = gelu(x @ weight_t + bias)");
  m.def("fused_mlp", &fused_mlp, "the whole MLP in one launch");
  m.def("fused_mlp_unsupported_reason", &fused_mlp_unsupported_reason,
        "None if the fused kernel holds these widths on chip, else why not");
  m.def("fused_mlp_kernel", &fused_mlp_kernel,
        "which kernel fused_mlp launches for these tensors (None: it would refuse them)");
}
