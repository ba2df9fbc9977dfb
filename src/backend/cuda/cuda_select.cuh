/* The per-row device code of the index path (spec §4.4, §5.1, §5.3, §5.6), shared by the per-sequence
 * kernels (cuda_select.cu, cuda_select_torch.cu, cuda_fused.cu's gather_topk) and the batched ones
 * (cuda_index_seqs.cu): each function computes one row (or one tile of a row) of its op from row
 * pointers and the row's own sizes, so a kernel over the rows of one call and a kernel over rows with
 * their own widths run the same instructions on each row and agree bit for bit by construction. */
#ifndef DI_BACKEND_CUDA_CUDA_SELECT_CUH
#define DI_BACKEND_CUDA_CUDA_SELECT_CUH

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_heap_pipe.cuh"

#include <cooperative_groups.h>

/* ---------------- indexer scores ---------------- */
#define IDX_KEYS 128 /* keys per block (one per thread) */

/* Dynamic shared memory of d_index_tile: q f32 [nh, hd] ‖ w' f32 [nh] ‖ keys bf16-pairs u32 [128, hd/2 + 1]. */
static inline size_t d_index_tile_shm(int nh, int hd) {
    return sizeof(float) * ((size_t)nh * hd + nh) + sizeof(uint32_t) * IDX_KEYS * (size_t)(hd / 2 + 1);
}

/* Row n of a key set read where the cache keeps it (backend.h di_index_row kbase): entry min(n, kn − 1)
 * through the block table (gather_topk's translation), rows of the index-key codec (DI_CODEC_FP4_E8M0:
 * hd/2 bytes of E2M1 pairs, low nibble first, then one E8M0 scale per 32 values). */
static __device__ __forceinline__ const uint8_t *d_key_row(const di_index_row &r, int64_t n, int hd) {
    const int64_t e = n < r.kn ? n : r.kn - 1;
    const int64_t row = r.kpages ? (int64_t)r.kpages[e / r.kpage_entries] * r.kpage_rows + r.krow0 + e % r.kpage_entries
                                 : e;
    return r.kbase + row * (hd / 2 + hd / 32);
}

/* Value j of a key row as row_decode gives it: bf16(f32(code) · f32(scale)), as f32. */
static __device__ __forceinline__ float d_key_value(uint32_t code, float scale) {
    return d_round_bf16(__fmul_rn(d_e2m1_decode(code), scale));
}

/* Stages q (f32), the scaled weights w' = bf16(w · w_scale) and, with ks, the tile's 128 keys as
 * bf16 pairs: keys [n0, n0 + 128) of k, or of the cache rows of r (k NULL). */
static __device__ __forceinline__ void d_index_stage(const uint16_t *q, const uint16_t *w, float w_scale,
                                                     const uint16_t *k, const di_index_row *r, int nh, int hd,
                                                     int64_t nk, int64_t n0, float *ish) {
    const int hw = hd / 2 + 1;
    float *qs = ish, *wsc = ish + nh * hd;
    uint32_t *ks = (uint32_t *)(wsc + nh);
    for (int e = threadIdx.x; e < nh * hd; e += blockDim.x) qs[e] = d_bf16(q[e]);
    for (int h = threadIdx.x; h < nh; h += blockDim.x) wsc[h] = d_round_bf16(__fmul_rn(d_bf16(w[h]), w_scale));
    for (int e = threadIdx.x; e < IDX_KEYS * (hd / 2); e += blockDim.x) {
        int rr = e / (hd / 2), c = e % (hd / 2);
        uint32_t v = 0u;
        if (n0 + rr < nk && k) {
            v = *(const uint32_t *)(k + (n0 + rr) * hd + 2 * c);
        } else if (n0 + rr < nk && r) {
            const uint8_t *kb = d_key_row(*r, n0 + rr, hd);
            float s = d_e8m0(kb[hd / 2 + 2 * c / 32]);
            uint32_t b = kb[c];
            v = (uint32_t)d_to_bf16(d_key_value(b & 15u, s)) | (uint32_t)d_to_bf16(d_key_value(b >> 4, s)) << 16;
        }
        ks[rr * hw + c] = v;
    }
}

/* Keys [n0, n0 + 128) of one query's score row, one thread per key (block of IDX_KEYS threads), from
 * the staged tile (d_index_stage). The per-head dot product is indexer.c's dot_bf16 order (8 strided
 * f32 lanes, combined pairwise), then the bf16 roundings of einsum, relu·w' and the head sum.
 *   cand uint8 [nk] or NULL;  scores f32 [nk];  ish: d_index_tile_shm bytes (the +1 word staggers key
 *   rows over the banks). hd even. */
static __device__ __forceinline__ void d_index_tile_scores(int nh, int hd, int64_t nk, int32_t vis,
                                                           const uint8_t *cand, float *scores, int64_t n0,
                                                           const float *ish) {
    const int hw = hd / 2 + 1;
    const float *qs = ish, *wsc = ish + nh * hd;
    const uint32_t *ks = (const uint32_t *)(wsc + nh);
    const int64_t n = n0 + threadIdx.x;
    if (n >= nk) return;
    float *out = scores + n;
    if (n >= vis || (cand && !cand[n])) {
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
        float rl = d > 0.0f ? d : 0.0f;
        acc = __fadd_rn(acc, d_round_bf16(__fmul_rn(rl, wsc[h])));
    }
    *out = d_round_bf16(acc);
}

/* One query's tile of bf16 keys: q bf16 [nh, hd];  w bf16 [nh];  k bf16 [nk, hd]. */
static __device__ __forceinline__ void d_index_tile(const uint16_t *q, const uint16_t *w, float w_scale,
                                                    const uint16_t *k, int nh, int hd, int64_t nk, int32_t vis,
                                                    const uint8_t *cand, float *scores, int64_t n0, float *ish) {
    d_index_stage(q, w, w_scale, k, NULL, nh, hd, nk, n0, ish);
    __syncthreads();
    d_index_tile_scores(nh, hd, nk, vis, cand, scores, n0, ish);
}

/* ---- the same scores with the key in registers (hd = HD, a multiple of 32 up to 128) ----
 * The products and sums of d_index_tile_scores in the same order; the key's HD values are converted
 * once into registers instead of being unpacked from shared memory for every head (the unpacking and
 * its loads were half the instructions), and a key read where the cache keeps it is decoded there
 * (d_key_value: row_decode's value) instead of being read back from a decoded copy.
 *   shared: q f32 [nh, HD] ‖ w' f32 [nh] (d_index_reg_shm) */
static inline size_t d_index_reg_shm(int nh, int hd) { return sizeof(float) * ((size_t)nh * hd + nh); }

