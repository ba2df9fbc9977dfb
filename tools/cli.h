/* Shared helpers for the deepinfer subcommands.
 *
 * Conventions every subcommand follows:
 *  - `--json`: exactly one JSON document on stdout; logs and progress on stderr.
 *  - failure: exit status 1 and a one-line reason on stderr ("deepinfer CMD: error: ..."); with
 *    --json the document is {"ok": false, "command": CMD, "error": "..."}.
 *  - `--device cpu|cuda` wherever a model runs (default cpu). */
#ifndef DI_TOOLS_CLI_H
#define DI_TOOLS_CLI_H

#include <jansson.h>
#include <stdbool.h>

#include "util/error.h"

typedef struct di_cli {
    const char *cmd; /* subcommand name, for messages */
    bool json;       /* --json given */
} di_cli;

/* Print the failure (stderr, and the JSON error document when cli->json) and return 1. */
int cli_fail(const di_cli *cli, const char *fmt, ...) DI_PRINTF(2, 3);
/* Print a di_error as the failure reason. */
int cli_fail_err(const di_cli *cli, const di_error *err);
/* Print `doc` (steals the reference) as the --json document, adding "ok": true. Returns 0. */
int cli_emit(const di_cli *cli, json_t *doc);

/* Minimal long-option scanner shared by subcommands: options are `--name value` or `--name`.
 * The lookups search argv[1..argc). A value-taking option that is last, or followed by another
 * `--option`, has no value: cli_str returns NULL for it and cli_check_unused reports it. */
typedef struct di_args {
    int argc;
    char **argv;
    unsigned char *used; /* per argv slot; to report unknown options */
} di_args;

void cli_args_init(di_args *a, int argc, char **argv);
void cli_args_free(di_args *a);
bool cli_flag(di_args *a, const char *name);                      /* --name present */
const char *cli_str(di_args *a, const char *name, const char *def); /* --name VALUE */
/* Fills *out; returns false (after cli_fail) if the value is not an integer in [lo, hi]. */
bool cli_int(const di_cli *cli, di_args *a, const char *name, long long def, long long lo, long long hi,
             long long *out);
bool cli_double(const di_cli *cli, di_args *a, const char *name, double def, double *out);
/* After all lookups: fail on any argument that was not consumed. Returns true if all were used. */
bool cli_check_unused(const di_cli *cli, di_args *a);
/* --device cpu|cuda; returns false (after cli_fail) on anything else. */
bool cli_device(const di_cli *cli, di_args *a, const char **device);

/* Subcommand entry points (argv[0] is the subcommand name). */
int cmd_mkmodel(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_encode(int argc, char **argv);
int cmd_decode(int argc, char **argv);
int cmd_render(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_bench(int argc, char **argv);

#endif
