/* A shared, paged store for the compact per-sequence caches (model/cache.h): one block of backend
 * memory (the backend's mem ops; host memory without a backend) holding
 *
 *   pages   n_pages fixed-size pages. Page i of a sequence holds positions [i·P, (i+1)·P) of every
 *           growing part — the compressed KV entries and index keys of every kv source (P/R entries
 *           of a ratio-R source) — so one block table per sequence serves all sources. The page is
 *           stored as two row arrays, compressed KV rows [n_pages · cmp_page_rows, 288 B] and index
 *           key rows [n_pages · ikey_page_rows, 68 B] (real sizes), each page a run of rows ordered
 *           by source; entry e of a source is then row  table[e / (P/R)] · page_rows + row0 + e mod
 *           (P/R)  of its array, so the backend row codec's ids gather reads selected entries from
 *           any pages in one call (cache_rows.c) and a range decodes one run per page.
 *   slots   n_slots fixed slots, one per live sequence: its window rings, compressor rings and (host
 *           caches) Engram history, the parts whose size does not depend on the length.
 *
 * Page size P (positions): a multiple of every compress ratio (V4.1: 1 and 2), so no entry straddles
 * two pages and every page boundary is a prefix-cache alignment point. The trade-off is internal
 * fragmentation (a sequence's last page is on average half empty) against table length and the
 * number of page runs a range read decodes. At 890 B/position (released config, all sources) a page
 * of 64 positions is 57 KB and one of 16 is 14 KB, both small against the ≈ 3.35 MB of fixed parts
 * a sequence holds anyway, so the waste stays under 1–2% of a sequence's memory even for short
 * ones. DI_CACHE_PAGE_TOKENS_DEFAULT = 64 (the prefix cache's default block: one block = one page);
 * the engine uses its scheduler's block of 16 positions (engine_api.c), so admission and growth
 * are counted at the granularity the scheduler already plans chunks in.
 *
 * Who allocates the page ids:
 *   own       (opts.external_pages = 0) the pool's free list: di_cache_extend takes the pages a
 *             sequence grows into (DI_ERR_LIMIT "pool exhausted" when none is left) and
 *             di_cache_reset (the sequence is over) and di_cache_destroy give them back;
 *   external  (= 1) the caller's allocator (the engine's scheduler, engine/block_pool.h) hands out
 *             ids in [0, n_pages) and sends each sequence's block table with every step: the runner
 *             calls di_cache_set_pages before the forward; di_cache_extend then only checks that the
 *             table covers the new positions.
 * Either way a page is zeroed when it joins a sequence's table, so the compressed arrays read back as
 * a fresh contiguous cache's (zero-filled) would: the canonical image (di_cache_image) of a paged
 * cache is byte-identical to the contiguous cache's over any extends, rollbacks and prefix imports
 * (tests/test_cache_pool.c). Rollback keeps the pages (a rollback of k ≤ m positions re-grows into
 * them at once).
 *
 * Thread safety: none; the pool and its caches are used by one thread (the engine's worker). */
#ifndef DI_MODEL_CACHE_POOL_H
#define DI_MODEL_CACHE_POOL_H

#include <stdint.h>

#include "model/cache.h"

#define DI_CACHE_PAGE_TOKENS_DEFAULT 64

typedef struct di_cache_pool_opts {
    const di_backend *be;  /* where the pool lives (NULL = host memory) */
    int64_t max_tokens;    /* context capacity of every cache (positions) */
    int spec_margin;       /* rollback reserve of every cache; < 0 = di_cache_default_margin */
    int32_t page_tokens;   /* P; 0 = DI_CACHE_PAGE_TOKENS_DEFAULT; a multiple of di_cache_pool_align */
    int32_t n_pages;       /* ≥ 1 */
    int32_t n_slots;       /* sequences alive at once, ≥ 1 */
    int external_pages;    /* page ids come from the caller (di_cache_set_pages), see above */
} di_cache_pool_opts;

