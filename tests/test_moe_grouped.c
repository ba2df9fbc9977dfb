/* The moe_grouped backend slot on the CPU backends: bit-identical to the host-planned per-expert loop
 * that forward_block.c's moe() runs without it (gather_rows, linear_fp4 ×2, swiglu, linear_fp4,
 * scatter_add_rows per expert in ascending id, acc zeroed first), at prefill row counts (T = 65, 200,
 * 1000) over V4.1's 384 experts top-6 at small hidden sizes, with skewed routing (a quarter of the experts
 * idle, a few taking hundreds of rows), both CPU variants; the CUDA slot's structure (contiguous buffers,
 * one SwiGLU, the combine's rank walk) replayed with the CPU ops equals it too; plans that disagree with themselves, experts
 * without weights and bad shapes refused with a message; an empty plan gives zeros.
 * di-test: asan */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "io/formats.h"
#include "testutil.h"

enum { D = 64, I = 32, E = 384, K = 6, TMAX = 1000 };
static const float LIM = 10.0f;

static uint64_t rng = 0x6A09E667F3BCC909ull;
static uint64_t rnd(void) {
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}
static double unif(void) { return (double)(rnd() >> 11) * 0x1p-53; }
static double gauss(void) { return sqrt(-2 * log(unif() + 1e-300)) * cos(6.283185307179586 * unif()); }
static uint8_t *bytes(int64_t n) {
    uint8_t *p = malloc((size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = (uint8_t)rnd();
    return p;
}
static uint8_t *e8m0(int64_t n, int lo, int hi) {
    uint8_t *p = malloc((size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = (uint8_t)(127 + lo + (int)(rnd() % (uint64_t)(hi - lo + 1)));
    return p;
}

typedef struct model {
    di_moe_expert ex[E];
    uint16_t x[TMAX * D]; /* bf16 [TMAX, D] */
    float w[TMAX * K];    /* f32 [TMAX, K] routing weights */
} model;

static model *make_model(void) {
    model *m = calloc(1, sizeof *m);
    for (int e = 0; e < E; e++)
        m->ex[e] = (di_moe_expert){bytes(I * D / 2), e8m0(I * D / 32, -6, -2), bytes(I * D / 2), e8m0(I * D / 32, -6, -2),
                                   bytes(D * I / 2), e8m0(D * I / 32, -6, -2)};
    for (int i = 0; i < TMAX * D; i++) m->x[i] = di_f32_to_bf16((float)gauss());
    for (int i = 0; i < TMAX * K; i++) m->w[i] = (float)(0.05 + 0.3 * unif());
    return m;
}

static void free_model(model *m) {
    for (int e = 0; e < E; e++) {
        const uint8_t *p[6] = {m->ex[e].w1, m->ex[e].s1, m->ex[e].w3, m->ex[e].s3, m->ex[e].w2, m->ex[e].s2};
        for (int j = 0; j < 6; j++) free((void *)p[j]);
    }
    free(m);
}

/* Skewed routing: K distinct experts per token, drawn Zipf-like (weight 1/(rank+1)^1.1) from the first
 * 288 experts in a shuffled order — 96 experts stay idle, the busiest take a large share of the rows;
 * token 0 names the edge experts 0 and E−1 first. */
static void make_ids(int T, int32_t *ids) {
    static int perm[E];
    static double cdf[288];
    for (int e = 0; e < E; e++) perm[e] = e;
    for (int e = E - 1; e > 0; e--) {
        int j = (int)(rnd() % (uint64_t)(e + 1)), tmp = perm[e];
        perm[e] = perm[j], perm[j] = tmp;
    }
    double s = 0;
    for (int r = 0; r < 288; r++) cdf[r] = s += pow(r + 1.0, -1.1);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            int32_t e;
            int again;
            do {
                if (t == 0 && j < 2) {
                    e = j ? 0 : E - 1;
                } else {
                    double u = unif() * s;
                    int r = 0;
                    while (r < 287 && cdf[r] < u) r++;
                    e = perm[r];
                }
                again = 0;
                for (int q = 0; q < j; q++) again |= ids[t * K + q] == e;
            } while (again);
            ids[t * K + j] = e;
        }
}

/* The plan as backend.h defines it, written plainly (expert by expert, a scan of every pair each): rows,
 * roww [T·K], rank [T, K], start [E + 1]. Returns the row count. */
static int64_t make_plan(int T, const int32_t *ids, const float *w, int32_t *rows, float *roww, int32_t *rank,
                         int64_t *start) {
    int64_t n = 0;
    for (int i = 0; i < T * K; i++) rank[i] = -1;
    for (int e = 0; e < E; e++) {
        start[e] = n;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++)
                if (ids[t * K + j] == e) rows[n] = t, roww[n] = w[t * K + j], rank[t * K + j] = (int32_t)n, n++;
    }
    start[E] = n;
    return n;
}

/* forward_block.c's per-expert loop (the graph without the slot): acc f32 [T, D] */
static void old_loop(const di_backend *be, const model *m, int T, const int32_t *ids, float *acc) {
    int32_t *rows = malloc(sizeof *rows * TMAX * K);
    float *roww = malloc(sizeof *roww * TMAX * K);
    uint16_t *xg = malloc(2 * TMAX * D), *g = malloc(2 * TMAX * I), *u = malloc(2 * TMAX * I), *a = malloc(2 * TMAX * I);
    uint16_t *ye = malloc(2 * TMAX * D);
    di_error err = {0};
    assert_int_equal(be->fill_f32(be, acc, (int64_t)T * D, 0.0f, &err), DI_OK);
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++)
                if (ids[t * K + j] == e) rows[n] = t, roww[n++] = m->w[t * K + j];
        if (!n) continue;
        const di_moe_expert *ex = &m->ex[e];
        assert_int_equal(be->gather_rows(be, m->x, D, rows, n, xg, &err), DI_OK);
        assert_int_equal(be->linear_fp4(be, xg, n, D, ex->w1, ex->s1, I, g, &err), DI_OK);
        assert_int_equal(be->linear_fp4(be, xg, n, D, ex->w3, ex->s3, I, u, &err), DI_OK);
        assert_int_equal(be->swiglu(be, g, u, n, I, roww, LIM, a, &err), DI_OK);
        assert_int_equal(be->linear_fp4(be, a, n, I, ex->w2, ex->s2, D, ye, &err), DI_OK);
        assert_int_equal(be->scatter_add_rows(be, ye, D, rows, n, acc, &err), DI_OK);
    }
    free(rows), free(roww), free(xg), free(g), free(u), free(a), free(ye);
}

