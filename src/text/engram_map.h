/* Engram compressed token ids (model.md §4.3 step 1).
 *
 * token_map[id] collapses tokens whose decoded text normalizes alike (" The", "the", "THE" share an id), so
 * the Engram n-gram hashes see one id per normalized spelling. Built exactly as the V4.1 reference's
 * build_compressed_token_map: decode each id alone (HF ByteLevel decoding, lossy UTF-8); a text containing
 * U+FFFD (a partial-character byte token) is keyed by its byte-level spelling, any other text by
 *   NFKC -> NFD -> drop marks (General_Category M) -> lowercase -> "[ \t\r\n]+" -> " " ->
 *   a lone " " survives -> strip White_Space at both ends
 * (or by the text itself when that leaves nothing). Compressed ids number the distinct keys in order of
 * first appearance by token id. The official V4.1 tokenizer gives 99,092 classes (the reference asserts it:
 * every Engram hash multiplier is derived from that count). */
#ifndef DI_TEXT_ENGRAM_MAP_H
#define DI_TEXT_ENGRAM_MAP_H

#include <stdint.h>

#include "deepinfer.h"
#include "text/tokenizer.h"

/* Compressed vocab size the released V4.1 config expects (engram_compressed_vocab_size). */
#define DI_ENGRAM_V41_CLASSES 99092

/* *token_map: malloc'd int32 [di_tok_vocab_size(tok)]; *n_classes: number of distinct keys. */
int di_engram_map_build(const di_tokenizer *tok, int32_t **token_map, int32_t *n_classes, di_error *err);

/* The normalized key of one decoded token text (the chain above, without the U+FFFD rule or the
 * empty-result fallback). *out is malloc'd, NUL-terminated. Exposed for tests. */
int di_engram_normalize(const char *text, size_t len, char **out, size_t *out_len, di_error *err);

/* Hash parameters stored next to the table (golden README: engram_token_map.safetensors). */
typedef struct di_engram_hash_params {
    int32_t n_layers;            /* Engram layers (2 in V4.1: layers 1 and 14) */
    int32_t max_ngram;           /* 4 */
    int32_t n_heads;             /* 8 */
    const int64_t *primes;       /* [n_layers, max_ngram-1, n_heads] I64 bucket moduli */
    const int64_t *offsets;      /* [n_layers, (max_ngram-1)*n_heads] I64 exclusive prefix sums of primes */
    const int64_t *multipliers;  /* [n_layers, max_ngram] I64 odd hash multipliers */
    int64_t pad_compressed_id;   /* token_map[engram_pad_id] */
} di_engram_hash_params;

/* Writes engram_token_map.safetensors: token_map I32 [vocab], primes, offsets, multipliers (I64, shapes
 * above) and pad_compressed_id I64 [1]. */
int di_engram_map_write(const char *path, const int32_t *token_map, int32_t vocab, const di_engram_hash_params *p,
                        di_error *err);

#endif
