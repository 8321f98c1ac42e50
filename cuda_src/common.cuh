// dualk CUDA helpers shared by every kernel file. Plain CUDA C++: no torch headers, so nvcc can
// compile and check each kernel file on a machine without a GPU.
#pragma once

#include <cuda.h>          // CUtensorMap and its enums (types only: libcuda is not linked)
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "launchers.h"

namespace dualk {

// 16-byte alignment: vector loads and stores, cp.async / bulk copies and TMA all need it.
__host__ __device__ __forceinline__ bool is_aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// ---- element conversions: compute in fp32, store in the tensor's own type ----
template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// ---- activations (fp32 in, fp32 out) ----
// relu keeps NaN (NaN < 0 is false), as torch.relu does.
__device__ __forceinline__ float relu(float v) { return v < 0.f ? 0.f : v; }

// gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), torch's approximate="tanh".
__device__ __forceinline__ float gelu_tanh(float v) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kCoeff = 0.044715f;
  float inner = kSqrt2OverPi * (v + kCoeff * v * v * v);
  return 0.5f * v * (1.f + tanhf(inner));
}

// gelu(x) = 0.5 x (1 + erf(x / sqrt(2))), torch's approximate="none".
__device__ __forceinline__ float gelu_erf(float v) {
  constexpr float kInvSqrt2 = 0.7071067811865476f;
  return 0.5f * v * (1.f + erff(v * kInvSqrt2));
}

__device__ __forceinline__ float silu(float v) { return v / (1.f + expf(-v)); }

// silu for 16-bit outputs: v * rcp(1 + 2^(-v log2 e)) with MUFU.EX2 and MUFU.RCP (ex2.approx,
// rcp.approx: a few fp32 ulps, far below a 16-bit rounding). silu's expf and IEEE division take
// ~20 instructions per element; in linear_glu's 128 x (2 x 128) Hopper tile, where both consumer
// warpgroups run the epilogue while the tensor cores idle, they were a few % of the tile's time
// (experiments/NOTES-linear-glu.md, session 27). Large negative v: 2^(...) -> inf, rcp -> 0,
// v * 0 = -0 (silu(-inf) is NaN, as in torch). Not in apply_activation_16bit: the wide fused
// MLP's silu kernels (64-wide last layer) then spilled a register.
__device__ __forceinline__ float silu_fast(float v) {
  constexpr float kMinusLog2e = -1.4426950408889634f;
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(v * kMinusLog2e));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.f + e));
  return v * r;
}

// silu for bf16 outputs through one MUFU.TANH: v sigmoid(v) = h + h tanh(h), h = v / 2 (exact
// identity). Half silu_fast's MUFU work (ex2 + rcp), which bounds linear_glu's Hopper epilogue
// (both consumer warpgroups run it while the tensor cores idle; experiments/NOTES-linear-glu.md,
// session 34). tanh.approx's error (relative ~2^-11) makes an absolute error up to ~|v| 2^-12,
// as gelu_tanh_fast's: about one bf16 rounding where silu is small (v near -3: ~7e-4 on -0.142),
// so bf16 only; fp16 keeps silu_fast. silu(-inf) = -inf + inf = NaN, as in torch.
__device__ __forceinline__ float silu_tanh_fast(float v) {
  const float h = 0.5f * v;
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(h));
  return fmaf(h, t, h);
}

// tanh-gelu for 16-bit outputs: h + h tanh(z), h = v / 2, z = v (sqrt(2/pi) + sqrt(2/pi) 0.044715
// v^2), with tanh from one MUFU.TANH (tanh.approx.f32, relative error about 2^-11; as the Triton
// backend's TMA epilogue). Was v / (1 + 2^(-2z log2 e)): ex2 and a reciprocal, two MUFU ops
// per element, which bounded the GEMM epilogue (16 MUFU results per clock per SM; the
// 128 x 256 linear_gelu tile's epilogue cost ~4 us, experiments/NOTES-gemm-sm90.md). The error
// it adds is absolute, up to ~|v| 2^-12: below bf16's rounding, but a few fp16 ulps where gelu
// is small (v near -2: ~5e-4 on -0.045), and a large *relative* error where gelu is near 0
// (v < -3), all far below 2^-12 max|v|. On an H200 its max abs error equalled cuBLASLt's fused
// epilogue's (bf16, all elements and where gelu is near 0). gelu(-inf) is NaN, as in torch.
__device__ __forceinline__ float gelu_tanh_fast(float v) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kCubicCoeff = 0.035677408136300125f;  // sqrt(2/pi) * 0.044715
  const float z = v * fmaf(kCubicCoeff, v * v, kSqrt2OverPi);
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(z));
  const float h = 0.5f * v;
  return fmaf(h, t, h);
}

