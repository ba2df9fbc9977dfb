/* The V4.1 block graph (spec model.md §4.2–§4.6), written as a chain of calls on the backend op
 * interface (backend.h). The pass runs over any chunk [s0, s0+T) of a sequence through its cache
 * (model/cache.h; the per-sequence API is model/session.h), or over a BATCH of such chunks of several
 * sequences at once (di_session_forward_batch): the token-parallel ops run once over the
 * concatenated rows of all chunks, the history-dependent ones per sequence on its rows, and every op
 * being row-wise batch invariant, each sequence gets the bits it would get alone
 * (forward_internal.h). This header also offers the one-shot prefill from position 0 and its
 * teacher-forced variant used by `deepinfer verify` (single-sequence passes).
 *
 *   X = repeat_hc(embed(ids));  pre = onehot(stream 0)
 *   for each layer L:  [Engram_L(X)]  X, pre = block_L(X, pre)        (forward_block.c)
 *   logits = head(norm(collapse(X; pre)))                            (last or every position)
 *
 * Chunk semantics (spec §3.0b, §3.11; the reference only has s0 = 0 with any T and s0 > 0 with T = 1):
 * query p attends the window positions max(0, p−W+1) … p — the ones before s0 read from the cache's
 * ring, the rest from the chunk — and the compressed entries n < ⌊(p+1)/R⌋, including those the
 * chunk's own earlier tokens complete; the ratio-2 compressor continues its carry state across the
 * chunk boundary; the Engram n-gram hash continues the cached history. The window index order is the
 * reference's: its decode order for a one-token step after position 0, its prefill order otherwise.
 * So a one-chunk prefill, any chunking and token-by-token decode are the same causal function
 * (tests/test_decode*.c measure them against the golden data and against each other).
 *
 * Shared attention state (the reference's SharedAttentionRuntime): kv sources write the compressed
 * KV and index keys into the cache under their own stage, index sources publish their top-k list for
 * the pass, the candidate source its candidate mask; consumers read them in layer order.
 *
 * Teacher forcing (golden README): block i runs on a given input X and pre-mix (the reference's
 * layer i−1 output and pre-mix); the shared state it reads comes from the teacher-forced runs of the
 * earlier source blocks, so errors do not compound across blocks.
 *
 * Backends: the pass is the same chain of ops on every backend. Its tensors live in backend memory
 * (device memory for CUDA) and the host reaches them only through the backend's memory slots; what the
 * graph decides on the host (positions, window and top-k lists, Engram hashes, expert row lists) is
 * uploaded once per pass or per layer (forward_internal.h). The weights must be where the backend
 * computes (di_model_to_backend); ids, logits and prefill outputs are host memory.
 *
 * Debug dumps: with opts->dump set, every stage hands its tensor to the callback under a stable name
 * ("L3.attn.q", "L3.ffn.out", "logits", ...; list in forward_block.c) — the hook used to find where an
 * implementation starts to drift from the reference. */
#ifndef DI_MODEL_FORWARD_H
#define DI_MODEL_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "io/safetensors.h"
#include "model/weights.h"

/* Graph-level fault injection for the mutation tests (op-level ones: di_op_faults in backend.h).
 * All false in normal runs. */
typedef struct di_graph_faults {
    bool no_sink;             /* attention without the sink term */
    int sinkhorn_iters;       /* > 0: this many Sinkhorn iterations instead of hc_sinkhorn_iters */
    bool ignore_candidates;   /* re-index layers score without the candidate mask */
    bool premix_not_deferred; /* each sub-layer collapses with its own pre-mix (V4 style) */
    bool window_no_history;   /* a chunk's queries (and DSpark drafts) ignore the cached window */
    bool engram_no_history;   /* the n-gram hash treats every chunk start as the sequence start */
} di_graph_faults;

/* Named stage dump: data is a host copy (downloaded from backend memory for a device backend), valid
 * for the call only. */
typedef void (*di_dump_fn)(void *ctx, const char *name, di_dtype dtype, int ndim, const int64_t *shape,
                           const void *data);

