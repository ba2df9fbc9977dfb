/* BENCH-ONLY per-op GPU time (cuda_optime.h): one generic wrapper per op slot, instantiated from the
 * slot's member pointer, so the op table in backend.h is not repeated here signature by signature. */
#include "backend/cuda/cuda_optime.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

extern "C" {
#include "util/error.h"
}

extern "C" void *di_backend_cuda_stream(const di_backend *be);

namespace {

struct rec {
    int tag, op;
    int64_t k, n, m;
    cudaEvent_t a, b;
};

struct state {
    bool on = false;
    int tag = -1;
    std::vector<const char *> names; /* op id -> slot name */
    std::vector<cudaEvent_t> pool;   /* events, reused after each collect */
    size_t used = 0;
    std::vector<rec> recs;
    bool failed = false; /* an event could not be created or recorded: collect reports it */
};
state g;

cudaEvent_t next_event() {
    if (g.used == g.pool.size()) {
        cudaEvent_t e;
        if (cudaEventCreate(&e) != cudaSuccess) {
            g.failed = true;
            return nullptr;
        }
        g.pool.push_back(e);
    }
    return g.pool[g.used++];
}

/* Where a slot's argument list (after be) holds the GEMM shape m, k, n (backend.h). */
enum shape_args { NO_SHAPE, QUANT_LINEAR /* x m k w ws n */, PLAIN_LINEAR /* x m k w n */, GROUPED /* x m g k w r */ };

template <int S, typename... A> void shape_of(int64_t *m, int64_t *k, int64_t *n, A... a) {
    auto t = std::forward_as_tuple(a...);
    *m = *k = *n = 0;
    if constexpr (S == QUANT_LINEAR) *m = std::get<1>(t), *k = std::get<2>(t), *n = std::get<5>(t);
    else if constexpr (S == PLAIN_LINEAR) *m = std::get<1>(t), *k = std::get<2>(t), *n = std::get<4>(t);
    else if constexpr (S == GROUPED) *m = std::get<1>(t), *k = std::get<3>(t), *n = std::get<5>(t);
}

/* The argument types come from the slot's type, the slot itself is the non-type parameter. */
template <typename T, T M, int S> struct wrap_slot;

template <typename... A, int (*di_backend::*M)(const di_backend *, A...), int S>
struct wrap_slot<int (*di_backend::*)(const di_backend *, A...), M, S> {
    static inline int (*orig)(const di_backend *, A...) = nullptr;
    static inline int id = -1;

    static int call(const di_backend *be, A... a) {
        if (!g.on) return orig(be, a...);
        cudaStream_t s = (cudaStream_t)di_backend_cuda_stream(be);
        rec r = {g.tag, id, 0, 0, 0, next_event(), nullptr};
        shape_of<S>(&r.m, &r.k, &r.n, a...);
        if (r.a && cudaEventRecord(r.a, s) != cudaSuccess) g.failed = true;
        int rc = orig(be, a...);
        r.b = next_event();
        if (r.b && cudaEventRecord(r.b, s) != cudaSuccess) g.failed = true;
        if (r.a && r.b) g.recs.push_back(r);
        return rc;
    }

    static void install(di_backend *be, const char *name) {
        if (!(be->*M) || (be->*M) == call) return;
        orig = be->*M;
        id = (int)g.names.size();
        g.names.push_back(name);
        be->*M = call;
    }
};

template <auto M, int S> using wrap = wrap_slot<decltype(M), M, S>;

} // namespace

#define DI_OPTIME_WRAP(slot) wrap<&di_backend::slot, NO_SHAPE>::install(be, #slot)
#define DI_OPTIME_WRAP_GEMM(slot, S) wrap<&di_backend::slot, S>::install(be, #slot)

extern "C" int di_cuda_optime_install(di_backend *be, di_error *err) {
    if (!be || strcmp(be->name, "cuda"))
        return di_error_set(err, DI_ERR_UNSUPPORTED, "op timing: backend '%s' (expected cuda)", be ? be->name : "none");
    DI_OPTIME_WRAP(mem_copy);
    DI_OPTIME_WRAP(mem_set);
    DI_OPTIME_WRAP(row_encode);
    DI_OPTIME_WRAP(row_decode);
    DI_OPTIME_WRAP(stream_mean);
    DI_OPTIME_WRAP_GEMM(linear_fp8, QUANT_LINEAR);
    DI_OPTIME_WRAP_GEMM(linear_fp4, QUANT_LINEAR);
    DI_OPTIME_WRAP_GEMM(linear_bf16, PLAIN_LINEAR);
    DI_OPTIME_WRAP_GEMM(linear_f32, PLAIN_LINEAR);
    DI_OPTIME_WRAP_GEMM(linear_grouped_bf16, GROUPED);
    DI_OPTIME_WRAP(rmsnorm);
    DI_OPTIME_WRAP(rope);
    DI_OPTIME_WRAP(qdq_fp8);
    DI_OPTIME_WRAP(qdq_fp4_e8m0);
    DI_OPTIME_WRAP(qdq_fp4_e4m3);
    DI_OPTIME_WRAP(embed);
    DI_OPTIME_WRAP(hc_mixes);
    DI_OPTIME_WRAP(hc_sinkhorn);
    DI_OPTIME_WRAP(hc_collapse);
    DI_OPTIME_WRAP(hc_expand);
    DI_OPTIME_WRAP(compress_pool);
    DI_OPTIME_WRAP(indexer_scores);
    DI_OPTIME_WRAP(candidate_mask);
    DI_OPTIME_WRAP(topk);
    DI_OPTIME_WRAP(sparse_attn);
    DI_OPTIME_WRAP(router);
    DI_OPTIME_WRAP(swiglu);
    DI_OPTIME_WRAP(gather_rows);
    DI_OPTIME_WRAP(scatter_add_rows);
    DI_OPTIME_WRAP(f32_to_bf16);
    DI_OPTIME_WRAP(fill_f32);
    DI_OPTIME_WRAP(engram_lookup);
    DI_OPTIME_WRAP(engram_gate);
    /* the optional slots added since (NULL ones are skipped) */
    DI_OPTIME_WRAP(hc_pre);
    DI_OPTIME_WRAP(gather_topk);
    DI_OPTIME_WRAP(moe_routed);
    DI_OPTIME_WRAP(moe_grouped);
    DI_OPTIME_WRAP(row_encode_scatter);
    DI_OPTIME_WRAP(row_decode_gather);
    DI_OPTIME_WRAP(compress_pool_ring);
    DI_OPTIME_WRAP(compress_pool_seqs);
    DI_OPTIME_WRAP(sparse_attn_seqs);
    DI_OPTIME_WRAP(indexer_scores_rows);
    DI_OPTIME_WRAP(candidate_mask_rows);
    DI_OPTIME_WRAP(topk_rows);
    DI_OPTIME_WRAP(gather_topk_seqs);
    return DI_OK;
}

