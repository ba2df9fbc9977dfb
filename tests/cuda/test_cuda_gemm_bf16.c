/* GPU test and timing of the exact bf16 / f32 GEMMs of src/backend/cuda/cuda_gemm_bf16.cu against the
 * CPU ops (linear_bf16.c), bit for bit: linear_bf16 and linear_f32 (x bf16 [M, K], w bf16 [N, K]) and
 * linear_grouped_bf16 (x [M, G, K], w [G, R, K]).
 *
 * Every case runs each kernel the backend can pick — the registered slot (the M split of
 * DI_BGEMV_MAX_M, FMA fast path unless DI_CUDA_BF16=nofma / old), and forced: the GEMV at any M ≤ 1024,
 * the tiled kernel with the FMA fast path, the tiled kernel multiply-then-add — and compares each
 * against the CPU op on every row (all rows up to M 256; beyond, the first and last 64 rows and 64
 * rows in between, which keeps the CPU's time low at M 8192; rows are independent in both ops).
 * Inputs: Gaussian x (sd 1) and w (sd 0.02), plus, when "specials" is set, one x row and one w row with
 * -0, bf16 subnormals, 1e±30, ±1e37, 5e-20, 1e19, ±inf, NaN (blocks holding them must take the
 * multiply-add path) and an FMA probe row pair whose output differs between FMA and multiply-then-add
 * (tests/test_cuda_bf16_emu.c explains it).
 * Shapes: the V4.1 ones of bench/gpu-runs (wo_a 8 × K 4096 × R 1024, router K 5120 N 384, compressor
 * and indexer K 5120 N 512, indexer weights_proj N 32, an LM-head slice N 16384) at M 1, 8, 8192, and
 * edges (K % 16 ≠ 0, K % 8 ≠ 0 — the scalar-load path —, N off the tile, M 1, 3, 17, 65).
 * Timing (best of 5, CUDA events, L2 flushed before each decode-sized run): the slot and, for
 * comparison, cuda_gemm.cu's first kernels; TFLOP/s = 2·M·N·K·G / t, GB/s = (w + x + y bytes) / t.
 * Output: one row per (case, kernel); last line "N passed, N failed"; exit 1 on any failure.
 * Usage: [DI_SEED=n] [DI_QUICK=1] test_cuda_gemm_bf16   (DI_QUICK: small shapes only;
 * DI_PROFILE=M: the grouped wo_a case at M rows only, for Nsight Compute) */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_gemm_bf16.h"
#include "backend/cuda/cuda_ops.h"
#include "io/formats.h"
#include "cuda_testutil.h"

static di_backend *cpu, *gpu;
static cudaEvent_t ev0, ev1;
static int n_pass, n_fail;
static di_error g_err;
#define E (&g_err)


/* downloads wait for the backend's stream first (its ops do not order with cudaMemcpy) */
static void *down(const void *d, size_t n) {
    void *h = xmalloc(n);
    RUN(di_backend_cuda_sync(gpu, E));
    CU(cudaMemcpy(h, d, n ? n : 1, cudaMemcpyDeviceToHost));
    return h;
}

/* ---------------- inputs ---------------- */
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) { return ct_xorshift(&rng); }
static double gauss(void) { return ct_gauss(&rng); }
/* N(0, 1) table: the M 8192 wo_a input has 268 M elements, too many for a log and a cos each */
static float g_table[1 << 16];
static uint16_t *rand_rows(int64_t rows, int64_t k, double sd) {
    uint16_t *p = xmalloc(sizeof *p * (size_t)(rows * k));
    for (int64_t i = 0; i < rows * k; i += 4) {
        uint64_t r = rnd();
        for (int j = 0; j < 4 && i + j < rows * k; j++) p[i + j] = di_f32_to_bf16((float)(g_table[(r >> (16 * j)) & 0xffff] * sd));
    }
    return p;
}
/* row r: the special values; row r + 1: the FMA probe (x: 2^-75 at k 0 and 16; w: 2^-74, 2^-75) */
static void put_specials(uint16_t *p, int64_t rows, int64_t k, int64_t r, int is_w) {
    if (r + 1 >= rows || k < 24) return;
    uint16_t *s = p + r * k;
    s[0] = 0x8000, s[1] = 0x0001, s[2] = 0x807f, s[3] = 0x0040;
    s[4] = di_f32_to_bf16(1e-30f), s[5] = di_f32_to_bf16(-3e-30f), s[6] = di_f32_to_bf16(1e37f);
    s[7] = di_f32_to_bf16(-2e37f), s[8] = di_f32_to_bf16(5e-20f), s[9] = di_f32_to_bf16(1e19f);
    if (k >= 64) s[40] = 0x7f80, s[41] = 0xff80;
    if (k >= 200) s[150] = 0x7fc1;
    s += k;
    memset(s, 0, sizeof *s * (size_t)k);
    s[0] = di_f32_to_bf16(is_w ? 0x1p-74f : 0x1p-75f), s[16] = di_f32_to_bf16(0x1p-75f);
}

