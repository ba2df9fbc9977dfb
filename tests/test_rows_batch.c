/* The batched cache-row slots (backend.h "batched cache rows", backend/cpu/rows_batch.c) against the
 * per-row calls they replace, and the launches a forward issues with them:
 *  - row_encode_scatter / row_decode_gather give the bytes and values of row_encode / row_decode row by
 *    row, for every codec at the V4.1 widths (head_dim 512, index head dim 128), rows listed in a
 *    shuffled order with skipped (NULL) entries, on values that hit every quantizer branch;
 *  - sparse_attn_seqs gives each query sparse_attn's output on its sequence alone;
 *  - compress_pool_ring gives the entries and every state byte of compress_pool called group by group
 *    on block g mod nb, over chunks that start and end inside groups, for both CPU kernel sets, and
 *    compress_pool_seqs those of compress_pool_ring sequence by sequence;
 *  - a counting backend shows the forward's cache-row and pooling calls per layer: one encode per cache
 *    array per pass, one decode for the window rows and one for the index keys of all sequences, one
 *    pooling call and one sparse attention call per layer, whatever the number of tokens or sequences.
 * di-test: asan */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_attn.h"
#include "io/formats.h"
#include "model/cache.h"
#include "model/config.h"
#include "model/session.h"
#include "model/weights.h"
#include "testutil.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float next_f(void) { return (float)((next_u32() & 0xffffff) / 16777216.0 * 2.0 - 1.0); }

/* bf16 [n, d] with the quantizers' edge cases sprinkled over groups: zeros (the amax floor), huge and
 * tiny magnitudes, ±inf and NaN (the NaN group rules), subnormals. */
static void fill_rows(uint16_t *x, int64_t n, int64_t d) {
    for (int64_t i = 0; i < n * d; i++) {
        float scale = (float)ldexp(1.0, (int)(next_u32() % 40) - 20);
        x[i] = di_f32_to_bf16(next_f() * scale);
    }
    for (int64_t r = 0; r < n; r++) {
        uint16_t *row = x + r * d;
        switch (r % 7) {
        case 1: memset(row, 0, sizeof(uint16_t) * 32); break;
        case 2: row[3] = 0x7f80; break;            /* +inf */
        case 3: row[5] = 0x7fc1; break;            /* NaN */
        case 4: row[d - 1] = 0x0001; break;        /* subnormal */
        case 5: for (int j = 0; j < 16; j++) row[j] = 0x7f00 | (uint16_t)j; break; /* near max */
        default: break;
        }
    }
}

