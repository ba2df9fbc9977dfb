/* JSON Schema front-end; what is supported is listed in json_schema.h. */
#include "grammar/json_schema.h"

#include <jansson.h>
#include <math.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/regex.h"

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
    int32_t string, strchar, number, integer, value, boolean, null;
    int32_t num_cache[3];   /* integer >= 0, integer >= 1, number >= 0; -1 until built */
    int32_t fmt_cache[16];  /* per k_formats entry; -1 until built */
} js;

static int32_t fail(js *c, int code, const char *fmt, const char *arg) {
    if (!c->rc) {
        char what[256];
        snprintf(what, sizeof what, fmt, arg);
        c->rc = di_error_set(c->err, code, "json schema at '%s': %s", c->path[0] ? c->path : "#", what);
    }
    return 0;
}

/* ---- memo ---- */

static size_t ptr_hash(const void *p, size_t mask) { return (size_t)(((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull >> 20) & mask; }

static int32_t *memo_slot(js *c, const json_t *k) {
    if (c->memo_n * 2 >= c->memo_cap) {
        size_t cap = c->memo_cap ? c->memo_cap * 2 : 64;
        memo_ent *t = calloc(cap, sizeof *t);
        if (!t) return fail(c, DI_ERR_NOMEM, "%s", "out of memory"), NULL;
        for (size_t i = 0; i < c->memo_cap; i++) {
            if (!c->memo[i].key) continue;
            size_t h = ptr_hash(c->memo[i].key, cap - 1);
            while (t[h].key) h = (h + 1) & (cap - 1);
            t[h] = c->memo[i];
        }
        free(c->memo);
        c->memo = t;
        c->memo_cap = cap;
    }
    size_t h = ptr_hash(k, c->memo_cap - 1);
    while (c->memo[h].key && c->memo[h].key != k) h = (h + 1) & (c->memo_cap - 1);
    if (!c->memo[h].key) {
        c->memo[h].key = k;
        c->memo[h].nt = -1;
        c->memo_n++;
    }
    return &c->memo[h].nt;
}

/* ---- building blocks ---- */

static int32_t rx(js *c, const char *re, unsigned flags) {
    int32_t s = 0;
    if (!c->rc) {
        int rc = di_regex_build(c->g, re, strlen(re), flags, &s, NULL, c->err);
        if (rc) c->rc = di_error_wrap(c->err, "json schema at '%s'", c->path[0] ? c->path : "#");
    }
    return s;
}

static int32_t lit(js *c, const char *s) { return di_cfg_literal(c->g, s, strlen(s)); }

static int32_t seq(js *c, const int32_t *s, size_t n) { return di_cfg_seq(c->g, s, n); }

static int32_t empty(js *c) { return di_cfg_seq(c->g, NULL, 0); }

/* Language with no strings (false schema, impossible combination); pruned by finalize. */
static int32_t nothing(js *c) { return di_cfg_nt(c->g, "<nothing>"); }

static void init_shared(js *c) {
    di_cfg *g = c->g;
    if (c->opts.whitespace == DI_JSON_WS_COMPACT) {
        c->ws = empty(c);
    } else {
        int n = c->opts.max_ws_run > 0 ? c->opts.max_ws_run : 16;
        di_cfg_class sp = {{0}};
        di_cfg_class_add_range(&sp, ' ', ' ');
        di_cfg_class_add_range(&sp, '\t', '\n');
        di_cfg_class_add_range(&sp, '\r', '\r');
        c->ws = di_cfg_repeat(g, di_cfg_class_sym(g, &sp), 0, n);
    }
    c->comma = seq(c, (int32_t[]){c->ws, di_cfg_byte(g, ','), c->ws}, 3);
    c->colon = seq(c, (int32_t[]){c->ws, di_cfg_byte(g, ':'), c->ws}, 3);
    c->lbrace = seq(c, (int32_t[]){di_cfg_byte(g, '{'), c->ws}, 2);
    c->rbrace = seq(c, (int32_t[]){c->ws, di_cfg_byte(g, '}')}, 2);
    c->lbrack = seq(c, (int32_t[]){di_cfg_byte(g, '['), c->ws}, 2);
    c->rbrack = seq(c, (int32_t[]){c->ws, di_cfg_byte(g, ']')}, 2);
    /* one character of a JSON string body, escaped or not */
    c->strchar = rx(c, "[^\"\\\\\\x00-\\x1f]|\\\\([\"\\\\/bfnrt]|u[0-9a-fA-F]{4})", 0);
    int32_t q = di_cfg_byte(g, '"');
    c->string = seq(c, (int32_t[]){q, di_cfg_star(g, c->strchar), q}, 3);
    c->integer = rx(c, "-?(0|[1-9][0-9]*)", 0);
    c->number = rx(c, "-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?", 0);
    c->boolean = rx(c, "true|false", 0);
    c->null = lit(c, "null");
    /* any JSON value: value -> object | array | string | number | true | false | null */
    int32_t v = di_cfg_nt(g, "<json>");
    int32_t member = seq(c, (int32_t[]){c->string, c->colon, v}, 3);
    int32_t members = seq(c, (int32_t[]){member, di_cfg_star(g, seq(c, (int32_t[]){c->comma, member}, 2))}, 2);
    int32_t obj = seq(c, (int32_t[]){c->lbrace, di_cfg_opt(g, members), c->rbrace}, 3);
    int32_t elems = seq(c, (int32_t[]){v, di_cfg_star(g, seq(c, (int32_t[]){c->comma, v}, 2))}, 2);
    int32_t arr = seq(c, (int32_t[]){c->lbrack, di_cfg_opt(g, elems), c->rbrack}, 3);
    int32_t alts[] = {obj, arr, c->string, c->number, c->boolean, c->null};
    for (size_t i = 0; i < 6; i++) di_cfg_rule(g, v, &alts[i], 1);
    c->value = v;
}

/* Alternatives over literal byte strings as a trie, so a 10,000-value enum costs one Earley item
 * per byte instead of predicting 10,000 rules at every step. */
typedef struct lit_ent {
    const char *s;
    size_t n;
} lit_ent;

static int cmp_lit(const void *a, const void *b) {
    const lit_ent *x = a, *y = b;
    size_t n = x->n < y->n ? x->n : y->n;
    int r = memcmp(x->s, y->s, n);
    return r ? r : (x->n > y->n) - (x->n < y->n);
}

/* ents[0..n) sorted, all sharing their first `at` bytes. */
static int32_t lit_trie(js *c, lit_ent *ents, size_t n, size_t at) {
    int32_t nt = di_cfg_nt(c->g, NULL);
    size_t i = 0;
    while (i < n && !c->rc) {
        if (ents[i].n == at) { /* a value ends here */
            di_cfg_rule(c->g, nt, NULL, 0);
            i++;
            continue;
        }
        uint8_t b = (uint8_t)ents[i].s[at];
        size_t j = i;
        while (j < n && ents[j].n > at && (uint8_t)ents[j].s[at] == b) j++;
        int32_t r[2] = {di_cfg_byte(c->g, b), lit_trie(c, ents + i, j - i, at + 1)};
        di_cfg_rule(c->g, nt, r, 2);
        i = j;
    }
    return nt;
}

static int32_t enum_sym(js *c, const json_t *arr) {
    size_t n = json_array_size(arr);
    if (n == 0) return nothing(c);
    lit_ent *ents = calloc(n, sizeof *ents);
    char **strs = calloc(n, sizeof *strs);
    if (!ents || !strs) {
        free(ents);
        free(strs);
        return fail(c, DI_ERR_NOMEM, "%s", "out of memory for enum");
    }
    for (size_t i = 0; i < n; i++) {
        strs[i] = json_dumps(json_array_get(arr, i), JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
        if (!strs[i]) {
            fail(c, DI_ERR_NOMEM, "%s", "out of memory for enum");
            break;
        }
        ents[i] = (lit_ent){strs[i], strlen(strs[i])};
    }
    int32_t r = 0;
    if (!c->rc) {
        qsort(ents, n, sizeof *ents, cmp_lit);
        size_t w = 0; /* drop duplicates */
        for (size_t i = 0; i < n; i++)
            if (!w || cmp_lit(&ents[w - 1], &ents[i])) ents[w++] = ents[i];
        /* the trie recursion depth is the longest value; bound it like any nesting */
        size_t longest = 0;
        for (size_t i = 0; i < w; i++) longest = ents[i].n > longest ? ents[i].n : longest;
        if (longest > 4096) fail(c, DI_ERR_LIMIT, "%s", "enum value longer than 4096 bytes");
        else r = lit_trie(c, ents, w, 0);
    }
    for (size_t i = 0; i < n; i++) free(strs[i]);
    free(strs);
    free(ents);
    return r;
}

/* JSON type name of a value as "type" spells it (integers are also numbers). */
static bool value_has_type(const json_t *v, const char *t) {
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "integer")) return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == (double)(long long)json_real_value(v));
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    return false;
}

/* Does keyword k constrain instances? Unknown keywords and annotations (title, description,
 * examples, vendor extensions, ...) do not: validators ignore them, and so does this compiler. */
static bool constrains(const char *k) {
    static const char *kw[] = {"type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
                               "exclusiveMinimum", "maxLength", "minLength", "pattern", "items", "additionalItems",
                               "prefixItems", "maxItems", "minItems", "uniqueItems", "contains", "minContains",
                               "maxContains", "maxProperties", "minProperties", "required", "properties",
                               "patternProperties", "additionalProperties", "dependencies", "dependentRequired",
                               "dependentSchemas", "propertyNames", "if", "then", "else", "allOf", "anyOf", "oneOf",
                               "not", "$ref", "format", "unevaluatedItems", "unevaluatedProperties", "$dynamicRef",
                               "$recursiveRef"};
    for (size_t i = 0; i < sizeof kw / sizeof kw[0]; i++)
        if (!strcmp(k, kw[i])) return true;
    return false;
}

static int32_t enum_sym(js *c, const json_t *arr);

