#include "grammar/earley.h"

#include <stdlib.h>
#include <string.h>

static inline uint64_t key_of(uint32_t pos, uint32_t origin) { return (uint64_t)pos << 32 | origin; }

static inline size_t hash_of(uint64_t k, size_t mask) {
    k *= 0x9E3779B97F4A7C15ull;
    return (size_t)(k >> 29) & mask;
}

static int grow_hash(di_earley *m, size_t need, di_error *err) {
    if (need * 2 <= m->hcap) return DI_OK;
    size_t cap = m->hcap ? m->hcap : 256;
    while (cap < need * 2) cap *= 2;
    uint64_t *k = malloc(cap * sizeof *k);
    uint32_t *s = calloc(cap, sizeof *s);
    if (!k || !s) {
        free(k);
        free(s);
        return di_error_set(err, DI_ERR_NOMEM, "grammar matcher: out of memory for a set of %zu items", need);
    }
    free(m->hkey);
    free(m->hstamp);
    m->hkey = k;
    m->hstamp = s;
    m->hcap = cap;
    /* the stamp goes on (>= 1, so the zeroed stamps mark no entry): set_stamp and the Leo memo tell
     * sets apart by it, and restarting it at 1 could make a rebuilt set look like an older one
     * with the same index, whose memoized chain would then be used for the new set */
    /* re-insert the items of the set under construction */
    size_t first = m->set_off[m->n_sets];
    for (size_t i = first; i < m->n_items; i++) {
        if (m->items[i].origin == m->n_sets) continue; /* never looked up (add_new_items) */
        uint64_t key = key_of(m->items[i].pos, m->items[i].origin);
        size_t h = hash_of(key, cap - 1);
        while (m->hstamp[h] == m->stamp) h = (h + 1) & (cap - 1);
        m->hstamp[h] = m->stamp;
        m->hkey[h] = key;
    }
    return DI_OK;
}

/* Sets below this size are deduplicated by a linear scan: most sets the trie walk builds are
 * that small, and a scan over a few cache lines beats hashing. Larger sets switch to the table. */
#define SMALL_SET 24

static void hash_insert(di_earley *m, uint64_t key) {
    size_t mask = m->hcap - 1, h = hash_of(key, mask);
    while (m->hstamp[h] == m->stamp) h = (h + 1) & mask;
    m->hstamp[h] = m->stamp;
    m->hkey[h] = key;
}

static int grow_items(di_earley *m, di_error *err) {
    size_t cap = m->cap_items ? m->cap_items * 2 : 1024;
    di_earley_item *p = realloc(m->items, cap * sizeof *p);
    if (!p) return di_error_set(err, DI_ERR_NOMEM, "grammar matcher: out of memory for %zu items", cap);
    m->items = p;
    m->cap_items = cap;
    return DI_OK;
}

static inline int append_item(di_earley *m, uint32_t pos, uint32_t origin, di_error *err) {
    if (m->n_items == m->cap_items) {
        int rc = grow_items(m, err);
        if (rc) return rc;
    }
    m->items[m->n_items++] = (di_earley_item){pos, origin};
    return 1;
}

static int work_limit(di_error *err) {
    return di_error_set(err, DI_ERR_LIMIT,
                        "grammar matcher: more than %u item operations for one byte (grammar too ambiguous)",
                        DI_EARLEY_MAX_WORK);
}

static int add_item_large(di_earley *m, uint32_t pos, uint32_t origin, size_t count, di_error *err);

/* The set under construction just reached SMALL_SET items: index them all in the hash table. */
static int index_small_set(di_earley *m, di_error *err) {
    size_t before = m->hcap;
    int rc = grow_hash(m, SMALL_SET * 2, err); /* re-inserts the set when it reallocates */
    if (rc) return rc;
    if (m->hcap == before)
        for (size_t x = m->set_off[m->n_sets]; x < m->n_items; x++)
            if (m->items[x].origin != m->n_sets) hash_insert(m, key_of(m->items[x].pos, m->items[x].origin));
    return 1;
}

