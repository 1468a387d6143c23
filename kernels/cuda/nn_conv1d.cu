/* Causal depthwise conv1d on the device (the math of kernels/cpu/nn_conv1d_impl.h).
 * x, y, dy, dx [B,T,D] (channels contiguous), w, dw [D,W], bias, dbias [D]:
 *   p[b,t,d] = bias[d] + sum_{j<W} w[d,j] x[b,t-W+1+j,d]  (x = 0 before t = 0),  y = silu(p) or p.
 * Backward, with dp = dy silu'(p) (p recomputed) when silu is on, else dp = dy:
 *   dx[b,s,d] = sum_j w[d,j] dp[b,s+W-1-j,d]   (terms with s+W-1-j < T),
 *   dw[d,j] = sum_{b,t} dp[b,t,d] x[b,t-W+1+j,d],  dbias[d] = sum_{b,t} dp[b,t,d].
 *
 * Layout of the work: a block takes kConvThreads neighbouring channels (one thread each, so a warp
 * reads 32 neighbouring elements of a row) of one sequence b over a tile of kConvTile time steps,
 * and walks the tile in time keeping the last W inputs (and in the backward the last W of dp) in
 * registers: every element of x and dy is read from memory about once, and no index is divided.
 * The windows are arrays of WMAX (a compile-time bound, 4 or 8, on the kernel width W) with
 * static indices; entries at distance W or more are never used.  The backward recomputes dp for
 * the W - 1 steps after its tile (the halo its last dx need).  dw and dbias: each block writes its
 * tile's sums (in nn_acc: f64 for f32/f64 storage, f32 for bf16) as one row of partials, and
 * nn_colsum_launch adds the rows up (nn_util.h): the result does not depend on the launch.
 * Storage S is float, double or bf16 (computed in f32 for bf16, with dp kept in f32, each output
 * and gradient rounded once). */
#include "kernels/cuda/nn_util.h"

