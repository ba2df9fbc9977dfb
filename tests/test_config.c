/* Config parsing, derived layer roles, cache footprint and Engram constants.  di-test: asan */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "model/config.h"
#include "model/engram_consts.h"
#include "testutil.h"
#include "util/log.h"

static char *read_text(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) fail_msg("short read %s", path);
    b[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void load_ok(const char *dir, di_config *c) {
    di_error err = {0};
    int rc = di_config_load(dir, c, &err);
    if (rc != DI_OK) fail_msg("%s: %s", dir, err.msg);
}

/* ---- the released V4.1-Flash config (spec §1.2) ---- */

static void test_released_fields(void **state) {
    (void)state;
    di_config *c = malloc(sizeof *c);
    load_ok(tu_data("v41-flash-config"), c);
    assert_string_equal(c->model_type, "deepseek_v41");
    assert_int_equal(c->hidden_size, 5120);
    assert_int_equal(c->n_layers, 40);
    assert_int_equal(c->n_dspark, 3);
    assert_int_equal(c->n_stages, 43);
    assert_int_equal(c->num_attention_heads, 64);
    assert_int_equal(c->head_dim, 512);
    assert_int_equal(c->qk_rope_head_dim, 64);
    assert_int_equal(c->q_lora_rank, 1280);
    assert_int_equal(c->o_lora_rank, 1024);
    assert_int_equal(c->o_groups, 8);
    assert_int_equal(c->sliding_window, 128);
    assert_int_equal(c->n_compress_ratios, 43);
    assert_int_equal(c->index_n_heads, 32);
    assert_int_equal(c->index_head_dim, 128);
    assert_int_equal(c->index_topk, 512);
    assert_int_equal(c->candidate_source_layer_id, 20);
    assert_int_equal(c->candidate_topk_blocks, 2048);
    assert_int_equal(c->candidate_block_size, 8);
    assert_true(c->rope_theta == 10000 && c->compress_rope_theta == 160000);
    assert_string_equal(c->rope_scaling_type, "yarn");
    assert_true(c->rope_factor == 16);
    assert_int_equal(c->rope_beta_fast, 32);
    assert_int_equal(c->rope_beta_slow, 1);
    assert_int_equal(c->rope_original_max_position_embeddings, 65536);
    assert_int_equal(c->max_position_embeddings, 1048576);
    assert_int_equal(c->vocab_size, 129280);
    assert_int_equal(c->n_routed_experts, 384);
    assert_int_equal(c->num_experts_per_tok, 6);
    assert_int_equal(c->moe_intermediate_size, 2304);
    assert_string_equal(c->scoring_func, "sqrtsoftplus");
    assert_true(c->norm_topk_prob);
    assert_true(c->routed_scaling_factor == 1.5 && c->swiglu_limit == 10.0 && c->gate_temp == 1.0);
    assert_int_equal(c->hc_mult, 4);
    assert_int_equal(c->hc_sinkhorn_iters, 20);
    assert_true(c->hc_eps == 1e-6 && c->rms_norm_eps == 1e-20);
    assert_int_equal(c->n_engram_layers, 2);
    assert_int_equal(c->engram_num_embeddings[1], 384016682);
    assert_int_equal(c->engram_compressed_vocab_size, 99092);
    assert_int_equal(c->engram_pad_token_id, 2);
    assert_int_equal(c->dspark_block_size, 5);
    assert_int_equal(c->dspark_noise_token_id, 128799);
    assert_int_equal(c->dspark_n_routed_experts, 128);
    assert_int_equal(c->dspark_num_experts_per_tok, 3);
    assert_int_equal(c->weight_fmt, DI_WFMT_FP8);
    assert_int_equal(c->expert_fmt, DI_WFMT_FP4);
    assert_int_equal(c->weight_block_size, 32);
    assert_true(c->has_vision);
    assert_int_equal(c->vision.num_hidden_layers, 32);
    assert_int_equal(c->vision.intermediate_size, 2816);
    assert_int_equal(c->image_token_id, 129264);
    di_config_free(c);
    free(c);
}

/* The role table of spec §1.2, layer by layer. */
static void test_released_roles(void **state) {
    (void)state;
    di_config *c = malloc(sizeof *c);
    load_ok(tu_data("v41-flash-config"), c);
    int n_role[DI_ROLE_COUNT] = {0};
    for (int L = 0; L < c->n_stages; L++) {
        const di_layer_cfg *l = &c->layer[L];
        n_role[l->role]++;
        int src = L == 2 || L == 8 || L == 14 || L == 20;
        int reidx = L == 24 || L == 28 || L == 32 || L == 36;
        if (L < 2) {
            assert_int_equal(l->role, DI_ROLE_SWA);
            assert_int_equal(l->rope, DI_ROPE_PLAIN);
            assert_false(l->rope_yarn);
            assert_int_equal(l->kv_source, -1);
        } else if (L < 40) {
            assert_int_equal(l->compress_ratio, L < 20 ? 2 : 1);
            assert_int_equal(l->rope, DI_ROPE_COMPRESS);
            assert_true(l->rope_yarn && l->rope_base == 160000);
            /* reuse layers read the latest kv source (2, 8, 14, 20) and index source */
            int kv = L >= 20 ? 20 : L >= 14 ? 14 : L >= 8 ? 8 : 2;
            int ix = L >= 36 ? 36 : L >= 32 ? 32 : L >= 28 ? 28 : L >= 24 ? 24 : kv;
            assert_int_equal(l->kv_source, kv);
            assert_int_equal(l->index_source, ix);
            assert_int_equal(l->has_compressor, src);
            assert_int_equal(l->has_compressor_gate, src && L != 20);
            assert_int_equal(l->has_indexer, src || reidx);
            assert_int_equal(l->has_index_wk, src);
            if (L == 20)
                assert_int_equal(l->role, DI_ROLE_CANDIDATE_SOURCE);
            else if (src)
                assert_int_equal(l->role, DI_ROLE_SOURCE);
            else if (reidx)
                assert_int_equal(l->role, DI_ROLE_REINDEX);
            else
                assert_int_equal(l->role, DI_ROLE_REUSE);
            if (reidx) {
                assert_int_equal(l->index_key_source, 20);
                assert_int_equal(l->candidate_source, 20);
            } else {
                assert_int_equal(l->candidate_source, -1); /* layer 20's own selection is not masked */
            }
        } else {
            assert_int_equal(l->role, DI_ROLE_DSPARK);
            assert_int_equal(l->dspark_stage, L - 40);
            assert_int_equal(l->n_experts, 128);
            assert_int_equal(l->n_active_experts, 3);
            assert_int_equal(l->rope, DI_ROPE_PLAIN);
            assert_int_equal(l->has_main_proj, L == 40);
            assert_int_equal(l->has_draft_head, L == 42);
        }
        assert_int_equal(l->engram_index, L == 1 ? 0 : L == 14 ? 1 : -1);
        assert_int_equal(l->dspark_target, L >= 37 && L <= 39);
        if (L < 40) assert_int_equal(l->n_experts, 384);
    }
    assert_int_equal(n_role[DI_ROLE_SWA], 2);
    assert_int_equal(n_role[DI_ROLE_SOURCE], 3);
    assert_int_equal(n_role[DI_ROLE_CANDIDATE_SOURCE], 1);
    assert_int_equal(n_role[DI_ROLE_REINDEX], 4);
    assert_int_equal(n_role[DI_ROLE_REUSE], 30);
    assert_int_equal(n_role[DI_ROLE_DSPARK], 3);
    free(c);
}

/* config.json alone gives the same struct as config.json + inference/config.json. */
static void test_hf_only_equals_both(void **state) {
    (void)state;
    size_t hl, il;
    char *hf = read_text(tu_data("v41-flash-config/config.json"), &hl);
    char *inf = read_text(tu_data("v41-flash-config/inference/config.json"), &il);
    di_config *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    di_error err = {0};
    assert_int_equal(di_config_parse(hf, hl, NULL, 0, "released", a, &err), DI_OK);
    assert_int_equal(di_config_parse(hf, hl, inf, il, "released", b, &err), DI_OK);
    assert_memory_equal(a, b, sizeof *a);
    free(a);
    free(b);
    free(hf);
    free(inf);
}

/* Keys absent from config.json come from inference/config.json; 0 DSpark expert counts mean "as the
 * backbone". */
static void test_inference_fills_gaps(void **state) {
    (void)state;
    const char *hf = "{\"model_type\":\"deepseek_v41\",\"text_config\":{\"hidden_size\":256,\"num_hidden_layers\":2,"
                     "\"vocab_size\":512,\"head_dim\":64,\"num_nextn_predict_layers\":1}}";
    const char *inf = "{\"dim\":999,\"n_layers\":9,\"n_heads\":4,\"qk_rope_head_dim\":1,\"rope_head_dim\":16,"
                      "\"q_lora_rank\":64,\"o_lora_rank\":64,\"o_groups\":2,\"window_size\":16,"
                      "\"compress_ratios\":[0,0,0],\"rope_theta\":10000,\"n_routed_experts\":8,"
                      "\"n_activated_experts\":3,\"moe_inter_dim\":128,\"dtype\":\"fp8\",\"expert_dtype\":\"fp4\","
                      "\"dspark_block_size\":2,\"dspark_target_layer_ids\":[1],\"dspark_n_routed_experts\":0,"
                      "\"dspark_n_activated_experts\":0,\"dspark_markov_rank\":32,\"norm_eps\":1e-20}";
    di_config *c = calloc(1, sizeof *c);
    di_error err = {0};
    di_log_level lv = di_log_get_level();
    di_log_set_level(DI_LOG_ERROR); /* the dim/n_layers disagreement warns */
    int rc = di_config_parse(hf, strlen(hf), inf, strlen(inf), "gaps", c, &err);
    di_log_set_level(lv);
    if (rc) fail_msg("%s", err.msg);
    assert_int_equal(c->hidden_size, 256);         /* config.json wins */
    assert_int_equal(c->n_layers, 2);
    assert_int_equal(c->num_attention_heads, 4);   /* filled from inference */
    assert_int_equal(c->qk_rope_head_dim, 16);     /* inference's own name, not the HF one */
    assert_int_equal(c->n_routed_experts, 8);
    assert_int_equal(c->dspark_n_routed_experts, 8); /* 0 = same as backbone */
    assert_int_equal(c->dspark_num_experts_per_tok, 3);
    assert_int_equal(c->layer[2].n_experts, 8);
    assert_int_equal(c->weight_fmt, DI_WFMT_FP8);
    assert_int_equal(c->expert_fmt, DI_WFMT_FP4);
    assert_false(c->has_vision);
    assert_int_equal(c->n_engram_layers, 0);
    free(c);
}

/* Roles of the golden cases as their README describes them: SWA-only, ratio-2 kv+index source,
 * ratio-2 reuse, ratio-1 candidate source, ratio-1 reuse, candidate-masked re-index; Engram on 0, 1. */
static void check_tiny_roles(const di_config *c, int dspark_experts, int dspark_topk) {
    static const di_layer_role want[6] = {DI_ROLE_SWA,   DI_ROLE_SOURCE, DI_ROLE_REUSE, DI_ROLE_CANDIDATE_SOURCE,
                                          DI_ROLE_REUSE, DI_ROLE_REINDEX};
    static const int ratio[6] = {0, 2, 2, 1, 1, 1};
    assert_int_equal(c->n_layers, 6);
    assert_int_equal(c->n_dspark, 1);
    for (int L = 0; L < 6; L++) {
        assert_int_equal(c->layer[L].role, want[L]);
        assert_int_equal(c->layer[L].compress_ratio, ratio[L]);
        assert_int_equal(c->layer[L].engram_index, L <= 1 ? L : -1);
    }
    assert_int_equal(c->layer[2].kv_source, 1);
    assert_int_equal(c->layer[4].kv_source, 3);
    assert_int_equal(c->layer[5].index_key_source, 3);
    assert_int_equal(c->layer[5].candidate_source, 3);
    assert_int_equal(c->layer[3].candidate_source, -1);
    assert_false(c->layer[3].has_compressor_gate);
    assert_true(c->layer[1].has_compressor_gate);
    assert_int_equal(c->layer[6].role, DI_ROLE_DSPARK);
    assert_true(c->layer[6].has_main_proj && c->layer[6].has_draft_head);
    assert_int_equal(c->layer[6].n_experts, dspark_experts);
    assert_int_equal(c->layer[6].n_active_experts, dspark_topk);
    assert_true(c->layer[4].dspark_target && c->layer[5].dspark_target && !c->layer[3].dspark_target);
    assert_false(c->has_vision);
}

static void test_golden_roles(void **state) {
    (void)state;
    di_config *c = malloc(sizeof *c);
    load_ok(tu_data("v41-tiny-sel"), c);
    check_tiny_roles(c, 4, 2);
    assert_int_equal(c->index_topk, 8);
    assert_int_equal(c->candidate_topk_blocks, 3);
    load_ok(tu_data("v41-tiny-nosel"), c);
    check_tiny_roles(c, 8, 3); /* "8 experts top-3" */
    const char *mid = tu_shared_golden("v41-mid-nosel");
    if (mid) {
        load_ok(mid, c);
        check_tiny_roles(c, 4, 2);
        assert_int_equal(c->head_dim, 512);
        assert_true(c->layer[1].rope_yarn); /* "YaRN active" */
        assert_false(c->layer[0].rope_yarn);
    } else {
        tu_report("mid golden case: skipped (../shared/golden/v41-mid-nosel absent)");
    }
    free(c);
}

/* ---- malformed configs: each a clear error naming the key ---- */

/* Parse the released config.json after replacing `from` with `to` in its text. */
static int parse_edited(const char *from, const char *to, di_error *err) {
    size_t hl;
    char *hf = read_text(tu_data("v41-flash-config/config.json"), &hl);
    char *p = strstr(hf, from);
    if (!p) fail_msg("fixture lacks '%s'", from);
    size_t fl = strlen(from), tl = strlen(to);
    char *ed = malloc(hl - fl + tl + 1);
    memcpy(ed, hf, (size_t)(p - hf));
    memcpy(ed + (p - hf), to, tl);
    strcpy(ed + (p - hf) + tl, p + fl);
    di_config *c = malloc(sizeof *c);
    int rc = di_config_parse(ed, strlen(ed), NULL, 0, "edited", c, err);
    free(c);
    free(ed);
    free(hf);
    return rc;
}

static void expect_bad(const char *from, const char *to, int code, const char *needle) {
    di_error err = {0};
    int rc = parse_edited(from, to, &err);
    if (rc == DI_OK) fail_msg("accepted config with '%s' -> '%s'", from, to);
    assert_int_equal(rc, code);
    if (!strstr(err.msg, needle)) fail_msg("error '%s' does not mention '%s'", err.msg, needle);
    assert_non_null(strstr(err.msg, "edited"));
}

static void test_malformed(void **state) {
    (void)state;
    expect_bad("\"model_type\": \"deepseek_v41\"", "\"model_type\": \"deepseek_v4\"", DI_ERR_UNSUPPORTED,
               "'deepseek_v4' is not supported");
    expect_bad("\"model_type\": \"deepseek_v41\"", "\"model_type\": \"llama\"", DI_ERR_UNSUPPORTED, "llama");
    expect_bad("\"model_type\": \"deepseek_v41_text\"", "\"model_type\": \"qwen\"", DI_ERR_UNSUPPORTED,
               "text_config.model_type");
    expect_bad("\"hidden_size\": 5120", "\"hidden_size\": 5121", DI_ERR_INVALID, "multiple of 32");
    expect_bad("\"hidden_size\": 5120", "\"hidden_size\": \"5120\"", DI_ERR_INVALID, "text_config.hidden_size");
    expect_bad("\"hidden_size\": 5120,", "", DI_ERR_INVALID, "missing required key 'text_config.hidden_size'");
    expect_bad("\"num_hidden_layers\": 40", "\"num_hidden_layers\": 41", DI_ERR_INVALID, "compress_ratios has 43");
    expect_bad("\"kv_source_layer_ids\": [\n   2,", "\"kv_source_layer_ids\": [\n   99,", DI_ERR_INVALID,
               "kv_source_layer_ids");
    expect_bad("\"kv_source_layer_ids\": [\n   2,", "\"kv_source_layer_ids\": [\n   1,", DI_ERR_INVALID,
               "layer 1 is listed as a kv source but compress_ratios[1] is 0");
    expect_bad("\"kv_source_layer_ids\": [\n   2,", "\"kv_source_layer_ids\": [\n   3,", DI_ERR_INVALID,
               "layer 2 has compress ratio 2 but no kv source");
    expect_bad("\"candidate_source_layer_id\": 20", "\"candidate_source_layer_id\": 21", DI_ERR_INVALID,
               "candidate_source_layer_id 21");
    expect_bad("\"engram_layer_ids\": [\n   1,", "\"engram_layer_ids\": [\n   7,\n   9,", DI_ERR_INVALID,
               "engram_num_embeddings has 2 entries but engram_layer_ids has 3");
    expect_bad("\"num_experts_per_tok\": 6", "\"num_experts_per_tok\": 500", DI_ERR_INVALID, "exceeds");
    expect_bad("\"num_experts_per_tok\": 6", "\"num_experts_per_tok\": 65", DI_ERR_INVALID,
               "at most 64 active experts");
    /* a ratio the compressor kernels cannot pool is refused at load, not mid-forward */
    expect_bad("\"compress_ratios\": [\n   0,\n   0,\n   2,", "\"compress_ratios\": [\n   0,\n   0,\n   129,", DI_ERR_INVALID,
               "integers in [0, 128]");
    expect_bad("\"weight_block_size\": [\n   32,", "\"weight_block_size\": [\n   128,", DI_ERR_INVALID,
               "weight_block_size");
    expect_bad("\"text_config\": {", "\"text_config\": 7, \"x\": {", DI_ERR_INVALID, "'text_config' must be an object");
    expect_bad("\"dspark_target_layer_ids\": [\n   37,", "\"dspark_target_layer_ids\": [\n   40,", DI_ERR_INVALID,
               "dspark_target_layer_ids");

    /* bad JSON in either document */
    di_config *c = malloc(sizeof *c);
    di_error err = {0};
    const char *bad = "{\"model_type\": \"deepseek_v41\", ";
    assert_int_equal(di_config_parse(bad, strlen(bad), NULL, 0, "dir", c, &err), DI_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "config.json: invalid JSON"));
    size_t hl;
    char *hf = read_text(tu_data("v41-flash-config/config.json"), &hl);
    assert_int_equal(di_config_parse(hf, hl, "[1,2]", 5, "dir", c, &err), DI_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "inference/config.json"));
    assert_int_equal(di_config_parse(hf, hl, "{\"dim\": nope}", 13, "dir", c, &err), DI_ERR_FORMAT);
    assert_int_equal(di_config_parse("", 0, NULL, 0, "dir", c, &err), DI_ERR_FORMAT);
    assert_int_equal(di_config_load("/nonexistent-dir-xyz", c, &err), DI_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent-dir-xyz/config.json"));
    free(hf);
    free(c);
}

