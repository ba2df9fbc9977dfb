/* The sparse attention of one (query, head) — the body of cuda_attn.cu's sparse_attn_kernel, shared
 * with cuda_rows.cu's sparse_attn_seqs_kernel, which only finds the query's key set and index row in a
 * per-sequence descriptor first: one source, so the two kernels' arithmetic cannot drift apart (same
 * expressions in the same order; the design and numerics are described in cuda_attn.cu's header).
 * Below it, d_sparse_attn_heads: the same arithmetic for several heads of one query per block (the
 * default kernels of both files). Include after cuda_common.cuh. */
#ifndef DI_CUDA_SPARSE_ATTN_CUH
#define DI_CUDA_SPARSE_ATTN_CUH

#include "backend/cuda/cuda_tma.cuh" /* mbarriers and bulk copies of the staged kernel */

#define SA_BLOCK 64   /* DI_SPARSE_ATTN_BLOCK */
#define SA_MAX_DIM 1024
#define SA_THREADS 512

/* Called by all SA_THREADS threads of a block: row qh = query·heads + h of q / out bf16 [.., d] (head h),
 * keys [kv_win ‖ kv_cmp] bf16 [n_win + n_cmp, d] at the n_idx ids ix (out of range: skipped), sink f32
 * [heads]. */
static __device__ __forceinline__ void d_sparse_attn_query(const uint16_t *q, int64_t qh, int h, int d,
                                                           const uint16_t *kv_win, int64_t n_win,
                                                           const uint16_t *kv_cmp, int64_t n_cmp, const float *sink,
                                                           const int32_t *ix, int64_t n_idx, float scale,
                                                           uint16_t *out) {
    __shared__ float qs[SA_MAX_DIM];         /* f32 [d] */
    __shared__ __align__(16) float sc[SA_BLOCK]; /* scaled scores, then f32 probabilities */
    __shared__ float pb[SA_BLOCK];               /* bf16-rounded probabilities */
    __shared__ const uint16_t *rows[SA_BLOCK]; /* [64] KV row of each slot, NULL = skipped */
    __shared__ float st[2];                  /* running max m, this step's alpha */
    __shared__ float lsum;                   /* running f32 probability sum (thread 0 writes) */
    const int t = threadIdx.x;
    const uint16_t *qv = q + qh * (int64_t)d;
    for (int j = t; j < d; j += SA_THREADS) qs[j] = d_bf16(qv[j]);
    float o0 = 0.0f, o1 = 0.0f; /* running Σ p·c of channels t and t + 512 */
    if (t == 0) st[0] = -1e30f, lsum = 0.0f;
    __syncthreads();
    for (int64_t b0 = 0; b0 < n_idx; b0 += SA_BLOCK) {
        const int nb = (int)(n_idx - b0 < SA_BLOCK ? n_idx - b0 : SA_BLOCK);
        { /* scores: slot t/8, lane t%8 */
            const int slot = t >> 3, l = t & 7;
            const uint16_t *row = NULL;
            if (slot < nb) {
                int32_t id = ix[b0 + slot];
                if (id >= 0 && id < n_win) row = kv_win + (int64_t)id * d;
                else if (id >= n_win && id < n_win + n_cmp) row = kv_cmp + (int64_t)(id - n_win) * d;
            }
            float acc = 0.0f;
            if (row) {
                int j = l;
                for (; j + 56 < d; j += 64) { /* 8 loads issued ahead of the dependent adds, the same chain */
                    uint16_t r[8];
#pragma unroll
                    for (int i = 0; i < 8; i++) r[i] = row[j + 8 * i];
#pragma unroll
                    for (int i = 0; i < 8; i++) acc = __fadd_rn(acc, __fmul_rn(qs[j + 8 * i], d_bf16(r[i])));
                }
                for (; j < d; j += 8) acc = __fadd_rn(acc, __fmul_rn(qs[j], d_bf16(row[j])));
            }
            acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 1));
            acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 2));
            acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 4));
            if (l == 0 && slot < SA_BLOCK) {
                rows[slot] = row;
                sc[slot] = row ? __fmul_rn(acc, scale) : -INFINITY;
            }
        }
        __syncthreads();
        if (t == 0) { /* block max in slot order, then the new running max and alpha */
            float v[SA_BLOCK]; /* the scores in registers first: the serial chain waits on no shared load */
#pragma unroll
            for (int k = 0; k < SA_BLOCK; k += 4) {
                const float4 f = *(const float4 *)(sc + k);
                v[k] = f.x, v[k + 1] = f.y, v[k + 2] = f.z, v[k + 3] = f.w;
            }
            float bmax = -INFINITY;
#pragma unroll
            for (int k = 0; k < SA_BLOCK; k++)
                if (k < nb) bmax = v[k] > bmax ? v[k] : bmax;
            float m = st[0], m_new = bmax > m ? bmax : m;
            st[1] = d_expf(__fsub_rn(m, m_new));
            st[0] = m_new;
        }
        __syncthreads();
        const float m_new = st[0], alpha = st[1];
        if (t < nb) {
            float p = d_expf(__fsub_rn(sc[t], m_new)); /* −inf → 0 */
            sc[t] = p;
            pb[t] = d_round_bf16(p);
        }
        __syncthreads();
        if (t == 0) { /* l = l·alpha + sum_f32(p): 8 strided lanes combined pairwise */
            float v[SA_BLOCK], lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
            for (int k = 0; k < SA_BLOCK; k += 4) {
                const float4 f = *(const float4 *)(sc + k);
                v[k] = f.x, v[k + 1] = f.y, v[k + 2] = f.z, v[k + 3] = f.w;
            }
#pragma unroll
            for (int k = 0; k < SA_BLOCK; k++)
                if (k < nb) lane[k & 7] = __fadd_rn(lane[k & 7], v[k]);
            float s = __fadd_rn(__fadd_rn(__fadd_rn(lane[0], lane[1]), __fadd_rn(lane[2], lane[3])),
                                __fadd_rn(__fadd_rn(lane[4], lane[5]), __fadd_rn(lane[6], lane[7])));
            lsum = __fadd_rn(__fmul_rn(lsum, alpha), s);
        }
        /* PV for channels t and t + 512 */
        float pv0 = 0.0f, pv1 = 0.0f;
        for (int k0 = 0; k0 < nb; k0 += 8) { /* 8 slots' loads issued ahead of the dependent adds */
            uint16_t c0[8], c1[8];
            bool ok[8];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const uint16_t *row = k0 + i < nb ? rows[k0 + i] : NULL;
                ok[i] = row != NULL;
                c0[i] = ok[i] && t < d ? row[t] : 0;
                c1[i] = ok[i] && t + SA_THREADS < d ? row[t + SA_THREADS] : 0;
            }
