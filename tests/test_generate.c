/* `deepinfer generate` end to end on the golden tiny cases: the --json document (prompt_ids,
 * output_ids; greedy output = the reference's decode_ids), --dump-logits in the golden layout and
 * within 3× the noise floors (teacher-forced with --force-output-ids, DSpark on), chunked prefill,
 * sampling determinism per seed, --prompt TEXT through the tokenizer, and the failure documents
 * (--device cuda, --prompt without a tokenizer, out-of-vocabulary ids). Runs the built CLI (build/deepinfer, or $DI_CLI). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "io/safetensors.h"
#include "model/golden.h"
#include "testutil.h"

static const char *cli_path(void) {
    const char *p = getenv("DI_CLI");
    return p ? p : "build/deepinfer";
}

static json_t *run_generate(const char *args, int *status) {
    size_t n = strlen(args) + 256;
    char *cmd = malloc(n);
    assert_non_null(cmd);
    snprintf(cmd, n, "%s generate %s --json 2>/dev/null", cli_path(), args);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    json_error_t je;
    json_t *doc = json_loadf(f, 0, &je);
    int st = pclose(f);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (!doc) fail_msg("`%s` printed no JSON document (%s)", cmd, je.text);
    free(cmd);
    return doc;
}

/* "a,b,c" of n ids (malloc'd). */
static char *id_list(const int32_t *v, int64_t n) {
    char *s = malloc((size_t)n * 12 + 1);
    assert_non_null(s);
    size_t o = 0;
    for (int64_t i = 0; i < n; i++) o += (size_t)sprintf(s + o, "%s%d", i ? "," : "", v[i]);
    s[o] = 0;
    return s;
}

static double floor_of(const char *dir, const char *k) {
    char p[1100];
    snprintf(p, sizeof p, "%s/case.json", dir);
    json_t *root = json_load_file(p, 0, NULL);
    assert_non_null(root);
    json_t *v = json_object_get(json_object_get(root, "noise_floor"), k);
    assert_true(json_is_number(v));
    double f = json_number_value(v);
    json_decref(root);
    return f;
}

static const float *f32(const di_safetensors *st, const char *name, int64_t d0, int64_t d1, int64_t d2) {
    const di_tensor_info *t = di_st_find(st, name);
    if (!t) fail_msg("%s missing in %s", name, st->path);
    assert_int_equal(t->dtype, DI_F32);
    int64_t want[3] = {d0, d1, d2};
    for (int i = 0; i < t->ndim; i++) assert_int_equal(t->shape[i], want[i]);
    return t->data;
}

/* Teacher-forced generate with DSpark on tiny-nosel: dump layout and values against the golden file;
 * greedy generate reproduces the reference's decode ids (no decode argmax flips on this case). */
