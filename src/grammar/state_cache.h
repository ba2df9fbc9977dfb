/* Per-grammar cache shared by every matcher of one compiled grammar: the lazily built automaton
 * over parse states and the masks of recently seen states. A new request of a known grammar
 * starts warm instead of re-walking the token trie with Earley pushes.
 *
 * Concurrency: matchers of one grammar may fill masks on several worker threads at once.
 *   - Transitions (the hot path of the trie walk) are read without a lock: each entry is an
 *     atomic int32 that goes from ST_UNKNOWN to a final value exactly once in meaning (racing
 *     writers store the same value: successor keys are structural and interning is locked).
 *     The release store of a successor id happens after that state's row was initialized, so a
 *     reader that acquires the id sees an initialized row.
 *   - Interning a new state and the mask cache take the mutex; both sit next to work that is far
 *     slower (an Earley push; a trie walk or a 16 KiB copy).
 * Rows are allocated in chunks that never move, so lock-free readers never see a realloc.
 * The table does not restart when full: states beyond DI_GCACHE_MAX_STATES are walked with
 * Earley pushes (correct, only slower). */
#ifndef DI_GRAMMAR_STATE_CACHE_H
#define DI_GRAMMAR_STATE_CACHE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "grammar/grammar_impl.h"

/* 128-bit structural signature of an Earley state (matcher.c: state_key). */
typedef struct di_sig128 {
    uint64_t a, b;
} di_sig128;

#define DI_ST_UNKNOWN (-2)
#define DI_ST_DEAD (-1)
#define DI_ST_NONE (-3)            /* table full: this state is not interned, walk it with Earley */
#define DI_GCACHE_CHUNK 256        /* states per row chunk (256 KiB of transitions) */
#define DI_GCACHE_MAX_STATES 16384 /* <= 16 MiB of transitions per grammar, allocated by chunk */
#define DI_GCACHE_MASKS 256        /* masks remembered per grammar (16 KiB each at V = 129,280) */

typedef _Atomic int32_t di_gcache_row[256]; /* successor id per byte, DI_ST_DEAD or DI_ST_UNKNOWN */

struct di_grammar_cache {
    pthread_mutex_t lock;
    /* automaton; chunk[c] is written under the lock before any id in it is published */
    di_gcache_row *chunk[DI_GCACHE_MAX_STATES / DI_GCACHE_CHUNK];
    di_sig128 *key;  /* [DI_GCACHE_MAX_STATES] interned keys (under the lock) */
    int32_t *hash;   /* [2 * DI_GCACHE_MAX_STATES] key -> id, open addressing, -1 = empty */
    int32_t n;       /* interned states (under the lock) */
    /* masks, valid for the vocabulary with this fingerprint (the first one used) */
    uint64_t vocab_fp;
    uint32_t vocab_n;
    size_t words;
    uint32_t *masks;                      /* [DI_GCACHE_MASKS][words] */
    di_sig128 mkey[DI_GCACHE_MASKS];
    uint8_t mused[DI_GCACHE_MASKS];
    uint32_t mnext;                       /* round-robin replacement */
};

int di_gcache_new(di_grammar_cache **out, di_error *err);
void di_gcache_free(di_grammar_cache *c);

/* Id of state k, interning it if new; DI_ST_NONE when the table is full or out of memory. */
int32_t di_gcache_intern(di_grammar_cache *c, di_sig128 k);

static inline _Atomic int32_t *di_gcache_trans(di_grammar_cache *c, int32_t id, uint8_t b) {
    return &c->chunk[id / DI_GCACHE_CHUNK][id % DI_GCACHE_CHUNK][b];
}
static inline int32_t di_gcache_next(di_grammar_cache *c, int32_t id, uint8_t b) {
    return atomic_load_explicit(di_gcache_trans(c, id, b), memory_order_acquire);
}
static inline void di_gcache_set_next(di_grammar_cache *c, int32_t id, uint8_t b, int32_t next) {
    atomic_store_explicit(di_gcache_trans(c, id, b), next, memory_order_release);
}

/* Copy the cached mask of state k (EOS bits excluded) into mask; false if absent. */
bool di_gcache_mask_get(di_grammar_cache *c, const di_grammar_vocab *v, di_sig128 k, uint32_t *mask);
/* Remember mask for state k (best effort: silently skipped without memory or for a second vocab). */
void di_gcache_mask_put(di_grammar_cache *c, const di_grammar_vocab *v, di_sig128 k, const uint32_t *mask);

#endif
