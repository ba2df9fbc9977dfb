/* deepinfer mkmodel — write a random-weight checkpoint in the official V4.1 layout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "model/mkmodel.h"
#include "text/engram_map.h"
#include "text/tokenizer.h"

int cmd_mkmodel(int argc, char **argv) {
    di_args a;
    cli_args_init(&a, argc, argv);
    di_cli cli = {.cmd = "mkmodel", .json = cli_flag(&a, "json")};
    const char *preset = cli_str(&a, "preset", "tiny");
    const char *out = cli_str(&a, "out", NULL);
    const char *tok = cli_str(&a, "tokenizer", NULL);
    long long seed;
    int rc = 1;
    if (!cli_int(&cli, &a, "seed", 1, 0, (long long)9e18, &seed)) goto done;
    if (!cli_check_unused(&cli, &a)) goto done;
    if (!preset || !out) {
        rc = cli_fail(&cli, "usage: deepinfer mkmodel --preset tiny|small|full-layer --seed N --out DIR "
                            "[--tokenizer FILE]");
        goto done;
    }
    di_mkmodel_opts o = {.preset = preset, .seed = (uint64_t)seed, .out_dir = out, .tokenizer = tok};
    di_mkmodel_stats st;
    di_error err = {0};
    /* The Engram token map comes from the tokenizer shipped with the model (the official one in
     * data/tokenizer unless --tokenizer names another); without one the generator uses a stub map. */
    const char *tok_path = tok ? tok : "data/tokenizer/deepseek-v4/tokenizer.json";
    di_tokenizer *tk = NULL;
    int32_t *map = NULL, classes = 0;
    if (di_tok_load(tok_path, &tk, &err) == DI_OK) {
        if (di_engram_map_build(tk, &map, &classes, &err) != DI_OK) {
            di_tok_free(tk);
            rc = cli_fail_err(&cli, &err);
            goto done;
        }
        o.token_map = map;
        o.token_map_classes = classes;
        if (!tok) o.tokenizer = tok_path;
    } else if (tok) {
        rc = cli_fail_err(&cli, &err);
        goto done;
    } else {
        fprintf(stderr, "mkmodel: no tokenizer at %s: using a stub Engram token map\n", tok_path);
    }
    di_tok_free(tk);
    fprintf(stderr, "mkmodel: writing preset '%s' (seed %lld) to %s\n", preset, seed, out);
    int wrc = di_mkmodel_write(&o, &st, &err);
    free(map);
    if (wrc != DI_OK) {
        rc = cli_fail_err(&cli, &err);
        goto done;
    }
    if (cli.json) {
        rc = cli_emit(&cli, json_pack("{s:s, s:s, s:I, s:I, s:i, s:I, s:I, s:b, s:f}", "preset", preset, "out", out,
                                      "seed", (json_int_t)seed, "tensors", (json_int_t)st.n_tensors, "shards",
                                      st.n_shards, "tensor_bytes", (json_int_t)st.tensor_bytes, "engram_classes",
                                      (json_int_t)st.engram_classes, "tokenizer_copied", st.tokenizer_copied,
                                      "seconds", st.seconds));
    } else {
        printf("wrote %s: preset %s, %lld tensors in %d shard(s), %.1f MB, engram classes %lld, tokenizer %s, %.2f s\n",
               out, preset, (long long)st.n_tensors, st.n_shards, (double)st.tensor_bytes / 1e6,
               (long long)st.engram_classes, st.tokenizer_copied ? "copied" : "absent", st.seconds);
        rc = 0;
    }
done:
    cli_args_free(&a);
    return rc;
}
