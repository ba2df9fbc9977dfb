/* Per-sequence cache store: writing rows in the compact form and reading them back (spec model.md
 * §4.4, §4.7, §5.3, §5.5). Quantization is io/formats.h's, with the reference's group sizes:
 *   window row      FP8 e4m3, E8M0 power-of-two scale per 32 values     di_act_quant_fp8 (…, 32)
 *   compressed KV   E2M1, E4M3 scale per 16 values                      di_fp4_quant_e4m3 (…, 16)
 *   index key       E2M1, E8M0 power-of-two scale per 32 values         di_fp4_quant_e8m0 (…, 32)
 * A read computes bf16(f32(code) · f32(scale)). The product — an e4m3 or E2M1 value times a power
 * of two or an e4m3 scale: at most 6 significant bits, at least 2^-136 when nonzero — is exact in
 * f32, so its one bf16 rounding is the rounding the reference's QDQ performs: the value equals the
 * reference's cached bf16 bit for bit (tests/test_cache.c checks it on the reference's vectors).
 * The codecs run where the arena lives: the backend's row_encode / row_decode ops for a backend
 * arena (the CUDA kernels are bit-exact to the host ones: tests/cuda/test_cuda_cache.c), the host
 * codecs of backend/cpu/row_codec.c otherwise. Every check runs on the host before any byte moves. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "model/cache.h"
#include "util/error.h"

/* The compact forms (backend.h di_row_codec): the groups are the reference's. */
#define WINDOW_CODEC DI_CODEC_FP8_E8M0 /* window: act_quant block of 32 (§4.1, §4.4) */
#define KV_CODEC DI_CODEC_FP4_E4M3     /* compressed KV: FP4 with E4M3 scales per 16 (§4.1) */
#define KEY_CODEC DI_CODEC_FP4_E8M0    /* index keys: FP4 with E8M0 scales per 32 (§4.4) */

static int count_sources(const di_cache *c) {
    int n = 0;
    for (int st = 0; st < c->n_stages; st++) n += c->stage[st].ratio > 0;
    return n;
}

/* Every stage has a window ring; only kv sources have entries and compressor state. */
static int window_stage(const di_cache *c, int stage, const char *what, di_error *err) {
    if (stage < 0 || stage >= c->n_stages)
        return di_error_set(err, DI_ERR_INVALID, "cache %s: stage %d (expected 0 … %d)", what, stage, c->n_stages - 1);
    return DI_OK;
}

static int source_stage(const di_cache *c, int stage, const char *what, di_error *err) {
    if (stage < 0 || stage >= c->n_stages || !c->stage[stage].ratio)
        return di_error_set(err, DI_ERR_INVALID, "cache %s: stage %d is not a kv source (expected one of the %d stages "
                            "with a compressed cache)", what, stage, count_sources(c));
    return DI_OK;
}

/* ---------------- codecs where the arena lives ---------------- */

/* rows [n] of the codec at dst ← x bf16 [n, d] (x in the arena's memory). */
static int encode(const di_cache *c, di_row_codec codec, const uint16_t *x, int64_t n, int64_t d, uint8_t *dst,
                  di_error *err) {
    if (c->be) return c->be->row_encode(c->be, codec, x, n, d, dst, err);
    for (int64_t i = 0; i < n; i++) di_cpu_row_encode(codec, x + i * d, d, dst + i * di_row_codec_bytes(codec, d));
    return DI_OK;
}

/* y bf16 [n, d] ← rows[ids ? ids[i] : i] of base; ids (host, validated by the caller) are uploaded for
 * a device arena; −1 gives a zero row. */
static int decode(const di_cache *c, di_row_codec codec, const uint8_t *base, const int32_t *ids, int64_t n, int64_t d,
                  uint16_t *y, di_error *err) {
    if (n <= 0) return DI_OK;
    const di_backend *be = c->be;
    if (!be) {
        for (int64_t i = 0; i < n; i++) {
            int64_t r = ids ? ids[i] : i;
            if (r < 0)
                memset(y + i * d, 0, sizeof(uint16_t) * (size_t)d);
            else
                di_cpu_row_decode(codec, base + r * di_row_codec_bytes(codec, d), d, y + i * d);
        }
        return DI_OK;
    }
    if (!ids || be->host_memory) return be->row_decode(be, codec, base, ids, n, d, y, err);
    int32_t *dids = be->mem_alloc(be, sizeof(int32_t) * (size_t)n, err); /* int32 [n] backend copy */
    if (!dids) return err ? err->code : DI_ERR_NOMEM;
    int rc = be->mem_upload(be, dids, ids, sizeof(int32_t) * (size_t)n, err);
    if (!rc) rc = be->row_decode(be, codec, base, dids, n, d, y, err);
    be->mem_free(be, dids);
    return rc;
}

