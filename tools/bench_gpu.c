/* deepinfer bench gpu — per-layer decode and prefill times of one backend next to the memory and
 * compute rooflines (issue 10 item 3), beside the PyTorch peer (bench/torch_layer.py).
 *
 *   deepinfer bench gpu --model DIR [--device cuda|cpu] [--batch 1,8,64,256] [--context 4096,65536]
 *                       [--prefill 8192] [--iters N] [--warmup N] [--hbm-gbps G] [--fp8-tflops F]
 *                       [--prefill-iters N] [--prefill-warmup N] [--prefill-first] [--op-times] [--no-graph]
 *                       [--peer FILE]
 *                       [--threads N]
 *                       [--json]
 *
 * Layers: the first backbone layer of each role (swa, rR-kv-index-source, rR-kv-index-candidate-source,
 * rR-reindex, rR-reuse, "+engram" on Engram layers: the names torch_layer.py gives), all timed inside one forward of the whole
 * model through the forward's per-block hook (forward.h di_fwd_opts.block_hook), which synchronises
 * the device (a one-byte download) before and after each block; the median of --iters after
 * --warmup runs.
 *
 * Decode (B, C): B sessions, each with a synthetic history of C positions (model/cache_synth.h:
 * random but well-formed compact rows, read exactly like a real history), one batched forward of one
 * token per session (di_session_forward_batch), rolled back after each run so every run sees C.
 * Bytes the layer must read: its weights — attention, mHC, router, shared expert, norms (wo_a at its
 * bf16 size: it is dequantized at load) — plus the distinct routed experts the step activates (counted
 * from the router ids of one more, untimed step with the forward's dumps; JSON also gives the bound
 * min(B·top_k, n_experts)), plus per sequence the Engram rows of an Engram layer and the cache it reads: min(C, W) window
 * rows, min(⌊(C+1)/R⌋, index_topk) compressed entries, and the ⌊(C+1)/R⌋ index keys an index source
 * scans. Achieved GB/s = bytes ÷ time; roofline: --hbm-gbps (default 4470: the measured H200 HBM read)
 * on cuda, a streaming read measured in the same run on cpu (unless --hbm-gbps is given).
 *
 * Prefill (P tokens from position 0, one session): GEMM FLOPs of the layer — 2·P·(elements of every
 * 2-D weight except the Engram tables, the routed experts at top_k/n_experts of their elements) plus
 * attention 4·H·hd per (query, key) over the window and the visible compressed entries (≤ index_topk),
 * plus the indexer 2·Hi·ihd per (query, visible index key) on index sources — ÷ time, next to
 * --fp8-tflops (default 1445: the H200's dense FP8 peak).
 *
 * Graph-timed decode (CUDA build, B ≤ 64 — the passes the forward records as graphs, forward.c
 * graph_pass; --no-graph skips it): the same steps once more through a forward arena with CUDA graphs
 * on (forward.h di_fwd_arena), every pass recorded and replayed as one graph as the PyTorch peer
 * replays its step; the block hook only marks each block's start and end with an event that becomes a
 * node of the graph (backend/cuda/cuda_optime.h di_cuda_mark_block), so a block's time is GPU time inside a
 * replay, without the launch gaps and the per-block synchronisation of the eager rows. Median of the
 * --iters runs that ran as graphs (a pass the backend could not record runs op by op and is left out;
 * the count is on stderr); the `graph ms`, `g%roof` and `g.speedup` columns, graph_* in the JSON.
 *
 * --op-times (CUDA build): after each shape's timed runs, one more pass with a CUDA event around every
 * backend op (backend/cuda/cuda_optime.h); each row then lists its layer's ops by GPU time (op, GEMM
 * k × n and Σ m, calls, ms), on stderr as the shape finishes and under "ops" in the JSON. Each shape's
 * rows are printed on stderr as soon as it finishes, so a run cut short keeps what it measured.
 *
 * --peer FILE: the --json document of bench/torch_layer.py on the same checkpoint; its time for the
 * same role and shape fills the `peer ms` column and peer/ours the `speedup` column.
 *
 * Load (stderr, phase by phase as each ends): opening the checkpoint, the backend's creation, the
 * weights' upload with progress every 4 GB or 10 s (page-in of the mmapped checkpoint apart from the copy,
 * and the bytes the kernel read from storage for this process: /proc/self/io), and
 * where the checkpoint's bytes are — its file system and the fraction already in RAM (mincore), before
 * and after the upload, with MemTotal / MemAvailable and the system's Dirty / Writeback bytes (a
 * checkpoint just written to a disk may still be going out to it): a checkpoint on a disk that the page
 * cache does not hold loads at the disk's speed.
 *
 * Output: the table on stdout (on stderr with --json, whose one document, {"rows": [...]}, owns
 * stdout). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_optime.h"
#include "bench_read.h"
#include "cli.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/cache_synth.h"
#include "model/session.h"

#define MAX_LIST 16

/* Per-op timing (backend/cuda/cuda_optime.h) lives in the CUDA objects: weak references, so the CLI
 * without CUDA links and answers --op-times with a clear message. */
extern int di_cuda_optime_install(di_backend *be, di_error *err) __attribute__((weak));
extern void di_cuda_optime_enable(int on) __attribute__((weak));
extern void di_cuda_optime_tag(int tag) __attribute__((weak));
extern int di_cuda_optime_collect(di_optime_row **rows, int *n_rows, di_error *err) __attribute__((weak));
extern int di_cuda_mark_block(void *be, int L, bool after, di_error *err) __attribute__((weak));
extern int di_cuda_mark_ms(int a, int b, double *ms, di_error *err) __attribute__((weak));

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------- what a layer reads and computes ---------------- */

/* Role name of backbone layer L, as bench/torch_layer.py role_name spells it (the peer join key). */
static void role_name(const di_config *cfg, int L, char *out, size_t cap) {
    const di_layer_cfg *lc = &cfg->layer[L];
    int r = lc->compress_ratio;
    if (r == 0) snprintf(out, cap, "swa");
    else if (lc->is_kv_source && lc->is_candidate_source) snprintf(out, cap, "r%d-kv-index-candidate-source", r);
    else if (lc->is_kv_source) snprintf(out, cap, "r%d-kv-index-source", r);
    else if (lc->is_index_source) snprintf(out, cap, "r%d-reindex", r);
    else snprintf(out, cap, "r%d-reuse", r);
    if (lc->engram_index >= 0) {
        size_t n = strlen(out);
        snprintf(out + n, cap - n, "+engram");
    }
}

