/* The CPU reference backend: fills the di_backend table (backend.h) with the CPU kernels.
 * Kernels come from the CPU op files where they exist and from graph_extra*.c otherwise. */
#include <stdlib.h>

#include "backend/backend.h"
#include "backend/cpu/graph_extra.h"
#include "util/error.h"

int di_backend_cpu_create(int n_threads, di_backend **out, di_error *err) {
    if (n_threads < 1) return di_error_set(err, DI_ERR_INVALID, "cpu backend: %d threads (need ≥ 1)", n_threads);
    di_backend *be = calloc(1, sizeof(*be));
    if (!be) return di_error_set(err, DI_ERR_NOMEM, "cpu backend");
    be->name = "cpu";
    be->linear_fp8 = di_gx_linear_fp8;
    be->linear_fp4 = di_gx_linear_fp4;
    be->linear_bf16 = di_gx_linear_bf16;
    be->linear_f32 = di_gx_linear_f32;
    be->linear_grouped_bf16 = di_gx_linear_grouped_bf16;
    be->rmsnorm = di_gx_rmsnorm;
    be->rope = di_gx_rope;
    be->qdq_fp8 = di_gx_qdq_fp8;
    be->qdq_fp4_e8m0 = di_gx_qdq_fp4_e8m0;
    be->qdq_fp4_e4m3 = di_gx_qdq_fp4_e4m3;
    be->scale_bf16 = di_gx_scale_bf16;
    be->embed = di_gx_embed;
    be->hc_mixes = di_gx_hc_mixes;
    be->hc_sinkhorn = di_gx_hc_sinkhorn;
    be->hc_collapse = di_gx_hc_collapse;
    be->hc_expand = di_gx_hc_expand;
    be->compress_pool = di_gx_compress_pool;
    be->indexer_scores = di_gx_indexer_scores;
    be->candidate_mask = di_gx_candidate_mask;
    be->topk = di_gx_topk;
    be->sparse_attn = di_gx_sparse_attn;
    be->router = di_gx_router;
    be->swiglu = di_gx_swiglu;
    be->gather_rows = di_gx_gather_rows;
    be->scatter_add_rows = di_gx_scatter_add_rows;
    be->f32_to_bf16 = di_gx_f32_to_bf16;
    be->fill_f32 = di_gx_fill_f32;
    be->engram_lookup = di_gx_engram_lookup;
    be->engram_gate = di_gx_engram_gate;
    *out = be;
    return DI_OK;
}

void di_backend_destroy(di_backend *be) { free(be); }