/* ---------------- window rings ---------------- */

static uint8_t *ring_slot(const di_cache *c, int stage, int64_t pos) {
    return c->stage[stage].window + (pos % c->ring_slots) * c->window_slot_bytes;
}

/* Position pos of this ring holds what the current sequence wrote for it: appended (pos < n),
 * written since the last rollback (pos < win_n) and not overwritten by a newer position in the
 * same slot (pos ≥ win_hi − slots). */
static int window_readable(const di_cache *c, int stage, int64_t pos, const char *what, di_error *err) {
    int64_t hi = c->win_hi[stage];
    if (pos < c->win_floor)
        return di_error_set(err, DI_ERR_INVALID,
                            "cache %s: stage %d position %lld is below the replay start %lld (its window was not "
                            "rebuilt)",
                            what, stage, (long long)pos, (long long)c->win_floor);
    if (pos < 0 || pos >= c->n || pos >= c->win_n[stage] || pos < hi - c->ring_slots)
        return di_error_set(err, DI_ERR_INVALID,
                            "cache %s: stage %d position %lld is not held (appended %lld, written up to %lld, ring of "
                            "%lld slots overwritten up to %lld)",
                            what, stage, (long long)pos, (long long)c->n, (long long)c->win_n[stage],
                            (long long)c->ring_slots, (long long)(hi - c->ring_slots));
    return DI_OK;
}

int di_cache_window_put(di_cache *c, int stage, int64_t pos, const uint16_t *row, di_error *err) {
    int rc = window_stage(c, stage, "window put", err);
    if (rc) return rc;
    if (pos < 0 || pos >= c->n || pos < c->n - c->ring_slots)
        return di_error_set(err, DI_ERR_INVALID,
                            "cache window put: stage %d position %lld (expected an appended position in [%lld, %lld))",
                            stage, (long long)pos, (long long)(c->n > c->ring_slots ? c->n - c->ring_slots : 0),
                            (long long)c->n);
    rc = encode(c, WINDOW_CODEC, row, 1, c->head_dim, ring_slot(c, stage, pos), err);
    if (rc) return rc;
    if (pos + 1 > c->win_hi[stage]) c->win_hi[stage] = pos + 1;
    if (pos + 1 > c->win_n[stage]) c->win_n[stage] = pos + 1;
    return DI_OK;
}

int di_cache_window_put_rows(di_cache *c, int stage, int64_t pos0, int64_t count, const uint16_t *rows,
                             di_error *err) {
    if (count < 0 || pos0 < 0 || pos0 > c->n - count)
        return di_error_set(err, DI_ERR_INVALID,
                            "cache window put: positions [%lld, %lld) (expected appended positions, n = %lld)",
                            (long long)pos0, (long long)(pos0 + count), (long long)c->n);
    int rc = window_stage(c, stage, "window put", err);
    if (rc) return rc;
    /* rows older than the ring's reach would be overwritten by the chunk's own newer rows; the rest
     * is one run of ring slots, split where it wraps */
    int64_t first = c->n - c->ring_slots > pos0 ? c->n - c->ring_slots : pos0, end = pos0 + count;
    for (int64_t p = first; p < end;) {
        int64_t run = c->ring_slots - p % c->ring_slots;
        if (run > end - p) run = end - p;
        rc = encode(c, WINDOW_CODEC, rows + (p - pos0) * c->head_dim, run, c->head_dim, ring_slot(c, stage, p), err);
        if (rc) return rc;
        p += run;
    }
    if (end > first) {
        if (end > c->win_hi[stage]) c->win_hi[stage] = end;
        if (end > c->win_n[stage]) c->win_n[stage] = end;
    }
    return DI_OK;
}

