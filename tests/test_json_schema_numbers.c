/* JSON Schema numbers (src/grammar/json_schema_number.c): fractional bounds and multipleOf
 * against an exact reference. Every string the grammar accepts up to 5 bytes (a depth-first walk
 * of the matcher over "-0123456789.eE+") must be valid both as an exact decimal and as the
 * nearest double (what Python/JavaScript validators compare); every valid spelling of up to 4
 * bytes in the emitted form must be accepted; edge spellings (-0, 1e2, 0.30000000000000004,
 * huge exponents) are checked one by one; masks are compared with brute force.  di-test: asan */
#include <ctype.h>
#include <math.h>
#include <time.h>

#include "grammar_testlib.h"

/* ---- the reference: exact decimals ---- */

/* value = (neg ? -1 : 1) * d * 10^exp, d a digit string without leading zeros ("" is zero) */
typedef struct xdec {
    bool neg;
    char d[128];
    int exp;
} xdec;

/* Strict JSON number syntax; false for anything else. */
static bool parse_num(const char *s, xdec *x) {
    memset(x, 0, sizeof *x);
    const char *p = s;
    if (*p == '-') x->neg = true, p++;
    if (!isdigit((unsigned char)*p)) return false;
    if (*p == '0' && isdigit((unsigned char)p[1])) return false;
    size_t n = 0;
    while (isdigit((unsigned char)*p)) {
        if (n < sizeof x->d - 1) x->d[n++] = *p;
        else return false;
        p++;
    }
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p)) return false;
        while (isdigit((unsigned char)*p)) {
            if (n >= sizeof x->d - 1) return false;
            x->d[n++] = *p++;
            x->exp--;
        }
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        int sign = 1;
        if (*p == '+' || *p == '-') sign = *p == '-' ? -1 : 1, p++;
        if (!isdigit((unsigned char)*p)) return false;
        long e = 0;
        for (; isdigit((unsigned char)*p); p++)
            if (e < 100000) e = e * 10 + (*p - '0');
        x->exp += (int)(sign * e);
    }
    if (*p) return false;
    x->d[n] = 0;
    size_t z = 0;
    while (x->d[z] == '0') z++;
    memmove(x->d, x->d + z, n - z + 1);
    return true;
}

/* Exact comparison of two decimals. */
static int xcmp(const xdec *a, const xdec *b) {
    bool za = !a->d[0], zb = !b->d[0];
    int sa = za ? 0 : a->neg ? -1 : 1, sb = zb ? 0 : b->neg ? -1 : 1;
    if (sa != sb) return sa < sb ? -1 : 1;
    if (!sa) return 0;
    /* magnitudes: compare the position of the leading digit, then the digits */
    long la = (long)strlen(a->d) + a->exp, lb = (long)strlen(b->d) + b->exp;
    int r = 0;
    if (la != lb) r = la < lb ? -1 : 1;
    else
        for (size_t i = 0;; i++) {
            char x = a->d[i] ? a->d[i] : '0', y = b->d[i] ? b->d[i] : '0';
            if (!a->d[i] && !b->d[i]) break;
            if (x != y) {
                r = x < y ? -1 : 1;
                break;
            }
        }
    return sa < 0 ? -r : r;
}

/* Is x / k an integer (exactly)? */
static bool xmultiple(const xdec *x, const xdec *k) {
    if (!x->d[0]) return true;
    long long p = strtoll(k->d, NULL, 10); /* k = p * 10^k->exp, test divisors are small */
    int shift = x->exp - k->exp;           /* x / k = (x->d * 10^shift) / p */
    size_t n = strlen(x->d);
    if (shift < 0) { /* x->d must end in -shift zeros, and the rest be divisible by p */
        if ((size_t)-shift > n) return false;
        for (size_t i = n - (size_t)-shift; i < n; i++)
            if (x->d[i] != '0') return false;
        n -= (size_t)-shift;
        shift = 0;
    }
    long long m = 0;
    for (size_t i = 0; i < n; i++) m = (m * 10 + (x->d[i] - '0')) % p;
    for (int i = 0; i < shift && i < 64; i++) m = m * 10 % p;
    return m == 0;
}

typedef struct num_case {
    const char *schema;
    bool integer;                   /* the schema's type */
    const char *lo, *hi;            /* bounds as written (NULL: none) */
    bool ex_lo, ex_hi;
    const char *mult;               /* multipleOf as written (NULL: none) */
    int frac_max;                   /* emitted form: fraction digits at most (-1 any, 0 none) */
    const char *edges;              /* "spelling=0|1 ..." checked one by one */
} num_case;

