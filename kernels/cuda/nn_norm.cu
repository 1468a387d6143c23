/* Normalisations over the last dim on the device (the math of kernels/cpu/nn_norm_impl.h):
 *   rms_norm        y = x r w,            r = 1/sqrt(mean(x^2) + eps)
 *   gated_rms_norm  y = x r w silu(z)
 *   l2norm          y = x r,              r = 1/sqrt(sum(x^2) + eps)
 *   add_rms_norm    s = x + add (written out too),  y = s r w,  r of s: the residual add fused
 *                   in front of rms_norm (the op's h, y, r, x are x, add, s, y here)
 * x, z, y, dy, dx, dz [N,D]; w, dw [D] (w NULL: ones); rstd [N].
 * One group of G threads per row (nn_util.h; rms and gated norms take the fewest of 8, 16, 32 lanes
 * that cover a row, so per-head rows of 128 do not leave half a warp idle): a first pass sums over the row (double for f32 and
 * f64, f32 for bf16), a second writes the row.  dw sums over rows by the two-pass column sums of
 * nn_util.h.  Storage S is float, double or bf16 (computed in f32, rounded once at the store);
 * rstd is of the compute type (f32 for bf16).  bf16 rows whose arrays are 16-byte aligned, D a
 * multiple of 8, move 8 elements a load (bf16_vec.h; the l2norm backward and dw stay per element). */
#include "kernels/cuda/nn_util.h"

#include <type_traits>

