/* Per-sequence attention caches of DeepSeek-V4.1-Flash in the compact exact form (spec model.md
 * §4.7, §5.5, §7.2), with O(k) exact rollback of the newest k ≤ spec_margin tokens for speculative
 * and constrained decoding.
 *
 * What a sequence keeps, per stage (backbone layer or DSpark draft stage), and in which form:
 *
 *   every stage            window ring: (W + m) slots of one latent row each (W = sliding_window,
 *                          m = spec_margin). A slot is [head_dim e4m3 codes | head_dim/32 E8M0
 *                          scales] = 528 B at real size: the reference's FP8 QDQ over all 512
 *                          channels in 32-groups (§4.4), stored as codes + scales.
 *   kv sources (2,8,14,20) compressed KV: one entry per R tokens, [head_dim/2 packed E2M1 |
 *                          head_dim/16 E4M3 scales] = 288 B (FP4 QDQ, 16-groups, §4.1);
 *                          index keys: one per R tokens, [index_head_dim/2 packed E2M1 |
 *                          index_head_dim/32 E8M0] = 68 B (FP4 QDQ, 32-groups, §4.4);
 *                          ratio R ≥ 2: compressor carry state, f32 projections (§3.5, §4.4).
 *   per sequence           Engram n-gram history: compressed token ids of the last
 *                          engram_max_ngram_size − 1 positions (+ m for rollback).
 *
 * Every read dequantizes to exactly the bf16 value the reference keeps in its fake-quantized bf16
 * buffers (§5.5): a put takes the row the reference's QDQ takes (the pre-quantization bf16 row)
 * and quantizes it with the io/formats.h quantizers, a read returns bf16(code · scale), which is
 * di_act_qdq_fp8 / di_fp4_qdq_e4m3 / di_fp4_qdq_e8m0 of that row bit for bit (tests/test_cache.c).
 * Passing an already-QDQ'd row is NOT equivalent for the FP4/E4M3 form (requantizing can change
 * the scale), so the forward hands over the row before its QDQ.
 *
 * ---- Positions and rollback ----------------------------------------------------------------
 * n = tokens appended. di_cache_extend(k) appends positions [n, n+k); the forward then writes
 * every cache for them (window rows, compressor inputs, the entries the new tokens complete,
 * Engram ids). di_cache_rollback(k) drops the newest k positions. Exactness without any copy:
 *   - window rings hold W + m slots (token p in slot p mod (W+m)), so appending k ≤ m tokens
 *     overwrites only slots older than the window of the position rolled back to; rollback just
 *     lowers n (O(1));
 *   - compressed KV and index keys are append-only arrays; rollback zeroes the ≤ ⌈k/R⌉ entries
 *     the dropped tokens completed (O(k));
 *   - the compressor state is a ring of nb = 1 + ⌊(R+m−2)/R⌋ group blocks ([2][R][head_dim] f32
 *     each: kv rows, then score rows; slot p mod R of block ⌊p/R⌋ mod nb), so the pending rows
 *     of the incomplete group survive k ≤ m appended tokens (the "undo log" is the older blocks);
 *   - the Engram history is a ring of (G−1) + m ids.
 * Rollback to P is exact iff P ≥ n_max − m (n_max = most tokens appended since the reset): every
 * ring then still holds what position P needs. di_cache_rollback refuses anything deeper (DI_ERR_LIMIT).
 * "Exact" means: the canonical image (di_cache_image: every byte a later step can read) and the
 * whole compressed arrays are byte-identical to a cache that never saw the dropped tokens. What is
 * not restored is rollback depth: the k ring slots the dropped tokens overwrote held the oldest
 * part of the reserve, so the next rollback may go at most m − k below P.
 *
 * Forward protocol for a chunk [s, s+k) (k = 1 for decode, block + 1 for a DSpark verify step):
 * read what its queries need from before s — di_cache_window_rows(s−W+1 … s−1) or, for one
 * query, di_cache_window_gather; di_cache_engram_history(s) — before writing the chunk's rows
 * (a chunk longer than m overwrites those slots); di_cache_extend(k); then per position in order:
 * window rows, compressor inputs into di_cache_cmp_state's block (pooling a block when its group
 * completes, then di_cache_cmp_put / di_cache_ikey_put of the entry), Engram ids. Reads check that
 * the data is held — appended, written since the last rollback, not overwritten — and fail with a
 * message otherwise, so a forward that forgets a write never reads a dropped token's bytes.
 *
 * Bounded replay (deepinfer-features §11): keep = W + margin tokens are re-run after a prefix hit;
 * the window ring holds exactly W + m positions, so a replay of W + m tokens refills every slot and
 * leaves the full rollback reserve.
 *
 * ---- Memory per sequence (di_cache_size_of), T = max_tokens ---------------------------------
 *   window     (W + m) · (hd + hd/32)                                  every stage (incl. DSpark)
 *   kv source  ⌊T/R⌋ · ((hd/2 + hd/16) + (ihd/2 + ihd/32))             compressed KV + index keys
 *              + [R ≥ 2] nb · 2 · R · hd · 4                             compressor ring
 *   Engram     (G − 1 + m) · 4                                          once per sequence
 * With m = 0 these are the §7.2 compact numbers (config.h di_cache_footprint_of gives the unit
 * sizes): 66 KiB per window, 178 B/token per ratio-2 source, 356 B/token for the ratio-1 source,
 * 890 B/token and 0.87 GiB at 1M tokens in total for the released config.
 * That arena is reserved at max_tokens up front. A paged cache (model/cache_pool.h) instead takes the
 * fixed parts (window, compressor, Engram) from a slot of a shared pool and the compressed KV and index
 * keys from fixed-size pages listed in a block table, allocated as the sequence grows: entry reads
 * and writes translate through the table (di_cache_entry_row), everything else — rollback, image,
 * prefix export / import — is unchanged and byte-identical to the contiguous cache.
 *
 * Thread safety: none; one sequence is written by one forward at a time. Distinct caches are
 * independent. The cache keeps no pointer to the di_config it was built from. */
