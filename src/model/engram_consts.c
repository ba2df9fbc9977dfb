/* Engram hash constants: derivation, sidecar reading and validation. See engram_consts.h. */
#include "model/engram_consts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/inventory.h"
#include "util/error.h"

/* Recomputed from the reference algorithm with numpy 1.24.2 (spec §4.3); also stored as
 * `engram.multipliers` in tests/data/kernels.safetensors. */
const int64_t di_engram_released_multipliers[2][4] = {
    {76632096046245LL, 4839876093313LL, 35959672319349LL, 73987337458391LL},   /* layer 1 */
    {67716810739261LL, 51510806800915LL, 30921347202721LL, 82619226485591LL}, /* layer 14 */
};

int di_engram_is_released_layout(const di_config *c) {
    return c->n_engram_layers == 2 && c->engram_layer_ids[0] == 1 && c->engram_layer_ids[1] == 14 &&
           c->engram_max_ngram_size == 4 && c->engram_n_heads == 8 && c->engram_vocab_size == 16000000 &&
           c->engram_compressed_vocab_size == 99092 && c->engram_num_embeddings[0] == 384006168 &&
           c->engram_num_embeddings[1] == 384016682;
}

/* Trial division by 6k±1: the moduli are around engram_vocab_size (≤ 2^32 by config validation),
 * so at most ~2^16/3 divisions per candidate. */
static int is_prime(int64_t n) {
    if (n < 2) return 0;
    if (n < 4) return 1;
    if (n % 2 == 0 || n % 3 == 0) return 0;
    for (int64_t d = 5; d * d <= n; d += 6)
        if (n % d == 0 || n % (d + 2) == 0) return 0;
    return 1;
}

int64_t di_engram_next_prime(int64_t n) {
    while (!is_prime(n)) n++;
    return n;
}

/* The reference restarts every (layer, order) search at engram_vocab_size − 1 but skips primes
 * already handed out, so the whole sequence is simply the consecutive primes ≥ engram_vocab_size. */
static void derive_layout(const di_config *cfg, di_engram_consts *c) {
    int per_layer = (c->max_ngram - 1) * c->n_heads;
    int64_t p = cfg->engram_vocab_size;
    for (int l = 0; l < c->n_layers; l++) {
        int64_t off = 0;
        for (int k = 0; k < per_layer; k++) {
            p = di_engram_next_prime(p);
            c->primes[(int64_t)l * per_layer + k] = p;
            c->offsets[(int64_t)l * per_layer + k] = off;
            off += p;
            p++;
        }
    }
}

void di_engram_consts_free(di_engram_consts *c) {
    if (!c) return;
    free(c->multipliers);
    free(c->primes);
    free(c->offsets);
    free(c->token_map);
    memset(c, 0, sizeof *c);
}

int di_engram_consts_set_token_map(di_engram_consts *c, const di_config *cfg, const int32_t *map, int64_t len,
                                   di_error *err) {
    if (!c || !cfg || !map || len <= 0) return di_error_set(err, DI_ERR_INVALID, "Engram token map: empty or NULL");
    for (int64_t i = 0; i < len; i++)
        if (map[i] < 0 || map[i] >= cfg->engram_compressed_vocab_size)
            return di_error_set(err, DI_ERR_INVALID,
                                "Engram token map: token %lld maps to %d, expected a compressed id in [0, %lld)",
                                (long long)i, map[i], (long long)cfg->engram_compressed_vocab_size);
    if (cfg->engram_pad_token_id >= len)
        return di_error_set(err, DI_ERR_INVALID, "Engram token map: %lld entries do not cover the pad token %d",
                            (long long)len, cfg->engram_pad_token_id);
    int32_t *copy = malloc((size_t)len * sizeof *copy);
    if (!copy)
        return di_error_set(err, DI_ERR_NOMEM, "Engram token map: out of memory for %lld entries", (long long)len);
    memcpy(copy, map, (size_t)len * sizeof *copy);
    free(c->token_map);
    c->token_map = copy;
    c->token_map_len = len;
    c->pad_compressed_id = copy[cfg->engram_pad_token_id];
    return DI_OK;
}

/* A sidecar tensor with the expected dtype and shape, or an error naming file and tensor. */
static const di_tensor_info *want(const di_safetensors *st, const char *name, di_dtype dt, int ndim,
                                  const int64_t *shape, di_error *err) {
    const di_tensor_info *t = di_st_find(st, name);
    char es[96], fs[96];
    di_shape_str(ndim, shape, es, sizeof es);
    if (!t) {
        di_error_set(err, DI_ERR_INVALID, "%s: missing tensor '%s' (expected %s %s)", st->path, name,
                     di_dtype_name(dt), es);
        return NULL;
    }
    int ok = t->dtype == dt && t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        di_shape_str(t->ndim, t->shape, fs, sizeof fs);
        di_error_set(err, DI_ERR_INVALID, "%s: tensor '%s' expected %s %s, found %s %s", st->path, name,
                     di_dtype_name(dt), es, di_dtype_name(t->dtype), fs);
        return NULL;
    }
    return t;
}

