/* The CUDA runtime under the tensors: one device, one stream, stream-ordered memory from the
 * device's default pool, and a cuBLAS handle.  The device is DG_CUDA_DEVICE when set (each process
 * of a data-parallel run has its own GPU), else 0.  Implements the hooks declared at the end of
 * core/internal.h and the runtime calls of kernels/cuda/cuda_kernels.h.
 *
 * Memory: cudaMallocAsync / cudaFreeAsync on the library's stream, from the device's default
 * memory pool with its release threshold set to the maximum, so freed blocks stay in the pool and
 * are reused instead of going back to the driver at every synchronisation (the pool is the
 * cache; there is no home-made one).
 *
 * Stream: one created stream with the default (blocking) flags.  All work of the library is
 * queued on it in order; being blocking, it also orders itself with the legacy default stream,
 * so a plain cudaMemcpy elsewhere (a test, a tool) sees finished results.  A created stream rather
 * than the legacy one so that benchmarks can capture it into a CUDA graph.
 *
 * Copies: device to host waits for the stream (the caller reads the result at once).  Host to
 * device does not: a copy of up to kStageBytes goes through a ring of pinned staging slots (the
 * source is copied into a slot on the host, then queued with cudaMemcpyAsync), so the caller may
 * reuse its buffer at once and the stream keeps running; a slot is reused only once the event
 * recorded behind its last copy has passed.  A larger copy waits for the stream as before.  So
 * the batch a training step uploads, and the small index tables the ops make on the host, cost
 * no round trip.
 *
 * Capture (graph.cu): while the stream is captured into a CUDA graph, a host-to-device copy goes
 * from a pinned buffer of its own that the graph keeps (a slot of the ring would be rewritten
 * before the graph replays), and a copy to the host or a wait for the stream is refused with a
 * message: inside a capture nothing runs, so there is nothing to read.
 *
 * Nothing here aborts: without a driver or a GPU, dg_cuda_device_count() is 0 and every other
 * call fails with a message.  Initialisation happens once; if it failed, its message is reported
 * again by every later call (dg_error is per thread). */
#include "kernels/cuda/capture.h"
#include "kernels/cuda/cuda_util.h"

#include <mutex>
#include <stdlib.h>
#include <string.h>

namespace {

constexpr int kStageSlots = 16;
constexpr size_t kStageBytes = (size_t)4 << 20;

struct StageSlot {
    void *host = nullptr; /* kStageBytes of pinned memory */
    cudaEvent_t done = nullptr;
    bool used = false; /* an event has been recorded behind a copy from it */
};

struct Runtime {
    int device_count = 0;
    int sm_count = 0;
    int ok = 0;           /* 1: stream and pool ready */
    char fail[512] = {0}; /* why initialisation failed */
    cudaStream_t stream = nullptr;
    bool sync_each = false;
    std::once_flag blas_once;
    cublasHandle_t blas = nullptr;
    char blas_fail[512] = {0};
    std::mutex stage_mu;
    StageSlot stage[kStageSlots];
    int stage_next = 0;
    bool stage_off = false;   /* pinned memory could not be had: every copy waits */
    bool capturing = false;   /* the stream is being captured (graph.cu) */
    std::vector<void *> pins; /* the capture's pinned copies of uploaded host memory */
};

Runtime &rt() {
    static Runtime r;
    return r;
}

std::once_flag g_count_once, g_init_once;

void count_devices() {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        /* cudaErrorNoDevice, cudaErrorInsufficientDriver (no driver at all), ...: no GPU here.
         * Clear the error so that it does not leak into a later cudaGetLastError. */
        (void)cudaGetLastError();
        n = 0;
        snprintf(rt().fail, sizeof rt().fail, "cuda: no usable CUDA device: cudaGetDeviceCount: %s (%s)",
                 cudaGetErrorName(e), cudaGetErrorString(e));
    } else if (n == 0) {
        snprintf(rt().fail, sizeof rt().fail, "cuda: no CUDA device is present");
    }
    rt().device_count = n;
}

