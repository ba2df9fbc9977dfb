/* Cache budget: a fixed pool of cache blocks of `block_tokens` positions each.
 *
 * This is the accounting half of the paged cache: which block ids are free and who holds which. The
 * memory behind an id (window KV, compressed KV, indexer keys — one page per cache kind) belongs to
 * the model runner, which maps (block id, offset) to its own layouts; the scheduler only ever sees
 * ids and counts. Allocation is all-or-nothing so a failed reservation never leaves a request
 * half-grown. Free ids are handed out LIFO, which keeps recently freed (cache-warm) pages in use; the
 * model's results never depend on which ids a request got. */
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
