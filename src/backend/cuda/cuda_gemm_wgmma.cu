/* Block-scaled FP8 / MXFP4 GEMM y = x · Wᵀ on Hopper's FP8 tensor cores (wgmma + TMA, sm_90a), CUDA C
 * with inline PTX.
 *
 * Contract (backend.h linear_fp8 / linear_fp4, spec §5.2): x is act-quantized per 32 inputs (E8M0 scale,
 * e4m3 codes; the existing cuda_quant.cu pass); per 32-wide K block b the code products are summed,
 * P_b, then y = bf16(Σ_b↑ (P_b·s_x)·s_w) in f32, blocks in ascending K order.
 *
 * How the kernel maps it: one wgmma m64n128k32 (e4m3 × e4m3 → f32) is exactly one K block for a 64 × 128
 * sub-tile, issued with a zero accumulator (scale-d = 0), so its result is P_b for every output. The
 * promotion then runs on the CUDA cores: acc = fma(P_b, s_x·s_w, acc), ascending b. That fused form is
 * the CPU's three roundings: s_x, s_w are powers of two, so while both lie in [2^-50, 2^50] (every real
 * activation and weight scale; checked per stage) P_b·s_x, P_b·s_x·s_w and s_x·s_w are exact f32
 * values and fma rounds once where the CPU's add does. A stage holding any scale outside that range
 * (inputs near 1e37, E8M0 0 or 254) takes the literal __fmul_rn, __fmul_rn, __fadd_rn sequence instead;
 * NaN scales propagate the same either way. FP4 weights: E2M1 values are e4m3 values, so the packed
 * nibbles are rewritten as e4m3 codes on their way into shared memory and the same wgmma runs; the
 * per-row weight scale is applied per output column in the promotion.
 *
 * The one difference from the CPU — P_b itself. The CPU forms P_b exactly (f64) and rounds it once to
 * f32; the tensor core does not. Measured on an H200 with one block in isolation (di_cuda_wgmma_block_dot,
 * tests/cuda/test_cuda_gemm_fast.c; bench/NOTES-gpu.md): its P_b differs from the correctly rounded sum
 * on 71 % of 32-term blocks of quantized Gaussian data (all but 0.03 % of full-range random codes),
 * always by less than 2^-9 of the largest product's binade 2^(e_x + e_w); a model that truncates each
 * product toward zero 13 bits below that binade reproduces about two thirds of the values exactly (the
 * rest of the rule is not identified). After the bf16 rounding of y, about 2.6 % of FP8 outputs (1.4 % of
 * FP4) differ from the CPU, nearly all by one bf16 ulp; larger ulp distances occur only where the
 * exact result nearly cancels. Everything after P_b — scales, order, rounding points — is the CPU's, and
 * P_b does not depend on the other rows of the call: results are batch invariant (tested).
 *
 * Kernel: one CTA per 128 × 128 output tile, three warpgroups. Warpgroup 0 produces: one thread issues
 * the TMA copies of each stage (4 K blocks = 128 bytes per row, 128-byte swizzle, zero fill past M, N, K)
 * and all 128 threads load the stage's scales (one stage ahead, from registers) and, for FP4, rewrite the
 * packed weights TMA landed as swizzled e4m3. Warpgroups 1 and 2 consume rows 0–63 and 64–127: per K
 * block one wgmma, wait, promote; while one promotes on the CUDA cores the other's wgmma runs.
 * Stages hand over through mbarriers (full: producer → consumers, empty: back).
 *
 * Decode-sized calls (M ≤ 16 with fewer tiles than SMs) split K over more CTAs: each stores its blocks'
 * exact terms (P_b·s_x)·s_w into an f32 scratch [KB, M, N] and split_sum_kernel adds them in ascending K
 * — the unsplit f32 sequence, so both paths give the same bits.
 *
 * Unsplit calls (and the grouped expert GEMM) run a second, persistent kernel with the same numerics,
 * bit for bit (qgemm2 below); this first kernel serves the split-K decode calls and is the second's
 * reference in the tests.
 *
 * Speed on an H200 (bench/NOTES-gpu.md): persistent kernel ~380–430 TFLOP/s FP8 and ~260–270 FP4 at
 * M = 8192 (26–30 % / 18 % of the 1,445 TFLOP/s FP8 peak; this kernel 305–390 / 245–260). Leave-one-out
 * runs put the limit in the wgmma chain itself: with the promotion and the loads removed, two warpgroups
 * each keeping two m64n128k32 block sums in flight reach only 45 % of the peak. Decode: 0.2–1.1 TB/s
 * (latency-bound serial block chains). */
#include <cuda.h>         /* CUtensorMap and its enums; the encoder is fetched at run time (no -lcuda) */
#include <cudaTypedefs.h> /* PFN_cuTensorMapEncodeTiled */

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemm_wgmma.h"
#include "backend/cuda/cuda_tma.cuh"
#include "backend/cuda/cuda_ops.h"

#define QB 32       /* quantization block along K */
#define TM 128      /* output rows per CTA (two consumer warpgroups × 64) */
#define TN 128      /* output columns per CTA = wgmma N */
#define TKB 4       /* K blocks per stage */
#define ROWB 128    /* bytes per smem tile row: TKB blocks of 32 e4m3 codes, one 128B swizzle row */
#define STAGES 4
#define THREADS 384 /* warpgroup 0 producer, 1–2 consumers */

/* One pipeline stage in shared memory; 1024-byte aligned (the 128B swizzle pattern repeats every 8 rows). */
typedef struct __align__(1024) stage {
    uint8_t a[TM * ROWB];       /* e4m3 [128 rows][128 B], 128B-swizzled (TMA) */
    uint8_t b[TN * ROWB];       /* e4m3 [128 weight rows][128 B], 128B-swizzled (TMA, or the FP4 rewrite) */
    uint8_t packed[TN * ROWB / 2]; /* FP4 only: packed E2M1 [128 rows][64 B] as TMA lands it */
    float sx[TKB][TM];          /* f32 activation scales of the 4 blocks (0 past M, K) */
    float sw[TKB][TN];          /* f32 weight scales: per column (FP4) or per 32-column group in [0..3] (FP8) */
    int unsafe[4];              /* per producer warp: a scale outside the fused-promotion range */
    uint64_t full;              /* mbarrier: 128 producer arrivals + the TMA bytes */
    uint64_t empty;             /* mbarrier: 256 consumer arrivals */
    uint64_t packed_full;       /* mbarrier: the FP4 TMA bytes */
} stage;
#define SMEM_BYTES (STAGES * sizeof(stage) + 1024)

typedef struct gemm_params {
    CUtensorMap ta;  /* xq e4m3 [M, K]: box 128 B × 128 rows, 128B swizzle */
    CUtensorMap tb;  /* FP8 w [N, K]: same box; FP4 packed w [N, K/2]: box 64 B × 128 rows, no swizzle */
    const uint8_t *xs, *wsc; /* E8M0 [M, K/32]; [ceil(N/32), K/32] (FP8) or [N, K/32] (FP4) */
    int M, N, K, KB;
    int split_stages; /* stages per CTA along K (gridDim.z CTAs share one tile's K range) */
    uint16_t *y;      /* bf16 [M, N] (unsplit) */
    float *part;      /* split: f32 [KB, M, N], each block's scaled partial (P_b·s_x)·s_w; else NULL */
} gemm_params;

