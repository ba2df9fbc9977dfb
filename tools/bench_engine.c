/* deepinfer bench engine — body arrives with issue 7; until then it fails with a clear reason. */
#include "cli.h"

int bench_engine(int argc, char **argv) {
    di_args a;
    cli_args_init(&a, argc, argv);
    di_cli cli = {.cmd = "bench engine", .json = cli_flag(&a, "json")};
    cli_args_free(&a);
    return cli_fail(&cli, "not implemented yet (tracked by issue 7)");
}
