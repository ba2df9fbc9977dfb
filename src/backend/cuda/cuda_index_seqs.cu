/* The batched index selection on the GPU (backend.h "batched index selection"): the index scores,
 * candidate masks and top-k lists of every row of a pass, and the gathers of every sequence's selected
 * entries, in one launch each (a few for the torch replay) instead of one per sequence and one per row
 * narrower than its sequence. A decode step of B sequences otherwise launches each op B times, each
 * launch a handful of blocks: the per-launch latency, not the work, was the cost (bench/NOTES-gpu.md).
 *
 * Exactness: every row runs the per-row device code of the per-sequence kernels (cuda_select.cuh) with
 * the row's own key set, width, visible count and k, so its output is the per-sequence op's on that row
 * alone, bit for bit, by construction. The torch replay stays per row and per width: the one-pass cut
 * for every row (its threshold, the tie check, and the output of the rows the ties cannot change), the
 * replay of the rows it flags; the candidate mask replays every row. tests/cuda/test_cuda_index_seqs.c checks both selection rules against the
 * per-sequence loop. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_fused.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_select.cuh"

#define ROWS_PER_GRID 65535 /* grid.y limit: the scorer launches rows in slices of this many */

/* ---------------- indexer scores ---------------- */

/* grid (ceil(nk_max / 128), rows of the slice): row r0 + blockIdx.y's tile blockIdx.x of its own nk,
 * its keys staged in shared memory (any even hd). */
__global__ void __launch_bounds__(IDX_KEYS) indexer_rows_kernel(const uint16_t *q, const uint16_t *w, float w_scale,
                                                                int nh, int hd, const di_index_row *rows, int64_t r0,
                                                                float *scores) {
    extern __shared__ float ish[]; /* d_index_tile_shm(nh, hd) bytes */
    const int64_t i = r0 + blockIdx.y, n0 = (int64_t)blockIdx.x * IDX_KEYS;
    const di_index_row r = rows[i];
    if (n0 >= r.nk) return; /* the whole block: a narrower row */
    d_index_stage(q + i * nh * hd, w + i * nh, w_scale, r.keys, &r, nh, hd, r.nk, n0, ish);
    __syncthreads();
    d_index_tile_scores(nh, hd, r.nk, r.vis, r.cand, scores + r.s0, n0, ish);
}

/* The same grid with each thread's key in registers (hd = HD): d_index_reg_shm(nh, HD) bytes. */
template <int HD>
__global__ void __launch_bounds__(IDX_KEYS) indexer_rows_reg_kernel(const uint16_t *q, const uint16_t *w,
                                                                    float w_scale, int nh, const di_index_row *rows,
                                                                    int64_t r0, float *scores) {
    extern __shared__ float ish[]; /* q f32 [nh, HD] ‖ w' f32 [nh] */
    const int64_t i = r0 + blockIdx.y, n0 = (int64_t)blockIdx.x * IDX_KEYS;
    const di_index_row r = rows[i];
    if (n0 >= r.nk) return;
    float *qs = ish, *wsc = ish + nh * HD;
    const uint16_t *qi = q + i * nh * HD, *wi = w + i * nh;
    for (int e = threadIdx.x; e < nh * HD; e += blockDim.x) qs[e] = d_bf16(qi[e]);
    for (int h = threadIdx.x; h < nh; h += blockDim.x) wsc[h] = d_round_bf16(__fmul_rn(d_bf16(wi[h]), w_scale));
    __syncthreads();
    const int64_t n = n0 + threadIdx.x;
    if (n >= r.nk) return;
    float *out = scores + r.s0 + n;
    if (n >= r.vis || (r.cand && !r.cand[n])) {
        *out = -INFINITY;
        return;
    }
    float kf[HD];
    d_key_regs<HD>(r, n, kf);
    *out = d_score_regs<HD>(qs, wsc, nh, kf);
}

/* DI_CUDA_INDEX_REG=off keeps every hd on the shared-memory tile (A/B runs; same bits). */
static bool index_reg_on(void) {
    static int on = -1;
    return di_cuda_env_switch(&on, "DI_CUDA_INDEX_REG", "off");
}

