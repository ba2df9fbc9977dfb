/* Continuous-batching scheduler (policy: scheduler.h). */
#include "engine/scheduler.h"

#include <stdlib.h>
#include <string.h>

static int grow_arr(void **p, int32_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return 0;
    int64_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    if (c > INT32_MAX) return -1;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return -1;
    *p = q;
    *cap = (int32_t)c;
    return 0;
}

/* ---- waiting queue: a ring buffer, O(1) at both ends (preempted requests rejoin at the front) ---- */

static int waiting_reserve(di_scheduler *s) {
    if (s->n_waiting < s->cap_waiting) return 0;
    int32_t cap = s->cap_waiting ? 2 * s->cap_waiting : 64;
    di_seq **q = malloc((size_t)cap * sizeof *q);
    if (!q) return -1;
    for (int32_t i = 0; i < s->n_waiting; i++) q[i] = s->waiting[(s->waiting_head + i) % s->cap_waiting];
    free(s->waiting);
    s->waiting = q;
    s->cap_waiting = cap;
    s->waiting_head = 0;
    return 0;
}

static di_seq *waiting_at(const di_scheduler *s, int32_t i) {
    return s->waiting[(s->waiting_head + i) % s->cap_waiting];
}

static void waiting_push_back(di_scheduler *s, di_seq *r) {
    s->waiting[(s->waiting_head + s->n_waiting) % s->cap_waiting] = r;
    s->n_waiting++;
}

static void waiting_push_front(di_scheduler *s, di_seq *r) {
    s->waiting_head = (s->waiting_head + s->cap_waiting - 1) % s->cap_waiting;
    s->waiting[s->waiting_head] = r;
    s->n_waiting++;
}

static void waiting_pop_front(di_scheduler *s) {
    s->waiting_head = (s->waiting_head + 1) % s->cap_waiting;
    s->n_waiting--;
}

static void waiting_remove(di_scheduler *s, const di_seq *r) {
    int32_t i = 0;
    while (i < s->n_waiting && waiting_at(s, i) != r) i++;
    if (i == s->n_waiting) return;
    for (; i + 1 < s->n_waiting; i++)
        s->waiting[(s->waiting_head + i) % s->cap_waiting] = waiting_at(s, i + 1);
    s->n_waiting--;
}

int di_step_plan_init(di_step_plan *p, int32_t max_seqs, di_error *err) {
    memset(p, 0, sizeof *p);
    p->items = calloc((size_t)max_seqs, sizeof *p->items);
    if (!p->items) return di_error_set(err, DI_ERR_NOMEM, "step plan: out of memory for %d items", max_seqs);
    return DI_OK;
}

void di_step_plan_destroy(di_step_plan *p) {
    free(p->items);
    free(p->blocks);
    free(p->release);
    free(p->fills);
    memset(p, 0, sizeof *p);
}

int di_sched_init(di_scheduler *s, const di_sched_config *cfg, const di_model_runner *runner, di_error *err) {
    memset(s, 0, sizeof *s);
    if (cfg->max_seqs < 1 || cfg->prefill_chunk < 1 || cfg->max_step_tokens < cfg->prefill_chunk ||
        cfg->max_step_tokens < cfg->max_seqs)
        return di_error_set(err, DI_ERR_INVALID,
                            "scheduler: max_seqs %d, prefill_chunk %d, max_step_tokens %lld; expected max_seqs >= 1, "
                            "chunk >= 1 and a step budget of at least max(chunk, max_seqs)",
                            cfg->max_seqs, cfg->prefill_chunk, (long long)cfg->max_step_tokens);
    if (runner->max_context < 2 || runner->n_vocab < 1 || !runner->forward)
        return di_error_set(err, DI_ERR_INVALID, "scheduler: runner with context %lld, vocabulary %d%s",
                            (long long)runner->max_context, runner->n_vocab, runner->forward ? "" : ", no forward");
    s->cfg = *cfg;
    s->runner = runner;
    int rc = di_block_pool_init(&s->pool, runner->n_blocks, runner->block_tokens, err);
    if (rc) return rc;
    s->running = calloc((size_t)cfg->max_seqs, sizeof *s->running);
    s->cap_running = cfg->max_seqs;
    if (runner->prefix) s->block_ids = malloc(sizeof(int32_t) * (size_t)di_prefix_cache_block(runner->prefix));
    if (!s->running || (runner->prefix && !s->block_ids)) {
        di_sched_destroy(s);
        return di_error_set(err, DI_ERR_NOMEM, "scheduler: out of memory");
    }
    return DI_OK;
}

