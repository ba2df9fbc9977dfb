/* Regex front-end: recursive descent over the pattern, building grammar symbols directly. */
#include "grammar/regex.h"

#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_impl.h"

#define MAX_DEPTH 256    /* group nesting; deeper patterns are rejected, not stack-overflowed */
#define MAX_REPEAT 100000 /* {n,m} bound */

/* ---- code-point sets ---- */

static int cmp_range(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

void di_cpset_free(di_cpset *s) {
    free(s->r);
    memset(s, 0, sizeof *s);
}

void di_cpset_add(di_cpset *s, uint32_t lo, uint32_t hi) {
    if (lo > hi) return;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        void *p = realloc(s->r, cap * sizeof *s->r);
        if (!p) return; /* the caller's grammar build reports memory exhaustion elsewhere */
        s->r = p;
        s->cap = cap;
    }
    s->r[s->n][0] = lo;
    s->r[s->n][1] = hi;
    s->n++;
}

static void cpset_normalize(di_cpset *s) {
    if (s->n < 2) return;
    qsort(s->r, s->n, sizeof *s->r, cmp_range);
    size_t w = 0;
    for (size_t i = 1; i < s->n; i++) {
        if (s->r[i][0] <= s->r[w][1] + 1) {
            if (s->r[i][1] > s->r[w][1]) s->r[w][1] = s->r[i][1];
        } else {
            s->r[++w][0] = s->r[i][0];
            s->r[w][1] = s->r[i][1];
        }
    }
    s->n = w + 1;
}

/* Complement over all Unicode scalar values (surrogates are never members). */
void di_cpset_negate(di_cpset *s) {
    cpset_normalize(s);
    di_cpset o = {0};
    uint32_t next = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->r[i][0] > next) di_cpset_add(&o, next, s->r[i][0] - 1);
        next = s->r[i][1] + 1;
    }
    if (next <= 0x10FFFF) di_cpset_add(&o, next, 0x10FFFF);
    di_cpset_free(s);
    *s = o;
}

static void cpset_add_set(di_cpset *d, const di_cpset *s) {
    for (size_t i = 0; i < s->n; i++) di_cpset_add(d, s->r[i][0], s->r[i][1]);
}

/* ---- UTF-8 expansion ---- */

static int utf8_len(uint32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

static int utf8_enc(uint32_t c, uint8_t *o) {
    int n = utf8_len(c);
    if (n == 1) {
        o[0] = (uint8_t)c;
    } else {
        static const uint8_t lead[5] = {0, 0, 0xC0, 0xE0, 0xF0};
        for (int k = n - 1; k > 0; k--) o[k] = (uint8_t)(0x80 | (c & 0x3F)), c >>= 6;
        o[0] = (uint8_t)(lead[n] | c);
    }
    return n;
}

/* Add rules to nt matching exactly the UTF-8 encodings of [lo, hi] (same encoded length). A range
 * is a product of per-byte ranges once no trailing-bit boundary is crossed partially, so split at
 * the first boundary that is crossed unaligned and recurse. */
static void utf8_rules(di_cfg *g, int32_t nt, uint32_t lo, uint32_t hi) {
    int n = utf8_len(lo);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) {
                utf8_rules(g, nt, lo, lo | m);
                utf8_rules(g, nt, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                utf8_rules(g, nt, lo, (hi & ~m) - 1);
                utf8_rules(g, nt, hi & ~m, hi);
                return;
            }
        }
    }
    uint8_t a[4], b[4];
    utf8_enc(lo, a);
    utf8_enc(hi, b);
    int32_t seq[4];
    for (int k = 0; k < n; k++) seq[k] = di_cfg_range(g, a[k], b[k]);
    di_cfg_rule(g, nt, seq, (size_t)n);
}