int di_cache_window_rows(const di_cache *c, int stage, int64_t p0, int64_t p1, uint16_t *rows, di_error *err) {
    int rc = window_stage(c, stage, "window read", err);
    if (rc) return rc;
    if (p0 < 0 || p1 < p0)
        return di_error_set(err, DI_ERR_INVALID, "cache window read: positions [%lld, %lld)", (long long)p0,
                            (long long)p1);
    for (int64_t p = p0; p < p1; p++) {
        int rc = window_readable(c, stage, p, "window read", err);
        if (rc) return rc;
    }
    for (int64_t p = p0; p < p1;) { /* runs of consecutive slots */
        int64_t run = c->ring_slots - p % c->ring_slots;
        if (run > p1 - p) run = p1 - p;
        int rc = decode(c, WINDOW_CODEC, ring_slot(c, stage, p), NULL, run, c->head_dim, rows + (p - p0) * c->head_dim,
                        err);
        if (rc) return rc;
        p += run;
    }
    return DI_OK;
}

int di_cache_window_gather(const di_cache *c, int stage, int64_t pos, uint16_t *rows, int32_t *idx,
                           di_error *err) {
    int rc = window_stage(c, stage, "window gather", err);
    if (rc) return rc;
    int W = c->window, hd = c->head_dim;
    /* The reference's ring of W slots listed from slot (pos mod W)+1 onwards is, position-wise,
     * pos−W+1 … pos ascending; slots not yet written (positions < 0) stay in the list as −1. */
    int32_t *slots = malloc(sizeof(int32_t) * (size_t)W); /* int32 [W] ring slot of entry j, −1: none */
    if (!slots) return di_error_set(err, DI_ERR_NOMEM, "cache window gather: %d slots", W);
    for (int j = 0; j < W; j++) {
        int64_t q = pos - W + 1 + j;
        if (q < 0) {
            idx[j] = slots[j] = -1;
            continue;
        }
        int rc = window_readable(c, stage, q, "window gather", err);
        if (rc) {
            free(slots);
            return rc;
        }
        idx[j] = j;
        slots[j] = (int32_t)(q % c->ring_slots);
    }
    rc = decode(c, WINDOW_CODEC, c->stage[stage].window, slots, W, hd, rows, err);
    free(slots);
    return rc;
}

int di_cache_dspark_gather(const di_cache *c, int stage, int64_t pos, uint16_t *rows, int64_t *n_rows,
                           di_error *err) {
    int rc = window_stage(c, stage, "dspark gather", err);
    if (rc) return rc;
    if (pos < 0) return di_error_set(err, DI_ERR_INVALID, "cache dspark gather: position %lld", (long long)pos);
    int64_t W = c->window, n = pos + 1 < W ? pos + 1 : W;
    int32_t *slots = malloc(sizeof(int32_t) * (size_t)n); /* int32 [n] ring slot of W-slot s */
    if (!slots) return di_error_set(err, DI_ERR_NOMEM, "cache dspark gather: %lld slots", (long long)n);
    /* slot order of the W-slot ring: slot s holds the newest position ≤ pos congruent to s */
    for (int64_t s = 0; s < n; s++) {
        int64_t q = pos - (pos - s) % W;
        int rc = window_readable(c, stage, q, "dspark gather", err);
        if (rc) {
            free(slots);
            return rc;
        }
        slots[s] = (int32_t)(q % c->ring_slots);
    }
    rc = decode(c, WINDOW_CODEC, c->stage[stage].window, slots, n, c->head_dim, rows, err);
    free(slots);
    if (!rc) *n_rows = n;
    return rc;
}

/* ---------------- compressed KV and index keys ---------------- */

/* Entries [e0, e1) exist: completed by the appended tokens (e1 ≤ ⌊n/R⌋) and, for a read (written
 * = the entries written since the last rollback, else −1), written. */
static int entry_range(const di_cache *c, int stage, int64_t e0, int64_t e1, int64_t written, const char *what,
                       di_error *err) {
    int64_t ne = c->n / c->stage[stage].ratio;
    if (e0 < 0 || e1 < e0 || e1 > ne)
        return di_error_set(err, DI_ERR_INVALID,
                            "cache %s: stage %d entries [%lld, %lld) (expected within the %lld entries the %lld "
                            "appended tokens complete)",
                            what, stage, (long long)e0, (long long)e1, (long long)ne, (long long)c->n);
    if (written >= 0 && e1 > written)
        return di_error_set(err, DI_ERR_INVALID, "cache %s: stage %d entries [%lld, %lld) read, only %lld written",
                            what, stage, (long long)e0, (long long)e1, (long long)written);
    return DI_OK;
}

