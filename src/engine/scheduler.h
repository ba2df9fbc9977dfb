/* Continuous-batching scheduler: which pieces of which requests run in the next step.
 *
 * A step has a token budget (max_step_tokens) and a sequence limit (max_seqs). Each step:
 *   1. running requests, oldest admission first: the next piece of each — one decode token, or its
 *      next prefill chunk — if it fits the remaining budget; cache blocks are reserved for it, and
 *      if the pool is empty the NEWEST running request is preempted (possibly the one asking);
 *   2. waiting requests, strictly first-in first-out: admitted while a sequence slot and the budget
 *      allow their first chunk and the pool's free blocks hold their whole known sequence (prompt,
 *      or prompt + outputs after a preemption); the first one that does not fit stops admission,
 *      so a long prompt is never overtaken by later short ones.
 * Decodes and prefill chunks share one step (chunked prefill mixed with decode).
 *
 * Chunk boundaries are a function of the request alone (batch invariance, issue 7 item 5): a
 * prefill covers [0, c), [c, 2c), … with c the request's own chunk size, and a chunk that does not
 * fit the budget waits for a later step instead of being shortened. What else is in the batch can
 * change WHEN a chunk runs, never WHERE it starts or ends.
 *
 * Preemption policy: recompute. The victim's blocks go back to the pool, the runner is told its
 * cache is dead, and it re-enters the FRONT of the waiting queue with its prompt and the tokens it
 * has generated so far; on readmission those are prefilled again (chunked from position 0) and it
 * continues sampling at the position where it stopped. Sampling is keyed by (seed, position), so
 * the continuation is the same as without preemption whenever the recomputed logits are the same.
 * The recompute prefills prompt ++ outputs in chunks where the original run had a prefill and then
 * one decode step per token; its pieces are the request's own chunks [0, c), [c, 2c), … with one
 * more boundary at the prompt's end. The runner is told the prompt's length with every piece
 * (di_step_seq.n_prompt), and the model computes each row as the computation it stands for: a prompt
 * row with the one-shot prefill's index-selection width and window layout, a row past the prompt as
 * its decode step (model/forward_internal.h fwd_row_select_entries, forward.c window_lists) — one
 * layout per chunk, hence the boundary. With the batch-invariant kernels the recompute reproduces the
 * logits and the cache bit for bit and the continuation is unchanged (tests/test_split_invariance.c).
 * Swapping to host memory is not implemented.
 *
 * Prefix cache (runner->prefix, engine/prefix_cache.h). The tree is this thread's:
 *   admission  a request that starts from position 0 looks its prompt up; a hit of P tokens (more
 *              than keep, whole blocks) makes it start at the replay start r = P − keep rounded
 *              down to the compress ratios' lcm (n_cached = r), and its first piece [r, r + chunk)
 *              carries the hit: the runner restores [0, P) from the blocks and replays [r, P). So
 *              the budget, the admission test and the cache blocks all see the work that is done —
 *              prompt − r positions (prompt − P + keep when P − keep is aligned) — not the prompt.
 *              A hit whose replay would not fit one chunk with a token to spare is declined. The
 *              later chunks are the request's own [r + c, r + 2c), …: they depend on the hit, which
 *              depends on what earlier requests stored (as the replay's numerics do).
 *   publish    at every schedule, and before a request's cache is dropped (finish, preemption),
 *              each whole block of its sequence that is computed (< n_cached, steps ≤ the one in
 *              flight) and whose ids the host knows (prompt and seen outputs) is claimed in the tree
 *              and sent with the plan as a fill; the runner writes it before the step's releases and
 *              pieces. So a request admitted while another with the same system prompt is still
 *              decoding hits the blocks the first one has computed so far. Prompt blocks are
 *              claimed at the same step in sync and async mode; blocks that reach into the outputs
 *              wait for the host to see their tokens, one step later in async mode.
 *   preemption a preempted request has published its blocks, so its readmission restores its own
 *              prompt blocks (bounded replay) instead of recomputing them: cheaper, and inexact by
 *              the replay's bound where the plain recompute below is exact.
 * Every pin the worker relies on (hits being restored, blocks being filled) is dropped in
 * di_sched_step_done, once the step that used it is back.
 *
 * Async mode: requests in a step still running on the worker cannot be preempted (their cache is
 * being written). When the only way to make room is such a request, di_sched_schedule returns
 * DI_SCHED_NEED_SYNC without changing anything; the caller waits for the step in flight, processes
 * its results and calls again. */
