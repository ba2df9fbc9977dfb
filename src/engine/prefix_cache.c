/* Radix tree of token blocks with LRU eviction under a byte budget. See prefix_cache.h. */
#include "engine/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

struct di_prefix_node {
    di_prefix_node *parent, *first_child, *next_sibling;
    di_prefix_node *all_prev, *all_next; /* every non-root node, for the LRU scan */
    int32_t *tokens;                     /* int32 [block]: the edge label */
    uint8_t *span;                       /* [span_bytes]: di_cache_prefix_export of the block */
    int64_t span_bytes;
    int64_t refs;                        /* pinned by this many hits / claims: never evicted while > 0 */
    uint64_t last_use;                   /* LRU tick of the newest match / insert through it */
    bool ready;                          /* span written (worker side for claimed nodes) */
    bool dead;                           /* host: its fill failed; matches and claims stop here */
};

struct di_prefix_cache {
    int block, align;
    int64_t budget, keep, block_bytes;
    di_prefix_node root; /* the empty prefix: no tokens, no span */
    di_prefix_node *all; /* head of the node list */
    uint64_t tick;
    di_prefix_stats st;
};

int di_prefix_cache_create(const di_prefix_cache_opts *opts, di_prefix_cache **out, di_error *err) {
    *out = NULL;
    int block = opts && opts->block_tokens ? opts->block_tokens : DI_PREFIX_BLOCK_DEFAULT;
    if (!opts || block < 1 || opts->budget_bytes < 0 || opts->keep < 0 || opts->align < 0 || opts->block_bytes < 0 ||
        (opts->align && block % opts->align))
        return di_error_set(err, DI_ERR_INVALID, "prefix cache: block %d tokens, budget %lld bytes, keep %lld, align %d, "
                            "block bytes %lld (expected block > 0 and a multiple of align, the rest >= 0)", block,
                            (long long)(opts ? opts->budget_bytes : 0), (long long)(opts ? opts->keep : 0),
                            opts ? opts->align : 0, (long long)(opts ? opts->block_bytes : 0));
    di_prefix_cache *pc = calloc(1, sizeof *pc);
    if (!pc) return di_error_set(err, DI_ERR_NOMEM, "prefix cache");
    pc->block = block, pc->budget = opts->budget_bytes, pc->keep = opts->keep;
    pc->align = opts->align ? opts->align : 1, pc->block_bytes = opts->block_bytes;
    *out = pc;
    return DI_OK;
}

static void node_free(di_prefix_node *n) {
    free(n->tokens);
    free(n->span);
    free(n);
}

void di_prefix_cache_destroy(di_prefix_cache *pc) {
    if (!pc) return;
    for (di_prefix_node *n = pc->all, *next; n; n = next) {
        next = n->all_next;
        node_free(n);
    }
    free(pc);
}

int64_t di_prefix_default_keep(const di_config *cfg) {
    return (int64_t)cfg->sliding_window + di_cache_default_margin(cfg);
}

int64_t di_prefix_replay_start(int64_t boundary, int64_t keep, int align) {
    return boundary - keep > 0 ? (boundary - keep) / align * align : 0;
}

int di_prefix_cache_block(const di_prefix_cache *pc) { return pc->block; }
int di_prefix_cache_align(const di_prefix_cache *pc) { return pc->align; }

int64_t di_prefix_cache_keep(const di_prefix_cache *pc, const di_session *s) {
    return pc->keep > 0 || !s ? pc->keep : di_session_replay_keep(s);
}

void di_prefix_cache_stats(const di_prefix_cache *pc, di_prefix_stats *out) { *out = pc->st; }

static di_prefix_node *child_of(const di_prefix_node *n, const int32_t *block, int len) {
    for (di_prefix_node *c = n->first_child; c; c = c->next_sibling)
        if (!memcmp(c->tokens, block, sizeof(int32_t) * (size_t)len)) return c;
    return NULL;
}

int di_prefix_cache_match(di_prefix_cache *pc, const int32_t *ids, int64_t n, int64_t keep, di_prefix_hit *hit,
                          di_error *err) {
    memset(hit, 0, sizeof *hit);
    hit->prompt_len = n;
    if (n < 0 || keep < 0)
        return di_error_set(err, DI_ERR_INVALID, "prefix cache match: %lld tokens, keep %lld", (long long)n,
                            (long long)keep);
    pc->st.lookups++;
    /* at least one token stays to run: the request needs the logits of its last prompt position */
    int64_t max_blocks = n > 0 ? (n - 1) / pc->block : 0;
    int depth = 0;
    for (di_prefix_node *cur = &pc->root; depth < max_blocks; depth++) {
        cur = child_of(cur, ids + (int64_t)depth * pc->block, pc->block);
        if (!cur || cur->dead) break;
    }
    hit->matched = (int64_t)depth * pc->block;
    if (hit->matched <= keep) return DI_OK; /* the replay would redo all of it: decline */
    hit->nodes = malloc(sizeof(di_prefix_node *) * (size_t)depth);
    if (!hit->nodes) return di_error_set(err, DI_ERR_NOMEM, "prefix cache match: %d blocks", depth);
    pc->tick++;
    di_prefix_node *cur = &pc->root;
    for (int d = 0; d < depth; d++) {
        cur = child_of(cur, ids + (int64_t)d * pc->block, pc->block);
        cur->refs++;
        cur->last_use = pc->tick;
        hit->nodes[d] = cur;
    }
    hit->n_blocks = depth;
    hit->tokens = (int64_t)depth * pc->block;
    pc->st.hits++;
    pc->st.hit_tokens += hit->tokens;
    return DI_OK;
}

