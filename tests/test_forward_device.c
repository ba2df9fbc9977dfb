/* The block graph on a backend whose memory the host cannot reach: the CPU kernels behind a wrapper whose
 * "backend memory" pointers are the real addresses with bit 62 set (non-canonical on x86-64 and AArch64,
 * so any dereference on the host faults at once). The wrapper strips the bit inside every op and memory
 * slot, exactly where a device backend would switch address spaces. So this test runs the forward the
 * way the CUDA backend sees it — weights moved at load, caches in backend memory, every index list
 * uploaded, every host decision downloaded — and proves two things on the CPU alone:
 *  - the graph, the caches and the verify / session drivers never touch backend memory on the host
 *    (a violation crashes the test);
 *  - routing everything through the memory slots changes nothing: prefill (free and teacher-forced),
 *    chunked prefill, decode, DSpark drafts, rollback and prefix export / restore give bit-identical
 *    results and cache images to the plain CPU backend.
 * di-test: asan */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_fused.h"
#include "model/golden.h"
#include "model/session.h"
#include "util/error.h"
#include "testutil.h"
#include "util/error.h"

/* ---------------- the unreachable-memory wrapper ---------------- */

#define HIDE_BIT ((uintptr_t)1 << 62)
#define U(p) ((__typeof__(p))((p) ? (void *)((uintptr_t)(p) ^ HIDE_BIT) : NULL))
#define IN(be) ((const di_backend *)(be)->impl)

/* ---------------- the side lane (backend.h side_begin) ----------------
 * g_lanes 0: no lane slots (the forward runs everything in order); 1: the slots are offered and the side
 * lane's ops run when issued; 2: they are held and run at side_join, after every main-lane op issued in
 * between — the latest a backend may run them — so a main op that reads a side op's output, or writes
 * what a side op reads, before the join changes the results, which the runs compare bit for bit. Checked
 * on every call: begin → end → join; no memory slot (alloc, free, upload, download, copy, set, host map)
 * and no op but the forward's side ops (linear_fp8, rope, swiglu: the wrappers that hold) on the side
 * lane; 6 side ops per pair of lanes. */
static int g_lanes;
static int g_lane;                  /* 0: idle, 1: side, 2: main after side_end */
static long g_regions, g_side_ops;  /* side lanes opened; ops issued on them */
static const char *g_lane_error;    /* the first protocol violation */
enum { HOLD_MAX = 16 };
typedef enum { H_LINEAR_FP8, H_ROPE, H_SWIGLU } hold_op;
typedef struct held {
    hold_op op;
    const void *a, *b, *c, *d; /* the pointers, as issued (hidden) */
    void *out;
    int64_t m, k, n;
    int i0, i1, i2;
    float f;
    bool inv;
} held;
static held g_held[HOLD_MAX];
static int g_n_held;

static void lane_violation(const char *what) {
    if (!g_lane_error) g_lane_error = what;
}
static bool on_side(void) { return g_lane == 1; }
static void no_memory_on_side(const char *slot) {
    if (on_side()) lane_violation(slot);
}
/* an op the forward never puts on the side lane */
static void no_op_on_side(const char *op) {
    if (on_side()) lane_violation(op);
}
static bool hold(held h) {
    if (!on_side()) return false;
    g_side_ops++;
    if (g_lanes != 2) return false;
    if (g_n_held == HOLD_MAX) {
        lane_violation("more side ops than the test holds");
        return false;
    }
    g_held[g_n_held++] = h;
    return true;
}
static int l_begin(const di_backend *be, di_error *e) {
    if (g_lane != 0) lane_violation("side_begin out of order");
    g_lane = 1, g_regions++;
    return DI_OK;
}
static int l_end(const di_backend *be, di_error *e) {
    if (g_lane != 1) lane_violation("side_end out of order");
    g_lane = 2;
    return DI_OK;
}
static int run_held(const di_backend *be, const held *h, di_error *e);
static int l_join(const di_backend *be, di_error *e) {
    if (g_lane != 2) lane_violation("side_join out of order");
    g_lane = 0;
    int rc = DI_OK;
    for (int i = 0; i < g_n_held && rc == DI_OK; i++) rc = run_held(be, &g_held[i], e);
    g_n_held = 0;
    return rc;
}

static void *g_alloc(const di_backend *be, size_t bytes, di_error *err) {
    no_memory_on_side("mem_alloc on the side lane");
    void *p = IN(be)->mem_alloc(IN(be), bytes, err);
    return p ? U(p) : NULL;
}
static void g_free(const di_backend *be, void *p) {
    no_memory_on_side("mem_free on the side lane");
    IN(be)->mem_free(IN(be), U(p));
}
static int g_upload(const di_backend *be, void *d, const void *s, size_t n, di_error *e) {
    no_memory_on_side("mem_upload on the side lane");
    return IN(be)->mem_upload(IN(be), U(d), s, n, e);
}
static int g_download(const di_backend *be, void *d, const void *s, size_t n, di_error *e) {
    no_memory_on_side("mem_download on the side lane");
    return IN(be)->mem_download(IN(be), d, U(s), n, e);
}
static int g_copy(const di_backend *be, void *d, const void *s, size_t n, di_error *e) {
    no_memory_on_side("mem_copy on the side lane");
    return IN(be)->mem_copy(IN(be), U(d), U(s), n, e);
}
static int g_set(const di_backend *be, void *d, int v, size_t n, di_error *e) {
    no_memory_on_side("mem_set on the side lane");
    return IN(be)->mem_set(IN(be), U(d), v, n, e);
}
static int g_map(const di_backend *be, const void *h, size_t n, const void **view, di_error *e) {
    no_memory_on_side("mem_map_host on the side lane");
    *view = U(h);
    return DI_OK;
}
static void g_unmap(const di_backend *be, const void *h, const void *view) {}

