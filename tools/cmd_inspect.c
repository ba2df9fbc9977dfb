/* deepinfer inspect — body arrives with issue 2; until then it fails with a clear reason. */
#include <string.h>

#include "cli.h"

int cmd_inspect(int argc, char **argv) {
    di_args a;
    cli_args_init(&a, argc, argv);
    di_cli cli = {.cmd = "inspect", .json = cli_flag(&a, "json")};
    cli_args_free(&a);
    return cli_fail(&cli, "not implemented yet (tracked by issue 2)");
}
