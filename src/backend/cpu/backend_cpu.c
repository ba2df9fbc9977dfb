/* The CPU reference backend: fills the di_backend table (backend.h) with thin adapters over the CPU
 * kernels (cpu_ops.h: GEMMs, norms, RoPE, router, MoE pieces, Engram, embedding; cpu_attn.h: mHC,
 * compressor, indexer, candidates, top-k, sparse attention). The adapters own the thread pool and the
 * GEMM workspace, and implement the two op-level fault switches of the mutation tests. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_attn.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_moe_grouped.h"
#include "backend/cpu/cpu_rows.h"
#include "backend/cpu/graph_extra.h"
#include "io/formats.h"
#include "util/error.h"
#include "util/threadpool.h"

typedef struct cpu_impl {
    di_threadpool *tp;
    void *ws;        /* GEMM workspace, grown on demand */
    size_t ws_bytes;
} cpu_impl;

static cpu_impl *impl(const di_backend *be) { return (cpu_impl *)be->impl; }

static int need_ws(const di_backend *be, size_t bytes, di_error *err) {
    cpu_impl *c = impl(be);
    if (c->ws_bytes >= bytes) return DI_OK;
    void *p = realloc(c->ws, bytes);
    if (!p) return di_error_set(err, DI_ERR_NOMEM, "cpu backend: %zu bytes of GEMM workspace", bytes);
    c->ws = p, c->ws_bytes = bytes;
    return DI_OK;
}

/* ---------------- memory: host memory ---------------- */

/* 64-byte aligned zeroed block; the raw calloc pointer sits just before it. calloc of a large block
 * maps zero pages lazily, so a cache arena sized for a long context costs only what is touched. */
static void *m_alloc(const di_backend *be, size_t bytes, di_error *err) {
    uint8_t *raw = calloc(1, bytes + 64 + sizeof(void *));
    if (!raw) {
        di_error_set(err, DI_ERR_NOMEM, "cpu backend: %zu bytes", bytes);
        return NULL;
    }
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + sizeof(void *) + 63) / 64 * 64);
    memcpy(p - sizeof(void *), &raw, sizeof raw);
    return p;
}

static void m_free(const di_backend *be, void *p) {
    if (!p) return;
    void *raw;
    memcpy(&raw, (uint8_t *)p - sizeof(void *), sizeof raw);
    free(raw);
}

static int m_copy(const di_backend *be, void *dst, const void *src, size_t bytes, di_error *err) {
    if (bytes) memmove(dst, src, bytes);
    return DI_OK;
}

static int m_set(const di_backend *be, void *dst, int byte, size_t bytes, di_error *err) {
    if (bytes) memset(dst, byte, bytes);
    return DI_OK;
}

static int m_map_host(const di_backend *be, const void *host, size_t bytes, const void **view, di_error *err) {
    *view = host;
    return DI_OK;
}

static void m_unmap_host(const di_backend *be, const void *host, const void *view) {}

static int a_row_encode(const di_backend *be, di_row_codec codec, const uint16_t *x, int64_t n, int64_t d, uint8_t *rows,
                        di_error *err) {
    int64_t rb = di_row_codec_bytes(codec, d);
    if (d <= 0 || d % di_row_codec_group(codec) || n < 0)
        return di_error_set(err, DI_ERR_INVALID, "row_encode: %lld rows of %lld values (groups of %d)", (long long)n,
                            (long long)d, di_row_codec_group(codec));
    for (int64_t i = 0; i < n; i++) di_cpu_row_encode(codec, x + i * d, d, rows + i * rb);
    return DI_OK;
}

static int a_row_decode(const di_backend *be, di_row_codec codec, const uint8_t *rows, const int32_t *ids, int64_t n,
                        int64_t d, uint16_t *y, di_error *err) {
    int64_t rb = di_row_codec_bytes(codec, d);
    if (d <= 0 || d % di_row_codec_group(codec) || n < 0)
        return di_error_set(err, DI_ERR_INVALID, "row_decode: %lld rows of %lld values (groups of %d)", (long long)n,
                            (long long)d, di_row_codec_group(codec));
    for (int64_t i = 0; i < n; i++) {
        int64_t r = ids ? ids[i] : i;
        if (r < 0)
            memset(y + i * d, 0, sizeof(uint16_t) * (size_t)d);
        else
            di_cpu_row_decode(codec, rows + r * rb, d, y + i * d);
    }
    return DI_OK;
}

