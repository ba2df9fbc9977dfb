#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"

static const struct {
    const char *name;
    size_t size;
} k_dtypes[DI_DTYPE_COUNT] = {
    [DI_BF16] = {"BF16", 2},       [DI_F16] = {"F16", 2},         [DI_F32] = {"F32", 4},
    [DI_F8_E4M3] = {"F8_E4M3", 1}, [DI_F8_E8M0] = {"F8_E8M0", 1}, [DI_I8] = {"I8", 1},
    [DI_I32] = {"I32", 4},         [DI_I64] = {"I64", 8},
};

size_t di_dtype_size(di_dtype dt) { return (unsigned)dt < DI_DTYPE_COUNT ? k_dtypes[dt].size : 0; }
const char *di_dtype_name(di_dtype dt) { return (unsigned)dt < DI_DTYPE_COUNT ? k_dtypes[dt].name : "?"; }

int di_dtype_parse(const char *s, di_dtype *out) {
    for (int i = 0; i < DI_DTYPE_COUNT; i++)
        if (strcmp(s, k_dtypes[i].name) == 0) {
            *out = (di_dtype)i;
            return DI_OK;
        }
    return DI_ERR_FORMAT;
}

void di_st_free_infos(di_tensor_info *infos, int64_t n) {
    if (!infos) return;
    for (int64_t i = 0; i < n; i++) free(infos[i].name);
    free(infos);
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const di_tensor_info *)a)->name, ((const di_tensor_info *)b)->name);
}

static int cmp_begin(const void *a, const void *b) {
    const di_tensor_info *x = *(const di_tensor_info *const *)a, *y = *(const di_tensor_info *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Validate one header entry into *t. Returns DI_OK or an error naming path and tensor. */
static int parse_entry(const char *path, const char *name, json_t *v, uint64_t data_size,
                       di_tensor_info *t, di_error *err) {
    if (!json_is_object(v))
        return di_error_set(err, DI_ERR_FORMAT, "%s: tensor '%s': header entry is not an object", path, name);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd))
        return di_error_set(err, DI_ERR_FORMAT, "%s: tensor '%s': missing string 'dtype'", path, name);
    if (di_dtype_parse(json_string_value(jd), &t->dtype) != DI_OK)
        return di_error_set(err, DI_ERR_FORMAT,
                            "%s: tensor '%s': unsupported dtype '%s' (expected BF16, F16, F32, F8_E4M3, "
                            "F8_E8M0, I8, I32 or I64)",
                            path, name, json_string_value(jd));
    if (!json_is_array(js) || json_array_size(js) > DI_MAX_DIMS)
        return di_error_set(err, DI_ERR_FORMAT, "%s: tensor '%s': 'shape' must be an array of at most %d dims",
                            path, name, DI_MAX_DIMS);
    t->ndim = (int)json_array_size(js);
    /* numel·size must not overflow: bound each factor so the running product stays < 2^63. */
    uint64_t bytes = di_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++) {
        json_t *d = json_array_get(js, (size_t)i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return di_error_set(err, DI_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer",
                                path, name, i);
        uint64_t dim = (uint64_t)json_integer_value(d);
        t->shape[i] = (int64_t)dim;
        if (dim != 0 && bytes > (UINT64_C(1) << 62) / dim)
            return di_error_set(err, DI_ERR_FORMAT, "%s: tensor '%s': shape too large", path, name);
        bytes *= dim;
    }
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
        !json_is_integer(json_array_get(jo, 1)))
        return di_error_set(err, DI_ERR_FORMAT, "%s: tensor '%s': 'data_offsets' must be [begin, end]", path, name);
    json_int_t b = json_integer_value(json_array_get(jo, 0)), e = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || e < b)
        return di_error_set(err, DI_ERR_FORMAT, "%s: tensor '%s': bad data_offsets [%lld, %lld]", path, name,
                            (long long)b, (long long)e);
    t->begin = (uint64_t)b;
    t->end = (uint64_t)e;
    if (t->end > data_size)
        return di_error_set(err, DI_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets end %llu is past the end of the data section "
                            "(%llu bytes; file truncated?)",
                            path, name, (unsigned long long)t->end, (unsigned long long)data_size);
    if (t->end - t->begin != bytes)
        return di_error_set(err, DI_ERR_FORMAT,
                            "%s: tensor '%s': byte size %llu does not match dtype %s x shape (%llu bytes)", path,
                            name, (unsigned long long)(t->end - t->begin), di_dtype_name(t->dtype),
                            (unsigned long long)bytes);
    return DI_OK;
}

