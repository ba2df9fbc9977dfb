/* The batched multi-sequence forward (model/session.h di_session_forward_batch) against the same
 * chunks run one sequence at a time, on the golden tiny models (tests/data/v41-tiny-sel, -nosel:
 * window 16, ratio-2 and ratio-1 kv sources, index top-k 8 / 128, candidate blocks, Engram, DSpark):
 *  - random batches of 1–16 sequences (on a 3-thread backend; the sequences alone on 1 thread) mixing decode steps, prefill chunks of 2–24 tokens and DSpark
 *    verify blocks (block + 1 tokens, then a rollback of the rejected ones), head rows on the last or
 *    every position or none: every logits row BIT-IDENTICAL (memcmp) to the sequence's own pass, the
 *    DSpark drafts after a verify block too, and every cache's canonical image byte-identical at the
 *    end; the lanes run past the window and past the top-k width, so window reads, compressed
 *    entries, candidate masks and top-k selection all vary between the sequences of one batch;
 *  - the cached engine runner (engine/api_runner.h) executes each scheduler step as ONE forward and
 *    its logits rows equal the pieces run alone;
 *  - bad batches (a session twice, a bad token in a later chunk, a chunk past a cache's capacity,
 *    a batch-wide window floor) fail cleanly and leave every sequence as it was.
 * ~10 s CPU here (shorter lanes under ASan).  di-test: asan */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/api_runner.h"
#include "model/session.h"
#include "testutil.h"

/* Positions per lane: past the window (16) and the top-k width (8 entries of ratio 2). Under a
 * sanitizer (~5x slower) the lanes are shorter; every kind of chunk and batch still occurs. */
#if defined(__SANITIZE_ADDRESS__)
#define MAX_LEN 32
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MAX_LEN 32
#endif
#endif
#ifndef MAX_LEN
#define MAX_LEN 96
#endif

enum { N_LANES = 16, MAX_CHUNK = 24, N_ROUNDS = 60 };

static uint64_t g_rng = 0x243F6A8885A308D3ull;

static uint64_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}

static int64_t rnd_in(int64_t lo, int64_t hi) { return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1)); }

/* One sequence, run twice: `alone` one pass per chunk, `batched` inside the batches. */
typedef struct lane {
    di_session *alone, *batched;
    int32_t ids[MAX_LEN];
    bool dspark;
} lane;

typedef struct model_env {
    di_model *m;
    di_backend *be;  /* 1 thread: the sequences alone */
    di_backend *be3; /* 3 threads: the batches (the kernels split work by thread count, never a row's sums) */
    int64_t V;
    int B; /* DSpark block */
} model_env;

static void env_open(model_env *e, const char *name) {
    di_error err = {0};
    if (di_model_open(tu_data(name), &e->m, &err) || di_backend_cpu_create(1, &e->be, &err) ||
        di_backend_cpu_create(3, &e->be3, &err))
        fail_msg("%s: %s", name, err.msg);
    e->V = e->m->cfg.vocab_size;
    e->B = e->m->cfg.dspark_block_size;
}

static void env_close(model_env *e) {
    di_backend_destroy(e->be);
    di_backend_destroy(e->be3);
    di_model_close(e->m);
}

static di_session *new_session(const model_env *e, const di_backend *be, bool dspark) {
    di_session_opts so = {.max_tokens = MAX_LEN, .spec_margin = -1, .dspark = dspark};
    di_session *s = NULL;
    di_error err = {0};
    if (di_session_create(e->m, be, &so, &s, &err)) fail_msg("session: %s", err.msg);
    return s;
}

static uint8_t *image_of(const di_session *s, int64_t *n) {
    di_error err = {0};
    *n = di_cache_image_bytes(s->cache);
    uint8_t *img = malloc((size_t)*n);
    assert_non_null(img);
    assert_int_equal(di_cache_image(s->cache, img, *n, NULL, &err), DI_OK);
    return img;
}

static void assert_same_image(const di_session *a, const di_session *b, const char *what) {
    int64_t na, nb;
    uint8_t *ia = image_of(a, &na), *ib = image_of(b, &nb);
    if (na != nb || memcmp(ia, ib, (size_t)na)) fail_msg("%s: cache images differ (%lld vs %lld bytes)", what, (long long)na, (long long)nb);
    free(ia), free(ib);
}

