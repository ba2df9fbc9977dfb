/* Golden-case loading and the verify checks. See golden.h and ../shared/golden/README.md. */
#include "model/golden.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "io/formats.h"
#include "model/inventory.h"
#include "util/error.h"

/* ---------------- metrics ---------------- */

double di_rel_err_bf16(const uint16_t *a, const uint16_t *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = di_bf16_to_f32(a[i]), y = di_bf16_to_f32(b[i]);
        num += (x - y) * (x - y), den += y * y;
    }
    return den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
}

double di_rel_err_f32(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = a[i], y = b[i];
        num += (x - y) * (x - y), den += y * y;
    }
    return den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
}

/* bf16 bits → integers ordered like the values (−0 and +0 both map to 0). */
static int32_t bf16_ord(float f) {
    uint16_t h = di_f32_to_bf16(f);
    return (h & 0x8000) ? -(int32_t)(h & 0x7fff) : (int32_t)h;
}

int64_t di_bf16_ulps(float a, float b) {
    int64_t d = (int64_t)bf16_ord(a) - bf16_ord(b);
    return d < 0 ? -d : d;
}

/* ---------------- loading ---------------- */

/* Copy a tensor out of the mapping (golden offsets are not aligned for f32/int32 loads). */
static int take(const di_safetensors *st, const char *name, di_dtype dt, int ndim, const int64_t *shape, void **out,
                bool optional, di_error *err) {
    const di_tensor_info *t = di_st_find(st, name);
    *out = NULL;
    if (!t) return optional ? DI_OK : di_error_set(err, DI_ERR_INVALID, "%s: tensor %s missing", st->path, name);
    bool same = t->dtype == dt && t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char es[96], fs[96];
        di_shape_str(ndim, shape, es, sizeof es);
        di_shape_str(t->ndim, t->shape, fs, sizeof fs);
        return di_error_set(err, DI_ERR_INVALID, "%s: tensor %s is %s %s, the model implies %s %s (golden file of "
                            "another model?)", st->path, name, di_dtype_name(t->dtype), fs, di_dtype_name(dt), es);
    }
    size_t bytes = (size_t)(t->end - t->begin);
    *out = malloc(bytes ? bytes : 1);
    if (!*out) return di_error_set(err, DI_ERR_NOMEM, "%s: %zu bytes for %s", st->path, bytes, name);
    memcpy(*out, t->data, bytes);
    return DI_OK;
}

static int read_floors(di_golden *g, di_error *err) {
    g->floor_logits = NAN;
    for (int i = 0; i < g->n_layers; i++) g->floor_layer[i] = NAN;
    const char *slash = strrchr(g->path, '/');
    char *dir = slash ? strndup(g->path, (size_t)(slash - g->path)) : strdup(".");
    char *cj = dir ? di_path_join(dir, "case.json") : NULL;
    free(dir);
    if (!cj) return di_error_set(err, DI_ERR_NOMEM, "case.json path");
    json_error_t je;
    json_t *root = json_load_file(cj, 0, &je);
    if (!root) {
        int rc = di_error_set(err, DI_ERR_IO, "%s: cannot read the noise floors (%s, line %d)", cj, je.text, je.line);
        free(cj);
        return rc;
    }
    json_t *nf = json_object_get(root, "noise_floor");
    if (!json_is_object(nf)) {
        json_decref(root);
        int rc = di_error_set(err, DI_ERR_FORMAT, "%s: no \"noise_floor\" object", cj);
        free(cj);
        return rc;
    }
    json_t *v = json_object_get(nf, "prompt_logits");
    if (json_is_number(v)) g->floor_logits = json_number_value(v);
    for (int i = 0; i < g->n_layers; i++) {
        char key[64];
        snprintf(key, sizeof key, "prefill_layer%d_out", i);
        v = json_object_get(nf, key);
        if (json_is_number(v)) g->floor_layer[i] = json_number_value(v);
    }
    json_t *cn = json_object_get(root, "case");
    snprintf(g->case_name, sizeof g->case_name, "%s", json_is_string(cn) ? json_string_value(cn) : "?");
    json_decref(root);
    free(cj);
    return DI_OK;
}

