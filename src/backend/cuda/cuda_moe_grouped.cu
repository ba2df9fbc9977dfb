/* The moe_grouped slot on the GPU (backend.h; cuda_moe_grouped.h): the routed experts of a prefill step
 * whose dispatch the host planned — the step's (token, slot) pairs listed expert by expert, so each
 * expert's rows are one contiguous range [start[e], start[e+1]) of every row buffer.
 *
 * Default (exact) slot, a few launches per 8,192 listed rows instead of the graph loop's 9 per expert:
 *   gather     x rows → xg [n, d] in list order (one launch)
 *   up         per chunk of experts: one act-quant and one digit pre-pass of the chunk's rows, then the exact
 *              GEMM of every expert of the chunk in one grouped launch for w1, and one for w3 on the same digit
 *              planes: the int8 wgmma GEMM (di_cuda_gemm_igmma_grouped) where the experts average >= 96 rows,
 *              else the int8 mma.sync GEMM (di_cuda_gemm_mma_grouped); the same bits
 *   swiglu     every row at once, with its routing weight
 *   down       per chunk: act-quant, one grouped launch for w2 → y [n, d]
 *   combine    acc[t] = 0 + Σ f32(y[r]) over t's rows in ascending r (one launch, below)
 *   (DI_CUDA_GEMM=simt, more than 384 experts, or d / inter not multiples of 64: the per-expert loop of the
 *   exact linear_fp4, as before. An expert weight not 16-byte aligned takes that loop too, whose
 *   linear_fp4 reports it as an error.)
 * Tensor slot (DI_CUDA_KERNELS=tensor), 7 launches whatever the expert count:
 *   quant      the exact FP8 act-quantization of the m token rows (cuda_quant.cu)
 *   gather     those codes and scales into list order (quantization is per row: the same codes as
 *              quantizing the gathered bf16 rows, for 1/k of the work)
 *   up         w1 and w3 of every expert in ONE grouped wgmma launch (di_cuda_wgmma_fp4_grouped; one
 *              TMA map per expert, the tables built once per layer and kept, see `tables` below)
 *   swiglu, quant of the SwiGLU rows, down (w2, one grouped launch), combine.
 *   The grouped kernel computes each expert's rows bit for bit as the wgmma linear_fp4 slot does, so the
 *   result is the per-expert loop's over that slot. Where it cannot run (DI_ERR_UNSUPPORTED: its register
 *   split does not fit) or the tables cannot be built (an expert without weights), the slot runs the
 *   per-expert loop over the wgmma linear_fp4 (this mode's linear_fp4 slot): same bits.
 *
 * Exactness. Every GEMM row depends on its own input row only (backend.h: batch invariance), SwiGLU is
 * elementwise with the row's weight, so computing all rows of all experts together changes no value. The
 * combine sums a token's terms in ascending list position, and the plan lists the experts in ascending
 * id and an expert's pairs in ascending (token, slot): ascending position within a token is ascending
 * (expert id, slot) — the order in which the graph's loop ran scatter_add_rows, starting from the same
 * 0.0f with the same __fadd_rn. So the slot equals the CPU slot (default) or the wgmma loop (tensor) bit
 * for bit; tests/cuda/test_cuda_moe_grouped.c checks both at the V4.1 shapes.
 *
 * Memory: xg, g, u, a, y live in the caller's ws (di_moe_grouped_ws_bytes; y reuses xg, which is spent by
 * then); the tensor slot's codes live in the backend workspace (m·d + n·max(d, inter) bytes + scales),
 * which no other op touches between its quantizations and its GEMMs. Ids the host could not check (rank,
 * rows) are not read on the host: a rank outside [0, n) is skipped, a row outside [0, m) gathers zeros. */
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemm_igmma.h"
#include "backend/cuda/cuda_gemm_mma.cuh"
#include "backend/cuda/cuda_gemm_wgmma.h"
#include "backend/cuda/cuda_moe_grouped.h"
#include "backend/cuda/cuda_ops.h"

static int g_last_path; /* di_cuda_moe_grouped_last_path */
extern "C" int di_cuda_moe_grouped_last_path(void) { return g_last_path; }

static size_t al256(size_t n) { return (n + 255) & ~(size_t)255; }


/* ---------------- kernels ---------------- */

#define COMBINE_THREADS 128
#define COMBINE_COLS 8 /* columns per thread: one 16-byte load of y per term */