/* ---- cache footprint (spec §4.7, §7.2): 890 B/token at 1M for the released config ---- */
static void test_cache_footprint(void **state) {
    (void)state;
    di_config *c = malloc(sizeof *c);
    load_ok(tu_data("v41-flash-config"), c);
    double per_token = 0;
    int64_t fixed = 0;
    for (int L = 0; L < c->n_stages; L++) {
        di_cache_footprint f;
        di_cache_footprint_of(c, L, &f);
        assert_int_equal(f.window_bytes, 128 * 528);
        per_token += f.per_token_bytes;
        fixed += f.window_bytes + f.compressor_state_bytes;
        if (L == 2) {
            assert_int_equal(f.compressed_entry_bytes, 288);
            assert_int_equal(f.index_key_bytes, 68);
            assert_true(f.per_token_bytes == 178.0);
            assert_int_equal(f.compressor_state_bytes, 2 * 2 * 512 * 4);
        }
        if (L == 20) assert_true(f.per_token_bytes == 356.0 && f.compressor_state_bytes == 0);
        if (L == 21) assert_true(f.per_token_bytes == 0);
    }
    assert_true(per_token == 890.0);
    tu_report("released cache bytes/token: %.1f, fixed: %lld", per_token, (long long)fixed);
    free(c);
}

