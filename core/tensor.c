/* Tensor headers: refcounts, geometry, creation, element access, printing. */
#include "core/internal.h"
#include "core/bf16.h"
#include "core/f16.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static _Atomic int64_t n_live_tensors;
size_t dg_live_tensors(void) { return (size_t)atomic_load(&n_live_tensors); }

/* set by autograd when it makes its first node; tensors without nodes never call it */
void (*dg_node_release_hook)(struct dg_node *) = NULL;

dg_tensor *dg_tensor_alloc_header(void) {
    dg_tensor *t = calloc(1, sizeof *t);
    if (!t) {
        dg_error("out of host memory allocating a tensor header");
        return NULL;
    }
    t->refcount = 1;
    atomic_fetch_add(&n_live_tensors, 1);
    return t;
}

dg_tensor *dg_retain(dg_tensor *t) {
    if (t) t->refcount++;
    return t;
}

void dg_release(dg_tensor *t) {
    if (!t || --t->refcount > 0) return;
    dg_storage_release(t->storage);
    dg_release(t->grad);
    if (t->node && dg_node_release_hook) dg_node_release_hook(t->node);
    free(t->name);
    free(t);
    atomic_fetch_sub(&n_live_tensors, 1);
}

void dg_set_name(dg_tensor *t, const char *name) {
    if (!t) return;
    free(t->name);
    t->name = name ? strdup(name) : NULL;
}

void dg_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride) {
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        stride[d] = s;
        s *= shape[d] > 0 ? shape[d] : 1;
    }
}

int64_t dg_numel(const dg_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

bool dg_is_contiguous(const dg_tensor *t) {
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->stride[d] != s) return false;
        s *= t->shape[d];
    }
    return true;
}

bool dg_same_shape(const dg_tensor *a, const dg_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

int dg_broadcast_shapes(int na, const int64_t *a, int nb, const int64_t *b, int *nout, int64_t *out) {
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int64_t da = i < n - na ? 1 : a[i - (n - na)];
        int64_t db = i < n - nb ? 1 : b[i - (n - nb)];
        if (da != db && da != 1 && db != 1) return -1;
        out[i] = da == 1 ? db : da;
    }
    *nout = n;
    return 0;
}

static bool valid_shape(const char *op, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > DG_MAX_DIMS) {
        dg_error("%s: ndim %d is outside 0..%d", op, ndim, DG_MAX_DIMS);
        return false;
    }
    for (int d = 0; d < ndim; d++)
        if (!shape || shape[d] < 0) {
            dg_error("%s: shape %s has a negative size", op, shape ? dg_shape_text(ndim, shape) : "(null)");
            return false;
        }
    return true;
}

/* A contiguous tensor on a new storage: cleared when zero, else uninitialised (the caller writes
 * every element before anything reads it). */
static dg_tensor *new_tensor(const char *op, int ndim, const int64_t *shape, dg_dtype dt, dg_device dev, bool zero) {
    if (!valid_shape(op, ndim, shape)) return NULL;
    if (dt >= DG_NUM_DTYPES) {
        dg_error("%s: unknown dtype %d", op, (int)dt);
        return NULL;
    }
    dg_tensor *t = dg_tensor_alloc_header();
    if (!t) return NULL;
    t->dtype = dt;
    t->device = dev;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
    dg_contiguous_strides(ndim, shape, t->stride);
    t->storage = dg_storage_new((size_t)dg_numel(t) * dg_dtype_size(dt), dev, zero);
    if (!t->storage) {
        atomic_fetch_sub(&n_live_tensors, 1);
        free(t);
        return NULL;
    }
    return dg_autorelease(t);
}

dg_tensor *dg_empty_on(int ndim, const int64_t *shape, dg_dtype dt, dg_device dev) {
    return new_tensor("empty", ndim, shape, dt, dev, false);
}
dg_tensor *dg_zeros_on(int ndim, const int64_t *shape, dg_dtype dt, dg_device dev) {
    return new_tensor("zeros", ndim, shape, dt, dev, true);
}
dg_tensor *dg_empty(int ndim, const int64_t *shape, dg_dtype dt) { return dg_empty_on(ndim, shape, dt, DG_CPU); }
dg_tensor *dg_zeros(int ndim, const int64_t *shape, dg_dtype dt) { return dg_zeros_on(ndim, shape, dt, DG_CPU); }
dg_tensor *dg_empty_like(const dg_tensor *t) { return t ? dg_empty_on(t->ndim, t->shape, t->dtype, t->device) : NULL; }
dg_tensor *dg_zeros_like(const dg_tensor *t) { return t ? dg_zeros_on(t->ndim, t->shape, t->dtype, t->device) : NULL; }

dg_tensor *dg_full(int ndim, const int64_t *shape, dg_dtype dt, double value) {
    dg_tensor *t = dg_empty(ndim, shape, dt);
    if (t) dg_fill_(t, value);
    return t;
}
dg_tensor *dg_ones(int ndim, const int64_t *shape, dg_dtype dt) { return dg_full(ndim, shape, dt, 1.0); }

dg_tensor *dg_arange(int64_t start, int64_t stop, int64_t step, dg_dtype dt) {
    if (step == 0) {
        dg_error("arange: step is 0");
        return NULL;
    }
    int64_t n = (stop - start + step + (step > 0 ? -1 : 1)) / step;
    if (n < 0) n = 0;
    dg_tensor *t = dg_empty(DG_SHAPE(n), dt);
    if (!t) return NULL;
    for (int64_t i = 0; i < n; i++) dg_set(t, (int64_t[]){i}, (double)(start + i * step));
    return t;
}

