/* Per-sequence cache store (src/model/cache.h): dequantization of the three compact forms bit-exact
 * to the reference's QDQ (its own vectors in tests/data/kernels.safetensors, and io/formats.h's QDQ
 * on stress rows), exact rollback of k = 1 … 8 tokens at many positions (ring wrap, ratio-2
 * group boundaries) against a cache that never saw them, window gathers in the reference's order
 * against a direct bf16-ring implementation and as inputs of the CPU backend's sparse attention and
 * compressor pooling, the same cache with its arena in backend memory (the CPU backend's codec ops)
 * against the host arena, and the sizes of spec §7.2.  di-test: asan */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_attn.h"
#include "io/formats.h"
#include "io/safetensors.h"
#include "model/cache.h"
#include "model/config.h"
#include "testutil.h"

/* ---------------- helpers ---------------- */

static di_config *load_cfg(const char *rel) {
    di_config *c = malloc(sizeof *c);
    di_error err = {0};
    if (di_config_load(tu_data(rel), c, &err) != DI_OK) fail_msg("%s: %s", rel, err.msg);
    return c;
}

static di_cache *make_cache(const di_config *cfg, int64_t max_tokens, int margin) {
    di_cache_opts o = {.max_tokens = max_tokens, .spec_margin = margin};
    di_cache *c = NULL;
    di_error err = {0};
    if (di_cache_create(cfg, &o, &c, &err) != DI_OK) fail_msg("cache create: %s", err.msg);
    return c;
}

#define OK(call)                                                                                                     \
    do {                                                                                                             \
        di_error e_ = {0};                                                                                           \
        if ((call) != DI_OK) fail_msg("%s: %s", #call, e_.msg);                                                      \
    } while (0)
#define E (&e_)

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A bf16 value of random sign and magnitude 2^[-lo, hi) with random mantissa. */
static uint16_t rand_bf16(uint64_t *s, int lo, int hi) {
    uint64_t r = mix64((*s)++);
    float m = 1.0f + (float)(r & 0xffff) / 65536.0f;
    int ex = (int)((r >> 16) % (uint64_t)(lo + hi)) - lo;
    float v = ldexpf(m, ex);
    return di_f32_to_bf16((r >> 40) & 1 ? -v : v);
}

/* Rows that stress the quantizers: typical activations, exact zeros, tiny and subnormal values,
 * single outliers up to the bf16 maximum, whole-row scale changes. kind = row index mod 8. */
static void stress_row(uint64_t seed, int kind, uint16_t *row, int n) {
    uint64_t s = mix64(seed);
    for (int i = 0; i < n; i++) row[i] = rand_bf16(&s, 4, 4);
    switch (kind % 8) {
    case 0: break;                                                        /* |x| in [2^-4, 2^4) */
    case 1: memset(row, 0, (size_t)n * 2); break;                         /* all zeros */
    case 2: for (int i = 0; i < n; i++) row[i] = rand_bf16(&s, 140, -127); break; /* 2^-140 … 2^-127 */
    case 3: for (int i = 0; i < n; i++) row[i] = (i % 5) ? 0 : rand_bf16(&s, 20, -10); break;
    case 4: row[mix64(s) % (uint64_t)n] = 0x7f7f; break;                  /* bf16 max finite outlier */
    case 5: for (int i = 0; i < n; i += 37) row[i] = rand_bf16(&s, -60, 100); break; /* 2^60 … 2^100 */
    case 6: for (int i = 0; i < n; i++) row[i] = rand_bf16(&s, 16, -10); break;      /* near 1e-4 floor */
    case 7: for (int i = 0; i < n; i++) row[i] = (uint16_t)(row[i] ^ ((i & 1) ? 0x8000 : 0)); break;
    }
}

static int64_t count_diff(const uint16_t *a, const uint16_t *b, int64_t n) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += a[i] != b[i];
    return d;
}

/* ---------------- dequantization is the reference's QDQ ---------------- */

static void test_dequant_exact(void **state) {
    (void)state;
    di_config *cfg = load_cfg("v41-flash-config");
    const int hd = cfg->head_dim, ihd = cfg->index_head_dim; /* 512, 128 */
    assert_int_equal(hd, 512);
    assert_int_equal(ihd, 128);
    const int rows = 1024, src = 20; /* ratio-1 kv source: one entry per token */
    assert_true(cfg->layer[src].is_kv_source && cfg->layer[src].compress_ratio == 1);
    di_cache *c = make_cache(cfg, rows, 8);
    uint16_t raw[512], ref[512], got[512];
    uint8_t q[512], sc[16];
    int64_t diff_w = 0, diff_c = 0, diff_k = 0, nonzero = 0, sub = 0;
    for (int r = 0; r < rows; r++) {
        OK(di_cache_extend(c, 1, E));
        stress_row(1000 + r, r, raw, hd);
        /* window: e4m3 codes + E8M0 per 32 */
        OK(di_cache_window_put(c, src, r, raw, E));
        OK(di_cache_window_rows(c, src, r, r + 1, got, E));
        di_act_qdq_fp8(raw, hd, 32, ref);
        diff_w += count_diff(ref, got, hd);
        /* the stored bytes are exactly di_act_quant_fp8's codes and scales */
        di_act_quant_fp8(raw, hd, 32, q, sc);
        const uint8_t *slot = c->stage[src].window + (r % c->ring_slots) * c->window_slot_bytes;
        assert_memory_equal(slot, q, 512);
        assert_memory_equal(slot + 512, sc, 16);
        for (int i = 0; i < hd; i++) nonzero += (ref[i] & 0x7fff) != 0;
        /* compressed KV: E2M1 + E4M3 per 16 */
        OK(di_cache_cmp_put(c, src, r, raw, E));
        OK(di_cache_cmp_rows(c, src, r, r + 1, got, E));
        di_fp4_qdq_e4m3(raw, hd, 16, ref);
        diff_c += count_diff(ref, got, hd);
        /* index key: E2M1 + E8M0 per 32, on a 128-wide slice */
        OK(di_cache_ikey_put(c, src, r, raw + (r % 4) * ihd, E));
        OK(di_cache_ikey_rows(c, src, r, r + 1, got, E));
        di_fp4_qdq_e8m0(raw + (r % 4) * ihd, ihd, 32, ref);
        diff_k += count_diff(ref, got, ihd);
        for (int i = 0; i < ihd; i++) sub += (ref[i] & 0x7f80) == 0 && (ref[i] & 0x7f) != 0;
    }
    tu_report("dequant rows: %d × (512 window, 512 compressed, 128 index key)", rows);
    tu_report("window mismatches vs di_act_qdq_fp8: %lld", (long long)diff_w);
    tu_report("compressed mismatches vs di_fp4_qdq_e4m3: %lld", (long long)diff_c);
    tu_report("index-key mismatches vs di_fp4_qdq_e8m0: %lld", (long long)diff_k);
    tu_report("window values nonzero %lld; index-key values bf16 subnormal %lld", (long long)nonzero, (long long)sub);
    assert_int_equal(diff_w, 0);
    assert_int_equal(diff_c, 0);
    assert_int_equal(diff_k, 0);
    /* the stress rows really reach zeros, subnormal results and saturated groups */
    assert_true(nonzero > 0 && nonzero < (int64_t)rows * hd);
    assert_true(sub > 0);
    /* gathering selected entries (−1 → zero row) reads the same values */
    int32_t ent[3] = {7, -1, 1000};
    uint16_t *g = malloc(3 * 512 * 2), *one = malloc(512 * 2);
    OK(di_cache_cmp_gather(c, src, ent, 3, g, E));
    OK(di_cache_cmp_rows(c, src, 7, 8, one, E));
    assert_memory_equal(g, one, 1024);
    for (int i = 0; i < 512; i++) assert_int_equal(g[512 + i], 0);
    OK(di_cache_cmp_rows(c, src, 1000, 1001, one, E));
    assert_memory_equal(g + 1024, one, 1024);
    free(g);
    free(one);
    di_cache_destroy(c);
    free(cfg);
}

