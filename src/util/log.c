#include "util/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static di_log_level g_level = DI_LOG_INFO;

void di_log_set_level(di_log_level level) { g_level = level; }
di_log_level di_log_get_level(void) { return g_level; }

void di_log(di_log_level level, const char *fmt, ...) {
    static const char *tag[] = {"error", "warn", "info", "debug"};
    if (level > g_level) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[%s] ", tag[level]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

double di_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