dg_tensor *dg_from_data(int ndim, const int64_t *shape, dg_dtype dt, const void *data) {
    dg_tensor *t = dg_empty(ndim, shape, dt);
    if (t && data) memcpy(t->storage->data, data, (size_t)dg_numel(t) * dg_dtype_size(dt));
    return t;
}

dg_tensor *dg_make_view(dg_tensor *t, int ndim, const int64_t *shape, const int64_t *stride, int64_t offset) {
    dg_tensor *v = dg_tensor_alloc_header();
    if (!v) return NULL;
    v->dtype = t->dtype;
    v->device = t->device;
    v->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        v->shape[d] = shape[d];
        v->stride[d] = stride[d];
    }
    v->offset = offset;
    v->storage = t->storage;
    t->storage->refcount++;
    return dg_autorelease(v);
}

dg_tensor *dg_detach(dg_tensor *t) {
    if (!t) return NULL;
    return dg_make_view(t, t->ndim, t->shape, t->stride, t->offset);
}

void *dg_elem_ptr(const dg_tensor *t, const int64_t *idx) {
    int64_t off = t->offset;
    for (int d = 0; d < t->ndim; d++) off += idx[d] * t->stride[d];
    return (char *)t->storage->data + off * (int64_t)dg_dtype_size(t->dtype);
}

void *dg_data_ptr(const dg_tensor *t) {
    return (char *)t->storage->data + t->offset * (int64_t)dg_dtype_size(t->dtype);
}

/* bf16: the top 16 bits of an f32, rounded to nearest even */
double dg_load_as_double(const void *p, dg_dtype dt) {
    switch (dt) {
    case DG_F32: return *(const float *)p;
    case DG_F64: return *(const double *)p;
    case DG_BF16: return dg_bf16_to_f32(*(const uint16_t *)p);
    case DG_F16: return dg_f16_to_f64(*(const uint16_t *)p);
    case DG_I32: return *(const int32_t *)p;
    case DG_I64: return (double)*(const int64_t *)p;
    default: return 0;
    }
}

void dg_store_double(void *p, dg_dtype dt, double v) {
    switch (dt) {
    case DG_F32: *(float *)p = (float)v; break;
    case DG_F64: *(double *)p = v; break;
    case DG_BF16: *(uint16_t *)p = dg_bf16_from_f32((float)v); break;
    case DG_F16: *(uint16_t *)p = dg_f16_from_f64(v); break; /* one rounding, from f64 */
    case DG_I32: *(int32_t *)p = (int32_t)v; break;
    case DG_I64: *(int64_t *)p = (int64_t)v; break;
    default: break;
    }
}

double dg_get(const dg_tensor *t, const int64_t *idx) { return dg_load_as_double(dg_elem_ptr(t, idx), t->dtype); }
void dg_set(dg_tensor *t, const int64_t *idx, double v) { dg_store_double(dg_elem_ptr(t, idx), t->dtype, v); }

double dg_item(const dg_tensor *t) {
    if (!t || dg_numel(t) != 1) {
        dg_error("item: tensor has shape %s, not one element", dg_shp(t));
        return NAN;
    }
    if (t->device != DG_CPU) {
        double v = NAN;
        dg_scope_begin();
        dg_tensor *h = dg_to_device((dg_tensor *)t, DG_CPU);
        if (h) v = dg_load_as_double(dg_data_ptr(h), h->dtype);
        dg_scope_end();
        return v;
    }
    return dg_load_as_double(dg_data_ptr(t), t->dtype);
}

/* Advances a multi-index over shape in row-major order; returns false after the last one. */
bool dg_next_index(int ndim, const int64_t *shape, int64_t *idx) {
    for (int d = ndim - 1; d >= 0; d--) {
        if (++idx[d] < shape[d]) return true;
        idx[d] = 0;
    }
    return false;
}

void dg_print(const dg_tensor *t, FILE *f) {
    if (!t) {
        fprintf(f, "tensor(null)\n");
        return;
    }
    fprintf(f, "tensor(%s, %s, %s%s) ", dg_shp(t), dg_dtype_name(t->dtype), dg_device_name(t->device),
            t->requires_grad ? ", requires_grad" : "");
    if (t->device != DG_CPU) {
        fprintf(f, "<on device>\n");
        return;
    }
    int64_t n = dg_numel(t), idx[DG_MAX_DIMS] = {0};
    if (n == 0) {
        fprintf(f, "[]\n");
        return;
    }
    int64_t shown = 0;
    for (int d = 0; d < t->ndim; d++) fputc('[', f);
    do {
        if (shown > 0) {
            int closes = 0;
            for (int d = t->ndim - 1; d >= 0 && idx[d] == 0; d--) closes++;
            if (closes) {
                for (int c = 0; c < closes; c++) fputc(']', f);
                fputs(",\n ", f);
                for (int c = 0; c < closes; c++) fputc('[', f);
            } else fputs(", ", f);
        }
        if (shown == 64) {
            fputs("...", f);
            break;
        }
        double v = dg_get(t, idx);
        if (dg_dtype_is_float(t->dtype)) fprintf(f, "%.6g", v);
        else fprintf(f, "%lld", (long long)v);
        shown++;
    } while (dg_next_index(t->ndim, t->shape, idx));
    for (int d = 0; d < t->ndim; d++) fputc(']', f);
    fputc('\n', f);
}
