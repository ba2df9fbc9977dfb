/* Internals shared by the grammar files (not part of the engine-facing API in grammar.h). */
#ifndef DI_GRAMMAR_IMPL_H
#define DI_GRAMMAR_IMPL_H

#include <pthread.h>

#include "grammar/cfg.h"
#include "grammar/grammar.h"

typedef struct di_grammar_cache di_grammar_cache; /* state_cache.h */

struct di_grammar {
    di_cfg *cfg;            /* finalized; read-only after compile */
    struct di_sig128 *here; /* [cfg->n_pos] signature term of each position as an item that started in
                               its own set (matcher.c, add_here_sig) */
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
    uint8_t flags;  /* DI_TRIE_* */
    uint32_t ascii; /* ASCII bytes of the subtree (its own byte included) as di_ascii_bucket bits */
} di_trie_node;

#define DI_N_BUCKETS 29 /* di_ascii_bucket values; the classes below follow them in one 32-bit word */
#define DI_BUCKET_BITS ((1u << DI_N_BUCKETS) - 1)
#define DI_CLASS_BAD_UTF8 29
#define DI_CLASS_HIGH 30
#define DI_CLASS_LONG 31 /* more than DI_CHAIN_CHARS characters */
#define DI_N_CLASSES 32
#define DI_CHAIN_CHARS 16

/* The 128 ASCII bytes in 29 buckets, so that a subtree's ASCII bytes fit in the node: the bytes
 * that grammars tell apart (JSON structure, string escapes, number characters, whitespace; '_',
 * '@' and '%', which identifier, e-mail and URL patterns take while their neighbours are not)
 * get their own bucket, the rest are grouped. A bucket counts as allowed only if all its bytes
 * are, so a test on buckets can only be stricter than one on bytes; a block mask walks every
 * token holding a byte of a partly allowed bucket one by one, so finer buckets mean fewer walks
 * (regex_email's local part: 6,440 -> 1,043 bytes walked per mask). */
static inline unsigned di_ascii_bucket(uint8_t b) {
    switch (b) {
    case '\t': return 1;
    case '\n': return 2;
    case '\r': return 3;
    case ' ': return 4;
    case '"': return 5;
    case '\\': return 6;
    case '+': return 7;
    case ',': return 8;
    case '-': return 9;
    case '.': return 10;
    case '0': return 11;
    case ':': return 12;
    case 'E': return 13;
    case '[': return 14;
    case ']': return 15;
    case 'e': return 16;
    case '{': return 17;
    case '}': return 18;
    case '_': return 26;
    case '@': return 27;
    case '%': return 28;
    }
    if (b < 0x20) return 0;
    if (b < 0x30) return 19;              /* ! # $ & ' ( ) * / */
    if (b <= '9') return 20;              /* 1-9 */
    if (b < 'A') return 21;               /* ; < = > ? */
    if (b <= 'Z') return 22;              /* A-Z but E */
    if (b < 'a') return 23;               /* ^ ` */
    if (b <= 'z') return 24;              /* a-z but e */
    return 25;                            /* | ~ DEL */
}

/* DI_TRIE_DUP: more tokens share these bytes (vocab->dup_next); keeps the walk off that array,
 * whose random reads dominated the walk before.
 * DI_TRIE_UTF8: every path of the subtree, read from this node's byte on, is a prefix of valid
 * UTF-8 (starts at a character boundary, continuation bytes only where a lead byte needs them).
 * DI_TRIE_HIGH: some byte of the subtree is >= 0x80. DI_TRIE_LONG: see below.
 * With di_trie_node.ascii these let the walk accept a whole subtree at once from a state that loops on
 * its characters (matcher.c: loop summaries). */
#define DI_TRIE_DUP 1u
#define DI_TRIE_UTF8 2u
#define DI_TRIE_HIGH 4u
#define DI_TRIE_LONG 8u /* some token of the subtree has more than DI_CHAIN_CHARS characters */

#define DI_LCP_MAX 65535u /* class_lcp saturates here */

/* One token of a class list (di_grammar_vocab.class_ent). */
typedef struct di_class_ent {
    int32_t tok;   /* token id */
    uint32_t off;  /* its bytes are blob[off .. off + len) */
    uint32_t len;
    uint32_t bits; /* its class bits (tok_class[tok]) */
} di_class_ent;

