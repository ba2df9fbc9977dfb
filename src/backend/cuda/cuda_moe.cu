/* The moe_routed slot on the GPU (backend.h): the routed experts of a small step (decode, DSpark
 * verify) with the dispatch planned on the device, so no router id comes back to the host (no
 * synchronisation point per layer; the whole sub-layer can be captured in a CUDA graph).
 *
 * Six launches per call, for every (token, slot) pair of the step at once:
 *   plan      one CTA ranks the pairs by (expert id, pair index) — the order in which the host-planned
 *             loop visits them (experts ascending, each expert's tokens ascending, a token's slots
 *             ascending) — and cuts the ranked list into groups of one expert;
 *   quant     the exact FP8 act-quantization of the m input rows (cuda_quant.cu);
 *   up        w1 and w3 of every group: the GEMV core of cuda_gemv.cuh with grid (column tiles of w1
 *             then w3, groups); a CTA past the step's group count returns at once. Each expert's
 *             weights are read once per step, its rows (ranks) from the token rows of x;
 *   swiglu    with the routing weight of each ranked row (the swiglu slot's kernel);
 *   quant     of the SwiGLU rows;
 *   down      w2 per group, the same way;
 *   combine   acc[t] = 0 + Σ f32(y) over t's ranked rows in ascending rank.
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
#include "backend/cuda/cuda_ops.h"

typedef struct moe_table {
    const uint8_t *p[DI_MOE_ROUTED_MAX_EXPERTS][6]; /* w1 s1 w3 s3 w2 s2 of each expert */
} moe_table;

/* The plan (device memory): pairs i = t·k + j ranked by (expert, i); groups g of one expert each. */
typedef struct moe_plan {
    int32_t *order;    /* int32 [P] pair of rank r */
    float *rw;         /* f32 [P] routing weight of rank r */
    int32_t *rank;     /* int32 [P] rank of pair i, −1 for a skipped pair */
    int32_t *g_expert; /* int32 [G] */
    int32_t *g_start;  /* int32 [G] first rank of the group */
    int32_t *g_count;  /* int32 [G] */
    int32_t *n_groups; /* int32 [1] */
} moe_plan;

