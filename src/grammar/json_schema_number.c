/* JSON Schema numbers: "integer" and "number" with minimum / maximum / exclusive* bounds and
 * multipleOf, compiled to regular languages over the decimal spellings the grammar emits.
 *
 * What is emitted (a subset of the valid spellings, never an invalid value):
 * - without bounds or multipleOf: the JSON number grammar (exponents included);
 * - integers with bounds: canonical decimals in [ceil(lo), floor(hi)];
 * - numbers with bounds: -?INT(.DIGITS)? without exponent, compared with the bounds exactly as
 *   decimals (fraction digits of any length: 0.30000000000000004 > 0.3);
 * - multipleOf k = P / 10^sc (k's shortest decimal): decimals with at most sc fraction digits
 *   whose scaled value N = x * 10^sc is divisible by P, at most 15 digits of N (so every accepted
 *   value and k's multiple are exact as binary doubles when k is, e.g. 2.5 or 7); the residue
 *   of N mod P is the automaton's state, so P is limited to DI_JS_MULTIPLE_MAX states.
 *
 * Bounds are read as jansson's doubles. An inclusive bound is the shortest decimal that reads
 * back as that double; an exclusive one becomes the inclusive bound of the next double inward
 * (exclusiveMinimum 0 -> minimum 5e-324). The accepted set then holds under both exact decimal
 * comparison and comparison of the instance's nearest double (rounding is monotone). multipleOf
 * follows the specification's exact division (as llguidance does): a validator that divides
 * binary doubles (Python jsonschema: 0.07 / 0.01 = 7.000000000000001) rejects some values the
 * grammar accepts when k is not a binary fraction (0.01, 0.1); see the README's coverage notes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/json_schema_impl.h"

/* the residue automaton of multipleOf has P states per digit position */
#define DI_JS_MULTIPLE_MAX 1000
/* multipleOf: scaled values N = x * 10^sc have at most 15 digits */
#define SCALED_CAP 999999999999999LL

static int32_t nothing(js *c) { return di_cfg_nt(c->g, "<nothing>"); }
static int32_t empty(js *c) { return di_cfg_seq(c->g, NULL, 0); }
static void rule1(js *c, int32_t nt, int32_t a) { di_cfg_rule(c->g, nt, &a, 1); }
static void rule2(js *c, int32_t nt, int32_t a, int32_t b) { di_cfg_rule(c->g, nt, (int32_t[]){a, b}, 2); }

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
    if (have && (*val > 9e15 || *val < -9e15)) return di_js_fail(c, DI_ERR_UNSUPPORTED, "%s", "numeric bound beyond +-9e15"), false;
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

/* ---- decimals ---- */

/* A decimal value: sign, canonical integer digits ("0" for zero) and fraction digits without
 * trailing zeros. |value| <= 9e15 (num_bound refuses larger bounds), so ip fits 16 digits; the
 * smallest double, 5e-324, has 324 fraction digits. */
typedef struct dec {
    bool neg;
    char ip[24];
    char fr[400];
} dec;

/* The shortest decimal that reads back as d (at most 17 significant digits); false when |d| >= 1e20
 * (callers refuse such values first). */
static bool dec_of(double d, dec *out) {
    char buf[48];
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, d);
        if (strtod(buf, NULL) == d) break;
    }
    memset(out, 0, sizeof *out);
    char dig[24];
    size_t nd = 0;
    const char *q = buf;
    if (*q == '-') out->neg = true, q++;
    for (; *q && *q != 'e' && nd < sizeof dig - 1; q++)
        if (*q >= '0' && *q <= '9') dig[nd++] = *q;
    dig[nd] = 0;
    int point = (*q == 'e' ? atoi(q + 1) : 0) + 1; /* digits before the decimal point */
    if (d == 0) {
        out->neg = false;
        strcpy(out->ip, "0");
        return true;
    }
    if (point > 20) return false;
    if (point <= 0) {
        strcpy(out->ip, "0");
        size_t z = (size_t)-point;
        memset(out->fr, '0', z);
        memcpy(out->fr + z, dig, nd + 1);
    } else {
        for (int i = 0; i < point; i++) out->ip[i] = i < (int)nd ? dig[i] : '0';
        out->ip[point] = 0;
        if ((size_t)point < nd) memcpy(out->fr, dig + point, nd - (size_t)point + 1);
    }
    size_t n = strlen(out->fr);
    while (n && out->fr[n - 1] == '0') out->fr[--n] = 0;
    return true;
}

