/* GPU test (and, with DI_BENCH=1, benchmark) of the batched index selection (backend.h "batched index
 * selection", cuda_index_seqs.cu) at the V4.1 index shape (32 heads × 128, index_topk 512, candidate
 * blocks of 8 with 2048 kept; one case with 64 heads): the rows slots against the CUDA backend's own
 * per-sequence ops called as the graph calls them without the slots (forward_block.c select_seq: each
 * sequence's rows scored in one call, rows narrower than their sequence selected one by one with their
 * own width and k, −1 padding by mem_set, the others together) — scores, candidate masks and top-k lists
 * byte for byte, with both selection rules (DI_CUDA_TOPK=fast and the default torch replay, one backend
 * each); and gather_topk_seqs against gather_topk per sequence (contiguous and paged tables).
 * Cases: decode batches of 1, 8 and 64 at 4K context (ratio 2: 2K entries; ratio 1: 4K), 8 at 64K,
 * mixed batches with verify blocks past the prompt (every row its own width) and prompt chunks (rows
 * as wide as the prompt, visibility growing), repeated keys (equal scores at two positions) and zero
 * queries in half the sequences (every visible score 0: the replay's width-dependent choice decides the
 * whole row), with and without a candidate mask input.
 * Keys read where the cache keeps them (di_index_row kbase, contiguous and paged) are checked against
 * the decoded keys in every case (check_cached_keys).
 * DI_BENCH=1: per-layer time of the per-sequence loop and of the batched calls for a decode step of 64
 * sequences at 4K and 64K (the bench's full-layer preset shapes), and of the scorer on decoded keys
 * against the cache rows.
 * DI_QUICK=1: the 4K cases of batch ≤ 8 only (for compute-sanitizer).
 * DI_TEST_ON_CPU=1 (no GPU needed): the same harness on the CPU backend's slots for the 4K cases — a
 * check of the test itself (descriptors, offsets, the loop), not of the kernels.
 * One table row per case; last line "N passed, N failed"; exit status 1 if any case fails. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_fused.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_ops.h"
#include "io/formats.h"
#include "cuda_testutil.h"

enum { HD = 128, TOPK = 512, CBLK = 8, CKEEP = 2048, MAXS = 64, D_KV = 512, WIN = 128 };

static di_backend *g_fast, *g_torch; /* DI_CUDA_TOPK=fast; the default replay */
static int n_pass, n_fail;
static di_error g_err;
#define E (&g_err)
static cudaEvent_t ev0, ev1;
static cudaStream_t st;

static uint64_t rng = 0x6A09E667F3BCC909ull;
static uint64_t rnd(void) { return ct_xorshift(&rng); }

static void *dev(const di_backend *be, size_t n) {
    void *d = be->mem_alloc(be, n ? n : 1, E);
    if (!d) die("mem_alloc", g_err.msg);
    return d;
}
static void *up(const di_backend *be, const void *h, size_t n) {
    void *d = dev(be, n);
    if (n) RUN(be->mem_upload(be, d, h, n, E));
    return d;
}
static void *down(const di_backend *be, const void *d, size_t n) {
    void *h = xmalloc(n);
    if (n) RUN(be->mem_download(be, h, d, n, E));
    return h;
}
/* Waits for the backend's stream (the CPU backend is synchronous). */
static void sync_be(const di_backend *be) {
    if (!strcmp(be->name, "cuda")) RUN(di_backend_cuda_sync(be, E));
}

/* n elements of esz bytes that differ in any bit (a byte count divided by esz would miss a lone byte) */
static int64_t elems_differ(const void *a, const void *b, int64_t n, size_t esz) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += memcmp((const uint8_t *)a + esz * i, (const uint8_t *)b + esz * i, esz) != 0;
    return d;
}
static void row(const char *op, const char *shape, int64_t differing, int64_t total) {
    bool ok = differing == 0;
    printf("%-30s %-52s %10lld / %-12lld %s\n", op, shape, (long long)differing, (long long)total, ok ? "PASS" : "FAIL");
    ok ? n_pass++ : n_fail++;
}

/* One sequence of a case: T rows; the score width nk (its last row's width); kind 'd' decode (one row,
 * all visible), 'v' verify block past the prompt (row t: width and visibility nk − (T−1) + t, ratio 1),
 * 'p' prompt chunk (every row as wide as the prompt, visibility nk0 + t). */
typedef struct seq_spec {
    char kind;
    int T, nk, vis0;
    bool flat; /* zero queries: every visible score 0, all tied (the replay decides every row) */
} seq_spec;

