/* Engram n-gram hash constants (spec model.md §4.3; golden README "engram_token_map.safetensors").
 *
 * Per Engram layer ℓ the hash needs odd int64 multipliers μ_ℓ[0..max_ngram-1], a prime modulus
 * P_ℓ[n][h] and a row offset per (n-gram order n = 2..max_ngram, head h), plus the compressed-token map
 * (tokenizer id → compressed id) and the compressed id of the pad token.
 *
 * Where they come from:
 *  - primes: consecutive primes ≥ engram_vocab_size handed out in order (layer, order, head), never
 *    reused — computed here and checked against engram_num_embeddings (Σ primes = table rows);
 *  - offsets: exclusive prefix sums of a layer's primes in that order;
 *  - multipliers: numpy's seeded generator in the reference (not reproducible in C), so they are read
 *    from `engram_token_map.safetensors` next to the checkpoint when present, else taken from the
 *    published constants of the released V4.1-Flash config; any other Engram config without the
 *    sidecar is refused;
 *  - token_map / pad_compressed_id: from the sidecar; absent for the released config without it (the
 *    map is then built from the tokenizer and attached with di_engram_consts_set_token_map). */
#ifndef DI_MODEL_ENGRAM_CONSTS_H
#define DI_MODEL_ENGRAM_CONSTS_H

#include <stdint.h>

#include "model/config.h"

#define DI_ENGRAM_SIDECAR "engram_token_map.safetensors"

typedef struct di_engram_consts {
    int n_layers;              /* Engram layers (cfg->n_engram_layers); 0 = model without Engram */
    int max_ngram;             /* engram_max_ngram_size: orders 2..max_ngram are hashed */
    int n_heads;               /* engram_n_heads */
    int layer_ids[DI_MAX_ENGRAM_LAYERS]; /* backbone layer of each Engram layer */
    int64_t *multipliers;      /* int64 [n_layers, max_ngram]: odd, μ·(compressed_vocab−1) fits int64 */
    int64_t *primes;           /* int64 [n_layers, max_ngram−1, n_heads] */
    int64_t *offsets;          /* int64 [n_layers, (max_ngram−1)·n_heads]: first row of each bucket */
    int64_t pad_compressed_id; /* token_map[engram_pad_token_id]; −1 while token_map is absent */
    int32_t *token_map;        /* int32 [token_map_len]: compressed id per token id, or NULL */
    int64_t token_map_len;
    const char *source;        /* "engram_token_map.safetensors" or "published V4.1-Flash constants" */
} di_engram_consts;

/* Fills *out for cfg (all-zero, DI_OK, when cfg has no Engram layers). model_dir may be NULL (no
 * sidecar: only the released config's published constants can be used). Every sidecar tensor is
 * checked (dtype, shape, primes and offsets equal to the derived layout, odd bounded multipliers,
 * token ids in range, pad id consistent); errors name the file and tensor. */
int di_engram_consts_load(const di_config *cfg, const char *model_dir, di_engram_consts *out, di_error *err);
void di_engram_consts_free(di_engram_consts *c);

/* The config-derived part only: primes and offsets (checked against engram_num_embeddings), with
 * multipliers zeroed and no token map. For writers of the sidecar (mkmodel), which choose their own
 * odd multipliers in [1, di_engram_multiplier_max(cfg)] for non-released layouts. */
int di_engram_consts_derive(const di_config *cfg, di_engram_consts *out, di_error *err);

/* Smallest prime ≥ n, for n ≤ 2^32 (config validation bounds engram_vocab_size there). The bucket
 * moduli are the consecutive primes ≥ engram_vocab_size; the derivation here and the checkpoint
 * writer (mkmodel) both take them from this one function. */
int64_t di_engram_next_prime(int64_t n);

/* Largest multiplier the reference can draw: 2·⌊⌊INT64_MAX / compressed_vocab⌋ / 2⌋ − 1, so that
 * compressed_id · μ never overflows int64. */
int64_t di_engram_multiplier_max(const di_config *cfg);

/* Attach a compressed-token map built elsewhere (from the tokenizer); copies it, checks every value
 * is below engram_compressed_vocab_size and sets pad_compressed_id. */
int di_engram_consts_set_token_map(di_engram_consts *c, const di_config *cfg, const int32_t *map, int64_t len,
                                   di_error *err);

/* True when cfg's Engram layout is exactly the released V4.1-Flash one (layers 1 and 14, 4-grams,
 * 8 heads, bucket base 16,000,000, compressed vocab 99,092, tables of 384,006,168 / 384,016,682 rows). */
int di_engram_is_released_layout(const di_config *cfg);

/* The published multipliers of the released layout: int64 [2, 4] (spec §4.3). */
extern const int64_t di_engram_released_multipliers[2][4];

static inline int64_t di_engram_prime(const di_engram_consts *c, int l, int order_idx, int head) {
    return c->primes[((int64_t)l * (c->max_ngram - 1) + order_idx) * c->n_heads + head];
}

#endif
