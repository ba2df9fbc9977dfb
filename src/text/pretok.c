/* Pre-tokenizer: a sequence of Split(behavior=Isolated) regexes, each applied to every piece the previous
 * one produced. Isolated: every match is its own piece and so is every non-empty gap between matches.
 *
 * HF runs these patterns with Oniguruma; PCRE2 in UTF + UCP mode gives the same Unicode classes for \p{..}.
 * The one known difference is `\s`: Oniguruma matches the Unicode White_Space property, PCRE2 10.42 (UCP)
 * also matches U+180E MONGOLIAN VOWEL SEPARATOR (white space before Unicode 6.3). So \s / \S outside
 * character classes are rewritten into explicit White_Space classes before compiling. Each piece is
 * matched as its own subject, so look-ahead such as `\s+(?!\S)` cannot see past the piece, as in HF. */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_internal.h"
#include "util/error.h"

/* Unicode White_Space (PropList.txt), as a PCRE2 class body. */
#define WS_CLASS "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

/* Rewrites \s and \S that stand outside [...] into explicit classes. Inside a class \s is left alone (the
 * tokenizer's patterns do not use it there). Returns a malloc'd string or NULL. */
static char *rewrite_whitespace(const char *pat) {
    size_t n = strlen(pat), cap = n * 64 + 64, o = 0; /* a 2-byte \s grows to < 128 bytes */
    char *out = malloc(cap);
    if (!out) return NULL;
    int depth = 0; /* inside [...] */
    for (size_t i = 0; i < n; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < n) {
            char d = pat[i + 1];
            if (depth == 0 && (d == 's' || d == 'S')) {
                const char *rep = d == 's' ? "[" WS_CLASS "]" : "[^" WS_CLASS "]";
                size_t rl = strlen(rep);
                if (o + rl + 2 >= cap) break;
                memcpy(out + o, rep, rl);
                o += rl;
            } else {
                out[o++] = c;
                out[o++] = d;
            }
            i++;
            continue;
        }
        if (c == '[') depth++;
        else if (c == ']' && depth > 0) depth--;
        out[o++] = c;
    }
    out[o] = 0;
    return out;
}

int di_pretok_compile(di_pretok *p, const char *const *patterns, int n, const char *path, di_error *err) {
    memset(p, 0, sizeof *p);
    if (n > DI_PRETOK_MAX_STAGES)
        return di_error_set(err, DI_ERR_UNSUPPORTED, "%s: pre_tokenizer has %d Split stages, at most %d handled",
                            path, n, DI_PRETOK_MAX_STAGES);
    for (int i = 0; i < n; i++) {
        char *pat = rewrite_whitespace(patterns[i]);
        if (!pat) {
            di_pretok_free(p);
            return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory compiling pre-tokenizer", path);
        }
        int ec;
        PCRE2_SIZE eo;
        p->re[i] = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
        free(pat);
        if (!p->re[i]) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ec, msg, sizeof msg);
            di_pretok_free(p);
            return di_error_set(err, DI_ERR_FORMAT, "%s: pre-tokenizer regex %d does not compile at offset %zu: %s",
                                path, i, (size_t)eo, (const char *)msg);
        }
        p->n_stages = i + 1;
        /* JIT is an optimisation only: without it (unsupported CPU) the interpreter gives the same matches */
        p->jit[i] = pcre2_jit_compile(p->re[i], PCRE2_JIT_COMPLETE) == 0;
    }
    return DI_OK;
}

void di_pretok_free(di_pretok *p) {
    for (int i = 0; i < p->n_stages; i++) pcre2_code_free(p->re[i]);
    memset(p, 0, sizeof *p);
}

static int split_stage(const di_pretok *p, int stage, pcre2_match_data *md, const char *s, size_t n,
                       di_pretok_emit_fn emit, void *ctx, di_error *err);

/* A piece produced by `stage` goes on to the next stage, or out once all stages ran. */
static int forward(const di_pretok *p, int stage, pcre2_match_data *md, const char *s, size_t n,
                   di_pretok_emit_fn emit, void *ctx, di_error *err) {
    if (n == 0) return DI_OK;
    if (stage + 1 < p->n_stages) return split_stage(p, stage + 1, md, s, n, emit, ctx, err);
    return emit(ctx, s, n) ? DI_OK : di_error_set(err, DI_ERR_NOMEM, "tokenizer: out of memory");
}

static int split_stage(const di_pretok *p, int stage, pcre2_match_data *md, const char *s, size_t n,
                       di_pretok_emit_fn emit, void *ctx, di_error *err) {
    size_t at = 0, gap = 0; /* next search start; start of the unmatched text before it */
    while (at < n) {
        /* the whole text was validated as UTF-8 once; the JIT entry point skips pcre2_match's checks */
        int rc = p->jit[stage] ? pcre2_jit_match(p->re[stage], (PCRE2_SPTR)s, n, at, 0, md, NULL)
                               : pcre2_match(p->re[stage], (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return di_error_set(err, DI_ERR_INTERNAL, "tokenizer: pre-tokenizer regex %d failed: %s", stage,
                                (const char *)msg);
        }
        /* copy the match out: the later stages reuse md while this loop is still running */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        int st;
        if ((st = forward(p, stage, md, s + gap, ms - gap, emit, ctx, err))) return st;
        if ((st = forward(p, stage, md, s + ms, me - ms, emit, ctx, err))) return st;
        gap = me;
        if (me > ms) {
            at = me;
        } else { /* empty match: step one character so the search advances */
            at = me + 1;
            while (at < n && ((unsigned char)s[at] & 0xC0) == 0x80) at++;
        }
    }
    return forward(p, stage, md, s + gap, n - gap, emit, ctx, err);
}

int di_pretok_split(const di_pretok *p, pcre2_match_data *md, const char *s, size_t n, di_pretok_emit_fn emit,
                    void *ctx, di_error *err) {
    if (p->n_stages == 0) return forward(p, -1, md, s, n, emit, ctx, err);
    return split_stage(p, 0, md, s, n, emit, ctx, err);
}
