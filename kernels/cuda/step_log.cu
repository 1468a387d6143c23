/* The per-step log ring's append on the device (ops/step_log.h). */
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_util.h"

namespace {

/* One thread: the record of the step whose work was queued before it.  %globaltimer is the GPU's
 * nanosecond clock (its resolution is about a microsecond), read when this kernel runs. */
__device__ __forceinline__ double value(const void *x, bool f64) {
    return !x ? 0.0 : f64 ? *(const double *)x : (double)*(const float *)x;
}

__global__ void step_log_put_kernel(double *ring, int64_t R, int64_t *count, const void *loss, bool loss_f64,
                                    const double *norm, const void *flag, bool flag_f64) {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    double *row = ring + 4 * (*count % R);
    row[0] = value(loss, loss_f64);
    row[1] = *norm;
    row[2] = 1e-9 * (double)ns;
    row[3] = value(flag, flag_f64);
    *count += 1;
}

} // namespace

extern "C" int dg_cuda_step_log_put(double *ring, int64_t R, int64_t *count, const void *loss, bool loss_f64,
                                    const double *norm, const void *flag, bool flag_f64) {
    if (R < 1) {
        dg_error("cuda step log: ring of %lld records; at least 1 is required", (long long)R);
        return -1;
    }
    if (dg_cuda_init()) return -1;
    step_log_put_kernel<<<1, 1, 0, dg_cuda_stream()>>>(ring, R, count, loss, loss_f64, norm, flag, flag_f64);
    return DG_LAUNCHED("step log put");
}