/* ---- Engram constants ---- */

static const int64_t *st_i64(const di_safetensors *st, const char *name, int64_t n) {
    const di_tensor_info *t = di_st_find(st, name);
    assert_non_null(t);
    assert_int_equal(t->dtype, DI_I64);
    assert_int_equal(t->end - t->begin, (uint64_t)n * 8);
    int64_t *v = malloc((size_t)n * 8);
    memcpy(v, t->data, (size_t)n * 8);
    return v;
}

static void test_engram_released(void **state) {
    (void)state;
    di_config *c = malloc(sizeof *c);
    load_ok(tu_data("v41-flash-config"), c);
    assert_true(di_engram_is_released_layout(c));
    di_engram_consts ec;
    di_error err = {0};
    if (di_engram_consts_load(c, tu_data("v41-flash-config"), &ec, &err)) fail_msg("%s", err.msg);
    assert_string_equal(ec.source, "published V4.1-Flash constants");
    assert_null(ec.token_map);
    assert_int_equal(ec.pad_compressed_id, -1);
    /* must match the reference's values in kernels.safetensors exactly */
    di_safetensors *st;
    assert_int_equal(di_st_open(tu_data("kernels.safetensors"), &st, &err), DI_OK);
    const int64_t *primes = st_i64(st, "engram.primes", 48), *mult = st_i64(st, "engram.multipliers", 8);
    assert_memory_equal(ec.primes, primes, 48 * 8);
    assert_memory_equal(ec.multipliers, mult, 8 * 8);
    assert_int_equal(di_engram_prime(&ec, 1, 2, 7), 16000889);
    assert_int_equal(ec.offsets[0], 0);
    assert_int_equal(ec.offsets[1], 16000057);
    assert_int_equal(ec.offsets[24 + 23] + ec.primes[24 + 23], 384016682);
    assert_int_equal(di_engram_multiplier_max(c), 93078876567781LL);
    /* "≥": a prime argument is its own answer (16000057 is the first modulus, 16000079 the second) */
    assert_int_equal(di_engram_next_prime(16000000), 16000057);
    assert_int_equal(di_engram_next_prime(16000057), 16000057);
    assert_int_equal(di_engram_next_prime(16000058), 16000079);
    assert_int_equal(di_engram_next_prime(0), 2);
    free((void *)primes);
    free((void *)mult);
    di_st_close(st);

    /* a tokenizer-built map attached later sets the pad id */
    int32_t map[8] = {0, 1, 2, 2, 3, 4, 5, 6};
    assert_int_equal(di_engram_consts_set_token_map(&ec, c, map, 8, &err), DI_OK);
    assert_int_equal(ec.pad_compressed_id, 2);
    map[5] = 99092;
    assert_int_equal(di_engram_consts_set_token_map(&ec, c, map, 8, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "token 5"));
    di_engram_consts_free(&ec);

    /* any other layout without the sidecar is refused */
    c->engram_compressed_vocab_size = 99093;
    assert_int_equal(di_engram_consts_load(c, tu_data("v41-flash-config"), &ec, &err), DI_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, DI_ENGRAM_SIDECAR));
    c->engram_compressed_vocab_size = 99092;
    c->engram_num_embeddings[0]++;
    assert_int_equal(di_engram_consts_load(c, NULL, &ec, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "engram_num_embeddings is 384006169"));
    free(c);
}

