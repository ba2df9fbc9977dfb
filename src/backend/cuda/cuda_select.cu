/* Index scoring and the exact selections on the GPU (spec §4.4, §5.1, §5.3, §5.6): lightning-indexer
 * scores with the reference's bf16 rounding points (indexer.c), the two-level candidate mask and the
 * top-k (topk.c), both with the GPU tie rule "higher score first, then lower position".
 *
 * Selection = the CPU's radix select, block-parallel: four 8-bit histogram passes over the order-
 * preserving keys find the k-th largest key T and how many entries equal to T still fit; an ascending
 * block scan then emits every key > T and the first (lowest-position) entries equal to T. The outputs
 * are the same sets, in the same ascending order, as di_cpu_topk / di_cpu_candidate_mask. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

/* ---------------- indexer scores ---------------- */
#define IDX_KEYS 128 /* keys per block (one per thread) */

/* One thread per key. The per-head dot product is indexer.c's dot_bf16 order (8 strided f32 lanes,
 * combined pairwise), then the bf16 roundings of einsum, relu·w' and the head sum.
 * grid (ceil(nk/128), m); dynamic shared: q f32 [nh, hd] ‖ w' f32 [nh] ‖ keys bf16-pairs u32 [128, hd/2 + 1]
 * (the +1 word staggers rows over the banks). hd even. */
__global__ void __launch_bounds__(IDX_KEYS) indexer_kernel(const uint16_t *q, const uint16_t *w, float w_scale,
                                                           const uint16_t *k, int nh, int hd, int64_t nk,
                                                           const int32_t *vis, const uint8_t *cand, float *scores) {
    extern __shared__ float ish[]; /* layout above */
    const int64_t i = blockIdx.y, n0 = (int64_t)blockIdx.x * IDX_KEYS;
    const int hw = hd / 2 + 1;
    float *qs = ish, *wsc = ish + nh * hd;
    uint32_t *ks = (uint32_t *)(wsc + nh);
    for (int e = threadIdx.x; e < nh * hd; e += blockDim.x) qs[e] = d_bf16(q[i * nh * hd + e]);
    for (int h = threadIdx.x; h < nh; h += blockDim.x) wsc[h] = d_round_bf16(__fmul_rn(d_bf16(w[i * nh + h]), w_scale));
    for (int e = threadIdx.x; e < IDX_KEYS * (hd / 2); e += blockDim.x) {
        int r = e / (hd / 2), c = e % (hd / 2);
        ks[r * hw + c] = n0 + r < nk ? *(const uint32_t *)(k + (n0 + r) * hd + 2 * c) : 0u;
    }
    __syncthreads();
    const int64_t n = n0 + threadIdx.x;
    if (n >= nk) return;
    float *out = scores + i * nk + n;
    if (n >= vis[i] || (cand && !cand[i * nk + n])) {
        *out = -INFINITY;
        return;
    }
    const uint32_t *kr = ks + threadIdx.x * hw;
    float acc = 0.0f;
    for (int h = 0; h < nh; h++) {
        const float *qh = qs + h * hd;
        float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int j = 0;
        for (; j + 8 <= hd; j += 8) {
#pragma unroll
            for (int p = 0; p < 4; p++) {
                uint32_t v = kr[j / 2 + p];
                lane[2 * p] = __fadd_rn(lane[2 * p], __fmul_rn(qh[j + 2 * p], d_bf16((uint16_t)v)));
                lane[2 * p + 1] = __fadd_rn(lane[2 * p + 1], __fmul_rn(qh[j + 2 * p + 1], d_bf16((uint16_t)(v >> 16))));
            }
        }
        for (; j < hd; j++) { /* hd % 8 tail, lane j & 7 (never taken at V4.1's hd = 128) */
            uint32_t v = kr[j / 2];
            float kv = d_bf16((uint16_t)(j & 1 ? v >> 16 : v));
            switch (j & 7) {
            case 0: lane[0] = __fadd_rn(lane[0], __fmul_rn(qh[j], kv)); break;
            case 2: lane[2] = __fadd_rn(lane[2], __fmul_rn(qh[j], kv)); break;
            case 4: lane[4] = __fadd_rn(lane[4], __fmul_rn(qh[j], kv)); break;
            default: lane[6] = __fadd_rn(lane[6], __fmul_rn(qh[j], kv)); break; /* hd even: j & 7 even here */
            }
        }
        float dt = __fadd_rn(__fadd_rn(__fadd_rn(lane[0], lane[1]), __fadd_rn(lane[2], lane[3])),
                             __fadd_rn(__fadd_rn(lane[4], lane[5]), __fadd_rn(lane[6], lane[7])));
        float d = d_round_bf16(dt);
        float r = d > 0.0f ? d : 0.0f;
        acc = __fadd_rn(acc, d_round_bf16(__fmul_rn(r, wsc[h])));
    }
    *out = d_round_bf16(acc);
}

