/* GPU test of the batched cache-row slots (backend.h "batched cache rows", cuda_rows.cu) at the V4.1
 * shapes (window rows and compressed entries of head_dim 512, index keys of 128):
 *  - row_encode_scatter / row_decode_gather against the CPU slots and against the CUDA backend's own
 *    row_encode / row_decode called row by row (the graph's old path): bytes and values identical;
 *  - compress_pool_ring against the CUDA compress_pool called group by group on block g mod nb (the
 *    graph's old path): entries and every state byte identical; against the CPU ring: state identical,
 *    entries within the existing compress_pool bound (≤ 1 bf16 ulp: the device exp is the
 *    correctly rounded one, the CPU's is libm's expf — tests/cuda/test_cuda_ops.c "compress_stream").
 *  - compress_pool_seqs against compress_pool_ring per sequence (identical) and the CPU (state identical,
 *    entries within the bound above);
 *  - sparse_attn_seqs against di_cuda_sparse_attn called sequence by sequence (identical) and the CPU
 *    (within sparse_attn's existing bound, ≤ 1 bf16 ulp: test_cuda_ops.c "sparse_attn").
 * Also the time of the old per-row / per-group / per-sequence launches and of the one batched launch for the same work.
 * One table row per case; last line "N passed, N failed"; exit status 1 if any case fails. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_attn.h"
#include "backend/cuda/cuda_ops.h"
#include "io/formats.h"
#include "cuda_testutil.h"


static di_backend *cpu, *gpu;
static int n_pass, n_fail;
static di_error g_err;
#define E (&g_err)


static void *dev(size_t n) {
    void *d = gpu->mem_alloc(gpu, n, E);
    if (!d) die("mem_alloc", g_err.msg);
    return d;
}
static void *up(const void *h, size_t n) {
    void *d = dev(n);
    RUN(gpu->mem_upload(gpu, d, h, n, E));
    return d;
}
static void *down(const void *d, size_t n) {
    void *h = xmalloc(n);
    RUN(gpu->mem_download(gpu, h, d, n, E));
    return h;
}

static uint64_t rng = 0x452821E638D01377ull;
static uint64_t rnd(void) { return ct_xorshift(&rng); }
static double gauss(void) { return ct_gauss(&rng); }
/* bf16 over many binades per group of 16, some zeros, a few inf / NaN: every quantizer branch */
static uint16_t *rand_rows(int64_t n) {
    uint16_t *p = xmalloc(sizeof *p * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        double sc = ldexp(1.0, (int)((i / 16 * 7919) % 51) - 30);
        uint64_t r = rnd() % 4001;
        p[i] = r < 170 ? 0 : r == 171 ? 0x7f80 : r == 172 ? 0x7fc3 : di_f32_to_bf16((float)(gauss() * sc));
    }
    return p;
}
static float *rand_f32(int64_t n, double scale) {
    float *p = xmalloc(sizeof *p * (size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = (float)(gauss() * scale);
    return p;
}

static void row(const char *op, const char *shape, int64_t differing, int64_t total) {
    bool ok = differing == 0;
    printf("%-26s %-44s %10lld / %-10lld %s\n", op, shape, (long long)differing, (long long)total, ok ? "PASS" : "FAIL");
    ok ? n_pass++ : n_fail++;
}
static int64_t bytes_differ(const void *a, const void *b, int64_t n) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += ((const uint8_t *)a)[i] != ((const uint8_t *)b)[i];
    return d;
}

/* bf16 values that differ, NaN against NaN counted apart (*nan_bits): the CPU decode multiplies on x86,
 * which propagates a NaN operand's sign and payload, the GPU's __fmul_rn returns the canonical NaN, and
 * the bf16 conversion keeps the payload (formats.h), so NaN codes decode to NaNs with other bits. The
 * values (NaN placement included) must agree. */
static int64_t bf16_differ(const uint16_t *a, const uint16_t *b, int64_t n, int64_t *nan_bits) {
    int64_t d = 0;
    *nan_bits = 0;
    for (int64_t i = 0; i < n; i++) {
        if (a[i] == b[i]) continue;
        bool na = (a[i] & 0x7fff) > 0x7f80, nb = (b[i] & 0x7fff) > 0x7f80;
        if (na && nb) (*nan_bits)++;
        else d++;
    }
    return d;
}

/* milliseconds between two events recorded on the backend's stream around a piece of work */
static cudaEvent_t ev0, ev1;
static void tic(void) { cudaEventRecord(ev0, (cudaStream_t)di_backend_cuda_stream(gpu)); }
static float toc(void) {
    float ms = 0;
    cudaEventRecord(ev1, (cudaStream_t)di_backend_cuda_stream(gpu));
    cudaEventSynchronize(ev1);
    cudaEventElapsedTime(&ms, ev0, ev1);
    return ms;
}

/* ---------------- row codecs through address lists ---------------- */

static void test_rows(di_row_codec codec, const char *name, int64_t n, int64_t d) {
    int64_t rb = di_row_codec_bytes(codec, d), slots = n + 13;
    uint16_t *x = rand_rows(n * d);
    uint8_t *ref = xmalloc((size_t)(n * rb)); /* [n, rb] CPU row_encode */
    RUN(cpu->row_encode(cpu, codec, x, n, d, ref, E));
    uint16_t *dx = up(x, sizeof(uint16_t) * (size_t)(n * d));

    /* row i to slot perm(i) of a larger array, every 11th row skipped (NULL) */
    uint8_t *dslots = dev((size_t)(slots * rb)), *dold = dev((size_t)(slots * rb));
    RUN(gpu->mem_set(gpu, dslots, 0xa5, (size_t)(slots * rb), E));
    RUN(gpu->mem_set(gpu, dold, 0xa5, (size_t)(slots * rb), E));
    uint8_t **hdst = xmalloc(sizeof(uint8_t *) * (size_t)n); /* [n] device addresses */
    int64_t *slot_of = xmalloc(sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        slot_of[i] = (i * 7919 + 3) % slots;
        hdst[i] = i % 11 == 6 ? NULL : dslots + slot_of[i] * rb;
    }
    uint8_t **ddst = up(hdst, sizeof(uint8_t *) * (size_t)n);
    tic();
    RUN(gpu->row_encode_scatter(gpu, codec, dx, n, d, ddst, E));
    float ms_new = toc();
    tic(); /* the old path: one row_encode per row */
    for (int64_t i = 0; i < n; i++)
        if (hdst[i]) RUN(gpu->row_encode(gpu, codec, dx + i * d, 1, d, dold + slot_of[i] * rb, E));
    float ms_old = toc();
    uint8_t *got = down(dslots, (size_t)(slots * rb)), *old = down(dold, (size_t)(slots * rb));
    /* expected image: the CPU rows at their slots, 0xa5 elsewhere */
    uint8_t *want = xmalloc((size_t)(slots * rb));
    memset(want, 0xa5, (size_t)(slots * rb));
    for (int64_t i = 0; i < n; i++)
        if (hdst[i]) memcpy(want + slot_of[i] * rb, ref + i * rb, (size_t)rb);
    char shape[80], op[48];
    snprintf(shape, sizeof shape, "%lld rows x %lld, %lld slots", (long long)n, (long long)d, (long long)slots);
    snprintf(op, sizeof op, "encode_scatter %s", name);
    row(op, shape, bytes_differ(got, want, slots * rb), slots * rb);
    snprintf(op, sizeof op, "  vs row_encode per row");
    row(op, shape, bytes_differ(got, old, slots * rb), slots * rb);
    printf("# %s encode of %lld rows: %lld row_encode launches %.3f ms, one row_encode_scatter %.3f ms\n", name,
           (long long)n, (long long)n, ms_old, ms_new);

    /* decode: rows in reverse slot order, every 7th a zero row, against CPU row_decode with ids */
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)n);
    const uint8_t **hsrc = xmalloc(sizeof(uint8_t *) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        int64_t r = n - 1 - i;
        ids[i] = i % 7 == 2 ? -1 : (int32_t)r;
        hsrc[i] = ids[i] < 0 ? NULL : dslots + slot_of[r] * rb;
        if (ids[i] >= 0 && !hdst[r]) ids[i] = -1, hsrc[i] = NULL; /* a skipped row holds no code */
    }
    uint16_t *yc = xmalloc(sizeof(uint16_t) * (size_t)(n * d));
    RUN(cpu->row_decode(cpu, codec, ref, ids, n, d, yc, E));
    const uint8_t **dsrc = up(hsrc, sizeof(uint8_t *) * (size_t)n);
    uint16_t *dy = dev(sizeof(uint16_t) * (size_t)(n * d)), *dyo = dev(sizeof(uint16_t) * (size_t)(n * d));
    int32_t *hid = xmalloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) hid[i] = ids[i] < 0 ? -1 : (int32_t)slot_of[ids[i]];
    int32_t *did = up(hid, sizeof(int32_t) * (size_t)n);
    tic();
    RUN(gpu->row_decode_gather(gpu, codec, dsrc, n, d, dy, E));
    ms_new = toc();
    tic(); /* the old path: a decode through an id list per sequence; here one call of the same ids */
    RUN(gpu->row_decode(gpu, codec, dslots, did, n, d, dyo, E));
    ms_old = toc();
    uint16_t *yg = down(dy, sizeof(uint16_t) * (size_t)(n * d)), *yo = down(dyo, sizeof(uint16_t) * (size_t)(n * d));
    snprintf(op, sizeof op, "decode_gather %s", name);
    int64_t nan_bits = 0, vd = bf16_differ(yg, yc, n * d, &nan_bits);
    row(op, shape, vd, n * d);
    printf("#   %lld values NaN on both sides with other NaN bits (x86 NaN propagation vs the GPU's canonical NaN)\n",
           (long long)nan_bits);
    row("  vs row_decode with ids", shape, bytes_differ(yg, yo, n * d * 2), n * d * 2);
    printf("# %s decode of %lld rows: row_decode(ids) %.3f ms, row_decode_gather %.3f ms\n", name, (long long)n, ms_old,
           ms_new);
    gpu->mem_free(gpu, dx), gpu->mem_free(gpu, dslots), gpu->mem_free(gpu, dold), gpu->mem_free(gpu, ddst);
    gpu->mem_free(gpu, dsrc), gpu->mem_free(gpu, dy), gpu->mem_free(gpu, dyo), gpu->mem_free(gpu, did);
    free(x), free(ref), free(hdst), free(slot_of), free(got), free(old), free(want), free(ids), free(hsrc), free(yc);
    free(hid), free(yg), free(yo);
}

