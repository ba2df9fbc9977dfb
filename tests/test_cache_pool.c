/* Paged cache pool (src/model/cache_pool.h): a paged cache is byte-identical to a contiguous one —
 * canonical image, every compressed entry and index key read back by range and by gather — over
 * random extends (chunked and token by token), rollbacks, resets and prefix imports, with several
 * caches interleaving their pages in one pool, in host and in backend memory; pool exhaustion and
 * slot exhaustion are clear errors that leave the cache as it was; external block tables (the
 * engine's scheduler ids) only grow under a live sequence; the sizes.  di-test: asan */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "io/formats.h"
#include "model/cache.h"
#include "model/cache_pool.h"
#include "model/config.h"
#include "model/memplan.h"
#include "testutil.h"
#include "util/log.h"

#define OK(call)                                                                                                     \
    do {                                                                                                             \
        di_error e_ = {0};                                                                                           \
        if ((call) != DI_OK) fail_msg("%s: %s", #call, e_.msg);                                                      \
    } while (0)
#define E (&e_)

static di_config *load_cfg(const char *rel) {
    di_config *c = malloc(sizeof *c);
    di_error err = {0};
    if (di_config_load(tu_data(rel), c, &err) != DI_OK) fail_msg("%s: %s", rel, err.msg);
    return c;
}

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint16_t rand_bf16(uint64_t *s) {
    uint64_t r = mix64((*s)++);
    float v = ldexpf(1.0f + (float)(r & 0xffff) / 65536.0f, (int)((r >> 16) % 9) - 6);
    return di_f32_to_bf16((r >> 40) & 1 ? -v : v);
}

static uint64_t seed_of(uint64_t tag, int64_t pos, int stage) {
    return mix64(mix64(tag * 1000003u + (uint64_t)pos) ^ ((uint64_t)stage << 8));
}

/* Every cache row position pos contributes (as the forward writes them after di_cache_extend): a
 * function of (tag, pos, stage); a ratio-R entry is written when its group completes. */
static void write_token(di_cache *c, uint64_t tag, int64_t pos) {
    int hd = c->head_dim, ihd = c->index_head_dim;
    uint16_t row[512];
    for (int st = 0; st < c->n_stages; st++) {
        uint64_t s = seed_of(tag, pos, st);
        for (int i = 0; i < hd; i++) row[i] = rand_bf16(&s);
        if (pos >= di_cache_len(c) - c->ring_slots) OK(di_cache_window_put(c, st, pos, row, E));
        int r = c->stage[st].ratio;
        if (r >= 2) {
            float *kv, *score;
            OK(di_cache_cmp_state(c, st, pos, &kv, &score, E));
            for (int i = 0; i < hd; i++) kv[(pos % r) * hd + i] = di_bf16_to_f32(row[i]);
            for (int i = 0; i < hd; i++) score[(pos % r) * hd + i] = (float)(i % 7);
        }
        if (r && (pos + 1) % r == 0) {
            OK(di_cache_cmp_put(c, st, pos / r, row, E));
            OK(di_cache_ikey_put(c, st, pos / r, row + hd - ihd, E));
        }
    }
    if (c->engram_slots && pos >= di_cache_len(c) - c->engram_slots)
        OK(di_cache_engram_put(c, pos, (int32_t)(seed_of(tag, pos, 999) % 99092), E));
}

static int append(di_cache *c, uint64_t tag, int64_t k, int chunked, di_error *err) {
    int64_t p0 = di_cache_len(c);
    if (chunked) {
        int rc = di_cache_extend(c, k, err);
        if (rc) return rc;
        for (int64_t p = p0; p < p0 + k; p++) write_token(c, tag, p);
        return DI_OK;
    }
    for (int64_t p = p0; p < p0 + k; p++) {
        int rc = di_cache_extend(c, 1, err);
        if (rc) return rc;
        write_token(c, tag, p);
    }
    return DI_OK;
}

static uint8_t *image_of(const di_cache *c, int64_t *n) {
    *n = di_cache_image_bytes(c);
    uint8_t *b = malloc((size_t)*n + 1);
    OK(di_cache_image(c, b, *n, n, E));
    return b;
}

/* a (contiguous) and b (paged): same image, same entries by range and by a shuffled gather. */
static void assert_same(const di_cache *a, const di_cache *b, uint64_t *rng, const char *what, int64_t step) {
    int64_t na, nb;
    uint8_t *ia = image_of(a, &na), *ib = image_of(b, &nb);
    if (na != nb || memcmp(ia, ib, (size_t)na))
        fail_msg("%s step %lld: images differ (%lld vs %lld bytes, n = %lld)", what, (long long)step, (long long)na,
                 (long long)nb, (long long)di_cache_len(a));
    free(ia);
    free(ib);
    for (int st = 0; st < a->n_stages; st++) {
        if (!a->stage[st].ratio) continue;
        int64_t ne = a->cmp_n[st] < a->ikey_n[st] ? a->cmp_n[st] : a->ikey_n[st];
        assert_int_equal(ne, b->cmp_n[st] < b->ikey_n[st] ? b->cmp_n[st] : b->ikey_n[st]);
        if (ne <= 0) continue;
        size_t hd = (size_t)a->head_dim, ihd = (size_t)a->index_head_dim;
        uint16_t *ra = malloc(ne * hd * 2), *rb = malloc(ne * hd * 2), *ka = malloc(ne * ihd * 2),
                 *kb = malloc(ne * ihd * 2);
        int32_t *ids = malloc((size_t)ne * 4);
        OK(di_cache_cmp_rows(a, st, 0, ne, ra, E));
        OK(di_cache_cmp_rows(b, st, 0, ne, rb, E));
        assert_memory_equal(ra, rb, ne * hd * 2);
        OK(di_cache_ikey_rows(a, st, 0, ne, ka, E));
        OK(di_cache_ikey_rows(b, st, 0, ne, kb, E));
        assert_memory_equal(ka, kb, ne * ihd * 2);
        /* a top-k style list: random entries in random order, some −1 */
        for (int64_t i = 0; i < ne; i++) ids[i] = mix64((*rng)++) % 5 == 0 ? -1 : (int32_t)(mix64((*rng)++) % ne);
        OK(di_cache_cmp_gather(a, st, ids, ne, ra, E));
        OK(di_cache_cmp_gather(b, st, ids, ne, rb, E));
        assert_memory_equal(ra, rb, ne * hd * 2);
        free(ra), free(rb), free(ka), free(kb), free(ids);
    }
}

/* Prefix restore at boundary B with replay start r from src's export of [0, B), into dst. */
static void restore(di_cache *dst, const uint8_t *blob, int64_t bytes, int64_t B, int64_t r, uint64_t tag) {
    OK(di_cache_prefix_begin(dst, B, r, E));
    OK(di_cache_prefix_import(dst, 0, B, blob, bytes, E));
    int64_t h0 = r - dst->engram_hist > 0 ? r - dst->engram_hist : 0;
    for (int64_t q = h0; dst->engram_slots && q < r; q++)
        OK(di_cache_engram_put(dst, q, (int32_t)(seed_of(tag, q, 999) % 99092), E));
    di_error e_ = {0};
    if (append(dst, tag, B - r, 1, E)) fail_msg("replay: %s", e_.msg);
}

/* Random walk of NSEQ sequences, each a contiguous cache and a paged one in one shared pool. */
static void random_walk(const char *cfg_rel, const di_backend *be, int32_t page_tokens, int n_ops, int64_t *checks) {
    enum { NSEQ = 3 };
    di_config *cfg = load_cfg(cfg_rel);
    const int64_t T = 300;
    const int m = 8;
    di_cache_pool_opts po = {.be = be, .max_tokens = T, .spec_margin = m, .page_tokens = page_tokens,
                             .n_pages = NSEQ * (int32_t)((T + page_tokens - 1) / page_tokens), .n_slots = NSEQ};
    di_cache_pool *pool = NULL;
    OK(di_cache_pool_create(cfg, &po, &pool, E));
    di_cache_opts co = {.max_tokens = T, .spec_margin = m};
    di_cache *ref[NSEQ], *pg[NSEQ];
    uint64_t tag[NSEQ];
    int reused[NSEQ] = {0}; /* the contiguous cache held an older sequence (its arena is not zero) */
    for (int i = 0; i < NSEQ; i++) {
        OK(di_cache_create(cfg, &co, &ref[i], E));
        OK(di_cache_pool_cache(pool, &pg[i], E));
        tag[i] = 10 + (uint64_t)i;
    }
    int align = di_cache_prefix_align(ref[0]);
    uint64_t rng = 12345;
    int64_t scattered = 0;
    for (int op = 0; op < n_ops; op++) {
        int i = (int)(mix64(rng++) % NSEQ);
        di_cache *a = ref[i], *b = pg[i];
        uint64_t what = mix64(rng++) % 20;
        int64_t n = di_cache_len(a);
        if (what < 11) { /* append a chunk or decode steps */
            int64_t k = 1 + (int64_t)(mix64(rng++) % (what < 3 ? 40 : 5));
            if (n + k > T) k = T - n;
            int chunked = (int)(mix64(rng++) % 3);
            di_error e_ = {0};
            if (chunked == 2) {
                /* compare before the writes: the new entries read as zeros, recycled pages included
                 * (a contiguous arena is zero there only if it never held an older sequence) */
                OK(di_cache_extend(a, k, E));
                OK(di_cache_extend(b, k, E));
                if (!reused[i]) assert_same(a, b, &rng, cfg_rel, op);
                for (int64_t p = n; p < n + k; p++) write_token(a, tag[i], p), write_token(b, tag[i], p);
            } else if (append(a, tag[i], k, chunked, E) || append(b, tag[i], k, chunked, E)) {
                fail_msg("append: %s", e_.msg);
            }
        } else if (what < 16) { /* rollback within the exact limit */
            int64_t lim = di_cache_rollback_limit(a);
            assert_int_equal(lim, di_cache_rollback_limit(b));
            int64_t k = lim ? (int64_t)(mix64(rng++) % (uint64_t)(lim + 1)) : 0;
            OK(di_cache_rollback(a, k, E));
            OK(di_cache_rollback(b, k, E));
        } else if (what < 18 && n >= align) { /* prefix restore of this sequence's own prefix */
            int64_t B = n / align * align, keep = a->window + m;
            int64_t r = B > keep ? (B - keep) / align * align : 0;
            int64_t bytes = di_cache_prefix_span_bytes(a, 0, B);
            uint8_t *blob = malloc((size_t)bytes + 1), *blob2 = malloc((size_t)bytes + 1);
            OK(di_cache_prefix_export(a, 0, B, blob, bytes, E));
            OK(di_cache_prefix_export(b, 0, B, blob2, bytes, E));
            assert_memory_equal(blob, blob2, (size_t)bytes); /* export reads through the block table */
            restore(a, blob, bytes, B, r, tag[i]);
            reused[i] = 1;
            restore(b, blob, bytes, B, r, tag[i]);
            free(blob), free(blob2);
        } else { /* a new sequence in the same cache */
            di_cache_reset(a);
            di_cache_reset(b);
            tag[i] += 100;
            reused[i] = 1;
        }
        assert_same(a, b, &rng, cfg_rel, op);
        (*checks)++;
        for (int32_t j = 1; j < b->n_pages; j++) scattered += b->pages[j] != b->pages[j - 1] + 1;
    }
    /* the sequences' pages interleave in the pool: tables with non-consecutive pages were compared */
    tu_report("%s, pages of %d: %lld page breaks seen", cfg_rel, page_tokens, (long long)scattered);
    assert_true(scattered > 0);
    for (int i = 0; i < NSEQ; i++) di_cache_destroy(ref[i]), di_cache_destroy(pg[i]);
    assert_int_equal(pool->n_free_pages, pool->n_pages); /* every page came back */
    assert_int_equal(pool->n_free_slots, pool->n_slots);
    di_cache_pool_destroy(pool);
    di_config_free(cfg);
    free(cfg);
}

static void test_paged_equals_contiguous(void **state) {
    (void)state;
    int64_t checks = 0;
    random_walk("v41-tiny-sel", NULL, 4, 400, &checks);
    random_walk("v41-tiny-nosel", NULL, 16, 250, &checks);
    random_walk("v41-flash-config", NULL, 16, 150, &checks);
    tu_report("paged vs contiguous states byte-identical (host pool): %lld", (long long)checks);
    assert_int_equal(checks, 400 + 250 + 150);
}

static void test_paged_backend_memory(void **state) {
    (void)state;
    di_backend *be = NULL;
    di_error err = {0};
    assert_int_equal(di_backend_cpu_create(1, &be, &err), DI_OK);
    int64_t checks = 0;
    random_walk("v41-tiny-sel", be, 8, 300, &checks);
    tu_report("paged (backend memory) vs contiguous states byte-identical: %lld", (long long)checks);
    assert_int_equal(checks, 300);
    di_backend_destroy(be);
}

/* Own mode: the pool runs dry → DI_ERR_LIMIT naming the pages, the cache unchanged; a finished
 * sequence's pages serve the next one; slots run out the same way. */
static void test_exhaustion(void **state) {
    (void)state;
    di_config *cfg = load_cfg("v41-tiny-sel");
    di_cache_pool_opts po = {.max_tokens = 256, .spec_margin = 8, .page_tokens = 16, .n_pages = 5, .n_slots = 2};
    di_cache_pool *pool = NULL;
    OK(di_cache_pool_create(cfg, &po, &pool, E));
    di_cache *a, *b, *c;
    OK(di_cache_pool_cache(pool, &a, E));
    OK(di_cache_pool_cache(pool, &b, E));
    di_error err = {0};
    assert_int_equal(di_cache_pool_cache(pool, &c, &err), DI_ERR_LIMIT);
    assert_non_null(strstr(err.msg, "slots"));
    OK(append(a, 1, 48, 1, E)); /* 3 pages */
    assert_int_equal(a->n_pages, 3);
    assert_int_equal(di_cache_pool_free(pool), 2);
    OK(append(b, 2, 32, 0, E)); /* 2 pages */
    assert_int_equal(di_cache_pool_free(pool), 0);
    int64_t n0;
    uint8_t *img0 = image_of(b, &n0);
    assert_int_equal(di_cache_extend(b, 1, &err), DI_ERR_LIMIT);
    tu_report("exhausted: %s", err.msg);
    assert_non_null(strstr(err.msg, "exhausted"));
    assert_int_equal(di_cache_len(b), 32);
    int64_t n1;
    uint8_t *img1 = image_of(b, &n1);
    assert_int_equal(n0, n1);
    assert_memory_equal(img0, img1, (size_t)n0);
    free(img0), free(img1);
    /* a rollback keeps the pages; a reset (finish) returns them and b then grows again */
    OK(di_cache_rollback(a, 8, E));
    assert_int_equal(a->n_pages, 3);
    di_cache_reset(a);
    assert_int_equal(di_cache_pool_free(pool), 3);
    OK(append(b, 2, 40, 1, E)); /* 72 positions: 5 pages */
    assert_int_equal(b->n_pages, 5);
    /* a context beyond max_tokens is refused before any page is taken */
    assert_int_equal(di_cache_extend(a, 257, &err), DI_ERR_LIMIT);
    di_cache_destroy(a);
    di_cache_destroy(b);
    assert_int_equal(di_cache_pool_free(pool), 5);
    di_cache_pool_destroy(pool);
    di_config_free(cfg);
    free(cfg);
}

/* External mode: tables come from the caller; they only grow under a live sequence; a new
 * sequence takes any table (its pages zeroed); extends past the table fail. */
static void test_external_tables(void **state) {
    (void)state;
    di_config *cfg = load_cfg("v41-tiny-sel");
    di_cache_pool_opts po = {.max_tokens = 128, .spec_margin = 8, .page_tokens = 16, .n_pages = 8, .n_slots = 2,
                             .external_pages = 1};
    di_cache_pool *pool = NULL;
    OK(di_cache_pool_create(cfg, &po, &pool, E));
    di_cache *a, *b;
    OK(di_cache_pool_cache(pool, &a, E));
    OK(di_cache_pool_cache(pool, &b, E));
    di_cache_opts co = {.max_tokens = 128, .spec_margin = 8};
    di_cache *ref;
    OK(di_cache_create(cfg, &co, &ref, E));
    di_error err = {0};
    assert_int_equal(di_cache_extend(a, 1, &err), DI_ERR_LIMIT); /* no table yet */
    assert_non_null(strstr(err.msg, "block table"));
    const int32_t t1[] = {6, 2}, t2[] = {6, 2, 7}, bad[] = {6, 3, 7}, oob[] = {8};
    OK(di_cache_set_pages(a, t1, 2, E));
    OK(append(a, 1, 32, 1, E));
    OK(append(ref, 1, 32, 1, E));
    assert_int_equal(di_cache_extend(a, 1, &err), DI_ERR_LIMIT);
    assert_int_equal(di_cache_set_pages(a, bad, 3, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "changed"));
    assert_int_equal(di_cache_set_pages(a, oob, 1, &err), DI_ERR_INVALID);
    OK(di_cache_set_pages(a, t2, 3, E));
    OK(append(a, 1, 9, 0, E));
    OK(append(ref, 1, 9, 0, E));
    uint64_t rng = 7;
    assert_same(ref, a, &rng, "external", 0);
    /* an allocator mistake is refused, nothing changed: a page listed twice, a page of live a */
    const int32_t dup[] = {0, 1, 0}, alias[] = {0, 7};
    assert_int_equal(di_cache_set_pages(b, dup, 3, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "listed twice"));
    assert_int_equal(di_cache_set_pages(b, alias, 2, &err), DI_ERR_INVALID);
    tu_report("aliasing refused: %s", err.msg);
    assert_non_null(strstr(err.msg, "another live sequence"));
    assert_int_equal(b->n_pages, 0);
    const int32_t t3[] = {6, 2, 7, 7};
    assert_int_equal(di_cache_set_pages(a, t3, 4, &err), DI_ERR_INVALID); /* growing by a page it holds */
    assert_int_equal(a->n_pages, 3);
    assert_same(ref, a, &rng, "external after refusals", 0);
    /* b takes a's pages for a new sequence after a is done (the scheduler recycled them): zeroed */
    di_cache_reset(a);
    OK(di_cache_set_pages(b, t2, 3, E));
    di_cache_reset(ref);
    OK(append(b, 5, 20, 1, E));
    OK(append(ref, 5, 20, 1, E));
    assert_same(ref, b, &rng, "external reuse", 1);
    di_cache_destroy(ref);
    di_cache_destroy(a);
    di_cache_destroy(b);
    assert_int_equal(pool->n_free_slots, 2);
    di_cache_pool_destroy(pool);
    di_config_free(cfg);
    free(cfg);
}

/* Page bytes = page_tokens × the per-token growth (890 B released: 64 positions = 56,960 B); a slot
 * = the fixed parts; a budget's page count; bad page sizes refused. */
static void test_sizes(void **state) {
    (void)state;
    di_config *cfg = load_cfg("v41-flash-config");
    di_cache_opts co = {.max_tokens = 1 << 20, .spec_margin = -1};
    di_cache_size cs;
    OK(di_cache_size_of(cfg, &co, &cs, E));
    di_cache_pool_opts po = {.max_tokens = 1 << 20, .spec_margin = -1, .page_tokens = 64, .n_pages = 1000,
                             .n_slots = 4};
    di_cache_pool_size z;
    OK(di_cache_pool_size_of(cfg, &po, &z, E));
    tu_report("released page of 64: %lld B; fixed slot: %lld B; per token %.1f B", (long long)z.page_bytes,
              (long long)z.slot_bytes, cs.per_token_bytes);
    assert_int_equal(z.page_bytes, (int64_t)llround(64 * cs.per_token_bytes));
    assert_true(z.slot_bytes >= cs.fixed_bytes && z.slot_bytes < cs.fixed_bytes + 64 * 2 * DI_MAX_STAGES);
    assert_true(z.total_bytes >= 1000 * z.page_bytes + 4 * z.slot_bytes);
    int32_t np;
    int64_t budget = 8ll << 30;
    OK(di_cache_pool_pages_for(cfg, &po, budget, &np, E));
    tu_report("8 GiB budget, 4 slots: %d pages = %lld positions", np, (long long)np * 64);
    po.n_pages = np;
    OK(di_cache_pool_size_of(cfg, &po, &z, E));
    assert_true(z.total_bytes <= budget);
    po.n_pages = np + 1;
    OK(di_cache_pool_size_of(cfg, &po, &z, E));
    assert_true(z.total_bytes > budget - 128);
    di_error err = {0};
    assert_int_equal(di_cache_pool_pages_for(cfg, &po, 4 * z.slot_bytes, &np, &err), DI_ERR_LIMIT);
    tu_report("too small: %s", err.msg);
    po.page_tokens = 63; /* released ratios 1, 2: an odd page would split an entry */
    assert_int_equal(di_cache_pool_size_of(cfg, &po, &z, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "multiple of 2"));
    di_config_free(cfg);
    free(cfg);
}

/* memplan (deepinfer plan) reports the run's caches as a pool: one slot per sequence and the pages
 * of max_seqs full sequences, within a page per sequence of the contiguous caches' bytes. */
static void test_memplan_pool(void **state) {
    (void)state;
    di_config *cfg = load_cfg("v41-flash-config");
    di_memplan_opts o;
    di_memplan_opts_default(&o, DI_PLAN_CUDA);
    o.max_seqs = 8;
    o.max_tokens = 100000;
    di_memplan p;
    OK(di_memplan_compute(cfg, &o, &p, E));
    const int64_t P = DI_CACHE_PAGE_TOKENS_DEFAULT, pages = 8 * ((100000 + P - 1) / P);
    assert_int_equal(p.pool_pages, pages);
    assert_int_equal(p.pool_bytes, 8 * p.pool.slot_bytes + pages * p.pool.page_bytes);
    assert_true(p.pool_bytes >= p.caches_dev - 8 * 64 * DI_MAX_STAGES && p.pool_bytes <= p.caches_dev + 8 * p.pool.page_bytes);
    tu_report("plan: 8 x 100000 tokens: contiguous caches %lld B, as a pool %lld B (%lld pages)", (long long)p.caches_dev,
              (long long)p.pool_bytes, (long long)p.pool_pages);
    di_config_free(cfg);
    free(cfg);
}

/* A pool of 16-token pages for T tokens and one cache in it, extended to T; returns its first ratio-1 stage. */
static int paged_ratio1(const di_config *cfg, int64_t T, di_cache_pool **pool, di_cache **b) {
    di_cache_pool_opts po = {.max_tokens = T, .spec_margin = -1, .page_tokens = 16, .n_pages = (int32_t)(T / 16 + 2),
                             .n_slots = 1};
    OK(di_cache_pool_create(cfg, &po, pool, E));
    OK(di_cache_pool_cache(*pool, b, E));
    OK(di_cache_extend(*b, T, E));
    int st = 0;
    while ((*b)->stage[st].ratio != 1) st++;
    return st;
}

/* The indexer's every-step read of all index keys (forward_block.c): a paged cache gathers them in
 * one decode through the block table; its cost against the contiguous range decode. */
static void test_read_throughput(void **state) {
    (void)state;
    di_config *cfg = load_cfg("v41-flash-config");
    const int64_t T = 8192;
    di_cache_opts co = {.max_tokens = T, .spec_margin = -1};
    di_cache *a, *b;
    di_cache_pool *pool;
    OK(di_cache_create(cfg, &co, &a, E));
    OK(di_cache_extend(a, T, E));
    int st = paged_ratio1(cfg, T, &pool, &b);
    uint16_t key[128];
    uint64_t s = 5;
    for (int64_t e = 0; e < T; e++) {
        for (int i = 0; i < a->index_head_dim; i++) key[i] = rand_bf16(&s);
        OK(di_cache_ikey_put(a, st, e, key, E));
        OK(di_cache_ikey_put(b, st, e, key, E));
    }
    uint16_t *ka = malloc((size_t)T * 128 * 2), *kb = malloc((size_t)T * 128 * 2); /* bf16 [T, ihd] */
    double t[2] = {0, 0};
    for (int rep = 0; rep < 5; rep++) {
        double t0 = di_now();
        OK(di_cache_ikey_rows(a, st, 0, T, ka, E));
        double t1 = di_now();
        OK(di_cache_ikey_rows(b, st, 0, T, kb, E));
        t[0] += t1 - t0, t[1] += di_now() - t1;
    }
    assert_memory_equal(ka, kb, (size_t)T * 128 * 2);
    tu_report("index keys [0, %lld) read: contiguous %.1f ns/key, paged (16-token pages, one gather) %.1f ns/key",
              (long long)T, 1e9 * t[0] / (5.0 * T), 1e9 * t[1] / (5.0 * T));
    free(ka), free(kb);
    di_cache_destroy(a);
    di_cache_destroy(b);
    di_cache_pool_destroy(pool);
    di_config_free(cfg);
    free(cfg);
}

/* The address lists the forward hands to the row decode (di_cache_entry_read_addrs, built page by page):
 * every entry's address equals the table's translation of that entry alone (di_cache_ikey_at /
 * di_cache_cmp_at), for ranges that start and end inside pages, span several, or lie in one. */
static void test_read_addrs_pages(void **state) {
    (void)state;
    di_config *cfg = load_cfg("v41-flash-config");
    const int64_t T = 1000;
    di_cache *b;
    di_cache_pool *pool;
    int st = paged_ratio1(cfg, T, &pool, &b);
    uint16_t row[512];
    uint64_t s = 9;
    for (int64_t e = 0; e < T; e++) {
        for (int i = 0; i < b->head_dim; i++) row[i] = rand_bf16(&s);
        OK(di_cache_cmp_put(b, st, e, row, E));
        OK(di_cache_ikey_put(b, st, e, row, E));
    }
    static const int64_t ranges[][2] = {{0, 1000}, {5, 37}, {15, 16}, {16, 48}, {17, 18}, {999, 1000}, {300, 300}};
    const uint8_t **src = malloc(sizeof *src * (size_t)T);
    int64_t checked = 0;
    for (int r = 0; r < (int)(sizeof ranges / sizeof ranges[0]); r++)
        for (int ikey = 0; ikey < 2; ikey++) {
            const int64_t e0 = ranges[r][0], e1 = ranges[r][1];
            OK(di_cache_entry_read_addrs(b, st, ikey, e0, e1, src, E));
            for (int64_t e = e0; e < e1; e++, checked++)
                assert_ptr_equal(src[e - e0], ikey ? di_cache_ikey_at(b, st, e) : di_cache_cmp_at(b, st, e));
        }
    assert_int_equal(checked, 2 * (1000 + 32 + 1 + 32 + 1 + 1));
    /* and the pages really are scattered: some neighbour entries across a page boundary are not adjacent */
    int64_t jumps = 0;
    for (int64_t e = 16; e < T; e += 16) jumps += di_cache_ikey_at(b, st, e) != di_cache_ikey_at(b, st, e - 1) + b->index_key_bytes;
    tu_report("entry addresses by page runs: %lld checked; %lld of %lld page boundaries not contiguous", (long long)checked,
              (long long)jumps, (long long)(T / 16));
    free(src);
    di_cache_destroy(b);
    di_cache_pool_destroy(pool);
    di_config_free(cfg);
    free(cfg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_addrs_pages),
        cmocka_unit_test(test_paged_equals_contiguous),
        cmocka_unit_test(test_paged_backend_memory),
        cmocka_unit_test(test_exhaustion),
        cmocka_unit_test(test_external_tables),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_memplan_pool),
        cmocka_unit_test(test_read_throughput),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
