/* GPU test (and, with DI_BENCH=1, benchmark) of the tensor-core MXFP4 decode GEMV
 * (src/backend/cuda/cuda_gemv_mma.cu, the default; DI_CUDA_GEMV=simt the CUDA-core one) and of moe_routed's
 * grouped expert GEMM (src/backend/cuda/cuda_moe_mm.cu).
 *
 * 1. Exactness, at the V4.1 expert shapes (w1/w3 2304×5120, w2 5120×2304) for M = 1 … 5 and 16, and at
 *    edge shapes (N = 37 / 9, K = 384 / 128), with NaN / ±inf x rows and NaN / extreme weight scales:
 *    the new kernel (both column tiles) against the current GEMV (di_cuda_gemv_codes, cuda_gemv.cuh) —
 *    every output bit for bit, NaN bits included (both GPU) — and against the CPU op di_cpu_linear_fp4
 *    (bit for bit; NaN counted as NaN: the CPU's NaN payloads differ from the GPU's canonical NaN).
 *    Then the backend slot linear_fp4 with DI_CUDA_GEMV=mma (act-quant + the new GEMV) against the CPU.
 * 2. DI_BENCH=1: µs per call of both kernels on act-quantized rows, weights rotated over ≥ 256 MB of
 *    copies (every call reads HBM), best of 5 batches; GB/s and % of 4470 GB/s on weights + scales;
 *    a plain 16-byte streaming read of the same bytes as the per-kernel floor.
 * Usage: test_cuda_gemv_mma [ignored args]; DI_BENCH=1 adds the bench (DI_BENCH=moe: moe_routed's only); DI_QUICK=1 only the M ≤ 2 rows
 * (compute-sanitizer). Last line "N passed, N failed"; exit status 1 on any failure.
 * 3. moe_routed's three ways (CUDA-core GEMVs, tensor-core GEMVs, the grouped GEMM of cuda_moe_mm.cu for all
 *    groups or for groups of ≥ 3 rows beside the GEMVs) on steps of 1 … 256 tokens, with NaN / ±inf / huge x
 *    and a skipped id: every output bit equal; DI_BENCH=1 times them (and the GEMM's row threshold). */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_gemv_mma.cuh"
#include "backend/cuda/cuda_ops.h"
#include "io/formats.h"
#include "cuda_testutil.h"

