/* deepinfer bench cpu — prefill and decode tokens/s of the CPU backend next to this machine's
 * memory-bandwidth roofline.
 *
 *   deepinfer bench cpu [--preset tiny|small|all] [--model DIR] [--dir DIR] [--prompt-tokens N]
 *                       [--decode-tokens N] [--threads N] [--json]
 *
 * Models: the mkmodel presets (written once under --dir, default $TMPDIR/deepinfer-bench/<preset>, and
 * reused), or --model DIR. Per model: a random prompt of --prompt-tokens ids prefilled as one chunk,
 * then --decode-tokens greedy decode steps (DSpark off).
 *
 * Roofline: decode is memory-bound, so the bound on tokens/s is bandwidth ÷ bytes one token must read.
 * Bandwidth is measured in the same run by a streaming read (uint64 sums over a 512 MiB buffer, one
 * slice per thread, best of 5). Bytes per decode token: every weight the step reads — attention, mHC,
 * router, shared expert, norms and the LM head in full; the routed experts in the proportion
 * top-k/n_experts; one embedding row; 24 Engram rows per Engram layer; wo_a at its bf16 size (it is
 * dequantized at load) — plus the cache the step reads at the mean decode context (each layer's
 * window, the selected compressed entries, every index key of the index sources). Prefill: the weights
 * once per chunk (all experts) divided by the prompt length, plus the same cache bytes. The ratio
 * measured / roofline says how far the kernels are from streaming at full bandwidth. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "bench_read.h"
#include "cli.h"
#include "model/mkmodel.h"
#include "model/session.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------- bytes a token reads ---------------- */

typedef struct traffic {
    double dense;       /* weights every step reads in full (attention, mHC, router, shared expert, head) */
    double experts;     /* all routed experts */
    double experts_dec; /* the routed experts one decode token uses: top-k / n_experts of them */
    double per_token;   /* rows gathered per token: one embedding row, the Engram rows */
    double cache;       /* cache one step reads at the mean decode context */
} traffic;

static bool has(const char *s, const char *part) { return strstr(s, part) != NULL; }

static void count_traffic(const di_model *m, int64_t ctx, traffic *tr) {
    const di_config *cfg = &m->cfg;
    const di_checkpoint *ck = m->ck;
    memset(tr, 0, sizeof *tr);
    for (int64_t i = 0; i < ck->n_tensors; i++) {
        const di_tensor_info *t = ck->entries[i].info;
        const char *nm = t->name;
        double b = (double)(t->end - t->begin);
        if (!strncmp(nm, "mtp.", 4) || has(nm, "vision") || has(nm, "aligner") || has(nm, "image_")) continue;
        if (!strcmp(nm, "embed.weight")) {
            tr->per_token += b / cfg->vocab_size;
        } else if (has(nm, "engram.embed.")) {
            double rows = t->shape[0] > 0 ? (double)t->shape[0] : 1;
            tr->per_token += b / rows * (cfg->engram_max_ngram_size - 1) * cfg->engram_n_heads;
        } else if (has(nm, "attn.wo_a.weight")) {
            tr->dense += 2.0 * (double)t->shape[0] * (double)t->shape[1]; /* held as bf16 */
        } else if (has(nm, "attn.wo_a.scale")) {
            continue;
        } else if (has(nm, "ffn.experts.")) {
            int L = atoi(nm + strlen("layers."));
            const di_layer_cfg *lc = &cfg->layer[L >= 0 && L < cfg->n_layers ? L : 0];
            tr->experts += b;
            tr->experts_dec += b * lc->n_active_experts / (double)lc->n_experts;
        } else {
            tr->dense += b;
        }
    }
    /* cache reads of one step at context ctx */
    di_cache_size cs;
    di_error err;
    di_cache_opts co = {.max_tokens = ctx > 0 ? ctx : 1, .spec_margin = 0};
    if (di_cache_size_of(cfg, &co, &cs, &err)) return;
    for (int L = 0; L < cfg->n_layers; L++) {
        const di_layer_cfg *lc = &cfg->layer[L];
        double win = ctx < cfg->sliding_window ? ctx : cfg->sliding_window;
        tr->cache += win * cs.window_slot_bytes;
        if (lc->compress_ratio > 0) {
            double n = (double)(ctx / lc->compress_ratio);
            tr->cache += (n < cfg->index_topk ? n : cfg->index_topk) * cs.cmp_entry_bytes;
            if (lc->is_index_source) tr->cache += n * cs.index_key_bytes;
        }
    }
}