/* The reference's own QDQ outputs (tests/data/kernels.safetensors, real shapes) come back from the
 * cache bit for bit: act_quant rows [8, 5120] as 80 window rows of 512 (the 32-groups align),
 * fp4_act_quant_e4m3 [8, 512] as compressed entries, fp4_act_quant_e8m0 [8, 32, 128] as 256 index
 * keys. The window's stored codes and scales are the reference's q and s. */
static const void *ref_tensor(di_safetensors *st, const char *name, int64_t numel) {
    const di_tensor_info *t = di_st_find(st, name);
    if (!t) fail_msg("kernels.safetensors: no tensor %s", name);
    assert_int_equal(di_tensor_numel(t), numel);
    return t->data;
}

static void test_reference_vectors(void **state) {
    (void)state;
    di_safetensors *st = NULL;
    di_error err = {0};
    if (di_st_open(tu_data("kernels.safetensors"), &st, &err) != DI_OK) fail_msg("%s", err.msg);
    const uint16_t *ax = ref_tensor(st, "act_quant.x", 8 * 5120), *aqdq = ref_tensor(st, "act_quant.qdq", 8 * 5120);
    const uint8_t *aq = ref_tensor(st, "act_quant.q", 8 * 5120), *as = ref_tensor(st, "act_quant.s", 8 * 160);
    const uint16_t *cx = ref_tensor(st, "fp4_act_quant_e4m3.x", 8 * 512);
    const uint16_t *cqdq = ref_tensor(st, "fp4_act_quant_e4m3.qdq", 8 * 512);
    const uint16_t *kx = ref_tensor(st, "fp4_act_quant_e8m0.x", 8 * 32 * 128);
    const uint16_t *kqdq = ref_tensor(st, "fp4_act_quant_e8m0.qdq", 8 * 32 * 128);

    di_config *cfg = load_cfg("v41-flash-config");
    const int src = 20; /* ratio 1: one entry per token */
    di_cache *c = make_cache(cfg, 256, 8);
    OK(di_cache_extend(c, 256, E));
    uint16_t got[512];
    int64_t same_w = 0, same_q = 0, same_c = 0, same_k = 0;
    for (int r = 0; r < 80; r++) { /* positions 176 … 255: inside the ring */
        int64_t pos = 176 + r;
        OK(di_cache_window_put(c, src, pos, ax + r * 512, E));
        OK(di_cache_window_rows(c, src, pos, pos + 1, got, E));
        same_w += 512 - count_diff(got, aqdq + r * 512, 512);
        const uint8_t *slot = c->stage[src].window + (pos % c->ring_slots) * c->window_slot_bytes;
        for (int i = 0; i < 512; i++) same_q += slot[i] == aq[r * 512 + i];
        for (int g = 0; g < 16; g++) same_q += slot[512 + g] == as[r * 16 + g];
    }
    for (int r = 0; r < 8; r++) {
        OK(di_cache_cmp_put(c, src, r, cx + r * 512, E));
        OK(di_cache_cmp_rows(c, src, r, r + 1, got, E));
        same_c += 512 - count_diff(got, cqdq + r * 512, 512);
    }
    for (int r = 0; r < 256; r++) {
        OK(di_cache_ikey_put(c, src, r, kx + r * 128, E));
        OK(di_cache_ikey_rows(c, src, r, r + 1, got, E));
        same_k += 128 - count_diff(got, kqdq + r * 128, 128);
    }
    tu_report("reference act_quant qdq via window ring: %lld/%d, codes+scales %lld/%d", (long long)same_w, 80 * 512,
              (long long)same_q, 80 * 528);
    tu_report("reference fp4_act_quant_e4m3 qdq via compressed KV: %lld/%d", (long long)same_c, 8 * 512);
    tu_report("reference fp4_act_quant_e8m0 qdq via index keys: %lld/%d", (long long)same_k, 256 * 128);
    assert_int_equal(same_w, 80 * 512);
    assert_int_equal(same_q, 80 * 528);
    assert_int_equal(same_c, 8 * 512);
    assert_int_equal(same_k, 256 * 128);
    di_cache_destroy(c);
    free(cfg);
    di_st_close(st);
}

/* Requantizing an already-QDQ'd row is not exact for FP4/E4M3 (the scale can move), which is why
 * puts take the pre-QDQ row: a subnormal-scale group whose amax/6 rounds up to 2·2^-9. */
static void test_requant_not_idempotent(void **state) {
    (void)state;
    uint16_t x[16] = {0}, once[16], twice[16];
    x[0] = di_f32_to_bf16(6.0f * 1.6f * ldexpf(1.0f, -9)); /* amax/6 = 1.6·2^-9 → s = 2^-8 */
    di_fp4_qdq_e4m3(x, 16, 16, once);
    di_fp4_qdq_e4m3(once, 16, 16, twice);
    tu_report("fp4/e4m3 requant: x %g -> qdq %g -> qdq(qdq) %g", di_bf16_to_f32(x[0]), di_bf16_to_f32(once[0]),
              di_bf16_to_f32(twice[0]));
    assert_true(once[0] != twice[0]);
}

/* ---------------- a simulated forward writing every cache ---------------- */

/* Deterministic content of token `pos` of sequence `tag`: every cache row the forward would write
 * is a function of (tag, pos, stage), so two sequences differ in every byte they write. */
static uint64_t seed_of(uint64_t tag, int64_t pos, int stage, int what) {
    return mix64(mix64(tag * 1000003u + (uint64_t)pos) ^ ((uint64_t)stage << 8) ^ (uint64_t)what);
}

static void pool_block(const float *kv, const float *score, int ratio, int hd, uint16_t *out) {
    for (int j = 0; j < hd; j++) {
        float mx = -INFINITY, sum = 0, acc = 0;
        for (int s = 0; s < ratio; s++) mx = fmaxf(mx, score[s * hd + j]);
        for (int s = 0; s < ratio; s++) sum += expf(score[s * hd + j] - mx);
        for (int s = 0; s < ratio; s++) acc += kv[s * hd + j] * (expf(score[s * hd + j] - mx) / sum);
        out[j] = di_f32_to_bf16(acc);
    }
}

