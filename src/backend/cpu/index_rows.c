/* The batched index-selection slots of the CPU backend (backend.h "batched index selection"): every
 * listed row run through the table's own per-sequence op on that row alone (indexer_scores,
 * candidate_mask, topk), every listed sequence through its gather_topk. They are the calls the graph
 * makes without the slots, row by row, so they are bit-identical to them by construction; the CUDA
 * kernels (cuda_index_seqs.cu) are tested against this definition. */
#include <stdlib.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_rows.h"
#include "util/error.h"

/* A row the per-sequence ops would refuse is refused here, naming it. */
static int check_row(const char *op, const di_index_row *r, int64_t i, int64_t w_max, di_error *err) {
    if (r->nk < 0 || r->w < 0 || r->w > r->nk || r->w > w_max || r->vis < 0 || r->vis > r->w || r->k < 0 ||
        r->k > r->w || r->kp < r->k || r->s0 < 0 || r->o0 < 0)
        return di_error_set(err, DI_ERR_INVALID,
                            "%s: row %lld: %d keys, width %d (call max %lld), %d visible, k %d of %d, "
                            "offsets %lld/%lld",
                            op, (long long)i, r->nk, r->w, (long long)w_max, r->vis, r->k, r->kp, (long long)r->s0,
                            (long long)r->o0);
    return DI_OK;
}

/* Keys read where the cache keeps them (di_index_row kbase), decoded for the per-sequence op: the rows
 * of a sequence share their cache and layout, so the keys are decoded once per run of such rows. */
typedef struct key_rows {
    di_index_row src; /* the layout decoded (its key fields), nk: entries decoded */
    uint16_t *keys;   /* bf16 [cap, hd] */
    int64_t cap;
} key_rows;

static bool same_source(const di_index_row *a, const di_index_row *b) {
    return a->kbase == b->kbase && a->kpages == b->kpages && a->kpage_entries == b->kpage_entries &&
           a->kpage_rows == b->kpage_rows && a->krow0 == b->krow0 && a->kn == b->kn;
}

/* Row r's keys [0, r->nk): its own, or its cache rows decoded into kr. */
static int row_keys(const di_index_row *r, int64_t i, int hd, key_rows *kr, const uint16_t **out,
                    di_error *err) {
    if (r->keys) {
        *out = r->keys;
        return DI_OK;
    }
    if (!r->kbase)
        return di_error_set(err, DI_ERR_INVALID, "indexer_scores_rows: row %lld scores %d keys and names none",
                            (long long)i, r->nk);
    if (r->kn < 1 || (r->kpages && r->kpage_entries < 1) || r->kpage_rows < 0 || r->krow0 < 0 || hd % 32)
        return di_error_set(err, DI_ERR_INVALID,
                            "indexer_scores_rows: row %lld reads %d cached keys, %lld per page, %lld rows per page "
                            "from row %lld, width %d (expected ≥ 1 key, a multiple of 32 wide)",
                            (long long)i, r->kn, (long long)r->kpage_entries, (long long)r->kpage_rows,
                            (long long)r->krow0, hd);
    if (same_source(&kr->src, r) && kr->src.nk >= r->nk) {
        *out = kr->keys;
        return DI_OK;
    }
    if (r->nk > kr->cap) {
        free(kr->keys);
        kr->keys = malloc(sizeof(uint16_t) * (size_t)r->nk * (size_t)hd);
        kr->cap = kr->keys ? r->nk : 0;
        if (!kr->cap)
            return di_error_set(err, DI_ERR_NOMEM, "indexer_scores_rows: %d decoded keys of %d values", r->nk, hd);
    }
    const int64_t bytes = di_row_codec_bytes(DI_CODEC_FP4_E8M0, hd);
    for (int64_t e = 0; e < r->nk; e++) { /* row_decode_gather's decode of each entry's row */
        int64_t x = e < r->kn ? e : r->kn - 1; /* not written yet: the newest key (never visible) */
        int64_t row = r->kpages ? (int64_t)r->kpages[x / r->kpage_entries] * r->kpage_rows + r->krow0 +
                                      x % r->kpage_entries
                                : x;
        di_cpu_row_decode(DI_CODEC_FP4_E8M0, r->kbase + row * bytes, hd, kr->keys + e * hd);
    }
    kr->src = *r;
    *out = kr->keys;
    return DI_OK;
}

