/* EBNF front-end: llama.cpp's GBNF dialect, plus the cheap parts of Lark's syntax.
 *
 *   rule      name ::= expr            (Lark: name: expr; a leading ? on the name is ignored)
 *   names     [A-Za-z_][A-Za-z0-9_.-]*
 *   expr      alternatives a | b, sequences a b, groups ( ... )
 *   repeat    x* x+ x? x{m} x{m,} x{m,n}     (Lark: x ~ m, x ~ m..n)
 *   literals  "text" with \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH (Lark: also 'text')
 *   classes   [a-z] [^"\\] with the same escapes; . = any code point
 *   regex     /pattern/ (Lark) compiled by the regex front-end (src/grammar/regex.h)
 *   comments  # to end of line (GBNF), // to end of line (Lark)
 * A rule ends where the next "name ::=" (or "name:") begins, so rules may span lines freely.
 * Errors name the line and column. Unsupported: Lark directives (%import, %ignore), template
 * rules, Lark's [x] optional (GBNF reads [..] as a character class), priorities (skipped), case-insensitive literals ("x"i), GBNF token references <[id]>. */
#ifndef DI_GRAMMAR_EBNF_H
#define DI_GRAMMAR_EBNF_H

#include "grammar/cfg.h"

int di_ebnf_build(di_cfg *g, const char *src, size_t len, const char *root, int32_t *start, di_error *err);

#endif
