/* The heap selection's steps on the GPU (cuda_select.cuh's torch-order replay): libstdc++'s heap
 * functions step for step, and the pipelined form of the heap path's replacements (heap_pipe_warp,
 * DI_CUDA_HEAP=pipe). No CUDA runtime here: tests/emu/test_cuda_heap_pipe_emu.cc compiles it for the host
 * with the fiber emulation of cuda_gemm_bf16_emu.h and checks the pipeline against the serial steps. */
#ifndef DI_BACKEND_CUDA_CUDA_HEAP_PIPE_CUH
#define DI_BACKEND_CUDA_CUDA_HEAP_PIPE_CUH

#include <math.h>
#include <stdint.h>

typedef struct telem {
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

/* The pipelined replacements (DI_CUDA_HEAP=pipe; opt-in until checked on the GPU: cuda_select.cuh). A
 * replacement (adjust_heap from the root, then push_heap) leaves the heap as a sift-down that stops early
 * does: walking down the path of the children it moves up (at each node the right child unless it is
 * before the left one), it moves a child up while the child is not after the new entry and places the
 * entry where the child is after it (the push-up moves back exactly the children after the entry; below
 * them nothing changed). Such a walk writes level t only while it is at level t, so a later replacement
 * can start as soon as the earlier one is two levels down: each lane holds one replacement in flight, all
 * of them advance one level per step (reads, a warp barrier, writes), and a new one starts every second
 * step, tested against a root that is final by then. One step per level of the heap's height becomes two
 * steps per replacement. */
/* The serial loop of heap_scan_cta (candidates c[idx[0, tot)), each replacing the root when it is before
 * it at its turn) on the 32 lanes of one warp, all of them calling. LAG: steps between two starts (2: the
 * earlier replacement two levels down; the emulation test also runs 1, which must differ). */
template <int LAG = 2>
static __device__ void heap_pipe_warp(telem *f, int k, const telem *c, const int32_t *idx, int64_t tot) {
    const int lane = threadIdx.x & 31;
    int node = -1; /* this lane's replacement: the node holding its hole, −1 for none */
    telem val = {0.0f, 0};
    int64_t next = 0;   /* next candidate to test */
    unsigned started = 0; /* replacements started: number s runs on lane s mod 32 (free again long before) */
    int since = LAG;
    for (;;) {
        int wpos = -1, nnode = node; /* read phase: decide from the heap before this step */
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
        if (wpos >= 0) f[wpos] = wval; /* write phase: distinct nodes, two levels apart */
        node = nnode;
        __syncwarp();
        if (since >= LAG) {
            const telem root = f[0];
            while (next < tot) { /* the first of the next 32 candidates before the root starts */
                const int64_t j = next + lane;
                const unsigned m = __ballot_sync(0xffffffffu, j < tot && hbefore<true>(c[idx[j]], root));
                if (!m) {
                    next += 32;
                    continue;
                }
                const int b = __ffs(m) - 1;
                if (lane == (int)(started & 31)) node = 0, val = c[idx[next + b]];
                next += b + 1, started++, since = 0;
                break;
            }
        }
        since++;
        if (!__ballot_sync(0xffffffffu, node >= 0) && next >= tot) break;
    }
    __syncwarp();
}


#endif
