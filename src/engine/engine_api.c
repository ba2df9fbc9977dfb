/* Public engine API (include/deepinfer.h) over the engine core.
 *
 * The pieces it wires together:
 *   model      di_model_open + the backend (cpu or cuda) + a model runner, chosen in open_runner() alone:
 *              the cached session runner (api_runner.h) or the exact cache-free recompute runner;
 *              nothing above the di_model_runner interface knows which. The cached runner gets the
 *              prefix cache when prefix_cache_bytes > 0 (before the core is built: the scheduler
 *              owns its tree, scheduler.h); its per-request hits come back through the runner's
 *              cache_hit hook with the step results (runner.h) into di_delta. On the CUDA backend the
 *              cached runner keeps the logits on the device and the executor samples there
 *              (executor.h; DI_CUDA_SAMPLER=off samples on the host instead).
 *   tokenizer  the checkpoint's tokenizer.json when present: text prompts, the detokenizer the core
 *              uses for text deltas and stop strings, and the grammar vocabulary.
 *   grammar    compiled once per request, one matcher per choice, plugged into the core as the
 *              request's di_constraint (the executor calls fill_mask / accept on its worker).
 *
 * Ids. A user request with n choices becomes n core requests with ids id · 64 + choice, so a core
 * delta maps back to (id, choice) without a table; the per-request record (usage, live choices) is
 * found by id. A choice's grammar matcher belongs to the core request: the core's release hook frees
 * it once no step in flight can still call it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "deepinfer.h"
#include "engine/grammar_vocab.h"
#include "engine/api_protocol.h"
#include "engine/api_runner.h"
#include "engine/engine_core.h"
#include "engine/idmap.h"
#include "engine/recompute_runner.h"
#include "grammar/grammar.h"
#include "model/cache_pool.h"
#include "model/weights.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/log.h"

#define MAX_CHOICES 64

/* A grammar shared by the choices of one request; freed by the last matcher's release. */
typedef struct api_grammar {
    di_grammar *g;
    int32_t refs;
} api_grammar;

/* One choice's constraint: the matcher and the hook the core calls. */
typedef struct api_constraint {
    di_constraint hook;
    di_grammar_matcher *m;
    api_grammar *shared;
} api_constraint;

typedef struct api_request {
    int64_t id;
    int32_t n_choices;
    int32_t n_live;                       /* choices whose finish has not been polled yet */
    int64_t n_prompt;
    int64_t completion[MAX_CHOICES];      /* tokens delivered per choice */
} api_request;

struct di_engine {
    di_engine_options opt;
    di_model *model;
    di_backend *be;
    di_recompute_runner *rr;    /* one of rr / sr is open */
    di_session_runner *sr;
    di_model_runner runner;
    di_core *core;
    di_tokenizer *tok;                    /* NULL: the checkpoint ships no tokenizer */
    di_grammar_vocab *gvocab;             /* built on the first grammar request */
    int32_t eos;
    uint64_t seed_state;
    int64_t next_id;
    di_idmap reqs;                        /* id → api_request* */
    di_core_delta *cd;                    /* [cap_deltas] */
    int32_t cap_deltas;
    int64_t prompt_tokens;
    double t_open;
};


void di_engine_options_default(di_engine_options *o) {
    *o = (di_engine_options){.device = "cpu",
                             .runner = "cached",
                             .max_seqs = 64,
                             .max_step_tokens = 2048,
                             .prefill_chunk = 512,
                             .async = 1,
                             .sample_threads = 4};
}

void di_request_options_default(di_request_options *o) {
    memset(o, 0, sizeof *o);
    o->sampling = di_sampling_params_default();
    o->n = 1;
}

void di_free(void *p) { free(p); }

