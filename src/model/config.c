/* Config parsing (config.json + inference/config.json) and layer-role derivation. See config.h. */
#include "model/config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/checkpoint.h"
#include "util/error.h"
#include "util/log.h"

const char *di_layer_role_name(di_layer_role r) {
    static const char *names[DI_ROLE_COUNT] = {"swa", "source", "candidate-source", "reindex", "reuse", "dspark"};
    return (unsigned)r < DI_ROLE_COUNT ? names[r] : "?";
}

/* ------------------------------------------------------------------------------------------------
 * Field table: every scalar/list key of spec §1.2, with its config.json path (inside text_config;
 * a leading '/' means the root of config.json), its inference/config.json name, type, range and
 * default. Keys handled by hand below the table: quantization_config, vision_config. */

typedef enum { K_INT, K_I64, K_DBL, K_BOOL, K_STR, K_INTS, K_I64S } field_kind;

typedef struct field {
    const char *hf;      /* path in text_config ('.' nests, leading '/' = config.json root); NULL = none */
    const char *hf_alt;  /* second spelling accepted in config.json, or NULL */
    const char *inf;     /* key in inference/config.json, or NULL */
    field_kind kind;
    size_t off;          /* value offset in di_config */
    size_t count_off;    /* K_INTS/K_I64S: offset of the int element count */
    int max_n;           /* K_INTS/K_I64S: capacity */
    int64_t lo, hi;      /* integer range (scalars and list elements) */
    int required;        /* 1: error when absent from both files */
    double def;          /* default of an absent optional number/bool */
    const char *sdef;    /* default of an absent optional string */
} field;

#define OFF(m) offsetof(di_config, m)
#define BIG ((int64_t)1 << 40)
#define REQ_INT(hf, inf, m, lo, hi) {hf, NULL, inf, K_INT, OFF(m), 0, 0, lo, hi, 1, 0, NULL}
#define OPT_INT(hf, inf, m, lo, hi, d) {hf, NULL, inf, K_INT, OFF(m), 0, 0, lo, hi, 0, d, NULL}
#define REQ_DBL(hf, inf, m) {hf, NULL, inf, K_DBL, OFF(m), 0, 0, 0, 0, 1, 0, NULL}
#define OPT_DBL(hf, inf, m, d) {hf, NULL, inf, K_DBL, OFF(m), 0, 0, 0, 0, 0, d, NULL}
#define INTS(hf, inf, m, cnt, lo, hi, req) \
    {hf, NULL, inf, K_INTS, OFF(m), OFF(cnt), (int)(sizeof(((di_config *)0)->m) / sizeof(int)), lo, hi, req, 0, NULL}

