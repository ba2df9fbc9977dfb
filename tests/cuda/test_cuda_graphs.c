/* GPU test: decode passes recorded and run as CUDA graphs (forward.h di_fwd_arena, graphs on;
 * backend.h graph_begin / graph_end) against the same passes op by op, on the tiny golden models
 * (tests/data/v41-tiny-sel, v41-tiny-nosel; device caches, logits left on the device as the engine
 * does).
 *
 * Per model, three runs of the same schedule — a batch of 2 sequences, a 6-token prompt each, then
 * 32 decode steps with fixed (teacher-forced) tokens —:
 *   plain    no arena (per-block cudaMallocAsync, pageable plan uploads): the reference
 *   arena    the arena, graphs off: logits bit-identical to plain, no capture
 *   graphs   the arena, graphs on: logits bit-identical to plain, replays > 0 (fallbacks reported)
 *   marked   graphs on with a block hook that only marks each block's start and end on the stream
 *            (forward.h block_hook_async, cuda_optime.h di_cuda_mark_block: `bench gpu`'s graph-timed rows):
 *            still recorded (replays > 0), logits bit-identical, and in the last pass every block's
 *            time positive and no block starting before the previous one ended (the marks are nodes of
 *            the graph, in order)
 *   the side lane (backend.h side_begin: the query's up-projection and the shared expert on a second
 *   stream; on by default): with 8 sequences (recorded decode passes open the MoE's lane), op by op as
 *   the reference; DI_CUDA_SIDE=0 (one stream, no fork), DI_CUDA_SIDE=delay-side (a busy kernel first on
 *   the side lane: the main lane's ops before the join run first) and delay-main (a busy kernel on the
 *   main lane just before the fork: a side lane not waiting for it would run first) op by op, and graphs
 *   with the lane, delayed or not (forks inside the recordings > 0, replays > 0): every logit
 *   bit-identical
 * and the time per decode step of each (forward + the logits download, wall clock, steps 8-31). Then one
 * backend check: an op whose workspace must grow while the stream is recorded is refused (no
 * synchronisation inside the capture, no lost block) and computes the CPU op's bits after.
 * One table row per check; last line "N passed, N failed"; exit status 1 if any check fails. A watchdog
 * ends the binary after 120 s with a FAIL line. Usage: test_cuda_graphs (models from $DI_GRAPH_MODELS,
 * space-separated; default the two tiny cases; DI_GRAPH_DEVICE=cpu runs them on the CPU backend, a harness
 * check on a machine without a GPU: no graph hooks there, so the replay row fails). */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_optime.h"
#include "model/session.h"
#include "util/error.h"

enum { N_SEQ = 2, SIDE_SEQ = 8, MAX_SEQ = 8, PROMPT = 6, STEPS = 32, WARM = 8, MAX_LEN = 64 };

static int n_pass, n_fail;
static const char *g_dev = "cuda"; /* DI_GRAPH_DEVICE=cpu: a harness check without a GPU (the graph rows then fail) */

static void row(const char *model, const char *check, const char *detail, bool ok) {
    printf("%-14s %-34s %-70s %s\n", model, check, detail, ok ? "PASS" : "FAIL");
    ok ? n_pass++ : n_fail++;
}

