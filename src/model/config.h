/* DeepSeek-V4.1-Flash model configuration (spec model.md §1.2) and the per-layer roles derived
 * from it (§1.2 "Derived V4.1 layer roles", §4.4, §4.6, §4.9).
 *
 * Sources, in order of authority:
 *   1. config.json (Hugging Face style; model_type "deepseek_v41" with a nested "text_config", or a
 *      flat "deepseek_v41_text" document). Field names below are its text_config keys.
 *   2. inference/config.json (the reference's ModelArgs names: dim, n_layers, ...). Only fills keys
 *      config.json lacks; a 0 in dspark_n_routed_experts / dspark_n_activated_experts means "same as
 *      the backbone" (ModelArgs.get_moe_config).
 *   3. The reference's ModelArgs defaults for the few keys neither file must carry (gate_temp,
 *      weight_block_size, hc_*).
 *
 * Layer indexing: "stages" 0..n_layers-1 are the backbone blocks (`layers.L.*`); stages
 * n_layers..n_layers+n_dspark-1 are the DSpark draft stages (`mtp.S.*`, S = stage − n_layers).
 * compress_ratios has one entry per stage including the draft stages (n_layers + n_mtp entries).
 *
 * Limits (fixed-size arrays, checked at parse time with a clear error): at most DI_MAX_STAGES
 * stages in total, DI_MAX_ENGRAM_LAYERS Engram layers, DI_MAX_DSPARK_TARGETS DSpark target layers. */
#ifndef DI_MODEL_CONFIG_H
#define DI_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "deepinfer.h"

#define DI_MAX_STAGES 256        /* n_layers + n_mtp (released: 40 + 3) */
#define DI_MAX_ENGRAM_LAYERS 16  /* released: 2 (layers 1 and 14) */
#define DI_MAX_DSPARK_TARGETS 16 /* released: 3 (layers 37, 38, 39) */
#define DI_MAX_NGRAM 8           /* engram_max_ngram_size (released: 4) */
#define DI_MAX_COMPRESS_RATIO 128 /* compress_ratios entries (V4.1: 0, 1, 2); the CPU compressor's
                                    MAX_RATIO, the largest of the V4 family (HCA) */
#define DI_MAX_ACTIVE_EXPERTS 64 /* num_experts_per_tok (released: 6); = DI_ROUTER_MAX_TOPK of the
                                    CPU router, checked by tests/test_cpu_ops.c */
#define DI_CFG_STR 64            /* short string fields */

/* What a stage does with attention state (spec §1.2 role table). */
typedef enum di_layer_role {
    DI_ROLE_SWA = 0,          /* ratio 0 backbone block: sliding window only */
    DI_ROLE_SOURCE,           /* kv + index source: own compressor, indexer and index keys (wk) */
    DI_ROLE_CANDIDATE_SOURCE, /* a source that also publishes the candidate-block mask */
    DI_ROLE_REINDEX,          /* index source without KV: own wq_b/weights_proj over the keys of its
                                 kv source, scores masked by the candidate source's blocks */
    DI_ROLE_REUSE,            /* ratio > 0: reads the latest kv source's compressed KV and the
                                 latest index source's top-k list unchanged */
    DI_ROLE_DSPARK,           /* DSpark draft stage (mtp.S): ratio 0, DSparkAttention */
    DI_ROLE_COUNT
} di_layer_role;

const char *di_layer_role_name(di_layer_role r); /* "swa", "source", "candidate-source", ... */

/* Which RoPE table a stage uses (reference Attention.__init__): ratio-0 stages use rope_theta
 * without YaRN; compressed stages use compress_rope_theta with YaRN when original_max_position_
 * embeddings > 0. */
typedef enum di_rope_kind { DI_ROPE_PLAIN = 0, DI_ROPE_COMPRESS = 1 } di_rope_kind;

typedef enum di_weight_fmt {
    DI_WFMT_FP8 = 0, /* F8_E4M3 weight + F8_E8M0 block scales (weight_block_size²) */
    DI_WFMT_FP4,     /* I8 packed E2M1 [out, in/2] + F8_E8M0 scales [out, in/32] */
    DI_WFMT_BF16     /* plain BF16, no scale */
} di_weight_fmt;

