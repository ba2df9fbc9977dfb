/* Request state and stop conditions (see sequence.h). */
#include "engine/sequence.h"

#include <stdlib.h>
#include <string.h> /* memmem: _GNU_SOURCE comes from the Makefile */

const char *di_finish_reason_name(di_finish_reason r) {
    switch (r) {
    case DI_FINISH_REASON_NONE: return "none";
    case DI_FINISH_REASON_STOP: return "stop";
    case DI_FINISH_REASON_LENGTH: return "length";
    case DI_FINISH_REASON_CANCELLED: return "cancelled";
    case DI_FINISH_REASON_ERROR: return "error";
    }
    return "?";
}

void di_seq_free(di_seq *r) {
    if (!r) return;
    for (int32_t i = 0; r->stop_copy && i < r->params.n_stop; i++) free(r->stop_copy[i]);
    free(r->stop_copy);
    free((void *)r->params.stop_ids);
    free((void *)r->params.sampling.logit_bias);
    free(r->prompt);
    free(r->out);
    free(r->out_lp);
    free(r->blocks);
    free(r->text);
    free(r->dev_out);
    free(r->prefix_hit.nodes); /* the pins belong to the scheduler, which is done with them */
    free(r);
}

int di_seq_new(int64_t id, const int32_t *prompt, int64_t n_prompt, const di_seq_params *params,
                   int32_t n_vocab, di_seq **out, di_error *err) {
    *out = NULL;
    if (n_prompt < 1 || !prompt)
        return di_error_set(err, DI_ERR_INVALID, "request %lld: empty prompt, expected at least one token", (long long)id);
    if (params->max_tokens < 1)
        return di_error_set(err, DI_ERR_INVALID, "request %lld: max_tokens %lld, expected >= 1", (long long)id,
                            (long long)params->max_tokens);
    if (params->prefill_chunk < 0)
        return di_error_set(err, DI_ERR_INVALID, "request %lld: prefill_chunk %d, expected >= 0", (long long)id,
                            params->prefill_chunk);
    if (params->n_stop < 0 || params->n_stop > DI_REQUEST_MAX_STOP || (params->n_stop && !params->stop))
        return di_error_set(err, DI_ERR_INVALID, "request %lld: %d stop strings, expected 0..%d", (long long)id,
                            params->n_stop, DI_REQUEST_MAX_STOP);
    if (params->n_stop_ids < 0 || (params->n_stop_ids && !params->stop_ids))
        return di_error_set(err, DI_ERR_INVALID, "request %lld: %d stop ids without an array", (long long)id,
                            params->n_stop_ids);
    int rc = di_sampling_params_check(&params->sampling, n_vocab, err);
    if (rc) return di_error_wrap(err, "request %lld", (long long)id);
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= n_vocab)
            return di_error_set(err, DI_ERR_INVALID, "request %lld: prompt token %lld is id %d, expected 0..%d",
                                (long long)id, (long long)i, prompt[i], n_vocab - 1);
    /* a bias map has one entry per token (checked once here, not per sampled row) */
    for (int32_t i = 0; i < params->sampling.n_logit_bias; i++)
        for (int32_t j = 0; j < i; j++)
            if (params->sampling.logit_bias[i].token == params->sampling.logit_bias[j].token)
                return di_error_set(err, DI_ERR_INVALID, "request %lld: logit_bias lists token %d twice", (long long)id,
                                    params->sampling.logit_bias[i].token);
    for (int32_t i = 0; i < params->n_stop; i++) {
        size_t n = params->stop[i] ? strlen(params->stop[i]) : 0;
        if (n < 1 || n > DI_REQUEST_MAX_STOP_LEN)
            return di_error_set(err, DI_ERR_INVALID, "request %lld: stop string %d has %zu bytes, expected 1..%d",
                                (long long)id, i, n, DI_REQUEST_MAX_STOP_LEN);
    }

    di_seq *r = calloc(1, sizeof *r);
    if (!r) return di_error_set(err, DI_ERR_NOMEM, "request %lld: out of memory", (long long)id);
    r->id = id;
    r->params = *params;
    r->params.stop = NULL;
    r->params.stop_ids = NULL;
    r->params.sampling.logit_bias = NULL;
    r->stop_token = -1;
    r->prompt = malloc((size_t)n_prompt * sizeof *r->prompt);
    int bad = !r->prompt;
    if (!bad) memcpy(r->prompt, prompt, (size_t)n_prompt * sizeof *r->prompt);
    r->n_prompt = n_prompt;
    if (!bad && params->n_stop_ids) {
        int32_t *ids = malloc((size_t)params->n_stop_ids * sizeof *ids);
        bad = !ids;
        if (ids) memcpy(ids, params->stop_ids, (size_t)params->n_stop_ids * sizeof *ids);
        r->params.stop_ids = ids;
    }
    if (!bad && params->sampling.n_logit_bias) {
        size_t n = (size_t)params->sampling.n_logit_bias * sizeof(di_token_bias);
        di_token_bias *b = malloc(n);
        bad = !b;
        if (b) memcpy(b, params->sampling.logit_bias, n);
        r->params.sampling.logit_bias = b;
    }
    if (!bad && params->n_stop) {
        r->stop_copy = calloc((size_t)params->n_stop, sizeof *r->stop_copy);
        bad = !r->stop_copy;
        for (int32_t i = 0; !bad && i < params->n_stop; i++) {
            r->stop_copy[i] = strdup(params->stop[i]);
            bad = !r->stop_copy[i];
            size_t n = strlen(params->stop[i]);
            if (n > r->max_stop_len) r->max_stop_len = n;
        }
        r->params.stop = (const char *const *)r->stop_copy;
    }
    if (bad) {
        di_seq_free(r);
        return di_error_set(err, DI_ERR_NOMEM, "request %lld: out of memory", (long long)id);
    }
    *out = r;
    return DI_OK;
}

