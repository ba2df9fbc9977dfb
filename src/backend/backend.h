/* The backend-neutral op interface: every op the V4.1 block graph (src/model/forward*.c) calls, as one
 * table of function pointers. The CPU backend (src/backend/cpu/backend_cpu.c) is the reference; a
 * CUDA backend fills the same table with device kernels and is tested op by op against it.
 *
 * Rules every op follows:
 *  - All buffers are owned by the caller and live where the backend computes (host memory for the
 *    CPU backend, device memory for CUDA): callers get such memory, and move data in and out of it,
 *    only through the memory slots below. No op allocates; ops that need scratch take `ws` and
 *    document its size.
 *  - Shapes are explicit arguments; layouts are dense row-major, innermost dimension last.
 *    bf16 values travel as uint16_t bit patterns, FP8/E8M0/FP4 codes as uint8_t.
 *  - Numerics are the reference's (spec model.md §4–§5): the comment of each op names the rounding
 *    points. A row's result never depends on how many rows are in the call (batch invariance):
 *    reductions run in a fixed order per output element.
 *  - Every op returns DI_OK or a di_status with a message in *err (bad shape or argument).
 *
 * Weight formats (spec §2.2): FP8 = e4m3 codes [n, k] + E8M0 scales [ceil(n/32), ceil(k/32)];
 * FP4 = packed E2M1 bytes [n, k/2] (low nibble = even column) + E8M0 scales [n, k/32]. */
#ifndef DI_BACKEND_BACKEND_H
#define DI_BACKEND_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "deepinfer.h"

typedef struct di_backend di_backend;

/* Compact row forms of the per-sequence caches (model/cache.h), one row = codes then scales:
 *   FP8_E8M0   [d e4m3 | d/32 E8M0]       window rows (act_quant, power-of-two scale per 32)
 *   FP4_E4M3   [d/2 packed E2M1 | d/16 E4M3]  compressed KV (scale e4m3(amax/6) per 16)
 *   FP4_E8M0   [d/2 packed E2M1 | d/32 E8M0]  index keys (power-of-two scale per 32)
 * Encoding is io/formats.h's quantizer of the group; decoding is bf16(f32(code) · f32(scale)), the
 * reference's QDQ value bit for bit (cache_rows.c explains why the product is exact). */
typedef enum di_row_codec { DI_CODEC_FP8_E8M0 = 0, DI_CODEC_FP4_E4M3 = 1, DI_CODEC_FP4_E8M0 = 2 } di_row_codec;

static inline int di_row_codec_group(di_row_codec c) { return c == DI_CODEC_FP4_E4M3 ? 16 : 32; }
/* Bytes of one encoded row of d values (d a multiple of the group). */
static inline int64_t di_row_codec_bytes(di_row_codec c, int64_t d) {
    return (c == DI_CODEC_FP8_E8M0 ? d : d / 2) + d / di_row_codec_group(c);
}

/* One routed expert's MXFP4 weights for the moe_routed slot, as backend pointers (NULL where the
 * expert has none: a token routed to it is refused by the CPU backend). */
typedef struct di_moe_expert {
    const uint8_t *w1, *s1; /* gate proj: E2M1 [inter, d/2], E8M0 [inter, d/32] */
    const uint8_t *w3, *s3; /* up proj:   E2M1 [inter, d/2], E8M0 [inter, d/32] */
    const uint8_t *w2, *s2; /* down proj: E2M1 [d, inter/2], E8M0 [d, inter/32] */
} di_moe_expert;
/* moe_routed limits: a step of at most this many (token, slot) pairs, and experts per layer (the CUDA
 * backend passes the expert table by value as a kernel parameter, ≤ 32 KiB) */
#define DI_MOE_ROUTED_MAX_PAIRS 2048
#define DI_MOE_ROUTED_MAX_EXPERTS 384

/* The host plan of a prefill step's routed experts (moe_grouped): the (token, slot) pairs with a valid
 * expert listed expert by expert (ascending id), an expert's pairs in ascending (token, slot) order. */
typedef struct di_moe_plan {
    int64_t n;              /* listed rows */
    const int64_t *start_h; /* int64 [n_exp + 1] HOST: expert e's rows are [start_h[e], start_h[e+1]); 0 … n */
    const int64_t *start;   /* int64 [n_exp + 1] the same values in backend memory */
    const int32_t *rows;    /* int32 [n] backend: the token of each row */
    const float *roww;      /* f32 [n] backend: its routing weight */
    const int32_t *rank;    /* int32 [m, k] backend: the row of pair (t, j), −1 for a pair not listed */
} di_moe_plan;

/* moe_grouped scratch: bf16 [n, d] (gathered rows, later the expert outputs) and three bf16 [n, inter]
 * (gate, up, SwiGLU), each rounded up to 256 bytes. */
static inline size_t di_moe_grouped_ws_bytes(int64_t n, int64_t d, int64_t inter) {
    size_t rows = ((size_t)(n * d) * 2 + 255) & ~(size_t)255, mid = ((size_t)(n * inter) * 2 + 255) & ~(size_t)255;
    return rows + 3 * mid;
}
/* One sequence's key set and index lists in a batched sparse attention (sparse_attn_seqs; backend memory,
 * pointers into it): its query rows are [q0, q0 + m) of the call, row q0 + t attends [kv_win ‖ kv_cmp]
 * at idx[t·n_idx … (t+1)·n_idx) (sparse_attn's arguments for that sequence). */
