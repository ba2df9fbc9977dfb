/* Paged store for the compact caches: sizing, the one allocation, slots, block tables and the page
 * free list (the layout and its rationale are in cache_pool.h). */
#include "model/cache_pool.h"

#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "util/error.h"

#define ALIGN 64

static int64_t align_up(int64_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }
static int gcd(int a, int b) { return b ? gcd(b, a % b) : a; }

int di_cache_pool_align(const di_config *cfg) {
    int a = 1;
    for (int st = 0; st < cfg->n_stages; st++) {
        int r = cfg->layer[st].is_kv_source ? cfg->layer[st].compress_ratio : 0;
        if (r > 0) a = a / gcd(a, r) * r;
    }
    return a;
}

static di_cache_opts cache_opts(const di_cache_pool_opts *o) {
    return (di_cache_opts){.max_tokens = o->max_tokens, .be = o->be, .spec_margin = o->spec_margin};
}

static int32_t page_tokens_of(const di_cache_pool_opts *o) {
    return o->page_tokens > 0 ? o->page_tokens : DI_CACHE_PAGE_TOKENS_DEFAULT;
}

/* Sizes without the page and slot counts (page / slot units); checks the page size. */
static int unit_sizes(const di_config *cfg, const di_cache_pool_opts *o, di_cache_pool_size *out, di_cache_size *cs,
                      di_error *err) {
    memset(out, 0, sizeof *out);
    di_cache_opts co = cache_opts(o);
    int rc = di_cache_slot_size_of(cfg, &co, cs, err);
    if (rc) return rc;
    int32_t P = page_tokens_of(o);
    int a = di_cache_pool_align(cfg);
    if (P < 1 || P % a)
        return di_error_set(err, DI_ERR_INVALID,
                            "cache pool: page of %d positions (expected a positive multiple of %d, the compress "
                            "ratios' lcm)",
                            P, a);
    for (int st = 0; st < cfg->n_stages; st++) {
        if (!cfg->layer[st].is_kv_source) continue;
        out->cmp_page_rows += P / cfg->layer[st].compress_ratio;
    }
    out->ikey_page_rows = out->cmp_page_rows;
    out->page_bytes = out->cmp_page_rows * cs->cmp_entry_bytes + out->ikey_page_rows * cs->index_key_bytes;
    out->slot_bytes = cs->total_bytes; /* the slot plan's sections are 64-aligned: so is its total */
    return DI_OK;
}

/* total = cmp rows | ikey rows | slots, each section 64-aligned */
static int64_t total_of(const di_cache_pool_size *z, const di_cache_size *cs, int64_t n_pages, int64_t n_slots) {
    return align_up(n_pages * z->cmp_page_rows * cs->cmp_entry_bytes) +
           align_up(n_pages * z->ikey_page_rows * cs->index_key_bytes) + n_slots * z->slot_bytes;
}

int di_cache_pool_size_of(const di_config *cfg, const di_cache_pool_opts *opts, di_cache_pool_size *out,
                          di_error *err) {
    di_cache_size cs;
    int rc = unit_sizes(cfg, opts, out, &cs, err);
    if (rc) return rc;
    if (opts->n_pages < 1 || opts->n_slots < 1)
        return di_error_set(err, DI_ERR_INVALID, "cache pool: %d pages, %d slots (expected ≥ 1 of each)", opts->n_pages,
                            opts->n_slots);
    /* entry ids of the row gather are int32: the row arrays must stay indexable */
    if ((int64_t)opts->n_pages * out->cmp_page_rows > INT32_MAX)
        return di_error_set(err, DI_ERR_LIMIT, "cache pool: %d pages of %lld rows exceed the int32 row ids",
                            opts->n_pages, (long long)out->cmp_page_rows);
    out->total_bytes = total_of(out, &cs, opts->n_pages, opts->n_slots);
    return DI_OK;
}

