/* CPU reference ops of DeepSeek-V4.1-Flash: GEMMs, norms, RoPE, router, MoE pieces, Engram,
 * embedding. They compute what the official inference/model.py computes, with its bf16 rounding
 * points and its simulated FP8/FP4 quantization (spec model.md §3.1–3.8, §4, §5).
 *
 * Conventions (shared with the attention-side ops in cpu_attn.h, and meant to be mirrored by the
 * CUDA backend behind src/backend/backend.h):
 *  - bf16 values are uint16_t bit patterns; f32 is float; FP8/FP4 weights are passed exactly as the
 *    checkpoint stores them (codes + E8M0 scale bytes, see io/formats.h).
 *  - Matrices are row-major with an explicit row stride (`ld*`, in elements) so callers can address
 *    column slices (heads, groups, fused w1‖w3 outputs) without copies.
 *  - No op allocates. Ops needing scratch take a caller-provided workspace and publish its size.
 *  - `tp` may be NULL (single-threaded). Work is split over output rows/columns only, never over a
 *    reduction, and every output element is computed by one fixed sequence of f32/f64 operations:
 *    results are bit-identical for any thread count, any batch size M (row m depends only on row m
 *    of the input), and any SIMD level (util/cpu_features.h).
 *  - Reductions that are not GEMMs (norm statistics, Engram dot products) form each term in f32 as
 *    the reference does (x², h·w·k) and sum the terms in f64 in index order, rounding once: the
 *    value any f32 summation order the reference happens to use approximates best.
 *
 * GEMM reduction orders (the contract every backend must keep to stay batch invariant):
 *  - FP8 / FP4 block-scaled: per 32-wide K block the inner sum Σ q_x·q_w is computed EXACTLY (each
 *    product is exact in f32 and 32 of them sum exactly in f64), rounded once to f32, multiplied by
 *    s_x then s_w (powers of two: exact), and added to an f32 accumulator in ascending block order;
 *    the result is rounded to bf16 (spec §5.2). The reference sums inside a block in f32 in some
 *    order, so ≤ 1 bf16 ulp differences on rare elements are expected and measured in the tests.
 *  - bf16 (bf16×bf16 products are exact in f32): 16 interleaved f32 partial sums (lane l takes
 *    k ≡ l mod 16, ascending k), combined as lanes (l, l+8), then (l, l+4), (l, l+2), (l, l+1), then
 *    any K % 16 tail added in ascending order. */
#ifndef DI_BACKEND_CPU_CPU_OPS_H
#define DI_BACKEND_CPU_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "deepinfer.h"
#include "util/threadpool.h"

/* Activation/weight quantization block of V4.1 (FP8 32×32 weight blocks, FP4 32 along K,
 * activation scales per 32 contiguous inputs). */
#define DI_QBLOCK 32

/* ======================================================================================
 * GEMMs: y[M, N] = x[M, K] · Wᵀ, W stored [N, K] (output features × input features)
 * ====================================================================================== */

/* Workspace bytes for di_cpu_linear_fp8 / di_cpu_linear_fp4 with this pool (and any M' ≤ M,
 * K' ≤ K): the act-quantized input (f32 code values [M, K], f32 scales [M, K/32]) plus per-thread
 * scratch (a decoded 4 × 512 weight tile and f32 accumulators [M, 64]). */
size_t di_cpu_qlinear_workspace(int64_t M, int64_t K, const di_threadpool *tp);

/* FP8 linear (spec §3.1 Linear, §5.2): x is act_quant'ed per 32 inputs (pow2 E8M0 scales) inside.
 *   x      bf16 [M, ldx]                 (first K columns used), K % 32 == 0
 *   w      e4m3 codes [N, K]
 *   w_scale E8M0 [ceil(N/32), K/32]      (32×32 blocks)
 *   y      bf16 [M, ldy]                 (first N columns written)
 * Errors: DI_ERR_INVALID on K % 32 != 0 or a workspace smaller than di_cpu_qlinear_workspace. */
int di_cpu_linear_fp8(di_threadpool *tp, int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t ldx,
                      const uint8_t *w, const uint8_t *w_scale, uint16_t *y, int64_t ldy, void *ws,
                      size_t ws_bytes, di_error *err);

/* MXFP4 linear (routed experts): same activation quantization; weights packed E2M1.
 *   w       bytes [N, K/2]  (low nibble = even k, high nibble = odd k)
 *   w_scale E8M0 [N, K/32] */
int di_cpu_linear_fp4(di_threadpool *tp, int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t ldx,
                      const uint8_t *w, const uint8_t *w_scale, uint16_t *y, int64_t ldy, void *ws,
                      size_t ws_bytes, di_error *err);