static void test_engram_sidecar(void **state) {
    (void)state;
    di_config *c = malloc(sizeof *c);
    load_ok(tu_data("v41-tiny-sel"), c);
    di_engram_consts ec;
    di_error err = {0};
    if (di_engram_consts_load(c, tu_data("v41-tiny-sel"), &ec, &err)) fail_msg("%s", err.msg);
    assert_string_equal(ec.source, DI_ENGRAM_SIDECAR);
    assert_int_equal(ec.n_layers, 2);
    assert_int_equal(ec.token_map_len, 512);
    assert_int_equal(ec.token_map[5], 2); /* stub tokenizer: 2k, 2k+1 -> k */
    assert_int_equal(ec.pad_compressed_id, 1);
    assert_int_equal(ec.primes[0], 101);
    assert_int_equal(di_engram_prime(&ec, 1, 2, 1), 157);
    assert_int_equal(ec.offsets[6 + 5], 707);
    assert_int_equal(ec.multipliers[0], 22948963341361471LL);
    /* the derived layout alone (for sidecar writers) has the same primes/offsets, no multipliers */
    di_engram_consts d;
    assert_int_equal(di_engram_consts_derive(c, &d, &err), DI_OK);
    assert_memory_equal(d.primes, ec.primes, 12 * 8);
    assert_memory_equal(d.offsets, ec.offsets, 12 * 8);
    assert_int_equal(d.multipliers[0], 0);
    assert_null(d.token_map);
    di_engram_consts_free(&d);
    assert_int_equal(di_engram_multiplier_max(c), 36028797018963965LL); /* compressed vocab 256 */
    di_engram_consts_free(&ec);

    /* a sidecar whose primes do not match the config's layout is rejected, naming file and tensor */
    char *dir = tu_tmpdir("engram");
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, DI_ENGRAM_SIDECAR);
    int32_t map[512];
    for (int i = 0; i < 512; i++) map[i] = i / 2;
    int64_t primes[12] = {101, 103, 107, 109, 113, 127, 131, 137, 139, 149, 151, 163};
    int64_t offs[12] = {0, 101, 204, 311, 420, 533, 0, 131, 268, 407, 556, 707};
    int64_t mult[8] = {3, 5, 7, 9, 11, 13, 15, 17}, pad = 1;
    di_tensor_spec sp[5] = {{"token_map", DI_I32, 1, {512}},
                            {"primes", DI_I64, 3, {2, 3, 2}},
                            {"offsets", DI_I64, 2, {2, 6}},
                            {"multipliers", DI_I64, 2, {2, 4}},
                            {"pad_compressed_id", DI_I64, 1, {1}}};
    const void *data[5] = {map, primes, offs, mult, &pad};
    assert_int_equal(di_st_write_file(path, sp, data, 5, &err), DI_OK);
    assert_int_equal(di_engram_consts_load(c, dir, &ec, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "'primes' element 11 is 163"));
    assert_non_null(strstr(err.msg, DI_ENGRAM_SIDECAR));
    primes[11] = 157;
    mult[3] = 10; /* even */
    assert_int_equal(di_st_write_file(path, sp, data, 5, &err), DI_OK);
    assert_int_equal(di_engram_consts_load(c, dir, &ec, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "'multipliers' element 3 is 10"));
    mult[3] = 9;
    pad = 0;
    assert_int_equal(di_st_write_file(path, sp, data, 5, &err), DI_OK);
    assert_int_equal(di_engram_consts_load(c, dir, &ec, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "pad_compressed_id"));
    pad = 1;
    sp[2].dtype = DI_I32; /* wrong dtype: 12 I32 values but declared [2,6] I32 with half the bytes */
    int32_t offs32[12] = {0};
    data[2] = offs32;
    assert_int_equal(di_st_write_file(path, sp, data, 5, &err), DI_OK);
    assert_int_equal(di_engram_consts_load(c, dir, &ec, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "tensor 'offsets' expected I64 [2,6], found I32 [2,6]"));
    sp[2].dtype = DI_I64;
    data[2] = offs;
    assert_int_equal(di_st_write_file(path, sp, data, 5, &err), DI_OK);
    if (di_engram_consts_load(c, dir, &ec, &err)) fail_msg("%s", err.msg);
    assert_int_equal(ec.multipliers[7], 17);
    di_engram_consts_free(&ec);
    tu_rmtree(dir);
    free(dir);
    free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_released_fields),  cmocka_unit_test(test_released_roles),
        cmocka_unit_test(test_hf_only_equals_both), cmocka_unit_test(test_inference_fills_gaps),
        cmocka_unit_test(test_golden_roles),     cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_cache_footprint),  cmocka_unit_test(test_engram_released),
        cmocka_unit_test(test_engram_sidecar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
