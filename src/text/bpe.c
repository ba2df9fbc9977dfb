/* Byte-level BPE: the GPT-2 byte<->unicode map and the rank-ordered merge loop.
 *
 * Merge order must equal HF `tokenizers` (models/bpe/word.rs): repeatedly apply the pair with the lowest
 * merge rank, and among equal ranks (the same pair at several places) the leftmost one first; a merge
 * creates new candidate pairs with both neighbours. A min-heap keyed (rank, position) over a linked list of
 * symbols gives that order in O(n log n); stale heap entries are recognised by re-looking-up the pair. */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_internal.h"
#include "util/error.h"

/* GPT-2 map: printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') spell themselves; the other 68 bytes
 * get codepoints 256, 257, ... in byte order. */
static bool bytelevel_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* The 68 non-printable bytes are 0x00-0x20 (-> 256..288), 0x7F-0xA0 (-> 289..322) and 0xAD (-> 323). */
uint32_t di_bytelevel_cp(uint8_t b) {
    if (bytelevel_printable(b)) return b;
    if (b <= 0x20) return 256u + b;
    if (b <= 0xA0) return 162u + b;
    return 323; /* 0xAD */
}

int di_bytelevel_byte(uint32_t cp) {
    if (cp < 256) return bytelevel_printable(cp) ? (int)cp : -1;
    if (cp <= 288) return (int)(cp - 256);
    if (cp <= 322) return (int)(cp - 162);
    return cp == 323 ? 0xAD : -1;
}

static inline uint32_t merge_hash(uint64_t key) {
    key *= 0x9E3779B97F4A7C15ull;
    return (uint32_t)(key >> 32);
}

void di_merges_put(di_tokenizer *t, int32_t left, int32_t right, int32_t rank, int32_t merged) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    uint32_t mask = t->merge_cap - 1;
    for (uint32_t i = merge_hash(key) & mask;; i = (i + 1) & mask) {
        di_merge_slot *s = &t->merges[i];
        if (s->key == UINT64_MAX) {
            *s = (di_merge_slot){key, rank, merged};
            t->n_merges++;
            return;
        }
        if (s->key == key) return; /* duplicate merge line: HF keeps the first (lowest) rank */
    }
}

static inline const di_merge_slot *merge_get(const di_tokenizer *t, int32_t left, int32_t right) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    uint32_t mask = t->merge_cap - 1;
    for (uint32_t i = merge_hash(key) & mask;; i = (i + 1) & mask) {
        const di_merge_slot *s = &t->merges[i];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
    }
}

void di_bpe_scratch_free(di_bpe_scratch *s) {
    free(s->sym);
    free(s->prev);
    free(s->next);
    free(s->heap);
    memset(s, 0, sizeof *s);
}

static bool scratch_reserve(di_bpe_scratch *s, size_t n) {
    if (n <= s->cap) return true;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < n) cap *= 2;
    int32_t *sym = realloc(s->sym, cap * sizeof *sym);
    if (sym) s->sym = sym;
    int32_t *prev = realloc(s->prev, cap * sizeof *prev);
    if (prev) s->prev = prev;
    int32_t *next = realloc(s->next, cap * sizeof *next);
    if (next) s->next = next;
    /* each merge pushes at most two candidates on top of the n - 1 initial ones */
    uint64_t *heap = realloc(s->heap, 3 * cap * sizeof *heap);
    if (heap) s->heap = heap;
    if (!sym || !prev || !next || !heap) return false;
    s->cap = cap;
    s->heap_cap = 3 * cap;
    return true;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && h[c + 1] < h[c]) c++;
        if (v <= h[c]) break;
        h[i] = h[c];
        i = c;
    }
    if (m) h[i] = v;
    return top;
}

/* Candidate (rank, left position): ranks and positions are both < 2^31, so the packed key orders by rank
 * and then by position, i.e. leftmost first among equal ranks. */
static void push_pair(const di_tokenizer *t, di_bpe_scratch *sc, size_t *nh, int32_t pos) {
    int32_t nx = sc->next[pos];
    if (nx < 0) return;
    const di_merge_slot *m = merge_get(t, sc->sym[pos], sc->sym[nx]);
    if (m) heap_push(sc->heap, nh, (uint64_t)(uint32_t)m->rank << 32 | (uint32_t)pos);
}

