/* Step executor (see executor.h). */
#include "engine/executor.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_sample.h"
#include "util/log.h"
#include "util/threadpool.h"

/* The CUDA sampler is linked only into CUDA builds (cuda.mk: deepinfer-cuda, the CUDA tests): weak
 * references, NULL in a CPU-only binary, as backend_select.c does for the backend itself. */
extern int di_cuda_sampler_new(int32_t n_vocab, int32_t n_slots, di_cuda_sampler **out, di_error *err)
    __attribute__((weak));
extern void di_cuda_sampler_free(di_cuda_sampler *s) __attribute__((weak));
extern int di_cuda_sampler_sample(di_cuda_sampler *s, const float *d_logits, int32_t n_rows, const di_sample_row *rows,
                                  di_sample_result *out, di_error *row_err, void *stream, di_error *err)
    __attribute__((weak));

struct di_executor {
    const di_model_runner *runner;
    int32_t max_seqs;
    int async;
    di_threadpool *pool;    /* sampling threads (NULL: the executor's own thread) */
    di_sampler **samplers;  /* [pool size] one scratch per sampling thread */
    float *logits;          /* [max_seqs, n_vocab] f32 host logits (NULL when every step samples on the device) */
    /* device sampling (runner.h device_logits; NULL gpu: every row on the host) */
    di_cuda_sampler *gpu;
    di_sample_row *gpu_rows;   /* [max_seqs] one descriptor per logits row */
    di_sample_result *gpu_res; /* [max_seqs] */
    di_error *gpu_err;         /* [max_seqs] per-row status of the device call */
    uint32_t *masks;        /* [max_seqs, mask_words] u32 grammar mask of each sampled row */
    size_t mask_words;
    int32_t *mask_rc;       /* [max_seqs] status of a mask filled ahead (masks_ready) */
    int masks_ready;        /* this step's masks were filled alongside the forward */
    int32_t *row_item;      /* [max_seqs] plan item of each sampled row */
    int32_t *seq_of_item;   /* [max_seqs] batch index of each plan item, −1 = dropped */
    di_step_seq *seqs;      /* [max_seqs] */
    int32_t *tokens;        /* [cap_tokens] int32 resolved inputs of the step */
    int64_t cap_tokens;
    di_step_result res[2];  /* double-buffered: the host reads step n while step n+1 fills the other */
    int cur;                /* res[cur] belongs to the last submitted step */
    const di_step_plan *job;
    int in_flight;          /* submitted, not yet waited for */
    /* worker */
    pthread_t thread;
    int have_thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int job_ready, job_done, quit;
};

typedef struct sample_job {
    di_executor *e;
    const di_step_plan *p;
    di_step_result *res;
} sample_job;

/* Samples row k of the step (plan item e->row_item[k]) with the scratch of `thread`. */
static void sample_task(void *ctx, int64_t k, int thread) {
    sample_job *j = ctx;
    di_executor *e = j->e;
    const int32_t i = e->row_item[k], seq = e->seq_of_item[i];
    const di_sched_item *it = &j->p->items[i];
    di_seq *r = it->req;
    di_step_sample *out = &j->res->samples[k];
    out->req = r;
    if (!e->masks_ready) { /* else overlap_task cleared it and may have left a mask error in it */
        out->err.code = 0;
        out->err.msg[0] = 0;
    }
    di_error *err = &out->err;
    uint32_t *mask = NULL;
    if (seq < 0) {
        out->status = di_error_set(err, DI_ERR_INVALID, "request %lld: dropped from step %llu, its previous token "
                                   "was not sampled", (long long)r->id, (unsigned long long)j->p->step);
        return;
    }
    int src = DI_OK;
    if (r->params.constraint) {
        mask = e->masks + (size_t)k * e->mask_words;
        src = e->masks_ready ? e->mask_rc[k] : r->params.constraint->fill_mask(r->params.constraint->ctx, mask, err);
    }
    const int64_t pos = it->pos0 + it->n_tokens;
    if (!src && pos - r->n_prompt != r->n_dev_out)
        src = di_error_set(err, DI_ERR_INTERNAL, "request %lld: sampling position %lld with %lld outputs",
                           (long long)r->id, (long long)pos, (long long)r->n_dev_out);
    di_sample_row row = {.logits = e->logits + (size_t)e->seqs[seq].logits_row * (size_t)e->runner->n_vocab,
                         .params = &r->params.sampling,
                         .prompt = r->prompt,
                         .n_prompt = r->n_prompt,
                         .output = r->dev_out,
                         .n_output = r->n_dev_out,
                         .mask = mask,
                         .position = pos,
                         .choice = r->params.choice};
    if (!src) src = di_sampler_sample(e->samplers[thread], &row, &out->res, err);
    if (!src && r->params.constraint) src = r->params.constraint->accept(r->params.constraint->ctx, out->res.token, err);
    if (!src && di_seq_dev_push(r, out->res.token))
        src = di_error_set(err, DI_ERR_NOMEM, "request %lld: out of memory for sampled ids", (long long)r->id);
    out->status = src;
}

