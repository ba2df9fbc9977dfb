/* deepinfer verify — body arrives with issue 3; until then it fails with a clear reason. */
#include <string.h>

#include "cli.h"

int cmd_verify(int argc, char **argv) {
    di_args a;
    cli_args_init(&a, argc, argv);
    di_cli cli = {.cmd = "verify", .json = cli_flag(&a, "json")};
    cli_args_free(&a);
    return cli_fail(&cli, "not implemented yet (tracked by issue 3)");
}
