/* MXFP4 decode GEMV (M ≤ 16 rows, in groups of ≤ 4 per launch) with the exact 32-term block sums on the
 * int8 tensor cores (mma.sync m16n8k32 s8·s8 → s32): the launches of linear_fp4; the device core gvm_run
 * is in cuda_gemv_mma.cuh (cuda_moe.cu's expert GEMVs call it too). The default for linear_fp4's
 * small-M path (cuda_gemm.cu) and moe_routed's two expert launches; DI_CUDA_GEMV=simt keeps the CUDA-core
 * GEMV of cuda_gemv.cuh (the same bits). Exactness is argued in cuda_gemv_mma.cuh, checked by the host
 * emulation tests/test_gemv_mma_emu.c (the same lane functions, the PTX fragment layouts emulated) and on
 * the H200 by tests/cuda/test_cuda_gemv_mma.c (2026-11-30: 106/106 rows bit-identical to the CUDA-core
 * GEMV and the CPU op, compute-sanitizer clean; moe_routed 1.23× / 1.73× / 1.88× faster at T 1 / 5 / 16).
 *
 * Work split. A CTA takes a tile of NC (8 or 16) output columns × all K for MT (1, 2, 4) x rows; its
 * warps share K in units of GVM_UP block pairs (unit u: blocks 4u … 4u + 3), unit u to warp u mod W.
 * For a block pair a lane loads 4 weight bytes per (row g / g+8, block) — the 8 codes the A fragment
 * wants from it (gvm_a_frag) — and the pair's two scale bytes of the row whose output it writes; the
 * next unit's loads are issued before the current one is computed. Per pair and n8 tile: 2 MMAs per
 * block that the tile holds (A⁺ and A⁻ against the same B), C⁺ − C⁻, one shuffle to assemble S of one
 * (row, block) per lane, P_b = ((S·2^−10)·s_x)·s_w into shared memory (computed as (S·(s_x·2^−10))·s_w,
 * the same bits: gvm_block_value). After the tile's last unit one
 * thread per (x row, column) adds P_0 … P_{KB−1} in order and rounds to bf16 — cuda_gemv.cuh's code.
 *
 * The x rows: their digit planes (s8 [MT][3][K + pad], built once per CTA from the e4m3 codes) give the
 * B fragments by one 8-byte shared load per lane, block and tile. A CTA builds them through a table of the
 * 256 codes' digits (gvm_x_digits_tab: four lookups and five byte permutes per 4 codes): the conversion
 * per code, with the row index divisions, was 27 % of the instructions of moe_routed's up launch at T 1,
 * where each of its ~1,000 CTAs prepares the same row for one or two tiles (Nsight Compute, H200,
 * 2026-12-02: 108 → 97 µs for the step, bench/NOTES-gpu.md session 17). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_gemv_mma.cuh"
#include "backend/cuda/cuda_ops.h"

#define GVM_MAX_M 16  /* rows of one call (groups of ≤ 4 per launch) */
#define GVM_SMEM_MAX (200 * 1024)

struct gvm_rows_linear {
    int64_t r0;
    __device__ int64_t operator()(int m) const { return r0 + m; }
};
struct gvm_out_linear {
    uint16_t *y;
    int64_t N, r0;
    __device__ void operator()(int m, int64_t n, float v) const { y[(r0 + m) * N + n] = d_to_bf16(v); }
};

template <int MT, int NC>
__global__ void __launch_bounds__(GVM_WARPS * 32) gvm_linear_kernel(const gv_args a, int64_t r0, int mt, uint16_t *y) {
    extern __shared__ uint4 gvm_sm[];
    gvm_run<MT, NC>(a, gvm_rows_linear{r0}, mt, gvm_out_linear{y, a.N, r0}, blockIdx.x, gridDim.x,
                    (unsigned char *)gvm_sm);
}

