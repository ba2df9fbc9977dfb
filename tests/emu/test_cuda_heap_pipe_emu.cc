/* The heap path's pipelined replacements (heap_pipe_warp, src/backend/cuda/cuda_heap_pipe.cuh: the GPU's
 * own source, compiled for the host with the fiber emulation of cuda_gemm_bf16_emu.h, one warp of 32
 * fibers meeting at every warp barrier and vote) against the serial libstdc++ steps of the same header
 * (make_heap_t, then adjust_heap_t from the root for every entry before the root): the k entries of the
 * heap, keys and positions, byte for byte. Heaps of 1 to 1,025 entries (odd and even: the node with one
 * child), keys from 2, 9 or 300 values (ties at every level), any 32-bit key, and rising keys (every
 * entry replaces the root: the pipeline always full). Control: the same pipeline starting a replacement
 * one step after the previous one (LAG 1, where it reads a level the previous one has not written yet)
 * must differ somewhere. Candidate lists through idx, without idx, and with gaps.
 * The streamed path's form (heap_pipe_padded: the heap followed by pad entries, one warp barrier per step,
 * the root from a register) on the same cases against the same serial steps, with its own LAG 1 control;
 * and make_heap_cta (one level of parents at a time on a CTA of 32, 96 or 256 threads) against make_heap_t.
 * Last line "N passed, N failed"; exit 1 on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "backend/cuda/cuda_gemm_bf16_emu.h"
#include "backend/cuda/cuda_heap_pipe.cuh"

static int n_pass, n_fail;
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* keys of a case: kind 0/1/2 from 2/9/300 values, 3 any 32-bit key, 4 rising with ties */
static uint32_t key_of(int kind, int j) {
    switch (kind) {
    case 0: return rnd32() % 2;
    case 1: return rnd32() % 9;
    case 2: return rnd32() % 300;
    case 3: return rnd32() % 0xFFFFFFFFu; /* any key below the pad key */
    default: return (uint32_t)(j / 3) + rnd32() % 2;
    }
}

/* One case: true when the pipeline's heap equals the serial one; *repl: the serial replacements. list: 0
 * every later entry a candidate through idx (as heap_scan_cta lists them), 1 the same without idx (the
 * candidates contiguous, as the streamed heap path lists them), 2 every third entry left out (a list
 * with gaps). */
static bool same_heap(int k, int n, int kind, int lag, int list, long *repl) {
    std::vector<telem> a((size_t)n), b;
    for (int j = 0; j < n; j++) a[(size_t)j] = telem{__uint_as_float(key_of(kind, j)), j};
    b = a;
    std::vector<int32_t> idx;
    for (int j = 0; j < n - k; j++)
        if (list != 2 || j % 3 != 1) idx.push_back(j);
    idx.push_back(0); /* never read: room past the end */
    const int tot = (int)idx.size() - 1;
    make_heap_t<true, int>(a.data(), k);
    for (int64_t i = 0; i < tot; i++) {
        const telem e = a[(size_t)(k + idx[(size_t)i])];
        if (hbefore<true>(e, a[0])) adjust_heap_t<true, int>(a.data(), 0, k, e), (*repl)++;
    }
    make_heap_t<true, int>(b.data(), k);
    telem *f = b.data();
    const telem *c = b.data() + k;
    const int32_t *ix = list == 1 ? NULL : idx.data();
    emu_launch(dim3(1), 32, [&] {
        if (lag == 2) heap_pipe_warp<2>(f, k, c, ix, tot);
        else heap_pipe_warp<1>(f, k, c, ix, tot);
    });
    return memcmp(a.data(), b.data(), sizeof(telem) * (size_t)k) == 0;
}

/* heap_pipe_padded on a case like same_heap's (the contiguous list of the streamed path: list 1; gaps: 2);
 * the candidates sit past the pads, as the streamed path keeps its lists */