/* Writes everything position pos contributes, as the forward does after di_cache_extend: window
 * rows of every stage, compressor inputs (and the entry when the group completes, pooled from the
 * cache's own state so that it depends on the pending rows), ratio-1 entries, the Engram id. */
static void write_token(di_cache *c, uint64_t tag, int64_t pos) {
    int hd = c->head_dim, ihd = c->index_head_dim;
    uint16_t row[512], pooled[512];
    for (int st = 0; st < c->n_stages; st++) {
        uint64_t s = seed_of(tag, pos, st, 1);
        for (int i = 0; i < hd; i++) row[i] = rand_bf16(&s, 6, 3);
        /* a chunk longer than the ring keeps only its tail */
        if (pos >= di_cache_len(c) - c->ring_slots) OK(di_cache_window_put(c, st, pos, row, E));
        int r = c->stage[st].ratio;
        if (r == 1) {
            OK(di_cache_cmp_put(c, st, pos, row, E));
            OK(di_cache_ikey_put(c, st, pos, row + hd - ihd, E));
        } else if (r >= 2) {
            float *kv, *score;
            OK(di_cache_cmp_state(c, st, pos, &kv, &score, E));
            for (int i = 0; i < hd; i++) {
                kv[(pos % r) * hd + i] = (float)((int)(mix64(s + 7 * i) % 2001) - 1000) / 256.0f;
                score[(pos % r) * hd + i] = (float)((int)(mix64(s + 7 * i + 3) % 2001) - 1000) / 128.0f;
            }
            if ((pos + 1) % r == 0) {
                pool_block(kv, score, r, hd, pooled);
                OK(di_cache_cmp_put(c, st, pos / r, pooled, E));
                OK(di_cache_ikey_put(c, st, pos / r, pooled, E));
            }
        }
    }
    if (c->engram_slots && pos >= di_cache_len(c) - c->engram_slots)
        OK(di_cache_engram_put(c, pos, (int32_t)(seed_of(tag, pos, 0, 2) % 99092), E));
}

/* Append `k` tokens of sequence tag at the end: one extend + writes (a chunk / verify step), or k
 * single-token steps (decode). */
static void append(di_cache *c, uint64_t tag, int64_t k, int chunked) {
    int64_t p0 = di_cache_len(c);
    if (chunked) {
        OK(di_cache_extend(c, k, E));
        for (int64_t p = p0; p < p0 + k; p++) write_token(c, tag, p);
    } else {
        for (int64_t p = p0; p < p0 + k; p++) {
            OK(di_cache_extend(c, 1, E));
            write_token(c, tag, p);
        }
    }
}

static uint8_t *image_of(const di_cache *c, int64_t *n) {
    *n = di_cache_image_bytes(c);
    uint8_t *b = malloc((size_t)*n);
    OK(di_cache_image(c, b, *n, n, E));
    return b;
}

/* Equal canonical images, equal whole compressed arrays (physical bytes incl. the zeroed tail),
 * equal window gathers and Engram history at the newest position. */
static void assert_same_state(const di_cache *a, const di_cache *b, const char *what, int64_t P, int64_t k) {
    int64_t na, nb;
    uint8_t *ia = image_of(a, &na), *ib = image_of(b, &nb);
    if (na != nb || memcmp(ia, ib, (size_t)na))
        fail_msg("%s: images differ at P=%lld k=%lld (%lld vs %lld bytes)", what, (long long)P, (long long)k,
                 (long long)na, (long long)nb);
    free(ia);
    free(ib);
    for (int st = 0; st < a->n_stages; st++) {
        const di_cache_stage *sa = &a->stage[st], *sb = &b->stage[st];
        if (!sa->ratio) continue;
        if (memcmp(sa->cmp, sb->cmp, (size_t)(sa->max_entries * a->cmp_entry_bytes)) ||
            memcmp(sa->ikey, sb->ikey, (size_t)(sa->max_entries * a->index_key_bytes)))
            fail_msg("%s: compressed arrays of stage %d differ at P=%lld k=%lld", what, st, (long long)P, (long long)k);
    }
    int64_t n = di_cache_len(a);
    if (n == 0) return;
    int W = a->window, hd = a->head_dim;
    uint16_t *ra = malloc((size_t)W * hd * 2), *rb = malloc((size_t)W * hd * 2);
    int32_t *xa = malloc((size_t)W * 4), *xb = malloc((size_t)W * 4);
    /* the image covers every ring; gathers re-read three: the first, a middle and the last stage */
    const int stages[3] = {0, a->n_stages / 2, a->n_stages - 1};
    for (int i = 0; i < 3; i++) {
        int st = stages[i];
        OK(di_cache_window_gather(a, st, n - 1, ra, xa, E));
        OK(di_cache_window_gather(b, st, n - 1, rb, xb, E));
        assert_memory_equal(xa, xb, (size_t)W * 4);
        assert_memory_equal(ra, rb, (size_t)W * hd * 2);
    }
    free(ra);
    free(rb);
    free(xa);
    free(xb);
    if (a->engram_slots) {
        int32_t ha[DI_MAX_NGRAM], hb[DI_MAX_NGRAM];
        OK(di_cache_engram_history(a, n, ha, E));
        OK(di_cache_engram_history(b, n, hb, E));
        assert_memory_equal(ha, hb, (size_t)a->engram_hist * 4);
    }
}

/* For every start P in `starts` (ascending): k = 1 … 8 speculative tokens appended and rolled back
 * leave the cache equal to `ref`, which only ever saw sequence A; then both continue with the same
 * 8 tokens (pooling from the restored pending rows, wrapping the ring) and stay equal, and rolling
 * those back returns both to the image saved at P. */
