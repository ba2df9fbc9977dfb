/* Engine step loop (see engine_core.h). */
#include "engine/engine_core.h"

#include <stdlib.h>
#include <string.h>

#include "engine/idmap.h"

struct di_core {
    const di_model_runner *runner;
    di_core_options opt;
    int32_t *eos;               /* [opt.n_eos] */
    di_scheduler sched;
    di_executor *exec;
    di_step_plan plans[2];      /* the plan in flight and the one being prepared */
    int next_plan;
    di_idmap ids;               /* id → di_seq, every request not yet forgotten */
    di_seq **dirty;         /* [cap_dirty] requests with news for the next poll, in the order they got it */
    int32_t n_dirty, cap_dirty;
    di_seq **done;          /* [cap_done] reported finished, freed once no step holds them */
    int32_t n_done, cap_done;
    di_core_stats stats;
};

/* Frees a request the core accepted; its constraint's owner hears that the engine is done with it. */
static void forget(di_seq *r) {
    if (!r) return;
    const di_constraint *k = r->params.constraint;
    if (k && k->release) k->release(k->ctx);
    di_seq_free(r);
}

int di_core_new(const di_model_runner *runner, const di_core_options *opt, di_core **out, di_error *err) {
    *out = NULL;
    di_core *c = calloc(1, sizeof *c);
    if (!c) return di_error_set(err, DI_ERR_NOMEM, "engine: out of memory");
    c->runner = runner;
    c->opt = *opt;
    if (opt->n_eos < 0 || (opt->n_eos && !opt->eos_ids)) {
        free(c);
        return di_error_set(err, DI_ERR_INVALID, "engine: %d EOS ids without an array", opt->n_eos);
    }
    c->eos = malloc(((size_t)opt->n_eos + 1) * sizeof *c->eos);
    if (c->eos && opt->n_eos) memcpy(c->eos, opt->eos_ids, (size_t)opt->n_eos * sizeof *c->eos);
    c->opt.eos_ids = c->eos;
    di_idmap_init(&c->ids);
    int rc = c->eos ? DI_OK : di_error_set(err, DI_ERR_NOMEM, "engine: out of memory");
    if (!rc) rc = di_sched_init(&c->sched, &opt->sched, runner, err);
    if (!rc) rc = di_step_plan_init(&c->plans[0], opt->sched.max_seqs, err);
    if (!rc) rc = di_step_plan_init(&c->plans[1], opt->sched.max_seqs, err);
    if (!rc) rc = di_executor_new(runner, opt->sched.max_seqs, opt->async, opt->sample_threads, &c->exec, err);
    if (rc) {
        di_core_free(c);
        return rc;
    }
    *out = c;
    return DI_OK;
}

void di_core_free(di_core *c) {
    if (!c) return;
    if (c->exec) {
        di_executor_wait(c->exec);
        for (int64_t i = 0; i < c->ids.cap; i++) {
            di_seq *r = c->ids.vals[i];
            if (r && r->state == DI_REQ_RUNNING && c->runner->release) c->runner->release(c->runner->ctx, r->id);
        }
        di_executor_release(c->exec, c->sched.release, c->sched.n_release);
        di_executor_free(c->exec);
    }
    for (int64_t i = 0; i < c->ids.cap; i++) forget(c->ids.vals[i]);
    di_idmap_destroy(&c->ids);
    free(c->dirty);
    free(c->done);
    di_step_plan_destroy(&c->plans[0]);
    di_step_plan_destroy(&c->plans[1]);
    di_sched_destroy(&c->sched);
    free(c->eos);
    free(c);
}

static int push_list(di_seq ***list, int32_t *n, int32_t *cap, di_seq *r) {
    if (*n == *cap) {
        int32_t nc = *cap ? 2 * *cap : 64;
        di_seq **l = realloc(*list, (size_t)nc * sizeof *l);
        if (!l) return -1;
        *list = l;
        *cap = nc;
    }
    (*list)[(*n)++] = r;
    return 0;
}