typedef struct layer_cost {
    double dense_bytes;   /* weights a decode step reads in full */
    double expert_bytes;  /* one routed expert (all its tensors) */
    double engram_row_bytes; /* Engram rows one token gathers (0 off Engram layers) */
    double gemm_elems;    /* elements of the dense 2-D weights (one token: 2× this in FLOPs) */
    double expert_elems;  /* elements of one routed expert */
} layer_cost;

static bool has(const char *s, const char *part) { return strstr(s, part) != NULL; }

static void count_layer(const di_model *m, int L, layer_cost *lc) {
    const di_config *cfg = &m->cfg;
    const di_checkpoint *ck = m->ck;
    int E = cfg->layer[L].n_experts > 0 ? cfg->layer[L].n_experts : 1;
    char prefix[32];
    int pl = snprintf(prefix, sizeof prefix, "layers.%d.", L);
    memset(lc, 0, sizeof *lc);
    for (int64_t i = 0; i < ck->n_tensors; i++) {
        const di_tensor_info *t = ck->entries[i].info;
        const char *nm = t->name;
        if (strncmp(nm, prefix, (size_t)pl)) continue;
        double b = (double)(t->end - t->begin);
        /* two packed FP4 codes per I8 byte */
        double el = (double)di_tensor_numel(t) * (t->dtype == DI_I8 ? 2 : 1);
        bool gemm = t->ndim == 2 && has(nm, ".weight") && !has(nm, "embed");
        if (has(nm, "engram.embed.")) {
            double rows = t->shape[0] > 0 ? (double)t->shape[0] : 1;
            lc->engram_row_bytes += b / rows * (cfg->engram_max_ngram_size - 1) * cfg->engram_n_heads;
            continue;
        }
        if (has(nm, "ffn.experts.")) {
            lc->expert_bytes += b / E;
            if (gemm) lc->expert_elems += el / E;
            continue;
        }
        if (has(nm, "attn.wo_a.scale")) continue;
        lc->dense_bytes += has(nm, "attn.wo_a.weight") ? 2.0 * (double)t->shape[0] * (double)t->shape[1] : b;
        if (gemm) lc->gemm_elems += el;
    }
}

/* Cache bytes one sequence's decode step at context C reads in layer L. */
static double cache_read_bytes(const di_config *cfg, const di_cache_size *cs, int L, int64_t C) {
    const di_layer_cfg *lc = &cfg->layer[L];
    double b = (double)(C < cfg->sliding_window ? C : cfg->sliding_window) * (double)cs->window_slot_bytes;
    if (lc->compress_ratio > 0) {
        int64_t n = (C + 1) / lc->compress_ratio;
        b += (double)(n < cfg->index_topk ? n : cfg->index_topk) * (double)cs->cmp_entry_bytes;
        if (lc->is_index_source) b += (double)n * (double)cs->index_key_bytes;
    }
    return b;
}

/* FLOPs of layer L over a P-token prefill from position 0. */
static double prefill_flops(const di_config *cfg, const layer_cost *c, int L, int64_t P) {
    const di_layer_cfg *lc = &cfg->layer[L];
    double f = 2.0 * (double)P * (c->gemm_elems + c->expert_elems * lc->n_active_experts);
    double keys = 0, ikeys = 0; /* Σ over queries of attended keys / scanned index keys */
    for (int64_t p = 0; p < P; p++) {
        keys += (double)(p + 1 < cfg->sliding_window ? p + 1 : cfg->sliding_window);
        if (lc->compress_ratio > 0) {
            int64_t n = (p + 1) / lc->compress_ratio;
            keys += (double)(n < cfg->index_topk ? n : cfg->index_topk);
            if (lc->is_index_source) ikeys += (double)n;
        }
    }
    f += 4.0 * cfg->num_attention_heads * cfg->head_dim * keys;
    f += 2.0 * cfg->index_n_heads * cfg->index_head_dim * ikeys;
    return f;
}

/* ---------------- per-block timing ---------------- */

typedef struct timer {
    const di_backend *be;
    void *probe;       /* u8 [64] backend memory: downloading one byte waits for the device */
    double t0[DI_MAX_STAGES], ms[DI_MAX_STAGES];
} timer;