/* const/enum: the listed values that also satisfy "type" (a value must match every keyword).
 * Other constraining keywords beside them are rejected rather than ignored. */
static int32_t const_enum_sym(js *c, json_t *s, json_t *cst, json_t *en) {
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) if (constrains(k) && strcmp(k, "const") && strcmp(k, "enum") && strcmp(k, "type"))
        return fail(c, DI_ERR_UNSUPPORTED, "keyword '%s' beside const/enum", k);
    json_t *type = json_object_get(s, "type");
    json_t *vals = json_array();
    if (!vals) return fail(c, DI_ERR_NOMEM, "%s", "out of memory");
    if (cst) json_array_append(vals, cst);
    for (size_t i = 0; !cst && i < json_array_size(en); i++) json_array_append(vals, json_array_get(en, i));
    for (size_t i = json_array_size(vals); type && i-- > 0;) {
        json_t *x = json_array_get(vals, i);
        bool ok = false;
        if (json_is_string(type)) ok = value_has_type(x, json_string_value(type));
        for (size_t t = 0; json_is_array(type) && t < json_array_size(type); t++)
            ok = ok || (json_is_string(json_array_get(type, t)) && value_has_type(x, json_string_value(json_array_get(type, t))));
        if (!ok) json_array_remove(vals, i);
    }
    /* an integral real such as 1.0 serializes as "1.0", which is still a valid spelling */
    int32_t r = enum_sym(c, vals);
    json_decref(vals);
    return r;
}

/* ---- keyword handling ---- */

static const char *const k_unsupported[] = {"if",           "then",          "else",
                                            "contains",      "minContains",  "maxContains",   "multipleOf",
                                            "propertyNames", "unevaluatedProperties", "unevaluatedItems",
                                            "$dynamicRef",   "$recursiveRef"};

static int32_t schema_sym(js *c, json_t *s);

static void path_push(js *c, const char *a, const char *b, size_t *save) {
    *save = strlen(c->path);
    size_t room = sizeof c->path - *save;
    if (b) snprintf(c->path + *save, room, "/%s/%s", a, b);
    else snprintf(c->path + *save, room, "/%s", a);
}
static void path_pop(js *c, size_t save) { c->path[save] = 0; }

static int32_t sub(js *c, json_t *s, const char *a, const char *b) {
    size_t save;
    path_push(c, a, b, &save);
    int32_t r = schema_sym(c, s);
    path_pop(c, save);
    return r;
}

/* JSON pointer (RFC 6901) inside the root document. */
static json_t *resolve_ref(js *c, const char *ref) {
    if (ref[0] != '#') return fail(c, DI_ERR_UNSUPPORTED, "$ref '%s' is not local (only '#...' references)", ref), NULL;
    json_t *cur = c->root;
    const char *p = ref + 1;
    if (*p && *p != '/') return fail(c, DI_ERR_UNSUPPORTED, "$ref '%s': anchors are not supported", ref), NULL;
    while (*p == '/') {
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/' && n < sizeof tok - 1) {
            if (p[0] == '~' && p[1] == '0') tok[n++] = '~', p += 2;
            else if (p[0] == '~' && p[1] == '1') tok[n++] = '/', p += 2;
            else if (p[0] == '%' && p[1] && p[2]) { /* URI-escaped pointer characters */
                char hx[3] = {p[1], p[2], 0};
                tok[n++] = (char)strtol(hx, NULL, 16), p += 3;
            } else tok[n++] = *p++;
        }
        tok[n] = 0;
        if (json_is_object(cur)) cur = json_object_get(cur, tok);
        else if (json_is_array(cur)) cur = json_array_get(cur, (size_t)strtoul(tok, NULL, 10));
        else cur = NULL;
        if (!cur) return fail(c, DI_ERR_INVALID, "$ref '%s' does not resolve", ref), NULL;
    }
    return cur;
}