typedef struct di_attn_seq {
    const uint16_t *kv_win; /* bf16 [n_win, d] */
    int64_t n_win;
    const uint16_t *kv_cmp; /* bf16 [n_cmp, d] or NULL */
    int64_t n_cmp;
    const int32_t *idx;     /* int32 [m, n_idx] (−1 = skip) */
    int64_t n_idx;
    int64_t q0, m;
} di_attn_seq;

/* One sequence's chunk in a batched compressor pooling (compress_pool_seqs; backend memory): its tokens
 * are positions [start_pos, start_pos + m), rows [row0, row0 + m) of the call's projections; the entries
 * it completes are rows [out0, …) of the output; state is its cache's ring (compress_pool_ring). */
typedef struct di_pool_seq {
    float *state; /* f32 [n_blocks, 2, R, d] */
    int64_t start_pos, m, row0, out0;
} di_pool_seq;

/* One query row of a batched index selection (indexer_scores_rows, candidate_mask_rows, topk_rows;
 * backend memory, pointers into it). The row is what the per-sequence op sees when called on that row
 * alone: its sequence's keys and candidate row, its own width, visible count and k.
 * The keys are either decoded (keys) or read where the cache keeps them (keys NULL, kbase set): rows of
 * the index-key codec (DI_CODEC_FP4_E8M0, hd values), entry e at row e of kbase or, paged, at row
 * kpages[e / kpage_entries]·kpage_rows + krow0 + e mod kpage_entries (gather_topk's translation); an
 * entry ≥ kn (not written yet: a prompt chunk's rows are as wide as its prompt) reads entry kn − 1.
 * The scores are then those of keys = row_decode of the same rows, bit for bit, without the decoded
 * copy or an address per key. */
typedef struct di_index_row {
    const uint16_t *keys; /* bf16 [nk, hd] its sequence's index keys, or NULL (kbase) */
    const uint8_t *kbase; /* uint8 [*, di_row_codec_bytes(FP4_E8M0, hd)] its cache's index-key rows */
    const int32_t *kpages; /* int32 [ceil(kn / kpage_entries)] the cache's block table, or NULL */
    int64_t kpage_entries, kpage_rows, krow0;
    int32_t kn;           /* entries written (≥ 1 where kbase is set) */
    const uint8_t *cand;  /* uint8 [nk] its candidate row, or NULL (no mask) */
    int64_t s0;           /* its scores f32 [nk] at scores + s0; its candidate mask uint8 [w] at mask + s0 */
    int64_t o0;           /* its top-k list int32 [kp] at out + o0 */
    int32_t nk;           /* keys scored (the per-sequence call's row width) */
    int32_t w;            /* selection width ≤ nk: scores [0, w) compete (the selection call's nk) */
    int32_t vis;          /* entries visible, ≤ w */
    int32_t k, kp;        /* top-k, k ≤ w; its list is −1 padded from k to kp */
} di_index_row;

/* One sequence of a batched gather_topk (gather_topk_seqs; backend memory): gather_topk's arguments
 * for that sequence. */
typedef struct di_gather_seq {
    const uint8_t *base;   /* uint8 [*, row bytes] its compressed-KV rows */
    const int32_t *pages;  /* int32 [ceil(n_entries / page_entries)] or NULL */
    const int32_t *top;    /* int32 [m, k] */
    uint16_t *rows;        /* bf16 [m·k, d] out */
    int32_t *idx;          /* int32 [m, ldi] out (columns [0, k) of each row) */
    int64_t n_entries, page_entries, page_rows, row_off, m, ldi;
    int32_t k, row0;
} di_gather_seq;

/* Fault injection for the mutation tests (tests/test_verify.c). Off (all zero) in every normal run;
 * a backend honours the switches that live inside its ops, the graph honours the others
 * (forward.h: di_graph_faults). Each reproduces one plausible porting bug so the tests can prove
 * that `deepinfer verify` catches it. */
typedef struct di_op_faults {
    bool rope_half_split;  /* rotate pairs (i, i + r/2) instead of interleaved (2i, 2i+1) */
    bool fp4_nibble_swap;  /* read the FP4 expert bytes with high/low nibbles exchanged */
} di_op_faults;

struct di_backend {
    const char *name;   /* "cpu" */
    di_op_faults faults; /* test-only; zero-initialised */
    void *impl;          /* backend private state (thread pool, streams) */
    /* Frees impl and the table itself; di_backend_destroy dispatches here so callers never need to
     * know which backend they hold. */
    void (*destroy)(di_backend *be);

    /* ---------------- memory ---------------- */

