/* Memory plan of a run: weights, caches, workspace, host-resident parts, fit verdict. See memplan.h. */
#include "model/memplan.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util/error.h"

const char *di_plan_device_name(di_plan_device d) { return d == DI_PLAN_CUDA ? "cuda" : "cpu"; }

const char *di_plan_wgroup_name(int g) {
    return g == DI_PLAN_ENGRAM_TABLES ? "engram tables" : di_family_name((di_family)g);
}

void di_memplan_opts_default(di_memplan_opts *o, di_plan_device device) {
    memset(o, 0, sizeof *o);
    o->device = device;
    o->max_seqs = 1;
    o->spec_margin = -1; /* the config's default (cache.h di_cache_default_margin) */
    o->engram_on_host = true;
}

/* ------------------------------------------------------------------------------------------------
 * Units */

void di_memplan_fmt_bytes(int64_t bytes, char *buf, size_t n) {
    static const char *unit[] = {"B", "KB", "MB", "GB", "TB", "PB"};
    double v = (double)bytes;
    int u = 0;
    while (fabs(v) >= 1000.0 && u < 5) v /= 1000.0, u++;
    if (u == 0)
        snprintf(buf, n, "%lld B", (long long)bytes);
    else
        snprintf(buf, n, "%.2f %s", v, unit[u]);
}

