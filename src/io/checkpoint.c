/* Checkpoint directory: index + shards, cross-validated so that every later lookup can trust it. */
#include "io/checkpoint.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/error.h"

char *di_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const di_ckpt_entry *)a)->info->name, ((const di_ckpt_entry *)b)->info->name);
}

/* Shard file names must be plain names inside the directory. */
static int safe_shard_name(const char *s) {
    return s[0] && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

static const char *base_name(const char *path) {
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}

/* Index of the shard file `name` (opening and validating it on first use), or a negative status.
 * `tensor` and `index_path` only name the first index entry that refers to it, for messages. */
static int add_shard(di_checkpoint *ck, const char *name, const char *tensor, const char *index_path,
                     di_error *err) {
    for (int i = 0; i < ck->n_shards; i++)
        if (strcmp(base_name(ck->shards[i]->path), name) == 0) return i;
    char *path = di_path_join(ck->dir, name);
    if (!path) return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", ck->dir);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        int rc = di_error_set(err, DI_ERR_IO, "%s: tensor '%s' is in shard '%s', but %s does not exist (%s)",
                              index_path, tensor, name, path, strerror(errno));
        free(path);
        return rc;
    }
    di_safetensors *st;
    int rc = di_st_open(path, &st, err);
    free(path);
    if (rc != DI_OK) return rc;
    di_safetensors **ns = realloc(ck->shards, (size_t)(ck->n_shards + 1) * sizeof *ns);
    if (!ns) {
        di_st_close(st);
        return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", ck->dir);
    }
    ck->shards = ns;
    ck->shards[ck->n_shards] = st;
    return ck->n_shards++;
}

/* metadata.total_size, when present, must be a non-negative integer equal to the bytes the shards
 * hold for the indexed tensors (that is how the Hugging Face writers define it). */
static int check_total_size(const di_checkpoint *ck, json_t *root, const char *index_path, di_error *err) {
    json_t *meta = json_object_get(root, "metadata");
    if (!meta || json_is_null(meta)) return DI_OK;
    if (!json_is_object(meta)) return di_error_set(err, DI_ERR_FORMAT, "%s: 'metadata' is not an object", index_path);
    json_t *ts = json_object_get(meta, "total_size");
    if (!ts) return DI_OK;
    /* Some converters write the size as a float; accept it when it is a whole number. */
    double d = json_is_number(ts) ? json_number_value(ts) : -1;
    /* range first: converting a double ≥ 2^64 to an integer type is undefined behaviour */
    if (d < 0 || d >= 0x1p63 || d != floor(d))
        return di_error_set(err, DI_ERR_FORMAT, "%s: metadata.total_size is not a non-negative integer", index_path);
    uint64_t want = json_is_integer(ts) ? (uint64_t)json_integer_value(ts) : (uint64_t)d, sum = 0;
    for (int64_t i = 0; i < ck->n_tensors; i++) sum += ck->entries[i].info->end - ck->entries[i].info->begin;
    if (want != sum)
        return di_error_set(err, DI_ERR_INVALID, "%s: metadata.total_size is %llu but the indexed tensors hold %llu bytes",
                            index_path, (unsigned long long)want, (unsigned long long)sum);
    return DI_OK;
}

/* Every shard tensor must be indexed: otherwise it would be silently ignored, which hides a stale
 * or mismatched index. Index entries are distinct (name, shard) pairs found in the shards, so the
 * counts agree exactly when the two sets are equal. */
static int check_unindexed(const di_checkpoint *ck, json_t *wm, const char *index_path, di_error *err) {
    int64_t in_shards = 0;
    for (int s = 0; s < ck->n_shards; s++) in_shards += ck->shards[s]->n_tensors;
    if (in_shards == ck->n_tensors) return DI_OK;
    for (int s = 0; s < ck->n_shards; s++)
        for (int64_t i = 0; i < ck->shards[s]->n_tensors; i++) {
            const char *name = ck->shards[s]->tensors[i].name, *shard = base_name(ck->shards[s]->path);
            json_t *m = json_object_get(wm, name);
            if (!m)
                return di_error_set(err, DI_ERR_INVALID, "%s: tensor '%s' is not listed in %s", ck->shards[s]->path,
                                    name, index_path);
            if (strcmp(json_string_value(m), shard) != 0)
                return di_error_set(err, DI_ERR_INVALID,
                                    "%s: holds tensor '%s' too, but %s assigns it to '%s' (tensor in two shards?)",
                                    ck->shards[s]->path, name, index_path, json_string_value(m));
        }
    return di_error_set(err, DI_ERR_INTERNAL, "%s: tensor count mismatch (%lld indexed, %lld in shards)", index_path,
                        (long long)ck->n_tensors, (long long)in_shards);
}

