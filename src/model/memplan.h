/* Memory plan: what a run of a V4.1 config needs, on the device and on the host, computed from the
 * config alone (no weights are opened) so it can be printed before loading and a model that does not
 * fit is refused up front with the category that overflows and by how much (issue 10 item 5).
 *
 * Categories (device = the memory the forward runs from: GPU memory for cuda, RAM for cpu):
 *   weights     the tensor inventory (inventory.h) by family, stored bytes, except attn.wo_a: the
 *               reference dequantizes it to bf16 at load (spec §2.2), so its device bytes are
 *               out·in·2 and its scale is not kept (+33.5 MB per stage at the real size).
 *               cuda only: the Engram tables (203 GB released; 24 rows read per token per Engram
 *               layer, ≈12 KB) stay host-resident by default; routed experts optionally too. On cpu
 *               host and device are one memory and every weight counts as device.
 *               The vision tower is counted only with opts.vision (the text engine does not load it).
 *   caches      max_seqs × di_cache_size_of(max_tokens, spec_margin).total_bytes (cache.h).
 *   workspace   activations of one forward step of N tokens (formula below).
 *   staging     cuda with host experts only: the device copy of the experts one layer can touch,
 *               2 × min(E, N·K) × (one expert's stored bytes): the next layer's upload overlaps this
 *               layer's GEMMs (double buffer).
 *   reserve     cuda only: 1 GiB for the CUDA context, cuBLAS/cuBLASLt workspaces and allocator slack.
 *               Measured on an H200 (2026-11-30, nvidia-smi 143,771 MiB): cudaMemGetInfo total 139.80
 *               GiB, free after context creation 139.29 GiB, after cublasCreate 139.22 GiB, largest
 *               single cudaMalloc 139.19 GiB. The default capacity (139 GiB) minus the reserve plans
 *               138 GiB, 1.2 GiB under what is allocatable.
 *
 * Workspace formula. N = min(max(prefill_chunk, max_seqs · v), max_seqs · max_tokens), v = tokens a
 * sequence verifies per decode step (dspark_block_size + 1 with draft stages, else 1): the largest
 * step the scheduler may form. The per-token bytes of each phase of a block (bf16 = 2 B, f32 = 4 B,
 * FP8 activation copies 1 B + 1 B per 32 for the E8M0 scale; D hidden, hc streams, H heads × hd,
 * qr q_lora_rank, G·or grouped output rank, ih × ihd indexer heads, E/K routed experts of the widest
 * stage, I moe width, V vocab):
 *   residual   2 · hc·D bf16                       the block's input and output streams
 *   mhc        ((2+hc)·hc + 2·hc + hc²) f32 + 2·D bf16   mixes, pre/post, comb; collapsed and norm'd input
 *   attention  qr + 2·H·hd + hd + G·or + ih·ihd bf16 + (G·or + G·or/32) FP8 copy (wo_b's input; the
 *              widest quantized GEMM input, wo_a runs in bf16) + ih f32
 *              + min(ncmp, DI_MEMPLAN_INDEX_TILE) f32 index scores + (index_topk + W) int32 ids,
 *              ncmp = max_tokens / (smallest ratio an indexer scores): the indexer keeps a running
 *              top-k over key tiles, so a tile of scores per query is live, not the whole row
 *   moe        E f32 router logits + K·(id, weight) + K · (D bf16 + D FP8 + 2·I f32 + I bf16 + I FP8
 *              + D f32) dispatched rows + (2·I f32 + I bf16 + D f32) shared expert
 *   engram     (G−1)·n_heads · (8 B id + ehd bf16) + (hc+1)·D bf16   (only with Engram layers)
 *   logits     V f32                                [N, V] logits of the step (sampling, verify)
 *   workspace = N · (residual + mhc + max(attention, moe, engram) + logits), attention plus once per
 *              step the compressed rows a backend gather holds (forward_block.c: T·index_topk rows of
 *              hd bf16, a longer step gathering in slices of ⌊DI_MEMPLAN_GATHER_ROWS / index_topk⌋
 *              tokens): min(N, ⌊DI_MEMPLAN_GATHER_ROWS / index_topk⌋) · index_topk · hd bf16 (256 MiB
 *              at the released dimensions)
 * It is an upper bound for the engine's scheduler, not a measurement: the engine must not form a
 * step of more than N tokens, and kernels must tile the indexer as stated.
 *
 * Fit: device: weights, then caches, then workspace + staging + reserve are added in that order;
 * the first category whose running sum passes the capacity is named in the reason with the overflow.
 * Host (cuda): the host-resident weights against host memory. The largest fit is searched exactly:
 * max_seqs_fit = the most sequences of max_tokens that fit, max_tokens_fit = the longest context
 * (≤ max_position_embeddings) that max_seqs sequences fit with; both are monotone in their argument,
 * so a binary search is exact (one more does not fit). */