static void rollback_sweep(const char *cfg_rel, const int64_t *starts, int n_starts, int64_t *checks) {
    di_config *cfg = load_cfg(cfg_rel);
    int64_t max_tokens = starts[n_starts - 1] + 32;
    di_cache *ref = make_cache(cfg, max_tokens, DI_CACHE_SPEC_MARGIN_DEFAULT);
    di_cache *test = make_cache(cfg, max_tokens, DI_CACHE_SPEC_MARGIN_DEFAULT);
    const uint64_t A = 1, C = 3;
    for (int i = 0; i < n_starts; i++) {
        int64_t P = starts[i];
        /* both advance along A to P (ref and test have different pasts from the second start on) */
        while (di_cache_len(ref) < P) append(ref, A, 1, 0);
        while (di_cache_len(test) < P) append(test, A, 1, (int)(P & 1));
        for (int64_t k = 1; k <= DI_CACHE_SPEC_MARGIN_DEFAULT; k++) {
            append(test, 100 + (uint64_t)k, k, (int)(k & 1)); /* a rejected draft of k tokens */
            assert_int_equal(di_cache_len(test), P + k);
            OK(di_cache_rollback(test, k, E));
            assert_int_equal(di_cache_len(test), P);
            assert_same_state(test, ref, cfg_rel, P, k);
            (*checks)++;
        }
        int64_t n_img;
        uint8_t *img_p = image_of(ref, &n_img);
        for (int64_t j = 0; j < DI_CACHE_SPEC_MARGIN_DEFAULT; j++) {
            append(ref, C, 1, 0);
            append(test, C, 1, 0);
            assert_same_state(test, ref, cfg_rel, P, -(j + 1));
        }
        OK(di_cache_rollback(ref, DI_CACHE_SPEC_MARGIN_DEFAULT, E));
        OK(di_cache_rollback(test, DI_CACHE_SPEC_MARGIN_DEFAULT, E));
        int64_t n2;
        uint8_t *img2 = image_of(test, &n2);
        assert_int_equal(n2, n_img);
        assert_memory_equal(img2, img_p, (size_t)n_img);
        free(img2);
        img2 = image_of(ref, &n2);
        assert_memory_equal(img2, img_p, (size_t)n_img);
        free(img2);
        free(img_p);
    }
    di_cache_destroy(ref);
    di_cache_destroy(test);
    free(cfg);
}

/* A cache whose arena is backend memory (opts.be: the CPU backend's row_encode / row_decode ops and
 * memory slots, the path every backend takes) against the host arena through appends, a long chunk
 * past the ring and rollbacks: identical images, compressed arrays, gathers and history. */
static void test_backend_arena(void **state) {
    (void)state;
    di_config *cfg = load_cfg("v41-tiny-sel");
    di_backend *be = NULL;
    di_error err = {0};
    assert_int_equal(di_backend_cpu_create(1, &be, &err), DI_OK);
    di_cache_opts o = {.max_tokens = 400, .spec_margin = 8, .be = be};
    di_cache *a = make_cache(cfg, 400, 8), *b = NULL;
    assert_int_equal(di_cache_create(cfg, &o, &b, &err), DI_OK);
    assert_ptr_equal(b->be, be);
    const int64_t steps[] = {37, 1, 1, 130, 5, 1, 2, 64, 6};
    int64_t checks = 0;
    for (int i = 0; i < (int)(sizeof steps / sizeof *steps); i++) {
        append(a, 11, steps[i], i % 3 != 1);
        append(b, 11, steps[i], i % 3 != 1);
        assert_same_state(a, b, "backend arena", di_cache_len(a), 0);
        checks++;
        if (i % 2) {
            OK(di_cache_rollback(a, 3, E));
            OK(di_cache_rollback(b, 3, E));
            assert_same_state(a, b, "backend arena after rollback", di_cache_len(a), 3);
            checks++;
        }
    }
    /* a backend arena in caller memory is refused (only di_cache_create allocates backend memory) */
    di_cache c;
    void *arena = aligned_alloc(64, 64);
    assert_int_equal(di_cache_init(&c, cfg, &o, arena, 64, &err), DI_ERR_INVALID);
    free(arena);
    tu_report("backend arena (cpu backend ops): %lld states over %lld tokens identical to the host arena",
              (long long)checks, (long long)di_cache_len(a));
    di_cache_destroy(a);
    di_cache_destroy(b);
    di_backend_destroy(be);
    di_config_free(cfg);
    free(cfg);
}

static void test_rollback_tiny(void **state) {
    (void)state;
    /* tiny: W = 16, ring 24, ratio-2 source (stage 1), ratio-1 source (3), DSpark stage, Engram */
    int64_t starts[80];
    for (int i = 0; i < 80; i++) starts[i] = i;
    int64_t checks = 0;
    rollback_sweep("v41-tiny-sel", starts, 80, &checks);
    rollback_sweep("v41-tiny-nosel", starts, 40, &checks);
    tu_report("tiny rollback checks (P, k) bit-identical: %lld", (long long)checks);
    assert_int_equal(checks, 8 * (80 + 40));
}

static void test_rollback_released(void **state) {
    (void)state;
    /* released shapes: W = 128, ring 136; around the first wrap and odd/even group boundaries */
    const int64_t starts[] = {0, 1, 2, 3, 126, 127, 128, 129, 130, 135, 136, 137, 138, 143, 144, 145};
    int64_t checks = 0;
    rollback_sweep("v41-flash-config", starts, (int)(sizeof starts / sizeof *starts), &checks);
    tu_report("released rollback checks (P, k) bit-identical: %lld", (long long)checks);
    assert_int_equal(checks, 8 * 16);
}

/* A prefill chunk much longer than the margin, then the rollback of its last j ≤ m tokens (a
 * verify step appended as one chunk, or a prompt whose tail is retracted): equal to a cache that
 * only ever saw the kept prefix, fed token by token. */
static void test_rollback_after_long_chunk(void **state) {
    (void)state;
    const char *cfgs[2] = {"v41-tiny-sel", "v41-flash-config"};
    const int64_t cases[][3] = {{0, 50, 8}, {3, 41, 1}, {17, 160, 5}, {130, 150, 7}, {1, 2, 2}}; /* s, k, j */
    int64_t checks = 0;
    for (int ci = 0; ci < 2; ci++) {
        di_config *cfg = load_cfg(cfgs[ci]);
        for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
            int64_t s0 = cases[t][0], k = cases[t][1], j = cases[t][2];
            di_cache *ref = make_cache(cfg, 512, 8), *test = make_cache(cfg, 512, 8);
            append(ref, 1, s0 + k - j, 0);
            append(test, 1, s0, 1);
            append(test, 1, k, 1);
            OK(di_cache_rollback(test, j, E));
            assert_same_state(test, ref, cfgs[ci], s0 + k - j, j);
            /* and both continue identically */
            append(ref, 4, 9, 1);
            append(test, 4, 9, 0);
            assert_same_state(test, ref, cfgs[ci], s0 + k - j + 9, 0);
            checks++;
            di_cache_destroy(ref);
            di_cache_destroy(test);
        }
        free(cfg);
    }
    tu_report("long-chunk rollbacks bit-identical: %lld", (long long)checks);
    assert_int_equal(checks, 10);
}

/* Rollback beyond the margin is refused, and so is rolling back further than the reserve left by
 * an earlier rollback; margin 0 allows none. */