#pragma unroll
            for (int i = 0; i < 8; i++) {
                if (!ok[i]) continue; /* skipped slots add nothing, as before */
                const float p = pb[k0 + i];
                if (t < d) pv0 = __fadd_rn(pv0, __fmul_rn(p, d_bf16(c0[i])));
                if (t + SA_THREADS < d) pv1 = __fadd_rn(pv1, __fmul_rn(p, d_bf16(c1[i])));
            }
        }
        o0 = __fadd_rn(__fmul_rn(o0, alpha), pv0);
        o1 = __fadd_rn(__fmul_rn(o1, alpha), pv1);
        __syncthreads(); /* sc, pb, rows and st are rewritten by the next step */
    }
    const float l = __fadd_rn(lsum, d_expf(__fsub_rn(sink[h], st[0])));
    uint16_t *ov = out + qh * (int64_t)d;
    if (t < d) ov[t] = d_to_bf16(__fdiv_rn(o0, l));
    if (t + SA_THREADS < d) ov[t + SA_THREADS] = d_to_bf16(__fdiv_rn(o1, l));
}

/* ---------------- several heads of one query per block (the default; DI_CUDA_SATTN=old: the above) -------------
 * Every head of a query reads the same keys, so a block of SAH_T(H) = 16·H threads takes H heads of one
 * query: each 64-index step stages the listed rows once in shared memory (64 KB of bf16, cp.async), and
 * all H heads read them there. Each (query, head) still performs the operations of d_sparse_attn_query,
 * on the same operands, in the same order, so every bit is the same:
 *  - score: one thread keeps all 8 strided lanes of a (head, slot) in registers (lane l: channels ≡ l
 *    mod 8 ascending, from 0.0f, fmul then fadd) and combines them ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) —
 *    the value the 8 threads' xor-1/2/4 shuffles leave on lane 0 (fadd commutes exactly), then ·scale;
 *  - block max (slot order), running max, alpha, the 8-lane probability sum and l = l·alpha + sum: one
 *    thread per head, the same serial loops, the heads in parallel;
 *  - p = exp(s − m_new) and its bf16 rounding: the same expressions, one thread per (head, slot);
 *  - PV: one thread per (4 heads × 8 channels) adds p_k·c_k over the valid slots k ascending from 0.0f,
 *    then o = o·alpha + pv — per channel the chain of the per-head kernel;
 *  - the sink term and the division at the end as there.
 * Rows are stored as 16-byte chunks, chunk c of slot k at position c ^ (k mod 8) of its row, so the
 * score loads (32 slots, one chunk) and the PV loads (one slot, 32 chunks) meet no bank conflict.
 * FMA fast path (kv_ok non-NULL: one flag per key row, window rows first, from di_cuda_bf16_fma_flags):
 * a term's fmul-then-fadd is one fmaf wherever the product is exact (cuda_bf16_bits.cuh,
 * d_bf16_fma_safe) — the scores of a step when the block's q rows and every key row of the step pass,
 * the step's PV when its rows pass and every bf16-rounded probability is 0 or ≥ 2^-63 (p ≤ 1, so p·c is
 * then a normal f32 or zero). Each decision is one barrier vote, so a block's threads agree; any step
 * that fails a vote runs the multiply-then-add forms. The bits are those of the slow path either way.
 * Head dim 512 only (V4.1); n_heads a multiple of H. */