#ifndef DI_MODEL_CACHE_H
#define DI_MODEL_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "deepinfer.h"
#include "model/config.h"

/* Rollback reserve m of a config without draft stages (constrained decoding backs off a few tokens). */
#define DI_CACHE_SPEC_MARGIN_DEFAULT 8
#define DI_CACHE_ENGRAM_NONE (-1)      /* history id of a position before the sequence start */
#define DI_CACHE_ENGRAM_DEAD (-2)      /* suggested id for image-span tokens (§4.3 "DEAD") */

typedef struct di_backend di_backend;

typedef struct di_cache_opts {
    int64_t max_tokens; /* context capacity: positions 0 … max_tokens−1 (≥ 1) */
    /* Where the arena lives (di_cache_create only): NULL = host memory with the io/formats.h codecs;
     * a backend = its memory (device memory for CUDA), rows encoded and decoded by its row_encode /
     * row_decode ops. The bookkeeping (positions, marks, rollback checks) and the Engram history stay
     * on the host either way; row buffers passed to the put / read functions live where the arena
     * does. */
    const di_backend *be;
    int spec_margin;    /* m: deepest exact rollback, 0 … 1024; 0 = the reference's sizes;
                           < 0 = di_cache_default_margin(cfg) */
} di_cache_opts;

/* The default rollback reserve of a config: with DSpark, two verify blocks of block + 1 tokens —
 * the block being checked and the one the asynchronous scheduler has already queued behind it, both
 * dropped when the first is rejected — i.e. 2 · (5 + 1) = 12 for the released config, so the replay
 * length W + m is 128 + 12 = 140, DeepInfer's documented default (deepinfer-features §11); without
 * draft stages DI_CACHE_SPEC_MARGIN_DEFAULT. Never below DI_CACHE_SPEC_MARGIN_DEFAULT. */
int di_cache_default_margin(const di_config *cfg);

/* Unit and total sizes (bytes) of one sequence's caches; see the formula above. */
typedef struct di_cache_size {
    int64_t window_slot_bytes;  /* hd + hd/32 (528) */
    int64_t cmp_entry_bytes;    /* hd/2 + hd/16 (288); 0 if no kv source */
    int64_t index_key_bytes;    /* ihd/2 + ihd/32 (68); 0 if no kv source */
    int64_t window_bytes;       /* all window rings (backbone + DSpark) */
    int64_t compressed_bytes;   /* compressed KV + index keys of all kv sources at max_tokens */
    int64_t state_bytes;        /* compressor rings */
    int64_t engram_bytes;       /* Engram history ring */
    int64_t fixed_bytes;        /* window + state + engram: independent of max_tokens */
    double per_token_bytes;     /* Σ_sources (cmp + index key)/R: growth per token (890 released) */
    int64_t total_bytes;        /* the arena di_cache_init needs (sections 64-byte aligned) */
} di_cache_size;

