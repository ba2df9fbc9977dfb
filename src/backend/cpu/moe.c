/* MoE pieces and the whole routed + shared FFN (spec §3.7 steps 4–6, §4.5; model.py Expert, MoE).
 *
 * Reference order kept: experts visited in ascending id, each adding its bf16 output into an f32
 * accumulator for its tokens; the shared expert's bf16 output is added last; one bf16 rounding.
 * The routing weight multiplies the f32 SwiGLU product before the bf16 cast that feeds w2. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "io/formats.h"
#include "util/error.h"

/* torch's silu: x / (1 + exp(−x)) in f32 */
static float silu(float g) { return g / (1.0f + expf(-g)); }

void di_cpu_swiglu(int64_t M, int64_t I, const uint16_t *gate, int64_t ldg, const uint16_t *up, int64_t ldu,
                   const float *row_weight, float limit, uint16_t *out, int64_t ldo) {
    for (int64_t m = 0; m < M; m++) {
        const uint16_t *g = gate + m * ldg, *u = up + m * ldu;
        uint16_t *o = out + m * ldo;
        for (int64_t i = 0; i < I; i++) {
            float gv = di_bf16_to_f32(g[i]), uv = di_bf16_to_f32(u[i]);
            if (limit > 0) {
                uv = uv < -limit ? -limit : (uv > limit ? limit : uv);
                gv = gv > limit ? limit : gv;
            }
            float a = silu(gv) * uv;
            if (row_weight) a = row_weight[m] * a;
            o[i] = di_f32_to_bf16(a);
        }
    }
}

void di_cpu_moe_accumulate(int64_t n_rows, int64_t D, const int32_t *rows, const uint16_t *expert_out,
                           float *acc) {
    for (int64_t r = 0; r < n_rows; r++) {
        float *a = acc + (int64_t)rows[r] * D;
        const uint16_t *y = expert_out + r * D;
        for (int64_t i = 0; i < D; i++) a[i] = a[i] + di_bf16_to_f32(y[i]);
    }
}

