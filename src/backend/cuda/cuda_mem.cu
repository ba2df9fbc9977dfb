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
#include "backend/cuda/cuda_row_codec.cuh"
#include "backend/cuda/cuda_thread.cuh"

/* ---------------- memory ---------------- */

static int cuda_fail(const char *what, cudaError_t e, di_error *err) {
    return di_error_set(err, e == cudaErrorMemoryAllocation ? DI_ERR_NOMEM : DI_ERR_INTERNAL, "cuda %s: %s", what,
                        cudaGetErrorString(e));
}

extern "C" void *di_cuda_mem_alloc(const di_backend *be, size_t bytes, di_error *err) {
    di_cuda_bind_device(di_cuda_state(be)->device);
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
    di_cuda_bind_device(di_cuda_state(be)->device);
    if (!bytes) return DI_OK;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, di_cuda_state(be)->stream);
    return e == cudaSuccess ? DI_OK : cuda_fail("upload", e, err);
}

extern "C" int di_cuda_mem_download(const di_backend *be, void *dst, const void *src, size_t bytes, di_error *err) {
    di_cuda_bind_device(di_cuda_state(be)->device);
    if (!bytes) return DI_OK;
    cudaStream_t st = di_cuda_state(be)->stream;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    return e == cudaSuccess ? DI_OK : cuda_fail("download", e, err);
}

extern "C" int di_cuda_mem_copy(const di_backend *be, void *dst, const void *src, size_t bytes, di_error *err) {
    di_cuda_bind_device(di_cuda_state(be)->device);
    if (!bytes) return DI_OK;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, di_cuda_state(be)->stream);
    return e == cudaSuccess ? DI_OK : cuda_fail("copy", e, err);
}

extern "C" int di_cuda_mem_set(const di_backend *be, void *dst, int byte, size_t bytes, di_error *err) {
    di_cuda_bind_device(di_cuda_state(be)->device);
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
    di_cuda_bind_device(di_cuda_state(be)->device);
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

/* One warp per group g of row r: x bf16 [n, d] → rows [n, rb]. */
__global__ void row_encode_kernel(int codec, const uint16_t *x, int64_t n, int64_t d, int64_t rb, uint8_t *rows) {
    int group = codec == DI_CODEC_FP4_E4M3 ? 16 : 32;
    int64_t gpr = d / group;
    int64_t gi = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (gi >= n * gpr) return;
    int64_t r = gi / gpr, g = gi % gpr;
    d_row_encode_group(codec, x + r * d + g * group, d, g, group, lane, rows + r * rb);
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
    y[e] = d_to_bf16(d_row_decode_value(codec, rows + r * rb, d, j));
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
