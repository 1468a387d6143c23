/* SwiGLU on the device (the math of kernels/cpu/nn_swiglu_impl.h), n elements:
 *   y = silu(g) u = g sigmoid(g) u;   du = dy silu(g),   dg = dy u silu'(g),  silu' = s (1 + g (1 - s))
 * Storage S is float, double or bf16 (computed in f32, each output rounded once); bf16 arrays that
 * are 16-byte aligned, n a multiple of 8, move 8 elements a load (bf16_vec.h), with the same
 * arithmetic per element. */
#include "kernels/cuda/bf16_vec.h"
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

/* bf16, 8 elements a thread and round: i counts groups of 8 (n8 = n / 8) */
__global__ void swiglu_fwd_bf16x8_kernel(int64_t n8, const __nv_bfloat16 *g, const __nv_bfloat16 *u, __nv_bfloat16 *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
        float gv[kBf16Vec], uv[kBf16Vec], yv[kBf16Vec];
        bf16x8_load(g + i * kBf16Vec, gv);
        bf16x8_load(u + i * kBf16Vec, uv);
#pragma unroll
        for (int e = 0; e < kBf16Vec; e++) yv[e] = gv[e] / (1.0f + nn_exp(-gv[e])) * uv[e];
        bf16x8_store(y + i * kBf16Vec, yv);
    }
}

__global__ void swiglu_bwd_bf16x8_kernel(int64_t n8, const __nv_bfloat16 *g, const __nv_bfloat16 *u,
                                         const __nv_bfloat16 *dy, __nv_bfloat16 *dg, __nv_bfloat16 *du) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
        float gv[kBf16Vec], uv[kBf16Vec], dyv[kBf16Vec], out[kBf16Vec];
        bf16x8_load(g + i * kBf16Vec, gv);
        bf16x8_load(dy + i * kBf16Vec, dyv);
        if (du) {
#pragma unroll
            for (int e = 0; e < kBf16Vec; e++) out[e] = dyv[e] * gv[e] * nn_sigmoid(gv[e]);
            bf16x8_store(du + i * kBf16Vec, out);
        }
        if (dg) {
            bf16x8_load(u + i * kBf16Vec, uv);
#pragma unroll
            for (int e = 0; e < kBf16Vec; e++) {
                float s = nn_sigmoid(gv[e]);
                out[e] = dyv[e] * uv[e] * s * (1.0f + gv[e] * (1.0f - s));
            }
            bf16x8_store(dg + i * kBf16Vec, out);
        }
    }
}

/* every array (absent ones count) allows 8-element moves */
bool vec_ok(int64_t n, const void *a, const void *b, const void *c, const void *d = nullptr, const void *e = nullptr) {
    return n % kBf16Vec == 0 && bf16x8_aligned(a) && bf16x8_aligned(b) && bf16x8_aligned(c) && bf16x8_aligned(d) &&
           bf16x8_aligned(e);
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
    else if (vec_ok(n, g, u, y))
        swiglu_fwd_bf16x8_kernel<<<dg_grid_for(n / kBf16Vec, kNnThreads), kNnThreads, 0, dg_cuda_stream()>>>(
            n / kBf16Vec, (const __nv_bfloat16 *)g, (const __nv_bfloat16 *)u, (__nv_bfloat16 *)y);
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
    else if (vec_ok(n, g, u, dy, dg, du))
        swiglu_bwd_bf16x8_kernel<<<dg_grid_for(n / kBf16Vec, kNnThreads), kNnThreads, 0, dg_cuda_stream()>>>(
            n / kBf16Vec, (const __nv_bfloat16 *)g, (const __nv_bfloat16 *)u, (const __nv_bfloat16 *)dy,
            (__nv_bfloat16 *)dg, (__nv_bfloat16 *)du);
    else swiglu_bwd<__nv_bfloat16>(grid, n, g, u, dy, dg, du);
    return DG_LAUNCHED("swiglu bwd");
}
