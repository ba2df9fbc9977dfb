/* The calling host thread's current CUDA device. The runtime keeps it per thread and a new thread starts
 * on device 0: a thread other than the backend's creator — the engine's executor worker
 * (src/engine/executor.c) runs every pass on its own thread — must select the backend's device before
 * it allocates, copies or launches. The backend's memory and graph entry points (cuda_mem.cu,
 * cuda_graph.cu), through which every pass begins, select it on a thread's first call; a thread can also
 * do it explicitly with di_backend_cuda_bind_thread (backend_cuda.cu). Include after cuda_common.cuh. */
#ifndef DI_CUDA_THREAD_CUH
#define DI_CUDA_THREAD_CUH

/* One thread-local read per call once bound. cudaSetDevice only where the thread is on another device
 * (a query is all it costs on the usual device 0, also inside a stream capture); a refused selection is
 * retried on the next call, and the op that follows reports the runtime's error. */
static inline void di_cuda_bind_device(int device) {
    static thread_local int bound = -1; /* per translation unit and thread */
    if (bound == device) return;
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && (cur == device || cudaSetDevice(device) == cudaSuccess)) bound = device;
    else cudaGetLastError();
}

#endif
