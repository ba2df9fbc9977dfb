/* deepinfer generate — prompt prefill then token-by-token decode on one sequence (model/session.h).
 *
 *   deepinfer generate --model DIR (--prompt-ids 1,2,3 | --prompt TEXT) [--max-tokens N]
 *                      [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S]
 *                      [--force-output-ids 4,5,6] [--dspark]
 *                      [--chunk N] [--threads N] [--device cpu|cuda] [--dump-logits FILE]
 *                      [--tokenizer PATH] [--json]
 *                      [--json-schema FILE [--json-whitespace flexible|compact] | --regex R | --grammar FILE]
 *
 * --prompt TEXT is encoded with the model's tokenizer (tokenizer.json in DIR, or --tokenizer PATH;
 * added-token literals such as "<｜User｜>" become their ids) and the output is decoded back to text
 * (printed, and "output_text" in --json) whenever a tokenizer is loaded.
 * output_ids[0] comes from the last prompt position; decode step i feeds output_ids[i] at position
 * T+i and yields output_ids[i+1], so N output tokens take N−1 decode steps. --force-output-ids feeds
 * the given ids instead of the sampled ones (teacher-forced decode; the golden decode logits were
 * measured this way). Tokens are chosen by the engine's sampler (engine/sampler.h): --temperature 0
 * (the default) is greedy (first maximum); T > 0 samples with top-k / top-p / min-p, one Philox draw
 * keyed by (--seed, position), so a seed reproduces its tokens; DSpark drafts draw with choice =
 * 1 + draft slot. --chunk N prefills the prompt in chunks of N tokens
 * (0 = one chunk); --threads defaults to the online CPUs. With --dspark every decode step also drafts dspark_block_size tokens.
 * --dump-logits FILE writes prompt_logits [T, V], decode_logits [N−1, V] and, with --dspark,
 * dspark_draft_ids [N−1, block+1], dspark_confidence [N−1, block], dspark_draft_logits
 * [N−1, block, V] (the golden layout). Prefill and decode tokens/s go to stderr; with --dspark also
 * the mean number of leading drafts per step that the output then actually continued with
 * ("dspark_mean_accepted": what lossless verification would accept).
 *
 * Structured output: --json-schema FILE (a JSON Schema), --regex R (the whole output must match) or
 * --grammar FILE (GBNF, start rule "root") compiles one grammar (src/grammar/grammar.h) over the
 * tokenizer's byte strings; every token, output_ids[0] included, is sampled under the matcher's
 * allowed-token mask, so the output is valid whatever the weights. EOS (config eos_token_id) is
 * allowed exactly when the text so far is a complete sentence of the grammar; sampling it ends the
 * generation (finish_reason "stop", the EOS id is the last output id and not part of the text).
 * Reaching --max-tokens first ends it with finish_reason "length": the text is then a valid prefix
 * of some sentence, complete only if "grammar_complete" says so. --json-whitespace compact allows no
 * whitespace in the JSON (default flexible: bounded runs around structural tokens). Needs a
 * tokenizer; the grammar is compiled before the model loads, so a malformed one fails fast. Not
 * combinable with --force-output-ids (the ids would bypass the mask) or --dspark (drafts are not
 * masked). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli.h"
#include "engine/grammar_vocab.h"
#include "engine/sampler.h"
#include "grammar/grammar.h"
#include "io/safetensors.h"
#include "model/memplan.h"
#include "model/session.h"
#include "text/tokenizer.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* "1,2,3" → ids (malloc'd); false on a malformed list. */
static bool parse_ids(const char *s, int32_t **out, int64_t *n) {
    int64_t cap = 16, k = 0;
    int32_t *v = malloc(sizeof(int32_t) * (size_t)cap);
    if (!v) return false;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            free(v);
            return false;
        }
        if (k == cap) {
            int32_t *nv = realloc(v, sizeof(int32_t) * (size_t)(cap *= 2));
            if (!nv) {
                free(v);
                return false;
            }
            v = nv;
        }
        v[k++] = (int32_t)x;
        p = *end ? end + 1 : end;
    }
    if (k == 0) {
        free(v);
        return false;
    }
    *out = v, *n = k;
    return true;
}

