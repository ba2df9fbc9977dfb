/* The exact block-scaled FP8 / MXFP4 GEMM on Hopper's int8 wgmma (cuda_gemm_igmma.cu): the same bits as
 * the int8 mma.sync GEMM (cuda_gemm_mma.cuh) and the CPU op, for the larger calls (prefill, big batches). */
#ifndef DI_BACKEND_CUDA_CUDA_GEMM_IGMMA_H
#define DI_BACKEND_CUDA_CUDA_GEMM_IGMMA_H

#include <stdint.h>

#include "util/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* On unless DI_CUDA_GEMM_IG=0 is in the environment (read once); di_cuda_gemm_igmma_set_enabled overrides
 * it (tests, bench). */
int di_cuda_gemm_igmma_enabled(void);
void di_cuda_gemm_igmma_set_enabled(int on);
/* Whether this kernel (grouped: the grouped one) can run on the current device: its register split and
 * shared-memory opt-in, checked once per device; the dispatch falls back to the int8 mma.sync GEMM if not */
int di_cuda_gemm_igmma_usable(int fp4, int grouped);
/* Whether linear_fp8 / linear_fp4 take this kernel for a call of m rows (the measured rule, cuda_gemm_igmma.cu) */
int di_cuda_gemm_igmma_wants(int fp4, int64_t m, int64_t k, int64_t n);
/* Test / bench: every stage takes the literal scale sequence (conversion instruction, __fmul_rn, __fmul_rn,
 * __fadd_rn) instead of the fused one; the results do not depend on it */
void di_cuda_gemm_igmma_set_literal(int on);
/* Test / bench: x rows per tile of a dense launch, 64 or 128 (0 or anything else: the rule); the results do
 * not depend on it */
void di_cuda_gemm_igmma_set_tile_rows(int tm);
/* Bytes of device scratch a call needs: x's three digit planes, s8 [3][m][k] */
uint64_t di_cuda_gemm_igmma_scratch(int64_t m, int64_t k);
/* y bf16 [m, n] = the block-scaled linear of act-quantized rows xq e4m3 [m, k], xs E8M0 [m, k/32] with
 * w e4m3 [n, k] + ws E8M0 [ceil(n/32), k/32] (fp4 = 0) or w packed E2M1 [n, k/2] + ws E8M0 [n, k/32]
 * (fp4 = 1); device pointers, on stream (a cudaStream_t). xd: di_cuda_gemm_igmma_scratch(m, k) bytes,
 * 16-byte aligned. Refused (an error, nothing launched): m < 1, n < 1, k not a positive multiple of 32,
 * w or xd not 16-byte aligned (or NULL), xq not 4-byte aligned, 3·m, k or n past 2^31 − 1, more than 65,535
 * row tiles (of the 64 or 128 rows the call takes). y needs only 2-byte alignment. */
int di_cuda_gemm_igmma_run(int fp4, const uint8_t *xq, const uint8_t *xs, int64_t m, int64_t k, const uint8_t *w,
                           const uint8_t *ws, int64_t n, uint16_t *y, uint8_t *xd, void *stream, di_error *err);
/* Grouped (the prefill experts), the contract of di_cuda_gemm_mma_grouped (cuda_gemm_mma.cuh) with this
 * kernel's scratch: expert e's rows [start_h[e], start_h[e+1]) (HOST array) of xq / xs take w[e], ws[e] (HOST
 * arrays of device pointers); n_exp ≤ 384; xd: di_cuda_gemm_igmma_scratch(rows, k) bytes, filled from xq — or,
 * with xq NULL, already holding these rows' planes from an earlier call. Each row's outputs are those of
 * di_cuda_gemm_igmma_run on that expert alone, bit for bit. */
int di_cuda_gemm_igmma_grouped(int fp4, const uint8_t *xq, const uint8_t *xs, int64_t k, int n_exp, const int64_t *start_h,
                               const uint8_t *const *w, const uint8_t *const *ws, int64_t n, uint16_t *y, uint8_t *xd,
                               void *stream, di_error *err);
/* Whether a grouped call of `rows` rows over `active` experts with rows takes this kernel */
int di_cuda_gemm_igmma_grouped_wants(int64_t rows, int active);
/* Test: at most n row tiles per grouped launch (0: the table's 2,560) */
void di_cuda_gemm_igmma_set_group_tiles(int n);

#ifdef __cplusplus
}
#endif

#endif
