/* Tensor-core (wgmma, sm_90a) block-scaled FP8 / MXFP4 GEMMs: the fast path for the linear_fp8 and
 * linear_fp4 slots of backend.h. Numerics and their one difference from the CPU reference are in the
 * header comment of cuda_gemm_wgmma.cu; tests/cuda/test_cuda_gemm_fast.c measures it.
 *
 * All pointers are device pointers. The slot-shaped entry points take the same arguments as
 * di_cuda_linear_fp8 / di_cuda_linear_fp4 (cuda_ops.h) and use the backend's stream and workspace. */
#ifndef DI_BACKEND_CUDA_CUDA_GEMM_WGMMA_H
#define DI_BACKEND_CUDA_CUDA_GEMM_WGMMA_H

#include <stdint.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The backend slots: x bf16 [m, k] is act-quantized (cuda_quant.cu) into the workspace, then one GEMM.
 *   linear_fp8: w e4m3 [n, k], ws E8M0 [ceil(n/32), k/32];  linear_fp4: w packed E2M1 [n, k/2],
 *   ws E8M0 [n, k/32];  y bf16 [m, n].  k % 32 == 0, w 16-byte aligned. */
int di_cuda_linear_fp8_wgmma(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint8_t *w,
                             const uint8_t *ws, int64_t n, uint16_t *y, di_error *err);
int di_cuda_linear_fp4_wgmma(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint8_t *w,
                             const uint8_t *ws, int64_t n, uint16_t *y, di_error *err);

/* The GEMM alone, on already quantized activations (what a fused quantizer or an expert dispatcher
 * hands over): xq e4m3 [m, k], xs E8M0 [m, k/32]; weights as above (fp4 selects the format);
 * y bf16 [m, n]. stream: a cudaStream_t. scratch: device memory, 8-byte aligned, of at least
 * di_cuda_qgemm_wgmma_scratch(m, n, k) bytes, used by decode-sized calls to split K over more CTAs
 * (same bits either way); with less (or NULL) the call runs unsplit. */
size_t di_cuda_qgemm_wgmma_scratch(int64_t m, int64_t n, int64_t k);
int di_cuda_qgemm_wgmma(const uint8_t *xq, const uint8_t *xs, int64_t m, int64_t k, const uint8_t *w,
                        const uint8_t *ws, int fp4, int64_t n, uint16_t *y, void *scratch, size_t scratch_bytes,
                        void *stream, di_error *err);

/* The first (non-persistent, serial wgmma → promote) kernel for every call, with its split-K path:
 * the bit-exact reference of the persistent kernel that di_cuda_qgemm_wgmma runs for unsplit calls.
 * Same arguments as di_cuda_qgemm_wgmma. */
int di_cuda_qgemm_wgmma_v1(const uint8_t *xq, const uint8_t *xs, int64_t m, int64_t k, const uint8_t *w,
                           const uint8_t *ws, int fp4, int64_t n, uint16_t *y, void *scratch, size_t scratch_bytes,
                           void *stream, di_error *err);

/* Grouped MXFP4 expert GEMM (prefill, contiguous layout). One table holds one projection (w1, w3 or
 * w2) of one layer's experts: a TMA map per expert (the checkpoint keeps each expert's weight as its
 * own tensor, so no single map spans them) and the scale pointers, built on the host once and kept in
 * device memory. w[e] packed E2M1 [n, k/2] (16-byte aligned), ws[e] E8M0 [n, k/32] (4-byte aligned):
 * host arrays of device pointers, n_experts ≤ 1024. */
typedef struct di_wgmma_experts di_wgmma_experts;
int di_cuda_wgmma_experts_create(int n_experts, const uint8_t *const *w, const uint8_t *const *ws, int64_t n, int64_t k,
                                 di_wgmma_experts **out, di_error *err);
void di_cuda_wgmma_experts_destroy(di_wgmma_experts *t);

/* y[j][r] = x[r] · W_{j,e}ᵀ for every row r of every expert e, in one launch: xq e4m3 [rows, k] and
 * xs E8M0 [rows, k/32] (act-quantized rows grouped by expert), expert e's rows start[e] .. start[e+1]
 * (start: DEVICE int64 [n_experts + 1], nondecreasing; clamped to [0, rows]); n_w = 1 or 2 tables of
 * equal shape (w1 and w3 share one launch); y[j] bf16 [rows, n] (rows outside every expert's range are
 * left as they were). Same numerics, bit for bit, as di_cuda_qgemm_wgmma on each expert's rows.
 * xq 16-byte, xs 4-byte aligned. stream: a cudaStream_t. DI_ERR_UNSUPPORTED where the persistent kernel
 * cannot run (its register split does not fit what the launch would allocate): loop over the experts then. */
int di_cuda_wgmma_fp4_grouped(const di_wgmma_experts *const *w, uint16_t *const *y, int n_w, const uint8_t *xq,
                              const uint8_t *xs, int64_t rows, const int64_t *start, void *stream, di_error *err);

/* Test hook: the raw f32 result of ONE wgmma k = 32 step with a zero accumulator, the quantity the GEMM
 * scales and accumulates per K block. a e4m3 [64, 32], b e4m3 [128, 32], d f32 [64, 128] with
 * d[i][j] = Σ_k a[i][k]·b[j][k] as the tensor core computes it. */
int di_cuda_wgmma_block_dot(const uint8_t *a, const uint8_t *b, float *d, void *stream, di_error *err);

#ifdef __cplusplus
}
#endif

#endif
