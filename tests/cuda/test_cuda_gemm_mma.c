/* GPU test (and, with DI_BENCH=1, benchmark) of the tensor-core FP8 / MXFP4 GEMM for M > 16 rows
 * (src/backend/cuda/cuda_gemm_mma.cu, the default; DI_CUDA_GEMM=simt for qgemm_kernel). First GPU run
 * 2026-11-30: 176 passed, 0 failed.
 *
 * 1. Exactness at the V4.1 shapes — MXFP4 experts w1/w3 (N 2304, K 5120) and w2 (N 5120, K 2304); FP8
 *    (K, N) = (6144, 25600), (8192, 5120), (5120, 2304), (1280, 32768), (5120, 1280), (5120, 512),
 *    (2304, 5120) — for M = 17, 64, 128, 256, 1000, 8192: the backend slot with the switch on (act-quant + the
 *    new kernel) against the switch off (act-quant + qgemm_kernel), every output bit for bit, NaN bits
 *    included (both GPU); each x-row tile (32 / 64 / 128, FP8 ≤ 64) on the act-quantized rows for
 *    M ≤ 256, tile 32 and MXFP4 tile 64 also at 2 CTAs per SM, each tile also split-K forced to 2 and 4
 *    splits and by the rule (scratch poisoned); against the CPU op (NaN counted as NaN: the CPU's NaN
 *    payloads differ from the GPU's canonical NaN) for M = 17 (and 64 on the smaller shapes). Special
 *    values at an edge shape (M 70, N 200, K 768) and one real one: NaN / ±inf x rows, weight scales
 *    2^−127 / 2^103 / 2^127 / NaN, FP8 weight NaN codes. The slot rows follow DI_CUDA_GMM_OCC /
 *    DI_CUDA_GMM_SPLIT from the environment.
 * 2. DI_BENCH=1: ms per call and TFLOP/s (2·M·N·K) of the slot with qgemm_kernel and with the new
 *    kernel, and of the new kernel alone on act-quantized rows per x-row tile; best of 5 batches. One more
 *    line per shape and M: 1 against 2 CTAs per SM (tile 32, MXFP4 tile 64), and for M ≤ 256 unsplit
 *    against split-K by the rule (S printed). DI_BENCH_NO_QGEMM=1 skips the qgemm_kernel timing (slow at
 *    large M; printed as 0).
 * Usage: test_cuda_gemm_mma [ignored args]; DI_QUICK=1 only M = 17 / 64 (compute-sanitizer). Last line
 * "N passed, N failed"; exit status 1 on any failure. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_gemm_mma.cuh"
#include "backend/cuda/cuda_ops.h"
#include "io/formats.h"
#include "cuda_testutil.h"

static di_backend *cpu, *gpu;
static int n_fail, n_pass;
static di_error g_err;
#define E (&g_err)

static uint64_t rng = 0x5DEECE66Dull;
static uint64_t rnd(void) { return ct_xorshift(&rng); }

static int64_t count_nan(const uint16_t *a, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += ct_bf16_nan(a[i]);
    return c;
}
static void row(const char *what, const char *shape, int64_t bad, int64_t n) {
    printf("%-46s %-40s %s  %lld of %lld outputs differ\n", what, shape, bad ? "FAIL" : "PASS", (long long)bad,
           (long long)n);
    fflush(stdout);
    if (bad) n_fail++;
    else n_pass++;
}

/* bf16 x [M, K]: normal deviates (every 7th ×8) from a table (fast at M·K = 2^26) */
static uint16_t *make_x(int64_t M, int64_t K) {
    static uint16_t tab[65536];
    static int filled;
    if (!filled) {
        for (int i = 0; i < 65536; i++) tab[i] = di_f32_to_bf16((float)(ct_gauss(&rng) * (i % 7 == 0 ? 8.0 : 1.0)));
        filled = 1;
    }
    uint16_t *x = xmalloc(2 * (size_t)(M * K));
    for (int64_t i = 0; i < M * K; i++) x[i] = tab[rnd() >> 48];
    return x;
}

