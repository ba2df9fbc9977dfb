/* The heap selection's steps on the GPU (cuda_select.cuh's torch-order replay): libstdc++'s heap
 * functions step for step, and the pipelined form of the heap path's replacements (heap_pipe_warp,
 * the default; DI_CUDA_HEAP=serial runs the steps instead). No CUDA runtime here:
 * tests/emu/test_cuda_heap_pipe_emu.cc compiles it for the host
 * with the fiber emulation of cuda_gemm_bf16_emu.h and checks the pipeline against the serial steps. */
#ifndef DI_BACKEND_CUDA_CUDA_HEAP_PIPE_CUH
#define DI_BACKEND_CUDA_CUDA_HEAP_PIPE_CUH

#include <math.h>
#include <stdint.h>

typedef struct __align__(8) telem { /* 8-byte aligned: one shared-memory load or store per entry */
    float v;
    int32_t i;
} telem;

static __device__ __forceinline__ bool before(telem x, telem y) { return (isnan(x.v) && !isnan(y.v)) || x.v > y.v; }

/* libstdc++'s __push_heap / __adjust_heap / __make_heap with the comparator before(), step for step. KEY:
 * the entries' .v hold torch_key bits (one unsigned compare instead of the NaN tests, the same order);
 * I: the index type (int where the heap is known to be smaller than 2^31: fewer instructions on the heap
 * path's serial steps). */
template <bool KEY>
static __device__ __forceinline__ bool hbefore(telem x, telem y) {
    return KEY ? __float_as_uint(x.v) > __float_as_uint(y.v) : before(x, y);
}