/* ---------------- compressor pooling over the state ring ---------------- */

static int64_t bf16_beyond_1ulp(const uint16_t *a, const uint16_t *b, int64_t n) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t x = a[i], y = b[i];
        if (x == y) continue;
        if ((x ^ y) & 0x8000 || abs(x - y) > 1) bad++;
    }
    return bad;
}

static void test_ring(int R, int nb, int64_t d, const int64_t *chunks, int n_chunks) {
    int64_t T = 0, blk = 2 * (int64_t)R * d;
    for (int k = 0; k < n_chunks; k++) T += chunks[k];
    float *a = rand_f32(T * d, 1.0), *g = rand_f32(T * d, 2.0); /* f32 [T, d] */
    float *st = xmalloc(sizeof(float) * (size_t)(nb * blk));     /* f32 [nb, 2, R, d] */
    for (int b = 0; b < nb; b++) RUN(di_cpu_compress_state_reset(st + b * blk, st + b * blk + R * d, R, d, E));
    float *da = up(a, sizeof(float) * (size_t)(T * d)), *dg = up(g, sizeof(float) * (size_t)(T * d));
    float *ds_new = up(st, sizeof(float) * (size_t)(nb * blk)), *ds_old = up(st, sizeof(float) * (size_t)(nb * blk));
    int64_t ne = T / R;
    uint16_t *yc = xmalloc(sizeof(uint16_t) * (size_t)((ne + 1) * d));
    uint16_t *dy_new = dev(sizeof(uint16_t) * (size_t)((ne + 1) * d)), *dy_old = dev(sizeof(uint16_t) * (size_t)((ne + 1) * d));
    float ms_new = 0, ms_old = 0;
    int64_t pos = 0, e = 0, calls_old = 0;
    for (int k = 0; k < n_chunks; k++) {
        int64_t m = chunks[k];
        RUN(cpu->compress_pool_ring(cpu, a + pos * d, g + pos * d, m, pos, R, d, st, nb, yc + e * d, E));
        tic();
        RUN(gpu->compress_pool_ring(gpu, da + pos * d, dg + pos * d, m, pos, R, d, ds_new, nb, dy_new + e * d, E));
        ms_new += toc();
        tic(); /* the old graph: one compress_pool per group, on the group's block */
        int64_t eo = e;
        for (int64_t p = pos; p < pos + m;) {
            int64_t end = (p / R + 1) * R;
            if (end > pos + m) end = pos + m;
            float *kv = ds_old + ((p / R) % nb) * blk;
            int64_t n_out = 0;
            RUN(gpu->compress_pool(gpu, da + p * d, dg + p * d, end - p, p, R, d, kv, kv + R * d, dy_old + eo * d, &n_out, E));
            eo += n_out, calls_old++;
            p = end;
        }
        ms_old += toc();
        e += (pos + m) / R - pos / R;
        if (eo != e) die("compress_pool", "entry counts differ");
        pos += m;
    }
    uint16_t *yn = down(dy_new, sizeof(uint16_t) * (size_t)(e * d)), *yo = down(dy_old, sizeof(uint16_t) * (size_t)(e * d));
    float *sn = down(ds_new, sizeof(float) * (size_t)(nb * blk)), *so = down(ds_old, sizeof(float) * (size_t)(nb * blk));
    char shape[80];
    snprintf(shape, sizeof shape, "%lld tokens / %d chunks, R %d, %d blocks, d %lld", (long long)T, n_chunks, R, nb,
             (long long)d);
    row("pool_ring entries vs old", shape, bytes_differ(yn, yo, e * d * 2), e * d * 2);
    row("pool_ring state vs old", shape, bytes_differ(sn, so, nb * blk * 4), nb * blk * 4);
    row("pool_ring state vs cpu", shape, bytes_differ(sn, st, nb * blk * 4), nb * blk * 4);
    row("pool_ring entries vs cpu", "  (> 1 bf16 ulp)", bf16_beyond_1ulp(yn, yc, e * d), e * d);
    printf("# pool R %d, %lld tokens: %lld compress_pool calls %.3f ms, %d compress_pool_ring calls %.3f ms\n", R,
           (long long)T, (long long)calls_old, ms_old, n_chunks, ms_new);
    gpu->mem_free(gpu, da), gpu->mem_free(gpu, dg), gpu->mem_free(gpu, ds_new), gpu->mem_free(gpu, ds_old);
    gpu->mem_free(gpu, dy_new), gpu->mem_free(gpu, dy_old);
    free(a), free(g), free(st), free(yc), free(yn), free(yo), free(sn), free(so);
}

