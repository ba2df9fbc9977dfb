/* `deepinfer bench gpu --device cpu` on the tiny preset (the harness; its numbers come from the H200)
 * and the bench-only synthetic cache history it decodes after (model/cache_synth.h). Runs the built
 * CLI (build/deepinfer, or $DI_CLI).  di-test: asan */
#include <jansson.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "backend/backend.h"
#include "model/cache_pool.h"
#include "model/cache_synth.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/session.h"
#include "testutil.h"
#include "util/error.h"

static char *g_dir; /* tiny preset checkpoint */

static const char *cli_path(void) {
    const char *p = getenv("DI_CLI");
    return p ? p : "build/deepinfer";
}

static int setup(void **state) {
    (void)state;
    struct stat sb;
    if (stat(cli_path(), &sb) != 0) {
        fprintf(stderr, "%s not built (run `make cli`)\n", cli_path());
        return -1; /* a missing CLI must not pass silently */
    }
    g_dir = tu_tmpdir("bench_gpu");
    return tu_write_tiny_model(g_dir, 7, NULL);
}

static int teardown(void **state) {
    (void)state;
    tu_rmtree(g_dir);
    free(g_dir);
    return 0;
}

/* `deepinfer bench gpu --model DIR ARGS --json`: the parsed document, the exit status and the stderr
 * line count. */
static json_t *run_bench(const char *args, int *status, int *err_lines) {
    char cmd[2048], errp[1200];
    snprintf(errp, sizeof errp, "%s/stderr.txt", g_dir);
    snprintf(cmd, sizeof cmd, "%s bench gpu --model %s --device cpu --threads 1 %s --json 2>%s", cli_path(), g_dir, args,
             errp);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    json_error_t je;
    json_t *doc = json_loadf(f, 0, &je);
    int st = pclose(f);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (!doc) fail_msg("`%s` printed no JSON document (%s)", cmd, je.text);
    /* lines other than the load's phase lines ("bench gpu: opening", "opened", "checkpoint", "backend",
     * "loaded": test_load_report reads those) */
    *err_lines = 0;
    FILE *e = fopen(errp, "r");
    char line[2048];
    while (e && fgets(line, sizeof line, e)) {
        static const char *const load[] = {"bench gpu: opening ", "bench gpu: opened ", "bench gpu: checkpoint ",
                                           "bench gpu: backend ", "bench gpu: weights ",
                                           "bench gpu: warning: most of the checkpoint"};
        bool phase = false;
        for (size_t i = 0; i < sizeof load / sizeof load[0]; i++) phase |= !strncmp(line, load[i], strlen(load[i]));
        *err_lines += !phase;
    }
    if (e) fclose(e);
    return doc;
}

/* stderr of the last run_bench */
static char *last_stderr(void) {
    char errp[1200];
    snprintf(errp, sizeof errp, "%s/stderr.txt", g_dir);
    FILE *e = fopen(errp, "r");
    assert_non_null(e);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, e);
    buf[n] = 0;
    fclose(e);
    return buf;
}

static double num(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    if (!json_is_number(v)) fail_msg("no number \"%s\"", k);
    return json_number_value(v);
}

static json_t *find_row(json_t *rows, const char *role, const char *mode, int64_t B, int64_t C) {
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) {
        if (strcmp(json_string_value(json_object_get(r, "role")), role) ||
            strcmp(json_string_value(json_object_get(r, "mode")), mode))
            continue;
        if (!strcmp(mode, "prefill") || (num(r, "batch") == B && num(r, "ctx") == C)) return r;
    }
    fail_msg("no %s row for %s B=%lld C=%lld", mode, role, (long long)B, (long long)C);
    return NULL;
}

/* The six roles of the tiny preset's six layers (mkmodel.c), in layer order. */
static const char *const k_roles[] = {"swa", "r2-kv-index-source+engram", "r2-reuse",
                                      "r1-kv-index-candidate-source+engram", "r1-reuse", "r1-reindex"};

