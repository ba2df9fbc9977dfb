/* The moe_routed backend slot on the CPU backends: bit-identical to the host-planned expert loop that
 * forward_block.c's moe() ran before the slot existed (gather_rows, linear_fp4 ×3, swiglu,
 * scatter_add_rows per expert in ascending id), and, with the shared expert added, to moe.c's
 * independent whole-FFN kernel di_cpu_moe_ffn; repeated experts, edge ids, both CPU variants; bad ids
 * and missing weights refused with a message. Small shapes (dim 256, inter 128, 16 experts, top-6).
 * di-test: asan */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "io/formats.h"
#include "testutil.h"

enum { D = 256, I = 128, E = 16, K = 6, TMAX = 16 };

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint64_t rnd(void) {
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}
static double gauss(void) {
    double u = ((double)(rnd() >> 11) + 0.5) * 0x1p-53, v = (double)(rnd() >> 11) * 0x1p-53;
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}
static uint8_t *bytes(int64_t n) {
    uint8_t *p = malloc((size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = (uint8_t)rnd();
    return p;
}
static uint8_t *e4m3(int64_t n) { /* no NaN codes */
    uint8_t *p = bytes(n);
    for (int64_t i = 0; i < n; i++)
        if ((p[i] & 0x7f) == 0x7f) p[i] ^= 1;
    return p;
}
static uint8_t *e8m0(int64_t n, int lo, int hi) {
    uint8_t *p = malloc((size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = (uint8_t)(127 + lo + (int)(rnd() % (uint64_t)(hi - lo + 1)));
    return p;
}

typedef struct model {
    di_moe_expert ex[E];
    di_cpu_expert_fp4 ex4[E];
    di_cpu_expert_fp8 sh;
    uint16_t x[TMAX * D];
    float w[TMAX * K];
} model;

static void make_model(model *m) {
    for (int e = 0; e < E; e++) {
        m->ex[e] = (di_moe_expert){bytes(I * D / 2), e8m0(I * D / 32, -8, -3), bytes(I * D / 2), e8m0(I * D / 32, -8, -3),
                                   bytes(D * I / 2), e8m0(D * I / 32, -8, -3)};
        m->ex4[e] = (di_cpu_expert_fp4){m->ex[e].w1, m->ex[e].s1, m->ex[e].w3, m->ex[e].s3, m->ex[e].w2, m->ex[e].s2};
    }
    m->sh = (di_cpu_expert_fp8){e4m3(I * D), e8m0((I / 32) * (D / 32), -12, -8), e4m3(I * D),
                                e8m0((I / 32) * (D / 32), -12, -8), e4m3(D * I), e8m0((D / 32) * (I / 32), -12, -8)};
    for (int i = 0; i < TMAX * D; i++) m->x[i] = di_f32_to_bf16((float)gauss());
    for (int i = 0; i < TMAX * K; i++) m->w[i] = (float)(0.05 + 0.3 * ((double)(rnd() >> 11) * 0x1p-53));
}

static void free_model(model *m) {
    for (int e = 0; e < E; e++) {
        const uint8_t *p[6] = {m->ex[e].w1, m->ex[e].s1, m->ex[e].w3, m->ex[e].s3, m->ex[e].w2, m->ex[e].s2};
        for (int j = 0; j < 6; j++) free((void *)p[j]);
    }
    const uint8_t *s[6] = {m->sh.w1, m->sh.s1, m->sh.w3, m->sh.s3, m->sh.w2, m->sh.s2};
    for (int j = 0; j < 6; j++) free((void *)s[j]);
}

/* ids: distinct per token unless `repeat`; token 0 takes the edge ids 0 and E−1 */
static void make_ids(int T, int repeat, int32_t *ids) {
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            int32_t e;
            int again;
            do {
                e = t == 0 && j < 2 ? (j ? 0 : E - 1) : (int32_t)(rnd() % E); /* token 0: the edge ids first */
                again = 0;
                for (int q = 0; q < j && !repeat; q++) again |= ids[t * K + q] == e;
            } while (again);
            ids[t * K + j] = e;
        }
    if (repeat && T > 1) ids[K + 2] = ids[K + 4] = 3; /* token 1 names expert 3 twice */
}

/* forward_block.c's host-planned loop (before moe_routed): acc f32 [T, D] */
static void old_loop(const di_backend *be, const model *m, int T, const int32_t *ids, float *acc) {
    int32_t rows[TMAX * K];
    float roww[TMAX * K];
    uint16_t *xg = malloc(sizeof *xg * TMAX * K * D), *g = malloc(sizeof *g * TMAX * K * I);
    uint16_t *u = malloc(sizeof *u * TMAX * K * I), *a = malloc(sizeof *a * TMAX * K * I);
    uint16_t *ye = malloc(sizeof *ye * TMAX * K * D);
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
        assert_int_equal(be->swiglu(be, g, u, n, I, roww, 10.0f, a, &err), DI_OK);
        assert_int_equal(be->linear_fp4(be, a, n, I, ex->w2, ex->s2, D, ye, &err), DI_OK);
        assert_int_equal(be->scatter_add_rows(be, ye, D, rows, n, acc, &err), DI_OK);
    }
    free(xg), free(g), free(u), free(a), free(ye);
}

static int64_t count_diff_f32(const float *a, const float *b, int64_t n) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += memcmp(a + i, b + i, 4) != 0;
    return d;
}

static void check_against_loop(di_cpu_variant variant) {
    model *m = calloc(1, sizeof *m);
    make_model(m);
    di_backend *be;
    di_error err = {0};
    assert_int_equal(di_backend_cpu_create_variant(2, variant, &be, &err), DI_OK);
    assert_non_null(be->moe_routed);
    const int Ts[] = {1, 5, 16};
    for (int c = 0; c < 6; c++) {
        int T = Ts[c % 3], repeat = c >= 3;
        int32_t ids[TMAX * K];
        make_ids(T, repeat, ids);
        float *ref = malloc(sizeof *ref * TMAX * D), *got = malloc(sizeof *got * TMAX * D);
        old_loop(be, m, T, ids, ref);
        for (int i = 0; i < T * D; i++) got[i] = NAN; /* the slot must overwrite every element */
        assert_int_equal(be->moe_routed(be, m->x, T, D, I, ids, m->w, K, E, m->ex, 10.0f, got, &err), DI_OK);
        int64_t diff = count_diff_f32(got, ref, (int64_t)T * D);
        double mag = 0;
        for (int i = 0; i < T * D; i++) mag += fabs(ref[i]);
        tu_report("moe_routed %s T%d%s: %lld of %d differ from the loop (mean |acc| %.3g)",
                  variant == DI_CPU_SCALAR ? "scalar" : "fast", T, repeat ? " repeats" : "", (long long)diff, T * D,
                  mag / (T * D));
        assert_int_equal(diff, 0);
        assert_true(mag > 0); /* the experts produced something */
        free(ref), free(got);
    }
    di_backend_destroy(be);
    free_model(m);
    free(m);
}

static void test_slot_equals_loop_fast(void **state) {
    (void)state;
    check_against_loop(DI_CPU_FAST);
}
static void test_slot_equals_loop_scalar(void **state) {
    (void)state;
    check_against_loop(DI_CPU_SCALAR);
}

/* slot + shared expert through the backend's ops (moe()'s tail) == moe.c's whole-FFN kernel */
static void test_slot_plus_shared_equals_moe_ffn(void **state) {
    (void)state;
    model *m = calloc(1, sizeof *m);
    make_model(m);
    di_backend *be;
    di_error err = {0};
    assert_int_equal(di_backend_cpu_create(2, &be, &err), DI_OK);
    const int T = 16;
    int32_t ids[TMAX * K], rows[TMAX];
    make_ids(T, 0, ids);
    for (int t = 0; t < T; t++) rows[t] = t;
    float *acc = malloc(sizeof *acc * T * D);
    uint16_t *g = malloc(2 * T * I), *u = malloc(2 * T * I), *a = malloc(2 * T * I), *ys = malloc(2 * T * D);
    uint16_t *out = malloc(2 * T * D), *ref = malloc(2 * T * D);
    assert_int_equal(be->moe_routed(be, m->x, T, D, I, ids, m->w, K, E, m->ex, 10.0f, acc, &err), DI_OK);
    assert_int_equal(be->linear_fp8(be, m->x, T, D, m->sh.w1, m->sh.s1, I, g, &err), DI_OK);
    assert_int_equal(be->linear_fp8(be, m->x, T, D, m->sh.w3, m->sh.s3, I, u, &err), DI_OK);
    assert_int_equal(be->swiglu(be, g, u, T, I, NULL, 10.0f, a, &err), DI_OK);
    assert_int_equal(be->linear_fp8(be, a, T, I, m->sh.w2, m->sh.s2, D, ys, &err), DI_OK);
    assert_int_equal(be->scatter_add_rows(be, ys, D, rows, T, acc, &err), DI_OK);
    assert_int_equal(be->f32_to_bf16(be, acc, (int64_t)T * D, out, &err), DI_OK);
    size_t wsb = di_cpu_moe_workspace(T, D, I, NULL);
    void *ws = malloc(wsb);
    assert_int_equal(di_cpu_moe_ffn(NULL, T, D, I, m->x, ids, m->w, K, E, m->ex4, &m->sh, 10.0f, ref, ws, wsb, &err),
                     DI_OK);
    int64_t diff = 0, nonzero = 0;
    for (int i = 0; i < T * D; i++) diff += out[i] != ref[i], nonzero += (ref[i] & 0x7fff) != 0;
    tu_report("moe_routed + shared vs di_cpu_moe_ffn T%d: %lld of %d differ", T, (long long)diff, T * D);
    assert_int_equal(diff, 0);
    assert_true(nonzero > T * D / 2);
    free(acc), free(g), free(u), free(a), free(ys), free(out), free(ref), free(ws);
    di_backend_destroy(be);
    free_model(m);
    free(m);
}

static void test_slot_refuses_bad_input(void **state) {
    (void)state;
    model *m = calloc(1, sizeof *m);
    make_model(m);
    di_backend *be;
    di_error err = {0};
    assert_int_equal(di_backend_cpu_create(1, &be, &err), DI_OK);
    int32_t ids[TMAX * K];
    float acc[2 * D];
    make_ids(2, 0, ids);
    ids[K + 1] = E; /* token 1 slot 1 */
    assert_int_equal(be->moe_routed(be, m->x, 2, D, I, ids, m->w, K, E, m->ex, 10.0f, acc, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "token 1 slot 1 routed to expert 16"));
    ids[K + 1] = -1;
    assert_int_equal(be->moe_routed(be, m->x, 2, D, I, ids, m->w, K, E, m->ex, 10.0f, acc, &err), DI_ERR_INVALID);
    make_ids(2, 0, ids);
    di_moe_expert keep = m->ex[ids[3]];
    m->ex[ids[3]].w2 = NULL;
    assert_int_equal(be->moe_routed(be, m->x, 2, D, I, ids, m->w, K, E, m->ex, 10.0f, acc, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "has no weights"));
    m->ex[ids[3]] = keep;
    assert_int_equal(be->moe_routed(be, m->x, 2, D + 1, I, ids, m->w, K, E, m->ex, 10.0f, acc, &err), DI_ERR_INVALID);
    assert_int_equal(be->moe_routed(be, m->x, DI_MOE_ROUTED_MAX_PAIRS, D, I, ids, m->w, K, E, m->ex, 10.0f, acc, &err),
                     DI_ERR_INVALID);
    assert_int_equal(be->moe_routed(be, m->x, 0, D, I, ids, m->w, K, E, m->ex, 10.0f, acc, &err), DI_OK);
    di_backend_destroy(be);
    free_model(m);
    free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slot_equals_loop_fast),
        cmocka_unit_test(test_slot_equals_loop_scalar),
        cmocka_unit_test(test_slot_plus_shared_equals_moe_ffn),
        cmocka_unit_test(test_slot_refuses_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
