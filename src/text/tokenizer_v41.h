/* A V4.1-layout tokenizer derived from the official V4 file, for the models deepinfer generates.
 *
 * The official V4.1 tokenizer.json (sha256 81f64d12…8d99) could not be obtained here; the official V4
 * file (data/tokenizer/deepseek-v4/) shares its BPE vocabulary, merges and pre-tokenizer, but two added
 * tokens differ in the V4.1 layout (model.md §6.1): id 128799 is `<｜System｜>` (V4: a place holder) and
 * id 129264 is the image placeholder `<｜deepseek_image｜>`. The V4.1 chat encoding needs `<｜System｜>`,
 * so random-weight models written by `deepinfer mkmodel` ship this derived file (and say so in
 * TOKENIZER.md next to it). It is never used in place of a real checkpoint's own tokenizer.json, and
 * the tokenizer's equivalence tests run on the unmodified official V4 file. */
#ifndef DI_TEXT_TOKENIZER_V41_H
#define DI_TEXT_TOKENIZER_V41_H

#include "deepinfer.h"

/* Reads the V4 tokenizer.json at src, rewrites the two added tokens, writes dst (and TOKENIZER.md
 * beside it). Fails if src does not hold the expected V4 entries at those ids. */
int di_tok_write_v41_layout(const char *src, const char *dst, di_error *err);

#endif