#define SAH_DIM 512
#define SAH_CHUNKS (SAH_DIM / 8)  /* 16-byte chunks per row */
#define SAH_SCS (SA_BLOCK + 1)    /* score row stride: the per-head serial loops read distinct banks */
#define SAH_T(H) (16 * (H))
/* dynamic shared bytes: rows, row sources, q, scores/probabilities, bf16 probabilities, m / alpha / l */
#define SAH_SMEM(H)                                                                                            \
    (SA_BLOCK * SAH_DIM * 2 + SA_BLOCK * 8 + (H) * SAH_DIM * 4 + (H) * SAH_SCS * 4 + SA_BLOCK * (H) * 4 +     \
     3 * (H) * 4)

static __device__ __forceinline__ void sah_cp16(void *dst, const void *src) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}

/* The 8 channels of a 16-byte chunk (little endian: the lower address is the low half). */
static __device__ __forceinline__ void sah_unpack(uint4 r, float *f) {
    f[0] = __uint_as_float(r.x << 16), f[1] = __uint_as_float(r.x & 0xffff0000u);
    f[2] = __uint_as_float(r.y << 16), f[3] = __uint_as_float(r.y & 0xffff0000u);
    f[4] = __uint_as_float(r.z << 16), f[5] = __uint_as_float(r.z & 0xffff0000u);
    f[6] = __uint_as_float(r.w << 16), f[7] = __uint_as_float(r.w & 0xffff0000u);
}

/* 8 consecutive f32 of q */
static __device__ __forceinline__ void sah_load8(const float4 *p, float *x) {
    const float4 a = p[0], b = p[1];
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}

/* ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) */
static __device__ __forceinline__ float sah_tree(const float *l) {
    return __fadd_rn(__fadd_rn(__fadd_rn(l[0], l[1]), __fadd_rn(l[2], l[3])),
                     __fadd_rn(__fadd_rn(l[4], l[5]), __fadd_rn(l[6], l[7])));
}

/* The 8 strided lanes of the scores of heads a, b (q rows qa, qb) at slots ra, rb (staged rows, chunk
 * swizzle sw): acc [head a slot a, head a slot b, head b slot a, head b slot b][lane]. FMA: one fmaf per
 * term (only where every product is exact), else the CPU's fmul then fadd. */
template <bool FMA>
static __device__ __forceinline__ void sah_scores(const uint4 *ra, const uint4 *rb, const float4 *qa, const float4 *qb,
                                                  int sw, float (&acc)[4][8]) {
#pragma unroll 2
    for (int ch = 0; ch < SAH_CHUNKS; ch++) {
        float fa[8], fb[8], xa[8], xb[8];
        sah_unpack(ra[ch ^ sw], fa);
        sah_unpack(rb[ch ^ sw], fb);
        sah_load8(qa + 2 * ch, xa);
        sah_load8(qb + 2 * ch, xb);
#pragma unroll
        for (int l = 0; l < 8; l++) {
            if (FMA) {
                acc[0][l] = __fmaf_rn(xa[l], fa[l], acc[0][l]);
                acc[1][l] = __fmaf_rn(xa[l], fb[l], acc[1][l]);
                acc[2][l] = __fmaf_rn(xb[l], fa[l], acc[2][l]);
                acc[3][l] = __fmaf_rn(xb[l], fb[l], acc[3][l]);
            } else {
                acc[0][l] = __fadd_rn(acc[0][l], __fmul_rn(xa[l], fa[l]));
                acc[1][l] = __fadd_rn(acc[1][l], __fmul_rn(xa[l], fb[l]));
                acc[2][l] = __fadd_rn(acc[2][l], __fmul_rn(xb[l], fa[l]));
                acc[3][l] = __fadd_rn(acc[3][l], __fmul_rn(xb[l], fb[l]));
            }
        }
    }
}

/* PV of heads 4g … 4g+3 at channels 8c … 8c+7 over the step's nb slots (rows src, probabilities pbt
 * f32 [64][H]), ascending from 0.0f; FMA as in sah_scores. */
template <int H, bool FMA>
static __device__ __forceinline__ void sah_pv(const uint4 *kv, const uint16_t *const *src, const float *pbt, int nb,
                                              int g, int c, float (&pv)[4][8]) {
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) pv[i][j] = 0.0f;
    for (int k = 0; k < nb; k++) {
        if (!src[k]) continue;
        float f[8];
        sah_unpack(kv[k * SAH_CHUNKS + (c ^ (k & 7))], f);
        const float4 p4 = ((const float4 *)(pbt + k * H))[g];
        const float p[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 8; j++)
                pv[i][j] = FMA ? __fmaf_rn(p[i], f[j], pv[i][j]) : __fadd_rn(pv[i][j], __fmul_rn(p[i], f[j]));
    }
}

