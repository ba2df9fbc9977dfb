/* Batched token sampling on the GPU, bit-identical to di_sampler_sample (contract: engine/sampler.h;
 * API and design summary: cuda_sample.h).
 *
 * One block of SAMPLE_THREADS threads per row (the grid loops over rows when there are more rows than
 * scratch slots). Per row, in the contract's order:
 *   copy + check     logits → w, lowest id of a NaN/+inf logit reported (as the CPU)
 *   penalties        repetition once per distinct token of prompt ∪ output (an atomic bitmap elects the
 *                    one thread that applies it), then frequency/presence once per distinct output token
 *                    (atomic counts; the thread that swaps the count back to 0 applies it). Each token is
 *                    touched by one thread with the CPU's operations, so the order between tokens is
 *                    irrelevant; the bitmap and counts are left zero for the next row.
 *   bias             one thread, in list order (a repeated token adds in the CPU's order)
 *   mask, argmax     parallel; argmax is a max over (order key, ~id): lowest id on ties
 *   temperature      w / T, IEEE division
 *   selection        exact top-m by the CPU's rule: four 8-bit radix passes over order-preserving keys
 *                    find the rank-m key T, every finite entry with key ≥ T is collected and a bitonic
 *                    sort of the (~key, id) records puts them best first; the first m are the answer
 *                    (ties at T are taken lowest id first, as the CPU's selection does)
 *   weights          e(t) = d_sampler_exp(x − x_max), the CPU's di_sampler_exp operation by operation
 *   mass / walks     see "ordered sums" below
 *   draw             Philox4x32-10 on the device (integer multiply-high; the uniform's conversion is exact)
 *
 * Ordered sums. The CPU sums f32 weights into a double sequentially: over the whole vocabulary in id
 * order, over a candidate list in best-first order. Rounded f64 addition is not associative, so no
 * tree or warp reduction gives those bits (the terms span 2^-126..1 and Z reaches 2^17: ~170 bits
 * would be needed for the exact sum, so the rounding is real, not a corner case). The kernel therefore
 * runs the sum as one dependent chain in one thread, exactly the CPU's order, while the other warps
 * stage the next terms into shared memory. That is the cost of exactness: a whole-vocabulary sum is
 * 129,280 dependent f64 adds, ~0.3–0.5 ms at 4–8 cycles each (estimate, to be measured), up to three
 * per row (top-p's normaliser, the draw, raw logprobs); rows run in parallel, so it is a latency per
 * step, not per row, and greedy rows without logprobs have none. A blocked order in the contract would
 * remove it (proposal in the CUDA sampler's report). While it runs, the chain stores the running sum
 * every SAMPLE_CK terms. The partial sums of non-negative terms never
 * decrease, so "the first term where the running sum exceeds a target" (top-p's cut, the
 * inverse-CDF walk) is found by a parallel search over the checkpoints followed by a walk of one
 * chunk from its checkpoint — the same additions in the same order as the CPU's walk from 0.
 *
 * The final log(Z) and the logprob subtractions run on the host (cuda_sample.h says why). */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef DI_CUDA_SAMPLE_EMULATE
#include <cuda_runtime.h>
#else
/* Host emulation (built with a C++ compiler, -DDI_CUDA_SAMPLE_EMULATE, -ffp-contract=off): every block
 * is run by one thread, blocks one after another, against the runtime API of whatever the program
 * links (tests/cuda/test_cuda_sample.c provides a host-memory one). It runs the kernel's own source —
 * stage order, selections, checkpointed sums, walks, slot reuse — on a machine without a GPU; what it
 * cannot check is the interplay of threads (races, barriers), which the GPU run does. The intrinsics
 * below are the IEEE operations they name. */
#include <cuda_runtime_api.h>
#undef __global__
#undef __device__
#undef __shared__
#undef __forceinline__
#undef __launch_bounds__
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define SAMPLE_NT 1
struct emu_dim { unsigned x; };
static emu_dim threadIdx = {0}, blockIdx = {0}, gridDim = {1};
static inline void __syncthreads(void) {}
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t __umulhi(uint32_t a, uint32_t b) { return (uint32_t)(((uint64_t)a * b) >> 32); }
static inline int atomicAdd(int *p, int v) { int o = *p; *p = o + v; return o; }
static inline int atomicMin(int *p, int v) { int o = *p; *p = v < o ? v : o; return o; }
static inline int atomicExch(int *p, int v) { int o = *p; *p = v; return o; }
static inline unsigned atomicOr(unsigned *p, unsigned v) { unsigned o = *p; *p = o | v; return o; }
static inline unsigned long long __shfl_xor_sync(unsigned, unsigned long long v, int) { return v; }
static inline int min(int a, int b) { return a < b ? a : b; }
#endif

extern "C" {
#include "backend/cuda/cuda_sample.h"
#include "engine/sampler.h"
#include "util/error.h"
}

#define SAMPLE_THREADS 512
#ifndef SAMPLE_NT
#define SAMPLE_NT SAMPLE_THREADS /* threads that share a block's loops (1 in the host emulation) */
#endif
#define SAMPLE_CK 1024          /* terms between two checkpoints of an ordered sum */
#define SAMPLE_STAGE 4096       /* terms staged in shared memory per step of an ordered sum (a multiple of CK) */
#define SAMPLE_SORT_SHARED 4096 /* records sorted in shared memory; larger sorts run in global memory */
#define SAMPLE_TOP_P_FIRST 64   /* the CPU's first top-p prefix (DI_SAMPLER_TOP_P_FIRST); grows ×8 */
#define SAMPLE_GREEDY_EPS 1e-5f /* the CPU's DI_SAMPLER_GREEDY_EPS */
static_assert(SAMPLE_STAGE % SAMPLE_CK == 0, "a staged step holds whole checkpoint intervals");
static_assert(2 * SAMPLE_STAGE * sizeof(float) <= SAMPLE_SORT_SHARED * sizeof(unsigned long long),
              "the two staging buffers share the sort buffer");