static int timer_hook(void *ctx, int L, bool after, di_error *err) {
    timer *t = ctx;
    unsigned char b;
    int rc = t->be->mem_download(t->be, &b, t->probe, 1, err);
    if (rc || L < 0 || L >= DI_MAX_STAGES) return rc;
    double now = now_s();
    if (!after) t->t0[L] = now;
    else t->ms[L] = 1e3 * (now - t->t0[L]);
    return DI_OK;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---------------- rows ---------------- */

typedef struct row {
    char role[48];
    int layer;
    bool prefill;
    int64_t batch, ctx, tokens;
    double ms;
    double graph_ms; /* decode, graph-timed (NAN: not measured) */
    int graph_runs;  /* the runs that ran as graphs (of --iters) */
    double weight_bytes, expert_bytes, cache_bytes, bytes;
    int64_t experts_read;  /* distinct experts the router picked in the step (one untimed pass) */
    int64_t experts_bound; /* min(B·top_k, n_experts) */
    double flops;
    double peer_ms; /* NAN: none */
    di_optime_row *ops; /* --op-times: this layer's ops in one more pass, largest first (malloc'd) */
    int n_ops;
} row;

typedef struct bench {
    const di_model *m;
    const di_backend *be;
    int iters, warmup;
    int pf_iters, pf_warmup; /* prefill's own counts (an exact-kernel 8K prefill takes seconds) */
    bool op_times;           /* one more pass per shape with per-op CUDA events */
    di_fwd_arena *arena;     /* graph-timed decode: the passes' arena, graphs on (NULL: not measured) */
    di_optime_row *ops;      /* that pass's rows, all layers (malloc'd), n_ops of them */
    int n_ops;
    double roof_Bps, peak_flops;
    int n_roles, layer[DI_MAX_STAGES];
    char role[DI_MAX_STAGES][48];
    layer_cost cost[DI_MAX_STAGES];
    timer tm;
    row *rows;
    int n_rows, cap_rows;
} bench;

static row *add_row(bench *b, di_error *err) {
    if (b->n_rows == b->cap_rows) {
        int cap = b->cap_rows ? 2 * b->cap_rows : 32;
        row *r = realloc(b->rows, sizeof(row) * (size_t)cap);
        if (!r) {
            di_error_set(err, DI_ERR_NOMEM, "bench gpu: result rows");
            return NULL;
        }
        b->rows = r, b->cap_rows = cap;
    }
    row *r = &b->rows[b->n_rows++];
    memset(r, 0, sizeof *r);
    r->peer_ms = NAN, r->graph_ms = NAN;
    return r;
}

static uint64_t xs(uint64_t *r) {
    *r ^= *r << 13, *r ^= *r >> 7, *r ^= *r << 17;
    return *r;
}

/* Runs fn iters + warmup times, the hook timing each block; ms[i][L] of the measured runs. Then the
 * median per role layer into out_ms. */
typedef int (*run_fn)(void *ctx, const di_fwd_opts *o, di_error *err);

/* --op-times pass: the hook only moves the op timer's tag (no synchronisation inside the pass). */
static int optime_hook(void *ctx, int L, bool after, di_error *err) {
    (void)ctx, (void)err;
    di_cuda_optime_tag(after ? -1 : L);
    return DI_OK;
}

static int measure(bench *b, run_fn fn, void *ctx, int iters, int warmup, double *out_ms, di_error *err) {
    double *v = malloc(sizeof(double) * (size_t)iters * DI_MAX_STAGES); /* f64 [iters, stages] */
    if (!v) return di_error_set(err, DI_ERR_NOMEM, "bench gpu: timings");
    di_fwd_opts o = {.block_hook = timer_hook, .block_hook_ctx = &b->tm};
    int rc = DI_OK;
    for (int it = 0; it < warmup + iters && !rc; it++) {
        memset(b->tm.ms, 0, sizeof b->tm.ms);
        rc = fn(ctx, &o, err);
        if (it >= warmup) memcpy(v + (it - warmup) * DI_MAX_STAGES, b->tm.ms, sizeof b->tm.ms);
    }
    for (int k = 0; k < b->n_roles && !rc; k++) {
        double col[4096];
        int n = iters < 4096 ? iters : 4096;
        for (int i = 0; i < n; i++) col[i] = v[i * DI_MAX_STAGES + b->layer[k]];
        out_ms[k] = median(col, n);
    }
    free(v);
    free(b->ops), b->ops = NULL, b->n_ops = 0;
    if (!rc && b->op_times) {
        di_fwd_opts oo = {.block_hook = optime_hook};
        di_cuda_optime_enable(1);
        rc = fn(ctx, &oo, err);
        di_cuda_optime_enable(0);
        di_cuda_optime_tag(-1);
        di_error e2 = {0};
        int rc2 = di_cuda_optime_collect(&b->ops, &b->n_ops, &e2);
        if (!rc && rc2) *err = e2, rc = rc2;
    }
    return rc;
}

/* Runs fn iters + warmup times through the arena with graphs on, the marks inside each pass; the
 * median per role layer of the measured runs that ran as graphs into out_ms (NAN where none did),
 * their count into *n_graph. */
static int measure_graph(bench *b, run_fn fn, void *ctx, double *out_ms, int *n_graph, di_error *err) {
    double *v = malloc(sizeof(double) * (size_t)b->iters * DI_MAX_STAGES); /* f64 [iters, roles] */
    if (!v) return di_error_set(err, DI_ERR_NOMEM, "bench gpu: graph timings");
    di_fwd_opts o = {.block_hook = di_cuda_mark_block, .block_hook_ctx = (void *)b->be, .block_hook_async = true,
                     .logits_on_device = true, .arena = b->arena};
    int rc = DI_OK, n = 0;
    for (int it = 0; it < b->warmup + b->iters && !rc; it++) {
        di_fwd_arena_stats s0, s1;
        di_fwd_arena_get_stats(b->arena, &s0);
        rc = fn(ctx, &o, err);
        di_fwd_arena_get_stats(b->arena, &s1);
        bool graph = s1.captures + s1.replays > s0.captures + s0.replays;
        if (rc || it < b->warmup || !graph) continue;
        for (int k = 0; k < b->n_roles && !rc; k++)
            if (b->layer[k] < DI_CUDA_MARK_BLOCKS) /* later layers carry no marks */
                rc = di_cuda_mark_ms(2 * b->layer[k], 2 * b->layer[k] + 1, &v[n * DI_MAX_STAGES + k], err);
        n++;
    }
    for (int k = 0; k < b->n_roles && !rc; k++) {
        double col[4096];
        for (int i = 0; i < n; i++) col[i] = v[i * DI_MAX_STAGES + k];
        out_ms[k] = n && b->layer[k] < DI_CUDA_MARK_BLOCKS ? median(col, n) : NAN;
    }
    *n_graph = n;
    free(v);
    return rc;
}

/* Copies this pass's op rows of layer L into w->ops. */
static int take_ops(bench *b, row *w, int L, di_error *err) {
    int n = 0;
    for (int i = 0; i < b->n_ops; i++) n += b->ops[i].tag == L;
    if (!n) return DI_OK;
    if (!(w->ops = malloc(sizeof(di_optime_row) * (size_t)n))) return di_error_set(err, DI_ERR_NOMEM, "bench gpu: op rows");
    for (int i = 0; i < b->n_ops; i++)
        if (b->ops[i].tag == L) w->ops[w->n_ops++] = b->ops[i];
    return DI_OK;
}

static void print_header(FILE *f);
static void print_row(FILE *f, const row *w, double roof_Bps, double peak_flops);

/* A finished shape's rows at once on stderr, with their op breakdown (a cut-short run keeps them). */
static void report_rows(const bench *b, int first) {
    for (int k = first; k < b->n_rows; k++) {
        const row *w = &b->rows[k];
        print_row(stderr, w, b->roof_Bps, b->peak_flops);
        double sum = 0;
        for (int i = 0; i < w->n_ops; i++) sum += w->ops[i].ms;
        if (w->n_ops)
            fprintf(stderr, "  ops of layer %d (one more pass): %.3f ms on the GPU in %d op groups, block wall %.3f ms\n",
                    w->layer, sum, w->n_ops, w->ms);
        for (int i = 0; i < w->n_ops && i < 14; i++) {
            const di_optime_row *o = &w->ops[i];
            char shp[48] = "";
            if (o->k) snprintf(shp, sizeof shp, "k%lld n%lld m%lld", (long long)o->k, (long long)o->n, (long long)o->rows);
            fprintf(stderr, "    %-20s %-26s %6lld calls %9.3f ms %5.1f%%\n", o->op, shp, (long long)o->calls, o->ms,
                    sum > 0 ? 100 * o->ms / sum : 0);
        }
    }
    fflush(stderr);
}

typedef struct decode_ctx {
    di_session_chunk *chunks; /* [B] */
    int B;
} decode_ctx;

static int decode_run(void *ctx, const di_fwd_opts *o, di_error *err) {
    decode_ctx *d = ctx;
    int rc = di_session_forward_batch(d->chunks, d->B, o, err);
    for (int i = 0; i < d->B && !rc; i++) rc = di_session_rollback(d->chunks[i].s, 1, err);
    return rc;
}

/* Distinct routed experts per layer, from one untimed pass's "L<i>.ffn.route_ids" dumps
 * (int32 [T, top_k]). */
#define MAX_EXPERTS 1024
typedef struct expert_count {
    unsigned char seen[DI_MAX_STAGES][MAX_EXPERTS];
} expert_count;

static void count_experts(void *ctx, const char *name, di_dtype dtype, int ndim, const int64_t *shape,
                          const void *data) {
    expert_count *ec = ctx;
    int L, end = 0;
    if (sscanf(name, "L%d.ffn.route_ids%n", &L, &end) != 1 || name[end] || dtype != DI_I32 || L < 0 ||
        L >= DI_MAX_STAGES)
        return;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    for (int64_t i = 0; i < n; i++) {
        int32_t e = ((const int32_t *)data)[i];
        if (e >= 0 && e < MAX_EXPERTS) ec->seen[L][e] = 1;
    }
}

static int bench_decode(bench *b, int64_t B, int64_t C, di_error *err) {
    const di_config *cfg = &b->m->cfg;
    di_session **ss = calloc((size_t)B, sizeof *ss);
    di_session_chunk *ch = calloc((size_t)B, sizeof *ch);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)B); /* int32 [B] one token per sequence */
    expert_count *ec = NULL;
    int rc = DI_OK;
    if (!ss || !ch || !ids) {
        rc = di_error_set(err, DI_ERR_NOMEM, "bench gpu: %lld sequences", (long long)B);
        goto done;
    }
    uint64_t r = 0x9E3779B97F4A7C15ull ^ (uint64_t)(B * 131 + C);
    double t0 = now_s();
    for (int64_t i = 0; i < B && !rc; i++) {
        di_session_opts so = {.max_tokens = C + 1, .spec_margin = -1, .dspark = false};
        rc = di_session_create(b->m, b->be, &so, &ss[i], err);
        if (!rc) rc = di_cache_fill_synthetic(ss[i]->cache, cfg, C, (uint64_t)i + 1, err);
        ids[i] = (int32_t)(xs(&r) % (uint64_t)cfg->vocab_size);
        ch[i] = (di_session_chunk){.s = ss[i], .ids = &ids[i], .n = 1};
    }
    /* where a shape's time goes: the sessions' synthetic histories, the timed runs, the router pass */
    double t1 = now_s();
    if (!rc)
        fprintf(stderr, "bench gpu:   %lld sessions with %lld synthetic positions each in %.1f s\n", (long long)B,
                (long long)C, t1 - t0);
    double ms[DI_MAX_STAGES], gms[DI_MAX_STAGES];
    int n_graph = 0;
    decode_ctx d = {ch, (int)B};
    if (!rc) rc = measure(b, decode_run, &d, b->iters, b->warmup, ms, err);
    bool graphed = b->arena && B <= 64; /* forward.c graph_pass: passes of ≤ 64 rows */
    double tg = now_s();
    if (!rc && graphed) {
        rc = measure_graph(b, decode_run, &d, gms, &n_graph, err);
        fprintf(stderr, "bench gpu:   graph-timed: %d of %d runs as graphs in %.1f s\n", n_graph, b->iters,
                now_s() - tg);
    }
    double t2 = now_s();
    if (!rc) ec = calloc(1, sizeof *ec);
    if (!rc && !ec) rc = di_error_set(err, DI_ERR_NOMEM, "bench gpu: expert counts");
    if (!rc) { /* the same step once more, untimed, to see which experts the router picks */
        di_fwd_opts o = {.dump = count_experts, .dump_ctx = ec};
        rc = decode_run(&d, &o, err);
    }
    if (!rc)
        fprintf(stderr, "bench gpu:   %d runs%s in %.1f s, the router pass in %.1f s\n", b->warmup + b->iters,
                b->op_times ? " + the op-times pass" : "", t2 - t1, now_s() - t2);
    di_cache_size cs;
    di_cache_opts co = {.max_tokens = C + 1, .spec_margin = 0};
    if (!rc) rc = di_cache_size_of(cfg, &co, &cs, err);
    for (int k = 0; k < b->n_roles && !rc; k++) {
        int L = b->layer[k];
        const layer_cost *c = &b->cost[L];
        row *w = add_row(b, err);
        if (!w) {
            rc = err->code;
            break;
        }
        int64_t E = cfg->layer[L].n_experts, act = B * cfg->layer[L].n_active_experts;
        snprintf(w->role, sizeof w->role, "%s", b->role[k]);
        w->layer = L, w->batch = B, w->ctx = C, w->tokens = B, w->ms = ms[k];
        if (graphed) w->graph_ms = gms[k], w->graph_runs = n_graph;
        w->experts_bound = act < E ? act : E;
        for (int e = 0; e < E && e < MAX_EXPERTS; e++) w->experts_read += ec->seen[L][e];
        if (!w->experts_read || E > MAX_EXPERTS) w->experts_read = w->experts_bound; /* no dump: the bound */
        w->weight_bytes = c->dense_bytes;
        w->expert_bytes = c->expert_bytes * (double)w->experts_read;
        w->cache_bytes = (double)B * (cache_read_bytes(cfg, &cs, L, C) + c->engram_row_bytes);
        w->bytes = w->weight_bytes + w->expert_bytes + w->cache_bytes;
        rc = take_ops(b, w, L, err);
    }