#ifndef DI_MODEL_MEMPLAN_H
#define DI_MODEL_MEMPLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "deepinfer.h"
#include "model/cache.h"
#include "model/cache_pool.h"
#include "model/config.h"
#include "model/inventory.h"

#define DI_MEMPLAN_H200_BYTES ((int64_t)139 << 30)  /* usable memory of one H200 (139 GiB) */
#define DI_MEMPLAN_CUDA_RESERVE ((int64_t)1 << 30)  /* CUDA context, BLAS workspaces, allocator slack */
#define DI_MEMPLAN_CHUNK_DEFAULT 2048               /* prefill tokens per step */
#define DI_MEMPLAN_INDEX_TILE 65536                 /* compressed keys scored per query per tile */
#define DI_MEMPLAN_GATHER_ROWS 262144               /* T·index_topk rows a step's backend gather may hold */
#define DI_MEMPLAN_MAX_SEQS ((int64_t)1 << 20)
#define DI_MEMPLAN_MAX_CHUNK ((int64_t)1 << 20)

typedef enum di_plan_device { DI_PLAN_CPU = 0, DI_PLAN_CUDA = 1 } di_plan_device;

const char *di_plan_device_name(di_plan_device d); /* "cpu", "cuda" */

typedef struct di_memplan_opts {
    di_plan_device device;
    int64_t device_bytes;   /* capacity; 0 = 139 GiB (cuda) or MemAvailable (cpu) */
    int64_t host_bytes;     /* cuda: host memory for host-resident weights; 0 = MemAvailable */
    int64_t max_seqs;       /* concurrent sequences, 1 … DI_MEMPLAN_MAX_SEQS */
    int64_t max_tokens;     /* per sequence; 0 = max_position_embeddings */
    int spec_margin;        /* rollback reserve of the caches (cache.h), 0 … 1024; < 0 = the config's default */
    int64_t prefill_chunk;  /* prefill tokens per step; 0 = DI_MEMPLAN_CHUNK_DEFAULT */
    bool engram_on_host;    /* cuda: Engram tables in host memory (default true) */
    bool experts_on_host;   /* cuda: routed experts in host memory, streamed per layer (default false) */
    bool vision;            /* count the vision tower (default false: the text engine does not load it) */
} di_memplan_opts;

/* Defaults for a device: capacity 0 (resolved at compute time), 1 sequence of max_position_
 * embeddings tokens, DI_CACHE_SPEC_MARGIN_DEFAULT, Engram tables on the host, experts on the device. */
void di_memplan_opts_default(di_memplan_opts *o, di_plan_device device);

/* Weight groups of the plan: one per di_family, plus the Engram tables split off DI_FAM_ENGRAM
 * (the family keeps the Engram projections, which stay on the device). */
#define DI_PLAN_ENGRAM_TABLES DI_FAM_COUNT
#define DI_PLAN_WGROUPS (DI_FAM_COUNT + 1)
const char *di_plan_wgroup_name(int g); /* di_family_name, or "engram tables" */

/* Workspace parts, bytes for the whole step (see the formula above). */
typedef struct di_plan_workspace {
    int64_t tokens;                       /* N */
    int64_t residual, mhc, attention, moe, engram, logits;
    int64_t total;                        /* residual + mhc + max(attention, moe, engram) + logits */
} di_plan_workspace;