typedef struct di_layer_cfg {
    int compress_ratio;     /* 0 (window only), 1 or 2 in V4.1; >0 means it attends compressed KV */
    di_layer_role role;
    bool is_dspark;         /* a draft stage (mtp.S) */
    int dspark_stage;       /* S for draft stages, −1 otherwise */
    bool is_kv_source;      /* runs its own compressor and writes the shared compressed-KV cache */
    bool is_index_source;   /* runs its own indexer (top-k over compressed entries) */
    bool is_candidate_source; /* its indexer also selects candidate blocks for later index sources */
    int kv_source;          /* stage whose compressed KV this stage attends (itself for a kv source);
                               −1 when compress_ratio == 0 */
    int index_source;       /* stage whose top-k list this stage uses (itself for index sources); −1 */
    int index_key_source;   /* for index sources: stage whose index-key cache the indexer scores
                               (itself when it owns wk, else the latest kv source); −1 otherwise */
    int candidate_source;   /* for index sources after the candidate source: that stage; −1 */
    bool has_compressor;    /* attn.compressor.{wkv,norm} */
    bool has_compressor_gate; /* attn.compressor.wgate (ratio > 1 only) */
    bool has_indexer;       /* attn.indexer.{wq_b,weights_proj} */
    bool has_index_wk;      /* attn.indexer.{wk,k_norm} (kv sources that are index sources) */
    int engram_index;       /* position in engram_layer_ids, or −1 (Engram applies before the block) */
    di_rope_kind rope;
    double rope_base;       /* rope_theta or compress_rope_theta */
    bool rope_yarn;         /* YaRN scaling applied to this stage's table */
    bool dspark_target;     /* its input (after Engram, mean of the hc streams) feeds DSpark */
    int n_experts;          /* routed experts (dspark_n_routed_experts for draft stages) */
    int n_active_experts;   /* top-k (dspark_num_experts_per_tok for draft stages) */
    bool has_main_proj;     /* DSpark stage 0: main_proj + main_norm */
    bool has_draft_head;    /* last DSpark stage: norm, markov_head, confidence_head */
} di_layer_cfg;

typedef struct di_vision_cfg {     /* HF vision_config (inference: vision_*) */
    int num_hidden_layers;         /* 32; 0 = no vision tower */
    int hidden_size;               /* 1024 */
    int num_attention_heads;       /* 16 */
    int intermediate_size;         /* 2816 (mlp.w1 is [2·2816, 1024]: gate ‖ up) */
    int patch_size;                /* 14 */
    double rope_theta;             /* 10000 */
    int downsample_ratio;          /* 3 (aligner.w1 in = 1024·3²) */
    int max_image_tokens;          /* 1024 */
    int64_t min_pixels;            /* 295936 */
    double max_wh_ratio;           /* 0 when null */
} di_vision_cfg;

typedef struct di_config {
    char model_type[DI_CFG_STR];   /* root model_type: "deepseek_v41" (or "deepseek_v41_text") */

    /* ---- text_config (HF names; inference/config.json name in brackets) ---- */
    int hidden_size;               /* D = 5120 [dim] */
    int num_hidden_layers;         /* 40 [n_layers] */
    int num_nextn_predict_layers;  /* 3 draft stages [n_mtp_layers] */
    int num_attention_heads;       /* H = 64 [n_heads] */
    int num_key_value_heads;       /* 1: one shared latent KV head (MQA) */
    int head_dim;                  /* 512 (q, k and v) */
    int qk_rope_head_dim;          /* 64: the LAST 64 channels of each head [rope_head_dim] */
    int q_lora_rank;               /* 1280 */
    int o_lora_rank;               /* 1024 */
    int o_groups;                  /* 8 */
    int sliding_window;            /* 128 [window_size] */
    int compress_ratios[DI_MAX_STAGES]; /* n_layers + n_mtp entries */
    int n_compress_ratios;
    int kv_source_layer_ids[DI_MAX_STAGES];    /* [2,8,14,20] [kv_source_layers] */
    int n_kv_source_layer_ids;
    int index_source_layer_ids[DI_MAX_STAGES]; /* [2,8,14,20,24,28,32,36] [index_source_layers] */
    int n_index_source_layer_ids;
    int candidate_source_layer_id; /* 20; −1 = no candidate pre-filter [candidate_source_layer] */
    int candidate_topk_blocks;     /* 2048 */
    int candidate_block_size;      /* 8 */
    int index_n_heads;             /* 32 */
    int index_head_dim;            /* 128 */
    int index_topk;                /* 512 */
    double rope_theta;             /* 10000 (window-only stages) */
    double compress_rope_theta;    /* 160000 (compressed stages) */
    char rope_scaling_type[DI_CFG_STR]; /* "yarn" or "" (none) */
    double rope_factor;            /* rope_scaling.factor = 16 [rope_factor] */
    int rope_beta_fast;            /* rope_scaling.beta_fast = 32 [beta_fast] */
    int rope_beta_slow;            /* rope_scaling.beta_slow = 1 [beta_slow] */
    int64_t rope_original_max_position_embeddings; /* 65536; 0 = no YaRN [original_seq_len] */
    int64_t max_position_embeddings; /* 1048576 (inference: runtime max_seq_len, not a model key) */
    int vocab_size;                /* 129280 */
    int n_routed_experts;          /* 384 */
    int num_experts_per_tok;       /* 6 [n_activated_experts] */
    int n_shared_experts;          /* 1 (the reference asserts exactly one) */
    int moe_intermediate_size;     /* 2304 [moe_inter_dim] */
    char scoring_func[DI_CFG_STR]; /* "sqrtsoftplus" | "softmax" | "sigmoid" [score_func] */
    char topk_method[DI_CFG_STR];  /* "noaux_tc" (HF only; informational) */
    bool norm_topk_prob;           /* true */
    double routed_scaling_factor;  /* 1.5 [route_scale] */
    double gate_temp;              /* 1.0 (inference only; router logits are divided by it) */
    double swiglu_limit;           /* 10.0; 0 = no clamp */
    int hc_mult;                   /* 4 residual streams */
    int hc_sinkhorn_iters;         /* 20 */
    double hc_eps;                 /* 1e-6 */
    double rms_norm_eps;           /* 1e-20 (!) [norm_eps] */
    int engram_layer_ids[DI_MAX_ENGRAM_LAYERS];         /* [1,14] */
    int n_engram_layers;
    int64_t engram_num_embeddings[DI_MAX_ENGRAM_LAYERS]; /* table rows per Engram layer */
    int engram_max_ngram_size;     /* 4: n-gram orders 2..4 */
    int64_t engram_vocab_size;     /* 16000000: each (order, head) prime search starts above it */
    int engram_n_heads;            /* 8 */
    int engram_head_dim;           /* 256 */
    int engram_pad_token_id;       /* 2 [engram_pad_id] */
    int64_t engram_compressed_vocab_size; /* 99092 */
    int dspark_block_size;         /* 5; 0 = no draft stages are built */
    int dspark_noise_token_id;     /* 128799 */
    int dspark_target_layer_ids[DI_MAX_DSPARK_TARGETS]; /* [37,38,39] */
    int n_dspark_target_layer_ids;
    int dspark_markov_rank;        /* 256 */
    int dspark_n_routed_experts;   /* 128 (resolved: never 0 here) */
    int dspark_num_experts_per_tok; /* 3 [dspark_n_activated_experts] (resolved) */
    int bos_token_id, eos_token_id, pad_token_id; /* 0, 1, 2 */
    int image_token_id;            /* 129264 */

    /* ---- quantization_config (root) [dtype, expert_dtype] ---- */
    di_weight_fmt weight_fmt;      /* FP8 ("fp8") or BF16 (no quantization_config) */
    di_weight_fmt expert_fmt;      /* FP4 ("fp4"), else the same as weight_fmt */
    int weight_block_size;         /* 32: FP8 scale blocks are 32×32; activations per 32 */

    /* ---- vision_config (root; present only for the VL checkpoint) ---- */
    bool has_vision;
    di_vision_cfg vision;

    /* ---- derived ---- */
    int n_layers;                  /* = num_hidden_layers */
    int n_dspark;                  /* draft stages built: num_nextn_predict_layers if dspark_block_size > 0 */
    int n_stages;                  /* n_layers + n_dspark */
    di_layer_cfg layer[DI_MAX_STAGES];
} di_config;

