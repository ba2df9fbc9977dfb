/* deepinfer bench tokenizer — body arrives with issue 5; until then it fails with a clear reason. */
#include "cli.h"

int bench_tokenizer(int argc, char **argv) {
    di_args a;
    cli_args_init(&a, argc, argv);
    di_cli cli = {.cmd = "bench tokenizer", .json = cli_flag(&a, "json")};
    cli_args_free(&a);
    return cli_fail(&cli, "not implemented yet (tracked by issue 5)");
}
