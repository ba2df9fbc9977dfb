/* BENCH-ONLY per-op GPU time of a CUDA backend (`deepinfer bench gpu --op-times`).
 *
 * di_cuda_optime_install replaces every compute and on-stream memory slot of a CUDA backend's op table
 * with a wrapper that, while timing is enabled, records a CUDA event on the backend's stream before and
 * after the op; with timing off the wrapper only forwards the call. Nothing is synchronised while ops
 * run: di_cuda_optime_collect waits for the stream once and sums the event intervals per (tag, op,
 * k, n), where tag is whatever the caller set last (bench gpu: the block index from the forward's
 * block hook) and k, n are the GEMM shape for the linear ops (0 for the others). An interval is the
 * op's own GPU time, launch gaps excluded; the sum over a block next to the block's wall time shows
 * how much of it is launch / host overhead.
 *
 * One backend per process (the wrappers keep the original slots in statics); not thread safe. */
#ifndef DI_BACKEND_CUDA_OPTIME_H
#define DI_BACKEND_CUDA_OPTIME_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct di_optime_row {
    int tag;        /* di_cuda_optime_tag at the time of the calls */
    const char *op; /* the backend.h slot name, e.g. "linear_fp4" */
    int64_t k, n;   /* linear ops: reduction and output width (grouped: k and r); else 0 */
    int64_t calls;  /* calls aggregated in this row */
    int64_t rows;   /* Σ m over the calls (linear ops) */
    double ms;      /* Σ GPU time between the op's two events */
} di_optime_row;

/* Wraps be's slots (a CUDA backend). Timing starts disabled. */
int di_cuda_optime_install(di_backend *be, di_error *err);
void di_cuda_optime_enable(int on);
/* timing is enabled: the backend then runs its side lane in issue order (backend.h side_begin), so each
 * interval is one op alone */
bool di_cuda_optime_on(void);
void di_cuda_optime_tag(int tag);
/* Waits for the recorded events, returns the aggregated rows (malloc'd; sorted by tag, then time,
 * largest first) and forgets them. */
int di_cuda_optime_collect(di_optime_row **rows, int *n_rows, di_error *err);

/* Marks: an event recorded on the backend's stream at a point of a pass, which a pass recorded as a
 * CUDA graph keeps as an event-record node (cudaEventRecordExternal). So the GPU time between two
 * points of a graph replay can be read without synchronising inside the pass — `bench gpu`'s
 * graph-timed rows, from a block hook that only marks (forward.h block_hook_async).
 * di_cuda_mark records mark `slot` (0 <= slot < DI_CUDA_MARKS; created on first use);
 * di_cuda_mark_ms waits for mark b and gives the milliseconds from mark a to mark b of the last
 * pass that recorded or replayed both. Independent of the op timing above. */
#define DI_CUDA_MARKS 64
int di_cuda_mark(const di_backend *be, int slot, di_error *err);
int di_cuda_mark_ms(int a, int b, double *ms, di_error *err);
/* Block marks: block L's start is mark 2L, its end 2L + 1, for L < DI_CUDA_MARK_BLOCKS.
 * di_cuda_mark_block is a forward block hook (forward.h di_block_hook_fn, with block_hook_async) whose
 * ctx is the CUDA backend: it marks each block's start and end; later blocks carry no marks. */
#define DI_CUDA_MARK_BLOCKS (DI_CUDA_MARKS / 2)
int di_cuda_mark_block(void *be, int L, bool after, di_error *err);

#ifdef __cplusplus
}
#endif

#endif
