/* Binding a validated V4.1 checkpoint to per-layer weight structs (spec model.md §2.4).
 *
 * Every pointer is a zero-copy view into the mmapped safetensors shards, except wo_a (below) and the
 * rare multi-byte tensor whose file offset is not a multiple of its element size (safetensors does
 * not align tensors; such a view is copied once so kernels never load misaligned f32/bf16). wo_a: the reference
 * (convert.py / Attention) dequantizes it from FP8 to bf16 once at load and runs the grouped output
 * projection as a bf16 GEMM, so it is dequantized here too and owned by di_weights.
 * Shapes below use: D = hidden_size, H = heads, hd = head_dim, qr = q_lora_rank, G = o_groups,
 * orr = o_lora_rank, ih/ihd = index heads / head dim, E = routed experts, I = moe_intermediate_size,
 * hc = hc_mult, nmix = (2+hc)·hc, V = vocab. FP8 weights carry E8M0 scales [ceil(n/32), ceil(k/32)];
 * FP4 weights are packed [n, k/2] with E8M0 scales [n, k/32]. */
#ifndef DI_MODEL_WEIGHTS_H
#define DI_MODEL_WEIGHTS_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/engram_consts.h"

typedef struct di_w_fp8 {
    const uint8_t *w; /* e4m3 [n, k] */
    const uint8_t *s; /* E8M0 [ceil(n/32), ceil(k/32)] */
    int64_t n, k;
} di_w_fp8;

typedef struct di_w_fp4 {
    const uint8_t *w; /* packed E2M1 [n, k/2] (low nibble = even column) */
    const uint8_t *s; /* E8M0 [n, k/32] */
    int64_t n, k;
} di_w_fp4;

typedef struct di_expert_w {
    di_w_fp4 w1; /* gate proj [I, D] */
    di_w_fp4 w3; /* up proj   [I, D] */
    di_w_fp4 w2; /* down proj [D, I] */
} di_expert_w;

typedef struct di_layer_w {
    /* mHC */
    const float *hc_attn_fn, *hc_ffn_fn;       /* f32 [nmix, hc·D] */
    const float *hc_attn_base, *hc_ffn_base;   /* f32 [nmix] */
    const float *hc_attn_scale, *hc_ffn_scale; /* f32 [3] */
    const uint16_t *attn_norm, *ffn_norm;      /* bf16 [D] */

    /* attention */
    const float *attn_sink;    /* f32 [H] */
    di_w_fp8 wq_a;             /* [qr, D] */
    const uint16_t *q_norm;    /* bf16 [qr] */
    di_w_fp8 wq_b;             /* [H·hd, qr] */
    di_w_fp8 wkv;              /* [hd, D] */
    const uint16_t *kv_norm;   /* bf16 [hd] */
    uint16_t *wo_a;            /* bf16 [G·orr, H·hd/G], owned: dequantized from FP8 at load */
    di_w_fp8 wo_b;             /* [D, G·orr] */

    /* compressor (kv sources only; NULL elsewhere) */
    const uint16_t *cmp_wkv;   /* bf16 [hd, D] */
    const uint16_t *cmp_wgate; /* bf16 [hd, D]; ratio > 1 only */
    const uint16_t *cmp_norm;  /* bf16 [hd] */

    /* indexer (index sources only) */
    di_w_fp8 idx_wq_b;                 /* [ih·ihd, qr] */
    const uint16_t *idx_weights_proj;  /* bf16 [ih, D] */
    const uint16_t *idx_wk;            /* bf16 [ihd, hd]; sources that own index keys */
    const uint16_t *idx_k_norm;        /* bf16 [ihd] */

    /* MoE */
    const uint16_t *gate_w;    /* bf16 [E, D] router */
    const float *gate_bias;    /* f32 [E] */
    di_expert_w *experts;      /* [E], owned array of views */
    di_w_fp8 sh_w1, sh_w3;     /* shared expert [I, D] */
    di_w_fp8 sh_w2;            /* shared expert [D, I] */

    /* Engram (engram layers only; applied to the streams before the block) */
    const uint8_t *eg_table;       /* e4m3 [rows, ehd] */
    const uint8_t *eg_table_scale; /* E8M0 [rows, ehd/32] */
    int64_t eg_rows;
    di_w_fp8 eg_wkv;               /* [(hc+1)·D, (max_ngram−1)·eheads·ehd] */
    const uint16_t *eg_q, *eg_k;   /* bf16 [hc, D] */

    /* DSpark draft stages (spec §4.9): stage 0 maps the target-layer features, the last stage holds
     * the draft head (NULL / zero elsewhere). ntgt = number of DSpark target layers, Rm = markov rank. */
    di_w_fp8 main_proj;              /* [D, ntgt·D] (stage 0) */
    const uint16_t *main_norm;       /* bf16 [D] (stage 0) */
    const uint16_t *head_norm;       /* bf16 [D] mtp.S.norm (last stage) */
    const uint16_t *markov_embed;    /* bf16 [V, Rm] (last stage) */
    const uint16_t *markov_head;     /* bf16 [V, Rm] (last stage) */
    const uint16_t *conf_proj;       /* bf16 [1, D + Rm] confidence head (last stage) */
} di_layer_w;