static void test_dump_vs_golden(void **s) {
    const char *dir = tu_data("v41-tiny-nosel");
    char gp[1100];
    snprintf(gp, sizeof gp, "%s/golden.safetensors", dir);
    di_safetensors *g;
    di_error err = {0};
    assert_int_equal(di_st_open(gp, &g, &err), DI_OK);
    const di_tensor_info *pi = di_st_find(g, "prompt_ids"), *dec = di_st_find(g, "decode_ids");
    int64_t T = pi->shape[0], N = dec->shape[0], V = 512;
    const di_tensor_info *dids = di_st_find(g, "dspark_draft_ids");
    int64_t B = dids->shape[1] - 1;
    char *prompt = id_list(pi->data, T), *force = id_list(dec->data, N);
    char *tmp = tu_tmpdir("generate"), dump[1100];
    snprintf(dump, sizeof dump, "%s/logits.safetensors", tmp);
    size_t an = strlen(prompt) + strlen(force) + 2400;
    char *args = malloc(an);
    assert_non_null(args);
    snprintf(args, an, "--model %s --prompt-ids %s --force-output-ids %s --max-tokens %lld --dspark --chunk 33 "
                       "--dump-logits %s", dir, prompt, force, (long long)(N + 1), dump);
    int st;
    json_t *doc = run_generate(args, &st);
    assert_int_equal(st, 0);
    assert_true(json_is_true(json_object_get(doc, "ok")));
    json_t *po = json_object_get(doc, "prompt_ids"), *oo = json_object_get(doc, "output_ids");
    assert_int_equal(json_array_size(po), T);
    assert_int_equal(json_array_size(oo), N + 1);
    for (int64_t i = 0; i < N; i++) assert_int_equal(json_integer_value(json_array_get(oo, i)), ((const int32_t *)dec->data)[i]);
    double acc_json = json_real_value(json_object_get(doc, "dspark_mean_accepted"));

    di_safetensors *o;
    assert_int_equal(di_st_open(dump, &o, &err), DI_OK);
    {
        /* the reported acceptance: per step, the leading drafts that equal the tokens that followed */
        const int32_t *od = di_st_find(o, "dspark_draft_ids")->data;
        int64_t acc = 0, steps = 0;
        for (int64_t i = 0; i + 2 < N + 1; i++, steps++)
            for (int64_t j = 1; j <= B && i + 1 + j < N + 1 &&
                                od[i * (B + 1) + j] == json_integer_value(json_array_get(oo, (size_t)(i + 1 + j)));
                 j++)
                acc++;
        tu_report("dspark_mean_accepted %.4f (recomputed from the dump %.4f)", acc_json, (double)acc / (double)steps);
        assert_true(fabs(acc_json - (double)acc / (double)steps) < 1e-12);
    }
    json_decref(doc);
    double rp = di_rel_err_f32(f32(o, "prompt_logits", T, V, 0), f32(g, "prompt_logits", T, V, 0), T * V);
    double rd = di_rel_err_f32(f32(o, "decode_logits", N, V, 0), f32(g, "decode_logits", N, V, 0), N * V);
    double rc = di_rel_err_f32(f32(o, "dspark_confidence", N, B, 0), f32(g, "dspark_confidence", N, B, 0), N * B);
    double rl = di_rel_err_f32(f32(o, "dspark_draft_logits", N, B, V), f32(g, "dspark_draft_logits", N, B, V), N * B * V);
    const di_tensor_info *oid = di_st_find(o, "dspark_draft_ids");
    assert_non_null(oid);
    assert_int_equal(oid->dtype, DI_I32);
    assert_int_equal(oid->shape[0], N);
    assert_int_equal(oid->shape[1], B + 1);
    int64_t same = 0;
    for (int64_t i = 0; i < N * (B + 1); i++) same += ((const int32_t *)oid->data)[i] == ((const int32_t *)dids->data)[i];
    tu_report("generate --dump-logits (tiny-nosel, chunks of 33, teacher-forced, DSpark): prompt %.3e decode %.3e "
              "confidence %.3e draft logits %.3e; draft ids %lld/%lld equal",
              rp, rd, rc, rl, (long long)same, (long long)(N * (B + 1)));
    assert_true(rp <= 3 * floor_of(dir, "prompt_logits"));
    assert_true(rd <= 3 * floor_of(dir, "decode_logits"));
    assert_true(rc <= 3 * floor_of(dir, "dspark_confidence"));
    assert_true(rl <= 3 * floor_of(dir, "dspark_draft_logits"));
    assert_true(same >= N * (B + 1) * 9 / 10);
    di_st_close(o);

    /* greedy, not forced: the reference's decode ids (this case has no argmax flip on the way) */
    snprintf(args, an, "--model %s --prompt-ids %s --max-tokens 8 --temperature 0", dir, prompt);
    doc = run_generate(args, &st);
    assert_int_equal(st, 0);
    oo = json_object_get(doc, "output_ids");
    assert_int_equal(json_array_size(oo), 8);
    for (int64_t i = 0; i < 8; i++) assert_int_equal(json_integer_value(json_array_get(oo, i)), ((const int32_t *)dec->data)[i]);
    json_decref(doc);
    free(args), free(prompt), free(force);
    di_st_close(g);
    tu_rmtree(tmp);
    free(tmp);
}

