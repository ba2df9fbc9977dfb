/* The moe_routed slot on the GPU (backend.h): the routed experts of a small step (decode, DSpark
 * verify) with the dispatch planned on the device, so no router id comes back to the host (no
 * synchronisation point per layer; the whole sub-layer can be captured in a CUDA graph).
 *
 * Six launches per call, for every (token, slot) pair of the step at once:
 *   plan      one CTA ranks the pairs by (expert id, pair index) — the order in which the host-planned
 *             loop visits them (experts ascending, each expert's tokens ascending, a token's slots
 *             ascending) — cuts the ranked list into groups of one expert and each group into passes
 *             of up to MT rows;
 *   quant     the exact FP8 act-quantization of the m input rows (cuda_quant.cu);
 *   up        w1 and w3 of every pass: the GEMV core of cuda_gemv.cuh (or cuda_gemv_mma.cuh) on a 1-D
 *             grid spread over the passes the plan found (moe_assign). Each expert's weights are read
 *             from memory once per step (its further passes mostly from L2), its rows (ranks) from the
 *             token rows of x;
 *   swiglu    with the routing weight of each ranked row (the swiglu slot's kernel);
 *   quant     of the SwiGLU rows;
 *   down      w2 per pass, the same way;
 *   combine   acc[t] = 0 + Σ f32(y) over t's ranked rows in ascending rank.
 * From MOE_MM_MIN_TOKENS tokens the up and down launches are the grouped GEMM of cuda_moe_mm.cu instead
 * (passes of 16 rows, each after a pre-pass that writes the ranked rows' x digit planes).
 * Every row of every GEMV is computed as the linear_fp4 slot computes it (each row's result depends on
 * that row alone), SwiGLU is the same kernel, and the f32 sum sees the same terms in the same order as
 * scatter_add_rows per expert ascending: the result equals the host-planned path bit for bit.
 *
 * The expert table (n_exp × 6 pointers, 18 KiB for 384 experts) travels by value as a kernel
 * parameter (CUDA 12.1+ allows 32 KiB), so nothing is uploaded per call. Ids outside [0, n_exp) and
 * experts without weights are skipped. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_gemv_mma.cuh"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_ops.h"

/* One CTA; its threads take pairs i, i + PLAN_THREADS, …; O(P²) compares (P ≤ DI_MOE_ROUTED_MAX_PAIRS).
 * mt: the rows of one GEMV pass (the MT the GEMV kernels are instantiated with). */