/* a weight: FP8 e4m3 [N, K] (no NaN codes) + E8M0 [ceil(N/32), K/32], or MXFP4 [N, K/2] + E8M0 [N, K/32] */
typedef struct {
    int fp8;
    int64_t N, K;
    uint8_t *w, *ws;   /* host */
    uint8_t *dw, *dws; /* device */
} weight;

static weight make_w(int fp8, int64_t N, int64_t K, int special) {
    weight W = {fp8, N, K, NULL, NULL, NULL, NULL};
    const int64_t KB = K / 32, wb = fp8 ? N * K : N * K / 2, sb = (fp8 ? (N + 31) / 32 : N) * KB;
    W.w = xmalloc((size_t)wb), W.ws = xmalloc((size_t)sb);
    for (int64_t i = 0; i < wb; i += 8) {
        uint64_t v = rnd();
        for (int j = 0; j < 8 && i + j < wb; j++, v >>= 8) {
            uint8_t c = (uint8_t)v;
            if (fp8 && (c & 0x7f) == 0x7f) c ^= 1;
            W.w[i + j] = c; /* every code but the FP8 NaN ones: all three digit planes busy */
        }
    }
    for (int64_t i = 0; i < sb; i++) W.ws[i] = (uint8_t)(117 + rnd() % 7);
    if (special) { /* 2^−127 / 2^103 blocks; one NaN and one 2^127 scale; FP8 NaN codes in rows 3 and 40 */
        for (int64_t i = 0; i < sb; i += 11) W.ws[i] = i % 2 ? 0 : 230;
        W.ws[sb - 1 - KB / 2] = 255;
        W.ws[KB / 3] = 254;
        if (fp8) {
            W.w[3 * K + 77] = 0x7f;
            if (N > 40) W.w[40 * K + K - 1] = 0xff;
        }
    }
    W.dw = dup_dev(W.w, (size_t)wb), W.dws = dup_dev(W.ws, (size_t)sb);
    return W;
}
static void free_w(weight *W) { free(W->w), free(W->ws), cudaFree(W->dw), cudaFree(W->dws); }

static int slot(const weight *W, const uint16_t *dx, int64_t M, uint16_t *dy) {
    return W->fp8 ? gpu->linear_fp8(gpu, dx, M, W->K, W->dw, W->dws, W->N, dy, E)
                  : gpu->linear_fp4(gpu, dx, M, W->K, W->dw, W->dws, W->N, dy, E);
}

/* the mma GEMM alone on act-quantized rows xq / xs with x-row tile bm, occ CTAs per SM and split-K
 * setting split (1 never, 0 the rule, S), every output against y_ref bit for bit; the scratch (x digits,
 * split-K planes) sized after the settings (it depends on them) and poisoned */
static void tile_check(const weight *W, int64_t M, const uint8_t *xq, const uint8_t *xs, uint16_t *dy,
                       const uint16_t *y_ref, const char *sh, int bm, int occ, int split) {
    const int64_t N = W->N, K = W->K;
    cudaStream_t st = (cudaStream_t)di_backend_cuda_stream(gpu);
    di_cuda_gemm_mma_set_tile(bm);
    di_cuda_gemm_mma_set_occ(occ);
    di_cuda_gemm_mma_set_split(split);
    const int S = di_cuda_gemm_mma_splits(W->fp8 ? 0 : 1, M, K, N);
    uint8_t *xd = dev_poisoned((size_t)di_cuda_gemm_mma_scratch(W->fp8 ? 0 : 1, M, K, N));
    CU(cudaMemset(dy, 0xA5, 2 * (size_t)(M * N)));
    CU(cudaDeviceSynchronize());
    RUN(di_cuda_gemm_mma_run(W->fp8 ? 0 : 1, xq, xs, M, K, W->dw, W->dws, N, dy, xd, st, E));
    RUN(di_backend_cuda_sync(gpu, E));
    uint16_t *y_t = ct_down(dy, 2 * (size_t)(M * N));
    char what[80];
    snprintf(what, sizeof what, "mma tile %d occ %d split %s%d vs qgemm (all bits)", bm, occ, split ? "" : "rule ", S);
    row(what, sh, ct_bf16_diff(y_t, y_ref, M * N, 0), M * N);
    if (split >= 2 && S < 2) printf("# %s: split %d not taken (the scratch cap)\n", sh, split);
    free(y_t);
    cudaFree(xd);
    di_cuda_gemm_mma_set_tile(0);
    di_cuda_gemm_mma_set_occ(-1);
    di_cuda_gemm_mma_set_split(-1);
}

