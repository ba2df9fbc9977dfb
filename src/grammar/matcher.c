/* Per-request matcher: token acceptance, rollback, thinking/stop handling and the token mask. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/earley.h"
#include "grammar/grammar_impl.h"
#include "grammar/state_cache.h"

#define AHEAD_CHARS 24 /* characters of a run learned past a long token (learn_ahead) */
#define AHEAD_PERIOD 4 /* longest character (bytes) of such a run */
#define AHEAD_MAX (AHEAD_CHARS * AHEAD_PERIOD) /* walk depths past the longest token */
#define AHEAD_MIN_SETS 8 /* sets a token's walk materialized that start learn_ahead ... */
#define AHEAD_MIN_DEPTH 24 /* ... at a live depth of at least this */

#define THINK_MAX 64

typedef di_sig128 sig128;

/* Everything that changes when a token is accepted, so that one snapshot per token restores it. */
typedef struct mstate {
    size_t depth;      /* Earley sets in use */
    uint16_t think_p;  /* bytes of the think-end marker matched so far (KMP state) */
    uint8_t in_think;  /* still in the unconstrained reasoning part */
    uint8_t finished;  /* EOS accepted or a stop string seen */
    uint8_t tail_len;  /* bytes in tail */
    uint8_t tail[DI_GRAMMAR_MAX_STOP_LEN]; /* last constrained bytes, for stop strings spanning tokens */
} mstate;

#define LEFF_MEMO 1024 /* direct-mapped (set, nonterminal) -> context-free completion effect */
#define KEPT 64 /* sets kept for take_back, by index (a summary's chain is <= DI_CHAIN_CHARS + 2 deep) */
#define BLK_MEMO 1024 /* direct-mapped by state id: a walk revisits its parents' blocks thousands of times */

struct di_grammar_matcher {
    const di_grammar *g;
    const sig128 *here;             /* g->here: each position's signature term as an item of its own set */
    const di_grammar_vocab *v;
    di_earley e;
    mstate cur;
    mstate *hist; /* [n_hist] state before each accepted token */
    size_t n_hist, cap_hist;
    uint8_t think_end[THINK_MAX];
    uint32_t think_len;
    uint16_t think_fail[THINK_MAX]; /* KMP failure function of think_end */
    int32_t *think_toks;            /* tokens that may complete the marker with text after it */
    size_t n_think_toks;
    /* Mask cache (in the grammar, shared by its matchers: state_cache.h). The future of an
     * Earley parse depends only on the current set and, through item origins, the sets it refers
     * back to; hashing that structure (positions, with origins replaced by the referenced set's
     * own signature) gives a key under which two states accept exactly the same continuations.
     * Inside a JSON string every character leads to the same key, so only the first token of a
     * string pays for the trie walk, and only in the first request that reaches that state. */
    sig128 *set_sig;                /* [cap_sig] signature of each committed Earley set */
    uint32_t *sver;                 /* [cap_sig] version of the set at each index (fmemo, lmemo) */
    uint32_t *sigver;               /* [cap_sig] set_sig[i] is valid when sigver[i] == sver[i] (set_sig_of) */
    uint32_t n_sver;
    size_t n_sig, cap_sig;          /* signatures valid for sets [0, n_sig) */
    uint64_t cache_hits, cache_misses;
    uint64_t n_block_masks, n_block_hits, n_blocks, n_ctx_edges; /* di_grammar_walk_stats */
    uint64_t n_edges, n_summaries, n_replays, n_full_sigs;
    /* Context-free walk (walk_trie): with boundary lb > 0, the sets below lb are the context
     * (local_key); lgen numbers the walks and boundaries the leff memo is valid for. */
    uint32_t lgen;
    struct leff_memo {              /* leff results by (set, nonterminal), valid for walk generation gen */
        uint32_t o, gen, ver;
        int32_t a;
        sig128 eff;
    } lmemo[LEFF_MEMO], fmemo[LEFF_MEMO]; /* fmemo: feff, gen unused */
    size_t lb;                      /* boundary in effect (use_boundary); 0 = full keys */
    uint32_t *lbd;                  /* [max token length + 1] boundary of the state vid[d] is keyed by */
    uint32_t mgen;                  /* walk generation of the memo */
    size_t wbase;                   /* Earley sets below the walk (its real context) */
    struct ctx_memo {               /* per walk: context-free state + its boundary + byte -> state in this context */
        uint32_t gen, fbnd, bnd;
        int32_t from, to;
        uint8_t byte;
    } memo[256];
    uint32_t bgen;                  /* bumped when this matcher may have published summaries (walk start, mid-walk) */
    struct blk_memo {               /* loop_chars results by state id for table `serial` (-1 only for generation gen) */
        uint64_t serial;
        uint32_t gen;
        int32_t id;
        int8_t res;
        uint8_t utf8, any, nohigh;
        uint32_t ascii, scanned;
    } bmemo[BLK_MEMO];
    di_gcache_ctxtok *cent;         /* [LOOP_MASK_MAX_REST] context tokens of a block mask */
    /* The tokens a trie walk sets one by one (walk_nodes), the first DI_GCACHE_LIST_MAX of them:
     * where they are the whole mask (a walk from scratch that accepted no subtree whole), the
     * mask cache keeps this list instead of a copy of the mask (few_ok). */
    int32_t *few;                   /* [DI_GCACHE_LIST_MAX] */
    uint32_t n_few;
    bool few_ok;
    int32_t *vid;                   /* [max token length + 1] state id per walk depth */
    uint8_t *path;                  /* [max token length + 1] bytes of the current trie path */
    /* Sets popped by walk_pop stay in the recogniser's memory until the next push; a replay that
     * needs the set of depth k again takes it back when its byte acts like the byte that made
     * it (mpath[k], byte_equiv): whitespace runs of tabs, spaces and newlines, or characters of
     * one class, give identical sets. Valid while no byte was pushed since the pop (stale_gen ==
     * e.n_pushes), for the same base set and depths up to stale_md. */
    uint8_t *mpath;                 /* [max token length + 1] */
    size_t stale_md, stale_base;    /* stale_base: the walk's base set (a rollback moves it) */
    uint64_t stale_gen;
    uint64_t n_reuses;
    /* The last set a summary pushed at each index (by index mod KEPT) and popped (keep), taken
     * back by a push of a byte that acts alike from the same set below (take_back): the chain of
     * a counted string pushes each count's character once for its summary and again to reach
     * the next count. Valid while the sets at the index and below it are the ones it was pushed
     * on (stamps). */
    struct kept_set {
        size_t at;                  /* index of the set */
        uint32_t stamp, below;      /* set_stamp of the kept set and of the set below; 0 = none */
        uint64_t pushes;            /* e.n_pushes then: stamps are unique for 2^32 - 1 pushes */
        size_t lb;                  /* boundary the push was watched with (no context reached) */
        uint8_t byte;
    } kept[KEPT];
    uint64_t n_shapes_static; /* UTF-8 shapes of loop summaries decided without pushing */
    di_trie_union whole;      /* subtrees the current walk accepts whole, and earlier walks' unions */
    uint64_t n_union_hits, n_union_shifts; /* walks whose whole subtrees came from an earlier walk's union (shifted) */
    uint64_t n_walk_hits;     /* trie walks whose context-free part came from the grammar's cache */
    uint64_t n_kid_skips;     /* trie children not visited: their parent's state does not scan their byte */
    struct walk_put {         /* a walk to remember once fill_mask has stored its mask (n: listed nodes in cent) */
        bool pending;
        sig128 root;
        uint64_t table;
        uint32_t n;
    } wput;
    uint8_t stop[DI_GRAMMAR_MAX_STOP][DI_GRAMMAR_MAX_STOP_LEN];
    uint32_t stop_len[DI_GRAMMAR_MAX_STOP];
    size_t n_stop;
};

void di_grammar_free(di_grammar *g) {
    if (!g) return;
    di_gcache_free(g->cache);
    di_cfg_free(g->cfg);
    free(g->here);
    free(g);
}

int di_grammar_matcher_new(const di_grammar *g, const di_grammar_vocab *v, const di_grammar_matcher_opts *opts,
                           di_grammar_matcher **out, di_error *err) {
    *out = NULL;
    di_grammar_matcher_opts o = opts ? *opts : (di_grammar_matcher_opts){0};
    if (o.n_stop > DI_GRAMMAR_MAX_STOP)
        return di_error_set(err, DI_ERR_INVALID, "grammar matcher: %zu stop strings (limit %d)", o.n_stop,
                            DI_GRAMMAR_MAX_STOP);
    di_grammar_matcher *m = calloc(1, sizeof *m);
    if (!m) return di_error_set(err, DI_ERR_NOMEM, "grammar matcher: out of memory");
    m->g = g;
    m->here = g->here;
    m->v = v;
    for (size_t i = 0; i < o.n_stop; i++) {
        size_t l = strlen(o.stop[i]);
        if (l == 0 || l > DI_GRAMMAR_MAX_STOP_LEN) {
            free(m);
            return di_error_set(err, DI_ERR_INVALID, "grammar matcher: stop string %zu is %zu bytes (expected 1..%d)",
                                i, l, DI_GRAMMAR_MAX_STOP_LEN);
        }
        memcpy(m->stop[i], o.stop[i], l);
        m->stop_len[i] = (uint32_t)l;
    }
    m->n_stop = o.n_stop;
    int rc = di_earley_init(&m->e, g->cfg, err);
    if (rc) {
        free(m);
        return rc;
    }
    m->vid = malloc(((size_t)v->max_len + 1 + AHEAD_MAX) * sizeof *m->vid);
    m->path = malloc((size_t)v->max_len + 1 + AHEAD_MAX);
    m->lbd = malloc(((size_t)v->max_len + 1 + AHEAD_MAX) * sizeof *m->lbd);
    m->mpath = malloc((size_t)v->max_len + 1 + AHEAD_MAX);
    m->few = malloc(DI_GCACHE_LIST_MAX * sizeof *m->few);
    m->stale_gen = UINT64_MAX;
    if (!m->vid || !m->path || !m->lbd || !m->mpath || !m->few) {
        di_grammar_matcher_free(m);
        return di_error_set(err, DI_ERR_NOMEM, "grammar matcher: out of memory");
    }
    if (o.thinking) {
        const char *te = o.think_end ? o.think_end : "</think>";
        size_t l = strlen(te);
        if (l == 0 || l >= THINK_MAX) {
            di_grammar_matcher_free(m);
            return di_error_set(err, DI_ERR_INVALID, "grammar matcher: think-end marker is %zu bytes (expected 1..%d)",
                                l, THINK_MAX - 1);
        }
        memcpy(m->think_end, te, l);
        m->think_len = (uint32_t)l;
        m->think_fail[0] = 0;
        for (uint32_t i = 1, k = 0; i < l; i++) {
            while (k && m->think_end[i] != m->think_end[k]) k = m->think_fail[k - 1];
            if (m->think_end[i] == m->think_end[k]) k++;
            m->think_fail[i] = (uint16_t)k;
        }
        m->cur.in_think = 1;
        /* Only a token holding the marker's last byte before its own end can both finish the
         * reasoning and start the constrained text; every other token is free while thinking. */
        uint8_t last = m->think_end[l - 1];
        m->think_toks = malloc(v->n_vocab * sizeof *m->think_toks);
        if (!m->think_toks) {
            di_grammar_matcher_free(m);
            return di_error_set(err, DI_ERR_NOMEM, "grammar matcher: out of memory");
        }
        for (uint32_t t = 0; t < v->n_vocab; t++)
            if (v->lens[t] > 1 && memchr(v->bytes[t], last, v->lens[t] - 1)) m->think_toks[m->n_think_toks++] = (int32_t)t;
    }
    m->cur.depth = m->e.n_sets;
    *out = m;
    return DI_OK;
}

void di_grammar_matcher_free(di_grammar_matcher *m) {
    if (!m) return;
    di_earley_free(&m->e);
    free(m->set_sig);
    free(m->sver);
    free(m->sigver);
    free(m->lbd);
    free(m->cent);
    di_trie_union_free(&m->whole);
    free(m->vid);
    free(m->mpath);
    free(m->few);
    free(m->path);
    free(m->hist);
    free(m->think_toks);
    free(m);
}

/* Append one constrained byte to the stop-string tail; returns true if a stop string now ends. */
static bool stop_feed(di_grammar_matcher *m, mstate *s, uint8_t c) {
    if (!m->n_stop) return false;
    if (s->tail_len == DI_GRAMMAR_MAX_STOP_LEN) {
        memmove(s->tail, s->tail + 1, DI_GRAMMAR_MAX_STOP_LEN - 1);
        s->tail_len--;
    }
    s->tail[s->tail_len++] = c;
    for (size_t i = 0; i < m->n_stop; i++) {
        uint32_t l = m->stop_len[i];
        if (l <= s->tail_len && !memcmp(s->tail + s->tail_len - l, m->stop[i], l)) return true;
    }
    return false;
}

/* Feed token bytes through think-end detection, the grammar and stop strings, updating m->cur.
 * Returns 1 if accepted, 0 if rejected (caller restores), <0 on error. */
static int feed(di_grammar_matcher *m, const uint8_t *b, size_t n, di_error *err) {
    mstate *s = &m->cur;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = b[i];
        if (s->finished) return 0;
        if (s->in_think) {
            uint32_t k = s->think_p;
            while (k && m->think_end[k] != c) k = m->think_fail[k - 1];
            if (m->think_end[k] == c) k++;
            if (k == m->think_len) s->in_think = 0, k = 0;
            s->think_p = (uint16_t)k;
            continue;
        }
        int rc = di_earley_push(&m->e, c, err);
        if (rc <= 0) return rc;
        s->depth = m->e.n_sets;
        /* The grammar still checks every byte of a token that contains a stop string, so the
         * mask and acceptance agree exactly; the request simply ends after this token. */
        if (stop_feed(m, s, c)) s->finished = 1;
    }
    return 1;
}

