/* Causal depthwise conv1d on the device (the math of kernels/cpu/nn_conv1d_impl.h).
 * x, y, dy, dx [B,T,D] (channels contiguous), w, dw [D,W], bias, dbias [D]:
 *   p[b,t,d] = bias[d] + sum_{j<W} w[d,j] x[b,t-W+1+j,d]  (x = 0 before t = 0),  y = silu(p) or p.
 * Backward, with dp = dy silu'(p) (p recomputed) when silu is on, else dp = dy:
 *   dx[b,s,d] = sum_j w[d,j] dp[b,s+W-1-j,d]   (terms with s+W-1-j < T),
 *   dw[d,j] = sum_{b,t} dp[b,t,d] x[b,t-W+1+j,d],  dbias[d] = sum_{b,t} dp[b,t,d].
 *
 * Layout of the work: a block takes kConvThreads threads, each V neighbouring channels (V = 8 for
 * bf16 when D is a multiple of 8 and every array 16-byte aligned: one 16-byte load a row, so a
 * warp reads 512 contiguous bytes; else V = 1, a warp reading 32 neighbouring elements), of one
 * sequence b over a tile of `tile` time steps (64, or 32 / 16 when fewer tiles would leave the
 * GPU short of warps), and walks the tile in time keeping the last W inputs (and in the backward
 * the last W of dp) in registers: every element of x and dy is read from memory about once, and
 * no index is divided.  The walk loads the next step's row before it computes the current one, so
 * that each thread has a load in flight while it works.
 * The windows are arrays of WMAX (a compile-time bound, 4 or 8, on the kernel width W) with
 * static indices; entries at distance W or more are never used.  The backward recomputes dp for
 * the W - 1 steps after its tile (the halo its last dx need).  dw and dbias: each block writes its
 * tile's sums (in nn_acc: f64 for f32/f64 storage, f32 for bf16) as one row of partials, and
 * nn_colsum_launch adds the rows up (nn_util.h): the result does not depend on the launch.
 * Storage S is float, double or bf16 (computed in f32 for bf16, with dp kept in f32, each output
 * and gradient rounded once). */
#include "kernels/cuda/nn_util.h"

#include <initializer_list>