/* acc[t, c..c+7] = 0 + Σ f32(y[r, c..c+7]) over the rows r that rank[t, ·] names, in ascending r. The k
 * entries are walked by repeated minimum (k² compares, k = 6): the next row is the smallest one above
 * the last. grid (token, column blocks); d % 8 == 0, y 16-byte aligned; acc16: acc is 16-byte aligned. */
__global__ void __launch_bounds__(COMBINE_THREADS) grouped_combine_kernel(const int32_t *rank, const uint16_t *y, int64_t n,
                                                                         int64_t d, int k, int acc16, float *acc) {
    const int64_t t = blockIdx.x, c = ((int64_t)blockIdx.y * COMBINE_THREADS + threadIdx.x) * COMBINE_COLS;
    if (c >= d) return;
    const int32_t *rk = rank + t * k;
    float s[COMBINE_COLS];
#pragma unroll
    for (int i = 0; i < COMBINE_COLS; i++) s[i] = 0.0f;
    int last = -1;
    for (int step = 0; step < k; step++) {
        int best = INT_MAX;
        for (int j = 0; j < k; j++) {
            const int r = rk[j];
            if (r > last && r < best && r < n) best = r;
        }
        if (best == INT_MAX) break;
        const uint4 v = *(const uint4 *)(y + (int64_t)best * d + c);
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s[2 * i] = __fadd_rn(s[2 * i], d_bf16((uint16_t)(w[i] & 0xffffu)));
            s[2 * i + 1] = __fadd_rn(s[2 * i + 1], d_bf16((uint16_t)(w[i] >> 16)));
        }
        last = best;
    }
    float *o = acc + t * d + c;
    if (acc16) {
        ((float4 *)o)[0] = make_float4(s[0], s[1], s[2], s[3]);
        ((float4 *)o)[1] = make_float4(s[4], s[5], s[6], s[7]);
    } else {
#pragma unroll
        for (int i = 0; i < COMBINE_COLS; i++) o[i] = s[i];
    }
}

/* qo[r] = q[rows[r]], so[r] = s[rows[r]] (zeros for a row outside [0, m)): the act-quantized token rows
 * in list order.  q e4m3 [m, d], s E8M0 [m, d/32] → qo [n, d], so [n, d/32]; d % 32 == 0, q/qo 16-byte
 * aligned. One block per row. */
__global__ void gather_codes_kernel(const uint8_t *q, const uint8_t *s, int64_t m, int64_t d, const int32_t *rows,
                                    uint8_t *qo, uint8_t *so) {
    const int64_t r = blockIdx.x;
    const int32_t t = rows[r];
    const bool ok = t >= 0 && t < m;
    const uint4 *src = (const uint4 *)(q + (ok ? t : 0) * d);
    uint4 *dst = (uint4 *)(qo + r * d);
    for (int64_t i = threadIdx.x; i < d / 16; i += blockDim.x) dst[i] = ok ? src[i] : make_uint4(0, 0, 0, 0);
    for (int64_t i = threadIdx.x; i < d / 32; i += blockDim.x) so[r * (d / 32) + i] = ok ? s[t * (d / 32) + i] : 0;
}

/* ---------------- shared steps ---------------- */

/* Host-side checks of what the host can see: shapes, start_h (0 … n, nondecreasing), weights of every
 * expert that has rows. */
static int check_args(const char *op, int64_t m, int64_t d, int64_t inter, int k, int n_exp, const di_moe_expert *experts,
                      const di_moe_plan *p, void *ws, di_error *err) {
    if (m < 0 || k < 1 || d <= 0 || inter <= 0 || d % 32 || inter % 32 || n_exp < 1 || !experts || !p || !p->start_h ||
        p->n < 0 || p->n > INT32_MAX || (p->n > 0 && (!ws || (uintptr_t)ws % 16)))
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: %lld tokens × %d slots, dim %lld, inter %lld (multiples of 32), "
                            "%d experts, a plan of ≤ 2^31 rows and 16-byte aligned scratch", op, (long long)m, k,
                            (long long)d, (long long)inter, n_exp);
    const int64_t *st = p->start_h;
    if (st[0] != 0 || st[n_exp] != p->n)
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: plan starts at %lld and ends at %lld for %lld rows", op,
                            (long long)st[0], (long long)st[n_exp], (long long)p->n);
    for (int e = 0; e < n_exp; e++) {
        if (st[e + 1] < st[e])
            return di_error_set(err, DI_ERR_INVALID, "cuda %s: expert %d's rows end at %lld before they start at %lld", op,
                                e, (long long)st[e + 1], (long long)st[e]);
        const di_moe_expert *ex = &experts[e];
        if (st[e + 1] > st[e] && (!ex->w1 || !ex->s1 || !ex->w3 || !ex->s3 || !ex->w2 || !ex->s2))
            return di_error_set(err, DI_ERR_INVALID, "cuda %s: expert %d is routed to but has no weights", op, e);
    }
    return DI_OK;
}

