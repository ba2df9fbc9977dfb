/* GPU test (and, with DI_BENCH=1, benchmark) of the fused FP8 decode GEMV (src/backend/cuda/cuda_gemv_fp8.cu).
 *
 * 1. Exactness, at the V4.1 FP8 linear shapes (spec §2.4: the Engram projection k6144 n25600, wo_b k8192 n5120,
 *    wq_b k1280 n32768, wkv / shared-expert / router-side k5120 n2304 / n1280 / n512, k2304 n5120, k1280 n4096)
 *    for M = 1 and 2, every column tile (1, 2, 4, 8; two rows up to 4), and at edge shapes (K = 32 / 96 /
 *    544 / 4608 / 8192, N = 1 / 8 / 9 / 12 / 33 / 37 / 100: N and K tails of a tile and of a 512-byte step) with NaN / ±inf x rows, e4m3 NaN weight codes and
 *    extreme weight scales (bytes 0, 254, 255): every output of the new kernel against act_quant + the
 *    GEMV of cuda_gemv.cuh (bit for bit, NaN bits included, both GPU) and against the CPU op
 *    (bit for bit; NaN counted as NaN: the CPU's NaN payloads differ from the GPU's canonical NaN).
 * 2. The linear_fp8 slot at M = 1 / 2 (the new kernel by default where N ≥ 1024, else the current GEMV)
 *    and with the new kernel switched off, each against the current GEMV (all bits).
 * 3. DI_BENCH=1: µs per call at the V4.1 shapes, weights rotated over ≥ 256 MB of copies (every call reads
 *    HBM), best of 5 batches: act_quant + the current GEMV (what the slot ran before), the current GEMV
 *    alone on codes, the new kernel with 1- to 8-column tiles; GB/s and % of 4470 GB/s on weights + scales;
 *    a plain 16-byte streaming read of the same bytes.
 * Usage: test_cuda_gemv_fp8; DI_BENCH=1 adds the bench; DI_QUICK=1 only the edge shapes; DI_PROFILE=1 only
 * one call of each kernel at the Engram projection shape (for ncu). Last line
 * "N passed, N failed"; exit status 1 on any failure. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_gemv_fp8.h"
#include "backend/cuda/cuda_ops.h"
#include "io/formats.h"
#include "cuda_testutil.h"

static di_backend *cpu, *gpu;
static int n_fail, n_pass;
static di_error g_err;
#define E (&g_err)

static uint64_t rng = 0x7A3F1C9B55E0D241ull;
static uint64_t rnd(void) { return ct_xorshift(&rng); }
static double gauss(void) { return ct_gauss(&rng); }

static void row(const char *what, const char *shape, int64_t bad, int64_t n) {
    printf("%-46s %-32s %s  %lld of %lld outputs differ\n", what, shape, bad ? "FAIL" : "PASS", (long long)bad,
           (long long)n);
    if (bad) n_fail++;
    else n_pass++;
}
static void check(const char *what, const char *shape, int ok) {
    printf("%-46s %-32s %s\n", what, shape, ok ? "PASS" : "FAIL");
    if (ok) n_pass++;
    else n_fail++;
}

/* random e4m3 codes with NaN codes (0x7F / 0xFF) drawn again: the special cases put NaN codes in on purpose */
static uint8_t code(void) {
    for (;;) {
        uint8_t c = (uint8_t)rnd();
        if ((c & 0x7f) != 0x7f) return c;
    }
}

/* special: 0 random; 1 NaN x in row 0, +inf x in row 1 (both NaN groups), NaN weight codes in a few
 * columns, and weight-scale bytes 0 / 254 / 255 */