/* bf16 linear, f32 accumulation, bf16 output (F.linear on bf16; wo_a groups, ratio-1 compressor,
 * indexer weights_proj/wk).  x bf16 [M, ldx], w bf16 [N, ldw], y bf16 [M, ldy]. */
void di_cpu_linear_bf16(di_threadpool *tp, int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t ldx,
                        const uint16_t *w, int64_t ldw, uint16_t *y, int64_t ldy);

/* The same product kept in f32: the reference's f32(x)·f32(W)ᵀ for the router, the ratio-2
 * compressor (wkv, wgate), the LM head and the DSpark confidence head — bf16 inputs widened to f32
 * give exact products, so it is the same kernel.  y f32 [M, ldy]. */
void di_cpu_linear_bf16_f32(di_threadpool *tp, int64_t M, int64_t N, int64_t K, const uint16_t *x,
                            int64_t ldx, const uint16_t *w, int64_t ldw, float *y, int64_t ldy);

/* Grouped low-rank output projection (spec §3.4 step 9): group g maps heads [g·hpg, (g+1)·hpg)
 * (in_per_group = hpg·head_dim values) to rank outputs with rows [g·rank, (g+1)·rank) of wo_a.
 *   o    bf16 [M, n_groups·in_per_group]    (attention output after inverse RoPE)
 *   wo_a bf16 [n_groups·rank, in_per_group] (dequantized at load, di_cpu_dequant_fp8_bf16)
 *   out  bf16 [M, n_groups·rank] */
void di_cpu_wo_a_grouped(di_threadpool *tp, int64_t M, int n_groups, int64_t in_per_group, int64_t rank,
                         const uint16_t *o, const uint16_t *wo_a, uint16_t *out);

/* bf16(e4m3 · scale) of a whole FP8 block-scaled matrix (exact; convert.py does this for wo_a).
 *   w e4m3 [rows, cols], scale E8M0 [ceil(rows/32), ceil(cols/32)], out bf16 [rows, cols]. */
void di_cpu_dequant_fp8_bf16(int64_t rows, int64_t cols, const uint8_t *w, const uint8_t *scale, uint16_t *out);

/* ======================================================================================
 * Normalisation and rotary embedding
 * ====================================================================================== */

/* RMSNorm (spec §3.1): y = bf16(f32(w) · (x · 1/sqrt(mean(x²) + eps))), mean from an f64 sum.
 *   x bf16 [M, ldx], w bf16 [D], y bf16 [M, ldy]; y may equal x. V4.1 uses eps = 1e-20. */
void di_cpu_rmsnorm(int64_t M, int64_t D, const uint16_t *x, int64_t ldx, const uint16_t *w, float eps,
                    uint16_t *y, int64_t ldy);

/* RoPE frequency table (precompute_freqs_cis), f32 exactly as the reference computes it:
 * ω_i = 1 / f32(base^(2i/dim)); with YaRN (original_seq_len > 0) the band between the corrected
 * dims of beta_fast and beta_slow is ramped from ω_i to ω_i / factor. */
typedef struct di_rope_params {
    int rope_dim;             /* rotated channels per head (64 in V4.1), even */
    double base;              /* rope_theta (10000) or compress_rope_theta (160000) */
    int64_t original_seq_len; /* 0 = plain RoPE; 65536 = YaRN as in V4.1 */
    double factor;            /* rope_factor (16) */
    double beta_fast;         /* 32 */
    double beta_slow;         /* 1 */
} di_rope_params;

/* freqs f32 [rope_dim/2]. */
void di_cpu_rope_freqs(const di_rope_params *p, float *freqs);

/* cos/sin of the f32 angle f32(pos)·ω_i (the reference's table row for `pos`).
 *   freqs f32 [n_pairs], cos/sin f32 [n_pairs]. */
void di_cpu_rope_cos_sin(const float *freqs, int n_pairs, int64_t pos, float *cos_out, float *sin_out);

/* Rotate interleaved pairs (x[2i], x[2i+1]) of the rope channels in place: each pair is a complex
 * number multiplied in f32 by cis(angle) (or its conjugate when `inverse`), rounded to bf16.
 *   x      bf16, token t head h at x + t·tok_stride + h·head_stride; the rope channels are
 *          [rope_off, rope_off + 2·n_pairs) of each head (the LAST rope_dim channels in V4.1)
 *   pos    int64 [n_tok] absolute position per token
 *   freqs  f32 [n_pairs] (any n_pairs; the cos/sin table is built DI_ROPE_MAX_PAIRS pairs at a time) */
#define DI_ROPE_MAX_PAIRS 128
void di_cpu_rope_apply(int64_t n_tok, int n_heads, uint16_t *x, int64_t tok_stride, int64_t head_stride,
                       int rope_off, int n_pairs, const int64_t *pos, const float *freqs, int inverse);