/* String with length bounds or a pattern/format, as the JSON string literal. */
static const struct {
    const char *name, *re;
} k_formats[] = {
    {"date-time", "[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
    /* day ranges per month; February stops at 28 (29 needs the leap-year rule: left out, not wrong) */
    {"date", "[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))"},
    {"time", "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
    {"email", "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"},
    {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
    {"ipv4", "((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"},
    {"hostname", "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"},
    {"uri", "[A-Za-z][A-Za-z0-9+.-]*:[^\\s\"\\\\<>^`{|}]*"},
};

/* Compile-time pattern checks use PCRE2 as an over-approximation of the ECMA-262 patterns this
 * compiler accepts: with UCP, \d \w \s take Unicode (ECMA's \s does; wider \d \w only make a
 * "no match" answer rarer), ALT_BSUX reads \uHHHH and \xHH as ECMA does. A "no match" is what
 * soundness relies on, so PCRE2 may accept more but must not accept less. */
static const uint32_t k_pcre2_opts = PCRE2_UTF | PCRE2_UCP | PCRE2_ALT_BSUX;

/* Shortest match of a regex according to PCRE2 (a lower bound on every match's length in code
 * points); -1 when PCRE2 does not take the pattern. */
static int64_t min_match_len(const char *re) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, k_pcre2_opts, &ec, &eo, NULL);
    if (!code) return -1;
    uint32_t n = 0;
    int rc = pcre2_pattern_info(code, PCRE2_INFO_MINLENGTH, &n);
    pcre2_code_free(code);
    return rc ? -1 : (int64_t)n;
}

/* A pattern ^ATOM QUANT$ with ATOM one character class [...], escape \\x or '.', and QUANT one of
 * nothing, ?, *, +, {n}, {n,}, {n,m}: returns ATOM's length (0 if the pattern has another form)
 * and the count range [*qlo, *qhi] (-1 = unbounded). */
static size_t single_atom(const char *re, int64_t *qlo, int64_t *qhi) {
    size_t n = strlen(re), i = 1;
    if (n < 3 || re[0] != '^' || re[n - 1] != '$' || re[n - 2] == '\\') return 0;
    if (re[i] == '[') {
        i++;
        if (re[i] == '^') i++;
        if (re[i] == ']') i++;
        while (i < n - 1 && re[i] != ']') i += re[i] == '\\' ? 2 : 1;
        if (i >= n - 1) return 0;
        i++;
    } else if (re[i] == '\\' && i + 1 < n - 1) {
        if (strchr("uxcpPkb1234567890", re[i + 1])) return 0; /* multi-character escapes, refs, anchors */
        i += 2;
    } else if (re[i] == '.') {
        i++;
    } else {
        return 0;
    }
    size_t atom = i - 1;
    const char *q = re + i, *end = re + n - 1;
    if (q == end) *qlo = 1, *qhi = 1;
    else if (q + 1 == end && *q == '?') *qlo = 0, *qhi = 1;
    else if (q + 1 == end && *q == '*') *qlo = 0, *qhi = -1;
    else if (q + 1 == end && *q == '+') *qlo = 1, *qhi = -1;
    else if (*q == '{') {
        char *e;
        long long a = strtoll(q + 1, &e, 10), b = a;
        if (e == q + 1 || a < 0) return 0;
        if (*e == ',') {
            char *f;
            b = strtoll(e + 1, &f, 10);
            if (f == e + 1) b = -1;
            else if (b < a) return 0;
            e = f;
        }
        if (*e != '}' || e + 1 != end) return 0;
        *qlo = a, *qhi = b;
    } else return 0;
    return atom;
}

static int32_t string_sym(js *c, json_t *s) {
    json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    int64_t lo = json_is_integer(mn) ? json_integer_value(mn) : 0;
    int64_t hi = json_is_integer(mx) ? json_integer_value(mx) : -1;
    if (lo < 0 || (hi >= 0 && hi < lo)) return nothing(c);
    const char *re = NULL;
    int fmt_i = -1;
    if (json_is_string(fmt)) {
        for (size_t i = 0; i < sizeof k_formats / sizeof k_formats[0]; i++)
            if (!strcmp(json_string_value(fmt), k_formats[i].name)) re = k_formats[i].re, fmt_i = (int)i;
        /* standard formats that validators assert but that are not implemented here are refused;
         * non-standard names (e.g. "int32", "textarea") are annotations and ignored */
        static const char *std[] = {"idn-email", "idn-hostname", "ipv6", "uri-reference", "iri", "iri-reference",
                                    "uri-template", "json-pointer", "relative-json-pointer", "regex", "duration"};
        for (size_t i = 0; !re && i < sizeof std / sizeof std[0]; i++)
            if (!strcmp(json_string_value(fmt), std[i]))
                return fail(c, DI_ERR_UNSUPPORTED, "format '%s' is not supported", std[i]);
    }
    if (json_is_string(pat)) {
        if (re) return fail(c, DI_ERR_UNSUPPORTED, "%s", "pattern together with format");
        re = json_string_value(pat);
    }
    int32_t q = di_cfg_byte(c->g, '"');
    char bounded[1100];
    if (re && ((mn && lo > 0) || (mx && hi >= 0))) {
        /* Length bounds beside a regex: dropped when every match is long enough anyway (PCRE2's
         * minimum match length, a lower bound), or folded into the count of a pattern that is
         * one repeated atom, ^[...]*$ with maxLength 8 -> ^[...]{0,8}$. Otherwise refused: the
         * grammar cannot intersect a regular language with a length. */
        int64_t qlo = 0, qhi = 0;
        size_t atom = json_is_string(pat) ? single_atom(re, &qlo, &qhi) : 0;
        if (hi < 0 && min_match_len(re) >= lo) {
            mn = mx = NULL;
        } else if (atom && atom + 32 < sizeof bounded) {
            int64_t a = lo > qlo ? lo : qlo, b = hi < 0 ? qhi : qhi < 0 ? hi : hi < qhi ? hi : qhi;
            if (b >= 0 && b < a) return nothing(c);
            if (a > 100000 || b > 100000) return fail(c, DI_ERR_LIMIT, "%s", "string length bound above 100000");
            if (b >= 0) snprintf(bounded, sizeof bounded, "^%.*s{%lld,%lld}$", (int)atom, re + 1, (long long)a, (long long)b);
            else snprintf(bounded, sizeof bounded, "^%.*s{%lld,}$", (int)atom, re + 1, (long long)a);
            re = bounded;
            mn = mx = NULL;
        } else {
            return fail(c, DI_ERR_UNSUPPORTED, "%s", "pattern/format together with minLength/maxLength");
        }
    }
    if (re) {
        bool is_pat = json_is_string(pat);
        if (!is_pat && c->fmt_cache[fmt_i] >= 0) return c->fmt_cache[fmt_i];
        int32_t body;
        di_regex_info info;
        int rc = di_regex_build(c->g, re, strlen(re), DI_REGEX_JSON_STRING, &body, &info, c->err);
        if (rc) {
            c->rc = di_error_wrap(c->err, "json schema at '%s' pattern", c->path[0] ? c->path : "#");
            return 0;
        }
        /* JSON Schema patterns search (unanchored); format regexes are whole-string */
        if (is_pat) {
            int32_t star = di_cfg_star(c->g, c->strchar);
            int32_t parts[3] = {info.anchored_start ? empty(c) : star, body, info.anchored_end ? empty(c) : star};
            body = seq(c, parts, 3);
        }
        int32_t r = seq(c, (int32_t[]){q, body, q}, 3);
        if (!is_pat) c->fmt_cache[fmt_i] = r;
        return r;
    }
    if (!mn && !mx) return c->string;
    int32_t ch = c->strchar;
    if (hi > 100000 || lo > 100000) return fail(c, DI_ERR_LIMIT, "%s", "string length bound above 100000");
    return seq(c, (int32_t[]){q, di_cfg_repeat(c->g, ch, lo, hi), q}, 3);
}

/* ---- integer ranges as digit grammars ---- */

static int32_t digit_class(js *c, int lo, int hi) { return di_cfg_range(c->g, (uint8_t)('0' + lo), (uint8_t)('0' + hi)); }

/* Decimal strings of exactly n digits (leading zeros allowed here) with value in [lo, hi], given
 * as digit arrays. Classic split: common leading digit, else lo's branch, a free middle, hi's branch. */
static int32_t same_len_range(js *c, const char *lo, const char *hi, size_t n) {
    if (n == 0) return empty(c);
    if (n == 1) return digit_class(c, lo[0] - '0', hi[0] - '0');
    int32_t nt = di_cfg_nt(c->g, NULL);
    if (lo[0] == hi[0]) {
        int32_t r[2] = {digit_class(c, lo[0] - '0', lo[0] - '0'), same_len_range(c, lo + 1, hi + 1, n - 1)};
        di_cfg_rule(c->g, nt, r, 2);
        return nt;
    }
    char nines[24], zeros[24];
    memset(nines, '9', n - 1);
    memset(zeros, '0', n - 1);
    int32_t r1[2] = {digit_class(c, lo[0] - '0', lo[0] - '0'), same_len_range(c, lo + 1, nines, n - 1)};
    di_cfg_rule(c->g, nt, r1, 2);
    if (hi[0] - lo[0] > 1) {
        int32_t r2[2] = {digit_class(c, lo[0] - '0' + 1, hi[0] - '0' - 1), di_cfg_repeat(c->g, digit_class(c, 0, 9), (int64_t)n - 1, (int64_t)n - 1)};
        di_cfg_rule(c->g, nt, r2, 2);
    }
    int32_t r3[2] = {digit_class(c, hi[0] - '0', hi[0] - '0'), same_len_range(c, zeros, hi + 1, n - 1)};
    di_cfg_rule(c->g, nt, r3, 2);
    return nt;
}

/* Canonical decimals (no leading zeros) of the non-negative integers in [lo, hi]; hi < 0 means
 * unbounded. lo <= hi when bounded. */
static int32_t nonneg_range(js *c, int64_t lo, int64_t hi) {
    int32_t nt = di_cfg_nt(c->g, NULL);
    char a[24], b[24];
    int la = snprintf(a, sizeof a, "%lld", (long long)lo);
    int lb = hi >= 0 ? snprintf(b, sizeof b, "%lld", (long long)hi) : la;
    for (int len = la; len <= lb && !c->rc; len++) {
        /* the slice of [lo, hi] with exactly len digits */
        char x[24], y[24];
        if (len == la) memcpy(x, a, (size_t)la + 1);
        else x[0] = '1', memset(x + 1, '0', (size_t)len - 1), x[len] = 0;
        if (hi >= 0 && len == lb) memcpy(y, b, (size_t)lb + 1);
        else memset(y, '9', (size_t)len), y[len] = 0;
        int32_t r = same_len_range(c, x, y, (size_t)len);
        di_cfg_rule(c->g, nt, &r, 1);
    }
    if (hi < 0) { /* every longer number: [1-9][0-9]{la,} */
        int32_t r[2] = {digit_class(c, 1, 9), di_cfg_repeat(c->g, digit_class(c, 0, 9), la, -1)};
        di_cfg_rule(c->g, nt, r, 2);
    }
    return nt;
}

/* Integers in [lo, hi] (has_lo/has_hi false = unbounded on that side). */
static int32_t int_range(js *c, bool has_lo, int64_t lo, bool has_hi, int64_t hi) {
    if (has_lo && has_hi && lo > hi) return nothing(c);
    int32_t nt = di_cfg_nt(c->g, NULL);
    /* zero and positives */
    if (!has_hi || hi >= 0) {
        int32_t r = nonneg_range(c, has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1);
        di_cfg_rule(c->g, nt, &r, 1);
    }
    /* negatives: "-" then the magnitude in [max(1, -hi), -lo] */
    if (!has_lo || lo < 0) {
        int64_t mlo = has_hi && hi < 0 ? -hi : 1, mhi = has_lo ? -lo : -1;
        int32_t r[2] = {di_cfg_byte(c->g, '-'), nonneg_range(c, mlo, mhi)};
        di_cfg_rule(c->g, nt, r, 2);
    }
    return nt;
}

/* A numeric bound as an integer limit: minimum m -> ceil(m), exclusiveMinimum m -> floor(m)+1
 * (and the mirror for maxima). Both draft-4 (boolean exclusive flags) and draft-6+ forms. */
/* The tighter of minimum/exclusiveMinimum (or the maxima): draft 4 boolean exclusive flags and
 * draft 6+ numeric ones. Returns false when there is no bound on that side. */
static bool num_bound(js *c, json_t *s, bool upper, double *val, bool *excl) {
    const char *inc = upper ? "maximum" : "minimum", *exc = upper ? "exclusiveMaximum" : "exclusiveMinimum";
    json_t *vi = json_object_get(s, inc), *ve = json_object_get(s, exc);
    bool have = false;
    if (json_is_number(vi)) have = true, *val = json_number_value(vi), *excl = json_is_true(ve);
    if (json_is_number(ve)) {
        double e = json_number_value(ve);
        if (!have || (upper ? e <= *val : e >= *val)) *val = e, *excl = true;
        have = true;
    }
    if (have && (*val > 9e15 || *val < -9e15)) return fail(c, DI_ERR_UNSUPPORTED, "%s", "numeric bound beyond +-9e15"), false;
    return have;
}

/* A numeric bound as an integer limit: minimum m -> ceil(m), exclusiveMinimum m -> floor(m)+1
 * (and the mirror for maxima). */
static bool int_bound(js *c, json_t *s, bool upper, int64_t *out) {
    double best = 0;
    bool excl = false;
    if (!num_bound(c, s, upper, &best, &excl)) return false;
    double f = upper ? floor(best) : ceil(best);
    if (excl && f == best) f += upper ? -1 : 1;
    *out = (int64_t)f;
    return true;
}

/* Magnitudes [lo, hi] (hi unbounded when !has_hi) as canonical digits, or NULL-language. */
static int32_t mag_range(js *c, int64_t lo, bool has_hi, int64_t hi) {
    if (has_hi && hi < lo) return nothing(c);
    return nonneg_range(c, lo, has_hi ? hi : -1);
}

/* Non-integer numbers between integral bounds, as the union of four exact pieces (no exponent:
 * a subset of the valid spellings): k and k.ddd for x >= 0, -k and -k.ddd for x < 0. A piece
 * with a fraction keeps only integer parts k whose whole interval [k, k+1) (or (-(k+1), -k])
 * lies inside the bounds. */
static int32_t bounded_number(js *c, bool has_lo, int64_t lo, bool ex_lo, bool has_hi, int64_t hi, bool ex_hi) {
    di_cfg *g = c->g;
    int32_t nt = di_cfg_nt(g, NULL);
    int32_t frac = seq(c, (int32_t[]){di_cfg_byte(g, '.'), di_cfg_plus(g, digit_class(c, 0, 9))}, 2);
    int32_t minus = di_cfg_byte(g, '-');
    int64_t low_int = has_lo ? (ex_lo ? lo + 1 : lo) : 0; /* smallest allowed integer (when >= 0) */
    if (!has_hi || hi >= 0) {
        int64_t k_lo = low_int > 0 ? low_int : 0;
        int32_t a = mag_range(c, k_lo, has_hi, has_hi ? (ex_hi ? hi - 1 : hi) : 0);
        int32_t b = seq(c, (int32_t[]){mag_range(c, k_lo, has_hi, hi - 1), frac}, 2);
        di_cfg_rule(g, nt, &a, 1);
        di_cfg_rule(g, nt, &b, 1);
    }
    if (!has_lo || lo < 0) {
        int64_t c_lo = has_hi ? (ex_hi ? -hi + 1 : -hi) : 1, d_lo = c_lo;
        if (c_lo < 1) c_lo = 1;
        if (d_lo < 0) d_lo = 0;
        int32_t cc = seq(c, (int32_t[]){minus, mag_range(c, c_lo, has_lo, has_lo ? (ex_lo ? -lo - 1 : -lo) : 0)}, 2);
        int32_t d = seq(c, (int32_t[]){minus, mag_range(c, d_lo, has_lo, -lo - 1), frac}, 3);
        di_cfg_rule(g, nt, &cc, 1);
        di_cfg_rule(g, nt, &d, 1);
    }
    return nt;
}

static int32_t number_sym(js *c, json_t *s, bool integer) {
    static const char *bounds[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    bool any = false;
    for (size_t i = 0; i < 4; i++) {
        json_t *b = json_object_get(s, bounds[i]);
        if (b && !json_is_number(b) && !json_is_boolean(b))
            return fail(c, DI_ERR_INVALID, "numeric bound '%s' is not a number", bounds[i]);
        if (json_is_number(b)) any = true;
    }
    if (!any) return integer ? c->integer : c->number;
    if (integer) {
        int64_t lo = 0, hi = 0;
        bool has_lo = int_bound(c, s, false, &lo), has_hi = !c->rc && int_bound(c, s, true, &hi);
        if (c->rc) return 0;
        return int_range(c, has_lo, lo, has_hi, hi);
    }
    /* numbers: integral bounds only (e.g. 0..1, 0..100); fractional bounds are refused */
    double lo = 0, hi = 0;
    bool ex_lo = false, ex_hi = false;
    bool has_lo = num_bound(c, s, false, &lo, &ex_lo), has_hi = !c->rc && num_bound(c, s, true, &hi, &ex_hi);
    if (c->rc) return 0;
    if ((has_lo && lo != floor(lo)) || (has_hi && hi != floor(hi)))
        return fail(c, DI_ERR_UNSUPPORTED, "%s", "non-integral bound on a non-integer number");
    return bounded_number(c, has_lo, (int64_t)lo, ex_lo, has_hi, (int64_t)hi, ex_hi);
}

/* Code points a free-form key may use: no controls, no '"', and no '\\' (escapes would let
 * "\u0061" spell a declared name "a"; leaving them out keeps the exclusion below exact). */
static void key_chars(di_cpset *s) {
    di_cpset_add(s, 0x20, 0x21);
    di_cpset_add(s, 0x23, 0x5B);
    di_cpset_add(s, 0x5D, 0x10FFFF);
}

/* Code points whose UTF-8 encoding starts with byte b. */
static void remove_lead(di_cpset *s, uint8_t b) {
    uint32_t lo, hi;
    if (b < 0x80) lo = hi = b;
    else if (b >= 0xC2 && b <= 0xDF) lo = (uint32_t)(b & 0x1F) << 6, hi = lo + 0x3F;
    else if (b >= 0xE0 && b <= 0xEF) lo = (uint32_t)(b & 0x0F) << 12, hi = lo + 0xFFF;
    else if (b >= 0xF0 && b <= 0xF4) lo = (uint32_t)(b & 0x07) << 18, hi = lo + 0x3FFFF;
    else return;
    di_cpset c = {0};
    di_cpset_add(&c, lo, hi);
    di_cpset_negate(&c); /* s minus [lo,hi] = s intersected with the complement */
    di_cpset r = {0};
    for (size_t i = 0; i < s->n; i++)
        for (size_t k = 0; k < c.n; k++) {
            uint32_t a = s->r[i][0] > c.r[k][0] ? s->r[i][0] : c.r[k][0];
            uint32_t e = s->r[i][1] < c.r[k][1] ? s->r[i][1] : c.r[k][1];
            if (a <= e) di_cpset_add(&r, a, e);
        }
    di_cpset_free(&c);
    di_cpset_free(s);
    *s = r;
}

/* Trie node over the declared names' bytes: K -> '"' (unless the prefix is a declared name)
 * | b K_child for each child byte | c FREE for a key character c that leaves the trie.
 * Leaving is only offered at character boundaries, so FREE always starts a whole character. */
static int32_t key_node(js *c, const char **names, const size_t *lens, size_t n, size_t at, int32_t free_tail) {
    di_cfg *g = c->g;
    int32_t nt = di_cfg_nt(g, NULL);
    bool exact = false, boundary = true;
    uint8_t kids[256] = {0};
    for (size_t i = 0; i < n; i++) {
        if (lens[i] == at) exact = true;
        else kids[(uint8_t)names[i][at]] = 1;
        if (at > 0 && at < lens[i] && ((uint8_t)names[i][at] & 0xC0) == 0x80) boundary = false;
    }
    if (!exact) {
        int32_t q = di_cfg_byte(g, '"');
        di_cfg_rule(g, nt, &q, 1);
    }
    for (unsigned b = 0; b < 256 && !c->rc; b++) {
        if (!kids[b]) continue;
        const char **sub_names = malloc(n * sizeof *sub_names);
        size_t *sub_lens = malloc(n * sizeof *sub_lens), m = 0;
        if (!sub_names || !sub_lens) {
            free(sub_names), free(sub_lens);
            return fail(c, DI_ERR_NOMEM, "%s", "out of memory");
        }
        for (size_t i = 0; i < n; i++)
            if (lens[i] > at && (uint8_t)names[i][at] == b) sub_names[m] = names[i], sub_lens[m++] = lens[i];
        int32_t r[2] = {di_cfg_byte(g, (uint8_t)b), key_node(c, sub_names, sub_lens, m, at + 1, free_tail)};
        di_cfg_rule(g, nt, r, 2);
        free(sub_names), free(sub_lens);
    }
    if (boundary) {
        di_cpset s = {0};
        key_chars(&s);
        for (unsigned b = 0; b < 256; b++)
            if (kids[b]) remove_lead(&s, (uint8_t)b);
        int32_t r[2] = {di_cpset_sym(g, &s, 0), free_tail};
        di_cpset_free(&s);
        di_cfg_rule(g, nt, r, 2);
    }
    return nt;
}

/* A JSON string key that is not one of the declared property names. */
static int32_t other_key(js *c, json_t *props) {
    size_t n = json_object_size(props), k = 0;
    const char **names = malloc((n ? n : 1) * sizeof *names);
    size_t *lens = malloc((n ? n : 1) * sizeof *lens);
    if (!names || !lens) {
        free(names), free(lens);
        return fail(c, DI_ERR_NOMEM, "%s", "out of memory");
    }
    const char *key;
    json_t *v;
    json_object_foreach(props, key, v) {
        names[k] = key;
        lens[k++] = strlen(key);
        if (lens[k - 1] > 1024) {
            free(names), free(lens);
            return fail(c, DI_ERR_LIMIT, "%s", "property name longer than 1024 bytes");
        }
    }
    di_cpset s = {0};
    key_chars(&s);
    int32_t kc = di_cpset_sym(c->g, &s, 0);
    di_cpset_free(&s);
    int32_t free_tail = seq(c, (int32_t[]){di_cfg_star(c->g, kc), di_cfg_byte(c->g, '"')}, 2);
    int32_t body = key_node(c, names, lens, n, 0, free_tail);
    free(names), free(lens);
    return seq(c, (int32_t[]){di_cfg_byte(c->g, '"'), body}, 2);
}

/* A schema that constrains nothing (true, or only annotations). */
static bool trivial(const json_t *s) {
    if (json_is_true(s)) return true;
    if (!json_is_object(s)) return false;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v) if (constrains(k)) return false;
    return true;
}

static int pattern_matches(const char *pat, const char *v, size_t vn);

/* A member key matching a patternProperties regex (searched, like "pattern"), as a JSON string. */
static int32_t pattern_key(js *c, const char *re) {
    int32_t body;
    di_regex_info info;
    if (di_regex_build(c->g, re, strlen(re), DI_REGEX_JSON_STRING, &body, &info, c->err)) {
        c->rc = di_error_wrap(c->err, "json schema at '%s' patternProperties", c->path[0] ? c->path : "#");
        return 0;
    }
    int32_t star = di_cfg_star(c->g, c->strchar), q = di_cfg_byte(c->g, '"');
    int32_t parts[5] = {q, info.anchored_start ? empty(c) : star, body, info.anchored_end ? empty(c) : star, q};
    return seq(c, parts, 5);
}

/* patternProperties is compiled soundly when at most one distinct non-trivial schema is attached
 * to its patterns (a key matching two patterns must satisfy both) and every declared name that a
 * pattern matches (checked with PCRE2) has that pattern's schema, or both are trivial (a generated
 * pattern key may spell a declared name, and a declared member is also checked by the pattern).
 * Returns the shared non-trivial schema (NULL when all are trivial); sets c->rc on refusal. */
static json_t *check_patterns(js *c, json_t *pp, json_t *props) {
    json_t *shared = NULL;
    const char *re;
    json_t *ps;
    json_object_foreach(pp, re, ps) {
        if (!json_is_object(ps) && !json_is_boolean(ps))
            return fail(c, DI_ERR_INVALID, "patternProperties '%s' is not a schema", re), NULL;
        if (trivial(ps)) continue;
        if (shared && !json_equal(shared, ps))
            return fail(c, DI_ERR_UNSUPPORTED, "%s",
                        "keyword 'patternProperties' with several different non-trivial schemas (a key may match two)"),
                   NULL;
        shared = ps;
    }
    json_object_foreach(pp, re, ps) {
        const char *name;
        json_t *nv;
        json_object_foreach(props, name, nv) {
            int m = pattern_matches(re, name, strlen(name));
            if (m == 0 || json_equal(nv, ps) || (trivial(nv) && trivial(ps))) continue;
            return fail(c, DI_ERR_UNSUPPORTED,
                        m < 0 ? "keyword 'patternProperties': pattern '%s' is not understood by PCRE2"
                              : "keyword 'patternProperties': pattern matches declared property '%s' with another schema",
                        m < 0 ? re : name),
                   NULL;
        }
    }
    return shared;
}

static int32_t object_sym(js *c, json_t *s) {
    di_cfg *g = c->g;
    json_t *props = json_object_get(s, "properties");
    json_t *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    json_t *pp = json_object_get(s, "patternProperties");
    json_t *mnp = json_object_get(s, "minProperties"), *mxp = json_object_get(s, "maxProperties");
    if (props && !json_is_object(props)) return fail(c, DI_ERR_INVALID, "%s", "properties is not an object");
    if (pp && !json_is_object(pp)) return fail(c, DI_ERR_INVALID, "%s", "patternProperties is not an object");
    if (!json_object_size(pp)) pp = NULL;
    /* a required name without a declared schema is governed by the pattern it matches, else by
     * additionalProperties: declare it with that schema (after the declared ones) so it is
     * generated and excluded from extra keys */
    json_t *all = NULL;
    for (size_t r = 0; r < json_array_size(req); r++) {
        const char *name = json_string_value(json_array_get(req, r));
        if (!name || json_object_get(props, name) || (all && json_object_get(all, name))) continue;
        if (!all) {
            all = json_object();
            if (!all) return fail(c, DI_ERR_NOMEM, "%s", "out of memory");
            json_array_append_new(c->keep, all);
            if (props) json_object_update(all, props);
        }
        json_t *gov = NULL;
        const char *re;
        json_t *ps;
        json_object_foreach(pp, re, ps) {
            int m = pattern_matches(re, name, strlen(name));
            if (m < 0) return fail(c, DI_ERR_UNSUPPORTED, "keyword 'patternProperties': pattern '%s' is not understood by PCRE2", re);
            if (m && (!gov || trivial(gov))) gov = ps;
        }
        json_object_set(all, name, gov ? gov : addl ? addl : json_true());
    }
    if (all) props = all;
    size_t n = props ? json_object_size(props) : 0;
    json_t *shared = pp ? check_patterns(c, pp, props) : NULL;
    if (c->rc) return 0;
    /* min/maxProperties: compiled when implied by required names / the closed member list, and
     * minProperties 1 by a "nothing written yet" chain; other counts are refused */
    size_t n_req = 0;
    json_t *pk;
    const char *pname;
    json_object_foreach(props, pname, pk) {
        for (size_t r = 0; r < json_array_size(req); r++)
            if (json_is_string(json_array_get(req, r)) && !strcmp(json_string_value(json_array_get(req, r)), pname)) {
                n_req++;
                break;
            }
    }
    bool closed = json_is_false(addl) && !pp;
    bool non_empty = false;
    if (mnp) {
        if (!json_is_integer(mnp)) return fail(c, DI_ERR_INVALID, "%s", "minProperties is not an integer");
        json_int_t m = json_integer_value(mnp);
        if (m > (json_int_t)n_req) {
            if (m > 1) return fail(c, DI_ERR_UNSUPPORTED, "%s", "keyword 'minProperties' above 1 and above the required count");
            non_empty = true;
        }
    }
    if (mxp) {
        if (!json_is_integer(mxp)) return fail(c, DI_ERR_INVALID, "%s", "maxProperties is not an integer");
        json_int_t m = json_integer_value(mxp);
        if (m < (json_int_t)n_req) return nothing(c);
        if (!closed || (json_int_t)n > m)
            return fail(c, DI_ERR_UNSUPPORTED, "%s", "keyword 'maxProperties' not implied by a closed property list");
    }
    /* P[k][e]: members k..n-1 remain; e = a member was already written (a comma comes first).
     * Q[k]: members k..n-1 remain, none written yet, at least one must be (minProperties 1). */
    int32_t(*P)[3] = calloc(n + 1, sizeof *P);
    if (!P) return fail(c, DI_ERR_NOMEM, "%s", "out of memory");
    for (size_t k = 0; k <= n; k++) P[k][0] = di_cfg_nt(g, NULL), P[k][1] = di_cfg_nt(g, NULL), P[k][2] = di_cfg_nt(g, NULL);
    /* tail: additional members. Free keys (none of the declared names) take additionalProperties;
     * a free key might match a pattern, so free keys are offered only when every pattern's schema
     * is trivial. Pattern keys take their pattern's schema. */
    int32_t member = di_cfg_nt(g, NULL);
    bool extra = false;
    bool free_keys = !json_is_false(addl) && !shared;
    if (free_keys) {
        int32_t av = addl && json_is_object(addl) ? sub(c, addl, "additionalProperties", NULL) : c->value;
        int32_t key = n ? other_key(c, props) : c->string;
        int32_t r[3] = {key, c->colon, av};
        di_cfg_rule(g, member, r, 3);
        extra = true;
    }
    const char *re;
    json_t *ps;
    json_object_foreach(pp, re, ps) {
        if (c->rc || (free_keys && trivial(ps) && (!addl || trivial(addl)))) continue; /* already covered */
        int32_t r[3] = {pattern_key(c, re), c->colon, sub(c, ps, "patternProperties", re)};
        di_cfg_rule(g, member, r, 3);
        extra = true;
    }
    if (extra) {
        int32_t more = di_cfg_star(g, seq(c, (int32_t[]){c->comma, member}, 2));
        di_cfg_rule(g, P[n][1], &more, 1);
        int32_t first = seq(c, (int32_t[]){member, more}, 2);
        di_cfg_rule(g, P[n][2], &first, 1);
        int32_t opt = di_cfg_opt(g, first);
        di_cfg_rule(g, P[n][0], &opt, 1);
    } else {
        di_cfg_rule(g, P[n][0], NULL, 0);
        di_cfg_rule(g, P[n][1], NULL, 0);
        int32_t none = nothing(c);
        di_cfg_rule(g, P[n][2], &none, 1);
    }
    size_t k = 0;
    const char *key;
    json_object_foreach(props, key, ps) {
        bool required = false;
        for (size_t r = 0; r < json_array_size(req); r++)
            if (json_is_string(json_array_get(req, r)) && !strcmp(json_string_value(json_array_get(req, r)), key))
                required = true;
        json_t *ks = json_string(key);
        char *qk = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL; /* the key as a JSON string literal */
        json_decref(ks);
        if (!qk) {
            free(P);
            return fail(c, DI_ERR_NOMEM, "%s", "out of memory");
        }
        int32_t v = sub(c, ps, "properties", key);
        int32_t mem = seq(c, (int32_t[]){lit(c, qk), c->colon, v}, 3);
        free(qk);
        for (int e = 0; e < 2; e++) {
            int32_t with[3] = {c->comma, mem, P[k + 1][1]};
            di_cfg_rule(g, P[k][e], e ? with : with + 1, e ? 3 : 2);
            if (!required) di_cfg_rule(g, P[k][e], &P[k + 1][e], 1);
        }
        int32_t first[2] = {mem, P[k + 1][1]};
        di_cfg_rule(g, P[k][2], first, 2);
        if (!required) di_cfg_rule(g, P[k][2], &P[k + 1][2], 1);
        k++;
    }
    int32_t body = P[0][non_empty ? 2 : 0];
    free(P);
    return seq(c, (int32_t[]){c->lbrace, body, c->rbrace}, 3);
}

static int32_t array_sym(js *c, json_t *s) {
    di_cfg *g = c->g;
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    json_t *addi = json_object_get(s, "additionalItems");
    json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
    json_t *uq = json_object_get(s, "uniqueItems");
    if (json_is_true(uq)) return fail(c, DI_ERR_UNSUPPORTED, "%s", "uniqueItems: true");
    int64_t lo = json_is_integer(mn) ? json_integer_value(mn) : 0;
    int64_t hi = json_is_integer(mx) ? json_integer_value(mx) : -1;
    if (lo < 0 || (hi >= 0 && hi < lo)) return nothing(c);
    if (lo > 100000 || hi > 100000) return fail(c, DI_ERR_LIMIT, "%s", "array length bound above 100000");
    json_t *rest = NULL; /* schema for items after the prefix; NULL = any value */
    const char *rest_kw = "items";
    if (json_is_array(items)) { /* draft 4-7 tuple form */
        prefix = items;
        rest = addi;
        rest_kw = "additionalItems";
    } else {
        rest = items;
    }
    size_t np = json_is_array(prefix) ? json_array_size(prefix) : 0;
    int32_t rest_sym = rest ? (json_is_false(rest) ? -1 : sub(c, rest, rest_kw, NULL)) : c->value;
    /* A[j][e]: j prefix items written (e = at least one element written, a comma comes next) */
    int32_t *A = calloc(np + 1, sizeof *A);
    if (!A) return fail(c, DI_ERR_NOMEM, "%s", "out of memory");
    for (size_t j = 0; j <= np; j++) A[j] = di_cfg_nt(g, NULL);
    /* after the prefix: count bounds apply to the remaining elements */
    int64_t rlo = lo > (int64_t)np ? lo - (int64_t)np : 0, rhi = hi < 0 ? -1 : hi - (int64_t)np;
    int32_t tail_first, tail_more;
    if (rest_sym == -1 || rhi == 0) {
        tail_first = rlo > 0 ? nothing(c) : empty(c);
        tail_more = tail_first;
    } else {
        int32_t ce = seq(c, (int32_t[]){c->comma, rest_sym}, 2);
        /* after at least one element: (, x){rlo, rhi} */
        tail_more = di_cfg_repeat(g, ce, rlo, rhi);
        /* at the very start (no prefix): x (, x){rlo-1, rhi-1} or, if rlo == 0, also nothing */
        int32_t one = seq(c, (int32_t[]){rest_sym, di_cfg_repeat(g, ce, rlo ? rlo - 1 : 0, rhi < 0 ? -1 : rhi - 1)}, 2);
        tail_first = rlo ? one : di_cfg_opt(g, one);
    }
    for (size_t j = 0; j <= np && !c->rc; j++) {
        bool may_stop = (int64_t)j >= lo;
        if (j == np) {
            di_cfg_rule(g, A[j], j ? &tail_more : &tail_first, 1);
            continue;
        }
        if (hi >= 0 && (int64_t)j >= hi) { /* maxItems reached inside the prefix */
            di_cfg_rule(g, A[j], NULL, 0);
            continue;
        }
        char idx[24];
        snprintf(idx, sizeof idx, "%zu", j);
        int32_t item = sub(c, json_array_get(prefix, j), "prefixItems", idx);
        int32_t r[3] = {c->comma, item, A[j + 1]};
        di_cfg_rule(g, A[j], j ? r : r + 1, j ? 3 : 2);
        if (may_stop) di_cfg_rule(g, A[j], NULL, 0);
    }
    int32_t body = A[0];
    free(A);
    return seq(c, (int32_t[]){c->lbrack, body, c->rbrack}, 3);
}

/* allOf: merge the parts into one schema when their keywords do not overlap (other than
 * required, which unions, and type, which must agree); otherwise reject. */
static json_t *merge_allof(js *c, json_t *s) {
    json_t *m = json_deep_copy(s);
    if (!m) return NULL;
    json_object_del(m, "allOf");
    json_t *parts = json_object_get(s, "allOf");
    for (size_t i = 0; i < json_array_size(parts) && !c->rc; i++) {
        json_t *p = json_array_get(parts, i);
        json_t *ref = json_object_get(p, "$ref");
        if (ref && json_is_string(ref)) p = resolve_ref(c, json_string_value(ref));
        if (!p || !json_is_object(p)) {
            if (!json_is_true(p)) fail(c, DI_ERR_UNSUPPORTED, "%s", "allOf part that is not an object schema");
            continue;
        }
        const char *k;
        json_t *v;
        json_object_foreach(p, k, v) {
            json_t *have = json_object_get(m, k);
            if (!have) {
                json_object_set(m, k, v);
            } else if (!strcmp(k, "required") && json_is_array(have) && json_is_array(v)) {
                json_t *u = json_deep_copy(have);
                json_array_extend(u, v);
                json_object_set_new(m, k, u);
            } else if (!strcmp(k, "properties") && json_is_object(have) && json_is_object(v)) {
                json_t *u = json_deep_copy(have);
                const char *pk;
                json_t *pv;
                json_object_foreach(v, pk, pv) {
                    json_t *prev = json_object_get(u, pk);
                    if (prev && !json_equal(prev, pv)) { /* both constrain the value: allOf of the two */
                        json_t *both = json_pack("{s:[O,O]}", "allOf", prev, pv);
                        if (!both) {
                            json_decref(u);
                            json_decref(m);
                            return fail(c, DI_ERR_NOMEM, "%s", "out of memory"), NULL;
                        }
                        json_object_set_new(u, pk, both);
                        continue;
                    }
                    json_object_set(u, pk, pv);
                }
                json_object_set_new(m, k, u);
            } else if (!json_equal(have, v) && constrains(k)) { /* differing annotations: keep the first */
                json_decref(m);
                return fail(c, DI_ERR_UNSUPPORTED, "allOf: keyword '%s' appears in more than one part", k), NULL;
            }
        }
    }
    /* Each part validates on its own: a part that closes its object (additionalProperties not
     * true) forbids every property it does not declare, even ones another part adds. Merging is
     * only sound when every closed part declares all merged properties. */
    json_t *mprops = json_object_get(m, "properties");
    for (size_t i = 0; i <= json_array_size(parts) && !c->rc; i++) {
        json_t *p = i < json_array_size(parts) ? json_array_get(parts, i) : s;
        json_t *ref = json_object_get(p, "$ref");
        if (ref && json_is_string(ref)) p = resolve_ref(c, json_string_value(ref));
        json_t *ap = json_object_get(p, "additionalProperties");
        if (!json_is_object(p) || !ap || json_is_true(ap)) continue;
        json_t *pp = json_object_get(p, "properties");
        const char *pk;
        json_t *pv;
        json_object_foreach(mprops, pk, pv) if (!json_object_get(pp, pk)) {
            fail(c, DI_ERR_UNSUPPORTED, "allOf: property '%s' is added where another part closes the object", pk);
            json_decref(m); /* after the message: pk lives in m */
            return NULL;
        }
    }
    if (c->rc) {
        json_decref(m);
        return NULL;
    }
    return m;
}

/* ---- oneOf: proving that no value matches two branches ---- */

/* Types a schema admits, as bits of k_type_names (integer is a subset of number: its own bit, and
 * "number" sets both). Without "type", the types of const/enum values, else all. */
static const char *const k_type_names[] = {"string", "number", "integer", "boolean", "null", "object", "array"};

static unsigned value_type_bits(const json_t *v) {
    unsigned b = 0;
    for (unsigned k = 0; k < 7; k++)
        if (value_has_type(v, k_type_names[k])) b |= 1u << k;
    return b;
}

static unsigned type_bits_of(const json_t *t) {
    unsigned bits = 0;
    for (size_t i = 0; i < (json_is_array(t) ? json_array_size(t) : 1); i++) {
        const char *n = json_string_value(json_is_array(t) ? json_array_get(t, i) : t);
        for (unsigned k = 0; n && k < 7; k++)
            if (!strcmp(n, k_type_names[k])) bits |= (k == 1 ? 6u : 1u << k);
    }
    return bits;
}

static unsigned type_bits(const json_t *s) {
    if (json_is_false(s)) return 0;
    if (!json_is_object(s)) return 0x7f;
    json_t *t = json_object_get(s, "type"), *cst = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    unsigned bits = 0x7f;
    if (json_is_string(t) || json_is_array(t)) {
        bits = 0;
        for (size_t i = 0; i < (json_is_array(t) ? json_array_size(t) : 1); i++) {
            const char *n = json_string_value(json_is_array(t) ? json_array_get(t, i) : t);
            for (unsigned k = 0; n && k < 7; k++)
                if (!strcmp(n, k_type_names[k])) bits |= (k == 1 ? 6u : 1u << k);
        }
    }
    if (cst || json_is_array(en)) {
        unsigned vb = 0;
        if (cst) vb = value_type_bits(cst);
        for (size_t i = 0; !cst && i < json_array_size(en); i++) vb |= value_type_bits(json_array_get(en, i));
        bits &= vb;
    }
    return bits;
}

/* Follows a chain of $ref (bounded); NULL when it does not resolve locally. */
static json_t *deref(js *c, json_t *s) {
    for (int hops = 0; json_is_object(s) && json_is_string(json_object_get(s, "$ref")) && hops < 32; hops++) {
        const char *r = json_string_value(json_object_get(s, "$ref"));
        if (r[0] != '#') return NULL;
        int save = c->rc;
        s = resolve_ref(c, r);
        if (!save && c->rc) { /* a probe, not an error: leave the refusal to compilation */
            c->rc = 0;
            return NULL;
        }
    }
    return s;
}

/* Does the JSON string v match the ECMA-262-ish pattern? -1 when PCRE2 cannot decide (bad pattern). */
static int pattern_matches(const char *pat, const char *v, size_t vn) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, k_pcre2_opts, &ec, &eo, NULL);
    if (!re) return -1;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc = md ? pcre2_match(re, (PCRE2_SPTR)v, vn, 0, 0, md, NULL) : -1000;
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc >= 0 ? 1 : rc == PCRE2_ERROR_NOMATCH ? 0 : -1;
}

