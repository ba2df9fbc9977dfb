/* Numeric formats: exact decoders, round-to-nearest-even encoders and the reference activation
 * quantizers (spec model.md §2.2, §4.1, §5.2). The quantizers reproduce the official V4.1 kernels
 * (act_quant / fp4_act_quant) bit for bit; tests/test_formats.c checks them against vectors dumped
 * from the reference (tests/data/kernels.safetensors). */
#include "io/formats.h"

#include <math.h>

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- float8_e4m3fn ----
 * Code = s eeee mmm, bias 7. e = 0: subnormal m·2^−9; e > 0: (1 + m/8)·2^(e−7); s 1111 111 = NaN.
 * Table rather than bit assembly: one load per weight in the dequantization loops. */
static const float e4m3_table[256] = {
    0.f, 0.001953125f, 0.00390625f, 0.005859375f, 0.0078125f, 0.009765625f, 0.01171875f, 0.013671875f,
    0.015625f, 0.017578125f, 0.01953125f, 0.021484375f, 0.0234375f, 0.025390625f, 0.02734375f, 0.029296875f,
    0.03125f, 0.03515625f, 0.0390625f, 0.04296875f, 0.046875f, 0.05078125f, 0.0546875f, 0.05859375f,
    0.0625f, 0.0703125f, 0.078125f, 0.0859375f, 0.09375f, 0.1015625f, 0.109375f, 0.1171875f,
    0.125f, 0.140625f, 0.15625f, 0.171875f, 0.1875f, 0.203125f, 0.21875f, 0.234375f,
    0.25f, 0.28125f, 0.3125f, 0.34375f, 0.375f, 0.40625f, 0.4375f, 0.46875f,
    0.5f, 0.5625f, 0.625f, 0.6875f, 0.75f, 0.8125f, 0.875f, 0.9375f,
    1.f, 1.125f, 1.25f, 1.375f, 1.5f, 1.625f, 1.75f, 1.875f,
    2.f, 2.25f, 2.5f, 2.75f, 3.f, 3.25f, 3.5f, 3.75f,
    4.f, 4.5f, 5.f, 5.5f, 6.f, 6.5f, 7.f, 7.5f,
    8.f, 9.f, 10.f, 11.f, 12.f, 13.f, 14.f, 15.f,
    16.f, 18.f, 20.f, 22.f, 24.f, 26.f, 28.f, 30.f,
    32.f, 36.f, 40.f, 44.f, 48.f, 52.f, 56.f, 60.f,
    64.f, 72.f, 80.f, 88.f, 96.f, 104.f, 112.f, 120.f,
    128.f, 144.f, 160.f, 176.f, 192.f, 208.f, 224.f, 240.f,
    256.f, 288.f, 320.f, 352.f, 384.f, 416.f, 448.f, NAN,
    -0.f, -0.001953125f, -0.00390625f, -0.005859375f, -0.0078125f, -0.009765625f, -0.01171875f, -0.013671875f,
    -0.015625f, -0.017578125f, -0.01953125f, -0.021484375f, -0.0234375f, -0.025390625f, -0.02734375f, -0.029296875f,
    -0.03125f, -0.03515625f, -0.0390625f, -0.04296875f, -0.046875f, -0.05078125f, -0.0546875f, -0.05859375f,
    -0.0625f, -0.0703125f, -0.078125f, -0.0859375f, -0.09375f, -0.1015625f, -0.109375f, -0.1171875f,
    -0.125f, -0.140625f, -0.15625f, -0.171875f, -0.1875f, -0.203125f, -0.21875f, -0.234375f,
    -0.25f, -0.28125f, -0.3125f, -0.34375f, -0.375f, -0.40625f, -0.4375f, -0.46875f,
    -0.5f, -0.5625f, -0.625f, -0.6875f, -0.75f, -0.8125f, -0.875f, -0.9375f,
    -1.f, -1.125f, -1.25f, -1.375f, -1.5f, -1.625f, -1.75f, -1.875f,
    -2.f, -2.25f, -2.5f, -2.75f, -3.f, -3.25f, -3.5f, -3.75f,
    -4.f, -4.5f, -5.f, -5.5f, -6.f, -6.5f, -7.f, -7.5f,
    -8.f, -9.f, -10.f, -11.f, -12.f, -13.f, -14.f, -15.f,
    -16.f, -18.f, -20.f, -22.f, -24.f, -26.f, -28.f, -30.f,
    -32.f, -36.f, -40.f, -44.f, -48.f, -52.f, -56.f, -60.f,
    -64.f, -72.f, -80.f, -88.f, -96.f, -104.f, -112.f, -120.f,
    -128.f, -144.f, -160.f, -176.f, -192.f, -208.f, -224.f, -240.f,
    -256.f, -288.f, -320.f, -352.f, -384.f, -416.f, -448.f, -NAN,
};

