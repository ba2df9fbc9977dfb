/* Forward over chunks and decode steps against the golden cases (../shared/golden/README.md), on the
 * per-sequence cache (model/session.h):
 *  - one-chunk and chunked prefill (chunk sizes 1, 7, 37, …): prompt logits within 3× the prompt
 *    noise floor; teacher-forced decode (decode_ids fed at T+i) within 3× the decode floor;
 *  - DSpark (drafts at every decode step): draft logits and confidence within 3× their floors, the
 *    draft ids' column 0 the fed token;
 *  - exact rollback: appending k = 1…8 tokens (as one chunk or one by one) and rolling them back leaves
 *    the cache's canonical image byte-identical, and continuing gives bit-identical logits and drafts;
 *  - bad input (token out of range, rollback beyond the margin, draft without DSpark) fails cleanly.
 * di-test: asan */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "io/safetensors.h"
#include "model/golden.h"
#include "model/session.h"
#include "testutil.h"

typedef struct gcase {
    di_model *m;
    di_backend *be;
    di_safetensors *st;
    const int32_t *prompt, *dec_ids, *d_ids;
    const float *prompt_logits, *dec_logits, *d_conf, *d_logits;
    int64_t T, N, B, V;
    double floor_prompt, floor_decode, floor_conf, floor_dlogits;
    char name[64];
} gcase;

static const void *tensor(const di_safetensors *st, const char *name) {
    const di_tensor_info *t = di_st_find(st, name);
    if (!t) fail_msg("golden tensor %s missing", name);
    return t->data;
}

static double floor_of(json_t *nf, const char *k) {
    json_t *v = json_object_get(nf, k);
    if (!json_is_number(v)) fail_msg("noise floor %s missing", k);
    return json_number_value(v);
}

static int open_gcase(const char *dir, gcase *g) {
    if (!dir) return -1;
    memset(g, 0, sizeof *g);
    char p[1200];
    di_error err = {0};
    if (di_model_open(dir, &g->m, &err) || di_backend_cpu_create(1, &g->be, &err)) fail_msg("%s: %s", dir, err.msg);
    snprintf(p, sizeof p, "%s/golden.safetensors", dir);
    if (di_st_open(p, &g->st, &err)) fail_msg("%s", err.msg);
    g->T = di_st_find(g->st, "prompt_ids")->shape[0];
    g->N = di_st_find(g->st, "decode_ids")->shape[0];
    g->B = g->m->cfg.dspark_block_size;
    g->V = g->m->cfg.vocab_size;
    g->prompt = tensor(g->st, "prompt_ids");
    g->dec_ids = tensor(g->st, "decode_ids");
    g->prompt_logits = tensor(g->st, "prompt_logits");
    g->dec_logits = tensor(g->st, "decode_logits");
    g->d_ids = tensor(g->st, "dspark_draft_ids");
    g->d_conf = tensor(g->st, "dspark_confidence");
    g->d_logits = tensor(g->st, "dspark_draft_logits");
    snprintf(p, sizeof p, "%s/case.json", dir);
    json_error_t je;
    json_t *root = json_load_file(p, 0, &je);
    if (!root) fail_msg("%s: %s", p, je.text);
    json_t *nf = json_object_get(root, "noise_floor");
    g->floor_prompt = floor_of(nf, "prompt_logits");
    g->floor_decode = floor_of(nf, "decode_logits");
    g->floor_conf = floor_of(nf, "dspark_confidence");
    g->floor_dlogits = floor_of(nf, "dspark_draft_logits");
    snprintf(g->name, sizeof g->name, "%s", json_string_value(json_object_get(root, "case")));
    json_decref(root);
    return 0;
}

static void close_gcase(gcase *g) {
    di_st_close(g->st);
    di_backend_destroy(g->be);
    di_model_close(g->m);
}

/* Prefill in the given chunk sizes (cycled; 0-terminated list, NULL = one chunk), then teacher-forced
 * decode with DSpark drafts at every step; every bound asserted and every number reported. */