typedef struct plan_buf {
    int32_t rows[TMAX * K], rank[TMAX * K];
    float roww[TMAX * K];
    int64_t start[E + 1], start_d[E + 1]; /* host and "backend" copies (the same memory kind on the CPU) */
    di_moe_plan p;
} plan_buf;

static void plan_for(plan_buf *pb, const model *m, int T, const int32_t *ids) {
    int64_t n = make_plan(T, ids, m->w, pb->rows, pb->roww, pb->rank, pb->start);
    memcpy(pb->start_d, pb->start, sizeof pb->start);
    pb->p = (di_moe_plan){n, pb->start, pb->start_d, pb->rows, pb->roww, pb->rank};
}

static int call_slot(const di_backend *be, const model *m, int T, const plan_buf *pb, float *acc, di_error *err) {
    void *ws = malloc(di_moe_grouped_ws_bytes(pb->p.n, D, I) + 1);
    int rc = be->moe_grouped(be, m->x, T, D, I, K, E, m->ex, &pb->p, LIM, acc, ws, err);
    free(ws);
    return rc;
}

static void check_against_loop(di_cpu_variant variant, const int *Ts, int nT) {
    model *m = make_model();
    di_backend *be;
    di_error err = {0};
    assert_int_equal(di_backend_cpu_create_variant(2, variant, &be, &err), DI_OK);
    assert_non_null(be->moe_grouped);
    int32_t *ids = malloc(sizeof *ids * TMAX * K);
    plan_buf *pb = malloc(sizeof *pb);
    float *ref = malloc(sizeof *ref * TMAX * D), *got = malloc(sizeof *got * TMAX * D);
    for (int c = 0; c < nT; c++) {
        int T = Ts[c];
        make_ids(T, ids);
        plan_for(pb, m, T, ids);
        int idle = 0, most = 0;
        for (int e = 0; e < E; e++) {
            int n = (int)(pb->start[e + 1] - pb->start[e]);
            idle += n == 0, most = n > most ? n : most;
        }
        old_loop(be, m, T, ids, ref);
        for (int i = 0; i < T * D; i++) got[i] = NAN; /* the slot must write every element */
        assert_int_equal(call_slot(be, m, T, pb, got, &err), DI_OK);
        int64_t diff = 0;
        double mag = 0;
        for (int i = 0; i < T * D; i++) diff += memcmp(got + i, ref + i, 4) != 0, mag += fabs(ref[i]);
        tu_report("moe_grouped %s T%d (%lld rows, %d idle experts, busiest %d rows): %lld of %d differ from the loop "
                  "(mean |acc| %.3g)",
                  variant == DI_CPU_SCALAR ? "scalar" : "fast", T, (long long)pb->p.n, idle, most, (long long)diff,
                  T * D, mag / (T * D));
        assert_int_equal(pb->p.n, (int64_t)T * K);
        assert_true(idle >= 90 && most > T / 10); /* the routing is as skewed as meant */
        assert_int_equal(diff, 0);
        assert_true(mag > 0);
    }
    free(ids), free(pb), free(ref), free(got);
    di_backend_destroy(be);
    free_model(m);
}

