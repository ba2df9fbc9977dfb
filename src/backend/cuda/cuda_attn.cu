/* Sparse single-KV-head attention with the attention sink on the GPU (spec §3.4, §4.1, §5.3): decode and
 * prefill alike (one query row per token), over [kv_win ‖ kv_cmp] at each query's index list, with the
 * reference kernel's online softmax in blocks of 64 indices, bf16-rounded probabilities before PV and a
 * running max that starts at −1e30 (sparse_attn.c).
 *
 * One thread block per (query, head), 512 threads. Per 64-index step:
 *  - scores: 8 threads per index, thread l accumulating channels ≡ l (mod 8) in ascending order, then
 *    ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) through shuffles — the CPU's dot_f32_bf16 order exactly;
 *  - max, exps and the probability sum (8 strided lanes, sum_f32's order) on a few threads;
 *  - PV: one thread per channel adds p_k·c_k[d] over k ascending, as axpy_bf16 does per channel.
 * That per-head kernel re-reads each key row from L2 for every head and spends most of its time in its
 * barriers and serial sections; the default kernel (cuda_sparse_attn.cuh, d_sparse_attn_heads) gives a
 * block 16 (or, for few queries, 4) heads of one query, stages each step's rows in shared memory once
 * for all of them, and keeps every operation of each (query, head) and its order, so the same bits.
 * DI_CUDA_SATTN=old selects the per-head kernel (and shapes other than head dim 512 always take it). Up
 * to 8 queries the slots take d_sparse_attn_staged first (one (query, head) per block, the rows copied to
 * shared memory two steps ahead; DI_CUDA_SATTN_STAGED=0 turns it off).
 * The sparse_attn slot flags its key rows first (di_cuda_bf16_fma_flags, n_win + n_cmp bytes of the
 * workspace) so that d_sparse_attn_heads takes one FFMA per term where that is exact;
 * DI_CUDA_SATTN_FMA=0 turns that off (the same bits, the multiply-then-add forms everywhere). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemm_bf16.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_sparse_attn.cuh"

__global__ void __launch_bounds__(SA_THREADS) sparse_attn_kernel(const uint16_t *q, int nh, int d,
                                                                 const uint16_t *kv_win, int64_t n_win,
                                                                 const uint16_t *kv_cmp, int64_t n_cmp,
                                                                 const float *sink, const int32_t *idx, int64_t n_idx,
                                                                 float scale, uint16_t *out) {
    const int64_t qi = blockIdx.x / nh;
    const int h = blockIdx.x % nh;
    d_sparse_attn_query(q, qi * nh + h, h, d, kv_win, n_win, kv_cmp, n_cmp, sink, idx + qi * n_idx, n_idx, scale, out);
}

/* Block (qi, head group): heads H·(blockIdx.x mod nh/H) … of query blockIdx.x / (nh/H). Two blocks per SM
 * (shared memory allows two of 16 heads): one stages its rows while the other computes. */
template <int H>
__global__ void __launch_bounds__(SAH_T(H), 2)
    sparse_attn_heads_kernel(const uint16_t *q, int nh, const uint16_t *kv_win, int64_t n_win, const uint16_t *kv_cmp,
                             int64_t n_cmp, const float *sink, const int32_t *idx, int64_t n_idx, float scale,
                             uint16_t *out, const uint8_t *kv_ok) {
    const int groups = nh / H;
    const int64_t qi = blockIdx.x / groups;
    const int h0 = (int)(blockIdx.x % groups) * H;
    d_sparse_attn_heads<H>(q, qi, nh, h0, kv_win, n_win, kv_cmp, n_cmp, sink, idx + qi * n_idx, n_idx, scale, out,
                           kv_ok);
}

/* Block (qi, head): d_sparse_attn_staged (few queries: sas_wanted). */
__global__ void __launch_bounds__(SA_THREADS, 1)
    sparse_attn_staged_kernel(const uint16_t *q, int nh, const uint16_t *kv_win, int64_t n_win, const uint16_t *kv_cmp,
                              int64_t n_cmp, const float *sink, const int32_t *idx, int64_t n_idx, float scale,
                              uint16_t *out, int parts) {
    const int64_t qh = blockIdx.x / parts, qi = qh / nh;
    const int h = (int)(qh % nh);
    d_sparse_attn_staged(q, qh, h, kv_win, n_win, kv_cmp, n_cmp, sink, idx + qi * n_idx, n_idx, scale, out,
                         (int)(blockIdx.x % parts), parts);
}

static int g_sas_on = -1;     /* −1: DI_CUDA_SATTN_STAGED not read yet */
static int g_sas_forced = -1; /* di_cuda_sattn_staged_set */
static int g_sas_parts = 0;   /* di_cuda_sattn_staged_set_parts */
extern "C" int di_cuda_sattn_staged_enabled(void) { return di_cuda_env_switch(&g_sas_on, "DI_CUDA_SATTN_STAGED", "0"); }
extern "C" void di_cuda_sattn_staged_set(int mode) { g_sas_forced = mode < 0 ? -1 : mode ? 1 : 0; }
extern "C" int di_cuda_sattn_staged_forced(void) { return g_sas_forced; }
extern "C" void di_cuda_sattn_staged_set_parts(int parts) { g_sas_parts = parts == 1 || parts == 2 ? parts : 0; }
/* Blocks per (query, head) of the staged kernel: 2 (each the PV of half the channels) while that still
 * fits one wave on the SMs (one query of 64 heads on the H200's 132) and the lists are longer than two
 * steps (n_idx < 0: not known on the host), else 1. H200, 2026-12-02, one query of 64 heads: 640 indices
 * 0.0312 ms with 2 blocks / 0.0338 with 1; 128 indices 0.0130 / 0.0114. */