enum { ROW_OK = 0, ROW_BAD_LOGIT = 1, ROW_NO_TOKEN = 2, ROW_SKIPPED = 3 };

/* One row's parameters as the kernel reads them: offsets into the batch's packed id / bias / mask arrays. */
typedef struct row_args {
    float temperature, top_p, min_p, presence, frequency, repetition;
    int32_t top_k, logprobs, n_top, mode; /* mode: di_logprobs_mode */
    int32_t n_bias;
    int32_t skip; /* the host rejected the row (bad params or ids): nothing to do */
    uint32_t choice;
    uint64_t seed;
    int64_t position;
    int64_t prompt_off, n_prompt; /* [n_prompt] ids at ids + prompt_off */
    int64_t output_off, n_output; /* [n_output] ids at ids + output_off */
    int64_t bias_off;             /* [n_bias] entries at bias + bias_off */
    int64_t mask_off;             /* [ceil(V/32)] words at masks + mask_off; -1: no mask */
} row_args;

/* One row's result before the host's log step. diff = x[token] − x_max (f32, −inf when x[token] is
 * −inf), z = the f64 mass the logprobs normalise by; the logprob is (float)((double)diff − log z). */
typedef struct row_out {
    int32_t status, detail; /* ROW_*; detail: the bad logit's id */
    int32_t token, n_top;
    float diff;
    int32_t pad;
    double z;
    int32_t top_ids[DI_SAMPLER_MAX_TOP_LOGPROBS];
    float top_diff[DI_SAMPLER_MAX_TOP_LOGPROBS];
} row_out;

/* Per-slot device scratch: byte offsets from the slot's base (slots are `stride` bytes apart). */
typedef struct scratch_layout {
    char *base;
    size_t stride;
    size_t w, ew, rec, ck, seen, cnt;
} scratch_layout;

struct di_cuda_sampler {
    int32_t n_vocab, n_slots;
    scratch_layout lay;        /* device scratch, n_slots × stride bytes */
    void *d_in;                /* device: row_args[n] + ids + bias + masks of one batch */
    size_t d_in_bytes;
    void *h_in;                /* pinned host staging of the same */
    size_t h_in_bytes;
    row_out *d_out, *h_out;    /* [cap_rows] device / pinned host */
    int32_t cap_rows;
    int32_t last_rows;         /* rows of the last call, whose results h_out holds */
};

/* Shared-memory state of one block. */
typedef struct block_state {
    unsigned long long red[SAMPLE_THREADS / 32];
    int hist[256];
    int i0, i1;
    uint32_t prefix;
    int need;
    double d0;
} block_state;

/* ---------------- device helpers: the CPU's arithmetic, restated ---------------- */