#define PLAN_THREADS 1024
__global__ void __launch_bounds__(PLAN_THREADS) moe_plan_kernel(const __grid_constant__ moe_table tab,
                                                                const int32_t *ids, const float *weights, int P,
                                                                int n_exp, int mt, int mm_min, moe_plan pl) {
    __shared__ int key[DI_MOE_ROUTED_MAX_PAIRS];      /* expert id, n_exp for a skipped pair (sorts last) */
    __shared__ uint8_t first[DI_MOE_ROUTED_MAX_PAIRS]; /* the group's first pair */
    __shared__ int passes[DI_MOE_ROUTED_MAX_PAIRS];   /* ⌈count / mt⌉ at a GEMV group's first pair, else 0 */
    __shared__ int passes2[DI_MOE_ROUTED_MAX_PAIRS];  /* ⌈count / MOE_MM_ROWS⌉ at a GEMM group's first pair */
    __shared__ int rank_of[DI_MOE_ROUTED_MAX_PAIRS], count_of[DI_MOE_ROUTED_MAX_PAIRS];
    __shared__ int n_groups_sh;
    if (threadIdx.x == 0) n_groups_sh = 0;
    for (int i = threadIdx.x; i < P; i += blockDim.x) {
        int kk = n_exp, id = ids[i];
        if (id >= 0 && id < n_exp && tab.p[id][0] && tab.p[id][1] && tab.p[id][2] && tab.p[id][3] && tab.p[id][4] &&
            tab.p[id][5])
            kk = id;
        key[i] = kk;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < P; i += blockDim.x) {
        const int kk = key[i];
        int rank = 0, cnt = 0;
        bool fst = kk < n_exp;
        for (int p = 0; p < P; p++) {
            int kp = key[p];
            rank += kp < kk || (kp == kk && p < i);
            if (kp == kk) {
                cnt++;
                if (p < i) fst = false;
            }
        }
        first[i] = fst;
        passes[i] = fst && cnt < mm_min ? (cnt + mt - 1) / mt : 0;
        passes2[i] = fst && cnt >= mm_min ? (cnt + MOE_MM_ROWS - 1) / MOE_MM_ROWS : 0;
        rank_of[i] = rank, count_of[i] = cnt;
        if (fst) atomicAdd(&n_groups_sh, 1);
    }
    __syncthreads(); /* orders first[], passes[] and the group count for the reads below */
    const int n_groups = n_groups_sh;
    for (int i = threadIdx.x; i < P; i += blockDim.x) {
        const int kk = key[i], rank = rank_of[i];
        pl.order[rank] = i;
        pl.rw[rank] = weights[i];
        pl.rank[i] = kk < n_exp ? rank : -1;
        if (first[i]) {
            int g = 0, pass = 0, pass2 = 0;
            for (int p = 0; p < P; p++)
                if (first[p] && key[p] < kk) g++, pass += passes[p], pass2 += passes2[p];
            pl.g_expert[g] = kk, pl.g_start[g] = rank, pl.g_count[g] = count_of[i];
            pl.g_pass[g] = pass, pl.g_pass2[g] = pass2;
            if (g == n_groups - 1) pl.g_pass[n_groups] = pass + passes[i], pl.g_pass2[n_groups] = pass2 + passes2[i];
        }
    }
    if (threadIdx.x == 0) *pl.n_groups = n_groups;
    if (threadIdx.x == 0 && n_groups == 0) pl.g_pass[0] = pl.g_pass2[0] = 0;
}

/* x row of tile row m: the token of the ranked pair (up), or the ranked row itself (down) */
struct moe_rows_token {
    const int32_t *order;
    int k;
    int64_t base;
    __device__ int64_t operator()(int m) const { return order[base + m] / k; }
};
struct moe_rows_rank {
    int64_t base;
    __device__ int64_t operator()(int m) const { return base + m; }
};
struct moe_out {
    uint16_t *y;
    int64_t ld, base;
    __device__ void operator()(int m, int64_t n, float v) const { y[(base + m) * ld + n] = d_to_bf16(v); }
};

/* Which part of the work a CTA takes. The grid is sized on the host, before the plan exists, for the
 * most groups a step can have (min(P, n_exp)); the plan usually finds far fewer, and uneven ones (a
 * decode batch's tokens share experts: 54 groups for 64 tokens × 6 slots in bench gpu's routing, some
 * with tens of rows). A grid of one CTA column per possible group left most CTAs idle and gave each
 * real group one or two CTAs to walk all its tiles and rows (42.8 ms for the B = 64 step on the H200,
 * 2026-11-30). So the work is cut into units of equal size — one pass of up to MT rows of one group
 * over one matrix (parts: w1 and w3 for the up projection, w2 alone for the down one) — and the whole
 * 1-D grid is spread over the units that exist, read on the device: U = passes · parts, per = ⌊V / U⌋
 * CTAs per unit (at most its tile count); CTA v takes unit v / per, tiles v % per, v % per + per, …
 * Which CTA computes an output changes nothing in its value (it depends on its row and column only),
 * so the result is the same bits for any grid. Returns false for a CTA with no unit. */
