/* Sparse MQA attention with the attention sink on Hopper tensor cores (spec §3.4, §4.1, §5.3), the
 * FlashMLA-style layout: one thread block owns ALL 64 heads of one query, so every gathered KV row is
 * read from memory once per query and the heads are the M dimension of both matrix products.
 *
 * Per query (and output-column slice, below), per 64-index step b of its index list:
 *   1. gather: the 64 listed KV rows (bf16, 1 KB each) go to shared memory with cp.async, one step
 *      ahead (double buffer); a −1 or out-of-range index is a zero row flagged invalid;
 *   2. S = Q·Kᵀ: [64 heads × 64 keys] over the 512 latent channels, mma.sync m16n8k16 bf16 → f32 in
 *      four accumulator chains (k-step mod 4) added at the end; s = S·scale, −inf for invalid keys;
 *   3. the reference's online-softmax step (sparse_attn.c), per head on 4 threads: block max, new
 *      running max M (from −1e30), α = exp(M_old − M), p = exp(s − M), l = l·α + Σp with Σp in the
 *      CPU's 8 strided lanes combined ((0+1)+(2+3))+((4+5)+(6+7)), and P = bf16(p);
 *   4. O = O·α + P·V: [64 heads × cols] += [64 × 64 keys]·[64 keys × cols], mma.sync, V = the same
 *      shared-memory rows read transposed by ldmatrix.
 * Finally out = bf16(O / (l + exp(sink − M))).
 *
 * Exactness (tests/cuda/test_cuda_attn_fast.c measures it): steps 1 and 3 and the final division are
 * the CPU's operations in the CPU's order (exp is the f64 function rounded once, d_expf, as in every
 * CUDA op here). Steps 2 and 4 are tensor-core sums: the bf16×bf16 products are exact, but the f32
 * accumulation order inside an MMA is the hardware's, not the CPU's 8 strided lanes, and step 4 adds
 * O·α and the block's P·V in one accumulation where the CPU rounds Σ p·v first (the reference's
 * tilelang kernel, like this one, accumulates P·V into the rescaled O). Scores therefore differ by a
 * few f32 ulps, which flips a bf16 probability now and then; measured: ≤ 1 bf16 ulp of the (query,
 * head) row's scale on ~0.1–0.3 % of the outputs (bench/NOTES-gpu.md).
 *
 * Work split and batch invariance: a block computes the score matrix of its query's HPB heads and the
 * output columns [slice·NC, slice·NC + NC). Small batches use NC < 512 (up to 8 blocks per query, each
 * recomputing the scores and the softmax) so that one wave of blocks covers the SMs, and batches of
 * ≤ #SMs/16 queries also HPB = 16 (4 head groups); every score and every output's sums are the same
 * instructions in the same order for any split, so a query's bits never depend on the batch (tested
 * bit for bit). There is no split over the index list: the reference's bf16 rounding against the
 * RUNNING max makes a split-KV combine inexact.
 *
 * Layout (8 warps; 64 heads: warp w owns head rows 16·(w mod 4) … and key/column half w div 4; 16 heads:
 * all warps share the 16 rows, warp w owns keys 8w … and columns w·NC/8 …):
 *   Q   bf16 [64 heads][512 (+8 pad)]   resident for the whole query
 *   KV  bf16 [2][64 keys][512 (+8 pad)] double-buffered gathered rows
 *   S   f32  [64][64 (+8)]              scaled scores of one step
 *   P   bf16 [64][64 (+8)]              rounded probabilities
 * The pads make every ldmatrix phase (8 rows × 16 B) hit 8 distinct bank groups. */
#include "backend/cuda/cuda_attn_fast.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

#define FA_HEADS 64
#define FA_DIM 512
#define FA_BLOCK 64 /* DI_SPARSE_ATTN_BLOCK */
#define FA_THREADS 256
#define FA_ROW 520  /* bf16 per Q / KV row in shared memory (1040 B) */
#define FA_SROW 72  /* f32 per S row */
#define FA_PROW 72  /* bf16 per P row (144 B) */