/* ---------------- sampling ---------------- */

/* The engine's sampler for one sequence. Main tokens draw with choice 0 at their position; DSpark
 * draft slot j (a di_sample_fn callback) with choice 1 + j at the position it predicts. */
typedef struct gen_sampler {
    di_sampler *s;
    di_sampling_params p;
    const int32_t *prompt, *out; /* for penalties (none enabled by this command) */
    int64_t n_prompt, n_out;
    int64_t draft_pos;           /* position drafted by the next callback */
    uint32_t draft_slot;
    int failed;                  /* a draw failed (message in err) */
    di_error err;
} gen_sampler;

/* mask: allowed-token bitmask (NULL = every token). */
static int32_t sample_at(gen_sampler *g, const float *logits, const uint32_t *mask, int64_t pos, uint32_t choice) {
    di_sample_row row = {.logits = logits, .params = &g->p, .prompt = g->prompt, .n_prompt = g->n_prompt,
                         .output = g->out, .n_output = g->n_out, .mask = mask, .position = pos, .choice = choice};
    di_sample_result r;
    if (di_sampler_sample(g->s, &row, &r, &g->err)) {
        g->failed = 1;
        return 0;
    }
    return r.token;
}

static int32_t sample_draft(void *ctx, const float *logits, int64_t V) {
    gen_sampler *g = ctx;
    return sample_at(g, logits, NULL, g->draft_pos++, 1 + g->draft_slot++);
}

/* ---------------- structured output ---------------- */

/* The grammar of one generation and its matcher: the parse state after the tokens drawn so far. */
typedef struct gen_grammar {
    const char *option;     /* "json-schema" | "regex" | "grammar": the option that gave it */
    di_grammar *g;
    di_grammar_vocab *v;
    di_grammar_matcher *m;  /* NULL = unconstrained generation */
    uint32_t *mask;         /* u32 [ceil(V/32)] tokens allowed for the next draw */
    double mask_s;          /* time spent filling masks */
    int64_t n_masks;
} gen_grammar;

static void gen_grammar_free(gen_grammar *gg) {
    di_grammar_matcher_free(gg->m);
    di_grammar_vocab_free(gg->v);
    di_grammar_free(gg->g);
    free(gg->mask);
}

/* Whole file as a malloc'd, NUL-terminated buffer of *len bytes. */
static int read_text(const char *path, char **out, size_t *len, di_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return di_error_set(err, DI_ERR_IO, "cannot open: %s", strerror(errno));
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    for (size_t got; b && (got = fread(b + n, 1, cap - 1 - n, f)) > 0;) {
        n += got;
        if (n + 1 == cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) free(b);
            b = nb;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!b) return di_error_set(err, DI_ERR_NOMEM, "out of memory after %zu bytes", n);
    if (bad) {
        free(b);
        return di_error_set(err, DI_ERR_IO, "read error");
    }
    b[n] = 0;
    *out = b, *len = n;
    return DI_OK;
}

/* Compile whichever one of the three options is set; the message names the option and its value. */
static int grammar_compile(gen_grammar *gg, const char *schema_path, const di_json_schema_opts *jo, const char *regex,
                           const char *ebnf_path, di_error *err) {
    if (regex) {
        gg->option = "regex";
        int rc = di_grammar_from_regex(regex, strlen(regex), &gg->g, err);
        if (rc) di_error_wrap(err, "--regex \"%s\"", regex);
        return rc;
    }
    const char *path = schema_path ? schema_path : ebnf_path;
    gg->option = schema_path ? "json-schema" : "grammar";
    char *src = NULL;
    size_t len = 0;
    int rc = read_text(path, &src, &len, err);
    if (!rc)
        rc = schema_path ? di_grammar_from_json_schema(src, len, jo, &gg->g, err)
                         : di_grammar_from_ebnf(src, len, NULL, &gg->g, err);
    if (rc) di_error_wrap(err, "--%s %s", gg->option, path);
    free(src);
    return rc;
}