struct moe_cta {
    int grp, part, r0; /* group, matrix part, first rank of the pass within the group */
    int64_t tile0, step;
};
template <int MT>
static __device__ __forceinline__ bool moe_assign(const moe_plan &pl, int parts, int64_t ntiles, moe_cta &c) {
    const int ng = *pl.n_groups;
    const int64_t V = gridDim.x, U = (int64_t)pl.g_pass[ng] * parts;
    if (U == 0) return false;
    int64_t per = V / U;
    per = per < 1 ? 1 : per > ntiles ? ntiles : per;
    const int64_t u = blockIdx.x / per;
    if (u >= U) return false;
    const int pass = (int)(u / parts);
    int lo = 0, hi = ng - 1; /* the group g with g_pass[g] ≤ pass < g_pass[g + 1] */
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (pl.g_pass[mid] <= pass) lo = mid;
        else hi = mid - 1;
    }
    c.grp = lo, c.part = (int)(u % parts), c.r0 = (pass - pl.g_pass[lo]) * MT;
    c.tile0 = blockIdx.x % per, c.step = per;
    return true;
}

/* 1-D grid (moe_assign, 2 parts): part 0 takes w1's tiles, part 1 w3's, for the pass's rows; g, u bf16
 * [P, inter] by rank. */
template <int MT, int NC>
__global__ void __launch_bounds__(GV_WARPS * 32) moe_up_kernel(const __grid_constant__ moe_table tab, moe_plan pl,
                                                               const uint8_t *xq, const uint8_t *xs, int64_t d,
                                                               int64_t inter, int k, uint16_t *g, uint16_t *u) {
    extern __shared__ uint4 gv_sm[];
    float *sm = (float *)gv_sm; /* gv_smem(1, MT, d, NC) bytes */
    moe_cta c;
    if (!moe_assign<MT>(pl, 2, (inter + NC - 1) / NC, c)) return;
    const int e = pl.g_expert[c.grp], start = pl.g_start[c.grp], cnt = pl.g_count[c.grp];
    const bool up = c.part == 1;
    const gv_args a = {xq, xs, tab.p[e][up ? 2 : 0], tab.p[e][up ? 3 : 1], inter, d};
    gv_run<1, MT, NC>(a, moe_rows_token{pl.order, k, start + c.r0}, min(MT, cnt - c.r0),
                      moe_out{up ? u : g, inter, start + c.r0}, c.tile0, c.step, NULL, sm);
}

/* 1-D grid (moe_assign, 1 part): w2's tiles; aq, as: the act-quantized SwiGLU rows by rank; y bf16 [P, d] */
template <int MT, int NC>
__global__ void __launch_bounds__(GV_WARPS * 32) moe_down_kernel(const __grid_constant__ moe_table tab, moe_plan pl,
                                                                 const uint8_t *aq, const uint8_t *as, int64_t d,
                                                                 int64_t inter, uint16_t *y) {
    extern __shared__ uint4 gv_sm[];
    float *sm = (float *)gv_sm; /* gv_smem(1, MT, inter, NC) bytes */
    moe_cta c;
    if (!moe_assign<MT>(pl, 1, (d + NC - 1) / NC, c)) return;
    const int e = pl.g_expert[c.grp], start = pl.g_start[c.grp], cnt = pl.g_count[c.grp];
    const gv_args a = {aq, as, tab.p[e][4], tab.p[e][5], d, inter};
    gv_run<1, MT, NC>(a, moe_rows_rank{start + c.r0}, min(MT, cnt - c.r0), moe_out{y, d, start + c.r0}, c.tile0,
                      c.step, NULL, sm);
}

/* The same two kernels on the tensor-core GEMV core (cuda_gemv_mma.cuh; the default, DI_CUDA_GEMV=simt
 * takes the two above): same grid, same rows, same results. sm: gvm_smem(MT, NC, K) bytes. */
template <int MT, int NC>
__global__ void __launch_bounds__(GVM_WARPS * 32) moe_up_mma_kernel(const __grid_constant__ moe_table tab, moe_plan pl,
                                                                    const uint8_t *xq, const uint8_t *xs, int64_t d,
                                                                    int64_t inter, int k, uint16_t *g, uint16_t *u) {
    extern __shared__ uint4 gv_sm[];
    moe_cta c;
    if (!moe_assign<MT>(pl, 2, (inter + NC - 1) / NC, c)) return;
    const int e = pl.g_expert[c.grp], start = pl.g_start[c.grp], cnt = pl.g_count[c.grp];
    const bool up = c.part == 1;
    const gv_args a = {xq, xs, tab.p[e][up ? 2 : 0], tab.p[e][up ? 3 : 1], inter, d};
    gvm_run<MT, NC>(a, moe_rows_token{pl.order, k, start + c.r0}, min(MT, cnt - c.r0),
                    moe_out{up ? u : g, inter, start + c.r0}, c.tile0, c.step, (unsigned char *)gv_sm);
}

