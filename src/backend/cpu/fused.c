/* The fused slots on the CPU (cpu_fused.h): plain sequences of the CPU ops, in the order backend.h
 * documents for each slot. */
#include <string.h>

#include "backend/cpu/cpu_attn.h"
#include "backend/cpu/cpu_fused.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_rows.h"
#include "util/error.h"

int di_cpu_hc_pre(const di_backend *be, uint16_t *x, const uint16_t *z, const float *post_in, const float *comb_in,
                  int64_t m, int hc, int64_t d, const float *fn, float norm_eps, const float *scale, const float *base,
                  int iters, float hc_eps, const float *pre_in, const uint16_t *norm_w, float *mixes, float *pre,
                  float *post, float *comb, uint16_t *h, di_error *err) {
    (void)be;
    int rc = DI_OK;
    if (z) rc = di_cpu_hc_expand(z, x, post_in, comb_in, m, hc, d, x, err);
    if (!rc) rc = di_cpu_hc_mixes(x, m, hc, d, fn, norm_eps, mixes, err);
    if (!rc) rc = di_cpu_hc_sinkhorn(mixes, m, hc, scale, base, iters, hc_eps, pre, post, comb, err);
    if (!rc) rc = di_cpu_hc_collapse(x, pre_in ? pre_in : pre, m, hc, d, h, err);
    if (!rc) di_cpu_rmsnorm(m, d, h, d, norm_w, norm_eps, h, d);
    return rc;
}

int di_cpu_gather_topk(const di_backend *be, di_row_codec codec, const uint8_t *base, int64_t n_entries,
                       const int32_t *pages, int64_t page_entries, int64_t page_rows, int64_t row_off,
                       const int32_t *top, int64_t m, int k, int64_t d, int32_t row0, uint16_t *rows, int32_t *idx,
                       int64_t ldi, di_error *err) {
    (void)be;
    if (m < 0 || k < 0 || d < 1 || d % di_row_codec_group(codec) || ldi < k || (pages && page_entries < 1))
        return di_error_set(err, DI_ERR_INVALID,
                            "gather_topk: %lld rows of %d ids, width %lld (groups of %d), idx stride %lld, %lld entries "
                            "per page",
                            (long long)m, k, (long long)d, di_row_codec_group(codec), (long long)ldi,
                            (long long)page_entries);
    const int64_t rb = di_row_codec_bytes(codec, d);
    for (int64_t t = 0; t < m; t++)
        for (int j = 0; j < k; j++) {
            int64_t e = top[t * k + j], i = t * k + j;
            if (e < 0 || e >= n_entries) {
                memset(rows + i * d, 0, sizeof(uint16_t) * (size_t)d);
                idx[t * ldi + j] = -1;
                continue;
            }
            int64_t r = pages ? (int64_t)pages[e / page_entries] * page_rows + row_off + e % page_entries : e;
            di_cpu_row_decode(codec, base + r * rb, d, rows + i * d);
            idx[t * ldi + j] = row0 + (int32_t)i;
        }
    return DI_OK;
}

void di_cpu_fused_install(di_backend *be) {
    be->hc_pre = di_cpu_hc_pre;
    be->gather_topk = di_cpu_gather_topk;
    di_cpu_gather_seqs_install(be); /* one gather_topk per sequence */
}
