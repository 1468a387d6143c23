/* The per-step log ring (step_log.h): checks here, the append on the host or as one device
 * thread (kernels/cuda/step_log.cu). */
#include "ops/step_log.h"

#ifdef DG_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

static int bad(const char *arg, const dg_tensor *x, const char *want) {
    dg_error("step_log_put: %s is %s %s on %s; %s is required", arg, dg_dtype_name(x->dtype), dg_shp(x),
             dg_device_name(x->device), want);
    return -1;
}

/* one f32 or f64 element on dev */
static bool one_float(const dg_tensor *x, dg_device dev) {
    return (x->dtype == DG_F32 || x->dtype == DG_F64) && dg_numel(x) == 1 && x->device == dev;
}

static double host_value(const dg_tensor *x) {
    return !x ? 0.0 : x->dtype == DG_F64 ? *(const double *)dg_data_ptr(x) : (double)*(const float *)dg_data_ptr(x);
}

int dg_step_log_put_(dg_tensor *ring, dg_tensor *count, const dg_tensor *loss, const dg_tensor *norm,
                     const dg_tensor *flag) {
    if (!ring || !count || !loss || !norm) {
        dg_error("step_log_put: ring, count, loss and norm must all be given");
        return -1;
    }
    const dg_device dev = ring->device;
    if (ring->dtype != DG_F64 || ring->ndim != 2 || ring->shape[1] != 4 || ring->shape[0] < 1 ||
        !dg_is_contiguous(ring))
        return bad("ring", ring, "a contiguous f64 [R, 4] tensor, R >= 1");
    if (count->dtype != DG_I64 || dg_numel(count) != 1 || count->device != dev)
        return bad("count", count, "one i64 element on the ring's device");
    if (!one_float(loss, dev)) return bad("loss", loss, "one f32 or f64 element on the ring's device");
    if (flag && !one_float(flag, dev)) return bad("flag", flag, "one f32 or f64 element on the ring's device");
    if (norm->dtype != DG_F64 || dg_numel(norm) != 1 || norm->device != dev)
        return bad("norm", norm, "one f64 element on the ring's device");
    double *r = dg_data_ptr(ring);
    int64_t *c = dg_data_ptr(count);
    const double *nm = dg_data_ptr(norm);
    if (dev == DG_CUDA) {
#ifdef DG_HAVE_CUDA
        return dg_cuda_step_log_put(r, ring->shape[0], c, dg_data_ptr(loss), loss->dtype == DG_F64, nm,
                                    flag ? dg_data_ptr(flag) : NULL, flag && flag->dtype == DG_F64);
#else
        dg_error("step_log_put: this build has no CUDA backend");
        return -1;
#endif
    }
    double *row = r + 4 * (*c % ring->shape[0]);
    row[0] = host_value(loss);
    row[1] = *nm;
    row[2] = dg_now_s();
    row[3] = host_value(flag);
    ++*c;
    return 0;
}