static void utf8_add_range(di_cfg *g, int32_t nt, uint32_t lo, uint32_t hi) {
    static const uint32_t bounds[4][2] = {{0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xFFFF}, {0x10000, 0x10FFFF}};
    for (int k = 0; k < 4; k++) {
        uint32_t a = lo > bounds[k][0] ? lo : bounds[k][0], b = hi < bounds[k][1] ? hi : bounds[k][1];
        if (a > b) continue;
        if (a <= 0xDFFF && b >= 0xD800) { /* surrogates are not scalar values */
            if (a < 0xD800) utf8_rules(g, nt, a, 0xD7FF);
            if (b > 0xDFFF) utf8_rules(g, nt, 0xE000, b);
        } else {
            utf8_rules(g, nt, a, b);
        }
    }
}

static void json_escape_rule(di_cfg *g, int32_t nt, uint32_t c) {
    char buf[8];
    size_t n;
    switch (c) {
    case '"': memcpy(buf, "\\\"", n = 2); break;
    case '\\': memcpy(buf, "\\\\", n = 2); break;
    case '\n': memcpy(buf, "\\n", n = 2); break;
    case '\r': memcpy(buf, "\\r", n = 2); break;
    case '\t': memcpy(buf, "\\t", n = 2); break;
    case '\b': memcpy(buf, "\\b", n = 2); break;
    case '\f': memcpy(buf, "\\f", n = 2); break;
    default: {
        static const char hex[] = "0123456789abcdef";
        memcpy(buf, "\\u00", 4);
        buf[4] = hex[(c >> 4) & 15];
        buf[5] = hex[c & 15];
        n = 6;
    }
    }
    int32_t s[6];
    for (size_t i = 0; i < n; i++) s[i] = di_cfg_byte(g, (uint8_t)buf[i]);
    di_cfg_rule(g, nt, s, n);
}

int32_t di_cpset_sym(di_cfg *g, di_cpset *s, unsigned flags) {
    cpset_normalize(s);
    if ((flags & DI_CPSET_BARE) && !(flags & DI_REGEX_JSON_STRING) && s->n && s->r[s->n - 1][1] < 0x80) {
        di_cfg_class c = {{0}}; /* one-byte members only (the ranges are sorted) */
        for (size_t i = 0; i < s->n; i++) di_cfg_class_add_range(&c, s->r[i][0], s->r[i][1]);
        return di_cfg_class_sym(g, &c);
    }
    int32_t nt = di_cfg_nt(g, NULL);
    /* all one-byte members go into a single class: one terminal instead of many rules */
    di_cfg_class ascii = {{0}};
    bool any_ascii = false;
    for (size_t i = 0; i < s->n; i++) {
        uint32_t lo = s->r[i][0], hi = s->r[i][1];
        for (uint32_t c = lo; c <= hi && c < 0x80; c++) {
            bool esc = (flags & DI_REGEX_JSON_STRING) && (c < 0x20 || c == '"' || c == '\\');
            if (esc) {
                json_escape_rule(g, nt, c);
            } else {
                di_cfg_class_add_range(&ascii, c, c);
                any_ascii = true;
            }
        }
        if (hi >= 0x80) utf8_add_range(g, nt, lo < 0x80 ? 0x80 : lo, hi);
    }
    if (any_ascii) {
        int32_t t = di_cfg_class_sym(g, &ascii);
        di_cfg_rule(g, nt, &t, 1);
    }
    return nt;
}

/* ---- parser ---- */

typedef struct rx {
    const char *s;
    size_t n, i;
    di_cfg *g;
    di_error *err;
    unsigned flags;
    int depth;
    int rc;
    int32_t dot_sym; /* cached "." */
} rx;

static int32_t fail(rx *p, const char *what) {
    if (!p->rc) p->rc = di_error_set(p->err, DI_ERR_INVALID, "regex: %s at offset %zu", what, p->i);
    return 0;
}

static bool more(const rx *p) { return p->i < p->n && !p->rc; }
static char peek(const rx *p) { return p->i < p->n ? p->s[p->i] : 0; }