template <int HD>
static __device__ __forceinline__ void d_key_regs(const di_index_row &r, int64_t n, float *kf) {
    if (r.keys) {
        const uint32_t *kw = (const uint32_t *)(r.keys + n * HD);
#pragma unroll
        for (int j = 0; j < HD / 2; j++) {
            uint32_t v = kw[j];
            kf[2 * j] = d_bf16((uint16_t)v), kf[2 * j + 1] = d_bf16((uint16_t)(v >> 16));
        }
        return;
    }
    const uint8_t *kb = d_key_row(r, n, HD);
    const bool words = (HD / 2 + HD / 32) % 4 == 0 && (uintptr_t)kb % 4 == 0; /* hd = 128: 68-byte rows */
#pragma unroll
    for (int g = 0; g < HD / 32; g++) {
        const float s = d_e8m0(kb[HD / 2 + g]);
#pragma unroll
        for (int b4 = 0; b4 < 4; b4++) {
            uint32_t v = words ? ((const uint32_t *)kb)[g * 4 + b4]
                               : (uint32_t)kb[g * 16 + b4 * 4] | (uint32_t)kb[g * 16 + b4 * 4 + 1] << 8 |
                                     (uint32_t)kb[g * 16 + b4 * 4 + 2] << 16 | (uint32_t)kb[g * 16 + b4 * 4 + 3] << 24;
#pragma unroll
            for (int c = 0; c < 8; c++) kf[g * 32 + b4 * 8 + c] = d_key_value((v >> (4 * c)) & 15u, s);
        }
    }
}

template <int HD>
static __device__ __forceinline__ float d_score_regs(const float *qs, const float *wsc, int nh, const float *kf) {
    float acc = 0.0f;
    for (int h = 0; h < nh; h++) {
        const float4 *q4 = (const float4 *)(qs + h * HD);
        float l0 = 0, l1 = 0, l2 = 0, l3 = 0, l4 = 0, l5 = 0, l6 = 0, l7 = 0;
#pragma unroll
        for (int j = 0; j < HD; j += 8) {
            const float4 a = q4[j / 4], b = q4[j / 4 + 1];
            l0 = __fadd_rn(l0, __fmul_rn(a.x, kf[j])), l1 = __fadd_rn(l1, __fmul_rn(a.y, kf[j + 1]));
            l2 = __fadd_rn(l2, __fmul_rn(a.z, kf[j + 2])), l3 = __fadd_rn(l3, __fmul_rn(a.w, kf[j + 3]));
            l4 = __fadd_rn(l4, __fmul_rn(b.x, kf[j + 4])), l5 = __fadd_rn(l5, __fmul_rn(b.y, kf[j + 5]));
            l6 = __fadd_rn(l6, __fmul_rn(b.z, kf[j + 6])), l7 = __fadd_rn(l7, __fmul_rn(b.w, kf[j + 7]));
        }
        float dt = __fadd_rn(__fadd_rn(__fadd_rn(l0, l1), __fadd_rn(l2, l3)),
                             __fadd_rn(__fadd_rn(l4, l5), __fadd_rn(l6, l7)));
        float d = d_round_bf16(dt);
        float rl = d > 0.0f ? d : 0.0f;
        acc = __fadd_rn(acc, d_round_bf16(__fmul_rn(rl, wsc[h])));
    }
    return d_round_bf16(acc);
}

/* ---------------- block-parallel exact selection (cuda_select.cu) ---------------- */
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

/* Exclusive prefix over the CTA (any multiple of 32 threads) of one u64 per thread; *total: the CTA's sum.
 * sh: 33 words. */
static __device__ unsigned long long cta_scan_excl_u64(unsigned long long v, unsigned long long *sh,
                                                       unsigned long long *total) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    unsigned long long incl = v;
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
    }
    __syncthreads(); /* sh may still be read from the previous call */
    if (lane == 31) sh[w] = incl;
    __syncthreads();
    if (w == 0) {
        const unsigned long long x = lane < nw ? sh[lane] : 0;
        unsigned long long xi = x;
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned long long t = __shfl_up_sync(0xffffffffu, xi, o);
            if (lane >= o) xi += t;
        }
        sh[lane] = xi - x;
        if (lane == 31) sh[32] = xi;
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
static __device__ int block_emit(const float *s, int64_t n, sel_cut c, unsigned long long *sh, sel_sink e) {
    int base = 0;
    long long eq_before = 0;
    for (int64_t c0 = 0; c0 < n; c0 += SEL_THREADS) {
        int64_t i = c0 + threadIdx.x;
        float f = i < n ? s[i] : -INFINITY;
        bool sel = selectable(f);
        uint32_t key = order_key(f);
        bool gt = sel && (c.all || key > c.key), eq = sel && !c.all && key == c.key;
        unsigned long long eq_total, take_total;
        const int eq_prefix = (int)cta_scan_excl_u64(eq, sh, &eq_total);
        bool take = gt || (eq && eq_before + eq_prefix < c.ties);
        const int pos = (int)cta_scan_excl_u64(take, sh, &take_total);
        if (i < n) {
            if (e.out) {
                if (take) e.out[base + pos] = (int32_t)i + e.offset;
            } else {
                int64_t end = (i + 1) * e.block < e.nk ? (i + 1) * e.block : e.nk;
                for (int64_t j = i * e.block; j < end; j++) e.mask[j] = take;
            }
        }
        base += (int)take_total;
        eq_before += (long long)eq_total;
    }
    return base;
}

/* One query row's top-k (one block of SEL_THREADS): the best k of its vis visible scores (clamped to
 * [0, nk]), positions ascending + offset, −1 padded to kp ≥ k. k = 0 selects nothing.
 *   s f32 [nk];  out int32 [kp] */
static __device__ void d_topk_row(const float *s, int64_t nk, int32_t vis, int k, int32_t offset, int32_t *out, int kp) {
    __shared__ unsigned hist[256]; /* radix histogram of one 8-bit digit */
    __shared__ unsigned long long sh[33]; /* block-scan scratch: warp sums + total */
    int taken = 0;
    if (k > 0) {
        int64_t n = vis < 0 ? 0 : (vis > nk ? nk : vis);
        sel_cut c = block_find_cut(s, n, k, hist);
        sel_sink e = {out, offset, NULL, 0, 0};
        taken = block_emit(s, n, c, sh, e);
    }
    for (int j = taken + threadIdx.x; j < kp; j += SEL_THREADS) out[j] = -1;
}

/* One query row's candidate mask (one block of SEL_THREADS): block maxima (NaN never wins, as topk.c's
 * `>` scan), the newest visible entry's block pinned to +inf, the best kb selectable blocks kept.
 *   s f32 [nk];  blk f32 [ceil(nk / block)] scratch;  mask uint8 [nk] */
static __device__ void d_candidate_row(const float *s, int64_t nk, int32_t vis, int block, int64_t kb, float *blk,
                                       uint8_t *mask) {
    __shared__ unsigned hist[256]; /* radix histogram of one 8-bit digit */
    __shared__ unsigned long long sh[33]; /* block-scan scratch: warp sums + total */
    const int64_t nb = (nk + block - 1) / block;
    for (int64_t b = threadIdx.x; b < nb; b += SEL_THREADS) {
        float mx = -INFINITY;
        int64_t end = (b + 1) * block < nk ? (b + 1) * block : nk;
        for (int64_t n = b * block; n < end; n++) mx = s[n] > mx ? s[n] : mx;
        blk[b] = mx;
    }
    __syncthreads();
    if (threadIdx.x == 0 && vis > 0) blk[(vis - 1) / block] = INFINITY;
    __syncthreads();
    sel_cut c = block_find_cut(blk, nb, kb, hist);
    sel_sink e = {NULL, 0, mask, nk, block};
    block_emit(blk, nb, c, sh, e);
}

