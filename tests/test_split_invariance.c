/* A request's logits do not depend on how its positions were split into passes. The meaning of a
 * request is its one-shot prompt prefill followed by one decode step per generated token; a position
 * must get the same bits when it is computed in
 *   - a DSpark verify block (several generated positions in one pass, then a rollback),
 *   - a recompute after preemption (prompt ++ generated tokens prefilled again, in the scheduler's
 *     chunks: the request's own chunk size, one more boundary at the prompt's end),
 *   - a prefix-cache restore of its own blocks (the readmission path) whose replay starts at 0,
 * as in that computation. Two things of a row depend on the pass in the reference's terms and are
 * therefore given per row (model/forward_internal.h, forward.c window_lists): the index selection's
 * width (torch's choice among EXACTLY tied bf16 scores depends on it) and the window list's layout
 * (where the compressed part starts decides the attention kernel's 64-index blocking).
 *
 * Models: the mkmodel tiny preset (seed 3: ties at the selection boundary are common) and the golden
 * tiny checkpoint v41-tiny-sel re-configured with a 128-position window and index top-64 (the real
 * model's window: the lists then span three 64-index blocks, so the layout matters; the weights do
 * not depend on either setting). Every comparison is memcmp of whole logits rows (and of the canonical
 * cache image). Each check runs a control with the old rule — the pass's own end as the width and the
 * prompt layout for every row — that must differ somewhere, or the check proves nothing.
 *
 * Also: a pass that crosses the prompt's end (split in two by the session while the prompt is shorter
 * than W), the engine's cache-free recompute runner against the cached decode, and the scheduler's
 * recompute pieces (none crosses the prompt's end; mock runner). What stays inexact
 * by design: a prefix restore whose replay starts after 0 (SWA bounded replay; its error is bounded in
 * test_prefix_cache), and blocks restored from ANOTHER request (their entries carry that request's
 * selection widths).
 * ~22 s CPU here (~35 s under ASan, the golden-sized model only).  di-test: asan */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "backend/backend.h"
#include "engine/engine_core.h"
#include "engine/mock_runner.h"
#include "engine/recompute_runner.h"
#include "model/session.h"
#include "model/weights.h"
#include "testutil.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifdef UNDER_ASAN /* ~5x slower: the golden-sized model only (the tiny preset's 129,280-row head dominates) */
#define G_MAX 12 /* generated tokens of the reference run */
#define WITH_PRESET false
#else
#define G_MAX 24
#define WITH_PRESET true
#endif

enum { P_MAX = 160, CHUNK = 8 };

typedef struct ctx {
    const char *name;
    di_model *m;
    di_backend *be;
    int64_t V;
    int P, G;          /* prompt length, generated tokens */
    int32_t ids[P_MAX + G_MAX];
    float *ref;        /* f32 [P + G, V]: the prompt's rows (one-shot prefill), then decode step j at P + j */
    uint8_t *image;    /* the reference cache image after P + G positions */
    int64_t n_image;
} ctx;

static int32_t argmax(const float *l, int64_t V) {
    int32_t am = 0;
    for (int64_t v = 1; v < V; v++)
        if (l[v] > l[am]) am = (int32_t)v;
    return am;
}

static di_session *session(const ctx *x) {
    di_session_opts so = {.max_tokens = x->P + x->G + 8, .spec_margin = -1};
    di_session *s = NULL;
    di_error err = {0};
    if (di_session_create(x->m, x->be, &so, &s, &err)) fail_msg("%s: session: %s", x->name, err.msg);
    return s;
}

static void fwd(const ctx *x, di_session *s, int64_t p0, int64_t n, bool all, float *logits, int64_t prompt_end) {
    di_error err = {0};
    const di_fwd_opts o = {.prompt_end = prompt_end};
    if (di_session_forward(s, x->ids + p0, n, all, logits, &o, &err))
        fail_msg("%s: pass [%lld, %lld): %s", x->name, (long long)p0, (long long)(p0 + n), err.msg);
}

static bool same_row(const ctx *x, const float *row, int64_t pos) {
    return !memcmp(row, x->ref + pos * x->V, sizeof(float) * (size_t)x->V);
}