static void test_json_rows(void **state) {
    (void)state;
    char peer[1200];
    snprintf(peer, sizeof peer, "%s/peer.json", g_dir);
    FILE *f = fopen(peer, "w");
    assert_non_null(f);
    fputs("{\"bench\": \"torch_layer\", \"layers\": [{\"layer\": 0, \"role\": \"swa\", \"results\": ["
          "{\"mode\": \"decode\", \"batch\": 2, \"ctx\": 256, \"time_ms\": 2.5},"
          "{\"mode\": \"prefill\", \"tokens\": 64, \"time_ms\": 4.0}]}]}\n",
          f);
    fclose(f);
    char args[1400];
    snprintf(args, sizeof args, "--batch 1,2 --context 64,256 --prefill 64 --iters 2 --warmup 1 --hbm-gbps 10 --peer %s",
             peer);
    int st, lines;
    json_t *doc = run_bench(args, &st, &lines);
    assert_int_equal(st, 0);
    assert_true(json_is_true(json_object_get(doc, "ok")));
    assert_true(fabs(num(doc, "roofline_gb_s") - 10.0) < 1e-9);
    json_t *rows = json_object_get(doc, "rows");
    assert_int_equal(json_array_size(rows), 6 * (2 * 2 + 1));

    di_model *m;
    di_error err = {0};
    assert_int_equal(di_model_open(g_dir, &m, &err), DI_OK);
    const di_config *cfg = &m->cfg;
    for (int k = 0; k < 6; k++) {
        for (int64_t C = 64; C <= 256; C *= 4)
            for (int64_t B = 1; B <= 2; B++) {
                json_t *r = find_row(rows, k_roles[k], "decode", B, C);
                double ms = num(r, "time_ms"), bytes = num(r, "bytes");
                assert_int_equal((int)num(r, "layer"), k);
                assert_true(ms > 0 && ms < 1e4);
                assert_true(fabs(num(r, "gb_s") - bytes / (ms * 1e-3) / 1e9) < 1e-6 * num(r, "gb_s"));
                assert_true(fabs(num(r, "roofline_fraction") - num(r, "gb_s") / 10.0) < 1e-9);
                assert_true(fabs(bytes - num(r, "weight_bytes") - num(r, "expert_bytes") - num(r, "cache_bytes")) < 1);
                assert_true(num(r, "weight_bytes") > 0);
                assert_null(json_object_get(r, "graph_time_ms")); /* graph-timed rows: CUDA only */
            }
        json_t *p = find_row(rows, k_roles[k], "prefill", 0, 0);
        assert_true(num(p, "time_ms") > 0 && num(p, "tflops") > 0 && num(p, "flops") > 0);
        assert_true(fabs(num(p, "peak_fraction") - num(p, "tflops") / 1445.0) < 1e-9);
        assert_int_equal((int)num(p, "tokens"), 64);
    }

    /* hand computation: layer 4 (r1-reuse, no Engram, not an index source), B = 2, C = 256 —
     * per sequence min(C, W) window slots + min(⌊257/1⌋, topk) compressed entries; each expert read
     * is 1/E of the layer's expert tensors */
    int L = 4;
    assert_true(cfg->layer[L].engram_index < 0 && !cfg->layer[L].is_index_source && cfg->layer[L].compress_ratio == 1);
    int64_t hd = cfg->head_dim, W = cfg->sliding_window, topk = cfg->index_topk;
    double per_seq = (double)(256 < W ? 256 : W) * (double)(hd + hd / 32) + (double)(257 < topk ? 257 : topk) * (double)(hd / 2 + hd / 16);
    json_t *r = find_row(rows, "r1-reuse", "decode", 2, 256);
    assert_true(fabs(num(r, "cache_bytes") - 2 * per_seq) < 0.5);
    int64_t E = cfg->layer[L].n_experts, act = 2 * cfg->layer[L].n_active_experts;
    double experts = 0;
    for (int64_t i = 0; i < m->ck->n_tensors; i++) {
        const di_tensor_info *t = m->ck->entries[i].info;
        if (!strncmp(t->name, "layers.4.ffn.experts.", 21)) experts += (double)(t->end - t->begin);
    }
    int64_t k = cfg->layer[L].n_active_experts, got = (int64_t)num(r, "experts_read");
    assert_int_equal((int64_t)num(r, "experts_bound"), act < E ? act : E);
    assert_true(got >= k && got <= (act < E ? act : E)); /* 2 tokens: top_k … 2·top_k distinct */
    assert_true(fabs(num(r, "expert_bytes") - experts / (double)E * (double)got) < 0.5);
    /* one token picks exactly top_k distinct experts (counted from the router ids) */
    assert_int_equal((int64_t)num(find_row(rows, "r1-reuse", "decode", 1, 256), "experts_read"), k);
    tu_report("bench gpu tiny cpu: r1-reuse B=2 C=256 %.3f ms, %.0f bytes (%.0f cache), %.2f GB/s", num(r, "time_ms"),
              num(r, "bytes"), num(r, "cache_bytes"), num(r, "gb_s"));

    /* prefill FLOPs of layer 0 (swa, no Engram) over P = 64 tokens: 2·P per element of its 2-D
     * weights (routed experts at top_k/E; FP4 I8 bytes hold two), 4·H·hd per (query, window key) */
    assert_true(cfg->layer[0].compress_ratio == 0 && cfg->layer[0].engram_index < 0);
    double dense = 0, expert = 0, keys = 0;
    for (int64_t i = 0; i < m->ck->n_tensors; i++) {
        const di_tensor_info *t = m->ck->entries[i].info;
        if (strncmp(t->name, "layers.0.", 9) || t->ndim != 2 || !strstr(t->name, ".weight")) continue;
        double el = (double)di_tensor_numel(t) * (t->dtype == DI_I8 ? 2 : 1);
        if (strstr(t->name, "ffn.experts.")) expert += el;
        else dense += el;
    }
    for (int64_t q = 0; q < 64; q++) keys += (double)(q + 1 < W ? q + 1 : W);
    double want = 2.0 * 64 * (dense + expert * cfg->layer[0].n_active_experts / cfg->layer[0].n_experts) +
                  4.0 * cfg->num_attention_heads * hd * keys;
    assert_true(fabs(num(find_row(rows, "swa", "prefill", 0, 0), "flops") - want) < 1e-9 * want);

    /* the peer's times land on the matching rows only */
    json_t *d = find_row(rows, "swa", "decode", 2, 256), *p = find_row(rows, "swa", "prefill", 0, 0);
    assert_true(fabs(num(d, "peer_time_ms") - 2.5) < 1e-12 && fabs(num(p, "peer_time_ms") - 4.0) < 1e-12);
    assert_true(fabs(num(d, "peer_speedup") - 2.5 / num(d, "time_ms")) < 1e-9);
    assert_null(json_object_get(find_row(rows, "swa", "decode", 1, 256), "peer_time_ms"));
    assert_null(json_object_get(find_row(rows, "r1-reuse", "decode", 2, 256), "peer_time_ms"));
    di_model_close(m);
    json_decref(doc);
}