static int set_limit(di_error *err) {
    return di_error_set(err, DI_ERR_LIMIT, "grammar matcher: Earley set exceeds %u items (grammar too ambiguous)",
                        DI_EARLEY_MAX_SET_ITEMS);
}

/* Add an item to the set under construction unless present (an origin below the set, but for
 * set 0's first item: add_new_items adds the others). Returns 1 if added, 0 if present,
 * <0 on error. The large-set path and the limit errors are out of line, so that this one stays
 * small enough to inline into close_set (~20 calls per pushed byte). */
static inline int add_item(di_earley *m, uint32_t pos, uint32_t origin, di_error *err) {
    size_t first = m->set_off[m->n_sets];
    size_t count = m->n_items - first;
    if (__builtin_expect(++m->work > DI_EARLEY_MAX_WORK, 0)) return work_limit(err);
    if (count >= SMALL_SET) return add_item_large(m, pos, origin, count, err);
    uint64_t bit = 1ull << (((uint64_t)pos * 0x9E3779B97F4A7C15ull + origin * 0xC2B2AE3D27D4EB4Full) >> 58);
    if (m->small_seen & bit)
        for (size_t x = first; x < m->n_items; x++)
            if (m->items[x].pos == pos && m->items[x].origin == origin) return 0;
    m->small_seen |= bit;
    int rc = append_item(m, pos, origin, err);
    if (rc < 0 || count + 1 < SMALL_SET) return rc;
    return index_small_set(m, err);
}

/* add_item for a set of SMALL_SET items or more: deduplicated by the hash table. */
static int add_item_large(di_earley *m, uint32_t pos, uint32_t origin, size_t count, di_error *err) {
    if (count + 1 > DI_EARLEY_MAX_SET_ITEMS) return set_limit(err);
    int rc = grow_hash(m, count + 1, err);
    if (rc) return rc;
    uint64_t key = key_of(pos, origin);
    size_t mask = m->hcap - 1, h = hash_of(key, mask);
    while (m->hstamp[h] == m->stamp) {
        if (m->hkey[h] == key) return 0;
        h = (h + 1) & mask;
    }
    rc = append_item(m, pos, origin, err);
    if (rc < 0) return rc;
    m->hstamp[h] = m->stamp;
    m->hkey[h] = key;
    return 1;
}

/* Append items that start in the set under construction (origin == its index), at positions
 * pos[0..n). Such items come only from predicting a nonterminal, whose rules enter a set once
 * (pred_stamp), and from moving the dot of one of them over a nullable symbol, which happens
 * once per item: scans, completions and Leo's chains all keep an origin below the set. So they
 * are new without a check, and add_item, which sees only older origins after set 0, never looks
 * them up (they stay out of small_seen and the hash table). Counted as n add_item calls. */
static inline int add_new_items(di_earley *m, const uint32_t *pos, uint32_t n, di_error *err) {
    if (__builtin_expect((m->work += n) > DI_EARLEY_MAX_WORK, 0)) return work_limit(err);
    size_t count = m->n_items - m->set_off[m->n_sets];
    if (count + n > DI_EARLEY_MAX_SET_ITEMS) return set_limit(err);
    while (m->n_items + n > m->cap_items) {
        int rc = grow_items(m, err);
        if (rc) return rc;
    }
    di_earley_item *it = m->items + m->n_items;
    for (uint32_t k = 0; k < n; k++) it[k] = (di_earley_item){pos[k], (uint32_t)m->n_sets};
    m->n_items += n;
    if (count < SMALL_SET && count + n >= SMALL_SET) return index_small_set(m, err); /* add_item looks up the table */
    return 1;
}