/* Called by all SAH_T(H) threads of a block with SAH_SMEM(H) dynamic shared bytes: heads h0 … h0+H−1 of
 * query qi (q / out bf16 [.., nh, 512]); kv_ok: the key rows' FMA flags or NULL (see above); the other
 * arguments as d_sparse_attn_query's. */
template <int H>
static __device__ __forceinline__ void d_sparse_attn_heads(const uint16_t *q, int64_t qi, int nh, int h0,
                                                           const uint16_t *kv_win, int64_t n_win,
                                                           const uint16_t *kv_cmp, int64_t n_cmp, const float *sink,
                                                           const int32_t *ix, int64_t n_idx, float scale,
                                                           uint16_t *out, const uint8_t *kv_ok) {
    constexpr int T = SAH_T(H);
    extern __shared__ __align__(16) unsigned char sah_smem[];
    uint4 *kv = (uint4 *)sah_smem;                                    /* bf16 [64][512], swizzled chunks */
    const uint16_t **src = (const uint16_t **)(kv + SA_BLOCK * SAH_CHUNKS); /* [64] row of each slot, NULL = skipped */
    float *qs = (float *)(src + SA_BLOCK);                            /* f32 [H][512] */
    float *sc = qs + H * SAH_DIM;                                     /* f32 [H][65]: scores, then probabilities */
    float *pbt = sc + H * SAH_SCS;                                    /* f32 [64][H] bf16-rounded probabilities */
    float *mst = pbt + SA_BLOCK * H, *ast = mst + H, *lst = ast + H;  /* f32 [H] running max, alpha, final l */
    const int t = threadIdx.x, lane = t & 31, w = t >> 5;
    const bool aligned = (((uintptr_t)kv_win | (uintptr_t)kv_cmp) & 15) == 0;
    const uint16_t *qv = q + (qi * nh + h0) * (int64_t)SAH_DIM; /* H consecutive head rows */
    bool qok = kv_ok != NULL; /* this thread's q elements allow the FMA scores (no flags: never) */
    for (int e = t; e < H * SAH_DIM; e += T) {
        qs[e] = d_bf16(qv[e]);
        qok = qok && d_bf16_fma_safe(qv[e]);
    }
    const bool fast_q = __syncthreads_and(qok);
    if (t < H) mst[t] = -1e30f;
    float lsum = 0.0f; /* thread t < H: head t's running probability sum */
    /* PV tile: heads 4g … 4g+3, channels 8c … 8c+7 */
    const int g = t / SAH_CHUNKS, c = t % SAH_CHUNKS;
    float o[4][8];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) o[i][j] = 0.0f;
    for (int64_t b0 = 0; b0 < n_idx; b0 += SA_BLOCK) {
        const int nb = (int)(n_idx - b0 < SA_BLOCK ? n_idx - b0 : SA_BLOCK);
        bool rok = kv_ok != NULL; /* this thread's key row (if any) allows the FMA forms */
        if (t < SA_BLOCK) {
            const uint16_t *row = NULL;
            if (t < nb) {
                int32_t id = ix[b0 + t];
                if (id >= 0 && id < n_win) row = kv_win + (int64_t)id * SAH_DIM;
                else if (id >= n_win && id < n_win + n_cmp) row = kv_cmp + (int64_t)(id - n_win) * SAH_DIM;
                if (row && rok) rok = kv_ok[id] != 0;
            }
            src[t] = row;
        }
        const bool fast_rows = __syncthreads_and(rok); /* also the barrier before src is read */
        const bool fast_qk = fast_q && fast_rows;
        for (int e = t; e < SA_BLOCK * SAH_CHUNKS; e += T) { /* stage the rows; skipped slots read as 0 */
            const int k = e / SAH_CHUNKS, ch = e % SAH_CHUNKS;
            uint4 *dst = kv + k * SAH_CHUNKS + (ch ^ (k & 7));
            const uint16_t *row = src[k];
            if (!row) *dst = make_uint4(0, 0, 0, 0);
            else if (aligned) sah_cp16(dst, row + ch * 8);
            else {
                const uint16_t *s = row + ch * 8;
                *dst = make_uint4(s[0] | (uint32_t)s[1] << 16, s[2] | (uint32_t)s[3] << 16, s[4] | (uint32_t)s[5] << 16,
                                  s[6] | (uint32_t)s[7] << 16);
            }
        }
        asm volatile("cp.async.wait_all;" ::: "memory");
        __syncthreads();
        { /* scores of heads 2w, 2w+1 at slots lane, lane + 32 */
            float acc[4][8]; /* [head a slot a, head a slot b, head b slot a, head b slot b][lane] */
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int l = 0; l < 8; l++) acc[i][l] = 0.0f;
            const uint4 *ra = kv + lane * SAH_CHUNKS, *rb = kv + (lane + 32) * SAH_CHUNKS;
            const float4 *qa = (const float4 *)(qs + (2 * w) * SAH_DIM);
            const float4 *qb = (const float4 *)(qs + (2 * w + 1) * SAH_DIM);
            const int sw = lane & 7; /* (lane + 32) & 7 too */
            if (fast_qk) sah_scores<true>(ra, rb, qa, qb, sw, acc);
            else sah_scores<false>(ra, rb, qa, qb, sw, acc);
            const bool va = src[lane] != NULL, vb = src[lane + 32] != NULL;
            sc[(2 * w) * SAH_SCS + lane] = va ? __fmul_rn(sah_tree(acc[0]), scale) : -INFINITY;
            sc[(2 * w) * SAH_SCS + lane + 32] = vb ? __fmul_rn(sah_tree(acc[1]), scale) : -INFINITY;
            sc[(2 * w + 1) * SAH_SCS + lane] = va ? __fmul_rn(sah_tree(acc[2]), scale) : -INFINITY;
            sc[(2 * w + 1) * SAH_SCS + lane + 32] = vb ? __fmul_rn(sah_tree(acc[3]), scale) : -INFINITY;
        }
        __syncthreads();
        if (t < H) { /* head t: block max in slot order, then the new running max and alpha */
            const float *s = sc + t * SAH_SCS;
            float bmax = -INFINITY;
#pragma unroll
            for (int k = 0; k < SA_BLOCK; k++)
                if (k < nb) bmax = s[k] > bmax ? s[k] : bmax;
            float m = mst[t], m_new = bmax > m ? bmax : m;
            ast[t] = d_expf(__fsub_rn(m, m_new));
            mst[t] = m_new;
        }
        __syncthreads();
        bool pok = true; /* this thread's bf16 probabilities are 0, ≥ 2^-63 or NaN */
        for (int e = t; e < H * SA_BLOCK; e += T) { /* head fastest: conflict-free pbt writes and sc reads */
            const int h = e % H, k = e / H;
            if (k < nb) {
                float p = d_expf(__fsub_rn(sc[h * SAH_SCS + k], mst[h])); /* −inf → 0 */
                sc[h * SAH_SCS + k] = p;
                const float pr = d_round_bf16(p);
                pbt[k * H + h] = pr;
                pok = pok && !(pr > 0.0f && pr < 0x1p-63f);
            }
        }
        const bool fast_pv = __syncthreads_and(pok) && fast_rows;
        if (t < H) { /* l = l·alpha + sum_f32(p): 8 strided lanes combined pairwise */
            const float *s = sc + t * SAH_SCS;
            float ln[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
            for (int k = 0; k < SA_BLOCK; k++)
                if (k < nb) ln[k & 7] = __fadd_rn(ln[k & 7], s[k]);
            lsum = __fadd_rn(__fmul_rn(lsum, ast[t]), sah_tree(ln));
        }
        { /* PV of heads 4g … 4g+3 at channels 8c … 8c+7 */
            float pv[4][8];
            if (fast_pv) sah_pv<H, true>(kv, src, pbt, nb, g, c, pv);
            else sah_pv<H, false>(kv, src, pbt, nb, g, c, pv);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float alpha = ast[4 * g + i];
#pragma unroll
                for (int j = 0; j < 8; j++) o[i][j] = __fadd_rn(__fmul_rn(o[i][j], alpha), pv[i][j]);
            }
        }
        __syncthreads(); /* src, kv, sc, pbt and alpha are rewritten by the next step */
    }
    if (t < H) lst[t] = __fadd_rn(lsum, d_expf(__fsub_rn(sink[h0 + t], mst[t])));
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float l = lst[4 * g + i];
        uint16_t *ov = out + (qi * nh + h0 + 4 * g + i) * (int64_t)SAH_DIM + 8 * c;
