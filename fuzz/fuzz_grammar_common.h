/* Shared by the three grammar fuzz harnesses: after a front-end compiles the input, drive the
 * matcher a little so the Earley core, the trie walk and rollback are fuzzed too. */
#ifndef DI_FUZZ_GRAMMAR_COMMON_H
#define DI_FUZZ_GRAMMAR_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

/* 1 EOS + 256 single bytes + a few multi-byte tokens; built once per process. Identifier- and
 * whitespace-like runs exercise the trie walk's blocks, chains and whole subtrees. */
static const char *fuzz_multi[] = {"{\"", "\":", "\",\"", "true", "null", "ab", "abc", "\\n", "é", "中文", "}]", "0.5",
                                   "abcd", "abcde", "xyz", "    ", "        ", "\n  ", "--", "----", "aa", "aaaa"};
enum { FUZZ_MULTI = sizeof fuzz_multi / sizeof fuzz_multi[0], FUZZ_V = 1 + 256 + FUZZ_MULTI };
static uint8_t fuzz_bytes[256];
static const uint8_t *fuzz_b[FUZZ_V];
static uint32_t fuzz_l[FUZZ_V];

static di_grammar_vocab *fuzz_vocab(void) {
    static di_grammar_vocab *v;
    if (v) return v;
    fuzz_b[0] = NULL, fuzz_l[0] = 0;
    for (int i = 0; i < 256; i++) fuzz_bytes[i] = (uint8_t)i, fuzz_b[1 + i] = &fuzz_bytes[i], fuzz_l[1 + i] = 1;
    for (int i = 0; i < FUZZ_MULTI; i++)
        fuzz_b[257 + i] = (const uint8_t *)fuzz_multi[i], fuzz_l[257 + i] = (uint32_t)strlen(fuzz_multi[i]);
    int32_t eos = 0;
    di_grammar_vocab_new(FUZZ_V, fuzz_b, fuzz_l, NULL, &eos, 1, &v, NULL);
    return v;
}

/* The mask must say exactly what brute force says: every token's bytes tried on the matcher
 * (no state change), EOS allowed exactly when the text so far is complete. Covers the fast
 * paths (state automaton, context-free keys, blocks, cached masks) on every fuzzed grammar. */
static void fuzz_check_mask(di_grammar_matcher *m, const uint32_t *mask) {
    for (uint32_t t = 0; t < FUZZ_V; t++) {
        bool in_mask = (mask[t >> 5] >> (t & 31)) & 1u;
        bool ok = t == 0 ? di_grammar_matcher_can_end(m) : di_grammar_matcher_try_bytes(m, fuzz_b[t], fuzz_l[t]);
        if (in_mask != ok) abort();
    }
}

/* Follow the mask for a few steps, choosing tokens from `seed`, with one rollback. */
static void fuzz_drive(const di_grammar *g, const uint8_t *seed, size_t n) {
    di_grammar_vocab *v = fuzz_vocab();
    if (!v) return;
    di_grammar_matcher *m = NULL;
    if (di_grammar_matcher_new(g, v, NULL, &m, NULL)) return;
    uint32_t nv = di_grammar_vocab_size(v), mask[(FUZZ_V + 31) / 32];
    for (size_t step = 0; step < 8; step++) {
        if (di_grammar_matcher_fill_mask(m, mask, NULL)) break;
        fuzz_check_mask(m, mask);
        uint32_t pick = n ? seed[step % n] : 0, found = nv;
        for (uint32_t k = 0; k < nv; k++) {
            uint32_t t = (pick + k) % nv;
            if ((mask[t >> 5] >> (t & 31)) & 1u) {
                found = t;
                break;
            }
        }
        if (found == nv) break;
        /* the mask said yes, so accepting must succeed */
        if (di_grammar_matcher_accept_token(m, (int32_t)found, NULL) != DI_OK) abort();
    }
    if (di_grammar_matcher_n_accepted(m) >= 2) di_grammar_matcher_rollback(m, 2, NULL);
    di_grammar_matcher_free(m);
}

#endif