typedef struct di_cache_pool_size {
    int64_t page_bytes;      /* one page: Σ_sources (P/R) · (cmp + index key bytes) */
    int64_t slot_bytes;      /* one sequence's fixed parts (window + compressor + Engram sections) */
    int64_t cmp_page_rows;   /* compressed-KV rows per page (all sources) */
    int64_t ikey_page_rows;  /* index-key rows per page */
    int64_t total_bytes;     /* the pool's allocation: pages and slots, sections 64-byte aligned */
} di_cache_pool_size;

typedef struct di_cache_pool {
    const di_config *cfg;    /* must outlive the pool */
    di_cache_opts co;        /* every cache's options (be, max_tokens, margin) */
    int32_t page_tokens, n_pages, n_slots;
    int external_pages;
    di_cache_pool_size size;
    void *mem;               /* [size.total_bytes] backend (or host, 64-aligned) memory */
    void *mem_raw;
    uint8_t *cmp_rows;       /* [n_pages · cmp_page_rows, cmp_entry_bytes] */
    uint8_t *ikey_rows;      /* [n_pages · ikey_page_rows, index_key_bytes] */
    uint8_t *slots;          /* [n_slots, slot_bytes] */
    int32_t *engram_host;    /* [n_slots, engram_slots] int32: backend pools keep the history on the host */
    int64_t engram_slots;
    int32_t *free_pages;     /* [n_pages] own mode: free ids, top of the stack last */
    int32_t n_free_pages;
    int32_t *free_slots;     /* [n_slots] */
    int32_t *page_owner;     /* [n_pages] slot of the cache that took the page last, −1: none */
    di_cache **slot_cache;   /* [n_slots] the cache in each slot (NULL: free) */
    int32_t n_free_slots;
    int64_t pages_zeroed;    /* pages that joined a table (counter for tests / stats) */
} di_cache_pool;

/* Least page size every compress ratio divides (the lcm; 1 without kv source). */
int di_cache_pool_align(const di_config *cfg);
/* Sizes of a pool with these options. */
int di_cache_pool_size_of(const di_config *cfg, const di_cache_pool_opts *opts, di_cache_pool_size *out,
                          di_error *err);
/* Pages a budget of budget_bytes holds once opts->n_slots fixed slots are set aside (opts->n_pages
 * ignored). Fails (DI_ERR_LIMIT, naming both sizes) when the budget does not cover the slots and one
 * page. */
int di_cache_pool_pages_for(const di_config *cfg, const di_cache_pool_opts *opts, int64_t budget_bytes,
                            int32_t *n_pages, di_error *err);

int di_cache_pool_create(const di_config *cfg, const di_cache_pool_opts *opts, di_cache_pool **out, di_error *err);
/* Every cache of the pool must have been destroyed. NULL is fine. */
void di_cache_pool_destroy(di_cache_pool *p);

/* A new, empty cache in a free slot (DI_ERR_LIMIT when all n_slots are taken). di_cache_destroy
 * returns its slot and pages. */
int di_cache_pool_cache(di_cache_pool *p, di_cache **out, di_error *err);
static inline int32_t di_cache_pool_free(const di_cache_pool *p) { return p->n_free_pages; }
/* Pages a sequence of n positions holds: ⌈n / P⌉. */
static inline int32_t di_cache_pool_pages_for_tokens(const di_cache_pool *p, int64_t n) {
    return (int32_t)((n + p->page_tokens - 1) / p->page_tokens);
}

/* External mode: c's block table becomes ids[0..n) (ids in [0, n_pages), distinct). A sequence's
 * table only grows: the current table must be a prefix of ids — unless c holds no sequence (created
 * or reset, nothing appended since), when ids replace it. Pages that join are zeroed; a page listed
 * twice or still in the table of another live sequence is refused (DI_ERR_INVALID), nothing changed. */
int di_cache_set_pages(di_cache *c, const int32_t *ids, int32_t n, di_error *err);

/* ---- internal to cache*.c ---- */
/* Makes c's table cover positions [0, upto): own mode takes pages, external mode checks. */
int di_cache_pool_cover(di_cache *c, int64_t upto, di_error *err);
/* Forgets c's block table; own mode returns the pages (di_cache_reset of an own-mode cache). */
void di_cache_pool_drop_pages(di_cache *c);
/* di_cache_destroy of a pooled cache. */
void di_cache_pool_put(di_cache *c);

#endif