/* Random batches over N_LANES lanes (a third of them with DSpark on) until every lane is nearly full. */
static void random_batches(const char *name) {
    model_env e;
    env_open(&e, name);
    const int64_t V = e.V, B = e.B;
    lane lanes[N_LANES];
    for (int i = 0; i < N_LANES; i++) {
        lanes[i].dspark = i % 3 == 0;
        lanes[i].alone = new_session(&e, e.be, lanes[i].dspark);
        lanes[i].batched = new_session(&e, e.be3, lanes[i].dspark);
        for (int t = 0; t < MAX_LEN; t++) lanes[i].ids[t] = (int32_t)rnd_in(3, V - 1);
    }
    di_session_chunk ck[N_LANES];
    int lane_of[N_LANES];
    bool verify[N_LANES];
    float *lg_b = malloc(sizeof(float) * (size_t)(N_LANES * MAX_CHUNK * V)); /* f32 [Σ rows, V] batch logits */
    float *lg_a = malloc(sizeof(float) * (size_t)(MAX_CHUNK * V));           /* f32 [rows, V] alone */
    int32_t *d_a = malloc(sizeof(int32_t) * (size_t)(B + 1)), *d_b = malloc(sizeof(int32_t) * (size_t)(B + 1));
    float *c_a = malloc(sizeof(float) * (size_t)B), *c_b = malloc(sizeof(float) * (size_t)B);
    float *dl_a = malloc(sizeof(float) * (size_t)(B * V)), *dl_b = malloc(sizeof(float) * (size_t)(B * V));
    assert_true(lg_b && lg_a && d_a && d_b && c_a && c_b && dl_a && dl_b);
    di_error err = {0};
    int64_t n_batches = 0, n_rows = 0, n_logit_rows = 0, max_seqs = 0, n_decode = 0, n_prefill = 0, n_verify = 0,
            n_drafts = 0, max_rows = 0;
    for (int round = 0; round < N_ROUNDS; round++) {
        /* a random subset of the lanes with room left, each with its own kind of chunk */
        int want = (int)rnd_in(1, N_LANES), n = 0;
        int start = (int)rnd_in(0, N_LANES - 1);
        float *row = lg_b;
        for (int j = 0; j < N_LANES && n < want; j++) {
            int i = (start + j) % N_LANES;
            lane *l = &lanes[i];
            int64_t len = di_session_len(l->batched), room = MAX_LEN - len;
            if (room < 1) continue;
            int kind = (int)rnd_in(0, 2); /* 0 decode, 1 prefill chunk, 2 verify block (short chunk without DSpark) */
            verify[n] = kind == 2 && l->dspark && len > 0;
            int64_t T = kind == 0 ? 1 : kind == 1 ? rnd_in(2, MAX_CHUNK) : verify[n] ? B + 1 : rnd_in(2, 8);
            if (T > room) T = room, verify[n] = false;
            int mode = (int)rnd_in(0, 7); /* head rows: 0 none, 1–3 every position, else the last */
            ck[n] = (di_session_chunk){.s = l->batched, .ids = l->ids + len, .n = T, .all_logits = mode >= 1 && mode <= 3,
                                       .logits = mode ? row : NULL};
            if (mode) row += (ck[n].all_logits ? T : 1) * V;
            lane_of[n++] = i;
            n_decode += T == 1, n_verify += verify[n - 1], n_prefill += T > 1 && !verify[n - 1];
        }
        if (!n) break;
        if (di_session_forward_batch(ck, n, NULL, &err)) fail_msg("%s round %d: %s", name, round, err.msg);
        n_batches++;
        max_seqs = n > max_seqs ? n : max_seqs;
        int64_t rows = 0;
        for (int k = 0; k < n; k++) rows += ck[k].n;
        n_rows += rows;
        max_rows = rows > max_rows ? rows : max_rows;
        /* every chunk alone, in the same chunk boundaries */
        for (int k = 0; k < n; k++) {
            lane *l = &lanes[lane_of[k]];
            int64_t pos = di_session_len(l->alone), nr = ck[k].logits ? (ck[k].all_logits ? ck[k].n : 1) : 0;
            if (di_session_forward(l->alone, ck[k].ids, ck[k].n, ck[k].all_logits, nr ? lg_a : NULL, NULL, &err))
                fail_msg("%s round %d lane %d alone: %s", name, round, lane_of[k], err.msg);
            for (int64_t r = 0; r < nr; r++)
                if (memcmp(lg_a + r * V, ck[k].logits + r * V, sizeof(float) * (size_t)V))
                    fail_msg("%s round %d: lane %d (batch slot %d of %d, positions [%lld, %lld)): logits row %lld differs "
                             "from its pass alone",
                             name, round, lane_of[k], k, n, (long long)pos, (long long)(pos + ck[k].n), (long long)r);
            n_logit_rows += nr;
            if (!verify[k]) continue;
            /* a verify block: the drafter reads the stage windows the batched pass wrote; reject a few */
            int32_t tok = (int32_t)rnd_in(3, V - 1);
            assert_int_equal(di_session_draft(l->alone, tok, NULL, NULL, d_a, c_a, dl_a, NULL, &err), DI_OK);
            assert_int_equal(di_session_draft(l->batched, tok, NULL, NULL, d_b, c_b, dl_b, NULL, &err), DI_OK);
            if (memcmp(d_a, d_b, sizeof(int32_t) * (size_t)(B + 1)) || memcmp(c_a, c_b, sizeof(float) * (size_t)B) ||
                memcmp(dl_a, dl_b, sizeof(float) * (size_t)(B * V)))
                fail_msg("%s round %d lane %d: drafts after a batched verify block differ", name, round, lane_of[k]);
            n_drafts++;
            int64_t reject = rnd_in(0, B);
            assert_int_equal(di_session_rollback(l->alone, reject, &err), DI_OK);
            assert_int_equal(di_session_rollback(l->batched, reject, &err), DI_OK);
        }
    }
    int64_t total = 0;
    for (int i = 0; i < N_LANES; i++) {
        char what[64];
        snprintf(what, sizeof what, "%s lane %d", name, i);
        assert_int_equal(di_session_len(lanes[i].alone), di_session_len(lanes[i].batched));
        assert_same_image(lanes[i].alone, lanes[i].batched, what);
        total += di_session_len(lanes[i].alone);
        di_session_destroy(lanes[i].alone);
        di_session_destroy(lanes[i].batched);
    }
    /* the mix the test claims: many sequences per batch, every kind of chunk, lanes past the window
     * (16) and the top-k width */
    assert_true(max_seqs >= 8 && n_decode > 0 && n_prefill > 0 && n_verify > 0 && n_drafts > 0);
    assert_true(total > N_LANES * (MAX_LEN / 2));
    tu_report("%s: %lld batches of up to %lld sequences / %lld rows (%lld decode steps, %lld prefill chunks, %lld verify "
              "blocks), %lld logits rows and %lld draft blocks bit-identical to each sequence alone, %d cache images "
              "identical (%lld positions)",
              name, (long long)n_batches, (long long)max_seqs, (long long)max_rows, (long long)n_decode,
              (long long)n_prefill, (long long)n_verify, (long long)n_logit_rows, (long long)n_drafts, N_LANES,
              (long long)total);
    free(lg_b), free(lg_a), free(d_a), free(d_b), free(c_a), free(c_b), free(dl_a), free(dl_b);
    env_close(&e);
}