/* The caller's scratch (di_moe_grouped_ws_bytes): xg / y bf16 [n, d], g, u, a bf16 [n, inter] */
typedef struct ws_bufs {
    uint16_t *xg, *g, *u, *a, *y;
} ws_bufs;
static ws_bufs split_ws(void *ws, int64_t n, int64_t d, int64_t inter) {
    const size_t rows = al256((size_t)(n * d) * 2), mid = al256((size_t)(n * inter) * 2);
    uint8_t *b = (uint8_t *)ws;
    ws_bufs w = {(uint16_t *)b, (uint16_t *)(b + rows), (uint16_t *)(b + rows + mid), (uint16_t *)(b + rows + 2 * mid),
                 (uint16_t *)b};
    return w;
}

static int combine(const di_backend *be, const di_moe_plan *p, const uint16_t *y, int64_t m, int64_t d, int k, float *acc,
                   di_error *err) {
    if (m == 0) return DI_OK;
    const int64_t cols = (d / COMBINE_COLS + COMBINE_THREADS - 1) / COMBINE_THREADS;
    grouped_combine_kernel<<<dim3((unsigned)m, (unsigned)cols), COMBINE_THREADS, 0, di_cuda_state(be)->stream>>>(
        p->rank, y, p->n, d, k, (uintptr_t)acc % 16 == 0, acc);
    return di_cuda_launched("moe_grouped combine", err);
}

/* linear_fp4 kernels by name, not through the backend table: the slot is one op for a wrapper of the table
 * (cuda_optime.cu's per-op timing would otherwise count the inner calls twice) */
typedef int (*linear_fn)(const di_backend *, const uint16_t *, int64_t, int64_t, const uint8_t *, const uint8_t *,
                         int64_t, uint16_t *, di_error *);

/* The per-expert loop: `lin` (the exact linear_fp4, or the wgmma one in tensor mode) per expert, one
 * gather, one SwiGLU, then the one combine. */
static int expert_loop(const di_backend *be, linear_fn lin, const uint16_t *x, int64_t m, int64_t d, int64_t inter, int k,
                       int n_exp, const di_moe_expert *experts, const di_moe_plan *p, float lim, float *acc, void *ws,
                       di_error *err) {
    g_last_path = 0;
    const int64_t n = p->n;
    const int64_t *st = p->start_h;
    const ws_bufs w = split_ws(ws, n, d, inter);
    int rc = DI_OK;
    if (n > 0) rc = di_cuda_gather_rows(be, x, d, p->rows, n, w.xg, err);
    for (int e = 0; e < n_exp && !rc; e++) {
        const int64_t s = st[e], ne = st[e + 1] - s;
        if (!ne) continue;
        const di_moe_expert *ex = &experts[e];
        rc = lin(be, w.xg + s * d, ne, d, ex->w1, ex->s1, inter, w.g + s * inter, err);
        if (!rc) rc = lin(be, w.xg + s * d, ne, d, ex->w3, ex->s3, inter, w.u + s * inter, err);
        if (rc) di_error_wrap(err, "moe_grouped expert %d", e);
    }
    if (!rc && n > 0) rc = di_cuda_swiglu(be, w.g, w.u, n, inter, p->roww, lim, w.a, err);
    for (int e = 0; e < n_exp && !rc; e++) { /* y overwrites xg: every w1 / w3 above has read it */
        const int64_t s = st[e], ne = st[e + 1] - s;
        if (!ne) continue;
        const di_moe_expert *ex = &experts[e];
        rc = lin(be, w.a + s * inter, ne, inter, ex->w2, ex->s2, d, w.y + s * d, err);
        if (rc) di_error_wrap(err, "moe_grouped expert %d", e);
    }
    return rc ? rc : combine(be, p, w.y, m, d, k, acc, err);
}