static int g_row_encode(const di_backend *be, di_row_codec c, const uint16_t *x, int64_t n, int64_t d, uint8_t *r,
                        di_error *e) {
    no_op_on_side("row_encode");
    return IN(be)->row_encode(IN(be), c, U(x), n, d, U(r), e);
}
static int g_row_decode(const di_backend *be, di_row_codec c, const uint8_t *r, const int32_t *ids, int64_t n, int64_t d,
                        uint16_t *y, di_error *e) {
    no_op_on_side("row_decode");
    return IN(be)->row_decode(IN(be), c, U(r), U(ids), n, d, U(y), e);
}
static int g_linear_fp8(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint8_t *w, const uint8_t *ws,
                        int64_t n, uint16_t *y, di_error *e) {
    if (hold((held){.op = H_LINEAR_FP8, .a = x, .b = w, .c = ws, .out = y, .m = m, .k = k, .n = n})) return DI_OK;
    return IN(be)->linear_fp8(IN(be), U(x), m, k, U(w), U(ws), n, U(y), e);
}
static int g_linear_fp4(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint8_t *w, const uint8_t *ws,
                        int64_t n, uint16_t *y, di_error *e) {
    no_op_on_side("linear_fp4");
    return IN(be)->linear_fp4(IN(be), U(x), m, k, U(w), U(ws), n, U(y), e);
}
static int g_linear_bf16(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w, int64_t n,
                         uint16_t *y, di_error *e) {
    no_op_on_side("linear_bf16");
    return IN(be)->linear_bf16(IN(be), U(x), m, k, U(w), n, U(y), e);
}
static int g_linear_f32(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w, int64_t n,
                        float *y, di_error *e) {
    no_op_on_side("linear_f32");
    return IN(be)->linear_f32(IN(be), U(x), m, k, U(w), n, U(y), e);
}
static int g_grouped(const di_backend *be, const uint16_t *x, int64_t m, int g, int64_t k, const uint16_t *w, int64_t r,
                     uint16_t *y, di_error *e) {
    no_op_on_side("grouped");
    return IN(be)->linear_grouped_bf16(IN(be), U(x), m, g, k, U(w), r, U(y), e);
}
static int g_rmsnorm(const di_backend *be, const uint16_t *x, int64_t m, int64_t n, const uint16_t *w, float eps,
                     uint16_t *y, di_error *e) {
    no_op_on_side("rmsnorm");
    return IN(be)->rmsnorm(IN(be), U(x), m, n, U(w), eps, U(y), e);
}
static int g_rope(const di_backend *be, uint16_t *x, int64_t m, int nh, int d, int rd, const int64_t *pos,
                  const float *f, bool inv, di_error *e) {
    if (hold((held){.op = H_ROPE, .a = pos, .b = f, .out = x, .m = m, .i0 = nh, .i1 = d, .i2 = rd, .inv = inv}))
        return DI_OK;
    return IN(be)->rope(IN(be), U(x), m, nh, d, rd, U(pos), U(f), inv, e);
}
static int g_qdq_fp8(const di_backend *be, uint16_t *x, int64_t m, int64_t n, int g, di_error *e) {
    no_op_on_side("qdq_fp8");
    return IN(be)->qdq_fp8(IN(be), U(x), m, n, g, e);
}
static int g_qdq_e8m0(const di_backend *be, uint16_t *x, int64_t m, int64_t n, int g, di_error *e) {
    no_op_on_side("qdq_e8m0");
    return IN(be)->qdq_fp4_e8m0(IN(be), U(x), m, n, g, e);
}
static int g_qdq_e4m3(const di_backend *be, uint16_t *x, int64_t m, int64_t n, int g, di_error *e) {
    no_op_on_side("qdq_e4m3");
    return IN(be)->qdq_fp4_e4m3(IN(be), U(x), m, n, g, e);
}
static int g_embed(const di_backend *be, const uint16_t *t, int64_t v, int64_t d, const int32_t *ids, int64_t m,
                   uint16_t *y, di_error *e) {
    no_op_on_side("embed");
    return IN(be)->embed(IN(be), U(t), v, d, U(ids), m, U(y), e);
}
static int g_mixes(const di_backend *be, const uint16_t *x, int64_t m, int hc, int64_t d, const float *fn, float eps,
                   float *mx, di_error *e) {
    no_op_on_side("mixes");
    return IN(be)->hc_mixes(IN(be), U(x), m, hc, d, U(fn), eps, U(mx), e);
}
static int g_sinkhorn(const di_backend *be, const float *mx, int64_t m, int hc, const float *s, const float *b, int it,
                      float eps, float *pre, float *post, float *comb, di_error *e) {
    no_op_on_side("sinkhorn");
    return IN(be)->hc_sinkhorn(IN(be), U(mx), m, hc, U(s), U(b), it, eps, U(pre), U(post), U(comb), e);
}
static int g_collapse(const di_backend *be, const uint16_t *x, const float *pre, int64_t m, int hc, int64_t d,
                      uint16_t *y, di_error *e) {
    no_op_on_side("collapse");
    return IN(be)->hc_collapse(IN(be), U(x), U(pre), m, hc, d, U(y), e);
}
static int g_expand(const di_backend *be, const uint16_t *z, const uint16_t *x, const float *post, const float *comb,
                    int64_t m, int hc, int64_t d, uint16_t *y, di_error *e) {
    no_op_on_side("expand");
    return IN(be)->hc_expand(IN(be), U(z), U(x), U(post), U(comb), m, hc, d, U(y), e);
}
static int g_pool(const di_backend *be, const float *a, const float *g, int64_t m, int64_t p, int r, int64_t d, float *kv,
                  float *sc, uint16_t *y, int64_t *n_out, di_error *e) {
    no_op_on_side("pool");
    return IN(be)->compress_pool(IN(be), U(a), U(g), m, p, r, d, U(kv), U(sc), U(y), n_out, e);
}
static int g_iscores(const di_backend *be, const uint16_t *q, const uint16_t *w, float ws, const uint16_t *k, int64_t m,
                     int nh, int hd, int64_t nk, const int32_t *vis, const uint8_t *cand, float *s, di_error *e) {
    no_op_on_side("iscores");
    return IN(be)->indexer_scores(IN(be), U(q), U(w), ws, U(k), m, nh, hd, nk, U(vis), U(cand), U(s), e);
}
static int g_cand(const di_backend *be, const float *s, int64_t m, int64_t nk, const int32_t *vis, int b, int tb,
                  uint8_t *mask, float *ws, di_error *e) {
    no_op_on_side("cand");
    return IN(be)->candidate_mask(IN(be), U(s), m, nk, U(vis), b, tb, U(mask), U(ws), e);
}
static int g_topk(const di_backend *be, const float *s, int64_t m, int64_t nk, const int32_t *vis, int k, int32_t off,
                  int32_t *out, di_error *e) {
    no_op_on_side("topk");
    return IN(be)->topk(IN(be), U(s), m, nk, U(vis), k, off, U(out), e);
}
static int g_attn(const di_backend *be, const uint16_t *q, int64_t m, int nh, int d, const uint16_t *kw, int64_t nw,
                  const uint16_t *kc, int64_t nc, const float *sink, const int32_t *idx, int64_t ni, float sc,
                  uint16_t *o, di_error *e) {
    no_op_on_side("attn");
    return IN(be)->sparse_attn(IN(be), U(q), m, nh, d, U(kw), nw, U(kc), nc, U(sink), U(idx), ni, sc, U(o), e);
}
static int g_router(const di_backend *be, const float *l, int64_t m, int ne, const float *b, float t, int k, bool nz,
                    float s, int32_t *ids, float *w, di_error *e) {
    no_op_on_side("router");
    return IN(be)->router(IN(be), U(l), m, ne, U(b), t, k, nz, s, U(ids), U(w), e);
}
static int g_swiglu(const di_backend *be, const uint16_t *g, const uint16_t *u, int64_t m, int64_t n, const float *rw,
                    float lim, uint16_t *a, di_error *e) {
    if (hold((held){.op = H_SWIGLU, .a = g, .b = u, .c = rw, .out = a, .m = m, .n = n, .f = lim})) return DI_OK;
    return IN(be)->swiglu(IN(be), U(g), U(u), m, n, U(rw), lim, U(a), e);
}
static int g_gather(const di_backend *be, const uint16_t *x, int64_t d, const int32_t *r, int64_t m, uint16_t *y,
                    di_error *e) {
    no_op_on_side("gather");
    return IN(be)->gather_rows(IN(be), U(x), d, U(r), m, U(y), e);
}
static int g_scatter(const di_backend *be, const uint16_t *y, int64_t d, const int32_t *r, int64_t m, float *acc,
                     di_error *e) {
    no_op_on_side("scatter");
    return IN(be)->scatter_add_rows(IN(be), U(y), d, U(r), m, U(acc), e);
}
static int g_to_bf16(const di_backend *be, const float *x, int64_t n, uint16_t *y, di_error *e) {
    no_op_on_side("to_bf16");
    return IN(be)->f32_to_bf16(IN(be), U(x), n, U(y), e);
}
static int g_fill(const di_backend *be, float *x, int64_t n, float v, di_error *e) { return IN(be)->fill_f32(IN(be), U(x), n, v, e); }
static int g_smean(const di_backend *be, const uint16_t *x, int64_t m, int hc, int64_t d, uint16_t *y, int64_t ldy,
                   di_error *e) {
    no_op_on_side("fill");
    return IN(be)->stream_mean(IN(be), U(x), m, hc, d, U(y), ldy, e);
}
static int g_eg_lookup(const di_backend *be, const uint8_t *t, const uint8_t *s, int64_t rows, int hd, const int64_t *ids,
                       int64_t m, int nc, uint16_t *y, di_error *e) {
    no_op_on_side("eg_lookup");
    return IN(be)->engram_lookup(IN(be), U(t), U(s), rows, hd, U(ids), m, nc, U(y), e);
}
static int g_eg_gate(const di_backend *be, uint16_t *x, const uint16_t *kv, int64_t m, int hc, int64_t d, const uint16_t *qw,
                     const uint16_t *kw, float eps, di_error *e) {
    no_op_on_side("eg_gate");
    return IN(be)->engram_gate(IN(be), U(x), U(kv), m, hc, d, U(qw), U(kw), eps, e);
}
/* batched cache rows: the address lists are backend memory holding backend addresses, both unhidden */
static void **unhide_list(const void *list, int64_t n) {
    void **h = malloc(sizeof(void *) * (size_t)(n > 0 ? n : 1)); /* [n] host addresses */
    if (h)
        for (int64_t i = 0; i < n; i++) h[i] = U(((void *const *)U(list))[i]);
    return h;
}
static int g_row_encode_scatter(const di_backend *be, di_row_codec c, const uint16_t *x, int64_t n, int64_t d,
                                uint8_t *const *dst, di_error *e) {
    no_op_on_side("row_encode_scatter");
    void **h = unhide_list(dst, n);
    if (!h) return di_error_set(e, DI_ERR_NOMEM, "guarded row list");
    int rc = IN(be)->row_encode_scatter(IN(be), c, U(x), n, d, (uint8_t *const *)h, e);
    free(h);
    return rc;
}
static int g_row_decode_gather(const di_backend *be, di_row_codec c, const uint8_t *const *src, int64_t n, int64_t d,
                               uint16_t *y, di_error *e) {
    no_op_on_side("row_decode_gather");
    void **h = unhide_list(src, n);
    if (!h) return di_error_set(e, DI_ERR_NOMEM, "guarded row list");
    int rc = IN(be)->row_decode_gather(IN(be), c, (const uint8_t *const *)h, n, d, U(y), e);
    free(h);
    return rc;
}
static int g_pool_ring(const di_backend *be, const float *a, const float *g, int64_t m, int64_t p, int r, int64_t d,
                       float *st, int nb, uint16_t *y, di_error *e) {
    no_op_on_side("pool_ring");
    return IN(be)->compress_pool_ring(IN(be), U(a), U(g), m, p, r, d, U(st), nb, U(y), e);
}
static int g_attn_seqs(const di_backend *be, const uint16_t *q, int64_t m, int nh, int d, const di_attn_seq *seqs,
                       int n_seq, const int32_t *seq_of, const float *sink, float sc, uint16_t *o, di_error *e) {
    no_op_on_side("attn_seqs");
    di_attn_seq *h = malloc(sizeof *h * (size_t)n_seq); /* [n_seq] host descriptors, unhidden */
    if (!h) return di_error_set(e, DI_ERR_NOMEM, "guarded descriptors");
    for (int s = 0; s < n_seq; s++) {
        h[s] = U(seqs)[s];
        h[s].kv_win = U(h[s].kv_win), h[s].kv_cmp = U(h[s].kv_cmp), h[s].idx = U(h[s].idx);
    }
    int rc = IN(be)->sparse_attn_seqs(IN(be), U(q), m, nh, d, h, n_seq, U(seq_of), U(sink), sc, U(o), e);
    free(h);
    return rc;
}
static int g_pool_seqs(const di_backend *be, const float *a, const float *g, int r, int64_t d, int nb,
                       const di_pool_seq *seqs, int n_seq, const int32_t *ent_seq, int64_t n_out, uint16_t *y,
                       di_error *e) {
    no_op_on_side("pool_seqs");
    di_pool_seq *h = malloc(sizeof *h * (size_t)n_seq); /* [n_seq] host descriptors, unhidden */
    if (!h) return di_error_set(e, DI_ERR_NOMEM, "guarded descriptors");
    for (int s = 0; s < n_seq; s++) h[s] = U(seqs)[s], h[s].state = U(h[s].state);
    int rc = IN(be)->compress_pool_seqs(IN(be), U(a), U(g), r, d, nb, h, n_seq, U(ent_seq), n_out, U(y), e);
    free(h);
    return rc;
}
/* a held side op, as the wrapper would have run it when issued */
static int run_held(const di_backend *be, const held *h, di_error *e) {
    switch (h->op) {
    case H_LINEAR_FP8:
        return IN(be)->linear_fp8(IN(be), U((const uint16_t *)h->a), h->m, h->k, U((const uint8_t *)h->b),
                                  U((const uint8_t *)h->c), h->n, U((uint16_t *)h->out), e);
    case H_ROPE:
        return IN(be)->rope(IN(be), U((uint16_t *)h->out), h->m, h->i0, h->i1, h->i2, U((const int64_t *)h->a),
                            U((const float *)h->b), h->inv, e);
    case H_SWIGLU:
        return IN(be)->swiglu(IN(be), U((const uint16_t *)h->a), U((const uint16_t *)h->b), h->m, h->n,
                              U((const float *)h->c), h->f, U((uint16_t *)h->out), e);
    }
    return di_error_set(e, DI_ERR_INTERNAL, "held side op %d", (int)h->op);
}