static void test_random_batches_sel(void **state) {
    (void)state;
    random_batches("v41-tiny-sel");
}

static void test_random_batches_nosel(void **state) {
    (void)state;
    random_batches("v41-tiny-nosel");
}

/* The engine's cached runner: three requests whose pieces (prefill chunks, then decode tokens, mixed
 * in one step) go through its forward hook; one batched forward per step, logits rows equal to the
 * same pieces on sessions alone — and to the serial runner (one forward per piece, the baseline of
 * `bench engine --runner serial`). */
static void test_runner_step_is_one_forward(void **state) {
    (void)state;
    model_env e;
    env_open(&e, "v41-tiny-sel");
    const int64_t V = e.V;
    di_session_runner *r, *rs;
    di_model_runner it, its;
    di_error err = {0};
    assert_int_equal(di_session_runner_new(e.m, e.be3, 128, 16, 64, &r, &it, &err), DI_OK);
    assert_int_equal(di_session_runner_new(e.m, e.be, 128, 16, 64, &rs, &its, &err), DI_OK);
    rs->serial = true;
    enum { NR = 3, LEN = 40 };
    int32_t ids[NR][LEN];
    di_session *ref[NR];
    for (int q = 0; q < NR; q++) {
        for (int t = 0; t < LEN; t++) ids[q][t] = (int32_t)rnd_in(3, V - 1);
        ref[q] = new_session(&e, e.be, false);
    }
    /* per step, each request's piece length (0 = absent): prefills of different sizes, then decode */
    static const int plan[][NR] = {{7, 0, 20}, {9, 11, 1}, {1, 13, 1}, {1, 1, 1}, {0, 1, 1}, {1, 1, 0}, {1, 1, 1}};
    const int n_steps = (int)(sizeof plan / sizeof plan[0]);
    int64_t pos[NR] = {0}, pieces = 0;
    float *lg = malloc(sizeof(float) * (size_t)(NR * V)), *ls = malloc(sizeof(float) * (size_t)(NR * V));
    float *la = malloc(sizeof(float) * (size_t)V);
    assert_true(lg && ls && la);
    for (int st = 0; st < n_steps; st++) {
        di_step_seq seqs[NR];
        int n = 0;
        for (int q = 0; q < NR; q++) {
            if (!plan[st][q]) continue;
            seqs[n] = (di_step_seq){.req_id = 100 + q, .pos0 = pos[q], .n_tokens = plan[st][q], .tokens = ids[q] + pos[q],
                                    .logits_row = n};
            n++;
        }
        di_step_batch b = {.step = (uint64_t)st, .n_seqs = n, .seqs = seqs, .n_logits_rows = n};
        int64_t before = r->n_forwards;
        assert_int_equal(it.forward(it.ctx, &b, lg, &err), DI_OK);
        assert_int_equal(r->n_forwards, before + 1);
        assert_int_equal(its.forward(its.ctx, &b, ls, &err), DI_OK);
        assert_memory_equal(lg, ls, sizeof(float) * (size_t)(n * V));
        pieces += n;
        for (int k = 0; k < n; k++) {
            int q = (int)(seqs[k].req_id - 100);
            assert_int_equal(di_session_forward(ref[q], seqs[k].tokens, seqs[k].n_tokens, false, la, NULL, &err), DI_OK);
            if (memcmp(la, lg + (size_t)k * (size_t)V, sizeof(float) * (size_t)V))
                fail_msg("runner step %d: request %d's logits differ from its pieces alone", st, q);
            pos[q] += seqs[k].n_tokens;
        }
    }
    assert_int_equal(r->n_forwards, n_steps);
    assert_int_equal(rs->n_forwards, pieces);
    assert_int_equal(r->n_positions, pos[0] + pos[1] + pos[2]);
    /* a piece that does not continue its session fails the step */
    di_step_seq bad = {.req_id = 100, .pos0 = pos[0] + 1, .n_tokens = 1, .tokens = ids[0], .logits_row = 0};
    di_step_batch bb = {.step = 99, .n_seqs = 1, .seqs = &bad, .n_logits_rows = 1};
    assert_int_equal(it.forward(it.ctx, &bb, lg, &err), DI_ERR_INTERNAL);
    /* a forward that fails (an id outside the vocabulary) fails its step's requests; a piece of theirs
     * planned for the next step before the failure was known (async) is dropped, with a zero logits
     * row, while a newcomer in that step runs as if alone */
    int32_t badtok[2] = {ids[1][0], (int32_t)V + 5};
    di_step_seq f1 = {.req_id = 200, .pos0 = 0, .n_tokens = 2, .tokens = badtok, .logits_row = 0};
    di_step_batch fb = {.step = 100, .n_seqs = 1, .seqs = &f1, .n_logits_rows = 1};
    assert_int_not_equal(it.forward(it.ctx, &fb, lg, &err), DI_OK);
    di_step_seq f2[2] = {{.req_id = 200, .pos0 = 2, .n_tokens = 1, .tokens = ids[1], .logits_row = 0},
                         {.req_id = 201, .pos0 = 0, .n_tokens = 5, .tokens = ids[2], .logits_row = 1}};
    di_step_batch fb2 = {.step = 101, .n_seqs = 2, .seqs = f2, .n_logits_rows = 2};
    for (int64_t v = 0; v < 2 * V; v++) lg[v] = 1.0f;
    assert_int_equal(it.forward(it.ctx, &fb2, lg, &err), DI_OK);
    for (int64_t v = 0; v < V; v++)
        if (lg[v] != 0.0f) fail_msg("the dropped piece's logits row is not zero at %lld", (long long)v);
    di_session *solo = new_session(&e, e.be, false);
    assert_int_equal(di_session_forward(solo, ids[2], 5, false, la, NULL, &err), DI_OK);
    assert_memory_equal(la, lg + V, sizeof(float) * (size_t)V);
    di_session_destroy(solo);
    tu_report("cached runner: %d steps of 1-3 mixed pieces, one forward each (serial: %lld), logits rows bit-identical "
              "to the pieces alone",
              n_steps, (long long)pieces);
    for (int q = 0; q < NR; q++) di_session_destroy(ref[q]);
    free(lg), free(ls), free(la);
    di_session_runner_free(r);
    di_session_runner_free(rs);
    env_close(&e);
}