/* The exact GEMMs of every expert in a few grouped launches (cuda_gemm_mma.cuh, di_cuda_gemm_mma_grouped):
 * the act-quantization is per row (32-value groups), so quantizing an expert's rows alone or all listed rows
 * together gives the same codes, and the grouped kernel computes each row as linear_fp4 does on that expert
 * alone: the per-expert loop's bits. The experts are taken in chunks of about g_chunk_rows listed rows (at
 * least one expert each), which bounds the backend workspace (codes, scales and digit planes of a chunk:
 * ~168 MB for 8,192 rows at dim 5120). One chunk per 8,192 rows against 3 launches per active expert: an
 * 8K-token prefill step lists 49,152 rows over up to 384 experts, whose per-expert GEMMs of ~128 rows leave
 * most SMs idle (18-72 CTAs each). */
static int64_t g_chunk_rows = 8192;
extern "C" void di_cuda_moe_grouped_set_chunk_rows(int64_t rows) { g_chunk_rows = rows > 0 ? rows : 8192; }

/* rows [s0, s0 + nr) of src (bf16, width kd) → act-quant → grouped GEMM with weight set a of experts e0 … e1−1
 * → dst_a rows [s0, s0 + nr) (width nd); with a second set b (w1 then w3 over the same rows), its GEMM reuses
 * the codes and digit planes of the first (xq NULL: the grouped GEMM skips the pre-pass; both sets take the same
 * kernel, so the planes are in its layout) */
typedef struct wset {
    const uint8_t *const *w, *const *sc;
    uint16_t *dst;
} wset;
static int grouped_gemm(const di_backend *be, const uint16_t *src, int64_t kd, int e0, int e1, const int64_t *st,
                        int64_t nd, wset a, const wset *b, di_error *err) {
    const int64_t s0 = st[e0], nr = st[e1] - s0;
    if (nr == 0) return DI_OK;
    int64_t loc[GMM_GROUP_EXPERTS + 1];
    int active = 0;
    for (int e = e0; e <= e1; e++) loc[e - e0] = st[e] - s0;
    for (int e = e0; e < e1; e++) active += st[e + 1] > st[e];
    /* the int8 wgmma GEMM where the experts' row tiles fill it (cuda_gemm_igmma.cu), else the int8 mma.sync
     * GEMM: the same bits; each call's digit planes are its own kernel's layout */
    const int ig = di_cuda_gemm_igmma_enabled() && di_cuda_gemm_igmma_grouped_wants(nr, active) && di_cuda_gemm_igmma_usable(1, 1);
    const size_t codes = al256((size_t)(nr * kd)), scales = al256((size_t)(nr * (kd / 32)));
    const size_t digits = ig ? (size_t)di_cuda_gemm_igmma_scratch(nr, kd) : (size_t)di_cuda_gemm_mma_group_scratch(nr, kd);
    void *wsp;
    int rc = di_cuda_workspace(be, codes + scales + digits, &wsp, err);
    if (rc) return rc;
    uint8_t *xq = (uint8_t *)wsp, *xs = xq + codes, *xd = xs + scales;
    cudaStream_t stream = di_cuda_state(be)->stream;
    int (*gemm)(int, const uint8_t *, const uint8_t *, int64_t, int, const int64_t *, const uint8_t *const *,
                const uint8_t *const *, int64_t, uint16_t *, uint8_t *, void *, di_error *) =
        ig ? di_cuda_gemm_igmma_grouped : di_cuda_gemm_mma_grouped;
    rc = di_cuda_act_quant_fp8(src + s0 * kd, nr * kd, 32, xq, xs, stream, err);
    if (!rc) rc = gemm(1, xq, xs, kd, e1 - e0, loc, a.w + e0, a.sc + e0, nd, a.dst + s0 * nd, xd, stream, err);
    if (!rc && b) rc = gemm(1, NULL, xs, kd, e1 - e0, loc, b->w + e0, b->sc + e0, nd, b->dst + s0 * nd, xd, stream, err);
    return rc;
}

/* The chunk from expert e0: e0 and the experts after it while their listed rows stay within g_chunk_rows */
static int chunk_end(const int64_t *st, int e0, int n_exp) {
    int e1 = e0 + 1;
    while (e1 < n_exp && st[e1 + 1] - st[e0] <= g_chunk_rows) e1++;
    return e1;
}

