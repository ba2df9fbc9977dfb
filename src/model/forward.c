/* The pass over a batch of chunks (one per sequence; a single-sequence forward is the batch of one):
 * state setup (rows, positions, RoPE tables, each sequence's window index lists and Engram hashes
 * from its cache's history), the backbone loop with its DSpark features, the head over the packed
 * head rows of every sequence, and the one-shot prefill drivers (free-running and teacher-forced)
 * built on it. The block is in forward_block.c. */
#include "model/forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward_internal.h"
#include "io/formats.h"
#include "util/error.h"

/* ---------------- pass-state allocation ---------------- */

static int push_mem(struct fwd_mem **arr, size_t *n, size_t *cap, void *p, bool host) {
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        struct fwd_mem *na = realloc(*arr, nc * sizeof **arr);
        if (!na) return -1;
        *arr = na, *cap = nc;
    }
    (*arr)[(*n)++] = (struct fwd_mem){p, host};
    return 0;
}

static void mem_release(fwd_ctx *c, struct fwd_mem m) {
    if (m.host)
        free(m.p);
    else
        c->be->mem_free(c->be, m.p);
}

static void *alloc_in(fwd_ctx *c, size_t bytes, int persist, bool host) {
    void *p;
    if (fwd_arena_alloc(c, bytes, persist, host, &p)) return NULL;
    if (p) return p; /* arena bytes are released with the pass (or rewound with the block) */
    p = host ? calloc(1, bytes ? bytes : 1) : c->be->mem_alloc(c->be, bytes ? bytes : 1, c->err);
    if (!p) {
        if (host) di_error_set(c->err, DI_ERR_NOMEM, "forward pass: allocation of %zu bytes", bytes);
        return NULL;
    }
    int bad = persist ? push_mem(&c->keep, &c->n_keep, &c->cap_keep, p, host)
                      : push_mem(&c->tmp, &c->n_tmp, &c->cap_tmp, p, host);
    if (bad) {
        mem_release(c, (struct fwd_mem){p, host});
        di_error_set(c->err, DI_ERR_NOMEM, "forward pass: allocation list");
        return NULL;
    }
    return p;
}

void *fwd_alloc(fwd_ctx *c, size_t bytes, int persist) { return alloc_in(c, bytes, persist, false); }
void *fwd_halloc(fwd_ctx *c, size_t bytes, int persist) { return alloc_in(c, bytes, persist, true); }

void *fwd_upload(fwd_ctx *c, const void *host, size_t bytes, int persist) {
    void *p = fwd_alloc(c, bytes, persist);
    /* from the arena's pinned staging when there is one: an asynchronous copy from a fixed address */
    if (p && c->be->mem_upload(c->be, p, fwd_arena_stage(c, host, bytes), bytes, c->err)) return NULL;
    return p; /* (freed with its list on failure) */
}

int fwd_download(fwd_ctx *c, void *host, const void *src, size_t bytes) {
    int rc = c->be->mem_download(c->be, host, src, bytes, c->err);
    if (!rc) fwd_arena_synced(c);
    return rc;
}

void fwd_free_tmp(fwd_ctx *c) {
    for (size_t i = 0; i < c->n_tmp; i++) mem_release(c, c->tmp[i]);
    c->n_tmp = 0;
    fwd_arena_free_tmp(c);
}

void fwd_ctx_free(fwd_ctx *c) {
    if (!c->be) return; /* never initialised */
    fwd_free_tmp(c);
    fwd_arena_end(c);
    free(c->tmp);
    for (size_t i = 0; i < c->n_keep; i++) mem_release(c, c->keep[i]);
    free(c->keep);
}

void fwd_dump_host(fwd_ctx *c, const char *name, di_dtype dt, const void *data, int ndim, int64_t d0, int64_t d1,
                   int64_t d2) {
    if (!c->opts->dump) return;
    int64_t shape[3] = {d0, d1, d2};
    c->opts->dump(c->opts->dump_ctx, name, dt, ndim, shape, data);
}

void fwd_dump(fwd_ctx *c, const char *name, di_dtype dt, const void *data, int ndim, int64_t d0, int64_t d1,
              int64_t d2) {
    if (!c->opts->dump) return;
    if (c->be->host_memory) {
        fwd_dump_host(c, name, dt, data, ndim, d0, d1, d2);
        return;
    }
    int64_t n = d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1);
    size_t bytes = di_dtype_size(dt) * (size_t)n;
    void *h = malloc(bytes ? bytes : 1);
    di_error ignored; /* a dump is a debugging aid: a failed download skips the stage */
    if (h && !c->be->mem_download(c->be, h, data, bytes, &ignored)) fwd_dump_host(c, name, dt, h, ndim, d0, d1, d2);
    free(h);
}

/* ---------------- RoPE tables ---------------- */

