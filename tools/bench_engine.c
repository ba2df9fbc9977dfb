/* deepinfer bench engine — throughput and latency of the engine for N concurrent requests.
 *
 *   deepinfer bench engine [--preset tiny|small | --model DIR | --mock] [--requests N]
 *                          [--prompt-tokens P] [--output-tokens O] [--temperature T] [--seed S]
 *                          [--max-seqs M] [--prefill-chunk C] [--threads K] [--sync] [--device cpu|cuda]
 *                          [--runner cached|serial|recompute] [--mock-step-ms MS] [--mock-vocab V] [--cache-mb N]
 *                          [--json]
 *   deepinfer bench engine --shared-prefix R [--preset tiny | --model DIR] [--requests N] [--prompt-tokens P]
 *
 * All N requests arrive at once, each with P random prompt ids and exactly O generated tokens (EOS
 * ignored). The run is repeated with one request, and the ratio of the two output rates is what
 * continuous batching buys. Percentiles (p50 / p90 / p99, nearest rank) of time to first token,
 * inter-token latency and end-to-end latency come from src/engine/engine_bench.h.
 *
 * Runners: --preset writes a random-weight checkpoint of that preset to a temporary directory
 * (removed afterwards); --model uses an existing checkpoint; both run the real model on --device
 * (CPU by default; cuda in a CUDA-enabled build) through the cached session runner
 * (engine/api_runner.h), which runs each step as ONE batched forward over all its pieces, so the
 * weights are read once per step and the ratio grows with N until the step is compute-bound.
 * --runner serial is the same runner running a step's pieces one forward after another (the
 * behaviour before batching: identical tokens, the baseline of the batching gain); --runner
 * recompute is the exact cache-free one (every token re-runs the whole history, pieces serially).
 * --mock runs the scheduler, executor and sampler over the mock runner (a fixed sleep per
 * step standing in for device time), which isolates the engine's own overhead and shows the
 * batching gain. The mock computes each logits row serially on the CPU (a hash per vocabulary
 * entry), work a device does for all rows at once, so its default vocabulary is small (4,096);
 * --mock-vocab 129280 adds the full-vocabulary sampler cost at the price of that artefact.
 *
 * --shared-prefix R measures the prefix cache (engine/prefix_cache.h) instead: N prompts of P tokens
 * whose first ⌊q·P⌋ tokens are common, for hit ratios q = 0, R/2 and R, are prefilled one after
 * another through the engine core (scheduler, executor) over the cached session runner, with the
 * prefix cache off and on; each request generates one token, so the run is its prefill. Reported
 * per ratio: wall time, prefill work — the positions the scheduler sent through the model: a hit of
 * P tokens costs the bounded replay of [r, P) plus the rest of the prompt, r = P − keep rounded
 * down to the compress ratios' lcm — its saving, tokens served from the cache and replayed. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli.h"
#include "engine/api_runner.h"
#include "engine/engine_bench.h"
#include "engine/mock_runner.h"
#include "engine/recompute_runner.h"
#include "model/cache_pool.h"
#include "model/mkmodel.h"
#include "model/weights.h"
#include "util/log.h"

typedef struct bench_runner {
    di_model_runner iface;
    di_mock_runner *mock;
    di_model *model;
    di_backend *be;
    di_recompute_runner *rr;
    di_session_runner *sr;
} bench_runner;

static void runner_free(bench_runner *r) {
    di_mock_runner_free(r->mock);
    di_recompute_runner_free(r->rr);
    di_session_runner_free(r->sr);
    /* the model first: its device weights are freed on the backend's stream (the other order crashed in
     * cudaFreeAsync at the end of every `bench engine --device cuda` run on the H200) */
    if (r->model) di_model_close(r->model);
    if (r->be) di_backend_destroy(r->be);
    memset(r, 0, sizeof *r);
}