int di_st_parse_header(const char *json, size_t len, uint64_t data_size, const char *path,
                       di_tensor_info **out, int64_t *n_out, di_error *err) {
    *out = NULL;
    *n_out = 0;
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!root)
        return di_error_set(err, DI_ERR_FORMAT, "%s: header is not valid JSON (line %d col %d: %s)", path,
                            je.line, je.column, je.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return di_error_set(err, DI_ERR_FORMAT, "%s: header JSON is not an object", path);
    }
    size_t cap = json_object_size(root);
    di_tensor_info *infos = calloc(cap ? cap : 1, sizeof *infos);
    if (!infos) {
        json_decref(root);
        return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory for %zu header entries", path, cap);
    }
    int64_t n = 0;
    int rc = DI_OK;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) {
                rc = di_error_set(err, DI_ERR_FORMAT, "%s: __metadata__ is not an object", path);
                break;
            }
            continue;
        }
        di_tensor_info *t = &infos[n];
        if ((rc = parse_entry(path, key, val, data_size, t, err)) != DI_OK) break;
        if (!(t->name = strdup(key))) {
            rc = di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", path);
            break;
        }
        n++;
    }
    json_decref(root);
    if (rc == DI_OK && n > 1) {
        /* Overlap check on begin-sorted pointers; zero-sized tensors may share an offset. */
        const di_tensor_info **by_begin = malloc((size_t)n * sizeof *by_begin);
        if (!by_begin) rc = di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", path);
        for (int64_t i = 0; rc == DI_OK && i < n; i++) by_begin[i] = &infos[i];
        if (rc == DI_OK) qsort(by_begin, (size_t)n, sizeof *by_begin, cmp_begin);
        uint64_t prev_end = 0;
        const char *prev = NULL;
        for (int64_t i = 0; rc == DI_OK && i < n; i++) {
            const di_tensor_info *t = by_begin[i];
            if (t->begin == t->end) continue;
            if (prev && t->begin < prev_end)
                rc = di_error_set(err, DI_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap in the data section", path,
                                  prev, t->name);
            prev_end = t->end;
            prev = t->name;
        }
        free(by_begin);
    }
    if (rc != DI_OK) {
        di_st_free_infos(infos, n);
        return rc;
    }
    qsort(infos, (size_t)n, sizeof *infos, cmp_name);
    *out = infos;
    *n_out = n;
    return DI_OK;
}

/* Collect __metadata__ (string values only; others are rejected). */
static int parse_meta(di_safetensors *st, const char *json, size_t len, di_error *err) {
    json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, NULL);
    json_t *m = root ? json_object_get(root, "__metadata__") : NULL;
    int rc = DI_OK;
    if (m && json_object_size(m)) {
        size_t cap = json_object_size(m);
        st->meta_keys = calloc(cap, sizeof(char *));
        st->meta_values = calloc(cap, sizeof(char *));
        const char *k;
        json_t *v;
        json_object_foreach(m, k, v) {
            if (!json_is_string(v)) {
                rc = di_error_set(err, DI_ERR_FORMAT, "%s: __metadata__ value of '%s' is not a string", st->path, k);
                break;
            }
            st->meta_keys[st->n_meta] = strdup(k);
            st->meta_values[st->n_meta] = strdup(json_string_value(v));
            st->n_meta++;
        }
    }
    json_decref(root);
    return rc;
}