namespace {

constexpr int kConvThreads = 128; /* threads a block */
constexpr int kConvMaxW = 8;      /* the widest kernel (the op takes W in 1..8) */

/* V elements of row t of a [T, D] sequence at channel d in the compute type, 0 outside [0, T) */
template <int V, typename S>
__device__ __forceinline__ void conv_row(const S *x, int64_t row0, int64_t T_, int64_t D, int64_t t, int64_t d,
                                         nn_compute<S> *out) {
    if (t >= 0 && t < T_) nn_ldv<V>(x, (row0 + t) * D + d, out);
    else
#pragma unroll
        for (int v = 0; v < V; v++) out[v] = nn_compute<S>(0);
}

/* The causal window at time t: win[WMAX-1-k][v] = x[t-k, d+v] for k < W.  Shift in x[t]. */
template <int WMAX, int V, typename C> __device__ __forceinline__ void conv_push(C (*win)[V], const C *row) {
#pragma unroll
    for (int k = 0; k < WMAX - 1; k++)
#pragma unroll
        for (int v = 0; v < V; v++) win[k][v] = win[k + 1][v];
#pragma unroll
    for (int v = 0; v < V; v++) win[WMAX - 1][v] = row[v];
}

/* p = bias + sum_{k<W} w[d, W-1-k] x[t-k] = bias + sum_k wr[k] win[WMAX-1-k], channel v */
template <int WMAX, int V, typename C>
__device__ __forceinline__ C conv_dot(const C (*wr)[V], const C (*win)[V], int W, C bias, int v) {
    C acc = bias;
#pragma unroll
    for (int k = 0; k < WMAX; k++)
        if (k < W) acc += wr[k][v] * win[WMAX - 1 - k][v];
    return acc;
}

/* this thread's first channel d, sequence b and tile [t0, t1); false for a thread past the last
 * channel (D is a multiple of V) */
struct ConvTile {
    int64_t d, row0, t0, t1;
};
template <int V> __device__ __forceinline__ bool conv_tile(int64_t T_, int64_t D, int tile, ConvTile *c) {
    c->d = (blockIdx.x * (int64_t)kConvThreads + threadIdx.x) * V;
    c->row0 = blockIdx.z * T_;
    c->t0 = blockIdx.y * (int64_t)tile;
    c->t1 = c->t0 + tile < T_ ? c->t0 + tile : T_;
    return c->d < D;
}

/* wr[k][v] = w[d+v, W-1-k] (newest input first), wf[k][v] = w[d+v, k]; 0 for k >= W */
template <int WMAX, int V, typename S>
__device__ __forceinline__ void conv_weights(const S *w, int64_t d, int W, nn_compute<S> (*wr)[V],
                                             nn_compute<S> (*wf)[V]) {
#pragma unroll
    for (int k = 0; k < WMAX; k++)
#pragma unroll
        for (int v = 0; v < V; v++) {
            wr[k][v] = k < W ? nn_ld(w, (d + v) * W + (W - 1 - k)) : nn_compute<S>(0);
            if (wf) wf[k][v] = k < W ? nn_ld(w, (d + v) * W + k) : nn_compute<S>(0);
        }
}

/* the window before time t0: win[WMAX-1-k] = x[t0-1-k] for k < W-1, 0 beyond (the walk's first
 * push brings in x[t0]) */
template <int WMAX, int V, typename S>
__device__ __forceinline__ void conv_window_before(const S *x, const ConvTile &c, int64_t T_, int64_t D, int W,
                                                   nn_compute<S> (*win)[V]) {
#pragma unroll
    for (int k = 0; k < WMAX; k++) {
        if (k < W - 1) conv_row<V>(x, c.row0, T_, D, c.t0 - 1 - k, c.d, win[WMAX - 1 - k]);
        else
#pragma unroll
            for (int v = 0; v < V; v++) win[WMAX - 1 - k][v] = 0;
    }
}

template <typename S, int WMAX, int V>
__global__ void __launch_bounds__(kConvThreads) conv_fwd_kernel(int64_t T_, int64_t D, int W, int tile, const S *x,
                                                                const S *w, const S *bias, bool silu, S *y) {
    typedef nn_compute<S> C;
    ConvTile c;
    if (!conv_tile<V>(T_, D, tile, &c)) return;
    C wr[WMAX][V], win[WMAX][V], b0[V], nxt[V];
    conv_weights<WMAX, V>(w, c.d, W, wr, (C(*)[V]) nullptr);
    conv_window_before<WMAX, V>(x, c, T_, D, W, win);
#pragma unroll
    for (int v = 0; v < V; v++) b0[v] = bias ? nn_ld(bias, c.d + v) : C(0);
    conv_row<V>(x, c.row0, T_, D, c.t0, c.d, nxt);
    for (int64_t t = c.t0; t < c.t1; t++) {
        conv_push<WMAX, V>(win, nxt);
        if (t + 1 < c.t1) conv_row<V>(x, c.row0, T_, D, t + 1, c.d, nxt); /* in flight during the sums */
        C out[V];
#pragma unroll
        for (int v = 0; v < V; v++) {
            C p = conv_dot<WMAX, V>(wr, win, W, b0[v], v);
            out[v] = silu ? p * nn_sigmoid(p) : p;
        }
        nn_stv<V>(y, (c.row0 + t) * D + c.d, out);
    }
}

/* Backward of one tile: dx of the tile; this tile's dw (partw row, [D W]) and dbias (partb row, [D])
 * sums.  The walk runs W - 1 steps past t1 for the dp that dx[t1 - 1] needs. */
template <typename S, int WMAX, int V>
__global__ void __launch_bounds__(kConvThreads)
    conv_bwd_kernel(int64_t T_, int64_t D, int W, int tile, const S *x, const S *w, const S *bias, bool silu,
                    const S *dy, S *dx, nn_acc<S> *partw, nn_acc<S> *partb) {
    typedef nn_compute<S> C;
    typedef nn_acc<S> A;
    ConvTile c;
    if (!conv_tile<V>(T_, D, tile, &c)) return;
    C wr[WMAX][V], wf[WMAX][V], win[WMAX][V], dps[WMAX][V], b0[V], xn[V], dyn[V];
    A dwr[WMAX][V], db[V];
    conv_weights<WMAX, V>(w, c.d, W, wr, wf);
    conv_window_before<WMAX, V>(x, c, T_, D, W, win);
#pragma unroll
    for (int v = 0; v < V; v++) {
        b0[v] = bias ? nn_ld(bias, c.d + v) : C(0);
        db[v] = 0;
#pragma unroll
        for (int k = 0; k < WMAX; k++) dps[k][v] = 0, dwr[k][v] = 0;
    }
    const int64_t tend = c.t1 + W - 1 < T_ ? c.t1 + W - 1 : T_; /* dp is 0 from T on */
    if (c.t0 < tend) conv_row<V>(x, c.row0, T_, D, c.t0, c.d, xn), conv_row<V>(dy, c.row0, T_, D, c.t0, c.d, dyn);
    for (int64_t t = c.t0; t < c.t1 + W - 1; t++) {
        C dp[V];
        if (t < tend) {
            conv_push<WMAX, V>(win, xn);
#pragma unroll
            for (int v = 0; v < V; v++) dp[v] = dyn[v];
            if (t + 1 < tend) /* the next step's rows in flight during this step's sums */
                conv_row<V>(x, c.row0, T_, D, t + 1, c.d, xn), conv_row<V>(dy, c.row0, T_, D, t + 1, c.d, dyn);
            if (silu)
#pragma unroll
                for (int v = 0; v < V; v++) {
                    C p = conv_dot<WMAX, V>(wr, win, W, b0[v], v), s = nn_sigmoid(p);
                    dp[v] *= s * (C(1) + p * (C(1) - s));
                }
        } else
#pragma unroll
            for (int v = 0; v < V; v++) dp[v] = 0;
        if (t < c.t1) /* this tile's own steps: dw[d, W-1-k] += dp[t] x[t-k] */
#pragma unroll
            for (int v = 0; v < V; v++) {
#pragma unroll
                for (int k = 0; k < WMAX; k++)
                    if (k < W) dwr[k][v] += (A)(dp[v] * win[WMAX - 1 - k][v]);
                db[v] += (A)dp[v];
            }
        conv_push<WMAX, V>(dps, dp); /* dps[WMAX-1-m] = dp[t-m] */
        const int64_t s = t - (W - 1);
        if (dx && s >= c.t0) { /* dx[s] = sum_{m<W} w[d, m] dp[s+W-1-m] = sum_m wf[m] dps[WMAX-1-m] */
            C acc[V];
#pragma unroll
            for (int v = 0; v < V; v++) {
                acc[v] = 0;
#pragma unroll
                for (int m = 0; m < WMAX; m++)
                    if (m < W) acc[v] += wf[m][v] * dps[WMAX - 1 - m][v];
            }
            nn_stv<V>(dx, (c.row0 + s) * D + c.d, acc);
        }
    }
    const int64_t prow = blockIdx.z * (int64_t)gridDim.y + blockIdx.y; /* this block's partial row */
#pragma unroll
    for (int v = 0; v < V; v++) {
        if (partw)
#pragma unroll
            for (int k = 0; k < WMAX; k++)
                if (k < W) partw[prow * D * W + (c.d + v) * W + (W - 1 - k)] = dwr[k][v];
        if (partb) partb[prow * D + c.d + v] = db[v];
    }
}

/* The launch: V channels a thread where the arrays allow it; tiles of 64 steps, shortened while
 * the grid would have fewer than 4 blocks a multiprocessor. */
struct ConvPlan {
    int V, tile;
    dim3 grid;
};
ConvPlan conv_plan(bool vec, int64_t B, int64_t T_, int64_t D) {
    ConvPlan p;
    p.V = vec ? kBf16Vec : 1;
    const int64_t gx = (D / p.V + kConvThreads - 1) / kConvThreads;
    const int64_t want = 4 * (int64_t)(dg_cuda_sm_count() > 0 ? dg_cuda_sm_count() : 1);
    p.tile = 64;
    while (p.tile > 16 && gx * B * ((T_ + p.tile - 1) / p.tile) < want) p.tile /= 2;
    p.grid = dim3((unsigned)gx, (unsigned)((T_ + p.tile - 1) / p.tile), (unsigned)B);
    return p;
}

/* bf16 in units of 8 channels: D a multiple of 8 and every array given 16-byte aligned */
template <typename S> bool conv_vec(int64_t D, std::initializer_list<const void *> arrays) {
    bool ok = sizeof(S) == 2 && D % kBf16Vec == 0;
    for (const void *a : arrays) ok = ok && bf16x8_aligned(a);
    return ok;
}

template <typename S, int V>
int conv_fwd_v(const ConvPlan &pl, int64_t T_, int64_t D, int W, const void *x, const void *w, const void *bias,
               bool silu, void *y) {
    if (W <= 4)
        conv_fwd_kernel<S, 4, V><<<pl.grid, kConvThreads, 0, dg_cuda_stream()>>>(
            T_, D, W, pl.tile, (const S *)x, (const S *)w, (const S *)bias, silu, (S *)y);
    else
        conv_fwd_kernel<S, kConvMaxW, V><<<pl.grid, kConvThreads, 0, dg_cuda_stream()>>>(
            T_, D, W, pl.tile, (const S *)x, (const S *)w, (const S *)bias, silu, (S *)y);
    return DG_LAUNCHED("conv1d fwd");
}

template <typename S>
int conv_fwd(int64_t B, int64_t T_, int64_t D, int W, const void *x, const void *w, const void *bias, bool silu,
             void *y) {
    const ConvPlan pl = conv_plan(conv_vec<S>(D, {x, y}), B, T_, D);
    if constexpr (sizeof(S) == 2)
        if (pl.V > 1) return conv_fwd_v<S, kBf16Vec>(pl, T_, D, W, x, w, bias, silu, y);
    return conv_fwd_v<S, 1>(pl, T_, D, W, x, w, bias, silu, y);
}

template <typename S, int V>
int conv_bwd_v(const ConvPlan &pl, int64_t T_, int64_t D, int W, const S *x, const S *w, const S *bias, bool silu,
               const S *dy, S *dx, nn_acc<S> *partw, nn_acc<S> *partb) {
    if (W <= 4)
        conv_bwd_kernel<S, 4, V>
            <<<pl.grid, kConvThreads, 0, dg_cuda_stream()>>>(T_, D, W, pl.tile, x, w, bias, silu, dy, dx, partw, partb);
    else
        conv_bwd_kernel<S, kConvMaxW, V>
            <<<pl.grid, kConvThreads, 0, dg_cuda_stream()>>>(T_, D, W, pl.tile, x, w, bias, silu, dy, dx, partw, partb);
    return DG_LAUNCHED("conv1d bwd");
}

template <typename S>
int conv_bwd(int64_t B, int64_t T_, int64_t D, int W, const void *x_, const void *w_, const void *bias_, bool silu,
             const void *dy_, void *dx_, void *dw, void *dbias) {
    typedef nn_acc<S> A;
    const S *x = (const S *)x_, *w = (const S *)w_, *bias = (const S *)bias_, *dy = (const S *)dy_;
    S *dx = (S *)dx_;
    const ConvPlan pl = conv_plan(conv_vec<S>(D, {x, dy, dx}), B, T_, D);
    const int64_t P = (int64_t)pl.grid.y * B; /* partial rows: one per (sequence, tile) */
    A *partw = dw ? dg_cuda_scratch<A>((size_t)(P * D * W)) : nullptr;
    A *partb = dbias ? dg_cuda_scratch<A>((size_t)(P * D)) : nullptr;
    int rc = (dw && !partw) || (dbias && !partb) ? -1 : 0;
    bool pl_done = false;
    if (rc == 0) {
        if constexpr (sizeof(S) == 2)
            if (pl.V > 1) rc = conv_bwd_v<S, kBf16Vec>(pl, T_, D, W, x, w, bias, silu, dy, dx, partw, partb), pl_done = true;
        if (!pl_done) rc = conv_bwd_v<S, 1>(pl, T_, D, W, x, w, bias, silu, dy, dx, partw, partb);
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
    if (B > 65535 || (T_ + 63) / 64 > 65535) {
        dg_error("%s: B %lld x T %lld is past the launch grid (B at most 65535, T at most %lld)", who, (long long)B,
                 (long long)T_, 65535LL * 64);
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