typedef struct tcase {
    char name[96];
    int nh, n_seq, T;
    bool cand_in, cand_src; /* scores under a candidate mask input; compute the candidate mask */
    seq_spec s[MAXS];
    int w[4096], vis[4096];          /* per row */
    int64_t s0[MAXS], o0[MAXS], kq[MAXS], n_sc, n_top, key_off[MAXS], w_max, nk_max;
    int r0[MAXS];
    /* host inputs */
    uint16_t *q, *wt, *keys; /* bf16 [T, nh, HD], [T, nh], key pool [n_pool, HD] */
    int64_t n_pool;
    uint8_t *cand;           /* uint8 [n_sc] (the score layout) */
} tcase;

static uint16_t few_values(void) {
    static const float v[] = {0.0f, 0.0f, 0.5f, -0.5f, 1.0f, -1.0f, 0.25f};
    return di_f32_to_bf16(v[rnd() % 7]);
}
static uint16_t gauss_bf16(void) { return di_f32_to_bf16((float)ct_gauss(&rng)); }

static void case_build(tcase *c) {
    c->T = 0, c->n_sc = 0, c->n_top = 0, c->w_max = 0, c->nk_max = 0;
    int64_t pool = 0;
    for (int i = 0; i < c->n_seq; i++) {
        seq_spec *s = &c->s[i];
        c->r0[i] = c->T, c->s0[i] = c->n_sc, c->o0[i] = c->n_top;
        c->kq[i] = s->nk < TOPK ? s->nk : TOPK;
        for (int t = 0; t < s->T; t++) {
            int w = s->kind == 'v' ? s->nk - (s->T - 1) + t : s->nk;
            int v = s->kind == 'p' ? s->vis0 + t : w;
            c->w[c->T + t] = w, c->vis[c->T + t] = v < w ? v : w;
            c->w_max = w > c->w_max ? w : c->w_max;
        }
        c->nk_max = s->nk > c->nk_max ? s->nk : c->nk_max;
        c->T += s->T;
        c->n_sc += (int64_t)s->T * s->nk;
        c->n_top += (int64_t)s->T * c->kq[i];
        pool = s->nk > pool ? s->nk : pool;
    }
    /* one key pool, each sequence at its own offset (overlapping windows of it) */
    c->n_pool = pool + 4096;
    c->keys = xmalloc(sizeof(uint16_t) * (size_t)c->n_pool * HD);
    for (int64_t e = 0; e < c->n_pool; e++) {
        if (e >= 8 && rnd() % 4 == 0) { /* a repeat: tied scores at two positions */
            memcpy(c->keys + e * HD, c->keys + (int64_t)(rnd() % (uint64_t)e) * HD, sizeof(uint16_t) * HD);
            continue;
        }
        bool few = e % 2;
        for (int j = 0; j < HD; j++) c->keys[e * HD + j] = few ? few_values() : gauss_bf16();
    }
    for (int i = 0; i < c->n_seq; i++) c->key_off[i] = (int64_t)(rnd() % (uint64_t)(c->n_pool - c->s[i].nk + 1));
    c->q = xmalloc(sizeof(uint16_t) * (size_t)c->T * c->nh * HD);
    c->wt = xmalloc(sizeof(uint16_t) * (size_t)c->T * c->nh);
    for (int i = 0; i < c->n_seq; i++)
        for (int64_t j = (int64_t)c->r0[i] * c->nh * HD; j < (int64_t)(c->r0[i] + c->s[i].T) * c->nh * HD; j++)
            c->q[j] = c->s[i].flat ? 0 : j % 3 ? gauss_bf16() : few_values();
    for (int64_t j = 0; j < (int64_t)c->T * c->nh; j++) c->wt[j] = gauss_bf16();
    c->cand = NULL;
    if (c->cand_in) {
        c->cand = xmalloc((size_t)c->n_sc);
        for (int64_t j = 0; j < c->n_sc; j++) c->cand[j] = (j / CBLK) % 5 != 0; /* whole blocks dropped */
    }
}

static void case_free(tcase *c) { free(c->q), free(c->wt), free(c->keys), free(c->cand); }

/* Device inputs and outputs of one run. */
typedef struct dev_run {
    uint16_t *q, *wt, *keys;
    uint8_t *cand;
    int32_t *vis;       /* int32 [T] */
    di_index_row *rows; /* [T] */
    float *scores;      /* f32 [n_sc] */
    uint8_t *mask;      /* uint8 [n_sc] */
    int32_t *top;       /* int32 [n_top] */
} dev_run;

