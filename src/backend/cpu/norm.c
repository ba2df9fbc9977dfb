/* RMSNorm (spec §3.1): out = bf16(f32(w) · (x · 1/sqrt(mean(x²) + eps))).
 * The reference squares in f32 and reduces with torch's f32 sum; summing those f32 squares in f64 and
 * rounding once gives the value any f32 summation order approximates best. rsqrt is 1/sqrt (torch's
 * CPU kernel divides by a correctly rounded square root). The scaling order — x·r first, then ·w — is
 * the reference's. */
#include <math.h>

#include "backend/cpu/cpu_ops.h"
#include "io/formats.h"

void di_cpu_rmsnorm(int64_t M, int64_t D, const uint16_t *x, int64_t ldx, const uint16_t *w, float eps,
                    uint16_t *y, int64_t ldy) {
    for (int64_t m = 0; m < M; m++) {
        const uint16_t *xr = x + m * ldx;
        uint16_t *yr = y + m * ldy;
        double ss = 0;
        for (int64_t i = 0; i < D; i++) {
            float v = di_bf16_to_f32(xr[i]);
            float sq = v * v; /* x.square() is an f32 tensor in the reference */
            ss += sq;
        }
        float var = (float)ss / (float)D;
        float r = 1.0f / sqrtf(var + eps);
        for (int64_t i = 0; i < D; i++) {
            float v = di_bf16_to_f32(xr[i]) * r;
            yr[i] = di_f32_to_bf16(di_bf16_to_f32(w[i]) * v);
        }
    }
}
