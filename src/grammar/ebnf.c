#include "grammar/grammar_impl.h"
int di_ebnf_to_cfg(di_cfg *g, const char *src, size_t len, const char *root, int32_t *start, di_error *err) {
    return di_error_set(err, DI_ERR_UNSUPPORTED, "ebnf: todo");
}
