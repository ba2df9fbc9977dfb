/* The batched index selection (backend.h indexer_scores_rows, candidate_mask_rows, topk_rows,
 * gather_topk_seqs) on the CPU, and the graph's use of it:
 *  - the rows slots against the per-sequence ops as the graph called them before (each sequence's rows
 *    scored in one call; rows narrower than their sequence selected alone over their own width, the
 *    others together), at the real index shape (64 heads × 128) with many exactly tied scores, rows
 *    past the prompt, candidate masks and −1 padding: every score, mask column and list entry equal;
 *    control: a narrow row selected over its sequence's width instead picks another set;
 *  - gather_topk_seqs against gather_topk sequence by sequence (contiguous and paged tables);
 *  - rows the per-sequence ops would refuse are refused;
 *  - the forward with the slots against the same backend without them (the per-sequence / per-row
 *    calls) on the golden tiny model: a batch of prefill chunks, batched decode steps and a verify block
 *    past the prompt, every logits row bit-identical, and one call per index layer and pass.
 * di-test: asan */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_attn.h"
#include "backend/cpu/cpu_fused.h"
#include "backend/cpu/cpu_ops.h"
#include "io/formats.h"
#include "model/session.h"
#include "model/weights.h"
#include "testutil.h"

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}
static int rnd_int(int n) { return (int)(rnd() % (uint64_t)n); }

enum { NH = 64, HD = 128, TOPK = 16, BLK = 4, TOP_BLOCKS = 6 };

/* One sequence of a selection case: T rows over nk keys, its rows' widths non-decreasing to nk. */
typedef struct sel_seq {
    int T, nk, k;    /* rows, keys (= the last row's width), the sequence's k = min(TOPK, nk) */
    int w[8], vis[8]; /* per row */
    bool cand;       /* scored under a candidate mask */
    bool flat;       /* zero queries: every visible score is 0, one big tie */
} sel_seq;

/* A case's inputs: queries, weights and keys from a few values, so that exact-zero scores and equal
 * scores at different positions (repeated key rows) are common — the ties whose order depends on the
 * selection's width. */
typedef struct sel_case {
    int n_seq, T;
    sel_seq s[4];
    uint16_t *q, *w;   /* bf16 [T, NH, HD], bf16 [T, NH] */
    uint16_t *keys[4]; /* bf16 [nk, HD] per sequence */
    uint8_t *cand[4];  /* uint8 [T_i, nk] or NULL */
    int64_t s0[4], o0[4], n_sc, n_top;
} sel_case;

static uint16_t few_values(void) {
    static const float v[] = {0.0f, 0.0f, 0.5f, -0.5f, 1.0f, -1.0f, 0.25f};
    return di_f32_to_bf16(v[rnd_int(7)]);
}

static void case_init(sel_case *c, int n_seq, const sel_seq *s) {
    memset(c, 0, sizeof *c);
    c->n_seq = n_seq;
    for (int i = 0; i < n_seq; i++) {
        c->s[i] = s[i];
        c->s[i].k = s[i].nk < TOPK ? s[i].nk : TOPK;
        c->s0[i] = c->n_sc, c->o0[i] = c->n_top;
        c->n_sc += (int64_t)s[i].T * s[i].nk;
        c->n_top += (int64_t)s[i].T * c->s[i].k;
        c->T += s[i].T;
    }
    c->q = malloc(sizeof(uint16_t) * (size_t)c->T * NH * HD);
    c->w = malloc(sizeof(uint16_t) * (size_t)c->T * NH);
    for (int64_t j = 0; j < (int64_t)c->T * NH * HD; j++) c->q[j] = few_values();
    for (int64_t j = 0; j < (int64_t)c->T * NH; j++) c->w[j] = di_f32_to_bf16(0.25f * (float)(1 + rnd_int(4)));
    for (int i = 0, r0 = 0; i < n_seq; r0 += s[i].T, i++)
        if (s[i].flat) memset(c->q + (int64_t)r0 * NH * HD, 0, sizeof(uint16_t) * (size_t)s[i].T * NH * HD);
    for (int i = 0; i < n_seq; i++) {
        int nk = s[i].nk;
        c->keys[i] = malloc(sizeof(uint16_t) * (size_t)nk * HD);
        for (int e = 0; e < nk; e++) {
            if (e >= 4 && rnd_int(3) == 0) { /* a repeat of an earlier key: an exactly tied score */
                memcpy(c->keys[i] + e * HD, c->keys[i] + rnd_int(e) * HD, sizeof(uint16_t) * HD);
                continue;
            }
            for (int j = 0; j < HD; j++) c->keys[i][e * HD + j] = few_values();
        }
        if (s[i].cand) {
            c->cand[i] = malloc((size_t)s[i].T * nk);
            for (int64_t j = 0; j < (int64_t)s[i].T * nk; j++) c->cand[i][j] = rnd_int(4) != 0;
        }
    }
}

