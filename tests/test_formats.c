/* Numeric formats: every e4m3/e2m1 code, encoder rounding and saturation against brute-force
 * nearest-value search, E8M0 edges, weight dequantization on hand-made blocks, and the activation
 * quantizers bit-exact against reference vectors (tests/data/kernels.safetensors).  di-test: asan */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/formats.h"
#include "io/safetensors.h"
#include "testutil.h"

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* e4m3fn value of a code from its definition (independent of the library's table). */
static double e4m3_def(int c) {
    int e = (c >> 3) & 15, m = c & 7;
    double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return (c & 0x80) ? -v : v;
}

/* Brute-force e4m3 encoding: clamp to ±448, nearest of the 127 finite magnitudes, ties to the even
 * code (codes of one sign are monotonic, so "even code" = even mantissa). */
static uint8_t e4m3_brute(float x) {
    if (isnan(x)) return signbit(x) ? 0xff : 0x7f;
    double a = fabs((double)x);
    if (a > 448) a = 448;
    int best = 0;
    double bestd = INFINITY;
    for (int c = 0; c < 0x7f; c++) {
        double d = fabs(e4m3_def(c) - a);
        if (d < bestd || (d == bestd && (c & 1) == 0)) best = c, bestd = d;
    }
    return (uint8_t)(best | (signbit(x) ? 0x80 : 0));
}

static const float e2m1_grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};

static uint8_t e2m1_brute(float x) {
    if (isnan(x)) return signbit(x) ? 8 : 0;
    double a = fabs((double)x);
    if (a > 6) a = 6;
    int best = 0;
    double bestd = INFINITY;
    for (int c = 0; c < 8; c++) {
        double d = fabs(e2m1_grid[c] - a);
        if (d < bestd || (d == bestd && (c & 1) == 0)) best = c, bestd = d;
    }
    return (uint8_t)(best | (signbit(x) ? 8 : 0));
}

static uint32_t rng_state = 0x12345678u;
static uint32_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

