/* The in-op gate, the bf16 / fp16 L2 norm and chunk_local_cumsum on the device (dr_pieces_cuda.h).
 *
 * gate:    g[r,h,c] = -exp(A_log[h]) softplus(x),  x = a[r,h,c] + dt_bias[h*C+c]
 *          softplus(x) = x above 20 (FLA's threshold), else max(x,0) + log1p(exp(-|x|));
 *          computed in double for both f32 and f64 (as the CPU kernel), rounded once.
 *          backward: da = dg (-exp(A_log)) softplus'(x) (sigmoid, 1 above 20);
 *          dA_log[h] = sum_{r,c} dg g;  ddt_bias[h*C+c] = sum_r da  (fixed-order column sums).
 * l2norm:  a warp per row of 16-bit values (bf16 or fp16: H = __nv_bfloat16 or __half), f32 inside,
 *          8-byte vectors for rows of 128, 256 or 512 values;
 *          r = 1/sqrt(sum x^2 + eps), y = x r, rounded once to H;
 *          dx = r (dy - x r^2 sum(dy x)).
 * cumsum:  one thread per (chunk, head, channel), walking the chunk's rows in order. */
#include "kernels/cuda/delta/dr_l2norm_row.cuh"
#include "kernels/cuda/delta/dr_pieces_chunks.cuh"
#include "kernels/cuda/nn_util.h"

namespace {

__device__ __forceinline__ double drp_softplus(double x) { return x > 20.0 ? x : fmax(x, 0.0) + log1p(exp(-fabs(x))); }
__device__ __forceinline__ double drp_softplus_grad(double x) {
    if (x > 20.0) return 1.0;
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

template <typename T>
__global__ void gate_fwd_kernel(int64_t n, int64_t HV, int64_t C, const T *a, const T *A_log, const T *dt_bias, T *g) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t m = i % (HV * C), h = m / C;
        double x = (double)a[i] + (dt_bias ? (double)dt_bias[m] : 0.0);
        g[i] = (T)(-exp((double)A_log[h]) * drp_softplus(x));
    }
}

template <typename T>
__global__ void gate_da_kernel(int64_t n, int64_t HV, int64_t C, const T *a, const T *A_log, const T *dt_bias,
                               const T *dg, T *da) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t m = i % (HV * C), h = m / C;
        double x = (double)a[i] + (dt_bias ? (double)dt_bias[m] : 0.0);
        da[i] = (T)((double)dg[i] * -exp((double)A_log[h]) * drp_softplus_grad(x));
    }
}

/* term(r, m) of ddt_bias: da at row r, column m = h*C + c */
template <typename T> struct GateDdtTerm {
    int64_t HV, C;
    const T *a, *A_log, *dt_bias, *dg;
    __device__ double operator()(int64_t r, int64_t m) const {
        int64_t i = r * HV * C + m;
        double x = (double)a[i] + (dt_bias ? (double)dt_bias[m] : 0.0);
        return (double)dg[i] * -exp((double)A_log[m / C]) * drp_softplus_grad(x);
    }
};

/* term(r, h) of dA_log: sum_c dg g at row r, head h */
template <typename T> struct GateDATerm {
    int64_t HV, C;
    const T *a, *A_log, *dt_bias, *dg;
    __device__ double operator()(int64_t r, int64_t h) const {
        double negA = -exp((double)A_log[h]), acc = 0;
        for (int64_t c = 0; c < C; c++) {
            int64_t m = h * C + c, i = r * HV * C + m;
            double x = (double)a[i] + (dt_bias ? (double)dt_bias[m] : 0.0);
            acc += (double)dg[i] * negA * drp_softplus(x);
        }
        return acc;
    }
};

