/* Shared by the grammar tests: a small synthetic vocabulary and the brute-force mask checker.
 * Header-only (static functions) so each test binary stays self-contained. */
#ifndef DI_TESTS_GRAMMAR_TESTLIB_H
#define DI_TESTS_GRAMMAR_TESTLIB_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "testutil.h"

#define GT_EOS 0
static uint64_t gt_cache_hits; /* masks served from the matcher's cache during gt_walk (all brute-force checked) */
static di_grammar_walk_stats gt_stats; /* summed over gt_walk's matchers: which mask paths the checks covered */ /* token 0 is EOS; tokens 1..256 are the single bytes 0..255 */

static uint64_t gt_rng(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static bool gt_bit(const uint32_t *m, uint32_t t) { return (m[t >> 5] >> (t & 31)) & 1u; }

/* The reference: a token is allowed iff its bytes are accepted by a copy of the state
 * (try_bytes leaves the matcher unchanged); EOS iff can_end. Compare every token. */
static inline void gt_check_mask(di_grammar_matcher *m, const di_grammar_vocab *v, const uint32_t *mask,
                          const uint8_t *const *bytes, const uint32_t *lens, const char *what) {
    uint32_t n = di_grammar_vocab_size(v);
    for (uint32_t t = 0; t < n; t++) {
        bool want = t == GT_EOS ? di_grammar_matcher_can_end(m) && !di_grammar_matcher_finished(m)
                                : di_grammar_matcher_try_bytes(m, bytes[t], lens[t]);
        if (t == GT_EOS && di_grammar_matcher_finished(m)) want = true;
        if (gt_bit(mask, t) != want)
            fail_msg("%s: token %u (%.*s) mask=%d brute=%d after %zu tokens", what, t, (int)lens[t], (const char *)bytes[t],
                     gt_bit(mask, t), want, di_grammar_matcher_n_accepted(m));
    }
}

typedef struct gt_bytes {
    uint8_t **b;
    uint32_t *l;
    uint32_t n;
} gt_bytes;

/* 1 EOS (id 0, empty) + the 256 single bytes; ids 257 .. 257 + extra - 1 left empty for the caller. */
static inline gt_bytes gt_single_bytes(uint32_t extra) {
    gt_bytes r;
    r.n = 257 + extra;
    r.b = calloc(r.n, sizeof *r.b);
    r.l = calloc(r.n, sizeof *r.l);
    for (uint32_t i = 0; i < 256; i++) {
        r.b[i + 1] = malloc(1);
        r.b[i + 1][0] = (uint8_t)i;
        r.l[i + 1] = 1;
    }
    return r;
}

/* 1 EOS + 256 single bytes + `extra` multi-byte tokens drawn from JSON/regex-relevant pieces,
 * including UTF-8 and tokens that straddle structure (`":`, `},{"`, `</think>{`). */
static inline gt_bytes gt_vocab_bytes(int extra) {
    gt_bytes r;
    static const char *pieces[] = {"{",  "}",  "[",  "]", "\"", ":",  ",", " ",  "\n", "a", "b", "c",  "x",
                                   "0",  "1",  "9",  "-", ".",  "e",  "E", "+",  "\\", "n", "u", "t",  "r",
                                   "ue", "al", "se", "f", "ll", "é",  "中", "😀", "\t", "_", "A", "Z",  "z",
                                   "</", "th", "ink", ">", "END", "\"a", "\":", "\",", "},{\"", "true", "null", "1.5"};
    size_t np = sizeof pieces / sizeof pieces[0];
    r.n = 257 + (uint32_t)extra;
    r.b = calloc(r.n, sizeof *r.b);
    r.l = calloc(r.n, sizeof *r.l);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (uint32_t i = 0; i < 256; i++) {
        r.b[i + 1] = malloc(1);
        r.b[i + 1][0] = (uint8_t)i;
        r.l[i + 1] = 1;
    }
    for (int i = 0; i < extra; i++) {
        char buf[64] = "";
        int k = 2 + (int)(gt_rng(&s) % 3);
        if (i == 0) snprintf(buf, sizeof buf, "</think>{");
        else if (i == 1) snprintf(buf, sizeof buf, "</think>");
        else
            for (int j = 0; j < k; j++) strncat(buf, pieces[gt_rng(&s) % np], sizeof buf - strlen(buf) - 1);
        r.l[257 + i] = (uint32_t)strlen(buf);
        r.b[257 + i] = malloc(r.l[257 + i] + 1);
        memcpy(r.b[257 + i], buf, r.l[257 + i]);
    }
    return r;
}

static inline void gt_bytes_free(gt_bytes *r) {
    for (uint32_t i = 0; i < r->n; i++) free(r->b[i]);
    free(r->b);
    free(r->l);
}

/* The vocabulary built from gt_vocab_bytes (EOS = token 0). */
static inline di_grammar_vocab *gt_vocab(const gt_bytes *tb) {
    int32_t eos = GT_EOS;
    di_grammar_vocab *v = NULL;
    di_error err = {0};
    if (di_grammar_vocab_new(tb->n, (const uint8_t *const *)tb->b, tb->l, NULL, &eos, 1, &v, &err))
        fail_msg("vocab: %s", err.msg);
    return v;
}

/* Accept text byte by byte through the single-byte tokens (token b + 1 is the byte b). */
static inline void gt_accept_text(di_grammar_matcher *m, const char *text) {
    di_error err = {0};
    for (const char *p = text; *p; p++)
        if (di_grammar_matcher_accept_token(m, (int32_t)(uint8_t)*p + 1, &err)) fail_msg("accept in \"%s\": %s", text, err.msg);
}

/* Fill the mask, check it against brute force and return what computing it took (the change in
 * the matcher's walk statistics). */
static inline di_grammar_walk_stats gt_fill_checked(di_grammar_matcher *m, const di_grammar_vocab *v, const gt_bytes *tb,
                                                    uint32_t *mask, const char *what) {
    di_error err = {0};
    di_grammar_walk_stats b, a;
    di_grammar_matcher_walk_stats(m, &b);
    if (di_grammar_matcher_fill_mask(m, mask, &err)) fail_msg("%s: mask: %s", what, err.msg);
    di_grammar_matcher_walk_stats(m, &a);
    gt_check_mask(m, v, mask, (const uint8_t *const *)tb->b, tb->l, what);
    return (di_grammar_walk_stats){.cached = a.cached - b.cached, .walks = a.walks - b.walks,
                                   .block_masks = a.block_masks - b.block_masks, .block_hits = a.block_hits - b.block_hits,
                                   .blocks = a.blocks - b.blocks, .ctx_edges = a.ctx_edges - b.ctx_edges,
                                   .edges = a.edges - b.edges, .pushes = a.pushes - b.pushes,
                                   .replays = a.replays - b.replays, .reuses = a.reuses - b.reuses,
                                   .summaries = a.summaries - b.summaries, .full_sigs = a.full_sigs - b.full_sigs,
                                   .shapes_static = a.shapes_static - b.shapes_static,
                                   .union_hits = a.union_hits - b.union_hits,
                                   .union_shifts = a.union_shifts - b.union_shifts,
                                   .walk_hits = a.walk_hits - b.walk_hits, .kid_skips = a.kid_skips - b.kid_skips};
}

/* Random walk: at each step compare the mask with brute force, then accept a random allowed
 * token (EOS only when nothing else is allowed, or with small probability). Every few steps roll
 * back a random number of tokens and check the mask equals the one recorded at that point.
 * Returns the number of masks checked. */
static inline int gt_walk(const di_grammar *g, const di_grammar_vocab *v, const gt_bytes *tb,
                   const di_grammar_matcher_opts *opts, uint64_t seed, int steps, const char *what) {
    di_error err = {0};
    di_grammar_matcher *m = NULL;
    if (di_grammar_matcher_new(g, v, opts, &m, &err)) fail_msg("%s: matcher: %s", what, err.msg);
    size_t words = di_grammar_mask_words(tb->n);
    uint32_t *mask = malloc(words * 4), *hist = malloc((size_t)(steps + 1) * words * 4);
    uint32_t *allowed = malloc(tb->n * sizeof *allowed);
    int checked = 0;
    for (int step = 0; step < steps; step++) {
        if (di_grammar_matcher_fill_mask(m, mask, &err)) fail_msg("%s: mask: %s", what, err.msg);
        gt_check_mask(m, v, mask, (const uint8_t *const *)tb->b, tb->l, what);
        checked++;
        size_t na = di_grammar_matcher_n_accepted(m);
        memcpy(hist + na * words, mask, words * 4);
        if (di_grammar_matcher_finished(m)) break;
        uint32_t n_allowed = 0;
        for (uint32_t t = 1; t < tb->n; t++)
            if (gt_bit(mask, t)) allowed[n_allowed++] = t;
        uint32_t tok;
        if (!n_allowed || (gt_bit(mask, GT_EOS) && gt_rng(&seed) % 8 == 0)) tok = GT_EOS;
        else tok = allowed[gt_rng(&seed) % n_allowed];
        if (!gt_bit(mask, tok)) fail_msg("%s: dead end: nothing allowed after %zu tokens", what, na);
        if (di_grammar_matcher_accept_token(m, (int32_t)tok, &err)) fail_msg("%s: accept %u: %s", what, tok, err.msg);
        if (step % 7 == 6) {
            size_t k = gt_rng(&seed) % 4;
            if (k > di_grammar_matcher_n_accepted(m)) k = di_grammar_matcher_n_accepted(m);
            if (di_grammar_matcher_rollback(m, k, &err)) fail_msg("%s: rollback: %s", what, err.msg);
            if (k) {
                if (di_grammar_matcher_fill_mask(m, mask, &err)) fail_msg("%s: mask: %s", what, err.msg);
                if (memcmp(mask, hist + di_grammar_matcher_n_accepted(m) * words, words * 4))
                    fail_msg("%s: mask after rollback of %zu differs from the recorded one", what, k);
                checked++;
            }
        }
    }
    uint64_t hits, misses;
    di_grammar_matcher_cache_stats(m, &hits, &misses);
    gt_cache_hits += hits;
    di_grammar_walk_stats ws;
    di_grammar_matcher_walk_stats(m, &ws);
    gt_stats.cached += ws.cached, gt_stats.walks += ws.walks, gt_stats.block_masks += ws.block_masks;
    gt_stats.block_hits += ws.block_hits, gt_stats.walk_hits += ws.walk_hits;
    gt_stats.blocks += ws.blocks, gt_stats.ctx_edges += ws.ctx_edges;
    gt_stats.pushes += ws.pushes, gt_stats.replays += ws.replays, gt_stats.reuses += ws.reuses;
    free(mask);
    free(hist);
    free(allowed);
    di_grammar_matcher_free(m);
    return checked;
}

/* A JSON Schema the front end must refuse with this code and a message holding needle. */
static inline void gt_expect_schema_error(const char *src, int code, const char *needle) {
    di_grammar *g = NULL;
    di_error err = {0};
    int rc = di_grammar_from_json_schema(src, strlen(src), NULL, &g, &err);
    if (rc == DI_OK) fail_msg("schema compiled: %s", src);
    assert_null(g);
    if (rc != code) fail_msg("%s: code %d, expected %d (%s)", src, rc, code, err.msg);
    if (!strstr(err.msg, needle)) fail_msg("error '%s' lacks '%s'", err.msg, needle);
}

#endif
