/* Entry points of the exact FP8 linear on the FP64 tensor cores (cuda_gemm_dmma.cu): up to 64 rows of
 * act-quantized x against an FP8 weight, the same bits as the GEMV, the int8 MMA GEMM and the CPU op. */
#ifndef DI_BACKEND_CUDA_CUDA_GEMM_DMMA_H
#define DI_BACKEND_CUDA_CUDA_GEMM_DMMA_H

#include <stdint.h>

#include "util/error.h"

#define DI_DMMA_MAX_M 64

#ifdef __cplusplus
extern "C" {
#endif
/* On unless DI_CUDA_GEMM_DMMA=0 is in the environment (read once); set_enabled overrides it (tests, bench). */
int di_cuda_gemm_dmma_enabled(void);
void di_cuda_gemm_dmma_set_enabled(int on);
/* Whether the kernel can take the call: 1 ≤ m ≤ 64, k a positive multiple of 32, w 8-byte aligned */
int di_cuda_gemm_dmma_fits(int64_t m, int64_t k, const void *w);
/* Whether linear_fp8 should take it (the rule measured on the H200; bench/NOTES-gpu.md) */
int di_cuda_gemm_dmma_wants(int64_t m, int64_t k, int64_t n, const void *w);
/* y bf16 [m, n] from xq e4m3 [m, k] and xs E8M0 [m, k/32] (act_quant32 with groups of 32) against w e4m3
 * [n, k] with ws E8M0 [ceil(n/32), k/32] (device pointers), on stream (a cudaStream_t) */
int di_cuda_gemm_dmma_run(const uint8_t *xq, const uint8_t *xs, int64_t m, int64_t k, const uint8_t *w,
                          const uint8_t *ws, int64_t n, uint16_t *y, void *stream, di_error *err);
/* Tests and bench: force the form (1 = a warp per 16-column tile, 2 / 3 = a tile split over 8 / 16 warps)
 * and the depth (2 or 4 blocks loaded ahead); 0 = the default rule */
void di_cuda_gemm_dmma_set_form(int form, int depth);
#ifdef __cplusplus
}
#endif

#endif
