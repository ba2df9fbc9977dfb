/* Per-sequence cache store: layout and sizing, lifecycle, positions and rollback, canonical image
 * (the rationale is in cache.h). Row quantization and reads are in cache_rows.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/cache.h"
#include "model/cache_pool.h"
#include "util/error.h"

#define ALIGN 64
#define MAX_MARGIN 1024

static int64_t align_up(int64_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

/* Byte offsets of every section in the arena, and the shape the cache copies from the config. */
typedef struct plan {
    di_cache_size size;
    int64_t win_off[DI_MAX_STAGES];   /* every stage has a window ring */
    int64_t cmp_off[DI_MAX_STAGES];   /* −1: not a kv source */
    int64_t ikey_off[DI_MAX_STAGES];
    int64_t state_off[DI_MAX_STAGES]; /* −1: no compressor state (ratio < 2) */
    int ratio[DI_MAX_STAGES];         /* kv-source ratio, 0 otherwise */
    int64_t max_entries[DI_MAX_STAGES];
    int64_t engram_off;               /* −1: no Engram */
    int64_t max_tokens, ring_slots, engram_slots;
    int state_blocks[DI_MAX_STAGES];  /* compressor ring blocks (ratio ≥ 2), 0 otherwise */
    int margin, engram_hist;
} plan;

/* Compressor ring blocks for ratio R ≥ 2 and margin m: the pending rows of the group holding the
 * rollback target P must survive the groups that k ≤ m appended tokens start. Those tokens reach
 * at most ⌊(P mod R + m − 1)/R⌋ ≤ ⌊(R + m − 2)/R⌋ groups past it, so that many more blocks than
 * one (m = 0: the reference's single block). */
static int state_blocks_for(int ratio, int margin) { return 1 + (ratio + margin - 2) / ratio; }

/* paged: the compressed KV and index keys live in a pool's pages (cache_pool.h), not in the arena:
 * their sections are left out (offsets −1) while the sizes still report them. */
static int make_plan(const di_config *cfg, const di_cache_opts *opts, int paged, plan *p, di_error *err) {
    memset(p, 0, sizeof *p);
    if (!cfg) return di_error_set(err, DI_ERR_INVALID, "cache: no config");
    int64_t max_tokens = opts ? opts->max_tokens : cfg->max_position_embeddings;
    int margin = opts && opts->spec_margin >= 0 ? opts->spec_margin : di_cache_default_margin(cfg);
    if (max_tokens < 1 || max_tokens > INT32_MAX)
        return di_error_set(err, DI_ERR_INVALID,
                            "cache: max_tokens %lld (expected 1 … %d: positions index int32 lists)",
                            (long long)max_tokens, INT32_MAX);
    if (margin < 0 || margin > MAX_MARGIN)
        return di_error_set(err, DI_ERR_INVALID, "cache: spec_margin %d (expected 0 … %d)", margin, MAX_MARGIN);
    int hd = cfg->head_dim, ihd = cfg->index_head_dim, W = cfg->sliding_window;
    if (hd < 32 || hd % 32 || W < 1 || cfg->n_stages < 1 || cfg->n_stages > DI_MAX_STAGES)
        return di_error_set(err, DI_ERR_INVALID,
                            "cache: head_dim %d, sliding_window %d, %d stages (expected head_dim a multiple of 32, "
                            "window ≥ 1, 1 … %d stages)",
                            hd, W, cfg->n_stages, DI_MAX_STAGES);

    p->max_tokens = max_tokens;
    p->margin = margin;
    p->ring_slots = (int64_t)W + margin;
    p->engram_hist = cfg->n_engram_layers > 0 ? cfg->engram_max_ngram_size - 1 : 0;
    p->engram_slots = p->engram_hist > 0 ? p->engram_hist + margin : 0;

    di_cache_size *s = &p->size;
    int64_t off = 0;
    for (int st = 0; st < cfg->n_stages; st++) {
        di_cache_footprint fp;
        di_cache_footprint_of(cfg, st, &fp);
        /* every stage, backbone or DSpark, owns a window ring (§4.7) */
        s->window_slot_bytes = fp.window_bytes / W;
        p->win_off[st] = off;
        off = align_up(off + p->ring_slots * s->window_slot_bytes);
        s->window_bytes += p->ring_slots * s->window_slot_bytes;
        p->cmp_off[st] = p->ikey_off[st] = p->state_off[st] = -1;
        if (!cfg->layer[st].is_kv_source) continue;
        int r = cfg->layer[st].compress_ratio;
        if (r < 1 || ihd < 32 || ihd % 32)
            return di_error_set(err, DI_ERR_INVALID,
                                "cache: kv source stage %d has compress_ratio %d, index_head_dim %d "
                                "(expected ratio ≥ 1 and index_head_dim a multiple of 32)",
                                st, r, ihd);
        p->ratio[st] = r;
        p->max_entries[st] = max_tokens / r;
        s->cmp_entry_bytes = fp.compressed_entry_bytes;
        s->index_key_bytes = fp.index_key_bytes;
        if (!paged) {
            p->cmp_off[st] = off;
            off = align_up(off + p->max_entries[st] * s->cmp_entry_bytes);
            p->ikey_off[st] = off;
            off = align_up(off + p->max_entries[st] * s->index_key_bytes);
        }
        s->compressed_bytes += p->max_entries[st] * (s->cmp_entry_bytes + s->index_key_bytes);
        s->per_token_bytes += fp.per_token_bytes;
        if (r >= 2) {
            /* footprint: one block = the reference's kv_state + score_state, R rows of hd f32 each */
            int nb = state_blocks_for(r, margin);
            p->state_blocks[st] = nb;
            p->state_off[st] = off;
            off = align_up(off + nb * fp.compressor_state_bytes);
            s->state_bytes += nb * fp.compressor_state_bytes;
        }
    }
    p->engram_off = -1;
    if (p->engram_slots > 0) {
        p->engram_off = off;
        off = align_up(off + p->engram_slots * (int64_t)sizeof(int32_t));
        s->engram_bytes = p->engram_slots * (int64_t)sizeof(int32_t);
    }
    s->fixed_bytes = s->window_bytes + s->state_bytes + s->engram_bytes;
    s->total_bytes = off;
    return DI_OK;
}

