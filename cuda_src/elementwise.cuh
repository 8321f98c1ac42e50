// The elementwise engine behind add and relu_scale: an operator is a functor on fp32 values; this
// header supplies three walks over the output and picks one per call:
//   dense + 16-byte aligned : each thread moves kVecsPerThread 16-byte vectors per input (several
//                             loads in flight before the first use), plus a scalar tail;
//   dense, misaligned       : scalar, coalesced, kVecsPerThread independent elements per thread;
//   strided / broadcast     : scalar, each output index unravelled over the coalesced plan.
#pragma once

#include "common.cuh"

namespace dualk {
namespace elementwise {

// Threads per block and 16-byte vectors (or scalar elements) per thread: several independent
// loads in flight per thread. A template parameter so experiments/elementwise_bench.cu can
// time alternatives; the library uses DefaultShape.
template <int kThreadsPerBlock, int kItemsPerThread> struct BlockShape {
  static constexpr int kThreads = kThreadsPerBlock;
  static constexpr int kVecsPerThread = kItemsPerThread;
};
// One 16-byte vector per thread measured best on an H200 (experiments/elementwise_bench.cu,
// relu_scale fp32 2^24: 35.8 us = the copy of the same bytes, vs 36.9 us at 4 vectors/thread).
using DefaultShape = BlockShape<256, 1>;

template <int kArity> struct Operands {
  const void* data[kArity];
  int64_t strides[kArity][kMaxDims];
};

struct Extents {
  int ndim;
  int64_t sizes[kMaxDims];
};

template <typename T, int kArity, typename Op, typename Shape>
__global__ void __launch_bounds__(Shape::kThreads)
    dense_vector_kernel(Operands<kArity> in, T* __restrict__ out, int64_t numel, Op op) {
  constexpr int kThreads = Shape::kThreads, kVecsPerThread = Shape::kVecsPerThread;
  constexpr int kVec = 16 / sizeof(T);
  const int64_t num_vecs = numel / kVec;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads * kVecsPerThread + threadIdx.x;

  uint4 loaded[kArity][kVecsPerThread];
#pragma unroll
  for (int u = 0; u < kVecsPerThread; ++u) {
    const int64_t v = first + static_cast<int64_t>(u) * kThreads;
#pragma unroll
    for (int i = 0; i < kArity; ++i)
      if (v < num_vecs) loaded[i][u] = reinterpret_cast<const uint4*>(in.data[i])[v];
  }
#pragma unroll
  for (int u = 0; u < kVecsPerThread; ++u) {
    const int64_t v = first + static_cast<int64_t>(u) * kThreads;
    if (v >= num_vecs) continue;
    uint4 result;
    T* r = reinterpret_cast<T*>(&result);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      float args[kArity];
#pragma unroll
      for (int i = 0; i < kArity; ++i)
        args[i] = to_float(reinterpret_cast<const T*>(&loaded[i][u])[e]);
      r[e] = from_float<T>(op(args));
    }
    reinterpret_cast<uint4*>(out)[v] = result;
  }
  // The last numel % kVec elements: one each for the first threads of block 0.
  if (blockIdx.x == 0 && threadIdx.x < numel - num_vecs * kVec) {
    const int64_t idx = num_vecs * kVec + threadIdx.x;
    float args[kArity];
#pragma unroll
    for (int i = 0; i < kArity; ++i) args[i] = to_float(static_cast<const T*>(in.data[i])[idx]);
    out[idx] = from_float<T>(op(args));
  }
}

// Offset of output element `idx` in an operand with `strides` over `shape` (row-major unravel).
__device__ __forceinline__ int64_t strided_offset(int64_t idx, const Extents& shape,
                                                  const int64_t (&strides)[kMaxDims]) {
  int64_t offset = 0;
#pragma unroll
  for (int d = kMaxDims - 1; d >= 0; --d) {
    if (d >= shape.ndim) continue;
    const int64_t size = shape.sizes[d];
    offset += (idx % size) * strides[d];
    idx /= size;
  }
  return offset;
}

template <typename T, int kArity, typename Op, bool kDense, typename Shape>
__global__ void __launch_bounds__(Shape::kThreads)
    scalar_kernel(Operands<kArity> in, T* __restrict__ out, int64_t numel, Extents shape, Op op) {
  constexpr int kThreads = Shape::kThreads, kVecsPerThread = Shape::kVecsPerThread;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads * kVecsPerThread + threadIdx.x;
  float args[kVecsPerThread][kArity];
#pragma unroll
  for (int u = 0; u < kVecsPerThread; ++u) {
    const int64_t idx = first + static_cast<int64_t>(u) * kThreads;
    if (idx >= numel) continue;
#pragma unroll
    for (int i = 0; i < kArity; ++i) {
      const int64_t offset = kDense ? idx : strided_offset(idx, shape, in.strides[i]);
      args[u][i] = to_float(static_cast<const T*>(in.data[i])[offset]);
    }
  }
#pragma unroll
  for (int u = 0; u < kVecsPerThread; ++u) {
    const int64_t idx = first + static_cast<int64_t>(u) * kThreads;
    if (idx < numel) out[idx] = from_float<T>(op(args[u]));
  }
}

template <typename T, int kArity, typename Op, typename Shape = DefaultShape>
cudaError_t launch_typed(const Operands<kArity>& in, void* out, const ElementwiseShape& plan,
                         bool dense, Op op, cudaStream_t stream) {
  if (plan.numel == 0) return cudaSuccess;
  constexpr int kThreads = Shape::kThreads;
  constexpr int64_t kPerBlock = int64_t{kThreads} * Shape::kVecsPerThread;
  bool all_aligned = is_aligned16(out);
  for (int i = 0; i < kArity; ++i) all_aligned = all_aligned && is_aligned16(in.data[i]);
  T* typed_out = static_cast<T*>(out);
  if (dense && all_aligned) {
    constexpr int kVec = 16 / sizeof(T);
    const int64_t blocks = ceil_div(plan.numel / kVec, kPerBlock);
    dense_vector_kernel<T, kArity, Op, Shape>
        <<<static_cast<unsigned>(blocks > 0 ? blocks : 1), kThreads, 0, stream>>>(in, typed_out,
                                                                                  plan.numel, op);
    return cudaGetLastError();
  }
  Extents shape{};
  shape.ndim = plan.ndim;
  for (int d = 0; d < plan.ndim; ++d) shape.sizes[d] = plan.sizes[d];
  const unsigned blocks = static_cast<unsigned>(ceil_div(plan.numel, kPerBlock));
  if (dense)
    scalar_kernel<T, kArity, Op, true, Shape>
        <<<blocks, kThreads, 0, stream>>>(in, typed_out, plan.numel, shape, op);
  else
    scalar_kernel<T, kArity, Op, false, Shape>
        <<<blocks, kThreads, 0, stream>>>(in, typed_out, plan.numel, shape, op);
  return cudaGetLastError();
}

// Runs `op` (a functor taking `const float (&)[kArity]`) over the plan in the given dtype.
template <int kArity, typename Op>
cudaError_t launch(const StridedOperand (&operands)[kArity], void* out,
                   const ElementwiseShape& plan, bool dense, DType dtype, Op op,
                   cudaStream_t stream) {
  Operands<kArity> in{};
  for (int i = 0; i < kArity; ++i) {
    in.data[i] = operands[i].data;
    for (int d = 0; d < kMaxDims; ++d) in.strides[i][d] = operands[i].strides[d];
  }
  switch (dtype) {
    case DType::kFloat32:
      return launch_typed<float, kArity>(in, out, plan, dense, op, stream);
    case DType::kFloat16:
      return launch_typed<__half, kArity>(in, out, plan, dense, op, stream);
    case DType::kBFloat16:
      return launch_typed<__nv_bfloat16, kArity>(in, out, plan, dense, op, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace elementwise
}  // namespace dualk
