/* Batched cache-row slots of the CPU backend (backend.h "batched cache rows"): the row codecs of
 * row_codec.c applied to listed addresses, the compressor ring as compress_pool group by group, and
 * the sparse attention of several sequences as sparse_attn sequence by sequence.
 * They are the per-row calls the graph made before, in the same order, so they are bit-identical to
 * them by construction; the CUDA kernels (cuda_rows.cu) are tested against these. */
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_rows.h"
#include "util/error.h"

static int check_codec(const char *op, di_row_codec codec, int64_t n, int64_t d, di_error *err) {
    if (codec < DI_CODEC_FP8_E8M0 || codec > DI_CODEC_FP4_E8M0 || n < 0 || d <= 0 || d % di_row_codec_group(codec))
        return di_error_set(err, DI_ERR_INVALID, "%s: codec %d, %lld rows of %lld values", op, (int)codec,
                            (long long)n, (long long)d);
    return DI_OK;
}

static int row_encode_scatter(const di_backend *be, di_row_codec codec, const uint16_t *x, int64_t n, int64_t d,
                              uint8_t *const *dst, di_error *err) {
    int rc = check_codec("row_encode_scatter", codec, n, d, err);
    if (rc) return rc;
    for (int64_t i = 0; i < n; i++)
        if (dst[i]) di_cpu_row_encode(codec, x + i * d, d, dst[i]);
    return DI_OK;
}

static int row_decode_gather(const di_backend *be, di_row_codec codec, const uint8_t *const *src, int64_t n, int64_t d,
                             uint16_t *y, di_error *err) {
    int rc = check_codec("row_decode_gather", codec, n, d, err);
    if (rc) return rc;
    for (int64_t i = 0; i < n; i++) {
        if (src[i])
            di_cpu_row_decode(codec, src[i], d, y + i * d);
        else
            memset(y + i * d, 0, sizeof(uint16_t) * (size_t)d);
    }
    return DI_OK;
}

static int compress_pool_ring(const di_backend *be, const float *a, const float *gate, int64_t m, int64_t start_pos,
                              int ratio, int64_t d, float *state, int n_blocks, uint16_t *y, di_error *err) {
    if (ratio < 2 || d < 1 || m < 0 || start_pos < 0 || n_blocks < 1)
        return di_error_set(err, DI_ERR_INVALID,
                            "compress_pool_ring: ratio %d, width %lld, %lld tokens from %lld, %d state blocks", ratio,
                            (long long)d, (long long)m, (long long)start_pos, n_blocks);
    int64_t emitted = 0;
    for (int64_t t = 0; t < m;) {
        int64_t p = start_pos + t, g = p / ratio, end = (g + 1) * ratio - start_pos; /* group end, call-relative */
        if (end > m) end = m;
        float *kv = state + (g % n_blocks) * 2 * (int64_t)ratio * d; /* f32 [R, d], then score f32 [R, d] */
        int64_t n_out = 0;
        int rc = be->compress_pool(be, a + t * d, gate + t * d, end - t, p, ratio, d, kv, kv + (int64_t)ratio * d,
                                   y + emitted * d, &n_out, err);
        if (rc) return rc;
        emitted += n_out;
        t = end;
    }
    return DI_OK;
}

static int compress_pool_seqs(const di_backend *be, const float *a, const float *gate, int ratio, int64_t d,
                              int n_blocks, const di_pool_seq *seqs, int n_seq, const int32_t *ent_seq, int64_t n_out,
                              uint16_t *y, di_error *err) {
    int64_t total = 0;
    for (int s = 0; s < n_seq && ratio > 0; s++) total += (seqs[s].start_pos + seqs[s].m) / ratio - seqs[s].start_pos / ratio;
    if (n_seq < 1 || ratio < 2 || total != n_out)
        return di_error_set(err, DI_ERR_INVALID, "compress_pool_seqs: %d sequences, ratio %d, %lld entries (call: %lld)",
                            n_seq, ratio, (long long)total, (long long)n_out);
    for (int s = 0; s < n_seq; s++) {
        const di_pool_seq *q = &seqs[s];
        int rc = be->compress_pool_ring(be, a + q->row0 * d, gate + q->row0 * d, q->m, q->start_pos, ratio, d, q->state,
                                        n_blocks, y + q->out0 * d, err);
        if (rc) return rc;
    }
    return DI_OK;
}

static int sparse_attn_seqs(const di_backend *be, const uint16_t *q, int64_t m, int nh, int d, const di_attn_seq *seqs,
                            int n_seq, const int32_t *seq_of, const float *sink, float scale, uint16_t *out,
                            di_error *err) {
    int64_t rows = 0;
    for (int s = 0; s < n_seq; s++) rows += seqs[s].m;
    if (n_seq < 1 || rows != m || nh < 1)
        return di_error_set(err, DI_ERR_INVALID, "sparse_attn_seqs: %d sequences of %lld query rows, call of %lld",
                            n_seq, (long long)rows, (long long)m);
    for (int s = 0; s < n_seq; s++) {
        const di_attn_seq *a = &seqs[s];
        int64_t at = a->q0 * nh * d;
        int rc = be->sparse_attn(be, q + at, a->m, nh, d, a->kv_win, a->n_win, a->kv_cmp, a->n_cmp, sink, a->idx,
                                 a->n_idx, scale, out + at, err);
        if (rc) return rc;
    }
    return DI_OK;
}

void di_cpu_rows_install(di_backend *be) {
    be->row_encode_scatter = row_encode_scatter;
    be->row_decode_gather = row_decode_gather;
    be->compress_pool_ring = compress_pool_ring;
    be->sparse_attn_seqs = sparse_attn_seqs;
    be->compress_pool_seqs = compress_pool_seqs;
}
