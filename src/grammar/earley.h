/* Incremental Earley recogniser over bytes for a finalized di_cfg.
 *
 * The state after n bytes is the stack of Earley sets 0..n. Pushing a byte computes one new set
 * (scan, then predict/complete closure); popping back to an earlier depth is O(1), which is what
 * makes both token rollback (speculative decoding) and the token-trie walk cheap: the trie DFS
 * pushes one byte per trie edge and pops on the way back up.
 *
 * Why Earley: it handles every context-free grammar the front-ends produce (left recursion,
 * ambiguity, nullable rules) without grammar transformations, and over bytes it needs no lexer.
 * The grammar has only productive rules (di_cfg_finalize), so a non-empty set always means the
 * bytes so far are a prefix of some sentence: "dead" is exactly "the new set is empty".
 *
 * Not thread-safe per object; one di_earley per request. The di_cfg is shared read-only. */
#ifndef DI_GRAMMAR_EARLEY_H
#define DI_GRAMMAR_EARLEY_H

#include "grammar/cfg.h"

#define DI_EARLEY_MAX_SET_ITEMS (1u << 18) /* per set; a hostile grammar hits this, not the OOM killer */
/* Item insertions (including duplicates) per pushed byte. Highly ambiguous grammars make Earley
 * cost grow with the input length (O(n^2) work per byte for (a*a*)*); this caps the time of one
 * byte at a few milliseconds and turns the pathology into a clear error. */
#define DI_EARLEY_MAX_WORK (1u << 17)

typedef struct di_earley_item {
    uint32_t pos;    /* grammar position (rule + dot) */
    uint32_t origin; /* index of the set where this rule instance started */
} di_earley_item;

/* Wait lists longer than this are sorted by symbol (di_earley.wait); shorter ones are scanned. */
#define DI_EARLEY_SMALL_WAIT 12

#define DI_EARLEY_LEO_MEMO 1024

typedef struct di_earley_wait {
    int32_t sym;     /* the nonterminal after the dot */
    uint32_t pos;    /* the waiting item */
    uint32_t origin;
} di_earley_wait;

typedef struct di_earley {
    const di_cfg *g;
    di_earley_item *items;    /* [n_items] all sets back to back */
    size_t n_items, cap_items;
    uint32_t *set_off;        /* [n_sets + 1] item offsets per set */
    di_cfg_class *scan;       /* [n_sets] union of bytes that some item of the set can scan */
    /* Completion index: per set, the items with a nonterminal after the dot, with that
     * nonterminal, sorted by it when the list is long, so completing A at origin j touches only
     * the items waiting on A instead of all of set j (keeps ambiguous grammars such as (a*)*b at
     * O(n^2) instead of O(n^3)); the copy keeps completion's scan off the item array. */
    di_earley_wait *wait;     /* [n_wait] */
    uint32_t *wait_off;       /* [n_sets + 1] offsets into wait */
    size_t n_wait, cap_wait;
    size_t n_sets, cap_sets;
    /* dedup table for the set under construction: open addressing, stamped to avoid clears */
    uint64_t *hkey;           /* [hcap] (pos << 32 | origin) */
    uint32_t *hstamp;         /* [hcap] */
    size_t hcap;
    uint32_t stamp;
    uint64_t small_seen;      /* set under construction, while below the hash table's size: one bit
                                 per item hash (a clear bit means "not present" without a scan) */
    uint32_t work;            /* add_item calls for the byte being pushed */
    /* Stamp of the set whose closure last predicted each nonterminal: its rules enter a set once,
     * so the items that start in the set under construction (origin == its index) are new by
     * construction and skip the duplicate check (close_set). */
    uint32_t *pred_stamp;     /* [g->n_nt] */
    /* Context watch for the matcher's context-independent walk: a completion of an item whose
     * origin set is below opaque_below (the walk's boundary) reads sets the walk treats as
     * unknown context; such completions are counted in opaque_hits. 0 = no watch. */
    uint32_t opaque_below;
    uint32_t opaque_hits;
    /* Leo's deterministic reductions: completing B at set j where j's sole item waiting on B has
     * B last in its rule just completes that item's lhs at its origin, and so on down a chain
     * (a right-recursive rule, or a bounded repetition T_k -> s T_{k-1}, which completes all of
     * its links at every byte because each link is nullable). close_set jumps to the chain's
     * last finished item (leo_top) instead of adding one finished item per link: a run of n
     * characters of X{0,n} cost O(n^2) items, with two such runs side by side (the whitespace
     * before and after an empty JSON array) O(n^2) per set. Only finished items are skipped,
     * and they are read by nothing but completion. Memoized by (set, symbol, set_stamp). */
    uint32_t *set_stamp;      /* [cap_sets] stamp of the set at each index */
    struct di_earley_leo {
        uint32_t set, stamp;
        int32_t sym;
        di_earley_item top;   /* top.pos == 0: no chain */
    } *leo;                   /* [DI_EARLEY_LEO_MEMO] */
    uint64_t n_pushes;        /* bytes pushed over the object's life (statistics) */
} di_earley;

/* Set up and create set 0. Returns DI_OK or an error (memory/limit). */
int di_earley_init(di_earley *m, const di_cfg *g, di_error *err);
void di_earley_free(di_earley *m);

/* Push one byte. Returns 1 if the byte extends a viable prefix (a set was pushed), 0 if the
 * byte is rejected (state unchanged), or a negative di_status when a limit was hit. */
int di_earley_push(di_earley *m, uint8_t b, di_error *err);

/* Push a byte string; on rejection the state is restored and 0 is returned. */
int di_earley_push_bytes(di_earley *m, const uint8_t *b, size_t n, di_error *err);

/* Pop back so that exactly n_sets sets remain (n_sets >= 1). */
static inline void di_earley_pop_to(di_earley *m, size_t n_sets) {
    if (n_sets >= 1 && n_sets < m->n_sets) {
        m->n_sets = n_sets;
        m->n_items = m->set_off[n_sets];
        m->n_wait = m->wait_off[n_sets];
    }
}

/* Undo di_earley_pop_to back to n_sets sets, valid only while nothing was pushed since the
 * pop (the popped sets are still in place; the caller checks n_pushes). */
static inline void di_earley_unpop(di_earley *m, size_t n_sets) {
    m->n_sets = n_sets;
    m->n_items = m->set_off[n_sets];
    m->n_wait = m->wait_off[n_sets];
}

/* The only item of sealed set `set` waiting on nonterminal sym, or NULL if none or several. */
const di_earley_wait *di_earley_sole_wait(const di_earley *m, size_t set, int32_t sym);

/* Could the bytes pushed so far be a complete sentence? */
bool di_earley_accepting(const di_earley *m);

/* Bytes that can come next (the current set's scan union). */
static inline const di_cfg_class *di_earley_next_bytes(const di_earley *m) { return &m->scan[m->n_sets - 1]; }

#endif
