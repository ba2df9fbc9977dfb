/* Token embedding and hyper-connection stream expansion (spec §3.2). */
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "util/error.h"

int di_cpu_embed(int64_t n, const int32_t *ids, const uint16_t *table, int64_t vocab, int64_t D, uint16_t *out,
                 di_error *err) {
    for (int64_t t = 0; t < n; t++)
        if (ids[t] < 0 || ids[t] >= vocab)
            return di_error_set(err, DI_ERR_INVALID, "embed: token %lld has id %d, vocabulary is [0, %lld)",
                                (long long)t, ids[t], (long long)vocab);
    for (int64_t t = 0; t < n; t++) memcpy(out + t * D, table + (int64_t)ids[t] * D, (size_t)D * sizeof *out);
    return DI_OK;
}

void di_cpu_expand_streams(int64_t n, int hc, int64_t D, const uint16_t *e, uint16_t *X) {
    for (int64_t t = 0; t < n; t++)
        for (int s = 0; s < hc; s++) memcpy(X + (t * hc + s) * D, e + t * D, (size_t)D * sizeof *X);
}