template <typename T>
int gate_bwd(int64_t rows, int64_t HV, int64_t C, const T *a, const T *A_log, const T *dt_bias, const T *dg, T *da,
             T *dA_log, T *ddt_bias, dg_dtype dt) {
    int64_t n = rows * HV * C;
    if (da && n > 0) {
        gate_da_kernel<T>
            <<<dg_grid_for(n, kNnThreads), kNnThreads, 0, dg_cuda_stream()>>>(n, HV, C, a, A_log, dt_bias, dg, da);
        if (DG_LAUNCHED("dr gate bwd (da)")) return -1;
    }
    if (ddt_bias) {
        GateDdtTerm<T> term{HV, C, a, A_log, dt_bias, dg};
        if (nn_column_sums(dt, term, rows, HV * C, ddt_bias, "dr gate bwd (ddt_bias)")) return -1;
    }
    if (dA_log) {
        GateDATerm<T> term{HV, C, a, A_log, dt_bias, dg};
        if (nn_column_sums(dt, term, rows, HV, dA_log, "dr gate bwd (dA_log)")) return -1;
    }
    return 0;
}

/* ---- 16-bit L2 norm: a warp per row; H = __nv_bfloat16 (bf16) or __half (fp16) ---- */
__device__ __forceinline__ float ld16(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ float ld16(const __half *p) { return __half2float(*p); }
__device__ __forceinline__ void st16(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void st16(__half *p, float v) { *p = __float2half_rn(v); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

template <typename H>
__global__ void l2norm16_fwd_kernel(int64_t N, int64_t D, const H *x, float eps, H *y, float *rstd) {
    const int lane = threadIdx.x % 32, wpb = blockDim.x / 32;
    for (int64_t row = blockIdx.x * (int64_t)wpb + threadIdx.x / 32; row < N; row += (int64_t)gridDim.x * wpb) {
        const H *xr = x + row * D;
        float ss = 0;
        for (int64_t d = lane; d < D; d += 32) {
            float v = ld16(xr + d);
            ss += v * v;
        }
        float r = rsqrtf(warp_sum(ss) + eps);
        if (rstd && lane == 0) rstd[row] = r;
        for (int64_t d = lane; d < D; d += 32) st16(y + row * D + d, ld16(xr + d) * r);
    }
}

/* dx = r (dy - x r^2 (dy . x)), a warp a row */
template <typename H>
__global__ void l2norm16_bwd_kernel(int64_t N, int64_t D, const H *x, const float *rstd, const H *dy, H *dx) {
    const int lane = threadIdx.x % 32, wpb = blockDim.x / 32;
    for (int64_t row = blockIdx.x * (int64_t)wpb + threadIdx.x / 32; row < N; row += (int64_t)gridDim.x * wpb) {
        const H *xr = x + row * D, *dyr = dy + row * D;
        float dot = 0;
        for (int64_t d = lane; d < D; d += 32) dot += ld16(dyr + d) * ld16(xr + d);
        float r = rstd[row], c = warp_sum(dot) * r * r;
        for (int64_t d = lane; d < D; d += 32) st16(dx + row * D + d, r * (ld16(dyr + d) - ld16(xr + d) * c));
    }
}

/* The same for rows of D = 32 E NV values (E = 4: D = 128, 256, 512; E = 2: D = 64; 2 E-byte
 * aligned): lane l holds the E values at 32 E j + E l, j < NV, loaded and stored as one 2 E-byte
 * vector each, so that a row is one coalesced request per 32 E values and is read once (the loops
 * above load 2-byte values one at a time and read x twice).  r: l2_rnorm (dr_l2norm_row.cuh), the
 * lane's values in the order j, then i -- the chunk kernels that normalise as they load
 * (dr_chunk_l2norm.cuh) hold the same values in the same order, so they make the same bits. */
template <int E> struct VecE;
template <> struct VecE<4> { using type = uint2; };
template <> struct VecE<2> { using type = uint32_t; };
template <typename H, int E> __device__ __forceinline__ void ld_vec(const H *p, float *v) {
    const typename VecE<E>::type u = *reinterpret_cast<const typename VecE<E>::type *>(p);
    const H *h = reinterpret_cast<const H *>(&u);
#pragma unroll
    for (int i = 0; i < E; i++) v[i] = ld16(h + i);
}
template <typename H, int E> __device__ __forceinline__ void st_vec(H *p, const float *v) {
    typename VecE<E>::type u;
    H *h = reinterpret_cast<H *>(&u);
#pragma unroll
    for (int i = 0; i < E; i++) st16(h + i, v[i]);
    *reinterpret_cast<typename VecE<E>::type *>(p) = u;
}
__device__ __forceinline__ float xor_shfl(float x, int off) { return __shfl_xor_sync(0xffffffffu, x, off); }

template <typename H, int NV, int E = 4>
__global__ void l2norm16_fwd_vec_kernel(int64_t N, const H *x, float eps, H *y, float *rstd) {
    constexpr int D = 32 * E * NV;
    const int lane = threadIdx.x % 32, wpb = blockDim.x / 32;
    for (int64_t row = blockIdx.x * (int64_t)wpb + threadIdx.x / 32; row < N; row += (int64_t)gridDim.x * wpb) {
        const int64_t o = row * D + E * lane;
        float v[NV * E];
#pragma unroll
        for (int j = 0; j < NV; j++) ld_vec<H, E>(x + o + 32 * E * j, v + E * j);
        const float r = l2_rnorm(v, eps, xor_shfl);
        if (rstd && lane == 0) rstd[row] = r;
#pragma unroll
        for (int i = 0; i < NV * E; i++) v[i] *= r;
#pragma unroll
        for (int j = 0; j < NV; j++) st_vec<H, E>(y + o + 32 * E * j, v + E * j);
    }
}

template <typename H, int NV>
__global__ void l2norm16_bwd_vec_kernel(int64_t N, const H *x, const float *rstd, const H *dy, H *dx) {
    constexpr int D = 128 * NV;
    const int lane = threadIdx.x % 32, wpb = blockDim.x / 32;
    for (int64_t row = blockIdx.x * (int64_t)wpb + threadIdx.x / 32; row < N; row += (int64_t)gridDim.x * wpb) {
        const int64_t o = row * D + 4 * lane;
        float xv[NV][4], gv[NV][4], dot = 0;
#pragma unroll
        for (int j = 0; j < NV; j++) {
            ld_vec<H, 4>(x + o + 128 * j, xv[j]);
            ld_vec<H, 4>(dy + o + 128 * j, gv[j]);
#pragma unroll
            for (int i = 0; i < 4; i++) dot += gv[j][i] * xv[j][i];
        }
        const float r = rstd[row], c = warp_sum(dot) * r * r;
#pragma unroll
        for (int j = 0; j < NV; j++) {
#pragma unroll
            for (int i = 0; i < 4; i++) gv[j][i] = r * (gv[j][i] - xv[j][i] * c);
            st_vec<H, 4>(dx + o + 128 * j, gv[j]);
        }
    }
}

/* NV of the vector kernels (E = 4) for rows of D values at these pointers, -1 for D = 64 (the
 * forward's E = 2 kernel), or 0 (the scalar kernels) */
static int l2norm_nv(int64_t D, const void *a, const void *b, const void *c = nullptr, const void *d = nullptr) {
    const void *p[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++)
        if (p[i] && ((uintptr_t)p[i] & 7)) return 0;
    return D == 64 ? -1 : D == 128 ? 1 : D == 256 ? 2 : D == 512 ? 4 : 0;
}

/* the entry points: the caller's uint16_t bits read as H; who names the entry point in messages */
template <typename H>
int l2norm16_fwd(const char *who, int64_t N, int64_t D, const uint16_t *x, double eps, uint16_t *y, float *rstd) {
    if (N <= 0 || D <= 0) return 0;
    if (!x || !y) {
        dg_error("%s: %s is NULL", who, !x ? "x" : "y");
        return -1;
    }
    if (dg_cuda_init()) return -1;
    const int grid = dg_grid_for(N * 32, kNnThreads), nv = l2norm_nv(D, x, y);
    cudaStream_t st = dg_cuda_stream();
    const H *xh = (const H *)x;
    H *yh = (H *)y;
    const float e = (float)eps;
    if (nv < 0) l2norm16_fwd_vec_kernel<H, 1, 2><<<grid, kNnThreads, 0, st>>>(N, xh, e, yh, rstd);
    else if (nv == 1) l2norm16_fwd_vec_kernel<H, 1><<<grid, kNnThreads, 0, st>>>(N, xh, e, yh, rstd);
    else if (nv == 2) l2norm16_fwd_vec_kernel<H, 2><<<grid, kNnThreads, 0, st>>>(N, xh, e, yh, rstd);
    else if (nv == 4) l2norm16_fwd_vec_kernel<H, 4><<<grid, kNnThreads, 0, st>>>(N, xh, e, yh, rstd);
    else l2norm16_fwd_kernel<H><<<grid, kNnThreads, 0, st>>>(N, D, xh, e, yh, rstd);
    return DG_LAUNCHED(who);
}

template <typename H>
int l2norm16_bwd(const char *who, int64_t N, int64_t D, const uint16_t *x, const float *rstd, const uint16_t *dy,
                 uint16_t *dx) {
    if (N <= 0 || D <= 0) return 0;
    if (!x || !rstd || !dy || !dx) {
        dg_error("%s: %s is NULL", who, !x ? "x" : !rstd ? "rstd" : !dy ? "dy" : "dx");
        return -1;
    }
    if (dg_cuda_init()) return -1;
    const int grid = dg_grid_for(N * 32, kNnThreads), nv = l2norm_nv(D, x, dy, dx);
    cudaStream_t st = dg_cuda_stream();
    const H *xh = (const H *)x, *gh = (const H *)dy;
    H *oh = (H *)dx;
    if (nv == 1) l2norm16_bwd_vec_kernel<H, 1><<<grid, kNnThreads, 0, st>>>(N, xh, rstd, gh, oh);
    else if (nv == 2) l2norm16_bwd_vec_kernel<H, 2><<<grid, kNnThreads, 0, st>>>(N, xh, rstd, gh, oh);
    else if (nv == 4) l2norm16_bwd_vec_kernel<H, 4><<<grid, kNnThreads, 0, st>>>(N, xh, rstd, gh, oh);
    else l2norm16_bwd_kernel<H><<<grid, kNnThreads, 0, st>>>(N, D, xh, rstd, gh, oh);
    return DG_LAUNCHED(who);
}

/* ---- chunk_local_cumsum ---- */
template <typename T>
__global__ void cumsum_kernel(int64_t nchunks, int64_t HS, const int64_t *row0, const int *len, int reverse, const T *x,
                              T *out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nchunks * HS;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t c = i / HS, m = i % HS, base = row0[c] * HS + m;
        int L = len[c];
        T acc = 0;
        for (int j = 0; j < L; j++) {
            int64_t at = base + (int64_t)(reverse ? L - 1 - j : j) * HS;
            acc += x[at];
            out[at] = acc;
        }
    }
}

} // namespace

extern "C" int dg_cuda_dr_gate_fwd(dg_dtype dt, int64_t rows, int64_t HV, int64_t C, const void *a, const void *A_log,
                                   const void *dt_bias, void *g) {
    if (!nn_float_dt("cuda dr gate", dt)) return -1;
    if (!a || !A_log || !g) {
        dg_error("cuda dr gate: %s is NULL", !a ? "a" : !A_log ? "A_log" : "g");
        return -1;
    }
    int64_t n = rows * HV * C;
    if (n <= 0) return 0;
    if (dg_cuda_init()) return -1;
    unsigned grid = dg_grid_for(n, kNnThreads);
    if (dt == DG_F32)
        gate_fwd_kernel<float><<<grid, kNnThreads, 0, dg_cuda_stream()>>>(
            n, HV, C, (const float *)a, (const float *)A_log, (const float *)dt_bias, (float *)g);
    else
        gate_fwd_kernel<double><<<grid, kNnThreads, 0, dg_cuda_stream()>>>(
            n, HV, C, (const double *)a, (const double *)A_log, (const double *)dt_bias, (double *)g);
    return DG_LAUNCHED("dr gate fwd");
}

extern "C" int dg_cuda_dr_gate_bwd(dg_dtype dt, int64_t rows, int64_t HV, int64_t C, const void *a, const void *A_log,
                                   const void *dt_bias, const void *dg, void *da, void *dA_log, void *ddt_bias) {
    if (!nn_float_dt("cuda dr gate bwd", dt)) return -1;
    if (!a || !A_log || !dg || (ddt_bias && !dt_bias)) {
        dg_error("cuda dr gate bwd: %s", !a       ? "a is NULL"
                                         : !A_log ? "A_log is NULL"
                                         : !dg    ? "dg is NULL"
                                                  : "ddt_bias without dt_bias");
        return -1;
    }
    if (rows < 0 || HV < 1 || C < 1) {
        dg_error("cuda dr gate bwd: rows %lld, HV %lld, C %lld", (long long)rows, (long long)HV, (long long)C);
        return -1;
    }
    if (dg_cuda_init()) return -1;
    if (dt == DG_F32)
        return gate_bwd<float>(rows, HV, C, (const float *)a, (const float *)A_log, (const float *)dt_bias,
                               (const float *)dg, (float *)da, (float *)dA_log, (float *)ddt_bias, dt);
    return gate_bwd<double>(rows, HV, C, (const double *)a, (const double *)A_log, (const double *)dt_bias,
                            (const double *)dg, (double *)da, (double *)dA_log, (double *)ddt_bias, dt);
}

extern "C" int dg_cuda_dr_l2norm_bf16_fwd(int64_t N, int64_t D, const uint16_t *x, double eps, uint16_t *y,
                                          float *rstd) {
    return l2norm16_fwd<__nv_bfloat16>("cuda dr l2norm bf16 fwd", N, D, x, eps, y, rstd);
}

extern "C" int dg_cuda_dr_l2norm_bf16_bwd(int64_t N, int64_t D, const uint16_t *x, const float *rstd,
                                          const uint16_t *dy, uint16_t *dx) {
    return l2norm16_bwd<__nv_bfloat16>("cuda dr l2norm bf16 bwd", N, D, x, rstd, dy, dx);
}

extern "C" int dg_cuda_dr_l2norm_f16_fwd(int64_t N, int64_t D, const uint16_t *x, double eps, uint16_t *y,
                                         float *rstd) {
    return l2norm16_fwd<__half>("cuda dr l2norm f16 fwd", N, D, x, eps, y, rstd);
}

extern "C" int dg_cuda_dr_l2norm_f16_bwd(int64_t N, int64_t D, const uint16_t *x, const float *rstd, const uint16_t *dy,
                                         uint16_t *dx) {
    return l2norm16_bwd<__half>("cuda dr l2norm f16 bwd", N, D, x, rstd, dy, dx);
}

extern "C" int dg_cuda_chunk_local_cumsum(dg_dtype dt, int64_t B, int64_t T, int64_t H, int64_t S,
                                          const int64_t *cu_seqlens, int64_t N, int chunk, int reverse, const void *x,
                                          void *out) {
    const char *what = "cuda chunk_local_cumsum";
    if (!nn_float_dt(what, dt)) return -1;
    if (!x || !out) {
        dg_error("%s: %s is NULL", what, !x ? "x" : "out");
        return -1;
    }
    if (H < 1 || S < 1) {
        dg_error("%s: H = %lld, S = %lld (need >= 1)", what, (long long)H, (long long)S);
        return -1;
    }
    if (dg_cuda_init()) return -1;
    DrpChunks ch;
    if (drp_chunks_init(&ch, what, B, T, cu_seqlens, N, chunk)) return -1;
    if (ch.n == 0) return 0;
    int64_t HS = H * S, n = ch.n * HS;
    unsigned grid = dg_grid_for(n, kNnThreads);
    if (dt == DG_F32)
        cumsum_kernel<float><<<grid, kNnThreads, 0, dg_cuda_stream()>>>(ch.n, HS, ch.row0, ch.len, reverse,
                                                                        (const float *)x, (float *)out);
    else
        cumsum_kernel<double><<<grid, kNnThreads, 0, dg_cuda_stream()>>>(ch.n, HS, ch.row0, ch.len, reverse,
                                                                         (const double *)x, (double *)out);
    int rc = DG_LAUNCHED("chunk_local_cumsum");
    drp_chunks_free(&ch);
    return rc;
}
