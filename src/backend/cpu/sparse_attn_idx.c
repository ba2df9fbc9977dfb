/* Index lists of sparse attention in the reference's order (spec model.md §3.11, §5.3): the window
 * part of the one-shot prefill and of a decode step, and the concatenation with the compressed
 * (top-k) part. Order matters: attention works through each list in 64-index blocks. */
#include <string.h>

#include "backend/cpu/cpu_attn.h"
#include "util/error.h"

int di_cpu_window_idx_prefill(int64_t T, int window, int32_t *out, di_error *err) {
    if (T < 0 || T > INT32_MAX || window < 1)
        return di_error_set(err, DI_ERR_INVALID, "window_idx_prefill: T %lld, window %d", (long long)T, window);
    const int64_t w = T < window ? T : window;
    for (int64_t p = 0; p < T; p++) {
        int64_t first = p - window + 1 > 0 ? p - window + 1 : 0;
        for (int64_t j = 0; j < w; j++) {
            int64_t pos = first + j;
            out[p * w + j] = pos > p ? -1 : (int32_t)pos; /* before the sequence start: empty */
        }
    }
    return DI_OK;
}

int di_cpu_window_idx_decode(int64_t pos, int window, int32_t *out, di_error *err) {
    if (pos < 0 || window < 1)
        return di_error_set(err, DI_ERR_INVALID, "window_idx_decode: pos %lld, window %d", (long long)pos, window);
    const int64_t oldest = pos % window + 1; /* slot after the newest token = the oldest one kept */
    for (int64_t j = 0; j < window; j++) {
        int64_t slot = (oldest + j) % window;
        out[j] = slot > pos ? -1 : (int32_t)slot; /* ring not yet filled */
    }
    return DI_OK;
}

int di_cpu_dspark_idx(int64_t pos, int window, int block, int32_t *out, di_error *err) {
    if (pos < 0 || window < 1 || block < 1)
        return di_error_set(err, DI_ERR_INVALID, "dspark_idx: pos %lld, window %d, block %d", (long long)pos, window,
                            block);
    const int64_t n_ring = pos + 1 < window ? pos + 1 : window;
    const int64_t w = n_ring + block;
    for (int64_t r = 0; r < block; r++) {
        for (int64_t j = 0; j < n_ring; j++) out[r * w + j] = (int32_t)j;
        for (int64_t j = 0; j < block; j++) out[r * w + n_ring + j] = window + (int32_t)j;
    }
    return DI_OK;
}

int di_cpu_attn_idx_concat(const int32_t *win, int64_t n_win, const int32_t *cmp, int64_t n_cmp, int64_t n_q,
                           int32_t *out, di_error *err) {
    if (n_win < 0 || n_cmp < 0 || n_q < 0 || (n_cmp > 0 && !cmp))
        return di_error_set(err, DI_ERR_INVALID, "attn_idx_concat: n_win %lld, n_cmp %lld, n_q %lld",
                            (long long)n_win, (long long)n_cmp, (long long)n_q);
    const int64_t w = n_win + n_cmp;
    for (int64_t i = 0; i < n_q; i++) {
        memcpy(out + i * w, win + i * n_win, (size_t)n_win * sizeof(int32_t));
        if (n_cmp) memcpy(out + i * w + n_win, cmp + i * n_cmp, (size_t)n_cmp * sizeof(int32_t));
    }
    return DI_OK;
}
