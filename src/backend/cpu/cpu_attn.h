/* CPU reference kernels for the attention side of a DeepSeek-V4.1 block: the mHC mixes around every
 * sub-layer, the ratio-2/ratio-1 KV compressors, indexer scoring, the two-level candidate mask,
 * top-k selection, the sparse-attention index lists and sparse attention with the sink
 * (spec model.md §3.3–3.6, §3.11, §4.2, §4.4, §5).
 *
 * These kernels define what the engine computes: the CUDA backend is tested against them. They work
 * on host pointers, take explicit shapes, allocate nothing and keep every reduction in one fixed
 * order that does not depend on the batch size or on how rows are split between threads.
 *
 * Conventions:
 *  - bf16 values travel as uint16_t bit patterns (io/formats.h); f32 as float.
 *  - Row-major, dense, innermost dimension last. "[n, hc, d]" = n tokens × hc streams × d values.
 *  - Score rows are f32 arrays holding bf16-exact values (the reference computes them in bf16), with
 *    −inf for "not selectable". The golden files store them the same way.
 *  - Index lists are int32; −1 is an empty slot that attention skips.
 *  - Every function returns DI_OK or DI_ERR_INVALID (bad shape or argument, message in *err).
 *  - Rows (tokens, queries) are computed independently: a caller may split a call into row ranges
 *    across threads by offsetting the row pointers and get bit-identical results. Only
 *    di_cpu_compress_pool carries state from token to token and must see its tokens in order.
 *  - Dot products use 8 strided f32 partial sums (lane = index mod 8, ascending) combined pairwise
 *    ((0+1)+(2+3))+((4+5)+(6+7)). The hot loops are cloned for AVX2 with a baseline fallback
 *    (target_clones, runtime dispatch); the compiler vectorizes the explicit lanes without
 *    reassociating, so every machine computes the same bits. This relies on FP contraction being
 *    off (the Makefile passes -ffp-contract=off; an FMA would round differently).
 *
 * ---- The deferred pre-mix (§4.2) -------------------------------------------------------------
 * Each sub-layer computes (pre, post, comb) from ITS OWN input X, but V4.1 collapses X with the
 * `pre` of the PREVIOUS sub-layer. The block graph therefore reads:
 *
 *     pre = onehot(stream 0)                              before layer 0
 *     for each layer L:
 *        (preA, postA, combA) = mixes(X; hc_attn_*)       from the block input
 *        X = expand(attn(norm(collapse(X; pre))),  X; postA, combA)
 *        (preF, postF, combF) = mixes(X; hc_ffn_*)        from the post-attention streams
 *        X = expand(ffn(norm(collapse(X; preA))),  X; postF, combF)
 *        pre = preF                                       handed to layer L+1 (the golden `_premix`)
 *     h = collapse(X; pre)                                final norm + LM head
 *
 * So attention of layer L collapses with the FFN pre-mix of layer L−1, the FFN of layer L with the
 * attention pre-mix of layer L, and the final head with the FFN pre-mix of the last layer (there are no
 * hc_head parameters in V4.1). The first attention takes stream 0 (= the embedding) exactly: the
 * one-hot collapse 1·X0 + 0·X1 + 0·X2 + 0·X3 is exact in f32.
 */
#ifndef DI_BACKEND_CPU_CPU_ATTN_H
#define DI_BACKEND_CPU_CPU_ATTN_H

#include <stdint.h>

#include "deepinfer.h"

/* Marks a hot loop for runtime dispatch between an AVX2 build and the baseline build (x86-64
 * gcc/clang, target_clones). Both builds vectorize the same explicit lanes without reassociating, so
 * they give the same bits (see the dot-product convention above). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DI_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DI_CPU_CLONES
#endif

/* ============================== mHC (§3.3, §4.2) ============================== */

#define DI_HC_MAX 8 /* streams supported by the kernels; V4.1 uses hc = 4 */

/* Number of mixes per token: hc pre + hc post + hc×hc comb (24 for hc = 4). */
static inline int di_hc_n_mix(int hc) { return (2 + hc) * hc; }

/* mixes[t] = (fn · xf) · rsqrt(mean(xf²) + norm_eps), xf = f32(flatten(x[t])) (stream-major, length
 * hc·dim). The reference's plain f32 GEMM (no TF32); here every dot product and the sum of squares
 * is accumulated in f64 (8 strided lanes combined pairwise, exact products) and rounded once to f32,
 * the closest estimate of any f32 summation order, and independent of the batch.
 *   x      bf16 [n_tok, hc, dim]        the residual streams
 *   fn     f32  [n_mix, hc·dim]         hc_attn_fn / hc_ffn_fn, n_mix = di_hc_n_mix(hc)
 *   mixes  f32  [n_tok, n_mix]          out */
