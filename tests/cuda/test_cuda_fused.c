/* GPU test of the fused slots (backend.h hc_pre, gather_topk; src/backend/cuda/cuda_fused.cu):
 *  1. hc_pre at the V4.1 shape (hc 4, D 5120, Sinkhorn 20 iterations) for M = 1, 5, 64, with and without
 *     the expand prologue and the deferred pre-mix: every output BIT-IDENTICAL to the unfused CUDA
 *     sequence (expand, mixes, sinkhorn, collapse, rmsnorm), the split launch (one block per mix, the
 *     last one finishing the token) equal to the one-block-per-token launch, a token's outputs equal
 *     alone and inside a batch of 64; against the CPU (di_cpu_hc_pre): streams, mixes and the deferred
 *     h exact, Sinkhorn outputs within 16 f32 ulp (glibc expf vs correctly rounded, as test_cuda_ops);
 *  2. gather_topk on FP4-E4M3 compressed rows (hd 512, top-k 512, contiguous and paged tables, −1 and
 *     out-of-range ids) against di_cpu_gather_topk, exact;
 *  3. the forward on the CUDA backend with the fused slots against the same backend with them
 *     removed, on the golden tiny models (prompt, decode steps, batched steps; own-arena and paged
 *     device caches): logits bit-identical;
 *     and at prefill shapes (M 512, 4096; split and token launches) fused == unfused CUDA, bit for bit;
 *  4. timings (CUDA events, median of 51 after warm-up): one decode step's mHC chains fused vs unfused,
 *     and the device gather vs the host-planned gather it replaces (download + union + upload + decode,
 *     host wall clock including the synchronisation).
 * Usage: [DI_SEED=n] test_cuda_fused   (run from the repository root: tests/data; exit 1 on a failure) */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_attn.h"
#include "backend/cpu/cpu_fused.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_fused.h"
#include "backend/cuda/cuda_ops.h"
#include "io/formats.h"
#include "model/cache_pool.h"
#include "model/session.h"
#include "model/weights.h"
#include "cuda_testutil.h"