static void case_free(sel_case *c) {
    free(c->q), free(c->w);
    for (int i = 0; i < c->n_seq; i++) free(c->keys[i]), free(c->cand[i]);
}

/* The rows of the case as the graph lists them (forward_block.c select_rows). */
static di_index_row *case_rows(const sel_case *c, int64_t *w_max) {
    di_index_row *rows = calloc((size_t)c->T, sizeof *rows);
    int r = 0;
    *w_max = 0;
    for (int i = 0; i < c->n_seq; i++) {
        const sel_seq *s = &c->s[i];
        for (int t = 0; t < s->T; t++, r++) {
            rows[r] = (di_index_row){.keys = c->keys[i], .cand = c->cand[i] ? c->cand[i] + t * s->nk : NULL,
                                     .s0 = c->s0[i] + (int64_t)t * s->nk, .o0 = c->o0[i] + (int64_t)t * s->k,
                                     .nk = s->nk, .w = s->w[t], .vis = s->vis[t],
                                     .k = s->w[t] < TOPK ? s->w[t] : TOPK, .kp = s->k};
            *w_max = s->w[t] > *w_max ? s->w[t] : *w_max;
        }
    }
    return rows;
}

/* The per-sequence calls the graph made (forward_block.c select_seq): scores of a sequence's rows in
 * one call, its narrow rows [0, t_full) selected alone, the rest together. */
static void case_loop(const di_backend *be, const sel_case *c, float *scores, uint8_t *mask, int32_t *top) {
    di_error err = {0};
    int r0 = 0;
    float ws[1024]; /* f32 [ceil(nk / BLK)] */
    for (int i = 0; i < c->n_seq; r0 += c->s[i].T, i++) {
        const sel_seq *s = &c->s[i];
        float *sc = scores + c->s0[i];
        uint8_t *mk = mask + c->s0[i];
        int32_t *tp = top + c->o0[i];
        assert_int_equal(be->indexer_scores(be, c->q + (int64_t)r0 * NH * HD, c->w + r0 * NH, 0.0125f, c->keys[i], s->T,
                                            NH, HD, s->nk, s->vis, c->cand[i], sc, &err),
                         DI_OK);
        int t_full = 0;
        while (t_full < s->T && s->w[t_full] < s->nk) t_full++;
        for (int t = 0; t < t_full; t++) {
            int kt = s->w[t] < TOPK ? s->w[t] : TOPK;
            if (s->w[t] > 0)
                assert_int_equal(be->candidate_mask(be, sc + t * s->nk, 1, s->w[t], &s->vis[t], BLK, TOP_BLOCKS,
                                                    mk + t * s->nk, ws, &err),
                                 DI_OK);
            if (kt > 0)
                assert_int_equal(be->topk(be, sc + t * s->nk, 1, s->w[t], &s->vis[t], kt, 0, tp + t * s->k, &err), DI_OK);
            for (int j = kt; j < s->k; j++) tp[t * s->k + j] = -1;
        }
        if (t_full < s->T) {
            assert_int_equal(be->candidate_mask(be, sc + t_full * s->nk, s->T - t_full, s->nk, &s->vis[t_full], BLK,
                                                TOP_BLOCKS, mk + t_full * s->nk, ws, &err),
                             DI_OK);
            assert_int_equal(be->topk(be, sc + t_full * s->nk, s->T - t_full, s->nk, &s->vis[t_full], s->k, 0,
                                      tp + t_full * s->k, &err),
                             DI_OK);
        }
    }
}