/* false only when the value provably fails schema s (type, const/enum, pattern, length, required,
 * a property's value); true when it matches or when this check cannot tell. */
static bool may_match(js *c, const json_t *v, json_t *s, int depth) {
    s = deref(c, s);
    if (!s || depth > 8) return true;
    if (json_is_boolean(s)) return json_is_true(s);
    if (!json_is_object(s)) return true;
    unsigned tb = type_bits(s), vb = value_type_bits(v);
    if (!(tb & vb)) return false;
    json_t *cst = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    if (cst && !json_equal(cst, v)) return false;
    if (json_is_array(en)) {
        bool in = false;
        for (size_t i = 0; i < json_array_size(en) && !in; i++) in = json_equal(json_array_get(en, i), v);
        if (!in) return false;
    }
    if (json_is_string(v)) {
        const char *sv = json_string_value(v);
        size_t n = json_string_length(v), cps = 0;
        for (size_t i = 0; i < n; i++) cps += ((uint8_t)sv[i] & 0xC0) != 0x80;
        json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
        if (json_is_integer(mn) && (json_int_t)cps < json_integer_value(mn)) return false;
        if (json_is_integer(mx) && (json_int_t)cps > json_integer_value(mx)) return false;
        json_t *pat = json_object_get(s, "pattern");
        if (json_is_string(pat) && pattern_matches(json_string_value(pat), sv, n) == 0) return false;
    }
    if (json_is_object(v)) {
        json_t *req = json_object_get(s, "required"), *props = json_object_get(s, "properties");
        for (size_t i = 0; i < json_array_size(req); i++) {
            const char *name = json_string_value(json_array_get(req, i));
            if (name && !json_object_get(v, name)) return false;
        }
        const char *k;
        json_t *pv;
        json_object_foreach((json_t *)v, k, pv) {
            json_t *ps = json_object_get(props, k);
            if (ps && !may_match(c, pv, ps, depth + 1)) return false;
        }
    }
    return true;
}