done:
    for (int64_t i = 0; ss && i < B; i++) di_session_destroy(ss[i]);
    free(ss), free(ch), free(ids), free(ec);
    return rc;
}

typedef struct prefill_ctx {
    di_session *s;
    const int32_t *ids;
    int64_t P;
} prefill_ctx;

static int prefill_run(void *ctx, const di_fwd_opts *o, di_error *err) {
    prefill_ctx *p = ctx;
    di_session_reset(p->s);
    return di_session_forward(p->s, p->ids, p->P, false, NULL, o, err);
}

static int bench_prefill(bench *b, int64_t P, di_error *err) {
    const di_config *cfg = &b->m->cfg;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)P); /* int32 [P] random prompt */
    di_session *s = NULL;
    if (!ids) return di_error_set(err, DI_ERR_NOMEM, "bench gpu: %lld prompt ids", (long long)P);
    uint64_t r = 0x2545F4914F6CDD1Dull;
    for (int64_t i = 0; i < P; i++) ids[i] = (int32_t)(xs(&r) % (uint64_t)cfg->vocab_size);
    di_session_opts so = {.max_tokens = P, .spec_margin = -1, .dspark = false};
    double t0 = now_s();
    int rc = di_session_create(b->m, b->be, &so, &s, err);
    double ms[DI_MAX_STAGES];
    prefill_ctx p = {s, ids, P};
    double t1 = now_s();
    if (!rc) rc = measure(b, prefill_run, &p, b->pf_iters, b->pf_warmup, ms, err);
    if (!rc)
        fprintf(stderr, "bench gpu:   session in %.1f s, %d runs%s in %.1f s\n", t1 - t0, b->pf_warmup + b->pf_iters,
                b->op_times ? " + the op-times pass" : "", now_s() - t1);
    for (int k = 0; k < b->n_roles && !rc; k++) {
        row *w = add_row(b, err);
        if (!w) {
            rc = err->code;
            break;
        }
        snprintf(w->role, sizeof w->role, "%s", b->role[k]);
        w->layer = b->layer[k], w->prefill = true, w->batch = 1, w->tokens = P, w->ms = ms[k];
        w->flops = prefill_flops(cfg, &b->cost[b->layer[k]], b->layer[k], P);
        rc = take_ops(b, w, b->layer[k], err);
    }
    di_session_destroy(s);
    free(ids);
    return rc;
}

