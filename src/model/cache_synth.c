/* BENCH-ONLY synthetic cache history (cache_synth.h). */
#include "model/cache_synth.h"

#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "util/error.h"

static uint64_t xs_next(uint64_t *r) {
    *r ^= *r << 13, *r ^= *r >> 7, *r ^= *r << 17;
    return *r;
}

/* A random bf16 of magnitude in [1/8, 2) (exponent 2^0 … 2^−3, random mantissa and sign): finite,
 * never subnormal, in the range the FP8 / FP4 quantizers see from real latents. */
static uint16_t rand_bf16(uint64_t *r) {
    uint64_t v = xs_next(r);
    uint32_t sign = (uint32_t)(v & 1) << 15, exp = 127 - (uint32_t)((v >> 1) % 4), man = (uint32_t)(v >> 8) & 0x7f;
    return (uint16_t)(sign | exp << 7 | man);
}

/* Rows buffer where the cache's put functions expect it: host memory, or backend memory for a
 * backend arena.  rows bf16 [n, d] */
static uint16_t *rows_alloc(const di_cache *c, int64_t n, int64_t d, uint64_t *r, di_error *err) {
    size_t bytes = sizeof(uint16_t) * (size_t)(n * d);
    uint16_t *h = malloc(bytes ? bytes : 1);
    if (!h) {
        di_error_set(err, DI_ERR_NOMEM, "synthetic cache: %zu bytes of rows", bytes);
        return NULL;
    }
    for (int64_t i = 0; i < n * d; i++) h[i] = rand_bf16(r);
    if (!c->be) return h;
    uint16_t *dv = c->be->mem_alloc(c->be, bytes, err);
    if (dv && c->be->mem_upload(c->be, dv, h, bytes, err)) c->be->mem_free(c->be, dv), dv = NULL;
    free(h);
    return dv;
}

static void rows_free(const di_cache *c, uint16_t *p) {
    if (!p) return;
    if (c->be) c->be->mem_free(c->be, p);
    else free(p);
}

/* Copy within the arena (host or backend memory). */
static int arena_copy(const di_cache *c, void *dst, const void *src, size_t bytes, di_error *err) {
    if (c->be) return c->be->mem_copy(c->be, dst, src, bytes, err);
    memcpy(dst, src, bytes);
    return DI_OK;
}

/* Distinct rows per kv source; entry e takes row e mod POOL (a decode step reads bytes, not values). */
#define SYNTH_POOL 64

int di_cache_fill_synthetic(di_cache *c, const di_config *cfg, int64_t len, uint64_t seed, di_error *err) {
    int align = di_cache_prefix_align(c);
    if (c->n != 0)
        return di_error_set(err, DI_ERR_INVALID, "synthetic cache: the cache holds %lld positions (expected an empty one)",
                            (long long)c->n);
    if (len < 1 || len > c->max_tokens || len % align)
        return di_error_set(err, DI_ERR_INVALID,
                            "synthetic cache: length %lld (expected 1 … %lld, a multiple of the compress-ratio lcm %d)",
                            (long long)len, (long long)c->max_tokens, align);
    uint64_t r = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    if (!r) r = 1;
    int64_t hd = c->head_dim, ihd = c->index_head_dim;
    int64_t nwin = len < c->ring_slots ? len : c->ring_slots;
    uint16_t *win = NULL, *cmp = NULL, *ikey = NULL; /* bf16 [nwin, hd], [POOL, hd], [POOL, ihd] */
    int rc = di_cache_extend(c, len, err);
    if (rc) return rc;
    if (!(win = rows_alloc(c, nwin, hd, &r, err)) || !(cmp = rows_alloc(c, SYNTH_POOL, hd, &r, err)) ||
        !(ikey = rows_alloc(c, SYNTH_POOL, ihd, &r, err))) {
        rc = err->code ? err->code : DI_ERR_NOMEM;
        goto done;
    }
    for (int st = 0; st < c->n_stages && !rc; st++) {
        rc = di_cache_window_put_rows(c, st, len - nwin, nwin, win, err);
        int R = c->stage[st].ratio;
        if (R <= 0) continue;
        int64_t ne = len / R, put = c->pool || ne < SYNTH_POOL ? ne : SYNTH_POOL;
        for (int64_t e = 0; e < put && !rc; e++) {
            rc = di_cache_cmp_put(c, st, e, cmp + (e % SYNTH_POOL) * hd, err);
            if (!rc) rc = di_cache_ikey_put(c, st, e, ikey + (e % SYNTH_POOL) * ihd, err);
        }
        /* a contiguous array: the rest by doubling copies of the encoded entries (O(log) copies instead
         * of one encode per entry: 64K entries × 256 sequences would be 33M device launches) */
        for (int64_t have = put; have < ne && !rc;) {
            int64_t k = have < ne - have ? have : ne - have;
            rc = arena_copy(c, c->stage[st].cmp + have * c->cmp_entry_bytes, c->stage[st].cmp,
                            (size_t)(k * c->cmp_entry_bytes), err);
            if (!rc)
                rc = arena_copy(c, c->stage[st].ikey + have * c->index_key_bytes, c->stage[st].ikey,
                                (size_t)(k * c->index_key_bytes), err);
            have += k;
        }
        if (!rc) c->cmp_n[st] = c->ikey_n[st] = ne; /* the marks the puts would have left */
    }
    if (!rc && c->engram_hist > 0) {
        int64_t V = cfg->engram_compressed_vocab_size > 0 ? cfg->engram_compressed_vocab_size : 1;
        int64_t p0 = len > c->engram_slots ? len - c->engram_slots : 0;
        for (int64_t p = p0; p < len && !rc; p++) rc = di_cache_engram_put(c, p, (int32_t)(xs_next(&r) % (uint64_t)V), err);
    }
done:
    rows_free(c, win), rows_free(c, cmp), rows_free(c, ikey);
    if (rc) di_cache_reset(c);
    return rc;
}
