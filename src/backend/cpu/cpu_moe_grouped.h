/* The moe_grouped slot (backend.h) for the CPU backends (moe_grouped.c): the host-planned expert loop
 * over the backend's own gather_rows / linear_fp4 / swiglu / scatter_add_rows slots, after checking
 * that the plan's row lists and rank agree. */
#ifndef DI_BACKEND_CPU_CPU_MOE_GROUPED_H
#define DI_BACKEND_CPU_CPU_MOE_GROUPED_H

#include "backend/backend.h"

int di_cpu_moe_grouped(const di_backend *be, const uint16_t *x, int64_t m, int64_t d, int64_t inter, int k, int n_exp,
                       const di_moe_expert *experts, const di_moe_plan *plan, float lim, float *acc, void *ws,
                       di_error *err);

#endif
