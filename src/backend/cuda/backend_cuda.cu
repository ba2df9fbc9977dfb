/* The CUDA backend object: device selection, the stream, the grown device workspace, and the di_backend
 * table filled with the kernels of cuda_quant.cu, cuda_gemm.cu, cuda_gemm_bf16.cu, cuda_elem.cu, cuda_mhc.cu,
 * cuda_select.cu / cuda_select_torch.cu and cuda_attn.cu, and the memory slots, cache row codecs and
 * stream mean of cuda_mem.cu. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_attn_fast.h"
#include "backend/cuda/cuda_fused.h"
#include "backend/cuda/cuda_gemm_wgmma.h"
#include "backend/cuda/cuda_gemm_bf16.h"
#include "backend/cuda/cuda_moe_grouped.h"
#include "backend/cuda/cuda_optime.h"

extern "C" int di_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
}

int di_cuda_workspace(const di_backend *be, size_t bytes, void **out, di_error *err) {
    di_cuda_impl *c = di_cuda_state(be);
    if (c->ws_bytes < bytes) {
        /* While the stream is recorded (cuda_graph.cu) nothing may wait for it or free memory it uses: the
         * growth is refused, the forward drops the recording and runs the pass op by op, which grows the
         * workspace here. (The synchronisation used to be attempted and refused, and ws was cleared without
         * the old block being freed: one leaked workspace per refused growth.) */
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(c->stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
            cudaGetLastError();
            return di_error_set(err, DI_ERR_UNSUPPORTED,
                                "cuda backend: workspace growth from %zu to %zu bytes while the stream is recorded",
                                c->ws_bytes, bytes);
        }
        /* ops already queued may still read the old buffer */
        cudaError_t e = cudaStreamSynchronize(c->stream);
        if (e == cudaSuccess && c->ws) e = cudaFree(c->ws);
        if (e != cudaSuccess) /* the old block is kept (and freed with the backend) */
            return di_error_set(err, DI_ERR_INTERNAL, "cuda backend: workspace growth to %zu bytes: %s", bytes,
                                cudaGetErrorString(e));
        c->ws = NULL, c->ws_bytes = 0;
        e = cudaMalloc(&c->ws, bytes);
        if (e == cudaErrorMemoryAllocation) {
            /* backend memory is a stream-ordered pool that keeps freed blocks (create below): hand
             * them back to the driver and try once more before calling it out of memory */
            cudaGetLastError();
            cudaMemPool_t pool;
            if (cudaDeviceGetDefaultMemPool(&pool, c->device) == cudaSuccess && cudaMemPoolTrimTo(pool, 0) == cudaSuccess)
                e = cudaMalloc(&c->ws, bytes);
        }
        if (e != cudaSuccess) {
            cudaGetLastError();
            c->ws = NULL;
            return di_error_set(err, DI_ERR_NOMEM, "cuda backend: %zu bytes of workspace: %s", bytes, cudaGetErrorString(e));
        }
        c->ws_bytes = bytes;
    }
    *out = c->ws;
    return DI_OK;
}

/* The CUDA runtime's current device is per host thread: a thread other than the one that created the
 * backend (the engine's executor worker, src/engine/executor.c) must select the backend's device before
 * its first CUDA call, or its launches go to device 0. The memory and graph entry points do it on a
 * thread's first call (cuda_thread.cuh); this is the explicit form, for a worker's start. Device 0 is the
 * only one di_backend_create picks today, so nothing ran on a wrong device before. */
extern "C" int di_backend_cuda_bind_thread(const di_backend *be, di_error *err) {
    cudaError_t e = cudaSetDevice(di_cuda_state(be)->device);
    if (e != cudaSuccess)
        return di_error_set(err, DI_ERR_INTERNAL, "cuda backend: select device %d on this thread: %s",
                            di_cuda_state(be)->device, cudaGetErrorString(e));
    return DI_OK;
}

extern "C" void *di_backend_cuda_stream(const di_backend *be) { return (void *)di_cuda_state(be)->stream; }

