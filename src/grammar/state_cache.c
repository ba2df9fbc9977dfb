/* Per-grammar state automaton and mask cache shared by matchers (see state_cache.h). */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "grammar/state_cache.h"

/* Partition the bytes into classes that no terminal class tells apart: two bytes share a class
 * exactly when they belong to the same terminal classes. Each byte's membership vector (one bit
 * per terminal class) is built from the classes' set bits; bytes are numbered in byte order,
 * looked up by a hash of the vector and compared exactly (a hash alone could merge bytes that
 * differ). */
static uint32_t byte_classes(const di_cfg *cfg, uint8_t *bcls) {
    size_t nw = ((size_t)cfg->n_cls + 63) / 64;
    if (!nw) { /* no terminals: every byte acts alike */
        memset(bcls, 0, 256);
        return 1;
    }
    uint64_t *vec = calloc(256 * nw, sizeof *vec); /* [256][nw] membership bits */
    if (!vec) { /* one entry per byte is exact too */
        for (unsigned b = 0; b < 256; b++) bcls[b] = (uint8_t)b;
        return 256;
    }
    for (uint32_t k = 0; k < cfg->n_cls; k++)
        for (int w = 0; w < 8; w++)
            for (uint32_t x = cfg->cls[k].bits[w]; x; x &= x - 1)
                vec[(size_t)(w * 32 + __builtin_ctz(x)) * nw + k / 64] |= 1ull << (k % 64);
    enum { SLOTS = 512 };
    int16_t slot[SLOTS]; /* -1 or the first byte of a class */
    memset(slot, 0xff, sizeof slot);
    uint32_t n = 0;
    for (unsigned b = 0; b < 256; b++) {
        const uint64_t *v = vec + (size_t)b * nw;
        uint64_t h = 0x9E3779B97F4A7C15ull;
        for (size_t w = 0; w < nw; w++) h = (h ^ v[w]) * 0xBF58476D1CE4E5B9ull;
        size_t x = (size_t)(h >> 55) & (SLOTS - 1);
        while (slot[x] >= 0 && memcmp(v, vec + (size_t)slot[x] * nw, nw * sizeof *v)) x = (x + 1) & (SLOTS - 1);
        if (slot[x] < 0) {
            slot[x] = (int16_t)b;
            bcls[b] = (uint8_t)n++;
        } else {
            bcls[b] = bcls[slot[x]];
        }
    }
    free(vec);
    return n;
}

int di_gcache_new(di_grammar_cache **out, const di_cfg *cfg, di_error *err) {
    *out = NULL;
    di_grammar_cache *c = calloc(1, sizeof *c);
    if (!c || pthread_mutex_init(&c->lock, NULL)) {
        free(c);
        return di_error_set(err, DI_ERR_NOMEM, "grammar: out of memory for the state cache");
    }
    c->max_states = DI_GCACHE_MAX_STATES;
    c->n_bcls = byte_classes(cfg, c->bcls);
    *out = c;
    return DI_OK;
}

static void table_free(di_gcache_table *t) {
    if (!t) return;
    if (t->rows) munmap(t->rows, t->rows_bytes);
    free(t->loop);
    free(t->loop_ready);
    free(t->scan);
    free(t->scan_ready);
    free(t->key);
    free(t->hash);
    free(t);
}

/* Tables of freed grammars, kept for the next grammar's first walk (process-wide). Creating a
 * table maps its rows, and that one mmap took 9-60 us of a grammar's first mask on the dev VM
 * (fourteenth round; the first mask is ~200 K instructions), plus a page fault per 4 KiB of rows
 * as states are added. A kept table is cleared where it was used (the rows of its interned
 * states, the ready flags, the key hash), so it is as new without a syscall, and its pages stay
 * committed. Only tables of the default capacity are kept, with rows mapped for any number of
 * byte classes, so every grammar can take any of them. Retired tables (a full table replaced
 * inside a walk) are unmapped as before: clearing one is a walk's worth of work. */
#define TABLE_POOL 2
#define POOL_ROWS_BYTES (((size_t)DI_GCACHE_MAX_STATES + 1) * 256 * sizeof(int16_t))
static pthread_mutex_t table_pool_lock = PTHREAD_MUTEX_INITIALIZER;
static di_gcache_table *table_pool[TABLE_POOL];

