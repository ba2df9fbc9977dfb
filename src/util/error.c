/* di_error helpers and the status names of include/deepinfer.h. */
#include "util/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void one_line(char *s) {
    for (; *s; s++)
        if (*s == '\n' || *s == '\r') *s = ' ';
}

int di_error_set(di_error *err, int code, const char *fmt, ...) {
    if (!err) return code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    one_line(err->msg);
    err->code = code;
    return code;
}

int di_error_wrap(di_error *err, const char *fmt, ...) {
    if (!err) return DI_ERR_INTERNAL;
    char prefix[512], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof err->msg - 3) n = sizeof err->msg - 3;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 2);
    size_t room = sizeof err->msg - n - 3, m = strlen(old);
    if (m > room) m = room;
    memcpy(err->msg + n + 2, old, m);
    err->msg[n + 2 + m] = '\0';
    one_line(err->msg);
    return err->code;
}

void di_error_clear(di_error *err) {
    if (!err) return;
    err->code = DI_OK;
    err->msg[0] = '\0';
}

const char *di_status_name(int status) {
    switch (status) {
    case DI_OK: return "ok";
    case DI_ERR_IO: return "io";
    case DI_ERR_FORMAT: return "format";
    case DI_ERR_INVALID: return "invalid";
    case DI_ERR_NOMEM: return "nomem";
    case DI_ERR_UNSUPPORTED: return "unsupported";
    case DI_ERR_INTERNAL: return "internal";
    case DI_ERR_LIMIT: return "limit";
    default: return "unknown";
    }
}

const char *di_version(void) { return DI_VERSION_STRING; }