static int open_indexed(di_checkpoint *ck, const char *index_path, di_error *err) {
    json_error_t je;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return di_error_set(err, DI_ERR_FORMAT, "%s: invalid JSON (line %d col %d: %s)", index_path, je.line,
                            je.column, je.text);
    json_t *wm = json_object_get(root, "weight_map");
    int rc = DI_OK;
    if (!json_is_object(wm)) {
        rc = di_error_set(err, DI_ERR_FORMAT, "%s: missing object 'weight_map'", index_path);
        goto done;
    }
    size_t n = json_object_size(wm);
    if (n == 0) {
        rc = di_error_set(err, DI_ERR_FORMAT, "%s: 'weight_map' lists no tensors", index_path);
        goto done;
    }
    ck->entries = calloc(n, sizeof *ck->entries);
    if (!ck->entries) {
        rc = di_error_set(err, DI_ERR_NOMEM, "%s: out of memory for %zu entries", index_path, n);
        goto done;
    }
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v) {
        if (!json_is_string(v) || !safe_shard_name(json_string_value(v))) {
            rc = di_error_set(err, DI_ERR_FORMAT,
                              "%s: weight_map['%s'] is not a file name inside the checkpoint directory", index_path,
                              name);
            goto done;
        }
        int s = add_shard(ck, json_string_value(v), name, index_path, err);
        if (s < 0) {
            rc = s;
            goto done;
        }
        const di_tensor_info *t = di_st_find(ck->shards[s], name);
        if (!t) {
            rc = di_error_set(err, DI_ERR_INVALID, "%s: tensor '%s' is listed in %s but missing from this shard",
                              ck->shards[s]->path, name, index_path);
            goto done;
        }
        ck->entries[ck->n_tensors].info = t;
        ck->entries[ck->n_tensors].shard = s;
        ck->n_tensors++;
    }
    if ((rc = check_unindexed(ck, wm, index_path, err)) != DI_OK) goto done;
    rc = check_total_size(ck, root, index_path, err);
done:
    json_decref(root);
    return rc;
}

static int open_single(di_checkpoint *ck, di_error *err) {
    int s = add_shard(ck, "model.safetensors", "(all)", ck->dir, err);
    if (s < 0) return s;
    di_safetensors *st = ck->shards[s];
    ck->entries = calloc(st->n_tensors ? (size_t)st->n_tensors : 1, sizeof *ck->entries);
    if (!ck->entries) return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", st->path);
    for (int64_t i = 0; i < st->n_tensors; i++) ck->entries[i] = (di_ckpt_entry){&st->tensors[i], s};
    ck->n_tensors = st->n_tensors;
    return DI_OK;
}

int di_ckpt_open(const char *dir, di_checkpoint **out, di_error *err) {
    *out = NULL;
    struct stat sb;
    if (stat(dir, &sb) != 0) return di_error_set(err, DI_ERR_IO, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return di_error_set(err, DI_ERR_IO, "%s: not a checkpoint directory", dir);
    di_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->dir = strdup(dir))) {
        free(ck);
        return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", dir);
    }
    char *index = di_path_join(dir, "model.safetensors.index.json");
    char *single = di_path_join(dir, "model.safetensors");
    int rc;
    if (!index || !single)
        rc = di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", dir);
    else if (file_exists(index))
        rc = open_indexed(ck, index, err);
    else if (file_exists(single))
        rc = open_single(ck, err);
    else
        rc = di_error_set(err, DI_ERR_IO, "%s: neither model.safetensors.index.json nor model.safetensors found", dir);
    free(index);
    free(single);
    if (rc == DI_OK) {
        qsort(ck->entries, (size_t)ck->n_tensors, sizeof *ck->entries, cmp_entry);
        for (int64_t i = 1; i < ck->n_tensors && rc == DI_OK; i++)
            if (strcmp(ck->entries[i].info->name, ck->entries[i - 1].info->name) == 0)
                rc = di_error_set(err, DI_ERR_INVALID, "%s: tensor '%s' appears in two shards", dir,
                                  ck->entries[i].info->name);
        for (int64_t i = 0; i < ck->n_tensors; i++) ck->total_bytes += ck->entries[i].info->end - ck->entries[i].info->begin;
    }
    if (rc != DI_OK) {
        di_ckpt_close(ck);
        return rc;
    }
    *out = ck;
    return DI_OK;
}

void di_ckpt_close(di_checkpoint *ck) {
    if (!ck) return;
    for (int i = 0; i < ck->n_shards; i++) di_st_close(ck->shards[i]);
    free(ck->shards);
    free(ck->entries);
    free(ck->dir);
    free(ck);
}

static const di_ckpt_entry *find_entry(const di_checkpoint *ck, const char *name) {
    di_tensor_info key = {.name = (char *)name};
    di_ckpt_entry k = {&key, 0};
    return bsearch(&k, ck->entries, (size_t)ck->n_tensors, sizeof k, cmp_entry);
}

const di_tensor_info *di_ckpt_find(const di_checkpoint *ck, const char *name) {
    const di_ckpt_entry *e = find_entry(ck, name);
    return e ? e->info : NULL;
}

const char *di_ckpt_shard_path(const di_checkpoint *ck, const char *name) {
    const di_ckpt_entry *e = find_entry(ck, name);
    return e ? ck->shards[e->shard]->path : NULL;
}