/* ---------------- load, phase by phase ---------------- */

/* The weights' upload seen from the backend table: mem_upload / mem_map_host wrapped for the load, so
 * stderr shows progress and where the time goes — paging the checkpoint in (one read per page before
 * each copy: the mmap faults, i.e. the storage) apart from the copy itself (staging + PCIe). A load
 * that reads a disk-backed checkpoint (not in the page cache) runs at the disk's speed; one from tmpfs
 * at the copy's (36 GB in 8.1 s on the H200 at 39acd46). */
typedef struct load_watch {
    int (*upload)(const di_backend *be, void *dst, const void *src, size_t bytes, di_error *err);
    int (*map_host)(const di_backend *be, const void *host, size_t bytes, const void **view, di_error *err);
    const char *device;
    size_t page;
    double t0, total, done, next; /* bytes */
    double last, read0;           /* time of the last progress line; storage reads before the upload */
    double page_in_s, copy_s, map_s, map_bytes;
    long uploads, maps;
    unsigned sink;
} load_watch;

static load_watch g_watch; /* one load at a time: the table's slots take no context */

static int watch_upload(const di_backend *be, void *dst, const void *src, size_t bytes, di_error *err) {
    load_watch *w = &g_watch;
    double t0 = now_s();
    const volatile unsigned char *p = src;
    unsigned acc = 0;
    for (size_t o = 0; o < bytes; o += w->page) acc += p[o];
    if (bytes) acc += p[bytes - 1];
    w->sink += acc;
    double t1 = now_s();
    int rc = w->upload(be, dst, src, bytes, err);
    double t2 = now_s();
    w->page_in_s += t1 - t0, w->copy_s += t2 - t1, w->done += (double)bytes, w->uploads++;
    if (w->done >= w->next || t2 - w->last >= 10) { /* every 4 GB, and every 10 s of a slow one */
        double el = t2 - w->t0, rd = bench_storage_read_bytes();
        fprintf(stderr,
                "bench gpu: weights to %s: %.1f of %.1f GB in %.1f s (%.2f GB/s; page-in %.1f s, copy %.1f s; "
                "%.1f GB read from storage)\n",
                w->device, w->done / 1e9, w->total / 1e9, el, el > 0 ? w->done / el / 1e9 : 0, w->page_in_s, w->copy_s,
                rd >= 0 && w->read0 >= 0 ? (rd - w->read0) / 1e9 : -1.0);
        while (w->next <= w->done) w->next += 4e9;
        w->last = t2;
    }
    return rc;
}

static int watch_map_host(const di_backend *be, const void *host, size_t bytes, const void **view, di_error *err) {
    double t0 = now_s();
    int rc = g_watch.map_host(be, host, bytes, view, err);
    g_watch.map_s += now_s() - t0, g_watch.map_bytes += (double)bytes, g_watch.maps++;
    return rc;
}

static void report_storage(const di_model *m, const char *dir, const char *when) {
    const di_checkpoint *ck = m->ck;
    void *maps[256];   /* [shards] each shard's whole-file mapping (the first 256) */
    size_t sizes[256]; /* [shards] its bytes */
    int n = ck->n_shards < 256 ? ck->n_shards : 256;
    double bytes = 0;
    for (int i = 0; i < n; i++) maps[i] = ck->shards[i]->map, sizes[i] = ck->shards[i]->file_size, bytes += (double)sizes[i];
    bench_storage st;
    bench_fs_name(dir, st.fs, sizeof st.fs);
    st.resident = bench_resident(maps, sizes, n);
    bench_meminfo(&st);
    fprintf(stderr, "bench gpu: checkpoint %s: %.1f GB in %d shards on %s, %.1f%% in RAM (page cache / tmpfs); "
            "MemTotal %.1f GiB, MemAvailable %.1f GiB, Dirty %.1f GiB, Writeback %.1f GiB\n", when, bytes / 1e9,
            ck->n_shards, st.fs, st.resident >= 0 ? 100 * st.resident : -1.0, st.mem_total_gib, st.mem_avail_gib,
            st.dirty_gib, st.writeback_gib);
    if (!strcmp(when, "before the upload") && st.resident >= 0 && st.resident < 0.5 && strcmp(st.fs, "tmpfs"))
        fprintf(stderr, "bench gpu: warning: most of the checkpoint is not in RAM: loading it reads %s at the "
                "storage's speed (a tmpfs checkpoint loads at the copy's; scripts/bench_gpu.sh mounts one)\n", st.fs);
}

/* di_model_open + di_backend_create + di_model_to_backend, each phase timed on stderr as it ends (a
 * load cut short shows the phase it was in). */