/* --prefill-first runs (and lists) the prefill before the decode shapes; --prefill-iters / --prefill-warmup
 * are the prefill's own counts, reported in the document. */
static void test_prefill_first(void **state) {
    (void)state;
    int st, lines;
    json_t *doc = run_bench("--batch 1 --context 64 --prefill 32 --iters 1 --warmup 0 --prefill-iters 3 "
                            "--prefill-warmup 0 --prefill-first --hbm-gbps 10",
                            &st, &lines);
    assert_int_equal(st, 0);
    json_t *rows = json_object_get(doc, "rows");
    assert_int_equal(json_array_size(rows), 6 * 2);
    for (size_t i = 0; i < json_array_size(rows); i++)
        assert_string_equal(json_string_value(json_object_get(json_array_get(rows, i), "mode")), i < 6 ? "prefill" : "decode");
    assert_int_equal((int)num(doc, "prefill_iters"), 3);
    assert_int_equal((int)num(doc, "prefill_warmup"), 0);
    assert_int_equal((int)num(doc, "iters"), 1);
    /* every finished shape's rows were printed on stderr as it finished: ≥ 12 row lines */
    tu_report("stderr lines of a 2-shape run: %d", lines);
    assert_true(lines >= 12);
    json_decref(doc);
}

/* The load's phase lines (what the next H200 run reads to see where a slow load spends its time): the
 * open phase with the checkpoint's tensor count, where its bytes are (file system, share in RAM: the
 * tiny model was just written, so its pages are in the page cache), the backend, then "loaded", in
 * that order. */
