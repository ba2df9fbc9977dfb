/* Prefix export / import of the compact caches for the prefix cache's bounded replay (cache.h,
 * deepinfer-features §11): only the append-only compressed arrays move (downloaded from / uploaded to
 * a backend arena); the window rings are rebuilt by the replay and the compressor state at an aligned
 * boundary is the reset state. */
#include <string.h>

#include "model/cache.h"
#include "model/cache_pool.h"
#include "util/error.h"

static int gcd(int a, int b) { return b ? gcd(b, a % b) : a; }

int di_cache_prefix_align(const di_cache *c) {
    int a = 1;
    for (int st = 0; st < c->n_stages; st++)
        if (c->stage[st].ratio) a = a / gcd(a, c->stage[st].ratio) * c->stage[st].ratio;
    return a;
}

int64_t di_cache_prefix_span_bytes(const di_cache *c, int64_t t0, int64_t t1) {
    int64_t n = 0;
    for (int st = 0; st < c->n_stages; st++) {
        int R = c->stage[st].ratio;
        if (R) n += (t1 / R - t0 / R) * (c->cmp_entry_bytes + c->index_key_bytes);
    }
    return n;
}

static int check_span(const di_cache *c, int64_t t0, int64_t t1, int64_t limit, const char *what, di_error *err) {
    int a = di_cache_prefix_align(c);
    if (t0 < 0 || t1 < t0 || t1 > limit || t0 % a || t1 % a)
        return di_error_set(err, DI_ERR_INVALID,
                            "cache prefix %s: span [%lld, %lld) (expected multiples of %d within [0, %lld])", what,
                            (long long)t0, (long long)t1, a, (long long)limit);
    return DI_OK;
}

int di_cache_prefix_export(const di_cache *c, int64_t t0, int64_t t1, uint8_t *out, int64_t cap, di_error *err) {
    int rc = check_span(c, t0, t1, c->n, "export", err);
    if (rc) return rc;
    int64_t need = di_cache_prefix_span_bytes(c, t0, t1), pos = 0;
    if (cap < need)
        return di_error_set(err, DI_ERR_LIMIT, "cache prefix export: %lld bytes needed, buffer holds %lld",
                            (long long)need, (long long)cap);
    for (int st = 0; st < c->n_stages; st++) {
        const di_cache_stage *s = &c->stage[st];
        if (!s->ratio) continue;
        int64_t e0 = t0 / s->ratio, e1 = t1 / s->ratio;
        if (c->cmp_n[st] < e1 || c->ikey_n[st] < e1)
            return di_error_set(err, DI_ERR_INVALID,
                                "cache prefix export: stage %d entries [%lld, %lld) not all written (%lld / %lld)", st,
                                (long long)e0, (long long)e1, (long long)c->cmp_n[st], (long long)c->ikey_n[st]);
        for (int64_t e = e0, run; !rc && e < e1; e += run, pos += run * c->cmp_entry_bytes) {
            run = di_cache_entry_run(c, st, e, e1); /* one copy per page of a paged cache */
            rc = di_cache_arena_read(c, out + pos, di_cache_cmp_at(c, st, e), (size_t)(run * c->cmp_entry_bytes), err);
        }
        for (int64_t e = e0, run; !rc && e < e1; e += run, pos += run * c->index_key_bytes) {
            run = di_cache_entry_run(c, st, e, e1);
            rc = di_cache_arena_read(c, out + pos, di_cache_ikey_at(c, st, e), (size_t)(run * c->index_key_bytes), err);
        }
        if (rc) return rc;
    }
    return DI_OK;
}

int di_cache_prefix_begin(di_cache *c, int64_t boundary, int64_t replay_start, di_error *err) {
    int a = di_cache_prefix_align(c);
    if (boundary < 0 || boundary > c->max_tokens || replay_start < 0 || replay_start > boundary || boundary % a ||
        replay_start % a)
        return di_error_set(err, DI_ERR_INVALID,
                            "cache prefix begin: boundary %lld, replay start %lld (expected 0 <= start <= boundary "
                            "<= %lld, multiples of %d)",
                            (long long)boundary, (long long)replay_start, (long long)c->max_tokens, a);
    di_cache_reset(c);
    if (c->pool) { /* the imports fill entries up to the boundary: pages must cover it */
        int rc = di_cache_pool_cover(c, boundary, err);
        if (rc) return rc;
    }
    c->n = c->n_max = replay_start;
    c->win_floor = replay_start;
    c->engram_hi = c->engram_n = 0; /* the caller puts the history of [r − (G−1), r) */
    for (int st = 0; st < c->n_stages; st++) {
        /* no window position below r was written: win_hi = win_n = r makes every one unreadable
         * even without the floor, and the first replayed row lands in its own slot */
        c->win_hi[st] = c->win_n[st] = replay_start;
        const di_cache_stage *s = &c->stage[st];
        if (!s->ratio) continue;
        c->cmp_frozen[st] = boundary / s->ratio;
        c->cmp_n[st] = c->ikey_n[st] = 0; /* raised by the imports, which must be contiguous from 0 */
        c->state_hi[st] = replay_start / s->ratio; /* groups before r are complete; the blocks hold reset rows */
    }
    return DI_OK;
}

int di_cache_prefix_import(di_cache *c, int64_t t0, int64_t t1, const uint8_t *src, int64_t bytes, di_error *err) {
    int64_t limit = 0;
    for (int st = 0; st < c->n_stages; st++)
        if (c->stage[st].ratio) limit = c->cmp_frozen[st] * c->stage[st].ratio;
    int rc = check_span(c, t0, t1, limit, "import", err);
    if (rc) return rc;
    int64_t need = di_cache_prefix_span_bytes(c, t0, t1), pos = 0;
    if (bytes != need)
        return di_error_set(err, DI_ERR_INVALID, "cache prefix import: span [%lld, %lld) has %lld bytes, expected %lld",
                            (long long)t0, (long long)t1, (long long)bytes, (long long)need);
    for (int st = 0; st < c->n_stages; st++) {
        di_cache_stage *s = &c->stage[st];
        if (!s->ratio) continue;
        int64_t e0 = t0 / s->ratio, e1 = t1 / s->ratio;
        if (c->cmp_n[st] != e0)
            return di_error_set(err, DI_ERR_INVALID,
                                "cache prefix import: stage %d span starts at entry %lld, %lld imported so far", st,
                                (long long)e0, (long long)c->cmp_n[st]);
        if (c->pool && (rc = di_cache_pool_cover(c, t1, err))) return rc; /* the boundary may lie past n */
        for (int64_t e = e0, run; !rc && e < e1; e += run, pos += run * c->cmp_entry_bytes) {
            run = di_cache_entry_run(c, st, e, e1);
            rc = di_cache_arena_write(c, di_cache_cmp_at(c, st, e), src + pos, (size_t)(run * c->cmp_entry_bytes), err);
        }
        for (int64_t e = e0, run; !rc && e < e1; e += run, pos += run * c->index_key_bytes) {
            run = di_cache_entry_run(c, st, e, e1);
            rc = di_cache_arena_write(c, di_cache_ikey_at(c, st, e), src + pos, (size_t)(run * c->index_key_bytes),
                                      err);
        }
        if (rc) return rc;
        c->cmp_n[st] = c->ikey_n[st] = e1;
    }
    return DI_OK;
}