static bool same_image(const ctx *x, const di_session *s) {
    int64_t n = di_cache_image_bytes(s->cache);
    uint8_t *img = malloc((size_t)n);
    di_error err = {0};
    assert_non_null(img);
    assert_int_equal(di_cache_image(s->cache, img, n, NULL, &err), DI_OK);
    bool same = n == x->n_image && !memcmp(img, x->image, (size_t)n);
    free(img);
    return same;
}

/* The reference: one-shot prefill of the prompt, then G greedy decode steps. */
static void open_ctx(ctx *x, const char *name, const char *dir, int P, int G) {
    memset(x, 0, sizeof *x);
    x->name = name, x->P = P, x->G = G;
    di_error err = {0};
    if (di_model_open(dir, &x->m, &err) || di_backend_cpu_create(2, &x->be, &err)) fail_msg("%s: %s", name, err.msg);
    x->V = x->m->cfg.vocab_size;
    uint64_t g = 0x9E3779B97F4A7C15ull;
    for (int t = 0; t < P; t++) {
        g ^= g << 13, g ^= g >> 7, g ^= g << 17;
        x->ids[t] = (int32_t)(3 + g % (uint64_t)((x->V < 1000 ? x->V : 1000) - 3));
    }
    x->ref = malloc(sizeof(float) * (size_t)((P + G) * x->V));
    assert_non_null(x->ref);
    di_session *s = session(x);
    fwd(x, s, 0, P, true, x->ref, P);
    for (int j = 0; j < G; j++) {
        x->ids[P + j] = argmax(x->ref + (int64_t)(P + j - 1) * x->V, x->V);
        fwd(x, s, P + j, 1, false, x->ref + (int64_t)(P + j) * x->V, 0);
    }
    x->n_image = di_cache_image_bytes(s->cache);
    x->image = malloc((size_t)x->n_image);
    assert_non_null(x->image);
    assert_int_equal(di_cache_image(s->cache, x->image, x->n_image, NULL, &err), DI_OK);
    di_session_destroy(s);
}

static void close_ctx(ctx *x) {
    free(x->ref), free(x->image);
    di_backend_destroy(x->be);
    di_model_close(x->m);
}

/* Verify blocks of block+1 generated tokens at every offset (each rolled back, then the position
 * decoded as the plain run did), the last one accepted. prompt_end = P: the rule; 0: the control.
 * Returns the rows that differ from the decode steps; *image_ok: the final cache image. */
static int verify_blocks(const ctx *x, int64_t prompt_end, bool *image_ok) {
    const int Bk = x->m->cfg.dspark_block_size + 1;
    float *rows = malloc(sizeof(float) * (size_t)(Bk * x->V));
    assert_non_null(rows);
    di_session *s = session(x);
    di_error err = {0};
    fwd(x, s, 0, x->P, false, rows, x->P);
    int bad = 0;
    for (int k = 0; k + Bk <= x->G; k++) { /* the block feeds the tokens at P+k … P+k+Bk−1 */
        fwd(x, s, x->P + k, Bk, true, rows, prompt_end);
        for (int j = 0; j < Bk; j++) bad += !same_row(x, rows + j * x->V, x->P + k + j);
        if (k + Bk == x->G) break; /* accepted: the session is at P + G */
        if (di_session_rollback(s, Bk, &err)) fail_msg("%s: rollback: %s", x->name, err.msg);
        fwd(x, s, x->P + k, 1, false, rows, 0);
        if (!same_row(x, rows, x->P + k)) fail_msg("%s: decode after a rolled-back block differs at %d", x->name, k);
    }
    *image_ok = di_session_len(s) == x->P + x->G && same_image(x, s);
    di_session_destroy(s);
    free(rows);
    return bad;
}

/* The readmission of a request preempted after k generated tokens: prompt ++ those k prefilled in the
 * scheduler's chunks (CHUNK, a boundary at P), then decoding on to P + G. Returns the rows that differ
 * (recomputed and continued); *image_ok: the final cache image. one_pass: the whole recompute as one
 * pass with prompt_end (the crossing pass the scheduler avoids; prompt_end 0 = the old recompute). */