static void restore(di_grammar_matcher *m, const mstate *s) {
    m->cur = *s;
    di_earley_pop_to(&m->e, s->depth);
    if (m->n_sig > m->e.n_sets) m->n_sig = m->e.n_sets;
}

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Signatures, in index order (each depends only on earlier sets). Only items that can still
 * matter are hashed: once a set is behind the current one, completion reads just its items that
 * wait on a nonterminal, so set_sig[j] covers those; the current set adds its items that scan a
 * byte. Finished items (dot at the end) have already been completed and are ignored, which is what
 * makes consecutive characters of a string share one key. Items are combined by addition so the
 * order in which a set was built does not matter. */
static inline void add_item_sig(sig128 *h, uint32_t pos, sig128 o) {
    h->a += mix64(((uint64_t)pos << 1 | 1) ^ mix64(o.a));
    h->b += mix64(((uint64_t)pos * 0x9E3779B97F4A7C15ull) ^ mix64(o.b + 0x5851F42D4C957F2Dull));
}

/* add_item_sig for an item that started in the set it is in (most items of a set: the rules
 * predicted there), whose origin enters as a constant: its term depends on the position alone,
 * so it is computed once per grammar (here_terms, di_grammar.here) and read from that table (the
 * two mixes per item were a fifth of local_key's instructions on the first walks). */
#define HERE_SIG ((sig128){1, 2})
static inline void add_here_sig(const di_grammar_matcher *m, sig128 *h, uint32_t pos) {
    h->a += m->here[pos].a;
    h->b += m->here[pos].b;
}

/* di_grammar.here: add_item_sig(&0, pos, HERE_SIG) for every position of the grammar. */
static sig128 *here_terms(const di_cfg *g) {
    sig128 *t = malloc((g->n_pos ? g->n_pos : 1) * sizeof *t);
    for (uint32_t p = 0; t && p < g->n_pos; p++) {
        t[p] = (sig128){0, 0};
        add_item_sig(&t[p], p, HERE_SIG);
    }
    return t;
}

/* ---- completion effects: what an item's origin contributes to a key ----
 * An item of a later set reads its origin set only when its own rule completes: then its lhs A
 * completes there. So an item is hashed by (position, effect of completing A at its origin)
 * (feff; leff for context-free keys), not by the origin's whole set: a set also holds items
 * waiting on other symbols that this item can never complete (after `:` in JSON, those of the
 * optional space), which kept equal futures apart. The effect covers the origin's items waiting
 * on A and, through the ones predicted in that set itself whose rule then completes there, on
 * their lhs, transitively; each of those again by its own origin's effect.
 * Right-recursive chains (Leo's deterministic reductions): in `factor ::= "-" factor` every "-"
 * adds a set whose only item waiting on factor is `neg -> "-" . factor`, the last symbol of its
 * rule: completing factor there just completes neg, then factor, one set lower, down to where
 * the chain started. The effect follows such sole, rule-ending waiters down (leo_item), so every
 * depth has one key (ebnf_arith learned 80 new states per mask for the tokens of 80 dashes).
 * Equal effects mean equal completions (the finished items of a chain are read by nothing but
 * completion, and keys leave them out), so equal keys still mean equal futures; a context-free
 * chain that reaches the context ends in "A completes in the context", which the recogniser
 * reports as an opaque hit in every state of that key alike. */
#define LEO_MAX_DEPTH 64              /* deeper chains end early (still sound, only less sharing) */

static inline sig128 leo_base(int32_t a, sig128 set) {
    return (sig128){set.a ^ mix64((uint64_t)(uint32_t)a + 0x632BE59BD9B4E019ull),
                    set.b ^ mix64((uint64_t)(uint32_t)a * 0x9E3779B97F4A7C15ull + 0x8CB92BA72F3D8DD7ull)};
}

/* The sole item of set i waiting on sym, if sym is the last symbol of its rule and its origin is
 * below i + same (same = 1: a unit rule predicted in set i itself, `factor -> . neg` with
 * `neg -> "-" factor`, continues the chain in set i with its lhs), or NULL. */
static inline const di_earley_wait *leo_item(const di_earley *e, size_t i, int32_t sym, size_t same) {
    const di_earley_wait *w = di_earley_sole_wait(e, i, sym);
    return w && w->origin < i + same && e->g->psym[w->pos + 1] == DI_CFG_END ? w : NULL;
}

/* How a waiter of another set enters an effect: by its position, or, when the awaited symbol
 * ends its rule, by "completes its lhs" alone: the item then does nothing but complete its lhs at
 * its origin, which the effect hashed beside it already says. So `SEQ -> L "@" . D` and
 * `E -> "." . D` (the first and a later label of a separated list, both finishing where D
 * completes) give equal effects when their lhs effects are equal. */
#define WAIT_ENDS_RULE 0xFFFFFFFFu
static inline uint32_t waiter_pos(const di_grammar_matcher *m, uint32_t pos) {
    return m->g->cfg->psym[pos + 1] == DI_CFG_END ? WAIT_ENDS_RULE : pos;
}

/* Effect of completing nonterminal a at set o, over full signatures (defined after leff). */
static sig128 feff(di_grammar_matcher *m, size_t o, int32_t a, int depth);

static void set_sig_compute(di_grammar_matcher *m, size_t i) {
    const di_earley *e = &m->e;
    const int32_t *psym = m->g->cfg->psym;
    sig128 h = {0x243F6A8885A308D3ull, 0x13198A2E03707344ull};
    for (size_t x = e->set_off[i]; x < e->set_off[i + 1]; x++) {
        di_earley_item it = e->items[x];
        if (psym[it.pos] < 0) continue; /* terminal or end: not read by completion */
        if (it.origin == i) add_here_sig(m, &h, it.pos);
        else add_item_sig(&h, it.pos, feff(m, it.origin, m->g->cfg->plhs[it.pos], 0));
    }
    m->set_sig[i] = h;
    m->sigver[i] = m->sver[i];
    m->n_full_sigs++;
}

/* Full signature of set i, computed when first read. A walk keyed relative to a boundary
 * (local_key) never reads the full signatures of the sets it pushes, unless a state of it falls
 * back to full keys; computing them at every push was ~10% of a cold mask's instructions. The
 * sets below the walk are computed eagerly (fill_mask), so the sets computed here in index order
 * are at most a walk's depth: no deep recursion through feff's fallback. */
static sig128 set_sig_of(di_grammar_matcher *m, size_t i) {
    if (m->sigver[i] != m->sver[i]) {
        size_t j = i;
        while (j > 0 && m->sigver[j - 1] != m->sver[j - 1]) j--;
        for (; j <= i; j++) set_sig_compute(m, j);
    }
    return m->set_sig[i];
}

/* Versions of new sets (sver); with eager, also their full signatures. */
static int update_sigs_as(di_grammar_matcher *m, bool eager, di_error *err) {
    const di_earley *e = &m->e;
    if (e->n_sets > m->cap_sig) {
        size_t cap = m->cap_sig ? m->cap_sig : 256;
        while (cap < e->n_sets) cap *= 2;
        sig128 *p = realloc(m->set_sig, cap * sizeof *p);
        if (p) m->set_sig = p;
        uint32_t *sv = p ? realloc(m->sver, cap * sizeof *sv) : NULL;
        if (sv) m->sver = sv;
        uint32_t *gv = sv ? realloc(m->sigver, cap * sizeof *gv) : NULL;
        if (!gv) return di_error_set(err, DI_ERR_NOMEM, "grammar matcher: out of memory for state signatures");
        memset(gv + m->cap_sig, 0, (cap - m->cap_sig) * sizeof *gv);
        m->sigver = gv;
        m->cap_sig = cap;
    }
    for (size_t i = m->n_sig; i < e->n_sets; i++) {
        if (++m->n_sver == 0) m->n_sver = 1; /* 0 never names a set */
        m->sver[i] = m->n_sver;
        if (eager) set_sig_compute(m, i);
    }
    m->n_sig = e->n_sets;
    return DI_OK;
}

/* Inside walks and summaries: full signatures on demand (set_sig_of). */
static int update_sigs(di_grammar_matcher *m, di_error *err) { return update_sigs_as(m, false, err); }

/* Key of the current state: the waiting items (set_sig) plus the items that scan a byte. */
static sig128 state_key(di_grammar_matcher *m) {
    const di_earley *e = &m->e;
    size_t i = e->n_sets - 1;
    sig128 h = set_sig_of(m, i);
    h.a ^= 0xA5A5A5A5A5A5A5A5ull;
    for (size_t x = e->set_off[i]; x < e->set_off[i + 1]; x++) {
        di_earley_item it = e->items[x];
        int32_t sym = m->g->cfg->psym[it.pos];
        if (sym >= 0 || sym == DI_CFG_END) continue;
        if (it.origin == i) add_here_sig(m, &h, it.pos);
        else add_item_sig(&h, it.pos, feff(m, it.origin, m->g->cfg->plhs[it.pos], 0));
    }
    return h;
}

/* ---- context-free keys ----
 * The same lexical situation recurs in many contexts: every string value of a JSON document
 * starts the same "inside a string" parse, but its Earley items point back (origins) to sets that
 * differ per property, nesting level and request, so the structural key above differs and every
 * new context re-learned the automaton and re-walked the trie. The walk therefore keys states
 * relative to a boundary set lb: sets below lb (the context) are opaque. Two states with equal
 * context-free keys evolve identically until a completion reaches an opaque set (the Earley
 * recogniser counts those: opaque_hits); such a byte gets a context transition, and only
 * the trie subtrees under it are walked with full keys. So the bulk of a walk (all tokens inside
 * the string) is shared across contexts, and only tokens that close it (`",` `"}` ...) depend on
 * where the string is. */

#define OPAQUE_SIG ((sig128){3, 4})
#define LOCAL_DOMAIN 0xC2B2AE3D27D4EB4Full /* context-free keys never equal full keys */
#define LSIG_MAX_DEPTH 256                /* origin chains deeper than this: walk with full keys */

/* Context-free effect of completing nonterminal a at set o (see "completion effects" above):
 * the items of set o that a completion of a can advance (the closure `syms`), each by the effect
 * at its own origin, or down a deterministic chain; a set below the boundary is the context:
 * "a completes in the context", which the recogniser reports (opaque hit). Memoized per walk
 * generation in lmemo. */
#define LEFF_MAX_SYMS 32 /* a larger closure: leave context-free mode (*ok), full keys are exact */

static inline const di_earley_wait *waiters(const di_earley *e, size_t o, int32_t sym, size_t *n) {
    const di_earley_wait *w = e->wait + e->wait_off[o];
    size_t nw = e->wait_off[o + 1] - e->wait_off[o];
    if (nw <= DI_EARLEY_SMALL_WAIT) { /* unsorted: the caller filters by symbol */
        *n = nw;
        return w;
    }
    size_t lo = 0, hi = nw;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (w[mid].sym < sym) lo = mid + 1;
        else hi = mid;
    }
    size_t k = lo;
    while (k < nw && w[k].sym == sym) k++;
    *n = k - lo;
    return w + lo;
}

static sig128 leff(di_grammar_matcher *m, size_t o, int32_t a, int depth, bool *ok);

/* The effect closure that leff and feff share: the waiters on a at set o, and through those
 * that started at o the nonterminals they complete there in turn (at most LEFF_MAX_SYMS), each
 * waiter hashed by its position and the effect at its own origin (leff, or feff when full).
 * A waiter that started at o and ends its rule with a (`O -> . D`, an optional or an alternative
 * predicted at o) does nothing but complete its lhs at o, so it enters as "completes its lhs"
 * with the effect of that lhs at o, like a rule-ending waiter of an earlier set: the first
 * element of a separated list D -> X E, E -> eps | S D (waited on by such a unit rule) and a
 * later one (waited on by `E -> S . D`, whose chain leads to the same effect) get one key.
 * Returns false when the closure needs more symbols (h is then partial). */
static bool effect_closure(di_grammar_matcher *m, size_t o, int32_t a, int depth, bool full, bool *ok, sig128 *h) {
    const di_earley *e = &m->e;
    const int32_t *plhs = m->g->cfg->plhs;
    int32_t syms[LEFF_MAX_SYMS];
    int ns = 1;
    syms[0] = a;
    *h = (sig128){0x452821E638D01377ull, 0xBE5466CF34E90C6Cull};
    for (int k = 0; k < ns && *ok; k++) {
        size_t n;
        const di_earley_wait *w = waiters(e, o, syms[k], &n);
        for (size_t x = 0; x < n; x++) {
            if (w[x].sym != syms[k]) continue;
            int32_t l = plhs[w[x].pos];
            if (w[x].origin != o || m->g->cfg->psym[w[x].pos + 1] == DI_CFG_END) {
                add_item_sig(h, waiter_pos(m, w[x].pos),
                             full ? feff(m, w[x].origin, l, depth + 1) : leff(m, w[x].origin, l, depth + 1, ok));
                continue;
            }
            add_here_sig(m, h, w[x].pos);
            int y = 0;
            while (y < ns && syms[y] != l) y++;
            if (y < ns) continue;
            if (ns == LEFF_MAX_SYMS) return false;
            syms[ns++] = l;
        }
    }
    return true;
}

