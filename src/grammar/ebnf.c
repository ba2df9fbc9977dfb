/* EBNF (GBNF / Lark-lite) front-end; syntax in ebnf.h. */
#include "grammar/ebnf.h"

#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_impl.h"
#include "grammar/regex.h"

#define MAX_DEPTH 256

typedef struct rule_name {
    const char *s; /* points into the source */
    size_t n;
    int32_t nt;
    uint32_t line, col; /* first reference or definition, for errors */
    bool defined;
} rule_name;

typedef struct eb {
    const char *s;
    size_t n, i;
    di_cfg *g;
    di_error *err;
    int rc, depth;
    rule_name *names; /* open addressing, cap a power of two */
    size_t cap, count;
    int32_t any_sym; /* cached "." */
} eb;

static void where(const eb *p, size_t at, uint32_t *line, uint32_t *col) {
    uint32_t l = 1, c = 1;
    for (size_t k = 0; k < at && k < p->n; k++) {
        if (p->s[k] == '\n') l++, c = 1;
        else c++;
    }
    *line = l, *col = c;
}

static int32_t fail(eb *p, const char *what) {
    if (!p->rc) {
        uint32_t l, c;
        where(p, p->i, &l, &c);
        p->rc = di_error_set(p->err, DI_ERR_INVALID, "grammar line %u col %u: %s", l, c, what);
    }
    return 0;
}

static char peek(const eb *p) { return p->i < p->n ? p->s[p->i] : 0; }

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

static void skip_space(eb *p) {
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (is_space(c)) {
            p->i++;
        } else if (c == '#' || (c == '/' && p->i + 1 < p->n && p->s[p->i + 1] == '/')) {
            while (p->i < p->n && p->s[p->i] != '\n') p->i++;
        } else {
            break;
        }
    }
}

static bool name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool name_char(char c) { return name_start(c) || (c >= '0' && c <= '9') || c == '-' || c == '.'; }

static size_t name_len_at(const eb *p, size_t at) {
    size_t k = at;
    if (k < p->n && p->s[k] == '?') k++; /* Lark's inline-rule marker */
    if (k >= p->n || !name_start(p->s[k])) return 0;
    while (k < p->n && name_char(p->s[k])) k++;
    /* Lark allows "name.priority:"; a trailing '.' is not part of the name */
    while (k > at && p->s[k - 1] == '.') k--;
    return k - at;
}

/* Is there a rule definition ("name ::=" or "name:") at the current position? */
static bool at_definition(const eb *p) {
    size_t l = name_len_at(p, p->i);
    if (!l) return false;
    size_t k = p->i + l;
    while (k < p->n && (p->s[k] == ' ' || p->s[k] == '\t')) k++;
    if (k + 3 <= p->n && !strncmp(p->s + k, "::=", 3)) return true;
    return k < p->n && p->s[k] == ':' && !(k + 1 < p->n && p->s[k + 1] == ':');
}