typedef struct overlap_job {
    di_executor *e;
    const di_step_plan *p;
    di_step_result *res;
    const di_step_batch *batch;
    int forward_rc;
} overlap_job;

/* Fills the grammar mask of sampled row k ahead of its sampling (e->masks_ready): status in mask_rc[k],
 * message in the row's err. */
static void fill_row_mask(di_executor *e, const di_step_plan *p, di_step_result *res, int64_t k) {
    const int32_t i = e->row_item[k];
    const di_seq *r = p->items[i].req;
    di_step_sample *out = &res->samples[k];
    out->err.code = 0;
    out->err.msg[0] = 0;
    e->mask_rc[k] = DI_OK;
    if (r->params.constraint && e->seq_of_item[i] >= 0)
        e->mask_rc[k] = r->params.constraint->fill_mask(r->params.constraint->ctx, e->masks + (size_t)k * e->mask_words,
                                                        &out->err);
}

/* Task 0 runs the forward (host logits, or none when the step samples on the device); task 1 + k fills
 * the grammar mask of sampled row k. */
static void overlap_task(void *ctx, int64_t task, int thread) {
    (void)thread;
    overlap_job *j = ctx;
    di_executor *e = j->e;
    if (task == 0) {
        j->forward_rc = e->runner->forward(e->runner->ctx, j->batch, e->gpu ? NULL : e->logits, &j->res->err);
        return;
    }
    fill_row_mask(e, j->p, j->res, task - 1);
}

static void mask_task(void *ctx, int64_t k, int thread) {
    (void)thread;
    sample_job *j = ctx;
    fill_row_mask(j->e, j->p, j->res, k);
}

/* ---- sampling on the device ----
 * The step's rows are sampled by one di_cuda_sampler_sample call over the runner's device logits (the
 * same result as di_sampler_sample bit for bit: cuda_sample.h), in three phases: the masks (filled
 * alongside the forward with a pool, else here), then on the host per row the checks sample_task
 * makes and the row's descriptor, then the device call, then per row the constraint's accept and the
 * push — exactly what sample_task does around di_sampler_sample. Every logits row goes to the device:
 * a row that failed before sampling (its mask, the position check) is sent as a greedy row and its
 * result dropped, so the call's rows are the logits rows as they lie. */
static const di_sampling_params k_greedy_placeholder = {.temperature = 0.0f};

static void device_prepare_task(void *ctx, int64_t k, int thread) {
    (void)thread;
    sample_job *j = ctx;
    di_executor *e = j->e;
    const int32_t i = e->row_item[k], seq = e->seq_of_item[i];
    const di_sched_item *it = &j->p->items[i];
    di_seq *r = it->req;
    di_step_sample *out = &j->res->samples[k];
    out->req = r;
    memset(&out->res, 0, sizeof out->res);
    if (!e->masks_ready) {
        out->err.code = 0;
        out->err.msg[0] = 0;
    }
    if (seq < 0) {
        out->status = di_error_set(&out->err, DI_ERR_INVALID, "request %lld: dropped from step %llu, its previous "
                                   "token was not sampled", (long long)r->id, (unsigned long long)j->p->step);
        return;
    }
    const int32_t row = e->seqs[seq].logits_row;
    const int64_t pos = it->pos0 + it->n_tokens;
    int src = r->params.constraint && e->masks_ready ? e->mask_rc[k] : DI_OK;
    if (!src && pos - r->n_prompt != r->n_dev_out)
        src = di_error_set(&out->err, DI_ERR_INTERNAL, "request %lld: sampling position %lld with %lld outputs",
                           (long long)r->id, (long long)pos, (long long)r->n_dev_out);
    out->status = src;
    e->gpu_rows[row] = src ? (di_sample_row){.params = &k_greedy_placeholder, .position = pos}
                           : (di_sample_row){.params = &r->params.sampling,
                                             .prompt = r->prompt,
                                             .n_prompt = r->n_prompt,
                                             .output = r->dev_out,
                                             .n_output = r->n_dev_out,
                                             .mask = r->params.constraint ? e->masks + (size_t)k * e->mask_words : NULL,
                                             .position = pos,
                                             .choice = r->params.choice};
}