/* One stage's storage. Pointers are into the cache's arena; NULL where the stage has none. */
typedef struct di_cache_stage {
    uint8_t *window;      /* [ring_slots, window_slot_bytes]: [hd e4m3 | hd/32 E8M0] per slot */
    int ratio;            /* compress ratio of a kv source; 0 for every other stage */
    uint8_t *cmp;         /* [max_entries, cmp_entry_bytes]: [hd/2 packed E2M1 | hd/16 E4M3] */
    uint8_t *ikey;        /* [max_entries, index_key_bytes]: [ihd/2 packed E2M1 | ihd/32 E8M0] */
    int64_t max_entries;  /* ⌊max_tokens / ratio⌋ */
    float *state;         /* [state_blocks, 2, ratio, hd] f32 (ratio ≥ 2 sources): kv rows, score rows */
    int state_blocks;     /* nb = 1 + ⌊(ratio + m − 2)/ratio⌋; 0 without state */
    /* Paged caches (cache_pool.h): cmp / ikey are the pool's row arrays, entry e lives at row
     * pages[e / page_entries] · page_rows + row0 + e mod page_entries. A contiguous cache has one
     * implicit page: page_entries = max_entries, row0 = 0, the row is e. */
    int64_t page_entries; /* page_tokens / ratio */
    int64_t cmp_row0, ikey_row0; /* this source's first row inside a page */
} di_cache_stage;

struct di_cache_pool;

typedef struct di_cache {
    /* ---- shape (copied from the config) ---- */
    int n_stages;                 /* backbone layers + DSpark stages */
    int n_layers;                 /* backbone layers: stages ≥ n_layers are DSpark stages */
    int window;                   /* W */
    int head_dim;                 /* hd (512) */
    int index_head_dim;           /* ihd (128) */
    int engram_hist;              /* G − 1 ids of history the n-gram hash needs (0: no Engram) */
    int spec_margin;              /* m */
    int64_t max_tokens;
    int64_t ring_slots;           /* W + m */
    int64_t engram_slots;         /* G − 1 + m (0 without Engram) */
    int64_t window_slot_bytes, cmp_entry_bytes, index_key_bytes;
    di_cache_stage stage[DI_MAX_STAGES];
    int32_t *engram;              /* [engram_slots] compressed ids, position p at p mod engram_slots */

    /* ---- sequence bookkeeping ---- */
    int64_t n;                    /* tokens appended */
    int64_t n_max;                /* most tokens appended since the reset: rollback floor = n_max − m */
    /* Two marks per ring: *_hi = 1 + newest position ever written (slots older than hi − slots
     * are overwritten; never lowered), *_n = 1 + newest position written since the last rollback
     * (a read beyond it would return a dropped token's bytes: refused). */
    int64_t win_hi[DI_MAX_STAGES], win_n[DI_MAX_STAGES];
    int64_t cmp_n[DI_MAX_STAGES];    /* 1 + newest compressed entry written (kv sources) */
    int64_t ikey_n[DI_MAX_STAGES];   /* 1 + newest index key written */
    int64_t state_hi[DI_MAX_STAGES]; /* 1 + newest group whose compressor block was handed out */
    int64_t engram_hi, engram_n;     /* Engram history marks */
    /* Bounded replay (di_cache_prefix_begin; 0 otherwise): window positions below win_floor were
     * never rebuilt — no read may return them; compressed entries below cmp_frozen[st] were restored
     * from the prefix cache and a put for them is dropped (the replay must not overwrite exact
     * entries with its own, computed from a truncated window). */
    int64_t win_floor;
    int64_t cmp_frozen[DI_MAX_STAGES];

    /* ---- memory ---- */
    const di_backend *be;         /* backend whose memory holds the arena; NULL = host (see di_cache_opts) */
    int32_t *engram_host;         /* backend caches: the Engram history ring in host memory (owned) */
    void *arena;                  /* [arena_bytes], 64-byte aligned */
    size_t arena_bytes;
    int owns_arena;               /* di_cache_create'd: arena_raw is freed by di_cache_destroy */
    void *arena_raw;

    /* ---- paging (cache_pool.h; pool NULL: one contiguous arena, the fields below are 0) ----
     * The arena is then the pool's fixed slot of this cache (window rings, compressor rings); the
     * compressed KV and index keys live in pages listed in the block table. */
    struct di_cache_pool *pool;
    int32_t slot;                 /* the pool's fixed slot this cache occupies */
    int64_t page_tokens;          /* positions per page (a multiple of every compress ratio) */
    int64_t cmp_page_rows;        /* compressed-KV rows of one page, all sources (the page stride) */
    int64_t ikey_page_rows;       /* index-key rows of one page */
    int32_t *pages;               /* [cap_pages] int32 block table: page i holds positions
                                   * [i·page_tokens, (i+1)·page_tokens) of every source */
    int32_t n_pages, cap_pages;
} di_cache;

