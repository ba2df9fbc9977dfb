/* Engine benchmark core on the mock runner: counts, percentile order, and batching pays off when
 * each step costs a fixed device time.  di-test: asan */
#include <string.h>

#include "engine/engine_bench.h"
#include "engine/mock_runner.h"
#include "testutil.h"

static void run(int32_t n, int async, di_engine_bench_result *r) {
    di_mock_options mo = {.n_vocab = 256, .max_context = 512, .block_tokens = 16, .n_blocks = 256, .salt = 3,
                          .sharpness = 12.0f, .step_sleep_s = 0.001};
    di_mock_runner *mock;
    di_model_runner runner;
    di_error err = {0};
    assert_int_equal(di_mock_runner_new(&mo, &mock, &runner, &err), DI_OK);
    di_engine_bench_opts o = {.n_requests = n, .prompt_tokens = 40, .output_tokens = 32, .temperature = 0.8f, .seed = 5};
    o.core = (di_core_options){.sched = {.max_seqs = 32, .max_step_tokens = 512, .prefill_chunk = 64}, .async = async};
    if (di_engine_bench_run(&runner, &o, r, &err)) fail_msg("%s", err.msg);
    di_mock_runner_free(mock);
}

static void test_bench_counts_and_scaling(void **state) {
    (void)state;
    for (int async = 0; async < 2; async++) {
        di_engine_bench_result one, many;
        run(1, async, &one);
        run(16, async, &many);
        assert_int_equal(one.generated, 32);
        assert_int_equal(many.generated, 16 * 32);
        for (int i = 0; i < 2; i++) {
            assert_true(many.ttft_s[i] <= many.ttft_s[i + 1]);
            assert_true(many.itl_s[i] <= many.itl_s[i + 1]);
            assert_true(many.e2e_s[i] <= many.e2e_s[i + 1]);
        }
        assert_true(many.ttft_s[0] > 0.0 && many.e2e_s[2] <= many.wall_s);
        assert_true(many.itl_s[1] > 0.0005); /* at least half the 1 ms step */
        /* 16 requests share each 1 ms step: far more than 4x the single-request rate */
        double ratio = many.output_tok_per_s / one.output_tok_per_s;
        tu_report("bench (%s, mock 1 ms/step): 1 request %.0f tok/s, 16 requests %.0f tok/s (%.1fx), TTFT p50 %.1f ms, "
                  "ITL p50/p99 %.2f/%.2f ms, %lld steps",
                  async ? "async" : "sync", one.output_tok_per_s, many.output_tok_per_s, ratio, 1e3 * many.ttft_s[0],
                  1e3 * many.itl_s[0], 1e3 * many.itl_s[2], (long long)many.steps);
        assert_true(ratio > 4.0);
    }
}

static void test_bench_bad_options(void **state) {
    (void)state;
    di_mock_options mo = {.n_vocab = 16, .max_context = 64, .block_tokens = 16, .n_blocks = 8};
    di_mock_runner *mock;
    di_model_runner runner;
    di_error err = {0};
    assert_int_equal(di_mock_runner_new(&mo, &mock, &runner, &err), DI_OK);
    di_engine_bench_opts o = {.n_requests = 0, .prompt_tokens = 4, .output_tokens = 4};
    o.core = (di_core_options){.sched = {.max_seqs = 4, .max_step_tokens = 64, .prefill_chunk = 16}};
    di_engine_bench_result r;
    assert_int_equal(di_engine_bench_run(&runner, &o, &r, &err), DI_ERR_INVALID);
    o.n_requests = 2;
    o.prompt_tokens = 100; /* beyond the 64-token context */
    assert_int_equal(di_engine_bench_run(&runner, &o, &r, &err), DI_ERR_LIMIT);
    assert_non_null(strstr(err.msg, "context"));
    di_mock_runner_free(mock);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bench_counts_and_scaling),
        cmocka_unit_test(test_bench_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