/* splitmix64: seeds for requests that bring none, distinct per request. */
static uint64_t next_seed(di_engine *e) {
    uint64_t z = (e->seed_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFFull;
}

static int detok_bytes(void *ctx, int32_t token, char *buf, size_t cap) {
    size_t len = 0;
    const char *b = di_tok_token_bytes(ctx, token, &len);
    if (!b) return 0; /* ids without bytes (padding rows of the embedding) add no text */
    if (len <= cap) memcpy(buf, b, len);
    return (int)len;
}

static int open_runner(di_engine *e, di_error *err) {
    const di_engine_options *o = &e->opt;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int n_threads = o->n_threads > 0 ? o->n_threads : (ncpu > 0 ? (int)ncpu : 1);
    /* "cuda" reaches the CUDA backend when this binary links it (deepinfer-cuda); a CPU-only build
     * answers "built without CUDA". The weights then move to backend memory once, before any session
     * allocates its caches there (model/weights.h). */
    int rc = di_backend_create(o->device ? o->device : "cpu", n_threads, &e->be, err);
    if (!rc) rc = di_model_to_backend(e->model, e->be, err);
    if (rc) return rc;
    enum { BLOCK_TOKENS = 16 };
    int64_t cache = o->cache_tokens > 0 ? o->cache_tokens : (int64_t)o->max_seqs * o->max_context;
    int64_t n_blocks = (cache + BLOCK_TOKENS - 1) / BLOCK_TOKENS;
    if (n_blocks > INT32_MAX) n_blocks = INT32_MAX;
    if (!o->runner || !strcmp(o->runner, "cached")) {
        /* one paged pool (model/cache_pool.h): the scheduler's blocks are its pages; a slot per
         * sequence (+ the prefix cache's probe session); a block is a multiple of the ratios */
        int32_t block = BLOCK_TOKENS, align = di_cache_pool_align(&e->model->cfg), n_slots = o->max_seqs + 1;
        if (block % align) block = (block + align - 1) / align * align;
        n_blocks = (cache + block - 1) / block;
        if (n_blocks > INT32_MAX) n_blocks = INT32_MAX;
        if (o->cache_bytes > 0) {
            di_cache_pool_opts po = {.be = e->be, .max_tokens = o->max_context, .spec_margin = -1,
                                     .page_tokens = block, .n_slots = n_slots, .external_pages = 1};
            int32_t np;
            rc = di_cache_pool_pages_for(&e->model->cfg, &po, o->cache_bytes, &np, err);
            if (rc) return di_error_wrap(err, "engine: cache_bytes");
            n_blocks = np;
        }
        rc = di_session_runner_new(e->model, e->be, o->max_context, block, (int32_t)n_blocks, &e->sr, &e->runner, err);
        if (!rc) rc = di_session_runner_use_pool(e->sr, &e->runner, n_slots, err);
        if (!rc && o->prefix_cache_bytes > 0)
            rc = di_session_runner_enable_prefix(e->sr, &e->runner, o->prefix_block, o->prefix_cache_bytes, err);
        return rc;
    }
    return di_recompute_runner_new(e->model, e->be, o->max_context, BLOCK_TOKENS, (int32_t)n_blocks, &e->rr,
                                   &e->runner, err);
}

int di_engine_open(const char *dir, const di_engine_options *opt, di_engine **out, di_error *err) {
    *out = NULL;
    if (!dir) return di_error_set(err, DI_ERR_INVALID, "engine: no checkpoint directory given");
    di_engine *e = calloc(1, sizeof *e);
    if (!e) return di_error_set(err, DI_ERR_NOMEM, "engine: out of memory");
    di_engine_options_default(&e->opt);
    if (opt) e->opt = *opt;
    di_engine_options *o = &e->opt;
    di_idmap_init(&e->reqs);
    e->t_open = di_now();
    int rc = DI_OK;
    if (o->device && strcmp(o->device, "cpu") && strcmp(o->device, "cuda"))
        rc = di_error_set(err, DI_ERR_INVALID, "engine: device \"%s\", expected \"cpu\" or \"cuda\"", o->device);
    if (!rc && o->runner && strcmp(o->runner, "cached") && strcmp(o->runner, "recompute"))
        rc = di_error_set(err, DI_ERR_INVALID, "engine: runner \"%s\", expected \"cached\" or \"recompute\"",
                          o->runner);
    if (!rc && (o->max_seqs < 1 || o->prefill_chunk < 1 || o->max_step_tokens < o->prefill_chunk))
        rc = di_error_set(err, DI_ERR_INVALID,
                          "engine: max_seqs %d, prefill_chunk %d, max_step_tokens %lld; expected max_seqs >= 1 and "
                          "max_step_tokens >= prefill_chunk >= 1",
                          o->max_seqs, o->prefill_chunk, (long long)o->max_step_tokens);
    if (!rc && o->cache_bytes < 0)
        rc = di_error_set(err, DI_ERR_INVALID, "engine: cache_bytes %lld; expected >= 0", (long long)o->cache_bytes);
    if (!rc && (o->prefix_cache_bytes < 0 || o->prefix_block < 0))
        rc = di_error_set(err, DI_ERR_INVALID, "engine: prefix_cache_bytes %lld, prefix_block %d; expected >= 0",
                          (long long)o->prefix_cache_bytes, o->prefix_block);
    if (!rc) rc = di_model_open(dir, &e->model, err);
    if (!rc) {
        int64_t model_ctx = e->model->cfg.max_position_embeddings;
        if (o->max_context <= 0) o->max_context = model_ctx < 4096 ? model_ctx : 4096;
        if (o->max_context > model_ctx)
            rc = di_error_set(err, DI_ERR_INVALID, "engine: max_context %lld exceeds the model's %lld positions",
                              (long long)o->max_context, (long long)model_ctx);
        e->eos = e->model->cfg.eos_token_id;
    }
    if (!rc) {
        /* the tokenizer is optional: token-id requests work without it */
        char path[4096];
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        FILE *f = fopen(path, "rb");
        if (f) {
            fclose(f);
            rc = di_tok_load(path, &e->tok, err);
            if (!rc && di_tok_vocab_size(e->tok) > e->model->cfg.vocab_size)
                rc = di_error_set(err, DI_ERR_INVALID, "engine: %s has %d tokens, the model's vocabulary only %d", path,
                                  di_tok_vocab_size(e->tok), e->model->cfg.vocab_size);
        }
    }
    if (!rc) rc = open_runner(e, err);
    if (!rc) {
        di_core_options co = {.sched = {.max_seqs = o->max_seqs,
                                        .max_step_tokens = o->max_step_tokens,
                                        .prefill_chunk = o->prefill_chunk},
                              .async = o->async,
                              .sample_threads = o->sample_threads,
                              .eos_ids = &e->eos,
                              .n_eos = 1,
                              .detok = e->tok ? detok_bytes : NULL,
                              .detok_ctx = e->tok};
        rc = di_core_new(&e->runner, &co, &e->core, err);
    }
    if (!rc) {
        e->cap_deltas = 64;
        e->cd = malloc((size_t)e->cap_deltas * sizeof *e->cd);
        if (!e->cd) rc = di_error_set(err, DI_ERR_NOMEM, "engine: out of memory");
    }
    if (rc) {
        di_engine_close(e);
        return rc;
    }
    e->seed_state = o->seed ? o->seed : (uint64_t)time(NULL) ^ ((uint64_t)(uintptr_t)e << 16);
    e->next_id = 1;
    *out = e;
    return DI_OK;
}

void di_engine_close(di_engine *e) {
    if (!e) return;
    di_core_free(e->core); /* releases the matchers of requests still held */
    di_recompute_runner_free(e->rr);
    di_session_runner_free(e->sr);
    if (e->model) di_model_close(e->model); /* device weights live in backend memory: free them first */
    if (e->be) di_backend_destroy(e->be);
    di_grammar_vocab_free(e->gvocab);
    di_tok_free(e->tok);
    for (int64_t i = 0; i < e->reqs.cap; i++) free(e->reqs.vals[i]);
    di_idmap_destroy(&e->reqs);
    free(e->cd);
    free(e);
}

int32_t di_engine_vocab_size(const di_engine *e) { return e->model->cfg.vocab_size; }
int64_t di_engine_max_context(const di_engine *e) { return e->opt.max_context; }
int32_t di_engine_eos_id(const di_engine *e) { return e->eos; }
int di_engine_has_tokenizer(const di_engine *e) { return e->tok != NULL; }

/* ---- grammar ---- */

/* The tokenizer's byte strings as the grammar's vocabulary, built on the first grammar request. */
static int grammar_vocab(di_engine *e, di_error *err) {
    if (e->gvocab) return DI_OK;
    return di_grammar_vocab_from_tokenizer(e->tok, (uint32_t)e->model->cfg.vocab_size, e->eos, &e->gvocab, err);
}

static int k_fill_mask(void *ctx, uint32_t *mask, di_error *err) {
    return di_grammar_matcher_fill_mask(((api_constraint *)ctx)->m, mask, err);
}

static int k_accept(void *ctx, int32_t token, di_error *err) {
    return di_grammar_matcher_accept_token(((api_constraint *)ctx)->m, token, err);
}

static void k_release(void *ctx) {
    api_constraint *k = ctx;
    di_grammar_matcher_free(k->m);
    if (--k->shared->refs == 0) {
        di_grammar_free(k->shared->g);
        free(k->shared);
    }
    free(k);
}

static int compile_grammar(di_engine *e, const di_request_options *o, di_grammar **g, di_error *err) {
    *g = NULL;
    if (!e->tok)
        return di_error_set(err, DI_ERR_UNSUPPORTED, "request: a grammar needs the tokenizer, and the checkpoint has "
                                                     "no tokenizer.json");
    if (!o->grammar)
        return di_error_set(err, DI_ERR_INVALID, "request: grammar kind %d without grammar text", (int)o->grammar_kind);
    int rc = grammar_vocab(e, err);
    if (rc) return rc;
    size_t len = o->grammar_len ? o->grammar_len : strlen(o->grammar);
    switch (o->grammar_kind) {
    case DI_GRAMMAR_REGEX: rc = di_grammar_from_regex(o->grammar, len, g, err); break;
    case DI_GRAMMAR_EBNF: rc = di_grammar_from_ebnf(o->grammar, len, NULL, g, err); break;
    case DI_GRAMMAR_JSON_SCHEMA:
        /* "" = any JSON value, which is the empty schema */
        rc = len ? di_grammar_from_json_schema(o->grammar, len, NULL, g, err)
                 : di_grammar_from_json_schema("{}", 2, NULL, g, err);
        break;
    default:
        return di_error_set(err, DI_ERR_INVALID, "request: grammar kind %d, expected 1 (regex), 2 (JSON schema) or "
                                                 "3 (EBNF)", (int)o->grammar_kind);
    }
    if (rc) di_error_wrap(err, "request grammar");
    return rc;
}

/* ---- requests ---- */

int di_engine_add_tokens(di_engine *e, const int32_t *prompt, int64_t n_prompt, const di_request_options *o,
                         int64_t *id, di_error *err) {
    *id = 0;
    di_request_options def;
    if (!o) {
        di_request_options_default(&def);
        o = &def;
    }
    if (!prompt || n_prompt < 1) return di_error_set(err, DI_ERR_INVALID, "request: empty prompt");
    if (o->n < 1 || o->n > MAX_CHOICES)
        return di_error_set(err, DI_ERR_INVALID, "request: n = %d, expected 1..%d", o->n, MAX_CHOICES);
    if (o->max_tokens < 0) return di_error_set(err, DI_ERR_INVALID, "request: max_tokens %lld < 0", (long long)o->max_tokens);
    if (n_prompt >= e->opt.max_context)
        return di_error_set(err, DI_ERR_LIMIT, "request: prompt of %lld tokens leaves no room in the %lld-position context",
                            (long long)n_prompt, (long long)e->opt.max_context);
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= e->model->cfg.vocab_size)
            return di_error_set(err, DI_ERR_INVALID, "request: prompt token %lld is id %d, expected 0..%d", (long long)i,
                                prompt[i], e->model->cfg.vocab_size - 1);
    if (o->n_stop > 0 && !e->tok)
        return di_error_set(err, DI_ERR_UNSUPPORTED, "request: stop strings need the tokenizer, and the checkpoint "
                                                     "has no tokenizer.json");
    di_grammar *g = NULL;
    int rc = o->grammar_kind != DI_GRAMMAR_NONE ? compile_grammar(e, o, &g, err) : DI_OK;
    if (rc) return rc;
    api_grammar *shared = NULL;
    if (g) {
        shared = calloc(1, sizeof *shared);
        if (!shared) {
            di_grammar_free(g);
            return di_error_set(err, DI_ERR_NOMEM, "request: out of memory");
        }
        shared->g = g;
        shared->refs = 1; /* held by this function until the choices are added */
    }
    api_request *r = calloc(1, sizeof *r);
    const int64_t uid = e->next_id;
    if (!r || di_idmap_put(&e->reqs, uid, r)) {
        free(r);
        r = NULL;
        rc = di_error_set(err, DI_ERR_NOMEM, "request: out of memory");
    }
    di_seq_params sp = {.sampling = o->sampling,
                        .max_tokens = o->max_tokens ? o->max_tokens : e->opt.max_context - n_prompt,
                        .stop_ids = o->stop_token_ids,
                        .n_stop_ids = o->n_stop_token_ids,
                        .stop = o->stop,
                        .n_stop = o->n_stop,
                        .ignore_eos = o->ignore_eos,
                        .prefill_chunk = o->prefill_chunk};
    if (!o->has_seed) sp.sampling.seed = next_seed(e);
    int32_t added = 0;
    for (int32_t c = 0; !rc && c < o->n; c++) {
        api_constraint *k = NULL;
        if (shared) {
            k = calloc(1, sizeof *k);
            di_grammar_matcher_opts mo = {.thinking = o->thinking != 0,
                                          .stop = o->stop,
                                          .n_stop = o->n_stop > 0 ? (size_t)o->n_stop : 0};
            rc = k ? di_grammar_matcher_new(shared->g, e->gvocab, &mo, &k->m, err)
                   : di_error_set(err, DI_ERR_NOMEM, "request: out of memory");
            if (rc) {
                free(k);
                break;
            }
            k->shared = shared;
            k->hook = (di_constraint){.ctx = k, .fill_mask = k_fill_mask, .accept = k_accept, .release = k_release};
            shared->refs++;
        }
        sp.choice = (uint32_t)c;
        sp.constraint = k ? &k->hook : NULL;
        rc = di_core_add(e->core, uid * MAX_CHOICES + c, prompt, n_prompt, &sp, err);
        if (rc && k) k_release(k); /* a rejected add leaves the constraint with us */
        if (!rc) added++;
    }
    if (rc && added) {
        /* every choice is checked the same way, so only choice 0's rejection is expected; undo the
         * choices that got in if a later one failed (out of memory) */
        for (int32_t c = 0; c < added; c++) di_core_cancel(e->core, uid * MAX_CHOICES + c, NULL);
    }
    if (shared && --shared->refs == 0) {
        di_grammar_free(shared->g);
        free(shared);
    }
    if (rc) {
        if (r && !added) {
            di_idmap_del(&e->reqs, uid);
            free(r);
        } else if (r) {
            r->id = uid, r->n_choices = r->n_live = added, r->n_prompt = n_prompt; /* cancelled; polled as such */
            e->next_id++;
        }
        return rc;
    }
    r->id = uid;
    r->n_choices = r->n_live = o->n;
    r->n_prompt = n_prompt;
    e->next_id++;
    e->prompt_tokens += n_prompt;
    *id = uid;
    return DI_OK;
}

