// The torch side shared by dualk's CUDA bindings (binding_<family>.cpp, one extension per
// operator family: elementwise, gemm, mlp; dualk/backends/cuda.py FAMILIES). With the bindings,
// the only files of cuda_src/ that include torch: they check what the Python layer hands over (a
// second line of defence: dualk/core/validate.py already gave the user-facing errors), take the
// output tensor's device guard and current stream, and call the plain-C++ launchers.
#pragma once

#include <torch/extension.h>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <optional>
#include <vector>

#include "launchers.h"

namespace dualk_binding {

inline dualk::DType dtype_code(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return dualk::DType::kFloat32;
    case at::kHalf:
      return dualk::DType::kFloat16;
    case at::kBFloat16:
      return dualk::DType::kBFloat16;
    default:
      TORCH_CHECK(false, "dualk: unsupported dtype ", t.scalar_type());
  }
}

// `t` is a CUDA tensor on `like`'s device with `like`'s dtype.
inline void check_operand(const char* op, const char* name, const at::Tensor& t,
                          const at::Tensor& like) {
  TORCH_CHECK(t.is_cuda(), "dualk.", op, ": '", name, "' must be a CUDA tensor, got ", t.device());
  TORCH_CHECK(t.device() == like.device(), "dualk.", op, ": '", name, "' is on ", t.device(),
              " but the output is on ", like.device());
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), "dualk.", op, ": '", name, "' has dtype ",
              t.scalar_type(), " but the output has ", like.scalar_type());
}

inline void check_launch(const char* op, cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, "dualk.", op, ": CUDA launch failed: ", cudaGetErrorString(err));
}

// A dim of size <= 1 has no meaningful stride, so it counts as unit-stride.
inline bool unit_stride(const at::Tensor& t, int dim) {
  return t.stride(dim) == 1 || t.size(dim) <= 1;
}

}  // namespace dualk_binding