static void test_bf16(void **state) {
    (void)state;
    assert_int_equal(di_f32_to_bf16(1.0f), 0x3f80);
    /* ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 → 1; 1 + 3·2^-8 → 1 + 2^-6 */
    assert_int_equal(di_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    assert_int_equal(di_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    assert_int_equal(di_f32_to_bf16(float_of(0x3f808001u)), 0x3f81);
    assert_int_equal(di_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(di_f32_to_bf16(-INFINITY), 0xff80);
    assert_int_equal(di_f32_to_bf16(float_of(0x7f7fffffu)), 0x7f80); /* FLT_MAX rounds up to inf */
    uint16_t n = di_f32_to_bf16(float_of(0x7f800001u));            /* NaN with payload only in low bits */
    assert_true(isnan(di_bf16_to_f32(n)));
    assert_int_equal(di_f32_to_bf16(float_of(0x00010000u)), 0x0001); /* subnormals keep their bits */
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = di_bf16_to_f32((uint16_t)h);
        if (!isnan(f)) assert_int_equal(di_f32_to_bf16(f), h);
    }
}

static void test_e4m3_all_codes(void **state) {
    (void)state;
    int nan_codes = 0;
    for (int c = 0; c < 256; c++) {
        float v = di_e4m3_to_f32((uint8_t)c);
        if ((c & 0x7f) == 0x7f) {
            assert_true(isnan(v));
            assert_int_equal(signbit(v) != 0, c >> 7);
            nan_codes++;
        } else {
            assert_true((double)v == e4m3_def(c));
            assert_int_equal(signbit(v) != 0, c >> 7); /* including −0 */
        }
        assert_int_equal(di_f32_to_e4m3(v), c); /* decode → encode is the identity, NaN included */
    }
    assert_int_equal(nan_codes, 2);
    assert_true(di_e4m3_to_f32(0x7e) == 448.0f);
    assert_true(di_e4m3_to_f32(0x01) == 0x1p-9f);
    assert_true(di_e4m3_to_f32(0x08) == 0x1p-6f);
}

static void test_e4m3_encoder(void **state) {
    (void)state;
    /* ties to even in the subnormal range, at the subnormal/normal border and among normals */
    assert_int_equal(di_f32_to_e4m3(0x1p-10f), 0x00);      /* 0.5 step → 0 */
    assert_int_equal(di_f32_to_e4m3(0x1.8p-9f), 0x02);     /* 1.5 steps → 2 */
    assert_int_equal(di_f32_to_e4m3(0x1.4p-9f), 0x01);     /* 1.25 steps → 1 */
    assert_int_equal(di_f32_to_e4m3(7.5f * 0x1p-9f), 0x08); /* 7.5 steps → 8 = 2^-6 */
    assert_int_equal(di_f32_to_e4m3(17.0f), 0x58);         /* 16 | 18 tie → 16 */
    assert_int_equal(di_f32_to_e4m3(19.0f), 0x5a);         /* 18 | 20 tie → 20 */
    assert_int_equal(di_f32_to_e4m3(-17.0f), 0xd8);
    assert_int_equal(di_f32_to_e4m3(15.5f), 0x58);         /* 15 | 16 tie crosses the binade → 16 */
    assert_int_equal(di_f32_to_e4m3(-0.0f), 0x80);
    assert_int_equal(di_f32_to_e4m3(0x1p-149f), 0x00);
    /* saturation */
    assert_int_equal(di_f32_to_e4m3(440.0f), 0x7e); /* 416 | 448 tie → 448 (even mantissa 6) */
    assert_int_equal(di_f32_to_e4m3(449.0f), 0x7e);
    assert_int_equal(di_f32_to_e4m3(464.0f), 0x7e);
    assert_int_equal(di_f32_to_e4m3(480.0f), 0x7e);
    assert_int_equal(di_f32_to_e4m3(1e30f), 0x7e);
    assert_int_equal(di_f32_to_e4m3(INFINITY), 0x7e);
    assert_int_equal(di_f32_to_e4m3(-INFINITY), 0xfe);
    assert_int_equal(di_f32_to_e4m3(NAN), 0x7f);
    assert_int_equal(di_f32_to_e4m3(-NAN), 0xff);

    /* every midpoint between neighbouring codes, and one f32 ulp either side */
    long checked = 0;
    for (int c = 0; c < 0x7e; c++) {
        float mid = (float)((e4m3_def(c) + e4m3_def(c + 1)) / 2);
        float probes[3] = {nextafterf(mid, 0), mid, nextafterf(mid, INFINITY)};
        for (int k = 0; k < 3; k++) {
            assert_int_equal(di_f32_to_e4m3(probes[k]), e4m3_brute(probes[k]));
            assert_int_equal(di_f32_to_e4m3(-probes[k]), e4m3_brute(-probes[k]));
            checked += 2;
        }
    }
    /* every bf16 value, then random f32 patterns */
    for (uint32_t h = 0; h < 0x10000; h++, checked++) {
        float f = di_bf16_to_f32((uint16_t)h);
        assert_int_equal(di_f32_to_e4m3(f), e4m3_brute(f));
    }
    for (int i = 0; i < 200000; i++, checked++) {
        /* bias towards the e4m3 range: exponent field 100..140 most of the time */
        uint32_t u = rng();
        if (i % 4) u = (u & 0x807fffffu) | ((100u + u % 41u) << 23);
        float f = float_of(u);
        assert_int_equal(di_f32_to_e4m3(f), e4m3_brute(f));
    }
    tu_report("e4m3 encoder values checked against brute force: %ld", checked);
}

static void test_e2m1(void **state) {
    (void)state;
    static const float table[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int c = 0; c < 16; c++) {
        float v = di_e2m1_to_f32((uint8_t)c);
        assert_true(v == table[c]);
        assert_int_equal(signbit(v) != 0, c >> 3);
        assert_int_equal(di_f32_to_e2m1(v), c);
        assert_true(di_e2m1_to_f32((uint8_t)(c | 0xf0)) == v); /* only the low nibble counts */
    }
    /* ties: the reference's midpoint table rounds up only at 0.75, 1.75 and 3.5 */
    static const float ties[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    static const uint8_t tie_code[7] = {0, 2, 2, 4, 4, 6, 6};
    for (int i = 0; i < 7; i++) {
        assert_int_equal(di_f32_to_e2m1(ties[i]), tie_code[i]);
        assert_int_equal(di_f32_to_e2m1(-ties[i]), tie_code[i] | 8);
        assert_int_equal(di_f32_to_e2m1(nextafterf(ties[i], 0)), i); /* midpoint i sits between codes i, i+1 */
        assert_int_equal(di_f32_to_e2m1(nextafterf(ties[i], INFINITY)), (uint8_t)(i + 1));
    }
    assert_int_equal(di_f32_to_e2m1(6.5f), 7);
    assert_int_equal(di_f32_to_e2m1(-1e30f), 15);
    assert_int_equal(di_f32_to_e2m1(INFINITY), 7);
    assert_int_equal(di_f32_to_e2m1(NAN), 0);
    assert_int_equal(di_f32_to_e2m1(0x1p-149f), 0);
    assert_int_equal(di_f32_to_e2m1(-0.0f), 8);
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = di_bf16_to_f32((uint16_t)h);
        assert_int_equal(di_f32_to_e2m1(f), e2m1_brute(f));
    }
    for (int i = 0; i < 100000; i++) {
        uint32_t u = rng();
        u = (u & 0x807fffffu) | ((120u + u % 12u) << 23);
        float f = float_of(u);
        assert_int_equal(di_f32_to_e2m1(f), e2m1_brute(f));
    }
    assert_int_equal(di_fp4_pack(0x3, 0xc), 0xc3);
    assert_int_equal(di_fp4_even(0xc3), 0x3);
    assert_int_equal(di_fp4_odd(0xc3), 0xc);
}

static void test_e8m0(void **state) {
    (void)state;
    assert_true(di_e8m0_to_f32(127) == 1.0f);
    assert_true(di_e8m0_to_f32(128) == 2.0f);
    assert_true(di_e8m0_to_f32(1) == 0x1p-126f);
    assert_true(di_e8m0_to_f32(0) == 0x1p-127f); /* subnormal, not zero */
    assert_true(di_e8m0_to_f32(0) > 0.0f);
    assert_true(di_e8m0_to_f32(254) == 0x1p127f);
    assert_true(isnan(di_e8m0_to_f32(255)));
    for (int e = 0; e < 255; e++) {
        assert_true(di_e8m0_to_f32((uint8_t)e) == ldexpf(1.0f, e - 127));
        if (e >= 1) assert_int_equal(di_e8m0_from_exp(e - 127), e);
    }
}

/* FP8 weight [40, 70] with 32×32 blocks: scales [2, 3], partial blocks at the right and bottom. */
static void test_dequant_fp8(void **state) {
    (void)state;
    enum { R = 40, C = 70, B = 32, SR = 2, SC = 3 };
    uint8_t w[R * C];        /* [40, 70] e4m3 */
    uint8_t sc[SR * SC];     /* [2, 3] E8M0 */
    float out[R * C];        /* [40, 70] f32 */
    for (int i = 0; i < R * C; i++) w[i] = (uint8_t)((i * 37 + 11) % 256);
    w[0] = 0x7e;             /* 448 at 2^-127: still a normal f32 */
    w[1] = 0x01;             /* 2^-9 at 2^-127 = 2^-136: an exact f32 subnormal */
    const uint8_t scales[SR * SC] = {0, 127, 130, 120, 254, 100};
    memcpy(sc, scales, sizeof sc);
    di_dequant_fp8_rows(w, sc, R, C, B, 0, R, out);
    long exact = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            double want = e4m3_def(w[r * C + c]) * ldexp(1, scales[(r / B) * SC + c / B] - 127);
            float got = out[r * C + c];
            if ((w[r * C + c] & 0x7f) == 0x7f) assert_true(isnan(got));
            else if (fabs(want) > 3.4e38) assert_true(isinf(got)); /* 2^127 × ≥2 overflows f32 */
            else assert_true((double)got == want), exact++;
        }
    assert_true(out[0] == 448.0f * 0x1p-127f);
    assert_true(out[1] == 0x1p-136f);
    /* a slice of rows gives the same values */
    float part[3 * C];
    di_dequant_fp8_rows(w, sc, R, C, B, 31, 3, part);
    assert_memory_equal(part, out + 31 * C, sizeof part);
    tu_report("fp8 dequant exact values: %ld", exact);
}

/* FP4 weight [3, 64]: bytes [3, 32], scales [3, 2]. */
static void test_dequant_fp4(void **state) {
    (void)state;
    uint8_t w[3 * 32];  /* [3, 32] packed E2M1 */
    uint8_t sc[3 * 2];  /* [3, 2] E8M0 */
    float out[3 * 64];  /* [3, 64] f32 */
    for (int i = 0; i < 96; i++) w[i] = (uint8_t)(i * 7 + 3);
    w[0] = 0x71; /* even column 0 = code 1 (0.5), odd column 1 = code 7 (6) */
    const uint8_t scales[6] = {127, 129, 126, 0, 200, 1};
    memcpy(sc, scales, sizeof sc);
    di_dequant_fp4_rows(w, sc, 3, 64, 0, 3, out);
    assert_true(out[0] == 0.5f);
    assert_true(out[1] == 6.0f);
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 64; c++) {
            uint8_t b = w[r * 32 + c / 2];
            uint8_t code = (c & 1) ? b >> 4 : b & 15;
            double want = (code & 8 ? -1 : 1) * e2m1_grid[code & 7] * ldexp(1, scales[r * 2 + c / 32] - 127);
            assert_true((double)out[r * 64 + c] == want);
        }
    float row[64];
    di_dequant_fp4_rows(w, sc, 3, 64, 2, 1, row);
    assert_memory_equal(row, out + 128, sizeof row);
}

