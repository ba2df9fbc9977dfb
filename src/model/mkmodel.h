/* Random-weight checkpoints in the exact official DeepSeek-V4.1-Flash layout.
 *
 * Real weights (510 GB) are not reachable from a development machine, so deepinfer writes its own
 * checkpoints: config.json (HF style, nested text_config), inference/config.json, shard files with
 * the native tensor names and dtypes (FP8 e4m3 + E8M0 32×32 block scales, packed FP4 experts + E8M0
 * per-32 scales, BF16, F32), model.safetensors.index.json, the Engram sidecar
 * engram_token_map.safetensors, and the tokenizer files when available. Weights are streamed to
 * disk tensor by tensor, so memory use does not grow with the model. */
#ifndef DI_MODEL_MKMODEL_H
#define DI_MODEL_MKMODEL_H

#include <stdint.h>

#include "deepinfer.h"

typedef struct di_mkmodel_opts {
    const char *preset;    /* one of di_mkmodel_presets: "tiny", "small", "full-layer" */
    uint64_t seed;         /* every tensor's stream is derived from (seed, tensor name) */
    const char *out_dir;   /* created if missing; existing files are overwritten */
    const char *tokenizer; /* tokenizer.json (or its directory) to copy in; NULL = look in data/tokenizer */
    /* Engram compressed-token map built from that tokenizer (text/engram_map.h), int32 [129280], and
     * its class count; NULL = a stub pairing tokens (2k, 2k+1 → k), as the reference's own random test
     * models do. The model layer does not depend on the text layer: the caller builds it. */
    const int32_t *token_map;
    int64_t token_map_classes;
} di_mkmodel_opts;

typedef struct di_mkmodel_stats {
    int64_t n_tensors;
    int n_shards;
    uint64_t tensor_bytes;
    int64_t engram_classes; /* compressed vocabulary of the written token map */
    int tokenizer_copied;   /* 1 when tokenizer files were copied */
    double seconds;
} di_mkmodel_stats;

/* Names of the built-in presets, NULL-terminated. */
extern const char *const di_mkmodel_presets[];

/* The two config documents of a preset (malloc'd JSON text). engram_classes is the compressed
 * vocabulary the Engram token map will have (it is a field of the config). */
int di_mkmodel_preset_configs(const char *preset, int64_t engram_classes, char **hf_json, char **inf_json,
                              di_error *err);

int di_mkmodel_write(const di_mkmodel_opts *opts, di_mkmodel_stats *stats, di_error *err);

#endif