int di_rope_freqs(const di_config *cfg, int layer, float *freqs, di_error *err) {
    const di_layer_cfg *lc = &cfg->layer[layer];
    int dim = cfg->qk_rope_head_dim, half = dim / 2;
    if (dim <= 0 || dim % 2) return di_error_set(err, DI_ERR_INVALID, "rope: rope_head_dim %d", dim);
    float base = (float)lc->rope_base;
    /* f32 like torch: base ** (arange(0, dim, 2) / dim), then 1 / that */
    for (int i = 0; i < half; i++) freqs[i] = 1.0f / powf(base, (float)(2 * i) / (float)dim);
    int64_t orig = cfg->rope_original_max_position_embeddings;
    if (lc->rope_yarn && orig > 0) {
        /* the band edges are Python floats (double); the ramp and the blend are f32 tensor ops */
        double lb = lc->rope_base;
        double cl = dim * log((double)orig / (cfg->rope_beta_fast * 2 * M_PI)) / (2 * log(lb));
        double ch = dim * log((double)orig / (cfg->rope_beta_slow * 2 * M_PI)) / (2 * log(lb));
        double low = floor(cl) > 0 ? floor(cl) : 0, high = ceil(ch) < dim - 1 ? ceil(ch) : dim - 1;
        float span = (float)(high - low > 1e-3 ? high - low : 1e-3);
        float factor = (float)cfg->rope_factor;
        for (int i = 0; i < half; i++) {
            float ramp = ((float)i - (float)low) / span;
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float smooth = 1.0f - ramp;
            freqs[i] = freqs[i] / factor * (1.0f - smooth) + freqs[i] * smooth;
        }
    }
    return DI_OK;
}

/* ---------------- Engram hashing (§4.3) ---------------- */

/* Row ids of T positions from their compressed ids: cid int64 [hist + T] holds the compressed ids of
 * the hist positions before the first one and of the T positions themselves; an id < 0 marks a
 * position before the sequence start, which (like the start itself) blocks that lookback and every
 * further one: those slots take the pad id.  ids int64 [T, (max_ngram−1)·n_heads] */
static void engram_hash_cids(const di_engram_consts *eg, int e, const int64_t *cid, int64_t hist, int64_t T,
                             int64_t *ids) {
    int ng = eg->max_ngram, nh = eg->n_heads, cols = (ng - 1) * nh;
    const int64_t *mul = eg->multipliers + (int64_t)e * ng;
    const int64_t *off = eg->offsets + (int64_t)e * cols;
    for (int64_t p = 0; p < T; p++) {
        int64_t roll = 0;
        bool blocked = false;
        for (int s = 0; s < ng; s++) {
            int64_t j = hist + p - s;
            blocked = blocked || j < 0 || cid[j] < 0;
            int64_t tok = blocked ? eg->pad_compressed_id : cid[j];
            int64_t prod = tok * mul[s]; /* bounded by construction: no int64 overflow */
            roll = s == 0 ? prod : (roll ^ prod);
            if (s == 0) continue;
            for (int h = 0; h < nh; h++) {
                int64_t P = di_engram_prime(eg, e, s - 1, h);
                int64_t r = roll % P;
                if (r < 0) r += P; /* torch's % follows the divisor's sign */
                ids[p * cols + (s - 1) * nh + h] = r + off[(s - 1) * nh + h];
            }
        }
    }
}

/* Compressed id of a token, checked against the map. */
static int engram_cid(const di_engram_consts *eg, int32_t id, int64_t pos, int64_t *out, di_error *err) {
    if (id < 0 || id >= eg->token_map_len)
        return di_error_set(err, DI_ERR_INVALID, "engram hash: token id %d at position %lld outside the map (%lld)", id,
                            (long long)pos, (long long)eg->token_map_len);
    *out = eg->token_map[id];
    return DI_OK;
}

int di_engram_hash(const di_model *m, int e, const int32_t *tokens, int64_t T, int64_t *ids, di_error *err) {
    const di_engram_consts *eg = &m->eg;
    if (e < 0 || e >= eg->n_layers) return di_error_set(err, DI_ERR_INVALID, "engram hash: layer slot %d", e);
    if (!eg->token_map) return di_error_set(err, DI_ERR_UNSUPPORTED, "engram hash: no compressed-token map loaded");
    int64_t *cid = malloc(sizeof(int64_t) * (size_t)(T > 0 ? T : 1)); /* int64 [T] */
    if (!cid) return di_error_set(err, DI_ERR_NOMEM, "engram hash: %lld ids", (long long)T);
    int rc = DI_OK;
    for (int64_t p = 0; p < T && !rc; p++) rc = engram_cid(eg, tokens[p], p, &cid[p], err);
    if (!rc) engram_hash_cids(eg, e, cid, 0, T, ids);
    free(cid);
    return rc;
}

/* ---------------- outputs ---------------- */

void di_prefill_out_free(di_prefill_out *o) {
    if (!o) return;
    for (int L = 0; L < o->n_layers; L++) {
        if (o->layer_out) free(o->layer_out[L]);
        if (o->premix) free(o->premix[L]);
        if (o->index_scores) free(o->index_scores[L]);
        if (o->topk) free(o->topk[L]);
    }
    free(o->layer_out), free(o->premix), free(o->index_scores), free(o->topk), free(o->topk_k), free(o->n_keys);
    free(o->logits);
    memset(o, 0, sizeof *o);
}

