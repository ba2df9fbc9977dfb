/* Device-side helpers shared by the CUDA op files (sm_90a): the exact numeric formats of io/formats.c
 * rewritten as __device__ functions, launch/error plumbing, and the libm-matching transcendentals.
 *
 * Exactness contract (what lets tests/cuda/test_cuda_ops.c demand bit equality with the CPU backend):
 *  - Every rounding point of the CPU op is reproduced: products and sums that the CPU rounds
 *    separately are written with __fmul_rn / __fadd_rn (never contracted into an FMA), and the build
 *    passes -fmad=false as a second guard (cuda.mk).
 *  - Reductions follow the CPU op's order where it is fixed (the 16-lane bf16 GEMM, the 8-lane dot
 *    products of the indexer and of sparse attention); where the CPU sums exact terms in f64 (FP8/FP4
 *    block sums) the GPU sums the same exact terms in f64, so the order does not matter.
 *  - expf / log1pf / cos / sin: the CPU calls glibc's expf (≤ 0.502 ulp) and log1pf (~1 ulp), or
 *    rounds the f64 function to f32 (RoPE). The GPU evaluates the f64 function and rounds once to
 *    f32: the correctly rounded result, hence bit-equal to RoPE's, and equal to glibc's expf except on
 *    ~6e-4 of inputs (log1pf: ~3%, measured on glibc 2.36). The tests bound that disagreement; making
 *    it zero needs the CPU ops to round f64 exp/log1p the same way (bench/NOTES-gpu.md). */
#ifndef DI_BACKEND_CUDA_CUDA_COMMON_CUH
#define DI_BACKEND_CUDA_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "backend/backend.h"
#include "util/error.h"
#include "util/log.h"
}

/* ---- host plumbing ---- */

/* Check the launch that just happened (and any earlier asynchronous fault) and turn a CUDA error into
 * a di_error naming the op. */
static inline int di_cuda_launched(const char *op, di_error *err) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return di_error_set(err, DI_ERR_INTERNAL, "cuda %s: %s", op, cudaGetErrorString(e));
    return DI_OK;
}

static inline unsigned di_cuda_blocks(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

/* A kernel switch that is on unless the environment variable `name` equals `off` (DI_CUDA_GEMV=simt …):
 * read once into *state (−1: not read yet; the tests' set_enabled hooks write it directly). */
static inline int di_cuda_env_switch(int *state, const char *name, const char *off) {
    if (*state < 0) {
        const char *v = getenv(name);
        *state = !(v && strcmp(v, off) == 0);
    }
    return *state;
}

/* The current device's SM count (132, the H200's, when the query fails), asked once per file: the
 * persistent and split-K grids size themselves by it. */
static inline int di_cuda_sm_count(void) {
    static int n = 0;
    if (!n) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            n < 1)
            n = 132;
    }
    return n;
}

/* A lane of ops (backend.h side_begin): a stream and its own device scratch, grown on demand (the
 * activation codes of the quantized GEMMs, block maxima of the candidate mask), so ops of two lanes
 * running at once never share scratch. */
typedef struct di_cuda_lane {
    cudaStream_t stream;
    void *ws;
    size_t ws_bytes;
} di_cuda_lane;

/* The backend's private state (backend_cuda.cu). Ops run on `stream` with scratch `ws`: the lane ops are
 * issued to now (the main lane, or the side lane between side_begin and side_end); `parked` is the other
 * one. */
typedef struct di_cuda_impl {
    int device;
    cudaStream_t stream;
    void *ws;
    size_t ws_bytes;
    di_cuda_lane parked;
    cudaEvent_t fork_ev, join_ev; /* the side lane waits for fork_ev; the main lane for join_ev */
    int lane;                     /* 0: between side calls as side_begin expects, 1: after side_begin, 2: after side_end */
    bool forked;                  /* this side_begin … side_join runs the side lane on its own stream */
    int side_mode;                /* DI_CUDA_SIDE: 1 on, 0 off (issue order), 2 / 3 a test delay on the side / main lane */
    long forks, forks_recorded;   /* side lanes run on their own stream, of them inside a stream capture */
} di_cuda_impl;

static inline di_cuda_impl *di_cuda_state(const di_backend *be) { return (di_cuda_impl *)be->impl; }

/* Device scratch of at least `bytes` (contents undefined). Grows by reallocation after a stream sync. */
int di_cuda_workspace(const di_backend *be, size_t bytes, void **out, di_error *err);

