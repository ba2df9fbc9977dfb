/* Numeric formats of the DeepSeek-V4.1 checkpoint and of its simulated activation/cache
 * quantization (spec model.md §2.2, §4.1, §5.2). Everything here is exact: decoders are table or
 * bit manipulations, encoders round to nearest even exactly as the reference quantizers do, and the
 * QDQ helpers reproduce the reference's bf16 outputs bit for bit (checked against
 * tests/data/kernels.safetensors).
 *
 * Storage conventions:
 *  - bf16 values travel as uint16_t bit patterns.
 *  - FP8 weights: e4m3fn codes [rows, cols] + E8M0 scales [ceil(rows/B), ceil(cols/B)], B = 32.
 *  - FP4 weights: packed bytes [rows, cols/2] (low nibble = even column, high nibble = odd column)
 *    + E8M0 scales [rows, cols/32]. */
#ifndef DI_IO_FORMATS_H
#define DI_IO_FORMATS_H

#include <stdint.h>
#include <string.h>

/* ---- bfloat16 ---- */
static inline float di_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even; NaN stays NaN (quiet), ±inf stays ±inf. */
static inline uint16_t di_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float di_round_bf16(float f) { return di_bf16_to_f32(di_f32_to_bf16(f)); }

/* ---- decode tables ----
 * The value of every e4m3fn code (NaN for 0x7F/0xFF) and of every E2M1 code: the one definition
 * that the scalar decoders below, the cache reads and the weight dequantizers all use. Immutable,
 * so no initialisation and no thread-safety concern. */
extern const float di_e4m3_values[256];
extern const float di_e2m1_values[16];

/* ---- float8_e4m3fn: bias 7, no infinities, 0x7F/0xFF = NaN, max finite ±448 ---- */
static inline float di_e4m3_to_f32(uint8_t code) { return di_e4m3_values[code]; }
/* Round to nearest even; |x| beyond 448 (and ±inf) saturates to ±448 (the reference clamps before
 * casting); NaN → 0x7F with the input's sign bit (0xFF for a negative NaN), as torch's cast does. */
uint8_t di_f32_to_e4m3(float x);

/* ---- E8M0 (unsigned power-of-two scale) ---- */
/* 2^(e−127). e = 0 decodes to 2^−127 (a float32 subnormal: exponent field 0); e = 255 is NaN.
 * Inline: it sits in per-block loops of the dequantizers. */
static inline float di_e8m0_to_f32(uint8_t e) {
    uint32_t u = e == 0 ? 0x00400000u : e == 255 ? 0x7fc00000u : (uint32_t)e << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* Scale byte of 2^k for k in [−127, 127]. */
static inline uint8_t di_e8m0_from_exp(int k) { return (uint8_t)(k + 127); }

/* ---- E2M1 (FP4): code bit 3 = sign; magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 ---- */
static inline float di_e2m1_to_f32(uint8_t code) { return di_e2m1_values[code & 15]; } /* low 4 bits */
/* Round to nearest even on the E2M1 grid (ties 0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4,
 * 5→4), saturating at ±6; the sign of zero is kept. NaN → ±0, like the reference's midpoint
 * comparisons. */
uint8_t di_f32_to_e2m1(float x);
static inline uint8_t di_fp4_pack(uint8_t even, uint8_t odd) { return (uint8_t)((even & 15) | (odd << 4)); }
static inline uint8_t di_fp4_even(uint8_t b) { return b & 15; }
static inline uint8_t di_fp4_odd(uint8_t b) { return b >> 4; }

/* ---- weight dequantization (exact in f32: code × power of two) ---- */
/* Rows [row0, row0+nrows) of an FP8 block-scaled weight [rows, cols] with block size `block`
 * (scales [ceil(rows/block), ceil(cols/block)]) into out[nrows, cols] f32. */
void di_dequant_fp8_rows(const uint8_t *w, const uint8_t *scale, int64_t rows, int64_t cols, int block,
                         int64_t row0, int64_t nrows, float *out);
/* Rows of a packed FP4 weight with logical shape [rows, cols], cols % 32 == 0 (bytes [rows, cols/2],
 * E8M0 scales [rows, cols/32]) into out[nrows, cols] f32. */
void di_dequant_fp4_rows(const uint8_t *w, const uint8_t *scale, int64_t rows, int64_t cols, int64_t row0,
                         int64_t nrows, float *out);

/* ---- activation quantization (reference act_quant / fp4_act_quant) ----
 * All operate on one contiguous vector of n bf16 values split into groups of `group` (n % group == 0;
 * group even for the FP4 variants). amax = max|x| of the group in f32. Power-of-two scales follow
 * the kernels' fast_round_scale: s = 2^ceil(log2(f32(amax · f32(1/MAX)))), the ceil read from the
 * product's bits. Dividing by a power of two is exact, so only the e4m3/e2m1 rounding loses
 * information. A group holding inf or NaN has no finite power-of-two scale: it gets scale byte 0xFF
 * (E8M0 NaN), NaN codes (e4m3) or zero codes (e2m1), and dequantizes to NaN. */

/* FP8 e4m3 with power-of-two E8M0 scales: amax floored at f32(1e-4), MAX = 448,
 * q = e4m3_rne(clamp(x / s, ±448)). q[n], scale[n/group]. */
void di_act_quant_fp8(const uint16_t *x, int64_t n, int group, uint8_t *q, uint8_t *scale);
/* The same, returning bf16(e4m3(x/s)·s). out may alias x. */
void di_act_qdq_fp8(const uint16_t *x, int64_t n, int group, uint16_t *out);

/* FP4 e2m1 with power-of-two E8M0 scales (index keys/queries; group 32): amax floored at 6·2^−126,
 * MAX = 6, q = e2m1_rne(clamp(x / s, ±6)). packed[n/2], scale[n/group]. */
void di_fp4_quant_e8m0(const uint16_t *x, int64_t n, int group, uint8_t *packed, uint8_t *scale);
void di_fp4_qdq_e8m0(const uint16_t *x, int64_t n, int group, uint16_t *out);

/* FP4 e2m1 with E4M3 (not power-of-two) scales (compressed KV; group 16, §4.1):
 * amax = max(max|x|, 6·2^−9); s = e4m3_rne_satfinite(f32(amax / 6)); q = e2m1_rne(clamp(f32(x / s), ±6));
 * dequantized value bf16(f32(e2m1(q) · s)). inf/NaN follow the reference (no special case).
 * packed[n/2], scale[n/group] as e4m3 codes. */
void di_fp4_quant_e4m3(const uint16_t *x, int64_t n, int group, uint8_t *packed, uint8_t *scale);
void di_fp4_qdq_e4m3(const uint16_t *x, int64_t n, int group, uint16_t *out);

#endif