static const field FIELDS[] = {
    REQ_INT("hidden_size", "dim", hidden_size, 32, 1 << 16),
    REQ_INT("num_hidden_layers", "n_layers", num_hidden_layers, 1, DI_MAX_STAGES),
    OPT_INT("num_nextn_predict_layers", "n_mtp_layers", num_nextn_predict_layers, 0, DI_MAX_STAGES, 0),
    REQ_INT("num_attention_heads", "n_heads", num_attention_heads, 1, 4096),
    OPT_INT("num_key_value_heads", NULL, num_key_value_heads, 1, 1, 1),
    REQ_INT("head_dim", "head_dim", head_dim, 32, 8192),
    REQ_INT("qk_rope_head_dim", "rope_head_dim", qk_rope_head_dim, 2, 8192),
    REQ_INT("q_lora_rank", "q_lora_rank", q_lora_rank, 1, 1 << 16),
    REQ_INT("o_lora_rank", "o_lora_rank", o_lora_rank, 1, 1 << 16),
    REQ_INT("o_groups", "o_groups", o_groups, 1, 4096),
    REQ_INT("sliding_window", "window_size", sliding_window, 1, 1 << 20),
    INTS("compress_ratios", "compress_ratios", compress_ratios, n_compress_ratios, 0, DI_MAX_COMPRESS_RATIO, 1),
    INTS("kv_source_layer_ids", "kv_source_layers", kv_source_layer_ids, n_kv_source_layer_ids, 0, DI_MAX_STAGES, 0),
    INTS("index_source_layer_ids", "index_source_layers", index_source_layer_ids, n_index_source_layer_ids, 0,
         DI_MAX_STAGES, 0),
    OPT_INT("candidate_source_layer_id", "candidate_source_layer", candidate_source_layer_id, -1, DI_MAX_STAGES, -1),
    OPT_INT("candidate_topk_blocks", "candidate_topk_blocks", candidate_topk_blocks, 0, 1 << 30, 0),
    OPT_INT("candidate_block_size", "candidate_block_size", candidate_block_size, 0, 1 << 20, 0),
    OPT_INT("index_n_heads", "index_n_heads", index_n_heads, 0, 4096, 0),
    OPT_INT("index_head_dim", "index_head_dim", index_head_dim, 0, 8192, 0),
    OPT_INT("index_topk", "index_topk", index_topk, 0, 1 << 30, 0),
    REQ_DBL("rope_theta", "rope_theta", rope_theta),
    OPT_DBL("compress_rope_theta", "compress_rope_theta", compress_rope_theta, 0),
    {"rope_scaling.rope_type", "rope_scaling.type", NULL, K_STR, OFF(rope_scaling_type), 0, 0, 0, 0, 0, 0, ""},
    {"rope_scaling.factor", NULL, "rope_factor", K_DBL, OFF(rope_factor), 0, 0, 0, 0, 0, 1, NULL},
    OPT_INT("rope_scaling.beta_fast", "beta_fast", rope_beta_fast, 0, 1 << 20, 32),
    OPT_INT("rope_scaling.beta_slow", "beta_slow", rope_beta_slow, 0, 1 << 20, 1),
    {"rope_scaling.original_max_position_embeddings", NULL, "original_seq_len", K_I64,
     OFF(rope_original_max_position_embeddings), 0, 0, 0, BIG, 0, 0, NULL},
    {"max_position_embeddings", NULL, NULL, K_I64, OFF(max_position_embeddings), 0, 0, 0, BIG, 0, 0, NULL},
    REQ_INT("vocab_size", "vocab_size", vocab_size, 1, 1 << 30),
    REQ_INT("n_routed_experts", "n_routed_experts", n_routed_experts, 1, 1 << 16),
    REQ_INT("num_experts_per_tok", "n_activated_experts", num_experts_per_tok, 1, 1 << 16),
    OPT_INT("n_shared_experts", "n_shared_experts", n_shared_experts, 0, 64, 1),
    REQ_INT("moe_intermediate_size", "moe_inter_dim", moe_intermediate_size, 32, 1 << 20),
    {"scoring_func", NULL, "score_func", K_STR, OFF(scoring_func), 0, 0, 0, 0, 0, 0, "sqrtsoftplus"},
    {"topk_method", NULL, NULL, K_STR, OFF(topk_method), 0, 0, 0, 0, 0, 0, "noaux_tc"},
    {"norm_topk_prob", NULL, "norm_topk_prob", K_BOOL, OFF(norm_topk_prob), 0, 0, 0, 0, 0, 1, NULL},
    OPT_DBL("routed_scaling_factor", "route_scale", routed_scaling_factor, 1.0),
    OPT_DBL("gate_temp", "gate_temp", gate_temp, 1.0),
    OPT_DBL("swiglu_limit", "swiglu_limit", swiglu_limit, 0.0),
    OPT_INT("hc_mult", "hc_mult", hc_mult, 1, 64, 4),
    OPT_INT("hc_sinkhorn_iters", "hc_sinkhorn_iters", hc_sinkhorn_iters, 1, 10000, 20),
    OPT_DBL("hc_eps", "hc_eps", hc_eps, 1e-6),
    {"rms_norm_eps", NULL, "norm_eps", K_DBL, OFF(rms_norm_eps), 0, 0, 0, 0, 0, 1e-20, NULL},
    INTS("engram_layer_ids", "engram_layer_ids", engram_layer_ids, n_engram_layers, 0, DI_MAX_STAGES, 0),
    {"engram_num_embeddings", NULL, "engram_num_embeddings", K_I64S, OFF(engram_num_embeddings), 0,
     DI_MAX_ENGRAM_LAYERS, 1, BIG, 0, 0, NULL},
    OPT_INT("engram_max_ngram_size", "engram_max_ngram_size", engram_max_ngram_size, 1, DI_MAX_NGRAM, 1),
    {"engram_vocab_size", NULL, "engram_vocab_size", K_I64, OFF(engram_vocab_size), 0, 0, 0, (int64_t)1 << 32, 0,
     0, NULL},
    OPT_INT("engram_n_heads", "engram_n_heads", engram_n_heads, 0, 1024, 0),
    OPT_INT("engram_head_dim", "engram_head_dim", engram_head_dim, 0, 1 << 16, 0),
    OPT_INT("engram_pad_token_id", "engram_pad_id", engram_pad_token_id, 0, 1 << 30, 2),
    {"engram_compressed_vocab_size", NULL, "engram_compressed_vocab_size", K_I64,
     OFF(engram_compressed_vocab_size), 0, 0, 0, (int64_t)1 << 31, 0, 0, NULL},
    OPT_INT("dspark_block_size", "dspark_block_size", dspark_block_size, 0, 1024, 0),
    OPT_INT("dspark_noise_token_id", "dspark_noise_token_id", dspark_noise_token_id, 0, 1 << 30, 0),
    INTS("dspark_target_layer_ids", "dspark_target_layer_ids", dspark_target_layer_ids, n_dspark_target_layer_ids,
         0, DI_MAX_STAGES, 0),
    OPT_INT("dspark_markov_rank", "dspark_markov_rank", dspark_markov_rank, 0, 1 << 16, 256),
    OPT_INT("dspark_n_routed_experts", "dspark_n_routed_experts", dspark_n_routed_experts, 0, 1 << 16, 0),
    OPT_INT("dspark_num_experts_per_tok", "dspark_n_activated_experts", dspark_num_experts_per_tok, 0, 1 << 16, 0),
    OPT_INT("bos_token_id", NULL, bos_token_id, 0, 1 << 30, 0),
    OPT_INT("eos_token_id", NULL, eos_token_id, 0, 1 << 30, 1),
    OPT_INT("pad_token_id", NULL, pad_token_id, 0, 1 << 30, 2),
    OPT_INT("/image_token_id", "image_token_id", image_token_id, 0, 1 << 30, 129264),
};

/* ------------------------------------------------------------------------------------------------ */

typedef struct src {
    const char *where;  /* message prefix */
    json_t *root;       /* config.json */
    json_t *text;       /* its text_config (or root for a flat document) */
    const char *text_prefix; /* "text_config." or "" */
    json_t *inf;        /* inference/config.json or NULL */
} src;

/* Look up a '.'-separated path; NULL when absent or JSON null. */
static json_t *get_path(json_t *obj, const char *path) {
    char key[128];
    while (obj && json_is_object(obj)) {
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        if (n >= sizeof key) return NULL;
        memcpy(key, path, n);
        key[n] = 0;
        obj = json_object_get(obj, key);
        if (!dot) return json_is_null(obj) ? NULL : obj;
        path = dot + 1;
    }
    return NULL;
}

/* The JSON value rendered for a message (truncated). */
static void show(const json_t *v, char *buf, size_t n) {
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    snprintf(buf, n, "%s", s ? s : "?");
    if (s && strlen(s) >= n && n > 4) memcpy(buf + n - 4, "...", 4);
    free(s);
}

/* Where a value was found, for messages: "config.json text_config.hidden_size". */
static void origin(const src *s, const field *f, int from_inf, char *buf, size_t n) {
    if (from_inf)
        snprintf(buf, n, "inference/config.json '%s'", f->inf);
    else if (f->hf[0] == '/')
        snprintf(buf, n, "config.json '%s'", f->hf + 1);
    else
        snprintf(buf, n, "config.json '%s%s'", s->text_prefix, f->hf);
}

static int get_int64(const json_t *v, int64_t *out) {
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return 1;
    }
    if (json_is_real(v)) { /* 4.0 is fine where an integer is meant */
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 9.0e15) {
            *out = (int64_t)d;
            return 1;
        }
    }
    return 0;
}

