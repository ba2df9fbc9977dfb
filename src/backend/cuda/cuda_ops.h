/* The CUDA backend for NVIDIA Hopper (sm_90a), part 1: every op of the backend interface
 * (src/backend/backend.h) as a device kernel, faithful to the CPU reference op by op.
 *
 * Usage: di_backend_cuda_create() returns a di_backend whose slots take DEVICE pointers (cudaMalloc'd by
 * the caller) with exactly the shapes, layouts and numerics documented in backend.h. Ops are
 * asynchronous on the backend's stream (di_backend_cuda_stream), a non-blocking stream: data written by
 * other streams — including cudaMemcpy / cudaMemset on the legacy default stream, which can return before
 * a pageable upload has landed — must be complete (synchronised or ordered by an event) before an op
 * reads it. A slot returns after the launch and reports launch errors (and earlier asynchronous faults)
 * through its di_error. Shape arguments are
 * validated on the host like the CPU backend; index contents live on the device and are not read back:
 * an out-of-range index (token id, row id, KV index) produces a zero row (gathers) or is skipped
 * (attention) instead of a fault.
 *
 * Exactness (cuda_common.cuh; measured by tests/cuda/test_cuda_ops.c, bench/NOTES-gpu.md): quantizers,
 * the FP8/FP4/bf16 GEMMs, RMSNorm, RoPE, mHC mixes/collapse/expand, indexer scores, top-k, candidate
 * mask, gathers, Engram lookup and the MoE accumulation reproduce the CPU ops bit for bit. Ops through
 * exp/log1p (SwiGLU, router weights, Sinkhorn, compressor, Engram gate, sparse attention) round the f64
 * function once to f32 where the CPU calls glibc's expf/log1pf: rare 1-ulp differences, which Sinkhorn's
 * 20 normalisations can grow to a few ulps; against CPU code with correctly rounded exp/log1p they are
 * bit-identical too.
 *
 * Top-k and candidate mask: the backend's slots replay torch's CPU selection like the CPU backend
 * (cuda_select_torch.cu: the reference's choice among equal scores, spec §5.6); with DI_CUDA_TOPK=fast
 * they are the parallel kernels of cuda_select.cu, whose tie rule (higher score, then lower position)
 * is that of di_cpu_topk / di_cpu_candidate_mask. */
#ifndef DI_BACKEND_CUDA_CUDA_OPS_H
#define DI_BACKEND_CUDA_CUDA_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices (0 without a driver or GPU). */
int di_cuda_device_count(void);

/* A CUDA backend on `device`, with its own stream. Fails with DI_ERR_UNSUPPORTED when the device is
 * not compute capability 9.x (the kernels are built for sm_90a only). Destroy with
 * di_backend_cuda_destroy (not di_backend_destroy, which frees CPU state). */
int di_backend_cuda_create(int device, di_backend **out, di_error *err);
void di_backend_cuda_destroy(di_backend *be);
/* The cudaStream_t the ops run on, as void*. */
void *di_backend_cuda_stream(const di_backend *be);
/* Wait for every op issued so far; reports an asynchronous fault. */
int di_backend_cuda_sync(const di_backend *be, di_error *err);
/* How many side lanes (backend.h side_begin) ran on a stream of their own so far; *recorded (may be
 * NULL): how many of them inside a stream capture (a graph's recording). */
long di_backend_cuda_side_forks(const di_backend *be, long *recorded);

/* ---- activation quantizers on one contiguous device vector (io/formats.h, bit-identical) ----
 * x bf16 [n], n % group == 0; q e4m3 [n] or packed E2M1 [n/2]; scale [n/group] (E8M0 or E4M3 codes);
 * out bf16 [n] (may alias x). stream: a cudaStream_t or NULL (legacy default stream). */
int di_cuda_act_quant_fp8(const uint16_t *x, int64_t n, int group, uint8_t *q, uint8_t *scale, void *stream,
                          di_error *err);
int di_cuda_act_qdq_fp8(const uint16_t *x, int64_t n, int group, uint16_t *out, void *stream, di_error *err);
int di_cuda_fp4_quant_e8m0(const uint16_t *x, int64_t n, int group, uint8_t *packed, uint8_t *scale, void *stream,
                           di_error *err);
int di_cuda_fp4_qdq_e8m0(const uint16_t *x, int64_t n, int group, uint16_t *out, void *stream, di_error *err);
int di_cuda_fp4_quant_e4m3(const uint16_t *x, int64_t n, int group, uint8_t *packed, uint8_t *scale, void *stream,
                           di_error *err);
int di_cuda_fp4_qdq_e4m3(const uint16_t *x, int64_t n, int group, uint16_t *out, void *stream, di_error *err);

/* ---- the backend slots (contracts in backend.h; all pointers are device pointers) ---- */
int di_cuda_linear_fp8(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint8_t *w,
                       const uint8_t *ws, int64_t n, uint16_t *y, di_error *err);
int di_cuda_linear_fp4(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint8_t *w,
                       const uint8_t *ws, int64_t n, uint16_t *y, di_error *err);
