// The gemm family's extension (dualk/backends/cuda.py FAMILIES["gemm"]): matmul, linear_gelu and
// linear_glu, one tiled core.
// Torch-side helpers: binding.h.
#include <limits>

#include "binding.h"

namespace {

using dualk_binding::check_launch;
using dualk_binding::check_operand;
using dualk_binding::dtype_code;
using dualk_binding::unit_stride;

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
  return {{t.size(0), t.size(1), t.size(2)},
          {t.size(0) == 1 ? 0 : t.stride(0), t.stride(1), t.stride(2)}};
}

// An nn.Linear weight (n, k) read as the GEMM's B = weight^T: (1, k, n).
Dims3 transposed_weight(const char* op, const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2, "dualk.", op, ": 'weight' must be 2-dim (out, in), got ", w.dim(),
              " dims");
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
  auto args =
      gemm_args("matmul", a, dims3("matmul", "a", a), b, dims3("matmul", "b", b), out, allow_tf32);
  const c10::cuda::CUDAGuard guard(out.device());
  const at::Tensor workspace = split_k_workspace(args, out);
  check_launch("matmul", dualk::launch_matmul(args, at::cuda::getCurrentCUDAStream()));
}

// x: (m, k); weight: (n, k) as nn.Linear holds it; bias: (n,) or None; out: (m, n).
void linear_gelu_rows(const at::Tensor& x, const Dims3& x_rows, const at::Tensor& weight,
                      const std::optional<at::Tensor>& bias, at::Tensor& out, int64_t activation,
                      bool allow_tf32) {
  auto args = gemm_args("linear_gelu", x, x_rows, weight, transposed_weight("linear_gelu", weight),
                        out, allow_tf32);
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

void linear_gelu(const at::Tensor& x, const at::Tensor& weight,
                 const std::optional<at::Tensor>& bias, at::Tensor& out, int64_t activation,
                 bool allow_tf32) {
  linear_gelu_rows(x, dims3("linear_gelu", "x", x), weight, bias, out, activation, allow_tf32);
}

// x: (m, k); weight_gate, weight_up: (n, k) as nn.Linear holds them (unit stride along k or n);
// biases: (n,) or None; out: (m, n). The portable route's fp32 scratch comes from PyTorch's
// caching allocator, as split-K's does.
dualk::GluArgs glu_args(const at::Tensor& x, const Dims3& x_rows, const at::Tensor& weight_gate,
                        const at::Tensor& weight_up, const std::optional<at::Tensor>& bias_gate,
                        const std::optional<at::Tensor>& bias_up, const at::Tensor& out,
                        int64_t activation, bool allow_tf32) {
  const char* op = "linear_glu";
  TORCH_CHECK(out.dim() == 2, "dualk.linear_glu: the output must be 2-dim");
  dualk::GluArgs args{};
  args.gate =
      gemm_args(op, x, x_rows, weight_gate, transposed_weight(op, weight_gate), out, allow_tf32);
  args.up = gemm_args(op, x, x_rows, weight_up, transposed_weight(op, weight_up), out, allow_tf32);
  const std::optional<at::Tensor>* biases[2] = {&bias_gate, &bias_up};
  dualk::GemmArgs* gemms[2] = {&args.gate, &args.up};
  const char* names[2] = {"bias_gate", "bias_up"};
  for (int i = 0; i < 2; ++i) {
    if (!biases[i]->has_value()) continue;
    const at::Tensor& b = **biases[i];
    check_operand(op, names[i], b, out);
    TORCH_CHECK(b.is_contiguous() && b.numel() == args.gate.n, "dualk.linear_glu: '", names[i],
                "' must be contiguous with out_features elements");
    gemms[i]->bias = b.data_ptr();
  }
  args.gate.activation = args.up.activation = static_cast<dualk::Activation>(activation);
  return args;
}

void launch_glu(dualk::GluArgs& args, const at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(out.device());
  at::Tensor workspace;
  if (const int64_t floats = dualk::linear_glu_workspace_floats(args); floats > 0) {
    workspace = at::empty({floats}, out.options().dtype(at::kFloat));
    args.workspace = workspace.data_ptr<float>();
    args.workspace_floats = floats;
  }
  check_launch("linear_glu", dualk::launch_linear_glu(args, at::cuda::getCurrentCUDAStream()));
}

void linear_glu(const at::Tensor& x, const at::Tensor& weight_gate, const at::Tensor& weight_up,
                const std::optional<at::Tensor>& bias_gate,
                const std::optional<at::Tensor>& bias_up, at::Tensor& out, int64_t activation,
                bool allow_tf32) {
  TORCH_CHECK(x.dim() == 2, "dualk.linear_glu: 'x' must be 2-dim");
  dualk::GluArgs args = glu_args(x, dims3("linear_glu", "x", x), weight_gate, weight_up, bias_gate,
                                 bias_up, out, activation, allow_tf32);
  launch_glu(args, out);
}

// ------------------------------------------------- calls whose output is made here
// The Python backend functions (dualk/backends/cuda.py linear_gelu, linear_glu) first try these:
// the output allocated, x read as its rows and the result shaped (..., n) here, not by Python's
// torch.empty, reshape and view calls (on an H200 host: 31.5 us for the backend function against
// 14.4 us for the launcher alone, linear_gelu 16 x 768 -> 3072 bf16; experiments/
// host_gemm_pieces.py). They return None where the operands need the Python function's copies
// or reshapes (the rare layouts), or nothing is to be computed.

// x (..., k) as its rows (1, rows, k) with unit stride along k, where the rows are one strided run
// without a copy: a 2-dim x with unit stride along k, or a contiguous x of more dims.
std::optional<Dims3> rows_of(const at::Tensor& x) {
  const int64_t dims = x.dim();
  if (dims < 2) return std::nullopt;
  const int64_t k = x.size(dims - 1);
  if (k <= 0 || x.numel() == 0) return std::nullopt;
  if (dims == 2) {
    if (x.stride(1) != 1 && k > 1) return std::nullopt;
    return Dims3{{1, x.size(0), k}, {0, x.stride(0), 1}};
  }
  if (!x.is_contiguous()) return std::nullopt;
  return Dims3{{1, x.numel() / k, k}, {0, k, 1}};
}

// nn.Linear's weight (n, k) with unit stride along k or n, n > 0 (the launchers read it as is).
bool linear_weight_ok(const at::Tensor& w) {
  return w.dim() == 2 && w.size(0) > 0 && (unit_stride(w, 1) || unit_stride(w, 0));
}

bool bias_ok(const std::optional<at::Tensor>& b) { return !b.has_value() || b->is_contiguous(); }

// The output (..., n) for x (..., k), NaN-filled where dualk's test mode poisons outputs; made
// in its own shape, not as a view of a (rows, n) tensor: a view returned from the autograd
// Function cannot be modified in place (y.add_(1) under autograd raises).
at::Tensor new_output(const at::Tensor& x, int64_t n, bool poison) {
  at::Tensor out;
  if (x.dim() == 2) {
    out = at::empty({x.size(0), n}, x.options());
  } else {
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = n;
    out = at::empty(shape, x.options());
  }
  if (poison) out.fill_(std::numeric_limits<float>::quiet_NaN());
  return out;
}

// The output as the launchers write it: (rows, n).
at::Tensor as_rows_out(const at::Tensor& out, const Dims3& rows) {
  return out.dim() == 2 ? out : out.view({rows.size[1], out.size(-1)});
}

std::optional<at::Tensor> linear_gelu_new(const at::Tensor& x, const at::Tensor& weight,
                                          const std::optional<at::Tensor>& bias, int64_t activation,
                                          bool allow_tf32, bool poison) {
  const std::optional<Dims3> rows = rows_of(x);
  if (!rows || !linear_weight_ok(weight) || !bias_ok(bias)) return std::nullopt;
  at::Tensor out = new_output(x, weight.size(0), poison);
  at::Tensor out_rows = as_rows_out(out, *rows);
  linear_gelu_rows(x, *rows, weight, bias, out_rows, activation, allow_tf32);
  return out;
}

std::optional<at::Tensor> linear_glu_new(const at::Tensor& x, const at::Tensor& weight_gate,
                                         const at::Tensor& weight_up,
                                         const std::optional<at::Tensor>& bias_gate,
                                         const std::optional<at::Tensor>& bias_up,
                                         int64_t activation, bool allow_tf32, bool poison) {
  const std::optional<Dims3> rows = rows_of(x);
  if (!rows || !linear_weight_ok(weight_gate) || !linear_weight_ok(weight_up) ||
      !bias_ok(bias_gate) || !bias_ok(bias_up))
    return std::nullopt;
  at::Tensor out = new_output(x, weight_gate.size(0), poison);
  const at::Tensor out_rows = as_rows_out(out, *rows);
  dualk::GluArgs args = glu_args(x, *rows, weight_gate, weight_up, bias_gate, bias_up, out_rows,
                                 activation, allow_tf32);
  launch_glu(args, out_rows);
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "dualk CUDA kernels, GEMM family (see cuda_src/launchers.h)";
  m.def("matmul", &matmul, "out[b] = a[b] @ b[b]");
  m.def("linear_gelu", &linear_gelu, "out = gelu(x @ weight_t + bias)");
  m.def(
      "linear_glu_route",
      [](const at::Tensor& x, const at::Tensor& wg, const at::Tensor& wu, const at::Tensor& out) {
        const c10::cuda::CUDAGuard guard(out.device());
        return std::string(dualk::linear_glu_route_name(
            glu_args(x, dims3("linear_glu", "x", x), wg, wu, {}, {}, out, 4, false)));
      },
      "which route linear_glu takes for these tensors (launches nothing)");
  m.def("linear_glu", &linear_glu,
        "out = act(x @ weight_gate_t + bias_gate) * (x @ weight_up_t + bias_up)");
  m.def("linear_gelu_new", &linear_gelu_new,
        "linear_gelu's output (..., n) made here, or None where Python must copy or reshape");
  m.def("linear_glu_new", &linear_glu_new,
        "linear_glu's output (..., n) made here, or None where Python must copy or reshape");
}
