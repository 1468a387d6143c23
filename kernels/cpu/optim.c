/* Optimiser kernels on host arrays; see optim.h. */
#include "kernels/cpu/optim.h"

#include <math.h>

void dg_cpu_adamw_f32(int64_t n, float *p, const float *g, float *m, float *v, float clip, float shrink,
                      float step_size, float bc2_sqrt, float eps, float b1, float b2, float c1, float c2) {
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
    for (int64_t j = 0; j < n; j++) {
        float gj = g[j] * clip; /* exact when clip is 1 */
        float mj = b1 * m[j] + c1 * gj;
        float vj = b2 * v[j] + c2 * gj * gj;
        m[j] = mj;
        v[j] = vj;
        p[j] = p[j] * shrink - step_size * mj / (sqrtf(vj) / bc2_sqrt + eps);
    }
}

double dg_cpu_sumsq_f32(int64_t n, const float *x, double acc) {
    for (int64_t j = 0; j < n; j++) acc += (double)x[j] * x[j];
    return acc;
}

double dg_cpu_sumsq_f64(int64_t n, const double *x, double acc) {
    for (int64_t j = 0; j < n; j++) acc += x[j] * x[j];
    return acc;
}

void dg_cpu_scale_f32(int64_t n, float *x, float c) {
    for (int64_t j = 0; j < n; j++) x[j] *= c;
}

void dg_cpu_scale_f64(int64_t n, double *x, double c) {
    for (int64_t j = 0; j < n; j++) x[j] *= c;
}