static void test_rollback_limits(void **state) {
    (void)state;
    di_config *cfg = load_cfg("v41-tiny-sel");
    di_cache *c = make_cache(cfg, 200, 8);
    di_error err = {0};
    append(c, 1, 40, 1);
    assert_int_equal(di_cache_rollback_limit(c), 8);
    assert_int_equal(di_cache_rollback(c, 9, &err), DI_ERR_LIMIT);
    assert_non_null(strstr(err.msg, "roll back 9"));
    append(c, 2, 5, 1);
    OK(di_cache_rollback(c, 5, E));
    /* the 5 dropped tokens used 5 slots of the reserve */
    assert_int_equal(di_cache_rollback_limit(c), 3);
    assert_int_equal(di_cache_rollback(c, 4, &err), DI_ERR_LIMIT);
    OK(di_cache_rollback(c, 3, E));
    assert_int_equal(di_cache_len(c), 37);
    assert_int_equal(di_cache_rollback(c, -1, &err), DI_ERR_INVALID);
    assert_int_equal(di_cache_extend(c, 200, &err), DI_ERR_LIMIT);
    di_cache_destroy(c);
    c = make_cache(cfg, 50, 0);
    append(c, 1, 10, 0);
    assert_int_equal(di_cache_rollback_limit(c), 0);
    assert_int_equal(di_cache_rollback(c, 1, &err), DI_ERR_LIMIT);
    di_cache_destroy(c);
    free(cfg);
}

/* ---------------- window order vs a direct bf16 ring ---------------- */

/* The reference keeps W bf16 slots, token p in slot p mod W, values FP8-QDQ'd; decode lists slots
 * (pos mod W)+1 … W−1, 0 … pos mod W with slots > pos (ring not yet full) as −1 (spec §5.3); a
 * DSpark stage lists slots 0 … min(W, pos+1)−1 (§4.9). */
static void gather_vs_ring(const char *cfg_rel, int64_t n_tok) {
    di_config *cfg = load_cfg(cfg_rel);
    di_cache *c = make_cache(cfg, n_tok, 8);
    const int W = c->window, hd = c->head_dim, st = 0, ds = c->n_stages - 1;
    uint16_t *ring = calloc((size_t)W * hd, 2), *rows = malloc((size_t)W * hd * 2), *row = malloc((size_t)hd * 2);
    int32_t *idx = malloc((size_t)W * 4);
    int64_t compared = 0;
    for (int64_t pos = 0; pos < n_tok; pos++) {
        OK(di_cache_extend(c, 1, E));
        uint64_t s = seed_of(9, pos, st, 1);
        for (int i = 0; i < hd; i++) row[i] = rand_bf16(&s, 12, 6);
        OK(di_cache_window_put(c, st, pos, row, E));
        OK(di_cache_window_put(c, ds, pos, row, E));
        di_act_qdq_fp8(row, hd, 32, ring + (pos % W) * hd);
        /* decode order */
        OK(di_cache_window_gather(c, st, pos, rows, idx, E));
        for (int j = 0; j < W; j++) {
            int slot = (int)((pos % W + 1 + j) % W);
            int valid = pos >= W - 1 || slot <= pos;
            if (!valid) {
                assert_int_equal(idx[j], -1);
                continue;
            }
            assert_int_equal(idx[j], j);
            assert_memory_equal(rows + (int64_t)j * hd, ring + (int64_t)slot * hd, (size_t)hd * 2);
            compared++;
        }
        /* DSpark slot order */
        int64_t nr;
        OK(di_cache_dspark_gather(c, ds, pos, rows, &nr, E));
        assert_int_equal(nr, pos + 1 < W ? pos + 1 : W);
        assert_memory_equal(rows, ring, (size_t)(nr * hd * 2));
        /* ascending rows of the last min(W, pos+1) positions */
        int64_t p0 = pos + 1 > W ? pos + 1 - W : 0;
        OK(di_cache_window_rows(c, st, p0, pos + 1, rows, E));
        for (int64_t q = p0; q <= pos; q++)
            assert_memory_equal(rows + (q - p0) * hd, ring + (q % W) * hd, (size_t)hd * 2);
    }
    tu_report("%s: window gather rows compared with the bf16 ring: %lld", cfg_rel, (long long)compared);
    assert_true(compared > 0);
    free(ring);
    free(rows);
    free(row);
    free(idx);
    di_cache_destroy(c);
    free(cfg);
}

static void test_window_order(void **state) {
    (void)state;
    gather_vs_ring("v41-tiny-sel", 70);      /* W = 16: four wraps */
    gather_vs_ring("v41-flash-config", 300); /* W = 128, ring 136: two wraps */
}

/* The gathers are drop-ins for the reference buffers the CPU backend's kernels take: sparse
 * attention over [gathered rows, gather idx] equals it over [the bf16 ring, di_cpu_window_idx_decode]
 * bit for bit, and the DSpark gather is the ring in di_cpu_dspark_idx's order. */
static void test_gather_feeds_attention(void **state) {
    (void)state;
    di_config *cfg = load_cfg("v41-flash-config");
    const int W = 128, hd = 512, nh = 4, st = 5, ds = cfg->n_stages - 1, block = 5;
    const int64_t T = 300;
    di_cache *c = make_cache(cfg, T, 8);
    uint16_t *ring = calloc((size_t)W * hd, 2), *rows = malloc((size_t)W * hd * 2), *row = malloc((size_t)hd * 2);
    uint16_t q[4 * 512], o_ref[4 * 512], o_got[4 * 512];
    int32_t idx_ref[128], idx_got[128], didx[5 * (128 + 5)];
    float sink[4] = {0.5f, -1.0f, 2.0f, 0.0f};
    const float scale = 1.0f / sqrtf((float)hd);
    int64_t compared = 0;
    for (int64_t pos = 0; pos < T; pos++) {
        OK(di_cache_extend(c, 1, E));
        uint64_t s = seed_of(21, pos, st, 1);
        for (int i = 0; i < hd; i++) row[i] = rand_bf16(&s, 3, 2);
        OK(di_cache_window_put(c, st, pos, row, E));
        OK(di_cache_window_put(c, ds, pos, row, E));
        di_act_qdq_fp8(row, hd, 32, ring + (pos % W) * hd);
        if (pos % 7 != 0 && pos != W - 2 && pos != W - 1) continue;
        for (int i = 0; i < nh * hd; i++) q[i] = rand_bf16(&s, 3, 1);
        OK(di_cpu_window_idx_decode(pos, W, idx_ref, E));
        OK(di_cache_window_gather(c, st, pos, rows, idx_got, E));
        for (int j = 0; j < W; j++) assert_int_equal(idx_ref[j] < 0, idx_got[j] < 0);
        OK(di_cpu_sparse_attn(q, 1, nh, hd, ring, W, NULL, 0, sink, idx_ref, W, scale, o_ref, E));
        OK(di_cpu_sparse_attn(q, 1, nh, hd, rows, W, NULL, 0, sink, idx_got, W, scale, o_got, E));
        assert_memory_equal(o_ref, o_got, sizeof o_ref);
        /* DSpark: the first min(W, pos+1) indices of every draft row are ring slots 0, 1, … */
        int64_t n_rows, nv = pos + 1 < W ? pos + 1 : W;
        OK(di_cpu_dspark_idx(pos, W, block, didx, E));
        OK(di_cache_dspark_gather(c, ds, pos, rows, &n_rows, E));
        assert_int_equal(n_rows, nv);
        for (int64_t j = 0; j < nv; j++)
            assert_memory_equal(rows + j * hd, ring + (int64_t)didx[j] * hd, (size_t)hd * 2);
        compared++;
    }
    tu_report("attention outputs via the gather == via the bf16 ring: %lld positions", (long long)compared);
    assert_true(compared > 40);
    free(ring);
    free(rows);
    free(row);
    di_cache_destroy(c);
    free(cfg);
}

