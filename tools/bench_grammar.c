/* deepinfer bench grammar — compile time and per-token mask time of structured-output grammars on the
 * real vocabulary.
 *
 * Each input in the bench directory is a grammar file plus NAME.instance, a valid output. The
 * instance is tokenized (plain BPE, as the model would emit it) and replayed: before each token the
 * full ceil(V/32)-word mask is computed and timed, the instance's next token must be allowed by it,
 * then it is accepted. Inputs: NAME.json (JSON Schema), NAME.regex, NAME.gbnf (EBNF).
 * scripts/bench_grammar_peers.py replays the same instances through llguidance and xgrammar.
 *
 * Two requests are replayed on the same compiled grammar: the first starts cold (mask_*), the
 * second finds the state automaton and masks the first one left in the grammar (warm_*), which is
 * what every later request of a server sees.
 *
 * --verify N: every Nth mask is also compared with brute force over the whole vocabulary.
 * --cpu-time: time with the thread's CPU clock instead of the wall clock, so that preemption on a
 *   shared machine does not land in the numbers (for before/after comparisons of this engine; the
 *   peers script times wall clock, so ratios to it use the default).
 * --peers FILE: the JSON written by `scripts/bench_grammar_peers.py --json` on the same inputs;
 *   each input then also prints its ratios to llguidance and xgrammar (compile, mask p50, p99).
 * --schemas DIR: compliance mode over MaskBench/JSONSchemaBench files (see run_compliance). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "grammar/grammar.h"
#include "text/tokenizer.h"

#define DEFAULT_TOKENIZER "data/tokenizer/deepseek-v41/tokenizer.json"
#define FALLBACK_TOKENIZER "data/tokenizer/deepseek-v4/tokenizer.json"
#define DEFAULT_INPUTS "tests/data/grammar/bench"

static clockid_t mask_clock = CLOCK_MONOTONIC; /* --cpu-time: CLOCK_THREAD_CPUTIME_ID */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(mask_clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    rewind(f);
    char *b = sz >= 0 ? malloc((size_t)sz + 1) : NULL;
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[sz] = 0, *n = (size_t)sz;
    return b;
}

/* Grammar view of the tokenizer: raw bytes per id; every added token (special or not) is a
 * control token that constrained text never contains; EOS is <｜end▁of▁sentence｜>. */
