/* The stage recorder: a di_dump_fn that keeps a copy of every named stage tensor of a forward pass
 * and writes them to one safetensors file (for diffing against a reference dump stage by stage). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "util/error.h"

void di_stage_recorder_fn(void *ctx, const char *name, di_dtype dtype, int ndim, const int64_t *shape,
                          const void *data) {
    di_stage_recorder *r = ctx;
    if (r->failed) return;
    if (r->n == r->cap) {
        int64_t nc = r->cap ? 2 * r->cap : 64;
        di_tensor_spec *s = realloc(r->specs, sizeof *s * (size_t)nc);
        if (s) r->specs = s;
        void **d = s ? realloc(r->data, sizeof *d * (size_t)nc) : NULL;
        if (!s || !d) {
            r->failed = 1;
            return;
        }
        r->data = d, r->cap = nc;
    }
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= shape[i];
    size_t bytes = (size_t)numel * di_dtype_size(dtype);
    size_t nlen = strlen(name) + (r->prefix ? strlen(r->prefix) : 0) + 1;
    char *nm = malloc(nlen);
    void *copy = malloc(bytes ? bytes : 1);
    if (!nm || !copy) {
        free(nm), free(copy);
        r->failed = 1;
        return;
    }
    snprintf(nm, nlen, "%s%s", r->prefix ? r->prefix : "", name);
    memcpy(copy, data, bytes);
    di_tensor_spec *sp = &r->specs[r->n];
    memset(sp, 0, sizeof *sp);
    sp->name = nm, sp->dtype = dtype, sp->ndim = ndim;
    for (int i = 0; i < ndim; i++) sp->shape[i] = shape[i];
    r->data[r->n++] = copy;
}

int di_stage_recorder_write(const di_stage_recorder *r, const char *path, di_error *err) {
    if (r->failed) return di_error_set(err, DI_ERR_NOMEM, "%s: stage dump incomplete (out of memory)", path);
    return di_st_write_file(path, r->specs, (const void *const *)r->data, r->n, err);
}

void di_stage_recorder_free(di_stage_recorder *r) {
    for (int64_t i = 0; i < r->n; i++) free((void *)r->specs[i].name), free(r->data[i]);
    free(r->specs), free(r->data);
    memset(r, 0, sizeof *r);
}