static void run_case(gcase *g, const int64_t *chunks, const char *label) {
    int64_t T = g->T, N = g->N, B = g->B, V = g->V;
    di_error err = {0};
    di_session *s;
    di_session_opts so = {.max_tokens = T + N, .spec_margin = -1, .dspark = true};
    assert_int_equal(di_session_create(g->m, g->be, &so, &s, &err), DI_OK);
    float *pl = malloc(sizeof(float) * (size_t)(T * V));      /* f32 [T, V] */
    float *dl = malloc(sizeof(float) * (size_t)(N * V));      /* f32 [N, V] */
    int32_t *di = malloc(sizeof(int32_t) * (size_t)(N * (B + 1)));
    float *dc = malloc(sizeof(float) * (size_t)(N * B));
    float *dlg = malloc(sizeof(float) * (size_t)(N * B * V));
    assert_true(pl && dl && di && dc && dlg);
    int ci = 0;
    for (int64_t p = 0; p < T;) {
        int64_t n = chunks ? chunks[ci] : T;
        ci = chunks && chunks[ci + 1] ? ci + 1 : 0;
        if (n > T - p) n = T - p;
        assert_int_equal(di_session_forward(s, g->prompt + p, n, true, pl + p * V, NULL, &err), DI_OK);
        p += n;
    }
    for (int64_t i = 0; i < N; i++) {
        assert_int_equal(di_session_forward(s, &g->dec_ids[i], 1, false, dl + i * V, NULL, &err), DI_OK);
        /* slot 0 of the drafts: the token this step produced — the reference's next id (not in
         * decode_ids for the last step) */
        int32_t next = g->d_ids[i * (B + 1)];
        assert_int_equal(di_session_draft(s, next, NULL, NULL, di + i * (B + 1), dc + i * B, dlg + i * B * V, NULL, &err), DI_OK);
        assert_int_equal(di[i * (B + 1)], next);
    }
    double rp = di_rel_err_f32(pl, g->prompt_logits, T * V), rd = di_rel_err_f32(dl, g->dec_logits, N * V);
    double rc = di_rel_err_f32(dc, g->d_conf, N * B), rl = di_rel_err_f32(dlg, g->d_logits, N * B * V);
    int64_t same_ids = 0;
    for (int64_t i = 0; i < N * (B + 1); i++) same_ids += di[i] == g->d_ids[i];
    tu_report("%s %s: prompt logits rel %.3e (3x floor %.3e), decode logits rel %.3e (3x floor %.3e)", g->name, label, rp,
              3 * g->floor_prompt, rd, 3 * g->floor_decode);
    tu_report("%s %s: dspark confidence rel %.3e (3x floor %.3e), draft logits rel %.3e (3x floor %.3e), draft ids "
              "%lld/%lld equal",
              g->name, label, rc, 3 * g->floor_conf, rl, 3 * g->floor_dlogits, (long long)same_ids,
              (long long)(N * (B + 1)));
    assert_true(rp <= 3 * g->floor_prompt);
    assert_true(rd <= 3 * g->floor_decode);
    assert_true(rc <= 3 * g->floor_conf);
    assert_true(rl <= 3 * g->floor_dlogits);
    free(pl), free(dl), free(di), free(dc), free(dlg);
    di_session_destroy(s);
}

static const int64_t k_chunks[] = {1, 7, 37, 2, 64, 0};

static void test_tiny_nosel(void **st) {
    gcase g;
    assert_int_equal(open_gcase(tu_data("v41-tiny-nosel"), &g), 0);
    run_case(&g, NULL, "one chunk");
    run_case(&g, k_chunks, "chunks 1,7,37,2,64");
    close_gcase(&g);
}

static void test_tiny_sel(void **st) {
    gcase g;
    assert_int_equal(open_gcase(tu_data("v41-tiny-sel"), &g), 0);
    run_case(&g, NULL, "one chunk");
    run_case(&g, k_chunks, "chunks 1,7,37,2,64");
    close_gcase(&g);
}

static void test_mid_nosel(void **st) {
    const char *dir = tu_shared_golden("v41-mid-nosel");
    if (!dir) {
        tu_report("v41-mid-nosel: ../shared/golden/v41-mid-nosel absent, not checked");
        return;
    }
    gcase g;
    assert_int_equal(open_gcase(dir, &g), 0);
    static const int64_t c[] = {129, 1, 70, 0}; /* the window (128) wraps inside a chunk and between */
    run_case(&g, c, "chunks 129,1,70");
    close_gcase(&g);
}

/* Appending k tokens and rolling them back = never having appended them, bit for bit: the cache's
 * canonical image, the next step's logits and its drafts. tiny-sel has every cache kind: ratio-2
 * compressor state, ratio-1 and ratio-2 compressed KV and index keys, Engram history, DSpark windows. */
