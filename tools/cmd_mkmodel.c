/* deepinfer mkmodel — write a random-weight checkpoint in the official V4.1 layout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "model/mkmodel.h"
#include "text/engram_map.h"
#include "text/tokenizer.h"
#include "text/tokenizer_v41.h"
#include "util/fs.h"

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
    /* The model ships a tokenizer and the Engram token map built from it. By default that is the
     * official V4 file rewritten to the V4.1 added-token layout (text/tokenizer_v41.h says why); with
     * --tokenizer, the given file as it is. Without any, the generator falls back to a stub map. */
    const char *tok_path = tok ? tok : DI_TOKENIZER_DEFAULT_PATH;
    char derived[4200];
    di_tokenizer *tk = NULL;
    int32_t *map = NULL, classes = 0;
    if (!tok && access(tok_path, R_OK) == 0) {
        snprintf(derived, sizeof derived, "%s/tokenizer.json", out);
        if (di_mkdir_p(out, &err) != DI_OK || di_tok_write_v41_layout(tok_path, derived, &err) != DI_OK) {
            rc = cli_fail_err(&cli, &err);
            goto done;
        }
        tok_path = derived;
        o.tokenizer_in_place = 1;
    }
    if (di_tok_load(tok_path, &tk, &err) == DI_OK) {
        int brc = di_engram_map_build(tk, &map, &classes, &err);
        di_tok_free(tk);
        if (brc != DI_OK) {
            rc = cli_fail_err(&cli, &err);
            goto done;
        }
        o.token_map = map;
        o.token_map_classes = classes;
    } else if (tok) {
        rc = cli_fail_err(&cli, &err);
        goto done;
    } else {
        fprintf(stderr, "mkmodel: no tokenizer at %s: using a stub Engram token map\n", tok_path);
        di_error_clear(&err);
    }
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