int di_cuda_linear_bf16(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w, int64_t n,
                        uint16_t *y, di_error *err);
int di_cuda_linear_f32(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w, int64_t n,
                       float *y, di_error *err);
int di_cuda_linear_grouped_bf16(const di_backend *be, const uint16_t *x, int64_t m, int g, int64_t k,
                                const uint16_t *w, int64_t r, uint16_t *y, di_error *err);
int di_cuda_rmsnorm(const di_backend *be, const uint16_t *x, int64_t m, int64_t n, const uint16_t *w, float eps,
                    uint16_t *y, di_error *err);
int di_cuda_rope(const di_backend *be, uint16_t *x, int64_t m, int nh, int d, int rd, const int64_t *pos,
                 const float *freqs, bool inverse, di_error *err);
int di_cuda_qdq_fp8(const di_backend *be, uint16_t *x, int64_t m, int64_t n, int group, di_error *err);
int di_cuda_qdq_fp4_e8m0(const di_backend *be, uint16_t *x, int64_t m, int64_t n, int group, di_error *err);
int di_cuda_qdq_fp4_e4m3(const di_backend *be, uint16_t *x, int64_t m, int64_t n, int group, di_error *err);
int di_cuda_embed(const di_backend *be, const uint16_t *table, int64_t vocab, int64_t d, const int32_t *ids,
                  int64_t m, uint16_t *y, di_error *err);
int di_cuda_hc_mixes(const di_backend *be, const uint16_t *x, int64_t m, int hc, int64_t d, const float *fn,
                     float eps, float *mixes, di_error *err);
int di_cuda_hc_sinkhorn(const di_backend *be, const float *mixes, int64_t m, int hc, const float *scale,
                        const float *base, int iters, float eps, float *pre, float *post, float *comb, di_error *err);
int di_cuda_hc_collapse(const di_backend *be, const uint16_t *x, const float *pre, int64_t m, int hc, int64_t d,
                        uint16_t *y, di_error *err);
int di_cuda_hc_expand(const di_backend *be, const uint16_t *z, const uint16_t *x, const float *post,
                      const float *comb, int64_t m, int hc, int64_t d, uint16_t *y, di_error *err);
int di_cuda_compress_pool(const di_backend *be, const float *a, const float *gate, int64_t m, int ratio, int64_t d,
                          uint16_t *y, di_error *err);
int di_cuda_indexer_scores(const di_backend *be, const uint16_t *q, const uint16_t *w, float w_scale,
                           const uint16_t *k, int64_t m, int nh, int hd, int64_t nk, const int32_t *vis,
                           const uint8_t *cand, float *scores, di_error *err);
int di_cuda_candidate_mask(const di_backend *be, const float *scores, int64_t m, int64_t nk, const int32_t *vis,
                           int block, int topk_blocks, uint8_t *mask, float *ws, di_error *err);
int di_cuda_topk(const di_backend *be, const float *scores, int64_t m, int64_t nk, const int32_t *vis, int k,
                 int32_t offset, int32_t *out, di_error *err);
int di_cuda_sparse_attn(const di_backend *be, const uint16_t *q, int64_t m, int nh, int d, const uint16_t *kv_win,
                        int64_t n_win, const uint16_t *kv_cmp, int64_t n_cmp, const float *sink, const int32_t *idx,
                        int64_t n_idx, float scale, uint16_t *out, di_error *err);
int di_cuda_router(const di_backend *be, const float *logits, int64_t m, int n_exp, const float *bias, float temp,
                   int k, bool normalize, float scale, int32_t *ids, float *weights, di_error *err);
int di_cuda_swiglu(const di_backend *be, const uint16_t *g, const uint16_t *u, int64_t m, int64_t n,
                   const float *row_w, float lim, uint16_t *a, di_error *err);
int di_cuda_gather_rows(const di_backend *be, const uint16_t *x, int64_t d, const int32_t *rows, int64_t m,
                        uint16_t *y, di_error *err);
int di_cuda_scatter_add_rows(const di_backend *be, const uint16_t *y, int64_t d, const int32_t *rows, int64_t m,
                             float *acc, di_error *err);
int di_cuda_moe_routed(const di_backend *be, const uint16_t *x, int64_t m, int64_t d, int64_t inter,
                       const int32_t *ids, const float *weights, int k, int n_exp, const di_moe_expert *experts,
                       float lim, float *acc, di_error *err);
int di_cuda_f32_to_bf16(const di_backend *be, const float *x, int64_t n, uint16_t *y, di_error *err);
int di_cuda_fill_f32(const di_backend *be, float *x, int64_t n, float v, di_error *err);
int di_cuda_engram_lookup(const di_backend *be, const uint8_t *table, const uint8_t *scale, int64_t rows, int hd,
                          const int64_t *ids, int64_t m, int n_cols, uint16_t *y, di_error *err);
int di_cuda_engram_gate(const di_backend *be, uint16_t *x, const uint16_t *kv, int64_t m, int hc, int64_t d,
                        const uint16_t *qw, const uint16_t *kw, float eps, di_error *err);

