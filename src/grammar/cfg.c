#include "grammar/cfg.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

di_cfg *di_cfg_new(void) { return calloc(1, sizeof(di_cfg)); }

void di_cfg_free(di_cfg *g) {
    if (!g) return;
    for (uint32_t i = 0; i < g->n_nt; i++) free(g->nt_name[i]);
    free(g->nt_name);
    free(g->nt_loop);
    free(g->nt_loop_min);
    free(g->rule_lhs);
    free(g->rule_off);
    free(g->rhs);
    free(g->cls);
    free(g->psym);
    free(g->plhs);
    free(g->nt_rule_off);
    free(g->nt_rules);
    free(g->nullable);
    free(g->nt_recurs);
    free(g);
}

int di_cfg_fail(di_cfg *g, int code, const char *fmt, ...) {
    if (g->err_code) return g->err_code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->err_msg, sizeof g->err_msg, fmt, ap);
    va_end(ap);
    g->err_code = code;
    return code;
}

/* Grow *p (element size es) so it holds at least need elements. */
static bool grow(di_cfg *g, void **p, size_t *cap, size_t need, size_t es) {
    if (need <= *cap) return true;
    size_t n = *cap ? *cap : 16;
    while (n < need) n *= 2;
    void *q = realloc(*p, n * es);
    if (!q) {
        di_cfg_fail(g, DI_ERR_NOMEM, "out of memory growing the grammar to %zu entries", need);
        return false;
    }
    *p = q;
    *cap = n;
    return true;
}

int32_t di_cfg_nt(di_cfg *g, const char *name) {
    if (g->err_code) return 0;
    if (g->n_nt >= DI_CFG_MAX_NONTERMINALS) {
        di_cfg_fail(g, DI_ERR_LIMIT, "grammar too large: more than %u nonterminals", DI_CFG_MAX_NONTERMINALS);
        return 0;
    }
    size_t cap = g->cap_nt, c2 = g->cap_nt, c3 = g->cap_nt;
    if (!grow(g, (void **)&g->nt_name, &cap, g->n_nt + 1, sizeof(char *))) return 0;
    if (!grow(g, (void **)&g->nt_loop, &c2, g->n_nt + 1, sizeof(int32_t))) return 0;
    if (!grow(g, (void **)&g->nt_loop_min, &c3, g->n_nt + 1, 1)) return 0;
    g->cap_nt = cap;
    g->nt_name[g->n_nt] = name ? strdup(name) : NULL;
    g->nt_loop[g->n_nt] = 0;
    g->nt_loop_min[g->n_nt] = 255;
    return (int32_t)g->n_nt++;
}

void di_cfg_rule(di_cfg *g, int32_t lhs, const int32_t *rhs, size_t n) {
    if (g->err_code) return;
    size_t used = g->n_rules ? g->rule_off[g->n_rules] : 0;
    if (used + n + g->n_rules + 1 > DI_CFG_MAX_POSITIONS) {
        di_cfg_fail(g, DI_ERR_LIMIT, "grammar too large: more than %u symbols", DI_CFG_MAX_POSITIONS);
        return;
    }
    size_t cr = g->cap_rules, cr2 = g->cap_rules;
    if (!grow(g, (void **)&g->rule_lhs, &cr, g->n_rules + 1, sizeof(uint32_t))) return;
    if (!grow(g, (void **)&g->rule_off, &cr2, g->n_rules + 2, sizeof(uint32_t))) return;
    g->cap_rules = cr < cr2 ? cr : cr2;
    if (!grow(g, (void **)&g->rhs, &g->cap_rhs, used + n, sizeof(int32_t))) return;
    if (g->n_rules == 0) g->rule_off[0] = 0;
    if (n) memcpy(g->rhs + used, rhs, n * sizeof(int32_t));
    g->rule_lhs[g->n_rules] = (uint32_t)lhs;
    g->rule_off[g->n_rules + 1] = (uint32_t)(used + n);
    g->n_rules++;
}

