/* One V4.1 block over the rows of a pass (one chunk per sequence) as a chain of backend ops (spec
 * model.md §4.2–§4.5, §3.11): Engram, the mHC mixes, the attention sub-layer (window ring + shared
 * compressed KV through each sequence's cache, indexer, candidates, sparse attention with sink,
 * grouped low-rank output; the DSpark draft variant) and the MoE sub-layer with the experts grouped
 * over every row of the pass. Stage dump names are "L<i>.<stage>": token-parallel stages dump all
 * rows of the pass; per-sequence stages (index scores, candidates, top-k) dump once per sequence, in
 * row order — a pass of one sequence (the verify path) dumps exactly that sequence's tensors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward_internal.h"
#include "model/memplan.h"
#include "util/error.h"

#define CK(call)                     \
    do {                             \
        int rc_ = (call);            \
        if (rc_) return rc_;         \
    } while (0)
/* backend memory (ALLOC) and host memory (HALLOC), forward_internal.h */
#define ALLOC(ptr, n, persist)                                               \
    do {                                                                     \
        (ptr) = fwd_alloc(c, sizeof(*(ptr)) * (size_t)(n), (persist));      \
        if (!(ptr)) return c->err ? c->err->code : DI_ERR_NOMEM;             \
    } while (0)
#define HALLOC(ptr, n, persist)                                              \
    do {                                                                     \
        (ptr) = fwd_halloc(c, sizeof(*(ptr)) * (size_t)(n), (persist));     \
        if (!(ptr)) return c->err ? c->err->code : DI_ERR_NOMEM;             \
    } while (0)
#define UPLOAD(dst, host, n, persist)                                           \
    do {                                                                        \
        (dst) = fwd_upload(c, (host), sizeof(*(host)) * (size_t)(n), (persist)); \
        if (!(dst)) return c->err ? c->err->code : DI_ERR_NOMEM;                \
    } while (0)

static void dname(char *buf, size_t n, int L, const char *stage) { snprintf(buf, n, "L%d.%s", L, stage); }

#define DUMP(stage, dt, data, nd, a, b, e)                     \
    do {                                                       \
        if (c->opts->dump) {                                   \
            char nm_[96];                                      \
            dname(nm_, sizeof nm_, L, stage);                  \
            fwd_dump(c, nm_, dt, data, nd, a, b, e);           \
        }                                                      \
    } while (0)

/* ---------------- Engram (§4.3) ---------------- */

int fwd_engram(fwd_ctx *c, int L, uint16_t *x) {
    const di_config *cfg = c->cfg;
    int e = cfg->layer[L].engram_index;
    if (e < 0) return DI_OK;
    const di_layer_w *w = &c->m->w.layers[L];
    const di_backend *be = c->be;
    int64_t T = c->T, D = cfg->hidden_size;
    int hc = cfg->hc_mult, ehd = cfg->engram_head_dim;
    int cols = (cfg->engram_max_ngram_size - 1) * cfg->engram_n_heads;
    uint16_t *emb, *kv; /* bf16 [T, cols·ehd], bf16 [T, (hc+1)·D] */
    ALLOC(emb, T * cols * ehd, 0);
    ALLOC(kv, T * (hc + 1) * D, 0);
    CK(be->engram_lookup(be, w->eg_table, w->eg_table_scale, w->eg_rows, ehd, c->eg_ids[e], T, cols, emb, c->err));
    DUMP("engram.rows", DI_BF16, emb, 2, T, (int64_t)cols * ehd, 0);
    CK(be->linear_fp8(be, emb, T, (int64_t)cols * ehd, w->eg_wkv.w, w->eg_wkv.s, (hc + 1) * D, kv, c->err));
    DUMP("engram.kv", DI_BF16, kv, 2, T, (hc + 1) * D, 0);
    CK(be->engram_gate(be, x, kv, T, hc, D, w->eg_q, w->eg_k, (float)cfg->rms_norm_eps, c->err));
    DUMP("engram.out", DI_BF16, x, 3, T, hc, D);
    return DI_OK;
}

/* ---------------- attention sub-layer (§3.4, §4.4, §3.11) ---------------- */

/* One sequence's part of a layer's attention (block lifetime). Its rows of the pass are
 * [r0, r0 + T); its new compressed entries are rows [lat0, lat0 + n_new) of the layer's latent. */
typedef struct seq_attn {
    int64_t e0, n_new, lat0;  /* entries [e0, e0 + n_new) its chunk completes (kv sources) */
    uint16_t *win;            /* bf16 [n_win_rows, hd] window key rows (backend) */
    int64_t n_kw;
    const uint16_t *cmp;      /* bf16 [n_cmp, hd] gathered compressed rows or NULL (backend) */
    int64_t n_cmp;
    int32_t *idx;             /* int32 [T, n_idx] index lists into [win ‖ cmp] (host) */
    int64_t n_idx;
    /* Backend gather (fwd_gather_on_backend): cmp is filled and the compressed columns [n_win, n_idx) of
     * idx are written by be->gather_topk from these lists once idx is in backend memory (attention). */
    const int32_t *top_dev;   /* int32 [T, kc] the index source's top-k (backend) or NULL */
    int64_t kc, n_ent;        /* ids per query; entries visible to the chunk */
    int64_t per;              /* queries per backend gather: cmp holds min(T, per)·kc rows (fwd_gather_rows) */
    int kv_stage;             /* the cache stage holding the entries */
} seq_attn;

/* Rows one backend gather may produce: T·top-k rows of hd bf16, 256 MiB at V4.1's 512 (memplan.h counts
 * them). A sequence with more queries than fit (a long prefill chunk) is gathered and attended in
 * slices of rows_per_gather / top-k queries (attention(): each query's output depends on its own rows
 * only). Before session 12 such passes took the host path — the top-k lists read back, each entry
 * decoded once per sequence, the lists rebuilt on the host — which cost 35-68 ms of host time per
 * index layer at B = 256 / 64K and ~60 ms of the 8K prefill's index layers (bench/NOTES-gpu.md).
 * fwd_set_gather_rows or DI_FWD_GATHER_ROWS change the limit (tests and the GPU checks: small slices on
 * the tiny models). */
static int64_t g_gather_rows = -1; /* -1: DI_FWD_GATHER_ROWS from the environment (checks), else the default */
void fwd_set_gather_rows(int64_t rows) { g_gather_rows = rows > 0 ? rows : DI_MEMPLAN_GATHER_ROWS; }
static int64_t gather_rows(void) {
    if (g_gather_rows < 0) {
        const char *v = getenv("DI_FWD_GATHER_ROWS");
        fwd_set_gather_rows(v ? strtoll(v, NULL, 10) : 0);
    }
    return g_gather_rows;
}

bool fwd_gather_on_backend(const fwd_ctx *c) {
    const di_backend *be = c->be;
    if (!be->gather_topk) return false;
    for (int i = 0; i < c->n_seq; i++) {
        const di_cache *k = c->seq[i].ck.cache;
        if (k->be != be && !(be->host_memory && !k->be)) return false; /* the arena is elsewhere */
    }
    return true;
}

/* The publication of source stage `src` for a consumer at layer L in sequence q, checked to exist
 * (a layer that is its own source reads what it has published so far in this block). */
static const fwd_pub *source(fwd_ctx *c, const fwd_seq *q, int L, int src, const char *what) {
    if (src < 0 || src > L || (src < L && !q->pub[src].done)) {
        di_error_set(c->err, DI_ERR_INTERNAL, "layer %d: %s source layer %d has not run in this pass", L, what, src);
        return NULL;
    }
    return &q->pub[src];
}

/* kv sources: the latent, before RoPE, of the compressed entries [s0/R, (s0+T)/R) each chunk
 * completes, every sequence's after the previous one's (sa[i].lat0). Ratio 1: a bf16 projection per
 * token (so the latent rows are the pass rows). Ratio R > 1: f32 projections of all rows in one GEMM
 * each, then per sequence one call of a per-channel softmax pooling of R tokens over all its groups,
 * streamed through its cache's carry state ring (a chunk may start and end inside a group; the
 * trailing partial group waits in the state). Then the compressor RMSNorm over all new entries.
 *   u bf16 [T, D];  *lat bf16 [n_new, hd] (block lifetime), n_new = Σ sa[i].n_new */
