/* Structured outputs: the mask API the engine's sampler calls.
 *
 * Lifecycle:
 *   di_grammar        compiled once per request type (regex / EBNF / JSON Schema); immutable,
 *                     shared by any number of requests and threads.
 *   di_grammar_vocab  the tokenizer's token byte strings as a trie; built once per model; immutable.
 *   di_grammar_matcher one per request: the parse state after the tokens accepted so far, with a
 *                     history so the last k tokens can be rolled back (speculative decoding).
 *
 * Per decode step the sampler calls di_grammar_matcher_fill_mask (allowed tokens as a bitmask of
 * ceil(V/32) uint32 words, bit t%32 of word t/32 = token t), applies it to the logits, samples,
 * and calls di_grammar_matcher_accept_token. A matcher touches no global mutable state, so the
 * mask for step n+1 can be computed on a worker thread while the model computes step n.
 *
 * Thinking: with opts.thinking the matcher leaves tokens unconstrained until the bytes of the
 * think-end marker (default "</think>") have been emitted; the grammar applies from the next byte
 * (a token that carries the marker and text after it must have grammar-valid text after it).
 * Stop strings: once the constrained output contains a stop string the request is finished and
 * only EOS is allowed. EOS is allowed exactly when the output so far is a complete sentence. */
#ifndef DI_GRAMMAR_GRAMMAR_H
#define DI_GRAMMAR_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

typedef struct di_grammar di_grammar;
typedef struct di_grammar_vocab di_grammar_vocab;
typedef struct di_grammar_matcher di_grammar_matcher;

/* ---- compile ---- */

/* Regular expression (syntax: src/grammar/regex.h). The whole output must match (implicitly
 * anchored at both ends). */
int di_grammar_from_regex(const char *re, size_t len, di_grammar **out, di_error *err);

/* EBNF in llama.cpp's GBNF dialect (src/grammar/ebnf.h). root: start rule name (NULL = "root"). */
int di_grammar_from_ebnf(const char *src, size_t len, const char *root, di_grammar **out, di_error *err);

/* JSON Schema (src/grammar/json_schema.h) as a JSON text. opts may be NULL for the defaults. */
typedef enum di_json_ws {
    DI_JSON_WS_FLEXIBLE = 0, /* optional whitespace ([ \t\n\r], bounded run) around structural tokens */
    DI_JSON_WS_COMPACT = 1   /* no whitespace at all: {"a":1,"b":[1,2]} */
} di_json_ws;
typedef struct di_json_schema_opts {
    di_json_ws whitespace;
    int max_ws_run;     /* longest whitespace run allowed in FLEXIBLE mode (0 = default 16) */
    bool lenient_oneof; /* compile oneOf as anyOf even when a value could match two branches */
} di_json_schema_opts;
int di_grammar_from_json_schema(const char *json, size_t len, const di_json_schema_opts *opts, di_grammar **out,
                                di_error *err);

void di_grammar_free(di_grammar *g);

/* ---- vocabulary ---- */

/* bytes[t]/lens[t]: the raw bytes token t decodes to. special[t] != 0 (may be NULL) marks control
 * tokens that never appear in constrained text; eos lists the ids allowed when the grammar is
 * complete. The arrays are copied. */
int di_grammar_vocab_new(uint32_t n_vocab, const uint8_t *const *bytes, const uint32_t *lens, const uint8_t *special,
                         const int32_t *eos, size_t n_eos, di_grammar_vocab **out, di_error *err);
void di_grammar_vocab_free(di_grammar_vocab *v);
uint32_t di_grammar_vocab_size(const di_grammar_vocab *v);
static inline size_t di_grammar_mask_words(uint32_t n_vocab) { return (n_vocab + 31) / 32; }

/* ---- per request ---- */

#define DI_GRAMMAR_MAX_STOP 16
#define DI_GRAMMAR_MAX_STOP_LEN 64

