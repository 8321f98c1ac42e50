// The CUDA GEMM family behind matmul.cu and linear_gelu.cu:
//   C[b] = act(A[b] @ B[b] + bias), fp32 accumulation, bias and activation applied to the fp32
//   accumulator before the down-cast (compile-time parameters kAct, kHasBias).
// One file per member, and this umbrella so that includers (the .cu files, the harnesses under
// experiments/) need one include:
//   gemm_common.cuh     tile order, epilogue value, row-alignment checks shared by the kernels
//   gemm_mma.cuh        portable tensor-core kernel (fp16/bf16, mma.sync + ldmatrix + cp.async)
//   gemm_simt.cuh       general SIMT kernel (any type, any alignment: the fallback)
//   gemm_simt_wide.cuh  fp32 SIMT kernel for 16-byte rows (0.9x cuBLAS SGEMM)
//   gemm_simt_skinny.cuh  the same for at most 32 rows (32-row tiles)
//   gemm_sm90.cuh       Hopper kernel (16-bit, TMA + wgmma, warp-specialized, persistent)
//   gemm_select.cuh     which of them runs (run_gemm_best, run_gemm, select_gemm_kernel)
#pragma once

#include "gemm_select.cuh"
