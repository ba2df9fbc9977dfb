/* Backend choice by name. The CUDA backend lives in separately built objects (cuda.mk): binaries
 * linked with them (deepinfer-cuda, the CUDA tests) resolve di_backend_cuda_create; the CPU-only
 * library and CLI leave the weak reference unresolved and report that the build has no CUDA. */
#include <string.h>

#include "backend/backend.h"
#include "util/error.h"

extern int di_backend_cuda_create(int device, di_backend **out, di_error *err) __attribute__((weak));

bool di_backend_cuda_available(void) { return di_backend_cuda_create != NULL; }

int di_backend_create(const char *name, int n_threads, di_backend **out, di_error *err) {
    *out = NULL;
    if (!name || !strcmp(name, "cpu")) return di_backend_cpu_create(n_threads, out, err);
    if (!strcmp(name, "cuda")) {
        if (!di_backend_cuda_available())
            return di_error_set(err, DI_ERR_UNSUPPORTED,
                                "backend cuda: this binary was built without CUDA (build `make deepinfer-cuda` on a "
                                "machine with nvcc, or use --device cpu)");
        return di_backend_cuda_create(0, out, err);
    }
    return di_error_set(err, DI_ERR_INVALID, "backend '%s': expected cpu or cuda", name);
}
