/* JSON Schema rewrites that run before a schema is compiled: allOf merged into one schema, oneOf
 * proved to be anyOf (branches that no value matches twice) or narrowed until it is, and
 * dependencies / "not" turned into keywords json_schema.c compiles. Each returns a schema that
 * accepts a subset of what the original accepts (never more), or refuses with di_js_fail. */
#include <jansson.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <string.h>

#include "grammar/json_schema_impl.h"

/* Compile-time pattern checks use PCRE2 as an over-approximation of the ECMA-262 patterns this
 * compiler accepts: with UCP, \d \w \s take Unicode (ECMA's \s does; wider \d \w only make a
 * "no match" answer rarer), ALT_BSUX reads \uHHHH and \xHH as ECMA does. A "no match" is what
 * soundness relies on, so PCRE2 may accept more but must not accept less. */
const uint32_t di_js_pcre2_opts = PCRE2_UTF | PCRE2_UCP | PCRE2_ALT_BSUX;

static unsigned type_bits_of(const json_t *t);
static const char *const k_type_names[7];

/* if/then/else of an allOf part as the equivalent anyOf (see di_js_rewrite), so that two parts'
 * conditions combine like two anyOf; a new reference, NULL when p has none. */
static json_t *cond_anyof(json_t *p) {
    json_t *cif = json_object_get(p, "if"), *cthen = json_object_get(p, "then"), *celse = json_object_get(p, "else");
    if (!cif || (!cthen && !celse)) return NULL;
    return json_pack("[{s:[O,O]},{s:[{s:O},O]}]", "allOf", cif, cthen ? cthen : json_true(), "allOf", "not", cif,
                     celse ? celse : json_true());
}

/* The values of a schema that is only const or enum (annotations aside); NULL otherwise. */
static json_t *values_only(json_t *s) {
    const char *k;
    json_t *v, *r = NULL;
    if (!json_is_object(s)) return NULL;
    json_object_foreach(s, k, v) {
        if (!di_js_constrains(k)) continue;
        if (r || (strcmp(k, "const") && (strcmp(k, "enum") || !json_is_array(v)))) return json_decref(r), NULL;
        r = strcmp(k, "const") ? json_deep_copy(v) : json_pack("[O]", v);
    }
    return r;
}

/* The single name of a schema that is only {properties: {p: X}} (annotations aside); NULL otherwise. */
static const char *one_property(json_t *s) {
    const char *k, *name = NULL;
    json_t *v;
    if (!json_is_object(s)) return NULL;
    json_object_foreach(s, k, v) {
        if (!di_js_constrains(k)) continue;
        if (name || strcmp(k, "properties") || !json_is_object(v) || json_object_size(v) != 1) return NULL;
        name = json_object_iter_key(json_object_iter(v));
    }
    return name;
}

/* A schema for "a or b" in a form the not rewrite handles where possible: const/enum lists
 * unite, {properties: {p: X}} or {properties: {p: Y}} is {properties: {p: X or Y}} (p absent
 * passes both); otherwise anyOf [a, b]. A new reference. */
static json_t *either(json_t *a, json_t *b, int depth) {
    json_t *va = values_only(a), *vb = values_only(b);
    if (va && vb) {
        json_array_extend(va, vb);
        json_decref(vb);
        return json_pack("{s:o}", "enum", va);
    }
    json_decref(va), json_decref(vb);
    const char *pa = one_property(a), *pb = one_property(b);
    if (pa && pb && !strcmp(pa, pb) && depth < 8) {
        json_t *x = json_object_get(json_object_get(a, "properties"), pa);
        json_t *y = json_object_get(json_object_get(b, "properties"), pb);
        json_t *u = either(x, y, depth + 1);
        return u ? json_pack("{s:{s:o}}", "properties", pa, u) : NULL;
    }
    return json_pack("{s:[O,O]}", "anyOf", a, b);
}

/* Keyword k in two allOf parts (values a, b) as one keyword that holds exactly when both do:
 * enum values in both, types in both, the tighter count or bound, anyOf of every pair of
 * branches (at most 64), not of either, both allOf lists. NULL when k has no such combination. */