void di_sched_destroy(di_scheduler *s) {
    di_block_pool_destroy(&s->pool);
    free(s->waiting);
    free(s->running);
    free(s->release);
    free(s->fills);
    free(s->block_ids);
    memset(s, 0, sizeof *s);
}

int32_t di_sched_blocks_for(const di_scheduler *s, int64_t n_tokens) {
    if (s->runner->blocks_for_tokens) return s->runner->blocks_for_tokens(s->runner->ctx, n_tokens);
    return (int32_t)((n_tokens + s->pool.block_tokens - 1) / s->pool.block_tokens);
}

int di_sched_add(di_scheduler *s, di_seq *r, di_error *err) {
    const int64_t ctx = s->runner->max_context;
    if (r->n_prompt >= ctx)
        return di_error_set(err, DI_ERR_LIMIT, "request %lld: prompt of %lld tokens leaves no room in the context of %lld",
                            (long long)r->id, (long long)r->n_prompt, (long long)ctx);
    int64_t longest = r->n_prompt + r->params.max_tokens;
    if (longest > ctx) longest = ctx;
    int32_t need = di_sched_blocks_for(s, longest);
    if (need > s->pool.n_blocks)
        return di_error_set(err, DI_ERR_LIMIT, "request %lld: up to %lld positions need %d cache blocks, the pool has %d",
                            (long long)r->id, (long long)longest, need, s->pool.n_blocks);
    r->chunk = r->params.prefill_chunk ? r->params.prefill_chunk : s->cfg.prefill_chunk;
    if (r->chunk > s->cfg.max_step_tokens)
        return di_error_set(err, DI_ERR_INVALID, "request %lld: prefill chunk %d exceeds the step budget of %lld tokens",
                            (long long)r->id, r->chunk, (long long)s->cfg.max_step_tokens);
    if (waiting_reserve(s)) return di_error_set(err, DI_ERR_NOMEM, "scheduler: out of memory for the waiting queue");
    r->arrival = s->next_arrival++;
    r->state = DI_REQ_WAITING;
    waiting_push_back(s, r);
    return DI_OK;
}

static int push_release(di_scheduler *s, int64_t id) {
    if (grow_arr((void **)&s->release, &s->cap_release, s->n_release + 1, sizeof *s->release)) return DI_ERR_NOMEM;
    s->release[s->n_release++] = id;
    return DI_OK;
}

/* ---- prefix cache (the policy is at the top of scheduler.h) ---- */

/* Claims in the tree every block of r that is computed and whose ids are known, queueing a fill for
 * each new one. A full cache only stops this round; the next schedule tries again. */
static int publish(di_scheduler *s, di_seq *r, di_error *err) {
    di_prefix_cache *pc = s->runner->prefix;
    if (!pc) return DI_OK;
    const int64_t B = di_prefix_cache_block(pc);
    int64_t known = r->n_prompt + r->n_out;
    if (known > r->n_cached) known = r->n_cached;
    while ((r->prefix_blocks + 1) * B <= known) {
        const int64_t t0 = r->prefix_blocks * B;
        const int32_t *ids = r->prompt + t0;
        if (t0 + B > r->n_prompt) {
            for (int64_t i = 0; i < B; i++)
                s->block_ids[i] = t0 + i < r->n_prompt ? r->prompt[t0 + i] : r->out[t0 + i - r->n_prompt];
            ids = s->block_ids;
        }
        di_prefix_node *n;
        int created;
        int rc = di_prefix_cache_claim(pc, r->prefix_tail, ids, &n, &created, err);
        if (rc) return di_error_wrap(err, "scheduler: request %lld, prefix block at %lld", (long long)r->id, (long long)t0);
        if (!n) return DI_OK;
        if (created) {
            if (grow_arr((void **)&s->fills, &s->cap_fills, s->n_fills + 1, sizeof *s->fills)) {
                di_prefix_cache_settle(pc, n); /* never filled: dead, as a failed fill */
                return di_error_set(err, DI_ERR_NOMEM, "scheduler: out of memory for prefix fills");
            }
            s->fills[s->n_fills++] = (di_step_fill){.req_id = r->id, .t0 = t0, .node = n};
            di_prefix_cache_pin(n); /* the claim's pin stays with the fill, this one with the path */
        }
        if (r->prefix_tail) di_prefix_cache_unpin(r->prefix_tail);
        r->prefix_tail = n;
        r->prefix_blocks++;
    }
    return DI_OK;
}