#define F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define F16(i) F4(i), F4(i + 4), F4(i + 8), F4(i + 12)
#define F64 F16(0), F16(16), F16(32), F16(48)

/* d[64] = A(64×32) · B(128×32)ᵀ with a zero accumulator (scale-d false): one K block of the sub-tile.
 * Fragment: d[4j + h] is row (warp%4)·16 + lane/4 + 8·(h/2), column 8j + 2·(lane%4) + h%2. */
static __device__ __forceinline__ void mma_block(float *d, uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "%64, %65, p, 1, 1;\n}\n"
                 : F64
                 : "l"(da), "l"(db));
}
/* Wait for every committed group; d (the set they wrote) is named so that no read of it is scheduled
 * before the wait. */
static __device__ __forceinline__ void mma_wait0(float *d) { asm volatile("wgmma.wait_group.sync.aligned 0;\n" : F64 :: "memory"); }

/* ---------------- FP4 → e4m3 ----------------
 * Four E2M1 nibbles (value i in bits 4i..4i+3) → four e4m3 bytes. Magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 are
 * the e4m3 codes 00 30 38 3C 40 44 48 4C: one byte permute over that 8-byte table, then the sign bits. */
static __device__ __forceinline__ uint32_t e2m1x4_to_e4m3(uint32_t h) {
    uint32_t mag = __byte_perm(0x3c383000u, 0x4c484440u, h & 0x7777u);
    uint32_t s = h & 0x8888u;
    return mag | ((s & 0x8u) << 4) | ((s & 0x80u) << 8) | ((s & 0x800u) << 12) | ((s & 0x8000u) << 16);
}

/* ---------------- scales ---------------- */
/* E8M0 exponents whose scale lies in [2^-50, 2^50], or NaN: the fused promotion is exact (file comment) */
static __device__ __forceinline__ int scale_unsafe(uint32_t e) { return (e < 127 - 50 || e > 127 + 50) && e != 255; }

/* Four consecutive E8M0 bytes p[0..n) (n ≤ 4, the rest zero) as one word */
static __device__ __forceinline__ uint32_t load_scale4(const uint8_t *p, int n, int aligned) {
    if (aligned && n == 4) return __ldg((const unsigned int *)p);
    uint32_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint32_t)__ldg(p + i) << (8 * i);
    return v;
}

/* Producer thread tid's scales of stage t: activation row tid, and weight column tid (FP4) or 32-column
 * group tid (FP8, tid < 4). Loaded a stage ahead so the latency hides behind the wait for a free slot. */
typedef struct stage_scales {
    uint32_t x, w;    /* 4 E8M0 bytes each (blocks kb0 .. kb0+3) */
    int x_ok, w_ok;   /* the row / column exists */
} stage_scales;

static __device__ __forceinline__ stage_scales scales_load(const gemm_params *p, bool fp4, int t, int m0, int n0, int tid) {
    const int kb0 = t * TKB, nkb = min(TKB, p->KB - kb0), aligned = (p->KB & 3) == 0;
    stage_scales s = {0, 0, 0, 0};
    if (m0 + tid < p->M) s.x = load_scale4(p->xs + (int64_t)(m0 + tid) * p->KB + kb0, nkb, aligned), s.x_ok = 1;
    if (fp4) {
        if (n0 + tid < p->N) s.w = load_scale4(p->wsc + (int64_t)(n0 + tid) * p->KB + kb0, nkb, aligned), s.w_ok = 1;
    } else if (tid < TN / QB && n0 + tid * QB < p->N) {
        s.w = load_scale4(p->wsc + (int64_t)(n0 / QB + tid) * p->KB + kb0, nkb, aligned), s.w_ok = 1;
    }
    return s;
}

/* Store as f32 (0 for missing rows/columns/blocks); returns 1 if a present scale is out of range. */
static __device__ __forceinline__ int scales_store(const stage_scales *s, bool fp4, stage *st, int nkb, int tid) {
    int unsafe = 0;
#pragma unroll
    for (int q = 0; q < TKB; q++) {
        const uint32_t ex = (s->x >> (8 * q)) & 0xffu, ew = (s->w >> (8 * q)) & 0xffu;
        const bool xl = s->x_ok && q < nkb, wl = s->w_ok && q < nkb;
        st->sx[q][tid] = xl ? d_e8m0((uint8_t)ex) : 0.0f;
        if (fp4 || tid < TN / QB) st->sw[q][tid] = wl ? d_e8m0((uint8_t)ew) : 0.0f;
        unsafe |= (xl && scale_unsafe(ex)) | (wl && scale_unsafe(ew));
    }
    return unsafe;
}

/* FP4: weight row tid of the stage, 64 packed bytes as TMA landed them → 128 e4m3 codes in the
 * swizzled B tile (zeros past N or K stay zeros: TMA zero-filled them). */
static __device__ __forceinline__ void fp4_rewrite(stage *st, int r) {
    const uint4 *src = (const uint4 *)(st->packed + r * (ROWB / 2));
#pragma unroll
    for (int i = 0; i < 4; i++) { /* 16 packed bytes = one K block = two 16-byte chunks of e4m3 */
        const uint4 v = src[i];
        const uint4 lo = make_uint4(e2m1x4_to_e4m3(v.x & 0xffffu), e2m1x4_to_e4m3(v.x >> 16), e2m1x4_to_e4m3(v.y & 0xffffu),
                                    e2m1x4_to_e4m3(v.y >> 16));
        const uint4 hi = make_uint4(e2m1x4_to_e4m3(v.z & 0xffffu), e2m1x4_to_e4m3(v.z >> 16), e2m1x4_to_e4m3(v.w & 0xffffu),
                                    e2m1x4_to_e4m3(v.w >> 16));
        *(uint4 *)(st->b + r * ROWB + (((2 * i) ^ (r & 7)) << 4)) = lo;
        *(uint4 *)(st->b + r * ROWB + (((2 * i + 1) ^ (r & 7)) << 4)) = hi;
    }
}

/* ---------------- producer (warpgroup 0) ---------------- */
/* stages t0 .. t1−1 of the tile's K range (the whole range unless split) */
static __device__ __forceinline__ void produce(const gemm_params *p, bool fp4, stage *stages, int m0, int n0, int t0, int t1) {
    const int tid = threadIdx.x, lane = tid & 31;
    stage_scales cur = scales_load(p, fp4, t0, m0, n0, tid);
    for (int t = t0; t < t1; t++) {
        const int s = (t - t0) % STAGES;
        const uint32_t ph = (uint32_t)((t - t0) / STAGES) & 1u;
        stage *st = &stages[s];
        stage_scales nxt = cur;
        if (t + 1 < t1) nxt = scales_load(p, fp4, t + 1, m0, n0, tid);
        mbar_wait(&st->empty, ph ^ 1u); /* the consumers are done with this slot's previous stage */
        if (fp4 && tid == 0) {
            mbar_arrive_tx(&st->packed_full, TN * ROWB / 2);
            tma_load(st->packed, &p->tb, t * TKB * QB / 2, n0, &st->packed_full);
        }
        const int unsafe = scales_store(&cur, fp4, st, min(TKB, p->KB - t * TKB), tid);
        const unsigned any = __any_sync(0xffffffffu, unsafe);
        if (lane == 0) st->unsafe[tid >> 5] = (int)any;
        if (fp4) {
            mbar_wait(&st->packed_full, ph);
            fp4_rewrite(st, tid);
            fence_proxy_async(); /* the rewritten codes are read by wgmma (async proxy) */
        }
        if (tid == 0) {
            mbar_arrive_tx(&st->full, fp4 ? TM * ROWB : (TM + TN) * ROWB);
            tma_load(st->a, &p->ta, t * TKB * QB, m0, &st->full);
            if (!fp4) tma_load(st->b, &p->tb, t * TKB * QB, n0, &st->full);
        } else {
            mbar_arrive(&st->full);
        }
        cur = nxt;
    }
}