extern "C" int di_cuda_moe_grouped(const di_backend *be, const uint16_t *x, int64_t m, int64_t d, int64_t inter, int k,
                                   int n_exp, const di_moe_expert *experts, const di_moe_plan *plan, float lim, float *acc,
                                   void *ws, di_error *err) {
    int rc = check_args("moe_grouped", m, d, inter, k, n_exp, experts, plan, ws, err);
    if (rc) return rc;
    /* the grouped GEMMs need the int8 MMA GEMM (DI_CUDA_GEMM=simt: the per-expert loop over qgemm_kernel) */
    if (!di_cuda_gemm_mma_enabled() || n_exp > GMM_GROUP_EXPERTS || d % 64 || inter % 64)
        return expert_loop(be, di_cuda_linear_fp4, x, m, d, inter, k, n_exp, experts, plan, lim, acc, ws, err);
    for (int e = 0; e < n_exp; e++) {
        const di_moe_expert *ex = &experts[e];
        if (plan->start_h[e + 1] > plan->start_h[e] &&
            ((uintptr_t)ex->w1 % 16 || (uintptr_t)ex->w3 % 16 || (uintptr_t)ex->w2 % 16))
            return expert_loop(be, di_cuda_linear_fp4, x, m, d, inter, k, n_exp, experts, plan, lim, acc, ws, err);
    }
    g_last_path = 0;
    const int64_t n = plan->n;
    const int64_t *st = plan->start_h;
    const ws_bufs wb = split_ws(ws, n, d, inter);
    const uint8_t *w1[GMM_GROUP_EXPERTS], *s1[GMM_GROUP_EXPERTS], *w3[GMM_GROUP_EXPERTS],
        *s3[GMM_GROUP_EXPERTS], *w2[GMM_GROUP_EXPERTS], *s2[GMM_GROUP_EXPERTS];
    for (int e = 0; e < n_exp; e++) {
        const di_moe_expert *ex = &experts[e];
        w1[e] = ex->w1, s1[e] = ex->s1, w3[e] = ex->w3, s3[e] = ex->s3, w2[e] = ex->w2, s2[e] = ex->s2;
    }
    if (n > 0) rc = di_cuda_gather_rows(be, x, d, plan->rows, n, wb.xg, err);
    for (int e0 = 0; e0 < n_exp && !rc;) { /* up: w1 → g, w3 → u, chunk by chunk */
        const int e1 = chunk_end(st, e0, n_exp);
        const wset up3 = {w3, s3, wb.u};
        rc = grouped_gemm(be, wb.xg, d, e0, e1, st, inter, (wset){w1, s1, wb.g}, &up3, err);
        if (rc) di_error_wrap(err, "moe_grouped experts %d-%d (up)", e0, e1 - 1);
        e0 = e1;
    }
    if (!rc && n > 0) rc = di_cuda_swiglu(be, wb.g, wb.u, n, inter, plan->roww, lim, wb.a, err);
    for (int e0 = 0; e0 < n_exp && !rc;) { /* down: w2 → y (y overwrites xg: every up GEMM above has read it) */
        const int e1 = chunk_end(st, e0, n_exp);
        rc = grouped_gemm(be, wb.a, inter, e0, e1, st, d, (wset){w2, s2, wb.y}, NULL, err);
        if (rc) di_error_wrap(err, "moe_grouped experts %d-%d (down)", e0, e1 - 1);
        e0 = e1;
    }
    return rc ? rc : combine(be, plan, wb.y, m, d, k, acc, err);
}

/* ---------------- the experts' tensor-map tables, per backend and layer ----------------
 * Built from the expert table's pointers on a layer's first call and kept: an entry is found again by
 * comparing every pointer (and the shapes) it was built from, so a table can never describe other memory
 * than the call's (a TMA map is the address and shape it encodes; weights freed and reallocated at the same
 * addresses with the same shapes are described correctly too). A failed build is kept as well (t[] NULL:
 * the call runs the loop). A backend is driven by one thread at a time (one stream), so its own entries
 * change only under its caller; the lock guards the shared list. */
#define TABLES_PER_BACKEND 256 /* a layer each; the oldest goes beyond this (weights reloaded elsewhere) */