/* Bad batches: refused before anything is written, or unwound; the sequences continue as if the
 * batch never ran. */
static void test_bad_batches(void **state) {
    (void)state;
    model_env e;
    env_open(&e, "v41-tiny-sel");
    const int64_t V = e.V;
    di_session *a = new_session(&e, e.be, false), *b = new_session(&e, e.be, false), *ref = new_session(&e, e.be, false);
    di_error err = {0};
    int32_t ids[MAX_LEN + 1];
    for (int t = 0; t <= MAX_LEN; t++) ids[t] = (int32_t)rnd_in(3, V - 1);
    assert_int_equal(di_session_forward(a, ids, 10, false, NULL, NULL, &err), DI_OK);
    assert_int_equal(di_session_forward(ref, ids, 10, false, NULL, NULL, &err), DI_OK);
    int32_t bad[2] = {5, (int32_t)V};
    di_session_chunk twice[2] = {{.s = a, .ids = ids + 10, .n = 1}, {.s = a, .ids = ids + 11, .n = 1}};
    assert_int_equal(di_session_forward_batch(twice, 2, NULL, &err), DI_ERR_INVALID);
    tu_report("same session twice: %s", err.msg);
    di_session_chunk badtok[2] = {{.s = a, .ids = ids + 10, .n = 1}, {.s = b, .ids = bad, .n = 2}};
    assert_int_equal(di_session_forward_batch(badtok, 2, NULL, &err), DI_ERR_INVALID);
    tu_report("bad token in the second chunk: %s", err.msg);
    /* b cannot take the chunk: a is extended first, then unwound */
    di_session_chunk full[2] = {{.s = a, .ids = ids + 10, .n = 2}, {.s = b, .ids = ids, .n = MAX_LEN + 1}};
    assert_int_equal(di_session_forward_batch(full, 2, NULL, &err), DI_ERR_LIMIT);
    tu_report("chunk past the capacity: %s", err.msg);
    di_fwd_opts fo = {.window_floor = 4};
    assert_int_equal(di_session_forward_batch(twice, 1, &fo, &err), DI_OK); /* one chunk: the floor is its own */
    assert_int_equal(di_session_rollback(a, 1, &err), DI_OK);
    di_session_chunk two[2] = {{.s = a, .ids = ids + 10, .n = 1}, {.s = b, .ids = ids, .n = 1}};
    assert_int_equal(di_session_forward_batch(two, 2, &fo, &err), DI_ERR_INVALID);
    assert_int_equal(di_session_forward_batch(two, 0, NULL, &err), DI_ERR_INVALID);
    assert_int_equal(di_session_len(a), 10);
    assert_int_equal(di_session_len(b), 0);
    assert_same_image(a, ref, "after the refused batches");
    /* and the sequence continues exactly */
    float *la = malloc(sizeof(float) * (size_t)V), *lr = malloc(sizeof(float) * (size_t)V);
    assert_true(la && lr);
    di_session_chunk ok[2] = {{.s = b, .ids = ids, .n = 3}, {.s = a, .ids = ids + 10, .n = 4, .logits = la}};
    assert_int_equal(di_session_forward_batch(ok, 2, NULL, &err), DI_OK);
    assert_int_equal(di_session_forward(ref, ids + 10, 4, false, lr, NULL, &err), DI_OK);
    assert_memory_equal(la, lr, sizeof(float) * (size_t)V);
    free(la), free(lr);
    di_session_destroy(a), di_session_destroy(b), di_session_destroy(ref);
    env_close(&e);
}


