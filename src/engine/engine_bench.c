/* Engine benchmark core (see engine_bench.h). */
#include "engine/engine_bench.h"

#include <stdlib.h>
#include <string.h>

#include "util/log.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentiles p50, p90, p99 of v[0..n) (sorted in place); zeros when n == 0. */
static void percentiles(double *v, int64_t n, double out[3]) {
    static const double q[3] = {0.50, 0.90, 0.99};
    out[0] = out[1] = out[2] = 0.0;
    if (n <= 0) return;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    for (int i = 0; i < 3; i++) {
        int64_t k = (int64_t)(q[i] * (double)n + 0.999999);
        if (k < 1) k = 1;
        out[i] = v[k - 1];
    }
}

int di_engine_bench_run(const di_model_runner *runner, const di_engine_bench_opts *o, di_engine_bench_result *out,
                        di_error *err) {
    memset(out, 0, sizeof *out);
    if (o->n_requests < 1 || o->prompt_tokens < 1 || o->output_tokens < 1)
        return di_error_set(err, DI_ERR_INVALID, "bench: %d requests of %lld + %lld tokens, expected all >= 1",
                            o->n_requests, (long long)o->prompt_tokens, (long long)o->output_tokens);
    const int64_t n = o->n_requests;
    int32_t *prompt = malloc((size_t)o->prompt_tokens * sizeof *prompt);
    double *first = calloc((size_t)n, sizeof *first);   /* [n] arrival of the first token, s */
    double *last = calloc((size_t)n, sizeof *last);     /* [n] arrival of the latest token, s */
    double *ttft = malloc((size_t)n * sizeof *ttft);
    double *e2e = malloc((size_t)n * sizeof *e2e);
    double *itl = malloc((size_t)(n * o->output_tokens) * sizeof *itl);
    di_core_delta *d = malloc(256 * sizeof *d);
    di_core *c = NULL;
    int rc = (!prompt || !first || !last || !ttft || !e2e || !itl || !d)
                 ? di_error_set(err, DI_ERR_NOMEM, "bench: out of memory for %lld requests", (long long)n)
                 : di_core_new(runner, &o->core, &c, err);
    int64_t n_itl = 0, n_done = 0;
    double t0 = di_now();
    for (int64_t i = 0; !rc && i < n; i++) {
        uint64_t h = o->seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(i + 1));
        for (int64_t t = 0; t < o->prompt_tokens; t++) {
            h ^= h << 13, h ^= h >> 7, h ^= h << 17;
            prompt[t] = (int32_t)(h % (uint64_t)runner->n_vocab);
        }
        di_seq_params p = {.sampling = di_sampling_params_default(), .max_tokens = o->output_tokens, .ignore_eos = 1};
        p.sampling.temperature = o->temperature;
        p.sampling.seed = h;
        rc = di_core_add(c, i, prompt, o->prompt_tokens, &p, err);
    }
    while (!rc && n_done < n) {
        rc = di_core_step(c, err);
        double now = di_now() - t0;
        int32_t k;
        while (!rc && (k = di_core_poll(c, d, 256)) > 0) {
            for (int32_t j = 0; j < k; j++) {
                int64_t id = d[j].id;
                if (d[j].n_tokens > 0) {
                    if (first[id] == 0.0) {
                        first[id] = now;
                        ttft[id] = now;
                        for (int64_t t = 1; t < d[j].n_tokens; t++) itl[n_itl++] = 0.0;
                    } else {
                        for (int64_t t = 0; t < d[j].n_tokens; t++) itl[n_itl++] = (now - last[id]) / (double)d[j].n_tokens;
                    }
                    last[id] = now;
                    out->generated += d[j].n_tokens;
                }
                if (d[j].finish == DI_FINISH_REASON_ERROR) rc = di_error_set(err, DI_ERR_INTERNAL, "bench: %s", d[j].error);
                if (d[j].finish != DI_FINISH_REASON_NONE) e2e[n_done++] = now;
            }
            if (k < 256) break;
        }
    }
    out->wall_s = di_now() - t0;
    if (!rc) {
        const di_core_stats *st = di_core_get_stats(c);
        out->output_tok_per_s = (double)out->generated / out->wall_s;
        out->total_tok_per_s = (double)(out->generated + n * o->prompt_tokens) / out->wall_s;
        percentiles(ttft, n, out->ttft_s);
        percentiles(itl, n_itl, out->itl_s);
        percentiles(e2e, n, out->e2e_s);
        out->steps = st->steps;
        out->preemptions = st->preemptions;
        out->forward_s = st->forward_s;
        out->sample_s = st->sample_s;
    }
    di_core_free(c);
    free(prompt);
    free(first);
    free(last);
    free(ttft);
    free(e2e);
    free(itl);
    free(d);
    return rc;
}