static int load_model(const char *dir, const char *device, int threads, di_model **m, di_backend **be, di_error *err) {
    double t0 = now_s(), rd0 = bench_storage_read_bytes();
    fprintf(stderr, "bench gpu: opening %s (config, shards, inventory, weight views, wo_a to bf16)\n", dir);
    int rc = di_model_open(dir, m, err);
    if (rc) return rc;
    double t1 = now_s(), rd1 = bench_storage_read_bytes();
    fprintf(stderr, "bench gpu: opened in %.1f s (%lld tensors; %.2f GB read from storage)\n", t1 - t0,
            (long long)(*m)->ck->n_tensors, rd0 >= 0 && rd1 >= 0 ? (rd1 - rd0) / 1e9 : -1.0);
    report_storage(*m, dir, "before the upload");
    if ((rc = di_backend_create(device, threads, be, err))) return rc;
    double t2 = now_s();
    fprintf(stderr, "bench gpu: backend %s created in %.1f s\n", device, t2 - t1);
    if ((*be)->host_memory) return di_model_to_backend(*m, *be, err); /* views in place: nothing to move */
    const di_weights *w = &(*m)->w;
    load_watch *lw = &g_watch;
    memset(lw, 0, sizeof *lw);
    lw->upload = (*be)->mem_upload, lw->map_host = (*be)->mem_map_host, lw->device = device;
    long pg = sysconf(_SC_PAGESIZE);
    lw->page = pg > 0 ? (size_t)pg : 4096;
    for (int64_t i = 0; i < w->n_slots; i++)
        if (!w->slots[i].mapped) lw->total += (double)w->slots[i].bytes;
    lw->next = 4e9, lw->t0 = lw->last = t2, lw->read0 = bench_storage_read_bytes();
    (*be)->mem_upload = watch_upload, (*be)->mem_map_host = watch_map_host;
    rc = di_model_to_backend(*m, *be, err);
    (*be)->mem_upload = lw->upload, (*be)->mem_map_host = lw->map_host;
    if (rc) return rc;
    double t3 = now_s();
    unsigned char b; /* the last copies may still be in flight: wait for the stream */
    if ((*m)->w.dev && (rc = (*be)->mem_download(*be, &b, (*m)->w.dev, 1, err))) return rc;
    double t4 = now_s();
    double rd = bench_storage_read_bytes();
    fprintf(stderr, "bench gpu: weights on %s: %.1f GB in %ld uploads in %.1f s (%.2f GB/s; page-in %.1f s, copy %.1f s, "
            "drain %.1f s; %.1f GB read from storage), %.2f GB of host tables in %ld mappings in %.1f s\n", device,
            lw->done / 1e9, lw->uploads, t4 - t2, t4 > t2 ? lw->done / (t4 - t2) / 1e9 : 0, lw->page_in_s, lw->copy_s,
            t4 - t3, rd >= 0 && lw->read0 >= 0 ? (rd - lw->read0) / 1e9 : -1.0, lw->map_bytes / 1e9, lw->maps, lw->map_s);
    report_storage(*m, dir, "after the upload");
    return DI_OK;
}

/* ---------------- peer (torch_layer.py --json) ---------------- */

static int peer_join(bench *b, const char *path, di_error *err) {
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je);
    if (!doc) return di_error_set(err, DI_ERR_FORMAT, "--peer %s: %s (line %d)", path, je.text, je.line);
    json_t *layers = json_object_get(doc, "layers");
    if (!json_is_array(layers)) {
        json_decref(doc);
        return di_error_set(err, DI_ERR_FORMAT, "--peer %s: no \"layers\" array (expected bench/torch_layer.py --json output)",
                            path);
    }
    size_t i, j;
    json_t *ly, *res;
    json_array_foreach(layers, i, ly) {
        const char *role = json_string_value(json_object_get(ly, "role"));
        if (!role) continue;
        json_array_foreach(json_object_get(ly, "results"), j, res) {
            const char *mode = json_string_value(json_object_get(res, "mode"));
            double ms = json_number_value(json_object_get(res, "time_ms"));
            if (!mode || !(ms > 0)) continue;
            bool pre = !strcmp(mode, "prefill");
            int64_t bt = json_integer_value(json_object_get(res, pre ? "tokens" : "batch"));
            int64_t cx = pre ? 0 : json_integer_value(json_object_get(res, "ctx"));
            for (int k = 0; k < b->n_rows; k++) {
                row *w = &b->rows[k];
                if (strcmp(w->role, role) || w->prefill != pre) continue;
                if (pre ? w->tokens == bt : (w->batch == bt && w->ctx == cx)) w->peer_ms = ms;
            }
        }
    }
    json_decref(doc);
    return DI_OK;
}

/* ---------------- CLI ---------------- */

/* "1,8,64" → list; false (after cli_fail) on anything but 1..16 integers in [lo, hi]. */
static bool parse_list(const di_cli *cli, const char *opt, const char *s, long long lo, long long hi, int64_t *out,
                       int *n) {
    *n = 0;
    if (!s || !*s) return cli_fail(cli, "--%s: expected a comma-separated list of integers", opt), false;
    for (const char *p = s; *p;) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || (*end && *end != ',') || v < lo || v > hi || *n == MAX_LIST)
            return cli_fail(cli, "--%s %s: expected up to %d comma-separated integers in [%lld, %lld]", opt, s, MAX_LIST,
                            lo, hi),
                   false;
        out[(*n)++] = v;
        p = *end ? end + 1 : end;
    }
    return true;
}

static json_t *row_json(const row *w, double roof_Bps, double peak_flops) {
    json_t *o = json_object();
    json_object_set_new(o, "role", json_string(w->role));
    json_object_set_new(o, "layer", json_integer(w->layer));
    json_object_set_new(o, "mode", json_string(w->prefill ? "prefill" : "decode"));
    json_object_set_new(o, "batch", json_integer(w->batch));
    json_object_set_new(o, "ctx", json_integer(w->ctx));
    json_object_set_new(o, "tokens", json_integer(w->tokens));
    json_object_set_new(o, "time_ms", json_real(w->ms));
    if (w->prefill) {
        double tf = w->flops / (w->ms * 1e-3);
        json_object_set_new(o, "flops", json_real(w->flops));
        json_object_set_new(o, "tflops", json_real(tf / 1e12));
        json_object_set_new(o, "peak_fraction", json_real(tf / peak_flops));
    } else {
        double bw = w->bytes / (w->ms * 1e-3);
        json_object_set_new(o, "weight_bytes", json_real(w->weight_bytes));
        json_object_set_new(o, "experts_read", json_integer(w->experts_read));
        json_object_set_new(o, "experts_bound", json_integer(w->experts_bound));
        json_object_set_new(o, "expert_bytes", json_real(w->expert_bytes));
        json_object_set_new(o, "cache_bytes", json_real(w->cache_bytes));
        json_object_set_new(o, "bytes", json_real(w->bytes));
        json_object_set_new(o, "gb_s", json_real(bw / 1e9));
        json_object_set_new(o, "roofline_fraction", json_real(bw / roof_Bps));
        if (!isnan(w->graph_ms)) {
            json_object_set_new(o, "graph_time_ms", json_real(w->graph_ms));
            json_object_set_new(o, "graph_runs", json_integer(w->graph_runs));
            json_object_set_new(o, "graph_roofline_fraction", json_real(w->bytes / (w->graph_ms * 1e-3) / roof_Bps));
        }
    }
    if (!isnan(w->peer_ms)) {
        json_object_set_new(o, "peer_time_ms", json_real(w->peer_ms));
        json_object_set_new(o, "peer_speedup", json_real(w->peer_ms / w->ms));
        if (!isnan(w->graph_ms)) json_object_set_new(o, "graph_peer_speedup", json_real(w->peer_ms / w->graph_ms));
    }
    if (w->n_ops) {
        json_t *ops = json_array();
        for (int i = 0; i < w->n_ops; i++) {
            const di_optime_row *r = &w->ops[i];
            json_array_append_new(ops, json_pack("{s:s, s:I, s:I, s:I, s:I, s:f}", "op", r->op, "k", (json_int_t)r->k,
                                                 "n", (json_int_t)r->n, "calls", (json_int_t)r->calls, "rows",
                                                 (json_int_t)r->rows, "ms", r->ms));
        }
        json_object_set_new(o, "ops", ops);
    }
    return o;
}