static void test_slot_equals_loop_fast(void **state) {
    (void)state;
    static const int Ts[] = {65, 200, 1000};
    check_against_loop(DI_CPU_FAST, Ts, 3);
}
static void test_slot_equals_loop_scalar(void **state) {
    (void)state;
    static const int Ts[] = {65, 200};
    check_against_loop(DI_CPU_SCALAR, Ts, 2);
}

/* The CUDA slot's structure replayed with the CPU ops (cuda_moe_grouped.cu): one gather of all listed rows,
 * w1 / w3 per expert into contiguous buffers, ONE SwiGLU over every row, w2 per expert, then the combine
 * kernel's walk — per token its rank entries by repeated minimum (ascending row), f32 adds from 0.0f. It
 * must equal the per-expert loop: ascending row within a token is ascending (expert id, slot), the
 * loop's scatter order, which is what makes the one-launch combine exact. */
static void combine_walk(const int32_t *rank, int64_t n, const uint16_t *y, int T, float *acc) {
    for (int t = 0; t < T; t++)
        for (int c = 0; c < D; c++) {
            float s = 0.0f;
            int last = -1;
            for (int step = 0; step < K; step++) {
                int best = -1;
                for (int j = 0; j < K; j++) {
                    int r = rank[t * K + j];
                    if (r > last && r < n && (best < 0 || r < best)) best = r;
                }
                if (best < 0) break;
                s += di_bf16_to_f32(y[(int64_t)best * D + c]);
                last = best;
            }
            acc[t * D + c] = s;
        }
}