static void check_case(int64_t M, int64_t N, int64_t K, int special) {
    uint16_t *x = xmalloc(2 * (size_t)(M * K));
    for (int64_t i = 0; i < M * K; i++) x[i] = di_f32_to_bf16((float)(gauss() * (i % 5 == 0 ? 30.0 : 1.0)));
    const int64_t KB = K / 32, NG = (N + 31) / 32;
    uint8_t *w = xmalloc((size_t)(N * K)), *ws = xmalloc((size_t)(NG * KB));
    for (int64_t i = 0; i < N * K; i++) w[i] = code();
    for (int64_t i = 0; i < NG * KB; i++) ws[i] = (uint8_t)(118 + rnd() % 8);
    if (special) {
        x[(37 * 7) % K] = 0x7fc0;                  /* row 0: a NaN group */
        if (M > 1) x[K + (64 + 11) % K] = 0x7f80;  /* row 1: a +inf group */
        for (int64_t n = 0; n < N; n += 7) w[n * K + (n * 13) % K] = n % 2 ? 0x7f : 0xff;
        for (int64_t i = 0; i < NG * KB; i += 5) ws[i] = i % 3 == 0 ? 0 : i % 3 == 1 ? 254 : 255;
    }
    uint16_t *y_cpu = xmalloc(2 * (size_t)(M * N));
    RUN(cpu->linear_fp8(cpu, x, M, K, w, ws, N, y_cpu, E));

    cudaStream_t st = (cudaStream_t)di_backend_cuda_stream(gpu);
    uint16_t *dx = dup_dev(x, 2 * (size_t)(M * K)), *dy = dev_poisoned(2 * (size_t)(M * N));
    uint8_t *dw = dup_dev(w, (size_t)(N * K)), *dws = dup_dev(ws, (size_t)(NG * KB));
    uint8_t *xq = dev_poisoned((size_t)(M * K)), *xs = dev_poisoned((size_t)(M * KB));
    RUN(di_cuda_act_quant_fp8(dx, M * K, 32, xq, xs, st, E));
    RUN(di_cuda_gemv_codes(gpu, 0, xq, xs, M, K, dw, dws, N, dy, E));
    uint16_t *y_cur = ct_down(dy, 2 * (size_t)(M * N));
    char sh[64];
    snprintf(sh, sizeof sh, "M%lld N%lld K%lld%s", (long long)M, (long long)N, (long long)K, special ? " +NaN/inf" : "");
    row("current gemv vs CPU (NaN class)", sh, ct_bf16_diff(y_cur, y_cpu, M * N, 1), M * N);
    for (int nc = 1; nc <= (M == 1 ? 8 : 4); nc *= 2) { /* two rows take at most 4 columns */
        di_cuda_gemv_fp8_set_tile(nc);
        CU(cudaMemset(dy, 0xA5, 2 * (size_t)(M * N)));
        CU(cudaDeviceSynchronize());
        RUN(di_cuda_gemv_fp8_run(dx, M, K, dw, dws, N, dy, st, E));
        RUN(di_backend_cuda_sync(gpu, E));
        uint16_t *y_new = ct_down(dy, 2 * (size_t)(M * N));
        char what[64];
        snprintf(what, sizeof what, "gemv_fp8 tile %d vs current (all bits)", nc);
        row(what, sh, ct_bf16_diff(y_new, y_cur, M * N, 0), M * N);
        snprintf(what, sizeof what, "gemv_fp8 tile %d vs CPU (NaN class)", nc);
        row(what, sh, ct_bf16_diff(y_new, y_cpu, M * N, 1), M * N);
        free(y_new);
    }
    di_cuda_gemv_fp8_set_tile(0);
    /* the slot, with the new kernel (default) and without it */
    for (int on = 1; on >= 0; on--) {
        di_cuda_gemv_fp8_set_enabled(on);
        CU(cudaMemset(dy, 0xA5, 2 * (size_t)(M * N)));
        CU(cudaDeviceSynchronize());
        RUN(gpu->linear_fp8(gpu, dx, M, K, dw, dws, N, dy, E));
        RUN(di_backend_cuda_sync(gpu, E));
        uint16_t *y_slot = ct_down(dy, 2 * (size_t)(M * N));
        row(on ? "linear_fp8 slot (gemv_fp8 on) vs current" : "linear_fp8 slot (gemv_fp8 off) vs current", sh,
            ct_bf16_diff(y_slot, y_cur, M * N, 0), M * N);
        free(y_slot);
    }
    di_cuda_gemv_fp8_set_enabled(1);
    free(x), free(w), free(ws), free(y_cpu), free(y_cur);
    cudaFree(dx), cudaFree(dy), cudaFree(dw), cudaFree(dws), cudaFree(xq), cudaFree(xs);
}

/* calls the kernel cannot take are refused with an error, not run */
static void check_refusals(void) {
    uint16_t *dx = dev_poisoned(2 * 3 * 8192);
    uint8_t *dw = dev_poisoned(64 * 8192), *dws = dev_poisoned(2 * 512);
    uint16_t *dy = dev_poisoned(2 * 3 * 64);
    void *st = di_backend_cuda_stream(gpu);
    check("refused: M 3", "", di_cuda_gemv_fp8_run(dx, 3, 512, dw, dws, 64, dy, st, E) != DI_OK);
    check("refused: K 48 (not a multiple of 32)", "", di_cuda_gemv_fp8_run(dx, 1, 48, dw, dws, 64, dy, st, E) != DI_OK);
    check("refused: K 8224 (past 8192)", "", di_cuda_gemv_fp8_run(dx, 1, 8224, dw, dws, 64, dy, st, E) != DI_OK);
    check("refused: x not 16-byte aligned", "", di_cuda_gemv_fp8_run(dx + 1, 1, 512, dw, dws, 64, dy, st, E) != DI_OK);
    check("refused: N 0", "", di_cuda_gemv_fp8_run(dx, 1, 512, dw, dws, 0, dy, st, E) != DI_OK);
    check("no CUDA error left pending", "", cudaDeviceSynchronize() == cudaSuccess && cudaGetLastError() == cudaSuccess);
    cudaFree(dx), cudaFree(dw), cudaFree(dws), cudaFree(dy);
}

