// The mlp family's extension (dualk/backends/cuda.py FAMILIES["mlp"]): fused_mlp, its
// planner and its kernel variants.
// Torch-side helpers: binding.h.
#include "binding.h"

namespace {

using dualk_binding::dtype_code;
using dualk_binding::check_operand;
using dualk_binding::check_launch;
using dualk_binding::unit_stride;

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
  m.doc() = "dualk CUDA kernels, fused MLP family (see cuda_src/launchers.h)";
  m.def("fused_mlp", &fused_mlp, "the whole MLP in one launch");
  m.def("fused_mlp_unsupported_reason", &fused_mlp_unsupported_reason,
        "None if the fused kernel holds these widths on chip, else why not");
  m.def("fused_mlp_kernel", &fused_mlp_kernel,
        "which kernel fused_mlp launches for these tensors (None: it would refuse them)");
}
