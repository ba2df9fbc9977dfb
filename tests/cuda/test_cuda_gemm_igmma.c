/* GPU test (and, with DI_BENCH=1, benchmark) of the exact FP8 / MXFP4 GEMM on the int8 wgmma
 * (src/backend/cuda/cuda_gemm_igmma.cu).
 *
 * 1. Exactness: every output against the CPU op (bit for bit; NaN counted as NaN: the CPU's NaN payloads
 *    differ from the GPU's canonical NaN) and against the int8 mma.sync GEMM (cuda_gemm_mma.cu, checked
 *    against the CPU elsewhere) where that one takes the shape (K a multiple of 64), at
 *    - edge shapes, FP8 and MXFP4: M 1 … 300 (tails of a 64-row warpgroup and of a 128-row tile), N 1 … 257
 *      (tails of a 64-column half, of a 128-column tile and of a 32-column FP8 scale group), K 32 … 4128
 *      (tails of a 4-block stage); with NaN / +inf x rows, a tiny x row, e4m3 NaN weight codes and scale
 *      bytes 0 / 254 / 255 (which also take the literal scale sequence); y at an odd bf16 offset;
 *    - the V4.1 linear shapes (spec §2.4) at M 33, 64, 128, 256 and 1000 (FP8) and the expert shapes (MXFP4);
 *    - every case with 64-row tiles forced against 128-row tiles forced (a 64-row tile, or the last ≤ 64
 *      rows of a 128-row launch, runs each column half on its own consumer warpgroup).
 * 2. The linear_fp8 / linear_fp4 slot with the kernel on against the slot with it off (NaN class).
 * 2c. Grouped launches (the prefill experts) against the dense kernel per expert, bit for bit (check_grouped).
 * 3. Refusals: M 0, N 0, K 48, misaligned w / xd / xq.
 * 2b. The kernel with the fused scale sequence against the literal one (every stage forced), bit for bit.
 * 4. DI_BENCH=1: ms per call and TFLOP/s at the V4.1 shapes for M 64 … 8192 (DI_BENCH_M="16,32,…" picks
 *    others): the int8 mma.sync GEMM, the FP64-core GEMM (FP8 up to 64 rows) and this kernel with 128- and
 *    64-row tiles on the same act-quantized rows (pre-pass included), best of 5 batches.
 * Usage: test_cuda_gemm_igmma; DI_BENCH=1 adds the bench; DI_QUICK=1 only the edge shapes (and the bench); DI_PROFILE=1 only
 * one launch per format (for Nsight Compute; DI_PROFILE_M: the FP8 launch's rows). Last line
 * "N passed, N failed"; exit status 1 on any failure. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_gemm_dmma.h"
#include "backend/cuda/cuda_gemm_igmma.h"
#include "backend/cuda/cuda_gemm_mma.cuh" /* the int8 mma.sync GEMM: the reference on the GPU */
#include "backend/cuda/cuda_ops.h"
#include "io/formats.h"
#include "cuda_testutil.h"

static di_backend *cpu, *gpu;
static int n_fail, n_pass;
static di_error g_err;
#define E (&g_err)

static uint64_t rng = 0x13A9C7E5D2F08B46ull;
static uint64_t rnd(void) { return ct_xorshift(&rng); }
static double gauss(void) { return ct_gauss(&rng); }

static void row(const char *what, const char *shape, int64_t bad, int64_t n) {
    printf("%-46s %-40s %s  %lld of %lld outputs differ\n", what, shape, bad ? "FAIL" : "PASS", (long long)bad, (long long)n);
    if (bad) n_fail++;
    else n_pass++;
}
static void check(const char *what, const char *shape, int ok) {
    printf("%-46s %-40s %s\n", what, shape, ok ? "PASS" : "FAIL");
    if (ok) n_pass++;
    else n_fail++;
}


typedef struct weights {
    int64_t wb, sb; /* bytes of the weights and of their scales */
    uint8_t *w, *ws;
} weights;