static void watchdog(int sig) {
    (void)sig;
    static const char msg[] = "watchdog: time limit reached\n0 passed, 1 failed\n";
    ssize_t w = write(1, msg, sizeof msg - 1);
    (void)w;
    _exit(1);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct run_out {
    float *logits;          /* f32 [1 + STEPS, n_seq, V] the last row of every pass */
    double step_us;         /* mean wall time of decode steps WARM … STEPS-1 */
    di_fwd_arena_stats st;
    int n_blocks;           /* marked: the blocks timed in the last pass */
    double block_ms_min;    /* marked: the smallest block time of the last pass */
    double gap_ms_min;      /* marked: the smallest end-of-block-L to start-of-block-L+1 time */
    long forks, recorded;   /* side lanes forked (CUDA), of them while the pass was recorded */
    char msg[200];          /* non-empty: the run failed */
} run_out;

/* mode 0 plain, 1 arena, 2 arena + graphs, 3 arena + graphs + marking hook; n_seq sequences; side:
 * DI_CUDA_SIDE for the run's backend (NULL: the default) */
static void run_side(const char *path, int mode, int n_seq, const char *side, run_out *o);
static void run(const char *path, int mode, run_out *o) { run_side(path, mode, N_SEQ, NULL, o); }
static void run_side(const char *path, int mode, int n_seq, const char *side, run_out *o) {
    di_error err = {0};
    di_model *m = NULL;
    di_backend *be = NULL;
    di_session *s[MAX_SEQ] = {0};
    di_fwd_arena *a = NULL;
    float *dl[MAX_SEQ] = {0}; /* f32 [V] (device) */
    memset(o, 0, sizeof *o);
    int rc = di_model_open(path, &m, &err);
    const char *side_env = getenv("DI_CUDA_SIDE"); /* the caller's, back after this backend is created */
    char side_keep[32] = "";
    if (side_env) snprintf(side_keep, sizeof side_keep, "%s", side_env);
    if (side) setenv("DI_CUDA_SIDE", side, 1);
    if (!rc) rc = di_backend_create(g_dev, 1, &be, &err);
    if (side_env) setenv("DI_CUDA_SIDE", side_keep, 1);
    else unsetenv("DI_CUDA_SIDE");
    if (!rc) rc = di_model_to_backend(m, be, &err);
    if (!rc && mode) rc = di_fwd_arena_create(be, mode >= 2, &a, &err);
    int64_t V = m ? m->cfg.vocab_size : 0;
    for (int i = 0; i < n_seq && !rc; i++) {
        di_session_opts so = {.max_tokens = MAX_LEN, .spec_margin = -1};
        rc = di_session_create(m, be, &so, &s[i], &err);
        if (!rc && !(dl[i] = be->mem_alloc(be, sizeof(float) * (size_t)V, &err))) rc = err.code;
    }
    if (!rc && !(o->logits = malloc(sizeof(float) * (size_t)((1 + STEPS) * n_seq * V))))
        rc = di_error_set(&err, DI_ERR_NOMEM, "logits");
    double t_sum = 0;
    for (int p = 0; p <= STEPS && !rc; p++) {
        di_session_chunk ck[MAX_SEQ];
        int32_t ids[MAX_SEQ][PROMPT];
        int64_t n = p == 0 ? PROMPT : 1;
        for (int i = 0; i < n_seq; i++) {
            for (int64_t t = 0; t < n; t++)
                ids[i][t] = (int32_t)((i * 7919 + (di_session_len(s[i]) + t) * 104729 + 13) % V);
            ck[i] = (di_session_chunk){.s = s[i], .ids = ids[i], .n = n, .logits = dl[i]};
        }
        di_fwd_opts fo = {.logits_on_device = true, .arena = a};
        if (mode == 3) fo.block_hook = di_cuda_mark_block, fo.block_hook_ctx = be, fo.block_hook_async = true;
        double t0 = now_s();
        rc = di_session_forward_batch(ck, n_seq, &fo, &err);
        for (int i = 0; i < n_seq && !rc; i++)
            rc = be->mem_download(be, o->logits + ((size_t)p * n_seq + (size_t)i) * (size_t)V, dl[i],
                                  sizeof(float) * (size_t)V, &err);
        if (p > WARM) t_sum += now_s() - t0;
    }
    o->step_us = 1e6 * t_sum / (STEPS - WARM);
    o->block_ms_min = o->gap_ms_min = 1e30;
    const int nb = m && m->cfg.n_layers < DI_CUDA_MARK_BLOCKS ? m->cfg.n_layers : DI_CUDA_MARK_BLOCKS;
    for (int L = 0; mode == 3 && !rc && L < nb; L++) {
        double ms = 0, gap = 0;
        rc = di_cuda_mark_ms(2 * L, 2 * L + 1, &ms, &err);
        if (!rc && L + 1 < nb) rc = di_cuda_mark_ms(2 * L + 1, 2 * L + 2, &gap, &err);
        if (rc) break;
        o->n_blocks++;
        if (ms < o->block_ms_min) o->block_ms_min = ms;
        if (L + 1 < nb && gap < o->gap_ms_min) o->gap_ms_min = gap;
    }
    if (a) di_fwd_arena_get_stats(a, &o->st);
    if (be && !strcmp(g_dev, "cuda")) o->forks = di_backend_cuda_side_forks(be, &o->recorded);
    if (rc) snprintf(o->msg, sizeof o->msg, "%.190s", err.msg);
    di_fwd_arena_destroy(a);
    for (int i = 0; i < n_seq; i++) {
        di_session_destroy(s[i]);
        if (dl[i]) be->mem_free(be, dl[i]);
    }
    di_model_close(m); /* device weights first: they live in the backend's memory (freed on its stream) */
    if (be) di_backend_destroy(be);
}

/* the side lane, with SIDE_SEQ sequences (decode passes of 8 rows: recorded passes open the MoE's lane,
 * forward_block.c side_lane): op by op with the lanes as the reference; one stream, each lane delayed op
 * by op, and graphs with and without a delay, all bit-identical to it */
static void side_checks(const char *name, const char *path) {
    static const struct {
        int mode;
        const char *side, *check;
    } v[] = {{0, "0", "side lane off: bit-identical"},
             {0, "delay-side", "side lane late: bit-identical"},
             {0, "delay-main", "main lane late at the fork: bit-identical"},
             {2, NULL, "graphs, side lane: bit-identical"},
             {2, "delay-side", "graphs, side lane late: bit-identical"},
             {2, "delay-main", "graphs, main late at the fork: identical"}};
    char d[256];
    run_out ref;
    run_side(path, 0, SIDE_SEQ, NULL, &ref);
    snprintf(d, sizeof d, "%d seqs op by op: %ld forks%s%s", SIDE_SEQ, ref.forks, ref.msg[0] ? ": " : "", ref.msg);
    row(name, "side lane: forks op by op", d, !ref.msg[0] && ref.forks > 0);
    if (ref.msg[0]) goto out;
    di_model *m = NULL;
    di_error err = {0};
    int64_t V = di_model_open(path, &m, &err) ? 0 : m->cfg.vocab_size;
    di_model_close(m);
    const size_t n = (size_t)((1 + STEPS) * SIDE_SEQ * V);
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        run_out r;
        run_side(path, v[i].mode, SIDE_SEQ, v[i].side, &r);
        const char *sv = v[i].side ? v[i].side : "default";
        if (r.msg[0]) {
            snprintf(d, sizeof d, "DI_CUDA_SIDE=%s run: %s", sv, r.msg);
            row(name, v[i].check, d, false);
            free(r.logits);
            continue;
        }
        int64_t bad = 0;
        for (size_t j = 0; j < n; j++) bad += memcmp(&ref.logits[j], &r.logits[j], sizeof(float)) != 0;
        bool off = v[i].side && !strcmp(v[i].side, "0");
        bool forks_ok = off ? r.forks == 0 : v[i].mode == 2 ? r.recorded > 0 && r.st.replays > 0 : r.forks > 0;
        snprintf(d, sizeof d, "DI_CUDA_SIDE=%s: %lld of %zu logits differ, %ld forks (%ld recorded), %llu replays", sv,
                 (long long)bad, n, r.forks, r.recorded, (unsigned long long)r.st.replays);
        row(name, v[i].check, d, V > 0 && bad == 0 && forks_ok);
        free(r.logits);
    }
out:
    free(ref.logits);
}

