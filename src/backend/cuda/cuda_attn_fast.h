/* Tensor-core sparse attention with the attention sink for Hopper (cuda_attn_fast.cu): the
 * backend.h sparse_attn contract, for the V4.1 shape (64 query heads sharing one 512-wide latent KV
 * head). Other head counts or widths, and pointers not 16-byte aligned, fall back to the scalar
 * kernel (cuda_attn.cu).
 *
 * Numerics against the CPU reference (src/backend/cpu/sparse_attn.c), measured by
 * tests/cuda/test_cuda_attn_fast.c: the online-softmax steps are the reference's (blocks of 64
 * indices in list order, running max from −1e30, bf16-rounded probabilities against the running max,
 * the f32 probability sum in the CPU's 8-lane order, sink added last); the two dot products run on the
 * tensor cores (bf16 products exact, f32 accumulation in the tensor core's order instead of the CPU's
 * 8 strided lanes, and o·α accumulated in the same instruction as Σ p·v). Outputs may differ from the
 * CPU by 1 bf16 ulp on a small fraction of elements; see the test's header for the measured bound.
 *
 * Batch invariance: a query's output depends only on its own q row and index list. Small batches
 * split the 512 output columns (and, for ≤ #SMs/16 queries, the 64 heads) over several blocks per
 * query; every split computes the same scores and the same per-column sums, so the bits do not depend
 * on m. */
#ifndef DI_BACKEND_CUDA_CUDA_ATTN_FAST_H
#define DI_BACKEND_CUDA_CUDA_ATTN_FAST_H

#include <stdint.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The sparse_attn slot (device pointers; contract in backend.h and cpu_attn.h). */
int di_cuda_sparse_attn_fast(const di_backend *be, const uint16_t *q, int64_t m, int nh, int d,
                             const uint16_t *kv_win, int64_t n_win, const uint16_t *kv_cmp, int64_t n_cmp,
                             const float *sink, const int32_t *idx, int64_t n_idx, float scale, uint16_t *out,
                             di_error *err);

/* The same with the work split forced: output columns per thread block (64, 128, 256 or 512) × heads
 * per block (64; or 16 with 128+ columns); 0 × 0 = choose from m. For the invariance test: every split
 * must give the same bits. */
int di_cuda_sparse_attn_fast_split(const di_backend *be, const uint16_t *q, int64_t m, int nh, int d,
                                   const uint16_t *kv_win, int64_t n_win, const uint16_t *kv_cmp, int64_t n_cmp,
                                   const float *sink, const int32_t *idx, int64_t n_idx, float scale, uint16_t *out,
                                   int cols, int heads, di_error *err);

#ifdef __cplusplus
}
#endif

#endif