static int compressor(fwd_ctx *c, int L, const uint16_t *u, seq_attn *sa, uint16_t **lat_out, int64_t *n_new_out) {
    const di_config *cfg = c->cfg;
    const di_layer_w *w = &c->m->w.layers[L];
    const di_backend *be = c->be;
    int64_t T = c->T, D = cfg->hidden_size, hd = cfg->head_dim;
    int R = cfg->layer[L].compress_ratio;
    int64_t n_new = 0;
    for (int i = 0; i < c->n_seq; i++) {
        const fwd_chunk *k = &c->seq[i].ck;
        sa[i].e0 = k->s0 / R, sa[i].n_new = (k->s0 + k->T) / R - k->s0 / R, sa[i].lat0 = n_new;
        n_new += sa[i].n_new;
    }
    uint16_t *lat;
    ALLOC(lat, (n_new > 0 ? n_new : 1) * hd, 0);
    if (R == 1) {
        CK(be->linear_bf16(be, u, T, D, w->cmp_wkv, hd, lat, c->err));
    } else {
        float *a, *g; /* f32 [T, hd] */
        ALLOC(a, T * hd, 0);
        ALLOC(g, T * hd, 0);
        CK(be->linear_f32(be, u, T, D, w->cmp_wkv, hd, a, c->err));
        CK(be->linear_f32(be, u, T, D, w->cmp_wgate, hd, g, c->err));
        /* one pooling call for a sequence's chunk: its groups are independent but for the partial ones
         * at the chunk's ends, which stream through the carry state ring in its cache; one call for all
         * sequences where the backend pools several chunks at once */
        di_pool_seq *ps_h; /* [n_seq] (host) */
        int nb = 0;
        HALLOC(ps_h, c->n_seq, 0);
        for (int i = 0; i < c->n_seq; i++) {
            const fwd_seq *q = &c->seq[i];
            float *state; /* f32 [nb, 2, R, hd]: the sequence's compressor ring (its cache) */
            CK(di_cache_cmp_state_ring(q->ck.cache, L, q->ck.s0, q->ck.s0 + q->ck.T, &state, &nb, c->err));
            ps_h[i] = (di_pool_seq){.state = state, .start_pos = q->ck.s0, .m = q->ck.T, .row0 = q->r0, .out0 = sa[i].lat0};
        }
        if (be->compress_pool_seqs && c->n_seq > 1) {
            di_pool_seq *ps;          /* [n_seq] (backend) */
            int32_t *eseq_h, *eseq;   /* int32 [n_new] sequence of each new entry (host, backend) */
            HALLOC(eseq_h, n_new > 0 ? n_new : 1, 0); /* one element at least: it is uploaded as such */
            for (int i = 0; i < c->n_seq; i++)
                for (int64_t j = 0; j < sa[i].n_new; j++) eseq_h[sa[i].lat0 + j] = (int32_t)i;
            UPLOAD(ps, ps_h, c->n_seq, 0);
            UPLOAD(eseq, eseq_h, n_new > 0 ? n_new : 1, 0);
            CK(be->compress_pool_seqs(be, a, g, R, hd, nb, ps, c->n_seq, eseq, n_new, lat, c->err));
        } else {
            for (int i = 0; i < c->n_seq; i++)
                CK(be->compress_pool_ring(be, a + ps_h[i].row0 * hd, g + ps_h[i].row0 * hd, ps_h[i].m, ps_h[i].start_pos,
                                          R, hd, ps_h[i].state, nb, lat + ps_h[i].out0 * hd, c->err));
        }
    }
    if (n_new > 0) {
        CK(be->rmsnorm(be, lat, n_new, hd, w->cmp_norm, (float)cfg->rms_norm_eps, lat, c->err));
        DUMP("attn.cmp.latent", DI_BF16, lat, 2, n_new, hd, 0);
    }
    *lat_out = lat;
    *n_new_out = n_new;
    return DI_OK;
}

/* Group positions n·R of every sequence's new compressed entries, in latent row order (backend).
 *   out int64 [n_new] */
static int64_t *entry_positions(fwd_ctx *c, const seq_attn *sa, int64_t n_new, int R) {
    int64_t *p = fwd_halloc(c, sizeof(int64_t) * (size_t)(n_new > 0 ? n_new : 1), 0); /* int64 [n_new] host */
    for (int i = 0; p && i < c->n_seq; i++)
        for (int64_t j = 0; j < sa[i].n_new; j++) p[sa[i].lat0 + j] = (sa[i].e0 + j) * R;
    return p ? fwd_upload(c, p, sizeof(int64_t) * (size_t)(n_new > 0 ? n_new : 1), 0) : NULL;
}

/* A host list of n cache row addresses where the batched row slots read it: the host list itself on a
 * host-memory backend, else a copy uploaded through the pass's allocator (the arena's pinned staging
 * when there is one: nothing allocated or copied from pageable memory inside a captured pass). */
static const void *rows_list(fwd_ctx *c, const void *host, int64_t n) {
    if (c->be->host_memory || n <= 0) return host;
    return fwd_upload(c, host, sizeof(void *) * (size_t)n, 0);
}

/* Every sequence's new compressed entries (ikey 0) or index keys (1) into its cache in one encode:
 * the rows are in latent order, sequence after sequence, like their addresses.  x bf16 [n_new, d] */
static int put_entries(fwd_ctx *c, int L, int ikey, const uint16_t *x, int64_t n_new, int64_t d, const seq_attn *sa) {
    uint8_t **dst; /* [n_new] row addresses in the caches (host list) */
    HALLOC(dst, n_new, 0);
    for (int i = 0; i < c->n_seq; i++)
        CK(di_cache_entry_put_addrs(c->seq[i].ck.cache, L, ikey, sa[i].e0, sa[i].e0 + sa[i].n_new, dst + sa[i].lat0,
                                    c->err));
    uint8_t *const *list = rows_list(c, dst, n_new);
    if (!list && n_new > 0) return c->err->code;
    return di_cache_rows_encode_list(c->be, ikey ? DI_CACHE_ROWS_IKEY : DI_CACHE_ROWS_CMP, x, n_new, d, list, c->err);
}

/* kv sources: index keys of the new entries from the (unrotated) latent — wk, k_norm, RoPE at the
 * group's first position n·R — stored in each sequence's cache, which applies the FP4 QDQ with E8M0
 * scales per 32 (no Hadamard in V4.1).  lat bf16 [n_new, hd];  epos int64 [n_new] */
static int index_keys(fwd_ctx *c, int L, const uint16_t *lat, int64_t n_new, const int64_t *epos, const seq_attn *sa) {
    const di_config *cfg = c->cfg;
    const di_layer_w *w = &c->m->w.layers[L];
    const di_backend *be = c->be;
    int ihd = cfg->index_head_dim;
    int64_t hd = cfg->head_dim;
    uint16_t *k; /* bf16 [n_new, ihd] */
    ALLOC(k, n_new * ihd, 0);
    CK(be->linear_bf16(be, lat, n_new, hd, w->idx_wk, ihd, k, c->err));
    CK(be->rmsnorm(be, k, n_new, ihd, w->idx_k_norm, (float)cfg->rms_norm_eps, k, c->err));
    CK(be->rope(be, k, n_new, 1, ihd, cfg->qk_rope_head_dim, epos, c->rope_freqs[cfg->layer[L].rope], false, c->err));
    CK(put_entries(c, L, 1, k, n_new, ihd, sa));
    if (c->opts->dump) {
        CK(be->qdq_fp4_e8m0(be, k, n_new, ihd, 32, c->err)); /* the value the cache holds */
        DUMP("attn.index_k", DI_BF16, k, 2, n_new, ihd, 0);
    }
    return DI_OK;
}

/* The index keys every sequence scores at index layer L (the per-sequence ops' path) — all entries its
 * chunk sees, from its key source's cache — read for all sequences in one decode. A prompt chunk's rows
 * are as wide as its prompt (fwd_select_entries): the entries not written yet repeat the newest key (never visible, so
 * scored −inf whatever they hold).  keys_of[i]: bf16 [nsel_i, ihd] (backend), NULL for a sequence
 * that sees none */
static int read_index_keys(fwd_ctx *c, int L, const uint16_t **keys_of) {
    const di_layer_cfg *lc = &c->cfg->layer[L];
    int64_t ihd = c->cfg->index_head_dim, n = 0;
    for (int i = 0; i < c->n_seq; i++)
        if (c->seq[i].pub[L].topk_k) n += fwd_select_entries(&c->seq[i].ck, lc->compress_ratio);
    const uint8_t **src; /* [n] cache addresses of the keys, sequence after sequence (host) */
    uint16_t *keys;      /* bf16 [n, ihd] */
    HALLOC(src, n, 0);
    ALLOC(keys, (n > 0 ? n : 1) * ihd, 0);
    int64_t o = 0; /* keys listed so far */
    for (int i = 0; i < c->n_seq; i++) {
        fwd_seq *q = &c->seq[i];
        const int R = lc->compress_ratio;
        int64_t ncmp = (q->ck.s0 + q->ck.T) / R, nsel = fwd_select_entries(&q->ck, R);
        keys_of[i] = NULL;
        if (!q->pub[L].topk_k) continue;
        if (!source(c, q, L, lc->index_key_source, "index-key")) return c->err->code;
        CK(di_cache_entry_read_addrs(q->ck.cache, lc->index_key_source, 1, 0, ncmp, src + o, c->err));
        for (int64_t e = ncmp; e < nsel; e++) src[o + e] = src[o + ncmp - 1];
        keys_of[i] = keys + o * ihd;
        o += nsel;
    }
    const uint8_t *const *list = rows_list(c, src, n);
    if (!list && n > 0) return c->err->code;
    return di_cache_rows_decode_list(c->be, DI_CACHE_ROWS_IKEY, list, n, ihd, keys, c->err);
}

/* The rows slots' keys: each sequence's rows read its key source's cache where the keys lie (backend.h
 * di_index_row kbase: no decoded copy, no address per key; a 64K-context decode step of 64 sequences
 * listed 4.2M addresses, ~23 ms of host time per index layer, bench/NOTES-gpu.md); a paged cache's
 * block table is uploaded once per sequence.  kref [n_seq] out: the key fields of sequence i's rows */
static int index_key_rows(fwd_ctx *c, int L, di_index_row *kref) {
    const di_layer_cfg *lc = &c->cfg->layer[L];
    for (int i = 0; i < c->n_seq; i++) {
        fwd_seq *q = &c->seq[i];
        int64_t ncmp = (q->ck.s0 + q->ck.T) / lc->compress_ratio; /* ≥ 1 where the sequence selects */
        kref[i] = (di_index_row){0};
        if (!q->pub[L].topk_k) continue;
        if (!source(c, q, L, lc->index_key_source, "index-key")) return c->err->code;
        di_cache_ikey_layout k;
        CK(di_cache_ikey_layout_of(q->ck.cache, lc->index_key_source, ncmp, &k, c->err));
        int32_t *pages = NULL; /* int32 [n_pages] (backend) */
        if (k.pages && k.n_pages > 0) UPLOAD(pages, k.pages, k.n_pages, 0);
        kref[i] = (di_index_row){.kbase = k.base, .kpages = pages, .kpage_entries = k.page_entries,
                                 .kpage_rows = k.page_rows, .krow0 = k.row0, .kn = (int32_t)ncmp};
    }
    return DI_OK;
}