/* Entries [e0, e1) of the compressed KV (ikey = 0) or index keys (1), dequantized into out. A range
 * within one page (or a contiguous cache) is one decode of consecutive rows; a range over several
 * pages is one gathered decode through the block table (one kernel launch on a device, whatever the
 * number of pages: the indexer reads all keys every step). */
static int decode_entries(const di_cache *c, int stage, int ikey, int64_t e0, int64_t e1, uint16_t *out,
                          di_error *err) {
    const di_row_codec codec = ikey ? KEY_CODEC : KV_CODEC;
    const int64_t d = ikey ? c->index_head_dim : c->head_dim;
    if (e1 <= e0) return DI_OK;
    if (di_cache_entry_run(c, stage, e0, e1) == e1 - e0)
        return decode(c, codec, ikey ? di_cache_ikey_at(c, stage, e0) : di_cache_cmp_at(c, stage, e0), NULL, e1 - e0,
                      d, out, err);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(e1 - e0)); /* int32 [e1−e0] rows of the pool's array */
    if (!ids) return di_error_set(err, DI_ERR_NOMEM, "cache read: %lld entries", (long long)(e1 - e0));
    for (int64_t e = e0; e < e1; e++) ids[e - e0] = (int32_t)di_cache_entry_row(c, stage, e, ikey);
    const di_cache_stage *s = &c->stage[stage];
    int rc = decode(c, codec, ikey ? s->ikey : s->cmp, ids, e1 - e0, d, out, err);
    free(ids);
    return rc;
}

int di_cache_cmp_put(di_cache *c, int stage, int64_t e, const uint16_t *row, di_error *err) {
    int rc = source_stage(c, stage, "compressed put", err);
    if (rc) return rc;
    rc = entry_range(c, stage, e, e + 1, -1, "compressed put", err);
    if (rc) return rc;
    if (e < c->cmp_frozen[stage]) return DI_OK; /* restored from the prefix cache: keep the exact entry */
    rc = encode(c, KV_CODEC, row, 1, c->head_dim, di_cache_cmp_at(c, stage, e), err);
    if (rc) return rc;
    if (e + 1 > c->cmp_n[stage]) c->cmp_n[stage] = e + 1;
    return DI_OK;
}

int di_cache_ikey_put(di_cache *c, int stage, int64_t e, const uint16_t *key, di_error *err) {
    int rc = source_stage(c, stage, "index key put", err);
    if (rc) return rc;
    rc = entry_range(c, stage, e, e + 1, -1, "index key put", err);
    if (rc) return rc;
    if (e < c->cmp_frozen[stage]) return DI_OK; /* restored from the prefix cache: keep the exact entry */
    rc = encode(c, KEY_CODEC, key, 1, c->index_head_dim, di_cache_ikey_at(c, stage, e), err);
    if (rc) return rc;
    if (e + 1 > c->ikey_n[stage]) c->ikey_n[stage] = e + 1;
    return DI_OK;
}

int di_cache_cmp_rows(const di_cache *c, int stage, int64_t e0, int64_t e1, uint16_t *rows, di_error *err) {
    int rc = source_stage(c, stage, "compressed read", err);
    if (rc) return rc;
    rc = entry_range(c, stage, e0, e1, c->cmp_n[stage], "compressed read", err);
    return rc ? rc : decode_entries(c, stage, 0, e0, e1, rows, err);
}

int di_cache_ikey_rows(const di_cache *c, int stage, int64_t e0, int64_t e1, uint16_t *keys, di_error *err) {
    int rc = source_stage(c, stage, "index key read", err);
    if (rc) return rc;
    rc = entry_range(c, stage, e0, e1, c->ikey_n[stage], "index key read", err);
    return rc ? rc : decode_entries(c, stage, 1, e0, e1, keys, err);
}