float di_e4m3_to_f32(uint8_t code) { return e4m3_table[code]; }

#define F32_BITS_448 0x43e00000u    /* largest finite e4m3 magnitude */
#define F32_BITS_2M6 0x3c800000u    /* 2^-6, smallest normal e4m3 magnitude */
#define F32_BITS_2P14 0x46800000u   /* 2^14: its f32 ulp is 2^-9, the e4m3 subnormal step */

uint8_t di_f32_to_e4m3(float x) {
    uint32_t u = f32_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return sign | 0x7f; /* NaN keeps its sign, as torch's cast does */
    if (u >= F32_BITS_448) return sign | 0x7e;
    if (u < F32_BITS_2M6) {
        /* Subnormal range: in 2^14 + |x| the f32 ulp is exactly one e4m3 subnormal step, so the
         * FPU's own round-to-nearest-even does the rounding; the low bits are then the code (a
         * result of 8 is the carry into the smallest normal, code 0x08, as it should be). */
        float f = bits_f32(u) + bits_f32(F32_BITS_2P14);
        return sign | (uint8_t)(f32_bits(f) - F32_BITS_2P14);
    }
    /* Normal range: drop 20 of the 23 mantissa bits with ties to even (a carry may bump the
     * exponent, which is the correct next binade), then rebias the exponent from 127 to 7.
     * Nothing reaches 480 (the NaN pattern) because |x| < 448 here rounds to at most 448. */
    u += 0x7ffffu + ((u >> 20) & 1u);
    return sign | (uint8_t)((u - (120u << 23)) >> 20);
}

/* ---- E8M0 ---- */
float di_e8m0_to_f32(uint8_t e) {
    if (e == 0) return bits_f32(0x00400000u); /* 2^-127 is a f32 subnormal: exponent field 0 */
    if (e == 255) return NAN;
    return bits_f32((uint32_t)e << 23);
}

