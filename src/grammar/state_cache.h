/* Per-grammar cache shared by every matcher of one compiled grammar: the lazily built automaton
 * over parse states and the masks of recently seen states. A new request of a known grammar
 * starts warm instead of re-walking the token trie with Earley pushes.
 *
 * Concurrency: matchers of one grammar may fill masks on several worker threads at once.
 *   - Transitions (the hot path of the trie walk) are read without a lock: each entry (one per
 *     state and byte class) is an atomic int16 that goes from DI_ST_UNKNOWN (0, the zero fill of
 *     the mapping) to a final value exactly once in meaning (racing writers store the same value:
 *     successor keys are structural and interning is locked). The only initializing store (the
 *     first touch of a new row at interning, before its id is published) writes DI_ST_UNKNOWN
 *     again, so a reader observes 0 or a final value and relaxed ordering suffices: an acquire
 *     load would act as a compiler barrier on every trie node of the walk.
 *   - Interning a new state and the mask cache take the mutex; both sit next to work that is far
 *     slower (an Earley push; a trie walk or a 16 KiB copy).
 * Rows never move (one allocation per table; the kernel commits its pages as states are added),
 * so lock-free readers never see a realloc. A trie walk holds a reference to the table it started
 * with; when that table is full, the walk finishes it with Earley pushes and the grammar switches
 * to a fresh table for later walks. The old table is freed when its last walk releases it, so a
 * grammar with an unbounded number of parse states keeps a bounded table. */
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

#define DI_ST_UNKNOWN 0 /* state ids start at 1 */
#define DI_ST_DEAD (-1)
#define DI_ST_CONTEXT (-2)         /* from a context-free state: the byte completes into the context */
#define DI_ST_CONTEXT_0 (-16)      /* DI_ST_CONTEXT_0 - b: as DI_ST_CONTEXT, and the byte acts like b */
#define DI_ST_NONE (-3)            /* table full: this state is not interned, walk it with Earley */
#define DI_GCACHE_MAX_STATES 8192  /* per table (<= DI_GCACHE_ID_MAX): <= 4 MiB of transitions, committed as used */
#define DI_GCACHE_ID_MAX 32767     /* transitions are int16: ids and the DI_ST_* values above fit */
_Static_assert(DI_GCACHE_MAX_STATES <= DI_GCACHE_ID_MAX && DI_ST_CONTEXT_0 - 255 >= -32768, "int16 transitions");
#define DI_GCACHE_MASKS 256        /* masks remembered per grammar (16 KiB each at V = 129,280) */
#define DI_GCACHE_LIST_MAX 2048    /* a mask of at most this many tokens is remembered as their list */
#define DI_GCACHE_BLOCKS 32        /* context-free block masks remembered per grammar */
#define DI_GCACHE_WALKS 32         /* context-free trie walks remembered per grammar */


/* What a state does on whole characters, for accepting tokens without walking them
 * (matcher.c: loop_summary). next: the state most characters lead to (the state itself for a
 * loop such as "inside a string"), or 0. ascii: the ASCII buckets (di_ascii_bucket) all of whose
 * bytes lead to next. utf8: every valid multi-byte UTF-8 character leads to next through live
 * states. */
typedef struct di_gcache_loop {
    int32_t next;
    uint32_t ascii;
    uint8_t utf8;
    uint8_t rep;    /* an ASCII byte that leads to next (0: none) */
    uint8_t nohigh; /* the state takes no byte >= 0x80 at all */
    uint8_t n_next; /* ASCII bytes that lead to next */
    uint32_t scanned; /* ASCII buckets with a byte the state takes at all */
} di_gcache_loop;

/* One generation of the automaton. Everything but rows and the published loop summaries is
 * accessed under the cache's lock. */
typedef struct di_gcache_table {
    /* Transitions: successor id, DI_ST_DEAD, DI_ST_CONTEXT_0 - b or DI_ST_UNKNOWN per state and
     * byte class (bcls: bytes that every terminal of the grammar treats alike, and so every
     * Earley set: one entry serves them all). A JSON grammar has ~30-90 classes and ids fit in
     * 16 bits, so a row is 60-180 bytes instead of 1 KiB, and a new state touches a fresh page
     * 6-16x less often (a first touch costs ~3 us on the dev VM; a state of a counted string is
     * new per count). */
    _Atomic int16_t *rows; /* [(cap + 1) * n_bcls] zero-filled (mmap); row 0 unused (id 0 means DI_ST_UNKNOWN) */
    size_t rows_bytes;
    uint32_t n_bcls;       /* byte classes of the grammar (1..256) */
    uint8_t bcls[256];     /* class of each byte */
    di_cfg_class brep;     /* the lowest byte of each class: one store per row entry (matcher.c: set_next_all) */
    di_gcache_loop *loop;        /* [cap + 1] loop summary per state, valid once loop_ready[id] */
    _Atomic uint8_t *loop_ready; /* [cap + 1] */
    di_cfg_class *scan;          /* [cap + 1] bytes the state's Earley set scans, valid once scan_ready[id] */
    _Atomic uint8_t *scan_ready; /* [cap + 1] */
    di_sig128 *key;      /* [cap + 1] interned keys */
    int32_t *hash;       /* [hcap] key -> id, open addressing, -1 = empty */
    size_t hcap;         /* power of two >= 2 * n, doubled as states are interned */
    int32_t n, cap;      /* interned states (ids 1..n), capacity */
    int32_t refs;        /* walks using this table */
    size_t touched;      /* kept tables: bytes of rows (and states of the per-state arrays, POOL_TOUCH_STATES)
                            known committed, so that a later grammar's new states take no page fault */
    uint64_t serial;     /* which generation (state ids mean nothing across tables) */
} di_gcache_table;

