/* Top-k and candidate blocks with the reference's own tie behaviour on the GPU: the replay of torch's CPU
 * selection (libstdc++ introselect / heap select with the comparator "x > y, NaN first") of
 * src/backend/cpu/graph_extra_topk.c, one CTA per row, with the same result step for step. Equal scores
 * are common (the indexer's exact zeros, bf16 near-ties), and which of them the reference keeps is
 * decided only by that sequence of comparisons and swaps, so replaying it is the one way for the GPU to
 * select the CPU backend's (and the reference's) set on every row: the golden cases then verify with the
 * CPU's bounds and greedy decoding gives the CPU's tokens.
 *
 * Cost (cuda_select.cuh): the introselect's long partitions run on the whole CTA (each one's result
 * derived from prefix counts), the median-of-three steps, short ranges and the heap path on one thread.
 * The top-k avoids the replay where it cannot matter: rows whose output the ties cannot
 * change (d_topk_torch_cut) take the parallel rule's result, written by the same pass that finds them,
 * and only the others are replayed. The candidate mask replays every row (one layer per pass, a few thousand
 * blocks per row). The parallel kernels of cuda_select.cu alone (higher score, then lower position: a
 * documented divergence on ties) remain available with DI_CUDA_TOPK=fast (backend_cuda.cu). */
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_select.cuh" /* the replay itself, per row */

static bool g_sel_smem_raised = false;

/* rows r0 … r0+nr−1 (only those flagged in `only`, when given); q: [nr, d_replay_elems(nk)] scratch (mode
 * 0). grid: nr.
 * mode (d_topk_replay_mode) 0: replay in q; 1: the row in shared memory; 2: heap in shared memory, row
 * streamed. */
__global__ void __launch_bounds__(REPLAY_THREADS) topk_torch_kernel(const float *scores, int64_t r0, int64_t nr,
                                                                    int64_t nk, const int32_t *vis, int k,
                                                                    int32_t offset, const uint8_t *only, telem *q,
                                                                    int mode, int32_t *out) {
    extern __shared__ telem sel_sm[];
    const int64_t rr = blockIdx.x, r = r0 + rr;
    if (only && !only[r]) return;
    d_topk_torch_row(scores + r * nk, nk, vis[r], k, offset, q + rr * d_replay_elems(nk), mode, sel_sm, out + r * k);
}

/* grid: nr; q: [nr, d_replay_elems(nb)] scratch; in_smem: the block entries (and the partition scratch) in
 * shared memory */
__global__ void __launch_bounds__(REPLAY_THREADS) cand_torch_kernel(const float *scores, int64_t r0, int64_t nr,
                                                                    int64_t nk, const int32_t *vis, int block,
                                                                    int64_t nb, int64_t keep, telem *q, int in_smem,
                                                                    uint8_t *mask) {
    extern __shared__ telem sel_sm[];
    const int64_t rr = blockIdx.x, r = r0 + rr;
    d_cand_torch_row(scores + r * nk, nk, vis[r], block, nb, keep, in_smem ? sel_sm : q + rr * d_replay_elems(nb),
                     mask + r * nk);
}

static void sel_raise_smem(void) {
    heap_pipe_configure();
    if (g_sel_smem_raised) return;
    cudaFuncSetAttribute(topk_torch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, REPLAY_SMEM_MAX);
    cudaFuncSetAttribute(cand_torch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, REPLAY_SMEM_MAX);
    g_sel_smem_raised = true;
}

/* The CL CTAs of a row (one CTA, or a cluster): the row's top-k where the replay cannot change the parallel
 * rule's result (d_topk_torch_cut: Q, the parallel kernel's output there), else its flag for the replay. */
template <int CL> static __device__ void topk_cut(const float *scores, int64_t nk, const int32_t *vis, int k,
                                                 int32_t offset, uint8_t *replay, int32_t *out) {
    const int64_t r = blockIdx.x / CL;
    bool again = d_topk_torch_cut<CL>(scores + r * nk, nk, vis[r], k, offset, out + r * k, k);
    if (threadIdx.x == 0 && blockIdx.x % CL == 0) replay[r] = again;
}
__global__ void __launch_bounds__(CUT_THREADS) topk_cut_kernel(const float *scores, int64_t nk, const int32_t *vis,
                                                                int k, int32_t offset, uint8_t *replay, int32_t *out) {
    topk_cut<1>(scores, nk, vis, k, offset, replay, out);
}
__global__ void __cluster_dims__(CUT_CLUSTER, 1, 1) __launch_bounds__(CUT_THREADS)
    topk_cut_cluster_kernel(const float *scores, int64_t nk, const int32_t *vis, int k, int32_t offset,
                            uint8_t *replay, int32_t *out) {
    topk_cut<CUT_CLUSTER>(scores, nk, vis, k, offset, replay, out);
}