int di_golden_open(const char *path, const di_config *cfg, di_golden **out, di_error *err) {
    di_golden *g = calloc(1, sizeof *g);
    if (!g) return di_error_set(err, DI_ERR_NOMEM, "golden struct");
    int rc = di_st_open(path, &g->st, err);
    int n = cfg->n_layers, hc = cfg->hc_mult;
    int64_t D = cfg->hidden_size, V = cfg->vocab_size;
    g->n_layers = n;
    g->path = strdup(path);
    g->layer_out = calloc((size_t)n, sizeof *g->layer_out);
    g->premix = calloc((size_t)n, sizeof *g->premix);
    g->index_scores = calloc((size_t)n, sizeof *g->index_scores);
    g->topk = calloc((size_t)n, sizeof *g->topk);
    g->topk_k = calloc((size_t)n, sizeof *g->topk_k);
    g->n_keys = calloc((size_t)n, sizeof *g->n_keys);
    g->floor_layer = calloc((size_t)n, sizeof *g->floor_layer);
    if (!rc && (!g->path || !g->layer_out || !g->premix || !g->index_scores || !g->topk || !g->topk_k || !g->n_keys ||
                !g->floor_layer))
        rc = di_error_set(err, DI_ERR_NOMEM, "golden tables");
    if (rc) goto fail;
    const di_tensor_info *pi = di_st_find(g->st, "prompt_ids");
    if (!pi || pi->dtype != DI_I32 || pi->ndim != 1 || pi->shape[0] <= 0) {
        rc = di_error_set(err, DI_ERR_INVALID, "%s: prompt_ids must be I32 [T] with T > 0", path);
        goto fail;
    }
    int64_t T = g->T = pi->shape[0];
    rc = take(g->st, "prompt_ids", DI_I32, 1, (int64_t[]){T}, (void **)&g->prompt_ids, false, err);
    if (!rc) rc = take(g->st, "prompt_logits", DI_F32, 2, (int64_t[]){T, V}, (void **)&g->prompt_logits, false, err);
    if (!rc) rc = take(g->st, "prefill_embed", DI_BF16, 2, (int64_t[]){T, D}, (void **)&g->embed, false, err);
    for (int i = 0; !rc && i < n; i++) {
        char nm[96];
        snprintf(nm, sizeof nm, "prefill_layer%d_out", i);
        rc = take(g->st, nm, DI_BF16, 3, (int64_t[]){T, hc, D}, (void **)&g->layer_out[i], false, err);
        snprintf(nm, sizeof nm, "prefill_layer%d_premix", i);
        if (!rc) rc = take(g->st, nm, DI_F32, 2, (int64_t[]){T, hc}, (void **)&g->premix[i], false, err);
        const di_layer_cfg *lc = &cfg->layer[i];
        if (rc || !lc->is_index_source) continue;
        int64_t nk = T / lc->compress_ratio;
        int k = (int)(nk < cfg->index_topk ? nk : cfg->index_topk);
        if (k == 0) continue;
        g->n_keys[i] = nk, g->topk_k[i] = k;
        snprintf(nm, sizeof nm, "prefill_layer%d_index_scores", i);
        rc = take(g->st, nm, DI_F32, 2, (int64_t[]){T, nk}, (void **)&g->index_scores[i], false, err);
        snprintf(nm, sizeof nm, "prefill_layer%d_topk", i);
        if (!rc) rc = take(g->st, nm, DI_I32, 2, (int64_t[]){T, k}, (void **)&g->topk[i], false, err);
    }
    if (!rc) rc = read_floors(g, err);
    if (rc) goto fail;
    *out = g;
    return DI_OK;
fail:
    di_golden_close(g);
    return rc;
}

void di_golden_close(di_golden *g) {
    if (!g) return;
    for (int i = 0; i < g->n_layers; i++) {
        if (g->layer_out) free((void *)g->layer_out[i]);
        if (g->premix) free((void *)g->premix[i]);
        if (g->index_scores) free((void *)g->index_scores[i]);
        if (g->topk) free((void *)g->topk[i]);
    }
    free(g->layer_out), free(g->premix), free(g->index_scores), free(g->topk), free(g->topk_k), free(g->n_keys);
    free(g->floor_layer);
    free((void *)g->prompt_ids), free((void *)g->prompt_logits), free((void *)g->embed);
    free(g->path);
    di_st_close(g->st);
    free(g);
}