static void test_rows_match_loop(void **state) {
    (void)state;
    di_backend *be;
    di_error err = {0};
    assert_int_equal(di_backend_cpu_create(1, &be, &err), DI_OK);
    /* a decode row, a verify block past the prompt (widths growing by group), a prompt chunk (every row
     * as wide as the prompt, visibility growing), one under a candidate mask; and a row whose width
     * switches torch's selection from its heap path (k·64 ≤ n) to introselect */
    const sel_seq seqs[4] = {
        {.T = 1, .nk = 37, .w = {37}, .vis = {37}},
        {.T = 5, .nk = 90, .w = {84, 86, 86, 88, 90}, .vis = {84, 86, 86, 88, 90}},
        {.T = 4, .nk = 70, .w = {70, 70, 70, 70}, .vis = {7, 8, 8, 9}, .cand = true},
        {.T = 2, .nk = 1100, .w = {1000, 1100}, .vis = {1000, 1100}, .flat = true},
    };
    sel_case c;
    case_init(&c, 4, seqs);
    int64_t w_max;
    di_index_row *rows = case_rows(&c, &w_max);
    float *s_loop = malloc(sizeof(float) * (size_t)c.n_sc), *s_rows = malloc(sizeof(float) * (size_t)c.n_sc);
    uint8_t *m_loop = calloc((size_t)c.n_sc, 1), *m_rows = calloc((size_t)c.n_sc, 1);
    int32_t *t_loop = malloc(sizeof(int32_t) * (size_t)c.n_top), *t_rows = malloc(sizeof(int32_t) * (size_t)c.n_top);
    case_loop(be, &c, s_loop, m_loop, t_loop);
    assert_int_equal(be->indexer_scores_rows(be, c.q, c.w, 0.0125f, c.T, NH, HD, rows, 1100, s_rows, &err), DI_OK);
    assert_int_equal(be->candidate_mask_rows(be, s_rows, c.T, rows, w_max, BLK, TOP_BLOCKS, m_rows, &err), DI_OK);
    assert_int_equal(be->topk_rows(be, s_rows, c.T, rows, w_max, t_rows, &err), DI_OK);
    assert_memory_equal(s_rows, s_loop, sizeof(float) * (size_t)c.n_sc);
    assert_memory_equal(m_rows, m_loop, (size_t)c.n_sc); /* a narrow row's columns past its width: both 0 */
    assert_memory_equal(t_rows, t_loop, sizeof(int32_t) * (size_t)c.n_top);
    int64_t zeros = 0, pads = 0;
    for (int64_t j = 0; j < c.n_sc; j++) zeros += s_rows[j] == 0.0f;
    for (int64_t j = 0; j < c.n_top; j++) pads += t_rows[j] < 0;
    assert_true(zeros > 100 && pads > 0);

    /* control: the first row of the last sequence over its sequence's width picks another set */
    int32_t wide[TOPK];
    const di_index_row *r = &rows[c.T - 2];
    int32_t vis_r = r->vis;
    assert_int_equal(be->topk(be, s_rows + r->s0, 1, r->nk, &vis_r, r->k, 0, wide, &err), DI_OK);
    assert_memory_not_equal(wide, t_rows + r->o0, sizeof wide);
    tu_report("rows slots vs per-sequence calls: %d rows of 4 sequences (widths 37..1100), %lld exact-zero scores, "
              "%lld padded ids: scores, masks and lists identical; a narrow row over its sequence's width differs",
              c.T, (long long)zeros, (long long)pads);
    free(rows), free(s_loop), free(s_rows), free(m_loop), free(m_rows), free(t_loop), free(t_rows);
    case_free(&c);
    di_backend_destroy(be);
}

