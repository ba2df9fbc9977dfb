/* Batched cache-row slots of the CUDA backend (backend.h "batched cache rows"): the rows a pass writes
 * to or reads from the caches of all its sequences in one launch, the compressor pooling of a whole
 * chunk in one launch pair, and the sparse attention of all sequences in one launch. Each kernel is the
 * one-call-per-row (per-group, per-sequence) kernel of cuda_mem.cu / cuda_mhc.cu / cuda_attn.cu with its
 * row address or key set taken from a list instead of a stride: the same arithmetic in the same order,
 * so the same bits (tests/cuda/test_cuda_rows.c checks them against the
 * CPU slots of backend/cpu/rows_batch.c at the V4.1 shapes). */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

#define FP8_MAX_INV_ ((float)(1.0 / 448.0))
#define FP4_MAX_INV_ ((float)(1.0 / 6.0))
#define AMAX_FLOOR_FP8 0x38d1b717u  /* f32(1e-4) */
#define AMAX_FLOOR_E8M0 0x01c00000u /* 6·2^-126 */
#define AMAX_FLOOR_E4M3 0x3c400000u /* 6·2^-9 */

/* x / s with x86's NaN rule (cuda_quant.cu: only the sign of a NaN survives into an E2M1 code). */
static __device__ __forceinline__ float div_nan_x86_(float x, float s) {
    if (isnan(x)) return __uint_as_float(__float_as_uint(x) | 0x00400000u);
    if (isnan(s)) return __uint_as_float(__float_as_uint(s) | 0x00400000u);
    return __fdiv_rn(x, s);
}

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
    const uint16_t *xg = x + r * d + g * group;
    uint32_t m = 0;
    for (int i = lane; i < group; i += 32) m = max(m, (uint32_t)(xg[i] & 0x7fffu));
    m = __reduce_max_sync(0xffffffffu, m) << 16;
    if (codec == DI_CODEC_FP4_E4M3) {
        float amax = __uint_as_float(max(m, (uint32_t)AMAX_FLOOR_E4M3));
        uint8_t sc = d_e4m3_encode(__fdiv_rn(amax, 6.0f));
        float s = d_e4m3_decode(sc);
        if (lane == 0) row[d / 2 + g] = sc;
        for (int i = 2 * lane; i < group; i += 64) {
            uint8_t lo = d_e2m1_encode(div_nan_x86_(d_bf16(xg[i]), s));
            uint8_t hi = d_e2m1_encode(div_nan_x86_(d_bf16(xg[i + 1]), s));
            row[(g * group + i) / 2] = (uint8_t)((lo & 15) | (hi << 4));
        }
        return;
    }
    bool fp8 = codec == DI_CODEC_FP8_E8M0;
    float amax = __uint_as_float(max(m, fp8 ? (uint32_t)AMAX_FLOOR_FP8 : (uint32_t)AMAX_FLOOR_E8M0));
    uint32_t u = __float_as_uint(__fmul_rn(amax, fp8 ? FP8_MAX_INV_ : FP4_MAX_INV_));
    uint32_t e = ((u >> 23) & 0xffu) + ((u & 0x7fffffu) != 0);
    bool nan_group = e >= 255;
    float inv_s = __uint_as_float((254u - e) << 23);
    if (fp8) {
        if (lane == 0) row[d + g] = nan_group ? 0xff : (uint8_t)e;
        for (int i = lane; i < group; i += 32)
            row[g * group + i] = nan_group ? 0x7f : d_e4m3_encode(__fmul_rn(d_bf16(xg[i]), inv_s));
    } else {
        if (lane == 0) row[d / 2 + g] = nan_group ? 0xff : (uint8_t)e;
        for (int i = 2 * lane; i < group; i += 64) {
            uint8_t lo = d_e2m1_encode(__fmul_rn(d_bf16(xg[i]), inv_s));
            uint8_t hi = d_e2m1_encode(__fmul_rn(d_bf16(xg[i + 1]), inv_s));
            row[(g * group + i) / 2] = nan_group ? 0 : (uint8_t)((lo & 15) | (hi << 4));
        }
    }
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
    float v;
    if (codec == DI_CODEC_FP8_E8M0) {
        v = __fmul_rn(d_e4m3_decode(row[j]), d_e8m0(row[d + j / 32]));
    } else {
        uint8_t b = row[j / 2];
        uint32_t code = (j & 1) ? (b >> 4) : (b & 15);
        int group = codec == DI_CODEC_FP4_E4M3 ? 16 : 32;
        uint8_t sc = row[d / 2 + j / group];
        float s = codec == DI_CODEC_FP4_E4M3 ? d_e4m3_decode(sc) : d_e8m0(sc);
        v = __fmul_rn(d_e2m1_decode(code), s);
    }
    y[e] = d_to_bf16(v);
}

