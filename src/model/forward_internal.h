/* Private to forward.c / forward_block.c / dspark.c / session.c: the state of one forward pass over
 * a batch of sequences, each bringing its own chunk of positions [s0, s0 + T) and its own cache.
 *
 * Rows: the pass works on the CONCATENATION of the chunks — sequence i owns the rows
 * [r0_i, r0_i + T_i) of every token-parallel tensor (embedding, streams, mixes, every GEMM input and
 * output, router, expert rows). Every backend op is row-wise batch invariant (backend.h), so running
 * those ops once over all rows gives each row the bits it would get alone, and the weights are read
 * once per pass instead of once per sequence. What depends on a sequence's history — cache reads and
 * writes, window lists, compressor pooling, indexer scores, candidate masks, top-k, the sparse
 * attention — runs per sequence on its row slice. A single-sequence forward is the batch of one.
 *
 * Memory: tensors the ops read or write live in BACKEND memory (fwd_alloc; device memory for CUDA)
 * and are never dereferenced here; what the graph decides on the host — positions, window and top-k
 * index lists, Engram hash ids, expert row lists — is built in HOST memory (fwd_halloc) and uploaded
 * once (fwd_upload). The few values the host needs back (top-k ids for the gather union — unless the
 * backend gathers the selected entries itself, fwd_gather_on_backend —, router ids for the expert
 * dispatch, logits) are downloaded (fwd_download), each a synchronisation point. With
 * the CPU backend both memories are the same and the transfers are copies. */
#ifndef DI_MODEL_FORWARD_INTERNAL_H
#define DI_MODEL_FORWARD_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "model/cache.h"
#include "model/forward.h"

/* What a caller hands the pass for one sequence. */
typedef struct fwd_chunk {
    di_cache *cache;        /* positions < s0 are read from it, the chunk is written */
    int64_t s0;             /* first position of the chunk */
    int64_t T;              /* tokens in the chunk (≥ 1) */
    const int32_t *ids;     /* int32 [T] (host); NULL for a DSpark draft block */
    int64_t window_floor;   /* SWA bounded replay: window positions below it are invisible (0 = none) */
    int64_t prompt_end;     /* end of the request's prompt (0 = the chunk's end): fwd_row_select_entries */
    bool dspark;            /* write the DSpark stage windows of the chunk (fwd_dspark_fill) */
    bool all_logits;        /* head rows: every position of the chunk, else the last one */
    float *logits;          /* f32 [T or 1, V] (host) or NULL: no head rows for this sequence */
} fwd_chunk;

/* Shared attention state published by a source stage for one sequence's queries. The compressed
 * KV and index keys themselves live in the cache (stage = the kv source); what a pass publishes is
 * what only its own queries need. */
typedef struct fwd_pub {
    const int32_t *topk;     /* int32 [T, topk_k] compressed entry ids (no offset), −1 padded (host), or NULL
                              * when the pass gathers on the backend (fwd_gather_on_backend) */
    const int32_t *topk_dev; /* the same lists in backend memory (pass lifetime) */
    int topk_k;
    const uint8_t *cand;     /* uint8 [T, n_cand] candidate mask (the candidate source) (backend) */
    int64_t n_cand;
    bool done;               /* the stage ran in this pass */
} fwd_pub;

/* One sequence of the pass. */
typedef struct fwd_seq {
    fwd_chunk ck;
    int64_t r0;              /* first row of the chunk in the pass */

    /* Window part of every query's key set (the same for every layer of the pass): the key rows are
     * the positions [win_base, s0+T) — the previous window read from the cache, then the chunk — and
     * row t of win_idx lists the rows query s0+t attends, in the reference's order (§5.3). */
    int64_t win_base;        /* max(0, s0 − W + 1), raised to the window floor */
    int64_t n_win_rows;      /* s0 + T − win_base */
    int32_t *win_idx;        /* int32 [T, n_win] (host) */
    int64_t n_win;

    fwd_pub *pub;            /* [n_stages] read through the config's roles, in layer order */
} fwd_seq;