static void test_encode_decode(void **state) {
    di_backend *be;
    di_error err = {0};
    assert_int_equal(di_backend_cpu_create(1, &be, &err), DI_OK);
    const int64_t widths[2] = {512, 128}, n = 67;
    for (int c = DI_CODEC_FP8_E8M0; c <= DI_CODEC_FP4_E8M0; c++)
        for (int wi = 0; wi < 2; wi++) {
            int64_t d = widths[wi], rb = di_row_codec_bytes((di_row_codec)c, d);
            uint16_t *x = malloc(sizeof(uint16_t) * (size_t)(n * d));     /* bf16 [n, d] */
            uint8_t *ref = calloc((size_t)(n * rb), 1);                    /* [n, rb] row_encode */
            uint8_t *got = calloc((size_t)((n + 5) * rb), 1);              /* [n + 5, rb] scattered */
            uint8_t **dst = malloc(sizeof(uint8_t *) * (size_t)n);        /* [n] */
            const uint8_t **src = malloc(sizeof(uint8_t *) * (size_t)n);  /* [n] */
            int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);            /* int32 [n] */
            uint16_t *y0 = malloc(sizeof(uint16_t) * (size_t)(n * d)), *y1 = malloc(sizeof(uint16_t) * (size_t)(n * d));
            fill_rows(x, n, d);
            assert_int_equal(be->row_encode(be, (di_row_codec)c, x, n, d, ref, &err), DI_OK);
            /* row i goes to slot (i·37 + 5) mod (n+5): a permutation over a larger array; every 9th row
             * skipped, its slot left as it was */
            memset(got, 0xa5, (size_t)((n + 5) * rb));
            for (int64_t i = 0; i < n; i++) dst[i] = i % 9 == 4 ? NULL : got + ((i * 37 + 5) % (n + 5)) * rb;
            assert_int_equal(be->row_encode_scatter(be, (di_row_codec)c, x, n, d, dst, &err), DI_OK);
            for (int64_t i = 0; i < n; i++) {
                if (!dst[i]) continue;
                if (memcmp(dst[i], ref + i * rb, (size_t)rb)) fail_msg("codec %d width %lld: row %lld differs", c, (long long)d, (long long)i);
            }
            int64_t untouched = 0;
            for (int64_t s = 0; s < n + 5; s++) {
                bool listed = false;
                for (int64_t i = 0; i < n; i++) listed |= dst[i] == got + s * rb;
                if (!listed) {
                    for (int64_t b = 0; b < rb; b++) assert_int_equal(got[s * rb + b], 0xa5);
                    untouched++;
                }
            }
            assert_true(untouched >= 5 + n / 9);
            /* the decode of listed rows in reverse order, every 5th a zero row */
            for (int64_t i = 0; i < n; i++) {
                int64_t r = n - 1 - i;
                ids[i] = i % 5 == 2 ? -1 : (int32_t)r;
                src[i] = ids[i] < 0 ? NULL : ref + r * rb;
            }
            assert_int_equal(be->row_decode(be, (di_row_codec)c, ref, ids, n, d, y0, &err), DI_OK);
            memset(y1, 0x5a, sizeof(uint16_t) * (size_t)(n * d));
            assert_int_equal(be->row_decode_gather(be, (di_row_codec)c, src, n, d, y1, &err), DI_OK);
            assert_memory_equal(y0, y1, sizeof(uint16_t) * (size_t)(n * d));
            free(x), free(ref), free(got), free(dst), free(src), free(ids), free(y0), free(y1);
        }
    /* a width that is not a multiple of the group is refused, as by row_encode */
    uint8_t *none = NULL;
    assert_int_equal(be->row_encode_scatter(be, DI_CODEC_FP4_E4M3, NULL, 1, 24, &none, &err), DI_ERR_INVALID);
    tu_report("row codecs: 3 codecs x widths 512, 128: scatter / gather bytes identical to row_encode / row_decode");
    di_backend_destroy(be);
}

/* compress_pool_ring over the chunks [cuts[i], cuts[i+1]) against compress_pool group by group. */
static void ring_case(const di_backend *be, int R, int nb, int64_t d, const int64_t *cuts, int n_cuts) {
    di_error err = {0};
    int64_t m = cuts[n_cuts - 1], blk = 2 * (int64_t)R * d;
    float *a = malloc(sizeof(float) * (size_t)(m * d)), *g = malloc(sizeof(float) * (size_t)(m * d)); /* f32 [m, d] */
    float *s0 = malloc(sizeof(float) * (size_t)(nb * blk)), *s1 = malloc(sizeof(float) * (size_t)(nb * blk)); /* f32 [nb, 2, R, d] */
    uint16_t *y0 = calloc((size_t)((m / R + 1) * d), 2), *y1 = calloc((size_t)((m / R + 1) * d), 2); /* bf16 [m/R, d] */
    for (int64_t i = 0; i < m * d; i++) a[i] = next_f() * 3.0f, g[i] = next_f() * 8.0f;
    for (int b = 0; b < nb; b++) {
        assert_int_equal(di_cpu_compress_state_reset(s0 + b * blk, s0 + b * blk + R * d, R, d, &err), DI_OK);
    }
    memcpy(s1, s0, sizeof(float) * (size_t)(nb * blk));
    int64_t e0 = 0, e1 = 0;
    for (int k = 0; k + 1 < n_cuts; k++) {
        int64_t p0 = cuts[k], p1 = cuts[k + 1];
        for (int64_t p = p0; p < p1;) { /* the per-group calls of the old graph */
            int64_t end = (p / R + 1) * R;
            if (end > p1) end = p1;
            float *kv = s0 + ((p / R) % nb) * blk;
            int64_t n_out = 0;
            assert_int_equal(be->compress_pool(be, a + p * d, g + p * d, end - p, p, R, d, kv, kv + R * d, y0 + e0 * d,
                                               &n_out, &err), DI_OK);
            e0 += n_out;
            p = end;
        }
        assert_int_equal(be->compress_pool_ring(be, a + p0 * d, g + p0 * d, p1 - p0, p0, R, d, s1, nb, y1 + e1 * d, &err),
                         DI_OK);
        e1 += p1 / R - p0 / R;
        assert_int_equal(e0, e1);
        assert_memory_equal(s0, s1, sizeof(float) * (size_t)(nb * blk)); /* every state byte, after every chunk */
    }
    assert_int_equal(e1, m / R);
    assert_memory_equal(y0, y1, sizeof(uint16_t) * (size_t)(e1 * d));
    free(a), free(g), free(s0), free(s1), free(y0), free(y1);
}

