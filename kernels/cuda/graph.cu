/* CUDA graphs of the library's stream (core/device_graph.h): capture a stretch of work
 * once, replay it with one launch.
 *
 * A training step queues hundreds of small kernels; each costs the host a few microseconds to
 * launch, which for a small model is longer than the kernel itself.  Captured once and replayed,
 * the step is one launch: the GPU runs the kernels back to back.
 *
 * What a capture needs of the code between begin and end (the trainer's step satisfies it):
 *   - fixed device addresses for what lives across replays (parameters, gradients, optimiser state,
 *     the batch's device buffers, scalars written back); everything else is allocated and freed
 *     inside the capture (cudaMallocAsync / cudaFreeAsync become the graph's own allocation and
 *     free nodes, with addresses that stay the same at every replay);
 *   - no read of the device: a copy to the host or a wait is refused (runtime.cu) and the capture
 *     fails; index checks that would read back (embedding ids, cross-entropy targets) skip
 *     themselves during a capture, so the owner of the step checks those indices on the host before
 *     each replay;
 *   - host data uploaded during the capture is fixed at its values then (runtime.cu copies it to
 *     pinned memory the graph keeps): tables derived from shapes, never the batch.
 * DG_CUDA_SYNC=1 (a wait after every launch) refuses captures.
 * Mode cudaStreamCaptureModeRelaxed: calls that are not stream work (a kernel's attribute set on
 * first use, pinned allocations) stay allowed. */
#include "core/device_graph.h"
#include "kernels/cuda/capture.h"
#include "kernels/cuda/cuda_util.h"

#include <new>

struct dg_cuda_graph {
    cudaGraphExec_t exec;
    std::vector<void *> pins; /* pinned host copies its memcpy nodes read */
};

static void free_pins(std::vector<void *> &pins) {
    for (void *p : pins) cudaFreeHost(p);
    pins.clear();
}

extern "C" int dg_cuda_graph_begin(void) {
    if (dg_cuda_init()) return -1;
    if (dg_cuda_capturing()) {
        dg_error("cuda graph: a capture is already under way");
        return -1;
    }
    if (dg_cuda_sync_each_launch()) { /* DG_LAUNCHED would wait inside the capture */
        dg_error("cuda graph: DG_CUDA_SYNC=1 waits for the device after every launch, which a capture cannot do");
        return -1;
    }
    if (DG_CU(cudaStreamBeginCapture(dg_cuda_stream(), cudaStreamCaptureModeRelaxed))) return -1;
    dg_cuda_capture_mark(true);
    return 0;
}

extern "C" dg_cuda_graph *dg_cuda_graph_end(void) {
    if (!dg_cuda_capturing()) {
        dg_error("cuda graph: no capture is under way");
        return nullptr;
    }
    cudaGraph_t g = nullptr;
    cudaError_t e = cudaStreamEndCapture(dg_cuda_stream(), &g);
    dg_cuda_capture_mark(false);
    std::vector<void *> pins = dg_cuda_capture_take_pins();
    if (e != cudaSuccess || !g) {
        (void)cudaGetLastError(); /* an invalidated capture is not sticky: the context stays usable */
        if (g) cudaGraphDestroy(g);
        free_pins(pins);
        /* the failure inside the capture that broke it, when it was ours (dg_error) */
        char inner[400];
        snprintf(inner, sizeof inner, "%s", dg_last_error());
        dg_error_force("cuda graph: the capture failed: %s (%s)%s%s", cudaGetErrorName(e), cudaGetErrorString(e),
                       inner[0] ? "; inside it: " : "", inner);
        return nullptr;
    }
    cudaGraphExec_t exec = nullptr;
    e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g); /* the executable graph is independent of it */
    dg_cuda_graph *graph = e == cudaSuccess ? new (std::nothrow) dg_cuda_graph{exec, std::move(pins)} : nullptr;
    if (!graph) {
        (void)cudaGetLastError();
        if (exec) cudaGraphExecDestroy(exec);
        free_pins(pins);
        dg_error("cuda graph: cudaGraphInstantiate failed: %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
        return nullptr;
    }
    /* The graph's allocations come from the driver's graph memory, not from the stream's pool: the
     * blocks the pool keeps from the work before the capture (the eager steps' activations) go back
     * to the driver, so that the device does not hold a step's memory twice. */
    cudaMemPool_t pool;
    int dev = 0;
    if (DG_CU(cudaStreamSynchronize(dg_cuda_stream())) || DG_CU(cudaGetDevice(&dev)) ||
        DG_CU(cudaDeviceGetDefaultMemPool(&pool, dev)) || DG_CU(cudaMemPoolTrimTo(pool, 0))) {
        dg_cuda_graph_free(graph);
        return nullptr;
    }
    return graph;
}

extern "C" int dg_cuda_graph_launch(dg_cuda_graph *g) {
    if (!g) {
        dg_error("cuda graph: launch of a NULL graph");
        return -1;
    }
    if (DG_CU(cudaGraphLaunch(g->exec, dg_cuda_stream()))) return -1;
    return dg_cuda_sync_each_launch() ? dg_cuda_synchronize() : 0;
}

extern "C" void dg_cuda_graph_free(dg_cuda_graph *g) {
    if (!g) return;
    /* a replay may still be queued: the graph's memory is released once the stream has passed it */
    (void)cudaStreamSynchronize(dg_cuda_stream());
    cudaGraphExecDestroy(g->exec);
    free_pins(g->pins);
    delete g;
    int dev = 0; /* the graph's memory goes back to the driver, not kept for another graph */
    if (cudaGetDevice(&dev) == cudaSuccess) (void)cudaDeviceGraphMemTrim(dev);
    (void)cudaGetLastError();
}