/* FP8: e4m3 [N, K] + E8M0 [ceil(N/32), K/32]; MXFP4: E2M1 [N, K/2] + E8M0 [N, K/32]. special: NaN codes
 * (FP8) and scale bytes 0 / 254 / 255 */
static weights make_weights(int fp4, int64_t N, int64_t K, int special) {
    weights t;
    t.wb = fp4 ? N * K / 2 : N * K, t.sb = (fp4 ? N : (N + 31) / 32) * (K / 32);
    t.w = xmalloc((size_t)t.wb), t.ws = xmalloc((size_t)t.sb);
    for (int64_t i = 0; i < t.wb; i++) t.w[i] = fp4 ? (uint8_t)rnd() : ct_e4m3_code(&rng); /* NaN codes only where special */
    for (int64_t i = 0; i < t.sb; i++) t.ws[i] = (uint8_t)(118 + rnd() % 8);
    if (special) {
        if (!fp4)
            for (int64_t n = 0; n < N; n += 7) t.w[n * K + (n * 13) % K] = n % 2 ? 0x7f : 0xff;
        for (int64_t i = 0; i < t.sb; i += 5) t.ws[i] = i % 3 == 0 ? 0 : i % 3 == 1 ? 254 : 255;
    }
    return t;
}

static void check_case(int fp4, int64_t M, int64_t N, int64_t K, int special, int with_cpu) {
    uint16_t *x = xmalloc(2 * (size_t)(M * K));
    for (int64_t i = 0; i < M * K; i++) x[i] = di_f32_to_bf16((float)(gauss() * (i % 5 == 0 ? 30.0 : 1.0)));
    if (special) {
        x[(37 * 7) % K] = 0x7fc0;                  /* row 0: a NaN group */
        if (M > 1) x[K + (64 + 11) % K] = 0x7f80;  /* row 1: a +inf group */
        x[(M - 1) * K + (K / 2 + 5) % K] = 0xffc0; /* the last row: a NaN group */
        if (M > 3) /* row 2 tiny: x scales below 2^-50 take the literal scale sequence too */
            for (int64_t i = 2 * K; i < 3 * K; i++) x[i] = di_f32_to_bf16(di_bf16_to_f32(x[i]) * 1e-25f);
    }
    weights t = make_weights(fp4, N, K, special);
    char sh[80];
    snprintf(sh, sizeof sh, "%s M%lld N%lld K%lld%s", fp4 ? "fp4" : "fp8", (long long)M, (long long)N, (long long)K,
             special ? " +NaN/inf" : "");
    uint16_t *y_cpu = NULL;
    if (with_cpu) {
        y_cpu = xmalloc(2 * (size_t)(M * N));
        if (fp4) RUN(cpu->linear_fp4(cpu, x, M, K, t.w, t.ws, N, y_cpu, E));
        else RUN(cpu->linear_fp8(cpu, x, M, K, t.w, t.ws, N, y_cpu, E));
    }
    void *st = di_backend_cuda_stream(gpu);
    uint16_t *dx = dup_dev(x, 2 * (size_t)(M * K)), *dy = dev_poisoned(2 * (size_t)(M * N));
    uint8_t *dw = dup_dev(t.w, (size_t)t.wb), *dws = dup_dev(t.ws, (size_t)t.sb);
    uint8_t *xq = dev_poisoned((size_t)(M * K)), *xs = dev_poisoned((size_t)(M * (K / 32)));
    uint8_t *xd = dev_poisoned((size_t)di_cuda_gemm_igmma_scratch(M, K));
    RUN(di_cuda_act_quant_fp8(dx, M * K, 32, xq, xs, st, E));

    RUN(di_cuda_gemm_igmma_run(fp4, xq, xs, M, K, dw, dws, N, dy, xd, st, E));
    uint16_t *y_ig = ct_down(dy, 2 * (size_t)(M * N));
    if (with_cpu) row("igmma vs CPU (NaN class)", sh, ct_bf16_diff(y_ig, y_cpu, M * N, 1), M * N);
    /* the same call in the kernel's other forms, bit for bit: every stage through the conversion instruction
     * and the literal scale sequence (against the default); 64-row tiles (one x half per tile) against 128-row
     * ones (two, but for a last tile of ≤ 64 rows): different paths whenever M > 64, and each the rule's choice
     * somewhere, so both are also checked through y_ig against the CPU */
    uint16_t *y_f[3];
    for (int form = 0; form < 3; form++) {
        if (form == 0) di_cuda_gemm_igmma_set_literal(1);
        else di_cuda_gemm_igmma_set_tile_rows(64 * form);
        CU(cudaMemset(dy, 0xA5, 2 * (size_t)(M * N)));
        RUN(di_cuda_gemm_igmma_run(fp4, xq, xs, M, K, dw, dws, N, dy, xd, st, E));
        di_cuda_gemm_igmma_set_literal(0), di_cuda_gemm_igmma_set_tile_rows(0);
        y_f[form] = ct_down(dy, 2 * (size_t)(M * N));
    }
    row("igmma fused vs literal scale sequence", sh, ct_bf16_diff(y_ig, y_f[0], M * N, 1), M * N);
    row("igmma 64-row vs 128-row tiles", sh, ct_bf16_diff(y_f[1], y_f[2], M * N, 1), M * N);
    free(y_f[0]), free(y_f[1]), free(y_f[2]);
    if (di_cuda_gemm_mma_fits(M, K, dw)) {
        uint8_t *gd = dev_poisoned((size_t)di_cuda_gemm_mma_scratch(fp4, M, K, N));
        CU(cudaMemset(dy, 0xA5, 2 * (size_t)(M * N)));
        RUN(di_cuda_gemm_mma_run(fp4, xq, xs, M, K, dw, dws, N, dy, gd, st, E));
        uint16_t *y_gmm = ct_down(dy, 2 * (size_t)(M * N));
        row("igmma vs int8 mma.sync GEMM (NaN class)", sh, ct_bf16_diff(y_ig, y_gmm, M * N, 1), M * N);
        free(y_gmm), cudaFree(gd);
    }
    /* the slot, kernel on (where its rule takes M) and off */
    uint16_t *y_slot[2];
    for (int on = 0; on < 2; on++) {
        di_cuda_gemm_igmma_set_enabled(on);
        CU(cudaMemset(dy, 0xA5, 2 * (size_t)(M * N)));
        if (fp4) RUN(gpu->linear_fp4(gpu, dx, M, K, dw, dws, N, dy, E));
        else RUN(gpu->linear_fp8(gpu, dx, M, K, dw, dws, N, dy, E));
        y_slot[on] = ct_down(dy, 2 * (size_t)(M * N));
    }
    di_cuda_gemm_igmma_set_enabled(1);
    row("slot (igmma on) vs off (NaN class)", sh, ct_bf16_diff(y_slot[1], y_slot[0], M * N, 1), M * N);
    if (N % 2 == 0) { /* y at an odd bf16 offset: the paired 32-bit stores must not be taken */
        uint16_t *dyo = dev_poisoned(2 * (size_t)(M * N + 1));
        RUN(di_cuda_gemm_igmma_run(fp4, xq, xs, M, K, dw, dws, N, dyo + 1, xd, st, E));
        uint16_t *yo = ct_down(dyo, 2 * (size_t)(M * N + 1));
        row("igmma, y 2 bytes off 4-byte alignment", sh, ct_bf16_diff(yo + 1, y_ig, M * N, 1), M * N);
        free(yo), cudaFree(dyo);
    }
    free(y_slot[0]), free(y_slot[1]), free(y_ig), free(y_cpu), free(x), free(t.w), free(t.ws);
    cudaFree(dx), cudaFree(dy), cudaFree(dw), cudaFree(dws), cudaFree(xq), cudaFree(xs), cudaFree(xd);
}