/* compress_pool_seqs: B sequences (decode steps and short chunks at scattered positions, each with its own
 * mid-sequence ring) in one call, against compress_pool_ring per sequence on the device and the CPU. */
static void test_pool_seqs(int B, int R, int nb, int64_t d) {
    int64_t blk = 2 * (int64_t)R * d, rows = 0, n_out = 0;
    di_pool_seq *hc = xmalloc(sizeof(di_pool_seq) * (size_t)B), *hn = xmalloc(sizeof(di_pool_seq) * (size_t)B);
    float **so = xmalloc(sizeof(float *) * (size_t)B); /* device rings of the per-sequence run */
    for (int b = 0; b < B; b++) {
        int64_t s0 = (int64_t)(rnd() % 5000), m = b % 8 == 7 ? 1 + (int64_t)(rnd() % 40) : 1;
        float *st = rand_f32(nb * blk, 1.0);
        hc[b] = (di_pool_seq){.state = st, .start_pos = s0, .m = m, .row0 = rows, .out0 = n_out};
        hn[b] = hc[b];
        hn[b].state = up(st, sizeof(float) * (size_t)(nb * blk));
        so[b] = up(st, sizeof(float) * (size_t)(nb * blk));
        rows += m, n_out += (s0 + m) / R - s0 / R;
    }
    float *a = rand_f32(rows * d, 1.0), *g = rand_f32(rows * d, 2.0);
    int32_t *es = xmalloc(sizeof(int32_t) * (size_t)(n_out + 1));
    for (int b = 0; b < B; b++)
        for (int64_t e = hc[b].out0; e < hc[b].out0 + (hc[b].start_pos + hc[b].m) / R - hc[b].start_pos / R; e++) es[e] = b;
    uint16_t *yc = xmalloc(sizeof(uint16_t) * (size_t)(n_out * d + 1));
    RUN(cpu->compress_pool_seqs(cpu, a, g, R, d, nb, hc, B, es, n_out, yc, E));
    float *da = up(a, sizeof(float) * (size_t)(rows * d)), *dg = up(g, sizeof(float) * (size_t)(rows * d));
    di_pool_seq *dseqs = up(hn, sizeof(di_pool_seq) * (size_t)B);
    int32_t *des = up(es, sizeof(int32_t) * (size_t)(n_out + 1));
    uint16_t *dy = dev(sizeof(uint16_t) * (size_t)(n_out * d + 1)), *dyo = dev(sizeof(uint16_t) * (size_t)(n_out * d + 1));
    tic();
    RUN(gpu->compress_pool_seqs(gpu, da, dg, R, d, nb, dseqs, B, des, n_out, dy, E));
    float ms_new = toc();
    tic();
    for (int b = 0; b < B; b++)
        RUN(gpu->compress_pool_ring(gpu, da + hc[b].row0 * d, dg + hc[b].row0 * d, hc[b].m, hc[b].start_pos, R, d, so[b], nb,
                                    dyo + hc[b].out0 * d, E));
    float ms_old = toc();
    uint16_t *yn = down(dy, sizeof(uint16_t) * (size_t)(n_out * d + 1)), *yo = down(dyo, sizeof(uint16_t) * (size_t)(n_out * d + 1));
    int64_t st_old = 0, st_cpu = 0;
    for (int b = 0; b < B; b++) {
        float *sn = down(hn[b].state, sizeof(float) * (size_t)(nb * blk)), *sb = down(so[b], sizeof(float) * (size_t)(nb * blk));
        st_old += bytes_differ(sn, sb, nb * blk * 4), st_cpu += bytes_differ(sn, hc[b].state, nb * blk * 4);
        free(sn), free(sb);
    }
    char shape[80];
    snprintf(shape, sizeof shape, "%d seqs, %lld tokens, R %d, %d blocks, d %lld", B, (long long)rows, R, nb, (long long)d);
    row("pool_seqs entries vs ring", shape, bytes_differ(yn, yo, n_out * d * 2), n_out * d * 2);
    row("pool_seqs state vs ring", shape, st_old, B * nb * blk * 4);
    row("pool_seqs state vs cpu", shape, st_cpu, B * nb * blk * 4);
    row("pool_seqs entries vs cpu", "  (> 1 bf16 ulp)", bf16_beyond_1ulp(yn, yc, n_out * d), n_out * d);
    printf("# pool of %d sequences: %d compress_pool_ring calls %.3f ms, one compress_pool_seqs %.3f ms\n", B, B, ms_old,
           ms_new);
    for (int b = 0; b < B; b++) free(hc[b].state), gpu->mem_free(gpu, hn[b].state), gpu->mem_free(gpu, so[b]);
    gpu->mem_free(gpu, da), gpu->mem_free(gpu, dg), gpu->mem_free(gpu, dseqs), gpu->mem_free(gpu, des);
    gpu->mem_free(gpu, dy), gpu->mem_free(gpu, dyo);
    free(hc), free(hn), free(so), free(a), free(g), free(es), free(yc), free(yn), free(yo);
}

