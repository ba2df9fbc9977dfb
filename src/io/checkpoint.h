/* A Hugging Face checkpoint directory: config.json (+ inference/config.json), safetensors shard(s)
 * listed by model.safetensors.index.json (or a single model.safetensors), and optional sidecars
 * (engram_token_map.safetensors, tokenizer files). Tensors are looked up by their native names. */
#ifndef DI_IO_CHECKPOINT_H
#define DI_IO_CHECKPOINT_H

#include "io/safetensors.h"

typedef struct di_ckpt_entry {
    const di_tensor_info *info; /* owned by shards[shard] */
    int shard;
} di_ckpt_entry;

typedef struct di_checkpoint {
    char *dir;
    int n_shards;
    di_safetensors **shards;
    int64_t n_tensors;
    di_ckpt_entry *entries; /* sorted by name */
    uint64_t total_bytes;   /* sum of tensor byte sizes */
} di_checkpoint;

/* Opens every shard (each validated by di_st_open) and cross-checks them with the index: the index
 * is JSON with a non-empty object 'weight_map' of tensor → shard file name; each shard name is a
 * plain file name inside `dir` (no '/', '.' or '..') of an existing file that holds the tensor; no
 * shard holds a tensor the index does not list for it; metadata.total_size (when present) equals
 * the sum of tensor byte sizes. Without an index, `dir`/model.safetensors is the whole checkpoint.
 * Errors name the index or shard file and the tensor. */
int di_ckpt_open(const char *dir, di_checkpoint **out, di_error *err);
void di_ckpt_close(di_checkpoint *ck);
const di_tensor_info *di_ckpt_find(const di_checkpoint *ck, const char *name);
/* Which shard file holds the tensor (for messages), or NULL. */
const char *di_ckpt_shard_path(const di_checkpoint *ck, const char *name);

/* Join dir and name into a malloc'd path. */
char *di_path_join(const char *dir, const char *name);

#endif
