/* Partial RoPE on interleaved pairs with the reference's f32 frequency table (spec §3.1 RoPE,
 * model.py precompute_freqs_cis / apply_rotary_emb).
 *
 * Numerics reproduced on purpose:
 *  - ω_i = 1 / f32(base^(2i/dim)), every step in f32 (the exponent 2i/dim is exact);
 *  - YaRN mixes as f32(f32(ω/factor)·f32(1 − smooth)) + f32(ω·smooth) with smooth = 1 − ramp —
 *    (1 − smooth) is not always equal to ramp in f32, so the reference's order is kept;
 *  - the angle is the f32 product f32(pos)·ω_i (far from the exact angle at large positions; the
 *    reference table is built that way), then cos/sin of that f32 value;
 *  - the complex product (a + ib)(c + id) = (ac − bd) + i(ad + bc) with separately rounded f32
 *    products, as torch's complex multiply does; the inverse uses the conjugate (c, −d). */
#include <math.h>

#include "backend/cpu/cpu_ops.h"
#include "io/formats.h"

void di_cpu_rope_freqs(const di_rope_params *p, float *freqs) {
    int dim = p->rope_dim, half = dim / 2;
    float base = (float)p->base;
    for (int i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)dim;
        /* f32 power correctly rounded via f64 (exact inputs; powf of glibc agrees) */
        float pw = (float)pow((double)base, (double)e);
        freqs[i] = 1.0f / pw;
    }
    if (p->original_seq_len <= 0) return;
    /* corrected_dim(n) = dim·ln(orig / (n·2π)) / (2·ln base), in f64 like Python's math */
    double two_pi = 2 * M_PI, lb = 2 * log(p->base);
    double c_fast = dim * log((double)p->original_seq_len / (p->beta_fast * two_pi)) / lb;
    double c_slow = dim * log((double)p->original_seq_len / (p->beta_slow * two_pi)) / lb;
    double low = floor(c_fast), high = ceil(c_slow);
    if (low < 0) low = 0;
    if (high > dim - 1) high = dim - 1;
    double span = high - low > 1e-3 ? high - low : 1e-3;
    float fspan = (float)span, flow = (float)low, factor = (float)p->factor;
    for (int i = 0; i < half; i++) {
        float ramp = ((float)i - flow) / fspan;
        if (ramp < 0) ramp = 0;
        if (ramp > 1) ramp = 1;
        float smooth = 1.0f - ramp;
        float a = freqs[i] / factor * (1.0f - smooth);
        float b = freqs[i] * smooth;
        freqs[i] = a + b;
    }
}

void di_cpu_rope_cos_sin(const float *freqs, int n_pairs, int64_t pos, float *cos_out, float *sin_out) {
    float fp = (float)pos;
    for (int i = 0; i < n_pairs; i++) {
        float ang = fp * freqs[i];
        /* correctly rounded f32 cos/sin of the f32 angle */
        cos_out[i] = (float)cos((double)ang);
        sin_out[i] = (float)sin((double)ang);
    }
}

void di_cpu_rope_apply(int64_t n_tok, int n_heads, uint16_t *x, int64_t tok_stride, int64_t head_stride,
                       int rope_off, int n_pairs, const int64_t *pos, const float *freqs, int inverse) {
    float cs[DI_ROPE_MAX_PAIRS], sn[DI_ROPE_MAX_PAIRS]; /* f32 [chunk] cos/sin of one token */
    for (int64_t t = 0; t < n_tok; t++) {
        /* pairs in chunks of DI_ROPE_MAX_PAIRS: each pair is independent, so any n_pairs is rotated
         * in full (the table is computed once per token and chunk, shared by all heads) */
        for (int i0 = 0; i0 < n_pairs; i0 += DI_ROPE_MAX_PAIRS) {
            int np = n_pairs - i0 < DI_ROPE_MAX_PAIRS ? n_pairs - i0 : DI_ROPE_MAX_PAIRS;
            di_cpu_rope_cos_sin(freqs + i0, np, pos[t], cs, sn);
            if (inverse)
                for (int i = 0; i < np; i++) sn[i] = -sn[i];
            for (int h = 0; h < n_heads; h++) {
                uint16_t *v = x + t * tok_stride + h * head_stride + rope_off + 2 * i0; /* bf16 [2·np] */
                for (int i = 0; i < np; i++) {
                    float a = di_bf16_to_f32(v[2 * i]), b = di_bf16_to_f32(v[2 * i + 1]);
                    float ac = a * cs[i], bd = b * sn[i], ad = a * sn[i], bc = b * cs[i];
                    v[2 * i] = di_f32_to_bf16(ac - bd);
                    v[2 * i + 1] = di_f32_to_bf16(ad + bc);
                }
            }
        }
    }
}