static int begin_set(di_earley *m, di_error *err) {
    if (m->n_sets + 2 > m->cap_sets) {
        size_t cap = m->cap_sets ? m->cap_sets * 2 : 256;
        uint32_t *o = realloc(m->set_off, (cap + 1) * sizeof *o);
        if (!o) return di_error_set(err, DI_ERR_NOMEM, "grammar matcher: out of memory for %zu sets", cap);
        m->set_off = o;
        di_cfg_class *s = realloc(m->scan, cap * sizeof *s);
        if (!s) return di_error_set(err, DI_ERR_NOMEM, "grammar matcher: out of memory for %zu sets", cap);
        m->scan = s;
        uint32_t *w = realloc(m->wait_off, (cap + 1) * sizeof *w);
        if (!w) return di_error_set(err, DI_ERR_NOMEM, "grammar matcher: out of memory for %zu sets", cap);
        m->wait_off = w;
        uint32_t *st = realloc(m->set_stamp, cap * sizeof *st);
        if (!st) return di_error_set(err, DI_ERR_NOMEM, "grammar matcher: out of memory for %zu sets", cap);
        m->set_stamp = st;
        m->cap_sets = cap;
    }
    m->set_off[m->n_sets] = (uint32_t)m->n_items;
    m->wait_off[m->n_sets] = (uint32_t)m->n_wait;
    m->work = 0;
    m->small_seen = 0;
    if (++m->stamp == 0) { /* stamp wrapped: clear once every 2^32 sets */
        memset(m->hstamp, 0, m->hcap * sizeof *m->hstamp);
        memset(m->leo, 0, DI_EARLEY_LEO_MEMO * sizeof *m->leo);
        memset(m->pred_stamp, 0, m->g->n_nt * sizeof *m->pred_stamp);
        m->stamp = 1;
    }
    m->set_stamp[m->n_sets] = m->stamp;
    return DI_OK;
}

#define SMALL_WAIT DI_EARLEY_SMALL_WAIT

static int cmp_wait(const void *a, const void *b) {
    const di_earley_wait *x = a, *y = b;
    if (x->sym != y->sym) return x->sym < y->sym ? -1 : 1;
    if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1; /* a total order: qsort is not stable */
    return x->origin < y->origin ? -1 : x->origin > y->origin;
}

static inline bool wait_less(const di_earley_wait *x, const di_earley_wait *y) {
    if (x->sym != y->sym) return x->sym < y->sym;
    if (x->pos != y->pos) return x->pos < y->pos;
    return x->origin < y->origin;
}

/* Insertion sort for the usual lists of a few dozen entries (glibc's qsort, a merge sort through
 * a comparison callback, was a third of the instructions of some cold masks); qsort beyond. */
static void sort_wait(di_earley_wait *w, size_t n) {
    if (n > 256) {
        qsort(w, n, sizeof *w, cmp_wait);
        return;
    }
    for (size_t i = 1; i < n; i++) {
        di_earley_wait x = w[i];
        size_t j = i;
        for (; j > 0 && wait_less(&x, &w[j - 1]); j--) w[j] = w[j - 1];
        w[j] = x;
    }
}

/* Index an item of the set under construction that waits on nonterminal s (see di_earley.wait):
 * close_set appends each as it visits it, so the set's items are not read a second time. */
static inline int wait_append(di_earley *m, int32_t s, di_earley_item it, di_error *err) {
    if (__builtin_expect(m->n_wait == m->cap_wait, 0)) {
        size_t cap = m->cap_wait ? m->cap_wait * 2 : 1024;
        di_earley_wait *w = realloc(m->wait, cap * sizeof *w);
        if (!w) return di_error_set(err, DI_ERR_NOMEM, "grammar matcher: out of memory for %zu items", cap);
        m->wait = w;
        m->cap_wait = cap;
    }
    m->wait[m->n_wait++] = (di_earley_wait){s, it.pos, it.origin};
    return 0;
}

#define LEO_MAX_CHAIN 64 /* longer chains are cut (still exact: the cut link completes normally) */

/* Last finished item of the deterministic chain started by completing sym at sealed set j
 * (see di_earley.leo); false if j has no such chain for sym. */
