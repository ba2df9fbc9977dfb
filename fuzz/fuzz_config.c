/* libFuzzer harness for the config parser (di_config_parse) and what consumes a parsed config
 * (inventory, cache footprint, Engram layout).
 *
 * Input: config.json bytes, optionally followed by a NUL byte and inference/config.json bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "model/engram_consts.h"
#include "model/inventory.h"
#include "util/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int quiet;
    if (!quiet) {
        di_log_set_level(DI_LOG_ERROR); /* HF/inference disagreements warn on every input */
        quiet = 1;
    }
    const uint8_t *nul = memchr(data, 0, size);
    size_t hf_len = nul ? (size_t)(nul - data) : size;
    const char *inf = nul ? (const char *)nul + 1 : NULL;
    size_t inf_len = nul ? size - hf_len - 1 : 0;

    static di_config cfg;
    di_error err;
    if (di_config_parse((const char *)data, hf_len, inf, inf_len, "fuzz", &cfg, &err) != DI_OK) {
        if (!memchr(err.msg, 0, sizeof err.msg)) abort(); /* message must be terminated */
        return 0;
    }
    /* a valid config must yield a consistent role table */
    for (int L = 0; L < cfg.n_stages; L++) {
        const di_layer_cfg *l = &cfg.layer[L];
        if (l->compress_ratio > 0 && (l->kv_source < 0 || l->kv_source > L || l->index_source < 0)) abort();
        if (l->kv_source >= 0 && !cfg.layer[l->kv_source].is_kv_source) abort();
        di_cache_footprint f;
        di_cache_footprint_of(&cfg, L, &f);
        if (f.window_bytes <= 0 || f.per_token_bytes < 0) abort();
    }
    /* inventory size is linear in stages × experts; keep each run fast */
    int64_t est = 0;
    for (int L = 0; L < cfg.n_stages; L++) est += 6LL * cfg.layer[L].n_experts + 64;
    if (cfg.has_vision) est += 8LL * cfg.vision.num_hidden_layers;
    if (est < 20000) {
        di_inv_entry *v;
        int64_t n;
        if (di_inventory_build(&cfg, &v, &n, &err) == DI_OK) {
            di_inv_totals t;
            di_inventory_totals(v, n, &t);
            if (t.n_tensors != n) abort();
            free(v);
        }
    }
    if (cfg.n_engram_layers && cfg.engram_vocab_size < 100000 &&
        (int64_t)cfg.n_engram_layers * (cfg.engram_max_ngram_size - 1) * cfg.engram_n_heads < 256) {
        di_engram_consts c;
        if (di_engram_consts_load(&cfg, NULL, &c, &err) == DI_OK) di_engram_consts_free(&c);
    }
    di_config_free(&cfg);
    return 0;
}