static di_backend *gpu;
static cudaEvent_t ev0, ev1;
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
static void put(void *d, const void *h, size_t n) {
    CU(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    CU(cudaDeviceSynchronize());
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void) { return ct_xorshift(&rng); }
static double unif(void) { return (double)(rnd() >> 11) * 0x1p-53; }
static double gauss(void) { return sqrt(-2 * log(unif() + 1e-300)) * cos(6.283185307179586 * unif()); }
static uint16_t *rand_bf16(int64_t n, double sd) {
    uint16_t *p = xmalloc(sizeof *p * (size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = di_f32_to_bf16((float)(gauss() * sd));
    return p;
}
static float *rand_f32(int64_t n, double mean, double sd) {
    float *p = xmalloc(sizeof *p * (size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = (float)(mean + gauss() * sd);
    return p;
}

/* ---------------- comparison rows ---------------- */

/* Distance in ulps between two finite floats of the same type (ordered integer keys). */
static int64_t key32(float f) {
    int32_t i;
    memcpy(&i, &f, 4);
    return i < 0 ? (int64_t)INT32_MIN - i : i;
}
static int64_t key16(uint16_t b) {
    int16_t i = (int16_t)b;
    return i < 0 ? (int64_t)INT16_MIN - i : i;
}

/* Compares n values (f32 when bf16 == 0, else bf16 bit patterns, or raw int32 when ints) and prints a
 * row: max ulp, mismatch fraction, tolerance (max_ulp, max_frac), PASS/FAIL. */
static void row(const char *op, const char *shape, const void *got, const void *want, int64_t n, int kind,
                int64_t max_ulp, double max_frac, const char *tol, double us) {
    int64_t worst = 0, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t d;
        if (kind == 0) d = llabs(key32(((const float *)got)[i]) - key32(((const float *)want)[i]));
        else if (kind == 1) d = llabs(key16(((const uint16_t *)got)[i]) - key16(((const uint16_t *)want)[i]));
        else d = ((const int32_t *)got)[i] != ((const int32_t *)want)[i] ? INT32_MAX : 0;
        if (d) bad++;
        if (d > worst) worst = d;
    }
    double frac = n ? (double)bad / (double)n : 0;
    bool ok = worst <= max_ulp && frac <= max_frac;
    char ulp[32], t[32];
    if (kind == 2) snprintf(ulp, sizeof ulp, "-");
    else snprintf(ulp, sizeof ulp, "%lld", (long long)worst);
    if (us >= 0) snprintf(t, sizeof t, "%.1f", us);
    else snprintf(t, sizeof t, "-");
    printf("%-24s %-44s %6s %10.3g  %-22s %9s  %s\n", op, shape, ulp, frac, tol, t, ok ? "PASS" : "FAIL");
    ok ? n_pass++ : n_fail++;
}
#define EXACT 0, 0.0, "exact"
#define SINK 16, 1.0, "<=16 f32 ulp (libm)"

/* Median GPU time in µs of `call` over 51 runs after 3 warm-up runs. */
static int cmp_f(const void *a, const void *b) { return (*(const float *)a > *(const float *)b) - (*(const float *)a < *(const float *)b); }
#define TIME_US(out, call)                                                                                           \
    do {                                                                                                             \
        cudaStream_t s_ = (cudaStream_t)di_backend_cuda_stream(gpu);                                                 \
        float t_[51];                                                                                                \
        for (int r_ = 0; r_ < 3; r_++) RUN(call);                                                                    \
        for (int r_ = 0; r_ < 51; r_++) {                                                                            \
            CU(cudaEventRecord(ev0, s_));                                                                            \
            RUN(call);                                                                                               \
            CU(cudaEventRecord(ev1, s_));                                                                            \
            CU(cudaEventSynchronize(ev1));                                                                           \
            CU(cudaEventElapsedTime(&t_[r_], ev0, ev1));                                                             \
        }                                                                                                            \
        qsort(t_, 51, sizeof(float), cmp_f);                                                                         \
        (out) = 1000.0 * t_[25];                                                                                     \
    } while (0)

/* ---------------- 1. hc_pre ---------------- */

enum { HC = 4, D = 5120, NMIX = (2 + HC) * HC, ITERS = 20, MMAX = 64 };
static const float NORM_EPS = 1e-6f, HC_EPS = 1e-6f;

typedef struct pre_in_h { /* host inputs of the largest case; smaller M use the first rows */
    uint16_t *x, *z, *nw;   /* bf16 [MMAX, HC, D], [MMAX, D], [D] */
    float *fn, *base, scale[3], *post_in, *comb_in, *pre_in; /* f32 [NMIX, HC·D], [NMIX], [3], [MMAX, HC], [MMAX, HC, HC], [MMAX, HC] */
} pre_in_h;

typedef struct pre_dev { /* device buffers of one run */
    uint16_t *x, *z, *nw, *h;
    float *fn, *base, *scale, *post_in, *comb_in, *pre_in, *mixes, *pre, *post, *comb;
} pre_dev;

typedef struct pre_out_h { uint16_t *x, *h; float *mixes, *pre, *post, *comb; } pre_out_h;

static void pre_upload(const pre_in_h *in, pre_dev *d) {
    d->x = dup_dev(in->x, sizeof(uint16_t) * MMAX * HC * D);
    d->z = dup_dev(in->z, sizeof(uint16_t) * MMAX * D);
    d->nw = dup_dev(in->nw, sizeof(uint16_t) * D);
    d->fn = dup_dev(in->fn, sizeof(float) * NMIX * HC * D);
    d->base = dup_dev(in->base, sizeof(float) * NMIX);
    d->scale = dup_dev(in->scale, sizeof(float) * 3);
    d->post_in = dup_dev(in->post_in, sizeof(float) * MMAX * HC);
    d->comb_in = dup_dev(in->comb_in, sizeof(float) * MMAX * HC * HC);
    d->pre_in = dup_dev(in->pre_in, sizeof(float) * MMAX * HC);
    d->h = dev_poisoned(sizeof(uint16_t) * MMAX * D);
    d->mixes = dev_poisoned(sizeof(float) * MMAX * NMIX);
    d->pre = dev_poisoned(sizeof(float) * MMAX * HC);
    d->post = dev_poisoned(sizeof(float) * MMAX * HC);
    d->comb = dev_poisoned(sizeof(float) * MMAX * HC * HC);
}

static int fused_call(pre_dev *d, int64_t m, int64_t t0, bool expand, bool deferred) {
    return di_cuda_hc_pre(gpu, d->x + t0 * HC * D, expand ? d->z + t0 * D : NULL, d->post_in + t0 * HC,
                          d->comb_in + t0 * HC * HC, m, HC, D, d->fn, NORM_EPS, d->scale, d->base, ITERS, HC_EPS,
                          deferred ? d->pre_in + t0 * HC : NULL, d->nw, d->mixes, d->pre, d->post, d->comb, d->h, E);
}

static int unfused_call(pre_dev *d, int64_t m, bool expand, bool deferred) {
    int rc = expand ? di_cuda_hc_expand(gpu, d->z, d->x, d->post_in, d->comb_in, m, HC, D, d->x, E) : DI_OK;
    if (!rc) rc = di_cuda_hc_mixes(gpu, d->x, m, HC, D, d->fn, NORM_EPS, d->mixes, E);
    if (!rc) rc = di_cuda_hc_sinkhorn(gpu, d->mixes, m, HC, d->scale, d->base, ITERS, HC_EPS, d->pre, d->post, d->comb, E);
    if (!rc) rc = di_cuda_hc_collapse(gpu, d->x, deferred ? d->pre_in : d->pre, m, HC, D, d->h, E);
    if (!rc) rc = di_cuda_rmsnorm(gpu, d->h, m, D, d->nw, NORM_EPS, d->h, E);
    return rc;
}

static pre_out_h pre_download(const pre_dev *d, int64_t m) {
    return (pre_out_h){down(d->x, sizeof(uint16_t) * m * HC * D), down(d->h, sizeof(uint16_t) * m * D),
                       down(d->mixes, sizeof(float) * m * NMIX), down(d->pre, sizeof(float) * m * HC),
                       down(d->post, sizeof(float) * m * HC), down(d->comb, sizeof(float) * m * HC * HC)};
}
static void pre_free_out(pre_out_h *o) { free(o->x), free(o->h), free(o->mixes), free(o->pre), free(o->post), free(o->comb); }
static void pre_reset(const pre_in_h *in, pre_dev *d) { put(d->x, in->x, sizeof(uint16_t) * MMAX * HC * D); }

/* All six outputs compared; `sink` tolerates the libm difference in Sinkhorn's outputs and in h when h
 * is collapsed with the new pre. */
static void pre_rows(const char *what, const char *shape, const pre_out_h *a, const pre_out_h *b, int64_t m,
                     bool vs_cpu, bool deferred, double us) {
    char op[64];
    snprintf(op, sizeof op, "%s x", what);
    row(op, shape, a->x, b->x, m * HC * D, 1, EXACT, us);
    snprintf(op, sizeof op, "%s mixes", what);
    row(op, shape, a->mixes, b->mixes, m * NMIX, 0, EXACT, -1);
    snprintf(op, sizeof op, "%s pre|post|comb", what);
    float *ga = xmalloc(sizeof(float) * m * (2 * HC + HC * HC)), *gb = xmalloc(sizeof(float) * m * (2 * HC + HC * HC));
    memcpy(ga, a->pre, sizeof(float) * m * HC), memcpy(gb, b->pre, sizeof(float) * m * HC);
    memcpy(ga + m * HC, a->post, sizeof(float) * m * HC), memcpy(gb + m * HC, b->post, sizeof(float) * m * HC);
    memcpy(ga + 2 * m * HC, a->comb, sizeof(float) * m * HC * HC), memcpy(gb + 2 * m * HC, b->comb, sizeof(float) * m * HC * HC);
    if (vs_cpu) row(op, shape, ga, gb, m * (2 * HC + HC * HC), 0, SINK, -1);
    else row(op, shape, ga, gb, m * (2 * HC + HC * HC), 0, EXACT, -1);
    free(ga), free(gb);
    snprintf(op, sizeof op, "%s h", what);
    if (vs_cpu && !deferred) row(op, shape, a->h, b->h, m * D, 1, 1, 1e-2, "<=1 ulp on <=1% (pre)", -1);
    else row(op, shape, a->h, b->h, m * D, 1, EXACT, -1);
}

static void test_hc_pre(void) {
    pre_in_h in;
    in.x = rand_bf16(MMAX * HC * D, 1.0);
    in.z = rand_bf16(MMAX * D, 1.0);
    in.nw = rand_bf16(D, 0.3);
    for (int i = 0; i < D; i++) in.nw[i] = di_f32_to_bf16(1.0f + di_bf16_to_f32(in.nw[i]));
    in.fn = rand_f32(NMIX * HC * D, 0, 0.02);
    in.base = rand_f32(NMIX, 0, 1);
    in.scale[0] = 0.6f, in.scale[1] = 0.9f, in.scale[2] = 1.4f;
    in.post_in = rand_f32(MMAX * HC, 1.0, 0.4);
    in.comb_in = rand_f32(MMAX * HC * HC, 0.25, 0.1);
    in.pre_in = rand_f32(MMAX * HC, 0.5, 0.2);
    pre_dev d;
    pre_upload(&in, &d);
    const int64_t Ms[] = {1, 5, 64};
    double t_fused[3][2] = {{0}}, t_unfused[3][2] = {{0}};
    for (int mi = 0; mi < 3; mi++) {
        int64_t m = Ms[mi];
        for (int v = 0; v < 4; v++) {
            bool expand = v & 1, deferred = v & 2;
            char shape[96];
            snprintf(shape, sizeof shape, "M%lld hc4 D5120 it20%s%s", (long long)m, expand ? " +expand" : "",
                     deferred ? " +pre_in" : "");
            /* CPU reference */
            uint16_t *cx = xmalloc(sizeof(uint16_t) * m * HC * D), *ch = xmalloc(sizeof(uint16_t) * m * D);
            float *cm = xmalloc(sizeof(float) * m * NMIX), *cp = xmalloc(sizeof(float) * m * HC),
                  *cq = xmalloc(sizeof(float) * m * HC), *cc = xmalloc(sizeof(float) * m * HC * HC);
            memcpy(cx, in.x, sizeof(uint16_t) * m * HC * D);
            RUN(di_cpu_hc_pre(NULL, cx, expand ? in.z : NULL, in.post_in, in.comb_in, m, HC, D, in.fn, NORM_EPS, in.scale,
                              in.base, ITERS, HC_EPS, deferred ? in.pre_in : NULL, in.nw, cm, cp, cq, cc, ch, E));
            pre_out_h cpu_o = {cx, ch, cm, cp, cq, cc};
            /* fused, split launch */
            di_cuda_fused_set_split_max(4096);
            pre_reset(&in, &d);
            RUN(fused_call(&d, m, 0, expand, deferred));
            pre_out_h fo = pre_download(&d, m);
            /* fused, one block per token */
            di_cuda_fused_set_split_max(0);
            pre_reset(&in, &d);
            RUN(fused_call(&d, m, 0, expand, deferred));
            pre_out_h to = pre_download(&d, m);
            di_cuda_fused_set_split_max(4096);
            /* unfused CUDA sequence */
            pre_reset(&in, &d);
            RUN(unfused_call(&d, m, expand, deferred));
            pre_out_h uo = pre_download(&d, m);
            /* timings (x is rewritten by the expand variants: the values drift, the work does not) */
            double tf, tu;
            TIME_US(tf, fused_call(&d, m, 0, expand, deferred));
            TIME_US(tu, unfused_call(&d, m, expand, deferred));
            if (deferred) t_fused[mi][expand] = tf, t_unfused[mi][expand] = tu;
            pre_rows("hc_pre vs unfused", shape, &fo, &uo, m, false, deferred, tf);
            pre_rows("hc_pre token launch", shape, &to, &fo, m, false, deferred, -1);
            pre_rows("hc_pre vs cpu", shape, &fo, &cpu_o, m, true, deferred, -1);
            printf("%-24s %-44s unfused sequence %.1f us\n", "  (time)", shape, tu);
            /* a token alone equals the same token inside the batch */
            if (m == 64) {
                pre_reset(&in, &d);
                RUN(fused_call(&d, 1, 37, expand, deferred));
                pre_out_h one = pre_download(&d, 1);
                uint16_t *x37 = down(d.x + 37 * HC * D, sizeof(uint16_t) * HC * D);
                pre_out_h ref = {fo.x + 37 * HC * D, fo.h + 37 * D, fo.mixes + 37 * NMIX, fo.pre + 37 * HC,
                                 fo.post + 37 * HC, fo.comb + 37 * HC * HC};
                free(one.x), one.x = x37;
                /* outputs of a 1-row call land in row 0 of mixes/pre/post/comb/h, the streams in row 37 */
                pre_rows("hc_pre row 37 alone", shape, &one, &ref, 1, false, deferred, -1);
                pre_free_out(&one);
            }
            pre_free_out(&fo), pre_free_out(&to), pre_free_out(&uo), pre_free_out(&cpu_o);
        }
    }
    printf("\n# decode-step mHC chains (µs, median of 51, CUDA events; deferred pre-mix as the graph runs them):\n");
    printf("# %-4s %-32s %10s %10s %8s\n", "M", "chain", "unfused", "fused", "saved");
    for (int mi = 0; mi < 3; mi++) {
        printf("# %-4lld %-32s %10.1f %10.1f %8.1f\n", (long long)Ms[mi], "attn pre (mixes..rmsnorm)", t_unfused[mi][0],
               t_fused[mi][0], t_unfused[mi][0] - t_fused[mi][0]);
        printf("# %-4lld %-32s %10.1f %10.1f %8.1f\n", (long long)Ms[mi], "attn expand + ffn pre", t_unfused[mi][1],
               t_fused[mi][1], t_unfused[mi][1] - t_fused[mi][1]);
        printf("# %-4lld %-32s %10.1f %10.1f %8.1f   (x 40 layers = %.2f ms per step)\n", (long long)Ms[mi], "per block",
               t_unfused[mi][0] + t_unfused[mi][1], t_fused[mi][0] + t_fused[mi][1],
               t_unfused[mi][0] + t_unfused[mi][1] - t_fused[mi][0] - t_fused[mi][1],
               40e-3 * (t_unfused[mi][0] + t_unfused[mi][1] - t_fused[mi][0] - t_fused[mi][1]));
    }
    printf("\n");
    free(in.x), free(in.z), free(in.nw), free(in.fn), free(in.base), free(in.post_in), free(in.comb_in), free(in.pre_in);
    cudaFree(d.x), cudaFree(d.z), cudaFree(d.nw), cudaFree(d.h), cudaFree(d.fn), cudaFree(d.base), cudaFree(d.scale);
    cudaFree(d.post_in), cudaFree(d.comb_in), cudaFree(d.pre_in), cudaFree(d.mixes), cudaFree(d.pre), cudaFree(d.post);
    cudaFree(d.comb);
}

/* Shapes off the V4.1 fast path: hc 3 (the runtime-hc kernels) and D 1000 (no 16-byte rows, so the
 * scalar staging), split launches (one mix per block, and 4 per block: 15 mixes in groups of 4, 4, 4, 3)
 * and token launches: fused equal to the unfused CUDA sequence, and to the CPU where no exp is
 * involved. */
static void test_hc_pre_generic(void) {
    const int hc = 3, nmix = (2 + hc) * hc;
    const int64_t m = 5, d = 1000;
    uint16_t *x = rand_bf16(m * hc * d, 1.0), *z = rand_bf16(m * d, 1.0), *nw = rand_bf16(d, 1.0);
    float *fn = rand_f32(nmix * hc * d, 0, 0.02), *base = rand_f32(nmix, 0, 1), scale[3] = {0.6f, 0.9f, 1.4f};
    float *post_in = rand_f32(m * hc, 1.0, 0.4), *comb_in = rand_f32(m * hc * hc, 0.3, 0.1), *pre_in = rand_f32(m * hc, 0.5, 0.2);
    uint16_t *dx = dup_dev(x, sizeof(uint16_t) * m * hc * d), *dz = dup_dev(z, sizeof(uint16_t) * m * d),
             *dnw = dup_dev(nw, sizeof(uint16_t) * d), *dh = dev_poisoned(sizeof(uint16_t) * m * d);
    float *dfn = dup_dev(fn, sizeof(float) * nmix * hc * d), *dbase = dup_dev(base, sizeof(float) * nmix),
          *dscale = dup_dev(scale, sizeof scale), *dpost_in = dup_dev(post_in, sizeof(float) * m * hc),
          *dcomb_in = dup_dev(comb_in, sizeof(float) * m * hc * hc), *dpre_in = dup_dev(pre_in, sizeof(float) * m * hc),
          *dmix = dev_poisoned(sizeof(float) * m * nmix), *dpre = dev_poisoned(sizeof(float) * m * hc), *dpost = dev_poisoned(sizeof(float) * m * hc),
          *dcomb = dev_poisoned(sizeof(float) * m * hc * hc);
    size_t nx = (size_t)(m * hc * d), nh = (size_t)(m * d), ns = (size_t)(m * (2 * hc + hc * hc));
    for (int v = 0; v < 2; v++) {
        uint16_t *res_x[4], *res_h[4];
        float *res_s[4];
        for (int path = 0; path < 4; path++) { /* 0: unfused, 1: split, 2: token launch, 3: split, 4 mixes a block */
            put(dx, x, sizeof(uint16_t) * nx);
            di_cuda_fused_set_split_max(path == 2 ? 0 : 4096);
            di_cuda_fused_set_mix_group(path == 3 ? 4 : path == 1 ? 1 : 0);
            if (path == 0) {
                if (v) RUN(di_cuda_hc_expand(gpu, dz, dx, dpost_in, dcomb_in, m, hc, d, dx, E));
                RUN(di_cuda_hc_mixes(gpu, dx, m, hc, d, dfn, NORM_EPS, dmix, E));
                RUN(di_cuda_hc_sinkhorn(gpu, dmix, m, hc, dscale, dbase, ITERS, HC_EPS, dpre, dpost, dcomb, E));
                RUN(di_cuda_hc_collapse(gpu, dx, v ? dpre_in : dpre, m, hc, d, dh, E));
                RUN(di_cuda_rmsnorm(gpu, dh, m, d, dnw, NORM_EPS, dh, E));
            } else {
                RUN(di_cuda_hc_pre(gpu, dx, v ? dz : NULL, dpost_in, dcomb_in, m, hc, d, dfn, NORM_EPS, dscale, dbase,
                                   ITERS, HC_EPS, v ? dpre_in : NULL, dnw, dmix, dpre, dpost, dcomb, dh, E));
            }
            res_x[path] = down(dx, sizeof(uint16_t) * nx), res_h[path] = down(dh, sizeof(uint16_t) * nh);
            res_s[path] = xmalloc(sizeof(float) * (ns + m * nmix));
            float *tmp = down(dmix, sizeof(float) * m * nmix);
            memcpy(res_s[path], tmp, sizeof(float) * m * nmix), free(tmp);
            tmp = down(dpre, sizeof(float) * m * hc), memcpy(res_s[path] + m * nmix, tmp, sizeof(float) * m * hc), free(tmp);
            tmp = down(dpost, sizeof(float) * m * hc), memcpy(res_s[path] + m * nmix + m * hc, tmp, sizeof(float) * m * hc), free(tmp);
            tmp = down(dcomb, sizeof(float) * m * hc * hc);
            memcpy(res_s[path] + m * nmix + 2 * m * hc, tmp, sizeof(float) * m * hc * hc), free(tmp);
        }
        di_cuda_fused_set_split_max(4096);
        di_cuda_fused_set_mix_group(0);
        const char *shape = v ? "M5 hc3 D1000 +expand +pre_in" : "M5 hc3 D1000";
        for (int path = 1; path < 4; path++) {
            const char *op = path == 1 ? "hc_pre generic split" : path == 2 ? "hc_pre generic token" : "hc_pre generic split g4";
            char o[64];
            snprintf(o, sizeof o, "%s x", op);
            row(o, shape, res_x[path], res_x[0], (int64_t)nx, 1, EXACT, -1);
            snprintf(o, sizeof o, "%s h", op);
            row(o, shape, res_h[path], res_h[0], (int64_t)nh, 1, EXACT, -1);
            snprintf(o, sizeof o, "%s mix|pre|post|comb", op);
            row(o, shape, res_s[path], res_s[0], (int64_t)(ns + m * nmix), 0, EXACT, -1);
        }
        for (int path = 0; path < 4; path++) free(res_x[path]), free(res_h[path]), free(res_s[path]);
    }
    free(x), free(z), free(nw), free(fn), free(base), free(post_in), free(comb_in), free(pre_in);
    cudaFree(dx), cudaFree(dz), cudaFree(dnw), cudaFree(dh), cudaFree(dfn), cudaFree(dbase), cudaFree(dscale);
    cudaFree(dpost_in), cudaFree(dcomb_in), cudaFree(dpre_in), cudaFree(dmix), cudaFree(dpre), cudaFree(dpost), cudaFree(dcomb);
}

/* Prefill shapes (M 512 and 4096): fused (split and token launches) against the unfused CUDA sequence,
 * bit for bit, and their times. */
static void test_hc_pre_prefill(void) {
    const int64_t Ms[] = {512, 4096}, MM = 4096;
    uint16_t *x = xmalloc(sizeof(uint16_t) * (size_t)(MM * HC * D)); /* bf16 [MM, HC, D] */
    for (int64_t i = 0; i < MM * HC * D; i++) x[i] = di_f32_to_bf16((float)((int64_t)(rnd() >> 40) - (1 << 23)) * 0x1p-22f);
    uint16_t *z = rand_bf16(MM * D, 1.0), *nw = rand_bf16(D, 0.3);
    float *fn = rand_f32(NMIX * HC * D, 0, 0.02), *base = rand_f32(NMIX, 0, 1), scale[3] = {0.6f, 0.9f, 1.4f};
    float *post_in = rand_f32(MM * HC, 1.0, 0.4), *comb_in = rand_f32(MM * HC * HC, 0.25, 0.1), *pre_in = rand_f32(MM * HC, 0.5, 0.2);
    pre_dev d = {dup_dev(x, sizeof(uint16_t) * (size_t)(MM * HC * D)), dup_dev(z, sizeof(uint16_t) * (size_t)(MM * D)),
                 dup_dev(nw, sizeof(uint16_t) * D), dev_poisoned(sizeof(uint16_t) * (size_t)(MM * D)),
                 dup_dev(fn, sizeof(float) * NMIX * HC * D), dup_dev(base, sizeof(float) * NMIX), dup_dev(scale, sizeof scale),
                 dup_dev(post_in, sizeof(float) * MM * HC), dup_dev(comb_in, sizeof(float) * MM * HC * HC),
                 dup_dev(pre_in, sizeof(float) * MM * HC), dev_poisoned(sizeof(float) * MM * NMIX), dev_poisoned(sizeof(float) * MM * HC),
                 dev_poisoned(sizeof(float) * MM * HC), dev_poisoned(sizeof(float) * MM * HC * HC)};
    for (int mi = 0; mi < 2; mi++) {
        int64_t m = Ms[mi];
        for (int expand = 0; expand < 2; expand++) {
            pre_out_h o[3]; /* unfused, split, token */
            double us[3];
            for (int path = 0; path < 3; path++) {
                put(d.x, x, sizeof(uint16_t) * (size_t)(m * HC * D));
                di_cuda_fused_set_split_max(path == 2 ? 0 : 4096);
                if (path == 0) RUN(unfused_call(&d, m, expand, true));
                else RUN(fused_call(&d, m, 0, expand, true));
                o[path] = pre_download(&d, m);
                if (path == 0) TIME_US(us[path], unfused_call(&d, m, expand, true));
                else TIME_US(us[path], fused_call(&d, m, 0, expand, true));
            }
            di_cuda_fused_set_split_max(4096);
            char shape[96];
            snprintf(shape, sizeof shape, "M%lld hc4 D5120 it20%s +pre_in", (long long)m, expand ? " +expand" : "");
            pre_rows("hc_pre split vs unfused", shape, &o[1], &o[0], m, false, true, us[1]);
            pre_rows("hc_pre token vs unfused", shape, &o[2], &o[0], m, false, true, us[2]);
            printf("# prefill M%lld%s: unfused %.1f us, fused split %.1f us, fused token launch %.1f us\n", (long long)m,
                   expand ? " expand + pre" : " pre", us[0], us[1], us[2]);
            for (int path = 0; path < 3; path++) pre_free_out(&o[path]);
        }
    }
    free(x), free(z), free(nw), free(fn), free(base), free(post_in), free(comb_in), free(pre_in);
    cudaFree(d.x), cudaFree(d.z), cudaFree(d.nw), cudaFree(d.h), cudaFree(d.fn), cudaFree(d.base), cudaFree(d.scale);
    cudaFree(d.post_in), cudaFree(d.comb_in), cudaFree(d.pre_in), cudaFree(d.mixes), cudaFree(d.pre), cudaFree(d.post);
    cudaFree(d.comb);
}

/* ---------------- 2. gather_topk ---------------- */

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static int cmp_i32(const void *a, const void *b) { return (*(const int32_t *)a > *(const int32_t *)b) - (*(const int32_t *)a < *(const int32_t *)b); }

static void test_gather(void) {
    enum { HD = 512, K = 512, N_ENT = 8192, PE = 32, PROWS = 96, ROFF = 40, NPAGES = N_ENT / PE };
    const di_row_codec codec = DI_CODEC_FP4_E4M3;
    const int64_t rb = di_row_codec_bytes(codec, HD), n_rows = (int64_t)NPAGES * PROWS;
    uint8_t *base = xmalloc((size_t)(n_rows * rb)); /* uint8 [n_rows, rb] */
    uint16_t *v = rand_bf16(HD, 1.0);
    for (int64_t r = 0; r < n_rows; r++) {
        for (int i = 0; i < HD; i++) v[i] = di_f32_to_bf16((float)(gauss() * (1 + r % 7)));
        di_cpu_row_encode(codec, v, HD, base + r * rb);
    }
    free(v);
    int32_t pages[NPAGES]; /* a permutation */
    for (int i = 0; i < NPAGES; i++) pages[i] = i;
    for (int i = NPAGES - 1; i > 0; i--) {
        int j = (int)(rnd() % (uint64_t)(i + 1)), t = pages[i];
        pages[i] = pages[j], pages[j] = t;
    }
    uint8_t *base_d = dup_dev(base, (size_t)(n_rows * rb));
    int32_t *pages_d = dup_dev(pages, sizeof pages);
    const int64_t Ms[] = {1, 5, 64};
    for (int mi = 0; mi < 3; mi++) {
        int64_t m = Ms[mi], ldi = 128 + K, nk = m * K;
        int32_t *top = xmalloc(sizeof(int32_t) * (size_t)nk); /* distinct ascending ids per row, −1 padded, a few out of range */
        for (int64_t t = 0; t < m; t++) {
            int n_valid = K - (int)(rnd() % 40);
            for (int j = 0; j < K; j++) top[t * K + j] = j < n_valid ? (int32_t)(rnd() % N_ENT) : -1;
            qsort(top + t * K, (size_t)n_valid, sizeof(int32_t), cmp_i32);
            if (t % 2) top[t * K + 3] = N_ENT + 5;
        }
        int32_t *top_d = dup_dev(top, sizeof(int32_t) * (size_t)nk);
        for (int paged = 0; paged < 2; paged++) {
            const int32_t *pg = paged ? pages : NULL, *pg_d = paged ? pages_d : NULL;
            uint16_t *rows_c = xmalloc(sizeof(uint16_t) * (size_t)(nk * HD));
            int32_t *idx_c = xmalloc(sizeof(int32_t) * (size_t)(m * ldi));
            for (int64_t i = 0; i < m * ldi; i++) idx_c[i] = -7;
            int32_t *idx_d = dup_dev(idx_c, sizeof(int32_t) * (size_t)(m * ldi));
            uint16_t *rows_d = dev_poisoned(sizeof(uint16_t) * (size_t)(nk * HD));
            RUN(di_cpu_gather_topk(NULL, codec, base, N_ENT, pg, PE, PROWS, ROFF, top, m, K, HD, 128, rows_c, idx_c + 128,
                                   ldi, E));
            RUN(di_cuda_gather_topk(gpu, codec, base_d, N_ENT, pg_d, PE, PROWS, ROFF, top_d, m, K, HD, 128, rows_d,
                                    idx_d + 128, ldi, E));
            double us;
            TIME_US(us, di_cuda_gather_topk(gpu, codec, base_d, N_ENT, pg_d, PE, PROWS, ROFF, top_d, m, K, HD, 128, rows_d,
                                            idx_d + 128, ldi, E));
            uint16_t *rows_g = down(rows_d, sizeof(uint16_t) * (size_t)(nk * HD));
            int32_t *idx_g = down(idx_d, sizeof(int32_t) * (size_t)(m * ldi));
            char shape[96];
            snprintf(shape, sizeof shape, "M%lld k512 hd512 of %d%s", (long long)m, N_ENT, paged ? " paged" : "");
            row("gather_topk rows", shape, rows_g, rows_c, nk * HD, 1, EXACT, us);
            row("gather_topk idx", shape, idx_g, idx_c, m * ldi, 2, EXACT, -1);
            if (paged) {
                /* what it replaces: download the lists (a stream sync), union on the host, upload, decode */
                int32_t *ids_h = xmalloc(sizeof(int32_t) * (size_t)nk), *ids_d = dev_poisoned(sizeof(int32_t) * (size_t)nk);
                double best = 1e30;
                for (int r = 0; r < 21; r++) {
                    double t0 = now_us();
                    RUN(di_backend_cuda_sync(gpu, E));
                    CU(cudaMemcpyAsync(ids_h, top_d, sizeof(int32_t) * (size_t)nk, cudaMemcpyDeviceToHost,
                                       (cudaStream_t)di_backend_cuda_stream(gpu)));
                    RUN(di_backend_cuda_sync(gpu, E));
                    qsort(ids_h, (size_t)nk, sizeof(int32_t), cmp_i32);
                    int64_t nu = 0;
                    for (int64_t i = 0; i < nk; i++)
                        if (ids_h[i] >= 0 && ids_h[i] < N_ENT && (nu == 0 || ids_h[nu - 1] != ids_h[i])) ids_h[nu++] = ids_h[i];
                    for (int64_t i = 0; i < nu; i++) ids_h[i] = pages[ids_h[i] / PE] * PROWS + ROFF + ids_h[i] % PE;
                    CU(cudaMemcpyAsync(ids_d, ids_h, sizeof(int32_t) * (size_t)nu, cudaMemcpyHostToDevice,
                                       (cudaStream_t)di_backend_cuda_stream(gpu)));
                    RUN(di_cuda_row_decode(gpu, codec, base_d, ids_d, nu, HD, rows_d, E));
                    RUN(di_backend_cuda_sync(gpu, E));
                    double t = now_us() - t0;
                    if (t < best) best = t;
                }
                double t0 = 1e30;
                for (int r = 0; r < 21; r++) {
                    double a = now_us();
                    RUN(di_cuda_gather_topk(gpu, codec, base_d, N_ENT, pg_d, PE, PROWS, ROFF, top_d, m, K, HD, 128,
                                            rows_d, idx_d + 128, ldi, E));
                    RUN(di_backend_cuda_sync(gpu, E));
                    double t = now_us() - a;
                    if (t < t0) t0 = t;
                }
                printf("# gather M%lld: host-planned (sync + download + union + upload + decode) %.1f us wall, "
                       "device gather %.1f us wall (%.1f us GPU)\n",
                       (long long)m, best, t0, us);
                free(ids_h), cudaFree(ids_d);
            }
            free(rows_c), free(idx_c), free(rows_g), free(idx_g), cudaFree(idx_d), cudaFree(rows_d);
        }
        free(top), cudaFree(top_d);
    }
    free(base), cudaFree(base_d), cudaFree(pages_d);
}

/* ---------------- 3. the forward with and without the fused slots ---------------- */

enum { FMAX = 64, FPROMPT = 21, NS = 3 };

static void forward_case(const char *dir) {
    di_model *m = NULL;
    if (di_model_open(dir, &m, E) || di_model_to_backend(m, gpu, E)) die(dir, g_err.msg);
    const int64_t V = m->cfg.vocab_size;
    di_backend saved = *gpu;
    di_cache_pool *pool[2];
    di_session *s[2][NS];
    int align = di_cache_pool_align(&m->cfg);
    for (int f = 0; f < 2; f++) {
        di_cache_pool_opts po = {.be = gpu, .max_tokens = FMAX, .spec_margin = -1, .page_tokens = 2 * align,
                                 .n_pages = 2 * (FMAX / (2 * align) + 2), .n_slots = 2};
        RUN(di_cache_pool_create(&m->cfg, &po, &pool[f], E));
        for (int i = 0; i < NS; i++) {
            di_session_opts so = {.max_tokens = FMAX, .spec_margin = -1};
            if (i > 0) RUN(di_cache_pool_cache(pool[f], &so.cache, E));
            RUN(di_session_create(m, gpu, &so, &s[f][i], E));
        }
    }
    int32_t ids[NS][FMAX];
    for (int i = 0; i < NS; i++)
        for (int t = 0; t < FMAX; t++) ids[i][t] = (int32_t)(3 + rnd() % (uint64_t)(V - 3));
    float *lg[2];
    lg[0] = xmalloc(sizeof(float) * (size_t)(NS * 4 * V)), lg[1] = xmalloc(sizeof(float) * (size_t)(NS * 4 * V));
    int64_t rows = 0, bad = 0;
    for (int64_t p = 0; p < FMAX - 4;) {
        int64_t n = p < FPROMPT ? (FPROMPT - p < 4 ? FPROMPT - p : 4) : 1;
        bool batched = p >= FPROMPT && p % 3 == 0;
        for (int f = 0; f < 2; f++) {
            if (!f) gpu->hc_pre = NULL, gpu->gather_topk = NULL; /* unfused: the graph's op sequence */
            else gpu->hc_pre = saved.hc_pre, gpu->gather_topk = saved.gather_topk;
            if (batched) {
                di_session_chunk ck[NS];
                for (int i = 0; i < NS; i++)
                    ck[i] = (di_session_chunk){.s = s[f][i], .ids = ids[i] + p, .n = n, .logits = lg[f] + i * 4 * V};
                RUN(di_session_forward_batch(ck, NS, NULL, E));
            } else {
                for (int i = 0; i < NS; i++) RUN(di_session_forward(s[f][i], ids[i] + p, n, true, lg[f] + i * 4 * V, NULL, E));
            }
        }
        for (int i = 0; i < NS; i++) {
            int64_t nr = batched ? 1 : n;
            bad += memcmp(lg[0] + i * 4 * V, lg[1] + i * 4 * V, sizeof(float) * (size_t)(nr * V)) != 0;
            rows += nr;
        }
        p += n;
    }
    *gpu = saved;
    char shape[96];
    snprintf(shape, sizeof shape, "%s, %lld logits rows", strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir, (long long)rows);
    int32_t zero = 0, nbad = (int32_t)bad;
    row("forward fused vs unfused", shape, &nbad, &zero, 1, 2, EXACT, -1);
    for (int f = 0; f < 2; f++) {
        for (int i = 0; i < NS; i++) di_session_destroy(s[f][i]);
        di_cache_pool_destroy(pool[f]);
    }
    free(lg[0]), free(lg[1]);
    di_model_close(m);
}

int main(void) {
    const char *seed = getenv("DI_SEED");
    if (seed) rng ^= strtoull(seed, NULL, 10) * 0x9E3779B97F4A7C15ull;
    if (di_cuda_device_count() < 1) die("cuda", "no device");
    RUN(di_backend_cuda_create(0, &gpu, E));
    CU(cudaEventCreate(&ev0));
    CU(cudaEventCreate(&ev1));
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("# device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    printf("%-24s %-44s %6s %10s  %-22s %9s  %s\n", "op", "shape", "ulp", "mismatch", "tolerance", "gpu us", "result");
    test_hc_pre();
    test_hc_pre_generic();
    test_hc_pre_prefill();
    test_gather();
    forward_case("tests/data/v41-tiny-sel");
    forward_case("tests/data/v41-tiny-nosel");
    printf("%d passed, %d failed\n", n_pass, n_fail);
    di_backend_cuda_destroy(gpu);
    return n_fail ? 1 : 0;
}