static int bad_value(const src *s, const field *f, int from_inf, const json_t *v, const char *expected,
                     di_error *err) {
    char o[160], found[96];
    origin(s, f, from_inf, o, sizeof o);
    show(v, found, sizeof found);
    return di_error_set(err, DI_ERR_INVALID, "%s: %s: expected %s, found %s", s->where, o, expected, found);
}

static int store_field(const src *s, const field *f, const json_t *v, int from_inf, di_config *cfg, di_error *err) {
    char *base = (char *)cfg;
    char expect[96];
    int64_t x;
    switch (f->kind) {
    case K_INT:
    case K_I64:
        snprintf(expect, sizeof expect, "an integer in [%lld, %lld]", (long long)f->lo, (long long)f->hi);
        if (!get_int64(v, &x) || x < f->lo || x > f->hi) return bad_value(s, f, from_inf, v, expect, err);
        if (f->kind == K_INT)
            *(int *)(base + f->off) = (int)x;
        else
            *(int64_t *)(base + f->off) = x;
        return DI_OK;
    case K_DBL:
        if (!json_is_number(v) || !isfinite(json_number_value(v)))
            return bad_value(s, f, from_inf, v, "a finite number", err);
        *(double *)(base + f->off) = json_number_value(v);
        return DI_OK;
    case K_BOOL:
        if (!json_is_boolean(v)) return bad_value(s, f, from_inf, v, "true or false", err);
        *(bool *)(base + f->off) = json_is_true(v);
        return DI_OK;
    case K_STR:
        if (!json_is_string(v) || json_string_length(v) >= DI_CFG_STR)
            return bad_value(s, f, from_inf, v, "a string of at most 63 bytes", err);
        snprintf(base + f->off, DI_CFG_STR, "%s", json_string_value(v));
        return DI_OK;
    case K_INTS:
    case K_I64S: {
        snprintf(expect, sizeof expect, "a list of at most %d integers in [%lld, %lld]", f->max_n, (long long)f->lo,
                 (long long)f->hi);
        if (!json_is_array(v) || json_array_size(v) > (size_t)f->max_n)
            return bad_value(s, f, from_inf, v, expect, err);
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            if (!get_int64(e, &x) || x < f->lo || x > f->hi) return bad_value(s, f, from_inf, v, expect, err);
            if (f->kind == K_INTS)
                ((int *)(base + f->off))[i] = (int)x;
            else
                ((int64_t *)(base + f->off))[i] = x;
        }
        if (f->kind == K_INTS) *(int *)(base + f->count_off) = (int)json_array_size(v);
        return DI_OK;
    }
    }
    return di_error_set(err, DI_ERR_INTERNAL, "bad field kind");
}

/* Numbers equal for the disagreement warning (strings/lists compared as JSON). */
static int same_value(const json_t *a, const json_t *b) {
    if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
    return json_equal((json_t *)a, (json_t *)b);
}

static int read_fields(const src *s, di_config *cfg, di_error *err) {
    for (size_t k = 0; k < sizeof FIELDS / sizeof FIELDS[0]; k++) {
        const field *f = &FIELDS[k];
        json_t *hv = NULL, *iv = NULL;
        if (f->hf) {
            json_t *scope = f->hf[0] == '/' ? s->root : s->text;
            const char *path = f->hf[0] == '/' ? f->hf + 1 : f->hf;
            hv = get_path(scope, path);
            /* token ids may sit only at the root of a nested config.json */
            if (!hv && f->hf[0] != '/' && s->text != s->root) hv = get_path(s->root, path);
            if (!hv && f->hf_alt) hv = get_path(scope, f->hf_alt);
        }
        if (f->inf && s->inf) iv = get_path(s->inf, f->inf);
        int rc;
        if (hv) {
            rc = store_field(s, f, hv, 0, cfg, err);
            /* inference/config.json uses 0 for "same as the backbone" in the DSpark expert counts */
            if (rc == DI_OK && iv && !same_value(hv, iv) &&
                !(json_is_integer(iv) && json_integer_value(iv) == 0 && strncmp(f->inf, "dspark_n_", 9) == 0))
                DI_WARN("%s: config.json '%s' and inference/config.json '%s' disagree; using config.json", s->where,
                        f->hf, f->inf);
        } else if (iv) {
            rc = store_field(s, f, iv, 1, cfg, err);
        } else if (f->required) {
            return di_error_set(err, DI_ERR_INVALID, "%s: missing required key '%s%s'%s%s%s", s->where,
                                f->hf[0] == '/' ? "" : s->text_prefix, f->hf[0] == '/' ? f->hf + 1 : f->hf,
                                f->inf ? " (inference/config.json: '" : "", f->inf ? f->inf : "", f->inf ? "')" : "");
        } else {
            char *base = (char *)cfg;
            switch (f->kind) {
            case K_INT: *(int *)(base + f->off) = (int)f->def; break;
            case K_I64: *(int64_t *)(base + f->off) = (int64_t)f->def; break;
            case K_DBL: *(double *)(base + f->off) = f->def; break;
            case K_BOOL: *(bool *)(base + f->off) = f->def != 0; break;
            case K_STR: snprintf(base + f->off, DI_CFG_STR, "%s", f->sdef ? f->sdef : ""); break;
            case K_INTS: *(int *)(base + f->count_off) = 0; break;
            case K_I64S: break;
            }
            rc = DI_OK;
        }
        if (rc != DI_OK) return rc;
    }
    return DI_OK;
}

/* engram_num_embeddings has no count field of its own: it must match engram_layer_ids. */
static int engram_rows_count(const src *s) {
    json_t *v = get_path(s->text, "engram_num_embeddings");
    if (!v && s->inf) v = get_path(s->inf, "engram_num_embeddings");
    return v && json_is_array(v) ? (int)json_array_size(v) : 0;
}