/* No value matches both a and b: their types do not overlap, every const/enum value of one fails
 * the other, or both require a property whose schemas are disjoint (a discriminator). */
static bool disjoint(js *c, json_t *a, json_t *b, int depth) {
    a = deref(c, a), b = deref(c, b);
    if (!a || !b || depth > 8) return false;
    if (json_is_false(a) || json_is_false(b)) return true;
    if (!json_is_object(a) || !json_is_object(b)) return false;
    if (!(type_bits(a) & type_bits(b))) return true;
    for (int side = 0; side < 2; side++) {
        json_t *x = side ? b : a, *y = side ? a : b;
        json_t *cst = json_object_get(x, "const"), *en = json_object_get(x, "enum");
        if (!cst && !json_is_array(en)) continue;
        bool all_fail = true;
        if (cst) all_fail = !may_match(c, cst, y, 0);
        for (size_t i = 0; !cst && all_fail && i < json_array_size(en); i++)
            all_fail = !may_match(c, json_array_get(en, i), y, 0);
        if (all_fail) return true;
    }
    /* one forbids a property the other requires (properties: {p: false}), on objects only */
    for (int side = 0; side < 2; side++) {
        json_t *x = side ? b : a, *y = side ? a : b;
        json_t *px = json_object_get(x, "properties"), *ry = json_object_get(y, "required");
        bool objects_only = !(type_bits(x) & ~(1u << 5)) || !(type_bits(y) & ~(1u << 5));
        for (size_t i = 0; objects_only && i < json_array_size(ry); i++) {
            const char *name = json_string_value(json_array_get(ry, i));
            if (name && json_is_false(json_object_get(px, name))) return true;
        }
    }
    /* a required property in both, with disjoint schemas (const/enum tags, types) */
    json_t *ra = json_object_get(a, "required"), *rb = json_object_get(b, "required");
    json_t *pa = json_object_get(a, "properties"), *pb = json_object_get(b, "properties");
    if (!(type_bits(a) & ~(1u << 5)) || !(type_bits(b) & ~(1u << 5))) /* both only objects */
        for (size_t i = 0; i < json_array_size(ra); i++) {
            const char *name = json_string_value(json_array_get(ra, i));
            bool in_b = false;
            for (size_t j = 0; name && j < json_array_size(rb) && !in_b; j++)
                in_b = json_is_string(json_array_get(rb, j)) && !strcmp(json_string_value(json_array_get(rb, j)), name);
            json_t *sa = name ? json_object_get(pa, name) : NULL, *sb = name ? json_object_get(pb, name) : NULL;
            if (in_b && sa && sb && disjoint(c, sa, sb, depth + 1)) return true;
        }
    return false;
}