int di_cache_default_margin(const di_config *cfg) {
    int m = DI_CACHE_SPEC_MARGIN_DEFAULT;
    if (cfg && cfg->n_dspark > 0 && cfg->dspark_block_size > 0 && 2 * (cfg->dspark_block_size + 1) > m)
        m = 2 * (cfg->dspark_block_size + 1);
    return m;
}

int di_cache_size_of(const di_config *cfg, const di_cache_opts *opts, di_cache_size *out, di_error *err) {
    plan p;
    int rc = make_plan(cfg, opts, 0, &p, err);
    if (rc) return rc;
    *out = p.size;
    return DI_OK;
}

int di_cache_slot_size_of(const di_config *cfg, const di_cache_opts *opts, di_cache_size *out, di_error *err) {
    plan p;
    int rc = make_plan(cfg, opts, 1, &p, err);
    if (rc) return rc;
    *out = p.size;
    return DI_OK;
}

int di_cache_arena_read(const di_cache *c, void *dst, const void *src, size_t bytes, di_error *err) {
    if (c->be) return c->be->mem_download(c->be, dst, src, bytes, err);
    if (bytes) memcpy(dst, src, bytes);
    return DI_OK;
}

int di_cache_arena_write(const di_cache *c, void *dst, const void *src, size_t bytes, di_error *err) {
    if (c->be) return c->be->mem_upload(c->be, dst, src, bytes, err);
    if (bytes) memcpy(dst, src, bytes);
    return DI_OK;
}

int di_cache_reset(di_cache *c) {
    int status = DI_OK;
    if (c->pool && !c->pool->external_pages) di_cache_pool_drop_pages(c); /* re-taken as the sequence grows */
    c->n = c->n_max = 0;
    c->engram_hi = c->engram_n = 0;
    c->win_floor = 0;
    for (int st = 0; st < c->n_stages; st++) {
        c->win_hi[st] = c->win_n[st] = 0;
        c->cmp_n[st] = c->ikey_n[st] = 0;
        c->state_hi[st] = 0;
        c->cmp_frozen[st] = 0;
        const di_cache_stage *s = &c->stage[st];
        if (!s->state) continue;
        /* the reference resets kv_state = 0, score_state = −inf at sequence start */
        int64_t rows = (int64_t)s->ratio * c->head_dim; /* one half of a block */
        for (int b = 0; b < s->state_blocks; b++) {
            float *kv = s->state + (int64_t)b * 2 * rows;
            if (c->be) { /* backend memory: filled by its op (only a device failure can fail it) */
                di_error ignored;
                int rc = c->be->fill_f32(c->be, kv, rows, 0.0f, &ignored);
                if (!rc) rc = c->be->fill_f32(c->be, kv + rows, rows, -INFINITY, &ignored);
                if (rc && !status) status = rc;
                continue;
            }
            for (int64_t i = 0; i < rows; i++) {
                kv[i] = 0.0f;
                kv[rows + i] = -INFINITY;
            }
        }
    }
    for (int64_t i = 0; i < c->engram_slots; i++) c->engram[i] = DI_CACHE_ENGRAM_NONE;
    return status;
}