template <int MT, int NC>
__global__ void __launch_bounds__(GVM_WARPS * 32) moe_down_mma_kernel(const __grid_constant__ moe_table tab, moe_plan pl,
                                                                      const uint8_t *aq, const uint8_t *as, int64_t d,
                                                                      int64_t inter, uint16_t *y) {
    extern __shared__ uint4 gv_sm[];
    moe_cta c;
    if (!moe_assign<MT>(pl, 1, (d + NC - 1) / NC, c)) return;
    const int e = pl.g_expert[c.grp], start = pl.g_start[c.grp], cnt = pl.g_count[c.grp];
    const gv_args a = {aq, as, tab.p[e][4], tab.p[e][5], d, inter};
    gvm_run<MT, NC>(a, moe_rows_rank{start + c.r0}, min(MT, cnt - c.r0), moe_out{y, d, start + c.r0}, c.tile0,
                    c.step, (unsigned char *)gv_sm);
}

/* acc[t, c] = 0 + Σ f32(y[r, c]) over the ranks r of token t, ascending. grid (column blocks, token) */
__global__ void moe_combine_kernel(const int32_t *rank, const uint16_t *y, int64_t d, int k, float *acc) {
    const int64_t t = blockIdx.y, c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= d) return;
    const int32_t *rk = rank + t * k;
    float s = 0.0f;
    int last = -1;
    for (int step = 0; step < k; step++) { /* the next larger rank of this token: k² compares, k small */
        int best = 0x7fffffff;
        for (int j = 0; j < k; j++) {
            int r = rk[j];
            if (r > last && r < best) best = r;
        }
        if (best == 0x7fffffff) break;
        s = __fadd_rn(s, d_bf16(y[(int64_t)best * d + c]));
        last = best;
    }
    acc[t * d + c] = s;
}

static size_t al256(size_t n) { return (n + 255) & ~(size_t)255; }

#define MOE_SMEM (160 * 1024) /* dynamic shared memory the GEMV kernels may use (x digits, scales, pb) */

/* The 1-D grid of the GEMV kernels: about MOE_CTAS CTAs, spread on the device over the units the plan
 * finds (moe_assign); at least one per unit of the most a step can have (one pass per pair: P · parts),
 * so every unit has a CTA whatever the plan finds. */
#define MOE_CTAS (132 * 8)
static unsigned moe_grid(int P, int parts) {
    const int64_t v = (int64_t)P * parts;
    return (unsigned)(v > MOE_CTAS ? v : MOE_CTAS);
}

template <int MT, int NC>
static void moe_gemvs(const moe_table &tab, const moe_plan &pl, int P, const uint8_t *xq, const uint8_t *xs, int64_t d,
                      int64_t inter, int k, uint16_t *g, uint16_t *u, cudaStream_t st) {
    static bool raised = false;
    if (!raised) cudaFuncSetAttribute(moe_up_kernel<MT, NC>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM), raised = true;
    moe_up_kernel<MT, NC><<<moe_grid(P, 2), gv_threads(1, d), gv_smem(1, MT, d, NC), st>>>(
        tab, pl, xq, xs, d, inter, k, g, u);
}

template <int MT, int NC>
static void moe_down(const moe_table &tab, const moe_plan &pl, int P, const uint8_t *aq, const uint8_t *as, int64_t d,
                     int64_t inter, uint16_t *y, cudaStream_t st) {
    static bool raised = false;
    if (!raised) cudaFuncSetAttribute(moe_down_kernel<MT, NC>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM), raised = true;
    moe_down_kernel<MT, NC><<<moe_grid(P, 1), gv_threads(1, inter), gv_smem(1, MT, inter, NC), st>>>(
        tab, pl, aq, as, d, inter, y);
}

