// Shared by the elementwise harnesses (elementwise_bench.cu, relu_scale_variants.cu): error
// check, the two operators as the library defines them, and event timing after an L2 flush.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "elementwise.cuh"

#define CHECK(x)                                                                          \
  do {                                                                                    \
    cudaError_t e = (x);                                                                  \
    if (e != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

namespace harness {

struct ReluScale {
  float scale;
  __device__ float operator()(const float (&v)[1]) const { return dualk::relu(v[0]) * scale; }
};
struct Add {
  float alpha;
  __device__ float operator()(const float (&v)[2]) const { return v[0] + alpha * v[1]; }
};

constexpr size_t kFlushBytes = size_t(256) << 20;  // more than the 50-60 MB L2 of H100/H200

// Median event time in us of `launch` over `reps` repetitions (after 3 warm-ups), each after a
// memset of 256 MB that evicts the operands from L2. flush_byte < 0 writes the repetition index
// (elementwise_bench.cu's method), else that byte (0: zeros, as triton's do_bench).
template <typename F> float median_us(F&& launch, int reps, int flush_byte) {
  static void* flush_buffer = nullptr;
  if (flush_buffer == nullptr) CHECK(cudaMalloc(&flush_buffer, kFlushBytes));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < reps + 3; ++r) {
    CHECK(cudaMemsetAsync(flush_buffer, flush_byte < 0 ? r : flush_byte, kFlushBytes));
    CHECK(cudaEventRecord(a));
    launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r >= 3) t.push_back(ms * 1e3f);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace harness