/* A pass that fails after its caches were extended (here: the per-block hook aborts at block 1) undoes
 * the extension where the margin allows; a chunk longer than the margin leaves its session broken:
 * every later forward / rollback / draft fails with a clear error until di_session_reset, after which
 * the session runs exactly like a fresh one. */
static int fail_at_block1(void *ctx, int layer, bool after, di_error *err) {
    (void)ctx, (void)after;
    return layer == 1 ? di_error_set(err, DI_ERR_INTERNAL, "injected failure at block 1") : DI_OK;
}

static void test_failed_pass_unwinds_or_breaks(void **state) {
    (void)state;
    model_env e;
    env_open(&e, "v41-tiny-sel");
    const int64_t V = e.V;
    di_session *a = new_session(&e, e.be, false), *b = new_session(&e, e.be, false), *ref = new_session(&e, e.be, false);
    di_error err = {0};
    int32_t ids[MAX_LEN];
    for (int t = 0; t < MAX_LEN; t++) ids[t] = (int32_t)rnd_in(3, V - 1);
    assert_int_equal(di_session_forward(a, ids, 10, false, NULL, NULL, &err), DI_OK);
    assert_int_equal(di_session_forward(ref, ids, 10, false, NULL, NULL, &err), DI_OK);
    int64_t margin = di_cache_rollback_limit(b->cache);
    assert_true(margin < 20);
    di_fwd_opts fo = {.block_hook = fail_at_block1};
    /* a: 2 tokens (within the margin), b: 20 tokens from an empty cache (beyond it) */
    di_session_chunk two[2] = {{.s = a, .ids = ids + 10, .n = 2}, {.s = b, .ids = ids, .n = 20}};
    assert_int_equal(di_session_forward_batch(two, 2, &fo, &err), DI_ERR_INTERNAL);
    assert_false(a->broken);
    assert_true(b->broken);
    assert_int_equal(di_session_len(a), 10);
    assert_same_image(a, ref, "a after the failed pass");
    /* b refuses everything until it is reset */
    assert_int_equal(di_session_forward(b, ids, 1, false, NULL, NULL, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "reset the session"));
    tu_report("broken session: %s", err.msg);
    assert_int_equal(di_session_rollback(b, 1, &err), DI_ERR_INVALID);
    di_session_chunk with_b[2] = {{.s = a, .ids = ids + 10, .n = 1}, {.s = b, .ids = ids, .n = 1}};
    assert_int_equal(di_session_forward_batch(with_b, 2, NULL, &err), DI_ERR_INVALID);
    assert_int_equal(di_session_len(a), 10); /* refused before any extension */
    di_session_reset(b);
    assert_false(b->broken);
    float *lb = malloc(sizeof(float) * (size_t)V), *lr = malloc(sizeof(float) * (size_t)V);
    assert_true(lb && lr);
    di_session *fresh = new_session(&e, e.be, false);
    assert_int_equal(di_session_forward(b, ids, 12, false, lb, NULL, &err), DI_OK);
    assert_int_equal(di_session_forward(fresh, ids, 12, false, lr, NULL, &err), DI_OK);
    assert_memory_equal(lb, lr, sizeof(float) * (size_t)V);
    assert_same_image(b, fresh, "b after reset");
    /* a continues exactly */
    assert_int_equal(di_session_forward(a, ids + 10, 3, false, lb, NULL, &err), DI_OK);
    assert_int_equal(di_session_forward(ref, ids + 10, 3, false, lr, NULL, &err), DI_OK);
    assert_memory_equal(lb, lr, sizeof(float) * (size_t)V);
    free(lb), free(lr);
    di_session_destroy(a), di_session_destroy(b), di_session_destroy(ref), di_session_destroy(fresh);
    env_close(&e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_batches_sel),
        cmocka_unit_test(test_random_batches_nosel),
        cmocka_unit_test(test_runner_step_is_one_forward),
        cmocka_unit_test(test_bad_batches),
        cmocka_unit_test(test_failed_pass_unwinds_or_breaks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