#define FA_Q_BYTES (FA_HEADS * FA_ROW * 2)
#define FA_KV_BYTES (FA_BLOCK * FA_ROW * 2)
#define FA_S_BYTES (FA_HEADS * FA_SROW * 4)
#define FA_P_BYTES (FA_HEADS * FA_PROW * 2)
#define FA_SMEM (FA_Q_BYTES + 2 * FA_KV_BYTES + FA_S_BYTES + FA_P_BYTES + 2 * FA_HEADS * 4 + 2 * FA_BLOCK * 8 + 2 * FA_BLOCK)

/* ---- PTX wrappers (the copies and ldmatrix forms are cuda_common.cuh's) ---- */

/* d += a·b, m16n8k16, bf16 inputs, f32 accumulators (in place). Not volatile: a pure register
 * operation, so the compiler may issue the next k-step's ldmatrix (volatile, kept in order) before it. */
static __device__ __forceinline__ void fa_mma(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The KV row of list entry id, or NULL (skipped) for −1 and anything outside [0, n_win + n_cmp). */
static __device__ __forceinline__ const uint16_t *fa_row(int32_t id, const uint16_t *kv_win, int64_t n_win,
                                                         const uint16_t *kv_cmp, int64_t n_cmp) {
    if (id >= 0 && id < n_win) return kv_win + (int64_t)id * FA_DIM;
    if (id >= n_win && id < n_win + n_cmp) return kv_cmp + (int64_t)(id - n_win) * FA_DIM;
    return NULL;
}

/* Queue the gather of one step's 64 KV rows (shared [64] row pointers, NULL = skipped) into kv
 * (bf16 [64][FA_ROW]); valid[k] = row exists. A skipped row is zero-filled (src size 0; `dummy` is any
 * 16-byte-aligned device address, never read). Thread t copies 16-byte chunk t mod 64 of rows t/64,
 * t/64 + 4, …: a warp moves 512 contiguous bytes. */
static __device__ __forceinline__ void fa_gather(uint16_t *kv, uint8_t *valid, const uint16_t *const *rows,
                                                 const uint16_t *dummy) {
    const int t = threadIdx.x, c = t & 63;
#pragma unroll
    for (int r = t >> 6; r < FA_BLOCK; r += FA_THREADS / 64) {
        const uint16_t *row = rows[r];
        d_cp_async16_zfill(kv + r * FA_ROW + c * 8, row ? row + c * 8 : dummy, row ? 16 : 0);
        if (c == 0) valid[r] = row != NULL;
    }
}

/* One block = one query × NC output columns (blockIdx.y selects the slice) × HPB heads (blockIdx.z
 * selects the group: 64 = all heads, the normal case; 16 for batches of ≤ #SMs/16 queries, whose time
 * is the latency of one block's ten serial steps, not bandwidth). Warp w owns head rows
 * 16·(w mod RG) … and key group / column group w div RG. */
template <int NC, int HPB>
__global__ void __launch_bounds__(FA_THREADS, 1)
    sparse_attn_fast_kernel(const uint16_t *__restrict__ q, const uint16_t *__restrict__ kv_win, int64_t n_win,
                            const uint16_t *__restrict__ kv_cmp, int64_t n_cmp, const float *__restrict__ sink,
                            const int32_t *__restrict__ idx, int64_t n_idx, float scale, uint16_t *__restrict__ out) {
    constexpr int RG = HPB / 16;              /* 16-row groups: 4 or 1 */
    constexpr int WPR = 8 / RG;               /* warps per row group: 2 or 8 */
    constexpr int KW = FA_BLOCK / WPR;        /* keys of S per warp: 32 or 8 */
    constexpr int NT = NC / WPR / 8;          /* n8 column tiles of O per warp */
    constexpr int TPH = HPB == 64 ? 4 : 8;    /* softmax threads per head */
    constexpr int LPT = 8 / TPH;              /* CPU sum lanes per softmax thread: 2 or 1 */
    static_assert(NT % 2 == 0 && (KW == 8 || KW % 16 == 0), "tile pairs");
    extern __shared__ __align__(128) unsigned char fa_smem[];
    uint16_t *qs = (uint16_t *)fa_smem;                                   /* bf16 [64][FA_ROW] */
    uint16_t *kvs = (uint16_t *)(fa_smem + FA_Q_BYTES);                   /* bf16 [2][64][FA_ROW] */
    float *ss = (float *)(fa_smem + FA_Q_BYTES + 2 * FA_KV_BYTES);        /* f32 [64][FA_SROW] */
    uint16_t *ps = (uint16_t *)((unsigned char *)ss + FA_S_BYTES);        /* bf16 [64][FA_PROW] */
    float *alpha_s = (float *)((unsigned char *)ps + FA_P_BYTES);         /* f32 [64] this step's α */
    float *lfin_s = alpha_s + FA_HEADS;                                   /* f32 [64] final denominator */
    const uint16_t **rows_s = (const uint16_t **)(lfin_s + FA_HEADS);     /* [2][64] KV row per buffer slot */
    uint8_t *valid_s = (uint8_t *)(rows_s + 2 * FA_BLOCK);                /* [2][64] */

    const int t = threadIdx.x, lane = t & 31, w = t >> 5;
    const int rg = w % RG, kg = w / RG; /* head rows 16·rg …; key group (QK) / column group (PV) */
    const int g = lane >> 2, c4 = lane & 3;
    const int64_t qi = blockIdx.x;
    const int col0 = (int)blockIdx.y * NC + kg * (NC / WPR);
    const int head0 = (int)blockIdx.z * HPB;
    const int32_t *ix = idx + qi * n_idx;
    const int64_t nblk = (n_idx + FA_BLOCK - 1) / FA_BLOCK;

    { /* Q rows of the block's heads (1 KB each) with gather 0 as the first copy group, gather 1 the second */
        const uint16_t *qv = q + (qi * FA_HEADS + head0) * FA_DIM;
        const int c = t & 63;
        for (int r = t >> 6; r < HPB; r += FA_THREADS / 64) d_cp_async16_zfill(qs + r * FA_ROW + c * 8, qv + r * FA_DIM + c * 8, 16);
    }
    if (t < 2 * FA_BLOCK) rows_s[t] = fa_row(t < n_idx ? ix[t] : -1, kv_win, n_win, kv_cmp, n_cmp);
    __syncthreads();
    fa_gather(kvs, valid_s, rows_s, q);
    d_cp_commit();
    fa_gather(kvs + FA_BLOCK * FA_ROW, valid_s + FA_BLOCK, rows_s + FA_BLOCK, q);
    d_cp_commit();

    float o[NT][4]; /* f32 O[16 rows][NC/WPR cols] of this warp, m16n8 accumulator layout */
#pragma unroll
    for (int j = 0; j < NT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    /* softmax state of head t/TPH (threads t < HPB·TPH), replicated on its TPH threads */
    const int sh = t / TPH;
    const bool soft = HPB * TPH >= FA_THREADS || t < HPB * TPH;
    float m_run = -1e30f, l_run = 0.0f;

    for (int64_t b = 0; b < nblk; b++) {
        const int buf = (int)(b & 1);
        const uint16_t *kv = kvs + buf * (FA_BLOCK * FA_ROW);
        const uint8_t *valid = valid_s + buf * FA_BLOCK;
        d_cp_wait<1>(); /* every group but the newest: this step's rows (and Q) have landed */
        __syncthreads();
        /* the list entries of step b + 2, loaded now so that their latency hides behind this step */
        const int32_t next_id = t < FA_BLOCK && (b + 2) * FA_BLOCK + t < n_idx ? ix[(b + 2) * FA_BLOCK + t] : -1;

        { /* 2. S[16 rows][KW keys] of this warp over 512 channels */
            /* Four accumulator chains (k-step mod 4), summed ((0+1)+(2+3)) at the end: an MMA adds its
             * 16 products to the running f32 sum with the tensor core's own rounding, so the error grows
             * with the chain length; 4 chains of 8 instead of 1 of 32 cut the outputs that differ from the
             * CPU from ~0.7 % to ~0.2 % (measured: 1 chain 0.71 %, 2 chains 0.35 %, 4 chains 0.22 % at
             * m = 256) at no measurable cost. */
            float acc[4][KW / 8][4];
#pragma unroll
            for (int h = 0; h < 4; h++)
#pragma unroll
                for (int j = 0; j < KW / 8; j++) acc[h][j][0] = acc[h][j][1] = acc[h][j][2] = acc[h][j][3] = 0.0f;
            const uint16_t *qa = qs + (rg * 16 + (lane & 15)) * FA_ROW + (lane >> 4) * 8;
            const uint16_t *kb = kv + (kg * KW + (lane & 7) + ((lane >> 4) << 3)) * FA_ROW + ((lane >> 3) & 1) * 8;
#pragma unroll 1
            for (int k0 = 0; k0 < FA_DIM; k0 += 64) {
#pragma unroll
                for (int h = 0; h < 4; h++) {
                    uint32_t a[4];
                    d_ldsm_x4(a, qa + k0 + 16 * h);
                    if (KW == 8) {
                        uint32_t bk[2];
                        d_ldsm_x2(bk, kb + k0 + 16 * h);
                        fa_mma(acc[h][0], a, bk[0], bk[1]);
                    } else {
#pragma unroll
                        for (int j = 0; j + 1 < KW / 8; j += 2) {
                            uint32_t bk[4];
                            d_ldsm_x4(bk, kb + j * 8 * FA_ROW + k0 + 16 * h);
                            fa_mma(acc[h][j], a, bk[0], bk[1]);
                            fa_mma(acc[h][j + 1], a, bk[2], bk[3]);
                        }
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < KW / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc[0][j][e] = __fadd_rn(__fadd_rn(acc[0][j][e], acc[1][j][e]), __fadd_rn(acc[2][j][e], acc[3][j][e]));
#pragma unroll
            for (int j = 0; j < KW / 8; j++) {
                const int key = kg * KW + j * 8 + 2 * c4;
                const bool v0 = valid[key], v1 = valid[key + 1];
                float2 lo = make_float2(v0 ? __fmul_rn(acc[0][j][0], scale) : -INFINITY,
                                        v1 ? __fmul_rn(acc[0][j][1], scale) : -INFINITY);
                float2 hi = make_float2(v0 ? __fmul_rn(acc[0][j][2], scale) : -INFINITY,
                                        v1 ? __fmul_rn(acc[0][j][3], scale) : -INFINITY);
                *(float2 *)(ss + (rg * 16 + g) * FA_SROW + key) = lo;
                *(float2 *)(ss + (rg * 16 + g + 8) * FA_SROW + key) = hi;
            }
        }
        __syncthreads();

        if (soft) { /* 3. online softmax of head sh: thread c = t mod TPH holds the CPU's sum lanes c·LPT …
                     * c·LPT + LPT − 1, i.e. the keys 8j + c·LPT + l (j = 0 … 7) */
            const int c = t % TPH;
            float sv[8][LPT];
            float bmax = -INFINITY;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                if (LPT == 2) {
                    const float2 v = *(const float2 *)(ss + sh * FA_SROW + j * 8 + 2 * c);
                    sv[j][0] = v.x, sv[j][LPT - 1] = v.y;
                } else {
                    sv[j][0] = ss[sh * FA_SROW + j * 8 + c];
                }
#pragma unroll
                for (int l = 0; l < LPT; l++) bmax = sv[j][l] > bmax ? sv[j][l] : bmax;
            }
#pragma unroll
            for (int off = 1; off < TPH; off <<= 1) {
                const float other = __shfl_xor_sync(0xffffffffu, bmax, off);
                bmax = other > bmax ? other : bmax;
            }
            const float m_new = bmax > m_run ? bmax : m_run;
            const float alpha = d_expf(__fsub_rn(m_run, m_new));
            float lanes[LPT]; /* CPU sum_f32 lanes, keys ascending */
#pragma unroll
            for (int l = 0; l < LPT; l++) lanes[l] = 0.0f;
            uint16_t *prow = ps + sh * FA_PROW + c * LPT;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float p[LPT];
#pragma unroll
                for (int l = 0; l < LPT; l++) {
                    p[l] = d_expf(__fsub_rn(sv[j][l], m_new)); /* −inf → 0 */
                    lanes[l] = __fadd_rn(lanes[l], p[l]);
                }
                if (LPT == 2)
                    *(uint32_t *)(prow + j * 8) = (uint32_t)d_to_bf16(p[0]) | ((uint32_t)d_to_bf16(p[LPT - 1]) << 16);
                else
                    prow[j * 8] = d_to_bf16(p[0]);
            }
            /* ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)): the in-thread pair, then xor 1, 2 (, 4) across threads
             * (a + b = b + a, so every thread of the head ends with the CPU's total) */
            float s = LPT == 2 ? __fadd_rn(lanes[0], lanes[LPT - 1]) : lanes[0];
#pragma unroll
            for (int off = 1; off < TPH; off <<= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));
            l_run = __fadd_rn(__fmul_rn(l_run, alpha), s);
            m_run = m_new;
            if (c == 0) alpha_s[sh] = alpha;
        }
        if (t < FA_BLOCK) /* step b's gather (two steps ago) is done with this slot */
            rows_s[buf * FA_BLOCK + t] = fa_row(next_id, kv_win, n_win, kv_cmp, n_cmp);
        __syncthreads();

        { /* 4. O = O·α + P·V for rows 16·rg …, columns col0 … col0 + NC/WPR */
            const float a_lo = alpha_s[rg * 16 + g], a_hi = alpha_s[rg * 16 + g + 8];
#pragma unroll
            for (int j = 0; j < NT; j++) {
                o[j][0] = __fmul_rn(o[j][0], a_lo), o[j][1] = __fmul_rn(o[j][1], a_lo);
                o[j][2] = __fmul_rn(o[j][2], a_hi), o[j][3] = __fmul_rn(o[j][3], a_hi);
            }
            const uint16_t *pa = ps + (rg * 16 + (lane & 15)) * FA_PROW + (lane >> 4) * 8;
            const uint16_t *vb = kv + ((lane & 7) + ((lane >> 3) & 1) * 8) * FA_ROW + col0 + (lane >> 4) * 8;
#pragma unroll
            for (int k0 = 0; k0 < FA_BLOCK; k0 += 16) {
                uint32_t a[4];
                d_ldsm_x4(a, pa + k0);
#pragma unroll
                for (int j = 0; j < NT; j += 2) {
                    uint32_t bv[4];
                    d_ldsm_x4_t(bv, vb + k0 * FA_ROW + j * 8);
                    fa_mma(o[j], a, bv[0], bv[1]);
                    fa_mma(o[j + 1], a, bv[2], bv[3]);
                }
            }
        }
        __syncthreads(); /* this buffer, S, P and α are free */
        if (b + 2 < nblk)
            fa_gather(kvs + buf * (FA_BLOCK * FA_ROW), valid_s + buf * FA_BLOCK, rows_s + buf * FA_BLOCK, q);
        d_cp_commit(); /* one group per step (possibly empty) keeps wait_group 1 meaning "step b+1 pending" */
    }

    asm volatile("cp.async.wait_all;\n" ::); /* the empty trailing groups (and Q when the list is empty) */
    if (soft && t % TPH == 0) lfin_s[sh] = __fadd_rn(l_run, d_expf(__fsub_rn(sink[head0 + sh], m_run)));
    __syncthreads();
    const float l_lo = lfin_s[rg * 16 + g], l_hi = lfin_s[rg * 16 + g + 8];
    uint16_t *olo = out + (qi * FA_HEADS + head0 + rg * 16 + g) * FA_DIM + col0 + 2 * c4;
    uint16_t *ohi = olo + 8 * FA_DIM;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        *(uint32_t *)(olo + j * 8) = (uint32_t)d_to_bf16(__fdiv_rn(o[j][0], l_lo)) |
                                     ((uint32_t)d_to_bf16(__fdiv_rn(o[j][1], l_lo)) << 16);
        *(uint32_t *)(ohi + j * 8) = (uint32_t)d_to_bf16(__fdiv_rn(o[j][2], l_hi)) |
                                     ((uint32_t)d_to_bf16(__fdiv_rn(o[j][3], l_hi)) << 16);
    }
}

template <int NC, int HPB>
static int fa_launch(const di_backend *be, const uint16_t *q, int64_t m, const uint16_t *kv_win, int64_t n_win,
                     const uint16_t *kv_cmp, int64_t n_cmp, const float *sink, const int32_t *idx, int64_t n_idx,
                     float scale, uint16_t *out, di_error *err) {
    static int smem_set; /* the >48 KB dynamic shared-memory opt-in, once per instantiation */
    if (!smem_set) {
        cudaError_t e = cudaFuncSetAttribute(sparse_attn_fast_kernel<NC, HPB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             FA_SMEM);
        if (e != cudaSuccess)
            return di_error_set(err, DI_ERR_INTERNAL, "cuda sparse_attn_fast: %d B of shared memory: %s", FA_SMEM,
                                cudaGetErrorString(e));
        smem_set = 1;
    }
    dim3 grid((unsigned)m, FA_DIM / NC, FA_HEADS / HPB);
    sparse_attn_fast_kernel<NC, HPB><<<grid, FA_THREADS, FA_SMEM, di_cuda_state(be)->stream>>>(
        q, kv_win, n_win, kv_cmp, n_cmp, sink, idx, n_idx, scale, out);
    return di_cuda_launched("sparse_attn_fast", err);
}

extern "C" int di_cuda_sparse_attn_fast_split(const di_backend *be, const uint16_t *q, int64_t m, int nh, int d,
                                              const uint16_t *kv_win, int64_t n_win, const uint16_t *kv_cmp,
                                              int64_t n_cmp, const float *sink, const int32_t *idx, int64_t n_idx,
                                              float scale, uint16_t *out, int cols, int heads, di_error *err) {
    /* Not the V4.1 shape, or rows not 16-byte aligned for cp.async: the general scalar kernel. */
    if (nh != FA_HEADS || d != FA_DIM || (((uintptr_t)q | (uintptr_t)kv_win | (uintptr_t)kv_cmp | (uintptr_t)out) & 15))
        return di_cuda_sparse_attn(be, q, m, nh, d, kv_win, n_win, kv_cmp, n_cmp, sink, idx, n_idx, scale, out, err);
    const bool auto_split = cols == 0 && heads == 0;
    if (m < 0 || m > 0x7fffffff || n_win < 0 || n_cmp < 0 || n_idx < 0 || (n_cmp > 0 && !kv_cmp) ||
        (!auto_split && !((heads == 64 && (cols == 64 || cols == 128 || cols == 256 || cols == 512)) ||
                          (heads == 16 && (cols == 128 || cols == 256 || cols == 512)))))
        return di_error_set(err, DI_ERR_INVALID,
                            "cuda sparse_attn_fast: n_q %lld, n_win %lld, n_cmp %lld, n_idx %lld, split %d columns × "
                            "%d heads (expected 0 × 0, 64/128/256/512 × 64 or 128/256/512 × 16)",
                            (long long)m, (long long)n_win, (long long)n_cmp, (long long)n_idx, cols, heads);
    if (m == 0) return DI_OK;
    if (auto_split) {
        /* A block's time hardly depends on its columns (the score and softmax steps are the same for all
         * NC; measured 55 µs for NC = 64 vs 72 µs for 512 over 640 indices): take the most column splits
         * that still fit ONE wave of blocks (blocks ≤ #SMs), else 512. Batches of ≤ #SMs/16 queries are
         * latency-bound (one block's ten serial steps): they also split the heads in 4 groups of 16, which
         * shortens each step ~4× at the price of reading each KV row 4× (from L2). The bits do not depend
         * on the split. */
        int sms = 132;
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, di_cuda_state(be)->device);
        heads = m * 16 <= sms ? 16 : 64;
        const int min_cols = heads == 16 ? 128 : 64;
        cols = 512;
        while (cols > min_cols && m * (FA_HEADS / heads) * (FA_DIM / (cols / 2)) <= sms) cols /= 2;
    }
#define FA_ARGS be, q, m, kv_win, n_win, kv_cmp, n_cmp, sink, idx, n_idx, scale, out, err
    if (heads == 16) {
        switch (cols) {
        case 128: return fa_launch<128, 16>(FA_ARGS);
        case 256: return fa_launch<256, 16>(FA_ARGS);
        default: return fa_launch<512, 16>(FA_ARGS);
        }
    }
    switch (cols) {
    case 64: return fa_launch<64, 64>(FA_ARGS);
    case 128: return fa_launch<128, 64>(FA_ARGS);
    case 256: return fa_launch<256, 64>(FA_ARGS);
    default: return fa_launch<512, 64>(FA_ARGS);
    }
#undef FA_ARGS
}

extern "C" int di_cuda_sparse_attn_fast(const di_backend *be, const uint16_t *q, int64_t m, int nh, int d,
                                        const uint16_t *kv_win, int64_t n_win, const uint16_t *kv_cmp, int64_t n_cmp,
                                        const float *sink, const int32_t *idx, int64_t n_idx, float scale,
                                        uint16_t *out, di_error *err) {
    return di_cuda_sparse_attn_fast_split(be, q, m, nh, d, kv_win, n_win, kv_cmp, n_cmp, sink, idx, n_idx, scale,
                                          out, 0, 0, err);
}