/* A fresh runner per run, so the N-request and 1-request runs start from the same state. */
static int runner_open(bench_runner *r, const char *model_dir, const char *device, const char *runner, double mock_step_s,
                       int32_t mock_vocab, int64_t max_context, int32_t max_seqs, int threads, int64_t cache_bytes,
                       di_error *err) {
    memset(r, 0, sizeof *r);
    enum { BLOCK = 16 };
    int32_t n_blocks = (int32_t)((max_context * max_seqs + BLOCK - 1) / BLOCK);
    if (!model_dir) {
        di_mock_options mo = {.n_vocab = mock_vocab, .max_context = max_context, .block_tokens = BLOCK,
                              .n_blocks = n_blocks, .salt = 1, .sharpness = 12.0f, .step_sleep_s = mock_step_s};
        return di_mock_runner_new(&mo, &r->mock, &r->iface, err);
    }
    int rc = di_model_open(model_dir, &r->model, err);
    if (!rc) rc = di_backend_create(device, threads, &r->be, err);
    if (!rc) rc = di_model_to_backend(r->model, r->be, err);
    if (!rc && !strcmp(runner, "recompute"))
        rc = di_recompute_runner_new(r->model, r->be, max_context, BLOCK, n_blocks, &r->rr, &r->iface, err);
    else if (!rc) {
        /* the cached runner's sessions live in one paged pool (model/cache_pool.h) of cache_bytes
         * (0: max_seqs · max_context positions of pages) */
        di_cache_pool_opts po = {.max_tokens = max_context, .spec_margin = -1, .page_tokens = BLOCK,
                                 .n_slots = max_seqs + 1};
        if (cache_bytes > 0) rc = di_cache_pool_pages_for(&r->model->cfg, &po, cache_bytes, &n_blocks, err);
        if (!rc) rc = di_session_runner_new(r->model, r->be, max_context, BLOCK, n_blocks, &r->sr, &r->iface, err);
        if (!rc) rc = di_session_runner_use_pool(r->sr, &r->iface, max_seqs + 1, err);
    }
    if (!rc && r->sr) r->sr->serial = !strcmp(runner, "serial");
    if (rc) runner_free(r);
    return rc;
}

/* Removes the preset's temporary checkpoint directory (empty name: nothing to do). */
static void rc_cleanup(const char *tmp) {
    if (!tmp[0]) return;
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd)) fprintf(stderr, "bench engine: could not remove %s\n", tmp);
}

static json_t *result_json(const di_engine_bench_result *r) {
    return json_pack("{s:f,s:f,s:f,s:I,s:I,s:I,s:f,s:f,s:[f,f,f],s:[f,f,f],s:[f,f,f]}", "wall_s", r->wall_s,
                     "output_tok_per_s", r->output_tok_per_s, "total_tok_per_s", r->total_tok_per_s, "generated",
                     (json_int_t)r->generated, "steps", (json_int_t)r->steps, "preemptions", (json_int_t)r->preemptions,
                     "forward_s", r->forward_s, "sample_s", r->sample_s, "ttft_s", r->ttft_s[0], r->ttft_s[1],
                     r->ttft_s[2], "itl_s", r->itl_s[0], r->itl_s[1], r->itl_s[2], "e2e_s", r->e2e_s[0], r->e2e_s[1],
                     r->e2e_s[2]);
}

static void print_row(const char *label, const di_engine_bench_result *r) {
    printf("%-12s %9.1f %9.1f  %7.1f %7.1f %7.1f  %7.2f %7.2f %7.2f  %7.1f %7.1f  %6lld\n", label, r->output_tok_per_s,
           r->total_tok_per_s, 1e3 * r->ttft_s[0], 1e3 * r->ttft_s[1], 1e3 * r->ttft_s[2], 1e3 * r->itl_s[0],
           1e3 * r->itl_s[1], 1e3 * r->itl_s[2], 1e3 * r->e2e_s[0], 1e3 * r->e2e_s[2], (long long)r->steps);
}

/* One pass of n prompts (ids int32 [n, p]) through a fresh engine core over the cached session
 * runner, one request after another, each generating one token (its prefill), so request i can
 * hit what requests < i stored. */
typedef struct prefix_run {
    double wall_s;
    int64_t work;      /* positions the scheduler sent through the model (the prefill work) */
    int64_t positions; /* positions the runner computed (the same, counted on the other side) */
    int64_t hit_tokens, replayed;
} prefix_run;

