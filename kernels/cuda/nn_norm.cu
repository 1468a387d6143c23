/* Normalisations over the last dim on the device (the math of kernels/cpu/nn_norm_impl.h):
 *   rms_norm        y = x r w,            r = 1/sqrt(mean(x^2) + eps)
 *   gated_rms_norm  y = x r w silu(z)
 *   l2norm          y = x r,              r = 1/sqrt(sum(x^2) + eps)
 * x, z, y, dy, dx, dz [N,D]; w, dw [D] (w NULL: ones); rstd [N].
 * One group of G threads per row (nn_util.h): a first pass sums over the row in double, a second
 * writes the row.  dw sums over rows by the two-pass column sums of nn_util.h. */
#include "kernels/cuda/nn_util.h"

namespace {

/* ---- rms_norm ---------------------------------------------------------------------------------- */

/* mode 0: rms (mean of squares), 1: l2 (sum of squares); gated: y also times silu(z) */
template <typename T, int G>
__global__ void __launch_bounds__(kNnThreads)
    norm_fwd_kernel(int64_t N, int64_t D, const T *x, const T *z, const T *w, double eps, int mode, T *y, T *rstd) {
    __shared__ double smem[kNnThreads / 32];
    constexpr int RPB = kNnThreads / G;
    const int lane = threadIdx.x % G;
    for (int64_t base = (int64_t)blockIdx.x * RPB; base < N; base += (int64_t)gridDim.x * RPB) {
        int64_t row = base + threadIdx.x / G;
        bool active = row < N;
        const T *xr = x + (active ? row : 0) * D;
        double ss = 0;
        if (active)
            for (int64_t d = lane; d < D; d += G) ss += (double)xr[d] * (double)xr[d];
        ss = nn_group_sum<G>(ss, smem);
        if (!active) continue;
        T r = (T)(1.0 / sqrt((mode == 0 ? ss / (double)D : ss) + eps));
        if (lane == 0 && rstd) rstd[row] = r;
        T *yr = y + row * D;
        const T *zr = z ? z + row * D : nullptr;
        for (int64_t d = lane; d < D; d += G) {
            T v = xr[d] * r;
            if (w) v = v * w[d];
            if (zr) v = v * zr[d] * nn_sigmoid(zr[d]); /* the CPU kernel's order of products */
            yr[d] = v;
        }
    }
}

/* rms / gated rms backward of dx and dz, per row:
 *   forward y = xh (w silu(z)), xh = x r: the gradient reaching xh is g = dy w silu(z);
 *   dx = r (g - x c), c = r^2 sum_d(g_d x_d) / D;
 *   forward y = (x r w) silu(z): dz = dy x r w silu'(z), silu'(z) = s (1 + z (1 - s)) */
template <typename T, int G>
__global__ void __launch_bounds__(kNnThreads)
    rms_bwd_kernel(int64_t N, int64_t D, const T *x, const T *z, const T *w, const T *rstd, const T *dy, T *dx, T *dz) {
    __shared__ double smem[kNnThreads / 32];
    constexpr int RPB = kNnThreads / G;
    const int lane = threadIdx.x % G;
    for (int64_t base = (int64_t)blockIdx.x * RPB; base < N; base += (int64_t)gridDim.x * RPB) {
        int64_t row = base + threadIdx.x / G;
        bool active = row < N;
        int64_t o = (active ? row : 0) * D;
        const T *xr = x + o, *dyr = dy + o, *zr = z ? z + o : nullptr;
        double dot = 0;
        if (active && dx)
            for (int64_t d = lane; d < D; d += G) {
                T g = dyr[d];
                if (w) g = g * w[d];
                if (zr) g = g * zr[d] * nn_sigmoid(zr[d]);
                dot += (double)g * (double)xr[d];
            }
        dot = nn_group_sum<G>(dot, smem);
        if (!active) continue;
        T r = rstd[row];
        T c = (T)(dot * (double)r * (double)r / (double)D);
        for (int64_t d = lane; d < D; d += G) {
            T wd = w ? w[d] : T(1);
            if (zr) {
                T s = nn_sigmoid(zr[d]);
                if (dz) dz[o + d] = dyr[d] * xr[d] * r * wd * s * (T(1) + zr[d] * (T(1) - s));
                if (dx) dx[o + d] = r * (dyr[d] * wd * zr[d] * s - xr[d] * c);
            } else if (dx) {
                dx[o + d] = r * (dyr[d] * wd - xr[d] * c);
            }
        }
    }
}

/* dw[d] = sum_n dy x r (gated: times silu(z)) */
template <typename T> struct RmsDwTerm {
    const T *x, *z, *dy, *rstd;
    int64_t D;
    __device__ double operator()(int64_t n, int64_t d) const {
        int64_t i = n * D + d;
        T v = dy[i] * x[i] * rstd[n];
        if (z) v = v * z[i] * nn_sigmoid(z[i]);
        return (double)v;
    }
};

/* l2norm backward: forward y_j = x_j r, dx_j = r (dy_j - x_j c), c = r^2 sum_d(dy_d x_d) */
template <typename T, int G>
__global__ void __launch_bounds__(kNnThreads)
    l2_bwd_kernel(int64_t N, int64_t D, const T *x, const T *rstd, const T *dy, T *dx) {
    __shared__ double smem[kNnThreads / 32];
    constexpr int RPB = kNnThreads / G;
    const int lane = threadIdx.x % G;
    for (int64_t base = (int64_t)blockIdx.x * RPB; base < N; base += (int64_t)gridDim.x * RPB) {
        int64_t row = base + threadIdx.x / G;
        bool active = row < N;
        int64_t o = (active ? row : 0) * D;
        double dot = 0;
        if (active)
            for (int64_t d = lane; d < D; d += G) dot += (double)dy[o + d] * (double)x[o + d];
        dot = nn_group_sum<G>(dot, smem);
        if (!active) continue;
        T r = rstd[row];
        T c = (T)(dot * (double)r * (double)r);
        for (int64_t d = lane; d < D; d += G) dx[o + d] = r * (dy[o + d] - x[o + d] * c);
    }
}

template <typename T>
int norm_fwd(int64_t N, int64_t D, const T *x, const T *z, const T *w, double eps, int mode, T *y, T *rstd) {
    int G = nn_group_for(D);
    unsigned grid = nn_row_grid(N, G);
    cudaStream_t s = dg_cuda_stream();
    if (G == 32) norm_fwd_kernel<T, 32><<<grid, kNnThreads, 0, s>>>(N, D, x, z, w, eps, mode, y, rstd);
    else norm_fwd_kernel<T, 256><<<grid, kNnThreads, 0, s>>>(N, D, x, z, w, eps, mode, y, rstd);
    return DG_LAUNCHED(mode ? "l2norm fwd" : "rms_norm fwd");
}

template <typename T>
int rms_bwd(int64_t N, int64_t D, const T *x, const T *z, const T *w, const T *rstd, const T *dy, T *dx, T *dz, T *dw) {
    cudaStream_t s = dg_cuda_stream();
    if (dx || dz) {
        int G = nn_group_for(D);
        unsigned grid = nn_row_grid(N, G);
        if (G == 32) rms_bwd_kernel<T, 32><<<grid, kNnThreads, 0, s>>>(N, D, x, z, w, rstd, dy, dx, dz);
        else rms_bwd_kernel<T, 256><<<grid, kNnThreads, 0, s>>>(N, D, x, z, w, rstd, dy, dx, dz);
        if (DG_LAUNCHED(z ? "gated_rms_norm bwd" : "rms_norm bwd")) return -1;
    }
    if (dw) {
        RmsDwTerm<T> term{x, z, dy, rstd, D};
        return nn_column_sums(sizeof(T) == 4 ? DG_F32 : DG_F64, term, N, D, dw, "rms_norm dw");
    }
    return 0;
}

bool ready(const char *who, dg_dtype dt, int64_t N, int64_t D) {
    if (!nn_float_dt(who, dt)) return false;
    if (N < 0 || D < 0) {
        dg_error("%s: negative size (N %lld, D %lld)", who, (long long)N, (long long)D);
        return false;
    }
    return dg_cuda_init() == 0;
}

} // namespace