static void test_load_report(void **state) {
    (void)state;
    int st, lines;
    json_t *doc = run_bench("--batch 1 --context 64 --prefill 0 --iters 1 --warmup 0 --hbm-gbps 10", &st, &lines);
    assert_int_equal(st, 0);
    json_decref(doc);
    const char *e = last_stderr();
    const char *op = strstr(e, "bench gpu: opening "), *od = strstr(e, "bench gpu: opened in "),
               *ck = strstr(e, "bench gpu: checkpoint before the upload: "), *bk = strstr(e, "bench gpu: backend cpu created in "),
               *ld = strstr(e, " loaded on cpu in ");
    if (!op || !od || !ck || !bk || !ld)
        fail_msg("load phase lines missing from stderr:\n%s", e);
    assert_true(op < od && od < ck && ck < bk && bk < ld);
    di_model *m;
    di_error err = {0};
    assert_int_equal(di_model_open(g_dir, &m, &err), DI_OK);
    double secs, read_gb;
    long long tensors;
    assert_int_equal(sscanf(od, "bench gpu: opened in %lf s (%lld tensors; %lf GB read from storage)", &secs, &tensors,
                            &read_gb),
                     3);
    assert_int_equal(tensors, m->ck->n_tensors);
    assert_true(read_gb >= 0 || read_gb == -1); /* -1: no /proc/self/io */
    double gb, pct;
    int shards;
    char fs[32];
    if (sscanf(ck, "bench gpu: checkpoint before the upload: %lf GB in %d shards on %31s %lf%% in RAM", &gb, &shards, fs,
               &pct) != 4)
        fail_msg("unparsed storage line: %.200s", ck);
    assert_int_equal(shards, m->ck->n_shards);
    double bytes = 0;
    for (int i = 0; i < m->ck->n_shards; i++) bytes += (double)m->ck->shards[i]->file_size;
    assert_true(fabs(gb - bytes / 1e9) <= 0.05 + 1e-9);
    assert_true(strlen(fs) > 1 && fs[strlen(fs) - 1] == ','); /* "ext4," / "tmpfs," / "0x…," */
    assert_true(pct > 90 && pct <= 100);
    tu_report("tiny checkpoint: %.0f bytes, %d shards on %.*s, %.1f%% in RAM, opened in %.3f s", bytes, shards,
              (int)strlen(fs) - 1, fs, pct, secs);
    di_model_close(m);
}

