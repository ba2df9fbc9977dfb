/* Host emulation of the CUDA features cuda_gemm_bf16.cu uses, so that its own source — kernels and host
 * launch logic — runs on a machine without a GPU (built by a C++ compiler with -DDI_CUDA_BF16_EMULATE
 * -ffp-contract=off; tests/emu/test_cuda_gemm_bf16_emu.c drives it against the CPU op).
 *
 * Unlike the sampler's emulation (one thread per block), these kernels exchange values between threads
 * (shuffles, barriers), so a launch runs blockDim.x threads — fibers (ucontext) on one OS thread, cheap
 * to switch — each walking the grid's blocks in the same order; every __syncthreads, every shuffle / vote
 * (write, barrier, read, barrier) and the end of each block is a barrier: the scheduler runs thread 0,
 * 1, ... each up to its next barrier, then starts the next round. That is exact for these kernels
 * because every thread of a block executes the same sequence of barriers, shuffles and votes. Arithmetic
 * intrinsics are the IEEE operations they name (fmaf rounds once). Shared memory: the kernels' extern
 * arrays, defined below as host arrays (one block runs at a time). Not emulated: races inside a barrier
 * interval (the GPU run and compute-sanitizer see those) and warp scheduling. */
#ifndef DI_BACKEND_CUDA_CUDA_GEMM_BF16_EMU_H
#define DI_BACKEND_CUDA_CUDA_GEMM_BF16_EMU_H

#include <math.h>
#include <ucontext.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "backend/backend.h"
#include "util/error.h"
}

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

struct uint4 { uint32_t x, y, z, w; };
struct float4 { float x, y, z, w; };
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
static inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return uint4{a, b, c, d}; }
static inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }

static dim3 threadIdx, blockIdx, gridDim, blockDim;

/* ---- fibers and the barrier ---- */
#define EMU_MAX_THREADS 256
#define EMU_STACK (128 * 1024)
static ucontext_t emu_sched, emu_fib[EMU_MAX_THREADS];
static unsigned emu_cur;                    /* the fiber running now */
static uint32_t emu_slot[EMU_MAX_THREADS];  /* one word per thread of the block (shuffles, votes) */
static inline void __syncthreads(void) { swapcontext(&emu_fib[emu_cur], &emu_sched); }
static inline float __shfl_xor_sync(unsigned, float v, int off) {
    uint32_t u;
    memcpy(&u, &v, 4);
    emu_slot[threadIdx.x] = u;
    __syncthreads();
    u = emu_slot[threadIdx.x ^ (unsigned)off];
    __syncthreads();
    memcpy(&v, &u, 4);
    return v;
}
static inline bool __all_sync(unsigned, bool p) {
    emu_slot[threadIdx.x] = p;
    __syncthreads();
    bool all = true;
    for (unsigned i = threadIdx.x & ~31u; i < (threadIdx.x & ~31u) + 32; i++) all = all && emu_slot[i];
    __syncthreads();
    return all;
}
/* Warp votes and barriers as block-wide rounds: exact where the launch is one warp, or where every warp
 * runs the same sequence of them (the heap pipeline's emulation test launches one warp). */
static inline void __syncwarp(unsigned = 0xffffffffu) { __syncthreads(); }
static inline unsigned __ballot_sync(unsigned, bool p) {
    emu_slot[threadIdx.x] = p;
    __syncthreads();
    unsigned m = 0;
    for (unsigned i = 0; i < 32; i++) m |= (emu_slot[(threadIdx.x & ~31u) + i] ? 1u : 0u) << i;
    __syncthreads();
    return m;
}
static inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
static inline uint32_t emu_shfl_u32(uint32_t u, int src) {
    emu_slot[threadIdx.x] = u;
    __syncthreads();
    u = emu_slot[(threadIdx.x & ~31u) + ((unsigned)src & 31u)];
    __syncthreads();
    return u;
}
static inline int __shfl_sync(unsigned, int v, int src) { return (int)emu_shfl_u32((uint32_t)v, src); }
static inline float __shfl_sync(unsigned, float v, int src) {
    uint32_t u;
    memcpy(&u, &v, 4);
    u = emu_shfl_u32(u, src);
    memcpy(&v, &u, 4);
    return v;
}
static inline bool __any_sync(unsigned, bool p) { return __ballot_sync(0xffffffffu, p) != 0; }
static inline int __syncthreads_and(int p) {
    emu_slot[threadIdx.x] = p != 0;
    __syncthreads();
    int all = 1;
    for (unsigned i = 0; i < blockDim.x; i++) all = all && emu_slot[i];
    __syncthreads();
    return all;
}