static void run_alloc(const di_backend *be, const tcase *c, dev_run *d) {
    d->q = up(be, c->q, sizeof(uint16_t) * (size_t)c->T * c->nh * HD);
    d->wt = up(be, c->wt, sizeof(uint16_t) * (size_t)c->T * c->nh);
    d->keys = up(be, c->keys, sizeof(uint16_t) * (size_t)c->n_pool * HD);
    d->cand = c->cand ? up(be, c->cand, (size_t)c->n_sc) : NULL;
    int32_t *vis = xmalloc(sizeof(int32_t) * (size_t)c->T);
    di_index_row *rows = xmalloc(sizeof(di_index_row) * (size_t)c->T);
    for (int i = 0; i < c->n_seq; i++)
        for (int t = 0; t < c->s[i].T; t++) {
            int r = c->r0[i] + t, nk = c->s[i].nk;
            vis[r] = c->vis[r];
            rows[r] = (di_index_row){.keys = d->keys + c->key_off[i] * HD,
                                     .cand = d->cand ? d->cand + c->s0[i] + (int64_t)t * nk : NULL,
                                     .s0 = c->s0[i] + (int64_t)t * nk, .o0 = c->o0[i] + t * c->kq[i], .nk = nk,
                                     .w = c->w[r], .vis = c->vis[r], .k = c->w[r] < TOPK ? c->w[r] : TOPK,
                                     .kp = (int32_t)c->kq[i]};
        }
    d->vis = up(be, vis, sizeof(int32_t) * (size_t)c->T);
    d->rows = up(be, rows, sizeof(di_index_row) * (size_t)c->T);
    free(vis), free(rows);
    d->scores = dev(be, sizeof(float) * (size_t)c->n_sc);
    d->mask = dev(be, (size_t)c->n_sc);
    d->top = dev(be, sizeof(int32_t) * (size_t)c->n_top);
}

static void run_poison(const di_backend *be, const tcase *c, dev_run *d) {
    RUN(be->mem_set(be, d->scores, 0xA5, sizeof(float) * (size_t)c->n_sc, E));
    RUN(be->mem_set(be, d->mask, 0xA5, (size_t)c->n_sc, E));
    RUN(be->mem_set(be, d->top, 0xA5, sizeof(int32_t) * (size_t)c->n_top, E));
}

static void run_free(const di_backend *be, dev_run *d) {
    void *p[] = {d->q, d->wt, d->keys, d->cand, d->vis, d->rows, d->scores, d->mask, d->top};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++)
        if (p[i]) be->mem_free(be, p[i]);
}

static const float W_SCALE = 0.015625f; /* 128^-0.5 · 64^-0.5 (any value: both paths get the same) */

/* The graph's per-sequence calls (forward_block.c select_seq). */
static void run_loop(const di_backend *be, const tcase *c, const dev_run *d) {
    static float *ws;        /* f32 [ceil(nk / CBLK)]: the mask's scratch (used by the CPU backend only) */
    static int64_t ws_n;
    if (c->cand_src && ws_n < c->nk_max / CBLK + 1) {
        free(ws);
        ws_n = c->nk_max / CBLK + 1;
        ws = xmalloc(sizeof(float) * (size_t)ws_n);
    }
    for (int i = 0; i < c->n_seq; i++) {
        const seq_spec *s = &c->s[i];
        const int r0 = c->r0[i], nk = s->nk;
        const int32_t *vi = d->vis + r0;
        float *sc = d->scores + c->s0[i];
        int32_t *tp = d->top + c->o0[i];
        RUN(be->indexer_scores(be, d->q + (int64_t)r0 * c->nh * HD, d->wt + (int64_t)r0 * c->nh, W_SCALE,
                               d->keys + c->key_off[i] * HD, s->T, c->nh, HD, nk, vi,
                               d->cand ? d->cand + c->s0[i] : NULL, sc, E));
        int t_full = 0;
        while (t_full < s->T && c->w[r0 + t_full] < nk) t_full++;
        if (c->cand_src) {
            uint8_t *mk = d->mask + c->s0[i];
            for (int t = 0; t < t_full; t++)
                RUN(be->candidate_mask(be, sc + (int64_t)t * nk, 1, c->w[r0 + t], vi + t, CBLK, CKEEP,
                                       mk + (int64_t)t * nk, ws, E));
            if (t_full < s->T)
                RUN(be->candidate_mask(be, sc + (int64_t)t_full * nk, s->T - t_full, nk, vi + t_full, CBLK, CKEEP,
                                       mk + (int64_t)t_full * nk, ws, E));
        }
        for (int t = 0; t < t_full; t++) {
            int w = c->w[r0 + t], kt = w < TOPK ? w : TOPK;
            int32_t *rw = tp + t * c->kq[i];
            RUN(be->topk(be, sc + (int64_t)t * nk, 1, w, vi + t, kt, 0, rw, E));
            if (kt < c->kq[i]) RUN(be->mem_set(be, rw + kt, 0xff, sizeof(int32_t) * (size_t)(c->kq[i] - kt), E));
        }
        if (t_full < s->T)
            RUN(be->topk(be, sc + (int64_t)t_full * nk, s->T - t_full, nk, vi + t_full, (int)c->kq[i], 0,
                         tp + t_full * c->kq[i], E));
    }
}

