/* Cache block pool (see block_pool.h). */
#include "engine/block_pool.h"

#include <stdlib.h>

int di_block_pool_init(di_block_pool *p, int32_t n_blocks, int32_t block_tokens, di_error *err) {
    p->free_ids = NULL;
    p->n_blocks = p->n_free = 0;
    if (n_blocks <= 0 || block_tokens <= 0)
        return di_error_set(err, DI_ERR_INVALID, "block pool: %d blocks of %d tokens, expected both > 0", n_blocks,
                            block_tokens);
    p->free_ids = malloc((size_t)n_blocks * sizeof *p->free_ids);
    if (!p->free_ids) return di_error_set(err, DI_ERR_NOMEM, "block pool: out of memory for %d ids", n_blocks);
    p->n_blocks = p->n_free = n_blocks;
    p->block_tokens = block_tokens;
    /* block 0 on top, so a fresh pool hands out 0, 1, 2, … */
    for (int32_t i = 0; i < n_blocks; i++) p->free_ids[i] = n_blocks - 1 - i;
    return DI_OK;
}

void di_block_pool_destroy(di_block_pool *p) {
    free(p->free_ids);
    p->free_ids = NULL;
    p->n_blocks = p->n_free = 0;
}

int di_block_pool_alloc(di_block_pool *p, int32_t n, int32_t *ids) {
    if (n < 0 || n > p->n_free) return -1;
    for (int32_t i = 0; i < n; i++) ids[i] = p->free_ids[--p->n_free];
    return 0;
}

void di_block_pool_release(di_block_pool *p, const int32_t *ids, int32_t n) {
    /* reverse order: releasing and re-allocating the same request gives it the same ids back */
    for (int32_t i = n - 1; i >= 0; i--) p->free_ids[p->n_free++] = ids[i];
}
