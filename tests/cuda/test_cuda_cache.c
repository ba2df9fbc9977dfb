/* GPU cache test: the backend memory slots, the cache row codecs and the stream mean of the CUDA backend
 * against the CPU backend, and a per-sequence cache whose arena lives in device memory against the same
 * cache in host memory (model/cache.h), driven through one random schedule of chunks, rollbacks and a
 * prefix export / import.
 *
 * Everything here must be bit-exact: the codecs are the io/formats.h quantizers and a product that is
 * exact in f32 (cache_rows.c), the stream mean is a fixed-order f32 sum; the device cache must produce
 * the host cache's canonical image (di_cache_image) byte for byte after every step.
 *
 * One table row per case (op, shape, bytes or values differing, result); last line "N passed, N failed".
 * Usage: test_cuda_cache [kernels.safetensors (unused)] — the model config comes from
 * $DI_CACHE_MODEL (default tests/data/v41-tiny-sel). Exit status 1 if any case fails. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_ops.h"
#include "io/formats.h"
#include "model/cache.h"
#include "model/config.h"
#include "cuda_testutil.h"

static di_backend *cpu, *gpu;
static int n_pass, n_fail;
static di_error g_err;
#define E (&g_err)



/* device copies through the backend's own slots (what the graph uses) */
static void *up(const void *h, size_t n) {
    void *d = gpu->mem_alloc(gpu, n, E);
    if (!d) die("mem_alloc", g_err.msg);
    RUN(gpu->mem_upload(gpu, d, h, n, E));
    return d;
}
static void *down(const void *d, size_t n) {
    void *h = xmalloc(n);
    RUN(gpu->mem_download(gpu, h, d, n, E));
    return h;
}

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint64_t rnd(void) { return ct_xorshift(&rng); }
static double gauss(void) { return ct_gauss(&rng); }
/* bf16 values over many binades (scales from 2^-30 to 2^20 per group of 16), some exact zeros, so
 * every scale path of the quantizers (floors, subnormal codes, saturation) is exercised */
static uint16_t *rand_rows(int64_t n) {
    uint16_t *p = xmalloc(sizeof *p * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        double sc = ldexp(1.0, (int)((i / 16 * 7919) % 51) - 30);
        p[i] = rnd() % 23 == 0 ? 0 : di_f32_to_bf16((float)(gauss() * sc));
    }
    return p;
}

static void row(const char *op, const char *shape, int64_t differing, int64_t total) {
    bool ok = differing == 0;
    printf("%-22s %-40s %10lld / %-10lld %s\n", op, shape, (long long)differing, (long long)total, ok ? "PASS" : "FAIL");
    ok ? n_pass++ : n_fail++;
}

static int64_t bytes_differ(const void *a, const void *b, int64_t n) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += ((const uint8_t *)a)[i] != ((const uint8_t *)b)[i];
    return d;
}

/* ---------------- memory slots ---------------- */

static void test_memory(void) {
    const size_t n = 1 << 20;
    uint8_t *z = gpu->mem_alloc(gpu, n, E), *h = xmalloc(n);
    if (!z) die("mem_alloc", g_err.msg);
    uint8_t *zh = down(z, n);
    int64_t nz = 0;
    for (size_t i = 0; i < n; i++) nz += zh[i] != 0;
    row("mem_alloc", "1 MiB zero-filled", nz, (int64_t)n);
    for (size_t i = 0; i < n; i++) h[i] = (uint8_t)rnd();
    RUN(gpu->mem_upload(gpu, z, h, n, E));
    uint8_t *c = gpu->mem_alloc(gpu, n, E);
    RUN(gpu->mem_copy(gpu, c, z, n, E));
    RUN(gpu->mem_set(gpu, c + 100, 0x5a, 1000, E));
    memset(h + 100, 0x5a, 1000);
    uint8_t *back = down(c, n);
    row("mem upload/copy/set", "1 MiB round trip", bytes_differ(back, h, (int64_t)n), (int64_t)n);
    gpu->mem_free(gpu, z), gpu->mem_free(gpu, c);
    free(h), free(zh), free(back);
}

