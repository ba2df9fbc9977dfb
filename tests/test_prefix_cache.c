/* Prefix cache with SWA bounded replay (engine/prefix_cache.h) on the golden tiny checkpoints
 * (W = 16, default margin 8: keep = 24; block 16 tokens):
 *  - the default keep is W + di_cache_default_margin(cfg): 140 on the released config
 *    (tests/data/v41-flash-config, no weights), the golden tiny configs' own value, and what the
 *    sessions and the session runner's prefix cache use;
 *  - a hit restores the compressed KV / index keys byte-identical to the sequence that stored them
 *    (the replay never overwrites them), and the window below the replay start is unreadable;
 *  - replaying the same hit twice gives bit-identical logits and cache images;
 *  - a hit no longer than keep is declined by match; forced through restore (replay from 0) it is
 *    bit-identical to the same chunking without any cache;
 *  - a longer hit is inexact by design: the continuation's logit error against a full prefill is
 *    reported next to the golden noise floors and next to the error of plain chunking (bounded loosely
 *    so a broken restore still fails);
 *  - eviction under a small budget (LRU leaves, pinned paths never evicted) and refcounts;
 *  - the engine's claims: bytes counted and pinned up front, a full budget of pinned claims rejects,
 *    an unfilled claim settles dead (never matched or extended) and is evicted first;
 *  - the mkmodel tiny preset (real 129,280-token vocabulary) with the default 64-token blocks: the
 *    hit's compressed prefix byte-identical, the continuation's error reported;
 *  - the cached session runner (engine/api_runner.h) with the prefix cache on: blocks claimed and
 *    filled from the first request's live session (prefix_fill), the second request's piece from the
 *    replay start restores them — hit and replay counted, its logits those of a restore + forward of
 *    the rest; a hit whose blocks were never filled is computed instead (logits of a plain prefill
 *    split at P, bit for bit);
 *  - bad input fails cleanly.
 * di-test: asan */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/api_runner.h"
#include "engine/prefix_cache.h"
#include "io/safetensors.h"
#include "model/golden.h"
#include "model/mkmodel.h"
#include "model/session.h"
#include "testutil.h"

#define BLOCK 16

typedef struct gcase {
    di_model *m;
    di_backend *be;
    di_safetensors *st;
    const int32_t *prompt, *dec_ids;
    int64_t T, N, V;
    double floor_prompt, floor_decode;
    char name[64];
} gcase;

static void open_gcase(const char *dir, gcase *g) {
    memset(g, 0, sizeof *g);
    char p[1200];
    di_error err = {0};
    if (di_model_open(dir, &g->m, &err) || di_backend_cpu_create(1, &g->be, &err)) fail_msg("%s: %s", dir, err.msg);
    snprintf(p, sizeof p, "%s/golden.safetensors", dir);
    if (di_st_open(p, &g->st, &err)) fail_msg("%s", err.msg);
    g->T = di_st_find(g->st, "prompt_ids")->shape[0];
    g->N = di_st_find(g->st, "decode_ids")->shape[0];
    g->V = g->m->cfg.vocab_size;
    g->prompt = di_st_find(g->st, "prompt_ids")->data;
    g->dec_ids = di_st_find(g->st, "decode_ids")->data;
    snprintf(p, sizeof p, "%s/case.json", dir);
    json_error_t je;
    json_t *root = json_load_file(p, 0, &je);
    if (!root) fail_msg("%s: %s", p, je.text);
    json_t *nf = json_object_get(root, "noise_floor");
    g->floor_prompt = json_number_value(json_object_get(nf, "prompt_logits"));
    g->floor_decode = json_number_value(json_object_get(nf, "decode_logits"));
    snprintf(g->name, sizeof g->name, "%s", json_string_value(json_object_get(root, "case")));
    json_decref(root);
    assert_true(g->floor_prompt > 0 && g->floor_decode > 0);
}

static void close_gcase(gcase *g) {
    di_st_close(g->st);
    di_backend_destroy(g->be);
    di_model_close(g->m);
}

static di_session *new_session(const gcase *g) {
    di_session *s;
    di_error err = {0};
    di_session_opts so = {.max_tokens = g->T + g->N, .spec_margin = -1};
    assert_int_equal(di_session_create(g->m, g->be, &so, &s, &err), DI_OK);
    return s;
}

/* Continue s (at length p0) with prompt[p0..T) (logits of every position into out + p0·V), then
 * teacher-forced decode of decode_ids (logits into dec). */
static void continue_run(const gcase *g, di_session *s, float *out, float *dec) {
    di_error err = {0};
    int64_t p0 = di_session_len(s), V = g->V;
    assert_int_equal(di_session_forward(s, g->prompt + p0, g->T - p0, true, out + p0 * V, NULL, &err), DI_OK);
    for (int64_t i = 0; i < g->N; i++)
        assert_int_equal(di_session_forward(s, &g->dec_ids[i], 1, false, dec + i * V, NULL, &err), DI_OK);
}

static uint8_t *image_of(const di_cache *c, int64_t *n) {
    di_error err = {0};
    *n = di_cache_image_bytes(c);
    uint8_t *img = malloc((size_t)*n);
    assert_non_null(img);
    assert_int_equal(di_cache_image(c, img, *n, NULL, &err), DI_OK);
    return img;
}

static uint8_t *prefix_of(const di_cache *c, int64_t t1, int64_t *n) {
    di_error err = {0};
    *n = di_cache_prefix_span_bytes(c, 0, t1);
    uint8_t *b = malloc((size_t)*n + 1);
    assert_non_null(b);
    assert_int_equal(di_cache_prefix_export(c, 0, t1, b, *n, &err), DI_OK);
    return b;
}