static int a_stream_mean(const di_backend *be, const uint16_t *x, int64_t m, int hc, int64_t d, uint16_t *y, int64_t ldy,
                         di_error *err) {
    if (hc < 1 || d < 1 || ldy < d)
        return di_error_set(err, DI_ERR_INVALID, "stream_mean: %d streams of %lld, output stride %lld", hc, (long long)d,
                            (long long)ldy);
    for (int64_t t = 0; t < m; t++)
        for (int64_t j = 0; j < d; j++) {
            float s = 0.0f;
            for (int k = 0; k < hc; k++) s += di_bf16_to_f32(x[(t * hc + k) * d + j]);
            y[t * ldy + j] = di_f32_to_bf16(s / (float)hc);
        }
    return DI_OK;
}

/* ---------------- GEMMs ---------------- */

static int a_linear_fp8(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint8_t *w,
                        const uint8_t *ws, int64_t n, uint16_t *y, di_error *err) {
    int rc = need_ws(be, di_cpu_qlinear_workspace(m, k, impl(be)->tp), err);
    if (rc) return rc;
    return di_cpu_linear_fp8(impl(be)->tp, m, n, k, x, k, w, ws, y, n, impl(be)->ws, impl(be)->ws_bytes, err);
}

static int a_linear_fp4(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint8_t *w,
                        const uint8_t *ws, int64_t n, uint16_t *y, di_error *err) {
    uint8_t *swapped = NULL; /* [n, k/2] test-only copy with the nibbles exchanged */
    if (be->faults.fp4_nibble_swap) {
        swapped = malloc((size_t)(n * (k / 2)));
        if (!swapped) return di_error_set(err, DI_ERR_NOMEM, "fp4 nibble-swap copy");
        for (int64_t i = 0; i < n * (k / 2); i++) swapped[i] = (uint8_t)((w[i] >> 4) | (w[i] << 4));
        w = swapped;
    }
    int rc = need_ws(be, di_cpu_qlinear_workspace(m, k, impl(be)->tp), err);
    if (!rc) rc = di_cpu_linear_fp4(impl(be)->tp, m, n, k, x, k, w, ws, y, n, impl(be)->ws, impl(be)->ws_bytes, err);
    free(swapped);
    return rc;
}

static int a_linear_bf16(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w, int64_t n,
                         uint16_t *y, di_error *err) {
    di_cpu_linear_bf16(impl(be)->tp, m, n, k, x, k, w, k, y, n);
    return DI_OK;
}

static int a_linear_f32(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w, int64_t n,
                        float *y, di_error *err) {
    di_cpu_linear_bf16_f32(impl(be)->tp, m, n, k, x, k, w, k, y, n);
    return DI_OK;
}

static int a_linear_grouped_bf16(const di_backend *be, const uint16_t *x, int64_t m, int g, int64_t k,
                                 const uint16_t *w, int64_t r, uint16_t *y, di_error *err) {
    di_cpu_wo_a_grouped(impl(be)->tp, m, g, k, r, x, w, y);
    return DI_OK;
}

/* ---------------- elementwise ---------------- */

static int a_rmsnorm(const di_backend *be, const uint16_t *x, int64_t m, int64_t n, const uint16_t *w, float eps,
                     uint16_t *y, di_error *err) {
    di_cpu_rmsnorm(m, n, x, n, w, eps, y, n);
    return DI_OK;
}

/* The half-split fault rotates pairs (i, i + rd/2): permute those channels into interleaved order
 * around the (interleaved) kernel and back. */
static void half_split_permute(uint16_t *x, int64_t rows, int d, int rd, bool to_interleaved) {
    uint16_t tmp[2 * DI_ROPE_MAX_PAIRS];
    int half = rd / 2;
    for (int64_t r = 0; r < rows; r++) {
        uint16_t *v = x + r * d + (d - rd);
        for (int i = 0; i < half; i++) {
            if (to_interleaved)
                tmp[2 * i] = v[i], tmp[2 * i + 1] = v[i + half];
            else
                tmp[i] = v[2 * i], tmp[i + half] = v[2 * i + 1];
        }
        memcpy(v, tmp, sizeof(uint16_t) * (size_t)rd);
    }
}