static int prefix_pass(di_model *m, di_backend *be, const int32_t *ids, int64_t n, int64_t p, bool on, prefix_run *out,
                       di_error *err) {
    di_session_runner *sr;
    di_model_runner it;
    enum { BLOCK = 16 };
    int rc = di_session_runner_new(m, be, p + 1, BLOCK, (int32_t)((p + BLOCK) / BLOCK), &sr, &it, err);
    if (rc) return rc;
    if (on) rc = di_session_runner_enable_prefix(sr, &it, 0, (int64_t)1 << 32, err);
    di_core *c = NULL;
    const int32_t chunk = p < 4096 ? (int32_t)p : 4096;
    di_core_options co = {.sched = {.max_seqs = 1, .max_step_tokens = chunk, .prefill_chunk = chunk}};
    if (!rc) rc = di_core_new(&it, &co, &c, err);
    double t0 = di_now();
    di_core_delta d[4];
    for (int64_t i = 0; !rc && i < n; i++) {
        di_seq_params sp = {.sampling = di_sampling_params_default(), .max_tokens = 1, .ignore_eos = 1};
        sp.sampling.temperature = 0;
        rc = di_core_add(c, i, ids + i * p, p, &sp, err);
        while (!rc && di_core_busy(c)) {
            rc = di_core_step(c, err);
            for (int32_t k; !rc && (k = di_core_poll(c, d, 4)) > 0;)
                for (int32_t j = 0; j < k; j++)
                    if (d[j].finish == DI_FINISH_REASON_ERROR) rc = di_error_set(err, DI_ERR_INTERNAL, "bench: %s", d[j].error);
        }
    }
    out->wall_s = di_now() - t0;
    if (c) out->work = di_core_get_stats(c)->scheduled_tokens;
    out->positions = sr->n_positions;
    out->hit_tokens = sr->n_hit_tokens;
    out->replayed = sr->n_replayed;
    di_core_free(c);
    di_session_runner_free(sr);
    return rc;
}

static int bench_shared_prefix(const di_cli *cli, const char *model_dir, int threads, int64_t n, int64_t p, double R,
                               uint64_t seed, const char *preset) {
    di_error err = {0};
    di_model *m = NULL;
    di_backend *be = NULL;
    int rc = di_model_open(model_dir, &m, &err);
    if (!rc) rc = di_backend_cpu_create(threads, &be, &err);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n * p)); /* int32 [n, p] */
    if (!rc && !ids) rc = di_error_set(&err, DI_ERR_NOMEM, "bench engine: %lld prompt ids", (long long)(n * p));
    const double ratios[3] = {0.0, R / 2, R};
    prefix_run res[3][2];
    for (int k = 0; !rc && k < 3; k++) {
        int64_t shared = (int64_t)(ratios[k] * (double)p);
        uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
        for (int64_t i = 0; i < n; i++)
            for (int64_t t = 0; t < p; t++) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                int32_t v = (int32_t)((x >> 33) % (uint64_t)m->cfg.vocab_size);
                ids[i * p + t] = t < shared && i > 0 ? ids[t] : v; /* the shared part copies request 0's */
            }
        for (int on = 0; !rc && on < 2; on++) {
            fprintf(stderr, "bench engine: shared prefix %.2f, prefix cache %s...\n", ratios[k], on ? "on" : "off");
            rc = prefix_pass(m, be, ids, n, p, on, &res[k][on], &err);
        }
    }
    free(ids);
    if (m) di_model_close(m); /* before its backend (runner_free) */
    if (be) di_backend_destroy(be);
    if (rc) return cli_fail_err(cli, &err);
    if (cli->json) {
        json_t *rows = json_array();
        for (int k = 0; k < 3; k++)
            json_array_append_new(rows, json_pack("{s:f,s:f,s:f,s:I,s:I,s:I,s:I,s:I}", "ratio", ratios[k], "off_s",
                                                  res[k][0].wall_s, "on_s", res[k][1].wall_s, "off_work",
                                                  (json_int_t)res[k][0].work, "on_work", (json_int_t)res[k][1].work,
                                                  "on_positions", (json_int_t)res[k][1].positions, "hit_tokens",
                                                  (json_int_t)res[k][1].hit_tokens, "replayed",
                                                  (json_int_t)res[k][1].replayed));
        return cli_emit(cli, json_pack("{s:s,s:s?,s:I,s:I,s:o}", "command", "bench engine --shared-prefix", "preset",
                                       preset, "requests", (json_int_t)n, "prompt_tokens", (json_int_t)p, "ratios",
                                       rows));
    }
    printf("prefix cache bench: %lld prompts x %lld tokens, one after another, prefill + 1 token each, cached "
           "session runner (CPU)%s%s\n", (long long)n, (long long)p, preset ? ", preset " : "", preset ? preset : "");
    printf("%-6s %10s %10s %8s  %10s %10s %7s  %10s %9s\n", "ratio", "off s", "on s", "speedup", "off work",
           "on work", "saved", "hit tokens", "replayed");
    for (int k = 0; k < 3; k++)
        printf("%-6.2f %10.3f %10.3f %7.2fx  %10lld %10lld %6.1f%%  %10lld %9lld\n", ratios[k], res[k][0].wall_s,
               res[k][1].wall_s, res[k][1].wall_s > 0 ? res[k][0].wall_s / res[k][1].wall_s : 0.0,
               (long long)res[k][0].work, (long long)res[k][1].work,
               res[k][0].work > 0 ? 100.0 * (double)(res[k][0].work - res[k][1].work) / (double)res[k][0].work : 0.0,
               (long long)res[k][1].hit_tokens, (long long)res[k][1].replayed);
    return 0;
}