static int out_init(const di_config *cfg, int64_t T, di_prefill_out *o, di_error *err) {
    memset(o, 0, sizeof *o);
    int n = cfg->n_layers;
    o->T = T, o->n_layers = n, o->vocab = cfg->vocab_size;
    o->layer_out = calloc((size_t)n, sizeof *o->layer_out);
    o->premix = calloc((size_t)n, sizeof *o->premix);
    o->index_scores = calloc((size_t)n, sizeof *o->index_scores);
    o->topk = calloc((size_t)n, sizeof *o->topk);
    o->topk_k = calloc((size_t)n, sizeof *o->topk_k);
    o->n_keys = calloc((size_t)n, sizeof *o->n_keys);
    if (!o->layer_out || !o->premix || !o->index_scores || !o->topk || !o->topk_k || !o->n_keys) {
        di_prefill_out_free(o);
        return di_error_set(err, DI_ERR_NOMEM, "prefill outputs");
    }
    return DI_OK;
}

/* ---------------- pass setup ---------------- */

#define CK(call)             \
    do {                     \
        rc = (call);         \
        if (rc) goto done;   \
    } while (0)

/* Window index lists of one sequence (§5.3). Rows of its key set are positions win_base … s0+T−1.
 * The reference has two layouts, and a row gets the one of the computation it stands for (the
 * layout matters through the 64-index blocking of the attention kernel: where the window part ends,
 * the compressed part begins):
 *   - a prompt row (position p < prompt_end; every row when prompt_end = 0, except a one-token chunk
 *     after position 0, which is a decode step) lists its window ascending, −1 AFTER p,
 *     min(W, prompt end) entries: the one-shot prefill's layout, whatever chunk the row is in;
 *   - a row past the prompt (p ≥ prompt_end > 0) lists the decode step's ring oldest first, W entries,
 *     entry j = position p−W+1+j, positions before the sequence start as −1 FIRST: a DSpark verify
 *     block or a recomputed output gets the decode step's list.
 * One stride serves the whole chunk: a chunk that crosses the prompt's end before position W−1 lists
 * its prompt rows W wide (−1 padded), which moves their compressed part (inexact for those rows; the
 * scheduler never runs such a chunk, scheduler.h). */
static int window_lists(fwd_ctx *c, fwd_seq *q) {
    int64_t W = c->cfg->sliding_window, s0 = q->ck.s0, T = q->ck.T;
    int64_t floor = q->ck.window_floor;
    q->win_base = s0 - W + 1 > 0 ? s0 - W + 1 : 0;
    if (q->win_base < floor) q->win_base = floor > s0 ? s0 : floor; /* rows below the floor are never read */
    q->n_win_rows = s0 + T - q->win_base;
    const int64_t pe = q->ck.prompt_end;
    const int64_t prompt = pe > 0 ? (pe > s0 + T ? pe : s0 + T) : s0 + T; /* the one-shot prefill's length */
    const int64_t gen0 = pe > 0 ? pe : (T == 1 && s0 > 0 ? s0 : s0 + T); /* first row past the prompt */
    q->n_win = gen0 < s0 + T ? W : (prompt < W ? prompt : W);
    if (!(q->win_idx = fwd_halloc(c, sizeof(int32_t) * (size_t)(T * q->n_win), 1))) return c->err->code;
    for (int64_t t = 0; t < T; t++) {
        int64_t p = s0 + t, first = p >= gen0 ? p - W + 1 : (p - W + 1 > 0 ? p - W + 1 : 0);
        for (int64_t j = 0; j < q->n_win; j++) {
            int64_t k = first + j;
            bool hide = k < 0 || k > p || k < floor || (c->opts->faults.window_no_history && k < s0);
            q->win_idx[t * q->n_win + j] = hide ? -1 : (int32_t)(k - q->win_base);
        }
    }
    return DI_OK;
}

