/* Entry points of the fused FP8 decode GEMV (cuda_gemv_fp8.cu): linear_fp8 at M = 1 and 2 with the
 * act-quant inside the kernel, the same bits as act_quant + the GEMV of cuda_gemv.cuh and the CPU op. */
#ifndef DI_BACKEND_CUDA_CUDA_GEMV_FP8_H
#define DI_BACKEND_CUDA_CUDA_GEMV_FP8_H

#include <stdint.h>

#include "util/error.h"

#ifdef __cplusplus
extern "C" {
#endif
/* On unless DI_CUDA_GEMV_FP8=0 is in the environment (read once); set_enabled overrides it (tests, bench). */
int di_cuda_gemv_fp8_enabled(void);
void di_cuda_gemv_fp8_set_enabled(int on);
/* Whether the kernel takes the call: 1 ≤ m ≤ 2, k a multiple of 32 up to 8192, x and w 16-byte aligned */
int di_cuda_gemv_fp8_fits(int64_t m, int64_t k, const void *x, const void *w);
/* Whether linear_fp8 should take it: it fits and N ≥ 1024 (narrower weights are as fast or faster on the
 * GEMV of cuda_gemv.cuh, whose warps split K) */
int di_cuda_gemv_fp8_wants(int64_t m, int64_t k, int64_t n, const void *x, const void *w);
/* y bf16 [m, n] = linear_fp8 of x bf16 [m, k] with w e4m3 [n, k] and ws E8M0 [ceil(n/32), k/32] (device
 * pointers), on stream (a cudaStream_t) */
int di_cuda_gemv_fp8_run(const uint16_t *x, int64_t m, int64_t k, const uint8_t *w, const uint8_t *ws, int64_t n,
                         uint16_t *y, void *stream, di_error *err);
/* Tests and bench: the column tile, 1, 2, 4 or 8 (two rows: 8 means 4); 0 = the default rule */
void di_cuda_gemv_fp8_set_tile(int nc);
#ifdef __cplusplus
}
#endif

#endif