static void g_destroy(di_backend *be) {
    di_backend_destroy((di_backend *)be->impl);
    free(be);
}

/* the fused slots (cpu_fused.h): the graph's hc_pre chain and device-side top-k gather */
static long g_fused_calls[2]; /* hc_pre, gather_topk */
static int g_hc_pre(const di_backend *be, uint16_t *x, const uint16_t *z, const float *pi, const float *ci, int64_t m, int hc,
                    int64_t d, const float *fn, float ne, const float *sc, const float *b, int it, float he, const float *pin,
                    const uint16_t *nw, float *mx, float *pre, float *post, float *comb, uint16_t *h, di_error *e) {
    no_op_on_side("hc_pre");
    g_fused_calls[0]++;
    return di_cpu_hc_pre(IN(be), U(x), U(z), U(pi), U(ci), m, hc, d, U(fn), ne, U(sc), U(b), it, he, U(pin), U(nw), U(mx),
                         U(pre), U(post), U(comb), U(h), e);
}
static int g_gather_topk(const di_backend *be, di_row_codec c, const uint8_t *base, int64_t n, const int32_t *pages, int64_t pe,
                         int64_t pr, int64_t ro, const int32_t *top, int64_t m, int k, int64_t d, int32_t row0, uint16_t *rows,
                         int32_t *idx, int64_t ldi, di_error *e) {
    no_op_on_side("gather_topk");
    g_fused_calls[1]++;
    return di_cpu_gather_topk(IN(be), c, U(base), n, U(pages), pe, pr, ro, U(top), m, k, d, row0, U(rows), U(idx), ldi, e);
}