static void device_finish_task(void *ctx, int64_t k, int thread) {
    (void)thread;
    sample_job *j = ctx;
    di_executor *e = j->e;
    const int32_t i = e->row_item[k], seq = e->seq_of_item[i];
    di_step_sample *out = &j->res->samples[k];
    if (seq < 0 || out->status) return; /* failed in device_prepare_task */
    const int32_t row = e->seqs[seq].logits_row;
    di_seq *r = out->req;
    di_error *err = &out->err;
    int src = DI_OK;
    if (e->gpu_err[row].code) {
        *err = e->gpu_err[row];
        src = err->code;
        di_error_wrap(err, "request %lld", (long long)r->id);
    } else {
        out->res = e->gpu_res[row];
    }
    if (!src && r->params.constraint) src = r->params.constraint->accept(r->params.constraint->ctx, out->res.token, err);
    if (!src && di_seq_dev_push(r, out->res.token))
        src = di_error_set(err, DI_ERR_NOMEM, "request %lld: out of memory for sampled ids", (long long)r->id);
    out->status = src;
}

static void sample_on_device(di_executor *e, const di_step_plan *p, di_step_result *res, int32_t n_rows,
                             int n_constrained) {
    sample_job job = {e, p, res};
    if (n_constrained && !e->masks_ready) {
        di_threadpool_run(e->pool, res->n_samples, mask_task, &job);
        e->masks_ready = 1;
    }
    di_threadpool_run(e->pool, res->n_samples, device_prepare_task, &job);
    void *stream = NULL;
    const float *d_logits = e->runner->device_logits(e->runner->ctx, &stream);
    di_error derr = {0};
    int rc = n_rows ? di_cuda_sampler_sample(e->gpu, d_logits, n_rows, e->gpu_rows, e->gpu_res, e->gpu_err, stream,
                                             &derr)
                    : DI_OK;
    if (rc) {
        /* a device error, not a row's: every row of the step fails with it */
        for (int32_t row = 0; row < n_rows; row++) e->gpu_err[row] = derr;
    }
    di_threadpool_run(e->pool, res->n_samples, device_finish_task, &job);
}

static void run_step(di_executor *e, const di_step_plan *p, di_step_result *res) {
    const di_model_runner *m = e->runner;
    res->step = p->step;
    res->plan = p;
    res->status = DI_OK;
    res->err.code = 0;
    res->err.msg[0] = 0;
    res->n_samples = 0;
    /* fills before releases: a finished request's last blocks are written before its cache goes */
    if (p->n_fills && m->prefix_fill) m->prefix_fill(m->ctx, p->fills, p->n_fills);
    for (int32_t i = 0; i < p->n_release; i++)
        if (m->release) m->release(m->ctx, p->release[i]);
    if (p->n_items == 0) return;
    if (p->n_tokens > e->cap_tokens) {
        int32_t *t = realloc(e->tokens, (size_t)p->n_tokens * sizeof *t);
        if (!t) {
            res->status = di_error_set(&res->err, DI_ERR_NOMEM, "step %llu: out of memory for %lld input tokens",
                                       (unsigned long long)p->step, (long long)p->n_tokens);
            return;
        }
        e->tokens = t;
        e->cap_tokens = p->n_tokens;
    }
    /* inputs: prompt positions from the prompt, later ones from the worker's own sampled ids. A piece
     * whose input token was never sampled (async: its request's previous row failed, the host will
     * learn so with this step's predecessor) is dropped from the batch, not allowed to fail it. */
    int64_t off = 0;
    int32_t rows = 0, n_seqs = 0;
    for (int32_t i = 0; i < p->n_items; i++) {
        const di_sched_item *it = &p->items[i];
        const di_seq *r = it->req;
        e->seq_of_item[i] = -1;
        if (it->pos0 + it->n_tokens - r->n_prompt > r->n_dev_out) continue;
        for (int32_t j = 0; j < it->n_tokens; j++) {
            int64_t pos = it->pos0 + j;
            e->tokens[off + j] = pos < r->n_prompt ? r->prompt[pos] : r->dev_out[pos - r->n_prompt];
        }
        e->seq_of_item[i] = n_seqs;
        e->seqs[n_seqs++] = (di_step_seq){.req_id = r->id,
                                          .pos0 = it->pos0,
                                          .n_tokens = it->n_tokens,
                                          .tokens = e->tokens + off,
                                          .n_prompt = r->n_prompt,
                                          .blocks = p->blocks + it->block_off,
                                          .n_blocks = it->n_blocks,
                                          .logits_row = it->samples ? rows++ : -1,
                                          .fed_back = it->pos0 >= r->n_prompt && it->pos0 == r->n_prompt + r->n_dev_out - 1,
                                          .restore = it->restores ? &r->prefix_hit : NULL,
                                          .restore_ids = it->restores ? r->prompt : NULL};
        off += it->n_tokens;
    }
    di_step_batch batch = {p->step, n_seqs, e->seqs, off, rows};
    res->n_samples = 0;
    int n_constrained = 0;
    for (int32_t i = 0; i < p->n_items; i++) {
        if (!p->items[i].samples) continue;
        n_constrained += p->items[i].req->params.constraint != NULL && e->seq_of_item[i] >= 0;
        e->row_item[res->n_samples++] = i;
    }
    double t0 = di_now();
    int rc;
    e->masks_ready = 0;
    if (n_constrained && e->pool && n_seqs) {
        /* grammar masks depend only on the tokens accepted so far: fill them while the model runs */
        overlap_job oj = {e, p, res, &batch, DI_OK};
        di_threadpool_run(e->pool, 1 + res->n_samples, overlap_task, &oj);
        rc = oj.forward_rc;
        e->masks_ready = 1;
    } else {
        rc = n_seqs ? m->forward(m->ctx, &batch, e->gpu ? NULL : e->logits, &res->err) : DI_OK;
    }
    double t1 = di_now();
    res->forward_s = t1 - t0;
    if (rc) {
        res->status = rc;
        return;
    }
    for (int32_t i = 0; i < p->n_items; i++) {
        int64_t hit = m->cache_hit && e->seq_of_item[i] >= 0 ? m->cache_hit(m->ctx, p->items[i].req->id) : 0;
        res->cache_hit[i] = hit > 0 ? hit : 0;
    }
    if (e->gpu) {
        sample_on_device(e, p, res, rows, n_constrained);
    } else {
        /* one task per sampled row; rows are independent, so the thread count changes nothing */
        sample_job job = {e, p, res};
        di_threadpool_run(e->pool, res->n_samples, sample_task, &job);
    }
    res->sample_s = di_now() - t1;
}