int di_bpe_cache_new(di_tokenizer *t) {
    t->cache = calloc(1, sizeof *t->cache);
    if (!t->cache) return DI_ERR_NOMEM;
    for (int i = 0; i < DI_BPE_CACHE_LOCKS; i++) pthread_mutex_init(&t->cache->lock[i], NULL);
    return DI_OK;
}

void di_bpe_cache_free(di_tokenizer *t) {
    if (!t->cache) return;
    for (int i = 0; i < DI_BPE_CACHE_LOCKS; i++) pthread_mutex_destroy(&t->cache->lock[i]);
    free(t->cache);
    t->cache = NULL;
}

static uint32_t piece_hash(const uint8_t *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return (uint32_t)((h * 0x9E3779B97F4A7C15ull) >> 40);
}

/* Appends the cached ids of piece s, if present. Returns 1 on a hit, 0 on a miss, -1 on allocation failure. */
static int cache_get(di_bpe_cache *c, uint32_t h, const uint8_t *s, size_t n, di_idvec *out) {
    di_bpe_cache_slot *e = &c->slot[h & (DI_BPE_CACHE_SLOTS - 1)];
    int32_t ids[DI_BPE_CACHE_IDS];
    int k = 0;
    pthread_mutex_t *m = &c->lock[h % DI_BPE_CACHE_LOCKS];
    pthread_mutex_lock(m);
    if (e->key_len == n && !memcmp(e->key, s, n)) {
        k = e->n_ids;
        memcpy(ids, e->ids, (size_t)k * sizeof *ids);
    }
    pthread_mutex_unlock(m);
    for (int i = 0; i < k; i++)
        if (!di_idvec_push(out, ids[i])) return -1;
    return k > 0;
}

static void cache_put(di_bpe_cache *c, uint32_t h, const uint8_t *s, size_t n, const int32_t *ids, size_t k) {
    if (k > DI_BPE_CACHE_IDS) return;
    di_bpe_cache_slot *e = &c->slot[h & (DI_BPE_CACHE_SLOTS - 1)];
    pthread_mutex_t *m = &c->lock[h % DI_BPE_CACHE_LOCKS];
    pthread_mutex_lock(m);
    e->key_len = (uint8_t)n;
    e->n_ids = (uint8_t)k;
    memcpy(e->key, s, n);
    memcpy(e->ids, ids, k * sizeof *ids);
    pthread_mutex_unlock(m);
}

bool di_bpe_encode_piece(const di_tokenizer *t, const uint8_t *s, size_t n, di_bpe_scratch *sc,
                         di_idvec *out) {
    if (n == 0) return true;
    if (n == 1) return di_idvec_push(out, t->byte_id[s[0]]);
    bool cacheable = t->cache && n <= DI_BPE_CACHE_KEY;
    uint32_t h = 0;
    if (cacheable) {
        h = piece_hash(s, n);
        int hit = cache_get(t->cache, h, s, n, out);
        if (hit) return hit > 0;
    }
    size_t first = out->n;
    if (!scratch_reserve(sc, n)) return false;
    for (size_t i = 0; i < n; i++) {
        sc->sym[i] = t->byte_id[s[i]];
        sc->prev[i] = (int32_t)i - 1;
        sc->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    size_t nh = 0;
    for (size_t i = 0; i + 1 < n; i++) push_pair(t, sc, &nh, (int32_t)i);
    while (nh > 0) {
        uint64_t top = heap_pop(sc->heap, &nh);
        int32_t pos = (int32_t)(uint32_t)top, rank = (int32_t)(top >> 32);
        if (sc->sym[pos] < 0) continue; /* merged away into its left neighbour */
        int32_t nx = sc->next[pos];
        if (nx < 0) continue;
        const di_merge_slot *m = merge_get(t, sc->sym[pos], sc->sym[nx]);
        if (!m || m->rank != rank) continue; /* a neighbour changed since this entry was pushed */
        sc->sym[pos] = m->merged;
        sc->sym[nx] = -1;
        sc->next[pos] = sc->next[nx];
        if (sc->next[nx] >= 0) sc->prev[sc->next[nx]] = pos;
        if (sc->prev[pos] >= 0) push_pair(t, sc, &nh, sc->prev[pos]);
        push_pair(t, sc, &nh, pos);
    }
    for (int32_t i = 0; i >= 0; i = sc->next[i])
        if (!di_idvec_push(out, sc->sym[i])) return false;
    if (cacheable) cache_put(t->cache, h, s, n, out->p + first, out->n - first);
    return true;
}