namespace {

/* ---- rms_norm ---------------------------------------------------------------------------------- */

/* mode 0: rms (mean of squares), 1: l2 (sum of squares); gated: y also times silu(z).
 * add (add_rms_norm only): the row normalised is s = x + add as written to sum (rounded to S: the
 * backward reads the stored s, so the forward normalises the same values).
 * A lane handles units of V consecutive elements (V = 8: bf16, D a multiple of 8, every array
 * 16-byte aligned; else V = 1, element by element). */
template <typename S, int G, int V>
__global__ void __launch_bounds__(kNnThreads)
    norm_fwd_kernel(int64_t N, int64_t D, const S *x, const S *add, const S *z, const S *w, double eps, int mode, S *y,
                    S *sum, nn_compute<S> *rstd) {
    typedef nn_compute<S> C;
    typedef nn_acc<S> A;
    __shared__ A smem[kNnThreads / 32];
    constexpr int RPB = kNnThreads / G;
    const int lane = threadIdx.x % G;
    for (int64_t base = (int64_t)blockIdx.x * RPB; base < N; base += (int64_t)gridDim.x * RPB) {
        int64_t row = base + threadIdx.x / G;
        bool active = row < N;
        int64_t o = (active ? row : 0) * D;
        const S *xr = x + o, *ar = add ? add + o : nullptr;
        A ss = 0;
        if (active)
            for (int64_t d = (int64_t)lane * V; d < D; d += (int64_t)G * V) {
                C v[V], av[V];
                nn_ldv<V>(xr, d, v);
                if (ar) nn_ldv<V>(ar, d, av);
#pragma unroll
                for (int e = 0; e < V; e++) {
                    if (ar) v[e] = nn_round<S>(v[e] + av[e]);
                    ss += (A)v[e] * (A)v[e];
                }
            }
        ss = nn_group_sum<G>(ss, smem);
        if (!active) continue;
        C r = (C)(1.0 / sqrt((mode == 0 ? (double)ss / (double)D : (double)ss) + eps));
        if (lane == 0 && rstd) rstd[row] = r;
        const S *zr = z ? z + o : nullptr;
        for (int64_t d = (int64_t)lane * V; d < D; d += (int64_t)G * V) {
            C xv[V], av[V], wv[V], zv[V], out[V];
            nn_ldv<V>(xr, d, xv);
            if (ar) {
                nn_ldv<V>(ar, d, av);
#pragma unroll
                for (int e = 0; e < V; e++) xv[e] = nn_round<S>(xv[e] + av[e]);
                nn_stv<V>(sum, o + d, xv);
            }
            if (w) nn_ldv<V>(w, d, wv);
            if (zr) nn_ldv<V>(zr, d, zv);
#pragma unroll
            for (int e = 0; e < V; e++) {
                C v = xv[e] * r;
                if (w) v = v * wv[e];
                if (zr) v = v * zv[e] * nn_sigmoid(zv[e]); /* the CPU kernel's order of products */
                out[e] = v;
            }
            nn_stv<V>(y, o + d, out);
        }
    }
}

/* rms / gated rms backward of dx and dz, per row:
 *   forward y = xh (w silu(z)), xh = x r: the gradient reaching xh is g = dy w silu(z);
 *   dx = r (g - x c), c = r^2 sum_d(g_d x_d) / D;
 *   forward y = (x r w) silu(z): dz = dy x r w silu'(z), silu'(z) = s (1 + z (1 - s)).
 * add_rms_norm (dsum not NULL): x is the stored sum s, whose own gradient dsum reaches it too, so
 *   ds = dsum + r (g - s c), written to dx (the gradient of both terms of the sum).
 * Units of V elements as in norm_fwd_kernel. */
template <typename S, int G, int V>
__global__ void __launch_bounds__(kNnThreads, 3) /* three blocks an SM: 98 registers a thread left it at two */
    rms_bwd_kernel(int64_t N, int64_t D, const S *x, const S *z, const S *w, const nn_compute<S> *rstd, const S *dy,
                   const S *dsum, S *dx, S *dz) {
    typedef nn_compute<S> C;
    typedef nn_acc<S> A;
    __shared__ A smem[kNnThreads / 32];
    constexpr int RPB = kNnThreads / G;
    const int lane = threadIdx.x % G;
    for (int64_t base = (int64_t)blockIdx.x * RPB; base < N; base += (int64_t)gridDim.x * RPB) {
        int64_t row = base + threadIdx.x / G;
        bool active = row < N;
        int64_t o = (active ? row : 0) * D;
        const S *xr = x + o, *dyr = dy + o, *zr = z ? z + o : nullptr;
        A dot = 0;
        if (active && dx)
            for (int64_t d = (int64_t)lane * V; d < D; d += (int64_t)G * V) {
                C g[V], xv[V], wv[V], zv[V];
                nn_ldv<V>(dyr, d, g);
                nn_ldv<V>(xr, d, xv);
                if (w) nn_ldv<V>(w, d, wv);
                if (zr) nn_ldv<V>(zr, d, zv);
#pragma unroll
                for (int e = 0; e < V; e++) {
                    if (w) g[e] = g[e] * wv[e];
                    if (zr) g[e] = g[e] * zv[e] * nn_sigmoid(zv[e]);
                    dot += (A)g[e] * (A)xv[e];
                }
            }
        dot = nn_group_sum<G>(dot, smem);
        if (!active) continue;
        C r = rstd[row];
        C c = (C)((double)dot * (double)r * (double)r / (double)D);
        for (int64_t d = (int64_t)lane * V; d < D; d += (int64_t)G * V) {
            C xv[V], wv[V], dyv[V], zv[V], dsv[V], dxo[V], dzo[V];
            nn_ldv<V>(xr, d, xv);
            nn_ldv<V>(dyr, d, dyv);
            if (w) nn_ldv<V>(w, d, wv);
            if (zr) nn_ldv<V>(zr, d, zv);
            if (dsum) nn_ldv<V>(dsum + o, d, dsv);
#pragma unroll
            for (int e = 0; e < V; e++) {
                C wd = w ? wv[e] : C(1);
                if (zr) {
                    C s = nn_sigmoid(zv[e]);
                    dzo[e] = dyv[e] * xv[e] * r * wd * s * (C(1) + zv[e] * (C(1) - s));
                    dxo[e] = r * (dyv[e] * wd * zv[e] * s - xv[e] * c);
                } else {
                    dxo[e] = r * (dyv[e] * wd - xv[e] * c);
                    if (dsum) dxo[e] += dsv[e];
                }
            }
            if (zr && dz) nn_stv<V>(dz, o + d, dzo);
            if (dx) nn_stv<V>(dx, o + d, dxo);
        }
    }
}

/* dw[d] = sum_n dy x r (gated: times silu(z); add_rms_norm: x is the stored sum) */
template <typename S> struct RmsDwTerm {
    const S *x, *z, *dy;
    const nn_compute<S> *rstd;
    int64_t D;
    __device__ nn_acc<S> operator()(int64_t n, int64_t d) const {
        typedef nn_compute<S> C;
        int64_t i = n * D + d;
        C xv = nn_ld(x, i);
        C v = nn_ld(dy, i) * xv * rstd[n];
        if (z) {
            C zv = nn_ld(z, i);
            v = v * zv * nn_sigmoid(zv);
        }
        return (nn_acc<S>)v;
    }
};

/* l2norm backward: forward y_j = x_j r, dx_j = r (dy_j - x_j c), c = r^2 sum_d(dy_d x_d) */
template <typename S, int G>
__global__ void __launch_bounds__(kNnThreads)
    l2_bwd_kernel(int64_t N, int64_t D, const S *x, const nn_compute<S> *rstd, const S *dy, S *dx) {
    typedef nn_compute<S> C;
    typedef nn_acc<S> A;
    __shared__ A smem[kNnThreads / 32];
    constexpr int RPB = kNnThreads / G;
    const int lane = threadIdx.x % G;
    for (int64_t base = (int64_t)blockIdx.x * RPB; base < N; base += (int64_t)gridDim.x * RPB) {
        int64_t row = base + threadIdx.x / G;
        bool active = row < N;
        int64_t o = (active ? row : 0) * D;
        A dot = 0;
        if (active)
            for (int64_t d = lane; d < D; d += G) dot += (A)nn_ld(dy, o + d) * (A)nn_ld(x, o + d);
        dot = nn_group_sum<G>(dot, smem);
        if (!active) continue;
        C r = rstd[row];
        C c = (C)((double)dot * (double)r * (double)r);
        for (int64_t d = lane; d < D; d += G) nn_st(dx, o + d, r * (nn_ld(dy, o + d) - nn_ld(x, o + d) * c));
    }
}

/* The pointers of one call, typed by the entry points below (absent ones NULL). */
struct NormArgs {
    const void *x, *add, *z, *w, *dy, *dsum, *rstd;
    double eps;
    int mode;
    void *y, *sum, *rstd_out, *dx, *dz, *dw;
};

/* bf16 rows may go 8 elements a load: D a multiple of 8 and every array given 16-byte aligned */
bool rows_vec8(int64_t D, const NormArgs &a) {
    if (D % kBf16Vec) return false;
    const void *p[] = {a.x, a.add, a.z, a.w, a.dy, a.dsum, a.y, a.sum, a.dx, a.dz};
    for (const void *q : p)
        if (!bf16x8_aligned(q)) return false;
    return true;
}

template <typename S, int V> int norm_fwd_v(int64_t N, int64_t D, const NormArgs &a) {
    typedef nn_compute<S> C;
    int G = nn_group_for_units(D, V);
    unsigned grid = nn_row_grid(N, G);
    cudaStream_t s = dg_cuda_stream();
    nn_with_group(G, [&](auto g) {
        norm_fwd_kernel<S, decltype(g)::value, V>
            <<<grid, kNnThreads, 0, s>>>(N, D, (const S *)a.x, (const S *)a.add, (const S *)a.z, (const S *)a.w, a.eps,
                                         a.mode, (S *)a.y, (S *)a.sum, (C *)a.rstd_out);
    });
    return DG_LAUNCHED(a.mode ? "l2norm fwd" : "rms_norm fwd");
}

template <typename S> int norm_fwd(int64_t N, int64_t D, const NormArgs &a) {
    if constexpr (std::is_same<S, __nv_bfloat16>::value)
        return rows_vec8(D, a) ? norm_fwd_v<S, kBf16Vec>(N, D, a) : norm_fwd_v<S, 1>(N, D, a);
    else return norm_fwd_v<S, 1>(N, D, a);
}

template <typename S, int V> int rms_bwd_rows(int64_t N, int64_t D, const NormArgs &a) {
    typedef nn_compute<S> C;
    int G = nn_group_for_units(D, V);
    unsigned grid = nn_row_grid(N, G);
    cudaStream_t s = dg_cuda_stream();
    nn_with_group(G, [&](auto g) {
        rms_bwd_kernel<S, decltype(g)::value, V>
            <<<grid, kNnThreads, 0, s>>>(N, D, (const S *)a.x, (const S *)a.z, (const S *)a.w, (const C *)a.rstd,
                                         (const S *)a.dy, (const S *)a.dsum, (S *)a.dx, (S *)a.dz);
    });
    return DG_LAUNCHED(a.z ? "gated_rms_norm bwd" : "rms_norm bwd");
}

template <typename S> int rms_bwd(int64_t N, int64_t D, const NormArgs &a) {
    typedef nn_compute<S> C;
    if (a.dx || a.dz) {
        int rc;
        if constexpr (std::is_same<S, __nv_bfloat16>::value)
            rc = rows_vec8(D, a) ? rms_bwd_rows<S, kBf16Vec>(N, D, a) : rms_bwd_rows<S, 1>(N, D, a);
        else rc = rms_bwd_rows<S, 1>(N, D, a);
        if (rc) return -1;
    }
    if (a.dw) {
        RmsDwTerm<S> term{(const S *)a.x, (const S *)a.z, (const S *)a.dy, (const C *)a.rstd, D};
        return nn_column_sums(term, N, D, (S *)a.dw, "rms_norm dw");
    }
    return 0;
}

template <typename S> int l2_bwd(int64_t N, int64_t D, const NormArgs &a) {
    typedef nn_compute<S> C;
    int G = nn_group_for(D);
    unsigned grid = nn_row_grid(N, G);
    cudaStream_t s = dg_cuda_stream();
    if (G == 32)
        l2_bwd_kernel<S, 32>
            <<<grid, kNnThreads, 0, s>>>(N, D, (const S *)a.x, (const C *)a.rstd, (const S *)a.dy, (S *)a.dx);
    else
        l2_bwd_kernel<S, 256>
            <<<grid, kNnThreads, 0, s>>>(N, D, (const S *)a.x, (const C *)a.rstd, (const S *)a.dy, (S *)a.dx);
    return DG_LAUNCHED("l2norm bwd");
}

bool ready(const char *who, dg_dtype dt, int64_t N, int64_t D) {
    if (!nn_float_or_bf16_dt(who, dt)) return false;
    if (N < 0 || D < 0) {
        dg_error("%s: negative size (N %lld, D %lld)", who, (long long)N, (long long)D);
        return false;
    }
    return dg_cuda_init() == 0;
}

/* F<S>(N, D, args) for S the storage type named by dt */
template <template <typename> class F> int by_dtype(dg_dtype dt, int64_t N, int64_t D, const NormArgs &a) {
    switch (dt) {
    case DG_F32: return F<float>::run(N, D, a);
    case DG_F64: return F<double>::run(N, D, a);
    default: return F<__nv_bfloat16>::run(N, D, a);
    }
}
template <typename S> struct Fwd {
    static int run(int64_t N, int64_t D, const NormArgs &a) { return norm_fwd<S>(N, D, a); }
};
template <typename S> struct RmsBwd {
    static int run(int64_t N, int64_t D, const NormArgs &a) { return rms_bwd<S>(N, D, a); }
};
template <typename S> struct L2Bwd {
    static int run(int64_t N, int64_t D, const NormArgs &a) { return l2_bwd<S>(N, D, a); }
};

} // namespace

