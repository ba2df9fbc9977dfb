/* Activation quantizers on the GPU (spec model.md §4.1, §5.2): FP8 e4m3 with power-of-two E8M0 scales
 * (act_quant), FP4 E2M1 with E8M0 scales (index q/k) and with E4M3 scales (compressed KV), each as
 * codes + scales or as in-place QDQ. Bit-identical to io/formats.c (the same bit-level encoders in
 * cuda_common.cuh, the same amax / scale arithmetic, the same inf/NaN group rule).
 *
 * One warp per group: lanes stride over the group's values (any group size; V4.1 uses 32 and 16), the
 * group amax is an integer max of |bf16| bit patterns (NaN sorts above inf, as in formats.c), then each
 * lane encodes its values. act_quant_fp8 with 32-groups on aligned buffers (the linear slots' input) has
 * a vectorised kernel: one thread per group. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_quant.cuh"

enum quant_mode { Q_FP8, QDQ_FP8, Q_FP4_E8M0, QDQ_FP4_E8M0, Q_FP4_E4M3, QDQ_FP4_E4M3 };

#define FP4_MAX_INV ((float)(1.0 / 6.0))
#define FP4_E8M0_AMAX_FLOOR 0x01c00000u /* 6·2^-126 */
#define FP4_E4M3_AMAX_FLOOR 0x3c400000u /* 6·2^-9 */
#define BF16_NAN 0x7fc0u

/* x / s with x86's NaN rule: a NaN result carries the first NaN operand (quieted), where the GPU would
 * return its canonical +NaN. Only the sign survives into an E2M1 code (NaN encodes as ±0), and in a NaN
 * group s is itself NaN (+), so a negative-NaN input is the one case this changes. */
static __device__ __forceinline__ float div_nan_x86(float x, float s) {
    if (isnan(x)) return __uint_as_float(__float_as_uint(x) | 0x00400000u);
    if (isnan(s)) return __uint_as_float(__float_as_uint(s) | 0x00400000u);
    return __fdiv_rn(x, s);
}

/* x bf16 [n_groups·group]; q: e4m3 codes [n] (Q_FP8) or packed E2M1 [n/2] (Q_FP4_*); scale [n_groups];
 * out bf16 [n] (QDQ_*; may alias x: each lane reads its values before writing them, and the amax is
 * complete before any write). */