/* The compressor blocks are the state di_cpu_compress_pool takes: fed one token at a time through
 * the cache, with a junk draft of 1 … 8 tokens pooled into the blocks and rolled back before every
 * token, it emits exactly the entries of one-shot pooling over the whole sequence. */
static void test_state_feeds_pooling(void **state) {
    (void)state;
    di_config *cfg = load_cfg("v41-flash-config");
    const int st = 2, hd = 512, T = 301; /* ratio-2 kv source */
    assert_int_equal(cfg->layer[st].compress_ratio, 2);
    di_cache *c = make_cache(cfg, 512, 8);
    float *a = malloc(sizeof(float) * T * hd), *g = malloc(sizeof(float) * T * hd);
    float ja[512], jg[512], kv0[2 * 512], sc0[2 * 512];
    for (int i = 0; i < T * hd; i++) {
        a[i] = sinf((float)i * 0.37f) * 3.0f;
        g[i] = cosf((float)i * 0.11f) * 5.0f;
    }
    for (int i = 0; i < hd; i++) ja[i] = 99.0f, jg[i] = 50.0f;
    uint16_t *ref = malloc((size_t)(T / 2) * hd * 2), *got = malloc((size_t)(T / 2) * hd * 2), junk[512];
    int64_t n_ref, emitted = 0, n1;
    OK(di_cpu_compress_state_reset(kv0, sc0, 2, hd, E));
    OK(di_cpu_compress_pool(a, g, T, 0, 2, hd, kv0, sc0, ref, &n_ref, E));
    for (int64_t p = 0; p < T; p++) {
        int64_t k = 1 + p % 8;
        float *kv, *sc;
        OK(di_cache_extend(c, k, E));
        for (int64_t d = p; d < p + k; d++) {
            OK(di_cache_cmp_state(c, st, d, &kv, &sc, E));
            OK(di_cpu_compress_pool(ja, jg, 1, d, 2, hd, kv, sc, junk, &n1, E));
        }
        OK(di_cache_rollback(c, k, E));
        OK(di_cache_extend(c, 1, E));
        OK(di_cache_cmp_state(c, st, p, &kv, &sc, E));
        OK(di_cpu_compress_pool(a + p * hd, g + p * hd, 1, p, 2, hd, kv, sc, got + emitted * hd, &n1, E));
        emitted += n1;
    }
    tu_report("pooled entries through the cache state with rolled-back drafts: %lld of %lld identical",
              (long long)(emitted == n_ref && !memcmp(ref, got, (size_t)n_ref * hd * 2) ? n_ref : 0), (long long)n_ref);
    assert_int_equal(emitted, T / 2);
    assert_int_equal(n_ref, T / 2);
    assert_memory_equal(ref, got, (size_t)n_ref * hd * 2);
    free(a);
    free(g);
    free(ref);
    free(got);
    di_cache_destroy(c);
    free(cfg);
}

/* A long chunk keeps only its tail; reading an overwritten position or an unappended one fails. */
static void test_window_reach(void **state) {
    (void)state;
    di_config *cfg = load_cfg("v41-tiny-sel");
    di_cache *c = make_cache(cfg, 400, 8);
    const int hd = c->head_dim;
    int64_t T = 100;
    uint16_t *rows = malloc((size_t)T * hd * 2), *back = malloc((size_t)T * hd * 2), *ref = malloc((size_t)hd * 2);
    uint64_t s = 5;
    for (int64_t i = 0; i < T * hd; i++) rows[i] = rand_bf16(&s, 8, 8);
    OK(di_cache_extend(c, T, E));
    OK(di_cache_window_put_rows(c, 2, 0, T, rows, E));
    /* the previous chunk's window is read before the next chunk writes (positions T−16 … T−1) */
    OK(di_cache_window_rows(c, 2, T - c->ring_slots, T, back, E));
    for (int64_t q = T - c->ring_slots; q < T; q++) {
        di_act_qdq_fp8(rows + q * hd, hd, 32, ref);
        assert_memory_equal(back + (q - (T - c->ring_slots)) * hd, ref, (size_t)hd * 2);
    }
    di_error err = {0};
    assert_int_equal(di_cache_window_rows(c, 2, T - c->ring_slots - 1, T, back, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "not held"));
    assert_int_equal(di_cache_window_rows(c, 3, T - 1, T, back, &err), DI_ERR_INVALID); /* stage 3 never written */
    assert_int_equal(di_cache_window_put(c, 2, T, rows, &err), DI_ERR_INVALID);        /* not appended */
    assert_int_equal(di_cache_window_put(c, 99, 0, rows, &err), DI_ERR_INVALID);
    assert_int_equal(di_cache_cmp_put(c, 0, 0, rows, &err), DI_ERR_INVALID);  /* stage 0 is no kv source */
    assert_int_equal(di_cache_cmp_put(c, 1, T / 2, rows, &err), DI_ERR_INVALID); /* entry not yet completed */
    float *kv, *sc;
    assert_int_equal(di_cache_cmp_state(c, 3, 0, &kv, &sc, &err), DI_ERR_INVALID); /* ratio 1: no state */
    OK(di_cache_cmp_state(c, 1, T - 1, &kv, &sc, E));
    assert_int_equal(di_cache_cmp_state(c, 1, 0, &kv, &sc, &err), DI_ERR_INVALID); /* block reused since */
    free(rows);
    free(back);
    free(ref);
    di_cache_destroy(c);
    free(cfg);
}

/* After a rollback, positions appended again are not readable until the forward rewrites them:
 * their slots still hold the dropped tokens' bytes. */
