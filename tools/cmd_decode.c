/* deepinfer decode — body arrives with issue 5; until then it fails with a clear reason. */
#include <string.h>

#include "cli.h"

int cmd_decode(int argc, char **argv) {
    di_args a;
    cli_args_init(&a, argc, argv);
    di_cli cli = {.cmd = "decode", .json = cli_flag(&a, "json")};
    cli_args_free(&a);
    return cli_fail(&cli, "not implemented yet (tracked by issue 5)");
}