/* Index sources: the queries and weights of every row in one projection each, then per sequence:
 * score every index key visible to its chunk (read back from the key source's cache) with its own
 * rows (bf16 arithmetic), mask by the candidate blocks (re-index layers), publish the candidate mask
 * (the candidate source; its own selection is not masked) and the top-k list of compressed entry ids,
 * ascending, −1 padded. Each row selects over its own width (fwd_row_select_entries) — the
 * reference's T/R for a prompt row (T = the whole prompt), (p+1)/R for a row past it, as its decode
 * step — with k = min(index_topk, width): the CPU selections replay torch's, whose choice among
 * EXACTLY tied scores depends on both, so every chunking of a prompt picks what its one-shot prefill
 * picks and a verify block or a recompute picks what the decode steps picked. The scores are computed
 * once, as wide as the chunk's last row (a score does not depend on the width). A sequence's widths
 * are its own, whatever else is in the batch.
 * Launches: with the backend's batched slots (indexer_scores_rows, candidate_mask_rows, topk_rows) a
 * pass runs each op once over all its rows, every row described by its own width, visible count and k,
 * its keys read where its key source's cache keeps them (select_rows, index_key_rows); otherwise each op
 * runs once per sequence, the narrower rows one by one, over keys decoded for the pass (select_seq,
 * read_index_keys). The values are the same either way. */

/* One sequence's part of an index layer's selection. */
typedef struct seq_sel {
    int64_t s0;          /* its score rows (and candidate mask rows): f32 [T_i, nk] at scores + s0 */
    int64_t o0;          /* its top-k lists: int32 [T_i, k] at top + o0 */
    int64_t nk;          /* score row width: fwd_select_entries */
    int k;               /* top-k of its widest row; 0: it selects nothing */
    const uint8_t *cand; /* uint8 [T_i, nk] its candidate source's mask (backend), or NULL */
} seq_sel;

/* The layer's selection buffers and inputs (indexer). */
typedef struct sel_pass {
    const uint16_t *qi, *iw;  /* bf16 [T, ih, ihd] index queries, bf16 [T, ih] weights */
    float w_scale;
    const uint16_t **keys_of; /* [n_seq] bf16 [nk_i, ihd] each sequence's index keys (backend); the per-sequence ops */
    const di_index_row *kref; /* [n_seq] where each sequence's keys lie in its cache (the rows' key fields):
                               * the rows slots */
    const int32_t *vis_h;     /* int32 [T] entries visible to each row (host) */
    const seq_sel *ss;        /* [n_seq] */
    float *scores;            /* f32 [Σ T_i·nk_i] */
    uint8_t *mask;            /* uint8 [Σ T_i·nk_i] candidate masks, or NULL (not a candidate source) */
    int32_t *top;             /* int32 [Σ T_i·k_i] */
} sel_pass;

/* Sequence i's scores, candidate mask and top-k lists with the per-sequence ops: the rows [0, t_full)
 * narrower than the last one (rows past the prompt) select alone over their own width, the rest
 * together.  vis int32 [T] (backend) */
static int select_seq(fwd_ctx *c, int L, const sel_pass *p, int i, const int32_t *vis) {
    const di_config *cfg = c->cfg;
    const di_backend *be = c->be;
    const fwd_seq *q = &c->seq[i];
    const seq_sel *s = &p->ss[i];
    const int R = cfg->layer[L].compress_ratio, ih = cfg->index_n_heads, ihd = cfg->index_head_dim;
    const int64_t Ti = q->ck.T, nk = s->nk;
    const int32_t *vi = vis + q->r0;   /* int32 [Ti] */
    float *scores = p->scores + s->s0; /* f32 [Ti, nk] */
    int32_t *top = p->top + s->o0;     /* int32 [Ti, k] */
    CK(be->indexer_scores(be, p->qi + q->r0 * ih * ihd, p->iw + q->r0 * ih, p->w_scale, p->keys_of[i], Ti, ih, ihd, nk,
                          vi, s->cand, scores, c->err));
    int64_t t_full = 0;
    while (t_full < Ti && fwd_row_select_entries(&q->ck, q->ck.s0 + t_full, R) < nk) t_full++;
    if (p->mask) {
        int blk = cfg->candidate_block_size;
        uint8_t *mask = p->mask + s->s0; /* uint8 [Ti, nk]; a narrow row's columns past its width are left
                                          * unwritten: its scorer reads only entries < its visible count */
        float *ws;                       /* f32 [ceil(nk / blk)] */
        ALLOC(ws, (nk + blk - 1) / blk + 1, 0);
        for (int64_t t = 0; t < t_full; t++) {
            int64_t w = fwd_row_select_entries(&q->ck, q->ck.s0 + t, R);
            if (w > 0)
                CK(be->candidate_mask(be, scores + t * nk, 1, w, vi + t, blk, cfg->candidate_topk_blocks, mask + t * nk,
                                      ws, c->err));
        }
        if (t_full < Ti)
            CK(be->candidate_mask(be, scores + t_full * nk, Ti - t_full, nk, vi + t_full, blk, cfg->candidate_topk_blocks,
                                  mask + t_full * nk, ws, c->err));
    }
    for (int64_t t = 0; t < t_full; t++) { /* k = min(index_topk, width), then −1 to the sequence's k */
        int64_t w = fwd_row_select_entries(&q->ck, q->ck.s0 + t, R);
        int kt = (int)(w < cfg->index_topk ? w : cfg->index_topk);
        int32_t *row = top + t * s->k;
        if (kt > 0) CK(be->topk(be, scores + t * nk, 1, w, vi + t, kt, 0, row, c->err));
        if (kt < s->k) CK(be->mem_set(be, row + kt, 0xff, sizeof(int32_t) * (size_t)(s->k - kt), c->err));
    }
    if (t_full < Ti)
        CK(be->topk(be, scores + t_full * nk, Ti - t_full, nk, vi + t_full, s->k, 0, top + t_full * s->k, c->err));
    return DI_OK;
}

/* Every sequence's scores, candidate masks and top-k lists in one call of each batched slot: row r of
 * the pass as the per-sequence ops see it (its sequence's keys and candidate row, its own width, visible
 * count and k). A sequence that selects nothing contributes empty rows (no keys, width 0). */
static int select_rows(fwd_ctx *c, int L, const sel_pass *p) {
    const di_config *cfg = c->cfg;
    const di_backend *be = c->be;
    const int R = cfg->layer[L].compress_ratio;
    di_index_row *rows_h, *rows; /* [T] (host, backend) */
    int64_t nk_max = 0, w_max = 0;
    HALLOC(rows_h, c->T, 0);
    for (int i = 0; i < c->n_seq; i++) {
        const fwd_seq *q = &c->seq[i];
        const seq_sel *s = &p->ss[i];
        for (int64_t t = 0; t < q->ck.T; t++) {
            di_index_row *r = &rows_h[q->r0 + t];
            if (!s->k) {
                *r = (di_index_row){0}; /* no keys, width 0: nothing scored or selected */
                continue;
            }
            int64_t w = fwd_row_select_entries(&q->ck, q->ck.s0 + t, R);
            *r = p->kref[i];
            r->cand = s->cand ? s->cand + t * s->nk : NULL;
            r->s0 = s->s0 + t * s->nk, r->o0 = s->o0 + t * s->k;
            r->nk = (int32_t)s->nk, r->w = (int32_t)w, r->vis = p->vis_h[q->r0 + t];
            r->k = (int32_t)(w < cfg->index_topk ? w : cfg->index_topk), r->kp = s->k;
            nk_max = s->nk > nk_max ? s->nk : nk_max;
            w_max = w > w_max ? w : w_max;
        }
    }
    UPLOAD(rows, rows_h, c->T, 0);
    CK(be->indexer_scores_rows(be, p->qi, p->iw, p->w_scale, c->T, cfg->index_n_heads, cfg->index_head_dim, rows, nk_max,
                               p->scores, c->err));
    if (p->mask)
        CK(be->candidate_mask_rows(be, p->scores, c->T, rows, w_max, cfg->candidate_block_size,
                                   cfg->candidate_topk_blocks, p->mask, c->err));
    return be->topk_rows(be, p->scores, c->T, rows, w_max, p->top, c->err);
}