typedef struct fwd_ctx {
    const di_model *m;
    const di_config *cfg;
    const di_backend *be;
    const di_fwd_opts *opts;
    di_error *err;
    int n_seq;
    fwd_seq *seq;            /* [n_seq] in row order */
    int64_t T;               /* rows of the pass: Σ chunk T */
    int32_t *ids;            /* int32 [T] the chunks' ids concatenated (host); NULL for a draft block */
    int64_t *pos;            /* int64 [T] each row's position (backend) */
    float *rope_freqs[2];    /* f32 [rd/2] per di_rope_kind (plain, compress) (backend) */
    int64_t **eg_ids;        /* [n_engram_layers] int64 [T, cols] hash row ids of every row (backend) */

    /* DSpark features (§4.6): mean over the hc streams of each target layer's input, concatenated in
     * target order, for every row. NULL when no sequence of the pass keeps DSpark windows. */
    uint16_t *main_hidden;   /* bf16 [T, ntgt·D] (backend) */

    /* DSpark draft block (dspark.c, a pass of one sequence): the stage window rows in slot order. */
    const uint16_t *draft_win; /* bf16 [n_draft_win, hd] (backend) */
    int64_t n_draft_win;

    di_prefill_out *out;     /* prefill results (layer outputs, index scores, top-k) or NULL; one sequence */

    struct fwd_mem { void *p; bool host; } *keep; /* allocations that live for the whole pass */
    size_t n_keep, cap_keep;
    struct fwd_mem *tmp;                           /* allocations of the current block */
    size_t n_tmp, cap_tmp;

    /* The persistent arena (forward_arena.c) this pass runs in, or NULL (opts->arena unset or busy). */
    struct di_fwd_arena *ar;
    size_t ar_lo, ar_hi;     /* backend block: block-lifetime bytes end at ar_lo, pass-lifetime start at ar_hi */
    size_t ar_host;          /* host bytes used (fwd_halloc) */
    size_t ar_stage;         /* upload staging bytes used */
    size_t ar_lo_want, ar_keep_want, ar_want; /* the same as if everything had fit; ar_want = the peak */
    bool ar_spill;           /* an allocation did not fit */
    uint64_t key;            /* shape key of the pass so far (with or without an arena) */
} fwd_ctx;

/* Arena internals (forward_arena.c), used by the allocation functions below and fwd_backbone.
 * fwd_arena_alloc: *out = arena bytes (zeroed) or NULL (no arena, or a spill: allocate per block);
 * every request enters the shape key. fwd_arena_stage: a staging copy of host data for an upload (or
 * host itself). fwd_arena_synced: a download drained the stream (no fence needed before the next pass). */
int fwd_arena_begin(fwd_ctx *c);
void fwd_arena_end(fwd_ctx *c);
void fwd_arena_key(fwd_ctx *c, uint64_t v);
int fwd_arena_alloc(fwd_ctx *c, size_t bytes, int persist, bool host, void **out);
const void *fwd_arena_stage(fwd_ctx *c, const void *host, size_t bytes);
void fwd_arena_free_tmp(fwd_ctx *c);
void fwd_arena_synced(fwd_ctx *c);
/* Graph capture of the backbone (fwd_backbone): eligible arena, its instantiated graph, the counters. */
bool fwd_arena_graphs(const fwd_ctx *c);
bool fwd_arena_graphs_on(const fwd_ctx *c); /* the pass runs in an arena with graphs on (recorded or not) */
#define FWD_GRAPH_MAX_T 64 /* passes of more rows are never recorded (forward.c graph_pass) */
void **fwd_arena_exec(fwd_ctx *c);
void fwd_arena_count(fwd_ctx *c, int captures, int replays, int fallbacks);

/* Zeroed allocation in backend memory (fwd_alloc) or host memory (fwd_halloc), owned by the pass
 * (persist = 1) or by the current block (persist = 0); NULL after setting ctx->err on failure. */
void *fwd_alloc(fwd_ctx *c, size_t bytes, int persist);
void *fwd_halloc(fwd_ctx *c, size_t bytes, int persist);
/* A backend copy of host data (same ownership rules); NULL on failure. */
void *fwd_upload(fwd_ctx *c, const void *host, size_t bytes, int persist);
/* Backend → host (synchronises with the ops issued so far). */
int fwd_download(fwd_ctx *c, void *host, const void *src, size_t bytes);
void fwd_free_tmp(fwd_ctx *c);

/* Pass setup for chunks[0..n) (distinct caches; ids validated against the vocabulary): rows,
 * positions, RoPE tables, window index lists, Engram hashes (from each cache's history). Nothing is
 * written to the caches. fwd_ctx_free releases everything (also after a failed init). */
int fwd_ctx_init(fwd_ctx *c, const di_model *m, const di_backend *be, const fwd_chunk *chunks, int n,
                 const di_fwd_opts *opts, di_error *err);
/* The batch of one: the chunk [s0, s0+T) of ids on cache, opts->window_floor applying to it. */
int fwd_ctx_init1(fwd_ctx *c, const di_model *m, const di_backend *be, di_cache *cache, int64_t s0,
                  const int32_t *ids, int64_t T, const di_fwd_opts *opts, di_error *err);
void fwd_ctx_free(fwd_ctx *c);