static void test_stale_reads_refused(void **state) {
    (void)state;
    di_config *cfg = load_cfg("v41-tiny-sel"); /* stage 1: R 2, stage 3: R 1 */
    di_cache *c = make_cache(cfg, 100, 8);
    uint16_t *rows = malloc((size_t)c->window * c->head_dim * 2);
    int32_t idx[64], h[3];
    di_error err = {0};
    append(c, 1, 10, 1);
    OK(di_cache_rollback(c, 3, E));
    OK(di_cache_extend(c, 3, E));
    assert_int_equal(di_cache_window_rows(c, 0, 7, 8, rows, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "written up to 7"));
    assert_int_equal(di_cache_window_gather(c, 0, 9, rows, idx, &err), DI_ERR_INVALID);
    assert_int_equal(di_cache_cmp_rows(c, 3, 7, 8, rows, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "only 7 written"));
    assert_int_equal(di_cache_cmp_rows(c, 1, 3, 4, rows, &err), DI_ERR_INVALID); /* group {6,7} dropped */
    assert_int_equal(di_cache_ikey_rows(c, 1, 3, 4, rows, &err), DI_ERR_INVALID);
    assert_int_equal(di_cache_engram_history(c, 10, h, &err), DI_ERR_INVALID);
    OK(di_cache_window_rows(c, 0, 0, 7, rows, E)); /* the kept positions stay readable */
    OK(di_cache_cmp_rows(c, 1, 0, 3, rows, E));
    OK(di_cache_engram_history(c, 7, h, E));
    for (int64_t p = 7; p < 10; p++) write_token(c, 2, p);
    OK(di_cache_window_gather(c, 0, 9, rows, idx, E));
    OK(di_cache_cmp_rows(c, 3, 0, 10, rows, E));
    OK(di_cache_cmp_rows(c, 1, 0, 5, rows, E));
    OK(di_cache_engram_history(c, 10, h, E));
    free(rows);
    di_cache_destroy(c);
    free(cfg);
}

/* Throughput of the row paths at real size (reported, not asserted: the machine is shared). */
static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void test_throughput(void **state) {
    (void)state;
    di_config *cfg = load_cfg("v41-flash-config");
    const int N = 2048, hd = 512, src = 20;
    di_cache *c = make_cache(cfg, N, 8);
    uint16_t *rows = malloc((size_t)N * hd * 2), *out = malloc((size_t)128 * hd * 2);
    int32_t idx[128];
    uint64_t s = 77;
    for (int64_t i = 0; i < (int64_t)N * hd; i++) rows[i] = rand_bf16(&s, 6, 3);
    OK(di_cache_extend(c, N, E));
    double t0 = now_s();
    OK(di_cache_window_put_rows(c, src, 0, N, rows, E));
    double t1 = now_s();
    for (int r = 0; r < 8; r++) /* the queries whose window the ring still holds */
        for (int p = N - 8; p < N; p++) OK(di_cache_window_gather(c, src, p, out, idx, E));
    double t2 = now_s();
    for (int p = 0; p < N; p++) OK(di_cache_cmp_put(c, src, p, rows + (int64_t)p * hd, E));
    double t3 = now_s();
    for (int p = 0; p < N; p += 128) OK(di_cache_cmp_rows(c, src, p, p + 128, out, E));
    double t4 = now_s();
    int64_t kept = c->ring_slots; /* put_rows keeps the chunk's tail only */
    tu_report("window put (FP8 quantize 512): %.0f ns/row", 1e9 * (t1 - t0) / (double)kept);
    tu_report("window gather (128 rows dequantized): %.0f ns/row", 1e9 * (t2 - t1) / (64.0 * 128));
    tu_report("compressed put (FP4/E4M3 quantize 512): %.0f ns/row", 1e9 * (t3 - t2) / N);
    tu_report("compressed read (dequantize 512): %.0f ns/row", 1e9 * (t4 - t3) / N);
    assert_int_equal(idx[127], 127);
    free(rows);
    free(out);
    di_cache_destroy(c);
    free(cfg);
}

/* ---------------- sizes (spec §4.7, §7.2) ---------------- */

static void test_sizes_released(void **state) {
    (void)state;
    di_config *cfg = load_cfg("v41-flash-config");
    di_cache_size z;
    di_cache_opts o = {.max_tokens = 1048576, .spec_margin = 0};
    OK(di_cache_size_of(cfg, &o, &z, E));
    assert_int_equal(z.window_slot_bytes, 528);
    assert_int_equal(z.cmp_entry_bytes, 288);
    assert_int_equal(z.index_key_bytes, 68);
    assert_true(z.per_token_bytes == 890.0);
    assert_int_equal(z.window_bytes, 43LL * 128 * 528); /* 66 KiB per stage, DSpark included */
    assert_int_equal(128 * 528, 66 * 1024);
    assert_int_equal(z.compressed_bytes, 890LL * 1048576);
    assert_int_equal(z.state_bytes, 3LL * 2 * 2 * 512 * 4); /* ratio-2 sources: 2 × 2 × 512 f32 */
    assert_int_equal(z.engram_bytes, 3 * 4);
    double gib = (double)z.compressed_bytes / (1 << 30);
    tu_report("released @1M, margin 0: %.0f B/token, compressed %.4f GiB, fixed %lld B, total %lld B",
              z.per_token_bytes, gib, (long long)z.fixed_bytes, (long long)z.total_bytes);
    assert_true(fabs(gib - 0.87) < 0.005);
    /* the per-token growth is config.h's footprint summed over stages */
    double sum = 0;
    for (int st = 0; st < cfg->n_stages; st++) {
        di_cache_footprint fp;
        di_cache_footprint_of(cfg, st, &fp);
        sum += fp.per_token_bytes;
    }
    assert_true(sum == z.per_token_bytes);
    /* the speculation margin adds 8 slots per ring and 4 compressor blocks per ratio-2 source */
    di_cache_size m8;
    o.spec_margin = 8;
    OK(di_cache_size_of(cfg, &o, &m8, E));
    assert_int_equal(m8.window_bytes, 43LL * 136 * 528);
    assert_int_equal(m8.state_bytes, 3LL * 5 * 8192);
    assert_int_equal(m8.engram_bytes, (3 + 8) * 4);
    assert_int_equal(m8.compressed_bytes, z.compressed_bytes);
    assert_true(m8.total_bytes >= m8.fixed_bytes + m8.compressed_bytes && m8.total_bytes % 64 == 0);
    assert_true(m8.total_bytes - (m8.fixed_bytes + m8.compressed_bytes) < 64 * 2 * 44);
    tu_report("released @1M, margin 8: fixed %lld B (margin adds %lld B), total %.4f GiB", (long long)m8.fixed_bytes,
              (long long)(m8.fixed_bytes - z.fixed_bytes), (double)m8.total_bytes / (1 << 30));
    /* the default margin of the released config: 2 · (dspark_block_size 5 + 1) = 12, so the bounded
     * replay keeps W + 12 = 140 tokens (DeepInfer's documented default) */
    assert_int_equal(di_cache_default_margin(cfg), 12);
    o.spec_margin = -1;
    OK(di_cache_size_of(cfg, &o, &m8, E));
    assert_int_equal(m8.window_bytes, 43LL * 140 * 528);
    free(cfg);
}