/* ---------------- consumers (warpgroups 1, 2) ---------------- */
/* acc += P_b·s_x·s_w for block kb of the stage (see the file comment for why the fma is exact). */
static __device__ __forceinline__ void promote(float *acc, const float *p, const stage *st, int kb, bool fp4, int unsafe,
                                               int r0) {
    const int q = threadIdx.x & 3;
    const float sx0 = st->sx[kb][r0], sx1 = st->sx[kb][r0 + 8];
    if (!unsafe) {
        if (fp4) {
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const float2 sw = *(const float2 *)&st->sw[kb][8 * j + 2 * q];
                acc[4 * j + 0] = __fmaf_rn(p[4 * j + 0], __fmul_rn(sx0, sw.x), acc[4 * j + 0]);
                acc[4 * j + 1] = __fmaf_rn(p[4 * j + 1], __fmul_rn(sx0, sw.y), acc[4 * j + 1]);
                acc[4 * j + 2] = __fmaf_rn(p[4 * j + 2], __fmul_rn(sx1, sw.x), acc[4 * j + 2]);
                acc[4 * j + 3] = __fmaf_rn(p[4 * j + 3], __fmul_rn(sx1, sw.y), acc[4 * j + 3]);
            }
        } else {
#pragma unroll
            for (int g = 0; g < 4; g++) { /* columns 32g .. 32g+31 share one weight scale */
                const float sw = st->sw[kb][g], s0 = __fmul_rn(sx0, sw), s1 = __fmul_rn(sx1, sw);
#pragma unroll
                for (int jj = 0; jj < 4; jj++) {
                    const int j = 4 * g + jj;
                    acc[4 * j + 0] = __fmaf_rn(p[4 * j + 0], s0, acc[4 * j + 0]);
                    acc[4 * j + 1] = __fmaf_rn(p[4 * j + 1], s0, acc[4 * j + 1]);
                    acc[4 * j + 2] = __fmaf_rn(p[4 * j + 2], s1, acc[4 * j + 2]);
                    acc[4 * j + 3] = __fmaf_rn(p[4 * j + 3], s1, acc[4 * j + 3]);
                }
            }
        }
        return;
    }
    /* the CPU's literal sequence: f32(P·s_x), then ·s_w, then the add */
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const int c = 8 * j + 2 * q;
        const float swa = fp4 ? st->sw[kb][c] : st->sw[kb][c / QB], swb = fp4 ? st->sw[kb][c + 1] : swa;
        acc[4 * j + 0] = __fadd_rn(acc[4 * j + 0], __fmul_rn(__fmul_rn(p[4 * j + 0], sx0), swa));
        acc[4 * j + 1] = __fadd_rn(acc[4 * j + 1], __fmul_rn(__fmul_rn(p[4 * j + 1], sx0), swb));
        acc[4 * j + 2] = __fadd_rn(acc[4 * j + 2], __fmul_rn(__fmul_rn(p[4 * j + 2], sx1), swa));
        acc[4 * j + 3] = __fadd_rn(acc[4 * j + 3], __fmul_rn(__fmul_rn(p[4 * j + 3], sx1), swb));
    }
}

/* Split K: store block kb's scaled partials (P·s_x)·s_w — the exact f32 term the CPU adds — for the
 * rows < M; the ordered sum happens in split_sum_kernel. */
static __device__ __forceinline__ void store_partials(const gemm_params *p, const float *P, const stage *st, int kb, int kbg,
                                                      bool fp4, int r0, int m0, int n0) {
    const int q = threadIdx.x & 3;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = m0 + r0 + 8 * h;
        if (r >= p->M) continue;
        const float sx = st->sx[kb][r0 + 8 * h];
        float *dst = p->part + ((int64_t)kbg * p->M + r) * p->N;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int cl = 8 * j + 2 * q, c = n0 + cl;
            const float swa = fp4 ? st->sw[kb][cl] : st->sw[kb][cl / QB], swb = fp4 ? st->sw[kb][cl + 1] : swa;
            const float v0 = __fmul_rn(__fmul_rn(P[4 * j + 2 * h], sx), swa);
            const float v1 = __fmul_rn(__fmul_rn(P[4 * j + 2 * h + 1], sx), swb);
            if ((p->N & 1) == 0 && c + 1 < p->N) {
                *(float2 *)(dst + c) = make_float2(v0, v1);
            } else {
                if (c < p->N) dst[c] = v0;
                if (c + 1 < p->N) dst[c + 1] = v1;
            }
        }
    }
}

static __device__ __forceinline__ void consume(const gemm_params *p, bool fp4, stage *stages, int m0, int n0, int t0, int t1) {
    const int cw = (threadIdx.x >> 7) - 1, wtid = threadIdx.x & 127, lane = threadIdx.x & 31;
    const int r0 = cw * 64 + (wtid >> 5) * 16 + (lane >> 2); /* this thread's first tile row */
    float acc[64], part[64]; /* f32 running sums; one block's partials (fragment layout of mma_block) */
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.0f;
    /* a warp whose 16 rows all lie past M has nothing to store in split mode, but it still takes part in
     * the warpgroup's wgmma (.aligned) */
    for (int t = t0; t < t1; t++) {
        stage *st = &stages[(t - t0) % STAGES];
        mbar_wait(&st->full, (uint32_t)((t - t0) / STAGES) & 1u);
        const int4 u = *(const int4 *)st->unsafe;
        const int unsafe = u.x | u.y | u.z | u.w, nkb = min(TKB, p->KB - t * TKB);
        const uint32_t a = smem_u32(st->a) + cw * 64 * ROWB, b = smem_u32(st->b);
#pragma unroll
        for (int kb = 0; kb < TKB; kb++) {
            if (kb >= nkb) break;
            mma_fence();
            mma_block(part, desc_sw128(a + kb * QB), desc_sw128(b + kb * QB));
            mma_commit();
            mma_wait0(part);
            if (p->part) store_partials(p, part, st, kb, t * TKB + kb, fp4, r0, m0, n0);
            else promote(acc, part, st, kb, fp4, unsafe, r0);
        }
        mbar_arrive(&st->empty);
    }
    if (p->part) return;

    const bool pairs = (p->N & 1) == 0; /* two bf16 per 32-bit store when rows stay 4-byte aligned */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = m0 + r0 + 8 * h;
        if (r >= p->M) continue;
        uint16_t *yr = p->y + (int64_t)r * p->N;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int c = n0 + 8 * j + 2 * (lane & 3);
            const uint16_t lo = d_to_bf16(acc[4 * j + 2 * h]), hi = d_to_bf16(acc[4 * j + 2 * h + 1]);
            if (pairs && c + 1 < p->N) {
                *(uint32_t *)(yr + c) = (uint32_t)lo | ((uint32_t)hi << 16);
            } else {
                if (c < p->N) yr[c] = lo;
                if (c + 1 < p->N) yr[c + 1] = hi;
            }
        }
    }
}

