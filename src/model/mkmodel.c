/* Random-weight checkpoints in the official V4.1 layout (see mkmodel.h): preset shapes, the
 * config documents, deterministic per-tensor random streams, and the streaming shard writer.
 * Values are drawn so every block's activations stay in a realistic range (norm gains and init
 * scales below), which keeps the FP8/FP4 quantizers and the router exercised as on real weights. */
#include "model/mkmodel.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "io/formats.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/engram_consts.h"
#include "model/inventory.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/log.h"

/* ---- presets ----
 * Both presets cover every V4.1 block role (SWA-only, ratio-2 kv+index source, ratio-2 reuse,
 * ratio-1 kv+index+candidate source, ratio-1 reuse, re-index), Engram on two layers, and two DSpark
 * stages, with the real 129,280-token vocabulary. `tiny` keeps the golden tiny cases' widths (fast
 * on a laptop CPU); `small` uses the real per-head shapes (head_dim 512, rope 64, index dim 128,
 * window 128). */
typedef struct preset {
    const char *name;
    int hidden, layers, heads, head_dim, rope_dim, q_lora, o_lora, o_groups, window;
    int ratios[16];  /* n_layers + n_mtp entries */
    int kv_src[4], n_kv_src, idx_src[8], n_idx_src, cand_src, cand_blocks, cand_block;
    int idx_heads, idx_dim, idx_topk;
    int yarn_orig, yarn_factor, max_pos;
    int experts, topk, moe_inter;
    int engram_layers[2], engram_vocab, engram_heads, engram_dim;
    int n_mtp, dspark_block, dspark_targets[3], markov_rank, dspark_experts, dspark_topk;
} preset;

static const preset k_presets[] = {
    {.name = "tiny", .hidden = 256, .layers = 6, .heads = 4, .head_dim = 64, .rope_dim = 16, .q_lora = 64,
     .o_lora = 64, .o_groups = 2, .window = 16, .ratios = {0, 2, 2, 1, 1, 1, 0, 0},
     .kv_src = {1, 3}, .n_kv_src = 2, .idx_src = {1, 3, 5}, .n_idx_src = 3, .cand_src = 3, .cand_blocks = 3,
     .cand_block = 4, .idx_heads = 4, .idx_dim = 64, .idx_topk = 8, .yarn_orig = 4096, .yarn_factor = 4,
     .max_pos = 16384, .experts = 8, .topk = 2, .moe_inter = 128, .engram_layers = {1, 3},
     .engram_vocab = 1000, .engram_heads = 2, .engram_dim = 32, .n_mtp = 2, .dspark_block = 3,
     .dspark_targets = {3, 4, 5}, .markov_rank = 32, .dspark_experts = 4, .dspark_topk = 2},
    {.name = "small", .hidden = 1024, .layers = 8, .heads = 8, .head_dim = 512, .rope_dim = 64, .q_lora = 256,
     .o_lora = 256, .o_groups = 2, .window = 128, .ratios = {0, 0, 2, 2, 1, 1, 1, 1, 0, 0},
     .kv_src = {2, 4}, .n_kv_src = 2, .idx_src = {2, 4, 6}, .n_idx_src = 3, .cand_src = 4, .cand_blocks = 64,
     .cand_block = 8, .idx_heads = 8, .idx_dim = 128, .idx_topk = 64, .yarn_orig = 4096, .yarn_factor = 16,
     .max_pos = 65536, .experts = 32, .topk = 4, .moe_inter = 512, .engram_layers = {1, 3},
     .engram_vocab = 4000, .engram_heads = 4, .engram_dim = 64, .n_mtp = 2, .dspark_block = 5,
     .dspark_targets = {5, 6, 7}, .markov_rank = 64, .dspark_experts = 8, .dspark_topk = 2},
    /* Every real V4.1 dimension and all 384 experts for four backbone layers — SWA-only (with Engram,
     * like layer 1), ratio-2 kv+index source (with Engram, like layer 14), ratio-1 kv+index+candidate
     * source (like layer 20), ratio-1 re-index (like 24) — one DSpark stage, Engram tables of ~1 M
     * rows each. About 35 GB: meant for the GPU machine's layer benchmarks. */
    {.name = "full-layer", .hidden = 5120, .layers = 4, .heads = 64, .head_dim = 512, .rope_dim = 64,
     .q_lora = 1280, .o_lora = 1024, .o_groups = 8, .window = 128, .ratios = {0, 2, 1, 1, 0},
     .kv_src = {1, 2}, .n_kv_src = 2, .idx_src = {1, 2, 3}, .n_idx_src = 3, .cand_src = 2, .cand_blocks = 2048,
     .cand_block = 8, .idx_heads = 32, .idx_dim = 128, .idx_topk = 512, .yarn_orig = 65536, .yarn_factor = 16,
     .max_pos = 1048576, .experts = 384, .topk = 6, .moe_inter = 2304, .engram_layers = {0, 1},
     .engram_vocab = 41600, .engram_heads = 8, .engram_dim = 256, .n_mtp = 1, .dspark_block = 5,
     .dspark_targets = {1, 2, 3}, .markov_rank = 256, .dspark_experts = 128, .dspark_topk = 3},
};

const char *const di_mkmodel_presets[] = {"tiny", "small", "full-layer", NULL};

enum { VOCAB = 129280, MAX_NGRAM = 4, PAD_ID = 2, NOISE_ID = 128799 };

static const preset *find_preset(const char *name) {
    for (size_t i = 0; i < sizeof k_presets / sizeof k_presets[0]; i++)
        if (!strcmp(k_presets[i].name, name)) return &k_presets[i];
    return NULL;
}

