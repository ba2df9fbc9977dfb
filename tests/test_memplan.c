/* Memory plan (model/memplan.h): the released V4.1-Flash config refused on one 139 GiB H200 with the
 * weights named and the overflow stated, the host-offloaded plan's device part recomputed here from
 * the inventory, spec §2.1/§7.1 byte counts, the tiny preset fitting on cpu, cache bytes equal to
 * di_cache_size_of's, the largest-fit search exact at its boundary and monotone, each overflow
 * category named, bad options and sizes refused, and `deepinfer plan --json` (run in-process).
 * di-test: asan */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/cache.h"
#include "model/config.h"
#include "model/inventory.h"
#include "model/memplan.h"
#include "model/mkmodel.h"
#include "testutil.h"

#include "../tools/cli.c"
#include "../tools/cmd_plan.c"

static di_config *released(void) {
    di_config *c = malloc(sizeof *c);
    di_error err = {0};
    if (di_config_load(tu_data("v41-flash-config"), c, &err)) fail_msg("released config: %s", err.msg);
    return c;
}

static di_config *tiny(void) {
    char *hf = NULL, *inf = NULL;
    di_error err = {0};
    di_config *c = malloc(sizeof *c);
    if (di_mkmodel_preset_configs("tiny", 64640, &hf, &inf, &err) ||
        di_config_parse(hf, strlen(hf), inf, strlen(inf), "tiny", c, &err))
        fail_msg("tiny preset: %s", err.msg);
    free(hf);
    free(inf);
    return c;
}

static di_memplan *plan_of(const di_config *c, const di_memplan_opts *o) {
    di_memplan *p = malloc(sizeof *p);
    di_error err = {0};
    if (di_memplan_compute(c, o, p, &err)) fail_msg("di_memplan_compute: %s", err.msg);
    return p;
}

static void expect_substr(const char *s, const char *sub) {
    if (!strstr(s, sub)) fail_msg("expected \"%s\" in: %s", sub, s);
}

static const char *fmt(int64_t b) {
    static char buf[16][32]; /* a few per tu_report line */
    static int k;
    k = (k + 1) % 16;
    di_memplan_fmt_bytes(b, buf[k], sizeof buf[k]);
    return buf[k];
}

/* Independent sums over the inventory (text only). wo_a: bf16 = 2 B per value instead of 1, scale
 * dropped. */
typedef struct sums {
    int64_t text, tables, experts, wo_a_extra, expert_one;
} sums;

static sums inventory_sums(const di_config *c) {
    di_inv_entry *v;
    int64_t n;
    di_error err = {0};
    if (di_inventory_build(c, &v, &n, &err)) fail_msg("inventory: %s", err.msg);
    sums s = {0};
    int64_t layer0_experts = 0;
    for (int64_t i = 0; i < n; i++) {
        if (v[i].family == DI_FAM_VISION) continue;
        int64_t b = di_inv_entry_bytes(&v[i]);
        s.text += b;
        if (strstr(v[i].name, "engram.embed.")) s.tables += b;
        if (strstr(v[i].name, ".ffn.experts.")) {
            s.experts += b;
            if (v[i].layer == 0) layer0_experts += b;
        }
        const char *w = strstr(v[i].name, "attn.wo_a.");
        if (w && !strcmp(w, "attn.wo_a.weight")) s.wo_a_extra += v[i].shape[0] * v[i].shape[1]; /* 2 B − 1 B */
        if (w && !strcmp(w, "attn.wo_a.scale")) s.wo_a_extra -= b;
    }
    s.expert_one = layer0_experts / c->n_routed_experts;
    free(v);
    return s;
}

/* ---------------- the released config on one H200 ---------------- */