extern "C" int di_cuda_indexer_scores(const di_backend *be, const uint16_t *q, const uint16_t *w, float w_scale,
                                      const uint16_t *k, int64_t m, int nh, int hd, int64_t nk, const int32_t *vis,
                                      const uint8_t *cand, float *scores, di_error *err) {
    size_t shm = sizeof(float) * ((size_t)nh * hd + nh) + sizeof(uint32_t) * IDX_KEYS * (size_t)(hd / 2 + 1);
    if (m < 0 || nk < 0 || nh < 1 || hd < 2 || hd % 2 || shm > 200 * 1024)
        return di_error_set(err, DI_ERR_INVALID, "cuda indexer_scores: %lld queries, %lld keys, %d heads × %d (even, ≤ 200 KiB staged)",
                            (long long)m, (long long)nk, nh, hd);
    if (m == 0 || nk == 0) return DI_OK;
    cudaFuncSetAttribute(indexer_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
    dim3 grid(di_cuda_blocks(nk, IDX_KEYS), (unsigned)m);
    indexer_kernel<<<grid, IDX_KEYS, shm, di_cuda_state(be)->stream>>>(q, w, w_scale, k, nh, hd, nk, vis, cand, scores);
    return di_cuda_launched("indexer_scores", err);
}

/* ---------------- block-parallel exact selection ---------------- */
#define SEL_THREADS 512

static __device__ __forceinline__ uint32_t order_key(float f) {
    if (f == 0.0f) f = 0.0f; /* −0 → +0 */
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static __device__ __forceinline__ bool selectable(float f) { return f > -INFINITY; } /* not −inf, not NaN */

typedef struct sel_cut {
    int all;          /* every selectable entry is taken */
    uint32_t key;     /* the k-th largest key */
    long long ties;   /* how many entries with key == `key` are taken (the first ones) */
} sel_cut;

/* Exclusive block scan of one int per thread (SEL_THREADS threads): returns the thread's prefix and
 * sets *total to the block's sum. sh: 33 ints. */
static __device__ int block_scan_excl(int v, int *sh, int *total) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int incl = v;
    for (int o = 1; o < 32; o <<= 1) {
        int t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
    }
    __syncthreads(); /* sh may still be read from the previous call */
    if (lane == 31) sh[w] = incl;
    __syncthreads();
    if (w == 0) {
        int s = lane < SEL_THREADS / 32 ? sh[lane] : 0, si = s;
        for (int o = 1; o < 32; o <<= 1) {
            int t = __shfl_up_sync(0xffffffffu, si, o);
            if (lane >= o) si += t;
        }
        sh[lane] = si - s;
        if (lane == 31) sh[32] = si;
    }
    __syncthreads();
    *total = sh[32];
    return sh[w] + incl - v;
}

/* Finds the cut of a top-k over s[0, n) (s in global memory); every thread gets it. hist: 256 ints. */
static __device__ sel_cut block_find_cut(const float *s, int64_t n, int64_t k, unsigned *hist) {
    __shared__ sel_cut c;               /* the cut, shared by every thread */
    __shared__ unsigned long long cnt;  /* selectable entries */
    if (threadIdx.x == 0) cnt = 0;
    __syncthreads();
    unsigned long long local = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) local += selectable(s[i]);
    atomicAdd(&cnt, local);
    __syncthreads();
    if (threadIdx.x == 0) c.all = (long long)cnt <= k, c.key = 0, c.ties = k;
    __syncthreads();
    if (c.all) return c;
    uint32_t prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            float f = s[i];
            if (!selectable(f)) continue;
            uint32_t key = order_key(f);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            long long need = c.ties;
            int b = 255;
            while ((long long)hist[b] < need) need -= hist[b--];
            c.ties = need;
            c.key |= (uint32_t)b << shift;
        }
        __syncthreads();
        prefix = c.key;
        mask |= 255u << shift;
    }
    return c;
}

/* Where an emission goes: a top-k row (out != NULL: taken position i → out[pos] = i + offset) or a
 * candidate mask row (taken or not, block i's entries of mask get the decision). */
typedef struct sel_sink {
    int32_t *out;  /* int32 [k] of this row, or NULL */
    int32_t offset;
    uint8_t *mask; /* uint8 [nk] of this row (when out is NULL) */
    int64_t nk;
    int block;
} sel_sink;

/* Walks s[0, n) in ascending position in chunks of SEL_THREADS, deciding each entry against the cut
 * (equal keys taken lowest position first, through a block scan of the equal flags) and emitting it.
 * Returns the number taken. */
static __device__ int block_emit(const float *s, int64_t n, sel_cut c, int *sh, sel_sink e) {
    int base = 0;
    long long eq_before = 0;
    for (int64_t c0 = 0; c0 < n; c0 += SEL_THREADS) {
        int64_t i = c0 + threadIdx.x;
        float f = i < n ? s[i] : -INFINITY;
        bool sel = selectable(f);
        uint32_t key = order_key(f);
        bool gt = sel && (c.all || key > c.key), eq = sel && !c.all && key == c.key;
        int eq_total, take_total;
        int eq_prefix = block_scan_excl(eq, sh, &eq_total);
        bool take = gt || (eq && eq_before + eq_prefix < c.ties);
        int pos = block_scan_excl(take, sh, &take_total);
        if (i < n) {
            if (e.out) {
                if (take) e.out[base + pos] = (int32_t)i + e.offset;
            } else {
                int64_t end = (i + 1) * e.block < e.nk ? (i + 1) * e.block : e.nk;
                for (int64_t j = i * e.block; j < end; j++) e.mask[j] = take;
            }
        }
        base += take_total;
        eq_before += eq_total;
    }
    return base;
}