/* di_st_open aligns tensor data to the element size; memcpy keeps the read free of strict-aliasing
 * assumptions about the mapping all the same. */
static int64_t rd64(const void *base, int64_t i) {
    int64_t v;
    memcpy(&v, (const char *)base + 8 * i, 8);
    return v;
}

static int read_sidecar(const di_config *cfg, const char *path, di_engram_consts *c, di_error *err) {
    di_safetensors *st;
    int rc = di_st_open(path, &st, err);
    if (rc) return rc;
    int nl = c->n_layers, no = c->max_ngram - 1, nh = c->n_heads;
    int64_t per = (int64_t)no * nh;
    int64_t s_primes[3] = {nl, no, nh}, s_off[2] = {nl, per}, s_mul[2] = {nl, c->max_ngram}, s_pad[1] = {1};
    const di_tensor_info *tp = want(st, "primes", DI_I64, 3, s_primes, err);
    const di_tensor_info *to = tp ? want(st, "offsets", DI_I64, 2, s_off, err) : NULL;
    const di_tensor_info *tm = to ? want(st, "multipliers", DI_I64, 2, s_mul, err) : NULL;
    const di_tensor_info *tpad = tm ? want(st, "pad_compressed_id", DI_I64, 1, s_pad, err) : NULL;
    const di_tensor_info *tmap = tpad ? di_st_find(st, "token_map") : NULL;
    if (!tpad) {
        rc = err ? err->code : DI_ERR_INVALID;
        goto done;
    }
    if (!tmap || tmap->dtype != DI_I32 || tmap->ndim != 1 || tmap->shape[0] < 1) {
        rc = di_error_set(err, DI_ERR_INVALID, "%s: tensor 'token_map' must be I32 [V] (one compressed id per token)",
                          path);
        goto done;
    }
    for (int64_t i = 0; i < nl * per; i++) {
        int64_t got = rd64(tp->data, i), exp = c->primes[i];
        if (got != exp) {
            rc = di_error_set(err, DI_ERR_INVALID,
                              "%s: tensor 'primes' element %lld is %lld, but the config's hash layout (consecutive "
                              "primes >= engram_vocab_size %lld) gives %lld",
                              path, (long long)i, (long long)got, (long long)cfg->engram_vocab_size, (long long)exp);
            goto done;
        }
        got = rd64(to->data, i);
        if (got != c->offsets[i]) {
            rc = di_error_set(err, DI_ERR_INVALID,
                              "%s: tensor 'offsets' element %lld is %lld, expected %lld (prefix sum of the primes)", path,
                              (long long)i, (long long)got, (long long)c->offsets[i]);
            goto done;
        }
    }
    /* anything else could overflow the int64 products and make the hash ill-defined */
    int64_t mmax = di_engram_multiplier_max(cfg);
    for (int64_t i = 0; i < (int64_t)nl * c->max_ngram; i++) {
        int64_t m = rd64(tm->data, i);
        if (m < 1 || m % 2 == 0 || m > mmax) {
            rc = di_error_set(err, DI_ERR_INVALID,
                              "%s: tensor 'multipliers' element %lld is %lld, expected an odd value in [1, %lld]", path,
                              (long long)i, (long long)m, (long long)mmax);
            goto done;
        }
        c->multipliers[i] = m;
    }
    if (di_engram_is_released_layout(cfg) && memcmp(c->multipliers, di_engram_released_multipliers, 8 * 8) != 0) {
        rc = di_error_set(err, DI_ERR_INVALID,
                          "%s: tensor 'multipliers' differs from the published constants of the released V4.1-Flash "
                          "config it claims to match",
                          path);
        goto done;
    }
    /* I32 data is 4-byte aligned in the mapping (di_st_open); set_token_map validates and copies it */
    rc = di_engram_consts_set_token_map(c, cfg, (const int32_t *)tmap->data, tmap->shape[0], err);
    if (rc) {
        di_error_wrap(err, "%s: tensor 'token_map'", path);
        goto done;
    }
    int64_t pad = rd64(tpad->data, 0);
    if (pad != c->pad_compressed_id) {
        rc = di_error_set(err, DI_ERR_INVALID,
                          "%s: tensor 'pad_compressed_id' is %lld but token_map[engram_pad_token_id=%d] is %lld", path,
                          (long long)pad, cfg->engram_pad_token_id, (long long)c->pad_compressed_id);
        goto done;
    }
    c->source = DI_ENGRAM_SIDECAR;
done:
    di_st_close(st);
    return rc;
}