int di_cpu_hc_mixes(const uint16_t *x, int64_t n_tok, int hc, int64_t dim, const float *fn, float norm_eps,
                    float *mixes, di_error *err);

/* Split the mixes and make comb doubly stochastic, exactly the reference's fp32 sequence:
 *   pre_k  = sigmoid(m[k]·scale[0] + base[k]) + eps
 *   post_k = 2·sigmoid(m[hc+k]·scale[1] + base[hc+k])
 *   C[j][k] = m[2hc+hc·j+k]·scale[2] + base[2hc+hc·j+k]       (row j = source stream, col k = target)
 *   C = rowsoftmax(C) + eps; C /= colsum(C) + eps; then (iters−1)× { C /= rowsum + eps; C /= colsum + eps }
 * Sums over the hc axis run in ascending index order. iters = 20, eps = 1e-6 for V4.1 (iters ≥ 1).
 *   mixes  f32 [n_tok, n_mix];  scale f32 [3];  base f32 [n_mix]
 *   pre    f32 [n_tok, hc];  post f32 [n_tok, hc];  comb f32 [n_tok, hc, hc]   out */
int di_cpu_hc_sinkhorn(const float *mixes, int64_t n_tok, int hc, const float *scale, const float *base, int iters,
                       float eps, float *pre, float *post, float *comb, di_error *err);

/* Collapse: out[t] = bf16(Σ_k pre[t][k]·f32(x[t][k])), k ascending, f32 products and sums.
 *   x bf16 [n_tok, hc, dim];  pre f32 [n_tok, hc];  out bf16 [n_tok, dim] */
int di_cpu_hc_collapse(const uint16_t *x, const float *pre, int64_t n_tok, int hc, int64_t dim, uint16_t *out,
                       di_error *err);

/* Expand: out[t][k] = bf16(post[t][k]·f32(z[t]) + (((C[0][k]·X0 + C[1][k]·X1) + C[2][k]·X2) + …)),
 * the residual sum accumulated over source streams j ascending, then added to the post term.
 *   z bf16 [n_tok, dim] (sub-layer output);  x bf16 [n_tok, hc, dim] (sub-layer input = residual)
 *   post f32 [n_tok, hc];  comb f32 [n_tok, hc, hc];  out bf16 [n_tok, hc, dim] (may alias x) */
int di_cpu_hc_expand(const uint16_t *z, const uint16_t *x, const float *post, const float *comb, int64_t n_tok,
                     int hc, int64_t dim, uint16_t *out, di_error *err);

/* ============================== compressors (§4.4) ============================== */

/* Entry n of a ratio-R compressed stream covers tokens [nR, nR+R) and is visible to the query at
 * position p iff (n+1)·R ≤ p+1: the query sees the first di_compress_visible(p, R) entries. */
static inline int32_t di_compress_visible(int64_t pos, int ratio) { return (int32_t)((pos + 1) / ratio); }

/* Pooling compressor state for ratio R ≥ 2 (V4.1: R = 2), f32, owned by the caller per sequence:
 *   kv_state f32 [R, dim], score_state f32 [R, dim]; slot = position mod R.
 * Reset at sequence start: kv = 0, score = −inf. */
int di_cpu_compress_state_reset(float *kv_state, float *score_state, int ratio, int64_t dim, di_error *err);

/* Feed tokens at positions start_pos … start_pos+n_tok−1 (a prefill from 0, a chunk or one decode
 * token) into the pooling compressor and emit every group they complete:
 *   κ_g[j] = Σ_{t in group} softmax_t(g_t[j])·a_t[j]   (per channel, f32; slots ascending)
 *   out_g  = bf16(κ_g)                                  (the caller then applies the compressor RMSNorm)
 * Group g = (p+1)/R − 1 completes at the token p with (p+1) mod R = 0; a trailing partial group waits
 * in the state for the next call. The reference pools a prefill directly and decode from the state; the
 * f32 values and operations are the same, so one streaming path serves both.
 *   a, g   f32  [n_tok, dim]  the f32 projections f32(x)·wkvᵀ and f32(x)·wgateᵀ
 *   out    bf16 [(start_pos+n_tok)/R − start_pos/R, dim]   emitted entries, in group order
 *   n_out  number of entries written (may be NULL) */
int di_cpu_compress_pool(const float *a, const float *g, int64_t n_tok, int64_t start_pos, int ratio, int64_t dim,
                         float *kv_state, float *score_state, uint16_t *out, int64_t *n_out, di_error *err);

