/* libFuzzer harness: JSON Schema front-end (input = schema text; the first byte picks the
 * whitespace mode), then a short masked walk. */
#include "fuzz_grammar_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 65536) return 0;
    di_json_schema_opts o = {.whitespace = (data[0] & 1) ? DI_JSON_WS_COMPACT : DI_JSON_WS_FLEXIBLE};
    di_grammar *g = NULL;
    if (di_grammar_from_json_schema((const char *)data + 1, size - 1, &o, &g, NULL) == DI_OK) {
        fuzz_drive(g, data, size);
        di_grammar_free(g);
    }
    return 0;
}
