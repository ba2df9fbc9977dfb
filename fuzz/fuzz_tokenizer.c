/* libFuzzer harness for the tokenizer. The first input byte picks the mode:
 *   even: the rest is text. Encode it with added-token recognition on and off; valid UTF-8 must decode back
 *         to exactly the input (byte-level BPE is lossless), invalid UTF-8 must be rejected with DI_ERR_INVALID.
 *   odd:  the rest is little-endian int32 ids (folded near the vocabulary, some out of range). One-shot and
 *         streaming decode must agree byte for byte, and an out-of-range id must be an error.
 * Run from the repository root (the tokenizer is data/tokenizer/deepseek-v4/tokenizer.json). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

static di_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    di_error err = {0};
    if (di_tok_load("data/tokenizer/deepseek-v4/tokenizer.json", &tok, &err)) {
        fprintf(stderr, "fuzz_tokenizer: %s (run from the repository root)\n", err.msg);
        abort();
    }
    return 0;
}

static void check_text(const char *s, size_t n) {
    for (int special = 0; special <= 1; special++) {
        int32_t *ids;
        size_t k;
        di_error err = {0};
        int st = di_tok_encode(tok, s, n, special, &ids, &k, &err);
        if (st == DI_ERR_INVALID) {
            if (ids || k || !strstr(err.msg, "byte offset")) abort();
            continue;
        }
        if (st != DI_OK) abort();
        for (size_t i = 0; i < k; i++)
            if (ids[i] < 0 || ids[i] >= di_tok_vocab_size(tok)) abort();
        if (!special)
            for (size_t i = 0; i < k; i++)
                if (di_tok_is_added(tok, ids[i])) abort(); /* plain BPE never yields added tokens */
        char *back;
        size_t len;
        if (di_tok_decode(tok, ids, k, &back, &len, &err) != DI_OK) abort();
        if (len != n || memcmp(back, s, n)) abort();
        free(back);
        free(ids);
    }
}

static void check_ids(const uint8_t *p, size_t n) {
    size_t k = n / 4;
    int32_t *ids = malloc((k + 1) * sizeof *ids);
    int32_t v = di_tok_vocab_size(tok);
    int valid = 1;
    for (size_t i = 0; i < k; i++) {
        uint32_t r = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
                     (uint32_t)p[4 * i + 3] << 24;
        /* mostly byte tokens and low ids (where broken UTF-8 lives), sometimes anything incl. invalid */
        int32_t id = (r & 3) == 0 ? (int32_t)r : (r & 3) == 1 ? (int32_t)((r >> 2) % 256) : (int32_t)((r >> 2) % (uint32_t)v);
        if (id < 0 || id >= v) valid = 0;
        ids[i] = id;
    }
    char *one;
    size_t len;
    di_error err = {0};
    int st = di_tok_decode(tok, ids, k, &one, &len, &err);
    if (!valid) {
        if (st != DI_ERR_INVALID || one) abort();
        free(ids);
        return;
    }
    if (st != DI_OK || one[len] != 0) abort();
    di_detok *d = di_detok_new(tok);
    size_t at = 0;
    for (size_t i = 0; i <= k; i++) {
        char *t;
        size_t l;
        if (i < k ? di_detok_push(d, ids[i], &t, &l, &err) : di_detok_flush(d, &t, &l)) abort();
        if (at + l > len || memcmp(one + at, t, l)) abort();
        at += l;
        free(t);
    }
    if (at != len) abort();
    di_detok_free(d);
    free(one);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    if (data[0] & 1) check_ids(data + 1, size - 1);
    else check_text((const char *)data + 1, size - 1);
    return 0;
}