/* Engram hashes of every row: each sequence's history of previous positions comes from its cache. */
static int engram_hashes(fwd_ctx *c) {
    const di_config *cfg = c->cfg;
    const di_engram_consts *eg = &c->m->eg;
    int ne = cfg->n_engram_layers, cols = (cfg->engram_max_ngram_size - 1) * cfg->engram_n_heads;
    if (ne <= 0) return DI_OK;
    if (!eg->token_map) return di_error_set(c->err, DI_ERR_UNSUPPORTED, "engram: no compressed-token map loaded");
    int64_t hist = cfg->engram_max_ngram_size - 1, T = c->T, Tmax = 0;
    for (int i = 0; i < c->n_seq; i++) Tmax = c->seq[i].ck.T > Tmax ? c->seq[i].ck.T : Tmax;
    int64_t *cid = fwd_halloc(c, sizeof(int64_t) * (size_t)(hist + Tmax), 0); /* int64 [hist + T_i] */
    int32_t *h = fwd_halloc(c, sizeof(int32_t) * (size_t)(hist + 1), 0);       /* int32 [hist] lookback order */
    int64_t *ids_h = fwd_halloc(c, sizeof(int64_t) * (size_t)(T * cols * ne), 0); /* int64 [ne, T, cols] */
    if (!cid || !h || !ids_h || !(c->eg_ids = fwd_halloc(c, sizeof(int64_t *) * (size_t)ne, 1))) return c->err->code;
    bool forget = c->opts->faults.engram_no_history;
    for (int i = 0; i < c->n_seq; i++) {
        const fwd_seq *q = &c->seq[i];
        if (hist > 0) {
            int rc = di_cache_engram_history(q->ck.cache, q->ck.s0, h, c->err);
            if (rc) return rc;
        }
        for (int64_t k = 0; k < hist; k++) cid[hist - 1 - k] = h[k] < 0 || forget ? -1 : h[k]; /* NONE: before the start */
        for (int64_t t = 0; t < q->ck.T; t++) {
            int rc = engram_cid(eg, q->ck.ids[t], q->ck.s0 + t, &cid[hist + t], c->err);
            if (rc) return rc;
        }
        for (int e = 0; e < ne; e++) engram_hash_cids(eg, e, cid, hist, q->ck.T, ids_h + (e * T + q->r0) * cols);
    }
    for (int e = 0; e < ne; e++)
        if (!(c->eg_ids[e] = fwd_upload(c, ids_h + e * T * cols, sizeof(int64_t) * (size_t)(T * cols), 1)))
            return c->err->code;
    fwd_free_tmp(c);
    return DI_OK;
}

int fwd_ctx_init(fwd_ctx *c, const di_model *m, const di_backend *be, const fwd_chunk *chunks, int n,
                 const di_fwd_opts *opts, di_error *err) {
    static const di_fwd_opts no_opts;
    const di_config *cfg = &m->cfg;
    memset(c, 0, sizeof *c);
    c->m = m, c->cfg = cfg, c->be = be, c->opts = opts ? opts : &no_opts, c->err = err;
    if (n < 1) return di_error_set(err, DI_ERR_INVALID, "forward: no sequence in the batch");
    int arc = fwd_arena_begin(c);
    if (arc) return arc;
    fwd_arena_key(c, (uint64_t)n);
    for (int i = 0; i < n; i++) fwd_arena_key(c, (uint64_t)chunks[i].T);
    if (!(c->seq = fwd_halloc(c, sizeof *c->seq * (size_t)n, 1))) return err->code;
    c->n_seq = n;
    bool with_ids = chunks[0].ids != NULL;
    for (int i = 0; i < n; i++) {
        const fwd_chunk *k = &chunks[i];
        if (k->T <= 0) return di_error_set(err, DI_ERR_INVALID, "forward: sequence %d of the batch: empty chunk", i);
        if (!k->cache) return di_error_set(err, DI_ERR_INVALID, "forward: sequence %d of the batch: no cache", i);
        if ((k->ids != NULL) != with_ids)
            return di_error_set(err, DI_ERR_INVALID, "forward: sequence %d of the batch: ids given for some chunks only", i);
        /* a prompt longer than the model's context would size the score rows beyond any real pass */
        if (k->prompt_end < 0 || (cfg->max_position_embeddings > 0 && k->prompt_end > cfg->max_position_embeddings))
            return di_error_set(err, DI_ERR_INVALID,
                                "forward: sequence %d of the batch: prompt end %lld outside [0, %lld] (the model's context)",
                                i, (long long)k->prompt_end, (long long)cfg->max_position_embeddings);
        for (int j = 0; j < i; j++)
            if (chunks[j].cache == k->cache)
                return di_error_set(err, DI_ERR_INVALID, "forward: sequences %d and %d of the batch share one cache", j, i);
        for (int64_t t = 0; k->ids && t < k->T; t++)
            if (k->ids[t] < 0 || k->ids[t] >= cfg->vocab_size)
                return di_error_set(err, DI_ERR_INVALID,
                                    "forward: sequence %d of the batch: token %d at position %lld outside the vocabulary (%d)",
                                    i, k->ids[t], (long long)(k->s0 + t), cfg->vocab_size);
        c->seq[i].ck = *k;
        c->seq[i].r0 = c->T;
        c->T += k->T;
    }
    for (int L = 0; L < cfg->n_stages; L++) {
        int R = cfg->layer[L].compress_ratio;
        if (R > 2) return di_error_set(err, DI_ERR_UNSUPPORTED, "layer %d: compress ratio %d (V4.1 uses 0, 1, 2)", L, R);
    }
    int64_t T = c->T;
    int half = cfg->qk_rope_head_dim / 2;
    int64_t *pos = fwd_halloc(c, sizeof(int64_t) * (size_t)T, 0); /* int64 [T] */
    if (!pos) return err->code;
    if (with_ids && !(c->ids = fwd_halloc(c, sizeof(int32_t) * (size_t)T, 1))) return err->code;
    for (int i = 0; i < n; i++) {
        const fwd_seq *q = &c->seq[i];
        for (int64_t t = 0; t < q->ck.T; t++) pos[q->r0 + t] = q->ck.s0 + t;
        if (with_ids) memcpy(c->ids + q->r0, q->ck.ids, sizeof(int32_t) * (size_t)q->ck.T);
    }
    if (!(c->pos = fwd_upload(c, pos, sizeof(int64_t) * (size_t)T, 1))) return err->code;
    /* one frequency table per rope kind, from the first stage of that kind */
    for (int L = 0; L < cfg->n_stages; L++) {
        int k = cfg->layer[L].rope;
        if (c->rope_freqs[k]) continue;
        float *f = fwd_halloc(c, sizeof(float) * (size_t)(half > 0 ? half : 1), 0); /* f32 [rd/2] */
        if (!f) return err->code;
        int rc = di_rope_freqs(cfg, L, f, err);
        if (rc) return rc;
        if (!(c->rope_freqs[k] = fwd_upload(c, f, sizeof(float) * (size_t)(half > 0 ? half : 1), 1))) return err->code;
    }
    int rc = DI_OK;
    for (int i = 0; i < n && !rc; i++) {
        fwd_seq *q = &c->seq[i];
        if (!(q->pub = fwd_halloc(c, sizeof *q->pub * (size_t)(cfg->n_stages > 0 ? cfg->n_stages : 1), 1)))
            return err->code;
        rc = window_lists(c, q);
    }
    if (!rc && with_ids) rc = engram_hashes(c); /* for the whole chunk first, as the reference does */
    fwd_free_tmp(c);
    return rc;
}