/* r's cache is about to be dropped: publish what it computed, then let go of its path. */
static int prefix_leave(di_scheduler *s, di_seq *r, di_error *err) {
    if (!s->runner->prefix) return DI_OK;
    int rc = publish(s, r, err);
    if (r->prefix_tail) di_prefix_cache_unpin(r->prefix_tail);
    r->prefix_tail = NULL;
    r->prefix_blocks = 0;
    return rc;
}

/* Looks up a request about to be admitted from position 0: on a usable hit it is pinned in
 * r->prefix_hit and r->n_cached moves to the replay start. */
static int prefix_lookup(di_scheduler *s, di_seq *r, di_error *err) {
    di_prefix_cache *pc = s->runner->prefix;
    if (!pc || r->n_cached) return DI_OK;
    const int64_t keep = di_prefix_cache_keep(pc, NULL);
    int rc = di_prefix_cache_match(pc, r->prompt, r->n_prompt, keep, &r->prefix_hit, err);
    if (rc) return di_error_wrap(err, "scheduler: request %lld", (long long)r->id);
    const int64_t P = r->prefix_hit.tokens, start = di_prefix_replay_start(P, keep, di_prefix_cache_align(pc));
    if (P > 0 && P - start >= r->chunk) di_prefix_cache_release(pc, &r->prefix_hit); /* the replay needs one chunk */
    if (r->prefix_hit.tokens > 0) r->n_cached = start;
    return DI_OK;
}

/* Admission did not happen after all: the hit goes back. */
static void prefix_unlookup(di_scheduler *s, di_seq *r) {
    if (!r->prefix_hit.n_blocks) return;
    di_prefix_cache_release(s->runner->prefix, &r->prefix_hit);
    r->n_cached = 0;
}

/* r is admitted with its hit: its path starts at the hit's deepest block. */
static void prefix_admit(di_scheduler *s, di_seq *r) {
    if (!r->prefix_hit.n_blocks) return;
    r->prefix_tail = r->prefix_hit.nodes[r->prefix_hit.n_blocks - 1];
    di_prefix_cache_pin(r->prefix_tail);
    r->prefix_blocks = r->prefix_hit.n_blocks;
}

void di_sched_step_done(di_scheduler *s, const di_step_plan *p) {
    di_prefix_cache *pc = s->runner->prefix;
    if (!pc) return;
    for (int32_t i = 0; i < p->n_fills; i++) di_prefix_cache_settle(pc, p->fills[i].node);
    for (int32_t i = 0; i < p->n_items; i++)
        if (p->items[i].restores) di_prefix_cache_release(pc, &p->items[i].req->prefix_hit);
}

static void free_blocks(di_scheduler *s, di_seq *r) {
    di_block_pool_release(&s->pool, r->blocks, r->n_blocks);
    r->n_blocks = 0;
    r->n_cached = 0;
}

/* Inserts into `running` keeping arrival order (a readmitted request keeps its old seniority). */
static void running_insert(di_scheduler *s, di_seq *r) {
    int32_t i = s->n_running;
    while (i > 0 && s->running[i - 1]->arrival > r->arrival) {
        s->running[i] = s->running[i - 1];
        i--;
    }
    s->running[i] = r;
    s->n_running++;
}

static void running_remove(di_scheduler *s, int32_t i) {
    memmove(s->running + i, s->running + i + 1, (size_t)(s->n_running - i - 1) * sizeof *s->running);
    s->n_running--;
}

/* The newest running request goes back to the front of the waiting queue with no cache (what it
 * computed published to the prefix cache first). */
static int preempt_newest(di_scheduler *s, di_error *err) {
    di_seq *v = s->running[s->n_running - 1];
    int rc = prefix_leave(s, v, err);
    if (rc) return rc;
    if (waiting_reserve(s) || push_release(s, v->id))
        return di_error_set(err, DI_ERR_NOMEM, "scheduler: out of memory while preempting");
    free_blocks(s, v);
    s->n_running--;
    waiting_push_front(s, v);
    v->state = DI_REQ_WAITING;
    v->preemptions++;
    s->n_preemptions++;
    return DI_OK;
}

