/* The moe_routed slot's device-side plan and expert table (cuda_moe.cu), shared with the grouped expert
 * GEMM of cuda_moe_mm.cu. */
#ifndef DI_BACKEND_CUDA_CUDA_MOE_CUH
#define DI_BACKEND_CUDA_CUDA_MOE_CUH

#include "backend/cuda/cuda_common.cuh"

typedef struct moe_table {
    const uint8_t *p[DI_MOE_ROUTED_MAX_EXPERTS][6]; /* w1 s1 w3 s3 w2 s2 of each expert */
} moe_table;

/* The plan (device memory): pairs i = t·k + j ranked by (expert, i); groups g of one expert each. */
typedef struct moe_plan {
    int32_t *order;    /* int32 [P] pair of rank r */
    float *rw;         /* f32 [P] routing weight of rank r */
    int32_t *rank;     /* int32 [P] rank of pair i, −1 for a skipped pair */
    int32_t *g_expert; /* int32 [G] */
    int32_t *g_start;  /* int32 [G] first rank of the group */
    int32_t *g_count;  /* int32 [G] */
    int32_t *g_pass;   /* int32 [G + 1] first GEMV pass of the group: passes of MT rows, Σ ⌈count / MT⌉ before it */
    int32_t *g_pass2;  /* int32 [G + 1] the same for the grouped GEMM's passes of MOE_MM_ROWS rows */
    int32_t *n_groups; /* int32 [1] */
} moe_plan;

/* ---- the grouped expert GEMM (cuda_moe_mm.cu) ----
 * It takes the groups of at least a given number of rows (the plan's mm_min), the GEMVs the others: a
 * group has GEMV passes (g_pass) or GEMM passes (g_pass2), never both. */
#define MOE_MM_ROWS 16 /* rows of one GEMM pass */

/* Workspace bytes for the x digit planes and scales of P ranked rows of K inputs */
size_t moe_mm_planes_bytes(int P, int64_t K);
size_t moe_mm_scales_bytes(int P, int64_t K);
/* Expects d and inter multiples of 128, every expert's codes 16-byte and scales 4-byte aligned (cuda_moe.cu
 * checks). The up projection (w1 → g, w3 → u, bf16 [P, inter] by rank) of the act-quantized token rows xq / xs
 * [m, d] (rank r reads token order[r] / k), or the down projection (w2 → y bf16 [P, d]) of the ranked
 * act-quantized rows xq / xs [P, inter] (down: order NULL). planes / sxT: workspace of the sizes above. */
int moe_mm_run(const moe_table &tab, const moe_plan &pl, int P, int k, int down, const uint8_t *xq, const uint8_t *xs,
               int64_t d, int64_t inter, uint8_t *planes, float *sxT, uint16_t *y0, uint16_t *y1, cudaStream_t st,
               di_error *err);

#endif
