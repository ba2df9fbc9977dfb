/* deepinfer render — convert a Chat Completions / Responses / Messages request to the V4.1 prompt.
 *
 *   deepinfer render --api chat|responses|messages REQUEST.json [--tokenizer FILE | --model DIR] [--json]
 *
 * Prints the prompt text (special tokens spelled out) and, when a tokenizer is available, its token
 * ids; --json adds the segments, the extracted sampling/parsing options and the output constraint.
 * REQUEST.json may be "-" for stdin. An invalid request fails with the API's own error message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "text/api.h"
#include "text/chat.h"
#include "text/tokenizer.h"

static char *read_all(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            char *p = realloc(buf, cap *= 2);
            if (!p) free(buf);
            buf = p;
        }
    }
    if (f != stdin) fclose(f);
    *len = n;
    return buf;
}

static json_t *options_json(const di_request *r) {
    const di_sampling *s = &r->sampling;
    json_t *stop = json_array();
    for (size_t i = 0; i < r->parse.n_stop; i++) json_array_append_new(stop, json_string(r->parse.stop[i]));
    json_t *bias = json_object();
    for (size_t i = 0; i < s->n_logit_bias; i++) {
        char k[16];
        snprintf(k, sizeof k, "%d", s->logit_bias[i].id);
        json_object_set_new(bias, k, json_real(s->logit_bias[i].bias));
    }
    static const char *const STAGES[] = {"content", "reasoning", "reasoning_continuation", "content_continuation"};
    return json_pack("{s:s,s:b,s:b,s:i,s:{s:f,s:f,s:i,s:f,s:I,s:o,s:i,s:f,s:f,s:f,s:o,s:b,s:i},"
                     "s:{s:b,s:b,s:b,s:s,s:o},s:{s:s,s:o}}",
                     "model", r->model, "stream", r->stream, "thinking", r->conv.thinking, "reasoning_effort",
                     di_effort_value(r->conv.effort), "sampling", "temperature", (double)s->temperature, "top_p",
                     (double)s->top_p, "top_k", s->top_k, "min_p", (double)s->min_p, "max_tokens",
                     (json_int_t)s->max_tokens, "seed", s->has_seed ? json_integer((json_int_t)s->seed) : json_null(),
                     "n", s->n, "presence_penalty", (double)s->presence_penalty, "frequency_penalty",
                     (double)s->frequency_penalty, "repetition_penalty", (double)s->repetition_penalty, "logit_bias",
                     bias, "logprobs", s->logprobs, "top_logprobs", s->top_logprobs, "parse", "tool_calls",
                     r->parse.parse_tool_calls, "starts_in_tool_calls", r->parse.starts_in_tool_calls, "json_output",
                     r->parse.parse_json_output, "initial_stage", STAGES[r->parse.stage0], "stop", stop, "constraint",
                     "kind", di_constraint_kind_name(r->constraint), "spec",
                     r->constraint_spec ? json_string(r->constraint_spec) : json_null());
}

int cmd_render(int argc, char **argv) {
    di_args a;
    cli_args_init(&a, argc, argv);
    di_cli cli = {.cmd = "render", .json = cli_flag(&a, "json")};
    const char *api_name = cli_str(&a, "api", "chat");
    const char *tok_path = cli_str(&a, "tokenizer", NULL);
    const char *model_dir = cli_str(&a, "model", NULL);
    const char *req_path = NULL;
    for (int i = 1; i < argc; i++)
        if (!a.used[i] && (argv[i][0] != '-' || !strcmp(argv[i], "-")) && !req_path) req_path = argv[i], a.used[i] = 1;
    int rc = 1;
    if (!cli_check_unused(&cli, &a)) goto out_args;
    int api = api_name ? di_api_from_name(api_name) : -1;
    if (api < 0) {
        rc = cli_fail(&cli, "--api expects chat, responses or messages, got '%s'", api_name ? api_name : "(nothing)");
        goto out_args;
    }
    if (!req_path) {
        rc = cli_fail(&cli, "missing REQUEST.json (usage: deepinfer render --api chat|responses|messages REQUEST.json)");
        goto out_args;
    }
    size_t len;
    char *body = read_all(req_path, &len);
    if (!body) {
        rc = cli_fail(&cli, "cannot read request file %s", req_path);
        goto out_args;
    }
    di_request req;
    di_error err = {0};
    if (di_request_parse((di_api)api, body, len, NULL, &req, &err)) {
        rc = cli_fail(&cli, "%s: %s request rejected (400 invalid_request_error): %s", req_path, api_name, err.msg);
        free(body);
        goto out_args;
    }
    free(body);
    di_prompt p;
    if (di_chat_render(&req.conv, &p, &err)) {
        rc = cli_fail_err(&cli, &err);
        goto out_req;
    }
    /* ids: explicit tokenizer, else the model directory's, else the default official file */
    int32_t *ids = NULL;
    size_t n_ids = 0;
    const char *tok_used = NULL;
    if (!tok_path && model_dir) tok_path = model_dir; /* di_tok_load finds tokenizer.json in it */
    struct stat sb;
    if (!tok_path && stat(DI_DEFAULT_TOKENIZER, &sb) == 0) tok_path = DI_DEFAULT_TOKENIZER;
    if (tok_path) {
        di_tokenizer *tok;
        if (di_tok_load(tok_path, &tok, &err)) {
            rc = cli_fail_err(&cli, &err);
            goto out_prompt;
        }
        int erc = di_prompt_encode(&p, tok, &ids, &n_ids, &err);
        di_tok_free(tok);
        if (erc) {
            rc = cli_fail_err(&cli, &err);
            goto out_prompt;
        }
        tok_used = tok_path;
    }
    size_t plen;
    char *text = di_prompt_text(&p, &plen);
    if (cli.json) {
        json_t *segs = json_array();
        for (size_t i = 0; i < p.n_segs; i++)
            json_array_append_new(segs, json_pack("{s:s%,s:b}", "text", p.segs[i].text, p.segs[i].len, "special",
                                                  p.segs[i].special));
        json_t *jids = json_array();
        for (size_t i = 0; i < n_ids; i++) json_array_append_new(jids, json_integer(ids[i]));
        json_t *doc = json_pack("{s:s,s:s%,s:o,s:o,s:o,s:o}", "api", api_name, "prompt", text, plen, "segments", segs,
                                "ids", tok_used ? jids : (json_decref(jids), json_null()), "tokenizer",
                                tok_used ? json_string(tok_used) : json_null(), "request", options_json(&req));
        rc = cli_emit(&cli, doc);
    } else {
        fwrite(text, 1, plen, stdout);
        fputc('\n', stdout);
        if (tok_used) {
            printf("ids (%zu):", n_ids);
            for (size_t i = 0; i < n_ids; i++) printf("%s%d", i ? "," : " ", ids[i]);
            fputc('\n', stdout);
        } else {
            fprintf(stderr, "deepinfer render: no tokenizer (--tokenizer FILE, --model DIR or %s): prompt only\n",
                    DI_DEFAULT_TOKENIZER);
        }
        rc = 0;
    }
    free(text);
    free(ids);
out_prompt:
    di_prompt_free(&p);
out_req:
    di_request_free(&req);
out_args:
    cli_args_free(&a);
    return rc;
}
