/* The CPU backend's batched cache-row slots (rows_batch.c; backend.h "batched cache rows"). */
#ifndef DI_BACKEND_CPU_CPU_ROWS_H
#define DI_BACKEND_CPU_CPU_ROWS_H

#include "backend/backend.h"

/* Fills row_encode_scatter, row_decode_gather, compress_pool_ring and sparse_attn_seqs. The last two run
 * the table's own compress_pool / sparse_attn, so call it after those are set (FAST or SCALAR). */
void di_cpu_rows_install(di_backend *be);

/* The batched index selection (index_rows.c; backend.h "batched index selection"): indexer_scores_rows,
 * candidate_mask_rows and topk_rows run the table's own per-sequence ops row by row, so call it after
 * those are set; gather_topk_seqs runs its gather_topk, installed with it (fused.c). */
void di_cpu_index_rows_install(di_backend *be);
void di_cpu_gather_seqs_install(di_backend *be);

#endif
