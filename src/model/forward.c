/* Prefill drivers (free-running and teacher-forced), RoPE tables, Engram hashing and the pass state.
 * The block itself is in forward_block.c. */
#include "model/forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward_internal.h"
#include "util/error.h"

/* ---------------- pass-state allocation ---------------- */

static int push_ptr(void ***arr, size_t *n, size_t *cap, void *p) {
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        void **na = realloc(*arr, nc * sizeof(void *));
        if (!na) return -1;
        *arr = na, *cap = nc;
    }
    (*arr)[(*n)++] = p;
    return 0;
}

void *fwd_alloc(fwd_ctx *c, size_t bytes, int persist) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (p && (persist ? push_ptr(&c->keep, &c->n_keep, &c->cap_keep, p) : push_ptr(&c->tmp, &c->n_tmp, &c->cap_tmp, p))) {
        free(p);
        p = NULL;
    }
    if (!p) di_error_set(c->err, DI_ERR_NOMEM, "forward pass: allocation of %zu bytes", bytes);
    return p;
}

void fwd_free_tmp(fwd_ctx *c) {
    for (size_t i = 0; i < c->n_tmp; i++) free(c->tmp[i]);
    c->n_tmp = 0;
}

static void ctx_free(fwd_ctx *c) {
    fwd_free_tmp(c);
    free(c->tmp);
    for (size_t i = 0; i < c->n_keep; i++) free(c->keep[i]);
    free(c->keep);
}

