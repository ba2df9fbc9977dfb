/* The grammar engine's vocabulary from a tokenizer: token id → the bytes it decodes to. */
#ifndef DI_ENGINE_GRAMMAR_VOCAB_H
#define DI_ENGINE_GRAMMAR_VOCAB_H

#include <stdint.h>

#include "grammar/grammar.h"
#include "text/tokenizer.h"

/* n_vocab is the model's vocabulary (embedding rows), which may exceed the tokenizer's: ids past the
 * tokenizer (padding) and special/control tokens never appear in constrained text; eos is the one id
 * that completes it. */
int di_grammar_vocab_from_tokenizer(const di_tokenizer *tok, uint32_t n_vocab, int32_t eos, di_grammar_vocab **out,
                                    di_error *err);

#endif