/* Width of the index selections at compress ratio R: the entries a score row spans, the top-k and
 * candidate-block selections running over all of them (those past the row's visible ones are −inf).
 * The CPU selections replay torch's, whose choice among EXACTLY tied scores depends on that width, so
 * a row selects what the reference selects only at the reference's width: its one-shot prefill scores
 * every prompt row T/R wide (T = the prompt), each decode step end/R wide. The width is therefore a
 * property of the ROW, not of the pass that happens to compute it:
 *   - a prompt row (position p < prompt_end) is prompt_end/R wide, whatever chunk it is in, so any
 *     chunking of a prompt picks what its one-shot prefill picks;
 *   - a row past the prompt (p ≥ prompt_end) is (p+1)/R wide, the decode step at p: a DSpark verify
 *     block, or a readmitted request recomputing its generated tokens in one prefill, gives every row
 *     the decode step's selection, hence its bits (and writes the decode steps' cache);
 *   - prompt_end = 0 means the chunk ends the prompt: every row is (s0+T)/R wide (a one-shot prefill).
 * Widths never decrease along a chunk; its last row is the widest (fwd_select_entries), the width of
 * the pass's score buffers and of its top-k lists (a narrower row's list is −1 padded after its own
 * k entries: trailing −1 change no attention bit). */
static inline int64_t fwd_row_select_entries(const fwd_chunk *k, int64_t p, int R) {
    int64_t pe = k->prompt_end > 0 ? k->prompt_end : k->s0 + k->T;
    return (pe > p + 1 ? pe : p + 1) / R;
}
static inline int64_t fwd_select_entries(const fwd_chunk *k, int R) {
    return fwd_row_select_entries(k, k->s0 + k->T - 1, R);
}

/* The selected compressed entries of this pass are gathered by the backend from its own top-k lists
 * (be->gather_topk) instead of being planned on the host after a download: when the backend has the
 * slot, every cache's arena is in its memory, and the per-query gathers stay small (decode steps,
 * verify blocks); long chunks keep the host's union of the lists. Same attention inputs either way. */
bool fwd_gather_on_backend(const fwd_ctx *c);
/* Rows one backend top-k gather may produce (T·top-k; default DI_MEMPLAN_GATHER_ROWS, ≤ 0 restores it):
 * longer passes gather and attend in slices (forward_block.c). Tests set small values. */
void fwd_set_gather_rows(int64_t rows);

/* Hand a stage tensor to the dump callback (no-op without one), downloaded from backend memory
 * (fwd_dump) or already on the host (fwd_dump_host). Shape given as up to 3 dims. */
void fwd_dump(fwd_ctx *c, const char *name, di_dtype dt, const void *data, int ndim, int64_t d0, int64_t d1,
              int64_t d2);
void fwd_dump_host(fwd_ctx *c, const char *name, di_dtype dt, const void *data, int ndim, int64_t d0, int64_t d1,
                   int64_t d2);

/* X = embedding repeated over the hc streams; pre = one-hot stream 0, for all T rows of the pass.
 * ids int32 [T] (host);  x bf16 [T, hc, D], pre f32 [T, hc] (backend) */
int fwd_embed_streams(fwd_ctx *c, const int32_t *ids, uint16_t *x, float *pre);

/* Engram update of the streams before block L (no-op for non-Engram layers).  x bf16 [T, hc, D] */
int fwd_engram(fwd_ctx *c, int L, uint16_t *x);

/* Block L (backbone layer or DSpark stage) over all rows: x bf16 [T, hc, D] in place; pre_in
 * f32 [T, hc] collapses the attention input; pre_out f32 [T, hc] receives the FFN pre-mix for the next
 * block. Backbone layers write each chunk's window rows / compressed entries into its cache (after
 * reading what the chunk needs from before its s0); a DSpark stage (a draft pass, one sequence)
 * attends c->draft_win ‖ the draft block. */
int fwd_block(fwd_ctx *c, int L, uint16_t *x, const float *pre_in, float *pre_out);

/* The whole backbone over the pass: Engram, blocks, DSpark features; then the final collapse, norm
 * and head, run ONCE over the head rows of every sequence that asks for logits (its last position, or
 * every position when all_logits) and downloaded into each chunk's host `logits`. Requires
 * di_cache_extend(T) done on every cache. */
int fwd_backbone(fwd_ctx *c);

/* DSpark (dspark.c): the stage windows of the chunks' positions from c->main_hidden (all stages), for
 * the sequences whose chunk has dspark set. */
int fwd_dspark_fill(fwd_ctx *c);

/* DSpark draft block after main position i = s0 − 1 (c set up for one chunk [i+1, i+1+block) with no
 * ids): token = the main model's output at i. ids int32 [block+1] (ids[0] = token), conf f32 [block],
 * logits f32 [block, V] (may be NULL), all host. sample NULL = greedy (first maximum). */
int fwd_dspark_draft(fwd_ctx *c, int32_t token, di_sample_fn sample, void *sample_ctx, int32_t *ids, float *conf,
                     float *logits);

#endif