#define GBS(t) (t) * 1e3, by / ((t) * 1e6), 100 * by / ((t) * 1e6) / 4470

static void bench(void) {
    static const struct { const char *name; int64_t n, k; } sh[] = {
        {"engram proj", 25600, 6144}, {"wo_b", 5120, 8192}, {"wq_b", 32768, 1280}, {"k5120 n2304", 2304, 5120},
        {"k2304 n5120", 5120, 2304},  {"k5120 n1280", 1280, 5120}, {"k5120 n512", 512, 5120}, {"k1280 n4096", 4096, 1280}};
    cudaStream_t st = (cudaStream_t)di_backend_cuda_stream(gpu);
    cudaEvent_t ev0, ev1;
    CU(cudaEventCreate(&ev0));
    CU(cudaEventCreate(&ev1));
    unsigned *sink = dev_poisoned(4);
    printf("\n# SM clock: %.0f MHz\n", di_cuda_sm_clock_mhz(st));
    printf("# bench (us per call; GB/s and %% of 4470 GB/s on weights + scales; best of 5 batches, weights rotated\n"
           "# over >= 256 MB): slot-old = act_quant + cuda_gemv.cuh (two launches); codes = cuda_gemv.cuh alone on\n"
           "# act-quantized rows; new1 ... new8 = cuda_gemv_fp8.cu (act-quant fused) with 1 / 2 / 4 / 8-column tiles (M 2\n"
           "# runs 4 for 8); best = its %% of the roofline; read = a\n"
           "# plain 16-byte streaming read of the weight bytes\n");
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) {
        const int64_t N = sh[i].n, K = sh[i].k, wb = N * K, sb = ((N + 31) / 32) * (K / 32);
        const int R = (int)((256ll << 20) / (wb + sb)) + 1;
        uint8_t *w = xmalloc((size_t)wb), *s = xmalloc((size_t)sb);
        for (int64_t j = 0; j < wb; j++) w[j] = code();
        for (int64_t j = 0; j < sb; j++) s[j] = (uint8_t)(117 + rnd() % 7);
        uint8_t **dw = xmalloc(sizeof *dw * (size_t)R), **ds = xmalloc(sizeof *ds * (size_t)R);
        for (int r = 0; r < R; r++) dw[r] = dup_dev(w, (size_t)wb), ds[r] = dup_dev(s, (size_t)sb);
        uint16_t *x = xmalloc(2 * (size_t)(2 * K));
        for (int64_t j = 0; j < 2 * K; j++) x[j] = di_f32_to_bf16((float)gauss());
        uint16_t *dx = dup_dev(x, 2 * (size_t)(2 * K)), *dy = dev_poisoned(2 * (size_t)(2 * N));
        uint8_t *xq = dev_poisoned((size_t)(2 * K)), *xs = dev_poisoned((size_t)(2 * K / 32));
        RUN(di_cuda_act_quant_fp8(dx, 2 * K, 32, xq, xs, st, E));
        double rd, by = (double)(wb + sb);
        BATCH(rd, R, di_cuda_stream_read(dw[r], wb, sink, st));
        for (int64_t M = 1; M <= 2; M++) {
            double t_old, t_codes, t[4], best = 1e30;
            di_cuda_gemv_fp8_set_enabled(0);
            BATCH(t_old, R, RUN(gpu->linear_fp8(gpu, dx, M, K, dw[r], ds[r], N, dy, E)));
            di_cuda_gemv_fp8_set_enabled(1);
            BATCH(t_codes, R, RUN(di_cuda_gemv_codes(gpu, 0, xq, xs, M, K, dw[r], ds[r], N, dy, E)));
            for (int a = 0; a < 4; a++) { /* tiles 1, 2, 4, 8 (M 2: 8 runs 4) */
                di_cuda_gemv_fp8_set_tile(1 << a);
                BATCH(t[a], R, RUN(di_cuda_gemv_fp8_run(dx, M, K, dw[r], ds[r], N, dy, st, E)));
                if (t[a] < best) best = t[a];
            }
            di_cuda_gemv_fp8_set_tile(0);
            printf("bench gemv_fp8 %-12s N%-5lld K%-5lld M%lld | slot-old %7.2f us %5.0f GB/s %5.1f %% | codes %7.2f us "
                   "%5.0f GB/s %5.1f %% | new1 %7.2f | new2 %7.2f | new4 %7.2f | new8 %7.2f us | best %5.1f %% | read "
                   "%6.2f us %5.0f GB/s | best vs slot-old %.2fx\n",
                   sh[i].name, (long long)N, (long long)K, (long long)M, GBS(t_old), GBS(t_codes), t[0] * 1e3, t[1] * 1e3,
                   t[2] * 1e3, t[3] * 1e3, 100 * by / (best * 1e6) / 4470, rd * 1e3, by / (rd * 1e6), t_old / best);
        }
        for (int r = 0; r < R; r++) cudaFree(dw[r]), cudaFree(ds[r]);
        free(w), free(s), free(dw), free(ds), free(x), cudaFree(dx), cudaFree(dy), cudaFree(xq), cudaFree(xs);
    }
    cudaFree(sink);
}