bool di_prefix_hit_ready(const di_prefix_hit *hit) {
    for (int d = 0; d < hit->n_blocks; d++)
        if (!hit->nodes[d]->ready) return false;
    return true;
}

void di_prefix_cache_release(di_prefix_cache *pc, di_prefix_hit *hit) {
    (void)pc;
    for (int d = 0; d < hit->n_blocks; d++) hit->nodes[d]->refs--;
    free(hit->nodes);
    memset(hit, 0, sizeof *hit);
}

int di_prefix_cache_restore(const di_prefix_cache *pc, const di_prefix_hit *hit, di_session *s, const int32_t *ids,
                            int64_t keep, float *logits, di_error *err) {
    if (hit->n_blocks < 1) return di_error_set(err, DI_ERR_INVALID, "prefix cache restore: empty hit");
    if (!di_prefix_hit_ready(hit))
        return di_error_set(err, DI_ERR_INVALID, "prefix cache restore: a block of the %lld-token hit was never filled",
                            (long long)hit->tokens);
    if (keep <= 0) keep = di_prefix_cache_keep(pc, s);
    const uint8_t **spans = malloc(sizeof(uint8_t *) * (size_t)hit->n_blocks); /* [n_blocks] */
    int64_t *ends = malloc(sizeof(int64_t) * (size_t)hit->n_blocks);          /* [n_blocks] token ends */
    int rc;
    if (!spans || !ends) {
        rc = di_error_set(err, DI_ERR_NOMEM, "prefix cache restore: %d blocks", hit->n_blocks);
    } else {
        for (int d = 0; d < hit->n_blocks; d++) {
            spans[d] = hit->nodes[d]->span;
            ends[d] = (int64_t)(d + 1) * pc->block;
        }
        /* the replayed rows are prompt rows of this request: its prompt's selection width (forward.h) */
        di_fwd_opts fo = {.prompt_end = hit->prompt_len};
        rc = di_session_prefix_restore(s, ids, keep, spans, ends, hit->n_blocks, logits, &fo, err);
    }
    free(spans);
    free(ends);
    return rc;
}

static void unlink_node(di_prefix_cache *pc, di_prefix_node *n) {
    di_prefix_node **pp = &n->parent->first_child;
    while (*pp != n) pp = &(*pp)->next_sibling;
    *pp = n->next_sibling;
    if (n->all_prev) n->all_prev->all_next = n->all_next;
    else pc->all = n->all_next;
    if (n->all_next) n->all_next->all_prev = n->all_prev;
    pc->st.nodes--;
    pc->st.bytes -= n->span_bytes;
}

/* Evict least recently used unpinned leaves (dead ones first) until `need` more bytes fit;
 * `keep_path` (the branch being extended) is never chosen. 0 when it fits. O(nodes) per victim: a
 * first version. */
static int make_room(di_prefix_cache *pc, int64_t need, const di_prefix_node *keep_path) {
    while (pc->st.bytes + need > pc->budget) {
        di_prefix_node *victim = NULL;
        for (di_prefix_node *n = pc->all; n; n = n->all_next) {
            if (n->first_child || n->refs > 0 || n == keep_path) continue;
            if (!victim || (n->dead ? 0 : n->last_use) < (victim->dead ? 0 : victim->last_use)) victim = n;
        }
        if (!victim) return -1;
        unlink_node(pc, victim);
        node_free(victim);
        pc->st.evictions++;
    }
    return 0;
}

/* A new child of parent labelled blk, with room for `bytes` of span (not written yet). NULL: out of
 * memory, or no room (then *full = 1). */
static di_prefix_node *new_child(di_prefix_cache *pc, di_prefix_node *parent, const int32_t *blk, int64_t bytes,
                                 int *full) {
    *full = 0;
    if (make_room(pc, bytes, parent)) {
        *full = 1;
        return NULL;
    }
    di_prefix_node *n = calloc(1, sizeof *n);
    if (n) n->tokens = malloc(sizeof(int32_t) * (size_t)pc->block);
    if (n) n->span = malloc(bytes > 0 ? (size_t)bytes : 1);
    if (!n || !n->tokens || !n->span) {
        if (n) node_free(n);
        return NULL;
    }
    memcpy(n->tokens, blk, sizeof(int32_t) * (size_t)pc->block);
    n->span_bytes = bytes;
    n->parent = parent;
    n->next_sibling = parent->first_child;
    parent->first_child = n;
    n->all_next = pc->all;
    if (pc->all) pc->all->all_prev = n;
    pc->all = n;
    n->last_use = pc->tick;
    pc->st.nodes++;
    pc->st.bytes += bytes;
    return n;
}