template <int MT>
static void moe_gemvs_mma(const moe_table &tab, const moe_plan &pl, int P, const uint8_t *xq, const uint8_t *xs,
                          int64_t d, int64_t inter, int k, uint16_t *g, uint16_t *u, uint16_t *y, const uint8_t *aq,
                          const uint8_t *as, int down, cudaStream_t st) {
    static bool raised = false;
    if (!raised) {
        cudaFuncSetAttribute(moe_up_mma_kernel<MT, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM);
        cudaFuncSetAttribute(moe_down_mma_kernel<MT, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM);
        raised = true;
    }
    if (!down) {
        moe_up_mma_kernel<MT, 16><<<moe_grid(P, 2), gvm_threads(d), (size_t)gvm_smem(MT, 16, d), st>>>(
            tab, pl, xq, xs, d, inter, k, g, u);
    } else {
        moe_down_mma_kernel<MT, 16><<<moe_grid(P, 1), gvm_threads(inter), (size_t)gvm_smem(MT, 16, inter),
                                      st>>>(tab, pl, aq, as, d, inter, y);
    }
}

/* Column tile of the expert GEMVs (same bits either way): 4 columns for one row per group (T = 1) and
 * for T > 16, 8 for 2 ≤ T ≤ 16 — measured (bench/NOTES-gpu.md). di_cuda_moe_set_variant: 0 = this
 * rule, 1 = always 4, 2 = always 8 (bench). */
static int g_moe_variant = 0;
extern "C" void di_cuda_moe_set_variant(int v) { g_moe_variant = v; }

/* The grouped expert GEMM (cuda_moe_mm.cu) for steps of more than 16 tokens, for every group (measured on
 * the H200, 2026-12-02: up to 16 tokens the GEMVs are 1.03-1.26x faster, even with the GEMM taking only
 * the groups of >= 2, 3 or 5 rows; from 32 tokens the GEMM for every group is the fastest of those, 1.11x
 * at 32 tokens over 384 experts, 2.3-2.7x on skewed steps). The plan can also split the groups by size
 * (the GEMM for those of at least mm_min rows, the GEMVs for the others; both give the same bits):
 * di_cuda_moe_set_mm: 0 = the rule, −1 = never, n ≥ 1 = groups of at least n rows whatever the step
 * (tests, bench). DI_CUDA_MOE_MM=off keeps the GEMVs. */
#define MOE_MM_MIN_TOKENS 17
static int g_moe_mm_env = -1, g_moe_mm = 0;
extern "C" void di_cuda_moe_set_mm(int min_rows) { g_moe_mm = min_rows; }

