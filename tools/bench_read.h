/* The CPU's memory roofline for the benches (bench cpu, bench gpu --device cpu): best-of-`reps` bytes/s
 * of n_threads threads each summing one slice of a `bytes` buffer (streaming reads, 4 independent
 * chains per thread so the loads, not the adds, bound it). 0 when the buffer cannot be allocated. */
#ifndef DI_TOOLS_BENCH_READ_H
#define DI_TOOLS_BENCH_READ_H

#include <stddef.h>

double bench_read_bandwidth(int n_threads, size_t bytes, int reps);

/* Where a checkpoint's bytes come from, for the load-time report of bench gpu: a model load that reads
 * them from a block device page by page (mmap faults of 128 KiB read-around) runs at the disk's speed,
 * one that finds them in RAM (tmpfs, page cache) at the copy's. */
typedef struct bench_storage {
    char fs[24];          /* file system of the directory: "tmpfs", "ext4", "overlay", … or "0x<magic>" */
    double resident;      /* fraction of the mapped bytes in RAM (mincore), -1 when unknown */
    double mem_total_gib, mem_avail_gib; /* /proc/meminfo MemTotal / MemAvailable, -1 when unknown */
    double dirty_gib, writeback_gib;     /* Dirty / Writeback: written data not yet on the disk, -1 unknown */
} bench_storage;

/* The file system name of path (statfs); ext2, ext3 and ext4 share one magic. */
void bench_fs_name(const char *path, char *out, size_t cap);
/* Of the n page-aligned mappings maps[i] of bytes[i] bytes: the fraction of pages in RAM (mincore),
 * -1 when mincore fails. */
double bench_resident(void *const *maps, const size_t *bytes, int n);
/* Bytes this process has made the kernel read from storage (/proc/self/io read_bytes: page faults on
 * mmapped files included, page-cache hits not), -1 when unknown. */
double bench_storage_read_bytes(void);
/* MemTotal, MemAvailable, Dirty and Writeback of /proc/meminfo in GiB (-1 each when absent). */
void bench_meminfo(bench_storage *st);

#endif