/* ---------------- row codecs ---------------- */

static void test_codec(di_row_codec codec, const char *name, int64_t n, int64_t d) {
    int64_t rb = di_row_codec_bytes(codec, d);
    uint16_t *x = rand_rows(n * d);
    uint8_t *rc = xmalloc((size_t)(n * rb));
    RUN(cpu->row_encode(cpu, codec, x, n, d, rc, E));
    uint16_t *dx = up(x, sizeof(uint16_t) * (size_t)(n * d));
    uint8_t *dr = gpu->mem_alloc(gpu, (size_t)(n * rb), E);
    RUN(gpu->row_encode(gpu, codec, dx, n, d, dr, E));
    uint8_t *rg = down(dr, (size_t)(n * rb));
    char shape[64];
    snprintf(shape, sizeof shape, "%lld rows x %lld (%lld B/row)", (long long)n, (long long)d, (long long)rb);
    char op[40];
    snprintf(op, sizeof op, "encode %s", name);
    row(op, shape, bytes_differ(rg, rc, n * rb), n * rb);

    /* decode: every row in order, then a gather with −1 entries and repeats */
    int64_t m = n + 7;
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)m);
    for (int64_t i = 0; i < m; i++) ids[i] = i % 5 == 3 ? -1 : (int32_t)(rnd() % (uint64_t)n);
    uint16_t *yc = xmalloc(sizeof(uint16_t) * (size_t)(m * d));
    RUN(cpu->row_decode(cpu, codec, rc, NULL, n, d, yc, E));
    uint16_t *dy = gpu->mem_alloc(gpu, sizeof(uint16_t) * (size_t)(m * d), E);
    RUN(gpu->row_decode(gpu, codec, dr, NULL, n, d, dy, E));
    uint16_t *yg = down(dy, sizeof(uint16_t) * (size_t)(n * d));
    snprintf(op, sizeof op, "decode %s", name);
    row(op, shape, bytes_differ(yg, yc, n * d * 2) / 1, n * d * 2);
    free(yg);
    int32_t *dids = up(ids, sizeof(int32_t) * (size_t)m);
    RUN(cpu->row_decode(cpu, codec, rc, ids, m, d, yc, E));
    RUN(gpu->row_decode(gpu, codec, dr, dids, m, d, dy, E));
    yg = down(dy, sizeof(uint16_t) * (size_t)(m * d));
    snprintf(op, sizeof op, "gather %s", name);
    snprintf(shape, sizeof shape, "%lld ids (-1 and repeats) of %lld rows", (long long)m, (long long)n);
    row(op, shape, bytes_differ(yg, yc, m * d * 2), m * d * 2);
    gpu->mem_free(gpu, dx), gpu->mem_free(gpu, dr), gpu->mem_free(gpu, dy), gpu->mem_free(gpu, dids);
    free(x), free(rc), free(rg), free(ids), free(yc), free(yg);
}

/* ---------------- stream mean ---------------- */

static void test_stream_mean(int64_t m, int hc, int64_t d, int slots, int slot) {
    int64_t ldy = (int64_t)slots * d;
    uint16_t *x = rand_rows(m * hc * d);
    uint16_t *yc = xmalloc(sizeof(uint16_t) * (size_t)(m * ldy));
    memset(yc, 0, sizeof(uint16_t) * (size_t)(m * ldy));
    RUN(cpu->stream_mean(cpu, x, m, hc, d, yc + slot * d, ldy, E));
    uint16_t *dx = up(x, sizeof(uint16_t) * (size_t)(m * hc * d));
    uint16_t *dy = gpu->mem_alloc(gpu, sizeof(uint16_t) * (size_t)(m * ldy), E);
    RUN(gpu->stream_mean(gpu, dx, m, hc, d, dy + slot * d, ldy, E));
    uint16_t *yg = down(dy, sizeof(uint16_t) * (size_t)(m * ldy));
    char shape[64];
    snprintf(shape, sizeof shape, "[%lld, %d, %lld] -> column %d of %d", (long long)m, hc, (long long)d, slot, slots);
    row("stream_mean", shape, bytes_differ(yg, yc, m * ldy * 2), m * ldy * 2);
    gpu->mem_free(gpu, dx), gpu->mem_free(gpu, dy);
    free(x), free(yc), free(yg);
}

