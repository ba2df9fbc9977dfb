/* Regular expressions compiled into the grammar IR (di_cfg).
 *
 * Supported syntax (ECMAScript/PCRE subset; the pattern is a string of UTF-8 code points):
 *   literals        any code point; escapes \n \r \t \f \v \0 \xHH \uHHHH \u{H...} and \<punct>
 *   .               any code point except the line terminators \n \r U+2028 U+2029 (ECMAScript)
 *   classes         [abc] [a-z] [^...] with escapes and \d \w \s \D \W \S inside
 *   shorthands      \d = [0-9], \w = [A-Za-z0-9_], \s = ECMAScript white space (incl. Unicode Zs,
 *                   \u2028 \u2029 \ufeff); \D \W \S are their complements over all code points
 *   groups          (...) (?:...) (?<name>...) (?P<name>...)  (capturing is irrelevant here)
 *   repetition      * + ? {n} {n,} {n,m} and their lazy forms (*? etc.; same language)
 *   alternation     a|b
 *   anchors         ^ at the very start and $ at the very end (of the pattern or of a top-level
 *                   alternative); the match is always the whole text
 * Rejected with a clear error: look-ahead/look-behind (?= (?! (?<= (?<!, back-references \1 \k<>,
 * word boundaries \b \B, possessive quantifiers, inline flags (?i) etc., anchors elsewhere,
 * Unicode properties \p{..} (not yet).
 *
 * Code points become UTF-8 byte sequences (surrogates excluded), so the matcher works on bytes. */
#ifndef DI_GRAMMAR_REGEX_H
#define DI_GRAMMAR_REGEX_H

#include "grammar/cfg.h"

enum {
    DI_REGEX_JSON_STRING = 1, /* emit each code point as it appears inside a JSON string literal:
                                '"' -> \", '\' -> \\, controls -> \n \t ... or \u00XX */
    DI_CPSET_BARE = 2         /* di_cpset_sym: a set of one-byte members only is its class terminal itself,
                                 not a nonterminal around it (for front-ends that never take a
                                 negative symbol for "none": the EBNF one) */
};

typedef struct di_regex_info {
    bool anchored_start; /* pattern began with ^ (in every top-level alternative) */
    bool anchored_end;   /* pattern ended with $ */
} di_regex_info;

/* Build the language of re[0..len) into g; *sym is its symbol. */
int di_regex_build(di_cfg *g, const char *re, size_t len, unsigned flags, int32_t *sym, di_regex_info *info,
                   di_error *err);

/* Code-point range sets, shared with the JSON Schema front-end (string character classes). */
typedef struct di_cpset {
    uint32_t (*r)[2]; /* [n] sorted, disjoint, non-adjacent inclusive ranges */
    size_t n, cap;
} di_cpset;
void di_cpset_add(di_cpset *s, uint32_t lo, uint32_t hi);
void di_cpset_free(di_cpset *s);
void di_cpset_negate(di_cpset *s); /* complement over all Unicode scalar values */
/* One code point from the set as a grammar symbol (UTF-8; JSON-escaped with DI_REGEX_JSON_STRING). */
int32_t di_cpset_sym(di_cfg *g, di_cpset *s, unsigned flags);

#endif