static bool dec_zero(const dec *a) { return !strcmp(a->ip, "0") && !a->fr[0]; }

/* Compares magnitudes. */
static int mag_cmp(const dec *a, const dec *b) {
    size_t la = strlen(a->ip), lb = strlen(b->ip);
    if (la != lb) return la < lb ? -1 : 1;
    int r = strcmp(a->ip, b->ip);
    if (r) return r < 0 ? -1 : 1;
    for (size_t i = 0;; i++) {
        char x = a->fr[i] ? a->fr[i] : '0', y = b->fr[i] ? b->fr[i] : '0';
        if (x != y) return x < y ? -1 : 1;
        if (!a->fr[i] && !b->fr[i]) return 0;
        if (!a->fr[i] || !b->fr[i]) { /* the rest of the longer one decides: it has no trailing zeros */
            return a->fr[i] ? 1 : -1;
        }
    }
}

static int dec_cmp(const dec *a, const dec *b) {
    bool na = a->neg && !dec_zero(a), nb = b->neg && !dec_zero(b);
    if (na != nb) return na ? -1 : 1;
    return na ? -mag_cmp(a, b) : mag_cmp(a, b);
}

/* The inclusive bound on one side: minimum m -> m, exclusiveMinimum m -> the double after m
 * (so x >= it implies x > m for exact decimals and for x's nearest double); maxima mirrored. */
static bool bound_dec(js *c, json_t *s, bool upper, dec *out) {
    double v = 0;
    bool excl = false;
    if (!num_bound(c, s, upper, &v, &excl)) return false;
    if (excl) v = nextafter(v, upper ? -INFINITY : INFINITY);
    return dec_of(v, out); /* |v| <= 9e15: num_bound refused the rest */
}

/* ---- numbers with bounds: fraction digits compared with a bound's fraction ---- */

static int32_t any_digits(js *c, bool nonempty) { return di_cfg_repeat(c->g, digit_class(c, 0, 9), nonempty, -1); }

/* Fraction digit strings s (what follows '.') with 0.s >= 0.f; nonempty: s has a digit. */
static int32_t frac_ge(js *c, const char *f, bool nonempty) {
    if (!*f) return any_digits(c, nonempty);
    int32_t nt = di_cfg_nt(c->g, NULL);
    int d = *f - '0';
    if (d < 9) rule2(c, nt, digit_class(c, d + 1, 9), any_digits(c, false));
    rule2(c, nt, digit_class(c, d, d), frac_ge(c, f + 1, false));
    return nt;
}

/* Fraction digit strings s with 0.s <= 0.f. */
static int32_t frac_le(js *c, const char *f, bool nonempty) {
    if (!*f) return di_cfg_repeat(c->g, digit_class(c, 0, 0), nonempty, -1);
    int32_t nt = di_cfg_nt(c->g, NULL);
    int d = *f - '0';
    if (!nonempty) rule1(c, nt, empty(c));
    if (d > 0) rule2(c, nt, digit_class(c, 0, d - 1), any_digits(c, false));
    rule2(c, nt, digit_class(c, d, d), frac_le(c, f + 1, false));
    return nt;
}

/* Fraction digit strings s with 0.a <= 0.s <= 0.b (a <= b). */
static int32_t frac_between(js *c, const char *a, const char *b, bool nonempty) {
    if (!*a) return frac_le(c, b, nonempty);
    int32_t nt = di_cfg_nt(c->g, NULL);
    int x = *a - '0', y = *b - '0'; /* b is not empty: 0 < a <= b */
    if (x == y) {
        rule2(c, nt, digit_class(c, x, x), frac_between(c, a + 1, b + 1, false));
        return nt;
    }
    rule2(c, nt, digit_class(c, x, x), frac_ge(c, a + 1, false));
    if (y - x > 1) rule2(c, nt, digit_class(c, x + 1, y - 1), any_digits(c, false));
    rule2(c, nt, digit_class(c, y, y), frac_le(c, b + 1, false));
    return nt;
}

