/* The fused backend slots (backend.h hc_pre, gather_topk) on the CPU, and the graph's fused path:
 *  - di_cpu_gather_topk against row_decode of the rows the contract names (contiguous and paged
 *    tables, −1 and out-of-range ids, the idx columns it writes and the ones it leaves alone);
 *  - di_cpu_hc_pre against the documented op sequence (with and without the expand prologue and the
 *    deferred pre-mix), including that the variants differ from each other;
 *  - the forward with both slots installed (mHC chains fused, compressed entries gathered from the
 *    backend's own top-k lists, no top-k download) against the plain CPU backend (host-planned union
 *    gathers) on the golden tiny models: prompt, decode steps and a batched step over sessions with
 *    their own arena and with paged pool caches (non-identity block tables): every logits row and the
 *    final cache images bit-identical.
 * di-test: asan */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_attn.h"
#include "backend/cpu/cpu_fused.h"
#include "backend/cpu/cpu_ops.h"
#include "io/formats.h"
#include "model/cache_pool.h"
#include "model/session.h"
#include "testutil.h"

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}
static float rnd_f(float lo, float hi) { return lo + (hi - lo) * (float)((rnd() >> 11) * 0x1.0p-53); }
static uint16_t rnd_bf16(float lo, float hi) { return di_f32_to_bf16(rnd_f(lo, hi)); }

/* ---------------- gather_topk ---------------- */

static void test_gather_topk(void **state) {
    (void)state;
    enum { D = 64, N_ENT = 20, PE = 4, PROWS = 10, ROFF = 3, M = 3, K = 5, LDI = 9, W0 = 2 };
    const di_row_codec codec = DI_CODEC_FP4_E4M3;
    const int64_t rb = di_row_codec_bytes(codec, D);
    const int32_t pages[] = {2, 0, 4, 1, 3};                         /* int32 [N_ENT / PE] block table */
    uint8_t *base = calloc(5 * PROWS, (size_t)rb);                   /* uint8 [5·PROWS, rb] */
    uint16_t x[D];                                                   /* bf16 [D] */
    for (int64_t r = 0; r < 5 * PROWS; r++) {
        for (int i = 0; i < D; i++) x[i] = rnd_bf16(-3, 3);
        di_cpu_row_encode(codec, x, D, base + r * rb);
    }
    const int32_t top[M * K] = {0, 5, 19, -1, 7, /* */ 20, 3, -1, 12, 99, /* */ -1, -1, 1, 2, 4};
    uint16_t rows[M * K * D];  /* bf16 [M·K, D] */
    int32_t idx[M * LDI];      /* int32 [M, LDI] */
    for (int i = 0; i < M * LDI; i++) idx[i] = 777;
    di_error err = {0};
    for (int paged = 0; paged < 2; paged++) {
        assert_int_equal(di_cpu_gather_topk(NULL, codec, base, N_ENT, paged ? pages : NULL, PE, PROWS, ROFF, top, M, K,
                                            D, 40, rows, idx + W0, LDI, &err),
                         DI_OK);
        int n_valid = 0;
        for (int t = 0; t < M; t++)
            for (int j = 0; j < K; j++) {
                int32_t e = top[t * K + j];
                const uint16_t *got = rows + (t * K + j) * D;
                uint16_t want[D];
                bool valid = e >= 0 && e < N_ENT;
                if (valid) {
                    int64_t r = paged ? (int64_t)pages[e / PE] * PROWS + ROFF + e % PE : e;
                    di_cpu_row_decode(codec, base + r * rb, D, want);
                } else {
                    memset(want, 0, sizeof want);
                }
                assert_memory_equal(got, want, sizeof want);
                assert_int_equal(idx[t * LDI + W0 + j], valid ? 40 + t * K + j : -1);
                n_valid += valid;
            }
        assert_int_equal(n_valid, 9);
        for (int t = 0; t < M; t++) /* columns outside [W0, W0 + K) untouched */
            for (int j = 0; j < LDI; j++)
                if (j < W0 || j >= W0 + K) assert_int_equal(idx[t * LDI + j], 777);
    }
    /* paged and contiguous read different rows for the same ids */
    uint16_t a[D], b[D];
    di_cpu_row_decode(codec, base + 5 * rb, D, a);
    di_cpu_row_decode(codec, base + ((int64_t)pages[1] * PROWS + ROFF + 1) * rb, D, b);
    assert_true(memcmp(a, b, sizeof a) != 0);
    assert_int_equal(di_cpu_gather_topk(NULL, codec, base, N_ENT, NULL, PE, PROWS, ROFF, top, M, K, 60, 0, rows, idx,
                                        LDI, &err),
                     DI_ERR_INVALID); /* 60 is not a multiple of the codec's group of 16 */
    free(base);
}

