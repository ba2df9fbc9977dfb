/* Cache block pool (src/engine/block_pool.h), the allocator of the paged cache: all-or-nothing
 * allocation, LIFO reuse (a released request gets its ids back in order), ids distinct and in range
 * under random alloc / release, bad sizes refused.  di-test: asan */
#include <stdlib.h>
#include <string.h>

#include "engine/block_pool.h"
#include "testutil.h"

static void test_alloc_release(void **state) {
    (void)state;
    di_block_pool p;
    di_error err = {0};
    assert_int_equal(di_block_pool_init(&p, 0, 16, &err), DI_ERR_INVALID);
    assert_int_equal(di_block_pool_init(&p, 8, 16, &err), DI_OK);
    int32_t a[8], b[8];
    assert_int_equal(di_block_pool_alloc(&p, 3, a), 0);
    assert_int_equal(a[0], 0), assert_int_equal(a[1], 1), assert_int_equal(a[2], 2);
    assert_int_equal(di_block_pool_alloc(&p, 6, b), -1); /* all or nothing: 5 free */
    assert_int_equal(p.n_free, 5);
    di_block_pool_release(&p, a, 3);
    assert_int_equal(di_block_pool_alloc(&p, 3, b), 0);
    assert_memory_equal(a, b, sizeof(int32_t) * 3); /* the same ids back, in order */
    di_block_pool_destroy(&p);
}

static void test_random(void **state) {
    (void)state;
    enum { N = 64, HOLDERS = 6 };
    di_block_pool p;
    di_error err = {0};
    assert_int_equal(di_block_pool_init(&p, N, 4, &err), DI_OK);
    int32_t held[HOLDERS][N], n_held[HOLDERS] = {0};
    uint64_t s = 99;
    int64_t ops = 0, refused = 0;
    for (int it = 0; it < 20000; it++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        int h = (int)(s % HOLDERS);
        if ((s >> 8) % 3) {
            int32_t k = (int32_t)((s >> 16) % 9);
            if (n_held[h] + k > N) continue;
            int rc = di_block_pool_alloc(&p, k, held[h] + n_held[h]);
            if (rc) {
                assert_true(k > p.n_free);
                refused++;
                continue;
            }
            n_held[h] += k;
        } else {
            di_block_pool_release(&p, held[h], n_held[h]);
            n_held[h] = 0;
        }
        ops++;
        /* every id is held once or free once */
        int seen[N] = {0}, total = 0;
        for (int i = 0; i < HOLDERS; i++)
            for (int32_t j = 0; j < n_held[i]; j++) assert_true(held[i][j] >= 0 && held[i][j] < N), seen[held[i][j]]++;
        for (int32_t j = 0; j < p.n_free; j++) seen[p.free_ids[j]]++;
        for (int i = 0; i < N; i++) assert_int_equal(seen[i], 1), total += seen[i];
        assert_int_equal(total, N);
    }
    tu_report("block pool: %lld operations, %lld all-or-nothing refusals, ids always a partition", (long long)ops,
              (long long)refused);
    assert_true(refused > 0);
    di_block_pool_destroy(&p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_release),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