#pragma unroll
        for (int j = 0; j < 8; j++) ov[j] = d_to_bf16(__fdiv_rn(o[i][j], l));
    }
}

/* ---------------- one (query, head) per block, each step's rows staged ahead (few queries) ----------------
 * d_sparse_attn_query's arithmetic for head dim 512, operation for operation, on 512 threads: score slot
 * t/8 lane t%8 (channels ≡ t%8 mod 8 ascending, fmul then fadd, then the same xor-1/2/4 shuffles), PV
 * channel t over the step's slots ascending. What differs is where the operands come from and who does
 * the per-step softmax. The per-head kernel reads every key element from global memory inside its
 * dependent chains (8 rounds of loads per step for the scores, 8 for PV: at one query a step waits ~16
 * memory latencies) and runs the softmax on thread 0 between block barriers. Here:
 *  - each row of a step is one 1 KB bulk copy into shared memory (rows padded to 1040 bytes, so the
 *    score loads of 4 slots and the PV loads of one row meet no bank conflict), two steps ahead: while
 *    warp 0 runs a step's softmax, warps 1-2 find the rows of the step after next and issue their copies
 *    into the stage that step will use (three stages, one mbarrier each; every thread waits on its
 *    step's barrier, so the copies need no block barrier), and each thread keeps its 64 q values in
 *    registers;
 *  - warp 0 alone runs the softmax of a step, lane l on slots l and l + 32: the block max as an fmaxf
 *    tree (the serial `v > m ? v : m` loop skips NaN and −inf stays −inf; fmaxf ignores NaN; the two can
 *    differ only in the sign of a zero maximum or as NaN vs −inf when no slot is a number, and neither
 *    changes m_new = max > m ? max : m's effect: m ≥ −1e30, and s − (±0) are equal or ±0, whose exp is 1),
 *    the new running max and alpha, p and its bf16 rounding, and the probability sum with lane i's chain
 *    p_i + p_{i+8} + … in slot order (shuffles) and the same ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) tree.
 * A skipped slot's row is zero-filled and its bf16 probability is exactly 0 (its score is −inf and the
 * running max is never −inf or NaN), so its PV term is +0 and adding it leaves the sum unchanged (the
 * sum starts at +0 and is never −0): the PV loop needs no per-slot test. With `parts` 2 (one query with
 * lists of more than two steps: 64 blocks would leave half the SMs idle) two blocks share a (query, head): each computes every score and
 * the same softmax, and the PV of one half of the channels. Three stages of 65 KB: one block per SM. */
