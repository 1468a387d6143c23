/* Causal depthwise conv1d on the device (the math of kernels/cpu/nn_conv1d_impl.h).
 * x, y, dy, dx [B,T,D] (channels contiguous), w, dw [D,W], bias, dbias [D]:
 *   p[b,t,d] = bias[d] + sum_{j<W} w[d,j] x[b,t-W+1+j,d]  (x = 0 before t = 0),  y = silu(p) or p.
 * Forward and dx: one thread per element (neighbouring threads are neighbouring channels).
 * Backward: dp = dy silu'(p) (p recomputed) goes to scratch when silu is on; then
 *   dx[b,s,d] = sum_j w[d,j] dp[b,s+W-1-j,d]   (terms with s+W-1-j < T),
 *   dw[d,j] = sum_{b,t} dp[b,t,d] x[b,t-W+1+j,d],  dbias[d] = sum_{b,t} dp[b,t,d]
 * the last two as column sums over the B T rows (nn_util.h) of D W + D columns. */
#include "kernels/cuda/nn_util.h"

namespace {

/* p at (row bt = b T + t, channel d) */
template <typename T>
__device__ __forceinline__ T conv_p(int64_t T_, int64_t D, int64_t W, const T *x, const T *w, const T *bias, int64_t bt,
                                    int64_t d) {
    int64_t t = bt % T_;
    T acc = bias ? bias[d] : T(0);
    for (int64_t j = 0; j < W; j++) {
        int64_t s = t - W + 1 + j;
        if (s < 0) continue;
        acc += w[d * W + j] * x[(bt - t + s) * D + d];
    }
    return acc;
}

template <typename T>
__global__ void conv_fwd_kernel(int64_t n, int64_t T_, int64_t D, int64_t W, const T *x, const T *w, const T *bias,
                                bool silu, T *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        T p = conv_p(T_, D, W, x, w, bias, i / D, i % D);
        y[i] = silu ? p * nn_sigmoid(p) : p;
    }
}

/* forward y = silu(p): dp = dy s (1 + p (1 - s)) */
template <typename T>
__global__ void conv_dp_kernel(int64_t n, int64_t T_, int64_t D, int64_t W, const T *x, const T *w, const T *bias,
                               const T *dy, T *dp) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        T p = conv_p(T_, D, W, x, w, bias, i / D, i % D), s = nn_sigmoid(p);
        dp[i] = dy[i] * s * (T(1) + p * (T(1) - s));
    }
}

/* forward p[t] += w[:,j] x[t-W+1+j]: x at s collects w[:,j] dp[s+W-1-j] for outputs < T */
template <typename T>
__global__ void conv_dx_kernel(int64_t n, int64_t T_, int64_t D, int64_t W, const T *w, const T *dp, T *dx) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t bs = i / D, d = i % D, s = bs % T_;
        T acc = T(0);
        for (int64_t j = 0; j < W; j++) {
            int64_t t = s + W - 1 - j;
            if (t >= T_) continue;
            acc += w[d * W + j] * dp[(bs - s + t) * D + d];
        }
        dx[i] = acc;
    }
}

/* columns m < D W: dw[d = m / W, j = m % W]; m >= D W: dbias[m - D W].  Row n = b T + t. */
template <typename T> struct ConvDwTerm {
    const T *x, *dp;
    int64_t T_, D, W;
    __device__ double operator()(int64_t n, int64_t m) const {
        if (m >= D * W) return (double)dp[n * D + (m - D * W)];
        int64_t d = m / W, j = m % W, t = n % T_, s = t - W + 1 + j;
        if (s < 0) return 0.0;
        return (double)(dp[n * D + d] * x[(n - t + s) * D + d]);
    }
};