/* compress_pool_seqs against compress_pool_ring per sequence: B sequences at different positions (inside
 * and at the ends of groups, several groups), each with its own ring. */
static void pool_seqs_case(const di_backend *be, int R, int nb, int64_t d) {
    enum { B = 5 };
    const int64_t s0[B] = {0, 7, 130, 3, 64}, m[B] = {1, 9, 1, 40, 2};
    di_error err = {0};
    int64_t rows = 0, n_out = 0, blk = 2 * (int64_t)R * d;
    di_pool_seq ps[B];
    float *st0[B], *st1[B];
    for (int b = 0; b < B; b++) {
        st0[b] = malloc(sizeof(float) * (size_t)(nb * blk)), st1[b] = malloc(sizeof(float) * (size_t)(nb * blk));
        for (int64_t i = 0; i < nb * blk; i++) st0[b][i] = next_f() * 4.0f; /* a ring mid-sequence */
        memcpy(st1[b], st0[b], sizeof(float) * (size_t)(nb * blk));
        ps[b] = (di_pool_seq){.state = st1[b], .start_pos = s0[b], .m = m[b], .row0 = rows, .out0 = n_out};
        rows += m[b], n_out += (s0[b] + m[b]) / R - s0[b] / R;
    }
    float *a = malloc(sizeof(float) * (size_t)(rows * d)), *g = malloc(sizeof(float) * (size_t)(rows * d));
    uint16_t *y0 = calloc((size_t)(n_out * d + 1), 2), *y1 = calloc((size_t)(n_out * d + 1), 2);
    int32_t *es = malloc(sizeof(int32_t) * (size_t)(n_out + 1));
    for (int64_t i = 0; i < rows * d; i++) a[i] = next_f(), g[i] = next_f() * 6.0f;
    for (int b = 0; b < B; b++) {
        assert_int_equal(be->compress_pool_ring(be, a + ps[b].row0 * d, g + ps[b].row0 * d, m[b], s0[b], R, d, st0[b], nb,
                                                y0 + ps[b].out0 * d, &err), DI_OK);
        for (int64_t e = ps[b].out0; e < ps[b].out0 + (s0[b] + m[b]) / R - s0[b] / R; e++) es[e] = b;
    }
    assert_int_equal(be->compress_pool_seqs(be, a, g, R, d, nb, ps, B, es, n_out, y1, &err), DI_OK);
    assert_memory_equal(y0, y1, sizeof(uint16_t) * (size_t)(n_out * d));
    for (int b = 0; b < B; b++) assert_memory_equal(st0[b], st1[b], sizeof(float) * (size_t)(nb * blk));
    assert_int_equal(be->compress_pool_seqs(be, a, g, R, d, nb, ps, B, es, n_out + 1, y1, &err), DI_ERR_INVALID);
    for (int b = 0; b < B; b++) free(st0[b]), free(st1[b]);
    free(a), free(g), free(y0), free(y1), free(es);
}

static void test_pool_ring(void **state) {
    const int64_t cuts_a[] = {0, 1, 2, 7, 8, 30, 31, 64, 65, 66, 100};
    const int64_t cuts_b[] = {0, 3, 4, 5, 9, 10, 11, 60};
    for (int v = 0; v < 2; v++) {
        di_backend *be;
        di_error err = {0};
        assert_int_equal(di_backend_cpu_create_variant(2, v ? DI_CPU_SCALAR : DI_CPU_FAST, &be, &err), DI_OK);
        for (int nb = 1; nb <= 5; nb++) {
            ring_case(be, 2, nb, 512, cuts_a, (int)(sizeof cuts_a / sizeof *cuts_a));
            ring_case(be, 4, nb, 64, cuts_b, (int)(sizeof cuts_b / sizeof *cuts_b));
        }
        pool_seqs_case(be, 2, 5, 512);
        pool_seqs_case(be, 4, 3, 64);
        float st[2 * 2 * 8];
        uint16_t y[8];
        assert_int_equal(be->compress_pool_ring(be, NULL, NULL, 1, 0, 2, 8, st, 0, y, &err), DI_ERR_INVALID);
        di_backend_destroy(be);
    }
    tu_report("compress_pool_ring: ratios 2 (width 512) and 4, 1-5 state blocks, 2 kernel sets: entries and state "
              "identical to compress_pool group by group");
}