typedef struct tables {
    const di_backend *be;
    int n_exp;
    int64_t d, inter;
    const uint8_t **key;      /* host [n_exp · 6]: w1 s1 w3 s3 w2 s2 per expert */
    di_wgmma_experts *t[3];   /* w1 [inter, d], w3 [inter, d], w2 [d, inter]; NULL after a failed build */
    struct tables *next;
} tables;

static tables *g_tables; /* newest first */
static pthread_mutex_t g_tables_lock = PTHREAD_MUTEX_INITIALIZER;

static void tables_free(tables *t) {
    for (int j = 0; j < 3; j++) di_cuda_wgmma_experts_destroy(t->t[j]);
    free(t->key);
    free(t);
}

extern "C" void di_cuda_moe_grouped_release(const di_backend *be) {
    pthread_mutex_lock(&g_tables_lock);
    for (tables **pp = &g_tables; *pp;) {
        tables *t = *pp;
        if (t->be == be) *pp = t->next, tables_free(t);
        else pp = &t->next;
    }
    pthread_mutex_unlock(&g_tables_lock);
}

static void fill_key(const di_moe_expert *experts, int n_exp, const uint8_t **key) {
    for (int e = 0; e < n_exp; e++) {
        const di_moe_expert *ex = &experts[e];
        const uint8_t *p[6] = {ex->w1, ex->s1, ex->w3, ex->s3, ex->w2, ex->s2};
        memcpy(key + 6 * e, p, sizeof p);
    }
}

/* The layer's tables (NULL where they cannot be built; err is left clear then); DI_ERR_NOMEM only for
 * host memory. */
static int tables_get(const di_backend *be, const di_moe_expert *experts, int n_exp, int64_t d, int64_t inter,
                      tables **out, di_error *err) {
    const size_t key_bytes = sizeof(const uint8_t *) * 6 * (size_t)n_exp;
    const uint8_t **key = (const uint8_t **)malloc(key_bytes);
    if (!key) return di_error_set(err, DI_ERR_NOMEM, "cuda moe_grouped: key of %d experts", n_exp);
    fill_key(experts, n_exp, key);
    pthread_mutex_lock(&g_tables_lock);
    int own = 0;
    tables *hit = NULL, **oldest = NULL;
    for (tables **pp = &g_tables; *pp; pp = &(*pp)->next) {
        tables *t = *pp;
        if (t->be != be) continue;
        own++, oldest = pp;
        if (!hit && t->n_exp == n_exp && t->d == d && t->inter == inter && t->key[0] == key[0] &&
            !memcmp(t->key, key, key_bytes))
            hit = t;
    }
    if (hit) {
        pthread_mutex_unlock(&g_tables_lock);
        free(key);
        *out = hit->t[0] ? hit : NULL;
        return DI_OK;
    }
    if (own >= TABLES_PER_BACKEND && oldest) { /* cudaFree in the destroy waits for kernels still reading it */
        tables *t = *oldest;
        *oldest = t->next;
        tables_free(t);
    }
    tables *t = (tables *)calloc(1, sizeof *t);
    const uint8_t **w = (const uint8_t **)malloc(sizeof *w * (size_t)n_exp);
    const uint8_t **s = (const uint8_t **)malloc(sizeof *s * (size_t)n_exp);
    if (!t || !w || !s) {
        pthread_mutex_unlock(&g_tables_lock);
        free(t), free(w), free(s), free(key);
        return di_error_set(err, DI_ERR_NOMEM, "cuda moe_grouped: tables of %d experts", n_exp);
    }
    t->be = be, t->n_exp = n_exp, t->d = d, t->inter = inter, t->key = key;
    di_error quiet; /* a table that cannot be built sends the layer to the loop; not an error of the call */
    int rc = DI_OK;
    for (int j = 0; j < 3 && !rc; j++) { /* key columns: w1 s1 | w3 s3 | w2 s2 */
        for (int e = 0; e < n_exp; e++) w[e] = key[6 * e + 2 * j], s[e] = key[6 * e + 2 * j + 1];
        rc = di_cuda_wgmma_experts_create(n_exp, w, s, j < 2 ? inter : d, j < 2 ? d : inter, &t->t[j], &quiet);
    }
    if (rc) {
        for (int j = 0; j < 3; j++) di_cuda_wgmma_experts_destroy(t->t[j]), t->t[j] = NULL;
        cudaGetLastError();
    } else {
        /* the tables were copied with cudaMemcpy on the legacy stream, which the backend's non-blocking
         * stream does not wait for */
        cudaDeviceSynchronize();
    }
    t->next = g_tables, g_tables = t;
    pthread_mutex_unlock(&g_tables_lock);
    free(w), free(s);
    *out = t->t[0] ? t : NULL;
    return DI_OK;
}