extern "C" void di_cuda_optime_enable(int on) { g.on = on != 0; }
extern "C" bool di_cuda_optime_on(void) { return g.on; }
extern "C" void di_cuda_optime_tag(int tag) { g.tag = tag; }

extern "C" int di_cuda_optime_collect(di_optime_row **rows, int *n_rows, di_error *err) {
    *rows = NULL, *n_rows = 0;
    int rc = DI_OK;
    if (g.failed) rc = di_error_set(err, DI_ERR_INTERNAL, "op timing: a CUDA event could not be created or recorded");
    std::map<std::tuple<int, int, int64_t, int64_t>, di_optime_row> agg;
    for (size_t i = 0; i < g.recs.size() && rc == DI_OK; i++) {
        const rec &r = g.recs[i];
        float ms = 0;
        cudaError_t e = cudaEventSynchronize(r.b);
        if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, r.a, r.b);
        if (e != cudaSuccess) {
            rc = di_error_set(err, DI_ERR_INTERNAL, "op timing: %s: %s", g.names[r.op], cudaGetErrorString(e));
            break;
        }
        di_optime_row &o = agg[std::make_tuple(r.tag, r.op, r.k, r.n)];
        o.tag = r.tag, o.op = g.names[r.op], o.k = r.k, o.n = r.n;
        o.calls++, o.rows += r.m, o.ms += ms;
    }
    g.recs.clear();
    g.used = 0;
    g.failed = false;
    if (rc != DI_OK || agg.empty()) return rc;
    std::vector<di_optime_row> v;
    for (auto &kv : agg) v.push_back(kv.second);
    std::sort(v.begin(), v.end(), [](const di_optime_row &x, const di_optime_row &y) {
        return x.tag != y.tag ? x.tag < y.tag : x.ms > y.ms;
    });
    *rows = (di_optime_row *)malloc(sizeof(di_optime_row) * v.size());
    if (!*rows) return di_error_set(err, DI_ERR_NOMEM, "op timing: %zu rows", v.size());
    memcpy(*rows, v.data(), sizeof(di_optime_row) * v.size());
    *n_rows = (int)v.size();
    return DI_OK;
}

/* ---------------- marks (cuda_optime.h) ---------------- */

static cudaEvent_t g_mark[DI_CUDA_MARKS];

extern "C" int di_cuda_mark(const di_backend *be, int slot, di_error *err) {
    if (slot < 0 || slot >= DI_CUDA_MARKS) return di_error_set(err, DI_ERR_INVALID, "mark %d: out of range", slot);
    if (!be || strcmp(be->name, "cuda"))
        return di_error_set(err, DI_ERR_UNSUPPORTED, "mark: backend '%s' (expected cuda)", be ? be->name : "none");
    cudaStream_t st = (cudaStream_t)di_backend_cuda_stream(be);
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(st, &cap);
    if (e == cudaSuccess && !g_mark[slot]) e = cudaEventCreate(&g_mark[slot]);
    /* under stream capture the external flag makes the record a node of the graph (without it a record
     * only orders the capture and cannot be timed); outside a capture the flag is refused: a plain record */
    if (e == cudaSuccess)
        e = cudaEventRecordWithFlags(g_mark[slot], st,
                                     cap == cudaStreamCaptureStatusActive ? cudaEventRecordExternal : cudaEventRecordDefault);
    if (e != cudaSuccess) return di_error_set(err, DI_ERR_INTERNAL, "mark %d: %s", slot, cudaGetErrorString(e));
    return DI_OK;
}

extern "C" int di_cuda_mark_block(void *be, int L, bool after, di_error *err) {
    if (L < 0 || L >= DI_CUDA_MARK_BLOCKS) return DI_OK;
    return di_cuda_mark((const di_backend *)be, 2 * L + (after ? 1 : 0), err);
}

extern "C" int di_cuda_mark_ms(int a, int b, double *ms, di_error *err) {
    *ms = 0;
    if (a < 0 || a >= DI_CUDA_MARKS || b < 0 || b >= DI_CUDA_MARKS || !g_mark[a] || !g_mark[b])
        return di_error_set(err, DI_ERR_INVALID, "marks %d, %d: not recorded", a, b);
    float f = 0;
    cudaError_t e = cudaEventSynchronize(g_mark[b]);
    if (e == cudaSuccess) e = cudaEventElapsedTime(&f, g_mark[a], g_mark[b]);
    if (e != cudaSuccess) return di_error_set(err, DI_ERR_INTERNAL, "marks %d, %d: %s", a, b, cudaGetErrorString(e));
    *ms = f;
    return DI_OK;
}