void fwd_dump(fwd_ctx *c, const char *name, di_dtype dt, const void *data, int ndim, int64_t d0, int64_t d1,
              int64_t d2) {
    if (!c->opts->dump) return;
    int64_t shape[3] = {d0, d1, d2};
    c->opts->dump(c->opts->dump_ctx, name, dt, ndim, shape, data);
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

int di_engram_hash(const di_model *m, int e, const int32_t *tokens, int64_t T, int64_t *ids, di_error *err) {
    const di_engram_consts *eg = &m->eg;
    if (e < 0 || e >= eg->n_layers) return di_error_set(err, DI_ERR_INVALID, "engram hash: layer slot %d", e);
    if (!eg->token_map) return di_error_set(err, DI_ERR_UNSUPPORTED, "engram hash: no compressed-token map loaded");
    int ng = eg->max_ngram, nh = eg->n_heads, cols = (ng - 1) * nh;
    const int64_t *mul = eg->multipliers + (int64_t)e * ng;
    const int64_t *off = eg->offsets + (int64_t)e * cols;
    for (int64_t p = 0; p < T; p++) {
        /* look back over the compressed ids; the sequence start blocks that and every further shift */
        int64_t roll = 0;
        for (int s = 0; s < ng; s++) {
            int64_t tok;
            if (p - s < 0) {
                tok = eg->pad_compressed_id;
            } else {
                int32_t id = tokens[p - s];
                if (id < 0 || id >= eg->token_map_len)
                    return di_error_set(err, DI_ERR_INVALID, "engram hash: token id %d at position %lld outside the map (%lld)",
                                        id, (long long)(p - s), (long long)eg->token_map_len);
                tok = eg->token_map[id];
            }
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
    return DI_OK;
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

static int ctx_init(fwd_ctx *c, const di_model *m, const di_backend *be, const int32_t *ids, int64_t T,
                    const di_fwd_opts *opts, di_prefill_out *out, di_error *err) {
    static const di_fwd_opts no_opts;
    const di_config *cfg = &m->cfg;
    memset(c, 0, sizeof *c);
    c->m = m, c->cfg = cfg, c->be = be, c->opts = opts ? opts : &no_opts, c->err = err, c->T = T, c->out = out;
    if (T <= 0) return di_error_set(err, DI_ERR_INVALID, "prefill: empty prompt");
    for (int64_t t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= cfg->vocab_size)
            return di_error_set(err, DI_ERR_INVALID, "prefill: token %d at position %lld outside the vocabulary (%d)",
                                ids[t], (long long)t, cfg->vocab_size);
    int half = cfg->qk_rope_head_dim / 2;
    if (!(c->pos = fwd_alloc(c, sizeof(int64_t) * (size_t)T, 1))) return err->code;
    for (int64_t t = 0; t < T; t++) c->pos[t] = t;
    for (int R = 1; R <= 2; R++) {
        if (!(c->cmp_pos[R] = fwd_alloc(c, sizeof(int64_t) * (size_t)(T / R + 1), 1))) return err->code;
        for (int64_t n = 0; n < T / R; n++) c->cmp_pos[R][n] = n * R;
    }
    for (int L = 0; L < cfg->n_layers; L++) {
        int R = cfg->layer[L].compress_ratio;
        if (R > 2) return di_error_set(err, DI_ERR_UNSUPPORTED, "layer %d: compress ratio %d (V4.1 uses 0, 1, 2)", L, R);
    }
    /* one frequency table per rope kind, from the first layer of that kind */
    for (int L = 0; L < cfg->n_layers; L++) {
        int k = cfg->layer[L].rope;
        if (c->rope_freqs[k]) continue;
        if (!(c->rope_freqs[k] = fwd_alloc(c, sizeof(float) * (size_t)(half > 0 ? half : 1), 1))) return err->code;
        int rc = di_rope_freqs(cfg, L, c->rope_freqs[k], err);
        if (rc) return rc;
    }
    if (!(c->pub = fwd_alloc(c, sizeof *c->pub * (size_t)cfg->n_layers, 1))) return err->code;
    /* window index lists of the one-shot prefill: row p sees max(0, p−W+1) + j, −1 beyond p */
    int64_t W = cfg->sliding_window;
    c->n_win = T < W ? T : W;
    if (!(c->win_idx = fwd_alloc(c, sizeof(int32_t) * (size_t)(T * c->n_win), 1))) return err->code;
    for (int64_t p = 0; p < T; p++) {
        int64_t start = p - W + 1 > 0 ? p - W + 1 : 0;
        for (int64_t j = 0; j < c->n_win; j++) c->win_idx[p * c->n_win + j] = start + j > p ? -1 : (int32_t)(start + j);
    }
    /* Engram hashes for the whole prompt first, as the reference does */
    int ne = cfg->n_engram_layers, cols = (cfg->engram_max_ngram_size - 1) * cfg->engram_n_heads;
    if (ne > 0) {
        if (!(c->eg_ids = fwd_alloc(c, sizeof(int64_t *) * (size_t)ne, 1))) return err->code;
        for (int e = 0; e < ne; e++) {
            if (!(c->eg_ids[e] = fwd_alloc(c, sizeof(int64_t) * (size_t)(T * cols), 1))) return err->code;
            int rc = di_engram_hash(m, e, ids, T, c->eg_ids[e], err);
            if (rc) return rc;
        }
    }
    return DI_OK;
}

/* X = embedding repeated over the hc streams; pre = one-hot stream 0.  x bf16 [T, hc, D], pre f32 [T, hc] */
static int embed_streams(fwd_ctx *c, const int32_t *ids, uint16_t *x, float *pre) {
    const di_config *cfg = c->cfg;
    int64_t T = c->T, D = cfg->hidden_size;
    int hc = cfg->hc_mult;
    uint16_t *e = fwd_alloc(c, sizeof(uint16_t) * (size_t)(T * D), 0); /* bf16 [T, D] */
    if (!e) return c->err->code;
    int rc = c->be->embed(c->be, c->m->w.embed, cfg->vocab_size, D, ids, T, e, c->err);
    if (rc) return rc;
    fwd_dump(c, "embed", DI_BF16, e, 2, T, D, 0);
    for (int64_t t = 0; t < T; t++)
        for (int k = 0; k < hc; k++) {
            memcpy(x + (t * hc + k) * D, e + t * D, sizeof(uint16_t) * (size_t)D);
            pre[t * hc + k] = k == 0 ? 1.0f : 0.0f;
        }
    fwd_free_tmp(c);
    return DI_OK;
}

/* Store block L's result in out. */
static int keep_block(fwd_ctx *c, int L, const uint16_t *x, const float *pre) {
    const di_config *cfg = c->cfg;
    int64_t n = c->T * cfg->hc_mult * cfg->hidden_size;
    c->out->layer_out[L] = malloc(sizeof(uint16_t) * (size_t)n);
    c->out->premix[L] = malloc(sizeof(float) * (size_t)(c->T * cfg->hc_mult));
    if (!c->out->layer_out[L] || !c->out->premix[L]) return di_error_set(c->err, DI_ERR_NOMEM, "layer %d outputs", L);
    memcpy(c->out->layer_out[L], x, sizeof(uint16_t) * (size_t)n);
    memcpy(c->out->premix[L], pre, sizeof(float) * (size_t)(c->T * cfg->hc_mult));
    return DI_OK;
}

int di_prefill(const di_model *m, const di_backend *be, const int32_t *ids, int64_t T, const di_fwd_opts *opts,
               di_prefill_out *out, di_error *err) {
    di_error local_err; /* the pass reports through err->code: never NULL inside */
    if (!err) err = &local_err;
    const di_config *cfg = &m->cfg;
    int rc = out_init(cfg, T, out, err);
    if (rc) return rc;
    fwd_ctx c;
    int64_t D = cfg->hidden_size, V = cfg->vocab_size;
    int hc = cfg->hc_mult;
    uint16_t *x = NULL, *h = NULL; /* bf16 [T, hc, D], bf16 [T, D] */
    float *pre = NULL, *pre_next = NULL; /* f32 [T, hc] */
    CK(ctx_init(&c, m, be, ids, T, opts, out, err));
    x = malloc(sizeof(uint16_t) * (size_t)(T * hc * D));
    h = malloc(sizeof(uint16_t) * (size_t)(T * D));
    pre = malloc(sizeof(float) * (size_t)(T * hc));
    pre_next = malloc(sizeof(float) * (size_t)(T * hc));
    out->logits = malloc(sizeof(float) * (size_t)(T * V));
    if (!x || !h || !pre || !pre_next || !out->logits) CK(di_error_set(err, DI_ERR_NOMEM, "prefill buffers (T=%lld)", (long long)T));
    CK(embed_streams(&c, ids, x, pre));
    for (int L = 0; L < cfg->n_layers; L++) {
        CK(fwd_engram(&c, L, x));
        CK(fwd_block(&c, L, x, pre, pre_next));
        fwd_free_tmp(&c);
        memcpy(pre, pre_next, sizeof(float) * (size_t)(T * hc));
        CK(keep_block(&c, L, x, pre));
    }
    /* final collapse with the last FFN pre-mix (no hc_head in V4.1), norm, f32 head on every position */
    CK(be->hc_collapse(be, x, pre, T, hc, D, h, err));
    CK(be->rmsnorm(be, h, T, D, m->w.norm, (float)cfg->rms_norm_eps, h, err));
    fwd_dump(&c, "final_norm", DI_BF16, h, 2, T, D, 0);
    CK(be->linear_f32(be, h, T, D, m->w.head, V, out->logits, err));
    fwd_dump(&c, "logits", DI_F32, out->logits, 2, T, V, 0);
done:
    ctx_free(&c);
    free(x), free(h), free(pre), free(pre_next);
    if (rc) di_prefill_out_free(out);
    return rc;
}

int di_prefill_teacher_forced(const di_model *m, const di_backend *be, const int32_t *ids, int64_t T,
                              const uint16_t *const *x_in, const float *const *pre_in, const di_fwd_opts *opts,
                              di_prefill_out *out, di_error *err) {
    di_error local_err; /* the pass reports through err->code: never NULL inside */
    if (!err) err = &local_err;
    const di_config *cfg = &m->cfg;
    int rc = out_init(cfg, T, out, err);
    if (rc) return rc;
    fwd_ctx c;
    int64_t D = cfg->hidden_size;
    int hc = cfg->hc_mult;
    uint16_t *x = NULL, *x0 = NULL; /* bf16 [T, hc, D] */
    float *pre = NULL, *pre0 = NULL, *pre_next = NULL; /* f32 [T, hc] */
    CK(ctx_init(&c, m, be, ids, T, opts, out, err));
    x = malloc(sizeof(uint16_t) * (size_t)(T * hc * D));
    x0 = malloc(sizeof(uint16_t) * (size_t)(T * hc * D));
    pre = malloc(sizeof(float) * (size_t)(T * hc));
    pre0 = malloc(sizeof(float) * (size_t)(T * hc));
    pre_next = malloc(sizeof(float) * (size_t)(T * hc));
    if (!x || !x0 || !pre || !pre0 || !pre_next) CK(di_error_set(err, DI_ERR_NOMEM, "teacher-forced buffers"));
    CK(embed_streams(&c, ids, x0, pre0));
    for (int L = 0; L < cfg->n_layers; L++) {
        const uint16_t *xi = x_in && x_in[L] ? x_in[L] : (L == 0 ? x0 : NULL);
        const float *pi = pre_in && pre_in[L] ? pre_in[L] : (L == 0 ? pre0 : NULL);
        if (!xi || !pi) CK(di_error_set(err, DI_ERR_INVALID, "teacher forcing: no input for block %d", L));
        memcpy(x, xi, sizeof(uint16_t) * (size_t)(T * hc * D));
        memcpy(pre, pi, sizeof(float) * (size_t)(T * hc));
        CK(fwd_engram(&c, L, x));
        CK(fwd_block(&c, L, x, pre, pre_next));
        fwd_free_tmp(&c);
        CK(keep_block(&c, L, x, pre_next));
    }
done:
    ctx_free(&c);
    free(x), free(x0), free(pre), free(pre0), free(pre_next);
    if (rc) di_prefill_out_free(out);
    return rc;
}
