/* The CPU backend's batched cache-row slots (rows_batch.c; backend.h "batched cache rows"). */
#ifndef DI_BACKEND_CPU_CPU_ROWS_H
#define DI_BACKEND_CPU_CPU_ROWS_H

#include "backend/backend.h"

/* Fills row_encode_scatter, row_decode_gather and compress_pool_ring. compress_pool_ring runs the
 * table's own compress_pool group by group, so call it after that slot is set (FAST or SCALAR). */
void di_cpu_rows_install(di_backend *be);

#endif
