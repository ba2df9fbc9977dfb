/* Helpers shared by the CUDA test binaries (tests/cuda/test_cuda_*.c): a fatal exit, checks of CUDA
 * runtime and backend calls, checked host allocation, device buffers through the runtime, and the
 * xorshift64* stream each test draws its inputs from (every test keeps its own state and seed, so its
 * inputs are the ones it always had). Header-only: every binary is one translation unit. */
#ifndef DI_TESTS_CUDA_TESTUTIL_H
#define DI_TESTS_CUDA_TESTUTIL_H

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Run by die() before it exits (a test that prints its pass / fail counts last sets it). */
static void (*ct_on_die)(void);

static inline void die(const char *what, const char *msg) {
    fprintf(stderr, "FATAL %s: %s\n", what, msg);
    if (ct_on_die) ct_on_die();
    exit(2);
}

/* A CUDA runtime call that must succeed. */
#define CU(call)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) die(#call, cudaGetErrorString(e_));                                                     \
    } while (0)

/* A deepinfer call that must return DI_OK; the test declares `static di_error g_err` (the call's error). */
#define RUN(call)                                                                                                      \
    do {                                                                                                               \
        if ((call) != DI_OK) die(#call, g_err.msg);                                                                    \
    } while (0)

static inline void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die("malloc", "out of memory");
    return p;
}

/* A device copy of h[0, n) through the runtime. Uploads end with a device synchronisation: the
 * backend's non-blocking stream does not wait for the legacy default stream, and a pageable cudaMemcpy
 * may return before the data has landed (seen: without it, a kernel read a recycled buffer's previous
 * contents). */
static inline void *dup_dev(const void *h, size_t n) {
    void *d;
    CU(cudaMalloc(&d, n ? n : 1));
    if (n) CU(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    CU(cudaDeviceSynchronize());
    return d;
}

/* n device bytes of 0xA5: outputs a kernel failed to write show up as mismatches. */
static inline void *dev_poisoned(size_t n) {
    void *d;
    CU(cudaMalloc(&d, n ? n : 1));
    CU(cudaMemset(d, 0xA5, n ? n : 1));
    CU(cudaDeviceSynchronize());
    return d;
}

/* A device buffer's n bytes in a fresh host buffer, once the whole device is idle. */
static inline void *ct_down(const void *d, size_t n) {
    void *h = xmalloc(n);
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
    return h;
}

/* bf16 NaN (exponent all ones, mantissa not zero) */
static inline int ct_bf16_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }
/* bf16 outputs of a and b [n] that differ; nan_class: a NaN equals any NaN (payloads differ between the
 * GPU's canonical NaN and the CPU's) */
static inline int64_t ct_bf16_diff(const uint16_t *a, const uint16_t *b, int64_t n, int nan_class) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += nan_class && (ct_bf16_nan(a[i]) || ct_bf16_nan(b[i])) ? !(ct_bf16_nan(a[i]) && ct_bf16_nan(b[i]))
                                                                      : a[i] != b[i];
    return bad;
}

/* xorshift64* on the caller's state; uniform in [0, 1) from its top 53 bits; a normal deviate by
 * Box-Muller from two uniforms drawn in that order. */
static inline uint64_t ct_xorshift(uint64_t *s) {
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}
/* a random e4m3 code other than the NaN codes 0x7F / 0xFF */
static inline uint8_t ct_e4m3_code(uint64_t *s) {
    for (;;) {
        const uint8_t c = (uint8_t)ct_xorshift(s);
        if ((c & 0x7f) != 0x7f) return c;
    }
}
static inline double ct_unif(uint64_t *s) { return (double)(ct_xorshift(s) >> 11) * 0x1p-53; }
static inline double ct_gauss(uint64_t *s) {
    double u = ct_unif(s), v = ct_unif(s);
    return sqrt(-2 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

/* Best per-call time (ms) of 5 batches of R calls of `call` (r = 0 … R−1 the copy index) on stream st,
 * timed by the caller's events ev0 / ev1. */
#define BATCH(out, R, call)                                                             \
    do {                                                                                \
        (out) = 1e30;                                                                   \
        for (int rep_ = 0; rep_ < 5; rep_++) {                                          \
            CU(cudaEventRecord(ev0, st));                                               \
            for (int r = 0; r < (R); r++) call;                                         \
            CU(cudaEventRecord(ev1, st));                                               \
            CU(cudaEventSynchronize(ev1));                                              \
            float t_;                                                                   \
            CU(cudaEventElapsedTime(&t_, ev0, ev1));                                    \
            if (t_ / (R) < (out)) (out) = t_ / (R);                                     \
        }                                                                               \
    } while (0)

#endif