/* ---- quantization_config (root of config.json) / dtype + expert_dtype (inference) ---- */
static int read_quant(const src *s, di_config *cfg, di_error *err) {
    json_t *q = get_path(s->root, "quantization_config");
    cfg->weight_block_size = 32;
    const char *method = NULL, *expert = NULL;
    if (q) {
        if (!json_is_object(q))
            return di_error_set(err, DI_ERR_INVALID, "%s: config.json 'quantization_config' must be an object",
                                s->where);
        json_t *m = json_object_get(q, "quant_method");
        if (m && !json_is_string(m))
            return di_error_set(err, DI_ERR_INVALID, "%s: config.json 'quantization_config.quant_method' must be a string",
                                s->where);
        method = m ? json_string_value(m) : "fp8";
        json_t *e = json_object_get(q, "expert_dtype");
        if (e && !json_is_null(e)) {
            if (!json_is_string(e))
                return di_error_set(err, DI_ERR_INVALID,
                                    "%s: config.json 'quantization_config.expert_dtype' must be a string", s->where);
            expert = json_string_value(e);
        }
        json_t *b = json_object_get(q, "weight_block_size");
        if (b) {
            int64_t b0, b1;
            if (!json_is_array(b) || json_array_size(b) != 2 || !get_int64(json_array_get(b, 0), &b0) ||
                !get_int64(json_array_get(b, 1), &b1) || b0 != b1) {
                char found[96];
                show(b, found, sizeof found);
                return di_error_set(err, DI_ERR_INVALID,
                                    "%s: config.json 'quantization_config.weight_block_size': expected [32, 32], found %s",
                                    s->where, found);
            }
            if (b0 != 32)
                return di_error_set(err, DI_ERR_UNSUPPORTED,
                                    "%s: config.json 'quantization_config.weight_block_size' is [%lld, %lld]; the V4.1 "
                                    "reference hard-codes 32x32 FP8 blocks",
                                    s->where, (long long)b0, (long long)b1);
            cfg->weight_block_size = (int)b0;
        }
    } else if (s->inf) {
        json_t *d = get_path(s->inf, "dtype");
        if (d && !json_is_string(d))
            return di_error_set(err, DI_ERR_INVALID, "%s: inference/config.json 'dtype' must be a string", s->where);
        method = d ? json_string_value(d) : "bf16";
    } else {
        method = "bf16";
    }
    if (!expert) {
        json_t *e = get_path(s->root, "expert_dtype");
        if (!e && s->inf) e = get_path(s->inf, "expert_dtype");
        if (e && !json_is_string(e))
            return di_error_set(err, DI_ERR_INVALID, "%s: 'expert_dtype' must be a string or null", s->where);
        if (e) expert = json_string_value(e);
    }
    if (strcmp(method, "fp8") == 0)
        cfg->weight_fmt = DI_WFMT_FP8;
    else if (strcmp(method, "bf16") == 0)
        cfg->weight_fmt = DI_WFMT_BF16;
    else
        return di_error_set(err, DI_ERR_UNSUPPORTED, "%s: weight quantization '%s' is not supported (expected fp8 or bf16)",
                            s->where, method);
    if (!expert || strcmp(expert, "") == 0)
        cfg->expert_fmt = cfg->weight_fmt;
    else if (strcmp(expert, "fp4") == 0)
        cfg->expert_fmt = DI_WFMT_FP4;
    else if (strcmp(expert, "fp8") == 0 && cfg->weight_fmt == DI_WFMT_FP8)
        cfg->expert_fmt = DI_WFMT_FP8;
    else
        return di_error_set(err, DI_ERR_UNSUPPORTED, "%s: expert_dtype '%s' is not supported (expected fp4)", s->where,
                            expert);
    return DI_OK;
}

/* ---- vision_config (root of config.json) / vision_* (inference) ---- */
typedef struct vfield {
    const char *hf, *inf;
    field_kind kind;
    size_t off;
    int64_t lo, hi;
    double def;
} vfield;
#define VOFF(m) offsetof(di_vision_cfg, m)
static const vfield VFIELDS[] = {
    {"num_hidden_layers", "vision_n_layers", K_INT, VOFF(num_hidden_layers), 0, 1024, 0},
    {"hidden_size", "vision_dim", K_INT, VOFF(hidden_size), 1, 1 << 16, 1024},
    {"num_attention_heads", "vision_n_heads", K_INT, VOFF(num_attention_heads), 1, 1024, 16},
    {"intermediate_size", "vision_inter_dim", K_INT, VOFF(intermediate_size), 1, 1 << 20, 2816},
    {"patch_size", "vision_patch_size", K_INT, VOFF(patch_size), 1, 1024, 14},
    {"rope_theta", "vision_rope_theta", K_DBL, VOFF(rope_theta), 0, 0, 10000},
    {"downsample_ratio", "vision_downsample_ratio", K_INT, VOFF(downsample_ratio), 1, 64, 3},
    {"max_image_tokens", "vision_max_n_token", K_INT, VOFF(max_image_tokens), 0, 1 << 24, 1024},
    {"min_pixels", "vision_min_pixels", K_I64, VOFF(min_pixels), 0, BIG, 295936},
    {"max_wh_ratio", "vision_max_wh_ratio", K_DBL, VOFF(max_wh_ratio), 0, 0, 0},
};

static int read_vision(const src *s, di_config *cfg, di_error *err) {
    json_t *hv = get_path(s->root, "vision_config");
    if (hv && !json_is_object(hv))
        return di_error_set(err, DI_ERR_INVALID, "%s: config.json 'vision_config' must be an object or null", s->where);
    /* config.json decides when it has a vision_config; otherwise inference's vision_n_layers > 0 */
    json_t *scope = hv ? hv : s->inf;
    for (size_t k = 0; k < sizeof VFIELDS / sizeof VFIELDS[0]; k++) {
        const vfield *f = &VFIELDS[k];
        char *base = (char *)&cfg->vision;
        json_t *v = scope ? get_path(scope, hv ? f->hf : f->inf) : NULL;
        int64_t x;
        if (!v) {
            if (f->kind == K_DBL)
                *(double *)(base + f->off) = f->def;
            else if (f->kind == K_I64)
                *(int64_t *)(base + f->off) = (int64_t)f->def;
            else
                *(int *)(base + f->off) = (int)f->def;
            /* a vision_config without its layer count is taken as the released 32-layer tower */
            if (hv && f->off == VOFF(num_hidden_layers)) cfg->vision.num_hidden_layers = 32;
            continue;
        }
        if (f->kind == K_DBL) {
            if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < 0)
                return di_error_set(err, DI_ERR_INVALID, "%s: %s '%s%s': expected a non-negative number", s->where,
                                    hv ? "config.json" : "inference/config.json", hv ? "vision_config." : "",
                                    hv ? f->hf : f->inf);
            *(double *)(base + f->off) = json_number_value(v);
        } else {
            if (!get_int64(v, &x) || x < f->lo || x > f->hi) {
                char found[64];
                show(v, found, sizeof found);
                return di_error_set(err, DI_ERR_INVALID, "%s: %s '%s%s': expected an integer in [%lld, %lld], found %s",
                                    s->where, hv ? "config.json" : "inference/config.json", hv ? "vision_config." : "",
                                    hv ? f->hf : f->inf, (long long)f->lo, (long long)f->hi, found);
            }
            if (f->kind == K_I64)
                *(int64_t *)(base + f->off) = x;
            else
                *(int *)(base + f->off) = (int)x;
        }
    }
    cfg->has_vision = cfg->vision.num_hidden_layers > 0;
    return DI_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Consistency checks and role derivation. */