    /* Backend memory is where the ops compute: host memory for the CPU backend (these slots are
     * calloc / free / memcpy there), device memory for CUDA. The block graph and the caches reach it
     * only through these slots and the ops, so one graph serves every backend. Transfers are ordered
     * with the ops issued before them; a download returns once the bytes are on the host, an upload
     * once the host buffer may be reused.
     *   mem_alloc: zero-filled, 64-byte aligned, NULL (err set) on failure; bytes 0 gives a valid block
     *   mem_map_host: a view of read-only host memory the ops can read (the mmapped Engram tables):
     *   the pointer itself on the CPU; mem_unmap_host releases what mem_map_host set up */
    bool host_memory; /* backend memory is host memory (host views can be passed to the ops as is) */
    void *(*mem_alloc)(const di_backend *be, size_t bytes, di_error *err);
    void (*mem_free)(const di_backend *be, void *p);
    int (*mem_upload)(const di_backend *be, void *dst, const void *src, size_t bytes, di_error *err);
    int (*mem_download)(const di_backend *be, void *dst, const void *src, size_t bytes, di_error *err);
    int (*mem_copy)(const di_backend *be, void *dst, const void *src, size_t bytes, di_error *err);
    int (*mem_set)(const di_backend *be, void *dst, int byte, size_t bytes, di_error *err);
    int (*mem_map_host)(const di_backend *be, const void *host, size_t bytes, const void **view, di_error *err);
    void (*mem_unmap_host)(const di_backend *be, const void *host, const void *view);

    /* ---------------- cache row codecs (model/cache.h) ---------------- */

    /* rows[i] = encode(x[i]).  x bf16 [n, d];  rows uint8 [n, di_row_codec_bytes(codec, d)] */
    int (*row_encode)(const di_backend *be, di_row_codec codec, const uint16_t *x, int64_t n, int64_t d, uint8_t *rows,
                      di_error *err);
    /* y[i] = decode(rows[ids ? ids[i] : i]); ids[i] < 0 gives a zero row (ids are not range-checked:
     * the caller validated them on the host).  ids int32 [n] or NULL;  y bf16 [n, d] */
    int (*row_decode)(const di_backend *be, di_row_codec codec, const uint8_t *rows, const int32_t *ids, int64_t n,
                      int64_t d, uint16_t *y, di_error *err);

    /* ---------------- GEMMs: y = x · Wᵀ ---------------- */

    /* FP8 block-scaled linear (§5.2): per row, x is act-quantized in groups of 32 (power-of-two E8M0
     * scale, e4m3 codes); each 32-wide K block's code products are summed in f32, scaled by
     * s_x·s_w and accumulated in ascending K order; the result is rounded to bf16.
     *   x bf16 [m, k] (k % 32 == 0);  w e4m3 [n, k];  ws E8M0 [ceil(n/32), k/32];  y bf16 [m, n] */
    int (*linear_fp8)(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint8_t *w,
                      const uint8_t *ws, int64_t n, uint16_t *y, di_error *err);

    /* MXFP4 expert linear: the same activation quantization; weights E2M1 with one E8M0 scale per 32
     * along K.  x bf16 [m, k];  w packed [n, k/2];  ws E8M0 [n, k/32];  y bf16 [m, n] */
    int (*linear_fp4)(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint8_t *w,
                      const uint8_t *ws, int64_t n, uint16_t *y, di_error *err);

    /* bf16 linear (indexer wk / weights_proj, ratio-1 compressor): f32 accumulation, bf16 out.
     *   x bf16 [m, k];  w bf16 [n, k];  y bf16 [m, n] */
    int (*linear_bf16)(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w,
                       int64_t n, uint16_t *y, di_error *err);

    /* f32 linear on upcast operands (ratio-2 compressor wkv/wgate, router, LM head): f32(x)·f32(W)ᵀ.
     *   x bf16 [m, k];  w bf16 [n, k];  y f32 [m, n] */
    int (*linear_f32)(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w,
                      int64_t n, float *y, di_error *err);

    /* Grouped low-rank output projection wo_a (§3.4 step 9): y[t,g] = bf16(x[t,g] · W[g]ᵀ), f32 acc.
     *   x bf16 [m, g, k];  w bf16 [g, r, k] (wo_a dequantized at load);  y bf16 [m, g, r] */
    int (*linear_grouped_bf16)(const di_backend *be, const uint16_t *x, int64_t m, int g, int64_t k,
                               const uint16_t *w, int64_t r, uint16_t *y, di_error *err);

    /* ---------------- elementwise / normalization ---------------- */

    /* RMSNorm: y = bf16(f32(w) · (f32(x) · rsqrt(mean(f32(x)²) + eps))).
     *   x bf16 [m, n];  w bf16 [n];  y bf16 [m, n] (may alias x) */
    int (*rmsnorm)(const di_backend *be, const uint16_t *x, int64_t m, int64_t n, const uint16_t *w, float eps,
                   uint16_t *y, di_error *err);

    /* Partial RoPE on the LAST `rd` channels of every head vector, interleaved pairs (2i, 2i+1) as
     * complex numbers times cis(f32(pos)·freqs[i]) in f32 (conjugate when inverse), rounded to bf16
     * in place. The angle is the f32 product, as the reference's table (spec §5.4).
     *   x bf16 [m, nh, d];  pos int64 [m] (row positions);  freqs f32 [rd/2] (the layer's table, YaRN
     *   applied; model/forward.h di_rope_freqs) */
    int (*rope)(const di_backend *be, uint16_t *x, int64_t m, int nh, int d, int rd, const int64_t *pos,
                const float *freqs, bool inverse, di_error *err);

