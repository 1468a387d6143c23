/* The NCCL communicator of a data-parallel run (kernels/cuda/nccl_comm.h). */
#include "kernels/cuda/nccl_comm.h"

#include "kernels/cuda/cuda_util.h"

#include <cuda_bf16.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static_assert(sizeof(ncclUniqueId) == DG_NCCL_ID_BYTES, "DG_NCCL_ID_BYTES must be sizeof(ncclUniqueId)");

struct dg_nccl {
    ncclComm_t comm;                  /* NULL once aborted */
    cudaStream_t side;                /* the side stream (nccl_comm.h), made at init */
    cudaEvent_t to_side, to_lib;      /* the library's stream -> side stream, and back */
    double timeout_s;                 /* the longest wait for progress */
    cudaEvent_t marks[DG_NCCL_MARKS]; /* dg_nccl_mark's ring, made as first used */
    int64_t n_marks, n_passed;        /* marks recorded; marks seen passed by dg_nccl_wait */
    int world, rank;
    char failed[512]; /* why the communicator was aborted */
};

namespace {

void pause_briefly() {
    struct timespec ts = {0, 200 * 1000}; /* 0.2 ms: a poll costs little beside a step */
    nanosleep(&ts, nullptr);
}

/* Aborts c's communicator after a failure described by what, and records it for later calls. */
void abort_comm(dg_nccl *c, const char *what) {
    snprintf(c->failed, sizeof c->failed, "%s", what);
    if (c->comm) {
        ncclCommAbort(c->comm);
        c->comm = nullptr;
    }
    (void)cudaGetLastError(); /* the aborted kernels' error is not the caller's */
    dg_error("nccl: rank %d of %d: %s", c->rank, c->world, c->failed);
}

/* An NCCL call's result: ncclSuccess, or ncclInProgress (a non-blocking communicator: the call goes
 * on in the background), is fine; anything else fails the communicator. */
int check_call(dg_nccl *c, ncclResult_t r, const char *call) {
    if (r == ncclSuccess || r == ncclInProgress) return 0;
    char msg[480];
    const char *last = c->comm ? ncclGetLastError(c->comm) : nullptr;
    snprintf(msg, sizeof msg, "%s failed: %s%s%s", call, ncclGetErrorString(r), last && *last ? ": " : "",
             last ? last : "");
    abort_comm(c, msg);
    return -1;
}

/* Waits until the communicator has no call in progress (ncclCommGetAsyncError is ncclSuccess). */
int wait_calls(dg_nccl *c, const char *call) {
    double deadline = dg_now_s() + c->timeout_s;
    for (;;) {
        ncclResult_t st = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(c->comm, &st);
        if (r != ncclSuccess)
            return check_call(c, r == ncclInProgress ? ncclInternalError : r, "ncclCommGetAsyncError");
        if (st == ncclSuccess) return 0;
        if (st != ncclInProgress) return check_call(c, st, call);
        if (dg_now_s() > deadline) {
            char msg[480];
            snprintf(msg, sizeof msg,
                     "%s did not complete within %.0f s: another rank did not join or stopped (DG_DP_TIMEOUT sets "
                     "the limit)",
                     call, c->timeout_s);
            abort_comm(c, msg);
            return -1;
        }
        pause_briefly();
    }
}

int usable(dg_nccl *c) {
    if (!c) {
        dg_error("nccl: no communicator");
        return -1;
    }
    if (!c->comm) {
        dg_error("nccl: rank %d of %d: the communicator was aborted earlier: %s", c->rank, c->world, c->failed);
        return -1;
    }
    return 0;
}

/* A CUDA call on the communicator's streams: fails the communicator unless it succeeded. */
int cuda_ok(dg_nccl *c, cudaError_t e, const char *call) {
    if (e == cudaSuccess) return 0;
    char msg[480];
    snprintf(msg, sizeof msg, "%s failed: %s (%s)", call, cudaGetErrorName(e), cudaGetErrorString(e));
    abort_comm(c, msg);
    return -1;
}

/* buf[0..n) := the mean over the ranks, in place, queued on stream. */
int allreduce_mean_on(dg_nccl *c, void *buf, ncclDataType_t type, int64_t n, cudaStream_t stream) {
    if (n <= 0) return 0;
    if (!buf) {
        dg_error("nccl: all-reduce of a NULL buffer of %lld elements", (long long)n);
        return -1;
    }
    if (check_call(c, ncclAllReduce(buf, buf, (size_t)n, type, ncclAvg, c->comm, stream), "ncclAllReduce")) return -1;
    return wait_calls(c, "ncclAllReduce (enqueueing)");
}

/* The casts of the side stream's copies (grid-stride). */
__global__ void f32_to_bf16(__nv_bfloat16 *dst, const float *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}
__global__ void bf16_to_f32(float *dst, const __nv_bfloat16 *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}

/* Releases c's streams and events and c itself. */
void free_nccl(dg_nccl *c) {
    for (int i = 0; i < DG_NCCL_MARKS; i++)
        if (c->marks[i]) cudaEventDestroy(c->marks[i]);
    if (c->to_side) cudaEventDestroy(c->to_side);
    if (c->to_lib) cudaEventDestroy(c->to_lib);
    if (c->side) cudaStreamDestroy(c->side);
    free(c);
}

} // namespace