#ifndef DI_ENGINE_SCHEDULER_H
#define DI_ENGINE_SCHEDULER_H

#include <stdint.h>

#include "engine/block_pool.h"
#include "engine/sequence.h"
#include "engine/runner.h"

#define DI_SCHED_NEED_SYNC 1

typedef struct di_sched_config {
    int32_t max_seqs;        /* requests per step and requests admitted at once */
    int64_t max_step_tokens; /* token budget per step, >= prefill_chunk */
    int32_t prefill_chunk;   /* default chunk size for requests that do not set one */
} di_sched_config;

/* One piece of a step. */
typedef struct di_sched_item {
    di_seq *req;
    int64_t pos0;       /* first position */
    int32_t n_tokens;
    int32_t samples;    /* the piece reaches the end of the known sequence: a token is sampled */
    int32_t restores;   /* the piece starts at the replay start of req->prefix_hit (see the top) */
    int32_t block_off;  /* this piece's block table: plan->blocks[block_off .. block_off + n_blocks) */
    int32_t n_blocks;
} di_sched_item;

/* A step's plan. Owns copies of the block tables, so the worker never reads a table the host is
 * growing for the next step. */
typedef struct di_step_plan {
    uint64_t step;
    int32_t n_items;
    di_sched_item *items;   /* [max_seqs] */
    int64_t n_tokens;
    int32_t n_samples;
    int32_t *blocks;        /* [cap_blocks] int32 concatenated block tables */
    int32_t n_blocks, cap_blocks;
    int64_t *release;       /* [cap_release] request ids whose cache the runner may drop, before this step */
    int32_t n_release, cap_release;
    di_step_fill *fills;    /* [cap_fills] prefix-cache blocks to write before the releases */
    int32_t n_fills, cap_fills;
} di_step_plan;

typedef struct di_scheduler {
    di_sched_config cfg;
    const di_model_runner *runner;
    di_block_pool pool;
    di_seq **waiting;   /* [cap_waiting] FIFO ring buffer: front at waiting_head, n_waiting entries */
    int32_t n_waiting, cap_waiting, waiting_head;
    di_seq **running;   /* [cap_running] admission order, oldest first */
    int32_t n_running, cap_running;
    uint64_t next_arrival;
    uint64_t next_step;
    int64_t *release;       /* [cap_release] ids to hand to the runner with the next plan */
    int32_t n_release, cap_release;
    di_step_fill *fills;    /* [cap_fills] prefix blocks to hand to the runner with the next plan */
    int32_t n_fills, cap_fills;
    int32_t *block_ids;     /* [prefix block] int32 scratch: a block's ids across prompt and output */
    /* counters */
    int64_t n_preemptions;
    int64_t n_steps;
} di_scheduler;

int di_sched_init(di_scheduler *s, const di_sched_config *cfg, const di_model_runner *runner, di_error *err);
void di_sched_destroy(di_scheduler *s);

/* Blocks a sequence of n positions holds (the runner's rule). */
int32_t di_sched_blocks_for(const di_scheduler *s, int64_t n_tokens);

/* Queues a request (state WAITING). Refuses (DI_ERR_LIMIT) one that could never fit: its prompt
 * fills the context, or its longest possible sequence needs more blocks than the whole pool. */
int di_sched_add(di_scheduler *s, di_seq *r, di_error *err);

/* Builds the next step. Returns DI_OK (plan may be empty), DI_SCHED_NEED_SYNC, or an error. */
int di_sched_schedule(di_scheduler *s, di_step_plan *plan, di_error *err);

/* Removes finished requests that no step in flight still uses: their blocks return to the pool and
 * the runner hears of it with the next plan. Requests leave the queues here; the caller keeps
 * ownership of the di_seq (for polling) and frees it. Returns how many left. */
int32_t di_sched_reap(di_scheduler *s);

/* The step of plan p is back (successful or not): drops the prefix-cache pins it held. Call once per
 * submitted plan, after waiting for it (di_core does it when it processes the step's result). */
void di_sched_step_done(di_scheduler *s, const di_step_plan *p);

/* Marks a request finished with `why` wherever it is (a waiting one leaves the queue at once). */
void di_sched_finish(di_scheduler *s, di_seq *r, di_finish_reason why);

int di_step_plan_init(di_step_plan *p, int32_t max_seqs, di_error *err);
void di_step_plan_destroy(di_step_plan *p);

#endif