/* ---------------- one model ---------------- */

typedef struct bench_row {
    char name[64];
    int64_t prompt, decode;
    double prefill_tps, decode_tps;
    double bytes_decode, bytes_prefill; /* per token */
    double roof_decode, roof_prefill;   /* tokens/s at the measured bandwidth */
} bench_row;

static int bench_model(const char *dir, const char *name, int64_t P, int64_t N, int threads, double bw,
                       bench_row *row, di_error *err) {
    di_model *m = NULL;
    di_backend *be = NULL;
    di_session *s = NULL;
    int32_t *ids = NULL;   /* int32 [P + N] prompt, then the greedy outputs */
    float *logits = NULL;  /* f32 [V] */
    int rc = di_model_open(dir, &m, err);
    if (!rc) rc = di_backend_cpu_create(threads, &be, err);
    if (rc) goto done;
    int64_t V = m->cfg.vocab_size;
    ids = malloc(sizeof(int32_t) * (size_t)(P + N));
    logits = malloc(sizeof(float) * (size_t)V);
    if (!ids || !logits) {
        rc = di_error_set(err, DI_ERR_NOMEM, "bench buffers");
        goto done;
    }
    uint64_t r = 0x2545F4914F6CDD1Dull;
    for (int64_t i = 0; i < P; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        ids[i] = (int32_t)(r % (uint64_t)V);
    }
    di_session_opts so = {.max_tokens = P + N, .spec_margin = -1, .dspark = false};
    if ((rc = di_session_create(m, be, &so, &s, err))) goto done;
    double t0 = now_s();
    if ((rc = di_session_forward(s, ids, P, false, logits, NULL, err))) goto done;
    double tp = now_s() - t0;
    t0 = now_s();
    for (int64_t i = 0; i < N; i++) {
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++) best = logits[v] > logits[best] ? v : best;
        ids[P + i] = (int32_t)best;
        if ((rc = di_session_forward(s, &ids[P + i], 1, false, logits, NULL, err))) goto done;
    }
    double td = now_s() - t0;
    traffic tr;
    count_traffic(m, P + N / 2, &tr);
    snprintf(row->name, sizeof row->name, "%s", name);
    row->prompt = P, row->decode = N;
    row->prefill_tps = P / (tp > 0 ? tp : 1e-9);
    row->decode_tps = N / (td > 0 ? td : 1e-9);
    row->bytes_decode = tr.dense + tr.experts_dec + tr.per_token + tr.cache;
    row->bytes_prefill = (tr.dense + tr.experts) / (double)P + tr.per_token + tr.cache;
    row->roof_decode = bw / row->bytes_decode;
    row->roof_prefill = bw / row->bytes_prefill;
done:
    di_session_destroy(s);
    di_model_close(m); /* before its backend */
    di_backend_destroy(be);
    free(ids), free(logits);
    return rc;
}

static bool file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