struct di_grammar_vocab {
    uint32_t n_vocab;
    uint8_t **bytes;        /* [n_vocab] token bytes (NULL for empty) */
    uint32_t *lens;         /* [n_vocab] */
    uint8_t *special;       /* [n_vocab] 1 = control token, never part of constrained text */
    int32_t *eos;           /* [n_eos] */
    size_t n_eos;
    di_trie_node *nodes;    /* [n_nodes] preorder trie over non-special, non-empty tokens */
    uint32_t n_nodes;
    /* The root's children, one per first byte in ascending order (preorder): child k's subtree is
     * nodes root_kid[k] .. root_kid[k + 1] - 1, its byte root_byte[k]. A walk visits only those
     * whose byte its root state scans (matcher.c: walk_root). */
    uint32_t root_kid[257];
    uint8_t root_byte[256];
    uint32_t n_root_kids;
    /* The children of root child k (the depth-2 nodes, ascending bytes) are kid2[kid2_off[k] ..
     * kid2_off[k + 1]), with their bytes in kid2_byte; NULL without memory (then walks visit
     * every child). */
    uint32_t *kid2_off; /* [n_root_kids + 1] */
    uint32_t *kid2;     /* [number of depth-2 nodes] node indices */
    uint8_t *kid2_byte; /* [number of depth-2 nodes] */
    int32_t *dup_next;      /* [n_vocab] next token with identical bytes, or -1 */
    int32_t *pre_tok;       /* [n_pre] text tokens in trie preorder, duplicates included */
    uint32_t *tok_start;    /* [n_nodes + 1] first pre_tok index of each subtree: the tokens under
                               node i are pre_tok[tok_start[i] .. tok_start[nodes[i].end]) */
    uint32_t n_pre;
    /* Token classes for masks of character-loop states (matcher.c: loop_mask): by_class[k]
     * (words bits) holds the text tokens that contain a byte of ASCII bucket k (k < DI_N_BUCKETS), that are
     * not valid UTF-8 (DI_CLASS_BAD_UTF8), that contain a byte >= 0x80 (DI_CLASS_HIGH) or that
     * hold more than DI_CHAIN_CHARS characters (lead bytes and ASCII; DI_CLASS_LONG);
     * class_ent[class_off[k] .. class_off[k + 1]) lists the same tokens in trie preorder, each
     * with what a block mask reads of it (id, bytes, class bits) in one 16-byte record, so that
     * walking a list reads one array forward and the blob, instead of jumping by token id or
     * through three preorder arrays at ~60-entry strides (thirteenth round). text: all text tokens. */
    uint32_t *by_class;     /* [DI_N_CLASSES * words] */
    uint32_t *text;         /* [words] */
    uint32_t *class_off;    /* [DI_N_CLASSES + 1] */
    di_class_ent *class_ent; /* [class_off[DI_N_CLASSES] + 1] tokens per class, preorder */
    /* class_lcp[x]: bytes the token at class_ent[x] shares with the one at class_ent[x - 1] (0 for
     * the first of a list), at most DI_LCP_MAX (then: at least that many). Tokens with a common
     * prefix are contiguous in trie preorder, so the prefix shared by two tokens of one list is the
     * minimum of class_lcp over the entries after the first up to the second (loop_mask). */
    uint16_t *class_lcp;
    struct di_class_memo *class_memo; /* di_vocab_text_minus's recent results (NULL without memory) */
    uint32_t *tok_class;    /* [n_vocab] class bits of each text token (0 for the others) */
    uint8_t *blob;          /* all token bytes back to back, text tokens in trie preorder */
    uint32_t *pre_off;      /* [n_pre + 1] where the token at preorder position p starts in blob
                               (its bytes end at pre_off[p + 1]) */
    uint32_t *blob_off;     /* [n_vocab] where token t's lens[t] bytes start in blob */
    uint32_t max_len;       /* longest token in bytes */
    uint64_t fingerprint;   /* hash of the token bytes, special flags and EOS ids: masks cached for
                               one vocabulary are reused only by a vocabulary with the same content */
    /* The arrays above that masks read (all but bytes, eos and class_off) packed into one
     * mapping backed by transparent huge pages where the kernel allows (vocab.c: vocab_pack);
     * NULL when packing failed and each array is its own allocation. */
    void *arena;
    size_t arena_len;
};

/* Mask passes 16 bytes at a time (vocab.c: di_vocab_text_minus, unions). */
typedef uint32_t u32x4 __attribute__((vector_size(16)));