static int a_rope(const di_backend *be, uint16_t *x, int64_t m, int nh, int d, int rd, const int64_t *pos,
                  const float *freqs, bool inverse, di_error *err) {
    if (rd <= 0 || rd % 2 || rd > d || rd / 2 > DI_ROPE_MAX_PAIRS)
        return di_error_set(err, DI_ERR_INVALID, "rope: %d rotated channels of a %d-wide head", rd, d);
    bool split = be->faults.rope_half_split;
    if (split) half_split_permute(x, m * nh, d, rd, true);
    di_cpu_rope_apply(m, nh, x, (int64_t)nh * d, d, d - rd, rd / 2, pos, freqs, inverse);
    if (split) half_split_permute(x, m * nh, d, rd, false);
    return DI_OK;
}

static int check_group(int64_t n, int group, const char *what, di_error *err) {
    if (group <= 0 || n % group) return di_error_set(err, DI_ERR_INVALID, "%s: row of %lld not a multiple of group %d", what, (long long)n, group);
    return DI_OK;
}

static int a_qdq_fp8(const di_backend *be, uint16_t *x, int64_t m, int64_t n, int group, di_error *err) {
    int rc = check_group(n, group, "qdq_fp8", err);
    for (int64_t i = 0; !rc && i < m; i++) di_act_qdq_fp8(x + i * n, n, group, x + i * n);
    return rc;
}

static int a_qdq_fp4_e8m0(const di_backend *be, uint16_t *x, int64_t m, int64_t n, int group, di_error *err) {
    int rc = check_group(n, group, "qdq_fp4_e8m0", err);
    for (int64_t i = 0; !rc && i < m; i++) di_fp4_qdq_e8m0(x + i * n, n, group, x + i * n);
    return rc;
}

static int a_qdq_fp4_e4m3(const di_backend *be, uint16_t *x, int64_t m, int64_t n, int group, di_error *err) {
    int rc = check_group(n, group, "qdq_fp4_e4m3", err);
    for (int64_t i = 0; !rc && i < m; i++) di_fp4_qdq_e4m3(x + i * n, n, group, x + i * n);
    return rc;
}

static int a_embed(const di_backend *be, const uint16_t *table, int64_t vocab, int64_t d, const int32_t *ids,
                   int64_t m, uint16_t *y, di_error *err) {
    return di_cpu_embed(m, ids, table, vocab, d, y, err);
}

/* ---------------- mHC ---------------- */

static int a_hc_mixes(const di_backend *be, const uint16_t *x, int64_t m, int hc, int64_t d, const float *fn,
                      float eps, float *mixes, di_error *err) {
    return di_cpu_hc_mixes(x, m, hc, d, fn, eps, mixes, err);
}

static int a_hc_sinkhorn(const di_backend *be, const float *mixes, int64_t m, int hc, const float *scale,
                         const float *base, int iters, float eps, float *pre, float *post, float *comb, di_error *err) {
    return di_cpu_hc_sinkhorn(mixes, m, hc, scale, base, iters, eps, pre, post, comb, err);
}

static int a_hc_collapse(const di_backend *be, const uint16_t *x, const float *pre, int64_t m, int hc, int64_t d,
                         uint16_t *y, di_error *err) {
    return di_cpu_hc_collapse(x, pre, m, hc, d, y, err);
}

static int a_hc_expand(const di_backend *be, const uint16_t *z, const uint16_t *x, const float *post,
                       const float *comb, int64_t m, int hc, int64_t d, uint16_t *y, di_error *err) {
    return di_cpu_hc_expand(z, x, post, comb, m, hc, d, y, err);
}

/* ---------------- compressed KV, indexer, selection ---------------- */

static int a_compress_pool(const di_backend *be, const float *a, const float *gate, int64_t m, int64_t start_pos,
                           int ratio, int64_t d, float *kv_state, float *score_state, uint16_t *y, int64_t *n_out,
                           di_error *err) {
    if (m > 0 && start_pos / ratio != (start_pos + m - 1) / ratio)
        return di_error_set(err, DI_ERR_INVALID, "compress_pool: positions %lld..%lld span more than one group of %d",
                            (long long)start_pos, (long long)(start_pos + m - 1), ratio);
    return di_cpu_compress_pool(a, gate, m, start_pos, ratio, d, kv_state, score_state, y, n_out, err);
}

static int a_indexer_scores(const di_backend *be, const uint16_t *q, const uint16_t *w, float w_scale,
                            const uint16_t *k, int64_t m, int nh, int hd, int64_t nk, const int32_t *vis,
                            const uint8_t *cand, float *scores, di_error *err) {
    return di_cpu_indexer_scores(q, w, w_scale, k, m, nh, hd, nk, vis, cand, scores, err);
}

