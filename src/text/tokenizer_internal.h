/* Private layout of di_tokenizer, shared by tokenizer.c (load, encode, decode), bpe.c (merges),
 * pretok.c (regex splitting) and tokenizer_utf8.c. Nothing outside src/text/tokenizer*.c, bpe.c and
 * pretok.c includes this. */
#ifndef DI_TEXT_TOKENIZER_INTERNAL_H
#define DI_TEXT_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

#define DI_TOK_NO_TOKEN UINT32_MAX /* tok_len value for an id that names no token */
#define DI_PRETOK_MAX_STAGES 8
#define DI_TOK_MAX_VOCAB (1 << 24) /* ids beyond this mean a corrupt file, not a real vocabulary */

/* DI_TOKF_NORMALIZED: the added token's "normalized" flag. HF matches normalized=false tokens on the raw
 * text first and normalized=true ones afterwards in the gaps (there is no normalizer, but the two passes
 * still decide overlaps). */
enum { DI_TOKF_ADDED = 1, DI_TOKF_SPECIAL = 2, DI_TOKF_NORMALIZED = 4 };

/* Growable byte / id buffers used on the encode and decode paths. */
typedef struct di_strbuf {
    char *p;
    size_t n, cap;
} di_strbuf;
typedef struct di_idvec {
    int32_t *p;
    size_t n, cap;
} di_idvec;
bool di_strbuf_put(di_strbuf *b, const void *src, size_t n);
bool di_idvec_push(di_idvec *v, int32_t id);

/* Open-addressing map from a token's byte string to its id. The key bytes live in the tokenizer's blobs;
 * the table stores ids only, so a lookup compares against the id's string. */
typedef struct di_strmap {
    int32_t *slot; /* [cap] id or -1; cap a power of two, load <= 1/2 */
    uint32_t cap;
} di_strmap;

/* (left id, right id) -> (merge rank, merged id), open addressing. */
typedef struct di_merge_slot {
    uint64_t key; /* (uint64)left << 32 | right; UINT64_MAX = empty */
    int32_t rank;
    int32_t merged;
} di_merge_slot;

/* Byte trie of the added-token literals for leftmost-longest matching. */
typedef struct di_trie_node {
    int32_t child;   /* first child node index, -1 none */
    int32_t sibling; /* next sibling, -1 none */
    int32_t id;      /* token ending here, -1 none */
    uint8_t byte;
} di_trie_node;

/* Word cache: pre-tokenized pieces -> their BPE ids, like HF's BPE cache. Text repeats words heavily, and
 * a hit replaces the whole merge loop by one hash probe. Direct-mapped; a colliding insert overwrites. The
 * tokenizer is shared between threads, so slots are guarded by striped mutexes. */
#define DI_BPE_CACHE_SLOTS 16384 /* power of two */
#define DI_BPE_CACHE_KEY 24      /* longest piece cached, bytes */
#define DI_BPE_CACHE_IDS 8       /* most tokens a cached piece may have */
#define DI_BPE_CACHE_LOCKS 64
typedef struct di_bpe_cache_slot {
    uint8_t key_len; /* 0 = empty */
    uint8_t n_ids;
    char key[DI_BPE_CACHE_KEY];
    int32_t ids[DI_BPE_CACHE_IDS];
} di_bpe_cache_slot;
typedef struct di_bpe_cache {
    pthread_mutex_t lock[DI_BPE_CACHE_LOCKS];
    di_bpe_cache_slot slot[DI_BPE_CACHE_SLOTS];
} di_bpe_cache;

/* The pre-tokenizer: Split(Isolated) regexes applied in sequence. */
typedef struct di_pretok {
    int n_stages;
    pcre2_code *re[DI_PRETOK_MAX_STAGES];
    bool jit[DI_PRETOK_MAX_STAGES]; /* JIT-compiled: match through pcre2_jit_match */
} di_pretok;