static void run_rows(const di_backend *be, const tcase *c, const dev_run *d) {
    RUN(be->indexer_scores_rows(be, d->q, d->wt, W_SCALE, c->T, c->nh, HD, d->rows, c->nk_max, d->scores, E));
    if (c->cand_src) RUN(be->candidate_mask_rows(be, d->scores, c->T, d->rows, c->w_max, CBLK, CKEEP, d->mask, E));
    RUN(be->topk_rows(be, d->scores, c->T, d->rows, c->w_max, d->top, E));
}

/* gather_topk per sequence against gather_topk_seqs, from the case's top-k lists (entries < nk_i, the
 * FP4/E4M3 compressed-KV codec at 512 channels), contiguous for even sequences and paged for odd ones. */
static void check_gather(const di_backend *be, const tcase *c, const dev_run *d, const char *shape, bool bench) {
    const di_row_codec codec = DI_CODEC_FP4_E4M3;
    const int64_t rb = di_row_codec_bytes(codec, D_KV), pe = 64, n_ent = c->nk_max;
    const int64_t n_pages = (n_ent + pe - 1) / pe, prow = pe + 3;
    uint8_t *hb = xmalloc((size_t)(n_pages * prow * rb)); /* uint8 [n_pages·prow, rb] */
    uint16_t x[D_KV];
    for (int64_t r = 0; r < n_pages * prow; r++) {
        if (r % 64 == 0 || r < 64)
            for (int j = 0; j < D_KV; j++) x[j] = gauss_bf16();
        di_cpu_row_encode(codec, x, D_KV, hb + r * rb);
    }
    int32_t *pages = xmalloc(sizeof(int32_t) * (size_t)n_pages);
    for (int64_t p = 0; p < n_pages; p++) pages[p] = (int32_t)((p * 7 + 3) % n_pages);
    uint8_t *base = up(be, hb, (size_t)(n_pages * prow * rb));
    int32_t *dpages = up(be, pages, sizeof(int32_t) * (size_t)n_pages);
    int64_t n_rows = c->n_top, n_idx = 0;
    for (int i = 0; i < c->n_seq; i++) n_idx += (int64_t)c->s[i].T * (WIN + c->kq[i]);
    uint16_t *ra = dev(be, sizeof(uint16_t) * (size_t)(n_rows * D_KV)), *rb2 = dev(be, sizeof(uint16_t) * (size_t)(n_rows * D_KV));
    int32_t *ia = dev(be, sizeof(int32_t) * (size_t)n_idx), *ib = dev(be, sizeof(int32_t) * (size_t)n_idx);
    RUN(be->mem_set(be, ra, 0xA5, sizeof(uint16_t) * (size_t)(n_rows * D_KV), E));
    RUN(be->mem_set(be, rb2, 0xA5, sizeof(uint16_t) * (size_t)(n_rows * D_KV), E));
    RUN(be->mem_set(be, ia, 0x5A, sizeof(int32_t) * (size_t)n_idx, E));
    RUN(be->mem_set(be, ib, 0x5A, sizeof(int32_t) * (size_t)n_idx, E));
    di_gather_seq *ga = xmalloc(sizeof *ga * (size_t)c->n_seq), *gb = xmalloc(sizeof *gb * (size_t)c->n_seq);
    int64_t off = 0, mk_max = 0;
    for (int i = 0; i < c->n_seq; i++) {
        int64_t m = c->s[i].T, k = c->kq[i];
        ga[i] = (di_gather_seq){.base = base, .pages = i % 2 ? dpages : NULL, .top = d->top + c->o0[i],
                                .rows = ra + c->o0[i] * D_KV, .idx = ia + off + WIN, .n_entries = c->s[i].nk,
                                .page_entries = pe, .page_rows = prow, .row_off = 2, .m = m, .ldi = WIN + k,
                                .k = (int32_t)k, .row0 = WIN};
        gb[i] = ga[i], gb[i].rows = rb2 + c->o0[i] * D_KV, gb[i].idx = ib + off + WIN;
        off += m * (WIN + k);
        mk_max = m * k > mk_max ? m * k : mk_max;
    }
    di_gather_seq *dgb = up(be, gb, sizeof *gb * (size_t)c->n_seq);
#define GATHER_LOOP                                                                                                    \
    for (int i = 0; i < c->n_seq; i++)                                                                                 \
        RUN(be->gather_topk(be, codec, ga[i].base, ga[i].n_entries, ga[i].pages, pe, prow, 2, ga[i].top, ga[i].m,       \
                            ga[i].k, D_KV, ga[i].row0, ga[i].rows, ga[i].idx, ga[i].ldi, E))
    GATHER_LOOP;
    RUN(be->gather_topk_seqs(be, codec, D_KV, dgb, c->n_seq, mk_max, E));
    sync_be(be);
    uint16_t *ha = down(be, ra, sizeof(uint16_t) * (size_t)(n_rows * D_KV)), *hb2 = down(be, rb2, sizeof(uint16_t) * (size_t)(n_rows * D_KV));
    int32_t *hia = down(be, ia, sizeof(int32_t) * (size_t)n_idx), *hib = down(be, ib, sizeof(int32_t) * (size_t)n_idx);
    row("gather_topk_seqs rows", shape, elems_differ(ha, hb2, n_rows * D_KV, 2), n_rows * D_KV);
    row("gather_topk_seqs idx", shape, elems_differ(hia, hib, n_idx, 4), n_idx);
    if (bench) {
        double t_loop, t_seqs;
        BATCH(t_loop, 10, GATHER_LOOP);
        BATCH(t_seqs, 10, RUN(be->gather_topk_seqs(be, codec, D_KV, dgb, c->n_seq, mk_max, E)));
        printf("# bench gather_topk %s: per-sequence loop %.1f us, gather_topk_seqs %.1f us\n", shape, t_loop * 1e3,
               t_seqs * 1e3);
    }
#undef GATHER_LOOP
    be->mem_free(be, base), be->mem_free(be, dpages), be->mem_free(be, ra), be->mem_free(be, rb2);
    be->mem_free(be, ia), be->mem_free(be, ib), be->mem_free(be, dgb);
    free(hb), free(pages), free(ga), free(gb), free(ha), free(hb2), free(hia), free(hib);
}

