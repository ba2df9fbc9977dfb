/* Shared CLI helpers: failure reporting, the --json document, the long-option scanner. */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_fail(const di_cli *cli, const char *fmt, ...) {
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *p = msg; *p; p++)
        if (*p == '\n') *p = ' ';
    fprintf(stderr, "deepinfer %s: error: %s\n", cli->cmd, msg);
    if (cli->json) {
        json_t *doc = json_pack("{s:b, s:s, s:s}", "ok", 0, "command", cli->cmd, "error", msg);
        if (!doc) { /* the message is not valid UTF-8 (a path, a tensor name): still emit a document */
            for (unsigned char *p = (unsigned char *)msg; *p; p++)
                if (*p >= 0x80) *p = '?';
            doc = json_pack("{s:b, s:s, s:s}", "ok", 0, "command", cli->cmd, "error", msg);
        }
        json_dumpf(doc, stdout, JSON_INDENT(2));
        fputc('\n', stdout);
        json_decref(doc);
    }
    return 1;
}

int cli_fail_err(const di_cli *cli, const di_error *err) {
    return cli_fail(cli, "%s", err->msg[0] ? err->msg : di_status_name(err->code));
}

int cli_emit(const di_cli *cli, json_t *doc) {
    json_object_set_new(doc, "ok", json_true());
    json_object_set_new(doc, "command", json_string(cli->cmd));
    json_dumpf(doc, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    fputc('\n', stdout);
    fflush(stdout);
    json_decref(doc);
    return 0;
}

void cli_args_init(di_args *a, int argc, char **argv) {
    a->argc = argc;
    a->argv = argv;
    a->used = calloc((size_t)argc + 1, 1);
    if (!a->used) { /* a CLI front end, not library code: nothing sensible is left to do */
        fputs("deepinfer: out of memory\n", stderr);
        exit(1);
    }
    if (argc > 0) a->used[0] = 1;
}

void cli_args_free(di_args *a) { free(a->used); }

static int find(di_args *a, const char *name) {
    for (int i = 1; i < a->argc; i++)
        if (a->argv[i][0] == '-' && a->argv[i][1] == '-' && strcmp(a->argv[i] + 2, name) == 0) return i;
    return -1;
}

bool cli_flag(di_args *a, const char *name) {
    int i = find(a, name);
    if (i < 0) return false;
    a->used[i] = 1;
    return true;
}

/* used[] marks: 0 = not consumed, 1 = consumed, MISSING = an option whose value is absent. */
enum { MISSING = 2 };

const char *cli_str(di_args *a, const char *name, const char *def) {
    int i = find(a, name);
    if (i < 0) return def;
    /* last on the line, or followed by another option ("--out --json"): the value is missing, and
     * cli_check_unused says so rather than taking the next option as the value */
    const char *v = i + 1 < a->argc ? a->argv[i + 1] : NULL;
    if (!v || (v[0] == '-' && v[1] == '-')) {
        a->used[i] = MISSING;
        return NULL;
    }
    a->used[i] = 1;
    a->used[i + 1] = 1;
    return v;
}

bool cli_int(const di_cli *cli, di_args *a, const char *name, long long def, long long lo, long long hi,
             long long *out) {
    const char *s = cli_str(a, name, NULL);
    if (find(a, name) < 0) {
        *out = def;
        return true;
    }
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || errno || *end || end == s || v < lo || v > hi) {
        cli_fail(cli, "--%s expects an integer in [%lld, %lld], got '%s'", name, lo, hi, s ? s : "(nothing)");
        return false;
    }
    *out = v;
    return true;
}

bool cli_double(const di_cli *cli, di_args *a, const char *name, double def, double *out) {
    const char *s = cli_str(a, name, NULL);
    if (find(a, name) < 0) {
        *out = def;
        return true;
    }
    char *end;
    double v = s ? strtod(s, &end) : 0;
    if (!s || *end || end == s) {
        cli_fail(cli, "--%s expects a number, got '%s'", name, s ? s : "(nothing)");
        return false;
    }
    *out = v;
    return true;
}

bool cli_check_unused(const di_cli *cli, di_args *a) {
    for (int i = 1; i < a->argc; i++) {
        if (a->used[i] == 1) continue;
        if (a->used[i] == MISSING)
            cli_fail(cli, "option '%s' needs a value (see `deepinfer help`)", a->argv[i]);
        else
            cli_fail(cli, "unexpected argument '%s' (see `deepinfer help`)", a->argv[i]);
        return false;
    }
    return true;
}

bool cli_device(const di_cli *cli, di_args *a, const char **device) {
    const char *d = cli_str(a, "device", "cpu");
    if (!d || (strcmp(d, "cpu") != 0 && strcmp(d, "cuda") != 0)) {
        cli_fail(cli, "--device expects cpu or cuda, got '%s'", d ? d : "(nothing)");
        return false;
    }
    *device = d;
    return true;
}
