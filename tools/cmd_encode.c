/* deepinfer encode — text to token ids.
 *   deepinfer encode [--tokenizer FILE | --model DIR] (--text S | --file F | stdin) [--no-special] [--json]
 * Without --no-special, added-token literals in the text ("<｜User｜>") become their ids, as for a rendered
 * prompt; with it the text is plain BPE, as for message content. Plain output: ids separated by commas. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "text/tokenizer.h"

#define DEFAULT_TOKENIZER DI_TOKENIZER_DEFAULT_PATH

/* Reads a whole stream; returns malloc'd bytes or NULL. */
static char *slurp(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap);
    while (p) {
        n += fread(p + n, 1, cap - n, f);
        if (n < cap) break;
        char *q = realloc(p, cap *= 2);
        if (!q) free(p);
        p = q;
    }
    if (p && ferror(f)) {
        free(p);
        p = NULL;
    }
    *len = n;
    return p;
}

int cmd_encode(int argc, char **argv) {
    di_args a;
    cli_args_init(&a, argc, argv);
    di_cli cli = {.cmd = "encode", .json = cli_flag(&a, "json")};
    const char *tok_path = cli_str(&a, "tokenizer", NULL), *model = cli_str(&a, "model", NULL);
    const char *text_arg = cli_str(&a, "text", NULL), *file = cli_str(&a, "file", NULL);
    bool special = !cli_flag(&a, "no-special");
    int rc = 1;
    char *text = NULL;
    int32_t *ids = NULL;
    di_tokenizer *tok = NULL;
    if (!cli_check_unused(&cli, &a)) goto out;
    if (tok_path && model) {
        rc = cli_fail(&cli, "give either --tokenizer FILE or --model DIR, not both");
        goto out;
    }
    if (text_arg && file) {
        rc = cli_fail(&cli, "give either --text S or --file F, not both");
        goto out;
    }
    size_t len;
    if (text_arg) {
        len = strlen(text_arg);
        text = malloc(len + 1);
        if (text) memcpy(text, text_arg, len + 1);
    } else {
        FILE *f = file ? fopen(file, "rb") : stdin;
        if (!f) {
            rc = cli_fail(&cli, "cannot open --file %s", file);
            goto out;
        }
        text = slurp(f, &len);
        if (file) fclose(f);
    }
    if (!text) {
        rc = cli_fail(&cli, "cannot read the input text%s%s", file ? " from " : "", file ? file : "");
        goto out;
    }
    di_error err = {0};
    if (di_tok_load(model ? model : tok_path ? tok_path : DEFAULT_TOKENIZER, &tok, &err) ||
        di_tok_encode(tok, text, len, special, &ids, &len, &err)) {
        rc = cli_fail_err(&cli, &err);
        goto out;
    }
    if (cli.json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < len; i++) json_array_append_new(arr, json_integer(ids[i]));
        json_t *doc = json_object();
        json_object_set_new(doc, "special", json_boolean(special));
        json_object_set_new(doc, "n_tokens", json_integer((json_int_t)len));
        json_object_set_new(doc, "ids", arr);
        rc = cli_emit(&cli, doc);
    } else {
        for (size_t i = 0; i < len; i++) printf(i ? ",%d" : "%d", ids[i]);
        printf("\n");
        rc = 0;
    }
out:
    free(ids);
    free(text);
    di_tok_free(tok);
    cli_args_free(&a);
    return rc;
}
