/* The one internal grammar every front-end (regex, EBNF, JSON Schema) compiles to: a context-free
 * grammar whose terminals are byte classes (sets of byte values). Unicode is handled above this
 * layer by expanding code-point ranges into UTF-8 byte sequences, so the matcher only sees bytes.
 *
 * Symbols are int32: a value >= 0 is a nonterminal id, a value < 0 is the terminal -1 - class_id.
 *
 * Building is append-only and never fails at the call site: allocation failure or a size limit
 * sets a sticky error that di_cfg_finalize reports. This keeps the front-ends readable (no status
 * check after every helper) while still bounding hostile inputs. */
#ifndef DI_GRAMMAR_CFG_H
#define DI_GRAMMAR_CFG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

#define DI_CFG_END INT32_MIN /* position symbol marking the end of a rule */

/* Bounds that keep hostile grammars (exponential repetition counts, 4 MB schemas) in check. */
#define DI_CFG_MAX_POSITIONS (8u << 20) /* total symbols over all rules */
#define DI_CFG_MAX_NONTERMINALS (2u << 20)

typedef struct di_cfg_class {
    uint32_t bits[8]; /* 256-bit membership set over byte values */
} di_cfg_class;

typedef struct di_cfg {
    /* ---- built by the front-ends ---- */
    uint32_t n_nt;
    char **nt_name;       /* [n_nt] debug names, may hold NULL */
    int32_t *nt_loop;     /* [n_nt] for X* / X+ built by di_cfg_repeat: X, else 0 (see nt_loop_min) */
    uint8_t *nt_loop_min; /* [n_nt] 0 for X*, 1 for X+, 255 for "not a loop" */
    uint32_t n_rules;
    uint32_t *rule_lhs;   /* [n_rules] */
    uint32_t *rule_off;   /* [n_rules + 1] offsets into rhs */
    int32_t *rhs;         /* [rule_off[n_rules]] symbols */
    uint32_t n_cls;
    di_cfg_class *cls;    /* [n_cls] deduplicated byte classes */
    size_t cap_nt, cap_rules, cap_rhs, cap_cls;
    int err_code;         /* sticky build error (0 = none) */
    char err_msg[256];

    /* ---- filled by di_cfg_finalize: flat item positions for the matcher ----
     * Rule r (after dropping unproductive ones) occupies positions rule_pos[r] .. rule_pos[r]+len,
     * the last one holding DI_CFG_END. An Earley item is (position, origin). */
    bool final;
    int32_t start;        /* augmented start nonterminal: start' -> start */
    uint32_t n_pos;
    int32_t *psym;        /* [n_pos] symbol at the dot, or DI_CFG_END */
    int32_t *plhs;        /* [n_pos] lhs of the rule containing the position */
    uint32_t *nt_rule_off;/* [n_nt + 1] into nt_rules */
    uint32_t *nt_rules;   /* rule start positions grouped by lhs */
    uint8_t *nullable;    /* [n_nt] */
    uint8_t *nt_recurs;   /* [n_nt] can start at two or more places of the grammar: used twice, or
                             once by a nonterminal that can (walk_boundary) */
    uint32_t accept_pos;  /* position of "start' -> start ." */
    uint32_t init_pos;    /* position of "start' -> . start" */
} di_cfg;

di_cfg *di_cfg_new(void);
void di_cfg_free(di_cfg *g);

/* Set the sticky build error (first one wins). Returns the code. */
int di_cfg_fail(di_cfg *g, int code, const char *fmt, ...) DI_PRINTF(3, 4);
static inline bool di_cfg_failed(const di_cfg *g) { return g->err_code != 0; }

int32_t di_cfg_nt(di_cfg *g, const char *name);
void di_cfg_rule(di_cfg *g, int32_t lhs, const int32_t *rhs, size_t n);
int32_t di_cfg_class_sym(di_cfg *g, const di_cfg_class *c);
int32_t di_cfg_byte(di_cfg *g, uint8_t b);
int32_t di_cfg_range(di_cfg *g, uint8_t lo, uint8_t hi);

/* Composite helpers; each returns a symbol (a fresh nonterminal unless trivially reusable). */
int32_t di_cfg_seq(di_cfg *g, const int32_t *s, size_t n);   /* n == 0 gives the empty string */
int32_t di_cfg_alt(di_cfg *g, const int32_t *s, size_t n);   /* n == 0 gives the empty language */
int32_t di_cfg_literal(di_cfg *g, const void *bytes, size_t n);
int32_t di_cfg_opt(di_cfg *g, int32_t s);
/* x (sep x)* as D -> x E, E -> eps | sep D: the first and every later element are one place of
 * the grammar, so the matcher's keys give an element's states one key wherever it stands. */
int32_t di_cfg_separated(di_cfg *g, int32_t x, int32_t sep);
/* s{min,max}; max < 0 means unbounded. Uses left recursion for the unbounded tail so the Earley
 * matcher does constant work per repetition. */
int32_t di_cfg_repeat(di_cfg *g, int32_t s, int64_t min, int64_t max);
static inline int32_t di_cfg_star(di_cfg *g, int32_t s) { return di_cfg_repeat(g, s, 0, -1); }
static inline int32_t di_cfg_plus(di_cfg *g, int32_t s) { return di_cfg_repeat(g, s, 1, -1); }

/* Drop rules that cannot derive any byte string, compute nullability and lay out positions.
 * Fails if `start` derives no string (e.g. an impossible schema) or a build error was recorded. */
int di_cfg_finalize(di_cfg *g, int32_t start, di_error *err);

static inline bool di_cfg_class_has(const di_cfg_class *c, uint8_t b) {
    return (c->bits[b >> 5] >> (b & 31)) & 1u;
}
static inline void di_cfg_class_add_range(di_cfg_class *c, unsigned lo, unsigned hi) {
    for (unsigned b = lo; b <= hi && b < 256; b++) c->bits[b >> 5] |= 1u << (b & 31);
}

#endif