int di_cache_pool_pages_for(const di_config *cfg, const di_cache_pool_opts *opts, int64_t budget_bytes,
                            int32_t *n_pages, di_error *err) {
    di_cache_pool_size z;
    di_cache_size cs;
    *n_pages = 0;
    int rc = unit_sizes(cfg, opts, &z, &cs, err);
    if (rc) return rc;
    int64_t rest = budget_bytes - (int64_t)opts->n_slots * z.slot_bytes - 2 * ALIGN; /* 2 section paddings */
    /* without a kv source pages hold nothing: as many as every slot's full sequence needs */
    int64_t full = (int64_t)opts->n_slots * ((opts->max_tokens + page_tokens_of(opts) - 1) / page_tokens_of(opts));
    int64_t n = z.page_bytes > 0 ? rest / z.page_bytes : rest >= 0 ? full : 0;
    if (n < 1)
        return di_error_set(err, DI_ERR_LIMIT,
                            "cache pool: a budget of %lld bytes does not hold %d fixed slots of %lld bytes and one "
                            "page of %lld bytes",
                            (long long)budget_bytes, opts->n_slots, (long long)z.slot_bytes, (long long)z.page_bytes);
    if (z.cmp_page_rows > 0 && n > INT32_MAX / z.cmp_page_rows) n = INT32_MAX / z.cmp_page_rows;
    *n_pages = (int32_t)(n > INT32_MAX ? INT32_MAX : n);
    return DI_OK;
}

int di_cache_pool_create(const di_config *cfg, const di_cache_pool_opts *opts, di_cache_pool **out, di_error *err) {
    *out = NULL;
    di_cache_pool_size z;
    int rc = di_cache_pool_size_of(cfg, opts, &z, err);
    if (rc) return rc;
    di_cache_pool *p = calloc(1, sizeof *p);
    if (!p) return di_error_set(err, DI_ERR_NOMEM, "cache pool struct");
    p->cfg = cfg;
    p->co = cache_opts(opts);
    p->page_tokens = page_tokens_of(opts);
    p->n_pages = opts->n_pages;
    p->n_slots = opts->n_slots;
    p->external_pages = opts->external_pages;
    p->size = z;
    di_cache_size cs;
    di_cache_slot_size_of(cfg, &p->co, &cs, err); /* succeeded inside di_cache_pool_size_of */
    p->engram_slots = cs.engram_bytes / (int64_t)sizeof(int32_t);
    p->free_pages = malloc(sizeof(int32_t) * (size_t)p->n_pages);
    p->free_slots = malloc(sizeof(int32_t) * (size_t)p->n_slots);
    p->page_owner = malloc(sizeof(int32_t) * (size_t)p->n_pages);
    p->slot_cache = calloc((size_t)p->n_slots, sizeof *p->slot_cache);
    if (opts->be) p->engram_host = calloc((size_t)(p->n_slots * p->engram_slots) + 1, sizeof(int32_t));
    if (opts->be && p->engram_host) {
        p->mem = p->mem_raw = opts->be->mem_alloc(opts->be, (size_t)z.total_bytes, err); /* zero-filled */
    } else if (!opts->be) {
        p->mem_raw = calloc(1, (size_t)z.total_bytes + ALIGN);
        p->mem = p->mem_raw ? (void *)(((uintptr_t)p->mem_raw + ALIGN - 1) / ALIGN * ALIGN) : NULL;
    }
    if (!p->mem || !p->free_pages || !p->free_slots || !p->page_owner || !p->slot_cache) {
        di_cache_pool_destroy(p);
        return di_error_set(err, DI_ERR_NOMEM, "cache pool: cannot allocate %lld bytes (%d pages of %lld, %d slots of "
                            "%lld)%s%s", (long long)z.total_bytes, opts->n_pages, (long long)z.page_bytes,
                            opts->n_slots, (long long)z.slot_bytes, opts->be ? " on " : "",
                            opts->be ? opts->be->name : "");
    }
    p->cmp_rows = p->mem;
    p->ikey_rows = p->cmp_rows + align_up(p->n_pages * z.cmp_page_rows * cs.cmp_entry_bytes);
    p->slots = p->ikey_rows + align_up(p->n_pages * z.ikey_page_rows * cs.index_key_bytes);
    /* page 0 / slot 0 on top: a fresh pool hands out 0, 1, 2, … (as engine/block_pool.h) */
    for (int32_t i = 0; i < p->n_pages; i++) p->free_pages[i] = p->n_pages - 1 - i;
    for (int32_t i = 0; i < p->n_slots; i++) p->free_slots[i] = p->n_slots - 1 - i;
    for (int32_t i = 0; i < p->n_pages; i++) p->page_owner[i] = -1;
    p->n_free_pages = p->n_pages;
    p->n_free_slots = p->n_slots;
    *out = p;
    return DI_OK;
}