static void model_checks(const char *path) {
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    run_out r[4];
    static const char *what[4] = {"plain", "arena", "graphs", "marked"};
    char d[256];
    for (int k = 0; k < 4; k++) {
        run(path, k, &r[k]);
        if (r[k].msg[0]) {
            snprintf(d, sizeof d, "%s run: %s", what[k], r[k].msg);
            row(name, "run", d, false);
        }
    }
    if (r[0].msg[0] || r[1].msg[0] || r[2].msg[0] || r[3].msg[0]) goto out;
    di_model *m = NULL;
    di_error err = {0};
    int64_t V = di_model_open(path, &m, &err) ? 0 : m->cfg.vocab_size;
    di_model_close(m);
    size_t bytes = sizeof(float) * (size_t)((1 + STEPS) * N_SEQ * V);
    for (int k = 1; k < 4; k++) {
        int64_t bad = 0;
        for (size_t j = 0; j < bytes / sizeof(float); j++) bad += memcmp(&r[0].logits[j], &r[k].logits[j], sizeof(float)) != 0;
        snprintf(d, sizeof d, "%d passes x %d seqs, %lld of %zu logits differ from plain", 1 + STEPS, N_SEQ,
                 (long long)bad, bytes / sizeof(float));
        row(name, k == 1 ? "arena bit-identical" : k == 2 ? "graphs bit-identical" : "marked graphs bit-identical", d,
            V > 0 && bad == 0);
    }
    snprintf(d, sizeof d, "captures %llu replays %llu (graphs off)", (unsigned long long)r[1].st.captures,
             (unsigned long long)r[1].st.replays);
    row(name, "arena: no capture", d, r[1].st.captures == 0 && r[1].st.replays == 0);
    snprintf(d, sizeof d, "captures %llu replays %llu fallbacks %llu key changes %llu / %llu passes",
             (unsigned long long)r[2].st.captures, (unsigned long long)r[2].st.replays,
             (unsigned long long)r[2].st.graph_fallbacks, (unsigned long long)r[2].st.key_changes,
             (unsigned long long)r[2].st.passes);
    /* a fallback (a recording abandoned because an op synchronised, e.g. a workspace growing with the
     * context) is legal and bit-identical; the graph path must still replay */
    row(name, "graphs: replays > 0", d, r[2].st.replays > 0);
    snprintf(d, sizeof d, "captures %llu replays %llu fallbacks %llu / %llu passes",
             (unsigned long long)r[3].st.captures, (unsigned long long)r[3].st.replays,
             (unsigned long long)r[3].st.graph_fallbacks, (unsigned long long)r[3].st.passes);
    row(name, "marked graphs: replays > 0", d, r[3].st.replays > 0);
    snprintf(d, sizeof d, "%d blocks, shortest %.4f ms, smallest gap to the next block %.4f ms", r[3].n_blocks,
             r[3].block_ms_min, r[3].gap_ms_min);
    row(name, "marked graphs: block times", d, r[3].n_blocks > 0 && r[3].block_ms_min > 0 && r[3].gap_ms_min >= 0);
    snprintf(d, sizeof d, "plain %.1f  arena %.1f  graphs %.1f us/step (forward + download, batch %d)", r[0].step_us,
             r[1].step_us, r[2].step_us, N_SEQ);
    row(name, "time per decode step", d, true);
    side_checks(name, path);
out:
    for (int k = 0; k < 4; k++) free(r[k].logits);
}