static int vocab_from_tokenizer(const di_tokenizer *tok, di_grammar_vocab **out, di_error *err) {
    uint32_t n = (uint32_t)di_tok_vocab_size(tok);
    const uint8_t **b = calloc(n, sizeof *b);
    uint32_t *l = calloc(n, sizeof *l);
    uint8_t *sp = calloc(n, 1);
    if (!b || !l || !sp) {
        free(b), free(l), free(sp);
        return di_error_set(err, DI_ERR_NOMEM, "bench grammar: out of memory");
    }
    for (uint32_t t = 0; t < n; t++) {
        size_t len = 0;
        b[t] = (const uint8_t *)di_tok_token_bytes(tok, (int32_t)t, &len);
        l[t] = b[t] ? (uint32_t)len : 0;
        sp[t] = (uint8_t)(di_tok_is_added(tok, (int32_t)t) != 0);
    }
    int32_t eos = di_tok_find(tok, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
    int rc = eos < 0 ? di_error_set(err, DI_ERR_INVALID, "bench grammar: tokenizer has no end-of-sentence token")
                     : di_grammar_vocab_new(n, b, l, sp, &eos, 1, out, err);
    free(b), free(l), free(sp);
    return rc;
}

typedef struct result {
    char name[128];
    const char *kind;
    double compile_ms;
    size_t n_tokens;
    double p50_us, p99_us, max_us;      /* first request on the grammar (cold) */
    double warm_p50_us, warm_p99_us;    /* second request (shared state cache filled) */
    size_t allowed_p50; /* allowed tokens at the median step: how much of the vocabulary is open */
    size_t verified;    /* masks compared with brute force over the whole vocabulary (--verify) */
    bool ok;
    char err[256];
} result;

static int compile_file(const char *path, const char *src, size_t n, di_grammar **g, const char **kind, di_error *err) {
    const char *dot = strrchr(path, '.');
    if (!strcmp(dot, ".json")) return *kind = "json-schema", di_grammar_from_json_schema(src, n, NULL, g, err);
    if (!strcmp(dot, ".regex")) return *kind = "regex", di_grammar_from_regex(src, n, g, err);
    return *kind = "ebnf", di_grammar_from_ebnf(src, n, NULL, g, err);
}

/* Brute-force reference for one mask: every token's bytes tried on the matcher (no state change);
 * added tokens are never text, EOS only when complete. Returns the number of disagreeing tokens. */
static size_t verify_mask(di_grammar_matcher *mt, const di_tokenizer *tok, const uint32_t *mask, uint32_t V) {
    size_t bad = 0;
    int32_t eos = di_tok_find(tok, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
    for (uint32_t t = 0; t < V; t++) {
        size_t len = 0;
        const char *b = di_tok_token_bytes(tok, (int32_t)t, &len);
        bool want;
        if ((int32_t)t == eos) want = di_grammar_matcher_can_end(mt);
        else if (!b || !len || di_tok_is_added(tok, (int32_t)t)) want = false;
        else want = di_grammar_matcher_try_bytes(mt, (const uint8_t *)b, len);
        if (want != (bool)((mask[t >> 5] >> (t & 31)) & 1u)) bad++;
    }
    return bad;
}

static bool trace; /* DI_BENCH_TRACE set: print every cold mask's time to stderr */

static void run_one(const char *dir, const char *file, const di_tokenizer *tok, const di_grammar_vocab *v, int repeat,
                    int max_steps, int verify, result *r) {
    char path[1024], inst[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    snprintf(r->name, sizeof r->name, "%.*s", (int)(strrchr(file, '.') - file), file);
    snprintf(inst, sizeof inst, "%s/%s.instance", dir, r->name);
    size_t n = 0, m = 0;
    char *src = slurp(path, &n), *text = slurp(inst, &m);
    di_error err = {0};
    di_grammar *g = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    double *ts = NULL;
    uint32_t *mask = NULL;
    di_grammar_matcher *mt = NULL;
    if (!src || !text) {
        snprintf(r->err, sizeof r->err, "cannot read %.200s or its .instance", path);
        goto done;
    }
    double best[16];
    int reps = repeat < 1 ? 1 : repeat > 16 ? 16 : repeat;
    for (int i = 0; i < reps; i++) {
        double t0 = now_s();
        if (compile_file(path, src, n, &g, &r->kind, &err)) {
            snprintf(r->err, sizeof r->err, "%.200s", err.msg);
            goto done;
        }
        best[i] = now_s() - t0;
        if (i + 1 < reps) di_grammar_free(g), g = NULL;
    }
    qsort(best, (size_t)reps, sizeof *best, cmp_double);
    r->compile_ms = best[reps / 2] * 1e3;
    if (di_tok_encode(tok, text, m, 0, &ids, &n_ids, &err)) {
        snprintf(r->err, sizeof r->err, "%.200s", err.msg);
        goto done;
    }
    uint32_t V = di_grammar_vocab_size(v);
    size_t steps = n_ids < (size_t)max_steps ? n_ids : (size_t)max_steps;
    ts = malloc((steps + 1) * sizeof *ts);
    size_t *allowed = malloc((steps + 1) * sizeof *allowed);
    mask = malloc(di_grammar_mask_words(V) * sizeof *mask);
    if (!ts || !allowed || !mask) {
        free(allowed);
        snprintf(r->err, sizeof r->err, "out of memory");
        goto done;
    }
    /* DI_BENCH_COLD_LOOP=N: replay the cold request N more times first, each on a freshly compiled
     * grammar, untimed (for a profiler: the cold path without the vocabulary build around it) */
    const char *loop_env = getenv("DI_BENCH_COLD_LOOP");
    for (long k = 0, nk = loop_env ? strtol(loop_env, NULL, 10) : 0; k < nk; k++) {
        di_grammar *g2 = NULL;
        const char *kind2 = NULL;
        if (compile_file(path, src, n, &g2, &kind2, &err) || di_grammar_matcher_new(g2, v, NULL, &mt, &err)) {
            di_grammar_free(g2);
            break;
        }
        for (size_t i = 0; i < steps; i++)
            if (di_grammar_matcher_fill_mask(mt, mask, &err) || di_grammar_matcher_accept_token(mt, ids[i], &err)) break;
        di_grammar_matcher_free(mt);
        mt = NULL;
        di_grammar_free(g2);
    }
    for (int pass = 0; pass < 2; pass++) { /* request 1 cold, request 2 warm */
        di_grammar_matcher_free(mt);
        mt = NULL;
        if (di_grammar_matcher_new(g, v, NULL, &mt, &err)) {
            snprintf(r->err, sizeof r->err, "%.200s", err.msg);
            free(allowed);
            goto done;
        }
        for (size_t i = 0; i < steps; i++) {
            di_grammar_walk_stats w0;
            di_grammar_matcher_walk_stats(mt, &w0);
            double t0 = now_s();
            if (di_grammar_matcher_fill_mask(mt, mask, &err)) {
                snprintf(r->err, sizeof r->err, "mask at token %zu: %.200s", i, err.msg);
                free(allowed);
                goto done;
            }
            ts[i] = now_s() - t0;
            size_t cnt = 0;
            for (size_t w = 0; w < di_grammar_mask_words(V); w++) cnt += (size_t)__builtin_popcount(mask[w]);
            allowed[i] = cnt;
            if (verify && i % (size_t)verify == 0) {
                size_t bad = verify_mask(mt, tok, mask, V);
                r->verified++;
                if (bad) {
                    snprintf(r->err, sizeof r->err,
                             "wrong mask (request %d) at token %zu: %zu tokens disagree with brute force", pass + 1, i,
                             bad);
                    free(allowed);
                    goto done;
                }
            }
            int32_t t = ids[i];
            if (trace && pass == 0) {
                size_t tl = 0;
                const char *tb = di_tok_token_bytes(tok, t, &tl);
                di_grammar_walk_stats w1;
                di_grammar_matcher_walk_stats(mt, &w1);
                fprintf(stderr,
                        "# %s step %zu: %.1f us, %zu allowed, then \"%.*s\" (%s%s, %llu edges, %llu pushes (%llu replays), %llu "
                        "summaries, %llu subtrees whole, %llu context edges)\n",
                        r->name, i, ts[i] * 1e6, cnt, (int)tl, tb ? tb : "",
                        w1.cached > w0.cached ? "cached" : w1.block_masks > w0.block_masks ? "block mask" : "trie walk",
                        w1.block_hits > w0.block_hits ? " (cached block)" : w1.walk_hits > w0.walk_hits ? " (cached walk)" : "",
                        (unsigned long long)(w1.edges - w0.edges),
                        (unsigned long long)(w1.pushes - w0.pushes),
                        (unsigned long long)(w1.replays - w0.replays), (unsigned long long)(w1.summaries - w0.summaries),
                        (unsigned long long)(w1.blocks - w0.blocks), (unsigned long long)(w1.ctx_edges - w0.ctx_edges));
            }
            if (!((mask[t >> 5] >> (t & 31)) & 1u)) {
                snprintf(r->err, sizeof r->err, "wrong mask: instance token %zu (id %d) is masked out", i, t);
                free(allowed);
                goto done;
            }
            if (di_grammar_matcher_accept_token(mt, t, &err)) {
                snprintf(r->err, sizeof r->err, "accept token %zu: %.200s", i, err.msg);
                free(allowed);
                goto done;
            }
        }
        if (steps == n_ids && !di_grammar_matcher_can_end(mt)) {
            snprintf(r->err, sizeof r->err, "instance complete but EOS not allowed");
            free(allowed);
            goto done;
        }
        r->n_tokens = steps;
        if (steps && pass == 1) {
            qsort(ts, steps, sizeof *ts, cmp_double);
            r->warm_p50_us = ts[steps / 2] * 1e6;
            r->warm_p99_us = ts[(size_t)((double)(steps - 1) * 0.99)] * 1e6;
        } else if (steps) {
            size_t *as = allowed;
            for (size_t i = 1; i < steps; i++) /* median of the allowed counts (insertion sort, small n) */
                for (size_t k = i; k > 0 && as[k - 1] > as[k]; k--) {
                    size_t x = as[k];
                    as[k] = as[k - 1], as[k - 1] = x;
                }
            r->allowed_p50 = as[steps / 2];
            qsort(ts, steps, sizeof *ts, cmp_double);
            r->p50_us = ts[steps / 2] * 1e6;
            r->p99_us = ts[(size_t)((double)(steps - 1) * 0.99)] * 1e6;
            r->max_us = ts[steps - 1] * 1e6;
        }
    }
    free(allowed);
    r->ok = true;
done:
    di_grammar_matcher_free(mt);
    di_grammar_free(g);
    free(ids);
    free(ts);
    free(mask);
    free(src);
    free(text);
}

/* Ratios ours / peer for one input from the peers script's JSON (its own run, same inputs): added
 * to o as "vs_<peer>" and printed when `print`. */
static void peer_ratios(json_t *peers, const result *r, json_t *o, bool print) {
    json_t *in;
    size_t i;
    if (!peers) return;
    json_array_foreach(json_object_get(peers, "inputs"), i, in) {
        const char *nm = json_string_value(json_object_get(in, "name"));
        if (!nm || strcmp(nm, r->name)) continue;
        static const char *names[] = {"llguidance", "xgrammar"};
        for (int k = 0; k < 2; k++) {
            json_t *p = json_object_get(in, names[k]);
            double c = json_number_value(json_object_get(p, "compile_ms")), p50 = json_number_value(json_object_get(p, "p50_us")),
                   p99 = json_number_value(json_object_get(p, "p99_us"));
            if (!p || json_object_get(p, "error") || c <= 0 || p50 <= 0 || p99 <= 0) continue;
            json_t *q = json_object();
            json_object_set_new(q, "compile", json_real(r->compile_ms / c));
            json_object_set_new(q, "mask_p50", json_real(r->p50_us / p50));
            json_object_set_new(q, "mask_p99", json_real(r->p99_us / p99));
            json_object_set_new(q, "warm_mask_p50", json_real(r->warm_p50_us / p50));
            json_object_set_new(q, "warm_mask_p99", json_real(r->warm_p99_us / p99));
            char key[32];
            snprintf(key, sizeof key, "vs_%s", names[k]);
            json_object_set_new(o, key, q);
            if (print)
                printf("%-20s   vs %-10s compile x%.2f  mask p50 x%.2f  p99 x%.2f  (warm p50 x%.2f  p99 x%.2f)\n", "",
                       names[k], r->compile_ms / c, r->p50_us / p50, r->p99_us / p99, r->warm_p50_us / p50,
                       r->warm_p99_us / p99);
        }
    }
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* ---- compliance: MaskBench / JSONSchemaBench files ({"schema": ..., "tests": [{"data", "valid"}]}) ----
 * Acceptance is checked on bytes (a 257-token vocabulary: EOS + one token per byte), so it measures
 * the grammar, not the tokenizer. An accepted invalid instance is a wrong mask and fails the run. */

static bool accepts(const di_grammar *g, const di_grammar_vocab *bv, const char *s, int *err_code) {
    di_grammar_matcher *m = NULL;
    *err_code = di_grammar_matcher_new(g, bv, NULL, &m, NULL);
    if (*err_code) return false;
    bool ok = true;
    for (const char *p = s; *p && ok; p++) {
        int rc = di_grammar_matcher_accept_token(m, (uint8_t)*p + 1, NULL);
        if (rc && rc != DI_ERR_INVALID) *err_code = rc;
        ok = rc == DI_OK;
    }
    ok = ok && di_grammar_matcher_can_end(m);
    di_grammar_matcher_free(m);
    return ok;
}

static int run_compliance(const di_cli *cli, const char *dir, long long limit) {
    DIR *d = opendir(dir);
    if (!d) return cli_fail(cli, "cannot open schema directory %s", dir);
    size_t nf = 0, cap = 1024;
    char **files = malloc(cap * sizeof *files);
    for (struct dirent *e; files && (e = readdir(d));) {
        if (!strstr(e->d_name, ".json")) continue;
        if (nf == cap) {
            char **f2 = realloc(files, (cap *= 2) * sizeof *files);
            if (!f2) break;
            files = f2;
        }
        files[nf++] = strdup(e->d_name);
    }
    closedir(d);
    if (!files) return cli_fail(cli, "out of memory");
    qsort(files, nf, sizeof *files, cmp_str);
    if (limit > 0 && (size_t)limit < nf) { /* an evenly spaced sample (the peers script takes the same) */
        double step = (double)nf / (double)limit;
        for (size_t i = 0; i < (size_t)limit; i++) {
            size_t k = (size_t)((double)i * step);
            char *t = files[i];
            files[i] = files[k];
            files[k] = t;
        }
        for (size_t i = (size_t)limit; i < nf; i++) free(files[i]);
        nf = (size_t)limit;
    }
    uint8_t one[256];
    const uint8_t *bb[257];
    uint32_t bl[257];
    bb[0] = NULL, bl[0] = 0;
    for (int i = 0; i < 256; i++) one[i] = (uint8_t)i, bb[i + 1] = &one[i], bl[i + 1] = 1;
    int32_t eos = 0;
    di_grammar_vocab *bv = NULL;
    di_error err = {0};
    if (di_grammar_vocab_new(257, bb, bl, NULL, &eos, 1, &bv, &err)) return cli_fail_err(cli, &err);
    size_t schemas = 0, compiled = 0, unsupported = 0, invalid_schema = 0, limit_err = 0, other = 0;
    size_t valid = 0, valid_ok = 0, inval = 0, inval_ok = 0, unsound = 0, match_err = 0;
    double *ct = malloc((nf + 1) * sizeof *ct);
    size_t nct = 0;
    json_t *examples = json_array();
    for (size_t i = 0; i < nf; i++) {
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        json_error_t je;
        json_t *doc = json_load_file(path, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        json_t *sch = doc ? json_object_get(doc, "schema") : NULL;
        if (!sch) {
            json_decref(doc);
            continue;
        }
        schemas++;
        char *text = json_dumps(sch, JSON_ENCODE_ANY | JSON_PRESERVE_ORDER | JSON_COMPACT);
        di_grammar *g = NULL;
        double t0 = now_s();
        int rc = text ? di_grammar_from_json_schema(text, strlen(text), NULL, &g, &err) : DI_ERR_NOMEM;
        double dt = now_s() - t0;
        free(text);
        if (rc) {
            if (rc == DI_ERR_UNSUPPORTED) unsupported++;
            else if (rc == DI_ERR_INVALID || rc == DI_ERR_FORMAT) invalid_schema++;
            else if (rc == DI_ERR_LIMIT) limit_err++;
            else other++;
            json_decref(doc);
            continue;
        }
        compiled++;
        ct[nct++] = dt;
        json_t *tests = json_object_get(doc, "tests");
        for (size_t k = 0; k < json_array_size(tests); k++) {
            json_t *t = json_array_get(tests, k);
            char *data = json_dumps(json_object_get(t, "data"), JSON_ENCODE_ANY | JSON_PRESERVE_ORDER | JSON_COMPACT);
            if (!data) continue;
            int want = json_is_true(json_object_get(t, "valid")), ecode = 0;
            bool got = accepts(g, bv, data, &ecode);
            if (ecode) match_err++;
            if (want) valid++, valid_ok += got;
            else inval++, inval_ok += !got;
            if (got && !want) {
                unsound++;
                if (json_array_size(examples) < 10) json_array_append_new(examples, json_string(files[i]));
                if (!cli->json) fprintf(stderr, "WRONG: %s accepts an invalid instance: %.200s\n", files[i], data);
            }
            free(data);
        }
        di_grammar_free(g);
        json_decref(doc);
    }
    qsort(ct, nct, sizeof *ct, cmp_double);
    double p50 = nct ? ct[nct / 2] * 1e3 : 0, p99 = nct ? ct[(size_t)((double)(nct - 1) * 0.99)] * 1e3 : 0;
    json_t *out = json_object();
    json_object_set_new(out, "command", json_string("bench grammar"));
    json_object_set_new(out, "schemas", json_integer((json_int_t)schemas));
    json_object_set_new(out, "compiled", json_integer((json_int_t)compiled));
    json_object_set_new(out, "unsupported", json_integer((json_int_t)unsupported));
    json_object_set_new(out, "invalid_schema", json_integer((json_int_t)invalid_schema));
    json_object_set_new(out, "limit", json_integer((json_int_t)limit_err));
    json_object_set_new(out, "compile_ms_p50", json_real(p50));
    json_object_set_new(out, "compile_ms_p99", json_real(p99));
    json_object_set_new(out, "valid_accepted", json_integer((json_int_t)valid_ok));
    json_object_set_new(out, "valid_total", json_integer((json_int_t)valid));
    json_object_set_new(out, "invalid_rejected", json_integer((json_int_t)inval_ok));
    json_object_set_new(out, "invalid_total", json_integer((json_int_t)inval));
    json_object_set_new(out, "invalid_accepted", json_integer((json_int_t)unsound));
    json_object_set_new(out, "matcher_errors", json_integer((json_int_t)match_err));
    json_object_set_new(out, "wrong_examples", examples);
    if (!cli->json)
        printf("schemas %zu: compiled %zu (unsupported %zu, invalid %zu, limit %zu, other %zu); compile p50 %.2f ms p99 "
               "%.2f ms\ninstances on compiled schemas: valid accepted %zu/%zu, invalid rejected %zu/%zu, invalid "
               "ACCEPTED %zu, matcher limit errors %zu\n",
               schemas, compiled, unsupported, invalid_schema, limit_err, other, p50, p99, valid_ok, valid, inval_ok,
               inval, unsound, match_err);
    for (size_t i = 0; i < nf; i++) free(files[i]);
    free(files);
    free(ct);
    di_grammar_vocab_free(bv);
    if (unsound) {
        json_decref(out);
        return cli_fail(cli, "%zu invalid instance(s) accepted (wrong masks)", unsound);
    }
    if (cli->json) return cli_emit(cli, out);
    json_decref(out);
    return 0;
}

int bench_grammar(int argc, char **argv) {
    di_args a;
    cli_args_init(&a, argc, argv);
    di_cli cli = {.cmd = "bench grammar", .json = cli_flag(&a, "json")};
    if (cli_flag(&a, "cpu-time")) mask_clock = CLOCK_THREAD_CPUTIME_ID;
    const char *tpath = cli_str(&a, "tokenizer", NULL);
    const char *dir = cli_str(&a, "inputs", DEFAULT_INPUTS);
    const char *only = cli_str(&a, "only", NULL);
    const char *schemas = cli_str(&a, "schemas", NULL);
    const char *peers_path = cli_str(&a, "peers", NULL);
    long long repeat = 0, steps = 0, limit = 0, verify = 0;
    if (!cli_int(&cli, &a, "repeat", 5, 1, 16, &repeat) || !cli_int(&cli, &a, "steps", 256, 1, 1 << 20, &steps) ||
        !cli_int(&cli, &a, "limit", 0, 0, 1 << 30, &limit) || !cli_int(&cli, &a, "verify", 0, 0, 1 << 20, &verify) ||
        !cli_check_unused(&cli, &a)) {
        cli_args_free(&a);
        return 1;
    }
    cli_args_free(&a);
    if (schemas) return run_compliance(&cli, schemas, limit);
    trace = getenv("DI_BENCH_TRACE") != NULL;
    if (!tpath) {
        FILE *f = fopen(DEFAULT_TOKENIZER, "rb");
        tpath = f ? DEFAULT_TOKENIZER : FALLBACK_TOKENIZER;
        if (f) fclose(f);
    }
    di_error err = {0};
    di_tokenizer *tok = NULL;
    if (di_tok_load(tpath, &tok, &err)) return cli_fail_err(&cli, &err);
    di_grammar_vocab *v = NULL;
    double t0 = now_s();
    if (vocab_from_tokenizer(tok, &v, &err)) {
        di_tok_free(tok);
        return cli_fail_err(&cli, &err);
    }
    double vocab_ms = (now_s() - t0) * 1e3;
    DIR *d = opendir(dir);
    if (!d) {
        di_grammar_vocab_free(v);
        di_tok_free(tok);
        return cli_fail(&cli, "cannot open inputs directory %s", dir);
    }
    char *files[256];
    size_t nf = 0;
    for (struct dirent *e; (e = readdir(d)) && nf < 256;) {
        const char *dot = strrchr(e->d_name, '.');
        if (!dot || (strcmp(dot, ".json") && strcmp(dot, ".regex") && strcmp(dot, ".gbnf"))) continue;
        if (only && !strstr(e->d_name, only)) continue;
        files[nf++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(files, nf, sizeof *files, cmp_str);
    json_t *peers = NULL;
    if (peers_path) {
        json_error_t je;
        peers = json_load_file(peers_path, 0, &je);
        if (!peers || !json_is_array(json_object_get(peers, "inputs"))) {
            json_decref(peers);
            for (size_t i = 0; i < nf; i++) free(files[i]);
            di_grammar_vocab_free(v);
            di_tok_free(tok);
            return cli_fail(&cli, "--peers %s: expected the JSON of scripts/bench_grammar_peers.py --json (%s)",
                            peers_path, je.text);
        }
    }
    json_t *doc = json_object(), *arr = json_array();
    json_object_set_new(doc, "command", json_string("bench grammar"));
    json_object_set_new(doc, "tokenizer", json_string(tpath));
    json_object_set_new(doc, "vocab_size", json_integer(di_grammar_vocab_size(v)));
    json_object_set_new(doc, "vocab_build_ms", json_real(vocab_ms));
    if (!cli.json)
        printf("vocabulary %u tokens, trie built in %.1f ms\n%-20s %-11s %10s %7s %10s %10s %10s %10s %10s %8s\n",
               di_grammar_vocab_size(v), vocab_ms, "input", "kind", "compile_ms", "tokens", "mask_p50_us",
               "mask_p99_us", "mask_max_us", "warm_p50_us", "warm_p99_us", "allowed");
    int failures = 0;
    for (size_t i = 0; i < nf; i++) {
        result r = {0};
        run_one(dir, files[i], tok, v, (int)repeat, (int)steps, (int)verify, &r);
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(r.name));
        json_object_set_new(o, "kind", json_string(r.kind ? r.kind : "?"));
        json_object_set_new(o, "ok", json_boolean(r.ok));
        if (r.ok) {
            json_object_set_new(o, "compile_ms", json_real(r.compile_ms));
            json_object_set_new(o, "tokens", json_integer((json_int_t)r.n_tokens));
            json_object_set_new(o, "mask_p50_us", json_real(r.p50_us));
            json_object_set_new(o, "mask_p99_us", json_real(r.p99_us));
            json_object_set_new(o, "mask_max_us", json_real(r.max_us));
            json_object_set_new(o, "warm_mask_p50_us", json_real(r.warm_p50_us));
            json_object_set_new(o, "warm_mask_p99_us", json_real(r.warm_p99_us));
            json_object_set_new(o, "allowed_p50", json_integer((json_int_t)r.allowed_p50));
            json_object_set_new(o, "masks_verified", json_integer((json_int_t)r.verified));
            if (!cli.json)
                printf("%-20s %-11s %10.3f %7zu %10.1f %10.1f %10.1f %10.1f %10.1f %8zu\n", r.name, r.kind, r.compile_ms,
                       r.n_tokens, r.p50_us, r.p99_us, r.max_us, r.warm_p50_us, r.warm_p99_us, r.allowed_p50);
            peer_ratios(peers, &r, o, !cli.json);
        } else {
            failures++;
            json_object_set_new(o, "error", json_string(r.err));
            if (!cli.json) printf("%-20s %-11s FAILED: %s\n", r.name, r.kind ? r.kind : "?", r.err);
        }
        json_array_append_new(arr, o);
        free(files[i]);
    }
    json_object_set_new(doc, "inputs", arr);
    json_decref(peers);
    di_grammar_vocab_free(v);
    di_tok_free(tok);
    if (failures) {
        json_decref(doc);
        return cli_fail(&cli, "%d input(s) failed (see above)", failures);
    }
    if (cli.json) return cli_emit(&cli, doc);
    json_decref(doc);
    return 0;
}