/* ---------------- torch's CPU selection, replayed (cuda_select_torch.cu) ---------------- */
/* torch's order as an unsigned key: before(x, y) iff torch_key(x.v) > torch_key(y.v) (NaN highest, all NaNs
 * equal; then by value, −0 = +0). torch_val maps a key back to a value of the same order (the one value per
 * key: +0 for ±0, the canonical NaN). */
#define KEY_NAN 0xFFFFFFFEu /* above +inf's key; 0xFFFFFFFF is the heap path's pad key (HEAP_PAD_KEY) */
#define KEY_NEG_INF 0x007FFFFFu /* key of −inf */
static __device__ __forceinline__ uint32_t torch_key(float f) {
    if (isnan(f)) return KEY_NAN;
    uint32_t u = __float_as_uint(f == 0.0f ? 0.0f : f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
static __device__ __forceinline__ float torch_val(uint32_t k) {
    return k == KEY_NAN ? __uint_as_float(0x7fffffffu) : __uint_as_float((k & 0x80000000u) ? k & 0x7fffffffu : ~k);
}

static __device__ __forceinline__ void swap_e(telem *a, telem *b) {
    telem t = *a;
    *a = *b;
    *b = t;
}

static __device__ void heap_select(telem *f, int64_t mid, int64_t len) {
    make_heap_t<false, int64_t>(f, mid);
    for (int64_t i = mid; i < len; i++)
        if (before(f[i], f[0])) {
            telem val = f[i];
            f[i] = f[0];
            adjust_heap_t<false, int64_t>(f, (int64_t)0, mid, val);
        }
}

static __device__ void median_to_first(telem *r, telem *a, telem *b, telem *c) {
    if (before(*a, *b)) {
        if (before(*b, *c))
            swap_e(r, b);
        else if (before(*a, *c))
            swap_e(r, c);
        else
            swap_e(r, a);
    } else if (before(*a, *c))
        swap_e(r, a);
    else if (before(*b, *c))
        swap_e(r, c);
    else
        swap_e(r, b);
}

static __device__ telem *unguarded_partition(telem *first, telem *last, telem *pivot) {
    for (;;) {
        while (before(*first, *pivot)) first++;
        last--;
        while (before(*pivot, *last)) last--;
        if (!(first < last)) return first;
        swap_e(first, last);
        first++;
    }
}

static __device__ void insertion_sort(telem *first, telem *last) {
    if (first == last) return;
    for (telem *i = first + 1; i != last; i++) {
        telem val = *i;
        if (before(val, *first)) {
            for (telem *p = i; p != first; p--) *p = p[-1]; /* memmove(first + 1, first, i − first) */
            *first = val;
        } else {
            telem *j = i, *prev = i - 1;
            while (before(val, *prev)) *j = *prev, j = prev--;
            *j = val;
        }
    }
}

static __device__ int floor_log2(int64_t n) {
    int l = 0;
    while (n >>= 1) l++;
    return l;
}

/* nth_element's loop from a given depth budget (the serial replay, and the tail of nth_element_cta) */
static __device__ void nth_element_at(telem *first, telem *nth, telem *last, int depth) {
    while (last - first > 3) {
        if (depth == 0) {
            heap_select(first, nth - first + 1, last - first);
            swap_e(first, nth);
            return;
        }
        depth--;
        telem *mid = first + (last - first) / 2;
        median_to_first(first, first + 1, mid, last - 1);
        telem *cut = unguarded_partition(first + 1, last, first);
        if (cut <= nth)
            first = cut;
        else
            last = cut;
    }
    insertion_sort(first, last);
}

/* ---- the introselect's partitions on the whole CTA ----
 * cta_partition(a, lo, hi, p) leaves a[lo, hi) exactly as unguarded_partition(a + lo, a + hi, &p) does
 * and returns the same cut. The serial loop scans from the left for the next "left stopper" (an entry
 * not before the pivot) and from the right for the next "right stopper" (an entry the pivot is not
 * before), and swaps the two while the left one lies left of the right one. Entries between the two
 * scans are untouched until a scan reaches them, so swap i pairs the i-th left stopper of the original
 * range (ascending) with its i-th right stopper (descending), for i = 1 … s, where s counts the i with
 * l_i < r_i. With A(x) the left stoppers in [lo, x) and B(x) the right stoppers in [x, hi), l_i < r_i iff
 * A(x) ≥ i and B(x) ≥ i for some x, so s = max over x of min(A(x), B(x)); the 2s swapped positions are
 * distinct, so the swaps run in parallel. The loop then returns the next left stopper: the (s+1)-th
 * original one if it lies left of r_s, else r_s itself, which now holds l_s's entry (a left stopper); for
 * s = 0 the first one (the median-of-three pivot guarantees it exists). scr: 2s ≤ hi − lo ints (the
 * swapped positions). Every thread of the CTA calls it; blockDim.x is a multiple of 32. */
#define PART_MIN 32 /* ranges at most this long are left to the serial loop (thread 0); 256 was 2.5x slower on the
                     * 4K candidate mask (H200, test_cuda_ops [16, 4096] 0.075 -> 0.032 ms) */

/* the CTA's maximum of one int per thread. sh: 32 ints */
static __device__ int cta_max_int(int v, int *sh) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    int r = sh[0];
    for (int i = 1; i < (int)(blockDim.x >> 5); i++) r = max(r, sh[i]);
    return r;
}

static __device__ int64_t cta_partition(telem *a, int64_t lo, int64_t hi, telem p, int32_t *scr) {
    __shared__ unsigned long long s_scan[33];
    __shared__ int s_max[32];
    __shared__ long long s_cut[2];
    const int64_t per = (hi - lo + blockDim.x - 1) / blockDim.x, c0 = min(lo + (int64_t)threadIdx.x * per, hi),
                  c1 = min(c0 + per, hi);
    unsigned nl = 0, nr = 0; /* this thread's left / right stoppers */
    for (int64_t j = c0; j < c1; j++) {
        const telem e = a[j];
        nl += !before(e, p), nr += !before(p, e);
    }
    unsigned long long tot;
    const unsigned long long pre = cta_scan_excl_u64((unsigned long long)nl << 32 | nr, s_scan, &tot);
    const int L0 = (int)(pre >> 32), R0 = (int)(pre & 0xffffffffu), totR = (int)(tot & 0xffffffffu);
    int best = 0, A = L0, R = R0; /* A = A(j); R = right stoppers in [lo, j), so B(j) = totR − R */
    for (int64_t j = c0; j < c1; j++) {
        best = max(best, min(A, totR - R));
        const telem e = a[j];
        A += !before(e, p), R += !before(p, e);
    }
    const int s = cta_max_int(best, s_max);
    if (threadIdx.x == 0) s_cut[0] = hi, s_cut[1] = hi;
    __syncthreads();
    int32_t *lpos = scr, *rpos = scr + s; /* l_i, r_i (0-based i), relative to lo */
    A = L0, R = R0;
    for (int64_t j = c0; j < c1; j++) {
        const telem e = a[j];
        const bool lf = !before(e, p), rf = !before(p, e);
        if (lf) {
            if (A < s) lpos[A] = (int32_t)(j - lo);
            else if (A == s) s_cut[0] = j; /* the (s+1)-th left stopper */
        }
        if (rf) {
            const int b = totR - R - 1; /* right stoppers in (j, hi) */
            if (b < s) rpos[b] = (int32_t)(j - lo);
            if (b == s - 1) s_cut[1] = j; /* r_s */
        }
        A += lf, R += rf;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < s; i += blockDim.x) swap_e(a + lo + lpos[i], a + lo + rpos[i]);
    const int64_t l_next = s_cut[0], r_s = s_cut[1];
    __syncthreads(); /* the swaps are visible and s_cut is read before a next call resets it */
    return s == 0 || l_next < r_s ? l_next : r_s;
}

/* nth_element(a, a + nth, a + len) on the CTA: the same partitions as the serial loop while the range is
 * longer than PART_MIN (median of three by thread 0, the partition by all), then thread 0 finishes with
 * the serial loop and the depth budget left. Every thread calls it; scr: len ints. */
static __device__ void nth_element_cta(telem *a, int64_t nth, int64_t len, int32_t *scr) {
    int64_t first = 0, last = len;
    int depth = 2 * floor_log2(len);
    while (last - first > PART_MIN && depth > 0) {
        depth--;
        const int64_t mid = first + (last - first) / 2;
        if (threadIdx.x == 0) median_to_first(a + first, a + first + 1, a + mid, a + last - 1);
        __syncthreads();
        const int64_t cut = cta_partition(a, first + 1, last, a[first], scr);
        if (cut <= nth)
            first = cut;
        else
            last = cut;
    }
    if (threadIdx.x == 0) nth_element_at(a + first, a + nth, a + last, depth);
    __syncthreads();
}

/* The heap selection's scan of the entries c[0, n), in order, against the heap f[0, k) on the CTA, all of
 * them as torch_key entries: an entry takes the root's place (adjust_heap) only when it is before the root
 * at its turn. The root is a last entry of the heap, and each replacement swaps a last entry for one
 * before it, so later roots are never before earlier ones: an entry not before the root at the scan's
 * start never enters. The CTA drops those in parallel and thread 0 runs the serial steps over the rest,
 * in order, with the same comparisons against the current root. (The serial loop also stores the evicted
 * root at the entry's place; nothing reads it: the result is the heap.) idx: n ints. */
#define REPLAY_CHUNK 2048 /* entries per scan of the heap path (4,096: 2-7 % slower, H200 2026-12-02) */

/* The heap path's replacements run pipelined on one warp (cuda_heap_pipe.cuh: heap_pipe_padded where the
 * heap is streamed, heap_pipe_warp elsewhere; the same heap as the serial steps: tests/emu/
 * test_cuda_heap_pipe_emu.cc and the GPU tests). DI_CUDA_HEAP=serial runs libstdc++'s steps on one thread
 * instead (bench/NOTES-gpu.md, sessions 10, 11 and 20). */
static __device__ int d_heap_mode; /* 0: the pipelines (heap_pipe_padded and make_heap_cta where the heap is
                                    * streamed, heap_pipe_warp elsewhere); 1: libstdc++'s steps on one thread */
static inline void heap_pipe_configure(void) { /* host, once per translation unit that launches the replay */
    static int done = 0;
    if (done) return;
    done = 1;
    const char *v = getenv("DI_CUDA_HEAP");
    const int mode = v && !strcmp(v, "serial") ? 1 : 0;
    if (!mode) return; /* the default never touches the symbol (none inside a capture) */
    cudaMemcpyToSymbol(d_heap_mode, &mode, sizeof mode);
}

static __device__ void heap_scan_cta(telem *f, int k, const telem *c, int64_t n, int32_t *idx) {
    __shared__ unsigned long long s_scan[33];
    const telem root = f[0];
    const int64_t per = (n + blockDim.x - 1) / blockDim.x, c0 = min((int64_t)threadIdx.x * per, n), c1 = min(c0 + per, n);
    unsigned long long cnt = 0, tot;
    for (int64_t j = c0; j < c1; j++) cnt += hbefore<true>(c[j], root);
    int64_t p = (int64_t)cta_scan_excl_u64(cnt, s_scan, &tot);
    for (int64_t j = c0; j < c1; j++)
        if (hbefore<true>(c[j], root)) idx[p++] = (int32_t)j;
    __syncthreads();
    if (d_heap_mode != 1) {
        if (threadIdx.x < 32) heap_pipe_warp(f, k, c, idx, (int)tot);
    } else if (threadIdx.x == 0) {
        for (int64_t i = 0; i < (int64_t)tot; i++) {
            const telem e = c[idx[i]];
            if (hbefore<true>(e, f[0])) adjust_heap_t<true, int>(f, 0, k, e);
        }
    }
    __syncthreads();
}

/* heap_select(f, mid, len) on the CTA, for the heap's set f[0, mid) (its values as before; the entries
 * past mid are left as keys); scr: REPLAY_CHUNK ints */
static __device__ void heap_select_cta(telem *f, int64_t mid, int64_t len, int32_t *scr) {
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) f[j].v = __uint_as_float(torch_key(f[j].v));
    __syncthreads();
    if (threadIdx.x == 0) make_heap_t<true, int>(f, (int)mid);
    __syncthreads();
    for (int64_t c0 = mid; c0 < len; c0 += REPLAY_CHUNK)
        heap_scan_cta(f, (int)mid, f + c0, len - c0 < REPLAY_CHUNK ? len - c0 : REPLAY_CHUNK, scr);
    for (int64_t j = threadIdx.x; j < mid; j += blockDim.x) f[j].v = torch_val(__float_as_uint(f[j].v));
    __syncthreads();
}

