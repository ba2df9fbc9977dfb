/* The FP8 activation quantizer of one 32-value group as a device function: act_quant32_kernel
 * (cuda_quant.cu) runs it one thread per group, and the fused decode GEMV (cuda_gemv_fp8.cu) runs it on
 * its own copy of the x rows, so both produce the same codes and scales. Same arithmetic as
 * io/formats.c's act_quant (spec model.md §5.2): amax of |bf16| as an integer max of bit patterns (NaN
 * sorts above inf), floored at 1e-4, scale 2^ceil(log2(amax / 448)) as an E8M0 byte; a group whose
 * scale exponent reaches 255 (inf / NaN input) is the NaN group: scale byte 0xFF, every code 0x7F. */
#ifndef DI_BACKEND_CUDA_CUDA_QUANT_CUH
#define DI_BACKEND_CUDA_CUDA_QUANT_CUH

#include "backend/cuda/cuda_common.cuh"

#define FP8_MAX_INV ((float)(1.0 / 448.0))
#define ACT_FP8_AMAX_FLOOR 0x38d1b717u /* f32(1e-4) */

/* w: the group's 32 bf16 values, two per word (value 2i in the low half of w[i]); c: the 32 e4m3
 * codes, four per word (value 4i + j in byte j of c[i]). Returns the E8M0 scale byte. */
static __device__ __forceinline__ uint8_t d_act_quant32(const uint32_t w[16], uint32_t c[8]) {
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 16; i++) m = max(m, max(w[i] & 0x7fffu, (w[i] >> 16) & 0x7fffu));
    const float amax = __uint_as_float(max(m << 16, ACT_FP8_AMAX_FLOOR));
    const uint32_t u = __float_as_uint(__fmul_rn(amax, FP8_MAX_INV));
    const uint32_t e = ((u >> 23) & 0xffu) + ((u & 0x7fffffu) != 0);
    const bool nan_group = e >= 255;
    const float inv_s = __uint_as_float((254u - e) << 23);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        uint32_t word = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t h = (w[2 * i + j / 2] >> (16 * (j & 1))) & 0xffffu;
            const uint32_t b = nan_group ? 0x7fu : d_e4m3_encode(__fmul_rn(d_bf16((uint16_t)h), inv_s));
            word |= b << (8 * j);
        }
        c[i] = word;
    }
    return nan_group ? 0xff : (uint8_t)e;
}

#endif