extern "C" {

int dg_cuda_rms_norm_fwd(dg_dtype dt, int64_t N, int64_t D, const void *x, const void *w, double eps, void *y,
                         void *rstd) {
    if (!ready("cuda rms_norm", dt, N, D)) return -1;
    if (N == 0) return 0;
    NormArgs a = {};
    a.x = x, a.w = w, a.eps = eps, a.y = y, a.rstd_out = rstd;
    return by_dtype<Fwd>(dt, N, D, a);
}

int dg_cuda_rms_norm_bwd(dg_dtype dt, int64_t N, int64_t D, const void *x, const void *w, const void *rstd,
                         const void *dy, void *dx, void *dw) {
    if (!ready("cuda rms_norm bwd", dt, N, D)) return -1;
    NormArgs a = {};
    a.x = x, a.w = w, a.rstd = rstd, a.dy = dy, a.dx = dx, a.dw = dw;
    return by_dtype<RmsBwd>(dt, N, D, a);
}

int dg_cuda_gated_rms_norm_fwd(dg_dtype dt, int64_t N, int64_t D, const void *x, const void *z, const void *w,
                               double eps, void *y, void *rstd) {
    if (!ready("cuda gated_rms_norm", dt, N, D)) return -1;
    if (N == 0) return 0;
    NormArgs a = {};
    a.x = x, a.z = z, a.w = w, a.eps = eps, a.y = y, a.rstd_out = rstd;
    return by_dtype<Fwd>(dt, N, D, a);
}

int dg_cuda_gated_rms_norm_bwd(dg_dtype dt, int64_t N, int64_t D, const void *x, const void *z, const void *w,
                               const void *rstd, const void *dy, void *dx, void *dz, void *dw) {
    if (!ready("cuda gated_rms_norm bwd", dt, N, D)) return -1;
    NormArgs a = {};
    a.x = x, a.z = z, a.w = w, a.rstd = rstd, a.dy = dy, a.dx = dx, a.dz = dz, a.dw = dw;
    return by_dtype<RmsBwd>(dt, N, D, a);
}

int dg_cuda_l2norm_fwd(dg_dtype dt, int64_t N, int64_t D, const void *x, double eps, void *y, void *rstd) {
    if (!ready("cuda l2norm", dt, N, D)) return -1;
    if (N == 0) return 0;
    NormArgs a = {};
    a.x = x, a.eps = eps, a.mode = 1, a.y = y, a.rstd_out = rstd;
    return by_dtype<Fwd>(dt, N, D, a);
}

int dg_cuda_l2norm_bwd(dg_dtype dt, int64_t N, int64_t D, const void *x, const void *rstd, const void *dy, void *dx) {
    if (!ready("cuda l2norm bwd", dt, N, D)) return -1;
    if (N == 0 || !dx) return 0;
    NormArgs a = {};
    a.x = x, a.rstd = rstd, a.dy = dy, a.dx = dx;
    return by_dtype<L2Bwd>(dt, N, D, a);
}

/* In the kernels' terms: the row normalised is x + add with x = h, add = y; the kernels' output y
 * is the op's x, their output sum the op's r. */
int dg_cuda_add_rms_norm_fwd(dg_dtype dt, int64_t N, int64_t D, const void *h, const void *y, const void *w, double eps,
                             void *x, void *r, void *rstd) {
    if (!ready("cuda add_rms_norm", dt, N, D)) return -1;
    if (N == 0) return 0;
    NormArgs a = {};
    a.x = h, a.add = y, a.w = w, a.eps = eps, a.y = x, a.sum = r, a.rstd_out = rstd;
    return by_dtype<Fwd>(dt, N, D, a);
}

int dg_cuda_add_rms_norm_bwd(dg_dtype dt, int64_t N, int64_t D, const void *r, const void *w, const void *rstd,
                             const void *dx, const void *dr, void *dr_total, void *dw) {
    if (!ready("cuda add_rms_norm bwd", dt, N, D)) return -1;
    NormArgs a = {};
    a.x = r, a.w = w, a.rstd = rstd, a.dy = dx, a.dsum = dr, a.dx = dr_total, a.dw = dw;
    return by_dtype<RmsBwd>(dt, N, D, a);
}

} // extern "C"