static bool leo_top(di_earley *m, uint32_t j, int32_t sym, di_earley_item *top, int depth) {
    struct di_earley_leo *c = &m->leo[(j * 0x9E3779B1u ^ (uint32_t)sym * 0x85EBCA77u) & (DI_EARLEY_LEO_MEMO - 1)];
    if (c->set == j && c->sym == sym && c->stamp == m->set_stamp[j]) {
        *top = c->top;
        return top->pos != 0;
    }
    const di_earley_wait *w = di_earley_sole_wait(m, j, sym);
    di_earley_item t = {0, 0};
    if (w && m->g->psym[w->pos + 1] == DI_CFG_END) {
        if (depth >= LEO_MAX_CHAIN || !leo_top(m, w->origin, m->g->plhs[w->pos], &t, depth + 1))
            t = (di_earley_item){w->pos + 1, w->origin};
    }
    c = &m->leo[(j * 0x9E3779B1u ^ (uint32_t)sym * 0x85EBCA77u) & (DI_EARLEY_LEO_MEMO - 1)];
    *c = (struct di_earley_leo){.set = j, .stamp = m->set_stamp[j], .sym = sym, .top = t};
    *top = t;
    return t.pos != 0;
}

/* Predict/complete closure of the set under construction (index n_sets), then seal it. */
static int close_set(di_earley *m, di_error *err) {
    const di_cfg *g = m->g;
    uint32_t cur = (uint32_t)m->n_sets;
    di_cfg_class scan = {{0}};
    for (size_t k = m->set_off[cur]; k < m->n_items; k++) {
        di_earley_item it = m->items[k];
        int32_t s = g->psym[it.pos];
        int rc = 0;
        if (s == DI_CFG_END) {
            int32_t lhs = g->plhs[it.pos];
            /* set j == cur only for empty derivations; the nullable shortcut in prediction
             * already advanced everything that waits on a nullable symbol (Aycock-Horspool). */
            if (it.origin < m->opaque_below) m->opaque_hits++;
            if (it.origin == cur) continue;
            di_earley_item top;
            if (leo_top(m, it.origin, lhs, &top, 0)) { /* the chain's intermediate items only complete */
                rc = add_item(m, top.pos, top.origin, err);
                if (rc < 0) return rc;
                continue;
            }
            const di_earley_wait *w = m->wait + m->wait_off[it.origin];
            size_t nw = m->wait_off[it.origin + 1] - m->wait_off[it.origin];
            if (nw <= SMALL_WAIT) {
                for (size_t x = 0; x < nw && rc >= 0; x++)
                    if (w[x].sym == lhs) rc = add_item(m, w[x].pos + 1, w[x].origin, err);
            } else {
                size_t lo = 0, hi = nw;
                while (lo < hi) { /* first waiting item with symbol >= lhs */
                    size_t mid = (lo + hi) / 2;
                    if (w[mid].sym < lhs) lo = mid + 1;
                    else hi = mid;
                }
                for (size_t x = lo; x < nw && w[x].sym == lhs && rc >= 0; x++)
                    rc = add_item(m, w[x].pos + 1, w[x].origin, err);
            }
        } else if (s >= 0) {
            if ((rc = wait_append(m, s, it, err))) return rc;
            uint32_t r = g->nt_rule_off[s], re = g->nt_rule_off[s + 1];
            if (m->pred_stamp[s] != m->stamp) {
                m->pred_stamp[s] = m->stamp;
                rc = add_new_items(m, g->nt_rules + r, re - r, err);
            } else if ((m->work += re - r) > DI_EARLEY_MAX_WORK) { /* as many as the duplicates it skips */
                return work_limit(err);
            }
            if (rc >= 0 && g->nullable[s]) {
                uint32_t next = it.pos + 1;
                rc = it.origin == cur ? add_new_items(m, &next, 1, err) : add_item(m, next, it.origin, err);
            }
        } else {
            const di_cfg_class *c = &g->cls[-1 - s];
            for (int w = 0; w < 8; w++) scan.bits[w] |= c->bits[w];
        }
        if (rc < 0) return rc;
    }
    m->scan[cur] = scan;
    size_t nw = m->n_wait - m->wait_off[cur];
    if (nw > SMALL_WAIT) sort_wait(m->wait + m->wait_off[cur], nw); /* small lists are scanned linearly */
    m->n_sets++;
    m->set_off[m->n_sets] = (uint32_t)m->n_items;
    m->wait_off[m->n_sets] = (uint32_t)m->n_wait;
    return DI_OK;
}

