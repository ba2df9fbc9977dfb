/* Internals shared by the JSON Schema front-end's files: the compiler context and the helpers
 * json_schema.c (compilation), json_schema_number.c (numbers) and json_schema_rewrite.c (allOf
 * merge, oneOf disjointness, dependencies / not rewrites) use. Not part of any public API. */
#ifndef DI_GRAMMAR_JSON_SCHEMA_IMPL_H
#define DI_GRAMMAR_JSON_SCHEMA_IMPL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "grammar/json_schema.h"

/* Internal keyword that rewrites add to a string schema: an object whose keys are the string
 * values the instance must differ from (from not {enum}); compiled like a free member key. */
#define DI_JS_NOT_STRINGS "$di_not_strings"

typedef struct memo_ent {
    const json_t *key;
    int32_t nt;
} memo_ent;

typedef struct js {
    di_cfg *g;
    di_error *err;
    json_t *root;
    json_t *keep; /* schemas synthesized during compilation (merged allOf), alive until the end */
    di_json_schema_opts opts;
    int rc, depth;
    memo_ent *memo; /* schema object -> nonterminal; makes $ref recursion finite and shares subschemas */
    size_t memo_cap, memo_n;
    char path[512]; /* JSON pointer of the schema being compiled, for messages */
    /* shared symbols, built on first use */
    int32_t ws, comma, colon, lbrace, rbrace, lbrack, rbrack;
    int32_t ws_pair; /* ws ws as one repetition: the inside of an empty {} or [] (json_schema.c: bracketed) */
    int32_t string, strchar, number, integer, value, boolean, null;
    int32_t num_cache[3];   /* integer >= 0, integer >= 1, number >= 0; -1 until built */
    int32_t fmt_cache[16];  /* per k_formats entry; -1 until built */
} js;

/* ---- json_schema.c ---- */

/* Record the first error (code, message with the schema's JSON pointer); returns 0 so that a
 * symbol-returning caller can `return di_js_fail(...)`. */
int32_t di_js_fail(js *c, int code, const char *fmt, const char *arg);
/* JSON pointer (RFC 6901) inside the root document; NULL after di_js_fail. */
json_t *di_js_resolve_ref(js *c, const char *ref);
/* Does keyword k constrain instances (annotations and unknown keywords do not)? */
bool di_js_constrains(const char *k);
/* A schema that constrains nothing (true, or only annotations). */
bool di_js_trivial(const json_t *s);
/* Is v of JSON type t as "type" spells it (integers are also numbers)? */
bool di_js_value_has_type(const json_t *v, const char *t);

/* ---- json_schema_number.c ---- */

/* "integer" (integer true) or "number" with its bounds and multipleOf (what is emitted: see the .c). */
int32_t di_js_number(js *c, json_t *s, bool integer);

/* ---- json_schema_rewrite.c ---- */

/* PCRE2 options for the compile-time pattern checks (why they over-approximate: see the .c). */
extern const uint32_t di_js_pcre2_opts;
/* Does the string v match pattern pat (searched)? 1 yes, 0 no, -1 PCRE2 cannot decide. */
int di_js_pattern_matches(const char *pat, const char *v, size_t vn);
/* allOf parts merged keyword-wise into a new schema (the caller owns it); NULL after di_js_fail. */
json_t *di_js_merge_allof(js *c, json_t *s);
/* No value matches two of the schemas in arr. */
bool di_js_pairwise_disjoint(js *c, json_t *arr);
/* oneOf branches narrowed to forbid each other's required names, when that makes them provably
 * disjoint; else `branches` itself. NULL after di_js_fail. */
json_t *di_js_narrow_oneof(js *c, json_t *branches);
/* dependencies / dependentRequired / dependentSchemas / not rewritten into other keywords; s itself
 * when none applies, NULL after di_js_fail. */
json_t *di_js_rewrite(js *c, json_t *s);

#endif