extern "C" int di_backend_cuda_sync(const di_backend *be, di_error *err) {
    cudaError_t e = cudaStreamSynchronize(di_cuda_state(be)->stream);
    if (e != cudaSuccess) return di_error_set(err, DI_ERR_INTERNAL, "cuda backend: %s", cudaGetErrorString(e));
    return DI_OK;
}

/* ---- the side lane (backend.h side_begin / side_end / side_join) ----
 * The side lane is a second stream with its own workspace: side_begin records fork_ev on the main stream
 * and makes the side stream wait for it, then swaps the lanes (c->stream, c->ws are always the lane ops
 * go to); side_end records join_ev on the side stream and swaps back; side_join makes the main stream wait
 * for join_ev. Under stream capture the same calls fork the recording into two branches and join them
 * (the documented event pattern), so a recorded pass keeps the overlap. While ops are timed
 * (cuda_optime.h) the side ops stay on the main stream, in issue order. DI_CUDA_SIDE=0 does the same
 * always. Checks only: DI_CUDA_SIDE=delay-side starts the side lane with a ~0.2 ms busy kernel, so the
 * main lane's ops issued before the join run first (a main op reading a side output, or overwriting a
 * side input, before the join gives different values); DI_CUDA_SIDE=delay-main puts that kernel on the
 * main stream just before the fork, so a side lane that did not wait for the main lane's earlier ops
 * would run ahead of them. */