static json_t *int_array(const int *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

/* Engram hash constants of a generated model: consecutive primes above engram_vocab_size handed
 * out layer by layer, n-gram order 2..4, then head (the released model's scheme, model.md §4.3);
 * offsets are exclusive prefix sums within a layer. Multipliers are odd and bounded so that the
 * XOR of products of compressed ids cannot overflow int64 (same bound as the reference). */
typedef struct engram_plan {
    int64_t primes[2][MAX_NGRAM - 1][8];   /* [layer][order-2][head] */
    int64_t offsets[2][(MAX_NGRAM - 1) * 8];
    int64_t multipliers[2][MAX_NGRAM];
    int64_t rows[2];                        /* table rows = Σ primes of the layer */
} engram_plan;

/* The bucket moduli are di_engram_next_prime's consecutive primes ≥ engram_vocab_size (the rule
 * model/engram_consts.c checks the sidecar against); multipliers are drawn like the reference's,
 * from [0, ⌊⌊INT64_MAX / classes⌋ / 2⌋), times 2 plus 1. classes ≥ 1. */
static void engram_make_plan(const preset *p, uint64_t seed, int64_t classes, engram_plan *ep);

/* ---- deterministic random streams: xoshiro256** seeded from (seed, tensor name) ---- */
typedef struct rng {
    uint64_t s[4];
} rng;

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void rng_seed(rng *r, uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull ^ seed; /* FNV-1a over the name, keyed by the seed */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix(&h);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t rng_next(rng *r) {
    uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

/* Approximately standard normal: Irwin–Hall sum of four 16-bit uniforms, rescaled to unit
 * variance. Cheap enough to fill 10^8 weights per second; the tails stop at ±3.46σ, which is
 * what a realistic random init looks like anyway. */
static inline float rng_normal(rng *r) {
    uint64_t v = rng_next(r);
    float s = (float)(v & 0xffff) + (float)((v >> 16) & 0xffff) + (float)((v >> 32) & 0xffff) + (float)(v >> 48);
    return (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

static inline float rng_uniform(rng *r) { return (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f); }

/* ---- what each tensor holds ---- */
typedef enum gen_kind {
    G_BF16,        /* normal(mean, std) → bf16 */
    G_F32,         /* normal(mean, std) → f32 */
    G_F32_UNIFORM, /* uniform(mean − std, mean + std) → f32 */
    G_FP8,         /* normal(0, std) quantized to e4m3 with pow2 block scales */
    G_FP8_SCALE,   /* the E8M0 scales of the sibling .weight */
    G_FP4,         /* uniform random e2m1 codes */
    G_FP4_SCALE,   /* E8M0 exponents around log2(std / rms(e2m1)) */
    G_I64_ZERO
} gen_kind;

typedef struct gen_rule {
    gen_kind kind;
    float mean, std;
    int block_rows; /* FP8 scale block height: 32, or 1 for Engram table rows */
} gen_rule;

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* Norm weights keep the magnitudes seen in the reference's own random test models, which keep
 * every block's activations in a realistic range (small attn_norm gain, larger ffn_norm, ~1 at the
 * output norms). */
static float norm_gain(const char *name) {
    if (strstr(name, "attn_norm")) return 0.025f;
    if (strstr(name, "ffn_norm")) return 0.2f;
    if (strstr(name, "kv_norm")) return 0.4f;
    if (strstr(name, "compressor.norm")) return 0.6f;
    if (strstr(name, "k_norm")) return 0.5f;
    return 1.0f; /* q_norm, norm, main_norm */
}

static gen_rule rule_for(const di_inv_entry *e, const di_inv_entry *weight_sibling) {
    const char *n = e->name;
    int64_t k = e->ndim >= 2 ? e->shape[e->ndim - 1] : e->shape[0];
    gen_rule r = {G_BF16, 0.0f, 1.0f / sqrtf((float)(k > 0 ? k : 1)), 32};
    if (ends_with(n, ".scale") && e->dtype == DI_F8_E8M0) {
        if (weight_sibling && weight_sibling->dtype == DI_I8) {
            r.kind = G_FP4_SCALE;
            r.std = 1.0f / sqrtf((float)(weight_sibling->shape[1] * 2));
        } else {
            r = rule_for(weight_sibling, NULL);
            r.kind = G_FP8_SCALE;
        }
        return r;
    }
    if (e->dtype == DI_I8) return (gen_rule){G_FP4, 0, 0, 32};
    if (e->dtype == DI_F8_E4M3) {
        if (strstr(n, "engram.embed")) return (gen_rule){G_FP8, 0.0f, 1.0f, 1};
        r.kind = G_FP8;
        r.std = 1.5f / sqrtf((float)k);
        return r;
    }
    if (e->dtype == DI_I64) return (gen_rule){G_I64_ZERO, 0, 0, 0};
    if (ends_with(n, "norm.weight")) return (gen_rule){G_BF16, norm_gain(n), 0.1f * norm_gain(n), 0};
    if (strstr(n, "hc_") && ends_with(n, "_base")) return (gen_rule){G_F32_UNIFORM, 0.0f, 1.0f, 0};
    if (strstr(n, "hc_") && ends_with(n, "_scale")) return (gen_rule){G_F32, 0.0f, 0.2f, 0};
    if (strstr(n, "hc_") && ends_with(n, "_fn")) return (gen_rule){G_F32, 0.0f, 1.0f / sqrtf((float)k), 0};
    if (ends_with(n, "attn_sink")) return (gen_rule){G_F32, 0.0f, 0.4f, 0};
    if (ends_with(n, "gate.bias") || ends_with(n, "gate.bias_vl")) return (gen_rule){G_F32, 0.0f, 0.3f, 0};
    if (e->dtype == DI_F32) return (gen_rule){G_F32, 0.0f, 1.0f / sqrtf((float)k), 0};
    if (!strcmp(n, "embed.weight") || strstr(n, "markov_head.embed")) return (gen_rule){G_BF16, 0.0f, 0.12f, 0};
    if (ends_with(n, "gate.weight")) r.std = 2.9f / sqrtf((float)k);
    if (ends_with(n, "compressor.wkv.weight")) r.std = 1.8f / sqrtf((float)k);
    return r;
}

/* Values of rows [r0, r0+nr) of a normal FP8 weight, before quantization. Every row draws from its
 * own position in the tensor's stream, so regenerating a row range reproduces it exactly. */
static void fp8_values(uint64_t seed, const char *wname, float std, int64_t cols, int64_t r0, int64_t nr,
                       float *out /* [nr, cols] */) {
    rng r;
    char key[160];
    for (int64_t i = 0; i < nr; i++) {
        snprintf(key, sizeof key, "%s#%lld", wname, (long long)(r0 + i));
        rng_seed(&r, seed, key);
        for (int64_t c = 0; c < cols; c++) out[i * cols + c] = std * rng_normal(&r);
    }
}

/* E8M0 exponent making the block's amax fit e4m3's ±448: 2^ceil(log2(amax / 448)). */
static int block_exp(const float *v, int64_t ld, int64_t nr, int64_t c0, int64_t nc) {
    float amax = 0.0f;
    for (int64_t i = 0; i < nr; i++)
        for (int64_t c = c0; c < c0 + nc; c++) amax = fmaxf(amax, fabsf(v[i * ld + c]));
    if (amax == 0.0f) return -127 + 1;
    int e = (int)ceilf(log2f(amax / 448.0f));
    while (ldexpf(448.0f, e) < amax) e++; /* guard log2f rounding */
    return e < -126 ? -126 : (e > 127 ? 127 : e);
}

/* ---- configs ---- */

/* One row per config field: its HF text_config key, its inference/config.json (ModelArgs) key or
 * NULL when the reference has none, and its value. Writing both documents from one table keeps them
 * consistent by construction. */
typedef struct field {
    const char *hf, *inf;
    json_t *value;
} field;

int di_mkmodel_preset_configs(const char *name, int64_t engram_classes, char **hf_json, char **inf_json,
                              di_error *err) {
    const preset *p = find_preset(name);
    if (!p) return di_error_set(err, DI_ERR_INVALID, "unknown preset '%s' (expected tiny, small or full-layer)", name);
    if (engram_classes < 1 || engram_classes > VOCAB)
        return di_error_set(err, DI_ERR_INVALID, "preset '%s': engram_classes %lld (expected 1 … %d)", name,
                            (long long)engram_classes, VOCAB);
    int n_ratios = p->layers + p->n_mtp;
    /* Engram table sizes follow from the primes (see engram_plan). */
    engram_plan ep;
    engram_make_plan(p, 0, engram_classes, &ep);
    const int64_t *rows = ep.rows;
    const field fields[] = {
        {"model_type", NULL, json_string("deepseek_v41_text")},
        {"hidden_size", "dim", json_integer(p->hidden)},
        {"num_hidden_layers", "n_layers", json_integer(p->layers)},
        {"num_nextn_predict_layers", "n_mtp_layers", json_integer(p->n_mtp)},
        {"num_attention_heads", "n_heads", json_integer(p->heads)},
        {"num_key_value_heads", NULL, json_integer(1)},
        {"head_dim", "head_dim", json_integer(p->head_dim)},
        {"qk_rope_head_dim", "rope_head_dim", json_integer(p->rope_dim)},
        {"q_lora_rank", "q_lora_rank", json_integer(p->q_lora)},
        {"o_lora_rank", "o_lora_rank", json_integer(p->o_lora)},
        {"o_groups", "o_groups", json_integer(p->o_groups)},
        {"sliding_window", "window_size", json_integer(p->window)},
        {"compress_ratios", "compress_ratios", int_array(p->ratios, n_ratios)},
        {"kv_source_layer_ids", "kv_source_layers", int_array(p->kv_src, p->n_kv_src)},
        {"index_source_layer_ids", "index_source_layers", int_array(p->idx_src, p->n_idx_src)},
        {"candidate_source_layer_id", "candidate_source_layer", json_integer(p->cand_src)},
        {"candidate_topk_blocks", "candidate_topk_blocks", json_integer(p->cand_blocks)},
        {"candidate_block_size", "candidate_block_size", json_integer(p->cand_block)},
        {"index_n_heads", "index_n_heads", json_integer(p->idx_heads)},
        {"index_head_dim", "index_head_dim", json_integer(p->idx_dim)},
        {"index_topk", "index_topk", json_integer(p->idx_topk)},
        {"rope_theta", "rope_theta", json_integer(10000)},
        {"compress_rope_theta", "compress_rope_theta", json_real(160000.0)},
        {"rope_scaling", NULL,
         json_pack("{s:s, s:i, s:i, s:i, s:i}", "rope_type", "yarn", "factor", p->yarn_factor, "beta_fast", 32,
                   "beta_slow", 1, "original_max_position_embeddings", p->yarn_orig)},
        {NULL, "rope_factor", json_integer(p->yarn_factor)},
        {NULL, "original_seq_len", json_integer(p->yarn_orig)},
        {NULL, "beta_fast", json_integer(32)},
        {NULL, "beta_slow", json_integer(1)},
        {"max_position_embeddings", NULL, json_integer(p->max_pos)},
        {"vocab_size", "vocab_size", json_integer(VOCAB)},
        {"n_routed_experts", "n_routed_experts", json_integer(p->experts)},
        {"num_experts_per_tok", "n_activated_experts", json_integer(p->topk)},
        {"n_shared_experts", "n_shared_experts", json_integer(1)},
        {"moe_intermediate_size", "moe_inter_dim", json_integer(p->moe_inter)},
        {"scoring_func", "score_func", json_string("sqrtsoftplus")},
        {"topk_method", NULL, json_string("noaux_tc")},
        {"norm_topk_prob", NULL, json_true()},
        {"routed_scaling_factor", "route_scale", json_real(1.5)},
        {"swiglu_limit", "swiglu_limit", json_real(10.0)},
        {"hc_mult", "hc_mult", json_integer(4)},
        {"hc_sinkhorn_iters", "hc_sinkhorn_iters", json_integer(20)},
        {"hc_eps", "hc_eps", json_real(1e-6)},
        {"rms_norm_eps", "norm_eps", json_real(1e-20)},
        {"engram_layer_ids", "engram_layer_ids", int_array(p->engram_layers, 2)},
        {"engram_num_embeddings", "engram_num_embeddings", json_pack("[II]", (json_int_t)rows[0], (json_int_t)rows[1])},
        {"engram_max_ngram_size", "engram_max_ngram_size", json_integer(MAX_NGRAM)},
        {"engram_vocab_size", "engram_vocab_size", json_integer(p->engram_vocab)},
        {"engram_n_heads", "engram_n_heads", json_integer(p->engram_heads)},
        {"engram_head_dim", "engram_head_dim", json_integer(p->engram_dim)},
        {"engram_pad_token_id", "engram_pad_id", json_integer(PAD_ID)},
        {"engram_compressed_vocab_size", "engram_compressed_vocab_size", json_integer(engram_classes)},
        {"dspark_block_size", "dspark_block_size", json_integer(p->dspark_block)},
        {"dspark_noise_token_id", "dspark_noise_token_id", json_integer(NOISE_ID)},
        {"dspark_target_layer_ids", "dspark_target_layer_ids", int_array(p->dspark_targets, 3)},
        {"dspark_markov_rank", "dspark_markov_rank", json_integer(p->markov_rank)},
        {"dspark_n_routed_experts", "dspark_n_routed_experts", json_integer(p->dspark_experts)},
        {"dspark_num_experts_per_tok", "dspark_n_activated_experts", json_integer(p->dspark_topk)},
        {"bos_token_id", NULL, json_integer(0)},
        {"eos_token_id", NULL, json_integer(1)},
        {"pad_token_id", NULL, json_integer(PAD_ID)},
    };
    json_t *t = json_object(), *inf = json_pack("{s:s, s:s}", "dtype", "fp8", "expert_dtype", "fp4");
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        if (fields[i].hf) json_object_set(t, fields[i].hf, fields[i].value);
        if (fields[i].inf) json_object_set(inf, fields[i].inf, fields[i].value);
        json_decref(fields[i].value);
    }
    json_t *hf = json_pack("{s:[s], s:s, s:s, s:i, s:i, s:i}", "architectures", "DeepseekV41ForCausalLM", "model_type",
                           "deepseek_v41", "dtype", "bfloat16", "bos_token_id", 0, "eos_token_id", 1, "pad_token_id",
                           PAD_ID);
    json_object_set_new(hf, "quantization_config",
                        json_pack("{s:s, s:s, s:[i,i], s:s, s:s}", "quant_method", "fp8", "activation_scheme",
                                  "dynamic", "weight_block_size", 32, 32, "scale_fmt", "ue8m0", "expert_dtype", "fp4"));
    json_object_set_new(hf, "text_config", t);
    json_object_set_new(hf, "deepinfer_preset", json_string(p->name));

    *hf_json = json_dumps(hf, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    *inf_json = json_dumps(inf, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(hf);
    json_decref(inf);
    if (!*hf_json || !*inf_json) return di_error_set(err, DI_ERR_NOMEM, "out of memory");
    return DI_OK;
}

static void engram_make_plan(const preset *p, uint64_t seed, int64_t classes, engram_plan *ep) {
    memset(ep, 0, sizeof *ep);
    int64_t next = p->engram_vocab; /* primes are handed out once, in (layer, order, head) order */
    for (int l = 0; l < 2; l++) {
        int k = 0;
        for (int o = 0; o < MAX_NGRAM - 1; o++)
            for (int h = 0; h < p->engram_heads; h++) {
                int64_t prime = di_engram_next_prime(next);
                next = prime + 1;
                ep->primes[l][o][h] = prime;
                ep->offsets[l][k++] = ep->rows[l];
                ep->rows[l] += prime;
            }
        rng g;
        char key[64];
        snprintf(key, sizeof key, "engram.multipliers.%d", l);
        rng_seed(&g, seed, key);
        int64_t bound = INT64_MAX / classes / 2;
        for (int i = 0; i < MAX_NGRAM; i++) ep->multipliers[l][i] = (int64_t)(rng_next(&g) % (uint64_t)bound) * 2 + 1;
    }
}

static int write_engram_sidecar(const char *dir, const preset *p, const engram_plan *ep, const int32_t *token_map,
                                di_error *err) {
    int h = p->engram_heads;
    int64_t mult[2 * MAX_NGRAM], offs[2 * (MAX_NGRAM - 1) * 8], primes[2 * (MAX_NGRAM - 1) * 8];
    for (int l = 0; l < 2; l++) {
        for (int i = 0; i < MAX_NGRAM; i++) mult[l * MAX_NGRAM + i] = ep->multipliers[l][i];
        for (int o = 0; o < MAX_NGRAM - 1; o++)
            for (int j = 0; j < h; j++) {
                primes[(l * (MAX_NGRAM - 1) + o) * h + j] = ep->primes[l][o][j];
                offs[l * (MAX_NGRAM - 1) * h + o * h + j] = ep->offsets[l][o * h + j];
            }
    }
    int64_t pad = token_map[PAD_ID];
    di_tensor_spec specs[5] = {
        {"multipliers", DI_I64, 2, {2, MAX_NGRAM}},
        {"offsets", DI_I64, 2, {2, (MAX_NGRAM - 1) * h}},
        {"pad_compressed_id", DI_I64, 1, {1}},
        {"primes", DI_I64, 3, {2, MAX_NGRAM - 1, h}},
        {"token_map", DI_I32, 1, {VOCAB}},
    };
    const void *data[5] = {mult, offs, &pad, primes, token_map};
    char *path = di_path_join(dir, DI_ENGRAM_SIDECAR);
    if (!path) return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", dir);
    int rc = di_st_write_file(path, specs, data, 5, err);
    free(path);
    return rc;
}

static int write_text(const char *dir, const char *name, const char *text, di_error *err) {
    char *path = di_path_join(dir, name);
    if (!path) return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", dir);
    FILE *f = fopen(path, "w");
    int rc = DI_OK;
    if (!f || fputs(text, f) < 0 || fputc('\n', f) == EOF)
        rc = di_error_set(err, DI_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    if (f && fclose(f) != 0 && rc == DI_OK) rc = di_error_set(err, DI_ERR_IO, "%s: write failed", path);
    free(path);
    return rc;
}

/* Order inside a shard: by name, with X.weight immediately before X.scale. */
static int cmp_entries(const void *a, const void *b) {
    const di_inv_entry *x = *(const di_inv_entry *const *)a, *y = *(const di_inv_entry *const *)b;
    char kx[128], ky[128];
    snprintf(kx, sizeof kx, "%s", x->name);
    snprintf(ky, sizeof ky, "%s", y->name);
    if (ends_with(kx, ".scale")) strcpy(kx + strlen(kx) - 6, ".weight\x01");
    if (ends_with(ky, ".scale")) strcpy(ky + strlen(ky) - 6, ".weight\x01");
    return strcmp(kx, ky);
}

static const di_inv_entry *find_entry(const di_inv_entry *inv, int64_t n, const char *name) {
    for (int64_t i = 0; i < n; i++)
        if (!strcmp(inv[i].name, name)) return &inv[i];
    return NULL;
}

static uint64_t entry_bytes(const di_inv_entry *e) {
    uint64_t b = di_dtype_size(e->dtype);
    for (int d = 0; d < e->ndim; d++) b *= (uint64_t)e->shape[d];
    return b;
}

/* ---- parallel generation: units of ≤ UNIT bytes, generated by a thread pool, written in order ----
 * A tensor is cut into units at fixed byte positions (UNIT, or whole 32-row blocks for FP8), and each
 * unit draws from its own stream: FP8 rows are seeded per row (fp8_values), every other kind per unit
 * ("name" for the first, "name@j" for unit j > 0). The bytes therefore depend on the seed and the
 * tensor alone, never on the thread count or scheduling. Workers fill a ring of RING·threads unit
 * buffers; the calling thread writes them in file order through the shard's streaming writer, so
 * memory stays ~threads·RING·UNIT however large the checkpoint. */
enum { UNIT = 4 << 20, RING = 3, MAX_THREADS = 64 };

typedef struct gen_unit {
    const di_inv_entry *e;   /* the tensor this unit belongs to */
    const di_inv_entry *sib; /* the weight of a .scale tensor, else NULL */
    gen_rule r;
    uint64_t off, len; /* byte range inside the tensor */
    int64_t rb0, rb1;  /* FP8 / FP8 scales: row blocks [rb0, rb1) of the weight */
    int64_t index;     /* unit number inside the tensor (stream key of non-FP8 kinds) */
} gen_unit;

typedef struct gen_scratch {
    float *vals; /* f32 [rows of one unit, cols] FP8 values before quantization */
    size_t cap;
} gen_scratch;

/* FP8 codes (scales_only = 0) or E8M0 scales (1) of weight w's row blocks [rb0, rb1) into out. */
static int gen_fp8(uint64_t seed, const di_inv_entry *w, gen_rule r, int64_t rb0, int64_t rb1, int scales_only,
                   gen_scratch *g, uint8_t *out, di_error *err) {
    int64_t rows = w->shape[0], cols = w->shape[1], br = r.block_rows;
    int64_t sc_cols = (cols + 31) / 32;
    uint8_t exps[4096]; /* E8M0 [sc_cols] scales of one block of rows */
    if (sc_cols > (int64_t)sizeof exps) return di_error_set(err, DI_ERR_INTERNAL, "%s: too many columns", w->name);
    size_t need = (size_t)br * (size_t)cols;
    if (need > g->cap) {
        float *nv = realloc(g->vals, need * sizeof(float));
        if (!nv) return di_error_set(err, DI_ERR_NOMEM, "out of memory generating %s", w->name);
        g->vals = nv, g->cap = need;
    }
    float inv_scale[4096]; /* 1 / 2^e of each 32-column block: exact, so v·inv == v / s */
    for (int64_t rb = rb0; rb < rb1; rb++) {
        int64_t r0 = rb * br, nr = rows - r0 < br ? rows - r0 : br;
        fp8_values(seed, w->name, r.std, cols, r0, nr, g->vals);
        for (int64_t cb = 0; cb < sc_cols; cb++) {
            int64_t nc = cols - cb * 32 < 32 ? cols - cb * 32 : 32;
            exps[cb] = di_e8m0_from_exp(block_exp(g->vals, cols, nr, cb * 32, nc));
            inv_scale[cb] = 1.0f / di_e8m0_to_f32(exps[cb]);
        }
        if (scales_only) {
            memcpy(out, exps, (size_t)sc_cols); /* one scale row per block of rows (or per row) */
            out += sc_cols;
            continue;
        }
        for (int64_t i = 0; i < nr; i++, out += cols)
            for (int64_t col = 0; col < cols; col++) out[col] = di_f32_to_e4m3(g->vals[i * cols + col] * inv_scale[col / 32]);
    }
    return DI_OK;
}

static int gen_unit_bytes(uint64_t seed, const gen_unit *u, gen_scratch *g, uint8_t *b, di_error *err) {
    gen_rule r = u->r;
    if (r.kind == G_FP8) return gen_fp8(seed, u->e, r, u->rb0, u->rb1, 0, g, b, err);
    if (r.kind == G_FP8_SCALE) return gen_fp8(seed, u->sib, r, u->rb0, u->rb1, 1, g, b, err);
    rng s;
    char key[160];
    if (u->index == 0) snprintf(key, sizeof key, "%s", u->e->name);
    else snprintf(key, sizeof key, "%s@%lld", u->e->name, (long long)u->index);
    rng_seed(&s, seed, key);
    /* FP4 scale exponent centred so the dequantized weights have std ≈ 1/sqrt(K); e2m1 codes drawn
     * uniformly have rms ≈ 2.93. */
    int fp4_exp = (int)lrintf(log2f(r.std / 2.93f));
    size_t n = (size_t)u->len;
    switch (r.kind) {
    case G_BF16:
        for (size_t i = 0; i < n / 2; i++) {
            uint16_t h = di_f32_to_bf16(r.mean + r.std * rng_normal(&s));
            memcpy(b + 2 * i, &h, 2);
        }
        break;
    case G_F32:
    case G_F32_UNIFORM:
        for (size_t i = 0; i < n / 4; i++) {
            float v = r.kind == G_F32 ? r.mean + r.std * rng_normal(&s) : r.mean + r.std * (2.0f * rng_uniform(&s) - 1.0f);
            memcpy(b + 4 * i, &v, 4);
        }
        break;
    case G_FP4: /* eight random code bytes per draw */
        for (size_t i = 0; i < n; i += 8) {
            uint64_t v = rng_next(&s);
            memcpy(b + i, &v, n - i < 8 ? n - i : 8);
        }
        break;
    case G_FP4_SCALE:
        for (size_t i = 0; i < n; i++) b[i] = di_e8m0_from_exp(fp4_exp + (int)(rng_next(&s) % 3) - 1);
        break;
    default:
        memset(b, 0, n);
    }
    return DI_OK;
}

/* Appends tensor e's units to *u (grown as needed). */
static int plan_units(const di_inv_entry *e, const di_inv_entry *sib, gen_unit **u, int64_t *n, int64_t *cap,
                      di_error *err) {
    gen_rule r = rule_for(e, sib);
    uint64_t total = entry_bytes(e);
    if ((r.kind == G_FP8_SCALE) && !sib) return di_error_set(err, DI_ERR_INTERNAL, "%s has no weight sibling", e->name);
    if (total == 0) return DI_OK;
    const di_inv_entry *w = r.kind == G_FP8_SCALE ? sib : e;
    int fp8 = r.kind == G_FP8 || r.kind == G_FP8_SCALE;
    int64_t n_blocks = fp8 ? (w->shape[0] + r.block_rows - 1) / r.block_rows : 0;
    /* FP8: whole row blocks of ~UNIT bytes of codes (a scale unit regenerates the same rows) */
    int64_t blocks_per = fp8 ? UNIT / ((int64_t)r.block_rows * w->shape[1]) : 0;
    if (fp8 && blocks_per < 1) blocks_per = 1;
    int64_t sc_row = fp8 ? (w->shape[1] + 31) / 32 : 0; /* bytes of one block's scale row */
    for (int64_t j = 0, rb = 0;; j++) {
        gen_unit x = {.e = e, .sib = sib, .r = r, .index = j};
        if (fp8) {
            if (rb >= n_blocks) break;
            x.rb0 = rb, x.rb1 = rb + blocks_per < n_blocks ? rb + blocks_per : n_blocks;
            int64_t r0 = x.rb0 * r.block_rows, r1 = x.rb1 * r.block_rows < w->shape[0] ? x.rb1 * r.block_rows : w->shape[0];
            x.len = r.kind == G_FP8 ? (uint64_t)((r1 - r0) * w->shape[1]) : (uint64_t)((x.rb1 - x.rb0) * sc_row);
            rb = x.rb1;
        } else {
            x.off = (uint64_t)j * UNIT;
            if (x.off >= total) break;
            x.len = total - x.off < UNIT ? total - x.off : UNIT;
        }
        if (*n == *cap) {
            int64_t nc = *cap ? 2 * *cap : 1024;
            gen_unit *g = realloc(*u, sizeof(gen_unit) * (size_t)nc);
            if (!g) return di_error_set(err, DI_ERR_NOMEM, "out of memory planning %s", e->name);
            *u = g, *cap = nc;
        }
        (*u)[(*n)++] = x;
    }
    return DI_OK;
}

typedef struct gen_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t seed;
    const gen_unit *units;
    int64_t n_units, next, written; /* next: first unclaimed unit; written: units already written */
    int n_slots;
    uint8_t **buf;    /* [n_slots] UNIT bytes each; unit i lives in slot i % n_slots */
    int *ready;       /* [n_slots] 1 when the slot's unit is generated */
    int failed;
    di_error err;
} gen_pool;

static void *gen_worker(void *arg) {
    gen_pool *p = arg;
    gen_scratch g = {0};
    pthread_mutex_lock(&p->mu);
    for (;;) {
        /* the next unit may start once its slot's previous occupant has been written */
        while (!p->failed && p->next < p->n_units && p->next - p->written >= p->n_slots) pthread_cond_wait(&p->cv, &p->mu);
        if (p->failed || p->next >= p->n_units) break;
        int64_t i = p->next++;
        pthread_mutex_unlock(&p->mu);
        di_error e = {0};
        int rc = gen_unit_bytes(p->seed, &p->units[i], &g, p->buf[i % p->n_slots], &e);
        pthread_mutex_lock(&p->mu);
        if (rc != DI_OK && !p->failed) p->failed = 1, p->err = e;
        p->ready[i % p->n_slots] = 1;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    free(g.vals);
    return NULL;
}

/* Generates units [0, n) with `threads` workers and writes them, in order, to w. */
static int gen_write_units(di_st_writer *w, uint64_t seed, const gen_unit *units, int64_t n, int threads,
                           di_error *err) {
    gen_pool p = {.seed = seed, .units = units, .n_units = n, .n_slots = RING * threads};
    pthread_t tid[MAX_THREADS];
    int started = 0, rc = DI_OK;
    p.buf = calloc((size_t)p.n_slots, sizeof *p.buf);
    p.ready = calloc((size_t)p.n_slots, sizeof *p.ready);
    for (int s = 0; p.buf && s < p.n_slots; s++)
        if (!(p.buf[s] = malloc(UNIT))) break;
    if (!p.buf || !p.ready || !p.buf[p.n_slots - 1]) rc = di_error_set(err, DI_ERR_NOMEM, "out of memory: %d generation buffers", p.n_slots);
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.cv, NULL);
    for (; rc == DI_OK && started < threads; started++)
        if (pthread_create(&tid[started], NULL, gen_worker, &p)) {
            rc = di_error_set(err, DI_ERR_INTERNAL, "cannot start generation thread %d", started);
            break;
        }
    for (int64_t i = 0; rc == DI_OK && i < n; i++) {
        int s = (int)(i % p.n_slots);
        pthread_mutex_lock(&p.mu);
        while (!p.ready[s] && !p.failed) pthread_cond_wait(&p.cv, &p.mu);
        if (p.failed) rc = di_error_set(err, p.err.code, "%s", p.err.msg);
        pthread_mutex_unlock(&p.mu);
        if (rc == DI_OK) rc = di_st_writer_write(w, p.buf[s], (size_t)units[i].len, err);
        pthread_mutex_lock(&p.mu);
        p.ready[s] = 0;
        p.written = i + 1;
        if (rc != DI_OK) p.failed = 1;
        pthread_cond_broadcast(&p.cv);
        pthread_mutex_unlock(&p.mu);
    }
    pthread_mutex_lock(&p.mu);
    p.failed = p.failed || rc != DI_OK;
    p.next = p.failed ? p.n_units : p.next;
    pthread_cond_broadcast(&p.cv);
    pthread_mutex_unlock(&p.mu);
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
    pthread_mutex_destroy(&p.mu);
    pthread_cond_destroy(&p.cv);
    for (int s = 0; p.buf && s < p.n_slots; s++) free(p.buf[s]);
    free(p.buf);
    free(p.ready);
    return rc;
}

/* Shards follow the released checkpoint's arrangement: the backbone and draft stages first, split
 * at ~4 GB, then one shard per Engram table. */
enum { MAX_SHARDS = 64 };
#define SHARD_BYTES (UINT64_C(4) << 30)

static int write_shards(const char *dir, uint64_t seed, int threads, const di_inv_entry *inv, int64_t n,
                        di_mkmodel_stats *st, di_error *err) {
    const di_inv_entry **order = malloc((size_t)n * sizeof *order);
    int *shard_of = malloc((size_t)n * sizeof *shard_of);
    if (!order || !shard_of) {
        free(order);
        free(shard_of);
        return di_error_set(err, DI_ERR_NOMEM, "out of memory");
    }
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) order[m++] = &inv[i];
    qsort(order, (size_t)m, sizeof *order, cmp_entries);
    /* assign shards */
    int n_shards = 1;
    uint64_t cur = 0;
    for (int64_t i = 0; i < m; i++) {
        if (strstr(order[i]->name, ".engram.embed.")) continue;
        uint64_t b = entry_bytes(order[i]);
        if (cur > 0 && cur + b > SHARD_BYTES && !ends_with(order[i]->name, ".scale")) {
            n_shards++;
            cur = 0;
        }
        shard_of[i] = n_shards - 1;
        cur += b;
    }
    int first_engram = n_shards;
    char engram_layer[2][32] = {"", ""};
    for (int64_t i = 0; i < m; i++) {
        if (!strstr(order[i]->name, ".engram.embed.")) continue;
        int slot = -1;
        char pref[32];
        snprintf(pref, sizeof pref, "%.*s", (int)(strstr(order[i]->name, ".engram.") - order[i]->name), order[i]->name);
        for (int s = 0; s < 2; s++)
            if (!strcmp(engram_layer[s], pref)) slot = s;
        if (slot < 0) {
            slot = !engram_layer[0][0] ? 0 : 1;
            snprintf(engram_layer[slot], sizeof engram_layer[slot], "%s", pref);
        }
        shard_of[i] = first_engram + slot;
        if (first_engram + slot + 1 > n_shards) n_shards = first_engram + slot + 1;
    }
    json_t *wm = json_object();
    int rc = wm ? DI_OK : di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", dir);
    uint64_t total = 0;
    gen_unit *units = NULL;
    int64_t cap_units = 0;
    for (int s = 0; s < n_shards && rc == DI_OK; s++) {
        char fname[64];
        snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        di_tensor_spec *specs = calloc((size_t)m, sizeof *specs);
        if (!specs) {
            rc = di_error_set(err, DI_ERR_NOMEM, "%s: out of memory for the tensor list of shard %d", dir, s + 1);
            break;
        }
        int64_t k = 0, n_units = 0;
        for (int64_t i = 0; i < m && rc == DI_OK; i++) {
            if (shard_of[i] != s) continue;
            specs[k].name = order[i]->name;
            specs[k].dtype = order[i]->dtype;
            specs[k].ndim = order[i]->ndim;
            memcpy(specs[k].shape, order[i]->shape, sizeof specs[k].shape);
            json_object_set_new(wm, order[i]->name, json_string(fname));
            total += entry_bytes(order[i]);
            k++;
            const di_inv_entry *sib = NULL;
            if (ends_with(order[i]->name, ".scale")) {
                char wname[128];
                snprintf(wname, sizeof wname, "%.*s.weight", (int)strlen(order[i]->name) - 6, order[i]->name);
                sib = find_entry(inv, n, wname);
            }
            rc = plan_units(order[i], sib, &units, &n_units, &cap_units, err);
        }
        char *path = di_path_join(dir, fname);
        static const char *const meta[] = {"format", "pt"};
        di_st_writer *w = NULL;
        if (rc == DI_OK)
            rc = path ? di_st_writer_open(path, specs, k, meta, 1, &w, err)
                      : di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", dir);
        free(path);
        if (rc == DI_OK) rc = gen_write_units(w, seed, units, n_units, threads, err);
        if (w) {
            int rc2 = di_st_writer_close(w, rc == DI_OK ? err : NULL);
            if (rc == DI_OK) rc = rc2;
        }
        free(specs);
    }
    free(units);
    if (rc == DI_OK) {
        json_t *idx = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wm);
        char *text = json_dumps(idx, JSON_INDENT(1) | JSON_SORT_KEYS);
        json_decref(idx);
        rc = write_text(dir, "model.safetensors.index.json", text, err);
        free(text);
    } else {
        json_decref(wm);
    }
    st->n_shards = n_shards;
    st->tensor_bytes = total;
    free(order);
    free(shard_of);
    return rc;
}

static int copy_file(const char *src, const char *dst, di_error *err) {
    FILE *a = fopen(src, "rb");
    if (!a) return di_error_set(err, DI_ERR_IO, "%s: %s", src, strerror(errno));
    FILE *b = fopen(dst, "wb");
    if (!b) {
        fclose(a);
        return di_error_set(err, DI_ERR_IO, "%s: %s", dst, strerror(errno));
    }
    char buf[1 << 16];
    size_t k;
    int rc = DI_OK;
    while ((k = fread(buf, 1, sizeof buf, a)) > 0)
        if (fwrite(buf, 1, k, b) != k) rc = di_error_set(err, DI_ERR_IO, "%s: write failed", dst);
    fclose(a);
    if (fclose(b) != 0 && rc == DI_OK) rc = di_error_set(err, DI_ERR_IO, "%s: write failed", dst);
    return rc;
}

/* Locate the tokenizer directory to ship with the model: the option, else data/tokenizer/deepseek-v4
 * relative to the working directory. Returns a malloc'd directory or NULL. */
static char *find_tokenizer_dir(const char *opt) {
    struct stat sb;
    if (opt) {
        if (stat(opt, &sb) == 0 && S_ISDIR(sb.st_mode)) return strdup(opt);
        if (stat(opt, &sb) == 0) {
            char *d = strdup(opt), *slash = d ? strrchr(d, '/') : NULL;
            if (!d) return NULL;
            if (slash) *slash = 0;
            else strcpy(d, ".");
            return d;
        }
        return NULL;
    }
    const char *def = "data/tokenizer/deepseek-v4";
    char *probe = di_path_join(def, "tokenizer.json");
    int ok = stat(probe, &sb) == 0;
    free(probe);
    return ok ? strdup(def) : NULL;
}

int di_mkmodel_write(const di_mkmodel_opts *o, di_mkmodel_stats *st, di_error *err) {
    double t0 = di_now();
    memset(st, 0, sizeof *st);
    const preset *p = find_preset(o->preset ? o->preset : "");
    if (!p)
        return di_error_set(err, DI_ERR_INVALID, "unknown preset '%s' (expected tiny, small or full-layer)",
                            o->preset ? o->preset : "");
    char *tokdir = o->tokenizer_in_place ? NULL : find_tokenizer_dir(o->tokenizer);
    if (o->tokenizer && !tokdir) return di_error_set(err, DI_ERR_IO, "%s: tokenizer not found", o->tokenizer);
    int rc = di_mkdir_p(o->out_dir, err);
    char *infdir = di_path_join(o->out_dir, "inference");
    if (rc == DI_OK && !infdir) rc = di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", o->out_dir);
    if (rc == DI_OK) rc = di_mkdir_p(infdir, err);

    int32_t *token_map = malloc(VOCAB * sizeof *token_map); /* int32 [VOCAB] */
    int64_t classes = (VOCAB + 1) / 2;
    if (!token_map && rc == DI_OK) rc = di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", o->out_dir);
    if (token_map && o->token_map) {
        memcpy(token_map, o->token_map, VOCAB * sizeof *token_map);
        classes = o->token_map_classes;
    } else {
        /* a stub that pairs tokens (2k, 2k+1 → k), like the reference's own random test models */
        for (int i = 0; token_map && i < VOCAB; i++) token_map[i] = i / 2;
    }

    char *hf = NULL, *inf = NULL;
    if (rc == DI_OK) rc = di_mkmodel_preset_configs(p->name, classes, &hf, &inf, err);
    if (rc == DI_OK) rc = write_text(o->out_dir, "config.json", hf, err);
    if (rc == DI_OK) rc = write_text(infdir, "config.json", inf, err);
    di_config cfg;
    int have_cfg = 0;
    if (rc == DI_OK) {
        rc = di_config_parse(hf, strlen(hf), inf, strlen(inf), o->out_dir, &cfg, err);
        have_cfg = rc == DI_OK;
    }
    di_inv_entry *inv = NULL;
    int64_t n = 0;
    if (rc == DI_OK) rc = di_inventory_build(&cfg, &inv, &n, err);
    if (rc == DI_OK) {
        /* 0: DI_MKMODEL_THREADS when set (leave cores to a benchmark running beside), else every CPU */
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        const char *env = getenv("DI_MKMODEL_THREADS");
        int threads = o->threads > 0 ? o->threads : env && atoi(env) > 0 ? atoi(env) : (ncpu > 0 ? (int)ncpu : 1);
        st->threads = threads < MAX_THREADS ? threads : MAX_THREADS;
        rc = write_shards(o->out_dir, o->seed, st->threads, inv, n, st, err);
    }
    engram_plan ep;
    engram_make_plan(p, o->seed, classes, &ep);
    if (rc == DI_OK) rc = write_engram_sidecar(o->out_dir, p, &ep, token_map, err);
    if (rc == DI_OK && tokdir) {
        static const char *const files[] = {"tokenizer.json", "tokenizer_config.json"};
        for (int i = 0; i < 2 && rc == DI_OK; i++) {
            char *src = di_path_join(tokdir, files[i]), *dst = di_path_join(o->out_dir, files[i]);
            struct stat sb;
            if (stat(src, &sb) == 0) rc = copy_file(src, dst, err);
            free(src);
            free(dst);
        }
        st->tokenizer_copied = rc == DI_OK;
    }
    if (o->tokenizer_in_place) st->tokenizer_copied = 1;
    st->n_tensors = n;
    st->engram_classes = classes;
    st->seconds = di_now() - t0;
    free(inv);
    if (have_cfg) di_config_free(&cfg);
    free(hf);
    free(inf);
    free(token_map);
    free(infdir);
    free(tokdir);
    return rc;
}