/* the prefill experts (moe_grouped): the host plan's start_h and the expert table stay host memory, every
 * backend pointer in them loses the bit */
static long g_grouped_calls;
static int g_moe_grouped(const di_backend *be, const uint16_t *x, int64_t m, int64_t d, int64_t inter, int k, int n_exp,
                         const di_moe_expert *ex, const di_moe_plan *plan, float lim, float *acc, void *ws, di_error *e) {
    no_op_on_side("moe_grouped");
    g_grouped_calls++;
    di_moe_expert *tab = malloc(sizeof *tab * (size_t)(n_exp > 0 ? n_exp : 1));
    if (!tab) return di_error_set(e, DI_ERR_NOMEM, "guarded moe_grouped: expert table");
    for (int i = 0; i < n_exp; i++)
        tab[i] = (di_moe_expert){U(ex[i].w1), U(ex[i].s1), U(ex[i].w3), U(ex[i].s3), U(ex[i].w2), U(ex[i].s2)};
    di_moe_plan p = {plan->n, plan->start_h, U(plan->start), U(plan->rows), U(plan->roww), U(plan->rank)};
    int rc = IN(be)->moe_grouped(IN(be), U(x), m, d, inter, k, n_exp, tab, &p, lim, U(acc), U(ws), e);
    free(tab);
    return rc;
}

