/* Batched cache-row slots of the CUDA backend (backend.h "batched cache rows"): the rows a pass writes
 * to or reads from the caches of all its sequences in one launch, the compressor pooling of a whole
 * chunk in one launch pair, and the sparse attention of all sequences in one launch. Each kernel is the
 * one-call-per-row (per-group, per-sequence) kernel of cuda_mem.cu / cuda_mhc.cu / cuda_attn.cu with its
 * row address or key set taken from a list instead of a stride: the same arithmetic in the same order,
 * so the same bits (tests/cuda/test_cuda_rows.c checks them against the
 * CPU slots of backend/cpu/rows_batch.c at the V4.1 shapes). */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_row_codec.cuh"
#include "backend/cuda/cuda_sparse_attn.cuh"

/* One warp per group g of row r (cuda_mem.cu row_encode_kernel), the row at dst[r]; NULL: skipped. */
__global__ void row_encode_scatter_kernel(int codec, const uint16_t *x, int64_t n, int64_t d,
                                          uint8_t *const *dst) {
    int group = codec == DI_CODEC_FP4_E4M3 ? 16 : 32;
    int64_t gpr = d / group;
    int64_t gi = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (gi >= n * gpr) return;
    int64_t r = gi / gpr, g = gi % gpr;
    uint8_t *row = dst[r];
    if (!row) return; /* uniform over the warp: the whole group is skipped */
    d_row_encode_group(codec, x + r * d + g * group, d, g, group, lane, row);
}

/* One thread per value (cuda_mem.cu row_decode_kernel), the row at src[i]; NULL: a zero row. */
__global__ void row_decode_gather_kernel(int codec, const uint8_t *const *src, int64_t n, int64_t d, uint16_t *y) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n * d) return;
    int64_t i = e / d, j = e % d;
    const uint8_t *row = src[i];
    if (!row) {
        y[e] = 0;
        return;
    }
    y[e] = d_to_bf16(d_row_decode_value(codec, row, d, j));
}

static int row_encode_scatter(const di_backend *be, di_row_codec codec, const uint16_t *x, int64_t n, int64_t d,
                              uint8_t *const *dst, di_error *err) {
    int rc = codec_check("row_encode_scatter", codec, n, d, err);
    if (rc || n == 0) return rc;
    int64_t groups = n * (d / di_row_codec_group(codec));
    const int warps = 8;
    row_encode_scatter_kernel<<<di_cuda_blocks(groups, warps), warps * 32, 0, di_cuda_state(be)->stream>>>(
        (int)codec, x, n, d, dst);
    return di_cuda_launched("row_encode_scatter", err);
}

static int row_decode_gather(const di_backend *be, di_row_codec codec, const uint8_t *const *src, int64_t n, int64_t d,
                             uint16_t *y, di_error *err) {
    int rc = codec_check("row_decode_gather", codec, n, d, err);
    if (rc || n == 0) return rc;
    row_decode_gather_kernel<<<di_cuda_blocks(n * d, 256), 256, 0, di_cuda_state(be)->stream>>>((int)codec, src, n, d,
                                                                                              y);
    return di_cuda_launched("row_decode_gather", err);
}

/* ---------------- compressor pooling over a state ring ---------------- */

/* Emitted entry e (group start_pos/R + e), channel j (cuda_mhc.cu compress_stream_pool_kernel): slot s
 * comes from the group's block of the ring when its position precedes this call (the first group of a
 * chunk that starts inside it), else from the call's own row; then pool_group's arithmetic. */
__global__ void pool_ring_kernel(const float *a, const float *g, int64_t start_pos, int ratio, int64_t d,
                                 const float *state, int n_blocks, int64_t n_out, uint16_t *y) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n_out * d) return;
    int64_t ent = e / d, j = e % d;
    int64_t grp = start_pos / ratio + ent, p0 = grp * ratio; /* the group and its first position */
    const float *kv_state = state + (grp % n_blocks) * 2 * (int64_t)ratio * d, *score_state = kv_state + (int64_t)ratio * d;
#define SRC_SCORE(s) (p0 + (s) < start_pos ? score_state[(int64_t)(s) * d + j] : g[(p0 + (s) - start_pos) * d + j])
#define SRC_KV(s) (p0 + (s) < start_pos ? kv_state[(int64_t)(s) * d + j] : a[(p0 + (s) - start_pos) * d + j])
    float mx = SRC_SCORE(0);
    for (int s = 1; s < ratio; s++) mx = SRC_SCORE(s) > mx ? SRC_SCORE(s) : mx;
    float sum = 0.0f;
    for (int s = 0; s < ratio; s++) sum = __fadd_rn(sum, d_expf(__fsub_rn(SRC_SCORE(s), mx)));
    float acc = 0.0f;
    for (int s = 0; s < ratio; s++)
        acc = __fadd_rn(acc, __fmul_rn(SRC_KV(s), __fdiv_rn(d_expf(__fsub_rn(SRC_SCORE(s), mx)), sum)));
