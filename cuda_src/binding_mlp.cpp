// The mlp family's extension (dualk/backends/cuda.py FAMILIES["mlp"]): fused_mlp, its
// planner and its kernel variants.
// Torch-side helpers: binding.h.
#include "binding.h"

#include <ATen/autocast_mode.h>

#include <limits>
#include <torch/csrc/jit/frontend/tracer.h>

namespace {

using dualk_binding::check_launch;
using dualk_binding::check_operand;
using dualk_binding::dtype_code;
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
  TORCH_CHECK(
      layers >= 1 && layers <= static_cast<size_t>(dualk::kMaxMlpLayers) && biases.size() == layers,
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

// FusedMLP's planned inference call (dualk/nn.py _FastPath): the module's parameters and the
// launch's fixed arguments live here, so a call is one crossing from Python, an allocation and
// a launch. run() returns None wherever the call does not fit the plan any more (another input,
// a replaced or reshaped parameter, gradient mode, autocast, tracing, a torch.func transform);
// the caller then takes the full call, which explains any error.
class MlpPlan {
 public:
  // identities: (dict, key, value) triples that must still hold (the modules' _parameters and
  // _modules entries: a parameter or layer replaced through any route changes one of them);
  // weights / biases: the parameters themselves (None for no bias), read again on every call
  // (.data assignment changes a parameter's storage, dtype or shape in place); row_buckets: bit
  // b set where calls of (rows - 1).bit_length() == b take this kernel.
  // poison: outputs are NaN-filled before the launch (the test suite's check that every
  // element is written; dualk/core/alloc.py).
  MlpPlan(const py::list& identities, const py::list& weights, const py::list& biases,
          int64_t activation, int64_t row_buckets, bool poison)
      : row_buckets_(static_cast<uint64_t>(row_buckets)), poison_(poison) {
    for (const auto& item : identities) {
      const auto triple = item.cast<py::tuple>();
      identities_.push_back({triple[0].cast<py::dict>(),
                             py::reinterpret_borrow<py::object>(triple[1]),
                             py::reinterpret_borrow<py::object>(triple[2])});
    }
    TORCH_CHECK(weights.size() >= 1 &&
                    weights.size() <= static_cast<size_t>(dualk::kMaxMlpLayers) &&
                    biases.size() == weights.size(),
                "dualk.fused_mlp plan: 1..", dualk::kMaxMlpLayers, " layers, one bias entry each");
    std::vector<int64_t> widths;
    for (size_t i = 0; i < weights.size(); ++i) {
      weights_.push_back(py::reinterpret_borrow<py::object>(weights[i]));
      biases_.push_back(py::reinterpret_borrow<py::object>(biases[i]));
      const at::Tensor w = weights[i].cast<at::Tensor>();
      if (i == 0) {
        widths.push_back(w.size(1));
        dtype_ = w.scalar_type();
        device_ = w.get_device();
        options_ = w.options().requires_grad(false);
      }
      widths.push_back(w.size(0));
    }
    widths_ = widths;
    args_ = mlp_shape(widths, dtype_code_of(dtype_), activation);
    TORCH_CHECK(device_ >= 0, "dualk.fused_mlp plan: the parameters must be CUDA tensors");
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    args_.num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  }

  py::object run(py::handle x) {
    PyObject* obj = x.ptr();
    if (!THPVariable_CheckExact(obj) || at::GradMode::is_enabled() ||
        torch::jit::tracer::isTracing())
      return py::none();
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (!t.is_cuda() || t.get_device() != device_ || t.scalar_type() != dtype_ || t.dim() != 2 ||
        t.size(1) != widths_[0] || t.size(0) <= 0 || !t.is_contiguous() ||
        !(row_buckets_ >> bucket(t.size(0)) & 1u) || at::autocast::is_autocast_enabled(at::kCUDA) ||
        at::autocast::is_autocast_enabled(at::kCPU))
      return py::none();
    for (const auto& id : identities_) {
      PyObject* now = PyDict_GetItemWithError(id.dict.ptr(), id.key.ptr());
      if (now != id.value.ptr()) {
        if (now == nullptr) PyErr_Clear();
        return py::none();
      }
    }
    dualk::FusedMlpArgs args = args_;
    for (size_t i = 0; i < weights_.size(); ++i) {
      const at::Tensor& w = THPVariable_Unpack(weights_[i].ptr());
      if (w.scalar_type() != dtype_ || w.get_device() != device_ || w.dim() != 2 ||
          w.size(0) != widths_[i + 1] || w.size(1) != widths_[i] || !w.is_contiguous())
        return py::none();
      args.weights[i] = w.data_ptr();
      if (biases_[i].is_none()) continue;
      const at::Tensor& b = THPVariable_Unpack(biases_[i].ptr());
      if (b.scalar_type() != dtype_ || b.get_device() != device_ || b.dim() != 1 ||
          b.size(0) != widths_[i + 1] || !b.is_contiguous())
        return py::none();
      args.biases[i] = b.data_ptr();
    }
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    at::Tensor out = at::empty({t.size(0), widths_.back()}, options_);
    if (poison_) out.fill_(std::numeric_limits<double>::quiet_NaN());
    args.x = t.data_ptr();
    args.stride_xm = t.stride(0);
    args.out = out.data_ptr();
    args.m = t.size(0);
    const cudaError_t err = dualk::launch_fused_mlp(args, at::cuda::getCurrentCUDAStream());
    if (err == cudaErrorInvalidValue) return py::none();  // refused (alignment): the full call
    check_launch("fused_mlp", err);
    return py::cast(std::move(out));
  }

 private:
  struct Identity {
    py::dict dict;
    py::object key;
    py::object value;
  };

  static int bucket(int64_t rows) {  // (rows - 1).bit_length()
    int b = 0;
    for (uint64_t r = static_cast<uint64_t>(rows - 1); r != 0; r >>= 1) ++b;
    return b;
  }

  static dualk::DType dtype_code_of(at::ScalarType t) {
    switch (t) {
      case at::kFloat:
        return dualk::DType::kFloat32;
      case at::kHalf:
        return dualk::DType::kFloat16;
      case at::kBFloat16:
        return dualk::DType::kBFloat16;
      default:
        TORCH_CHECK(false, "dualk.fused_mlp plan: unsupported dtype ", t);
    }
  }

  std::vector<Identity> identities_;
  std::vector<py::object> weights_, biases_;
  std::vector<int64_t> widths_;
  at::ScalarType dtype_ = at::kFloat;
  int device_ = -1;
  at::TensorOptions options_;
  uint64_t row_buckets_;
  bool poison_;
  dualk::FusedMlpArgs args_{};
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "dualk CUDA kernels, fused MLP family (see cuda_src/launchers.h)";
  m.def("fused_mlp", &fused_mlp, "the whole MLP in one launch");
  m.def("fused_mlp_unsupported_reason", &fused_mlp_unsupported_reason,
        "None if the fused kernel holds these widths on chip, else why not");
  m.def("fused_mlp_kernel", &fused_mlp_kernel,
        "which kernel fused_mlp launches for these tensors (None: it would refuse them)");
  py::class_<MlpPlan>(m, "MlpPlan", "FusedMLP's planned inference call (dualk/nn.py _FastPath)")
      .def(py::init<const py::list&, const py::list&, const py::list&, int64_t, int64_t, bool>())
      .def("run", &MlpPlan::run, "mlp(x), or None where the call does not fit the plan");
}
