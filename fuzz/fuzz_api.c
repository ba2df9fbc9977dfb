/* libFuzzer harness: request parsers of all three protocols, then rendering and the context check.
 * Input: byte 0 picks the protocol (mod 3), the rest is the request body. Any input must give
 * DI_OK or a clean DI_ERR_* with a non-empty message; never a crash, leak or sanitizer report. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/api.h"
#include "text/chat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    di_api api = (di_api)(data[0] % 3);
    di_request r;
    di_error err = {0};
    int rc = di_request_parse(api, (const char *)data + 1, size - 1, NULL, &r, &err);
    if (rc != DI_OK) {
        if (!err.msg[0]) __builtin_trap(); /* every rejection explains itself */
        int status;
        free(di_api_error_body(&err, &status));
        return 0;
    }
    di_prompt p;
    if (di_chat_render(&r.conv, &p, &err) == DI_OK) {
        size_t len;
        char *text = di_prompt_text(&p, &len);
        /* the segments partition the prompt and special segments are whole special tokens */
        size_t sum = 0;
        for (size_t i = 0; i < p.n_segs; i++) {
            sum += p.segs[i].len;
            if (!p.segs[i].special && i && !p.segs[i - 1].special) __builtin_trap(); /* plain runs are maximal */
        }
        if (text && sum != len) __builtin_trap();
        int64_t max_tokens;
        di_request_resolve_max_tokens(&r, (int64_t)len, 1 << 20, &max_tokens, &err);
        free(text);
        di_prompt_free(&p);
    }
    di_request_free(&r);
    return 0;
}
