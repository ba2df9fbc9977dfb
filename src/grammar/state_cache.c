/* Per-grammar state automaton and mask cache shared by matchers (see state_cache.h). */
#include <stdlib.h>
#include <string.h>

#include "grammar/state_cache.h"

int di_gcache_new(di_grammar_cache **out, di_error *err) {
    *out = NULL;
    di_grammar_cache *c = calloc(1, sizeof *c);
    if (!c || pthread_mutex_init(&c->lock, NULL)) {
        free(c);
        return di_error_set(err, DI_ERR_NOMEM, "grammar: out of memory for the state cache");
    }
    *out = c;
    return DI_OK;
}

void di_gcache_free(di_grammar_cache *c) {
    if (!c) return;
    for (size_t i = 0; i < DI_GCACHE_MAX_STATES / DI_GCACHE_CHUNK; i++) free(c->chunk[i]);
    free(c->key);
    free(c->hash);
    free(c->masks);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static int32_t intern_locked(di_grammar_cache *c, di_sig128 k) {
    const size_t hcap = 2 * (size_t)DI_GCACHE_MAX_STATES;
    if (!c->hash) {
        c->hash = malloc(hcap * sizeof *c->hash);
        c->key = malloc((size_t)DI_GCACHE_MAX_STATES * sizeof *c->key);
        if (!c->hash || !c->key) {
            free(c->hash), free(c->key);
            c->hash = NULL, c->key = NULL;
            return DI_ST_NONE; /* out of memory only disables memoization */
        }
        memset(c->hash, 0xff, hcap * sizeof *c->hash);
    }
    size_t h = (size_t)(mix64(k.a) & (hcap - 1));
    while (c->hash[h] >= 0) {
        int32_t id = c->hash[h];
        if (c->key[id].a == k.a && c->key[id].b == k.b) return id;
        h = (h + 1) & (hcap - 1);
    }
    if (c->n >= DI_GCACHE_MAX_STATES) return DI_ST_NONE;
    int32_t id = c->n;
    di_gcache_row **ch = &c->chunk[id / DI_GCACHE_CHUNK];
    if (!*ch && !(*ch = malloc(DI_GCACHE_CHUNK * sizeof **ch))) return DI_ST_NONE;
    for (int b = 0; b < 256; b++) atomic_init(&(*ch)[id % DI_GCACHE_CHUNK][b], DI_ST_UNKNOWN);
    c->key[id] = k;
    c->hash[h] = id;
    c->n++;
    return id;
}

int32_t di_gcache_intern(di_grammar_cache *c, di_sig128 k) {
    pthread_mutex_lock(&c->lock);
    int32_t id = intern_locked(c, k);
    pthread_mutex_unlock(&c->lock);
    return id;
}

/* The first vocabulary that stores a mask owns the mask cache; a matcher with another one
 * (identified by content, not by address, which a later vocabulary could reuse) runs uncached. */
static bool vocab_ok(di_grammar_cache *c, const di_grammar_vocab *v) {
    if (!c->masks) {
        size_t words = di_grammar_mask_words(v->n_vocab);
        if (!(c->masks = malloc((size_t)DI_GCACHE_MASKS * words * sizeof *c->masks))) return false;
        c->vocab_fp = v->fingerprint;
        c->vocab_n = v->n_vocab;
        c->words = words;
    }
    return c->vocab_fp == v->fingerprint && c->vocab_n == v->n_vocab;
}

bool di_gcache_mask_get(di_grammar_cache *c, const di_grammar_vocab *v, di_sig128 k, uint32_t *mask) {
    bool hit = false;
    pthread_mutex_lock(&c->lock);
    if (vocab_ok(c, v))
        for (int i = 0; i < DI_GCACHE_MASKS; i++)
            if (c->mused[i] && c->mkey[i].a == k.a && c->mkey[i].b == k.b) {
                memcpy(mask, c->masks + (size_t)i * c->words, c->words * sizeof *mask);
                hit = true;
                break;
            }
    pthread_mutex_unlock(&c->lock);
    return hit;
}

void di_gcache_mask_put(di_grammar_cache *c, const di_grammar_vocab *v, di_sig128 k, const uint32_t *mask) {
    pthread_mutex_lock(&c->lock);
    bool present = false;
    for (int i = 0; i < DI_GCACHE_MASKS && !present; i++)
        present = c->mused[i] && c->mkey[i].a == k.a && c->mkey[i].b == k.b; /* a racing matcher stored it */
    if (!present && vocab_ok(c, v)) {
        uint32_t i = c->mnext++ % DI_GCACHE_MASKS;
        c->mkey[i] = k;
        c->mused[i] = 1;
        memcpy(c->masks + (size_t)i * c->words, mask, c->words * sizeof *mask);
    }
    pthread_mutex_unlock(&c->lock);
}
