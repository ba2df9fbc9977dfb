/* safetensors reader (validated, zero-copy mmap) and streaming writer. */
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

/* Bound on element counts and byte sizes: any product of dims stays far from int64 overflow, so
 * callers may multiply shape entries freely. */
#define MAX_ELEMS (INT64_C(1) << 53)

/* Validate one header entry into *t (name not yet set). Returns DI_OK or an error naming path and
 * tensor. */
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
    /* The product of the non-zero dims is bounded too (not just numel, which a single 0 makes 0),
     * so that no partial product of the shape can overflow either. */
    int64_t prod = 1;
    for (int i = 0; i < t->ndim; i++) {
        json_t *d = json_array_get(js, (size_t)i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return di_error_set(err, DI_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer",
                                path, name, i);
        int64_t dim = (int64_t)json_integer_value(d);
        if (dim > 0 && prod > MAX_ELEMS / dim)
            return di_error_set(err, DI_ERR_FORMAT, "%s: tensor '%s': shape has more than 2^53 elements", path,
                                name);
        t->shape[i] = dim;
        if (dim > 0) prod *= dim;
    }
    uint64_t bytes = (uint64_t)di_tensor_numel(t) * di_dtype_size(t->dtype);
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
                            "%s: tensor '%s': data_offsets span %llu bytes but dtype %s x shape needs %llu", path,
                            name, (unsigned long long)(t->end - t->begin), di_dtype_name(t->dtype),
                            (unsigned long long)bytes);
    return DI_OK;
}

/* Tensors sorted by begin must not overlap; zero-sized tensors may share an offset. Gaps are
 * allowed (they waste space but are harmless). */
static int check_overlaps(const char *path, const di_tensor_info *infos, int64_t n, di_error *err) {
    if (n < 2) return DI_OK;
    const di_tensor_info **by_begin = malloc((size_t)n * sizeof *by_begin);
    if (!by_begin) return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory for %lld tensors", path, (long long)n);
    for (int64_t i = 0; i < n; i++) by_begin[i] = &infos[i];
    qsort(by_begin, (size_t)n, sizeof *by_begin, cmp_begin);
    int rc = DI_OK;
    uint64_t prev_end = 0;
    const di_tensor_info *prev = NULL;
    for (int64_t i = 0; i < n && rc == DI_OK; i++) {
        const di_tensor_info *t = by_begin[i];
        if (t->begin == t->end) continue;
        /* Sorted by begin and overlap-free so far, the previous non-empty tensor ends last. */
        if (prev && t->begin < prev_end)
            rc = di_error_set(err, DI_ERR_FORMAT,
                              "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap in the data section", path,
                              prev->name, (unsigned long long)prev->begin, (unsigned long long)prev->end, t->name,
                              (unsigned long long)t->begin, (unsigned long long)t->end);
        prev_end = t->end;
        prev = t;
    }
    free(by_begin);
    return rc;
}

/* Validate a parsed header object into name-sorted infos. */
static int parse_root(json_t *root, uint64_t data_size, const char *path, di_tensor_info **out, int64_t *n_out,
                      di_error *err) {
    if (!json_is_object(root)) return di_error_set(err, DI_ERR_FORMAT, "%s: header JSON is not an object", path);
    size_t cap = json_object_size(root);
    di_tensor_info *infos = calloc(cap ? cap : 1, sizeof *infos);
    if (!infos) return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory for %zu header entries", path, cap);
    int64_t n = 0;
    int rc = DI_OK;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(val)) {
                rc = di_error_set(err, DI_ERR_FORMAT, "%s: __metadata__ is not an object", path);
                break;
            }
            json_object_foreach(val, mk, mv) {
                if (!json_is_string(mv)) {
                    rc = di_error_set(err, DI_ERR_FORMAT, "%s: __metadata__ value of '%s' is not a string", path,
                                      mk);
                    break;
                }
            }
            if (rc != DI_OK) break;
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
    if (rc == DI_OK) rc = check_overlaps(path, infos, n, err);
    if (rc == DI_OK) {
        /* JSON_REJECT_DUPLICATES already refuses repeated keys; this also covers names that only
         * compare equal as C strings and keeps di_st_find unambiguous whatever the parser does. */
        qsort(infos, (size_t)n, sizeof *infos, cmp_name);
        for (int64_t i = 1; i < n && rc == DI_OK; i++)
            if (strcmp(infos[i].name, infos[i - 1].name) == 0)
                rc = di_error_set(err, DI_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", path,
                                  infos[i].name);
    }
    if (rc != DI_OK) {
        di_st_free_infos(infos, n);
        return rc;
    }
    *out = infos;
    *n_out = n;
    return DI_OK;
}