namespace {

constexpr int kConvThreads = 128; /* channels a block */
constexpr int kConvTile = 64;     /* time steps a block */
constexpr int kConvMaxW = 8;      /* the widest kernel (the op takes W in 1..8) */

/* x[b, t, d] in the compute type, 0 outside [0, T) */
template <typename S>
__device__ __forceinline__ nn_compute<S> conv_x(const S *x, int64_t row0, int64_t T_, int64_t D, int64_t t, int64_t d) {
    return t >= 0 && t < T_ ? nn_ld(x, (row0 + t) * D + d) : nn_compute<S>(0);
}

/* The causal window at time t: win[WMAX-1-k] = x[t-k] for k < W.  Shift in x[t]. */
template <int WMAX, typename C> __device__ __forceinline__ void conv_push(C *win, C v) {
#pragma unroll
    for (int k = 0; k < WMAX - 1; k++) win[k] = win[k + 1];
    win[WMAX - 1] = v;
}

/* p = bias + sum_{k<W} w[d, W-1-k] x[t-k] = bias + sum_k wr[k] win[WMAX-1-k] */
template <int WMAX, typename C> __device__ __forceinline__ C conv_dot(const C *wr, const C *win, int W, C bias) {
    C acc = bias;
#pragma unroll
    for (int k = 0; k < WMAX; k++)
        if (k < W) acc += wr[k] * win[WMAX - 1 - k];
    return acc;
}

/* this thread's channel d, sequence b and tile [t0, t1); false for a thread past the last channel */
struct ConvTile {
    int64_t d, row0, t0, t1;
};
__device__ __forceinline__ bool conv_tile(int64_t T_, int64_t D, ConvTile *c) {
    c->d = blockIdx.x * (int64_t)kConvThreads + threadIdx.x;
    c->row0 = blockIdx.z * T_;
    c->t0 = blockIdx.y * (int64_t)kConvTile;
    c->t1 = c->t0 + kConvTile < T_ ? c->t0 + kConvTile : T_;
    return c->d < D;
}

/* wr[k] = w[d, W-1-k] (newest input first), wf[k] = w[d, k]; 0 for k >= W */
template <int WMAX, typename S>
__device__ __forceinline__ void conv_weights(const S *w, int64_t d, int W, nn_compute<S> *wr, nn_compute<S> *wf) {
#pragma unroll
    for (int k = 0; k < WMAX; k++) {
        wr[k] = k < W ? nn_ld(w, d * W + (W - 1 - k)) : nn_compute<S>(0);
        if (wf) wf[k] = k < W ? nn_ld(w, d * W + k) : nn_compute<S>(0);
    }
}

/* the window before time t0: win[WMAX-1-k] = x[t0-1-k] for k < W-1, 0 beyond (the walk's first
 * push brings in x[t0]) */
template <int WMAX, typename S>
__device__ __forceinline__ void conv_window_before(const S *x, const ConvTile &c, int64_t T_, int64_t D, int W,
                                                   nn_compute<S> *win) {
#pragma unroll
    for (int k = 0; k < WMAX; k++) win[WMAX - 1 - k] = k < W - 1 ? conv_x(x, c.row0, T_, D, c.t0 - 1 - k, c.d) : 0;
}

template <typename S, int WMAX>
__global__ void __launch_bounds__(kConvThreads)
    conv_fwd_kernel(int64_t T_, int64_t D, int W, const S *__restrict__ x, const S *__restrict__ w,
                    const S *__restrict__ bias, bool silu, S *__restrict__ y) {
    typedef nn_compute<S> C;
    ConvTile c;
    if (!conv_tile(T_, D, &c)) return;
    C wr[WMAX], win[WMAX];
    conv_weights<WMAX>(w, c.d, W, wr, (C *)nullptr);
    conv_window_before<WMAX>(x, c, T_, D, W, win);
    const C b0 = bias ? nn_ld(bias, c.d) : C(0);
    const int64_t at = (c.row0 + c.t0) * D + c.d; /* element (t0, d); a step is D further */
    const S *xp = x + at;
    S *yp = y + at;
#pragma unroll 4
    for (int64_t t = c.t0; t < c.t1; t++, xp += D, yp += D) {
        conv_push<WMAX>(win, nn_ld(xp, 0));
        C p = conv_dot<WMAX>(wr, win, W, b0);
        nn_st(yp, 0, silu ? p * nn_sigmoid(p) : p);
    }
}

/* One step t of the backward's walk (bwd_kernel): `in` (t < T): x[t] and dy[t] enter the
 * windows and dp[t] is made, else dp[t] = 0; `own` (t in the tile): dp[t] joins dw and dbias;
 * `emit`: dx[t - (W-1)] is written.  The main loop calls it with all three true (constants the
 * compiler folds); the first W - 1 steps and the halo past the tile with what holds there. */
template <int WMAX, typename S, typename C, typename A>
__device__ __forceinline__ void conv_bwd_step(bool in, bool own, bool emit, int W, C b0, bool silu, const C *wr,
                                              const C *wf, C *win, C *dps, A *dwr, A &db, const S *xp, const S *gp,
                                              S *dxp) {
    C dp = 0;
    if (in) {
        conv_push<WMAX>(win, nn_ld(xp, 0));
        dp = nn_ld(gp, 0);
        if (silu) {
            C p = conv_dot<WMAX>(wr, win, W, b0), s = nn_sigmoid(p);
            dp *= s * (C(1) + p * (C(1) - s));
        }
    }
    if (own) { /* dw[d, W-1-k] += dp[t] x[t-k] */
#pragma unroll
        for (int k = 0; k < WMAX; k++)
            if (k < W) dwr[k] += (A)(dp * win[WMAX - 1 - k]);
        db += (A)dp;
    }
    conv_push<WMAX>(dps, dp); /* dps[WMAX-1-m] = dp[t-m] */
    if (emit) {               /* dx[s] = sum_{m<W} w[d, m] dp[s+W-1-m] = sum_m wf[m] dps[WMAX-1-m] */
        C acc = 0;
#pragma unroll
        for (int m = 0; m < WMAX; m++)
            if (m < W) acc += wf[m] * dps[WMAX - 1 - m];
        nn_st(dxp, 0, acc);
    }
}

/* Backward of one tile: dx of the tile; this tile's dw (partw row, [D W]) and dbias (partb row, [D])
 * sums.  The walk runs W - 1 steps past t1 for the dp that dx[t1 - 1] needs: the tile's first W - 1
 * steps write no dx yet, the steps past t1 add nothing to dw, and the steps between do everything
 * with no test of their own (a test a step was a fair share of this walk's instructions). */
template <typename S, int WMAX>
__global__ void __launch_bounds__(kConvThreads)
    conv_bwd_kernel(int64_t T_, int64_t D, int W, const S *__restrict__ x, const S *__restrict__ w,
                    const S *__restrict__ bias, bool silu, const S *__restrict__ dy, S *__restrict__ dx,
                    nn_acc<S> *__restrict__ partw, nn_acc<S> *__restrict__ partb) {
    typedef nn_compute<S> C;
    typedef nn_acc<S> A;
    ConvTile c;
    if (!conv_tile(T_, D, &c)) return;
    C wr[WMAX], wf[WMAX], win[WMAX], dps[WMAX];
    A dwr[WMAX], db = 0;
    conv_weights<WMAX>(w, c.d, W, wr, wf);
    conv_window_before<WMAX>(x, c, T_, D, W, win);
#pragma unroll
    for (int k = 0; k < WMAX; k++) dps[k] = 0, dwr[k] = 0;
    const C b0 = bias ? nn_ld(bias, c.d) : C(0);
    const bool has_dx = dx != nullptr;
    const int64_t at = (c.row0 + c.t0) * D + c.d; /* element (t0, d); a step is D further */
    const S *xp = x + at, *gp = dy + at;
    S *dxp = has_dx ? dx + at - (int64_t)(W - 1) * D : nullptr; /* dx[t - (W-1)] */
    const int64_t head = c.t0 + W - 1 < c.t1 ? c.t0 + W - 1 : c.t1;
    int64_t t = c.t0;
    for (; t < head; t++, xp += D, gp += D, dxp += has_dx ? D : 0)
        conv_bwd_step<WMAX>(true, true, false, W, b0, silu, wr, wf, win, dps, dwr, db, xp, gp, dxp);
    if (has_dx)
#pragma unroll 4
        for (; t < c.t1; t++, xp += D, gp += D, dxp += D)
            conv_bwd_step<WMAX>(true, true, true, W, b0, silu, wr, wf, win, dps, dwr, db, xp, gp, dxp);
    else
        for (; t < c.t1; t++, xp += D, gp += D)
            conv_bwd_step<WMAX>(true, true, false, W, b0, silu, wr, wf, win, dps, dwr, db, xp, gp, dxp);
    for (; t < c.t1 + W - 1; t++, xp += D, gp += D, dxp += has_dx ? D : 0) /* the halo: dp is 0 from T on */
        conv_bwd_step<WMAX>(t < T_, false, has_dx && t - (W - 1) >= c.t0, W, b0, silu, wr, wf, win, dps, dwr, db, xp,
                            gp, dxp);
    const int64_t prow = blockIdx.z * (int64_t)gridDim.y + blockIdx.y; /* this block's partial row */
    if (partw)
#pragma unroll
        for (int k = 0; k < WMAX; k++)
            if (k < W) partw[prow * D * W + c.d * W + (W - 1 - k)] = dwr[k];
    if (partb) partb[prow * D + c.d] = db;
}

dim3 conv_grid(int64_t B, int64_t T_, int64_t D) {
    return dim3((unsigned)((D + kConvThreads - 1) / kConvThreads), (unsigned)((T_ + kConvTile - 1) / kConvTile),
                (unsigned)B);
}

template <typename S>
int conv_fwd(int64_t B, int64_t T_, int64_t D, int W, const void *x, const void *w, const void *bias, bool silu,
             void *y) {
    dim3 g = conv_grid(B, T_, D);
    if (W <= 4)
        conv_fwd_kernel<S, 4><<<g, kConvThreads, 0, dg_cuda_stream()>>>(T_, D, W, (const S *)x, (const S *)w,
                                                                        (const S *)bias, silu, (S *)y);
    else
        conv_fwd_kernel<S, kConvMaxW><<<g, kConvThreads, 0, dg_cuda_stream()>>>(T_, D, W, (const S *)x, (const S *)w,
                                                                                (const S *)bias, silu, (S *)y);
    return DG_LAUNCHED("conv1d fwd");
}

template <typename S>
int conv_bwd(int64_t B, int64_t T_, int64_t D, int W, const void *x_, const void *w_, const void *bias_, bool silu,
             const void *dy_, void *dx_, void *dw, void *dbias) {
    typedef nn_acc<S> A;
    const S *x = (const S *)x_, *w = (const S *)w_, *bias = (const S *)bias_, *dy = (const S *)dy_;
    S *dx = (S *)dx_;
    dim3 g = conv_grid(B, T_, D);
    const int64_t P = (int64_t)g.y * B; /* partial rows: one per (sequence, tile) */
    A *partw = dw ? dg_cuda_scratch<A>((size_t)(P * D * W)) : nullptr;
    A *partb = dbias ? dg_cuda_scratch<A>((size_t)(P * D)) : nullptr;
    int rc = (dw && !partw) || (dbias && !partb) ? -1 : 0;
    if (rc == 0) {
        if (W <= 4)
            conv_bwd_kernel<S, 4>
                <<<g, kConvThreads, 0, dg_cuda_stream()>>>(T_, D, W, x, w, bias, silu, dy, dx, partw, partb);
        else
            conv_bwd_kernel<S, kConvMaxW>
                <<<g, kConvThreads, 0, dg_cuda_stream()>>>(T_, D, W, x, w, bias, silu, dy, dx, partw, partb);
        rc = DG_LAUNCHED("conv1d bwd");
    }
    if (rc == 0 && dw) rc = nn_colsum_launch(P, D * W, partw, (S *)dw, "conv1d dw");
    if (rc == 0 && dbias) rc = nn_colsum_launch(P, D, partb, (S *)dbias, "conv1d dbias");
    dg_cuda_free(partw);
    dg_cuda_free(partb);
    return rc;
}

bool ready(const char *who, dg_dtype dt, int64_t B, int64_t T_, int64_t D, int64_t W) {
    if (!nn_float_or_bf16_dt(who, dt)) return false;
    if (B < 0 || T_ < 0 || D < 0 || W < 1) {
        dg_error("%s: bad sizes B %lld T %lld D %lld W %lld", who, (long long)B, (long long)T_, (long long)D,
                 (long long)W);
        return false;
    }
    if (W > kConvMaxW) {
        dg_error("%s: kernel width W %lld is wider than the kernels take (at most %d)", who, (long long)W, kConvMaxW);
        return false;
    }
    if (B > 65535 || (T_ + kConvTile - 1) / kConvTile > 65535) {
        dg_error("%s: B %lld x T %lld is past the launch grid (B at most 65535, T at most %lld)", who, (long long)B,
                 (long long)T_, 65535LL * kConvTile);
        return false;
    }
    return dg_cuda_init() == 0;
}

} // namespace