/*   u bf16 [T, D];  qr bf16 [T, qr] */
static int indexer(fwd_ctx *c, int L, const uint16_t *u, const uint16_t *qr) {
    const di_config *cfg = c->cfg;
    const di_layer_cfg *lc = &cfg->layer[L];
    const di_layer_w *w = &c->m->w.layers[L];
    const di_backend *be = c->be;
    int64_t T = c->T, D = cfg->hidden_size, qrk = cfg->q_lora_rank;
    int R = lc->compress_ratio, ih = cfg->index_n_heads, ihd = cfg->index_head_dim;
    seq_sel *ss; /* [n_seq] (host) */
    HALLOC(ss, c->n_seq, 0);
    int64_t n_top = 0, n_sc = 0; /* Σ T_i·k_i: the pass's top-k lists, back to back in sequence order; Σ T_i·nk_i */
    for (int i = 0; i < c->n_seq; i++) {
        fwd_seq *q = &c->seq[i];
        int64_t ncmp = (q->ck.s0 + q->ck.T) / R, nsel = fwd_select_entries(&q->ck, R);
        /* a chunk that sees no entry yet selects none (its lists would be all −1 padding) */
        q->pub[L].topk_k = ncmp == 0 ? 0 : (int)(nsel < cfg->index_topk ? nsel : cfg->index_topk);
        if (c->out) c->out->topk_k[L] = q->pub[L].topk_k, c->out->n_keys[L] = nsel;
        ss[i] = (seq_sel){.s0 = n_sc, .o0 = n_top, .nk = nsel, .k = q->pub[L].topk_k, .cand = NULL};
        if (!ss[i].k) continue;
        n_top += q->ck.T * ss[i].k;
        n_sc += q->ck.T * nsel;
        if (lc->candidate_source >= 0 && !c->opts->faults.ignore_candidates) {
            const fwd_pub *cs = source(c, q, L, lc->candidate_source, "candidate");
            if (!cs) return c->err->code;
            if (cs->n_cand != nsel)
                return di_error_set(c->err, DI_ERR_INTERNAL, "layer %d: candidate mask over %lld entries, scores over %lld",
                                    L, (long long)cs->n_cand, (long long)nsel);
            ss[i].cand = cs->cand;
        }
    }
    if (!n_top) return DI_OK; /* nothing visible yet: empty compressed lists */

    uint16_t *qi, *iw; /* bf16 [T, ih, ihd], bf16 [T, ih] */
    ALLOC(qi, T * ih * ihd, 0);
    ALLOC(iw, T * ih, 0);
    CK(be->linear_fp8(be, qr, T, qrk, w->idx_wq_b.w, w->idx_wq_b.s, (int64_t)ih * ihd, qi, c->err));
    CK(be->rope(be, qi, T, ih, ihd, cfg->qk_rope_head_dim, c->pos, c->rope_freqs[lc->rope], false, c->err));
    CK(be->qdq_fp4_e8m0(be, qi, T * ih, ihd, 32, c->err));
    DUMP("attn.index_q", DI_BF16, qi, 3, T, ih, ihd);
    CK(be->linear_bf16(be, u, T, D, w->idx_weights_proj, ih, iw, c->err));
    DUMP("attn.index_w", DI_BF16, iw, 2, T, ih, 0);
    /* the reference scales the weights by index_head_dim^-0.5 · n_heads^-0.5 (a Python double) */
    sel_pass p = {.qi = qi, .iw = iw, .w_scale = (float)(pow(ihd, -0.5) * pow(ih, -0.5)), .ss = ss};
    int32_t *vis_h;              /* int32 [T] compressed entries visible to each row's query (host) */
    int32_t *top_h = NULL;       /* int32 [n_top] host copy of the top-k lists: pass lifetime, reuse layers read them */
    bool on_backend = fwd_gather_on_backend(c);
    HALLOC(vis_h, T, 0);
    ALLOC(p.scores, n_sc, 0);
    if (lc->is_candidate_source) ALLOC(p.mask, n_sc, 1);
    ALLOC(p.top, n_top, 1);
    if (!on_backend || c->out) HALLOC(top_h, n_top, 1);
    for (int i = 0; i < c->n_seq; i++)
        for (int64_t t = 0; t < c->seq[i].ck.T; t++) vis_h[c->seq[i].r0 + t] = (int32_t)((c->seq[i].ck.s0 + t + 1) / R);
    p.vis_h = vis_h;
    bool rows = be->indexer_scores_rows && be->topk_rows && (be->candidate_mask_rows || !p.mask);
    if (rows) {
        di_index_row *kref; /* [n_seq] (host) */
        HALLOC(kref, c->n_seq, 0);
        CK(index_key_rows(c, L, kref));
        p.kref = kref;
        CK(select_rows(c, L, &p));
    } else {
        int32_t *vis; /* int32 [T] (backend) */
        HALLOC(p.keys_of, c->n_seq, 0);
        CK(read_index_keys(c, L, p.keys_of));
        UPLOAD(vis, vis_h, T, 0);
        for (int i = 0; i < c->n_seq; i++)
            if (ss[i].k) CK(select_seq(c, L, &p, i, vis));
    }

    for (int i = 0; i < c->n_seq; i++) {
        fwd_seq *q = &c->seq[i];
        const seq_sel *s = &ss[i];
        int64_t Ti = q->ck.T;
        if (!s->k) continue;
        DUMP("attn.index_scores", DI_F32, p.scores + s->s0, 2, Ti, s->nk, 0);
        if (c->out) { /* owned by c->out (golden names prefill_layer{L}_index_scores / _topk) */
            c->out->index_scores[L] = calloc((size_t)(Ti * s->nk), sizeof(float));
            c->out->topk[L] = calloc((size_t)(Ti * s->k), sizeof(int32_t));
            if (!c->out->index_scores[L] || !c->out->topk[L])
                return di_error_set(c->err, DI_ERR_NOMEM, "layer %d: index scores [%lld, %lld]", L, (long long)Ti,
                                    (long long)s->nk);
            CK(fwd_download(c, c->out->index_scores[L], p.scores + s->s0, sizeof(float) * (size_t)(Ti * s->nk)));
        }
        if (p.mask) {
            DUMP("attn.candidates", DI_I8, p.mask + s->s0, 2, Ti, s->nk, 0);
            q->pub[L].cand = p.mask + s->s0;
            q->pub[L].n_cand = s->nk;
        }
        DUMP("attn.topk", DI_I32, p.top + s->o0, 2, Ti, s->k, 0);
        q->pub[L].topk = on_backend ? NULL : top_h + s->o0;
        q->pub[L].topk_dev = p.top + s->o0;
    }
    /* Without a backend gather, the gathers of the selected entries are planned on the host
     * (gather_compressed): one download per index layer for the whole pass, a synchronisation point. */
    if (top_h) CK(fwd_download(c, top_h, p.top, sizeof(int32_t) * (size_t)n_top));
    if (c->out) /* golden convention: offset into [window rows ‖ compressed] (= T from position 0) */
        for (int64_t j = 0; j < n_top; j++)
            c->out->topk[L][j] = top_h[j] < 0 ? -1 : top_h[j] + (int32_t)c->seq[0].n_win_rows;
    return DI_OK;
}

/* kv sources: the shared compressed KV of the new entries — the latent rotated at n·R — stored in
 * each sequence's cache, which applies the FP4 QDQ with E4M3 scales over groups of 16 (all 512
 * channels).  lat bf16 [n_new, hd], rotated in place;  epos int64 [n_new] */
static int compressed_kv(fwd_ctx *c, int L, uint16_t *lat, int64_t n_new, const int64_t *epos, const seq_attn *sa) {
    const di_config *cfg = c->cfg;
    const di_backend *be = c->be;
    int64_t hd = cfg->head_dim;
    CK(be->rope(be, lat, n_new, 1, (int)hd, cfg->qk_rope_head_dim, epos, c->rope_freqs[cfg->layer[L].rope], false,
                c->err));
    CK(put_entries(c, L, 0, lat, n_new, hd, sa));
    if (c->opts->dump) {
        CK(be->qdq_fp4_e4m3(be, lat, n_new, hd, 16, c->err)); /* the value the cache holds */
        DUMP("attn.cmp_kv", DI_BF16, lat, 2, n_new, hd, 0);
    }
    return DI_OK;
}

/* The entries sequence q attends at layer L — the top-k of its index source (itself, or the latest
 * one for reuse layers) over its kv source's compressed KV — gathered from its cache (the union over
 * the chunk's queries, ascending); the lists are rewritten to index [window rows ‖ gathered].
 * With a backend gather (fwd_gather_on_backend) each query's k entries get their own rows, T·k of
 * them, filled later in attention() with the lists: the attention reads the same KV rows in the same
 * list order, so its output is the same; *cidx is then NULL.
 *   s->cmp bf16 [n_cmp, hd] (backend);  *cidx int32 [T, kc] (host) */
static int gather_compressed(fwd_ctx *c, int L, const fwd_seq *q, seq_attn *s, int32_t **cidx, int64_t *kc_out) {
    const di_layer_cfg *lc = &c->cfg->layer[L];
    int64_t T = q->ck.T, hd = c->cfg->head_dim;
    const fwd_pub *topp;
    if (!source(c, q, L, lc->kv_source, "kv") || !(topp = source(c, q, L, lc->index_source, "top-k")))
        return c->err->code;
    int64_t kc = topp->topk || topp->topk_dev ? topp->topk_k : 0;
    *kc_out = kc, s->n_cmp = 0, s->cmp = NULL, *cidx = NULL, s->top_dev = NULL;
    if (!kc) return DI_OK;

    int64_t n_all = (q->ck.s0 + T) / lc->compress_ratio; /* entries visible to the chunk's last query */
    if (!topp->topk) { /* backend gather, in slices of per queries */
        int64_t per = gather_rows() / kc > 0 ? gather_rows() / kc : 1, n = T < per ? T : per;
        uint16_t *rows; /* bf16 [n·kc, hd] */
        ALLOC(rows, n * kc * hd, 0);
        s->cmp = rows, s->n_cmp = n * kc, s->top_dev = topp->topk_dev, s->kc = kc, s->n_ent = n_all, s->per = per;
        s->kv_stage = lc->kv_source;
        return DI_OK;
    }
    int32_t *map, *ent; /* int32 [n_all]: entry → gathered row (−1: unused); int32 [n_all] gathered entries (host) */
    int32_t *idx;       /* int32 [T, kc] (host) */
    HALLOC(map, n_all, 0);
    HALLOC(ent, n_all, 0);
    HALLOC(idx, T * kc, 0);
    for (int64_t e = 0; e < n_all; e++) map[e] = -1;
    for (int64_t i = 0; i < T * kc; i++) {
        int32_t e = topp->topk[i];
        if (e >= n_all) return di_error_set(c->err, DI_ERR_INTERNAL, "layer %d: top-k entry %d of %lld", L, e, (long long)n_all);
        if (e >= 0) map[e] = 0;
    }
    int64_t nu = 0;
    for (int64_t e = 0; e < n_all; e++)
        if (map[e] == 0) ent[nu] = (int32_t)e, map[e] = (int32_t)nu++;
    uint16_t *rows; /* bf16 [nu, hd] */
    ALLOC(rows, (nu > 0 ? nu : 1) * hd, 0);
    CK(di_cache_cmp_gather(q->ck.cache, lc->kv_source, ent, nu, rows, c->err));
    for (int64_t i = 0; i < T * kc; i++) {
        int32_t e = topp->topk[i];
        idx[i] = e < 0 ? -1 : (int32_t)(q->n_win_rows + map[e]);
    }
    s->cmp = rows, s->n_cmp = nu, *cidx = idx;
    return DI_OK;
}

/* The backend gathers planned by gather_compressed: each sequence's s->cmp and the compressed columns of
 * its index lists (idx int32 [T_i, n_idx_i], backend) from the top-k lists where they are; a paged
 * cache's block table is uploaded for it (no synchronisation). The entries' codec is the cache's
 * (cache_rows.c: compressed KV = FP4 with E4M3 scales per 16). One gather_topk_seqs call for every
 * sequence where the backend has it, else one gather_topk per sequence.
 *   idx_d int32 [Σ T_i·n_idx_i] (backend, sequence after sequence) */