static __device__ __forceinline__ void qgemm_body(const gemm_params *p, bool fp4) {
    extern __shared__ uint8_t smem_raw[];
    /* keep a shared-space derivation (no integer round trip) so the compiler emits LDS/STS */
    stage *stages = (stage *)(smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u));
    const int m0 = blockIdx.y * TM, n0 = blockIdx.x * TN, NT = (p->KB + TKB - 1) / TKB;
    const int t0 = blockIdx.z * p->split_stages, t1 = min(NT, t0 + p->split_stages);
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&stages[s].full, 128);
            mbar_init(&stages[s].empty, 256);
            mbar_init(&stages[s].packed_full, 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    /* No setmaxnreg: the whole kernel fits the 168 registers a 384-thread CTA gets, and an increase the
     * CTA's pool cannot cover would block forever. */
    if (threadIdx.x < 128) produce(p, fp4, stages, m0, n0, t0, t1);
    else consume(p, fp4, stages, m0, n0, t0, t1);
}

__global__ void __launch_bounds__(THREADS, 1) qgemm_fp8_kernel(const __grid_constant__ gemm_params p) { qgemm_body(&p, false); }
__global__ void __launch_bounds__(THREADS, 1) qgemm_fp4_kernel(const __grid_constant__ gemm_params p) { qgemm_body(&p, true); }

/* ================ persistent kernel: double-buffered block sums, two tile schedules ================
 * The kernel above serializes, in each consumer warpgroup, the tensor core (one block's wgmma and its
 * latency) with the CUDA cores (that block's promotion): two warpgroups overlap only each other. Here
 * every consumer keeps the NEXT block's wgmma in flight while it promotes the current one: partials
 * alternate between two register sets pa / pb (64 f32 each), so a warpgroup holds acc + pa + pb = 192
 * live f32 registers. setmaxnreg moves registers from the producer (which needs few) to the consumers:
 * the CTA's pool is what the launch allocated, 168 × 384 = 64,512 registers, and
 * 128 × PROD_REGS_* + 256 × CONS_REGS must not exceed it — an .inc the pool cannot grant waits forever.
 * The host checks the compiled register count before the first launch (qgemm2_usable).
 *
 * Numerics are the first kernel's, bit for bit: the same wgmma k32 with a zero accumulator per block
 * (P_b), the same promote() in ascending K. A stage past the end of K still runs its four wgmmas on the
 * TMA's zero fill (P = 0) with zero scales: acc + 0 = acc, because acc starts at +0 and an f32 sum
 * is −0 only when both addends are (so acc is never −0).
 *
 * Persistent CTAs (one per SM) walk a tile list, the smem stage ring running on across tiles, so the
 * producer loads the next tile while the consumers store the last one, and the block-0 wgmma of the
 * next tile is in flight during that store. Two tile lists:
 *  - dense: M × N in 128 × 128 tiles, grouped by 16 row-tiles (a band of A and the B tiles it meets
 *    stay in L2 together);
 *  - grouped experts: the rows of expert e are start[e] .. start[e+1] of one activation matrix; its
 *    row-tiles × n_w weight tables × column tiles, experts in order. The per-expert row-tile counts are
 *    read from device memory and prefix-summed in shared memory at the start of each CTA, so the host
 *    needs no copy of the routing. Rows of a tile past its expert's end are computed (they are other
 *    experts' rows or TMA zeros) and not stored; their scales are 0. */
/* Register split per thread (producer, consumer), chosen by ptxas -v: the fewest spilled bytes among
 * the splits that fit the pool (FP4's producer also rewrites nibbles). */
#define PROD_REGS_FP8 48
#define PROD_REGS_FP4 56
#define CONS_REGS 224
#define MAX_EXPERTS 1024
#define BAND 16 /* dense schedule: row-tiles per band */

typedef struct gemm2_params {
    gemm_params g;             /* dense: ta, tb, xs, wsc, M, N, K, KB, y (split_stages, part unused) */
    int grouped;               /* 0: dense; 1: expert groups below (ta, xs, M = all rows, N, K, KB as dense) */
    int n_exp, n_w;            /* experts; weight tables (1, or 2: w1 and w3 in one launch) */
    const int64_t *start;      /* int64 [n_exp + 1], device: expert e's rows */
    const CUtensorMap *maps[2]; /* per table: [n_exp] maps, device (one per expert) */
    const uint8_t *const *wscs[2]; /* per table: [n_exp] E8M0 [N, KB] pointers, device */
    uint16_t *ys[2];           /* per table: bf16 [M, N] */
} gemm2_params;

typedef struct tile_info {
    int a_row, rows; /* first row (A, xs, y), rows stored (≤ TM) */
    int n0;
    const CUtensorMap *tb;
    const uint8_t *wsc;
    uint16_t *y; /* bf16 [M, N] of the tile's table */
} tile_info;

/* Grouped schedule in shared memory: mt_pre[e] = row-tiles of experts 0 .. e−1 (mt_pre[n_exp] = all). */
typedef struct sched {
    int n_tiles, nt; /* tiles in all; column tiles */
    int *mt_pre;
} sched;

static __device__ void sched_init(const gemm2_params *p, sched *sc, int *mt_pre, int *scan) {
    const int N = p->g.N, M = p->g.M;
    sc->nt = (N + TN - 1) / TN;
    sc->mt_pre = mt_pre;
    if (!p->grouped) {
        sc->n_tiles = ((M + TM - 1) / TM) * sc->nt;
        return;
    }
    /* each thread sums a chunk of experts; a Hillis–Steele scan of the THREADS chunk sums; chunks out */
    const int E = p->n_exp, per = (E + THREADS - 1) / THREADS, e0 = threadIdx.x * per, e1 = min(E, e0 + per);
    int local = 0;
    for (int e = e0; e < e1; e++) {
        const int64_t a = min(max(p->start[e], (int64_t)0), (int64_t)M), b = min(max(p->start[e + 1], a), (int64_t)M);
        local += (int)((b - a + TM - 1) / TM);
    }
    scan[threadIdx.x] = local;
    __syncthreads();
    for (int off = 1; off < THREADS; off <<= 1) {
        const int v = threadIdx.x >= off ? scan[threadIdx.x - off] : 0;
        __syncthreads();
        scan[threadIdx.x] += v;
        __syncthreads();
    }
    int run = scan[threadIdx.x] - local;
    for (int e = e0; e < e1; e++) {
        mt_pre[e] = run;
        const int64_t a = min(max(p->start[e], (int64_t)0), (int64_t)M), b = min(max(p->start[e + 1], a), (int64_t)M);
        run += (int)((b - a + TM - 1) / TM);
    }
    if (threadIdx.x == THREADS - 1) mt_pre[E] = scan[THREADS - 1];
    __syncthreads();
    sc->n_tiles = mt_pre[E] * p->n_w * sc->nt;
}

