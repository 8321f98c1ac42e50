// Every CUDA launcher dualk exposes, in plain C++ (no torch, no device code), so the binding file
// (compiled by the host compiler) and the kernel files (compiled by nvcc) share one declaration.
// Launchers take sizes, strides, raw pointers and the stream to launch on; they return the
// launch's cudaError_t (or cudaErrorInvalidValue for arguments they cannot serve).
#pragma once

#include <cuda_runtime.h>
#include <cstdint>

namespace dualk {

// Element types, numbered as dualk/backends/cuda.py passes them.
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };
inline int element_size(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }  // bytes

// Activations applied to an fp32 value before the down-cast; numbered as dualk/backends/cuda.py
// (ACTIVATION_CODES) and triton_src/common.py (ACT_*) number them.
enum class Activation : int { kNone = 0, kRelu = 1, kGeluTanh = 2, kGeluErf = 3, kSilu = 4 };

// ---------------------------------------------------------------- elementwise (add, relu_scale)
constexpr int kMaxDims = 8;

// An operand viewed over the output's shape: strides in elements (0 where it is broadcast).
struct StridedOperand {
  const void* data;
  int64_t strides[kMaxDims];
};

// The output's shape (already coalesced by the caller, at most kMaxDims dims); out is contiguous.
struct ElementwiseShape {
  int ndim;
  int64_t sizes[kMaxDims];
  int64_t numel;
};

// out = a + alpha * b over `shape`. When both operands are dense and in output order the caller
// sets `dense` and the kernel runs flat with 16-byte vectors where the pointers allow.
cudaError_t launch_add(const StridedOperand& a, const StridedOperand& b, void* out,
                       const ElementwiseShape& shape, bool dense, float alpha, DType dtype,
                       cudaStream_t stream);

// out = relu(x) * scale.
cudaError_t launch_relu_scale(const StridedOperand& x, void* out, const ElementwiseShape& shape,
                              bool dense, float scale, DType dtype, cudaStream_t stream);

// ---------------------------------------------------------------- GEMM family (matmul,
// linear_gelu, linear_glu) C[b] = act(A[b] @ B[b] + bias), fp32 accumulation, act and bias applied
// before the down-cast.
//   A: (m, k) with unit stride along k (row stride stride_am).
//   B: (k, n). b_k_major = false: unit stride along n, row stride stride_b_outer (= stride_bk).
//              b_k_major = true:  unit stride along k (B = W^T for a row-major W of shape (n, k)),
//                                 stride_b_outer = stride_bn.
//   bias: (n,) contiguous, or nullptr.   C: (m, n) with unit stride along n, row stride stride_cm.
// Batch strides may be 0 (a broadcast operand). k == 0 writes act(bias) (or zeros).
struct GemmArgs {
  const void* a;
  const void* b;
  const void* bias;
  void* c;
  int64_t batch, m, n, k;
  int64_t stride_a_batch, stride_am;
  int64_t stride_b_batch, stride_b_outer;
  bool b_k_major;
  int64_t stride_c_batch, stride_cm;
  DType dtype;
  Activation activation;
  // PyTorch's torch.backends.cuda.matmul.allow_tf32, passed along but read by no kernel: the
  // CUDA GEMMs compute fp32 exactly whatever the switch says (auto's key keeps TF32 calls a
  // class of their own, where PyTorch's TF32 path competes).
  bool allow_tf32;
  // Split-K scratch (fp32 partial products), sized by gemm_split_k_workspace_floats; nullptr
  // (the default) runs without split-K.
  float* workspace;
  int64_t workspace_floats;
};

// How many floats of workspace the GEMM family wants for these arguments on the current device:
// 0 unless split-K serves them (any dtype, one batch, too few output tiles to fill the GPU and
// a long k), then splits x m x n. The caller allocates it and sets args.workspace.
int64_t gemm_split_k_workspace_floats(const GemmArgs& args);

// matmul.cu: activation must be kNone and bias nullptr.
cudaError_t launch_matmul(const GemmArgs& args, cudaStream_t stream);
// linear_gelu.cu: activation kGeluTanh or kGeluErf, bias optional.
cudaError_t launch_linear_gelu(const GemmArgs& args, cudaStream_t stream);

// linear_glu.cu: out = act(x @ Wg^T + bg) * (x @ Wu^T + bu). `gate` and `up` are the two GEMMs'
// arguments as for linear_gelu (batch 1; the same a = x, m, n, k, dtype and c = out; each its own
// b = W^T and bias, nullptr when absent); gate.activation is the gate's (kSilu, kGeluTanh,
// kGeluErf or kRelu). Where the call takes the portable two-GEMM route the launcher wants
// linear_glu_workspace_floats floats of scratch (the fp32 pre-activations of a chunk of rows);
// without it, it runs the one-pass SIMT kernel instead. k == 0 writes act(bg) * bu (or zeros).
struct GluArgs {
  GemmArgs gate;
  GemmArgs up;
  float* workspace;
  int64_t workspace_floats;
};
int64_t linear_glu_workspace_floats(const GluArgs& args);
// Which route launch_linear_glu takes for these arguments (pointers included: alignment decides),
// as a static string (tests and benchmarks name the kernel they measured).
const char* linear_glu_route_name(const GluArgs& args);
cudaError_t launch_linear_glu(const GluArgs& args, cudaStream_t stream);

// ---------------------------------------------------------------- fused MLP
constexpr int kMaxMlpLayers = 8;

// out = L_{n-1}(act(... act(L_0(x)))) with L_i(h) = h @ W_i^T + b_i, all in one launch.
//   x: (m, widths[0]) with unit stride along features, row stride stride_xm.
//   weights[i]: (widths[i+1], widths[i]) row-major contiguous; biases[i]: (widths[i+1],) or
//   nullptr. out: (m, widths[num_layers]) contiguous.
struct FusedMlpArgs {
  const void* x;
  int64_t stride_xm;
  void* out;
  int64_t m;
  int num_layers;
  int widths[kMaxMlpLayers + 1];
  const void* weights[kMaxMlpLayers];
  const void* biases[kMaxMlpLayers];
  Activation activation;  // after every layer but the last
  DType dtype;
  int num_sms;  // of the launching device, for the persistent grid
};

// nullptr when launch_fused_mlp can hold this MLP on chip, else a static string saying why not
// (the Python layer then falls back to a per-layer chain and dualk.explain shows the reason).
const char* fused_mlp_unsupported_reason(const FusedMlpArgs& args);
// Which kernel launch_fused_mlp takes for these arguments (pointers included: alignment
// decides some plans), as a static string; nullptr where it would refuse them.
const char* fused_mlp_kernel_name(const FusedMlpArgs& args);
cudaError_t launch_fused_mlp(const FusedMlpArgs& args, cudaStream_t stream);

}  // namespace dualk