static const num_case k_cases[] = {
    {"{\"type\":\"number\",\"minimum\":0.1,\"maximum\":0.3}", false, "0.1", "0.3", false, false, NULL, -1,
     "0.1=1 0.3=1 0.2=1 0.30=1 0.30000000000000004=0 0.29999999999999999=1 0.09999999999999999=0 1e-1=0 -0=0 0=0"},
    {"{\"type\":\"number\",\"minimum\":-2.5,\"exclusiveMaximum\":1.25}", false, "-2.5", "1.25", false, true, NULL, -1,
     "-2.5=1 -2.50=1 -2.51=0 1.25=0 1.2499=1 1.24999999999999999=0 -0=1 0=1 -0.0=1 1=1 12e-1=0"},
    {"{\"type\":\"number\",\"exclusiveMinimum\":0}", false, "0", NULL, true, false, NULL, -1,
     "0=0 -0=0 0.0=0 0.000=0 0.001=1 5e-324=0 1e400=0 123456789.5=1"},
    {"{\"type\":\"number\",\"maximum\":-1.5}", false, NULL, "-1.5", false, false, NULL, -1,
     "-1.5=1 -1.49=0 -1.6=1 -2=1 -100.25=1 0=0 -0=0 -1.5e0=0"},
    {"{\"type\":\"number\",\"exclusiveMinimum\":-0.5,\"maximum\":0}", false, "-0.5", "0", true, false, NULL, -1,
     "-0.5=0 -0.49=1 0=1 -0=1 0.0=1 0.01=0 -0.0=1"},
    {"{\"type\":\"number\",\"multipleOf\":0.01}", false, NULL, NULL, false, false, "0.01", 2,
     "0.07=1 10.99=1 0.3=1 1.001=0 5=1 -0=1 -0.01=1 1.50=1 1.500=0 1e2=0 0.30000000000000004=0"},
    {"{\"type\":\"number\",\"multipleOf\":0.25,\"minimum\":-1,\"exclusiveMaximum\":2}", false, "-1", "2", false, true,
     "0.25", 2, "-1=1 -1.25=0 2=0 1.75=1 1.7=0 0.5=1 0.50=1 -0=1 1.2=0"},
    {"{\"type\":\"integer\",\"multipleOf\":7,\"minimum\":-20,\"maximum\":30}", true, "-20", "30", false, false, "7", 0,
     "14=1 15=0 -21=0 -14=1 0=1 -0=1 28=1 35=0 7.0=0 7e0=0"},
    {"{\"type\":\"integer\",\"multipleOf\":2.5}", true, NULL, NULL, false, false, "2.5", 0,
     "5=1 10=1 7=0 2.5=0 -15=1 999999999999995=1 1000000000000000=0"},
    {"{\"multipleOf\":3}", false, NULL, NULL, false, false, "3", 0,
     "3=1 -3=1 4=0 999999999999999=1 1000000000000002=0 3.0=0 \"3\"=0"},
    {"{\"type\":\"number\",\"multipleOf\":1.5,\"exclusiveMinimum\":1,\"maximum\":9}", false, "1", "9", true, false, "1.5",
     1, "1=0 1.5=1 3=1 4.5=1 9=1 9.0=1 10.5=0 0=0 1.50=0"},
};

static bool ref_valid(const num_case *t, const char *s) {
    xdec x;
    if (!parse_num(s, &x)) return false;
    double dx = strtod(s, NULL);
    if (t->integer && x.exp < 0) { /* exactly integral: the last -exp digits are zeros */
        size_t n = strlen(x.d), z = (size_t)-x.exp;
        for (size_t i = z > n ? 0 : n - z; i < n; i++)
            if (x.d[i] != '0') return false;
    }
    if (t->lo) {
        xdec b;
        parse_num(t->lo, &b);
        double db = strtod(t->lo, NULL);
        int c = xcmp(&x, &b);
        if (t->ex_lo ? (c <= 0 || !(dx > db)) : (c < 0 || !(dx >= db))) return false;
    }
    if (t->hi) {
        xdec b;
        parse_num(t->hi, &b);
        double db = strtod(t->hi, NULL);
        int c = xcmp(&x, &b);
        if (t->ex_hi ? (c >= 0 || !(dx < db)) : (c > 0 || !(dx <= db))) return false;
    }
    if (t->mult) {
        xdec k;
        parse_num(t->mult, &k);
        if (!xmultiple(&x, &k)) return false;
    }
    return true;
}