/* The next piece of r: *n positions from n_cached; 0 when r must wait for a result first. */
static int32_t next_piece(const di_scheduler *s, const di_seq *r, int32_t *samples) {
    int64_t len = di_seq_len(r), rest = len - r->n_cached;
    int32_t n = rest < r->chunk ? (int32_t)rest : r->chunk;
    /* a recompute piece ends at the prompt's end: its rows past it take the decode steps' layout,
     * the ones before it the prompt's (model/forward_internal.h), and a chunk has one layout */
    if (r->n_cached < r->n_prompt && r->n_cached + n > r->n_prompt) n = (int32_t)(r->n_prompt - r->n_cached);
    *samples = n == rest;
    if (*samples && (r->n_out + r->n_pending >= r->params.max_tokens || len >= s->runner->max_context)) return 0;
    return n;
}

/* Admission by pages: the pool's free blocks must hold r's whole known sequence (prompt, plus the
 * outputs of a preempted request), not just its first chunk — admitting on the first chunk alone
 * lets a long prompt in that then preempts the running requests (or itself) chunk after chunk.
 * (No extra headroom block: two prompts that exactly fill the pool are both admitted, and the
 * first output block is then taken by preemption as before.) */
static int admission_fits(const di_scheduler *s, const di_seq *r) {
    int64_t len = di_seq_len(r);
    if (len > s->runner->max_context) len = s->runner->max_context;
    return di_sched_blocks_for(s, len) - r->n_blocks <= s->pool.n_free;
}

/* Grows r's block table to cover `upto` positions. 0, or -1 when the pool is short. */
static int reserve(di_scheduler *s, di_seq *r, int64_t upto, int *nomem) {
    int32_t want = di_sched_blocks_for(s, upto);
    if (want <= r->n_blocks) return 0;
    if (want - r->n_blocks > s->pool.n_free) return -1;
    if (di_seq_reserve_blocks(r, want)) {
        *nomem = 1;
        return -1;
    }
    di_block_pool_alloc(&s->pool, want - r->n_blocks, r->blocks + r->n_blocks);
    r->n_blocks = want;
    return 0;
}

static int plan_add(di_scheduler *s, di_step_plan *p, di_seq *r, int32_t n, int32_t samples, int32_t restores) {
    int32_t nb = di_sched_blocks_for(s, r->n_cached + n);
    if (grow_arr((void **)&p->blocks, &p->cap_blocks, (int64_t)p->n_blocks + nb, sizeof *p->blocks)) return DI_ERR_NOMEM;
    di_sched_item *it = &p->items[p->n_items++];
    it->req = r;
    it->pos0 = r->n_cached;
    it->n_tokens = n;
    it->samples = samples;
    it->restores = restores;
    it->block_off = p->n_blocks;
    it->n_blocks = nb;
    if (nb) memcpy(p->blocks + p->n_blocks, r->blocks, (size_t)nb * sizeof *p->blocks);
    p->n_blocks += nb;
    p->n_tokens += n;
    p->n_samples += samples;
    return DI_OK;
}

