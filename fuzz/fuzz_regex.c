/* libFuzzer harness: regex front-end (input = pattern), then a short masked walk. */
#include "fuzz_grammar_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    di_grammar *g = NULL;
    if (di_grammar_from_regex((const char *)data, size, &g, NULL) == DI_OK) {
        fuzz_drive(g, data, size);
        di_grammar_free(g);
    }
    return 0;
}
