/* libFuzzer harness for the safetensors reader. Each input is used three ways:
 *   1. as a header JSON for di_st_parse_header (with an empty and with a large data section);
 *   2. as a whole file for di_st_open (through a memfd), exercising the length prefix and mapping;
 *   3. as a header wrapped into a file (length prefix + input + a data section), so that inputs
 *      shaped like JSON reach the tensor-placement code behind a valid prefix.
 * Whatever the reader accepts is checked for the invariants callers rely on. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "io/safetensors.h"

#define DATA_BYTES 256

static void fail(const char *what) {
    fprintf(stderr, "invariant violated: %s\n", what);
    abort();
}

/* Invariants of an accepted header: sorted unique names, ranges inside the data section, byte
 * size = numel · dtype size. */
static void check_infos(const di_tensor_info *t, int64_t n, uint64_t data_size) {
    for (int64_t i = 0; i < n; i++) {
        if (i && strcmp(t[i - 1].name, t[i].name) >= 0) fail("names not sorted/unique");
        if (t[i].begin > t[i].end || t[i].end > data_size) fail("range outside data section");
        if ((uint64_t)di_tensor_numel(&t[i]) * di_dtype_size(t[i].dtype) != t[i].end - t[i].begin)
            fail("byte size != numel * dtype size");
    }
}

static void check_open(const di_safetensors *st) {
    uint64_t data_size = st->file_size - 8 - st->header_len;
    check_infos(st->tensors, st->n_tensors, data_size);
    volatile uint8_t sink = 0;
    for (int64_t i = 0; i < st->n_tensors; i++) {
        const di_tensor_info *t = &st->tensors[i];
        if (di_st_find(st, t->name) != t) fail("di_st_find does not return the tensor");
        if (t->end > t->begin) {
            if ((uintptr_t)t->data % di_dtype_size(t->dtype)) fail("misaligned tensor data");
            const uint8_t *p = t->data;
            sink ^= p[0] ^ p[t->end - t->begin - 1]; /* first and last byte must be mapped */
        }
    }
    for (int64_t i = 0; i < st->n_meta; i++)
        if (di_st_meta(st, st->meta_keys[i]) == NULL) fail("metadata key not found");
    (void)sink;
}

static int memfd = -1;
static char memfd_path[64];

static void open_bytes(const uint8_t *a, size_t na, const uint8_t *b, size_t nb, size_t zeros) {
    if (ftruncate(memfd, 0) != 0) abort();
    if ((na && pwrite(memfd, a, na, 0) != (ssize_t)na) || (nb && pwrite(memfd, b, nb, (off_t)na) != (ssize_t)nb))
        abort();
    if (ftruncate(memfd, (off_t)(na + nb + zeros)) != 0) abort();
    di_safetensors *st = NULL;
    di_error err = {0};
    if (di_st_open(memfd_path, &st, &err) == DI_OK) {
        check_open(st);
        di_st_close(st);
    } else if (st != NULL || err.msg[0] == '\0' || !strstr(err.msg, memfd_path)) {
        fail("failed open without a message naming the file");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (memfd < 0) {
        memfd = memfd_create("fuzz_safetensors", MFD_CLOEXEC);
        if (memfd < 0) abort();
        snprintf(memfd_path, sizeof memfd_path, "/proc/self/fd/%d", memfd);
    }
    const uint64_t data_sizes[2] = {0, 1u << 20};
    for (int k = 0; k < 2; k++) {
        di_tensor_info *infos = NULL;
        int64_t n = -1;
        di_error err = {0};
        if (di_st_parse_header((const char *)data, size, data_sizes[k], "fuzz", &infos, &n, &err) == DI_OK)
            check_infos(infos, n, data_sizes[k]);
        else if (infos || n != 0 || !err.msg[0])
            fail("failed parse left output or no message");
        di_st_free_infos(infos, n);
    }
    open_bytes(data, size, NULL, 0, 0);
    uint8_t prefix[8];
    for (int i = 0; i < 8; i++) prefix[i] = (uint8_t)((uint64_t)size >> (8 * i));
    open_bytes(prefix, 8, data, size, DATA_BYTES);
    return 0;
}