/* Quantizer edge cases with values worked out by hand from the reference rules. */
static void test_act_quant_edges(void **state) {
    (void)state;
    uint16_t x[64];   /* [2 groups × 32] bf16 */
    uint8_t q[64];    /* [64] e4m3 */
    uint8_t s[2];     /* [2] E8M0 */
    uint16_t y[64];   /* [64] bf16 */
    memset(x, 0, sizeof x);
    /* group 0 all zero: amax floor 1e-4 → 1e-4/448 ≈ 2^-22.09 → s = 2^-22 */
    /* group 1: one outlier 448·8 = 3584 → s = 8 exactly (3584·f32(1/448) rounds to exactly 8, so
     * no extra doubling); −0.03/8 ≈ 1.92 subnormal steps of 2^-9 → code 0x82 */
    x[32] = di_f32_to_bf16(3584.0f);
    x[33] = di_f32_to_bf16(-0.03f);
    x[34] = di_f32_to_bf16(0.0078125f); /* 2^-7 / 8 = 2^-10: tie between 0 and 2^-9 → 0 */
    x[35] = di_f32_to_bf16(3585.0f);    /* bf16 rounds to 3584 */
    di_act_quant_fp8(x, 64, 32, q, s);
    assert_int_equal(s[0], 127 - 22);
    for (int i = 0; i < 32; i++) assert_int_equal(q[i], 0);
    assert_int_equal(s[1], 127 + 3);
    assert_int_equal(q[32], 0x7e);
    assert_int_equal(q[33], 0x82);
    assert_int_equal(q[34], 0x00);
    assert_int_equal(q[35], 0x7e);
    di_act_qdq_fp8(x, 64, 32, y);
    for (int i = 0; i < 64; i++)
        assert_int_equal(y[i], di_f32_to_bf16(di_e4m3_to_f32(q[i]) * di_e8m0_to_f32(s[i / 32])));
    /* just above a power of two: amax = 448·(1 + 2^-7) → s = 2, and 448.x/2 → 224 | 240 grid */
    memset(x, 0, sizeof x);
    x[0] = di_f32_to_bf16(448.0f * (1 + 0x1p-7f));
    di_act_quant_fp8(x, 32, 32, q, s);
    assert_int_equal(s[0], 128);
    assert_int_equal(q[0], di_f32_to_e4m3(224.0f * (1 + 0x1p-7f)));
    /* in place (out aliases x) */
    memcpy(y, x, sizeof x);
    di_act_qdq_fp8(y, 32, 32, y);
    assert_int_equal(y[0], di_f32_to_bf16(di_e4m3_to_f32(q[0]) * 2));
    /* inf / NaN groups: scale 0xFF, dequantized NaN; neighbouring group untouched */
    memset(x, 0, sizeof x);
    x[3] = 0x7f80; /* +inf */
    x[40] = di_f32_to_bf16(1.0f);
    di_act_quant_fp8(x, 64, 32, q, s);
    assert_int_equal(s[0], 0xff);
    assert_int_equal(q[3], 0x7f);
    assert_int_equal(s[1], 127 - 8); /* 1/448 → 2^-8.8 → 2^-8 */
    assert_int_equal(q[40], di_f32_to_e4m3(256.0f));
    di_act_qdq_fp8(x, 64, 32, y);
    assert_true(isnan(di_bf16_to_f32(y[0])));
    assert_int_equal(y[40], di_f32_to_bf16(1.0f));

    /* FP4 with E8M0 scales: zero group → floor 6·2^-126 → s = 2^-126 (byte 1) */
    uint8_t p[32]; /* [64/2] packed */
    memset(x, 0, sizeof x);
    x[32] = di_f32_to_bf16(6.0f);
    x[33] = di_f32_to_bf16(-0.75f);  /* tie 0.5 | 1 → 1 */
    x[34] = di_f32_to_bf16(5.0f);    /* tie 4 | 6 → 4 */
    x[35] = di_f32_to_bf16(0x1p-133f); /* tiny: rounds to 0 at s = 1 */
    di_fp4_quant_e8m0(x, 64, 32, p, s);
    assert_int_equal(s[0], 1);
    assert_int_equal(s[1], 127);
    for (int i = 0; i < 16; i++) assert_int_equal(p[i], 0);
    assert_int_equal(p[16], di_fp4_pack(7, 10));
    assert_int_equal(p[17], di_fp4_pack(6, 0));
    di_fp4_qdq_e8m0(x, 64, 32, y);
    assert_true(di_bf16_to_f32(y[33]) == -1.0f);
    assert_true(di_bf16_to_f32(y[34]) == 4.0f);

    /* FP4 with E4M3 scales, group 16: zero group → s = e4m3(2^-9) = 2^-9, nonzero;
     * amax 7 → 7/6 = 1.1666… → e4m3 1.125 (0x38 + 1); x/s with a non-power-of-two s */
    memset(x, 0, sizeof x);
    x[16] = di_f32_to_bf16(7.0f);
    x[17] = di_f32_to_bf16(1.0f);
    di_fp4_quant_e4m3(x, 32, 16, p, s);
    assert_int_equal(s[0], 0x01);
    assert_int_equal(s[1], 0x39);
    assert_true(di_e4m3_to_f32(s[1]) == 1.125f);
    assert_int_equal(p[8], di_fp4_pack(7, di_f32_to_e2m1(1.0f / 1.125f)));
    di_fp4_qdq_e4m3(x, 32, 16, y);
    assert_int_equal(y[16], di_f32_to_bf16(6.0f * 1.125f));
    assert_int_equal(y[17], di_f32_to_bf16(1.0f * 1.125f)); /* 0.888… → 1 */
    for (int i = 0; i < 16; i++) assert_int_equal(y[i], 0);
}

