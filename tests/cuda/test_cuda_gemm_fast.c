/* GPU test (and, with --bench, benchmark) of the tensor-core FP8 / MXFP4 GEMMs of
 * src/backend/cuda/cuda_gemm_wgmma.cu against the CPU reference.
 *
 * 1. One K block in isolation (di_cuda_wgmma_block_dot): the tensor core's f32 result of a 32-term e4m3
 *    dot product against the exact sum rounded once to f32 (what the CPU's f64 block sum gives), on
 *    full-range random codes and on codes of quantized Gaussian data; then a scan of candidate models
 *    of the hardware's accumulation (products aligned to the largest, truncated to n fraction bits,
 *    summed per chunk of c terms) to name the rule that reproduces every measured value.
 * 2. The GEMMs at the V4.1 shapes (spec §2.4: wq_a, wq_b, wkv, wo_b, shared w1/w2, indexer wq_b; FP4
 *    experts w1/w3 and w2) for M = 1 … 8192 and at edge shapes (N, M tails, K = 32/96, NaN rows, scales
 *    outside the fused-promotion range): every output against the exact kernel of cuda_gemm.cu, which
 *    the CPU backend confirms on sampled rows (bit for bit). Reported: outputs that differ, the bf16 ulp
 *    histogram, the largest distance; the tolerance below is asserted.
 * 3. Batch invariance: rows computed with M = 1 and M = 5 equal the same rows of a large-M call bit for bit.
 *
 * Tolerance: see TOL_REAL below (the measurement behind it is in bench/NOTES-gpu.md).
 * 4. The persistent kernel against the first one (bit for bit, every case), the vectorised act-quant
 *    against the CPU's, the grouped expert GEMM against per-expert calls (bit for bit).
 * Usage: test_cuda_gemm_fast [--bench | --bench-only | --bench-noblock | --block-only | --graph-decode]
 *   (exit status 1 on any failure; DI_SEED=n draws other inputs; DI_DUMP_DIR=dir keeps the block data;
 *   DI_BENCH_PREFILL=1: the bench at M = 8192 only, then the grouped expert bench; DI_BENCH_ONE=1: wq_a
 *   at M = 8192 only, for a profiler) */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_gemm_wgmma.h"
#include "backend/cuda/cuda_ops.h"
#include "io/formats.h"
#include "cuda_testutil.h"

static di_backend *cpu, *gpu;
static int n_fail, n_pass;
static di_error g_err;
#define E (&g_err)
#define E_ERR (&g_err)


/* downloads wait for the whole device first */
static void *down(const void *d, size_t n) {
    void *h = xmalloc(n);
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
    return h;
}

