// How many CTA clusters of each size are resident at once on this GPU, for a kernel that holds a
// whole SM (the Hopper GEMM's footprint: 384 threads, PingPong64x128TmaC4's shared memory).
//
//   nvcc -O2 -std=c++17 -Icuda_src -gencode=arch=compute_90a,code=sm_90a \
//        experiments/cluster_residency.cu -o /tmp/residency && /tmp/residency
//
// Why: a cluster must sit inside one GPC, and GPCs differ from chip to chip (an H100 fits 30
// clusters of 4 on 132 SMs, 120 of them; session 18). launch() takes the 2 x 2 clusters only where
// every cluster of the grid is resident at once (resident_clusters in gemm_sm90.cuh), so this
// count decides, per GPU, which shapes run them: linear_gelu 1000^3 needs 32. It builds in seconds,
// where the GEMM harness that also prints it takes ~3 minutes.
#include <cstdio>

#include "gemm_sm90.cuh"

// Occupancy depends on threads, shared memory and registers only: an empty kernel with the
// GEMM's threads and shared memory answers for it (its 168 registers x 384 threads fit one CTA
// per SM, as the shared memory already forces).
__global__ void __launch_bounds__(384, 1) whole_sm_kernel() {}

int main() {
  using Cfg = dualk::gemm_sm90::PingPong64x128TmaC4;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::printf("no CUDA device\n");
    return 1;
  }
  const void* kernel = reinterpret_cast<const void*>(whole_sm_kernel);
  if (dualk::ensure_dynamic_smem(kernel, Cfg::kSmemBytes) != cudaSuccess ||
      cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    std::printf("could not grant %d bytes of shared memory\n", Cfg::kSmemBytes);
    return 1;
  }
  std::printf("%s: %d SMs, %d threads and %d bytes of shared memory per CTA (one CTA per SM)\n", prop.name,
              prop.multiProcessorCount, Cfg::kThreads, Cfg::kSmemBytes);
  std::printf("cluster size | resident clusters | SMs used\n");
  for (int cluster : {1, 2, 3, 4, 6, 8, 16}) {
    // The production query (common.cuh): 0 where none fits or the query fails.
    const int clusters = dualk::max_active_clusters(kernel, Cfg::kThreads, Cfg::kSmemBytes, cluster);
    std::printf("%12d | %17d | %d\n", cluster, clusters, clusters * cluster);
  }
  return 0;
}