/* The QDQ paths round in the value domain (no table); the quantizers produce codes. Both must give
 * the same bf16 values on every input, including groups that mix huge and tiny magnitudes (codes in
 * the subnormal range), exact ties, and odd group sizes (scalar tails). */
static void test_qdq_matches_quant(void **state) {
    (void)state;
    enum { N = 1 << 16 };
    uint16_t *x = malloc(N * 2), *y = malloc(N * 2); /* [N] bf16 */
    uint8_t *q = malloc(N), *s = malloc(N);           /* codes, scales */
    long checked = 0;
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < N; i++) {
            uint32_t r = rng();
            /* exponents spread over ±40 binades around 1, random sign and mantissa */
            uint32_t e = 127u - 40u + (r >> 8) % 81u;
            x[i] = (uint16_t)(((r & 1u) << 15) | (e << 7) | ((r >> 1) & 0x7fu));
            if (r % 97 == 0) x[i] = 0;
        }
        const int groups[4] = {32, 16, 24, 128};
        int group = groups[round];
        di_act_quant_fp8(x, N / group * group, group, q, s);
        di_act_qdq_fp8(x, N / group * group, group, y);
        for (int i = 0; i < N / group * group; i++, checked++)
            assert_int_equal(y[i], di_f32_to_bf16(di_e4m3_to_f32(q[i]) * di_e8m0_to_f32(s[i / group])));
        for (int e4m3 = 0; e4m3 < 2; e4m3++) {
            int n = N / group * group;
            if (e4m3) di_fp4_quant_e4m3(x, n, group, q, s), di_fp4_qdq_e4m3(x, n, group, y);
            else di_fp4_quant_e8m0(x, n, group, q, s), di_fp4_qdq_e8m0(x, n, group, y);
            for (int i = 0; i < n; i++, checked++) {
                uint8_t code = (i & 1) ? di_fp4_odd(q[i / 2]) : di_fp4_even(q[i / 2]);
                float sc = e4m3 ? di_e4m3_to_f32(s[i / group]) : di_e8m0_to_f32(s[i / group]);
                assert_int_equal(y[i], di_f32_to_bf16(di_e2m1_to_f32(code) * sc));
            }
        }
    }
    /* E4M3-scaled FP4 has no special case for inf: amax/6 saturates the scale at 448 and inf/448
     * clamps to 6, as in the reference */
    uint16_t g[16] = {0x7f80, 0xff80, di_f32_to_bf16(1000.0f), di_f32_to_bf16(-3.0f)};
    uint8_t pk[8], sc;
    di_fp4_quant_e4m3(g, 16, 16, pk, &sc);
    di_fp4_qdq_e4m3(g, 16, 16, y);
    assert_int_equal(sc, 0x7e);
    assert_int_equal(pk[0], di_fp4_pack(7, 15));
    assert_true(di_bf16_to_f32(y[0]) == 6.0f * 448.0f);
    assert_true(di_bf16_to_f32(y[1]) == -6.0f * 448.0f);
    assert_true(di_bf16_to_f32(y[2]) == 2.0f * 448.0f); /* 1000/448 = 2.23 → 2 */
    assert_true(di_bf16_to_f32(y[3]) == 0.0f && signbit(di_bf16_to_f32(y[3])));
    tu_report("qdq vs quant+dequant values checked: %ld", checked);
    free(x), free(y), free(q), free(s);
}