static bool g_fused; /* the guarded backend offers the fused slots (the graph then takes that path) */

static di_backend *guarded(void) {
    di_backend *in = NULL, *be = calloc(1, sizeof *be);
    di_error err;
    assert_non_null(be);
    assert_int_equal(di_backend_cpu_create(1, &in, &err), DI_OK);
    *be = (di_backend){.name = "guarded-cpu", .impl = in, .destroy = g_destroy, .host_memory = false,
                       .mem_alloc = g_alloc, .mem_free = g_free, .mem_upload = g_upload, .mem_download = g_download,
                       .mem_copy = g_copy, .mem_set = g_set, .mem_map_host = g_map, .mem_unmap_host = g_unmap,
                       .row_encode = g_row_encode, .row_decode = g_row_decode, .linear_fp8 = g_linear_fp8,
                       .linear_fp4 = g_linear_fp4, .linear_bf16 = g_linear_bf16, .linear_f32 = g_linear_f32,
                       .linear_grouped_bf16 = g_grouped, .rmsnorm = g_rmsnorm, .rope = g_rope, .qdq_fp8 = g_qdq_fp8,
                       .qdq_fp4_e8m0 = g_qdq_e8m0, .qdq_fp4_e4m3 = g_qdq_e4m3, .embed = g_embed, .hc_mixes = g_mixes,
                       .hc_sinkhorn = g_sinkhorn, .hc_collapse = g_collapse, .hc_expand = g_expand,
                       .compress_pool = g_pool, .indexer_scores = g_iscores, .candidate_mask = g_cand, .topk = g_topk,
                       .sparse_attn = g_attn, .router = g_router, .swiglu = g_swiglu, .gather_rows = g_gather,
                       .scatter_add_rows = g_scatter, .f32_to_bf16 = g_to_bf16, .fill_f32 = g_fill,
                       .stream_mean = g_smean, .engram_lookup = g_eg_lookup, .engram_gate = g_eg_gate,
                       .row_encode_scatter = g_row_encode_scatter, .row_decode_gather = g_row_decode_gather,
                       .compress_pool_ring = g_pool_ring, .sparse_attn_seqs = g_attn_seqs,
                       .compress_pool_seqs = g_pool_seqs};
    if (g_fused) be->hc_pre = g_hc_pre, be->gather_topk = g_gather_topk, be->moe_grouped = g_moe_grouped;
    if (g_lanes) be->side_begin = l_begin, be->side_end = l_end, be->side_join = l_join;
    return be;
}