/* The matcher over the tokenizer's byte strings (the same vocabulary the engine API uses). */
static int grammar_start(gen_grammar *gg, const di_tokenizer *tok, uint32_t V, int32_t eos, di_error *err) {
    gg->mask = calloc(di_grammar_mask_words(V), sizeof *gg->mask); /* u32 [ceil(V/32)] */
    int rc = gg->mask ? DI_OK : di_error_set(err, DI_ERR_NOMEM, "out of memory for the grammar mask (%u tokens)", V);
    if (!rc) rc = di_grammar_vocab_from_tokenizer(tok, V, eos, &gg->v, err);
    if (!rc) rc = di_grammar_matcher_new(gg->g, gg->v, NULL, &gg->m, err);
    if (rc) di_error_wrap(err, "--%s", gg->option);
    return rc;
}

/* A main-sequence token: under a grammar, drawn under the current state's mask and then accepted by
 * the matcher (an EOS draw finishes it). */
static int32_t sample_main(gen_sampler *g, gen_grammar *gg, const float *logits, int64_t pos) {
    if (!gg->m) return sample_at(g, logits, NULL, pos, 0);
    double t0 = now_s();
    if (di_grammar_matcher_fill_mask(gg->m, gg->mask, &g->err)) {
        g->failed = 1;
        return 0;
    }
    gg->mask_s += now_s() - t0, gg->n_masks++;
    int32_t t = sample_at(g, logits, gg->mask, pos, 0);
    if (!g->failed && di_grammar_matcher_accept_token(gg->m, t, &g->err)) g->failed = 1;
    return t;
}

/* ---------------- logits dump ---------------- */

static int write_dump(const char *path, int64_t T, int64_t V, const float *prompt_logits, int64_t steps,
                      const float *decode_logits, bool dspark, int B, const int32_t *d_ids, const float *d_conf,
                      const float *d_logits, di_error *err) {
    di_tensor_spec sp[5] = {
        {.name = "prompt_logits", .dtype = DI_F32, .ndim = 2, .shape = {T, V}},
        {.name = "decode_logits", .dtype = DI_F32, .ndim = 2, .shape = {steps, V}},
        {.name = "dspark_draft_ids", .dtype = DI_I32, .ndim = 2, .shape = {steps, B + 1}},
        {.name = "dspark_confidence", .dtype = DI_F32, .ndim = 2, .shape = {steps, B}},
        {.name = "dspark_draft_logits", .dtype = DI_F32, .ndim = 3, .shape = {steps, B, V}},
    };
    const void *data[5] = {prompt_logits, decode_logits, d_ids, d_conf, d_logits};
    return di_st_write_file(path, sp, data, dspark ? 5 : 2, err);
}