/* Object keys never hold NUL in jansson; without JSON_ALLOW_NUL no string value does either, so
 * every name, dtype and metadata string is exactly its C string. */
static json_t *load_header(const char *json, size_t len, const char *path, di_error *err) {
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        di_error_set(err, DI_ERR_FORMAT, "%s: header is not valid JSON (line %d col %d: %s)", path, je.line,
                     je.column, je.text);
    return root;
}

int di_st_parse_header(const char *json, size_t len, uint64_t data_size, const char *path,
                       di_tensor_info **out, int64_t *n_out, di_error *err) {
    *out = NULL;
    *n_out = 0;
    json_t *root = load_header(json, len, path, err);
    if (!root) return DI_ERR_FORMAT;
    int rc = parse_root(root, data_size, path, out, n_out, err);
    json_decref(root);
    return rc;
}

/* Copy __metadata__ (already validated: an object of strings). */
static int copy_meta(di_safetensors *st, json_t *root, di_error *err) {
    json_t *m = json_object_get(root, "__metadata__");
    size_t cap = json_object_size(m);
    if (!cap) return DI_OK;
    st->meta_keys = calloc(cap, sizeof(char *));
    st->meta_values = calloc(cap, sizeof(char *));
    if (!st->meta_keys || !st->meta_values) return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", st->path);
    const char *k;
    json_t *v;
    json_object_foreach(m, k, v) {
        char *ks = strdup(k), *vs = strdup(json_string_value(v));
        if (!ks || !vs) {
            free(ks);
            free(vs);
            return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", st->path);
        }
        st->meta_keys[st->n_meta] = ks;
        st->meta_values[st->n_meta] = vs;
        st->n_meta++;
    }
    return DI_OK;
}

/* Point every tensor at its bytes. Consumers cast data to the element type, so it must be aligned
 * to the element size. The format does not promise that (writers usually pad the header to 8 bytes
 * and place tensors at multiples of their size, but not all do: some files mix F32 tensors at odd
 * offsets), so the few misaligned tensors are copied once into one aligned arena; the rest stay
 * zero-copy views of the mapping. */
static int place_tensors(di_safetensors *st, const uint8_t *data, di_error *err) {
    uint64_t arena = 0;
    for (int64_t i = 0; i < st->n_tensors; i++) {
        di_tensor_info *t = &st->tensors[i];
        if (t->end > t->begin && (uintptr_t)(data + t->begin) % di_dtype_size(t->dtype) != 0)
            arena += (t->end - t->begin + 63) / 64 * 64;
    }
    if (arena) {
        st->data_copy = aligned_alloc(64, arena);
        if (!st->data_copy)
            return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory for %llu bytes of misaligned tensors",
                                st->path, (unsigned long long)arena);
    }
    uint8_t *next = st->data_copy;
    for (int64_t i = 0; i < st->n_tensors; i++) {
        di_tensor_info *t = &st->tensors[i];
        t->data = data + t->begin;
        if (t->end > t->begin && (uintptr_t)t->data % di_dtype_size(t->dtype) != 0) {
            t->data = memcpy(next, t->data, t->end - t->begin);
            next += (t->end - t->begin + 63) / 64 * 64;
        }
    }
    return DI_OK;
}