/* Sampling: the same seed gives the same ids, ids stay in the vocabulary, another seed differs. */
static void test_sampling_seeded(void **s) {
    const char *dir = tu_data("v41-tiny-nosel");
    char args[1400];
    int st;
    json_t *d[3];
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "--model %s --prompt-ids 5,6,7,8 --max-tokens 24 --temperature 1.5 --seed %d", dir,
                 i < 2 ? 11 : 12);
        d[i] = run_generate(args, &st);
        assert_int_equal(st, 0);
    }
    assert_true(json_equal(json_object_get(d[0], "output_ids"), json_object_get(d[1], "output_ids")));
    assert_false(json_equal(json_object_get(d[0], "output_ids"), json_object_get(d[2], "output_ids")));
    json_t *oo = json_object_get(d[0], "output_ids");
    for (size_t i = 0; i < json_array_size(oo); i++) {
        json_int_t v = json_integer_value(json_array_get(oo, i));
        assert_true(v >= 0 && v < 512);
    }
    for (int i = 0; i < 3; i++) json_decref(d[i]);
}

/* --prompt TEXT goes through the tokenizer: the same run as --prompt-ids with its encoding. */
static void test_prompt_text(void **s) {
    const char *dir = tu_data("v41-tiny-nosel"), *tk = tu_data("tokenizer/tiny_tokenizer.json");
    char args[2400];
    int st;
    snprintf(args, sizeof args, "--model %s --tokenizer %s --prompt 'hello world' --max-tokens 6", dir, tk);
    json_t *a = run_generate(args, &st);
    assert_int_equal(st, 0);
    json_t *pa = json_object_get(a, "prompt_ids");
    assert_true(json_array_size(pa) >= 2);
    char ids[512];
    size_t o = 0;
    for (size_t i = 0; i < json_array_size(pa); i++)
        o += (size_t)snprintf(ids + o, sizeof ids - o, "%s%lld", i ? "," : "", (long long)json_integer_value(json_array_get(pa, i)));
    snprintf(args, sizeof args, "--model %s --prompt-ids %s --max-tokens 6", dir, ids);
    json_t *b = run_generate(args, &st);
    assert_int_equal(st, 0);
    assert_true(json_equal(json_object_get(a, "output_ids"), json_object_get(b, "output_ids")));
    tu_report("generate --prompt 'hello world' (tiny test tokenizer) = --prompt-ids %s", ids);
    json_decref(a);
    json_decref(b);
}

static void expect_failure(const char *args, const char *needle) {
    int st;
    json_t *doc = run_generate(args, &st);
    assert_int_equal(st, 1);
    assert_true(json_is_false(json_object_get(doc, "ok")));
    const char *msg = json_string_value(json_object_get(doc, "error"));
    assert_non_null(msg);
    tu_report("generate %s → %s", args, msg);
    if (!strstr(msg, needle)) fail_msg("error \"%s\" does not mention \"%s\"", msg, needle);
    json_decref(doc);
}

static void test_failures(void **s) {
    char a[1400];
    const char *dir = tu_data("v41-tiny-nosel");
    snprintf(a, sizeof a, "--model %s --prompt-ids 1,2 --device cuda", dir);
    expect_failure(a, "built without CUDA");
    snprintf(a, sizeof a, "--model %s --prompt hello", dir);
    expect_failure(a, "tokenizer");
    snprintf(a, sizeof a, "--model %s --prompt-ids 1,512", dir);
    expect_failure(a, "outside the vocabulary");
    snprintf(a, sizeof a, "--model %s --prompt-ids 1,x", dir);
    expect_failure(a, "--prompt-ids");
    snprintf(a, sizeof a, "--model %s --prompt-ids 1 --temperature -1", dir);
    expect_failure(a, "--temperature");
    expect_failure("--model tests/data/none --prompt-ids 1", "none");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dump_vs_golden),
        cmocka_unit_test(test_sampling_seeded),
        cmocka_unit_test(test_prompt_text),
        cmocka_unit_test(test_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