static void test_released_refused(void **state) {
    (void)state;
    di_config *c = released();
    sums s = inventory_sums(c);
    /* spec §2.1: 509,315,486,040 text bytes, of which the two Engram tables are 202,758,032,400 */
    assert_int_equal(s.text, 509315486040LL);
    assert_int_equal(s.tables, 202758032400LL);
    /* wo_a [8·1024, 64·512/8] FP8 + [256, 128] scale → bf16: +33.5 MB on each of 40 + 3 stages */
    assert_int_equal(s.wo_a_extra, 43LL * (8192LL * 4096 - 256 * 128));

    di_memplan_opts o;
    di_memplan_opts_default(&o, DI_PLAN_CUDA);
    o.host_bytes = (int64_t)4 << 40;
    di_memplan *p = plan_of(c, &o);
    assert_int_equal(p->device_capacity, (int64_t)139 << 30);
    assert_int_equal(p->opts.max_tokens, 1048576);
    assert_int_equal(p->weights_stored, s.text);
    assert_int_equal(p->weights_stored_no_engram, s.text - s.tables);
    assert_int_equal(p->weight_host[DI_PLAN_ENGRAM_TABLES], s.tables);
    assert_int_equal(p->weights_host, s.tables);
    assert_int_equal(p->wo_a_extra, s.wo_a_extra);
    assert_int_equal(p->weights_dev, s.text - s.tables + s.wo_a_extra);
    assert_false(p->fits);
    assert_int_equal(p->max_seqs_fit, 0);
    assert_int_equal(p->max_tokens_fit, 0);
    di_error err = {0};
    assert_int_equal(di_memplan_check(p, &err), DI_ERR_LIMIT);
    assert_int_equal(err.code, DI_ERR_LIMIT);
    expect_substr(err.msg, "weights do not fit on cuda");
    expect_substr(err.msg, "509.32 GB");  /* stored */
    expect_substr(err.msg, "306.56 GB");  /* without the Engram tables */
    char over[64];
    snprintf(over, sizeof over, "over by %s", fmt(p->weights_dev - ((int64_t)139 << 30)));
    expect_substr(err.msg, over);
    expect_substr(err.msg, "over by 158.75 GB");
    snprintf(over, sizeof over, "the whole run needs %s, %s over", fmt(p->device_total),
             fmt(p->device_total - ((int64_t)139 << 30)));
    expect_substr(err.msg, over);
    expect_substr(err.msg, "--experts-on-host");
    tu_report("released cuda: %s on the device, %s on the host: %s", fmt(p->weights_dev), fmt(p->weights_host),
              err.msg);

    /* everything on the device: the whole 509 GB (+ wo_a) must be named */
    o.engram_on_host = false;
    di_memplan *q = plan_of(c, &o);
    assert_int_equal(q->weights_dev, s.text + s.wo_a_extra);
    assert_int_equal(q->weights_host, 0);
    assert_false(q->fits);
    snprintf(over, sizeof over, "over by %s", fmt(s.text + s.wo_a_extra - ((int64_t)139 << 30)));
    expect_substr(q->reason, over);
    expect_substr(q->reason, "Engram tables (202.76 GB) and routed experts");
    free(q);
    free(p);
    free(c);
}