static di_backend *cpu, *gpu;
static int n_fail, n_pass;
static di_error g_err;
#define E (&g_err)

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void) {
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}
static double gauss(void) {
    double u = ((double)(rnd() >> 11) + 0.5) * 0x1p-53, v = (double)(rnd() >> 11) * 0x1p-53;
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static void row(const char *what, const char *shape, int64_t bad, int64_t n) {
    printf("%-44s %-34s %s  %lld of %lld outputs differ\n", what, shape, bad ? "FAIL" : "PASS", (long long)bad,
           (long long)n);
    if (bad) n_fail++;
    else n_pass++;
}

/* special: 0 random; 1 NaN x in row 0, −inf x in row 1, and 2^−127 / 2^103 / 2^127 / NaN weight scales */
static void check_case(const char *name, int64_t M, int64_t N, int64_t K, int special) {
    uint16_t *x = xmalloc(2 * (size_t)(M * K));
    for (int64_t i = 0; i < M * K; i++) x[i] = di_f32_to_bf16((float)(gauss() * (i % 7 == 0 ? 8.0 : 1.0)));
    uint8_t *w = xmalloc((size_t)(N * K / 2)), *ws = xmalloc((size_t)(N * K / 32));
    for (int64_t i = 0; i < N * K / 2; i++) w[i] = (uint8_t)rnd();
    for (int64_t i = 0; i < N * K / 32; i++) ws[i] = (uint8_t)(117 + rnd() % 7);
    if (special) {
        x[37 % K] = 0x7fc0;                         /* row 0: a NaN group */
        if (M > 1) x[K + (64 + 11) % K] = 0xff80;   /* row 1: a −inf group (NaN scale too) */
        const int64_t KB = K / 32; /* 2^−127 / 2^103 blocks; one NaN scale in rows ≡ 0 mod 8, one 2^127 in rows ≡ 1 */
        for (int64_t i = 0; i < N * KB; i += 11) ws[i] = i % 2 ? 0 : 230;
        for (int64_t n = 0; n < N; n++)
            if (n % 8 < 2) ws[n * KB + (n * 5) % KB] = n % 8 ? 254 : 255;
    }
    uint16_t *y_cpu = xmalloc(2 * (size_t)(M * N));
    RUN(cpu->linear_fp4(cpu, x, M, K, w, ws, N, y_cpu, E));

    cudaStream_t st = (cudaStream_t)di_backend_cuda_stream(gpu);
    uint16_t *dx = dup_dev(x, 2 * (size_t)(M * K)), *dy = dev_poisoned(2 * (size_t)(M * N));
    uint8_t *dw = dup_dev(w, (size_t)(N * K / 2)), *dws = dup_dev(ws, (size_t)(N * K / 32));
    uint8_t *xq = dev_poisoned((size_t)(M * K)), *xs = dev_poisoned((size_t)(M * K / 32));
    RUN(di_cuda_act_quant_fp8(dx, M * K, 32, xq, xs, st, E));
    RUN(di_cuda_gemv_codes(gpu, 1, xq, xs, M, K, dw, dws, N, dy, E));
    uint16_t *y_cur = ct_down(dy, 2 * (size_t)(M * N));
    char sh[64];
    snprintf(sh, sizeof sh, "M%lld N%lld K%lld%s", (long long)M, (long long)N, (long long)K, special ? " +NaN/inf" : "");
    row("current gemv vs CPU (NaN class)", sh, ct_bf16_diff(y_cur, y_cpu, M * N, 1), M * N);
    for (int nc = 8; nc <= 16; nc += 8) {
        di_cuda_gemv_mma_set_tile(nc);
        CU(cudaMemset(dy, 0xA5, 2 * (size_t)(M * N)));
        CU(cudaDeviceSynchronize());
        RUN(di_cuda_gemv_mma_codes(gpu, xq, xs, M, K, dw, dws, N, dy, E));
        RUN(di_backend_cuda_sync(gpu, E));
        uint16_t *y_mma = ct_down(dy, 2 * (size_t)(M * N));
        char what[64];
        snprintf(what, sizeof what, "mma gemv tile %d vs current (all bits)", nc);
        row(what, sh, ct_bf16_diff(y_mma, y_cur, M * N, 0), M * N);
        snprintf(what, sizeof what, "mma gemv tile %d vs CPU (NaN class)", nc);
        row(what, sh, ct_bf16_diff(y_mma, y_cpu, M * N, 1), M * N);
        free(y_mma);
    }
    di_cuda_gemv_mma_set_tile(0);
    /* the slot: act-quant + the new GEMV (DI_CUDA_GEMV=mma set in main) */
    CU(cudaMemset(dy, 0xA5, 2 * (size_t)(M * N)));
    CU(cudaDeviceSynchronize());
    RUN(gpu->linear_fp4(gpu, dx, M, K, dw, dws, N, dy, E));
    RUN(di_backend_cuda_sync(gpu, E));
    uint16_t *y_slot = ct_down(dy, 2 * (size_t)(M * N));
    row("linear_fp4 slot (DI_CUDA_GEMV=mma) vs CPU", sh, ct_bf16_diff(y_slot, y_cpu, M * N, 1), M * N);
    (void)name;
    free(x), free(w), free(ws), free(y_cpu), free(y_cur), free(y_slot);
    cudaFree(dx), cudaFree(dy), cudaFree(dw), cudaFree(dws), cudaFree(xq), cudaFree(xs);
}

/* ---- moe_routed: the expert GEMVs on the new kernel (switch on) vs the current one (off), bit for bit ----
 * D 5120, inter 2304, top-6 of NE experts (the first 16 distinct random weights, the rest copies: the
 * bench's HBM traffic). */
#define MOE_D 5120
#define MOE_I 2304
#define MOE_K 6
static di_moe_expert *g_ex;
static int g_nex;
static void moe_experts(int n) {
    if (g_nex >= n) return;
    const int64_t b13 = (int64_t)MOE_I * MOE_D / 2, s13 = (int64_t)MOE_I * MOE_D / 32, b2 = b13, s2 = (int64_t)MOE_D * MOE_I / 32;
    uint8_t *h[16][6];
    for (int e = 0; e < 16; e++) {
        const int64_t sz[6] = {b13, s13, b13, s13, b2, s2};
        for (int j = 0; j < 6; j++) {
            h[e][j] = xmalloc((size_t)sz[j]);
            for (int64_t i = 0; i < sz[j]; i++) h[e][j][i] = j % 2 ? (uint8_t)(119 + rnd() % 6) : (uint8_t)rnd();
        }
    }
    g_ex = realloc(g_ex, sizeof *g_ex * (size_t)n);
    for (int e = g_nex; e < n; e++) {
        const int64_t sz[6] = {b13, s13, b13, s13, b2, s2};
        const uint8_t *d[6];
        for (int j = 0; j < 6; j++) d[j] = dup_dev(h[e % 16][j], (size_t)sz[j]);
        g_ex[e] = (di_moe_expert){d[0], d[1], d[2], d[3], d[4], d[5]};
    }
    g_nex = n;
    for (int e = 0; e < 16; e++)
        for (int j = 0; j < 6; j++) free(h[e][j]);
}
/* ids int32 [T, 6] distinct per token in [0, ne); rep: every token also on expert 5, token 1 on 7 twice */
static int32_t *moe_ids(int64_t T, int ne, int rep) {
    int32_t *ids = xmalloc(sizeof *ids * (size_t)(T * MOE_K));
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < MOE_K; j++) {
            int32_t v;
            int again;
            do {
                v = (int32_t)(rnd() % (uint64_t)ne), again = 0;
                for (int i = 0; i < j; i++) again |= ids[t * MOE_K + i] == v;
            } while (again);
            ids[t * MOE_K + j] = v;
        }
    if (rep)
        for (int64_t t = 0; t < T; t++) {
            ids[t * MOE_K] = 5;
            if (t == 1) ids[t * MOE_K + 1] = 7, ids[t * MOE_K + 2] = 7;
        }
    return ids;
}
/* The three ways (CUDA-core GEMVs, tensor-core GEMVs, grouped GEMM of cuda_moe_mm.cu) on one step, every
 * output bit compared. rep also puts NaN, ±inf and huge values into a few rows (NaN groups, overflowing
 * blocks) and an id outside the table (a skipped pair). */