/* A kept table also commits its first POOL_TOUCH_ROWS bytes of rows and its per-state arrays for
 * POOL_TOUCH_STATES states, once (~170 pages, ~0.4 ms when the grammar is freed): a later grammar
 * whose states outgrow what the earlier ones used otherwise takes a page fault (~2.5 us on the dev
 * VM) on every 4 KiB of new rows, one on most of its cold masks (schema_medium: 1,470 states of 77
 * byte classes, 221 KiB of rows, ~55 faults; twenty-first round). */
#define POOL_TOUCH_ROWS ((size_t)512 * 1024)
#define POOL_TOUCH_STATES 2048
_Static_assert(POOL_TOUCH_ROWS <= POOL_ROWS_BYTES && POOL_TOUCH_STATES <= DI_GCACHE_MAX_STATES,
               "a kept table (cap DI_GCACHE_MAX_STATES, POOL_ROWS_BYTES of rows) holds what it commits");

static void table_keep(di_gcache_table *t) {
    if (!t) return;
    if (t->cap == DI_GCACHE_MAX_STATES && t->rows_bytes == POOL_ROWS_BYTES) {
        size_t used = ((size_t)t->n + 1) * t->n_bcls * sizeof *t->rows;
        memset((void *)t->rows, 0, used);
        memset(t->loop_ready, 0, ((size_t)t->n + 1) * sizeof *t->loop_ready);
        memset(t->scan_ready, 0, ((size_t)t->n + 1) * sizeof *t->scan_ready);
        memset(t->hash, 0xff, t->hcap * sizeof *t->hash);
        if (used > t->touched) t->touched = used;
        if (t->touched < POOL_TOUCH_ROWS) { /* zero already: the stores only commit the pages */
            memset((char *)t->rows + t->touched, 0, POOL_TOUCH_ROWS - t->touched);
            memset(t->key, 0, POOL_TOUCH_STATES * sizeof *t->key);
            memset(t->loop, 0, POOL_TOUCH_STATES * sizeof *t->loop);
            memset(t->scan, 0, POOL_TOUCH_STATES * sizeof *t->scan);
            memset(t->loop_ready, 0, POOL_TOUCH_STATES * sizeof *t->loop_ready);
            memset(t->scan_ready, 0, POOL_TOUCH_STATES * sizeof *t->scan_ready);
            t->touched = POOL_TOUCH_ROWS;
        }
        t->n = 0;
        t->refs = 0;
        pthread_mutex_lock(&table_pool_lock);
        for (int i = 0; i < TABLE_POOL && t; i++)
            if (!table_pool[i]) table_pool[i] = t, t = NULL;
        pthread_mutex_unlock(&table_pool_lock);
    }
    table_free(t);
}

/* The table's byte classes: n_bcls classes, bcls[b] per byte, and the lowest byte of each (brep). */
static void table_classes(di_gcache_table *t, uint32_t n_bcls, const uint8_t *bcls) {
    t->n_bcls = n_bcls;
    memcpy(t->bcls, bcls, sizeof t->bcls);
    memset(&t->brep, 0, sizeof t->brep);
    uint8_t seen[256] = {0};
    for (unsigned b = 0; b < 256; b++)
        if (!seen[bcls[b]]) {
            seen[bcls[b]] = 1;
            t->brep.bits[b >> 5] |= 1u << (b & 31);
        }
}