template <int HD>
static void launch_reg(dim3 grid, size_t shm, cudaStream_t st, const uint16_t *q, const uint16_t *w, float w_scale,
                       int nh, const di_index_row *rows, int64_t r0, float *scores) {
    cudaFuncSetAttribute(indexer_rows_reg_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
    indexer_rows_reg_kernel<HD><<<grid, IDX_KEYS, shm, st>>>(q, w, w_scale, nh, rows, r0, scores);
}

static int indexer_scores_rows(const di_backend *be, const uint16_t *q, const uint16_t *w, float w_scale, int64_t m,
                               int nh, int hd, const di_index_row *rows, int64_t nk_max, float *scores, di_error *err) {
    const bool reg = index_reg_on() && (hd == 32 || hd == 64 || hd == 96 || hd == 128);
    size_t shm = reg ? d_index_reg_shm(nh, hd) : d_index_tile_shm(nh, hd);
    if (m < 0 || nk_max < 0 || nh < 1 || hd < 2 || hd % 2 || shm > 200 * 1024)
        return di_error_set(err, DI_ERR_INVALID,
                            "cuda indexer_scores_rows: %lld rows, %lld keys at most, %d heads × %d (even, "
                            "≤ 200 KiB staged)",
                            (long long)m, (long long)nk_max, nh, hd);
    if (m == 0 || nk_max == 0) return DI_OK;
    if (!reg) cudaFuncSetAttribute(indexer_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
    cudaStream_t st = di_cuda_state(be)->stream;
    for (int64_t r0 = 0; r0 < m; r0 += ROWS_PER_GRID) {
        dim3 grid(di_cuda_blocks(nk_max, IDX_KEYS), (unsigned)(m - r0 < ROWS_PER_GRID ? m - r0 : ROWS_PER_GRID));
        if (!reg) indexer_rows_kernel<<<grid, IDX_KEYS, shm, st>>>(q, w, w_scale, nh, hd, rows, r0, scores);
        else if (hd == 128) launch_reg<128>(grid, shm, st, q, w, w_scale, nh, rows, r0, scores);
        else if (hd == 96) launch_reg<96>(grid, shm, st, q, w, w_scale, nh, rows, r0, scores);
        else if (hd == 64) launch_reg<64>(grid, shm, st, q, w, w_scale, nh, rows, r0, scores);
        else launch_reg<32>(grid, shm, st, q, w, w_scale, nh, rows, r0, scores);
        int rc = di_cuda_launched("indexer_scores_rows", err);
        if (rc) return rc;
    }
    return DI_OK;
}

/* ---------------- top-k: parallel rule (DI_CUDA_TOPK=fast) and the parallel pass of the replay ---------------- */

/* One block per row: di_cuda_topk's row over its width w, −1 padded to kp. */
__global__ void __launch_bounds__(SEL_THREADS) topk_rows_kernel(const float *scores, const di_index_row *rows,
                                                                int32_t *out) {
    const di_index_row r = rows[blockIdx.x];
    d_topk_row(scores + r.s0, r.w, r.vis, r.k, 0, out + r.o0, r.kp);
}

static int check_rows(const char *op, int64_t m, int64_t w_max, di_error *err) {
    if (m < 0 || w_max < 0 || w_max > INT32_MAX || m > INT32_MAX)
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: %lld rows, width %lld at most", op, (long long)m,
                            (long long)w_max);
    return DI_OK;
}

static int topk_rows_fast(const di_backend *be, const float *scores, int64_t m, const di_index_row *rows, int64_t w_max,
                          int32_t *out, di_error *err) {
    int rc = check_rows("topk_rows", m, w_max, err);
    if (rc || m == 0) return rc;
    topk_rows_kernel<<<(unsigned)m, SEL_THREADS, 0, di_cuda_state(be)->stream>>>(scores, rows, out);
    return di_cuda_launched("topk_rows", err);
}

/* ---------------- top-k: torch's tie order (default) ---------------- */

/* The CL CTAs of a row (one CTA, or a cluster): the row's torch-order top-k where the replay cannot change
 * the parallel rule's result (d_topk_torch_cut), else its flag for the replay (and the −1 padding past k). */
template <int CL> static __device__ void topk_rows_cut(const float *scores, const di_index_row *rows, uint8_t *replay,
                                                      int32_t *out) {
    const unsigned row = blockIdx.x / CL;
    const di_index_row r = rows[row];
    bool again = false;
    if (r.k > 0) {
        again = d_topk_torch_cut<CL>(scores + r.s0, r.w, r.vis, r.k, 0, out + r.o0, r.kp);
    } else if (blockIdx.x % CL == 0) {
        for (int j = threadIdx.x; j < r.kp; j += blockDim.x) out[r.o0 + j] = -1;
    }
    if (threadIdx.x == 0 && blockIdx.x % CL == 0) replay[row] = again;
}
__global__ void __launch_bounds__(CUT_THREADS) topk_rows_cut_kernel(const float *scores, const di_index_row *rows,
                                                                     uint8_t *replay, int32_t *out) {
    topk_rows_cut<1>(scores, rows, replay, out);
}
__global__ void __cluster_dims__(CUT_CLUSTER, 1, 1) __launch_bounds__(CUT_THREADS)
    topk_rows_cut_cluster_kernel(const float *scores, const di_index_row *rows, uint8_t *replay, int32_t *out) {
    topk_rows_cut<CUT_CLUSTER>(scores, rows, replay, out);
}

/* One CTA per row of rows [r0, r0 + nr) flagged for the replay, in its own mode (d_topk_replay_mode of its
 * width and k, as di_cuda_topk_torch picks it for that row alone); q telem [nr, d_replay_elems(w_max)] global
 * scratch. */
__global__ void __launch_bounds__(REPLAY_THREADS) topk_rows_torch_kernel(const float *scores, const di_index_row *rows,
                                                                         int64_t r0, int64_t w_max, const uint8_t *only,
                                                                         telem *q, int32_t *out) {
    extern __shared__ telem sel_sm[];
    const int64_t rr = blockIdx.x;
    if (!only[r0 + rr]) return;
    const di_index_row r = rows[r0 + rr];
    size_t need;
    const int mode = d_topk_replay_mode(r.w, r.k, &need);
    d_topk_torch_row(scores + r.s0, r.w, r.vis, r.k, 0, q + rr * d_replay_elems(w_max), mode, sel_sm, out + r.o0);
}

/* The replay kernels take up to REPLAY_SMEM_MAX of dynamic shared memory (set once). */
static void raise_smem(void);

static int topk_rows_torch(const di_backend *be, const float *scores, int64_t m, const di_index_row *rows,
                           int64_t w_max, int32_t *out, di_error *err) {
    int rc = check_rows("topk_rows", m, w_max, err);
    if (rc || m == 0) return rc;
    int64_t flags = (m + 255) / 256 * 256; /* uint8 [m] rows to replay, then the scratch */
    int64_t per = (int64_t)sizeof(telem) * d_replay_elems(w_max > 0 ? w_max : 1), n = d_rows_per_launch(m, per);
    void *ws;
    if ((rc = di_cuda_workspace(be, (size_t)(flags + n * per), &ws, err))) return rc;
    uint8_t *only = (uint8_t *)ws;
    telem *q = (telem *)((uint8_t *)ws + flags);
    cudaStream_t st = di_cuda_state(be)->stream;
    if (d_cut_cluster(m, w_max)) /* every row, −1 padded */
        topk_rows_cut_cluster_kernel<<<(unsigned)m * CUT_CLUSTER, CUT_THREADS, 0, st>>>(scores, rows, only, out);
    else
        topk_rows_cut_kernel<<<(unsigned)m, CUT_THREADS, 0, st>>>(scores, rows, only, out);
    if ((rc = di_cuda_launched("topk_rows (cut)", err))) return rc;
    raise_smem();
    /* every row's mode fits: a row in shared memory needs ≤ its width's bytes, the others ≤ the maximum */
    const size_t row_b = sizeof(telem) * (size_t)d_replay_elems(w_max), smem = row_b < REPLAY_SMEM_MAX ? row_b : REPLAY_SMEM_MAX;
    for (int64_t r0 = 0; r0 < m; r0 += n) {
        int64_t nr = m - r0 < n ? m - r0 : n;
        topk_rows_torch_kernel<<<(unsigned)nr, REPLAY_THREADS, smem, st>>>(scores, rows, r0, w_max, only, q, out);
        if ((rc = di_cuda_launched("topk_rows (torch replay)", err))) return rc;
    }
    return DI_OK;
}

/* ---------------- candidate mask ---------------- */

/* One block per row: di_cuda_candidate_mask's row over its width w.  blk f32 [m, nb_max] scratch. */
__global__ void __launch_bounds__(SEL_THREADS) candidate_rows_kernel(const float *scores, const di_index_row *rows,
                                                                     int block, int topk_blocks, int64_t nb_max,
                                                                     float *blk, uint8_t *mask) {
    const di_index_row r = rows[blockIdx.x];
    const int64_t nb = ((int64_t)r.w + block - 1) / block, kb = topk_blocks < nb ? topk_blocks : nb;
    if (nb == 0) return; /* the per-sequence op writes nothing for a row of width 0 */
    d_candidate_row(scores + r.s0, r.w, r.vis, block, kb, blk + blockIdx.x * nb_max, mask + r.s0);
}

static int candidate_mask_rows_fast(const di_backend *be, const float *scores, int64_t m, const di_index_row *rows,
                                    int64_t w_max, int block, int topk_blocks, uint8_t *mask, di_error *err) {
    int rc = check_rows("candidate_mask_rows", m, w_max, err);
    if (!rc && (block < 1 || topk_blocks < 0))
        rc = di_error_set(err, DI_ERR_INVALID, "cuda candidate_mask_rows: block %d, top %d blocks", block, topk_blocks);
    int64_t nb_max = (w_max + block - 1) / (block > 0 ? block : 1);
    if (rc || m == 0 || nb_max == 0) return rc;
    void *blk;
    if ((rc = di_cuda_workspace(be, sizeof(float) * (size_t)(m * nb_max), &blk, err))) return rc;
    candidate_rows_kernel<<<(unsigned)m, SEL_THREADS, 0, di_cuda_state(be)->stream>>>(scores, rows, block, topk_blocks,
                                                                                     nb_max, (float *)blk, mask);
    return di_cuda_launched("candidate_mask_rows", err);
}

/* One CTA per row of rows [r0, r0 + nr): di_cuda_candidate_mask_torch's row over its width w, its block
 * scores in shared memory when they fit (as that op decides for the row alone), else in q.
 * q telem [nr, d_replay_elems(nb_max)] scratch. */
__global__ void __launch_bounds__(REPLAY_THREADS) cand_rows_torch_kernel(const float *scores, const di_index_row *rows,
                                                                         int64_t r0, int block, int topk_blocks,
                                                                         int64_t nb_max, telem *q, uint8_t *mask) {
    extern __shared__ telem sel_sm[];
    const int64_t rr = blockIdx.x;
    const di_index_row r = rows[r0 + rr];
    const int64_t nb = ((int64_t)r.w + block - 1) / block, keep = topk_blocks < nb ? topk_blocks : nb;
    if (nb == 0) return; /* the per-sequence op writes nothing for a row of width 0 */
    const bool in_smem = sizeof(telem) * (size_t)d_replay_elems(nb) <= REPLAY_SMEM_MAX;
    d_cand_torch_row(scores + r.s0, r.w, r.vis, block, nb, keep, in_smem ? sel_sm : q + rr * d_replay_elems(nb_max),
                     mask + r.s0);
}

static int candidate_mask_rows_torch(const di_backend *be, const float *scores, int64_t m, const di_index_row *rows,
                                     int64_t w_max, int block, int topk_blocks, uint8_t *mask, di_error *err) {
    int rc = check_rows("candidate_mask_rows", m, w_max, err);
    if (!rc && (block < 1 || topk_blocks < 1))
        rc = di_error_set(err, DI_ERR_INVALID, "cuda candidate_mask_rows: block %d, top %d blocks", block, topk_blocks);
    int64_t nb_max = (w_max + block - 1) / (block > 0 ? block : 1);
    if (rc || m == 0 || nb_max == 0) return rc;
    int64_t per = (int64_t)sizeof(telem) * d_replay_elems(nb_max), n = d_rows_per_launch(m, per);
    void *q;
    if ((rc = di_cuda_workspace(be, (size_t)(n * per), &q, err))) return rc;
    cudaStream_t st = di_cuda_state(be)->stream;
    raise_smem();
    const size_t row_b = sizeof(telem) * (size_t)d_replay_elems(nb_max), smem = row_b < REPLAY_SMEM_MAX ? row_b : REPLAY_SMEM_MAX;
    for (int64_t r0 = 0; r0 < m; r0 += n) {
        int64_t nr = m - r0 < n ? m - r0 : n;
        cand_rows_torch_kernel<<<(unsigned)nr, REPLAY_THREADS, smem, st>>>(scores, rows, r0, block, topk_blocks, nb_max,
                                                                           (telem *)q, mask);
        if ((rc = di_cuda_launched("candidate_mask_rows (torch replay)", err))) return rc;
    }
    return DI_OK;
}

static void raise_smem(void) {
    heap_pipe_configure();
    static bool raised = false;
    if (raised) return;
    cudaFuncSetAttribute(topk_rows_torch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, REPLAY_SMEM_MAX);
    cudaFuncSetAttribute(cand_rows_torch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, REPLAY_SMEM_MAX);
    raised = true;
}

/* ---------------- gathers ---------------- */

/* grid (ceil(mk_max·d/8 / 256), n_seq): sequence blockIdx.y's gather_topk work items. */
__global__ void gather_topk_seqs_kernel(int codec, int64_t d, int64_t rb, const di_gather_seq *seqs) {
    const di_gather_seq g = seqs[blockIdx.y];
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= g.m * g.k * (d / 8)) return;
    d_gather_topk_item(codec, g.base, g.n_entries, g.pages, g.page_entries, g.page_rows, g.row_off, g.top, g.k, d, rb,
                       g.row0, g.rows, g.idx, g.ldi, (uintptr_t)g.rows % 16 == 0, e);
}