__global__ void quant_kernel(int mode, const uint16_t *x, int64_t n_groups, int group, uint8_t *q, uint8_t *scale,
                             uint16_t *out) {
    int64_t g = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (g >= n_groups) return;
    const uint16_t *xg = x + g * group;
    uint32_t m = 0;
    for (int i = lane; i < group; i += 32) m = max(m, (uint32_t)(xg[i] & 0x7fffu));
    m = __reduce_max_sync(0xffffffffu, m) << 16;
    const bool fp8 = mode == Q_FP8 || mode == QDQ_FP8, e4m3 = mode == Q_FP4_E4M3 || mode == QDQ_FP4_E4M3;
    uint32_t floor_bits = fp8 ? ACT_FP8_AMAX_FLOOR : e4m3 ? FP4_E4M3_AMAX_FLOOR : FP4_E8M0_AMAX_FLOOR;
    float amax = __uint_as_float(max(m, floor_bits));

    if (e4m3) { /* scale = e4m3(amax / 6): two roundings, as the reference */
        uint8_t sc = d_e4m3_encode(__fdiv_rn(amax, 6.0f));
        float s = d_e4m3_decode(sc);
        if (mode == Q_FP4_E4M3) {
            if (lane == 0) scale[g] = sc;
            for (int i = 2 * lane; i < group; i += 64) {
                uint8_t lo = d_e2m1_encode(div_nan_x86(d_bf16(xg[i]), s));
                uint8_t hi = d_e2m1_encode(div_nan_x86(d_bf16(xg[i + 1]), s));
                q[(g * group + i) / 2] = (uint8_t)((lo & 15) | (hi << 4));
            }
        } else {
            uint16_t *og = out + g * group;
            for (int i = lane; i < group; i += 32) og[i] = d_to_bf16(__fmul_rn(d_e2m1_round(__fdiv_rn(d_bf16(xg[i]), s)), s));
        }
        return;
    }

    /* power-of-two scale: 2^ceil(log2(amax·MAX⁻¹)) read off the f32 product's bits */
    uint32_t u = __float_as_uint(__fmul_rn(amax, fp8 ? FP8_MAX_INV : FP4_MAX_INV));
    uint32_t e = ((u >> 23) & 0xffu) + ((u & 0x7fffffu) != 0);
    const bool nan_group = e >= 255; /* inf/NaN in the group: no finite scale */
    float s = __uint_as_float(e << 23), inv_s = __uint_as_float((254u - e) << 23);
    switch (mode) {
    case Q_FP8:
        if (lane == 0) scale[g] = nan_group ? 0xff : (uint8_t)e;
        for (int i = lane; i < group; i += 32) q[g * group + i] = nan_group ? 0x7f : d_e4m3_encode(__fmul_rn(d_bf16(xg[i]), inv_s));
        break;
    case QDQ_FP8:
        for (int i = lane; i < group; i += 32)
            out[g * group + i] = nan_group ? BF16_NAN : d_to_bf16(__fmul_rn(d_e4m3_round(__fmul_rn(d_bf16(xg[i]), inv_s)), s));
        break;
    case Q_FP4_E8M0:
        if (lane == 0) scale[g] = nan_group ? 0xff : (uint8_t)e;
        for (int i = 2 * lane; i < group; i += 64) {
            uint8_t lo = d_e2m1_encode(__fmul_rn(d_bf16(xg[i]), inv_s));
            uint8_t hi = d_e2m1_encode(__fmul_rn(d_bf16(xg[i + 1]), inv_s));
            q[(g * group + i) / 2] = nan_group ? 0 : (uint8_t)((lo & 15) | (hi << 4));
        }
        break;
    case QDQ_FP4_E8M0:
        for (int i = lane; i < group; i += 32)
            out[g * group + i] = nan_group ? BF16_NAN : d_to_bf16(__fmul_rn(d_e2m1_round(__fmul_rn(d_bf16(xg[i]), inv_s)), s));
        break;
    }
}

/* act_quant_fp8 with 32-value groups (every linear slot's input): one thread per group, the 64 bytes of
 * bf16 in four 16-byte loads and the 32 codes out in two 16-byte stores; the per-group arithmetic is
 * d_act_quant32 (cuda_quant.cuh), which the fused decode GEMV (cuda_gemv_fp8.cu) shares. x, q 16-byte aligned. */
__global__ void __launch_bounds__(256) act_quant32_kernel(const uint4 *x, int64_t n_groups, uint4 *q, uint8_t *scale) {
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n_groups) return;
    uint4 v[4]; /* bf16 [32] */
#pragma unroll
    for (int i = 0; i < 4; i++) v[i] = __ldg(x + 4 * g + i);
    uint32_t c[8]; /* e4m3 [32] */
    scale[g] = d_act_quant32((const uint32_t *)v, c);
    q[2 * g] = make_uint4(c[0], c[1], c[2], c[3]);
    q[2 * g + 1] = make_uint4(c[4], c[5], c[6], c[7]);
}

static int launch_quant(int mode, const char *op, const uint16_t *x, int64_t n, int group, uint8_t *q, uint8_t *scale,
                        uint16_t *out, void *stream, di_error *err) {
    bool fp4 = mode >= Q_FP4_E8M0;
    if (group <= 0 || n < 0 || n % group || (fp4 && group % 2))
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: %lld values in groups of %d (need a multiple%s)", op,
                            (long long)n, group, fp4 ? ", group even" : "");
    int64_t ng = n / group;
    if (ng == 0) return DI_OK;
    const int warps = 8;
    quant_kernel<<<di_cuda_blocks(ng, warps), warps * 32, 0, (cudaStream_t)stream>>>(mode, x, ng, group, q, scale, out);
    return di_cuda_launched(op, err);
}

