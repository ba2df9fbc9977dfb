/* deepinfer decode — token ids to text.
 *   deepinfer decode [--tokenizer FILE | --model DIR] --ids 1,2,3 [--json]
 * Special tokens are kept (skip_special_tokens=False); bytes of an incomplete character become U+FFFD. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "text/tokenizer.h"

#define DEFAULT_TOKENIZER DI_TOKENIZER_DEFAULT_PATH

/* Parses "1,2, 3" into a malloc'd array; returns false with a message on anything else. */
static bool parse_ids(const di_cli *cli, const char *s, int32_t **ids, size_t *n) {
    size_t cap = 16;
    *n = 0;
    *ids = malloc(cap * sizeof **ids);
    while (*ids && *s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < INT32_MIN || v > INT32_MAX) {
            cli_fail(cli, "--ids expects comma-separated integers, got '%s'", s);
            return false;
        }
        if (*n == cap) {
            int32_t *p = realloc(*ids, (cap *= 2) * sizeof *p);
            if (!p) break;
            *ids = p;
        }
        (*ids)[(*n)++] = (int32_t)v;
        s = end;
        while (*s == ' ') s++;
        if (*s == ',') s++;
        else if (*s) {
            cli_fail(cli, "--ids expects comma-separated integers, found '%s'", s);
            return false;
        }
    }
    if (!*ids) return cli_fail(cli, "out of memory"), false;
    return true;
}

int cmd_decode(int argc, char **argv) {
    di_args a;
    cli_args_init(&a, argc, argv);
    di_cli cli = {.cmd = "decode", .json = cli_flag(&a, "json")};
    const char *tok_path = cli_str(&a, "tokenizer", NULL), *model = cli_str(&a, "model", NULL);
    const char *ids_arg = cli_str(&a, "ids", NULL);
    int rc = 1;
    int32_t *ids = NULL;
    char *text = NULL;
    di_tokenizer *tok = NULL;
    size_t n = 0, len = 0;
    if (!cli_check_unused(&cli, &a)) goto out;
    if (tok_path && model) {
        rc = cli_fail(&cli, "give either --tokenizer FILE or --model DIR, not both");
        goto out;
    }
    if (!ids_arg) {
        rc = cli_fail(&cli, "usage: deepinfer decode [--tokenizer FILE | --model DIR] --ids 1,2,3 [--json]");
        goto out;
    }
    if (!parse_ids(&cli, ids_arg, &ids, &n)) goto out;
    di_error err = {0};
    if (di_tok_load(model ? model : tok_path ? tok_path : DEFAULT_TOKENIZER, &tok, &err) ||
        di_tok_decode(tok, ids, n, &text, &len, &err)) {
        rc = cli_fail_err(&cli, &err);
        goto out;
    }
    if (cli.json) {
        json_t *doc = json_object();
        json_object_set_new(doc, "n_tokens", json_integer((json_int_t)n));
        json_object_set_new(doc, "text", json_stringn(text, len));
        rc = cli_emit(&cli, doc);
    } else {
        fwrite(text, 1, len, stdout);
        fputc('\n', stdout);
        rc = 0;
    }
out:
    free(ids);
    free(text);
    di_tok_free(tok);
    cli_args_free(&a);
    return rc;
}
