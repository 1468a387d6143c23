/* Internal to the .cu files of kernels/cuda (C++ only): the CUDA headers, the C declarations of
 * the runtime with C linkage, the library's stream and cuBLAS handle, and the checking macros.
 *
 * Checking: DG_CU(call) evaluates a CUDA runtime call; on failure it reports through dg_error
 * "cuda: <call text> failed: <error name> (<error string>) at file:line" and yields -1, else 0.
 * DG_CU_TRY(call) returns -1 from the enclosing function on failure.  DG_CUBLAS / DG_CUBLAS_TRY
 * do the same for cuBLAS.  DG_LAUNCHED(name) checks the launch just made (and, with DG_CUDA_SYNC=1,
 * waits for it, so that a fault at run time names its kernel). */
#ifndef DG_KERNELS_CUDA_UTIL_H
#define DG_KERNELS_CUDA_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#ifndef DG_HAVE_CUDA
#define DG_HAVE_CUDA 1 /* the C headers shared with ops test it (nn_dispatch.h) */
#endif

extern "C" {
#include "core/internal.h"
#include "kernels/cuda/cuda_kernels.h"

cudaStream_t dg_cuda_stream(void);   /* the library's one stream (after dg_cuda_init) */
cublasHandle_t dg_cuda_cublas(void); /* lazily created, bound to that stream; NULL + dg_error */
bool dg_cuda_sync_each_launch(void); /* DG_CUDA_SYNC=1 */
}

static inline int dg_cu_report(cudaError_t e, const char *what, const char *file, int line) {
    if (e == cudaSuccess) return 0;
    dg_error("cuda: %s failed: %s (%s) at %s:%d", what, cudaGetErrorName(e), cudaGetErrorString(e), file, line);
    return -1;
}

static inline int dg_cublas_report(cublasStatus_t st, const char *what, const char *file, int line) {
    if (st == CUBLAS_STATUS_SUCCESS) return 0;
    dg_error("cublas: %s failed: %s (%s) at %s:%d", what, cublasGetStatusName(st), cublasGetStatusString(st), file,
             line);
    return -1;
}

#define DG_CU(call) dg_cu_report((call), #call, __FILE__, __LINE__)
#define DG_CU_TRY(call)             \
    do {                            \
        if (DG_CU(call)) return -1; \
    } while (0)
#define DG_CUBLAS(call) dg_cublas_report((call), #call, __FILE__, __LINE__)
#define DG_CUBLAS_TRY(call)             \
    do {                                \
        if (DG_CUBLAS(call)) return -1; \
    } while (0)

static inline int dg_launched(const char *kernel, const char *file, int line) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && dg_cuda_sync_each_launch()) e = cudaStreamSynchronize(dg_cuda_stream());
    if (e == cudaSuccess) return 0;
    dg_error("cuda: kernel %s failed: %s (%s) at %s:%d", kernel, cudaGetErrorName(e), cudaGetErrorString(e), file,
             line);
    return -1;
}
#define DG_LAUNCHED(name) dg_launched((name), __FILE__, __LINE__)

/* Scratch from the pool: freed in stream order, so it may be released right after the launches
 * that use it are queued. */
template <typename T> static inline T *dg_cuda_scratch(size_t count) { return (T *)dg_cuda_malloc(count * sizeof(T)); }

/* Grid of 1-d launches over n items with a grid-stride loop. */
static inline unsigned dg_grid_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    int64_t cap = (int64_t)(dg_cuda_sm_count() > 0 ? dg_cuda_sm_count() : 1) * 32;
    if (b > cap) b = cap;
    return (unsigned)(b < 1 ? 1 : b);
}

#endif