#define SAS_STAGES 3
#define SAS_ROW 520 /* bf16 per staged row: 512 + 8 of padding */
#define SAS_SMEM (SAS_STAGES * SA_BLOCK * SAS_ROW * 2)

/* Row of index id in [kv_win ‖ kv_cmp] (head dim 512), NULL when out of range */
static __device__ __forceinline__ const uint16_t *sas_row(int32_t id, const uint16_t *kv_win, int64_t n_win,
                                                          const uint16_t *kv_cmp, int64_t n_cmp) {
    if (id >= 0 && id < n_win) return kv_win + (int64_t)id * SAH_DIM;
    if (id >= n_win && id < n_win + n_cmp) return kv_cmp + (int64_t)(id - n_win) * SAH_DIM;
    return NULL;
}

/* One thread's part of staging a step: slot k's row (NULL: skipped or past the list) into its place in
 * the stage, arriving on the stage's barrier (64 arrivals per phase). A row is a bulk copy where both
 * ends are 16-byte aligned; a skipped slot is zero-filled and an unaligned row copied element by
 * element, both by this thread before it arrives (the arrival releases them to the waiting threads; the
 * proxy fence orders them before later bulk copies into the same bytes). */
static __device__ __forceinline__ void sas_issue(uint16_t *dst, const uint16_t *row, bool aligned, uint64_t *bar) {
    if (row && aligned) {
        mbar_arrive_tx(bar, SAH_DIM * 2);
        bulk_load(dst, row, SAH_DIM * 2, bar);
        return;
    }
    if (!row)
        for (int c = 0; c < SAH_CHUNKS; c++) ((uint4 *)dst)[c] = make_uint4(0, 0, 0, 0);
    else
        for (int j = 0; j < SAH_DIM; j++) dst[j] = row[j];
    fence_proxy_async();
    mbar_arrive(bar);
}

/* Called by all SA_THREADS threads of a block with SAS_SMEM dynamic shared bytes: row qh = query·heads + h
 * of q / out bf16 [.., 512]; part (0 … parts − 1, parts 1 or 2) picks the block's PV channels; the other
 * arguments as d_sparse_attn_query's. */