template <typename T>
int conv_bwd(int64_t B, int64_t T_, int64_t D, int64_t W, const T *x, const T *w, const T *bias, bool silu, const T *dy,
             T *dx, T *dw, T *dbias) {
    dg_dtype dt = sizeof(T) == 4 ? DG_F32 : DG_F64;
    int64_t n = B * T_ * D;
    cudaStream_t st = dg_cuda_stream();
    unsigned grid = dg_grid_for(n, kNnThreads);
    const T *dp = dy;
    T *dpbuf = nullptr;
    int rc = 0;
    if (silu && n > 0) {
        dpbuf = dg_cuda_scratch<T>((size_t)n);
        if (!dpbuf) return -1;
        conv_dp_kernel<T><<<grid, kNnThreads, 0, st>>>(n, T_, D, W, x, w, bias, dy, dpbuf);
        rc = DG_LAUNCHED("conv1d dp");
        dp = dpbuf;
    }
    if (rc == 0 && dx && n > 0) {
        conv_dx_kernel<T><<<grid, kNnThreads, 0, st>>>(n, T_, D, W, w, dp, dx);
        rc = DG_LAUNCHED("conv1d dx");
    }
    if (rc == 0 && (dw || dbias)) {
        /* both sums in one pass into a [D W + D] buffer, then split */
        int64_t M = D * W + D;
        T *sums = dg_cuda_scratch<T>((size_t)(M > 0 ? M : 1));
        if (!sums) rc = -1;
        if (rc == 0) {
            ConvDwTerm<T> term{x, dp, T_, D, W};
            rc = nn_column_sums(dt, term, B * T_, M, sums, "conv1d dw");
        }
        if (rc == 0 && dw) rc = dg_cuda_memcpy(dw, sums, sizeof(T) * (size_t)(D * W), 2);
        if (rc == 0 && dbias) rc = dg_cuda_memcpy(dbias, sums + D * W, sizeof(T) * (size_t)D, 2);
        dg_cuda_free(sums);
    }
    dg_cuda_free(dpbuf);
    return rc;
}

bool ready(const char *who, dg_dtype dt, int64_t B, int64_t T_, int64_t D, int64_t W) {
    if (!nn_float_dt(who, dt)) return false;
    if (B < 0 || T_ < 0 || D < 0 || W < 1) {
        dg_error("%s: bad sizes B %lld T %lld D %lld W %lld", who, (long long)B, (long long)T_, (long long)D,
                 (long long)W);
        return false;
    }
    return dg_cuda_init() == 0;
}

} // namespace

extern "C" int dg_cuda_conv1d_fwd(dg_dtype dt, int64_t B, int64_t T_, int64_t D, int64_t W, const void *x,
                                  const void *w, const void *bias, bool silu, void *y) {
    if (!ready("cuda conv1d", dt, B, T_, D, W)) return -1;
    int64_t n = B * T_ * D;
    if (n == 0) return 0;
    unsigned grid = dg_grid_for(n, kNnThreads);
    cudaStream_t st = dg_cuda_stream();
    if (dt == DG_F32)
        conv_fwd_kernel<float><<<grid, kNnThreads, 0, st>>>(n, T_, D, W, (const float *)x, (const float *)w,
                                                            (const float *)bias, silu, (float *)y);
    else
        conv_fwd_kernel<double><<<grid, kNnThreads, 0, st>>>(n, T_, D, W, (const double *)x, (const double *)w,
                                                             (const double *)bias, silu, (double *)y);
    return DG_LAUNCHED("conv1d fwd");
}

extern "C" int dg_cuda_conv1d_bwd(dg_dtype dt, int64_t B, int64_t T_, int64_t D, int64_t W, const void *x,
                                  const void *w, const void *bias, bool silu, const void *dy, void *dx, void *dw,
                                  void *dbias) {
    if (!ready("cuda conv1d bwd", dt, B, T_, D, W)) return -1;
    if (dt == DG_F32)
        return conv_bwd<float>(B, T_, D, W, (const float *)x, (const float *)w, (const float *)bias, silu,
                               (const float *)dy, (float *)dx, (float *)dw, (float *)dbias);
    return conv_bwd<double>(B, T_, D, W, (const double *)x, (const double *)w, (const double *)bias, silu,
                            (const double *)dy, (double *)dx, (double *)dw, (double *)dbias);
}