/* "" or ".DIGITS" where DIGITS is in `digits` (built nonempty); `bare` allows no fraction. */
static int32_t frac_part(js *c, int32_t digits, bool bare) {
    int32_t nt = di_cfg_nt(c->g, NULL);
    if (bare) rule1(c, nt, empty(c));
    rule2(c, nt, di_cfg_byte(c->g, '.'), digits);
    return nt;
}

/* Unsigned decimals INT(.DIGITS)? with value in [a, b] (b NULL: unbounded); a <= b. */
static int32_t mag_range(js *c, const dec *a, const dec *b) {
    int64_t ai = strtoll(a->ip, NULL, 10), bi = b ? strtoll(b->ip, NULL, 10) : 0;
    int32_t nt = di_cfg_nt(c->g, NULL);
    int32_t ia = di_cfg_literal(c->g, a->ip, strlen(a->ip));
    if (b && ai == bi) {
        rule2(c, nt, ia, frac_part(c, frac_between(c, a->fr, b->fr, true), !a->fr[0]));
        return nt;
    }
    rule2(c, nt, ia, frac_part(c, frac_ge(c, a->fr, true), !a->fr[0]));
    if (!b || bi - ai >= 2) rule2(c, nt, nonneg_range(c, ai + 1, b ? bi - 1 : -1), frac_part(c, any_digits(c, true), true));
    if (b) rule2(c, nt, di_cfg_literal(c->g, b->ip, strlen(b->ip)), frac_part(c, frac_le(c, b->fr, true), true));
    return nt;
}

/* Non-integer numbers within the bounds (no exponent): non-negative values without a sign, then
 * non-positive ones after '-' ("-0" is zero and allowed when zero is). */
static int32_t bounded_number(js *c, const dec *lo, const dec *hi) {
    if (lo && hi && dec_cmp(lo, hi) > 0) return nothing(c);
    dec zero = {.ip = "0"};
    int32_t nt = di_cfg_nt(c->g, NULL);
    if (!hi || !hi->neg || dec_zero(hi)) rule1(c, nt, mag_range(c, lo && !lo->neg ? lo : &zero, hi));
    if (!lo || lo->neg || dec_zero(lo)) {
        dec a = hi && hi->neg ? *hi : zero, b = lo ? *lo : zero;
        a.neg = b.neg = false;
        rule2(c, nt, di_cfg_byte(c->g, '-'), mag_range(c, &a, lo ? &b : NULL));
    }
    return nt;
}

/* ---- multipleOf: a residue automaton over the scaled digits ---- */

enum { PH_INT, PH_DOT, PH_FRAC, PH_FRAC_MUST }; /* integer digits / before '.' / after a fraction digit / just after '.' */

typedef struct mul_ctx {
    js *c;
    int64_t P; /* N = x * 10^sc must be divisible by P */
    int sc;
    int ip_len;             /* digits of the integer part in the current slice */
    char lo[40], hi[40];    /* the slice's bounds on N, ip_len + sc digits (zero-padded) */
    int32_t *memo;          /* [4][17][P] free states (neither bound is tight), -1 until built */
} mul_ctx;

static int64_t pow10_mod(int e, int64_t p) {
    int64_t r = 1 % p;
    while (e-- > 0) r = r * 10 % p;
    return r;
}

/* Rest of a number after `pos` digits of N with residue m; tl/th: the digits so far equal the
 * slice's lower / upper bound's. States where neither is tight depend only on (phase, digits
 * left, m) and are shared by all slices. */