/* ---------------- checks ---------------- */

void di_verify_opts_default(di_verify_opts *o) {
    memset(o, 0, sizeof *o);
    o->free_running = o->teacher_forced = true;
    o->tf_bound = 1.5e-2;
    o->floor_mult = 3.0;
    o->tie_ulps = 2;
}

void di_verify_report_free(di_verify_report *r) {
    if (!r) return;
    free(r->layers);
    memset(r, 0, sizeof *r);
}

static void fail_note(di_verify_report *r, const char *fmt, double a, double b, int layer) {
    r->pass = false;
    if (!r->first_failure[0]) snprintf(r->first_failure, sizeof r->first_failure, fmt, layer, a, b);
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Our top-k on the reference's index scores of layer i, compared row by row with the reference's
 * selection. A differing row counts as tied when its k-th and (k+1)-th best scores are within
 * tie_ulps bf16 ulps (the choice among them is implementation-defined, spec §5.6). */
static int check_topk(const di_backend *be, const di_golden *g, int i, int ratio, int tie_ulps, di_verify_layer *vl,
                      di_error *err) {
    int64_t T = g->T, nk = g->n_keys[i];
    int k = g->topk_k[i];
    int32_t *mine = malloc(sizeof(int32_t) * (size_t)(T * k)); /* int32 [T, k] */
    int32_t *vis = malloc(sizeof(int32_t) * (size_t)T);         /* int32 [T] */
    float *row = malloc(sizeof(float) * (size_t)nk);            /* f32 [nk] sorted copy */
    int rc = DI_OK;
    if (!mine || !vis || !row) {
        rc = di_error_set(err, DI_ERR_NOMEM, "top-k check of layer %d", i);
        goto done;
    }
    for (int64_t t = 0; t < T; t++) vis[t] = (int32_t)((t + 1) / ratio);
    { /* the op runs in backend memory: stage its inputs there and read the selection back */
        size_t sb = sizeof(float) * (size_t)(T * nk), vb = sizeof(int32_t) * (size_t)T, mb = sizeof(int32_t) * (size_t)(T * k);
        float *ds = be->mem_alloc(be, sb, err);
        int32_t *dv = ds ? be->mem_alloc(be, vb, err) : NULL, *dm = dv ? be->mem_alloc(be, mb, err) : NULL;
        rc = dm ? DI_OK : err->code;
        if (!rc) rc = be->mem_upload(be, ds, g->index_scores[i], sb, err);
        if (!rc) rc = be->mem_upload(be, dv, vis, vb, err);
        if (!rc) rc = be->topk(be, ds, T, nk, dv, k, (int32_t)T, dm, err);
        if (!rc) rc = be->mem_download(be, mine, dm, mb, err);
        if (dm) be->mem_free(be, dm);
        if (dv) be->mem_free(be, dv);
        if (ds) be->mem_free(be, ds);
    }
    if (rc) goto done;
    vl->topk_rows = T;
    for (int64_t t = 0; t < T; t++) {
        if (!memcmp(mine + t * k, g->topk[i] + t * k, sizeof(int32_t) * (size_t)k)) {
            vl->topk_identical++;
            continue;
        }
        int64_t nf = 0;
        for (int64_t n = 0; n < nk; n++)
            if (g->index_scores[i][t * nk + n] > -INFINITY) row[nf++] = g->index_scores[i][t * nk + n];
        qsort(row, (size_t)nf, sizeof(float), cmp_desc);
        bool tie = nf > k && di_bf16_ulps(row[k - 1], row[k]) <= tie_ulps;
        if (tie)
            vl->topk_tied++;
        else
            vl->topk_bad++;
    }
done:
    free(mine), free(vis), free(row);
    return rc;
}

/* Our teacher-forced index scores against the reference's: bf16-ulp distance where both are finite,
 * and the count of entries masked on one side only. */
static void index_drift(const float *mine, const float *ref, int64_t n, di_verify_layer *vl) {
    double sum = 0;
    for (int64_t j = 0; j < n; j++) {
        bool fa = mine[j] > -INFINITY, fb = ref[j] > -INFINITY;
        if (fa != fb) {
            vl->drift_mask_mismatch++;
            continue;
        }
        if (!fa) continue;
        int64_t u = di_bf16_ulps(mine[j], ref[j]);
        vl->drift_n++;
        if (u) vl->drift_differ++;
        sum += (double)u;
        if ((double)u > vl->drift_max_ulps) vl->drift_max_ulps = (double)u;
    }
    vl->drift_mean_ulps = vl->drift_n ? sum / (double)vl->drift_n : 0;
}

static int write_dump(const char *path, const di_config *cfg, const di_prefill_out *fr, const di_prefill_out *tf,
                      di_error *err) {
    int n = cfg->n_layers, hc = cfg->hc_mult;
    int64_t T = fr ? fr->T : tf->T, D = cfg->hidden_size;
    di_tensor_spec *specs = calloc((size_t)(2 * n + 1), sizeof *specs);
    const void **data = calloc((size_t)(2 * n + 1), sizeof *data);
    char (*names)[48] = calloc((size_t)(2 * n + 1), sizeof *names);
    if (!specs || !data || !names) {
        free(specs), free(data), free(names);
        return di_error_set(err, DI_ERR_NOMEM, "dump specs");
    }
    int64_t k = 0;
    if (fr) {
        snprintf(names[k], 48, "prompt_logits");
        specs[k] = (di_tensor_spec){.name = names[k], .dtype = DI_F32, .ndim = 2, .shape = {T, cfg->vocab_size}};
        data[k++] = fr->logits;
        for (int i = 0; i < n; i++) {
            snprintf(names[k], 48, "prefill_layer%d_out", i);
            specs[k] = (di_tensor_spec){.name = names[k], .dtype = DI_BF16, .ndim = 3, .shape = {T, hc, D}};
            data[k++] = fr->layer_out[i];
        }
    }
    if (tf)
        for (int i = 0; i < n; i++) {
            snprintf(names[k], 48, "tf_layer%d_out", i);
            specs[k] = (di_tensor_spec){.name = names[k], .dtype = DI_BF16, .ndim = 3, .shape = {T, hc, D}};
            data[k++] = tf->layer_out[i];
        }
    int rc = di_st_write_file(path, specs, data, k, err);
    free(specs), free(data), free(names);
    return rc;
}

int di_verify_run(const di_model *m, const di_backend *be, const di_golden *g, const di_verify_opts *o,
                  di_verify_report *r, di_error *err) {
    const di_config *cfg = &m->cfg;
    int n = cfg->n_layers, hc = cfg->hc_mult;
    int64_t T = g->T, D = cfg->hidden_size, V = cfg->vocab_size;
    memset(r, 0, sizeof *r);
    r->n_layers = n, r->T = T, r->pass = true;
    r->layers = calloc((size_t)n, sizeof *r->layers);
    if (!r->layers) return di_error_set(err, DI_ERR_NOMEM, "verify report");
    di_prefill_out fr = {0}, tf = {0};
    const uint16_t **x_in = NULL;
    const float **p_in = NULL;
    uint16_t *x0 = NULL; /* bf16 [T, hc, D] the reference's embedding repeated over the streams */
    float *p0 = NULL;    /* f32 [T, hc] one-hot stream 0 */
    int rc = DI_OK;
    for (int i = 0; i < n; i++) r->layers[i].floor = g->floor_layer[i];
    r->logits_floor = g->floor_logits;

    di_stage_recorder rec = {0};
    di_fwd_opts fo = o->fwd;
    if (o->stages_path) fo.dump = di_stage_recorder_fn, fo.dump_ctx = &rec;
    if (o->free_running) {
        rec.prefix = "free.";
        rc = di_prefill(m, be, g->prompt_ids, T, &fo, &fr, err);
        if (rc) goto done;
        for (int i = 0; i < n; i++) {
            di_verify_layer *vl = &r->layers[i];
            vl->free_rel = di_rel_err_bf16(fr.layer_out[i], g->layer_out[i], T * hc * D);
            vl->free_premix_rel = di_rel_err_f32(fr.premix[i], g->premix[i], T * hc);
            vl->free_ok = !isnan(vl->floor) && vl->free_rel <= o->floor_mult * vl->floor;
            if (!vl->free_ok)
                fail_note(r, "free-running layer %d output: relative error %.4g above %.4g (floor multiple)", vl->free_rel,
                          o->floor_mult * vl->floor, i);
        }
        r->logits_rel = di_rel_err_f32(fr.logits, g->prompt_logits, T * V);
        r->logits_ok = !isnan(r->logits_floor) && r->logits_rel <= o->floor_mult * r->logits_floor;
        if (!r->logits_ok)
            fail_note(r, "free-running prompt logits (layer %d = after the last block): relative error %.4g above %.4g",
                      r->logits_rel, o->floor_mult * r->logits_floor, n - 1);
        for (int64_t t = 0; t < T; t++) {
            int64_t a = 0, b = 0;
            for (int64_t v = 1; v < V; v++) {
                if (fr.logits[t * V + v] > fr.logits[t * V + a]) a = v;
                if (g->prompt_logits[t * V + v] > g->prompt_logits[t * V + b]) b = v;
            }
            r->argmax_agree += a == b;
        }
    }

    if (o->teacher_forced) {
        x_in = calloc((size_t)n, sizeof *x_in);
        p_in = calloc((size_t)n, sizeof *p_in);
        x0 = malloc(sizeof(uint16_t) * (size_t)(T * hc * D));
        p0 = malloc(sizeof(float) * (size_t)(T * hc));
        if (!x_in || !p_in || !x0 || !p0) {
            rc = di_error_set(err, DI_ERR_NOMEM, "teacher-forced inputs");
            goto done;
        }
        for (int64_t t = 0; t < T; t++)
            for (int k = 0; k < hc; k++) {
                memcpy(x0 + (t * hc + k) * D, g->embed + t * D, sizeof(uint16_t) * (size_t)D);
                p0[t * hc + k] = k == 0 ? 1.0f : 0.0f;
            }
        x_in[0] = x0, p_in[0] = p0;
        for (int i = 1; i < n; i++) x_in[i] = g->layer_out[i - 1], p_in[i] = g->premix[i - 1];
        rec.prefix = "tf.";
        rc = di_prefill_teacher_forced(m, be, g->prompt_ids, T, x_in, p_in, &fo, &tf, err);
        if (rc) goto done;
        for (int i = 0; i < n; i++) {
            di_verify_layer *vl = &r->layers[i];
            vl->tf_rel = di_rel_err_bf16(tf.layer_out[i], g->layer_out[i], T * hc * D);
            vl->tf_premix_rel = di_rel_err_f32(tf.premix[i], g->premix[i], T * hc);
            vl->tf_ok = vl->tf_rel <= o->tf_bound;
            if (!vl->tf_ok) fail_note(r, "teacher-forced block %d: relative error %.4g above %.4g", vl->tf_rel, o->tf_bound, i);
            if (!g->index_scores[i]) continue;
            vl->has_index = true;
            vl->topk_k = g->topk_k[i];
            rc = check_topk(be, g, i, cfg->layer[i].compress_ratio, o->tie_ulps, vl, err);
            if (rc) goto done;
            if (vl->topk_bad) fail_note(r, "layer %d top-k: %.0f rows differ from the reference beyond ties (of %.0f)",
                                        (double)vl->topk_bad, (double)T, i);
            if (tf.index_scores[i] && tf.n_keys[i] == g->n_keys[i])
                index_drift(tf.index_scores[i], g->index_scores[i], T * g->n_keys[i], vl);
        }
    }

    if (o->kernels_path) {
        rc = di_verify_ops(be, o->kernels_path, &o->fwd.faults, &r->ops, err);
        if (rc) goto done;
        r->has_ops = true;
        if (!r->ops.pass) {
            r->pass = false;
            if (!r->first_failure[0]) snprintf(r->first_failure, sizeof r->first_failure, "%s", r->ops.first_failure);
        }
    }
    if (o->dump_path) rc = write_dump(o->dump_path, cfg, o->free_running ? &fr : NULL, o->teacher_forced ? &tf : NULL, err);
    if (!rc && o->stages_path) rc = di_stage_recorder_write(&rec, o->stages_path, err);
done:
    di_stage_recorder_free(&rec);
    free(x_in), free(p_in), free(x0), free(p0);
    di_prefill_out_free(&fr);
    di_prefill_out_free(&tf);
    if (rc) di_verify_report_free(r);
    return rc;
}