static int codec_check(const char *op, di_row_codec codec, int64_t n, int64_t d, di_error *err) {
    if (codec < DI_CODEC_FP8_E8M0 || codec > DI_CODEC_FP4_E8M0 || n < 0 || d <= 0 || d % di_row_codec_group(codec))
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: codec %d, %lld rows of %lld values", op, (int)codec,
                            (long long)n, (long long)d);
    return DI_OK;
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

#define SA_BLOCK 64   /* cuda_attn.cu's constants */
#define SA_MAX_DIM 1024
#define SA_THREADS 512

/* cuda_attn.cu sparse_attn_kernel, one thread block per (query, head) of the whole call, with the
 * query's sequence's key set and index row taken from its descriptor: every operation after that is
 * the same, so each query's output is the one sparse_attn gives it on its sequence alone. */
__global__ void __launch_bounds__(SA_THREADS) sparse_attn_seqs_kernel(const uint16_t *q, int nh, int d,
                                                                      const di_attn_seq *seqs, const int32_t *seq_of,
                                                                      const float *sink, float scale, uint16_t *out) {
    __shared__ float qs[SA_MAX_DIM];         /* f32 [d] */
    __shared__ float sc[SA_BLOCK];           /* scaled scores, then f32 probabilities */
    __shared__ float pb[SA_BLOCK];           /* bf16-rounded probabilities */
    __shared__ const uint16_t *rows[SA_BLOCK]; /* [64] KV row of each slot, NULL = skipped */
    __shared__ float st[2];                  /* running max m, this step's alpha */
    __shared__ float lsum;                   /* running f32 probability sum (thread 0 writes) */
    const int64_t qi = blockIdx.x / nh;
    const int h = blockIdx.x % nh, t = threadIdx.x;
    /* the only change to sparse_attn_kernel: the key set and index row of the query's sequence */
    const di_attn_seq sq = seqs[seq_of[qi]];
    const uint16_t *kv_win = sq.kv_win, *kv_cmp = sq.kv_cmp;
    const int64_t n_win = sq.n_win, n_cmp = sq.n_cmp, n_idx = sq.n_idx;
    const uint16_t *qv = q + (qi * nh + h) * (int64_t)d;
    const int32_t *ix = sq.idx + (qi - sq.q0) * n_idx;
    for (int j = t; j < d; j += SA_THREADS) qs[j] = d_bf16(qv[j]);
    float o0 = 0.0f, o1 = 0.0f; /* running Σ p·c of channels t and t + 512 */
    if (t == 0) st[0] = -1e30f, lsum = 0.0f;
    __syncthreads();
    for (int64_t b0 = 0; b0 < n_idx; b0 += SA_BLOCK) {
        const int nb = (int)(n_idx - b0 < SA_BLOCK ? n_idx - b0 : SA_BLOCK);
        { /* scores: slot t/8, lane t%8 */
            const int slot = t >> 3, l = t & 7;
            const uint16_t *row = NULL;
            if (slot < nb) {
                int32_t id = ix[b0 + slot];
                if (id >= 0 && id < n_win) row = kv_win + (int64_t)id * d;
                else if (id >= n_win && id < n_win + n_cmp) row = kv_cmp + (int64_t)(id - n_win) * d;
            }
            float acc = 0.0f;
            if (row)
                for (int j = l; j < d; j += 8) acc = __fadd_rn(acc, __fmul_rn(qs[j], d_bf16(row[j])));
            acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 1));
            acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 2));
            acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 4));
            if (l == 0 && slot < SA_BLOCK) {
                rows[slot] = row;
                sc[slot] = row ? __fmul_rn(acc, scale) : -INFINITY;
            }
        }
        __syncthreads();
        if (t == 0) { /* block max in slot order, then the new running max and alpha */
            float bmax = -INFINITY;
            for (int k = 0; k < nb; k++) bmax = sc[k] > bmax ? sc[k] : bmax;
            float m = st[0], m_new = bmax > m ? bmax : m;
            st[1] = d_expf(__fsub_rn(m, m_new));
            st[0] = m_new;
        }
        __syncthreads();
        const float m_new = st[0], alpha = st[1];
        if (t < nb) {
            float p = d_expf(__fsub_rn(sc[t], m_new)); /* −inf → 0 */
            sc[t] = p;
            pb[t] = d_round_bf16(p);
        }
        __syncthreads();
        if (t == 0) { /* l = l·alpha + sum_f32(p): 8 strided lanes combined pairwise */
            float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int k = 0; k < nb; k++) {
                switch (k & 7) {
                case 0: lane[0] = __fadd_rn(lane[0], sc[k]); break;
                case 1: lane[1] = __fadd_rn(lane[1], sc[k]); break;
                case 2: lane[2] = __fadd_rn(lane[2], sc[k]); break;
                case 3: lane[3] = __fadd_rn(lane[3], sc[k]); break;
                case 4: lane[4] = __fadd_rn(lane[4], sc[k]); break;
                case 5: lane[5] = __fadd_rn(lane[5], sc[k]); break;
                case 6: lane[6] = __fadd_rn(lane[6], sc[k]); break;
                default: lane[7] = __fadd_rn(lane[7], sc[k]); break;
                }
            }
            float s = __fadd_rn(__fadd_rn(__fadd_rn(lane[0], lane[1]), __fadd_rn(lane[2], lane[3])),
                                __fadd_rn(__fadd_rn(lane[4], lane[5]), __fadd_rn(lane[6], lane[7])));
            lsum = __fadd_rn(__fmul_rn(lsum, alpha), s);
        }
        /* PV for channels t and t + 512 */
        float pv0 = 0.0f, pv1 = 0.0f;
        for (int k = 0; k < nb; k++) {
            const uint16_t *row = rows[k];
            if (!row) continue;
            float p = pb[k];
            if (t < d) pv0 = __fadd_rn(pv0, __fmul_rn(p, d_bf16(row[t])));
            if (t + SA_THREADS < d) pv1 = __fadd_rn(pv1, __fmul_rn(p, d_bf16(row[t + SA_THREADS])));
        }
        o0 = __fadd_rn(__fmul_rn(o0, alpha), pv0);
        o1 = __fadd_rn(__fmul_rn(o1, alpha), pv1);
        __syncthreads(); /* sc, pb, rows and st are rewritten by the next step */
    }
    const float l = __fadd_rn(lsum, d_expf(__fsub_rn(sink[h], st[0])));
    uint16_t *ov = out + (qi * nh + h) * (int64_t)d;
    if (t < d) ov[t] = d_to_bf16(__fdiv_rn(o0, l));
    if (t + SA_THREADS < d) ov[t + SA_THREADS] = d_to_bf16(__fdiv_rn(o1, l));
}

static int sparse_attn_seqs(const di_backend *be, const uint16_t *q, int64_t m, int nh, int d, const di_attn_seq *seqs,
                            int n_seq, const int32_t *seq_of, const float *sink, float scale, uint16_t *out,
                            di_error *err) {
    if (m < 0 || nh < 1 || d < 1 || d > SA_MAX_DIM || n_seq < 1)
        return di_error_set(err, DI_ERR_INVALID, "cuda sparse_attn_seqs: n_q %lld, n_heads %d, dim %d (max %d), %d sequences",
                            (long long)m, nh, d, SA_MAX_DIM, n_seq);
    if (m == 0) return DI_OK;
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