/* Dump hook: a copy of the first stage whose name ends in `suffix` (the first Engram layer's hashed
 * embedding rows: a function of the token ids and the n-gram history only). */
typedef struct grab {
    const char *suffix;
    uint16_t *data; /* bf16 [shape[0], shape[1]] */
    int64_t rows, cols;
} grab;

static void grab_dump(void *ctx, const char *name, di_dtype dtype, int ndim, const int64_t *shape, const void *data) {
    grab *g = ctx;
    size_t nl = strlen(name), sl = strlen(g->suffix);
    if (g->data || nl < sl || strcmp(name + nl - sl, g->suffix) || dtype != DI_BF16 || ndim != 2) return;
    g->rows = shape[0], g->cols = shape[1];
    g->data = malloc(sizeof(uint16_t) * (size_t)(g->rows * g->cols));
    if (g->data) memcpy(g->data, data, sizeof(uint16_t) * (size_t)(g->rows * g->cols));
}

static void run_replay_case(const char *dir) {
    gcase g;
    open_gcase(dir, &g);
    int64_t T = g.T, N = g.N, V = g.V;
    di_error err = {0};
    float *full = malloc(sizeof(float) * (size_t)(T * V)), *full_dec = malloc(sizeof(float) * (size_t)(N * V));
    float *r1 = malloc(sizeof(float) * (size_t)(T * V)), *r1_dec = malloc(sizeof(float) * (size_t)(N * V));
    float *r2 = malloc(sizeof(float) * (size_t)(T * V)), *r2_dec = malloc(sizeof(float) * (size_t)(N * V));
    float *ch = malloc(sizeof(float) * (size_t)(T * V)), *ch_dec = malloc(sizeof(float) * (size_t)(N * V));
    assert_true(full && full_dec && r1 && r1_dec && r2 && r2_dec && ch && ch_dec);

    /* the reference run: one-chunk prefill, then decode; its prompt is stored in the prefix cache */
    di_session *a = new_session(&g);
    grab ga = {.suffix = "engram.rows"};
    di_fwd_opts fa = {.dump = grab_dump, .dump_ctx = &ga};
    assert_int_equal(di_session_forward(a, g.prompt, T, true, full, &fa, &err), DI_OK);
    assert_non_null(ga.data);
    di_prefix_cache *pc;
    di_prefix_cache_opts po = {.block_tokens = BLOCK, .budget_bytes = 1 << 24};
    assert_int_equal(di_prefix_cache_create(&po, &pc, &err), DI_OK);
    int64_t added;
    assert_int_equal(di_prefix_cache_insert(pc, g.prompt, T, a->cache, &added, &err), DI_OK);
    assert_int_equal(added, T / BLOCK);
    for (int64_t i = 0; i < N; i++)
        assert_int_equal(di_session_forward(a, &g.dec_ids[i], 1, false, full_dec + i * V, NULL, &err), DI_OK);

    /* the hit: every whole block that leaves a token to run */
    di_session *b = new_session(&g);
    int64_t keep = di_prefix_cache_keep(pc, b);
    assert_int_equal(keep, di_prefix_default_keep(&g.m->cfg));
    di_prefix_hit hit;
    assert_int_equal(di_prefix_cache_match(pc, g.prompt, T, keep, &hit, &err), DI_OK);
    int64_t P = (T - 1) / BLOCK * BLOCK, r = P - keep;
    assert_int_equal(hit.tokens, P);
    assert_true(P > keep);
    assert_int_equal(di_prefix_cache_restore(pc, &hit, b, g.prompt, 0, NULL, &err), DI_OK);
    assert_int_equal(di_session_len(b), P);

    /* the restored compressed KV / index keys are the stored sequence's, byte for byte: the replay of
     * [r, P) recomputed its own entries from truncated windows and dropped them */
    int64_t na, nb;
    uint8_t *pa = prefix_of(a->cache, P, &na), *pb = prefix_of(b->cache, P, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(pa, pb, (size_t)na);
    /* below the replay start no window row is readable; from it on every one is */
    uint16_t *rows = malloc(sizeof(uint16_t) * (size_t)(P * g.m->cfg.head_dim));
    assert_non_null(rows);
    assert_int_equal(di_cache_window_rows(b->cache, 0, r - 1, r + 1, rows, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "below the replay start"));
    assert_int_equal(di_cache_window_rows(b->cache, 0, P - g.m->cfg.sliding_window, P, rows, &err), DI_OK);
    continue_run(&g, b, r1, r1_dec);
    int64_t img1_n;
    uint8_t *img1 = image_of(b->cache, &img1_n);

    /* replay again (same session memory, reset by the restore): bit-identical */
    assert_int_equal(di_prefix_cache_restore(pc, &hit, b, g.prompt, 0, NULL, &err), DI_OK);
    continue_run(&g, b, r2, r2_dec);
    int64_t img2_n;
    uint8_t *img2 = image_of(b->cache, &img2_n);
    assert_int_equal(img1_n, img2_n);
    assert_memory_equal(img1, img2, (size_t)img1_n);
    assert_memory_equal(r1 + P * V, r2 + P * V, sizeof(float) * (size_t)((T - P) * V));
    assert_memory_equal(r1_dec, r2_dec, sizeof(float) * (size_t)(N * V));
    di_prefix_cache_release(pc, &hit);

    /* the replay hashes its first positions with the restored n-gram history: its Engram rows are
     * the full run's rows of [r, P) bit for bit (the restore puts the history from the token ids) */
    grab gb = {.suffix = "engram.rows"};
    di_fwd_opts fb = {.dump = grab_dump, .dump_ctx = &gb};
    const uint8_t *span = pa;
    assert_int_equal(di_session_prefix_restore(b, g.prompt, keep, &span, &P, 1, NULL, &fb, &err), DI_OK);
    assert_non_null(gb.data);
    assert_int_equal(gb.rows, P - r);
    assert_int_equal(gb.cols, ga.cols);
    assert_memory_equal(gb.data, ga.data + r * ga.cols, sizeof(uint16_t) * (size_t)((P - r) * ga.cols));
    free(ga.data), free(gb.data);

    /* plain chunking at the same boundary, no cache: the noise the split alone brings */
    di_session *c = new_session(&g);
    assert_int_equal(di_session_forward(c, g.prompt, P, false, NULL, NULL, &err), DI_OK);
    continue_run(&g, c, ch, ch_dec);

    double e_rep = di_rel_err_f32(r1 + P * V, full + P * V, (T - P) * V);
    double e_rep_dec = di_rel_err_f32(r1_dec, full_dec, N * V);
    double e_ch = di_rel_err_f32(ch + P * V, full + P * V, (T - P) * V);
    double e_ch_dec = di_rel_err_f32(ch_dec, full_dec, N * V);
    int64_t agree = 0;
    for (int64_t i = 0; i < N; i++) {
        int64_t am = 0, bm = 0;
        for (int64_t v = 1; v < V; v++) {
            if (r1_dec[i * V + v] > r1_dec[i * V + am]) am = v;
            if (full_dec[i * V + v] > full_dec[i * V + bm]) bm = v;
        }
        agree += am == bm;
    }
    tu_report("%s hit %lld of %lld tokens, keep %lld (replay [%lld, %lld)): continuation prompt logits rel %.3e, "
              "decode rel %.3e vs full prefill (noise floors: prompt %.3e, decode %.3e; plain chunking at %lld: "
              "%.3e / %.3e); greedy decode argmax agreement %lld/%lld",
              g.name, (long long)P, (long long)T, (long long)keep, (long long)r, (long long)P, e_rep, e_rep_dec,
              g.floor_prompt, g.floor_decode, (long long)P, e_ch, e_ch_dec, (long long)agree, (long long)N);
    /* inexact by design, but within the bound the decode tests use (3× the golden noise floor) */
    assert_true(e_rep < 3 * g.floor_prompt && e_rep_dec < 3 * g.floor_decode);

    free(pa), free(pb), free(rows), free(img1), free(img2);
    free(full), free(full_dec), free(r1), free(r1_dec), free(r2), free(r2_dec), free(ch), free(ch_dec);
    di_session_destroy(a), di_session_destroy(b), di_session_destroy(c);
    di_prefix_cache_destroy(pc);
    close_gcase(&g);
}

static void test_replay_nosel(void **st) { run_replay_case(tu_data("v41-tiny-nosel")); }
static void test_replay_sel(void **st) { run_replay_case(tu_data("v41-tiny-sel")); }

/* A hit no longer than keep: match declines it; forced through a restore with keep ≥ P (replay from
 * 0) the run equals the same chunking without any cache bit for bit. */
static void test_short_hit_exact(void **st) {
    gcase g;
    open_gcase(tu_data("v41-tiny-nosel"), &g);
    int64_t T = g.T, N = g.N, V = g.V, P = 2 * BLOCK;
    di_error err = {0};
    float *x = malloc(sizeof(float) * (size_t)(T * V)), *xd = malloc(sizeof(float) * (size_t)(N * V));
    float *y = malloc(sizeof(float) * (size_t)(T * V)), *yd = malloc(sizeof(float) * (size_t)(N * V));
    assert_true(x && xd && y && yd);
    di_session *a = new_session(&g);
    assert_int_equal(di_session_forward(a, g.prompt, P, false, NULL, NULL, &err), DI_OK);
    continue_run(&g, a, x, xd);
    di_prefix_cache *pc;
    di_prefix_cache_opts po = {.block_tokens = BLOCK, .budget_bytes = 1 << 24};
    assert_int_equal(di_prefix_cache_create(&po, &pc, &err), DI_OK);
    assert_int_equal(di_prefix_cache_insert(pc, g.prompt, P, a->cache, NULL, &err), DI_OK);

    di_prefix_hit hit;
    assert_int_equal(di_prefix_cache_match(pc, g.prompt, T, P, &hit, &err), DI_OK); /* keep = P */
    assert_int_equal(hit.tokens, 0);
    assert_int_equal(di_prefix_cache_match(pc, g.prompt, T, P - 1, &hit, &err), DI_OK);
    assert_int_equal(hit.tokens, P);
    di_session *b = new_session(&g);
    assert_int_equal(di_prefix_cache_restore(pc, &hit, b, g.prompt, P, NULL, &err), DI_OK);
    di_prefix_cache_release(pc, &hit);
    continue_run(&g, b, y, yd);
    assert_memory_equal(x + P * V, y + P * V, sizeof(float) * (size_t)((T - P) * V));
    assert_memory_equal(xd, yd, sizeof(float) * (size_t)(N * V));
    tu_report("%s hit %lld <= keep: declined by match; replay from 0 bit-identical to no cache over %lld prompt + %lld "
              "decode positions",
              g.name, (long long)P, (long long)(T - P), (long long)N);
    free(x), free(xd), free(y), free(yd);
    di_session_destroy(a), di_session_destroy(b);
    di_prefix_cache_destroy(pc);
    close_gcase(&g);
}

/* Eviction under a budget of 3 blocks, refcounts pinning a path, and bad input. Tokens are fed to a
 * session only to have a cache that holds them; two prompts share nothing. */
static void test_eviction_refcounts(void **st) {
    gcase g;
    open_gcase(tu_data("v41-tiny-nosel"), &g);
    di_error err = {0};
    int64_t n = 4 * BLOCK;
    int32_t *other = malloc(sizeof(int32_t) * (size_t)n);
    assert_non_null(other);
    for (int64_t i = 0; i < n; i++) other[i] = g.prompt[n - 1 - i] ^ 1; /* differs in the first block */
    assert_true(other[0] != g.prompt[0] || other[1] != g.prompt[1]);
    di_session *a = new_session(&g), *b = new_session(&g);
    assert_int_equal(di_session_forward(a, g.prompt, n, false, NULL, NULL, &err), DI_OK);
    assert_int_equal(di_session_forward(b, other, n, false, NULL, NULL, &err), DI_OK);
    int64_t blk = di_cache_prefix_span_bytes(a->cache, 0, BLOCK);
    assert_true(blk > 0);

    di_prefix_cache *pc;
    di_prefix_cache_opts po = {.block_tokens = BLOCK, .budget_bytes = 3 * blk};
    assert_int_equal(di_prefix_cache_create(&po, &pc, &err), DI_OK);
    di_prefix_stats s;
    int64_t added;
    /* 4 blocks into a 3-block budget: the 4th would have to evict its own parent: not stored */
    assert_int_equal(di_prefix_cache_insert(pc, g.prompt, n, a->cache, &added, &err), DI_OK);
    di_prefix_cache_stats(pc, &s);
    assert_int_equal(added, 3);
    assert_int_equal(s.nodes, 3);
    assert_int_equal(s.bytes, 3 * blk);
    assert_int_equal(s.rejected, 1);

    /* a pinned path is never evicted: the other prompt finds no room */
    di_prefix_hit hit;
    assert_int_equal(di_prefix_cache_match(pc, g.prompt, n, BLOCK, &hit, &err), DI_OK);
    assert_int_equal(hit.tokens, 3 * BLOCK);
    assert_int_equal(di_prefix_cache_insert(pc, other, n, b->cache, &added, &err), DI_OK);
    di_prefix_cache_stats(pc, &s);
    assert_int_equal(added, 0);
    assert_int_equal(s.evictions, 0);
    di_prefix_cache_release(pc, &hit);
    assert_null(hit.nodes);

    /* unpinned: LRU leaves go, deepest first (an inner node only after its children) */
    assert_int_equal(di_prefix_cache_insert(pc, other, 2 * BLOCK, b->cache, &added, &err), DI_OK);
    di_prefix_cache_stats(pc, &s);
    assert_int_equal(added, 2);
    assert_int_equal(s.evictions, 2);
    assert_int_equal(s.nodes, 3);
    assert_int_equal(di_prefix_cache_match(pc, g.prompt, n, 0, &hit, &err), DI_OK);
    assert_int_equal(hit.tokens, BLOCK); /* only the first block of the old prompt is left */
    di_prefix_cache_release(pc, &hit);
    assert_int_equal(di_prefix_cache_match(pc, other, n, 0, &hit, &err), DI_OK);
    assert_int_equal(hit.tokens, 2 * BLOCK);
    di_prefix_cache_release(pc, &hit);
    di_prefix_cache_stats(pc, &s);
    tu_report("budget of 3 blocks (%lld B each): %lld nodes, %lld evictions, %lld rejected, %lld hits of %lld lookups",
              (long long)blk, (long long)s.nodes, (long long)s.evictions, (long long)s.rejected, (long long)s.hits,
              (long long)s.lookups);

    /* bad input */
    assert_int_equal(di_prefix_cache_insert(pc, g.prompt, n + 1, a->cache, NULL, &err), DI_ERR_INVALID);
    di_prefix_cache *odd;
    di_prefix_cache_opts oo = {.block_tokens = 3, .budget_bytes = 1 << 20};
    assert_int_equal(di_prefix_cache_create(&oo, &odd, &err), DI_OK);
    assert_int_equal(di_prefix_cache_insert(odd, g.prompt, n, a->cache, NULL, &err), DI_ERR_INVALID); /* ratio 2 */
    di_prefix_cache_destroy(odd);
    di_prefix_cache_opts neg = {.block_tokens = 16, .budget_bytes = -1};
    assert_int_equal(di_prefix_cache_create(&neg, &odd, &err), DI_ERR_INVALID);
    assert_int_equal(di_cache_prefix_begin(b->cache, 33, 0, &err), DI_ERR_INVALID); /* unaligned */
    assert_int_equal(di_cache_prefix_begin(b->cache, 32, 0, &err), DI_OK);
    uint8_t *span = malloc((size_t)blk);
    assert_non_null(span);
    assert_int_equal(di_cache_prefix_import(b->cache, BLOCK, 2 * BLOCK, span, blk, &err), DI_ERR_INVALID); /* gap */
    assert_int_equal(di_cache_prefix_import(b->cache, 0, BLOCK, span, blk - 1, &err), DI_ERR_INVALID);     /* size */
    uint16_t row[512];
    assert_int_equal(di_cache_cmp_rows(b->cache, 1, 0, 1, row, &err), DI_ERR_INVALID); /* nothing imported yet */
    free(span);
    free(other);
    di_session_destroy(a), di_session_destroy(b);
    di_prefix_cache_destroy(pc);
    close_gcase(&g);
}

static void test_default_keep(void **st) {
    di_config *cfg = malloc(sizeof *cfg);
    assert_non_null(cfg);
    di_error err = {0};
    assert_int_equal(di_config_load(tu_data("v41-flash-config"), cfg, &err), DI_OK);
    int64_t flash = di_prefix_default_keep(cfg);
    assert_int_equal(cfg->sliding_window, 128);
    assert_int_equal(flash, 140); /* DeepInfer's documented default (deepinfer-features §11) */
    assert_int_equal(flash, cfg->sliding_window + di_cache_default_margin(cfg));
    /* a released-config cache made as the sessions make theirs (margin −1: the config's default)
     * replays the same 140: what di_session_replay_keep gives the runner's prefix cache */
    di_cache *fc;
    di_cache_opts fo = {.max_tokens = 512, .spec_margin = -1};
    assert_int_equal(di_cache_create(cfg, &fo, &fc, &err), DI_OK);
    assert_int_equal(fc->window + fc->spec_margin, 140);
    const int falign = di_cache_prefix_align(fc);
    const int64_t fstart = di_prefix_replay_start(1024, flash, falign);
    assert_int_equal(fstart % falign, 0);
    assert_true(1024 - fstart >= flash && 1024 - fstart < flash + falign);
    di_cache_destroy(fc);
    free(cfg);

    gcase g;
    open_gcase(tu_data("v41-tiny-nosel"), &g);
    int64_t tiny = di_prefix_default_keep(&g.m->cfg);
    assert_int_equal(tiny, g.m->cfg.sliding_window + di_cache_default_margin(&g.m->cfg));
    di_session *s = new_session(&g); /* spec_margin −1: the config's default */
    assert_int_equal(di_session_replay_keep(s), tiny);
    di_prefix_cache *pc;
    di_prefix_cache_opts po = {.block_tokens = BLOCK, .budget_bytes = 1 << 20}; /* keep 0: the session's */
    assert_int_equal(di_prefix_cache_create(&po, &pc, &err), DI_OK);
    assert_int_equal(di_prefix_cache_keep(pc, s), tiny);
    di_prefix_cache_destroy(pc);
    di_session_runner *sr;
    di_model_runner it;
    assert_int_equal(di_session_runner_new(g.m, g.be, 64, BLOCK, 8, &sr, &it, &err), DI_OK);
    assert_null(it.prefix);
    assert_int_equal(di_session_runner_enable_prefix(sr, &it, BLOCK, 1 << 20, &err), DI_OK);
    assert_ptr_equal(it.prefix, sr->prefix);
    assert_int_equal(di_prefix_cache_keep(it.prefix, NULL), tiny); /* what the scheduler budgets with */
    assert_int_equal(di_prefix_cache_align(it.prefix), di_cache_prefix_align(s->cache));
    tu_report("default replay keep: released config %lld (W %d + margin %d; align %d: a 1024-token hit replays "
              "[%lld, 1024)), golden tiny %lld (W %d + margin %d)",
              (long long)flash, 128, (int)(flash - 128), falign, (long long)fstart, (long long)tiny,
              g.m->cfg.sliding_window, (int)(tiny - g.m->cfg.sliding_window));
    di_session_runner_free(sr);
    di_session_destroy(s);
    close_gcase(&g);
}

/* The engine's path, tree side only (no model): claims count their bytes up front and are pinned;
 * a full budget of pinned claims rejects the next; a settled claim that was never filled is dead —
 * matches and claims stop there — and goes first when room is needed. */
static void test_claim_settle(void **st) {
    di_error err = {0};
    int32_t ids[4 * BLOCK];
    for (int i = 0; i < 4 * BLOCK; i++) ids[i] = 7 * i + 1;
    di_prefix_cache *pc;
    di_prefix_cache_opts po = {.block_tokens = BLOCK, .budget_bytes = 2000, .keep = 4, .align = 4, .block_bytes = 1000};
    assert_int_equal(di_prefix_cache_create(&po, &pc, &err), DI_OK);
    di_prefix_node *a, *b, *c;
    int created;
    assert_int_equal(di_prefix_cache_claim(pc, NULL, ids, &a, &created, &err), DI_OK);
    assert_true(a && created);
    assert_int_equal(di_prefix_cache_claim(pc, NULL, ids, &c, &created, &err), DI_OK); /* the same block again */
    assert_ptr_equal(c, a);
    assert_false(created);
    di_prefix_cache_unpin(c);
    assert_int_equal(di_prefix_cache_claim(pc, a, ids + BLOCK, &b, &created, &err), DI_OK);
    assert_true(b && created);
    assert_int_equal(di_prefix_cache_claim(pc, b, ids + 2 * BLOCK, &c, &created, &err), DI_OK);
    assert_null(c); /* 2000 bytes of pinned claims: no room */
    di_prefix_stats ps;
    di_prefix_cache_stats(pc, &ps);
    assert_int_equal(ps.bytes, 2000);
    assert_int_equal(ps.rejected, 1);
    /* pending nodes are matched (the engine fills them before any restore reads them) */
    di_prefix_hit hit;
    assert_int_equal(di_prefix_cache_match(pc, ids, 4 * BLOCK, 4, &hit, &err), DI_OK);
    assert_int_equal(hit.tokens, 2 * BLOCK);
    assert_false(di_prefix_hit_ready(&hit));
    di_prefix_cache_release(pc, &hit);
    /* no runner filled them: settling marks both dead */
    di_prefix_cache_settle(pc, a);
    di_prefix_cache_settle(pc, b);
    di_prefix_cache_stats(pc, &ps);
    assert_int_equal(ps.dead, 2);
    assert_int_equal(di_prefix_cache_match(pc, ids, 4 * BLOCK, 0, &hit, &err), DI_OK);
    assert_int_equal(hit.matched, 0); /* the root's child is dead */
    assert_int_equal(di_prefix_cache_claim(pc, a, ids + BLOCK, &c, &created, &err), DI_OK);
    assert_null(c); /* no claim below a dead node */
    /* room is made from the dead leaves first: a new path fits */
    int32_t other[BLOCK];
    for (int i = 0; i < BLOCK; i++) other[i] = 5000 + i;
    assert_int_equal(di_prefix_cache_claim(pc, NULL, other, &c, &created, &err), DI_OK);
    assert_true(c && created);
    di_prefix_cache_stats(pc, &ps);
    assert_int_equal(ps.evictions, 1);
    assert_int_equal(ps.bytes, 2000);
    di_prefix_cache_settle(pc, c);
    /* a dead, unpinned node is revived by the next claim: a failed fill is retried, not permanent */
    di_prefix_node *again;
    assert_int_equal(di_prefix_cache_claim(pc, NULL, other, &again, &created, &err), DI_OK);
    assert_ptr_equal(again, c);
    assert_true(created);
    di_prefix_node *second;
    assert_int_equal(di_prefix_cache_claim(pc, NULL, other, &second, &created, &err), DI_OK);
    assert_ptr_equal(second, c);
    assert_false(created); /* pending and pinned: only the first claimer fills it */
    di_prefix_cache_unpin(second);
    int32_t longer[2 * BLOCK]; /* a prompt that continues past the block (the last token is always computed) */
    for (int i = 0; i < 2 * BLOCK; i++) longer[i] = i < BLOCK ? other[i] : 9000 + i;
    assert_int_equal(di_prefix_cache_match(pc, longer, 2 * BLOCK, 0, &hit, &err), DI_OK);
    assert_int_equal(hit.matched, BLOCK); /* matched again (pending, filled before any restore reads it) */
    di_prefix_cache_release(pc, &hit);
    di_prefix_cache_settle(pc, again);
    /* bad options */
    di_prefix_cache *bad;
    di_prefix_cache_opts bo = {.block_tokens = 6, .budget_bytes = 1, .align = 4};
    assert_int_equal(di_prefix_cache_create(&bo, &bad, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "align"));
    di_prefix_cache_opts nb = {.block_tokens = BLOCK, .budget_bytes = 1 << 20};
    assert_int_equal(di_prefix_cache_create(&nb, &bad, &err), DI_OK);
    assert_int_equal(di_prefix_cache_claim(bad, NULL, ids, &c, &created, &err), DI_ERR_INVALID); /* no block_bytes */
    di_prefix_cache_destroy(bad);
    tu_report("claims: 2 pinned blocks fill a 2-block budget (1 rejected); unfilled claims settle dead (%lld) and "
              "are evicted first (%lld)", (long long)ps.dead, (long long)ps.evictions);
    di_prefix_cache_destroy(pc);
}

static void run_piece(di_model_runner *it, int64_t id, const int32_t *ids, int64_t pos0, int32_t n,
                      const di_prefix_hit *hit, float *logits) {
    di_error err = {0};
    di_step_seq sq = {.req_id = id, .pos0 = pos0, .n_tokens = n, .tokens = ids + pos0, .logits_row = 0,
                      .restore = hit, .restore_ids = hit ? ids : NULL};
    di_step_batch b = {.step = 1, .n_seqs = 1, .seqs = &sq, .n_tokens = n, .n_logits_rows = 1};
    if (it->forward(it->ctx, &b, logits, &err)) fail_msg("%s", err.msg);
}

/* Claims the whole blocks of ids[0..n) on one path (as the scheduler does); fill: have the runner
 * write them from request id's session. */
static void claim_blocks(di_model_runner *it, int64_t id, const int32_t *ids, int64_t n, bool fill) {
    di_error err = {0};
    di_prefix_node *parent = NULL, *n_[64];
    di_step_fill f[64];
    int nf = 0;
    for (int64_t t0 = 0; t0 + BLOCK <= n; t0 += BLOCK) {
        int created;
        assert_int_equal(di_prefix_cache_claim(it->prefix, parent, ids + t0, &n_[nf], &created, &err), DI_OK);
        assert_non_null(n_[nf]);
        assert_true(created);
        f[nf] = (di_step_fill){.req_id = id, .t0 = t0, .node = n_[nf]};
        parent = n_[nf++];
    }
    if (fill) it->prefix_fill(it->ctx, f, nf);
    for (int i = 0; i < nf; i++) di_prefix_cache_settle(it->prefix, n_[i]);
}

static void test_runner_prefix(void **st) {
    gcase g;
    open_gcase(tu_data("v41-tiny-nosel"), &g);
    int64_t T = g.T, V = g.V;
    di_error err = {0};
    float *l1 = malloc(sizeof(float) * (size_t)V), *l2 = malloc(sizeof(float) * (size_t)V);
    float *ref = malloc(sizeof(float) * (size_t)V);
    assert_true(l1 && l2 && ref);
    di_session_runner *sr;
    di_model_runner it;
    assert_int_equal(di_session_runner_new(g.m, g.be, T + 8, BLOCK, 64, &sr, &it, &err), DI_OK);
    assert_int_equal(di_session_runner_cache_hit(sr, 1), -1); /* off */
    assert_int_equal(di_session_runner_enable_prefix(sr, &it, BLOCK, 1 << 24, &err), DI_OK);
    run_piece(&it, 1, g.prompt, 0, (int32_t)T, NULL, l1);
    assert_int_equal(di_session_runner_cache_hit(sr, 1), 0);
    int64_t P = (T - 1) / BLOCK * BLOCK, keep = di_prefix_cache_keep(it.prefix, NULL);
    claim_blocks(&it, 1, g.prompt, T, true);
    assert_int_equal(sr->n_filled, T / BLOCK);
    it.release(it.ctx, 1);

    di_prefix_hit hit;
    assert_int_equal(di_prefix_cache_match(it.prefix, g.prompt, T, keep, &hit, &err), DI_OK);
    assert_int_equal(hit.tokens, P);
    assert_true(di_prefix_hit_ready(&hit));
    int64_t r = di_prefix_replay_start(P, keep, di_prefix_cache_align(it.prefix));
    run_piece(&it, 2, g.prompt, r, (int32_t)(T - r), &hit, l2);
    di_prefix_cache_release(it.prefix, &hit);
    assert_int_equal(di_session_runner_cache_hit(sr, 2), P);
    assert_int_equal(sr->n_hit_tokens, P);
    assert_int_equal(sr->n_replayed, P - r);
    assert_int_equal(sr->n_positions, T + (T - r)); /* the second piece's own size */
    it.release(it.ctx, 2);

    /* the same through the session API: restore from the first run's spans, run the rest */
    di_session *a = new_session(&g), *b = new_session(&g);
    assert_int_equal(di_session_forward(a, g.prompt, T, false, ref, NULL, &err), DI_OK);
    assert_memory_equal(ref, l1, sizeof(float) * (size_t)V); /* no hit: the plain forward */
    int64_t nb;
    uint8_t *span = prefix_of(a->cache, P, &nb);
    const uint8_t *sp = span;
    assert_int_equal(di_session_prefix_restore(b, g.prompt, -1, &sp, &P, 1, NULL, NULL, &err), DI_OK);
    assert_int_equal(di_session_forward(b, g.prompt + P, T - P, false, ref, NULL, &err), DI_OK);
    assert_memory_equal(ref, l2, sizeof(float) * (size_t)V);

    /* blocks claimed but never filled (their request failed): a hit through them is computed, exactly
     * the plain prefill split at P, and the settled nodes are dead: never matched again */
    int32_t *other = malloc(sizeof(int32_t) * (size_t)T);
    assert_non_null(other);
    for (int64_t i = 0; i < T; i++) other[i] = g.prompt[i] ^ 3;
    assert_int_equal(di_prefix_cache_match(it.prefix, other, T, keep, &hit, &err), DI_OK);
    assert_int_equal(hit.tokens, 0);
    di_prefix_node *parent = NULL, *nodes[16];
    int nn = 0;
    for (int64_t t0 = 0; t0 + BLOCK <= T; t0 += BLOCK) {
        int created;
        assert_int_equal(di_prefix_cache_claim(it.prefix, parent, other + t0, &nodes[nn], &created, &err), DI_OK);
        parent = nodes[nn++];
    }
    assert_int_equal(di_prefix_cache_match(it.prefix, other, T, keep, &hit, &err), DI_OK);
    assert_int_equal(hit.tokens, P);
    assert_false(di_prefix_hit_ready(&hit));
    float *l3 = malloc(sizeof(float) * (size_t)V);
    assert_non_null(l3);
    int64_t pos_before = sr->n_positions;
    run_piece(&it, 3, other, r, (int32_t)(T - r), &hit, l3);
    di_prefix_cache_release(it.prefix, &hit);
    assert_int_equal(di_session_runner_cache_hit(sr, 3), 0); /* nothing was served */
    assert_int_equal(sr->n_positions - pos_before, T);
    it.release(it.ctx, 3);
    di_session *c = new_session(&g);
    assert_int_equal(di_session_forward(c, other, P, false, NULL, NULL, &err), DI_OK);
    assert_int_equal(di_session_forward(c, other + P, T - P, false, ref, NULL, &err), DI_OK);
    assert_memory_equal(ref, l3, sizeof(float) * (size_t)V);
    for (int i = 0; i < nn; i++) di_prefix_cache_settle(it.prefix, nodes[i]);
    assert_int_equal(di_prefix_cache_match(it.prefix, other, T, keep, &hit, &err), DI_OK);
    assert_int_equal(hit.tokens, 0);
    assert_int_equal(hit.matched, 0);
    di_prefix_stats ps;
    di_prefix_cache_stats(it.prefix, &ps);
    assert_int_equal(ps.dead, nn);

    tu_report("session runner with the prefix cache: second request hit %lld of %lld tokens, %lld replayed: %lld "
              "positions computed instead of %lld (relative last-position logits of the hit %.3e); unfilled hit "
              "computed exactly, %lld blocks dead",
              (long long)P, (long long)T, (long long)(P - r), (long long)(T - r), (long long)T,
              di_rel_err_f32(l2, l1, V), (long long)ps.dead);
    free(span), free(l1), free(l2), free(l3), free(ref), free(other);
    di_session_destroy(a), di_session_destroy(b), di_session_destroy(c);
    di_session_runner_free(sr);
    close_gcase(&g);
}

static void test_preset_block64(void **st) {
    char *dir = tu_tmpdir("prefix");
    di_mkmodel_opts mo = {.preset = "tiny", .seed = 3, .out_dir = dir};
    di_mkmodel_stats ms;
    di_error err = {0};
    assert_int_equal(di_mkmodel_write(&mo, &ms, &err), DI_OK);
    di_model *m;
    di_backend *be;
    assert_int_equal(di_model_open(dir, &m, &err), DI_OK);
    assert_int_equal(di_backend_cpu_create(1, &be, &err), DI_OK);
    enum { T = 200, N = 8 };
    int64_t V = m->cfg.vocab_size;
    int32_t ids[T + N];
    uint64_t x = 12345;
    for (int i = 0; i < T + N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((x >> 33) % (uint64_t)V);
    }
    float *la = malloc(sizeof(float) * (size_t)((N + 1) * V)), *lb = malloc(sizeof(float) * (size_t)((N + 1) * V));
    assert_true(la && lb);
    di_session_opts so = {.max_tokens = T + N, .spec_margin = -1};
    di_session *a, *b;
    assert_int_equal(di_session_create(m, be, &so, &a, &err), DI_OK);
    assert_int_equal(di_session_create(m, be, &so, &b, &err), DI_OK);
    assert_int_equal(di_session_forward(a, ids, T, false, la, NULL, &err), DI_OK);
    di_prefix_cache *pc;
    di_prefix_cache_opts po = {.budget_bytes = 1 << 24}; /* block 0 = 64 */
    assert_int_equal(di_prefix_cache_create(&po, &pc, &err), DI_OK);
    assert_int_equal(di_prefix_cache_block(pc), DI_PREFIX_BLOCK_DEFAULT);
    assert_int_equal(di_prefix_cache_insert(pc, ids, T, a->cache, NULL, &err), DI_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(di_session_forward(a, ids + T + i, 1, false, la + (i + 1) * V, NULL, &err), DI_OK);

    di_prefix_hit hit;
    int64_t keep = di_prefix_cache_keep(pc, b);
    assert_int_equal(di_prefix_cache_match(pc, ids, T, keep, &hit, &err), DI_OK);
    int64_t P = (T - 1) / DI_PREFIX_BLOCK_DEFAULT * DI_PREFIX_BLOCK_DEFAULT;
    assert_int_equal(hit.tokens, P);
    assert_int_equal(di_prefix_cache_restore(pc, &hit, b, ids, 0, NULL, &err), DI_OK);
    di_prefix_cache_release(pc, &hit);
    int64_t na, nb;
    uint8_t *pa = prefix_of(a->cache, P, &na), *pb = prefix_of(b->cache, P, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(pa, pb, (size_t)na);
    assert_int_equal(di_session_forward(b, ids + P, T - P, false, lb, NULL, &err), DI_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(di_session_forward(b, ids + T + i, 1, false, lb + (i + 1) * V, NULL, &err), DI_OK);
    double e = di_rel_err_f32(lb, la, (N + 1) * V);
    /* the same split without any cache: this random model's own chunking noise, for scale */
    float *lc = malloc(sizeof(float) * (size_t)((N + 1) * V));
    di_session *c;
    assert_non_null(lc);
    assert_int_equal(di_session_create(m, be, &so, &c, &err), DI_OK);
    assert_int_equal(di_session_forward(c, ids, P, false, NULL, NULL, &err), DI_OK);
    assert_int_equal(di_session_forward(c, ids + P, T - P, false, lc, NULL, &err), DI_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(di_session_forward(c, ids + T + i, 1, false, lc + (i + 1) * V, NULL, &err), DI_OK);
    double e_ch = di_rel_err_f32(lc, la, (N + 1) * V);
    free(lc);
    di_session_destroy(c);
    int agree = 0;
    for (int i = 0; i <= N; i++) {
        int64_t am = 0, bm = 0;
        for (int64_t v = 1; v < V; v++) {
            if (la[i * V + v] > la[i * V + am]) am = v;
            if (lb[i * V + v] > lb[i * V + bm]) bm = v;
        }
        agree += am == bm;
    }
    di_prefix_stats ps;
    di_prefix_cache_stats(pc, &ps);
    tu_report("mkmodel tiny, block 64: hit %lld of %d tokens (%lld B stored for %lld blocks, %.1f B/token), replay %lld: "
              "logits of the last prompt position + %d decode steps rel %.3e vs full prefill (plain chunking at %lld "
              "without cache: %.3e), argmax agreement %d/%d",
              (long long)P, T, (long long)ps.bytes, (long long)ps.nodes, (double)ps.bytes / (double)(ps.nodes * 64),
              (long long)keep, N, e, (long long)P, e_ch, agree, N + 1);
    assert_true(e < 3 * e_ch); /* loose: the golden cases hold the bound against their noise floors */
    free(pa), free(pb), free(la), free(lb);
    di_session_destroy(a), di_session_destroy(b);
    di_prefix_cache_destroy(pc);
    di_backend_destroy(be);
    di_model_close(m);
    tu_rmtree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_keep),
        cmocka_unit_test(test_replay_nosel),
        cmocka_unit_test(test_replay_sel),
        cmocka_unit_test(test_short_hit_exact),
        cmocka_unit_test(test_eviction_refcounts),
        cmocka_unit_test(test_claim_settle),
        cmocka_unit_test(test_runner_prefix),
        cmocka_unit_test(test_preset_block64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