/* torch's CPU top-k selection of q[0, n) (the set ends in q[0, k)) on the CTA; scr: n ints */
static __device__ void torch_cpu_topk_cta(telem *q, int64_t n, int64_t k, int32_t *scr) {
    if (k * 64 <= n) {
        heap_select_cta(q, k, n, scr);
    } else {
        nth_element_cta(q, k - 1, n, scr);
    }
}

/* A replay's row buffer: the row's n entries, then n int32 of partition scratch, in telem units */
static __host__ __device__ inline int64_t d_replay_elems(int64_t n) { return n + (n + 1) / 2; }

/* One CTA per row, all of its REPLAY_THREADS threads on the replay: filling the row, the candidate blocks'
 * maxima, the introselect's long partitions (cta_partition, the same result as the serial loop), sorting
 * the kept positions and writing the mask. What stays serial on thread 0 — the median of three, the
 * partitions of ranges of ≤ PART_MIN entries, the heap selections — works in shared memory where it can,
 * a dependent load there costing tens of cycles, not the hundreds of a global one:
 *   - a row whose buffer (d_replay_elems: the row, then the partition scratch) fits REPLAY_SMEM_MAX
 *     bytes is copied there whole and the replay runs on it;
 *   - a longer row on the heap path (k·64 ≤ n: 65,536 indexer scores at a 64K context, 9 ms per row
 *     from global memory) keeps only the heap there and streams the rest through in chunks: the heap
 *     selection reads each later entry once, in order, and only the heap is written (the entries it
 *     swaps out of the heap are never read again: the output is the heap's set);
 *   - anything else (an introselect over a longer row) replays in the global scratch.
 * Until 2026-12-01 the introselect ran on thread 0 alone: 0.9 ms per row of 4,096 tied scores (k 2,048),
 * 7-9 ms at 65,536. Writes before a barrier are visible to the CTA after it. */
