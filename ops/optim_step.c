/* Optimiser arithmetic dispatched by device; see optim_step.h. */
#include "ops/optim_step.h"

#include "kernels/cpu/optim.h"
#ifdef DG_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/nn_cuda.h"
#endif

#include <stdlib.h>

#ifndef DG_HAVE_CUDA
static int no_cuda(const char *who) {
    dg_error("%s: this build has no CUDA backend", who);
    return -1;
}
#endif

int dg_adamw_update_(dg_tensor *p, const dg_tensor *g, dg_tensor *m, dg_tensor *v, const dg_adamw_coefs *c) {
    const dg_tensor *all[4] = {p, g, m, v};
    for (int i = 0; i < 4; i++)
        if (all[i]->dtype != DG_F32 || !dg_is_contiguous(all[i]) || all[i]->device != p->device ||
            !dg_same_shape(all[i], p)) {
            dg_error("adamw_update: tensor %d is %s %s on %s; f32 contiguous tensors of the parameter's shape "
                     "%s on %s are required",
                     i, dg_dtype_name(all[i]->dtype), dg_shp(all[i]), dg_device_name(all[i]->device), dg_shp(p),
                     dg_device_name(p->device));
            return -1;
        }
    float *pp = dg_data_ptr(p), *mp = dg_data_ptr(m), *vp = dg_data_ptr(v);
    const float *gp = dg_data_ptr(g);
    int64_t n = dg_numel(p);
    if (p->device == DG_CUDA) {
#ifdef DG_HAVE_CUDA
        return dg_cuda_adamw_f32(n, pp, gp, mp, vp, c->shrink, c->step_size, c->bc2_sqrt, c->eps, c->b1, c->b2, c->c1,
                                 c->c2);
#else
        return no_cuda("adamw_update");
#endif
    }
    dg_cpu_adamw_f32(n, pp, gp, mp, vp, c->shrink, c->step_size, c->bc2_sqrt, c->eps, c->b1, c->b2, c->c1, c->c2);
    return 0;
}

/* the sums of squares of the device tensors among x, in their order, into dev[0 ..) */
static int device_sumsq(int n, const dg_tensor *const *x, int count, double *dev) {
#ifdef DG_HAVE_CUDA
    dg_dtype *dt = malloc(sizeof *dt * (size_t)count);
    int64_t *ne = malloc(sizeof *ne * (size_t)count);
    const void **p = malloc(sizeof *p * (size_t)count);
    int rc = -1;
    if (dt && ne && p) {
        int k = 0;
        for (int i = 0; i < n; i++)
            if (x[i] && x[i]->device == DG_CUDA)
                dt[k] = x[i]->dtype, ne[k] = dg_numel(x[i]), p[k++] = dg_data_ptr(x[i]);
        rc = dg_cuda_sumsq_many(count, dt, ne, p, dev);
    } else {
        dg_error("sumsq: out of host memory for %d device tensors", count);
    }
    free(dt), free(ne), free(p);
    return rc;
#else
    return no_cuda("sumsq");
#endif
}

int dg_sumsq_accumulate(int n, const dg_tensor *const *x, double *total) {
    int count = 0;
    for (int i = 0; i < n; i++) {
        if (!x[i]) continue;
        if ((x[i]->dtype != DG_F32 && x[i]->dtype != DG_F64) || !dg_is_contiguous(x[i])) {
            dg_error("sumsq: tensor %d is %s %s%s; contiguous f32 or f64 tensors are summed", i,
                     dg_dtype_name(x[i]->dtype), dg_shp(x[i]), dg_is_contiguous(x[i]) ? "" : " (strided)");
            return -1;
        }
        count += x[i]->device == DG_CUDA;
    }
    double *dev = NULL;
    if (count) {
        dev = malloc(sizeof *dev * (size_t)count);
        if (!dev) {
            dg_error("sumsq: out of host memory for %d device tensors", count);
            return -1;
        }
        if (device_sumsq(n, x, count, dev)) {
            free(dev);
            return -1;
        }
    }
    double acc = *total;
    for (int i = 0, j = 0; i < n; i++) {
        if (!x[i]) continue;
        if (x[i]->device == DG_CUDA) acc += dev[j++];
        else if (x[i]->dtype == DG_F32) acc = dg_cpu_sumsq_f32(dg_numel(x[i]), dg_data_ptr(x[i]), acc);
        else acc = dg_cpu_sumsq_f64(dg_numel(x[i]), dg_data_ptr(x[i]), acc);
    }
    free(dev);
    *total = acc;
    return 0;
}

int dg_scale_(dg_tensor *x, double c) {
    if ((x->dtype != DG_F32 && x->dtype != DG_F64) || !dg_is_contiguous(x)) {
        dg_error("scale_: tensor %s %s%s; contiguous f32 or f64 tensors are scaled", dg_dtype_name(x->dtype), dg_shp(x),
                 dg_is_contiguous(x) ? "" : " (strided)");
        return -1;
    }
    if (x->device == DG_CUDA) {
#ifdef DG_HAVE_CUDA
        /* the same product as on the host: (float)c times x in f32, rounded once */
        double a = x->dtype == DG_F32 ? (double)(float)c : c;
        return dg_cuda_unary(x->dtype, DG_UN_MUL_SCALAR, dg_numel(x), dg_data_ptr(x), dg_data_ptr(x), a);
#else
        return no_cuda("scale_");
#endif
    }
    if (x->dtype == DG_F32) dg_cpu_scale_f32(dg_numel(x), dg_data_ptr(x), (float)c);
    else dg_cpu_scale_f64(dg_numel(x), dg_data_ptr(x), c);
    return 0;
}