/* Fills rt().fail with the failing call; returns -1.  Used only inside init (once). */
int init_fail(const char *what, cudaError_t e) {
    snprintf(rt().fail, sizeof rt().fail, "cuda: %s failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
    (void)cudaGetLastError();
    return -1;
}

int init_once() {
    std::call_once(g_count_once, count_devices);
    Runtime &r = rt();
    if (r.device_count == 0) return -1;
    const char *env = getenv("DG_CUDA_SYNC");
    r.sync_each = env && env[0] && strcmp(env, "0") != 0;
    /* the device: DG_CUDA_DEVICE (one process a GPU in data-parallel training), else 0 */
    int dev = 0;
    const char *dev_env = getenv("DG_CUDA_DEVICE");
    if (dev_env && dev_env[0]) {
        char *end;
        long d = strtol(dev_env, &end, 10);
        if (*end || d < 0 || d >= r.device_count) {
            snprintf(r.fail, sizeof r.fail, "cuda: DG_CUDA_DEVICE=%s names no device: %d CUDA device%s visible",
                     dev_env, r.device_count, r.device_count == 1 ? " is" : "s are");
            return -1;
        }
        dev = (int)d;
    }
    cudaError_t e;
    if ((e = cudaSetDevice(dev)) != cudaSuccess) return init_fail("cudaSetDevice", e);
    if ((e = cudaDeviceGetAttribute(&r.sm_count, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess)
        return init_fail("cudaDeviceGetAttribute(MultiProcessorCount)", e);
    int pools = 0;
    if ((e = cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev)) != cudaSuccess)
        return init_fail("cudaDeviceGetAttribute(MemoryPoolsSupported)", e);
    if (!pools) {
        snprintf(r.fail, sizeof r.fail,
                 "cuda: device %d does not support stream-ordered memory pools (cudaMallocAsync)", dev);
        return -1;
    }
    cudaMemPool_t pool;
    if ((e = cudaDeviceGetDefaultMemPool(&pool, dev)) != cudaSuccess)
        return init_fail("cudaDeviceGetDefaultMemPool", e);
    uint64_t threshold = UINT64_MAX;
    if ((e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold)) != cudaSuccess)
        return init_fail("cudaMemPoolSetAttribute(ReleaseThreshold)", e);
    if ((e = cudaStreamCreateWithFlags(&r.stream, cudaStreamDefault)) != cudaSuccess)
        return init_fail("cudaStreamCreateWithFlags", e);
    r.ok = 1;
    return 0;
}

void init_wrapper() { (void)init_once(); }

void create_blas() {
    Runtime &r = rt();
    cublasHandle_t h = nullptr;
    cublasStatus_t st = cublasCreate(&h);
    if (st != CUBLAS_STATUS_SUCCESS) {
        snprintf(r.blas_fail, sizeof r.blas_fail, "cublas: cublasCreate failed: %s (%s)", cublasGetStatusName(st),
                 cublasGetStatusString(st));
        return;
    }
    st = cublasSetStream(h, r.stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
        snprintf(r.blas_fail, sizeof r.blas_fail, "cublas: cublasSetStream failed: %s (%s)", cublasGetStatusName(st),
                 cublasGetStatusString(st));
        cublasDestroy(h);
        return;
    }
    r.blas = h;
}

/* Host waits for the device (a stream's or an event's synchronisation), counted for the op
 * profiler (dg_cuda_wait_stats) */
double g_wait_s;
int64_t g_waits;
template <typename H> cudaError_t counted(cudaError_t (*wait)(H), H handle) {
    double t0 = dg_now_s();
    cudaError_t e = wait(handle);
    g_wait_s += dg_now_s() - t0;
    g_waits++;
    return e;
}

} // namespace

extern "C" {

int dg_cuda_device_count(void) {
    std::call_once(g_count_once, count_devices);
    return rt().device_count;
}

int dg_cuda_init(void) {
    std::call_once(g_init_once, init_wrapper);
    if (rt().ok) return 0;
    dg_error("%s", rt().fail[0] ? rt().fail : "cuda: initialisation failed");
    return -1;
}

int dg_cuda_sm_count(void) { return dg_cuda_init() == 0 ? rt().sm_count : 0; }

cudaStream_t dg_cuda_stream(void) { return rt().ok ? rt().stream : nullptr; }

bool dg_cuda_sync_each_launch(void) { return rt().sync_each; }

cublasHandle_t dg_cuda_cublas(void) {
    if (dg_cuda_init()) return nullptr;
    std::call_once(rt().blas_once, create_blas);
    if (!rt().blas) dg_error("%s", rt().blas_fail);
    return rt().blas;
}

void dg_cuda_wait_stats(double *seconds, int64_t *count) {
    if (seconds) *seconds = g_wait_s;
    if (count) *count = g_waits;
}

int dg_cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
    if (dg_cuda_init()) return -1;
    return DG_CU(cudaMemGetInfo(free_bytes, total_bytes));
}

/* A wait for the device inside a capture: refused (the captured work has not run). */
static int refuse_in_capture(const char *what) {
    if (!rt().capturing) return 0;
    dg_error("cuda: %s while the stream is captured into a CUDA graph: a captured step cannot wait for the "
             "device or read from it",
             what);
    return -1;
}

int dg_cuda_synchronize(void) {
    if (dg_cuda_init() || refuse_in_capture("dg_cuda_synchronize")) return -1;
    return DG_CU(counted(cudaStreamSynchronize, rt().stream));
}