/* The backend's workspace while its stream is recorded (backend_cuda.cu di_cuda_workspace): an op that
 * needs a larger workspace is refused with DI_ERR_UNSUPPORTED — no synchronisation inside the capture,
 * no block lost (the growth used to clear the workspace pointer without freeing it) — the abandoned
 * recording ran nothing, and the same op after it grows the workspace and gives the CPU op's bits. */
static void workspace_check(void) {
    enum { K = 512, N = 64, M_SMALL = 1, M_BIG = 64 };
    di_backend *gpu = NULL, *cpu = NULL;
    di_error err = {0};
    uint16_t x[M_BIG * K], y_gpu[M_BIG * N], y_cpu[M_BIG * N]; /* bf16 [M, K], [M, N] */
    uint8_t w[N * K], sc[((N + 31) / 32) * (K / 32)];         /* e4m3 [N, K], E8M0 [N/32, K/32] */
    void *dx = NULL, *dw = NULL, *ds = NULL, *dy = NULL;
    uint64_t r = 0x6A09E667F3BCC909ull;
    for (int i = 0; i < M_BIG * K; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        x[i] = (uint16_t)(0x3c00 + (r % 0x300)) | (uint16_t)((r >> 20 & 1) << 15); /* ±[2^-7, 2^-1) */
    }
    for (int i = 0; i < N * K; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        w[i] = (uint8_t)(r % 0x7f) | (uint8_t)((r >> 20 & 1) << 7); /* no NaN code (0x7f / 0xff) */
    }
    memset(sc, 127, sizeof sc); /* 2^0 */
    char detail[200] = "";
    bool ok = false;
    if (di_backend_create("cuda", 1, &gpu, &err) || di_backend_create("cpu", 1, &cpu, &err)) goto out;
    if (!(dx = gpu->mem_alloc(gpu, sizeof x, &err)) || !(dw = gpu->mem_alloc(gpu, sizeof w, &err)) ||
        !(ds = gpu->mem_alloc(gpu, sizeof sc, &err)) || !(dy = gpu->mem_alloc(gpu, sizeof y_gpu, &err)) ||
        gpu->mem_upload(gpu, dx, x, sizeof x, &err) || gpu->mem_upload(gpu, dw, w, sizeof w, &err) ||
        gpu->mem_upload(gpu, ds, sc, sizeof sc, &err) ||
        gpu->linear_fp8(gpu, dx, M_SMALL, K, dw, ds, N, dy, &err)) /* the workspace for one row */
        goto out;
    if (gpu->graph_begin(gpu, &err)) goto out;
    di_error in = {0};
    int rc = gpu->linear_fp8(gpu, dx, M_BIG, K, dw, ds, N, dy, &in);
    bool replayed;
    di_error ignored = {0};
    gpu->graph_end(gpu, NULL, false, &replayed, &ignored); /* abandon the recording */
    if (rc != DI_ERR_UNSUPPORTED || !strstr(in.msg, "recorded")) {
        snprintf(detail, sizeof detail, "in the recording: status %d, \"%.120s\" (expected a refused growth)", rc, in.msg);
        goto out;
    }
    if (gpu->linear_fp8(gpu, dx, M_BIG, K, dw, ds, N, dy, &err) || gpu->mem_download(gpu, y_gpu, dy, sizeof y_gpu, &err) ||
        cpu->linear_fp8(cpu, x, M_BIG, K, w, sc, N, y_cpu, &err))
        goto out;
    int differ = 0;
    for (int i = 0; i < M_BIG * N; i++) differ += y_gpu[i] != y_cpu[i];
    snprintf(detail, sizeof detail, "refused while recording; after: %d of %d outputs differ from the CPU", differ, M_BIG * N);
    ok = differ == 0;
out:
    if (!detail[0]) snprintf(detail, sizeof detail, "%.190s", err.msg);
    row("backend", "workspace growth while recording", detail, ok);
    if (gpu) {
        gpu->mem_free(gpu, dx), gpu->mem_free(gpu, dw), gpu->mem_free(gpu, ds), gpu->mem_free(gpu, dy);
        di_backend_destroy(gpu);
    }
    di_backend_destroy(cpu);
}

int main(void) {
    signal(SIGALRM, watchdog);
    alarm(getenv("DI_QUICK") ? 600 : 120); /* DI_QUICK: under compute-sanitizer (gpu_tests.sh) */
    const char *dev = getenv("DI_GRAPH_DEVICE");
    if (dev && !strcmp(dev, "cpu")) g_dev = "cpu";
    if (!strcmp(g_dev, "cuda") && !di_backend_cuda_available()) {
        printf("this binary has no CUDA backend\n0 passed, 1 failed\n");
        return 1;
    }
    unsetenv("DI_CUDA_GRAPHS"); /* graphs only where the test asks for them */
    const char *env = getenv("DI_GRAPH_MODELS");
    char models[2048];
    snprintf(models, sizeof models, "%s", env ? env : "tests/data/v41-tiny-sel tests/data/v41-tiny-nosel");
    printf("%-14s %-34s %-70s %s\n", "model", "check", "detail", "result");
    for (char *save = NULL, *m = strtok_r(models, " ", &save); m; m = strtok_r(NULL, " ", &save)) model_checks(m);
    if (!strcmp(g_dev, "cuda")) workspace_check();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