static int a_sparse_attn(const di_backend *be, const uint16_t *q, int64_t m, int nh, int d, const uint16_t *kv_win,
                         int64_t n_win, const uint16_t *kv_cmp, int64_t n_cmp, const float *sink, const int32_t *idx,
                         int64_t n_idx, float scale, uint16_t *out, di_error *err) {
    return di_cpu_sparse_attn(q, m, nh, d, kv_win, n_win, kv_cmp, n_cmp, sink, idx, n_idx, scale, out, err);
}

/* ---------------- MoE ---------------- */

static int a_router(const di_backend *be, const float *logits, int64_t m, int n_exp, const float *bias, float temp,
                    int k, bool normalize, float scale, int32_t *ids, float *weights, di_error *err) {
    if (k <= 0 || k > n_exp || k > DI_ROUTER_MAX_TOPK)
        return di_error_set(err, DI_ERR_INVALID, "router: top-%d of %d experts", k, n_exp);
    if (!normalize) return di_error_set(err, DI_ERR_UNSUPPORTED, "router: norm_topk_prob = false");
    di_cpu_router(m, n_exp, logits, bias, NULL, NULL, temp, k, scale, ids, weights);
    return DI_OK;
}

static int a_swiglu(const di_backend *be, const uint16_t *g, const uint16_t *u, int64_t m, int64_t n,
                    const float *row_w, float lim, uint16_t *a, di_error *err) {
    di_cpu_swiglu(m, n, g, n, u, n, row_w, lim, a, n);
    return DI_OK;
}

static int a_gather_rows(const di_backend *be, const uint16_t *x, int64_t d, const int32_t *rows, int64_t m,
                         uint16_t *y, di_error *err) {
    for (int64_t i = 0; i < m; i++) memcpy(y + i * d, x + (int64_t)rows[i] * d, sizeof(uint16_t) * (size_t)d);
    return DI_OK;
}

static int a_scatter_add_rows(const di_backend *be, const uint16_t *y, int64_t d, const int32_t *rows, int64_t m,
                              float *acc, di_error *err) {
    di_cpu_moe_accumulate(m, d, rows, y, acc);
    return DI_OK;
}

static int a_f32_to_bf16(const di_backend *be, const float *x, int64_t n, uint16_t *y, di_error *err) {
    for (int64_t i = 0; i < n; i++) y[i] = di_f32_to_bf16(x[i]);
    return DI_OK;
}

static int a_fill_f32(const di_backend *be, float *x, int64_t n, float v, di_error *err) {
    for (int64_t i = 0; i < n; i++) x[i] = v;
    return DI_OK;
}

/* ---------------- Engram ---------------- */

static int a_engram_lookup(const di_backend *be, const uint8_t *table, const uint8_t *scale, int64_t rows, int hd,
                           const int64_t *ids, int64_t m, int n_cols, uint16_t *y, di_error *err) {
    return di_cpu_engram_gather(m, n_cols, ids, table, scale, rows, hd, y, err);
}

static int a_engram_gate(const di_backend *be, uint16_t *x, const uint16_t *kv, int64_t m, int hc, int64_t d,
                         const uint16_t *qw, const uint16_t *kw, float eps, di_error *err) {
    float *wq = malloc(sizeof(float) * (size_t)(hc * d)); /* f32 [hc, d] */
    if (!wq) return di_error_set(err, DI_ERR_NOMEM, "engram gate weight");
    di_cpu_engram_gate_weight((int64_t)hc * d, qw, kw, wq);
    di_cpu_engram_gate(m, hc, d, x, kv, wq, eps, NULL);
    free(wq);
    return DI_OK;
}

/* The scalar kernels of graph_extra*.c: a second, plainly written implementation of every op, kept
 * switchable (DI_CPU_SCALAR) to localise drift between two CPU implementations. */
static void cpu_destroy(di_backend *be);

