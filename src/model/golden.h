/* Fidelity checks against golden data from the official reference (../shared/golden/README.md):
 * free-running prefill against the case's noise floor, teacher-forced blocks, top-k on the reference's
 * own index scores, and index-score drift in bf16 ulps. `deepinfer verify` prints this report; the
 * tests assert on it.
 *
 * A golden case = golden.safetensors (prompt_ids, prompt_logits, prefill_embed, prefill_layer{i}_out /
 * _premix / _index_scores / _topk) + case.json next to it (noise_floor per layer output and for the
 * prompt logits). */
#ifndef DI_MODEL_GOLDEN_H
#define DI_MODEL_GOLDEN_H

#include <stdbool.h>
#include <stdint.h>

#include "io/safetensors.h"
#include "model/forward.h"

typedef struct di_golden {
    di_safetensors *st;
    char *path;
    int64_t T;
    int n_layers;
    const int32_t *prompt_ids;     /* int32 [T] */
    const float *prompt_logits;    /* f32 [T, V] */
    const uint16_t *embed;         /* bf16 [T, D] */
    const uint16_t **layer_out;    /* [n_layers] bf16 [T, hc, D] */
    const float **premix;          /* [n_layers] f32 [T, hc] */
    const float **index_scores;    /* [n_layers] f32 [T, T/R] or NULL */
    const int32_t **topk;          /* [n_layers] int32 [T, k] or NULL */
    int *topk_k;                   /* [n_layers] */
    int64_t *n_keys;               /* [n_layers] T/R of index layers */
    double *floor_layer;           /* [n_layers] noise floor of prefill_layer{i}_out (NAN if absent) */
    double floor_logits;           /* noise floor of prompt_logits (NAN if absent) */
    char case_name[64];
} di_golden;

/* Opens golden.safetensors at `path`, checks every tensor's dtype and shape against cfg, and reads
 * the noise floors from case.json in the same directory. Data is zero-copy (unaligned views are
 * copied once where the format requires alignment). */
int di_golden_open(const char *path, const di_config *cfg, di_golden **out, di_error *err);
void di_golden_close(di_golden *g);

typedef struct di_verify_opts {
    bool free_running;        /* run check (a) */
    bool teacher_forced;      /* run check (b) */
    double tf_bound;          /* per-block teacher-forced relative error bound (1.5e-2) */
    double floor_mult;        /* free-running bound = floor_mult × noise floor (3) */
    int tie_ulps;             /* k-th vs (k+1)-th score gap counted as a tie, in bf16 ulps (2) */
    const char *dump_path;    /* safetensors with prompt_logits, prefill_layer{i}_out, tf_layer{i}_out */
    const char *kernels_path; /* kernels.safetensors for the op-level checks, or NULL to skip them */
    const char *stages_path;  /* every named stage tensor of both runs ("free.L3.attn.q", "tf.L3.out", ...) */
    di_fwd_opts fwd;          /* dumps and graph faults */
} di_verify_opts;

void di_verify_opts_default(di_verify_opts *o);

typedef struct di_verify_layer {
    double free_rel;          /* ‖ours − ref‖/‖ref‖ of prefill_layer{i}_out, free-running */
    double free_premix_rel;
    double floor;             /* noise floor of this layer output */
    bool free_ok;
    double tf_rel;            /* teacher-forced block output */
    double tf_premix_rel;
    bool tf_ok;
    bool has_index;           /* index-source layer */
    int topk_k;
    int64_t topk_rows, topk_identical, topk_tied, topk_bad; /* our top-k on the reference's scores */
    int64_t drift_n, drift_differ, drift_mask_mismatch;     /* our TF index scores vs the reference's */
    double drift_max_ulps, drift_mean_ulps;
} di_verify_layer;

/* Op-level checks on kernels.safetensors (golden README table: one bound per vector). */
#define DI_VERIFY_MAX_OPS 32
typedef struct di_verify_op {
    char name[32];
    char metric[48];
    double value, bound;
    bool ok;
} di_verify_op;

typedef struct di_verify_ops_report {
    int n;
    di_verify_op ops[DI_VERIFY_MAX_OPS];
    bool pass;
    char first_failure[160];
} di_verify_ops_report;

/* Runs the reference kernel vectors through the backend's op slots (with the graph faults that act
 * on them: sink, Sinkhorn iterations) and checks each against its README bound. */
int di_verify_ops(const di_backend *be, const char *kernels_path, const di_graph_faults *faults,
                  di_verify_ops_report *r, di_error *err);

typedef struct di_verify_report {
    int n_layers;
    int64_t T;
    di_verify_layer *layers;   /* [n_layers] */
    double logits_rel, logits_floor;
    bool logits_ok;
    int64_t argmax_agree;      /* prompt positions whose argmax matches the reference */
    bool has_ops;
    di_verify_ops_report ops;  /* when opts.kernels_path is set */
    bool pass;
    char first_failure[256];   /* "" when pass */
} di_verify_report;

int di_verify_run(const di_model *m, const di_backend *be, const di_golden *g, const di_verify_opts *o,
                  di_verify_report *rep, di_error *err);
void di_verify_report_free(di_verify_report *r);

/* ‖a − b‖₂ / ‖b‖₂ in double (0 when both are zero). */
double di_rel_err_bf16(const uint16_t *a, const uint16_t *b, int64_t n);
double di_rel_err_f32(const float *a, const float *b, int64_t n);
/* Distance in bf16 ulps between two bf16-exact finite floats (ordered-integer distance). */
int64_t di_bf16_ulps(float a, float b);

#endif
