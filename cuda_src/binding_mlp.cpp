// The mlp family's extension (dualk/backends/cuda.py FAMILIES["mlp"]): fused_mlp, its
// planner and its kernel variants.
// Torch-side helpers: binding.h.
#include "binding.h"
#include "plan_guards.h"

#include <ATen/autocast_mode.h>

#include <array>
#include <limits>
#include <memory>
#include <string>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/library.h>

namespace {

using dualk::Guards;
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
// a replaced or reshaped parameter, gradient mode, autocast, tracing, a changed guard); the
// caller then takes the full call, which explains any error.
class MlpPlan {
 public:
  // weights / biases: the parameters themselves (None for no bias), read again on every call
  // (.data assignment changes a parameter's storage, dtype or shape in place); row_buckets: bit
  // b set where calls of (rows - 1).bit_length() == b take this kernel.
  // poison: outputs are NaN-filled before the launch (the test suite's check that every
  // element is written; dualk/core/alloc.py).
  // state: guards every call checks (the modules' _parameters and _modules entries: a parameter
  // or layer replaced through any route changes one of them; the switches and decisions the
  // plan was made under); call: guards that run() checks and run_in_forward() leaves to
  // nn.Module's call that ran forward (hooks, module.compile()).
  MlpPlan(const py::list& weights, const py::list& biases, int64_t activation, int64_t row_buckets,
          bool poison, const py::tuple& state, const py::tuple& call)
      : row_buckets_(static_cast<uint64_t>(row_buckets)), poison_(poison) {
    state_.extend(state);
    call_.extend(call);
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

  // A copy whose run() also checks `call` (dualk.fuse's one-MLP model calls the plan of its
  // FusedMLP in place of its own call: its hooks and children as guards).
  MlpPlan with_call_guards(const py::tuple& call) const {
    MlpPlan copy = *this;
    copy.call_.extend(call);
    return copy;
  }

  py::object run(py::handle x) { return launch(x, true); }
  py::object run_in_forward(py::handle x) { return launch(x, false); }
  bool guards_hold() const { return !weights_.empty() && state_.hold() && call_.hold(); }

  // The collector's view (dualk::plan_gc_type_setup): the guards' objects and the parameters.
  int traverse(visitproc visit, void* arg) const {
    for (const auto& w : weights_) Py_VISIT(w.ptr());
    for (const auto& b : biases_) Py_VISIT(b.ptr());
    if (const int r = state_.traverse(visit, arg)) return r;
    return call_.traverse(visit, arg);
  }

  // Drops every Python object (the collector breaking a cycle): the plan then declines every
  // call (no weights).
  void clear() {
    weights_.clear();
    biases_.clear();
    state_.clear();
    call_.clear();
  }

 private:
  py::object launch(py::handle x, bool whole_call) {
    PyObject* obj = x.ptr();
    if (weights_.empty() || !THPVariable_CheckExact(obj) || at::GradMode::is_enabled() ||
        torch::jit::tracer::isTracing())
      return py::none();
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (!t.is_cuda() || t.get_device() != device_ || t.scalar_type() != dtype_ || t.dim() != 2 ||
        t.size(1) != widths_[0] || t.size(0) <= 0 || !t.is_contiguous() ||
        !(row_buckets_ >> bucket(t.size(0)) & 1u) || at::autocast::is_autocast_enabled(at::kCUDA) ||
        at::autocast::is_autocast_enabled(at::kCPU))
      return py::none();
    if ((whole_call && !call_.hold()) || !state_.hold()) return py::none();
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

  Guards state_, call_;
  std::vector<py::object> weights_, biases_;
  std::vector<int64_t> widths_;
  at::ScalarType dtype_ = at::kFloat;
  int device_ = -1;
  at::TensorOptions options_;
  uint64_t row_buckets_;
  bool poison_;
  dualk::FusedMlpArgs args_{};
};

// Planned calls of dualk.fused_mlp and of the dualk::fused_mlp_infer op that compiled inference
// graphs call (dualk/runtime/operators.py run_planned_mlp, dualk/autograd/library.py). A plan is a
// decision the Python side made on a full call and registered here: calls of this shape class
// (layer widths, dtype, device, activation, which layers have a bias, the backend= value "cuda"
// or "auto"; for "auto" also the row bucket and, for fp32, the TF32 switch: auto's key) run the
// fused CUDA kernel. A call finds its plan by the class its operands show, every operand checked
// afresh (CUDA, device, dtype, shapes chained, contiguous), so a call that differs in anything
// finds none and takes the full route, which raises where the call is wrong. The Python side
// checks what only it knows (backend overrides, auto's generation, poisoning) before asking.
struct PlannedClass {
  int kind;  // 0: backend="cuda" (named: any rows); 1: backend="auto", whose decision was cuda
  int activation;
  at::ScalarType dtype;
  int device;
  int layers;
  std::array<int64_t, dualk::kMaxMlpLayers + 1> widths;
  uint32_t bias_mask;    // bit i: layer i has a bias
  uint64_t row_buckets;  // bit b: calls with (rows - 1).bit_length() == b
  int tf32;              // kind 1, fp32: the TF32 switch the decision was made under; else -1
  int num_sms;
};

// The operands of one call, borrowed from the caller.
struct MlpOperands {
  const at::Tensor* x = nullptr;
  int layers = 0;
  std::array<const at::Tensor*, dualk::kMaxMlpLayers> weights{};
  std::array<const at::Tensor*, dualk::kMaxMlpLayers> biases{};  // nullptr: no bias
};

int bit_length(uint64_t v) {
  int b = 0;
  for (; v != 0; v >>= 1) ++b;
  return b;
}

at::ScalarType scalar_type_of(int64_t code) {
  switch (code) {
    case 0:
      return at::kFloat;
    case 1:
      return at::kHalf;
    case 2:
      return at::kBFloat16;
    default:
      TORCH_CHECK(false, "dualk.fused_mlp plan: unknown dtype code ", code);
  }
}

class PlannedCalls {
 public:
  static constexpr size_t kMaxClasses = 64;  // past this, the table starts afresh

  void add(int64_t kind, int64_t activation, int64_t dtype, int64_t device,
           const std::vector<int64_t>& widths, int64_t bias_mask, int64_t bucket, int64_t tf32) {
    TORCH_CHECK(widths.size() >= 2 && widths.size() <= dualk::kMaxMlpLayers + 1,
                "dualk.fused_mlp plan: 1..", dualk::kMaxMlpLayers, " layers");
    TORCH_CHECK(bucket >= 0 && bucket < 64, "dualk.fused_mlp plan: row bucket out of range");
    PlannedClass c{};
    c.kind = static_cast<int>(kind);
    c.activation = static_cast<int>(activation);
    c.dtype = scalar_type_of(dtype);
    c.device = static_cast<int>(device);
    c.layers = static_cast<int>(widths.size()) - 1;
    for (size_t i = 0; i < widths.size(); ++i) c.widths[i] = widths[i];
    c.bias_mask = static_cast<uint32_t>(bias_mask);
    c.tf32 = c.kind == 1 && c.dtype == at::kFloat ? static_cast<int>(tf32 != 0) : -1;
    const uint64_t bits = c.kind == 0 ? ~uint64_t{0} : uint64_t{1} << bucket;
    for (auto& known : classes_) {
      if (same_class(known, c)) {
        known.row_buckets |= bits;
        return;
      }
    }
    if (classes_.size() >= kMaxClasses) classes_.clear();
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(c.device));
    c.num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    c.row_buckets = bits;
    classes_.push_back(c);
  }

  void clear() { classes_.clear(); }
  size_t size() const { return classes_.size(); }

  // mlp(x) where the operands belong to a planned class of this kind and activation; nullopt
  // where they do not (or the launcher refuses them: alignment), for the caller's full route.
  std::optional<at::Tensor> run(const MlpOperands& ops, int kind, int activation) const {
    if (classes_.empty()) return std::nullopt;
    const at::Tensor& x = *ops.x;
    const int layers = ops.layers;
    if (layers < 1 || layers > dualk::kMaxMlpLayers || !x.is_cuda() || x.dim() < 1 ||
        !x.is_contiguous())
      return std::nullopt;
    const at::ScalarType dtype = x.scalar_type();
    const int device = x.get_device();
    std::array<int64_t, dualk::kMaxMlpLayers + 1> widths{};
    widths[0] = x.size(-1);
    if (widths[0] <= 0) return std::nullopt;
    const int64_t rows = x.numel() / widths[0];
    if (rows <= 0) return std::nullopt;
    uint32_t mask = 0;
    for (int i = 0; i < layers; ++i) {
      const at::Tensor& w = *ops.weights[i];
      if (!w.is_cuda() || w.get_device() != device || w.scalar_type() != dtype || w.dim() != 2 ||
          w.size(1) != widths[i] || !w.is_contiguous())
        return std::nullopt;
      widths[i + 1] = w.size(0);
      const at::Tensor* b = ops.biases[i];
      if (b == nullptr) continue;
      if (!b->is_cuda() || b->get_device() != device || b->scalar_type() != dtype ||
          b->dim() != 1 || b->size(0) != widths[i + 1] || !b->is_contiguous())
        return std::nullopt;
      mask |= 1u << i;
    }
    const uint64_t bucket = uint64_t{1} << bit_length(static_cast<uint64_t>(rows - 1));
    const int tf32 =
        dtype == at::kFloat ? static_cast<int>(at::globalContext().allowTF32CuBLAS()) : -1;
    const PlannedClass* found = nullptr;
    for (const auto& c : classes_) {
      if (c.kind == kind && c.activation == activation && c.dtype == dtype && c.device == device &&
          c.layers == layers && c.bias_mask == mask && (c.row_buckets & bucket) != 0 &&
          (c.tf32 < 0 || c.tf32 == tf32) &&
          std::equal(widths.begin(), widths.begin() + layers + 1, c.widths.begin())) {
        found = &c;
        break;
      }
    }
    if (found == nullptr) return std::nullopt;
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = widths[layers];
    at::Tensor out = at::empty(shape, x.options());
    dualk::FusedMlpArgs args{};
    args.num_layers = layers;
    for (int i = 0; i <= layers; ++i) args.widths[i] = static_cast<int>(widths[i]);
    args.dtype = dtype_code(out);
    args.activation = static_cast<dualk::Activation>(activation);
    args.x = x.data_ptr();
    args.stride_xm = widths[0];
    args.out = out.data_ptr();
    args.m = rows;
    for (int i = 0; i < layers; ++i) {
      args.weights[i] = ops.weights[i]->data_ptr();
      args.biases[i] = ops.biases[i] == nullptr ? nullptr : ops.biases[i]->data_ptr();
    }
    args.num_sms = found->num_sms;
    const cudaError_t err = dualk::launch_fused_mlp(args, at::cuda::getCurrentCUDAStream());
    if (err == cudaErrorInvalidValue) return std::nullopt;  // refused (alignment): the full route
    check_launch("fused_mlp", err);
    return out;
  }

 private:
  static bool same_class(const PlannedClass& a, const PlannedClass& b) {
    return a.kind == b.kind && a.activation == b.activation && a.dtype == b.dtype &&
           a.device == b.device && a.layers == b.layers && a.bias_mask == b.bias_mask &&
           a.tf32 == b.tf32 &&
           std::equal(a.widths.begin(), a.widths.begin() + a.layers + 1, b.widths.begin());
  }

  std::vector<PlannedClass> classes_;
};

// What register_ops() hands over from the Python side. Never destroyed (the interpreter may be
// gone by the time static destructors run): plain pointers, owned references.
struct Registration {
  std::vector<std::pair<std::string, int>> activations;  // fused_mlp's names -> launchers.h codes
  PyObject* parameter_type = nullptr;                    // torch.nn.Parameter
  PyObject* usable = nullptr;    // usable(is_auto: bool) -> bool: may plans serve a call now?
  PyObject* fallback = nullptr;  // the op's Python kernel: the full route
  torch::Library* library = nullptr;
};

PlannedCalls& planned() {
  static auto* calls = new PlannedCalls();
  return *calls;
}

Registration& registration() {
  static auto* r = new Registration();
  return *r;
}

int activation_code(const char* name, size_t size) {
  for (const auto& a : registration().activations)
    if (a.first.size() == size && a.first.compare(0, size, name, size) == 0) return a.second;
  return -1;
}

int kind_of(const char* name, size_t size) {
  const std::string_view s(name, size);
  return s == "cuda" ? 0 : s == "auto" ? 1 : -1;
}

bool plain_tensor(PyObject* obj) {  // a torch.Tensor or nn.Parameter, not another subclass
  return THPVariable_CheckExact(obj) ||
         (registration().parameter_type != nullptr &&
          Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(registration().parameter_type));
}

// dualk.fused_mlp's planned call (dualk/runtime/operators.py run_planned_mlp, after its own
// checks): mlp(x), or None where the call is not a planned one.
py::object planned_run(py::handle x, py::handle weights, py::handle biases, py::handle activation,
                       py::handle backend) {
  if (planned().size() == 0 || !plain_tensor(x.ptr()) || !PyUnicode_Check(activation.ptr()) ||
      !PyUnicode_Check(backend.ptr()) || torch::jit::tracer::isTracing() ||
      at::autocast::is_autocast_enabled(at::kCUDA) || at::autocast::is_autocast_enabled(at::kCPU))
    return py::none();
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(backend.ptr(), &size);
  if (text == nullptr) {
    PyErr_Clear();
    return py::none();
  }
  const int kind = kind_of(text, static_cast<size_t>(size));
  text = PyUnicode_AsUTF8AndSize(activation.ptr(), &size);
  if (text == nullptr) {
    PyErr_Clear();
    return py::none();
  }
  const int act = activation_code(text, static_cast<size_t>(size));
  PyObject* ws = weights.ptr();
  PyObject* bs = biases.ptr();
  const bool ws_list = PyList_CheckExact(ws);
  if (kind < 0 || act < 0 || !(ws_list || PyTuple_CheckExact(ws))) return py::none();
  const Py_ssize_t layers = ws_list ? PyList_GET_SIZE(ws) : PyTuple_GET_SIZE(ws);
  const bool no_biases = bs == Py_None;
  const bool bs_list = PyList_CheckExact(bs);
  if (!no_biases && !(bs_list || PyTuple_CheckExact(bs))) return py::none();
  if (layers < 1 || layers > dualk::kMaxMlpLayers ||
      (!no_biases && (bs_list ? PyList_GET_SIZE(bs) : PyTuple_GET_SIZE(bs)) != layers))
    return py::none();
  const bool grad = at::GradMode::is_enabled();
  MlpOperands ops;
  ops.x = &THPVariable_Unpack(x.ptr());
  if (grad && ops.x->requires_grad()) return py::none();
  ops.layers = static_cast<int>(layers);
  for (Py_ssize_t i = 0; i < layers; ++i) {
    PyObject* w = ws_list ? PyList_GET_ITEM(ws, i) : PyTuple_GET_ITEM(ws, i);
    if (!plain_tensor(w)) return py::none();
    ops.weights[i] = &THPVariable_Unpack(w);
    if (grad && ops.weights[i]->requires_grad()) return py::none();
    PyObject* b = no_biases ? Py_None : bs_list ? PyList_GET_ITEM(bs, i) : PyTuple_GET_ITEM(bs, i);
    if (b == Py_None) continue;
    if (!plain_tensor(b)) return py::none();
    ops.biases[i] = &THPVariable_Unpack(b);
    if (grad && ops.biases[i]->requires_grad()) return py::none();
  }
  auto out = planned().run(ops, kind, act);
  if (!out.has_value()) return py::none();
  return py::cast(std::move(*out));
}

// The Python error in flight, as PyTorch's own C++ code raises it (its catch sites restore it).
[[noreturn]] void throw_python_error() {
  python_error e;
  e.persist();
  throw e;
}

// dualk::fused_mlp_infer's CUDA kernel (compiled inference graphs call it; its schema, fake and
// Python kernel are in dualk/autograd/library.py): a planned call straight from the dispatcher,
// else the Python kernel (the full route, which plans the class when it can).
at::Tensor fused_mlp_infer_cuda(const at::Tensor& x, at::TensorList weights,
                                const c10::List<std::optional<at::Tensor>>& biases,
                                c10::string_view activation, c10::string_view backend) {
  py::gil_scoped_acquire gil;
  Registration& reg = registration();
  const int kind = kind_of(backend.data(), backend.size());
  const int act = activation_code(activation.data(), activation.size());
  const int layers = static_cast<int>(weights.size());
  if (kind >= 0 && act >= 0 && layers >= 1 && layers <= dualk::kMaxMlpLayers &&
      static_cast<int>(biases.size()) == layers) {
    PyObject* ok = PyObject_CallOneArg(reg.usable, kind == 1 ? Py_True : Py_False);
    if (ok == nullptr) throw_python_error();
    const bool usable = ok == Py_True;
    Py_DECREF(ok);
    if (usable) {
      std::array<std::optional<at::Tensor>, dualk::kMaxMlpLayers> held;
      MlpOperands ops;
      ops.x = &x;
      ops.layers = layers;
      for (int i = 0; i < layers; ++i) {
        ops.weights[i] = &weights[i];
        held[i] = biases.get(i);
        ops.biases[i] = held[i].has_value() ? &*held[i] : nullptr;
      }
      auto out = planned().run(ops, kind, act);
      if (out.has_value()) return std::move(*out);
    }
  }
  py::list ws;
  for (const auto& w : weights) ws.append(py::cast(w));
  py::list bs;
  for (size_t i = 0; i < biases.size(); ++i) {
    const std::optional<at::Tensor> b = biases.get(i);
    if (b.has_value())
      bs.append(py::cast(*b));
    else
      bs.append(py::none());
  }
  const py::str act_text(activation.data(), activation.size());
  const py::str backend_text(backend.data(), backend.size());
  PyObject* out = PyObject_CallFunctionObjArgs(reg.fallback, py::cast(x).ptr(), ws.ptr(), bs.ptr(),
                                               act_text.ptr(), backend_text.ptr(), nullptr);
  if (out == nullptr) throw_python_error();
  const auto result = py::reinterpret_steal<py::object>(out);
  return result.cast<at::Tensor>();
}

// Takes what the Python side hands over, then registers fused_mlp_infer's CUDA kernel (once
// per process: the Python side calls this for the first mlp extension it loads). activations:
// {fused_mlp name: launchers.h code}. Raises where the kernel cannot be registered (planned_run
// works regardless).
void register_ops(const py::dict& activations, const py::object& parameter_type,
                  const py::object& usable, const py::object& fallback) {
  Registration& reg = registration();
  TORCH_CHECK(reg.usable == nullptr, "dualk: the mlp extension's ops are registered already");
  for (const auto& item : activations)
    reg.activations.emplace_back(item.first.cast<std::string>(), item.second.cast<int>());
  reg.parameter_type = parameter_type.inc_ref().ptr();
  reg.usable = usable.inc_ref().ptr();
  reg.fallback = fallback.inc_ref().ptr();
  auto* library = new torch::Library(torch::Library::IMPL, "dualk",
                                     std::optional<c10::DispatchKey>(c10::DispatchKey::CUDA),
                                     __FILE__, __LINE__);
  library->impl("fused_mlp_infer", TORCH_FN(fused_mlp_infer_cuda));
  reg.library = library;
}

void planned_add(int64_t kind, int64_t activation, int64_t dtype, int64_t device,
                 const std::vector<int64_t>& widths, int64_t bias_mask, int64_t bucket,
                 int64_t tf32) {
  planned().add(kind, activation, dtype, device, widths, bias_mask, bucket, tf32);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "dualk CUDA kernels, fused MLP family (see cuda_src/launchers.h)";
  m.def("fused_mlp", &fused_mlp, "the whole MLP in one launch");
  m.def("fused_mlp_unsupported_reason", &fused_mlp_unsupported_reason,
        "None if the fused kernel holds these widths on chip, else why not");
  m.def("fused_mlp_kernel", &fused_mlp_kernel,
        "which kernel fused_mlp launches for these tensors (None: it would refuse them)");
  py::class_<MlpPlan>(m, "MlpPlan", "FusedMLP's planned inference call (dualk/nn.py _FastPath)",
                      dualk::plan_gc_type_setup<MlpPlan>())
      .def(py::init<const py::list&, const py::list&, int64_t, int64_t, bool, const py::tuple&,
                    const py::tuple&>())
      .def("run", &MlpPlan::run,
           "module(x), or None where the call does not fit the plan (every guard checked)")
      .def("run_in_forward", &MlpPlan::run_in_forward,
           "module.forward(x) inside nn.Module's call, or None (the call guards left to it)")
      .def("with_call_guards", &MlpPlan::with_call_guards,
           "a copy whose run() also checks these guards")
      .def("guards_hold", &MlpPlan::guards_hold, "whether the planned Python-side state holds");
  m.def("register_ops", &register_ops,
        "registers dualk::fused_mlp_infer's CUDA kernel (activations, nn.Parameter, usable, "
        "fallback)");
  m.def("planned_add", &planned_add,
        "plans a class: (kind 0 cuda / 1 auto, activation code, dtype code, device, widths, bias "
        "mask, row bucket, tf32)");
  m.def("planned_clear", [] { planned().clear(); }, "forgets every planned class");
  m.def("planned_size", [] { return planned().size(); }, "how many classes are planned");
  m.def("planned_run", &planned_run,
        "mlp(x) for a call of a planned class (x, weights, biases, activation, backend), else "
        "None");
}