template <bool KEY, typename I>
static __device__ void push_heap_t(telem *f, I hole, I top, telem val) {
    I parent = (hole - 1) / 2;
    while (hole > top && hbefore<KEY>(f[parent], val)) {
        f[hole] = f[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    f[hole] = val;
}

template <bool KEY, typename I>
static __device__ void adjust_heap_t(telem *f, I hole, I len, telem val) {
    I top = hole, child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (hbefore<KEY>(f[child], f[child - 1])) child--;
        f[hole] = f[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        f[hole] = f[child - 1];
        hole = child - 1;
    }
    push_heap_t<KEY, I>(f, hole, top, val);
}

template <bool KEY, typename I>
static __device__ void make_heap_t(telem *f, I len) {
    if (len < 2) return;
    for (I parent = (len - 2) / 2;; parent--) {
        adjust_heap_t<KEY, I>(f, parent, len, f[parent]);
        if (parent == 0) return;
    }
}

/* The pipelined replacements (the default since 2026-12-01, session 11: exact on the GPU tests). A
 * replacement (adjust_heap from the root, then push_heap) leaves the heap as a sift-down that stops early
 * does: walking down the path of the children it moves up (at each node the right child unless it is
 * before the left one), it moves a child up while the child is not after the new entry and places the
 * entry where the child is after it (the push-up moves back exactly the children after the entry; below
 * them nothing changed). Such a walk writes level t only while it is at level t, so a later replacement
 * can start as soon as the earlier one is two levels down: each lane holds one replacement in flight, all
 * of them advance one level per step (reads, a warp barrier, writes), and a new one starts every second
 * step, tested against a root that is final by then. One step per level of the heap's height becomes two
 * steps per replacement. */
/* Candidate j of a scan: c[idx[j]] (idx given) or c[j]; past tot an entry no test reads. */
static __device__ __forceinline__ telem heap_pipe_cand(const telem *c, const int32_t *idx, int tot, int j) {
    return j < tot ? (idx ? c[idx[j]] : c[j]) : telem{0.0f, 0};
}

/* One step of the pipeline: every replacement in flight moves one level down (a read phase deciding from
 * the heap before the step, a warp barrier, the writes: distinct nodes, LAG levels apart). */
static __device__ __forceinline__ void heap_pipe_step(telem *f, int k, int &node, const telem &val) {
    int wpos = -1, nnode = node;
    telem wval = val;
    if (node >= 0) {
        const int l = 2 * node + 1, r = l + 1;
        wpos = node, nnode = -1;
        if (l < k) {
            const telem L = f[l], R = r < k ? f[r] : L;
            const bool right = r < k && !hbefore<true>(R, L);
            const telem C = right ? R : L;
            if (!hbefore<true>(C, val)) wval = C, nnode = right ? r : l; /* the child moves up */
        }
    }
    __syncwarp();
    if (wpos >= 0) f[wpos] = wval;
    node = nnode;
    __syncwarp();
}

/* The serial loop of heap_scan_cta (candidates c[idx[0, tot)), or c[0, tot) when idx is NULL, each
 * replacing the root when it is before it at its turn) on the 32 lanes of one warp, all of them calling.
 * LAG: steps between two starts (2: the earlier replacement two levels down; the emulation test also
 * runs 1, which must differ). The candidates are read 32 at a time, one per lane (a window), so a start
 * costs one root read, one vote and two shuffles; the next window is loaded while the heap steps run.
 * tot ≤ 2^31 − 64. */
template <int LAG = 2>
static __device__ void heap_pipe_warp(telem *f, int k, const telem *c, const int32_t *idx, int tot) {
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    int node = -1; /* this lane's replacement: the node holding its hole, −1 for none */
    telem val = {0.0f, 0};
    int base = 0; /* the window: candidates base + lane */
    int off = 0;  /* the next candidate to test is base + off */
    telem wc = heap_pipe_cand(c, idx, tot, base + lane);
    unsigned started = 0; /* replacements started: number s runs on lane s mod 32 (free again long before) */
    for (;;) {
        heap_pipe_step(f, k, node, val);
        const telem root = f[0];
        while (base + off < tot) { /* the first candidate of the window from off on before the root starts */
            const unsigned m = __ballot_sync(full, lane >= off && base + lane < tot && hbefore<true>(wc, root));
            if (!m) {
                base += 32, off = 0;
                wc = heap_pipe_cand(c, idx, tot, base + lane);
                continue;
            }
            const int b = __ffs(m) - 1;
            const float bv = __shfl_sync(full, wc.v, b);
            const int bi = __shfl_sync(full, wc.i, b);
            if (lane == (int)(started & 31)) node = 0, val = telem{bv, bi};
            off = b + 1, started++;
            if (off == 32) {
                base += 32, off = 0;
                wc = heap_pipe_cand(c, idx, tot, base + lane);
            }
            break;
        }
#pragma unroll
        for (int s = 1; s < LAG; s++) heap_pipe_step(f, k, node, val); /* the steps before the next start */
        if (!__any_sync(full, node >= 0) && base + off >= tot) break;
    }
    __syncwarp();
}

/* make_heap_t's heap on the CTA (every thread calls it): the parents of one level at a time, deepest first,
 * each parent's adjust_heap_t on its own thread. The serial loop takes the parents in descending index
 * order; a parent's adjust_heap_t reads and writes its subtree only, the subtrees of one level's parents are
 * disjoint, and every deeper parent has a larger index, so the order inside a level changes nothing: the
 * same heap, with ~45 dependent steps for k = 512 instead of ~1,000. */
template <bool KEY>
static __device__ void make_heap_cta(telem *f, int len) {
    if (len < 2) return;
    const int last = (len - 2) / 2; /* the last parent */
    int lv = 0;                     /* its level */
    while ((2 << lv) - 1 <= last) lv++;
    for (; lv >= 0; lv--) {
        const int a = (1 << lv) - 1, b = 2 * a < last ? 2 * a : last;
        for (int p = a + (int)threadIdx.x; p <= b; p += (int)blockDim.x) adjust_heap_t<KEY, int>(f, p, len, f[p]);
        __syncthreads();
    }
}

/* The streamed heap path's pipeline (the default there): heap_pipe_warp's replacements, the same heap, in
 * fewer instructions per step. A warp's step is a chain of dependent instructions — its length, not the
 * work, sets the time (~835 cycles per replacement for heap_pipe_warp, bench/NOTES-gpu.md session 11;
 * ~350 for this form, session 20) — so:
 *   - the heap is followed by HEAP_PAD_N(k) pad entries of key HEAP_PAD_KEY, after every key: a node's
 *     children are always read (a leaf's are pads, which never move up; the one child of node k/2 − 1 of
 *     an even heap has a pad beside it, which is never chosen), and a lane without a replacement parks on
 *     node k, whose children are pads too — no bounds tests;
 *   - one warp barrier per step: in a step a lane reads the level below its node and writes its node's
 *     level, and replacements are LAG ≥ 2 levels apart, so no lane writes what another reads in the same
 *     step; the barrier orders a step's writes before the next step's reads;
 *   - the root for the next start is computed by every lane from the root's children (min of their keys and
 *     the new entry's: what the starting lane writes to node 0) instead of read after the step, and the
 *     search for the next candidate and its broadcast run between the last step's loads and their use;
 *   - warp-uniform choices (a start or none, the root, the window's offset) are selects, not branches: the
 *     loop's back edge and a window's move are its only branches.
 * The heap's keys must be below HEAP_PAD_KEY (torch_key's are: KEY_NAN is 0xFFFFFFFE); c[0, tot) are the
 * candidates, each replacing the root when it is before it at its turn. */
#define HEAP_PAD_KEY 0xFFFFFFFFu
#define HEAP_PAD_N(k) ((k) + 3)  /* pads after a heap of k entries: nodes k … 2k + 2 */
#define HEAP_SPAN(k) (2 * (k) + 3) /* the heap and its pads, in entries */

static __device__ __forceinline__ void heap_pad_load(const telem *f, int node, telem &L, telem &R) {
    const int l = 2 * node + 1;
    L = f[l], R = f[l + 1];
}

/* the rest of a step from its children's entries: the smaller child (the right one on a tie) moves up when
 * it is not after the lane's entry, else the entry is placed and the lane parks; returns the key written */
static __device__ __forceinline__ uint32_t heap_pad_finish(telem *f, int k, int &node, uint32_t vk, int32_t vi,
                                                           const telem &L, const telem &R) {
    const uint32_t lk = __float_as_uint(L.v), rk = __float_as_uint(R.v);
    const bool right = rk <= lk, up = (right ? rk : lk) <= vk;
    const uint32_t wk = up ? (right ? rk : lk) : vk;
    const int32_t wi = up ? (right ? R.i : L.i) : vi;
    if (node < k) f[node] = telem{__uint_as_float(wk), wi};
    node = up ? 2 * node + 1 + (int)right : k;
    __syncwarp();
    return wk;
}

/* heap_pipe_padded's candidates: the window c[base, base + 32), one entry per lane (wc), and the next one (wn,
 * loaded ahead); the next test from base + off. Key 0 past the list: below every torch_key, never before a root. */
typedef struct heap_window {
    int base, off;
    telem wc, wn;
} heap_window;

/* the lane of the window holding the next candidate before rt (the window moved on as needed), −1 past the list;
 * the common case (a candidate in the window) is one vote, without a branch taken */
static __device__ __forceinline__ int heap_window_find(heap_window &w, const telem *c, int tot, int lane, uint32_t rt) {
    const unsigned full = 0xffffffffu;
    unsigned m = __ballot_sync(full, lane >= w.off && __float_as_uint(w.wc.v) > rt);
    while (!m && w.base + 32 < tot) {
        w.base += 32, w.off = 0, w.wc = w.wn;
        w.wn = w.base + 32 + lane < tot ? c[w.base + 32 + lane] : telem{0.0f, 0};
        m = __ballot_sync(full, __float_as_uint(w.wc.v) > rt);
    }
    return m ? __ffs(m) - 1 : -1;
}

template <int LAG = 2>
static __device__ void heap_pipe_padded(telem *f, int k, const telem *c, int tot) {
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    int node = k; /* this lane's replacement: its node (k: none) and entry */
    uint32_t vk = 0;
    int32_t vi = 0;
    heap_window w = {0, 0, lane < tot ? c[lane] : telem{0.0f, 0}, 32 + lane < tot ? c[32 + lane] : telem{0.0f, 0}};
    unsigned started = 0;
    uint32_t root = __float_as_uint(f[0].v);
    int b = heap_window_find(w, c, tot, lane, root);
    /* the next start's entry, on every lane (lane 0's window entry while there is none: never used) */
    uint32_t nk = (uint32_t)__shfl_sync(full, (int)__float_as_uint(w.wc.v), b < 0 ? 0 : b);
    int32_t ni = __shfl_sync(full, w.wc.i, b < 0 ? 0 : b);
    /* Each iteration starts the next replacement when there is one (go) and runs LAG steps; warp-uniform
     * values choose by selects, so the only branches are the loop's and a window's move. */
    for (;;) {
        const bool go = b >= 0;
        const bool mine = go && lane == (int)(started & 31);
        node = mine ? 0 : node, vk = mine ? nk : vk, vi = mine ? ni : vi;
        telem L, R;
        heap_pad_load(f, node, L, R);
        /* the root after this step, from the root's children as the starting lane reads them */
        const telem A = f[1], B = f[2];
        const uint32_t ak = __float_as_uint(A.v), bk = __float_as_uint(B.v), ck = ak < bk ? ak : bk;
        root = go ? (ck < nk ? ck : nk) : root;
        started += go ? 1u : 0u, w.off = go ? b + 1 : w.off;
        heap_pad_finish(f, k, node, vk, vi, L, R);
#pragma unroll
        for (int s = 2; s < LAG; s++) {
            heap_pad_load(f, node, L, R);
            heap_pad_finish(f, k, node, vk, vi, L, R);
        }
        if (LAG >= 2) heap_pad_load(f, node, L, R);
        b = heap_window_find(w, c, tot, lane, root); /* past the list it stays −1 */
        nk = (uint32_t)__shfl_sync(full, (int)__float_as_uint(w.wc.v), b < 0 ? 0 : b);
        ni = __shfl_sync(full, w.wc.i, b < 0 ? 0 : b);
        if (LAG >= 2) heap_pad_finish(f, k, node, vk, vi, L, R);
        if (b < 0 && !__any_sync(full, node < k)) break;
    }
    __syncwarp();
}

#endif