#define REPLAY_THREADS 256
#define REPLAY_SMEM_MAX (192 * 1024) /* dynamic shared memory a replay may take */

/* 32-entry steps per listing warp: a chunk over the CTA's warps but the first (REPLAY_THREADS threads) */
#define LIST_U ((REPLAY_CHUNK / 32 + REPLAY_THREADS / 32 - 2) / (REPLAY_THREADS / 32 - 1))
/* The candidates of s[c0, c0 + n) for a heap scan whose root is never before lb at their turn: the
 * entries before lb (key > lb), in order, as {torch_key, position} into list, their count in *tot. Run
 * by warps 1 … of the CTA (named barrier 1), each listing one contiguous segment; wcnt: 32 words. */
static __device__ void heap_stream_list(const float *s, int64_t c0, int64_t n, uint32_t lb, telem *list, int *tot,
                                        unsigned *wcnt) {
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31, w = (int)(threadIdx.x >> 5) - 1, nw = (int)(blockDim.x >> 5) - 1;
    const int64_t seg = ((n + nw - 1) / nw + 31) / 32 * 32, a0 = min((int64_t)w * seg, n), a1 = min(a0 + seg, n);
    uint32_t key[LIST_U]; /* lane's entries a0 + lane + 32 i, loaded before they are used */
    unsigned cnt = 0;
#pragma unroll
    for (int i = 0; i < LIST_U; i++) {
        const int64_t j = a0 + lane + 32 * i;
        key[i] = j < a1 ? torch_key(s[c0 + j]) : 0u;
    }
#pragma unroll
    for (int i = 0; i < LIST_U; i++) cnt += __popc(__ballot_sync(full, a0 + lane + 32 * i < a1 && key[i] > lb));
    if (lane == 0) wcnt[w] = cnt;
    asm volatile("bar.sync 1, %0;" ::"r"(nw * 32) : "memory");
    unsigned base = 0;
    for (int i = 0; i < w; i++) base += wcnt[i];
    if (w == nw - 1 && lane == 0) *tot = (int)(base + cnt);
#pragma unroll
    for (int i = 0; i < LIST_U; i++) {
        const int64_t j = a0 + lane + 32 * i;
        const bool p = j < a1 && key[i] > lb;
        const unsigned m = __ballot_sync(full, p);
        if (p) list[base + __popc(m & ((1u << lane) - 1u))] = telem{__uint_as_float(key[i]), (int32_t)(c0 + j)};
        base += __popc(m);
    }
}

/* the heap path with the heap in shared memory and the row streamed through: torch_cpu_topk_cta(row, nk,
 * k) when k·64 ≤ nk, for the output's purpose (the set's positions in heap[0..k).i; the entries hold
 * torch_key bits). The first warp runs the scan of one chunk (the pipeline, or the serial steps on its
 * first lane) while the other warps list the next chunk's candidates against the root at the start of
 * this one (a root is never before an earlier one, so the list holds every entry the scan can take).
 * heap: HEAP_SPAN(k) entries (the heap, then its pads), lists: 2 · REPLAY_CHUNK entries. At least two warps. */
static __device__ void heap_select_streamed(const float *s, int64_t nk, int k, telem *heap, telem *lists) {
    __shared__ int s_tot[2];
    __shared__ unsigned s_wcnt[32];
    const int mode = d_heap_mode;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) heap[j] = telem{__uint_as_float(torch_key(s[j])), (int32_t)j};
    for (int j = threadIdx.x; j < HEAP_PAD_N(k); j += blockDim.x) heap[k + j] = telem{__uint_as_float(HEAP_PAD_KEY), 0};
    __syncthreads();
    if (mode) {
        if (threadIdx.x == 0) make_heap_t<true, int>(heap, k);
        __syncthreads();
    } else {
        make_heap_cta<true>(heap, k);
    }
    const int64_t nch = (nk - k + REPLAY_CHUNK - 1) / REPLAY_CHUNK;
    if (threadIdx.x >= 32 && nch > 0)
        heap_stream_list(s, k, min((int64_t)REPLAY_CHUNK, nk - k), __float_as_uint(heap[0].v), lists, &s_tot[0],
                         s_wcnt);
    for (int64_t ci = 0; ci < nch; ci++) {
        __syncthreads(); /* chunk ci is listed; the previous scan is done */
        const uint32_t lb = __float_as_uint(heap[0].v);
        __syncthreads(); /* every thread has read the root before the scan moves it */
        if (threadIdx.x < 32) {
            const telem *list = lists + (ci & 1) * REPLAY_CHUNK;
            const int tot = s_tot[ci & 1];
            if (!mode) {
                heap_pipe_padded(heap, k, list, tot);
            } else if (threadIdx.x == 0) {
                for (int i = 0; i < tot; i++)
                    if (hbefore<true>(list[i], heap[0])) adjust_heap_t<true, int>(heap, 0, k, list[i]);
            }
        } else if (ci + 1 < nch) {
            const int64_t c0 = k + (ci + 1) * REPLAY_CHUNK;
            heap_stream_list(s, c0, min((int64_t)REPLAY_CHUNK, nk - c0), lb, lists + ((ci + 1) & 1) * REPLAY_CHUNK,
                             &s_tot[(ci + 1) & 1], s_wcnt);
        }
    }
    __syncthreads();
}

/* Where a top-k replay of k of nk entries runs: 1 the row in shared memory, 2 the heap in shared memory
 * and the row streamed (heap path), 0 the global scratch; *smem: the bytes it needs. */
static __host__ __device__ inline int d_topk_replay_mode(int64_t nk, int k, size_t *smem) {
    const size_t row_b = sizeof(telem) * (size_t)d_replay_elems(nk),
                 heap_b = sizeof(telem) * ((size_t)HEAP_SPAN((size_t)k) + 2 * REPLAY_CHUNK);
    const int mode = row_b <= REPLAY_SMEM_MAX ? 1 : (int64_t)k * 64 <= nk && heap_b <= REPLAY_SMEM_MAX ? 2 : 0;
    *smem = mode == 1 ? row_b : mode == 2 ? heap_b : 0;
    return mode;
}

/* o[p] for the p-th smallest of the k distinct positions row[0, k).i (< nk), ≥ vis marked −1, else + offset;
 * flag: nk ints of scratch. Every thread of the CTA calls it. */
