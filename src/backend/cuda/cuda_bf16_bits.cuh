/* bf16 bit helpers of the CUDA kernels, also compiled for the host by the emulation harness
 * (cuda_gemm_bf16_emu.h), which supplies __uint_as_float / __float_as_uint and the qualifiers. Included
 * by cuda_common.cuh. */
#ifndef DI_CUDA_BF16_BITS_CUH
#define DI_CUDA_BF16_BITS_CUH

static __device__ __forceinline__ float d_bf16(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* Round to nearest even; NaN stays NaN (quiet) — di_f32_to_bf16 bit for bit. */
static __device__ __forceinline__ uint16_t d_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static __device__ __forceinline__ float d_round_bf16(float f) { return d_bf16(d_to_bf16(f)); }

/* bf16 bits h whose product with any other such value is exact in f32: zero, inf/NaN, or a finite
 * magnitude in [2^-63, 2^63) (exponent field 64 … 189). For two such x, w the product x·w has at most 16
 * significant bits and, when finite and nonzero, lies in [2^-126, 2^126): fl(x·w) = x·w, so
 * fl(fl(x·w) + a) = fmaf(x, w, a) for every a (±0, inf and NaN included; an inf or NaN operand gives
 * the same inf / NaN both ways). The exact kernels take one FFMA per term where their operands pass. */
static __device__ __forceinline__ bool d_bf16_fma_safe(uint32_t h) {
    const uint32_t a = h & 0x7fffu;
    return a == 0 || a >= 0x7f80u || a - 0x2000u < 0x3f00u;
}

#endif
