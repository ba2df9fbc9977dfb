/* Top-k with the reference's own tie behaviour (spec §5.6).
 *
 * The reference selects with torch.topk, which leaves ties unspecified; on CPU (where the golden data
 * was produced) torch builds (value, index) pairs in index order and runs libstdc++'s std::nth_element
 * (introselect) for k − 1 — or std::partial_sort (heap select) when k·64 ≤ n — with the comparator
 * "x > y, NaN first". That algorithm is deterministic, so replaying its exact sequence of comparisons
 * and swaps reproduces the reference's choice among equal scores, including the common exact-zero ties
 * of the indexer (every head's relu 0). Written from the algorithm's description (introselect with
 * median-of-three pivot and unguarded partition, insertion sort below 4 elements, heap select with
 * sift-down/sift-up on depth exhaustion), it selects the reference's set on every row of the three
 * golden cases (tests/test_verify.c). A CUDA backend would use the GPU's rule instead; ties are then a
 * documented divergence.
 *
 * Cost: O(n) expected per row (O(n log k) on the heap path); per-row work only, so batch invariant. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/graph_extra.h"
#include "util/error.h"

typedef struct elem {
    float v;
    int32_t i;
} elem;

/* torch's comparator for largest = true: NaN sorts first, then greater values. */
static inline int before(elem x, elem y) { return (isnan(x.v) && !isnan(y.v)) || x.v > y.v; }

static inline void swap_e(elem *a, elem *b) {
    elem t = *a;
    *a = *b;
    *b = t;
}

/* ---- heap primitives (the comparator's "max-heap": the root is the element ordered LAST) ---- */