/* oneOf is compiled as anyOf only when no value can match two branches. */
static bool pairwise_disjoint(js *c, json_t *arr) {
    for (size_t i = 0; i < json_array_size(arr); i++)
        for (size_t j = i + 1; j < json_array_size(arr); j++)
            if (!disjoint(c, json_array_get(arr, i), json_array_get(arr, j), 0)) return false;
    return true;
}

/* oneOf branches that differ by which names they require ({required: [a]} | {required: [b]}):
 * branch i is narrowed to forbid, for every other branch j, one name j requires and i does not.
 * The narrowed branch accepts a subset of branch i; it is kept only when it is disjoint from
 * every *original* other branch, so an accepted value matches exactly one original branch.
 * Returns the original array when narrowing does not help (the caller then refuses). */
static bool in_required(json_t *req, const char *name);

static json_t *narrow_oneof(js *c, json_t *branches) {
    size_t n = json_array_size(branches);
    json_t *out = json_array();
    if (!out) return fail(c, DI_ERR_NOMEM, "%s", "out of memory"), NULL;
    json_array_append_new(c->keep, out); /* memo keys are pointers: keep the copies alive */
    for (size_t i = 0; i < n; i++) {
        json_t *bi = json_array_get(branches, i);
        /* deref drops siblings of $ref (wider: fine for proofs, not for a narrowed copy) */
        if (json_is_object(bi) && json_object_get(bi, "$ref")) bi = json_object_size(bi) == 1 ? deref(c, bi) : NULL;
        if (!json_is_object(bi)) return branches;
        json_t *nb = json_deep_copy(bi);
        json_array_append_new(out, nb);
        json_t *req = json_object_get(nb, "required"), *props = json_object_get(nb, "properties");
        if (props && !json_is_object(props)) return branches;
        for (size_t j = 0; j < n; j++) {
            json_t *bj = deref(c, json_array_get(branches, j));
            json_t *rj = json_is_object(bj) ? json_object_get(bj, "required") : NULL;
            for (size_t r = 0; j != i && r < json_array_size(rj); r++) {
                const char *name = json_string_value(json_array_get(rj, r));
                if (!name || in_required(req, name)) continue;
                if (!props) json_object_set_new(nb, "properties", props = json_object());
                json_object_set_new(props, name, json_false());
                /* the forbidden name only separates objects: keep this branch to objects */
                if (!json_object_get(nb, "type")) json_object_set_new(nb, "type", json_string("object"));
                break;
            }
        }
    }
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            if (i != j && !disjoint(c, json_array_get(out, i), json_array_get(branches, j), 0)) return branches;
    return out;
}

