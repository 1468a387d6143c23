/* SwiGLU on the device (the math of kernels/cpu/nn_swiglu_impl.h), n elements:
 *   y = silu(g) u = g sigmoid(g) u;   du = dy silu(g),   dg = dy u silu'(g),  silu' = s (1 + g (1 - s))
 * Storage S is float, double or bf16 (computed in f32, each output rounded once). */
#include "kernels/cuda/nn_util.h"

namespace {

template <typename S> __global__ void swiglu_fwd_kernel(int64_t n, const S *g, const S *u, S *y) {
    typedef nn_compute<S> C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        C gv = nn_ld(g, i);
        nn_st(y, i, gv / (C(1) + nn_exp(-gv)) * nn_ld(u, i));
    }
}

template <typename S> __global__ void swiglu_bwd_kernel(int64_t n, const S *g, const S *u, const S *dy, S *dg, S *du) {
    typedef nn_compute<S> C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        C gv = nn_ld(g, i), dyv = nn_ld(dy, i), s = nn_sigmoid(gv);
        if (du) nn_st(du, i, dyv * gv * s);
        if (dg) nn_st(dg, i, dyv * nn_ld(u, i) * s * (C(1) + gv * (C(1) - s)));
    }
}

template <typename S> void swiglu_fwd(unsigned grid, int64_t n, const void *g, const void *u, void *y) {
    swiglu_fwd_kernel<S><<<grid, kNnThreads, 0, dg_cuda_stream()>>>(n, (const S *)g, (const S *)u, (S *)y);
}

template <typename S>
void swiglu_bwd(unsigned grid, int64_t n, const void *g, const void *u, const void *dy, void *dg, void *du) {
    swiglu_bwd_kernel<S>
        <<<grid, kNnThreads, 0, dg_cuda_stream()>>>(n, (const S *)g, (const S *)u, (const S *)dy, (S *)dg, (S *)du);
}

} // namespace

extern "C" int dg_cuda_swiglu_fwd(dg_dtype dt, int64_t n, const void *g, const void *u, void *y) {
    if (!nn_float_or_bf16_dt("cuda swiglu", dt)) return -1;
    if (n <= 0) return 0;
    if (dg_cuda_init()) return -1;
    unsigned grid = dg_grid_for(n, kNnThreads);
    if (dt == DG_F32) swiglu_fwd<float>(grid, n, g, u, y);
    else if (dt == DG_F64) swiglu_fwd<double>(grid, n, g, u, y);
    else swiglu_fwd<__nv_bfloat16>(grid, n, g, u, y);
    return DG_LAUNCHED("swiglu fwd");
}

extern "C" int dg_cuda_swiglu_bwd(dg_dtype dt, int64_t n, const void *g, const void *u, const void *dy, void *dg,
                                  void *du) {
    if (!nn_float_or_bf16_dt("cuda swiglu bwd", dt)) return -1;
    if (n <= 0 || (!dg && !du)) return 0;
    if (dg_cuda_init()) return -1;
    unsigned grid = dg_grid_for(n, kNnThreads);
    if (dt == DG_F32) swiglu_bwd<float>(grid, n, g, u, dy, dg, du);
    else if (dt == DG_F64) swiglu_bwd<double>(grid, n, g, u, dy, dg, du);
    else swiglu_bwd<__nv_bfloat16>(grid, n, g, u, dy, dg, du);
    return DG_LAUNCHED("swiglu bwd");
}