static int recompute(const ctx *x, int k, bool one_pass, int64_t prompt_end, bool *image_ok) {
    const int64_t n = x->P + k;
    float *rows = malloc(sizeof(float) * (size_t)(n * x->V));
    assert_non_null(rows);
    di_session *s = session(x);
    if (one_pass) {
        fwd(x, s, 0, n, true, rows, prompt_end);
    } else {
        for (int64_t p = 0; p < n;) {
            int64_t e = p + CHUNK < n ? p + CHUNK : n;
            if (p < x->P && e > x->P) e = x->P;
            fwd(x, s, p, e - p, true, rows + p * x->V, x->P);
            p = e;
        }
    }
    int bad = 0;
    for (int64_t p = 0; p < n; p++) bad += !same_row(x, rows + p * x->V, p);
    for (int64_t p = n; p < x->P + x->G; p++) {
        fwd(x, s, p, 1, false, rows, 0);
        bad += !same_row(x, rows, p);
    }
    *image_ok = same_image(x, s);
    di_session_destroy(s);
    free(rows);
    return bad;
}

/* The mkmodel tiny preset, seed 3 (its window is 16: one 64-index block; selections matter). */
static char *g_tiny_dir;
static const char *tiny_model(void) {
    static char model[1024];
    if (!g_tiny_dir) {
        g_tiny_dir = tu_tmpdir("split_invariance");
        snprintf(model, sizeof model, "%s/model", g_tiny_dir);
        assert_int_equal(tu_write_tiny_model(model, 3, NULL), 0);
    }
    return model;
}

/* v41-tiny-sel with the real model's 128-position window and index top-64. */
static char *g_w128_dir;
static const char *w128_model(void) {
    if (g_w128_dir) return g_w128_dir;
    const char *model = g_w128_dir = tu_tmpdir("split_invariance_w128");
    assert_int_equal(tu_write_sel_w128(model), 0);
    return model;
}

static int cleanup(void **state) {
    (void)state;
    if (g_tiny_dir) tu_rmtree(g_tiny_dir);
    if (g_w128_dir) tu_rmtree(g_w128_dir);
    free(g_tiny_dir), free(g_w128_dir);
    return 0;
}

static void check_verify(const char *name, const char *dir, int P, int *ctl_bad) {
    ctx x;
    open_ctx(&x, name, dir, P, G_MAX);
    bool img, img_ctl;
    int bad = verify_blocks(&x, P, &img);
    int ctl = verify_blocks(&x, 0, &img_ctl);
    const int Bk = x.m->cfg.dspark_block_size + 1;
    tu_report("%s, prompt %d: verify blocks of %d at %d offsets: %d rows differ from the decode steps, final cache "
              "image %s; control (every row as wide as the block, prompt layout): %d rows differ, image %s",
              name, P, Bk, G_MAX - Bk + 1, bad, img ? "identical" : "DIFFERENT", ctl, img_ctl ? "identical" : "different");
    assert_int_equal(bad, 0);
    assert_true(img);
    *ctl_bad += ctl + !img_ctl;
    close_ctx(&x);
}

static void test_verify_blocks(void **state) {
    (void)state;
    int ctl = 0;
    if (WITH_PRESET) check_verify("mkmodel tiny seed 3", tiny_model(), 101, &ctl);
    check_verify("v41-tiny-sel W128", w128_model(), 20, &ctl); /* generated rows before W: decode layout */
    assert_true(ctl > 0);
}

static void check_recompute(const char *name, const char *dir, int P, int *ctl_bad) {
    ctx x;
    open_ctx(&x, name, dir, P, G_MAX);
    const int ks[] = {1, 9, G_MAX - 1};
    int bad = 0, n = 0, ctl = 0;
    bool img, all_img = true;
    for (int i = 0; i < 3; i++) {
        bad += recompute(&x, ks[i], false, P, &img);
        all_img = all_img && img;
        n++;
        ctl += recompute(&x, ks[i], true, 0, &img); /* the old recompute: one prefill of the whole history */
        ctl += !img;
    }
    tu_report("%s, prompt %d: %d recomputes (chunks of %d, a boundary at the prompt's end) then decoding to %d: "
              "%d rows differ, cache images %s; control (one prefill of the history): %d rows differ",
              name, P, n, CHUNK, P + G_MAX, bad, all_img ? "identical" : "DIFFERENT", ctl);
    assert_int_equal(bad, 0);
    assert_true(all_img);
    *ctl_bad += ctl;
    close_ctx(&x);
}

