/* Prefix cache with SWA bounded replay (issue 8; deepinfer-features §11).
 *
 * A radix tree over token blocks: the root is the empty prefix, a node at depth d stands for the
 * prefix of d · block tokens and is reached through one child edge per block (the edge label is the
 * block's token ids). A node stores only what is exact to reuse for its block — the compressed KV
 * entries and index keys of every kv source for tokens [(d−1)·block, d·block) (a
 * di_cache_prefix_export span). The rest of the state at the boundary needs no storage: the
 * compressor carry state at a block boundary is the reset state (block is a multiple of every
 * compress ratio), the Engram history is a function of the token ids, and the sliding windows are
 * rebuilt by replaying the last `keep` tokens (di_session_prefix_restore). So a hit costs
 * Σ_sources (cmp + index key)/R bytes per cached token (890 B at the released config) plus a replay
 * of keep tokens, instead of storing W window rows of every layer at every boundary.
 *
 *   match(ids, n)      longest chain of whole blocks that is a prefix of ids and leaves at least one
 *                      token to run (the last token's logits are needed): pins the path (refcounts)
 *   restore(hit, s)    resumes a session at the hit boundary (bounded replay); the caller continues
 *                      with di_session_forward on ids[hit.tokens …)
 *   release(hit)       unpins
 *   insert(ids, n, c)  stores the blocks of ids[0..n) that are not cached yet, from a cache that
 *                      appended them (only the new blocks' entries are copied)
 *
 * Memory: every node's bytes count against budget_bytes; an insert that would exceed it evicts the
 * least recently used unpinned leaves first (an inner node is a prefix of its children and goes only
 * once they are gone) and stops storing when nothing more can go. Hits shorter than or equal to keep
 * are declined (hit length 0): the replay would recompute all of them, and declining keeps such runs
 * bit-identical to no cache.
 *
 * Thread safety: none; the engine's runner thread owns it. */
#ifndef DI_ENGINE_PREFIX_CACHE_H
#define DI_ENGINE_PREFIX_CACHE_H

#include <stdint.h>

#include "deepinfer.h"
#include "model/session.h"

#define DI_PREFIX_BLOCK_DEFAULT 64

typedef struct di_prefix_cache_opts {
    int block_tokens;     /* tokens per block (> 0; a multiple of every compress ratio); 0 = 64 */
    int64_t budget_bytes; /* most bytes of stored spans (≥ 0) */
    int64_t keep;         /* replay length; 0 = the session's di_session_replay_keep (W + margin) */
} di_prefix_cache_opts;

typedef struct di_prefix_node di_prefix_node;

typedef struct di_prefix_stats {
    int64_t nodes;          /* cached blocks */
    int64_t bytes;          /* their spans */
    int64_t lookups, hits;  /* match calls, and those that returned a hit */
    int64_t hit_tokens;     /* Σ hit lengths */
    int64_t evictions;      /* blocks evicted */
    int64_t rejected;       /* blocks not stored: budget full of pinned blocks */
} di_prefix_stats;

typedef struct di_prefix_cache di_prefix_cache;

/* A pinned hit: nodes[0..n_blocks) root-side first; tokens = n_blocks · block (0 = miss). */
typedef struct di_prefix_hit {
    int64_t tokens;
    int64_t matched;        /* whole-block tokens that matched, also when the hit was declined (≤ keep) */
    int n_blocks;
    di_prefix_node **nodes; /* [n_blocks], owned by the hit */
} di_prefix_hit;

int di_prefix_cache_create(const di_prefix_cache_opts *opts, di_prefix_cache **out, di_error *err);
void di_prefix_cache_destroy(di_prefix_cache *pc); /* NULL is fine; pinned hits must be released */

/* Longest usable hit for ids[0..n) given a replay of `keep` tokens: a hit ≤ keep is declined. */
int di_prefix_cache_match(di_prefix_cache *pc, const int32_t *ids, int64_t n, int64_t keep, di_prefix_hit *hit,
                          di_error *err);
/* Resume s at hit->tokens (bounded replay of keep tokens; keep ≤ 0 = the session's default); logits
 * f32 [1, V] of position hit->tokens − 1 (may be NULL). */
int di_prefix_cache_restore(const di_prefix_cache *pc, const di_prefix_hit *hit, di_session *s, const int32_t *ids,
                            int64_t keep, float *logits, di_error *err);
void di_prefix_cache_release(di_prefix_cache *pc, di_prefix_hit *hit);
/* Store the whole blocks of ids[0..n) (n ≤ di_cache_len(c)); *added (may be NULL) = blocks added. */
int di_prefix_cache_insert(di_prefix_cache *pc, const int32_t *ids, int64_t n, const di_cache *c, int64_t *added,
                           di_error *err);
void di_prefix_cache_stats(const di_prefix_cache *pc, di_prefix_stats *out);
int di_prefix_cache_block(const di_prefix_cache *pc);
int64_t di_prefix_cache_keep(const di_prefix_cache *pc, const di_session *s); /* effective replay length */

#endif