static void check_moe(int64_t T, int rep) {
    moe_experts(16);
    int32_t *ids = moe_ids(T, 16, rep);
    if (rep && T > 2) ids[2 * MOE_K + 3] = 99; /* not an expert of the 16: skipped */
    float *wt = xmalloc(sizeof *wt * (size_t)(T * MOE_K));
    for (int64_t i = 0; i < T * MOE_K; i++) wt[i] = (float)(0.05 + 0.3 * (double)(rnd() % 1000) / 1000.0);
    uint16_t *x = xmalloc(2 * (size_t)(T * MOE_D));
    for (int64_t i = 0; i < T * MOE_D; i++) x[i] = di_f32_to_bf16((float)gauss());
    if (rep)
        for (int64_t t = 0; t < T; t += 3) {
            x[t * MOE_D + 7 + 97 * (t % 11)] = t % 2 ? 0x7fc0 : 0xff80; /* NaN / −inf */
            x[t * MOE_D + 1000] = di_f32_to_bf16(3.0e38f);              /* the block's P_b overflows */
        }
    uint16_t *dx = dup_dev(x, 2 * (size_t)(T * MOE_D));
    int32_t *dids = dup_dev(ids, sizeof *ids * (size_t)(T * MOE_K));
    float *dwt = dup_dev(wt, sizeof *wt * (size_t)(T * MOE_K)), *dacc = dev_poisoned(4 * (size_t)(T * MOE_D));
    float *acc[4];
    static const int mm_min[4] = {-1, -1, 1, 3}; /* GEMVs; GEMVs; the GEMM for every group; for groups of ≥ 3 */
    for (int way = 0; way < 4; way++) {
        di_cuda_gemv_mma_set_enabled(way > 0);
        di_cuda_moe_set_mm(mm_min[way]);
        CU(cudaMemset(dacc, 0xA5, 4 * (size_t)(T * MOE_D)));
        CU(cudaDeviceSynchronize());
        RUN(gpu->moe_routed(gpu, dx, T, MOE_D, MOE_I, dids, dwt, MOE_K, 16, g_ex, 10.0f, dacc, E));
        RUN(di_backend_cuda_sync(gpu, E));
        acc[way] = ct_down(dacc, 4 * (size_t)(T * MOE_D));
    }
    di_cuda_gemv_mma_set_enabled(1);
    di_cuda_moe_set_mm(0);
    char sh[64];
    snprintf(sh, sizeof sh, "T%lld top-6 of 16%s", (long long)T, rep ? " +rep +special" : "");
    static const char *what[4] = {"", "moe_routed gemv-mma vs current (all bits)", "moe_routed grouped mm vs current (all bits)",
                                  "moe_routed mm >= 3 rows vs current (all bits)"};
    for (int way = 1; way < 4; way++) {
        int64_t bad = 0, nan = 0;
        for (int64_t i = 0; i < T * MOE_D; i++) bad += memcmp(&acc[0][i], &acc[way][i], 4) != 0, nan += isnan(acc[way][i]);
        row(what[way], sh, bad, T * MOE_D);
        if (rep && nan == 0) row("moe_routed special rows give NaN", sh, 1, 1);
    }
    free(ids), free(wt), free(x), free(acc[0]), free(acc[1]), free(acc[2]), free(acc[3]);
    cudaFree(dx), cudaFree(dids), cudaFree(dwt), cudaFree(dacc);
}