int32_t di_cfg_class_sym(di_cfg *g, const di_cfg_class *c) {
    if (g->err_code) return -1;
    /* Front-ends reuse a handful of classes (single bytes, UTF-8 continuation ranges); a linear
     * scan from the newest end finds repeats quickly and the class count stays small. */
    uint32_t lim = g->n_cls < 512 ? g->n_cls : 512;
    for (uint32_t i = 0; i < lim; i++) {
        uint32_t k = g->n_cls - 1 - i;
        if (!memcmp(g->cls[k].bits, c->bits, sizeof c->bits)) return -1 - (int32_t)k;
    }
    if (!grow(g, (void **)&g->cls, &g->cap_cls, g->n_cls + 1, sizeof(di_cfg_class))) return -1;
    g->cls[g->n_cls] = *c;
    return -1 - (int32_t)g->n_cls++;
}

int32_t di_cfg_range(di_cfg *g, uint8_t lo, uint8_t hi) {
    di_cfg_class c = {{0}};
    di_cfg_class_add_range(&c, lo, hi);
    return di_cfg_class_sym(g, &c);
}

int32_t di_cfg_byte(di_cfg *g, uint8_t b) { return di_cfg_range(g, b, b); }

int32_t di_cfg_seq(di_cfg *g, const int32_t *s, size_t n) {
    if (n == 1) return s[0];
    int32_t nt = di_cfg_nt(g, NULL);
    di_cfg_rule(g, nt, s, n);
    return nt;
}

int32_t di_cfg_alt(di_cfg *g, const int32_t *s, size_t n) {
    if (n == 1) return s[0];
    int32_t nt = di_cfg_nt(g, NULL);
    for (size_t i = 0; i < n; i++) di_cfg_rule(g, nt, &s[i], 1);
    return nt;
}

int32_t di_cfg_literal(di_cfg *g, const void *bytes, size_t n) {
    const uint8_t *b = bytes;
    int32_t nt = di_cfg_nt(g, NULL);
    int32_t buf[64];
    int32_t *s = n <= 64 ? buf : malloc(n * sizeof(int32_t));
    if (!s) {
        di_cfg_fail(g, DI_ERR_NOMEM, "out of memory for a %zu-byte literal", n);
        return nt;
    }
    for (size_t i = 0; i < n; i++) s[i] = di_cfg_byte(g, b[i]);
    di_cfg_rule(g, nt, s, n);
    if (s != buf) free(s);
    return nt;
}

int32_t di_cfg_opt(di_cfg *g, int32_t s) {
    int32_t nt = di_cfg_nt(g, NULL);
    di_cfg_rule(g, nt, NULL, 0);
    di_cfg_rule(g, nt, &s, 1);
    return nt;
}

int32_t di_cfg_separated(di_cfg *g, int32_t x, int32_t sep) {
    int32_t d = di_cfg_nt(g, NULL), tail = di_cfg_nt(g, NULL);
    int32_t d_rhs[2] = {x, tail}, tail_rhs[2] = {sep, d};
    di_cfg_rule(g, d, d_rhs, 2);
    di_cfg_rule(g, tail, NULL, 0);
    di_cfg_rule(g, tail, tail_rhs, 2);
    return d;
}