/* One CTA of DI_MOE_ROUTED_MAX_PAIRS threads, thread i = pair i; O(P²) compares (P ≤ 1024). */
__global__ void __launch_bounds__(DI_MOE_ROUTED_MAX_PAIRS) moe_plan_kernel(const __grid_constant__ moe_table tab,
                                                                           const int32_t *ids, const float *weights,
                                                                           int P, int n_exp, moe_plan pl) {
    __shared__ int key[DI_MOE_ROUTED_MAX_PAIRS];   /* expert id, n_exp for a skipped pair (sorts last) */
    __shared__ uint8_t first[DI_MOE_ROUTED_MAX_PAIRS]; /* the group's first pair */
    const int i = threadIdx.x;
    int kk = n_exp;
    if (i < P) {
        int id = ids[i];
        if (id >= 0 && id < n_exp && tab.p[id][0] && tab.p[id][1] && tab.p[id][2] && tab.p[id][3] && tab.p[id][4] &&
            tab.p[id][5])
            kk = id;
        key[i] = kk;
    }
    __syncthreads();
    int rank = 0, cnt = 0;
    bool fst = false;
    if (i < P) {
        fst = kk < n_exp;
        for (int p = 0; p < P; p++) {
            int kp = key[p];
            rank += kp < kk || (kp == kk && p < i);
            if (kp == kk) {
                cnt++;
                if (p < i) fst = false;
            }
        }
        first[i] = fst;
    }
    int n_groups = __syncthreads_count(fst); /* also orders first[] for the reads below */
    if (i >= P) return;
    pl.order[rank] = i;
    pl.rw[rank] = weights[i];
    pl.rank[i] = kk < n_exp ? rank : -1;
    if (fst) {
        int g = 0;
        for (int p = 0; p < P; p++) g += first[p] && key[p] < kk;
        pl.g_expert[g] = kk, pl.g_start[g] = rank, pl.g_count[g] = cnt;
    }
    if (i == 0) *pl.n_groups = n_groups;
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

/* grid (2·X, group): CTAs [0, X) take w1's tiles x, x + X, …, CTAs [X, 2X) w3's; g, u bf16 [P, inter] by
 * rank. A CTA of a group past the step's count returns at once. */
template <int MT, int NC>
__global__ void __launch_bounds__(GV_WARPS * 32) moe_up_kernel(const __grid_constant__ moe_table tab, moe_plan pl,
                                                               const uint8_t *xq, const uint8_t *xs, int64_t d,
                                                               int64_t inter, int k, uint16_t *g, uint16_t *u) {
    extern __shared__ uint4 gv_sm[];
    float *sm = (float *)gv_sm; /* gv_smem(1, MT, d, NC) bytes */
    const int grp = blockIdx.y;
    if (grp >= *pl.n_groups) return;
    const int e = pl.g_expert[grp], start = pl.g_start[grp], cnt = pl.g_count[grp];
    const int64_t X = gridDim.x / 2;
    const bool up = blockIdx.x >= X;
    const int64_t tile = up ? blockIdx.x - X : blockIdx.x;
    const gv_args a = {xq, xs, tab.p[e][up ? 2 : 0], tab.p[e][up ? 3 : 1], inter, d};
    for (int r0 = 0; r0 < cnt; r0 += MT)
        gv_run<1, MT, NC>(a, moe_rows_token{pl.order, k, start + r0}, min(MT, cnt - r0),
                      moe_out{up ? u : g, inter, start + r0}, tile, X, NULL, sm);
}

/* grid (X, group): w2's tiles x, x + X, …; aq, as: the act-quantized SwiGLU rows by rank; y bf16 [P, d] */
template <int MT, int NC>
__global__ void __launch_bounds__(GV_WARPS * 32) moe_down_kernel(const __grid_constant__ moe_table tab, moe_plan pl,
                                                                 const uint8_t *aq, const uint8_t *as, int64_t d,
                                                                 int64_t inter, uint16_t *y) {
    extern __shared__ uint4 gv_sm[];
    float *sm = (float *)gv_sm; /* gv_smem(1, MT, inter, NC) bytes */
    const int grp = blockIdx.y;
    if (grp >= *pl.n_groups) return;
    const int e = pl.g_expert[grp], start = pl.g_start[grp], cnt = pl.g_count[grp];
    const gv_args a = {aq, as, tab.p[e][4], tab.p[e][5], d, inter};
    for (int r0 = 0; r0 < cnt; r0 += MT)
        gv_run<1, MT, NC>(a, moe_rows_rank{start + r0}, min(MT, cnt - r0), moe_out{y, d, start + r0}, blockIdx.x, gridDim.x,
                      NULL, sm);
}

/* The same two kernels on the tensor-core GEMV core (cuda_gemv_mma.cuh; opt-in DI_CUDA_GEMV=mma, not yet
 * run on a GPU): same grid, same rows, same results by construction. sm: gvm_smem(MT, NC, K) bytes. */
template <int MT, int NC>
__global__ void __launch_bounds__(GVM_WARPS * 32) moe_up_mma_kernel(const __grid_constant__ moe_table tab, moe_plan pl,
                                                                    const uint8_t *xq, const uint8_t *xs, int64_t d,
                                                                    int64_t inter, int k, uint16_t *g, uint16_t *u) {
    extern __shared__ uint4 gv_sm[];
    const int grp = blockIdx.y;
    if (grp >= *pl.n_groups) return;
    const int e = pl.g_expert[grp], start = pl.g_start[grp], cnt = pl.g_count[grp];
    const int64_t X = gridDim.x / 2;
    const bool up = blockIdx.x >= X;
    const int64_t tile = up ? blockIdx.x - X : blockIdx.x;
    const gv_args a = {xq, xs, tab.p[e][up ? 2 : 0], tab.p[e][up ? 3 : 1], inter, d};
    for (int r0 = 0; r0 < cnt; r0 += MT)
        gvm_run<MT, NC>(a, moe_rows_token{pl.order, k, start + r0}, min(MT, cnt - r0),
                        moe_out{up ? u : g, inter, start + r0}, tile, X, (unsigned char *)gv_sm);
}

template <int MT, int NC>
__global__ void __launch_bounds__(GVM_WARPS * 32) moe_down_mma_kernel(const __grid_constant__ moe_table tab, moe_plan pl,
                                                                      const uint8_t *aq, const uint8_t *as, int64_t d,
                                                                      int64_t inter, uint16_t *y) {
    extern __shared__ uint4 gv_sm[];
    const int grp = blockIdx.y;
    if (grp >= *pl.n_groups) return;
    const int e = pl.g_expert[grp], start = pl.g_start[grp], cnt = pl.g_count[grp];
    const gv_args a = {aq, as, tab.p[e][4], tab.p[e][5], d, inter};
    for (int r0 = 0; r0 < cnt; r0 += MT)
        gvm_run<MT, NC>(a, moe_rows_rank{start + r0}, min(MT, cnt - r0), moe_out{y, d, start + r0}, blockIdx.x, gridDim.x,
                        (unsigned char *)gv_sm);
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

/* CTAs per group along the tiles: about MOE_CTAS in all over the G groups a step may have (the plan
 * may find fewer), each CTA walking several tiles when the groups are few */
#define MOE_CTAS (132 * 8)
static int64_t moe_split(int64_t tiles, int G) {
    int64_t x = (MOE_CTAS + G - 1) / G;
    return x < 1 ? 1 : x > tiles ? tiles : x;
}

template <int MT, int NC>
static void moe_gemvs(const moe_table &tab, const moe_plan &pl, int G, const uint8_t *xq, const uint8_t *xs, int64_t d,
                      int64_t inter, int k, uint16_t *g, uint16_t *u, cudaStream_t st) {
    static bool raised = false;
    if (!raised) cudaFuncSetAttribute(moe_up_kernel<MT, NC>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM), raised = true;
    const int64_t X = moe_split((inter + NC - 1) / NC, 2 * G);
    moe_up_kernel<MT, NC><<<dim3((unsigned)(2 * X), (unsigned)G), gv_threads(1, d), gv_smem(1, MT, d, NC), st>>>(
        tab, pl, xq, xs, d, inter, k, g, u);
}

template <int MT, int NC>
static void moe_down(const moe_table &tab, const moe_plan &pl, int G, const uint8_t *aq, const uint8_t *as, int64_t d,
                     int64_t inter, uint16_t *y, cudaStream_t st) {
    static bool raised = false;
    if (!raised) cudaFuncSetAttribute(moe_down_kernel<MT, NC>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM), raised = true;
    const int64_t X = moe_split((d + NC - 1) / NC, G);
    moe_down_kernel<MT, NC><<<dim3((unsigned)X, (unsigned)G), gv_threads(1, inter), gv_smem(1, MT, inter, NC), st>>>(
        tab, pl, aq, as, d, inter, y);
}

template <int MT>
static void moe_gemvs_mma(const moe_table &tab, const moe_plan &pl, int G, const uint8_t *xq, const uint8_t *xs,
                          int64_t d, int64_t inter, int k, uint16_t *g, uint16_t *u, uint16_t *y, const uint8_t *aq,
                          const uint8_t *as, int down, cudaStream_t st) {
    static bool raised = false;
    if (!raised) {
        cudaFuncSetAttribute(moe_up_mma_kernel<MT, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM);
        cudaFuncSetAttribute(moe_down_mma_kernel<MT, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM);
        raised = true;
    }
    if (!down) {
        const int64_t X = moe_split((inter + 15) / 16, 2 * G);
        moe_up_mma_kernel<MT, 16><<<dim3((unsigned)(2 * X), (unsigned)G), gvm_threads(d), (size_t)gvm_smem(MT, 16, d), st>>>(
            tab, pl, xq, xs, d, inter, k, g, u);
    } else {
        const int64_t X = moe_split((d + 15) / 16, G);
        moe_down_mma_kernel<MT, 16><<<dim3((unsigned)X, (unsigned)G), gvm_threads(inter), (size_t)gvm_smem(MT, 16, inter),
                                      st>>>(tab, pl, aq, as, d, inter, y);
    }
}

/* Column tile of the expert GEMVs (same bits either way): 4 columns for one row per group (T = 1) and
 * for T > 16, 8 for 2 ≤ T ≤ 16 — measured (bench/NOTES-gpu.md). di_cuda_moe_set_variant: 0 = this
 * rule, 1 = always 4, 2 = always 8 (bench). */
static int g_moe_variant = 0;
extern "C" void di_cuda_moe_set_variant(int v) { g_moe_variant = v; }

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
    size_t off[16], bytes = 0;
    const size_t sz[] = {
        al256(4 * (size_t)P), al256(4 * (size_t)P), al256(4 * (size_t)P), al256(4 * (size_t)G), al256(4 * (size_t)G),
        al256(4 * (size_t)G), al256(4),
        al256((size_t)(m * d)), al256((size_t)(m * d / 32)),                       /* x codes, scales */
        al256(2 * (size_t)P * inter), al256(2 * (size_t)P * inter), al256(2 * (size_t)P * inter), /* g, u, a */
        al256((size_t)P * inter), al256((size_t)P * inter / 32),                   /* a codes, scales */
        al256(2 * (size_t)P * d),                                                  /* y */
    };
    const int nsz = (int)(sizeof sz / sizeof sz[0]);
    for (int i = 0; i < nsz; i++) off[i] = bytes, bytes += sz[i];
    void *wsp;
    int rc = di_cuda_workspace(be, bytes, &wsp, err);
    if (rc) return rc;
    uint8_t *b = (uint8_t *)wsp;
    moe_plan pl = {(int32_t *)(b + off[0]), (float *)(b + off[1]),   (int32_t *)(b + off[2]), (int32_t *)(b + off[3]),
                   (int32_t *)(b + off[4]), (int32_t *)(b + off[5]), (int32_t *)(b + off[6])};
    uint8_t *xq = b + off[7], *xs = b + off[8], *aq = b + off[12], *as = b + off[13];
    uint16_t *g = (uint16_t *)(b + off[9]), *u = (uint16_t *)(b + off[10]), *a = (uint16_t *)(b + off[11]);
    uint16_t *y = (uint16_t *)(b + off[14]);

    moe_table tab;
    memset(&tab, 0, sizeof tab);
    /* opt-in tensor-core GEMVs (DI_CUDA_GEMV=mma): K % 128 for both matrices, aligned pointers */
    bool mma_ok = di_cuda_gemv_mma_enabled() && d % 128 == 0 && inter % 128 == 0 &&
                  gvm_smem(4, 16, d > inter ? d : inter) <= MOE_SMEM;
    for (int e = 0; e < n_exp; e++) {
        const di_moe_expert *ex = &experts[e];
        const uint8_t *p[6] = {ex->w1, ex->s1, ex->w3, ex->s3, ex->w2, ex->s2};
        for (int j = 0; j < 6; j++) tab.p[e][j] = p[j];
        for (int j = 0; j < 6; j++) mma_ok &= (uintptr_t)p[j] % (j % 2 ? 2 : 4) == 0; /* 4-byte weight, 2-byte scale loads */
    }
    cudaStream_t st = di_cuda_state(be)->stream;
    moe_plan_kernel<<<1, DI_MOE_ROUTED_MAX_PAIRS, 0, st>>>(tab, ids, weights, P, n_exp, pl);
    if ((rc = di_cuda_launched("moe_routed plan", err))) return rc;
    if ((rc = di_cuda_act_quant_fp8(x, m * d, 32, xq, xs, st, err))) return rc;
    /* rows per group: 1 for a single token (unless it names an expert twice: more passes); a few when
     * tokens share experts */
    const int mt = m == 1 ? 1 : m <= 16 ? 2 : 4;
    const int nc4 = g_moe_variant ? g_moe_variant == 1 : mt != 2;
    if (mma_ok) {
        if (mt == 1) moe_gemvs_mma<1>(tab, pl, G, xq, xs, d, inter, k, g, u, y, aq, as, 0, st);
        else if (mt == 2) moe_gemvs_mma<2>(tab, pl, G, xq, xs, d, inter, k, g, u, y, aq, as, 0, st);
        else moe_gemvs_mma<4>(tab, pl, G, xq, xs, d, inter, k, g, u, y, aq, as, 0, st);
    } else switch (nc4 * 10 + mt) {
    case 1: moe_gemvs<1, 8>(tab, pl, G, xq, xs, d, inter, k, g, u, st); break;
    case 2: moe_gemvs<2, 8>(tab, pl, G, xq, xs, d, inter, k, g, u, st); break;
    case 4: moe_gemvs<4, 8>(tab, pl, G, xq, xs, d, inter, k, g, u, st); break;
    case 11: moe_gemvs<1, 4>(tab, pl, G, xq, xs, d, inter, k, g, u, st); break;
    case 12: moe_gemvs<2, 4>(tab, pl, G, xq, xs, d, inter, k, g, u, st); break;
    default: moe_gemvs<4, 4>(tab, pl, G, xq, xs, d, inter, k, g, u, st); break;
    }
    if ((rc = di_cuda_launched("moe_routed up", err))) return rc;
    if ((rc = di_cuda_swiglu(be, g, u, P, inter, pl.rw, lim, a, err))) return rc;
    if ((rc = di_cuda_act_quant_fp8(a, (int64_t)P * inter, 32, aq, as, st, err))) return rc;
    if (mma_ok) {
        if (mt == 1) moe_gemvs_mma<1>(tab, pl, G, xq, xs, d, inter, k, g, u, y, aq, as, 1, st);
        else if (mt == 2) moe_gemvs_mma<2>(tab, pl, G, xq, xs, d, inter, k, g, u, y, aq, as, 1, st);
        else moe_gemvs_mma<4>(tab, pl, G, xq, xs, d, inter, k, g, u, y, aq, as, 1, st);
    } else switch (nc4 * 10 + mt) {
    case 1: moe_down<1, 8>(tab, pl, G, aq, as, d, inter, y, st); break;
    case 2: moe_down<2, 8>(tab, pl, G, aq, as, d, inter, y, st); break;
    case 4: moe_down<4, 8>(tab, pl, G, aq, as, d, inter, y, st); break;
    case 11: moe_down<1, 4>(tab, pl, G, aq, as, d, inter, y, st); break;
    case 12: moe_down<2, 4>(tab, pl, G, aq, as, d, inter, y, st); break;
    default: moe_down<4, 4>(tab, pl, G, aq, as, d, inter, y, st); break;
    }
    if ((rc = di_cuda_launched("moe_routed down", err))) return rc;
    moe_combine_kernel<<<dim3(di_cuda_blocks(d, 256), (unsigned)m), 256, 0, st>>>(pl.rank, y, d, k, acc);
    return di_cuda_launched("moe_routed combine", err);
}