static void test_released_offloaded(void **state) {
    (void)state;
    di_config *c = released();
    sums s = inventory_sums(c);
    di_memplan_opts o;
    di_memplan_opts_default(&o, DI_PLAN_CUDA);
    o.host_bytes = (int64_t)4 << 40;
    o.experts_on_host = true;
    o.max_seqs = 16;
    di_memplan *p = plan_of(c, &o);
    int64_t dev_w = s.text - s.tables - s.experts + s.wo_a_extra;
    assert_int_equal(p->weights_dev, dev_w);
    assert_int_equal(p->weights_host, s.tables + s.experts);
    assert_int_equal(p->weight_host[DI_FAM_EXPERTS], s.experts);
    assert_int_equal(p->weight_dev[DI_FAM_EXPERTS], 0);
    /* one routed expert: 3 × ([2304, 5120/2] I8 + [2304, 5120/32] E8M0) = 18.80 MB (spec §7.1) */
    assert_int_equal(s.expert_one, 3LL * (2304 * 2560 + 2304 * 160));
    assert_int_equal(p->expert_bytes, s.expert_one);

    /* the plan resolves the default margin from the config: 2 · (5 + 1) = 12 (cache.h) */
    assert_int_equal(p->opts.spec_margin, 12);
    di_cache_opts co = {.max_tokens = 1048576, .spec_margin = 12};
    di_cache_size cs;
    di_error err = {0};
    assert_int_equal(di_cache_size_of(c, &co, &cs, &err), DI_OK);
    assert_int_equal(p->cache.total_bytes, cs.total_bytes);
    assert_int_equal(p->caches_dev, 16 * cs.total_bytes);
    /* 16 × (5 + 1) = 96 verify tokens < the 2048-token prefill chunk */
    assert_int_equal(p->ws.tokens, 2048);
    assert_int_equal(p->ws.logits, 2048LL * 129280 * 4);
    /* the header's formula by hand at the released dimensions, bytes per step token:
     *   residual 2·4·5120·2 = 81920;  mhc (24 + 8 + 16)·4 + 2·5120·2 = 20672
     *   attention (1280 + 2·32768 + 512 + 8192)·2 + (8192 + 256) + 32·128·2 + 32·4
     *             + 65536·4 (1M ratio-1 keys, one tile) + (512 + 128)·4 = 432512
     *   moe 384·4 + 6·8 + 6·(10240 + 5280 + 18432 + 4608 + 2376 + 20480) + (18432 + 4608 + 20480) = 413600
     *   engram 24·(8 + 512) + 5·5120·2 = 63680;  logits 129280·4 = 517120
     * and once per step the backend gather's rows: ⌊262144 / 512⌋ = 512 tokens × 512 × 512 × 2 = 256 MiB */
    const int64_t gather = 512LL * 512 * 512 * 2;
    assert_int_equal(p->ws.residual, 2048LL * 81920);
    assert_int_equal(p->ws.mhc, 2048LL * 20672);
    assert_int_equal(p->ws.attention, 2048LL * 432512 + gather);
    assert_int_equal(p->ws.moe, 2048LL * 413600);
    assert_int_equal(p->ws.engram, 2048LL * 63680);
    assert_int_equal(p->ws.total, 2048LL * (81920 + 20672 + 432512 + 517120) + gather);
    /* a 2048-token step touches every one of the 384 experts: double-buffered whole layer */
    assert_int_equal(p->staging_dev, 2LL * 384 * s.expert_one);
    assert_int_equal(p->reserve_dev, DI_MEMPLAN_CUDA_RESERVE);
    assert_int_equal(p->device_total, dev_w + 16 * cs.total_bytes + p->ws.total + p->staging_dev + p->reserve_dev);
    assert_true(p->fits);
    assert_int_equal(di_memplan_check(p, &err), DI_OK);
    assert_true(p->weights_dev < 13000000000LL); /* backbone without experts/tables: ≈12 GB */
    tu_report("released cuda, Engram + experts on host, 16 × 1M: device %s (weights %s, caches %s, workspace %s, "
              "staging %s), host %s; at most %lld sequences of 1M",
              fmt(p->device_total), fmt(p->weights_dev), fmt(p->caches_dev), fmt(p->ws.total), fmt(p->staging_dev),
              fmt(p->host_total), (long long)p->max_seqs_fit);

    /* the host side is checked too */
    o.host_bytes = (int64_t)400e9;
    di_memplan *h = plan_of(c, &o);
    assert_false(h->fits);
    assert_int_equal(di_memplan_check(h, &err), DI_ERR_LIMIT);
    expect_substr(err.msg, "host-resident weights do not fit in host memory");
    char over[64];
    snprintf(over, sizeof over, "over by %s", fmt(s.tables + s.experts - (int64_t)400e9));
    expect_substr(err.msg, over);
    assert_int_equal(h->max_seqs_fit, 0);
    free(h);
    free(p);
    free(c);
}

/* ---------------- tiny preset on cpu ---------------- */