/* ---------------- comparison ---------------- */
/* sampled rows of an [M, ...] output: all up to 256, else first 64, last 64, 64 in between */
static int64_t sample_rows(int64_t M, int64_t *rows) {
    if (M <= 256) {
        for (int64_t i = 0; i < M; i++) rows[i] = i;
        return M;
    }
    int64_t n = 0;
    for (int64_t i = 0; i < 64; i++) rows[n++] = i;
    for (int64_t i = 0; i < 64; i++) rows[n++] = 64 + i * (M - 128) / 64;
    for (int64_t i = 0; i < 64; i++) rows[n++] = M - 64 + i;
    return n;
}

/* outputs whose bits differ (NaN equals NaN); esz 2 (bf16) or 4 (f32); g is the full GPU output,
 * c the CPU output of the sampled rows only */
static int64_t mismatches(const void *g, const void *c, const int64_t *rows, int64_t nrows, int64_t cols, int esz,
                          double *max_abs) {
    int64_t d = 0;
    *max_abs = 0;
    for (int64_t i = 0; i < nrows; i++)
        for (int64_t j = 0; j < cols; j++) {
            const char *a = (const char *)g + (rows[i] * cols + j) * esz, *b = (const char *)c + (i * cols + j) * esz;
            if (!memcmp(a, b, (size_t)esz)) continue;
            float fa, fb;
            if (esz == 2) {
                uint16_t ha, hb;
                memcpy(&ha, a, 2), memcpy(&hb, b, 2);
                fa = di_bf16_to_f32(ha), fb = di_bf16_to_f32(hb);
            } else {
                memcpy(&fa, a, 4), memcpy(&fb, b, 4);
            }
            if (isnan(fa) && isnan(fb)) continue;
            d++;
            double e = fabs((double)fa - (double)fb);
            if (!(e <= *max_abs)) *max_abs = e;
        }
    return d;
}

/* ---------------- timing ---------------- */
static void *g_flush; /* 256 MiB written before each timed decode run: weights come from HBM, not L2 */
#define FLUSH_BYTES ((size_t)256 << 20)

typedef enum kind { K_BF16, K_F32, K_GROUPED } kind;
static const char *kind_name[] = {"linear_bf16", "linear_f32", "linear_grouped_bf16"};

typedef struct gcase {
    kind op;
    int64_t M, K, N; /* N = R for the grouped op */
    int G;
    const uint16_t *dx, *dw;
    void *dy;
} gcase;

/* variants: 0 the slot, 1 GEMV, 2 tiled FMA, 3 tiled multiply-add, 4 cuda_gemm.cu's first kernel */
static const char *variant_name[] = {"slot", "gemv", "tiled", "tiled-nofma", "old"};
static const di_bgemm_path variant_path[] = {DI_BGEMM_AUTO, DI_BGEMM_GEMV, DI_BGEMM_TILED, DI_BGEMM_TILED_NOFMA};

static int launch(const gcase *c, int v) {
    const int64_t M = c->M, K = c->K, N = c->N;
    const int G = c->G;
    if (v == 0) {
        if (c->op == K_BF16) return gpu->linear_bf16(gpu, c->dx, M, K, c->dw, N, c->dy, E);
        if (c->op == K_F32) return gpu->linear_f32(gpu, c->dx, M, K, c->dw, N, c->dy, E);
        return gpu->linear_grouped_bf16(gpu, c->dx, M, G, K, c->dw, N, c->dy, E);
    }
    if (v == 4) {
        if (c->op == K_BF16) return di_cuda_linear_bf16(gpu, c->dx, M, K, c->dw, N, c->dy, E);
        if (c->op == K_F32) return di_cuda_linear_f32(gpu, c->dx, M, K, c->dw, N, c->dy, E);
        return di_cuda_linear_grouped_bf16(gpu, c->dx, M, G, K, c->dw, N, c->dy, E);
    }
    const char *op = kind_name[c->op];
    if (c->op == K_GROUPED)
        return di_cuda_bgemm(gpu, op, c->dx, (int64_t)G * K, c->dw, K, M, N, K, c->dy, NULL, (int64_t)G * N, G, K, N * K,
                             N, variant_path[v], E);
    return di_cuda_bgemm(gpu, op, c->dx, K, c->dw, K, M, N, K, c->op == K_BF16 ? c->dy : NULL,
                         c->op == K_F32 ? c->dy : NULL, N, 1, 0, 0, 0, variant_path[v], E);
}