/* A token of a block mask whose walk reached the context, or a trie node where a trie walk reached
 * it: from context-free state `parent` (at `depth` - 1), byte `byte` completes into the context
 * (matcher.c: loop_mask, walk_trie). */
typedef struct di_gcache_ctxtok {
    union {
        int32_t tok;  /* block mask: the token, walked again per context */
        int32_t node; /* trie walk: the trie node whose whole subtree is walked again per context */
    };
    int32_t parent;
    uint16_t depth;
    uint8_t byte, accepted; /* accepted: scratch for the walk that records it */
} di_gcache_ctxtok;

/* The context-free part of a block mask of one context-free root state: the tokens decided
 * without the context, and the tokens that reach it (walked again per context). */
typedef struct di_gcache_block {
    di_sig128 key;
    uint64_t table;
    uint32_t *mask;
    di_gcache_ctxtok *ent;
    uint32_t n_ent;
    uint8_t used;
} di_gcache_block;

/* A trie walk of one context-free root (matcher.c: walk_trie). Its mask is the one the mask cache
 * keeps in slot mslot for the walk's full key mkey (while the slot still holds it), less the
 * tokens of the listed subtrees, which reach the context and are walked again per context: no
 * copy of its own (a stored walk that no later walk uses costs only its list). */
typedef struct di_gcache_walk {
    di_sig128 key, mkey;
    uint64_t table;
    uint32_t mslot;
    di_gcache_ctxtok *ent;
    uint32_t n_ent;
    uint8_t used;
} di_gcache_walk;

struct di_grammar_cache {
    pthread_mutex_t lock;
    uint32_t n_bcls;      /* the grammar's byte classes (di_gcache_new), copied into each table */
    uint8_t bcls[256];
    di_gcache_table *cur; /* table new walks use (NULL until the first walk) */
    int32_t max_states;   /* capacity of new tables (DI_GCACHE_MAX_STATES) */
    uint64_t n_tables;    /* tables created so far (a new one each time the current one fills) */
    /* masks, valid for the vocabulary with this fingerprint (the first one used) */
    uint64_t vocab_fp;
    uint32_t vocab_n;
    size_t words;
    /* one heap block per slot, allocated when first filled: a fresh 4 MiB mapping cost a page
     * fault per 4 KiB on first touch (4 per cached mask, ~3 us each on the dev VM), whereas
     * 16 KiB blocks usually come from memory the heap already holds */
    uint32_t *masks[DI_GCACHE_MASKS];     /* [DI_GCACHE_MASKS] -> [words] or NULL */
    /* A mask of at most DI_GCACHE_LIST_MAX tokens is kept as their list (mlen[i] >= 0) instead:
     * a walk that allows a few hundred tokens (a key, a number, a value's first bytes) then
     * stores a few KiB, not a copy of 16 KiB to a block the cold request has not touched. */
    int32_t *mlist[DI_GCACHE_MASKS];      /* [DI_GCACHE_MASKS] -> [mcap[i]] or NULL */
    int32_t mlen[DI_GCACHE_MASKS];        /* tokens in mlist[i], or -1: the mask is masks[i] */
    uint32_t mcap[DI_GCACHE_MASKS];
    di_sig128 mkey[DI_GCACHE_MASKS];
    uint8_t mused[DI_GCACHE_MASKS];
    uint64_t n_list_puts;                 /* masks stored as lists (tests) */
    uint32_t mnext;                       /* round-robin replacement */
    di_gcache_block blocks[DI_GCACHE_BLOCKS];
    uint32_t bnext;
    di_gcache_walk walks[DI_GCACHE_WALKS];
    uint32_t wnext;
};

/* A cache for the grammar whose terminals are cfg's byte classes (read once: the partition of
 * the bytes that no terminal tells apart). */
int di_gcache_new(di_grammar_cache **out, const di_cfg *cfg, di_error *err);
void di_gcache_free(di_grammar_cache *c);
/* Put one table, its first rows and per-state arrays committed, into the process-wide pool of
 * kept tables if the pool is empty (~0.4 ms, once per process; di_grammar_vocab_new calls it).
 * The first grammar of a process otherwise maps a fresh table on its first mask and takes a page
 * fault on every 4 KiB of new rows (schema_medium alone: 56 faults over 50 of its cold masks). */
