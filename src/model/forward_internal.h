/* Private to forward.c / forward_block.c: the state of one prefill pass. */
#ifndef DI_MODEL_FORWARD_INTERNAL_H
#define DI_MODEL_FORWARD_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "model/forward.h"

typedef struct fwd_ctx {
    const di_model *m;
    const di_config *cfg;
    const di_backend *be;
    const di_fwd_opts *opts;
    di_error *err;
    int64_t T;
    int64_t *pos;            /* int64 [T] positions 0..T−1 */
    int64_t *cmp_pos[3];     /* int64 [T/R] compressed-entry positions n·R, by ratio R = 1, 2 (index R) */
    float *rope_freqs[2];    /* f32 [rd/2] per di_rope_kind (plain, compress) */
    int32_t *win_idx;        /* int32 [T, n_win] window part of every query's index list */
    int64_t n_win;           /* min(T, window) */
    int64_t **eg_ids;        /* [n_engram_layers] int64 [T, cols] hash row ids */

    /* Shared attention state, published per source layer (storage in `keep`) and read through the
     * config's roles: a layer attends the compressed KV of cfg.layer[L].kv_source, scores the index
     * keys of index_key_source, masks by candidate_source and reuses the top-k of index_source. */
    struct fwd_pub {
        const uint16_t *cmp_kv;  /* bf16 [n_cmp, hd]  compressed KV (kv sources) */
        int64_t n_cmp;
        const uint16_t *index_k; /* bf16 [n_cmp, ihd] index keys (kv sources) */
        const int32_t *topk;     /* int32 [T, topk_k] (index sources; NULL when k = 0) */
        int topk_k;
        const uint8_t *cand;     /* uint8 [T, n_cand] candidate mask (the candidate source) */
        int64_t n_cand;
        bool done;               /* the layer ran in this pass */
    } *pub;                      /* [n_layers] */

    di_prefill_out *out;

    void **keep;   /* allocations that live for the whole pass */
    size_t n_keep, cap_keep;
    void **tmp;    /* allocations of the current block */
    size_t n_tmp, cap_tmp;
} fwd_ctx;

/* Zeroed allocation owned by the pass (persist = 1) or by the current block (persist = 0);
 * NULL after setting ctx->err on failure. */
void *fwd_alloc(fwd_ctx *c, size_t bytes, int persist);
void fwd_free_tmp(fwd_ctx *c);

/* Hand a stage tensor to the dump callback (no-op without one). Shape given as up to 3 dims. */
void fwd_dump(fwd_ctx *c, const char *name, di_dtype dt, const void *data, int ndim, int64_t d0, int64_t d1,
              int64_t d2);

/* Engram update of the streams before block L (no-op for non-Engram layers).  x bf16 [T, hc, D] */
int fwd_engram(fwd_ctx *c, int L, uint16_t *x);

/* Block L: x bf16 [T, hc, D] in place; pre_in f32 [T, hc] collapses the attention input; pre_out f32
 * [T, hc] receives the FFN pre-mix for the next block. */
int fwd_block(fwd_ctx *c, int L, uint16_t *x, const float *pre_in, float *pre_out);

#endif