int di_engine_add_text(di_engine *e, const char *prompt, size_t len, const di_request_options *o, int64_t *id,
                       di_error *err) {
    *id = 0;
    if (!e->tok)
        return di_error_set(err, DI_ERR_UNSUPPORTED, "request: a text prompt needs the tokenizer, and the checkpoint "
                                                     "has no tokenizer.json");
    int32_t *ids = NULL;
    size_t n = 0;
    /* special tokens in the text are recognised (a raw prompt may carry template markers); the
     * sequence starts with BOS as the V4.1 tokenizer's encode does */
    int rc = di_tok_encode(e->tok, prompt, len, 1, &ids, &n, err);
    if (rc) return rc;
    const int32_t bos = e->model->cfg.bos_token_id;
    int32_t *full = malloc((n + 1) * sizeof *full);
    if (!full) {
        free(ids);
        return di_error_set(err, DI_ERR_NOMEM, "request: out of memory");
    }
    size_t k = 0;
    if (n == 0 || ids[0] != bos) full[k++] = bos;
    if (n) memcpy(full + k, ids, n * sizeof *ids);
    rc = di_engine_add_tokens(e, full, (int64_t)(k + n), o, id, err);
    free(ids);
    free(full);
    return rc;
}

int di_engine_cancel(di_engine *e, int64_t id, di_error *err) {
    api_request *r = di_idmap_get(&e->reqs, id);
    if (!r) return di_error_set(err, DI_ERR_INVALID, "request %lld: unknown or already finished", (long long)id);
    int cancelled = 0;
    for (int32_t c = 0; c < r->n_choices; c++)
        if (!di_core_cancel(e->core, id * MAX_CHOICES + c, NULL)) cancelled++;
    if (!cancelled) return di_error_set(err, DI_ERR_INVALID, "request %lld: already finished", (long long)id);
    return DI_OK;
}