extern "C" int di_cuda_moe_grouped_wgmma(const di_backend *be, const uint16_t *x, int64_t m, int64_t d, int64_t inter,
                                         int k, int n_exp, const di_moe_expert *experts, const di_moe_plan *plan,
                                         float lim, float *acc, void *ws, di_error *err) {
    int rc = check_args("moe_grouped", m, d, inter, k, n_exp, experts, plan, ws, err);
    if (rc) return rc;
    const int64_t n = plan->n;
    if (n == 0) return combine(be, plan, NULL, m, d, k, acc, err); /* every token's sum is 0 */
    /* The grouped wgmma GEMMs failed their first H200 run (2026-11-30, "act_quant_fp8: invalid argument"
     * after the tensor-map tables were built; not yet diagnosed): until they pass, the tensor slot runs
     * the per-expert wgmma GEMMs (the same bits) with the one ordered combine. DI_CUDA_MOE_GROUPED=wgmma
     * opts into the grouped launches. */
    const char *mg = getenv("DI_CUDA_MOE_GROUPED");
    if (!mg || strcmp(mg, "wgmma"))
        return expert_loop(be, di_cuda_linear_fp4_wgmma, x, m, d, inter, k, n_exp, experts, plan, lim, acc, ws, err);
    tables *tb;
    if ((rc = tables_get(be, experts, n_exp, d, inter, &tb, err))) return rc;
    if (!tb) return expert_loop(be, di_cuda_linear_fp4_wgmma, x, m, d, inter, k, n_exp, experts, plan, lim, acc, ws, err);

    /* backend workspace: token codes e4m3 [m, d] + E8M0 [m, d/32]; row codes [n, max(d, inter)] + scales */
    const int64_t kmax = d > inter ? d : inter;
    const size_t tq = al256((size_t)(m * d)), ts = al256((size_t)(m * d / 32)), rq = al256((size_t)(n * kmax));
    const size_t rs = al256((size_t)(n * kmax / 32));
    void *wsp;
    if ((rc = di_cuda_workspace(be, tq + ts + rq + rs, &wsp, err))) return rc;
    uint8_t *xq_t = (uint8_t *)wsp, *xs_t = xq_t + tq, *xq = xs_t + ts, *xs = xq + rq;
    const ws_bufs w = split_ws(ws, n, d, inter);
    cudaStream_t st = di_cuda_state(be)->stream;

    if ((rc = di_cuda_act_quant_fp8(x, m * d, 32, xq_t, xs_t, st, err))) return rc;
    gather_codes_kernel<<<(unsigned)n, 128, 0, st>>>(xq_t, xs_t, m, d, plan->rows, xq, xs);
    if ((rc = di_cuda_launched("moe_grouped gather codes", err))) return rc;
    const di_wgmma_experts *up[2] = {tb->t[0], tb->t[1]}, *down[1] = {tb->t[2]};
    uint16_t *gu[2] = {w.g, w.u}, *yo[1] = {w.y};
    rc = di_cuda_wgmma_fp4_grouped(up, gu, 2, xq, xs, n, plan->start, st, err);
    if (rc == DI_ERR_UNSUPPORTED) { /* the persistent kernel cannot run on this device: the same bits per expert */
        di_error_clear(err);
        return expert_loop(be, di_cuda_linear_fp4_wgmma, x, m, d, inter, k, n_exp, experts, plan, lim, acc, ws, err);
    }
    if (rc) return rc;
    if ((rc = di_cuda_swiglu(be, w.g, w.u, n, inter, plan->roww, lim, w.a, err))) return rc;
    if ((rc = di_cuda_act_quant_fp8(w.a, n * inter, 32, xq, xs, st, err))) return rc;
    if ((rc = di_cuda_wgmma_fp4_grouped(down, yo, 1, xq, xs, n, plan->start, st, err))) return rc;
    g_last_path = 1;
    return combine(be, plan, w.y, m, d, k, acc, err);
}