// The activation of a 16-bit output: the fast tanh-gelu, the others as apply_activation.
template <Activation kAct> __device__ __forceinline__ float apply_activation_16bit(float v);

template <Activation kAct> __device__ __forceinline__ float apply_activation(float v) {
  if constexpr (kAct == Activation::kRelu)
    return relu(v);
  else if constexpr (kAct == Activation::kGeluTanh)
    return gelu_tanh(v);
  else if constexpr (kAct == Activation::kGeluErf)
    return gelu_erf(v);
  else if constexpr (kAct == Activation::kSilu)
    return silu(v);
  else
    return v;
}

template <Activation kAct> __device__ __forceinline__ float apply_activation_16bit(float v) {
  if constexpr (kAct == Activation::kGeluTanh)
    return gelu_tanh_fast(v);
  else
    return apply_activation<kAct>(v);
}

// ---- tensor-core and async-copy primitives (sm_80+) ----
// Each wraps one PTX instruction; callers own the layouts.

// 16-byte global -> shared copy that bypasses registers; src_bytes < 16 zero-fills the rest
// (used for masked tails: pass 0 to write zeros).
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src,
                                            int src_bytes = 16) {
  unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(src_bytes));
}
// 4-byte form (cp.async.ca: copies under 16 bytes go through L1); src_bytes 0 writes a zero.
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src,
                                           int src_bytes = 4) {
  unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(src_bytes));
}
// 8-byte form (cp.async.ca), for rows aligned to 8 bytes but not 16; src_bytes 0 writes zeros.
__device__ __forceinline__ void cp_async_8(void* smem_dst, const void* gmem_src,
                                           int src_bytes = 8) {
  unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8x8 b16 matrices from shared memory (one row address per lane), as mma.sync's A/B fragments.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* smem_row) {
  unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

// 32-bit shared-memory address forms of the copy/ldmatrix wrappers above: main loops keep one
// 32-bit base per operand instead of 64-bit generic pointers.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async_16_u32(uint32_t dst, const void* gmem_src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(src_bytes));
}
__device__ __forceinline__ void ldmatrix_x4_u32(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans_u32(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D = A * B + D for one 16x8x16 tile, fp32 accumulators. T is __half or __nv_bfloat16.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4],
                                          const uint32_t (&b)[2]);
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4],
                                                  const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                         const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Packs two fp32 values into one 32-bit register of two T (low half first), for register-resident
// A fragments (the fused MLP feeds one layer's output straight into the next layer's mma).
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// relu of two packed T with NaN propagation (torch.relu(nan) is nan), one instruction: relu
// commutes with rounding, so it can run after the down-cast.
template <typename T> __device__ __forceinline__ uint32_t relu2(uint32_t v);
template <> __device__ __forceinline__ uint32_t relu2<__half>(uint32_t v) {
  __half2 h = __hmax2_nan(*reinterpret_cast<__half2*>(&v), __float2half2_rn(0.f));
  return *reinterpret_cast<uint32_t*>(&h);
}
template <> __device__ __forceinline__ uint32_t relu2<__nv_bfloat16>(uint32_t v) {
  __nv_bfloat162 h = __hmax2_nan(*reinterpret_cast<__nv_bfloat162*>(&v), __float2bfloat162_rn(0.f));
  return *reinterpret_cast<uint32_t*>(&h);
}

