/* The moe_grouped slot (backend.h) on the CPU: the prefill step's routed experts over the plan the
 * host built (rows grouped by expert), computed with the backend's own slots — acc = 0, then for each
 * expert in ascending id with rows: gather_rows, linear_fp4 for w1 and w3, swiglu with the rows' routing
 * weights, linear_fp4 for w2, scatter_add_rows. That is forward_block.c's host-planned MoE loop op for
 * op, so the slot is the reference the CUDA slot (cuda_moe_grouped.cu) is checked against.
 *
 * The CUDA slot sums each token's terms through `rank` and this one through the per-expert row lists,
 * so the plan is checked here to say the same thing both ways: start is 0 … n and nondecreasing (and
 * its backend copy equal), every row's token is in range, and rank names each row exactly once, from the
 * row's own token. */
#include <string.h>

#include "backend/cpu/cpu_moe_grouped.h"
#include "util/error.h"

static int check_plan(int64_t m, int k, int n_exp, const di_moe_expert *experts, const di_moe_plan *p, di_error *err) {
    const int64_t *st = p->start_h;
    if (st[0] != 0 || st[n_exp] != p->n || memcmp(st, p->start, sizeof *st * (size_t)(n_exp + 1)))
        return di_error_set(err, DI_ERR_INVALID, "moe_grouped: plan starts at %lld and ends at %lld for %lld rows "
                            "(or its backend copy differs)", (long long)st[0], (long long)st[n_exp], (long long)p->n);
    for (int e = 0; e < n_exp; e++) {
        if (st[e + 1] < st[e])
            return di_error_set(err, DI_ERR_INVALID, "moe_grouped: expert %d's rows end at %lld before they start at %lld",
                                e, (long long)st[e + 1], (long long)st[e]);
        const di_moe_expert *ex = &experts[e];
        if (st[e + 1] > st[e] && (!ex->w1 || !ex->s1 || !ex->w3 || !ex->s3 || !ex->w2 || !ex->s2))
            return di_error_set(err, DI_ERR_INVALID, "moe_grouped: expert %d is routed to but has no weights", e);
    }
    for (int64_t r = 0; r < p->n; r++)
        if (p->rows[r] < 0 || p->rows[r] >= m)
            return di_error_set(err, DI_ERR_INVALID, "moe_grouped: row %lld is token %d, the step has %lld", (long long)r,
                                p->rows[r], (long long)m);
    /* rank: each listed entry a row of its own token, no row twice within a token (rows belong to one
     * token each, so none twice at all), n entries in all: a bijection onto the rows */
    int64_t listed = 0;
    for (int64_t t = 0; t < m; t++)
        for (int j = 0; j < k; j++) {
            int32_t r = p->rank[t * k + j];
            if (r < 0) continue;
            int twice = 0;
            for (int q = 0; q < j; q++) twice |= p->rank[t * k + q] == r;
            if (r >= p->n || p->rows[r] != t || twice)
                return di_error_set(err, DI_ERR_INVALID, "moe_grouped: token %lld slot %d names row %d, which is not "
                                    "one of its own (%lld rows)", (long long)t, j, r, (long long)p->n);
            listed++;
        }
    if (listed != p->n)
        return di_error_set(err, DI_ERR_INVALID, "moe_grouped: rank names %lld rows of %lld", (long long)listed,
                            (long long)p->n);
    return DI_OK;
}

int di_cpu_moe_grouped(const di_backend *be, const uint16_t *x, int64_t m, int64_t d, int64_t inter, int k, int n_exp,
                       const di_moe_expert *experts, const di_moe_plan *plan, float lim, float *acc, void *ws,
                       di_error *err) {
    if (m < 0 || k < 1 || d <= 0 || inter <= 0 || d % 32 || inter % 32 || n_exp < 1 || !experts || !plan ||
        !plan->start_h || plan->n < 0 || (plan->n > 0 && !ws))
        return di_error_set(err, DI_ERR_INVALID, "moe_grouped: %lld tokens × %d slots, dim %lld, inter %lld (multiples "
                            "of 32), %d experts, a plan and scratch", (long long)m, k, (long long)d, (long long)inter, n_exp);
    int rc = check_plan(m, k, n_exp, experts, plan, err);
    if (rc) return rc;
    /* scratch (di_moe_grouped_ws_bytes): each expert uses the first start[e+1] − start[e] rows of each */
    size_t rows_b = ((size_t)(plan->n * d) * 2 + 255) & ~(size_t)255, mid_b = ((size_t)(plan->n * inter) * 2 + 255) & ~(size_t)255;
    uint16_t *xg = (uint16_t *)ws;                            /* bf16 [n, d]: gathered rows, then the expert's output */
    uint16_t *g = (uint16_t *)((uint8_t *)ws + rows_b);       /* bf16 [n, inter] */
    uint16_t *u = (uint16_t *)((uint8_t *)ws + rows_b + mid_b);
    uint16_t *a = (uint16_t *)((uint8_t *)ws + rows_b + 2 * mid_b);
    if ((rc = be->fill_f32(be, acc, m * d, 0.0f, err))) return rc;
    for (int e = 0; e < n_exp; e++) {
        int64_t s = plan->start_h[e], n = plan->start_h[e + 1] - s;
        if (!n) continue;
        const di_moe_expert *ex = &experts[e];
        rc = be->gather_rows(be, x, d, plan->rows + s, n, xg, err);
        if (!rc) rc = be->linear_fp4(be, xg, n, d, ex->w1, ex->s1, inter, g, err);
        if (!rc) rc = be->linear_fp4(be, xg, n, d, ex->w3, ex->s3, inter, u, err);
        if (!rc) rc = be->swiglu(be, g, u, n, inter, plan->roww + s, lim, a, err);
        if (!rc) rc = be->linear_fp4(be, a, n, inter, ex->w2, ex->s2, d, xg, err); /* the gathered rows are spent */
        if (!rc) rc = be->scatter_add_rows(be, xg, d, plan->rows + s, n, acc, err);
        if (rc) return di_error_wrap(err, "moe_grouped expert %d", e);
    }
    return DI_OK;
}