static int indexer_scores_rows(const di_backend *be, const uint16_t *q, const uint16_t *w, float w_scale, int64_t m,
                               int nh, int hd, const di_index_row *rows, int64_t nk_max, float *scores, di_error *err) {
    if (m < 0 || nh < 1 || hd < 1)
        return di_error_set(err, DI_ERR_INVALID, "indexer_scores_rows: %lld rows, %d heads × %d", (long long)m, nh, hd);
    key_rows kr = {0};
    int rc = DI_OK;
    for (int64_t i = 0; i < m && !rc; i++) {
        const di_index_row *r = &rows[i];
        const uint16_t *keys = NULL; /* bf16 [nk, hd] */
        rc = check_row("indexer_scores_rows", r, i, nk_max, err);
        if (!rc && r->nk > nk_max)
            rc = di_error_set(err, DI_ERR_INVALID, "indexer_scores_rows: row %lld scores %d keys, call max %lld",
                              (long long)i, r->nk, (long long)nk_max);
        if (!rc && r->nk > 0) rc = row_keys(r, i, hd, &kr, &keys, err);
        if (!rc && r->nk > 0)
            rc = be->indexer_scores(be, q + i * nh * hd, w + i * nh, w_scale, keys, 1, nh, hd, r->nk, &r->vis, r->cand,
                                    scores + r->s0, err);
    }
    free(kr.keys);
    return rc;
}

static int candidate_mask_rows(const di_backend *be, const float *scores, int64_t m, const di_index_row *rows,
                               int64_t w_max, int block, int topk_blocks, uint8_t *mask, di_error *err) {
    if (m < 0 || block < 1 || w_max < 0)
        return di_error_set(err, DI_ERR_INVALID, "candidate_mask_rows: %lld rows, block %d, width %lld", (long long)m,
                            block, (long long)w_max);
    int64_t nb = (w_max + block - 1) / block + 1;
    float *ws = malloc(sizeof(float) * (size_t)nb); /* f32 [ceil(w_max / block)] */
    if (!ws) return di_error_set(err, DI_ERR_NOMEM, "candidate_mask_rows: scratch of %lld blocks", (long long)nb);
    int rc = DI_OK;
    for (int64_t i = 0; i < m && !rc; i++) {
        const di_index_row *r = &rows[i];
        rc = check_row("candidate_mask_rows", r, i, w_max, err);
        if (!rc && r->w > 0)
            rc = be->candidate_mask(be, scores + r->s0, 1, r->w, &r->vis, block, topk_blocks, mask + r->s0, ws, err);
    }
    free(ws);
    return rc;
}

static int topk_rows(const di_backend *be, const float *scores, int64_t m, const di_index_row *rows, int64_t w_max,
                     int32_t *out, di_error *err) {
    if (m < 0) return di_error_set(err, DI_ERR_INVALID, "topk_rows: %lld rows", (long long)m);
    for (int64_t i = 0; i < m; i++) {
        const di_index_row *r = &rows[i];
        int rc = check_row("topk_rows", r, i, w_max, err);
        if (!rc && r->k > 0) rc = be->topk(be, scores + r->s0, 1, r->w, &r->vis, r->k, 0, out + r->o0, err);
        if (rc) return rc;
        for (int32_t j = r->k; j < r->kp; j++) out[r->o0 + j] = -1;
    }
    return DI_OK;
}

static int gather_topk_seqs(const di_backend *be, di_row_codec codec, int64_t d, const di_gather_seq *seqs, int n_seq,
                            int64_t mk_max, di_error *err) {
    if (!be->gather_topk || n_seq < 0)
        return di_error_set(err, DI_ERR_INVALID, "gather_topk_seqs: %d sequences%s", n_seq,
                            be->gather_topk ? "" : " on a table without gather_topk");
    for (int s = 0; s < n_seq; s++) {
        const di_gather_seq *g = &seqs[s];
        if (g->m * g->k > mk_max)
            return di_error_set(err, DI_ERR_INVALID, "gather_topk_seqs: sequence %d gathers %lld rows, call max %lld",
                                s, (long long)(g->m * g->k), (long long)mk_max);
        int rc = be->gather_topk(be, codec, g->base, g->n_entries, g->pages, g->page_entries, g->page_rows, g->row_off,
                                 g->top, g->m, g->k, d, g->row0, g->rows, g->idx, g->ldi, err);
        if (rc) return rc;
    }
    return DI_OK;
}

void di_cpu_index_rows_install(di_backend *be) {
    be->indexer_scores_rows = indexer_scores_rows;
    be->candidate_mask_rows = candidate_mask_rows;
    be->topk_rows = topk_rows;
}

void di_cpu_gather_seqs_install(di_backend *be) { be->gather_topk_seqs = gather_topk_seqs; }