static json_t *merge_keyword(const char *k, json_t *a, json_t *b) {
    if (!strcmp(k, "enum") && json_is_array(a) && json_is_array(b)) {
        json_t *r = json_array();
        for (size_t i = 0; r && i < json_array_size(a); i++)
            for (size_t j = 0; j < json_array_size(b); j++)
                if (json_equal(json_array_get(a, i), json_array_get(b, j))) {
                    json_array_append(r, json_array_get(a, i));
                    break;
                }
        return r;
    }
    if (!strcmp(k, "type")) {
        unsigned x = type_bits_of(a), y = type_bits_of(b), both = x & y;
        if (!x || !y) return NULL;
        json_t *r = json_array();
        for (unsigned t = 0; r && t < 7; t++) /* number (bits 1 and 2) also lists integer: skip it then */
            if ((both >> t) & 1 && !(t == 2 && (both & 2))) json_array_append_new(r, json_string(k_type_names[t]));
        return r;
    }
    static const char *lower[] = {"minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"};
    static const char *upper[] = {"maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"};
    for (size_t i = 0; i < 5; i++) {
        bool lo = !strcmp(k, lower[i]), hi = !strcmp(k, upper[i]);
        if ((lo || hi) && json_is_number(a) && json_is_number(b)) {
            double x = json_number_value(a), y = json_number_value(b);
            return json_incref(lo ? (x >= y ? a : b) : (x <= y ? a : b));
        }
    }
    if (!strcmp(k, "anyOf") && json_is_array(a) && json_is_array(b)) {
        if (json_array_size(a) * json_array_size(b) > 64) return NULL;
        json_t *r = json_array();
        for (size_t i = 0; r && i < json_array_size(a); i++)
            for (size_t j = 0; j < json_array_size(b); j++)
                json_array_append_new(r, json_pack("{s:[O,O]}", "allOf", json_array_get(a, i), json_array_get(b, j)));
        return r;
    }
    if (!strcmp(k, "not")) return either(a, b, 0); /* not A and not B = not (A or B) */
    if (!strcmp(k, "allOf") && json_is_array(a) && json_is_array(b)) {
        json_t *r = json_copy(a);
        if (r) json_array_extend(r, b);
        return r;
    }
    return NULL;
}

/* allOf: merge the parts into one schema keyword by keyword: required unions, properties take
 * allOf per name, keywords in several parts combine by merge_keyword; otherwise reject. */