int fwd_ctx_init1(fwd_ctx *c, const di_model *m, const di_backend *be, di_cache *cache, int64_t s0,
                  const int32_t *ids, int64_t T, const di_fwd_opts *opts, di_error *err) {
    fwd_chunk k = {.cache = cache, .s0 = s0, .T = T, .ids = ids, .window_floor = opts ? opts->window_floor : 0,
                   .prompt_end = opts ? opts->prompt_end : 0};
    return fwd_ctx_init(c, m, be, &k, 1, opts, err);
}

/* ---------------- the backbone over the pass ---------------- */

int fwd_embed_streams(fwd_ctx *c, const int32_t *ids, uint16_t *x, float *pre) {
    const di_config *cfg = c->cfg;
    int64_t T = c->T, D = cfg->hidden_size;
    int hc = cfg->hc_mult;
    uint16_t *e = fwd_alloc(c, sizeof(uint16_t) * (size_t)(T * D), 0);       /* bf16 [T, D] */
    int32_t *rows = fwd_halloc(c, sizeof(int32_t) * (size_t)(T * hc), 0);     /* int32 [T·hc] source row t */
    float *pre_h = fwd_halloc(c, sizeof(float) * (size_t)(T * hc), 0);        /* f32 [T, hc] one-hot */
    int32_t *ids_d = fwd_upload(c, ids, sizeof(int32_t) * (size_t)T, 0);      /* int32 [T] */
    if (!e || !rows || !pre_h || !ids_d) return c->err->code;
    int rc = c->be->embed(c->be, c->m->w.embed, cfg->vocab_size, D, ids_d, T, e, c->err);
    if (rc) return rc;
    fwd_dump(c, "embed", DI_BF16, e, 2, T, D, 0);
    for (int64_t t = 0; t < T; t++)
        for (int k = 0; k < hc; k++) rows[t * hc + k] = (int32_t)t, pre_h[t * hc + k] = k == 0 ? 1.0f : 0.0f;
    int32_t *rows_d = fwd_upload(c, rows, sizeof(int32_t) * (size_t)(T * hc), 0);
    if (!rows_d) return c->err->code;
    /* the repeat is a row gather: stream k of token t is embedding row t */
    rc = c->be->gather_rows(c->be, e, D, rows_d, T * hc, x, c->err);
    if (!rc) rc = c->be->mem_upload(c->be, pre, fwd_arena_stage(c, pre_h, sizeof(float) * (size_t)(T * hc)),
                                    sizeof(float) * (size_t)(T * hc), c->err);
    fwd_free_tmp(c);
    return rc;
}

/* Store block L's result in out (a pass of one sequence). */
static int keep_block(fwd_ctx *c, int L, const uint16_t *x, const float *pre) {
    const di_config *cfg = c->cfg;
    int64_t n = c->T * cfg->hc_mult * cfg->hidden_size;
    c->out->layer_out[L] = malloc(sizeof(uint16_t) * (size_t)n);
    c->out->premix[L] = malloc(sizeof(float) * (size_t)(c->T * cfg->hc_mult));
    if (!c->out->layer_out[L] || !c->out->premix[L]) return di_error_set(c->err, DI_ERR_NOMEM, "layer %d outputs", L);
    int rc = fwd_download(c, c->out->layer_out[L], x, sizeof(uint16_t) * (size_t)n);
    if (!rc) rc = fwd_download(c, c->out->premix[L], pre, sizeof(float) * (size_t)(c->T * cfg->hc_mult));
    return rc;
}

