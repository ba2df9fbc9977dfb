/* GPU test (and, with DI_BENCH=1, benchmark) of the exact FP8 linear on the FP64 tensor cores
 * (src/backend/cuda/cuda_gemm_dmma.cu).
 *
 * 1. Exactness: every output of the kernel (each form and depth) against the CPU op (bit for bit; NaN
 *    counted as NaN: the CPU's NaN payloads differ from the GPU's canonical NaN) and against the
 *    linear_fp8 slot with the kernel switched off (the GEMV / int8 MMA GEMM, checked against the CPU
 *    elsewhere), at
 *    - edge shapes: N 1 / 8 / 9 / 12 / 33 / 37 / 100 (tails of a 16-column tile and of a 32-row scale
 *      group), K 32 / 96 / 544 / 4608 / 8192 (tails of a prefetch group), M 1 ... 64 (tails of a row
 *      group of 8), with NaN / +inf x rows in the first and last row group, e4m3 NaN weight codes and
 *      weight-scale bytes 0 / 254 / 255;
 *    - the V4.1 FP8 linear shapes (spec §2.4) at M 3, 8, 16, 33 and 64.
 * 2. The slot with the kernel on (default) against the slot with it off (NaN class).
 * 3. Refusals: M 0 / 65, K 48, a misaligned weight or x, N 0.
 * 4. DI_BENCH=1: µs per call at the V4.1 shapes for M 3 ... 64, weights rotated over ≥ 256 MB of copies
 *    (every call reads HBM), best of 5 batches: the slot without the kernel (act_quant + the GEMV or the
 *    int8 MMA GEMM), the slot with it (act_quant + this kernel), and the kernel alone on act-quantized
 *    rows in each form (a warp per tile; a tile split over 8 or 16 warps) at depths 2 and 4; % of 4470 GB/s
 *    on weights + scales, the best variant's f64 TFLOP/s (rows padded to 8).
 * Usage: test_cuda_gemm_dmma; DI_BENCH=1 adds the bench; DI_QUICK=1 only the edge shapes. Last line
 * "N passed, N failed"; exit status 1 on any failure. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_gemm_dmma.h"
#include "backend/cuda/cuda_ops.h"
#include "io/formats.h"
#include "cuda_testutil.h"

static di_backend *cpu, *gpu;
static int n_fail, n_pass;
static di_error g_err;
#define E (&g_err)

static uint64_t rng = 0x5D1E7A0C39B4F286ull;
static uint64_t rnd(void) { return ct_xorshift(&rng); }
static double gauss(void) { return ct_gauss(&rng); }

static void row(const char *what, const char *shape, int64_t bad, int64_t n) {
    printf("%-44s %-34s %s  %lld of %lld outputs differ\n", what, shape, bad ? "FAIL" : "PASS", (long long)bad,
           (long long)n);
    if (bad) n_fail++;
    else n_pass++;
}
static void check(const char *what, const char *shape, int ok) {
    printf("%-44s %-34s %s\n", what, shape, ok ? "PASS" : "FAIL");
    if (ok) n_pass++;
    else n_fail++;
}

/* random e4m3 codes without NaN codes (0x7F / 0xFF): the special cases put them in on purpose */
static uint8_t code(void) {
    for (;;) {
        uint8_t c = (uint8_t)rnd();
        if ((c & 0x7f) != 0x7f) return c;
    }
}

/* special: 0 random; 1 NaN x in row 0 and the last row, +inf x in row 1 (M ≥ 2), NaN weight codes in a few
 * columns, and weight-scale bytes 0 / 254 / 255 */