static sig128 leff(di_grammar_matcher *m, size_t o, int32_t a, int depth, bool *ok) {
    if (o < m->lb) return leo_base(a, OPAQUE_SIG);
    if (depth > LSIG_MAX_DEPTH) {
        *ok = false;
        return OPAQUE_SIG;
    }
    uint32_t slot = (uint32_t)(mix64((uint64_t)o << 32 | (uint32_t)a) & (LEFF_MEMO - 1));
    struct leff_memo *mm = &m->lmemo[slot];
    if (mm->gen == m->lgen && mm->o == o && mm->a == a && mm->ver == m->sver[o]) return mm->eff;
    const int32_t *plhs = m->g->cfg->plhs;
    sig128 r;
    const di_earley_wait *lw = depth < LEO_MAX_DEPTH ? leo_item(&m->e, o, a, 1) : NULL;
    if (lw) {
        r = leff(m, lw->origin, plhs[lw->pos], depth + 1, ok);
    } else {
        sig128 h;
        if (!effect_closure(m, o, a, depth, false, ok, &h)) *ok = false;
        r = leo_base(a, h);
    }
    /* a truncated effect (!ok) is not remembered: the key it went into is dropped */
    mm = &m->lmemo[slot];
    if (*ok) *mm = (struct leff_memo){.o = (uint32_t)o, .gen = m->lgen, .ver = m->sver[o], .a = a, .eff = r};
    return r;
}

/* leff over full signatures: the same closure, with no context. Beyond FEFF_MAX_DEPTH the
 * effect is "a completes at a set with this whole signature" (set_sig, itself made of effects):
 * a finer key, still exact, so full keys never need the context-free bail-out. */
#define FEFF_MAX_DEPTH 48

static sig128 feff(di_grammar_matcher *m, size_t o, int32_t a, int depth) {
    uint32_t slot = (uint32_t)(mix64((uint64_t)o << 32 | (uint32_t)a) & (LEFF_MEMO - 1));
    struct leff_memo *mm = &m->fmemo[slot];
    if (mm->o == o && mm->a == a && mm->ver == m->sver[o]) return mm->eff;
    const int32_t *plhs = m->g->cfg->plhs;
    sig128 r;
    const di_earley_wait *lw = depth < LEO_MAX_DEPTH ? leo_item(&m->e, o, a, 1) : NULL;
    if (lw) {
        r = feff(m, lw->origin, plhs[lw->pos], depth + 1);
    } else if (depth >= FEFF_MAX_DEPTH) {
        r = leo_base(a, set_sig_of(m, o));
    } else {
        sig128 h;
        bool ok = true; /* feff never gives up: too many symbols means the whole set's signature */
        r = leo_base(a, effect_closure(m, o, a, depth, true, &ok, &h) ? h : set_sig_of(m, o));
    }
    mm = &m->fmemo[slot];
    *mm = (struct leff_memo){.o = (uint32_t)o, .ver = m->sver[o], .a = a, .eff = r};
    return r;
}

/* Context-free key of the current state (as state_key): the top set's waiting items (its
 * signature; opaque below the boundary) and the items that scan a byte, each by its effect
 * (leff), in one pass over the set. Not memoized: a state is keyed again in ~1% of the calls
 * (a summary of the state its walk just keyed). */
static sig128 local_key(di_grammar_matcher *m, bool *ok) {
    const di_earley *e = &m->e;
    size_t i = e->n_sets - 1;
    const int32_t *psym = m->g->cfg->psym, *plhs = m->g->cfg->plhs;
    bool opaque = i < m->lb;
    sig128 w = {0x243F6A8885A308D3ull, 0x13198A2E03707344ull}, s = {0, 0}; /* waiting, scanning */
    for (size_t x = e->set_off[i]; x < e->set_off[i + 1]; x++) {
        di_earley_item it = e->items[x];
        int32_t sym = psym[it.pos];
        if (sym == DI_CFG_END || (sym >= 0 && opaque)) continue;
        sig128 *h = sym >= 0 ? &w : &s;
        if (it.origin == i) add_here_sig(m, h, it.pos);
        else add_item_sig(h, it.pos, leff(m, it.origin, plhs[it.pos], 1, ok));
    }
    if (opaque) w = OPAQUE_SIG;
    return (sig128){(w.a ^ 0xA5A5A5A5A5A5A5A5ull) + s.a, (w.b + s.b) ^ LOCAL_DOMAIN};
}

static inline bool loop_rule(const di_cfg *g, uint32_t pos) { return g->nt_loop_min[g->plhs[pos]] != 255; }


/* Can a string of nonterminal a end where a nonempty continuation could still follow inside
 * a? True when a, or the last symbol of one of its rules (depth levels down), is nullable:
 * ident -> [a-z] [a-z0-9]*. Bounded: it only steers walk_boundary. */
static bool ends_open(const di_cfg *g, int32_t a, int depth) {
    if (g->nullable[a]) return true;
    if (depth <= 0) return false;
    for (uint32_t r = g->nt_rule_off[a], n = 0; r < g->nt_rule_off[a + 1] && n < 8; r++, n++) {
        uint32_t p = g->nt_rules[r];
        while (g->psym[p] != DI_CFG_END) p++;
        if (p > g->nt_rules[r] && g->psym[p - 1] >= 0 && ends_open(g, g->psym[p - 1], depth - 1)) return true;
    }
    return false;
}

/* Boundary for a walk from the current state: just above the oldest origin of an item still in
 * progress, so the construct being written (a string, a key, a number, a statement) is inside
 * and what encloses it is context. A repetition item (X* / X+) whose element is not in progress
 * completes at the next element, so it must be inside too; so must a repetition that has just
 * completed (X+ = X T, T -> T X | eps: an item T -> T X . means X+ completes again at the next
 * element; with its origin outside, every character of the email format's local part was a
 * context edge, learned per walk only). Any choice is sound (keys stay exact); this one decides
 * how much is shared. 0 = no boundary (full keys). */
static size_t walk_boundary(const di_grammar_matcher *m) {
    const di_earley *e = &m->e;
    const di_cfg *g = m->g->cfg;
    size_t top = e->n_sets - 1, b = SIZE_MAX, inner = 0; /* inner: latest start of a non-repetition item */
    for (size_t x = e->set_off[top]; x < e->set_off[top + 1]; x++) {
        di_earley_item it = e->items[x];
        if (g->psym[it.pos] == DI_CFG_END || it.origin == top || loop_rule(g, it.pos)) continue;
        if (it.origin + 1 < b) b = it.origin + 1;
        if (it.origin > inner) inner = it.origin;
    }
    if (b == SIZE_MAX) return 0;
    size_t lowest = b; /* one pass suffices: lowering b only removes candidates above it */
    for (size_t x = e->set_off[top]; x < e->set_off[top + 1]; x++) {
        di_earley_item it = e->items[x];
        if (it.origin >= b || !loop_rule(g, it.pos)) continue;
        if (inner <= it.origin && it.origin < lowest) lowest = it.origin; /* no element in progress */
    }
    /* A construct that started at the boundary's origin set, has just completed there and may
     * go on (its rule ends in an optional part: an identifier [a-z] [a-z0-9]*) completes into the
     * context again at every further character, so every edge of the walk would be a context
     * edge (ebnf_stmt's statements after `if`, `return`, `    y`: 40,000 of 42,000 edges).
     * Its origin set goes inside. */
    for (size_t x = e->set_off[top]; x < e->set_off[top + 1]; x++) {
        di_earley_item it = e->items[x];
        if (g->psym[it.pos] != DI_CFG_END || it.origin + 1 != lowest || it.pos == 0) continue;
        int32_t last = g->psym[it.pos - 1];
        if (last >= 0 && g->plhs[it.pos - 1] == g->plhs[it.pos] && ends_open(g, last, 4)) {
            lowest--;
            break;
        }
    }
    /* Boundary 1 makes set 0 the context. That pays where a construct that started there can
     * start at other places too (a statement of a program, an expression in parentheses, a JSON
     * object that is also a value): its states then share keys with those places. A pattern's
     * top-level sequence starts nowhere else, and its completion into set 0 would only add a
     * context edge to every token that ends the text (regex_email: 1,313 on one mask). */
    if (lowest == 1) {
        bool recurs = false;
        for (size_t x = e->set_off[top]; x < e->set_off[top + 1] && !recurs; x++) {
            di_earley_item it = e->items[x];
            recurs = it.origin == 0 && g->psym[it.pos] != DI_CFG_END && g->nt_recurs[g->plhs[it.pos]];
        }
        if (!recurs) return 0;
    }
    return lowest;
}

static bool is_eos(const di_grammar_vocab *v, int32_t t) {
    for (size_t i = 0; i < v->n_eos; i++)
        if (v->eos[i] == t) return true;
    return false;
}

bool di_grammar_matcher_can_end(const di_grammar_matcher *m) {
    if (m->cur.finished) return true;
    if (m->cur.in_think) return false;
    return di_earley_accepting(&m->e);
}

void di_grammar_matcher_cache_stats(const di_grammar_matcher *m, uint64_t *hits, uint64_t *misses) {
    *hits = m->cache_hits;
    *misses = m->cache_misses;
}

void di_grammar_matcher_walk_stats(const di_grammar_matcher *m, di_grammar_walk_stats *s) {
    *s = (di_grammar_walk_stats){.cached = m->cache_hits, .walks = m->cache_misses, .block_masks = m->n_block_masks,
                                 .block_hits = m->n_block_hits, .blocks = m->n_blocks, .ctx_edges = m->n_ctx_edges,
                                 .edges = m->n_edges, .pushes = m->e.n_pushes, .replays = m->n_replays, .reuses = m->n_reuses,
                                 .shapes_static = m->n_shapes_static, .union_hits = m->n_union_hits,
                                 .union_shifts = m->n_union_shifts,
                                 .walk_hits = m->n_walk_hits, .kid_skips = m->n_kid_skips,
                                 .summaries = m->n_summaries, .full_sigs = m->n_full_sigs};
}

bool di_grammar_matcher_finished(const di_grammar_matcher *m) { return m->cur.finished; }
size_t di_grammar_matcher_n_accepted(const di_grammar_matcher *m) { return m->n_hist; }

bool di_grammar_matcher_try_bytes(di_grammar_matcher *m, const uint8_t *b, size_t n) {
    mstate save = m->cur;
    int rc = feed(m, b, n, NULL);
    restore(m, &save);
    return rc == 1;
}

int di_grammar_matcher_accept_token(di_grammar_matcher *m, int32_t tok, di_error *err) {
    const di_grammar_vocab *v = m->v;
    if (tok < 0 || (uint32_t)tok >= v->n_vocab)
        return di_error_set(err, DI_ERR_INVALID, "grammar matcher: token id %d outside [0, %u)", tok, v->n_vocab);
    if (m->n_hist == m->cap_hist) {
        size_t cap = m->cap_hist ? m->cap_hist * 2 : 64;
        mstate *h = realloc(m->hist, cap * sizeof *h);
        if (!h) return di_error_set(err, DI_ERR_NOMEM, "grammar matcher: out of memory for token history");
        m->hist = h;
        m->cap_hist = cap;
    }
    mstate save = m->cur;
    if (is_eos(v, tok)) {
        if (!di_grammar_matcher_can_end(m))
            return di_error_set(err, DI_ERR_INVALID, "grammar matcher: EOS token %d before the output is complete",
                                tok);
        m->hist[m->n_hist++] = save;
        m->cur.finished = 1;
        return DI_OK;
    }
    if (v->special[tok] && !m->cur.in_think)
        return di_error_set(err, DI_ERR_INVALID, "grammar matcher: control token %d inside constrained output", tok);
    int rc = m->cur.finished ? 0 : feed(m, v->bytes[tok], v->lens[tok], err);
    if (rc <= 0) {
        restore(m, &save);
        if (rc < 0) return rc;
        return di_error_set(err, DI_ERR_INVALID, "grammar matcher: token %d is not allowed after %zu tokens", tok,
                            m->n_hist);
    }
    m->hist[m->n_hist++] = save;
    return DI_OK;
}

int di_grammar_matcher_rollback(di_grammar_matcher *m, size_t k, di_error *err) {
    if (k > m->n_hist)
        return di_error_set(err, DI_ERR_INVALID, "grammar matcher: rollback of %zu tokens but only %zu accepted", k,
                            m->n_hist);
    if (k == 0) return DI_OK;
    m->n_hist -= k;
    restore(m, &m->hist[m->n_hist]);
    return DI_OK;
}

static inline void set_bit(uint32_t *mask, int32_t t) { mask[t >> 5] |= 1u << (t & 31); }
static inline void clear_bit(uint32_t *mask, int32_t t) { mask[t >> 5] &= ~(1u << (t & 31)); }

/* Bytes that act exactly like b on the current (top) Earley set: a push adds the items whose
 * class holds the byte, and nothing else about the byte survives into the new set. So every byte
 * accepted by the same scan items gives an identical set, hence the same successor state, and
 * one Earley push fills the transitions of all of them (inside a JSON string, the ~95 printable
 * ASCII bytes other than '"' and '\\' share one push). */
static void byte_equiv(const di_earley *e, uint8_t b, di_cfg_class *same) {
    const di_cfg *g = e->g;
    size_t top = e->n_sets - 1;
    di_cfg_class acc; /* in registers: same may alias the classes */
    memset(acc.bits, 0xff, sizeof acc.bits);
    for (size_t x = e->set_off[top]; x < e->set_off[top + 1]; x++) {
        int32_t s = g->psym[e->items[x].pos];
        if (s >= 0 || s == DI_CFG_END) continue;
        const di_cfg_class *c = &g->cls[-1 - s];
        if (di_cfg_class_has(c, b))
            for (int w = 0; w < 8; w++) acc.bits[w] &= c->bits[w];
        else
            for (int w = 0; w < 8; w++) acc.bits[w] &= ~c->bits[w];
    }
    *same = acc;
}

/* Set from's successor on every byte of bytes, a union of the table's byte classes (byte_equiv's
 * result is): one store per class, through its lowest byte (tab->brep), not one per byte (a row
 * holds one entry per class; the ~95 bytes of a JSON string's character fall in a few classes). */
