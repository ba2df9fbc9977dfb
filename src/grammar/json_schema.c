#include "grammar/grammar_impl.h"
int di_json_schema_to_cfg(di_cfg *g, const char *json, size_t len, const di_json_schema_opts *opts, int32_t *start,
                          di_error *err) {
    return di_error_set(err, DI_ERR_UNSUPPORTED, "json schema: todo");
}