extern "C" int di_cuda_sattn_staged_parts(int64_t m, int nh, int64_t n_idx) {
    if (g_sas_parts) return g_sas_parts;
    return m * nh * 2 <= di_cuda_sm_count() && (n_idx < 0 || n_idx > 2 * SA_BLOCK) ? 2 : 1;
}

static int g_sah_on = -1; /* −1: DI_CUDA_SATTN not read yet */
extern "C" int di_cuda_sattn_heads_enabled(void) { return di_cuda_env_switch(&g_sah_on, "DI_CUDA_SATTN", "old"); }
extern "C" void di_cuda_sattn_heads_set(int on) { g_sah_on = on ? 1 : 0; }
static int g_sah_fma = -1; /* −1: DI_CUDA_SATTN_FMA not read yet */
extern "C" int di_cuda_sattn_fma_enabled(void) { return di_cuda_env_switch(&g_sah_fma, "DI_CUDA_SATTN_FMA", "0"); }

template <int H>
static int sparse_attn_heads(const di_backend *be, const uint16_t *q, int64_t m, int nh, const uint16_t *kv_win,
                             int64_t n_win, const uint16_t *kv_cmp, int64_t n_cmp, const float *sink, const int32_t *idx,
                             int64_t n_idx, float scale, uint16_t *out, di_error *err) {
    static bool optin[64];
    int rc = sah_smem_optin(sparse_attn_heads_kernel<H>, SAH_SMEM(H), optin, di_cuda_state(be)->device, "sparse_attn", err);
    if (rc) return rc;
    uint8_t *kv_ok = NULL; /* the key rows' FMA flags: window rows, then compressed rows */
    if (di_cuda_sattn_fma_enabled() && n_win + n_cmp > 0) {
        void *wsp;
        if ((rc = di_cuda_workspace(be, (size_t)(n_win + n_cmp), &wsp, err))) return rc;
        kv_ok = (uint8_t *)wsp;
        if ((rc = di_cuda_bf16_fma_flags(be, kv_win, n_win, SAH_DIM, SAH_DIM, kv_ok, err))) return rc;
        if ((rc = di_cuda_bf16_fma_flags(be, kv_cmp, n_cmp, SAH_DIM, SAH_DIM, kv_ok + n_win, err))) return rc;
    }
    const unsigned blocks = (unsigned)(m * (nh / H));
    sparse_attn_heads_kernel<H><<<blocks, SAH_T(H), SAH_SMEM(H), di_cuda_state(be)->stream>>>(
        q, nh, kv_win, n_win, kv_cmp, n_cmp, sink, idx, n_idx, scale, out, kv_ok);
    return di_cuda_launched("sparse_attn", err);
}

extern "C" int di_cuda_sparse_attn(const di_backend *be, const uint16_t *q, int64_t m, int nh, int d,
                                   const uint16_t *kv_win, int64_t n_win, const uint16_t *kv_cmp, int64_t n_cmp,
                                   const float *sink, const int32_t *idx, int64_t n_idx, float scale, uint16_t *out,
                                   di_error *err) {
    if (m < 0 || nh < 1 || d < 1 || d > SA_MAX_DIM || n_win < 0 || n_cmp < 0 || n_idx < 0 || (n_cmp > 0 && !kv_cmp))
        return di_error_set(err, DI_ERR_INVALID,
                            "cuda sparse_attn: n_q %lld, n_heads %d, dim %d (max %d), n_win %lld, n_cmp %lld, n_idx %lld",
                            (long long)m, nh, d, SA_MAX_DIM, (long long)n_win, (long long)n_cmp, (long long)n_idx);
    if (m == 0) return DI_OK;
    if (sas_wanted(m, nh, d)) {
        static bool optin[64];
        int rc = sah_smem_optin(sparse_attn_staged_kernel, SAS_SMEM, optin, di_cuda_state(be)->device, "sparse_attn", err);
        if (rc) return rc;
        const int parts = di_cuda_sattn_staged_parts(m, nh, n_idx);
        sparse_attn_staged_kernel<<<(unsigned)(m * nh * parts), SA_THREADS, SAS_SMEM, di_cuda_state(be)->stream>>>(
            q, nh, kv_win, n_win, kv_cmp, n_cmp, sink, idx, n_idx, scale, out, parts);
        return di_cuda_launched("sparse_attn", err);
    }
    switch (sah_heads(m, nh, d)) {
    case 16: return sparse_attn_heads<16>(be, q, m, nh, kv_win, n_win, kv_cmp, n_cmp, sink, idx, n_idx, scale, out, err);
    case 4: return sparse_attn_heads<4>(be, q, m, nh, kv_win, n_win, kv_cmp, n_cmp, sink, idx, n_idx, scale, out, err);
    default: break;
    }
    sparse_attn_kernel<<<(unsigned)(m * nh), SA_THREADS, 0, di_cuda_state(be)->stream>>>(
        q, nh, d, kv_win, n_win, kv_cmp, n_cmp, sink, idx, n_idx, scale, out);
    return di_cuda_launched("sparse_attn", err);
}
