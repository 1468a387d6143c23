/* What core needs of a device backend: memory, transfers, and the three copies that core/copy.c
 * and core/storage.c run on device memory.  Declared here, in core, and defined by the CUDA
 * backend (kernels/cuda: runtime.cu, elementwise.cu) in a build with DG_HAVE_CUDA, where core
 * calls them only under that macro.  The backend includes this header, so the dependency between
 * the two folders points one way: kernels -> core.
 *
 * Every function returns 0 (or a pointer), or -1 (NULL) with dg_error set; none aborts.  Work is
 * queued on the backend's one stream; transfers to the host synchronise it. */
#ifndef DG_CORE_DEVICE_H
#define DG_CORE_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "deltagrad.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- memory (runtime.cu) ---- */
void *dg_cuda_malloc(size_t n);
void dg_cuda_free(void *p);
int dg_cuda_memcpy(void *dst, const void *src, size_t n, int kind); /* 0 h2d, 1 d2h, 2 d2d */
int dg_cuda_memset0(void *p, size_t n);
int dg_cuda_memset(void *p, int byte, size_t n); /* every byte of p[0..n) = byte */
int dg_cuda_device_count(void);
int dg_cuda_mem_info(size_t *free_bytes, size_t *total_bytes); /* the process's device */
int dg_cuda_synchronize(void); /* waits for the stream; reports a failure of queued work */

/* ---- copies on the device (elementwise.cu) ---- */
/* p[0..n) = value.  dt: f32, f64, bf16, f16, i32, i64. */
int dg_cuda_fill(dg_dtype dt, int64_t n, void *p, double value);

/* dst[idx . dst_stride] = src[idx . src_stride] over `shape` (ndim 0..6), elements of elem_size
 * bytes (1, 2, 4 or 8); dst_stride NULL means contiguous; src_stride NULL means contiguous.
 * dst must not overlap src. */
int dg_cuda_copy_strided(size_t elem_size, int ndim, const int64_t *shape, void *dst, const int64_t *dst_stride,
                         const void *src, const int64_t *src_stride);

/* dst[i] = (dst_dt) src[i] for n contiguous elements; f32, f64, bf16, f16, i32, i64 (bf16 and f16
 * round to nearest even, f16 once from f64 as core/f16.h; floats to integers truncate toward
 * zero). */
int dg_cuda_cast(int64_t n, dg_dtype dst_dt, void *dst, dg_dtype src_dt, const void *src);

#ifdef __cplusplus
}
#endif

#endif