static void test_tiny_cpu(void **state) {
    (void)state;
    di_config *c = tiny();
    sums s = inventory_sums(c);
    di_memplan_opts o;
    di_memplan_opts_default(&o, DI_PLAN_CPU);
    o.max_seqs = 4;
    di_memplan *p = plan_of(c, &o); /* capacity: MemAvailable */
    int64_t avail = 0;
    di_error err = {0};
    assert_int_equal(di_memplan_host_available(&avail, &err), DI_OK);
    assert_true(p->device_capacity > 0);
    assert_int_equal(p->host_capacity, 0);
    assert_false(p->opts.engram_on_host); /* one memory on cpu */
    assert_int_equal(p->weights_host, 0);
    assert_int_equal(p->weights_stored, s.text);
    assert_int_equal(p->weights_dev, s.text + s.wo_a_extra);
    assert_true(s.wo_a_extra > 0);
    assert_int_equal(p->reserve_dev, 0);
    assert_int_equal(p->staging_dev, 0);
    di_cache_opts co = {.max_tokens = c->max_position_embeddings, .spec_margin = di_cache_default_margin(c)};
    di_cache_size cs;
    assert_int_equal(di_cache_size_of(c, &co, &cs, &err), DI_OK);
    assert_int_equal(p->caches_dev, 4 * cs.total_bytes);
    assert_int_equal(p->device_total, p->weights_dev + p->caches_dev + p->ws.total);
    assert_true(p->fits);
    assert_true(p->max_seqs_fit >= 4);
    assert_int_equal(p->max_tokens_fit, c->max_position_embeddings);
    tu_report("tiny cpu, 4 × %lld tokens: %s (weights %s, caches %s, workspace %s of %lld tokens) of %s",
              (long long)c->max_position_embeddings, fmt(p->device_total), fmt(p->weights_dev), fmt(p->caches_dev),
              fmt(p->ws.total), (long long)p->ws.tokens, fmt(p->device_capacity));

    /* a step never holds more tokens than the sequences: 1 × 16 tokens → 16-token workspace */
    o.max_seqs = 1;
    o.max_tokens = 16;
    di_memplan *q = plan_of(c, &o);
    assert_int_equal(q->ws.tokens, 16);
    assert_int_equal(q->ws.logits, 16LL * c->vocab_size * 4);
    free(q);
    free(p);
    free(c);
}

/* ---------------- largest fit: exact boundary, monotone ---------------- */

static bool fits_at(const di_config *c, di_memplan_opts o, int64_t seqs, int64_t tokens) {
    o.max_seqs = seqs;
    o.max_tokens = tokens;
    di_memplan *p = plan_of(c, &o);
    bool f = p->fits;
    free(p);
    return f;
}

static void check_boundary(const di_config *c, const di_memplan_opts *o, const char *what) {
    di_memplan *p = plan_of(c, o);
    int64_t k = p->max_seqs_fit, T = p->opts.max_tokens;
    assert_true(k >= 1);
    assert_true(fits_at(c, *o, k, T));
    assert_false(fits_at(c, *o, k + 1, T));
    /* monotone: fits from 1 up to k, never past it */
    const int64_t probe[] = {1, 2, k / 2, k - 1, k + 2, k + 3, 2 * k + 1};
    for (size_t i = 0; i < sizeof probe / sizeof probe[0]; i++)
        if (probe[i] >= 1) assert_int_equal(fits_at(c, *o, probe[i], T), probe[i] <= k);
    /* the plan at k + 1 names the caches, and the cache overflow is what the numbers say */
    di_memplan_opts o2 = *o;
    o2.max_seqs = k + 1;
    di_memplan *q = plan_of(c, &o2);
    assert_false(q->fits);
    char over[64];
    int64_t left = q->device_capacity - q->weights_dev;
    if (q->caches_dev > left) {
        expect_substr(q->reason, "caches do not fit");
        snprintf(over, sizeof over, "over by %s", fmt(q->caches_dev - left));
    } else {
        expect_substr(q->reason, "workspace does not fit");
        snprintf(over, sizeof over, "over by %s",
                 fmt(q->ws.total + q->staging_dev + q->reserve_dev - (left - q->caches_dev)));
    }
    expect_substr(q->reason, over);
    /* tokens for k + 1 sequences: exact boundary too */
    int64_t t = q->max_tokens_fit;
    assert_true(t >= 1 && t < T);
    assert_true(fits_at(c, *o, k + 1, t));
    assert_false(fits_at(c, *o, k + 1, t + 1));
    assert_false(fits_at(c, *o, k + 1, t + 1000));
    assert_true(fits_at(c, *o, k + 1, t > 1000 ? t - 1000 : 1));
    tu_report("%s: at most %lld sequences of %lld tokens; %lld sequences fit %lld tokens", what, (long long)k,
              (long long)T, (long long)(k + 1), (long long)t);
    free(q);
    free(p);
}