    /* Simulated quantization in place (cache values, indexer q/k), spec §4.1, §5.2:
     *   fp8:       e4m3 with power-of-two E8M0 scales per `group`
     *   fp4_e8m0:  E2M1 with power-of-two scales per `group` (index q/k; 32)
     *   fp4_e4m3:  E2M1 with E4M3 scales per `group` (compressed KV; 16)
     *   x bf16 [m, n], n % group == 0 */
    int (*qdq_fp8)(const di_backend *be, uint16_t *x, int64_t m, int64_t n, int group, di_error *err);
    int (*qdq_fp4_e8m0)(const di_backend *be, uint16_t *x, int64_t m, int64_t n, int group, di_error *err);
    int (*qdq_fp4_e4m3)(const di_backend *be, uint16_t *x, int64_t m, int64_t n, int group, di_error *err);

    /* Embedding gather: y[t] = table[ids[t]].  table bf16 [vocab, d];  ids int32 [m];  y bf16 [m, d] */
    int (*embed)(const di_backend *be, const uint16_t *table, int64_t vocab, int64_t d, const int32_t *ids,
                 int64_t m, uint16_t *y, di_error *err);

    /* ---------------- mHC (§3.3, §4.2) ---------------- */

    /* mixes[t] = (fn · xf)·rsqrt(mean(xf²) + eps), xf = f32(flatten(x[t])) (plain f32 GEMM).
     *   x bf16 [m, hc, d];  fn f32 [(2+hc)·hc, hc·d];  mixes f32 [m, (2+hc)·hc] */
    int (*hc_mixes)(const di_backend *be, const uint16_t *x, int64_t m, int hc, int64_t d, const float *fn,
                    float eps, float *mixes, di_error *err);
    /* Split + Sinkhorn (reference hc_split_sinkhorn, `iters` total iterations, 20 in V4.1).
     *   mixes f32 [m, (2+hc)·hc];  scale f32 [3];  base f32 [(2+hc)·hc]
     *   pre f32 [m, hc];  post f32 [m, hc];  comb f32 [m, hc, hc] (row = source stream) */
    int (*hc_sinkhorn)(const di_backend *be, const float *mixes, int64_t m, int hc, const float *scale,
                       const float *base, int iters, float eps, float *pre, float *post, float *comb,
                       di_error *err);
    /* Collapse: y[t] = bf16(Σ_k pre[t,k]·f32(x[t,k])).  x bf16 [m, hc, d];  pre f32 [m, hc];  y bf16 [m, d] */
    int (*hc_collapse)(const di_backend *be, const uint16_t *x, const float *pre, int64_t m, int hc, int64_t d,
                       uint16_t *y, di_error *err);
    /* Expand: y[t,k] = bf16(post[t,k]·f32(z[t]) + Σ_j comb[t,j,k]·f32(x[t,j])).
     *   z bf16 [m, d];  x bf16 [m, hc, d];  post f32 [m, hc];  comb f32 [m, hc, hc];  y bf16 [m, hc, d]
     *   (y may alias x) */
    int (*hc_expand)(const di_backend *be, const uint16_t *z, const uint16_t *x, const float *post,
                     const float *comb, int64_t m, int hc, int64_t d, uint16_t *y, di_error *err);

    /* ---------------- compressed KV and indexer (§4.4) ---------------- */

    /* Streaming softmax pooling (ratio R ≥ 2, spec §3.5, §4.4) over the carry state of ONE group:
     * tokens at positions start_pos … start_pos+m−1 (all in group ⌊start_pos/R⌋) write their
     * projections into slot pos mod R of the state; the token that completes the group pools it:
     * κ[j] = bf16(Σ_slots softmax(score[·,j])·kv[·,j]) in f32 (slots ascending). The reference pools a
     * prefill directly and decode from its state; the f32 values and operations are the same, so one
     * streaming path serves a prefill, a chunk and a decode step. The caller splits a chunk at group
     * boundaries (the per-sequence cache keeps one state block per group, for exact rollback).
     *   a, gate f32 [m, d];  kv_state, score_state f32 [R, d] (in/out)
     *   y bf16 [1, d] (written when the group completes);  *n_out = entries written (0 or 1) */
    int (*compress_pool)(const di_backend *be, const float *a, const float *gate, int64_t m, int64_t start_pos,
                         int ratio, int64_t d, float *kv_state, float *score_state, uint16_t *y, int64_t *n_out,
                         di_error *err);

    /* Index scores (bf16 arithmetic as the reference): w'_h = bf16(f32(w_h)·w_scale) (the reference
     * scales the bf16 weights_proj output by index_head_dim^-0.5 · n_heads^-0.5, a Python double
     * applied in f32), score = bf16(Σ_h bf16(relu(bf16(q_h·k))·w'_h)), −inf where n ≥ vis[i] or
     * (cand && !cand[i,n]).
     *   q bf16 [m, nh, hd];  w bf16 [m, nh];  k bf16 [nk, hd];  vis int32 [m];  cand uint8 [m, nk] or NULL
     *   scores f32 [m, nk] (bf16-exact values) */
    int (*indexer_scores)(const di_backend *be, const uint16_t *q, const uint16_t *w, float w_scale,
                          const uint16_t *k, int64_t m, int nh, int hd, int64_t nk, const int32_t *vis,
                          const uint8_t *cand, float *scores, di_error *err);