static __device__ __forceinline__ tile_info tile_of(const gemm2_params *p, const sched *sc, int tile) {
    tile_info ti;
    if (!p->grouped) {
        const int mt = (p->g.M + TM - 1) / TM, band = tile / (BAND * sc->nt), first = band * BAND;
        const int bsize = min(mt - first, BAND), in = tile - band * BAND * sc->nt;
        ti.a_row = (first + in % bsize) * TM;
        ti.rows = min(TM, p->g.M - ti.a_row);
        ti.n0 = (in / bsize) * TN;
        ti.tb = &p->g.tb, ti.wsc = p->g.wsc, ti.y = p->g.y;
        return ti;
    }
    const int per_m = p->n_w * sc->nt, mg = tile / per_m, rem = tile - mg * per_m, w = rem / sc->nt;
    int lo = 0, hi = p->n_exp - 1; /* the expert e with mt_pre[e] ≤ mg < mt_pre[e + 1] */
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (sc->mt_pre[mid] <= mg) lo = mid;
        else hi = mid - 1;
    }
    const int e = lo;
    const int64_t a = min(max(p->start[e], (int64_t)0), (int64_t)p->g.M), b = min(max(p->start[e + 1], a), (int64_t)p->g.M);
    ti.a_row = (int)a + (mg - sc->mt_pre[e]) * TM;
    ti.rows = min(TM, (int)b - ti.a_row);
    ti.n0 = (rem - w * sc->nt) * TN;
    ti.tb = &p->maps[w][e], ti.wsc = p->wscs[w][e], ti.y = p->ys[w];
    return ti;
}

static __device__ __forceinline__ stage_scales scales_load2(const gemm_params *p, bool fp4, int t, const tile_info *ti, int tid) {
    const int kb0 = t * TKB, nkb = min(TKB, p->KB - kb0), aligned = (p->KB & 3) == 0;
    stage_scales s = {0, 0, 0, 0};
    if (tid < ti->rows) s.x = load_scale4(p->xs + (int64_t)(ti->a_row + tid) * p->KB + kb0, nkb, aligned), s.x_ok = 1;
    if (fp4) {
        if (ti->n0 + tid < p->N) s.w = load_scale4(ti->wsc + (int64_t)(ti->n0 + tid) * p->KB + kb0, nkb, aligned), s.w_ok = 1;
    } else if (tid < TN / QB && ti->n0 + tid * QB < p->N) {
        s.w = load_scale4(ti->wsc + (int64_t)(ti->n0 / QB + tid) * p->KB + kb0, nkb, aligned), s.w_ok = 1;
    }
    return s;
}

/* Producer. Iteration i fills stage i as soon as its slot is free: scales into shared memory, TMA of A
 * and B (FP4: the packed weights). FP4 stages also need the nibble rewrite, which must wait for the
 * packed bytes to land; it runs LAG stages behind the TMA issue, so the loads of the next LAG stages
 * are in flight while one is rewritten (done in line, the rewrite would expose one TMA latency per
 * stage). The rewrite of stage i − LAG comes before the wait for slot i: it depends only on its own
 * TMA, while slot i is freed by the consumers once they are done with stage i − STAGES, which is
 * complete since iteration i − STAGES + LAG < i. */
#define LAG (STAGES - 1)
static __device__ __forceinline__ void produce2(const gemm2_params *p2, bool fp4, stage *stages, const sched *sc) {
    const gemm_params *p = &p2->g;
    const int tid = threadIdx.x, lane = tid & 31, NT = (p->KB + TKB - 1) / TKB;
    const int my_tiles = blockIdx.x < sc->n_tiles ? (sc->n_tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    const int total = my_tiles * NT, lag = fp4 ? LAG : 0;
    if (total == 0) return;
    int tile = blockIdx.x, t = 0; /* the stage the next TMA issue fills: tile, K stage */
    tile_info ti = tile_of(p2, sc, tile);
    stage_scales cur = scales_load2(p, fp4, 0, &ti, tid);
    for (int i = 0; i < total + lag; i++) {
        if (fp4 && i >= lag) {
            const uint32_t j = (uint32_t)(i - lag);
            stage *sr = &stages[j % STAGES];
            mbar_wait(&sr->packed_full, (j / STAGES) & 1u);
            fp4_rewrite(sr, tid);
            fence_proxy_async(); /* the rewritten codes are read by wgmma (async proxy) */
            mbar_arrive(&sr->full);
        }
        if (i >= total) continue;
        stage *st = &stages[i % STAGES];
        int tn = t + 1, tilen = tile; /* the stage after this one, for the scale prefetch */
        tile_info tin = ti;
        if (tn == NT) {
            tn = 0, tilen += gridDim.x;
            if (tilen < sc->n_tiles) tin = tile_of(p2, sc, tilen);
        }
        stage_scales nxt = cur;
        if (i + 1 < total) nxt = scales_load2(p, fp4, tn, &tin, tid);
        mbar_wait(&st->empty, (((uint32_t)i / STAGES) & 1u) ^ 1u);
        const int unsafe = scales_store(&cur, fp4, st, min(TKB, p->KB - t * TKB), tid);
        const unsigned any = __any_sync(0xffffffffu, unsafe);
        if (lane == 0) st->unsafe[tid >> 5] = (int)any;
        if (fp4) { /* full: A's bytes now, the 128 arrivals after the rewrite */
            if (tid == 0) {
                mbar_arrive_tx(&st->packed_full, TN * ROWB / 2);
                tma_load(st->packed, ti.tb, t * TKB * QB / 2, ti.n0, &st->packed_full);
                mbar_expect_tx(&st->full, TM * ROWB);
                tma_load(st->a, &p->ta, t * TKB * QB, ti.a_row, &st->full);
            }
        } else if (tid == 0) {
            mbar_arrive_tx(&st->full, (TM + TN) * ROWB);
            tma_load(st->a, &p->ta, t * TKB * QB, ti.a_row, &st->full);
            tma_load(st->b, ti.tb, t * TKB * QB, ti.n0, &st->full);
        } else {
            mbar_arrive(&st->full);
        }
        cur = nxt, t = tn, tile = tilen, ti = tin;
    }
}

/* Wait until at most the newest committed group is pending; d (the older group's set) is named so no
 * read of it moves above the wait. */
static __device__ __forceinline__ void mma_wait1(float *d) { asm volatile("wgmma.wait_group.sync.aligned 1;\n" : F64 :: "memory"); }
static __device__ __forceinline__ void mma_issue(float *d, uint32_t a, uint32_t b) {
    mma_fence();
    mma_block(d, desc_sw128(a), desc_sw128(b));
    mma_commit();
}

static __device__ __forceinline__ void store_tile(const gemm_params *p, const float *acc, const tile_info *ti, int r0) {
    const int lane = threadIdx.x & 31;
    const bool pairs = (p->N & 1) == 0;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int rl = r0 + 8 * h;
        if (rl >= ti->rows) continue;
        uint16_t *yr = ti->y + (int64_t)(ti->a_row + rl) * p->N;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int c = ti->n0 + 8 * j + 2 * (lane & 3);
            const uint16_t lo = d_to_bf16(acc[4 * j + 2 * h]), hi = d_to_bf16(acc[4 * j + 2 * h + 1]);
            if (pairs && c + 1 < p->N) {
                *(uint32_t *)(yr + c) = (uint32_t)lo | ((uint32_t)hi << 16);
            } else {
                if (c < p->N) yr[c] = lo;
                if (c + 1 < p->N) yr[c + 1] = hi;
            }
        }
    }
}