static void test_recompute(void **state) {
    (void)state;
    int ctl = 0;
    if (WITH_PRESET) check_recompute("mkmodel tiny seed 3", tiny_model(), 101, &ctl);
    check_recompute("v41-tiny-sel W128", w128_model(), 20, &ctl);
    assert_true(ctl > 0);
}

/* One pass across the prompt's end (the scheduler ends its pieces there; a caller may not): exact
 * whether the prompt reaches W (the two window layouts agree from position W−1 on) or not (the
 * session then runs the prompt part and the rest as two passes, session.c). */
static void test_crossing_pass(void **state) {
    (void)state;
    ctx x;
    bool img;
    const int prompts[2] = {130, 20};
    for (int i = 0; i < 2; i++) {
        open_ctx(&x, "v41-tiny-sel W128", w128_model(), prompts[i], 12);
        int bad = recompute(&x, 9, true, prompts[i], &img);
        tu_report("v41-tiny-sel W128, prompt %d (W 128): one pass over the prompt + 9 generated: %d of %d rows differ, "
                  "image %s", prompts[i], bad, prompts[i] + 12, img ? "identical" : "DIFFERENT");
        assert_int_equal(bad, 0);
        assert_true(img);
        close_ctx(&x);
    }
}

/* The engine's cache-free recompute runner (every row one prefill of the request's history, told the
 * prompt's length): its rows equal the cached decode's bit for bit — the prompt's last row, then every
 * decode step. */
static void test_recompute_runner(void **state) {
    (void)state;
    ctx x;
    open_ctx(&x, "v41-tiny-sel W128", w128_model(), 101, 10); /* prompt < W: the runner's pass is split */
    di_recompute_runner *rr;
    di_model_runner runner;
    di_error err = {0};
    assert_int_equal(di_recompute_runner_new(x.m, x.be, 256, 16, 64, &rr, &runner, &err), DI_OK);
    float *row = malloc(sizeof(float) * (size_t)x.V);
    assert_non_null(row);
    int bad = 0;
    for (int64_t p0 = 0; p0 < x.P + x.G;) {
        const int32_t n = p0 == 0 ? x.P : 1;
        di_step_seq q = {.req_id = 7, .pos0 = p0, .n_tokens = n, .tokens = x.ids + p0, .n_prompt = x.P, .logits_row = 0};
        di_step_batch b = {.step = (uint64_t)p0, .n_seqs = 1, .seqs = &q, .n_tokens = n, .n_logits_rows = 1};
        if (runner.forward(runner.ctx, &b, row, &err)) fail_msg("recompute runner: %s", err.msg);
        bad += !same_row(&x, row, p0 + n - 1);
        p0 += n;
    }
    tu_report("recompute runner, v41-tiny-sel W128, prompt 101: %d of %d rows differ from the cached decode", bad, x.G + 1);
    assert_int_equal(bad, 0);
    free(row);
    di_recompute_runner_free(rr);
    close_ctx(&x);
}

/* Prefix restore of the request's own blocks [0, B) (its readmission after a preemption): a replay
 * from position 0 told the prompt's end reproduces the prompt's rows, the next ones and the cache. */