    /* Two-level candidate mask (§4.4): blocks of `block` entries scored by their max, the block of the
     * newest visible entry pinned, the best min(topk_blocks, n_blocks) finite blocks kept.
     *   scores f32 [m, nk];  vis int32 [m];  mask uint8 [m, nk] out;  ws f32 [ceil(nk/block)] */
    int (*candidate_mask)(const di_backend *be, const float *scores, int64_t m, int64_t nk, const int32_t *vis,
                          int block, int topk_blocks, uint8_t *mask, float *ws, di_error *err);

    /* Top-k of index scores, ascending position order, + offset, −1 padded (positions ≥ vis[i]).
     * Ties (common: exact-zero scores, bf16 near-ties) are implementation-defined in the reference
     * (torch.topk, spec §5.6); each backend documents its rule. The CPU backend replays torch's CPU
     * selection exactly (graph_extra_topk.c), so it picks the reference's set on every golden row.
     *   scores f32 [m, nk];  vis int32 [m];  out int32 [m, k] */
    int (*topk)(const di_backend *be, const float *scores, int64_t m, int64_t nk, const int32_t *vis, int k,
                int32_t offset, int32_t *out, di_error *err);

    /* ---------------- attention (§3.4, §4.1) ---------------- */

    /* Sparse single-KV-head attention with sink over [kv_win ‖ kv_cmp] at the listed indices, in
     * blocks of 64 with the probabilities rounded to bf16 before PV (reference kernel).
     *   q bf16 [m, nh, d];  kv_win bf16 [n_win, d];  kv_cmp bf16 [n_cmp, d] or NULL;  sink f32 [nh]
     *   idx int32 [m, n_idx] (−1 = skip);  out bf16 [m, nh, d] */
    int (*sparse_attn)(const di_backend *be, const uint16_t *q, int64_t m, int nh, int d, const uint16_t *kv_win,
                       int64_t n_win, const uint16_t *kv_cmp, int64_t n_cmp, const float *sink,
                       const int32_t *idx, int64_t n_idx, float scale, uint16_t *out, di_error *err);

    /* ---------------- MoE (§3.7, §4.5) ---------------- */

    /* Router: σ = sqrt(softplus(logits/temp)) (f32, logits = f32 GEMM), experts = top-k of σ + bias
     * (first index on ties), weights = σ[experts] / (Σ + 1e-20) (when k > 1 and normalize) × scale.
     *   logits f32 [m, n_exp] (from linear_f32);  bias f32 [n_exp]
     *   ids int32 [m, k];  weights f32 [m, k] */
    int (*router)(const di_backend *be, const float *logits, int64_t m, int n_exp, const float *bias, float temp,
                  int k, bool normalize, float scale, int32_t *ids, float *weights, di_error *err);

    /* SwiGLU with clamp: a = bf16(w_row · silu(min(g, lim)) · clamp(u, −lim, lim)) in f32 (no clamp when
     * lim ≤ 0; w_row = 1 when row_w is NULL).
     *   g, u bf16 [m, n];  row_w f32 [m] or NULL;  a bf16 [m, n] */
    int (*swiglu)(const di_backend *be, const uint16_t *g, const uint16_t *u, int64_t m, int64_t n,
                  const float *row_w, float lim, uint16_t *a, di_error *err);

    /* Row gather / scatter-accumulate for expert dispatch:
     *   gather:      y[i] = x[rows[i]]                 x bf16 [*, d];  rows int32 [m];  y bf16 [m, d]
     *   scatter_add: acc[rows[i]] += f32(y[i])         y bf16 [m, d];  acc f32 [*, d]
     *   (experts are applied in ascending id order by the caller, so each row's f32 sum has the
     *   reference's order: routed experts ascending, shared expert last) */
    int (*gather_rows)(const di_backend *be, const uint16_t *x, int64_t d, const int32_t *rows, int64_t m,
                       uint16_t *y, di_error *err);
    int (*scatter_add_rows)(const di_backend *be, const uint16_t *y, int64_t d, const int32_t *rows, int64_t m,
                            float *acc, di_error *err);
    /* Routed experts of a small step without a host round trip (decode, DSpark verify): every
     * (token t, slot j) with expert e = ids[t,j] computes a = swiglu(x_t·W1_eᵀ, x_t·W3_eᵀ) with row
     * weight weights[t,j] and limit lim, then y = a·W2_eᵀ (the linear_fp4 and swiglu contracts, each
     * row on its own); acc[t] = 0 + Σ f32(y) over the token's slots in ascending (expert id, slot)
     * order — value for value the host-planned loop of gather_rows, linear_fp4 ×3, swiglu and
     * scatter_add_rows per expert in ascending id. A token may name an expert twice (both rows
     * count). The CPU backend refuses ids outside [0, n_exp) and experts without weights; the CUDA
     * backend, which does not read ids on the host, skips such slots.
     *   x bf16 [m, d];  ids int32 [m, k];  weights f32 [m, k];  experts [n_exp]: a HOST array of
     *   backend pointers (w1/w3 E2M1 [inter, d/2], w2 [d, inter/2], E8M0 scales [n, k/32]);
     *   acc f32 [m, d] (overwritten);  m·k ≤ DI_MOE_ROUTED_MAX_PAIRS, n_exp ≤ DI_MOE_ROUTED_MAX_EXPERTS */
    int (*moe_routed)(const di_backend *be, const uint16_t *x, int64_t m, int64_t d, int64_t inter,
                      const int32_t *ids, const float *weights, int k, int n_exp, const di_moe_expert *experts,
                      float lim, float *acc, di_error *err);
    /* y = bf16(x).  x f32 [n];  y bf16 [n];  and memset-style f32 zero fill. */
    int (*f32_to_bf16)(const di_backend *be, const float *x, int64_t n, uint16_t *y, di_error *err);
    int (*fill_f32)(const di_backend *be, float *x, int64_t n, float v, di_error *err);