static void test_rows_refused(void **state) {
    (void)state;
    di_backend *be;
    di_error err = {0};
    assert_int_equal(di_backend_cpu_create(1, &be, &err), DI_OK);
    float scores[16] = {0};
    int32_t out[8];
    uint8_t mask[16];
    const di_index_row ok = {.nk = 16, .w = 12, .vis = 10, .k = 4, .kp = 8};
    di_index_row bad[5] = {ok, ok, ok, ok, ok};
    bad[0].w = 17;             /* wider than its keys */
    bad[1].vis = 13;           /* sees past its width */
    bad[2].k = 13;             /* k > width */
    bad[3].kp = 3;             /* list shorter than k */
    bad[4].s0 = -1;            /* before the buffer */
    for (int i = 0; i < 5; i++) {
        assert_int_equal(be->topk_rows(be, scores, 1, &bad[i], 16, out, &err), DI_ERR_INVALID);
        assert_int_equal(be->candidate_mask_rows(be, scores, 1, &bad[i], 16, BLK, TOP_BLOCKS, mask, &err), DI_ERR_INVALID);
    }
    assert_int_equal(be->topk_rows(be, scores, 1, &ok, 11, out, &err), DI_ERR_INVALID); /* call max below a width */
    assert_non_null(strstr(err.msg, "row 0"));
    assert_int_equal(be->topk_rows(be, scores, 1, &ok, 16, out, &err), DI_OK);
    for (int j = 4; j < 8; j++) assert_int_equal(out[j], -1);
    tu_report("rows refusals: %s", err.msg);
    di_backend_destroy(be);
}

/* Rows reading their keys where the cache keeps them (di_index_row kbase): the keys of a case encoded
 * with the index-key codec, sequence 0 contiguous, the others through block tables of shuffled pages
 * of 8 entries (10 rows per page, entries from row 1, every other row garbage) — one with fewer entries
 * written than its width (kn) — against the same rows with the decoded keys: every score equal. A row
 * that names no keys, and a cached row without entries, are refused. */
static void test_cached_keys(void **state) {
    (void)state;
    enum { PE = 8, PROWS = 10 };
    const int64_t rb = di_row_codec_bytes(DI_CODEC_FP4_E8M0, HD);
    di_backend *be;
    di_error err = {0};
    assert_int_equal(di_backend_cpu_create(1, &be, &err), DI_OK);
    const sel_seq seqs[3] = {
        {.T = 1, .nk = 37, .w = {37}, .vis = {37}},
        {.T = 5, .nk = 90, .w = {84, 86, 86, 88, 90}, .vis = {84, 86, 86, 88, 90}},
        {.T = 4, .nk = 70, .w = {70, 70, 70, 70}, .vis = {7, 8, 8, 9}, .cand = true},
    };
    const int32_t kn[3] = {37, 90, 9}; /* the prompt chunk's sequence: 9 entries written of its 70 */
    sel_case c;
    case_init(&c, 3, seqs);
    int64_t w_max;
    di_index_row *rows = case_rows(&c, &w_max), *cached = case_rows(&c, &w_max);
    int32_t pages[2][16];
    uint8_t *area = malloc((size_t)(2 * 16 * PROWS * rb)); /* the pages of sequences 1 and 2 */
    for (int64_t j = 0; j < 2 * 16 * PROWS * rb; j++) area[j] = (uint8_t)rnd();
    uint8_t *flat = malloc((size_t)(37 * rb));
    for (int i = 0; i < 3; i++) {
        for (int j = 0; i > 0 && j < 16; j++) pages[i - 1][j] = (int32_t)((i - 1) * 16 + (j * 5 + i) % 16);
        for (int64_t e = 0; e < kn[i]; e++) {
            uint8_t *row = i == 0 ? flat + e * rb : area + (pages[i - 1][e / PE] * PROWS + 1 + e % PE) * rb;
            di_cpu_row_encode(DI_CODEC_FP4_E8M0, c.keys[i] + e * HD, HD, row);
            di_cpu_row_decode(DI_CODEC_FP4_E8M0, row, HD, c.keys[i] + e * HD); /* the value the cache holds */
        }
        for (int64_t e = kn[i]; e < seqs[i].nk; e++) /* the graph's decoded copy repeats the newest key */
            memcpy(c.keys[i] + e * HD, c.keys[i] + (kn[i] - 1) * HD, sizeof(uint16_t) * HD);
    }
    for (int r = 0, i = 0; i < 3; i++)
        for (int t = 0; t < seqs[i].T; t++, r++) {
            cached[r].keys = NULL, cached[r].kn = kn[i];
            if (i == 0) {
                cached[r].kbase = flat;
            } else {
                cached[r].kbase = area, cached[r].kpages = pages[i - 1], cached[r].kpage_entries = PE;
                cached[r].kpage_rows = PROWS, cached[r].krow0 = 1;
            }
        }
    float *sa = malloc(sizeof(float) * (size_t)c.n_sc), *sb = malloc(sizeof(float) * (size_t)c.n_sc);
    assert_int_equal(be->indexer_scores_rows(be, c.q, c.w, 0.0125f, c.T, NH, HD, rows, 90, sa, &err), DI_OK);
    assert_int_equal(be->indexer_scores_rows(be, c.q, c.w, 0.0125f, c.T, NH, HD, cached, 90, sb, &err), DI_OK);
    assert_memory_equal(sa, sb, sizeof(float) * (size_t)c.n_sc);
    int64_t finite = 0;
    for (int64_t j = 0; j < c.n_sc; j++) finite += sb[j] > -INFINITY && sb[j] != 0.0f;
    assert_true(finite > 100);
    /* control: the pages in another order give other scores */
    int32_t swapped = pages[0][0];
    pages[0][0] = pages[0][1], pages[0][1] = swapped;
    assert_int_equal(be->indexer_scores_rows(be, c.q, c.w, 0.0125f, c.T, NH, HD, cached, 90, sb, &err), DI_OK);
    assert_memory_not_equal(sa, sb, sizeof(float) * (size_t)c.n_sc);
    di_index_row none = rows[0];
    none.keys = NULL;
    assert_int_equal(be->indexer_scores_rows(be, c.q, c.w, 0.0125f, 1, NH, HD, &none, 90, sb, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "names none"));
    none = cached[0], none.kn = 0;
    assert_int_equal(be->indexer_scores_rows(be, c.q, c.w, 0.0125f, 1, NH, HD, &none, 90, sb, &err), DI_ERR_INVALID);
    tu_report("cached keys: %d rows of 3 sequences (one contiguous, two paged, one with 9 of 70 entries written), "
              "%lld nonzero finite scores identical to the decoded keys'; pages swapped: different", c.T,
              (long long)finite);
    free(rows), free(cached), free(area), free(flat), free(sa), free(sb);
    case_free(&c);
    di_backend_destroy(be);
}