/* Ratio 1: every token is its own entry, the bf16 projection Linear_bf16(x; wkv) passes through
 * unchanged (no gate, no state; the compressor RMSNorm follows).  a, out bf16 [n_tok, dim]. */
int di_cpu_compress_ratio1(const uint16_t *a, int64_t n_tok, int64_t dim, uint16_t *out, di_error *err);

/* ============================== indexer (§4.4, §5.1, §5.3) ============================== */

/* Visible-entry counts of n_q consecutive queries at positions start_pos …: vis[i] = (start_pos+i+1)/R,
 * clamped to n_keys.  vis int32 [n_q]. */
int di_cpu_visible_counts(int64_t start_pos, int64_t n_q, int ratio, int64_t n_keys, int32_t *vis,
                          di_error *err);

/* Index scores, in bf16 exactly where the reference is (an einsum, relu and a weighted head sum on
 * bf16 tensors):
 *   w_h      = bf16(f32(w_h) · w_scale) the reference scales the bf16 weights_proj(x) tensor by
 *                                      index_head_dim^-0.5 · index_n_heads^-0.5 (a Python double
 *                                      product, applied as f32): pass w_scale = (float)(that product),
 *                                      or 1 when w is already scaled. Exact for V4.1's 128 and 32
 *                                      (2^-6), NOT for e.g. 128 and 4 (2^-4.5, the mid test case).
 *   d_h      = bf16(q_h · k_n)          f32 dot product rounded to bf16
 *   r_h      = bf16(relu(d_h) · w_h)    the bf16 product, computed in f32 and rounded
 *   score_n  = bf16(Σ_h r_h)            f32 sum over heads h ascending, rounded once
 * Entries n ≥ vis[i] (not yet visible) get −inf; so do entries with cand[i][n] == 0 when cand is given
 * (re-index layers mask with the candidate-source layer's mask).
 *   q      bf16 [n_q, n_heads, head_dim]   FP4-QDQ'd index queries
 *   w      bf16 [n_q, n_heads]             weights_proj(x)
 *   k      bf16 [n_keys, head_dim]          FP4-QDQ'd index keys
 *   vis    int32 [n_q]                      visible entries per query (≤ n_keys)
 *   cand   uint8 [n_q, n_keys] or NULL      candidate mask (1 = candidate)
 *   scores f32 [n_q, n_keys]                out, bf16-exact values */
int di_cpu_indexer_scores(const uint16_t *q, const uint16_t *w, float w_scale, const uint16_t *k, int64_t n_q,
                          int n_heads, int head_dim, int64_t n_keys, const int32_t *vis, const uint8_t *cand,
                          float *scores, di_error *err);

/* ============================== selection (§4.4, §5.6) ============================== */

/* Tie rule for every selection below (the reference's torch.topk leaves it unspecified): higher score
 * first, then LOWER position. −0 equals +0; −inf and NaN entries are never selected. The selection
 * is a 4-pass radix select on the ordered f32 bits, O(n_keys) per row, no sorting. This is the
 * canonical rule other backends are tested against; the CPU backend's golden-matching path uses
 * graph_extra_topk.c (torch's CPU tie behaviour) instead — see topk.c. */

/* The reference's k = min(index_topk, n_keys), n_keys = (end position)/R: in a prefill every row gets
 * the same width even when it sees fewer entries (those rows end in −1 padding). */
static inline int di_topk_width(int index_topk, int64_t n_keys) {
    return n_keys < index_topk ? (int)n_keys : index_topk;
}

/* Top-k of the index scores: per query the (up to) k best entries among n < vis[i] with finite score,
 * written in ASCENDING position order, each plus `offset`, then −1 padding to k. Offset convention
 * (golden README): the compressed indices point into the concatenated key set
 * [window KV ‖ compressed KV], so offset = T (the prompt length) in the one-shot prefill and
 * = window size (the ring) in decode. Row width k: see di_topk_width.
 *   scores f32 [n_q, n_keys];  vis int32 [n_q];  out int32 [n_q, k] */
int di_cpu_topk(const float *scores, int64_t n_q, int64_t n_keys, const int32_t *vis, int k, int32_t offset,
                int32_t *out, di_error *err);