static void check_case(int64_t M, int64_t N, int64_t K, int special, int with_cpu) {
    uint16_t *x = xmalloc(2 * (size_t)(M * K));
    for (int64_t i = 0; i < M * K; i++) x[i] = di_f32_to_bf16((float)(gauss() * (i % 5 == 0 ? 30.0 : 1.0)));
    const int64_t KB = K / 32, NG = (N + 31) / 32;
    uint8_t *w = xmalloc((size_t)(N * K)), *ws = xmalloc((size_t)(NG * KB));
    for (int64_t i = 0; i < N * K; i++) w[i] = code();
    for (int64_t i = 0; i < NG * KB; i++) ws[i] = (uint8_t)(118 + rnd() % 8);
    if (special) {
        x[(37 * 7) % K] = 0x7fc0;                      /* row 0: a NaN group */
        if (M > 1) x[K + (64 + 11) % K] = 0x7f80;      /* row 1: a +inf group */
        x[(M - 1) * K + (K / 2 + 5) % K] = 0xffc0;     /* the last row: a NaN group */
        for (int64_t n = 0; n < N; n += 7) w[n * K + (n * 13) % K] = n % 2 ? 0x7f : 0xff;
        for (int64_t i = 0; i < NG * KB; i += 5) ws[i] = i % 3 == 0 ? 0 : i % 3 == 1 ? 254 : 255;
    }
    char sh[64];
    snprintf(sh, sizeof sh, "M%lld N%lld K%lld%s", (long long)M, (long long)N, (long long)K, special ? " +NaN/inf" : "");
    uint16_t *y_cpu = NULL;
    if (with_cpu) {
        y_cpu = xmalloc(2 * (size_t)(M * N));
        RUN(cpu->linear_fp8(cpu, x, M, K, w, ws, N, y_cpu, E));
    }
    void *st = di_backend_cuda_stream(gpu);
    uint16_t *dx = dup_dev(x, 2 * (size_t)(M * K)), *dy = dev_poisoned(2 * (size_t)(M * N));
    uint8_t *dw = dup_dev(w, (size_t)(N * K)), *dws = dup_dev(ws, (size_t)(NG * KB));
    uint8_t *xq = dev_poisoned((size_t)(M * K)), *xs = dev_poisoned((size_t)(M * KB));
    RUN(di_cuda_act_quant_fp8(dx, M * K, 32, xq, xs, st, E));

    /* the slot without the kernel: the reference on the GPU */
    di_cuda_gemm_dmma_set_enabled(0);
    RUN(gpu->linear_fp8(gpu, dx, M, K, dw, dws, N, dy, E));
    uint16_t *y_off = ct_down(dy, 2 * (size_t)(M * N));
    if (with_cpu) row("slot without dmma vs CPU (NaN class)", sh, ct_bf16_diff(y_off, y_cpu, M * N, 1), M * N);
    di_cuda_gemm_dmma_set_enabled(1);
    static const char *form[] = {"", "tile", "split8", "split16"};
    for (int v = 0; v < 6; v++) {
        const int f = 1 + v / 2, u = 2 << (v % 2);
        di_cuda_gemm_dmma_set_form(f, u);
        CU(cudaMemset(dy, 0xA5, 2 * (size_t)(M * N)));
        CU(cudaDeviceSynchronize());
        RUN(di_cuda_gemm_dmma_run(xq, xs, M, K, dw, dws, N, dy, st, E));
        uint16_t *y_new = ct_down(dy, 2 * (size_t)(M * N));
        char what[64];
        snprintf(what, sizeof what, "dmma %s depth %d vs slot without (NaN class)", form[f], u);
        row(what, sh, ct_bf16_diff(y_new, y_off, M * N, 1), M * N);
        if (with_cpu) {
            snprintf(what, sizeof what, "dmma %s depth %d vs CPU (NaN class)", form[f], u);
            row(what, sh, ct_bf16_diff(y_new, y_cpu, M * N, 1), M * N);
        }
        free(y_new);
    }
    di_cuda_gemm_dmma_set_form(0, 0);
    CU(cudaMemset(dy, 0xA5, 2 * (size_t)(M * N)));
    CU(cudaDeviceSynchronize());
    RUN(gpu->linear_fp8(gpu, dx, M, K, dw, dws, N, dy, E));
    uint16_t *y_slot = ct_down(dy, 2 * (size_t)(M * N));
    row("linear_fp8 slot (dmma on) vs off (NaN class)", sh, ct_bf16_diff(y_slot, y_off, M * N, 1), M * N);
    free(y_slot), free(y_off), free(y_cpu), free(x), free(w), free(ws);
    cudaFree(dx), cudaFree(dy), cudaFree(dw), cudaFree(dws), cudaFree(xq), cudaFree(xs);
}