static int32_t mul_state(mul_ctx *x, int pos, int64_t m, bool tl, bool th, int ph) {
    js *c = x->c;
    if (c->rc || di_cfg_failed(c->g)) return 0; /* a size limit was hit: stop walking the states */
    int total = x->ip_len + x->sc;
    int32_t *slot = NULL;
    if (!tl && !th) {
        int left = ph == PH_INT ? x->ip_len - pos : total - pos;
        slot = &x->memo[((size_t)ph * 17 + (size_t)left) * (size_t)x->P + (size_t)m];
        if (*slot >= 0) return *slot;
    }
    int32_t nt = di_cfg_nt(c->g, NULL);
    if (slot) *slot = nt;
    if (ph == PH_DOT || ph == PH_FRAC) { /* stop here: the digits not written are zeros */
        bool ok = m * pow10_mod(total - pos, x->P) % x->P == 0;
        for (int i = pos; tl && i < total; i++) ok = ok && x->lo[i] == '0';
        if (ok) rule1(c, nt, empty(c));
        if (ph == PH_DOT) {
            if (x->sc > 0) rule2(c, nt, di_cfg_byte(c->g, '.'), mul_state(x, pos, m, tl, th, PH_FRAC_MUST));
            return nt;
        }
    }
    if (pos == total) return nt;
    int dlo = tl ? x->lo[pos] - '0' : 0, dhi = th ? x->hi[pos] - '0' : 9;
    int32_t next[10];
    for (int d = dlo; d <= dhi && !c->rc; d++) {
        int nph = ph == PH_INT ? (pos + 1 == x->ip_len ? PH_DOT : PH_INT) : PH_FRAC;
        next[d] = mul_state(x, pos + 1, (m * 10 + d) % x->P, tl && d == dlo, th && d == dhi, nph);
    }
    for (int d = dlo; d <= dhi && !c->rc; d++) { /* one rule per distinct successor */
        bool first = true;
        for (int e = dlo; e < d; e++) first = first && next[e] != next[d];
        if (!first) continue;
        di_cfg_class cls = {{0}};
        for (int e = d; e <= dhi; e++)
            if (next[e] == next[d]) di_cfg_class_add_range(&cls, (unsigned)('0' + e), (unsigned)('0' + e));
        rule2(c, nt, di_cfg_class_sym(c->g, &cls), next[d]);
    }
    return nt;
}

static int ndigits(int64_t v) {
    int n = 1;
    while (v >= 10) v /= 10, n++;
    return n;
}

static int64_t pow10i(int e) {
    int64_t r = 1;
    while (e-- > 0) r *= 10;
    return r;
}

/* Unsigned spellings of the multiples N in [a, b] (0 <= a <= b <= SCALED_CAP), one slice per
 * length of the integer part. */
static int32_t mul_mag(mul_ctx *x, int64_t a, int64_t b) {
    js *c = x->c;
    int32_t nt = di_cfg_nt(c->g, NULL);
    int64_t unit = pow10i(x->sc);
    for (int len = ndigits(a / unit); len <= ndigits(b / unit) && !c->rc; len++) {
        int64_t lo = len == 1 ? 0 : pow10i(len - 1) * unit, hi = pow10i(len) * unit - 1;
        if (lo < a) lo = a;
        if (hi > b) hi = b;
        if (lo > hi) continue;
        x->ip_len = len;
        int width = (len + x->sc) & 31; /* <= 16 + 14 digits */
        snprintf(x->lo, sizeof x->lo, "%0*lld", width, (long long)lo);
        snprintf(x->hi, sizeof x->hi, "%0*lld", width, (long long)hi);
        rule1(c, nt, mul_state(x, 0, 0, true, true, PH_INT));
    }
    return nt;
}

/* A bound scaled by 10^sc and rounded inward (ceil for the lower bound), clamped to the cap. */
static int64_t scaled_bound(const dec *d, int sc, bool upper) {
    char digits[64];
    int n = snprintf(digits, sizeof digits, "%s", d->ip);
    size_t fl = strlen(d->fr);
    for (int i = 0; i < sc; i++) digits[n++] = (size_t)i < fl ? d->fr[i] : '0';
    digits[n] = 0;
    bool rest = fl > (size_t)sc; /* nonzero digits beyond sc (fr has no trailing zeros) */
    const char *p = digits;
    while (*p == '0' && p[1]) p++;
    int64_t v = strlen(p) > 16 ? SCALED_CAP + 1 : strtoll(p, NULL, 10);
    if (v > SCALED_CAP) v = SCALED_CAP + 1;
    bool neg = d->neg && (v || rest);
    /* magnitude rounded: lower bound of a positive value and upper of a negative one round up */
    if (rest && (upper == neg)) v++;
    if (v > SCALED_CAP) v = SCALED_CAP + 1;
    return neg ? -v : v;
}