static __global__ void side_delay_kernel(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

static void lane_swap(di_cuda_impl *c) {
    const di_cuda_lane cur = {c->stream, c->ws, c->ws_bytes};
    c->stream = c->parked.stream, c->ws = c->parked.ws, c->ws_bytes = c->parked.ws_bytes;
    c->parked = cur;
}

#define SIDE_DELAY_CYCLES 400000 /* ~0.2 ms at the H200's clock */

/* the lane protocol's step: c->lane must be `from` (0 before side_begin, 1 before side_end, 2 before
 * side_join); it moves on to the next step */
static int lane_step(di_cuda_impl *c, int from, const char *call, di_error *err) {
    if (c->lane != from)
        return di_error_set(err, DI_ERR_INTERNAL, "cuda backend: %s out of order (step %d)", call, c->lane);
    c->lane = (from + 1) % 3;
    return DI_OK;
}

static int lane_fail(const char *what, cudaError_t e, di_error *err) {
    cudaGetLastError();
    return di_error_set(err, DI_ERR_INTERNAL, "cuda backend: side lane: %s: %s", what, cudaGetErrorString(e));
}

static int di_cuda_side_begin(const di_backend *be, di_error *err) {
    di_cuda_impl *c = di_cuda_state(be);
    int rc = lane_step(c, 0, "side_begin", err);
    if (rc) return rc;
    c->forked = c->side_mode != 0 && !di_cuda_optime_on();
    if (!c->forked) return DI_OK;
    if (c->side_mode == 3) side_delay_kernel<<<1, 1, 0, c->stream>>>(SIDE_DELAY_CYCLES);
    cudaError_t e = cudaEventRecord(c->fork_ev, c->stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(c->parked.stream, c->fork_ev, 0);
    if (e != cudaSuccess) {
        c->forked = false;
        return lane_fail("fork", e, err);
    }
    lane_swap(c);
    c->forks++;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(c->stream, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusActive) c->forks_recorded++;
    cudaGetLastError();
    if (c->side_mode == 2) side_delay_kernel<<<1, 1, 0, c->stream>>>(SIDE_DELAY_CYCLES);
    return DI_OK;
}

static int di_cuda_side_end(const di_backend *be, di_error *err) {
    di_cuda_impl *c = di_cuda_state(be);
    int rc = lane_step(c, 1, "side_end", err);
    if (rc) return rc;
    if (!c->forked) return DI_OK;
    cudaError_t e = cudaEventRecord(c->join_ev, c->stream);
    lane_swap(c); /* back to the main lane whatever happened: the caller's later ops must not land on the side */
    if (e != cudaSuccess) {
        /* no event to join on: wait for the side ops here (the caller may free their buffers next); the
         * join then has nothing to order */
        cudaStreamSynchronize(c->parked.stream);
        c->forked = false;
        return lane_fail("end", e, err);
    }
    return DI_OK;
}

static int di_cuda_side_join(const di_backend *be, di_error *err) {
    di_cuda_impl *c = di_cuda_state(be);
    int rc = lane_step(c, 2, "side_join", err);
    if (rc) return rc;
    if (!c->forked) return DI_OK;
    c->forked = false;
    cudaError_t e = cudaStreamWaitEvent(c->stream, c->join_ev, 0);
    return e == cudaSuccess ? DI_OK : lane_fail("join", e, err);
}

extern "C" long di_backend_cuda_side_forks(const di_backend *be, long *recorded) {
    if (recorded) *recorded = di_cuda_state(be)->forks_recorded;
    return di_cuda_state(be)->forks;
}

extern "C" void di_cuda_rows_install(di_backend *be); /* cuda_rows.cu: batched cache rows */
extern "C" void di_cuda_index_seqs_install(di_backend *be); /* cuda_index_seqs.cu: batched index selection */
/* cuda_graph.cu (backend.h graph capture) */
extern "C" int di_cuda_graph_begin(const di_backend *be, di_error *err);
extern "C" int di_cuda_graph_end(const di_backend *be, void **exec, bool try_update, bool *replayed, di_error *err);
extern "C" void di_cuda_graph_free(const di_backend *be, void *exec);
extern "C" int di_cuda_host_pin(const di_backend *be, void *host, size_t bytes, di_error *err);
extern "C" void di_cuda_host_unpin(const di_backend *be, void *host);

extern "C" int di_backend_cuda_create(int device, di_backend **out, di_error *err) {
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess)
        return di_error_set(err, DI_ERR_UNSUPPORTED, "cuda backend: device %d: %s", device, cudaGetErrorString(e));
    if (prop.major != 9)
        return di_error_set(err, DI_ERR_UNSUPPORTED, "cuda backend: device %d (%s) is sm_%d%d, the kernels are built for sm_90a",
                            device, prop.name, prop.major, prop.minor);
    if ((e = cudaSetDevice(device)) != cudaSuccess)
        return di_error_set(err, DI_ERR_INTERNAL, "cuda backend: set device %d: %s", device, cudaGetErrorString(e));
    di_backend *be = (di_backend *)calloc(1, sizeof *be);
    di_cuda_impl *c = (di_cuda_impl *)calloc(1, sizeof *c);
    /* the main lane's stream at the device's highest priority, the side lane's at its lowest: a CTA of
     * the main lane's next kernel goes first where both wait for an SM (op by op at B 1 on the H200:
     * 0.435 against 0.450 ms per layer without the priorities, bench/NOTES-gpu.md session 22) */
    int prio_least = 0, prio_greatest = 0;
    if (cudaDeviceGetStreamPriorityRange(&prio_least, &prio_greatest) != cudaSuccess) {
        cudaGetLastError();
        prio_least = prio_greatest = 0;
    }
    if (!be || !c || cudaStreamCreateWithPriority(&c->stream, cudaStreamNonBlocking, prio_greatest) != cudaSuccess) {
        free(be), free(c);
        return di_error_set(err, DI_ERR_NOMEM, "cuda backend: state or stream");
    }
    if (cudaStreamCreateWithPriority(&c->parked.stream, cudaStreamNonBlocking, prio_least) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->fork_ev, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->join_ev, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        if (c->parked.stream) cudaStreamDestroy(c->parked.stream);
        if (c->fork_ev) cudaEventDestroy(c->fork_ev);
        cudaStreamDestroy(c->stream);
        free(be), free(c);
        return di_error_set(err, DI_ERR_NOMEM, "cuda backend: the side lane's stream or events");
    }
    const char *side = getenv("DI_CUDA_SIDE");
    c->side_mode = !side ? 1 : !strcmp(side, "0") ? 0 : !strcmp(side, "delay-side") ? 2 : !strcmp(side, "delay-main") ? 3 : 1;
    c->device = device;
    /* backend memory comes from the stream-ordered pool (cuda_mem.cu): keep freed blocks in the pool
     * instead of returning them to the driver at every synchronisation, so a pass's per-block scratch
     * is recycled without new driver allocations */
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
        uint64_t keep = UINT64_MAX;
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    cudaGetLastError();
    be->impl = c;
    be->name = "cuda";
    be->destroy = di_backend_cuda_destroy;
    be->host_memory = false;
    be->mem_alloc = di_cuda_mem_alloc;
    be->mem_free = di_cuda_mem_free;
    be->mem_upload = di_cuda_mem_upload;
    be->mem_download = di_cuda_mem_download;
    be->mem_copy = di_cuda_mem_copy;
    be->mem_set = di_cuda_mem_set;
    be->mem_map_host = di_cuda_mem_map_host;
    be->mem_unmap_host = di_cuda_mem_unmap_host;
    be->row_encode = di_cuda_row_encode;
    be->row_decode = di_cuda_row_decode;
    be->stream_mean = di_cuda_stream_mean;
    be->linear_fp8 = di_cuda_linear_fp8;
    be->linear_fp4 = di_cuda_linear_fp4;
    be->linear_bf16 = di_cuda_linear_bf16;
    be->linear_f32 = di_cuda_linear_f32;
    be->linear_grouped_bf16 = di_cuda_linear_grouped_bf16;
    /* bf16 / f32 GEMMs: cuda_gemm_bf16.cu's tiled (prefill) and K-streaming (decode) kernels, bit-identical
     * to the CPU like the first kernels; DI_CUDA_BF16=nofma runs them without the range-checked FMA fast
     * path, DI_CUDA_BF16=old keeps cuda_gemm.cu's first kernels. */
    const char *bf = getenv("DI_CUDA_BF16");
    if (!bf || strcmp(bf, "old")) {
        bool nofma = bf && !strcmp(bf, "nofma");
        be->linear_bf16 = nofma ? di_cuda_linear_bf16_v2_nofma : di_cuda_linear_bf16_v2;
        be->linear_f32 = nofma ? di_cuda_linear_f32_v2_nofma : di_cuda_linear_f32_v2;
        be->linear_grouped_bf16 = nofma ? di_cuda_linear_grouped_bf16_v2_nofma : di_cuda_linear_grouped_bf16_v2;
    }
    be->rmsnorm = di_cuda_rmsnorm;
    be->rope = di_cuda_rope;
    be->qdq_fp8 = di_cuda_qdq_fp8;
    be->qdq_fp4_e8m0 = di_cuda_qdq_fp4_e8m0;
    be->qdq_fp4_e4m3 = di_cuda_qdq_fp4_e4m3;
    be->embed = di_cuda_embed;
    be->hc_mixes = di_cuda_hc_mixes;
    be->hc_sinkhorn = di_cuda_hc_sinkhorn;
    be->hc_collapse = di_cuda_hc_collapse;
    be->hc_expand = di_cuda_hc_expand;
    be->compress_pool = di_cuda_compress_pool_stream;
    be->indexer_scores = di_cuda_indexer_scores;
    /* selections: the replay of torch's CPU tie order by default (the CPU backend's choice, so both
     * backends verify with the same bounds); DI_CUDA_TOPK=fast for the parallel kernels */
    const char *sel = getenv("DI_CUDA_TOPK");
    bool fast = sel && !strcmp(sel, "fast");
    be->candidate_mask = fast ? di_cuda_candidate_mask : di_cuda_candidate_mask_torch;
    be->topk = fast ? di_cuda_topk : di_cuda_topk_torch;
    be->sparse_attn = di_cuda_sparse_attn;
    /* Tensor-core kernels, opt-in with DI_CUDA_KERNELS=tensor: the wgmma + TMA FP8 / MXFP4 GEMMs and
     * the mma.sync sparse attention. Their 32-term block sums and QK/PV dot products run on the tensor
     * cores, whose accumulation is not the CPU's sequential f32 sum: about 2.6 % of FP8 GEMM outputs
     * and 0.2 % of attention outputs differ, nearly all by one bf16 ulp (measured and explained in
     * bench/NOTES-gpu.md; both stay batch invariant). The default keeps the exact kernels, which
     * verify bit for bit against the CPU. */
    const char *kern = getenv("DI_CUDA_KERNELS");
    if (kern && !strcmp(kern, "tensor")) {
        be->linear_fp8 = di_cuda_linear_fp8_wgmma;
        be->linear_fp4 = di_cuda_linear_fp4_wgmma;
        be->sparse_attn = di_cuda_sparse_attn_fast;
    }
    di_cuda_rows_install(be); /* after sparse_attn is chosen */
    be->router = di_cuda_router;
    be->swiglu = di_cuda_swiglu;
    be->gather_rows = di_cuda_gather_rows;
    be->scatter_add_rows = di_cuda_scatter_add_rows;
    be->moe_routed = di_cuda_moe_routed;
    /* prefill experts (cuda_moe_grouped.cu): the exact per-expert kernels with one ordered combine.
     * DI_CUDA_MOE_GROUPED=off leaves the slot empty, so the graph runs its per-expert loop of ops as before.
     * With DI_CUDA_KERNELS=tensor the slot stays empty unless DI_CUDA_MOE_GROUPED=wgmma: its tensor variant
     * failed its first H200 run (2026-11-30: a launch error on entry, bench/NOTES-gpu.md), so tensor runs
     * keep the per-expert wgmma loop that verify has checked. */
    const char *mg = getenv("DI_CUDA_MOE_GROUPED");
    const bool tensor = kern && !strcmp(kern, "tensor");
    if (!mg || strcmp(mg, "off")) {
        if (!tensor) be->moe_grouped = di_cuda_moe_grouped;
        else if (mg && !strcmp(mg, "wgmma")) be->moe_grouped = di_cuda_moe_grouped_wgmma;
    }
    be->f32_to_bf16 = di_cuda_f32_to_bf16;
    be->fill_f32 = di_cuda_fill_f32;
    be->engram_lookup = di_cuda_engram_lookup;
    be->engram_gate = di_cuda_engram_gate;
    be->hc_pre = di_cuda_hc_pre;
    be->gather_topk = di_cuda_gather_topk;
    di_cuda_index_seqs_install(be); /* after the scorer, the selections and gather_topk are chosen */
    be->graph_begin = di_cuda_graph_begin;
    be->graph_end = di_cuda_graph_end;
    be->side_begin = di_cuda_side_begin;
    be->side_end = di_cuda_side_end;
    be->side_join = di_cuda_side_join;
    be->graph_free = di_cuda_graph_free;
    be->host_pin = di_cuda_host_pin;
    be->host_unpin = di_cuda_host_unpin;
    *out = be;
    return DI_OK;
}

extern "C" void di_backend_cuda_destroy(di_backend *be) {
    if (!be) return;
    di_cuda_impl *c = di_cuda_state(be);
    if (c) {
        if (c->lane == 1 && c->forked) lane_swap(c); /* a pass that failed on the side lane: main again */
        cudaStreamSynchronize(c->stream);
        cudaStreamSynchronize(c->parked.stream);
        di_cuda_moe_grouped_release(be);
        cudaFree(c->ws);
        cudaFree(c->parked.ws);
        cudaStreamDestroy(c->stream);
        cudaStreamDestroy(c->parked.stream);
        cudaEventDestroy(c->fork_ev);
        cudaEventDestroy(c->join_ev);
        free(c);
    }
    free(be);
}