    /* Stream mean (the DSpark target-layer feature, §4.6): y[t] = bf16((Σ_k f32(x[t,k])) / hc), the f32
     * sum in stream order then the division (torch's mean of a bf16 tensor).
     *   x bf16 [m, hc, d];  y bf16 rows of d values, row t at y + t·ldy (ldy ≥ d) */
    int (*stream_mean)(const di_backend *be, const uint16_t *x, int64_t m, int hc, int64_t d, uint16_t *y, int64_t ldy,
                       di_error *err);

    /* ---------------- Engram (§4.3) ---------------- */

    /* Row lookup of the FP8 table: y[t, c] = bf16(e4m3(table[ids[t,c]]) · 2^(scale−127) per 32).
     *   table e4m3 [rows, hd];  scale E8M0 [rows, hd/32];  ids int64 [m, n_cols];  y bf16 [m, n_cols·hd] */
    int (*engram_lookup)(const di_backend *be, const uint8_t *table, const uint8_t *scale, int64_t rows, int hd,
                         const int64_t *ids, int64_t m, int n_cols, uint16_t *y, di_error *err);
    /* Gate and add: per stream s, dot = Σ_j x_s[j]·(qw[s,j]·kw[s,j])·key_s[j] · rsqrt(mean x_s² + eps) ·
     * rsqrt(mean key_s² + eps) · d^-0.5; gate = sigmoid(sign(dot)·sqrt(max(|dot|, 1e-6)));
     * x_s ← bf16(f32(x_s) + gate·f32(value)).
     *   x bf16 [m, hc, d] in place;  kv bf16 [m, (hc+1)·d] (keys of the hc streams ‖ value)
     *   qw, kw bf16 [hc, d] */
    int (*engram_gate)(const di_backend *be, uint16_t *x, const uint16_t *kv, int64_t m, int hc, int64_t d,
                       const uint16_t *qw, const uint16_t *kw, float eps, di_error *err);

    /* ---------------- fused per-token chains (optional; NULL = the graph runs the ops above) -------------
     * Each is exactly the listed sequence of the ops above, with the same rounding points: a backend
     * implements one to save launches and round trips, never to change a bit (tests/cuda/test_cuda_fused.c). */

    /* The mHC chain in front of a sub-layer (§4.2), optionally after the previous sub-layer's expand:
     *   if z:  x ← hc_expand(z, x, post_in, comb_in)          (in place)
     *   mixes = hc_mixes(x, fn, norm_eps);  (pre, post, comb) = hc_sinkhorn(mixes, scale, base, iters, hc_eps)
     *   h = rmsnorm(hc_collapse(x, pre_in ? pre_in : pre), norm_w, norm_eps)
     *   x bf16 [m, hc, d] (in/out);  z bf16 [m, d] or NULL;  post_in f32 [m, hc];  comb_in f32 [m, hc, hc]
     *   fn f32 [(2+hc)·hc, hc·d];  scale f32 [3];  base f32 [(2+hc)·hc];  pre_in f32 [m, hc] or NULL
     *   norm_w bf16 [d];  mixes f32 [m, (2+hc)·hc] out;  pre, post f32 [m, hc] out;  comb f32 [m, hc, hc] out
     *   h bf16 [m, d] out. Outputs alias neither each other nor the inputs (x excepted). */
    int (*hc_pre)(const di_backend *be, uint16_t *x, const uint16_t *z, const float *post_in, const float *comb_in,
                  int64_t m, int hc, int64_t d, const float *fn, float norm_eps, const float *scale, const float *base,
                  int iters, float hc_eps, const float *pre_in, const uint16_t *norm_w, float *mixes, float *pre,
                  float *post, float *comb, uint16_t *h, di_error *err);

    /* The compressed entries a top-k selected, gathered where the ids are (no host round trip; §4.4):
     * rows[t·k + j] = row_decode(entry top[t,j]) and idx[t·ldi + j] = row0 + t·k + j, or a zero row and −1
     * where top[t,j] is −1 or outside [0, n_entries). Entry e is row e of `base`, or for a paged cache
     * row pages[e / page_entries]·page_rows + row_off + e mod page_entries.
     *   base uint8 [*, di_row_codec_bytes(codec, d)];  pages int32 [ceil(n_entries / page_entries)] or NULL
     *   top int32 [m, k];  rows bf16 [m·k, d] out;  idx int32 [m, ldi] out (columns [0, k) of each row) */
    int (*gather_topk)(const di_backend *be, di_row_codec codec, const uint8_t *base, int64_t n_entries,
                       const int32_t *pages, int64_t page_entries, int64_t page_rows, int64_t row_off,
                       const int32_t *top, int64_t m, int k, int64_t d, int32_t row0, uint16_t *rows, int32_t *idx,
                       int64_t ldi, di_error *err);