int di_sched_schedule(di_scheduler *s, di_step_plan *p, di_error *err) {
    p->n_items = 0;
    p->n_tokens = 0;
    p->n_samples = 0;
    p->n_blocks = 0;
    p->n_release = 0;
    p->n_fills = 0;
    di_sched_reap(s);
    for (int32_t i = 0; i < s->n_running; i++) {
        int rc = publish(s, s->running[i], err);
        if (rc) return rc;
    }
    int64_t budget = s->cfg.max_step_tokens;
    int nomem = 0;

    /* 1. running, oldest first; preempt from the newest end when the pool runs dry */
    for (int32_t i = 0; i < s->n_running && p->n_items < s->cfg.max_seqs; i++) {
        di_seq *r = s->running[i];
        if (r->finish != DI_FINISH_REASON_NONE) continue; /* reaped once its last step is back */
        int32_t samples, n = next_piece(s, r, &samples);
        if (n == 0 || n > budget) continue;
        int self_preempted = 0;
        while (reserve(s, r, r->n_cached + n, &nomem)) {
            if (nomem) return di_error_set(err, DI_ERR_NOMEM, "scheduler: out of memory for block tables");
            if (s->running[s->n_running - 1]->inflight > 0) return DI_SCHED_NEED_SYNC;
            self_preempted = s->running[s->n_running - 1] == r;
            int rc = preempt_newest(s, err);
            if (rc) return rc;
            if (self_preempted) break;
        }
        if (self_preempted) break; /* r was the newest: nothing after it */
        if (plan_add(s, p, r, n, samples, 0)) return di_error_set(err, DI_ERR_NOMEM, "scheduler: out of memory for the plan");
        budget -= n;
    }

    /* 2. waiting, strictly FIFO; a prefix hit moves the first piece to the replay start */
    while (s->n_waiting > 0 && p->n_items < s->cfg.max_seqs && s->n_running < s->cfg.max_seqs) {
        di_seq *r = waiting_at(s, 0);
        int rc = prefix_lookup(s, r, err);
        if (rc) return rc;
        int32_t samples, n = next_piece(s, r, &samples);
        if (n == 0 || n > budget || !admission_fits(s, r)) {
            prefix_unlookup(s, r);
            break;
        }
        /* the plan's block list grows before anything changes hands, so running out of memory here
         * leaves the request waiting with nothing reserved or pinned (plan_add cannot fail below) */
        if (grow_arr((void **)&p->blocks, &p->cap_blocks, (int64_t)p->n_blocks + di_sched_blocks_for(s, r->n_cached + n),
                     sizeof *p->blocks)) {
            prefix_unlookup(s, r);
            return di_error_set(err, DI_ERR_NOMEM, "scheduler: out of memory for the plan");
        }
        if (reserve(s, r, r->n_cached + n, &nomem)) {
            prefix_unlookup(s, r);
            if (nomem) return di_error_set(err, DI_ERR_NOMEM, "scheduler: out of memory for block tables");
            break;
        }
        waiting_pop_front(s);
        r->state = DI_REQ_RUNNING;
        running_insert(s, r);
        prefix_admit(s, r);
        if (plan_add(s, p, r, n, samples, r->prefix_hit.n_blocks > 0))
            return di_error_set(err, DI_ERR_NOMEM, "scheduler: out of memory for the plan");
        budget -= n;
    }

    /* commit */
    for (int32_t i = 0; i < p->n_items; i++) {
        di_sched_item *it = &p->items[i];
        it->req->n_cached += it->n_tokens;
        it->req->n_pending += it->samples;
        it->req->inflight++;
    }
    if (grow_arr((void **)&p->release, &p->cap_release, s->n_release, sizeof *p->release))
        return di_error_set(err, DI_ERR_NOMEM, "scheduler: out of memory for releases");
    if (s->n_release) memcpy(p->release, s->release, (size_t)s->n_release * sizeof *p->release);
    p->n_release = s->n_release;
    s->n_release = 0;
    if (grow_arr((void **)&p->fills, &p->cap_fills, s->n_fills, sizeof *p->fills))
        return di_error_set(err, DI_ERR_NOMEM, "scheduler: out of memory for prefix fills");
    if (s->n_fills) memcpy(p->fills, s->fills, (size_t)s->n_fills * sizeof *p->fills);
    p->n_fills = s->n_fills;
    s->n_fills = 0;
    p->step = s->next_step++;
    if (p->n_items) s->n_steps++;
    return DI_OK;
}

int32_t di_sched_reap(di_scheduler *s) {
    int32_t n = 0;
    for (int32_t i = 0; i < s->n_running;) {
        di_seq *r = s->running[i];
        if (r->finish == DI_FINISH_REASON_NONE || r->inflight > 0) {
            i++;
            continue;
        }
        di_error ignored;
        prefix_leave(s, r, &ignored); /* on failure its last blocks are just not cached */
        push_release(s, r->id); /* on failure the runner just keeps a dead entry until it is reused */
        free_blocks(s, r);
        r->state = DI_REQ_FINISHED;
        running_remove(s, i);
        n++;
    }
    return n;
}

void di_sched_finish(di_scheduler *s, di_seq *r, di_finish_reason why) {
    if (r->finish == DI_FINISH_REASON_NONE) r->finish = why;
    if (r->state != DI_REQ_WAITING) return;
    waiting_remove(s, r);
    /* a preempted request still has a dead cache entry announced; a never-admitted one has none */
    r->state = DI_REQ_FINISHED;
}