/* ---------------- a device cache against the host cache ---------------- */

typedef struct pair {
    di_cache *h, *d;
    int64_t hd, ihd;
} pair;

static int64_t image_diff(const pair *p) {
    int64_t nh = di_cache_image_bytes(p->h), nd = di_cache_image_bytes(p->d);
    if (nh != nd) return nh > nd ? nh : nd;
    uint8_t *a = xmalloc((size_t)nh), *b = xmalloc((size_t)nh);
    RUN(di_cache_image(p->h, a, nh, NULL, E));
    RUN(di_cache_image(p->d, b, nd, NULL, E));
    int64_t r = bytes_differ(a, b, nh);
    free(a), free(b);
    return r;
}

/* The forward's writes for the chunk [s, s+k) on both caches: window rows of every stage, compressor
 * rows of the group blocks, the entries and index keys the chunk completes. */
static void write_chunk(pair *p, const di_config *cfg, int64_t s, int64_t k) {
    RUN(di_cache_extend(p->h, k, E));
    RUN(di_cache_extend(p->d, k, E));
    for (int st = 0; st < p->h->n_stages; st++) {
        uint16_t *rows = rand_rows(k * p->hd);
        uint16_t *dr = up(rows, sizeof(uint16_t) * (size_t)(k * p->hd));
        RUN(di_cache_window_put_rows(p->h, st, s, k, rows, E));
        RUN(di_cache_window_put_rows(p->d, st, s, k, dr, E));
        gpu->mem_free(gpu, dr), free(rows);
        int R = p->h->stage[st].ratio;
        if (!R) continue;
        if (R >= 2)
            for (int64_t q = s; q < s + k; q++) { /* the token's compressor row, kv then score */
                float *kvh, *sch, *kvd, *scd;
                RUN(di_cache_cmp_state(p->h, st, q, &kvh, &sch, E));
                RUN(di_cache_cmp_state(p->d, st, q, &kvd, &scd, E));
                float *v = xmalloc(sizeof(float) * (size_t)(2 * p->hd));
                for (int64_t j = 0; j < 2 * p->hd; j++) v[j] = (float)gauss();
                int64_t r = q % R;
                memcpy(kvh + r * p->hd, v, sizeof(float) * (size_t)p->hd);
                memcpy(sch + r * p->hd, v + p->hd, sizeof(float) * (size_t)p->hd);
                RUN(gpu->mem_upload(gpu, kvd + r * p->hd, v, sizeof(float) * (size_t)p->hd, E));
                RUN(gpu->mem_upload(gpu, scd + r * p->hd, v + p->hd, sizeof(float) * (size_t)p->hd, E));
                free(v);
            }
        for (int64_t e = s / R; e < (s + k) / R; e++) {
            uint16_t *kv = rand_rows(p->hd), *key = rand_rows(p->ihd);
            uint16_t *dkv = up(kv, sizeof(uint16_t) * (size_t)p->hd), *dkey = up(key, sizeof(uint16_t) * (size_t)p->ihd);
            RUN(di_cache_cmp_put(p->h, st, e, kv, E));
            RUN(di_cache_cmp_put(p->d, st, e, dkv, E));
            RUN(di_cache_ikey_put(p->h, st, e, key, E));
            RUN(di_cache_ikey_put(p->d, st, e, dkey, E));
            gpu->mem_free(gpu, dkv), gpu->mem_free(gpu, dkey), free(kv), free(key);
        }
    }
    if (p->h->engram_slots) /* the ring keeps the newest engram_slots ids (the forward's rule) */
        for (int64_t q = s + k - p->h->engram_slots > s ? s + k - p->h->engram_slots : s; q < s + k; q++) {
            RUN(di_cache_engram_put(p->h, q, (int32_t)(q * 7 % 101), E));
            RUN(di_cache_engram_put(p->d, q, (int32_t)(q * 7 % 101), E));
        }
    (void)cfg;
}