/* mask = the text tokens in none of the token classes `classes` (text & ~ their by_class rows).
 * The result depends on the vocabulary and the class set alone, and a few sets recur in every
 * grammar (a JSON string's block is the same set in every schema), so the last results are kept
 * per vocabulary (thread-safe). */
#define DI_CLASS_MEMO 8
struct di_class_memo {
    pthread_mutex_t lock;
    uint64_t clock;
    struct {
        uint32_t classes;
        uint64_t used;  /* 0: empty */
    } slot[DI_CLASS_MEMO];
    uint32_t *masks; /* [DI_CLASS_MEMO * words] slot i's result at i * words (in the vocabulary's
                        arena: pages touched when it is built, so a kept result costs no fault) */
};
void di_vocab_text_minus(const di_grammar_vocab *v, uint32_t classes, uint32_t *mask);

/* Unions of whole trie subtrees (matcher.c: walk_trie). A walk adds the tokens of every subtree
 * it accepts whole, one bit store per token since a subtree's token ids are scattered (ebnf_stmt:
 * ~4,600 subtrees and 59,000 tokens in one mask). Walks from different states often accept
 * exactly the same subtrees (every word count of regex_sentence's `( [a-z]+){0,8}`, every
 * statement of ebnf_stmt) or nearly the same, so the walk lists the subtrees (as their ranges of
 * pre_tok, which is all their tokens depend on) and keeps the union of a long list with the list
 * itself: an equal later list (compared in full) ORs it in by words, a close one shifts it by the
 * ranges that differ. Per matcher: its vocabulary never changes. */
#define DI_TRIE_UNION_SLOTS 16
typedef struct di_trie_range {
    uint32_t lo, hi; /* pre_tok[lo .. hi): the tokens of one subtree */
} di_trie_range;
typedef struct di_trie_union {
    di_trie_range *r; /* [cap] subtrees accepted whole by the current walk, in preorder */
    uint32_t n, cap;
    uint32_t n_toks;  /* tokens in r[0..n) (counted as listed: a sum at the end read every range again) */
    uint64_t clock;   /* last use of a slot, for eviction */
    struct {
        di_trie_range *r; /* [n] the list this union was made from (NULL: empty slot) */
        uint32_t n, n_toks;
        uint32_t *bits;   /* [di_grammar_mask_words(V)] tokens in the ranges */
        uint64_t used;
    } slot[DI_TRIE_UNION_SLOTS];
} di_trie_union;

static inline void di_trie_union_reset(di_trie_union *u) { u->n = 0, u->n_toks = 0; }
bool di_trie_union_grow(di_trie_union *u);
void di_trie_union_scatter(const di_grammar_vocab *v, di_trie_range r, uint32_t *mask);
/* Lists the subtree whose tokens are pre_tok[lo .. hi) (where the list cannot grow, they go into
 * mask at once). */
static inline void di_trie_union_add(di_trie_union *u, const di_grammar_vocab *v, uint32_t lo, uint32_t hi,
                                     uint32_t *mask) {
    if (u->n < u->cap || di_trie_union_grow(u)) u->r[u->n++] = (di_trie_range){lo, hi}, u->n_toks += hi - lo;
    else di_trie_union_scatter(v, (di_trie_range){lo, hi}, mask);
}
/* ORs the listed subtrees' tokens into mask and empties the list; returns where the union came
 * from: too few tokens to keep (set one by one), a new one, an earlier walk's (equal list), or an
 * earlier walk's shifted by the ranges that differ (a list close in tokens). */
enum { DI_UNION_NONE, DI_UNION_NEW, DI_UNION_REUSED, DI_UNION_SHIFTED };
int di_trie_union_apply(di_trie_union *u, const di_grammar_vocab *v, uint32_t *mask);
void di_trie_union_free(di_trie_union *u);

/* Front-ends: each builds into g and returns the start symbol's nonterminal in *start. */
int di_regex_to_cfg(di_cfg *g, const char *re, size_t len, int32_t *start, di_error *err);
int di_ebnf_to_cfg(di_cfg *g, const char *src, size_t len, const char *root, int32_t *start, di_error *err);
int di_json_schema_to_cfg(di_cfg *g, const char *json, size_t len, const di_json_schema_opts *opts, int32_t *start,
                          di_error *err);

#endif