template <int MT, int NC>
static int gvm_launch_t(const gv_args &a, int64_t r0, int mt, uint16_t *y, cudaStream_t st, di_error *err) {
    const int threads = gvm_threads(a.K);
    const size_t smem = (size_t)gvm_smem(MT, NC, a.K);
    static bool raised = false; /* the dynamic shared-memory limit, raised once per instantiation */
    if (!raised) {
        cudaFuncSetAttribute(gvm_linear_kernel<MT, NC>, cudaFuncAttributeMaxDynamicSharedMemorySize, GVM_SMEM_MAX);
        raised = true;
    }
    int occ = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, gvm_linear_kernel<MT, NC>, threads, smem) != cudaSuccess ||
        occ < 1)
        occ = 1;
    const int64_t ntiles = (a.N + NC - 1) / NC;
    const int64_t grid = ntiles < (int64_t)occ * di_cuda_sm_count() ? ntiles : (int64_t)occ * di_cuda_sm_count();
    gvm_linear_kernel<MT, NC><<<(unsigned)grid, threads, smem, st>>>(a, r0, mt, y);
    return di_cuda_launched("linear_fp4 (mma gemv)", err);
}

/* Column tile: 16 (one MMA's rows) when that gives at least one tile per SM, else 8 (half the A rows are
 * zero, ~1.8x the instructions per weight byte, but twice the CTAs for narrow weights). A guess until
 * the device measurement (test_cuda_gemv_mma's bench times both). */
static int g_gvm_nc = 0;
extern "C" void di_cuda_gemv_mma_set_tile(int nc) { g_gvm_nc = nc == 8 || nc == 16 ? nc : 0; }

extern "C" int di_cuda_gemv_mma_fits(int64_t m, int64_t k, const void *w, const void *ws) {
    return m >= 1 && m <= GVM_MAX_M && k > 0 && k % (64 * GVM_UP) == 0 && (uintptr_t)w % 16 == 0 &&
           (uintptr_t)ws % 2 == 0 && gvm_smem(4, 16, k) <= GVM_SMEM_MAX;
}

static int g_gvm_on = -1; /* −1: not read yet */
extern "C" int di_cuda_gemv_mma_enabled(void) { return di_cuda_env_switch(&g_gvm_on, "DI_CUDA_GEMV", "simt"); }
extern "C" void di_cuda_gemv_mma_set_enabled(int on) { g_gvm_on = on ? 1 : 0; }

extern "C" int di_cuda_gemv_mma_run(const uint8_t *xq, const uint8_t *xs, int64_t m, int64_t k, const uint8_t *w,
                                    const uint8_t *ws, int64_t n, uint16_t *y, void *stream, di_error *err) {
    if (!di_cuda_gemv_mma_fits(m, k, w, ws) || n < 1)
        return di_error_set(err, DI_ERR_INVALID,
                            "cuda mma gemv: M %lld (1..%d), K %lld (a multiple of %d), N %lld, weight / scale "
                            "pointers 16- / 2-byte aligned",
                            (long long)m, GVM_MAX_M, (long long)k, 64 * GVM_UP, (long long)n);
    const gv_args a = {xq, xs, w, ws, n, k};
    cudaStream_t st = (cudaStream_t)stream;
    const int nc = g_gvm_nc ? g_gvm_nc : ((n + 15) / 16 >= (int64_t)di_cuda_sm_count() ? 16 : 8);
    for (int64_t r0 = 0; r0 < m;) {
        const int64_t left = m - r0;
        const int mt = left == 1 ? 1 : left == 2 ? 2 : 4, used = (int)(left < mt ? left : mt);
        int rc;
        switch (mt * 100 + nc) {
        case 108: rc = gvm_launch_t<1, 8>(a, r0, used, y, st, err); break;
        case 116: rc = gvm_launch_t<1, 16>(a, r0, used, y, st, err); break;
        case 208: rc = gvm_launch_t<2, 8>(a, r0, used, y, st, err); break;
        case 216: rc = gvm_launch_t<2, 16>(a, r0, used, y, st, err); break;
        case 408: rc = gvm_launch_t<4, 8>(a, r0, used, y, st, err); break;
        default: rc = gvm_launch_t<4, 16>(a, r0, used, y, st, err); break;
        }
        if (rc) return rc;
        r0 += used;
    }
    return DI_OK;
}

extern "C" int di_cuda_gemv_mma_codes(const di_backend *be, const uint8_t *xq, const uint8_t *xs, int64_t m, int64_t k,
                                      const uint8_t *w, const uint8_t *ws, int64_t n, uint16_t *y, di_error *err) {
    return di_cuda_gemv_mma_run(xq, xs, m, k, w, ws, n, y, di_backend_cuda_stream(be), err);
}
