/* Persistent pthread pool: workers sleep on a condition variable between jobs and pull task
 * indices from an atomic counter while a job runs. */
#include "util/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "util/error.h"

struct di_threadpool {
    int n_threads;             /* total, including the caller */
    pthread_t *workers;        /* [n_threads − 1] */
    pthread_mutex_t mu;
    pthread_cond_t wake;       /* a new job (or shutdown) was published */
    pthread_cond_t done;       /* the last worker left the current job */
    uint64_t generation;       /* bumped once per job, guarded by mu */
    int shutdown;              /* guarded by mu */
    int busy_workers;          /* workers still inside the current job, guarded by mu */
    /* the current job; written by the caller before the generation bump */
    di_task_fn fn;
    void *ctx;
    int64_t n_tasks;
    atomic_int_fast64_t next;  /* next task index to hand out */
};

typedef struct {
    di_threadpool *pool;
    int index;                 /* 1 .. n_threads − 1 (the caller is thread 0) */
} worker_arg;

static void drain(di_threadpool *p, int thread) {
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= p->n_tasks) return;
        p->fn(p->ctx, t, thread);
    }
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    di_threadpool *p = wa->pool;
    int index = wa->index;
    free(wa);
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->shutdown && p->generation == seen) pthread_cond_wait(&p->wake, &p->mu);
        if (p->shutdown) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        drain(p, index);
        pthread_mutex_lock(&p->mu);
        if (--p->busy_workers == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int di_threadpool_create(int n_threads, di_threadpool **out, di_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > DI_THREADPOOL_MAX)
        return di_error_set(err, DI_ERR_INVALID, "threadpool: thread count %d outside [1, %d]", n_threads,
                            DI_THREADPOOL_MAX);
    di_threadpool *p = calloc(1, sizeof *p);
    if (!p) return di_error_set(err, DI_ERR_NOMEM, "threadpool: out of memory");
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->next, 0);
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    if (!p->workers) {
        p->n_threads = 1; /* no worker was started: destroy must join none */
        di_threadpool_destroy(p);
        return di_error_set(err, DI_ERR_NOMEM, "threadpool: out of memory");
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        int rc = wa ? 0 : -1;
        if (wa) {
            wa->pool = p;
            wa->index = i;
            rc = pthread_create(&p->workers[i - 1], NULL, worker_main, wa);
            if (rc) free(wa);
        }
        if (rc) {
            p->n_threads = i; /* join only the workers that exist */
            di_threadpool_destroy(p);
            return di_error_set(err, DI_ERR_LIMIT, "threadpool: could not start worker %d of %d", i,
                                n_threads - 1);
        }
    }
    *out = p;
    return DI_OK;
}

void di_threadpool_destroy(di_threadpool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->shutdown = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->workers[i - 1], NULL);
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    free(p);
}

int di_threadpool_size(const di_threadpool *p) { return p ? p->n_threads : 1; }

void di_threadpool_run(di_threadpool *p, int64_t n_tasks, di_task_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    p->busy_workers = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    drain(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->busy_workers > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