/* calls the kernel cannot take are refused with an error, not run */
static void check_refusals(void) {
    uint8_t *xq = dev_poisoned(65 * 8192), *xs = dev_poisoned(65 * 256), *dw = dev_poisoned(64 * 8192 + 8);
    uint8_t *dws = dev_poisoned(2 * 256);
    uint16_t *dy = dev_poisoned(2 * 65 * 64);
    void *st = di_backend_cuda_stream(gpu);
    check("refused: M 0", "", di_cuda_gemm_dmma_run(xq, xs, 0, 512, dw, dws, 64, dy, st, E) != DI_OK);
    check("refused: M 65", "", di_cuda_gemm_dmma_run(xq, xs, 65, 512, dw, dws, 64, dy, st, E) != DI_OK);
    check("refused: K 48 (not a multiple of 32)", "", di_cuda_gemm_dmma_run(xq, xs, 8, 48, dw, dws, 64, dy, st, E) != DI_OK);
    check("refused: w not 8-byte aligned", "", di_cuda_gemm_dmma_run(xq, xs, 8, 512, dw + 4, dws, 64, dy, st, E) != DI_OK);
    check("refused: xq not 8-byte aligned", "", di_cuda_gemm_dmma_run(xq + 4, xs, 8, 512, dw, dws, 64, dy, st, E) != DI_OK);
    check("refused: N 0", "", di_cuda_gemm_dmma_run(xq, xs, 8, 512, dw, dws, 0, dy, st, E) != DI_OK);
    check("no CUDA error left pending", "", cudaDeviceSynchronize() == cudaSuccess && cudaGetLastError() == cudaSuccess);
    cudaFree(xq), cudaFree(xs), cudaFree(dw), cudaFree(dws), cudaFree(dy);
}

static void bench(void) {
    static const struct { const char *name; int64_t n, k; } sh[] = {
        {"engram proj", 25600, 6144}, {"wo_b", 5120, 8192}, {"wq_b", 32768, 1280}, {"k5120 n2304", 2304, 5120},
        {"k2304 n5120", 5120, 2304},  {"k5120 n1280", 1280, 5120}, {"k5120 n512", 512, 5120}, {"k1280 n4096", 4096, 1280}};
    static const int64_t ms[] = {3, 4, 8, 16, 32, 64};
    cudaStream_t st = (cudaStream_t)di_backend_cuda_stream(gpu);
    cudaEvent_t ev0, ev1;
    CU(cudaEventCreate(&ev0));
    CU(cudaEventCreate(&ev1));
    printf("\n# SM clock: %.0f MHz\n", di_cuda_sm_clock_mhz(st));
    printf("# bench (us per call; GB/s and %% of 4470 GB/s on weights + scales; best of 5 batches, weights rotated\n"
           "# over >= 256 MB): off = the slot without dmma (act_quant + GEMV / int8 MMA GEMM); on = the slot with it\n"
           "# (act_quant + dmma); u2 / u4 / u8 = dmma alone on act-quantized rows at prefetch depth 2 / 4 / 8\n");
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) {
        const int64_t N = sh[i].n, K = sh[i].k, wb = N * K, sb = ((N + 31) / 32) * (K / 32);
        const int R = (int)((256ll << 20) / (wb + sb)) + 1;
        uint8_t *w = xmalloc((size_t)wb), *s = xmalloc((size_t)sb);
        for (int64_t j = 0; j < wb; j++) w[j] = code();
        for (int64_t j = 0; j < sb; j++) s[j] = (uint8_t)(117 + rnd() % 7);
        uint8_t **dw = xmalloc(sizeof *dw * (size_t)R), **ds = xmalloc(sizeof *ds * (size_t)R);
        for (int r = 0; r < R; r++) dw[r] = dup_dev(w, (size_t)wb), ds[r] = dup_dev(s, (size_t)sb);
        const int64_t MM = 64;
        uint16_t *x = xmalloc(2 * (size_t)(MM * K));
        for (int64_t j = 0; j < MM * K; j++) x[j] = di_f32_to_bf16((float)gauss());
        uint16_t *dx = dup_dev(x, 2 * (size_t)(MM * K)), *dy = dev_poisoned(2 * (size_t)(MM * N));
        uint8_t *xq = dev_poisoned((size_t)(MM * K)), *xs = dev_poisoned((size_t)(MM * K / 32));
        RUN(di_cuda_act_quant_fp8(dx, MM * K, 32, xq, xs, st, E));
        double by = (double)(wb + sb);
        for (size_t a = 0; a < sizeof ms / sizeof ms[0]; a++) {
            const int64_t M = ms[a];
            double t_off, t_on, t[6], best = 1e30;
            di_cuda_gemm_dmma_set_enabled(0);
            BATCH(t_off, R, RUN(gpu->linear_fp8(gpu, dx, M, K, dw[r], ds[r], N, dy, E)));
            di_cuda_gemm_dmma_set_enabled(1);
            BATCH(t_on, R, RUN(gpu->linear_fp8(gpu, dx, M, K, dw[r], ds[r], N, dy, E)));
            for (int v = 0; v < 6; v++) {
                di_cuda_gemm_dmma_set_form(1 + v / 2, 2 << (v % 2));
                BATCH(t[v], R, RUN(di_cuda_gemm_dmma_run(xq, xs, M, K, dw[r], ds[r], N, dy, st, E)));
                best = t[v] < best ? t[v] : best;
            }
            di_cuda_gemm_dmma_set_form(0, 0);
            const double dmma_tf = 2.0 * 8 * ((M + 7) / 8) * (double)N * K / (best * 1e-3) / 1e12;
            printf("bench gemm_dmma %-12s N%-5lld K%-5lld M%-2lld | off %7.2f us %5.1f %% | on %7.2f us %5.1f %% | tile "
                   "u2 %7.2f u4 %7.2f | split8 u2 %7.2f u4 %7.2f | split16 u2 %7.2f u4 %7.2f us | best %.1f f64 TFLOP/s | "
                   "on %.2fx off\n",
                   sh[i].name, (long long)N, (long long)K, (long long)M, t_off * 1e3, 100 * by / (t_off * 1e6) / 4470,
                   t_on * 1e3, 100 * by / (t_on * 1e6) / 4470, t[0] * 1e3, t[1] * 1e3, t[2] * 1e3, t[3] * 1e3, t[4] * 1e3,
                   t[5] * 1e3, dmma_tf, t_off / t_on);
        }
        for (int r = 0; r < R; r++) cudaFree(dw[r]), cudaFree(ds[r]);
        free(w), free(s), free(dw), free(ds), free(x), cudaFree(dx), cudaFree(dy), cudaFree(xq), cudaFree(xs);
    }
}

