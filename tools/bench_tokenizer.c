/* deepinfer bench tokenizer — single-thread encode throughput (MB/s of UTF-8 input).
 *   deepinfer bench tokenizer [--tokenizer FILE] [--corpus CORPUS.jsonl] [--seconds S] [--no-hf] [--json]
 *
 * Workloads on the fixed golden corpus (tests/data/tokenizer/corpus.jsonl, 2,067 varied strings):
 *   doc          all strings joined by "\n", one encode call, added-token recognition on
 *   doc_plain    the same with recognition off (message-content path)
 *   messages     every string its own call, recognition on (many short requests)
 * When python3 with `tokenizers` is available, scripts/bench_tokenizer_hf.py times HF on the same
 * workloads in the same run and the ratio is printed (HF has no plain-BPE switch, so doc_plain has none). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "text/tokenizer.h"

#define DEFAULT_TOKENIZER DI_TOKENIZER_DEFAULT_PATH
#define DEFAULT_CORPUS "tests/data/tokenizer/corpus.jsonl"
#define HF_SCRIPT "scripts/bench_tokenizer_hf.py"

typedef struct corpus {
    char **text;   /* [n] */
    size_t *len;   /* [n] */
    size_t n, bytes;
    char *doc;     /* texts joined by '\n' */
    size_t doc_len;
} corpus;

static void corpus_free(corpus *c) {
    for (size_t i = 0; i < c->n; i++) free(c->text[i]);
    free(c->text);
    free(c->len);
    free(c->doc);
}

static bool corpus_load(const char *path, corpus *c) {
    memset(c, 0, sizeof *c);
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char *line = NULL;
    size_t lcap = 0, cap = 0;
    ssize_t nr;
    bool ok = true;
    while (ok && (nr = getline(&line, &lcap, f)) > 0) {
        json_t *o = json_loadb(line, (size_t)nr, JSON_ALLOW_NUL, NULL);
        json_t *t = json_object_get(o, "t");
        if (!json_is_string(t)) ok = false;
        if (ok && c->n == cap) {
            cap = cap ? 2 * cap : 1024;
            char **nt = realloc(c->text, cap * sizeof *nt);
            if (nt) c->text = nt;
            size_t *nl = realloc(c->len, cap * sizeof *nl);
            if (nl) c->len = nl;
            ok = nt && nl;
        }
        if (ok) {
            size_t l = json_string_length(t);
            c->text[c->n] = malloc(l + 1);
            if ((ok = c->text[c->n] != NULL)) {
                memcpy(c->text[c->n], json_string_value(t), l + 1);
                c->len[c->n++] = l;
                c->bytes += l;
            }
        }
        json_decref(o);
    }
    free(line);
    fclose(f);
    if (!ok || c->n == 0) return false;
    c->doc = malloc(c->bytes + c->n);
    if (!c->doc) return false;
    for (size_t i = 0; i < c->n; i++) {
        if (i) c->doc[c->doc_len++] = '\n';
        memcpy(c->doc + c->doc_len, c->text[i], c->len[i]);
        c->doc_len += c->len[i];
    }
    return true;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One pass of a workload; returns tokens produced or -1 on error. */
static long run_once(const di_tokenizer *tok, const corpus *c, bool doc, int special, di_error *err) {
    long total = 0;
    for (size_t i = 0; i < (doc ? 1 : c->n); i++) {
        int32_t *ids;
        size_t n;
        if (di_tok_encode(tok, doc ? c->doc : c->text[i], doc ? c->doc_len : c->len[i], special, &ids, &n, err))
            return -1;
        free(ids);
        total += (long)n;
    }
    return total;
}

/* MB/s over at least `seconds` and 3 passes, after one warm-up pass (as the HF script measures). */
static double measure(const di_tokenizer *tok, const corpus *c, bool doc, int special, double seconds,
                      long *tokens, di_error *err) {
    if ((*tokens = run_once(tok, c, doc, special, err)) < 0) return -1;
    double t0 = now(), dt;
    int runs = 0;
    do {
        if (run_once(tok, c, doc, special, err) < 0) return -1;
        runs++;
        dt = now() - t0;
    } while (runs < 3 || dt < seconds);
    return (double)(doc ? c->doc_len : c->bytes) * runs / dt / 1e6;
}

/* Runs the HF script; returns its JSON object or NULL (no python3 / tokenizers, or it failed). */
static json_t *run_hf(const char *tok_path, const char *corpus_path, double seconds) {
    FILE *probe = fopen(HF_SCRIPT, "r");
    if (!probe) return NULL;
    fclose(probe);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "python3 %s --tokenizer '%s' --corpus '%s' --seconds %.2f 2>/dev/null", HF_SCRIPT,
             tok_path, corpus_path, seconds);
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    /* read to EOF before parsing so the script never writes into a closed pipe */
    char out[4096];
    size_t n = 0, r;
    while ((r = fread(out + n, 1, sizeof out - 1 - n, p)) > 0) n += r;
    out[n] = 0;
    json_t *doc = json_loads(out, JSON_DISABLE_EOF_CHECK, NULL);
    if (pclose(p) != 0 || !json_is_object(doc)) {
        json_decref(doc);
        return NULL;
    }
    return doc;
}