/* Per stage: blocks 0..3 alternate between pa and pb; block b+1 (or the next stage's block 0) is issued
 * before block b is waited for and promoted. The last stage of the CTA issues a dummy block-0 wgmma on
 * its own (still unreleased) stage so that every iteration has the same wgmma structure; it is drained
 * after the loop and its result is never read. */
static __device__ __forceinline__ void consume2(const gemm2_params *p2, bool fp4, stage *stages, const sched *sc) {
    const gemm_params *p = &p2->g;
    const int cw = (threadIdx.x >> 7) - 1, wtid = threadIdx.x & 127, lane = threadIdx.x & 31;
    const int r0 = cw * 64 + (wtid >> 5) * 16 + (lane >> 2), NT = (p->KB + TKB - 1) / TKB;
    const int my_tiles = blockIdx.x < sc->n_tiles ? (sc->n_tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    const int total = my_tiles * NT;
    if (total == 0) return;
    float acc[64], pa[64], pb[64]; /* running sums; two blocks' partials (fragment layout of mma_block) */
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.0f, pa[i] = 0.0f, pb[i] = 0.0f;
    int tile = blockIdx.x, t = 0;
    tile_info ti = tile_of(p2, sc, tile);
    const uint32_t aoff = cw * 64 * ROWB;
    mbar_wait(&stages[0].full, 0);
    mma_issue(pa, smem_u32(stages[0].a) + aoff, smem_u32(stages[0].b));
    for (int j = 0; j < total; j++) {
        const uint32_t it = (uint32_t)j;
        stage *st = &stages[it % STAGES];
        const uint32_t a = smem_u32(st->a) + aoff, b = smem_u32(st->b);
        const int4 u = *(const int4 *)st->unsafe;
        const int unsafe = u.x | u.y | u.z | u.w;
        mma_issue(pb, a + QB, b + QB);
        mma_wait1(pa);
        promote(acc, pa, st, 0, fp4, unsafe, r0);
        mma_issue(pa, a + 2 * QB, b + 2 * QB);
        mma_wait1(pb);
        promote(acc, pb, st, 1, fp4, unsafe, r0);
        mma_issue(pb, a + 3 * QB, b + 3 * QB);
        mma_wait1(pa);
        promote(acc, pa, st, 2, fp4, unsafe, r0);
        uint32_t an = a, bn = b;
        if (j + 1 < total) {
            stage *sn = &stages[(it + 1) % STAGES];
            mbar_wait(&sn->full, ((it + 1) / STAGES) & 1u);
            an = smem_u32(sn->a) + aoff, bn = smem_u32(sn->b);
        }
        mma_issue(pa, an, bn);
        mma_wait1(pb);
        promote(acc, pb, st, 3, fp4, unsafe, r0);
        mbar_arrive(&st->empty);
        if (++t == NT) {
            store_tile(p, acc, &ti, r0);
#pragma unroll
            for (int i = 0; i < 64; i++) acc[i] = 0.0f;
            t = 0;
            tile += gridDim.x;
            if (tile < sc->n_tiles) ti = tile_of(p2, sc, tile);
        }
    }
    mma_wait0(pa);
}

#define SCHED_INTS (MAX_EXPERTS + 1 + THREADS)
#define SMEM2_BYTES (STAGES * sizeof(stage) + 1024 + SCHED_INTS * sizeof(int))

static __device__ __forceinline__ void qgemm2_body(const gemm2_params *p, bool fp4) {
    extern __shared__ uint8_t smem_raw[];
    stage *stages = (stage *)(smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u));
    int *mt_pre = (int *)(stages + STAGES), *scan = mt_pre + MAX_EXPERTS + 1;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&stages[s].full, 128);
            mbar_init(&stages[s].empty, 256);
            mbar_init(&stages[s].packed_full, 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    sched sc;
    sched_init(p, &sc, mt_pre, scan); /* ends with __syncthreads (grouped), else the one below */
    __syncthreads();
    if (threadIdx.x < 128) {
        if (fp4) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PROD_REGS_FP4));
        else asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PROD_REGS_FP8));
        produce2(p, fp4, stages, &sc);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONS_REGS));
        consume2(p, fp4, stages, &sc);
    }
}

__global__ void __launch_bounds__(THREADS, 1) qgemm2_fp8_kernel(const __grid_constant__ gemm2_params p) { qgemm2_body(&p, false); }
__global__ void __launch_bounds__(THREADS, 1) qgemm2_fp4_kernel(const __grid_constant__ gemm2_params p) { qgemm2_body(&p, true); }

/* Split K, second pass: y = bf16(Σ_b part[b]) in ascending b, one thread per output — the f32 sequence
 * of the unsplit promotion (fma(P, s, acc) = acc + p exactly, file comment), hence the same bits. */
__global__ void __launch_bounds__(256) split_sum_kernel(const float *part, int64_t MN, int KB, uint16_t *y) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= MN) return;
    float acc = 0.0f;
    for (int b = 0; b < KB; b++) acc = __fadd_rn(acc, part[(int64_t)b * MN + i]);
    y[i] = d_to_bf16(acc);
}

/* ---------------- host side ---------------- */
/* How many CTAs share one tile's K range. Decode-sized calls leave most of the 132 SMs idle with one CTA
 * per 128 × 128 tile and a serial chain of K blocks in each; splitting K over ~2 waves of CTAs fixes
 * that at the price of f32 partials [KB, M, N] through L2/HBM (4·M bytes per weight block column: worth
 * it up to M = 16). */
static int split_count(int64_t m, int64_t n, int64_t k) {
    const int64_t tiles = ((n + TN - 1) / TN) * ((m + TM - 1) / TM), nt = (k / QB + TKB - 1) / TKB;
    if (m > 16 || tiles >= 132 || nt < 4) return 1;
    int64_t s = (264 + tiles - 1) / tiles;
    if (s > nt / 2) s = nt / 2;
    return (int)s;
}
static size_t split_bytes(int64_t m, int64_t n, int64_t k) {
    return split_count(m, n, k) > 1 ? sizeof(float) * (size_t)(k / QB) * (size_t)m * (size_t)n : 0;
}

extern "C" size_t di_cuda_qgemm_wgmma_scratch(int64_t m, int64_t n, int64_t k) { return split_bytes(m, n, k); }

/* The persistent kernel's setmaxnreg split needs the launch to allocate the full pool (file comment
 * above qgemm2): refuse it, once, if ptxas gave the kernel fewer registers; the first kernel serves
 * then. Returns the SM count (the persistent grid) or 0. */
