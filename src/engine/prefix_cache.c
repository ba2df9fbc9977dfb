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
    int64_t refs;                        /* pinned by this many hits: never evicted while > 0 */
    uint64_t last_use;                   /* LRU tick of the newest match / insert through it */
};

struct di_prefix_cache {
    int block;
    int64_t budget, keep;
    di_prefix_node root; /* the empty prefix: no tokens, no span */
    di_prefix_node *all; /* head of the node list */
    uint64_t tick;
    di_prefix_stats st;
};

int di_prefix_cache_create(const di_prefix_cache_opts *opts, di_prefix_cache **out, di_error *err) {
    *out = NULL;
    int block = opts && opts->block_tokens ? opts->block_tokens : DI_PREFIX_BLOCK_DEFAULT;
    if (!opts || block < 1 || opts->budget_bytes < 0 || opts->keep < 0)
        return di_error_set(err, DI_ERR_INVALID, "prefix cache: block %d tokens, budget %lld bytes, keep %lld (expected "
                            "block > 0, budget >= 0, keep >= 0)", block, (long long)(opts ? opts->budget_bytes : 0),
                            (long long)(opts ? opts->keep : 0));
    di_prefix_cache *pc = calloc(1, sizeof *pc);
    if (!pc) return di_error_set(err, DI_ERR_NOMEM, "prefix cache");
    pc->block = block, pc->budget = opts->budget_bytes, pc->keep = opts->keep;
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

int di_prefix_cache_block(const di_prefix_cache *pc) { return pc->block; }

int64_t di_prefix_cache_keep(const di_prefix_cache *pc, const di_session *s) {
    return pc->keep > 0 ? pc->keep : di_session_replay_keep(s);
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
    if (n < 0 || keep < 0)
        return di_error_set(err, DI_ERR_INVALID, "prefix cache match: %lld tokens, keep %lld", (long long)n,
                            (long long)keep);
    pc->st.lookups++;
    /* at least one token stays to run: the request needs the logits of its last prompt position */
    int64_t max_blocks = n > 0 ? (n - 1) / pc->block : 0;
    int depth = 0;
    for (di_prefix_node *cur = &pc->root; depth < max_blocks; depth++) {
        cur = child_of(cur, ids + (int64_t)depth * pc->block, pc->block);
        if (!cur) break;
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

void di_prefix_cache_release(di_prefix_cache *pc, di_prefix_hit *hit) {
    (void)pc;
    for (int d = 0; d < hit->n_blocks; d++) hit->nodes[d]->refs--;
    free(hit->nodes);
    memset(hit, 0, sizeof *hit);
}

int di_prefix_cache_restore(const di_prefix_cache *pc, const di_prefix_hit *hit, di_session *s, const int32_t *ids,
                            int64_t keep, float *logits, di_error *err) {
    if (hit->n_blocks < 1) return di_error_set(err, DI_ERR_INVALID, "prefix cache restore: empty hit");
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
        rc = di_session_prefix_restore(s, ids, keep, spans, ends, hit->n_blocks, logits, NULL, err);
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

/* Evict least recently used unpinned leaves until `need` more bytes fit; `keep_path` (the branch
 * being extended) is never chosen. 0 when it fits. O(nodes) per victim: a first version. */
static int make_room(di_prefix_cache *pc, int64_t need, const di_prefix_node *keep_path) {
    while (pc->st.bytes + need > pc->budget) {
        di_prefix_node *victim = NULL;
        for (di_prefix_node *n = pc->all; n; n = n->all_next)
            if (!n->first_child && n->refs == 0 && n != keep_path && (!victim || n->last_use < victim->last_use))
                victim = n;
        if (!victim) return -1;
        unlink_node(pc, victim);
        node_free(victim);
        pc->st.evictions++;
    }
    return 0;
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
        if (!next) {
            int64_t t0 = d * pc->block, t1 = t0 + pc->block, bytes = di_cache_prefix_span_bytes(c, t0, t1);
            if (make_room(pc, bytes, cur)) {
                pc->st.rejected += n / pc->block - d;
                return DI_OK; /* everything that could go is pinned or on this path: store what fits */
            }
            next = calloc(1, sizeof *next);
            if (next) next->tokens = malloc(sizeof(int32_t) * (size_t)pc->block);
            if (next) next->span = malloc(bytes > 0 ? (size_t)bytes : 1);
            if (!next || !next->tokens || !next->span) {
                if (next) node_free(next);
                return di_error_set(err, DI_ERR_NOMEM, "prefix cache insert: block of %lld bytes", (long long)bytes);
            }
            int rc = di_cache_prefix_export(c, t0, t1, next->span, bytes, err);
            if (rc) {
                node_free(next);
                return rc;
            }
            memcpy(next->tokens, blk, sizeof(int32_t) * (size_t)pc->block);
            next->span_bytes = bytes;
            next->parent = cur;
            next->next_sibling = cur->first_child;
            cur->first_child = next;
            next->all_next = pc->all;
            if (pc->all) pc->all->all_prev = next;
            pc->all = next;
            pc->st.nodes++;
            pc->st.bytes += bytes;
            if (added) (*added)++;
        }
        next->last_use = pc->tick;
        cur = next;
    }
    return DI_OK;
}