static void test_gather_seqs(void **state) {
    (void)state;
    enum { D = 512, N_ENT = 24, PE = 8, PROWS = 10 };
    const di_row_codec codec = DI_CODEC_FP4_E4M3;
    const int64_t rb = di_row_codec_bytes(codec, D);
    di_backend *be;
    di_error err = {0};
    assert_int_equal(di_backend_cpu_create(1, &be, &err), DI_OK);
    assert_null(be->gather_topk_seqs); /* installed with gather_topk */
    di_cpu_fused_install(be);
    assert_non_null(be->gather_topk_seqs);
    uint8_t *base = calloc(3 * PROWS, (size_t)rb); /* uint8 [3·PROWS, rb] */
    uint16_t x[D];
    for (int64_t r = 0; r < 3 * PROWS; r++) {
        for (int i = 0; i < D; i++) x[i] = di_f32_to_bf16((float)(rnd_int(200) - 100) / 16.0f);
        di_cpu_row_encode(codec, x, D, base + r * rb);
    }
    const int32_t pages[3] = {2, 0, 1};
    int32_t top[3][2 * 5];
    for (int s = 0; s < 3; s++)
        for (int j = 0; j < 10; j++) top[s][j] = rnd_int(5) == 0 ? -1 : rnd_int(N_ENT + 2); /* some out of range */
    const int m[3] = {1, 2, 2}, k[3] = {5, 4, 5};
    uint16_t *rows_a = calloc(3 * 10, sizeof(uint16_t) * D), *rows_b = calloc(3 * 10, sizeof(uint16_t) * D);
    int32_t idx_a[3 * 2 * 9], idx_b[3 * 2 * 9];
    for (int i = 0; i < 3 * 2 * 9; i++) idx_a[i] = idx_b[i] = 555;
    di_gather_seq g[3];
    for (int s = 0; s < 3; s++) {
        g[s] = (di_gather_seq){.base = base, .pages = s == 1 ? pages : NULL, .top = top[s], .rows = rows_b + s * 10 * D,
                               .idx = idx_b + s * 18 + 2, .n_entries = N_ENT, .page_entries = PE, .page_rows = PROWS,
                               .row_off = 1, .m = m[s], .ldi = 9, .k = k[s], .row0 = 7 + s};
        assert_int_equal(be->gather_topk(be, codec, base, N_ENT, g[s].pages, PE, PROWS, 1, top[s], m[s], k[s], D, 7 + s,
                                         rows_a + s * 10 * D, idx_a + s * 18 + 2, 9, &err),
                         DI_OK);
    }
    assert_int_equal(be->gather_topk_seqs(be, codec, D, g, 3, 10, &err), DI_OK);
    assert_memory_equal(rows_a, rows_b, sizeof(uint16_t) * 3 * 10 * D);
    assert_memory_equal(idx_a, idx_b, sizeof idx_a);
    assert_int_equal(be->gather_topk_seqs(be, codec, D, g, 3, 9, &err), DI_ERR_INVALID); /* mk_max below 2·5 */
    tu_report("gather_topk_seqs: 3 sequences (one paged), rows and idx identical to gather_topk per sequence");
    free(base), free(rows_a), free(rows_b);
    di_backend_destroy(be);
}