/* In the emitted form: no exponent, at most frac_max fraction digits, at most 15 digits with multipleOf. */
static bool emitted_form(const num_case *t, const char *s) {
    if (strpbrk(s, "eE")) return false;
    const char *dot = strchr(s, '.');
    if (dot && t->frac_max >= 0 && (int)strlen(dot + 1) > t->frac_max) return false;
    return true;
}

static di_grammar *compile(const char *src) {
    di_grammar *g = NULL;
    di_error err = {0};
    di_json_schema_opts o = {.whitespace = DI_JSON_WS_COMPACT};
    if (di_grammar_from_json_schema(src, strlen(src), &o, &g, &err)) fail_msg("%s: %s", src, err.msg);
    return g;
}

static int full_match(const di_grammar *g, const di_grammar_vocab *v, const char *s) {
    di_grammar_matcher *m = NULL;
    di_error err = {0};
    if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("matcher: %s", err.msg);
    int r = 1;
    for (const char *p = s; *p && r; p++) {
        int rc = di_grammar_matcher_accept_token(m, (uint8_t)*p + 1, &err);
        if (rc == DI_ERR_INVALID) r = 0;
        else if (rc) fail_msg("accept: %s", err.msg);
    }
    if (r && !di_grammar_matcher_can_end(m)) r = 0;
    di_grammar_matcher_free(m);
    return r;
}

static const char k_alpha[] = "-0123456789.eE+";

/* Depth-first over the strings the grammar accepts (pruned where the matcher rejects a byte). */
static void dfs(di_grammar_matcher *m, const num_case *t, char *buf, int len, int max, int *accepted) {
    di_error err = {0};
    if (len && di_grammar_matcher_can_end(m)) {
        buf[len] = 0;
        if (!ref_valid(t, buf)) fail_msg("%s accepts %s, which is not valid", t->schema, buf);
        (*accepted)++;
    }
    if (len == max) return;
    for (const char *a = k_alpha; *a; a++) {
        int rc = di_grammar_matcher_accept_token(m, (uint8_t)*a + 1, &err);
        if (rc == DI_ERR_INVALID) continue;
        if (rc) fail_msg("accept: %s", err.msg);
        buf[len] = *a;
        dfs(m, t, buf, len + 1, max, accepted);
        if (di_grammar_matcher_rollback(m, 1, &err)) fail_msg("rollback: %s", err.msg);
    }
}

static void test_numbers_exhaustive(void **state) {
    (void)state;
    gt_bytes tb = gt_vocab_bytes(0);
    di_grammar_vocab *v = gt_vocab(&tb);
    int total_acc = 0, total_valid = 0, total_valid_ok = 0, edges = 0;
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        const num_case *t = &k_cases[i];
        di_grammar *g = compile(t->schema);
        /* soundness: every accepted string up to 5 bytes */
        di_grammar_matcher *m = NULL;
        di_error err = {0};
        if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("matcher: %s", err.msg);
        char buf[8];
        int acc = 0;
        dfs(m, t, buf, 0, 5, &acc);
        di_grammar_matcher_free(m);
        assert_true(acc > 0);
        total_acc += acc;
        /* completeness: every valid spelling of up to 4 bytes over "-0123456789." in the emitted form */
        int valid = 0, valid_ok = 0;
        for (int len = 1; len <= 4; len++) {
            int combos = 1;
            for (int k = 0; k < len; k++) combos *= 12;
            for (int code = 0; code < combos; code++) {
                char s[8];
                for (int k = 0, c = code; k < len; k++, c /= 12) s[k] = k_alpha[c % 12];
                s[len] = 0;
                if (!ref_valid(t, s) || !emitted_form(t, s)) continue;
                valid++;
                int got = full_match(g, v, s);
                valid_ok += got;
                if (!got) fail_msg("%s rejects %s, valid and in the emitted form", t->schema, s);
            }
        }
        total_valid += valid, total_valid_ok += valid_ok;
        /* edges, one by one; an accepted edge must also be valid */
        char spec[512];
        snprintf(spec, sizeof spec, "%s", t->edges);
        for (char *tok = strtok(spec, " "); tok; tok = strtok(NULL, " ")) {
            char *eq = strrchr(tok, '=');
            *eq = 0;
            int want = eq[1] == '1', got = full_match(g, v, tok);
            if (got != want) fail_msg("%s: %s accepted=%d, expected %d", t->schema, tok, got, want);
            if (got && !ref_valid(t, tok)) fail_msg("%s: edge %s accepted but not valid", t->schema, tok);
            edges++;
        }
        di_grammar_free(g);
    }
    tu_report("numbers: %d accepted strings of <= 5 bytes all valid; %d/%d valid spellings of <= 4 bytes accepted; "
              "%d edge spellings as expected",
              total_acc, total_valid_ok, total_valid, edges);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* Masks of a number schema inside an object, against brute force (random walks with rollback). */