/* One case on one backend: the loop and the rows slots from poisoned outputs, compared byte for byte. */
/* Keys read where the cache keeps them (di_index_row kbase): the case's key pool encoded with the
 * index-key codec (FP4 with E8M0 per 32, the CPU encoder), even sequences reading it contiguously and
 * odd ones through a block table of shuffled pages (PE entries per page, page_rows PE + 3, the entries
 * from row 2 of a page); a prompt chunk's sequence has only the entries its last row sees written
 * (kn), the rest of its width reads entry kn − 1. Against the per-sequence scorer on the decoded keys
 * (the graph's path without the field: row_decode, then indexer_scores): every score equal. */
enum { PE = 64 };
static void check_cached_keys(const di_backend *be, const tcase *c, const char *shape, bool bench) {
    const int64_t rb = di_row_codec_bytes(DI_CODEC_FP4_E8M0, HD);
    uint8_t *enc = xmalloc((size_t)(c->n_pool * rb));
    uint16_t *dec = xmalloc(sizeof(uint16_t) * (size_t)c->n_pool * HD);
    for (int64_t e = 0; e < c->n_pool; e++) {
        di_cpu_row_encode(DI_CODEC_FP4_E8M0, c->keys + e * HD, HD, enc + e * rb);
        di_cpu_row_decode(DI_CODEC_FP4_E8M0, enc + e * rb, HD, dec + e * HD);
    }
    /* the paged copy: each odd sequence its own pages, page ids shuffled over the whole region */
    int64_t n_pages = 0, pg0[MAXS];
    for (int i = 0; i < c->n_seq; i++) pg0[i] = n_pages, n_pages += i % 2 ? (c->s[i].nk + PE - 1) / PE : 0;
    int32_t *perm = xmalloc(sizeof(int32_t) * (size_t)(n_pages + 1));
    for (int64_t j = 0; j < n_pages; j++) perm[j] = (int32_t)j;
    for (int64_t j = n_pages - 1; j > 0; j--) {
        int64_t x = (int64_t)(rnd() % (uint64_t)(j + 1));
        int32_t t = perm[j];
        perm[j] = perm[x], perm[x] = t;
    }
    const int64_t page_rows = PE + 3, row0 = 2;
    uint8_t *paged = xmalloc((size_t)((n_pages + 1) * page_rows * rb));
    memset(paged, 0x5A, (size_t)((n_pages + 1) * page_rows * rb)); /* rows outside the entries: garbage */
    int32_t kn[MAXS];
    for (int i = 0; i < c->n_seq; i++) {
        kn[i] = c->s[i].nk;
        if (c->s[i].kind == 'p') kn[i] = c->vis[c->r0[i] + c->s[i].T - 1] > 0 ? c->vis[c->r0[i] + c->s[i].T - 1] : 1;
        if (i % 2)
            for (int64_t e = 0; e < c->s[i].nk; e++) {
                int64_t row = (int64_t)perm[pg0[i] + e / PE] * page_rows + row0 + e % PE;
                memcpy(paged + row * rb, enc + (c->key_off[i] + e) * rb, (size_t)rb);
            }
    }
    /* the decoded copy as the graph read it, per sequence (the pool's windows overlap): entries ≥ kn
     * repeat entry kn − 1 */
    int64_t dk[MAXS], n_dk = 0;
    for (int i = 0; i < c->n_seq; i++) dk[i] = n_dk, n_dk += c->s[i].nk;
    uint16_t *seqk = xmalloc(sizeof(uint16_t) * (size_t)n_dk * HD);
    for (int i = 0; i < c->n_seq; i++)
        for (int64_t e = 0; e < c->s[i].nk; e++)
            memcpy(seqk + (dk[i] + e) * HD, dec + (c->key_off[i] + (e < kn[i] ? e : kn[i] - 1)) * HD,
                   sizeof(uint16_t) * HD);
    uint8_t *enc_d = up(be, enc, (size_t)(c->n_pool * rb));
    uint8_t *paged_d = up(be, paged, (size_t)((n_pages + 1) * page_rows * rb));
    uint16_t *dec_d = up(be, seqk, sizeof(uint16_t) * (size_t)n_dk * HD);
    int32_t *perm_d = up(be, perm, sizeof(int32_t) * (size_t)(n_pages + 1));
    uint8_t *cand_d = c->cand ? up(be, c->cand, (size_t)c->n_sc) : NULL;
    uint16_t *q_d = up(be, c->q, sizeof(uint16_t) * (size_t)c->T * c->nh * HD);
    uint16_t *w_d = up(be, c->wt, sizeof(uint16_t) * (size_t)c->T * c->nh);
    int32_t *vis_d = up(be, c->vis, sizeof(int32_t) * (size_t)c->T);
    di_index_row *rows = xmalloc(sizeof(di_index_row) * (size_t)c->T);
    for (int i = 0; i < c->n_seq; i++)
        for (int t = 0; t < c->s[i].T; t++) {
            int r = c->r0[i] + t, nk = c->s[i].nk;
            rows[r] = (di_index_row){.cand = cand_d ? cand_d + c->s0[i] + (int64_t)t * nk : NULL,
                                     .s0 = c->s0[i] + (int64_t)t * nk, .o0 = c->o0[i] + t * c->kq[i], .nk = nk,
                                     .w = c->w[r], .vis = c->vis[r], .k = c->w[r] < TOPK ? c->w[r] : TOPK,
                                     .kp = (int32_t)c->kq[i], .kn = kn[i]};
            if (i % 2)
                rows[r].kbase = paged_d, rows[r].kpages = perm_d + pg0[i], rows[r].kpage_entries = PE,
                rows[r].kpage_rows = page_rows, rows[r].krow0 = row0;
            else
                rows[r].kbase = enc_d + c->key_off[i] * rb;
        }
    di_index_row *rows_d = up(be, rows, sizeof(di_index_row) * (size_t)c->T);
    float *sc_d = dev(be, sizeof(float) * (size_t)c->n_sc);
    RUN(be->mem_set(be, sc_d, 0xA5, sizeof(float) * (size_t)c->n_sc, E));
    for (int i = 0; i < c->n_seq; i++)
        RUN(be->indexer_scores(be, q_d + (int64_t)c->r0[i] * c->nh * HD, w_d + (int64_t)c->r0[i] * c->nh, W_SCALE,
                               dec_d + dk[i] * HD, c->s[i].T, c->nh, HD, c->s[i].nk, vis_d + c->r0[i],
                               cand_d ? cand_d + c->s0[i] : NULL, sc_d + c->s0[i], E));
    sync_be(be);
    float *sa = down(be, sc_d, sizeof(float) * (size_t)c->n_sc);
    RUN(be->mem_set(be, sc_d, 0xA5, sizeof(float) * (size_t)c->n_sc, E));
    RUN(be->indexer_scores_rows(be, q_d, w_d, W_SCALE, c->T, c->nh, HD, rows_d, c->nk_max, sc_d, E));
    sync_be(be);
    float *sb = down(be, sc_d, sizeof(float) * (size_t)c->n_sc);
    row("indexer_scores_rows cached keys", shape, elems_differ(sa, sb, c->n_sc, 4), c->n_sc);
    if (bench) { /* the decoded keys through the rows slot (the reference's copy) vs the cache rows */
        di_index_row *rk = xmalloc(sizeof(di_index_row) * (size_t)c->T);
        for (int i = 0; i < c->n_seq; i++)
            for (int t = 0; t < c->s[i].T; t++) {
                int r = c->r0[i] + t;
                rk[r] = rows[r], rk[r].kbase = NULL, rk[r].kpages = NULL, rk[r].keys = dec_d + dk[i] * HD;
            }
        di_index_row *rk_d = up(be, rk, sizeof(di_index_row) * (size_t)c->T);
        double t_keys, t_cache;
        BATCH(t_keys, 10,
              RUN(be->indexer_scores_rows(be, q_d, w_d, W_SCALE, c->T, c->nh, HD, rk_d, c->nk_max, sc_d, E)));
        BATCH(t_cache, 10,
              RUN(be->indexer_scores_rows(be, q_d, w_d, W_SCALE, c->T, c->nh, HD, rows_d, c->nk_max, sc_d, E)));
        printf("# bench scorer %s: decoded bf16 keys %.1f us, cache rows %.1f us per layer\n", shape, t_keys * 1e3,
               t_cache * 1e3);
        be->mem_free(be, rk_d), free(rk);
    }
    void *p[] = {enc_d, paged_d, dec_d, perm_d, cand_d, q_d, w_d, vis_d, rows_d, sc_d};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++)
        if (p[i]) be->mem_free(be, p[i]);
    free(enc), free(dec), free(seqk), free(perm), free(paged), free(rows), free(sa), free(sb);
}

