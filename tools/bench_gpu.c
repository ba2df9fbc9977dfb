/* deepinfer bench gpu — body arrives with issue 10; until then it fails with a clear reason. */
#include "cli.h"

int bench_gpu(int argc, char **argv) {
    di_args a;
    cli_args_init(&a, argc, argv);
    di_cli cli = {.cmd = "bench gpu", .json = cli_flag(&a, "json")};
    cli_args_free(&a);
    return cli_fail(&cli, "not implemented yet (tracked by issue 10)");
}