int di_st_open(const char *path, di_safetensors **out, di_error *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return di_error_set(err, DI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return di_error_set(err, DI_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < 8) {
        close(fd);
        return di_error_set(err, DI_ERR_FORMAT, "%s: file is %llu bytes, too short for a safetensors header", path,
                            (unsigned long long)size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return di_error_set(err, DI_ERR_IO, "%s: mmap failed: %s", path, strerror(e));
    const uint8_t *p = map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | p[i];
    if (hlen < 2 || hlen > DI_ST_MAX_HEADER || hlen > size - 8) {
        munmap(map, size);
        return di_error_set(err, DI_ERR_FORMAT,
                            "%s: header length %llu is invalid (file is %llu bytes, limit %u; truncated or not "
                            "safetensors?)",
                            path, (unsigned long long)hlen, (unsigned long long)size, DI_ST_MAX_HEADER);
    }
    di_safetensors *st = calloc(1, sizeof *st);
    if (!st || !(st->path = strdup(path))) {
        free(st);
        munmap(map, size);
        return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", path);
    }
    st->map = map;
    st->file_size = size;
    st->header_len = hlen;
    const char *hdr = (const char *)p + 8;
    int rc = di_st_parse_header(hdr, hlen, size - 8 - hlen, path, &st->tensors, &st->n_tensors, err);
    if (rc == DI_OK) rc = parse_meta(st, hdr, hlen, err);
    if (rc != DI_OK) {
        di_st_close(st);
        return rc;
    }
    const uint8_t *data = p + 8 + hlen;
    for (int64_t i = 0; i < st->n_tensors; i++) st->tensors[i].data = data + st->tensors[i].begin;
    *out = st;
    return DI_OK;
}

void di_st_close(di_safetensors *st) {
    if (!st) return;
    if (st->map) munmap(st->map, st->file_size);
    di_st_free_infos(st->tensors, st->n_tensors);
    for (int64_t i = 0; i < st->n_meta; i++) {
        free(st->meta_keys[i]);
        free(st->meta_values[i]);
    }
    free(st->meta_keys);
    free(st->meta_values);
    free(st->path);
    free(st);
}

const di_tensor_info *di_st_find(const di_safetensors *st, const char *name) {
    di_tensor_info key = {.name = (char *)name};
    return bsearch(&key, st->tensors, (size_t)st->n_tensors, sizeof key, cmp_name);
}

const char *di_st_meta(const di_safetensors *st, const char *key) {
    for (int64_t i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta_keys[i], key) == 0) return st->meta_values[i];
    return NULL;
}

/* ---- writer ---- */

struct di_st_writer {
    FILE *f;
    char *path;
    uint64_t remaining;
};

int di_st_writer_open(const char *path, const di_tensor_spec *specs, int64_t n, const char *const *meta_kv,
                      int64_t n_meta, di_st_writer **out, di_error *err) {
    *out = NULL;
    json_t *root = json_object();
    uint64_t off = 0;
    if (n_meta > 0) {
        json_t *m = json_object();
        for (int64_t i = 0; i < n_meta; i++) json_object_set_new(m, meta_kv[2 * i], json_string(meta_kv[2 * i + 1]));
        json_object_set_new(root, "__metadata__", m);
    }
    for (int64_t i = 0; i < n; i++) {
        const di_tensor_spec *s = &specs[i];
        uint64_t bytes = di_dtype_size(s->dtype);
        json_t *shape = json_array();
        for (int d = 0; d < s->ndim; d++) {
            json_array_append_new(shape, json_integer(s->shape[d]));
            bytes *= (uint64_t)s->shape[d];
        }
        json_t *e = json_object();
        json_object_set_new(e, "dtype", json_string(di_dtype_name(s->dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", json_pack("[II]", (json_int_t)off, (json_int_t)(off + bytes)));
        if (json_object_get(root, s->name)) {
            json_decref(e);
            json_decref(root);
            return di_error_set(err, DI_ERR_INVALID, "%s: duplicate tensor name '%s'", path, s->name);
        }
        json_object_set_new(root, s->name, e);
        off += bytes;
    }
    /* Entries in spec order keeps the file readable; JSON_PRESERVE_ORDER does that. */
    char *hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!hdr) return di_error_set(err, DI_ERR_NOMEM, "%s: cannot serialise header", path);
    size_t hlen = strlen(hdr), padded = (hlen + 7) & ~(size_t)7; /* data section 8-byte aligned */
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(hdr);
        return di_error_set(err, DI_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(lenb, 1, 8, f) == 8 && fwrite(hdr, 1, hlen, f) == hlen;
    for (size_t i = hlen; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    free(hdr);
    if (!ok) {
        fclose(f);
        return di_error_set(err, DI_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    }
    di_st_writer *w = calloc(1, sizeof *w);
    w->f = f;
    w->path = strdup(path);
    w->remaining = off;
    *out = w;
    return DI_OK;
}

int di_st_writer_write(di_st_writer *w, const void *data, size_t nbytes, di_error *err) {
    if (nbytes > w->remaining)
        return di_error_set(err, DI_ERR_INVALID, "%s: writing %zu bytes but only %llu remain in the data section",
                            w->path, nbytes, (unsigned long long)w->remaining);
    if (fwrite(data, 1, nbytes, w->f) != nbytes)
        return di_error_set(err, DI_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    w->remaining -= nbytes;
    return DI_OK;
}

uint64_t di_st_writer_remaining(const di_st_writer *w) { return w->remaining; }

int di_st_writer_close(di_st_writer *w, di_error *err) {
    int rc = DI_OK;
    if (w->remaining)
        rc = di_error_set(err, DI_ERR_INVALID, "%s: closed with %llu data bytes still missing", w->path,
                          (unsigned long long)w->remaining);
    if (fclose(w->f) != 0 && rc == DI_OK)
        rc = di_error_set(err, DI_ERR_IO, "%s: close failed: %s", w->path, strerror(errno));
    free(w->path);
    free(w);
    return rc;
}

int di_st_write_file(const char *path, const di_tensor_spec *specs, const void *const *data, int64_t n,
                     di_error *err) {
    di_st_writer *w;
    int rc = di_st_writer_open(path, specs, n, NULL, 0, &w, err);
    if (rc != DI_OK) return rc;
    for (int64_t i = 0; i < n && rc == DI_OK; i++) {
        size_t bytes = di_dtype_size(specs[i].dtype);
        for (int d = 0; d < specs[i].ndim; d++) bytes *= (size_t)specs[i].shape[d];
        rc = di_st_writer_write(w, data[i], bytes, err);
    }
    int rc2 = di_st_writer_close(w, rc == DI_OK ? err : NULL);
    return rc != DI_OK ? rc : rc2;
}