/* ---------------- the graph ---------------- */

enum { C_ROWS_SCORE, C_ROWS_CAND, C_ROWS_TOPK, C_SCORE, C_TOPK, C_N };
static long g_count[C_N];
static di_backend g_in; /* the CPU table the counters forward to */

static int k_rows_score(const di_backend *be, const uint16_t *q, const uint16_t *w, float ws, int64_t m, int nh, int hd,
                        const di_index_row *rows, int64_t nk_max, float *s, di_error *e) {
    g_count[C_ROWS_SCORE]++;
    return g_in.indexer_scores_rows(be, q, w, ws, m, nh, hd, rows, nk_max, s, e);
}
static int k_rows_cand(const di_backend *be, const float *s, int64_t m, const di_index_row *rows, int64_t w_max, int blk,
                       int tb, uint8_t *mask, di_error *e) {
    g_count[C_ROWS_CAND]++;
    return g_in.candidate_mask_rows(be, s, m, rows, w_max, blk, tb, mask, e);
}
static int k_rows_topk(const di_backend *be, const float *s, int64_t m, const di_index_row *rows, int64_t w_max,
                       int32_t *out, di_error *e) {
    g_count[C_ROWS_TOPK]++;
    return g_in.topk_rows(be, s, m, rows, w_max, out, e);
}
static int k_score(const di_backend *be, const uint16_t *q, const uint16_t *w, float ws, const uint16_t *k, int64_t m,
                   int nh, int hd, int64_t nk, const int32_t *vis, const uint8_t *cand, float *s, di_error *e) {
    g_count[C_SCORE]++;
    return g_in.indexer_scores(be, q, w, ws, k, m, nh, hd, nk, vis, cand, s, e);
}
static int k_topk(const di_backend *be, const float *s, int64_t m, int64_t nk, const int32_t *vis, int k, int32_t off,
                  int32_t *out, di_error *e) {
    g_count[C_TOPK]++;
    return g_in.topk(be, s, m, nk, vis, k, off, out, e);
}

enum { B = 4, STEPS = 4, VERIFY = 9 };

/* B sessions: prefill chunks of 20 + 3i tokens in one pass, STEPS batched decode steps, then a verify
 * block of VERIFY tokens in session 0 (rows past its prompt: narrower than the last). Logits of every
 * pass into `lg` (f32 [passes][B or VERIFY, V]); the counts of each pass into `cnt`. */