/* ---------------- the two runs ---------------- */

typedef struct side {
    di_model *m;
    di_backend *be;
} side;

static void open_side(side *s, const char *dir, bool guard) {
    di_error err;
    assert_int_equal(di_model_open(dir, &s->m, &err), DI_OK);
    if (guard) {
        s->be = guarded();
    } else {
        assert_int_equal(di_backend_cpu_create(1, &s->be, &err), DI_OK);
    }
    int rc = di_model_to_backend(s->m, s->be, &err);
    if (rc) fail_msg("%s", err.msg);
}

static void close_side(side *s) {
    di_model_close(s->m); /* weights first: they live in the backend's memory */
    di_backend_destroy(s->be);
}

static void same_bytes(const void *a, const void *b, size_t n, const char *what) {
    if (memcmp(a, b, n)) fail_msg("%s differs between the plain and the guarded backend", what);
}

static void same_prefill(const di_prefill_out *a, const di_prefill_out *b, int64_t hc, int64_t D, const char *what) {
    char nm[96];
    for (int L = 0; L < a->n_layers; L++) {
        snprintf(nm, sizeof nm, "%s layer %d output", what, L);
        same_bytes(a->layer_out[L], b->layer_out[L], sizeof(uint16_t) * (size_t)(a->T * hc * D), nm);
        same_bytes(a->premix[L], b->premix[L], sizeof(float) * (size_t)(a->T * hc), nm);
        if (a->topk[L]) same_bytes(a->topk[L], b->topk[L], sizeof(int32_t) * (size_t)(a->T * a->topk_k[L]), nm);
        if (a->index_scores[L])
            same_bytes(a->index_scores[L], b->index_scores[L], sizeof(float) * (size_t)(a->T * a->n_keys[L]), nm);
    }
    if (a->logits) same_bytes(a->logits, b->logits, sizeof(float) * (size_t)(a->T * a->vocab), "prompt logits");
}

/* Free-running and teacher-forced prefill, and the op-vector checks, on both backends. */
static void test_prefill_and_verify(void **state) {
    (void)state;
    const char *dir = tu_data("v41-tiny-sel");
    side p, g;
    open_side(&p, dir, false);
    open_side(&g, dir, true);
    {   /* the weights are in g's memory now: moving them again is a no-op, to another backend an error */
        di_error err;
        assert_int_equal(di_model_to_backend(g.m, g.be, &err), DI_OK);
        di_backend *other = guarded();
        assert_int_equal(di_model_to_backend(g.m, other, &err), DI_ERR_INVALID);
        assert_non_null(strstr(err.msg, "another backend"));
        di_backend_destroy(other);
    }
    di_error err;
    di_golden *gold = NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/golden.safetensors", dir);
    assert_int_equal(di_golden_open(path, &p.m->cfg, &gold, &err), DI_OK);
    const di_config *cfg = &p.m->cfg;
    int64_t T = gold->T, hc = cfg->hc_mult, D = cfg->hidden_size;
    di_prefill_out a, b;
    assert_int_equal(di_prefill(p.m, p.be, gold->prompt_ids, T, NULL, &a, &err), DI_OK);
    assert_int_equal(di_prefill(g.m, g.be, gold->prompt_ids, T, NULL, &b, &err), DI_OK);
    same_prefill(&a, &b, hc, D, "free-running");
    di_prefill_out_free(&a), di_prefill_out_free(&b);

    const uint16_t **xin = calloc((size_t)cfg->n_layers, sizeof *xin);
    const float **pin = calloc((size_t)cfg->n_layers, sizeof *pin);
    assert_non_null(xin), assert_non_null(pin);
    for (int L = 1; L < cfg->n_layers; L++) xin[L] = gold->layer_out[L - 1], pin[L] = gold->premix[L - 1];
    assert_int_equal(di_prefill_teacher_forced(p.m, p.be, gold->prompt_ids, T, xin, pin, NULL, &a, &err), DI_OK);
    assert_int_equal(di_prefill_teacher_forced(g.m, g.be, gold->prompt_ids, T, xin, pin, NULL, &b, &err), DI_OK);
    same_prefill(&a, &b, hc, D, "teacher-forced");
    di_prefill_out_free(&a), di_prefill_out_free(&b);
    free(xin), free(pin);

    di_verify_ops_report ra, rb;
    assert_int_equal(di_verify_ops(p.be, tu_data("kernels.safetensors"), NULL, &ra, &err), DI_OK);
    assert_int_equal(di_verify_ops(g.be, tu_data("kernels.safetensors"), NULL, &rb, &err), DI_OK);
    assert_int_equal(ra.n, rb.n);
    for (int i = 0; i < ra.n; i++) assert_true(ra.ops[i].value == rb.ops[i].value);
    assert_true(rb.pass);
    /* the whole verify (its top-k check on the reference's scores stages the op's inputs too) */
    di_verify_opts vo;
    di_verify_opts_default(&vo);
    di_verify_report va = {0}, vb = {0};
    assert_int_equal(di_verify_run(p.m, p.be, gold, &vo, &va, &err), DI_OK);
    assert_int_equal(di_verify_run(g.m, g.be, gold, &vo, &vb, &err), DI_OK);
    assert_true(va.pass && vb.pass);
    assert_true(va.logits_rel == vb.logits_rel);
    for (int L = 0; L < va.n_layers; L++) {
        assert_true(va.layers[L].tf_rel == vb.layers[L].tf_rel);
        assert_int_equal(va.layers[L].topk_bad, vb.layers[L].topk_bad);
        assert_int_equal(va.layers[L].topk_identical, vb.layers[L].topk_identical);
    }
    tu_report("guarded backend: prefill (T=%lld, %d layers, free + teacher-forced), %d op checks and the verify report "
              "(logits rel %.4e) bit-identical",
              (long long)T, cfg->n_layers, rb.n, vb.logits_rel);
    di_verify_report_free(&va), di_verify_report_free(&vb);
    di_golden_close(gold);
    close_side(&g);
    close_side(&p);
}