/* ---- bench ---- */
#define GBS(t) (t) * 1e3, by / ((t) * 1e6), 100 * by / ((t) * 1e6) / 4470

static void bench(void) {
    static const struct { const char *name; int64_t n, k; } sh[] = {{"expert w1/w3", 2304, 5120}, {"expert w2", 5120, 2304}};
    static const int64_t ms[] = {1, 2, 3, 4};
    cudaStream_t st = (cudaStream_t)di_backend_cuda_stream(gpu);
    cudaEvent_t ev0, ev1;
    CU(cudaEventCreate(&ev0));
    CU(cudaEventCreate(&ev1));
    unsigned *sink = dev_poisoned(4);
    printf("\n# SM clock: %.0f MHz\n", di_cuda_sm_clock_mhz(st));
    printf("# bench (us per call on act-quantized rows; GB/s and %% of 4470 GB/s on weights + scales; best of 5 batches,\n"
           "# weights rotated over >= 256 MB): current = cuda_gemv.cuh; mma8 / mma16 = cuda_gemv_mma.cu with 8 / 16-column\n"
           "# tiles; read = a plain 16-byte streaming read of the same bytes\n");
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) {
        const int64_t N = sh[i].n, K = sh[i].k, wb = N * K / 2, sb = N * (K / 32);
        const int R = (int)((256ll << 20) / (wb + sb)) + 1;
        uint8_t *w = xmalloc((size_t)wb), *s = xmalloc((size_t)sb);
        for (int64_t j = 0; j < wb; j++) w[j] = (uint8_t)rnd();
        for (int64_t j = 0; j < sb; j++) s[j] = (uint8_t)(117 + rnd() % 7);
        uint8_t **dw = xmalloc(sizeof *dw * (size_t)R), **ds = xmalloc(sizeof *ds * (size_t)R);
        for (int r = 0; r < R; r++) dw[r] = dup_dev(w, (size_t)wb), ds[r] = dup_dev(s, (size_t)sb);
        uint16_t *x = xmalloc(2 * (size_t)(4 * K));
        for (int64_t j = 0; j < 4 * K; j++) x[j] = di_f32_to_bf16((float)gauss());
        uint16_t *dx = dup_dev(x, 2 * (size_t)(4 * K)), *dy = dev_poisoned(2 * (size_t)(4 * N));
        uint8_t *xq = dev_poisoned((size_t)(4 * K)), *xs = dev_poisoned((size_t)(4 * K / 32));
        RUN(di_cuda_act_quant_fp8(dx, 4 * K, 32, xq, xs, st, E));
        double rd, by = (double)(wb + sb);
        BATCH(rd, R, di_cuda_stream_read(dw[r], wb, sink, st));
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
            const int64_t M = ms[mi];
            double t_cur, t8, t16;
            BATCH(t_cur, R, RUN(di_cuda_gemv_codes(gpu, 1, xq, xs, M, K, dw[r], ds[r], N, dy, E)));
            di_cuda_gemv_mma_set_tile(8);
            BATCH(t8, R, RUN(di_cuda_gemv_mma_codes(gpu, xq, xs, M, K, dw[r], ds[r], N, dy, E)));
            di_cuda_gemv_mma_set_tile(16);
            BATCH(t16, R, RUN(di_cuda_gemv_mma_codes(gpu, xq, xs, M, K, dw[r], ds[r], N, dy, E)));
            di_cuda_gemv_mma_set_tile(0);
            printf("bench gemv-mma fp4 %-12s N%-5lld K%-5lld M%lld | current %7.2f us %5.0f GB/s %5.1f %% | mma8 %7.2f us "
                   "%5.0f GB/s %5.1f %% | mma16 %7.2f us %5.0f GB/s %5.1f %% | read %6.2f us %5.0f GB/s | best speed-up %.2fx\n",
                   sh[i].name, (long long)N, (long long)K, (long long)M, GBS(t_cur), GBS(t8), GBS(t16), rd * 1e3,
                   by / (rd * 1e6), t_cur / (t8 < t16 ? t8 : t16));
        }
        for (int r = 0; r < R; r++) cudaFree(dw[r]), cudaFree(ds[r]);
        free(w), free(s), free(dw), free(ds), free(x), cudaFree(dx), cudaFree(dy), cudaFree(xq), cudaFree(xs);
    }
    cudaFree(sink);
}