static void *worker_main(void *arg) {
    di_executor *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->job_ready && !e->quit) pthread_cond_wait(&e->cv, &e->mu);
        if (e->job_ready) {
            e->job_ready = 0;
            const di_step_plan *p = e->job;
            di_step_result *res = &e->res[e->cur];
            pthread_mutex_unlock(&e->mu);
            run_step(e, p, res);
            pthread_mutex_lock(&e->mu);
            e->job_done = 1;
            pthread_cond_broadcast(&e->cv);
            continue;
        }
        break; /* quit with no job pending */
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

int di_executor_new(const di_model_runner *runner, int32_t max_seqs, int async, int sample_threads, di_executor **out,
                    di_error *err) {
    *out = NULL;
    di_executor *e = calloc(1, sizeof *e);
    if (!e) return di_error_set(err, DI_ERR_NOMEM, "executor: out of memory");
    e->runner = runner;
    e->max_seqs = max_seqs;
    e->async = async;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    int rc = DI_OK;
    if (sample_threads > 1) rc = di_threadpool_create(sample_threads, &e->pool, err);
    if (rc) {
        di_executor_free(e);
        return rc;
    }
    const int nt = di_threadpool_size(e->pool);
    /* DI_CUDA_SAMPLER: unset = on the device when the runner keeps its logits there and this binary has
     * the CUDA sampler; "off" = always on the host (tests compare the two); "require" = fail unless on
     * the device */
    const char *mode = getenv("DI_CUDA_SAMPLER");
    const bool off = mode && !strcmp(mode, "off"), require = mode && !strcmp(mode, "require");
    if (!off && runner->device_logits && di_cuda_sampler_new && di_cuda_sampler_sample) {
        /* a slot per row in flight (2.7 MB each at V = 129,280), at most two per SM (n_slots 0) */
        rc = di_cuda_sampler_new(runner->n_vocab, max_seqs <= 256 ? max_seqs : 0, &e->gpu, err);
        if (rc) {
            di_error_wrap(err, "executor: device sampler");
            di_executor_free(e);
            return rc;
        }
    }
    if (require && !e->gpu) {
        di_executor_free(e);
        return di_error_set(err, DI_ERR_UNSUPPORTED, "executor: DI_CUDA_SAMPLER=require, but %s",
                            !runner->device_logits ? "the model runner keeps no logits on a device"
                                                   : "this binary was built without the CUDA sampler");
    }
    e->mask_words = ((size_t)runner->n_vocab + 31) / 32;
    e->samplers = calloc((size_t)nt, sizeof *e->samplers);
    e->logits = e->gpu ? NULL : malloc((size_t)max_seqs * (size_t)runner->n_vocab * sizeof *e->logits);
    if (e->gpu) {
        e->gpu_rows = calloc((size_t)max_seqs, sizeof *e->gpu_rows);
        e->gpu_res = calloc((size_t)max_seqs, sizeof *e->gpu_res);
        e->gpu_err = calloc((size_t)max_seqs, sizeof *e->gpu_err);
        if (!e->gpu_rows || !e->gpu_res || !e->gpu_err) {
            di_executor_free(e);
            return di_error_set(err, DI_ERR_NOMEM, "executor: out of memory for %d device rows", max_seqs);
        }
    }
    e->masks = malloc((size_t)max_seqs * e->mask_words * sizeof *e->masks);
    e->mask_rc = malloc((size_t)max_seqs * sizeof *e->mask_rc);
    e->row_item = malloc((size_t)max_seqs * sizeof *e->row_item);
    e->seq_of_item = malloc((size_t)max_seqs * sizeof *e->seq_of_item);
    e->seqs = calloc((size_t)max_seqs, sizeof *e->seqs);
    e->res[0].samples = calloc((size_t)max_seqs, sizeof *e->res[0].samples);
    e->res[1].samples = calloc((size_t)max_seqs, sizeof *e->res[1].samples);
    e->res[0].cache_hit = calloc((size_t)max_seqs, sizeof *e->res[0].cache_hit);
    e->res[1].cache_hit = calloc((size_t)max_seqs, sizeof *e->res[1].cache_hit);
    if (!e->res[0].cache_hit || !e->res[1].cache_hit || !e->samplers || (!e->logits && !e->gpu) || !e->masks || !e->mask_rc || !e->row_item || !e->seq_of_item || !e->seqs || !e->res[0].samples || !e->res[1].samples) {
        di_executor_free(e);
        return di_error_set(err, DI_ERR_NOMEM, "executor: out of memory for %d logits rows of %d", max_seqs,
                            runner->n_vocab);
    }
    for (int t = 0; t < nt && !rc; t++) rc = di_sampler_new(runner->n_vocab, &e->samplers[t], err);
    if (rc) {
        di_executor_free(e);
        return rc;
    }
    if (async) {
        if (pthread_create(&e->thread, NULL, worker_main, e)) {
            di_executor_free(e);
            return di_error_set(err, DI_ERR_INTERNAL, "executor: cannot start the worker thread");
        }
        e->have_thread = 1;
    }
    *out = e;
    return DI_OK;
}