static void set_next_all(di_gcache_table *tab, int32_t from, const di_cfg_class *bytes, int32_t next) {
    for (int w = 0; w < 8; w++)
        for (uint32_t x = bytes->bits[w] & tab->brep.bits[w]; x; x &= x - 1)
            di_gcache_set_next(tab, from, (uint8_t)(w * 32 + __builtin_ctz(x)), next);
}

/* State id's sets are on top: record the bytes its set scans, once per state. A later walk that
 * reaches the state through known transitions then rejects any other byte without replaying the
 * path to it (a dead byte was the first unknown edge of most replays). Exact: di_earley_push
 * rejects exactly the bytes outside the scan union, and equal keys scan equal byte sets. */
static void note_scan(di_grammar_matcher *m, di_gcache_table *tab, int32_t id) {
    if (id <= 0 || atomic_load_explicit(&tab->scan_ready[id], memory_order_relaxed)) return;
    di_gcache_scan_put(m->g->cache, tab, id, di_earley_next_bytes(&m->e));
}

/* Id of the state on top under key k, its scanned bytes recorded (note_scan) under the same lock. */
static int32_t intern_top(di_grammar_matcher *m, di_gcache_table *tab, sig128 k) {
    return di_gcache_intern_scan(m->g->cache, tab, k, di_earley_next_bytes(&m->e));
}

static inline bool sig_eq(sig128 x, sig128 y) { return x.a == y.a && x.b == y.b; }

/* ---- loop summaries: accepting a token subtree without walking it ----
 * Inside a JSON string (or any run of "any character but a few") most of the vocabulary is
 * allowed, and walking its ~275k trie nodes node by node was the cost of a cold mask. A state
 * that returns to itself on a set of ASCII bytes, and on every multi-byte UTF-8 character, accepts
 * every token subtree whose bytes are those ASCII bytes and valid UTF-8: the trie knows both
 * facts per subtree (DI_TRIE_UTF8/HIGH, di_trie_node.ascii), so one test accepts the subtree. */

#define LOOP_MIN_BYTES 8 /* states scanning fewer bytes do not loop on enough of them to pay */
#define SKIP_MIN_NODES 4 /* smaller subtrees are walked: the test costs about as much as a node */
#define SKIP_SUMMARY_NODES 64 /* a summary costs ~10-40 Earley pushes: only for a subtree this large */
#define SKIP_REPLAY_NODES 256 /* from here a missing summary is worth replaying the path for */

