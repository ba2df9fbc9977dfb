/* Token-id input for the output parser: ids go through the streaming detokenizer, which holds back
 * a character split across ids, and each id counts as one completion token. */
#include <stdlib.h>

#include "text/stream.h"
#include "text/tokenizer.h"
#include "util/error.h"

int di_stream_push_ids(di_stream *s, di_detok *d, const int32_t *ids, size_t n, di_events *ev, di_error *err) {
    for (size_t i = 0; i < n; i++) {
        char *text = NULL;
        size_t len = 0;
        di_error derr = {0};
        /* an id the vocabulary cannot decode is counted and otherwise ignored, as the reference does */
        if (di_detok_push(d, ids[i], &text, &len, &derr)) len = 0;
        int rc = di_stream_push(s, text ? text : "", len, 1, ev, err);
        free(text);
        if (rc) return rc;
    }
    return DI_OK;
}

int di_stream_finish_ids(di_stream *s, di_detok *d, di_finish reason, di_events *ev, di_error *err) {
    char *text = NULL;
    size_t len = 0;
    if (di_detok_flush(d, &text, &len)) len = 0;
    int rc = di_stream_push(s, text ? text : "", len, 0, ev, err);
    free(text);
    return rc ? rc : di_stream_finish(s, reason, ev, err);
}