static int32_t typed(js *c, json_t *s, const char *t) {
    if (!strcmp(t, "string")) return string_sym(c, s);
    if (!strcmp(t, "number")) return number_sym(c, s, false);
    if (!strcmp(t, "integer")) return number_sym(c, s, true);
    if (!strcmp(t, "boolean")) return c->boolean;
    if (!strcmp(t, "null")) return c->null;
    if (!strcmp(t, "object")) return object_sym(c, s);
    if (!strcmp(t, "array")) return array_sym(c, s);
    return fail(c, DI_ERR_INVALID, "unknown type '%s'", t);
}

static bool trivial(const json_t *s);

static bool in_required(json_t *req, const char *name) {
    for (size_t r = 0; r < json_array_size(req); r++)
        if (json_is_string(json_array_get(req, r)) && !strcmp(json_string_value(json_array_get(req, r)), name)) return true;
    return false;
}

/* dependencies / dependentRequired / dependentSchemas and simple forms of "not", rewritten into
 * keywords the compiler handles. Narrowing is sound (the grammar accepts a subset):
 * - a dependent name list becomes required (exact when the trigger is required, else narrower);
 * - a dependent schema joins allOf when its trigger is required; a trivial one is dropped;
 * - not {type: T} removes T from the types; not {required: [a, ...]} forbids a (narrower);
 *   not {enum/const} removes values from a sibling enum/const; not true = false; not false = true.
 * Anything else is refused. Returns s itself when nothing applies, NULL after fail(). */
static json_t *rewrite(js *c, json_t *s) {
    static const char *dep_kw[] = {"dependencies", "dependentRequired", "dependentSchemas"};
    bool any = json_object_get(s, "not") != NULL;
    for (size_t i = 0; i < 3; i++) any = any || json_object_get(s, dep_kw[i]);
    if (!any) return s;
    json_t *m = json_deep_copy(s);
    if (!m) return fail(c, DI_ERR_NOMEM, "%s", "out of memory"), NULL;
    json_array_append_new(c->keep, m); /* memo keys are pointers: keep the copy alive */
    for (size_t i = 0; i < 3; i++) {
        json_t *deps = json_object_get(s, dep_kw[i]);
        if (!deps) continue;
        json_object_del(m, dep_kw[i]);
        if (!json_is_object(deps)) return fail(c, DI_ERR_INVALID, "keyword '%s' is not an object", dep_kw[i]), NULL;
        const char *a;
        json_t *v;
        json_object_foreach(deps, a, v) {
            json_t *req = json_object_get(m, "required");
            if (json_is_array(v)) {
                if (!req) json_object_set_new(m, "required", req = json_array());
                for (size_t k = 0; k < json_array_size(v); k++)
                    if (json_is_string(json_array_get(v, k)) && !in_required(req, json_string_value(json_array_get(v, k))))
                        json_array_append(req, json_array_get(v, k));
            } else if (trivial(v)) {
                continue;
            } else if (in_required(req, a)) {
                json_t *all = json_object_get(m, "allOf");
                if (all && !json_is_array(all)) return fail(c, DI_ERR_INVALID, "%s", "allOf is not an array"), NULL;
                if (!all) json_object_set_new(m, "allOf", all = json_array());
                json_array_append(all, v);
            } else {
                return fail(c, DI_ERR_UNSUPPORTED, "keyword '%s' with a schema for an optional property", dep_kw[i]), NULL;
            }
        }
    }
    json_t *n = json_object_get(s, "not");
    if (!n) return m;
    json_object_del(m, "not");
    if (json_is_object(n) && json_is_string(json_object_get(n, "$ref"))) {
        json_t *t = resolve_ref(c, json_string_value(json_object_get(n, "$ref")));
        if (!t) return NULL;
        if (json_is_object(t) && json_object_size(n) == 1) n = t;
    }
    if (json_is_false(n)) return m;
    if (trivial(n)) return json_false();
    /* the constraining keywords of the negated schema */
    const char *only = NULL, *k;
    json_t *kv;
    size_t nk = 0;
    json_object_foreach(n, k, kv) if (constrains(k)) only = k, nk++;
    if (nk == 1 && !strcmp(only, "type")) {
        json_t *t = json_object_get(n, "type"), *have = json_object_get(m, "type");
        unsigned excl = type_bits_of(t), allow = have ? type_bits_of(have) : 0x7f;
        if (!excl && t) return fail(c, DI_ERR_INVALID, "%s", "not: type is not a type name or list"), NULL;
        /* bit 2 (integer) lies inside bit 1 (number): excluding integers from numbers is not a type */
        if ((excl & 4) && !(excl & 2) && (allow & 2))
            return fail(c, DI_ERR_UNSUPPORTED, "%s", "keyword 'not' {type: integer} beside numbers"), NULL;
        if (excl & 2) excl |= 4;
        allow &= ~excl;
        json_t *list = json_array();
        for (unsigned b = 0; b < 7; b++)
            if ((allow >> b) & 1 && !(b == 2 && (allow & 2))) json_array_append_new(list, json_string(k_type_names[b]));
        if (!json_array_size(list)) {
            json_decref(list);
            return json_false();
        }
        json_object_set_new(m, "type", list);
        return m;
    }
    if (nk == 1 && !strcmp(only, "required") && json_array_size(json_object_get(n, "required"))) {
        const char *name = json_string_value(json_array_get(json_object_get(n, "required"), 0));
        if (!name) return fail(c, DI_ERR_INVALID, "%s", "not: required entry is not a string"), NULL;
        json_t *props = json_object_get(m, "properties");
        if (props && !json_is_object(props)) return fail(c, DI_ERR_INVALID, "%s", "properties is not an object"), NULL;
        json_t *np = props ? json_deep_copy(props) : json_object();
        json_object_set_new(np, name, json_false()); /* an absent or declared name: absent now */
        json_object_set_new(m, "properties", np);
        return m;
    }
    json_t *en = json_object_get(m, "enum"), *cst = json_object_get(m, "const");
    json_t *nen = json_object_get(n, "enum"), *ncst = json_object_get(n, "const");
    if (nk >= 1 && nk <= 2 && (nen || ncst) && (en || cst) && nk == (size_t)(nen != NULL) + (ncst != NULL)) {
        json_t *vals = json_array();
        if (cst) json_array_append(vals, cst);
        for (size_t i = 0; !cst && i < json_array_size(en); i++) json_array_append(vals, json_array_get(en, i));
        for (size_t i = json_array_size(vals); i-- > 0;) {
            json_t *x = json_array_get(vals, i);
            bool hit = ncst && json_equal(ncst, x);
            for (size_t j = 0; !hit && j < json_array_size(nen); j++) hit = json_equal(json_array_get(nen, j), x);
            if (hit) json_array_remove(vals, i);
        }
        json_object_del(m, "const");
        json_object_set_new(m, "enum", vals);
        return m;
    }
    return fail(c, DI_ERR_UNSUPPORTED, "%s",
                "keyword 'not' other than not-type, not-required, not-enum/const beside enum/const, true/false"),
           NULL;
}

