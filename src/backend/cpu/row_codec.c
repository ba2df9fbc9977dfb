/* Cache row codecs on the host (backend.h di_row_codec): the quantizers of io/formats.h per row, and
 * the decode bf16(f32(code) · f32(scale)) through its decode tables. The CPU backend's row_encode /
 * row_decode and the host-memory caches (model/cache_rows.c) both use these, so there is one
 * definition of each compact form on the host; the CUDA kernels are tested bit for bit against it. */
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "io/formats.h"

void di_cpu_row_encode(di_row_codec codec, const uint16_t *x, int64_t d, uint8_t *row) {
    int g = di_row_codec_group(codec);
    switch (codec) {
    case DI_CODEC_FP8_E8M0: di_act_quant_fp8(x, d, g, row, row + d); break;
    case DI_CODEC_FP4_E4M3: di_fp4_quant_e4m3(x, d, g, row, row + d / 2); break;
    case DI_CODEC_FP4_E8M0: di_fp4_quant_e8m0(x, d, g, row, row + d / 2); break;
    }
}

void di_cpu_row_decode(di_row_codec codec, const uint8_t *row, int64_t d, uint16_t *y) {
    int g = di_row_codec_group(codec);
    if (codec == DI_CODEC_FP8_E8M0) {
        const uint8_t *scale = row + d;
        for (int64_t j = 0; j < d / g; j++) {
            float s = di_e8m0_to_f32(scale[j]);
            for (int64_t i = j * g; i < (j + 1) * g; i++) y[i] = di_f32_to_bf16(di_e4m3_values[row[i]] * s);
        }
        return;
    }
    const uint8_t *scale = row + d / 2;
    for (int64_t j = 0; j < d / g; j++) {
        float s = codec == DI_CODEC_FP4_E4M3 ? di_e4m3_values[scale[j]] : di_e8m0_to_f32(scale[j]);
        for (int64_t i = j * g; i < (j + 1) * g; i += 2) {
            uint8_t b = row[i / 2];
            y[i] = di_f32_to_bf16(di_e2m1_values[di_fp4_even(b)] * s);
            y[i + 1] = di_f32_to_bf16(di_e2m1_values[di_fp4_odd(b)] * s);
        }
    }
}