int di_st_open(const char *path, di_safetensors **out, di_error *err) {
    *out = NULL;
    /* O_NONBLOCK: opening a FIFO must not hang; it is refused below as not a regular file. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return di_error_set(err, DI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return di_error_set(err, DI_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return di_error_set(err, DI_ERR_IO, "%s: not a regular file", path);
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
    uint64_t data_size = size - 8 - hlen;
    json_t *root = load_header((const char *)p + 8, hlen, path, err);
    int rc = root ? parse_root(root, data_size, path, &st->tensors, &st->n_tensors, err) : DI_ERR_FORMAT;
    if (rc == DI_OK) rc = copy_meta(st, root, err);
    json_decref(root);
    if (rc == DI_OK) rc = place_tensors(st, p + 8 + hlen, err);
    if (rc != DI_OK) {
        di_st_close(st);
        return rc;
    }
    *out = st;
    return DI_OK;
}

void di_st_close(di_safetensors *st) {
    if (!st) return;
    if (st->map) munmap(st->map, st->file_size);
    free(st->data_copy);
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
    if (st->n_tensors == 0) return NULL;
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
    int64_t n, cur;      /* tensors; the one the next payload byte belongs to */
    uint64_t *range;     /* [n, 2] begin, end of each tensor in the data section */
    uint64_t pos;        /* data-section bytes written so far, alignment padding included */
    uint64_t remaining;  /* payload bytes still expected (padding excluded) */
};

/* Byte size of a spec after checking it; the header the writer produces must pass the reader. */
static int spec_bytes(const char *path, const di_tensor_spec *s, uint64_t *bytes, di_error *err) {
    if (!s->name || !s->name[0] || strcmp(s->name, "__metadata__") == 0)
        return di_error_set(err, DI_ERR_INVALID, "%s: tensor name '%s' is not allowed", path,
                            s->name ? s->name : "(null)");
    if ((unsigned)s->dtype >= DI_DTYPE_COUNT)
        return di_error_set(err, DI_ERR_INVALID, "%s: tensor '%s': unknown dtype %d", path, s->name, (int)s->dtype);
    if (s->ndim < 0 || s->ndim > DI_MAX_DIMS)
        return di_error_set(err, DI_ERR_INVALID, "%s: tensor '%s': %d dims (0..%d allowed)", path, s->name, s->ndim,
                            DI_MAX_DIMS);
    int64_t prod = 1, numel = 1;
    for (int d = 0; d < s->ndim; d++) {
        if (s->shape[d] < 0 || (s->shape[d] > 0 && prod > MAX_ELEMS / s->shape[d]))
            return di_error_set(err, DI_ERR_INVALID, "%s: tensor '%s': shape[%d] = %lld is invalid", path, s->name,
                                d, (long long)s->shape[d]);
        if (s->shape[d] > 0) prod *= s->shape[d];
        numel *= s->shape[d];
    }
    *bytes = (uint64_t)numel * di_dtype_size(s->dtype);
    return DI_OK;
}

/* Build the header object: __metadata__ first, then the tensors in spec order, their byte ranges
 * stored in range[n, 2]. */