static json_t *ids_json(const int32_t *v, int64_t n) {
    json_t *a = json_array();
    for (int64_t i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

int cmd_generate(int argc, char **argv) {
    di_args a;
    cli_args_init(&a, argc, argv);
    di_cli cli = {.cmd = "generate", .json = cli_flag(&a, "json")};
    int rc = 1;
    di_error err = {0};
    di_model *m = NULL;
    di_backend *be = NULL;
    di_session *s = NULL;
    di_tokenizer *tok = NULL;
    char *out_text = NULL;
    /* T prompt ids, N output ids (N − 1 decode steps), V vocabulary, B DSpark block */
    int32_t *prompt = NULL;        /* int32 [T] */
    int32_t *force = NULL;         /* int32 [n_force] --force-output-ids */
    int32_t *out_ids = NULL;       /* int32 [N] */
    int32_t *d_ids = NULL;         /* int32 [N−1, B+1] drafts per decode step (--dump-logits) */
    float *prompt_logits = NULL;   /* f32 [T, V] (--dump-logits) */
    float *decode_logits = NULL;   /* f32 [N−1, V] (--dump-logits) */
    float *logits = NULL;          /* f32 [V] the newest step's row */
    float *d_conf = NULL;          /* f32 [N−1, B] */
    float *d_logits = NULL;        /* f32 [N−1, B, V] */
    gen_sampler smp = {0};
    gen_grammar gg = {0};
    int64_t T = 0, n_force = 0;
    long long max_tokens, seed, threads, chunk;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    double temperature, top_p, min_p;
    long long top_k;
    const char *device = NULL;

    const char *model = cli_str(&a, "model", NULL);
    const char *ids_s = cli_str(&a, "prompt-ids", NULL);
    const char *text = cli_str(&a, "prompt", NULL);
    const char *force_s = cli_str(&a, "force-output-ids", NULL);
    const char *dump = cli_str(&a, "dump-logits", NULL);
    const char *tok_path = cli_str(&a, "tokenizer", NULL);
    const char *schema_path = cli_str(&a, "json-schema", NULL);
    const char *regex = cli_str(&a, "regex", NULL);
    const char *ebnf_path = cli_str(&a, "grammar", NULL);
    const char *json_ws = cli_str(&a, "json-whitespace", NULL);
    bool dspark = cli_flag(&a, "dspark");
    if (!cli_int(&cli, &a, "max-tokens", 16, 1, 1 << 24, &max_tokens) ||
        !cli_double(&cli, &a, "temperature", 0.0, &temperature) || !cli_int(&cli, &a, "top-k", 0, 0, 1 << 30, &top_k) ||
        !cli_double(&cli, &a, "top-p", 1.0, &top_p) || !cli_double(&cli, &a, "min-p", 0.0, &min_p) ||
        !cli_int(&cli, &a, "seed", 0, 0, INT64_MAX, &seed) || !cli_int(&cli, &a, "threads", ncpu > 0 ? ncpu : 1, 1, 1024, &threads) ||
        !cli_int(&cli, &a, "chunk", 0, 0, 1 << 30, &chunk) || !cli_device(&cli, &a, &device) ||
        !cli_check_unused(&cli, &a))
        goto done;
    if (!model) {
        cli_fail(&cli, "need --model DIR");
        goto done;
    }
    if (!!ids_s + !!text != 1) {
        cli_fail(&cli, "need exactly one of --prompt-ids 1,2,3 and --prompt TEXT");
        goto done;
    }
    if (!(temperature >= 0) || !isfinite(temperature)) {
        cli_fail(&cli, "--temperature %g: expected a finite value ≥ 0", temperature);
        goto done;
    }
    bool constrained = schema_path || regex || ebnf_path;
    if (!!schema_path + !!regex + !!ebnf_path > 1) {
        cli_fail(&cli, "--json-schema, --regex and --grammar are mutually exclusive (got more than one)");
        goto done;
    }
    if (constrained && (force_s || dspark)) {
        cli_fail(&cli, "--%s cannot be combined with %s", schema_path ? "json-schema" : regex ? "regex" : "grammar",
                 force_s ? "--force-output-ids (forced ids bypass the mask)" : "--dspark (drafts are not masked)");
        goto done;
    }
    di_json_schema_opts jo = {.whitespace = DI_JSON_WS_FLEXIBLE};
    if (json_ws && (!schema_path || (strcmp(json_ws, "flexible") && strcmp(json_ws, "compact")))) {
        cli_fail(&cli, "--json-whitespace \"%s\": expected flexible or compact, with --json-schema", json_ws);
        goto done;
    }
    if (json_ws && !strcmp(json_ws, "compact")) jo.whitespace = DI_JSON_WS_COMPACT;
    if (constrained && grammar_compile(&gg, schema_path, &jo, regex, ebnf_path, &err)) {
        cli_fail_err(&cli, &err);
        goto done;
    }
    if ((text || tok_path || constrained) && di_tok_load(tok_path ? tok_path : model, &tok, &err)) {
        cli_fail(&cli, "%s%s", err.msg, tok_path ? "" : " (the model has no tokenizer: pass --tokenizer PATH or --prompt-ids)");
        goto done;
    }
    if (text) {
        size_t n_ids = 0;
        if (di_tok_encode(tok, text, strlen(text), 1, &prompt, &n_ids, &err)) {
            cli_fail_err(&cli, &err);
            goto done;
        }
        T = (int64_t)n_ids;
        if (T == 0) {
            cli_fail(&cli, "--prompt: the text encodes to no tokens");
            goto done;
        }
    } else if (!parse_ids(ids_s, &prompt, &T)) {
        cli_fail(&cli, "--prompt-ids \"%s\": expected comma-separated non-negative token ids", ids_s);
        goto done;
    }
    if (force_s && !parse_ids(force_s, &force, &n_force)) {
        cli_fail(&cli, "--force-output-ids \"%s\": expected comma-separated non-negative token ids", force_s);
        goto done;
    }
    /* the memory plan, before any weight is read: a model that cannot fit is refused here */
    if (di_memplan_preflight(model, strcmp(device, "cuda") ? DI_PLAN_CPU : DI_PLAN_CUDA, 1, T + max_tokens,
                             stderr, &err) ||
        di_model_open(model, &m, &err) || di_backend_create(device, (int)threads, &be, &err) ||
        di_model_to_backend(m, be, &err)) {
        cli_fail_err(&cli, &err);
        goto done;
    }
    const di_config *cfg = &m->cfg;
    int64_t V = cfg->vocab_size, N = max_tokens, steps = N - 1;
    int B = cfg->dspark_block_size;
    for (int64_t i = 0; i < T; i++)
        if (prompt[i] >= V) {
            cli_fail(&cli, "--prompt-ids: token %d at position %lld outside the vocabulary (%lld)", prompt[i], (long long)i,
                     (long long)V);
            goto done;
        }
    for (int64_t i = 0; i < n_force; i++)
        if (force[i] >= V) {
            cli_fail(&cli, "--force-output-ids: id %d outside the vocabulary (%lld)", force[i], (long long)V);
            goto done;
        }
    if (dspark && cfg->n_dspark <= 0) {
        cli_fail(&cli, "--dspark: %s has no DSpark draft stages", model);
        goto done;
    }
    di_session_opts so = {.max_tokens = T + N, .spec_margin = -1, .dspark = dspark};
    if (di_session_create(m, be, &so, &s, &err)) {
        cli_fail_err(&cli, &err);
        goto done;
    }
    out_ids = calloc((size_t)N, sizeof(int32_t));
    logits = malloc(sizeof(float) * (size_t)V);
    if (dump) {
        prompt_logits = malloc(sizeof(float) * (size_t)(T * V));
        decode_logits = malloc(sizeof(float) * (size_t)((steps > 0 ? steps : 1) * V));
        if (dspark) d_logits = calloc((size_t)((steps > 0 ? steps : 1) * B * V), sizeof(float));
    }
    if (dspark) {
        d_ids = calloc((size_t)((steps > 0 ? steps : 1) * (B + 1)), sizeof(int32_t));
        d_conf = calloc((size_t)((steps > 0 ? steps : 1) * B), sizeof(float));
    }
    if (constrained && grammar_start(&gg, tok, (uint32_t)V, cfg->eos_token_id, &err)) {
        cli_fail_err(&cli, &err);
        goto done;
    }
    if (!out_ids || !logits || (dump && (!prompt_logits || !decode_logits)) || (dspark && (!d_ids || !d_conf)) ||
        (dump && dspark && !d_logits)) {
        cli_fail(&cli, "out of memory (vocabulary %lld, %lld tokens)", (long long)V, (long long)N);
        goto done;
    }
    smp.p = di_sampling_params_default();
    smp.p.temperature = (float)temperature, smp.p.top_k = (int32_t)top_k, smp.p.top_p = (float)top_p;
    smp.p.min_p = (float)min_p, smp.p.seed = (uint64_t)seed;
    smp.prompt = prompt, smp.n_prompt = T, smp.out = out_ids;
    if (di_sampling_params_check(&smp.p, (int32_t)V, &err) || di_sampler_new((int32_t)V, &smp.s, &err)) {
        cli_fail_err(&cli, &err);
        goto done;
    }

    /* prefill: one chunk, or chunks of --chunk tokens (each told the prompt's end, so the chunking
     * changes no bit); all positions' logits only when dumping */
    double t0 = now_s();
    int64_t cs = chunk > 0 ? chunk : T;
    const di_fwd_opts po = {.prompt_end = T};
    for (int64_t p = 0; p < T; p += cs) {
        int64_t n = T - p < cs ? T - p : cs;
        float *dst = dump ? prompt_logits + p * V : logits;
        if (di_session_forward(s, prompt + p, n, dump != NULL, dst, &po, &err)) {
            cli_fail_err(&cli, &err);
            goto done;
        }
    }
    double t_prefill = now_s() - t0;
    const float *last = dump ? prompt_logits + (T - 1) * V : logits;
    out_ids[0] = n_force > 0 ? force[0] : sample_main(&smp, &gg, last, T);
    smp.n_out = 1;
    if (smp.failed) {
        cli_fail_err(&cli, &smp.err);
        goto done;
    }
    /* n_out ≤ N: a grammar's EOS ends the output early */
    int64_t n_out = 1;
    bool finished = gg.m && di_grammar_matcher_finished(gg.m);

    /* decode: step i feeds out_ids[i] at position T+i */
    t0 = now_s();
    for (int64_t i = 0; i < steps && !finished; i++) {
        float *dst = dump ? decode_logits + i * V : logits;
        if (di_session_forward(s, &out_ids[i], 1, false, dst, NULL, &err)) {
            cli_fail_err(&cli, &err);
            goto done;
        }
        int32_t next = i + 1 < n_force ? force[i + 1] : sample_main(&smp, &gg, dst, T + i + 1);
        if (dspark) {
            int32_t *di = d_ids + i * (B + 1);
            float *dc = d_conf + i * B;
            /* draft slot 0 is the token this step produced (the forced one when teacher-forced) */
            smp.draft_pos = T + i + 2, smp.draft_slot = 0;
            if (di_session_draft(s, next, temperature > 0 ? sample_draft : NULL, &smp, di, dc,
                                 d_logits ? d_logits + i * B * V : NULL, NULL, &err)) {
                cli_fail_err(&cli, &err);
                goto done;
            }
        }
        if (smp.failed) {
            cli_fail_err(&cli, &smp.err);
            goto done;
        }
        out_ids[i + 1] = next;
        smp.n_out = n_out = i + 2;
        finished = gg.m && di_grammar_matcher_finished(gg.m);
    }
    double t_decode = now_s() - t0;
    steps = n_out - 1;
    fprintf(stderr, "prefill: %lld tokens in %.3f s (%.1f tok/s); decode: %lld steps in %.3f s (%.1f tok/s)\n",
            (long long)T, t_prefill, T / (t_prefill > 0 ? t_prefill : 1e-9), (long long)steps, t_decode,
            steps / (t_decode > 0 ? t_decode : 1e-9));
    /* DSpark: drafts of step i that the sequence then actually continued with (a prefix of
     * out_ids[i+2 …]) — what a lossless verification would have accepted */
    int64_t accepted = 0, checked = 0;
    for (int64_t i = 0; dspark && i < steps; i++) {
        if (i + 2 >= n_out) break;
        checked++;
        for (int64_t j = 1; j <= B && i + 1 + j < n_out && d_ids[i * (B + 1) + j] == out_ids[i + 1 + j]; j++) accepted++;
    }
    double mean_acc = checked ? (double)accepted / (double)checked : 0.0;
    if (dspark) fprintf(stderr, "dspark: %.2f of %d drafts per step continue the output (%lld steps)\n", mean_acc, B, (long long)checked);
    /* the grammar's EOS closes the output; it is not text */
    int64_t n_text = finished && out_ids[n_out - 1] == cfg->eos_token_id ? n_out - 1 : n_out;
    bool complete = gg.m && di_grammar_matcher_can_end(gg.m);
    const char *finish = finished ? "stop" : "length";
    if (gg.m)
        fprintf(stderr, "grammar (--%s): %s, finish_reason %s; %lld masks, mean %.1f us\n", gg.option,
                complete || finished ? "complete" : "valid prefix, not complete", finish, (long long)gg.n_masks,
                1e6 * gg.mask_s / (double)(gg.n_masks ? gg.n_masks : 1));
    size_t out_len = 0;
    if (tok && di_tok_decode(tok, out_ids, (size_t)n_text, &out_text, &out_len, &err)) /* ids the model has and the tokenizer lacks */
        fprintf(stderr, "deepinfer generate: warning: no output text: %s\n", err.msg);
    if (dump && write_dump(dump, T, V, prompt_logits, steps, decode_logits, dspark, B, d_ids, d_conf, d_logits, &err)) {
        cli_fail_err(&cli, &err);
        goto done;
    }
    if (cli.json) {
        json_t *doc = json_object();
        json_object_set_new(doc, "prompt_ids", ids_json(prompt, T));
        json_object_set_new(doc, "output_ids", ids_json(out_ids, n_out));
        if (gg.m) {
            json_object_set_new(doc, "grammar", json_string(gg.option));
            json_object_set_new(doc, "grammar_complete", json_boolean(complete || finished));
            json_object_set_new(doc, "finish_reason", json_string(finish));
            json_object_set_new(doc, "grammar_mask_us_mean", json_real(1e6 * gg.mask_s / (double)(gg.n_masks ? gg.n_masks : 1)));
        }
        json_object_set_new(doc, "temperature", json_real(temperature));
        json_object_set_new(doc, "dspark", json_boolean(dspark));
        if (dspark) json_object_set_new(doc, "dspark_mean_accepted", json_real(mean_acc));
        json_object_set_new(doc, "prefill_tokens_per_s", json_real(T / (t_prefill > 0 ? t_prefill : 1e-9)));
        json_object_set_new(doc, "decode_tokens_per_s", json_real(steps / (t_decode > 0 ? t_decode : 1e-9)));
        if (dump) json_object_set_new(doc, "dump_logits", json_string(dump));
        if (out_text) json_object_set_new(doc, "output_text", json_stringn(out_text, out_len));
        cli_emit(&cli, doc);
    } else {
        for (int64_t i = 0; i < n_out; i++) printf("%s%d", i ? "," : "", out_ids[i]);
        printf("\n");
        if (out_text) printf("%s\n", out_text);
    }
    rc = 0;
done:
    di_session_destroy(s);
    di_tok_free(tok);
    free(out_text);
    di_model_close(m); /* device weights first: they live in the backend's memory */
    di_backend_destroy(be);
    cli_args_free(&a);
    free(prompt), free(force), free(out_ids), free(d_ids);
    free(prompt_logits), free(decode_logits), free(logits), free(d_conf), free(d_logits);
    di_sampler_free(smp.s);
    gen_grammar_free(&gg);
    return rc;
}