void di_executor_free(di_executor *e) {
    if (!e) return;
    if (e->have_thread) {
        di_executor_wait(e);
        pthread_mutex_lock(&e->mu);
        e->quit = 1;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    for (int t = 0; e->samplers && t < di_threadpool_size(e->pool); t++) di_sampler_free(e->samplers[t]);
    free(e->samplers);
    di_threadpool_destroy(e->pool);
    free(e->logits);
    if (e->gpu) di_cuda_sampler_free(e->gpu);
    free(e->gpu_rows);
    free(e->gpu_res);
    free(e->gpu_err);
    free(e->masks);
    free(e->mask_rc);
    free(e->row_item);
    free(e->seq_of_item);
    free(e->seqs);
    free(e->tokens);
    free(e->res[0].samples);
    free(e->res[1].samples);
    free(e->res[0].cache_hit);
    free(e->res[1].cache_hit);
    free(e);
}

void di_executor_submit(di_executor *e, const di_step_plan *plan) {
    if (e->in_flight) di_executor_wait(e);
    e->cur ^= 1;
    e->in_flight = 1;
    if (!e->async) {
        run_step(e, plan, &e->res[e->cur]);
        return;
    }
    pthread_mutex_lock(&e->mu);
    e->job = plan;
    e->job_done = 0;
    e->job_ready = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

const di_step_result *di_executor_wait(di_executor *e) {
    if (!e->in_flight) return NULL;
    if (e->async) {
        pthread_mutex_lock(&e->mu);
        while (!e->job_done) pthread_cond_wait(&e->cv, &e->mu);
        pthread_mutex_unlock(&e->mu);
    }
    e->in_flight = 0;
    return &e->res[e->cur];
}

int di_executor_in_flight(const di_executor *e) { return e->in_flight; }

void di_executor_release(di_executor *e, const int64_t *ids, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (e->runner->release) e->runner->release(e->runner->ctx, ids[i]);
}
