/* Streaming-read bandwidth and a checkpoint's storage (tools/bench_read.h). */
#include "bench_read.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "util/log.h"

typedef struct rd_slice {
    const uint64_t *p; /* uint64 [n] */
    size_t n;
    uint64_t sum;
} rd_slice;

static void *rd_run(void *arg) {
    rd_slice *s = arg;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (size_t i = 0; i + 4 <= s->n; i += 4) a0 += s->p[i], a1 += s->p[i + 1], a2 += s->p[i + 2], a3 += s->p[i + 3];
    s->sum = a0 + a1 + a2 + a3;
    return NULL;
}

double bench_read_bandwidth(int n_threads, size_t bytes, int reps) {
    size_t n = bytes / sizeof(uint64_t);
    uint64_t *buf = malloc(bytes), sink = 0; /* uint64 [n] */
    if (!buf) return 0;
    for (size_t i = 0; i < n; i++) buf[i] = i; /* touch every page */
    rd_slice sl[256];
    pthread_t th[256];
    if (n_threads > 256) n_threads = 256;
    if (n_threads < 1) n_threads = 1;
    double best = 0;
    for (int rep = 0; rep < reps; rep++) {
        double t0 = di_now();
        for (int t = 0; t < n_threads; t++) {
            sl[t] = (rd_slice){buf + n / n_threads * t, n / n_threads, 0};
            if (t) pthread_create(&th[t], NULL, rd_run, &sl[t]);
        }
        rd_run(&sl[0]);
        for (int t = 1; t < n_threads; t++) pthread_join(th[t], NULL);
        double dt = di_now() - t0;
        for (int t = 0; t < n_threads; t++) sink += sl[t].sum;
        if (dt > 0 && (double)bytes / dt > best) best = (double)bytes / dt;
    }
    free(buf);
    if (sink == 42) fputc(' ', stderr); /* keeps the sums observable */
    return best;
}

/* ---------------- storage of a checkpoint ---------------- */

void bench_fs_name(const char *path, char *out, size_t cap) {
    static const struct {
        unsigned long magic;
        const char *name;
    } k[] = {{0x01021994ul, "tmpfs"},   {0xef53ul, "ext2/3/4"},  {0x794c7630ul, "overlay"}, {0x58465342ul, "xfs"},
             {0x9123683eul, "btrfs"},   {0x6969ul, "nfs"},       {0x65735546ul, "fuse"},    {0x858458f6ul, "ramfs"},
             {0x01021997ul, "9p"},      {0x2fc12fc1ul, "zfs"},   {0xf2f52010ul, "f2fs"},    {0x73717368ul, "squashfs"}};
    struct statfs sf;
    if (statfs(path, &sf) != 0) {
        snprintf(out, cap, "unknown");
        return;
    }
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if ((unsigned long)sf.f_type == k[i].magic) {
            snprintf(out, cap, "%s", k[i].name);
            return;
        }
    snprintf(out, cap, "0x%lx", (unsigned long)sf.f_type);
}

double bench_resident(void *const *maps, const size_t *bytes, int n) {
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0) return -1;
    double in = 0, all = 0;
    size_t chunk = (size_t)1 << 16; /* pages per mincore call: a 64 KiB vector */
    unsigned char *v = malloc(chunk); /* u8 [chunk]: mincore's per-page flags, bit 0 = resident */
    if (!v) return -1;
    for (int i = 0; i < n; i++) {
        size_t pages = (bytes[i] + (size_t)pg - 1) / (size_t)pg;
        for (size_t p0 = 0; p0 < pages; p0 += chunk) {
            size_t np = pages - p0 < chunk ? pages - p0 : chunk;
            if (mincore((char *)maps[i] + p0 * (size_t)pg, np * (size_t)pg, v) != 0) {
                free(v);
                return -1;
            }
            for (size_t j = 0; j < np; j++) in += v[j] & 1;
            all += (double)np;
        }
    }
    free(v);
    return all > 0 ? in / all : 1;
}

void bench_meminfo(bench_storage *st) {
    st->mem_total_gib = st->mem_avail_gib = st->dirty_gib = st->writeback_gib = -1;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) st->mem_total_gib = (double)kb / (1 << 20);
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) st->mem_avail_gib = (double)kb / (1 << 20);
        if (sscanf(line, "Dirty: %llu kB", &kb) == 1) st->dirty_gib = (double)kb / (1 << 20);
        if (sscanf(line, "Writeback: %llu kB", &kb) == 1) st->writeback_gib = (double)kb / (1 << 20);
    }
    fclose(f);
}

double bench_storage_read_bytes(void) {
    FILE *f = fopen("/proc/self/io", "r");
    if (!f) return -1;
    char line[128];
    double r = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long long b;
        if (sscanf(line, "read_bytes: %llu", &b) == 1) r = (double)b;
    }
    fclose(f);
    return r;
}