static int cache_init(di_cache *c, const di_config *cfg, const di_cache_opts *opts, void *arena, size_t arena_bytes,
                      const di_backend *be, int32_t *engram_host, int paged, di_error *err) {
    plan p;
    int rc = make_plan(cfg, opts, paged, &p, err);
    if (rc) return rc;
    if (!c || !arena || (uintptr_t)arena % ALIGN || arena_bytes < (size_t)p.size.total_bytes)
        return di_error_set(err, DI_ERR_INVALID,
                            "cache: arena %p of %zu bytes (expected a %d-byte aligned block of at least %lld bytes)",
                            arena, arena_bytes, ALIGN, (long long)p.size.total_bytes);
    memset(c, 0, sizeof *c);
    c->be = be;
    c->engram_host = engram_host;
    c->n_stages = cfg->n_stages;
    c->n_layers = cfg->n_layers;
    c->window = cfg->sliding_window;
    c->head_dim = cfg->head_dim;
    c->index_head_dim = cfg->index_head_dim;
    c->engram_hist = p.engram_hist;
    c->spec_margin = p.margin;
    c->max_tokens = p.max_tokens;
    c->ring_slots = p.ring_slots;
    c->engram_slots = p.engram_slots;
    c->window_slot_bytes = p.size.window_slot_bytes;
    c->cmp_entry_bytes = p.size.cmp_entry_bytes;
    c->index_key_bytes = p.size.index_key_bytes;
    uint8_t *base = arena;
    for (int st = 0; st < c->n_stages; st++) {
        di_cache_stage *s = &c->stage[st];
        s->window = base + p.win_off[st];
        s->ratio = p.ratio[st];
        s->max_entries = p.max_entries[st];
        s->cmp = p.cmp_off[st] >= 0 ? base + p.cmp_off[st] : NULL;
        s->ikey = p.ikey_off[st] >= 0 ? base + p.ikey_off[st] : NULL;
        s->state = p.state_off[st] >= 0 ? (float *)(base + p.state_off[st]) : NULL;
        s->state_blocks = p.state_blocks[st];
        s->page_entries = p.max_entries[st];
    }
    /* the history is host bookkeeping (the hash runs on the host): with a backend arena its section
     * stays reserved (sizes are the same for every backend) and the ring lives in engram_host */
    c->engram = p.engram_off < 0 ? NULL : c->be ? c->engram_host : (int32_t *)(base + p.engram_off);
    c->arena = arena;
    c->arena_bytes = arena_bytes;
    di_cache_reset(c);
    return DI_OK;
}

int di_cache_init(di_cache *c, const di_config *cfg, const di_cache_opts *opts, void *arena, size_t arena_bytes,
                  di_error *err) {
    if (opts && opts->be)
        return di_error_set(err, DI_ERR_INVALID,
                            "cache: a backend arena is built by di_cache_create, not in caller memory");
    return cache_init(c, cfg, opts, arena, arena_bytes, NULL, NULL, 0, err);
}

int di_cache_init_slot(di_cache *c, const di_config *cfg, const di_cache_opts *opts, void *slot, size_t slot_bytes,
                       int32_t *engram_host, di_error *err) {
    return cache_init(c, cfg, opts, slot, slot_bytes, opts ? opts->be : NULL, engram_host, 1, err);
}

