/* The cache row codecs' device code (backend.h di_row_codec), shared by cuda_mem.cu's per-row kernels
 * (row_encode / row_decode: rows at a stride or an id list) and cuda_rows.cu's batched ones (rows at a
 * list of addresses): one source for the encoders' amax / scale arithmetic (io/formats.c's, as in
 * cuda_quant.cu) and the decoders' bf16(f32(code) · f32(scale)), so the two paths give the same bits.
 * Include after cuda_common.cuh. */
#ifndef DI_CUDA_ROW_CODEC_CUH
#define DI_CUDA_ROW_CODEC_CUH

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

/* One warp (all 32 lanes, none returned early) encodes group g of a row of d values — xg: its `group`
 * bf16 values — into the packed row `row` (backend.h di_row_codec layout). */
static __device__ __forceinline__ void d_row_encode_group(int codec, const uint16_t *xg, int64_t d, int64_t g, int group,
                                                          int lane, uint8_t *row) {
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

/* Value j of the packed row `row` of d values, as the f32 product the caller rounds to bf16. */
static __device__ __forceinline__ float d_row_decode_value(int codec, const uint8_t *row, int64_t d, int64_t j) {
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
    return v;
}

/* host side: the codec and shape checks of every row-codec entry point */
static inline int codec_check(const char *op, di_row_codec codec, int64_t n, int64_t d, di_error *err) {
    if (codec < DI_CODEC_FP8_E8M0 || codec > DI_CODEC_FP4_E8M0 || n < 0 || d <= 0 || d % di_row_codec_group(codec))
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: codec %d, %lld rows of %lld values", op, (int)codec,
                            (long long)n, (long long)d);
    return DI_OK;
}

#endif