/* Sizes for a config and options (opts NULL = max_position_embeddings tokens, default margin). */
int di_cache_size_of(const di_config *cfg, const di_cache_opts *opts, di_cache_size *out, di_error *err);

/* ---- internal to cache*.c: arena access where the arena lives (host or backend memory) ---- */
int di_cache_arena_read(const di_cache *c, void *dst, const void *src, size_t bytes, di_error *err);
int di_cache_arena_write(const di_cache *c, void *dst, const void *src, size_t bytes, di_error *err);
/* Row of entry e of a kv source in its cmp (ikey = 0) or ikey (ikey = 1) array (the block table's
 * translation for a paged cache, e itself otherwise); e must be covered by the table. */
static inline int64_t di_cache_entry_row(const di_cache *c, int stage, int64_t e, int ikey) {
    const di_cache_stage *s = &c->stage[stage];
    if (!c->pool) return e;
    int64_t page = c->pages[e / s->page_entries], off = e % s->page_entries;
    return ikey ? page * c->ikey_page_rows + s->ikey_row0 + off : page * c->cmp_page_rows + s->cmp_row0 + off;
}
/* Entries from e on (< e1) that sit in consecutive rows: up to the end of e's page. */
static inline int64_t di_cache_entry_run(const di_cache *c, int stage, int64_t e, int64_t e1) {
    if (!c->pool) return e1 - e;
    int64_t pe = c->stage[stage].page_entries, end = (e / pe + 1) * pe;
    return (end < e1 ? end : e1) - e;
}
static inline uint8_t *di_cache_cmp_at(const di_cache *c, int stage, int64_t e) {
    return c->stage[stage].cmp + di_cache_entry_row(c, stage, e, 0) * c->cmp_entry_bytes;
}
static inline uint8_t *di_cache_ikey_at(const di_cache *c, int stage, int64_t e) {
    return c->stage[stage].ikey + di_cache_entry_row(c, stage, e, 1) * c->index_key_bytes;
}
/* Builds c over a fixed slot of a pool (cache_pool.c): the window / compressor / Engram sections
 * only, in the slot's memory (backend memory when opts->be); the caller fills the paging fields. */
int di_cache_init_slot(di_cache *c, const di_config *cfg, const di_cache_opts *opts, void *slot, size_t slot_bytes,
                       int32_t *engram_host, di_error *err);
/* The fixed-section sizes of a paged cache: total_bytes = the slot (no compressed sections). */
int di_cache_slot_size_of(const di_config *cfg, const di_cache_opts *opts, di_cache_size *out, di_error *err);

/* Build a cache in caller host memory (≥ di_cache_size_of().total_bytes, 64-byte aligned; opts->be must
 * be NULL: a backend arena comes from di_cache_create). The memory
 * is taken as is: only the fixed parts are initialised (compressor score rows = −inf, kv rows 0,
 * history = NONE); the compressed arrays are never read beyond the appended entries, and a
 * zero-filled arena (calloc, fresh mmap) keeps their byte image canonical. */
int di_cache_init(di_cache *c, const di_config *cfg, const di_cache_opts *opts, void *arena, size_t arena_bytes,
                  di_error *err);
/* The same with its own zero-filled arena, in opts->be's memory when set (released by di_cache_destroy). */
int di_cache_create(const di_config *cfg, const di_cache_opts *opts, di_cache **out, di_error *err);
void di_cache_destroy(di_cache *c); /* frees a di_cache_create'd cache; NULL is fine */

/* Start a new sequence in the same memory: n = 0, compressor state and history reset, O(fixed).
 * The compressed arrays keep the old sequence's bytes beyond what the new one writes; no read and
 * no image reaches them (only a fresh zero-filled arena gives zeros there). A paged cache
 * (cache_pool.h) in own mode returns its pages to the pool; in external mode it keeps its block
 * table until di_cache_set_pages gives the next sequence's. Returns DI_OK, or the status of a
 * failed device fill of the compressor state (backend memory only): the cache must not be used
 * then (di_session_reset marks its session broken). */