/* The gather of sequence q's queries [t0, t0 + m) (s->top_dev set): their top-k rows into s->cmp, their
 * compressed index columns at idx (int32, the sequence's lists in backend memory, query t0's row). */
static int gather_args(fwd_ctx *c, const fwd_seq *q, const seq_attn *s, int64_t t0, int64_t m, int32_t *idx,
                       di_gather_seq *g) {
    const di_cache *k = q->ck.cache;
    const di_cache_stage *st = &k->stage[s->kv_stage];
    const int32_t *pages = NULL; /* int32 [n_pages] (backend) */
    if (k->pool) {
        int32_t *pd;
        UPLOAD(pd, k->pages, k->n_pages > 0 ? k->n_pages : 1, 0);
        pages = pd;
    }
    *g = (di_gather_seq){.base = st->cmp, .pages = pages, .top = s->top_dev + t0 * s->kc, .rows = (uint16_t *)s->cmp,
                         .idx = idx + q->n_win, .n_entries = s->n_ent, .page_entries = st->page_entries,
                         .page_rows = k->cmp_page_rows, .row_off = st->cmp_row0, .m = m, .ldi = s->n_idx,
                         .k = (int32_t)s->kc, .row0 = (int32_t)q->n_win_rows};
    return DI_OK;
}

static int gather_one(fwd_ctx *c, const di_gather_seq *g) {
    return c->be->gather_topk(c->be, DI_CODEC_FP4_E4M3, g->base, g->n_entries, g->pages, g->page_entries, g->page_rows,
                              g->row_off, g->top, g->m, g->k, c->cfg->head_dim, g->row0, g->rows, g->idx, g->ldi, c->err);
}

static int gather_on_backend(fwd_ctx *c, const seq_attn *sa, int32_t *idx_d) {
    const di_backend *be = c->be;
    di_gather_seq *gs_h, *gs; /* [n_seq] the sequences that gather (host, backend) */
    int n = 0;
    int64_t mk_max = 0;
    HALLOC(gs_h, c->n_seq, 0);
    for (int64_t i = 0, off = 0; i < c->n_seq; off += c->seq[i].ck.T * sa[i].n_idx, i++) {
        const fwd_seq *q = &c->seq[i];
        const seq_attn *s = &sa[i];
        if (!s->top_dev) continue;
        CK(gather_args(c, q, s, 0, q->ck.T, idx_d + off, &gs_h[n++]));
        mk_max = q->ck.T * s->kc > mk_max ? q->ck.T * s->kc : mk_max;
    }
    if (be->gather_topk_seqs && n > 1) {
        UPLOAD(gs, gs_h, n, 0);
        return be->gather_topk_seqs(be, DI_CODEC_FP4_E4M3, c->cfg->head_dim, gs, n, mk_max, c->err);
    }
    for (int j = 0; j < n; j++) CK(gather_one(c, &gs_h[j]));
    return DI_OK;
}

/* A pass with a sequence whose backend gather is sliced (more queries than s->per): each sequence's
 * sparse attention on its own, a sliced one slice after slice — gather the slice's rows into s->cmp
 * (reused: the stream orders the next gather after this attention), attend the slice's queries. A query's
 * output reads only its window rows, its own gathered rows and its index list, so the slices give the
 * unsliced outputs. */
static int attend_sliced(fwd_ctx *c, const uint16_t *q, int H, int64_t hd, const seq_attn *sa, int32_t *idx_d,
                         const float *sink, uint16_t *o) {
    const di_backend *be = c->be;
    const float scale = (float)pow((double)hd, -0.5);
    for (int64_t i = 0, off = 0; i < c->n_seq; off += c->seq[i].ck.T * sa[i].n_idx, i++) {
        const fwd_seq *sq = &c->seq[i];
        const seq_attn *s = &sa[i];
        const int64_t T = sq->ck.T, per = s->top_dev ? s->per : T;
        for (int64_t t0 = 0; t0 < T; t0 += per) {
            const int64_t m = T - t0 < per ? T - t0 : per;
            int32_t *idx = idx_d + off + t0 * s->n_idx; /* the slice's lists */
            int64_t n_cmp = s->n_cmp;
            if (s->top_dev) {
                di_gather_seq g;
                CK(gather_args(c, sq, s, t0, m, idx, &g));
                CK(gather_one(c, &g));
                n_cmp = m * s->kc;
            }
            CK(be->sparse_attn(be, q + (sq->r0 + t0) * H * hd, m, H, (int)hd, s->win, s->n_kw, s->cmp, n_cmp, sink, idx,
                               s->n_idx, scale, o + (sq->r0 + t0) * H * hd, c->err));
        }
    }
    return DI_OK;
}

/* The window KV of every row (wkv → kv_norm → RoPE → FP8 QDQ of all hd channels, groups of 32), one
 * projection for the pass; each sequence's key rows are its previous window rows read from its cache
 * followed by its chunk's rows. The chunk's rows are written to the cache (which quantizes them
 * itself, from the row before the QDQ) AFTER the read, since a long chunk overwrites ring slots.
 * Every sequence's reads are one decode, its writes one encode and its key rows one gather, whatever
 * the number of sequences: the pass's kv rows and the previous rows share one buffer, from which the
 * key rows of all sequences are gathered.
 *   u bf16 [T, D];  sa[i].win bf16 [n_win_rows_i, hd] out (block lifetime) */
static int window_kv(fwd_ctx *c, int L, const uint16_t *u, seq_attn *sa) {
    const di_config *cfg = c->cfg;
    const di_layer_w *w = &c->m->w.layers[L];
    const di_backend *be = c->be;
    int64_t T = c->T, D = cfg->hidden_size, hd = cfg->head_dim;
    int64_t n_prev = 0, n_rows = 0; /* Σ previous rows, Σ key rows */
    for (int i = 0; i < c->n_seq; i++) n_prev += c->seq[i].ck.s0 - c->seq[i].win_base, n_rows += c->seq[i].n_win_rows;
    uint16_t *kv, *win;    /* bf16 [T + n_prev, hd]: the pass's rows, then the previous rows; bf16 [n_rows, hd] */
    const uint8_t **rd;    /* [n_prev] cache addresses of the previous rows (host) */
    uint8_t **wr;          /* [T] cache addresses of the pass's rows, NULL: not kept (host) */
    int32_t *rows_h, *rows; /* int32 [n_rows] row of kv feeding each key row (host, backend) */
    ALLOC(kv, (T + n_prev) * hd, 0);
    ALLOC(win, n_rows * hd, 0);
    HALLOC(rd, n_prev, 0);
    HALLOC(wr, T, 0);
    HALLOC(rows_h, n_rows, 0);
    CK(be->linear_fp8(be, u, T, D, w->wkv.w, w->wkv.s, hd, kv, c->err));
    CK(be->rmsnorm(be, kv, T, hd, w->kv_norm, (float)cfg->rms_norm_eps, kv, c->err));
    CK(be->rope(be, kv, T, 1, (int)hd, cfg->qk_rope_head_dim, c->pos, c->rope_freqs[cfg->layer[L].rope], false,
                c->err));
    int64_t p = 0, r = 0; /* previous rows and key rows so far */
    for (int i = 0; i < c->n_seq; i++) {
        const fwd_seq *q = &c->seq[i];
        int64_t np = q->ck.s0 - q->win_base;
        CK(di_cache_window_read_addrs(q->ck.cache, L, q->win_base, q->ck.s0, rd + p, c->err));
        CK(di_cache_window_put_addrs(q->ck.cache, L, q->ck.s0, q->ck.T, wr + q->r0, c->err));
        sa[i].win = win + r * hd;
        sa[i].n_kw = q->n_win_rows;
        for (int64_t j = 0; j < np; j++) rows_h[r++] = (int32_t)(T + p + j);
        for (int64_t t = 0; t < q->ck.T; t++) rows_h[r++] = (int32_t)(q->r0 + t);
        p += np;
    }
    const uint8_t *const *rd_list = rows_list(c, rd, n_prev);
    uint8_t *const *wr_list = rows_list(c, wr, T);
    if ((!rd_list && n_prev > 0) || (!wr_list && T > 0)) return c->err->code;
    CK(di_cache_rows_decode_list(be, DI_CACHE_ROWS_WINDOW, rd_list, n_prev, hd, kv + T * hd, c->err));
    CK(di_cache_rows_encode_list(be, DI_CACHE_ROWS_WINDOW, kv, T, hd, wr_list, c->err));
    CK(be->qdq_fp8(be, kv, T, hd, 32, c->err));
    DUMP("attn.kv", DI_BF16, kv, 2, T, hd, 0);
    UPLOAD(rows, rows_h, n_rows, 0);
    return be->gather_rows(be, kv, hd, rows, n_rows, win, c->err);
}

/* The compressed half of attention (compress ratio > 0), in the reference's order: the kv source's
 * latent feeds its index keys BEFORE it is rotated into the compressed KV, and the indexer runs in
 * between; then each sequence's index lists become [window ‖ gathered compressed entries].
 *   u bf16 [T, D];  qr bf16 [T, qr] */