static void test_rollback_exact(void **st) {
    gcase g;
    assert_int_equal(open_gcase(tu_data("v41-tiny-sel"), &g), 0);
    int64_t V = g.V, B = g.B, T = g.T;
    di_error err = {0};
    di_session *s;
    di_session_opts so = {.max_tokens = T + 64, .spec_margin = 8, .dspark = true};
    assert_int_equal(di_session_create(g.m, g.be, &so, &s, &err), DI_OK);
    assert_int_equal(di_session_forward(s, g.prompt, T, false, NULL, NULL, &err), DI_OK);
    int64_t img_n = di_cache_image_bytes(s->cache);
    uint8_t *img0 = malloc((size_t)img_n * 2), *img1 = malloc((size_t)img_n * 2);
    float *l0 = malloc(sizeof(float) * (size_t)V), *l1 = malloc(sizeof(float) * (size_t)V);
    float *dl0 = malloc(sizeof(float) * (size_t)(B * V)), *dl1 = malloc(sizeof(float) * (size_t)(B * V));
    int32_t d0[16], d1[16];
    float c0[16], c1[16];
    assert_true(img0 && img1 && l0 && l1 && dl0 && dl1 && B + 1 <= 16);
    int64_t pos = T;
    for (int k = 1; k <= 8; k++) {
        /* the state to return to, and what its next step computes */
        int64_t w0, w1;
        assert_int_equal(di_cache_image(s->cache, img0, img_n * 2, &w0, &err), DI_OK);
        const int32_t *junk = g.dec_ids + (k % 4); /* k tokens the sequence will not keep */
        if (k % 2)
            for (int j = 0; j < k; j++) assert_int_equal(di_session_forward(s, junk + j, 1, false, l1, NULL, &err), DI_OK);
        else
            assert_int_equal(di_session_forward(s, junk, k, false, l1, NULL, &err), DI_OK);
        assert_int_equal(di_session_rollback(s, k, &err), DI_OK);
        assert_int_equal(di_session_len(s), pos);
        assert_int_equal(di_cache_image(s->cache, img1, img_n * 2, &w1, &err), DI_OK);
        assert_int_equal(w0, w1);
        assert_memory_equal(img0, img1, (size_t)w0);
        /* continue: the same as a session that never saw them (a twin fed the same kept tokens) */
        int32_t tok = g.dec_ids[(k + 5) % g.N];
        assert_int_equal(di_session_forward(s, &tok, 1, false, l0, NULL, &err), DI_OK);
        assert_int_equal(di_session_draft(s, tok, NULL, NULL, d0, c0, dl0, NULL, &err), DI_OK);
        di_session *twin;
        assert_int_equal(di_session_create(g.m, g.be, &so, &twin, &err), DI_OK);
        int32_t *kept = malloc(sizeof(int32_t) * (size_t)(pos + 1));
        assert_non_null(kept);
        memcpy(kept, g.prompt, sizeof(int32_t) * (size_t)T);
        for (int j = 1; j < k; j++) kept[T + j - 1] = g.dec_ids[(j + 5) % g.N];
        kept[pos] = tok;
        assert_int_equal(di_session_forward(twin, kept, T, false, NULL, NULL, &err), DI_OK);
        for (int64_t p = T; p <= pos; p++)
            assert_int_equal(di_session_forward(twin, kept + p, 1, false, l1, NULL, &err), DI_OK);
        assert_int_equal(di_session_draft(twin, tok, NULL, NULL, d1, c1, dl1, NULL, &err), DI_OK);
        assert_memory_equal(l0, l1, sizeof(float) * (size_t)V);
        assert_memory_equal(d0, d1, sizeof(int32_t) * (size_t)(B + 1));
        assert_memory_equal(c0, c1, sizeof(float) * (size_t)B);
        assert_memory_equal(dl0, dl1, sizeof(float) * (size_t)(B * V));
        free(kept);
        di_session_destroy(twin);
        pos++;
    }
    tu_report("v41-tiny-sel rollback of k = 1..8 tokens: cache image (%lld bytes), next logits and drafts bit-identical "
              "to never appending them",
              (long long)img_n);
    /* deeper than the margin allows: refused, sequence untouched */
    assert_int_equal(di_session_rollback(s, 9, &err), DI_ERR_LIMIT);
    assert_int_equal(di_session_len(s), pos);
    free(img0), free(img1), free(l0), free(l1), free(dl0), free(dl1);
    di_session_destroy(s);
    close_gcase(&g);
}

/* The decode check can fail: teacher-forced decode with a plausible chunking bug in the decode steps
 * only (prefill correct) lands far above 3× the decode floor. (Not every bug does on this random
 * model: decode-only "no sink", "RoPE one position late" and "pre-mix not deferred" measured 2.8e-2,
 * 7.1e-2 and 2.5e-2, under the 9.7e-2 bound; the prefill checks of test_verify catch those.) */
static void test_decode_mutations(void **st) {
    gcase g;
    assert_int_equal(open_gcase(tu_data("v41-tiny-nosel"), &g), 0);
    int64_t T = g.T, N = g.N, V = g.V;
    static const char *names[] = {"window without the cached positions", "Engram hash without history"};
    for (int f = 0; f < 2; f++) {
        di_fwd_opts fo = {0};
        if (f == 0) fo.faults.window_no_history = true;
        else fo.faults.engram_no_history = true;
        di_error err = {0};
        di_session *s;
        di_session_opts so = {.max_tokens = T + N, .spec_margin = -1, .dspark = false};
        assert_int_equal(di_session_create(g.m, g.be, &so, &s, &err), DI_OK);
        float *dl = malloc(sizeof(float) * (size_t)(N * V));
        assert_non_null(dl);
        assert_int_equal(di_session_forward(s, g.prompt, T, false, NULL, NULL, &err), DI_OK);
        for (int64_t i = 0; i < N; i++)
            assert_int_equal(di_session_forward(s, &g.dec_ids[i], 1, false, dl + i * V, &fo, &err), DI_OK);
        double rd = di_rel_err_f32(dl, g.dec_logits, N * V);
        tu_report("%s decode with \"%s\": rel %.3e (3x floor %.3e) — detected", g.name, names[f], rd, 3 * g.floor_decode);
        assert_true(rd > 3 * g.floor_decode);
        free(dl);
        di_session_destroy(s);
    }
    close_gcase(&g);
}