    /* ---------------- grouped expert FFN of a prefill step (optional; NULL = the graph's per-expert loop) -------
     * The routed experts of a step whose dispatch the host planned (di_moe_plan above): every listed row r
     * (token t = rows[r] of expert e, start_h[e] ≤ r < start_h[e+1]) computes a = swiglu(x_t·W1_eᵀ, x_t·W3_eᵀ)
     * with row weight roww[r] and limit lim, then y_r = a·W2_eᵀ (the linear_fp4 and swiglu contracts, each row
     * on its own); acc[t] = 0 + Σ f32(y_r) over the rows of t in ascending r, i.e. t's slots in ascending
     * (expert id, slot) — the rows rank[t·k + j] name, walked in ascending order. Value for value the loop
     * it replaces: acc = 0, then per expert in ascending id gather_rows, linear_fp4 (w1, w3), swiglu,
     * linear_fp4 (w2), scatter_add_rows. A backend may run every expert's GEMMs in a few launches (the rows
     * are contiguous per expert) and must add the ≤ k terms of a token in that order, in one pass. Experts
     * with listed rows need weights (refused otherwise); the CPU backend also checks that rows / rank /
     * start describe one plan.
     *   x bf16 [m, d];  experts [n_exp]: a HOST array of backend pointers (as moe_routed);
     *   acc f32 [m, d] (overwritten);  ws: backend scratch of di_moe_grouped_ws_bytes(plan->n, d, inter) */
    int (*moe_grouped)(const di_backend *be, const uint16_t *x, int64_t m, int64_t d, int64_t inter, int k, int n_exp,
                       const di_moe_expert *experts, const di_moe_plan *plan, float lim, float *acc, void *ws,
                       di_error *err);
    /* ---------------- batched cache rows (model/cache_rows.c: one call per pass, not per row) ----------------
     * The rows a pass writes to or reads from the caches of all its sequences, listed by address: the
     * rows of several caches, pages and ring slots in one call (backend/cpu/rows_batch.c,
     * backend/cuda/cuda_rows.cu). The address lists live in backend memory and point into it. */

