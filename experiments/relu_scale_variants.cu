// relu_scale at 2^24 / 2^28 elements (bf16 and fp32): the library's dense kernel against variants
// that change only how bytes move (L2 prefetch-size hints, eviction priorities, TMA bulk copies
// through shared memory), next to a device-to-device copy of the same bytes. Every variant's
// output is compared bit for bit with the library kernel's. L2 flushed (256 MB memset) before
// each launch, median of 50. Build and run on an sm_90 GPU:
//   nvcc -O3 -std=c++17 -Icuda_src -gencode=arch=compute_90a,code=sm_90a \
//        experiments/relu_scale_variants.cu -o /tmp/rsv && /tmp/rsv
#include <cstring>

#include "elementwise_harness.cuh"

namespace {
using namespace dualk;
using harness::ReluScale;

__global__ void fill(uint32_t* p, int64_t words, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < words; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    // two bf16 / one fp32 value in [-2, 2): sign, small exponent, random mantissa
    p[i] = (h & 0x807f807fu) | 0x3f803f80u;
  }
}

enum LoadKind { kPlain, kPrefetch256, kNcPrefetch256, kEvictFirst, kEvictFirst256 };
enum StoreKind { kStPlain, kStNoAlloc, kStEvictLast };

template <LoadKind kLoad> __device__ __forceinline__ uint4 load16(const void* p) {
  uint4 v;
  if constexpr (kLoad == kPlain) {
    v = *reinterpret_cast<const uint4*>(p);
  } else if constexpr (kLoad == kPrefetch256) {
    asm volatile("ld.global.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  } else if constexpr (kLoad == kNcPrefetch256) {
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  } else if constexpr (kLoad == kEvictFirst) {
    asm volatile("{\n.reg .b64 pol;\ncreatepolicy.fractional.L2::evict_first.b64 pol, 1.0;\n"
                 "ld.global.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], pol;\n}" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  } else {
    asm volatile("{\n.reg .b64 pol;\ncreatepolicy.fractional.L2::evict_first.b64 pol, 1.0;\n"
                 "ld.global.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4], pol;\n}" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  }
  return v;
}
template <StoreKind kStore> __device__ __forceinline__ void store16(void* p, uint4 v) {
  if constexpr (kStore == kStPlain) {
    *reinterpret_cast<uint4*>(p) = v;
  } else if constexpr (kStore == kStNoAlloc) {
    asm volatile("st.global.L1::no_allocate.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
  } else {
    asm volatile("{\n.reg .b64 pol;\ncreatepolicy.fractional.L2::evict_last.b64 pol, 1.0;\n"
                 "st.global.L1::no_allocate.L2::cache_hint.v4.u32 [%0], {%1,%2,%3,%4}, pol;\n}" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
  }
}

template <typename T> __device__ __forceinline__ uint4 relu_scale16(uint4 in, float scale) {
  uint4 out;
  const T* a = reinterpret_cast<const T*>(&in);
  T* r = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int e = 0; e < 16 / int(sizeof(T)); ++e) r[e] = from_float<T>(relu(to_float(a[e])) * scale);
  return out;
}

// kVecs 16-byte vectors per thread, 256 threads, one pass (no tail: n is a multiple of the block).
template <typename T, LoadKind kLoad, StoreKind kStore, int kVecs>
__global__ void __launch_bounds__(256) hinted_kernel(const uint4* in, uint4* out, float scale) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * 256 * kVecs + threadIdx.x;
  uint4 v[kVecs];
#pragma unroll
  for (int u = 0; u < kVecs; ++u) v[u] = load16<kLoad>(in + first + u * 256);
#pragma unroll
  for (int u = 0; u < kVecs; ++u) store16<kStore>(out + first + u * 256, relu_scale16<T>(v[u], scale));
}

// TMA bulk: each block moves kChunk bytes: one bulk copy in, compute in shared memory, one bulk
// copy out (the block waits for the store to finish reading shared memory before exiting).
template <typename T, int kChunk>
__global__ void __launch_bounds__(128) bulk_kernel(const char* in, char* out, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ __align__(128) uint4 buf[kChunk / 16];
  __shared__ __align__(8) uint64_t bar;
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * kChunk;
  const uint32_t bar_addr = sm90::smem_u32(&bar);
  if (threadIdx.x == 0) {
    sm90::mbar_init(bar_addr, 1);
    sm90::fence_barrier_init();
    sm90::mbar_arrive_expect_tx(bar_addr, kChunk);
    sm90::bulk_copy_g2s(sm90::smem_u32(buf), in + offset, kChunk, bar_addr);
  }
  __syncthreads();
  sm90::mbar_wait(bar_addr, 0);
#pragma unroll
  for (int i = threadIdx.x; i < kChunk / 16; i += 128) buf[i] = relu_scale16<T>(buf[i], scale);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic writes -> async proxy
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(out + offset),
                 "r"(sm90::smem_u32(buf)), "r"(kChunk) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  }
#endif
}

template <typename F> float median_us(F&& launch) { return harness::median_us(launch, 50, 0); }

template <typename T> void run(int64_t n) {
  const size_t bytes = n * sizeof(T);
  void *in, *out, *ref;
  CHECK(cudaMalloc(&in, bytes));
  CHECK(cudaMalloc(&out, bytes));
  CHECK(cudaMalloc(&ref, bytes));
  fill<<<1024, 256>>>(static_cast<uint32_t*>(in), bytes / 4, 7);
  const float scale = 1.5f;
  elementwise::Operands<1> ops{};
  ops.data[0] = in;
  ElementwiseShape plan{};
  plan.ndim = 1;
  plan.sizes[0] = n;
  plan.numel = n;
  auto lib = [&](void* dst) {
    CHECK((elementwise::launch_typed<T, 1, ReluScale>(ops, dst, plan, true, ReluScale{scale}, 0)));
  };
  lib(ref);
  std::vector<char> want(bytes), got(bytes);
  CHECK(cudaMemcpy(want.data(), ref, bytes, cudaMemcpyDeviceToHost));
  std::printf("relu_scale %s n=2^%d (%.0f MB in + out)\n", sizeof(T) == 4 ? "fp32" : "bf16",
              __builtin_ctzll(n), 2.0 * bytes / 1e6);
  const float copy = median_us([&] { CHECK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice)); });
  std::printf("  %-34s %8.2f us %6.0f GB/s\n", "device copy", copy, 2.0 * bytes / copy / 1e3);
  auto report = [&](const char* name, auto&& launch) {
    CHECK(cudaMemset(out, 0xff, bytes));  // poison
    launch();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(got.data(), out, bytes, cudaMemcpyDeviceToHost));
    const bool same = std::memcmp(got.data(), want.data(), bytes) == 0;
    const float us = median_us(launch);
    std::printf("  %-34s %8.2f us %6.0f GB/s  %.3fx copy  %s\n", name, us, 2.0 * bytes / us / 1e3,
                copy / us, same ? "ok" : "MISMATCH");
  };
  const auto* vin = static_cast<const uint4*>(in);
  auto* vout = static_cast<uint4*>(out);
  const int64_t vecs = bytes / 16;
  report("library (256 thr x 1 vec)", [&] { lib(out); });