static void push_heap(elem *f, int64_t hole, int64_t top, elem val) {
    int64_t parent = (hole - 1) / 2;
    while (hole > top && before(f[parent], val)) {
        f[hole] = f[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    f[hole] = val;
}

static void adjust_heap(elem *f, int64_t hole, int64_t len, elem val) {
    int64_t top = hole, child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (before(f[child], f[child - 1])) child--;
        f[hole] = f[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        f[hole] = f[child - 1];
        hole = child - 1;
    }
    push_heap(f, hole, top, val);
}

static void make_heap(elem *f, int64_t len) {
    if (len < 2) return;
    for (int64_t parent = (len - 2) / 2;; parent--) {
        adjust_heap(f, parent, len, f[parent]);
        if (parent == 0) return;
    }
}

/* Leaves the best `mid` elements of f[0, len) in f[0, mid) (as a heap). */
static void heap_select(elem *f, int64_t mid, int64_t len) {
    make_heap(f, mid);
    for (int64_t i = mid; i < len; i++)
        if (before(f[i], f[0])) {
            elem val = f[i];
            f[i] = f[0];
            adjust_heap(f, 0, mid, val);
        }
}

/* ---- introselect ---- */

static void median_to_first(elem *r, elem *a, elem *b, elem *c) {
    if (before(*a, *b)) {
        if (before(*b, *c))
            swap_e(r, b);
        else if (before(*a, *c))
            swap_e(r, c);
        else
            swap_e(r, a);
    } else if (before(*a, *c))
        swap_e(r, a);
    else if (before(*b, *c))
        swap_e(r, c);
    else
        swap_e(r, b);
}

static elem *unguarded_partition(elem *first, elem *last, elem *pivot) {
    for (;;) {
        while (before(*first, *pivot)) first++;
        last--;
        while (before(*pivot, *last)) last--;
        if (!(first < last)) return first;
        swap_e(first, last);
        first++;
    }
}

static void insertion_sort(elem *first, elem *last) {
    if (first == last) return;
    for (elem *i = first + 1; i != last; i++) {
        elem val = *i;
        if (before(val, *first)) {
            memmove(first + 1, first, sizeof(elem) * (size_t)(i - first));
            *first = val;
        } else {
            elem *j = i, *prev = i - 1;
            while (before(val, *prev)) *j = *prev, j = prev--;
            *j = val;
        }
    }
}

static int floor_log2(int64_t n) {
    int l = 0;
    while (n >>= 1) l++;
    return l;
}

static void nth_element(elem *first, elem *nth, elem *last) {
    int depth = 2 * floor_log2(last - first);
    while (last - first > 3) {
        if (depth == 0) {
            heap_select(first, nth - first + 1, last - first);
            swap_e(first, nth);
            return;
        }
        depth--;
        elem *mid = first + (last - first) / 2;
        median_to_first(first, first + 1, mid, last - 1);
        elem *cut = unguarded_partition(first + 1, last, first);
        if (cut <= nth)
            first = cut;
        else
            last = cut;
    }
    insertion_sort(first, last);
}

/* After this, q[0, k) holds the reference's top-k set of q[0, n) (k ≥ 1). */
static void torch_cpu_topk(elem *q, int64_t n, int64_t k) {
    if (k * 64 <= n)
        heap_select(q, k, n);
    else
        nth_element(q, q + k - 1, q + n);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int di_gx_topk_torch(const di_backend *be, const float *scores, int64_t m, int64_t nk, const int32_t *vis, int k,
                     int32_t offset, int32_t *out, di_error *err) {
    if (k < 0 || k > nk) return di_error_set(err, DI_ERR_INVALID, "topk: k=%d of %lld entries", k, (long long)nk);
    if (k == 0) return DI_OK;
    elem *q = malloc(sizeof(elem) * (size_t)nk); /* [nk] (score, position) pairs */
    int32_t *sel = malloc(sizeof(int32_t) * (size_t)k);
    if (!q || !sel) {
        free(q), free(sel);
        return di_error_set(err, DI_ERR_NOMEM, "topk scratch");
    }
    for (int64_t r = 0; r < m; r++) {
        for (int64_t j = 0; j < nk; j++) q[j] = (elem){scores[r * nk + j], (int32_t)j};
        torch_cpu_topk(q, nk, k);
        for (int j = 0; j < k; j++) sel[j] = q[j].i;
        /* the reference sorts the positions, then marks the unreachable ones (≥ vis, necessarily the
         * largest) −1: valid positions ascending, then the padding */
        qsort(sel, (size_t)k, sizeof(int32_t), cmp_i32);
        for (int j = 0; j < k; j++) out[r * k + j] = sel[j] < vis[r] ? sel[j] + offset : -1;
    }
    free(q), free(sel);
    return DI_OK;
}

int di_gx_candidate_mask_torch(const di_backend *be, const float *scores, int64_t m, int64_t nk, const int32_t *vis,
                               int block, int topk_blocks, uint8_t *mask, float *ws, di_error *err) {
    if (block <= 0 || topk_blocks <= 0 || nk < 0)
        return di_error_set(err, DI_ERR_INVALID, "candidate_mask: block %d, top %d blocks, %lld entries", block,
                            topk_blocks, (long long)nk);
    int64_t nb = (nk + block - 1) / block, keep = topk_blocks < nb ? topk_blocks : nb;
    if (nb == 0) return DI_OK;
    elem *q = malloc(sizeof(elem) * (size_t)nb); /* [nb] (block score, block) pairs */
    uint8_t *kept = malloc((size_t)nb);
    if (!q || !kept) {
        free(q), free(kept);
        return di_error_set(err, DI_ERR_NOMEM, "candidate_mask scratch");
    }
    for (int64_t r = 0; r < m; r++) {
        const float *s = scores + r * nk;
        /* block score = max over its entries, −inf padding past the end; the newest block pinned */
        int64_t last = vis[r] > 0 ? (vis[r] - 1) / block : -1;
        for (int64_t b = 0; b < nb; b++) {
            float mx = -INFINITY;
            for (int64_t n = b * block; n < (b + 1) * block && n < nk; n++) mx = fmaxf(mx, s[n]);
            ws[b] = b == last ? INFINITY : mx;
            q[b] = (elem){ws[b], (int32_t)b};
        }
        torch_cpu_topk(q, nb, keep);
        memset(kept, 0, (size_t)nb);
        for (int64_t j = 0; j < keep; j++) /* picks past the reachable blocks come back −inf: dropped */
            if (q[j].v > -INFINITY) kept[q[j].i] = 1;
        for (int64_t n = 0; n < nk; n++) mask[r * nk + n] = kept[n / block];
    }
    free(q), free(kept);
    return DI_OK;
}
