/* The moe_routed slot (backend.h) on the CPU: the routed experts of a step, planned on the host (the
 * ids are in host memory here) and computed with the backend's own slots — for each expert in
 * ascending id, its (token, slot) rows in ascending token then slot order: gather_rows, linear_fp4
 * for w1 and w3, swiglu with the rows' routing weights, linear_fp4 for w2, scatter_add_rows into the
 * zeroed f32 accumulator. That is forward_block.c's host-planned MoE loop op for op, so the slot is
 * the reference the CUDA slot is checked against. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "util/error.h"

int di_cpu_moe_routed(const di_backend *be, const uint16_t *x, int64_t m, int64_t d, int64_t inter, const int32_t *ids,
                      const float *weights, int k, int n_exp, const di_moe_expert *experts, float lim, float *acc,
                      di_error *err) {
    if (m < 0 || k < 1 || d <= 0 || inter <= 0 || d % 32 || inter % 32 || !experts)
        return di_error_set(err, DI_ERR_INVALID, "moe_routed: %lld tokens × %d slots, dim %lld, inter %lld (multiples of 32)",
                            (long long)m, k, (long long)d, (long long)inter);
    if (m * k > DI_MOE_ROUTED_MAX_PAIRS || n_exp < 1 || n_exp > DI_MOE_ROUTED_MAX_EXPERTS)
        return di_error_set(err, DI_ERR_INVALID, "moe_routed: %lld pairs (at most %d), %d experts (at most %d)",
                            (long long)(m * k), DI_MOE_ROUTED_MAX_PAIRS, n_exp, DI_MOE_ROUTED_MAX_EXPERTS);
    const int64_t P = m * k;
    int64_t *cnt = calloc((size_t)n_exp + 1, sizeof *cnt); /* int64 [n_exp + 1] rows per expert, then starts */
    int32_t *rows = malloc(sizeof *rows * (size_t)(P ? P : 1));  /* int32 [P] token of each row, by expert */
    float *roww = malloc(sizeof *roww * (size_t)(P ? P : 1));    /* f32 [P] its routing weight */
    if (!cnt || !rows || !roww) {
        free(cnt), free(rows), free(roww);
        return di_error_set(err, DI_ERR_NOMEM, "moe_routed: plan of %lld rows", (long long)P);
    }
    int rc = DI_OK;
    int64_t most = 0; /* rows of the busiest expert */
    for (int64_t i = 0; i < P && !rc; i++) {
        int e = ids[i];
        if (e < 0 || e >= n_exp)
            rc = di_error_set(err, DI_ERR_INVALID, "moe_routed: token %lld slot %lld routed to expert %d, layer has %d",
                              (long long)(i / k), (long long)(i % k), e, n_exp);
        else if (!experts[e].w1 || !experts[e].s1 || !experts[e].w3 || !experts[e].s3 || !experts[e].w2 || !experts[e].s2)
            rc = di_error_set(err, DI_ERR_INVALID, "moe_routed: expert %d is routed to but has no weights", e);
        else if (++cnt[e + 1] > most)
            most = cnt[e + 1];
    }
    /* counting sort by expert; i ascending inside an expert = token, then slot ascending */
    for (int e = 0; e < n_exp && !rc; e++) cnt[e + 1] += cnt[e];
    for (int64_t i = 0; i < P && !rc; i++) {
        int64_t r = cnt[ids[i]]++;
        rows[r] = (int32_t)(i / k), roww[r] = weights[i];
    }
    /* after the scatter cnt[e] is the end of expert e's rows (= start of e + 1) */
    uint16_t *xg = NULL, *g = NULL, *u = NULL, *a = NULL, *ye = NULL; /* bf16 [most, d], [most, inter] ×3, [most, d] */
    if (!rc && most > 0) {
        xg = malloc(sizeof *xg * (size_t)(most * d));
        g = malloc(sizeof *g * (size_t)(most * inter));
        u = malloc(sizeof *u * (size_t)(most * inter));
        a = malloc(sizeof *a * (size_t)(most * inter));
        ye = malloc(sizeof *ye * (size_t)(most * d));
        if (!xg || !g || !u || !a || !ye) rc = di_error_set(err, DI_ERR_NOMEM, "moe_routed: rows of %lld", (long long)most);
    }
    if (!rc) rc = be->fill_f32(be, acc, m * d, 0.0f, err);
    for (int e = 0; e < n_exp && !rc; e++) {
        int64_t start = e ? cnt[e - 1] : 0, n = cnt[e] - start;
        if (!n) continue;
        const di_moe_expert *ex = &experts[e];
        rc = be->gather_rows(be, x, d, rows + start, n, xg, err);
        if (!rc) rc = be->linear_fp4(be, xg, n, d, ex->w1, ex->s1, inter, g, err);
        if (!rc) rc = be->linear_fp4(be, xg, n, d, ex->w3, ex->s3, inter, u, err);
        if (!rc) rc = be->swiglu(be, g, u, n, inter, roww + start, lim, a, err);
        if (!rc) rc = be->linear_fp4(be, a, n, inter, ex->w2, ex->s2, d, ye, err);
        if (!rc) rc = be->scatter_add_rows(be, ye, d, rows + start, n, acc, err);
        if (rc) di_error_wrap(err, "moe_routed expert %d", e);
    }
    free(cnt), free(rows), free(roww), free(xg), free(g), free(u), free(a), free(ye);
    return rc;
}
