/* Byte-level BPE tokenizer for the DeepSeek V4 / V4.1 vocabulary (HF `tokenizer.json`).
 *
 * Encoding reproduces HF `tokenizers` exactly (tests/test_tokenizer.c checks ids on a generated corpus):
 *   1. special != 0: added tokens (all 1,283, special or not) are cut out of the text as whole strings,
 *      leftmost-longest, before anything else — what HF's AddedVocabulary does: first the tokens marked
 *      normalized=false, then the normalized=true ones in the remaining gaps.
 *      special == 0: no added-token matching at all; the text is plain BPE, which is how deepseek-recipe
 *      encodes message content (a user typing "<｜User｜>" gets ordinary tokens).
 *   2. the pre-tokenizer's Split(Isolated) regexes run in sequence, each on the pieces of the previous one;
 *   3. each final piece is merged by BPE rank over its raw bytes (the GPT-2 byte<->unicode map is only used
 *      to read the vocabulary; internally every token is its raw byte string).
 *
 * Input must be valid UTF-8: di_tok_encode rejects anything else with DI_ERR_INVALID and the byte offset of
 * the first bad sequence (HF's Python API only accepts `str`, so there is no reference behaviour to match).
 *
 * Decoding follows HF's ByteLevel decoder with skip_special_tokens=False: each token's bytes are concatenated
 * and invalid UTF-8 (an id sequence that splits a character) becomes U+FFFD per maximal invalid subpart, the
 * same replacement as Rust's String::from_utf8_lossy. A di_tokenizer may be shared by threads: after load
 * only its word cache changes, under its own locks. */
#ifndef DI_TEXT_TOKENIZER_H
#define DI_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "deepinfer.h"

/* The tokenizer the CLI uses when none is given: the official DeepSeek-V4 file shipped in the repository
 * (data/tokenizer/deepseek-v4/README.md says why it is V4 and not V4.1). Relative to the working directory. */
#define DI_TOKENIZER_DEFAULT_PATH "data/tokenizer/deepseek-v4/tokenizer.json"

typedef struct di_tokenizer di_tokenizer;

/* path: tokenizer.json, or a directory containing it. */
int di_tok_load(const char *path, di_tokenizer **out, di_error *err);
void di_tok_free(di_tokenizer *tok);
/* Ids are 0..vocab_size-1 (129,280 for V4/V4.1). */
int32_t di_tok_vocab_size(const di_tokenizer *tok);

/* special != 0: added/special token literals in text become their ids (template pieces);
 * special == 0: everything is plain BPE (message content). *ids is malloc'd (NULL when *n_ids == 0). */
int di_tok_encode(const di_tokenizer *tok, const char *text, size_t len, int special, int32_t **ids,
                  size_t *n_ids, di_error *err);
/* *text is malloc'd, NUL-terminated, valid UTF-8; *len excludes the NUL. Ids out of range are an error. */
int di_tok_decode(const di_tokenizer *tok, const int32_t *ids, size_t n, char **text, size_t *len,
                  di_error *err);
/* Raw bytes of one token (not NUL-terminated; may be a partial UTF-8 character), or NULL for an id out of
 * range or without a token. For an added token this is its literal text. */
const char *di_tok_token_bytes(const di_tokenizer *tok, int32_t id, size_t *len);
/* Id of an added token given its literal, e.g. "<｜User｜>", or -1. */
int32_t di_tok_find(const di_tokenizer *tok, const char *literal);
/* 1 for added tokens flagged special in tokenizer.json, else 0. */
int di_tok_is_special(const di_tokenizer *tok, int32_t id);
/* 1 for any added token (special or not), else 0. */
int di_tok_is_added(const di_tokenizer *tok, int32_t id);
/* Id of the token whose raw bytes are exactly bytes[0..len) (BPE vocabulary or added token), or -1. */
int32_t di_tok_lookup_bytes(const di_tokenizer *tok, const char *bytes, size_t len);
/* The byte-level (GPT-2 map) spelling of a token, as in tokenizer.json's vocab / HF convert_ids_to_tokens;
 * for an added token its content. NULL if there is no such token. */
const char *di_tok_token_string(const di_tokenizer *tok, int32_t id, size_t *len);

/* s[0..n) as valid UTF-8: every maximal invalid subpart (an unfinished character at the end included)
 * becomes U+FFFD, as HF's decode does. Malloc'd, NUL-terminated (embedded NULs kept: use *out_len);
 * NULL on allocation failure. For byte streams assembled from token bytes (e.g. an engine's text). */
char *di_utf8_lossy_dup(const char *s, size_t n, size_t *out_len);

/* Streaming decoder: feed ids, get complete UTF-8 text out. Bytes of a character split across tokens are held
 * back until the character completes; bytes that can never form valid UTF-8 are emitted as U+FFFD (so the
 * concatenated output of push... + flush equals di_tok_decode of all ids). */
typedef struct di_detok di_detok;
di_detok *di_detok_new(const di_tokenizer *tok);
/* *text is malloc'd and NUL-terminated; it may be empty (*len == 0). */
int di_detok_push(di_detok *d, int32_t id, char **text, size_t *len, di_error *err);
/* Emits whatever is held back (an incomplete character becomes U+FFFD) and resets the decoder. */
int di_detok_flush(di_detok *d, char **text, size_t *len);
void di_detok_free(di_detok *d);

#endif
