/* CPU kernels the block graph needs that the CPU op files (cpu_ops.h, cpu_attn.h) did not provide
 * when the graph was integrated. Each has the signature of its slot in di_backend (backend.h) and
 * the numerics documented there; backend_cpu.c installs them. Plain scalar C with a fixed reduction
 * order per output element, so results do not depend on the number of rows in a call. */
#ifndef DI_BACKEND_CPU_GRAPH_EXTRA_H
#define DI_BACKEND_CPU_GRAPH_EXTRA_H

#include "backend/backend.h"

/* graph_extra_ops.c: GEMMs, norms, RoPE, QDQ, embedding, MoE helpers, Engram */
int di_gx_linear_fp8(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint8_t *w,
                     const uint8_t *ws, int64_t n, uint16_t *y, di_error *err);
int di_gx_linear_fp4(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint8_t *w,
                     const uint8_t *ws, int64_t n, uint16_t *y, di_error *err);
int di_gx_linear_bf16(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w, int64_t n,
                      uint16_t *y, di_error *err);
int di_gx_linear_f32(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w, int64_t n,
                     float *y, di_error *err);
int di_gx_linear_grouped_bf16(const di_backend *be, const uint16_t *x, int64_t m, int g, int64_t k,
                              const uint16_t *w, int64_t r, uint16_t *y, di_error *err);
int di_gx_rmsnorm(const di_backend *be, const uint16_t *x, int64_t m, int64_t n, const uint16_t *w, float eps,
                  uint16_t *y, di_error *err);
int di_gx_rope(const di_backend *be, uint16_t *x, int64_t m, int nh, int d, int rd, const int64_t *pos,
               const float *freqs, bool inverse, di_error *err);
int di_gx_qdq_fp8(const di_backend *be, uint16_t *x, int64_t m, int64_t n, int group, di_error *err);
int di_gx_qdq_fp4_e8m0(const di_backend *be, uint16_t *x, int64_t m, int64_t n, int group, di_error *err);
int di_gx_qdq_fp4_e4m3(const di_backend *be, uint16_t *x, int64_t m, int64_t n, int group, di_error *err);
int di_gx_embed(const di_backend *be, const uint16_t *table, int64_t vocab, int64_t d, const int32_t *ids,
                int64_t m, uint16_t *y, di_error *err);
int di_gx_router(const di_backend *be, const float *logits, int64_t m, int n_exp, const float *bias, float temp,
                 int k, bool normalize, float scale, int32_t *ids, float *weights, di_error *err);
int di_gx_swiglu(const di_backend *be, const uint16_t *g, const uint16_t *u, int64_t m, int64_t n,
                 const float *row_w, float lim, uint16_t *a, di_error *err);
int di_gx_gather_rows(const di_backend *be, const uint16_t *x, int64_t d, const int32_t *rows, int64_t m,
                      uint16_t *y, di_error *err);
int di_gx_scatter_add_rows(const di_backend *be, const uint16_t *y, int64_t d, const int32_t *rows, int64_t m,
                           float *acc, di_error *err);
int di_gx_f32_to_bf16(const di_backend *be, const float *x, int64_t n, uint16_t *y, di_error *err);
int di_gx_fill_f32(const di_backend *be, float *x, int64_t n, float v, di_error *err);
int di_gx_engram_lookup(const di_backend *be, const uint8_t *table, const uint8_t *scale, int64_t rows, int hd,
                        const int64_t *ids, int64_t m, int n_cols, uint16_t *y, di_error *err);
int di_gx_engram_gate(const di_backend *be, uint16_t *x, const uint16_t *kv, int64_t m, int hc, int64_t d,
                      const uint16_t *qw, const uint16_t *kw, float eps, di_error *err);

/* graph_extra_attn.c: mHC, compressor pooling, indexer scores, sparse attention */
int di_gx_hc_mixes(const di_backend *be, const uint16_t *x, int64_t m, int hc, int64_t d, const float *fn,
                   float eps, float *mixes, di_error *err);
int di_gx_hc_sinkhorn(const di_backend *be, const float *mixes, int64_t m, int hc, const float *scale,
                      const float *base, int iters, float eps, float *pre, float *post, float *comb, di_error *err);
int di_gx_hc_collapse(const di_backend *be, const uint16_t *x, const float *pre, int64_t m, int hc, int64_t d,
                      uint16_t *y, di_error *err);
int di_gx_hc_expand(const di_backend *be, const uint16_t *z, const uint16_t *x, const float *post,
                    const float *comb, int64_t m, int hc, int64_t d, uint16_t *y, di_error *err);
int di_gx_compress_pool(const di_backend *be, const float *a, const float *gate, int64_t m, int64_t start_pos,
                        int ratio, int64_t d, float *kv_state, float *score_state, uint16_t *y, int64_t *n_out,
                        di_error *err);
int di_gx_indexer_scores(const di_backend *be, const uint16_t *q, const uint16_t *w, float w_scale, const uint16_t *k, int64_t m,
                         int nh, int hd, int64_t nk, const int32_t *vis, const uint8_t *cand, float *scores,
                         di_error *err);
int di_gx_sparse_attn(const di_backend *be, const uint16_t *q, int64_t m, int nh, int d, const uint16_t *kv_win,
                      int64_t n_win, const uint16_t *kv_cmp, int64_t n_cmp, const float *sink, const int32_t *idx,
                      int64_t n_idx, float scale, uint16_t *out, di_error *err);

/* graph_extra_topk.c: selections with the reference's CPU tie behaviour (torch.topk = libstdc++
 * introselect / heap select on (score, position) pairs); slots topk and candidate_mask */
int di_gx_topk_torch(const di_backend *be, const float *scores, int64_t m, int64_t nk, const int32_t *vis, int k,
                     int32_t offset, int32_t *out, di_error *err);
int di_gx_candidate_mask_torch(const di_backend *be, const float *scores, int64_t m, int64_t nk, const int32_t *vis,
                               int block, int topk_blocks, uint8_t *mask, float *ws, di_error *err);

#endif