/* sparse_attn_seqs against sparse_attn sequence by sequence: 3 sequences with their own key sets (one
 * without compressed rows) and index list widths, both CPU kernel sets. */
static void test_attn_seqs(void **state) {
    enum { B = 3, NH = 4, D = 64 };
    const int64_t Ts[B] = {1, 5, 2}, nw[B] = {16, 9, 16}, nc[B] = {7, 0, 30}, ni[B] = {23, 9, 40};
    int64_t m = Ts[0] + Ts[1] + Ts[2];
    uint16_t *q = malloc(sizeof(uint16_t) * (size_t)(m * NH * D)), *o0 = calloc((size_t)(m * NH * D), 2),
             *o1 = calloc((size_t)(m * NH * D), 2); /* bf16 [m, NH, D] */
    uint16_t *kv[B][2];
    int32_t *ix[B], seq_of[8];
    float sink[NH] = {0.5f, -1.0f, 2.0f, -INFINITY};
    di_attn_seq ds[B];
    for (int64_t i = 0; i < m * NH * D; i++) q[i] = di_f32_to_bf16(next_f() * 0.3f);
    for (int b = 0, q0 = 0; b < B; b++) {
        kv[b][0] = malloc(sizeof(uint16_t) * (size_t)(nw[b] * D));
        kv[b][1] = nc[b] ? malloc(sizeof(uint16_t) * (size_t)(nc[b] * D)) : NULL;
        for (int64_t i = 0; i < nw[b] * D; i++) kv[b][0][i] = di_f32_to_bf16(next_f());
        for (int64_t i = 0; i < nc[b] * D; i++) kv[b][1][i] = di_f32_to_bf16(next_f());
        ix[b] = malloc(sizeof(int32_t) * (size_t)(Ts[b] * ni[b]));
        for (int64_t i = 0; i < Ts[b] * ni[b]; i++) ix[b][i] = next_u32() % 7 == 0 ? -1 : (int32_t)(next_u32() % (nw[b] + nc[b]));
        ds[b] = (di_attn_seq){kv[b][0], nw[b], kv[b][1], nc[b], ix[b], ni[b], q0, Ts[b]};
        for (int64_t t = 0; t < Ts[b]; t++) seq_of[q0 + t] = b;
        q0 += (int)Ts[b];
    }
    for (int v = 0; v < 2; v++) {
        di_backend *be;
        di_error err = {0};
        assert_int_equal(di_backend_cpu_create_variant(2, v ? DI_CPU_SCALAR : DI_CPU_FAST, &be, &err), DI_OK);
        for (int b = 0; b < B; b++)
            assert_int_equal(be->sparse_attn(be, q + ds[b].q0 * NH * D, Ts[b], NH, D, kv[b][0], nw[b], kv[b][1], nc[b],
                                             sink, ix[b], ni[b], 0.125f, o0 + ds[b].q0 * NH * D, &err), DI_OK);
        assert_int_equal(be->sparse_attn_seqs(be, q, m, NH, D, ds, B, seq_of, sink, 0.125f, o1, &err), DI_OK);
        assert_memory_equal(o0, o1, sizeof(uint16_t) * (size_t)(m * NH * D));
        /* descriptors that do not cover the call's rows are refused */
        assert_int_equal(be->sparse_attn_seqs(be, q, m + 1, NH, D, ds, B, seq_of, sink, 0.125f, o1, &err), DI_ERR_INVALID);
        di_backend_destroy(be);
    }
    for (int b = 0; b < B; b++) free(kv[b][0]), free(kv[b][1]), free(ix[b]);
    free(q), free(o0), free(o1);
}

/* ---------------- the cache's address lists ---------------- */

static void same_image(const di_cache *a, const di_cache *b, const char *when) {
    di_error err = {0};
    int64_t na = di_cache_image_bytes(a), nb = di_cache_image_bytes(b), wa = 0, wb = 0;
    assert_int_equal(na, nb);
    uint8_t *ia = malloc((size_t)na), *ib = malloc((size_t)nb);
    assert_int_equal(di_cache_image(a, ia, na, &wa, &err), DI_OK);
    assert_int_equal(di_cache_image(b, ib, nb, &wb, &err), DI_OK);
    if (wa != wb || memcmp(ia, ib, (size_t)wa)) fail_msg("cache images differ %s", when);
    free(ia), free(ib);
}