static uint64_t hash_name(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static rule_name *lookup(eb *p, const char *s, size_t n) {
    if (p->count * 2 >= p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        rule_name *t = calloc(cap, sizeof *t);
        if (!t) return fail(p, "out of memory for rule names"), NULL;
        for (size_t k = 0; k < p->cap; k++) {
            if (!p->names[k].s) continue;
            size_t h = hash_name(p->names[k].s, p->names[k].n) & (cap - 1);
            while (t[h].s) h = (h + 1) & (cap - 1);
            t[h] = p->names[k];
        }
        free(p->names);
        p->names = t;
        p->cap = cap;
    }
    size_t h = hash_name(s, n) & (p->cap - 1);
    while (p->names[h].s) {
        if (p->names[h].n == n && !memcmp(p->names[h].s, s, n)) return &p->names[h];
        h = (h + 1) & (p->cap - 1);
    }
    char tmp[128];
    size_t k = n < sizeof tmp - 1 ? n : sizeof tmp - 1;
    memcpy(tmp, s, k);
    tmp[k] = 0;
    rule_name *r = &p->names[h];
    r->s = s, r->n = n, r->nt = di_cfg_nt(p->g, tmp), r->defined = false;
    where(p, (size_t)(s - p->s), &r->line, &r->col);
    p->count++;
    return r;
}

static int hexv(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* One code point of a literal or class, handling escapes. */
static uint32_t read_char(eb *p) {
    const uint8_t *u = (const uint8_t *)p->s;
    if (u[p->i] == '\\') {
        p->i++;
        if (p->i >= p->n) return fail(p, "dangling backslash"), 0;
        char c = p->s[p->i++];
        int digits = 0;
        switch (c) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case 'f': return '\f';
        case 'v': return '\v';
        case '0': return 0;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default: return (uint8_t)c; /* \\ \" \] \[ \- \^ \/ ... stand for themselves */
        }
        uint32_t v = 0;
        for (int k = 0; k < digits; k++) {
            int h = p->i < p->n ? hexv(p->s[p->i]) : -1;
            if (h < 0) return fail(p, "bad hex escape"), 0;
            v = v << 4 | (uint32_t)h;
            p->i++;
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return fail(p, "escape is not a Unicode scalar value"), 0;
        return v;
    }
    uint32_t c = u[p->i];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!n || p->i + (size_t)n > p->n) return p->i++, fail(p, "invalid UTF-8"), 0;
    if (n > 1) c &= 0x3Fu >> (n - 1);
    for (int k = 1; k < n; k++) {
        if ((u[p->i + k] & 0xC0) != 0x80) return p->i++, fail(p, "invalid UTF-8"), 0;
        c = c << 6 | (u[p->i + k] & 0x3F);
    }
    p->i += (size_t)n;
    return c;
}

static int32_t parse_literal(eb *p, char quote) {
    p->i++;
    size_t cap = 64, n = 0;
    uint8_t *buf = malloc(cap);
    if (!buf) return fail(p, "out of memory");
    while (p->i < p->n && p->s[p->i] != quote && !p->rc) {
        uint32_t c = read_char(p);
        uint8_t enc[4];
        int k;
        if (c < 0x80) enc[0] = (uint8_t)c, k = 1;
        else if (c < 0x800) enc[0] = (uint8_t)(0xC0 | c >> 6), enc[1] = (uint8_t)(0x80 | (c & 63)), k = 2;
        else if (c < 0x10000)
            enc[0] = (uint8_t)(0xE0 | c >> 12), enc[1] = (uint8_t)(0x80 | (c >> 6 & 63)), enc[2] = (uint8_t)(0x80 | (c & 63)), k = 3;
        else
            enc[0] = (uint8_t)(0xF0 | c >> 18), enc[1] = (uint8_t)(0x80 | (c >> 12 & 63)),
            enc[2] = (uint8_t)(0x80 | (c >> 6 & 63)), enc[3] = (uint8_t)(0x80 | (c & 63)), k = 4;
        if (n + 4 > cap) {
            uint8_t *b = realloc(buf, cap *= 2);
            if (!b) {
                free(buf);
                return fail(p, "out of memory");
            }
            buf = b;
        }
        memcpy(buf + n, enc, (size_t)k);
        n += (size_t)k;
    }
    if (!p->rc && peek(p) != quote) fail(p, "unterminated string literal");
    p->i++;
    if (!p->rc && peek(p) == 'i' && !name_char(p->i + 1 < p->n ? p->s[p->i + 1] : ' '))
        fail(p, "case-insensitive literals (\"...\"i) are not supported");
    /* one byte: its terminal, with no rule around it (one item less in every Earley set that
     * predicts it, and one completion less per byte: -7% of ebnf_json's instructions with
     * DI_CPSET_BARE classes) */
    int32_t r = p->rc ? 0 : n == 1 ? di_cfg_byte(p->g, buf[0]) : di_cfg_literal(p->g, buf, n);
    free(buf);
    return r;
}

static int32_t parse_class(eb *p) {
    p->i++;
    di_cpset s = {0};
    bool neg = false;
    if (peek(p) == '^') neg = true, p->i++;
    while (p->i < p->n && p->s[p->i] != ']' && !p->rc) {
        uint32_t lo = read_char(p), hi = lo;
        if (peek(p) == '-' && p->i + 1 < p->n && p->s[p->i + 1] != ']') {
            p->i++;
            hi = read_char(p);
            if (hi < lo) fail(p, "character range out of order");
        }
        di_cpset_add(&s, lo, hi);
    }
    if (!p->rc && peek(p) != ']') fail(p, "unterminated character class");
    p->i++;
    if (neg) di_cpset_negate(&s);
    int32_t r = p->rc ? 0 : di_cpset_sym(p->g, &s, DI_CPSET_BARE);
    di_cpset_free(&s);
    return r;
}

/* lhs of a sequence (parse_seq): a rule's own nonterminal (>= 0), SEQ_GROUP (a group's first
 * alternative: a fresh nonterminal only if another alternative follows) or SEQ_SYMBOL. */
#define SEQ_GROUP (-1)
#define SEQ_SYMBOL (-2)
static int32_t parse_alt(eb *p, int32_t lhs);

static int32_t parse_primary(eb *p) {
    char c = peek(p);
    if (c == '(') {
        p->i++;
        if (++p->depth > MAX_DEPTH) return fail(p, "groups nested too deeply");
        int32_t s = parse_alt(p, SEQ_GROUP);
        p->depth--;
        skip_space(p);
        if (!p->rc && peek(p) != ')') return fail(p, "missing ')'");
        p->i++;
        return s;
    }
    if (c == '"' || c == '\'') return parse_literal(p, c);
    if (c == '[') return parse_class(p);
    if (c == '.') {
        p->i++;
        if (!p->any_sym) {
            di_cpset s = {0};
            di_cpset_add(&s, 0, 0x10FFFF);
            p->any_sym = di_cpset_sym(p->g, &s, 0);
            di_cpset_free(&s);
        }
        return p->any_sym;
    }
    if (c == '/') {
        size_t a = ++p->i;
        while (p->i < p->n && p->s[p->i] != '/') p->i += p->s[p->i] == '\\' ? 2 : 1;
        if (p->i >= p->n) return fail(p, "unterminated /regex/");
        int32_t s;
        int rc = di_regex_build(p->g, p->s + a, p->i - a, 0, &s, NULL, p->err);
        p->i++;
        if (rc) {
            uint32_t l, col;
            where(p, a, &l, &col);
            p->rc = di_error_wrap(p->err, "grammar line %u col %u", l, col);
            return 0;
        }
        return s;
    }
    if (c == '%') return fail(p, "Lark directives (%import, %ignore, ...) are not supported");
    if (c == '<') return fail(p, "token references <...> are not supported");
    size_t l = name_len_at(p, p->i);
    if (!l) return fail(p, "expected a rule name, literal, class or group");
    rule_name *r = lookup(p, p->s + p->i, l);
    p->i += l;
    return r ? r->nt : 0;
}

static bool read_int(eb *p, int64_t *v) {
    skip_space(p);
    if (!(peek(p) >= '0' && peek(p) <= '9')) return false;
    int64_t x = 0;
    while (peek(p) >= '0' && peek(p) <= '9') {
        x = x * 10 + (p->s[p->i++] - '0');
        if (x > 1000000) return fail(p, "repetition count too large"), false;
    }
    *v = x;
    return true;
}

/* Lark's "x ~ m..n": spaces then '~' on the same line. */
/* Does Lark's `~ n` follow at k (after spaces)? */
static bool tilde_at(const eb *p, size_t k) {
    while (k < p->n && p->s[k] == ' ') k++;
    return k < p->n && p->s[k] == '~';
}

static int32_t parse_postfix(eb *p) {
    int32_t s = parse_primary(p);
    for (;;) {
        if (p->rc) return 0;
        char c = peek(p); /* postfix operators must follow without a line break */
        int64_t lo, hi;
        if (c == '*') lo = 0, hi = -1, p->i++;
        else if (c == '+') lo = 1, hi = -1, p->i++;
        else if (c == '?') lo = 0, hi = 1, p->i++;
        else if (c == '{') {
            p->i++;
            if (!read_int(p, &lo)) return fail(p, "expected a count in {m,n}");
            hi = lo;
            skip_space(p);
            if (peek(p) == ',') {
                p->i++;
                if (!read_int(p, &hi)) hi = -1;
            }
            skip_space(p);
            if (p->rc || peek(p) != '}') return fail(p, "bad {m,n} repetition");
            p->i++;
            if (hi >= 0 && hi < lo) return fail(p, "repetition {m,n} with n < m");
        } else if ((c == ' ' || c == '~') && tilde_at(p, p->i)) {
            while (peek(p) == ' ') p->i++;
            p->i++;
            if (!read_int(p, &lo)) return fail(p, "expected a count after ~");
            hi = lo;
            if (p->i + 1 < p->n && p->s[p->i] == '.' && p->s[p->i + 1] == '.') {
                p->i += 2;
                if (!read_int(p, &hi)) return fail(p, "expected a count after ..");
            }
            if (hi < lo) return fail(p, "repetition m..n with n < m");
        } else {
            return s;
        }
        s = di_cfg_repeat(p->g, s, lo, hi);
    }
}

static int32_t parse_seq(eb *p, int32_t *lhs);

/* The ')' that closes the group opened at s[g0] (literals, classes, /regex/ and comments
 * skipped), or 0. */
static size_t group_end(const eb *p, size_t g0) {
    int depth = 0;
    for (size_t k = g0; k < p->n; k++) {
        char c = p->s[k];
        if (c == '"' || c == '\'' || c == '[' || (c == '/' && !(k + 1 < p->n && p->s[k + 1] == '/'))) {
            char close = c == '[' ? ']' : c;
            for (k++; k < p->n && p->s[k] != close; k++)
                if (p->s[k] == '\\') k++;
            if (k >= p->n) return 0;
        } else if (c == '#' || c == '/') {
            while (k < p->n && p->s[k] != '\n') k++;
        } else if (c == '(') {
            depth++;
        } else if (c == ')' && --depth == 0) {
            return k;
        }
    }
    return 0;
}

#define LIST_ITEMS 8 /* a separated list's element: at most the last 8 items of the sequence */

/* A separated list `X (S X)*` where the X inside the group is the same text as the items before
 * it (`expr ("," ws expr)*`, `string ":" ws value ("," ws string ":" ws value)*`): built as
 * D -> X E, E -> eps | S D (di_cfg_separated), so that the first and every later element are
 * one nonterminal, as the regex front-end does (regex.c, separated_list). Parsed as written, the
 * second X is another place of its own and the element's states get other keys there (the
 * matcher hashes an origin by the effect of completing there, and E's right recursion makes that
 * effect the same for every element): an identifier in a call's second argument relearned what
 * the first had walked. X is items v[n-m..n), the text [xs[n-m], p->i); the group starts at
 * p->i. The longest such X is taken: with `value` alone as X, a JSON object's second member
 * would be S = `"," ws string ":" ws` and its key and `:` other places than the first member's,
 * so the value after them another state (ebnf_json relearned it). Returns D with p->i past the
 * `)*`, or 0 (p untouched but for rule names) where the text is not of that form. */
static int32_t separated_list(eb *p, const int32_t *v, const size_t *xs, size_t n, size_t *m_out) {
    size_t g0 = p->i, close = group_end(p, g0);
    if (!close || close + 1 >= p->n || p->s[close + 1] != '*') return 0;
    size_t end = close + 2;
    if (end < p->n && (p->s[end] == '*' || p->s[end] == '+' || p->s[end] == '?' || p->s[end] == '{')) return 0;
    if (tilde_at(p, end)) return 0; /* a second quantifier: not (S X)* */
    for (size_t m = n < LIST_ITEMS ? n : LIST_ITEMS; m >= 1; m--) {
        size_t a = xs[n - m], xl = g0 - a;
        while (xl && is_space(p->s[a + xl - 1])) xl--; /* X's text without the space before the group */
        size_t e = close - xl; /* the group's text ends with X's, at the start of a token */
        if (xl >= close - g0 - 1 || memcmp(p->s + e, p->s + a, xl) || !is_space(p->s[e - 1])) continue;
        di_error scratch = {0};
        eb sub = *p;
        sub.n = e, sub.i = g0 + 1, sub.err = &scratch, sub.rc = 0, sub.depth = p->depth + 1;
        int32_t sep_lhs = SEQ_SYMBOL;
        int32_t sep = sub.depth > MAX_DEPTH ? 0 : parse_seq(&sub, &sep_lhs);
        p->names = sub.names, p->cap = sub.cap, p->count = sub.count, p->any_sym = sub.any_sym; /* may have grown */
        skip_space(&sub);
        if (sub.depth > MAX_DEPTH || sub.rc || sub.i != e || sub.i == g0 + 1) continue; /* S: one whole sequence */
        p->i = end;
        *m_out = m;
        return di_cfg_separated(p->g, di_cfg_seq(p->g, v + n - m, m), sep);
    }
    return 0;
}

/* One sequence of an alternation. Its items become a rule of *lhs where that is a nonterminal;
 * a group's first alternative followed by `|` makes *lhs a fresh nonterminal first; otherwise
 * they become one symbol (di_cfg_seq). So `value ::= object | "x" ws` is value -> object,
 * value -> "x" ws, without a nonterminal per alternative or group around them (one Earley item
 * less per level wherever the rule is predicted). Returns the sequence's symbol or *lhs. */
static int32_t parse_seq(eb *p, int32_t *lhs) {
    size_t n = 0, cap = 16;
    char c = 0;
    int32_t *v = malloc(cap * sizeof *v);
    size_t *xs = malloc(cap * sizeof *xs); /* [cap] text offset of item k */
    if (!v || !xs) {
        free(v);
        free(xs);
        return fail(p, "out of memory");
    }
    for (;;) {
        skip_space(p);
        c = peek(p);
        if (!c || c == '|' || c == ')' || c == ']' || p->rc || at_definition(p)) break;
        size_t start = p->i, m = 0;
        int32_t s = c == '(' && n ? separated_list(p, v, xs, n, &m) : 0;
        if (s) {
            n -= m;
            start = xs[n];
        } else {
            s = parse_postfix(p);
        }
        if (p->rc) break;
        if (n == cap) {
            int32_t *w = realloc(v, (cap *= 2) * sizeof *w);
            size_t *y = w ? realloc(xs, cap * sizeof *y) : NULL;
            if (w) v = w;
            if (y) xs = y;
            if (!w || !y) {
                fail(p, "out of memory");
                break;
            }
        }
        xs[n] = start;
        v[n++] = s;
    }
    free(xs);
    if (!p->rc && *lhs == SEQ_GROUP && c == '|') *lhs = di_cfg_nt(p->g, NULL);
    int32_t r = 0;
    if (!p->rc && *lhs >= 0) {
        di_cfg_rule(p->g, *lhs, v, n);
        r = *lhs;
    } else if (!p->rc) {
        r = di_cfg_seq(p->g, v, n);
    }
    free(v);
    return r;
}

/* Alternatives into lhs (a rule's nonterminal), or into a group's symbol (lhs SEQ_GROUP). */
static int32_t parse_alt(eb *p, int32_t lhs) {
    int32_t first = parse_seq(p, &lhs);
    skip_space(p);
    if (p->rc || peek(p) != '|') return first;
    while (!p->rc && peek(p) == '|') {
        p->i++;
        parse_seq(p, &lhs);
        skip_space(p);
    }
    return lhs;
}

int di_ebnf_build(di_cfg *g, const char *src, size_t len, const char *root, int32_t *start, di_error *err) {
    eb p = {.s = src, .n = len, .g = g, .err = err};
    skip_space(&p);
    if (p.i >= p.n) return di_error_set(err, DI_ERR_INVALID, "grammar: empty grammar (expected rules like root ::= ...)");
    while (!p.rc) {
        skip_space(&p);
        if (p.i >= p.n) break;
        if (!at_definition(&p)) {
            fail(&p, "expected a rule definition (name ::= ...)");
            break;
        }
        if (p.s[p.i] == '?') p.i++;
        size_t l = name_len_at(&p, p.i);
        rule_name *r = lookup(&p, p.s + p.i, l);
        if (!r) break;
        if (r->defined) {
            fail(&p, "rule defined twice");
            break;
        }
        r->defined = true;
        where(&p, p.i, &r->line, &r->col);
        int32_t nt = r->nt;
        p.i += l;
        while (peek(&p) == '.' || (peek(&p) >= '0' && peek(&p) <= '9')) p.i++; /* Lark priority */
        skip_space(&p);
        p.i += peek(&p) == ':' && p.i + 2 < p.n && p.s[p.i + 1] == ':' ? 3 : 1;
        parse_alt(&p, nt); /* the alternatives are nt's rules */
        if (p.rc) break;
        skip_space(&p);
        if (p.i < p.n && !at_definition(&p)) {
            fail(&p, peek(&p) == ')' ? "unbalanced ')'" : "unexpected character");
            break;
        }
    }
    if (!p.rc) {
        for (size_t k = 0; k < p.cap; k++) {
            rule_name *r = &p.names[k];
            if (r->s && !r->defined) {
                p.rc = di_error_set(err, DI_ERR_INVALID, "grammar line %u col %u: rule '%.*s' is used but not defined",
                                    r->line, r->col, (int)(r->n > 100 ? 100 : r->n), r->s);
                break;
            }
        }
    }
    if (!p.rc) {
        rule_name *r = NULL;
        size_t rl = strlen(root);
        for (size_t k = 0; k < p.cap && !r; k++)
            if (p.names[k].s && p.names[k].n == rl && !memcmp(p.names[k].s, root, rl)) r = &p.names[k];
        if (!r) p.rc = di_error_set(err, DI_ERR_INVALID, "grammar: no '%s' rule (the start rule)", root);
        else *start = r->nt;
    }
    free(p.names);
    if (!p.rc && di_cfg_failed(g)) p.rc = di_error_set(err, g->err_code, "grammar: %s", g->err_msg);
    return p.rc;
}

int di_ebnf_to_cfg(di_cfg *g, const char *src, size_t len, const char *root, int32_t *start, di_error *err) {
    return di_ebnf_build(g, src, len, root, start, err);
}
