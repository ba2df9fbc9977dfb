/* safetensors files: validated zero-copy reader (mmap) and a streaming writer.
 *
 * File layout: u64 little-endian header length N, N bytes of JSON header, then the data section.
 * The header maps tensor names to {dtype, shape, data_offsets:[begin,end]} (offsets relative to
 * the data section) plus an optional "__metadata__" object of string values. */
#ifndef DI_IO_SAFETENSORS_H
#define DI_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "deepinfer.h"

typedef enum di_dtype {
    DI_BF16 = 0,
    DI_F16,
    DI_F32,
    DI_F8_E4M3,  /* float8_e4m3fn: no inf, 0x7F/0xFF = NaN, max 448 */
    DI_F8_E8M0,  /* power-of-two scale 2^(e-127) */
    DI_I8,       /* in DeepSeek checkpoints: two packed E2M1 (FP4) codes per byte */
    DI_I32,
    DI_I64,
    DI_DTYPE_COUNT
} di_dtype;

#define DI_MAX_DIMS 8

/* Largest header accepted (the real V4.1 shards have headers of a few hundred KB). */
#define DI_ST_MAX_HEADER (100u << 20)

size_t di_dtype_size(di_dtype dt);          /* bytes per element */
const char *di_dtype_name(di_dtype dt);     /* safetensors spelling, e.g. "F8_E4M3" */
int di_dtype_parse(const char *s, di_dtype *out); /* DI_OK or DI_ERR_FORMAT */

typedef struct di_tensor_info {
    char *name;
    di_dtype dtype;
    int ndim;
    int64_t shape[DI_MAX_DIMS];
    uint64_t begin, end;  /* byte range inside the data section */
    const void *data;     /* zero-copy view into the mapping; NULL for header-only parses */
} di_tensor_info;

static inline int64_t di_tensor_numel(const di_tensor_info *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

typedef struct di_safetensors {
    char *path;
    void *map;            /* whole file, read-only */
    void *data_copy;      /* NULL, or aligned copies of the tensors whose bytes in the file are not
                             aligned to their element size (their data point here) */
    uint64_t file_size;
    uint64_t header_len;
    int64_t n_tensors;
    di_tensor_info *tensors;  /* sorted by name */
    int64_t n_meta;
    char **meta_keys, **meta_values; /* __metadata__ entries */
} di_safetensors;

/* Parse and validate a header. `path` only names the file in messages. `data_size` is the size of
 * the data section. Checks: JSON object without duplicate keys; every entry an object with a known
 * dtype, a shape of ≤ DI_MAX_DIMS non-negative dims whose non-zero product is ≤ 2^53 (so no product
 * of dims can overflow int64), begin ≤ end ≤ data_size, end−begin = numel·dtype size; no two
 * non-empty tensors overlap; __metadata__, when present, an object of strings. On success *out is
 * sorted by name (free with di_st_free_infos). */
int di_st_parse_header(const char *json, size_t len, uint64_t data_size, const char *path,
                       di_tensor_info **out, int64_t *n_out, di_error *err);
void di_st_free_infos(di_tensor_info *infos, int64_t n);

/* Maps a regular file read-only and validates it (header length ≥ 2, ≤ DI_ST_MAX_HEADER and inside
 * the file, then di_st_parse_header). Tensor data pointers are aligned to their element size:
 * tensors stored misaligned in the file are copied (see data_copy). */
int di_st_open(const char *path, di_safetensors **out, di_error *err);
void di_st_close(di_safetensors *st);
const di_tensor_info *di_st_find(const di_safetensors *st, const char *name);
const char *di_st_meta(const di_safetensors *st, const char *key);

/* Streaming writer: the header is written first from the specs (offsets in spec order, each tensor
 * aligned to its element size with zero padding), then the caller streams each tensor's bytes in the
 * same order. Memory use is independent of data size. Specs are validated (names non-empty, UTF-8,
 * unique, not "__metadata__"; known dtype; 0..DI_MAX_DIMS non-negative dims). */
typedef struct di_tensor_spec {
    const char *name;
    di_dtype dtype;
    int ndim;
    int64_t shape[DI_MAX_DIMS];
} di_tensor_spec;

typedef struct di_st_writer di_st_writer;

/* meta: NULL or n_meta key/value string pairs for "__metadata__". */
int di_st_writer_open(const char *path, const di_tensor_spec *specs, int64_t n,
                      const char *const *meta_kv, int64_t n_meta, di_st_writer **out, di_error *err);
/* Append raw bytes of the current tensor(s); may be called many times per tensor. */
int di_st_writer_write(di_st_writer *w, const void *data, size_t nbytes, di_error *err);
/* Checks that exactly the declared number of bytes was written, then closes. Always frees w; on
 * error the incomplete file is removed. */
int di_st_writer_close(di_st_writer *w, di_error *err);
/* Bytes of the data section still expected. */
uint64_t di_st_writer_remaining(const di_st_writer *w);

/* Convenience: write a whole file from in-memory tensors (tests, golden dumps). */
int di_st_write_file(const char *path, const di_tensor_spec *specs, const void *const *data,
                     int64_t n, di_error *err);

#endif
