/* Causal depthwise conv1d on the device (the math of kernels/cpu/nn_conv1d_impl.h).
 * x, y, dy, dx [B,T,D] (channels contiguous), w, dw [D,W], bias, dbias [D]:
 *   p[b,t,d] = bias[d] + sum_{j<W} w[d,j] x[b,t-W+1+j,d]  (x = 0 before t = 0),  y = silu(p) or p.
 * Forward and dx: one thread per element (neighbouring threads are neighbouring channels).
 * Backward: dp = dy silu'(p) (p recomputed) goes to scratch when silu is on; then
 *   dx[b,s,d] = sum_j w[d,j] dp[b,s+W-1-j,d]   (terms with s+W-1-j < T),
 *   dw[d,j] = sum_{b,t} dp[b,t,d] x[b,t-W+1+j,d],  dbias[d] = sum_{b,t} dp[b,t,d]
 * the last two as column sums over the B T rows (nn_util.h) of D W + D columns.
 * Storage S is float, double or bf16 (computed in f32, with dp kept in f32, and each output and
 * gradient rounded once). */
#include "kernels/cuda/nn_util.h"

namespace {

/* p at (row bt = b T + t, channel d), in the compute type */
template <typename S>
__device__ __forceinline__ nn_compute<S> conv_p(int64_t T_, int64_t D, int64_t W, const S *x, const S *w, const S *bias,
                                                int64_t bt, int64_t d) {
    typedef nn_compute<S> C;
    int64_t t = bt % T_;
    C acc = bias ? nn_ld(bias, d) : C(0);
    for (int64_t j = 0; j < W; j++) {
        int64_t s = t - W + 1 + j;
        if (s < 0) continue;
        acc += nn_ld(w, d * W + j) * nn_ld(x, (bt - t + s) * D + d);
    }
    return acc;
}

template <typename S>
__global__ void conv_fwd_kernel(int64_t n, int64_t T_, int64_t D, int64_t W, const S *x, const S *w, const S *bias,
                                bool silu, S *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        nn_compute<S> p = conv_p(T_, D, W, x, w, bias, i / D, i % D);
        nn_st(y, i, silu ? p * nn_sigmoid(p) : p);
    }
}

/* forward y = silu(p): dp = dy s (1 + p (1 - s)), kept in the compute type (f32 for bf16: dp is
 * an intermediate, not a gradient the op returns, so it is not rounded) */
template <typename S>
__global__ void conv_dp_kernel(int64_t n, int64_t T_, int64_t D, int64_t W, const S *x, const S *w, const S *bias,
                               const S *dy, nn_compute<S> *dp) {
    typedef nn_compute<S> C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        C p = conv_p(T_, D, W, x, w, bias, i / D, i % D), s = nn_sigmoid(p);
        dp[i] = nn_ld(dy, i) * s * (C(1) + p * (C(1) - s));
    }
}

/* forward p[t] += w[:,j] x[t-W+1+j]: x at s collects w[:,j] dp[s+W-1-j] for outputs < T.
 * DP (the type of dp) is S when dp is dy itself, the compute type when it is the scratch above. */
template <typename S, typename DP>
__global__ void conv_dx_kernel(int64_t n, int64_t T_, int64_t D, int64_t W, const S *w, const DP *dp, S *dx) {
    typedef nn_compute<S> C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t bs = i / D, d = i % D, s = bs % T_;
        C acc = C(0);
        for (int64_t j = 0; j < W; j++) {
            int64_t t = s + W - 1 - j;
            if (t >= T_) continue;
            acc += nn_ld(w, d * W + j) * (C)nn_ld(dp, (bs - s + t) * D + d);
        }
        nn_st(dx, i, acc);
    }
}

/* columns m < D W: dw[d = m / W, j = m % W]; m >= D W: dbias[m - D W].  Row n = b T + t. */
template <typename S, typename DP> struct ConvDwTerm {
    const S *x;
    const DP *dp;
    int64_t T_, D, W;
    __device__ nn_acc<S> operator()(int64_t n, int64_t m) const {
        typedef nn_acc<S> A;
        typedef nn_compute<S> C;
        if (m >= D * W) return (A)nn_ld(dp, n * D + (m - D * W));
        int64_t d = m / W, j = m % W, t = n % T_, s = t - W + 1 + j;
        if (s < 0) return A(0);
        return (A)((C)nn_ld(dp, n * D + d) * nn_ld(x, (n - t + s) * D + d));
    }
};

