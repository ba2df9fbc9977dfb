/* Top-k and candidate blocks with the reference's own tie behaviour on the GPU: the replay of torch's CPU
 * selection (libstdc++ introselect / heap select with the comparator "x > y, NaN first") of
 * src/backend/cpu/graph_extra_topk.c, step for step, one thread per row. Equal scores are common (the
 * indexer's exact zeros, bf16 near-ties), and which of them the reference keeps is decided only by that
 * sequence of comparisons and swaps, so replaying it is the one way for the GPU to select the CPU
 * backend's (and the reference's) set on every row: the golden cases then verify with the CPU's bounds
 * and greedy decoding gives the CPU's tokens.
 *
 * Cost: the serial algorithm per row (O(n) expected, O(n log k) on the heap path) in device memory,
 * one thread per row; the rest of a row's work on its CTA. The top-k avoids it where it cannot matter: rows whose output the ties cannot
 * change (see topk_replay_rows_kernel) take the parallel kernel's result, and only the others are
 * replayed. The candidate mask replays every row (one layer per pass, a few thousand
 * blocks per row). The parallel kernels of cuda_select.cu alone (higher score, then lower position: a
 * documented divergence on ties) remain available with DI_CUDA_TOPK=fast (backend_cuda.cu). */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

typedef struct telem {
    float v;
    int32_t i;
} telem;

static __device__ __forceinline__ bool before(telem x, telem y) { return (isnan(x.v) && !isnan(y.v)) || x.v > y.v; }

static __device__ __forceinline__ void swap_e(telem *a, telem *b) {
    telem t = *a;
    *a = *b;
    *b = t;
}

