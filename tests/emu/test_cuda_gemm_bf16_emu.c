/* The source of src/backend/cuda/cuda_gemm_bf16.cu — kernels and host launch logic — run on the host
 * (built with -DDI_CUDA_BF16_EMULATE, cuda_gemm_bf16_emu.h: blockDim.x real threads per launch meeting at
 * barriers for __syncthreads, shuffles and votes), bit for bit against the CPU ops, no GPU needed.
 * Every kernel (the slot's M split, the GEMV, the tiled kernel with and without the FMA fast path) on
 * linear_bf16 / linear_f32 / grouped shapes: K % 16 ≠ 0, K % 8 ≠ 0 (scalar loads), N and M off the
 * tiles, rows split over GEMV blocks, K spanning several 128-k stages and 1024-k chunks, and rows with
 * subnormals, 1e±30, ±1e37, ±inf, NaN, -0 and the FMA probe (tests/test_cuda_bf16_emu.c explains it),
 * which must make the flagged blocks multiply-then-add. Shapes stay small: 256 host threads per block.
 * Last line "N passed, N failed"; exit 1 on any failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_gemm_bf16.h"
#include "io/formats.h"
#include "util/threadpool.h"

#define EMU_SMS 132 /* cuda_gemm_bf16_emu.h's di_cuda_sm_count */

static int n_pass, n_fail;
static di_threadpool *tp;

static uint64_t rng = 0x5851F42D4C957F2Dull;
static uint64_t rnd(void) {
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}
static double gauss(void) {
    double u = (double)(rnd() >> 11) * 0x1p-53, v = (double)(rnd() >> 11) * 0x1p-53;
    return sqrt(-2 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}
static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

/* rows × k Gaussian; row r: specials, row r + 1: the FMA probe (is_w picks the w probe) */
static uint16_t *make_rows(int64_t rows, int64_t k, double sd, int64_t r, int is_w) {
    uint16_t *p = xmalloc(sizeof *p * (size_t)(rows * k));
    for (int64_t i = 0; i < rows * k; i++) p[i] = di_f32_to_bf16((float)(gauss() * sd));
    if (r >= 0 && r + 1 < rows && k >= 24) {
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
    return p;
}

/* outputs whose bits differ (NaN equals NaN) */
static int64_t mismatches(const void *g, const void *c, int64_t n, int esz) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *a = (const char *)g + i * esz, *b = (const char *)c + i * esz;
        if (!memcmp(a, b, (size_t)esz)) continue;
        float fa, fb;
        if (esz == 2) {
            uint16_t ha, hb;
            memcpy(&ha, a, 2), memcpy(&hb, b, 2);
            fa = di_bf16_to_f32(ha), fb = di_bf16_to_f32(hb);
        } else {
            memcpy(&fa, a, 4), memcpy(&fb, b, 4);
        }
        if (!(isnan(fa) && isnan(fb))) d++;
    }
    return d;
}

/* op 0 linear_bf16, 1 linear_f32, 2 grouped (G groups, N = R) */
static void run_case(int op, int64_t M, int G, int64_t K, int64_t N, int specials) {
    static const char *ops[] = {"linear_bf16", "linear_f32", "linear_grouped_bf16"};
    static const char *paths[] = {"auto", "auto-nofma", "gemv", "tiled", "tiled-nofma"};
    const int esz = op == 1 ? 4 : 2;
    const int64_t xrow = (int64_t)G * K, yrow = (int64_t)G * N;
    uint16_t *x = make_rows(M, xrow, 1.0, specials ? 1 : -1, 0), *w = make_rows((int64_t)G * N, K, 0.02, specials ? 3 : -1, 1);
    void *yc = xmalloc((size_t)(M * yrow * esz)), *yg = xmalloc((size_t)(M * yrow * esz));
    if (op == 0) di_cpu_linear_bf16(tp, M, N, K, x, K, w, K, yc, N);
    else if (op == 1) di_cpu_linear_bf16_f32(tp, M, N, K, x, K, w, K, yc, N);
    else di_cpu_wo_a_grouped(tp, M, G, K, N, x, w, yc);
    di_backend be;
    memset(&be, 0, sizeof be);
    for (int p = 0; p < 5; p++) {
        /* three distinct kernels per case: where the rule picks the tiled kernels auto is the tiled FMA
         * path and auto-nofma the tiled multiply-add one, elsewhere both are the GEMV: run auto, then the
         * two others */
        if (!di_bgemm_auto_gemv(M, N, G, EMU_SMS) ? p == DI_BGEMM_AUTO_NOFMA || p == DI_BGEMM_TILED
                                                             : p == DI_BGEMM_AUTO_NOFMA || p == DI_BGEMM_GEMV)
            continue;
        memset(yg, 0xA5, (size_t)(M * yrow * esz)); /* unwritten outputs show up as mismatches */
        di_error err;
        int rc = op == 2 ? di_cuda_bgemm(&be, ops[op], x, xrow, w, K, M, N, K, yg, NULL, yrow, G, K, N * K, N,
                                         (di_bgemm_path)p, &err)
                         : di_cuda_bgemm(&be, ops[op], x, K, w, K, M, N, K, op == 0 ? yg : NULL, op == 1 ? yg : NULL, N,
                                         1, 0, 0, 0, (di_bgemm_path)p, &err);
        int64_t d = rc ? -1 : mismatches(yg, yc, M * yrow, esz);
        printf("%-20s M%-4lld G%d K%-5lld N%-4lld%s %-12s %6lld mismatches  %s\n", ops[op], (long long)M, G, (long long)K,
               (long long)N, specials ? " +sp" : "    ", paths[p], (long long)d, d ? "FAIL" : "PASS");
        fflush(stdout);
        d ? n_fail++ : n_pass++;
    }
    free(x), free(w), free(yc), free(yg);
}

int main(void) {
    di_error err;
    if (di_threadpool_create(2, &tp, &err) != DI_OK) return 1;
    run_case(1, 130, 1, 200, 70, 1);  /* 3 × 3 tiled blocks, specials in the middle ones; K % 16 = 8 */
    run_case(0, 3, 1, 100, 37, 1);    /* K % 8 = 4: scalar loads; N off both tiles */
    run_case(1, 17, 1, 1030, 40, 1);  /* K % 16 = 6, one full and one partial 1024-chunk, 17 rows */
    run_case(2, 5, 3, 200, 40, 1);    /* grouped, K % 16 = 8 */
    run_case(2, 65, 2, 96, 33, 0);    /* grouped, one partial stage (K < 128 per stage), M 65 */
    run_case(1, 70, 1, 528, 36, 1);   /* four full stages and one of a single chunk; N off the tile */
    run_case(0, 1, 1, 5120, 20, 0);   /* decode: one row */
    run_case(1, 9, 1, 16, 16, 0);     /* K = 16: one chunk */
    run_case(1, 4, 1, 7, 5, 0);       /* tail only */
    printf("%d passed, %d failed\n", n_pass, n_fail);
    di_threadpool_destroy(tp);
    return n_fail ? 1 : 0;
}
