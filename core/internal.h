/* Internal helpers of the runtime shared by core/, autograd/, ops/ and models/ (not for users). */
#ifndef DG_CORE_INTERNAL_H
#define DG_CORE_INTERNAL_H

#include "deltagrad.h"
#include <stdarg.h>
#include <time.h>

/* ---- errors ---- */
/* Sets the thread-local message unless one is already set (the first error wins). */
void dg_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Overwrites whatever was set. */
void dg_error_force(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "deltagrad: note: TEXT" on stderr the first time this text comes (a slower path taken, said once
 * a process); true when it printed. */
bool dg_note_once(const char *text);
/* A shape as text in one of 8 rotating thread-local buffers, so several fit in one message. */
const char *dg_shp(const dg_tensor *t);
const char *dg_shape_text(int ndim, const int64_t *shape);

/* ---- time ---- */
/* Seconds on the monotonic clock (timing a span: the difference of two readings). */
static inline double dg_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- tensors ---- */
dg_tensor *dg_tensor_alloc_header(void); /* refcount 1, no storage */
/* refcount 1; zero-filled only when asked (else uninitialised, or 0xFF bytes under DG_DEBUG_FILL_NAN) */
dg_storage *dg_storage_new(size_t nbytes, dg_device dev, bool zero);
void dg_storage_release(dg_storage *s);
void dg_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride);
/* A view of t's storage with the given geometry; no autograd link; autoreleased. */
dg_tensor *dg_make_view(dg_tensor *t, int ndim, const int64_t *shape, const int64_t *stride, int64_t offset);
dg_tensor *dg_autorelease(dg_tensor *t); /* hands the caller's reference to the innermost scope */
/* Element pointer on the host for index idx. */
void *dg_elem_ptr(const dg_tensor *t, const int64_t *idx);
/* Broadcast two shapes (numpy rules); returns 0, or -1 if they do not broadcast. */
int dg_broadcast_shapes(int na, const int64_t *a, int nb, const int64_t *b, int *nout, int64_t *out);

/* ---- memory accounting (storage.c) ---- */
void dg_mem_account(dg_device d, int64_t delta);

/* ---- what core needs of the CUDA backend (defined in kernels/cuda when compiled with it) ---- */
#include "core/device.h"

/* ---- element loads and stores of any dtype (tensor.c) ---- */
double dg_load_as_double(const void *p, dg_dtype dt);
void dg_store_double(void *p, dg_dtype dt, double v);
bool dg_next_index(int ndim, const int64_t *shape, int64_t *idx);

extern void (*dg_node_release_hook)(struct dg_node *);

#endif