int di_engine_step(di_engine *e, di_error *err) { return di_core_step(e->core, err); }

int di_engine_busy(const di_engine *e) { return di_core_busy(e->core) || e->reqs.n > 0; }

int32_t di_engine_poll(di_engine *e, di_delta *out, int32_t max) {
    if (max <= 0) return 0;
    if (max > e->cap_deltas) {
        di_core_delta *cd = realloc(e->cd, (size_t)max * sizeof *cd);
        if (!cd) max = e->cap_deltas; /* fewer deltas per poll; the rest come next time */
        else e->cd = cd, e->cap_deltas = max;
    }
    int32_t n = di_core_poll(e->core, e->cd, max);
    for (int32_t i = 0; i < n; i++) {
        const di_core_delta *c = &e->cd[i];
        const int64_t uid = c->id / MAX_CHOICES;
        const int32_t choice = (int32_t)(c->id % MAX_CHOICES);
        api_request *r = di_idmap_get(&e->reqs, uid);
        di_delta *d = &out[i];
        *d = (di_delta){.id = uid,
                        .choice = choice,
                        .tokens = c->tokens,
                        .logprobs = c->logprobs,
                        .n_tokens = c->n_tokens,
                        .text = c->text,
                        .n_text = c->n_text,
                        .finish = c->finish,
                        .error = c->error};
        if (!r) continue; /* cannot happen: records live until their last choice is reported */
        r->completion[choice] += c->n_tokens;
        d->prompt_tokens = r->n_prompt;
        d->completion_tokens = r->completion[choice];
        d->cache_hit_tokens = c->cache_hit_tokens;
        if (c->finish != DI_FINISH_REASON_NONE && --r->n_live == 0) {
            di_idmap_del(&e->reqs, uid);
            free(r);
        }
    }
    return n;
}

void di_engine_get_stats(const di_engine *e, di_engine_stats *out) {
    const di_core_stats *s = di_core_get_stats(e->core);
    *out = (di_engine_stats){.steps = s->steps,
                             .prompt_tokens = e->prompt_tokens,
                             .generated_tokens = s->sampled,
                             .preemptions = s->preemptions,
                             .wall_s = di_now() - e->t_open,
                             .forward_s = s->forward_s,
                             .sample_s = s->sample_s};
}

const struct di_tokenizer *di_engine_tokenizer(const di_engine *e) { return e->tok; }

size_t di_abi_struct_size(const char *name) {
    static const struct {
        const char *name;
        size_t size;
    } k[] = {{"di_engine_options", sizeof(di_engine_options)},   {"di_request_options", sizeof(di_request_options)},
             {"di_delta", sizeof(di_delta)},                     {"di_sampling_params", sizeof(di_sampling_params)},
             {"di_token_logprobs", sizeof(di_token_logprobs)},   {"di_token_bias", sizeof(di_token_bias)},
             {"di_error", sizeof(di_error)}};
    for (size_t i = 0; name && i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(k[i].name, name)) return k[i].size;
    return 0;
}