/* Grouped launches: experts with 0, 1, 127, 128, 129, 300, 0 and 64 rows of one act-quantized x; every
 * expert's rows against the dense kernel on that expert alone, bit for bit — in one launch, in launches of
 * 2 row tiles, and for a second weight set over the same digit planes (xq NULL) */
static void check_grouped(int fp4, int64_t N, int64_t K) {
    enum { NE = 8 };
    static const int64_t cnt[NE] = {0, 1, 127, 128, 129, 300, 0, 64};
    int64_t start[NE + 1] = {0};
    for (int e = 0; e < NE; e++) start[e + 1] = start[e] + cnt[e];
    const int64_t M = start[NE];
    uint16_t *x = xmalloc(2 * (size_t)(M * K));
    for (int64_t i = 0; i < M * K; i++) x[i] = di_f32_to_bf16((float)(gauss() * (i % 7 == 0 ? 20.0 : 1.0)));
    void *st = di_backend_cuda_stream(gpu);
    uint16_t *dx = dup_dev(x, 2 * (size_t)(M * K)), *dy = dev_poisoned(2 * (size_t)(M * N)), *dr = dev_poisoned(2 * (size_t)(M * N));
    uint8_t *xq = dev_poisoned((size_t)(M * K)), *xs = dev_poisoned((size_t)(M * (K / 32)));
    uint8_t *xd = dev_poisoned((size_t)di_cuda_gemm_igmma_scratch(M, K)), *xd1 = dev_poisoned((size_t)di_cuda_gemm_igmma_scratch(300, K));
    RUN(di_cuda_act_quant_fp8(dx, M * K, 32, xq, xs, st, E));
    const uint8_t *w[2][NE], *ws[2][NE];
    uint8_t *own[2][NE][2];
    for (int set = 0; set < 2; set++)
        for (int e = 0; e < NE; e++) {
            weights t = make_weights(fp4, N, K, e == 3);
            own[set][e][0] = dup_dev(t.w, (size_t)t.wb), own[set][e][1] = dup_dev(t.ws, (size_t)t.sb);
            w[set][e] = own[set][e][0], ws[set][e] = own[set][e][1];
            free(t.w), free(t.ws);
        }
    /* the reference: each expert alone, per weight set */
    uint16_t *ref[2];
    for (int set = 0; set < 2; set++) {
        for (int e = 0; e < NE; e++)
            if (cnt[e])
                RUN(di_cuda_gemm_igmma_run(fp4, xq + start[e] * K, xs + start[e] * (K / 32), cnt[e], K, w[set][e], ws[set][e], N,
                                           dr + start[e] * N, xd1, st, E));
        ref[set] = ct_down(dr, 2 * (size_t)(M * N));
    }
    char sh[80];
    snprintf(sh, sizeof sh, "%s N%lld K%lld, 8 experts %lld rows", fp4 ? "fp4" : "fp8", (long long)N, (long long)K, (long long)M);
    for (int cap = 0; cap < 2; cap++) {
        di_cuda_gemm_igmma_set_group_tiles(cap ? 2 : 0);
        for (int set = 0; set < 2; set++) {
            CU(cudaMemset(dy, 0xA5, 2 * (size_t)(M * N)));
            RUN(di_cuda_gemm_igmma_grouped(fp4, set ? NULL : xq, xs, K, NE, start, w[set], ws[set], N, dy, xd, st, E));
            uint16_t *y = ct_down(dy, 2 * (size_t)(M * N));
            char what[80];
            snprintf(what, sizeof what, "grouped vs per expert (%s%s)", set ? "second set, planes reused" : "first set",
                     cap ? ", 2 tiles per launch" : "");
            row(what, sh, ct_bf16_diff(y, ref[set], M * N, 1), M * N);
            free(y);
        }
    }
    di_cuda_gemm_igmma_set_group_tiles(0);
    check("grouped: rows out of order refused", sh,
          di_cuda_gemm_igmma_grouped(fp4, xq, xs, K, 2, (const int64_t[]){0, 5, 3}, w[0], ws[0], N, dy, xd, st, E) != DI_OK);
    for (int set = 0; set < 2; set++)
        for (int e = 0; e < NE; e++) cudaFree(own[set][e][0]), cudaFree(own[set][e][1]);
    free(ref[0]), free(ref[1]), free(x);
    cudaFree(dx), cudaFree(dy), cudaFree(dr), cudaFree(xq), cudaFree(xs), cudaFree(xd), cudaFree(xd1);
}

