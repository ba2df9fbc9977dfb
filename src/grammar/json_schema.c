/* JSON Schema front-end; what is supported is listed in json_schema.h. */
#include "grammar/json_schema.h"

#include <jansson.h>
#include <math.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/json_schema_impl.h"
#include "grammar/regex.h"


int32_t di_js_fail(js *c, int code, const char *fmt, const char *arg) {
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
        if (!t) return di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory"), NULL;
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

/* open ws B ws close for a B that may be empty, written as (open ws B+ ws close | open ws_pair
 * close) with B+ = B without the empty string: the same language, but "[" ws ws "]" let every
 * whitespace byte of an empty array split between the two runs (Earley sets growing with the
 * run, and a context edge per byte in the mask walk). */
static int32_t bracketed(js *c, char open, int32_t nonempty, char close) {
    di_cfg *g = c->g;
    int32_t lo = open == '{' ? c->lbrace : c->lbrack, hi = close == '}' ? c->rbrace : c->rbrack;
    int32_t full = seq(c, (int32_t[]){lo, nonempty, hi}, 3);
    int32_t none = seq(c, (int32_t[]){di_cfg_byte(g, (uint8_t)open), c->ws_pair, di_cfg_byte(g, (uint8_t)close)}, 3);
    return di_cfg_alt(g, (int32_t[]){full, none}, 2);
}

/* Language with no strings (false schema, impossible combination); pruned by finalize. */
static int32_t nothing(js *c) { return di_cfg_nt(c->g, "<nothing>"); }

static void init_shared(js *c) {
    di_cfg *g = c->g;
    if (c->opts.whitespace == DI_JSON_WS_COMPACT) {
        c->ws = empty(c);
        c->ws_pair = c->ws;
    } else {
        int n = c->opts.max_ws_run > 0 ? c->opts.max_ws_run : 16;
        di_cfg_class sp = {{0}};
        di_cfg_class_add_range(&sp, ' ', ' ');
        di_cfg_class_add_range(&sp, '\t', '\n');
        di_cfg_class_add_range(&sp, '\r', '\r');
        c->ws = di_cfg_repeat(g, di_cfg_class_sym(g, &sp), 0, n);
        c->ws_pair = di_cfg_repeat(g, di_cfg_class_sym(g, &sp), 0, 2 * (int64_t)n);
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
    int32_t obj = bracketed(c, '{', members, '}');
    int32_t elems = seq(c, (int32_t[]){v, di_cfg_star(g, seq(c, (int32_t[]){c->comma, v}, 2))}, 2);
    int32_t arr = bracketed(c, '[', elems, ']');
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
        return di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory for enum");
    }
    for (size_t i = 0; i < n; i++) {
        strs[i] = json_dumps(json_array_get(arr, i), JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
        if (!strs[i]) {
            di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory for enum");
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
        if (longest > 4096) di_js_fail(c, DI_ERR_LIMIT, "%s", "enum value longer than 4096 bytes");
        else r = lit_trie(c, ents, w, 0);
    }
    for (size_t i = 0; i < n; i++) free(strs[i]);
    free(strs);
    free(ents);
    return r;
}

/* JSON type name of a value as "type" spells it (integers are also numbers). */
bool di_js_value_has_type(const json_t *v, const char *t) {
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
bool di_js_constrains(const char *k) {
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
    static const char *filters[] = {"const", "enum", "type", "minLength", "maxLength",
                                    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    json_object_foreach(s, k, v) {
        bool known = !di_js_constrains(k);
        for (size_t i = 0; i < sizeof filters / sizeof filters[0]; i++) known = known || !strcmp(k, filters[i]);
        if (!known) return di_js_fail(c, DI_ERR_UNSUPPORTED, "keyword '%s' beside const/enum", k);
    }
    json_t *type = json_object_get(s, "type");
    json_t *mnl = json_object_get(s, "minLength"), *mxl = json_object_get(s, "maxLength");
    if ((mnl && !json_is_integer(mnl)) || (mxl && !json_is_integer(mxl)))
        return di_js_fail(c, DI_ERR_INVALID, "%s", "minLength/maxLength is not an integer");
    json_t *vals = json_array();
    if (!vals) return di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory");
    bool cst_in_enum = !json_is_array(en);
    for (size_t i = 0; cst && !cst_in_enum && i < json_array_size(en); i++) cst_in_enum = json_equal(cst, json_array_get(en, i));
    if (cst && cst_in_enum) json_array_append(vals, cst); /* const and enum (e.g. from allOf) must both hold */
    for (size_t i = 0; !cst && i < json_array_size(en); i++) json_array_append(vals, json_array_get(en, i));
    json_t *not_strs = json_object_get(s, DI_JS_NOT_STRINGS);
    json_t *bnd[4] = {json_object_get(s, "minimum"), json_object_get(s, "exclusiveMinimum"), json_object_get(s, "maximum"),
                      json_object_get(s, "exclusiveMaximum")};
    for (size_t i = json_array_size(vals); (type || not_strs || mnl || mxl || bnd[0] || bnd[1] || bnd[2] || bnd[3]) && i-- > 0;) {
        json_t *x = json_array_get(vals, i);
        bool ok = !type;
        if (json_is_string(type)) ok = di_js_value_has_type(x, json_string_value(type));
        for (size_t t = 0; json_is_array(type) && t < json_array_size(type); t++)
            ok = ok || (json_is_string(json_array_get(type, t)) && di_js_value_has_type(x, json_string_value(json_array_get(type, t))));
        if (json_is_string(x) && json_object_get(not_strs, json_string_value(x))) ok = false;
        for (int b = 0; b < 4 && json_is_number(x); b++) {
            /* bounds compare doubles; a real value equal to an inclusive bound is dropped too: its
             * 17-digit spelling and the bound's text may differ as decimals, integers do not */
            if (!json_is_number(bnd[b])) continue;
            double xv = json_number_value(x), bv = json_number_value(bnd[b]);
            bool lower = b < 2, strict = b & 1 || json_is_true(bnd[b ^ 1]) || !json_is_integer(x);
            if (lower ? (xv < bv || (strict && xv == bv)) : (xv > bv || (strict && xv == bv))) ok = false;
        }
        if (json_is_string(x) && (mnl || mxl)) { /* length in code points (jansson holds UTF-8) */
            json_int_t n = 0;
            for (const char *p = json_string_value(x); *p; p++) n += ((uint8_t)*p & 0xC0) != 0x80;
            if ((mnl && n < json_integer_value(mnl)) || (mxl && n > json_integer_value(mxl))) ok = false;
        }
        if (!ok) json_array_remove(vals, i);
    }
    /* an integral real such as 1.0 serializes as "1.0", which is still a valid spelling */
    int32_t r = enum_sym(c, vals);
    json_decref(vals);
    return r;
}

/* ---- keyword handling ---- */

static const char *const k_unsupported[] = {"contains",      "minContains",  "maxContains",
                                            "unevaluatedProperties", "unevaluatedItems",
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
json_t *di_js_resolve_ref(js *c, const char *ref) {
    if (ref[0] != '#') return di_js_fail(c, DI_ERR_UNSUPPORTED, "$ref '%s' is not local (only '#...' references)", ref), NULL;
    json_t *cur = c->root;
    const char *p = ref + 1;
    if (*p && *p != '/') return di_js_fail(c, DI_ERR_UNSUPPORTED, "$ref '%s': anchors are not supported", ref), NULL;
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
        if (!cur) return di_js_fail(c, DI_ERR_INVALID, "$ref '%s' does not resolve", ref), NULL;
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

/* Shortest match of a regex according to PCRE2 (a lower bound on every match's length in code
 * points); -1 when PCRE2 does not take the pattern. */
static int64_t min_match_len(const char *re) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, di_js_pcre2_opts, &ec, &eo, NULL);
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

static int32_t other_key(js *c, json_t *props);

static int32_t string_sym(js *c, json_t *s) {
    json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    json_t *not_strs = json_object_get(s, DI_JS_NOT_STRINGS);
    if (not_strs) { /* a string other than the listed ones, spelled without escapes */
        if (!json_is_object(not_strs) || mn || mx || pat || fmt)
            return di_js_fail(c, DI_ERR_UNSUPPORTED, "%s", "keyword 'not' {enum} beside a pattern, format or length");
        return other_key(c, not_strs);
    }
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
                return di_js_fail(c, DI_ERR_UNSUPPORTED, "format '%s' is not supported", std[i]);
    }
    if (json_is_string(pat)) {
        if (re) return di_js_fail(c, DI_ERR_UNSUPPORTED, "%s", "pattern together with format");
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
            if (a > 100000 || b > 100000) return di_js_fail(c, DI_ERR_LIMIT, "%s", "string length bound above 100000");
            if (b >= 0) snprintf(bounded, sizeof bounded, "^%.*s{%lld,%lld}$", (int)atom, re + 1, (long long)a, (long long)b);
            else snprintf(bounded, sizeof bounded, "^%.*s{%lld,}$", (int)atom, re + 1, (long long)a);
            re = bounded;
            mn = mx = NULL;
        } else {
            return di_js_fail(c, DI_ERR_UNSUPPORTED, "%s", "pattern/format together with minLength/maxLength");
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
    if (hi > 100000 || lo > 100000) return di_js_fail(c, DI_ERR_LIMIT, "%s", "string length bound above 100000");
    return seq(c, (int32_t[]){q, di_cfg_repeat(c->g, ch, lo, hi), q}, 3);
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
            return di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory");
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
        return di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory");
    }
    const char *key;
    json_t *v;
    json_object_foreach(props, key, v) {
        names[k] = key;
        lens[k++] = strlen(key);
        if (lens[k - 1] > 1024) {
            free(names), free(lens);
            return di_js_fail(c, DI_ERR_LIMIT, "%s", "property name longer than 1024 bytes");
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
bool di_js_trivial(const json_t *s) {
    if (json_is_true(s)) return true;
    if (!json_is_object(s)) return false;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v) if (di_js_constrains(k)) return false;
    return true;
}

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
            return di_js_fail(c, DI_ERR_INVALID, "patternProperties '%s' is not a schema", re), NULL;
        if (di_js_trivial(ps)) continue;
        if (shared && !json_equal(shared, ps))
            return di_js_fail(c, DI_ERR_UNSUPPORTED, "%s",
                        "keyword 'patternProperties' with several different non-trivial schemas (a key may match two)"),
                   NULL;
        shared = ps;
    }
    json_object_foreach(pp, re, ps) {
        const char *name;
        json_t *nv;
        json_object_foreach(props, name, nv) {
            int m = di_js_pattern_matches(re, name, strlen(name));
            if (m == 0 || json_equal(nv, ps) || (di_js_trivial(nv) && di_js_trivial(ps))) continue;
            return di_js_fail(c, DI_ERR_UNSUPPORTED,
                        m < 0 ? "keyword 'patternProperties': pattern '%s' is not understood by PCRE2"
                              : "keyword 'patternProperties': pattern matches declared property '%s' with another schema",
                        m < 0 ? re : name),
                   NULL;
        }
    }
    return shared;
}

/* Members with a count in [lo, hi] (hi < 0: unbounded): declared members mems[0..n) in order
 * (reqd: must appear), then additional ones (`member`, -1 when none may appear). S[k][j]: members
 * k.. remain, j written; without hi, counts >= lo share the column lo. */
static int32_t counted_members(js *c, const int32_t *mems, const bool *reqd, size_t n, int32_t member, int64_t lo, int64_t hi) {
    di_cfg *g = c->g;
    size_t cols = (size_t)(hi >= 0 ? hi : lo) + 1;
    int32_t *S = malloc((n + 1) * cols * sizeof *S);
    if (!S) return di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory");
    for (size_t i = 0; i < (n + 1) * cols; i++) S[i] = di_cfg_nt(g, NULL);
    int32_t ce = member >= 0 ? seq(c, (int32_t[]){c->comma, member}, 2) : -1;
    for (size_t j = 0; j < cols; j++) { /* additional members: t of them, j + t in [lo, hi] */
        int32_t tail = S[n * cols + j];
        int64_t tlo = lo > (int64_t)j ? lo - (int64_t)j : 0, thi = hi >= 0 ? hi - (int64_t)j : -1;
        if (tlo == 0) di_cfg_rule(g, tail, NULL, 0);
        if (member < 0 || thi == 0) continue;
        int32_t r = j ? di_cfg_repeat(g, ce, tlo ? tlo : 1, thi)
                      : seq(c, (int32_t[]){member, di_cfg_repeat(g, ce, tlo > 1 ? tlo - 1 : 0, thi < 0 ? -1 : thi - 1)}, 2);
        di_cfg_rule(g, tail, &r, 1);
    }
    for (size_t k = n; k-- > 0;)
        for (size_t j = 0; j < cols; j++) {
            int32_t at = S[k * cols + j];
            if (hi < 0 || (int64_t)j < hi) { /* member k written */
                size_t j2 = j + 1 < cols ? j + 1 : cols - 1;
                int32_t r[3] = {c->comma, mems[k], S[(k + 1) * cols + j2]};
                di_cfg_rule(g, at, j ? r : r + 1, j ? 3 : 2);
            }
            if (!reqd[k]) di_cfg_rule(g, at, &S[(k + 1) * cols + j], 1);
        }
    int32_t body = S[0];
    free(S);
    return body;
}

static int32_t object_sym(js *c, json_t *s) {
    di_cfg *g = c->g;
    json_t *props = json_object_get(s, "properties");
    json_t *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    json_t *pp = json_object_get(s, "patternProperties");
    json_t *mnp = json_object_get(s, "minProperties"), *mxp = json_object_get(s, "maxProperties");
    if (props && !json_is_object(props)) return di_js_fail(c, DI_ERR_INVALID, "%s", "properties is not an object");
    if (pp && !json_is_object(pp)) return di_js_fail(c, DI_ERR_INVALID, "%s", "patternProperties is not an object");
    if (!json_object_size(pp)) pp = NULL;
    /* propertyNames: false allows only {}; {pattern: P} (beside type string) makes the free keys
     * pattern keys, on an object without declared or pattern properties (a pattern key could
     * spell a declared name); other forms are refused */
    json_t *pn = json_object_get(s, "propertyNames");
    const char *pn_re = NULL;
    if (json_is_false(pn)) {
        if (json_array_size(req)) return nothing(c);
        return bracketed(c, '{', nothing(c), '}');
    }
    if (pn && !di_js_trivial(pn)) {
        const char *k;
        json_t *v;
        bool ok = json_is_object(pn) && json_is_string(json_object_get(pn, "pattern"));
        json_object_foreach(pn, k, v) if (di_js_constrains(k) && strcmp(k, "pattern") &&
                                          (strcmp(k, "type") || !json_is_string(v) || strcmp(json_string_value(v), "string")))
            ok = false;
        if (!ok || json_object_size(props) || json_array_size(req) || pp)
            return di_js_fail(c, DI_ERR_UNSUPPORTED, "%s",
                              "keyword 'propertyNames' other than a pattern on an object without declared properties");
        pn_re = json_string_value(json_object_get(pn, "pattern"));
    }
    /* a required name without a declared schema is governed by the pattern it matches, else by
     * additionalProperties: declare it with that schema (after the declared ones) so it is
     * generated and excluded from extra keys */
    json_t *all = NULL;
    for (size_t r = 0; r < json_array_size(req); r++) {
        const char *name = json_string_value(json_array_get(req, r));
        if (!name || json_object_get(props, name) || (all && json_object_get(all, name))) continue;
        if (!all) {
            all = json_object();
            if (!all) return di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory");
            json_array_append_new(c->keep, all);
            if (props) json_object_update(all, props);
        }
        json_t *gov = NULL;
        const char *re;
        json_t *ps;
        json_object_foreach(pp, re, ps) {
            int m = di_js_pattern_matches(re, name, strlen(name));
            if (m < 0) return di_js_fail(c, DI_ERR_UNSUPPORTED, "keyword 'patternProperties': pattern '%s' is not understood by PCRE2", re);
            if (m && (!gov || di_js_trivial(gov))) gov = ps;
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
    bool non_empty = false, counted = false;
    int64_t count_lo = 0, count_hi = -1;
    if (mnp) {
        if (!json_is_integer(mnp)) return di_js_fail(c, DI_ERR_INVALID, "%s", "minProperties is not an integer");
        json_int_t m = json_integer_value(mnp);
        if (m > (json_int_t)n_req) {
            if (m > 1) count_lo = m, counted = true;
            non_empty = true;
        }
    }
    if (mxp) {
        if (!json_is_integer(mxp)) return di_js_fail(c, DI_ERR_INVALID, "%s", "maxProperties is not an integer");
        json_int_t m = json_integer_value(mxp);
        if (m < (json_int_t)n_req) return nothing(c);
        if (!closed || (json_int_t)n > m) count_hi = m, counted = true;
    }
    /* counted chain: S[k][j] = members k..n-1 remain, j written so far (without maxProperties,
     * counts from minProperties up behave alike and share the last column) */
    int64_t cols = (count_hi >= 0 ? count_hi : count_lo) + 1;
    if (counted && (count_hi >= 0 && count_hi < count_lo)) return nothing(c);
    if (counted && (cols > 1001 || (int64_t)(n + 1) * cols > 50000))
        return di_js_fail(c, DI_ERR_LIMIT, "%s", "minProperties/maxProperties: (declared names + 1) x count above 50000 states");
    /* P[k][e]: members k..n-1 remain; e = a member was already written (a comma comes first).
     * Q[k]: members k..n-1 remain, none written yet, at least one must be (minProperties 1). */
    int32_t(*P)[3] = calloc(n + 1, sizeof *P);
    if (!P) return di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory");
    for (size_t k = 0; k <= n; k++) P[k][0] = di_cfg_nt(g, NULL), P[k][1] = di_cfg_nt(g, NULL), P[k][2] = di_cfg_nt(g, NULL);
    /* tail: additional members. Free keys (none of the declared names) take additionalProperties;
     * a free key might match a pattern, so free keys are offered only when every pattern's schema
     * is trivial. Pattern keys take their pattern's schema. */
    int32_t member = di_cfg_nt(g, NULL);
    bool extra = false;
    bool free_keys = !json_is_false(addl) && !shared;
    if (free_keys) {
        int32_t av = addl && json_is_object(addl) ? sub(c, addl, "additionalProperties", NULL) : c->value;
        int32_t key = pn_re ? pattern_key(c, pn_re) : n ? other_key(c, props) : c->string;
        int32_t r[3] = {key, c->colon, av};
        di_cfg_rule(g, member, r, 3);
        extra = true;
    }
    const char *re;
    json_t *ps;
    json_object_foreach(pp, re, ps) {
        if (c->rc || (free_keys && di_js_trivial(ps) && (!addl || di_js_trivial(addl)))) continue; /* already covered */
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
    int32_t *mems = calloc(n + 1, sizeof *mems);
    bool *reqd = calloc(n + 1, sizeof *reqd);
    if (!mems || !reqd) {
        free(P), free(mems), free(reqd);
        return di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory");
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
            free(P), free(mems), free(reqd);
            return di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory");
        }
        int32_t v = sub(c, ps, "properties", key);
        int32_t mem = seq(c, (int32_t[]){lit(c, qk), c->colon, v}, 3);
        free(qk);
        mems[k] = mem, reqd[k] = required;
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
    int32_t body = counted ? counted_members(c, mems, reqd, n, extra ? member : -1, count_lo, count_hi) : P[0][non_empty ? 2 : 0];
    bool may_be_empty = !counted && !non_empty; /* P[0][0] = P[0][2] plus the empty body iff nothing is required */
    for (size_t r = 0; r < n; r++) may_be_empty = may_be_empty && !reqd[r];
    int32_t nonempty = P[0][2];
    free(P), free(mems), free(reqd);
    if (may_be_empty) return bracketed(c, '{', nonempty, '}');
    return seq(c, (int32_t[]){c->lbrace, body, c->rbrace}, 3);
}

static int32_t array_sym(js *c, json_t *s) {
    di_cfg *g = c->g;
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    json_t *addi = json_object_get(s, "additionalItems");
    json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
    json_t *uq = json_object_get(s, "uniqueItems");
    if (json_is_true(uq)) return di_js_fail(c, DI_ERR_UNSUPPORTED, "%s", "uniqueItems: true");
    int64_t lo = json_is_integer(mn) ? json_integer_value(mn) : 0;
    int64_t hi = json_is_integer(mx) ? json_integer_value(mx) : -1;
    if (lo < 0 || (hi >= 0 && hi < lo)) return nothing(c);
    if (lo > 100000 || hi > 100000) return di_js_fail(c, DI_ERR_LIMIT, "%s", "array length bound above 100000");
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
    if (!A) return di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory");
    for (size_t j = 0; j <= np; j++) A[j] = di_cfg_nt(g, NULL);
    /* after the prefix: count bounds apply to the remaining elements */
    int64_t rlo = lo > (int64_t)np ? lo - (int64_t)np : 0, rhi = hi < 0 ? -1 : hi - (int64_t)np;
    int32_t tail_first, tail_more, one = -1;
    if (rest_sym == -1 || rhi == 0) {
        tail_first = rlo > 0 ? nothing(c) : empty(c);
        tail_more = tail_first;
    } else {
        int32_t ce = seq(c, (int32_t[]){c->comma, rest_sym}, 2);
        /* after at least one element: (, x){rlo, rhi} */
        tail_more = di_cfg_repeat(g, ce, rlo, rhi);
        /* at the very start (no prefix): x (, x){rlo-1, rhi-1} or, if rlo == 0, also nothing */
        one = seq(c, (int32_t[]){rest_sym, di_cfg_repeat(g, ce, rlo ? rlo - 1 : 0, rhi < 0 ? -1 : rhi - 1)}, 2);
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
    if (np == 0 && rlo == 0) return bracketed(c, '[', one >= 0 ? one : nothing(c), ']'); /* A[0] = one? */
    return seq(c, (int32_t[]){c->lbrack, body, c->rbrack}, 3);
}

static int32_t typed(js *c, json_t *s, const char *t) {
    if (!strcmp(t, "string")) return string_sym(c, s);
    if (!strcmp(t, "number")) return di_js_number(c, s, false);
    if (!strcmp(t, "integer")) return di_js_number(c, s, true);
    if (!strcmp(t, "boolean")) return c->boolean;
    if (!strcmp(t, "null")) return c->null;
    if (!strcmp(t, "object")) return object_sym(c, s);
    if (!strcmp(t, "array")) return array_sym(c, s);
    return di_js_fail(c, DI_ERR_INVALID, "unknown type '%s'", t);
}

static int32_t schema_body(js *c, json_t *s) {
    if (json_is_true(s)) return c->value;
    if (json_is_false(s)) return nothing(c);
    if (!json_is_object(s)) return di_js_fail(c, DI_ERR_INVALID, "%s", "schema is not an object or boolean");
    for (size_t i = 0; i < sizeof k_unsupported / sizeof k_unsupported[0]; i++)
        if (json_object_get(s, k_unsupported[i]))
            return di_js_fail(c, DI_ERR_UNSUPPORTED, "keyword '%s' is not supported", k_unsupported[i]);
    json_t *rw = di_js_rewrite(c, s);
    if (rw != s) return rw ? schema_body(c, rw) : 0;
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) return di_js_fail(c, DI_ERR_INVALID, "%s", "$ref is not a string");
        /* Constraining siblings of $ref (2019+; draft 7 validators differ, and applying them is
         * the narrower reading) hold together with the target: compile as allOf(siblings, target). */
        bool siblings = false;
        const char *k;
        json_t *kv;
        json_object_foreach(s, k, kv) if (di_js_constrains(k) && strcmp(k, "$ref")) siblings = true;
        if (siblings) {
            json_t *m = json_copy(s); /* shallow (subschemas stay shared); allOf is copied below */
            json_t *parts = json_object_get(m, "allOf");
            if (json_is_array(parts)) json_object_set_new(m, "allOf", parts = json_copy(parts));
            if (!m || (parts && !json_is_array(parts))) {
                json_decref(m);
                return c->rc ? 0 : di_js_fail(c, DI_ERR_INVALID, "%s", "allOf is not an array");
            }
            if (!parts) json_object_set_new(m, "allOf", parts = json_array());
            json_t *part = json_object();
            json_object_set(part, "$ref", ref);
            json_array_append_new(parts, part);
            json_object_del(m, "$ref");
            json_array_append_new(c->keep, m); /* memo keys are pointers: keep the copy alive */
            return schema_body(c, m);
        }
        json_t *t = di_js_resolve_ref(c, json_string_value(ref));
        return t ? sub(c, t, "$ref", NULL) : 0;
    }
    if (json_object_get(s, "allOf")) {
        json_t *m = di_js_merge_allof(c, s);
        if (!m) return c->rc ? 0 : di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory");
        /* the merged copy must outlive compilation: memo keys are pointers */
        json_array_append_new(c->keep, m);
        return schema_sym(c, m);
    }
    json_t *cst = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    if (cst || en) {
        if (en && !json_is_array(en)) return di_js_fail(c, DI_ERR_INVALID, "%s", "enum is not an array");
        return const_enum_sym(c, s, cst, en);
    }
    json_t *any = json_object_get(s, "anyOf"), *one = json_object_get(s, "oneOf");
    if (any || one) {
        if (any && one) return di_js_fail(c, DI_ERR_UNSUPPORTED, "%s", "anyOf together with oneOf");
        json_t *arr = any ? any : one;
        if (!json_is_array(arr) || !json_array_size(arr)) return di_js_fail(c, DI_ERR_INVALID, "%s", "anyOf/oneOf is not a non-empty array");
        /* Constraining siblings apply to every branch: distribute them, compiling each branch as
         * allOf(siblings, branch) through the same merge as allOf. */
        bool siblings = false;
        const char *k;
        json_t *kv;
        json_object_foreach(s, k, kv) if (di_js_constrains(k) && strcmp(k, "anyOf") && strcmp(k, "oneOf")) siblings = true;
        json_t *branches = json_array();
        if (!branches) return di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory");
        json_array_append_new(c->keep, branches); /* merged branches must outlive compilation */
        for (size_t i = 0; i < json_array_size(arr) && !c->rc; i++) {
            json_t *br = json_array_get(arr, i);
            if (siblings) {
                json_t *tmp = json_copy(s); /* shallow: subschemas stay shared (see di_js_merge_allof) */
                json_object_del(tmp, "anyOf");
                json_object_del(tmp, "oneOf");
                json_t *one_part = json_array();
                json_array_append(one_part, br);
                json_object_set_new(tmp, "allOf", one_part);
                json_t *merged = tmp ? di_js_merge_allof(c, tmp) : NULL;
                json_decref(tmp);
                if (!merged) return c->rc ? 0 : di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory");
                json_array_append_new(branches, merged);
            } else {
                json_array_append(branches, br);
            }
        }
        if (c->rc) return 0;
        if (one && !c->opts.lenient_oneof && !di_js_pairwise_disjoint(c, branches)) branches = di_js_narrow_oneof(c, branches);
        if (!branches) return 0;
        if (one && !c->opts.lenient_oneof && !di_js_pairwise_disjoint(c, branches))
            return di_js_fail(c, DI_ERR_UNSUPPORTED, "%s",
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
            if (!t) return di_js_fail(c, DI_ERR_INVALID, "%s", "type list entry is not a string");
            int32_t b = typed(c, s, t);
            di_cfg_rule(c->g, nt, &b, 1);
        }
        return nt;
    }
    if (type) return di_js_fail(c, DI_ERR_INVALID, "%s", "type is not a string or list");
    /* no type: infer from the keywords present; a value of another type is also valid per the
     * spec, but generating one would ignore the keywords, so restrict to the implied type */
    if (json_object_get(s, "properties") || json_object_get(s, "required") || json_object_get(s, "additionalProperties") ||
        json_object_get(s, "patternProperties") || json_object_get(s, "minProperties") || json_object_get(s, "maxProperties") ||
        json_object_get(s, "propertyNames"))
        return object_sym(c, s);
    if (json_object_get(s, "items") || json_object_get(s, "prefixItems") || json_object_get(s, "minItems") ||
        json_object_get(s, "maxItems") || json_object_get(s, "additionalItems") || json_object_get(s, "uniqueItems"))
        return array_sym(c, s);
    if (json_object_get(s, "pattern") || json_object_get(s, "minLength") || json_object_get(s, "maxLength") ||
        json_object_get(s, "format"))
        return string_sym(c, s);
    if (json_object_get(s, "minimum") || json_object_get(s, "maximum") || json_object_get(s, "exclusiveMinimum") ||
        json_object_get(s, "exclusiveMaximum") || json_object_get(s, "multipleOf"))
        return di_js_number(c, s, false);
    return c->value;
}

static int32_t schema_sym(js *c, json_t *s) {
    if (c->rc) return 0;
    if (!json_is_object(s)) return schema_body(c, s);
    int32_t *slot = memo_slot(c, s);
    if (!slot) return 0;
    if (*slot >= 0) return *slot;
    if (++c->depth > DI_JSON_SCHEMA_MAX_DEPTH) return di_js_fail(c, DI_ERR_LIMIT, "%s", "schema nested more than 128 levels");
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