static __device__ __forceinline__ void d_sparse_attn_staged(const uint16_t *q, int64_t qh, int h,
                                                            const uint16_t *kv_win, int64_t n_win,
                                                            const uint16_t *kv_cmp, int64_t n_cmp, const float *sink,
                                                            const int32_t *ix, int64_t n_idx, float scale,
                                                            uint16_t *out, int part, int parts) {
    extern __shared__ __align__(16) unsigned char sas_smem[];
    __shared__ const uint16_t *src[SAS_STAGES][SA_BLOCK]; /* each stage's row per slot, NULL = skipped */
    __shared__ uint64_t bar[SAS_STAGES];                  /* a stage's copies landed */
    __shared__ float sc[SA_BLOCK];                        /* scaled scores */
    __shared__ __align__(16) float pb[SA_BLOCK];          /* bf16-rounded probabilities */
    __shared__ float st[2];                               /* this step's alpha; the final divisor */
    uint16_t *const stages = (uint16_t *)sas_smem;        /* stage c, slot k at (c·64 + k)·520 */
    const int t = threadIdx.x, slot = t >> 3, l = t & 7;
    const bool aligned = (((uintptr_t)kv_win | (uintptr_t)kv_cmp) & 15) == 0;
    const int n_ch = SAH_DIM / parts, ch = part * n_ch + t; /* PV: channel ch when t < n_ch */
    float qr[SAH_CHUNKS]; /* q channels l, l + 8, …, l + 504 */
    const uint16_t *qv = q + qh * (int64_t)SAH_DIM;
#pragma unroll
    for (int i = 0; i < SAH_CHUNKS; i++) qr[i] = d_bf16(qv[l + 8 * i]);
    if (t < SAS_STAGES) {
        mbar_init(&bar[t], SA_BLOCK);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); /* visible to the bulk copies */
    }
    __syncthreads();
    if (t < 2 * SA_BLOCK) { /* steps 0 and 1 into stages 0 and 1; later steps while warp 0 runs a softmax */
        const int s0 = t / SA_BLOCK, k = t % SA_BLOCK;
        const uint16_t *row = s0 * SA_BLOCK + k < n_idx
                                  ? sas_row(ix[s0 * SA_BLOCK + k], kv_win, n_win, kv_cmp, n_cmp)
                                  : NULL;
        src[s0][k] = row;
        sas_issue(stages + (s0 * SA_BLOCK + k) * SAS_ROW, row, aligned, &bar[s0]);
    }
    float o0 = 0.0f;                   /* running Σ p·c of channel ch */
    float m_run = -1e30f, lsum = 0.0f; /* warp 0: running max, running probability sum (lane 0's is used) */
    int cur = 0;
    uint32_t phase = 0; /* parity of stage cur's barrier at this step */
    for (int64_t b0 = 0; b0 < n_idx; b0 += SA_BLOCK) {
        mbar_wait(&bar[cur], phase); /* this step's rows (and src[cur], written before the copies) */
        const int nb = (int)(n_idx - b0 < SA_BLOCK ? n_idx - b0 : SA_BLOCK);
        const uint16_t *kv = stages + cur * SA_BLOCK * SAS_ROW;
        { /* scores: slot t/8, lane t%8 (slots past nb have no row: −inf) */
            const bool has = src[cur][slot] != NULL;
            float acc = 0.0f;
            if (has) {
                const uint16_t *r = kv + slot * SAS_ROW + l;
#pragma unroll
                for (int i = 0; i < SAH_CHUNKS; i++) acc = __fadd_rn(acc, __fmul_rn(qr[i], d_bf16(r[8 * i])));
            }
            acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 1));
            acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 2));
            acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 4));
            if (l == 0) sc[slot] = has ? __fmul_rn(acc, scale) : -INFINITY;
        }
        __syncthreads();
        if (t < 32) { /* warp 0: the step's softmax, lane t on slots t and t + 32 */
            const float sa = sc[t], sb = sc[t + 32];
            float mx = fmaxf(sa, sb);
#pragma unroll
            for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float m_new = mx > m_run ? mx : m_run, alpha = d_expf(__fsub_rn(m_run, m_new));
            m_run = m_new;
            float pa = 0.0f, pc = 0.0f; /* p of slots t, t + 32 (−inf → 0) */
            if (t < nb) pa = d_expf(__fsub_rn(sa, m_new)), pb[t] = d_round_bf16(pa);
            if (t + 32 < nb) pc = d_expf(__fsub_rn(sb, m_new)), pb[t + 32] = d_round_bf16(pc);
            float ln = 0.0f; /* lane i < 8: p_i + p_{i+8} + … over the valid slots, ascending */
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int k = (t & 7) + 8 * j;
                const float v = __shfl_sync(0xffffffffu, j < 4 ? pa : pc, k & 31);
                if (k < nb) ln = __fadd_rn(ln, v);
            }
            ln = __fadd_rn(ln, __shfl_xor_sync(0xffffffffu, ln, 1));
            ln = __fadd_rn(ln, __shfl_xor_sync(0xffffffffu, ln, 2));
            ln = __fadd_rn(ln, __shfl_xor_sync(0xffffffffu, ln, 4));
            lsum = __fadd_rn(__fmul_rn(lsum, alpha), ln);
            if (t == 0) st[0] = alpha;
        } else if (t < 32 + SA_BLOCK) { /* warps 1-2: the step after next into the stage read a step ago */
            const int k = t - 32, s2 = cur == 0 ? 2 : cur - 1;
            const int64_t b2 = b0 + 2 * SA_BLOCK;
            if (b2 < n_idx) {
                const uint16_t *row = b2 + k < n_idx ? sas_row(ix[b2 + k], kv_win, n_win, kv_cmp, n_cmp) : NULL;
                src[s2][k] = row;
                sas_issue(stages + (s2 * SA_BLOCK + k) * SAS_ROW, row, aligned, &bar[s2]);
            }
        }
        __syncthreads();
        const float alpha = st[0];
        if (t < n_ch) {
            float pv0 = 0.0f; /* PV of channel ch over the slots ascending (skipped slots add +0) */
            const uint16_t *r = kv + ch;
            int k = 0;
            if (nb == SA_BLOCK) { /* a full step, unrolled: one shared load per term at a fixed offset */
#pragma unroll
                for (int k4 = 0; k4 < SA_BLOCK; k4 += 4) {
                    const float4 p4 = *(const float4 *)(pb + k4);
                    const float p[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
                    for (int i = 0; i < 4; i++) pv0 = __fadd_rn(pv0, __fmul_rn(p[i], d_bf16(r[(k4 + i) * SAS_ROW])));
                }
                k = SA_BLOCK;
            }
            for (; k < nb; k++) pv0 = __fadd_rn(pv0, __fmul_rn(pb[k], d_bf16(r[k * SAS_ROW])));
            o0 = __fadd_rn(__fmul_rn(o0, alpha), pv0);
        }
        /* no barrier: the next step's writes of sc / pb / st come after its first barrier, which every warp
         * passes only after this PV, and its copies go into a stage read a step before */
        if (++cur == SAS_STAGES) cur = 0, phase ^= 1;
    }
    if (t == 0) st[1] = __fadd_rn(lsum, d_expf(__fsub_rn(sink[h], m_run)));
    __syncthreads();
    if (t < n_ch) out[qh * (int64_t)SAH_DIM + ch] = d_to_bf16(__fdiv_rn(o0, st[1]));
}