static void test_sizes_tiny_and_arena(void **state) {
    (void)state;
    di_config *cfg = load_cfg("v41-tiny-sel"); /* hd 64, ihd 64, W 16, sources 1 (R 2), 3 (R 1) */
    di_cache_size z;
    di_cache_opts o = {.max_tokens = 256, .spec_margin = 8};
    OK(di_cache_size_of(cfg, &o, &z, E));
    assert_int_equal(z.window_slot_bytes, 64 + 2);
    assert_int_equal(z.cmp_entry_bytes, 32 + 4);
    assert_int_equal(z.index_key_bytes, 32 + 2);
    assert_int_equal(z.window_bytes, 7LL * 24 * 66);
    assert_int_equal(z.compressed_bytes, 128LL * 70 + 256LL * 70);
    assert_true(z.per_token_bytes == 70.0 / 2 + 70.0);
    assert_int_equal(z.state_bytes, 5LL * 2 * 2 * 64 * 4);
    /* caller memory: exact size works, one byte less or misaligned is refused */
    uint8_t *mem = aligned_alloc(64, (size_t)z.total_bytes + 64);
    memset(mem, 0, (size_t)z.total_bytes + 64);
    di_cache c;
    di_error err = {0};
    assert_int_equal(di_cache_init(&c, cfg, &o, mem, (size_t)z.total_bytes - 1, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "at least"));
    assert_int_equal(di_cache_init(&c, cfg, &o, mem + 1, (size_t)z.total_bytes, &err), DI_ERR_INVALID);
    OK(di_cache_init(&c, cfg, &o, mem, (size_t)z.total_bytes, E));
    append(&c, 1, 40, 1);
    /* every section lies inside the arena */
    for (int st = 0; st < c.n_stages; st++) {
        assert_true(c.stage[st].window + c.ring_slots * c.window_slot_bytes <= mem + z.total_bytes);
        if (c.stage[st].cmp)
            assert_true(c.stage[st].ikey + c.stage[st].max_entries * c.index_key_bytes <= mem + z.total_bytes);
    }
    /* reset starts over: the image of an empty cache */
    di_cache_reset(&c);
    assert_int_equal(di_cache_image_bytes(&c), 8);
    o.max_tokens = 0;
    assert_int_equal(di_cache_size_of(cfg, &o, &z, &err), DI_ERR_INVALID);
    o.max_tokens = 10;
    o.spec_margin = 1025;
    assert_int_equal(di_cache_size_of(cfg, &o, &z, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "spec_margin"));
    /* a negative margin is the config's default: two DSpark verify blocks when there are draft
     * stages, DI_CACHE_SPEC_MARGIN_DEFAULT otherwise */
    o.spec_margin = -1;
    OK(di_cache_size_of(cfg, &o, &z, E));
    int m = di_cache_default_margin(cfg);
    assert_int_equal(m, cfg->n_dspark > 0 && 2 * (cfg->dspark_block_size + 1) > DI_CACHE_SPEC_MARGIN_DEFAULT
                            ? 2 * (cfg->dspark_block_size + 1)
                            : DI_CACHE_SPEC_MARGIN_DEFAULT);
    assert_int_equal(z.window_bytes, (int64_t)cfg->n_stages * (cfg->sliding_window + m) * 66);
    free(mem);
    free(cfg);
}

/* Position bookkeeping: visible entries by the rule (n+1)·R ≤ p+1 against a brute-force count;
 * entries completed by the appended tokens follow extends and rollbacks. */
static void test_bookkeeping(void **state) {
    (void)state;
    for (int R = 1; R <= 4; R++)
        for (int64_t p = 0; p < 50; p++) {
            int64_t brute = 0;
            for (int64_t e = 0; e <= p; e++) brute += (e + 1) * R <= p + 1;
            assert_int_equal(di_cache_visible(p, R), brute);
        }
    di_config *cfg = load_cfg("v41-tiny-sel"); /* stage 1: R 2, stage 3: R 1, stage 0: none */
    di_cache *c = make_cache(cfg, 100, 8);
    assert_int_equal(c->stage[1].ratio, 2);
    assert_int_equal(c->stage[3].ratio, 1);
    const int64_t steps[] = {+7, -3, +1, +8, -8, +5, -1, +30, -2};
    int64_t n = 0;
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
        if (steps[i] > 0) OK(di_cache_extend(c, steps[i], E));
        else OK(di_cache_rollback(c, -steps[i], E));
        n += steps[i];
        assert_int_equal(di_cache_len(c), n);
        assert_int_equal(di_cache_n_entries(c, 1), n / 2);
        assert_int_equal(di_cache_n_entries(c, 3), n);
        assert_int_equal(di_cache_n_entries(c, 0), 0);
        /* the newest query sees every completed entry */
        assert_int_equal(di_cache_visible(n - 1, 2), n / 2);
    }
    di_cache_destroy(c);
    free(cfg);
}

/* The Engram history answers lookbacks 1 … G−1 with NONE before the start. */
static void test_engram_history(void **state) {
    (void)state;
    di_config *cfg = load_cfg("v41-tiny-sel"); /* max_ngram 4 */
    di_cache *c = make_cache(cfg, 64, 8);
    assert_int_equal(c->engram_hist, 3);
    int32_t h[3];
    OK(di_cache_engram_history(c, 0, h, E));
    for (int i = 0; i < 3; i++) assert_int_equal(h[i], DI_CACHE_ENGRAM_NONE);
    for (int p = 0; p < 8; p++) {
        OK(di_cache_extend(c, 1, E));
        OK(di_cache_engram_put(c, p, p == 5 ? DI_CACHE_ENGRAM_DEAD : 100 + p, E));
    }
    OK(di_cache_engram_history(c, 2, h, E));
    assert_int_equal(h[0], 101);
    assert_int_equal(h[1], 100);
    assert_int_equal(h[2], DI_CACHE_ENGRAM_NONE);
    OK(di_cache_engram_history(c, 7, h, E));
    assert_int_equal(h[0], 106);
    assert_int_equal(h[1], DI_CACHE_ENGRAM_DEAD);
    assert_int_equal(h[2], 104);
    for (int p = 8; p < 20; p++) {
        OK(di_cache_extend(c, 1, E));
        OK(di_cache_engram_put(c, p, 100 + p, E));
    }
    OK(di_cache_engram_history(c, 20, h, E));
    assert_int_equal(h[0], 119);
    assert_int_equal(h[2], 117);
    di_error err = {0};
    assert_int_equal(di_cache_engram_history(c, 10, h, &err), DI_ERR_INVALID); /* 11 slots: position 7 is gone */
    di_cache_destroy(c);
    free(cfg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequant_exact),
        cmocka_unit_test(test_reference_vectors),
        cmocka_unit_test(test_requant_not_idempotent),
        cmocka_unit_test(test_rollback_tiny),
        cmocka_unit_test(test_backend_arena),
        cmocka_unit_test(test_rollback_released),
        cmocka_unit_test(test_rollback_after_long_chunk),
        cmocka_unit_test(test_rollback_limits),
        cmocka_unit_test(test_window_order),
        cmocka_unit_test(test_window_reach),
        cmocka_unit_test(test_gather_feeds_attention),
        cmocka_unit_test(test_state_feeds_pooling),
        cmocka_unit_test(test_sizes_released),
        cmocka_unit_test(test_sizes_tiny_and_arena),
        cmocka_unit_test(test_engram_history),
        cmocka_unit_test(test_bookkeeping),
        cmocka_unit_test(test_stale_reads_refused),
        cmocka_unit_test(test_throughput),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