int bench_tokenizer(int argc, char **argv) {
    di_args a;
    cli_args_init(&a, argc, argv);
    di_cli cli = {.cmd = "bench tokenizer", .json = cli_flag(&a, "json")};
    const char *tok_path = cli_str(&a, "tokenizer", DEFAULT_TOKENIZER);
    const char *corpus_path = cli_str(&a, "corpus", DEFAULT_CORPUS);
    bool no_hf = cli_flag(&a, "no-hf");
    double seconds;
    int rc = 1;
    di_tokenizer *tok = NULL;
    corpus c = {0};
    json_t *hf = NULL;
    if (!cli_double(&cli, &a, "seconds", 1.0, &seconds) || !cli_check_unused(&cli, &a)) goto out;
    if (!tok_path || !corpus_path) {
        rc = cli_fail(&cli, "--tokenizer and --corpus need a value");
        goto out;
    }
    di_error err = {0};
    double t0 = now();
    if (di_tok_load(tok_path, &tok, &err)) {
        rc = cli_fail_err(&cli, &err);
        goto out;
    }
    double load_s = now() - t0;
    if (!corpus_load(corpus_path, &c)) {
        rc = cli_fail(&cli, "cannot read the benchmark corpus %s (JSON lines with a \"t\" string)", corpus_path);
        goto out;
    }
    long doc_tokens, plain_tokens, msg_tokens;
    double doc = measure(tok, &c, true, 1, seconds, &doc_tokens, &err);
    double plain = doc >= 0 ? measure(tok, &c, true, 0, seconds, &plain_tokens, &err) : -1;
    double msgs = plain >= 0 ? measure(tok, &c, false, 1, seconds, &msg_tokens, &err) : -1;
    if (msgs < 0) {
        rc = cli_fail_err(&cli, &err);
        goto out;
    }
    if (!no_hf) hf = run_hf(tok_path, corpus_path, seconds);
    double hf_doc = json_number_value(json_object_get(hf, "doc_mb_s"));
    double hf_msgs = json_number_value(json_object_get(hf, "messages_mb_s"));
    long hf_doc_tokens = (long)json_integer_value(json_object_get(hf, "doc_tokens"));
    if (cli.json) {
        json_t *o = json_object();
        json_object_set_new(o, "tokenizer", json_string(tok_path));
        json_object_set_new(o, "corpus", json_string(corpus_path));
        json_object_set_new(o, "corpus_strings", json_integer((json_int_t)c.n));
        json_object_set_new(o, "doc_bytes", json_integer((json_int_t)c.doc_len));
        json_object_set_new(o, "doc_tokens", json_integer(doc_tokens));
        json_object_set_new(o, "load_s", json_real(load_s));
        json_object_set_new(o, "doc_mb_s", json_real(doc));
        json_object_set_new(o, "doc_plain_mb_s", json_real(plain));
        json_object_set_new(o, "messages_mb_s", json_real(msgs));
        if (hf) {
            json_object_set_new(o, "hf_version", json_incref(json_object_get(hf, "version")));
            json_object_set_new(o, "hf_doc_mb_s", json_real(hf_doc));
            json_object_set_new(o, "hf_messages_mb_s", json_real(hf_msgs));
            json_object_set_new(o, "hf_doc_tokens_equal", json_boolean(hf_doc_tokens == doc_tokens));
            json_object_set_new(o, "doc_speedup", json_real(doc / hf_doc));
            json_object_set_new(o, "messages_speedup", json_real(msgs / hf_msgs));
        } else {
            json_object_set_new(o, "hf", json_string(no_hf ? "skipped (--no-hf)" : "unavailable (python3 + tokenizers)"));
        }
        rc = cli_emit(&cli, o);
    } else {
        printf("tokenizer %s (loaded in %.2f s), corpus %s: %zu strings, %zu bytes as one document (%ld tokens)\n",
               tok_path, load_s, corpus_path, c.n, c.doc_len, doc_tokens);
        printf("  %-34s %8.2f MB/s", "doc, added tokens recognised", doc);
        if (hf) printf("   HF %.2f MB/s   x%.2f", hf_doc, doc / hf_doc);
        printf("\n  %-34s %8.2f MB/s\n", "doc, plain BPE", plain);
        printf("  %-34s %8.2f MB/s", "messages (one call per string)", msgs);
        if (hf) printf("   HF %.2f MB/s   x%.2f", hf_msgs, msgs / hf_msgs);
        printf("\n");
        if (hf)
            printf("  HF tokenizers %s, single thread; document token counts %s\n",
                   json_string_value(json_object_get(hf, "version")), hf_doc_tokens == doc_tokens ? "equal" : "DIFFER");
        else
            printf("  HF comparison %s\n", no_hf ? "skipped (--no-hf)" : "unavailable (needs python3 with tokenizers)");
        rc = 0;
    }
out:
    json_decref(hf);
    corpus_free(&c);
    di_tok_free(tok);
    cli_args_free(&a);
    return rc;
}