static __device__ void push_heap(telem *f, int64_t hole, int64_t top, telem val) {
    int64_t parent = (hole - 1) / 2;
    while (hole > top && before(f[parent], val)) {
        f[hole] = f[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    f[hole] = val;
}

static __device__ void adjust_heap(telem *f, int64_t hole, int64_t len, telem val) {
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

static __device__ void make_heap(telem *f, int64_t len) {
    if (len < 2) return;
    for (int64_t parent = (len - 2) / 2;; parent--) {
        adjust_heap(f, parent, len, f[parent]);
        if (parent == 0) return;
    }
}

static __device__ void heap_select(telem *f, int64_t mid, int64_t len) {
    make_heap(f, mid);
    for (int64_t i = mid; i < len; i++)
        if (before(f[i], f[0])) {
            telem val = f[i];
            f[i] = f[0];
            adjust_heap(f, 0, mid, val);
        }
}

static __device__ void median_to_first(telem *r, telem *a, telem *b, telem *c) {
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

static __device__ telem *unguarded_partition(telem *first, telem *last, telem *pivot) {
    for (;;) {
        while (before(*first, *pivot)) first++;
        last--;
        while (before(*pivot, *last)) last--;
        if (!(first < last)) return first;
        swap_e(first, last);
        first++;
    }
}

static __device__ void insertion_sort(telem *first, telem *last) {
    if (first == last) return;
    for (telem *i = first + 1; i != last; i++) {
        telem val = *i;
        if (before(val, *first)) {
            for (telem *p = i; p != first; p--) *p = p[-1]; /* memmove(first + 1, first, i − first) */
            *first = val;
        } else {
            telem *j = i, *prev = i - 1;
            while (before(val, *prev)) *j = *prev, j = prev--;
            *j = val;
        }
    }
}

static __device__ int floor_log2(int64_t n) {
    int l = 0;
    while (n >>= 1) l++;
    return l;
}

static __device__ void nth_element(telem *first, telem *nth, telem *last) {
    int depth = 2 * floor_log2(last - first);
    while (last - first > 3) {
        if (depth == 0) {
            heap_select(first, nth - first + 1, last - first);
            swap_e(first, nth);
            return;
        }
        depth--;
        telem *mid = first + (last - first) / 2;
        median_to_first(first, first + 1, mid, last - 1);
        telem *cut = unguarded_partition(first + 1, last, first);
        if (cut <= nth)
            first = cut;
        else
            last = cut;
    }
    insertion_sort(first, last);
}

static __device__ void torch_cpu_topk(telem *q, int64_t n, int64_t k) {
    if (k * 64 <= n)
        heap_select(q, k, n);
    else
        nth_element(q, q + k - 1, q + n);
}

/* One CTA per row. The replay itself is serial (thread 0); what is not — filling the row, the candidate
 * blocks' maxima, sorting the kept positions, writing the mask — runs on all SEL_THREADS threads (one
 * thread per row did all of it: 0.68 ms per decode row for the 4K-context candidate mask on the H200,
 * 2026-11-30). The serial part works in shared memory, where a dependent load costs tens of cycles, not
 * the hundreds of a global one:
 *   - a row of at most SEL_SMEM_MAX bytes is copied there whole and the replay runs on it;
 *   - a longer row on the heap path (k·64 ≤ n: 65,536 indexer scores at a 64K context, 9 ms per row
 *     from global memory) keeps only the heap there and streams the rest through in chunks: the heap
 *     selection reads each later entry once, in order, and only the heap is written (the entries it
 *     swaps out of the heap are never read again: the output is the heap's set);
 *   - anything else (an introselect over a row longer than SEL_SMEM_MAX) replays in the global scratch.
 * Each thread computes the same values in the same order as the one-thread version; writes before a
 * barrier are visible to the CTA after it. */
#define SEL_THREADS 256
#define SEL_SMEM_MAX (192 * 1024) /* dynamic shared memory a replay may take */
#define SEL_CHUNK 2048            /* entries per streamed chunk of the heap path */

static bool g_sel_smem_raised = false;

/* the heap path with the heap in shared memory and the row streamed through: torch_cpu_topk(row, nk, k)
 * when k·64 ≤ nk, for the output's purpose (the set in f[0..k)). heap: k entries, buf: SEL_CHUNK. */
static __device__ void heap_select_streamed(const float *s, int64_t nk, int k, telem *heap, telem *buf) {
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) heap[j] = telem{s[j], (int32_t)j};
    __syncthreads();
    if (threadIdx.x == 0) make_heap(heap, k);
    for (int64_t c0 = k; c0 < nk; c0 += SEL_CHUNK) {
        const int64_t n = nk - c0 < SEL_CHUNK ? nk - c0 : SEL_CHUNK;
        __syncthreads(); /* thread 0 is done with the previous chunk */
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) buf[j] = telem{s[c0 + j], (int32_t)(c0 + j)};
        __syncthreads();
        if (threadIdx.x == 0)
            for (int64_t j = 0; j < n; j++)
                if (before(buf[j], heap[0])) adjust_heap(heap, 0, k, buf[j]);
    }
    __syncthreads();
}

/* rows r0 … r0+nr−1 (only those flagged in `only`, when given); q: [nr, nk] scratch (mode 0). grid: nr.
 * mode 0: replay in q; 1: the row in shared memory; 2: heap in shared memory, row streamed. */
__global__ void __launch_bounds__(SEL_THREADS) topk_torch_kernel(const float *scores, int64_t r0, int64_t nr,
                                                                 int64_t nk, const int32_t *vis, int k, int32_t offset,
                                                                 const uint8_t *only, telem *q, int mode, int32_t *out) {
    extern __shared__ telem sel_sm[];
    const int64_t rr = blockIdx.x, r = r0 + rr;
    if (only && !only[r]) return;
    telem *row = mode == 0 ? q + rr * nk : sel_sm;
    if (mode == 2) {
        heap_select_streamed(scores + r * nk, nk, k, sel_sm, sel_sm + k);
    } else {
        for (int64_t j = threadIdx.x; j < nk; j += blockDim.x) row[j] = telem{scores[r * nk + j], (int32_t)j};
        __syncthreads();
        if (threadIdx.x == 0) torch_cpu_topk(row, nk, k);
        __syncthreads();
    }
    /* the selected positions ascending (the reference sorts them; positions are distinct, so a position's
     * place is the count of smaller ones), then ≥ vis marked −1 */
    int32_t *o = out + r * k;
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        const int32_t v = row[j].i;
        int p = 0;
        for (int i = 0; i < k; i++) p += row[i].i < v;
        o[p] = v < vis[r] ? v + offset : -1;
    }
}

/* grid: nr; q: [nr, nb] scratch, kept: [nr, nb]; in_smem: the nb block entries in shared memory */
__global__ void __launch_bounds__(SEL_THREADS) cand_torch_kernel(const float *scores, int64_t r0, int64_t nr,
                                                                 int64_t nk, const int32_t *vis, int block, int64_t nb,
                                                                 int64_t keep, telem *q, int in_smem, uint8_t *kept,
                                                                 uint8_t *mask) {
    extern __shared__ telem sel_sm[];
    const int64_t rr = blockIdx.x, r = r0 + rr;
    const float *s = scores + r * nk;
    telem *row = in_smem ? sel_sm : q + rr * nb;
    uint8_t *kp = kept + rr * nb;
    const int64_t last = vis[r] > 0 ? (vis[r] - 1) / block : -1;
    for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) {
        float mx = -INFINITY;
        for (int64_t n = b * block; n < (b + 1) * block && n < nk; n++) mx = fmaxf(mx, s[n]);
        row[b] = telem{b == last ? INFINITY : mx, (int32_t)b};
        kp[b] = 0;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        torch_cpu_topk(row, nb, keep);
        for (int64_t j = 0; j < keep; j++)
            if (row[j].v > -INFINITY) kp[row[j].i] = 1;
    }
    __syncthreads();
    for (int64_t n = threadIdx.x; n < nk; n += blockDim.x) mask[r * nk + n] = kp[n / block];
}

