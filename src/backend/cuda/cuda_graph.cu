/* Graph capture of the backend's stream (backend.h graph_begin / graph_end / graph_free).
 *
 * The forward records a whole decode pass (forward.c fwd_backbone) and runs it as one graph launch:
 * the kernels then follow each other on the device without the per-launch gaps of op-by-op issue. Every
 * pass is recorded again (the ops' parameters — positions, list lengths, cache rows — change from step
 * to step); when the recording has the topology of the instantiated graph, cudaGraphExecUpdate moves the
 * new parameters into it, which is much cheaper than a new instantiation. The capture mode is
 * thread-local: a call that would synchronise from this thread (a download) fails and invalidates the
 * recording, a workspace growth is refused before it synchronises (backend_cuda.cu di_cuda_workspace), and
 * graph_end reports either — the forward then runs the pass op by op. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_thread.cuh"

#include <stdlib.h>

extern "C" int di_cuda_graph_begin(const di_backend *be, di_error *err) {
    di_cuda_bind_device(di_cuda_state(be)->device); /* the capture mode is per thread too */
    cudaError_t e = cudaStreamBeginCapture(di_cuda_state(be)->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return di_error_set(err, DI_ERR_INTERNAL, "cuda graph: begin capture: %s", cudaGetErrorString(e));
    }
    return DI_OK;
}

/* The instantiated graphs of one caller (*exec of graph_end): a few, one per topology. A decode pass
 * alternates between topologies as the context grows (a ratio-2 compressor emits an entry every other
 * step: a few more kernels), so the last instantiation of each is kept and updated in turn. */
enum { GRAPH_SLOTS = 4 };
typedef struct graph_set {
    struct {
        cudaGraphExec_t x;
        uint64_t sig;   /* topology: node count, node types and kernel functions in order */
        uint64_t used;  /* last use (LRU eviction) */
    } e[GRAPH_SLOTS];
    uint64_t tick;
} graph_set;

static uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ull; }

static bool pageable(const void *p) {
    cudaPointerAttributes a;
    bool r = p && cudaPointerGetAttributes(&a, p) == cudaSuccess && a.type == cudaMemoryTypeUnregistered;
    cudaGetLastError();
    return r;
}

/* *unsafe: a recorded copy reads or writes pageable host memory — the graph would touch it when it
 * runs, not when the op was issued, and the caller may have reused it by then. */
static uint64_t topology(cudaGraph_t g, bool *unsafe) {
    size_t n = 0;
    *unsafe = false;
    if (cudaGraphGetNodes(g, NULL, &n) != cudaSuccess) return 0;
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)malloc(sizeof *nodes * (n ? n : 1));
    uint64_t h = mix(0xcbf29ce484222325ull, n);
    if (nodes && cudaGraphGetNodes(g, nodes, &n) == cudaSuccess) {
        for (size_t i = 0; i < n; i++) {
            cudaGraphNodeType t;
            if (cudaGraphNodeGetType(nodes[i], &t) != cudaSuccess) continue;
            h = mix(h, (uint64_t)t);
            cudaKernelNodeParams kp;
            if (t == cudaGraphNodeTypeKernel && cudaGraphKernelNodeGetParams(nodes[i], &kp) == cudaSuccess)
                h = mix(h, (uint64_t)(uintptr_t)kp.func);
            cudaMemcpy3DParms mp;
            if (t == cudaGraphNodeTypeMemcpy && cudaGraphMemcpyNodeGetParams(nodes[i], &mp) == cudaSuccess &&
                (pageable(mp.srcPtr.ptr) || pageable(mp.dstPtr.ptr)))
                *unsafe = true;
        }
    }
    free(nodes);
    cudaGetLastError();
    return h;
}

extern "C" int di_cuda_graph_end(const di_backend *be, void **exec, bool try_update, bool *replayed, di_error *err) {
    cudaStream_t st = di_cuda_state(be)->stream;
    cudaGraph_t g = NULL;
    *replayed = false;
    cudaError_t e = cudaStreamEndCapture(st, &g); /* fails when an op invalidated the capture */
    if (e != cudaSuccess || !exec) {
        cudaGetLastError();
        if (g) cudaGraphDestroy(g);
        if (!exec) return DI_OK; /* an abandoned recording */
        return di_error_set(err, DI_ERR_UNSUPPORTED, "cuda graph: the pass could not be recorded: %s",
                            cudaGetErrorString(e));
    }
    graph_set *gs = (graph_set *)*exec;
    if (!gs && !(gs = (graph_set *)calloc(1, sizeof *gs))) {
        cudaGraphDestroy(g);
        return di_error_set(err, DI_ERR_NOMEM, "cuda graph: graph set");
    }
    *exec = gs;
    bool unsafe;
    uint64_t sig = topology(g, &unsafe);
    if (unsafe) {
        cudaGraphDestroy(g);
        return di_error_set(err, DI_ERR_UNSUPPORTED, "cuda graph: the pass copies from pageable host memory");
    }
    int slot = -1, lru = 0;
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        if (gs->e[i].x && gs->e[i].sig == sig) slot = i;
        if (gs->e[i].used < gs->e[lru].used) lru = i;
    }
    if (slot >= 0 && try_update) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(gs->e[slot].x, g, &info) == cudaSuccess)
            *replayed = true;
        else
            cudaGetLastError(); /* refused: instantiate below, in the same slot */
    }
    if (!*replayed) {
        if (slot < 0) slot = lru;
        cudaGraphExec_t nx = NULL;
        e = cudaGraphInstantiate(&nx, g, 0);
        if (e != cudaSuccess) {
            cudaGetLastError();
            cudaGraphDestroy(g);
            return di_error_set(err, DI_ERR_INTERNAL, "cuda graph: instantiate: %s", cudaGetErrorString(e));
        }
        if (gs->e[slot].x) cudaGraphExecDestroy(gs->e[slot].x);
        gs->e[slot].x = nx, gs->e[slot].sig = sig;
    }
    gs->e[slot].used = ++gs->tick;
    cudaGraphDestroy(g);
    e = cudaGraphLaunch(gs->e[slot].x, st);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return di_error_set(err, DI_ERR_INTERNAL, "cuda graph: launch: %s", cudaGetErrorString(e));
    }
    return DI_OK;
}

extern "C" void di_cuda_graph_free(const di_backend *be, void *exec) {
    graph_set *gs = (graph_set *)exec;
    if (!gs) return;
    cudaStreamSynchronize(di_cuda_state(be)->stream); /* a launched graph may still run */
    for (int i = 0; i < GRAPH_SLOTS; i++)
        if (gs->e[i].x) cudaGraphExecDestroy(gs->e[i].x);
    free(gs);
}

/* Page-locked upload staging (backend.h host_pin): registered, not mapped — the ops never read it
 * directly, only the uploads copy from it. */
extern "C" int di_cuda_host_pin(const di_backend *be, void *host, size_t bytes, di_error *err) {
    di_cuda_bind_device(di_cuda_state(be)->device);
    cudaError_t e = cudaHostRegister(host, bytes ? bytes : 1, cudaHostRegisterDefault);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return di_error_set(err, DI_ERR_INTERNAL, "cuda: cannot pin %zu bytes of upload staging: %s", bytes,
                            cudaGetErrorString(e));
    }
    return DI_OK;
}

extern "C" void di_cuda_host_unpin(const di_backend *be, void *host) {
    (void)be;
    if (host) cudaHostUnregister(host);
    cudaGetLastError();
}