int bench_engine(int argc, char **argv) {
    di_args a;
    cli_args_init(&a, argc, argv);
    di_cli cli = {.cmd = "bench engine", .json = cli_flag(&a, "json")};
    const char *preset = cli_str(&a, "preset", NULL), *model = cli_str(&a, "model", NULL);
    const char *runner_name = cli_str(&a, "runner", "cached"), *device = NULL;
    bool mock = cli_flag(&a, "mock"), sync = cli_flag(&a, "sync");
    long long n, p, o, seed, max_seqs, chunk, threads, mock_vocab, cache_mb;
    double temp, step_ms, shared_prefix;
    bool ok = cli_int(&cli, &a, "requests", 8, 1, 100000, &n) && cli_int(&cli, &a, "prompt-tokens", 32, 1, 1 << 20, &p) &&
              cli_int(&cli, &a, "output-tokens", 16, 1, 1 << 20, &o) && cli_int(&cli, &a, "seed", 1, 0, INT64_MAX, &seed) &&
              cli_int(&cli, &a, "max-seqs", 64, 1, 4096, &max_seqs) &&
              cli_int(&cli, &a, "prefill-chunk", 256, 1, 1 << 20, &chunk) &&
              cli_int(&cli, &a, "threads", 0, 0, 1024, &threads) && cli_double(&cli, &a, "temperature", 0.8, &temp) &&
              cli_double(&cli, &a, "mock-step-ms", 2.0, &step_ms) &&
              cli_int(&cli, &a, "mock-vocab", 4096, 16, 1 << 20, &mock_vocab) &&
              cli_int(&cli, &a, "cache-mb", 0, 0, 1 << 24, &cache_mb) &&
              cli_double(&cli, &a, "shared-prefix", -1.0, &shared_prefix) && cli_device(&cli, &a, &device) &&
              cli_check_unused(&cli, &a);
    cli_args_free(&a);
    if (!ok) return 1;
    if ((mock != 0) + (preset != NULL) + (model != NULL) > 1)
        return cli_fail(&cli, "give one of --preset, --model and --mock");
    if (!mock && !model && !preset) preset = "tiny";
    if (strcmp(runner_name, "cached") && strcmp(runner_name, "serial") && strcmp(runner_name, "recompute"))
        return cli_fail(&cli, "--runner expects cached, serial or recompute, got '%s'", runner_name);
    const bool recompute = !strcmp(runner_name, "recompute");
    if (shared_prefix != -1.0 && (mock || shared_prefix < 0 || shared_prefix > 1 || strcmp(runner_name, "cached")))
        return cli_fail(&cli, "--shared-prefix expects a ratio in [0, 1] and a real model with the cached runner");
    if (shared_prefix != -1.0 && strcmp(device, "cpu")) return cli_fail(&cli, "--shared-prefix runs on --device cpu");
    if (threads == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads = c > 0 ? c : 1;
    }
    di_error err = {0};
    char tmp[4096] = "";
    if (preset) {
        const char *t = getenv("TMPDIR");
        snprintf(tmp, sizeof tmp, "%s/deepinfer-bench-engine-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(tmp)) return cli_fail(&cli, "cannot create a temporary directory %s", tmp);
        di_mkmodel_opts mo = {.preset = preset, .seed = 1, .out_dir = tmp};
        di_mkmodel_stats ms;
        fprintf(stderr, "bench engine: writing a random '%s' checkpoint to %s\n", preset, tmp);
        if (di_mkmodel_write(&mo, &ms, &err)) {
            char cmd[4200];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
            if (system(cmd)) {}
            return cli_fail_err(&cli, &err);
        }
        model = tmp;
    }
    if (shared_prefix >= 0) {
        int rc = bench_shared_prefix(&cli, model, (int)threads, n, p, shared_prefix, (uint64_t)seed, preset);
        rc_cleanup(tmp);
        return rc;
    }
    const int64_t max_context = p + o + 1;
    di_engine_bench_opts bo = {.n_requests = (int32_t)n, .prompt_tokens = p, .output_tokens = o,
                               .temperature = (float)temp, .seed = (uint64_t)seed};
    bo.core = (di_core_options){.sched = {.max_seqs = (int32_t)max_seqs,
                                          .max_step_tokens = chunk > 2048 ? chunk : 2048,
                                          .prefill_chunk = (int32_t)chunk},
                                .async = !sync,
                                .sample_threads = 4};
    di_engine_bench_result many = {0}, one = {0};
    int rc = DI_OK;
    for (int run = 0; !rc && run < 2; run++) {
        bench_runner r;
        rc = runner_open(&r, mock ? NULL : model, device, runner_name, step_ms * 1e-3, (int32_t)mock_vocab, max_context,
                         (int32_t)max_seqs, (int)threads, (int64_t)cache_mb << 20, &err);
        if (rc) break;
        bo.n_requests = run == 0 ? (int32_t)n : 1;
        fprintf(stderr, "bench engine: %d request(s) x (%lld + %lld) tokens...\n", bo.n_requests, p, o);
        rc = di_engine_bench_run(&r.iface, &bo, run == 0 ? &many : &one, &err);
        runner_free(&r);
    }
    if (tmp[0]) {
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd)) fprintf(stderr, "bench engine: could not remove %s\n", tmp);
    }
    if (rc) return cli_fail_err(&cli, &err);
    double ratio = one.output_tok_per_s > 0 ? many.output_tok_per_s / one.output_tok_per_s : 0.0;
    char runner[96];
    if (mock)
        snprintf(runner, sizeof runner, "mock");
    else
        snprintf(runner, sizeof runner, "%s (%s, %s)", runner_name,
                 recompute ? "cache-free" : !strcmp(runner_name, "serial") ? "sessions, one forward per piece"
                                                                           : "sessions, one forward per step",
                 device);
    if (cli.json) {
        json_t *doc = json_pack("{s:s,s:s,s:s?,s:I,s:I,s:I,s:f,s:b,s:I,s:o,s:o,s:f}", "command", "bench engine", "runner",
                                runner, "preset", preset, "requests", (json_int_t)n, "prompt_tokens", (json_int_t)p,
                                "output_tokens", (json_int_t)o, "temperature", temp, "async", !sync, "max_seqs",
                                (json_int_t)max_seqs, "concurrent", result_json(&many), "single", result_json(&one),
                                "ratio_to_single", ratio);
        return cli_emit(&cli, doc);
    }
    printf("engine bench: runner %s%s%s, %lld x (%lld prompt + %lld output) tokens, T %.2f, %s, max_seqs %lld\n", runner,
           preset ? ", preset " : "", preset ? preset : "", n, p, o, temp, sync ? "sync" : "async", max_seqs);
    printf("%-12s %9s %9s  %23s  %23s  %15s  %6s\n", "", "out tok/s", "all tok/s", "TTFT ms p50/p90/p99",
           "ITL ms p50/p90/p99", "E2E ms p50/p99", "steps");
    char label[32];
    snprintf(label, sizeof label, "%lld requests", n);
    print_row(label, &many);
    print_row("1 request", &one);
    printf("ratio to the single-request rate: %.2fx\n", ratio);
    return 0;
}