/* ---------------- hc_pre ---------------- */

static void test_hc_pre(void **state) {
    (void)state;
    enum { M = 3, HC = 4, D = 96, NMIX = (2 + HC) * HC, ITERS = 20 };
    const float eps = 1e-6f, hc_eps = 1e-6f;
    uint16_t *x0 = malloc(sizeof(uint16_t) * M * HC * D), *x1 = malloc(sizeof(uint16_t) * M * HC * D),
             *x2 = malloc(sizeof(uint16_t) * M * HC * D); /* bf16 [M, HC, D] */
    uint16_t z[M * D], nw[D], h1[M * D], h2[M * D], hd[M * D]; /* bf16 */
    float *fn = malloc(sizeof(float) * NMIX * HC * D);         /* f32 [NMIX, HC·D] */
    float scale[3] = {0.7f, 1.3f, 0.9f}, base[NMIX], post_in[M * HC], comb_in[M * HC * HC], pre_in[M * HC];
    float mix1[M * NMIX], mix2[M * NMIX], pre1[M * HC], pre2[M * HC], po1[M * HC], po2[M * HC], c1[M * HC * HC],
        c2[M * HC * HC];
    for (int i = 0; i < M * HC * D; i++) x0[i] = rnd_bf16(-2, 2);
    for (int i = 0; i < M * D; i++) z[i] = rnd_bf16(-2, 2);
    for (int i = 0; i < D; i++) nw[i] = rnd_bf16(0.5f, 1.5f);
    for (int i = 0; i < NMIX * HC * D; i++) fn[i] = rnd_f(-0.05f, 0.05f);
    for (int i = 0; i < NMIX; i++) base[i] = rnd_f(-1, 1);
    for (int i = 0; i < M * HC; i++) post_in[i] = rnd_f(0, 2), pre_in[i] = rnd_f(0, 1);
    for (int i = 0; i < M * HC * HC; i++) comb_in[i] = rnd_f(0, 0.5f);
    di_error err = {0};
    for (int variant = 0; variant < 4; variant++) {
        bool expand = variant & 1, deferred = variant & 2;
        memcpy(x1, x0, sizeof(uint16_t) * M * HC * D);
        memcpy(x2, x0, sizeof(uint16_t) * M * HC * D);
        assert_int_equal(di_cpu_hc_pre(NULL, x1, expand ? z : NULL, post_in, comb_in, M, HC, D, fn, eps, scale, base,
                                       ITERS, hc_eps, deferred ? pre_in : NULL, nw, mix1, pre1, po1, c1, h1, &err),
                         DI_OK);
        /* the contract, spelled out */
        if (expand) assert_int_equal(di_cpu_hc_expand(z, x2, post_in, comb_in, M, HC, D, x2, &err), DI_OK);
        assert_int_equal(di_cpu_hc_mixes(x2, M, HC, D, fn, eps, mix2, &err), DI_OK);
        assert_int_equal(di_cpu_hc_sinkhorn(mix2, M, HC, scale, base, ITERS, hc_eps, pre2, po2, c2, &err), DI_OK);
        assert_int_equal(di_cpu_hc_collapse(x2, deferred ? pre_in : pre2, M, HC, D, h2, &err), DI_OK);
        di_cpu_rmsnorm(M, D, h2, D, nw, eps, h2, D);
        assert_memory_equal(x1, x2, sizeof(uint16_t) * M * HC * D);
        assert_memory_equal(mix1, mix2, sizeof mix1);
        assert_memory_equal(pre1, pre2, sizeof pre1);
        assert_memory_equal(po1, po2, sizeof po1);
        assert_memory_equal(c1, c2, sizeof c1);
        assert_memory_equal(h1, h2, sizeof h1);
        /* the variants are distinguishable: expand changes x, the deferred pre-mix changes h */
        assert_int_equal(memcmp(x1, x0, sizeof(uint16_t) * M * HC * D) != 0, expand);
        if (variant == 0) memcpy(hd, h1, sizeof hd);
        if (variant == 2) assert_true(memcmp(hd, h1, sizeof hd) != 0);
    }
    assert_int_equal(di_cpu_hc_pre(NULL, x1, NULL, NULL, NULL, M, 9, D, fn, eps, scale, base, ITERS, hc_eps, NULL, nw,
                                   mix1, pre1, po1, c1, h1, &err),
                     DI_ERR_INVALID); /* hc above DI_HC_MAX */
    free(x0), free(x1), free(x2), free(fn);
}