/* Reads the forward makes: the window rows before s, every compressed entry, a top-k gather, the
 * index keys and the DSpark slot-order window — device reads downloaded against host reads. */
static int64_t reads_diff(const pair *p, int64_t s) {
    int64_t W = p->h->window, w0 = s - W + 1 > 0 ? s - W + 1 : 0, diff = 0;
    size_t rb = sizeof(uint16_t) * (size_t)p->hd;
    uint16_t *hr = xmalloc(rb * (size_t)(W + 8)), *dr = gpu->mem_alloc(gpu, rb * (size_t)(W + 8), E), *g;
    for (int st = 0; st < p->h->n_stages; st++) {
        if (s > w0) {
            RUN(di_cache_window_rows(p->h, st, w0, s, hr, E));
            RUN(di_cache_window_rows(p->d, st, w0, s, dr, E));
            g = down(dr, rb * (size_t)(s - w0));
            diff += bytes_differ(g, hr, (int64_t)rb * (s - w0));
            free(g);
            int64_t nrh, nrd;
            RUN(di_cache_dspark_gather(p->h, st, s - 1, hr, &nrh, E));
            RUN(di_cache_dspark_gather(p->d, st, s - 1, dr, &nrd, E));
            g = down(dr, rb * (size_t)nrd);
            diff += nrh != nrd ? 1 : bytes_differ(g, hr, (int64_t)rb * nrh);
            free(g);
        }
        int R = p->h->stage[st].ratio;
        int64_t ne = R ? s / R : 0;
        if (!ne) continue;
        int64_t cap = ne > 9 ? ne : 9; /* rows: the entries, or the 9-entry gather */
        uint16_t *hc = xmalloc(rb * (size_t)cap), *dc = gpu->mem_alloc(gpu, rb * (size_t)cap, E);
        RUN(di_cache_cmp_rows(p->h, st, 0, ne, hc, E));
        RUN(di_cache_cmp_rows(p->d, st, 0, ne, dc, E));
        g = down(dc, rb * (size_t)ne);
        diff += bytes_differ(g, hc, (int64_t)rb * ne);
        free(g);
        int32_t ent[9];
        for (int i = 0; i < 9; i++) ent[i] = i == 4 ? -1 : (int32_t)(rnd() % (uint64_t)ne);
        RUN(di_cache_cmp_gather(p->h, st, ent, 9, hc, E));
        RUN(di_cache_cmp_gather(p->d, st, ent, 9, dc, E));
        g = down(dc, rb * 9);
        diff += bytes_differ(g, hc, (int64_t)rb * 9);
        free(g);
        size_t kb = sizeof(uint16_t) * (size_t)p->ihd;
        RUN(di_cache_ikey_rows(p->h, st, 0, ne, hc, E)); /* hc holds ne·hd ≥ ne·ihd values */
        RUN(di_cache_ikey_rows(p->d, st, 0, ne, dc, E));
        g = down(dc, kb * (size_t)ne);
        diff += bytes_differ(g, hc, (int64_t)kb * ne);
        free(g), free(hc);
        gpu->mem_free(gpu, dc);
    }
    free(hr);
    gpu->mem_free(gpu, dr);
    return diff;
}