#undef SRC_SCORE
#undef SRC_KV
    y[e] = d_to_bf16(acc);
}

/* Position p lives in ring row q = p mod (R·nb) (block ⌊p/R⌋ mod nb, row p mod R), so ring row q keeps
 * the call's last token at a position ≡ q (mod R·nb), or its old contents (cuda_mhc.cu
 * compress_stream_state_kernel with period R·nb). Runs after the pooling kernel, which read the old
 * state, on the same stream. */
__global__ void pool_ring_state_kernel(const float *a, const float *g, int64_t m, int64_t start_pos, int ratio,
                                       int64_t d, float *state, int n_blocks) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t period = (int64_t)ratio * n_blocks;
    if (e >= period * d) return;
    int64_t q = e / d, j = e % d;
    int64_t off = ((q - start_pos % period) % period + period) % period; /* first call row in ring row q */
    if (off >= m) return;
    int64_t t = off + (m - 1 - off) / period * period; /* the last one */
    float *kv = state + (q / ratio) * 2 * (int64_t)ratio * d + (q % ratio) * d + j;
    kv[0] = a[t * d + j];
    kv[(int64_t)ratio * d] = g[t * d + j];
}

static int compress_pool_ring(const di_backend *be, const float *a, const float *gate, int64_t m, int64_t start_pos,
                              int ratio, int64_t d, float *state, int n_blocks, uint16_t *y, di_error *err) {
    if (ratio < 2 || ratio > 128 || d < 1 || m < 0 || start_pos < 0 || n_blocks < 1)
        return di_error_set(err, DI_ERR_INVALID,
                            "cuda compress_pool_ring: ratio %d (2..128), width %lld, %lld tokens from %lld, %d state "
                            "blocks",
                            ratio, (long long)d, (long long)m, (long long)start_pos, n_blocks);
    if (m == 0) return DI_OK;
    cudaStream_t st = di_cuda_state(be)->stream;
    int64_t emitted = (start_pos + m) / ratio - start_pos / ratio;
    if (emitted > 0) {
        pool_ring_kernel<<<di_cuda_blocks(emitted * d, 256), 256, 0, st>>>(a, gate, start_pos, ratio, d, state,
                                                                          n_blocks, emitted, y);
        int rc = di_cuda_launched("compress_pool_ring", err);
        if (rc) return rc;
    }
    pool_ring_state_kernel<<<di_cuda_blocks((int64_t)ratio * n_blocks * d, 256), 256, 0, st>>>(
        a, gate, m, start_pos, ratio, d, state, n_blocks);
    return di_cuda_launched("compress_pool_ring", err);
}

/* The chunks of several sequences: pool_ring_kernel over every output entry, with the entry's sequence
 * (ent_seq) giving its chunk's start, rows and ring. */
__global__ void pool_seqs_kernel(const float *a, const float *g, int ratio, int64_t d, int n_blocks,
                                 const di_pool_seq *seqs, const int32_t *ent_seq, int64_t n_out, uint16_t *y) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n_out * d) return;
    const di_pool_seq sq = seqs[ent_seq[e / d]];
    int64_t ent = e / d - sq.out0, j = e % d, start_pos = sq.start_pos;
    const float *as = a + sq.row0 * d, *gs = g + sq.row0 * d;
    int64_t grp = start_pos / ratio + ent, p0 = grp * ratio;
    const float *kv_state = sq.state + (grp % n_blocks) * 2 * (int64_t)ratio * d,
                *score_state = kv_state + (int64_t)ratio * d;
#define SRC_SCORE(s) (p0 + (s) < start_pos ? score_state[(int64_t)(s) * d + j] : gs[(p0 + (s) - start_pos) * d + j])
#define SRC_KV(s) (p0 + (s) < start_pos ? kv_state[(int64_t)(s) * d + j] : as[(p0 + (s) - start_pos) * d + j])
    float mx = SRC_SCORE(0);
    for (int s = 1; s < ratio; s++) mx = SRC_SCORE(s) > mx ? SRC_SCORE(s) : mx;
    float sum = 0.0f;
    for (int s = 0; s < ratio; s++) sum = __fadd_rn(sum, d_expf(__fsub_rn(SRC_SCORE(s), mx)));
    float acc = 0.0f;
    for (int s = 0; s < ratio; s++)
        acc = __fadd_rn(acc, __fmul_rn(SRC_KV(s), __fdiv_rn(d_expf(__fsub_rn(SRC_SCORE(s), mx)), sum)));