int32_t di_cfg_repeat(di_cfg *g, int32_t s, int64_t min, int64_t max) {
    if (min < 0 || (max >= 0 && max < min)) {
        di_cfg_fail(g, DI_ERR_INVALID, "bad repetition bounds {%lld,%lld}", (long long)min, (long long)max);
        return s;
    }
    int64_t bound = max >= 0 ? max : min;
    if (bound > (int64_t)DI_CFG_MAX_POSITIONS) {
        di_cfg_fail(g, DI_ERR_LIMIT, "repetition count %lld exceeds the grammar size limit %u",
                    (long long)bound, DI_CFG_MAX_POSITIONS);
        return s;
    }
    /* (X*)*, (X+)+, (X*)+, (X+)* are X* or X+: collapsing them removes the ambiguity that
     * makes nested loops cost O(n^3) in Earley (every split of the input is a parse). */
    if (max < 0 && min <= 1 && s >= 0 && !g->err_code && g->nt_loop_min[s] != 255) {
        int32_t inner = g->nt_loop[s];
        int64_t m = min == 1 && g->nt_loop_min[s] == 1 ? 1 : 0;
        if (m == g->nt_loop_min[s]) return s;
        return di_cfg_repeat(g, inner, m, -1);
    }
    /* s{0,k} is its tail T_k itself, with no unit rule around it: one Earley item less wherever
     * it is predicted (EBNF `?` and `{0,n}`: -2.4% of ebnf_json's instructions) */
    bool bare = min == 0 && max > 0;
    int32_t nt = bare ? -1 : di_cfg_nt(g, NULL);
    if (max < 0 && min <= 1 && !g->err_code) {
        g->nt_loop[nt] = s;
        g->nt_loop_min[nt] = (uint8_t)min;
    }
    /* tail: unbounded -> T -> eps | T s (left recursion: O(1) Earley work per repetition);
     * bounded -> T_k -> eps | s T_{k-1}, nested so each prefix length has exactly one parse. */
    int32_t tail;
    if (max < 0) {
        tail = di_cfg_nt(g, NULL);
        int32_t r[2] = {tail, s};
        di_cfg_rule(g, tail, NULL, 0);
        di_cfg_rule(g, tail, r, 2);
        if (!g->err_code) { /* T is X* itself: the matcher's walk boundary treats its items as a loop's */
            g->nt_loop[tail] = s;
            g->nt_loop_min[tail] = 0;
        }
    } else {
        tail = -1;
        for (int64_t k = 0; k < max - min && !g->err_code; k++) {
            int32_t t = di_cfg_nt(g, NULL);
            di_cfg_rule(g, t, NULL, 0);
            if (tail < 0) {
                di_cfg_rule(g, t, &s, 1);
            } else {
                int32_t r[2] = {s, tail};
                di_cfg_rule(g, t, r, 2);
            }
            tail = t;
        }
    }
    if (bare) return tail >= 0 ? tail : s; /* tail < 0: a build error is recorded already */
    /* body: min copies of s then the tail, laid out in one rule */
    size_t n = (size_t)min + (tail >= 0 ? 1 : 0);
    int32_t *body = malloc((n ? n : 1) * sizeof(int32_t));
    if (!body) {
        di_cfg_fail(g, DI_ERR_NOMEM, "out of memory expanding a repetition of %lld", (long long)min);
        return nt;
    }
    for (int64_t i = 0; i < min; i++) body[i] = s;
    if (tail >= 0) body[min] = tail;
    di_cfg_rule(g, nt, body, n);
    free(body);
    return nt;
}

/* ---- finalize ---- */

/* nt_recurs: the places a nonterminal can start at, counted up to 2 through the rules that use
 * it (a place in a rule of A counts as many times as A's own places). A worklist passes on each
 * increase once, so every rule is read at most twice per change of its lhs: linear. */
static int count_places(di_cfg *g, int32_t aug) {
    uint32_t nn = g->n_nt;
    uint8_t *done = calloc(nn, 1);                        /* places already passed on */
    uint32_t *stack = malloc((2 * (size_t)nn + 1) * sizeof *stack); /* one entry per increase */
    if (!done || !stack) {
        free(done);
        free(stack);
        return -1;
    }
    size_t n = 0;
    g->nt_recurs[aug] = 1;
    stack[n++] = (uint32_t)aug;
    while (n) {
        uint32_t a = stack[--n];
        uint8_t delta = g->nt_recurs[a] - done[a];
        done[a] = g->nt_recurs[a];
        for (uint32_t r = g->nt_rule_off[a]; r < g->nt_rule_off[a + 1] && delta; r++)
            for (uint32_t p = g->nt_rules[r]; g->psym[p] != DI_CFG_END; p++) {
                int32_t s = g->psym[p];
                if (s < 0 || g->nt_recurs[s] == 2) continue;
                g->nt_recurs[s] = g->nt_recurs[s] + delta >= 2 ? 2 : 1;
                stack[n++] = (uint32_t)s;
            }
    }
    for (uint32_t i = 0; i < nn; i++) g->nt_recurs[i] = g->nt_recurs[i] == 2;
    free(done);
    free(stack);
    return 0;
}