static int build_header(const char *path, const di_tensor_spec *specs, int64_t n, const char *const *meta_kv,
                        int64_t n_meta, uint64_t *range, json_t **out, di_error *err) {
    int rc;
    json_t *root = json_object();
    if (!root) return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", path);
    if (n_meta > 0) {
        json_t *m = json_object();
        if (json_object_set_new(root, "__metadata__", m) != 0) goto nomem;
        for (int64_t i = 0; i < n_meta; i++) {
            json_t *v = meta_kv[2 * i + 1] ? json_string(meta_kv[2 * i + 1]) : NULL;
            if (!meta_kv[2 * i] || !v || json_object_set_new(m, meta_kv[2 * i], v) != 0) {
                rc = di_error_set(err, DI_ERR_INVALID, "%s: metadata entry %lld is not a UTF-8 key/value pair",
                                  path, (long long)i);
                goto fail;
            }
        }
    }
    uint64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        const di_tensor_spec *s = &specs[i];
        uint64_t bytes = 0;
        if ((rc = spec_bytes(path, s, &bytes, err)) != DI_OK) goto fail;
        if (json_object_get(root, s->name)) {
            rc = di_error_set(err, DI_ERR_INVALID, "%s: duplicate tensor name '%s'", path, s->name);
            goto fail;
        }
        /* Each tensor starts at a multiple of its element size, so readers can use it in place
         * (di_st_open would otherwise copy it); the caller's order is kept, so a small dtype
         * before a larger one gets zero padding. */
        off = (off + di_dtype_size(s->dtype) - 1) / di_dtype_size(s->dtype) * di_dtype_size(s->dtype);
        range[2 * i] = off;
        range[2 * i + 1] = off + bytes;
        json_t *shape = json_array(), *e = json_object();
        if (!shape || !e) {
            json_decref(shape);
            json_decref(e);
            goto nomem;
        }
        for (int d = 0; d < s->ndim; d++) json_array_append_new(shape, json_integer(s->shape[d]));
        json_object_set_new(e, "dtype", json_string(di_dtype_name(s->dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", json_pack("[II]", (json_int_t)off, (json_int_t)(off + bytes)));
        if (json_object_size(e) != 3 || json_array_size(shape) != (size_t)s->ndim) {
            json_decref(e);
            goto nomem;
        }
        /* json_object_set_new fails on a name that is not valid UTF-8. */
        if (json_object_set_new(root, s->name, e) != 0) {
            rc = di_error_set(err, DI_ERR_INVALID, "%s: tensor name '%s' is not valid UTF-8", path, s->name);
            goto fail;
        }
        off += bytes;
    }
    *out = root;
    return DI_OK;
nomem:
    rc = di_error_set(err, DI_ERR_NOMEM, "%s: out of memory building the header", path);
fail:
    json_decref(root);
    return rc;
}

int di_st_writer_open(const char *path, const di_tensor_spec *specs, int64_t n, const char *const *meta_kv,
                      int64_t n_meta, di_st_writer **out, di_error *err) {
    *out = NULL;
    if (n < 0 || n_meta < 0) return di_error_set(err, DI_ERR_INVALID, "%s: negative tensor or metadata count", path);
    di_st_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path)) || !(w->range = calloc(n ? (size_t)n * 2 : 1, sizeof *w->range))) {
        if (w) free(w->path);
        free(w);
        return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", path);
    }
    w->n = n;
    json_t *root = NULL;
    int rc = build_header(path, specs, n, meta_kv, n_meta, w->range, &root, err);
    /* Entries in spec order keep the file readable; JSON_PRESERVE_ORDER does that. */
    char *hdr = rc == DI_OK ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!hdr) {
        if (rc == DI_OK) rc = di_error_set(err, DI_ERR_NOMEM, "%s: cannot serialise header", path);
        free(w->range);
        free(w->path);
        free(w);
        return rc;
    }
    for (int64_t i = 0; i < n; i++) w->remaining += w->range[2 * i + 1] - w->range[2 * i];
    size_t hlen = strlen(hdr), padded = (hlen + 7) & ~(size_t)7; /* data section 8-byte aligned */
    w->f = fopen(path, "wb");
    int ok = w->f != NULL;
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    ok = ok && fwrite(lenb, 1, 8, w->f) == 8 && fwrite(hdr, 1, hlen, w->f) == hlen;
    for (size_t i = hlen; ok && i < padded; i++) ok = fputc(' ', w->f) != EOF;
    free(hdr);
    if (!ok) {
        rc = di_error_set(err, DI_ERR_IO, "%s: cannot write header: %s", path, strerror(errno));
        if (w->f) fclose(w->f), remove(path);
        free(w->range);
        free(w->path);
        free(w);
        return rc;
    }
    *out = w;
    return DI_OK;
}

static int write_zeros(FILE *f, uint64_t n) {
    static const uint8_t zeros[8];
    return n <= sizeof zeros && fwrite(zeros, 1, (size_t)n, f) == n;
}

int di_st_writer_write(di_st_writer *w, const void *data, size_t nbytes, di_error *err) {
    if (nbytes > w->remaining)
        return di_error_set(err, DI_ERR_INVALID, "%s: writing %zu bytes but only %llu remain in the data section",
                            w->path, nbytes, (unsigned long long)w->remaining);
    const uint8_t *p = data;
    while (nbytes > 0) {
        /* remaining > 0 guarantees a non-empty tensor ahead of pos */
        while (w->pos >= w->range[2 * w->cur + 1]) w->cur++;
        const uint64_t *r = &w->range[2 * w->cur];
        if (w->pos < r[0]) {
            if (!write_zeros(w->f, r[0] - w->pos))
                return di_error_set(err, DI_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
            w->pos = r[0];
        }
        size_t chunk = r[1] - w->pos < nbytes ? (size_t)(r[1] - w->pos) : nbytes;
        if (fwrite(p, 1, chunk, w->f) != chunk)
            return di_error_set(err, DI_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
        p += chunk;
        nbytes -= chunk;
        w->pos += chunk;
        w->remaining -= chunk;
    }
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
    /* An incomplete file would fail validation later with a less helpful message. */
    if (rc != DI_OK) remove(w->path);
    free(w->range);
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
