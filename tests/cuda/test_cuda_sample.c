/* GPU sampler test: di_cuda_sampler_sample (src/backend/cuda/cuda_sample.cu) against the CPU sampler
 * di_sampler_sample on batches of rows at the real vocabulary (V = 129,280). Exact: the same token,
 * the same logprob bits, the same top-logprob ids and bits, for every row — no tolerance, because the
 * GPU restates every rounding and every summation order of the CPU contract (engine/sampler.h).
 *
 * Rows: random logits (Gaussian of scale 1, 3 or 8; some rows rounded to 1/8 so that thousands of
 * logits tie; 0–60 % of entries −inf), one group per mode: greedy, temperature only, top-k (1 … the
 * radix path … more than V), top-p (without top-k: the ×8-growing prefix), min-p (list and full-row
 * forms), their combinations, penalties with repeated ids, logit bias, grammar masks, raw and
 * processed logprobs with 0–20 top entries, random seeds / 64-bit positions / choices. Edge groups:
 * every token masked but one, top_k 1, top_p tiny, temperature just above and below the greedy cut,
 * extreme rows (one 129,280-way tie, 5 finite entries, ±0 everywhere, logits ×2000).
 * Rows with raw logprobs also compare the f64 mass Z (di_cuda_sampler_last_mass) with the contract's
 * id-order sum restated here, bit for bit: the one place where a summation-order error would show
 * more than rarely. Each group is also sampled again with its rows reversed, for two rows alone, and
 * through a sampler with 3 scratch slots (blocks loop over rows, reusing slots within one launch): a
 * row's result must not depend on its batch or on the slot it ran in.
 *
 * One table line per group: rows, rows differing from the CPU (token / logprob bits / top entries),
 * rows differing between batch layouts, GPU ms of one batch (host packing and copy-back included),
 * PASS/FAIL; last line "N passed, N failed". Exit status 1 if any line fails.
 *
 * Without a GPU, two ways:
 *  - DI_CPU_ONLY=1 runs the CPU reference on every group and checks the edge groups' known answers
 *    (masked-but-one, top_k 1, tiny top_p, tiny temperature give the allowed token / the argmax);
 *  - the host-emulation build runs this whole file against the kernel's own source executed one
 *    thread per block on the CPU (cuda_sample.cu, DI_CUDA_SAMPLE_EMULATE) over a host-memory runtime
 *    defined below (DI_SAMPLE_EMU): every comparison above except the thread-level ones (races,
 *    barriers), which need the GPU. Build (CUDA headers only, no GPU):
 *      g++ -std=c++17 -O2 -ffp-contract=off -DDI_CUDA_SAMPLE_EMULATE -x c++ -Iinclude -Isrc \
 *          -I$CUDA_HOME/include -c src/backend/cuda/cuda_sample.cu -o cuda_sample_emu.o
 *      cc -std=c11 -O2 -ffp-contract=off -D_GNU_SOURCE -DDI_SAMPLE_EMU -Iinclude -Isrc -I$CUDA_HOME/include \
 *          -o test_cuda_sample_emu tests/cuda/test_cuda_sample.c cuda_sample_emu.o build/libdeepinfer.a \
 *          -ljansson -lpcre2-8 -lutf8proc -lstdc++ -lm -lpthread
 * Usage: [DI_SEED=n] [DI_QUICK=1] [DI_CPU_ONLY=1] test_cuda_sample   (DI_QUICK: 4 rows per group) */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/cuda_sample.h"
#include "engine/sampler.h"

#ifdef DI_SAMPLE_EMU
/* The host emulation build (see the header): a CUDA runtime over host memory, for the emulated
 * di_cuda_sampler and for this file's own uploads. */
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "host emulation (1 thread per block)");
    p->multiProcessorCount = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d) { *v = 1; return cudaSuccess; }