void di_gcache_pool_seed(void);
/* Tests: capacity of tables created from now on, so table replacement runs on small inputs. */
void di_gcache_set_max_states(di_grammar_cache *c, int32_t n);

/* The current table, referenced for one trie walk (NULL without memory: walk with Earley only). */
di_gcache_table *di_gcache_acquire(di_grammar_cache *c);
void di_gcache_release(di_grammar_cache *c, di_gcache_table *t);

/* Id of state k in t, interning it if new; DI_ST_NONE when t is NULL or full (a full current
 * table is replaced for later walks). */
int32_t di_gcache_intern(di_grammar_cache *c, di_gcache_table *t, di_sig128 k);

/* Transitions are stored per byte class, so setting one byte sets its whole class: callers set
 * only values that hold for every byte the grammar's terminals treat alike (an Earley push,
 * byte_equiv and the scan union are all unions of classes). */
static inline int32_t di_gcache_next(const di_gcache_table *t, int32_t id, uint8_t b) {
    return atomic_load_explicit(&t->rows[(size_t)id * t->n_bcls + t->bcls[b]], memory_order_relaxed);
}
static inline void di_gcache_set_next(di_gcache_table *t, int32_t id, uint8_t b, int32_t next) {
    atomic_store_explicit(&t->rows[(size_t)id * t->n_bcls + t->bcls[b]], (int16_t)next, memory_order_relaxed);
}

/* Loop summary of state id, if some walk has computed it (lock-free: published with release). */
static inline bool di_gcache_loop_get(const di_gcache_table *t, int32_t id, di_gcache_loop *out) {
    if (!atomic_load_explicit(&t->loop_ready[id], memory_order_acquire)) return false;
    *out = t->loop[id];
    return true;
}
/* Publish the loop summary of state id (racing walks compute the same summary; the first wins). */
void di_gcache_loop_put(di_grammar_cache *c, di_gcache_table *t, int32_t id, const di_gcache_loop *s);

/* Bytes state id scans, if some walk has recorded them (lock-free: published with release). Any
 * other byte is dead from the state: equal keys hash equal scan items. */
static inline const di_cfg_class *di_gcache_scan_get(const di_gcache_table *t, int32_t id) {
    return atomic_load_explicit(&t->scan_ready[id], memory_order_acquire) ? &t->scan[id] : NULL;
}
/* Record the bytes state id scans (racing walks record the same set; the first wins). */
void di_gcache_scan_put(di_grammar_cache *c, di_gcache_table *t, int32_t id, const di_cfg_class *scan);
/* di_gcache_intern, then di_gcache_scan_put of the id it returns, under one lock: a walk interns
 * the state whose set is on top and records its bytes at once (one lock per new state, not two). */
int32_t di_gcache_intern_scan(di_grammar_cache *c, di_gcache_table *t, di_sig128 k, const di_cfg_class *scan);

/* The cached block of context-free root k in table generation `table`: its mask into mask and its
 * context tokens into ent (at most cap); false if absent or larger than cap. */
bool di_gcache_block_get(di_grammar_cache *c, const di_grammar_vocab *v, uint64_t table, di_sig128 k, uint32_t *mask,
                         di_gcache_ctxtok *ent, uint32_t cap, uint32_t *n);
/* Remember a block (best effort, as di_gcache_mask_put). */
void di_gcache_block_put(di_grammar_cache *c, const di_grammar_vocab *v, uint64_t table, di_sig128 k,
                         const uint32_t *mask, const di_gcache_ctxtok *ent, uint32_t n);

/* The cached trie walk of context-free root k in table generation `table`: the mask it refers to
 * into mask (the listed subtrees' tokens still in it) and its nodes into ent (at most cap); false
 * if absent, larger than cap, or its mask slot was reused. */
bool di_gcache_walk_get(di_grammar_cache *c, const di_grammar_vocab *v, uint64_t table, di_sig128 k, uint32_t *mask,
                        di_gcache_ctxtok *ent, uint32_t cap, uint32_t *n);
/* Remember a trie walk whose mask is in mask-cache slot mslot under full key mkey (best effort). */
void di_gcache_walk_put(di_grammar_cache *c, const di_grammar_vocab *v, uint64_t table, di_sig128 k, int32_t mslot,
                        di_sig128 mkey, const di_gcache_ctxtok *ent, uint32_t n);

/* Copy the cached mask of state k (EOS bits excluded) into mask; false if absent. */
bool di_gcache_mask_get(di_grammar_cache *c, const di_grammar_vocab *v, di_sig128 k, uint32_t *mask);
/* Remember mask for state k (best effort: silently skipped without memory or for a second vocab).
 * Returns the slot that holds k's mask, or -1. */
int32_t di_gcache_mask_put(di_grammar_cache *c, const di_grammar_vocab *v, di_sig128 k, const uint32_t *mask);
/* di_gcache_mask_put for a mask that holds exactly the n (<= DI_GCACHE_LIST_MAX) distinct tokens toks. */
int32_t di_gcache_mask_put_list(di_grammar_cache *c, const di_grammar_vocab *v, di_sig128 k, const int32_t *toks,
                                uint32_t n);

#endif
