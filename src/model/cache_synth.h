/* BENCH-ONLY: a cache holding a synthetic history, so `deepinfer bench gpu` can time a decode step at
 * a long context (4K, 64K tokens) without prefilling it first.
 *
 * The history is random but well-formed: every row goes through the cache's normal put paths (the
 * same quantizers / backend row_encode a forward uses), so the compact bytes are valid codes and
 * scales, the marks say every position is held, and a decode step reads it exactly like real history
 * — the same rows, entries and index keys, hence the same bytes and the same work. The VALUES are
 * random, so logits after it mean nothing: never use this outside benchmarks and tests. */
#ifndef DI_MODEL_CACHE_SYNTH_H
#define DI_MODEL_CACHE_SYNTH_H

#include <stdint.h>

#include "model/cache.h"

/* Make c (empty: length 0) a sequence of len positions: the window rows of the last
 * min(len, W + m) positions of every stage, all ⌊len/R⌋ compressed entries and index keys of every
 * kv source, and the Engram history, from a xorshift stream seeded by seed (bf16 values of magnitude in
 * [1/8, 2), Engram ids uniform in [0, cfg's compressed vocabulary)). len must be a multiple of
 * di_cache_prefix_align(c): no compressor group is then pending (the state is the reset state, as at
 * a prefix boundary) and len ≤ max_tokens. cfg is the config c was built from. */
int di_cache_fill_synthetic(di_cache *c, const di_config *cfg, int64_t len, uint64_t seed, di_error *err);

#endif