static int attn_compressed(fwd_ctx *c, int L, const uint16_t *u, const uint16_t *qr, seq_attn *sa) {
    const di_layer_cfg *lc = &c->cfg->layer[L];
    uint16_t *lat = NULL; /* bf16 [n_new, hd] */
    int64_t n_new = 0;
    const int64_t *epos = NULL; /* int64 [n_new] */
    if (lc->is_kv_source) {
        CK(compressor(c, L, u, sa, &lat, &n_new));
        if (n_new > 0 && !(epos = entry_positions(c, sa, n_new, lc->compress_ratio))) return c->err->code;
    }
    if (n_new > 0 && lc->has_index_wk) CK(index_keys(c, L, lat, n_new, epos, sa));
    if (lc->is_index_source) CK(indexer(c, L, u, qr));
    if (n_new > 0) CK(compressed_kv(c, L, lat, n_new, epos, sa));
    for (int i = 0; i < c->n_seq; i++) c->seq[i].pub[L].done = true;
    for (int i = 0; i < c->n_seq; i++) {
        const fwd_seq *q = &c->seq[i];
        int32_t *cidx = NULL; /* int32 [T_i, kc] */
        int64_t kc = 0, T = q->ck.T;
        CK(gather_compressed(c, L, q, &sa[i], &cidx, &kc));
        int32_t *idx; /* int32 [T_i, n_win + kc] */
        int64_t n_idx = q->n_win + kc;
        HALLOC(idx, T * n_idx, 0);
        for (int64_t t = 0; t < T; t++) {
            memcpy(idx + t * n_idx, q->win_idx + t * q->n_win, sizeof(int32_t) * (size_t)q->n_win);
            if (cidx) memcpy(idx + t * n_idx + q->n_win, cidx + t * kc, sizeof(int32_t) * (size_t)kc);
            /* backend gather: the columns are written in backend memory (attention) */
        }
        sa[i].idx = idx, sa[i].n_idx = n_idx;
    }
    return DI_OK;
}

/* DSpark draft block (§4.9; a pass of one sequence): the T draft tokens' own KV (not cached) after
 * the stage window rows the caller gathered in slot order; every draft query sees all of them
 * (bidirectional in the block).  u bf16 [T, D];  s: cmp = the draft KV bf16 [T, hd], idx int32
 * [T, n_draft_win + T] (host) */
static int dspark_kv(fwd_ctx *c, int L, const uint16_t *u, seq_attn *s) {
    const di_config *cfg = c->cfg;
    const di_layer_w *w = &c->m->w.layers[L];
    const di_backend *be = c->be;
    int64_t T = c->T, D = cfg->hidden_size, hd = cfg->head_dim, nw = c->n_draft_win;
    if (c->n_seq != 1)
        return di_error_set(c->err, DI_ERR_INTERNAL, "layer %d: a DSpark draft pass over %d sequences", L, c->n_seq);
    uint16_t *kv; /* bf16 [T, hd] */
    int32_t *idx; /* int32 [T, nw + T] (host) */
    ALLOC(kv, T * hd, 0);
    HALLOC(idx, T * (nw + T), 0);
    CK(be->linear_fp8(be, u, T, D, w->wkv.w, w->wkv.s, hd, kv, c->err));
    CK(be->rmsnorm(be, kv, T, hd, w->kv_norm, (float)cfg->rms_norm_eps, kv, c->err));
    CK(be->rope(be, kv, T, 1, (int)hd, cfg->qk_rope_head_dim, c->pos, c->rope_freqs[cfg->layer[L].rope], false,
                c->err));
    CK(be->qdq_fp8(be, kv, T, hd, 32, c->err));
    DUMP("attn.kv", DI_BF16, kv, 2, T, hd, 0);
    bool blind = c->opts->faults.window_no_history; /* mutation: the drafts ignore the main model's window */
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < nw + T; j++) idx[t * (nw + T) + j] = blind && j < nw ? -1 : (int32_t)j;
    s->win = (uint16_t *)c->draft_win, s->n_kw = nw, s->cmp = kv, s->n_cmp = T, s->idx = idx, s->n_idx = nw + T;
    return DI_OK;
}

/* The sparse attention of every sequence of the pass in one call (be->sparse_attn_seqs): each query row
 * with its sequence's key set and index lists, as one sparse_attn per sequence would.
 *   q bf16 [T, H, hd];  idx_d int32 [Σ T_i·n_idx_i] (backend, sequence after sequence);  o bf16 [T, H, hd] */
static int attend_seqs(fwd_ctx *c, const uint16_t *q, int H, int64_t hd, const seq_attn *sa, const int32_t *idx_d,
                       const float *sink, uint16_t *o) {
    di_attn_seq *ds_h, *ds; /* [n_seq] (host, backend) */
    int32_t *seq_h, *seq;   /* int32 [T] sequence of each query row (host, backend) */
    HALLOC(ds_h, c->n_seq, 0);
    HALLOC(seq_h, c->T, 0);
    for (int64_t i = 0, off = 0; i < c->n_seq; off += c->seq[i].ck.T * sa[i].n_idx, i++) {
        const fwd_seq *s = &c->seq[i];
        ds_h[i] = (di_attn_seq){.kv_win = sa[i].win, .n_win = sa[i].n_kw, .kv_cmp = sa[i].cmp, .n_cmp = sa[i].n_cmp,
                                .idx = idx_d + off, .n_idx = sa[i].n_idx, .q0 = s->r0, .m = s->ck.T};
        for (int64_t t = 0; t < s->ck.T; t++) seq_h[s->r0 + t] = (int32_t)i;
    }
    UPLOAD(ds, ds_h, c->n_seq, 0);
    UPLOAD(seq, seq_h, c->T, 0);
    return c->be->sparse_attn_seqs(c->be, q, c->T, H, (int)hd, ds, c->n_seq, seq, sink, (float)pow((double)hd, -0.5),
                                   o, c->err);
}

/* ---------------- the backend's side lane (backend.h side_begin) ----------------
 * Two places in a block hand the backend work that may run beside the rest: the query's up-projection
 * (beside the key sets and the index selection) and the shared expert (beside the router and the routed
 * experts). Each reads what the main lane only reads and writes buffers of its own, and the main lane
 * joins it before anything reads them, so the values are those of issue order. A backend without the
 * slots runs everything in order.
 *
 * Which lanes a pass opens (bench/NOTES-gpu.md, session 22: the H200, full-size layers at B 1 / 2 / 8 / 64 /
 * 256 and the 8K prefill, each form against one lane in the same call):
 *   - op by op, both lanes win at every size (the side lane's launches fill the main lane's gaps):
 *     2-10 % per layer at B 1-256, 0.5 % on the prefill;
 *   - in a recorded graph the attention's lane loses at every size (the up-projection's CTAs delay the
 *     main lane's short kernels, which the graph already runs back to back), and the MoE's loses at one
 *     row (moe_routed fills the GPU by itself) and wins 3-6 % from 8 rows.
 * So a pass that may be recorded (an arena with graphs on, at most FWD_GRAPH_MAX_T rows) opens the MoE's
 * lane from 8 rows and nothing else; every other pass opens both. Not understood: once passes of the
 * process have run lanes, its passes of 1-2 rows take ~3 % longer, recorded or not, even without a lane
 * of their own (B 8 with lanes, then B 1 without: 0.439 against 0.422 ms graph-timed, 0.502 against 0.489
 * op by op); a bare fork, a kernel on the side stream or its workspace alone do not do it.
 * DI_CUDA_SIDE=0 (backend_cuda.cu) keeps every op on one stream. */
enum { SIDE_ATTN, SIDE_MOE, SIDE_MOE_GRAPH_MIN_T = 8 };
static bool side_lane(const fwd_ctx *c, int site) {
    if (!fwd_arena_graphs_on(c) || c->T > FWD_GRAPH_MAX_T) return true;
    return site == SIDE_MOE && c->T >= SIDE_MOE_GRAPH_MIN_T;
}
/* one lane call where the pass opens the lane (lane) and the backend has the slot; rc: the result so far.
 * The call runs whatever rc is (the backend's lane state must come back to the start) and the first
 * failure is the one reported. */
static int side_call(fwd_ctx *c, bool lane, int (*slot)(const di_backend *, di_error *), int rc) {
    if (!lane || !slot) return rc;
    di_error spare;
    int r = slot(c->be, rc == DI_OK ? c->err : &spare);
    return rc == DI_OK ? r : rc;
}

/* q = RoPE(wq_b · qa): bf16 [T, H, hd] from the normed qa bf16 [T, qr] */
static int query_up(fwd_ctx *c, int L, const uint16_t *qa, uint16_t *q) {
    const di_config *cfg = c->cfg;
    const di_layer_w *w = &c->m->w.layers[L];
    int64_t hd = cfg->head_dim;
    int H = cfg->num_attention_heads;
    CK(c->be->linear_fp8(c->be, qa, c->T, cfg->q_lora_rank, w->wq_b.w, w->wq_b.s, H * hd, q, c->err));
    return c->be->rope(c->be, q, c->T, H, (int)hd, cfg->qk_rope_head_dim, c->pos, c->rope_freqs[cfg->layer[L].rope],
                       false, c->err);
}

/* each sequence's key set and index lists (sa[i].idx, n_idx) */
static int key_sets(fwd_ctx *c, int L, const uint16_t *u, const uint16_t *qa, seq_attn *sa) {
    const di_layer_cfg *lc = &c->cfg->layer[L];
    if (lc->is_dspark) return dspark_kv(c, L, u, &sa[0]);
    CK(window_kv(c, L, u, sa));
    if (lc->compress_ratio > 0) return attn_compressed(c, L, u, qa, sa);
    for (int i = 0; i < c->n_seq; i++) sa[i].idx = c->seq[i].win_idx, sa[i].n_idx = c->seq[i].n_win;
    return DI_OK;
}

/* Attention sub-layer: u bf16 [T, D] (normed collapse) → y bf16 [T, D]. Projections over all rows;
 * key sets and index lists per sequence; the sparse attention of every sequence on its rows, in one
 * call where the backend offers sparse_attn_seqs. */