/* One sequence: chunked prompt, decode steps with DSpark drafts, rollback, prefix export + restore. */
static void test_session(void **state) {
    (void)state;
    const char *dir = tu_data("v41-tiny-sel");
    side sd[2];
    open_side(&sd[0], dir, false);
    open_side(&sd[1], dir, true);
    const di_config *cfg = &sd[0].m->cfg;
    int64_t V = cfg->vocab_size, B = cfg->dspark_block_size;
    enum { T = 45 };
    int32_t prompt[T];
    for (int i = 0; i < T; i++) prompt[i] = (int32_t)((i * 37 + 11) % V);
    const int64_t chunks[] = {7, 1, 20, 17};
    float *lg[2], *dl[2], conf[2][16];
    int32_t ids[2][16], tok[2] = {0, 0};
    di_session *s[2];
    uint8_t *img[2];
    int64_t img_n[2];
    di_error err;
    for (int k = 0; k < 2; k++) {
        lg[k] = malloc(sizeof(float) * (size_t)(T * V));
        dl[k] = malloc(sizeof(float) * (size_t)(B * V));
        assert_non_null(lg[k]), assert_non_null(dl[k]);
        di_session_opts so = {.max_tokens = 128, .spec_margin = -1, .dspark = true};
        assert_int_equal(di_session_create(sd[k].m, sd[k].be, &so, &s[k], &err), DI_OK);
        int64_t p = 0;
        for (int c = 0; c < 4; c++) { /* chunked prefill, every position's logits */
            assert_int_equal(di_session_forward(s[k], prompt + p, chunks[c], true, lg[k] + p * V, NULL, &err), DI_OK);
            p += chunks[c];
        }
        for (int step = 0; step < 4; step++) { /* decode: draft, then feed the draft's first token */
            assert_int_equal(di_session_draft(s[k], tok[k] = (int32_t)((step * 5 + 3) % V), NULL, NULL, ids[k], conf[k],
                                              dl[k], NULL, &err),
                             DI_OK);
            assert_int_equal(di_session_forward(s[k], &ids[k][0], 1, false, lg[k], NULL, &err), DI_OK);
        }
        /* a verify block of B+1 tokens, rolled back by 3, then continued */
        assert_int_equal(di_session_forward(s[k], ids[k], B + 1, true, lg[k], NULL, &err), DI_OK);
        assert_int_equal(di_session_rollback(s[k], 3, &err), DI_OK);
        assert_int_equal(di_session_forward(s[k], prompt, 2, false, lg[k], NULL, &err), DI_OK);
        img_n[k] = di_cache_image_bytes(s[k]->cache);
        img[k] = malloc((size_t)img_n[k]);
        assert_non_null(img[k]);
        assert_int_equal(di_cache_image(s[k]->cache, img[k], img_n[k], NULL, &err), DI_OK);
    }
    same_bytes(lg[0], lg[1], sizeof(float) * (size_t)V, "logits after rollback");
    same_bytes(dl[0], dl[1], sizeof(float) * (size_t)(B * V), "draft logits");
    same_bytes(conf[0], conf[1], sizeof(float) * (size_t)B, "draft confidence");
    same_bytes(ids[0], ids[1], sizeof(int32_t) * (size_t)(B + 1), "draft ids");
    assert_int_equal(img_n[0], img_n[1]);
    same_bytes(img[0], img[1], (size_t)img_n[0], "cache image");

    /* prefix: export [0, A) from the guarded sequence, restore it into both, compare the replay's logits */
    int64_t A = (di_session_len(s[1]) / di_cache_prefix_align(s[1]->cache)) * di_cache_prefix_align(s[1]->cache);
    int64_t nb = di_cache_prefix_span_bytes(s[1]->cache, 0, A);
    uint8_t *span = malloc((size_t)nb + 1);
    assert_non_null(span);
    assert_int_equal(di_cache_prefix_export(s[1]->cache, 0, A, span, nb, &err), DI_OK);
    int32_t *hist = malloc(sizeof(int32_t) * (size_t)A);
    assert_non_null(hist);
    for (int64_t i = 0; i < A; i++) hist[i] = (int32_t)((i * 13 + 1) % V);
    const uint8_t *spans[1] = {span};
    for (int k = 0; k < 2; k++)
        assert_int_equal(di_session_prefix_restore(s[k], hist, -1, spans, &A, 1, lg[k], NULL, &err), DI_OK);
    same_bytes(lg[0], lg[1], sizeof(float) * (size_t)V, "prefix replay logits");
    tu_report("guarded backend: session (chunks 7,1,20,17, 4 draft+decode steps, verify block %lld, rollback 3, prefix "
              "restore of %lld tokens): logits, drafts and cache image (%lld bytes) bit-identical",
              (long long)(B + 1), (long long)A, (long long)img_n[0]);
    free(span), free(hist);
    for (int k = 0; k < 2; k++) {
        di_session_destroy(s[k]);
        free(lg[k]), free(dl[k]), free(img[k]);
        close_side(&sd[k]);
    }
}