/* multipleOf k beside optional bounds; integer: only integral multiples. */
static int32_t multiple_sym(js *c, json_t *s, bool integer, const dec *lo, const dec *hi) {
    json_t *k = json_object_get(s, "multipleOf");
    if (!json_is_number(k) || !(json_number_value(k) > 0) || !isfinite(json_number_value(k)))
        return di_js_fail(c, DI_ERR_INVALID, "%s", "multipleOf is not a positive number");
    dec kd;
    if (json_number_value(k) >= 1e15 || !dec_of(json_number_value(k), &kd))
        return di_js_fail(c, DI_ERR_LIMIT, "%s", "multipleOf of 1e15 or more (only 0 has at most 15 digits)");
    char kdig[448];
    snprintf(kdig, sizeof kdig, "%s%s", kd.ip, kd.fr);
    const char *p = kdig;
    while (*p == '0' && p[1]) p++;
    int sc = (int)strlen(kd.fr);
    if (sc > 14 || strlen(p) > 15)
        return di_js_fail(c, DI_ERR_LIMIT, "multipleOf %s: more than 15 significant or fraction digits", kdig);
    int64_t P = strtoll(p, NULL, 10);
    if (integer) { /* n * 10^sc divisible by P  <=>  n divisible by P / gcd(P, 10^sc) */
        int64_t a = P, b = pow10i(sc);
        while (b) {
            int64_t t = a % b;
            a = b, b = t;
        }
        P /= a, sc = 0;
    }
    if (P > DI_JS_MULTIPLE_MAX) {
        char what[96];
        snprintf(what, sizeof what, "%.15g needs %lld residue states (limit %d)", json_number_value(k), (long long)P,
                 DI_JS_MULTIPLE_MAX);
        return di_js_fail(c, DI_ERR_LIMIT, "multipleOf %s", what);
    }
    int64_t nlo = lo ? scaled_bound(lo, sc, false) : -SCALED_CAP, nhi = hi ? scaled_bound(hi, sc, true) : SCALED_CAP;
    if (nlo < -SCALED_CAP) nlo = -SCALED_CAP;
    if (nhi > SCALED_CAP) nhi = SCALED_CAP;
    if (nlo > nhi) return nothing(c);
    mul_ctx x = {.c = c, .P = P, .sc = sc};
    size_t nmemo = 4 * 17 * (size_t)P;
    x.memo = malloc(nmemo * sizeof *x.memo);
    if (!x.memo) return di_js_fail(c, DI_ERR_NOMEM, "%s", "out of memory");
    for (size_t i = 0; i < nmemo; i++) x.memo[i] = -1;
    int32_t nt = di_cfg_nt(c->g, NULL);
    if (nhi >= 0) rule1(c, nt, mul_mag(&x, nlo > 0 ? nlo : 0, nhi));
    if (nlo <= 0) rule2(c, nt, di_cfg_byte(c->g, '-'), mul_mag(&x, nhi < 0 ? -nhi : 0, -nlo));
    free(x.memo);
    return nt;
}

int32_t di_js_number(js *c, json_t *s, bool integer) {
    static const char *bounds[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    bool any = false;
    for (size_t i = 0; i < 4; i++) {
        json_t *b = json_object_get(s, bounds[i]);
        if (b && !json_is_number(b) && !json_is_boolean(b))
            return di_js_fail(c, DI_ERR_INVALID, "numeric bound '%s' is not a number", bounds[i]);
        if (json_is_number(b)) any = true;
    }
    bool mult = json_object_get(s, "multipleOf") != NULL;
    if (!any && !mult) return integer ? c->integer : c->number;
    if (integer && !mult) {
        int64_t lo = 0, hi = 0;
        bool has_lo = int_bound(c, s, false, &lo), has_hi = !c->rc && int_bound(c, s, true, &hi);
        if (c->rc) return 0;
        return int_range(c, has_lo, lo, has_hi, hi);
    }
    dec lo, hi;
    bool has_lo = bound_dec(c, s, false, &lo), has_hi = !c->rc && bound_dec(c, s, true, &hi);
    if (c->rc) return 0;
    if (mult) return multiple_sym(c, s, integer, has_lo ? &lo : NULL, has_hi ? &hi : NULL);
    return bounded_number(c, has_lo ? &lo : NULL, has_hi ? &hi : NULL);
}