static void check_restore(const char *name, const char *dir, int P, int64_t B, int *ctl_bad) {
    ctx x;
    open_ctx(&x, name, dir, P, 6);
    di_session *a = session(&x);
    fwd(&x, a, 0, P, false, NULL, P);
    int64_t nb = di_cache_prefix_span_bytes(a->cache, 0, B);
    uint8_t *span = malloc((size_t)nb);
    float *rows = malloc(sizeof(float) * (size_t)(P * x.V));
    di_error err = {0};
    assert_true(span && rows);
    assert_int_equal(di_cache_prefix_export(a->cache, 0, B, span, nb, &err), DI_OK);
    di_session_destroy(a);
    int bad[2] = {0, 0};
    bool img[2];
    for (int ctl = 0; ctl < 2; ctl++) {
        di_session *s = session(&x);
        const uint8_t *spans[1] = {span};
        const int64_t ends[1] = {B};
        const di_fwd_opts ro = {.prompt_end = ctl ? 0 : P};
        assert_true(B <= di_session_replay_keep(s)); /* the replay starts at 0 */
        if (di_session_prefix_restore(s, x.ids, -1, spans, ends, 1, rows + (B - 1) * x.V, &ro, &err))
            fail_msg("%s: restore: %s", name, err.msg);
        bad[ctl] += !same_row(&x, rows + (B - 1) * x.V, B - 1);
        fwd(&x, s, B, P - B, true, rows + B * x.V, P);
        for (int64_t p = B; p < P; p++) bad[ctl] += !same_row(&x, rows + p * x.V, p);
        for (int64_t p = P; p < P + x.G; p++) {
            fwd(&x, s, p, 1, false, rows, 0);
            bad[ctl] += !same_row(&x, rows, p);
        }
        img[ctl] = same_image(&x, s);
        di_session_destroy(s);
    }
    /* the same blocks stored by another request: the first PA ids as its prompt (their entries were
     * selected PA/R wide, not P/R): measured, exact only where no tie straddles a selection's cut */
    int other = 0;
    const int PA = (int)(B + P) / 2;
    {
        di_session *o = session(&x);
        fwd(&x, o, 0, PA, false, NULL, PA);
        assert_int_equal(di_cache_prefix_export(o->cache, 0, B, span, nb, &err), DI_OK);
        di_session_destroy(o);
        di_session *s = session(&x);
        const uint8_t *spans[1] = {span};
        const int64_t ends[1] = {B};
        const di_fwd_opts ro = {.prompt_end = P};
        if (di_session_prefix_restore(s, x.ids, -1, spans, ends, 1, NULL, &ro, &err)) fail_msg("%s: restore: %s", name, err.msg);
        fwd(&x, s, B, P - B, true, rows + B * x.V, P);
        for (int64_t p = B; p < P; p++) other += !same_row(&x, rows + p * x.V, p);
        di_session_destroy(s);
    }
    tu_report("%s, prompt %d: blocks [0, %lld) stored by a request of %d prompt ids: %d of %lld rows differ", name, P,
              (long long)B, PA, other, (long long)(P - B));
    tu_report("%s, prompt %d, own blocks [0, %lld) restored, replay from 0: %d rows differ (%d positions), image %s; "
              "control (replay not told the prompt's end): %d rows differ, image %s",
              name, P, (long long)B, bad[0], P + x.G - (int)B + 1, img[0] ? "identical" : "DIFFERENT", bad[1],
              img[1] ? "identical" : "different");
    assert_int_equal(bad[0], 0);
    assert_true(img[0]);
    *ctl_bad += bad[1] + !img[1];
    free(span), free(rows);
    close_ctx(&x);
}

static void test_prefix_restore_own(void **state) {
    (void)state;
    int ctl = 0;
    if (WITH_PRESET) check_restore("mkmodel tiny seed 3", tiny_model(), 101, 24, &ctl);
    check_restore("v41-tiny-sel W128", w128_model(), 90, 64, &ctl);
    assert_true(ctl > 0);
}

/* The scheduler's recompute pieces (engine level, the mock runner): a request preempted after some
 * outputs re-prefills prompt ++ outputs in its own chunks with one more boundary at the prompt's end,
 * so no piece crosses the prompt's end (one window layout per pass, forward.c window_lists); its
 * outputs are those of the run without preemption. */
