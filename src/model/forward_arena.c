/* The forward's persistent scratch arena (forward.h di_fwd_arena) and the shape key of a pass.
 *
 * Backend block: the pass's allocations that live for one block (fwd_alloc persist = 0) are stacked
 * from the bottom and rewound by fwd_free_tmp; those that live for the pass (persist = 1) are stacked
 * from the top and released with the pass. The two never meet inside the capacity; an allocation that
 * does not fit is served per block as without the arena (a "spill") and the pass's demand — the peak
 * of bottom + top as if everything had fit — is remembered, so the next pass starts in a block grown
 * to it. The same sequence of requests therefore gets the same addresses, pass after pass.
 *
 * Host blocks: one for fwd_halloc (plain memory, never rewound within a pass), one staging block for
 * the sources of fwd_upload, pinned where the backend can (be->host_pin). An upload is an asynchronous
 * copy from a staging slot, so the slot must stay untouched until the copy ran: each upload copies its
 * source into a fresh slot (callers may reuse their host buffer right after fwd_upload, as with
 * pageable copies) and the block is only rewound by the next pass.
 * Before a pass reuses the block, the previous pass's copies must have run: the pass begins with one
 * stream synchronisation when the previous pass staged anything and did not end with a download of its
 * own (the engine's sampler download usually has already drained the stream; then it costs nothing).
 *
 * Shape key: FNV-1a over the batch (sequences, each chunk's T) and every allocation and upload of the
 * pass in order (size, lifetime, memory). Two passes with the same key made the same requests, so they
 * got the same addresses; a launch parameter that changes without changing a request size (an
 * attention over a growing key list whose buffers are sized by the window) is not in the key. The
 * graph path (forward.c fwd_backbone) does not depend on it: it re-records every pass and lets the
 * backend update the instantiated graph; the key is reported (stats) to show how often a per-key
 * graph cache would have had to instantiate. */
#include <stdlib.h>
#include <string.h>

#include "model/forward_internal.h"
#include "util/error.h"

#define ARENA_ALIGN 256          /* what cudaMallocAsync gives: vector loads of any width */
#define ARENA_ROUND (1u << 20)   /* growth granularity of both blocks */

struct di_fwd_arena {
    const di_backend *be;
    uint8_t *dev;                /* uint8 [dev_cap] (backend) */
    size_t dev_cap;
    uint8_t *host;               /* uint8 [host_cap] (host): fwd_halloc */
    size_t host_cap;
    uint8_t *stage;              /* uint8 [stage_cap] (host; pinned where the backend has host_pin) */
    bool stage_pinned;
    size_t stage_cap;
    size_t dev_need, host_need, stage_need; /* the largest demand of one pass so far */
    bool busy;                   /* a pass runs in it */
    bool fence;                  /* the last pass staged uploads that may still be in flight */
    bool graphs;                 /* capture eligible passes (forward.c) */
    bool last_fit;               /* the last pass had no spill */
    void *exec;                  /* the backend's instantiated graph (be->graph_end) */
    di_fwd_arena_stats st;
};

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

static void key_mix(fwd_ctx *c, uint64_t v) {
    for (int i = 0; i < 8; i++) c->key = (c->key ^ ((v >> (8 * i)) & 0xff)) * 0x100000001b3ull;
}

int di_fwd_arena_create(const di_backend *be, bool graphs, di_fwd_arena **out, di_error *err) {
    *out = NULL;
    if (!be) return di_error_set(err, DI_ERR_INVALID, "forward arena: no backend");
    di_fwd_arena *a = calloc(1, sizeof *a);
    if (!a) return di_error_set(err, DI_ERR_NOMEM, "forward arena");
    a->be = be;
    const char *env = getenv("DI_CUDA_GRAPHS");
    a->graphs = graphs || (env && env[0] && strcmp(env, "0") != 0);
    *out = a;
    return DI_OK;
}