int di_cache_reset(di_cache *c);

/* ---- positions ---- */
/* Append positions [n, n+k). A paged cache first covers them with pages (cache_pool.h): DI_ERR_LIMIT
 * when its pool is exhausted (own mode) or its block table is short (external mode); n is unchanged then. */
int di_cache_extend(di_cache *c, int64_t k, di_error *err);
int di_cache_rollback(di_cache *c, int64_t k, di_error *err); /* drop the newest k (exact, O(k)) */
static inline int64_t di_cache_len(const di_cache *c) { return c->n; }
/* How many of the newest tokens can be rolled back exactly now. */
static inline int64_t di_cache_rollback_limit(const di_cache *c) {
    int64_t floor = c->n_max - c->spec_margin;
    return floor > 0 ? c->n - floor : c->n;
}
/* Compressed entries of a ratio-R stream visible to the query at pos: (n+1)·R ≤ pos+1. */
static inline int64_t di_cache_visible(int64_t pos, int ratio) { return (pos + 1) / ratio; }
/* Entries the appended tokens complete (written or to be written by the forward): ⌊n/R⌋. */
int64_t di_cache_n_entries(const di_cache *c, int stage);

/* ---- window rings (every stage) ----
 * row: bf16 [hd], the latent after kv_norm and RoPE, BEFORE its FP8 QDQ. pos must be an appended
 * position within the ring's reach: max(0, n − (W+m)) ≤ pos < n. Reads need the position held
 * (appended, written since the last rollback, not overwritten by a position W+m later). */
int di_cache_window_put(di_cache *c, int stage, int64_t pos, const uint16_t *row, di_error *err);
/* Rows of positions [pos0, pos0+count) (bf16 [count, hd]); rows older than the ring's reach are
 * skipped: after a long chunk only its last W + m positions are kept. */
int di_cache_window_put_rows(di_cache *c, int stage, int64_t pos0, int64_t count, const uint16_t *rows,
                             di_error *err);
/* Dequantized rows of positions [p0, p1), ascending (bf16 [p1−p0, hd]); every one must be held. */
int di_cache_window_rows(const di_cache *c, int stage, int64_t p0, int64_t p1, uint16_t *rows, di_error *err);
/* The window of the query at pos (pos < n) in the reference's decode order (§5.3: the W-slot ring
 * listed oldest first, slots (pos mod W)+1 … W−1, 0 … pos mod W, slots not yet written = −1, which
 * then come first). Entry j holds position pos − W + 1 + j: rows[j] = its dequantized row and
 * idx[j] = j, or idx[j] = −1 and rows[j] = 0 when that position is < 0. Feed rows as the window
 * key set and idx as the window part of the index list.  rows bf16 [W, hd];  idx int32 [W] */
int di_cache_window_gather(const di_cache *c, int stage, int64_t pos, uint16_t *rows, int32_t *idx,
                           di_error *err);
/* DSpark stage window at main position pos (§4.9): the valid slots of the W-slot ring in SLOT
 * order 0 … min(W, pos+1)−1 (slot s holds the position q ≤ pos with q ≡ s mod W, q > pos − W).
 *   rows bf16 [min(W, pos+1), hd]; *n_rows = min(W, pos+1) */
int di_cache_dspark_gather(const di_cache *c, int stage, int64_t pos, uint16_t *rows, int64_t *n_rows,
                           di_error *err);

/* ---- kv sources: compressed KV and index keys ----
 * e < ⌊n/R⌋ (an entry the appended tokens complete). row: bf16 [hd] after RoPE, before the FP4
 * QDQ; key: bf16 [ihd] after RoPE, before the FP4 QDQ. */
int di_cache_cmp_put(di_cache *c, int stage, int64_t e, const uint16_t *row, di_error *err);
int di_cache_ikey_put(di_cache *c, int stage, int64_t e, const uint16_t *key, di_error *err);
/* Entries [e0, e1), dequantized: rows bf16 [e1−e0, hd] / keys bf16 [e1−e0, ihd]. Every entry must
 * have been written since the last rollback. */