/* Per-block timing hook (`deepinfer bench gpu`): called with after = false just before backbone block
 * L (its Engram included) and after = true once it returns, with every op of it issued. The forward
 * never synchronises a device itself: the callback does (e.g. a one-byte mem_download) when it times
 * the block. A non-zero return aborts the pass with that status (the callback sets err). NULL = no
 * calls, no cost. */
typedef int (*di_block_hook_fn)(void *ctx, int layer, bool after, di_error *err);

typedef struct di_fwd_opts {
    di_dump_fn dump; /* NULL = no dumps */
    void *dump_ctx;
    di_graph_faults faults;
    /* SWA bounded replay (engine/prefix_cache.h): window positions below window_floor are invisible
     * to this chunk's queries and never read from the cache; 0 = the whole window. Single-sequence
     * passes only (a batch gives each chunk its own floor: di_session_chunk). */
    int64_t window_floor;
    /* The length of the request's prompt (0 = the chunk's end: the chunk ends the prompt). Each row is
     * computed as the computation it stands for in the request's meaning — one-shot prefill of the
     * prompt, then one decode step per generated token: a row before prompt_end selects over the whole
     * prompt's entries and lists its window as the one-shot prefill does, a row at or after it as its
     * decode step (model/forward_internal.h fwd_row_select_entries, forward.c window_lists). So any
     * chunking of a prompt, a DSpark verify block and a recompute of generated tokens give the logits
     * and cache of the one-shot prefill + decode steps bit for bit (ties among equal index scores are
     * otherwise resolved by the selection's width; the window layout decides the attention's 64-index
     * blocking). Set it on every pass of a request. Single-sequence passes only (a batch gives each
     * chunk its own: di_session_chunk). */
    int64_t prompt_end;
    di_block_hook_fn block_hook; /* NULL = none */
    void *block_hook_ctx;
    /* The hook only enqueues work on the backend's stream and never waits for the device (e.g. an
     * event marking a block's start and end, backend/cuda/cuda_optime.h di_cuda_mark): a pass with
     * it may still be recorded as a CUDA graph (forward.c graph_pass), the hook's work inside it. */
    bool block_hook_async;
    /* The chunks' logits pointers are backend memory: the head copies its rows there and downloads
     * nothing (the engine samples them on the device, engine/executor.h). false = host memory. */
    bool logits_on_device;
    /* Persistent scratch for the pass (di_fwd_arena below); NULL = per-block allocations. */
    struct di_fwd_arena *arena;
} di_fwd_opts;

/* A persistent scratch arena for the passes of one backend (forward_arena.c): one block of backend
 * memory for every fwd_alloc of a pass (reset per pass, grown between passes when a pass needed more)
 * and one host staging block for the pass's host-built plans (positions, index lists, block tables),
 * pinned where the backend can (be->host_pin) so each plan upload is an asynchronous DMA from a fixed
 * address. A pass of the same shape gets the same bytes at the same addresses in the same order,
 * which is what a captured CUDA graph needs (arena.graphs). Results are bit-identical to the
 * per-block allocations (both are zero-filled). One pass at a time: a pass that finds the arena busy
 * (a nested pass) allocates per block as without it. */
typedef struct di_fwd_arena di_fwd_arena;

typedef struct di_fwd_arena_stats {
    uint64_t passes;        /* passes that ran in the arena */
    uint64_t grows;         /* (re)allocations of either block */
    uint64_t spills;        /* allocations served outside the arena (a pass that outgrew it) */
    size_t dev_bytes;       /* capacity of the backend block */
    size_t host_bytes;      /* capacity of the host staging block */
    uint64_t shape_key;     /* the last pass's shape key (forward_arena.c: what it hashes) */
    uint64_t key_changes;   /* passes whose key differed from the pass before */
    uint64_t captures;      /* CUDA graphs instantiated (graphs on) */
    uint64_t replays;       /* passes that replayed an instantiated graph after updating it */
    uint64_t graph_fallbacks; /* captures abandoned (an op that cannot be captured): the pass ran eagerly */
} di_fwd_arena_stats;

/* graphs: capture decode passes as backend graphs where the backend can (be->graph_begin); false, or
 * env DI_CUDA_GRAPHS unset/0, keeps every pass eager. */