/* ---------------- sparse attention of several sequences ---------------- */

/* B sequences with their own window rows, gathered entries and index lists (V4.1: 64 heads of 512, a
 * window of 128 and up to 512 selected entries; −1 holes and short lists), attended in one
 * sparse_attn_seqs call against one di_cuda_sparse_attn per sequence (the old graph) and the CPU. */
static void test_attn_seqs(int B, int64_t T_each, int nh, int d) {
    di_attn_seq *hs = xmalloc(sizeof(di_attn_seq) * (size_t)B), *cs = xmalloc(sizeof(di_attn_seq) * (size_t)B);
    int64_t m = 0;
    for (int b = 0; b < B; b++) m += T_each + b % 3;
    uint16_t *q = rand_rows(m * nh * d); /* bf16 [m, nh, d] */
    for (int64_t i = 0; i < m * nh * d; i++) q[i] = di_f32_to_bf16((float)(gauss() * 0.05)); /* attention-sized */
    float *sink = rand_f32(nh, 1.0);
    int32_t *seq_of = xmalloc(sizeof(int32_t) * (size_t)m);
    uint16_t *dq = up(q, sizeof(uint16_t) * (size_t)(m * nh * d));
    float *dsink = up(sink, sizeof(float) * (size_t)nh);
    uint16_t *dout = dev(sizeof(uint16_t) * (size_t)(m * nh * d)), *dold = dev(sizeof(uint16_t) * (size_t)(m * nh * d));
    uint16_t *hc = xmalloc(sizeof(uint16_t) * (size_t)(m * nh * d));
    void **frees = xmalloc(sizeof(void *) * (size_t)(3 * B));
    float scale = (float)pow((double)d, -0.5);
    for (int b = 0, q0 = 0; b < B; b++) {
        int64_t Tb = T_each + b % 3, nw = 128 + b, nc = b % 4 == 3 ? 0 : 64 + 37 * b, ni = 128 + (nc ? 512 : 0);
        uint16_t *kw = rand_rows(nw * d), *kc = nc ? rand_rows(nc * d) : NULL;
        for (int64_t i = 0; i < nw * d; i++) kw[i] = di_f32_to_bf16((float)gauss());
        for (int64_t i = 0; kc && i < nc * d; i++) kc[i] = di_f32_to_bf16((float)gauss());
        int32_t *ix = xmalloc(sizeof(int32_t) * (size_t)(Tb * ni));
        for (int64_t i = 0; i < Tb * ni; i++)
            ix[i] = rnd() % 9 == 0 ? -1 : (int32_t)(rnd() % (uint64_t)(nw + nc));
        cs[b] = (di_attn_seq){.kv_win = kw, .n_win = nw, .kv_cmp = kc, .n_cmp = nc, .idx = ix, .n_idx = ni, .q0 = q0, .m = Tb};
        hs[b] = cs[b];
        hs[b].kv_win = frees[3 * b] = up(kw, sizeof(uint16_t) * (size_t)(nw * d));
        hs[b].kv_cmp = frees[3 * b + 1] = nc ? up(kc, sizeof(uint16_t) * (size_t)(nc * d)) : NULL;
        hs[b].idx = frees[3 * b + 2] = up(ix, sizeof(int32_t) * (size_t)(Tb * ni));
        for (int64_t t = 0; t < Tb; t++) seq_of[q0 + t] = b;
        q0 += (int)Tb;
    }
    RUN(cpu->sparse_attn_seqs(cpu, q, m, nh, d, cs, B, seq_of, sink, scale, hc, E));
    di_attn_seq *dseqs = up(hs, sizeof(di_attn_seq) * (size_t)B);
    int32_t *dseq_of = up(seq_of, sizeof(int32_t) * (size_t)m);
    tic();
    RUN(gpu->sparse_attn_seqs(gpu, dq, m, nh, d, dseqs, B, dseq_of, dsink, scale, dout, E));
    float ms_new = toc();
    tic();
    for (int b = 0; b < B; b++)
        RUN(di_cuda_sparse_attn(gpu, dq + hs[b].q0 * nh * d, hs[b].m, nh, d, hs[b].kv_win, hs[b].n_win, hs[b].kv_cmp,
                                hs[b].n_cmp, dsink, hs[b].idx, hs[b].n_idx, scale, dold + hs[b].q0 * nh * d, E));
    float ms_old = toc();
    uint16_t *hn = down(dout, sizeof(uint16_t) * (size_t)(m * nh * d)), *ho = down(dold, sizeof(uint16_t) * (size_t)(m * nh * d));
    char shape[80];
    snprintf(shape, sizeof shape, "%d seqs, %lld queries x %d heads x %d", B, (long long)m, nh, d);
    row("attn_seqs vs per sequence", shape, bytes_differ(hn, ho, m * nh * d * 2), m * nh * d * 2);
    row("attn_seqs vs cpu", "  (> 1 bf16 ulp)", bf16_beyond_1ulp(hn, hc, m * nh * d), m * nh * d);
    printf("# sparse attention of %d sequences: %d sparse_attn launches %.3f ms, one sparse_attn_seqs %.3f ms\n", B, B,
           ms_old, ms_new);
    for (int b = 0; b < B; b++) {
        free((void *)cs[b].kv_win), free((void *)cs[b].kv_cmp), free((void *)cs[b].idx);
        for (int k = 0; k < 3; k++)
            if (frees[3 * b + k]) gpu->mem_free(gpu, frees[3 * b + k]);
    }
    gpu->mem_free(gpu, dq), gpu->mem_free(gpu, dsink), gpu->mem_free(gpu, dout), gpu->mem_free(gpu, dold);
    gpu->mem_free(gpu, dseqs), gpu->mem_free(gpu, dseq_of);
    free(hs), free(cs), free(q), free(sink), free(seq_of), free(hc), free(hn), free(ho), free(frees);
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    if (di_cuda_device_count() < 1) {
        printf("no CUDA device: nothing to test\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(di_backend_cpu_create(4, &cpu, E));
    RUN(di_backend_cuda_create(0, &gpu, E));
    cudaEventCreate(&ev0), cudaEventCreate(&ev1);
    printf("%-26s %-44s %23s %s\n", "op", "shape", "differing / total", "result");
    /* an 8K-token prefill's rows: window rows and compressed entries of 512, index keys of 128 */
    test_rows(DI_CODEC_FP8_E8M0, "fp8/e8m0 window", 8192, 512);
    test_rows(DI_CODEC_FP4_E4M3, "fp4/e4m3 entry", 4096, 512);
    test_rows(DI_CODEC_FP4_E8M0, "fp4/e8m0 key", 4096, 128);
    test_rows(DI_CODEC_FP8_E8M0, "fp8/e8m0 window", 64, 512); /* a decode step of batch 64 */
    /* V4.1 pools with ratio 2 (5 blocks at the default rollback margin 8); a prefill, then chunks that
     * start and end inside groups, decode steps */
    const int64_t c2[] = {8192, 1, 1, 37, 1, 2000, 3};
    test_ring(2, 5, 512, c2, 7);
    const int64_t c4[] = {5, 1, 1, 1, 300, 2, 7};
    test_ring(4, 3, 512, c4, 7);
    const int64_t c128[] = {1000, 1, 55, 300};
    test_ring(128, 2, 512, c128, 4);
    test_pool_seqs(64, 2, 5, 512);  /* a decode step of batch 64 (every 8th sequence a short chunk) */
    test_pool_seqs(7, 4, 3, 512);
    test_attn_seqs(64, 1, 64, 512); /* a decode step of batch 64 */
    test_attn_seqs(5, 9, 64, 512);  /* mixed chunks */
    printf("%d passed, %d failed\n", n_pass, n_fail);
    di_backend_destroy(gpu);
    di_backend_destroy(cpu);
    return n_fail ? 1 : 0;
}
