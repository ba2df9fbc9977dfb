/* Logging to stderr (stdout is reserved for results, e.g. --json documents). */
#ifndef DI_UTIL_LOG_H
#define DI_UTIL_LOG_H

#include "util/error.h"

typedef enum { DI_LOG_ERROR = 0, DI_LOG_WARN = 1, DI_LOG_INFO = 2, DI_LOG_DEBUG = 3 } di_log_level;

void di_log_set_level(di_log_level level);
di_log_level di_log_get_level(void);
void di_log(di_log_level level, const char *fmt, ...) DI_PRINTF(2, 3);

#define DI_WARN(...) di_log(DI_LOG_WARN, __VA_ARGS__)
#define DI_INFO(...) di_log(DI_LOG_INFO, __VA_ARGS__)
#define DI_DEBUG(...) di_log(DI_LOG_DEBUG, __VA_ARGS__)

/* Monotonic wall clock in seconds. */
double di_now(void);

#endif