static void check_case(const di_backend *be, const char *rule, tcase *c, bool bench) {
    char shape[160];
    snprintf(shape, sizeof shape, "%s, %s", c->name, rule);
    if (!strcmp(be->name, "cuda")) st = (cudaStream_t)di_backend_cuda_stream(be); /* the bench's events' stream */
    dev_run d;
    run_alloc(be, c, &d);
    run_poison(be, c, &d);
    run_loop(be, c, &d);
    sync_be(be);
    float *sa = down(be, d.scores, sizeof(float) * (size_t)c->n_sc);
    uint8_t *ma = down(be, d.mask, (size_t)c->n_sc);
    int32_t *ta = down(be, d.top, sizeof(int32_t) * (size_t)c->n_top);
    run_poison(be, c, &d);
    run_rows(be, c, &d);
    sync_be(be);
    float *sb = down(be, d.scores, sizeof(float) * (size_t)c->n_sc);
    uint8_t *mb = down(be, d.mask, (size_t)c->n_sc);
    int32_t *tb = down(be, d.top, sizeof(int32_t) * (size_t)c->n_top);
    row("indexer_scores_rows", shape, elems_differ(sa, sb, c->n_sc, 4), c->n_sc);
    if (c->cand_src) row("candidate_mask_rows", shape, elems_differ(ma, mb, c->n_sc, 1), c->n_sc);
    row("topk_rows", shape, elems_differ(ta, tb, c->n_top, 4), c->n_top);
    int64_t zeros = 0, pads = 0, cut_ties = 0; /* rows whose k-th best visible score has an equal outside */
    for (int64_t j = 0; j < c->n_sc; j++) zeros += sb[j] == 0.0f;
    for (int64_t j = 0; j < c->n_top; j++) pads += tb[j] == -1;
    for (int i = 0; i < c->n_seq; i++)
        for (int t = 0; t < c->s[i].T; t++) {
            const int r = c->r0[i] + t, k = c->w[r] < TOPK ? c->w[r] : TOPK;
            const float *sr = sb + c->s0[i] + (int64_t)t * c->s[i].nk;
            const int32_t *tr = tb + c->o0[i] + t * c->kq[i];
            float kth = INFINITY; /* the smallest selected score */
            int n_sel = 0;
            for (int j = 0; j < k; j++)
                if (tr[j] >= 0) kth = sr[tr[j]] < kth ? sr[tr[j]] : kth, n_sel++;
            int64_t eq = 0;
            for (int j = 0; j < c->vis[r]; j++) eq += sr[j] == kth;
            int64_t eq_in = 0;
            for (int j = 0; j < k; j++) eq_in += tr[j] >= 0 && sr[tr[j]] == kth;
            cut_ties += n_sel == k && eq > eq_in;
        }
    printf("#   %s: %lld exact-zero scores, %lld padded ids, %lld rows with a tie across the cut\n", shape,
           (long long)zeros, (long long)pads, (long long)cut_ties);
    if (be == g_torch) check_gather(be, c, &d, c->name, bench); /* the gather does not depend on the rule */
    if (be == g_torch) check_cached_keys(be, c, c->name, bench && !strcmp(be->name, "cuda"));
    bench = bench && !strcmp(be->name, "cuda");
    if (bench) {
        double t_loop, t_rows;
        BATCH(t_loop, 10, run_loop(be, c, &d));
        BATCH(t_rows, 10, run_rows(be, c, &d));
        printf("# bench selection %s: per-sequence loop %.1f us, rows slots %.1f us per layer\n", shape, t_loop * 1e3,
               t_rows * 1e3);
    }
    run_free(be, &d);
    free(sa), free(ma), free(ta), free(sb), free(mb), free(tb);
}