/* ---- bf16 ---- */
#include "backend/cuda/cuda_bf16_bits.cuh"

/* ---- float8_e4m3fn / E2M1 / E8M0 (same bit-level algorithms as io/formats.c) ---- */
#define D_F32_448 0x43e00000u
#define D_F32_2M6 0x3c800000u
#define D_F32_2P14 0x46800000u
#define D_F32_INF 0x7f800000u
#define D_F32_6 0x40c00000u
#define D_F32_1 0x3f800000u
#define D_F32_2P22 0x4a800000u

/* |x| (as f32 bits) rounded to nearest even on the e4m3 grid, saturating at 448; NaN stays NaN.
 * Subnormals round through 2^14 + |x| (ulp = 2^-9, one e4m3 subnormal step). */
static __device__ __forceinline__ uint32_t d_e4m3_abs_round_bits(uint32_t u) {
    uint32_t sub = __float_as_uint(__fsub_rn(__fadd_rn(__uint_as_float(u), __uint_as_float(D_F32_2P14)),
                                             __uint_as_float(D_F32_2P14)));
    uint32_t nrm = (u + 0x7ffffu + ((u >> 20) & 1u)) & ~0xfffffu;
    uint32_t r = u < D_F32_2M6 ? sub : nrm;
    r = u >= D_F32_448 ? D_F32_448 : r;
    return u > D_F32_INF ? u : r;
}

static __device__ __forceinline__ uint32_t d_e4m3_abs_code(uint32_t u) {
    uint32_t sub = __float_as_uint(__fadd_rn(__uint_as_float(u), __uint_as_float(D_F32_2P14))) - D_F32_2P14;
    uint32_t nrm = (u + 0x7ffffu + ((u >> 20) & 1u) - (120u << 23)) >> 20;
    uint32_t c = u < D_F32_2M6 ? sub : nrm;
    c = u >= D_F32_448 ? 0x7eu : c;
    return u > D_F32_INF ? 0x7fu : c;
}

static __device__ __forceinline__ uint8_t d_e4m3_encode(float x) {
    uint32_t u = __float_as_uint(x);
    return (uint8_t)(((u >> 24) & 0x80u) | d_e4m3_abs_code(u & 0x7fffffffu));
}

/* The e4m3 value nearest to x (saturating), as f32. */
static __device__ __forceinline__ float d_e4m3_round(float x) {
    uint32_t u = __float_as_uint(x);
    return __uint_as_float((u & 0x80000000u) | d_e4m3_abs_round_bits(u & 0x7fffffffu));
}

/* Exact e4m3 decode by bit assembly; 0x7F/0xFF decode to NaN. */
static __device__ __forceinline__ float d_e4m3_decode(uint8_t code) {
    uint32_t em = code & 0x7fu;
    uint32_t r = em < 8 ? __float_as_uint(__fmul_rn((float)(int)em, 0x1p-9f)) : (em << 20) + (120u << 23);
    r = em == 0x7f ? 0x7fc00000u : r;
    return __uint_as_float(r | ((uint32_t)(code & 0x80u) << 24));
}

static __device__ __forceinline__ uint32_t d_e2m1_abs_round_bits(uint32_t u) {
    uint32_t sub = __float_as_uint(__fsub_rn(__fadd_rn(__uint_as_float(u), __uint_as_float(D_F32_2P22)),
                                             __uint_as_float(D_F32_2P22)));
    uint32_t nrm = (u + 0x1fffffu + ((u >> 22) & 1u)) & ~0x3fffffu;
    uint32_t r = u < D_F32_1 ? sub : nrm;
    r = u >= D_F32_6 ? D_F32_6 : r;
    return u > D_F32_INF ? 0u : r;
}

static __device__ __forceinline__ uint32_t d_e2m1_abs_code(uint32_t u) {
    uint32_t sub = __float_as_uint(__fadd_rn(__uint_as_float(u), __uint_as_float(D_F32_2P22))) - D_F32_2P22;
    uint32_t nrm = (u + 0x1fffffu + ((u >> 22) & 1u) - (126u << 23)) >> 22;
    uint32_t c = u < D_F32_1 ? sub : nrm;
    c = u >= D_F32_6 ? 7u : c;
    return u > D_F32_INF ? 0u : c;
}