/* Two caches of the V4.1 config fed the same rows, one through the per-row puts, one through the
 * address lists and one batched encode: identical images after every chunk (including a chunk longer
 * than the window ring, whose oldest rows are skipped, and a prefix resume, whose frozen entries are
 * skipped), and identical reads. */
static void test_cache_addrs(void **state) {
    di_error err = {0};
    di_config *cfg = malloc(sizeof *cfg);
    assert_int_equal(di_config_load(tu_data("v41-flash-config"), cfg, &err), DI_OK);
    di_backend *be;
    assert_int_equal(di_backend_cpu_create(1, &be, &err), DI_OK);
    di_cache_opts o = {.max_tokens = 1024, .spec_margin = 8};
    di_cache *a, *b;
    assert_int_equal(di_cache_create(cfg, &o, &a, &err), DI_OK);
    assert_int_equal(di_cache_create(cfg, &o, &b, &err), DI_OK);
    const int64_t hd = cfg->head_dim, ihd = cfg->index_head_dim, W = cfg->sliding_window;
    const int64_t chunks[] = {5, 200, 1, 1, 64, 3, 1};
    int64_t n_rows = 0;
    for (int k = 0; k < 7; k++) n_rows += chunks[k];
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)(n_rows * hd));  /* bf16 [n_rows, hd] */
    uint16_t *y0 = malloc(sizeof(uint16_t) * (size_t)(n_rows * hd)), *y1 = malloc(sizeof(uint16_t) * (size_t)(n_rows * hd));
    uint8_t **dst = malloc(sizeof(uint8_t *) * (size_t)n_rows);
    const uint8_t **src = malloc(sizeof(uint8_t *) * (size_t)n_rows);
    fill_rows(x, n_rows, hd);
    int64_t pos = 0, skipped = 0;
    for (int k = 0; k < 7; k++) {
        int64_t m = chunks[k];
        if (k == 5) { /* resume at an aligned boundary with a replay: entries below it are frozen */
            int64_t al = di_cache_prefix_align(a), bound = pos / al * al, r = bound - W > 0 ? (bound - W) / al * al : 0;
            assert_int_equal(di_cache_prefix_begin(a, bound, r, &err), DI_OK);
            assert_int_equal(di_cache_prefix_begin(b, bound, r, &err), DI_OK);
            pos = r;
            m = bound - r + 3;
        }
        assert_int_equal(di_cache_extend(a, m, &err), DI_OK);
        assert_int_equal(di_cache_extend(b, m, &err), DI_OK);
        for (int st = 0; st < cfg->n_stages; st++) {
            const uint16_t *rows = x + (pos % 97) * hd; /* any rows of x: the caches see the same */
            assert_int_equal(di_cache_window_put_rows(a, st, pos, m, rows, &err), DI_OK);
            assert_int_equal(di_cache_window_put_addrs(b, st, pos, m, dst, &err), DI_OK);
            /* one call's slots are distinct (a parallel encode must not race): the rows older than the
             * ring's reach, which share a slot with a newer row of the call, are the skipped ones */
            int64_t nul = 0;
            for (int64_t i = 0; i < m; i++) {
                nul += !dst[i];
                for (int64_t j = 0; dst[i] && j < i; j++) assert_true(dst[j] != dst[i]);
            }
            assert_int_equal(nul, m > a->ring_slots ? m - a->ring_slots : 0);
            skipped += nul;
            assert_int_equal(di_cache_rows_encode(be, DI_CACHE_ROWS_WINDOW, rows, m, hd, dst, &err), DI_OK);
            int R = cfg->layer[st].compress_ratio;
            if (st >= cfg->n_layers || !cfg->layer[st].is_kv_source || R < 1) continue;
            int64_t e0 = pos / R, e1 = (pos + m) / R;
            for (int64_t e = e0; e < e1; e++) {
                assert_int_equal(di_cache_cmp_put(a, st, e, rows + (e - e0) * hd, &err), DI_OK);
                assert_int_equal(di_cache_ikey_put(a, st, e, rows + (e - e0) * ihd, &err), DI_OK);
            }
            assert_int_equal(di_cache_entry_put_addrs(b, st, 0, e0, e1, dst, &err), DI_OK);
            for (int64_t i = 0; i < e1 - e0; i++) skipped += !dst[i];
            assert_int_equal(di_cache_rows_encode(be, DI_CACHE_ROWS_CMP, rows, e1 - e0, hd, dst, &err), DI_OK);
            assert_int_equal(di_cache_entry_put_addrs(b, st, 1, e0, e1, dst, &err), DI_OK);
            assert_int_equal(di_cache_rows_encode(be, DI_CACHE_ROWS_IKEY, rows, e1 - e0, ihd, dst, &err), DI_OK);
            /* reads of what was written: entries from the newest unfrozen one down, and keys */
            int64_t r0 = e1 > 20 ? e1 - 20 : 0;
            if (k < 5) {
                assert_int_equal(di_cache_cmp_rows(a, st, r0, e1, y0, &err), DI_OK);
                assert_int_equal(di_cache_entry_read_addrs(b, st, 0, r0, e1, src, &err), DI_OK);
                assert_int_equal(di_cache_rows_decode(be, DI_CACHE_ROWS_CMP, src, e1 - r0, hd, y1, &err), DI_OK);
                assert_memory_equal(y0, y1, sizeof(uint16_t) * (size_t)((e1 - r0) * hd));
                assert_int_equal(di_cache_ikey_rows(a, st, 0, e1, y0, &err), DI_OK);
                assert_int_equal(di_cache_entry_read_addrs(b, st, 1, 0, e1, src, &err), DI_OK);
                assert_int_equal(di_cache_rows_decode(be, DI_CACHE_ROWS_IKEY, src, e1, ihd, y1, &err), DI_OK);
                assert_memory_equal(y0, y1, sizeof(uint16_t) * (size_t)(e1 * ihd));
            }
        }
        pos += m;
        /* the window of the newest position, read both ways */
        int64_t p0 = pos - W + 1 > 0 ? pos - W + 1 : 0;
        if (k < 5) {
            assert_int_equal(di_cache_window_rows(a, 0, p0, pos, y0, &err), DI_OK);
            assert_int_equal(di_cache_window_read_addrs(b, 0, p0, pos, src, &err), DI_OK);
            assert_int_equal(di_cache_rows_decode(be, DI_CACHE_ROWS_WINDOW, src, pos - p0, hd, y1, &err), DI_OK);
            assert_memory_equal(y0, y1, sizeof(uint16_t) * (size_t)((pos - p0) * hd));
        }
        same_image(a, b, k == 5 ? "after the prefix resume" : "after a chunk");
    }
    assert_true(skipped > 0); /* the long chunk's oldest rows and the frozen entries */
    /* what a put or read would refuse is refused the same way */
    assert_int_equal(di_cache_window_put_addrs(b, 0, pos, 1, dst, &err), DI_ERR_INVALID);
    assert_int_equal(di_cache_window_read_addrs(b, 0, 0, 1, src, &err), DI_ERR_INVALID);
    assert_int_equal(di_cache_entry_put_addrs(b, 0, 0, 0, 1, dst, &err), DI_ERR_INVALID); /* stage 0: no kv */
    tu_report("cache address lists: %lld rows skipped (beyond the ring's reach or frozen), images identical to the "
              "per-row puts after every chunk", (long long)skipped);
    di_cache_destroy(a), di_cache_destroy(b);
    di_backend_destroy(be);
    free(cfg), free(x), free(y0), free(y1), free(dst), free(src);
}