int di_cache_cmp_rows(const di_cache *c, int stage, int64_t e0, int64_t e1, uint16_t *rows, di_error *err);
int di_cache_ikey_rows(const di_cache *c, int stage, int64_t e0, int64_t e1, uint16_t *keys, di_error *err);
/* Selected entries (a top-k list; −1 gives a zero row): rows bf16 [count, hd]. */
int di_cache_cmp_gather(const di_cache *c, int stage, const int32_t *ent, int64_t count, uint16_t *rows,
                        di_error *err);

/* Compressor carry state of a ratio-R ≥ 2 source: the block of the group ⌊pos/R⌋ in the reference's
 * layout (kv_state f32 [R, hd], score_state f32 [R, hd], token p in row p mod R; di_cpu_compress_pool
 * takes it as is for the tokens of that group). pos < n, and the group must be one of the nb newest
 * (a newer group reuses the block): the forward feeds its positions in order, writes each token's
 * f32 projections into row pos mod R and pools the block when the group completes. A new sequence
 * starts with kv rows 0 and score rows −inf (the reference's reset). */
int di_cache_cmp_state(di_cache *c, int stage, int64_t pos, float **kv_state, float **score_state,
                       di_error *err);

/* ---- batched rows (one backend call for the rows of every sequence of a pass) ----
 * The *_addrs functions check a put or read exactly as the calls above and update the marks as a put
 * does, but return the arena addresses of the rows instead of moving bytes: a pass collects them over
 * all its sequences and encodes / decodes them with one di_cache_rows_encode / _decode. A NULL write
 * address is a row the put would skip (older than the ring's reach; a frozen prefix entry).
 *   dst, src: host arrays of count / p1−p0 / e1−e0 addresses (into backend memory for a backend arena) */
int di_cache_window_put_addrs(di_cache *c, int stage, int64_t pos0, int64_t count, uint8_t **dst, di_error *err);
int di_cache_window_read_addrs(const di_cache *c, int stage, int64_t p0, int64_t p1, const uint8_t **src,
                               di_error *err);
/* Entries [e0, e1) of the compressed KV (ikey = 0) or index keys (1) of a kv source. */
int di_cache_entry_put_addrs(di_cache *c, int stage, int ikey, int64_t e0, int64_t e1, uint8_t **dst, di_error *err);
/* Entries [e0, e1) to read (every one written since the last rollback, as di_cache_cmp_rows / _ikey_rows). */
int di_cache_entry_read_addrs(const di_cache *c, int stage, int ikey, int64_t e0, int64_t e1, const uint8_t **src,
                              di_error *err);
/* Where the index keys [0, n) of kv source `stage` lie, for a reader that translates entries itself
 * (the batched index scorer, backend.h di_index_row): entry e at row e of base (pages NULL: a
 * contiguous cache) or at row pages[e / page_entries]·page_rows + row0 + e mod page_entries. pages is
 * the cache's host block table (n_pages entries): a device reader needs its copy. Checked as a read of
 * those entries (every one written since the last rollback). */
typedef struct di_cache_ikey_layout {
    const uint8_t *base;   /* the index-key rows (the arena's memory) */
    const int32_t *pages;  /* int32 [n_pages] host block table, or NULL */
    int32_t n_pages;
    int64_t page_entries, page_rows, row0;
} di_cache_ikey_layout;
int di_cache_ikey_layout_of(const di_cache *c, int stage, int64_t n, di_cache_ikey_layout *out, di_error *err);
typedef enum di_cache_rows_kind { DI_CACHE_ROWS_WINDOW, DI_CACHE_ROWS_CMP, DI_CACHE_ROWS_IKEY } di_cache_rows_kind;
/* *dst[i] = the cache form of x[i] / y[i] = the value of *src[i] (NULL: skipped / zero row), for rows
 * of caches in be's memory, in one row_encode_scatter / row_decode_gather call.
 *   x, y bf16 [n, d] (backend memory);  dst, src: n addresses (host array) */
int di_cache_rows_encode(const di_backend *be, di_cache_rows_kind kind, const uint16_t *x, int64_t n, int64_t d,
                         uint8_t *const *dst, di_error *err);
int di_cache_rows_decode(const di_backend *be, di_cache_rows_kind kind, const uint8_t *const *src, int64_t n,
                         int64_t d, uint16_t *y, di_error *err);
/* The same with the address list already in backend memory (the host list itself on a host-memory
 * backend): the forward uploads it from its arena's pinned staging, so a pass allocates nothing and
 * copies nothing from pageable memory (what a captured CUDA graph needs). */