void di_cache_pool_destroy(di_cache_pool *p) {
    if (!p) return;
    if (p->co.be && p->mem_raw) p->co.be->mem_free(p->co.be, p->mem_raw);
    else free(p->mem_raw);
    free(p->engram_host);
    free(p->free_pages);
    free(p->free_slots);
    free(p->page_owner);
    free(p->slot_cache);
    free(p);
}

int di_cache_pool_cache(di_cache_pool *p, di_cache **out, di_error *err) {
    *out = NULL;
    if (!p->n_free_slots)
        return di_error_set(err, DI_ERR_LIMIT, "cache pool: all %d sequence slots are taken", p->n_slots);
    di_cache *c = calloc(1, sizeof *c);
    int32_t max_pages = di_cache_pool_pages_for_tokens(p, p->co.max_tokens);
    int32_t *pages = malloc(sizeof(int32_t) * (size_t)max_pages); /* int32 [max_pages] block table */
    if (!c || !pages) {
        free(c), free(pages);
        return di_error_set(err, DI_ERR_NOMEM, "cache pool: a cache of %d pages", max_pages);
    }
    int32_t slot = p->free_slots[p->n_free_slots - 1];
    int32_t *engram = p->engram_host ? p->engram_host + slot * p->engram_slots : NULL;
    int rc = di_cache_init_slot(c, p->cfg, &p->co, p->slots + slot * p->size.slot_bytes, (size_t)p->size.slot_bytes,
                                engram, err);
    if (rc) {
        free(c), free(pages);
        return rc;
    }
    p->n_free_slots--;
    p->slot_cache[slot] = c;
    c->pool = p;
    c->slot = slot;
    c->page_tokens = p->page_tokens;
    c->cmp_page_rows = p->size.cmp_page_rows;
    c->ikey_page_rows = p->size.ikey_page_rows;
    c->pages = pages;
    c->cap_pages = max_pages;
    int64_t row = 0;
    for (int st = 0; st < c->n_stages; st++) { /* page layout: sources in stage order */
        di_cache_stage *s = &c->stage[st];
        if (!s->ratio) continue;
        s->cmp = p->cmp_rows;
        s->ikey = p->ikey_rows;
        s->page_entries = p->page_tokens / s->ratio;
        s->cmp_row0 = s->ikey_row0 = row;
        row += s->page_entries;
    }
    *out = c;
    return DI_OK;
}

/* A page joins a sequence: zero its rows, so unwritten entries read as a fresh contiguous arena's. */
static int zero_page(di_cache_pool *p, int32_t id, di_error *err) {
    int64_t nc = p->size.cmp_page_rows * di_row_codec_bytes(DI_CODEC_FP4_E4M3, p->cfg->head_dim);
    int64_t nk = p->size.ikey_page_rows * di_row_codec_bytes(DI_CODEC_FP4_E8M0, p->cfg->index_head_dim);
    uint8_t *pc = p->cmp_rows + id * nc, *pk = p->ikey_rows + id * nk;
    p->pages_zeroed++;
    if (!p->co.be) {
        memset(pc, 0, (size_t)nc);
        memset(pk, 0, (size_t)nk);
        return DI_OK;
    }
    int rc = p->co.be->mem_set(p->co.be, pc, 0, (size_t)nc, err);
    return rc ? rc : p->co.be->mem_set(p->co.be, pk, 0, (size_t)nk, err);
}

int di_cache_pool_cover(di_cache *c, int64_t upto, di_error *err) {
    di_cache_pool *p = c->pool;
    int32_t want = di_cache_pool_pages_for_tokens(p, upto);
    if (want <= c->n_pages) return DI_OK;
    if (want > c->cap_pages)
        return di_error_set(err, DI_ERR_LIMIT, "cache pool: %lld positions need %d pages, a sequence holds at most %d",
                            (long long)upto, want, c->cap_pages);
    if (p->external_pages)
        return di_error_set(err, DI_ERR_LIMIT,
                            "cache pool: the block table covers %lld positions (%d pages of %d), %lld needed",
                            (long long)c->n_pages * p->page_tokens, c->n_pages, p->page_tokens, (long long)upto);
    if (want - c->n_pages > p->n_free_pages)
        return di_error_set(err, DI_ERR_LIMIT,
                            "cache pool exhausted: %lld positions need %d more pages of %d positions, %d of %d free",
                            (long long)upto, want - c->n_pages, p->page_tokens, p->n_free_pages, p->n_pages);
    while (c->n_pages < want) {
        int32_t id = p->free_pages[--p->n_free_pages];
        c->pages[c->n_pages++] = id;
        p->page_owner[id] = c->slot;
        int rc = zero_page(p, id, err);
        if (rc) return rc;
    }
    return DI_OK;
}