/* special x: NaN in the even rows' block 0, ±inf in their block 9 (or the last) */
static void check(const weight *W, int64_t M, int cpu_cmp, int special) {
    const int64_t N = W->N, K = W->K, KB = K / 32;
    uint16_t *x = make_x(M, K);
    if (special)
        for (int64_t m = 0; m < M; m += 2) {
            x[m * K + 5] = 0x7fc0;
            x[m * K + (9 < KB ? 9 : KB - 1) * 32 + 3] = m & 2 ? 0xff80 : 0x7f80;
        }
    char sh[80];
    snprintf(sh, sizeof sh, "%s M%lld N%lld K%lld%s", W->fp8 ? "fp8" : "fp4", (long long)M, (long long)N, (long long)K,
             special ? " +special" : "");
    cudaStream_t st = (cudaStream_t)di_backend_cuda_stream(gpu);
    uint16_t *dx = dup_dev(x, 2 * (size_t)(M * K)), *dy = dev_poisoned(2 * (size_t)(M * N));
    /* qgemm_kernel (switch off), then the new kernel through the slot */
    di_cuda_gemm_mma_set_enabled(0);
    RUN(slot(W, dx, M, dy));
    RUN(di_backend_cuda_sync(gpu, E));
    uint16_t *y_ref = ct_down(dy, 2 * (size_t)(M * N));
    di_cuda_gemm_mma_set_enabled(1);
    CU(cudaMemset(dy, 0xA5, 2 * (size_t)(M * N)));
    CU(cudaDeviceSynchronize());
    RUN(slot(W, dx, M, dy));
    RUN(di_backend_cuda_sync(gpu, E));
    uint16_t *y_mma = ct_down(dy, 2 * (size_t)(M * N));
    row("slot mma vs qgemm_kernel (all bits)", sh, ct_bf16_diff(y_mma, y_ref, M * N, 0), M * N);
    if (special) {
        const int64_t nans = count_nan(y_ref, M * N);
        printf("# %s: %lld NaN outputs (expected: the even rows, the NaN-scale / NaN-code columns)\n", sh, (long long)nans);
        if (!(nans >= (M + 1) / 2 * N && nans < M * N)) row("special: NaN count in range", sh, 1, 1);
    }
    /* every x-row tile on the act-quantized rows; 2 CTAs per SM where built (tile 32, MXFP4 tile 64);
     * split-K forced to 2 and 4 splits and by the rule (which may not split: the row names S) */
    if (M <= 256) {
        uint8_t *xq = dev_poisoned((size_t)(M * K)), *xs = dev_poisoned((size_t)(M * KB));
        RUN(di_cuda_act_quant_fp8(dx, M * K, 32, xq, xs, st, E));
        for (int bm = 32; bm <= (W->fp8 ? 64 : 128); bm *= 2) {
            tile_check(W, M, xq, xs, dy, y_ref, sh, bm, 1, 1);
            if (bm == 32 || (!W->fp8 && bm == 64)) tile_check(W, M, xq, xs, dy, y_ref, sh, bm, 2, 1);
            tile_check(W, M, xq, xs, dy, y_ref, sh, bm, 1, 2);
            tile_check(W, M, xq, xs, dy, y_ref, sh, bm, 1, 4);
            tile_check(W, M, xq, xs, dy, y_ref, sh, bm, 1, 0);
        }
        tile_check(W, M, xq, xs, dy, y_ref, sh, 32, 2, 0); /* both */
        cudaFree(xq), cudaFree(xs);
    }
    if (cpu_cmp) {
        uint16_t *y_cpu = xmalloc(2 * (size_t)(M * N));
        if (W->fp8) RUN(cpu->linear_fp8(cpu, x, M, K, W->w, W->ws, N, y_cpu, E));
        else RUN(cpu->linear_fp4(cpu, x, M, K, W->w, W->ws, N, y_cpu, E));
        row("slot mma vs CPU op (NaN class)", sh, ct_bf16_diff(y_mma, y_cpu, M * N, 1), M * N);
        free(y_cpu);
    }
    free(x), free(y_ref), free(y_mma);
    cudaFree(dx), cudaFree(dy);
}