static int gather_topk_seqs(const di_backend *be, di_row_codec codec, int64_t d, const di_gather_seq *seqs, int n_seq,
                            int64_t mk_max, di_error *err) {
    if (codec < DI_CODEC_FP8_E8M0 || codec > DI_CODEC_FP4_E8M0 || d < 1 || d % di_row_codec_group(codec) || n_seq < 0 ||
        n_seq > ROWS_PER_GRID || mk_max < 0)
        return di_error_set(err, DI_ERR_INVALID,
                            "cuda gather_topk_seqs: codec %d, width %lld, %d sequences, %lld rows at most", (int)codec,
                            (long long)d, n_seq, (long long)mk_max);
    int64_t n = mk_max * (d / 8);
    if (n == 0 || n_seq == 0) return DI_OK;
    dim3 grid(di_cuda_blocks(n, 256), (unsigned)n_seq);
    gather_topk_seqs_kernel<<<grid, 256, 0, di_cuda_state(be)->stream>>>((int)codec, d, di_row_codec_bytes(codec, d),
                                                                          seqs);
    return di_cuda_launched("gather_topk_seqs", err);
}

/* The slots follow the per-sequence ops already chosen (backend_cuda.cu): the parallel selections with
 * DI_CUDA_TOPK=fast, the torch replay otherwise; gather_topk_seqs with gather_topk. DI_CUDA_INDEX_SEQS=off
 * leaves them empty, so the graph issues the per-sequence calls as before. */
extern "C" void di_cuda_index_seqs_install(di_backend *be) {
    const char *env = getenv("DI_CUDA_INDEX_SEQS");
    if (env && !strcmp(env, "off")) return;
    if (be->indexer_scores == di_cuda_indexer_scores) be->indexer_scores_rows = indexer_scores_rows;
    if (be->topk == di_cuda_topk) be->topk_rows = topk_rows_fast;
    else if (be->topk == di_cuda_topk_torch) be->topk_rows = topk_rows_torch;
    if (be->candidate_mask == di_cuda_candidate_mask) be->candidate_mask_rows = candidate_mask_rows_fast;
    else if (be->candidate_mask == di_cuda_candidate_mask_torch) be->candidate_mask_rows = candidate_mask_rows_torch;
    if (be->gather_topk == di_cuda_gather_topk) be->gather_topk_seqs = gather_topk_seqs;
}