/* A request gained tokens or finished. Out of memory here only delays its delta to a later mark. */
static void mark_dirty(di_core *c, di_seq *r) {
    if (r->dirty) return;
    if (!push_list(&c->dirty, &c->n_dirty, &c->cap_dirty, r)) r->dirty = 1;
}

int di_core_add(di_core *c, int64_t id, const int32_t *prompt, int64_t n_prompt, const di_seq_params *params,
                di_error *err) {
    if (di_idmap_get(&c->ids, id)) return di_error_set(err, DI_ERR_INVALID, "request %lld: id already in use", (long long)id);
    di_seq *r;
    int rc = di_seq_new(id, prompt, n_prompt, params, c->runner->n_vocab, &r, err);
    if (rc) return rc;
    if (di_idmap_put(&c->ids, id, r)) {
        di_seq_free(r);
        return di_error_set(err, DI_ERR_NOMEM, "engine: out of memory for request ids");
    }
    rc = di_sched_add(&c->sched, r, err);
    if (rc) {
        di_idmap_del(&c->ids, id);
        di_seq_free(r);
        return rc;
    }
    return DI_OK;
}

int di_core_cancel(di_core *c, int64_t id, di_error *err) {
    di_seq *r = di_idmap_get(&c->ids, id);
    if (!r || r->finish != DI_FINISH_REASON_NONE)
        return di_error_set(err, DI_ERR_INVALID, "request %lld: %s", (long long)id, r ? "already finished" : "unknown id");
    di_sched_finish(&c->sched, r, DI_FINISH_REASON_CANCELLED);
    mark_dirty(c, r);
    return DI_OK;
}

static void fail_request(di_core *c, di_seq *r, const di_error *e) {
    if (r->finish != DI_FINISH_REASON_NONE) return;
    mark_dirty(c, r);
    r->finish = DI_FINISH_REASON_ERROR;
    r->error = *e;
    if (!r->error.code) r->error.code = DI_ERR_INTERNAL;
}

/* Host side of a finished step: pieces leave flight, tokens reach their requests, stop checks. */
static int process(di_core *c, const di_step_result *res, di_error *err) {
    const di_step_plan *p = res->plan;
    if (!p) return DI_OK;
    di_sched_step_done(&c->sched, p);
    c->stats.forward_s += res->forward_s;
    c->stats.sample_s += res->sample_s;
    for (int32_t i = 0; i < p->n_items; i++) {
        di_seq *r = p->items[i].req;
        r->inflight--;
        c->stats.scheduled_tokens += p->items[i].n_tokens;
        if (!p->items[i].samples) c->stats.prefill_tokens += p->items[i].n_tokens;
        else c->stats.prefill_tokens += p->items[i].n_tokens - 1;
        if (res->status != DI_OK) {
            r->n_pending -= p->items[i].samples;
            fail_request(c, r, &res->err);
        }
    }
    if (res->status != DI_OK) return DI_OK; /* the requests carry the error; the engine goes on */
    /* hits come from the step's own result buffer, written by the worker before the step was done */
    for (int32_t i = 0; i < p->n_items; i++) {
        di_seq *r = p->items[i].req;
        if (res->cache_hit[i] > r->cache_hit) r->cache_hit = res->cache_hit[i];
    }
    for (int32_t i = 0; i < res->n_samples; i++) {
        const di_step_sample *s = &res->samples[i];
        di_seq *r = s->req;
        r->n_pending--;
        if (r->finish != DI_FINISH_REASON_NONE) {
            c->stats.wasted_samples++;
            continue;
        }
        if (s->status != DI_OK) {
            fail_request(c, r, &s->err);
            continue;
        }
        c->stats.sampled++;
        mark_dirty(c, r);
        int rc = di_seq_on_token(r, s->res.token, &s->res, c->eos, c->opt.n_eos, c->runner->max_context,
                                     c->opt.detok, c->opt.detok_ctx, err);
        if (rc) fail_request(c, r, err);
    }
    return DI_OK;
}