/* di_sampler_exp (sampler.h) operation by operation; every product and sum rounded on its own. */
static __device__ __forceinline__ float d_sampler_exp(float x) {
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693145751953125f, ln2_lo = 1.42860682030941723212e-6f;
    const float round_magic = 12582912.0f;
    float xc = x < -87.0f ? -87.0f : (x > 0.0f ? 0.0f : x);
    float n = __fsub_rn(__fadd_rn(__fmul_rn(xc, log2e), round_magic), round_magic);
    float r = __fsub_rn(__fsub_rn(xc, __fmul_rn(n, ln2_hi)), __fmul_rn(n, ln2_lo));
    float p = 1.0f / 5040.0f;
    p = __fadd_rn(__fmul_rn(p, r), 1.0f / 720.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f / 120.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f / 24.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f / 6.0f);
    p = __fadd_rn(__fmul_rn(p, r), 0.5f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    float scale = __uint_as_float((uint32_t)((int32_t)n + 127) << 23);
    float y = __fmul_rn(p, scale);
    return x < -87.0f ? 0.0f : y;
}

/* The CPU's order_key: key(a) < key(b) ⇔ a < b, −0 keyed as +0. */
static __device__ __forceinline__ uint32_t d_order_key(float f) {
    if (f == 0.0f) f = 0.0f;
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* di_philox_uniform (philox.c): Philox4x32-10, key = seed, counter = (position, choice, purpose). */
static __device__ double d_philox_uniform(uint64_t seed, uint64_t position, uint32_t choice, uint32_t purpose) {
    uint32_t c0 = (uint32_t)position, c1 = (uint32_t)(position >> 32), c2 = choice, c3 = purpose;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    uint64_t bits = ((uint64_t)(c0 >> 5) << 26) | (c1 >> 6);
    return __dmul_rn((double)bits, 1.0 / 9007199254740992.0); /* bits < 2^53: the conversion is exact */
}

/* ---------------- block primitives ---------------- */

/* Block max of a u64; every thread gets it. */
static __device__ unsigned long long block_max_u64(unsigned long long v, block_state *sh) {
    for (int o = 16; o; o >>= 1) {
        unsigned long long t = __shfl_xor_sync(0xffffffffu, v, o);
        v = t > v ? t : v;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh->red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = 0;
    for (int i = 0; i < (SAMPLE_NT + 31) / 32; i++) v = sh->red[i] > v ? sh->red[i] : v;
    return v;
}

/* Best entry of x[0..V), lowest id on ties (the CPU's argmax_lowest); -1 when every entry is −inf. */
static __device__ int32_t block_argmax(const float *x, int32_t V, block_state *sh) {
    unsigned long long best = 0;
    for (int32_t t = threadIdx.x; t < V; t += SAMPLE_NT) {
        float v = x[t];
        if (!(v > -INFINITY)) continue;
        unsigned long long rec = ((unsigned long long)d_order_key(v) << 32) | (uint32_t)~(uint32_t)t;
        best = rec > best ? rec : best;
    }
    best = block_max_u64(best, sh);
    return best ? (int32_t)~(uint32_t)best : -1;
}

/* Ascending bitonic sort of d[0..P), P a power of two, by the whole block. */
static __device__ void bitonic_sort(unsigned long long *d, int P) {
    for (int k = 2; k <= P; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < P; i += SAMPLE_NT) {
                int l = i ^ j;
                if (l > i) {
                    unsigned long long a = d[i], b = d[l];
                    bool up = (i & k) == 0;
                    if ((a > b) == up) {
                        d[i] = b;
                        d[l] = a;
                    }
                }
            }
            __syncthreads();
        }
}

/* Sorts rec[0..n) ascending (records (~key << 32 | id): best first). rec has room for the next power
 * of two ≥ n. */
static __device__ void sort_records(unsigned long long *rec, int n, unsigned long long *sbuf) {
    int P = 1;
    while (P < n) P <<= 1;
    if (P <= SAMPLE_SORT_SHARED) {
        for (int i = threadIdx.x; i < P; i += SAMPLE_NT) sbuf[i] = i < n ? rec[i] : ~0ull;
        __syncthreads();
        bitonic_sort(sbuf, P);
        for (int i = threadIdx.x; i < n; i += SAMPLE_NT) rec[i] = sbuf[i];
    } else {
        for (int i = n + threadIdx.x; i < P; i += SAMPLE_NT) rec[i] = ~0ull;
        __syncthreads();
        bitonic_sort(rec, P);
    }
    __syncthreads();
}

/* di_sampler_select_top: the m best finite entries of x, best first, as records in rec[0..return).
 * rec: [next pow2 ≥ V] u64 scratch; sbuf: the block's shared sort buffer. */
static __device__ int select_top(const float *x, int32_t V, int m, unsigned long long *rec, unsigned long long *sbuf,
                                 block_state *sh) {
    if (m <= 0) return 0;
    if (threadIdx.x == 0) sh->i0 = 0;
    __syncthreads();
    int c = 0;
    for (int32_t t = threadIdx.x; t < V; t += SAMPLE_NT) c += x[t] > -INFINITY;
    atomicAdd(&sh->i0, c);
    __syncthreads();
    const int n_fin = sh->i0;
    __syncthreads();
    uint32_t thr = 0; /* collect every finite entry with key >= thr */
    if (n_fin > m) {
        uint32_t prefix = 0;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int i = threadIdx.x; i < 256; i += SAMPLE_NT) sh->hist[i] = 0;
            if (shift == 24 && threadIdx.x == 0) sh->need = m;
            __syncthreads();
            const uint32_t hi_mask = shift == 24 ? 0u : ~0u << (shift + 8);
            for (int32_t t = threadIdx.x; t < V; t += SAMPLE_NT) {
                float v = x[t];
                if (!(v > -INFINITY)) continue;
                uint32_t k = d_order_key(v);
                if ((k & hi_mask) == prefix) atomicAdd(&sh->hist[(k >> shift) & 255u], 1);
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                int need = sh->need, b = 255;
                for (; b > 0; b--) {
                    if (sh->hist[b] >= need) break;
                    need -= sh->hist[b];
                }
                sh->need = need;
                sh->prefix = prefix | (uint32_t)b << shift;
            }
            __syncthreads();
            prefix = sh->prefix;
        }
        thr = prefix; /* the rank-m key */
    }
    if (threadIdx.x == 0) sh->i1 = 0;
    __syncthreads();
    /* every finite entry above the threshold (all of them when n_fin <= m: thr = 0) */
    const bool ties = n_fin > m;
    for (int32_t t = threadIdx.x; t < V; t += SAMPLE_NT) {
        float v = x[t];
        if (!(v > -INFINITY)) continue;
        uint32_t k = d_order_key(v);
        if (ties ? k > thr : k >= thr) rec[atomicAdd(&sh->i1, 1)] = ((unsigned long long)~k << 32) | (uint32_t)t;
    }
    if (ties) {
        /* and the `need` lowest ids among the entries equal to the threshold: each thread counts the ties
         * of a contiguous id range, an exclusive scan ranks the ranges, and each thread takes its ties
         * while their rank is below `need` — so a row of 100k equal logits sorts m records, not 100k */
        int *rank = (int *)sbuf; /* [SAMPLE_NT] i32 */
        const int32_t seg = (V + SAMPLE_NT - 1) / SAMPLE_NT, t0 = (int32_t)threadIdx.x * seg, t1 = min(t0 + seg, V);
        int c = 0;
        for (int32_t t = t0; t < t1; t++) c += x[t] > -INFINITY && d_order_key(x[t]) == thr;
        rank[threadIdx.x] = c;
        __syncthreads();
        if (threadIdx.x == 0)
            for (int i = 0, acc = 0; i < SAMPLE_NT; i++) {
                int ci = rank[i];
                rank[i] = acc;
                acc += ci;
            }
        __syncthreads();
        const int need = sh->need;
        int my = rank[threadIdx.x];
        for (int32_t t = t0; t < t1 && my < need; t++) {
            float v = x[t];
            if (v > -INFINITY && d_order_key(v) == thr) {
                rec[atomicAdd(&sh->i1, 1)] = ((unsigned long long)~thr << 32) | (uint32_t)t;
                my++;
            }
        }
    }
    __syncthreads();
    const int n = sh->i1;
    __syncthreads();
    sort_records(rec, n, sbuf);
    return n; /* min(m, n_fin) */
}