/* ---------------- launches of a forward ---------------- */

enum { C_ENC, C_DEC, C_ENC_SC, C_DEC_GA, C_POOL, C_RING, C_POOL_SEQS, C_ATTN, C_ATTN_SEQS, C_ISCORE, C_TOPK, C_COPY, C_N };
static const char *const cname[C_N] = {"row_encode", "row_decode", "row_encode_scatter", "row_decode_gather",
                                       "compress_pool", "compress_pool_ring", "compress_pool_seqs", "sparse_attn",
                                       "sparse_attn_seqs", "indexer_scores", "topk", "mem_copy"};
static long g_count[C_N];
static di_backend g_in; /* the CPU table the counters forward to */

static int k_enc(const di_backend *be, di_row_codec c, const uint16_t *x, int64_t n, int64_t d, uint8_t *r,
                 di_error *e) {
    g_count[C_ENC]++;
    return g_in.row_encode(be, c, x, n, d, r, e);
}
static int k_dec(const di_backend *be, di_row_codec c, const uint8_t *r, const int32_t *ids, int64_t n, int64_t d,
                 uint16_t *y, di_error *e) {
    g_count[C_DEC]++;
    return g_in.row_decode(be, c, r, ids, n, d, y, e);
}
static int k_enc_sc(const di_backend *be, di_row_codec c, const uint16_t *x, int64_t n, int64_t d, uint8_t *const *dst,
                    di_error *e) {
    g_count[C_ENC_SC]++;
    return g_in.row_encode_scatter(be, c, x, n, d, dst, e);
}
static int k_dec_ga(const di_backend *be, di_row_codec c, const uint8_t *const *src, int64_t n, int64_t d, uint16_t *y,
                    di_error *e) {
    g_count[C_DEC_GA]++;
    return g_in.row_decode_gather(be, c, src, n, d, y, e);
}
static int k_pool(const di_backend *be, const float *a, const float *g, int64_t m, int64_t p, int r, int64_t d, float *kv,
                  float *sc, uint16_t *y, int64_t *n_out, di_error *e) {
    g_count[C_POOL]++;
    return g_in.compress_pool(be, a, g, m, p, r, d, kv, sc, y, n_out, e);
}
static int k_ring(const di_backend *be, const float *a, const float *g, int64_t m, int64_t p, int r, int64_t d,
                  float *st, int nb, uint16_t *y, di_error *e) {
    g_count[C_RING]++;
    return g_in.compress_pool_ring(&g_in, a, g, m, p, r, d, st, nb, y, e); /* its per-group calls are not launches */
}
static int k_pool_seqs(const di_backend *be, const float *a, const float *g, int r, int64_t d, int nb,
                       const di_pool_seq *seqs, int n_seq, const int32_t *ent_seq, int64_t n_out, uint16_t *y,
                       di_error *e) {
    g_count[C_POOL_SEQS]++;
    return g_in.compress_pool_seqs(&g_in, a, g, r, d, nb, seqs, n_seq, ent_seq, n_out, y, e); /* one launch pair */
}
static int k_attn(const di_backend *be, const uint16_t *q, int64_t m, int nh, int d, const uint16_t *kw, int64_t nw,
                  const uint16_t *kc, int64_t nc, const float *sink, const int32_t *idx, int64_t ni, float sc, uint16_t *o,
                  di_error *e) {
    g_count[C_ATTN]++;
    return g_in.sparse_attn(be, q, m, nh, d, kw, nw, kc, nc, sink, idx, ni, sc, o, e);
}
static int k_attn_seqs(const di_backend *be, const uint16_t *q, int64_t m, int nh, int d, const di_attn_seq *seqs,
                       int n_seq, const int32_t *seq_of, const float *sink, float sc, uint16_t *o, di_error *e) {
    g_count[C_ATTN_SEQS]++;
    return g_in.sparse_attn_seqs(&g_in, q, m, nh, d, seqs, n_seq, seq_of, sink, sc, o, e); /* one launch */
}
static int k_iscore(const di_backend *be, const uint16_t *q, const uint16_t *w, float ws, const uint16_t *k, int64_t m,
                    int nh, int hd, int64_t nk, const int32_t *vis, const uint8_t *cand, float *s, di_error *e) {
    g_count[C_ISCORE]++;
    return g_in.indexer_scores(be, q, w, ws, k, m, nh, hd, nk, vis, cand, s, e);
}
static int k_topk(const di_backend *be, const float *s, int64_t m, int64_t nk, const int32_t *vis, int k, int32_t off,
                  int32_t *out, di_error *e) {
    g_count[C_TOPK]++;
    return g_in.topk(be, s, m, nk, vis, k, off, out, e);
}
static int k_copy(const di_backend *be, void *d, const void *s, size_t n, di_error *e) {
    g_count[C_COPY]++;
    return g_in.mem_copy(be, d, s, n, e);
}

