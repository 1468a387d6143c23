/* SwiGLU on the device (the math of kernels/cpu/nn_swiglu_impl.h), n elements:
 *   y = silu(g) u = g sigmoid(g) u;   du = dy silu(g),   dg = dy u silu'(g),  silu' = s (1 + g (1 - s)) */
#include "kernels/cuda/nn_util.h"

namespace {

template <typename T> __global__ void swiglu_fwd_kernel(int64_t n, const T *g, const T *u, T *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = g[i] / (T(1) + nn_exp(-g[i])) * u[i];
}

template <typename T> __global__ void swiglu_bwd_kernel(int64_t n, const T *g, const T *u, const T *dy, T *dg, T *du) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        T s = nn_sigmoid(g[i]);
        if (du) du[i] = dy[i] * g[i] * s;
        if (dg) dg[i] = dy[i] * u[i] * s * (T(1) + g[i] * (T(1) - s));
    }
}

} // namespace

extern "C" int dg_cuda_swiglu_fwd(dg_dtype dt, int64_t n, const void *g, const void *u, void *y) {
    if (!nn_float_dt("cuda swiglu", dt)) return -1;
    if (n <= 0) return 0;
    if (dg_cuda_init()) return -1;
    unsigned grid = dg_grid_for(n, kNnThreads);
    if (dt == DG_F32)
        swiglu_fwd_kernel<float>
            <<<grid, kNnThreads, 0, dg_cuda_stream()>>>(n, (const float *)g, (const float *)u, (float *)y);
    else
        swiglu_fwd_kernel<double>
            <<<grid, kNnThreads, 0, dg_cuda_stream()>>>(n, (const double *)g, (const double *)u, (double *)y);
    return DG_LAUNCHED("swiglu fwd");
}

extern "C" int dg_cuda_swiglu_bwd(dg_dtype dt, int64_t n, const void *g, const void *u, const void *dy, void *dg,
                                  void *du) {
    if (!nn_float_dt("cuda swiglu bwd", dt)) return -1;
    if (n <= 0 || (!dg && !du)) return 0;
    if (dg_cuda_init()) return -1;
    unsigned grid = dg_grid_for(n, kNnThreads);
    if (dt == DG_F32)
        swiglu_bwd_kernel<float><<<grid, kNnThreads, 0, dg_cuda_stream()>>>(
            n, (const float *)g, (const float *)u, (const float *)dy, (float *)dg, (float *)du);
    else
        swiglu_bwd_kernel<double><<<grid, kNnThreads, 0, dg_cuda_stream()>>>(
            n, (const double *)g, (const double *)u, (const double *)dy, (double *)dg, (double *)du);
    return DG_LAUNCHED("swiglu bwd");
}