/* ---- arithmetic intrinsics: the IEEE operations (no contraction: -ffp-contract=off) ---- */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* cuda_common.cuh's bf16 helpers */
#include "backend/cuda/cuda_bf16_bits.cuh"

/* ---- the runtime and backend plumbing the host code calls ---- */
typedef void *cudaStream_t;
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
template <typename F> static inline cudaError_t cudaFuncSetAttribute(F, int, int) { return cudaSuccess; }
static inline const char *cudaGetErrorString(cudaError_t) { return "emulated"; }

typedef struct di_cuda_impl {
    int device;
    cudaStream_t stream;
} di_cuda_impl;
static di_cuda_impl emu_impl;
static inline di_cuda_impl *di_cuda_state(const di_backend *) { return &emu_impl; }
static inline int di_cuda_launched(const char *, di_error *) { return DI_OK; }
static inline int di_cuda_sm_count(void) { return 132; } /* the H200's, for the dispatch rule */
static inline unsigned di_cuda_blocks(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }
static inline int di_cuda_workspace(const di_backend *, size_t bytes, void **out, di_error *err) {
    static void *ws;
    static size_t have;
    if (have < bytes) {
        free(ws);
        ws = malloc(bytes);
        have = ws ? bytes : 0;
        if (!ws) return di_error_set(err, DI_ERR_NOMEM, "emulated workspace: %zu bytes", bytes);
    }
    *out = ws;
    return DI_OK;
}

/* ---- launches: blockDim.x fibers, each walking every block in grid order ---- */
static void (*emu_body)(void *);
static void *emu_body_arg;
static bool emu_done[EMU_MAX_THREADS];
static void emu_fiber_main(void) {
    for (unsigned z = 0; z < gridDim.z; z++)
        for (unsigned y = 0; y < gridDim.y; y++)
            for (unsigned x = 0; x < gridDim.x; x++) {
                blockIdx = dim3(x, y, z); /* every fiber is in the same block: the end-of-block barrier */
                emu_body(emu_body_arg);
                __syncthreads(); /* the block's shared memory is free for the next one */
            }
    emu_done[emu_cur] = true;
}
template <typename F> static void emu_call(void *f) { (*(F *)f)(); }
template <typename F> static void emu_launch(dim3 grid, unsigned threads, F body) {
    if (threads > EMU_MAX_THREADS) abort(); /* test harness only */
    gridDim = grid, blockDim = dim3(threads, 1, 1);
    emu_body = emu_call<F>, emu_body_arg = &body;
    char *stacks = (char *)malloc((size_t)EMU_STACK * threads);
    if (!stacks) abort();
    for (unsigned t = 0; t < threads; t++) {
        getcontext(&emu_fib[t]);
        emu_fib[t].uc_stack.ss_sp = stacks + (size_t)t * EMU_STACK;
        emu_fib[t].uc_stack.ss_size = EMU_STACK;
        emu_fib[t].uc_link = &emu_sched;
        makecontext(&emu_fib[t], emu_fiber_main, 0);
        emu_done[t] = false;
    }
    for (bool all_done = false; !all_done;) { /* one round: every thread up to its next barrier */
        all_done = true;
        for (unsigned t = 0; t < threads; t++) {
            if (emu_done[t]) continue;
            emu_cur = t, threadIdx = dim3(t, 0, 0);
            swapcontext(&emu_sched, &emu_fib[t]);
            all_done = all_done && emu_done[t];
        }
    }
    free(stacks);
}
#define DI_LAUNCH(kernel, grid, threads, smem, stream, ...) \
    ((void)(stream), emu_launch(dim3(grid), (threads), [&] { kernel(__VA_ARGS__); }))

#endif