/* ---- reference vectors ---- */

typedef struct {
    di_safetensors *st;
} vecs;

static const uint16_t *tensor_u16(di_safetensors *st, const char *name, di_dtype dt, int64_t *numel) {
    const di_tensor_info *t = di_st_find(st, name);
    assert_non_null(t);
    assert_int_equal(t->dtype, dt);
    *numel = di_tensor_numel(t);
    return t->data;
}

static long count_equal_u16(const uint16_t *a, const uint16_t *b, int64_t n) {
    long k = 0;
    for (int64_t i = 0; i < n; i++) k += a[i] == b[i];
    return k;
}

static long count_equal_u8(const uint8_t *a, const uint8_t *b, int64_t n) {
    long k = 0;
    for (int64_t i = 0; i < n; i++) k += a[i] == b[i];
    return k;
}

static void test_reference_act_quant(void **state) {
    di_safetensors *st = ((vecs *)*state)->st;
    int64_t n, nq, ns, nqdq;
    const uint16_t *x = tensor_u16(st, "act_quant.x", DI_BF16, &n);                /* [8, 5120] bf16 */
    const uint8_t *q_ref = (const uint8_t *)tensor_u16(st, "act_quant.q", DI_F8_E4M3, &nq);   /* [8, 5120] */
    const uint8_t *s_ref = (const uint8_t *)tensor_u16(st, "act_quant.s", DI_F8_E8M0, &ns);   /* [8, 160] */
    const uint16_t *qdq_ref = tensor_u16(st, "act_quant.qdq", DI_BF16, &nqdq);     /* [8, 5120] bf16 */
    assert_int_equal(nq, n);
    assert_int_equal(ns, n / 32);
    assert_int_equal(nqdq, n);
    uint8_t *q = malloc((size_t)n), *s = malloc((size_t)ns);
    uint16_t *y = malloc((size_t)n * 2);
    di_act_quant_fp8(x, n, 32, q, s);
    di_act_qdq_fp8(x, n, 32, y);
    long mq = count_equal_u8(q, q_ref, n), ms = count_equal_u8(s, s_ref, ns), my = count_equal_u16(y, qdq_ref, n);
    tu_report("act_quant q codes bit-exact: %ld/%ld", mq, (long)n);
    tu_report("act_quant scales bit-exact: %ld/%ld", ms, (long)ns);
    tu_report("act_quant qdq bit-exact: %ld/%ld", my, (long)n);
    assert_int_equal(mq, n);
    assert_int_equal(ms, ns);
    assert_int_equal(my, n);
    free(q), free(s), free(y);
}