static void fill_scalar(di_backend *be) {
    be->linear_fp8 = di_gx_linear_fp8;
    be->linear_fp4 = di_gx_linear_fp4;
    be->linear_bf16 = di_gx_linear_bf16;
    be->linear_f32 = di_gx_linear_f32;
    be->linear_grouped_bf16 = di_gx_linear_grouped_bf16;
    be->rmsnorm = di_gx_rmsnorm;
    be->rope = di_gx_rope;
    be->embed = di_gx_embed;
    be->hc_mixes = di_gx_hc_mixes;
    be->hc_sinkhorn = di_gx_hc_sinkhorn;
    be->hc_collapse = di_gx_hc_collapse;
    be->hc_expand = di_gx_hc_expand;
    be->compress_pool = di_gx_compress_pool;
    be->indexer_scores = di_gx_indexer_scores;
    be->sparse_attn = di_gx_sparse_attn;
    be->router = di_gx_router;
    be->swiglu = di_gx_swiglu;
    be->scatter_add_rows = di_gx_scatter_add_rows;
    be->engram_lookup = di_gx_engram_lookup;
    be->engram_gate = di_gx_engram_gate;
}

int di_backend_cpu_create_variant(int n_threads, di_cpu_variant variant, di_backend **out, di_error *err) {
    if (n_threads < 1) return di_error_set(err, DI_ERR_INVALID, "cpu backend: %d threads (need ≥ 1)", n_threads);
    di_backend *be = calloc(1, sizeof *be);
    cpu_impl *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be), free(c);
        return di_error_set(err, DI_ERR_NOMEM, "cpu backend");
    }
    be->impl = c;
    if (n_threads > 1) {
        int rc = di_threadpool_create(n_threads, &c->tp, err);
        if (rc) {
            free(be), free(c);
            return rc;
        }
    }
    be->name = "cpu";
    be->destroy = cpu_destroy;
    be->host_memory = true;
    be->mem_alloc = m_alloc;
    be->mem_free = m_free;
    be->mem_upload = m_copy;
    be->mem_download = m_copy;
    be->mem_copy = m_copy;
    be->mem_set = m_set;
    be->mem_map_host = m_map_host;
    be->mem_unmap_host = m_unmap_host;
    be->row_encode = a_row_encode;
    be->row_decode = a_row_decode;
    be->stream_mean = a_stream_mean;
    be->linear_fp8 = a_linear_fp8;
    be->linear_fp4 = a_linear_fp4;
    be->linear_bf16 = a_linear_bf16;
    be->linear_f32 = a_linear_f32;
    be->linear_grouped_bf16 = a_linear_grouped_bf16;
    be->rmsnorm = a_rmsnorm;
    be->rope = a_rope;
    be->qdq_fp8 = a_qdq_fp8;
    be->qdq_fp4_e8m0 = a_qdq_fp4_e8m0;
    be->qdq_fp4_e4m3 = a_qdq_fp4_e4m3;
    be->embed = a_embed;
    be->hc_mixes = a_hc_mixes;
    be->hc_sinkhorn = a_hc_sinkhorn;
    be->hc_collapse = a_hc_collapse;
    be->hc_expand = a_hc_expand;
    be->compress_pool = a_compress_pool;
    be->indexer_scores = a_indexer_scores;
    /* selections with the reference's own tie behaviour (graph_extra_topk.c) */
    be->candidate_mask = di_gx_candidate_mask_torch;
    be->topk = di_gx_topk_torch;
    be->sparse_attn = a_sparse_attn;
    be->router = a_router;
    be->swiglu = a_swiglu;
    be->gather_rows = a_gather_rows;
    be->scatter_add_rows = a_scatter_add_rows;
    be->moe_routed = di_cpu_moe_routed; /* over the slots above (either variant's kernels) */
    be->moe_grouped = di_cpu_moe_grouped; /* likewise (cpu_moe_grouped.h) */
    be->f32_to_bf16 = a_f32_to_bf16;
    be->fill_f32 = a_fill_f32;
    be->engram_lookup = a_engram_lookup;
    be->engram_gate = a_engram_gate;
    if (variant == DI_CPU_SCALAR) fill_scalar(be);
    di_cpu_rows_install(be); /* after compress_pool: the ring runs the variant's own */
    di_cpu_index_rows_install(be); /* after the scorer and the selections, likewise */
    *out = be;
    return DI_OK;
}

int di_backend_cpu_create(int n_threads, di_backend **out, di_error *err) {
    return di_backend_cpu_create_variant(n_threads, DI_CPU_FAST, out, err);
}

static void cpu_destroy(di_backend *be) {
    cpu_impl *c = impl(be);
    if (c) {
        di_threadpool_destroy(c->tp);
        free(c->ws);
        free(c);
    }
    free(be);
}

void di_backend_destroy(di_backend *be) {
    if (be && be->destroy) be->destroy(be);
}