#undef SRC_SCORE
#undef SRC_KV
    y[e] = d_to_bf16(acc);
}

/* pool_ring_state_kernel for sequence e / (R·nb·d) of the call, on its own ring. */
__global__ void pool_seqs_state_kernel(const float *a, const float *g, int ratio, int64_t d, int n_blocks,
                                       const di_pool_seq *seqs, int n_seq) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t period = (int64_t)ratio * n_blocks;
    if (e >= n_seq * period * d) return;
    const di_pool_seq sq = seqs[e / (period * d)];
    int64_t q = e % (period * d) / d, j = e % d, m = sq.m;
    int64_t off = ((q - sq.start_pos % period) % period + period) % period; /* first chunk row in ring row q */
    if (off >= m) return;
    int64_t t = sq.row0 + off + (m - 1 - off) / period * period; /* the last one, as a call row */
    float *kv = sq.state + (q / ratio) * 2 * (int64_t)ratio * d + (q % ratio) * d + j;
    kv[0] = a[t * d + j];
    kv[(int64_t)ratio * d] = g[t * d + j];
}

static int compress_pool_seqs(const di_backend *be, const float *a, const float *gate, int ratio, int64_t d,
                              int n_blocks, const di_pool_seq *seqs, int n_seq, const int32_t *ent_seq, int64_t n_out,
                              uint16_t *y, di_error *err) {
    if (ratio < 2 || ratio > 128 || d < 1 || n_blocks < 1 || n_seq < 1 || n_out < 0)
        return di_error_set(err, DI_ERR_INVALID,
                            "cuda compress_pool_seqs: ratio %d (2..128), width %lld, %d state blocks, %d sequences, %lld "
                            "entries",
                            ratio, (long long)d, n_blocks, n_seq, (long long)n_out);
    cudaStream_t st = di_cuda_state(be)->stream;
    if (n_out > 0) {
        pool_seqs_kernel<<<di_cuda_blocks(n_out * d, 256), 256, 0, st>>>(a, gate, ratio, d, n_blocks, seqs, ent_seq,
                                                                         n_out, y);
        int rc = di_cuda_launched("compress_pool_seqs", err);
        if (rc) return rc;
    }
    pool_seqs_state_kernel<<<di_cuda_blocks((int64_t)n_seq * ratio * n_blocks * d, 256), 256, 0, st>>>(
        a, gate, ratio, d, n_blocks, seqs, n_seq);
    return di_cuda_launched("compress_pool_seqs", err);
}

/* ---------------- sparse attention of several sequences ---------------- */

/* cuda_attn.cu sparse_attn_kernel, one thread block per (query, head) of the whole call, with the
 * query's sequence's key set and index row taken from its descriptor: every operation after that is
 * the same, so each query's output is the one sparse_attn gives it on its sequence alone. */
__global__ void __launch_bounds__(SA_THREADS) sparse_attn_seqs_kernel(const uint16_t *q, int nh, int d,
                                                                      const di_attn_seq *seqs, const int32_t *seq_of,
                                                                      const float *sink, float scale, uint16_t *out) {
    const int64_t qi = blockIdx.x / nh;
    const int h = blockIdx.x % nh;
    /* the only change to sparse_attn_kernel: the key set and index row of the query's sequence */
    const di_attn_seq sq = seqs[seq_of[qi]];
    d_sparse_attn_query(q, qi * nh + h, h, d, sq.kv_win, sq.n_win, sq.kv_cmp, sq.n_cmp, sink,
                        sq.idx + (qi - sq.q0) * sq.n_idx, sq.n_idx, scale, out);
}

/* sparse_attn_seqs_kernel with H heads of one query per block (cuda_attn.cu sparse_attn_heads_kernel). */
template <int H>
__global__ void __launch_bounds__(SAH_T(H), 2)
    sparse_attn_seqs_heads_kernel(const uint16_t *q, int nh, const di_attn_seq *seqs, const int32_t *seq_of,
                                  const float *sink, float scale, uint16_t *out) {
    const int groups = nh / H;
    const int64_t qi = blockIdx.x / groups;
    const int h0 = (int)(blockIdx.x % groups) * H;
    const di_attn_seq sq = seqs[seq_of[qi]];
    d_sparse_attn_heads<H>(q, qi, nh, h0, sq.kv_win, sq.n_win, sq.kv_cmp, sq.n_cmp, sink,
                           sq.idx + (qi - sq.q0) * sq.n_idx, sq.n_idx, scale, out, NULL);
}