/* A decode batch of B at ~ctx tokens (entries = ctx / ratio, each sequence a little shorter than the
 * last), every other sequence with few-valued queries. */
static void decode_case(tcase *c, int nh, int B, int ctx, int ratio, bool cand_in, bool cand_src) {
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "decode B=%d ctx %d ratio %d nh %d%s%s", B, ctx, ratio, nh,
             cand_in ? " cand" : "", cand_src ? " +mask" : "");
    c->nh = nh, c->n_seq = B, c->cand_in = cand_in, c->cand_src = cand_src;
    for (int i = 0; i < B; i++)
        c->s[i] = (seq_spec){.kind = 'd', .T = 1, .nk = (ctx - 37 * i) / ratio, .flat = i % 2 == 1};
    case_build(c);
}

/* Mixed: decode rows, verify blocks of 5 past the prompt, a prompt chunk of 16 rows (ratio 1, ~ctx). */
static void mixed_case(tcase *c, int nh, int ctx, bool cand_in, bool cand_src) {
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "mixed 8 seqs ctx %d nh %d%s%s", ctx, nh, cand_in ? " cand" : "",
             cand_src ? " +mask" : "");
    c->nh = nh, c->n_seq = 8, c->cand_in = cand_in, c->cand_src = cand_src;
    const seq_spec s[8] = {
        {'d', 1, ctx, 0, false},      {'v', 5, ctx - 100, 0, true}, {'p', 16, ctx / 2, ctx / 2 - 40, true},
        {'d', 1, 300, 0, true},       {'v', 5, 513, 0, true},       {'v', 4, ctx - 7, 0, false},
        {'p', 16, 600, 100, false},   {'d', 1, 5, 0, true},
    };
    memcpy(c->s, s, sizeof s);
    case_build(c);
}