/* A table of cap states for byte classes bcls (n_bcls of them), rows mapped, nothing committed. */
static di_gcache_table *table_alloc(int32_t cap, uint32_t n_bcls, const uint8_t *bcls) {
    di_gcache_table *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->cap = cap;
    t->hcap = 256; /* grows with the states (intern_locked): a table sized for cap up front was
                      64 KiB of fresh pages to fill on every grammar's first mask */
    /* rows: a fresh anonymous mapping, zero without a memset (calloc of 8 MiB comes from the heap,
     * and is cleared there, once glibc's mmap threshold has grown past it: ~1 ms on every new
     * grammar's first mask); pages are committed as states are added. Mapped for 256 byte
     * classes at the default capacity, so that the table can serve any grammar later
     * (table_keep): address space only. */
    table_classes(t, n_bcls, bcls);
    t->rows_bytes = ((size_t)t->cap + 1) * t->n_bcls * sizeof *t->rows;
    if (t->cap == DI_GCACHE_MAX_STATES) t->rows_bytes = POOL_ROWS_BYTES;
    void *rows = mmap(NULL, t->rows_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    t->rows = rows == MAP_FAILED ? NULL : rows;
    /* loop and scan are read only once published (loop_ready, scan_ready): not cleared. A
     * cleared 160 KiB (calloc from the heap, once glibc's mmap threshold has grown past it) was
     * ~40 fresh pages on every grammar's first mask. */
    t->loop = malloc(((size_t)t->cap + 1) * sizeof *t->loop);
    t->loop_ready = calloc((size_t)t->cap + 1, sizeof *t->loop_ready);
    t->scan = malloc(((size_t)t->cap + 1) * sizeof *t->scan);
    t->scan_ready = calloc((size_t)t->cap + 1, sizeof *t->scan_ready);
    t->key = malloc(((size_t)t->cap + 1) * sizeof *t->key);
    t->hash = malloc(t->hcap * sizeof *t->hash);
    if (!t->rows || !t->loop || !t->loop_ready || !t->scan || !t->scan_ready || !t->key || !t->hash) {
        table_free(t);
        return NULL;
    }
    if (t->hash) memset(t->hash, 0xff, t->hcap * sizeof *t->hash);
    return t;
}

static di_gcache_table *table_new(di_grammar_cache *c) {
    di_gcache_table *t = NULL;
    if (c->max_states == DI_GCACHE_MAX_STATES) {
        pthread_mutex_lock(&table_pool_lock);
        for (int i = 0; i < TABLE_POOL && !t; i++)
            if (table_pool[i]) t = table_pool[i], table_pool[i] = NULL;
        pthread_mutex_unlock(&table_pool_lock);
    }
    if (t) {
        table_classes(t, c->n_bcls, c->bcls);
    } else {
        t = table_alloc(c->max_states, c->n_bcls, c->bcls);
        if (!t) return NULL;
    }
    t->serial = ++c->n_tables;
    return t;
}

void di_gcache_pool_seed(void) {
    pthread_mutex_lock(&table_pool_lock);
    bool empty = true;
    for (int i = 0; i < TABLE_POOL; i++) empty = empty && !table_pool[i];
    pthread_mutex_unlock(&table_pool_lock);
    if (!empty) return;
    static const uint8_t one_class[256];
    table_keep(table_alloc(DI_GCACHE_MAX_STATES, 1, one_class)); /* commits its first rows and arrays */
}

void di_gcache_set_max_states(di_grammar_cache *c, int32_t n) {
    pthread_mutex_lock(&c->lock);
    c->max_states = n < 1 ? 1 : n > DI_GCACHE_ID_MAX ? DI_GCACHE_ID_MAX : n;
    pthread_mutex_unlock(&c->lock);
}

void di_gcache_free(di_grammar_cache *c) {
    if (!c) return;
    table_keep(c->cur); /* retired tables were freed by their last walk */
    for (int i = 0; i < DI_GCACHE_BLOCKS; i++) {
        free(c->blocks[i].mask);
        free(c->blocks[i].ent);
    }
    for (int i = 0; i < DI_GCACHE_WALKS; i++) free(c->walks[i].ent);
    for (int i = 0; i < DI_GCACHE_MASKS; i++) {
        free(c->masks[i]);
        free(c->mlist[i]);
    }
    pthread_mutex_destroy(&c->lock);
    free(c);
}

di_gcache_table *di_gcache_acquire(di_grammar_cache *c) {
    pthread_mutex_lock(&c->lock);
    if (!c->cur) c->cur = table_new(c);
    di_gcache_table *t = c->cur;
    if (t) t->refs++;
    pthread_mutex_unlock(&c->lock);
    return t;
}

void di_gcache_release(di_grammar_cache *c, di_gcache_table *t) {
    if (!t) return;
    pthread_mutex_lock(&c->lock);
    bool retired = --t->refs == 0 && t != c->cur;
    pthread_mutex_unlock(&c->lock);
    if (retired) table_free(t);
}

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Double the key hash (under the lock; only interning reads it) once it is half full. */
static bool hash_grow(di_gcache_table *t) {
    size_t cap = t->hcap * 2;
    int32_t *h = malloc(cap * sizeof *h);
    if (!h) return false;
    memset(h, 0xff, cap * sizeof *h);
    for (int32_t id = 1; id <= t->n; id++) {
        size_t x = (size_t)(mix64(t->key[id].a) & (cap - 1));
        while (h[x] >= 0) x = (x + 1) & (cap - 1);
        h[x] = id;
    }
    free(t->hash);
    t->hash = h;
    t->hcap = cap;
    return true;
}

static int32_t intern_locked(di_grammar_cache *c, di_gcache_table *t, di_sig128 k) {
    size_t h = (size_t)(mix64(k.a) & (t->hcap - 1));
    while (t->hash[h] >= 0) {
        int32_t id = t->hash[h];
        if (t->key[id].a == k.a && t->key[id].b == k.b) return id;
        h = (h + 1) & (t->hcap - 1);
    }
    if (t->n >= t->cap) { /* ids 1..cap in use */
        if (t == c->cur) {
            /* Retire t: walks holding it keep reading it; new walks start on an empty table. On
             * allocation failure t stays current (full), which only disables memoization. */
            di_gcache_table *fresh = table_new(c);
            if (fresh) c->cur = fresh;
        }
        return DI_ST_NONE;
    }
    if (2 * ((size_t)t->n + 1) > t->hcap) {
        if (!hash_grow(t)) return DI_ST_NONE; /* without memory: not memoized, still exact */
        h = (size_t)(mix64(k.a) & (t->hcap - 1));
        while (t->hash[h] >= 0) h = (h + 1) & (t->hcap - 1);
    }
    int32_t id = ++t->n;
    t->key[id] = k;
    t->hash[h] = id;
    /* First touch of the row by a store: a row's first access is otherwise a lookup, which maps
     * the shared zero page, and its first transition then faults a second time to copy it. No
     * other thread can have stored into the row of an id that is not yet interned. */
    atomic_store_explicit(&t->rows[(size_t)id * t->n_bcls], DI_ST_UNKNOWN, memory_order_relaxed);
    atomic_store_explicit(&t->rows[((size_t)id + 1) * t->n_bcls - 1], DI_ST_UNKNOWN, memory_order_relaxed);
    return id;
}

int32_t di_gcache_intern(di_grammar_cache *c, di_gcache_table *t, di_sig128 k) {
    if (!t) return DI_ST_NONE;
    pthread_mutex_lock(&c->lock);
    int32_t id = intern_locked(c, t, k);
    pthread_mutex_unlock(&c->lock);
    return id;
}

/* Publish the bytes state id scans unless some walk did (under the lock). */
static void scan_put_locked(di_gcache_table *t, int32_t id, const di_cfg_class *scan) {
    if (id <= 0 || id > t->cap || atomic_load_explicit(&t->scan_ready[id], memory_order_relaxed)) return;
    t->scan[id] = *scan;
    atomic_store_explicit(&t->scan_ready[id], 1, memory_order_release);
}

int32_t di_gcache_intern_scan(di_grammar_cache *c, di_gcache_table *t, di_sig128 k, const di_cfg_class *scan) {
    if (!t) return DI_ST_NONE;
    pthread_mutex_lock(&c->lock);
    int32_t id = intern_locked(c, t, k);
    scan_put_locked(t, id, scan);
    pthread_mutex_unlock(&c->lock);
    return id;
}

void di_gcache_loop_put(di_grammar_cache *c, di_gcache_table *t, int32_t id, const di_gcache_loop *s) {
    if (!t || id <= 0 || id > t->cap) return;
    pthread_mutex_lock(&c->lock);
    if (!atomic_load_explicit(&t->loop_ready[id], memory_order_relaxed)) {
        t->loop[id] = *s;
        atomic_store_explicit(&t->loop_ready[id], 1, memory_order_release);
    }
    pthread_mutex_unlock(&c->lock);
}

void di_gcache_scan_put(di_grammar_cache *c, di_gcache_table *t, int32_t id, const di_cfg_class *scan) {
    if (!t || id <= 0 || id > t->cap) return;
    pthread_mutex_lock(&c->lock);
    scan_put_locked(t, id, scan);
    pthread_mutex_unlock(&c->lock);
}

/* The first vocabulary that stores a mask owns the mask cache; a matcher with another one
 * (identified by content, not by address, which a later vocabulary could reuse) runs uncached. */
static bool vocab_ok(di_grammar_cache *c, const di_grammar_vocab *v) {
    if (!c->words) {
        size_t words = di_grammar_mask_words(v->n_vocab);
        c->vocab_fp = v->fingerprint;
        c->vocab_n = v->n_vocab;
        c->words = words;
    }
    return c->vocab_fp == v->fingerprint && c->vocab_n == v->n_vocab;
}

/* The mask of used slot i into mask (all words written). Under the lock. */
static void slot_copy(const di_grammar_cache *c, int i, uint32_t *mask) {
    if (c->mlen[i] < 0) {
        memcpy(mask, c->masks[i], c->words * sizeof *mask);
        return;
    }
    memset(mask, 0, c->words * sizeof *mask);
    for (int32_t x = 0; x < c->mlen[i]; x++) mask[c->mlist[i][x] >> 5] |= 1u << (c->mlist[i][x] & 31);
}

bool di_gcache_mask_get(di_grammar_cache *c, const di_grammar_vocab *v, di_sig128 k, uint32_t *mask) {
    bool hit = false;
    pthread_mutex_lock(&c->lock);
    if (vocab_ok(c, v))
        for (int i = 0; i < DI_GCACHE_MASKS; i++)
            if (c->mused[i] && c->mkey[i].a == k.a && c->mkey[i].b == k.b) {
                slot_copy(c, i, mask);
                hit = true;
                break;
            }
    pthread_mutex_unlock(&c->lock);
    return hit;
}

bool di_gcache_block_get(di_grammar_cache *c, const di_grammar_vocab *v, uint64_t table, di_sig128 k, uint32_t *mask,
                         di_gcache_ctxtok *ent, uint32_t cap, uint32_t *n) {
    bool hit = false;
    pthread_mutex_lock(&c->lock);
    if (vocab_ok(c, v))
        for (int i = 0; i < DI_GCACHE_BLOCKS && !hit; i++) {
            di_gcache_block *b = &c->blocks[i];
            if (!b->used || b->table != table || b->key.a != k.a || b->key.b != k.b || b->n_ent > cap) continue;
            memcpy(mask, b->mask, c->words * sizeof *mask);
            memcpy(ent, b->ent, b->n_ent * sizeof *ent);
            *n = b->n_ent;
            hit = true;
        }
    pthread_mutex_unlock(&c->lock);
    return hit;
}

void di_gcache_block_put(di_grammar_cache *c, const di_grammar_vocab *v, uint64_t table, di_sig128 k,
                         const uint32_t *mask, const di_gcache_ctxtok *ent, uint32_t n) {
    pthread_mutex_lock(&c->lock);
    if (vocab_ok(c, v)) {
        di_gcache_block *b = &c->blocks[c->bnext++ % DI_GCACHE_BLOCKS];
        uint32_t *bm = b->mask ? b->mask : malloc(c->words * sizeof *bm);
        di_gcache_ctxtok *be = realloc(b->ent, (n ? n : 1) * sizeof *be);
        if (bm) b->mask = bm;
        if (be) b->ent = be;
        b->used = bm && be;
        if (b->used) {
            memcpy(b->mask, mask, c->words * sizeof *mask);
            memcpy(b->ent, ent, n * sizeof *ent);
            b->n_ent = n;
            b->key = k;
            b->table = table;
        }
    }
    pthread_mutex_unlock(&c->lock);
}

int32_t di_gcache_mask_put(di_grammar_cache *c, const di_grammar_vocab *v, di_sig128 k, const uint32_t *mask) {
    pthread_mutex_lock(&c->lock);
    int32_t slot = -1;
    for (int i = 0; i < DI_GCACHE_MASKS && slot < 0; i++)
        if (c->mused[i] && c->mkey[i].a == k.a && c->mkey[i].b == k.b) slot = i; /* a racing matcher stored it */
    if (slot < 0 && vocab_ok(c, v)) {
        uint32_t i = c->mnext++ % DI_GCACHE_MASKS;
        if (!c->masks[i]) c->masks[i] = malloc(c->words * sizeof *c->masks[i]);
        c->mused[i] = c->masks[i] != NULL;
        if (c->mused[i]) {
            c->mkey[i] = k;
            c->mlen[i] = -1;
            memcpy(c->masks[i], mask, c->words * sizeof *mask);
            slot = (int32_t)i;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return slot;
}

int32_t di_gcache_mask_put_list(di_grammar_cache *c, const di_grammar_vocab *v, di_sig128 k, const int32_t *toks,
                                uint32_t n) {
    if (n > DI_GCACHE_LIST_MAX) return -1;
    pthread_mutex_lock(&c->lock);
    int32_t slot = -1;
    for (int i = 0; i < DI_GCACHE_MASKS && slot < 0; i++)
        if (c->mused[i] && c->mkey[i].a == k.a && c->mkey[i].b == k.b) slot = i;
    if (slot < 0 && vocab_ok(c, v)) {
        uint32_t i = c->mnext++ % DI_GCACHE_MASKS;
        if (c->mcap[i] < n || !c->mlist[i]) {
            uint32_t cap = n < 256 ? 256 : n;
            int32_t *l = realloc(c->mlist[i], cap * sizeof *l);
            if (l) c->mlist[i] = l, c->mcap[i] = cap;
        }
        c->mused[i] = c->mlist[i] != NULL && c->mcap[i] >= n;
        if (c->mused[i]) {
            c->mkey[i] = k;
            c->mlen[i] = (int32_t)n;
            memcpy(c->mlist[i], toks, n * sizeof *toks);
            c->n_list_puts++;
            slot = (int32_t)i;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return slot;
}

bool di_gcache_walk_get(di_grammar_cache *c, const di_grammar_vocab *v, uint64_t table, di_sig128 k, uint32_t *mask,
                        di_gcache_ctxtok *ent, uint32_t cap, uint32_t *n) {
    bool hit = false;
    pthread_mutex_lock(&c->lock);
    if (vocab_ok(c, v))
        for (int i = 0; i < DI_GCACHE_WALKS && !hit; i++) {
            const di_gcache_walk *w = &c->walks[i];
            if (!w->used || w->table != table || w->key.a != k.a || w->key.b != k.b || w->n_ent > cap) continue;
            if (!c->mused[w->mslot] || c->mkey[w->mslot].a != w->mkey.a || c->mkey[w->mslot].b != w->mkey.b) continue;
            slot_copy(c, w->mslot, mask);
            memcpy(ent, w->ent, w->n_ent * sizeof *ent);
            *n = w->n_ent;
            hit = true;
        }
    pthread_mutex_unlock(&c->lock);
    return hit;
}

void di_gcache_walk_put(di_grammar_cache *c, const di_grammar_vocab *v, uint64_t table, di_sig128 k, int32_t mslot,
                        di_sig128 mkey, const di_gcache_ctxtok *ent, uint32_t n) {
    if (mslot < 0 || mslot >= DI_GCACHE_MASKS) return;
    pthread_mutex_lock(&c->lock);
    if (vocab_ok(c, v)) {
        di_gcache_walk *w = &c->walks[c->wnext++ % DI_GCACHE_WALKS];
        di_gcache_ctxtok *we = realloc(w->ent, (n ? n : 1) * sizeof *we);
        if (we) w->ent = we;
        w->used = we != NULL;
        if (w->used) {
            memcpy(w->ent, ent, n * sizeof *ent);
            w->n_ent = n;
            w->key = k, w->mkey = mkey;
            w->table = table;
            w->mslot = (uint32_t)mslot;
        }
    }
    pthread_mutex_unlock(&c->lock);
}