static __device__ __forceinline__ uint8_t d_e2m1_encode(float x) {
    uint32_t u = __float_as_uint(x);
    return (uint8_t)(((u >> 28) & 8u) | d_e2m1_abs_code(u & 0x7fffffffu));
}

static __device__ __forceinline__ float d_e2m1_round(float x) {
    uint32_t u = __float_as_uint(x);
    return __uint_as_float((u & 0x80000000u) | d_e2m1_abs_round_bits(u & 0x7fffffffu));
}

/* E2M1 code (low 4 bits) → value (0, .5, 1, 1.5, 2, 3, 4, 6) by bit assembly: exponent e = c>>1 and
 * mantissa bit m = c&1 give (1 + m/2)·2^(e−1), e = 0 the subnormal m/2 (no table: a per-thread array
 * indexed at run time would live in local memory). */
static __device__ __forceinline__ float d_e2m1_decode(uint32_t code) {
    uint32_t e = (code >> 1) & 3u, m = code & 1u;
    uint32_t mag = e ? ((126u + e) << 23) | (m << 22) : (m ? 0x3f000000u : 0u);
    return __uint_as_float(mag | ((code & 8u) << 28));
}

/* 2^(e−127); e = 0 is the f32 subnormal 2^−127, e = 255 NaN (di_e8m0_to_f32). */
static __device__ __forceinline__ float d_e8m0(uint8_t e) {
    if (e == 0) return __uint_as_float(0x00400000u);
    if (e == 255) return __uint_as_float(0x7fc00000u);
    return __uint_as_float((uint32_t)e << 23);
}

/* ---- libm-matching transcendentals (see the file comment) ---- */
static __device__ __forceinline__ float d_expf(float x) { return __double2float_rn(exp((double)x)); }
static __device__ __forceinline__ float d_log1pf(float x) { return __double2float_rn(log1p((double)x)); }

/* ---- asynchronous copies and shared-memory matrix loads (PTX) ---- */
static __device__ __forceinline__ uint32_t d_smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16- / 4-byte global → shared copy (cp.async: the 16-byte form bypasses L1) */
static __device__ __forceinline__ void d_cp_async16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d_smem_addr(dst)), "l"(src) : "memory");
}
/* the same with a shared-space address (a caller that steps addresses as integers) */
static __device__ __forceinline__ void d_cp_async16(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
/* 16 bytes of which the first src_bytes (0 or 16) are read from src, the rest zero-filled: src_bytes 0
 * writes zeros without reading src (rows past the end) */
static __device__ __forceinline__ void d_cp_async16_zfill(void *dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d_smem_addr(dst)), "l"(src), "r"(src_bytes)
                 : "memory");
}
static __device__ __forceinline__ void d_cp_async4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d_smem_addr(dst)), "l"(src) : "memory");
}
static __device__ __forceinline__ void d_cp_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* wait until at most N of this thread's committed groups are still in flight */
template <int N>
static __device__ __forceinline__ void d_cp_wait(void) { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

/* ldmatrix .x4 .b16: lanes 8i … 8i+7 give the row addresses of matrix i (8 rows × 16 bytes); lane l receives
 * bytes 4(l mod 4) … 4(l mod 4)+3 of row l / 4 of matrix i in r[i] */
static __device__ __forceinline__ void d_ldsm_x4(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(d_smem_addr(p)));
}
/* .x2: matrices 0 and 1 (lanes 0 … 15 give the row addresses) */
static __device__ __forceinline__ void d_ldsm_x2(uint32_t r[2], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(d_smem_addr(p)));
}
/* .x4 .trans: each matrix transposed (lane l receives column l / 4's elements 2(l mod 4), 2(l mod 4)+1) */
static __device__ __forceinline__ void d_ldsm_x4_t(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(d_smem_addr(p)));
}

/* ---- warp reductions ---- */
static __device__ __forceinline__ double d_warp_sum_f64(double v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Block-wide f64 sum (blockDim.x a multiple of 32, ≤ 1024); every thread gets the result. `sh` holds
 * 32 doubles. The order differs from the CPU's sequential f64 sum, but the callers round the f64 total
 * to f32 once, so the two agree unless the f64 sums straddle an f32 rounding boundary (~2^-29). */
static __device__ double d_block_sum_f64(double v, double *sh) {
    v = d_warp_sum_f64(v);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    double t = lane < nw ? sh[lane] : 0.0;
    return d_warp_sum_f64(t);
}

#endif