static void run_case(tcase *c, bool bench) {
    check_case(g_torch, "torch replay", c, bench);
    check_case(g_fast, "fast", c, bench);
    case_free(c);
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    const bool on_cpu = getenv("DI_TEST_ON_CPU") != NULL, small = on_cpu || getenv("DI_QUICK") != NULL;
    if (on_cpu) { /* the harness on the CPU backend's slots (its selections replay torch: both "rules" do) */
        RUN(di_backend_cpu_create(2, &g_fast, E));
        RUN(di_backend_cpu_create(2, &g_torch, E));
        di_cpu_fused_install(g_torch);
    } else {
        if (di_cuda_device_count() < 1) {
            printf("no CUDA device: nothing to test\n0 passed, 1 failed\n");
            return 1;
        }
        setenv("DI_CUDA_TOPK", "fast", 1);
        RUN(di_backend_cuda_create(0, &g_fast, E));
        unsetenv("DI_CUDA_TOPK");
        RUN(di_backend_cuda_create(0, &g_torch, E));
    }
    if (!g_fast->topk_rows || !g_torch->topk_rows || !g_torch->indexer_scores_rows || !g_torch->candidate_mask_rows ||
        !g_torch->gather_topk_seqs)
        die("slots", "the backend has no batched index selection (DI_CUDA_INDEX_SEQS=off?)");
    if (!on_cpu) cudaEventCreate(&ev0), cudaEventCreate(&ev1);
    const bool bench = getenv("DI_BENCH") != NULL && !small;
    printf("%-30s %-52s %25s %s\n", "op", "shape", "differing / total", "result");
    static tcase c; /* large: static */
    decode_case(&c, 32, 1, 4096, 2, false, false), run_case(&c, false);
    decode_case(&c, 32, 8, 4096, 1, true, false), run_case(&c, false);
    if (!small) {
        decode_case(&c, 32, 64, 4096, 2, false, false), run_case(&c, bench); /* the bench's ratio-2 index layer */
        decode_case(&c, 32, 64, 4096, 1, false, true), run_case(&c, bench);  /* its candidate source */
        decode_case(&c, 64, 8, 4096, 1, true, false), run_case(&c, false);
        decode_case(&c, 32, 8, 65536, 1, false, true), run_case(&c, false);
        decode_case(&c, 32, 8, 65536, 2, true, false), run_case(&c, false);
    }
    mixed_case(&c, 32, 4096, false, true), run_case(&c, false);
    mixed_case(&c, 32, 4096, true, false), run_case(&c, false);
    if (!small) mixed_case(&c, 32, 65536, false, true), run_case(&c, false);
    if (bench) decode_case(&c, 32, 64, 65536, 1, false, true), run_case(&c, bench); /* the bench's 64K candidate source */
    printf("%d passed, %d failed\n", n_pass, n_fail);
    di_backend_destroy(g_fast);
    di_backend_destroy(g_torch);
    return n_fail ? 1 : 0;
}