/* DI_PROFILE=1: one call of each kernel at the Engram projection shape, M = 1, for a profiler */
static void profile_once(void) {
    const int64_t N = 25600, K = 6144;
    uint8_t *w = xmalloc((size_t)(N * K)), *s = xmalloc((size_t)(N * K / 32 / 32 + 1));
    for (int64_t j = 0; j < N * K; j++) w[j] = code();
    for (int64_t j = 0; j < N * K / 1024; j++) s[j] = (uint8_t)(117 + rnd() % 7);
    uint16_t *x = xmalloc(2 * (size_t)K);
    for (int64_t j = 0; j < K; j++) x[j] = di_f32_to_bf16((float)gauss());
    uint8_t *dw = dup_dev(w, (size_t)(N * K)), *ds = dup_dev(s, (size_t)(N * K / 1024));
    uint16_t *dx = dup_dev(x, 2 * (size_t)K), *dy = dev_poisoned(2 * (size_t)N);
    void *st = di_backend_cuda_stream(gpu);
    uint8_t *xq = dev_poisoned((size_t)K), *xs = dev_poisoned((size_t)K / 32);
    RUN(di_cuda_act_quant_fp8(dx, K, 32, xq, xs, st, E));
    RUN(di_cuda_gemv_codes(gpu, 0, xq, xs, 1, K, dw, ds, N, dy, E));
    for (int nc = 4; nc <= 8; nc += 4) {
        di_cuda_gemv_fp8_set_tile(nc);
        RUN(di_cuda_gemv_fp8_run(dx, 1, K, dw, ds, N, dy, st, E));
    }
    RUN(di_backend_cuda_sync(gpu, E));
    free(w), free(s), free(x), cudaFree(dw), cudaFree(ds), cudaFree(dx), cudaFree(dy), cudaFree(xq), cudaFree(xs);
}

int main(void) {
    if (di_cuda_device_count() < 1) {
        printf("no CUDA device\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(di_backend_cpu_create(16, &cpu, E));
    RUN(di_backend_cuda_create(0, &gpu, E));
    if (getenv("DI_PROFILE")) {
        profile_once();
        printf("0 passed, 0 failed\n");
        return 0;
    }
    const int quick = getenv("DI_QUICK") != NULL;
    printf("%-46s %-32s %s\n", "check", "shape", "result");
    static const int64_t edge[][3] = {{1, 32, 0}, {9, 96, 1}, {33, 544, 1}, {100, 4608, 1}, {37, 8192, 1}, {8, 512, 0},
                                      {12, 1056, 1}};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
        for (int64_t M = 1; M <= 2; M++) check_case(M, edge[i][0], edge[i][1], (int)edge[i][2]);
    if (!quick) {
        static const int64_t real[][2] = {{25600, 6144}, {5120, 8192}, {32768, 1280}, {2304, 5120},
                                          {5120, 2304},  {1280, 5120}, {512, 5120},   {4096, 1280}};
        for (size_t i = 0; i < sizeof real / sizeof real[0]; i++)
            for (int64_t M = 1; M <= 2; M++) check_case(M, real[i][0], real[i][1], 0);
        check_case(2, 2304, 5120, 1);
        check_case(1, 5120, 8192, 1);
    }
    check_refusals();
    if (getenv("DI_BENCH") && !quick) bench();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    di_backend_cuda_destroy(gpu);
    di_backend_destroy(cpu);
    return n_fail ? 1 : 0;
}