static void stage_release(di_fwd_arena *a) {
    if (a->stage_pinned) a->be->host_unpin(a->be, a->stage);
    free(a->stage);
    a->stage = NULL, a->stage_pinned = false, a->stage_cap = 0;
}

void di_fwd_arena_destroy(di_fwd_arena *a) {
    if (!a) return;
    if (a->fence) { /* the staging block may still be read by copies in flight */
        uint8_t b;
        di_error ignored;
        if (a->dev) a->be->mem_download(a->be, &b, a->dev, 1, &ignored);
    }
    if (a->exec && a->be->graph_free) a->be->graph_free(a->be, a->exec);
    if (a->dev) a->be->mem_free(a->be, a->dev);
    stage_release(a);
    free(a->host);
    free(a);
}

void di_fwd_arena_get_stats(const di_fwd_arena *a, di_fwd_arena_stats *st) {
    *st = a->st;
    st->dev_bytes = a->dev_cap, st->host_bytes = a->host_cap + a->stage_cap;
}

bool di_fwd_arena_is_staging(const di_fwd_arena *a, const void *p) {
    const uint8_t *b = p;
    return a->stage && b >= a->stage && b < a->stage + a->stage_cap;
}

bool fwd_arena_graphs(const fwd_ctx *c) { return c->ar && c->ar->graphs && c->be->graph_begin && c->ar->last_fit; }
bool fwd_arena_graphs_on(const fwd_ctx *c) { return c->ar && c->ar->graphs && c->be->graph_begin; }
void **fwd_arena_exec(fwd_ctx *c) { return &c->ar->exec; }
void fwd_arena_count(fwd_ctx *c, int captures, int replays, int fallbacks) {
    c->ar->st.captures += (uint64_t)captures, c->ar->st.replays += (uint64_t)replays;
    c->ar->st.graph_fallbacks += (uint64_t)fallbacks;
    /* a recording fails where an op synchronises: a workspace that grows with the context (once per
     * size; the eager rerun grows it) — or an op that always does, then every pass would record in
     * vain: give up after a few */
    if (fallbacks && c->ar->st.graph_fallbacks >= 8) c->ar->graphs = false;
}

int fwd_arena_begin(fwd_ctx *c) {
    c->key = 0xcbf29ce484222325ull;
    di_fwd_arena *a = c->opts->arena;
    if (!a || a->busy || a->be != c->be) return DI_OK; /* nested pass or another backend: per block */
    const di_backend *be = c->be;
    if (a->fence && a->dev) {
        uint8_t b; /* the previous pass's staged copies must have run before the block is rewritten */
        int rc = be->mem_download(be, &b, a->dev, 1, c->err);
        if (rc) return rc;
        a->fence = false;
    }
    if (a->dev_need > a->dev_cap) {
        size_t cap = round_up(a->dev_need, ARENA_ROUND);
        if (a->dev) be->mem_free(be, a->dev); /* stream-ordered: ops still reading it run first */
        a->dev = NULL, a->dev_cap = 0;
        if (!(a->dev = be->mem_alloc(be, cap, c->err))) return c->err->code;
        a->dev_cap = cap, a->st.grows++;
    }
    if (a->host_need > a->host_cap) {
        size_t cap = round_up(a->host_need, ARENA_ROUND);
        free(a->host);
        a->host_cap = 0;
        if (!(a->host = malloc(cap))) return di_error_set(c->err, DI_ERR_NOMEM, "forward arena: %zu host bytes", cap);
        a->host_cap = cap, a->st.grows++;
    }
    if (a->stage_need > a->stage_cap) {
        size_t cap = round_up(a->stage_need, ARENA_ROUND);
        stage_release(a);
        if (!(a->stage = aligned_alloc(4096, cap)))
            return di_error_set(c->err, DI_ERR_NOMEM, "forward arena: %zu bytes of upload staging", cap);
        if (be->host_pin) {
            int rc = be->host_pin(be, a->stage, cap, c->err);
            if (rc) {
                stage_release(a);
                return rc;
            }
            a->stage_pinned = true;
        }
        a->stage_cap = cap, a->st.grows++;
    }
    a->busy = true;
    c->ar = a;
    c->ar_lo = 0, c->ar_hi = a->dev_cap, c->ar_host = 0, c->ar_stage = 0;
    c->ar_lo_want = c->ar_keep_want = c->ar_want = 0, c->ar_spill = false;
    return DI_OK;
}

