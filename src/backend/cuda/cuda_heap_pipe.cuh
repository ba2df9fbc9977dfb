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


#endif