int di_cache_create(const di_config *cfg, const di_cache_opts *opts, di_cache **out, di_error *err) {
    *out = NULL;
    di_cache_size sz;
    int rc = di_cache_size_of(cfg, opts, &sz, err);
    if (rc) return rc;
    di_cache *c = calloc(1, sizeof *c);
    if (!c) return di_error_set(err, DI_ERR_NOMEM, "cache struct");
    const di_backend *be = opts ? opts->be : NULL;
    void *raw = NULL, *arena;
    int32_t *engram_host = NULL; /* int32 [engram_slots] */
    if (be) {
        engram_host = calloc((size_t)(sz.engram_bytes / (int64_t)sizeof(int32_t)) + 1, sizeof(int32_t));
        arena = raw = engram_host ? be->mem_alloc(be, (size_t)sz.total_bytes, err) : NULL;
    } else {
        /* aligned_alloc + memset would touch every page; calloc of a large block maps zero pages lazily */
        raw = calloc(1, (size_t)sz.total_bytes + ALIGN);
        arena = raw ? (void *)(((uintptr_t)raw + ALIGN - 1) / ALIGN * ALIGN) : NULL;
    }
    if (!raw) {
        free(engram_host);
        free(c);
        return di_error_set(err, DI_ERR_NOMEM, "cache: cannot allocate %lld bytes%s%s", (long long)sz.total_bytes,
                            be ? " of backend memory on " : "", be ? be->name : "");
    }
    rc = cache_init(c, cfg, opts, arena, (size_t)sz.total_bytes, be, engram_host, 0, err);
    c->owns_arena = 1, c->arena_raw = raw, c->be = be, c->engram_host = engram_host;
    if (rc) {
        di_cache_destroy(c);
        return rc;
    }
    *out = c;
    return DI_OK;
}

void di_cache_destroy(di_cache *c) {
    if (!c) return;
    if (c->pool) {
        di_cache_pool_put(c);
        return;
    }
    if (c->owns_arena && c->be)
        c->be->mem_free(c->be, c->arena_raw);
    else if (c->owns_arena)
        free(c->arena_raw);
    free(c->engram_host);
    free(c);
}

/* ---------------- positions ---------------- */

int di_cache_extend(di_cache *c, int64_t k, di_error *err) {
    if (k < 0 || k > c->max_tokens - c->n)
        return di_error_set(err, k < 0 ? DI_ERR_INVALID : DI_ERR_LIMIT,
                            "cache: cannot append %lld tokens to %lld (capacity %lld)", (long long)k, (long long)c->n,
                            (long long)c->max_tokens);
    if (c->pool) {
        int rc = di_cache_pool_cover(c, c->n + k, err);
        if (rc) return rc;
    }
    c->n += k;
    if (c->n > c->n_max) c->n_max = c->n;
    return DI_OK;
}

int di_cache_rollback(di_cache *c, int64_t k, di_error *err) {
    if (k < 0 || k > di_cache_rollback_limit(c))
        return di_error_set(err, k < 0 ? DI_ERR_INVALID : DI_ERR_LIMIT,
                            "cache: cannot roll back %lld of %lld tokens exactly (limit %lld: margin %d, %lld appended "
                            "at most)",
                            (long long)k, (long long)c->n, (long long)di_cache_rollback_limit(c), c->spec_margin,
                            (long long)c->n_max);
    int64_t p = c->n - k;
    /* Entries completed by the dropped tokens go back to zero, so the compressed arrays' bytes
     * match a sequence that never saw them. The rings need nothing: the window and history slots
     * of positions < p are intact (k ≤ m), and the pending compressor rows of group ⌊p/R⌋ were
     * never touched (the dropped tokens wrote rows ≥ p mod R of that block and newer blocks). */
    for (int st = 0; st < c->n_stages; st++) {
        if (c->win_n[st] > p) c->win_n[st] = p;
        const di_cache_stage *s = &c->stage[st];
        if (!s->ratio) continue;
        int64_t e0 = p / s->ratio, e1 = c->n / s->ratio;
        if (c->cmp_n[st] > e0) c->cmp_n[st] = e0;
        if (c->ikey_n[st] > e0) c->ikey_n[st] = e0;
        if (c->cmp_frozen[st] > e0) c->cmp_frozen[st] = e0; /* re-appended entries are the sequence's own */
        for (int64_t e = e0, run; e < e1; e += run) { /* one run per page of a paged cache */
            run = di_cache_entry_run(c, st, e, e1);
            size_t nc = (size_t)(run * c->cmp_entry_bytes), nk = (size_t)(run * c->index_key_bytes);
            uint8_t *pc = di_cache_cmp_at(c, st, e), *pk = di_cache_ikey_at(c, st, e);
            if (c->be) {
                int rc = c->be->mem_set(c->be, pc, 0, nc, err);
                if (!rc) rc = c->be->mem_set(c->be, pk, 0, nk, err);
                if (rc) return rc;
            } else {
                memset(pc, 0, nc);
                memset(pk, 0, nk);
            }
        }
    }
    if (c->engram_n > p) c->engram_n = p;
    c->n = p;
    return DI_OK;
}

