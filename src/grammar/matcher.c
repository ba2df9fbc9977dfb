/* Per-request matcher: token acceptance, rollback, thinking/stop handling and the token mask. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/earley.h"
#include "grammar/grammar_impl.h"
#include "grammar/state_cache.h"

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

struct di_grammar_matcher {
    const di_grammar *g;
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
    size_t n_sig, cap_sig;          /* signatures valid for sets [0, n_sig) */
    uint64_t cache_hits, cache_misses;
    int32_t *vid;                   /* [max token length + 1] state id per walk depth */
    uint8_t *path;                  /* [max token length + 1] bytes of the current trie path */
    uint8_t stop[DI_GRAMMAR_MAX_STOP][DI_GRAMMAR_MAX_STOP_LEN];
    uint32_t stop_len[DI_GRAMMAR_MAX_STOP];
    size_t n_stop;
};

void di_grammar_free(di_grammar *g) {
    if (!g) return;
    di_gcache_free(g->cache);
    di_cfg_free(g->cfg);
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
    m->vid = malloc(((size_t)v->max_len + 1) * sizeof *m->vid);
    m->path = malloc((size_t)v->max_len + 1);
    if (!m->vid || !m->path) {
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
    free(m->vid);
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
static void add_item_sig(sig128 *h, uint32_t pos, sig128 o) {
    h->a += mix64(((uint64_t)pos << 1 | 1) ^ mix64(o.a));
    h->b += mix64(((uint64_t)pos * 0x9E3779B97F4A7C15ull) ^ mix64(o.b + 0x5851F42D4C957F2Dull));
}

static int update_sigs(di_grammar_matcher *m, di_error *err) {
    const di_earley *e = &m->e;
    if (e->n_sets > m->cap_sig) {
        size_t cap = m->cap_sig ? m->cap_sig : 256;
        while (cap < e->n_sets) cap *= 2;
        sig128 *p = realloc(m->set_sig, cap * sizeof *p);
        if (!p) return di_error_set(err, DI_ERR_NOMEM, "grammar matcher: out of memory for state signatures");
        m->set_sig = p;
        m->cap_sig = cap;
    }
    for (size_t i = m->n_sig; i < e->n_sets; i++) {
        sig128 h = {0x243F6A8885A308D3ull, 0x13198A2E03707344ull};
        for (size_t x = e->set_off[i]; x < e->set_off[i + 1]; x++) {
            di_earley_item it = e->items[x];
            if (m->g->cfg->psym[it.pos] < 0) continue; /* terminal or end: not read by completion */
            add_item_sig(&h, it.pos, it.origin == i ? (sig128){1, 2} : m->set_sig[it.origin]);
        }
        m->set_sig[i] = h;
    }
    m->n_sig = e->n_sets;
    return DI_OK;
}

/* Key of the current state: the waiting items (set_sig) plus the items that scan a byte. */
static sig128 state_key(const di_grammar_matcher *m) {
    const di_earley *e = &m->e;
    size_t i = e->n_sets - 1;
    sig128 h = m->set_sig[i];
    h.a ^= 0xA5A5A5A5A5A5A5A5ull;
    for (size_t x = e->set_off[i]; x < e->set_off[i + 1]; x++) {
        di_earley_item it = e->items[x];
        int32_t sym = m->g->cfg->psym[it.pos];
        if (sym >= 0 || sym == DI_CFG_END) continue;
        add_item_sig(&h, it.pos, it.origin == i ? (sig128){1, 2} : m->set_sig[it.origin]);
    }
    return h;
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
    memset(same->bits, 0xff, sizeof same->bits);
    for (size_t x = e->set_off[top]; x < e->set_off[top + 1]; x++) {
        int32_t s = g->psym[e->items[x].pos];
        if (s >= 0 || s == DI_CFG_END) continue;
        const di_cfg_class *c = &g->cls[-1 - s];
        if (di_cfg_class_has(c, b))
            for (int w = 0; w < 8; w++) same->bits[w] &= c->bits[w];
        else
            for (int w = 0; w < 8; w++) same->bits[w] &= ~c->bits[w];
    }
}

static void set_next_all(di_gcache_table *tab, int32_t from, const di_cfg_class *bytes, int32_t next) {
    for (int w = 0; w < 8; w++)
        for (uint32_t x = bytes->bits[w]; x; x &= x - 1)
            di_gcache_set_next(tab, from, (uint8_t)(w * 32 + __builtin_ctz(x)), next);
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

static bool class_covers(const di_cfg_class *c, unsigned lo, unsigned hi) {
    for (unsigned b = lo; b <= hi; b++)
        if (!di_cfg_class_has(c, (uint8_t)b)) return false;
    return true;
}

/* Does pushing every byte sequence of ranges r[0..n) from the top set lead back to state `self`
 * through live states? Each range must act as one byte (byte_equiv) so that one push stands for
 * all of its bytes. Leaves the sets as it found them. */
static int returns_to(di_grammar_matcher *m, const uint8_t (*r)[2], int n, sig128 self, bool *yes, di_error *err) {
    di_earley *e = &m->e;
    size_t top = e->n_sets;
    int rc = DI_OK;
    *yes = false;
    int k = 0;
    for (; k < n; k++) {
        di_cfg_class same;
        byte_equiv(e, r[k][0], &same);
        if (!class_covers(&same, r[k][0], r[k][1])) break;
        rc = di_earley_push(e, r[k][0], err);
        if (rc <= 0) break;
        if ((rc = update_sigs(m, err))) break;
    }
    if (k == n && rc >= 0) *yes = sig_eq(state_key(m), self);
    di_earley_pop_to(e, top);
    m->n_sig = e->n_sets;
    return rc < 0 ? rc : DI_OK;
}

/* Loop summary of the state whose Earley sets are on top (sets materialized, signatures current). */
static int loop_summary(di_grammar_matcher *m, di_gcache_loop *out, di_error *err) {
    di_earley *e = &m->e;
    memset(out, 0, sizeof *out);
    di_cfg_class scan = *di_earley_next_bytes(e);
    int n_bytes = 0;
    for (int w = 0; w < 8; w++) n_bytes += __builtin_popcount(scan.bits[w]);
    if (n_bytes < LOOP_MIN_BYTES) return DI_OK;
    sig128 self = state_key(m);
    di_cfg_class done = {{0}}, loop = {{0}};
    for (unsigned b = 0; b < 128; b++) {
        if (di_cfg_class_has(&done, (uint8_t)b) || !di_cfg_class_has(&scan, (uint8_t)b)) continue;
        di_cfg_class same;
        byte_equiv(e, (uint8_t)b, &same);
        for (int w = 0; w < 4; w++) done.bits[w] |= same.bits[w];
        uint8_t one[1][2] = {{(uint8_t)b, (uint8_t)b}};
        bool loops = false;
        int rc = returns_to(m, (const uint8_t(*)[2])one, 1, self, &loops, err);
        if (rc) return rc;
        if (loops)
            for (int w = 0; w < 4; w++) loop.bits[w] |= same.bits[w];
    }
    uint32_t partial = 0; /* buckets with a byte outside the loop */
    for (unsigned b = 0; b < 128; b++)
        if (!di_cfg_class_has(&loop, (uint8_t)b)) partial |= 1u << di_ascii_bucket((uint8_t)b);
    out->ascii = ~partial;
    bool all = class_covers(&scan, 0xC2, 0xF4);
    for (int s = 0; s < 8 && all; s++) {
        int rc = returns_to(m, utf8_seq[s], utf8_seq_len[s], self, &all, err);
        if (rc) return rc;
    }
    out->utf8 = all;
    return DI_OK;
}

/* Every path below node nd stays alive from a state with summary s (see loop_summary). */
static inline bool loop_accepts(const di_trie_node *nd, const di_gcache_loop *s) {
    if ((nd->flags & DI_TRIE_HIGH) && (!s->utf8 || !(nd->flags & DI_TRIE_UTF8))) return false;
    return !(nd->ascii & ~s->ascii);
}

/* Push the path bytes of depths md+1..upto so that the Earley sets of depths 0..upto exist. Each
 * prefix of a trie path the walk reached was viable, so each push succeeds. */
static int replay(di_grammar_matcher *m, size_t *md, size_t upto, di_error *err) {
    while (*md < upto) {
        int rc = di_earley_push(&m->e, m->path[*md + 1], err);
        if (rc == 0) rc = di_error_set(err, DI_ERR_INTERNAL, "grammar matcher: a viable trie path was rejected on replay");
        if (rc < 0) return rc;
        (*md)++;
        if ((rc = update_sigs(m, err))) return rc;
    }
    return DI_OK;
}

/* Lazily built automaton over parse states (shared per grammar, state_cache.h). A state is a
 * structural key (state_key) interned to a small id; its transition on a byte is the successor
 * id, DEAD, or UNKNOWN until first needed. Because keys are structural, a transition learned at
 * one position holds at every other one, in later masks and in other requests: inside a JSON
 * string the trie walk soon runs on table lookups alone and materializes Earley sets only where
 * a transition is still unknown. */
/* Walk the trie (preorder, see di_trie_node) from the current state. Per edge: follow the
 * transition table; where it is unknown, materialize the Earley sets along the current path
 * (only as deep as needed), push the byte and record the outcome. A dead edge skips its subtree,
 * so the work follows the number of viable prefixes, not V; a subtree that the parent state's
 * loop summary accepts whole is added without walking it. */
static int walk_trie(di_grammar_matcher *m, uint32_t *mask, sig128 root_key, di_error *err) {
    const di_grammar_vocab *v = m->v;
    const di_trie_node *nodes = v->nodes;
    di_earley *e = &m->e;
    di_grammar_cache *c = m->g->cache;
    di_gcache_table *tab = di_gcache_acquire(c);
    int rc = DI_OK;
    size_t base = e->n_sets; /* depth d of the walk lives in set index base - 1 + d */
    size_t md = 0;           /* sets materialized for depths 0..md of the current path */
    m->vid[0] = di_gcache_intern(c, tab, root_key);
    for (uint32_t i = 1, n = v->n_nodes; i < n;) {
        const di_trie_node *nd = &nodes[i];
        __builtin_prefetch(&nodes[nd->end]); /* the next node when this subtree is skipped */
        uint32_t d = nd->depth;
        if (md > d - 1) { /* sets deeper than the parent belong to a finished subtree */
            md = d - 1;
            di_earley_pop_to(e, base + md);
            m->n_sig = e->n_sets;
        }
        m->path[d] = nd->byte;
        int32_t parent = m->vid[d - 1];
        if (parent > 0 && nd->end - i >= SKIP_MIN_NODES) {
            di_gcache_loop ls;
            bool have = di_gcache_loop_get(tab, parent, &ls);
            if (!have && nd->end - i >= SKIP_SUMMARY_NODES && (md == d - 1 || nd->end - i >= SKIP_REPLAY_NODES)) {
                if ((rc = replay(m, &md, d - 1, err)) || (rc = loop_summary(m, &ls, err))) goto out;
                di_gcache_loop_put(c, tab, parent, &ls);
                have = true;
            }
            if (have && loop_accepts(nd, &ls)) {
                for (uint32_t k = v->tok_start[i], ke = v->tok_start[nd->end]; k < ke; k++) set_bit(mask, v->pre_tok[k]);
                i = nd->end;
                continue;
            }
        }
        int32_t next = parent > 0 ? di_gcache_next(tab, parent, nd->byte) : DI_ST_UNKNOWN;
        if (next == DI_ST_DEAD) {
            i = nd->end;
            continue;
        }
        if (next == DI_ST_UNKNOWN) {
            if ((rc = replay(m, &md, d - 1, err))) goto out;
            di_cfg_class same;
            if (parent > 0) byte_equiv(e, nd->byte, &same);
            rc = di_earley_push(e, nd->byte, err);
            if (rc < 0) goto out;
            if (rc == 0) {
                if (parent > 0) set_next_all(tab, parent, &same, DI_ST_DEAD);
                i = nd->end;
                continue;
            }
            md = d;
            if ((rc = update_sigs(m, err))) goto out;
            next = di_gcache_intern(c, tab, state_key(m));
            if (parent > 0 && next != DI_ST_NONE) set_next_all(tab, parent, &same, next);
        }
        m->vid[d] = next;
        if (nd->tok >= 0) {
            set_bit(mask, nd->tok);
            if (nd->flags & DI_TRIE_DUP)
                for (int32_t t = v->dup_next[nd->tok]; t >= 0; t = v->dup_next[t]) set_bit(mask, t);
        }
        i++;
    }
    rc = DI_OK;
out:
    di_gcache_release(c, tab);
    di_earley_pop_to(e, base);
    m->n_sig = e->n_sets;
    return rc;
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
    int rc = update_sigs(m, err);
    if (rc) return rc;
    sig128 key = state_key(m);
    if (di_gcache_mask_get(m->g->cache, v, key, mask)) {
        m->cache_hits++;
    } else {
        m->cache_misses++;
        memset(mask, 0, words * sizeof *mask);
        rc = walk_trie(m, mask, key, err);
        if (rc) return rc;
        di_gcache_mask_put(m->g->cache, v, key, mask);
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
    rc = di_gcache_new(&g->cache, err);
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