/* calls the kernel cannot take are refused with an error, not run */
static void check_refusals(void) {
    uint8_t *xq = dev_poisoned(8 * 512 + 16), *xs = dev_poisoned(8 * 16), *dw = dev_poisoned(64 * 512 + 16);
    uint8_t *dws = dev_poisoned(64 * 16), *xd = dev_poisoned(3 * 8 * 512 + 16);
    uint16_t *dy = dev_poisoned(2 * 8 * 64);
    void *st = di_backend_cuda_stream(gpu);
    check("refused: M 0", "", di_cuda_gemm_igmma_run(0, xq, xs, 0, 512, dw, dws, 64, dy, xd, st, E) != DI_OK);
    check("refused: N 0", "", di_cuda_gemm_igmma_run(0, xq, xs, 8, 512, dw, dws, 0, dy, xd, st, E) != DI_OK);
    check("refused: K 48 (not a multiple of 32)", "", di_cuda_gemm_igmma_run(1, xq, xs, 8, 48, dw, dws, 64, dy, xd, st, E) != DI_OK);
    check("refused: w not 16-byte aligned", "", di_cuda_gemm_igmma_run(0, xq, xs, 8, 512, dw + 8, dws, 64, dy, xd, st, E) != DI_OK);
    check("refused: xd not 16-byte aligned", "", di_cuda_gemm_igmma_run(0, xq, xs, 8, 512, dw, dws, 64, dy, xd + 4, st, E) != DI_OK);
    check("refused: xq not 4-byte aligned", "", di_cuda_gemm_igmma_run(0, xq + 2, xs, 8, 512, dw, dws, 64, dy, xd, st, E) != DI_OK);
    check("no CUDA error left pending", "", cudaDeviceSynchronize() == cudaSuccess && cudaGetLastError() == cudaSuccess);
    cudaFree(xq), cudaFree(xs), cudaFree(dw), cudaFree(dws), cudaFree(xd), cudaFree(dy);
}