static __device__ void cta_sorted_positions(const telem *row, int k, int64_t nk, int32_t vis, int32_t offset,
                                            int32_t *flag, int32_t *o) {
    __shared__ unsigned long long s_scan[33];
    for (int64_t j = threadIdx.x; j < nk; j += blockDim.x) flag[j] = 0;
    __syncthreads();
    for (int j = threadIdx.x; j < k; j += blockDim.x) flag[row[j].i] = 1;
    __syncthreads();
    const int64_t per = (nk + blockDim.x - 1) / blockDim.x, c0 = min((int64_t)threadIdx.x * per, nk),
                  c1 = min(c0 + per, nk);
    unsigned long long cnt = 0, tot;
    for (int64_t j = c0; j < c1; j++) cnt += flag[j];
    int64_t p = (int64_t)cta_scan_excl_u64(cnt, s_scan, &tot);
    for (int64_t j = c0; j < c1; j++)
        if (flag[j]) o[p++] = j < vis ? (int32_t)j + offset : -1;
}

/* One row's top-k replay on a CTA of REPLAY_THREADS: torch's set of s[0, nk), positions ascending, those
 * ≥ vis marked −1, + offset. q telem [d_replay_elems(nk)] global scratch (mode 0), sm: the launch's
 * dynamic shared memory (d_topk_replay_mode bytes at least).  o int32 [k] */
static __device__ void d_topk_torch_row(const float *s, int64_t nk, int32_t vis, int k, int32_t offset, telem *q,
                                        int mode, telem *sm, int32_t *o) {
    telem *row = mode == 0 ? q : sm;
    if (mode == 2) {
        heap_select_streamed(s, nk, k, sm, sm + HEAP_SPAN(k));
        /* the selected positions ascending (the reference sorts them; positions are distinct, so a
         * position's place is the count of smaller ones), then ≥ vis marked −1 */
        for (int j = threadIdx.x; j < k; j += blockDim.x) {
            const int32_t v = row[j].i;
            int p = 0;
            for (int i = 0; i < k; i++) p += row[i].i < v;
            o[p] = v < vis ? v + offset : -1;
        }
        return;
    }
    int32_t *scr = (int32_t *)(row + nk);
    for (int64_t j = threadIdx.x; j < nk; j += blockDim.x) row[j] = telem{s[j], (int32_t)j};
    __syncthreads();
    torch_cpu_topk_cta(row, nk, k, scr);
    cta_sorted_positions(row, k, nk, vis, offset, scr, o); /* the reference sorts the positions */
}

/* One row's candidate mask by the replay on a CTA of REPLAY_THREADS: block scores = max over the block's
 * entries, the newest visible block pinned to +inf, torch's best `keep` of the nb blocks kept.
 *   s f32 [nk];  row telem [d_replay_elems(nb)] (shared or global scratch);  mask uint8 [nk]
 * The mask is cleared while the block scores are formed and, after the selection (CTA barriers between), the
 * kept blocks' bytes are set: the same bytes as mask[n] = kept[n / block], without a division and a dependent
 * load per byte. Blocks of 8 (V4.1's) load their entries four blocks at a time, all in flight before
 * the maxima (the same fmaxf sequence per block; an entry past nk counts as −inf, which leaves the maximum as
 * it is). H200, B = 1 / 64K (8,192 blocks): 0.124 -> 0.069 ms per row (bench/NOTES-gpu.md, session 20). */
static __device__ void d_cand_torch_row(const float *s, int64_t nk, int32_t vis, int block, int64_t nb, int64_t keep,
                                        telem *row, uint8_t *mask) {
    const int64_t last = vis > 0 ? (vis - 1) / block : -1;
    for (int64_t n = threadIdx.x; n < nk; n += blockDim.x) mask[n] = 0;
    if (block == 8) {
        const int64_t T = blockDim.x;
        for (int64_t b0 = threadIdx.x; b0 < nb; b0 += 4 * T) {
            float v[4][8];
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const int64_t b = b0 + u * T, n = b * 8 + e;
                    v[u][e] = b < nb && n < nk ? s[n] : -INFINITY;
                }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int64_t b = b0 + u * T;
                float mx = -INFINITY;
#pragma unroll
                for (int e = 0; e < 8; e++) mx = fmaxf(mx, v[u][e]);
                if (b < nb) row[b] = telem{b == last ? INFINITY : mx, (int32_t)b};
            }
        }
    } else {
        for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) {
            float mx = -INFINITY;
            for (int64_t n = b * block; n < (b + 1) * block && n < nk; n++) mx = fmaxf(mx, s[n]);
            row[b] = telem{b == last ? INFINITY : mx, (int32_t)b};
        }
    }
    __syncthreads();
    torch_cpu_topk_cta(row, nb, keep, (int32_t *)(row + nb));
    __syncthreads(); /* the selection is final and the cleared bytes are ordered before the kept ones */
    for (int64_t j = threadIdx.x; j < keep; j += blockDim.x)
        if (row[j].v > -INFINITY) {
            const int64_t n0 = (int64_t)row[j].i * block, n1 = n0 + block < nk ? n0 + block : nk;
            for (int64_t n = n0; n < n1; n++) mask[n] = 1;
        }
}

/* ---- which rows need the replay ----
 * The replay's choice matters only where it is ambiguous AND visible. With torch's order as an
 * unsigned key (NaN highest, all NaNs equal; then by value, −0 = +0), t the key of the k-th best entry
 * of the row, A = {key > t}, E = {key = t} and U = [0, vis): the selection is A plus some k − |A|
 * entries of E, and the output lists its positions in U ascending, then −1. That output is fixed
 * whenever the set is unique (|A| + |E| = k) or no entry of E lies in U: it is then Q = {j ∈ U :
 * key ≥ t}, ascending, −1 padded. The parallel kernel of cuda_select.cu (selectable = finite or +inf
 * entries in U, best first) outputs the same when Q holds no NaN and no −inf and it cannot pick more
 * than Q: |Q| = k, or no selectable entry of U is outside Q. Common cases it covers: a row without a
 * tie at the k-th score, and an early prompt row with fewer than k visible entries (the −inf ties lie
 * past vis). One CTA per row finds t (radix passes) and, where the row needs no replay, writes Q itself:
 * the parallel kernel is not run on those rows (until 2026-12-01 it was, and t came from a 32-step
 * bitwise search, 0.74 ms per 64K row on one CTA; bench/NOTES-gpu.md, session 11). */
#define CUT_THREADS 1024 /* the CTA of d_topk_torch_cut */

/* The cut runs on one CTA per row, or, for a few long rows (d_cut_cluster), on a cluster of CUT_CLUSTER
 * CTAs per row (Hopper thread-block clusters): CTA rank r reads slice r of the row, and the CTAs combine
 * their histograms and counts through distributed shared memory, each reading all ranks' and deciding the
 * same. The counts are integers, so both give the same t, flags and output. (A cluster per row for every
 * call was measured in session 11: 0.13 → 0.04 ms per 64K row at B = 1 and 8, but 3.3 → 16.6 ms for an
 * 8K prefill's 8,192 rows and 0.06 → 0.18 ms at B = 64 / 4K.) */
