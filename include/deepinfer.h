/* deepinfer — offline inference engine for DeepSeek-V4.1-Flash.
 *
 * Public C API. Everything here is prefixed di_. The API grows with the engine: today it exposes
 * the status codes and the error record every library call fills, and the version. */
#ifndef DEEPINFER_H
#define DEEPINFER_H

#ifdef __cplusplus
extern "C" {
#endif

#define DI_VERSION_STRING "0.1.0"

/* Status codes returned by every fallible library function (0 = success). */
typedef enum di_status {
    DI_OK = 0,
    DI_ERR_IO = -1,          /* file missing, unreadable, short read, mmap failure */
    DI_ERR_FORMAT = -2,      /* malformed file content (bad JSON, bad header, bad offsets) */
    DI_ERR_INVALID = -3,     /* well-formed but wrong: dtype/shape mismatch, missing tensor, bad argument */
    DI_ERR_NOMEM = -4,       /* allocation failed */
    DI_ERR_UNSUPPORTED = -5, /* valid but not handled here (unknown model_type, unsupported config) */
    DI_ERR_INTERNAL = -6,    /* a bug: an invariant did not hold */
    DI_ERR_LIMIT = -7        /* a resource limit was hit (context length, memory budget, time) */
} di_status;

/* Error record: a status and a one-line message naming the file/tensor/request and what was
 * expected versus found. Functions that take a di_error* may be passed NULL. */
typedef struct di_error {
    int code;        /* a di_status */
    char msg[1024];  /* NUL-terminated, single line */
} di_error;

const char *di_status_name(int status);
const char *di_version(void);

#ifdef __cplusplus
}
#endif
#endif
