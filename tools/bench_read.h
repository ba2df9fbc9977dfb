/* The CPU's memory roofline for the benches (bench cpu, bench gpu --device cpu): best-of-`reps` bytes/s
 * of n_threads threads each summing one slice of a `bytes` buffer (streaming reads, 4 independent
 * chains per thread so the loads, not the adds, bound it). 0 when the buffer cannot be allocated. */
#ifndef DI_TOOLS_BENCH_READ_H
#define DI_TOOLS_BENCH_READ_H

#include <stddef.h>

double bench_read_bandwidth(int n_threads, size_t bytes, int reps);

#endif
