/* deepinfer bench KIND — dispatches to tools/bench_KIND.c. */
#include <string.h>

#include "cli.h"

int bench_cpu(int argc, char **argv);
int bench_gpu(int argc, char **argv);
int bench_grammar(int argc, char **argv);
int bench_tokenizer(int argc, char **argv);
int bench_engine(int argc, char **argv);

int cmd_bench(int argc, char **argv) {
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } kinds[] = {{"cpu", bench_cpu},
                 {"gpu", bench_gpu},
                 {"grammar", bench_grammar},
                 {"tokenizer", bench_tokenizer},
                 {"engine", bench_engine}};
    if (argc >= 2)
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
            if (!strcmp(argv[1], kinds[i].name)) return kinds[i].fn(argc - 1, argv + 1);
    di_args a;
    cli_args_init(&a, argc, argv);
    di_cli cli = {.cmd = "bench", .json = cli_flag(&a, "json")};
    cli_args_free(&a);
    return cli_fail(&cli, "usage: deepinfer bench cpu|gpu|grammar|tokenizer|engine [options] [--json]");
}
