/* Backend memory on the device (backend.h "memory" slots), the cache row codecs and the stream mean.
 *
 * Memory is stream-ordered (cudaMallocAsync / cudaFreeAsync on the backend's stream): a pass allocates
 * and frees its scratch per block without a device synchronisation, and a block freed after the ops
 * that read it is reused only by ops issued later. Uploads from pageable host memory return once the
 * host buffer has been staged (CUDA's rule for pageable H2D copies); downloads synchronise the stream.
 *
 * Row codecs: one warp per quantization group, the bit-level encoders of cuda_common.cuh with the amax
 * and scale arithmetic of io/formats.c (the same as cuda_quant.cu), writing the packed row layout of
 * backend.h di_row_codec; decoding is one thread per value, bf16(f32(code) · f32(scale)). */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

/* ---------------- memory ---------------- */

static int cuda_fail(const char *what, cudaError_t e, di_error *err) {
    return di_error_set(err, e == cudaErrorMemoryAllocation ? DI_ERR_NOMEM : DI_ERR_INTERNAL, "cuda %s: %s", what,
                        cudaGetErrorString(e));
}

extern "C" void *di_cuda_mem_alloc(const di_backend *be, size_t bytes, di_error *err) {
    cudaStream_t st = di_cuda_state(be)->stream;
    void *p = NULL;
    size_t n = bytes ? (bytes + 63) / 64 * 64 : 64; /* cudaMallocAsync blocks are 256-byte aligned */
    cudaError_t e = cudaMallocAsync(&p, n, st);
    if (e == cudaSuccess) e = cudaMemsetAsync(p, 0, n, st);
    if (e != cudaSuccess) {
        cudaGetLastError();
        if (p) cudaFreeAsync(p, st);
        cuda_fail("alloc", e, err);
        return NULL;
    }
    return p;
}

extern "C" void di_cuda_mem_free(const di_backend *be, void *p) {
    if (p) cudaFreeAsync(p, di_cuda_state(be)->stream);
}

extern "C" int di_cuda_mem_upload(const di_backend *be, void *dst, const void *src, size_t bytes, di_error *err) {
    if (!bytes) return DI_OK;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, di_cuda_state(be)->stream);
    return e == cudaSuccess ? DI_OK : cuda_fail("upload", e, err);
}

extern "C" int di_cuda_mem_download(const di_backend *be, void *dst, const void *src, size_t bytes, di_error *err) {
    if (!bytes) return DI_OK;
    cudaStream_t st = di_cuda_state(be)->stream;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    return e == cudaSuccess ? DI_OK : cuda_fail("download", e, err);
}

extern "C" int di_cuda_mem_copy(const di_backend *be, void *dst, const void *src, size_t bytes, di_error *err) {
    if (!bytes) return DI_OK;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, di_cuda_state(be)->stream);
    return e == cudaSuccess ? DI_OK : cuda_fail("copy", e, err);
}

extern "C" int di_cuda_mem_set(const di_backend *be, void *dst, int byte, size_t bytes, di_error *err) {
    if (!bytes) return DI_OK;
    cudaError_t e = cudaMemsetAsync(dst, byte, bytes, di_cuda_state(be)->stream);
    return e == cudaSuccess ? DI_OK : cuda_fail("memset", e, err);
}

/* Read-only host memory (the mmapped Engram tables) registered and mapped into the device's address
 * space, so the lookup reads only the rows it needs over PCIe/C2C. Where registration is refused (a
 * mapping the driver cannot pin), the bytes are copied to device memory instead; unmap tells the two
 * apart by comparing the view with the host pointer's device alias. */
extern "C" int di_cuda_mem_map_host(const di_backend *be, const void *host, size_t bytes, const void **view,
                                    di_error *err) {
    *view = NULL;
    if (!bytes) bytes = 1;
    cudaError_t e = cudaHostRegister((void *)host, bytes, cudaHostRegisterMapped | cudaHostRegisterReadOnly);
    if (e == cudaSuccess) {
        void *d = NULL;
        if (cudaHostGetDevicePointer(&d, (void *)host, 0) == cudaSuccess) {
            *view = d;
            return DI_OK;
        }
        cudaHostUnregister((void *)host);
    }
    cudaGetLastError(); /* clear the refusal */
    /* visible: the memory plan counted these bytes as host-resident */
    DI_WARN("cuda backend: cannot map %zu bytes of host memory (%s); copying them to device memory", bytes,
            cudaGetErrorString(e));
    void *d = di_cuda_mem_alloc(be, bytes, err);
    if (!d) return err ? err->code : DI_ERR_NOMEM;
    int rc = di_cuda_mem_upload(be, d, host, bytes, err);
    if (rc) {
        di_cuda_mem_free(be, d);
        return rc;
    }
    *view = d;
    return DI_OK;
}

