#include "engine/grammar_vocab.h"

#include <stdlib.h>

#include "util/error.h"

int di_grammar_vocab_from_tokenizer(const di_tokenizer *tok, uint32_t V, int32_t eos, di_grammar_vocab **out,
                                    di_error *err) {
    const int32_t n_tok = di_tok_vocab_size(tok);
    if (n_tok > (int32_t)V)
        return di_error_set(err, DI_ERR_INVALID, "the tokenizer has %d tokens, the model's vocabulary only %u", n_tok,
                            V);
    const uint8_t **bytes = calloc(V, sizeof *bytes); /* [V] borrowed from the tokenizer */
    uint32_t *lens = calloc(V, sizeof *lens);         /* u32 [V] */
    uint8_t *special = calloc(V, 1);                   /* u8 [V] */
    int rc = DI_OK;
    if (!bytes || !lens || !special)
        rc = di_error_set(err, DI_ERR_NOMEM, "out of memory for the grammar vocabulary (%u tokens)", V);
    static const uint8_t empty[1] = {0};
    for (uint32_t t = 0; !rc && t < V; t++) {
        size_t len = 0;
        const char *b = (int32_t)t < n_tok ? di_tok_token_bytes(tok, (int32_t)t, &len) : NULL;
        bytes[t] = b ? (const uint8_t *)b : empty;
        lens[t] = b ? (uint32_t)len : 0;
        special[t] = !b || di_tok_is_special(tok, (int32_t)t);
    }
    if (!rc) rc = di_grammar_vocab_new(V, bytes, lens, special, &eos, 1, out, err);
    free(bytes), free(lens), free(special);
    return rc;
}
