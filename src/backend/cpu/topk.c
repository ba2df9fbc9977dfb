/* Deterministic selections (spec model.md §4.4, §5.6): indexer top-k and the candidate-block mask.
 *
 * Tie rule (the reference's torch.topk does not define one): higher score first, then lower
 * position. Implementation: radix select on the order-preserving 32-bit image of each f32 score,
 * one byte per pass from the most significant, which finds the k-th largest key T and how many
 * entries equal to T still fit; a final ascending scan then emits every key > T and the first
 * (lowest-position) entries with key == T. O(n) per row, no sort, and the output comes out in
 * ascending position order, which is the order the reference sorts its selection into.
 *
 * Where each selection rule is used: the CPU backend that reproduces the golden data selects with
 * graph_extra_topk.c instead, which replays libstdc++'s introselect/heap select as torch.topk runs it
 * on CPU, so that among EQUAL scores it keeps the entries the reference kept (the indexer produces
 * many exact-zero ties). That rule is an artefact of one library. The rule here is the canonical,
 * implementation-independent one — the contract a GPU backend can implement with any parallel
 * select and still agree bit for bit with this file — and the CUDA top-k is to be tested against
 * it (tests/test_cpu_attn.c pins it down). The two differ only in which of several equal-scoring
 * entries survive the cut. The MoE router (router.c) applies the same canonical rule to experts. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_attn.h"
#include "util/error.h"

/* Order-preserving key: key(a) < key(b) ⇔ a < b for non-NaN floats; −0 is mapped to +0 first. */
static uint32_t order_key(float f) {
    if (f == 0.0f) f = 0.0f;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Selectable entries: finite or +inf scores (−inf and NaN are never chosen). */
static int selectable(float f) { return f > -INFINITY; }

/* The cut of a top-k selection: every selectable entry with key > `key`, plus the first `ties`
 * entries (in scan order) whose key equals `key`; `all` when there are no more than k selectable
 * entries and every one of them is taken. */
typedef struct cut {
    int all;
    uint32_t key;
    int64_t ties;
} cut;

static cut find_cut(const float *s, int64_t n, int64_t k) {
    cut c = {1, 0, 0};
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++) count += selectable(s[i]);
    if (count <= k) return c;
    c.all = 0;
    uint32_t prefix = 0, mask = 0;
    int64_t need = k; /* entries still to take among those matching the prefix found so far */
    for (int shift = 24; shift >= 0; shift -= 8) {
        int64_t hist[256] = {0};
        for (int64_t i = 0; i < n; i++) {
            if (!selectable(s[i])) continue;
            uint32_t key = order_key(s[i]);
            if ((key & mask) == prefix) hist[(key >> shift) & 255u]++;
        }
        int b = 255;
        while (hist[b] < need) need -= hist[b--]; /* stops: the matching entries number ≥ need ≥ 1 */
        prefix |= (uint32_t)b << shift;
        mask |= 255u << shift;
    }
    c.key = prefix;
    c.ties = need;
    return c;
}

/* Scan predicate; call it on entries in ascending position order so ties go to lower positions. */
static int take(cut *c, float f) {
    if (!selectable(f)) return 0;
    if (c->all) return 1;
    uint32_t key = order_key(f);
    if (key > c->key) return 1;
    if (key == c->key && c->ties > 0) {
        c->ties--;
        return 1;
    }
    return 0;
}

int di_cpu_topk(const float *scores, int64_t n_q, int64_t n_keys, const int32_t *vis, int k, int32_t offset,
                int32_t *out, di_error *err) {
    if (n_q < 0 || n_keys < 0 || k < 0 || offset < 0)
        return di_error_set(err, DI_ERR_INVALID, "topk: n_q %lld, n_keys %lld, k %d, offset %d", (long long)n_q,
                            (long long)n_keys, k, offset);
    for (int64_t i = 0; i < n_q; i++) {
        if (vis[i] < 0 || vis[i] > n_keys)
            return di_error_set(err, DI_ERR_INVALID, "topk: query %lld sees %d entries, expected 0..%lld",
                                (long long)i, vis[i], (long long)n_keys);
        if ((int64_t)vis[i] + offset > INT32_MAX)
            return di_error_set(err, DI_ERR_INVALID, "topk: offset %d + %d entries overflows int32", offset,
                                vis[i]);
    }
    for (int64_t i = 0; i < n_q; i++) {
        const float *s = scores + i * n_keys; /* only the vis[i] visible entries compete */
        int32_t *o = out + i * (int64_t)k;
        cut c = find_cut(s, vis[i], k);
        int64_t j = 0;
        for (int64_t n = 0; n < vis[i]; n++)
            if (take(&c, s[n])) o[j++] = (int32_t)n + offset;
        for (; j < k; j++) o[j] = -1;
    }
    return DI_OK;
}

int di_cpu_candidate_mask(const float *scores, int64_t n_q, int64_t n_keys, const int32_t *vis, int block_size,
                          int topk_blocks, uint8_t *mask, float *ws, di_error *err) {
    if (n_q < 0 || n_keys < 0 || block_size < 1 || topk_blocks < 0)
        return di_error_set(err, DI_ERR_INVALID, "candidate_mask: n_q %lld, n_keys %lld, block_size %d, topk_blocks %d",
                            (long long)n_q, (long long)n_keys, block_size, topk_blocks);
    const int64_t n_blocks = (n_keys + block_size - 1) / block_size;
    const int64_t kb = topk_blocks < n_blocks ? topk_blocks : n_blocks;
    for (int64_t i = 0; i < n_q; i++)
        if (vis[i] < 0 || vis[i] > n_keys)
            return di_error_set(err, DI_ERR_INVALID, "candidate_mask: query %lld sees %d entries, expected 0..%lld",
                                (long long)i, vis[i], (long long)n_keys);
    for (int64_t i = 0; i < n_q; i++) {
        const float *s = scores + i * n_keys;
        float *blk = ws; /* f32 [n_blocks]: block maxima, the pad past n_keys counting as −inf */
        for (int64_t b = 0; b < n_blocks; b++) {
            float mx = -INFINITY;
            int64_t end = (b + 1) * block_size < n_keys ? (b + 1) * block_size : n_keys;
            for (int64_t n = b * block_size; n < end; n++) mx = s[n] > mx ? s[n] : mx;
            blk[b] = mx;
        }
        /* the newest visible entry's block is only partly filled: keep it whatever it scores */
        if (vis[i] > 0) blk[(vis[i] - 1) / block_size] = INFINITY;
        cut c = find_cut(blk, n_blocks, kb);
        uint8_t *m = mask + i * n_keys;
        for (int64_t b = 0; b < n_blocks; b++) {
            uint8_t keep = (uint8_t)take(&c, blk[b]);
            int64_t end = (b + 1) * block_size < n_keys ? (b + 1) * block_size : n_keys;
            for (int64_t n = b * block_size; n < end; n++) m[n] = keep;
        }
    }
    return DI_OK;
}