/* ---------------- ordered sums with checkpoints ---------------- */

/* S_i = Σ_{j<i} e[j] in f64, j ascending, one dependent chain (the CPU's order). Stores
 * ck[c] = S_{c·CK} for c < ceil(n/CK) and ck[ceil(n/CK)] = S_n; returns S_n to every thread.
 * Thread 0 adds; warps 1.. stage the next SAMPLE_STAGE terms into shared memory meanwhile, so the chain
 * waits on f64 adds, not on global loads. stage: [2][SAMPLE_STAGE] f32 shared. */
static __device__ double chain_build(const float *e, int n, double *ck, float *stage, block_state *sh) {
    const int n_stage = (n + SAMPLE_STAGE - 1) / SAMPLE_STAGE;
    const int c0 = SAMPLE_NT == 1 ? 0 : 32, cn = SAMPLE_NT - c0; /* the stagers */
    double s = 0.0;                                              /* the running sum (thread 0) */
    for (int c = 0; c <= n_stage; c++) {
        if (c < n_stage && (int)threadIdx.x >= c0) {
            float *dst = stage + (c & 1) * SAMPLE_STAGE;
            const int base = c * SAMPLE_STAGE, len = min(SAMPLE_STAGE, n - base);
            for (int i = (int)threadIdx.x - c0; i < len; i += cn) dst[i] = e[base + i];
        }
        if (threadIdx.x == 0 && c > 0) {
            const float *src = stage + ((c - 1) & 1) * SAMPLE_STAGE;
            const int base = (c - 1) * SAMPLE_STAGE, len = min(SAMPLE_STAGE, n - base);
            for (int k = 0; k < len; k += SAMPLE_CK) {
                ck[(base + k) / SAMPLE_CK] = s;
                const int k1 = min(k + SAMPLE_CK, len);
#pragma unroll 16
                for (int i = k; i < k1; i++) s = __dadd_rn(s, (double)src[i]);
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        ck[(n + SAMPLE_CK - 1) / SAMPLE_CK] = s;
        sh->d0 = s;
    }
    __syncthreads();
    s = sh->d0;
    __syncthreads();
    return s;
}

/* S_n from the checkpoints of a chain built over ≥ n terms. */
static __device__ double chain_prefix(const float *e, int n, const double *ck, block_state *sh) {
    if (threadIdx.x == 0) {
        int c = n / SAMPLE_CK;
        double s = ck[c];
        for (int i = c * SAMPLE_CK; i < n; i++) s = __dadd_rn(s, (double)e[i]);
        sh->d0 = s;
    }
    __syncthreads();
    double s = sh->d0;
    __syncthreads();
    return s;
}

/* First i < n with S_{i+1} > target (strict) or >= target; -1 if none. Partial sums never decrease,
 * so the answer lies in the first chunk whose closing checkpoint passes the test (only whole chunks
 * are tested; the last, possibly partial, chunk is walked when none passes). */
static __device__ int chain_first(const float *e, int n, const double *ck, double target, bool strict,
                                  block_state *sh) {
    const int nch = (n + SAMPLE_CK - 1) / SAMPLE_CK;
    if (threadIdx.x == 0) sh->i1 = INT_MAX;
    __syncthreads();
    for (int c = threadIdx.x; c + 1 < nch; c += SAMPLE_NT) {
        double s = ck[c + 1];
        if (strict ? s > target : s >= target) atomicMin(&sh->i1, c);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int found = -1;
        if (nch > 0) {
            int c = sh->i1 == INT_MAX ? nch - 1 : sh->i1;
            double s = ck[c];
            for (int i = c * SAMPLE_CK, i1 = min(n, c * SAMPLE_CK + SAMPLE_CK); i < i1; i++) {
                s = __dadd_rn(s, (double)e[i]);
                if (strict ? s > target : s >= target) {
                    found = i;
                    break;
                }
            }
        }
        sh->i0 = found;
    }
    __syncthreads();
    int r = sh->i0;
    __syncthreads();
    return r;
}

/* The CPU's logprobs_full: log-softmax of x over its finite entries, normalised by the id-order mass.
 * Fills o->diff, o->z, the top-n ids and their x − x_max. */
static __device__ void logprobs_full(const float *x, int32_t V, int32_t token, int n_top, float *ew, double *ck,
                                     unsigned long long *rec, unsigned long long *sbuf, block_state *sh, row_out *o) {
    const int32_t best = block_argmax(x, V, sh);
    const float x_max = x[best];
    for (int32_t t = threadIdx.x; t < V; t += SAMPLE_NT) ew[t] = d_sampler_exp(__fsub_rn(x[t], x_max));
    __syncthreads();
    const double z = chain_build(ew, V, ck, (float *)sbuf, sh);
    const int n = select_top(x, V, n_top, rec, sbuf, sh);
    if (threadIdx.x == 0) {
        o->z = z;
        o->diff = x[token] > -INFINITY ? __fsub_rn(x[token], x_max) : -INFINITY;
        o->n_top = n;
        for (int i = 0; i < n; i++) {
            int32_t id = (int32_t)(uint32_t)rec[i];
            o->top_ids[i] = id;
            o->top_diff[i] = __fsub_rn(x[id], x_max);
        }
    }
    __syncthreads();
}

/* ---------------- the kernel ---------------- */

__global__ void __launch_bounds__(SAMPLE_THREADS, 1)
sample_kernel(const float *__restrict__ logits, /* [n_rows, V] f32 */
              int32_t V, int32_t n_rows, const row_args *__restrict__ args, const int32_t *__restrict__ ids,
              const di_token_bias *__restrict__ bias, const uint32_t *__restrict__ masks, scratch_layout lay,
              row_out *__restrict__ out) {
    __shared__ block_state sh;
    __shared__ unsigned long long sbuf[SAMPLE_SORT_SHARED]; /* [4096] u64 sort records, or [2][4096] f32 sum staging */
    char *slot = lay.base + lay.stride * blockIdx.x;
    float *w = (float *)(slot + lay.w);                          /* [V] f32 the row after each stage */
    float *ew = (float *)(slot + lay.ew);                        /* [V] f32 weights of the current sum */
    unsigned long long *rec = (unsigned long long *)(slot + lay.rec); /* [pow2 ≥ V] u64 sort records */
    double *ck = (double *)(slot + lay.ck);                      /* [V/CK + 2] f64 checkpoints */
    uint32_t *seen = (uint32_t *)(slot + lay.seen);              /* [ceil(V/32)] repetition marks, zero between rows */
    int32_t *cnt = (int32_t *)(slot + lay.cnt);                  /* [V] output counts, zero between rows */

    for (int32_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
        const row_args a = args[r];
        if (a.skip) {
            if (threadIdx.x == 0) out[r].status = ROW_SKIPPED;
            continue;
        }
        const float *x_raw = logits + (size_t)r * V;
        row_out *o = out + r;

        /* copy; the lowest id of a NaN / +inf logit is the CPU's error */
        if (threadIdx.x == 0) sh.i0 = INT_MAX;
        __syncthreads();
        for (int32_t t = threadIdx.x; t < V; t += SAMPLE_NT) {
            float l = x_raw[t];
            if (isnan(l) || l == INFINITY) atomicMin(&sh.i0, t);
            w[t] = l;
        }
        __syncthreads();
        if (sh.i0 != INT_MAX) {
            if (threadIdx.x == 0) {
                o->status = ROW_BAD_LOGIT;
                o->detail = sh.i0;
            }
            __syncthreads();
            continue;
        }

        /* 1. penalties */
        const int32_t *prompt = ids + a.prompt_off, *output = ids + a.output_off;
        const float rp = a.repetition;
        if (rp != 0.0f && rp != 1.0f) {
            const int64_t n = a.n_prompt + a.n_output;
            for (int64_t i = threadIdx.x; i < n; i += SAMPLE_NT) {
                int32_t t = i < a.n_prompt ? prompt[i] : output[i - a.n_prompt];
                uint32_t bit = 1u << (t & 31);
                if (atomicOr(&seen[t >> 5], bit) & bit) continue;
                float l = w[t];
                w[t] = l > 0.0f ? __fdiv_rn(l, rp) : __fmul_rn(l, rp);
            }
            __syncthreads();
            for (int64_t i = threadIdx.x; i < n; i += SAMPLE_NT) {
                int32_t t = i < a.n_prompt ? prompt[i] : output[i - a.n_prompt];
                seen[t >> 5] = 0;
            }
            __syncthreads();
        }
        if (a.frequency != 0.0f || a.presence != 0.0f) {
            for (int64_t i = threadIdx.x; i < a.n_output; i += SAMPLE_NT) atomicAdd(&cnt[output[i]], 1);
            __syncthreads();
            for (int64_t i = threadIdx.x; i < a.n_output; i += SAMPLE_NT) {
                int32_t t = output[i], c = atomicExch(&cnt[t], 0);
                if (!c) continue;
                w[t] = __fsub_rn(__fsub_rn(w[t], __fmul_rn(a.frequency, (float)c)), a.presence);
            }
            __syncthreads();
        }
        /* 2. bias (one thread, list order) and 3. mask */
        if (threadIdx.x == 0)
            for (int32_t i = 0; i < a.n_bias; i++) {
                const di_token_bias b = bias[a.bias_off + i];
                w[b.token] = __fadd_rn(w[b.token], b.bias);
            }
        __syncthreads();
        if (a.mask_off >= 0) {
            const uint32_t *mask = masks + a.mask_off;
            for (int32_t i = threadIdx.x; i < (V + 31) / 32; i += SAMPLE_NT) {
                uint32_t m = mask[i];
                if (m == 0xffffffffu) continue;
                for (int b = 0; b < 32; b++) {
                    int32_t t = i * 32 + b;
                    if (t < V && !(m >> b & 1u)) w[t] = -INFINITY;
                }
            }
            __syncthreads();
        }
        const int32_t best = block_argmax(w, V, &sh);
        if (best < 0) {
            if (threadIdx.x == 0) o->status = ROW_NO_TOKEN;
            __syncthreads();
            continue;
        }
        if (threadIdx.x == 0) {
            o->status = ROW_OK;
            o->n_top = 0;
            o->z = 0.0;
        }

        /* 4. greedy */
        if (a.temperature < SAMPLE_GREEDY_EPS) {
            if (threadIdx.x == 0) o->token = best;
            if (a.logprobs)
                logprobs_full(a.mode == DI_LOGPROBS_PROCESSED ? w : x_raw, V, best, a.n_top, ew, ck, rec, sbuf, &sh, o);
            __syncthreads();
            continue;
        }
        if (a.temperature != 1.0f) {
            for (int32_t t = threadIdx.x; t < V; t += SAMPLE_NT) w[t] = __fdiv_rn(w[t], a.temperature);
            __syncthreads();
        }
        const float x_max = w[best];

        /* 5–7 and the draw */
        const bool top_p_on = a.top_p > 0.0f && a.top_p < 1.0f;
        const bool list_form = a.top_k > 0 || top_p_on;
        const double u = d_philox_uniform(a.seed, (uint64_t)a.position, a.choice, 0u /* DI_RNG_SAMPLE */);
        int32_t token;
        double z;
        int n_cand = 0;
        if (list_form) {
            double z_in = 0.0;
            if (!(a.top_k > 0)) { /* top-p alone normalises by the whole row's id-order mass */
                for (int32_t t = threadIdx.x; t < V; t += SAMPLE_NT) ew[t] = d_sampler_exp(__fsub_rn(w[t], x_max));
                __syncthreads();
                z_in = chain_build(ew, V, ck, (float *)sbuf, &sh);
            }
            /* Candidates best first with their weights and a chain over them. Top-p without top-k grows
             * the list ×8 until the mass is covered or every finite entry is in (the CPU's loop; the
             * selection is exact, so a longer list's prefix is the shorter list). */
            int m = a.top_k > 0 ? a.top_k : SAMPLE_TOP_P_FIRST;
            for (;;) {
                n_cand = select_top(w, V, m, rec, sbuf, &sh);
                for (int i = threadIdx.x; i < n_cand; i += SAMPLE_NT)
                    ew[i] = d_sampler_exp(__fsub_rn(w[(uint32_t)rec[i]], x_max));
                __syncthreads();
                const double s = chain_build(ew, n_cand, ck, (float *)sbuf, &sh);
                if (!top_p_on) break;
                if (a.top_k > 0) z_in = s;
                const int i = chain_first(ew, n_cand, ck, __dmul_rn((double)a.top_p, z_in), false, &sh);
                if (i >= 0) {
                    n_cand = i + 1;
                    break;
                }
                /* every candidate kept: rounding left the target uncovered (the CPU keeps them all too) */
                if (a.top_k > 0 || n_cand < m || m >= V) break;
                m = m > V / 8 ? V : m * 8;
            }
            if (a.min_p > 0.0f) { /* first position ≥ 1 whose weight falls below min_p */
                if (threadIdx.x == 0) sh.i1 = n_cand;
                __syncthreads();
                for (int i = 1 + threadIdx.x; i < n_cand; i += SAMPLE_NT)
                    if (ew[i] < a.min_p) atomicMin(&sh.i1, i);
                __syncthreads();
                n_cand = sh.i1;
                __syncthreads();
            }
            z = chain_prefix(ew, n_cand, ck, &sh);
            const int i = chain_first(ew, n_cand, ck, __dmul_rn(u, z), true, &sh);
            token = (int32_t)(uint32_t)rec[i >= 0 ? i : n_cand - 1];
        } else {
            const float min_w = a.min_p > 0.0f ? a.min_p : 0.0f;
            for (int32_t t = threadIdx.x; t < V; t += SAMPLE_NT) {
                float e = d_sampler_exp(__fsub_rn(w[t], x_max));
                ew[t] = e < min_w ? 0.0f : e;
            }
            __syncthreads();
            z = chain_build(ew, V, ck, (float *)sbuf, &sh);
            const int i = chain_first(ew, V, ck, __dmul_rn(u, z), true, &sh);
            token = i >= 0 ? i : best;
        }
        if (threadIdx.x == 0) o->token = token;

        /* logprobs */
        if (!a.logprobs) {
            __syncthreads();
            continue;
        }
        if (a.mode == DI_LOGPROBS_RAW) {
            logprobs_full(x_raw, V, token, a.n_top, ew, ck, rec, sbuf, &sh, o);
            continue;
        }
        if (list_form) {
            if (threadIdx.x == 0) {
                o->n_top = n_cand < a.n_top ? n_cand : a.n_top;
                for (int i = 0; i < o->n_top; i++) o->top_ids[i] = (int32_t)(uint32_t)rec[i];
            }
        } else {
            /* min-p removes a worst-first tail: the kept top-n are a prefix of the row's top-n */
            const float min_w = a.min_p > 0.0f ? a.min_p : 0.0f;
            const int n = select_top(w, V, a.n_top, rec, sbuf, &sh);
            if (threadIdx.x == 0) {
                int k = 0;
                for (int i = 0; i < n; i++) {
                    int32_t id = (int32_t)(uint32_t)rec[i];
                    if (d_sampler_exp(__fsub_rn(w[id], x_max)) >= min_w) o->top_ids[k++] = id;
                }
                o->n_top = k;
            }
        }
        if (threadIdx.x == 0) {
            o->z = z;
            o->diff = __fsub_rn(w[token], x_max);
            for (int i = 0; i < o->n_top; i++) o->top_diff[i] = __fsub_rn(w[o->top_ids[i]], x_max);
        }
        __syncthreads();
    }
}

/* ---------------- host side ---------------- */

static size_t align_up(size_t n) { return (n + 255) & ~(size_t)255; }

static int cuda_fail(const char *what, cudaError_t e, di_error *err) {
    return di_error_set(err, DI_ERR_INTERNAL, "cuda sampler: %s: %s", what, cudaGetErrorString(e));
}

extern "C" int di_cuda_sampler_new(int32_t n_vocab, int32_t n_slots, di_cuda_sampler **out, di_error *err) {
    *out = NULL;
    if (n_vocab <= 0 || n_vocab > INT32_MAX / 2)
        return di_error_set(err, DI_ERR_INVALID, "cuda sampler: vocabulary size %d, expected 1..%d", n_vocab, INT32_MAX / 2);
    if (n_slots < 0) return di_error_set(err, DI_ERR_INVALID, "cuda sampler: %d slots, expected >= 0", n_slots);
    if (n_slots == 0) {
        int dev = 0, sms = 0;
        cudaError_t e = cudaGetDevice(&dev);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (e != cudaSuccess) return cuda_fail("device query", e, err);
        n_slots = 2 * sms;
    }
    di_cuda_sampler *s = (di_cuda_sampler *)calloc(1, sizeof *s);
    if (!s) return di_error_set(err, DI_ERR_NOMEM, "cuda sampler: out of memory");
    s->n_vocab = n_vocab;
    s->n_slots = n_slots;
    const size_t V = (size_t)n_vocab;
    size_t P = 1;
    while (P < V) P <<= 1;
    scratch_layout *l = &s->lay;
    size_t off = 0;
    l->w = off;    off += align_up(V * sizeof(float));
    l->ew = off;   off += align_up(V * sizeof(float));
    l->rec = off;  off += align_up(P * sizeof(unsigned long long));
    l->ck = off;   off += align_up((V / SAMPLE_CK + 2) * sizeof(double));
    l->seen = off; off += align_up((V + 31) / 32 * sizeof(uint32_t));
    l->cnt = off;  off += align_up(V * sizeof(int32_t));
    l->stride = off;
    cudaError_t e = cudaMalloc((void **)&l->base, l->stride * (size_t)n_slots);
    /* the repetition marks and output counts must start zero; the kernel leaves them zero */
    if (e == cudaSuccess) e = cudaMemset(l->base, 0, l->stride * (size_t)n_slots);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        di_cuda_sampler_free(s);
        return di_error_set(err, DI_ERR_NOMEM, "cuda sampler: %d slots of %zu bytes: %s", n_slots, off,
                            cudaGetErrorString(e));
    }
    *out = s;
    return DI_OK;
}

extern "C" void di_cuda_sampler_free(di_cuda_sampler *s) {
    if (!s) return;
    cudaFree(s->lay.base);
    cudaFree(s->d_in);
    cudaFreeHost(s->h_in);
    cudaFree(s->d_out);
    cudaFreeHost(s->h_out);
    free(s);
}

static int check_ids(const int32_t *t, int64_t n, int32_t V, const char *what, int32_t row, di_error *err) {
    for (int64_t i = 0; i < n; i++)
        if (t[i] < 0 || t[i] >= V)
            return di_error_set(err, DI_ERR_INVALID, "cuda sampler: row %d: %s token %lld is id %d, expected 0..%d",
                                row, what, (long long)i, t[i], V - 1);
    return DI_OK;
}

extern "C" int di_cuda_sampler_sample(di_cuda_sampler *s, const float *d_logits, int32_t n_rows, const di_sample_row *rows,
                                      di_sample_result *out, di_error *row_err, void *stream, di_error *err) {
    s->last_rows = 0;
    if (n_rows <= 0) return DI_OK;
    const int32_t V = s->n_vocab;
    const int64_t words = (V + 31) / 32;
    cudaStream_t st = (cudaStream_t)stream;
    /* validate (host) and size the packed upload */
    int64_t n_ids = 0, n_bias = 0, n_masks = 0;
    for (int32_t r = 0; r < n_rows; r++) {
        const di_sample_row *row = &rows[r];
        di_error *e_row = row_err ? &row_err[r] : err;
        if (row_err) di_error_clear(e_row);
        int rc = di_sampling_params_check(row->params, V, e_row);
        if (rc) di_error_wrap(e_row, "cuda sampler: row %d", r);
        if (!rc) rc = check_ids(row->prompt, row->n_prompt, V, "prompt", r, e_row);
        if (!rc) rc = check_ids(row->output, row->n_output, V, "output", r, e_row);
        if (rc && !row_err) return rc;
        if (rc) continue; /* packed as a skipped row below */
        n_ids += row->n_prompt + row->n_output;
        n_bias += row->params->n_logit_bias;
        n_masks += row->mask ? 1 : 0;
    }
    const size_t off_ids = align_up((size_t)n_rows * sizeof(row_args));
    const size_t off_bias = off_ids + align_up((size_t)n_ids * sizeof(int32_t));
    const size_t off_mask = off_bias + align_up((size_t)n_bias * sizeof(di_token_bias));
    const size_t bytes = off_mask + (size_t)(n_masks * words) * sizeof(uint32_t) + 8;
    cudaError_t e;
    if (bytes > s->h_in_bytes) {
        cudaFreeHost(s->h_in);
        cudaFree(s->d_in);
        s->h_in = s->d_in = NULL;
        s->h_in_bytes = s->d_in_bytes = 0;
        if ((e = cudaMallocHost(&s->h_in, bytes * 2)) != cudaSuccess) return cuda_fail("pinned staging", e, err);
        if ((e = cudaMalloc(&s->d_in, bytes * 2)) != cudaSuccess) return cuda_fail("argument buffer", e, err);
        s->h_in_bytes = s->d_in_bytes = bytes * 2;
    }
    if (n_rows > s->cap_rows) {
        cudaFreeHost(s->h_out);
        cudaFree(s->d_out);
        s->h_out = s->d_out = NULL;
        s->cap_rows = 0;
        if ((e = cudaMallocHost((void **)&s->h_out, (size_t)n_rows * sizeof(row_out))) != cudaSuccess)
            return cuda_fail("pinned results", e, err);
        if ((e = cudaMalloc((void **)&s->d_out, (size_t)n_rows * sizeof(row_out))) != cudaSuccess)
            return cuda_fail("result buffer", e, err);
        s->cap_rows = n_rows;
    }
    char *h = (char *)s->h_in;
    row_args *ha = (row_args *)h;
    int32_t *hid = (int32_t *)(h + off_ids);
    di_token_bias *hb = (di_token_bias *)(h + off_bias);
    uint32_t *hm = (uint32_t *)(h + off_mask);
    int64_t pi = 0, pb = 0, pm = 0;
    for (int32_t r = 0; r < n_rows; r++) {
        const di_sample_row *row = &rows[r];
        const di_sampling_params *p = row->params;
        row_args a;
        memset(&a, 0, sizeof a);
        a.mask_off = -1;
        if (row_err && row_err[r].code) {
            a.skip = 1;
            ha[r] = a;
            continue;
        }
        a.temperature = p->temperature;
        a.top_p = p->top_p;
        a.min_p = p->min_p;
        a.presence = p->presence_penalty;
        a.frequency = p->frequency_penalty;
        a.repetition = p->repetition_penalty;
        a.top_k = p->top_k;
        a.logprobs = p->logprobs;
        a.n_top = p->n_top_logprobs;
        a.mode = (int32_t)p->logprobs_mode;
        a.n_bias = p->n_logit_bias;
        a.choice = row->choice;
        a.seed = p->seed;
        a.position = row->position;
        a.prompt_off = pi;
        a.n_prompt = row->n_prompt;
        if (row->n_prompt) memcpy(hid + pi, row->prompt, (size_t)row->n_prompt * sizeof(int32_t));
        pi += row->n_prompt;
        a.output_off = pi;
        a.n_output = row->n_output;
        if (row->n_output) memcpy(hid + pi, row->output, (size_t)row->n_output * sizeof(int32_t));
        pi += row->n_output;
        a.bias_off = pb;
        if (p->n_logit_bias) memcpy(hb + pb, p->logit_bias, (size_t)p->n_logit_bias * sizeof(di_token_bias));
        pb += p->n_logit_bias;
        a.mask_off = -1;
        if (row->mask) {
            memcpy(hm + pm * words, row->mask, (size_t)words * sizeof(uint32_t));
            a.mask_off = pm * words;
            pm++;
        }
        ha[r] = a;
    }
    char *d = (char *)s->d_in;
    if ((e = cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, st)) != cudaSuccess)
        return cuda_fail("argument upload", e, err);
    const unsigned grid = (unsigned)(n_rows < s->n_slots ? n_rows : s->n_slots);
#ifdef DI_CUDA_SAMPLE_EMULATE
    for (blockIdx.x = 0, gridDim.x = grid; blockIdx.x < grid; blockIdx.x++)
        sample_kernel(d_logits, V, n_rows, (const row_args *)d, (const int32_t *)(d + off_ids),
                      (const di_token_bias *)(d + off_bias), (const uint32_t *)(d + off_mask), s->lay, s->d_out);
#else
    sample_kernel<<<grid, SAMPLE_THREADS, 0, st>>>(d_logits, V, n_rows, (const row_args *)d, (const int32_t *)(d + off_ids),
                                                   (const di_token_bias *)(d + off_bias), (const uint32_t *)(d + off_mask),
                                                   s->lay, s->d_out);
#endif
    if ((e = cudaGetLastError()) != cudaSuccess) return cuda_fail("sample kernel launch", e, err);
    if ((e = cudaMemcpyAsync(s->h_out, s->d_out, (size_t)n_rows * sizeof(row_out), cudaMemcpyDeviceToHost, st)) != cudaSuccess)
        return cuda_fail("result download", e, err);
    if ((e = cudaStreamSynchronize(st)) != cudaSuccess) return cuda_fail("sample kernel", e, err);

    s->last_rows = n_rows;
    /* finish on the host: log(Z) with the C library's log, as di_sampler_sample */
    for (int32_t r = 0; r < n_rows; r++) {
        const row_out *o = &s->h_out[r];
        const di_sampling_params *p = rows[r].params;
        di_sample_result *res = &out[r];
        memset(res, 0, sizeof *res);
        if (row_err && row_err[r].code) continue; /* rejected on the host */
        int rc = DI_OK;
        di_error *e_row = row_err ? &row_err[r] : err;
        if (o->status == ROW_BAD_LOGIT)
            rc = di_error_set(e_row, DI_ERR_INVALID, "cuda sampler: row %d: logit of token %d is NaN or +inf, expected "
                              "finite or -inf", r, o->detail);
        else if (o->status == ROW_NO_TOKEN)
            rc = di_error_set(e_row, DI_ERR_INVALID, "cuda sampler: row %d: no token is allowed at position %lld (mask, "
                              "bias or logits leave every logit at -inf)", r, (long long)rows[r].position);
        if (rc && !row_err) return rc;
        if (rc) continue;
        res->token = o->token;
        if (!p->logprobs) continue;
        const double log_z = log(o->z);
        res->logprob = (float)((double)o->diff - log_z);
        res->n_top = o->n_top;
        for (int32_t i = 0; i < o->n_top; i++) {
            res->top_ids[i] = o->top_ids[i];
            res->top_logprobs[i] = (float)((double)o->top_diff[i] - log_z);
        }
    }
    return DI_OK;
}

extern "C" double di_cuda_sampler_last_mass(const di_cuda_sampler *s, int32_t r) {
    if (r < 0 || r >= s->last_rows) return 0.0;
    return s->h_out[r].status == ROW_OK ? s->h_out[r].z : 0.0;
}
