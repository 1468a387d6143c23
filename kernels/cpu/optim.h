/* Optimiser kernels on host arrays (optim.c): the AdamW update, sums of squares and scaling for
 * gradient clipping.  The CUDA forms are in kernels/cuda/nn_cuda.h; ops/optim_step.c picks one by
 * the tensors' device. */
#ifndef DG_KERNELS_CPU_OPTIM_H
#define DG_KERNELS_CPU_OPTIM_H

#include <stdint.h>

/* One AdamW update of n f32 elements with the gradient scaled by clip (1: the plain update; the
 * gradient array is not written).  Threads split the elements; each element's arithmetic is
 * fixed, so the result does not depend on the thread count and equals dg_cuda_adamw_f32's:
 *   g = g clip;  m = b1 m + c1 g;  v = b2 v + (c2 g) g;  p = p shrink - (step_size m) / (sqrt(v) / bc2_sqrt + eps) */
void dg_cpu_adamw_f32(int64_t n, float *p, const float *g, float *m, float *v, float clip, float shrink,
                      float step_size, float bc2_sqrt, float eps, float b1, float b2, float c1, float c2);

/* acc + x[0]^2 + x[1]^2 + ... added one element at a time in double, in element order. */
double dg_cpu_sumsq_f32(int64_t n, const float *x, double acc);
double dg_cpu_sumsq_f64(int64_t n, const double *x, double acc);

/* x[i] *= c for n elements. */
void dg_cpu_scale_f32(int64_t n, float *x, float c);
void dg_cpu_scale_f64(int64_t n, double *x, double c);

#endif