void di_cpu_moe_finish(int64_t M, int64_t D, const float *acc, const uint16_t *shared, uint16_t *out) {
    for (int64_t i = 0; i < M * D; i++) out[i] = di_f32_to_bf16(acc[i] + di_bf16_to_f32(shared[i]));
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Workspace layout of di_cpu_moe_ffn. */
typedef struct {
    float *acc;      /* f32 [M, D] */
    int32_t *rows;   /* int32 [M] tokens routed to the current expert */
    float *rw;       /* f32 [M] their routing weights */
    uint16_t *xe;    /* bf16 [M, D] gathered inputs */
    uint16_t *g, *u; /* bf16 [M, I] w1 / w3 outputs */
    uint16_t *a;     /* bf16 [M, I] SwiGLU output */
    uint16_t *ye;    /* bf16 [M, D] expert output */
    void *q;         /* qlinear workspace */
    size_t q_bytes;
} moe_ws;

static size_t moe_layout(int64_t M, int64_t D, int64_t I, const di_threadpool *tp, unsigned char *base, moe_ws *w) {
    size_t qa = di_cpu_qlinear_workspace(M, D, tp), qb = di_cpu_qlinear_workspace(M, I, tp);
    size_t sizes[9] = {
        align64((size_t)(M * D) * 4), align64((size_t)M * 4), align64((size_t)M * 4),
        align64((size_t)(M * D) * 2), align64((size_t)(M * I) * 2), align64((size_t)(M * I) * 2),
        align64((size_t)(M * I) * 2), align64((size_t)(M * D) * 2), qa > qb ? qa : qb,
    };
    size_t off = 0;
    void *ptr[9];
    for (int i = 0; i < 9; i++) {
        ptr[i] = base ? base + off : NULL;
        off += sizes[i];
    }
    if (w) {
        w->acc = ptr[0];
        w->rows = ptr[1];
        w->rw = ptr[2];
        w->xe = ptr[3];
        w->g = ptr[4];
        w->u = ptr[5];
        w->a = ptr[6];
        w->ye = ptr[7];
        w->q = ptr[8];
        w->q_bytes = sizes[8];
    }
    return off;
}

size_t di_cpu_moe_workspace(int64_t M, int64_t D, int64_t I, const di_threadpool *tp) {
    return moe_layout(M, D, I, tp, NULL, NULL);
}

int di_cpu_moe_ffn(di_threadpool *tp, int64_t M, int64_t D, int64_t I, const uint16_t *x, const int32_t *ids,
                   const float *weights, int top_k, int n_exp, const di_cpu_expert_fp4 *experts,
                   const di_cpu_expert_fp8 *shared, float swiglu_limit, uint16_t *out, void *ws, size_t ws_bytes,
                   di_error *err) {
    if (D % DI_QBLOCK || I % DI_QBLOCK || D <= 0 || I <= 0)
        return di_error_set(err, DI_ERR_INVALID, "moe: dim %lld and inter dim %lld must be multiples of %d",
                            (long long)D, (long long)I, DI_QBLOCK);
    size_t need = di_cpu_moe_workspace(M, D, I, tp);
    if (!ws || ws_bytes < need)
        return di_error_set(err, DI_ERR_INVALID, "moe: workspace of %zu bytes, need %zu (M %lld)", ws_bytes, need,
                            (long long)M);
    /* A token routed twice to one expert would give that expert more than M rows: the per-expert
     * buffers hold M, so a repeated id is refused like an out-of-range one (the router never
     * produces either). */
    for (int64_t i = 0; i < M * top_k; i++) {
        if (ids[i] < 0 || ids[i] >= n_exp)
            return di_error_set(err, DI_ERR_INVALID, "moe: token %lld routed to expert %d, layer has %d experts",
                                (long long)(i / top_k), ids[i], n_exp);
        for (int64_t j = i - i % top_k; j < i; j++)
            if (ids[j] == ids[i])
                return di_error_set(err, DI_ERR_INVALID, "moe: token %lld routed to expert %d twice (slots %lld, %lld)",
                                    (long long)(i / top_k), ids[i], (long long)(j % top_k), (long long)(i % top_k));
    }
    if (!shared || !shared->w1 || !shared->s1 || !shared->w3 || !shared->s3 || !shared->w2 || !shared->s2)
        return di_error_set(err, DI_ERR_INVALID, "moe: shared expert weights missing");
    moe_ws w;
    moe_layout(M, D, I, tp, ws, &w);
    memset(w.acc, 0, (size_t)(M * D) * sizeof(float));

    for (int e = 0; e < n_exp; e++) {
        int64_t n = 0;
        for (int64_t m = 0; m < M; m++)
            for (int k = 0; k < top_k; k++)
                if (ids[m * top_k + k] == e) {
                    w.rows[n] = (int32_t)m;
                    w.rw[n++] = weights[m * top_k + k];
                }
        if (n == 0) continue;
        const di_cpu_expert_fp4 *ex = &experts[e];
        if (!ex->w1 || !ex->s1 || !ex->w3 || !ex->s3 || !ex->w2 || !ex->s2)
            return di_error_set(err, DI_ERR_INVALID, "moe: expert %d is routed to but has no weights", e);
        for (int64_t r = 0; r < n; r++) memcpy(w.xe + r * D, x + (int64_t)w.rows[r] * D, (size_t)D * 2);
        int rc = di_cpu_linear_fp4(tp, n, I, D, w.xe, D, ex->w1, ex->s1, w.g, I, w.q, w.q_bytes, err);
        if (!rc) rc = di_cpu_linear_fp4(tp, n, I, D, w.xe, D, ex->w3, ex->s3, w.u, I, w.q, w.q_bytes, err);
        if (rc) return di_error_wrap(err, "moe expert %d", e);
        di_cpu_swiglu(n, I, w.g, I, w.u, I, w.rw, swiglu_limit, w.a, I);
        rc = di_cpu_linear_fp4(tp, n, D, I, w.a, I, ex->w2, ex->s2, w.ye, D, w.q, w.q_bytes, err);
        if (rc) return di_error_wrap(err, "moe expert %d", e);
        di_cpu_moe_accumulate(n, D, w.rows, w.ye, w.acc);
    }

    int rc = di_cpu_linear_fp8(tp, M, I, D, x, D, shared->w1, shared->s1, w.g, I, w.q, w.q_bytes, err);
    if (!rc) rc = di_cpu_linear_fp8(tp, M, I, D, x, D, shared->w3, shared->s3, w.u, I, w.q, w.q_bytes, err);
    if (rc) return di_error_wrap(err, "moe shared expert");
    di_cpu_swiglu(M, I, w.g, I, w.u, I, NULL, swiglu_limit, w.a, I);
    rc = di_cpu_linear_fp8(tp, M, D, I, w.a, I, shared->w2, shared->s2, w.ye, D, w.q, w.q_bytes, err);
    if (rc) return di_error_wrap(err, "moe shared expert");
    di_cpu_moe_finish(M, D, w.acc, w.ye, out);
    return DI_OK;
}