/* ---- E2M1 ---- */
static const float e2m1_table[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

float di_e2m1_to_f32(uint8_t code) { return e2m1_table[code & 15]; }

#define F32_BITS_6 0x40c00000u    /* largest E2M1 magnitude */
#define F32_BITS_1 0x3f800000u    /* 1.0, smallest normal E2M1 magnitude (0.5 is the subnormal) */
#define F32_BITS_2P22 0x4a800000u /* 2^22: its f32 ulp is 0.5, the E2M1 subnormal step */

uint8_t di_f32_to_e2m1(float x) {
    uint32_t u = f32_bits(x);
    uint8_t sign = (uint8_t)((u >> 28) & 8);
    u &= 0x7fffffffu;
    /* The reference rounds by comparing |x| with the midpoints, which every comparison with NaN
     * fails: NaN becomes ±0. */
    if (u > 0x7f800000u) return sign;
    if (u >= F32_BITS_6) return sign | 7;
    if (u < F32_BITS_1) { /* 0, 0.5 or (carry) 1.0; same trick as the e4m3 subnormals */
        float f = bits_f32(u) + bits_f32(F32_BITS_2P22);
        return sign | (uint8_t)(f32_bits(f) - F32_BITS_2P22);
    }
    /* Keep 1 mantissa bit with ties to even, rebias the exponent from 127 to 1. */
    u += 0x1fffffu + ((u >> 22) & 1u);
    return sign | (uint8_t)((u - (126u << 23)) >> 22);
}

/* ---- weight dequantization ---- */
void di_dequant_fp8_rows(const uint8_t *w, const uint8_t *scale, int64_t rows, int64_t cols, int block,
                         int64_t row0, int64_t nrows, float *out) {
    (void)rows;
    int64_t scale_cols = (cols + block - 1) / block;
    for (int64_t r = row0; r < row0 + nrows; r++) {
        const uint8_t *wr = w + r * cols;                          /* [cols] e4m3 */
        const uint8_t *sr = scale + (r / block) * scale_cols;      /* [scale_cols] E8M0 */
        float *o = out + (r - row0) * cols;                        /* [cols] f32 */
        for (int64_t c0 = 0, b = 0; c0 < cols; c0 += block, b++) {
            /* code × 2^k is exact in f32 except where it underflows, and then it rounds exactly
             * as the reference's f32 multiply does. */
            float s = di_e8m0_to_f32(sr[b]);
            int64_t c1 = c0 + block < cols ? c0 + block : cols;
            for (int64_t c = c0; c < c1; c++) o[c] = e4m3_table[wr[c]] * s;
        }
    }
}

void di_dequant_fp4_rows(const uint8_t *w, const uint8_t *scale, int64_t rows, int64_t cols, int64_t row0,
                         int64_t nrows, float *out) {
    (void)rows;
    for (int64_t r = row0; r < row0 + nrows; r++) {
        const uint8_t *wr = w + r * (cols / 2);     /* [cols/2] packed E2M1 pairs */
        const uint8_t *sr = scale + r * (cols / 32); /* [cols/32] E8M0 */
        float *o = out + (r - row0) * cols;         /* [cols] f32 */
        for (int64_t g = 0; g < cols / 32; g++) {
            float s = di_e8m0_to_f32(sr[g]);
            const uint8_t *wb = wr + g * 16;
            float *og = o + g * 32;
            for (int j = 0; j < 16; j++) {
                og[2 * j] = e2m1_table[wb[j] & 15] * s;
                og[2 * j + 1] = e2m1_table[wb[j] >> 4] * s;
            }
        }
    }
}

/* ---- activation quantization ---- */

/* Group amax as f32 bits, floored. For non-negative floats the bit patterns order like the
 * values, and NaN patterns sort above +inf, so an integer max both computes max|x| over the bf16
 * group and propagates NaN (torch's amax and clamp_min propagate NaN too). */
static inline uint32_t group_amax_bits(const uint16_t *x, int group, uint32_t floor_bits) {
    uint32_t m = 0;
    for (int i = 0; i < group; i++) {
        uint32_t a = x[i] & 0x7fffu;
        m = a > m ? a : m;
    }
    m <<= 16;
    return m > floor_bits ? m : floor_bits;
}

/* The reference's fast_round_scale: 2^ceil(log2(amax · max_inv)), with the product rounded to f32
 * and the ceil taken from its bits (exponent, plus one when any mantissa bit is set). Returns the
 * biased exponent, i.e. the E8M0 byte; ≥ 255 when amax is inf or NaN. The floors keep the product
 * a normal number, and bf16 inputs keep it below 2^126, so a finite group gives 1..253. */
static inline uint32_t pow2_scale_e8m0(uint32_t amax_bits, float max_inv) {
    uint32_t u = f32_bits(bits_f32(amax_bits) * max_inv);
    return ((u >> 23) & 0xffu) + ((u & 0x7fffffu) != 0);
}

/* The kernels multiply by the reciprocals as f32 constants rather than divide. */
#define FP8_MAX_INV ((float)(1.0 / 448.0))
#define FP4_MAX_INV ((float)(1.0 / 6.0))
#define ACT_FP8_AMAX_FLOOR 0x38d1b717u /* f32(1e-4) */
#define FP4_E8M0_AMAX_FLOOR 0x01c00000u /* 6·2^-126 */
#define FP4_E4M3_AMAX_FLOOR 0x3c400000u /* 6·2^-9: keeps an all-zero group's scale at 2^-9, not 0 */
#define BF16_NAN 0x7fc0u

/* Groups with inf or NaN have no finite power-of-two scale. The reference then produces
 * implementation artefacts (inf or a wrapped exponent); here such a group gets scale byte 0xFF
 * (E8M0 NaN), NaN codes where the format has them, and NaN after dequantization. Real
 * activations are finite. */

void di_act_quant_fp8(const uint16_t *x, int64_t n, int group, uint8_t *q, uint8_t *scale) {
    for (int64_t g = 0; g < n / group; g++) {
        const uint16_t *xg = x + g * group;
        uint8_t *qg = q + g * group;
        uint32_t e = pow2_scale_e8m0(group_amax_bits(xg, group, ACT_FP8_AMAX_FLOOR), FP8_MAX_INV);
        if (e >= 255) {
            scale[g] = 0xff;
            memset(qg, 0x7f, (size_t)group);
            continue;
        }
        scale[g] = (uint8_t)e;
        /* x / 2^k == x · 2^-k exactly (both are the correctly rounded same real number); the
         * encoder's saturation is the reference's clamp to ±448. */
        float inv_s = bits_f32((254u - e) << 23);
        for (int i = 0; i < group; i++) qg[i] = di_f32_to_e4m3(di_bf16_to_f32(xg[i]) * inv_s);
    }
}

void di_act_qdq_fp8(const uint16_t *x, int64_t n, int group, uint16_t *out) {
    for (int64_t g = 0; g < n / group; g++) {
        const uint16_t *xg = x + g * group;
        uint16_t *og = out + g * group;
        uint32_t e = pow2_scale_e8m0(group_amax_bits(xg, group, ACT_FP8_AMAX_FLOOR), FP8_MAX_INV);
        if (e >= 255) {
            for (int i = 0; i < group; i++) og[i] = BF16_NAN;
            continue;
        }
        float s = bits_f32(e << 23), inv_s = bits_f32((254u - e) << 23);
        for (int i = 0; i < group; i++) {
            uint8_t c = di_f32_to_e4m3(di_bf16_to_f32(xg[i]) * inv_s);
            og[i] = di_f32_to_bf16(e4m3_table[c] * s);
        }
    }
}

void di_fp4_quant_e8m0(const uint16_t *x, int64_t n, int group, uint8_t *packed, uint8_t *scale) {
    for (int64_t g = 0; g < n / group; g++) {
        const uint16_t *xg = x + g * group;
        uint8_t *pg = packed + g * group / 2;
        uint32_t e = pow2_scale_e8m0(group_amax_bits(xg, group, FP4_E8M0_AMAX_FLOOR), FP4_MAX_INV);
        if (e >= 255) {
            scale[g] = 0xff;
            memset(pg, 0, (size_t)group / 2);
            continue;
        }
        scale[g] = (uint8_t)e;
        float inv_s = bits_f32((254u - e) << 23);
        for (int i = 0; i < group; i += 2)
            pg[i / 2] = di_fp4_pack(di_f32_to_e2m1(di_bf16_to_f32(xg[i]) * inv_s),
                                    di_f32_to_e2m1(di_bf16_to_f32(xg[i + 1]) * inv_s));
    }
}

void di_fp4_qdq_e8m0(const uint16_t *x, int64_t n, int group, uint16_t *out) {
    for (int64_t g = 0; g < n / group; g++) {
        const uint16_t *xg = x + g * group;
        uint16_t *og = out + g * group;
        uint32_t e = pow2_scale_e8m0(group_amax_bits(xg, group, FP4_E8M0_AMAX_FLOOR), FP4_MAX_INV);
        if (e >= 255) {
            for (int i = 0; i < group; i++) og[i] = BF16_NAN;
            continue;
        }
        float s = bits_f32(e << 23), inv_s = bits_f32((254u - e) << 23);
        for (int i = 0; i < group; i++) {
            uint8_t c = di_f32_to_e2m1(di_bf16_to_f32(xg[i]) * inv_s);
            og[i] = di_f32_to_bf16(e2m1_table[c] * s);
        }
    }
}

/* E4M3 scale of one group: amax/6 as an f32 division, then rounded to e4m3 (two roundings, as in
 * the reference). The encoder saturates at 448 (satfinite) and maps NaN to the NaN code, which
 * then propagates through the group exactly as in the reference, so no special case is needed. */
static inline uint8_t fp4_e4m3_scale(const uint16_t *xg, int group) {
    return di_f32_to_e4m3(bits_f32(group_amax_bits(xg, group, FP4_E4M3_AMAX_FLOOR)) / 6.0f);
}

void di_fp4_quant_e4m3(const uint16_t *x, int64_t n, int group, uint8_t *packed, uint8_t *scale) {
    for (int64_t g = 0; g < n / group; g++) {
        const uint16_t *xg = x + g * group;
        uint8_t *pg = packed + g * group / 2;
        uint8_t sc = fp4_e4m3_scale(xg, group);
        float s = e4m3_table[sc];
        scale[g] = sc;
        /* s is not a power of two: x / s is a real f32 division here, rounded before the E2M1
         * rounding, and the encoder's saturation is the reference's clamp to ±6. */
        for (int i = 0; i < group; i += 2)
            pg[i / 2] = di_fp4_pack(di_f32_to_e2m1(di_bf16_to_f32(xg[i]) / s),
                                    di_f32_to_e2m1(di_bf16_to_f32(xg[i + 1]) / s));
    }
}

void di_fp4_qdq_e4m3(const uint16_t *x, int64_t n, int group, uint16_t *out) {
    for (int64_t g = 0; g < n / group; g++) {
        const uint16_t *xg = x + g * group;
        uint16_t *og = out + g * group;
        float s = e4m3_table[fp4_e4m3_scale(xg, group)];
        /* value × s is rounded to f32 and then to bf16: the same double rounding as the reference. */
        for (int i = 0; i < group; i++) {
            uint8_t c = di_f32_to_e2m1(di_bf16_to_f32(xg[i]) / s);
            og[i] = di_f32_to_bf16(e2m1_table[c] * s);
        }
    }
}
