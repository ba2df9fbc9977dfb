/* Thread pool: every task runs exactly once, thread indices stay in range, the pool survives many
 * jobs, and bad sizes are refused.  di-test: asan */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "util/threadpool.h"

typedef struct {
    int n_threads;
    atomic_int *hits;        /* [n_tasks] times each task ran */
    atomic_int per_thread[8]; /* tasks run by each thread index */
    atomic_int bad_thread;
} count_job;

static void count_task(void *ctx, int64_t task, int thread) {
    count_job *j = ctx;
    atomic_fetch_add(&j->hits[task], 1);
    if (thread < 0 || thread >= j->n_threads) atomic_fetch_add(&j->bad_thread, 1);
    else atomic_fetch_add(&j->per_thread[thread], 1);
}

static void run_counted(di_threadpool *tp, int64_t n_tasks) {
    count_job j;
    memset(&j, 0, sizeof j);
    j.n_threads = di_threadpool_size(tp);
    j.hits = calloc((size_t)(n_tasks ? n_tasks : 1), sizeof *j.hits);
    di_threadpool_run(tp, n_tasks, count_task, &j);
    for (int64_t t = 0; t < n_tasks; t++)
        if (atomic_load(&j.hits[t]) != 1) fail_msg("task %lld ran %d times", (long long)t, atomic_load(&j.hits[t]));
    assert_int_equal(atomic_load(&j.bad_thread), 0);
    int64_t total = 0;
    for (int i = 0; i < j.n_threads; i++) total += atomic_load(&j.per_thread[i]);
    assert_int_equal(total, n_tasks);
    free(j.hits);
}

static void test_every_task_once(void **state) {
    (void)state;
    run_counted(NULL, 17);
    for (int n = 1; n <= 4; n++) {
        di_threadpool *tp;
        di_error err = {0};
        assert_int_equal(di_threadpool_create(n, &tp, &err), DI_OK);
        assert_int_equal(di_threadpool_size(tp), n);
        int64_t sizes[] = {0, 1, 2, 3, 7, 64, 1000};
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) run_counted(tp, sizes[i]);
        /* many short jobs back to back: no lost wake-ups, no task from one job leaking into the next */
        for (int r = 0; r < 2000; r++) run_counted(tp, 1 + r % 9);
        di_threadpool_destroy(tp);
    }
}

/* A job whose tasks write disjoint outputs: the pattern every kernel uses. */
typedef struct {
    double *out;
} sq_job;
static void sq_task(void *ctx, int64_t task, int thread) {
    (void)thread;
    sq_job *j = ctx;
    double s = 0;
    for (int i = 0; i <= task; i++) s += 1.0 / (1 + i);
    j->out[task] = s;
}

static void test_results_independent_of_threads(void **state) {
    (void)state;
    enum { N = 500 };
    double ref[N], got[N];
    sq_job j = {ref};
    di_threadpool_run(NULL, N, sq_task, &j);
    for (int n = 2; n <= 4; n++) {
        di_threadpool *tp;
        assert_int_equal(di_threadpool_create(n, &tp, NULL), DI_OK);
        j.out = got;
        di_threadpool_run(tp, N, sq_task, &j);
        assert_memory_equal(ref, got, sizeof ref);
        di_threadpool_destroy(tp);
    }
}

static void test_bad_sizes(void **state) {
    (void)state;
    di_threadpool *tp = (di_threadpool *)1;
    di_error err = {0};
    assert_int_equal(di_threadpool_create(0, &tp, &err), DI_ERR_INVALID);
    assert_null(tp);
    assert_non_null(strstr(err.msg, "thread count 0"));
    assert_int_equal(di_threadpool_create(DI_THREADPOOL_MAX + 1, &tp, &err), DI_ERR_INVALID);
    di_threadpool_destroy(NULL); /* accepted */
    assert_int_equal(di_threadpool_size(NULL), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_task_once),
        cmocka_unit_test(test_results_independent_of_threads),
        cmocka_unit_test(test_bad_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