int di_prefix_cache_insert(di_prefix_cache *pc, const int32_t *ids, int64_t n, const di_cache *c, int64_t *added,
                           di_error *err) {
    if (added) *added = 0;
    if (n < 0 || n > di_cache_len(c))
        return di_error_set(err, DI_ERR_INVALID, "prefix cache insert: %lld tokens, the cache holds %lld", (long long)n,
                            (long long)di_cache_len(c));
    if (pc->block % di_cache_prefix_align(c))
        return di_error_set(err, DI_ERR_INVALID,
                            "prefix cache insert: block of %d tokens is not a multiple of the compress ratios' lcm %d",
                            pc->block, di_cache_prefix_align(c));
    pc->tick++;
    di_prefix_node *cur = &pc->root;
    for (int64_t d = 0; d < n / pc->block; d++) {
        const int32_t *blk = ids + d * pc->block;
        di_prefix_node *next = child_of(cur, blk, pc->block);
        if (next && next->dead) return DI_OK; /* nothing below a failed block is reachable */
        if (!next) {
            int64_t t0 = d * pc->block, t1 = t0 + pc->block, bytes = di_cache_prefix_span_bytes(c, t0, t1);
            int full;
            if (!(next = new_child(pc, cur, blk, bytes, &full))) {
                if (!full) return di_error_set(err, DI_ERR_NOMEM, "prefix cache insert: block of %lld bytes", (long long)bytes);
                pc->st.rejected += n / pc->block - d;
                return DI_OK; /* everything that could go is pinned or on this path: store what fits */
            }
            int rc = di_cache_prefix_export(c, t0, t1, next->span, bytes, err);
            if (rc) {
                unlink_node(pc, next);
                node_free(next);
                return rc;
            }
            next->ready = true;
            if (added) (*added)++;
        }
        next->last_use = pc->tick;
        cur = next;
    }
    return DI_OK;
}

int di_prefix_cache_claim(di_prefix_cache *pc, di_prefix_node *parent, const int32_t *block_ids, di_prefix_node **out,
                          int *created, di_error *err) {
    *out = NULL;
    *created = 0;
    if (!parent) parent = &pc->root;
    if (parent->dead) return DI_OK;
    if (pc->block_bytes <= 0)
        return di_error_set(err, DI_ERR_INVALID, "prefix cache claim: the cache was created without block_bytes");
    pc->tick++;
    di_prefix_node *n = child_of(parent, block_ids, pc->block);
    if (!n) {
        int full;
        if (!(n = new_child(pc, parent, block_ids, pc->block_bytes, &full))) {
            if (full) {
                pc->st.rejected++;
                return DI_OK;
            }
            return di_error_set(err, DI_ERR_NOMEM, "prefix cache claim: block of %lld bytes", (long long)pc->block_bytes);
        }
        *created = 1;
        pc->st.claimed++;
    } else if (n->dead && n->refs == 0) {
        /* A failed fill is not permanent: once nobody holds the dead node, the next request that
         * computes this block claims it afresh (otherwise the prefix would stay uncacheable until
         * memory pressure happened to evict it). */
        n->dead = false;
        n->ready = false;
        *created = 1;
        pc->st.claimed++;
    }
    if (n->dead) return DI_OK;
    n->last_use = pc->tick;
    n->refs++;
    *out = n;
    return DI_OK;
}

void di_prefix_cache_pin(di_prefix_node *n) { n->refs++; }
void di_prefix_cache_unpin(di_prefix_node *n) { n->refs--; }

int di_prefix_cache_fill(const di_prefix_cache *pc, di_prefix_node *n, const di_cache *c, int64_t t0, di_error *err) {
    int64_t bytes = di_cache_prefix_span_bytes(c, t0, t0 + pc->block);
    if (bytes != n->span_bytes)
        return di_error_set(err, DI_ERR_INVALID, "prefix cache fill: block [%lld, %lld) has %lld bytes, the node %lld",
                            (long long)t0, (long long)(t0 + pc->block), (long long)bytes, (long long)n->span_bytes);
    int rc = di_cache_prefix_export(c, t0, t0 + pc->block, n->span, bytes, err);
    if (!rc) n->ready = true;
    return rc;
}

void di_prefix_cache_settle(di_prefix_cache *pc, di_prefix_node *n) {
    n->refs--;
    if (!n->ready && !n->dead) {
        n->dead = true;
        pc->st.dead++;
    }
}
