/* GPU test and benchmark of the tensor-core sparse attention (src/backend/cuda/cuda_attn_fast.cu)
 * against the CPU reference op (src/backend/cpu/sparse_attn.c) at the V4.1 shapes: q [m, 64, 512]
 * bf16, one shared 512-wide latent KV head, index lists of the 128 window slots + 512 selected
 * compressed entries (640), compressed pools of ctx/2 entries (ratio-2 layers) for contexts 4K and
 * 64K; decode m = 1, 8, 64, 256 and an 8192-token prefill with the real prefill lists (window
 * max(0, p−127) … p, top-512 of the (p+1)/2 visible entries, −1 padding).
 *
 * Exactness. The fast kernel keeps every rounding point of the reference's online softmax (blocks of
 * 64 in list order, running max from −1e30, bf16 probabilities against the running max, the f32
 * probability sum in the CPU's 8-lane order, f64-rounded exp like the scalar CUDA kernel), but its two
 * dot products run on the tensor cores: the bf16 products are exact, the f32 accumulation order is the
 * MMA's (not the CPU's 8 strided lanes, and each MMA adds its 16 products to the running sum with the
 * tensor core's own rounding; the kernel keeps 4 chains for S to shorten that), and P·V is accumulated
 * into O·α in one MMA chain where the CPU rounds Σ p·v first. A score that differs in its last f32 bits
 * flips a bf16 probability when p lies that close to a bf16 rounding boundary, and a flip moves the
 * outputs of its (query, head) row by ≤ 2^-7·(p/l)·|v|, flipping an output's bf16 rounding now and
 * then. Measured (bench/NOTES-gpu.md): ≤ 1 row-ulp (see cmp_bf16) on ~0.1–0.3 % of the outputs with
 * 4 chains (0.5–0.9 % with one 32-long chain: the tensor-core sum error is the cause). Tolerance:
 * ≤ 2 row-ulp on ≤ 1 % of the outputs (2 row-ulp: one flip at a dominant key plus the output's own
 * rounding).
 * No drift: the CPU-vs-fast difference does not grow with the list length (contexts 4K vs 64K have
 * the same 640 keys; the prefill rows with 1 … 640 valid keys are checked too).
 *
 * Invariance (exact, 0 mismatches): the same query gives the same bits alone (m = 1) and inside a
 * batch (m = 256), and for every forced work split (64 … 512 columns × 64 or 16 heads per block). The fallback for
 * other shapes (64 heads × 512 only) must equal the scalar CUDA kernel bit for bit.
 *
 * Speed: per shape the fast kernel, the scalar CUDA kernel (cuda_attn.cu) and the bytes that must move
 * (q + gathered valid KV rows + index list + out), against the H200's measured HBM read ceiling
 * (4.47 TB/s, issue #10); TFLOP/s = 4·64·512·(valid keys) / time. Timing: median of N launches on a
 * cold L2 (256 MB of clean lines read before each launch, as other layers' weights would in a
 * decode step: see flush_l2), CUDA events around the op alone.
 *
 * Usage: test_cuda_attn_fast ; DI_QUICK=1 skips the 64K context and the prefill; DI_BENCH_ONLY=1 runs
 * only the fast kernel's timings (for a profiler). Exit status 1 if any check fails. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_attn_fast.h"
#include "backend/cuda/cuda_ops.h"
#include "io/formats.h"
#include "cuda_testutil.h"

#define NH 64
#define DIM 512
#define HBM_TBS 4.47 /* measured HBM read ceiling of the H200 (issue #10) */

static di_backend *cpu, *gpu;
static int n_pass, n_fail;
static di_error g_err;
#define E (&g_err)