static int32_t schema_body(js *c, json_t *s) {
    if (json_is_true(s)) return c->value;
    if (json_is_false(s)) return nothing(c);
    if (!json_is_object(s)) return fail(c, DI_ERR_INVALID, "%s", "schema is not an object or boolean");
    for (size_t i = 0; i < sizeof k_unsupported / sizeof k_unsupported[0]; i++)
        if (json_object_get(s, k_unsupported[i]))
            return fail(c, DI_ERR_UNSUPPORTED, "keyword '%s' is not supported", k_unsupported[i]);
    json_t *rw = rewrite(c, s);
    if (rw != s) return rw ? schema_body(c, rw) : 0;
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) return fail(c, DI_ERR_INVALID, "%s", "$ref is not a string");
        /* Constraining siblings of $ref (2019+; draft 7 validators differ, and applying them is
         * the narrower reading) hold together with the target: compile as allOf(siblings, target). */
        bool siblings = false;
        const char *k;
        json_t *kv;
        json_object_foreach(s, k, kv) if (constrains(k) && strcmp(k, "$ref")) siblings = true;
        if (siblings) {
            json_t *m = json_deep_copy(s);
            json_t *parts = json_object_get(m, "allOf");
            if (!m || (parts && !json_is_array(parts))) {
                json_decref(m);
                return c->rc ? 0 : fail(c, DI_ERR_INVALID, "%s", "allOf is not an array");
            }
            if (!parts) json_object_set_new(m, "allOf", parts = json_array());
            json_t *part = json_object();
            json_object_set(part, "$ref", ref);
            json_array_append_new(parts, part);
            json_object_del(m, "$ref");
            json_array_append_new(c->keep, m); /* memo keys are pointers: keep the copy alive */
            return schema_body(c, m);
        }
        json_t *t = resolve_ref(c, json_string_value(ref));
        return t ? sub(c, t, "$ref", NULL) : 0;
    }
    if (json_object_get(s, "allOf")) {
        json_t *m = merge_allof(c, s);
        if (!m) return c->rc ? 0 : fail(c, DI_ERR_NOMEM, "%s", "out of memory");
        /* the merged copy must outlive compilation: memo keys are pointers */
        json_array_append_new(c->keep, m);
        return schema_sym(c, m);
    }
    json_t *cst = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    if (cst || en) {
        if (en && !json_is_array(en)) return fail(c, DI_ERR_INVALID, "%s", "enum is not an array");
        return const_enum_sym(c, s, cst, en);
    }
    json_t *any = json_object_get(s, "anyOf"), *one = json_object_get(s, "oneOf");
    if (any || one) {
        if (any && one) return fail(c, DI_ERR_UNSUPPORTED, "%s", "anyOf together with oneOf");
        json_t *arr = any ? any : one;
        if (!json_is_array(arr) || !json_array_size(arr)) return fail(c, DI_ERR_INVALID, "%s", "anyOf/oneOf is not a non-empty array");
        /* Constraining siblings apply to every branch: distribute them, compiling each branch as
         * allOf(siblings, branch) through the same merge as allOf. */
        bool siblings = false;
        const char *k;
        json_t *kv;
        json_object_foreach(s, k, kv) if (constrains(k) && strcmp(k, "anyOf") && strcmp(k, "oneOf")) siblings = true;
        json_t *branches = json_array();
        if (!branches) return fail(c, DI_ERR_NOMEM, "%s", "out of memory");
        json_array_append_new(c->keep, branches); /* merged branches must outlive compilation */
        for (size_t i = 0; i < json_array_size(arr) && !c->rc; i++) {
            json_t *br = json_array_get(arr, i);
            if (siblings) {
                json_t *tmp = json_deep_copy(s);
                json_object_del(tmp, "anyOf");
                json_object_del(tmp, "oneOf");
                json_t *one_part = json_array();
                json_array_append(one_part, br);
                json_object_set_new(tmp, "allOf", one_part);
                json_t *merged = tmp ? merge_allof(c, tmp) : NULL;
                json_decref(tmp);
                if (!merged) return c->rc ? 0 : fail(c, DI_ERR_NOMEM, "%s", "out of memory");
                json_array_append_new(branches, merged);
            } else {
                json_array_append(branches, br);
            }
        }
        if (c->rc) return 0;
        if (one && !c->opts.lenient_oneof && !pairwise_disjoint(c, branches)) branches = narrow_oneof(c, branches);
        if (!branches) return 0;
        if (one && !c->opts.lenient_oneof && !pairwise_disjoint(c, branches))
            return fail(c, DI_ERR_UNSUPPORTED, "%s",
                        "oneOf whose branches are not provably disjoint by type, const/enum or a required discriminator "
                        "property (set lenient_oneof to compile it as anyOf)");
        int32_t nt = di_cfg_nt(c->g, NULL);
        for (size_t i = 0; i < json_array_size(branches) && !c->rc; i++) {
            char idx[24];
            snprintf(idx, sizeof idx, "%zu", i);
            int32_t b = sub(c, json_array_get(branches, i), any ? "anyOf" : "oneOf", idx);
            di_cfg_rule(c->g, nt, &b, 1);
        }
        return nt;
    }
    json_t *type = json_object_get(s, "type");
    if (json_is_string(type)) return typed(c, s, json_string_value(type));
    if (json_is_array(type)) {
        int32_t nt = di_cfg_nt(c->g, NULL);
        for (size_t i = 0; i < json_array_size(type) && !c->rc; i++) {
            const char *t = json_string_value(json_array_get(type, i));
            if (!t) return fail(c, DI_ERR_INVALID, "%s", "type list entry is not a string");
            int32_t b = typed(c, s, t);
            di_cfg_rule(c->g, nt, &b, 1);
        }
        return nt;
    }
    if (type) return fail(c, DI_ERR_INVALID, "%s", "type is not a string or list");
    /* no type: infer from the keywords present; a value of another type is also valid per the
     * spec, but generating one would ignore the keywords, so restrict to the implied type */
    if (json_object_get(s, "properties") || json_object_get(s, "required") || json_object_get(s, "additionalProperties") ||
        json_object_get(s, "patternProperties") || json_object_get(s, "minProperties") || json_object_get(s, "maxProperties"))
        return object_sym(c, s);
    if (json_object_get(s, "items") || json_object_get(s, "prefixItems") || json_object_get(s, "minItems") ||
        json_object_get(s, "maxItems") || json_object_get(s, "additionalItems") || json_object_get(s, "uniqueItems"))
        return array_sym(c, s);
    if (json_object_get(s, "pattern") || json_object_get(s, "minLength") || json_object_get(s, "maxLength") ||
        json_object_get(s, "format"))
        return string_sym(c, s);
    if (json_object_get(s, "minimum") || json_object_get(s, "maximum") || json_object_get(s, "exclusiveMinimum") ||
        json_object_get(s, "exclusiveMaximum"))
        return number_sym(c, s, false);
    return c->value;
}

static int32_t schema_sym(js *c, json_t *s) {
    if (c->rc) return 0;
    if (!json_is_object(s)) return schema_body(c, s);
    int32_t *slot = memo_slot(c, s);
    if (!slot) return 0;
    if (*slot >= 0) return *slot;
    if (++c->depth > DI_JSON_SCHEMA_MAX_DEPTH) return fail(c, DI_ERR_LIMIT, "%s", "schema nested more than 128 levels");
    int32_t nt = di_cfg_nt(c->g, NULL);
    *slot = nt; /* before the body: a $ref cycle back here links to nt */
    int32_t b = schema_body(c, s);
    c->depth--;
    if (!c->rc) di_cfg_rule(c->g, nt, &b, 1);
    return nt;
}

int di_json_schema_to_cfg(di_cfg *g, const char *json, size_t len, const di_json_schema_opts *opts, int32_t *start,
                          di_error *err) {
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!root)
        return di_error_set(err, DI_ERR_FORMAT, "json schema: not JSON (line %d col %d: %s)", je.line, je.column, je.text);
    if (!json_is_object(root) && !json_is_boolean(root)) {
        json_decref(root);
        return di_error_set(err, DI_ERR_INVALID, "json schema: top level is not an object or boolean");
    }
    js c = {.g = g, .err = err, .root = root, .keep = json_array(), .opts = *opts};
    for (size_t i = 0; i < 3; i++) c.num_cache[i] = -1;
    for (size_t i = 0; i < 16; i++) c.fmt_cache[i] = -1;
    init_shared(&c);
    int32_t top = 0;
    if (!c.rc) top = schema_sym(&c, root);
    /* surrounding whitespace is allowed in flexible mode, like any JSON document */
    if (!c.rc) {
        *start = di_cfg_nt(g, "<document>");
        int32_t body[3] = {c.ws, top, c.ws};
        di_cfg_rule(g, *start, body, 3);
    }
    free(c.memo);
    json_decref(c.keep);
    json_decref(root);
    if (!c.rc && di_cfg_failed(g)) c.rc = di_error_set(err, g->err_code, "json schema: %s", g->err_msg);
    return c.rc;
}