/* The DSpark checks can fail: drafts that ignore the main model's window (the stage ring) land far
 * above 3× both floors. (Weaker bugs can hide under these loose floors on this random model: drafts
 * without the Markov bias measured draft-logit rel 1.2e-1 against a 3.2e-1 bound, a confidence head
 * fed the normed collapse 4.35e-1 against 4.25e-1.) */
static void test_dspark_mutation(void **st) {
    gcase g;
    assert_int_equal(open_gcase(tu_data("v41-tiny-nosel"), &g), 0);
    int64_t T = g.T, N = g.N, V = g.V, B = g.B;
    di_error err = {0};
    di_fwd_opts fo = {.faults.window_no_history = true};
    di_session *s;
    di_session_opts so = {.max_tokens = T + N, .spec_margin = -1, .dspark = true};
    assert_int_equal(di_session_create(g.m, g.be, &so, &s, &err), DI_OK);
    float *dc = malloc(sizeof(float) * (size_t)(N * B)), *dl = malloc(sizeof(float) * (size_t)(N * B * V));
    int32_t ids[16];
    assert_true(dc && dl && B + 1 <= 16);
    assert_int_equal(di_session_forward(s, g.prompt, T, false, NULL, NULL, &err), DI_OK);
    for (int64_t i = 0; i < N; i++) {
        assert_int_equal(di_session_forward(s, &g.dec_ids[i], 1, false, NULL, NULL, &err), DI_OK);
        assert_int_equal(di_session_draft(s, g.d_ids[i * (B + 1)], NULL, NULL, ids, dc + i * B, dl + i * B * V, &fo, &err),
                         DI_OK);
    }
    double rc = di_rel_err_f32(dc, g.d_conf, N * B), rl = di_rel_err_f32(dl, g.d_logits, N * B * V);
    tu_report("%s drafts without the main window: confidence rel %.3e (3x floor %.3e), draft logits rel %.3e (3x floor "
              "%.3e) — detected",
              g.name, rc, 3 * g.floor_conf, rl, 3 * g.floor_dlogits);
    assert_true(rc > 3 * g.floor_conf);
    assert_true(rl > 3 * g.floor_dlogits);
    free(dc), free(dl);
    di_session_destroy(s);
    close_gcase(&g);
}

/* Bad input fails with a message and leaves the sequence as it was. */
static void test_bad_input(void **st) {
    gcase g;
    assert_int_equal(open_gcase(tu_data("v41-tiny-nosel"), &g), 0);
    di_error err = {0};
    di_session *s;
    di_session_opts so = {.max_tokens = 8, .spec_margin = 4, .dspark = false};
    assert_int_equal(di_session_create(g.m, g.be, &so, &s, &err), DI_OK);
    int32_t bad[2] = {1, (int32_t)g.V};
    assert_int_equal(di_session_forward(s, bad, 2, false, NULL, NULL, &err), DI_ERR_INVALID);
    tu_report("out-of-vocabulary token: %s", err.msg);
    assert_non_null(strstr(err.msg, "outside the vocabulary"));
    assert_int_equal(di_session_len(s), 0);
    int32_t ok[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    assert_int_equal(di_session_forward(s, ok, 9, false, NULL, NULL, &err), DI_ERR_LIMIT); /* capacity 8 */
    assert_int_equal(di_session_len(s), 0);
    assert_int_equal(di_session_forward(s, ok, 3, false, NULL, NULL, &err), DI_OK);
    int32_t ids[8];
    float conf[8];
    assert_int_equal(di_session_draft(s, 1, NULL, NULL, ids, conf, NULL, NULL, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "DSpark is off"));
    di_session_destroy(s);
    so.dspark = true, so.max_tokens = 0;
    assert_int_equal(di_session_create(g.m, g.be, &so, &s, &err), DI_ERR_INVALID);
    close_gcase(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_nosel),    cmocka_unit_test(test_tiny_sel),  cmocka_unit_test(test_mid_nosel),
        cmocka_unit_test(test_rollback_exact), cmocka_unit_test(test_decode_mutations),
        cmocka_unit_test(test_dspark_mutation),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