extern "C" int di_cuda_moe_routed(const di_backend *be, const uint16_t *x, int64_t m, int64_t d, int64_t inter,
                                  const int32_t *ids, const float *weights, int k, int n_exp,
                                  const di_moe_expert *experts, float lim, float *acc, di_error *err) {
    if (m < 0 || k < 1 || d <= 0 || inter <= 0 || d % 32 || inter % 32 || !experts)
        return di_error_set(err, DI_ERR_INVALID, "cuda moe_routed: %lld tokens × %d slots, dim %lld, inter %lld (multiples of 32)",
                            (long long)m, k, (long long)d, (long long)inter);
    if (m * k > DI_MOE_ROUTED_MAX_PAIRS || n_exp < 1 || n_exp > DI_MOE_ROUTED_MAX_EXPERTS)
        return di_error_set(err, DI_ERR_INVALID, "cuda moe_routed: %lld pairs (at most %d), %d experts (at most %d)",
                            (long long)(m * k), DI_MOE_ROUTED_MAX_PAIRS, n_exp, DI_MOE_ROUTED_MAX_EXPERTS);
    if (gv_smem(1, 4, d > inter ? d : inter) > MOE_SMEM)
        return di_error_set(err, DI_ERR_UNSUPPORTED, "cuda moe_routed: dim %lld / inter %lld too large for the GEMV tile",
                            (long long)d, (long long)inter);
    if (m == 0) return DI_OK;
    const int P = (int)(m * k), G = P < n_exp ? P : n_exp;
    size_t off[19], bytes = 0;
    const size_t sz[] = {
        al256(4 * (size_t)P), al256(4 * (size_t)P), al256(4 * (size_t)P), al256(4 * (size_t)G), al256(4 * (size_t)G),
        al256(4 * (size_t)G), al256(4 * (size_t)(G + 1)), al256(4),               /* g_count, g_pass, n_groups */
        al256((size_t)(m * d)), al256((size_t)(m * d / 32)),                       /* x codes, scales */
        al256(2 * (size_t)P * inter), al256(2 * (size_t)P * inter), al256(2 * (size_t)P * inter), /* g, u, a */
        al256((size_t)P * inter), al256((size_t)P * inter / 32),                   /* a codes, scales */
        al256(2 * (size_t)P * d),                                                  /* y */
        al256(moe_mm_planes_bytes(P, d > inter ? d : inter)),                      /* the GEMM's x planes */
        al256(moe_mm_scales_bytes(P, d > inter ? d : inter)),                      /* and scales */
        al256(4 * (size_t)(G + 1)),                                                /* g_pass2 */
    };
    const int nsz = (int)(sizeof sz / sizeof sz[0]);
    for (int i = 0; i < nsz; i++) off[i] = bytes, bytes += sz[i];
    void *wsp;
    int rc = di_cuda_workspace(be, bytes, &wsp, err);
    if (rc) return rc;
    uint8_t *b = (uint8_t *)wsp;
    moe_plan pl = {(int32_t *)(b + off[0]), (float *)(b + off[1]),   (int32_t *)(b + off[2]), (int32_t *)(b + off[3]),
                   (int32_t *)(b + off[4]), (int32_t *)(b + off[5]), (int32_t *)(b + off[6]), (int32_t *)(b + off[18]),
                   (int32_t *)(b + off[7])};
    uint8_t *xq = b + off[8], *xs = b + off[9], *aq = b + off[13], *as = b + off[14];
    uint16_t *g = (uint16_t *)(b + off[10]), *u = (uint16_t *)(b + off[11]), *a = (uint16_t *)(b + off[12]);
    uint16_t *y = (uint16_t *)(b + off[15]);
    uint8_t *planes = b + off[16];
    float *sxT = (float *)(b + off[17]);

    moe_table tab;
    memset(&tab, 0, sizeof tab);
    /* the tensor-core GEMVs (unless DI_CUDA_GEMV=simt): K % 128 for both matrices, aligned pointers */
    bool mma_ok = di_cuda_gemv_mma_enabled() && d % 128 == 0 && inter % 128 == 0 &&
                  gvm_smem(4, 16, d > inter ? d : inter) <= MOE_SMEM;
    bool mm_aligned = true; /* the grouped GEMM's copies: 16-byte code chunks, 4-byte scale words */
    for (int e = 0; e < n_exp; e++) {
        const di_moe_expert *ex = &experts[e];
        const uint8_t *p[6] = {ex->w1, ex->s1, ex->w3, ex->s3, ex->w2, ex->s2};
        for (int j = 0; j < 6; j++) {
            tab.p[e][j] = p[j];
            mma_ok &= (uintptr_t)p[j] % (j % 2 ? 2 : 4) == 0; /* 4-byte weight, 2-byte scale loads */
            mm_aligned &= (uintptr_t)p[j] % (j % 2 ? 4 : 16) == 0;
        }
    }
    cudaStream_t st = di_cuda_state(be)->stream;
    /* groups of at least mm_min rows take the grouped GEMM (with fewer tokens than mm_min no group is
     * expected to reach it — a token's ids are distinct — and the GEMM's launches are left out) */
    const int want = g_moe_mm ? g_moe_mm : 1;
    const bool mm = mma_ok && want > 0 && m >= (g_moe_mm ? want : MOE_MM_MIN_TOKENS) &&
                    di_cuda_env_switch(&g_moe_mm_env, "DI_CUDA_MOE_MM", "off") && mm_aligned;
    const int mm_min = mm ? want : 0x7fffffff;
    /* rows per GEMV pass: 1 for a single token (unless it names an expert twice: more passes); a few when
     * tokens share experts */
    const int mt = m == 1 ? 1 : m <= 16 ? 2 : 4;
    moe_plan_kernel<<<1, PLAN_THREADS, 0, st>>>(tab, ids, weights, P, n_exp, mt, mm_min, pl);
    if ((rc = di_cuda_launched("moe_routed plan", err))) return rc;
    if ((rc = di_cuda_act_quant_fp8(x, m * d, 32, xq, xs, st, err))) return rc;
    if (mm && (rc = moe_mm_run(tab, pl, P, k, 0, xq, xs, d, inter, planes, sxT, g, u, st, err))) return rc;
    const int nc4 = g_moe_variant ? g_moe_variant == 1 : mt != 2;
    if (mma_ok) {
        if (mt == 1) moe_gemvs_mma<1>(tab, pl, P, xq, xs, d, inter, k, g, u, y, aq, as, 0, st);
        else if (mt == 2) moe_gemvs_mma<2>(tab, pl, P, xq, xs, d, inter, k, g, u, y, aq, as, 0, st);
        else moe_gemvs_mma<4>(tab, pl, P, xq, xs, d, inter, k, g, u, y, aq, as, 0, st);
    } else switch (nc4 * 10 + mt) {
    case 1: moe_gemvs<1, 8>(tab, pl, P, xq, xs, d, inter, k, g, u, st); break;
    case 2: moe_gemvs<2, 8>(tab, pl, P, xq, xs, d, inter, k, g, u, st); break;
    case 4: moe_gemvs<4, 8>(tab, pl, P, xq, xs, d, inter, k, g, u, st); break;
    case 11: moe_gemvs<1, 4>(tab, pl, P, xq, xs, d, inter, k, g, u, st); break;
    case 12: moe_gemvs<2, 4>(tab, pl, P, xq, xs, d, inter, k, g, u, st); break;
    default: moe_gemvs<4, 4>(tab, pl, P, xq, xs, d, inter, k, g, u, st); break;
    }
    if ((rc = di_cuda_launched("moe_routed up", err))) return rc;
    if ((rc = di_cuda_swiglu(be, g, u, P, inter, pl.rw, lim, a, err))) return rc;
    if ((rc = di_cuda_act_quant_fp8(a, (int64_t)P * inter, 32, aq, as, st, err))) return rc;
    if (mm && (rc = moe_mm_run(tab, pl, P, k, 1, aq, as, d, inter, planes, sxT, y, NULL, st, err))) return rc;
    if (mma_ok) {
        if (mt == 1) moe_gemvs_mma<1>(tab, pl, P, xq, xs, d, inter, k, g, u, y, aq, as, 1, st);
        else if (mt == 2) moe_gemvs_mma<2>(tab, pl, P, xq, xs, d, inter, k, g, u, y, aq, as, 1, st);
        else moe_gemvs_mma<4>(tab, pl, P, xq, xs, d, inter, k, g, u, y, aq, as, 1, st);
    } else switch (nc4 * 10 + mt) {
    case 1: moe_down<1, 8>(tab, pl, P, aq, as, d, inter, y, st); break;
    case 2: moe_down<2, 8>(tab, pl, P, aq, as, d, inter, y, st); break;
    case 4: moe_down<4, 8>(tab, pl, P, aq, as, d, inter, y, st); break;
    case 11: moe_down<1, 4>(tab, pl, P, aq, as, d, inter, y, st); break;
    case 12: moe_down<2, 4>(tab, pl, P, aq, as, d, inter, y, st); break;
    default: moe_down<4, 4>(tab, pl, P, aq, as, d, inter, y, st); break;
    }
    if ((rc = di_cuda_launched("moe_routed down", err))) return rc;
    moe_combine_kernel<<<dim3(di_cuda_blocks(d, 256), (unsigned)m), 256, 0, st>>>(pl.rank, y, d, k, acc);
    return di_cuda_launched("moe_routed combine", err);
}
