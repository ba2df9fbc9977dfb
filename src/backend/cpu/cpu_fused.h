/* CPU implementations of the fused slots of backend.h (hc_pre, gather_topk): the existing CPU ops called
 * in the slot's documented order, so a graph that takes the fused path on the CPU computes exactly what
 * the unfused path computes. They exist so that the fused contracts have a reference to test a device
 * backend against, and so that the graph's fused path runs on the CPU (tests/test_fused_slots.c). */
#ifndef DI_BACKEND_CPU_CPU_FUSED_H
#define DI_BACKEND_CPU_CPU_FUSED_H

#include "backend/backend.h"

int di_cpu_hc_pre(const di_backend *be, uint16_t *x, const uint16_t *z, const float *post_in, const float *comb_in,
                  int64_t m, int hc, int64_t d, const float *fn, float norm_eps, const float *scale, const float *base,
                  int iters, float hc_eps, const float *pre_in, const uint16_t *norm_w, float *mixes, float *pre,
                  float *post, float *comb, uint16_t *h, di_error *err);

int di_cpu_gather_topk(const di_backend *be, di_row_codec codec, const uint8_t *base, int64_t n_entries,
                       const int32_t *pages, int64_t page_entries, int64_t page_rows, int64_t row_off,
                       const int32_t *top, int64_t m, int k, int64_t d, int32_t row0, uint16_t *rows, int32_t *idx,
                       int64_t ldi, di_error *err);

/* Fill the fused slots of a CPU backend (either kernel variant), and gather_topk_seqs (gather_topk per
 * sequence, index_rows.c). */
void di_cpu_fused_install(di_backend *be);

#endif
