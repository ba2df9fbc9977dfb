/* Exact bf16 × bf16 GEMMs with f32 accumulation on the GPU (linear_bf16, linear_f32, linear_grouped_bf16):
 * a register-tiled kernel for prefill and a K-streaming GEMV for decode, both bit-identical to
 * src/backend/cpu/linear_bf16.c. The arithmetic argument is in cuda_gemm_bf16.cu's header comment;
 * tests/cuda/test_cuda_gemm_bf16.c checks every path against the CPU on the GPU,
 * tests/emu/test_cuda_gemm_bf16_emu.c runs the kernel source itself on the host (cuda_gemm_bf16_emu.h)
 * and tests/test_cuda_bf16_emu.c is a plain-C replica of the per-thread order. backend_cuda.cu registers them (DI_CUDA_BF16=old
 * keeps cuda_gemm.cu's kernels, DI_CUDA_BF16=nofma these kernels without the FMA fast path). */
#ifndef DI_BACKEND_CUDA_CUDA_GEMM_BF16_H
#define DI_BACKEND_CUDA_CUDA_GEMM_BF16_H

#include <stdint.h>

#include "backend/backend.h"
#include "util/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which kernel runs (tests force each one at every M). */
typedef enum di_bgemm_path {
    DI_BGEMM_AUTO = 0,      /* GEMV where di_bgemm_auto_gemv says so, else the tiled kernel with the FMA fast path */
    DI_BGEMM_AUTO_NOFMA,    /* the same split, tiled kernel always multiply-then-add */
    DI_BGEMM_GEMV,          /* the decode kernel at any M */
    DI_BGEMM_TILED,         /* the tiled kernel, FMA fast path where the range check allows it */
    DI_BGEMM_TILED_NOFMA,   /* the tiled kernel, always multiply-then-add */
} di_bgemm_path;

/* Rows (tokens) up to which the decode kernel is always used; see cuda_gemm_bf16.cu. */
#define DI_BGEMV_MAX_M 16
/* Rows up to which the decode kernel also takes calls whose tiled grid (64 × 32 outputs per block) would
 * not give every SM a block: the batch-64 router (N 384), indexer weights (N 32) and compressors
 * (N 512). The tiled kernel then runs a few blocks of 41 K-term chains per thread; the GEMV spreads the
 * same chains over ≥ 2 blocks per SM (both kernels are exact: the choice changes no bit). */
#define DI_BGEMV_GRID_MAX_M 1024

/* Whether the automatic paths take the GEMV for an [m × n] output in `groups` groups on `sms` SMs. */
static inline int di_bgemm_auto_gemv(int64_t m, int64_t n, int groups, int sms) {
    if (m <= DI_BGEMV_MAX_M) return 1;
    const int64_t tiles = (m + 63) / 64 * ((n + 31) / 32) * groups;
    return m <= DI_BGEMV_GRID_MAX_M && tiles < sms;
}

/* y = x · Wᵀ over `groups` independent GEMMs (gridDim.z): group z reads x + z·gx, w + z·gw, writes
 * y + z·gy. x bf16 [m, ldx], w bf16 [n, ldw] per group; exactly one of y16 (bf16) / y32 (f32) [m, ldy].
 * The FMA pre-pass (tiled paths) takes m·groups + n·groups bytes of the backend workspace. */
int di_cuda_bgemm(const di_backend *be, const char *op, const uint16_t *x, int64_t ldx, const uint16_t *w,
                  int64_t ldw, int64_t m, int64_t n, int64_t k, uint16_t *y16, float *y32, int64_t ldy, int groups,
                  int64_t gx, int64_t gw, int64_t gy, di_bgemm_path path, di_error *err);

/* flag[r] = 1 when every element of bf16 row r (p + r·ld, k elements; rows r < `rows`) is zero, inf/NaN or
 * of magnitude in [2^-63, 2^63) (d_bf16_fma_safe: products of such values are exact in f32), else 0; one
 * launch on the backend's stream (the FMA pre-pass of the tiled GEMM, also the sparse attention's key rows). */
int di_cuda_bf16_fma_flags(const di_backend *be, const uint16_t *p, int64_t rows, int64_t ld, int64_t k, uint8_t *flag,
                           di_error *err);

/* The backend slots (contracts in backend.h). */
int di_cuda_linear_bf16_v2(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w,
                           int64_t n, uint16_t *y, di_error *err);
int di_cuda_linear_f32_v2(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w,
                          int64_t n, float *y, di_error *err);
int di_cuda_linear_grouped_bf16_v2(const di_backend *be, const uint16_t *x, int64_t m, int g, int64_t k,
                                   const uint16_t *w, int64_t r, uint16_t *y, di_error *err);
/* the same without the FMA fast path (DI_CUDA_BF16=nofma) */
int di_cuda_linear_bf16_v2_nofma(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w,
                                 int64_t n, uint16_t *y, di_error *err);
int di_cuda_linear_f32_v2_nofma(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w,
                                int64_t n, float *y, di_error *err);
int di_cuda_linear_grouped_bf16_v2_nofma(const di_backend *be, const uint16_t *x, int64_t m, int g, int64_t k,
                                         const uint16_t *w, int64_t r, uint16_t *y, di_error *err);

#ifdef __cplusplus
}
#endif

#endif