/* One block per query row: the top-k of its vis[i] visible scores, positions ascending + offset, −1 pad. */
__global__ void __launch_bounds__(SEL_THREADS) topk_kernel(const float *scores, int64_t nk, const int32_t *vis, int k,
                                                           int32_t offset, int32_t *out) {
    __shared__ unsigned hist[256]; /* radix histogram of one 8-bit digit */
    __shared__ int sh[33];         /* block-scan scratch: warp sums + total */
    const int64_t i = blockIdx.x;
    int64_t n = vis[i] < 0 ? 0 : (vis[i] > nk ? nk : vis[i]);
    const float *s = scores + i * nk;
    sel_cut c = block_find_cut(s, n, k, hist);
    sel_sink e = {out + i * k, offset, NULL, 0, 0};
    int taken = block_emit(s, n, c, sh, e);
    for (int j = taken + threadIdx.x; j < k; j += SEL_THREADS) out[i * k + j] = -1;
}

extern "C" int di_cuda_topk(const di_backend *be, const float *scores, int64_t m, int64_t nk, const int32_t *vis, int k,
                            int32_t offset, int32_t *out, di_error *err) {
    if (m < 0 || nk < 0 || k < 0 || k > nk || offset < 0 || nk > INT32_MAX)
        return di_error_set(err, DI_ERR_INVALID, "cuda topk: %lld rows, k = %d of %lld entries, offset %d", (long long)m, k,
                            (long long)nk, offset);
    if (m == 0 || k == 0) return DI_OK;
    topk_kernel<<<(unsigned)m, SEL_THREADS, 0, di_cuda_state(be)->stream>>>(scores, nk, vis, k, offset, out);
    return di_cuda_launched("topk", err);
}

/* One block per query row: block maxima (NaN never wins, as topk.c's `>` scan), the newest visible
 * entry's block pinned to +inf, the best min(topk_blocks, n_blocks) selectable blocks kept.
 * blk f32 [m, n_blocks] device scratch. */
__global__ void __launch_bounds__(SEL_THREADS) candidate_kernel(const float *scores, int64_t nk, const int32_t *vis,
                                                                int block, int64_t kb, float *blk_all, uint8_t *mask) {
    __shared__ unsigned hist[256]; /* radix histogram of one 8-bit digit */
    __shared__ int sh[33];         /* block-scan scratch: warp sums + total */
    const int64_t i = blockIdx.x, nb = (nk + block - 1) / block;
    const float *s = scores + i * nk;
    float *blk = blk_all + i * nb;
    for (int64_t b = threadIdx.x; b < nb; b += SEL_THREADS) {
        float mx = -INFINITY;
        int64_t end = (b + 1) * block < nk ? (b + 1) * block : nk;
        for (int64_t n = b * block; n < end; n++) mx = s[n] > mx ? s[n] : mx;
        blk[b] = mx;
    }
    __syncthreads();
    if (threadIdx.x == 0 && vis[i] > 0) blk[(vis[i] - 1) / block] = INFINITY;
    __syncthreads();
    sel_cut c = block_find_cut(blk, nb, kb, hist);
    sel_sink e = {NULL, 0, mask + i * nk, nk, block};
    block_emit(blk, nb, c, sh, e);
}

extern "C" int di_cuda_candidate_mask(const di_backend *be, const float *scores, int64_t m, int64_t nk,
                                      const int32_t *vis, int block, int topk_blocks, uint8_t *mask, float *ws,
                                      di_error *err) {
    (void)ws; /* one row of scratch is not enough for a row-parallel kernel: the backend workspace is used */
    if (m < 0 || nk < 0 || block < 1 || topk_blocks < 0)
        return di_error_set(err, DI_ERR_INVALID, "cuda candidate_mask: %lld rows, %lld entries, block %d, top %d blocks",
                            (long long)m, (long long)nk, block, topk_blocks);
    int64_t nb = (nk + block - 1) / block, kb = topk_blocks < nb ? topk_blocks : nb;
    if (m == 0 || nb == 0) return DI_OK;
    void *blk;
    int rc = di_cuda_workspace(be, sizeof(float) * (size_t)(m * nb), &blk, err);
    if (rc) return rc;
    candidate_kernel<<<(unsigned)m, SEL_THREADS, 0, di_cuda_state(be)->stream>>>(scores, nk, vis, block, kb, (float *)blk,
                                                                                 mask);
    return di_cuda_launched("candidate_mask", err);
}