/* ---------------- the graph's fused path ---------------- */

/* Positions per session: past the tiny models' window (16) and top-k width (8 entries of ratio 2);
 * shorter under a sanitizer (~5x slower), still past both. */
#if defined(__SANITIZE_ADDRESS__)
#define MAX_LEN 40
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MAX_LEN 40
#endif
#endif
#ifndef MAX_LEN
#define MAX_LEN 64
#endif
enum { PROMPT = 21, N_SESS = 3 };

/* The fused backend's slots count their calls, so the test knows the graph took the fused path. */
static int64_t g_hc_pre_calls, g_gather_calls;

static int count_hc_pre(const di_backend *be, uint16_t *x, const uint16_t *z, const float *post_in, const float *comb_in,
                        int64_t m, int hc, int64_t d, const float *fn, float norm_eps, const float *scale,
                        const float *base, int iters, float hc_eps, const float *pre_in, const uint16_t *norm_w,
                        float *mixes, float *pre, float *post, float *comb, uint16_t *h, di_error *err) {
    g_hc_pre_calls++;
    return di_cpu_hc_pre(be, x, z, post_in, comb_in, m, hc, d, fn, norm_eps, scale, base, iters, hc_eps, pre_in, norm_w,
                         mixes, pre, post, comb, h, err);
}

static int count_gather(const di_backend *be, di_row_codec codec, const uint8_t *base, int64_t n_entries,
                        const int32_t *pages, int64_t page_entries, int64_t page_rows, int64_t row_off,
                        const int32_t *top, int64_t m, int k, int64_t d, int32_t row0, uint16_t *rows, int32_t *idx,
                        int64_t ldi, di_error *err) {
    g_gather_calls += 1 + (pages != NULL) * 1000000; /* paged calls counted apart */
    return di_cpu_gather_topk(be, codec, base, n_entries, pages, page_entries, page_rows, row_off, top, m, k, d, row0,
                              rows, idx, ldi, err);
}

typedef struct side {
    di_backend *be;
    di_cache_pool *pool;
    di_session *s[N_SESS]; /* 0: own arena; 1, 2: pool caches whose pages interleave */
} side;

static void side_open(side *sd, const di_model *m, bool fused) {
    di_error err = {0};
    assert_int_equal(di_backend_cpu_create(2, &sd->be, &err), DI_OK);
    if (fused) sd->be->hc_pre = count_hc_pre, sd->be->gather_topk = count_gather;
    int align = di_cache_pool_align(&m->cfg);
    di_cache_pool_opts po = {.be = sd->be, .max_tokens = MAX_LEN, .spec_margin = -1, .page_tokens = 2 * align,
                             .n_pages = 2 * (MAX_LEN / (2 * align) + 2), .n_slots = 2};
    assert_int_equal(di_cache_pool_create(&m->cfg, &po, &sd->pool, &err), DI_OK);
    for (int i = 0; i < N_SESS; i++) {
        di_session_opts so = {.max_tokens = MAX_LEN, .spec_margin = -1};
        if (i > 0 && di_cache_pool_cache(sd->pool, &so.cache, &err)) fail_msg("pool cache: %s", err.msg);
        if (di_session_create(m, sd->be, &so, &sd->s[i], &err)) fail_msg("session: %s", err.msg);
    }
}

static void side_close(side *sd) {
    for (int i = 0; i < N_SESS; i++) di_session_destroy(sd->s[i]);
    di_cache_pool_destroy(sd->pool);
    di_backend_destroy(sd->be);
}

static void assert_same_cache(const di_session *a, const di_session *b, const char *what) {
    di_error err = {0};
    int64_t na = di_cache_image_bytes(a->cache), nb = di_cache_image_bytes(b->cache);
    assert_int_equal(na, nb);
    uint8_t *ia = malloc((size_t)na), *ib = malloc((size_t)nb);
    assert_int_equal(di_cache_image(a->cache, ia, na, NULL, &err), DI_OK);
    assert_int_equal(di_cache_image(b->cache, ib, nb, NULL, &err), DI_OK);
    if (memcmp(ia, ib, (size_t)na)) fail_msg("%s: cache images differ", what);
    free(ia), free(ib);
}