int di_cache_rows_encode_list(const di_backend *be, di_cache_rows_kind kind, const uint16_t *x, int64_t n, int64_t d,
                              uint8_t *const *dst_list, di_error *err);
int di_cache_rows_decode_list(const di_backend *be, di_cache_rows_kind kind, const uint8_t *const *src_list,
                              int64_t n, int64_t d, uint16_t *y, di_error *err);
/* The compressor state ring of a ratio ≥ 2 source for positions [p0, p1) fed in one
 * compress_pool_ring call (state f32 [n_blocks, 2, R, hd]); the checks and marks of
 * di_cache_cmp_state for each of their groups in order. */
int di_cache_cmp_state_ring(di_cache *c, int stage, int64_t p0, int64_t p1, float **state, int *n_blocks,
                            di_error *err);

/* ---- Engram n-gram history ----
 * put: the compressed id of the token at pos (an appended position, pos ≥ n − (G−1+m)).
 * history: ids of positions pos−1, pos−2, …, pos−(G−1) (lookback order), DI_CACHE_ENGRAM_NONE
 * for positions < 0; pos ≤ n and every looked-up position held.  out int32 [G−1] */
int di_cache_engram_put(di_cache *c, int64_t pos, int32_t id, di_error *err);
int di_cache_engram_history(const di_cache *c, int64_t pos, int32_t *out, di_error *err);

/* ---- canonical state image ----
 * Everything a later forward or rollback-free continuation can read, serialized in a fixed order:
 * n; per stage the window slots of positions [max(0, n−W), n) (compact bytes, ascending); per kv
 * source entries [0, ⌊n/R⌋) of compressed KV and index keys and the pending compressor rows of
 * positions [n − n mod R, n) (kv then score); the Engram ids of [max(0, n−(G−1)), n). Two caches
 * with equal images compute identical results from here on. *written (may be NULL) receives the
 * image size; a cap below it fails with DI_ERR_LIMIT; out = NULL or cap = 0 only asks for the size. */
int64_t di_cache_image_bytes(const di_cache *c);
int di_cache_image(const di_cache *c, uint8_t *out, int64_t cap, int64_t *written, di_error *err);

/* ---- prefix export / import (engine/prefix_cache.h: bounded replay, deepinfer-features §11) ----
 * What is exact to reuse from a sequence at a token boundary B: the compressed KV entries and index
 * keys of every kv source up to B (append-only arrays, a pure function of tokens [0, B) and of the
 * prompt length of the request that computed them: its index-selection width), the compressor carry
 * state and the Engram history. B must be a multiple of every compress ratio, so
 * no compressor row is pending at B (the state is the reset state) — di_cache_prefix_align gives
 * the least such multiple. The Engram history is a function of the token ids alone; the session
 * restores it from them (di_session_prefix_restore). The window rings are NOT part of a prefix: a
 * replay of the last `keep` tokens before B rebuilds them.
 *
 * A span [t0, t1) (both multiples of the alignment) serializes, per kv source in stage order, its
 * entries [t0/R, t1/R): compressed KV bytes, then index key bytes (the compact forms, copied). */
int di_cache_prefix_align(const di_cache *c); /* lcm of the compress ratios (1 without kv source) */
int64_t di_cache_prefix_span_bytes(const di_cache *c, int64_t t0, int64_t t1);
/* Span [t0, t1) of this sequence (t1 ≤ n; every entry written) into out (cap ≥ span bytes). */
int di_cache_prefix_export(const di_cache *c, int64_t t0, int64_t t1, uint8_t *out, int64_t cap, di_error *err);
/* Start a sequence that resumes at boundary B with replay from r = replay_start (0 ≤ r ≤ B, both
 * aligned): resets the cache, sets n = r, freezes the entries [0, B/R) (to be filled by
 * di_cache_prefix_import before the replay reads them) and puts the window floor at r: every read
 * below r is refused (the replay chunk's forward runs with window_floor = r, so it reads none). The Engram history of [r − (G−1), r) is
 * the caller's to put. */
int di_cache_prefix_begin(di_cache *c, int64_t boundary, int64_t replay_start, di_error *err);
/* Copy a span [t0, t1) (t1 ≤ the boundary of di_cache_prefix_begin) in from src (bytes = span bytes). */
int di_cache_prefix_import(di_cache *c, int64_t t0, int64_t t1, const uint8_t *src, int64_t bytes, di_error *err);

#endif