void fwd_arena_key(fwd_ctx *c, uint64_t v) { key_mix(c, v); }

void fwd_arena_synced(fwd_ctx *c) {
    if (c->ar) c->ar->fence = false;
}

int fwd_arena_alloc(fwd_ctx *c, size_t bytes, int persist, bool host, void **out) {
    *out = NULL;
    key_mix(c, ((uint64_t)bytes << 2) | ((uint64_t)(persist != 0) << 1) | (uint64_t)host);
    di_fwd_arena *a = c->ar;
    if (!a) return DI_OK;
    size_t n = round_up(bytes ? bytes : 1, ARENA_ALIGN);
    if (host) {
        if (c->ar_host + n <= a->host_cap) {
            *out = a->host + c->ar_host;
            memset(*out, 0, n);
        }
        c->ar_host += n; /* the demand, also when spilled */
        if (!*out) c->ar_spill = true;
        return DI_OK;
    }
    if (persist) {
        c->ar_keep_want += n;
        if (c->ar_hi >= c->ar_lo + n) c->ar_hi -= n, *out = a->dev + c->ar_hi;
    } else {
        c->ar_lo_want += n;
        if (c->ar_lo + n <= c->ar_hi) *out = a->dev + c->ar_lo, c->ar_lo += n;
    }
    if (c->ar_lo_want + c->ar_keep_want > c->ar_want) c->ar_want = c->ar_lo_want + c->ar_keep_want;
    if (!*out) {
        c->ar_spill = true;
        return DI_OK;
    }
    return c->be->mem_set(c->be, *out, 0, n, c->err); /* zero-filled, like mem_alloc */
}

/* A staging slot holding a copy of host[0, bytes), or host itself (no arena, or a spill: a pageable
 * upload, as without the arena). Only these slots are pinned: host buffers of the pass (fwd_halloc)
 * are uploaded by code outside this file too (cache puts) and may be rewritten right after. */
const void *fwd_arena_stage(fwd_ctx *c, const void *host, size_t bytes) {
    di_fwd_arena *a = c->ar;
    if (!a || !bytes) return host;
    size_t n = round_up(bytes, ARENA_ALIGN);
    key_mix(c, (uint64_t)bytes << 3 | 4);
    c->ar_stage += n;
    if (c->ar_stage > a->stage_cap) {
        c->ar_spill = true;
        return host;
    }
    uint8_t *slot = a->stage + c->ar_stage - n;
    memcpy(slot, host, bytes);
    if (a->stage_pinned) a->fence = true;
    return slot;
}

void fwd_arena_free_tmp(fwd_ctx *c) {
    if (!c->ar) return;
    c->ar_lo = 0, c->ar_lo_want = 0;
    key_mix(c, 0x7f); /* block boundary */
}

void fwd_arena_end(fwd_ctx *c) {
    di_fwd_arena *a = c->ar;
    if (!a) return;
    if (c->ar_want > a->dev_need) a->dev_need = c->ar_want;
    if (c->ar_host > a->host_need) a->host_need = c->ar_host;
    if (c->ar_stage > a->stage_need) a->stage_need = c->ar_stage;
    if (c->ar_spill) a->st.spills++;
    a->last_fit = !c->ar_spill;
    if (a->st.passes && a->st.shape_key != c->key) a->st.key_changes++;
    a->st.shape_key = c->key;
    a->st.passes++;
    a->busy = false;
    c->ar = NULL;
}
