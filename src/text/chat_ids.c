/* Prompt segments → token ids with the official tokenizer (src/text/tokenizer.h). */
#include <stdlib.h>
#include <string.h>

#include "text/chat.h"
#include "text/tokenizer.h"
#include "util/error.h"

int di_prompt_encode(const di_prompt *p, const struct di_tokenizer *tok, int32_t **ids, size_t *n_ids,
                     di_error *err) {
    size_t n = 0, cap = 64;
    int32_t *out = malloc(cap * sizeof *out); /* [n] prompt token ids */
    if (!out) return di_error_set(err, DI_ERR_NOMEM, "prompt encode: out of memory");
    for (size_t i = 0; i < p->n_segs; i++) {
        const di_segment *s = &p->segs[i];
        int32_t one, *part = &one;
        size_t n_part = 1;
        if (s->special) {
            /* a template special token is one added token; its absence means a wrong vocabulary */
            one = di_tok_find(tok, s->text);
            if (one < 0) {
                free(out);
                return di_error_set(err, DI_ERR_INVALID,
                                    "prompt encode: special token %s is not in the tokenizer's vocabulary (a V4.1 prompt needs the V4.1 tokenizer.json)",
                                    s->text);
            }
        } else {
            /* message content and template text alike: plain BPE, added tokens not recognized */
            int rc = di_tok_encode(tok, s->text, s->len, 0, &part, &n_part, err);
            if (rc) {
                free(out);
                return di_error_wrap(err, "prompt encode: segment %zu", i);
            }
        }
        if (n + n_part > cap) {
            while (n + n_part > cap) cap *= 2;
            int32_t *grown = realloc(out, cap * sizeof *out);
            if (!grown) {
                if (part != &one) free(part);
                free(out);
                return di_error_set(err, DI_ERR_NOMEM, "prompt encode: out of memory");
            }
            out = grown;
        }
        memcpy(out + n, part, n_part * sizeof *part);
        n += n_part;
        if (part != &one) free(part);
    }
    *ids = out;
    *n_ids = n;
    return DI_OK;
}