static int index_of(const int *ids, int n, int x) {
    for (int i = 0; i < n; i++)
        if (ids[i] == x) return i;
    return -1;
}

/* Each id in [0, limit), no repeats. */
static int check_ids(const char *where, const char *key, const int *ids, int n, int limit, const char *what,
                     di_error *err) {
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= limit)
            return di_error_set(err, DI_ERR_INVALID, "%s: '%s' lists layer %d, expected a %s id in [0, %d)", where, key,
                                ids[i], what, limit);
        if (index_of(ids, i, ids[i]) >= 0)
            return di_error_set(err, DI_ERR_INVALID, "%s: '%s' lists layer %d twice", where, key, ids[i]);
    }
    return DI_OK;
}

#define REQUIRE(cond, ...) \
    do {                   \
        if (!(cond)) return di_error_set(err, DI_ERR_INVALID, __VA_ARGS__); \
    } while (0)

static int check_dims(const char *w, const di_config *c, di_error *err) {
    REQUIRE(c->hidden_size % 32 == 0, "%s: hidden_size %d must be a multiple of 32 (FP8/FP4 scale blocks)", w,
            c->hidden_size);
    REQUIRE(c->head_dim % 32 == 0, "%s: head_dim %d must be a multiple of 32 (window KV is FP8-quantized in 32-blocks)",
            w, c->head_dim);
    REQUIRE(c->qk_rope_head_dim % 2 == 0 && c->qk_rope_head_dim <= c->head_dim,
            "%s: qk_rope_head_dim %d must be even and at most head_dim %d", w, c->qk_rope_head_dim, c->head_dim);
    REQUIRE(c->num_attention_heads % c->o_groups == 0, "%s: num_attention_heads %d must be a multiple of o_groups %d", w,
            c->num_attention_heads, c->o_groups);
    REQUIRE(c->moe_intermediate_size % 32 == 0,
            "%s: moe_intermediate_size %d must be a multiple of 32 (FP4 scales per 32 along K)", w,
            c->moe_intermediate_size);
    REQUIRE(c->num_experts_per_tok <= c->n_routed_experts, "%s: num_experts_per_tok %d exceeds n_routed_experts %d", w,
            c->num_experts_per_tok, c->n_routed_experts);
    REQUIRE(c->num_experts_per_tok <= DI_MAX_ACTIVE_EXPERTS && c->dspark_num_experts_per_tok <= DI_MAX_ACTIVE_EXPERTS,
            "%s: num_experts_per_tok %d / dspark_num_experts_per_tok %d: at most %d active experts are supported", w,
            c->num_experts_per_tok, c->dspark_num_experts_per_tok, DI_MAX_ACTIVE_EXPERTS);
    REQUIRE(c->n_shared_experts == 1, "%s: n_shared_experts is %d; the V4.1 reference requires exactly 1", w,
            c->n_shared_experts);
    REQUIRE(c->rope_theta > 0, "%s: rope_theta must be positive, found %g", w, c->rope_theta);
    REQUIRE(c->rms_norm_eps >= 0 && c->hc_eps >= 0, "%s: rms_norm_eps and hc_eps must be non-negative", w);
    REQUIRE(c->gate_temp > 0, "%s: gate_temp must be positive, found %g", w, c->gate_temp);
    REQUIRE(c->swiglu_limit >= 0, "%s: swiglu_limit must be non-negative, found %g", w, c->swiglu_limit);
    REQUIRE(strcmp(c->scoring_func, "sqrtsoftplus") == 0 || strcmp(c->scoring_func, "softmax") == 0 ||
                strcmp(c->scoring_func, "sigmoid") == 0,
            "%s: scoring_func '%s' is not one of sqrtsoftplus, softmax, sigmoid", w, c->scoring_func);
    if (c->rope_scaling_type[0] && strcmp(c->rope_scaling_type, "yarn") != 0)
        return di_error_set(err, DI_ERR_UNSUPPORTED, "%s: rope_scaling type '%s' is not supported (expected yarn)", w,
                            c->rope_scaling_type);
    REQUIRE(c->rope_original_max_position_embeddings == 0 || c->rope_factor >= 1,
            "%s: rope_scaling.factor %g must be at least 1 when YaRN is active", w, c->rope_factor);
    REQUIRE(c->bos_token_id < c->vocab_size && c->eos_token_id < c->vocab_size && c->pad_token_id < c->vocab_size,
            "%s: bos/eos/pad token ids (%d, %d, %d) must be below vocab_size %d", w, c->bos_token_id, c->eos_token_id,
            c->pad_token_id, c->vocab_size);
    return DI_OK;
}