int bench_cpu(int argc, char **argv) {
    di_args a;
    cli_args_init(&a, argc, argv);
    di_cli cli = {.cmd = "bench cpu", .json = cli_flag(&a, "json")};
    long long P, N, threads;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    const char *preset = cli_str(&a, "preset", "all");
    const char *model = cli_str(&a, "model", NULL);
    const char *tmp = getenv("TMPDIR");
    char defdir[1024];
    snprintf(defdir, sizeof defdir, "%s/deepinfer-bench", tmp && *tmp ? tmp : "/tmp");
    const char *base = cli_str(&a, "dir", defdir);
    int rc = 1;
    if (!cli_int(&cli, &a, "prompt-tokens", 512, 1, 1 << 20, &P) || !cli_int(&cli, &a, "decode-tokens", 32, 1, 1 << 20, &N) ||
        !cli_int(&cli, &a, "threads", ncpu > 0 ? ncpu : 1, 1, 256, &threads) || !cli_check_unused(&cli, &a))
        goto out;
    const char *names[3];
    int n_models = 0;
    if (model) {
        names[n_models++] = model;
    } else if (!strcmp(preset, "all")) {
        names[n_models++] = "tiny", names[n_models++] = "small";
    } else if (!strcmp(preset, "tiny") || !strcmp(preset, "small")) {
        names[n_models++] = preset;
    } else {
        cli_fail(&cli, "--preset %s: expected tiny, small or all", preset);
        goto out;
    }
    fprintf(stderr, "bench cpu: measuring memory bandwidth (%lld threads)...\n", threads);
    double bw = bench_read_bandwidth((int)threads, (size_t)512 << 20, 5);
    fprintf(stderr, "bench cpu: streaming read %.2f GB/s\n", bw / 1e9);
    bench_row rows[3];
    di_error err = {0};
    for (int i = 0; i < n_models; i++) {
        char dir[1200];
        if (model) {
            snprintf(dir, sizeof dir, "%s", model);
        } else {
            char cfgp[1300];
            snprintf(dir, sizeof dir, "%s/%s", base, names[i]);
            snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
            if (!file_exists(cfgp)) {
                mkdir(base, 0755);
                fprintf(stderr, "bench cpu: writing the %s preset to %s\n", names[i], dir);
                di_mkmodel_opts mo = {.preset = names[i], .seed = 1, .out_dir = dir};
                di_mkmodel_stats ms;
                if (di_mkmodel_write(&mo, &ms, &err)) {
                    cli_fail_err(&cli, &err);
                    goto out;
                }
            }
        }
        fprintf(stderr, "bench cpu: %s: prefill %lld tokens, decode %lld tokens\n", names[i], P, N);
        if (bench_model(dir, names[i], P, N, (int)threads, bw, &rows[i], &err)) {
            cli_fail_err(&cli, &err);
            goto out;
        }
        bench_row *r = &rows[i];
        fprintf(stderr,
                "bench cpu: %s: prefill %.1f tok/s (roofline %.1f, %.1f%%), decode %.2f tok/s (roofline %.1f, "
                "%.1f%%); %.2f MB/token decode\n",
                r->name, r->prefill_tps, r->roof_prefill, 100 * r->prefill_tps / r->roof_prefill, r->decode_tps,
                r->roof_decode, 100 * r->decode_tps / r->roof_decode, r->bytes_decode / 1e6);
    }
    if (cli.json) {
        json_t *doc = json_object(), *arr = json_array();
        json_object_set_new(doc, "threads", json_integer(threads));
        json_object_set_new(doc, "bandwidth_gb_s", json_real(bw / 1e9));
        for (int i = 0; i < n_models; i++) {
            bench_row *r = &rows[i];
            json_t *o = json_object();
            json_object_set_new(o, "model", json_string(r->name));
            json_object_set_new(o, "prompt_tokens", json_integer(r->prompt));
            json_object_set_new(o, "decode_tokens", json_integer(r->decode));
            json_object_set_new(o, "prefill_tokens_per_s", json_real(r->prefill_tps));
            json_object_set_new(o, "decode_tokens_per_s", json_real(r->decode_tps));
            json_object_set_new(o, "decode_bytes_per_token", json_real(r->bytes_decode));
            json_object_set_new(o, "prefill_bytes_per_token", json_real(r->bytes_prefill));
            json_object_set_new(o, "decode_roofline_tokens_per_s", json_real(r->roof_decode));
            json_object_set_new(o, "prefill_roofline_tokens_per_s", json_real(r->roof_prefill));
            json_object_set_new(o, "decode_fraction_of_roofline", json_real(r->decode_tps / r->roof_decode));
            json_object_set_new(o, "prefill_fraction_of_roofline", json_real(r->prefill_tps / r->roof_prefill));
            json_array_append_new(arr, o);
        }
        json_object_set_new(doc, "models", arr);
        cli_emit(&cli, doc);
    } else {
        printf("%-8s %8s %12s %12s %7s %12s %12s %7s %12s\n", "model", "prompt", "prefill/s", "roofline/s", "%",
               "decode/s", "roofline/s", "%", "MB/tok dec");
        for (int i = 0; i < n_models; i++) {
            bench_row *r = &rows[i];
            printf("%-8s %8lld %12.1f %12.1f %6.1f%% %12.2f %12.1f %6.1f%% %12.2f\n", r->name, (long long)r->prompt,
                   r->prefill_tps, r->roof_prefill, 100 * r->prefill_tps / r->roof_prefill, r->decode_tps, r->roof_decode,
                   100 * r->decode_tps / r->roof_decode, r->bytes_decode / 1e6);
        }
        printf("bandwidth (streaming read, %lld threads): %.2f GB/s\n", threads, bw / 1e9);
    }
    rc = 0;
out:
    cli_args_free(&a);
    return rc;
}