static int attention(fwd_ctx *c, int L, const uint16_t *u, uint16_t *y) {
    const di_config *cfg = c->cfg;
    const di_layer_cfg *lc = &cfg->layer[L];
    const di_layer_w *w = &c->m->w.layers[L];
    const di_backend *be = c->be;
    int64_t T = c->T, D = cfg->hidden_size, hd = cfg->head_dim, qrk = cfg->q_lora_rank;
    int H = cfg->num_attention_heads, rd = cfg->qk_rope_head_dim, kind = lc->rope;
    int G = cfg->o_groups;
    int64_t orr = cfg->o_lora_rank;
    float eps = (float)cfg->rms_norm_eps;

    /* query: wq_a → q_norm → wq_b → RoPE (no per-head norm in V4.1) */
    uint16_t *qa, *q; /* bf16 [T, qr], bf16 [T, H, hd] */
    ALLOC(qa, T * qrk, 0);
    ALLOC(q, T * H * hd, 0);
    CK(be->linear_fp8(be, u, T, D, w->wq_a.w, w->wq_a.s, qrk, qa, c->err));
    CK(be->rmsnorm(be, qa, T, qrk, w->q_norm, eps, qa, c->err));
    DUMP("attn.qr", DI_BF16, qa, 2, T, qrk, 0);

    /* the query's up-projection on the side lane, beside the key sets and index lists ([window rows ‖
     * compressed entries], the reference's order), which read qa and u too and never q */
    seq_attn *sa; /* [n_seq] (host) */
    HALLOC(sa, c->n_seq, 0);
    const bool lane = side_lane(c, SIDE_ATTN);
    int rc = side_call(c, lane, be->side_begin, DI_OK);
    if (rc == DI_OK) rc = query_up(c, L, qa, q);
    rc = side_call(c, lane, be->side_end, rc);
    if (rc == DI_OK) rc = key_sets(c, L, u, qa, sa);
    CK(side_call(c, lane, be->side_join, rc));
    DUMP("attn.q", DI_BF16, q, 3, T, H, hd);

    const float *sink = w->attn_sink; /* f32 [H] */
    if (c->opts->faults.no_sink) {
        float *ninf;
        ALLOC(ninf, H, 0);
        CK(be->fill_f32(be, ninf, H, -INFINITY, c->err));
        sink = ninf;
    }
    /* every sequence's index lists back to back, one upload for the pass */
    int64_t n_all = 0;
    for (int i = 0; i < c->n_seq; i++) n_all += c->seq[i].ck.T * sa[i].n_idx;
    int32_t *idx_h, *idx_d; /* int32 [Σ T_i·n_idx_i] (host, backend) */
    HALLOC(idx_h, n_all, 0);
    for (int64_t i = 0, off = 0; i < c->n_seq; off += c->seq[i].ck.T * sa[i].n_idx, i++)
        memcpy(idx_h + off, sa[i].idx, sizeof(int32_t) * (size_t)(c->seq[i].ck.T * sa[i].n_idx));
    UPLOAD(idx_d, idx_h, n_all, 0);
    bool sliced = false;
    for (int i = 0; i < c->n_seq; i++) sliced |= sa[i].top_dev && c->seq[i].ck.T > sa[i].per;
    uint16_t *o; /* bf16 [T, H, hd] */
    ALLOC(o, T * H * hd, 0);
    if (sliced) {
        CK(attend_sliced(c, q, H, hd, sa, idx_d, sink, o));
    } else {
        CK(gather_on_backend(c, sa, idx_d));
        if (be->sparse_attn_seqs && c->n_seq > 1) {
            CK(attend_seqs(c, q, H, hd, sa, idx_d, sink, o));
        } else {
            for (int64_t i = 0, off = 0; i < c->n_seq; off += c->seq[i].ck.T * sa[i].n_idx, i++) {
                const fwd_seq *s = &c->seq[i];
                CK(be->sparse_attn(be, q + s->r0 * H * hd, s->ck.T, H, (int)hd, sa[i].win, sa[i].n_kw, sa[i].cmp,
                                   sa[i].n_cmp, sink, idx_d + off, sa[i].n_idx, (float)pow((double)hd, -0.5),
                                   o + s->r0 * H * hd, c->err));
            }
        }
    }
    CK(be->rope(be, o, T, H, (int)hd, rd, c->pos, c->rope_freqs[kind], true, c->err));
    DUMP("attn.o", DI_BF16, o, 3, T, H, hd);

    /* grouped low-rank output: wo_a per group of H/G heads (bf16), then wo_b (FP8) */
    uint16_t *og; /* bf16 [T, G, orr] */
    ALLOC(og, T * G * orr, 0);
    CK(be->linear_grouped_bf16(be, o, T, G, H * hd / G, w->wo_a, orr, og, c->err));
    CK(be->linear_fp8(be, og, T, G * orr, w->wo_b.w, w->wo_b.s, D, y, c->err));
    DUMP("attn.out", DI_BF16, y, 2, T, D, 0);
    return DI_OK;
}

/* ---------------- MoE sub-layer (§3.7, §4.5) ---------------- */

/* Steps of at most this many rows (decode, DSpark verify) dispatch the routed experts on the backend
 * (moe_routed: no router ids come back to the host); larger ones (prefill) plan the per-expert GEMMs
 * on the host, where the rows per expert make a GEMM worth its setup, and hand the plan to the backend's
 * moe_grouped (all experts in a few launches, one ordered combine) or, without it, run the per-expert
 * loop of ops. All three compute the same values. */
#define MOE_ROUTED_MAX_T 256

/* The routed experts of v bf16 [T, D] summed into acc f32 [T, D] (every token's in ascending expert id);
 * *rows: int32 backend memory whose entries [*n_all, *n_all + T) are 0 … T−1, the shared expert's rows. */
static int routed(fwd_ctx *c, int L, const uint16_t *v, float *acc, int32_t **rows_out, int64_t *n_all_out) {
    const di_config *cfg = c->cfg;
    const di_layer_cfg *lc = &cfg->layer[L];
    const di_layer_w *w = &c->m->w.layers[L];
    const di_backend *be = c->be;
    int64_t T = c->T, D = cfg->hidden_size, I = cfg->moe_intermediate_size;
    int E = lc->n_experts, K = lc->n_active_experts;
    float lim = (float)cfg->swiglu_limit;

    float *logits, *rw; /* f32 [T, E], f32 [T, K] */
    int32_t *ids;       /* int32 [T, K] */
    int32_t *rows;      /* int32 [T·K + T] per-expert row lists, then 0…T−1 (the shared expert) */
    int64_t n_all = 0;  /* routed rows in `rows` before the shared expert's */
    ALLOC(logits, T * E, 0);
    ALLOC(rw, T * K, 0);
    ALLOC(ids, T * K, 0);
    CK(be->linear_f32(be, v, T, D, w->gate_w, E, logits, c->err));
    CK(be->router(be, logits, T, E, w->gate_bias, (float)cfg->gate_temp, K, cfg->norm_topk_prob,
                  (float)cfg->routed_scaling_factor, ids, rw, c->err));
    DUMP("ffn.route_ids", DI_I32, ids, 2, T, K, 0);
    DUMP("ffn.route_w", DI_F32, rw, 2, T, K, 0);
    if (be->moe_routed && T <= MOE_ROUTED_MAX_T && T * K <= DI_MOE_ROUTED_MAX_PAIRS && E <= DI_MOE_ROUTED_MAX_EXPERTS) {
        di_moe_expert *tab; /* [E] the experts' backend pointers (host) */
        int32_t *rows_h;    /* int32 [T] 0…T−1 (host) */
        HALLOC(tab, E, 0);
        HALLOC(rows_h, T, 0);
        for (int e = 0; e < E; e++) {
            const di_expert_w *ex = &w->experts[e];
            tab[e] = (di_moe_expert){ex->w1.w, ex->w1.s, ex->w3.w, ex->w3.s, ex->w2.w, ex->w2.s};
        }
        for (int64_t t = 0; t < T; t++) rows_h[t] = (int32_t)t;
        UPLOAD(rows, rows_h, T, 0);
        CK(be->moe_routed(be, v, T, D, I, ids, rw, K, E, tab, lim, acc, c->err));
    } else {
        int32_t *ids_h, *rows_h, *rank_h; /* int32 [T, K] router ids; [T·K + T] row lists; [T, K] row of each pair (host) */
        float *rw_h, *roww_h;             /* f32 [T, K] routing weights; f32 [T·K] weight of each listed row (host) */
        int64_t *start;                   /* int64 [E + 1] expert e's rows are rows_h[start[e] … start[e+1]) (host) */
        float *roww;                      /* f32 [T·K] */
        HALLOC(ids_h, T * K, 0);
        HALLOC(rw_h, T * K, 0);
        HALLOC(rows_h, T * K + T, 0);
        HALLOC(roww_h, T * K, 0);
        HALLOC(rank_h, T * K, 0);
        HALLOC(start, E + 1, 0);
        /* Expert dispatch planned on the host from the router's choice: one download (a
         * synchronisation point) per MoE layer; the per-expert GEMMs dominate at these sizes. */
        CK(fwd_download(c, ids_h, ids, sizeof(int32_t) * (size_t)(T * K)));
        CK(fwd_download(c, rw_h, rw, sizeof(float) * (size_t)(T * K)));
        /* counting sort of the pairs i = t·K + j by expert, i ascending within an expert: the experts'
         * rows in ascending id, each expert's in ascending (token, slot); ids outside [0, E) are dropped */
        for (int64_t i = 0; i < T * K; i++)
            if (ids_h[i] >= 0 && ids_h[i] < E) start[ids_h[i] + 1]++;
        for (int e = 0; e < E; e++) start[e + 1] += start[e];
        n_all = start[E];
        for (int64_t i = 0; i < T * K; i++) {
            int e = ids_h[i];
            rank_h[i] = -1;
            if (e < 0 || e >= E) continue;
            int64_t r = start[e]++;
            rows_h[r] = (int32_t)(i / K), roww_h[r] = rw_h[i], rank_h[i] = (int32_t)r;
        }
        for (int e = E; e > 0; e--) start[e] = start[e - 1]; /* the sort advanced start[e] to expert e's end */
        start[0] = 0;
        for (int64_t t = 0; t < T; t++) rows_h[n_all + t] = (int32_t)t; /* the shared expert: every row */
        UPLOAD(rows, rows_h, n_all + T, 0);
        UPLOAD(roww, roww_h, n_all > 0 ? n_all : 1, 0);
        if (be->moe_grouped) { /* every expert at once (backend.h), the same values */
            di_moe_expert *tab; /* [E] the experts' backend pointers (host) */
            int32_t *rank;      /* int32 [T, K] */
            int64_t *start_d;   /* int64 [E + 1] */
            uint8_t *ws;        /* di_moe_grouped_ws_bytes(n_all, D, I) bytes */
            HALLOC(tab, E, 0);
            for (int e = 0; e < E; e++) {
                const di_expert_w *ex = &w->experts[e];
                tab[e] = (di_moe_expert){ex->w1.w, ex->w1.s, ex->w3.w, ex->w3.s, ex->w2.w, ex->w2.s};
            }
            UPLOAD(rank, rank_h, T * K, 0);
            UPLOAD(start_d, start, E + 1, 0);
            ALLOC(ws, di_moe_grouped_ws_bytes(n_all, D, I), 0);
            const di_moe_plan plan = {n_all, start, start_d, rows, roww, rank};
            CK(be->moe_grouped(be, v, T, D, I, K, E, tab, &plan, lim, acc, ws, c->err));
        } else {
            uint16_t *xg, *g, *u, *a, *ye; /* bf16 [T, D], [T, I] ×3, [T, D]: a busiest expert's rows at most */
            ALLOC(xg, T * D, 0);
            ALLOC(g, T * I, 0);
            ALLOC(u, T * I, 0);
            ALLOC(a, T * I, 0);
            ALLOC(ye, T * D, 0);
            CK(be->fill_f32(be, acc, T * D, 0.0f, c->err));
            for (int e = 0; e < E; e++) {
                int64_t n = start[e + 1] - start[e];
                if (!n) continue;
                const di_expert_w *ex = &w->experts[e];
                CK(be->gather_rows(be, v, D, rows + start[e], n, xg, c->err));
                CK(be->linear_fp4(be, xg, n, D, ex->w1.w, ex->w1.s, I, g, c->err));
                CK(be->linear_fp4(be, xg, n, D, ex->w3.w, ex->w3.s, I, u, c->err));
                CK(be->swiglu(be, g, u, n, I, roww + start[e], lim, a, c->err));
                CK(be->linear_fp4(be, a, n, I, ex->w2.w, ex->w2.s, D, ye, c->err));
                CK(be->scatter_add_rows(be, ye, D, rows + start[e], n, acc, c->err));
            }
        }
    }
    *rows_out = rows, *n_all_out = n_all;
    return DI_OK;
}

