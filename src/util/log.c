/* stderr logging with a process-wide level (see log.h). */
#include "util/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

/* Read by every thread that logs, set by the CLI at startup: atomic so a change is never a data race. */
static atomic_int g_level = DI_LOG_INFO;

void di_log_set_level(di_log_level level) { atomic_store_explicit(&g_level, (int)level, memory_order_relaxed); }
di_log_level di_log_get_level(void) { return (di_log_level)atomic_load_explicit(&g_level, memory_order_relaxed); }

void di_log(di_log_level level, const char *fmt, ...) {
    static const char *tag[] = {"error", "warn", "info", "debug"};
    if ((int)level > atomic_load_explicit(&g_level, memory_order_relaxed)) return;
    if ((unsigned)level > DI_LOG_DEBUG) level = DI_LOG_DEBUG; /* tag[] bound */
    va_list ap;
    va_start(ap, fmt);
    flockfile(stderr); /* one line per call even when worker threads log at once */
    fprintf(stderr, "[%s] ", tag[level]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    funlockfile(stderr);
    va_end(ap);
}

double di_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