/* qdq against the reference, and quant + dequant against qdq (the packed form is what a cache
 * would store, so it must reproduce the same bf16 values). */
static void check_fp4(di_safetensors *st, const char *xname, const char *qdqname, int group, int e4m3) {
    int64_t n, nqdq;
    const uint16_t *x = tensor_u16(st, xname, DI_BF16, &n);
    const uint16_t *qdq_ref = tensor_u16(st, qdqname, DI_BF16, &nqdq);
    assert_int_equal(nqdq, n);
    uint16_t *y = malloc((size_t)n * 2);        /* [n] bf16 */
    uint8_t *p = malloc((size_t)n / 2);         /* [n/2] packed E2M1 */
    uint8_t *s = malloc((size_t)(n / group));   /* [n/group] E8M0 or e4m3 */
    if (e4m3) di_fp4_qdq_e4m3(x, n, group, y), di_fp4_quant_e4m3(x, n, group, p, s);
    else di_fp4_qdq_e8m0(x, n, group, y), di_fp4_quant_e8m0(x, n, group, p, s);
    long m = count_equal_u16(y, qdq_ref, n), mrt = 0, nonzero = 0;
    for (int64_t i = 0; i < n; i++) {
        uint8_t code = (i & 1) ? di_fp4_odd(p[i / 2]) : di_fp4_even(p[i / 2]);
        float sc = e4m3 ? di_e4m3_to_f32(s[i / group]) : di_e8m0_to_f32(s[i / group]);
        mrt += di_f32_to_bf16(di_e2m1_to_f32(code) * sc) == y[i];
        nonzero += (code & 7) != 0;
    }
    tu_report("%s bit-exact: %ld/%ld", qdqname, m, (long)n);
    assert_int_equal(m, n);
    assert_int_equal(mrt, n);
    assert_true(nonzero > n / 2); /* the vectors exercise real codes, not a sea of zeros */
    free(y), free(p), free(s);
}