static void test_max_fit(void **state) {
    (void)state;
    di_config *c = released();
    di_memplan_opts o;
    di_memplan_opts_default(&o, DI_PLAN_CUDA);
    o.host_bytes = (int64_t)4 << 40;
    o.experts_on_host = true;
    check_boundary(c, &o, "released cuda 139 GiB, Engram + experts on host, 1M tokens");
    o.max_tokens = 65536;
    check_boundary(c, &o, "released cuda 139 GiB, Engram + experts on host, 64K tokens");
    free(c);

    di_config *t = tiny();
    di_memplan_opts_default(&o, DI_PLAN_CPU);
    o.max_tokens = 4096;
    di_memplan *p = plan_of(t, &o);
    /* room for the weights, the workspace of a full chunk and 37.5 sequences */
    o.device_bytes = p->weights_dev + p->ws.total + 75 * p->cache.total_bytes / 2;
    free(p);
    p = plan_of(t, &o);
    assert_int_equal(p->max_seqs_fit, 37);
    free(p);
    check_boundary(t, &o, "tiny cpu");
    free(t);
}

/* ---------------- each category named ---------------- */

static void test_workspace_overflow(void **state) {
    (void)state;
    di_config *c = tiny();
    di_memplan_opts o;
    di_memplan_opts_default(&o, DI_PLAN_CPU);
    o.max_tokens = 4096;
    o.device_bytes = (int64_t)1 << 40;
    di_memplan *p = plan_of(c, &o);
    int64_t need = p->weights_dev + p->caches_dev + p->ws.total;
    o.device_bytes = need - 1; /* one byte short, in the workspace */
    di_memplan *q = plan_of(c, &o);
    assert_false(q->fits);
    expect_substr(q->reason, "workspace does not fit on cpu");
    expect_substr(q->reason, "over by 1 B");
    assert_int_equal(q->max_seqs_fit, 0); /* one sequence already needs that step */
    o.device_bytes = need;
    di_memplan *r = plan_of(c, &o);
    assert_true(r->fits);
    assert_int_equal(r->device_total, need);
    free(r);
    free(q);
    free(p);
    free(c);
}

/* ---------------- bad input ---------------- */