/* best of 5 (ms) */
static float time_variant(const gcase *c, int v, int flush) {
    cudaStream_t st = (cudaStream_t)di_backend_cuda_stream(gpu);
    float best = 1e30f;
    for (int r = 0; r < 5; r++) {
        if (flush) CU(cudaMemsetAsync(g_flush, r, FLUSH_BYTES, st));
        CU(cudaEventRecord(ev0, st));
        RUN(launch(c, v));
        CU(cudaEventRecord(ev1, st));
        CU(cudaEventSynchronize(ev1));
        float t;
        CU(cudaEventElapsedTime(&t, ev0, ev1));
        if (t < best) best = t;
    }
    return best;
}

/* ---------------- one case ---------------- */
/* label: the V4.1 role; specials: x row 1 and w row 3 hold the special values, x row 2 and w row 4 the
 * FMA probe; timed: print the timing columns */
static void run_case(kind op, const char *label, int64_t M, int G, int64_t K, int64_t N, int specials, int timed) {
    const int esz = op == K_F32 ? 4 : 2;
    const int64_t xrow = (int64_t)G * K, yrow = (int64_t)G * N; /* elements per token row */
    uint16_t *x = rand_rows(M, xrow, 1.0), *w = rand_rows((int64_t)G * N, K, 0.02);
    if (specials) {
        put_specials(x, M, xrow, 1, 0);
        put_specials(w, (int64_t)G * N, K, 3, 1);
    }
    /* CPU on the sampled rows */
    int64_t *rows = xmalloc(sizeof *rows * 256), nrows = sample_rows(M, rows); /* at most 256 */
    uint16_t *xs = xmalloc(sizeof *xs * (size_t)(nrows * xrow));
    for (int64_t i = 0; i < nrows; i++) memcpy(xs + i * xrow, x + rows[i] * xrow, sizeof *x * (size_t)xrow);
    void *yc = xmalloc((size_t)(nrows * yrow * esz));
    if (op == K_BF16) RUN(cpu->linear_bf16(cpu, xs, nrows, K, w, N, yc, E));
    else if (op == K_F32) RUN(cpu->linear_f32(cpu, xs, nrows, K, w, N, yc, E));
    else RUN(cpu->linear_grouped_bf16(cpu, xs, nrows, G, K, w, N, yc, E));

    gcase c = {op, M, K, N, G, dup_dev(x, sizeof *x * (size_t)(M * xrow)), dup_dev(w, sizeof *w * (size_t)(G * N * K)),
               NULL};
    char shape[96];
    if (op == K_GROUPED)
        snprintf(shape, sizeof shape, "%s M%lld G%d K%lld R%lld%s", label, (long long)M, G, (long long)K, (long long)N,
                 specials ? " +sp" : "");
    else
        snprintf(shape, sizeof shape, "%s M%lld K%lld N%lld%s", label, (long long)M, (long long)K, (long long)N,
                 specials ? " +sp" : "");
    const double flop = 2.0 * (double)M * (double)N * (double)K * G;
    const double bytes = 2.0 * (double)G * N * K + 2.0 * (double)M * xrow + (double)esz * M * yrow;
    const int decode = M <= DI_BGEMV_MAX_M;
    float t_old = -1;
    if (timed) {
        c.dy = dev_poisoned((size_t)(M * yrow * esz));
        t_old = time_variant(&c, 4, decode);
        CU(cudaFree(c.dy));
    }
    for (int v = 0; v < 4; v++) {
        if (v == 1 && M > 1024) continue; /* the GEMV at prefill sizes only wastes device time */
        c.dy = dev_poisoned((size_t)(M * yrow * esz));
        RUN(launch(&c, v));
        void *yg = down(c.dy, (size_t)(M * yrow * esz));
        double max_abs;
        int64_t d = mismatches(yg, yc, rows, nrows, yrow, esz, &max_abs);
        char tm[96] = "";
        if (timed && (v == 0 || v == 3 || (v == 1 && M <= 1024))) {
            float t = time_variant(&c, v, decode);
            if (decode) snprintf(tm, sizeof tm, "%9.4f ms %7.0f GB/s  old %9.4f ms", t, bytes / t * 1e-6, t_old);
            else snprintf(tm, sizeof tm, "%9.4f ms %6.2f TFLOP/s  old %9.4f ms (%5.2f)", t, flop / t * 1e-9, t_old,
                          flop / t_old * 1e-9);
        }
        printf("%-20s %-40s %-11s %9lld/%-9lld %9.3g  %-52s %s\n", kind_name[op], shape, variant_name[v], (long long)d,
               (long long)(nrows * yrow), max_abs, tm, d ? "FAIL" : "PASS");
        fflush(stdout);
        d ? n_fail++ : n_pass++;
        free(yg);
        CU(cudaFree(c.dy));
    }
    CU(cudaFree((void *)c.dx));
    CU(cudaFree((void *)c.dw));
    free(x), free(w), free(xs), free(yc), free(rows);
}