static void fused_forward(const char *name) {
    di_model *m = NULL;
    di_error err = {0};
    if (di_model_open(tu_data(name), &m, &err)) fail_msg("%s: %s", name, err.msg);
    const int64_t V = m->cfg.vocab_size;
    side plain, fused;
    g_hc_pre_calls = g_gather_calls = 0;
    side_open(&plain, m, false);
    side_open(&fused, m, true);
    int32_t ids[N_SESS][MAX_LEN];
    for (int i = 0; i < N_SESS; i++)
        for (int t = 0; t < MAX_LEN; t++) ids[i][t] = (int32_t)(3 + rnd() % (uint64_t)(V - 3));
    float *la = malloc(sizeof(float) * (size_t)(4 * V)), *lb = malloc(sizeof(float) * (size_t)(4 * V)); /* f32 [4, V] */
    int64_t rows = 0;
    /* prompts, sessions 1 and 2 alternating in steps of 4 (interleaved pages), then decode steps */
    for (int64_t p = 0; p < PROMPT; p += 4)
        for (int i = 0; i < N_SESS; i++) {
            int64_t n = PROMPT - p < 4 ? PROMPT - p : 4;
            assert_int_equal(di_session_forward(plain.s[i], ids[i] + p, n, true, la, NULL, &err), DI_OK);
            assert_int_equal(di_session_forward(fused.s[i], ids[i] + p, n, true, lb, NULL, &err), DI_OK);
            if (memcmp(la, lb, sizeof(float) * (size_t)(n * V))) fail_msg("%s: prompt chunk at %lld of session %d", name, (long long)p, i);
            rows += n;
        }
    for (int64_t p = PROMPT; p < MAX_LEN - 8; p++) {
        if (p % 3 == 0) { /* one batched step over the three sessions */
            di_session_chunk ca[N_SESS], cb[N_SESS];
            float *lga[N_SESS], *lgb[N_SESS];
            for (int i = 0; i < N_SESS; i++) {
                lga[i] = malloc(sizeof(float) * (size_t)V), lgb[i] = malloc(sizeof(float) * (size_t)V);
                ca[i] = (di_session_chunk){.s = plain.s[i], .ids = ids[i] + p, .n = 1, .logits = lga[i]};
                cb[i] = (di_session_chunk){.s = fused.s[i], .ids = ids[i] + p, .n = 1, .logits = lgb[i]};
            }
            assert_int_equal(di_session_forward_batch(ca, N_SESS, NULL, &err), DI_OK);
            assert_int_equal(di_session_forward_batch(cb, N_SESS, NULL, &err), DI_OK);
            for (int i = 0; i < N_SESS; i++) {
                if (memcmp(lga[i], lgb[i], sizeof(float) * (size_t)V)) fail_msg("%s: batched step %lld, session %d", name, (long long)p, i);
                free(lga[i]), free(lgb[i]);
                rows++;
            }
            continue;
        }
        for (int i = 0; i < N_SESS; i++) {
            assert_int_equal(di_session_forward(plain.s[i], ids[i] + p, 1, false, la, NULL, &err), DI_OK);
            assert_int_equal(di_session_forward(fused.s[i], ids[i] + p, 1, false, lb, NULL, &err), DI_OK);
            if (memcmp(la, lb, sizeof(float) * (size_t)V)) fail_msg("%s: decode step %lld of session %d", name, (long long)p, i);
            rows++;
        }
    }
    for (int i = 0; i < N_SESS; i++) assert_same_cache(plain.s[i], fused.s[i], name);
    assert_true(g_hc_pre_calls >= 2 * m->cfg.n_layers);
    assert_true(g_gather_calls % 1000000 > 0 && g_gather_calls / 1000000 > 0); /* own-arena and paged gathers */
    tu_report("%s: %lld logits rows bit-identical with the fused slots (%lld hc_pre calls, %lld backend gathers "
              "from own arenas, %lld from paged caches)", name, (long long)rows, (long long)g_hc_pre_calls,
              (long long)(g_gather_calls % 1000000), (long long)(g_gather_calls / 1000000));
    free(la), free(lb);
    side_close(&plain);
    side_close(&fused);
    di_model_close(m);
}

static void test_fused_forward_sel(void **state) {
    (void)state;
    fused_forward("v41-tiny-sel");
}

static void test_fused_forward_nosel(void **state) {
    (void)state;
    fused_forward("v41-tiny-nosel");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gather_topk),
        cmocka_unit_test(test_hc_pre),
        cmocka_unit_test(test_fused_forward_sel),
        cmocka_unit_test(test_fused_forward_nosel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