static int qgemm2_usable(int fp4) {
    static int state[2]; /* 0 unknown, -1 unusable, else SM count */
    int *st = &state[fp4 != 0];
    if (*st) return *st > 0 ? *st : 0;
    void (*kern)(gemm2_params) = fp4 ? qgemm2_fp4_kernel : qgemm2_fp8_kernel;
    cudaFuncAttributes fa;
    int dev, sms = 0;
    *st = -1;
    if (cudaFuncGetAttributes(&fa, kern) != cudaSuccess || cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0)
        return (void)cudaGetLastError(), 0;
    if (fa.numRegs * THREADS < 128 * (fp4 ? PROD_REGS_FP4 : PROD_REGS_FP8) + (THREADS - 128) * CONS_REGS) return 0;
    if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM2_BYTES) != cudaSuccess)
        return (void)cudaGetLastError(), 0;
    return *st = sms;
}

static int launch2(const gemm2_params *p, int fp4, int grid, cudaStream_t stream, const char *op, di_error *err) {
    (fp4 ? qgemm2_fp4_kernel : qgemm2_fp8_kernel)<<<grid, THREADS, SMEM2_BYTES, stream>>>(*p);
    return di_cuda_launched(op, err);
}

/* variant: 0 the best kernel for the call, 1 the first kernel (the persistent one's bit-exact reference) */
static int qgemm(const uint8_t *xq, const uint8_t *xs, int64_t m, int64_t k, const uint8_t *w, const uint8_t *ws, int fp4,
                 int64_t n, uint16_t *y, void *scratch, size_t scratch_bytes, void *stream, int variant, di_error *err) {
    const char *op = fp4 ? "qgemm_wgmma fp4" : "qgemm_wgmma fp8";
    if (m < 0 || n < 0 || k <= 0 || k % QB || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX ||
        (m + TM - 1) / TM > 65535)
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: M %lld, N %lld, K %lld (K a positive multiple of %d)", op,
                            (long long)m, (long long)n, (long long)k, QB);
    if ((uintptr_t)w % 16 || (uintptr_t)xq % 16)
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: weight or code pointer not 16-byte aligned", op);
    if (m == 0 || n == 0) return DI_OK;
    static int attr_set[2];
    void (*kern)(gemm_params) = fp4 ? qgemm_fp4_kernel : qgemm_fp8_kernel;
    if (!attr_set[fp4 != 0]) {
        cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM_BYTES);
        if (e != cudaSuccess) return di_error_set(err, DI_ERR_INTERNAL, "cuda %s: shared memory: %s", op, cudaGetErrorString(e));
        attr_set[fp4 != 0] = 1;
    }
    gemm_params p;
    memset(&p, 0, sizeof p);
    int rc = make_map(&p.ta, xq, m, k, ROWB, 1, op, err);
    if (!rc) rc = fp4 ? make_map(&p.tb, w, n, k / 2, ROWB / 2, 0, op, err) : make_map(&p.tb, w, n, k, ROWB, 1, op, err);
    if (rc) return rc;
    p.xs = xs, p.wsc = ws, p.M = (int)m, p.N = (int)n, p.K = (int)k, p.KB = (int)(k / QB), p.y = y;
    const int nt = (p.KB + TKB - 1) / TKB;
    int splits = split_count(m, n, k);
    if (splits > 1 && (!scratch || scratch_bytes < split_bytes(m, n, k) || (uintptr_t)scratch % 8)) splits = 1;
    const int sms = splits == 1 && variant == 0 ? qgemm2_usable(fp4) : 0;
    if (sms) { /* unsplit: the persistent kernel, one CTA per SM at most */
        gemm2_params p2;
        memset(&p2, 0, sizeof p2);
        p2.g = p;
        const int64_t tiles = ((m + TM - 1) / TM) * ((n + TN - 1) / TN);
        return launch2(&p2, fp4, (int)(tiles < sms ? tiles : sms), (cudaStream_t)stream, op, err);
    }
    p.split_stages = (nt + splits - 1) / splits;
    splits = (nt + p.split_stages - 1) / p.split_stages; /* no CTA without a stage */
    p.part = splits > 1 ? (float *)scratch : NULL;
    dim3 grid(di_cuda_blocks(n, TN), di_cuda_blocks(m, TM), (unsigned)splits);
    kern<<<grid, THREADS, SMEM_BYTES, (cudaStream_t)stream>>>(p);
    rc = di_cuda_launched(op, err);
    if (rc || splits == 1) return rc;
    split_sum_kernel<<<di_cuda_blocks(m * n, 256), 256, 0, (cudaStream_t)stream>>>(p.part, m * n, p.KB, y);
    return di_cuda_launched(op, err);
}

extern "C" int di_cuda_qgemm_wgmma(const uint8_t *xq, const uint8_t *xs, int64_t m, int64_t k, const uint8_t *w,
                                   const uint8_t *ws, int fp4, int64_t n, uint16_t *y, void *scratch, size_t scratch_bytes,
                                   void *stream, di_error *err) {
    return qgemm(xq, xs, m, k, w, ws, fp4, n, y, scratch, scratch_bytes, stream, 0, err);
}

extern "C" int di_cuda_qgemm_wgmma_v1(const uint8_t *xq, const uint8_t *xs, int64_t m, int64_t k, const uint8_t *w,
                                      const uint8_t *ws, int fp4, int64_t n, uint16_t *y, void *scratch, size_t scratch_bytes,
                                      void *stream, di_error *err) {
    return qgemm(xq, xs, m, k, w, ws, fp4, n, y, scratch, scratch_bytes, stream, 1, err);
}

/* ---------------- grouped experts ---------------- */
struct di_wgmma_experts {
    int n_exp;
    int64_t n, k;
    CUtensorMap *maps;       /* device [n_exp] */
    const uint8_t **wscs;    /* device [n_exp] */
};

extern "C" int di_cuda_wgmma_experts_create(int n_experts, const uint8_t *const *w, const uint8_t *const *ws, int64_t n,
                                            int64_t k, di_wgmma_experts **out, di_error *err) {
    const char *op = "wgmma_experts_create";
    *out = NULL;
    if (n_experts <= 0 || n_experts > MAX_EXPERTS || n <= 0 || k <= 0 || k % QB || n > INT32_MAX || k > INT32_MAX)
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: %d experts (1..%d), N %lld, K %lld (a positive multiple of %d)",
                            op, n_experts, MAX_EXPERTS, (long long)n, (long long)k, QB);
    CUtensorMap *maps = (CUtensorMap *)malloc(sizeof(CUtensorMap) * (size_t)n_experts);
    di_wgmma_experts *t = (di_wgmma_experts *)calloc(1, sizeof *t);
    if (!maps || !t) return free(maps), free(t), di_error_set(err, DI_ERR_NOMEM, "cuda %s: %d maps", op, n_experts);
    int rc = DI_OK;
    for (int e = 0; e < n_experts && !rc; e++) {
        if (!w[e] || !ws[e] || (uintptr_t)w[e] % 16 || (uintptr_t)ws[e] % 4)
            rc = di_error_set(err, DI_ERR_INVALID,
                              "cuda %s: expert %d: weight (16-byte) or scale (4-byte) pointer NULL or misaligned", op, e);
        else rc = make_map(&maps[e], w[e], n, k / 2, ROWB / 2, 0, op, err);
    }
    t->n_exp = n_experts, t->n = n, t->k = k;
    if (!rc && (cudaMalloc((void **)&t->maps, sizeof(CUtensorMap) * (size_t)n_experts) != cudaSuccess ||
                cudaMalloc((void **)&t->wscs, sizeof(void *) * (size_t)n_experts) != cudaSuccess ||
                cudaMemcpy(t->maps, maps, sizeof(CUtensorMap) * (size_t)n_experts, cudaMemcpyHostToDevice) != cudaSuccess ||
                cudaMemcpy((void *)t->wscs, ws, sizeof(void *) * (size_t)n_experts, cudaMemcpyHostToDevice) != cudaSuccess))
        rc = di_error_set(err, DI_ERR_NOMEM, "cuda %s: device tables for %d experts: %s", op, n_experts,
                          cudaGetErrorString(cudaGetLastError()));
    free(maps);
    if (rc) return di_cuda_wgmma_experts_destroy(t), rc;
    *out = t;
    return DI_OK;
}

