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

/* cond ? a : b on bit patterns, written with masks: the encoders below compute every path and
 * select, which keeps them branch-free, so that GCC vectorizes the quantization loops at -O2. */
static inline uint32_t select_u32(int cond, uint32_t a, uint32_t b) {
    uint32_t m = -(uint32_t)(cond != 0);
    return (a & m) | (b & ~m);
}

/* Loops work in chunks of LANES values copied to a local array: the constant trip count and the
 * absence of aliasing (outputs may alias inputs, and uint8_t pointers alias anything) are what lets
 * GCC vectorize them at the project's -O2.
 *
 * The rounding tricks below rely on IEEE f32 arithmetic as written: this file must not be built
 * with -ffast-math / -fassociative-math (which would fold (x + c) − c into x). */
#define LANES 16

/* ---- float8_e4m3fn ----
 * Code = s eeee mmm, bias 7. e = 0: subnormal m·2^−9; e > 0: (1 + m/8)·2^(e−7); s 1111 111 = NaN.
 * The table serves scalar decoding; the vectorized dequantization loop assembles the bits. */
const float di_e4m3_values[256] = {
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

#define F32_BITS_448 0x43e00000u  /* largest finite e4m3 magnitude */
#define F32_BITS_2M6 0x3c800000u  /* 2^-6, smallest normal e4m3 magnitude */
#define F32_BITS_2P14 0x46800000u /* 2^14: its f32 ulp is 2^-9, the e4m3 subnormal step */
#define F32_BITS_INF 0x7f800000u

/* Round-to-nearest-even onto the e4m3 grid for |x| given as f32 bits, in two forms with the same
 * rounding: the rounded value as f32 bits (what the QDQ paths need, without a table lookup that
 * would stop vectorization), and the code. */
static inline uint32_t e4m3_abs_round_bits(uint32_t u) {
    /* |x| < 2^-6 (subnormal): in 2^14 + |x| the f32 ulp is exactly one e4m3 subnormal step, so the
     * FPU's own round-to-nearest-even does the rounding; subtracting 2^14 again is exact. */
    uint32_t sub = f32_bits((bits_f32(u) + bits_f32(F32_BITS_2P14)) - bits_f32(F32_BITS_2P14));
    /* 2^-6 ≤ |x| < 448: keep 3 of the 23 mantissa bits with ties to even (a carry into the
     * exponent is the correct next binade); below 448 this never reaches 480 (the NaN pattern). */
    uint32_t nrm = (u + 0x7ffffu + ((u >> 20) & 1u)) & ~0xfffffu;
    uint32_t r = select_u32(u < F32_BITS_2M6, sub, nrm);
    r = select_u32(u >= F32_BITS_448, F32_BITS_448, r); /* saturate, ±inf included */
    return select_u32(u > F32_BITS_INF, u, r);          /* NaN stays NaN */
}

static inline uint32_t e4m3_abs_code(uint32_t u) {
    uint32_t sub = f32_bits(bits_f32(u) + bits_f32(F32_BITS_2P14)) - F32_BITS_2P14; /* 8 = carry to 0x08 */
    uint32_t nrm = (u + 0x7ffffu + ((u >> 20) & 1u) - (120u << 23)) >> 20;         /* rebias 127 → 7 */
    uint32_t c = select_u32(u < F32_BITS_2M6, sub, nrm);
    c = select_u32(u >= F32_BITS_448, 0x7eu, c);
    return select_u32(u > F32_BITS_INF, 0x7fu, c); /* NaN keeps its sign, as torch's cast does */
}

static inline uint8_t e4m3_encode(float x) {
    uint32_t u = f32_bits(x);
    return (uint8_t)(((u >> 24) & 0x80u) | e4m3_abs_code(u & 0x7fffffffu));
}

uint8_t di_f32_to_e4m3(float x) { return e4m3_encode(x); }

/* The e4m3 value nearest to x (saturating at ±448), as f32: di_e4m3_to_f32(di_f32_to_e4m3(x)). */
static inline float e4m3_round(float x) {
    uint32_t u = f32_bits(x);
    return bits_f32((u & 0x80000000u) | e4m3_abs_round_bits(u & 0x7fffffffu));
}

/* ---- E2M1 ---- */
const float di_e2m1_values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

#define F32_BITS_6 0x40c00000u    /* largest E2M1 magnitude */
#define F32_BITS_1 0x3f800000u    /* 1.0, smallest normal E2M1 magnitude (0.5 is the subnormal) */
#define F32_BITS_2P22 0x4a800000u /* 2^22: its f32 ulp is 0.5, the E2M1 subnormal step */

/* Same scheme as e4m3: |x| < 1 rounds through 2^22 + |x| (0, 0.5 or the carry to 1), 1 ≤ |x| < 6
 * keeps 1 mantissa bit with ties to even, ≥ 6 saturates. NaN gives 0: the reference rounds by
 * comparing |x| with the midpoints, which every comparison with NaN fails. */
static inline uint32_t e2m1_abs_round_bits(uint32_t u) {
    uint32_t sub = f32_bits((bits_f32(u) + bits_f32(F32_BITS_2P22)) - bits_f32(F32_BITS_2P22));
    uint32_t nrm = (u + 0x1fffffu + ((u >> 22) & 1u)) & ~0x3fffffu;
    uint32_t r = select_u32(u < F32_BITS_1, sub, nrm);
    r = select_u32(u >= F32_BITS_6, F32_BITS_6, r);
    return select_u32(u > F32_BITS_INF, 0, r);
}

static inline uint32_t e2m1_abs_code(uint32_t u) {
    uint32_t sub = f32_bits(bits_f32(u) + bits_f32(F32_BITS_2P22)) - F32_BITS_2P22;
    uint32_t nrm = (u + 0x1fffffu + ((u >> 22) & 1u) - (126u << 23)) >> 22; /* rebias 127 → 1 */
    uint32_t c = select_u32(u < F32_BITS_1, sub, nrm);
    c = select_u32(u >= F32_BITS_6, 7u, c);
    return select_u32(u > F32_BITS_INF, 0u, c);
}

static inline uint8_t e2m1_encode(float x) {
    uint32_t u = f32_bits(x);
    return (uint8_t)(((u >> 28) & 8u) | e2m1_abs_code(u & 0x7fffffffu));
}

uint8_t di_f32_to_e2m1(float x) { return e2m1_encode(x); }

/* The E2M1 value nearest to x (saturating at ±6, NaN → ±0), as f32. */
static inline float e2m1_round(float x) {
    uint32_t u = f32_bits(x);
    return bits_f32((u & 0x80000000u) | e2m1_abs_round_bits(u & 0x7fffffffu));
}

/* ---- weight dequantization ----
 * The product code × 2^k is exact in f32 unless it underflows, and then it rounds exactly as the
 * reference's f32 multiply does. FP8 decodes by bit assembly rather than through the table: a
 * table lookup is a gather, which stops vectorization, while these few integer operations
 * vectorize (2.3x faster in cache). Values are identical to the table (test_formats checks every
 * code). For FP4 the 16-entry table is as fast. */

static inline float e4m3_decode(uint8_t code) {
    uint32_t em = code & 0x7fu;
    uint32_t nrm = (em << 20) + (120u << 23);              /* exponent rebias 7 → 127 */
    uint32_t sub = f32_bits((float)(int)em * 0x1p-9f);      /* em < 8: em subnormal steps of 2^-9 */
    uint32_t r = select_u32(em < 8, sub, nrm);
    r = select_u32(em == 0x7f, 0x7fc00000u, r);
    return bits_f32(r | ((uint32_t)(code & 0x80u) << 24));
}

void di_dequant_fp8_rows(const uint8_t *w, const uint8_t *scale, int64_t rows, int64_t cols, int block,
                         int64_t row0, int64_t nrows, float *out) {
    (void)rows;
    int64_t scale_cols = (cols + block - 1) / block;
    for (int64_t r = row0; r < row0 + nrows; r++) {
        const uint8_t *wr = w + r * cols;                     /* [cols] e4m3 */
        const uint8_t *sr = scale + (r / block) * scale_cols; /* [scale_cols] E8M0 */
        float *o = out + (r - row0) * cols;                   /* [cols] f32 */
        for (int64_t c0 = 0, b = 0; c0 < cols; c0 += block, b++) {
            float s = di_e8m0_to_f32(sr[b]);
            int64_t c1 = c0 + block < cols ? c0 + block : cols, c = c0;
            for (; c + LANES <= c1; c += LANES) {
                uint8_t wl[LANES]; /* local copy: float stores could otherwise alias the codes */
                memcpy(wl, wr + c, sizeof wl);
                for (int j = 0; j < LANES; j++) o[c + j] = e4m3_decode(wl[j]) * s;
            }
            for (; c < c1; c++) o[c] = e4m3_decode(wr[c]) * s;
        }
    }
}

void di_dequant_fp4_rows(const uint8_t *w, const uint8_t *scale, int64_t rows, int64_t cols, int64_t row0,
                         int64_t nrows, float *out) {
    (void)rows;
    for (int64_t r = row0; r < row0 + nrows; r++) {
        const uint8_t *wr = w + r * (cols / 2);      /* [cols/2] packed E2M1 pairs */
        const uint8_t *sr = scale + r * (cols / 32); /* [cols/32] E8M0 */
        float *o = out + (r - row0) * cols;          /* [cols] f32 */
        for (int64_t g = 0; g < cols / 32; g++) {
            float s = di_e8m0_to_f32(sr[g]);
            const uint8_t *wb = wr + g * 16; /* [16] bytes = 32 codes */
            float *og = o + g * 32;
            for (int j = 0; j < 16; j++) {
                og[2 * j] = di_e2m1_values[di_fp4_even(wb[j])] * s;
                og[2 * j + 1] = di_e2m1_values[di_fp4_odd(wb[j])] * s;
            }
        }
    }
}

/* ---- activation quantization ---- */

/* Groups are processed in chunks of LANES values copied to a local array (see LANES above); a
 * group that is not a multiple of LANES finishes with a scalar tail. */

/* Group amax as f32 bits, floored. For non-negative floats the bit patterns order like the
 * values, and NaN patterns sort above +inf, so an integer max both computes max|x| over the bf16
 * group and propagates NaN (torch's amax and clamp_min propagate NaN too). */
static inline uint32_t group_amax_bits(const uint16_t *x, int group, uint32_t floor_bits) {
    uint16_t lane_max[LANES] = {0};
    int i = 0;
    for (; i + LANES <= group; i += LANES)
        for (int j = 0; j < LANES; j++) {
            uint16_t a = x[i + j] & 0x7fffu;
            lane_max[j] = a > lane_max[j] ? a : lane_max[j];
        }
    uint32_t m = 0;
    for (; i < group; i++) m = (x[i] & 0x7fffu) > m ? (x[i] & 0x7fffu) : m;
    for (int j = 0; j < LANES; j++) m = lane_max[j] > m ? lane_max[j] : m;
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
#define ACT_FP8_AMAX_FLOOR 0x38d1b717u  /* f32(1e-4) */
#define FP4_E8M0_AMAX_FLOOR 0x01c00000u /* 6·2^-126 */
#define FP4_E4M3_AMAX_FLOOR 0x3c400000u /* 6·2^-9: keeps an all-zero group's scale at 2^-9, not 0 */
#define BF16_NAN 0x7fc0u

/* Groups with inf or NaN have no finite power-of-two scale. The reference then produces
 * implementation artefacts (inf or a wrapped exponent); here such a group gets scale byte 0xFF
 * (E8M0 NaN), NaN codes where the format has them, and NaN after dequantization. Real
 * activations are finite. */

/* Scaling: with a power-of-two s, x / s == x · (1/s) exactly (both are the correctly rounded same
 * real number) and 1/s is representable (e ≤ 253), so the division becomes a multiply. With the
 * E4M3 scale (not a power of two) the reference's f32 division is kept. The encoders' saturation
 * is the reference's clamp to ±448 / ±6. */
#define POW2(e) bits_f32((uint32_t)(e) << 23)
#define POW2_INV(e) bits_f32((254u - (uint32_t)(e)) << 23)

static inline uint8_t fp8_code(uint16_t x, float inv_s) { return e4m3_encode(di_bf16_to_f32(x) * inv_s); }

/* bf16(e4m3(x/s)·s): the product of an e4m3 value and a power of two is exact in f32. */
static inline uint16_t fp8_qdq(uint16_t x, float inv_s, float s) {
    return di_f32_to_bf16(e4m3_round(di_bf16_to_f32(x) * inv_s) * s);
}

void di_act_quant_fp8(const uint16_t *x, int64_t n, int group, uint8_t *q, uint8_t *scale) {
    for (int64_t g = 0; g < n / group; g++) {
        const uint16_t *xg = x + g * group; /* [group] bf16 */
        uint8_t *qg = q + g * group;        /* [group] e4m3 */
        uint32_t e = pow2_scale_e8m0(group_amax_bits(xg, group, ACT_FP8_AMAX_FLOOR), FP8_MAX_INV);
        if (e >= 255) {
            scale[g] = 0xff;
            memset(qg, 0x7f, (size_t)group);
            continue;
        }
        scale[g] = (uint8_t)e;
        float inv_s = POW2_INV(e);
        int i = 0;
        for (; i + LANES <= group; i += LANES) {
            uint16_t xl[LANES]; /* bf16 chunk */
            memcpy(xl, xg + i, sizeof xl);
            for (int j = 0; j < LANES; j++) qg[i + j] = fp8_code(xl[j], inv_s);
        }
        for (; i < group; i++) qg[i] = fp8_code(xg[i], inv_s);
    }
}

void di_act_qdq_fp8(const uint16_t *x, int64_t n, int group, uint16_t *out) {
    for (int64_t g = 0; g < n / group; g++) {
        const uint16_t *xg = x + g * group; /* [group] bf16 */
        uint16_t *og = out + g * group;     /* [group] bf16, may be xg */
        uint32_t e = pow2_scale_e8m0(group_amax_bits(xg, group, ACT_FP8_AMAX_FLOOR), FP8_MAX_INV);
        if (e >= 255) {
            for (int i = 0; i < group; i++) og[i] = BF16_NAN;
            continue;
        }
        float s = POW2(e), inv_s = POW2_INV(e);
        int i = 0;
        for (; i + LANES <= group; i += LANES) {
            uint16_t xl[LANES]; /* bf16 chunk */
            memcpy(xl, xg + i, sizeof xl);
            for (int j = 0; j < LANES; j++) og[i + j] = fp8_qdq(xl[j], inv_s, s);
        }
        for (; i < group; i++) og[i] = fp8_qdq(xg[i], inv_s, s);
    }
}

/* E2M1 codes of one chunk of LANES values divided by s (pow2: multiplied by inv_s, exact; E4M3
 * scale: the reference's f32 division), packed two per byte with the even element in the low
 * nibble. Codes first into a local array, then the packing, so that each loop vectorizes. */
static inline void fp4_chunk_pow2(const uint16_t *x, float inv_s, uint8_t *packed) {
    uint16_t xl[LANES]; /* bf16 chunk */
    uint8_t c[LANES];   /* E2M1 codes of the chunk */
    memcpy(xl, x, sizeof xl);
    for (int j = 0; j < LANES; j++) c[j] = e2m1_encode(di_bf16_to_f32(xl[j]) * inv_s);
    for (int j = 0; j < LANES / 2; j++) packed[j] = di_fp4_pack(c[2 * j], c[2 * j + 1]);
}

static inline void fp4_chunk_div(const uint16_t *x, float s, uint8_t *packed) {
    uint16_t xl[LANES]; /* bf16 chunk */
    uint8_t c[LANES];   /* E2M1 codes of the chunk */
    memcpy(xl, x, sizeof xl);
    for (int j = 0; j < LANES; j++) c[j] = e2m1_encode(di_bf16_to_f32(xl[j]) / s);
    for (int j = 0; j < LANES / 2; j++) packed[j] = di_fp4_pack(c[2 * j], c[2 * j + 1]);
}

static inline uint8_t fp4_pair_pow2(const uint16_t *x, float inv_s) {
    return di_fp4_pack(e2m1_encode(di_bf16_to_f32(x[0]) * inv_s), e2m1_encode(di_bf16_to_f32(x[1]) * inv_s));
}

static inline uint8_t fp4_pair_div(const uint16_t *x, float s) {
    return di_fp4_pack(e2m1_encode(di_bf16_to_f32(x[0]) / s), e2m1_encode(di_bf16_to_f32(x[1]) / s));
}

void di_fp4_quant_e8m0(const uint16_t *x, int64_t n, int group, uint8_t *packed, uint8_t *scale) {
    for (int64_t g = 0; g < n / group; g++) {
        const uint16_t *xg = x + g * group;     /* [group] bf16 */
        uint8_t *pg = packed + g * group / 2;   /* [group/2] packed E2M1 */
        uint32_t e = pow2_scale_e8m0(group_amax_bits(xg, group, FP4_E8M0_AMAX_FLOOR), FP4_MAX_INV);
        if (e >= 255) {
            scale[g] = 0xff;
            memset(pg, 0, (size_t)group / 2);
            continue;
        }
        scale[g] = (uint8_t)e;
        float inv_s = POW2_INV(e);
        int i = 0;
        for (; i + LANES <= group; i += LANES) fp4_chunk_pow2(xg + i, inv_s, pg + i / 2);
        for (; i < group; i += 2) pg[i / 2] = fp4_pair_pow2(xg + i, inv_s);
    }
}

void di_fp4_qdq_e8m0(const uint16_t *x, int64_t n, int group, uint16_t *out) {
    for (int64_t g = 0; g < n / group; g++) {
        const uint16_t *xg = x + g * group; /* [group] bf16 */
        uint16_t *og = out + g * group;     /* [group] bf16, may be xg */
        uint32_t e = pow2_scale_e8m0(group_amax_bits(xg, group, FP4_E8M0_AMAX_FLOOR), FP4_MAX_INV);
        if (e >= 255) {
            for (int i = 0; i < group; i++) og[i] = BF16_NAN;
            continue;
        }
        float s = POW2(e), inv_s = POW2_INV(e);
        int i = 0;
        for (; i + LANES <= group; i += LANES) {
            uint16_t xl[LANES]; /* bf16 chunk */
            memcpy(xl, xg + i, sizeof xl);
            for (int j = 0; j < LANES; j++) og[i + j] = di_f32_to_bf16(e2m1_round(di_bf16_to_f32(xl[j]) * inv_s) * s);
        }
        for (; i < group; i++) og[i] = di_f32_to_bf16(e2m1_round(di_bf16_to_f32(xg[i]) * inv_s) * s);
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
        const uint16_t *xg = x + g * group;   /* [group] bf16 */
        uint8_t *pg = packed + g * group / 2; /* [group/2] packed E2M1 */
        uint8_t sc = fp4_e4m3_scale(xg, group);
        float s = di_e4m3_values[sc];
        scale[g] = sc;
        int i = 0;
        for (; i + LANES <= group; i += LANES) fp4_chunk_div(xg + i, s, pg + i / 2);
        for (; i < group; i += 2) pg[i / 2] = fp4_pair_div(xg + i, s);
    }
}

/* bf16(f32(e2m1(x/s)·s)): s is not a power of two, so the product is rounded to f32 and then to
 * bf16, the same double rounding as the reference. */
static inline uint16_t fp4_qdq_div(uint16_t x, float s) {
    return di_f32_to_bf16(e2m1_round(di_bf16_to_f32(x) / s) * s);
}

void di_fp4_qdq_e4m3(const uint16_t *x, int64_t n, int group, uint16_t *out) {
    for (int64_t g = 0; g < n / group; g++) {
        const uint16_t *xg = x + g * group; /* [group] bf16 */
        uint16_t *og = out + g * group;     /* [group] bf16, may be xg */
        float s = di_e4m3_values[fp4_e4m3_scale(xg, group)];
        int i = 0;
        for (; i + LANES <= group; i += LANES) {
            uint16_t xl[LANES]; /* bf16 chunk */
            memcpy(xl, xg + i, sizeof xl);
            for (int j = 0; j < LANES; j++) og[i + j] = fp4_qdq_div(xl[j], s);
        }
        for (; i < group; i++) og[i] = fp4_qdq_div(xg[i], s);
    }
}