extern "C" {

int dg_cuda_rms_norm_fwd(dg_dtype dt, int64_t N, int64_t D, const void *x, const void *w, double eps, void *y,
                         void *rstd) {
    if (!ready("cuda rms_norm", dt, N, D)) return -1;
    if (N == 0) return 0;
    if (dt == DG_F32)
        return norm_fwd<float>(N, D, (const float *)x, nullptr, (const float *)w, eps, 0, (float *)y, (float *)rstd);
    return norm_fwd<double>(N, D, (const double *)x, nullptr, (const double *)w, eps, 0, (double *)y, (double *)rstd);
}

int dg_cuda_rms_norm_bwd(dg_dtype dt, int64_t N, int64_t D, const void *x, const void *w, const void *rstd,
                         const void *dy, void *dx, void *dw) {
    if (!ready("cuda rms_norm bwd", dt, N, D)) return -1;
    if (dt == DG_F32)
        return rms_bwd<float>(N, D, (const float *)x, nullptr, (const float *)w, (const float *)rstd, (const float *)dy,
                              (float *)dx, nullptr, (float *)dw);
    return rms_bwd<double>(N, D, (const double *)x, nullptr, (const double *)w, (const double *)rstd,
                           (const double *)dy, (double *)dx, nullptr, (double *)dw);
}

int dg_cuda_gated_rms_norm_fwd(dg_dtype dt, int64_t N, int64_t D, const void *x, const void *z, const void *w,
                               double eps, void *y, void *rstd) {
    if (!ready("cuda gated_rms_norm", dt, N, D)) return -1;
    if (N == 0) return 0;
    if (dt == DG_F32)
        return norm_fwd<float>(N, D, (const float *)x, (const float *)z, (const float *)w, eps, 0, (float *)y,
                               (float *)rstd);
    return norm_fwd<double>(N, D, (const double *)x, (const double *)z, (const double *)w, eps, 0, (double *)y,
                            (double *)rstd);
}

int dg_cuda_gated_rms_norm_bwd(dg_dtype dt, int64_t N, int64_t D, const void *x, const void *z, const void *w,
                               const void *rstd, const void *dy, void *dx, void *dz, void *dw) {
    if (!ready("cuda gated_rms_norm bwd", dt, N, D)) return -1;
    if (dt == DG_F32)
        return rms_bwd<float>(N, D, (const float *)x, (const float *)z, (const float *)w, (const float *)rstd,
                              (const float *)dy, (float *)dx, (float *)dz, (float *)dw);
    return rms_bwd<double>(N, D, (const double *)x, (const double *)z, (const double *)w, (const double *)rstd,
                           (const double *)dy, (double *)dx, (double *)dz, (double *)dw);
}

int dg_cuda_l2norm_fwd(dg_dtype dt, int64_t N, int64_t D, const void *x, double eps, void *y, void *rstd) {
    if (!ready("cuda l2norm", dt, N, D)) return -1;
    if (N == 0) return 0;
    if (dt == DG_F32)
        return norm_fwd<float>(N, D, (const float *)x, nullptr, nullptr, eps, 1, (float *)y, (float *)rstd);
    return norm_fwd<double>(N, D, (const double *)x, nullptr, nullptr, eps, 1, (double *)y, (double *)rstd);
}

int dg_cuda_l2norm_bwd(dg_dtype dt, int64_t N, int64_t D, const void *x, const void *rstd, const void *dy, void *dx) {
    if (!ready("cuda l2norm bwd", dt, N, D)) return -1;
    if (N == 0 || !dx) return 0;
    int G = nn_group_for(D);
    unsigned grid = nn_row_grid(N, G);
    cudaStream_t s = dg_cuda_stream();
#define DG_L2(T, GG) \
    l2_bwd_kernel<T, GG><<<grid, kNnThreads, 0, s>>>(N, D, (const T *)x, (const T *)rstd, (const T *)dy, (T *)dx)
    if (dt == DG_F32) {
        if (G == 32) DG_L2(float, 32);
        else DG_L2(float, 256);
    } else {
        if (G == 32) DG_L2(double, 32);
        else DG_L2(double, 256);
    }
#undef DG_L2
    return DG_LAUNCHED("l2norm bwd");
}

} // extern "C"
