/* The fused slots of backend.h on the GPU (cuda_fused.cu): hc_pre and gather_topk, device pointers,
 * contracts and numerics as backend.h states (bit-identical to the unfused CUDA sequence). */
#ifndef DI_BACKEND_CUDA_CUDA_FUSED_H
#define DI_BACKEND_CUDA_CUDA_FUSED_H

#include <stdint.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

int di_cuda_hc_pre(const di_backend *be, uint16_t *x, const uint16_t *z, const float *post_in, const float *comb_in,
                   int64_t m, int hc, int64_t d, const float *fn, float norm_eps, const float *scale, const float *base,
                   int iters, float hc_eps, const float *pre_in, const uint16_t *norm_w, float *mixes, float *pre,
                   float *post, float *comb, uint16_t *h, di_error *err);
int di_cuda_gather_topk(const di_backend *be, di_row_codec codec, const uint8_t *base, int64_t n_entries,
                        const int32_t *pages, int64_t page_entries, int64_t page_rows, int64_t row_off,
                        const int32_t *top, int64_t m, int k, int64_t d, int32_t row0, uint16_t *rows, int32_t *idx,
                        int64_t ldi, di_error *err);
/* Test hook: hc_pre splits each token's mixes over blocks up to n tokens per call (default and most
 * 4096), and runs one block per token above; both give the same bits. */
void di_cuda_fused_set_split_max(int n);
/* Test hook: the split launch's mixes per block (0: the rule of cuda_fused.cu, pre_mix_group); any
 * grouping gives the same bits. */
void di_cuda_fused_set_mix_group(int n);

#ifdef __cplusplus
}
#endif

#endif