    /* *dst[i] = encode(x[i]) (row_encode's codec, bit for bit); dst[i] NULL skips row i. The listed rows
     * must not overlap (they are written in parallel).  x bf16 [n, d];  dst: n row addresses */
    int (*row_encode_scatter)(const di_backend *be, di_row_codec codec, const uint16_t *x, int64_t n, int64_t d,
                              uint8_t *const *dst, di_error *err);
    /* y[i] = decode(*src[i]) (row_decode's codec); src[i] NULL gives a zero row.
     *   src: n row addresses;  y bf16 [n, d] */
    int (*row_decode_gather)(const di_backend *be, di_row_codec codec, const uint8_t *const *src, int64_t n,
                             int64_t d, uint16_t *y, di_error *err);
    /* compress_pool over the tokens of any number of groups, with the carry state kept as the cache
     * keeps it: a ring of n_blocks group blocks, group g in block g mod n_blocks, each block kv_state
     * f32 [R, d] then score_state f32 [R, d]. Entries and every state byte equal those of compress_pool
     * called group by group in position order on block g mod n_blocks (so a token writes block
     * ⌊p/R⌋ mod n_blocks, row p mod R, and the last token of the call to reach a row leaves it).
     *   a, gate f32 [m, d];  state f32 [n_blocks, 2, R, d] (in/out);
     *   y bf16 [(start_pos+m)/R − start_pos/R, d] (every group the call completes, in order) */
    int (*compress_pool_ring)(const di_backend *be, const float *a, const float *gate, int64_t m, int64_t start_pos,
                              int ratio, int64_t d, float *state, int n_blocks, uint16_t *y, di_error *err);
    /* compress_pool_ring for the chunks of several sequences in one call (optional; NULL = one
     * compress_pool_ring per sequence), each exactly as compress_pool_ring on its chunk alone.
     *   a, gate f32 [Σ m, d];  seqs: n_seq descriptors;  ent_seq int32 [n_out] the sequence of each output
     *   entry (entries of sequence s are rows out0_s … in order);  y bf16 [n_out, d] */
    int (*compress_pool_seqs)(const di_backend *be, const float *a, const float *gate, int ratio, int64_t d,
                              int n_blocks, const di_pool_seq *seqs, int n_seq, const int32_t *ent_seq, int64_t n_out,
                              uint16_t *y, di_error *err);
    /* sparse_attn over the queries of several sequences in one call (optional; NULL = one sparse_attn per
     * sequence): query row t belongs to sequence seq_of[t] and attends over that sequence's key set
     * with its index list, exactly as sparse_attn on that sequence alone.
     *   q bf16 [m, nh, d];  seqs: n_seq descriptors;  seq_of int32 [m];  sink f32 [nh];  out bf16 [m, nh, d] */
    int (*sparse_attn_seqs)(const di_backend *be, const uint16_t *q, int64_t m, int nh, int d,
                            const di_attn_seq *seqs, int n_seq, const int32_t *seq_of, const float *sink,
                            float scale, uint16_t *out, di_error *err);
    /* ---------------- batched index selection (optional; NULL = per-sequence / per-row calls) ----------------
     * indexer_scores, candidate_mask, topk and gather_topk over the rows of every sequence of a pass in one
     * call each, every row with its own key set, width, visible count and k (di_index_row): row i's output
     * is, bit for bit, that of the per-sequence op called on row i alone with the row's nk / w / vis / k
     * (the selections' tie order depends on w and k: torch's replay is kept per row). Their CPU versions
     * are those per-row calls (backend/cpu/rows_batch.c), the CUDA kernels run the per-row device code of
     * the per-sequence kernels (backend/cuda/cuda_index_seqs.cu).
     *   indexer_scores_rows: q bf16 [m, nh, hd];  w bf16 [m, nh];  rows [m];  scores f32 (rows' s0, nk);
     *     nk_max ≥ every row's nk
     *   candidate_mask_rows: mask uint8 (rows' s0, w): each row's w columns written;  w_max ≥ every w
     *   topk_rows: out int32 (rows' o0, kp): positions ascending (offset 0), −1 padded to kp;  w_max ≥ every w
     *   gather_topk_seqs: gather_topk for each of n_seq sequences (codec, d shared);  mk_max ≥ every m·k */
    int (*indexer_scores_rows)(const di_backend *be, const uint16_t *q, const uint16_t *w, float w_scale, int64_t m,
                               int nh, int hd, const di_index_row *rows, int64_t nk_max, float *scores, di_error *err);
    int (*candidate_mask_rows)(const di_backend *be, const float *scores, int64_t m, const di_index_row *rows,
                               int64_t w_max, int block, int topk_blocks, uint8_t *mask, di_error *err);
    int (*topk_rows)(const di_backend *be, const float *scores, int64_t m, const di_index_row *rows, int64_t w_max,
                     int32_t *out, di_error *err);
    int (*gather_topk_seqs)(const di_backend *be, di_row_codec codec, int64_t d, const di_gather_seq *seqs, int n_seq,
                            int64_t mk_max, di_error *err);
    /* ---------------- graph capture (optional; NULL = every pass runs op by op) ----------------
     * graph_begin: the ops issued from now on are recorded, not run. Between begin and end no op may
     * wait for the device (no download); memory must not be allocated or freed (the forward's arena).
     * graph_end: stop recording and run the recording. *exec is the caller's set of instantiated
     * graphs (opaque, NULL at first): one of the same topology is updated with the recording's
     * parameters (try_update false skips the attempt) — *replayed = true —, else the recording is
     * instantiated into the set. exec NULL: drop the recording. On failure (an op refused to be
     * recorded: the recording is incomplete) nothing recorded ran and recording has stopped.
     * graph_free: release the set (waits for a launched graph). */
    int (*graph_begin)(const di_backend *be, di_error *err);
    int (*graph_end)(const di_backend *be, void **exec, bool try_update, bool *replayed, di_error *err);
    void (*graph_free)(const di_backend *be, void *exec);
    /* ---------------- a second lane of ops (optional; NULL = every op runs in issue order) ----------------
     * side_begin: the ops issued from now on go to the side lane; they run after every op issued before
     * (on either lane). side_end: the ops issued from now on go back to the main lane, where they may run
     * while the side lane's run. side_join: the main lane's ops issued from now on run after every op
     * the side lane was given. Always in that order, never nested; no memory transfer, allocation or
     * release on the side lane. The caller gives the two lanes' ops between side_begin and side_join
     * no buffer that one writes and the other reads or writes: then the values are those of issue order.
     * A backend may run both lanes in issue order (the CUDA backend does while ops are timed). Recorded
     * in a graph (graph_begin) as two branches joined again. */
    int (*side_begin)(const di_backend *be, di_error *err);
    int (*side_end)(const di_backend *be, di_error *err);
    int (*side_join)(const di_backend *be, di_error *err);
    /* Page-lock host memory the host writes and the ops' uploads read (the forward's upload staging):
     * an upload from it is an asynchronous DMA, and a recorded upload reads it when the graph runs.
     * NULL where uploads are plain copies (the CPU). */
    int (*host_pin)(const di_backend *be, void *host, size_t bytes, di_error *err);
    void (*host_unpin)(const di_backend *be, void *host);
};


/* The CPU reference backend (src/backend/cpu/backend_cpu.c). n_threads ≥ 1. */
int di_backend_cpu_create(int n_threads, di_backend **out, di_error *err);

/* CPU kernel sets: FAST = the vectorised, multithreaded kernels (cpu_ops.h, cpu_attn.h; the default);
 * SCALAR = a second, plainly written implementation of every op (graph_extra*.c), kept switchable to
 * localise drift: when the two disagree with each other, the culprit is a kernel, not the graph. */
typedef enum di_cpu_variant { DI_CPU_FAST = 0, DI_CPU_SCALAR = 1 } di_cpu_variant;
int di_backend_cpu_create_variant(int n_threads, di_cpu_variant variant, di_backend **out, di_error *err);
/* Any backend (calls be->destroy). */
void di_backend_destroy(di_backend *be);

/* A backend by name (backend_select.c): "cpu" (n_threads, the FAST kernels) or "cuda" (device 0).
 * A build without the CUDA objects answers "cuda" with DI_ERR_UNSUPPORTED ("built without CUDA"). */
int di_backend_create(const char *name, int n_threads, di_backend **out, di_error *err);
bool di_backend_cuda_available(void); /* the CUDA backend is linked into this binary */

#endif
