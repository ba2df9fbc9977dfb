/* Protocol requests → engine requests (see api_protocol.h). */
#include "engine/api_protocol.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat.h"
#include "text/tokenizer.h"
#include "util/error.h"

#define DEFAULT_MODEL "DeepSeek-V4.1-Flash"

static int parse(di_api api, const char *body, size_t len, di_request *req, di_error *err) {
    json_error_t je;
    json_t *root = json_loadb(body, len, 0, &je);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        /* the text layer words malformed bodies the way the API does */
        return di_request_parse(api, body, len, NULL, req, err);
    }
    json_t *model = json_object_get(root, "model");
    if (!model) json_object_set_new(root, "model", json_string(DEFAULT_MODEL));
    model = json_object_get(root, "model");
    const char *names[2] = {json_is_string(model) ? json_string_value(model) : DEFAULT_MODEL, NULL};
    di_api_options o;
    di_api_options_default(&o);
    o.model_names = names;
    char *text = json_dumps(root, JSON_COMPACT);
    int rc = text ? di_request_parse(api, text, strlen(text), &o, req, err)
                  : di_error_set(err, DI_ERR_NOMEM, "out of memory");
    free(text);
    json_decref(root);
    return rc;
}


int di_api_job_prepare(di_engine *e, di_api api, const char *body, size_t len, di_api_job *job, di_error *err) {
    memset(job, 0, sizeof *job);
    const di_tokenizer *tok = di_engine_tokenizer(e);
    if (!tok)
        return di_error_set(err, DI_ERR_UNSUPPORTED, "a %s request needs the tokenizer, and the checkpoint has no "
                                                     "tokenizer.json", di_api_name(api));
    int rc = parse(api, body, len, &job->req, err);
    if (rc) return rc;
    di_prompt prompt = {0};
    rc = di_chat_render(&job->req.conv, &prompt, err);
    if (!rc) rc = di_prompt_encode(&prompt, tok, &job->ids, &job->n_ids, err);
    di_prompt_free(&prompt);
    const di_sampling *s = &job->req.sampling;
    di_request_options *ro = &job->ro;
    di_request_options_default(ro);
    int64_t max_tokens = 0;
    if (!rc) rc = di_request_resolve_max_tokens(&job->req, (int64_t)job->n_ids, di_engine_max_context(e), &max_tokens, err);
    if (!rc && s->n_logit_bias) {
        job->bias = malloc(s->n_logit_bias * sizeof *job->bias);
        if (!job->bias) rc = di_error_set(err, DI_ERR_NOMEM, "out of memory");
        for (size_t i = 0; !rc && i < s->n_logit_bias; i++)
            job->bias[i] = (di_token_bias){.token = s->logit_bias[i].id, .bias = s->logit_bias[i].bias};
    }
    if (rc) {
        di_api_job_free(job);
        return rc;
    }
    ro->max_tokens = max_tokens;
    ro->sampling.temperature = s->temperature;
    ro->sampling.top_p = s->top_p;
    ro->sampling.top_k = s->top_k;
    ro->sampling.min_p = s->min_p;
    ro->sampling.presence_penalty = s->presence_penalty;
    ro->sampling.frequency_penalty = s->frequency_penalty;
    ro->sampling.repetition_penalty = s->repetition_penalty;
    ro->sampling.logit_bias = job->bias;
    ro->sampling.n_logit_bias = (int32_t)s->n_logit_bias;
    ro->sampling.seed = s->seed;
    ro->has_seed = s->has_seed;
    ro->sampling.logprobs = s->logprobs;
    ro->sampling.n_top_logprobs = s->top_logprobs;
    ro->n = s->n > 0 ? s->n : 1;
    /* Stop strings apply to the answer only (text/stream.h). Without thinking the whole output is the
     * answer, so the engine can stop on them itself; in thinking mode the reasoning must not trigger
     * them, so the output parser decides (di_stream_done) and the caller cancels the request. */
    if (!job->req.conv.thinking) {
        ro->stop = (const char *const *)job->req.parse.stop;
        ro->n_stop = (int32_t)job->req.parse.n_stop;
    }
    ro->thinking = job->req.conv.thinking;
    switch (job->req.constraint) {
    case DI_CONSTRAINT_JSON: ro->grammar_kind = DI_GRAMMAR_JSON_SCHEMA; break;
    case DI_CONSTRAINT_REGEX: ro->grammar_kind = DI_GRAMMAR_REGEX; break;
    case DI_CONSTRAINT_EBNF: ro->grammar_kind = DI_GRAMMAR_EBNF; break;
    default: ro->grammar_kind = DI_GRAMMAR_NONE; break; /* tool-call grammars: not compiled yet */
    }
    if (ro->grammar_kind != DI_GRAMMAR_NONE) {
        ro->grammar = job->req.constraint_spec ? job->req.constraint_spec : "";
        ro->grammar_len = strlen(ro->grammar);
    }
    return DI_OK;
}

void di_api_job_free(di_api_job *job) {
    di_request_free(&job->req);
    free(job->ids);
    free(job->bias);
    memset(job, 0, sizeof *job);
}

int di_engine_encode_chat(di_engine *e, const char *body, size_t len, int32_t **ids, int64_t *n_ids, di_error *err) {
    *ids = NULL;
    *n_ids = 0;
    di_api_job job;
    int rc = di_api_job_prepare(e, DI_API_CHAT, body, len, &job, err);
    if (rc) return rc;
    *ids = job.ids;
    *n_ids = (int64_t)job.n_ids;
    job.ids = NULL;
    di_api_job_free(&job);
    return DI_OK;
}
