/* Engine benchmark core (issue 7 item 7): N concurrent requests of fixed prompt / output length
 * through a di_core on any model runner — the real model, or the mock for a scheduler-only dry run.
 * All requests arrive at once; outputs ignore EOS so every request produces exactly output_tokens.
 * `deepinfer bench engine` runs it twice (N requests, then 1) to print the ratio to the
 * single-request rate. */
#ifndef DI_ENGINE_ENGINE_BENCH_H
#define DI_ENGINE_ENGINE_BENCH_H

#include <stdint.h>

#include "engine/engine_core.h"

typedef struct di_engine_bench_opts {
    int32_t n_requests;
    int64_t prompt_tokens;   /* per request, >= 1 */
    int64_t output_tokens;   /* per request, >= 1 */
    float temperature;       /* 0 = greedy */
    uint64_t seed;           /* prompts and sampling seeds */
    di_core_options core;    /* scheduler, async, sampling threads */
} di_engine_bench_opts;

typedef struct di_engine_bench_result {
    double wall_s;
    double output_tok_per_s;  /* generated tokens / wall */
    double total_tok_per_s;   /* (prompt + generated) / wall */
    double ttft_s[3];         /* time to first token: p50, p90, p99 over requests */
    double itl_s[3];          /* inter-token latency: p50, p90, p99 over all tokens after the first */
    double e2e_s[3];          /* request latency: p50, p90, p99 */
    int64_t steps, preemptions, generated;
    double forward_s, sample_s; /* time inside the runner's forward and the sampler */
} di_engine_bench_result;

int di_engine_bench_run(const di_model_runner *runner, const di_engine_bench_opts *o, di_engine_bench_result *out,
                        di_error *err);

#endif
