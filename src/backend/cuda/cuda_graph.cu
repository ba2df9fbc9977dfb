/* Graph capture of the backend's stream (backend.h graph_begin / graph_end / graph_free).
 *
 * The forward records a whole decode pass (forward.c fwd_backbone) and runs it as one graph launch:
 * the kernels then follow each other on the device without the per-launch gaps of op-by-op issue. Every
 * pass is recorded again (the ops' parameters — positions, list lengths, cache rows — change from step
 * to step); when the recording has the topology of the instantiated graph, cudaGraphExecUpdate moves the
 * new parameters into it, which is much cheaper than a new instantiation. The capture mode is
 * thread-local: a call that would synchronise from this thread (a download, a workspace growth) fails
 * and invalidates the recording, and graph_end reports it — the forward then runs the pass op by op. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

extern "C" int di_cuda_graph_begin(const di_backend *be, di_error *err) {
    cudaError_t e = cudaStreamBeginCapture(di_cuda_state(be)->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return di_error_set(err, DI_ERR_INTERNAL, "cuda graph: begin capture: %s", cudaGetErrorString(e));
    }
    return DI_OK;
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
    cudaGraphExec_t x = (cudaGraphExec_t)*exec;
    if (x && try_update) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(x, g, &info) == cudaSuccess)
            *replayed = true;
        else
            cudaGetLastError(); /* another topology: instantiate below */
    }
    if (!*replayed) {
        cudaGraphExec_t nx = NULL;
        e = cudaGraphInstantiate(&nx, g, 0);
        if (e != cudaSuccess) {
            cudaGetLastError();
            cudaGraphDestroy(g);
            return di_error_set(err, DI_ERR_INTERNAL, "cuda graph: instantiate: %s", cudaGetErrorString(e));
        }
        if (x) cudaGraphExecDestroy(x);
        *exec = x = nx;
    }
    cudaGraphDestroy(g);
    e = cudaGraphLaunch(x, st);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return di_error_set(err, DI_ERR_INTERNAL, "cuda graph: launch: %s", cudaGetErrorString(e));
    }
    return DI_OK;
}

extern "C" void di_cuda_graph_free(const di_backend *be, void *exec) {
    (void)be;
    if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}