int di_cache_cmp_gather(const di_cache *c, int stage, const int32_t *ent, int64_t count, uint16_t *rows,
                        di_error *err) {
    int rc = source_stage(c, stage, "compressed gather", err);
    if (rc) return rc;
    for (int64_t i = 0; i < count; i++) {
        if (ent[i] == -1) continue;
        int rc = entry_range(c, stage, ent[i], (int64_t)ent[i] + 1, c->cmp_n[stage], "compressed gather", err);
        if (rc) return rc;
    }
    if (!c->pool) return decode(c, KV_CODEC, c->stage[stage].cmp, ent, count, c->head_dim, rows, err);
    /* paged: the ids become rows of the pool's array through the block table (page's first row +
     * offset), so the one gather still reads every selected entry wherever its page is */
    int32_t *prow = malloc(sizeof(int32_t) * (size_t)(count > 0 ? count : 1)); /* int32 [count] pool rows, −1: none */
    if (!prow) return di_error_set(err, DI_ERR_NOMEM, "cache compressed gather: %lld ids", (long long)count);
    for (int64_t i = 0; i < count; i++) prow[i] = ent[i] < 0 ? -1 : (int32_t)di_cache_entry_row(c, stage, ent[i], 0);
    rc = decode(c, KV_CODEC, c->stage[stage].cmp, prow, count, c->head_dim, rows, err);
    free(prow);
    return rc;
}

/* ---------------- compressor state ---------------- */

int di_cache_cmp_state(di_cache *c, int stage, int64_t pos, float **kv_state, float **score_state,
                       di_error *err) {
    int rc = source_stage(c, stage, "compressor state", err);
    if (rc) return rc;
    di_cache_stage *s = &c->stage[stage];
    if (!s->state)
        return di_error_set(err, DI_ERR_INVALID, "cache compressor state: stage %d has ratio %d (no pooling state)",
                            stage, s->ratio);
    int64_t g = pos / s->ratio;
    if (pos < 0 || pos >= c->n || g < c->state_hi[stage] - s->state_blocks)
        return di_error_set(err, DI_ERR_INVALID,
                            "cache compressor state: stage %d position %lld (expected < %lld appended, in one of the "
                            "%d newest groups; newest handed out: %lld)",
                            stage, (long long)pos, (long long)c->n, s->state_blocks,
                            (long long)(c->state_hi[stage] - 1));
    if (g + 1 > c->state_hi[stage]) c->state_hi[stage] = g + 1;
    int64_t half = (int64_t)s->ratio * c->head_dim;
    float *kv = s->state + (g % s->state_blocks) * 2 * half;
    *kv_state = kv;
    *score_state = kv + half;
    return DI_OK;
}

/* ---------------- batched rows: addresses for one call per pass ---------------- */

int di_cache_window_put_addrs(di_cache *c, int stage, int64_t pos0, int64_t count, uint8_t **dst, di_error *err) {
    if (count < 0 || pos0 < 0 || pos0 > c->n - count)
        return di_error_set(err, DI_ERR_INVALID,
                            "cache window put: positions [%lld, %lld) (expected appended positions, n = %lld)",
                            (long long)pos0, (long long)(pos0 + count), (long long)c->n);
    int rc = window_stage(c, stage, "window put", err);
    if (rc) return rc;
    /* as di_cache_window_put_rows: rows older than the ring's reach would share a slot with a newer
     * row of the same call, so they are skipped, and the listed slots are distinct */
    int64_t first = c->n - c->ring_slots > pos0 ? c->n - c->ring_slots : pos0, end = pos0 + count;
    for (int64_t p = pos0; p < end; p++) dst[p - pos0] = p < first ? NULL : ring_slot(c, stage, p);
    if (end > first) {
        if (end > c->win_hi[stage]) c->win_hi[stage] = end;
        if (end > c->win_n[stage]) c->win_n[stage] = end;
    }
    return DI_OK;
}

int di_cache_window_read_addrs(const di_cache *c, int stage, int64_t p0, int64_t p1, const uint8_t **src,
                               di_error *err) {
    int rc = window_stage(c, stage, "window read", err);
    if (rc) return rc;
    if (p0 < 0 || p1 < p0)
        return di_error_set(err, DI_ERR_INVALID, "cache window read: positions [%lld, %lld)", (long long)p0,
                            (long long)p1);
    for (int64_t p = p0; p < p1; p++) {
        rc = window_readable(c, stage, p, "window read", err);
        if (rc) return rc;
        src[p - p0] = ring_slot(c, stage, p);
    }
    return DI_OK;
}