/* Two-level candidate mask (candidate-source layer): per query, the entries are grouped into blocks
 * of block_size (the last one padded with −inf), a block scores its max; the block holding the newest
 * visible entry, (vis−1)/block_size, is pinned to +inf (none when vis = 0); the best
 * min(topk_blocks, n_blocks) blocks are kept except those scoring −inf; the kept blocks expand back
 * to all their entries (including entries not yet visible inside the newest block, as the reference
 * does; the scores mask them anyway).
 *   scores f32 [n_q, n_keys] (invisible entries already −inf);  vis int32 [n_q]
 *   mask   uint8 [n_q, n_keys] out (1 = candidate)
 *   ws     f32 [ceil(n_keys / block_size)] scratch */
int di_cpu_candidate_mask(const float *scores, int64_t n_q, int64_t n_keys, const int32_t *vis, int block_size,
                          int topk_blocks, uint8_t *mask, float *ws, di_error *err);

/* ============================== sparse attention (§3.4, §4.1, §5.3) ============================== */

/* Index lists in the reference's ORDER. Attention rounds probabilities to bf16 against the running
 * max of 64-index blocks, so the position of every index in the list changes the result.
 *
 * Window, one-shot prefill from position 0 (kv = the T prompt tokens): row p has w = min(T, window)
 * slots: max(0, p−window+1) + j for j = 0 … w−1, ascending, entries > p set to −1.
 *   out int32 [T, min(T, window)] */
int di_cpu_window_idx_prefill(int64_t T, int window, int32_t *out, di_error *err);

/* Window, decode at position pos (kv = the ring, token p in slot p mod window): the ring listed oldest
 * first, slots (pos mod window)+1 … window−1, 0 … pos mod window; slots > pos (ring not yet full) are
 * −1 and so come FIRST while pos < window−1.  out int32 [window] */
int di_cpu_window_idx_decode(int64_t pos, int window, int32_t *out, di_error *err);

/* DSpark draft block at main position pos (§4.9): each of the `block` draft queries attends to the
 * filled ring slots in SLOT order 0 … min(window, pos+1)−1 (not ring order), then to all draft
 * entries, indices window … window+block−1 of the key set [ring ‖ draft kv]. Every row is the same.
 *   out int32 [block, min(window, pos+1) + block] */
int di_cpu_dspark_idx(int64_t pos, int window, int block, int32_t *out, di_error *err);

/* A query's full list = [window list ‖ compressed list] (the top-k output, already offset).
 *   win int32 [n_q, n_win];  cmp int32 [n_q, n_cmp] or NULL when n_cmp = 0;  out int32 [n_q, n_win+n_cmp] */
int di_cpu_attn_idx_concat(const int32_t *win, int64_t n_win, const int32_t *cmp, int64_t n_cmp, int64_t n_q,
                           int32_t *out, di_error *err);

#define DI_SPARSE_ATTN_BLOCK 64   /* indices per online-softmax step (reference kernel) */
#define DI_SPARSE_ATTN_MAX_DIM 1024

/* Single-KV-head sparse attention with an attention sink (K = V = the cached latent):
 *   for each query i, head h, over idx[i] in blocks of 64 (reference order):
 *     s = (q_h · c)·scale in f32 (−inf for −1);  M_new = max(M, max s), M starts at −1e30;
 *     l = l·exp(M − M_new) + Σ exp(s − M_new)          (f32 probabilities)
 *     o = o·exp(M − M_new) + Σ bf16(exp(s − M_new))·c  (probabilities rounded to bf16 before PV)
 *   out = bf16(o / (l + exp(sink_h − M)))               (sink NOT multiplied by scale)
 * A row whose indices are all −1 yields exactly 0 (exp(sink + 1e30) = inf, 0/inf = 0), not NaN.
 * A sink of −inf contributes nothing (the "no sink" mutation of the verify tests).
 * Index i < n_win reads kv_win[i]; n_win ≤ i < n_win+n_cmp reads kv_cmp[i − n_win] (the concatenation
 * [window ‖ compressed] the reference builds, without copying); anything else is an error.
 *   q      bf16 [n_q, n_heads, dim]          (dim ≤ DI_SPARSE_ATTN_MAX_DIM)
 *   kv_win bf16 [n_win, dim];  kv_cmp bf16 [n_cmp, dim] (NULL if n_cmp = 0)
 *   sink   f32  [n_heads];  idx int32 [n_q, n_idx];  scale = head_dim^-0.5 (512^-0.5 for V4.1)
 *   out    bf16 [n_q, n_heads, dim] */
int di_cpu_sparse_attn(const uint16_t *q, int64_t n_q, int n_heads, int dim, const uint16_t *kv_win, int64_t n_win,
                       const uint16_t *kv_cmp, int64_t n_cmp, const float *sink, const int32_t *idx, int64_t n_idx,
                       float scale, uint16_t *out, di_error *err);

#endif