static void test_bad_input(void **state) {
    (void)state;
    di_config *c = tiny();
    di_memplan_opts o;
    di_memplan p;
    di_error err = {0};
    di_memplan_opts_default(&o, DI_PLAN_CUDA);
    o.host_bytes = 1;
    o.max_tokens = c->max_position_embeddings + 1;
    assert_int_equal(di_memplan_compute(c, &o, &p, &err), DI_ERR_INVALID);
    expect_substr(err.msg, "max_position_embeddings");
    o.max_tokens = 0;
    o.max_seqs = 0;
    assert_int_equal(di_memplan_compute(c, &o, &p, &err), DI_ERR_INVALID);
    expect_substr(err.msg, "max_seqs 0");
    o.max_seqs = 1;
    o.spec_margin = 5000; /* the cache module's limit */
    assert_int_equal(di_memplan_compute(c, &o, &p, &err), DI_ERR_INVALID);
    expect_substr(err.msg, "spec_margin");
    o.spec_margin = 0;
    o.device = (di_plan_device)7;
    assert_int_equal(di_memplan_compute(c, &o, &p, &err), DI_ERR_INVALID);
    assert_int_equal(di_memplan_compute(NULL, &o, &p, &err), DI_ERR_INVALID);

    static const struct {
        const char *s;
        int64_t v;
    } ok[] = {{"139GiB", (int64_t)139 << 30}, {"149.25 GB", 149250000000LL}, {"512MiB", (int64_t)512 << 20},
              {"1e9", 1000000000}, {"1073741824", 1073741824}, {"2tib", (int64_t)2 << 40}, {"10kb", 10000}, {"7B", 7}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int64_t v = -1;
        if (di_memplan_parse_bytes(ok[i].s, &v, &err)) fail_msg("%s: %s", ok[i].s, err.msg);
        assert_int_equal(v, ok[i].v);
    }
    static const char *bad[] = {"", "GiB", "12XB", "-5GB", "nan", "1e30", "5 G i B", "3GiBs"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t v = -1;
        assert_int_equal(di_memplan_parse_bytes(bad[i], &v, &err), DI_ERR_INVALID);
        assert_int_equal(v, -1);
    }
    assert_int_equal(di_memplan_parse_bytes(NULL, NULL, &err), DI_ERR_INVALID);
    free(c);
}

/* The table names every category and the verdict. */
static void test_print(void **state) {
    (void)state;
    di_config *c = released();
    di_memplan_opts o;
    di_memplan_opts_default(&o, DI_PLAN_CUDA);
    o.host_bytes = (int64_t)4 << 40;
    di_memplan *p = plan_of(c, &o);
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    di_memplan_print(p, f);
    fclose(f);
    static const char *want[] = {"engram tables", "202.76 GB", "wo_a as bf16", "caches", "workspace",
                                 "runtime reserve", "DOES NOT FIT", "weights do not fit", "largest fit: 0 sequences"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) expect_substr(buf, want[i]);
    free(buf);
    free(p);
    free(c);
}

/* ---------------- deepinfer plan ---------------- */

/* Run `deepinfer plan ARGS --json` in-process (the CLI objects are not in the library, so this test
 * compiles tools/cli.c and tools/cmd_plan.c itself): the parsed stdout document (NULL if none) and
 * the exit status. ARGS is split on spaces. */