int64_t di_cache_n_entries(const di_cache *c, int stage) {
    if (stage < 0 || stage >= c->n_stages || !c->stage[stage].ratio) return 0;
    return c->n / c->stage[stage].ratio;
}

/* ---------------- canonical image ---------------- */

/* Writes (or, with out == NULL, only counts) the image; *pos advances in both cases. put_host copies
 * host bookkeeping (n, the Engram history), put_arena reads arena bytes where the arena lives. */
static void put_host(uint8_t *out, int64_t cap, int64_t *pos, const void *src, int64_t n) {
    if (out && *pos + n <= cap) memcpy(out + *pos, src, (size_t)n);
    *pos += n;
}

static void put_arena(const di_cache *c, uint8_t *out, int64_t cap, int64_t *pos, const void *src, int64_t n) {
    if (out && *pos + n <= cap) {
        di_error ignored; /* a failed download leaves zeros: the image then differs, as it should */
        if (di_cache_arena_read(c, out + *pos, src, (size_t)n, &ignored)) memset(out + *pos, 0, (size_t)n);
    }
    *pos += n;
}

static void image_walk(const di_cache *c, uint8_t *out, int64_t cap, int64_t *pos) {
    put_host(out, cap, pos, &c->n, sizeof c->n);
    int64_t w0 = c->n > c->window ? c->n - c->window : 0;
    for (int st = 0; st < c->n_stages; st++) {
        const di_cache_stage *s = &c->stage[st];
        for (int64_t q = w0; q < c->n; q++)
            put_arena(c, out, cap, pos, s->window + (q % c->ring_slots) * c->window_slot_bytes, c->window_slot_bytes);
        if (!s->ratio) continue;
        int64_t ne = c->n / s->ratio;
        for (int64_t e = 0, run; e < ne; e += run) {
            run = di_cache_entry_run(c, st, e, ne);
            put_arena(c, out, cap, pos, di_cache_cmp_at(c, st, e), run * c->cmp_entry_bytes);
        }
        for (int64_t e = 0, run; e < ne; e += run) {
            run = di_cache_entry_run(c, st, e, ne);
            put_arena(c, out, cap, pos, di_cache_ikey_at(c, st, e), run * c->index_key_bytes);
        }
        if (!s->state) continue;
        int64_t g = c->n / s->ratio, pending = c->n % s->ratio, rows = (int64_t)s->ratio * c->head_dim;
        const float *kv = s->state + (g % s->state_blocks) * 2 * rows;
        put_arena(c, out, cap, pos, kv, pending * c->head_dim * (int64_t)sizeof(float));
        put_arena(c, out, cap, pos, kv + rows, pending * c->head_dim * (int64_t)sizeof(float));
    }
    int64_t h0 = c->n > c->engram_hist ? c->n - c->engram_hist : 0;
    for (int64_t q = h0; c->engram_slots && q < c->n; q++)
        put_host(out, cap, pos, &c->engram[q % c->engram_slots], sizeof(int32_t));
}

int64_t di_cache_image_bytes(const di_cache *c) {
    int64_t n = 0;
    image_walk(c, NULL, 0, &n);
    return n;
}

int di_cache_image(const di_cache *c, uint8_t *out, int64_t cap, int64_t *written, di_error *err) {
    int64_t need = di_cache_image_bytes(c);
    if (written) *written = need;
    if (!out || cap == 0) return DI_OK;
    if (cap < need)
        return di_error_set(err, DI_ERR_LIMIT, "cache image: %lld bytes needed, buffer holds %lld", (long long)need,
                            (long long)cap);
    int64_t pos = 0;
    image_walk(c, out, cap, &pos);
    return DI_OK;
}