/* Runs `steps` forwards of B sequences (prefill chunk of T0 tokens each, then 1-token steps) and
 * returns the counts of the last forward. */
static void count_forward(const di_model *m, di_backend *cnt, int B, int64_t T0, int steps, long *out) {
    di_error err = {0};
    di_session *s[16];
    int32_t ids[256];
    for (int i = 0; i < 256; i++) ids[i] = (int32_t)((i * 131 + 7) % m->cfg.vocab_size);
    for (int i = 0; i < B; i++) {
        di_session_opts o = {.max_tokens = 256, .spec_margin = -1};
        assert_int_equal(di_session_create(m, cnt, &o, &s[i], &err), DI_OK);
    }
    for (int st = 0; st < steps; st++) {
        di_session_chunk ch[16];
        for (int i = 0; i < B; i++)
            ch[i] = (di_session_chunk){.s = s[i], .ids = ids + i + st, .n = st ? 1 : T0 + i};
        memset(g_count, 0, sizeof g_count);
        int rc = di_session_forward_batch(ch, B, NULL, &err);
        if (rc) fail_msg("%s", err.msg);
    }
    memcpy(out, g_count, sizeof g_count);
    for (int i = 0; i < B; i++) di_session_destroy(s[i]);
}

static void test_launch_counts(void **state) {
    di_model *m;
    di_backend *cpu;
    di_error err = {0};
    assert_int_equal(di_model_open(tu_data("v41-tiny-sel"), &m, &err), DI_OK);
    assert_int_equal(di_backend_cpu_create(1, &cpu, &err), DI_OK);
    g_in = *cpu;
    di_backend cnt = *cpu;
    cnt.row_encode = k_enc, cnt.row_decode = k_dec, cnt.row_encode_scatter = k_enc_sc, cnt.row_decode_gather = k_dec_ga;
    cnt.compress_pool = k_pool, cnt.compress_pool_ring = k_ring, cnt.sparse_attn = k_attn, cnt.sparse_attn_seqs = k_attn_seqs;
    cnt.compress_pool_seqs = k_pool_seqs;
    cnt.indexer_scores = k_iscore, cnt.topk = k_topk, cnt.mem_copy = k_copy;
    assert_int_equal(di_model_to_backend(m, &cnt, &err), DI_OK);
    int L = m->cfg.n_stages, pools = 0, indexers = 0; /* layers that pool (kv sources of ratio ≥ 2), index */
    for (int l = 0; l < L; l++) {
        pools += m->cfg.layer[l].is_kv_source && m->cfg.layer[l].compress_ratio >= 2;
        indexers += m->cfg.layer[l].is_index_source;
    }

    long pre[C_N], dec1[C_N], dec8[C_N];
    count_forward(m, &cnt, 1, 200, 1, pre);  /* prefill: one sequence, 200 tokens */
    count_forward(m, &cnt, 1, 20, 2, dec1);  /* decode step, batch 1 */
    count_forward(m, &cnt, 8, 20, 2, dec8);  /* decode step, batch 8 */
    const char *what[3] = {"prefill 200 tokens", "decode batch 1", "decode batch 8"};
    long *run[3] = {pre, dec1, dec8};
    for (int r = 0; r < 3; r++) {
        char line[512];
        int o = snprintf(line, sizeof line, "launches per forward (%d layers), %s:", L, what[r]);
        for (int k = 0; k < C_N; k++) o += snprintf(line + o, sizeof line - (size_t)o, " %s %ld", cname[k], run[r][k]);
        tu_report("%s", line);
    }
    int B[3] = {1, 1, 8};
    for (int r = 0; r < 3; r++) {
        long *c = run[r];
        /* writes: the window rows of every layer, the entries and index keys of kv sources; never per row */
        assert_int_equal(c[C_ENC], 0);
        assert_true(c[C_ENC_SC] <= 3L * L);
        /* reads of the previous window rows and of the index keys: at most one per layer and one per
         * index layer, whatever the batch */
        assert_true(c[C_DEC_GA] <= L + indexers);
        /* pooling: one call per pooling layer (one sequence: compress_pool_ring; several:
         * compress_pool_seqs), none per group or per sequence */
        assert_int_equal(c[C_POOL], 0);
        assert_int_equal(c[C_RING] + c[C_POOL_SEQS], pools);
        assert_int_equal(c[C_POOL_SEQS], B[r] > 1 ? pools : 0);
    }
    /* the key rows of every sequence come from one gather: no per-sequence copy (the copies left are
     * the graph's own, one per layer) */
    assert_int_equal(dec8[C_COPY], dec1[C_COPY]);
    assert_int_equal(pre[C_COPY], dec1[C_COPY]);
    assert_int_equal(dec8[C_DEC_GA], dec1[C_DEC_GA]);
    /* one attention call per layer, whatever the batch */
    assert_int_equal(dec8[C_ATTN] + dec8[C_ATTN_SEQS], dec1[C_ATTN]);
    assert_int_equal(dec8[C_ATTN], 0);
    di_model_close(m);
    di_backend_destroy(cpu);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encode_decode),
        cmocka_unit_test(test_pool_ring),
        cmocka_unit_test(test_attn_seqs),
        cmocka_unit_test(test_cache_addrs),
        cmocka_unit_test(test_launch_counts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