/* UTF-8 characters by lead-byte range: the byte ranges of each position (RFC 3629 table 3-7). */
static const uint8_t utf8_seq[8][5][2] = {
    {{0xC2, 0xDF}, {0x80, 0xBF}},
    {{0xE0, 0xE0}, {0xA0, 0xBF}, {0x80, 0xBF}},
    {{0xE1, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}},
    {{0xED, 0xED}, {0x80, 0x9F}, {0x80, 0xBF}},
    {{0xEE, 0xEF}, {0x80, 0xBF}, {0x80, 0xBF}},
    {{0xF0, 0xF0}, {0x90, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
    {{0xF1, 0xF3}, {0x80, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
    {{0xF4, 0xF4}, {0x80, 0x8F}, {0x80, 0xBF}, {0x80, 0xBF}},
};
static const int utf8_seq_len[8] = {2, 3, 3, 3, 3, 4, 4, 4};

/* The bytes lo..hi (lo <= hi <= 255) as mask words w0..w1 of a class: the range tests below are
 * one or two word operations instead of one membership test per byte (shape_completes ran them
 * per item and byte: ~9% of the instructions of a counted string's block masks). */
typedef struct byte_range {
    uint32_t bits[8];
    unsigned w0, w1;
} byte_range;

static inline byte_range range_of(unsigned lo, unsigned hi) {
    byte_range r = {.w0 = lo >> 5, .w1 = hi >> 5};
    for (unsigned w = r.w0; w <= r.w1; w++) {
        unsigned l = w == r.w0 ? lo & 31 : 0, h = w == r.w1 ? hi & 31 : 31;
        r.bits[w] = (uint32_t)((((uint64_t)2 << h) - 1) & ~(((uint64_t)1 << l) - 1));
    }
    return r;
}

/* Every byte of r is in c. */
static inline bool range_in(const di_cfg_class *c, const byte_range *r) {
    uint32_t miss = 0;
    for (unsigned w = r->w0; w <= r->w1; w++) miss |= r->bits[w] & ~c->bits[w];
    return !miss;
}

/* Some byte of r is in c. */
static inline bool range_meets(const di_cfg_class *c, const byte_range *r) {
    uint32_t any = 0;
    for (unsigned w = r->w0; w <= r->w1; w++) any |= r->bits[w] & c->bits[w];
    return any != 0;
}

static bool class_covers(const di_cfg_class *c, unsigned lo, unsigned hi) {
    for (unsigned b = lo; b <= hi; b++)
        if (!di_cfg_class_has(c, (uint8_t)b)) return false;
    return true;
}

/* The nonterminals that the top set's byte rules complete at once on a byte sequence of ranges
 * r[0..n) (one range per byte, a UTF-8 shape or one ASCII class), found without pushing: every
 * item that scans a byte of r[0] must be a rule of exactly n terminals predicted in the top set
 * (origin = top, dot at its start) whose terminals cover the ranges. Each sequence of the shape
 * then keeps exactly those items to the end and completes their left-hand sides at the top set,
 * nothing else: the set it leads to depends only on that set of nonterminals. Returns their
 * number (<= max, sorted in lhs[]), 0 when none scans the shape, -1 when the test does not
 * apply (a longer or partial rule, an item in progress, more than max nonterminals). */
static int shape_completes(const di_grammar_matcher *m, const uint8_t (*r)[2], int n, int32_t *lhs, int max) {
    const di_earley *e = &m->e;
    const di_cfg *g = m->g->cfg;
    size_t top = e->n_sets - 1;
    int nl = 0;
    byte_range rw[5]; /* the ranges as mask words (a shape has at most 4 bytes) */
    for (int k = 0; k < n; k++) rw[k] = range_of(r[k][0], r[k][1]);
    for (size_t x = e->set_off[top]; x < e->set_off[top + 1]; x++) {
        di_earley_item it = e->items[x];
        int32_t sym = g->psym[it.pos];
        if (sym >= 0 || sym == DI_CFG_END) continue;
        if (!range_meets(&g->cls[-1 - sym], &rw[0])) continue;
        if (it.origin != top || (it.pos > 0 && g->psym[it.pos - 1] != DI_CFG_END)) return -1;
        for (int k = 0; k < n; k++) {
            int32_t sk = g->psym[it.pos + (uint32_t)k];
            if (sk >= 0 || sk == DI_CFG_END || !range_in(&g->cls[-1 - sk], &rw[k])) return -1;
        }
        if (g->psym[it.pos + (uint32_t)n] != DI_CFG_END) return -1;
        int32_t a = g->plhs[it.pos];
        int y = 0;
        while (y < nl && lhs[y] < a) y++;
        if (y < nl && lhs[y] == a) continue;
        if (nl == max) return -1;
        memmove(lhs + y + 1, lhs + y, (size_t)(nl - y) * sizeof *lhs);
        lhs[y] = a;
        nl++;
    }
    return nl;
}

/* Switch the boundary the context-free signatures are computed for (their cache is per boundary). */
static inline void use_boundary(di_grammar_matcher *m, size_t b) {
    if (m->lb == b) return;
    m->lb = b;
    if (++m->lgen == 0) m->lgen = 1;
}

/* Key of the current (top) state relative to the boundary in effect (0: the full key). A
 * context-free key needs signatures deeper than LSIG_MAX_DEPTH only in pathological grammars;
 * *ok tells. */
static sig128 walk_key(di_grammar_matcher *m, bool *ok) { return m->lb ? local_key(m, ok) : state_key(m); }

/* Push b watching the context below the boundary in effect; returns the push result, and in
 * *ctx whether the byte completed into the context. */
static int watched_push(di_grammar_matcher *m, uint8_t b, bool *ctx, di_error *err) {
    di_earley *e = &m->e;
    e->opaque_below = (uint32_t)m->lb;
    e->opaque_hits = 0;
    int rc = di_earley_push(e, b, err);
    *ctx = e->opaque_hits != 0;
    e->opaque_below = 0;
    return rc;
}

/* Remember the set just pushed (on top, signatures current, no context reached) for take_back. */
static inline void keep(di_grammar_matcher *m, uint8_t b) {
    const di_earley *e = &m->e;
    size_t i = e->n_sets - 1;
    m->kept[i & (KEPT - 1)] = (struct kept_set){
        .at = i, .stamp = e->set_stamp[i], .below = e->set_stamp[i - 1], .pushes = e->n_pushes, .lb = m->lb, .byte = b};
}

/* Push b by taking back the kept set of the next index when it was pushed on the current top
 * set with a byte that acts like b (byte_equiv: identical sets) under the same boundary. Nothing
 * between its pop and now pushed at its index or below, or its stamp or its lower set's would
 * differ; its signatures' versions are still its own (update_sigs writes them for pushed sets). */
static bool take_back(di_grammar_matcher *m, uint8_t b) {
    di_earley *e = &m->e;
    size_t i = e->n_sets;
    const struct kept_set *k = &m->kept[i & (KEPT - 1)];
    if (!k->stamp || k->at != i || k->stamp != e->set_stamp[i] || k->below != e->set_stamp[i - 1] || k->lb != m->lb ||
        e->n_pushes - k->pushes >= UINT32_MAX)
        return false;
    if (b != k->byte) {
        di_cfg_class eq;
        byte_equiv(e, b, &eq);
        if (!di_cfg_class_has(&eq, k->byte)) return false;
    }
    di_earley_unpop(e, i + 1);
    m->n_sig = e->n_sets;
    m->n_reuses++;
    return true;
}

/* watched_push of b with signatures updated, the set kept for take_back (or taken back).
 * Returns 1 (pushed), 0 (rejected) or an error. */
static int push_kept(di_grammar_matcher *m, uint8_t b, bool *ctx, di_error *err) {
    if (take_back(m, b)) {
        *ctx = false;
        return 1;
    }
    int rc = watched_push(m, b, ctx, err);
    if (rc != 1) return rc;
    if ((rc = update_sigs(m, err))) return rc;
    if (!*ctx) keep(m, b);
    return 1;
}

/* Push the byte sequence of ranges r[0..n) (one byte per range, each range acting as one byte:
 * byte_equiv) from the top set. *key: the state reached, *alive false if a byte is rejected,
 * touches the context or a range is not uniform. Leaves the sets as it found them. */
static int push_chars(di_grammar_matcher *m, const uint8_t (*r)[2], int n, sig128 *key, bool *alive, di_error *err) {
    di_earley *e = &m->e;
    size_t top = e->n_sets;
    int rc = DI_OK;
    bool ctx = false, ok = true;
    *alive = false;
    int k = 0;
    for (; k < n; k++) {
        di_cfg_class same;
        if (r[k][0] != r[k][1]) {
            byte_equiv(e, r[k][0], &same);
            if (!class_covers(&same, r[k][0], r[k][1])) break;
        }
        rc = push_kept(m, r[k][0], &ctx, err);
        if (rc <= 0 || ctx) break;
    }
    if (k == n && rc >= 0) {
        *key = walk_key(m, &ok);
        *alive = ok;
    }
    di_earley_pop_to(e, top);
    m->n_sig = e->n_sets;
    return rc < 0 ? rc : DI_OK;
}

/* A link of a character chain: enough characters lead to one successor for a block of them to
 * pay for the summaries along the chain. Counted in bytes ([a-z] is 26 characters in 2 buckets):
 * a letter class qualifies, digits do not (measured on ebnf_arith: a chain through every digit
 * state doubled the summaries per mask and cost more than the trie edges it saved). */
#define CHAIN_MIN_BYTES 20
static inline bool chain_link(const di_gcache_loop *s) { return s->next > 0 && (s->n_next >= CHAIN_MIN_BYTES || s->utf8); }

/* The ASCII bytes of each di_ascii_bucket, for summaries, which turn byte sets into buckets: a
 * loop over the 128 bytes was ~6 K instructions of each summary of a counted string's chain (17
 * per first mask). */
static uint64_t bucket_bytes[DI_N_BUCKETS][2]; /* [bucket][bytes 0-63, 64-127] */
static pthread_once_t bucket_once = PTHREAD_ONCE_INIT;

static void bucket_bytes_init(void) {
    for (unsigned b = 0; b < 128; b++) bucket_bytes[di_ascii_bucket((uint8_t)b)][b >> 6] |= 1ull << (b & 63);
}

/* Buckets holding a byte of the ASCII set s (its first 4 words), or with outside, a byte not in it. */
static uint32_t buckets_meeting(const uint32_t *s, bool outside) {
    pthread_once(&bucket_once, bucket_bytes_init);
    uint64_t flip = outside ? ~0ull : 0, lo = ((uint64_t)s[1] << 32 | s[0]) ^ flip, hi = ((uint64_t)s[3] << 32 | s[2]) ^ flip;
    uint32_t r = 0;
    for (int k = 0; k < DI_N_BUCKETS; k++)
        if ((bucket_bytes[k][0] & lo) | (bucket_bytes[k][1] & hi)) r |= 1u << k;
    return r;
}

/* The lowest ASCII byte >= from in c, or 128. */
static unsigned lowest_ascii(const di_cfg_class *c, unsigned from) {
    for (unsigned w = from >> 5; w < 4; w++) {
        uint32_t x = c->bits[w] & (w == from >> 5 ? ~0u << (from & 31) : ~0u);
        if (x) return w * 32 + (unsigned)__builtin_ctz(x);
    }
    return 128;
}

/* Loop summary (state_cache.h: di_gcache_loop) of the state on top (sets materialized,
 * signatures current): one push per class of equivalent ASCII bytes and one per UTF-8 lead/
 * continuation range shape. When most characters lead to another state T (the first character
 * of a string, or a count in a length-bounded string), the summaries of T and its successors
 * are computed too, `chain` deep, so a walk can accept the tokens whose characters all lead
 * along that chain (loop_chars). */
static int loop_summary(di_grammar_matcher *m, di_gcache_table *tab, int32_t self_id, int chain,
                        di_gcache_loop *out, di_error *err) {
    di_earley *e = &m->e;
    di_grammar_cache *c = m->g->cache;
    memset(out, 0, sizeof *out);
    m->n_summaries++;
    di_cfg_class scan = *di_earley_next_bytes(e);
    int n_bytes = 0;
    for (int w = 0; w < 8; w++) n_bytes += __builtin_popcount(scan.bits[w]);
    if (n_bytes < LOOP_MIN_BYTES) return DI_OK;
    /* the ASCII bytes it scans, by classes its scan items treat alike (one push each below) */
    uint8_t crep[128];
    di_cfg_class cls[128];
    int ncls = 0, widest = 0, wq = 0;
    di_cfg_class done = {{0}};
    for (int v = 0; v < 4; v++)
        for (uint32_t left; (left = scan.bits[v] & ~done.bits[v]);) { /* in byte order */
            uint8_t b = (uint8_t)(v * 32 + __builtin_ctz(left));
            byte_equiv(e, b, &cls[ncls]);
            int cnt = 0;
            for (int w = 0; w < 4; w++) done.bits[w] |= cls[ncls].bits[w], cnt += __builtin_popcount(cls[ncls].bits[w]);
            if (cnt > widest) widest = cnt, wq = ncls;
            crep[ncls++] = b;
        }
    /* ASCII only and no class of CHAIN_MIN_BYTES bytes (the first character of a JSON value,
     * after an operator): its characters lead to many different states, so no block would come
     * of the pushes. Without the test ebnf_json's masks at a value spent ~40 of their ~100
     * pushes on such summaries. */
    if (!(scan.bits[4] | scan.bits[5] | scan.bits[6] | scan.bits[7]) && widest < CHAIN_MIN_BYTES) return DI_OK;
    bool ok = true;
    sig128 self = walk_key(m, &ok);
    if (!ok) return DI_OK;
    enum { MAXK = 8 };
    sig128 keys[MAXK];
    di_cfg_class to[MAXK]; /* ASCII bytes leading to keys[k] */
    int nk = 0;
    /* the widest class is pushed last, so that its set is the one kept at the next index: the
     * chain below and ensure_chain take it back (take_back) to reach the successor. The keys are
     * then taken in class order, as if pushed in it. */
    sig128 qkey[128]; /* [ncls] the state each class leads to */
    bool qalive[128]; /* [ncls] ... if alive (push_chars) */
    for (int j = 0; j < ncls; j++) {
        int q = j == ncls - 1 ? wq : j < wq ? j : j + 1;
        uint8_t one[1][2] = {{crep[q], crep[q]}};
        int rc = push_chars(m, (const uint8_t(*)[2])one, 1, &qkey[q], &qalive[q], err);
        if (rc) return rc;
    }
    for (int q = 0; q < ncls; q++) {
        if (!qalive[q]) continue;
        sig128 k = qkey[q];
        int x = 0;
        while (x < nk && !sig_eq(keys[x], k)) x++;
        if (x == nk) {
            if (nk == MAXK) continue;
            keys[nk] = k;
            memset(&to[nk], 0, sizeof to[nk]);
            nk++;
        }
        for (int w = 0; w < 4; w++) to[x].bits[w] |= cls[q].bits[w];
    }
    if (!nk) return DI_OK;
    int best = 0, best_n = -1;
    for (int x = 0; x < nk; x++) {
        int cnt = 0;
        for (int w = 0; w < 4; w++) cnt += __builtin_popcount(to[x].bits[w]);
        if (cnt > best_n) best = x, best_n = cnt;
    }
    sig128 target = keys[best];
    out->ascii = ~buckets_meeting(to[best].bits, true); /* not: a bucket with a byte that does not lead to the target */
    out->nohigh = !(scan.bits[4] | scan.bits[5] | scan.bits[6] | scan.bits[7]);
    out->scanned = buckets_meeting(scan.bits, false);
    unsigned rep = lowest_ascii(&to[best], 0), rep1 = rep ? rep : lowest_ascii(&to[best], 1);
    out->rep = rep1 < 128 ? (uint8_t)rep1 : 0;
    out->n_next = (uint8_t)best_n;
    bool all = class_covers(&scan, 0xC2, 0xF4);
    /* A shape whose byte rules complete the same nonterminals as a byte that leads to the target
     * (shape_completes) leads to the target too: the 8 shapes cost ~26 pushes per summary
     * otherwise, most of the pushes of a counted string's masks (maxLength: a summary per count). */
    enum { MAXL = 8 };
    int32_t alhs[MAXL], qlhs[MAXL];
    uint8_t arep[1][2] = {{out->rep, out->rep}};
    int na = all && out->rep ? shape_completes(m, (const uint8_t(*)[2])arep, 1, alhs, MAXL) : -1;
    for (int q = 0; q < 8 && all; q++) {
        if (na > 0) {
            int nq = shape_completes(m, utf8_seq[q], utf8_seq_len[q], qlhs, MAXL);
            if (nq == na && !memcmp(qlhs, alhs, (size_t)na * sizeof *alhs)) {
                m->n_shapes_static++;
                continue;
            }
        }
        sig128 k;
        int rc = push_chars(m, utf8_seq[q], utf8_seq_len[q], &k, &all, err);
        if (rc) return rc;
        all = all && sig_eq(k, target);
    }
    out->utf8 = all;
    if (sig_eq(target, self)) {
        out->next = self_id;
        return DI_OK;
    }
    out->next = di_gcache_intern(c, tab, target);
    if (out->next <= 0) {
        out->next = 0;
        return DI_OK;
    }
    di_gcache_loop tl;
    /* only a state that takes most characters alike starts a chain worth following */
    if (chain <= 0 || !chain_link(out) ||
        di_gcache_loop_get(tab, out->next, &tl))
        return DI_OK;
    /* T's sets: push one byte that leads there (rep) */
    size_t top = e->n_sets;
    bool ctx = false;
    int rc = push_kept(m, (uint8_t)rep, &ctx, err);
    bool there = rc == 1 && !ctx;
    if (there) rc = loop_summary(m, tab, out->next, chain - 1, &tl, err);
    di_earley_pop_to(e, top);
    m->n_sig = e->n_sets;
    if (rc < 0) return rc;
    if (there) di_gcache_loop_put(c, tab, out->next, &tl);
    return DI_OK;
}

/* Characters accepted as a block from state id with summary s: ASCII buckets and whether every
 * valid multi-byte character is, such that any run of them stays alive: every character leads
 * along the chain of summarized successor states, which ends in a loop (*any_length) or has at
 * least DI_CHAIN_CHARS links (tokens with more characters are then not covered). */


/* Returns 1 with the block filled in, 0 if the state does not take a block of characters, -1 if
 * a summary along its chain is not computed yet (ensure_chain). */
static int loop_chars(const di_gcache_table *tab, int32_t id, const di_gcache_loop *s, uint32_t *ascii, bool *utf8,
                      bool *any_length, bool *nohigh, uint32_t *scanned) {
    uint32_t a = ~0u, sc = 0;
    bool u = true, nh = true;
    di_gcache_loop cur = *s;
    for (int k = 0; k < DI_CHAIN_CHARS; k++) {
        if (cur.next == id) { /* a loop: any number of characters */
            a &= cur.ascii, u = u && cur.utf8, nh = nh && cur.nohigh, sc |= cur.scanned;
            *ascii = a, *utf8 = u, *any_length = true, *nohigh = nh, *scanned = sc;
            return (a & DI_BUCKET_BITS) || u;
        }
        if (!chain_link(&cur)) return 0;
        a &= cur.ascii, u = u && cur.utf8, nh = nh && cur.nohigh, sc |= cur.scanned;
        id = cur.next;
        if (!di_gcache_loop_get(tab, id, &cur)) return -1;
    }
    /* the chain's last state must take no high byte either (a token may end its ASCII there) */
    *ascii = a, *utf8 = u, *any_length = false, *nohigh = nh && cur.nohigh, *scanned = sc | cur.scanned;
    return 1;
}

/* Summaries along the chain of character successors of state id (whose sets are on top), as far
 * as loop_chars looks: each missing one is computed on the sets reached by pushing one character
 * per link, so a length-bounded string adds one summary per mask, not a chain. */
static int ensure_chain(di_grammar_matcher *m, di_gcache_table *tab, int32_t id, int *budget, di_error *err) {
    di_earley *e = &m->e;
    size_t top = e->n_sets;
    int rc = DI_OK;
    for (int k = 0; k <= DI_CHAIN_CHARS; k++) { /* loop_chars reads the summaries of DI_CHAIN_CHARS + 1 states */
        di_gcache_loop s;
        if (!di_gcache_loop_get(tab, id, &s)) {
            if (*budget <= 0) break;
            --*budget;
            if ((rc = loop_summary(m, tab, id, 1, &s, err))) break;
            di_gcache_loop_put(m->g->cache, tab, id, &s);
        }
        if (k == DI_CHAIN_CHARS || !chain_link(&s) || s.next == id || !s.rep) break;
        bool ctx = false;
        rc = push_kept(m, s.rep, &ctx, err);
        if (rc != 1 || ctx) break;
        id = s.next;
    }
    di_earley_pop_to(e, top);
    m->n_sig = e->n_sets;
    return rc < 0 ? rc : DI_OK;
}

/* loop_chars of state id, or -2 if it has no summary yet. A result of 0 or 1 depends only on
 * published summaries, which never change within a table, so it is memoized per matcher for the
 * table's serial; -1 (a chain link still missing) only until this matcher computes summaries
 * (m->bgen). A summary published meanwhile by another thread is seen later: until then the
 * state is walked byte by byte, which is never wrong. */
static int block_of(di_grammar_matcher *m, const di_gcache_table *tab, int32_t id, uint32_t *ascii, bool *utf8,
                    bool *any_length, bool *nohigh, uint32_t *scanned) {
    struct blk_memo *bm = &m->bmemo[(uint32_t)id & (BLK_MEMO - 1)];
    if (bm->serial == tab->serial && bm->id == id && (bm->res >= 0 || bm->gen == m->bgen)) {
        *ascii = bm->ascii, *utf8 = bm->utf8, *any_length = bm->any, *nohigh = bm->nohigh, *scanned = bm->scanned;
        return bm->res;
    }
    di_gcache_loop ls;
    if (!di_gcache_loop_get(tab, id, &ls)) return -2;
    int r = loop_chars(tab, id, &ls, ascii, utf8, any_length, nohigh, scanned);
    if (r == -1) {
        *bm = (struct blk_memo){.serial = tab->serial, .gen = m->bgen, .id = id, .res = -1};
        return r;
    }
    *bm = (struct blk_memo){.serial = tab->serial, .gen = m->bgen, .id = id, .res = (int8_t)r, .utf8 = *utf8,
                            .any = *any_length, .nohigh = *nohigh, .ascii = *ascii, .scanned = *scanned};
    return r;
}

/* Every path below node nd stays alive from a state accepting these characters as a block (for
 * up to DI_CHAIN_CHARS characters unless any_length). */
static inline bool block_accepts(const di_trie_node *nd, uint32_t ascii, bool utf8, bool any_length) {
    if ((nd->flags & DI_TRIE_HIGH) && (!utf8 || !(nd->flags & DI_TRIE_UTF8))) return false;
    if (!any_length && (nd->flags & DI_TRIE_LONG)) return false;
    return !(nd->ascii & ~ascii);
}

/* Push the path bytes of depths md+1..upto so that the Earley sets of depths 0..upto exist. Each
 * prefix of a trie path the walk reached was viable, so each push succeeds. */
static int replay(di_grammar_matcher *m, di_gcache_table *tab, size_t *md, size_t upto, di_error *err) {
    while (*md < upto) {
        size_t k = *md + 1;
        uint8_t b = m->path[k];
        if (m->stale_gen == m->e.n_pushes && k <= m->stale_md && m->stale_base == m->e.n_sets - *md) {
            /* the set popped at this depth, if its byte acts like this one */
            bool same = b == m->mpath[k];
            if (!same) {
                di_cfg_class eq;
                byte_equiv(&m->e, b, &eq);
                same = di_cfg_class_has(&eq, m->mpath[k]);
            }
            if (same) {
                di_earley_unpop(&m->e, m->e.n_sets + 1);
                m->n_sig = m->e.n_sets; /* its signatures were computed when it was pushed */
                m->n_reuses++;
                *md = k;
                note_scan(m, tab, m->vid[k]);
                continue;
            }
        }
        m->n_replays++;
        int rc = di_earley_push(&m->e, b, err);
        if (rc == 0) rc = di_error_set(err, DI_ERR_INTERNAL, "grammar matcher: a viable trie path was rejected on replay");
        if (rc < 0) return rc;
        m->mpath[k] = b;
        *md = k;
        if ((rc = update_sigs(m, err))) return rc;
        note_scan(m, tab, m->vid[*md]); /* the walk keeps vid exact along the path, or 0 */
    }
    return DI_OK;
}

/* Per walk: the state a context-free state reaches on a context byte, in this walk's context. */
static struct ctx_memo *memo_slot(di_grammar_matcher *m, int32_t from, uint32_t fbnd, uint8_t byte) {
    uint32_t h = (uint32_t)(mix64(((uint64_t)fbnd << 40) ^ ((uint64_t)(uint32_t)from << 8 | byte)) & 255);
    for (int k = 0; k < 8; k++) {
        struct ctx_memo *s = &m->memo[(h + (uint32_t)k) & 255];
        if (s->gen != m->mgen || (s->from == from && s->fbnd == fbnd && s->byte == byte)) return s;
    }
    return NULL; /* crowded: not memoized */
}

/* One edge of a walk: the state after byte path[d] from the state at depth d - 1 (vid, lbd).
 * Follows the transition table; where it is unknown, materializes the Earley sets of the path
 * (only as deep as needed), pushes the byte and records the outcome for every byte that acts
 * the same. A state's successors are keyed relative to its boundary down to a byte that
 * completes into the context below it; the state after that byte (found with the real context,
 * memoized per walk) gets the boundary of its own construct (walk_boundary), so that what
 * follows a closed string or array is shared across contexts too. Returns 1 (vid[d], lbd[d]
 * set), 0 (dead) or a negative status. */
static int walk_edge(di_grammar_matcher *m, di_gcache_table *tab, size_t *md, uint32_t d, di_error *err) {
    di_earley *e = &m->e;
    uint8_t byte = m->path[d];
    int32_t parent = m->vid[d - 1];
    bool pushed = false;
    m->n_edges++;
    use_boundary(m, m->lbd[d - 1]);
    int32_t next = parent > 0 ? di_gcache_next(tab, parent, byte) : DI_ST_UNKNOWN;
    if (next == DI_ST_DEAD) return 0;
    int rc;
    uint8_t like = byte; /* the byte this one acts like (the memo shares context edges by class) */
    if (next <= DI_ST_CONTEXT_0) {
        like = (uint8_t)(DI_ST_CONTEXT_0 - next);
        next = DI_ST_CONTEXT;
    }
    if (next == DI_ST_UNKNOWN && parent > 0) {
        const di_cfg_class *scan = di_gcache_scan_get(tab, parent);
        if (scan && !di_cfg_class_has(scan, byte)) {
            di_gcache_set_next(tab, parent, byte, DI_ST_DEAD);
            return 0;
        }
    }
    if (next == DI_ST_UNKNOWN) {
        if ((rc = replay(m, tab, md, d - 1, err))) return rc;
        di_cfg_class same;
        if (parent > 0) byte_equiv(e, byte, &same);
        bool ctx = false;
        rc = watched_push(m, byte, &ctx, err);
        if (rc < 0) return rc;
        if (rc == 0) {
            if (parent > 0) set_next_all(tab, parent, &same, DI_ST_DEAD);
            return 0;
        }
        *md = d;
        m->mpath[d] = byte;
        pushed = true;
        if ((rc = update_sigs(m, err))) return rc;
        bool ok = true;
        sig128 k = ctx ? (sig128){0, 0} : walk_key(m, &ok);
        if (ctx || !ok) { /* !ok: signatures too deep, leave context-free mode here */
            if (parent > 0 && ctx) {
                like = byte;
                for (unsigned b = 0; b < 256; b++) /* the class's lowest byte, so all of it shares a memo slot */
                    if (di_cfg_class_has(&same, (uint8_t)b)) {
                        like = (uint8_t)b;
                        break;
                    }
                set_next_all(tab, parent, &same, DI_ST_CONTEXT_0 - like);
            }
            next = DI_ST_CONTEXT;
        } else {
            next = intern_top(m, tab, k);
            if (parent > 0 && next != DI_ST_NONE) set_next_all(tab, parent, &same, next);
        }
    }
    uint32_t bnd = m->lbd[d - 1];
    if (next == DI_ST_CONTEXT) {
        m->n_ctx_edges++;
        /* memoized only for a boundary below the walk: then the context is the same real sets
         * for every node of the walk, whereas a boundary inside the trie path has a context that
         * differs from path to path. Keyed by the boundary too: one context-free state reached
         * with two boundaries below the walk (after one and after two closing bytes of a nesting
         * such as `term ::= "(" expr " "`) has two contexts (fuzz_ebnf found the wrong mask) */
        struct ctx_memo *slot = parent > 0 && bnd < m->wbase ? memo_slot(m, parent, bnd, like) : NULL;
        if (slot && slot->gen == m->mgen) {
            next = slot->to;
            bnd = slot->bnd;
        } else {
            if (!pushed) {
                if ((rc = replay(m, tab, md, d - 1, err))) return rc;
                rc = di_earley_push(e, byte, err);
                if (rc == 0) rc = di_error_set(err, DI_ERR_INTERNAL, "grammar matcher: a context transition was rejected");
                if (rc < 0) return rc;
                *md = d;
                m->mpath[d] = byte;
                if ((rc = update_sigs(m, err))) return rc;
            }
            bnd = (uint32_t)walk_boundary(m);
            use_boundary(m, bnd);
            bool ok = true;
            sig128 k = walk_key(m, &ok);
            if (!ok) {
                bnd = 0;
                use_boundary(m, 0);
                k = state_key(m);
            }
            next = intern_top(m, tab, k);
            if (slot) *slot = (struct ctx_memo){.gen = m->mgen, .fbnd = m->lbd[d - 1], .bnd = bnd, .from = parent, .to = next, .byte = like};
        }
    }
    m->vid[d] = next;
    m->lbd[d] = bnd;
    return 1;
}

/* walk_edge with its common cases inline: a known successor or a known dead byte (most edges of
 * a walk once the automaton is learned) cost a table lookup, not a call. With ctx, sets *ctx when
 * the edge completed into the context (a known transition never does). */
static inline int walk_step(di_grammar_matcher *m, di_gcache_table *tab, size_t *md, uint32_t d, bool *ctx,
                            di_error *err) {
    int32_t parent = m->vid[d - 1];
    if (parent > 0) {
        int32_t next = di_gcache_next(tab, parent, m->path[d]);
        if (next > 0) {
            m->n_edges++;
            m->vid[d] = next;
            m->lbd[d] = m->lbd[d - 1];
            return 1;
        }
        if (next == DI_ST_DEAD) {
            m->n_edges++;
            return 0;
        }
    }
    uint64_t before = m->n_ctx_edges;
    int rc = walk_edge(m, tab, md, d, err);
    if (ctx) *ctx = m->n_ctx_edges != before;
    return rc;
}

/* Pop the walk's Earley sets back to depth `depth` (the sets of depths 0..depth stay). */
static inline void walk_pop(di_grammar_matcher *m, size_t base, size_t *md, size_t depth) {
    if (*md > depth) {
        if (m->stale_gen != m->e.n_pushes || m->stale_base != base || m->stale_md < *md)
            m->stale_md = *md; /* replay may take them back */
        m->stale_gen = m->e.n_pushes;
        m->stale_base = base;
        *md = depth;
        di_earley_pop_to(&m->e, base + depth);
        m->n_sig = m->e.n_sets;
    }
}

/* Mask from a root state that takes a block of characters (loop_chars): every token made only
 * of them is allowed at once with bitset algebra over the vocabulary's token classes, and only
 * the tokens of the other classes (in a JSON string: those holding '"', '\\', control bytes or
 * broken UTF-8, ~2,000 of 129,280) are walked one by one. Returns 1 if done, 0 if the root is
 * not such a state (or too many tokens would be left to walk), <0 on error. */
#define LOOP_MASK_MAX_REST 12000

/* A cached block's context tokens are walked in a known order, by token id (blob_off, lens and
 * the bytes at scattered places), and a cold mask finds them in memory the process has not read
 * for a while (twelfth round: with one request of the same grammar run before, schema_recursive's
 * cold p99 halved for the same work). walk_ctx_tokens fetches the offsets PREFETCH_AHEAD tokens
 * ahead and the bytes half as far (their offset was fetched by then). The same in loop_mask's
 * class lists (preorder, mostly ascending) gained nothing measurable and took regex_email's p50
 * from 47 to 64-66 us of CPU (two sets of 18 runs): not done there. */
#define PREFETCH_AHEAD 8

/* Walk the context tokens of a cached block again in this walk's context: each continues from
 * its recorded context-free state and context edge (memoized per walk, so a context byte costs
 * one push per walk, not per token). */
static int walk_ctx_tokens(di_grammar_matcher *m, di_gcache_table *tab, size_t base, uint32_t *mask,
                           const di_gcache_ctxtok *ent, uint32_t n, di_error *err) {
    const di_grammar_vocab *v = m->v;
    size_t md = 0;
    for (uint32_t x = 0; x < n; x++) {
        if (x + PREFETCH_AHEAD < n) {
            int32_t tf = ent[x + PREFETCH_AHEAD].tok;
            __builtin_prefetch(&v->blob_off[tf]);
            __builtin_prefetch(&v->lens[tf]);
            __builtin_prefetch(v->blob + v->blob_off[ent[x + PREFETCH_AHEAD / 2].tok]);
        }
        const di_gcache_ctxtok *e = &ent[x];
        const uint8_t *tb = v->blob + v->blob_off[e->tok];
        uint32_t len = v->lens[e->tok];
        uint32_t keep = 0; /* sets materialized for the prefix shared with the previous token */
        /* walk_edge at depth d needs the sets of depth d - 1 on top: where the per-walk memo has
         * no slot for this token's context edge (crowded), it pushes the byte there, so sets of
         * the previous token deeper than that must not stay (they did: "a context transition
         * was rejected" on ebnf_json, schema_medium and schema_recursive with a 2-slot memo) */
        while (keep < md && keep + 1 < e->depth && m->path[keep + 1] == tb[keep]) keep++;
        walk_pop(m, base, &md, keep);
        for (uint32_t k = keep; k < len; k++) m->path[k + 1] = tb[k];
        /* the states above the root and below the parent are not known here: 0, so that a
         * replay through them records nothing (note_scan) */
        for (uint32_t k = 1; k + 1 < e->depth; k++) m->vid[k] = DI_ST_UNKNOWN;
        m->vid[e->depth - 1] = e->parent;
        m->lbd[e->depth - 1] = m->lbd[0];
        int rc = 1;
        for (uint32_t d = e->depth; d <= len && rc == 1; d++) rc = walk_step(m, tab, &md, d, NULL, err);
        if (rc < 0) return rc;
        if (rc == 1) set_bit(mask, e->tok);
    }
    walk_pop(m, base, &md, 0);
    return DI_OK;
}

/* A long token that ends in a run of one character (up to AHEAD_PERIOD bytes: `\\` x 16, `—` x
 * 20) and pushed new states on its path met counts of a bounded repetition that no walk learned
 * yet (a maxLength string: each count is its own state). The next masks' roots are a few
 * characters further along, so the same token reaches a few lower counts: each such mask replayed
 * the whole path from the root to learn them (schema_medium steps 17-19: 91 of ~160 pushes per
 * mask, two tokens). From the token's last live depth `end`, whose sets are materialized, walk the
 * run on for AHEAD_CHARS more characters (ordinary walk edges: exact transitions, pushed only
 * where unknown), stopping at a dead byte or a context edge. The sets it leaves above `end` go
 * with the next token's walk_pop (the caller keeps `valid` = end). The path, vid, lbd and mpath
 * hold AHEAD_MAX depths past the longest token for this. */
static __attribute__((noinline)) int learn_ahead(di_grammar_matcher *m, di_gcache_table *tab, size_t *md, uint32_t end,
                                                  di_error *err) {
    uint32_t p = 0; /* the run's period: the last 3 p bytes repeat with it */
    for (uint32_t q = 1; q <= AHEAD_PERIOD && 3 * q <= end && !p; q++) {
        bool run = true;
        for (uint32_t k = end - 2 * q + 1; k <= end && run; k++) run = m->path[k] == m->path[k - q];
        if (run) p = q;
    }
    if (!p) return DI_OK;
    uint32_t lim = end + AHEAD_CHARS * p;
    for (uint32_t d = end + 1; d <= lim; d++) {
        m->path[d] = m->path[d - p];
        bool ctx = false;
        int rc = walk_step(m, tab, md, d, &ctx, err);
        if (rc < 0) return rc;
        if (rc == 0 || ctx) break;
    }
    return DI_OK;
}

static int loop_mask(di_grammar_matcher *m, di_gcache_table *tab, size_t base, sig128 root_key, uint32_t *mask,
                     di_error *err) {
    const di_grammar_vocab *v = m->v;
    int32_t root = m->vid[0];
    di_gcache_loop s;
    uint32_t ascii = 0;
    bool utf8 = false;
    if (root <= 0) return 0;
    use_boundary(m, m->lbd[0]);
    int budget = DI_CHAIN_CHARS + 1;
    int rc = ensure_chain(m, tab, root, &budget, err);
    if (rc) return rc;
    if (!di_gcache_loop_get(tab, root, &s)) return 0;
    bool any_length = false, nohigh = false;
    uint32_t scanned = 0;
    if (loop_chars(tab, root, &s, &ascii, &utf8, &any_length, &nohigh, &scanned) != 1) return 0;
    /* a byte outside the block that no state of the chain takes at all ends a token wherever it
     * comes (the characters before it stay in the chain): such tokens are cleared, not walked */
    uint32_t bad = ~ascii & scanned & DI_BUCKET_BITS, dead = ~ascii & ~scanned & DI_BUCKET_BITS;
    if (utf8) bad |= 1u << DI_CLASS_BAD_UTF8;
    else if (nohigh) dead |= 1u << DI_CLASS_HIGH; /* dies at its first high byte, still inside the chain */
    else bad |= 1u << DI_CLASS_HIGH;
    if (!any_length) bad |= 1u << DI_CLASS_LONG;
    size_t rest = 0;
    for (int k = 0; k < DI_N_CLASSES; k++)
        if ((bad >> k) & 1) rest += v->class_off[k + 1] - v->class_off[k];
    if (rest > LOOP_MASK_MAX_REST) return 0;
    if (!m->cent && !(m->cent = malloc(LOOP_MASK_MAX_REST * sizeof *m->cent)))
        return di_error_set(err, DI_ERR_NOMEM, "grammar matcher: out of memory for a block mask");
    uint32_t n_ent = 0;
    if (m->lbd[0] && di_gcache_block_get(m->g->cache, v, tab->serial, root_key, mask, m->cent, LOOP_MASK_MAX_REST, &n_ent)) {
        rc = walk_ctx_tokens(m, tab, base, mask, m->cent, n_ent, err);
        if (rc) return rc;
        m->n_block_masks++;
        m->n_block_hits++;
        return 1;
    }
    bool cacheable = m->lbd[0] != 0; /* a context-free root: the block holds in every context */
    di_vocab_text_minus(v, bad | dead, mask);
    size_t md = 0;
    uint32_t valid = 0; /* depths 1..valid of path have their states in vid/lbd */
    uint32_t first_ctx = 0; /* depth of the first context edge on path 1..valid (0: none) */
    for (int k = 0; k < DI_N_CLASSES; k++) {
        if (!((bad >> k) & 1)) continue;
        /* shared: bytes the previous token walked from this list shares with the entries since
         * (a running minimum of class_lcp); UINT32_MAX before the list's first walked token, whose
         * predecessor on the path came from another list */
        uint32_t shared = UINT32_MAX;
        for (uint32_t x = v->class_off[k]; x < v->class_off[k + 1]; x++) {
            const di_class_ent *ce = &v->class_ent[x];
            uint32_t lcp = v->class_lcp[x];
            if (shared != UINT32_MAX && lcp < shared) shared = lcp;
            if (ce->bits & bad & ((1u << k) - 1)) continue; /* walked in an earlier bad class */
            int32_t t = ce->tok;
            const uint8_t *tb = v->blob + ce->off;
            uint32_t len = ce->len;
            /* the prefix this token shares with the previous one keeps its states (and the sets
             * materialized for it); walk_edge needs the sets of depth d - 1 on top, if any. Path
             * 1..valid holds the previous token's first bytes, so within a list the shared prefix is
             * min(valid, shared) without comparing bytes (shared <= len) */
            uint32_t keep = 0;
            if (shared < DI_LCP_MAX) keep = shared < valid ? shared : valid;
            else
                while (keep < valid && keep < len && m->path[keep + 1] == tb[keep]) keep++;
            shared = DI_LCP_MAX; /* saturated (or no token walked yet): compare bytes */
            walk_pop(m, base, &md, keep);
            if (first_ctx > keep) first_ctx = 0;
            int rc = 1;
            uint32_t d = keep + 1;
            for (; d <= len; d++) {
                m->path[d] = tb[d - 1];
                bool ctx = false;
                if ((rc = walk_step(m, tab, &md, d, &ctx, err)) != 1) break;
                if (ctx && !first_ctx) first_ctx = d;
            }
            if (rc < 0) return rc;
            /* sets materialized by this token's walk (md <= keep before it) up to its end */
            if (d - 1 >= AHEAD_MIN_DEPTH && md == d - 1 && md >= keep + AHEAD_MIN_SETS) {
                int ra = learn_ahead(m, tab, &md, d - 1, err);
                if (ra) return ra;
            }
            valid = d - 1;
            uint32_t c1 = first_ctx; /* first context edge on the live part of the path */
            if (!c1) {
                if (rc == 1) set_bit(mask, t); /* decided without the context */
            } else {
                if (m->vid[c1 - 1] <= 0) cacheable = false; /* an uninterned state: no id to record */
                m->cent[n_ent++] = (di_gcache_ctxtok){.tok = t, .parent = m->vid[c1 - 1], .depth = (uint16_t)c1,
                                                      .byte = m->path[c1], .accepted = rc == 1};
            }
        }
    }
    walk_pop(m, base, &md, 0);
    if (cacheable) di_gcache_block_put(m->g->cache, v, tab->serial, root_key, mask, m->cent, n_ent);
    for (uint32_t x = 0; x < n_ent; x++)
        if (m->cent[x].accepted) set_bit(mask, m->cent[x].tok);
    m->n_block_masks++;
    return 1;
}

/* Summaries computed per walk, bounded even where they do not pay: 8 for states met in the walk,
 * and one chain's worth (DI_CHAIN_CHARS + 1) to complete the chain of a state whose block needs it
 * (schema_small's e-mail labels: 39,486 -> 10,712 edges per mask). */
typedef struct walk_budget {
    int summaries, chain;
} walk_budget;

/* The trie nodes where a walk from a context-free root first reaches the context (walk_nodes). */
typedef struct walk_rec {
    di_gcache_ctxtok *ent; /* [cap] */
    uint32_t cap, n;
    uint32_t end;          /* end of the last listed subtree: the nodes before it are inside it */
    bool full;             /* more than cap */
    uint64_t nodes, toks;  /* trie nodes and tokens of the listed subtrees */
} walk_rec;

/* The edge into node i (from state parent) completed into the context: list the node unless it is
 * inside a listed subtree. Out of line: the walk's loop only tests a flag. */
static __attribute__((noinline)) void walk_rec_note(walk_rec *rec, const di_grammar_vocab *v, uint32_t i,
                                                    int32_t parent) {
    const di_trie_node *nd = &v->nodes[i];
    if (i < rec->end) return;
    if (rec->n < rec->cap)
        rec->ent[rec->n++] = (di_gcache_ctxtok){.node = (int32_t)i, .parent = parent, .depth = nd->depth, .byte = nd->byte};
    else
        rec->full = true;
    rec->end = nd->end;
    rec->nodes += nd->end - i;
    rec->toks += v->tok_start[nd->end] - v->tok_start[i];
}

/* A token walk_nodes set alone, into few[0..*n) (m->few); past its capacity *n becomes
 * DI_GCACHE_LIST_MAX + 1, "no list". */
static inline void note_few(int32_t *few, uint32_t *n, int32_t t) {
    if (*n < DI_GCACHE_LIST_MAX) few[(*n)++] = t;
    else *n = DI_GCACHE_LIST_MAX + 1;
}

/* Walk the trie nodes lo..hi-1 (preorder; the path to lo's parent is in path / vid / lbd, its sets
 * materialized for depths 0..*md) and set the tokens they accept in mask. With rec, each node
 * whose edge first completes into the context on its path (a context edge, or a key too deep for
 * a boundary) is also listed with the state before it: outside those subtrees the walk is
 * decided by the context-free root alone (walk_trie caches it). */
static int walk_nodes(di_grammar_matcher *m, di_gcache_table *tab, size_t base, size_t *md, uint32_t lo, uint32_t hi,
                      uint32_t *mask, walk_budget *bud, walk_rec *rec, di_error *err) {
    const di_grammar_vocab *v = m->v;
    const di_trie_node *nodes = v->nodes;
    di_grammar_cache *c = m->g->cache;
    int rc;
    int32_t blk_of = 0; /* the parent state whose block (loop_chars) is in blk_* */
    int blk = 0;
    uint32_t blk_ascii = 0, blk_scanned = 0;
    bool blk_utf8 = false, blk_any = false, blk_nohigh = false;
    int32_t *few = m->few;
    uint32_t n_few = m->n_few; /* in a register: nothing the loop calls reads it */
    for (uint32_t i = lo; i < hi;) {
        const di_trie_node *nd = &nodes[i];
        __builtin_prefetch(&nodes[nd->end]); /* the next node when this subtree is skipped */
        uint32_t d = nd->depth;
        walk_pop(m, base, md, d - 1); /* sets deeper than the parent belong to a finished subtree */
        m->path[d] = nd->byte;
        int32_t parent = m->vid[d - 1];
        if (parent > 0 && nd->end - i >= SKIP_MIN_NODES) {
            if (parent != blk_of) { /* siblings share their parent's block (one chain lookup) */
                di_gcache_loop ls;
                blk = block_of(m, tab, parent, &blk_ascii, &blk_utf8, &blk_any, &blk_nohigh, &blk_scanned);
                bool big = nd->end - i >= SKIP_SUMMARY_NODES && (*md == d - 1 || nd->end - i >= SKIP_REPLAY_NODES);
                if (big && ((blk == -2 && bud->summaries > 0) || (blk == -1 && bud->chain > 0))) { /* no summary yet, or a chain to extend */
                    if ((rc = replay(m, tab, md, d - 1, err))) return rc;
                    use_boundary(m, m->lbd[d - 1]);
                    if (blk == -2) {
                        bud->summaries--;
                        rc = loop_summary(m, tab, parent, 1, &ls, err);
                        if (!rc) di_gcache_loop_put(c, tab, parent, &ls);
                    } else {
                        rc = ensure_chain(m, tab, parent, &bud->chain, err);
                    }
                    m->bgen++;
                    if (rc) return rc;
                    blk = block_of(m, tab, parent, &blk_ascii, &blk_utf8, &blk_any, &blk_nohigh, &blk_scanned);
                    if (blk == -2) blk = 0;
                }
                if (blk >= 0) blk_of = parent; /* a missing summary may still come with a bigger sibling */
            }
            if (blk == 1 && block_accepts(nd, blk_ascii, blk_utf8, blk_any)) {
                di_trie_union_add(&m->whole, v, v->tok_start[i], v->tok_start[nd->end], mask);
                m->n_blocks++;
                n_few = DI_GCACHE_LIST_MAX + 1; /* the mask is more than the tokens set alone */
                i = nd->end;
                continue;
            }
        }
        bool ctx = false;
        rc = walk_step(m, tab, md, d, &ctx, err);
        if (rc < 0) return rc;
        if (rc == 0) {
            i = nd->end;
            continue;
        }
        if (ctx && rec) walk_rec_note(rec, v, i, parent);
        if (nd->tok >= 0) {
            set_bit(mask, nd->tok);
            note_few(few, &n_few, nd->tok);
            if (nd->flags & DI_TRIE_DUP)
                for (int32_t t = v->dup_next[nd->tok]; t >= 0; t = v->dup_next[t]) set_bit(mask, t), note_few(few, &n_few, t);
        }
        i++;
    }
    m->n_few = n_few;
    return DI_OK;
}

/* Walk the trie subtrees listed by walk_nodes in this walk's context: each starts again from its
 * recorded context-free state, so its context edge costs a memo lookup (one push per walk, not per
 * subtree, where the memo has a slot). */
static int walk_ctx_nodes(di_grammar_matcher *m, di_gcache_table *tab, size_t base, uint32_t *mask,
                          const di_gcache_ctxtok *ent, uint32_t n, walk_budget *bud, di_error *err) {
    const di_grammar_vocab *v = m->v;
    size_t md = 0;
    for (uint32_t x = 0; x < n; x++) {
        const di_gcache_ctxtok *e = &ent[x];
        /* the node's path: the first bytes of the first token of its subtree */
        const uint8_t *tb = v->bytes[v->pre_tok[v->tok_start[e->node]]];
        uint32_t keep = 0; /* sets materialized for the prefix shared with the previous subtree */
        while (keep < md && keep + 1 < e->depth && m->path[keep + 1] == tb[keep]) keep++;
        walk_pop(m, base, &md, keep);
        for (uint32_t k = 1; k < e->depth; k++) {
            m->path[k] = tb[k - 1];
            m->lbd[k] = m->lbd[0];
            m->vid[k] = DI_ST_UNKNOWN; /* not known here: a replay through them records nothing (note_scan) */
        }
        m->vid[e->depth - 1] = e->parent;
        int rc = walk_nodes(m, tab, base, &md, (uint32_t)e->node, v->nodes[e->node].end, mask, bud, NULL, err);
        if (rc) return rc;
    }
    walk_pop(m, base, &md, 0);
    return DI_OK;
}

/* walk_nodes over the children list[0..n) of a root child (node indices in preorder,
 * bytes in bytes[], the last child's subtree ending at hi), visiting only those whose byte the
 * node's state scans (*scan; NULL: all). di_earley_push rejects every other byte, so their
 * subtrees hold no allowed token; each counts as the dead edge walk_nodes would have found.
 * Consecutive live children are walked as one range. */
static int walk_kids(di_grammar_matcher *m, di_gcache_table *tab, size_t base, size_t *md, const uint32_t *list,
                     const uint8_t *bytes, uint32_t n, uint32_t hi, const di_cfg_class *scan, uint32_t *mask,
                     walk_budget *bud, walk_rec *rec, di_error *err) {
    if (!scan) return n ? walk_nodes(m, tab, base, md, list[0], hi, mask, bud, rec, err) : DI_OK;
    int rc;
    for (uint32_t k = 0; k < n;) {
        if (!di_cfg_class_has(scan, bytes[k])) {
            m->n_edges++;
            m->n_kid_skips++;
            k++;
            continue;
        }
        uint32_t j = k + 1;
        while (j < n && di_cfg_class_has(scan, bytes[j])) j++;
        if ((rc = walk_nodes(m, tab, base, md, list[k], j < n ? list[j] : hi, mask, bud, rec, err))) return rc;
        k = j;
    }
    return DI_OK;
}

/* Children of a root child this many or more are walked by the bytes their state scans. */
#define KID2_MIN 32

/* Does the state scan fewer bytes than a loop summary needs (LOOP_MIN_BYTES)? Then no summary of
 * it can accept a subtree whole, and skipping its dead children changes nothing but the walk. A
 * state that scans more keeps all its children visited: a big dead child asks for the state's
 * summary there, and its live siblings are then taken whole (without that, regex_sentence and
 * ebnf_stmt listed other whole subtrees in one walk than in the next and rebuilt a union: +29% and
 * +24% instructions on one mask each). NULL (not known): false. */
static bool few_bytes(const di_cfg_class *scan) {
    if (!scan) return false;
    int nb = 0;
    for (int w = 0; w < 8; w++)
        for (uint32_t x = scan->bits[w]; x; x &= x - 1)
            if (++nb >= LOOP_MIN_BYTES) return false;
    return true;
}

/* Should walk_root step into root child k alone and walk its children by its state's scanned
 * bytes? Only for a wide child whose state may scan few bytes: known to (a known transition), or
 * not known yet (a new state, as in a first walk after a JSON comma). */
static bool split_kid(const di_grammar_matcher *m, const di_gcache_table *tab, uint32_t k) {
    const di_grammar_vocab *v = m->v;
    if (!v->kid2_off || v->kid2_off[k + 1] - v->kid2_off[k] < KID2_MIN) return false;
    int32_t next = m->vid[0] > 0 ? di_gcache_next(tab, m->vid[0], v->root_byte[k]) : DI_ST_UNKNOWN;
    return next <= 0 || few_bytes(di_gcache_scan_get(tab, next));
}

/* walk_nodes over the whole trie from the walk's root, skipping the children whose byte their
 * parent's state does not scan, at the first two levels: a walk of a few allowed first bytes
 * (after a JSON comma: whitespace and `"`) otherwise visits all ~256 children of the root and the
 * ~120 of " ", each a node of its own in a different part of the trie. The root's scanned bytes
 * are its set's (*scan, exact); a root child's are its state's as recorded when it was interned
 * (note_scan; walk_edge trusts them the same way). */
static int walk_root(di_grammar_matcher *m, di_gcache_table *tab, size_t base, size_t *md, const di_cfg_class *scan,
                     uint32_t *mask, walk_budget *bud, walk_rec *rec, di_error *err) {
    const di_grammar_vocab *v = m->v;
    uint32_t n = v->n_root_kids;
    int rc;
    for (uint32_t k = 0; k < n;) {
        if (!di_cfg_class_has(scan, v->root_byte[k])) {
            m->n_edges++;
            m->n_kid_skips++;
            k++;
            continue;
        }
        if (!split_kid(m, tab, k)) { /* a run of live children walked as they come */
            uint32_t j = k + 1;
            while (j < n && di_cfg_class_has(scan, v->root_byte[j]) && !split_kid(m, tab, j)) j++;
            if ((rc = walk_nodes(m, tab, base, md, v->root_kid[k], v->root_kid[j], mask, bud, rec, err))) return rc;
            k = j;
            continue;
        }
        uint32_t i = v->root_kid[k], o = v->kid2_off[k], nk = v->kid2_off[k + 1] - o;
        uint64_t blocks = m->n_blocks;
        m->vid[1] = DI_ST_DEAD; /* stays so if the edge is dead; a live edge sets the state */
        if ((rc = walk_nodes(m, tab, base, md, i, i + 1, mask, bud, rec, err))) return rc;
        k++;
        if (m->n_blocks != blocks || m->vid[1] == DI_ST_DEAD) continue; /* accepted whole, or dead */
        const di_cfg_class *s2 = m->vid[1] > 0 ? di_gcache_scan_get(tab, m->vid[1]) : NULL;
        if (!few_bytes(s2)) s2 = NULL; /* all children visited */
        rc = walk_kids(m, tab, base, md, v->kid2 + o, v->kid2_byte + o, nk, v->root_kid[k], s2, mask, bud, rec, err);
        if (rc) return rc;
    }
    return DI_OK;
}

/* A walk is stored only if it took at least V / WALK_CACHE_EDGE_WORDS edges: copying the mask
 * (V / 32 words) in and out costs about what walking a few hundred edges does (1,010 edges at
 * V = 129,280; small test and fuzz vocabularies store nearly every walk, which exercises it). */
#define WALK_CACHE_EDGE_WORDS 128
#define WALK_CACHE_MAX_TOKS 8192 /* tokens of the listed subtrees that a later walk clears one by one */

/* Lazily built automaton over parse states (shared per grammar, state_cache.h). A state is a
 * structural key interned to a small id; its transition on a byte is the successor id, DEAD,
 * CONTEXT (context-free states only) or UNKNOWN until first needed. Because keys are structural,
 * a transition learned at one position holds at every other one, in later masks and in other
 * requests: the trie walk soon runs on table lookups alone and materializes Earley sets only
 * where a transition is still unknown.
 *
 * Walk the trie (preorder, see di_trie_node) from the current state, one walk_edge per edge. A
 * dead edge skips its subtree, so the work follows the number of viable prefixes, not V; a
 * subtree that the parent state accepts as a block of characters (loop summaries) is added
 * without walking it, and a root that takes such a block uses loop_mask instead.
 *
 * From a context-free root, what a walk decides without reaching the context depends on the root
 * alone: the tokens accepted there, and the trie nodes whose edge first reaches the context. Both
 * are cached per root (as loop_mask's blocks), so the same construct in another context (the word
 * counts of the next sentence, a term at another nesting depth) walks only those subtrees again. */
static int walk_trie(di_grammar_matcher *m, uint32_t *mask, di_error *err) {
    const di_grammar_vocab *v = m->v;
    di_earley *e = &m->e;
    di_grammar_cache *c = m->g->cache;
    di_gcache_table *tab = di_gcache_acquire(c);
    int rc = DI_OK;
    size_t base = e->n_sets; /* depth d of the walk lives in set index base - 1 + d */
    size_t md = 0;           /* sets materialized for depths 0..md of the current path */
    if (++m->mgen == 0) m->mgen = 1; /* retires the memo */
    m->wbase = base;
    m->few_ok = false;
    if (++m->lgen == 0) m->lgen = 1; /* the sets changed since the last walk */
    m->lb = walk_boundary(m);
    bool ok = true;
    sig128 root = m->lb ? local_key(m, &ok) : state_key(m);
    if (!ok) use_boundary(m, 0), root = state_key(m);
    m->lbd[0] = (uint32_t)m->lb;
    m->vid[0] = intern_top(m, tab, root);
    di_cfg_class scan = *di_earley_next_bytes(e); /* the root's first bytes (walk_root) */
    rc = loop_mask(m, tab, base, root, mask, err); /* writes mask only when it returns 1 */
    m->bgen++; /* loop_mask may have extended the root's chain */
    if (rc) goto out; /* done (1) or failed (< 0) */
    walk_budget bud = {.summaries = 8, .chain = DI_CHAIN_CHARS + 1};
    bool cacheable = tab && m->lbd[0] && m->vid[0] > 0; /* a context-free root with an id */
    if (!m->cent && !(m->cent = malloc(LOOP_MASK_MAX_REST * sizeof *m->cent))) {
        rc = di_error_set(err, DI_ERR_NOMEM, "grammar matcher: out of memory for a trie walk");
        goto out;
    }
    walk_rec rec = {.ent = m->cent, .cap = LOOP_MASK_MAX_REST};
    di_trie_union_reset(&m->whole);
    if (cacheable && di_gcache_walk_get(c, v, tab->serial, root, mask, rec.ent, rec.cap, &rec.n)) {
        m->n_walk_hits++;
        for (uint32_t x = 0; x < rec.n; x++) /* the other context's tokens there */
            for (uint32_t k = v->tok_start[rec.ent[x].node], e = v->tok_start[v->nodes[rec.ent[x].node].end]; k < e; k++)
                clear_bit(mask, v->pre_tok[k]);
        rc = walk_ctx_nodes(m, tab, base, mask, rec.ent, rec.n, &bud, err);
        if (rc) goto out;
        di_trie_union_apply(&m->whole, v, mask);
    } else {
        memset(mask, 0, di_grammar_mask_words(v->n_vocab) * sizeof *mask);
        uint64_t edges = m->n_edges;
        m->n_few = 0;
        /* the listed subtrees are walked in place (their sets are on the path now); a later
         * walk clears their tokens from the stored mask and walks them again */
        rc = walk_root(m, tab, base, &md, &scan, mask, &bud, cacheable ? &rec : NULL, err);
        if (rc) goto out;
        edges = m->n_edges - edges;
        m->few_ok = m->n_few <= DI_GCACHE_LIST_MAX; /* no subtree accepted whole: the list is the mask */
        int from = di_trie_union_apply(&m->whole, v, mask);
        m->n_union_hits += from == DI_UNION_REUSED;
        m->n_union_shifts += from == DI_UNION_SHIFTED;
        /* worth a copy of the mask only where another context would skip most of the walk: the
         * listed subtrees hold at most half as many nodes as the walk took edges (ebnf_stmt's
         * operators reach the context in 116 subtrees: 67,451 tokens, 9,176 of 9,436 edges) */
        cacheable = cacheable && !rec.full && edges * WALK_CACHE_EDGE_WORDS >= v->n_vocab && rec.nodes <= edges / 2 &&
                    rec.toks <= WALK_CACHE_MAX_TOKS;
        for (uint32_t x = 0; x < rec.n && cacheable; x++) cacheable = rec.ent[x].parent > 0;
        if (cacheable) m->wput = (struct walk_put){.pending = true, .root = root, .table = tab->serial, .n = rec.n};
    }
    rc = DI_OK;
out:
    di_gcache_release(c, tab);
    di_earley_pop_to(e, base);
    m->n_sig = e->n_sets;
    m->lb = 0;
    return rc < 0 ? rc : DI_OK;
}

int di_grammar_matcher_fill_mask(di_grammar_matcher *m, uint32_t *mask, di_error *err) {
    const di_grammar_vocab *v = m->v;
    size_t words = di_grammar_mask_words(v->n_vocab);
    if (m->cur.finished) {
        memset(mask, 0, words * sizeof *mask);
        for (size_t i = 0; i < v->n_eos; i++) set_bit(mask, v->eos[i]);
        return DI_OK;
    }
    if (m->cur.in_think) {
        memset(mask, 0xff, words * sizeof *mask);
        if (v->n_vocab & 31) mask[words - 1] = (1u << (v->n_vocab & 31)) - 1;
        for (size_t i = 0; i < v->n_eos; i++) clear_bit(mask, v->eos[i]);
        for (size_t i = 0; i < m->n_think_toks; i++) {
            int32_t t = m->think_toks[i];
            if (!v->special[t] && !di_grammar_matcher_try_bytes(m, v->bytes[t], v->lens[t])) clear_bit(mask, t);
        }
        return DI_OK;
    }
    int rc = update_sigs_as(m, true, err);
    if (rc) return rc;
    sig128 key = state_key(m);
    if (di_gcache_mask_get(m->g->cache, v, key, mask)) {
        m->cache_hits++;
    } else {
        m->cache_misses++;
        m->wput.pending = false;
        rc = walk_trie(m, mask, err); /* writes every word of mask */
        if (rc) return rc;
        int32_t slot = m->few_ok ? di_gcache_mask_put_list(m->g->cache, v, key, m->few, m->n_few)
                                 : di_gcache_mask_put(m->g->cache, v, key, mask);
        if (m->wput.pending) /* the walk refers to that copy of its mask */
            di_gcache_walk_put(m->g->cache, v, m->wput.table, m->wput.root, slot, key, m->cent, m->wput.n);
    }
    if (di_earley_accepting(&m->e))
        for (size_t i = 0; i < v->n_eos; i++) set_bit(mask, v->eos[i]);
    return DI_OK;
}

void di_grammar_mask_apply(const uint32_t *mask, float *logits, uint32_t n_vocab) {
    for (uint32_t t = 0; t < n_vocab; t++)
        if (!((mask[t >> 5] >> (t & 31)) & 1u)) logits[t] = -INFINITY;
}

/* ---- compile entry points ---- */

static int compile(di_grammar **out, di_error *err, int rc, di_cfg *cfg, int32_t start) {
    if (!rc) rc = di_cfg_finalize(cfg, start, err);
    if (rc) {
        di_cfg_free(cfg);
        return rc;
    }
    di_grammar *g = calloc(1, sizeof *g);
    if (!g) {
        di_cfg_free(cfg);
        return di_error_set(err, DI_ERR_NOMEM, "grammar: out of memory");
    }
    g->cfg = cfg;
    g->here = here_terms(cfg);
    if (!g->here) {
        di_grammar_free(g);
        return di_error_set(err, DI_ERR_NOMEM, "grammar: out of memory for %u position terms", cfg->n_pos);
    }
    rc = di_gcache_new(&g->cache, cfg, err);
    if (rc) {
        di_grammar_free(g);
        return rc;
    }
    *out = g;
    return DI_OK;
}

int di_grammar_from_regex(const char *re, size_t len, di_grammar **out, di_error *err) {
    *out = NULL;
    di_cfg *cfg = di_cfg_new();
    if (!cfg) return di_error_set(err, DI_ERR_NOMEM, "grammar: out of memory");
    int32_t start = 0;
    int rc = di_regex_to_cfg(cfg, re, len, &start, err);
    return compile(out, err, rc, cfg, start);
}

int di_grammar_from_ebnf(const char *src, size_t len, const char *root, di_grammar **out, di_error *err) {
    *out = NULL;
    di_cfg *cfg = di_cfg_new();
    if (!cfg) return di_error_set(err, DI_ERR_NOMEM, "grammar: out of memory");
    int32_t start = 0;
    int rc = di_ebnf_to_cfg(cfg, src, len, root ? root : "root", &start, err);
    return compile(out, err, rc, cfg, start);
}

int di_grammar_from_json_schema(const char *json, size_t len, const di_json_schema_opts *opts, di_grammar **out,
                                di_error *err) {
    *out = NULL;
    di_cfg *cfg = di_cfg_new();
    if (!cfg) return di_error_set(err, DI_ERR_NOMEM, "grammar: out of memory");
    int32_t start = 0;
    di_json_schema_opts o = opts ? *opts : (di_json_schema_opts){0};
    int rc = di_json_schema_to_cfg(cfg, json, len, &o, &start, err);
    return compile(out, err, rc, cfg, start);
}
