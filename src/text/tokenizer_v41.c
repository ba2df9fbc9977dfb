#include "text/tokenizer_v41.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

static const struct {
    int id;
    const char *v4;   /* what the official V4 file holds at this id */
    const char *v41;  /* the V4.1 layout's token */
    int special;      /* V4.1 special flag */
} k_changes[] = {
    {128799, "<｜place▁holder▁no▁799｜>", "<｜System｜>", 1},
    {129264, "<｜image｜>", "<｜deepseek_image｜>", 0},
};

static const char k_note[] =
    "# tokenizer.json of this generated model\n\n"
    "Derived, not official: the official DeepSeek-V4 tokenizer.json (sha256 97d2f31b…6b19, shipped in\n"
    "deepinfer's data/tokenizer/deepseek-v4/) with the two added tokens that differ in the V4.1 layout:\n"
    "id 128799 `<｜System｜>` and id 129264 `<｜deepseek_image｜>`. The official V4.1 file (sha256\n"
    "81f64d12…8d99) was not obtainable when this generator was written. A real V4.1-Flash checkpoint\n"
    "ships its own tokenizer.json; use that.\n";

int di_tok_write_v41_layout(const char *src, const char *dst, di_error *err) {
    json_error_t je;
    json_t *root = json_load_file(src, 0, &je);
    if (!root) return di_error_set(err, DI_ERR_FORMAT, "%s: invalid JSON (line %d: %s)", src, je.line, je.text);
    json_t *added = json_object_get(root, "added_tokens");
    int rc = DI_OK;
    size_t done = 0;
    for (size_t c = 0; c < sizeof k_changes / sizeof k_changes[0] && rc == DI_OK; c++) {
        size_t i;
        json_t *t;
        json_array_foreach(added, i, t) {
            if (json_integer_value(json_object_get(t, "id")) != k_changes[c].id) continue;
            const char *have = json_string_value(json_object_get(t, "content"));
            if (!have || strcmp(have, k_changes[c].v4) != 0) {
                rc = di_error_set(err, DI_ERR_INVALID, "%s: added token %d is '%s', expected the V4 file's '%s'", src,
                                  k_changes[c].id, have ? have : "(none)", k_changes[c].v4);
                break;
            }
            json_object_set_new(t, "content", json_string(k_changes[c].v41));
            json_object_set_new(t, "special", json_boolean(k_changes[c].special));
            done++;
            break;
        }
    }
    if (rc == DI_OK && done != sizeof k_changes / sizeof k_changes[0])
        rc = di_error_set(err, DI_ERR_INVALID, "%s: added tokens 128799/129264 not found (not the V4 tokenizer?)", src);
    if (rc == DI_OK && json_dump_file(root, dst, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0)
        rc = di_error_set(err, DI_ERR_IO, "%s: cannot write: %s", dst, strerror(errno));
    json_decref(root);
    if (rc != DI_OK) return rc;
    /* TOKENIZER.md next to dst */
    const char *slash = strrchr(dst, '/');
    size_t dl = slash ? (size_t)(slash - dst) + 1 : 0;
    char *note = malloc(dl + sizeof "TOKENIZER.md");
    if (!note) return di_error_set(err, DI_ERR_NOMEM, "out of memory");
    memcpy(note, dst, dl);
    strcpy(note + dl, "TOKENIZER.md");
    FILE *f = fopen(note, "w");
    if (!f || fputs(k_note, f) < 0) rc = di_error_set(err, DI_ERR_IO, "%s: cannot write", note);
    if (f) fclose(f);
    free(note);
    return rc;
}