/* sparse_attn_seqs_kernel on d_sparse_attn_staged (few queries: sas_wanted). */
__global__ void __launch_bounds__(SA_THREADS, 1)
    sparse_attn_seqs_staged_kernel(const uint16_t *q, int nh, const di_attn_seq *seqs, const int32_t *seq_of,
                                   const float *sink, float scale, uint16_t *out, int parts) {
    const int64_t qh = blockIdx.x / parts, qi = qh / nh;
    const int h = (int)(qh % nh);
    const di_attn_seq sq = seqs[seq_of[qi]];
    d_sparse_attn_staged(q, qh, h, sq.kv_win, sq.n_win, sq.kv_cmp, sq.n_cmp, sink, sq.idx + (qi - sq.q0) * sq.n_idx,
                         sq.n_idx, scale, out, (int)(blockIdx.x % parts), parts);
}

template <int H>
static int sparse_attn_seqs_heads(const di_backend *be, const uint16_t *q, int64_t m, int nh, const di_attn_seq *seqs,
                                  const int32_t *seq_of, const float *sink, float scale, uint16_t *out, di_error *err) {
    static bool optin[64];
    int rc = sah_smem_optin(sparse_attn_seqs_heads_kernel<H>, SAH_SMEM(H), optin, di_cuda_state(be)->device,
                            "sparse_attn_seqs", err);
    if (rc) return rc;
    const unsigned blocks = (unsigned)(m * (nh / H));
    sparse_attn_seqs_heads_kernel<H><<<blocks, SAH_T(H), SAH_SMEM(H), di_cuda_state(be)->stream>>>(q, nh, seqs, seq_of,
                                                                                                   sink, scale, out);
    return di_cuda_launched("sparse_attn_seqs", err);
}

static int sparse_attn_seqs(const di_backend *be, const uint16_t *q, int64_t m, int nh, int d, const di_attn_seq *seqs,
                            int n_seq, const int32_t *seq_of, const float *sink, float scale, uint16_t *out,
                            di_error *err) {
    if (m < 0 || nh < 1 || d < 1 || d > SA_MAX_DIM || n_seq < 1)
        return di_error_set(err, DI_ERR_INVALID, "cuda sparse_attn_seqs: n_q %lld, n_heads %d, dim %d (max %d), %d sequences",
                            (long long)m, nh, d, SA_MAX_DIM, n_seq);
    if (m == 0) return DI_OK;
    if (sas_wanted(m, nh, d)) {
        static bool optin[64];
        int rc = sah_smem_optin(sparse_attn_seqs_staged_kernel, SAS_SMEM, optin, di_cuda_state(be)->device,
                                "sparse_attn_seqs", err);
        if (rc) return rc;
        const int parts = di_cuda_sattn_staged_parts(m, nh, -1); /* the lists' lengths are on the device */
        sparse_attn_seqs_staged_kernel<<<(unsigned)(m * nh * parts), SA_THREADS, SAS_SMEM, di_cuda_state(be)->stream>>>(
            q, nh, seqs, seq_of, sink, scale, out, parts);
        return di_cuda_launched("sparse_attn_seqs", err);
    }
    switch (sah_heads(m, nh, d)) {
    case 16: return sparse_attn_seqs_heads<16>(be, q, m, nh, seqs, seq_of, sink, scale, out, err);
    case 4: return sparse_attn_seqs_heads<4>(be, q, m, nh, seqs, seq_of, sink, scale, out, err);
    default: break;
    }
    sparse_attn_seqs_kernel<<<(unsigned)(m * nh), SA_THREADS, 0, di_cuda_state(be)->stream>>>(q, nh, d, seqs, seq_of,
                                                                                            sink, scale, out);
    return di_cuda_launched("sparse_attn_seqs", err);
}

extern "C" void di_cuda_rows_install(di_backend *be) {
    be->row_encode_scatter = row_encode_scatter;
    be->row_decode_gather = row_decode_gather;
    be->compress_pool_ring = compress_pool_ring;
    be->compress_pool_seqs = compress_pool_seqs;
    /* the batched attention is the exact kernel's variant: offered only where that kernel is the
     * backend's sparse_attn (not under DI_CUDA_KERNELS=tensor), so it changes no bit of either mode */
    be->sparse_attn_seqs = be->sparse_attn == di_cuda_sparse_attn ? sparse_attn_seqs : NULL;
}
