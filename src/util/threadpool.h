/* A small persistent pthread pool for the CPU backend.
 *
 * One job at a time: di_threadpool_run(pool, n_tasks, fn, ctx) calls fn(ctx, task, thread) for every
 * task in [0, n_tasks) and returns when all have finished. The calling thread works too, so a pool
 * of n threads starts n − 1 workers. Tasks are handed out through an atomic counter (load
 * balancing), which means WHICH thread runs a task is not fixed — kernels must therefore make every
 * output element the work of exactly one task with a fixed arithmetic order (partition outputs,
 * never split a reduction), so results are identical for any thread count.
 *
 * `thread` is in [0, di_threadpool_size(pool)) and lets a task use per-thread scratch.
 * A NULL pool means "run every task on the calling thread" (thread index 0). */
#ifndef DI_UTIL_THREADPOOL_H
#define DI_UTIL_THREADPOOL_H

#include <stdint.h>

#include "deepinfer.h"

typedef struct di_threadpool di_threadpool;

typedef void (*di_task_fn)(void *ctx, int64_t task, int thread);

/* n_threads ≥ 1 (total, including the caller); at most DI_THREADPOOL_MAX. */
#define DI_THREADPOOL_MAX 256
int di_threadpool_create(int n_threads, di_threadpool **out, di_error *err);
/* Joins the workers. NULL is accepted. Must not be called while a job runs. */
void di_threadpool_destroy(di_threadpool *pool);
/* Total threads (1 for a NULL pool). */
int di_threadpool_size(const di_threadpool *pool);
/* Runs the job to completion. Not reentrant: a task must not call di_threadpool_run on the same
 * pool (nested calls with a NULL pool are fine). */
void di_threadpool_run(di_threadpool *pool, int64_t n_tasks, di_task_fn fn, void *ctx);

#endif