extern "C" {

int dg_nccl_unique_id(unsigned char id[DG_NCCL_ID_BYTES]) {
    ncclUniqueId uid;
    ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess) {
        dg_error("nccl: ncclGetUniqueId failed: %s", ncclGetErrorString(r));
        return -1;
    }
    memcpy(id, &uid, sizeof uid);
    return 0;
}

dg_nccl *dg_nccl_init(const unsigned char id[DG_NCCL_ID_BYTES], int world, int rank, double timeout_s) {
    if (world < 1 || rank < 0 || rank >= world || !(timeout_s > 0)) {
        dg_error("nccl: rank %d of a world of %d with a timeout of %g s: need 0 <= rank < world and a positive "
                 "timeout",
                 rank, world, timeout_s);
        return nullptr;
    }
    if (dg_cuda_init()) return nullptr; /* the device of this rank (DG_CUDA_DEVICE) is current from here on */
    /* NVLink SHARP (multicast) needs a fabric manager set up for it; off unless the user asked */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    dg_nccl *c = (dg_nccl *)calloc(1, sizeof *c);
    if (!c) {
        dg_error("nccl: out of host memory");
        return nullptr;
    }
    c->timeout_s = timeout_s;
    c->world = world;
    c->rank = rank;
    /* the side stream at the highest priority: a collective's kernels are scheduled ahead of the
     * backward's queued blocks, so the all-reduce is not left to the backward's tail (at 669M on
     * 4 H200 the lowest priority was as fast, within the runs' spread) */
    int lo_prio = 0, hi_prio = 0;
    cudaError_t ce = cudaDeviceGetStreamPriorityRange(&lo_prio, &hi_prio);
    if (ce == cudaSuccess) ce = cudaStreamCreateWithPriority(&c->side, cudaStreamNonBlocking, hi_prio);
    if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&c->to_side, cudaEventDisableTiming);
    if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&c->to_lib, cudaEventDisableTiming);
    if (ce != cudaSuccess) {
        dg_error("nccl: cannot make the side stream and its events: %s (%s)", cudaGetErrorName(ce),
                 cudaGetErrorString(ce));
        free_nccl(c);
        return nullptr;
    }
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof uid);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&c->comm, world, uid, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        /* a failed init may still have made a communicator to release */
        check_call(c, r, "ncclCommInitRankConfig");
        free_nccl(c);
        return nullptr;
    }
    if (wait_calls(c, "ncclCommInitRankConfig (every rank joining)")) {
        free_nccl(c);
        return nullptr;
    }
    return c;
}

int dg_nccl_side_begin(dg_nccl *c) {
    if (usable(c)) return -1;
    return cuda_ok(c, cudaEventRecord(c->to_side, dg_cuda_stream()), "cudaEventRecord") ||
                   cuda_ok(c, cudaStreamWaitEvent(c->side, c->to_side, 0), "cudaStreamWaitEvent")
               ? -1
               : 0;
}