/* ======================================================================================
 * MoE: router, SwiGLU, expert combine, whole FFN
 * ====================================================================================== */

/* Router (spec §3.7, §4.5) from f32 logits ℓ (di_cpu_linear_bf16_f32 of x and gate.weight):
 * σ = sqrt(softplus(ℓ / gate_temp)); choose top_k of σ + bias (bias_vl for rows with
 * image_mask[m] != 0); weights σ[id] / (Σ + 1e-20) (when top_k > 1), × route_scale.
 * Tie rule (documented, deterministic): higher σ + bias first, then LOWER expert id first.
 * Output order is that selection order (descending biased score, like torch.topk sorted).
 *   logits f32 [M, n_exp]; bias/bias_vl f32 [n_exp] (bias_vl, image_mask may be NULL)
 *   ids int32 [M, top_k], weights f32 [M, top_k]; top_k ≤ n_exp, top_k ≤ DI_ROUTER_MAX_TOPK */
#define DI_ROUTER_MAX_TOPK 64
void di_cpu_router(int64_t M, int n_exp, const float *logits, const float *bias, const float *bias_vl,
                   const uint8_t *image_mask, float gate_temp, int top_k, float route_scale, int32_t *ids,
                   float *weights);

/* SwiGLU of one expert (spec §3.7 step 4): g = f32(gate), u = f32(up); with limit > 0:
 * u = clamp(u, ±limit), g = min(g, limit); a = silu(g)·u; a = row_weight[m]·a (routing weight,
 * before w2; row_weight may be NULL for the shared expert); out = bf16(a).
 *   gate bf16 [M, ldg], up bf16 [M, ldu], row_weight f32 [M], out bf16 [M, ldo] (I columns). */
void di_cpu_swiglu(int64_t M, int64_t I, const uint16_t *gate, int64_t ldg, const uint16_t *up, int64_t ldu,
                   const float *row_weight, float limit, uint16_t *out, int64_t ldo);

/* acc[rows[r], :] += f32(expert_out[r, :]) for r in [0, n_rows) — one expert's contribution.
 * Call it for experts in ascending id, then the shared expert via di_cpu_moe_finish.
 *   rows int32 [n_rows] (token index), expert_out bf16 [n_rows, D], acc f32 [M, D] */
void di_cpu_moe_accumulate(int64_t n_rows, int64_t D, const int32_t *rows, const uint16_t *expert_out,
                           float *acc);
/* The moe_routed slot (backend.h) for the CPU backends (moe_routed.c): the host-planned expert loop
 * over the backend's own gather_rows / linear_fp4 / swiglu / scatter_add_rows slots, so the FAST and
 * SCALAR variants each use their own kernels. */
int di_cpu_moe_routed(const di_backend *be, const uint16_t *x, int64_t m, int64_t d, int64_t inter, const int32_t *ids,
                      const float *weights, int k, int n_exp, const di_moe_expert *experts, float lim, float *acc,
                      di_error *err);
/* out = bf16(acc + f32(shared)).  acc f32 [M, D], shared bf16 [M, D], out bf16 [M, D]. */
void di_cpu_moe_finish(int64_t M, int64_t D, const float *acc, const uint16_t *shared, uint16_t *out);

/* Weights of one FP4 routed expert as stored: w1/w3 [I, D/2] + [I, D/32], w2 [D, I/2] + [D, I/32]. */
typedef struct di_cpu_expert_fp4 {
    const uint8_t *w1, *s1, *w3, *s3, *w2, *s2;
} di_cpu_expert_fp4;
/* The FP8 shared expert: w1/w3 [I, D] + [I/32, D/32], w2 [D, I] + [D/32, I/32]. */
typedef struct di_cpu_expert_fp8 {
    const uint8_t *w1, *s1, *w3, *s3, *w2, *s2;
} di_cpu_expert_fp8;

/* Workspace of di_cpu_moe_ffn. */
size_t di_cpu_moe_workspace(int64_t M, int64_t D, int64_t I, const di_threadpool *tp);

/* The whole routed + shared FFN for M tokens, in the reference order (spec §3.7 steps 4–6):
 * for each expert e = 0..n_exp−1 with tokens: gather its rows, y_e = w2(swiglu(w1 x, w3 x)·w_e),
 * acc += y_e; then acc += shared(x); out = bf16(acc).
 *   x bf16 [M, D]; ids int32 [M, top_k], weights f32 [M, top_k] from di_cpu_router;
 *   experts [n_exp] (entries of experts nobody routes to may be all-NULL); out bf16 [M, D].
 * Errors: an id outside [0, n_exp) or repeated within a token, a NULL weight of a used expert, D or
 * I not a multiple of 32, a short workspace. */