json_t *di_js_merge_allof(js *c, json_t *s) {
    /* shallow: the parts' subschemas stay shared (never modified in place), so the memo compiles
     * a subschema once however many merged copies (anyOf branches, conditions) refer to it */
    json_t *m = json_copy(s);
    if (!m) return NULL;
    json_object_del(m, "allOf");
    json_t *parts = json_object_get(s, "allOf");
    for (size_t i = 0; i < json_array_size(parts) && !c->rc; i++) {
        json_t *p = json_array_get(parts, i);
        json_t *ref = json_object_get(p, "$ref");
        /* a bare $ref part is its target; with siblings it stays a $ref keyword (compiled as allOf) */
        bool bare = true;
        const char *k0;
        json_t *v0;
        json_object_foreach(p, k0, v0) if (di_js_constrains(k0) && strcmp(k0, "$ref")) bare = false;
        if (ref && json_is_string(ref) && bare) p = di_js_resolve_ref(c, json_string_value(ref));
        json_t *cond = json_is_object(p) ? cond_anyof(p) : NULL;
        if (cond) { /* the part's if/then/else as anyOf */
            json_t *q = json_copy(p);
            json_object_del(q, "if"), json_object_del(q, "then"), json_object_del(q, "else");
            json_t *both = json_object_get(q, "anyOf") ? merge_keyword("anyOf", json_object_get(q, "anyOf"), cond) : json_incref(cond);
            json_decref(cond);
            if (!both) {
                json_decref(q);
                json_decref(m);
                return di_js_fail(c, DI_ERR_UNSUPPORTED, "%s", "allOf: if/then/else beside anyOf with more than 64 combinations"), NULL;
            }
            json_object_set_new(q, "anyOf", both);
            json_array_append_new(c->keep, q);
            p = q;
        }
        if (json_is_false(p)) { /* nothing passes this part */
            json_decref(m);
            return json_false();
        }
        if (!p || !json_is_object(p)) {
            if (!json_is_true(p)) di_js_fail(c, DI_ERR_UNSUPPORTED, "%s", "allOf part that is not an object schema");
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
                json_t *u = json_copy(have);
                const char *pk;
                json_t *pv;
                json_object_foreach(v, pk, pv) {
                    json_t *prev = json_object_get(u, pk);
                    if (prev && !json_equal(prev, pv)) { /* both constrain the value: allOf of the two */
                        json_t *both = json_pack("{s:[O,O]}", "allOf", prev, pv);
                        if (!both) {
                            json_decref(u);
                            json_decref(m);
                            return di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory"), NULL;
                        }
                        json_object_set_new(u, pk, both);
                        continue;
                    }
                    json_object_set(u, pk, pv);
                }
                json_object_set_new(m, k, u);
            } else if (!json_equal(have, v) && di_js_constrains(k)) { /* differing annotations: keep the first */
                if (!strcmp(k, "const")) { /* two different constants: nothing passes */
                    json_decref(m);
                    return json_false();
                }
                json_t *both = merge_keyword(k, have, v);
                if (both) {
                    json_object_set_new(m, k, both);
                    continue;
                }
                json_decref(m);
                return di_js_fail(c, DI_ERR_UNSUPPORTED, "allOf: keyword '%s' appears in more than one part", k), NULL;
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
        if (ref && json_is_string(ref)) p = di_js_resolve_ref(c, json_string_value(ref));
        json_t *ap = json_object_get(p, "additionalProperties");
        if (!json_is_object(p) || !ap || json_is_true(ap)) continue;
        json_t *pp = json_object_get(p, "properties");
        const char *pk;
        json_t *pv;
        json_object_foreach(mprops, pk, pv) if (!json_object_get(pp, pk)) {
            di_js_fail(c, DI_ERR_UNSUPPORTED, "allOf: property '%s' is added where another part closes the object", pk);
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
static const char *const k_type_names[7] = {"string", "number", "integer", "boolean", "null", "object", "array"};

static unsigned value_type_bits(const json_t *v) {
    unsigned b = 0;
    for (unsigned k = 0; k < 7; k++)
        if (di_js_value_has_type(v, k_type_names[k])) b |= 1u << k;
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
        s = di_js_resolve_ref(c, r);
        if (!save && c->rc) { /* a probe, not an error: leave the refusal to compilation */
            c->rc = 0;
            return NULL;
        }
    }
    return s;
}

/* Does the JSON string v match the ECMA-262-ish pattern? -1 when PCRE2 cannot decide (bad pattern). */
int di_js_pattern_matches(const char *pat, const char *v, size_t vn) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, di_js_pcre2_opts, &ec, &eo, NULL);
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
        if (json_is_string(pat) && di_js_pattern_matches(json_string_value(pat), sv, n) == 0) return false;
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
    /* one forbids a property the other requires (properties: {p: false}, or a closed object,
     * additionalProperties false without patternProperties, that does not declare p), on objects only */
    for (int side = 0; side < 2; side++) {
        json_t *x = side ? b : a, *y = side ? a : b;
        json_t *px = json_object_get(x, "properties"), *ry = json_object_get(y, "required");
        bool closed = json_is_false(json_object_get(x, "additionalProperties")) && !json_object_get(x, "patternProperties");
        bool objects_only = !(type_bits(x) & ~(1u << 5)) || !(type_bits(y) & ~(1u << 5));
        for (size_t i = 0; objects_only && i < json_array_size(ry); i++) {
            const char *name = json_string_value(json_array_get(ry, i));
            if (name && (json_is_false(json_object_get(px, name)) || (closed && !json_object_get(px, name)))) return true;
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
bool di_js_pairwise_disjoint(js *c, json_t *arr) {
    for (size_t i = 0; i < json_array_size(arr); i++)
        for (size_t j = i + 1; j < json_array_size(arr); j++)
            if (!disjoint(c, json_array_get(arr, i), json_array_get(arr, j), 0)) return false;
    return true;
}

static bool in_required(json_t *req, const char *name) {
    for (size_t r = 0; r < json_array_size(req); r++)
        if (json_is_string(json_array_get(req, r)) && !strcmp(json_string_value(json_array_get(req, r)), name)) return true;
    return false;
}

/* oneOf branches that differ by which names they require ({required: [a]} | {required: [b]}):
 * branch i is narrowed to forbid, for every other branch j, one name j requires and i does not.
 * The narrowed branch accepts a subset of branch i; it is kept only when it is disjoint from
 * every *original* other branch, so an accepted value matches exactly one original branch.
 * Returns the original array when narrowing does not help (the caller then refuses). */
json_t *di_js_narrow_oneof(js *c, json_t *branches) {
    size_t n = json_array_size(branches);
    json_t *out = json_array();
    if (!out) return di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory"), NULL;
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

/* Names whose absence makes every object fail n. n is the conjunction of its keywords, so one
 * failing is enough: its first required name, or a failing allOf part, or every anyOf branch
 * failing. Appends them to names; false when none is found (names may then hold leftovers, which
 * the caller discards). */
static bool forbid_names(js *c, json_t *n, json_t *names, int depth) {
    if (json_is_object(n) && json_object_size(n) == 1 && json_is_string(json_object_get(n, "$ref"))) n = deref(c, n);
    if (!json_is_object(n) || depth > 8) return false;
    json_t *req = json_object_get(n, "required"), *all = json_object_get(n, "allOf"), *any = json_object_get(n, "anyOf");
    if (json_is_string(json_array_get(req, 0))) return json_array_append(names, json_array_get(req, 0)) == 0;
    for (size_t i = 0; i < json_array_size(all); i++) {
        size_t had = json_array_size(names);
        if (forbid_names(c, json_array_get(all, i), names, depth + 1)) return true;
        while (json_array_size(names) > had) json_array_remove(names, had);
    }
    if (!json_array_size(any)) return false;
    for (size_t i = 0; i < json_array_size(any); i++)
        if (!forbid_names(c, json_array_get(any, i), names, depth + 1)) return false;
    return true;
}

/* A string schema with no constraint besides its type (the values of a not-enum are then left
 * out with the key machinery, which cannot also apply a pattern or length). */
static bool plain_string(json_t *m) {
    const char *k;
    json_t *v;
    bool str = false;
    json_object_foreach(m, k, v) {
        if (!di_js_constrains(k)) continue;
        if (strcmp(k, "type")) return false;
        str = json_is_string(v) && !strcmp(json_string_value(v), "string");
    }
    return str;
}

/* if/then/else, dependencies / dependentRequired / dependentSchemas and simple forms of "not",
 * rewritten into keywords the compiler handles. Narrowing is sound (the grammar accepts a subset):
 * - if/then/else becomes anyOf [allOf [if, then], allOf [not if, else]] (exact);
 * - a dependent name list becomes required (exact when the trigger is required, else narrower);
 * - a dependent schema joins allOf when its trigger is required, else allOf gets anyOf [trigger
 *   absent, trigger required and the schema] (exact); a trivial one is dropped;
 * - not {type: T} removes T from the types; not {required: [a, ...]} forbids a (narrower), and
 *   so do allOf / anyOf of such schemas (forbid_names), keeping to objects;
 * - not {enum/const} removes values from a sibling enum/const, or beside a plain string type
 *   leaves those strings out (DI_JS_NOT_STRINGS); not true = false; not false = true.
 * Anything else is refused. Returns s itself when nothing applies, NULL after di_js_fail(). */
json_t *di_js_rewrite(js *c, json_t *s) {
    static const char *dep_kw[] = {"dependencies", "dependentRequired", "dependentSchemas"};
    static const char *cond_kw[] = {"if", "then", "else"};
    /* beside allOf, "not" waits for the merge: it may negate values or names another part adds */
    bool defer_not = json_object_get(s, "allOf") != NULL;
    bool any = !defer_not && json_object_get(s, "not") != NULL;
    for (size_t i = 0; i < 3; i++) any = any || json_object_get(s, dep_kw[i]) || json_object_get(s, cond_kw[i]);
    if (!any) return s;
    /* shallow, with the arrays appended to below copied: subschemas stay shared */
    json_t *m = json_copy(s);
    if (!m) return di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory"), NULL;
    json_array_append_new(c->keep, m); /* memo keys are pointers: keep the copy alive */
    for (size_t i = 0; i < 2; i++) {
        json_t *arr = json_object_get(m, i ? "allOf" : "required");
        if (json_is_array(arr)) json_object_set_new(m, i ? "allOf" : "required", json_copy(arr));
    }
    /* if/then/else: (if and then) or (not if and else), as one more allOf part holding that anyOf;
     * the two branches compile through allOf and the "not" rewrites below (a form of not they do
     * not handle is refused there). then/else without if, or if alone, constrain nothing. */
    json_t *cif = json_object_get(s, "if"), *cthen = json_object_get(s, "then"), *celse = json_object_get(s, "else");
    for (size_t i = 0; i < 3; i++) json_object_del(m, cond_kw[i]);
    if (cif && (cthen || celse)) {
        json_t *all = json_object_get(m, "allOf");
        if (all && !json_is_array(all)) return di_js_fail(c, DI_ERR_INVALID, "%s", "allOf is not an array"), NULL;
        json_t *alt = json_pack("{s:[{s:[O,O]},{s:[{s:O},O]}]}", "anyOf", "allOf", cif, cthen ? cthen : json_true(), "allOf",
                                "not", cif, celse ? celse : json_true());
        if (!alt) return di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory"), NULL;
        if (!all) json_object_set_new(m, "allOf", all = json_array());
        json_array_append_new(all, alt);
    }
    for (size_t i = 0; i < 3; i++) {
        json_t *deps = json_object_get(s, dep_kw[i]);
        if (!deps) continue;
        json_object_del(m, dep_kw[i]);
        if (!json_is_object(deps)) return di_js_fail(c, DI_ERR_INVALID, "keyword '%s' is not an object", dep_kw[i]), NULL;
        const char *a;
        json_t *v;
        json_object_foreach(deps, a, v) {
            json_t *req = json_object_get(m, "required");
            if (json_is_array(v)) {
                if (!req) json_object_set_new(m, "required", req = json_array());
                for (size_t k = 0; k < json_array_size(v); k++)
                    if (json_is_string(json_array_get(v, k)) && !in_required(req, json_string_value(json_array_get(v, k))))
                        json_array_append(req, json_array_get(v, k));
            } else if (di_js_trivial(v)) {
                continue;
            } else if (in_required(req, a)) {
                json_t *all = json_object_get(m, "allOf");
                if (all && !json_is_array(all)) return di_js_fail(c, DI_ERR_INVALID, "%s", "allOf is not an array"), NULL;
                if (!all) json_object_set_new(m, "allOf", all = json_array());
                json_array_append(all, v);
            } else { /* an optional trigger: absent, or present and the dependent schema holds */
                json_t *all = json_object_get(m, "allOf");
                if (all && !json_is_array(all)) return di_js_fail(c, DI_ERR_INVALID, "%s", "allOf is not an array"), NULL;
                json_t *alt = json_pack("{s:[{s:{s:b}},{s:[s],s:[O]}]}", "anyOf", "properties", a, 0, "required", a, "allOf", v);
                if (!alt) return di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory"), NULL;
                if (!all) json_object_set_new(m, "allOf", all = json_array());
                json_array_append_new(all, alt);
            }
        }
    }
    json_t *n = json_object_get(s, "not");
    if (!n || defer_not) return m;
    json_object_del(m, "not");
    if (json_is_object(n) && json_is_string(json_object_get(n, "$ref"))) {
        json_t *t = di_js_resolve_ref(c, json_string_value(json_object_get(n, "$ref")));
        if (!t) return NULL;
        if (json_is_object(t) && json_object_size(n) == 1) n = t;
    }
    if (json_is_false(n)) return m;
    if (di_js_trivial(n)) return json_false();
    /* the constraining keywords of the negated schema */
    const char *only = NULL, *k;
    json_t *kv;
    size_t nk = 0;
    json_object_foreach(n, k, kv) if (di_js_constrains(k)) only = k, nk++;
    if (nk == 1 && !strcmp(only, "type")) {
        json_t *t = json_object_get(n, "type"), *have = json_object_get(m, "type");
        unsigned excl = type_bits_of(t), allow = have ? type_bits_of(have) : 0x7f;
        if (!excl && t) return di_js_fail(c, DI_ERR_INVALID, "%s", "not: type is not a type name or list"), NULL;
        /* bit 2 (integer) lies inside bit 1 (number): excluding integers from numbers is not a type */
        if ((excl & 4) && !(excl & 2) && (allow & 2))
            return di_js_fail(c, DI_ERR_UNSUPPORTED, "%s", "keyword 'not' {type: integer} beside numbers"), NULL;
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
    json_t *names = json_array();
    if (!names) return di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory"), NULL;
    if (forbid_names(c, n, names, 0)) {
        /* objects without these names fail n; a non-object may pass n (its required is vacuous):
         * keep to objects */
        json_t *have = json_object_get(m, "type"), *props = json_object_get(m, "properties");
        if ((have && !(type_bits_of(have) & (1u << 5))) || (props && !json_is_object(props))) {
            json_decref(names);
            return di_js_fail(c, DI_ERR_UNSUPPORTED, "%s", "keyword 'not' {required} beside a non-object type"), NULL;
        }
        json_object_set_new(m, "type", json_string("object"));
        json_t *np = props ? json_copy(props) : json_object();
        for (size_t i = 0; i < json_array_size(names); i++) /* an absent or declared name: absent now */
            json_object_set_new(np, json_string_value(json_array_get(names, i)), json_false());
        json_object_set_new(m, "properties", np);
        json_decref(names);
        return m;
    }
    json_decref(names);
    /* not {properties: {p: S}}: p is present and fails S (n passes every non-object: objects only) */
    json_t *nprops = json_object_get(n, "properties");
    if (nk == 1 && json_is_object(nprops) && json_object_size(nprops) == 1) {
        const char *p = json_object_iter_key(json_object_iter(nprops));
        json_t *ps = json_object_get(nprops, p), *have = json_object_get(m, "type");
        json_t *props = json_object_get(m, "properties"), *req = json_object_get(m, "required");
        if ((have && !(type_bits_of(have) & (1u << 5))) || (props && !json_is_object(props)) || (req && !json_is_array(req)))
            return di_js_fail(c, DI_ERR_UNSUPPORTED, "%s", "keyword 'not' {properties} beside a non-object type"), NULL;
        json_t *np = props ? json_copy(props) : json_object();
        json_t *prev = json_object_get(np, p);
        json_t *neg = prev ? json_pack("{s:[O,{s:O}]}", "allOf", prev, "not", ps) : json_pack("{s:O}", "not", ps);
        if (!np || !neg) return json_decref(np), json_decref(neg), di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory"), NULL;
        json_object_set_new(np, p, neg);
        json_object_set_new(m, "properties", np);
        if (!req) json_object_set_new(m, "required", req = json_array());
        if (!in_required(req, p)) json_array_append_new(req, json_string(p));
        json_object_set_new(m, "type", json_string("object"));
        return m;
    }
    /* not {const/enum} beside type boolean: the other value */
    json_t *mt = json_object_get(m, "type");
    if (nk == 1 && (json_object_get(n, "enum") || json_object_get(n, "const")) && json_is_string(mt) &&
        !strcmp(json_string_value(mt), "boolean") && !json_object_get(m, "enum") && !json_object_get(m, "const"))
        json_object_set_new(m, "enum", json_pack("[b,b]", 1, 0));
    /* not {enum/const of strings} beside a plain string: strings other than those values */
    json_t *nen0 = json_object_get(n, "enum"), *ncst0 = json_object_get(n, "const");
    if (nk == 1 && (nen0 || ncst0) && plain_string(m)) {
        json_t *vals = ncst0 ? json_pack("[O]", ncst0) : json_deep_copy(nen0);
        json_t *strs = json_object();
        for (size_t i = 0; vals && strs && i < json_array_size(vals); i++)
            if (json_is_string(json_array_get(vals, i))) /* other values never match a string */
                json_object_set_new(strs, json_string_value(json_array_get(vals, i)), json_true());
        json_decref(vals);
        if (!strs) return di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory"), NULL;
        json_t *prev = json_object_get(m, DI_JS_NOT_STRINGS); /* from an earlier rewrite of a merged part */
        if (json_is_object(prev)) json_object_update(strs, prev);
        json_object_set_new(m, "type", json_string("string"));
        json_object_set_new(m, DI_JS_NOT_STRINGS, strs);
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
    return di_js_fail(c, DI_ERR_UNSUPPORTED, "%s",
                "keyword 'not' other than not-type, not-required (also in allOf/anyOf), not-enum/const beside "
                "enum/const or a plain string, true/false"),
           NULL;
}
