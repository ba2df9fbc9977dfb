/* deepinfer: the command-line front end. One subcommand per file (tools/cmd_*.c). */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *usage;
} k_cmds[] = {
    {"mkmodel", cmd_mkmodel, "--preset tiny|small|full-layer --seed N --out DIR  write a random-weight checkpoint"},
    {"inspect", cmd_inspect, "--model DIR                                    validate and summarise a checkpoint"},
    {"plan", cmd_plan, "--model DIR|--config FILE [--device cpu|cuda] [--max-seqs N] ...  memory plan; refuses what does not fit"},
    {"generate", cmd_generate, "--model DIR --prompt-ids 1,2|--prompt TEXT [--max-tokens N] [--temperature T] [--top-k K]\n"
     "                    [--top-p P] [--min-p P] [--seed S] [--force-output-ids 4,5] [--dspark] [--chunk N]\n"
     "                    [--tokenizer PATH] [--dump-logits FILE]\n"
     "                    [--json-schema FILE [--json-whitespace compact] | --regex R | --grammar FILE]  generate tokens"},
    {"verify", cmd_verify, "--model DIR --golden FILE [--dump FILE] [--dump-stages FILE] [--kernels FILE|--no-ops]\n"
     "                    [--threads N] [--cpu-impl fast|scalar]  fidelity against golden reference outputs"},
    {"encode", cmd_encode, "--tokenizer FILE|--model DIR --text S          text to token ids"},
    {"decode", cmd_decode, "--tokenizer FILE|--model DIR --ids 1,2,3       token ids to text"},
    {"render", cmd_render, "--api chat|responses|messages REQUEST.json     render a request to a prompt"},
    {"run", cmd_run, "--model DIR --input F --output F               offline batch of requests"},
    {"bench", cmd_bench, "cpu|gpu|grammar|tokenizer|engine ...           benchmarks"},
};

static void usage(FILE *f) {
    fprintf(f, "deepinfer %s — offline inference for DeepSeek-V4.1-Flash\n\nusage: deepinfer COMMAND [options] [--json]\n\n",
            DI_VERSION_STRING);
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        fprintf(f, "  %-9s %s\n", k_cmds[i].name, k_cmds[i].usage);
    fprintf(f, "\nEvery command takes --json (one JSON document on stdout; logs on stderr).\n"
               "Commands that run a model take --device cpu|cuda (default cpu).\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 1 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("deepinfer %s\n", DI_VERSION_STRING);
        return 0;
    }
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        if (!strcmp(argv[1], k_cmds[i].name)) return k_cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "deepinfer: error: unknown command '%s' (see `deepinfer help`)\n", argv[1]);
    return 1;
}