#define HINTED(name, L, S, V) \
  report(name, [&] { hinted_kernel<T, L, S, V><<<unsigned(vecs / (256 * V)), 256>>>(vin, vout, scale); CHECK(cudaGetLastError()); })
  HINTED("plain 1 vec", kPlain, kStPlain, 1);
  HINTED("ld L2::256B", kPrefetch256, kStPlain, 1);
  HINTED("ld.nc L1::no_allocate L2::256B", kNcPrefetch256, kStPlain, 1);
  HINTED("ld L2::256B, 2 vec", kPrefetch256, kStPlain, 2);
  HINTED("ld evict_first", kEvictFirst, kStPlain, 1);
  HINTED("ld evict_first L2::256B", kEvictFirst256, kStPlain, 1);
  HINTED("ld evict_first, st evict_last", kEvictFirst, kStEvictLast, 1);
  HINTED("ld L2::256B, st no_allocate", kPrefetch256, kStNoAlloc, 1);
#undef HINTED
  report("bulk 4 KB / block", [&] { bulk_kernel<T, 4096><<<unsigned(bytes / 4096), 128>>>(static_cast<const char*>(in), static_cast<char*>(out), scale); CHECK(cudaGetLastError()); });
  report("bulk 8 KB / block", [&] { bulk_kernel<T, 8192><<<unsigned(bytes / 8192), 128>>>(static_cast<const char*>(in), static_cast<char*>(out), scale); CHECK(cudaGetLastError()); });
  report("bulk 16 KB / block", [&] { bulk_kernel<T, 16384><<<unsigned(bytes / 16384), 128>>>(static_cast<const char*>(in), static_cast<char*>(out), scale); CHECK(cudaGetLastError()); });
  report("library again", [&] { lib(out); });
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  CHECK(cudaFree(ref));
}
}  // namespace

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, L2 %d MB\n", prop.name, prop.l2CacheSize >> 20);
  run<__nv_bfloat16>(int64_t(1) << 24);
  run<float>(int64_t(1) << 24);
  run<__nv_bfloat16>(int64_t(1) << 28);
  return 0;
}