static void test_gpu_structure_equals_loop(void **state) {
    (void)state;
    model *m = make_model();
    di_backend *be;
    di_error err = {0};
    assert_int_equal(di_backend_cpu_create(2, &be, &err), DI_OK);
    enum { T = 300 };
    int32_t *ids = malloc(sizeof *ids * TMAX * K);
    plan_buf *pb = malloc(sizeof *pb);
    float *ref = malloc(sizeof *ref * T * D), *got = malloc(sizeof *got * T * D);
    make_ids(T, ids);
    /* routing weights 2^0 … 2^-23 apart: bf16 terms of similar size add exactly in f32 in any order, so only
     * widely spread terms make the order visible (the check below proves it is) */
    for (int i = 0; i < T * K; i++) m->w[i] = (float)ldexp(0.5 + unif(), -(int)(rnd() % 24));
    for (int t = 0; t < T; t++) /* slots out of expert order, so the walk must sort them */
        for (int j = 0; j + 1 < K; j += 2)
            if (ids[t * K + j] < ids[t * K + j + 1]) {
                int32_t e = ids[t * K + j];
                ids[t * K + j] = ids[t * K + j + 1], ids[t * K + j + 1] = e;
            }
    plan_for(pb, m, T, ids);
    const int64_t n = pb->p.n;
    uint16_t *xg = malloc(2 * (size_t)(n * D)), *g = malloc(2 * (size_t)(n * I)), *u = malloc(2 * (size_t)(n * I));
    uint16_t *a = malloc(2 * (size_t)(n * I)), *y = malloc(2 * (size_t)(n * D));
    assert_int_equal(be->gather_rows(be, m->x, D, pb->rows, n, xg, &err), DI_OK);
    for (int e = 0; e < E; e++) {
        int64_t s = pb->start[e], ne = pb->start[e + 1] - s;
        if (!ne) continue;
        assert_int_equal(be->linear_fp4(be, xg + s * D, ne, D, m->ex[e].w1, m->ex[e].s1, I, g + s * I, &err), DI_OK);
        assert_int_equal(be->linear_fp4(be, xg + s * D, ne, D, m->ex[e].w3, m->ex[e].s3, I, u + s * I, &err), DI_OK);
    }
    assert_int_equal(be->swiglu(be, g, u, n, I, pb->roww, LIM, a, &err), DI_OK);
    for (int e = 0; e < E; e++) {
        int64_t s = pb->start[e], ne = pb->start[e + 1] - s;
        if (ne) assert_int_equal(be->linear_fp4(be, a + s * I, ne, I, m->ex[e].w2, m->ex[e].s2, D, y + s * D, &err), DI_OK);
    }
    combine_walk(pb->rank, n, y, T, got);
    old_loop(be, m, T, ids, ref);
    int64_t diff = 0;
    for (int i = 0; i < T * D; i++) diff += memcmp(got + i, ref + i, 4) != 0;
    /* the same terms summed in slot order instead: the order matters at these magnitudes */
    int64_t slot_order = 0;
    for (int t = 0; t < T; t++)
        for (int c = 0; c < D; c++) {
            float s = 0.0f;
            for (int j = 0; j < K; j++) s += di_bf16_to_f32(y[(int64_t)pb->rank[t * K + j] * D + c]);
            slot_order += memcmp(&s, ref + t * D + c, 4) != 0;
        }
    tu_report("CUDA slot structure on the CPU T%d: %lld of %d differ from the loop; summing in slot order instead: %lld "
              "differ", T, (long long)diff, T * D, (long long)slot_order);
    assert_int_equal(diff, 0);
    assert_true(slot_order > 0);
    free(xg), free(g), free(u), free(a), free(y);
    free(ids), free(pb), free(ref), free(got);
    di_backend_destroy(be);
    free_model(m);
}

/* A plan that lists no row (every pair dropped) gives zeros; with a pair dropped, the token sums the rest. */
static void test_empty_and_partial_plans(void **state) {
    (void)state;
    model *m = make_model();
    di_backend *be;
    di_error err = {0};
    assert_int_equal(di_backend_cpu_create(1, &be, &err), DI_OK);
    enum { T = 70 };
    int32_t *ids = malloc(sizeof *ids * TMAX * K);
    plan_buf *pb = malloc(sizeof *pb);
    float *ref = malloc(sizeof *ref * T * D), *got = malloc(sizeof *got * T * D);
    for (int i = 0; i < T * K; i++) ids[i] = -1;
    plan_for(pb, m, T, ids);
    assert_int_equal(pb->p.n, 0);
    for (int i = 0; i < T * D; i++) got[i] = NAN;
    assert_int_equal(call_slot(be, m, T, pb, got, &err), DI_OK);
    for (int i = 0; i < T * D; i++) assert_true(got[i] == 0.0f && !signbit(got[i]));
    make_ids(T, ids);
    ids[3 * K + 2] = -1, ids[5 * K + 0] = E; /* not listed: the graph's plan drops ids outside [0, E) */
    plan_for(pb, m, T, ids);
    assert_int_equal(pb->p.n, T * K - 2);
    old_loop(be, m, T, ids, ref);
    assert_int_equal(call_slot(be, m, T, pb, got, &err), DI_OK);
    assert_memory_equal(got, ref, sizeof *got * T * D);
    free(ids), free(pb), free(ref), free(got);
    di_backend_destroy(be);
    free_model(m);
}