extern "C" int di_cuda_topk_torch(const di_backend *be, const float *scores, int64_t m, int64_t nk, const int32_t *vis,
                                  int k, int32_t offset, int32_t *out, di_error *err) {
    if (m < 0 || nk < 0 || k < 0 || k > nk || nk > INT32_MAX)
        return di_error_set(err, DI_ERR_INVALID, "cuda topk: %lld rows, k = %d of %lld entries", (long long)m, k,
                            (long long)nk);
    if (m == 0 || k == 0) return DI_OK;
    /* rows with a unique, finite, visible top-k set: the parallel kernel gives the replay's answer */
    bool hybrid = offset >= 0;
    int rc;
    int64_t flags = hybrid ? (m + 255) / 256 * 256 : 0; /* uint8 [m] rows to replay, then the scratch */
    int64_t per = (int64_t)sizeof(telem) * d_replay_elems(nk), rows = d_rows_per_launch(m, per);
    void *ws;
    if ((rc = di_cuda_workspace(be, (size_t)(flags + rows * per), &ws, err))) return rc;
    uint8_t *only = hybrid ? (uint8_t *)ws : NULL;
    telem *q = (telem *)((uint8_t *)ws + flags);
    cudaStream_t st = di_cuda_state(be)->stream;
    if (hybrid) {
        if (d_cut_cluster(m, nk))
            topk_cut_cluster_kernel<<<(unsigned)(m * CUT_CLUSTER), CUT_THREADS, 0, st>>>(scores, nk, vis, k, offset,
                                                                                       only, out);
        else
            topk_cut_kernel<<<(unsigned)m, CUT_THREADS, 0, st>>>(scores, nk, vis, k, offset, only, out);
        if ((rc = di_cuda_launched("topk (cut)", err))) return rc;
    }
    sel_raise_smem();
    size_t smem;
    const int mode = d_topk_replay_mode(nk, k, &smem);
    for (int64_t r0 = 0; r0 < m; r0 += rows) {
        int64_t nr = m - r0 < rows ? m - r0 : rows;
        topk_torch_kernel<<<(unsigned)nr, REPLAY_THREADS, smem, st>>>(scores, r0, nr, nk, vis, k, offset, only, q, mode,
                                                                   out);
        if ((rc = di_cuda_launched("topk (torch replay)", err))) return rc;
    }
    return DI_OK;
}

extern "C" int di_cuda_candidate_mask_torch(const di_backend *be, const float *scores, int64_t m, int64_t nk,
                                            const int32_t *vis, int block, int topk_blocks, uint8_t *mask, float *ws,
                                            di_error *err) {
    (void)ws; /* per-row scratch comes from the backend workspace */
    if (m < 0 || nk < 0 || block < 1 || topk_blocks < 1)
        return di_error_set(err, DI_ERR_INVALID, "cuda candidate_mask: %lld rows, %lld entries, block %d, top %d blocks",
                            (long long)m, (long long)nk, block, topk_blocks);
    int64_t nb = (nk + block - 1) / block, keep = topk_blocks < nb ? topk_blocks : nb;
    if (m == 0 || nb == 0) return DI_OK;
    int64_t per = (int64_t)sizeof(telem) * d_replay_elems(nb), rows = d_rows_per_launch(m, per);
    void *q;
    int rc = di_cuda_workspace(be, (size_t)(rows * per), &q, err);
    if (rc) return rc;
    cudaStream_t st = di_cuda_state(be)->stream;
    sel_raise_smem();
    const size_t row_b = sizeof(telem) * (size_t)d_replay_elems(nb);
    const int in_smem = row_b <= REPLAY_SMEM_MAX;
    for (int64_t r0 = 0; r0 < m; r0 += rows) {
        int64_t nr = m - r0 < rows ? m - r0 : rows;
        cand_torch_kernel<<<(unsigned)nr, REPLAY_THREADS, in_smem ? row_b : 0, st>>>(scores, r0, nr, nk, vis, block, nb, keep,
                                                                                   (telem *)q, in_smem, mask);
        if ((rc = di_cuda_launched("candidate_mask (torch replay)", err))) return rc;
    }
    return DI_OK;
}