/* Decode one UTF-8 code point of the pattern. */
static uint32_t next_cp(rx *p) {
    const uint8_t *u = (const uint8_t *)p->s + p->i;
    size_t left = p->n - p->i;
    uint32_t c = u[0];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!n || (size_t)n > left) {
        fail(p, "invalid UTF-8 in pattern");
        p->i++;
        return 0;
    }
    if (n > 1) {
        c &= 0x3F >> (n - 1);
        for (int k = 1; k < n; k++) {
            if ((u[k] & 0xC0) != 0x80) {
                fail(p, "invalid UTF-8 in pattern");
                p->i++;
                return 0;
            }
            c = c << 6 | (u[k] & 0x3F);
        }
    }
    p->i += (size_t)n;
    return c;
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static uint32_t read_hex(rx *p, int count) {
    uint32_t v = 0;
    for (int k = 0; k < count; k++) {
        int h = p->i < p->n ? hexval(p->s[p->i]) : -1;
        if (h < 0) return fail(p, "bad hex escape"), 0;
        v = v << 4 | (uint32_t)h;
        p->i++;
    }
    return v;
}

static void add_space(di_cpset *s) {
    static const uint32_t sp[][2] = {{9, 13},         {32, 32},         {0xA0, 0xA0},     {0x1680, 0x1680},
                                     {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                                     {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
    for (size_t k = 0; k < sizeof sp / sizeof sp[0]; k++) di_cpset_add(s, sp[k][0], sp[k][1]);
}

/* After a backslash: either a set shorthand (returns true, fills set) or a single code point. */
static bool parse_escape(rx *p, di_cpset *set, uint32_t *cp, bool in_class) {
    if (p->i >= p->n) return fail(p, "pattern ends with a backslash"), false;
    char c = p->s[p->i++];
    di_cpset t = {0};
    switch (c) {
    case 'd': case 'D': di_cpset_add(&t, '0', '9'); break;
    case 'w': case 'W':
        di_cpset_add(&t, '0', '9'), di_cpset_add(&t, 'A', 'Z'), di_cpset_add(&t, 'a', 'z'), di_cpset_add(&t, '_', '_');
        break;
    case 's': case 'S': add_space(&t); break;
    case 'n': *cp = '\n'; return false;
    case 'r': *cp = '\r'; return false;
    case 't': *cp = '\t'; return false;
    case 'f': *cp = '\f'; return false;
    case 'v': *cp = '\v'; return false;
    case '0': *cp = 0; return false;
    case 'x': *cp = read_hex(p, 2); return false;
    case 'u':
        if (peek(p) == '{') {
            p->i++;
            uint32_t v = 0;
            int k = 0;
            while (p->i < p->n && p->s[p->i] != '}' && k < 7) {
                int h = hexval(p->s[p->i++]);
                if (h < 0) return fail(p, "bad \\u{...} escape"), false;
                v = v << 4 | (uint32_t)h, k++;
            }
            if (peek(p) != '}' || !k || v > 0x10FFFF) return fail(p, "bad \\u{...} escape"), false;
            p->i++;
            *cp = v;
        } else {
            *cp = read_hex(p, 4);
        }
        if (*cp >= 0xD800 && *cp <= 0xDFFF) return fail(p, "surrogate code point escape"), false;
        return false;
    case 'b':
        if (in_class) { *cp = '\b'; return false; }
        return fail(p, "word boundary \\b is not supported (look-around)"), false;
    case 'B': return fail(p, "word boundary \\B is not supported (look-around)"), false;
    case 'k': return fail(p, "back-references are not supported"), false;
    case 'p': case 'P': return fail(p, "Unicode property classes \\p{..} are not supported yet"), false;
    case 'A': case 'z': case 'Z': case 'G': return fail(p, "anchor escapes are not supported"), false;
    default:
        if (c >= '1' && c <= '9') return fail(p, "back-references are not supported"), false;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return fail(p, "unknown escape"), false;
        p->i--;
        *cp = next_cp(p);
        return false;
    }
    if (c == 'D' || c == 'W' || c == 'S') di_cpset_negate(&t);
    cpset_add_set(set, &t);
    di_cpset_free(&t);
    return true;
}

static int32_t cp_sym(rx *p, uint32_t c) {
    if (c < 0x80 && !((p->flags & DI_REGEX_JSON_STRING) && (c < 0x20 || c == '"' || c == '\\')))
        return di_cfg_byte(p->g, (uint8_t)c);
    di_cpset s = {0};
    di_cpset_add(&s, c, c);
    int32_t r = di_cpset_sym(p->g, &s, p->flags);
    di_cpset_free(&s);
    return r;
}

static int32_t parse_class(rx *p) {
    di_cpset s = {0};
    bool neg = false;
    if (peek(p) == '^') neg = true, p->i++;
    bool first = true;
    while (more(p) && (peek(p) != ']' || first)) {
        first = false;
        uint32_t lo;
        if (peek(p) == '[' && p->i + 1 < p->n && p->s[p->i + 1] == ':') {
            fail(p, "POSIX classes [:name:] are not supported");
            break;
        }
        if (peek(p) == '\\') {
            p->i++;
            if (parse_escape(p, &s, &lo, true)) continue;
        } else {
            lo = next_cp(p);
        }
        uint32_t hi = lo;
        if (peek(p) == '-' && p->i + 1 < p->n && p->s[p->i + 1] != ']') {
            p->i++;
            if (peek(p) == '\\') {
                p->i++;
                di_cpset junk = {0};
                if (parse_escape(p, &junk, &hi, true)) {
                    di_cpset_free(&junk);
                    fail(p, "class shorthand used as a range end");
                    break;
                }
            } else {
                hi = next_cp(p);
            }
            if (hi < lo) {
                fail(p, "class range out of order");
                break;
            }
        }
        di_cpset_add(&s, lo, hi);
    }
    if (!p->rc && peek(p) != ']') fail(p, "unterminated character class");
    p->i++;
    if (neg) di_cpset_negate(&s);
    int32_t r = p->rc ? 0 : di_cpset_sym(p->g, &s, p->flags);
    di_cpset_free(&s);
    return r;
}

static int32_t parse_alt(rx *p, bool top, di_regex_info *info);
static int32_t parse_concat(rx *p, bool top, di_regex_info *info);

static int32_t parse_atom(rx *p) {
    char c = peek(p);
    if (c == '(') {
        p->i++;
        if (peek(p) == '?') {
            p->i++;
            char k = peek(p);
            if (k == ':') {
                p->i++;
            } else if (k == '=' || k == '!') {
                return fail(p, "look-ahead is not supported");
            } else if (k == '<' && p->i + 1 < p->n && (p->s[p->i + 1] == '=' || p->s[p->i + 1] == '!')) {
                return fail(p, "look-behind is not supported");
            } else if (k == '<' || (k == 'P' && p->i + 1 < p->n && p->s[p->i + 1] == '<')) {
                while (p->i < p->n && p->s[p->i] != '>') p->i++;
                if (p->i >= p->n) return fail(p, "unterminated group name");
                p->i++;
            } else {
                return fail(p, "inline flags and other (?...) groups are not supported");
            }
        }
        if (++p->depth > MAX_DEPTH) return fail(p, "groups nested too deeply");
        int32_t s = parse_alt(p, false, NULL);
        p->depth--;
        if (p->rc) return 0;
        if (peek(p) != ')') return fail(p, "missing ')'");
        p->i++;
        return s;
    }
    if (c == '[') {
        p->i++;
        return parse_class(p);
    }
    if (c == '.') {
        p->i++;
        if (!p->dot_sym) {
            di_cpset s = {0};
            /* ECMAScript: any code point except the line terminators \n \r U+2028 U+2029 */
            di_cpset_add(&s, 0, '\n' - 1);
            di_cpset_add(&s, '\n' + 1, '\r' - 1);
            di_cpset_add(&s, '\r' + 1, 0x2027);
            di_cpset_add(&s, 0x202A, 0x10FFFF);
            p->dot_sym = di_cpset_sym(p->g, &s, p->flags);
            di_cpset_free(&s);
        }
        return p->dot_sym;
    }
    if (c == '\\') {
        p->i++;
        di_cpset s = {0};
        uint32_t cp = 0;
        int32_t r;
        if (parse_escape(p, &s, &cp, false))
            r = di_cpset_sym(p->g, &s, p->flags);
        else
            r = p->rc ? 0 : cp_sym(p, cp);
        di_cpset_free(&s);
        return r;
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') return fail(p, "quantifier without an operand");
    if (c == '^' || c == '$') return fail(p, "anchors are only supported at the start and end of the pattern");
    return cp_sym(p, next_cp(p));
}

static bool parse_count(rx *p, int64_t *v) {
    if (!(peek(p) >= '0' && peek(p) <= '9')) return false;
    int64_t x = 0;
    while (peek(p) >= '0' && peek(p) <= '9') {
        x = x * 10 + (p->s[p->i++] - '0');
        if (x > MAX_REPEAT) return fail(p, "repetition count too large (limit 100000)"), false;
    }
    *v = x;
    return true;
}

static int32_t parse_repeat(rx *p) {
    int32_t s = parse_atom(p);
    while (more(p)) {
        char c = peek(p);
        int64_t lo, hi;
        if (c == '*') lo = 0, hi = -1, p->i++;
        else if (c == '+') lo = 1, hi = -1, p->i++;
        else if (c == '?') lo = 0, hi = 1, p->i++;
        else if (c == '{') {
            size_t save = p->i++;
            if (!parse_count(p, &lo)) {
                if (p->rc) return 0;
                p->i = save; /* a literal '{' (ECMAScript annex B) */
                break;
            }
            hi = lo;
            if (peek(p) == ',') {
                p->i++;
                if (!parse_count(p, &hi)) hi = -1;
            }
            if (p->rc) return 0;
            if (peek(p) != '}') return fail(p, "bad {n,m} repetition");
            p->i++;
            if (hi >= 0 && hi < lo) return fail(p, "repetition {n,m} with m < n");
        } else {
            break;
        }
        if (peek(p) == '?') p->i++; /* lazy: same language */
        else if (peek(p) == '+') return fail(p, "possessive quantifiers are not supported");
        s = di_cfg_repeat(p->g, s, lo, hi);
    }
    return s;
}

/* A separated list `X(SX)*` (`X(?:SX)*`, lazy `*?` too) where the X after S is the same text as
 * the item before the group: build it as D -> X E, E -> eps | S D, so both places are one
 * nonterminal. Parsed as written, the second X is a nonterminal of its own, and every state inside
 * it gets keys of its own: an e-mail or hostname label after `.` relearned every count of the
 * label's `{0,61}` that the first label had already walked (the matcher's keys hash an origin by
 * the effect of completing there, and E's right recursion makes that effect the same for every
 * element). X is the last m items of the concatenation so far, items[0..m), text[xs, p->i) (the
 * longest that matches is taken, so a label's first character is inside X). Returns D with p->i
 * past the quantifier, or 0 (p untouched) where the text is not of that form. */
static int32_t separated_list(rx *p, size_t xs, const int32_t *items, size_t m) {
    size_t xe = p->i;
    size_t xl = xe - xs, i = p->i;
    char x0 = p->s[xs];
    /* X must start where no byte of S can extend it (an escape, a class, a group) */
    if (!(x0 == '[' || x0 == '(' || x0 == '\\') || i >= p->n || p->s[i] != '(') return 0;
    size_t body = i + 1;
    if (body + 1 < p->n && p->s[body] == '?') {
        if (p->s[body + 1] != ':') return 0;
        body += 2;
    }
    /* the group ends at the first `X)*` after which S parses as one complete concatenation */
    for (size_t e = body; e + xl + 2 <= p->n; e++) {
        if (memcmp(p->s + e, p->s + xs, xl) != 0 || p->s[e + xl] != ')' || p->s[e + xl + 1] != '*') continue;
        size_t end = e + xl + 2;
        if (end < p->n && p->s[end] == '?') end++;
        if (end < p->n && strchr("*+?{", p->s[end])) return 0; /* a second quantifier: not (SX)* */
        di_error scratch = {0};
        rx sub = {.s = p->s, .n = e, .i = body, .g = p->g, .err = &scratch, .flags = p->flags, .depth = p->depth + 1,
                  .dot_sym = p->dot_sym};
        if (sub.depth > MAX_DEPTH) return 0;
        int32_t sep = parse_concat(&sub, false, NULL);
        if (sub.rc || sub.i != e) continue; /* S is not a whole concatenation ending here */
        p->dot_sym = sub.dot_sym;
        int32_t d = di_cfg_separated(p->g, di_cfg_seq(p->g, items, m), sep);
        p->i = end;
        return d;
    }
    return 0;
}

static int32_t parse_concat(rx *p, bool top, di_regex_info *info) {
    int32_t buf[32];
    size_t starts[32]; /* text offset of item k (the first 32 items: separated lists look back no further) */
    int32_t *v = buf;
    size_t n = 0, cap = 32;
    if (top && peek(p) == '^') {
        p->i++;
        if (info) info->anchored_start = true;
    }
    while (more(p) && peek(p) != '|' && peek(p) != ')') {
        if (top && peek(p) == '$' && (p->i + 1 == p->n || p->s[p->i + 1] == '|')) {
            p->i++;
            if (info) info->anchored_end = true;
            break;
        }
        size_t item_start = p->i;
        int32_t s = parse_repeat(p);
        if (p->rc) break;
        if (n < 32) starts[n] = item_start;
        for (size_t m = (n < 32 ? n : 31) + 1; m >= 1; m--) {
            if (m > 1 && n - (m - 1) >= 32) continue;
            size_t xs = m == 1 ? item_start : starts[n - (m - 1)];
            int32_t items[32];
            memcpy(items, v + n - (m - 1), (m - 1) * sizeof *items);
            items[m - 1] = s;
            int32_t list = separated_list(p, xs, items, m);
            if (list) {
                n -= m - 1;
                if (n < 32) starts[n] = xs;
                s = list;
                break;
            }
        }
        if (n == cap) {
            int32_t *w = malloc(2 * cap * sizeof *w);
            if (!w) {
                p->rc = di_error_set(p->err, DI_ERR_NOMEM, "regex: out of memory");
                break;
            }
            memcpy(w, v, n * sizeof *w);
            if (v != buf) free(v);
            v = w;
            cap *= 2;
        }
        v[n++] = s;
    }
    int32_t r = p->rc ? 0 : di_cfg_seq(p->g, v, n);
    if (v != buf) free(v);
    return r;
}

static int32_t parse_alt(rx *p, bool top, di_regex_info *info) {
    int32_t first = parse_concat(p, top, info);
    if (p->rc || peek(p) != '|') return first;
    int32_t nt = di_cfg_nt(p->g, NULL);
    di_cfg_rule(p->g, nt, &first, 1);
    while (!p->rc && peek(p) == '|') {
        p->i++;
        int32_t s = parse_concat(p, top, info);
        di_cfg_rule(p->g, nt, &s, 1);
    }
    return nt;
}

int di_regex_build(di_cfg *g, const char *re, size_t len, unsigned flags, int32_t *sym, di_regex_info *info,
                   di_error *err) {
    rx p = {.s = re, .n = len, .g = g, .err = err, .flags = flags};
    di_regex_info inf = {0};
    int32_t s = parse_alt(&p, true, &inf);
    if (!p.rc && p.i < p.n) fail(&p, peek(&p) == ')' ? "unbalanced ')'" : "unexpected character");
    if (p.rc) return p.rc;
    if (di_cfg_failed(g)) return di_error_set(err, g->err_code, "regex: %s", g->err_msg);
    *sym = s;
    if (info) *info = inf;
    return DI_OK;
}

int di_regex_to_cfg(di_cfg *g, const char *re, size_t len, int32_t *start, di_error *err) {
    int32_t s;
    int rc = di_regex_build(g, re, len, 0, &s, NULL, err);
    if (rc) return rc;
    /* the start must be a nonterminal; wrap a bare terminal */
    if (s < 0) {
        int32_t nt = di_cfg_nt(g, NULL);
        di_cfg_rule(g, nt, &s, 1);
        s = nt;
    }
    *start = s;
    return DI_OK;
}
