/* Index scoring and the exact selections on the GPU (spec §4.4, §5.1, §5.3, §5.6): lightning-indexer
 * scores with the reference's bf16 rounding points (indexer.c), the two-level candidate mask and the
 * top-k (topk.c), both with the GPU tie rule "higher score first, then lower position".
 *
 * Selection = the CPU's radix select, block-parallel: four 8-bit histogram passes over the order-
 * preserving keys find the k-th largest key T and how many entries equal to T still fit; an ascending
 * block scan then emits every key > T and the first (lowest-position) entries equal to T. The outputs
 * are the same sets, in the same ascending order, as di_cpu_topk / di_cpu_candidate_mask. */
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_select.cuh"

/* ---------------- indexer scores ---------------- */

/* grid (ceil(nk/128), m): one query row's tile of keys per block (d_index_tile, cuda_select.cuh). */
__global__ void __launch_bounds__(IDX_KEYS) indexer_kernel(const uint16_t *q, const uint16_t *w, float w_scale,
                                                           const uint16_t *k, int nh, int hd, int64_t nk,
                                                           const int32_t *vis, const uint8_t *cand, float *scores) {
    extern __shared__ float ish[]; /* d_index_tile_shm(nh, hd) bytes */
    const int64_t i = blockIdx.y;
    d_index_tile(q + i * nh * hd, w + i * nh, w_scale, k, nh, hd, nk, vis[i], cand ? cand + i * nk : NULL, scores + i * nk,
                 (int64_t)blockIdx.x * IDX_KEYS, ish);
}

extern "C" int di_cuda_indexer_scores(const di_backend *be, const uint16_t *q, const uint16_t *w, float w_scale,
                                      const uint16_t *k, int64_t m, int nh, int hd, int64_t nk, const int32_t *vis,
                                      const uint8_t *cand, float *scores, di_error *err) {
    size_t shm = d_index_tile_shm(nh, hd);
    if (m < 0 || nk < 0 || nh < 1 || hd < 2 || hd % 2 || shm > 200 * 1024)
        return di_error_set(err, DI_ERR_INVALID, "cuda indexer_scores: %lld queries, %lld keys, %d heads × %d (even, ≤ 200 KiB staged)",
                            (long long)m, (long long)nk, nh, hd);
    if (m == 0 || nk == 0) return DI_OK;
    cudaFuncSetAttribute(indexer_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
    dim3 grid(di_cuda_blocks(nk, IDX_KEYS), (unsigned)m);
    indexer_kernel<<<grid, IDX_KEYS, shm, di_cuda_state(be)->stream>>>(q, w, w_scale, k, nh, hd, nk, vis, cand, scores);
    return di_cuda_launched("indexer_scores", err);
}

/* ---------------- block-parallel exact selection (cuda_select.cuh) ---------------- */

/* One block per query row: the top-k of its vis[i] visible scores, positions ascending + offset, −1 pad. */
__global__ void __launch_bounds__(SEL_THREADS) topk_kernel(const float *scores, int64_t nk, const int32_t *vis, int k,
                                                           int32_t offset, int32_t *out) {
    const int64_t i = blockIdx.x;
    d_topk_row(scores + i * nk, nk, vis[i], k, offset, out + i * k, k);
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

/* One block per query row (d_candidate_row).  blk f32 [m, n_blocks] device scratch. */
__global__ void __launch_bounds__(SEL_THREADS) candidate_kernel(const float *scores, int64_t nk, const int32_t *vis,
                                                                int block, int64_t kb, float *blk_all, uint8_t *mask) {
    const int64_t i = blockIdx.x, nb = (nk + block - 1) / block;
    d_candidate_row(scores + i * nk, nk, vis[i], block, kb, blk_all + i * nb, mask + i * nk);
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
