/* Tensor-core sparse attention with the attention sink for Hopper (cuda_attn_fast.cu): the
 * backend.h sparse_attn contract, for the V4.1 shape (64 query heads sharing one 512-wide latent KV
 * head). Other head counts or widths fall back to the scalar kernel (cuda_attn.cu).
 *
 * Numerics against the CPU reference (src/backend/cpu/sparse_attn.c), measured by
 * tests/cuda/test_cuda_attn_fast.c: the online-softmax steps are the reference's (blocks of 64
 * indices in list order, running max from −1e30, bf16-rounded probabilities against the running max,
 * the f32 probability sum in the CPU's 8-lane order, sink added last); the two dot products run on the
 * tensor cores (bf16 products exact, f32 accumulation in the tensor core's order instead of the CPU's
 * 8 strided lanes, and o·α accumulated in the same instruction as Σ p·v). Outputs may differ from the
 * CPU by 1 bf16 ulp on a small fraction of elements; see the test's header for the measured bound.
 *
 * Batch invariance: a query's output depends only on its own q row and index list. Small batches
 * split the 512 output columns over several blocks per query; every split computes the same scores
 * and the same per-column sums, so the bits do not depend on m. */
#ifndef DI_BACKEND_CUDA_CUDA_ATTN_FAST_H
#define DI_BACKEND_CUDA_CUDA_ATTN_FAST_H

#include <math.h>
#include <stdint.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__CUDACC__)
#define DI_FA_FN static __host__ __device__ __forceinline__
#else
#define DI_FA_FN static inline
#endif

/* exp(x) of an f32 x as the f64 function rounded once to f32 — the d_expf of cuda_common.cuh, which
 * every CUDA op uses to match the CPU's expf — but without a branch: CUDA's f64 exp has a slow-path
 * branch per call that keeps the compiler from interleaving the 16 independent exps of a softmax
 * thread, and those serial f64 chains were half of the kernel's time (ncu: 2 warps per scheduler,
 * latency-bound). Here: |x| clamped to 200 (e^±200 rounds to the same f32 0 / inf as e^±∞), k =
 * rint(x·log2 e), r = x − k·ln2 in two Cody–Waite steps (|r| ≤ 0.347, exact hi part), e^r by its
 * degree-12 Taylor polynomial in Horner form (truncation ≤ 1.7e-16 relative), times 2^k. The f64
 * result is within ~3e-16 of e^x, so its f32 rounding equals the correctly rounded f32 unless e^x lies
 * within 3e-16 of an f32 rounding boundary (~1e-8 of inputs; the same holds for CUDA's exp).
 * Host and device evaluate the same IEEE operations, so tests/cuda/test_cuda_attn_fast.c checks this
 * function on the host against expl rounded to f32. */
DI_FA_FN float di_fa_expf(float xf) {
    if (xf != xf) return xf;
    double x = (double)xf;
    x = x < -200.0 ? -200.0 : (x > 200.0 ? 200.0 : x);
    const double k = rint(x * 0x1.71547652b82fep+0);
    double r = fma(k, -0x1.62e42fee00000p-1, x); /* exact: the high part of ln 2 has 32 significant bits */
    r = fma(k, -0x1.a39ef35793c76p-33, r);
    double p = 0x1.1eed8eff8d898p-29; /* 1/12! … 1/2!, 1, 1 */
    p = fma(p, r, 0x1.ae64567f544e4p-26);
    p = fma(p, r, 0x1.27e4fb7789f5cp-22);
    p = fma(p, r, 0x1.71de3a556c734p-19);
    p = fma(p, r, 0x1.a01a01a01a01ap-16);
    p = fma(p, r, 0x1.a01a01a01a01ap-13);
    p = fma(p, r, 0x1.6c16c16c16c17p-10);
    p = fma(p, r, 0x1.1111111111111p-7);
    p = fma(p, r, 0x1.5555555555555p-5);
    p = fma(p, r, 0x1.5555555555555p-3);
    p = fma(p, r, 0.5);
    p = fma(p, r, 1.0);
    p = fma(p, r, 1.0);
    union {
        double d;
        uint64_t u;
    } two_k;
    two_k.u = (uint64_t)((int64_t)k + 1023) << 52; /* |k| ≤ 289: a normal power of two */
    return (float)(p * two_k.d);
}

/* The sparse_attn slot (device pointers; contract in backend.h and cpu_attn.h). */
int di_cuda_sparse_attn_fast(const di_backend *be, const uint16_t *q, int64_t m, int nh, int d,
                             const uint16_t *kv_win, int64_t n_win, const uint16_t *kv_cmp, int64_t n_cmp,
                             const float *sink, const int32_t *idx, int64_t n_idx, float scale, uint16_t *out,
                             di_error *err);

/* The same with the output columns per thread block forced (64, 128, 256 or 512; 0 = choose from m).
 * For the invariance test: every choice must give the same bits. */
int di_cuda_sparse_attn_fast_cols(const di_backend *be, const uint16_t *q, int64_t m, int nh, int d,
                                  const uint16_t *kv_win, int64_t n_win, const uint16_t *kv_cmp, int64_t n_cmp,
                                  const float *sink, const int32_t *idx, int64_t n_idx, float scale, uint16_t *out,
                                  int cols, di_error *err);

#ifdef __cplusplus
}
#endif

#endif