extern "C" int dg_cuda_conv1d_fwd(dg_dtype dt, int64_t B, int64_t T_, int64_t D, int64_t W, const void *x,
                                  const void *w, const void *bias, bool silu, void *y) {
    if (!ready("cuda conv1d", dt, B, T_, D, W)) return -1;
    if (B * T_ * D == 0) return 0;
    if (dt == DG_F32) return conv_fwd<float>(B, T_, D, (int)W, x, w, bias, silu, y);
    if (dt == DG_F64) return conv_fwd<double>(B, T_, D, (int)W, x, w, bias, silu, y);
    return conv_fwd<__nv_bfloat16>(B, T_, D, (int)W, x, w, bias, silu, y);
}

extern "C" int dg_cuda_conv1d_bwd(dg_dtype dt, int64_t B, int64_t T_, int64_t D, int64_t W, const void *x,
                                  const void *w, const void *bias, bool silu, const void *dy, void *dx, void *dw,
                                  void *dbias) {
    if (!ready("cuda conv1d bwd", dt, B, T_, D, W)) return -1;
    if (B * T_ * D == 0) { /* no rows: the sums are zero */
        int rc = dw ? dg_cuda_fill(dt, D * W, dw, 0.0) : 0;
        return rc == 0 && dbias ? dg_cuda_fill(dt, D, dbias, 0.0) : rc;
    }
    if (dt == DG_F32) return conv_bwd<float>(B, T_, D, (int)W, x, w, bias, silu, dy, dx, dw, dbias);
    if (dt == DG_F64) return conv_bwd<double>(B, T_, D, (int)W, x, w, bias, silu, dy, dx, dw, dbias);
    return conv_bwd<__nv_bfloat16>(B, T_, D, (int)W, x, w, bias, silu, dy, dx, dw, dbias);
}