int di_cpu_moe_ffn(di_threadpool *tp, int64_t M, int64_t D, int64_t I, const uint16_t *x, const int32_t *ids,
                   const float *weights, int top_k, int n_exp, const di_cpu_expert_fp4 *experts,
                   const di_cpu_expert_fp8 *shared, float swiglu_limit, uint16_t *out, void *ws, size_t ws_bytes,
                   di_error *err);

/* ======================================================================================
 * Engram (spec §4.3 steps 2–6)
 * ====================================================================================== */

/* N-gram windows: tokens[t, i] = compressed id of position p_t − i (i = 0..G−1), or pad_id for
 * that and every further lookback once a lookback reaches a blocked entry (before the sequence
 * start or an image-span token). pad_id is the COMPRESSED id of the pad token
 * (token_map[engram_pad_id], `pad_compressed_id` in engram_token_map.safetensors).
 *   hist int64 [n + G − 1]: entry j is the compressed id of position p0 − (G−1) + j; any negative
 *        value marks a blocked position. tokens int64 [n, G]. */
void di_cpu_engram_ngrams(int64_t n, int G, const int64_t *hist, int64_t pad_id, int64_t *tokens);

/* Hash → row ids of one Engram layer: r_0 = t_0·μ_0, r_i = r_{i−1} XOR t_i·μ_i (int64);
 * ids[t, (i−1)·H + h] = (r_i mod P[i−1][h]) + off[(i−1)·H + h] for i = 1..G−1, h = 0..H−1
 * (Python floor modulo; the products cannot overflow for valid ids and multipliers).
 *   tokens int64 [n, G], mult int64 [G], primes int64 [(G−1)·H], offsets int64 [(G−1)·H],
 *   ids int64 [n, (G−1)·H]. */
void di_cpu_engram_hash(int64_t n, int G, int n_heads, const int64_t *tokens, const int64_t *mult,
                        const int64_t *primes, const int64_t *offsets, int64_t *ids);

/* Row gather + FP8 dequant: out[t, c·dim + j] = bf16(e4m3(E[id, j]) · 2^(S[id, j/32] − 127)).
 *   ids int64 [n, n_cols], table e4m3 [rows, dim], scale E8M0 [rows, dim/32], out bf16 [n, n_cols·dim].
 * Errors: an id outside [0, rows), dim % 32 != 0. */
int di_cpu_engram_gather(int64_t n, int n_cols, const int64_t *ids, const uint8_t *table, const uint8_t *scale,
                         int64_t rows, int dim, uint16_t *out, di_error *err);

/* f32(q_weight) · f32(k_weight), the only form in which the two are used.  q, k bf16 [hc, D],
 * wq f32 [hc, D]. */
void di_cpu_engram_gate_weight(int64_t n, const uint16_t *q, const uint16_t *k, float *wq);

/* Gate and update of the hc residual streams (spec §4.3 steps 5–6), in place:
 * dot_s = Σ_j (X_s[j]·wq_s[j])·key_s[j] · rsqrt(mean X_s² + eps)·rsqrt(mean key_s² + eps) · D^−½;
 * gate_s = sigmoid(sign(dot_s)·sqrt(max(|dot_s|, 1e-6))), 0 where token_mask[t] == 0;
 * X_s = bf16(X_s + gate_s · value).
 *   X bf16 [n, hc, D]; kv bf16 [n, (hc+1)·D] (key of stream s at s·D, value at hc·D);
 *   wq f32 [hc, D]; token_mask uint8 [n] or NULL. */
void di_cpu_engram_gate(int64_t n, int hc, int64_t D, uint16_t *X, const uint16_t *kv, const float *wq, float eps,
                        const uint8_t *token_mask);

/* ======================================================================================
 * Embedding
 * ====================================================================================== */

/* out[t] = table[ids[t]].  table bf16 [vocab, D], out bf16 [n, D]. Errors: id outside [0, vocab). */
int di_cpu_embed(int64_t n, const int32_t *ids, const uint16_t *table, int64_t vocab, int64_t D, uint16_t *out,
                 di_error *err);

/* Stream expansion: X[t, s, :] = e[t, :] for s < hc.  e bf16 [n, D], X bf16 [n, hc, D]. */
void di_cpu_expand_streams(int64_t n, int hc, int64_t D, const uint16_t *e, uint16_t *X);

/* Cache row codecs (backend.h di_row_codec; row_codec.c): one row of d values.
 *   x bf16 [d];  row uint8 [di_row_codec_bytes(codec, d)];  y bf16 [d] */
void di_cpu_row_encode(di_row_codec codec, const uint16_t *x, int64_t d, uint8_t *row);
void di_cpu_row_decode(di_row_codec codec, const uint8_t *row, int64_t d, uint16_t *y);

#endif