static void print_header(FILE *f) {
    fprintf(f, "%-36s %5s %7s %5s %6s %6s %10s %9s %7s %9s %7s %9s %7s %9s %7s %9s\n", "role", "layer", "mode", "B",
            "ctx", "tokens", "ms", "GB/s", "%roof", "TFLOP/s", "%peak", "peer ms", "speedup", "graph ms", "g%roof",
            "g.speedup");
}

static void print_row(FILE *f, const row *w, double roof_Bps, double peak_flops) {
    char c1[16] = "-", c2[16] = "-", c3[16] = "-", c4[16] = "-", pm[16] = "-", sp[16] = "-";
    char g1[16] = "-", g2[16] = "-", g3[16] = "-";
    double s = w->ms * 1e-3;
    if (w->prefill) {
        snprintf(c3, sizeof c3, "%.4g", w->flops / s / 1e12);
        snprintf(c4, sizeof c4, "%.3g%%", 100 * w->flops / s / peak_flops);
    } else {
        snprintf(c1, sizeof c1, "%.1f", w->bytes / s / 1e9);
        snprintf(c2, sizeof c2, "%.1f%%", 100 * w->bytes / s / roof_Bps);
    }
    if (!isnan(w->peer_ms)) {
        snprintf(pm, sizeof pm, "%.3f", w->peer_ms);
        snprintf(sp, sizeof sp, "%.2fx", w->peer_ms / w->ms);
    }
    if (!isnan(w->graph_ms)) {
        snprintf(g1, sizeof g1, "%.3f", w->graph_ms);
        snprintf(g2, sizeof g2, "%.1f%%", 100 * w->bytes / (w->graph_ms * 1e-3) / roof_Bps);
        if (!isnan(w->peer_ms)) snprintf(g3, sizeof g3, "%.2fx", w->peer_ms / w->graph_ms);
    }
    fprintf(f, "%-36s %5d %7s %5lld %6lld %6lld %10.3f %9s %7s %9s %7s %9s %7s %9s %7s %9s\n", w->role, w->layer,
            w->prefill ? "prefill" : "decode", (long long)w->batch, (long long)w->ctx, (long long)w->tokens, w->ms, c1,
            c2, c3, c4, pm, sp, g1, g2, g3);
}

static void print_table(FILE *f, const bench *b, double roof_Bps, double peak_flops) {
    print_header(f);
    for (int k = 0; k < b->n_rows; k++) print_row(f, &b->rows[k], roof_Bps, peak_flops);
}