typedef struct di_grammar_matcher_opts {
    bool thinking;            /* constrain only after think_end */
    const char *think_end;    /* NULL = "</think>" */
    const char *const *stop;  /* stop strings (each 1..DI_GRAMMAR_MAX_STOP_LEN bytes) */
    size_t n_stop;
} di_grammar_matcher_opts;

/* g and v must outlive the matcher. opts may be NULL. */
int di_grammar_matcher_new(const di_grammar *g, const di_grammar_vocab *v, const di_grammar_matcher_opts *opts,
                           di_grammar_matcher **out, di_error *err);
void di_grammar_matcher_free(di_grammar_matcher *m);

/* mask: [di_grammar_mask_words(V)] uint32, fully overwritten. */
int di_grammar_matcher_fill_mask(di_grammar_matcher *m, uint32_t *mask, di_error *err);

/* logits[t] = -inf for every token whose mask bit is clear. logits: [n_vocab] fp32. */
void di_grammar_mask_apply(const uint32_t *mask, float *logits, uint32_t n_vocab);

/* Advance by one sampled token. A token the mask forbids returns DI_ERR_INVALID and leaves the
 * state unchanged. EOS is accepted when the output is complete and finishes the request. */
int di_grammar_matcher_accept_token(di_grammar_matcher *m, int32_t token, di_error *err);

/* Undo the last k accepted tokens (k <= number accepted since creation). */
int di_grammar_matcher_rollback(di_grammar_matcher *m, size_t k, di_error *err);

bool di_grammar_matcher_can_end(const di_grammar_matcher *m);   /* EOS allowed now */
bool di_grammar_matcher_finished(const di_grammar_matcher *m);  /* EOS accepted or a stop string hit */
size_t di_grammar_matcher_n_accepted(const di_grammar_matcher *m);

/* Mask cache counters of this matcher (masks served from the grammar's shared cache vs computed by a
 * trie walk). */
void di_grammar_matcher_cache_stats(const di_grammar_matcher *m, uint64_t *hits, uint64_t *misses);

/* How this matcher's masks were made, for tests and benchmarks. */
typedef struct di_grammar_walk_stats {
    uint64_t cached;      /* served from the grammar's mask cache */
    uint64_t walks;       /* computed by a trie walk */
    uint64_t block_masks; /* of those, computed from a character-loop state by token classes */
    uint64_t block_hits;  /* of those, from a block cached by an earlier walk (another context) */
    uint64_t blocks;      /* token subtrees accepted whole during trie walks */
    uint64_t ctx_edges;   /* context-free walk edges that completed into the context */
    uint64_t edges;       /* trie edges and block-mask token bytes stepped through (walk_edge) */
    uint64_t pushes;      /* Earley pushes by walks (unknown transitions, replays, summaries) */
    uint64_t replays;     /* of those, re-pushes of a trie path's known transitions (walk_edge needs its sets) */
    uint64_t reuses;      /* replays avoided: a popped set taken back for a byte that acts alike */
    uint64_t summaries;   /* loop summaries computed */
    uint64_t full_sigs;   /* full Earley set signatures computed (walks with a boundary read few) */
    uint64_t shapes_static; /* UTF-8 shapes of loop summaries decided from the grammar's byte rules, not pushed */
    uint64_t union_hits;  /* trie walks whose whole subtrees were ORed in as an earlier walk's union */
    uint64_t union_shifts; /* ... as an earlier walk's union less and plus the subtrees that differ */
    uint64_t walk_hits;   /* trie walks whose context-free part came from an earlier walk of the same root */
    uint64_t kid_skips;   /* trie children of the first two levels not visited: their parent's state does not scan their byte */
} di_grammar_walk_stats;
void di_grammar_matcher_walk_stats(const di_grammar_matcher *m, di_grammar_walk_stats *s);

/* Test helper and slow path: would these raw bytes be accepted as the next text? (no state change) */
bool di_grammar_matcher_try_bytes(di_grammar_matcher *m, const uint8_t *b, size_t n);

#endif