static void bench(void) {
    static const struct { const char *name; int fp4; int64_t n, k; } sh[] = {
        {"engram proj", 0, 25600, 6144}, {"wo_b", 0, 5120, 8192},     {"wq_b", 0, 32768, 1280},
        {"k5120 n2304", 0, 2304, 5120},  {"k2304 n5120", 0, 5120, 2304}, {"k5120 n1280", 0, 1280, 5120},
        {"expert w1", 1, 2304, 5120},    {"expert w2", 1, 5120, 2304}};
    int64_t ms[16] = {64, 128, 256, 512, 1024, 2048, 8192};
    size_t nms = 7;
    if (getenv("DI_BENCH_M")) { /* e.g. "16,32,64,128": the row counts to time */
        nms = 0;
        for (const char *c = getenv("DI_BENCH_M"); *c && nms < 16;) {
            char *e;
            const long long v = strtoll(c, &e, 10);
            if (e == c || v < 1 || v > 8192) break;
            ms[nms++] = v;
            c = *e == ',' ? e + 1 : e;
        }
    }
    cudaStream_t st = (cudaStream_t)di_backend_cuda_stream(gpu);
    cudaEvent_t ev0, ev1;
    CU(cudaEventCreate(&ev0));
    CU(cudaEventCreate(&ev1));
    printf("\n# bench (ms per call, best of 5 batches; every kernel on the same act-quantized rows, their x pre-pass\n"
           "# included): gmm = the int8 mma.sync GEMM, dmma = the FP64-core GEMM (FP8, M <= 64), ig128 / ig64 = the int8\n"
           "# wgmma GEMM with 128- / 64-row tiles, ig = its rule's choice; TFLOP/s counts 2·M·N·K; slot = what linear_fp8/fp4 takes\n");
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) {
        const int fp4 = sh[i].fp4;
        const int64_t N = sh[i].n, K = sh[i].k, MM = 8192;
        weights t = make_weights(fp4, N, K, 0);
        uint8_t *dw = dup_dev(t.w, (size_t)t.wb), *dws = dup_dev(t.ws, (size_t)t.sb);
        uint16_t *x = xmalloc(2 * (size_t)(MM * K));
        for (int64_t j = 0; j < MM * K; j++) x[j] = di_f32_to_bf16((float)gauss());
        uint16_t *dx = dup_dev(x, 2 * (size_t)(MM * K)), *dy = dev_poisoned(2 * (size_t)(MM * N));
        uint8_t *xq = dev_poisoned((size_t)(MM * K)), *xs = dev_poisoned((size_t)(MM * K / 32));
        uint8_t *xd = dev_poisoned((size_t)di_cuda_gemm_igmma_scratch(MM, K));
        RUN(di_cuda_act_quant_fp8(dx, MM * K, 32, xq, xs, st, E));
        for (size_t a = 0; a < nms; a++) {
            const int64_t M = ms[a];
            const int R = M >= 2048 ? 2 : 8;
            uint8_t *gd = dev_poisoned((size_t)di_cuda_gemm_mma_scratch(fp4, M, K, N));
            double t_g, t_d = 0, t_i, t_i128, t_i64;
            BATCH(t_g, R, RUN(di_cuda_gemm_mma_run(fp4, xq, xs, M, K, dw, dws, N, dy, gd, st, E)));
            if (!fp4 && M <= 64 && di_cuda_gemm_dmma_fits(M, K, dw))
                BATCH(t_d, R, RUN(di_cuda_gemm_dmma_run(xq, xs, M, K, dw, dws, N, dy, st, E)));
            BATCH(t_i, R, RUN(di_cuda_gemm_igmma_run(fp4, xq, xs, M, K, dw, dws, N, dy, xd, st, E)));
            di_cuda_gemm_igmma_set_tile_rows(128);
            BATCH(t_i128, R, RUN(di_cuda_gemm_igmma_run(fp4, xq, xs, M, K, dw, dws, N, dy, xd, st, E)));
            di_cuda_gemm_igmma_set_tile_rows(64);
            BATCH(t_i64, R, RUN(di_cuda_gemm_igmma_run(fp4, xq, xs, M, K, dw, dws, N, dy, xd, st, E)));
            di_cuda_gemm_igmma_set_tile_rows(0);
            const double fl = 2.0 * (double)M * (double)N * (double)K;
            printf("bench gemm_igmma %-12s %s N%-5lld K%-5lld M%-5lld | gmm %8.3f | dmma %8.3f | ig128 %8.3f | ig64 %8.3f | "
                   "ig %8.3f ms %6.1f TFLOP/s | ig %.2fx gmm | slot %s\n",
                   sh[i].name, fp4 ? "fp4" : "fp8", (long long)N, (long long)K, (long long)M, t_g, t_d, t_i128, t_i64, t_i,
                   fl / (t_i * 1e9), t_g / t_i,
                   !fp4 && di_cuda_gemm_dmma_wants(M, K, N, dw) ? "dmma" : di_cuda_gemm_igmma_wants(fp4, M, K, N) ? "ig" : "other");
            cudaFree(gd);
        }
        free(t.w), free(t.ws), free(x), cudaFree(dw), cudaFree(dws), cudaFree(dx), cudaFree(dy), cudaFree(xq),
            cudaFree(xs), cudaFree(xd);
    }
}