static const struct {
    int fp8;
    int64_t k, n;
    const char *name;
} shapes[] = {
    {0, 5120, 2304, "expert w1/w3"}, {0, 2304, 5120, "expert w2"},     {1, 6144, 25600, "fp8 k6144 n25600"},
    {1, 8192, 5120, "fp8 k8192 n5120"}, {1, 5120, 2304, "fp8 k5120 n2304"}, {1, 1280, 32768, "fp8 k1280 n32768"},
    {1, 5120, 1280, "fp8 k5120 n1280"}, {1, 5120, 512, "fp8 k5120 n512"}, {1, 2304, 5120, "fp8 k2304 n5120"},
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])
static const int64_t ms[] = {8, 17, 64, 128, 256, 1000, 8192}; /* 8: FP8 decode rows the split GEMM takes; 128: a prefill expert's typical rows */

/* ---- bench ---- */
static void bench(void) {
    const int no_qgemm = getenv("DI_BENCH_NO_QGEMM") != NULL; /* skip the slow qgemm_kernel timing (0 printed) */
    cudaStream_t st = (cudaStream_t)di_backend_cuda_stream(gpu);
    cudaEvent_t ev0, ev1;
    CU(cudaEventCreate(&ev0));
    CU(cudaEventCreate(&ev1));
    printf("\n# SM clock: %.0f MHz\n", di_cuda_sm_clock_mhz(st));
    printf("# bench (ms per call, TFLOP/s = 2*M*N*K; best of 5 batches): slot = act-quant + GEMM through the backend\n"
           "# slot with qgemm_kernel (DI_CUDA_GEMM unset) vs with the mma kernel; mmaT = the mma GEMM (x digit\n"
           "# pre-pass + kernel) on act-quantized rows with x-row tile T, unsplit; gemm-mma-var: the mma GEMM with\n"
           "# tile 32 (MXFP4 also 64) at 1 vs 2 CTAs per SM, and (M <= 256) default tile unsplit vs split-K by the rule\n");
    for (int s = 0; s < NSHAPES; s++) {
        weight W = make_w(shapes[s].fp8, shapes[s].n, shapes[s].k, 0);
        const int64_t N = W.N, K = W.K, KB = K / 32;
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
            const int64_t M = ms[mi];
            const double flop = 2.0 * (double)M * (double)N * (double)K;
            const int R = flop > 2e11 ? 1 : flop > 2e10 ? 3 : 10;
            uint16_t *x = make_x(M, K);
            uint16_t *dx = dup_dev(x, 2 * (size_t)(M * K)), *dy = dev_poisoned(2 * (size_t)(M * N));
            uint8_t *xq = dev_poisoned((size_t)(M * K)), *xs = dev_poisoned((size_t)(M * KB));
            uint8_t *xd = dev_poisoned((size_t)di_cuda_gemm_mma_scratch(W.fp8 ? 0 : 1, M, K, N));
            RUN(di_cuda_act_quant_fp8(dx, M * K, 32, xq, xs, st, E));
            double tq = 0, tm, tt[3] = {0, 0, 0};
            di_cuda_gemm_mma_set_enabled(0);
            if (!no_qgemm) BATCH(tq, R, RUN(slot(&W, dx, M, dy)));
            di_cuda_gemm_mma_set_enabled(1);
            BATCH(tm, R, RUN(slot(&W, dx, M, dy)));
            di_cuda_gemm_mma_set_split(1); /* xd holds the x digits at least */
            for (int b = 0; b < (W.fp8 ? 2 : 3); b++) {
                di_cuda_gemm_mma_set_tile(32 << b);
                BATCH(tt[b], R, RUN(di_cuda_gemm_mma_run(W.fp8 ? 0 : 1, xq, xs, M, K, W.dw, W.dws, N, dy, xd, st, E)));
            }
            di_cuda_gemm_mma_set_tile(0);
#define TF(t) (t), (t) > 0 ? flop / ((t) * 1e9) : 0.0
            printf("bench gemm-mma %-17s M%-5lld | qgemm %9.3f ms %6.1f TF/s | mma %9.3f ms %6.1f TF/s | speed-up %6.1fx "
                   "| mma32 %8.3f ms %6.1f | mma64 %8.3f ms %6.1f | mma128 %8.3f ms %6.1f\n",
                   shapes[s].name, (long long)M, TF(tq), TF(tm), tq > 0 ? tq / tm : 0.0, TF(tt[0]), TF(tt[1]),
                   TF(tt[2]));
            /* 2 CTAs per SM against 1: tile 32 (and MXFP4's tile 64) */
            double to[2][2] = {{0, 0}, {0, 0}};
            for (int b = 0; b < (W.fp8 ? 1 : 2); b++)
                for (int o = 0; o < 2; o++) {
                    di_cuda_gemm_mma_set_tile(32 << b);
                    di_cuda_gemm_mma_set_occ(o + 1);
                    BATCH(to[b][o], R, RUN(di_cuda_gemm_mma_run(W.fp8 ? 0 : 1, xq, xs, M, K, W.dw, W.dws, N, dy, xd, st, E)));
                }
            di_cuda_gemm_mma_set_tile(0);
            di_cuda_gemm_mma_set_occ(-1);
            /* decode M: split-K by the rule (its own scratch) against none, default tile and occupancy */
            double tsp[2] = {0, 0};
            int S = 1;
            for (int sp = 0; sp < 2 && M <= 256; sp++) {
                di_cuda_gemm_mma_set_split(sp ? 0 : 1);
                S = di_cuda_gemm_mma_splits(W.fp8 ? 0 : 1, M, K, N);
                uint8_t *xd2 = dev_poisoned((size_t)di_cuda_gemm_mma_scratch(W.fp8 ? 0 : 1, M, K, N));
                BATCH(tsp[sp], R, RUN(di_cuda_gemm_mma_run(W.fp8 ? 0 : 1, xq, xs, M, K, W.dw, W.dws, N, dy, xd2, st, E)));
                cudaFree(xd2);
            }
            di_cuda_gemm_mma_set_split(-1);
            printf("bench gemm-mma-var %-13s M%-5lld | mma32 occ1 %8.3f ms occ2 %8.3f ms (%5.2fx) | mma64 occ1 %8.3f ms "
                   "occ2 %8.3f ms (%5.2fx) | split off %8.3f ms, rule S %2d %8.3f ms (%5.2fx)\n",
                   shapes[s].name, (long long)M, to[0][0], to[0][1], to[0][0] / to[0][1], to[1][0], to[1][1],
                   to[1][1] > 0 ? to[1][0] / to[1][1] : 0.0, tsp[0], S, tsp[1], tsp[1] > 0 ? tsp[0] / tsp[1] : 0.0);
            fflush(stdout);
            free(x), cudaFree(dx), cudaFree(dy), cudaFree(xq), cudaFree(xs), cudaFree(xd);
        }
        free_w(&W);
    }
}