/* downloads wait for the backend's stream first (its ops do not order with cudaMemcpy) */
static void *down(const void *d, size_t n) {
    void *h = xmalloc(n);
    RUN(di_backend_cuda_sync(gpu, E));
    CU(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
    return h;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) { return ct_xorshift(&rng); }
/* bf16 of an approximately normal value (sum of 4 uniforms, sd ≈ sd) */
static uint16_t rand_bf16_1(double sd) {
    uint64_t r = rnd();
    double u = (double)(r & 0xffff) + (double)((r >> 16) & 0xffff) + (double)((r >> 32) & 0xffff) + (double)(r >> 48);
    return di_f32_to_bf16((float)((u / 65536.0 - 2.0) * sd * 1.7320508));
}
static uint16_t *rand_bf16(int64_t n, double sd) {
    uint16_t *p = xmalloc(sizeof *p * (size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = rand_bf16_1(sd);
    return p;
}

/* ---------------- comparison ----------------
 * Distances are measured in ulps of the (query, head) row's scale: ulp_bf16(max_j |cpu[row, j]|). A
 * flipped bf16 probability moves every output of its row by ≤ 2^-7·(p/l)·|v| ≤ 2^-7·max|v|, so the
 * row scale is the natural unit; a plain per-element ulp count explodes on outputs near 0 (an output of
 * 1e-6 is 2^-7 of a 1.3e-4-wide row ulp, yet thousands of its own ulps from its neighbour). */
typedef struct stats {
    double max_abs, max_rulp, frac;
    int64_t n_diff;
} stats;

static double bf16_ulp(double x) { /* ulp of a bf16 of magnitude x (8 significant bits) */
    if (x <= 0) return 0x1p-133;
    return ldexp(1.0, ilogb(x) - 7);
}

/* n elements in rows of `row` */
static stats cmp_bf16(const uint16_t *g, const uint16_t *c, int64_t n, int64_t row) {
    stats s = {0, 0, 0, 0};
    for (int64_t r0 = 0; r0 < n; r0 += row) {
        double scale = 0;
        for (int64_t i = r0; i < r0 + row; i++) scale = fmax(scale, fabs((double)di_bf16_to_f32(c[i])));
        const double ulp = bf16_ulp(scale);
        for (int64_t i = r0; i < r0 + row; i++) {
            if (g[i] == c[i]) continue;
            float a = di_bf16_to_f32(g[i]), b = di_bf16_to_f32(c[i]);
            s.n_diff++;
            double d = isnan(a) || isnan(b) ? INFINITY : fabs((double)a - (double)b);
            s.max_abs = fmax(s.max_abs, d);
            s.max_rulp = fmax(s.max_rulp, d / ulp);
        }
    }
    s.frac = n ? (double)s.n_diff / (double)n : 0;
    return s;
}

#define TOL_RULP 2.0
#define TOL_FRAC 1e-2
static void row(const char *what, const char *shape, stats s, int exact) {
    int ok = exact ? s.n_diff == 0 : (s.max_rulp <= TOL_RULP && s.frac <= TOL_FRAC);
    printf("%-24s %-44s %10.3g %6.2f %10lld %10.3g  %-22s %s\n", what, shape, s.max_abs, s.max_rulp,
           (long long)s.n_diff, s.frac, exact ? "exact" : "<=2 row-ulp on <=1e-2", ok ? "PASS" : "FAIL");
    printf("# attn_fast %s %s: mismatch %.3g, max row-ulp %.2f\n", what, shape, s.frac, s.max_rulp);
    fflush(stdout);
    ok ? n_pass++ : n_fail++;
}

/* ---------------- problems ---------------- */
/* One call's inputs, host and device. kv_win/kv_cmp are views into the shared random pool. */
typedef struct problem {
    int64_t m, n_win, n_cmp, n_idx, n_valid; /* n_valid: listed rows that exist (bytes and FLOPs) */
    uint16_t *q;                              /* bf16 [m, 64, 512] */
    float sink[NH];                           /* f32 [64] */
    int32_t *idx;                             /* int32 [m, n_idx] */
    uint16_t *dq, *dout;                      /* device q, out bf16 [m, 64, 512] */
    float *dsink;
    int32_t *didx;
    const uint16_t *dwin, *dcmp;              /* device views into the pool */
} problem;

static uint16_t *g_pool, *g_dpool; /* bf16 [POOL_ROWS, 512] random KV rows, host and device */
#define POOL_ROWS (262144 + 256 * 128)
static const float SCALE = 0.044194173824159216f; /* 512^-0.5 */

static void problem_upload(problem *p) {
    p->dq = dup_dev(p->q, sizeof *p->q * (size_t)(p->m * NH * DIM));
    p->dsink = dup_dev(p->sink, sizeof p->sink);
    p->didx = dup_dev(p->idx, sizeof *p->idx * (size_t)(p->m * p->n_idx));
    p->dout = dev_poisoned(sizeof *p->q * (size_t)(p->m * NH * DIM));
    p->n_valid = 0;
    for (int64_t i = 0; i < p->m * p->n_idx; i++) p->n_valid += p->idx[i] >= 0;
}
static void problem_free(problem *p) {
    free(p->q), free(p->idx);
    cudaFree(p->dq), cudaFree(p->dsink), cudaFree(p->didx), cudaFree(p->dout);
}
static void problem_q_sink(problem *p) {
    p->q = rand_bf16(p->m * NH * DIM, 1.0);
    for (int h = 0; h < NH; h++) p->sink[h] = (float)(2.0 * (double)(rnd() >> 11) * 0x1p-53 - 0.5);
}

/* Decode step of m sequences at context ctx: sequence i owns ring rows [128 i, 128 i + 128) of the
 * window pool and ctx/2 compressed entries (wrapping inside a 256 MB pool); its list is the ring in
 * ring order (oldest first, from a random slot) then 512 ascending distinct compressed entries. */
static problem decode_problem(int64_t m, int64_t ctx, int holes) {
    problem p = {0};
    p.m = m, p.n_win = m * 128, p.n_cmp = 262144, p.n_idx = 640;
    const int64_t n_seq = ctx / 2, stride = n_seq / 512;
    p.dwin = g_dpool + (int64_t)262144 * DIM, p.dcmp = g_dpool;
    problem_q_sink(&p);
    p.idx = xmalloc(sizeof *p.idx * (size_t)(m * 640));
    for (int64_t i = 0; i < m; i++) {
        int32_t *ix = p.idx + i * 640;
        int64_t slot = (int64_t)(rnd() % 128);
        for (int j = 0; j < 128; j++) ix[j] = (int32_t)(i * 128 + (slot + 1 + j) % 128);
        for (int j = 0; j < 512; j++) {
            int64_t e = j * stride + (int64_t)(rnd() % (uint64_t)stride);
            ix[128 + j] = (int32_t)(p.n_win + (i * n_seq + e) % p.n_cmp);
        }
        if (holes)
            for (int j = 0; j < 640; j++)
                if (rnd() % 16 == 0 || (i == 0 && holes > 1)) ix[j] = -1;
    }
    problem_upload(&p);
    return p;
}

/* One-shot prefill of T tokens from position 0: kv_win = the T prompt rows, kv_cmp = the T/2 ratio-2
 * entries; row p lists max(0, p−127) … p (−1 where negative: only p < 127 has fewer, the reference
 * pads the 128 slots) then the top-512 of its (p+1)/2 visible entries, ascending (all of them, then −1
 * padding, while fewer than 512 are visible). */
static problem prefill_problem(int64_t T) {
    problem p = {0};
    p.m = T, p.n_win = T, p.n_cmp = T / 2, p.n_idx = 640;
    p.dwin = g_dpool, p.dcmp = g_dpool + T * DIM;
    problem_q_sink(&p);
    p.idx = xmalloc(sizeof *p.idx * (size_t)(T * 640));
    for (int64_t i = 0; i < T; i++) {
        int32_t *ix = p.idx + i * 640;
        for (int j = 0; j < 128; j++) {
            int64_t pos = i - 127 + j;
            ix[j] = pos < 0 ? -1 : (int32_t)pos;
        }
        int64_t vis = (i + 1) / 2;
        if (vis <= 512) {
            for (int j = 0; j < 512; j++) ix[128 + j] = j < vis ? (int32_t)(T + j) : -1;
        } else {
            int64_t stride = vis / 512;
            for (int j = 0; j < 512; j++) ix[128 + j] = (int32_t)(T + j * stride + (int64_t)(rnd() % (uint64_t)stride));
        }
    }
    problem_upload(&p);
    return p;
}

/* cols × heads per block forced, or 0 × 0 (the op's own choice) */
static int fast_split(const problem *p, int cols, int heads) {
    return di_cuda_sparse_attn_fast_split(gpu, p->dq, p->m, NH, DIM, p->dwin, p->n_win, p->dcmp, p->n_cmp, p->dsink,
                                          p->didx, p->n_idx, SCALE, p->dout, cols, heads, E);
}
static int fast(const problem *p, int cols) { return fast_split(p, cols, 0); }
static int scalar(const problem *p) {
    return gpu->sparse_attn(gpu, p->dq, p->m, NH, DIM, p->dwin, p->n_win, p->dcmp, p->n_cmp, p->dsink, p->didx,
                            p->n_idx, SCALE, p->dout, E);
}

/* CPU reference of rows [r0, r0 + n) (host pool views) */
static uint16_t *cpu_rows(const problem *p, int64_t r0, int64_t n) {
    const uint16_t *win = g_pool + (p->dwin - g_dpool), *cmp = g_pool + (p->dcmp - g_dpool);
    uint16_t *o = xmalloc(sizeof *o * (size_t)(n * NH * DIM));
    RUN(cpu->sparse_attn(cpu, p->q + r0 * NH * DIM, n, NH, DIM, win, p->n_win, cmp, p->n_cmp, p->sink,
                         p->idx + r0 * p->n_idx, p->n_idx, SCALE, o, E));
    return o;
}

/* ---------------- timing ---------------- */
static cudaEvent_t ev0, ev1;
/* Before each timed launch a 256 MB matrix-vector product (linear_f32 over g_flush, bf16 [16384, 8192])
 * READS more than the L2 holds: the op starts on a cold L2 full of clean lines, as after the weight
 * reads of a decode step. (A memset would leave ~60 MB of dirty lines whose write-back competes with
 * the op's reads.) */
static void *g_flush, *g_flush_x, *g_flush_y;
#define FLUSH_BYTES (256u << 20)
static void flush_l2(void) {
    RUN(gpu->linear_f32(gpu, (const uint16_t *)g_flush_x, 1, 8192, (const uint16_t *)g_flush, 16384,
                        (float *)g_flush_y, E));
}
static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}
/* median ms of `reps` launches of fn(p, cols) */
static float time_op(int (*fn)(const problem *, int), const problem *p, int cols, int reps) {
    cudaStream_t s = (cudaStream_t)di_backend_cuda_stream(gpu);
    float t[64];
    RUN(fn(p, cols)); /* warm-up */
    for (int r = 0; r < reps; r++) {
        flush_l2();
        CU(cudaEventRecord(ev0, s));
        RUN(fn(p, cols));
        CU(cudaEventRecord(ev1, s));
        CU(cudaEventSynchronize(ev1));
        CU(cudaEventElapsedTime(&t[r], ev0, ev1));
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_float);
    return t[reps / 2];
}
static int fast_fn(const problem *p, int cols) { return fast(p, cols); }
static int scalar_fn(const problem *p, int cols) {
    (void)cols;
    return scalar(p);
}

static void bench(const char *name, const problem *p, int scalar_reps) {
    double bytes = (double)p->m * NH * DIM * 2 * 2 + (double)p->n_valid * DIM * 2 + (double)p->m * p->n_idx * 4;
    double flop = 4.0 * NH * DIM * (double)p->n_valid;
    float tf = time_op(fast_fn, p, 0, 21);
    float ts = scalar_reps ? time_op(scalar_fn, p, 0, scalar_reps) : -1;
    printf("%-34s %8.1f MB %10.1f %8.0f %6.1f%% %7.1f | %10.1f %8.0f %7.2f | %6.1fx\n", name, bytes / 1e6,
           tf * 1e3, bytes / (tf * 1e-3) / 1e9, 100.0 * bytes / (tf * 1e-3) / (HBM_TBS * 1e12),
           flop / (tf * 1e-3) / 1e12, ts * 1e3, ts > 0 ? bytes / (ts * 1e-3) / 1e9 : 0.0,
           ts > 0 ? flop / (ts * 1e-3) / 1e12 : 0.0, ts > 0 ? ts / tf : 0.0);
    printf("# attn_fast %s us: %.2f\n", name, tf * 1e3);
    fflush(stdout);
}

int main(void) {
    int quick = getenv("DI_QUICK") != NULL, bench_only = getenv("DI_BENCH_ONLY") != NULL;
    int nth = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (di_cuda_device_count() < 1) {
        printf("no CUDA device: nothing to test\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(di_backend_cpu_create(nth > 0 ? nth : 1, &cpu, E));
    RUN(di_backend_cuda_create(0, &gpu, E));
    CU(cudaEventCreate(&ev0));
    CU(cudaEventCreate(&ev1));
    CU(cudaMalloc(&g_flush, FLUSH_BYTES));
    CU(cudaMalloc(&g_flush_x, 8192 * 2));
    CU(cudaMalloc(&g_flush_y, 16384 * 4));
    CU(cudaMemset(g_flush, 0, FLUSH_BYTES));
    CU(cudaMemset(g_flush_x, 0, 8192 * 2));
    CU(cudaDeviceSynchronize());
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("# device: %s, %d SMs, L2 %d MB; CPU reference: %d threads\n", prop.name, prop.multiProcessorCount,
           prop.l2CacheSize >> 20, nth);

    g_pool = rand_bf16((int64_t)POOL_ROWS * DIM, 1.0);
    g_dpool = dup_dev(g_pool, sizeof *g_pool * (size_t)POOL_ROWS * DIM);

    const int64_t ms[4] = {1, 8, 64, 256}, ctxs[2] = {4096, 65536};
    problem dec[2][4];
    char sh[96];

    printf("%-24s %-44s %10s %6s %10s %10s  %-22s %s\n", "check", "shape", "max|d|", "r-ulp", "mismatch", "fraction",
           "tolerance", "result");
    for (int c = 0; c < (quick ? 1 : 2); c++)
        for (int k = 0; k < 4; k++) dec[c][k] = decode_problem(ms[k], ctxs[c], 0);
    for (int c = 0; c < (bench_only ? 0 : quick ? 1 : 2); c++)
        for (int k = 0; k < 4; k++) {
            problem *p = &dec[c][k];
            RUN(fast(p, 0));
            uint16_t *g = down(p->dout, sizeof *g * (size_t)(p->m * NH * DIM)), *r = cpu_rows(p, 0, p->m);
            snprintf(sh, sizeof sh, "decode q[%lld,64,512] idx 640 ctx %lldK", (long long)p->m,
                     (long long)(ctxs[c] >> 10));
            row("fast vs cpu", sh, cmp_bf16(g, r, p->m * NH * DIM, DIM), 0);
            free(g), free(r);
        }
    if (!bench_only) { /* −1 holes everywhere and one all-(−1) row; a list that is not a multiple of 64 */
        problem p = decode_problem(8, 4096, 2);
        RUN(fast(&p, 0));
        uint16_t *g = down(p.dout, sizeof *g * (size_t)(p.m * NH * DIM)), *r = cpu_rows(&p, 0, p.m);
        row("fast vs cpu", "decode q[8] idx 640, 1/16 -1, row 0 all -1", cmp_bf16(g, r, p.m * NH * DIM, DIM), 0);
        int zero = 1;
        for (int i = 0; i < NH * DIM; i++) zero &= g[i] == 0;
        stats z = {0, 0, 0, !zero};
        row("all -1 row is 0", "decode q[8] row 0", z, 1);
        free(g), free(r);
        p.n_idx = 100; /* the first 100 slots of each row, read with row stride 100 */
        for (int64_t i = 0; i < p.m; i++) memmove(p.idx + i * 100, p.idx + i * 640, 100 * sizeof *p.idx);
        CU(cudaMemcpy(p.didx, p.idx, sizeof *p.idx * (size_t)(p.m * 100), cudaMemcpyHostToDevice));
        CU(cudaDeviceSynchronize());
        RUN(fast(&p, 0));
        g = down(p.dout, sizeof *g * (size_t)(p.m * NH * DIM)), r = cpu_rows(&p, 0, p.m);
        row("fast vs cpu", "decode q[8] idx 100 (partial block)", cmp_bf16(g, r, p.m * NH * DIM, DIM), 0);
        free(g), free(r);
        p.n_idx = 0; /* empty lists: only the sink, so exactly 0 */
        RUN(fast(&p, 0));
        g = down(p.dout, sizeof *g * (size_t)(p.m * NH * DIM)), r = cpu_rows(&p, 0, p.m);
        row("fast vs cpu", "decode q[8] idx 0 (empty lists)", cmp_bf16(g, r, p.m * NH * DIM, DIM), 1);
        free(g), free(r);
        { /* kv_cmp not 16-byte aligned (one element off): the scalar kernel's path, bit-identical to it */
            problem u = p;
            u.n_idx = 100, u.dcmp = p.dcmp + 1, u.n_cmp = p.n_cmp - 1;
            for (int64_t i = 0; i < u.m * 100; i++) /* keep every index inside the shortened pool */
                if (u.idx[i] >= u.n_win + u.n_cmp) u.idx[i] = -1;
            CU(cudaMemcpy(u.didx, u.idx, sizeof *u.idx * (size_t)(u.m * 100), cudaMemcpyHostToDevice));
            CU(cudaDeviceSynchronize());
            RUN(fast(&u, 0));
            uint16_t *g1 = down(u.dout, sizeof *g1 * (size_t)(u.m * NH * DIM));
            RUN(scalar(&u));
            uint16_t *g2 = down(u.dout, sizeof *g2 * (size_t)(u.m * NH * DIM));
            row("unaligned = scalar", "decode q[8] idx 100, kv_cmp + 1 element", cmp_bf16(g1, g2, u.m * NH * DIM, DIM), 1);
            free(g1), free(g2);
        }
        problem_free(&p);
    }
    if (!bench_only) { /* invariance: every work split, and batch vs alone */
        problem *p = &dec[0][1];
        uint16_t *ref = NULL;
        const int split[7][2] = {{512, 64}, {256, 64}, {128, 64}, {64, 64}, {512, 16}, {256, 16}, {128, 16}};
        for (int k = 0; k < 7; k++) {
            RUN(fast_split(p, split[k][0], split[k][1]));
            uint16_t *g = down(p->dout, sizeof *g * (size_t)(p->m * NH * DIM));
            if (!ref) {
                ref = g;
                continue;
            }
            snprintf(sh, sizeof sh, "q[8] %d cols x %d heads vs 512 x 64", split[k][0], split[k][1]);
            row("split invariance", sh, cmp_bf16(g, ref, p->m * NH * DIM, DIM), 1);
            free(g);
        }
        free(ref);
        problem *b = &dec[0][3];
        RUN(fast(b, 0)); /* m = 256: 512 columns × 64 heads per block */
        uint16_t *gb = down(b->dout, sizeof *gb * (size_t)(b->m * NH * DIM));
        problem one = *b; /* row 77 alone: m = 1, 128 columns × 16 heads per block */
        one.m = 1, one.dq = b->dq + 77 * NH * DIM, one.didx = b->didx + 77 * 640;
        one.dout = dev_poisoned(sizeof *gb * NH * DIM);
        RUN(fast(&one, 0));
        uint16_t *g1 = down(one.dout, sizeof *g1 * NH * DIM);
        row("batch invariance", "row 77 of q[256] vs alone", cmp_bf16(g1, gb + 77 * NH * DIM, NH * DIM, DIM), 1);
        free(gb), free(g1), cudaFree(one.dout);
    }
    if (!bench_only) { /* other shapes go to the scalar kernel: bit-identical to it */
        problem p = decode_problem(2, 4096, 1);
        uint16_t *qh = rand_bf16(2 * 8 * 128, 1.0);
        uint16_t *dq = dup_dev(qh, sizeof *qh * 2 * 8 * 128), *o1 = dev_poisoned(2 * 2 * 8 * 128), *o2 = dev_poisoned(2 * 2 * 8 * 128);
        uint16_t *dkv = (uint16_t *)g_dpool; /* rows of 128 channels: any 1024 rows of the pool */
        int32_t *ix = xmalloc(sizeof *ix * 2 * 64);
        for (int i = 0; i < 128; i++) ix[i] = (int32_t)(rnd() % 1024) - (i % 13 == 0 ? 2000 : 0);
        for (int i = 0; i < 128; i++) ix[i] = ix[i] < 0 ? -1 : ix[i];
        int32_t *dix = dup_dev(ix, sizeof *ix * 128);
        RUN(di_cuda_sparse_attn_fast(gpu, dq, 2, 8, 128, dkv, 512, dkv + 512 * 128, 512, p.dsink, dix, 64, 0.088f, o1, E));
        RUN(gpu->sparse_attn(gpu, dq, 2, 8, 128, dkv, 512, dkv + 512 * 128, 512, p.dsink, dix, 64, 0.088f, o2, E));
        uint16_t *g1 = down(o1, 2 * 2 * 8 * 128), *g2 = down(o2, 2 * 2 * 8 * 128);
        row("fallback = scalar", "q[2, 8, 128] idx 64", cmp_bf16(g1, g2, 2 * 8 * 128, 128), 1);
        free(qh), free(ix), free(g1), free(g2), cudaFree(dq), cudaFree(o1), cudaFree(o2), cudaFree(dix);
        problem_free(&p);
    }
    problem pre = {0};
    if (!quick) pre = prefill_problem(8192);
    if (!quick && !bench_only) { /* prefill 8192: every row vs the scalar kernel; rows 0 … 127 and every 32nd vs CPU */
        RUN(fast(&pre, 0));
        uint16_t *g = down(pre.dout, sizeof *g * (size_t)(pre.m * NH * DIM));
        RUN(scalar(&pre));
        uint16_t *s = down(pre.dout, sizeof *s * (size_t)(pre.m * NH * DIM));
        row("fast vs scalar cuda", "prefill q[8192,64,512] idx 640", cmp_bf16(g, s, pre.m * NH * DIM, DIM), 0);
        stats worst = {0, 0, 0, 0};
        int64_t n = 0;
        for (int64_t r0 = 0; r0 < pre.m; r0 += r0 == 0 ? 128 : 32) {
            const int64_t cnt = r0 == 0 ? 128 : 1; /* rows 0 … 127 (1 … 128 valid keys), then every 32nd */
            uint16_t *r = cpu_rows(&pre, r0, cnt);
            stats st = cmp_bf16(g + r0 * NH * DIM, r, cnt * NH * DIM, DIM);
            worst.n_diff += st.n_diff;
            worst.max_rulp = fmax(worst.max_rulp, st.max_rulp);
            worst.max_abs = st.max_abs > worst.max_abs ? st.max_abs : worst.max_abs;
            n += cnt;
            free(r);
        }
        worst.frac = (double)worst.n_diff / (double)(n * NH * DIM);
        snprintf(sh, sizeof sh, "prefill 8192, %lld rows (0..127, every 32nd)", (long long)n);
        row("fast vs cpu", sh, worst, 0);
        free(g), free(s);
    }
    printf("%d passed, %d failed\n", n_pass, n_fail);

    printf("\n# speed: median of 21 (fast) launches on a cold L2; bytes = q + valid gathered KV rows + idx + out; "
           "HBM ceiling %.2f TB/s\n",
           HBM_TBS);
    printf("%-34s %11s %10s %8s %7s %7s | %10s %8s %7s | %7s\n", "shape", "bytes", "fast us", "GB/s", "roof",
           "TFLOP/s", "scalar us", "GB/s", "TFLOP/s", "speedup");
    for (int c = 0; c < (quick ? 1 : 2); c++)
        for (int k = 0; k < 4; k++) {
            snprintf(sh, sizeof sh, "decode m=%lld ctx %lldK", (long long)ms[k], (long long)(ctxs[c] >> 10));
            bench(sh, &dec[c][k], bench_only ? 0 : ms[k] >= 64 ? 3 : 7);
            problem_free(&dec[c][k]);
        }
    if (!quick) {
        bench("prefill m=8192 (T=8192)", &pre, bench_only ? 0 : 1);
        problem_free(&pre);
    }
    di_backend_cuda_destroy(gpu);
    di_backend_destroy(cpu);
    free(g_pool), cudaFree(g_dpool), cudaFree(g_flush), cudaFree(g_flush_x), cudaFree(g_flush_y);
    return n_fail ? 1 : 0;
}