static void profile_one(int fp4, int64_t M, int64_t N, int64_t K) {
    weights t = make_weights(fp4, N, K, 0);
    uint8_t *dw = dup_dev(t.w, (size_t)t.wb), *dws = dup_dev(t.ws, (size_t)t.sb);
    uint16_t *x = xmalloc(2 * (size_t)(M * K));
    for (int64_t j = 0; j < M * K; j++) x[j] = di_f32_to_bf16((float)gauss());
    void *st = di_backend_cuda_stream(gpu);
    uint16_t *dx = dup_dev(x, 2 * (size_t)(M * K)), *dy = dev_poisoned(2 * (size_t)(M * N));
    uint8_t *xq = dev_poisoned((size_t)(M * K)), *xs = dev_poisoned((size_t)(M * K / 32));
    uint8_t *xd = dev_poisoned((size_t)di_cuda_gemm_igmma_scratch(M, K));
    RUN(di_cuda_act_quant_fp8(dx, M * K, 32, xq, xs, st, E));
    RUN(di_cuda_gemm_igmma_run(fp4, xq, xs, M, K, dw, dws, N, dy, xd, st, E));
    CU(cudaDeviceSynchronize());
    free(t.w), free(t.ws), free(x), cudaFree(dw), cudaFree(dws), cudaFree(dx), cudaFree(dy), cudaFree(xq), cudaFree(xs),
        cudaFree(xd);
}

