/* Streaming-read bandwidth (tools/bench_read.h). */
#include "bench_read.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "util/log.h"

typedef struct rd_slice {
    const uint64_t *p; /* uint64 [n] */
    size_t n;
    uint64_t sum;
} rd_slice;

static void *rd_run(void *arg) {
    rd_slice *s = arg;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (size_t i = 0; i + 4 <= s->n; i += 4) a0 += s->p[i], a1 += s->p[i + 1], a2 += s->p[i + 2], a3 += s->p[i + 3];
    s->sum = a0 + a1 + a2 + a3;
    return NULL;
}

double bench_read_bandwidth(int n_threads, size_t bytes, int reps) {
    size_t n = bytes / sizeof(uint64_t);
    uint64_t *buf = malloc(bytes), sink = 0; /* uint64 [n] */
    if (!buf) return 0;
    for (size_t i = 0; i < n; i++) buf[i] = i; /* touch every page */
    rd_slice sl[256];
    pthread_t th[256];
    if (n_threads > 256) n_threads = 256;
    if (n_threads < 1) n_threads = 1;
    double best = 0;
    for (int rep = 0; rep < reps; rep++) {
        double t0 = di_now();
        for (int t = 0; t < n_threads; t++) {
            sl[t] = (rd_slice){buf + n / n_threads * t, n / n_threads, 0};
            if (t) pthread_create(&th[t], NULL, rd_run, &sl[t]);
        }
        rd_run(&sl[0]);
        for (int t = 1; t < n_threads; t++) pthread_join(th[t], NULL);
        double dt = di_now() - t0;
        for (int t = 0; t < n_threads; t++) sink += sl[t].sum;
        if (dt > 0 && (double)bytes / dt > best) best = (double)bytes / dt;
    }
    free(buf);
    if (sink == 42) fputc(' ', stderr); /* keeps the sums observable */
    return best;
}