/* DSpark feature of a target layer: bf16(mean over the hc streams) of its input (after Engram), into
 * its column block of main_hidden (backend.h stream_mean).  x bf16 [T, hc, D] */
static int dspark_feature(fwd_ctx *c, int L, const uint16_t *x) {
    const di_config *cfg = c->cfg;
    int slot = -1;
    for (int i = 0; i < cfg->n_dspark_target_layer_ids; i++)
        if (cfg->dspark_target_layer_ids[i] == L) slot = i;
    if (slot < 0 || !c->main_hidden) return DI_OK;
    int64_t D = cfg->hidden_size, W = (int64_t)cfg->n_dspark_target_layer_ids * D;
    return c->be->stream_mean(c->be, x, c->T, cfg->hc_mult, D, c->main_hidden + slot * D, W, c->err);
}

/* Compressed ids of every chunk into its cache's Engram history (after the hashes were computed). */
static int engram_history_put(fwd_ctx *c) {
    if (c->cfg->n_engram_layers <= 0) return DI_OK;
    for (int i = 0; i < c->n_seq; i++) {
        const fwd_chunk *k = &c->seq[i].ck;
        /* the history ring keeps only the newest engram_slots ids: older ones of a long chunk are dropped */
        int64_t t0 = k->T - k->cache->engram_slots > 0 ? k->T - k->cache->engram_slots : 0;
        for (int64_t t = t0; t < k->T; t++) {
            int rc = di_cache_engram_put(k->cache, k->s0 + t, c->m->eg.token_map[k->ids[t]], c->err);
            if (rc) return rc;
        }
    }
    return DI_OK;
}

/* Final collapse with the last FFN pre-mix (no hc_head in V4.1), norm and f32 head over the head rows
 * of every sequence that asks for logits, packed (one head GEMM for the batch), then each sequence's
 * rows downloaded into its host logits — or, with opts->logits_on_device, copied into its logits in
 * backend memory, so a device sampler reads them without a round trip through the host.
 * x bf16 [T, hc, D];  pre f32 [T, hc] */
static int head(fwd_ctx *c, const uint16_t *x, const float *pre) {
    const di_config *cfg = c->cfg;
    const di_backend *be = c->be;
    di_error *err = c->err;
    int64_t D = cfg->hidden_size, V = cfg->vocab_size, nr = 0;
    int hc = cfg->hc_mult;
    for (int i = 0; i < c->n_seq; i++)
        if (c->seq[i].ck.logits) nr += c->seq[i].ck.all_logits ? c->seq[i].ck.T : 1;
    if (!nr) return DI_OK;
    uint16_t *xh, *h; /* bf16 [nr, hc, D], bf16 [nr, D] */
    float *ph, *lg;   /* f32 [nr, hc], f32 [nr, V] */
    if (!(xh = fwd_alloc(c, sizeof(uint16_t) * (size_t)(nr * hc * D), 0)) ||
        !(h = fwd_alloc(c, sizeof(uint16_t) * (size_t)(nr * D), 0)) ||
        !(ph = fwd_alloc(c, sizeof(float) * (size_t)(nr * hc), 0)) ||
        !(lg = fwd_alloc(c, sizeof(float) * (size_t)(nr * V), 0)))
        return err->code;
    int64_t k = 0; /* packed rows so far */
    for (int i = 0; i < c->n_seq; i++) {
        const fwd_seq *q = &c->seq[i];
        if (!q->ck.logits) continue;
        int64_t n = q->ck.all_logits ? q->ck.T : 1, r = q->r0 + q->ck.T - n;
        int rc = be->mem_copy(be, xh + k * hc * D, x + r * hc * D, sizeof(uint16_t) * (size_t)(n * hc * D), err);
        if (!rc) rc = be->mem_copy(be, ph + k * hc, pre + r * hc, sizeof(float) * (size_t)(n * hc), err);
        if (rc) return rc;
        k += n;
    }
    int rc = be->hc_collapse(be, xh, ph, nr, hc, D, h, err);
    if (!rc) rc = be->rmsnorm(be, h, nr, D, c->m->w.norm, (float)cfg->rms_norm_eps, h, err);
    if (rc) return rc;
    fwd_dump(c, "final_norm", DI_BF16, h, 2, nr, D, 0);
    if ((rc = be->linear_f32(be, h, nr, D, c->m->w.head, V, lg, err))) return rc;
    k = 0;
    for (int i = 0; i < c->n_seq; i++) {
        const fwd_seq *q = &c->seq[i];
        if (!q->ck.logits) continue;
        int64_t n = q->ck.all_logits ? q->ck.T : 1;
        if (c->opts->logits_on_device) {
            if ((rc = be->mem_copy(be, q->ck.logits, lg + k * V, sizeof(float) * (size_t)(n * V), err))) return rc;
            fwd_dump(c, "logits", DI_F32, q->ck.logits, 2, n, V, 0);
        } else {
            if ((rc = fwd_download(c, q->ck.logits, lg + k * V, sizeof(float) * (size_t)(n * V)))) return rc;
            fwd_dump_host(c, "logits", DI_F32, q->ck.logits, 2, n, V, 0);
        }
        k += n;
    }
    fwd_free_tmp(c);
    return DI_OK;
}