/* One bound tensor as the weight structs see it: where its pointer is stored, the host bytes it
 * points to, and whether it stays host-resident (mapped) when the weights move to a device. */
typedef struct di_w_slot {
    const void **slot;  /* address of the pointer field in di_weights / di_layer_w / di_expert_w */
    const void *host;   /* the host view (mmapped or owned copy) */
    int64_t bytes;
    bool mapped;        /* the Engram tables: read in place over the bus (backend.h mem_map_host) */
} di_w_slot;

typedef struct di_weights {
    const uint16_t *embed; /* bf16 [V, D] */
    const uint16_t *head;  /* bf16 [V, D] */
    const uint16_t *norm;  /* bf16 [D] final norm */
    int n_layers;
    int n_stages;          /* n_layers + DSpark stages */
    di_layer_w *layers;    /* [n_stages] backbone blocks, then the DSpark stages (mtp.S) */
    void **owned;          /* aligned copies of views the mapping does not align to their element size */
    int64_t n_owned, cap_owned;
    di_w_slot *slots;      /* [n_slots] every bound tensor (di_weights_to_backend) */
    int64_t n_slots, cap_slots;
    const di_backend *be;  /* backend holding the tensors, NULL while they are host views */
    void *dev;             /* backend block holding every non-mapped tensor */
} di_weights;

/* Binds every backbone tensor, checking each one's dtype and shape against cfg (the message names the
 * tensor, the expected and the found dtype/shape). */
int di_weights_bind(const di_config *cfg, const di_checkpoint *ck, di_weights *out, di_error *err);
void di_weights_free(di_weights *w);

/* Moves the weights where `be` computes: for a backend without host memory every tensor is copied
 * into one block of its memory (once, at load) and the Engram tables are mapped in place
 * (mem_map_host: they are large and each token reads a few rows); the pointers in the weight structs
 * then refer to backend memory. A no-op for the CPU backend. The backend must outlive the weights
 * (close the model before destroying the backend). */
int di_weights_to_backend(di_weights *w, const di_backend *be, di_error *err);

/* A loaded model: config, open checkpoint (the mapping the views point into), bound weights and the
 * Engram hash constants. */
typedef struct di_model {
    di_config cfg;
    di_checkpoint *ck;
    di_weights w;
    di_engram_consts eg;
} di_model;

/* Loads config.json (+ inference/config.json), opens the shards, validates the inventory, binds. */
int di_model_open(const char *dir, di_model **out, di_error *err);
/* di_weights_to_backend on the model's weights. */
int di_model_to_backend(di_model *m, const di_backend *be, di_error *err);
/* Frees the model, its device weights on the backend it was uploaded to: close the model before
 * destroying that backend. */
void di_model_close(di_model *m);

#endif