static void test_bad_args(void **state) {
    (void)state;
    const char *bad[][2] = {
        {"--batch 0", "--batch"},          {"--batch 1,x", "--batch"},   {"--context 63", "--context 63"},
        {"--context ,", "--context"},      {"--iters 0", "iters"},       {"--device tpu", "--device"},
        {"--peer /nonexistent/p.json", "--peer"}, {"--bogus 1", "bogus"}, {"--hbm-gbps -3", "--hbm-gbps"},
        {"--op-times", "--op-times"}, {"--prefill-iters 0", "prefill-iters"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char args[256];
        snprintf(args, sizeof args, "%s --batch 1 --context 64 --prefill 0 --iters 1 --warmup 0 --hbm-gbps 10", bad[i][0]);
        if (!strncmp(bad[i][0], "--batch", 7) || !strncmp(bad[i][0], "--context", 9) || !strncmp(bad[i][0], "--iters", 7) ||
            !strncmp(bad[i][0], "--hbm", 5) || !strncmp(bad[i][0], "--prefill-iters", 15))
            snprintf(args, sizeof args, "%s", bad[i][0]); /* the option itself is the one under test */
        int st, lines;
        json_t *doc = run_bench(args, &st, &lines);
        const char *msg = json_string_value(json_object_get(doc, "error"));
        if (st != 1 || !msg || !strstr(msg, bad[i][1]) || strchr(msg, '\n'))
            fail_msg("`%s`: exit %d, error \"%s\" (expected exit 1 and a one-line reason naming %s)", bad[i][0], st,
                     msg ? msg : "(none)", bad[i][1]);
        assert_true(json_is_false(json_object_get(doc, "ok")));
        assert_true(lines <= 2); /* the reason (and at most a progress line) */
        json_decref(doc);
    }
}

/* A synthetic history reads back through the cache's own checks, is a pure function of the seed,
 * and a decode step after it runs. */
static void test_synthetic_cache(void **state) {
    (void)state;
    di_model *m;
    di_backend *be;
    di_error err = {0};
    assert_int_equal(di_model_open(g_dir, &m, &err), DI_OK);
    assert_int_equal(di_backend_create("cpu", 1, &be, &err), DI_OK);
    const di_config *cfg = &m->cfg;
    int64_t C = 256, hd = cfg->head_dim, ihd = cfg->index_head_dim, W = cfg->sliding_window;
    di_cache_opts co = {.max_tokens = C + 8, .spec_margin = -1, .be = be};
    di_cache *a, *b;
    assert_int_equal(di_cache_create(cfg, &co, &a, &err), DI_OK);
    assert_int_equal(di_cache_create(cfg, &co, &b, &err), DI_OK);
    assert_int_equal(di_cache_fill_synthetic(a, cfg, C, 5, &err), DI_OK);
    assert_int_equal(di_cache_len(a), C);
    uint16_t *rows = malloc(sizeof(uint16_t) * (size_t)(C * (hd > ihd ? hd : ihd))); /* bf16 [C, max(hd, ihd)] */
    assert_non_null(rows);
    int nonzero = 0;
    for (int st = 0; st < a->n_stages; st++) {
        assert_int_equal(di_cache_window_rows(a, st, C - W, C, rows, &err), DI_OK);
        for (int64_t i = 0; i < W * hd; i++) nonzero += (rows[i] & 0x7fff) != 0;
        if (!a->stage[st].ratio) continue;
        int64_t ne = C / a->stage[st].ratio;
        assert_int_equal(di_cache_n_entries(a, st), ne);
        assert_int_equal(di_cache_cmp_rows(a, st, 0, ne, rows, &err), DI_OK);
        for (int64_t i = 0; i < ne * hd; i++) assert_true((rows[i] & 0x7f80) != 0x7f80); /* finite */
        assert_int_equal(di_cache_ikey_rows(a, st, 0, ne, rows, &err), DI_OK);
    }
    assert_true(nonzero > 0);
    /* positions beyond the ring's reach are refused like in any sequence */
    assert_int_not_equal(di_cache_window_rows(a, 0, 0, 1, rows, &err), DI_OK);
    int32_t hist[DI_MAX_NGRAM];
    assert_int_equal(di_cache_engram_history(a, C, hist, &err), DI_OK);
    for (int i = 0; i < a->engram_hist; i++) assert_true(hist[i] >= 0 && hist[i] < cfg->engram_compressed_vocab_size);
    /* same seed, same bytes */
    assert_int_equal(di_cache_fill_synthetic(b, cfg, C, 5, &err), DI_OK);
    int64_t n = di_cache_image_bytes(a);
    uint8_t *ia = malloc((size_t)n), *ib = malloc((size_t)n);
    assert_int_equal(di_cache_image(a, ia, n, NULL, &err), DI_OK);
    assert_int_equal(di_cache_image(b, ib, n, NULL, &err), DI_OK);
    assert_memory_equal(ia, ib, (size_t)n);
    /* a paged cache (entry by entry through the block table) holds the same sequence as the
     * contiguous one (encoded entries replicated by doubling copies) */
    di_cache_pool_opts po = {.be = be, .max_tokens = C + 8, .spec_margin = -1, .page_tokens = 32, .n_pages = 16,
                             .n_slots = 1};
    di_cache_pool *pool;
    di_cache *pc;
    assert_int_equal(di_cache_pool_create(cfg, &po, &pool, &err), DI_OK);
    assert_int_equal(di_cache_pool_cache(pool, &pc, &err), DI_OK);
    assert_int_equal(di_cache_fill_synthetic(pc, cfg, C, 5, &err), DI_OK);
    assert_int_equal(di_cache_image_bytes(pc), n);
    assert_int_equal(di_cache_image(pc, ib, n, NULL, &err), DI_OK);
    assert_memory_equal(ia, ib, (size_t)n);
    di_cache_destroy(pc);
    di_cache_pool_destroy(pool);

    /* bad lengths: odd (ratio 2 pending), beyond capacity, on a non-empty cache */
    di_cache_reset(b);
    assert_int_equal(di_cache_fill_synthetic(b, cfg, 255, 1, &err), DI_ERR_INVALID);
    assert_int_equal(di_cache_fill_synthetic(b, cfg, C + 10, 1, &err), DI_ERR_INVALID);
    assert_int_equal(di_cache_fill_synthetic(a, cfg, 2, 1, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "synthetic cache"));

    /* a decode step after it, through a session */
    di_session *s;
    di_session_opts so = {.max_tokens = C + 1, .spec_margin = -1};
    assert_int_equal(di_session_create(m, be, &so, &s, &err), DI_OK);
    assert_int_equal(di_cache_fill_synthetic(s->cache, cfg, C, 9, &err), DI_OK);
    float *logits = malloc(sizeof(float) * (size_t)cfg->vocab_size); /* f32 [V] */
    int32_t tok = 17;
    if (di_session_forward(s, &tok, 1, false, logits, NULL, &err)) fail_msg("%s", err.msg);
    assert_int_equal(di_session_len(s), C + 1);
    for (int64_t v = 0; v < cfg->vocab_size; v++) assert_true(isfinite(logits[v]));
    di_session_destroy(s);
    free(logits), free(ia), free(ib), free(rows);
    di_cache_destroy(a), di_cache_destroy(b);
    di_model_close(m);
    di_backend_destroy(be);
}

/* The per-block hook: before/after each backbone block in layer order, once per pass; a non-zero
 * return aborts the pass with that status. */
typedef struct hook_log {
    int n, fail_at;
    int layer[64];
    bool after[64];
} hook_log;

static int log_hook(void *ctx, int layer, bool after, di_error *err) {
    hook_log *h = ctx;
    if (h->n == h->fail_at) return di_error_set(err, DI_ERR_INTERNAL, "hook refused layer %d", layer);
    if (h->n < 64) h->layer[h->n] = layer, h->after[h->n] = after;
    h->n++;
    return DI_OK;
}

static void test_block_hook(void **state) {
    (void)state;
    di_model *m;
    di_backend *be;
    di_session *s;
    di_error err = {0};
    assert_int_equal(di_model_open(g_dir, &m, &err), DI_OK);
    assert_int_equal(di_backend_create("cpu", 1, &be, &err), DI_OK);
    di_session_opts so = {.max_tokens = 16, .spec_margin = -1};
    assert_int_equal(di_session_create(m, be, &so, &s, &err), DI_OK);
    int nl = m->cfg.n_layers;
    int32_t ids[3] = {5, 6, 7};
    hook_log h = {.fail_at = -1};
    di_fwd_opts o = {.block_hook = log_hook, .block_hook_ctx = &h};
    assert_int_equal(di_session_forward(s, ids, 3, false, NULL, &o, &err), DI_OK);
    assert_int_equal(h.n, 2 * nl);
    for (int i = 0; i < 2 * nl; i++) {
        assert_int_equal(h.layer[i], i / 2);
        assert_int_equal(h.after[i], i % 2 == 1);
    }
    h = (hook_log){.fail_at = 3}; /* after layer 1 */
    assert_int_equal(di_session_forward(s, ids, 1, false, NULL, &o, &err), DI_ERR_INTERNAL);
    assert_non_null(strstr(err.msg, "hook refused layer 1"));
    assert_int_equal(di_session_len(s), 3); /* the failed chunk was rolled back */
    di_session_destroy(s);
    di_model_close(m);
    di_backend_destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_hook),
        cmocka_unit_test(test_synthetic_cache),
        cmocka_unit_test(test_json_rows),
        cmocka_unit_test(test_prefill_first),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_load_report),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