extern "C" int di_cuda_act_quant_fp8(const uint16_t *x, int64_t n, int group, uint8_t *q, uint8_t *scale, void *stream,
                                     di_error *err) {
    if (group == 32 && n > 0 && n % 32 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)q % 16 == 0) {
        const int64_t ng = n / 32;
        act_quant32_kernel<<<di_cuda_blocks(ng, 256), 256, 0, (cudaStream_t)stream>>>((const uint4 *)x, ng, (uint4 *)q, scale);
        return di_cuda_launched("act_quant_fp8", err);
    }
    return launch_quant(Q_FP8, "act_quant_fp8", x, n, group, q, scale, NULL, stream, err);
}
extern "C" int di_cuda_act_qdq_fp8(const uint16_t *x, int64_t n, int group, uint16_t *out, void *stream, di_error *err) {
    return launch_quant(QDQ_FP8, "act_qdq_fp8", x, n, group, NULL, NULL, out, stream, err);
}
extern "C" int di_cuda_fp4_quant_e8m0(const uint16_t *x, int64_t n, int group, uint8_t *packed, uint8_t *scale,
                                      void *stream, di_error *err) {
    return launch_quant(Q_FP4_E8M0, "fp4_quant_e8m0", x, n, group, packed, scale, NULL, stream, err);
}
extern "C" int di_cuda_fp4_qdq_e8m0(const uint16_t *x, int64_t n, int group, uint16_t *out, void *stream, di_error *err) {
    return launch_quant(QDQ_FP4_E8M0, "fp4_qdq_e8m0", x, n, group, NULL, NULL, out, stream, err);
}
extern "C" int di_cuda_fp4_quant_e4m3(const uint16_t *x, int64_t n, int group, uint8_t *packed, uint8_t *scale,
                                      void *stream, di_error *err) {
    return launch_quant(Q_FP4_E4M3, "fp4_quant_e4m3", x, n, group, packed, scale, NULL, stream, err);
}
extern "C" int di_cuda_fp4_qdq_e4m3(const uint16_t *x, int64_t n, int group, uint16_t *out, void *stream, di_error *err) {
    return launch_quant(QDQ_FP4_E4M3, "fp4_qdq_e4m3", x, n, group, NULL, NULL, out, stream, err);
}

/* ---- backend slots: QDQ of m rows of n values in place ---- */
static int qdq_rows(int mode, const char *op, const di_backend *be, uint16_t *x, int64_t m, int64_t n, int group,
                    di_error *err) {
    if (group <= 0 || n % group)
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: row of %lld not a multiple of group %d", op, (long long)n, group);
    return launch_quant(mode, op, x, m * n, group, NULL, NULL, x, di_cuda_state(be)->stream, err);
}

extern "C" int di_cuda_qdq_fp8(const di_backend *be, uint16_t *x, int64_t m, int64_t n, int group, di_error *err) {
    return qdq_rows(QDQ_FP8, "qdq_fp8", be, x, m, n, group, err);
}
extern "C" int di_cuda_qdq_fp4_e8m0(const di_backend *be, uint16_t *x, int64_t m, int64_t n, int group, di_error *err) {
    return qdq_rows(QDQ_FP4_E8M0, "qdq_fp4_e8m0", be, x, m, n, group, err);
}
extern "C" int di_cuda_qdq_fp4_e4m3(const di_backend *be, uint16_t *x, int64_t m, int64_t n, int group, di_error *err) {
    return qdq_rows(QDQ_FP4_E4M3, "qdq_fp4_e4m3", be, x, m, n, group, err);
}
