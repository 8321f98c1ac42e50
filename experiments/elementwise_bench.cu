// Times dualk's elementwise engine (cuda_src/elementwise.cuh) with several block shapes on
// relu_scale and add at 2^24 and 2^28 elements, fp32 and bf16, against a device-to-device copy of
// the same bytes. Build and run on a GPU:
//   nvcc -O3 -std=c++17 -Icuda_src -gencode=arch=compute_90a,code=sm_90a \
//        experiments/elementwise_bench.cu -o /tmp/eb && /tmp/eb
#include "elementwise_harness.cuh"

namespace {
using namespace dualk;
using harness::Add;
using harness::ReluScale;

__global__ void fill(float* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    p[i] = (float(h & 0xffff) / 32768.f) - 1.f + 1e-3f;  // in [-1, 1), never all zeros
  }
}

template <typename F> float median_us(F&& launch) { return harness::median_us(launch, 30, -1); }

template <typename T, int kArity, typename Op, typename Shape>
float time_variant(const char* name, void* const* in, void* out, int64_t n, Op op, float copy_us) {
  elementwise::Operands<kArity> ops{};
  for (int i = 0; i < kArity; ++i) ops.data[i] = in[i];
  ElementwiseShape plan{};
  plan.ndim = 1;
  plan.sizes[0] = n;
  plan.numel = n;
  float us = median_us([&] {
    CHECK((elementwise::launch_typed<T, kArity, Op, Shape>(ops, out, plan, true, op, 0)));
  });
  double bytes = double(n) * sizeof(T) * (kArity + 1);
  std::printf("  %-22s %9.2f us %7.0f GB/s  (copy of the same bytes: %.2f us)\n", name, us,
              bytes / us / 1e3, copy_us);
  return us;
}

template <typename T, int kArity, typename Op>
void sweep(const char* what, int64_t n, Op op) {
  std::printf("%s n=%lld %s\n", what, (long long)n, sizeof(T) == 4 ? "fp32" : "bf16");
  void* in[2];
  void* out;
  for (int i = 0; i < kArity; ++i) {
    CHECK(cudaMalloc(&in[i], n * sizeof(float)));
    fill<<<1024, 256>>>(static_cast<float*>(in[i]), n * sizeof(T) / 4, 17 + i);
  }
  CHECK(cudaMalloc(&out, n * sizeof(T)));
  size_t bytes = n * sizeof(T) * kArity;  // a copy moving (arity) inputs' bytes in and out
  float copy_us = median_us([&] { CHECK(cudaMemcpyAsync(out, in[0], std::min(bytes, n * sizeof(T)), cudaMemcpyDeviceToDevice)); });
  time_variant<T, kArity, Op, elementwise::BlockShape<256, 4>>("256 thr x 4 vec", in, out, n, op, copy_us);
  time_variant<T, kArity, Op, elementwise::BlockShape<256, 2>>("256 thr x 2 vec", in, out, n, op, copy_us);
  time_variant<T, kArity, Op, elementwise::BlockShape<256, 1>>("256 thr x 1 vec (lib)", in, out, n, op, copy_us);
  time_variant<T, kArity, Op, elementwise::BlockShape<128, 4>>("128 thr x 4 vec", in, out, n, op, copy_us);
  time_variant<T, kArity, Op, elementwise::BlockShape<128, 2>>("128 thr x 2 vec", in, out, n, op, copy_us);
  time_variant<T, kArity, Op, elementwise::BlockShape<512, 2>>("512 thr x 2 vec", in, out, n, op, copy_us);
  time_variant<T, kArity, Op, elementwise::BlockShape<128, 8>>("128 thr x 8 vec", in, out, n, op, copy_us);
  for (int i = 0; i < kArity; ++i) CHECK(cudaFree(in[i]));
  CHECK(cudaFree(out));
}
}  // namespace

int main() {
  for (int64_t n : {int64_t(1) << 24, int64_t(1) << 28}) {
    sweep<float, 1>("relu_scale", n, ReluScale{1.5f});
    sweep<__nv_bfloat16, 1>("relu_scale", n, ReluScale{1.5f});
    sweep<float, 2>("add", n, Add{1.f});
    sweep<__nv_bfloat16, 2>("add", n, Add{1.f});
  }
  return 0;
}
