/* The expected tensor inventory of a DeepSeek-V4.1 checkpoint, derived from its config (spec
 * model.md §2.1–2.4, §4.8–4.9; names are the reference's native names, e.g.
 * `layers.7.attn.wq_b.weight`, `mtp.0.main_proj.scale`), and validation of a checkpoint against it.
 *
 * Dtype rules (config weight_fmt FP8 / expert_fmt FP4, the released layout):
 *   linear X        X.weight F8_E4M3 [out, in] + X.scale F8_E8M0 [ceil(out/32), ceil(in/32)]
 *   routed expert   X.weight I8 [out, in/2] (two E2M1 codes per byte) + X.scale F8_E8M0 [out, in/32]
 *   norms, router weight, compressor/indexer wk/weights_proj, embeddings  BF16
 *   hc_*, attn_sink, gate.bias(_vl)  F32
 * Optional parts: `ffn.gate.bias_vl` and the 266 vision tensors only with a vision config; Engram
 * tensors only on engram_layer_ids; DSpark stages only when dspark_block_size > 0. */
#ifndef DI_MODEL_INVENTORY_H
#define DI_MODEL_INVENTORY_H

#include <stdint.h>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/config.h"

typedef enum di_family {
    DI_FAM_EMBED,         /* embed.weight */
    DI_FAM_HEAD,          /* head.weight */
    DI_FAM_NORM,          /* block/final RMSNorm weights (attn_norm, ffn_norm, norm) */
    DI_FAM_MHC,           /* hc_{attn,ffn}_{fn,base,scale} */
    DI_FAM_ATTN,          /* attn_sink, wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b */
    DI_FAM_COMPRESSOR,    /* attn.compressor.* */
    DI_FAM_INDEXER,       /* attn.indexer.* */
    DI_FAM_ROUTER,        /* ffn.gate.{weight,bias,bias_vl} */
    DI_FAM_EXPERTS,       /* ffn.experts.E.* (routed) */
    DI_FAM_SHARED_EXPERT, /* ffn.shared_experts.* */
    DI_FAM_ENGRAM,        /* engram.* */
    DI_FAM_DSPARK,        /* DSpark-only parts: main_proj, main_norm, norm, markov_head, confidence_head */
    DI_FAM_VISION,        /* vision.*, aligner.*, image_{start,end,newline} */
    DI_FAM_COUNT
} di_family;

const char *di_family_name(di_family f); /* "embed", "head", "norm", "mhc", ... */

typedef struct di_inv_entry {
    char name[112];
    di_dtype dtype;
    int ndim;
    int64_t shape[DI_MAX_DIMS];
    int layer;       /* -1 global; 0..n_layers-1 backbone; n_layers+s for DSpark stage s (mtp.s) */
    di_family family;
    int64_t params;  /* logical parameters (FP4 I8 bytes count 2; scales count 0) */
} di_inv_entry;

/* Every expected tensor, in a stable readable order: embed, layers.0 … layers.N-1 (each block:
 * Engram, mHC, norms, attention, compressor, indexer, router, routed experts 0…E-1 (w1, w2, w3),
 * shared expert, then the DSpark-only parts of mtp stages), norm, head, mtp.0 …, then vision.
 * *out is malloc'd (free()); *n its length. */
int di_inventory_build(const di_config *cfg, di_inv_entry **out, int64_t *n, di_error *err);

/* Validates a checkpoint against the inventory: names every missing, extra or mis-shaped/mis-typed
 * tensor (count + the first few names in the message; "expected F8_E4M3 [512,256], found BF16
 * [512,256] in FILE"). DI_ERR_INVALID when anything differs. */
int di_inventory_validate(const di_config *cfg, const di_checkpoint *ck, di_error *err);

/* Stored bytes of one entry (numel × dtype size). */
int64_t di_inv_entry_bytes(const di_inv_entry *e);
/* True for the Engram hash tables themselves (engram.embed.weight / .scale): the part spec §2.1/§7.1
 * counts separately from the backbone. */
int di_inv_is_engram_table(const di_inv_entry *e);

/* Totals of an inventory, as spec §2.1/§2.4/§7.1 state them. Partition of params and bytes:
 * backbone (globals + layers, Engram tables excluded) + engram tables + dspark (mtp.*) + vision. */
typedef struct di_inv_totals {
    int64_t n_tensors, bytes, params;
    int64_t n_text_tensors;            /* everything except vision */
    int64_t text_bytes;
    int64_t n_fp4_matrices;            /* I8 packed-FP4 weights */
    int64_t dtype_count[DI_DTYPE_COUNT], dtype_bytes[DI_DTYPE_COUNT];
    int64_t family_count[DI_FAM_COUNT], family_bytes[DI_FAM_COUNT], family_params[DI_FAM_COUNT];
    int64_t backbone_params, engram_params, dspark_params, vision_params;
    int64_t backbone_bytes, engram_bytes, dspark_bytes, vision_bytes;
} di_inv_totals;
void di_inventory_totals(const di_inv_entry *e, int64_t n, di_inv_totals *t);

/* Tensors of one stage (layer id as in di_inv_entry.layer; -1 = globals, -2 = vision). */
int64_t di_inventory_count_layer(const di_inv_entry *e, int64_t n, int layer);

/* "[512,256]" */
void di_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);

#endif