static void sel_raise_smem(void) {
    if (g_sel_smem_raised) return;
    cudaFuncSetAttribute(topk_torch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SEL_SMEM_MAX);
    cudaFuncSetAttribute(cand_torch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SEL_SMEM_MAX);
    g_sel_smem_raised = true;
}

/* ---- which rows need the replay ----
 * The replay's choice matters only where it is ambiguous AND visible. With torch's order as an
 * unsigned key (NaN highest, all NaNs equal; then by value, −0 = +0), t the key of the k-th best entry
 * of the row, A = {key > t}, E = {key = t} and U = [0, vis): the selection is A plus some k − |A|
 * entries of E, and the output lists its positions in U ascending, then −1. That output is fixed
 * whenever the set is unique (|A| + |E| = k) or no entry of E lies in U: it is then Q = {j ∈ U :
 * key ≥ t}, ascending, −1 padded. The parallel kernel of cuda_select.cu (selectable = finite or +inf
 * entries in U, best first) outputs the same when Q holds no NaN and no −inf and it cannot pick more
 * than Q: |Q| = k, or no selectable entry of U is outside Q. Common cases it covers: a row without a
 * tie at the k-th score, and an early prompt row with fewer than k visible entries (the −inf ties lie
 * past vis). One block per row finds t by a 32-step bitwise search over the key counts. */
#define KEY_NAN 0xFFFFFFFFu
#define KEY_NEG_INF 0x007FFFFFu /* key of −inf */
#define CHECK_THREADS 256