static int check_engram(const char *w, const di_config *c, int n_rows, di_error *err) {
    int rc = check_ids(w, "engram_layer_ids", c->engram_layer_ids, c->n_engram_layers, c->n_layers, "backbone layer", err);
    if (rc) return rc;
    if (c->n_engram_layers == 0) return DI_OK;
    REQUIRE(c->n_engram_layers <= DI_MAX_ENGRAM_LAYERS, "%s: at most %d Engram layers are supported", w,
            DI_MAX_ENGRAM_LAYERS);
    REQUIRE(n_rows == c->n_engram_layers, "%s: engram_num_embeddings has %d entries but engram_layer_ids has %d", w,
            n_rows, c->n_engram_layers);
    REQUIRE(c->engram_max_ngram_size >= 2, "%s: engram_max_ngram_size %d must be at least 2 (orders 2..N are hashed)",
            w, c->engram_max_ngram_size);
    REQUIRE(c->engram_n_heads >= 1, "%s: engram_n_heads must be at least 1", w);
    REQUIRE(c->engram_head_dim >= 32 && c->engram_head_dim % 32 == 0,
            "%s: engram_head_dim %d must be a positive multiple of 32 (one E8M0 scale per 32 values)", w,
            c->engram_head_dim);
    REQUIRE(c->engram_vocab_size >= 1, "%s: engram_vocab_size must be at least 1", w);
    REQUIRE(c->engram_compressed_vocab_size >= 1, "%s: engram_compressed_vocab_size must be at least 1", w);
    REQUIRE(c->engram_pad_token_id < c->vocab_size, "%s: engram_pad_token_id %d must be below vocab_size %d", w,
            c->engram_pad_token_id, c->vocab_size);
    return DI_OK;
}

static int check_dspark(const char *w, const di_config *c, di_error *err) {
    if (c->n_dspark == 0) return DI_OK;
    int rc = check_ids(w, "dspark_target_layer_ids", c->dspark_target_layer_ids, c->n_dspark_target_layer_ids,
                       c->n_layers, "backbone layer", err);
    if (rc) return rc;
    REQUIRE(c->n_dspark_target_layer_ids >= 1, "%s: DSpark stages need at least one dspark_target_layer_ids entry", w);
    REQUIRE(c->n_dspark_target_layer_ids <= DI_MAX_DSPARK_TARGETS, "%s: at most %d DSpark target layers are supported",
            w, DI_MAX_DSPARK_TARGETS);
    REQUIRE(c->dspark_markov_rank >= 1, "%s: dspark_markov_rank must be at least 1", w);
    REQUIRE(c->dspark_noise_token_id < c->vocab_size, "%s: dspark_noise_token_id %d must be below vocab_size %d", w,
            c->dspark_noise_token_id, c->vocab_size);
    REQUIRE(c->dspark_num_experts_per_tok <= c->dspark_n_routed_experts,
            "%s: dspark_num_experts_per_tok %d exceeds dspark_n_routed_experts %d", w, c->dspark_num_experts_per_tok,
            c->dspark_n_routed_experts);
    return DI_OK;
}

static int check_vision(const char *w, const di_config *c, di_error *err) {
    if (!c->has_vision) return DI_OK;
    const di_vision_cfg *v = &c->vision;
    REQUIRE(v->hidden_size % v->num_attention_heads == 0 && (v->hidden_size / v->num_attention_heads) % 4 == 0,
            "%s: vision hidden_size %d must split into %d heads of a multiple of 4 channels (2D RoPE)", w,
            v->hidden_size, v->num_attention_heads);
    REQUIRE(c->image_token_id < c->vocab_size, "%s: image_token_id %d must be below vocab_size %d", w, c->image_token_id,
            c->vocab_size);
    return DI_OK;
}

/* Walk the backbone in order, tracking the latest kv and index source as the reference's
 * SharedAttentionRuntime does: each source overwrites the slot its consumers read. */
