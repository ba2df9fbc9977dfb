/* Hopper plumbing shared by the wgmma GEMMs (cuda_gemm_wgmma.cu, cuda_gemm_igmma.cu) and the staged sparse
 * attention (cuda_sparse_attn.cuh): mbarriers, 1-D bulk copies, TMA tile loads, 128-byte-swizzled
 * shared-memory matrix descriptors, the wgmma fence / commit, and the host's 2-D tensor maps (the driver's
 * encoder fetched at run time, so nothing links -lcuda). sm_90a. */
#ifndef DI_BACKEND_CUDA_CUDA_TMA_CUH
#define DI_BACKEND_CUDA_CUDA_TMA_CUH

#include <cuda.h>         /* CUtensorMap and its enums */
#include <cudaTypedefs.h> /* PFN_cuTensorMapEncodeTiled */

#include "backend/cuda/cuda_common.cuh"

/* ---------------- PTX wrappers ---------------- */
static __device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* generic-proxy shared-memory writes (st.shared) made visible to the tensor cores' async proxy */
static __device__ __forceinline__ void fence_proxy_async(void) { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

static __device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
static __device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_u32(bar)) : "memory");
}
/* one arrival that also announces `bytes` of TMA data the phase must wait for */
static __device__ __forceinline__ void mbar_arrive_tx(uint64_t *bar, uint32_t bytes) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(smem_u32(bar)),
                 "r"(bytes) : "memory");
}
/* Wait for the completion of the phase with this parity (a fresh barrier counts parity 1 as done). A
 * protocol bug would otherwise hang the GPU: after 10 s of waiting the kernel traps, and the launch
 * reports an error. */
static __device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    uint32_t done, tries = 0;
    uint64_t t0 = 0;
    for (;;) {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(smem_u32(bar)), "r"(parity)
                     : "memory");
        if (done) return;
        if ((++tries & 1023u) == 0) {
            uint64_t now;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
            if (!t0) t0 = now;
            else if (now - t0 > 10000000000ull) __trap();
        }
    }
}

/* 1-D bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from global memory into
 * dst, completing on bar (whose phase must expect the bytes) */
static __device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}

/* TMA: the box at (c0 = byte column, c1 = row) of the tensor map into dst, completing on bar */
static __device__ __forceinline__ void tma_load(void *dst, const CUtensorMap *map, int c0, int c1, uint64_t *bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(smem_u32(bar))
                 : "memory");
}

/* Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row core groups 1024 bytes apart (SBO);
 * LBO is unused for a swizzled K-major operand whose K extent fits the swizzle row. Moving along K
 * inside the 128-byte row is a plain start-address offset (the swizzle is a function of the address). */
static __device__ __forceinline__ uint64_t desc_sw128(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3ffffu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
static __device__ __forceinline__ void mma_fence(void) { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void mma_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

/* announce TMA bytes on a barrier without arriving (the arrivals come later, after the producer's own
 * shared-memory writes of the stage) */
static __device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

/* A 2-D uint8 tensor map over rows × row_bytes (row-major), box box_cols bytes × 128 rows. */
static int make_map(CUtensorMap *map, const void *base, int64_t rows, int64_t row_bytes, uint32_t box_cols, int swizzle,
                    const char *op, di_error *err) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode;
    if (!encode) {
        cudaDriverEntryPointQueryResult q;
        void *fn = NULL;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess || !fn)
            return di_error_set(err, DI_ERR_UNSUPPORTED, "cuda %s: the driver has no cuTensorMapEncodeTiled", op);
        encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    }
    const cuuint64_t dims[2] = {(cuuint64_t)row_bytes, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)row_bytes};
    const cuuint32_t box[2] = {box_cols, 128}, estr[2] = {1, 1};
    CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)base, dims, strides, box, estr,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: tensor map [%lld, %lld] bytes rejected (CUresult %d)", op,
                            (long long)rows, (long long)row_bytes, (int)r);
    return DI_OK;
}

#endif