static int backbone_ops(fwd_ctx *c) {
    const di_config *cfg = c->cfg;
    const di_backend *be = c->be;
    di_error *err = c->err;
    int64_t T = c->T, D = cfg->hidden_size;
    int hc = cfg->hc_mult, rc = DI_OK;
    if (!c->ids) return di_error_set(err, DI_ERR_INTERNAL, "forward: backbone pass without ids");
    uint16_t *x = fwd_alloc(c, sizeof(uint16_t) * (size_t)(T * hc * D), 1); /* bf16 [T, hc, D] */
    float *pre = fwd_alloc(c, sizeof(float) * (size_t)(T * hc), 1);          /* f32 [T, hc] */
    float *pre_next = fwd_alloc(c, sizeof(float) * (size_t)(T * hc), 1);     /* f32 [T, hc] */
    if (!x || !pre || !pre_next) return err->code;
    CK(engram_history_put(c));
    CK(fwd_embed_streams(c, c->ids, x, pre));
    for (int L = 0; L < cfg->n_layers; L++) {
        if (c->opts->block_hook) CK(c->opts->block_hook(c->opts->block_hook_ctx, L, false, err));
        CK(fwd_engram(c, L, x));
        if (cfg->layer[L].dspark_target) CK(dspark_feature(c, L, x));
        CK(fwd_block(c, L, x, pre, pre_next));
        if (c->opts->block_hook) CK(c->opts->block_hook(c->opts->block_hook_ctx, L, true, err));
        fwd_free_tmp(c);
        CK(be->mem_copy(be, pre, pre_next, sizeof(float) * (size_t)(T * hc), err));
        if (c->out) CK(keep_block(c, L, x, pre));
    }
    CK(head(c, x, pre));
done:
    return rc;
}

/* A pass the backend may record as a graph (be->graph_begin): nothing in it waits for the device —
 * logits stay on the device, no dumps / per-block outputs / hooks that wait (block_hook_async), the
 * top-k gathers and the MoE dispatch on the backend (decode steps and verify blocks, T ≤ 64 as
 * forward_block.c moe() decides) — and the arena held the whole previous pass (no allocation outside
 * it while recording). */
static bool graph_pass(const fwd_ctx *c) {
    const di_fwd_opts *o = c->opts;
    return fwd_arena_graphs(c) && o->logits_on_device && !o->dump && (!o->block_hook || o->block_hook_async) &&
           !c->out && c->T <= FWD_GRAPH_MAX_T && c->be->moe_routed && fwd_gather_on_backend(c);
}

/* With graphs on, every eligible pass is recorded and then run as one graph launch: the backend first
 * tries to update its instantiated graph with the recording (cudaGraphExecUpdate: every kernel's new
 * parameters and grid, every copy's new size; refused only for another topology) and instantiates anew
 * when that fails. Why not replay a graph kept per shape key: the key (forward_arena.c) covers every
 * request of the pass, and the lists that grow with the context (compressed entries, the window
 * before it is full) change it at almost every decode step (41 of 42 passes in test_forward_arena),
 * so a graph per key would be a fresh instantiation per step; a fixed-maximum grid reading the lengths
 * from device memory would need every attention / compressor / indexer kernel changed. Recording is
 * host work of the order of issuing the ops; what the graph removes is the device-side gap between
 * launches, and an update costs far less than an instantiation. A recording that fails (an op of this
 * model synchronises, e.g. a workspace growing with the context, or copies pageable host memory) is
 * abandoned — nothing of it ran on
 * the device — and the pass runs op by op from its start (graph_fallbacks; after 8 the arena stays
 * eager). The rerun is sound: the host-side cache bookkeeping the abandoned attempt did is idempotent
 * (high-water marks and ring slots at fixed positions) and the pass reads none of it. */
int fwd_backbone(fwd_ctx *c) {
    if (!graph_pass(c)) return backbone_ops(c);
    const di_backend *be = c->be;
    int rc = be->graph_begin(be, c->err);
    if (rc) {
        fwd_arena_count(c, 0, 0, 1);
        return backbone_ops(c);
    }
    rc = backbone_ops(c);
    bool replayed = false;
    if (!rc) {
        rc = be->graph_end(be, fwd_arena_exec(c), true, &replayed, c->err);
        if (!rc) {
            fwd_arena_count(c, !replayed, replayed, 0);
            return DI_OK;
        }
    } else {
        bool ignored;
        be->graph_end(be, NULL, false, &ignored, c->err); /* stop recording, drop it */
    }
    fwd_arena_count(c, 0, 0, 1);
    return backbone_ops(c); /* the recorded ops never ran: the pass from its start, op by op */
}

/* ---------------- one-shot prefill drivers ---------------- */

