/* Protocol requests → engine requests: one Chat Completions / Responses / Messages body is parsed
 * and validated by the text layer (src/text/api.h), rendered in the V4.1 chat format, tokenized,
 * and its sampling, stop and structured-output options are translated into di_request_options.
 * Shared by `deepinfer run` and di_engine_encode_chat (the Python package's LLM.chat).
 *
 * Offline, the engine serves whatever checkpoint it was opened on, so the body's "model" is taken
 * as given (and "DeepSeek-V4.1-Flash" is assumed when it is missing) instead of being checked
 * against the served model names. */
#ifndef DI_ENGINE_API_PROTOCOL_H
#define DI_ENGINE_API_PROTOCOL_H

#include "deepinfer.h"
#include "text/api.h"

typedef struct di_api_job {
    di_request req;            /* the parsed request (conversation, parse options, sampling) */
    int32_t *ids;              /* [n_ids] prompt ids */
    size_t n_ids;
    di_request_options ro;     /* points into req and bias; valid while the job lives */
    di_token_bias *bias;       /* [req.sampling.n_logit_bias] */
} di_api_job;

/* DI_ERR_INVALID / DI_ERR_LIMIT with the API's error message when the request is rejected. */
int di_api_job_prepare(di_engine *e, di_api api, const char *body, size_t len, di_api_job *job, di_error *err);
void di_api_job_free(di_api_job *job);

/* The engine's tokenizer (NULL without one), for the protocol layer's logprob token texts. */
const struct di_tokenizer *di_engine_tokenizer(const di_engine *e);

#endif