int di_core_step(di_core *c, di_error *err) {
    di_step_plan *p = &c->plans[c->next_plan];
    int rc = di_sched_schedule(&c->sched, p, err);
    if (rc == DI_SCHED_NEED_SYNC) {
        /* preemption must wait for the victim's step to finish writing its cache */
        c->stats.forced_syncs++;
        const di_step_result *prev = di_executor_wait(c->exec);
        if (prev) process(c, prev, err);
        rc = di_sched_schedule(&c->sched, p, err);
        if (rc == DI_SCHED_NEED_SYNC)
            return di_error_set(err, DI_ERR_INTERNAL, "engine: scheduler asked to sync with nothing in flight");
    }
    if (rc) return rc;
    const di_step_result *prev = di_executor_wait(c->exec);
    if (p->n_items || p->n_release || p->n_fills) {
        di_executor_submit(c->exec, p);
        c->next_plan ^= 1;
        if (p->n_items) c->stats.steps++;
    }
    if (prev) process(c, prev, err);
    if (!c->opt.async) {
        const di_step_result *now = di_executor_wait(c->exec);
        if (now) process(c, now, err);
    }
    c->stats.preemptions = c->sched.n_preemptions;
    return DI_OK;
}

int di_core_busy(const di_core *c) {
    if (di_executor_in_flight(c->exec) || c->sched.n_waiting) return 1;
    for (int32_t i = 0; i < c->sched.n_running; i++)
        if (c->sched.running[i]->finish == DI_FINISH_REASON_NONE || c->sched.running[i]->inflight) return 1;
    return 0;
}

int32_t di_core_poll(di_core *c, di_core_delta *out, int32_t max) {
    /* forget what was reported finished earlier (its pointers were valid until now) once no step
     * holds it any more */
    di_sched_reap(&c->sched);
    int32_t keep = 0;
    for (int32_t i = 0; i < c->n_done; i++) {
        di_seq *r = c->done[i];
        if (r->state == DI_REQ_FINISHED && !r->inflight) {
            di_idmap_del(&c->ids, r->id);
            forget(r);
        } else {
            c->done[keep++] = r;
        }
    }
    c->n_done = keep;
    int32_t n = 0, used = 0;
    for (; used < c->n_dirty && n < max; used++) {
        di_seq *r = c->dirty[used];
        r->dirty = 0;
        size_t ready = di_seq_text_ready(r);
        int report_finish = r->finish != DI_FINISH_REASON_NONE && !r->finish_reported;
        if (r->n_out_emitted == r->n_out && ready == r->n_text_emitted && !report_finish) continue;
        if (report_finish && push_list(&c->done, &c->n_done, &c->cap_done, r)) {
            r->dirty = 1; /* out of memory: report it next time */
            break;
        }
        di_core_delta *d = &out[n++];
        d->id = r->id;
        d->tokens = r->out ? r->out + r->n_out_emitted : NULL;
        d->logprobs = r->out_lp ? r->out_lp + r->n_out_emitted : NULL;
        d->n_tokens = r->n_out - r->n_out_emitted;
        d->text = r->text ? r->text + r->n_text_emitted : "";
        d->n_text = ready - r->n_text_emitted;
        d->finish = report_finish ? r->finish : DI_FINISH_REASON_NONE;
        d->error = r->finish == DI_FINISH_REASON_ERROR ? r->error.msg : NULL;
        d->preemptions = r->preemptions;
        d->cache_hit_tokens = r->cache_hit;
        r->n_out_emitted = r->n_out;
        r->n_text_emitted = ready;
        if (report_finish) r->finish_reported = 1;
    }
    if (used) memmove(c->dirty, c->dirty + used, (size_t)(c->n_dirty - used) * sizeof *c->dirty);
    c->n_dirty -= used;
    return n;
}

const di_core_stats *di_core_get_stats(const di_core *c) { return &c->stats; }
const di_scheduler *di_core_scheduler(const di_core *c) { return &c->sched; }