static void test_slot_refuses_bad_plans(void **state) {
    (void)state;
    model *m = make_model();
    di_backend *be;
    di_error err = {0};
    assert_int_equal(di_backend_cpu_create(1, &be, &err), DI_OK);
    enum { T = 80 };
    int32_t *ids = malloc(sizeof *ids * TMAX * K);
    plan_buf *pb = malloc(sizeof *pb);
    float *acc = malloc(sizeof *acc * T * D);
    make_ids(T, ids);
    plan_for(pb, m, T, ids);
    assert_int_equal(call_slot(be, m, T, pb, acc, &err), DI_OK);

    /* rank names another token's row: the two descriptions of the plan disagree */
    int32_t keep = pb->rank[K + 1];
    pb->rank[K + 1] = pb->rank[2 * K + 1];
    assert_int_equal(call_slot(be, m, T, pb, acc, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "token 1 slot 1 names row"));
    pb->rank[K + 1] = -1; /* or leaves a row out */
    assert_int_equal(call_slot(be, m, T, pb, acc, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "rank names"));
    pb->rank[K + 1] = keep;

    int32_t keep_row = pb->rows[7];
    pb->rows[7] = T; /* a token outside the step */
    assert_int_equal(call_slot(be, m, T, pb, acc, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "row 7 is token 80"));
    pb->rows[7] = keep_row;

    const int e0 = ids[0]; /* E − 1, token 0's first choice */
    int64_t keep_s = pb->start[e0];
    pb->start[e0] = pb->start_d[e0] = pb->start[e0 + 1] + 1; /* starts that do not rise */
    assert_int_equal(call_slot(be, m, T, pb, acc, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "expert 383's rows end at"));
    pb->start[e0] = pb->start_d[e0] = keep_s;
    pb->start_d[E]--; /* a backend copy that differs */
    assert_int_equal(call_slot(be, m, T, pb, acc, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "backend copy"));
    pb->start_d[E]++;

    di_moe_expert ex = m->ex[e0];
    m->ex[e0].s2 = NULL;
    assert_int_equal(call_slot(be, m, T, pb, acc, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "expert 383 is routed to but has no weights"));
    m->ex[e0] = ex;
    int idle = 0; /* an idle expert's weights are not needed */
    while (pb->start[idle + 1] > pb->start[idle]) idle++;
    const uint8_t *w1 = m->ex[idle].w1;
    m->ex[idle].w1 = NULL;
    assert_int_equal(call_slot(be, m, T, pb, acc, &err), DI_OK);
    m->ex[idle].w1 = w1;

    assert_int_equal(be->moe_grouped(be, m->x, T, D + 1, I, K, E, m->ex, &pb->p, LIM, acc, acc, &err), DI_ERR_INVALID);
    assert_int_equal(be->moe_grouped(be, m->x, T, D, I, K, E, m->ex, &pb->p, LIM, acc, NULL, &err), DI_ERR_INVALID);
    assert_int_equal(call_slot(be, m, T, pb, acc, &err), DI_OK);
    free(ids), free(pb), free(acc);
    di_backend_destroy(be);
    free_model(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slot_equals_loop_fast),
        cmocka_unit_test(test_slot_equals_loop_scalar),
        cmocka_unit_test(test_gpu_structure_equals_loop),
        cmocka_unit_test(test_empty_and_partial_plans),
        cmocka_unit_test(test_slot_refuses_bad_plans),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
