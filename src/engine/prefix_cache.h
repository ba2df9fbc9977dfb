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
 * keep = W + m (di_prefix_default_keep): the window plus the cache's rollback margin, so a resumed
 * sequence keeps its full rollback depth; 128 + 12 = 140 at the released config (cache.h
 * di_cache_default_margin). A replay starts at r = B − keep rounded down to the compress ratios'
 * lcm (di_prefix_replay_start), so it re-runs B − r ∈ [keep, keep + align) positions — exactly 140
 * at the released config (ratios 1 and 2: align 2) for any even B, so for every hit of 64-token blocks.
 *
 * Two ways in:
 *   direct (tests, tools)   match → restore → release on a session, insert(ids, n, cache) from a
 *                           cache that holds the tokens (only the new blocks' entries are copied);
 *   engine (scheduler.h)    the tree is the HOST's: the scheduler matches at admission (so the step
 *                           budget sees the request's reduced prefill), and claims a node for each
 *                           block as soon as a request's computed prefix passes its end. A claimed
 *                           node is "pending": its bytes are counted, its span is written by the
 *                           runner on the worker (di_prefix_cache_fill) at the start of the next
 *                           step, before any piece of that step can restore from it — steps run in
 *                           order, so a node is always filled before it is read. The worker touches
 *                           only nodes that the step in flight pins (fills and restores); the host
 *                           unpins them when it processes the step's result (settle), and only
 *                           then may it evict them. A fill that failed leaves the node unready:
 *                           settle marks it dead (matches stop there), and a restore through an
 *                           unready node is refused (the runner then computes the prefix itself).
 *
 * Memory: every node's bytes count against budget_bytes; an insert / claim that would exceed it
 * evicts the least recently used unpinned leaves first (an inner node is a prefix of its children
 * and goes only once they are gone) and stops storing when nothing more can go. Hits shorter than or
 * equal to keep are declined (hit length 0): the replay would recompute all of them, and declining
 * keeps such runs bit-identical to no cache.
 *
 * Thread safety: none; one thread mutates the tree (the engine's host thread, or the caller of the
 * direct API). */
#ifndef DI_ENGINE_PREFIX_CACHE_H
#define DI_ENGINE_PREFIX_CACHE_H

#include <stdint.h>

#include "deepinfer.h"
#include "model/config.h"
#include "model/session.h"

#define DI_PREFIX_BLOCK_DEFAULT 64

typedef struct di_prefix_cache_opts {
    int block_tokens;     /* tokens per block (> 0; a multiple of every compress ratio); 0 = 64 */
    int64_t budget_bytes; /* most bytes of stored spans (≥ 0) */
    int64_t keep;         /* replay length; 0 = the session's di_session_replay_keep (W + margin) */
    /* engine use (di_prefix_cache_claim, di_prefix_replay_start without a session); 0 = unknown */
    int align;            /* the cache's di_cache_prefix_align */
    int64_t block_bytes;  /* di_cache_prefix_span_bytes of one block (the same for every block) */
} di_prefix_cache_opts;

typedef struct di_prefix_node di_prefix_node;

typedef struct di_prefix_stats {
    int64_t nodes;          /* cached blocks (pending ones included) */
    int64_t bytes;          /* their spans */
    int64_t lookups, hits;  /* match calls, and those that returned a hit */
    int64_t hit_tokens;     /* Σ hit lengths */
    int64_t evictions;      /* blocks evicted */
    int64_t rejected;       /* blocks not stored: budget full of pinned blocks */
    int64_t claimed;        /* blocks claimed by the engine while their request ran */
    int64_t dead;           /* claimed blocks whose fill failed */
} di_prefix_stats;

typedef struct di_prefix_cache di_prefix_cache;

/* A pinned hit: nodes[0..n_blocks) root-side first; tokens = n_blocks · block (0 = miss). */
typedef struct di_prefix_hit {
    int64_t tokens;
    int64_t matched;        /* whole-block tokens that matched, also when the hit was declined (≤ keep) */
    int n_blocks;
    di_prefix_node **nodes; /* [n_blocks], owned by the hit */
    int64_t prompt_len;     /* n of the di_prefix_cache_match that made it: the replay's prompt_end */
} di_prefix_hit;

/* The replay length the engine uses for a config: W + di_cache_default_margin(cfg) — what
 * di_session_replay_keep gives for a session created with the default margin (140 at the released
 * config). */
int64_t di_prefix_default_keep(const di_config *cfg);
/* First replayed position of a resume at boundary B: B − keep rounded down to align (≥ 0). The same
 * rule as di_session_prefix_restore. */
int64_t di_prefix_replay_start(int64_t boundary, int64_t keep, int align);

int di_prefix_cache_create(const di_prefix_cache_opts *opts, di_prefix_cache **out, di_error *err);
void di_prefix_cache_destroy(di_prefix_cache *pc); /* NULL is fine; pinned hits must be released */

/* Longest usable hit for ids[0..n) given a replay of `keep` tokens: a hit ≤ keep is declined. */
int di_prefix_cache_match(di_prefix_cache *pc, const int32_t *ids, int64_t n, int64_t keep, di_prefix_hit *hit,
                          di_error *err);
/* Resume s at hit->tokens (bounded replay of keep tokens; keep ≤ 0 = the session's default); logits
 * f32 [1, V] of position hit->tokens − 1 (may be NULL). DI_ERR_INVALID when a block was never filled. */
int di_prefix_cache_restore(const di_prefix_cache *pc, const di_prefix_hit *hit, di_session *s, const int32_t *ids,
                            int64_t keep, float *logits, di_error *err);
/* Whether every block of the hit holds its span (worker side; see the top of this file). */
bool di_prefix_hit_ready(const di_prefix_hit *hit);
void di_prefix_cache_release(di_prefix_cache *pc, di_prefix_hit *hit);
/* Store the whole blocks of ids[0..n) (n ≤ di_cache_len(c)); *added (may be NULL) = blocks added. */
int di_prefix_cache_insert(di_prefix_cache *pc, const int32_t *ids, int64_t n, const di_cache *c, int64_t *added,
                           di_error *err);

/* ---- engine use: claim on the host, fill on the worker, settle on the host ----
 * claim: the child of parent (NULL = the root) labelled block_ids[0..block), created pending when
 * missing (evicting to make room for opts.block_bytes), or revived when it is dead and unpinned (a
 * failed fill is retried by the next request that computes the block). *out is pinned once for the
 * caller (NULL when there was no room or the parent is dead); *created = 1 when the caller must have
 * it filled. */
int di_prefix_cache_claim(di_prefix_cache *pc, di_prefix_node *parent, const int32_t *block_ids, di_prefix_node **out,
                          int *created, di_error *err);
void di_prefix_cache_pin(di_prefix_node *n);
void di_prefix_cache_unpin(di_prefix_node *n);
/* Worker: export the block [t0, t0 + block) of c into a pending node (ready on success). */
int di_prefix_cache_fill(const di_prefix_cache *pc, di_prefix_node *n, const di_cache *c, int64_t t0, di_error *err);
/* Host, after the step that filled n was waited for: unpins the claim, and a node left unready is
 * marked dead (not matched; evicted first, or revived by a later claim once unpinned). */
void di_prefix_cache_settle(di_prefix_cache *pc, di_prefix_node *n);

void di_prefix_cache_stats(const di_prefix_cache *pc, di_prefix_stats *out);
int di_prefix_cache_block(const di_prefix_cache *pc);
int di_prefix_cache_align(const di_prefix_cache *pc);
/* Effective replay length: opts.keep, else the session's di_session_replay_keep (s may be NULL when
 * opts.keep > 0). */
int64_t di_prefix_cache_keep(const di_prefix_cache *pc, const di_session *s);

#endif