#define CUT_CLUSTER 8
static inline bool d_cut_cluster(int64_t rows, int64_t width) { return rows <= 16 && width >= 16384; }

/* The cut's CTAs per row: CL = 1 (one CTA, the CTA barrier) or CUT_CLUSTER (a cluster). */
template <int CL> static __device__ __forceinline__ void cut_sync(void) {
    if (CL == 1) {
        __syncthreads();
    } else {
        cooperative_groups::this_cluster().sync();
    }
}
template <int CL> static __device__ __forceinline__ unsigned cut_rank(void) {
    return CL == 1 ? 0u : cooperative_groups::this_cluster().block_rank();
}
template <int CL, typename T> static __device__ __forceinline__ T *cut_remote(T *p, unsigned r) {
    return CL == 1 ? p : cooperative_groups::this_cluster().map_shared_rank(p, r);
}

/* Rank r's slice (of CL) of a row of nk entries: [*a0, *a1). */
template <int CL> static __device__ __forceinline__ void cut_slice(int64_t nk, unsigned r, int64_t *a0, int64_t *a1) {
    const int64_t per = (nk + CL - 1) / CL;
    *a0 = min((int64_t)r * per, nk), *a1 = min(*a0 + per, nk);
}

/* The key of the k-th best entry of the row s[0, nk) in torch's order (1 ≤ k ≤ nk): four 8-bit radix passes
 * over torch_key, the entries of each pass those with the digits found so far, each CTA of the row's
 * cluster counting its slice [a0, a1). Every thread of the cluster calls it and gets t. The scores' high
 * bytes (sign and exponent) fall in a few bins, so a warp adds the lanes sharing its first lanes' digits
 * with one atomic each. Histograms alternate between two buffers: a CTA clears the next pass's buffer only
 * after the cluster barrier that follows every CTA's last read of it. */
#define CUT_U 8 /* entries per thread loaded before they are used */
template <int CL> static __device__ uint32_t cluster_torch_kth(const float *s, int64_t a0, int64_t a1, int k) {
    __shared__ unsigned hist[2][256];
    __shared__ uint32_t s_prefix;
    __shared__ int s_need;
    const int lane = threadIdx.x & 31;
    uint32_t prefix = 0, mask = 0;
    int need = k;
    for (int b = threadIdx.x; b < 512; b += blockDim.x) hist[b >> 8][b & 255] = 0;
    cut_sync<CL>();
    for (int pass = 0, shift = 24; shift >= 0; pass++, shift -= 8) {
        unsigned *h = hist[pass & 1];
        for (int64_t j0 = a0; j0 < a1; j0 += (int64_t)blockDim.x * CUT_U) { /* uniform: the warp votes together */
            uint32_t key[CUT_U];
#pragma unroll
            for (int u = 0; u < CUT_U; u++) { /* the loads first: CUT_U in flight per thread */
                const int64_t j = j0 + (int64_t)u * blockDim.x + threadIdx.x;
                key[u] = j < a1 ? torch_key(s[j]) : 0u;
            }
#pragma unroll
            for (int u = 0; u < CUT_U; u++) {
                const int64_t j = j0 + (int64_t)u * blockDim.x + threadIdx.x;
                const bool in = j < a1 && (key[u] & mask) == prefix;
                const uint32_t bin = (key[u] >> shift) & 255u;
                unsigned rem = __ballot_sync(0xffffffffu, in);
                for (int round = 0; round < 2 && __popc(rem) > 2; round++) { /* the first lane's bin, added once */
                    const int ld = __ffs(rem) - 1;
                    const uint32_t lbin = __shfl_sync(0xffffffffu, bin, ld);
                    const unsigned m = __ballot_sync(0xffffffffu, in && bin == lbin) & rem;
                    if (lane == ld) atomicAdd(&h[lbin], (unsigned)__popc(m));
                    rem &= ~m;
                }
                if (rem >> lane & 1u) atomicAdd(&h[bin], 1u);
            }
        }
        cut_sync<CL>(); /* every slice counted */
        if (threadIdx.x < 32) { /* lane l holds bins 255 − 8l … 248 − 8l, best first, summed over the ranks */
            unsigned c[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sum = 0;
            for (unsigned r = 0; r < CL; r++) {
                const unsigned *hr = cut_remote<CL>(h, r);
                for (int i = 0; i < 8; i++) c[i] += hr[255 - 8 * lane - i];
            }
            for (int i = 0; i < 8; i++) sum += c[i];
            unsigned incl = sum;
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned t = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += t;
            }
            const unsigned excl = incl - sum;
            const unsigned hit = __ballot_sync(0xffffffffu, excl < (unsigned)need && (unsigned)need <= incl);
            if (lane == __ffs(hit) - 1) {
                int left = need - (int)excl, i = 0;
                while ((int)c[i] < left) left -= (int)c[i++];
                s_prefix = prefix | (uint32_t)(255 - 8 * lane - i) << shift;
                s_need = left;
            }
        }
        for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[(pass + 1) & 1][b] = 0;
        __syncthreads();
        prefix = s_prefix, need = s_need;
        mask |= 255u << shift;
        __syncthreads(); /* s_prefix / s_need are read before the next pass writes them */
    }
    return prefix;
}

/* A warp's next CUT_U · 32 keys of its segment ending at a1: lane's entries j0 + 32 u + lane, all loads issued
 * before any is used (0 past a1). */
static __device__ __forceinline__ void seg_keys(const float *s, int64_t j0, int64_t a1, int lane, uint32_t *key) {
#pragma unroll
    for (int u = 0; u < CUT_U; u++) {
        const int64_t j = j0 + 32 * u + lane;
        key[u] = j < a1 ? torch_key(s[j]) : 0u;
    }
}

/* The torch-order top-k of one row where the replay cannot change the parallel rule's result, in one
 * pass over the row's keys after t (the test above): returns true when the row needs the replay (then
 * only out[k, kp) is written, −1, for the replay to fill out[0, k)); otherwise out[0, kp) holds Q, the
 * positions j < vis with key ≥ t ascending (+ offset), −1 padded — the parallel rule's output in that
 * case. Called by every thread of the row's cluster (CUT_CLUSTER CTAs of any multiple of 32 threads up to
 * 1024): rank r counts and writes slice r, each warp of it one contiguous segment (coalesced); the ranks'
 * counts are read from every CTA. 1 ≤ k ≤ nk, k ≤ kp. */