static void test_reference_fp4_e8m0(void **state) {
    check_fp4(((vecs *)*state)->st, "fp4_act_quant_e8m0.x", "fp4_act_quant_e8m0.qdq", 32, 0);
}

static void test_reference_fp4_e4m3(void **state) {
    check_fp4(((vecs *)*state)->st, "fp4_act_quant_e4m3.x", "fp4_act_quant_e4m3.qdq", 16, 1);
}

static int open_vectors(void **state) {
    static vecs v;
    di_error err = {0};
    if (di_st_open(tu_data("kernels.safetensors"), &v.st, &err) != DI_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    *state = &v;
    return 0;
}

static int close_vectors(void **state) {
    if (*state) di_st_close(((vecs *)*state)->st);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_e4m3_all_codes),
        cmocka_unit_test(test_e4m3_encoder),
        cmocka_unit_test(test_e2m1),
        cmocka_unit_test(test_e8m0),
        cmocka_unit_test(test_dequant_fp8),
        cmocka_unit_test(test_dequant_fp4),
        cmocka_unit_test(test_act_quant_edges),
        cmocka_unit_test(test_qdq_matches_quant),
        cmocka_unit_test(test_reference_act_quant),
        cmocka_unit_test(test_reference_fp4_e8m0),
        cmocka_unit_test(test_reference_fp4_e4m3),
    };
    return cmocka_run_group_tests(tests, open_vectors, close_vectors);
}