/* flag[nt] for "productive" (need_terms = false: terminals always satisfied) or "nullable"
 * (need_terms = true: a rule with a terminal never qualifies). */
static int fixpoint(const di_cfg *g, const uint32_t *occ_off, const uint32_t *occ, uint32_t *cnt, uint32_t *queue,
                    uint8_t *flag, bool nullable) {
    uint32_t nr = g->n_rules, qn = 0;
    for (uint32_t r = 0; r < nr; r++) {
        uint32_t c = 0;
        bool has_term = false;
        for (uint32_t k = g->rule_off[r]; k < g->rule_off[r + 1]; k++) {
            if (g->rhs[k] >= 0) c++;
            else has_term = true;
        }
        cnt[r] = nullable && has_term ? UINT32_MAX : c;
        if (cnt[r] == 0 && !flag[g->rule_lhs[r]]) flag[g->rule_lhs[r]] = 1, queue[qn++] = g->rule_lhs[r];
    }
    for (uint32_t qi = 0; qi < qn; qi++) {
        uint32_t a = queue[qi];
        for (uint32_t o = occ_off[a]; o < occ_off[a + 1]; o++) {
            uint32_t r = occ[o];
            if (cnt[r] == UINT32_MAX || cnt[r] == 0) continue;
            if (--cnt[r] == 0 && !flag[g->rule_lhs[r]]) flag[g->rule_lhs[r]] = 1, queue[qn++] = g->rule_lhs[r];
        }
    }
    return 0;
}

static int fixpoints(const di_cfg *g, uint8_t *prod, uint8_t *nullable) {
    uint32_t nn = g->n_nt, nr = g->n_rules, nsym = g->rule_off[nr];
    uint32_t *occ_off = calloc(nn + 1, sizeof *occ_off), *occ = calloc(nsym + 1, sizeof *occ);
    uint32_t *cnt = malloc((nr + 1) * sizeof *cnt), *queue = malloc((nn + 1) * sizeof *queue);
    int rc = -1;
    if (occ_off && occ && cnt && queue) {
        /* occurrence index: for each nonterminal, the rules using it (once per occurrence) */
        for (uint32_t k = 0; k < nsym; k++)
            if (g->rhs[k] >= 0) occ_off[g->rhs[k] + 1]++;
        for (uint32_t i = 0; i < nn; i++) occ_off[i + 1] += occ_off[i];
        uint32_t *cur = malloc((nn + 1) * sizeof *cur);
        if (cur) {
            memcpy(cur, occ_off, nn * sizeof *cur);
            for (uint32_t r = 0; r < nr; r++)
                for (uint32_t k = g->rule_off[r]; k < g->rule_off[r + 1]; k++)
                    if (g->rhs[k] >= 0) occ[cur[g->rhs[k]]++] = r;
            free(cur);
            fixpoint(g, occ_off, occ, cnt, queue, prod, false);
            fixpoint(g, occ_off, occ, cnt, queue, nullable, true);
            rc = 0;
        }
    }
    free(occ_off);
    free(occ);
    free(cnt);
    free(queue);
    return rc;
}