int di_fwd_arena_create(const di_backend *be, bool graphs, di_fwd_arena **out, di_error *err);
void di_fwd_arena_destroy(di_fwd_arena *a);
void di_fwd_arena_get_stats(const di_fwd_arena *a, di_fwd_arena_stats *st);
/* p lies in the arena's upload staging block (the sources a recorded pass may copy from; tests). */
bool di_fwd_arena_is_staging(const di_fwd_arena *a, const void *p);

/* A ready-made dump callback: records every stage tensor (copied, name prefixed by `prefix`) and
 * writes them all to one safetensors file — `deepinfer verify --dump-stages FILE`. Use with
 * opts.dump = di_stage_recorder_fn, opts.dump_ctx = the recorder. */
typedef struct di_stage_recorder {
    const char *prefix;      /* e.g. "free." / "tf."; may be NULL */
    int64_t n, cap;
    di_tensor_spec *specs;   /* [n] (names owned) */
    void **data;             /* [n] copies */
    int failed;              /* an allocation failed: the file would be incomplete */
} di_stage_recorder;

void di_stage_recorder_fn(void *ctx, const char *name, di_dtype dtype, int ndim, const int64_t *shape,
                          const void *data);
int di_stage_recorder_write(const di_stage_recorder *r, const char *path, di_error *err);
void di_stage_recorder_free(di_stage_recorder *r);

/* Token choice from one row of logits (greedy, sampled): used for the DSpark drafts.
 *   logits f32 [vocab] */
typedef int32_t (*di_sample_fn)(void *ctx, const float *logits, int64_t vocab);

/* Per-block results of a prefill (free-running or teacher-forced). Index-source layers also report
 * their scores and top-k (golden names prefill_layer{i}_index_scores / _topk). */
typedef struct di_prefill_out {
    int64_t T;
    int n_layers;
    int64_t vocab;
    float *logits;         /* f32 [T, V]; NULL for teacher-forced runs */
    uint16_t **layer_out;  /* [n_layers] bf16 [T, hc, D] block outputs (before the next block's Engram) */
    float **premix;        /* [n_layers] f32 [T, hc] the pre-mix each block hands to the next */
    float **index_scores;  /* [n_layers] f32 [T, T/R] (bf16 values, −inf masked) or NULL */
    int32_t **topk;        /* [n_layers] int32 [T, k] (+T offset, −1 padded) or NULL */
    int *topk_k;           /* [n_layers] k, 0 where none */
    int64_t *n_keys;       /* [n_layers] T/R, 0 where none */
} di_prefill_out;

void di_prefill_out_free(di_prefill_out *o);

/* Free-running one-shot prefill of ids[0..T) from position 0: prompt logits for every position and
 * every block's output and pre-mix. ids is the whole prompt: opts->prompt_end must be 0 or T (a pass
 * that runs past a prompt's end — rows computed as decode steps — is di_session_forward's, which
 * splits it where one layout per pass cannot hold). */
int di_prefill(const di_model *m, const di_backend *be, const int32_t *ids, int64_t T, const di_fwd_opts *opts,
               di_prefill_out *out, di_error *err);

/* Teacher-forced prefill: block i runs on x_in[i] (bf16 [T, hc, D], before block i's Engram) with
 * pre-mix pre_in[i] (f32 [T, hc]). x_in[0] / pre_in[0] may be NULL: the block then gets this engine's
 * embedding repeated ×hc and the one-hot pre-mix (what the reference gives block 0). */
int di_prefill_teacher_forced(const di_model *m, const di_backend *be, const int32_t *ids, int64_t T,
                              const uint16_t *const *x_in, const float *const *pre_in, const di_fwd_opts *opts,
                              di_prefill_out *out, di_error *err);

/* RoPE frequencies of one layer (reference precompute_freqs_cis, f32 throughout; YaRN blend on
 * compressed layers): freqs f32 [rope_head_dim/2]. The angle at position p is f32(p)·freqs[i]. */
int di_rope_freqs(const di_config *cfg, int layer, float *freqs, di_error *err);

/* Engram hash row ids of every prompt position for Engram layer slot e (spec §4.3):
 * ids int64 [T, (max_ngram−1)·n_heads], (order, head) order, offsets added. */
int di_engram_hash(const di_model *m, int e, const int32_t *tokens, int64_t T, int64_t *ids, di_error *err);

#endif