static int grow(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return 0;
    int64_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

int di_seq_dev_push(di_seq *r, int32_t token) {
    if (grow((void **)&r->dev_out, &r->cap_dev_out, r->n_dev_out + 1, sizeof *r->dev_out)) return DI_ERR_NOMEM;
    r->dev_out[r->n_dev_out++] = token;
    return DI_OK;
}

int di_seq_reserve_blocks(di_seq *r, int32_t n) {
    int64_t cap = r->cap_blocks;
    if (grow((void **)&r->blocks, &cap, n, sizeof *r->blocks)) return DI_ERR_NOMEM;
    r->cap_blocks = (int32_t)cap;
    return DI_OK;
}

static int text_append(di_seq *r, const char *b, size_t n) {
    int64_t cap = (int64_t)r->cap_text;
    if (grow((void **)&r->text, &cap, (int64_t)(r->n_text + n + 1), 1)) return DI_ERR_NOMEM;
    r->cap_text = (size_t)cap;
    memcpy(r->text + r->n_text, b, n);
    r->n_text += n;
    r->text[r->n_text] = 0;
    return DI_OK;
}

int di_seq_on_token(di_seq *r, int32_t token, const di_sample_result *res, const int32_t *eos_ids,
                        int32_t n_eos, int64_t max_context, di_detok_fn detok, void *detok_ctx, di_error *err) {
    int64_t cap = r->cap_out;
    if (grow((void **)&r->out, &cap, r->n_out + 1, sizeof *r->out))
        return di_error_set(err, DI_ERR_NOMEM, "request %lld: out of memory for output", (long long)r->id);
    if (r->params.sampling.logprobs) {
        int64_t cap_lp = r->cap_out;
        if (grow((void **)&r->out_lp, &cap_lp, r->n_out + 1, sizeof *r->out_lp))
            return di_error_set(err, DI_ERR_NOMEM, "request %lld: out of memory for logprobs", (long long)r->id);
        di_token_logprobs *lp = &r->out_lp[r->n_out];
        lp->logprob = res->logprob;
        lp->n_top = res->n_top;
        memcpy(lp->top_ids, res->top_ids, sizeof lp->top_ids);
        memcpy(lp->top_logprobs, res->top_logprobs, sizeof lp->top_logprobs);
    }
    r->cap_out = cap;
    r->out[r->n_out++] = token;

    int is_stop_id = 0;
    for (int32_t i = 0; i < n_eos && !r->params.ignore_eos; i++) is_stop_id |= eos_ids[i] == token;
    for (int32_t i = 0; i < r->params.n_stop_ids; i++) is_stop_id |= r->params.stop_ids[i] == token;
    if (is_stop_id) {
        r->finish = DI_FINISH_REASON_STOP;
        r->stop_token = token;
        return DI_OK;
    }
    if (detok) {
        char buf[256];
        int n = detok(detok_ctx, token, buf, sizeof buf);
        if (n < 0) return di_error_set(err, DI_ERR_INVALID, "request %lld: detokenizer failed on token %d", (long long)r->id, token);
        if ((size_t)n > sizeof buf) {
            char *big = malloc((size_t)n);
            if (!big) return di_error_set(err, DI_ERR_NOMEM, "request %lld: out of memory", (long long)r->id);
            int m = detok(detok_ctx, token, big, (size_t)n);
            int rc = m == n ? text_append(r, big, (size_t)n) : DI_ERR_INVALID;
            free(big);
            if (rc) return di_error_set(err, rc, "request %lld: detokenizing token %d failed", (long long)r->id, token);
        } else if (text_append(r, buf, (size_t)n)) {
            return di_error_set(err, DI_ERR_NOMEM, "request %lld: out of memory for text", (long long)r->id);
        }
        if (r->params.n_stop && n > 0) {
            /* only a match that ends in the new bytes is new: start max_stop_len − 1 bytes before them */
            size_t old = r->n_text - (size_t)n;
            size_t start = old + 1 >= r->max_stop_len ? old + 1 - r->max_stop_len : 0;
            const char *hit = NULL;
            for (int32_t i = 0; i < r->params.n_stop; i++) {
                const char *s = r->params.stop[i];
                const char *h = memmem(r->text + start, r->n_text - start, s, strlen(s));
                if (h && (!hit || h < hit)) hit = h;
            }
            if (hit) {
                r->n_text = (size_t)(hit - r->text);
                r->text[r->n_text] = 0;
                r->finish = DI_FINISH_REASON_STOP;
                return DI_OK;
            }
        }
    }
    if (r->n_out >= r->params.max_tokens || r->n_prompt + r->n_out >= max_context) r->finish = DI_FINISH_REASON_LENGTH;
    return DI_OK;
}

/* Length of the longest proper tail of text that is a prefix of some stop string. */
static size_t stop_prefix_tail(const di_seq *r) {
    size_t best = 0;
    for (int32_t i = 0; i < r->params.n_stop; i++) {
        const char *s = r->params.stop[i];
        size_t ls = strlen(s);
        size_t k = ls - 1 < r->n_text ? ls - 1 : r->n_text;
        for (; k > best; k--)
            if (!memcmp(r->text + r->n_text - k, s, k)) {
                best = k;
                break;
            }
    }
    return best;
}

size_t di_seq_text_ready(const di_seq *r) {
    if (r->state == DI_REQ_FINISHED || r->finish != DI_FINISH_REASON_NONE) return r->n_text;
    size_t safe = r->n_text - stop_prefix_tail(r);
    /* back off an unfinished UTF-8 sequence ending at `safe` */
    for (size_t back = 1; back <= 4 && back <= safe; back++) {
        unsigned char c = (unsigned char)r->text[safe - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation byte: keep looking for the lead */
        size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
        if (need > back) safe -= back;
        break;
    }
    return safe < r->n_text_emitted ? r->n_text_emitted : safe;
}