int bench_gpu(int argc, char **argv) {
    di_args a;
    cli_args_init(&a, argc, argv);
    di_cli cli = {.cmd = "bench gpu", .json = cli_flag(&a, "json")};
    bool op_times = cli_flag(&a, "op-times"), prefill_first = cli_flag(&a, "prefill-first");
    bool no_graph = cli_flag(&a, "no-graph");
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    const char *device = NULL, *model = cli_str(&a, "model", NULL), *peer = cli_str(&a, "peer", NULL);
    const char *batch_s = cli_str(&a, "batch", "1,8,64,256"), *ctx_s = cli_str(&a, "context", "4096,65536");
    long long P, iters, warmup, threads, pf_iters, pf_warmup;
    double hbm_gbps, fp8_tflops;
    int64_t batches[MAX_LIST], ctxs[MAX_LIST];
    int n_b = 0, n_c = 0, rc = 1;
    di_model *m = NULL;
    di_backend *be = NULL;
    bench b = {0};
    di_error err = {0};
    if (!cli_device(&cli, &a, &device) || !cli_int(&cli, &a, "prefill", 8192, 0, 1 << 20, &P) ||
        !cli_int(&cli, &a, "iters", 10, 1, 4096, &iters) || !cli_int(&cli, &a, "warmup", 2, 0, 1000, &warmup) ||
        !cli_int(&cli, &a, "prefill-iters", -1, 1, 4096, &pf_iters) ||
        !cli_int(&cli, &a, "prefill-warmup", -1, 0, 1000, &pf_warmup) ||
        !cli_int(&cli, &a, "threads", ncpu > 0 ? ncpu : 1, 1, 256, &threads) ||
        !cli_double(&cli, &a, "hbm-gbps", -1, &hbm_gbps) || !cli_double(&cli, &a, "fp8-tflops", 1445, &fp8_tflops) ||
        !parse_list(&cli, "batch", batch_s, 1, 4096, batches, &n_b) ||
        !parse_list(&cli, "context", ctx_s, 1, (long long)1 << 24, ctxs, &n_c) || !cli_check_unused(&cli, &a))
        goto out;
    if (!model) {
        cli_fail(&cli, "--model DIR is required (a checkpoint directory, e.g. `deepinfer mkmodel --preset full-layer`)");
        goto out;
    }
    /* checked before the model loads: a bad --peer or --op-times must not cost a whole run first */
    if (peer && peer_join(&b, peer, &err)) { /* no rows yet: only reads and checks the document */
        cli_fail_err(&cli, &err);
        goto out;
    }
    if (op_times && strcmp(device, "cuda")) {
        cli_fail(&cli, "--op-times: needs --device cuda (per-op CUDA events), got --device %s", device);
        goto out;
    }
    if (!(fp8_tflops > 0) || (hbm_gbps != -1 && !(hbm_gbps > 0))) {
        cli_fail(&cli, "--hbm-gbps and --fp8-tflops must be positive");
        goto out;
    }
    double t_load = now_s();
    if (load_model(model, device, (int)threads, &m, &be, &err)) {
        cli_fail_err(&cli, &err);
        goto out;
    }
    fprintf(stderr, "bench gpu: %s loaded on %s in %.1f s\n", model, device, now_s() - t_load);
    const di_config *cfg = &m->cfg;
    int64_t align = 1; /* the synthetic history needs a multiple of every compress ratio (their lcm) */
    for (int L = 0; L < cfg->n_layers; L++) {
        int64_t r = cfg->layer[L].compress_ratio, x = align, y = r;
        if (r <= 0) continue;
        while (y) { /* x = gcd(align, r) */
            int64_t t = x % y;
            x = y, y = t;
        }
        align = align / x * r;
    }
    for (int i = 0; i < n_c; i++)
        if (ctxs[i] % align) {
            cli_fail(&cli, "--context %lld: expected a multiple of the compress ratios' lcm (%lld)", (long long)ctxs[i],
                     (long long)align);
            goto out;
        }
    double roof_Bps = hbm_gbps > 0 ? hbm_gbps * 1e9 : 0;
    const char *roof_src = hbm_gbps > 0 ? "--hbm-gbps" : "";
    if (!roof_Bps && !strcmp(device, "cuda")) roof_Bps = 4470e9, roof_src = "H200 measured HBM read (default)";
    if (!roof_Bps) {
        fprintf(stderr, "bench gpu: measuring the cpu streaming-read bandwidth (%lld threads)...\n", threads);
        roof_Bps = bench_read_bandwidth((int)threads, (size_t)256 << 20, 3);
        roof_src = "streaming read measured now";
        if (!(roof_Bps > 0)) {
            cli_fail(&cli, "could not measure the memory bandwidth (256 MiB buffer)");
            goto out;
        }
    }
    b.m = m, b.be = be, b.iters = (int)iters, b.warmup = (int)warmup;
    b.pf_iters = pf_iters > 0 ? (int)pf_iters : (int)iters, b.pf_warmup = pf_warmup >= 0 ? (int)pf_warmup : (int)warmup;
    b.roof_Bps = roof_Bps, b.peak_flops = fp8_tflops * 1e12;
    if (op_times) {
        if (!di_cuda_optime_install) {
            cli_fail(&cli, "--op-times: this build has no CUDA backend (use build/deepinfer-cuda)");
            goto out;
        }
        if (di_cuda_optime_install(be, &err)) {
            cli_fail_err(&cli, &err);
            goto out;
        }
        b.op_times = true;
    }
    /* graph-timed decode rows: a CUDA build's marks and the backend's graph hooks */
    if (!no_graph && !strcmp(device, "cuda") && di_cuda_mark_block && be->graph_begin &&
        di_fwd_arena_create(be, true, &b.arena, &err)) {
        cli_fail_err(&cli, &err);
        goto out;
    }
    b.tm.be = be;
    if (!(b.tm.probe = be->mem_alloc(be, 64, &err))) {
        cli_fail_err(&cli, &err);
        goto out;
    }
    for (int L = 0; L < cfg->n_layers; L++) {
        char nm[48];
        role_name(cfg, L, nm, sizeof nm);
        bool seen = false;
        for (int k = 0; k < b.n_roles; k++) seen |= !strcmp(b.role[k], nm);
        count_layer(m, L, &b.cost[L]);
        if (seen) continue;
        snprintf(b.role[b.n_roles], sizeof b.role[0], "%s", nm);
        b.layer[b.n_roles++] = L;
    }
    print_header(stderr);
    /* decode shapes, then the prefill (--prefill-first: the other way round) */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == (prefill_first ? 1 : 0)) {
            for (int ci = 0; ci < n_c; ci++)
                for (int bi = 0; bi < n_b; bi++) {
                    double t0 = now_s();
                    int first = b.n_rows;
                    fprintf(stderr, "bench gpu: decode B=%lld ctx=%lld\n", (long long)batches[bi], (long long)ctxs[ci]);
                    if (bench_decode(&b, batches[bi], ctxs[ci], &err)) {
                        cli_fail_err(&cli, &err);
                        goto out;
                    }
                    report_rows(&b, first);
                    fprintf(stderr, "bench gpu: decode B=%lld ctx=%lld done in %.1f s\n", (long long)batches[bi],
                            (long long)ctxs[ci], now_s() - t0);
                }
        } else if (P > 0) {
            double t0 = now_s();
            int first = b.n_rows;
            fprintf(stderr, "bench gpu: prefill %lld tokens\n", P);
            if (bench_prefill(&b, P, &err)) {
                cli_fail_err(&cli, &err);
                goto out;
            }
            report_rows(&b, first);
            fprintf(stderr, "bench gpu: prefill %lld done in %.1f s\n", P, now_s() - t0);
        }
    }
    if (peer && peer_join(&b, peer, &err)) {
        cli_fail_err(&cli, &err);
        goto out;
    }
    /* the table always; with --json on stderr (the one document owns stdout) */
    FILE *tf = cli.json ? stderr : stdout;
    print_table(tf, &b, roof_Bps, fp8_tflops * 1e12);
    fprintf(tf, "roofline: %.1f GB/s (%s); FP8 peak %.0f TFLOP/s; median of %lld after %lld warm-up (prefill %d after %d); "
            "device %s\n", roof_Bps / 1e9, roof_src, fp8_tflops, iters, warmup, b.pf_iters, b.pf_warmup, device);
    if (cli.json) {
        json_t *doc = json_object(), *arr = json_array();
        json_object_set_new(doc, "bench", json_string("deepinfer_bench_gpu"));
        json_object_set_new(doc, "device", json_string(device));
        json_object_set_new(doc, "model", json_string(model));
        json_object_set_new(doc, "iters", json_integer(iters));
        json_object_set_new(doc, "warmup", json_integer(warmup));
        json_object_set_new(doc, "prefill_iters", json_integer(b.pf_iters));
        json_object_set_new(doc, "prefill_warmup", json_integer(b.pf_warmup));
        const char *kern = getenv("DI_CUDA_KERNELS"), *topk = getenv("DI_CUDA_TOPK");
        json_object_set_new(doc, "cuda_kernels", json_string(kern ? kern : "exact (default)"));
        json_object_set_new(doc, "cuda_topk", json_string(topk ? topk : "torch replay (default)"));
        json_object_set_new(doc, "roofline_gb_s", json_real(roof_Bps / 1e9));
        json_object_set_new(doc, "roofline_source", json_string(roof_src));
        json_object_set_new(doc, "fp8_peak_tflops", json_real(fp8_tflops));
        if (peer) json_object_set_new(doc, "peer", json_string(peer));
        for (int k = 0; k < b.n_rows; k++) json_array_append_new(arr, row_json(&b.rows[k], roof_Bps, fp8_tflops * 1e12));
        json_object_set_new(doc, "rows", arr);
        cli_emit(&cli, doc);
    }
    rc = 0;
out:
    if (b.tm.probe) be->mem_free(be, b.tm.probe);
    di_fwd_arena_destroy(b.arena);
    for (int k = 0; k < b.n_rows; k++) free(b.rows[k].ops);
    free(b.rows);
    free(b.ops);
    /* the model's device weights are freed on the backend's stream: close it before the backend goes
     * (the other order was a use-after-free that crashed at exit on the H200) */
    di_model_close(m);
    di_backend_destroy(be);
    cli_args_free(&a);
    return rc;
}