/* A fresh cache for one prompt of T tokens (no rollback margin). */
static int prefill_cache(const di_config *cfg, const di_backend *be, int64_t T, di_cache **out, di_error *err) {
    di_cache_opts co = {.max_tokens = T, .spec_margin = 0, .be = be};
    return di_cache_create(cfg, &co, out, err);
}

int di_prefill(const di_model *m, const di_backend *be, const int32_t *ids, int64_t T, const di_fwd_opts *opts,
               di_prefill_out *out, di_error *err) {
    di_error local_err; /* the pass reports through err->code: never NULL inside */
    if (!err) err = &local_err;
    const di_config *cfg = &m->cfg;
    if (T <= 0) return di_error_set(err, DI_ERR_INVALID, "prefill: empty prompt");
    if (opts && opts->prompt_end != 0 && opts->prompt_end != T)
        return di_error_set(err, DI_ERR_INVALID,
                            "prefill: prompt end %lld inside a one-shot prefill of %lld tokens (its prompt is all of "
                            "them; a pass past a prompt's end is di_session_forward's)",
                            (long long)opts->prompt_end, (long long)T);
    int rc = out_init(cfg, T, out, err);
    if (rc) return rc;
    fwd_ctx c;
    memset(&c, 0, sizeof c);
    di_cache *cache = NULL;
    fwd_chunk k; /* the one sequence of the pass */
    CK(prefill_cache(cfg, be, T, &cache, err));
    if (!(out->logits = malloc(sizeof(float) * (size_t)(T * cfg->vocab_size))))
        CK(di_error_set(err, DI_ERR_NOMEM, "prompt logits [%lld, %d]", (long long)T, cfg->vocab_size));
    k = (fwd_chunk){.cache = cache, .s0 = 0, .T = T, .ids = ids, .window_floor = opts ? opts->window_floor : 0,
                    .all_logits = true, .logits = out->logits};
    CK(fwd_ctx_init(&c, m, be, &k, 1, opts, err));
    c.out = out;
    CK(di_cache_extend(cache, T, err));
    CK(fwd_backbone(&c));
done:
    fwd_ctx_free(&c);
    di_cache_destroy(cache);
    if (rc) di_prefill_out_free(out);
    return rc;
}

int di_prefill_teacher_forced(const di_model *m, const di_backend *be, const int32_t *ids, int64_t T,
                              const uint16_t *const *x_in, const float *const *pre_in, const di_fwd_opts *opts,
                              di_prefill_out *out, di_error *err) {
    di_error local_err; /* the pass reports through err->code: never NULL inside */
    if (!err) err = &local_err;
    const di_config *cfg = &m->cfg;
    if (T <= 0) return di_error_set(err, DI_ERR_INVALID, "prefill: empty prompt");
    int rc = out_init(cfg, T, out, err);
    if (rc) return rc;
    fwd_ctx c;
    memset(&c, 0, sizeof c);
    di_cache *cache = NULL;
    int64_t D = cfg->hidden_size;
    int hc = cfg->hc_mult;
    uint16_t *x = NULL, *x0 = NULL; /* bf16 [T, hc, D] (backend) */
    float *pre = NULL, *pre0 = NULL, *pre_next = NULL; /* f32 [T, hc] (backend) */
    size_t xb = sizeof(uint16_t) * (size_t)(T * hc * D), pb = sizeof(float) * (size_t)(T * hc);
    CK(prefill_cache(cfg, be, T, &cache, err));
    CK(fwd_ctx_init1(&c, m, be, cache, 0, ids, T, opts, err));
    c.out = out;
    CK(di_cache_extend(cache, T, err));
    CK(engram_history_put(&c));
    x = fwd_alloc(&c, xb, 1), x0 = fwd_alloc(&c, xb, 1);
    pre = fwd_alloc(&c, pb, 1), pre0 = fwd_alloc(&c, pb, 1), pre_next = fwd_alloc(&c, pb, 1);
    if (!x || !x0 || !pre || !pre0 || !pre_next) CK(err->code);
    CK(fwd_embed_streams(&c, ids, x0, pre0));
    for (int L = 0; L < cfg->n_layers; L++) {
        /* the given inputs are host memory (golden data); block 0 defaults to our own embedding */
        bool own_x = !(x_in && x_in[L]), own_p = !(pre_in && pre_in[L]);
        if ((own_x || own_p) && L > 0)
            CK(di_error_set(err, DI_ERR_INVALID, "teacher forcing: no input for block %d", L));
        CK(own_x ? be->mem_copy(be, x, x0, xb, err) : be->mem_upload(be, x, x_in[L], xb, err));
        CK(own_p ? be->mem_copy(be, pre, pre0, pb, err) : be->mem_upload(be, pre, pre_in[L], pb, err));
        CK(fwd_engram(&c, L, x));
        CK(fwd_block(&c, L, x, pre, pre_next));
        fwd_free_tmp(&c);
        CK(keep_block(&c, L, x, pre_next));
    }
done:
    fwd_ctx_free(&c);
    di_cache_destroy(cache);
    if (rc) di_prefill_out_free(out);
    return rc;
}