/* moe_routed, 384 experts in memory (6.8 GB), 8 id sets per T rotated; µs per call, switch off / on */
static void bench_moe(void) {
    moe_experts(384);
    cudaStream_t st = (cudaStream_t)di_backend_cuda_stream(gpu);
    cudaEvent_t ev0, ev1;
    CU(cudaEventCreate(&ev0));
    CU(cudaEventCreate(&ev1));
    /* T tokens routed over the first ne experts: ne < 384 is a skewed step like bench gpu's B = 64 (54
     * experts), where some experts take tens of rows */
    static const int64_t ts[][2] = {{1, 384}, {5, 384}, {8, 384}, {16, 384}, {32, 384}, {64, 384},
                                    {64, 48}, {128, 96}, {256, 384}, {256, 96}};
    for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++) {
        const int64_t T = ts[ti][0];
        const int ne = (int)ts[ti][1];
        int32_t *dids[8];
        double experts = 0;
        for (int r = 0; r < 8; r++) {
            int32_t *ids = moe_ids(T, ne, 0);
            int seen[384] = {0};
            for (int64_t i = 0; i < T * MOE_K; i++) experts += !seen[ids[i]]++;
            dids[r] = dup_dev(ids, sizeof *ids * (size_t)(T * MOE_K));
            free(ids);
        }
        experts /= 8;
        float *wt = xmalloc(sizeof *wt * (size_t)(T * MOE_K));
        for (int64_t i = 0; i < T * MOE_K; i++) wt[i] = 0.1f;
        uint16_t *x = xmalloc(2 * (size_t)(T * MOE_D));
        for (int64_t i = 0; i < T * MOE_D; i++) x[i] = di_f32_to_bf16((float)gauss());
        uint16_t *dx = dup_dev(x, 2 * (size_t)(T * MOE_D));
        float *dwt = dup_dev(wt, sizeof *wt * (size_t)(T * MOE_K)), *dacc = dev_poisoned(4 * (size_t)(T * MOE_D));
        /* the CUDA-core GEMVs, the tensor-core GEMVs, then the GEMM for groups of ≥ 1, 2, 3, 5 rows */
        static const int mm_min[6] = {-1, -1, 1, 2, 3, 5};
        double t[6];
        for (int way = 0; way < 6; way++) {
            di_cuda_gemv_mma_set_enabled(way > 0);
            di_cuda_moe_set_mm(mm_min[way]);
            BATCH(t[way], 8, RUN(gpu->moe_routed(gpu, dx, T, MOE_D, MOE_I, dids[r], dwt, MOE_K, 384, g_ex, 10.0f, dacc, E)));
        }
        di_cuda_gemv_mma_set_enabled(1);
        di_cuda_moe_set_mm(0);
        const double by = experts * 3.0 * ((double)MOE_I * MOE_D / 2 + (double)MOE_I * MOE_D / 32);
        printf("bench moe_routed T%-3lld %.1f experts %5.0f MB | current %8.2f us %5.0f GB/s %5.1f %% | mma %8.2f us %5.0f GB/s "
               "%5.1f %% | mm>=1 %8.2f us %5.0f GB/s %5.1f %% | mm>=2 %8.2f | mm>=3 %8.2f | mm>=5 %8.2f us | best mm vs mma %.2fx\n",
               (long long)T, experts, by / 1e6, GBS(t[0]), GBS(t[1]), GBS(t[2]), t[3] * 1e3, t[4] * 1e3, t[5] * 1e3,
               t[1] / fmin(fmin(t[2], t[3]), fmin(t[4], t[5])));
        for (int r = 0; r < 8; r++) cudaFree(dids[r]);
        free(wt), free(x), cudaFree(dx), cudaFree(dwt), cudaFree(dacc);
    }
}

