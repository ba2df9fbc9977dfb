/* Shared by the three grammar fuzz harnesses: after a front-end compiles the input, drive the
 * matcher a little so the Earley core, the trie walk and rollback are fuzzed too. */
#ifndef DI_FUZZ_GRAMMAR_COMMON_H
#define DI_FUZZ_GRAMMAR_COMMON_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

/* 1 EOS + 256 single bytes + a few multi-byte tokens; built once per process. */
static di_grammar_vocab *fuzz_vocab(void) {
    static di_grammar_vocab *v;
    if (v) return v;
    static const char *multi[] = {"{\"", "\":", "\",\"", "true", "null", "ab", "abc", "\\n", "é", "中文", "}]", "0.5"};
    enum { N_MULTI = sizeof multi / sizeof multi[0] };
    uint8_t bytes[256];
    const uint8_t *b[1 + 256 + N_MULTI];
    uint32_t l[1 + 256 + N_MULTI];
    b[0] = NULL, l[0] = 0;
    for (int i = 0; i < 256; i++) bytes[i] = (uint8_t)i, b[1 + i] = &bytes[i], l[1 + i] = 1;
    for (int i = 0; i < N_MULTI; i++) b[257 + i] = (const uint8_t *)multi[i], l[257 + i] = (uint32_t)strlen(multi[i]);
    int32_t eos = 0;
    di_grammar_vocab_new(1 + 256 + N_MULTI, b, l, NULL, &eos, 1, &v, NULL);
    return v;
}

/* Follow the mask for a few steps, choosing tokens from `seed`, with one rollback. */
static void fuzz_drive(const di_grammar *g, const uint8_t *seed, size_t n) {
    di_grammar_vocab *v = fuzz_vocab();
    if (!v) return;
    di_grammar_matcher *m = NULL;
    if (di_grammar_matcher_new(g, v, NULL, &m, NULL)) return;
    uint32_t nv = di_grammar_vocab_size(v), mask[16];
    for (size_t step = 0; step < 8; step++) {
        if (di_grammar_matcher_fill_mask(m, mask, NULL)) break;
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