int main(void) {
    if (di_cuda_device_count() < 1) {
        printf("no CUDA device\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(di_backend_cpu_create(16, &cpu, E));
    RUN(di_backend_cuda_create(0, &gpu, E));
    const int quick = getenv("DI_QUICK") != NULL;
    if (getenv("DI_PROFILE")) { /* one launch each for a profiler: FP8 N25600 K6144 M2048 (or DI_PROFILE_M rows),
                                * MXFP4 N2304 K5120 M8192 */
        const long long pm = getenv("DI_PROFILE_M") ? atoll(getenv("DI_PROFILE_M")) : 2048;
        profile_one(0, pm >= 1 && pm <= 8192 ? pm : 2048, 25600, 6144);
        profile_one(1, 8192, 2304, 5120);
        printf("0 passed, 0 failed\n");
        return 0;
    }
    printf("%-46s %-40s %s\n", "check", "shape", "result");
    static const int64_t edge[][3] = {{1, 32, 0},   {37, 96, 1},  {64, 128, 0},   {129, 544, 1},
                                      {200, 4128, 1}, {257, 160, 0}, {128, 1024, 1}};
    static const int64_t edge_m[] = {1, 2, 63, 64, 65, 127, 128, 129, 200, 300};
    for (int fp4 = 0; fp4 < 2; fp4++)
        for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
            for (size_t j = 0; j < sizeof edge_m / sizeof edge_m[0]; j++)
                check_case(fp4, edge_m[j], edge[i][0], edge[i][1], (int)edge[i][2], 1);
    if (!quick) {
        static const struct { int fp4; int64_t n, k; } real[] = {
            {0, 25600, 6144}, {0, 5120, 8192}, {0, 32768, 1280}, {0, 2304, 5120}, {0, 5120, 2304},
            {0, 1280, 5120},  {0, 512, 5120},  {0, 4096, 1280},  {1, 2304, 5120}, {1, 5120, 2304}};
        static const int64_t real_m[] = {33, 64, 128, 256, 1000};
        for (size_t i = 0; i < sizeof real / sizeof real[0]; i++)
            for (size_t j = 0; j < sizeof real_m / sizeof real_m[0]; j++)
                check_case(real[i].fp4, real_m[j], real[i].n, real[i].k, real_m[j] == 1000, real[i].n * real[i].k <= 12000000);
    }
    for (int fp4 = 0; fp4 < 2; fp4++) check_grouped(fp4, 200, 544), check_grouped(fp4, 384, 2304);
    check_refusals();
    if (getenv("DI_BENCH")) bench(); /* with DI_QUICK=1: after the edge shapes only */
    printf("%d passed, %d failed\n", n_pass, n_fail);
    di_backend_cuda_destroy(gpu);
    di_backend_destroy(cpu);
    return n_fail ? 1 : 0;
}