struct di_tokenizer {
    int32_t n_vocab;   /* ids 0..n_vocab-1 */
    char *bytes;       /* [bytes_len] raw bytes of every token, concatenated */
    uint32_t *tok_off; /* [n_vocab] offset into bytes */
    uint32_t *tok_len; /* [n_vocab] byte length, DI_TOK_NO_TOKEN for a hole */
    char *spell;       /* [spell_len] byte-level spelling (vocab key or added content) of every token */
    uint32_t *spell_off, *spell_len; /* [n_vocab] */
    uint8_t *flags;    /* [n_vocab] DI_TOKF_* */
    int32_t byte_id[256]; /* id of the single-byte token for each byte (BPE start symbols) */

    di_strmap by_spell; /* BPE vocab spelling -> id (merge resolution) */
    di_strmap by_bytes; /* raw bytes -> id (vocab, then added tokens not already present) */

    di_merge_slot *merges; /* [merge_cap] */
    uint32_t merge_cap;    /* power of two */
    int32_t n_merges;
    di_bpe_cache *cache; /* NULL: no caching */

    di_trie_node *trie; /* [n_trie]; node 0 is the root */
    int32_t n_trie;
    bool trie_first[256]; /* bytes that start some added token: skip the trie walk elsewhere */

    di_pretok pretok;
    char path[512]; /* tokenizer.json, for messages */
};

/* ---- bpe.c ---- */
/* GPT-2 byte <-> unicode map: codepoint used to spell each byte in tokenizer.json. */
uint32_t di_bytelevel_cp(uint8_t b);
/* Byte spelled by codepoint cp, or -1 if cp is not in the map. */
int di_bytelevel_byte(uint32_t cp);
int di_bpe_cache_new(di_tokenizer *t);
void di_bpe_cache_free(di_tokenizer *t);
void di_merges_put(di_tokenizer *t, int32_t left, int32_t right, int32_t rank, int32_t merged);
/* Scratch space for one encode call (not shared between threads). */
typedef struct di_bpe_scratch {
    int32_t *sym;  /* [cap] token id of each live symbol */
    int32_t *prev, *next; /* [cap] linked list over symbol positions, -1 at the ends */
    uint64_t *heap; /* [heap_cap] (rank << 32 | pos) min-heap of candidate merges */
    size_t cap, heap_cap;
} di_bpe_scratch;
void di_bpe_scratch_free(di_bpe_scratch *s);
/* Appends the BPE tokens of one pre-tokenized piece (raw bytes). Returns false on allocation failure. */
bool di_bpe_encode_piece(const di_tokenizer *t, const uint8_t *s, size_t n, di_bpe_scratch *sc,
                         di_idvec *out);

/* ---- pretok.c ---- */
int di_pretok_compile(di_pretok *p, const char *const *patterns, int n, const char *path, di_error *err);
void di_pretok_free(di_pretok *p);
typedef bool (*di_pretok_emit_fn)(void *ctx, const char *s, size_t n);
/* Splits s[0..n) through every stage and calls emit on each final piece, in order. md must come from
 * pcre2_match_data_create(1, NULL). Returns DI_OK, or an error if a regex fails or emit returns false. */
int di_pretok_split(const di_pretok *p, pcre2_match_data *md, const char *s, size_t n, di_pretok_emit_fn emit,
                    void *ctx, di_error *err);

/* ---- tokenizer_utf8.c ---- */
/* Offset of the first invalid UTF-8 sequence in s[0..n), or n if s is valid. */
size_t di_utf8_first_invalid(const uint8_t *s, size_t n);
/* Appends s to out, replacing every maximal invalid subpart by U+FFFD (Rust from_utf8_lossy). With
 * final == false a trailing incomplete-but-valid prefix is not consumed; returns bytes consumed. Returns
 * (size_t)-1 on allocation failure. */
size_t di_utf8_lossy(const uint8_t *s, size_t n, bool final, di_strbuf *out);

#endif
