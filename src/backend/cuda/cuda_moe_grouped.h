/* The moe_grouped slot (backend.h) on the GPU (cuda_moe_grouped.cu): the routed experts of a prefill step
 * over the host's plan, rows contiguous per expert. Two implementations, picked at backend creation:
 *   di_cuda_moe_grouped        (default) the exact int8-MMA GEMMs of all experts in grouped launches (a few per
 *                              8,192 listed rows; cuda_gemm_mma.cuh), one gather, one SwiGLU over every row,
 *                              one ordered combine: the CPU slot's bits;
 *   di_cuda_moe_grouped_wgmma  (DI_CUDA_KERNELS=tensor) one act-quant of the step's tokens, one gather of
 *                              their codes, w1 and w3 of every expert in ONE grouped wgmma launch, one SwiGLU,
 *                              one act-quant, w2 in one launch, one ordered combine: the bits of the
 *                              per-expert loop over the wgmma linear_fp4 slot (cuda_gemm_wgmma.h).
 * All pointers are device pointers except plan->start_h and the expert table (host). */
#ifndef DI_BACKEND_CUDA_CUDA_MOE_GROUPED_H
#define DI_BACKEND_CUDA_CUDA_MOE_GROUPED_H

#include <stdint.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

int di_cuda_moe_grouped(const di_backend *be, const uint16_t *x, int64_t m, int64_t d, int64_t inter, int k, int n_exp,
                        const di_moe_expert *experts, const di_moe_plan *plan, float lim, float *acc, void *ws,
                        di_error *err);
int di_cuda_moe_grouped_wgmma(const di_backend *be, const uint16_t *x, int64_t m, int64_t d, int64_t inter, int k,
                              int n_exp, const di_moe_expert *experts, const di_moe_plan *plan, float lim, float *acc,
                              void *ws, di_error *err);

/* The wgmma slot keeps the experts' tensor-map tables (three per layer: w1, w3, w2) per backend, keyed by
 * every pointer they were built from, so a layer builds them on its first call only. Release frees a
 * backend's tables (di_backend_cuda_destroy calls it). */
void di_cuda_moe_grouped_release(const di_backend *be);

/* Which path the last call of either slot took: 1 = the grouped wgmma GEMMs, 0 = the per-expert loop (the
 * default slot; or the wgmma slot's fallback where the grouped kernel cannot run or the tables cannot be
 * built). Tests and benchmarks read it. */
int di_cuda_moe_grouped_last_path(void);

/* Test / bench: listed rows per chunk of the exact slot's grouped GEMMs (0: the default, 8,192) */
void di_cuda_moe_grouped_set_chunk_rows(int64_t rows);

#ifdef __cplusplus
}
#endif

#endif