static void test_recompute_pieces(void **state) {
    (void)state;
    enum { N = 6, OUT = 14 };
    int32_t prompts[N][24], n_prompt[N];
    int32_t tok[2][N][OUT];
    int64_t n_tok[2][N], preempted = 0;
    for (int run = 0; run < 2; run++) { /* 0: a roomy cache; 1: a tight one (preemptions) */
        di_mock_options mo = {.n_vocab = 300, .max_context = 64, .block_tokens = 4, .n_blocks = run ? 22 : 400,
                              .salt = 5, .sharpness = 8.0f};
        di_mock_runner *mock;
        di_model_runner runner;
        di_error err = {0};
        if (di_mock_runner_new(&mo, &mock, &runner, &err)) fail_msg("%s", err.msg);
        di_core_options co = {.sched = {.max_seqs = 8, .max_step_tokens = 64, .prefill_chunk = 8}};
        di_core *c;
        if (di_core_new(&runner, &co, &c, &err)) fail_msg("%s", err.msg);
        for (int i = 0; i < N; i++) {
            n_prompt[i] = 9 + 2 * i; /* never a multiple of the chunk */
            for (int t = 0; t < n_prompt[i]; t++) prompts[i][t] = 3 + (7 * i + 13 * t) % 290;
            di_seq_params sp = {.sampling = di_sampling_params_default(), .max_tokens = OUT, .ignore_eos = 1};
            sp.sampling.temperature = 0.0f;
            if (di_core_add(c, i, prompts[i], n_prompt[i], &sp, &err)) fail_msg("%s", err.msg);
            n_tok[run][i] = 0;
        }
        di_core_delta d[16];
        for (int guard = 0; di_core_busy(c) && guard < 10000; guard++) {
            if (di_core_step(c, &err)) fail_msg("step: %s", err.msg);
            for (int32_t k; (k = di_core_poll(c, d, 16)) > 0;)
                for (int32_t j = 0; j < k; j++) {
                    for (int64_t t = 0; t < d[j].n_tokens && n_tok[run][d[j].id] < OUT; t++)
                        tok[run][d[j].id][n_tok[run][d[j].id]++] = d[j].tokens[t];
                    if (run && d[j].finish != DI_FINISH_REASON_NONE) preempted += d[j].preemptions;
                }
        }
        for (int64_t l = 0; l < mock->n_log; l++) {
            const di_mock_piece *q = &mock->log[l];
            const int64_t P = n_prompt[q->req_id];
            if (q->pos0 < P && q->pos0 + q->n_tokens > P)
                fail_msg("run %d: request %lld piece [%lld, %lld) crosses its prompt's end %lld", run,
                         (long long)q->req_id, (long long)q->pos0, (long long)(q->pos0 + q->n_tokens), (long long)P);
        }
        di_core_free(c);
        di_mock_runner_free(mock);
    }
    for (int i = 0; i < N; i++) {
        assert_int_equal(n_tok[1][i], n_tok[0][i]);
        assert_memory_equal(tok[1][i], tok[0][i], sizeof(int32_t) * (size_t)n_tok[0][i]);
    }
    tu_report("recompute pieces: %d requests, %lld preemptions in the tight run, no piece crosses a prompt's end, "
              "outputs identical to the roomy run", N, (long long)preempted);
    assert_true(preempted > 0);
}

/* DSpark on: one pass over the prompt plus k generated tokens (rows past the prompt at their decode
 * width; split by the session when the prompt is shorter than the window) fills the stage windows as
 * prefill + decode steps do, so the next draft (ids, confidences, draft logits) is bit-identical.
 * Control: the same pass with the old rule (prompt_end 0) must differ on the long prompt. */
static void draft_after(const ctx *x, int k, int64_t prompt_end, int32_t *ids, float *conf, float *lg) {
    const int n = x->P + x->G;
    di_session_opts so = {.max_tokens = n + 8, .spec_margin = -1, .dspark = true};
    di_session *s = NULL;
    di_error err = {0};
    if (di_session_create(x->m, x->be, &so, &s, &err)) fail_msg("dspark session: %s", err.msg);
    int first = k < 0 ? x->P : x->P + k;
    fwd(x, s, 0, first, false, NULL, prompt_end);
    for (int p = first; p < n; p++) fwd(x, s, p, 1, false, NULL, x->P);
    int32_t tok = argmax(x->ref + (int64_t)(n - 1) * x->V, x->V);
    if (di_session_draft(s, tok, NULL, NULL, ids, conf, lg, NULL, &err)) fail_msg("draft: %s", err.msg);
    di_session_destroy(s);
}