extern "C" void di_cuda_wgmma_experts_destroy(di_wgmma_experts *t) {
    if (!t) return;
    cudaFree(t->maps);
    cudaFree((void *)t->wscs);
    free(t);
}

extern "C" int di_cuda_wgmma_fp4_grouped(const di_wgmma_experts *const *w, uint16_t *const *y, int n_w, const uint8_t *xq,
                                         const uint8_t *xs, int64_t rows, const int64_t *start, void *stream, di_error *err) {
    const char *op = "wgmma_fp4_grouped";
    if (n_w < 1 || n_w > 2 || !w[0] || (n_w == 2 && !w[1]))
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: %d weight tables (1 or 2)", op, n_w);
    const di_wgmma_experts *t0 = w[0];
    if (n_w == 2 && (w[1]->n_exp != t0->n_exp || w[1]->n != t0->n || w[1]->k != t0->k))
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: tables differ: %d×[%lld, %lld] vs %d×[%lld, %lld]", op, t0->n_exp,
                            (long long)t0->n, (long long)t0->k, w[1]->n_exp, (long long)w[1]->n, (long long)w[1]->k);
    if (rows < 0 || rows > INT32_MAX || (uintptr_t)xq % 16 || (uintptr_t)xs % 4 || ((uintptr_t)start % 8))
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: %lld rows; codes (16), scales (4), start (8) must be aligned",
                            op, (long long)rows);
    if (rows == 0) return DI_OK;
    const int sms = qgemm2_usable(1);
    if (!sms) return di_error_set(err, DI_ERR_UNSUPPORTED, "cuda %s: the persistent kernel cannot run here", op);
    gemm2_params p;
    memset(&p, 0, sizeof p);
    int rc = make_map(&p.g.ta, xq, rows, t0->k, ROWB, 1, op, err);
    if (rc) return rc;
    p.g.xs = xs, p.g.M = (int)rows, p.g.N = (int)t0->n, p.g.K = (int)t0->k, p.g.KB = (int)(t0->k / QB);
    p.grouped = 1, p.n_exp = t0->n_exp, p.n_w = n_w, p.start = start;
    for (int j = 0; j < n_w; j++) p.maps[j] = w[j]->maps, p.wscs[j] = w[j]->wscs, p.ys[j] = y[j];
    return launch2(&p, 1, sms, (cudaStream_t)stream, op, err);
}

static int qlinear_wgmma(const di_backend *be, int fp4, const uint16_t *x, int64_t m, int64_t k, const uint8_t *w,
                         const uint8_t *wsc, int64_t n, uint16_t *y, di_error *err) {
    const char *op = fp4 ? "linear_fp4" : "linear_fp8";
    if (m < 0 || n < 0 || k <= 0 || k % QB)
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: K = %lld must be a positive multiple of %d (M %lld, N %lld)",
                            op, (long long)k, QB, (long long)m, (long long)n);
    if (m == 0 || n == 0) return DI_OK;
    void *wsp;
    const size_t codes = ((size_t)(m * k) + 15) & ~(size_t)15, scales = ((size_t)(m * (k / QB)) + 15) & ~(size_t)15;
    const size_t part = split_bytes(m, n, k);
    int rc = di_cuda_workspace(be, codes + scales + part, &wsp, err);
    if (rc) return rc;
    uint8_t *xq = (uint8_t *)wsp, *xs = xq + codes; /* e4m3 [m, k], E8M0 [m, k/32] */
    cudaStream_t st = di_cuda_state(be)->stream;
    rc = di_cuda_act_quant_fp8(x, m * k, QB, xq, xs, st, err);
    if (rc) return rc;
    return di_cuda_qgemm_wgmma(xq, xs, m, k, w, wsc, fp4, n, y, xs + scales, part, st, err);
}

extern "C" int di_cuda_linear_fp8_wgmma(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint8_t *w,
                                        const uint8_t *ws, int64_t n, uint16_t *y, di_error *err) {
    return qlinear_wgmma(be, 0, x, m, k, w, ws, n, y, err);
}

extern "C" int di_cuda_linear_fp4_wgmma(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint8_t *w,
                                        const uint8_t *ws, int64_t n, uint16_t *y, di_error *err) {
    return qlinear_wgmma(be, 1, x, m, k, w, ws, n, y, err);
}

/* ---------------- test hook: one K block ---------------- */
/* a e4m3 [64, 32], b e4m3 [128, 32] → d f32 [64, 128]; one warpgroup, the GEMM's smem layout and wgmma */
__global__ void __launch_bounds__(128) block_dot_kernel(const uint8_t *a, const uint8_t *b, float *dout) {
    __shared__ __align__(1024) uint8_t sa[64 * ROWB];
    __shared__ __align__(1024) uint8_t sb[128 * ROWB];
    const int t = threadIdx.x, lane = t & 31;
    { /* 64 rows × 2 chunks of a, 128 × 2 of b */
        int r = t >> 1, c = t & 1;
        *(uint4 *)(sa + r * ROWB + ((c ^ (r & 7)) << 4)) = *(const uint4 *)(a + r * QB + c * 16);
#pragma unroll
        for (int j = 0; j < 2; j++) {
            int i = t + 128 * j;
            r = i >> 1, c = i & 1;
            *(uint4 *)(sb + r * ROWB + ((c ^ (r & 7)) << 4)) = *(const uint4 *)(b + r * QB + c * 16);
        }
    }
    fence_proxy_async();
    __syncthreads();
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; i++) d[i] = 0.0f;
    mma_fence();
    mma_block(d, desc_sw128(smem_u32(sa)), desc_sw128(smem_u32(sb)));
    mma_commit();
    mma_wait0(d);
    const int r0 = (t >> 5) * 16 + (lane >> 2);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        int c = 8 * j + 2 * (lane & 3);
        dout[r0 * 128 + c] = d[4 * j], dout[r0 * 128 + c + 1] = d[4 * j + 1];
        dout[(r0 + 8) * 128 + c] = d[4 * j + 2], dout[(r0 + 8) * 128 + c + 1] = d[4 * j + 3];
    }
}

extern "C" int di_cuda_wgmma_block_dot(const uint8_t *a, const uint8_t *b, float *d, void *stream, di_error *err) {
    block_dot_kernel<<<1, 128, 0, (cudaStream_t)stream>>>(a, b, d);
    return di_cuda_launched("wgmma_block_dot", err);
}