static int derive_roles(const char *w, di_config *c, di_error *err) {
    int n = c->n_layers, rc;
    rc = check_ids(w, "kv_source_layer_ids", c->kv_source_layer_ids, c->n_kv_source_layer_ids, n, "backbone layer", err);
    if (rc) return rc;
    rc = check_ids(w, "index_source_layer_ids", c->index_source_layer_ids, c->n_index_source_layer_ids, n,
                   "backbone layer", err);
    if (rc) return rc;
    int cand = c->candidate_source_layer_id;
    if (cand >= 0) {
        REQUIRE(cand < n && index_of(c->index_source_layer_ids, c->n_index_source_layer_ids, cand) >= 0,
                "%s: candidate_source_layer_id %d must be one of index_source_layer_ids", w, cand);
        REQUIRE(c->candidate_topk_blocks >= 1 && c->candidate_block_size >= 1,
                "%s: candidate_topk_blocks and candidate_block_size must be at least 1 with a candidate source", w);
    }
    if (c->n_index_source_layer_ids > 0)
        REQUIRE(c->index_n_heads >= 1 && c->index_topk >= 1 && c->index_head_dim >= c->qk_rope_head_dim &&
                    c->index_head_dim % 32 == 0,
                "%s: index sources need index_n_heads >= 1, index_topk >= 1 and index_head_dim (%d) a multiple of 32 "
                "holding the %d rope channels",
                w, c->index_head_dim, c->qk_rope_head_dim);

    int latest_kv = -1, latest_idx = -1;
    for (int L = 0; L < n; L++) {
        di_layer_cfg *l = &c->layer[L];
        memset(l, 0, sizeof *l);
        int r = c->compress_ratios[L];
        bool kv = index_of(c->kv_source_layer_ids, c->n_kv_source_layer_ids, L) >= 0;
        bool idx = index_of(c->index_source_layer_ids, c->n_index_source_layer_ids, L) >= 0;
        l->compress_ratio = r;
        l->dspark_stage = -1;
        l->kv_source = l->index_source = l->index_key_source = l->candidate_source = -1;
        l->n_experts = c->n_routed_experts;
        l->n_active_experts = c->num_experts_per_tok;
        l->engram_index = index_of(c->engram_layer_ids, c->n_engram_layers, L);
        l->dspark_target = c->n_dspark > 0 && index_of(c->dspark_target_layer_ids, c->n_dspark_target_layer_ids, L) >= 0;
        if (r == 0) {
            REQUIRE(!kv && !idx, "%s: layer %d is listed as a %s source but compress_ratios[%d] is 0", w, L,
                    kv ? "kv" : "index", L);
            l->role = DI_ROLE_SWA;
            l->rope = DI_ROPE_PLAIN;
            l->rope_base = c->rope_theta;
            continue;
        }
        /* the index keys come from the compressor's latent, so a kv source must index too */
        REQUIRE(!kv || idx, "%s: layer %d is a kv source but not an index source (its indexer owns the index keys)", w,
                L);
        if (kv) latest_kv = L;
        if (idx) latest_idx = L;
        REQUIRE(latest_kv >= 0, "%s: layer %d has compress ratio %d but no kv source at or before it", w, L, r);
        REQUIRE(c->compress_ratios[latest_kv] == r,
                "%s: layer %d (ratio %d) would read the compressed KV of kv source %d (ratio %d); ratios must match", w,
                L, r, latest_kv, c->compress_ratios[latest_kv]);
        REQUIRE(latest_idx >= 0, "%s: layer %d has compress ratio %d but no index source at or before it", w, L, r);
        REQUIRE(c->compress_ratios[latest_idx] == r,
                "%s: layer %d (ratio %d) would reuse the top-k of index source %d (ratio %d); ratios must match", w, L,
                r, latest_idx, c->compress_ratios[latest_idx]);
        l->is_kv_source = kv;
        l->is_index_source = idx;
        l->is_candidate_source = L == cand;
        l->kv_source = latest_kv;
        l->index_source = latest_idx;
        if (idx) {
            l->index_key_source = latest_kv;
            if (cand >= 0 && cand < L) {
                REQUIRE(c->compress_ratios[cand] == r,
                        "%s: index source %d (ratio %d) would use the candidate mask of layer %d (ratio %d); ratios "
                        "must match",
                        w, L, r, cand, c->compress_ratios[cand]);
                l->candidate_source = cand;
            }
        }
        l->has_compressor = kv;
        l->has_compressor_gate = kv && r > 1; /* ratio 1 is a plain projection: nothing to pool */
        l->has_indexer = idx;
        l->has_index_wk = idx && kv;
        l->role = kv ? (L == cand ? DI_ROLE_CANDIDATE_SOURCE : DI_ROLE_SOURCE) : idx ? DI_ROLE_REINDEX : DI_ROLE_REUSE;
        l->rope = DI_ROPE_COMPRESS;
        l->rope_base = c->compress_rope_theta;
        l->rope_yarn = c->rope_original_max_position_embeddings > 0;
    }
    for (int s = 0; s < c->n_dspark; s++) {
        int st = n + s;
        di_layer_cfg *l = &c->layer[st];
        memset(l, 0, sizeof *l);
        REQUIRE(c->compress_ratios[st] == 0, "%s: compress_ratios[%d] (DSpark stage %d) is %d; draft stages must be 0",
                w, st, s, c->compress_ratios[st]);
        l->role = DI_ROLE_DSPARK;
        l->is_dspark = true;
        l->dspark_stage = s;
        l->kv_source = l->index_source = l->index_key_source = l->candidate_source = -1;
        l->engram_index = -1;
        l->rope = DI_ROPE_PLAIN;
        l->rope_base = c->rope_theta;
        l->n_experts = c->dspark_n_routed_experts;
        l->n_active_experts = c->dspark_num_experts_per_tok;
        l->has_main_proj = s == 0;
        l->has_draft_head = s == c->n_dspark - 1;
    }
    if (c->compress_rope_theta <= 0) {
        for (int L = 0; L < n; L++)
            REQUIRE(c->compress_ratios[L] == 0, "%s: compress_rope_theta must be positive when layers compress KV", w);
    }
    return DI_OK;
}

static json_t *parse_json(const char *text, size_t len, const char *what, const char *where, di_error *err) {
    json_error_t je;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        di_error_set(err, DI_ERR_FORMAT, "%s: %s: invalid JSON (line %d: %s)", where, what, je.line, je.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        di_error_set(err, DI_ERR_FORMAT, "%s: %s: expected a JSON object at the top level", where, what);
        return NULL;
    }
    return j;
}