static __device__ __forceinline__ uint32_t torch_key(float f) {
    if (isnan(f)) return KEY_NAN;
    uint32_t u = __float_as_uint(f == 0.0f ? 0.0f : f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static __device__ unsigned block_sum_u32(unsigned v, unsigned *sh) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads(); /* sh may still be read by the previous call */
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    unsigned t = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += sh[w];
    return t;
}

__global__ void __launch_bounds__(CHECK_THREADS) topk_replay_rows_kernel(const float *scores, int64_t nk,
                                                                          const int32_t *vis, int k, uint8_t *replay) {
    __shared__ unsigned sh[CHECK_THREADS / 32];
    const int64_t r = blockIdx.x;
    const float *s = scores + r * nk;
    uint32_t t = 0;
    for (int bit = 31; bit >= 0; bit--) {
        uint32_t cand = t | (1u << bit);
        unsigned c = 0;
        for (int64_t j = threadIdx.x; j < nk; j += CHECK_THREADS) c += torch_key(s[j]) >= cand;
        if (block_sum_u32(c, sh) >= (unsigned)k) t = cand;
    }
    int64_t v = vis[r];
    unsigned ge = 0, eq_u = 0, q = 0, q_bad = 0, low_sel = 0; /* |A ∪ E|, |E ∩ U|, |Q|, Q's NaN/−inf, U \ Q selectable */
    for (int64_t j = threadIdx.x; j < nk; j += CHECK_THREADS) {
        uint32_t key = torch_key(s[j]);
        bool in_u = j < v, sel = key != KEY_NAN && key > KEY_NEG_INF;
        ge += key >= t;
        eq_u += in_u && key == t;
        q += in_u && key >= t;
        q_bad += in_u && key >= t && !sel;
        low_sel += in_u && key < t && sel;
    }
    ge = block_sum_u32(ge, sh);
    eq_u = block_sum_u32(eq_u, sh);
    q = block_sum_u32(q, sh);
    q_bad = block_sum_u32(q_bad, sh);
    low_sel = block_sum_u32(low_sel, sh);
    bool fixed = ge == (unsigned)k || eq_u == 0;
    bool same = fixed && q_bad == 0 && (q == (unsigned)k || low_sel == 0);
    if (threadIdx.x == 0) replay[r] = !same;
}

/* Rows per launch so the scratch stays within 256 MiB (a long-context chunk is processed in slices). */
static int64_t rows_per_launch(int64_t m, int64_t per_row) {
    int64_t cap = ((int64_t)256 << 20) / (per_row > 0 ? per_row : 1);
    return cap < 1 ? 1 : cap < m ? cap : m;
}

extern "C" int di_cuda_topk_torch(const di_backend *be, const float *scores, int64_t m, int64_t nk, const int32_t *vis,
                                  int k, int32_t offset, int32_t *out, di_error *err) {
    if (m < 0 || nk < 0 || k < 0 || k > nk || nk > INT32_MAX)
        return di_error_set(err, DI_ERR_INVALID, "cuda topk: %lld rows, k = %d of %lld entries", (long long)m, k,
                            (long long)nk);
    if (m == 0 || k == 0) return DI_OK;
    /* rows with a unique, finite, visible top-k set: the parallel kernel gives the replay's answer */
    bool hybrid = offset >= 0;
    int rc = hybrid ? di_cuda_topk(be, scores, m, nk, vis, k, offset, out, err) : DI_OK;
    if (rc) return rc;
    int64_t flags = hybrid ? (m + 255) / 256 * 256 : 0; /* uint8 [m] rows to replay, then the scratch */
    int64_t per = (int64_t)sizeof(telem) * nk, rows = rows_per_launch(m, per);
    void *ws;
    if ((rc = di_cuda_workspace(be, (size_t)(flags + rows * per), &ws, err))) return rc;
    uint8_t *only = hybrid ? (uint8_t *)ws : NULL;
    telem *q = (telem *)((uint8_t *)ws + flags);
    cudaStream_t st = di_cuda_state(be)->stream;
    if (hybrid) {
        topk_replay_rows_kernel<<<(unsigned)m, CHECK_THREADS, 0, st>>>(scores, nk, vis, k, only);
        if ((rc = di_cuda_launched("topk (tie check)", err))) return rc;
    }
    sel_raise_smem();
    const size_t row_b = sizeof(telem) * (size_t)nk, heap_b = sizeof(telem) * ((size_t)k + SEL_CHUNK);
    const int mode = row_b <= SEL_SMEM_MAX ? 1 : (int64_t)k * 64 <= nk && heap_b <= SEL_SMEM_MAX ? 2 : 0;
    const size_t smem = mode == 1 ? row_b : mode == 2 ? heap_b : 0;
    for (int64_t r0 = 0; r0 < m; r0 += rows) {
        int64_t nr = m - r0 < rows ? m - r0 : rows;
        topk_torch_kernel<<<(unsigned)nr, SEL_THREADS, smem, st>>>(scores, r0, nr, nk, vis, k, offset, only, q, mode,
                                                                   out);
        if ((rc = di_cuda_launched("topk (torch replay)", err))) return rc;
    }
    return DI_OK;
}

extern "C" int di_cuda_candidate_mask_torch(const di_backend *be, const float *scores, int64_t m, int64_t nk,
                                            const int32_t *vis, int block, int topk_blocks, uint8_t *mask, float *ws,
                                            di_error *err) {
    (void)ws; /* per-row scratch comes from the backend workspace */
    if (m < 0 || nk < 0 || block < 1 || topk_blocks < 1)
        return di_error_set(err, DI_ERR_INVALID, "cuda candidate_mask: %lld rows, %lld entries, block %d, top %d blocks",
                            (long long)m, (long long)nk, block, topk_blocks);
    int64_t nb = (nk + block - 1) / block, keep = topk_blocks < nb ? topk_blocks : nb;
    if (m == 0 || nb == 0) return DI_OK;
    int64_t per = ((int64_t)sizeof(telem) + 1) * nb, rows = rows_per_launch(m, per);
    void *q;
    int rc = di_cuda_workspace(be, (size_t)(rows * per), &q, err);
    if (rc) return rc;
    cudaStream_t st = di_cuda_state(be)->stream;
    uint8_t *kept = (uint8_t *)q + rows * nb * (int64_t)sizeof(telem);
    sel_raise_smem();
    const size_t row_b = sizeof(telem) * (size_t)nb;
    const int in_smem = row_b <= SEL_SMEM_MAX;
    for (int64_t r0 = 0; r0 < m; r0 += rows) {
        int64_t nr = m - r0 < rows ? m - r0 : rows;
        cand_torch_kernel<<<(unsigned)nr, SEL_THREADS, in_smem ? row_b : 0, st>>>(scores, r0, nr, nk, vis, block, nb, keep,
                                                                                   (telem *)q, in_smem, kept, mask);
        if ((rc = di_cuda_launched("candidate_mask (torch replay)", err))) return rc;
    }
    return DI_OK;
}