void *dg_cuda_malloc(size_t n) {
    if (dg_cuda_init()) return nullptr;
    void *p = nullptr;
    /* a 0-byte request still gets a distinct pointer, so that NULL always means failure */
    cudaError_t e = cudaMallocAsync(&p, n ? n : 1, rt().stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* out of memory is not sticky: the context stays usable */
        dg_error("cuda: cudaMallocAsync(%zu bytes) failed: %s (%s)", n, cudaGetErrorName(e), cudaGetErrorString(e));
        return nullptr;
    }
    return p;
}

void dg_cuda_free(void *p) {
    if (!p || !rt().ok) return;
    cudaError_t e = cudaFreeAsync(p, rt().stream);
    /* at process exit the runtime may already be gone; nothing is left to free then */
    if (e == cudaErrorCudartUnloading) return;
    dg_cu_report(e, "cudaFreeAsync(p, stream)", __FILE__, __LINE__);
}

/* A host-to-device copy inside a capture: from a pinned copy of src that lives as long as the
 * graph (the graph's memcpy node reads it at every replay). */
static int captured_h2d(void *dst, const void *src, size_t n) {
    void *pin = nullptr;
    DG_CU_TRY(cudaMallocHost(&pin, n));
    rt().pins.push_back(pin);
    memcpy(pin, src, n);
    return DG_CU(cudaMemcpyAsync(dst, pin, n, cudaMemcpyHostToDevice, rt().stream));
}

/* Queues a host-to-device copy of n <= kStageBytes through the next staging slot; 1 when it did,
 * 0 when the caller must copy synchronously (no pinned memory), -1 on a CUDA error. */
static int staged_h2d(void *dst, const void *src, size_t n) {
    Runtime &r = rt();
    std::lock_guard<std::mutex> lock(r.stage_mu);
    if (r.stage_off) return 0;
    StageSlot &s = r.stage[r.stage_next];
    if (!s.host) {
        if (cudaMallocHost(&s.host, kStageBytes) != cudaSuccess ||
            cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming) != cudaSuccess) {
            (void)cudaGetLastError();
            if (s.host) cudaFreeHost(s.host);
            s.host = nullptr;
            r.stage_off = true;
            return 0;
        }
    }
    if (s.used) DG_CU_TRY(counted(cudaEventSynchronize, s.done)); /* its previous copy has been read */
    memcpy(s.host, src, n);
    DG_CU_TRY(cudaMemcpyAsync(dst, s.host, n, cudaMemcpyHostToDevice, r.stream));
    DG_CU_TRY(cudaEventRecord(s.done, r.stream));
    s.used = true;
    r.stage_next = (r.stage_next + 1) % kStageSlots;
    return 1;
}

int dg_cuda_memcpy(void *dst, const void *src, size_t n, int kind) {
    if (n == 0) return 0;
    if (dg_cuda_init()) return -1;
    cudaMemcpyKind k;
    switch (kind) {
    case 0: k = cudaMemcpyHostToDevice; break;
    case 1: k = cudaMemcpyDeviceToHost; break;
    case 2: k = cudaMemcpyDeviceToDevice; break;
    default: dg_error("cuda: dg_cuda_memcpy: kind %d is not 0 (h2d), 1 (d2h) or 2 (d2d)", kind); return -1;
    }
    if (!dst || !src) {
        dg_error("cuda: dg_cuda_memcpy: NULL %s pointer", dst ? "source" : "destination");
        return -1;
    }
    if (kind == 0 && rt().capturing) return captured_h2d(dst, src, n);
    if (kind == 1 && refuse_in_capture("a copy from the device to the host")) return -1;
    if (kind == 0 && n <= kStageBytes) {
        int rc = staged_h2d(dst, src, n);
        if (rc != 0) return rc < 0 ? -1 : 0;
    }
    DG_CU_TRY(cudaMemcpyAsync(dst, src, n, k, rt().stream));
    /* host memory is involved: the caller may read dst or reuse src as soon as we return */
    if (kind != 2) DG_CU_TRY(counted(cudaStreamSynchronize, rt().stream));
    return 0;
}

int dg_cuda_memset(void *p, int byte, size_t n) {
    if (n == 0) return 0;
    if (dg_cuda_init()) return -1;
    return DG_CU(cudaMemsetAsync(p, byte, n, rt().stream));
}

int dg_cuda_memset0(void *p, size_t n) { return dg_cuda_memset(p, 0, n); }

} // extern "C"

/* ---- the capture's state (capture.h) ---- */

void dg_cuda_capture_mark(bool on) { rt().capturing = on; }

bool dg_cuda_capturing() { return rt().capturing; }

std::vector<void *> dg_cuda_capture_take_pins() {
    std::vector<void *> v;
    v.swap(rt().pins);
    return v;
}