/* the same two runs with the fused slots on the faulting backend (the plain CPU side stays unfused) */
static int fused_on(void **state) {
    (void)state;
    g_fused = true;
    g_fused_calls[0] = g_fused_calls[1] = 0;
    g_grouped_calls = 0;
    return 0;
}
static int fused_off(void **state) { /* the fused path must have run */
    (void)state;
    g_fused = false;
    tu_report("fused slots called: hc_pre %ld, gather_topk %ld", g_fused_calls[0], g_fused_calls[1]);
    return g_fused_calls[0] > 0 && g_fused_calls[1] > 0 ? 0 : -1;
}
/* the prefill of test_prefill_and_verify (T = 130 > 64) also takes moe_grouped on the faulting backend
 * (the plain side takes the CPU slot, the unfused guarded side the graph's per-expert loop) */
static int fused_off_grouped(void **state) {
    tu_report("moe_grouped called: %ld", g_grouped_calls);
    return g_grouped_calls > 0 ? fused_off(state) : -1;
}

/* the same runs with the side lane: its ops run when issued (1) or held until the join (2) */
static int lanes_on(int mode, bool fused) {
    g_lanes = mode, g_lane = 0, g_regions = g_side_ops = 0, g_lane_error = NULL, g_n_held = 0;
    return fused ? fused_on(NULL) : 0;
}
static int lanes_off(bool fused, bool grouped) {
    int mode = g_lanes;
    g_lanes = 0;
    tu_report("side lane (%s): %ld lanes, %ld side ops%s%s", mode == 2 ? "held to the join" : "run when issued",
              g_regions, g_side_ops, g_lane_error ? ": " : "", g_lane_error ? g_lane_error : "");
    /* every lane ends and joins; a block opens two, the attention's (linear_fp8 + rope) and the MoE's
     * (three linear_fp8 and a swiglu): 6 side ops per pair */
    if (g_lane_error || g_lane != 0 || g_regions < 2 || g_regions % 2 || g_side_ops != 3 * g_regions) return -1;
    return !fused ? 0 : grouped ? fused_off_grouped(NULL) : fused_off(NULL);
}
static int held_on(void **state) { return lanes_on(2, false); }
static int held_off(void **state) { return lanes_off(false, false); }
static int issued_on(void **state) { return lanes_on(1, false); }
static int issued_off(void **state) { return lanes_off(false, false); }
static int held_fused_on(void **state) { return lanes_on(2, true); }
static int held_fused_off_grouped(void **state) { return lanes_off(true, true); }
static int held_fused_off(void **state) { return lanes_off(true, false); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_and_verify),
        cmocka_unit_test(test_session),
        cmocka_unit_test_setup_teardown(test_prefill_and_verify, fused_on, fused_off_grouped),
        cmocka_unit_test_setup_teardown(test_session, fused_on, fused_off),
        cmocka_unit_test_setup_teardown(test_session, issued_on, issued_off),
        cmocka_unit_test_setup_teardown(test_prefill_and_verify, held_on, held_off),
        cmocka_unit_test_setup_teardown(test_session, held_on, held_off),
        cmocka_unit_test_setup_teardown(test_prefill_and_verify, held_fused_on, held_fused_off_grouped),
        cmocka_unit_test_setup_teardown(test_session, held_fused_on, held_fused_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