/* The >48 KB dynamic shared memory opt-in of a kernel, once per device (dev < 64; others every call). */
template <typename K>
static inline int sah_smem_optin(K kernel, int bytes, bool *done, int dev, const char *op, di_error *err) {
    if (dev >= 0 && dev < 64 && done[dev]) return DI_OK;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e != cudaSuccess)
        return di_error_set(err, DI_ERR_INTERNAL, "cuda %s: %d B of shared memory per block: %s", op, bytes,
                            cudaGetErrorString(e));
    if (dev >= 0 && dev < 64) done[dev] = true;
    return DI_OK;
}

/* DI_CUDA_SATTN=old: the per-head kernels (read once; di_cuda_sattn_heads_set overrides it, for tests). */
extern "C" int di_cuda_sattn_heads_enabled(void);
extern "C" void di_cuda_sattn_heads_set(int on);
/* DI_CUDA_SATTN_FMA=0: the sparse_attn slot without the FMA fast path (read once). */
extern "C" int di_cuda_sattn_fma_enabled(void);

/* DI_CUDA_SATTN_STAGED=0: the per-head kernel where sas_wanted would take the staged one (read once);
 * di_cuda_sattn_staged_set: 1 = the staged kernel for every call of head dim 512, 0 = never, −1 = the
 * rule (tests, bench). */
extern "C" int di_cuda_sattn_staged_enabled(void);
extern "C" void di_cuda_sattn_staged_set(int mode);
extern "C" int di_cuda_sattn_staged_forced(void);
/* Blocks per (query, head) of the staged kernel for m queries of nh heads and lists of n_idx indices
 * (−1: unknown; 1 or 2 blocks; cuda_attn.cu); di_cuda_sattn_staged_set_parts(1 or 2) forces it, 0
 * restores the rule (tests, bench). */
extern "C" int di_cuda_sattn_staged_parts(int64_t m, int nh, int64_t n_idx);
extern "C" void di_cuda_sattn_staged_set_parts(int parts);

/* Whether m queries of nh heads at head dim d take d_sparse_attn_staged: one block per (query, head), so
 * for few queries, where the several-heads kernel leaves SMs idle and the per-head kernel waits on its
 * loads. H200, 2026-12-02 (test_cuda_sattn_heads bench, 64 heads × 640 keys; per-head / staged / 4 or 16
 * heads per block, ms): n_q 1 0.088 / 0.031 / -, n_q 4 0.136 / 0.069 / -, n_q 8 0.265 / 0.133 / 0.188,
 * n_q 16 0.520 / 0.259 / 0.191 (bench/NOTES-gpu.md, session 18). All give the same bits. */
static inline bool sas_wanted(int64_t m, int nh, int d) {
    if (d != SAH_DIM || !di_cuda_sattn_staged_enabled()) return false;
    const int f = di_cuda_sattn_staged_forced();
    if (f >= 0) return f == 1;
    return di_cuda_sattn_heads_enabled() && m <= 8 && nh > 0;
}

/* The heads per block for m queries of nh heads at head dim d; 0: the per-head kernel. 16 heads share
 * each staged row best; below about one such block per SM (132 on the H200) a block's time is the
 * call's, and 4 heads per block spread the same work over 4 times as many SMs. */
static inline int sah_heads(int64_t m, int nh, int d) {
    /* fewer than 8 queries: the per-head kernel's one block per head fills the GPU better (H200,
     * 2026-11-30, 64 heads × 640 keys: n_q 1 0.094 ms per-head vs 0.197 ms here; n_q 16 0.473 vs 0.200;
     * n_q 8192 223 vs 39 ms). Both give the same bits. Up to 8 queries the slots take the staged kernel
     * first (sas_wanted); this rule is what they fall back to with it off. */
    if (!di_cuda_sattn_heads_enabled() || d != SAH_DIM || nh % 4 || m < 8) return 0;
    return nh % 16 == 0 && m * (nh / 16) >= 128 ? 16 : 4;
}

#endif