cudaError_t cudaMalloc(void **p, size_t n) { return (*p = malloc(n ? n : 1)) ? cudaSuccess : cudaErrorMemoryAllocation; }
cudaError_t cudaMallocHost(void **p, size_t n) { return cudaMalloc(p, n); }
cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaFreeHost(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaMemset(void *p, int v, size_t n) { memset(p, v, n); return cudaSuccess; }
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) { memcpy(d, s, n); return cudaSuccess; }
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) {
    memcpy(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t st) { return cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t e) { return "host emulation error"; }
#endif

#define V 129280
#define WORDS ((V + 31) / 32)
#define MAX_ROWS 32

static int n_pass, n_fail;
static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t next_u64(void) { /* splitmix64 */
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double uniform(void) { return (double)(next_u64() >> 11) * (1.0 / 9007199254740992.0); }
static int below(int n) { return (int)(next_u64() % (uint64_t)n); }
static float gauss(void) {
    double u1 = uniform() + 1e-300, u2 = uniform();
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static void die(const char *what, const char *msg) {
    fprintf(stderr, "FATAL %s: %s\n", what, msg);
    exit(2);
}
#define CU(call)                                                                        \
    do {                                                                                \
        cudaError_t e_ = (call);                                                        \
        if (e_ != cudaSuccess) die(#call, cudaGetErrorString(e_));                      \
    } while (0)

/* One row of a test batch, with its own storage. */
typedef struct test_row {
    float *logits;                 /* [V] f32 */
    di_sampling_params p;
    di_token_bias bias[8];
    int32_t prompt[64], output[48];
    uint32_t *mask;                /* [WORDS] or NULL */
    int32_t expect;                /* known answer of an edge row, -1 if none */
    di_sample_row row;
} test_row;

static float *logits_random(void) {
    float *x = malloc(V * sizeof *x);
    const float scale = (float[]){1.0f, 3.0f, 8.0f}[below(3)];
    const int ties = below(3) == 0;
    const double p_ninf = (double[]){0.0, 0.0, 0.05, 0.6}[below(4)];
    for (int t = 0; t < V; t++) {
        float v = scale * gauss();
        if (ties) v = roundf(v * 8.0f) / 8.0f;
        x[t] = uniform() < p_ninf ? -INFINITY : v;
    }
    if (p_ninf > 0.0) x[below(V)] = 1.0f; /* at least one finite entry */
    return x;
}

static int32_t argmax_lowest(const float *x) {
    int32_t b = -1;
    float bv = -INFINITY;
    for (int t = 0; t < V; t++)
        if (x[t] > bv) {
            bv = x[t];
            b = t;
        }
    return b;
}

/* The contract's raw-logprob normaliser, restated: Σ di_sampler_exp(x − x_max) in f64, id order. */
static double ref_mass_id_order(const float *x) {
    const float x_max = x[argmax_lowest(x)];
    double z = 0.0;
    for (int t = 0; t < V; t++)
        if (x[t] > -INFINITY) z += (double)di_sampler_exp(x[t] - x_max);
    return z;
}

/* ---- modes: what a group sets on each row ---- */

typedef void (*mode_fn)(test_row *r, int i);

static void logprobs_random(test_row *r) {
    r->p.logprobs = below(4) != 0;
    r->p.n_top_logprobs = below(21);
    r->p.logprobs_mode = below(2) ? DI_LOGPROBS_PROCESSED : DI_LOGPROBS_RAW;
}
static void m_greedy(test_row *r, int i) { r->p.temperature = 0.0f; logprobs_random(r); }
static void m_temp(test_row *r, int i) { r->p.temperature = (float[]){0.3f, 0.7f, 1.0f, 1.3f, 2.0f}[i % 5]; logprobs_random(r); }
static void m_topk(test_row *r, int i) {
    r->p.temperature = 0.8f;
    r->p.top_k = (int[]){1, 2, 5, 50, 2048, 2049, 3000, 40000, 200000}[i % 9];
    logprobs_random(r);
}
static void m_topp(test_row *r, int i) {
    r->p.temperature = (float[]){0.6f, 1.0f, 1.5f}[i % 3];
    r->p.top_p = (float[]){0.1f, 0.5f, 0.9f, 0.95f, 0.99f, 0.999f}[i % 6];
    logprobs_random(r);
}
static void m_minp(test_row *r, int i) {
    r->p.temperature = (float[]){0.7f, 1.0f, 1.8f}[i % 3];
    r->p.min_p = (float[]){1e-6f, 0.01f, 0.05f, 0.3f, 1.0f}[i % 5];
    logprobs_random(r);
}
static void m_combo(test_row *r, int i) {
    r->p.temperature = (float[]){0.5f, 1.0f, 1.2f}[i % 3];
    r->p.top_k = (int[]){0, 20, 100, 5000}[i % 4];
    r->p.top_p = (float[]){1.0f, 0.8f, 0.95f}[i % 3];
    r->p.min_p = (float[]){0.0f, 0.02f}[i % 2];
    logprobs_random(r);
}
static void penalties(test_row *r, int i) {
    r->p.repetition_penalty = (float[]){1.0f, 1.3f, 0.8f}[i % 3];
    r->p.frequency_penalty = (float[]){0.0f, 0.5f, -0.3f}[(i / 3) % 3];
    r->p.presence_penalty = (float[]){0.0f, 0.7f}[(i / 2) % 2];
    r->row.n_prompt = below(65);
    r->row.n_output = below(49);
    const int pool = 1 + below(200); /* a small id pool: repeated tokens, prompt ∩ output */
    for (int j = 0; j < 64; j++) r->prompt[j] = below(pool) * 97 % V;
    for (int j = 0; j < 48; j++) r->output[j] = below(pool) * 97 % V;
}
static void m_penal(test_row *r, int i) { m_combo(r, i); penalties(r, i); }
static void m_bias(test_row *r, int i) {
    m_combo(r, i + 1);
    r->p.n_logit_bias = 1 + below(8);
    r->p.logit_bias = r->bias;
    for (int j = 0; j < r->p.n_logit_bias; j++) {
        r->bias[j].token = below(V);
        r->bias[j].bias = (float[]){-100.0f, -1.5f, 0.25f, 5.0f, 30.0f}[below(5)];
    }
}
static void mask_random(test_row *r, double keep) {
    r->mask = malloc(WORDS * sizeof *r->mask);
    for (int w = 0; w < WORDS; w++) {
        uint32_t m = 0;
        for (int b = 0; b < 32; b++) m |= (uint32_t)(uniform() < keep) << b;
        r->mask[w] = m;
    }
    r->mask[below(WORDS)] = 0xffffffffu; /* untouched words take the kernel's skip path */
    r->mask[0] |= 1u;                    /* id 0 is allowed: a token remains when id 0's logit is finite */
    r->logits[0] = 0.5f;
}
static void m_mask(test_row *r, int i) { m_combo(r, i); mask_random(r, (double[]){0.5, 0.01, 0.999}[i % 3]); }
static void m_all(test_row *r, int i) { m_mask(r, i); penalties(r, i + 1); m_bias(r, i + 2); }

/* edge rows with a known answer */
static void m_one_left(test_row *r, int i) {
    m_combo(r, i);
    r->mask = calloc(WORDS, sizeof *r->mask);
    int32_t t = below(V);
    r->mask[t / 32] = 1u << (t % 32);
    if (!(r->logits[t] > -INFINITY)) r->logits[t] = -3.0f;
    r->expect = t;
}
static void m_top1(test_row *r, int i) {
    r->p.temperature = 1.5f;
    r->p.top_k = 1;
    logprobs_random(r);
    r->expect = argmax_lowest(r->logits);
}
static void m_topp_tiny(test_row *r, int i) {
    r->p.temperature = 1.0f;
    r->p.top_p = 1e-7f;
    logprobs_random(r);
    r->expect = argmax_lowest(r->logits);
}
static void m_temp_tiny(test_row *r, int i) {
    /* below the greedy cut: greedy; just above it: logits ×1e5, the best entry takes all the mass
     * unless a tie, and ties are what the id tiebreak decides */
    r->p.temperature = i % 2 ? 0.99e-5f : 1.01e-5f;
    logprobs_random(r);
    if (i % 2) r->expect = argmax_lowest(r->logits);
}

/* Extreme rows: every logit equal (one 129,280-way tie), a handful of finite entries (fewer than the
 * top-logprob count), ±0 everywhere, huge magnitudes (weights underflow to 0 below e^-87). */
static void m_extreme(test_row *r, int i) {
    switch (i % 4) {
    case 0:
        for (int t = 0; t < V; t++) r->logits[t] = 0.75f;
        break;
    case 1:
        for (int t = 0; t < V; t++) r->logits[t] = -INFINITY;
        for (int j = 0; j < 5; j++) r->logits[below(V)] = (float)below(4);
        break;
    case 2:
        for (int t = 0; t < V; t++) r->logits[t] = below(2) ? 0.0f : -0.0f;
        r->logits[below(V)] = -1.0f;
        break;
    default:
        for (int t = 0; t < V; t++)
            if (r->logits[t] > -INFINITY) r->logits[t] *= 2000.0f;
        break;
    }
    const int sub = (i / 4) % 4; /* greedy, temperature, list form, min-p */
    r->p.temperature = sub == 0 ? 0.0f : 0.9f;
    if (sub == 2) {
        r->p.top_k = (int[]){3, 3000, 0}[(i / 16) % 3];
        r->p.top_p = 0.7f;
    }
    if (sub == 3) r->p.min_p = 0.5f;
    r->p.logprobs = 1;
    r->p.n_top_logprobs = 20;
    r->p.logprobs_mode = (i / 2) % 2 ? DI_LOGPROBS_PROCESSED : DI_LOGPROBS_RAW;
}

typedef struct group {
    const char *name;
    mode_fn fn;
} group;

static const group groups[] = {
    {"greedy", m_greedy},
    {"temperature only", m_temp},
    {"top-k", m_topk},
    {"top-p", m_topp},
    {"min-p", m_minp},
    {"top-k+top-p+min-p", m_combo},
    {"penalties", m_penal},
    {"logit bias", m_bias},
    {"grammar mask", m_mask},
    {"everything", m_all},
    {"edge: one token left", m_one_left},
    {"edge: top_k 1", m_top1},
    {"edge: top_p 1e-7", m_topp_tiny},
    {"edge: temperature ~1e-5", m_temp_tiny},
    {"edge: ties,few,+-0,huge", m_extreme},
};

static void make_row(test_row *r, mode_fn fn, int i) {
    memset(r, 0, sizeof *r);
    r->logits = logits_random();
    r->p = di_sampling_params_default();
    r->p.seed = next_u64();
    r->expect = -1;
    fn(r, i);
    r->row = (di_sample_row){r->logits, &r->p, r->prompt, r->row.n_prompt, r->output, r->row.n_output, r->mask,
                             (int64_t)(next_u64() >> 1), (uint32_t)below(8)};
    if (below(8) == 0) r->row.position = below(100000); /* ordinary positions too */
}

static void free_row(test_row *r) {
    free(r->logits);
    free(r->mask);
}

static int same_result(const di_sample_result *a, const di_sample_result *b, int logprobs) {
    if (a->token != b->token) return 0;
    if (!logprobs) return 1;
    if (memcmp(&a->logprob, &b->logprob, sizeof a->logprob) || a->n_top != b->n_top) return 0;
    for (int i = 0; i < a->n_top; i++)
        if (a->top_ids[i] != b->top_ids[i] || memcmp(&a->top_logprobs[i], &b->top_logprobs[i], sizeof(float))) return 0;
    return 1;
}

static void print_row(const char *name, int rows, int known_bad, const char *gpu_bad, const char *inv_bad, double ms, int ok) {
    char tm[32];
    if (ms >= 0) snprintf(tm, sizeof tm, "%.3f", ms); else snprintf(tm, sizeof tm, "-");
    printf("%-26s %5d %8d %10s %10s %10s  %s\n", name, rows, known_bad, gpu_bad, inv_bad, tm, ok ? "PASS" : "FAIL");
    if (ok) n_pass++; else n_fail++;
}

/* Runs rows on the GPU in the given order; res[i] receives row order[i]'s result. */
static double gpu_run(di_cuda_sampler *gs, test_row *rows, const int *order, int n, float *d_logits,
                      di_sample_result *res) {
    di_sample_row br[MAX_ROWS];
    for (int i = 0; i < n; i++) {
        br[i] = rows[order[i]].row;
        CU(cudaMemcpy(d_logits + (size_t)i * V, rows[order[i]].logits, V * sizeof(float), cudaMemcpyHostToDevice));
    }
    CU(cudaDeviceSynchronize());
    di_error err;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (di_cuda_sampler_sample(gs, d_logits, n, br, res, NULL, NULL, &err) != DI_OK) die("di_cuda_sampler_sample", err.msg);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6;
}

static di_cuda_sampler *gs_few; /* 3 scratch slots: blocks loop over rows, reusing slots within a launch */

static void run_group(const group *g, int n, di_sampler *cs, di_cuda_sampler *gs, float *d_logits) {
    test_row rows[MAX_ROWS];
    di_sample_result cpu[MAX_ROWS], gpu[MAX_ROWS], rev[MAX_ROWS], alone;
    int known_bad = 0;
    for (int i = 0; i < n; i++) {
        make_row(&rows[i], g->fn, i);
        di_error err;
        if (di_sampler_sample(cs, &rows[i].row, &cpu[i], &err) != DI_OK) die(g->name, err.msg);
        if (rows[i].expect >= 0 && cpu[i].token != rows[i].expect) {
            known_bad++;
            printf("#   %s row %d: CPU token %d, expected %d\n", g->name, i, cpu[i].token, rows[i].expect);
        }
    }
    if (!gs) {
        print_row(g->name, n, known_bad, "-", "-", -1.0, known_bad == 0);
    } else {
        int order[MAX_ROWS];
        for (int i = 0; i < n; i++) order[i] = i;
        double ms = gpu_run(gs, rows, order, n, d_logits, gpu);
        int gpu_bad = 0, inv_bad = 0;
        for (int i = 0; i < n; i++)
            if (!same_result(&cpu[i], &gpu[i], rows[i].p.logprobs)) {
                if (gpu_bad++ < 3)
                    printf("#   %s row %d: CPU token %d logprob %a (top %d) vs GPU token %d logprob %a (top %d)\n", g->name,
                           i, cpu[i].token, cpu[i].logprob, cpu[i].n_top, gpu[i].token, gpu[i].logprob, gpu[i].n_top);
            }
        /* The ordered sum itself, bit for bit, where the test can restate it (raw logprobs): an order
         * error moves Z by ~1e-16 relative, which the f32 logprobs above show only rarely. */
        for (int i = 0; i < n; i++) {
            if (!rows[i].p.logprobs || rows[i].p.logprobs_mode != DI_LOGPROBS_RAW) continue;
            double zr = ref_mass_id_order(rows[i].logits), zg = di_cuda_sampler_last_mass(gs, i);
            if (memcmp(&zr, &zg, sizeof zr)) {
                if (gpu_bad++ < 3) printf("#   %s row %d: raw mass %a (restated CPU) vs %a (GPU)\n", g->name, i, zr, zg);
            }
        }
        /* batch invariance: reversed batch, and the first two rows alone */
        for (int i = 0; i < n; i++) order[i] = n - 1 - i;
        gpu_run(gs, rows, order, n, d_logits, rev);
        for (int i = 0; i < n; i++) inv_bad += !same_result(&gpu[n - 1 - i], &rev[i], rows[n - 1 - i].p.logprobs);
        for (int i = 0; i < n && i < 2; i++) {
            order[0] = i;
            gpu_run(gs, rows, order, 1, d_logits, &alone);
            inv_bad += !same_result(&gpu[i], &alone, rows[i].p.logprobs);
        }
        for (int i = 0; i < n; i++) order[i] = i;
        gpu_run(gs_few, rows, order, n, d_logits, rev);
        for (int i = 0; i < n; i++) inv_bad += !same_result(&gpu[i], &rev[i], rows[i].p.logprobs);
        char gb[16], ib[16];
        snprintf(gb, sizeof gb, "%d", gpu_bad);
        snprintf(ib, sizeof ib, "%d", inv_bad);
        print_row(g->name, n, known_bad, gb, ib, ms, known_bad == 0 && gpu_bad == 0 && inv_bad == 0);
    }
    for (int i = 0; i < n; i++) free_row(&rows[i]);
}

/* Errors, in one batch with good rows: a NaN logit, a row whose mask and logits leave nothing, bad
 * params (top_p 2), an output id out of range. The CPU fails each; the GPU with per-row errors must
 * fail exactly those rows and sample the good rows as the CPU does, and without them fail the call. */
static void run_errors(di_sampler *cs, di_cuda_sampler *gs, float *d_logits) {
    enum { N = 6 };
    static const char *what[N] = {"good", "NaN logit", "nothing allowed", "good", "top_p 2", "output id V"};
    test_row rows[N];
    di_sample_result cpu[N], gpu[N];
    int cpu_rc[N];
    for (int i = 0; i < N; i++) {
        make_row(&rows[i], m_combo, i);
        if (i == 1) rows[i].logits[777] = NAN;
        if (i == 2) {
            rows[i].mask = calloc(WORDS, sizeof *rows[i].mask);
            rows[i].mask[10] = 1u;
            rows[i].logits[320] = -INFINITY;
            rows[i].row.mask = rows[i].mask;
        }
        if (i == 4) rows[i].p.top_p = 2.0f;
        if (i == 5) {
            rows[i].output[0] = V;
            rows[i].row.n_output = 1;
        }
        di_error err;
        cpu_rc[i] = di_sampler_sample(cs, &rows[i].row, &cpu[i], &err);
    }
    int cpu_ok = 1;
    for (int i = 0; i < N; i++) cpu_ok &= (cpu_rc[i] == DI_OK) == (i == 0 || i == 3);
    char gb[16] = "-";
    int gpu_ok = 1;
    if (gs) {
        di_sample_row br[N];
        di_error row_err[N], err;
        for (int i = 0; i < N; i++) {
            br[i] = rows[i].row;
            CU(cudaMemcpy(d_logits + (size_t)i * V, rows[i].logits, V * sizeof(float), cudaMemcpyHostToDevice));
        }
        CU(cudaDeviceSynchronize());
        int rc = di_cuda_sampler_sample(gs, d_logits, N, br, gpu, row_err, NULL, &err);
        int bad = rc != DI_OK;
        for (int i = 0; i < N && !rc; i++) {
            printf("#   error batch row %d (%s): %s\n", i, what[i], row_err[i].code ? row_err[i].msg : "sampled");
            bad += row_err[i].code != cpu_rc[i];
            if (!cpu_rc[i]) bad += !same_result(&cpu[i], &gpu[i], rows[i].p.logprobs);
        }
        rc = di_cuda_sampler_sample(gs, d_logits, N, br, gpu, NULL, NULL, &err);
        printf("#   error batch without per-row errors: %s\n", rc ? err.msg : "(no error)");
        bad += rc != DI_ERR_INVALID;
        snprintf(gb, sizeof gb, "%d", bad);
        gpu_ok = bad == 0;
    }
    print_row("errors in a batch", N, !cpu_ok, gb, "-", -1.0, cpu_ok && gpu_ok);
    for (int i = 0; i < N; i++) free_row(&rows[i]);
}

int main(void) {
    const char *seed = getenv("DI_SEED");
    if (seed) rng ^= strtoull(seed, NULL, 0) * 0xD1B54A32D192ED03ull;
    const int n_rows = getenv("DI_QUICK") ? 4 : MAX_ROWS;
    const int cpu_only = getenv("DI_CPU_ONLY") != NULL;
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess) n_dev = 0;
    if (n_dev < 1 && !cpu_only) {
        printf("no CUDA device: nothing to test (DI_CPU_ONLY=1 runs the CPU side)\n0 passed, 1 failed\n");
        return 1;
    }
    di_error err;
    di_sampler *cs;
    if (di_sampler_new(V, &cs, &err) != DI_OK) die("di_sampler_new", err.msg);
    di_cuda_sampler *gs = NULL;
    float *d_logits = NULL; /* [MAX_ROWS, V] f32 */
    if (!cpu_only) {
        struct cudaDeviceProp prop;
        CU(cudaGetDeviceProperties(&prop, 0));
        printf("# device: %s, %d SMs; V %d, %d rows per group; seed %s\n", prop.name, prop.multiProcessorCount, V, n_rows,
               seed ? seed : "default");
        if (di_cuda_sampler_new(V, 0, &gs, &err) != DI_OK) die("di_cuda_sampler_new", err.msg);
        if (di_cuda_sampler_new(V, 3, &gs_few, &err) != DI_OK) die("di_cuda_sampler_new", err.msg);
        CU(cudaMalloc((void **)&d_logits, (size_t)MAX_ROWS * V * sizeof(float)));
    } else {
        printf("# CPU side only (DI_CPU_ONLY): CPU reference and known answers; V %d, %d rows per group; seed %s\n", V,
               n_rows, seed ? seed : "default");
    }
    printf("%-26s %5s %8s %10s %10s %10s  %s\n", "group", "rows", "known!=", "gpu!=cpu", "batch!=", "gpu ms", "result");
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) run_group(&groups[g], n_rows, cs, gs, d_logits);
    run_errors(cs, gs, d_logits);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    di_cuda_sampler_free(gs);
    di_cuda_sampler_free(gs_few);
    if (d_logits) cudaFree(d_logits);
    di_sampler_free(cs);
    return n_fail ? 1 : 0;
}