/* The part-1 FP8 / MXFP4 linear (one-block-per-column GEMV up to 8 rows, then the tiled kernel), same
 * contract and results as linear_fp8 / linear_fp4: the "before" of the GEMV bench (cuda_gemm.cu). */
int di_cuda_linear_q_part1(const di_backend *be, int fp4, const uint16_t *x, int64_t m, int64_t k, const uint8_t *w,
                           const uint8_t *ws, int64_t n, uint16_t *y, di_error *err);

/* The decode GEMV of linear_fp8 / linear_fp4 alone, on act-quantized rows: xq e4m3 [m, k], xs E8M0
 * [m, k/32] (device), 1 ≤ m ≤ 16. Bench helpers: the SM clock (MHz) measured by a spinning kernel,
 * and a plain 16-byte streaming read of `bytes` (the bandwidth reference of the GEMV bench). */
int di_cuda_gemv_codes(const di_backend *be, int fp4, const uint8_t *xq, const uint8_t *xs, int64_t m, int64_t k,
                       const uint8_t *w, const uint8_t *ws, int64_t n, uint16_t *y, di_error *err);
double di_cuda_sm_clock_mhz(void *stream);
/* Bench: the GEMV's column tile, 0 = the measured rule (default), 1 = always 4 columns, 2 = always 8
 * (same arithmetic, same results); the same for moe_routed's expert GEMVs. */
void di_cuda_gemv_set_variant(int v);
void di_cuda_moe_set_variant(int v);
/* moe_routed's grouped expert GEMM (cuda_moe_mm.cu): 0 = the default rule (every group from 17 tokens,
 * unless DI_CUDA_MOE_MM=off), −1 = never (the GEMVs), n ≥ 1 = for the groups of at least n rows, the
 * GEMVs for the others (same results) */
void di_cuda_moe_set_mm(int min_rows);
void di_cuda_stream_read(const void *p, int64_t bytes, unsigned *sink, void *stream);

/* ---- memory, cache row codecs, stream mean (cuda_mem.cu; contracts in backend.h) ---- */
void *di_cuda_mem_alloc(const di_backend *be, size_t bytes, di_error *err);
void di_cuda_mem_free(const di_backend *be, void *p);
int di_cuda_mem_upload(const di_backend *be, void *dst, const void *src, size_t bytes, di_error *err);
int di_cuda_mem_download(const di_backend *be, void *dst, const void *src, size_t bytes, di_error *err);
int di_cuda_mem_copy(const di_backend *be, void *dst, const void *src, size_t bytes, di_error *err);
int di_cuda_mem_set(const di_backend *be, void *dst, int byte, size_t bytes, di_error *err);
int di_cuda_mem_map_host(const di_backend *be, const void *host, size_t bytes, const void **view, di_error *err);
void di_cuda_mem_unmap_host(const di_backend *be, const void *host, const void *view);
int di_cuda_row_encode(const di_backend *be, di_row_codec codec, const uint16_t *x, int64_t n, int64_t d, uint8_t *rows,
                       di_error *err);
int di_cuda_row_decode(const di_backend *be, di_row_codec codec, const uint8_t *rows, const int32_t *ids, int64_t n,
                       int64_t d, uint16_t *y, di_error *err);
int di_cuda_stream_mean(const di_backend *be, const uint16_t *x, int64_t m, int hc, int64_t d, uint16_t *y, int64_t ldy,
                        di_error *err);

/* ---- selections with the reference's tie behaviour (cuda_select_torch.cu): the replay of torch's CPU
 * top-k of graph_extra_topk.c, one thread per row; the backend's default topk / candidate_mask slots
 * (DI_CUDA_TOPK=fast selects di_cuda_topk / di_cuda_candidate_mask instead) ---- */
int di_cuda_topk_torch(const di_backend *be, const float *scores, int64_t m, int64_t nk, const int32_t *vis, int k,
                       int32_t offset, int32_t *out, di_error *err);
int di_cuda_candidate_mask_torch(const di_backend *be, const float *scores, int64_t m, int64_t nk, const int32_t *vis,
                                 int block, int topk_blocks, uint8_t *mask, float *ws, di_error *err);

/* The streaming compressor of the `infer` branch's backend.h (same contract as di_cpu_compress_pool of
 * cpu_attn.h): tokens at positions start_pos … start_pos+m−1 update the carry state (slot = pos mod R)
 * and every group they complete is pooled into y (in group order); *n_out (host) = entries written.
 *   a, gate f32 [m, d];  kv_state, score_state f32 [R, d] device (in/out);  y bf16 [n_out, d] */
int di_cuda_compress_pool_stream(const di_backend *be, const float *a, const float *gate, int64_t m,
                                 int64_t start_pos, int ratio, int64_t d, float *kv_state, float *score_state,
                                 uint16_t *y, int64_t *n_out, di_error *err);

#ifdef __cplusplus
}
#endif

#endif