/* DI_BENCH=splits: the FP8 decode shapes at M 64 / 128 / 256, unsplit against fixed splits S 2, 3, 4, 6
 * (the data for the split rule's tile threshold; same scratch and plan code as the rule) */
static void bench_splits(void) {
    cudaStream_t st = (cudaStream_t)di_backend_cuda_stream(gpu);
    cudaEvent_t ev0, ev1;
    CU(cudaEventCreate(&ev0));
    CU(cudaEventCreate(&ev1));
    static const int64_t sm[] = {64, 128, 256};
    static const int ss[] = {1, 2, 3, 4, 6};
    printf("\n# bench splits (ms per call of the mma GEMM on act-quantized rows, best of 5 batches; rule S in brackets)\n");
    for (int s = 0; s < NSHAPES; s++) {
        if (!shapes[s].fp8) continue;
        weight W = make_w(1, shapes[s].n, shapes[s].k, 0);
        const int64_t N = W.N, K = W.K, KB = K / 32;
        for (int mi = 0; mi < 3; mi++) {
            const int64_t M = sm[mi];
            uint16_t *x = make_x(M, K);
            uint16_t *dx = dup_dev(x, 2 * (size_t)(M * K)), *dy = dev_poisoned(2 * (size_t)(M * N));
            uint8_t *xq = dev_poisoned((size_t)(M * K)), *xs = dev_poisoned((size_t)(M * KB));
            RUN(di_cuda_act_quant_fp8(dx, M * K, 32, xq, xs, st, E));
            di_cuda_gemm_mma_set_split(0);
            const int rule = di_cuda_gemm_mma_splits(0, M, K, N);
            printf("bench split %-17s M%-4lld [S %2d]", shapes[s].name, (long long)M, rule);
            for (int i = 0; i < 5; i++) {
                di_cuda_gemm_mma_set_split(ss[i]);
                const int S = di_cuda_gemm_mma_splits(0, M, K, N);
                uint8_t *xd = dev_poisoned((size_t)di_cuda_gemm_mma_scratch(0, M, K, N));
                double t = 0;
                BATCH(t, 10, RUN(di_cuda_gemm_mma_run(0, xq, xs, M, K, W.dw, W.dws, N, dy, xd, st, E)));
                printf(" | S %d (%d) %8.4f ms", ss[i], S, t);
                cudaFree(xd);
            }
            printf("\n");
            fflush(stdout);
            di_cuda_gemm_mma_set_split(-1);
            free(x), cudaFree(dx), cudaFree(dy), cudaFree(xq), cudaFree(xs);
        }
        free_w(&W);
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
    printf("%-46s %-40s %s\n", "check", "shape", "result");
    { /* special values: an edge shape (partial tiles) and one real shape, both weight formats */
        for (int fp8 = 0; fp8 < 2; fp8++) {
            weight W = make_w(fp8, 200, 768, 1);
            check(&W, 70, 1, 1);
            check(&W, 19, 1, 1);
            free_w(&W);
            W = make_w(fp8, fp8 ? 1280 : 2304, 5120, 1);
            check(&W, 17, 1, 1);
            free_w(&W);
        }
    }
    for (int s = 0; s < NSHAPES; s++) {
        weight W = make_w(shapes[s].fp8, shapes[s].n, shapes[s].k, 0);
        const double wsize = (double)W.N * (double)W.K;
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
            const int64_t M = ms[mi];
            if (quick && M > 64) break;
            /* the CPU op: M 17 everywhere, M 64 where N·K ≤ 12M (CPU time) */
            check(&W, M, M == 17 || ((M == 8 || M == 64) && wsize <= 12e6), 0);
        }
        free_w(&W);
    }
    const char *bn = getenv("DI_BENCH");
    if (bn && !strcmp(bn, "splits")) bench_splits();
    else if (bn && !quick) bench();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    di_backend_cuda_destroy(gpu);
    di_backend_destroy(cpu);
    return n_fail ? 1 : 0;
}