int di_config_parse(const char *hf_json, size_t hf_len, const char *inf_json, size_t inf_len, const char *where,
                    di_config *cfg, di_error *err) {
    if (!where) where = "config";
    if (!cfg) return di_error_set(err, DI_ERR_INVALID, "%s: no config to fill", where);
    memset(cfg, 0, sizeof *cfg);
    if (!hf_json) return di_error_set(err, DI_ERR_INVALID, "%s: config.json text is required", where);
    src s = {.where = where, .text_prefix = ""};
    int rc = DI_OK;
    s.root = parse_json(hf_json, hf_len, "config.json", where, err);
    if (!s.root) return err ? err->code : DI_ERR_FORMAT;
    if (inf_json) {
        s.inf = parse_json(inf_json, inf_len, "inference/config.json", where, err);
        if (!s.inf) {
            rc = err ? err->code : DI_ERR_FORMAT;
            goto done;
        }
    }
    json_t *mt = json_object_get(s.root, "model_type");
    if (!json_is_string(mt)) {
        rc = di_error_set(err, DI_ERR_INVALID, "%s: config.json has no string 'model_type' (expected \"deepseek_v41\")",
                          where);
        goto done;
    }
    const char *type = json_string_value(mt);
    if (strcmp(type, "deepseek_v41") == 0) {
        json_t *t = json_object_get(s.root, "text_config");
        if (t && !json_is_object(t)) {
            rc = di_error_set(err, DI_ERR_INVALID, "%s: config.json 'text_config' must be an object", where);
            goto done;
        }
        s.text = t ? t : s.root;
        s.text_prefix = t ? "text_config." : "";
        json_t *tt = t ? json_object_get(t, "model_type") : NULL;
        if (tt && (!json_is_string(tt) || strcmp(json_string_value(tt), "deepseek_v41_text") != 0)) {
            char found[64];
            show(tt, found, sizeof found);
            rc = di_error_set(err, DI_ERR_UNSUPPORTED,
                              "%s: config.json text_config.model_type is %s, expected \"deepseek_v41_text\"", where,
                              found);
            goto done;
        }
    } else if (strcmp(type, "deepseek_v41_text") == 0) {
        s.text = s.root;
    } else {
        rc = di_error_set(err, DI_ERR_UNSUPPORTED,
                          "%s: config.json model_type '%.64s' is not supported: this engine implements DeepSeek-V4.1 "
                          "(model_type \"deepseek_v41\")%s",
                          where, type,
                          strncmp(type, "deepseek_v4", 11) == 0 ? "; V4-Flash is a different, weight-incompatible "
                                                                  "architecture" : "");
        goto done;
    }
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", type);

    if ((rc = read_fields(&s, cfg, err)) != DI_OK) goto done;
    if ((rc = read_quant(&s, cfg, err)) != DI_OK) goto done;
    if ((rc = read_vision(&s, cfg, err)) != DI_OK) goto done;

    cfg->n_layers = cfg->num_hidden_layers;
    if (cfg->n_layers + cfg->num_nextn_predict_layers > DI_MAX_STAGES) {
        rc = di_error_set(err, DI_ERR_UNSUPPORTED, "%s: %d layers + %d draft stages exceed the limit of %d stages", where,
                          cfg->n_layers, cfg->num_nextn_predict_layers, DI_MAX_STAGES);
        goto done;
    }
    if (cfg->n_compress_ratios != cfg->n_layers + cfg->num_nextn_predict_layers) {
        rc = di_error_set(err, DI_ERR_INVALID,
                          "%s: compress_ratios has %d entries, expected num_hidden_layers + num_nextn_predict_layers = "
                          "%d + %d",
                          where, cfg->n_compress_ratios, cfg->n_layers, cfg->num_nextn_predict_layers);
        goto done;
    }
    /* the reference builds draft stages only when dspark_block_size > 0 */
    cfg->n_dspark = cfg->dspark_block_size > 0 ? cfg->num_nextn_predict_layers : 0;
    cfg->n_stages = cfg->n_layers + cfg->n_dspark;
    if (cfg->dspark_n_routed_experts == 0) cfg->dspark_n_routed_experts = cfg->n_routed_experts;
    if (cfg->dspark_num_experts_per_tok == 0) cfg->dspark_num_experts_per_tok = cfg->num_experts_per_tok;

    if ((rc = check_dims(where, cfg, err)) != DI_OK) goto done;
    if ((rc = check_engram(where, cfg, engram_rows_count(&s), err)) != DI_OK) goto done;
    if ((rc = check_dspark(where, cfg, err)) != DI_OK) goto done;
    if ((rc = check_vision(where, cfg, err)) != DI_OK) goto done;
    rc = derive_roles(where, cfg, err);
done:
    json_decref(s.root);
    json_decref(s.inf);
    return rc;
}

/* Whole small file into memory (configs are a few KB; refuse anything absurd). */
static int slurp(const char *path, char **out, size_t *len, di_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return di_error_set(err, DI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 > cap) {
            cap = cap ? cap * 2 : 8192;
            if (cap > (16u << 20)) {
                free(buf);
                fclose(f);
                return di_error_set(err, DI_ERR_FORMAT, "%s: larger than 16 MiB, not a config file", path);
            }
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory reading it", path);
            }
            buf = nb;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return di_error_set(err, DI_ERR_IO, "%s: read error", path);
    }
    *out = buf;
    *len = n;
    return DI_OK;
}

int di_config_load(const char *model_dir, di_config *cfg, di_error *err) {
    if (!model_dir) return di_error_set(err, DI_ERR_INVALID, "no model directory given");
    /* DIR (holding config.json) or the path of a config.json-style file itself; inference/config.json
     * is looked up next to it either way */
    struct stat sb;
    int is_file = stat(model_dir, &sb) == 0 && S_ISREG(sb.st_mode);
    char *dir = strdup(model_dir);
    if (!dir) return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", model_dir);
    char *hf_path = NULL;
    if (is_file) {
        hf_path = strdup(model_dir);
        char *slash = strrchr(dir, '/');
        if (slash)
            slash[1] = 0;
        else
            strcpy(dir, ".");
    } else {
        hf_path = di_path_join(dir, "config.json");
    }
    char *inf_path = di_path_join(dir, "inference/config.json");
    char *hf = NULL, *inf = NULL;
    size_t hf_len = 0, inf_len = 0;
    int rc = (hf_path && inf_path) ? DI_OK : di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", model_dir);
    if (rc == DI_OK) rc = slurp(hf_path, &hf, &hf_len, err);
    if (rc == DI_OK && stat(inf_path, &sb) == 0) rc = slurp(inf_path, &inf, &inf_len, err);
    if (rc == DI_OK) rc = di_config_parse(hf, hf_len, inf, inf_len, is_file ? model_dir : dir, cfg, err);
    free(hf);
    free(inf);
    free(hf_path);
    free(inf_path);
    free(dir);
    return rc;
}

void di_config_free(di_config *cfg) { (void)cfg; }

void di_stage_prefix(const di_config *cfg, int stage, char *buf, size_t n) {
    if (stage >= cfg->n_layers)
        snprintf(buf, n, "mtp.%d.", stage - cfg->n_layers);
    else
        snprintf(buf, n, "layers.%d.", stage);
}

void di_cache_footprint_of(const di_config *cfg, int stage, di_cache_footprint *out) {
    memset(out, 0, sizeof *out);
    if (!cfg || stage < 0 || stage >= cfg->n_stages) return;
    const di_layer_cfg *l = &cfg->layer[stage];
    int hd = cfg->head_dim;
    /* window slot: head_dim e4m3 codes + one E8M0 per 32 (FP8 QDQ over the whole vector, §4.4) */
    out->window_bytes = (int64_t)cfg->sliding_window * (hd + hd / 32);
    if (!l->is_kv_source) return;
    int r = l->compress_ratio;
    /* compressed entry: FP4 codes + one E4M3 scale per 16 values (§4.1) */
    out->compressed_entry_bytes = hd / 2 + hd / 16;
    /* index key: FP4 codes + one E8M0 scale per 32 values */
    out->index_key_bytes = cfg->index_head_dim / 2 + cfg->index_head_dim / 32;
    /* ratio > 1 carries a partial group: kv and score, R slots × head_dim f32 each */
    if (r > 1) out->compressor_state_bytes = (int64_t)2 * r * hd * 4;
    out->per_token_bytes = (double)(out->compressed_entry_bytes + out->index_key_bytes) / r;
}