/* DI_BENCH=moe-profile: one moe_routed call at T 64 (DI_PROFILE_T: another T) over 48 experts (bench gpu's
 * B = 64 step), for Nsight Compute (-k regex:moe_); nothing is checked */
static void profile_moe(void) {
    moe_experts(384);
    const char *pt = getenv("DI_PROFILE_T");
    const int64_t T = pt && atoll(pt) > 0 ? atoll(pt) : 64;
    int32_t *ids = moe_ids(T, 48, 0);
    float *wt = xmalloc(sizeof *wt * (size_t)(T * MOE_K));
    for (int64_t i = 0; i < T * MOE_K; i++) wt[i] = 0.1f;
    uint16_t *x = xmalloc(2 * (size_t)(T * MOE_D));
    for (int64_t i = 0; i < T * MOE_D; i++) x[i] = di_f32_to_bf16((float)gauss());
    int32_t *dids = dup_dev(ids, sizeof *ids * (size_t)(T * MOE_K));
    uint16_t *dx = dup_dev(x, 2 * (size_t)(T * MOE_D));
    float *dwt = dup_dev(wt, sizeof *wt * (size_t)(T * MOE_K)), *dacc = dev_poisoned(4 * (size_t)(T * MOE_D));
    di_cuda_gemv_mma_set_enabled(1);
    RUN(gpu->moe_routed(gpu, dx, T, MOE_D, MOE_I, dids, dwt, MOE_K, 384, g_ex, 10.0f, dacc, E));
    CU(cudaDeviceSynchronize());
    printf("moe-profile: one moe_routed call, T %lld over 48 experts\n", (long long)T);
    free(ids), free(wt), free(x), cudaFree(dids), cudaFree(dx), cudaFree(dwt), cudaFree(dacc);
}

int main(void) {
    setenv("DI_CUDA_GEMV", "mma", 1); /* before the first linear_fp4: the switch is read once */
    if (di_cuda_device_count() < 1) {
        printf("no CUDA device\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(di_backend_cpu_create(16, &cpu, E));
    RUN(di_backend_cuda_create(0, &gpu, E));
    const char *bn = getenv("DI_BENCH");
    if (bn && !strcmp(bn, "moe-profile")) {
        profile_moe();
        di_backend_cuda_destroy(gpu);
        di_backend_destroy(cpu);
        return 0;
    }
    const int quick = getenv("DI_QUICK") != NULL;
    printf("%-44s %-34s %s\n", "check", "shape", "result");
    for (int64_t M = 1; M <= (quick ? 2 : 5); M++) {
        check_case("w1/w3", M, 2304, 5120, 0);
        check_case("w2", M, 5120, 2304, 0);
    }
    if (!quick) {
        check_case("w1/w3", 16, 2304, 5120, 0);
        check_case("w2", 16, 5120, 2304, 0);
        check_case("w1/w3", 3, 2304, 5120, 1);
        check_case("w2", 4, 5120, 2304, 1);
    }
    check_case("edge", 3, 37, 384, 0);
    check_case("edge", 1, 9, 128, 1);
    check_case("edge", 2, 37, 384, 1);
    check_moe(1, 0);
    if (!quick) {
        check_moe(5, 1);
        check_moe(16, 0);
        check_moe(64, 1);
        check_moe(9, 0);
        check_moe(23, 1);
        check_moe(256, 1);
    }
    if (bn && !quick) { /* DI_BENCH=moe: moe_routed's bench only */
        if (strcmp(bn, "moe")) bench();
        bench_moe();
    }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    di_backend_cuda_destroy(gpu);
    di_backend_destroy(cpu);
    return n_fail ? 1 : 0;
}
