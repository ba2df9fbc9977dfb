/* Internals shared by the grammar files (not part of the engine-facing API in grammar.h). */
#ifndef DI_GRAMMAR_IMPL_H
#define DI_GRAMMAR_IMPL_H

#include "grammar/cfg.h"
#include "grammar/grammar.h"

typedef struct di_grammar_cache di_grammar_cache; /* state_cache.h */

struct di_grammar {
    di_cfg *cfg;            /* finalized; read-only after compile */
    di_grammar_cache *cache; /* state automaton + masks shared by this grammar's matchers; internally
                                synchronized, so it is filled through a const di_grammar */
};

/* Token trie in DFS preorder: the children of node i follow it, and node i's subtree ends at
 * node[i].end, so a dead prefix skips its whole subtree with one jump. Node 0 is the root. */
typedef struct di_trie_node {
    uint32_t end;   /* index one past the last node of this subtree */
    int32_t tok;    /* a token whose bytes end exactly here, or -1 (more in vocab->dup_next) */
    uint16_t depth; /* number of bytes from the root */
    uint8_t byte;   /* edge byte from the parent */
    uint8_t dup;    /* 1 if more tokens share these bytes (vocab->dup_next); keeps the walk off
                       that array, whose random reads dominated the walk before */
} di_trie_node;

struct di_grammar_vocab {
    uint32_t n_vocab;
    uint8_t **bytes;        /* [n_vocab] token bytes (NULL for empty) */
    uint32_t *lens;         /* [n_vocab] */
    uint8_t *special;       /* [n_vocab] 1 = control token, never part of constrained text */
    int32_t *eos;           /* [n_eos] */
    size_t n_eos;
    di_trie_node *nodes;    /* [n_nodes] preorder trie over non-special, non-empty tokens */
    uint32_t n_nodes;
    int32_t *dup_next;      /* [n_vocab] next token with identical bytes, or -1 */
    uint32_t max_len;       /* longest token in bytes */
    uint64_t fingerprint;   /* hash of the token bytes, special flags and EOS ids: masks cached for
                               one vocabulary are reused only by a vocabulary with the same content */
};

/* Front-ends: each builds into g and returns the start symbol's nonterminal in *start. */
int di_regex_to_cfg(di_cfg *g, const char *re, size_t len, int32_t *start, di_error *err);
int di_ebnf_to_cfg(di_cfg *g, const char *src, size_t len, const char *root, int32_t *start, di_error *err);
int di_json_schema_to_cfg(di_cfg *g, const char *json, size_t len, const di_json_schema_opts *opts, int32_t *start,
                          di_error *err);

#endif