/* Parse and validate. hf_json: config.json text (required); inf_json: inference/config.json text or
 * NULL. `where` prefixes messages (e.g. the model directory). Rejects unknown model_type, missing
 * required keys, wrong JSON types, out-of-range values and inconsistent layer-role lists, naming the
 * key and the expected vs found value. */
int di_config_parse(const char *hf_json, size_t hf_len, const char *inf_json, size_t inf_len, const char *where,
                    di_config *cfg, di_error *err);

/* Reads model_dir/config.json (required) and model_dir/inference/config.json (optional). The path of a
 * config file itself is accepted too (then inference/config.json is looked up next to it). */
int di_config_load(const char *model_dir, di_config *cfg, di_error *err);

/* di_config holds no heap memory today; call it anyway so that may change. */
void di_config_free(di_config *cfg);

/* Checkpoint name prefix of a stage: "layers.7." for backbone blocks, "mtp.0." for DSpark stages. */
void di_stage_prefix(const di_config *cfg, int stage, char *buf, size_t n);

/* ---- per-sequence cache footprint in the compact exact form (spec §4.7, §7.2) ----
 * fixed_bytes: independent of sequence length (window ring of sliding_window slots, each head_dim
 * e4m3 codes + head_dim/32 E8M0 scales; compressor carry state R·2·head_dim f32 for ratio > 1).
 * per_token_bytes: grows with the sequence (kv sources only: one compressed entry of head_dim/2 FP4
 * bytes + head_dim/16 E4M3 scales and one index key of index_head_dim/2 + index_head_dim/32 bytes per
 * compress_ratio tokens), as a double because it is fractional for ratio 2. */
typedef struct di_cache_footprint {
    int64_t window_bytes;        /* fixed */
    int64_t compressor_state_bytes; /* fixed */
    int64_t compressed_entry_bytes; /* one compressed-KV entry (0 if none) */
    int64_t index_key_bytes;     /* one index-key entry (0 if none) */
    double per_token_bytes;      /* (compressed_entry + index_key) / ratio */
} di_cache_footprint;
void di_cache_footprint_of(const di_config *cfg, int stage, di_cache_footprint *out);

#endif