int di_memplan_parse_bytes(const char *s, int64_t *out, di_error *err) {
    static const struct {
        const char *suffix;
        double mult;
    } k_units[] = {{"", 1},          {"b", 1},          {"kb", 1e3},       {"mb", 1e6},
                   {"gb", 1e9},      {"tb", 1e12},      {"kib", 1024.0},   {"mib", 1048576.0},
                   {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
    if (!s || !*s) return di_error_set(err, DI_ERR_INVALID, "memory size: empty (expected e.g. 139GiB)");
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s || errno || !(v >= 0)) return di_error_set(err, DI_ERR_INVALID, "memory size '%s': not a number", s);
    while (*end == ' ') end++;
    for (size_t i = 0; i < sizeof k_units / sizeof k_units[0]; i++) {
        if (strcasecmp(end, k_units[i].suffix) != 0) continue;
        double b = v * k_units[i].mult;
        if (b >= 9.2e18) return di_error_set(err, DI_ERR_INVALID, "memory size '%s': too large", s);
        *out = (int64_t)llround(b);
        return DI_OK;
    }
    return di_error_set(err, DI_ERR_INVALID,
                        "memory size '%s': unknown unit '%s' (expected B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)",
                        s, end);
}

int di_memplan_host_available(int64_t *bytes, di_error *err) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return di_error_set(err, DI_ERR_IO, "/proc/meminfo: cannot open (give the memory size explicitly)");
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    if (kb < 0)
        return di_error_set(err, DI_ERR_FORMAT,
                            "/proc/meminfo: no MemAvailable line (give the memory size explicitly)");
    *bytes = (int64_t)kb * 1024;
    return DI_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Weights */

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int64_t numel(const di_inv_entry *e) {
    int64_t n = 1;
    for (int i = 0; i < e->ndim; i++) n *= e->shape[i];
    return n;
}

/* Sort every inventory entry into a group and a side (device / host), with wo_a at its bf16 size. */
static void plan_weights(const di_config *cfg, const di_inv_entry *inv, int64_t n, di_memplan *p) {
    const di_memplan_opts *o = &p->opts;
    bool cuda = o->device == DI_PLAN_CUDA;
    int64_t expert_stage[DI_MAX_STAGES] = {0}; /* routed-expert bytes per stage */
    for (int64_t i = 0; i < n; i++) {
        const di_inv_entry *e = &inv[i];
        if (e->family == DI_FAM_VISION && !o->vision) continue;
        int64_t stored = di_inv_entry_bytes(e), dev = stored;
        bool table = di_inv_is_engram_table(e);
        int g = table ? DI_PLAN_ENGRAM_TABLES : (int)e->family;
        p->weights_stored += stored;
        if (!table) p->weights_stored_no_engram += stored;
        if (e->family == DI_FAM_EXPERTS && e->layer >= 0) expert_stage[e->layer] += stored;
        /* the reference keeps wo_a as bf16 (dequantized once at load) and drops its scale */
        if (e->family == DI_FAM_ATTN && e->dtype == DI_F8_E4M3 && ends_with(e->name, "attn.wo_a.weight"))
            dev = numel(e) * 2;
        else if (e->family == DI_FAM_ATTN && ends_with(e->name, "attn.wo_a.scale"))
            dev = 0;
        p->wo_a_extra += dev - stored;
        bool host = cuda && ((table && o->engram_on_host) || (e->family == DI_FAM_EXPERTS && o->experts_on_host));
        if (host)
            p->weight_host[g] += stored;
        else
            p->weight_dev[g] += dev;
    }
    for (int g = 0; g < DI_PLAN_WGROUPS; g++) {
        p->weights_dev += p->weight_dev[g];
        p->weights_host += p->weight_host[g];
    }
    for (int st = 0; st < cfg->n_stages; st++) {
        int E = cfg->layer[st].n_experts;
        if (E > 0 && expert_stage[st] / E > p->expert_bytes) p->expert_bytes = expert_stage[st] / E;
    }
}

/* ------------------------------------------------------------------------------------------------
 * Caches, workspace, staging for (s sequences, t tokens) */

static int64_t max_active(const di_config *c) {
    int64_t K = 0;
    for (int st = 0; st < c->n_stages; st++)
        if (c->layer[st].n_active_experts > K) K = c->layer[st].n_active_experts;
    return K;
}

static int64_t max_experts(const di_config *c) {
    int64_t E = 0;
    for (int st = 0; st < c->n_stages; st++)
        if (c->layer[st].n_experts > E) E = c->layer[st].n_experts;
    return E;
}

static void plan_workspace(const di_config *c, const di_memplan_opts *o, int64_t s, int64_t t, di_plan_workspace *w) {
    memset(w, 0, sizeof *w);
    int64_t verify = c->n_dspark > 0 ? (int64_t)c->dspark_block_size + 1 : 1;
    int64_t N = o->prefill_chunk > s * verify ? o->prefill_chunk : s * verify;
    if (N > s * t) N = s * t; /* a step never holds more tokens than the sequences do */
    w->tokens = N;

    int64_t D = c->hidden_size, hc = c->hc_mult, H = c->num_attention_heads, hd = c->head_dim;
    int64_t qr = c->q_lora_rank, gor = (int64_t)c->o_groups * c->o_lora_rank, I = c->moe_intermediate_size;
    int64_t ih = c->index_n_heads, ihd = c->index_head_dim, V = c->vocab_size;
    int64_t E = max_experts(c), K = max_active(c), rmin = 0;
    bool indexer = false;
    for (int st = 0; st < c->n_stages; st++) {
        const di_layer_cfg *l = &c->layer[st];
        if (l->has_indexer && l->compress_ratio > 0) {
            indexer = true;
            if (rmin == 0 || l->compress_ratio < rmin) rmin = l->compress_ratio;
        }
    }
    int64_t ncmp = indexer ? t / rmin : 0;
    if (ncmp > DI_MEMPLAN_INDEX_TILE) ncmp = DI_MEMPLAN_INDEX_TILE;

    int64_t residual = 2 * hc * D * 2;
    int64_t mhc = ((2 + hc) * hc + 2 * hc + hc * hc) * 4 + 2 * D * 2;
    int64_t attn = (qr + 2 * H * hd + hd + gor) * 2 + (gor + gor / 32); /* wo_a runs in bf16: no FP8 copy of o */
    if (indexer) attn += ih * ihd * 2 + ih * 4 + ncmp * 4 + ((int64_t)c->index_topk + c->sliding_window) * 4;
    int64_t moe = E * 4 + K * (4 + 4) + K * (D * 2 + (D + D / 32) + 2 * I * 4 + I * 2 + (I + I / 32) + D * 4) +
                  (2 * I * 4 + I * 2 + D * 4);
    int64_t engram = 0;
    if (c->n_engram_layers > 0) {
        int64_t cols = (int64_t)(c->engram_max_ngram_size - 1) * c->engram_n_heads;
        engram = cols * (8 + (int64_t)c->engram_head_dim * 2) + (hc + 1) * D * 2;
    }
    int64_t logits = V * 4;
    w->residual = N * residual;
    w->mhc = N * mhc;
    w->attention = N * attn;
    if (indexer && c->index_topk > 0) { /* the backend gather of one step (memplan.h) */
        int64_t tok = DI_MEMPLAN_GATHER_ROWS / c->index_topk; /* the largest step that gathers there */
        w->attention += (N < tok ? N : tok) * c->index_topk * hd * 2;
    }
    w->moe = N * moe;
    w->engram = N * engram;
    w->logits = N * logits;
    int64_t peak = w->attention > w->moe ? w->attention : w->moe;
    if (w->engram > peak) peak = w->engram;
    w->total = w->residual + w->mhc + peak + w->logits;
}

/* Fills caches, workspace, staging, reserve and device_total of p for (s, t). */
static int plan_run(const di_config *c, di_memplan *p, int64_t s, int64_t t, di_error *err) {
    const di_memplan_opts *o = &p->opts;
    di_cache_opts co = {.max_tokens = t, .spec_margin = o->spec_margin};
    int rc = di_cache_size_of(c, &co, &p->cache, err);
    if (rc) return rc;
    p->caches_dev = s * p->cache.total_bytes;
    di_cache_pool_opts po = {.max_tokens = t, .spec_margin = o->spec_margin, .n_pages = 1, .n_slots = 1};
    if ((rc = di_cache_pool_size_of(c, &po, &p->pool, err))) return rc;
    p->pool_pages = s * ((t + DI_CACHE_PAGE_TOKENS_DEFAULT - 1) / DI_CACHE_PAGE_TOKENS_DEFAULT);
    p->pool_bytes = s * p->pool.slot_bytes + p->pool_pages * p->pool.page_bytes;
    plan_workspace(c, o, s, t, &p->ws);
    p->staging_dev = 0;
    if (o->device == DI_PLAN_CUDA && o->experts_on_host) {
        int64_t touch = p->ws.tokens * max_active(c), E = max_experts(c);
        p->staging_dev = 2 * (touch < E ? touch : E) * p->expert_bytes;
    }
    p->reserve_dev = o->device == DI_PLAN_CUDA ? DI_MEMPLAN_CUDA_RESERVE : 0;
    p->device_total = p->weights_dev + p->caches_dev + p->ws.total + p->staging_dev + p->reserve_dev;
    return DI_OK;
}

static bool run_fits(const di_memplan *p) {
    return p->device_total <= p->device_capacity && (p->host_capacity == 0 || p->host_total <= p->host_capacity);
}

/* Largest x in [0, hi] with fits(x) (monotone: fits(x) ⇒ fits(x−1)); x = 0 always "fits". */
static int search(const di_config *c, const di_memplan *base, bool by_seqs, int64_t hi, int64_t *out, di_error *err) {
    di_memplan q = *base;
    int64_t lo = 0;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        int64_t s = by_seqs ? mid : base->opts.max_seqs, t = by_seqs ? base->opts.max_tokens : mid;
        int rc = plan_run(c, &q, s, t, err);
        if (rc) return rc;
        if (run_fits(&q))
            lo = mid;
        else
            hi = mid - 1;
    }
    *out = lo;
    return DI_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Verdict */

static void gb(int64_t b, char *buf) { di_memplan_fmt_bytes(b, buf, 32); }

static void explain(di_memplan *p) {
    const di_memplan_opts *o = &p->opts;
    char cap[32], need[32], over[32], a[32], b[32], d[32];
    gb(p->device_capacity, cap);
    p->fits = run_fits(p);
    p->reason[0] = 0;
    if (p->fits) return;
    const char *dev = di_plan_device_name(o->device);
    char whole[96]; /* the whole run, for the categories after the first one that overflows */
    gb(p->device_total, a);
    gb(p->device_total - p->device_capacity, b);
    snprintf(whole, sizeof whole, "the whole run needs %s, %s over", a, b);
    double gib = (double)p->device_capacity / (double)((int64_t)1 << 30);
    if (p->weights_dev > p->device_capacity) {
        gb(p->weights_dev, need);
        gb(p->weights_dev - p->device_capacity, over);
        gb(p->weights_stored, a);
        gb(p->weights_stored_no_engram, b);
        gb(p->weights_host, d);
        char hint[160] = "";
        if (o->device == DI_PLAN_CUDA) {
            int64_t ex = p->weight_dev[DI_FAM_EXPERTS], tb = p->weight_dev[DI_PLAN_ENGRAM_TABLES];
            char e1[32], t1[32];
            gb(ex, e1);
            gb(tb, t1);
            if (tb > 0 && ex > 0)
                snprintf(hint, sizeof hint, "; Engram tables (%s) and routed experts (%s) can stay on the host", t1,
                         e1);
            else if (tb > 0)
                snprintf(hint, sizeof hint, "; the Engram tables (%s) can stay on the host", t1);
            else if (ex > 0)
                snprintf(hint, sizeof hint, "; routed experts (%s) can stay on the host (--experts-on-host)", e1);
            else
                snprintf(hint, sizeof hint, "; more GPUs are needed");
        }
        char on_host[64] = "";
        if (p->weights_host) snprintf(on_host, sizeof on_host, "; %s kept on the host", d);
        snprintf(p->reason, sizeof p->reason,
                 "weights do not fit on %s (%s = %.1f GiB): %s of weights on the device, over by %s (stored %s in "
                 "total, %s without the Engram tables%s; %s)%s",
                 dev, cap, gib, need, over, a, b, on_host, whole, hint);
        return;
    }
    int64_t left = p->device_capacity - p->weights_dev;
    if (p->caches_dev > left) {
        gb(p->caches_dev, need);
        gb(p->caches_dev - left, over);
        gb(left, a);
        gb(p->cache.total_bytes, b);
        snprintf(p->reason, sizeof p->reason,
                 "caches do not fit on %s (%s): %lld sequences × %lld tokens need %s (%s each), %s is left after "
                 "the weights, over by %s (%s); at most %lld sequences of %lld tokens or %lld tokens for %lld "
                 "sequences fit",
                 dev, cap, (long long)o->max_seqs, (long long)o->max_tokens, need, b, a, over, whole,
                 (long long)p->max_seqs_fit, (long long)o->max_tokens, (long long)p->max_tokens_fit,
                 (long long)o->max_seqs);
        return;
    }
    left -= p->caches_dev;
    int64_t rest = p->ws.total + p->staging_dev + p->reserve_dev;
    if (rest > left) {
        gb(rest, need);
        gb(rest - left, over);
        gb(left, a);
        gb(p->ws.total, b);
        snprintf(p->reason, sizeof p->reason,
                 "workspace does not fit on %s (%s): %s (workspace %s for %lld-token steps%s) with %s left after "
                 "weights and caches, over by %s; at most %lld sequences of %lld tokens fit",
                 dev, cap, need, b, (long long)p->ws.tokens,
                 p->staging_dev ? ", expert staging, runtime reserve" : p->reserve_dev ? ", runtime reserve" : "", a,
                 over, (long long)p->max_seqs_fit, (long long)o->max_tokens);
        return;
    }
    /* device fits: the host-resident weights do not */
    gb(p->host_total, need);
    gb(p->host_capacity, cap);
    gb(p->host_total - p->host_capacity, over);
    gb(p->weight_host[DI_PLAN_ENGRAM_TABLES], a);
    gb(p->weight_host[DI_FAM_EXPERTS], b);
    snprintf(p->reason, sizeof p->reason,
             "host-resident weights do not fit in host memory (%s): %s (Engram tables %s, routed experts %s), over "
             "by %s",
             cap, need, a, b, over);
}

/* ------------------------------------------------------------------------------------------------ */

int di_memplan_compute(const di_config *cfg, const di_memplan_opts *opts, di_memplan *p, di_error *err) {
    if (!cfg || !opts || !p) return di_error_set(err, DI_ERR_INVALID, "di_memplan_compute: NULL argument");
    memset(p, 0, sizeof *p);
    p->opts = *opts;
    if (p->opts.spec_margin < 0) p->opts.spec_margin = di_cache_default_margin(cfg);
    di_memplan_opts *o = &p->opts;
    if (o->device != DI_PLAN_CPU && o->device != DI_PLAN_CUDA)
        return di_error_set(err, DI_ERR_INVALID, "memory plan: device %d (expected cpu or cuda)", (int)o->device);
    if (o->max_tokens == 0) o->max_tokens = cfg->max_position_embeddings;
    if (o->prefill_chunk == 0) o->prefill_chunk = DI_MEMPLAN_CHUNK_DEFAULT;
    if (o->max_seqs < 1 || o->max_seqs > DI_MEMPLAN_MAX_SEQS)
        return di_error_set(err, DI_ERR_INVALID, "memory plan: max_seqs %lld (expected 1 … %lld)",
                            (long long)o->max_seqs, (long long)DI_MEMPLAN_MAX_SEQS);
    if (o->max_tokens < 1 || o->max_tokens > cfg->max_position_embeddings)
        return di_error_set(err, DI_ERR_INVALID,
                            "memory plan: max_tokens %lld (expected 1 … %lld, the model's max_position_embeddings)",
                            (long long)o->max_tokens, (long long)cfg->max_position_embeddings);
    if (o->prefill_chunk < 1 || o->prefill_chunk > DI_MEMPLAN_MAX_CHUNK)
        return di_error_set(err, DI_ERR_INVALID, "memory plan: prefill_chunk %lld (expected 1 … %lld)",
                            (long long)o->prefill_chunk, (long long)DI_MEMPLAN_MAX_CHUNK);
    if (o->device_bytes < 0 || o->host_bytes < 0)
        return di_error_set(err, DI_ERR_INVALID, "memory plan: negative memory size");
    if (o->device == DI_PLAN_CPU) { /* one memory: nothing is "host-resident" */
        o->engram_on_host = o->experts_on_host = false;
        o->host_bytes = 0;
    }
    int rc;
    if (o->device_bytes == 0) {
        if (o->device == DI_PLAN_CUDA)
            o->device_bytes = DI_MEMPLAN_H200_BYTES;
        else if ((rc = di_memplan_host_available(&o->device_bytes, err)))
            return rc;
    }
    if (o->device == DI_PLAN_CUDA && o->host_bytes == 0 && (rc = di_memplan_host_available(&o->host_bytes, err)))
        return rc;
    p->device_capacity = o->device_bytes;
    p->host_capacity = o->host_bytes;

    di_inv_entry *inv;
    int64_t n;
    if ((rc = di_inventory_build(cfg, &inv, &n, err))) return rc;
    plan_weights(cfg, inv, n, p);
    free(inv);
    p->host_total = p->weights_host;

    /* the fit searches first (the reason quotes them), then the requested run */
    if ((rc = search(cfg, p, true, DI_MEMPLAN_MAX_SEQS, &p->max_seqs_fit, err))) return rc;
    if ((rc = search(cfg, p, false, cfg->max_position_embeddings, &p->max_tokens_fit, err))) return rc;
    if ((rc = plan_run(cfg, p, o->max_seqs, o->max_tokens, err))) return rc;
    explain(p);
    return DI_OK;
}

int di_memplan_check(const di_memplan *p, di_error *err) {
    if (p->fits) return DI_OK;
    return di_error_set(err, DI_ERR_LIMIT, "%s", p->reason);
}

/* ------------------------------------------------------------------------------------------------
 * Table */

/* One table line; host < 0 leaves the host column out (cpu: one memory). */
static void row(FILE *f, const char *name, int64_t dev, int64_t host, const char *note) {
    char a[32] = "-", b[32] = "-";
    if (dev) gb(dev, a);
    if (host > 0) gb(host, b);
    fprintf(f, "  %-22s %14s", name, a);
    if (host >= 0) fprintf(f, " %14s", b);
    fprintf(f, "%s%s\n", note && *note ? "   " : "", note ? note : "");
}

void di_memplan_print(const di_memplan *p, FILE *f) {
    const di_memplan_opts *o = &p->opts;
    bool cuda = o->device == DI_PLAN_CUDA;
    char a[32], b[32], c[32], note[200];
    gb(p->device_capacity, a);
    fprintf(f, "memory plan  %s: %s (%.2f GiB) device memory", di_plan_device_name(o->device), a,
            (double)p->device_capacity / (double)((int64_t)1 << 30));
    if (cuda) {
        gb(p->host_capacity, b);
        fprintf(f, ", %s host memory", b);
    } else {
        fprintf(f, " (host and device are one memory)");
    }
    fprintf(f, "\nrun          %lld sequence%s × %lld tokens, speculation margin %d, steps of ≤ %lld tokens "
               "(prefill chunk %lld)\n\n",
            (long long)o->max_seqs, o->max_seqs == 1 ? "" : "s", (long long)o->max_tokens, o->spec_margin,
            (long long)p->ws.tokens, (long long)o->prefill_chunk);
    fprintf(f, "  %-22s %14s%s\n", "", "device", cuda ? "           host" : "");
    fprintf(f, "weights\n");
    for (int g = 0; g < DI_PLAN_WGROUPS; g++) {
        if (!p->weight_dev[g] && !p->weight_host[g]) continue;
        note[0] = 0;
        if (g == DI_FAM_ATTN && p->wo_a_extra) {
            gb(p->wo_a_extra, c);
            snprintf(note, sizeof note, "wo_a as bf16: +%s", c);
        }
        row(f, di_plan_wgroup_name(g), p->weight_dev[g], cuda ? p->weight_host[g] : -1, note);
    }
    gb(p->weights_stored, a);
    gb(p->weights_stored_no_engram, b);
    snprintf(note, sizeof note, "stored %s (%s without Engram tables)%s", a, b, o->vision ? "" : ", vision not loaded");
    row(f, "weights total", p->weights_dev, cuda ? p->weights_host : -1, note);
    gb(p->cache.total_bytes, a);
    snprintf(note, sizeof note, "%s per sequence (%.0f B/token + fixed)", a, p->cache.per_token_bytes);
    row(f, "caches", p->caches_dev, cuda ? 0 : -1, note);
    gb(p->pool.page_bytes, a);
    gb(p->pool.slot_bytes, b);
    snprintf(note, sizeof note, "paged: %lld pages of %d tokens (%s each) + %lld slots of %s", (long long)p->pool_pages,
             DI_CACHE_PAGE_TOKENS_DEFAULT, a, (long long)o->max_seqs, b);
    row(f, "  as a pool", p->pool_bytes, cuda ? 0 : -1, note); /* the same caches: not added to the total */
    gb(p->ws.logits, a);
    gb(p->ws.attention > p->ws.moe ? p->ws.attention : p->ws.moe, b);
    snprintf(note, sizeof note, "%lld tokens/step: logits %s, widest phase (%s) %s", (long long)p->ws.tokens, a,
             p->ws.attention >= p->ws.moe && p->ws.attention >= p->ws.engram ? "attention"
             : p->ws.moe >= p->ws.engram                                     ? "moe"
                                                                             : "engram",
             b);
    row(f, "workspace", p->ws.total, cuda ? 0 : -1, note);
    if (p->staging_dev) {
        gb(p->expert_bytes, a);
        snprintf(note, sizeof note, "host experts, 2 × %lld × %s per layer",
                 (long long)(p->staging_dev / 2 / p->expert_bytes), a);
        row(f, "expert staging", p->staging_dev, 0, note);
    }
    if (p->reserve_dev) row(f, "runtime reserve", p->reserve_dev, 0, "CUDA context, BLAS workspaces");
    row(f, "total", p->device_total, cuda ? p->host_total : -1, "");
    row(f, "capacity", p->device_capacity, cuda ? p->host_capacity : -1, "");
    fprintf(f, "\n%s\n", p->fits ? "fits" : "DOES NOT FIT");
    if (!p->fits) fprintf(f, "  %s\n", p->reason);
    fprintf(f, "largest fit: %lld sequences of %lld tokens; %lld tokens for %lld sequence%s\n",
            (long long)p->max_seqs_fit, (long long)o->max_tokens, (long long)p->max_tokens_fit, (long long)o->max_seqs,
            o->max_seqs == 1 ? "" : "s");
}

int di_memplan_preflight(const char *model_dir, di_plan_device device, int64_t max_seqs, int64_t max_tokens,
                         FILE *log, di_error *err) {
    di_config *cfg = calloc(1, sizeof *cfg); /* large: not on the stack */
    if (!cfg) return di_error_set(err, DI_ERR_NOMEM, "memory plan: out of host memory");
    int rc = di_config_load(model_dir, cfg, err);
    if (rc) {
        free(cfg);
        return rc;
    }
    di_memplan_opts o;
    di_memplan_opts_default(&o, device);
    o.max_seqs = max_seqs < 1 ? 1 : max_seqs;
    o.max_tokens = max_tokens < 1 || max_tokens > cfg->max_position_embeddings ? cfg->max_position_embeddings
                                                                                : max_tokens;
    di_memplan p;
    rc = di_memplan_compute(cfg, &o, &p, err);
    free(cfg);
    if (rc) return rc;
    if (log) {
        char w[32], c[32], ws[32], tot[32], cap[32], h[32];
        gb(p.weights_dev, w);
        gb(p.caches_dev, c);
        gb(p.ws.total + p.staging_dev + p.reserve_dev, ws);
        gb(p.device_total, tot);
        gb(p.device_capacity, cap);
        gb(p.weights_host, h);
        fprintf(log, "memory plan (%s, %lld × %lld tokens): weights %s, caches %s, workspace + reserve %s = %s of %s%s%s%s\n",
                di_plan_device_name(device), (long long)o.max_seqs, (long long)p.opts.max_tokens, w, c, ws, tot, cap,
                p.weights_host ? "; host-resident " : "", p.weights_host ? h : "", p.fits ? "" : " — does not fit");
    }
    return di_memplan_check(&p, err);
}