static void run_passes(const char *model_dir, di_backend *tbl, float *lg, long cnt[][C_N], int64_t V) {
    di_error err = {0};
    di_model *m;
    assert_int_equal(di_model_open(model_dir, &m, &err), DI_OK);
    assert_int_equal(di_model_to_backend(m, tbl, &err), DI_OK);
    di_session *s[B];
    int32_t ids[256];
    for (int i = 0; i < 256; i++) ids[i] = (int32_t)((i * 37 + 11) % m->cfg.vocab_size);
    for (int i = 0; i < B; i++) {
        di_session_opts o = {.max_tokens = 128, .spec_margin = -1};
        assert_int_equal(di_session_create(m, tbl, &o, &s[i], &err), DI_OK);
    }
    int64_t pos[B];
    for (int p = 0; p <= STEPS; p++) {
        di_session_chunk ch[B];
        for (int i = 0; i < B; i++) {
            int64_t n = p ? 1 : 20 + 3 * i;
            ch[i] = (di_session_chunk){.s = s[i], .ids = ids + (p ? pos[i] : 0), .n = n, .logits = lg + (p * B + i) * V,
                                       .prompt_end = 20 + 3 * i};
            pos[i] = p ? pos[i] + 1 : n;
        }
        memset(g_count, 0, sizeof g_count);
        if (di_session_forward_batch(ch, B, NULL, &err)) fail_msg("%s", err.msg);
        memcpy(cnt[p], g_count, sizeof g_count);
    }
    di_session_chunk v = {.s = s[0], .ids = ids + pos[0], .n = VERIFY, .all_logits = true,
                          .logits = lg + (STEPS + 1) * B * V, .prompt_end = 20};
    memset(g_count, 0, sizeof g_count);
    if (di_session_forward_batch(&v, 1, NULL, &err)) fail_msg("%s", err.msg);
    memcpy(cnt[STEPS + 1], g_count, sizeof g_count);
    for (int i = 0; i < B; i++) di_session_destroy(s[i]);
    di_model_close(m);
}

static void test_forward_rows(void **state) {
    (void)state;
    di_error err = {0};
    di_backend *cpu;
    di_model *m;
    const char *dir = tu_data("v41-tiny-sel");
    assert_int_equal(di_model_open(dir, &m, &err), DI_OK);
    const int64_t V = m->cfg.vocab_size;
    int indexers = 0;
    for (int l = 0; l < m->cfg.n_stages; l++) indexers += m->cfg.layer[l].is_index_source;
    di_model_close(m);
    assert_true(indexers > 0);
    assert_int_equal(di_backend_cpu_create(1, &cpu, &err), DI_OK);
    g_in = *cpu;
    di_backend with = *cpu, without = *cpu;
    with.indexer_scores_rows = k_rows_score, with.candidate_mask_rows = k_rows_cand, with.topk_rows = k_rows_topk;
    with.indexer_scores = without.indexer_scores = k_score;
    with.topk = without.topk = k_topk;
    without.indexer_scores_rows = NULL, without.candidate_mask_rows = NULL, without.topk_rows = NULL;
    const size_t n_lg = (size_t)((STEPS + 1) * B + VERIFY) * (size_t)V;
    float *a = calloc(n_lg, sizeof(float)), *b = calloc(n_lg, sizeof(float));
    long ca[STEPS + 2][C_N], cb[STEPS + 2][C_N];
    run_passes(dir, &with, a, ca, V);
    run_passes(dir, &without, b, cb, V);
    assert_memory_equal(a, b, n_lg * sizeof(float));
    for (int p = 0; p <= STEPS + 1; p++) { /* the slots: one call per index layer, every pass here */
        assert_int_equal(ca[p][C_ROWS_SCORE], indexers);
        assert_int_equal(ca[p][C_ROWS_TOPK], indexers);
        assert_int_equal(ca[p][C_ROWS_CAND], 1); /* one candidate source */
        assert_int_equal(cb[p][C_ROWS_SCORE] + cb[p][C_ROWS_TOPK], 0);
    }
    /* without them: a scorer call per sequence, and the verify block's narrow rows one by one */
    assert_int_equal(cb[1][C_SCORE], (long)B * indexers);
    assert_true(cb[STEPS + 1][C_TOPK] > indexers);
    tu_report("forward with the rows slots vs without: %d passes (prefill of %d sequences, %d decode steps, a verify "
              "block of %d past the prompt), logits bit-identical; per pass %d scorer calls with the slots, %ld per "
              "decode step without; verify block: %ld top-k calls without",
              STEPS + 2, B, STEPS, VERIFY, indexers, cb[1][C_SCORE], cb[STEPS + 1][C_TOPK]);
    free(a), free(b);
    di_backend_destroy(cpu);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_match_loop),
        cmocka_unit_test(test_rows_refused),
        cmocka_unit_test(test_cached_keys),
        cmocka_unit_test(test_gather_seqs),
        cmocka_unit_test(test_forward_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