extern "C" void di_cuda_mem_unmap_host(const di_backend *be, const void *host, const void *view) {
    if (!view) return;
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, view) == cudaSuccess && a.type == cudaMemoryTypeDevice) {
        di_cuda_mem_free(be, (void *)view);
        return;
    }
    cudaGetLastError();
    cudaHostUnregister((void *)host);
}

/* ---------------- cache row codecs ---------------- */

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

/* One warp per group g of row r: x bf16 [n, d] → rows [n, rb]. */
__global__ void row_encode_kernel(int codec, const uint16_t *x, int64_t n, int64_t d, int64_t rb, uint8_t *rows) {
    int group = codec == DI_CODEC_FP4_E4M3 ? 16 : 32;
    int64_t gpr = d / group;
    int64_t gi = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (gi >= n * gpr) return;
    int64_t r = gi / gpr, g = gi % gpr;
    const uint16_t *xg = x + r * d + g * group;
    uint8_t *row = rows + r * rb;
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

__global__ void row_decode_kernel(int codec, const uint8_t *rows, const int32_t *ids, int64_t n, int64_t d, int64_t rb,
                                  uint16_t *y) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n * d) return;
    int64_t i = e / d, j = e % d;
    int64_t r = ids ? ids[i] : i;
    if (r < 0) {
        y[e] = 0;
        return;
    }
    const uint8_t *row = rows + r * rb;
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
    y[e] = d_to_bf16(v);
}

static int codec_check(const char *op, di_row_codec codec, int64_t n, int64_t d, di_error *err) {
    if (codec < DI_CODEC_FP8_E8M0 || codec > DI_CODEC_FP4_E8M0 || n < 0 || d <= 0 || d % di_row_codec_group(codec))
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: codec %d, %lld rows of %lld values", op, (int)codec,
                            (long long)n, (long long)d);
    return DI_OK;
}

extern "C" int di_cuda_row_encode(const di_backend *be, di_row_codec codec, const uint16_t *x, int64_t n, int64_t d,
                                  uint8_t *rows, di_error *err) {
    int rc = codec_check("row_encode", codec, n, d, err);
    if (rc || n == 0) return rc;
    int64_t groups = n * (d / di_row_codec_group(codec));
    const int warps = 8;
    row_encode_kernel<<<di_cuda_blocks(groups, warps), warps * 32, 0, di_cuda_state(be)->stream>>>(
        (int)codec, x, n, d, di_row_codec_bytes(codec, d), rows);
    return di_cuda_launched("row_encode", err);
}

extern "C" int di_cuda_row_decode(const di_backend *be, di_row_codec codec, const uint8_t *rows, const int32_t *ids,
                                  int64_t n, int64_t d, uint16_t *y, di_error *err) {
    int rc = codec_check("row_decode", codec, n, d, err);
    if (rc || n == 0) return rc;
    row_decode_kernel<<<di_cuda_blocks(n * d, 256), 256, 0, di_cuda_state(be)->stream>>>(
        (int)codec, rows, ids, n, d, di_row_codec_bytes(codec, d), y);
    return di_cuda_launched("row_decode", err);
}

/* ---------------- stream mean ---------------- */

__global__ void stream_mean_kernel(const uint16_t *x, int64_t m, int hc, int64_t d, uint16_t *y, int64_t ldy) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= m * d) return;
    int64_t t = e / d, j = e % d;
    float s = 0.0f;
    for (int k = 0; k < hc; k++) s = __fadd_rn(s, d_bf16(x[(t * hc + k) * d + j]));
    y[t * ldy + j] = d_to_bf16(__fdiv_rn(s, (float)hc));
}

extern "C" int di_cuda_stream_mean(const di_backend *be, const uint16_t *x, int64_t m, int hc, int64_t d, uint16_t *y,
                                   int64_t ldy, di_error *err) {
    if (hc < 1 || d < 1 || ldy < d || m < 0)
        return di_error_set(err, DI_ERR_INVALID, "cuda stream_mean: %d streams of %lld, output stride %lld", hc,
                            (long long)d, (long long)ldy);
    if (m == 0) return DI_OK;
    stream_mean_kernel<<<di_cuda_blocks(m * d, 256), 256, 0, di_cuda_state(be)->stream>>>(x, m, hc, d, y, ldy);
    return di_cuda_launched("stream_mean", err);
}