int di_earley_init(di_earley *m, const di_cfg *g, di_error *err) {
    memset(m, 0, sizeof *m);
    m->g = g;
    if (!g->final) return di_error_set(err, DI_ERR_INTERNAL, "grammar matcher: grammar not finalized");
    m->leo = calloc(DI_EARLEY_LEO_MEMO, sizeof *m->leo);
    m->pred_stamp = calloc(g->n_nt ? g->n_nt : 1, sizeof *m->pred_stamp);
    if (!m->leo || !m->pred_stamp) {
        di_earley_free(m);
        return di_error_set(err, DI_ERR_NOMEM, "grammar matcher: out of memory");
    }
    int rc = begin_set(m, err);
    if (!rc) {
        m->pred_stamp[g->start] = m->stamp; /* start' has the one rule whose item this is */
        int a = add_item(m, g->init_pos, 0, err);
        if (a < 0) rc = a;
    }
    if (!rc) rc = close_set(m, err);
    if (rc) di_earley_free(m);
    return rc;
}

void di_earley_free(di_earley *m) {
    free(m->items);
    free(m->set_off);
    free(m->scan);
    free(m->wait);
    free(m->wait_off);
    free(m->set_stamp);
    free(m->leo);
    free(m->pred_stamp);
    free(m->hkey);
    free(m->hstamp);
    memset(m, 0, sizeof *m);
}

int di_earley_push(di_earley *m, uint8_t b, di_error *err) {
    uint32_t prev = (uint32_t)m->n_sets - 1;
    if (!di_cfg_class_has(&m->scan[prev], b)) return 0;
    m->n_pushes++;
    int rc = begin_set(m, err);
    if (rc) return rc;
    const di_cfg *g = m->g;
    size_t a = m->set_off[prev], e = m->set_off[prev + 1];
    for (size_t x = a; x < e; x++) {
        int32_t s = g->psym[m->items[x].pos];
        if (s < 0 && s != DI_CFG_END && di_cfg_class_has(&g->cls[-1 - s], b)) {
            rc = add_item(m, m->items[x].pos + 1, m->items[x].origin, err);
            if (rc < 0) {
                m->n_items = m->set_off[m->n_sets];
                return rc;
            }
        }
    }
    rc = close_set(m, err);
    if (rc < 0) {
        m->n_items = m->set_off[m->n_sets];
        m->n_wait = m->wait_off[m->n_sets];
        return rc;
    }
    return 1;
}

int di_earley_push_bytes(di_earley *m, const uint8_t *b, size_t n, di_error *err) {
    size_t depth = m->n_sets;
    for (size_t i = 0; i < n; i++) {
        int rc = di_earley_push(m, b[i], err);
        if (rc <= 0) {
            di_earley_pop_to(m, depth);
            return rc;
        }
    }
    return 1;
}

const di_earley_wait *di_earley_sole_wait(const di_earley *m, size_t set, int32_t sym) {
    const di_earley_wait *w = m->wait + m->wait_off[set];
    size_t nw = m->wait_off[set + 1] - m->wait_off[set], lo = 0;
    if (nw > SMALL_WAIT) { /* sorted by symbol (close_set) */
        size_t hi = nw;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (w[mid].sym < sym) lo = mid + 1;
            else hi = mid;
        }
        if (lo == nw || w[lo].sym != sym || (lo + 1 < nw && w[lo + 1].sym == sym)) return NULL;
        return &w[lo];
    }
    const di_earley_wait *one = NULL;
    for (; lo < nw; lo++)
        if (w[lo].sym == sym) {
            if (one) return NULL;
            one = &w[lo];
        }
    return one;
}

bool di_earley_accepting(const di_earley *m) {
    size_t last = m->n_sets - 1;
    for (size_t x = m->set_off[last]; x < m->set_off[last + 1]; x++)
        if (m->items[x].pos == m->g->accept_pos && m->items[x].origin == 0) return true;
    return false;
}