/* dx, dw and dbias from dp (of type DP) */
template <typename S, typename DP>
int conv_bwd_from_dp(int64_t B, int64_t T_, int64_t D, int64_t W, const S *x, const S *w, const DP *dp, S *dx, S *dw,
                     S *dbias) {
    int64_t n = B * T_ * D;
    int rc = 0;
    if (dx && n > 0) {
        conv_dx_kernel<S, DP><<<dg_grid_for(n, kNnThreads), kNnThreads, 0, dg_cuda_stream()>>>(n, T_, D, W, w, dp, dx);
        rc = DG_LAUNCHED("conv1d dx");
    }
    if (rc == 0 && (dw || dbias)) {
        /* both sums in one pass into a [D W + D] buffer, then split */
        int64_t M = D * W + D;
        S *sums = dg_cuda_scratch<S>((size_t)(M > 0 ? M : 1));
        if (!sums) rc = -1;
        if (rc == 0) rc = nn_column_sums(ConvDwTerm<S, DP>{x, dp, T_, D, W}, B * T_, M, sums, "conv1d dw");
        if (rc == 0 && dw) rc = dg_cuda_memcpy(dw, sums, sizeof(S) * (size_t)(D * W), 2);
        if (rc == 0 && dbias) rc = dg_cuda_memcpy(dbias, sums + D * W, sizeof(S) * (size_t)D, 2);
        dg_cuda_free(sums);
    }
    return rc;
}

template <typename S>
int conv_bwd(int64_t B, int64_t T_, int64_t D, int64_t W, const void *x_, const void *w_, const void *bias, bool silu,
             const void *dy_, void *dx, void *dw, void *dbias) {
    typedef nn_compute<S> C;
    const S *x = (const S *)x_, *w = (const S *)w_, *dy = (const S *)dy_;
    int64_t n = B * T_ * D;
    if (!silu || n == 0) return conv_bwd_from_dp<S, S>(B, T_, D, W, x, w, dy, (S *)dx, (S *)dw, (S *)dbias);
    C *dp = dg_cuda_scratch<C>((size_t)n);
    if (!dp) return -1;
    conv_dp_kernel<S>
        <<<dg_grid_for(n, kNnThreads), kNnThreads, 0, dg_cuda_stream()>>>(n, T_, D, W, x, w, (const S *)bias, dy, dp);
    int rc = DG_LAUNCHED("conv1d dp");
    if (rc == 0) rc = conv_bwd_from_dp<S, C>(B, T_, D, W, x, w, dp, (S *)dx, (S *)dw, (S *)dbias);
    dg_cuda_free(dp);
    return rc;
}

template <typename S>
void conv_fwd(int64_t n, int64_t T_, int64_t D, int64_t W, const void *x, const void *w, const void *bias, bool silu,
              void *y) {
    conv_fwd_kernel<S><<<dg_grid_for(n, kNnThreads), kNnThreads, 0, dg_cuda_stream()>>>(
        n, T_, D, W, (const S *)x, (const S *)w, (const S *)bias, silu, (S *)y);
}

bool ready(const char *who, dg_dtype dt, int64_t B, int64_t T_, int64_t D, int64_t W) {
    if (!nn_float_or_bf16_dt(who, dt)) return false;
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
    if (dt == DG_F32) conv_fwd<float>(n, T_, D, W, x, w, bias, silu, y);
    else if (dt == DG_F64) conv_fwd<double>(n, T_, D, W, x, w, bias, silu, y);
    else conv_fwd<__nv_bfloat16>(n, T_, D, W, x, w, bias, silu, y);
    return DG_LAUNCHED("conv1d fwd");
}

extern "C" int dg_cuda_conv1d_bwd(dg_dtype dt, int64_t B, int64_t T_, int64_t D, int64_t W, const void *x,
                                  const void *w, const void *bias, bool silu, const void *dy, void *dx, void *dw,
                                  void *dbias) {
    if (!ready("cuda conv1d bwd", dt, B, T_, D, W)) return -1;
    if (dt == DG_F32) return conv_bwd<float>(B, T_, D, W, x, w, bias, silu, dy, dx, dw, dbias);
    if (dt == DG_F64) return conv_bwd<double>(B, T_, D, W, x, w, bias, silu, dy, dx, dw, dbias);
    return conv_bwd<__nv_bfloat16>(B, T_, D, W, x, w, bias, silu, dy, dx, dw, dbias);
}