/* ---------------- random inputs ---------------- */
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) { return ct_xorshift(&rng); }
static double gauss(void) { return ct_gauss(&rng); }
static uint16_t *rand_bf16(int64_t n, double sd) {
    uint16_t *p = xmalloc(sizeof *p * (size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = di_f32_to_bf16((float)(gauss() * sd));
    return p;
}
/* full-range e4m3 codes without the NaN codes */
static uint8_t rand_code(void) {
    uint8_t c = (uint8_t)rnd();
    return (c & 0x7f) == 0x7f ? c ^ 1 : c;
}
/* weight codes: "uniform" = full-range codes; otherwise a Gaussian scaled so a 32-block's amax lands
 * near 448, as a checkpoint's quantizer leaves it */
static uint8_t *rand_wcodes(int64_t n, int uniform) {
    uint8_t *p = xmalloc((size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = uniform ? rand_code() : di_f32_to_e4m3((float)(gauss() * 160.0));
    return p;
}
static uint8_t *rand_fp4(int64_t nbytes) {
    uint8_t *p = xmalloc((size_t)nbytes);
    for (int64_t i = 0; i < nbytes; i++) {
        /* nibbles from a Gaussian on the E2M1 grid, sd ~2 (amax of a block near 6) */
        p[i] = di_fp4_pack(di_f32_to_e2m1((float)(gauss() * 2.0)), di_f32_to_e2m1((float)(gauss() * 2.0)));
    }
    return p;
}
static uint8_t *rand_e8m0(int64_t n, int lo, int hi) {
    uint8_t *p = xmalloc((size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = (uint8_t)(127 + lo + (int)(rnd() % (uint64_t)(hi - lo + 1)));
    return p;
}

/* ---------------- comparison ---------------- */
static int32_t ord16(uint16_t h) { return (h & 0x8000) ? -(int32_t)(h & 0x7fff) : (int32_t)h; }
static int is_nan16(uint16_t h) { return (h & 0x7fff) > 0x7f80; }

typedef struct diffstat {
    int64_t n, differ, ulp1, ulp2, ulp_more, special_mismatch; /* special: NaN/inf placement differs */
    int max_ulp;
    double rel_fro; /* ‖gpu − ref‖ / ‖ref‖ over the finite outputs */
    double row_err; /* max |gpu − ref| / rms(ref row): the error on the row's own scale (cancellation-proof) */
} diffstat;

/* g, r bf16 [rows, cols] */
static diffstat compare(const uint16_t *g, const uint16_t *r, int64_t rows, int64_t cols) {
    diffstat s = {rows * cols, 0, 0, 0, 0, 0, 0, 0, 0};
    double d2 = 0, r2 = 0;
    for (int64_t i = 0; i < rows; i++) {
        double row2 = 0, row_max = 0;
        for (int64_t j = 0; j < cols; j++) {
            const uint16_t a = g[i * cols + j], b = r[i * cols + j];
            const double fa = di_bf16_to_f32(a), fb = di_bf16_to_f32(b);
            if (!isfinite(fa) || !isfinite(fb)) { /* NaN rows, overflowed rows: the same special or a failure */
                if (a != b && !(is_nan16(a) && is_nan16(b))) s.special_mismatch++, s.differ++;
                continue;
            }
            const double d = fabs(fa - fb);
            row2 += fb * fb, d2 += d * d, row_max = fmax(row_max, d);
            if (fa == fb) continue; /* equal bits, or +0 against -0 */
            s.differ++;
            const int u = abs(ord16(a) - ord16(b));
            if (u == 1) s.ulp1++;
            else if (u == 2) s.ulp2++;
            else s.ulp_more++;
            if (u > s.max_ulp) s.max_ulp = u;
        }
        r2 += row2;
        const double rms = sqrt(row2 / (double)cols);
        if (row_max > 0) s.row_err = fmax(s.row_err, rms > 0 ? row_max / rms : INFINITY);
    }
    s.rel_fro = r2 > 0 ? sqrt(d2 / r2) : (d2 > 0 ? INFINITY : 0);
    return s;
}

/* Tolerances (measured, bench/NOTES-gpu.md): the tensor core's block sums P_b differ from the exact
 * ones by < 2^-9 of the block's largest product binade, so an output moves by about one bf16 ulp when
 * it moves at all: ~2.6 % of FP8 outputs, ~1.4 % of FP4, ~6 % with full-range random weight codes; the
 * ulp distance is unbounded only where the exact result nearly cancels, which row_err (error over the
 * row's rms) and rel_fro measure without that artefact. NaN / inf placement must match exactly. */
typedef struct tol {
    double max_frac, max_rel_fro, max_row_err;
} tol;
static const tol TOL_REAL = {0.05, 2e-3, 0x1p-4};    /* quantized Gaussian operands */
static const tol TOL_UNIFORM = {0.10, 4e-3, 0x1p-3}; /* full-range random weight codes */
static const tol TOL_EXACT = {0, 0, 0};
/* +specials cases: the huge row (inputs ~1e37) dominates ‖y‖, so one 1-ulp output there alone weighs up
 * to 2^-8 in rel_fro (measured 3.1e-3 with 7 of 900 outputs 1 ulp apart, M = 3) */
static const tol TOL_SPECIAL = {0.05, 8e-3, 0x1p-4};

static void report(const char *what, diffstat s, tol t) {
    const double frac = s.n ? (double)s.differ / (double)s.n : 0;
    const int ok = !s.special_mismatch && frac <= t.max_frac && s.rel_fro <= t.max_rel_fro && s.row_err <= t.max_row_err;
    printf("%-40s %9lld out %8lld differ (%.4f) ulp 1:%lld 2:%lld >2:%lld (max %d) rel %.2e row %.2e special %lld  %s\n", what,
           (long long)s.n, (long long)s.differ, frac, (long long)s.ulp1, (long long)s.ulp2, (long long)s.ulp_more,
           s.max_ulp, s.rel_fro, s.row_err, (long long)s.special_mismatch, ok ? "PASS" : "FAIL");
    fflush(stdout);
    ok ? n_pass++ : n_fail++;
}

/* ---------------- 1. one K block ---------------- */
/* Candidate model of the tensor core's 32-term dot: terms in chunks of c; per chunk the running sum and
 * the chunk's products are aligned to the largest exponent among them and truncated toward zero to n
 * fraction bits below it, then added exactly; the result is rounded to f32 (rz: toward zero, else RN). */
static float model_dot(const double *prod, int c, int n, int rz) {
    double acc = 0;
    for (int k0 = 0; k0 < 32; k0 += c) {
        double mx = fabs(acc);
        for (int k = k0; k < k0 + c; k++) mx = fmax(mx, fabs(prod[k]));
        if (mx == 0) continue;
        int e;
        frexp(mx, &e); /* mx in [2^(e-1), 2^e) */
        double q = ldexp(1.0, e - 1 - n), s = trunc(acc / q) * q;
        for (int k = k0; k < k0 + c; k++) s += trunc(prod[k] / q) * q;
        acc = s;
    }
    if (!rz) return (float)acc;
    float f = (float)acc;
    if (fabs((double)f) > fabs(acc)) f = nextafterf(f, 0.0f);
    return f;
}

static void test_block_dot(void) {
    enum { A = 64 * 32, B = 128 * 32, D = 64 * 128, DRAWS = 16, MODEL_DRAWS = 4 };
    uint8_t *da, *db; /* e4m3 [64, 32], [128, 32] */
    float *dd;        /* f32 [64, 128] */
    CU(cudaMalloc((void **)&da, A));
    CU(cudaMalloc((void **)&db, B));
    CU(cudaMalloc((void **)&dd, sizeof(float) * D));
    static const int chunks[] = {32, 16, 8, 4};
    /* DI_DUMP_DIR: raw operands and results (per draw: a, b, d) for offline study of the rule */
    const char *dump_dir = getenv("DI_DUMP_DIR");
#define NMODEL (4 * 2 * 24)
    for (int dist = 0; dist < 2; dist++) {
        int64_t total = 0, differ = 0, model_ok[NMODEL] = {0};
        double max_rel = 0;
        for (int draw = 0; draw < DRAWS; draw++) {
            uint8_t a[A], b[B];
            if (dist == 0) {
                for (int i = 0; i < A; i++) a[i] = rand_code();
                for (int i = 0; i < B; i++) b[i] = rand_code();
            } else { /* act-quantized Gaussian rows × checkpoint-like weight codes */
                uint16_t *x = rand_bf16(A, 1.0);
                uint8_t s[64];
                di_act_quant_fp8(x, A, 32, a, s);
                free(x);
                for (int i = 0; i < B; i++) b[i] = di_f32_to_e4m3((float)(gauss() * 160.0));
            }
            CU(cudaMemcpy(da, a, A, cudaMemcpyHostToDevice));
            CU(cudaMemcpy(db, b, B, cudaMemcpyHostToDevice));
            RUN(di_cuda_wgmma_block_dot(da, db, dd, NULL, E));
            float *d = down(dd, sizeof(float) * D);
            if (dump_dir) {
                char path[512];
                snprintf(path, sizeof path, "%s/blockdot%d.bin", dump_dir, dist);
                FILE *f = fopen(path, draw ? "ab" : "wb");
                if (f) fwrite(a, 1, A, f), fwrite(b, 1, B, f), fwrite(d, sizeof(float), D, f), fclose(f);
            }
            for (int i = 0; i < 64; i++)
                for (int j = 0; j < 128; j++) {
                    double prod[32], exact = 0;
                    for (int k = 0; k < 32; k++) {
                        prod[k] = (double)di_e4m3_to_f32(a[i * 32 + k]) * (double)di_e4m3_to_f32(b[j * 32 + k]);
                        exact += prod[k]; /* exact in f64: see linear_q.c */
                    }
                    float got = d[i * 128 + j], cpu_p = (float)exact;
                    total++;
                    if (memcmp(&got, &cpu_p, 4)) {
                        differ++;
                        if (exact != 0) max_rel = fmax(max_rel, fabs((double)got - exact) / fabs(exact));
                    }
                    for (int ci = 0; ci < 4 && draw < MODEL_DRAWS; ci++)
                        for (int rz = 0; rz < 2; rz++)
                            for (int n = 0; n < 24; n++) {
                                float m = model_dot(prod, chunks[ci], 10 + n, rz);
                                model_ok[(ci * 2 + rz) * 24 + n] += !memcmp(&m, &got, 4);
                            }
                }
            free(d);
        }
        const char *name = dist ? "block dot, quantized Gaussian" : "block dot, full-range codes";
        printf("# %s: %lld dots, %lld differ from the exact sum rounded to f32 (%.4g), max rel err %.3g\n", name,
               (long long)total, (long long)differ, (double)differ / (double)total, max_rel);
        int best = 0;
        for (int i = 1; i < NMODEL; i++)
            if (model_ok[i] > model_ok[best]) best = i;
        const int64_t scanned = total / DRAWS * MODEL_DRAWS;
        printf("# %s: best model: chunks of %d, %d fraction bits, %s: reproduces %lld / %lld\n", name,
               chunks[best / 48], 10 + best % 24, (best / 24) % 2 ? "round toward zero" : "round to nearest",
               (long long)model_ok[best], (long long)scanned);
        for (int ci = 0; ci < 4; ci++) { /* the neighbourhood of the best, for the notes */
            printf("#   chunks %2d:", chunks[ci]);
            for (int n = 0; n < 24; n += 1) printf(" %lld", (long long)model_ok[(ci * 2 + (best / 24) % 2) * 24 + n]);
            printf("  (n = 10..33)\n");
        }
    }
    cudaFree(da), cudaFree(db), cudaFree(dd);
}

/* ---------------- 2. GEMMs at the real shapes ---------------- */
typedef struct shape {
    const char *name;
    int fp4;
    int64_t n, k;
} shape;
static const shape SHAPES[] = {
    {"wq_a", 0, 1280, 5120},        {"wq_b", 0, 32768, 1280},        {"wkv", 0, 512, 5120},
    {"wo_b", 0, 5120, 8192},        {"shared w1", 0, 2304, 5120},    {"shared w2", 0, 5120, 2304},
    {"indexer wq_b", 0, 4096, 1280}, {"expert w1/w3", 1, 2304, 5120}, {"expert w2", 1, 5120, 2304},
};
#define NSHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))

static int64_t wbytes_of(int fp4, int64_t n, int64_t k) { return fp4 ? n * k / 2 : n * k; }
static int64_t sbytes_of(int fp4, int64_t n, int64_t k) { return fp4 ? n * (k / 32) : ((n + 31) / 32) * (k / 32); }

/* The slot's two pieces against their references, bit for bit: the act-quant codes and scales against
 * the CPU quantizer (io/formats.c), and the GEMM (persistent kernel where the call is unsplit) against
 * the first wgmma kernel (di_cuda_qgemm_wgmma_v1) on those codes. yg: the slot's output. */
static void same_as_v1(int fp4, const uint16_t *x, int64_t M, int64_t K, int64_t N, const uint8_t *dw, const uint8_t *ds,
                       const uint16_t *yg) {
    uint8_t *q = xmalloc((size_t)(M * K)), *sc = xmalloc((size_t)(M * K / 32));
    di_act_quant_fp8(x, M * K, 32, q, sc);
    uint16_t *dx = dup_dev(x, sizeof *x * (size_t)(M * K));
    uint8_t *dq = dev_poisoned((size_t)(M * K)), *dsc = dev_poisoned((size_t)(M * K / 32));
    RUN(di_cuda_act_quant_fp8(dx, M * K, 32, dq, dsc, NULL, E));
    uint8_t *gq = down(dq, (size_t)(M * K)), *gsc = down(dsc, (size_t)(M * K / 32));
    const int qok = !memcmp(q, gq, (size_t)(M * K)) && !memcmp(sc, gsc, (size_t)(M * K / 32));
    printf("  act-quant (vectorised) == CPU: %s\n", qok ? "PASS" : "FAIL");
    qok ? n_pass++ : n_fail++;
    size_t scr = di_cuda_qgemm_wgmma_scratch(M, N, K);
    void *dscr;
    CU(cudaMalloc(&dscr, scr ? scr : 1));
    uint16_t *dz = dev_poisoned(sizeof *dz * (size_t)(M * N));
    RUN(di_cuda_qgemm_wgmma_v1(dq, dsc, M, K, dw, ds, fp4, N, dz, dscr, scr, NULL, E));
    uint16_t *z = down(dz, sizeof *z * (size_t)(M * N));
    report("  slot == first wgmma kernel", compare(yg, z, M, N), TOL_EXACT);
    free(q), free(sc), free(gq), free(gsc), free(z);
    cudaFree(dx), cudaFree(dq), cudaFree(dsc), cudaFree(dscr), cudaFree(dz);
}

/* One case: new kernel vs the exact kernel (whole output) and vs the CPU (sampled rows). Returns the
 * GPU output (for the batch-invariance check) when keep. */
static uint16_t *gemm_case(const char *label, int fp4, int64_t M, int64_t K, int64_t N, int uniform, int specials, tol t,
                           uint16_t **x_out, uint8_t **w_out, uint8_t **s_out) {
    uint16_t *x = rand_bf16(M * K, 1.0);
    if (specials && M > 2) {
        x[K + 5] = 0x7fc0; /* row 1: a NaN group, the whole row is NaN */
        for (int64_t i = 0; i < 32 && i < K; i++) x[2 * K + i] = di_f32_to_bf16((float)(gauss() * 1e37)); /* huge */
    }
    int64_t wb = wbytes_of(fp4, N, K), sb = sbytes_of(fp4, N, K);
    uint8_t *w = fp4 ? rand_fp4(wb) : rand_wcodes(wb, uniform);
    uint8_t *s = rand_e8m0(sb, fp4 ? -8 : -12, fp4 ? -2 : -6);
    if (specials) s[0] = 0, s[sb - 1] = 254; /* E8M0 extremes: the literal promotion path */
    uint16_t *dx = dup_dev(x, sizeof *x * (size_t)(M * K));
    uint8_t *dw = dup_dev(w, (size_t)wb), *ds = dup_dev(s, (size_t)sb);
    uint16_t *dy = dev_poisoned(sizeof *dy * (size_t)(M * N)), *dr = dev_poisoned(sizeof *dr * (size_t)(M * N));
    RUN((fp4 ? di_cuda_linear_fp4_wgmma : di_cuda_linear_fp8_wgmma)(gpu, dx, M, K, dw, ds, N, dy, E));
    RUN((fp4 ? gpu->linear_fp4 : gpu->linear_fp8)(gpu, dx, M, K, dw, ds, N, dr, E));
    RUN(di_backend_cuda_sync(gpu, E));
    uint16_t *yg = down(dy, sizeof *yg * (size_t)(M * N)), *yr = down(dr, sizeof *yr * (size_t)(M * N));
    char what[128];
    snprintf(what, sizeof what, "%s M%lld K%lld N%lld%s%s", label, (long long)M, (long long)K, (long long)N,
             uniform ? " uniform" : "", specials ? " +specials" : "");
    report(what, compare(yg, yr, M, N), t);
    same_as_v1(fp4, x, M, K, N, dw, ds, yg);

    /* the exact kernel against the CPU on up to 6 rows (first, last, middle, random) */
    int64_t rows[6] = {0, M - 1, M / 2, (int64_t)(rnd() % (uint64_t)M), (int64_t)(rnd() % (uint64_t)M), M > 1 ? 1 : 0};
    int nr = M < 6 ? (int)M : 6;
    uint16_t *xs = xmalloc(sizeof *xs * (size_t)(nr * K)), *yc = xmalloc(sizeof *yc * (size_t)(nr * N)),
             *ys = xmalloc(sizeof *ys * (size_t)(nr * N));
    for (int i = 0; i < nr; i++) {
        int64_t r = M < 6 ? i : rows[i];
        memcpy(xs + i * K, x + r * K, sizeof *x * (size_t)K);
        memcpy(ys + i * N, yr + r * N, sizeof *ys * (size_t)N);
    }
    RUN((fp4 ? cpu->linear_fp4 : cpu->linear_fp8)(cpu, xs, nr, K, w, s, N, yc, E));
    snprintf(what, sizeof what, "  exact kernel == CPU, %d rows", nr);
    report(what, compare(ys, yc, nr, N), TOL_EXACT);
    if (specials && M > 2) { /* the NaN row is NaN everywhere */
        int64_t bad = 0;
        for (int64_t j = 0; j < N; j++) bad += !is_nan16(yg[N + j]);
        printf("  NaN row: %lld non-NaN outputs  %s\n", (long long)bad, bad ? "FAIL" : "PASS");
        bad ? n_fail++ : n_pass++;
    }
    free(xs), free(yc), free(ys), free(yr);
    cudaFree(dx), cudaFree(dw), cudaFree(ds), cudaFree(dy), cudaFree(dr);
    if (x_out) {
        *x_out = x, *w_out = w, *s_out = s;
        return yg;
    }
    free(x), free(w), free(s), free(yg);
    return NULL;
}

/* 3. rows of a small-M call equal the same rows of the large-M call */
static void batch_invariance(int fp4, int64_t M, int64_t K, int64_t N) {
    uint16_t *x;
    uint8_t *w, *s;
    uint16_t *ybig = gemm_case("batch-invariance base", fp4, M, K, N, 0, 0, TOL_REAL, &x, &w, &s);
    int64_t wb = wbytes_of(fp4, N, K), sb = sbytes_of(fp4, N, K);
    uint8_t *dw = dup_dev(w, (size_t)wb), *ds = dup_dev(s, (size_t)sb);
    static const int64_t ms[] = {1, 5};
    for (int i = 0; i < 2; i++) {
        int64_t r0 = M - ms[i] - 3; /* rows that sit in the big call's last tile, not its first */
        uint16_t *dx = dup_dev(x + r0 * K, sizeof *x * (size_t)(ms[i] * K)), *dy = dev_poisoned(sizeof *dy * (size_t)(ms[i] * N));
        RUN((fp4 ? di_cuda_linear_fp4_wgmma : di_cuda_linear_fp8_wgmma)(gpu, dx, ms[i], K, dw, ds, N, dy, E));
        uint16_t *y = down(dy, sizeof *y * (size_t)(ms[i] * N));
        char what[96];
        snprintf(what, sizeof what, "  batch invariance: M%lld rows == M%lld rows", (long long)ms[i], (long long)M);
        report(what, compare(y, ybig + r0 * N, ms[i], N), TOL_EXACT);
        free(y), cudaFree(dx), cudaFree(dy);
    }
    cudaFree(dw), cudaFree(ds);
    free(x), free(w), free(s), free(ybig);
}

/* ---------------- 4. benchmark ---------------- */
static cudaEvent_t ev0, ev1;
static void *g_scratch; /* split-K partials of the timed GEMM-only calls */
static size_t g_scratch_bytes;

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Median time (ms) of `reps` launches of one variant; weights rotate over `copies` buffers so decode
 * reads come from HBM, not L2. which: 0 wgmma GEMM on codes, 1 wgmma slot (quant + GEMM), 2 exact slot,
 * 3 the first wgmma kernel on codes, 4 act-quant alone. */
static float time_variant(int which, int fp4, int64_t M, int64_t K, int64_t N, const uint16_t *dx, const uint8_t *dxq,
                          const uint8_t *dxs, const uint8_t *dw, const uint8_t *ds, int copies, uint16_t *dy) {
    enum { REPS = 30 };
    float t[REPS];
    int64_t wb = wbytes_of(fp4, N, K), sb = sbytes_of(fp4, N, K);
    cudaStream_t st = (cudaStream_t)di_backend_cuda_stream(gpu);
    for (int r = -3; r < REPS; r++) {
        int c = (r + 3) % copies;
        const uint8_t *w = dw + (int64_t)c * ((wb + 255) & ~255ll), *s = ds + (int64_t)c * ((sb + 255) & ~255ll);
        CU(cudaEventRecord(ev0, st));
        if (which == 0) RUN(di_cuda_qgemm_wgmma(dxq, dxs, M, K, w, s, fp4, N, dy, g_scratch, g_scratch_bytes, st, E));
        else if (which == 1) RUN((fp4 ? di_cuda_linear_fp4_wgmma : di_cuda_linear_fp8_wgmma)(gpu, dx, M, K, w, s, N, dy, E));
        else if (which == 3) RUN(di_cuda_qgemm_wgmma_v1(dxq, dxs, M, K, w, s, fp4, N, dy, g_scratch, g_scratch_bytes, st, E));
        else if (which == 4) RUN(di_cuda_act_quant_fp8(dx, M * K, 32, (uint8_t *)dxq, (uint8_t *)dxs, st, E));
        else RUN((fp4 ? gpu->linear_fp4 : gpu->linear_fp8)(gpu, dx, M, K, w, s, N, dy, E));
        CU(cudaEventRecord(ev1, st));
        CU(cudaEventSynchronize(ev1));
        if (r >= 0) CU(cudaEventElapsedTime(&t[r], ev0, ev1));
    }
    qsort(t, REPS, sizeof t[0], cmp_float);
    return t[REPS / 2];
}

/* ---------------- 3b. grouped experts ---------------- */
/* Device buffers of random bytes (weights, codes, scales) drawn from a small host pool: a copy at a
 * pseudo-random offset per buffer, so 384 experts' weights need no 6.8 GB of host draws. */
static uint8_t *g_pool_codes, *g_pool_fp4, *g_pool_e8m0; /* device, POOL bytes each */
#define POOL (48ll << 20)
static void pool_init(void) {
    if (g_pool_codes) return;
    uint8_t *h = xmalloc((size_t)POOL);
    for (int64_t i = 0; i < POOL; i++) h[i] = rand_code();
    g_pool_codes = dup_dev(h, (size_t)POOL);
    for (int64_t i = 0; i < POOL; i++) h[i] = (uint8_t)rnd();
    g_pool_fp4 = dup_dev(h, (size_t)POOL);
    for (int64_t i = 0; i < POOL; i++) h[i] = (uint8_t)(127 - 10 + (int)(rnd() % 7));
    g_pool_e8m0 = dup_dev(h, (size_t)POOL);
    free(h);
}
static void pool_fill(uint8_t *d, const uint8_t *pool, int64_t n) {
    for (int64_t done = 0; done < n;) {
        const int64_t off = (int64_t)(rnd() % (uint64_t)(POOL / 2)) & ~15ll, len = n - done < POOL / 2 ? n - done : POOL / 2;
        CU(cudaMemcpy(d + done, pool + off, (size_t)len, cudaMemcpyDeviceToDevice));
        done += len;
    }
}

typedef struct expert_set {
    int n_exp;
    int64_t n, k;
    uint8_t **w, **s;   /* host arrays of device pointers: packed E2M1 [n, k/2], E8M0 [n, k/32] */
    di_wgmma_experts *t;
} expert_set;

static expert_set experts_make(int n_exp, int64_t n, int64_t k) {
    expert_set x = {n_exp, n, k, xmalloc(sizeof(uint8_t *) * (size_t)n_exp), xmalloc(sizeof(uint8_t *) * (size_t)n_exp), NULL};
    for (int e = 0; e < n_exp; e++) {
        CU(cudaMalloc((void **)&x.w[e], (size_t)(n * k / 2)));
        CU(cudaMalloc((void **)&x.s[e], (size_t)(n * k / 32)));
        pool_fill(x.w[e], g_pool_fp4, n * k / 2);
        pool_fill(x.s[e], g_pool_e8m0, n * k / 32);
    }
    RUN(di_cuda_wgmma_experts_create(n_exp, (const uint8_t *const *)x.w, (const uint8_t *const *)x.s, n, k, &x.t, E_ERR));
    return x;
}
static void experts_free(expert_set *x) {
    for (int e = 0; e < x->n_exp; e++) cudaFree(x->w[e]), cudaFree(x->s[e]);
    free(x->w), free(x->s);
    di_cuda_wgmma_experts_destroy(x->t);
}

/* One grouped GEMM: n_w tables (1, or 2 = w1 and w3 in one launch) over the rows of n_exp experts, `extra`
 * rows after the last expert's that must stay untouched; checked bit for bit against the per-expert
 * GEMM (v1: the first kernel; else di_cuda_qgemm_wgmma, itself checked against it), optionally timed. */
static void grouped_case(const char *label, int n_exp, const int64_t *cnt, int extra, int n_w, int64_t N, int64_t K, int v1,
                         int timed) {
    pool_init();
    int64_t *start = xmalloc(sizeof *start * (size_t)(n_exp + 1));
    start[0] = 0;
    for (int e = 0; e < n_exp; e++) start[e + 1] = start[e] + cnt[e];
    const int64_t rows = start[n_exp] + extra;
    uint8_t *dq, *dsc;
    int64_t *dstart = dup_dev(start, sizeof *start * (size_t)(n_exp + 1));
    CU(cudaMalloc((void **)&dq, (size_t)(rows * K)));
    CU(cudaMalloc((void **)&dsc, (size_t)(rows * K / 32)));
    pool_fill(dq, g_pool_codes, rows * K);
    pool_fill(dsc, g_pool_e8m0, rows * K / 32);
    expert_set ws[2];
    uint16_t *dy[2], *dr[2];
    for (int j = 0; j < n_w; j++) {
        ws[j] = experts_make(n_exp, N, K);
        dy[j] = dev_poisoned(sizeof(uint16_t) * (size_t)(rows * N));
        dr[j] = dev_poisoned(sizeof(uint16_t) * (size_t)(rows * N));
    }
    const di_wgmma_experts *tabs[2] = {ws[0].t, n_w > 1 ? ws[1].t : NULL};
    cudaStream_t st = (cudaStream_t)di_backend_cuda_stream(gpu);
    RUN(di_cuda_wgmma_fp4_grouped(tabs, dy, n_w, dq, dsc, rows, dstart, st, E_ERR));
    for (int j = 0; j < n_w; j++)
        for (int e = 0; e < n_exp; e++)
            if (cnt[e])
                RUN((v1 ? di_cuda_qgemm_wgmma_v1 : di_cuda_qgemm_wgmma)(dq + start[e] * K, dsc + start[e] * (K / 32), cnt[e], K,
                                                                       ws[j].w[e], ws[j].s[e], 1, N, dr[j] + start[e] * N,
                                                                       NULL, 0, st, E_ERR));
    CU(cudaStreamSynchronize(st));
    int64_t bad = 0, untouched_bad = 0;
    for (int j = 0; j < n_w; j++) {
        uint16_t *y = down(dy[j], sizeof *y * (size_t)(rows * N)), *r = down(dr[j], sizeof *r * (size_t)(rows * N));
        for (int64_t i = 0; i < start[n_exp] * N; i++) bad += y[i] != r[i];
        for (int64_t i = start[n_exp] * N; i < rows * N; i++) untouched_bad += y[i] != 0xA5A5;
        free(y), free(r);
    }
    char what[160];
    snprintf(what, sizeof what, "grouped %s: %d experts, %lld rows, %d table(s) [%lld, %lld] == per-expert %s", label, n_exp,
             (long long)start[n_exp], n_w, (long long)N, (long long)K, v1 ? "first kernel" : "calls");
    printf("%-40s %lld outputs differ (bitwise), %lld trailing outputs written  %s\n", what, (long long)bad,
           (long long)untouched_bad, bad || untouched_bad ? "FAIL" : "PASS");
    bad || untouched_bad ? n_fail++ : n_pass++;
    if (timed) {
        enum { REPS = 15 };
        float tg[REPS], tl[REPS];
        for (int r = -2; r < REPS; r++) {
            CU(cudaEventRecord(ev0, st));
            RUN(di_cuda_wgmma_fp4_grouped(tabs, dy, n_w, dq, dsc, rows, dstart, st, E_ERR));
            CU(cudaEventRecord(ev1, st));
            CU(cudaEventSynchronize(ev1));
            if (r >= 0) CU(cudaEventElapsedTime(&tg[r], ev0, ev1));
            CU(cudaEventRecord(ev0, st));
            for (int j = 0; j < n_w; j++)
                for (int e = 0; e < n_exp; e++)
                    if (cnt[e])
                        RUN(di_cuda_qgemm_wgmma(dq + start[e] * K, dsc + start[e] * (K / 32), cnt[e], K, ws[j].w[e], ws[j].s[e], 1,
                                                N, dr[j] + start[e] * N, NULL, 0, st, E_ERR));
            CU(cudaEventRecord(ev1, st));
            CU(cudaEventSynchronize(ev1));
            if (r >= 0) CU(cudaEventElapsedTime(&tl[r], ev0, ev1));
        }
        qsort(tg, REPS, sizeof tg[0], cmp_float);
        qsort(tl, REPS, sizeof tl[0], cmp_float);
        int64_t mx = 0, active = 0;
        for (int e = 0; e < n_exp; e++) mx = cnt[e] > mx ? cnt[e] : mx, active += cnt[e] > 0;
        const double flop = 2.0 * (double)start[n_exp] * (double)N * (double)K * n_w;
        printf("BENCH grouped %-9s %d experts (%lld active, max %lld rows) %lld rows x %d x [%lld, %lld]: grouped %8.4f ms"
               " %7.1f TFLOP/s (%4.1f%% of 1445) | per-expert calls %8.4f ms %7.1f TFLOP/s\n",
               label, n_exp, (long long)active, (long long)mx, (long long)start[n_exp], n_w, (long long)N, (long long)K, tg[REPS / 2],
               flop / tg[REPS / 2] * 1e-9, flop / tg[REPS / 2] * 1e-9 / 1445 * 100, tl[REPS / 2], flop / tl[REPS / 2] * 1e-9);
    }
    for (int j = 0; j < n_w; j++) experts_free(&ws[j]), cudaFree(dy[j]), cudaFree(dr[j]);
    cudaFree(dq), cudaFree(dsc), cudaFree(dstart);
    free(start);
}

/* 8192 tokens × top-6 over 384 experts: balanced (128 rows each) and skewed (Zipf-like, ≤ 8192 rows an
 * expert, a quarter of the experts idle); w1 + w3 in one launch, then w2. */
static void grouped_bench(void) {
    enum { EX = 384 };
    int64_t cnt[EX];
    for (int skew = 0; skew < 2; skew++) {
        int64_t total = 0;
        if (!skew) {
            for (int e = 0; e < EX; e++) cnt[e] = 128;
        } else {
            double h = 0;
            for (int e = 0; e < 288; e++) h += 1.0 / (e + 1);
            for (int e = 0; e < EX; e++) cnt[e] = e < 288 ? (int64_t)(49152.0 / h / (e + 1)) : 0;
        }
        for (int e = 0; e < EX; e++) total += cnt[e];
        if (skew) cnt[1] += 49152 - total; /* exactly 8192 · 6 rows */
        const char *label = skew ? "skewed" : "balanced";
        grouped_case(label, EX, cnt, 0, 2, 2304, 5120, 0, 1);
        grouped_case(label, EX, cnt, 0, 1, 5120, 2304, 0, 1);
    }
}

/* One shape at several M: weights drawn once, uploaded in `copies` (>= 256 MB in all, so decode reads
 * come from HBM, not the 50 MB L2). */
static void bench_shape(const shape *sh, const int64_t *ms, int n_m) {
    const int64_t K = sh->k, N = sh->n, wb = wbytes_of(sh->fp4, N, K), sb = sbytes_of(sh->fp4, N, K);
    const int64_t wstride = (wb + 255) & ~255ll, sstride = (sb + 255) & ~255ll;
    int copies = (int)((256ll << 20) / (wstride + sstride));
    if (copies < 1) copies = 1;
    if (copies > 64) copies = 64;
    static uint16_t *x; /* bf16 [max M, 8192], drawn once: the largest M·K of the bench */
    int64_t max_m = 0;
    for (int i = 0; i < n_m; i++) max_m = ms[i] > max_m ? ms[i] : max_m;
    if (!x) x = rand_bf16(max_m * 8192, 1.0);
    uint8_t *w = sh->fp4 ? rand_fp4(wb) : rand_wcodes(wb, 0), *s = rand_e8m0(sb, -10, -4);
    uint8_t *dw, *ds;
    CU(cudaMalloc((void **)&dw, (size_t)(wstride * copies)));
    CU(cudaMalloc((void **)&ds, (size_t)(sstride * copies)));
    for (int c = 0; c < copies; c++) {
        CU(cudaMemcpy(dw + c * wstride, w, (size_t)wb, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(ds + c * sstride, s, (size_t)sb, cudaMemcpyHostToDevice));
    }
    for (int i = 0; i < n_m; i++) {
        const int64_t M = ms[i];
        const int cp = M > 256 ? 1 : copies; /* prefill re-reads weights per tile anyway */
        uint16_t *dx = dup_dev(x, sizeof *x * (size_t)(M * K)), *dy = dev_poisoned(sizeof *dy * (size_t)(M * N));
        uint8_t *dxq = dev_poisoned((size_t)(M * K)), *dxs = dev_poisoned((size_t)(M * K / 32));
        RUN(di_cuda_act_quant_fp8(dx, M * K, 32, dxq, dxs, NULL, E));
        g_scratch_bytes = di_cuda_qgemm_wgmma_scratch(M, N, K);
        CU(cudaMalloc(&g_scratch, g_scratch_bytes ? g_scratch_bytes : 1));
        CU(cudaDeviceSynchronize());
        float t_gemm = time_variant(0, sh->fp4, M, K, N, dx, dxq, dxs, dw, ds, cp, dy);
        float t_slot = time_variant(1, sh->fp4, M, K, N, dx, dxq, dxs, dw, ds, cp, dy);
        float t_old = M <= 64 ? time_variant(2, sh->fp4, M, K, N, dx, dxq, dxs, dw, ds, cp, dy) : -1;
        float t_v1 = time_variant(3, sh->fp4, M, K, N, dx, dxq, dxs, dw, ds, cp, dy);
        float t_q = time_variant(4, sh->fp4, M, K, N, dx, dxq, dxs, dw, ds, cp, dy);
        double flop = 2.0 * (double)M * (double)N * (double)K;
        double bytes = (double)(wb + sb) + (double)M * (double)K * 2 + (double)M * (double)N * 2;
        printf("BENCH %-3s %-13s M%-5lld N%-6lld K%-5lld gemm %8.4f ms %7.1f TFLOP/s (%4.1f%% of 1445) %6.0f GB/s (%4.1f%% of 4470)"
               " | slot %8.4f ms | exact kernel %8.4f ms | first wgmma kernel %8.4f ms %7.1f TFLOP/s | act-quant %8.4f ms\n",
               sh->fp4 ? "fp4" : "fp8", sh->name, (long long)M, (long long)N, (long long)K, t_gemm, flop / t_gemm * 1e-9,
               flop / t_gemm * 1e-9 / 1445 * 100, bytes / t_gemm * 1e-6, bytes / t_gemm * 1e-6 / 4470 * 100, t_slot, t_old,
               t_v1, flop / t_v1 * 1e-9, t_q);
        fflush(stdout);
        cudaFree(dx), cudaFree(dy), cudaFree(dxq), cudaFree(dxs), cudaFree(g_scratch);
    }
    free(w), free(s);
    cudaFree(dw), cudaFree(ds);
}

static void bench(void) {
    printf("# benchmark: median of 30 (CUDA events); gemm = wgmma GEMM on quantized codes, slot = act-quant + GEMM,\n"
           "# exact kernel = cuda_gemm.cu's slot; bytes = weights + scales + x bf16 + y bf16\n");
    static const int64_t dense[] = {8192, 1, 8, 64}, expert[] = {8192, 128, 1, 8, 64}, decode[] = {1, 8, 64};
    const int decode_only = getenv("DI_BENCH_DECODE") != NULL; /* M = 1, 8, 64 only */
    const int prefill_only = getenv("DI_BENCH_PREFILL") != NULL; /* M = 8192 (and 128 for experts) */
    static const int64_t pre_dense[] = {8192}, pre_expert[] = {8192, 128};
    if (getenv("DI_BENCH_ONE")) { /* one shape, M = 8192 (a profiler's run) */
        bench_shape(&SHAPES[0], pre_dense, 1);
        return;
    }
    for (int i = 0; i < NSHAPES; i++) {
        if (decode_only) bench_shape(&SHAPES[i], decode, 3);
        else if (prefill_only) bench_shape(&SHAPES[i], SHAPES[i].fp4 ? pre_expert : pre_dense, SHAPES[i].fp4 ? 2 : 1);
        else if (SHAPES[i].fp4) bench_shape(&SHAPES[i], expert, 5); /* 128: one expert's share of 8192 tokens · 6 / 384 */
        else bench_shape(&SHAPES[i], dense, 4);
    }
}

/* Decode timing without the host's per-call cost: `copies` calls on distinct weight copies (>= 256 MB
 * in all, so each reads HBM) captured in one CUDA graph; time per call = replay time / copies. Weights are
 * random non-NaN e4m3 codes / FP4 bytes (their values do not change the work). */
static void graph_decode(void) {
    static const int idx[] = {0, 4, 8};
    static const int64_t ms[] = {1, 8};
    cudaStream_t st = (cudaStream_t)di_backend_cuda_stream(gpu);
    printf("# graph-timed decode: median of 5 replays of a graph of `copies` calls, per call\n");
    for (int si = 0; si < 3; si++) {
        const shape *sh = &SHAPES[idx[si]];
        const int64_t K = sh->k, N = sh->n, wb = wbytes_of(sh->fp4, N, K), sb = sbytes_of(sh->fp4, N, K);
        const int64_t wstride = (wb + 255) & ~255ll, sstride = (sb + 255) & ~255ll;
        int copies = (int)((256ll << 20) / (wstride + sstride));
        if (copies > 64) copies = 64;
        uint8_t *w = xmalloc((size_t)wb), *s = rand_e8m0(sb, -10, -4), *dw, *ds;
        for (int64_t i = 0; i < wb; i++) w[i] = sh->fp4 ? (uint8_t)rnd() : rand_code();
        CU(cudaMalloc((void **)&dw, (size_t)(wstride * copies)));
        CU(cudaMalloc((void **)&ds, (size_t)(sstride * copies)));
        for (int c = 0; c < copies; c++) {
            CU(cudaMemcpy(dw + c * wstride, w, (size_t)wb, cudaMemcpyHostToDevice));
            CU(cudaMemcpy(ds + c * sstride, s, (size_t)sb, cudaMemcpyHostToDevice));
        }
        for (int mi = 0; mi < 2; mi++) {
            const int64_t M = ms[mi];
            uint16_t *x = rand_bf16(M * K, 1.0), *dx = dup_dev(x, sizeof *x * (size_t)(M * K));
            uint16_t *dy = dev_poisoned(sizeof *dy * (size_t)(M * N));
            for (int slot = 0; slot < 2; slot++) { /* 0: GEMM on codes, 1: the slot (act-quant + GEMM) */
                uint8_t *dxq = dev_poisoned((size_t)(M * K)), *dxs = dev_poisoned((size_t)(M * K / 32));
                size_t scr = di_cuda_qgemm_wgmma_scratch(M, N, K);
                void *dscr;
                CU(cudaMalloc(&dscr, scr ? scr : 1));
                RUN(di_cuda_act_quant_fp8(dx, M * K, 32, dxq, dxs, st, E));
#define ONE_CALL(c)                                                                                                    \
    (slot ? (sh->fp4 ? di_cuda_linear_fp4_wgmma : di_cuda_linear_fp8_wgmma)(gpu, dx, M, K, dw + (c) * wstride,         \
                                                                             ds + (c) * sstride, N, dy, E)             \
          : di_cuda_qgemm_wgmma(dxq, dxs, M, K, dw + (c) * wstride, ds + (c) * sstride, sh->fp4, N, dy, dscr, scr, st, E))
                RUN(ONE_CALL(0)); /* eager first: workspace growth and attributes stay out of the capture */
                RUN(di_backend_cuda_sync(gpu, E));
                cudaGraph_t graph;
                cudaGraphExec_t exec;
                CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
                for (int c = 0; c < copies; c++) RUN(ONE_CALL(c));
                CU(cudaStreamEndCapture(st, &graph));
                CU(cudaGraphInstantiate(&exec, graph, 0));
                CU(cudaGraphLaunch(exec, st));
                float t[5];
                for (int r = 0; r < 5; r++) {
                    CU(cudaEventRecord(ev0, st));
                    CU(cudaGraphLaunch(exec, st));
                    CU(cudaEventRecord(ev1, st));
                    CU(cudaEventSynchronize(ev1));
                    CU(cudaEventElapsedTime(&t[r], ev0, ev1));
                }
                qsort(t, 5, sizeof t[0], cmp_float);
                const double ms_call = t[2] / copies, bytes = (double)(wb + sb) + (double)M * K * 2 + (double)M * N * 2;
                printf("GRAPH %-3s %-13s M%-3lld N%-6lld K%-5lld %-4s %8.4f ms/call %6.0f GB/s (%4.1f%% of 4470)  [%d calls]\n",
                       sh->fp4 ? "fp4" : "fp8", sh->name, (long long)M, (long long)N, (long long)K, slot ? "slot" : "gemm",
                       ms_call, bytes / ms_call * 1e-6, bytes / ms_call * 1e-6 / 4470 * 100, copies);
#undef ONE_CALL
                CU(cudaGraphExecDestroy(exec));
                CU(cudaGraphDestroy(graph));
                cudaFree(dxq), cudaFree(dxs), cudaFree(dscr);
            }
            free(x), cudaFree(dx), cudaFree(dy);
        }
        free(w), free(s), cudaFree(dw), cudaFree(ds);
    }
}

int main(int argc, char **argv) {
    int nth = (int)sysconf(_SC_NPROCESSORS_ONLN);
    const char *seed = getenv("DI_SEED");
    if (seed) rng ^= strtoull(seed, NULL, 0) * 0xD1B54A32D192ED03ull;
    if (di_cuda_device_count() < 1) {
        printf("no CUDA device: nothing to test\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(di_backend_cpu_create(nth > 0 ? nth : 1, &cpu, E));
    RUN(di_backend_cuda_create(0, &gpu, E));
    CU(cudaEventCreate(&ev0));
    CU(cudaEventCreate(&ev1));
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("# device: %s, %d SMs; CPU reference: %d threads; seed %s\n", prop.name, prop.multiProcessorCount, nth,
           seed ? seed : "default");
    setvbuf(stdout, NULL, _IOLBF, 0); /* partial logs survive a timeout */
    const char *mode = argc > 1 ? argv[1] : "";
    int only_bench = !strcmp(mode, "--bench-only");
    if (!strcmp(mode, "--graph-decode")) {
        graph_decode();
    } else if (!strcmp(mode, "--block-only")) {
        test_block_dot();
    } else if (!only_bench) {
        if (strcmp(mode, "--bench-noblock")) test_block_dot();
        /* edges: K = 32 and 96 (partial stages), N and M tails, NaN / huge rows, E8M0 extremes */
        gemm_case("edge fp8", 0, 33, 32, 100, 0, 1, TOL_SPECIAL, NULL, NULL, NULL);
        gemm_case("edge fp8", 0, 5, 96, 37, 0, 1, TOL_SPECIAL, NULL, NULL, NULL);
        gemm_case("edge fp8", 0, 130, 160, 257, 0, 1, TOL_SPECIAL, NULL, NULL, NULL);
        gemm_case("edge fp4", 1, 3, 64, 7, 0, 1, TOL_SPECIAL, NULL, NULL, NULL);
        gemm_case("edge fp4", 1, 200, 224, 130, 0, 1, TOL_SPECIAL, NULL, NULL, NULL);
        /* decode-sized: K split over CTAs (ordered partial sums), last stage partial, N tail */
        gemm_case("edge fp8 split-K", 0, 3, 1056, 300, 0, 1, TOL_SPECIAL, NULL, NULL, NULL);
        gemm_case("edge fp4 split-K", 1, 2, 1056, 130, 0, 0, TOL_REAL, NULL, NULL, NULL);
        gemm_case("wq_a decode", 0, 16, 5120, 1280, 0, 0, TOL_REAL, NULL, NULL, NULL);
        for (int i = 0; i < NSHAPES; i++) {
            const shape *sh = &SHAPES[i];
            gemm_case(sh->name, sh->fp4, 1, sh->k, sh->n, 0, 0, TOL_REAL, NULL, NULL, NULL);
            gemm_case(sh->name, sh->fp4, 64, sh->k, sh->n, 0, 0, TOL_REAL, NULL, NULL, NULL);
            gemm_case(sh->name, sh->fp4, sh->n >= 8192 ? 512 : 1024, sh->k, sh->n, 0, 0, TOL_REAL, NULL, NULL, NULL);
        }
        gemm_case("wq_a", 0, 256, 5120, 1280, 1, 0, TOL_UNIFORM, NULL, NULL, NULL);
        gemm_case("shared w2", 0, 256, 2304, 5120, 1, 0, TOL_UNIFORM, NULL, NULL, NULL);
        gemm_case("wq_a prefill", 0, 8192, 5120, 1280, 0, 0, TOL_REAL, NULL, NULL, NULL);
        batch_invariance(0, 4096, 5120, 2304);
        batch_invariance(1, 1000, 2304, 5120);
        { /* grouped experts: empty experts, 1-row and multi-tile experts, rows after the last expert */
            static const int64_t c6[] = {0, 1, 130, 300, 5, 128}, c3[] = {7, 0, 33}, c0[] = {0, 0};
            grouped_case("mixed", 6, c6, 3, 2, 2304, 5120, 1, 0);
            grouped_case("mixed", 6, c6, 3, 1, 5120, 2304, 1, 0);
            grouped_case("edge K96 N130", 3, c3, 2, 2, 130, 96, 1, 0);
            grouped_case("all empty", 2, c0, 5, 1, 256, 64, 1, 0);
        }
        printf("%d passed, %d failed\n", n_pass, n_fail);
    }
    if (only_bench || !strcmp(mode, "--bench") || !strcmp(mode, "--bench-noblock")) bench();
    if ((only_bench || !strcmp(mode, "--bench") || !strcmp(mode, "--bench-noblock")) && !getenv("DI_BENCH_ONE")) grouped_bench();
    if (n_fail) printf("%d passed, %d failed (after the bench)\n", n_pass, n_fail);
    di_backend_destroy(cpu);
    di_backend_cuda_destroy(gpu);
    return n_fail ? 1 : 0;
}