int di_cache_entry_put_addrs(di_cache *c, int stage, int ikey, int64_t e0, int64_t e1, uint8_t **dst, di_error *err) {
    const char *what = ikey ? "index key put" : "compressed put";
    int rc = source_stage(c, stage, what, err);
    if (rc) return rc;
    rc = entry_range(c, stage, e0, e1, -1, what, err);
    if (rc) return rc;
    /* entries restored from the prefix cache keep their exact bytes (di_cache_cmp_put) */
    for (int64_t e = e0; e < e1; e++)
        dst[e - e0] = e < c->cmp_frozen[stage] ? NULL : ikey ? di_cache_ikey_at(c, stage, e) : di_cache_cmp_at(c, stage, e);
    int64_t *mark = ikey ? &c->ikey_n[stage] : &c->cmp_n[stage];
    if (e1 > c->cmp_frozen[stage] && e1 > *mark) *mark = e1;
    return DI_OK;
}

int di_cache_entry_read_addrs(const di_cache *c, int stage, int ikey, int64_t e0, int64_t e1, const uint8_t **src,
                              di_error *err) {
    const char *what = ikey ? "index key read" : "compressed read";
    int rc = source_stage(c, stage, what, err);
    if (rc) return rc;
    rc = entry_range(c, stage, e0, e1, ikey ? c->ikey_n[stage] : c->cmp_n[stage], what, err);
    if (rc) return rc;
    /* page by page: one table lookup per page, then consecutive rows (a 64K-context decode step lists
     * ~16K entries per sequence and index layer; a lookup with its divisions per entry was ~11 ns each,
     * 23 ms of host time per index layer at 64 sequences on the H200 host, bench/NOTES-gpu.md) */
    const int64_t bytes = ikey ? c->index_key_bytes : c->cmp_entry_bytes;
    for (int64_t e = e0; e < e1;) {
        const int64_t run = di_cache_entry_run(c, stage, e, e1);
        const uint8_t *p = ikey ? di_cache_ikey_at(c, stage, e) : di_cache_cmp_at(c, stage, e);
        for (int64_t j = 0; j < run; j++) src[e - e0 + j] = p + j * bytes;
        e += run;
    }
    return DI_OK;
}

int di_cache_ikey_layout_of(const di_cache *c, int stage, int64_t n, di_cache_ikey_layout *out, di_error *err) {
    int rc = source_stage(c, stage, "index key layout", err);
    if (!rc) rc = entry_range(c, stage, 0, n, c->ikey_n[stage], "index key layout", err);
    if (rc) return rc;
    const di_cache_stage *s = &c->stage[stage];
    *out = (di_cache_ikey_layout){.base = s->ikey, .pages = c->pool ? c->pages : NULL,
                                  .n_pages = c->pool ? c->n_pages : 0, .page_entries = s->page_entries,
                                  .page_rows = c->pool ? c->ikey_page_rows : 0, .row0 = c->pool ? s->ikey_row0 : 0};
    return DI_OK;
}

/* The list travels to backend memory for the one call (an address list is data the kernel reads). */
static int addr_list(const di_backend *be, const void *host, int64_t n, void **out, di_error *err) {
    *out = (void *)host;
    if (be->host_memory) return DI_OK;
    void *d = be->mem_alloc(be, sizeof(void *) * (size_t)n, err); /* pointer [n] backend copy */
    if (!d) return err ? err->code : DI_ERR_NOMEM;
    int rc = be->mem_upload(be, d, host, sizeof(void *) * (size_t)n, err);
    if (rc) {
        be->mem_free(be, d);
        return rc;
    }
    *out = d;
    return DI_OK;
}

static di_row_codec kind_codec(di_cache_rows_kind kind) {
    return kind == DI_CACHE_ROWS_WINDOW ? WINDOW_CODEC : kind == DI_CACHE_ROWS_CMP ? KV_CODEC : KEY_CODEC;
}

int di_cache_rows_encode_list(const di_backend *be, di_cache_rows_kind kind, const uint16_t *x, int64_t n, int64_t d,
                              uint8_t *const *dst_list, di_error *err) {
    if (n <= 0) return DI_OK;
    return be->row_encode_scatter(be, kind_codec(kind), x, n, d, dst_list, err);
}

int di_cache_rows_decode_list(const di_backend *be, di_cache_rows_kind kind, const uint8_t *const *src_list,
                              int64_t n, int64_t d, uint16_t *y, di_error *err) {
    if (n <= 0) return DI_OK;
    return be->row_decode_gather(be, kind_codec(kind), src_list, n, d, y, err);
}