int dg_nccl_side_copy(dg_nccl *c, void *dst, bool dst_bf16, const void *src, bool src_bf16, int64_t n) {
    if (usable(c)) return -1;
    if (n <= 0) return 0;
    const size_t bytes = (size_t)n * (dst_bf16 ? 2 : 4);
    if (!src) return cuda_ok(c, cudaMemsetAsync(dst, 0, bytes, c->side), "cudaMemsetAsync");
    if (dst_bf16 == src_bf16)
        return cuda_ok(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->side), "cudaMemcpyAsync");
    const unsigned blocks = (unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
    if (dst_bf16) f32_to_bf16<<<blocks, 256, 0, c->side>>>((__nv_bfloat16 *)dst, (const float *)src, n);
    else bf16_to_f32<<<blocks, 256, 0, c->side>>>((float *)dst, (const __nv_bfloat16 *)src, n);
    return cuda_ok(c, cudaGetLastError(), "a cast on the side stream");
}

int dg_nccl_side_allreduce_mean(dg_nccl *c, void *buf, bool bf16, int64_t n) {
    if (usable(c)) return -1;
    return allreduce_mean_on(c, buf, bf16 ? ncclBfloat16 : ncclFloat, n, c->side);
}

int dg_nccl_side_join(dg_nccl *c) {
    if (usable(c)) return -1;
    return cuda_ok(c, cudaEventRecord(c->to_lib, c->side), "cudaEventRecord") ||
                   cuda_ok(c, cudaStreamWaitEvent(dg_cuda_stream(), c->to_lib, 0), "cudaStreamWaitEvent")
               ? -1
               : 0;
}

int dg_nccl_mark(dg_nccl *c) {
    if (usable(c)) return -1;
    cudaEvent_t *ev = &c->marks[c->n_marks % DG_NCCL_MARKS];
    if (!*ev && cuda_ok(c, cudaEventCreateWithFlags(ev, cudaEventDisableTiming), "cudaEventCreateWithFlags")) return -1;
    if (cuda_ok(c, cudaEventRecord(*ev, dg_cuda_stream()), "cudaEventRecord")) return -1;
    c->n_marks++;
    return 0;
}

int dg_nccl_wait(dg_nccl *c) {
    if (usable(c)) return -1;
    double deadline = dg_now_s() + c->timeout_s;
    for (;;) {
        cudaError_t e = cudaStreamQuery(dg_cuda_stream());
        if (e == cudaSuccess) e = cudaStreamQuery(c->side);
        if (e == cudaSuccess) {
            c->n_passed = c->n_marks;
            return 0;
        }
        /* a mark passed since the last look is progress: the limit starts again (a mark's error
         * shows in the stream's query above) */
        while (c->n_passed < c->n_marks && cudaEventQuery(c->marks[c->n_passed % DG_NCCL_MARKS]) == cudaSuccess) {
            c->n_passed++;
            deadline = dg_now_s() + c->timeout_s;
        }
        if (e != cudaErrorNotReady) {
            char msg[480];
            snprintf(msg, sizeof msg, "the stream failed while waiting for a collective: %s (%s)", cudaGetErrorName(e),
                     cudaGetErrorString(e));
            abort_comm(c, msg);
            return -1;
        }
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(c->comm, &st) != ncclSuccess || (st != ncclSuccess && st != ncclInProgress))
            return check_call(c, st == ncclSuccess ? ncclInternalError : st, "a collective (asynchronous error)");
        if (dg_now_s() > deadline) {
            char msg[480];
            snprintf(msg, sizeof msg,
                     "the queued steps made no progress for %.0f s: another rank stopped or hangs in the gradient "
                     "all-reduce (DG_DP_TIMEOUT sets the limit)",
                     c->timeout_s);
            abort_comm(c, msg);
            return -1;
        }
        pause_briefly();
    }
}

void dg_nccl_destroy(dg_nccl *c) {
    if (!c) return;
    if (c->comm) {
        ncclResult_t r = ncclCommFinalize(c->comm);
        if (r != ncclSuccess && r != ncclInProgress) {
            ncclCommAbort(c->comm);
        } else if (wait_calls(c, "ncclCommFinalize") == 0) { /* wait_calls aborts on failure */
            ncclCommDestroy(c->comm);
        }
        c->comm = nullptr;
    }
    free_nccl(c);
}

} // extern "C"