template <int CL>
static __device__ bool d_topk_torch_cut(const float *s, int64_t nk, int32_t vis, int k, int32_t offset, int32_t *out,
                                        int kp) {
    __shared__ unsigned cnt[5]; /* this slice's |A ∪ E|, |E ∩ U|, |Q|, Q's NaN / −inf, U \ Q selectable */
    __shared__ unsigned wq[33]; /* |Q| per warp, then their exclusive prefix from the slice's first output */
    __shared__ int s_replay, s_q;
    const unsigned rank = cut_rank<CL>();
    int64_t s0, s1;
    cut_slice<CL>(nk, rank, &s0, &s1);
    if (threadIdx.x < 5) cnt[threadIdx.x] = 0;
    const uint32_t t = cluster_torch_kth<CL>(s, s0, s1, k); /* its barriers order the clear above */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t seg = (s1 - s0 + nw - 1) / nw, a0 = min(s0 + (int64_t)w * seg, s1), a1 = min(a0 + seg, s1);
    const int64_t v = vis < 0 ? 0 : vis;
    unsigned ge = 0, eq_u = 0, q = 0, q_bad = 0, low_sel = 0;
    for (int64_t j0 = a0; j0 < a1; j0 += 32 * CUT_U) {
        uint32_t key[CUT_U];
        seg_keys(s, j0, a1, lane, key);
#pragma unroll
        for (int u = 0; u < CUT_U; u++) {
            const int64_t j = j0 + 32 * u + lane;
            if (j >= a1) continue;
            const bool in_u = j < v, sel = key[u] != KEY_NAN && key[u] > KEY_NEG_INF;
            ge += key[u] >= t;
            eq_u += in_u && key[u] == t;
            q += in_u && key[u] >= t;
            q_bad += in_u && key[u] >= t && !sel;
            low_sel += in_u && key[u] < t && sel;
        }
    }
    for (int o = 16; o; o >>= 1) {
        ge += __shfl_xor_sync(0xffffffffu, ge, o), eq_u += __shfl_xor_sync(0xffffffffu, eq_u, o);
        q += __shfl_xor_sync(0xffffffffu, q, o), q_bad += __shfl_xor_sync(0xffffffffu, q_bad, o);
        low_sel += __shfl_xor_sync(0xffffffffu, low_sel, o);
    }
    if (lane == 0) {
        atomicAdd(&cnt[0], ge), atomicAdd(&cnt[1], eq_u), atomicAdd(&cnt[2], q), atomicAdd(&cnt[3], q_bad);
        atomicAdd(&cnt[4], low_sel);
        wq[w] = q;
    }
    cut_sync<CL>(); /* every slice's counts are in */
    if (threadIdx.x == 0) {
        unsigned tot[5] = {0, 0, 0, 0, 0}, before = 0;
        for (unsigned r = 0; r < CL; r++) {
            const unsigned *cr = cut_remote<CL>(cnt, r);
            for (int i = 0; i < 5; i++) tot[i] += cr[i];
            if (r < rank) before += cr[2];
        }
        const bool fixed = tot[0] == (unsigned)k || tot[1] == 0;
        s_replay = !(fixed && tot[3] == 0 && (tot[2] == (unsigned)k || tot[4] == 0));
        s_q = (int)tot[2];
        unsigned run = before;
        for (int i = 0; i < nw; i++) {
            const unsigned x = wq[i];
            wq[i] = run, run += x;
        }
    }
    cut_sync<CL>(); /* no CTA leaves (or clears cnt) while another reads it */
    const bool replay = s_replay;
    if (replay) {
        if (rank == 0)
            for (int j = k + threadIdx.x; j < kp; j += blockDim.x) out[j] = -1;
        return true;
    }
    unsigned base = wq[w];
    for (int64_t j0 = a0; j0 < a1; j0 += 32 * CUT_U) {
        uint32_t key[CUT_U];
        seg_keys(s, j0, a1, lane, key);
#pragma unroll
        for (int u = 0; u < CUT_U; u++) {
            const int64_t j = j0 + 32 * u + lane;
            const bool take = j < a1 && j < v && key[u] >= t;
            const unsigned m = __ballot_sync(0xffffffffu, take);
            if (take) out[base + __popc(m & ((1u << lane) - 1u))] = (int32_t)j + offset;
            base += __popc(m);
        }
    }
    if (rank == 0)
        for (int j = s_q + threadIdx.x; j < kp; j += blockDim.x) out[j] = -1;
    return false;
}

/* Rows per launch so a replay's scratch stays within 256 MiB (a long-context chunk is processed in slices). */
static inline int64_t d_rows_per_launch(int64_t m, int64_t per_row) {
    int64_t cap = ((int64_t)256 << 20) / (per_row > 0 ? per_row : 1);
    return cap < 1 ? 1 : cap < m ? cap : m;
}

/* ---------------- gather of the selected compressed entries (gather_topk) ---------------- */

/* Work item e of one sequence's gather: 8 consecutive values of output row i = e / (d/8) (one scale:
 * groups are 16 or 32), the decode of row_decode_kernel, bf16(f32(code) · f32(scale)), stored as one
 * 16-byte vector when `vec` (rows 16-byte aligned); the first item of each (t, j) writes its idx entry.
 * gather_topk's arguments; rb = di_row_codec_bytes(codec, d). */
static __device__ __forceinline__ void d_gather_topk_item(int codec, const uint8_t *base, int64_t n_entries,
                                                          const int32_t *pages, int64_t page_entries, int64_t page_rows,
                                                          int64_t row_off, const int32_t *top, int k, int64_t d,
                                                          int64_t rb, int32_t row0, uint16_t *rows, int32_t *idx,
                                                          int64_t ldi, int vec, int64_t e) {
    const int64_t gpr = d / 8; /* 8-value groups per row */
    int64_t i = e / gpr, col = (e % gpr) * 8; /* i = t·k + j */
    int64_t ent = top[i];
    bool valid = ent >= 0 && ent < n_entries;
    if (col == 0) idx[(i / k) * ldi + i % k] = valid ? row0 + (int32_t)i : -1;
    uint32_t o[4] = {0, 0, 0, 0}; /* bf16 [8] packed */
    if (valid) {
        int64_t r = pages ? (int64_t)pages[ent / page_entries] * page_rows + row_off + ent % page_entries : ent;
        const uint8_t *row = base + r * rb;
        if (codec == DI_CODEC_FP8_E8M0) {
            float sc = d_e8m0(row[d + col / 32]);
            for (int l = 0; l < 8; l++) {
                uint32_t y = d_to_bf16(__fmul_rn(d_e4m3_decode(row[col + l]), sc));
                o[l / 2] |= (l & 1) ? y << 16 : y;
            }
        } else {
            int group = codec == DI_CODEC_FP4_E4M3 ? 16 : 32;
            uint8_t scb = row[d / 2 + col / group];
            float sc = codec == DI_CODEC_FP4_E4M3 ? d_e4m3_decode(scb) : d_e8m0(scb);
            for (int b = 0; b < 4; b++) {
                uint8_t byte = row[col / 2 + b];
                uint32_t lo = d_to_bf16(__fmul_rn(d_e2m1_decode(byte & 15u), sc));
                uint32_t hi = d_to_bf16(__fmul_rn(d_e2m1_decode(byte >> 4), sc));
                o[b] = lo | (hi << 16);
            }
        }
    }
    uint16_t *y = rows + i * d + col;
    if (vec) {
        *(uint4 *)y = make_uint4(o[0], o[1], o[2], o[3]);
    } else {
        for (int l = 0; l < 8; l++) y[l] = (uint16_t)(o[l / 2] >> (16 * (l & 1)));
    }
}

#endif