int di_cfg_finalize(di_cfg *g, int32_t start, di_error *err) {
    if (g->err_code) return di_error_set(err, g->err_code, "%s", g->err_msg);
    if (start < 0 || (uint32_t)start >= g->n_nt)
        return di_error_set(err, DI_ERR_INTERNAL, "grammar start symbol %d out of range", start);
    /* augmented start: S' -> start, so acceptance is one item check */
    int32_t aug = di_cfg_nt(g, "<start>");
    di_cfg_rule(g, aug, &start, 1);
    if (g->err_code) return di_error_set(err, g->err_code, "%s", g->err_msg);
    g->start = aug;

    uint32_t nn = g->n_nt, nr = g->n_rules;
    uint8_t *prod = calloc(nn, 1), *keep = calloc(nr, 1);
    g->nullable = calloc(nn, 1);
    if (!prod || !keep || !g->nullable) {
        free(prod);
        free(keep);
        return di_error_set(err, DI_ERR_NOMEM, "out of memory finalizing a grammar of %u rules", nr);
    }
    /* Productive = derives some byte string; nullable = derives the empty string. Both are least
     * fixpoints, computed in linear time with per-rule counters of not-yet-satisfied symbols and
     * an occurrence index (naive re-scanning until nothing changes is quadratic on the long
     * rule chains a 60,000-property schema produces). */
    if (fixpoints(g, prod, g->nullable)) {
        free(prod);
        free(keep);
        return di_error_set(err, DI_ERR_NOMEM, "out of memory finalizing a grammar of %u rules", nr);
    }
    if (!prod[aug]) {
        free(prod);
        free(keep);
        return di_error_set(err, DI_ERR_INVALID, "grammar matches no string (the start rule is unproductive)");
    }
    /* Keep only productive rules: then every non-empty Earley set is a viable prefix, which is
     * what lets the matcher treat "set is empty" as the one and only dead state. */
    size_t npos = 0;
    for (uint32_t r = 0; r < nr; r++) {
        bool p = prod[g->rule_lhs[r]];
        for (uint32_t k = g->rule_off[r]; k < g->rule_off[r + 1] && p; k++)
            if (g->rhs[k] >= 0 && !prod[g->rhs[k]]) p = false;
        keep[r] = p;
        if (p) npos += g->rule_off[r + 1] - g->rule_off[r] + 1;
    }
    g->psym = malloc(npos * sizeof(int32_t));
    g->plhs = malloc(npos * sizeof(int32_t));
    g->nt_rule_off = calloc(nn + 1, sizeof(uint32_t));
    g->nt_rules = malloc((nr + 1) * sizeof(uint32_t));
    g->nt_recurs = calloc(nn, 1);
    if (!g->psym || !g->plhs || !g->nt_rule_off || !g->nt_rules || !g->nt_recurs) {
        free(prod);
        free(keep);
        return di_error_set(err, DI_ERR_NOMEM, "out of memory laying out %zu grammar positions", npos);
    }
    for (uint32_t r = 0; r < nr; r++)
        if (keep[r]) g->nt_rule_off[g->rule_lhs[r] + 1]++;
    for (uint32_t i = 0; i < nn; i++) g->nt_rule_off[i + 1] += g->nt_rule_off[i];
    uint32_t *fill = malloc(nn * sizeof(uint32_t));
    if (!fill) {
        free(prod);
        free(keep);
        return di_error_set(err, DI_ERR_NOMEM, "out of memory finalizing the grammar");
    }
    memcpy(fill, g->nt_rule_off, nn * sizeof(uint32_t));
    uint32_t pos = 0;
    for (uint32_t r = 0; r < nr; r++) {
        if (!keep[r]) continue;
        uint32_t lhs = g->rule_lhs[r];
        g->nt_rules[fill[lhs]++] = pos;
        if (lhs == (uint32_t)aug) g->init_pos = pos, g->accept_pos = pos + 1;
        for (uint32_t k = g->rule_off[r]; k < g->rule_off[r + 1]; k++) {
            g->psym[pos] = g->rhs[k];
            g->plhs[pos++] = (int32_t)lhs;
        }
        g->psym[pos] = DI_CFG_END;
        g->plhs[pos++] = (int32_t)lhs;
    }
    g->n_pos = pos;
    free(fill);
    if (count_places(g, aug)) {
        free(prod);
        free(keep);
        return di_error_set(err, DI_ERR_NOMEM, "out of memory finalizing the grammar");
    }
    free(prod);
    free(keep);
    g->final = true;
    return DI_OK;
}