/* A cache holds a sequence: something was appended since its creation or reset. */
static int live(const di_cache *c) { return c->n_max > 0 || c->n > 0; }

int di_cache_set_pages(di_cache *c, const int32_t *ids, int32_t n, di_error *err) {
    di_cache_pool *p = c->pool;
    if (!p || !p->external_pages)
        return di_error_set(err, DI_ERR_INVALID, "cache: set_pages needs a cache of a pool with external page ids");
    if (n < 0 || n > c->cap_pages)
        return di_error_set(err, DI_ERR_INVALID, "cache: block table of %d pages (expected 0 … %d)", n, c->cap_pages);
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= p->n_pages)
            return di_error_set(err, DI_ERR_INVALID, "cache: block table entry %d is page %d (pool of %d pages)", i,
                                ids[i], p->n_pages);
    const int fresh = !live(c); /* no sequence: any table may replace the old one */
    if (!fresh) {
        for (int32_t i = 0; i < c->n_pages; i++)
            if (i >= n || ids[i] != c->pages[i])
                return di_error_set(err, DI_ERR_INVALID,
                                    "cache: block table changed under a live sequence (entry %d: page %d, held %d; "
                                    "%d pages given, %d held)",
                                    i, i < n ? ids[i] : -1, c->pages[i], n, c->n_pages);
    }
    /* Pages that join must belong to no live sequence and appear once: two sequences writing one
     * page would corrupt each other silently, so the allocator's mistake is caught here. Joining
     * pages are marked −2 − slot while checking, and the marks undone on a refusal. */
    const int32_t i0 = fresh ? 0 : c->n_pages, mark = -2 - c->slot;
    if (fresh)
        for (int32_t i = 0; i < c->n_pages; i++)
            if (p->page_owner[c->pages[i]] == c->slot) p->page_owner[c->pages[i]] = -1;
    int32_t bad = -1, owner = -1;
    for (int32_t i = i0; i < n && bad < 0; i++) {
        int32_t o = p->page_owner[ids[i]];
        if (o == mark || o == c->slot || (o >= 0 && p->slot_cache[o] && live(p->slot_cache[o])))
            bad = i, owner = o;
        else
            p->page_owner[ids[i]] = mark;
    }
    for (int32_t i = i0; i < n; i++)
        if (p->page_owner[ids[i]] == mark) p->page_owner[ids[i]] = bad < 0 ? c->slot : -1;
    if (bad >= 0)
        return di_error_set(err, DI_ERR_INVALID, "cache: block table entry %d, page %d, is %s", bad, ids[bad],
                            owner == mark || owner == c->slot ? "listed twice" : "held by another live sequence");
    for (int32_t i = i0; i < n; i++) {
        int rc = zero_page(p, ids[i], err);
        if (rc) { /* a device failure: the joining pages go back unowned; a fresh table is dropped whole */
            for (int32_t j = i0; j < n; j++)
                if (p->page_owner[ids[j]] == c->slot) p->page_owner[ids[j]] = -1;
            if (fresh) c->n_pages = 0;
            return rc;
        }
    }
    if (n) memcpy(c->pages, ids, sizeof(int32_t) * (size_t)n);
    c->n_pages = n;
    return DI_OK;
}

/* Own mode: the pages go back to the free list, in reverse (the next sequence gets the same ids). */
void di_cache_pool_drop_pages(di_cache *c) {
    di_cache_pool *p = c->pool;
    for (int32_t i = c->n_pages - 1; i >= 0; i--) {
        if (p->page_owner[c->pages[i]] == c->slot) p->page_owner[c->pages[i]] = -1;
        if (!p->external_pages) p->free_pages[p->n_free_pages++] = c->pages[i];
    }
    c->n_pages = 0;
}

void di_cache_pool_put(di_cache *c) {
    di_cache_pool *p = c->pool;
    di_cache_pool_drop_pages(c);
    p->free_slots[p->n_free_slots++] = c->slot;
    p->slot_cache[c->slot] = NULL;
    free(c->pages);
    free(c);
}