int di_cache_rows_encode(const di_backend *be, di_cache_rows_kind kind, const uint16_t *x, int64_t n, int64_t d,
                         uint8_t *const *dst, di_error *err) {
    if (n <= 0) return DI_OK;
    void *list;
    int rc = addr_list(be, dst, n, &list, err);
    if (rc) return rc;
    rc = be->row_encode_scatter(be, kind_codec(kind), x, n, d, (uint8_t *const *)list, err);
    if (list != (void *)dst) be->mem_free(be, list);
    return rc;
}

int di_cache_rows_decode(const di_backend *be, di_cache_rows_kind kind, const uint8_t *const *src, int64_t n,
                         int64_t d, uint16_t *y, di_error *err) {
    if (n <= 0) return DI_OK;
    void *list;
    int rc = addr_list(be, src, n, &list, err);
    if (rc) return rc;
    rc = be->row_decode_gather(be, kind_codec(kind), (const uint8_t *const *)list, n, d, y, err);
    if (list != (const void *)src) be->mem_free(be, list);
    return rc;
}

int di_cache_cmp_state_ring(di_cache *c, int stage, int64_t p0, int64_t p1, float **state, int *n_blocks,
                            di_error *err) {
    int rc = source_stage(c, stage, "compressor state", err);
    if (rc) return rc;
    di_cache_stage *s = &c->stage[stage];
    if (!s->state)
        return di_error_set(err, DI_ERR_INVALID, "cache compressor state: stage %d has ratio %d (no pooling state)",
                            stage, s->ratio);
    /* the first group must still own its block; the later ones take theirs in order, as
     * di_cache_cmp_state hands them out group by group */
    if (p0 < 0 || p1 <= p0 || p1 > c->n || p0 / s->ratio < c->state_hi[stage] - s->state_blocks)
        return di_error_set(err, DI_ERR_INVALID,
                            "cache compressor state: stage %d positions [%lld, %lld) (expected within the %lld "
                            "appended, from one of the %d newest groups; newest handed out: %lld)",
                            stage, (long long)p0, (long long)p1, (long long)c->n, s->state_blocks,
                            (long long)(c->state_hi[stage] - 1));
    int64_t g1 = (p1 - 1) / s->ratio + 1;
    if (g1 > c->state_hi[stage]) c->state_hi[stage] = g1;
    *state = s->state;
    *n_blocks = s->state_blocks;
    return DI_OK;
}

/* ---------------- Engram history ---------------- */

int di_cache_engram_put(di_cache *c, int64_t pos, int32_t id, di_error *err) {
    if (!c->engram_slots) return di_error_set(err, DI_ERR_INVALID, "cache engram put: the model has no Engram layer");
    if (pos < 0 || pos >= c->n || pos < c->n - c->engram_slots)
        return di_error_set(err, DI_ERR_INVALID,
                            "cache engram put: position %lld (expected an appended position, n = %lld)",
                            (long long)pos, (long long)c->n);
    c->engram[pos % c->engram_slots] = id;
    if (pos + 1 > c->engram_hi) c->engram_hi = pos + 1;
    if (pos + 1 > c->engram_n) c->engram_n = pos + 1;
    return DI_OK;
}

int di_cache_engram_history(const di_cache *c, int64_t pos, int32_t *out, di_error *err) {
    if (!c->engram_slots)
        return di_error_set(err, DI_ERR_INVALID, "cache engram history: the model has no Engram layer");
    if (pos < 0 || pos > c->n)
        return di_error_set(err, DI_ERR_INVALID, "cache engram history: position %lld (n = %lld)", (long long)pos,
                            (long long)c->n);
    for (int i = 1; i <= c->engram_hist; i++) {
        int64_t q = pos - i;
        if (q < 0) {
            out[i - 1] = DI_CACHE_ENGRAM_NONE;
            continue;
        }
        if (q >= c->engram_n || q < c->engram_hi - c->engram_slots)
            return di_error_set(err, DI_ERR_INVALID,
                                "cache engram history: position %lld is not held (written up to %lld, %lld slots "
                                "overwritten up to %lld)",
                                (long long)q, (long long)c->engram_n, (long long)c->engram_slots,
                                (long long)(c->engram_hi - c->engram_slots));
        out[i - 1] = c->engram[q % c->engram_slots];
    }
    return DI_OK;
}