/* the shared expert of v bf16 [T, D]: ye bf16 [T, D] through g, u, a bf16 [T, I] */
static int shared_expert(fwd_ctx *c, int L, const uint16_t *v, uint16_t *g, uint16_t *u, uint16_t *a, uint16_t *ye) {
    const di_config *cfg = c->cfg;
    const di_layer_w *w = &c->m->w.layers[L];
    const di_backend *be = c->be;
    int64_t T = c->T, D = cfg->hidden_size, I = cfg->moe_intermediate_size;
    CK(be->linear_fp8(be, v, T, D, w->sh_w1.w, w->sh_w1.s, I, g, c->err));
    CK(be->linear_fp8(be, v, T, D, w->sh_w3.w, w->sh_w3.s, I, u, c->err));
    CK(be->swiglu(be, g, u, T, I, NULL, (float)cfg->swiglu_limit, a, c->err));
    return be->linear_fp8(be, a, T, I, w->sh_w2.w, w->sh_w2.s, D, ye, c->err);
}

/* v bf16 [T, D] (normed collapse) → y bf16 [T, D]. Routed experts are applied in ascending id and
 * accumulated in f32 per token, the shared expert last (reference MoE.forward). The shared expert runs
 * on the backend's side lane, beside the router and the routed experts: it reads v as they do and writes
 * buffers of its own, which only the final sum reads, after the join. */
static int moe(fwd_ctx *c, int L, const uint16_t *v, uint16_t *y) {
    const di_backend *be = c->be;
    int64_t T = c->T, D = c->cfg->hidden_size, I = c->cfg->moe_intermediate_size;
    float *acc;               /* f32 [T, D] */
    uint16_t *g, *u, *a, *ye; /* bf16 [T, I], [T, I], [T, I], [T, D] the shared expert's */
    int32_t *rows = NULL;     /* routed(): the shared expert's rows 0…T−1 at n_all */
    int64_t n_all = 0;
    ALLOC(acc, T * D, 0);
    ALLOC(g, T * I, 0);
    ALLOC(u, T * I, 0);
    ALLOC(a, T * I, 0);
    ALLOC(ye, T * D, 0);
    const bool lane = side_lane(c, SIDE_MOE);
    int rc = side_call(c, lane, be->side_begin, DI_OK);
    if (rc == DI_OK) rc = shared_expert(c, L, v, g, u, a, ye);
    rc = side_call(c, lane, be->side_end, rc);
    if (rc == DI_OK) rc = routed(c, L, v, acc, &rows, &n_all);
    CK(side_call(c, lane, be->side_join, rc));
    DUMP("ffn.shared", DI_BF16, ye, 2, T, D, 0);
    CK(be->scatter_add_rows(be, ye, D, rows + n_all, T, acc, c->err));
    CK(be->f32_to_bf16(be, acc, T * D, y, c->err));
    DUMP("ffn.out", DI_BF16, y, 2, T, D, 0);
    return DI_OK;
}

/* ---------------- the block (§4.2: deferred pre-mix) ---------------- */

int fwd_block(fwd_ctx *c, int L, uint16_t *x, const float *pre_in, float *pre_out) {
    const di_config *cfg = c->cfg;
    const di_layer_w *w = &c->m->w.layers[L];
    const di_backend *be = c->be;
    int64_t T = c->T, D = cfg->hidden_size;
    int hc = cfg->hc_mult, nmix = (2 + hc) * hc;
    int iters = c->opts->faults.sinkhorn_iters > 0 ? c->opts->faults.sinkhorn_iters : cfg->hc_sinkhorn_iters;
    float eps = (float)cfg->rms_norm_eps, hc_eps = (float)cfg->hc_eps;
    bool deferred = !c->opts->faults.premix_not_deferred;

    float *mix, *pre_a, *post, *comb; /* f32 [T, nmix], [T, hc], [T, hc], [T, hc, hc] */
    float *post_f, *comb_f;           /* f32 [T, hc], [T, hc, hc] the FFN's (fused path: not the attention's) */
    uint16_t *h, *z;                  /* bf16 [T, D] sub-layer input and output */
    ALLOC(mix, T * nmix, 0);
    ALLOC(pre_a, T * hc, 0);
    ALLOC(post, T * hc, 0);
    ALLOC(comb, T * hc * hc, 0);
    ALLOC(h, T * D, 0);
    ALLOC(z, T * D, 0);
    /* Fused path (be->hc_pre, backend.h): the same ops in the same order, one call per sub-layer; the
     * attention's expand runs inside the FFN's chain. Dumps are taken from its outputs. */
    bool fused = be->hc_pre != NULL;
    if (fused) {
        ALLOC(post_f, T * hc, 0);
        ALLOC(comb_f, T * hc * hc, 0);
    } else {
        post_f = post, comb_f = comb;
    }

    /* attention: mixes from the block input; collapse with the PREVIOUS sub-layer's pre-mix */
    if (fused) {
        CK(be->hc_pre(be, x, NULL, NULL, NULL, T, hc, D, w->hc_attn_fn, eps, w->hc_attn_scale, w->hc_attn_base, iters,
                      hc_eps, deferred ? pre_in : NULL, w->attn_norm, mix, pre_a, post, comb, h, c->err));
    } else {
        CK(be->hc_mixes(be, x, T, hc, D, w->hc_attn_fn, eps, mix, c->err));
        CK(be->hc_sinkhorn(be, mix, T, hc, w->hc_attn_scale, w->hc_attn_base, iters, hc_eps, pre_a, post, comb, c->err));
        CK(be->hc_collapse(be, x, deferred ? pre_in : pre_a, T, hc, D, h, c->err));
        CK(be->rmsnorm(be, h, T, D, w->attn_norm, eps, h, c->err));
    }
    DUMP("attn.pre", DI_F32, pre_a, 2, T, hc, 0);
    DUMP("attn.comb", DI_F32, comb, 3, T, hc, hc);
    DUMP("attn.in", DI_BF16, h, 2, T, D, 0);
    CK(attention(c, L, h, z));

    /* FFN: mixes from the post-attention streams; collapse with the attention's pre-mix */
    if (fused) {
        CK(be->hc_pre(be, x, z, post, comb, T, hc, D, w->hc_ffn_fn, eps, w->hc_ffn_scale, w->hc_ffn_base, iters, hc_eps,
                      deferred ? pre_a : NULL, w->ffn_norm, mix, pre_out, post_f, comb_f, h, c->err));
        DUMP("attn.streams", DI_BF16, x, 3, T, hc, D);
    } else {
        CK(be->hc_expand(be, z, x, post, comb, T, hc, D, x, c->err));
        DUMP("attn.streams", DI_BF16, x, 3, T, hc, D);
        CK(be->hc_mixes(be, x, T, hc, D, w->hc_ffn_fn, eps, mix, c->err));
        CK(be->hc_sinkhorn(be, mix, T, hc, w->hc_ffn_scale, w->hc_ffn_base, iters, hc_eps, pre_out, post, comb, c->err));
        CK(be->hc_collapse(be, x, deferred ? pre_a : pre_out, T, hc, D, h, c->err));
        CK(be->rmsnorm(be, h, T, D, w->ffn_norm, eps, h, c->err));
    }
    DUMP("ffn.pre", DI_F32, pre_out, 2, T, hc, 0);
    DUMP("ffn.in", DI_BF16, h, 2, T, D, 0);
    CK(moe(c, L, h, z));
    CK(be->hc_expand(be, z, x, post_f, comb_f, T, hc, D, x, c->err));
    DUMP("out", DI_BF16, x, 3, T, hc, D);
    return DI_OK;
}