static json_t *run_plan(const char *args, int *status) {
    char buf[1024], *argv[64] = {"plan"};
    int argc = 1;
    snprintf(buf, sizeof buf, "%s --json", args);
    for (char *t = strtok(buf, " "); t && argc < 63; t = strtok(NULL, " ")) argv[argc++] = t;
    FILE *out = tmpfile(), *errf = tmpfile();
    if (!out || !errf) fail_msg("tmpfile");
    fflush(stdout);
    fflush(stderr);
    int so = dup(1), se = dup(2);
    dup2(fileno(out), 1);
    dup2(fileno(errf), 2);
    *status = cmd_plan(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    rewind(out);
    json_error_t je;
    json_t *doc = json_loadf(out, 0, &je);
    fclose(out);
    fclose(errf);
    return doc;
}

static void test_cli(void **state) {
    (void)state;
    int st;
    char args[512];
    json_t *doc;
    di_config *c = released();
    sums s = inventory_sums(c);

    snprintf(args, sizeof args, "--config %s --device cuda --host-memory 4TiB --experts-on-host --max-seqs 16",
             tu_data("v41-flash-config/config.json"));
    doc = run_plan(args, &st);
    assert_non_null(doc);
    assert_int_equal(st, 0);
    assert_true(json_is_true(json_object_get(doc, "ok")));
    assert_true(json_is_true(json_object_get(doc, "fits")));
    json_t *w = json_object_get(doc, "weights");
    assert_int_equal(json_integer_value(json_object_get(w, "device_total")),
                     s.text - s.tables - s.experts + s.wo_a_extra);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(w, "host"), "engram tables")), s.tables);
    assert_int_equal(json_integer_value(json_object_get(doc, "max_seqs")), 16);
    assert_int_equal(json_integer_value(json_object_get(doc, "max_seqs_fit")), 127);
    json_decref(doc);

    /* the refusal: exit 1, the whole plan, and the reason */
    snprintf(args, sizeof args, "--model %s --device cuda --device-memory 139GiB --host-memory 4TiB",
             tu_data("v41-flash-config"));
    doc = run_plan(args, &st);
    assert_non_null(doc);
    assert_int_equal(st, 1);
    assert_true(json_is_false(json_object_get(doc, "ok")));
    assert_true(json_is_false(json_object_get(doc, "fits")));
    expect_substr(json_string_value(json_object_get(doc, "error")), "weights do not fit on cuda");
    assert_int_equal(json_integer_value(json_object_get(doc, "device_capacity")), (int64_t)139 << 30);
    json_decref(doc);

    /* bad options */
    static const char *bad[][2] = {{"--device-memory 12XB", "unknown unit"},
                                   {"--max-seqs 0", "--max-seqs"},
                                   {"--device tpu", "--device"},
                                   {"--max-tokens 99999999", "max_position_embeddings"},
                                   {"--frobnicate", "unexpected argument"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "--config %s %s", tu_data("v41-flash-config/config.json"), bad[i][0]);
        doc = run_plan(args, &st);
        assert_non_null(doc);
        assert_int_equal(st, 1);
        assert_true(json_is_false(json_object_get(doc, "ok")));
        expect_substr(json_string_value(json_object_get(doc, "error")), bad[i][1]);
        json_decref(doc);
    }
    doc = run_plan("--config /nonexistent/config.json", &st);
    assert_non_null(doc);
    assert_int_equal(st, 1);
    json_decref(doc);
    free(c);
}


/* ---------------- the check a run makes before loading ---------------- */

/* di_memplan_preflight reads only config.json: the released V4.1 config is refused on one GPU with
 * the overflowing category named, before any weight file is opened (the directory has none), and the
 * tiny golden model passes with its one-line plan written to the log. */
static void test_preflight(void **state) {
    (void)state;
    di_error err = {0};
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    int rc = di_memplan_preflight(tu_data("v41-flash-config"), DI_PLAN_CUDA, 1, 4096, f, &err);
    fclose(f);
    assert_int_equal(rc, DI_ERR_LIMIT);
    expect_substr(err.msg, "weights do not fit on cuda");
    expect_substr(buf, "memory plan (cuda, 1 × 4096 tokens)");
    expect_substr(buf, "does not fit");
    free(buf);

    buf = NULL;
    f = open_memstream(&buf, &n);
    err = (di_error){0};
    rc = di_memplan_preflight(tu_data("v41-tiny-sel"), DI_PLAN_CUDA, 2, 0, f, &err);
    fclose(f);
    assert_int_equal(rc, DI_OK);
    expect_substr(buf, "memory plan (cuda, 2 × ");
    assert_null(strstr(buf, "does not fit"));
    free(buf);

    /* a context above max_position_embeddings is clamped (the run rejects the prompt itself) */
    err = (di_error){0};
    assert_int_equal(di_memplan_preflight(tu_data("v41-tiny-sel"), DI_PLAN_CPU, 1, (int64_t)1 << 40, NULL, &err), DI_OK);
    /* no config: the loader's error, naming the directory */
    err = (di_error){0};
    assert_int_not_equal(di_memplan_preflight("/nonexistent-model-dir", DI_PLAN_CPU, 1, 16, NULL, &err), DI_OK);
    expect_substr(err.msg, "/nonexistent-model-dir");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_released_refused),   cmocka_unit_test(test_released_offloaded),
        cmocka_unit_test(test_tiny_cpu),           cmocka_unit_test(test_max_fit),
        cmocka_unit_test(test_workspace_overflow), cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_print),              cmocka_unit_test(test_cli),
        cmocka_unit_test(test_preflight),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