int main(int argc, char **argv) {
    (void)argc, (void)argv; /* gpu_tests.sh passes the kernel vectors' path: unused here */
    int nth = (int)sysconf(_SC_NPROCESSORS_ONLN);
    const char *seed = getenv("DI_SEED");
    if (seed) rng ^= strtoull(seed, NULL, 0) * 0xD1B54A32D192ED03ull;
    if (di_cuda_device_count() < 1) {
        printf("no CUDA device: nothing to test\n0 passed, 1 failed\n");
        return 1;
    }
    for (int i = 0; i < (1 << 16); i++) g_table[i] = (float)gauss();
    RUN(di_backend_cpu_create(nth > 0 ? nth : 1, &cpu, E));
    RUN(di_backend_cuda_create(0, &gpu, E));
    CU(cudaEventCreate(&ev0));
    CU(cudaEventCreate(&ev1));
    CU(cudaMalloc(&g_flush, FLUSH_BYTES));
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    const char *bf = getenv("DI_CUDA_BF16");
    printf("# device: %s, %d SMs; CPU reference: %d threads; seed %s; slot = DI_CUDA_BF16=%s\n", prop.name,
           prop.multiProcessorCount, nth, seed ? seed : "default", bf ? bf : "(default)");
    printf("%-20s %-40s %-11s %19s %9s  %-52s %s\n", "op", "shape", "kernel", "mismatch/compared", "max|d|",
           "time (slot, gemv, tiled-nofma; best of 5)", "result");

    const char *prof = getenv("DI_PROFILE"); /* DI_PROFILE=M: wo_a at M rows only, for Nsight Compute */
    if (prof && atoll(prof) > 0) {
        run_case(K_GROUPED, "wo_a", atoll(prof), 8, 4096, 1024, 0, 0);
        goto done;
    }
    /* edges: K % 16 = 4 with K % 8 = 4 (scalar loads), N off the 32- and 16-column tiles, M 1 / 3 / 17 / 65 */
    static const int64_t edge_m[] = {1, 3, 17, 65};
    for (int i = 0; i < 4; i++) {
        run_case(K_BF16, "edge", edge_m[i], 1, 100, 37, 1, 0);
        run_case(K_F32, "edge", edge_m[i], 1, 1030, 70, 1, 0); /* K % 16 = 6, a partial 1024-chunk */
        run_case(K_GROUPED, "edge", edge_m[i], 3, 200, 40, 1, 0);
    }
    run_case(K_F32, "edge K7", 5, 1, 7, 9, 0, 0);
    run_case(K_F32, "edge K0", 66, 1, 0, 33, 0, 0);
    run_case(K_BF16, "edge K16", 70, 1, 16, 33, 0, 0);
    run_case(K_F32, "edge K1032 +sp", 130, 1, 1032, 100, 1, 0); /* K % 16 = 8, vector loads */

    if (!getenv("DI_QUICK")) {
        /* the V4.1 shapes at decode and prefill sizes */
        static const int64_t ms[] = {1, 8, 16, 64, 256, 8192};
        for (int i = 0; i < 6; i++) {
            const int64_t M = ms[i];
            run_case(K_GROUPED, "wo_a", M, 8, 4096, 1024, M == 8192, 1);
            run_case(K_F32, "router", M, 1, 5120, 384, M == 8192, 1);
            run_case(K_F32, "compressor", M, 1, 5120, 512, 0, 1);
            run_case(K_BF16, "k5120 n512", M, 1, 5120, 512, 0, 1);
            run_case(K_BF16, "weights_proj", M, 1, 5120, 32, 0, 1);
        }
        run_case(K_F32, "lm_head slice", 1, 1, 5120, 16384, 0, 1);
        run_case(K_F32, "lm_head slice", 8, 1, 5120, 16384, 0, 1);
    }
done:
    printf("%d passed, %d failed\n", n_pass, n_fail);
    CU(cudaFree(g_flush));
    di_backend_destroy(cpu);
    di_backend_cuda_destroy(gpu);
    return n_fail ? 1 : 0;
}
