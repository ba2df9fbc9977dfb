/* A ≥ 10,000-token prompt of the tiny preset (deepinfer mkmodel --preset tiny): chunked prefill (chunk
 * sizes from 1 to 3,000, the window ring and the ratio-2 compressor state carried across every kind
 * of boundary) against token-by-token decode of the same prompt; the logits at every chunk end must
 * agree within the golden decode noise floor of the tiny cases. (They are in fact bit-identical: the
 * kernels are batch-invariant and the window / compressed index lists have the same order; the
 * bound is the contract, the identity is reported.) To keep the CI budget, only the
 * first two blocks run (an SWA block with Engram and a ratio-2 kv + index source with Engram: window
 * wrap-around, compressor carry, 5,000+ index keys, Engram history), then the final norm and head;
 * the golden tests (test_decode.c) cover the other roles over chunks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/golden.h"
#include "model/mkmodel.h"
#include "model/session.h"
#include "testutil.h"

#define N_TOK 10000
#define N_BLOCKS 2
/* v41-tiny-nosel's decode noise floor (case.json); the bound is 3× that, as for the golden checks */
#define DECODE_FLOOR 0.03244083352777978

static void test_long_prompt_chunked_vs_decode(void **st) {
    char *dir = tu_tmpdir("decode_long");
    di_error err = {0};
    di_mkmodel_opts mo = {.preset = "tiny", .seed = 7, .out_dir = dir};
    di_mkmodel_stats ms;
    assert_int_equal(di_mkmodel_write(&mo, &ms, &err), DI_OK);
    di_model *m;
    di_backend *be;
    assert_int_equal(di_model_open(dir, &m, &err), DI_OK);
    assert_int_equal(di_backend_cpu_create(1, &be, &err), DI_OK);
    /* the first N_BLOCKS blocks only (they read nothing from later layers); no DSpark */
    assert_true(m->cfg.n_layers > N_BLOCKS && m->cfg.layer[1].is_kv_source && m->cfg.layer[1].compress_ratio == 2);
    m->cfg.n_layers = N_BLOCKS, m->cfg.n_dspark = 0, m->cfg.n_stages = N_BLOCKS;

    int64_t V = m->cfg.vocab_size;
    int32_t *ids = malloc(sizeof(int32_t) * N_TOK);
    assert_non_null(ids);
    uint64_t r = 12345;
    for (int i = 0; i < N_TOK; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((r >> 33) % (uint64_t)V);
    }
    static const int64_t sizes[] = {1, 127, 3000, 2, 129, 1000, 256, 3, 2500};
    enum { MAXC = 64 };
    int64_t ends[MAXC], n_ends = 0;
    float *la = malloc(sizeof(float) * (size_t)(MAXC * V)), *lb = malloc(sizeof(float) * (size_t)V);
    assert_true(la && lb);
    di_session_opts so = {.max_tokens = N_TOK, .spec_margin = -1, .dspark = false};
    di_session *a, *b;
    assert_int_equal(di_session_create(m, be, &so, &a, &err), DI_OK);
    assert_int_equal(di_session_create(m, be, &so, &b, &err), DI_OK);
    for (int64_t p = 0, k = 0; p < N_TOK; k++) {
        int64_t n = sizes[k % (sizeof sizes / sizeof sizes[0])];
        if (n > N_TOK - p) n = N_TOK - p;
        assert_true(n_ends < MAXC);
        assert_int_equal(di_session_forward(a, ids + p, n, false, la + n_ends * V, NULL, &err), DI_OK);
        p += n;
        ends[n_ends++] = p - 1;
    }
    double worst = 0;
    int64_t e = 0, argmax_agree = 0, identical = 0;
    for (int64_t p = 0; p < N_TOK; p++) {
        bool at_end = e < n_ends && ends[e] == p;
        assert_int_equal(di_session_forward(b, ids + p, 1, false, at_end ? lb : NULL, NULL, &err), DI_OK);
        if (!at_end) continue;
        const float *ref = la + e * V;
        double rel = di_rel_err_f32(lb, ref, V);
        int64_t ia = 0, ib = 0;
        for (int64_t v = 1; v < V; v++) ia = ref[v] > ref[ia] ? v : ia, ib = lb[v] > lb[ib] ? v : ib;
        argmax_agree += ia == ib;
        identical += !memcmp(lb, ref, sizeof(float) * (size_t)V);
        if (rel > worst) worst = rel;
        e++;
    }
    tu_report("tiny preset, %d-token prompt, first %d blocks: chunked vs token-by-token logits at %lld chunk ends: "
              "max rel %.3e (bound 3x decode floor %.3e), argmax agrees at %lld, bit-identical at %lld",
              N_TOK, N_BLOCKS, (long long)n_ends, worst, 3 * DECODE_FLOOR, (long long)argmax_agree, (long long)identical);
    assert_int_equal(e, n_ends);
    assert_true(worst <= 3 * DECODE_FLOOR);
    di_session_destroy(a);
    di_session_destroy(b);
    free(ids), free(la), free(lb);
    di_backend_destroy(be);
    di_model_close(m);
    tu_rmtree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_long_prompt_chunked_vs_decode)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