static void test_device_cache(const char *model_dir) {
    di_config cfg;
    if (di_config_load(model_dir, &cfg, E)) {
        printf("# device cache: %s (set DI_CACHE_MODEL): not checked\n", g_err.msg);
        n_fail++;
        return;
    }
    di_cache_opts ho = {.max_tokens = 512, .spec_margin = 8}, dop = ho;
    dop.be = gpu;
    pair p = {.hd = cfg.head_dim, .ihd = cfg.index_head_dim};
    RUN(di_cache_create(&cfg, &ho, &p.h, E));
    RUN(di_cache_create(&cfg, &dop, &p.d, E));
    const int64_t chunks[] = {37, 1, 1, 5, 64, 1, 2, 3, 130, 1, 1, 6};
    int64_t s = 0, img = 0, rd = 0, steps = 0;
    for (int i = 0; i < (int)(sizeof chunks / sizeof *chunks); i++) {
        write_chunk(&p, &cfg, s, chunks[i]);
        s += chunks[i];
        img += image_diff(&p);
        rd += reads_diff(&p, s);
        steps++;
        if (i % 3 == 2) { /* a rejected speculation: drop up to the limit, then rewrite */
            int64_t k = di_cache_rollback_limit(p.h);
            k = k > 5 ? 5 : k;
            RUN(di_cache_rollback(p.h, k, E));
            RUN(di_cache_rollback(p.d, k, E));
            s -= k;
            img += image_diff(&p);
            rd += reads_diff(&p, s);
            steps++;
        }
    }
    char shape[80];
    snprintf(shape, sizeof shape, "%d stages, %lld tokens, %lld steps", cfg.n_stages, (long long)s, (long long)steps);
    row("device cache image", shape, img, steps);
    row("device cache reads", shape, rd, steps);

    /* prefix export from the device cache, import into a fresh device cache and a host cache */
    int64_t B = s / di_cache_prefix_align(p.h) * di_cache_prefix_align(p.h);
    int64_t nb = di_cache_prefix_span_bytes(p.h, 0, B);
    uint8_t *eh = xmalloc((size_t)nb + 1), *ed = xmalloc((size_t)nb + 1);
    RUN(di_cache_prefix_export(p.h, 0, B, eh, nb, E));
    RUN(di_cache_prefix_export(p.d, 0, B, ed, nb, E));
    int64_t ex = bytes_differ(eh, ed, nb);
    di_cache *d2;
    RUN(di_cache_create(&cfg, &dop, &d2, E));
    RUN(di_cache_prefix_begin(d2, B, B, E));
    RUN(di_cache_prefix_import(d2, 0, B, ed, nb, E));
    RUN(di_cache_prefix_export(d2, 0, B, eh, nb, E));
    ex += bytes_differ(eh, ed, nb);
    snprintf(shape, sizeof shape, "span [0, %lld): %lld bytes", (long long)B, (long long)nb);
    row("prefix export/import", shape, ex, nb);
    free(eh), free(ed);
    di_cache_destroy(d2);
    di_cache_destroy(p.h);
    di_cache_destroy(p.d);
    di_config_free(&cfg);
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    if (di_cuda_device_count() < 1) {
        printf("no CUDA device: nothing to test\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(di_backend_cpu_create(1, &cpu, E));
    RUN(di_backend_cuda_create(0, &gpu, E));
    printf("%-22s %-40s %23s %s\n", "op", "shape", "differing / total", "result");
    test_memory();
    /* real V4.1 shapes: window rows and compressed entries of head_dim 512, index keys of 128 */
    test_codec(DI_CODEC_FP8_E8M0, "fp8/e8m0 window", 300, 512);
    test_codec(DI_CODEC_FP4_E4M3, "fp4/e4m3 entry", 300, 512);
    test_codec(DI_CODEC_FP4_E8M0, "fp4/e8m0 key", 300, 128);
    test_codec(DI_CODEC_FP8_E8M0, "fp8/e8m0 window", 3, 64);
    test_stream_mean(37, 4, 5120, 3, 1);
    test_stream_mean(5, 4, 64, 1, 0);
    const char *model = getenv("DI_CACHE_MODEL");
    test_device_cache(model ? model : "tests/data/v41-tiny-sel");
    printf("%d passed, %d failed\n", n_pass, n_fail);
    di_backend_destroy(gpu);
    di_backend_destroy(cpu);
    return n_fail ? 1 : 0;
}