static bool same_heap_padded(int k, int n, int kind, int lag, int list, long *repl) {
    std::vector<telem> a((size_t)n);
    for (int j = 0; j < n; j++) a[(size_t)j] = telem{__uint_as_float(key_of(kind, j)), j};
    std::vector<telem> cand;
    for (int j = k; j < n; j++)
        if (list != 2 || (j - k) % 3 != 1) cand.push_back(a[(size_t)j]);
    const int tot = (int)cand.size();
    std::vector<telem> b((size_t)(HEAP_SPAN(k) + tot + 32));
    for (int j = 0; j < k; j++) b[(size_t)j] = a[(size_t)j];
    for (int j = 0; j < HEAP_PAD_N(k); j++) b[(size_t)(k + j)] = telem{__uint_as_float(HEAP_PAD_KEY), -7};
    for (int j = 0; j < tot; j++) b[(size_t)(HEAP_SPAN(k) + j)] = cand[(size_t)j];
    make_heap_t<true, int>(a.data(), k);
    for (int i = 0; i < tot; i++)
        if (hbefore<true>(cand[(size_t)i], a[0])) adjust_heap_t<true, int>(a.data(), 0, k, cand[(size_t)i]), (*repl)++;
    make_heap_t<true, int>(b.data(), k);
    telem *f = b.data();
    const telem *c = b.data() + HEAP_SPAN(k);
    emu_launch(dim3(1), 32, [&] {
        if (lag == 2) heap_pipe_padded<2>(f, k, c, tot);
        else if (lag == 3) heap_pipe_padded<3>(f, k, c, tot);
        else heap_pipe_padded<1>(f, k, c, tot);
    });
    bool pads = true; /* the pads are never written */
    for (int j = 0; j < HEAP_PAD_N(k); j++)
        pads = pads && __float_as_uint(b[(size_t)(k + j)].v) == HEAP_PAD_KEY && b[(size_t)(k + j)].i == -7;
    return pads && memcmp(a.data(), b.data(), sizeof(telem) * (size_t)k) == 0;
}

/* make_heap_cta on `threads` threads against make_heap_t */
static bool same_make_heap(int len, int kind, int threads) {
    std::vector<telem> a((size_t)len);
    for (int j = 0; j < len; j++) a[(size_t)j] = telem{__uint_as_float(key_of(kind, j)), j};
    std::vector<telem> b = a;
    make_heap_t<true, int>(a.data(), len);
    telem *f = b.data();
    emu_launch(dim3(1), threads, [&] { make_heap_cta<true>(f, len); });
    return memcmp(a.data(), b.data(), sizeof(telem) * (size_t)len) == 0;
}

/* one form's check: every heap size of ks for every key kind at lags [lag_lo, lag_hi] against the serial steps,
 * list form list0 + t % nlists for the t-th size; one table row */
typedef bool (*heap_case)(int k, int n, int kind, int lag, int list, long *repl);
static void check_cases(const char *name, heap_case same, int lag_lo, int lag_hi, int list0, int nlists) {
    static const int ks[] = {1, 2, 3, 7, 8, 31, 32, 33, 100, 511, 512, 1024, 1025};
    long repl = 0, cases = 0;
    int bad = 0;
    for (int kind = 0; kind < 5; kind++)
        for (size_t t = 0; t < sizeof ks / sizeof *ks; t++)
            for (int lag = lag_lo; lag <= lag_hi; lag++) {
                const int k = ks[t], n = k + 1 + (int)(rnd32() % (kind == 4 ? 600 : 1500));
                bad += !same(k, n, kind, lag, list0 + (int)(t % (size_t)nlists), &repl);
                cases++;
            }
    printf("%-44s %ld cases, %ld replacements, %d heaps differ  %s\n", name, cases, repl, bad, bad ? "FAIL" : "PASS");
    bad ? n_fail++ : n_pass++;
}

/* the control: the same form starting a replacement one step after the previous one must differ somewhere */
static void check_control(const char *name, heap_case same, int list0, int nlists) {
    long repl = 0;
    int differ = 0;
    for (int i = 0; i < 12; i++) differ += !same(100 + 37 * i, 1500, i % 3, 1, list0 + i % nlists, &repl);
    printf("%-44s 12 cases, %d heaps differ (control: must be > 0)  %s\n", name, differ, differ ? "PASS" : "FAIL");
    differ ? n_pass++ : n_fail++;
}

int main(void) {
    check_cases("heap_pipe_warp (lag 2) vs serial", same_heap, 2, 2, 0, 3);
    check_control("control: lag 1", same_heap, 0, 2);
    check_cases("heap_pipe_padded (lag 2, 3) vs serial", same_heap_padded, 2, 3, 1, 2);
    check_control("control: heap_pipe_padded lag 1", same_heap_padded, 1, 2);
    static const int lens[] = {0, 1, 2, 3, 4, 7, 8, 31, 32, 33, 100, 511, 512, 513, 1024, 1025, 3000};
    static const int thr[] = {32, 96, 256};
    int badm = 0, cm = 0;
    for (int kind = 0; kind < 5; kind++)
        for (size_t t = 0; t < sizeof lens / sizeof *lens; t++) {
            badm += !same_make_heap(lens[t], kind, thr[(t + (size_t)kind) % 3]);
            cm++;
        }
    printf("%-44s %d cases, %d heaps differ  %s\n", "make_heap_cta vs make_heap_t", cm, badm, badm ? "FAIL" : "PASS");
    badm ? n_fail++ : n_pass++;
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