static int dspark_differ(const ctx *x, int64_t prompt_end) {
    const int B = x->m->cfg.dspark_block_size;
    const size_t nl = (size_t)B * (size_t)x->V;
    int32_t ia[16], ib[16];
    float ca[16], cb[16], *la = malloc(sizeof(float) * nl), *lb = malloc(sizeof(float) * nl);
    assert_true(B > 0 && B < 16 && la && lb);
    draft_after(x, -1, x->P, ia, ca, la);
    int differ = 0;
    for (int k = 1; k <= 4; k++) {
        draft_after(x, k, prompt_end < 0 ? 0 : x->P, ib, cb, lb);
        differ += memcmp(ia, ib, sizeof(int32_t) * (size_t)(B + 1)) || memcmp(ca, cb, sizeof(float) * (size_t)B) ||
                  memcmp(la, lb, sizeof(float) * nl);
    }
    free(la), free(lb);
    return differ;
}

static void test_dspark_split(void **state) {
    (void)state;
    const int prompts[2] = {10, 101}; /* shorter than the window 16 (split pass) / longer (per-row widths) */
    for (int i = 0; i < 2; i++) {
        ctx x;
        open_ctx(&x, "tiny", tiny_model(), prompts[i], 6);
        int differ = dspark_differ(&x, x.P), ctl = i == 1 ? dspark_differ(&x, -1) : -1;
        tu_report("DSpark on, tiny W16, prompt %d: draft after one pass over prompt + k generated (k 1-4) vs prefill "
                  "+ decode steps: %d of 4 differ (control, old rule: %d)", prompts[i], differ, ctl);
        assert_int_equal(differ, 0);
        if (i == 1) assert_true(ctl > 0);
        close_ctx(&x);
    }
}

/* prompt_end is checked: a one-shot prefill takes none inside its tokens, a pass no negative one and
 * none beyond the model's context; each refusal leaves the session usable. */
static void test_prompt_end_refused(void **state) {
    (void)state;
    ctx x;
    open_ctx(&x, "tiny", tiny_model(), 12, 1);
    di_error err = {0};
    di_prefill_out out;
    memset(&out, 0, sizeof out);
    di_fwd_opts o = {.prompt_end = 5};
    assert_int_equal(di_prefill(x.m, x.be, x.ids, 12, &o, &out, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "prompt end 5"));
    o.prompt_end = 12; /* the whole prompt: the same as none */
    assert_int_equal(di_prefill(x.m, x.be, x.ids, 12, &o, &out, &err), DI_OK);
    assert_memory_equal(out.logits, x.ref, sizeof(float) * (size_t)(12 * x.V));
    di_prefill_out_free(&out);
    di_session *s = session(&x);
    const int64_t bad[] = {-1, x.m->cfg.max_position_embeddings + 1};
    for (int i = 0; i < 2; i++) {
        o.prompt_end = bad[i];
        memset(&err, 0, sizeof err);
        assert_int_equal(di_session_forward(s, x.ids, 12, true, NULL, &o, &err), DI_ERR_INVALID);
        assert_non_null(strstr(err.msg, "prompt end"));
    }
    float *l = malloc(sizeof(float) * (size_t)(12 * x.V));
    assert_non_null(l);
    fwd(&x, s, 0, 12, true, l, 12);
    assert_memory_equal(l, x.ref, sizeof(float) * (size_t)(12 * x.V));
    tu_report("prompt_end refusals: inside a one-shot prefill, negative, beyond the context; session intact after them");
    free(l);
    di_session_destroy(s);
    close_ctx(&x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verify_blocks),
        cmocka_unit_test(test_recompute),
        cmocka_unit_test(test_crossing_pass),
        cmocka_unit_test(test_recompute_runner),
        cmocka_unit_test(test_recompute_pieces),
        cmocka_unit_test(test_prefix_restore_own),
        cmocka_unit_test(test_prompt_end_refused),
        cmocka_unit_test(test_dspark_split),
    };
    return cmocka_run_group_tests(tests, NULL, cleanup);
}