static void test_numbers_masks(void **state) {
    (void)state;
    gt_bytes tb = gt_vocab_bytes(400);
    di_grammar_vocab *v = gt_vocab(&tb);
    static const char *schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"multipleOf\":0.01,\"minimum\":0},"
        "\"b\":{\"type\":\"number\",\"exclusiveMinimum\":-0.5,\"maximum\":12.75}},\"required\":[\"a\",\"b\"]}",
        "{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"multipleOf\":7,\"maximum\":1000}}",
    };
    int checked = 0;
    for (size_t i = 0; i < 2; i++) {
        di_grammar *g = NULL;
        di_error err = {0};
        if (di_grammar_from_json_schema(schemas[i], strlen(schemas[i]), NULL, &g, &err)) fail_msg("%s", err.msg);
        for (uint64_t s = 1; s <= 5; s++) checked += gt_walk(g, v, &tb, NULL, s * 7919, 40, schemas[i]);
        di_grammar_free(g);
    }
    tu_report("number schema masks checked against brute force: %d", checked);
    assert_true(checked > 100);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Hostile and malformed multipleOf / bounds: clear errors, bounded work. */
static void test_numbers_limits(void **state) {
    (void)state;
    gt_expect_schema_error("{\"type\":\"integer\",\"multipleOf\":1234567}", DI_ERR_LIMIT, "residue states");
    gt_expect_schema_error("{\"type\":\"number\",\"multipleOf\":1e-20}", DI_ERR_LIMIT, "multipleOf");
    gt_expect_schema_error("{\"type\":\"number\",\"multipleOf\":1e300}", DI_ERR_LIMIT, "multipleOf");
    gt_expect_schema_error("{\"type\":\"number\",\"multipleOf\":0}", DI_ERR_INVALID, "positive");
    gt_expect_schema_error("{\"type\":\"number\",\"multipleOf\":-2}", DI_ERR_INVALID, "positive");
    gt_expect_schema_error("{\"type\":\"number\",\"multipleOf\":\"2\"}", DI_ERR_INVALID, "positive");
    gt_expect_schema_error("{\"type\":\"number\",\"minimum\":1e300}", DI_ERR_UNSUPPORTED, "9e15");
    gt_expect_schema_error("{\"type\":\"number\",\"minimum\":2,\"maximum\":1.5}", DI_ERR_INVALID, "matches no string");
    /* the largest residue automaton allowed, with the widest bounds: compile time stays small */
    const char *big = "{\"type\":\"number\",\"multipleOf\":0.997,\"minimum\":-9e14,\"maximum\":9e14}";
    double t0 = cpu_s();
    di_grammar *g = compile(big);
    double dt = cpu_s() - t0;
    gt_bytes tb = gt_vocab_bytes(0);
    di_grammar_vocab *v = gt_vocab(&tb);
    assert_true(full_match(g, v, "9.97"));
    assert_true(full_match(g, v, "-1.994"));
    assert_false(full_match(g, v, "1"));
    assert_false(full_match(g, v, "0.9970"));
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
    tu_report("multipleOf 0.997 (997 residues, 15 digits): compiled in %.1f ms CPU", dt * 1e3);
    assert_true(dt < 2.0);
    /* 200 such properties exceed the grammar's size limit: a clear error, soon */
    size_t cap = 200 * 80 + 64, n = 0;
    char *many = malloc(cap);
    n += (size_t)snprintf(many + n, cap - n, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 200; i++)
        n += (size_t)snprintf(many + n, cap - n, "%s\"p%d\":{\"type\":\"number\",\"multipleOf\":0.997}", i ? "," : "", i);
    snprintf(many + n, cap - n, "}}");
    t0 = cpu_s();
    gt_expect_schema_error(many, DI_ERR_LIMIT, "grammar too large");
    dt = cpu_s() - t0;
    tu_report("200 properties with multipleOf 0.997: refused (grammar size limit) after %.1f ms CPU", dt * 1e3);
    assert_true(dt < 5.0);
    free(many);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_numbers_exhaustive), cmocka_unit_test(test_numbers_masks),
                                       cmocka_unit_test(test_numbers_limits)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