typedef struct di_memplan {
    di_memplan_opts opts;                 /* as resolved: capacities and defaults filled in */
    /* ---- weights ---- */
    int64_t weight_dev[DI_PLAN_WGROUPS];  /* bytes per group in device memory (wo_a as bf16) */
    int64_t weight_host[DI_PLAN_WGROUPS]; /* bytes per group left in host memory (cuda) */
    int64_t weights_stored;               /* stored bytes of every counted tensor (text [+ vision]) */
    int64_t weights_stored_no_engram;     /* the same without the Engram tables */
    int64_t wo_a_extra;                   /* device bytes the bf16 wo_a copies add over FP8 + scale */
    int64_t weights_dev, weights_host;
    int64_t expert_bytes;                 /* stored bytes of the largest routed expert (w1+w2+w3+scales) */
    /* ---- per-run state ---- */
    di_cache_size cache;                  /* one sequence */
    int64_t caches_dev;                   /* max_seqs · cache.total_bytes */
    /* the same caches paged (cache_pool.h, pages of DI_CACHE_PAGE_TOKENS_DEFAULT): one fixed slot per
     * sequence + the pages max_seqs full sequences hold — what the engine's --cache-mb must give for
     * this run never to preempt (shorter sequences share the pages) */
    di_cache_pool_size pool;              /* unit sizes (n_pages = n_slots = 1) */
    int64_t pool_pages, pool_bytes;
    di_plan_workspace ws;
    int64_t staging_dev;                  /* host-expert double buffer (cuda, experts on host) */
    int64_t reserve_dev;
    /* ---- totals and verdict ---- */
    int64_t device_total, host_total;
    int64_t device_capacity, host_capacity; /* host_capacity 0 on cpu (one memory) */
    bool fits;
    char reason[640];                     /* why not (one line); "" when it fits */
    int64_t max_seqs_fit;                 /* most sequences of opts.max_tokens that fit (0: none;
                                             at most DI_MEMPLAN_MAX_SEQS) */
    int64_t max_tokens_fit;               /* longest context for opts.max_seqs sequences (0: none) */
} di_memplan;

/* Compute the plan. Returns DI_OK with plan->fits false when the model does not fit (the plan is
 * still complete, for printing); an error only for bad options or an unreadable /proc/meminfo. */
int di_memplan_compute(const di_config *cfg, const di_memplan_opts *opts, di_memplan *plan, di_error *err);

/* DI_ERR_LIMIT with plan->reason when the plan does not fit, else DI_OK. */
int di_memplan_check(const di_memplan *plan, di_error *err);

/* The plan as a table (what `deepinfer plan` and a run print before loading). */
void di_memplan_print(const di_memplan *plan, FILE *f);

/* The check a run makes before it opens any weight file: loads DIR's config.json, computes the plan
 * for `device` with max_seqs sequences of max_tokens tokens (0 = max_position_embeddings; a value
 * above it is clamped, the run itself rejects long prompts with its own message), writes the plan's
 * totals on one line to `log` (NULL: silent) and returns DI_ERR_LIMIT naming the category that
 * overflows when the model cannot fit — e.g. the full V4.1 (≈ 510 GB) on one GPU is refused before
 * a byte of it is read. `deepinfer plan` prints the whole table. */
int di_memplan_preflight(const char *model_dir, di_plan_device device, int64_t max_seqs, int64_t max_tokens,
                         FILE *log, di_error *err);

/* MemAvailable of /proc/meminfo in bytes. */
int di_memplan_host_available(int64_t *bytes, di_error *err);

/* "139GiB", "149.25 GB", "512MiB", "1e9", "1073741824": decimal (KB MB GB TB) and binary (KiB MiB
 * GiB TiB) suffixes, case-insensitive, an optional B; a plain number is bytes. */
int di_memplan_parse_bytes(const char *s, int64_t *out, di_error *err);

/* "509.32 GB" (decimal units, as spec §7 states sizes). */
void di_memplan_fmt_bytes(int64_t bytes, char *buf, size_t n);

#endif