// ---- sm_90 mbarrier and bulk-copy primitives (Hopper: the async copy engine) ----
// A bulk copy moves a whole contiguous run of bytes global -> shared without registers or the
// per-thread limit on outstanding loads, and signals its bytes on an mbarrier.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
namespace sm90 {

using ::dualk::smem_u32;  // callers write sm90::smem_u32 beside the other sm90 primitives

// Orders this thread's generic-proxy shared-memory writes (cp.async, st.shared) before reads of
// the async proxy (TMA, wgmma's shared operands); a barrier then makes them visible to the
// other threads.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the barrier inits visible to the other threads and to the async (TMA) proxy.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Returns once the phase with parity `parity` has completed (a barrier starts in phase 0, so
// parity 1 passes at once: "the phase before the first one").
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global `src` to shared `dst`,
// completing `bytes` transactions on mbarrier `bar`.
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes,
                                              uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// One box of a 2-D tensor map into shared memory; completes `bytes` on mbarrier `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// wgmma (sm_90a only): ordering and completion of the asynchronous warpgroup MMAs.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Executed by every thread of a warpgroup (.sync.aligned): gives registers back to the CTA's pool
// (dec) or takes them from it (inc, which waits until the pool holds them), so warp-specialized
// kernels can run a light producer beside heavy consumers.
template <int kRegs> __device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs> __device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
// Keeps the compiler from moving accumulator reads/writes across wgmma issue and wait.
template <int kN> __device__ __forceinline__ void fence_acc(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace sm90
#endif  // __CUDA_ARCH__ >= 900

// Operand lists for inline-asm wgmma (sm90 GEMM and fused MLP): "%0, %1, ..." for the
// accumulator registers and the matching "+f"(d[i]) constraints, by count.
#define DUALK_ASM_REGS_0_7 "%0, %1, %2, %3, %4, %5, %6, %7"
#define DUALK_ASM_REGS_0_15 \
  DUALK_ASM_REGS_0_7        \
  ", %8, %9, %10, %11, %12, %13, %14, %15"
#define DUALK_ASM_REGS_0_31 \
  DUALK_ASM_REGS_0_15       \
  ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define DUALK_ASM_REGS_0_63                                                          \
  DUALK_ASM_REGS_0_31                                                                \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47" \
  ", %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define DUALK_ASM_REGS_0_95                                                          \
  DUALK_ASM_REGS_0_63                                                                \
  ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79" \
  ", %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define DUALK_ASM_REGS_0_111 \
  DUALK_ASM_REGS_0_95        \
  ", %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111"
#define DUALK_ASM_REGS_0_127                                                               \
  DUALK_ASM_REGS_0_111                                                                     \
  ", %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, " \
  "%126, %127"
#define DUALK_ASM_ACC_0_7 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define DUALK_ASM_ACC_0_15                                                                       \
  DUALK_ASM_ACC_0_7, "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
      "+f"(d[14]), "+f"(d[15])
#define DUALK_ASM_ACC_0_31                                                                       \
  DUALK_ASM_ACC_0_15, "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),           \
      "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
      "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define DUALK_ASM_ACC_0_63                                                                       \
  DUALK_ASM_ACC_0_31, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),           \
      "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
      "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), \
      "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), \
      "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define DUALK_ASM_ACC_0_95                                                                       \
  DUALK_ASM_ACC_0_63, "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]),           \
      "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), \
      "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), \
      "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), \
      "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
#define DUALK_ASM_ACC_0_111                                                               \
  DUALK_ASM_ACC_0_95, "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]),   \
      "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), \
      "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111])
#define DUALK_ASM_ACC_0_127                                                                  \
  DUALK_ASM_ACC_0_111, "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), \
      "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]),    \
      "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// What the host-side planners need of the current device, queried once per device (they run on
