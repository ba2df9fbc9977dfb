/* Cache budget: a fixed pool of cache blocks of `block_tokens` positions each — the allocator of the
 * paged cache.
 *
 * The scheduler owns it and decides which ids a request holds (admission, growth, preemption); the
 * memory behind an id belongs to the model runner. The cached session runner's caches are paged
 * (model/cache_pool.h): block id b IS page b of its pool — the compressed KV entries and index keys
 * of positions [i·block_tokens, (i+1)·block_tokens) of every kv source of the request whose table
 * lists b at index i — and the runner receives each request's table with every piece
 * (runner.h di_step_seq.blocks), so the counts here are the real memory. Allocation is
 * all-or-nothing so a failed reservation never leaves a request half-grown. Free ids are handed out
 * LIFO, which keeps recently freed (cache-warm) pages in use; the model's results never depend on
 * which ids a request got (tests/test_cache_pool.c, test_cache_pool_engine.c). */
#ifndef DI_ENGINE_BLOCK_POOL_H
#define DI_ENGINE_BLOCK_POOL_H

#include <stdint.h>

#include "util/error.h"

typedef struct di_block_pool {
    int32_t n_blocks;     /* capacity */
    int32_t block_tokens; /* positions per block */
    int32_t n_free;
    int32_t *free_ids;    /* [n_blocks] int32: free ids in [0, n_free), top of the stack last */
} di_block_pool;

int di_block_pool_init(di_block_pool *p, int32_t n_blocks, int32_t block_tokens, di_error *err);
void di_block_pool_destroy(di_block_pool *p);
/* Takes n ids into ids[0..n) or nothing; returns 0, or -1 when fewer than n are free. */
int di_block_pool_alloc(di_block_pool *p, int32_t n, int32_t *ids);
void di_block_pool_release(di_block_pool *p, const int32_t *ids, int32_t n);

#endif