int main(void) {
    if (di_cuda_device_count() < 1) {
        printf("no CUDA device\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(di_backend_cpu_create(16, &cpu, E));
    RUN(di_backend_cuda_create(0, &gpu, E));
    const int quick = getenv("DI_QUICK") != NULL;
    printf("%-44s %-34s %s\n", "check", "shape", "result");
    static const int64_t edge[][3] = {{1, 32, 0}, {9, 96, 1}, {33, 544, 1}, {100, 4608, 1}, {37, 8192, 1}, {8, 512, 0},
                                      {12, 1056, 1}};
    static const int64_t edge_m[] = {1, 2, 3, 5, 8, 9, 15, 16, 17, 31, 33, 64};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
        for (size_t j = 0; j < sizeof edge_m / sizeof edge_m[0]; j++)
            check_case(edge_m[j], edge[i][0], edge[i][1], (int)edge[i][2], 1);
    if (!quick) {
        static const int64_t real[][2] = {{25600, 6144}, {5120, 8192}, {32768, 1280}, {2304, 5120},
                                          {5120, 2304},  {1280, 5120}, {512, 5120},   {4096, 1280}};
        static const int64_t real_m[] = {3, 8, 16, 33, 64};
        for (size_t i = 0; i < sizeof real / sizeof real[0]; i++)
            for (size_t j = 0; j < sizeof real_m / sizeof real_m[0]; j++)
                check_case(real_m[j], real[i][0], real[i][1], real_m[j] == 16, real_m[j] <= 16 || i >= 3);
    }
    check_refusals();
    if (getenv("DI_BENCH") && !quick) bench();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    di_backend_cuda_destroy(gpu);
    di_backend_destroy(cpu);
    return n_fail ? 1 : 0;
}