// every launch; the attribute queries are cheap but not free). If a query fails (no device), the
// conservative defaults stand and nothing is cached.
struct DeviceProps {
  int num_sms = 132;
  int smem_optin = 48 * 1024;  // opt-in per-block limit for dynamic shared memory
  int cc_major = 0;
  int cc_minor = 0;
};
inline DeviceProps device_props() {
  constexpr int kMaxDevices = 64;
  static std::atomic<bool> ready[kMaxDevices] = {};
  static DeviceProps cache[kMaxDevices];
  DeviceProps props;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // don't leave a sticky-looking error for the caller
    return props;
  }
  const bool cacheable = device >= 0 && device < kMaxDevices;
  if (cacheable && ready[device].load(std::memory_order_acquire)) return cache[device];
  DeviceProps queried;
  if (cudaDeviceGetAttribute(&queried.num_sms, cudaDevAttrMultiProcessorCount, device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&queried.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                             device) != cudaSuccess ||
      cudaDeviceGetAttribute(&queried.cc_major, cudaDevAttrComputeCapabilityMajor, device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&queried.cc_minor, cudaDevAttrComputeCapabilityMinor, device) !=
          cudaSuccess) {
    cudaGetLastError();
    return props;
  }
  if (cacheable) {
    static std::mutex mutex;  // one writer per entry; readers take the entry after `ready`
    std::lock_guard<std::mutex> lock(mutex);
    if (!ready[device].load(std::memory_order_relaxed)) {
      cache[device] = queried;
      ready[device].store(true, std::memory_order_release);
    }
  }
  return queried;
}

// Compute capability 9.0 exactly: the sm_90a kernels (wgmma, setmaxnreg) run on no other
// architecture (not 10.x, not 12.x).
inline bool device_is_sm90() {
  const DeviceProps props = device_props();
  return props.cc_major == 9 && props.cc_minor == 0;
}

// Raises `kernel`'s dynamic shared-memory limit to at least `bytes` on the current device, calling
// cudaFuncSetAttribute only when the limit must grow: the call costs host time on every launch
// otherwise, which small, launch-bound shapes feel.
inline cudaError_t ensure_dynamic_smem(const void* kernel, int bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;  // the default limit
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> granted;
  std::lock_guard<std::mutex> lock(mutex);
  int& limit = granted[{kernel, device}];
  if (limit >= bytes) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) limit = bytes;
  return err;
}

// One occupancy answer per kernel, device, block size, dynamic shared memory and cluster size,
// from `query(int* out)` on the current device; 0 if the query fails (not cached: a later call
// may succeed). Persistent launchers size their grid with it on every call.
template <typename Query>
inline int cached_occupancy(const void* kernel, int threads, int smem_bytes, int cluster,
                            Query query) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int, int, int>, int> cache;
  const auto key = std::make_tuple(kernel, device, threads, smem_bytes, cluster);
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int count = 0;
  if (query(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  cache[key] = count;
  return count;
}

// Resident blocks per SM of `kernel` at this block size and dynamic shared memory.
inline int max_blocks_per_sm(const void* kernel, int threads, int smem_bytes) {
  return cached_occupancy(kernel, threads, smem_bytes, 1, [&](int* blocks) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, threads, smem_bytes);
  });
}

// Thread-block clusters of `cluster` CTAs of `kernel` resident at once on the whole device (GPCs
// may leave an SM without a partner); 0 if none fits. The kernel's dynamic shared-memory limit
// must already allow `smem_bytes` (ensure_dynamic_smem).
inline int max_active_clusters(const void* kernel, int threads, int smem_bytes, int cluster) {
  return cached_occupancy(kernel, threads, smem_bytes, cluster, [&](int* clusters) {
    cudaLaunchAttribute dims{};
    dims.id = cudaLaunchAttributeClusterDimension;
    dims.val.clusterDim.x = static_cast<unsigned>(cluster);
    dims.val.clusterDim.y = dims.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.attrs = &dims;
    config.numAttrs = 1;
    config.blockDim = dim3(static_cast<unsigned>(threads));
    config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
    config.gridDim = dim3(static_cast<unsigned>(cluster * (device_props().num_sms / cluster)));
    return cudaOccupancyMaxActiveClusters(clusters, kernel, &config);
  });
}

using EncodeTiledFn = PFN_cuTensorMapEncodeTiled_v12000;

// cuTensorMapEncodeTiled from the driver the runtime already loaded (no libcuda link); looked up
// once per process, nullptr when the driver lacks it.
inline EncodeTiledFn encode_tiled_fn() {
  static const EncodeTiledFn fn = []() -> EncodeTiledFn {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault,
                                         &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess || ptr == nullptr) {
      cudaGetLastError();  // not sticky, but do not leave it for the caller's next check
      return nullptr;
    }
    return reinterpret_cast<EncodeTiledFn>(ptr);
  }();
  return fn;
}

}  // namespace dualk
