/* Error helpers shared by the whole library (see di_error in include/deepinfer.h). */
#ifndef DI_UTIL_ERROR_H
#define DI_UTIL_ERROR_H

#include "deepinfer.h"

#if defined(__GNUC__)
#define DI_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DI_PRINTF(a, b)
#endif

/* Record an error and return its code, so callers can write `return di_error_set(err, ...)`.
 * err may be NULL. The message is truncated to one line. */
int di_error_set(di_error *err, int code, const char *fmt, ...) DI_PRINTF(3, 4);

/* Prefix an existing message with context ("loading /x/config.json: <old message>"). */
int di_error_wrap(di_error *err, const char *fmt, ...) DI_PRINTF(2, 3);

void di_error_clear(di_error *err);

#endif