int64_t di_engram_multiplier_max(const di_config *cfg) {
    /* the reference draws v in [0, bound) with bound = max(1, (INT64_MAX // cv) // 2) and uses 2v + 1 */
    int64_t cv = cfg->engram_compressed_vocab_size > 0 ? cfg->engram_compressed_vocab_size : 1;
    int64_t bound = (INT64_MAX / cv) / 2;
    if (bound < 1) bound = 1;
    return 2 * (bound - 1) + 1;
}

int di_engram_consts_derive(const di_config *cfg, di_engram_consts *out, di_error *err) {
    if (!cfg || !out) return di_error_set(err, DI_ERR_INVALID, "di_engram_consts_derive: NULL argument");
    memset(out, 0, sizeof *out);
    out->pad_compressed_id = -1;
    if (cfg->n_engram_layers == 0) return DI_OK;
    di_engram_consts *c = out;
    c->n_layers = cfg->n_engram_layers;
    c->max_ngram = cfg->engram_max_ngram_size;
    c->n_heads = cfg->engram_n_heads;
    memcpy(c->layer_ids, cfg->engram_layer_ids, sizeof c->layer_ids);
    int64_t per = (int64_t)(c->max_ngram - 1) * c->n_heads;
    /* bound the prime search: the released layout needs 48 primes */
    if (per * c->n_layers > 65536)
        return di_error_set(err, DI_ERR_UNSUPPORTED, "Engram layout with %lld hash buckets is beyond the supported 65536",
                            (long long)(per * c->n_layers));
    c->multipliers = calloc((size_t)c->n_layers * (size_t)c->max_ngram, sizeof(int64_t));
    c->primes = calloc((size_t)(per * c->n_layers), sizeof(int64_t));
    c->offsets = calloc((size_t)(per * c->n_layers), sizeof(int64_t));
    if (!c->multipliers || !c->primes || !c->offsets) {
        di_engram_consts_free(c);
        return di_error_set(err, DI_ERR_NOMEM, "Engram constants: out of memory for %lld hash buckets",
                            (long long)(per * c->n_layers));
    }
    derive_layout(cfg, c);
    for (int l = 0; l < c->n_layers; l++) {
        int64_t rows = c->offsets[(l + 1) * per - 1] + c->primes[(l + 1) * per - 1];
        if (rows != cfg->engram_num_embeddings[l]) {
            di_error_set(err, DI_ERR_INVALID,
                         "Engram layer %d: engram_num_embeddings is %lld but its %lld hash buckets (consecutive primes "
                         ">= engram_vocab_size %lld) need %lld rows",
                         cfg->engram_layer_ids[l], (long long)cfg->engram_num_embeddings[l], (long long)per,
                         (long long)cfg->engram_vocab_size, (long long)rows);
            di_engram_consts_free(c);
            return DI_ERR_INVALID;
        }
    }
    c->source = "derived layout (no multipliers)";
    return DI_OK;
}

int di_engram_consts_load(const di_config *cfg, const char *model_dir, di_engram_consts *out, di_error *err) {
    int rc = di_engram_consts_derive(cfg, out, err);
    if (rc || cfg->n_engram_layers == 0) return rc;
    di_engram_consts *c = out;
    char *path = model_dir ? di_path_join(model_dir, DI_ENGRAM_SIDECAR) : NULL;
    struct stat sb;
    if (path && stat(path, &sb) == 0) {
        rc = read_sidecar(cfg, path, c, err);
    } else if (di_engram_is_released_layout(cfg)) {
        memcpy(c->multipliers, di_engram_released_multipliers, sizeof di_engram_released_multipliers);
        c->source = "published V4.1-Flash constants";
    } else {
        rc = di_error_set(err, DI_ERR_UNSUPPORTED,
                          "%s: the Engram config (layers %d.., compressed vocab %lld) is not the released V4.1-Flash one "
                          "and %s is missing; its hash multipliers come from numpy's seeded generator and must be "
                          "shipped in that file",
                          model_dir ? model_dir : "config", cfg->engram_layer_ids[0],
                          (long long)cfg->engram_compressed_vocab_size, DI_ENGRAM_SIDECAR);
    }
    free(path);
    if (rc) di_engram_consts_free(c);
    return rc;
}
