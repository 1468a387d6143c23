/* Internal to the nn_*.cu files (C++): the row-group reductions and the column sums that the
 * network-piece kernels share.
 *
 * Rows: a row of D elements is handled by a group of G threads (G = 32, a warp, for D <= 1024;
 * G = 256, a whole block, above), lane l reading elements l, l + G, ... so loads are coalesced
 * (or units of V = 8 elements l V, (l + G) V, ... where a kernel moves bf16 8 at a time, nn_ldv).
 * Group sums are in the accumulation type, lanes summed by a fixed butterfly (and, for G = 256,
 * the 8 warp sums in index order), so a row's result depends only on D, G and V, never on the
 * launch.
 *
 * Columns: a sum over the N rows of a per-(row, column) term (dw = sum_n dy x r, dbias, ...) runs
 * in two passes, each in blocks of 32 columns by 8 row lanes (a warp reads 32 neighbouring columns
 * of a row; lane l takes rows l, l + 8, ...; the 8 lane sums are added in lane order).  The rows
 * are cut into P chunks of at least 64 rows, P chosen from the shape alone so that pass one has
 * about a million threads whether there are many columns or few (a per-head norm weight has 128);
 * pass one writes partial sums part[p, m] in the accumulation type, pass two adds them over p the
 * same way and rounds once to the storage type.  The bits depend on the shape only.
 *
 * Types: a kernel is written once over its storage type S (float, double, __nv_bfloat16).  Values
 * are loaded into the compute type nn_compute<S> (S itself for float and double; float for bf16)
 * with nn_ld and stored back with nn_st, which rounds once.  Sums over a row or over rows run in
 * nn_acc<S>: double for float and double (the f32 kernels match the CPU ones, which also sum in
 * double), float for bf16 (mixed precision: bf16 storage, f32 arithmetic and f32 sums). */
#ifndef DG_KERNELS_CUDA_NN_UTIL_H
#define DG_KERNELS_CUDA_NN_UTIL_H

#include "kernels/cuda/bf16_vec.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/nn_cuda.h"

#include <math.h>
#include <type_traits>

constexpr int kNnThreads = 256;

/* ---- storage, compute and accumulation types ---- */
template <typename S> struct NnTypes {
    typedef S compute;
    typedef double acc;
};
template <> struct NnTypes<__nv_bfloat16> {
    typedef float compute;
    typedef float acc;
};
template <typename S> using nn_compute = typename NnTypes<S>::compute;
template <typename S> using nn_acc = typename NnTypes<S>::acc;

template <typename S> __device__ __forceinline__ S nn_ld(const S *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float nn_ld(const __nv_bfloat16 *p, int64_t i) { return __bfloat162float(p[i]); }
template <typename S> __device__ __forceinline__ void nn_st(S *p, int64_t i, S v) { p[i] = v; }
__device__ __forceinline__ void nn_st(__nv_bfloat16 *p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

/* v as storage S holds it (bf16: rounded to nearest even; f32, f64: v itself) */
template <typename S> __device__ __forceinline__ nn_compute<S> nn_round(nn_compute<S> v) {
    if constexpr (sizeof(S) == 2) return __bfloat162float(__float2bfloat16_rn(v));
    else return v;
}

/* V consecutive elements p[i .. i + V) in the compute type: V = 1 for any storage; V = 8 for bf16
 * only, p + i 16-byte aligned (bf16_vec.h).  A kernel looping over units of V elements is, with
 * V = 1, the plain per-element loop. */
template <int V, typename S> __device__ __forceinline__ void nn_ldv(const S *p, int64_t i, nn_compute<S> *out) {
    if constexpr (V == 1) out[0] = nn_ld(p, i);
    else bf16x8_load(p + i, out);
}
template <int V, typename S> __device__ __forceinline__ void nn_stv(S *p, int64_t i, const nn_compute<S> *v) {
    if constexpr (V == 1) nn_st(p, i, v[0]);
    else bf16x8_store(p + i, v);
}

/* the dtype tag of a storage type */
template <typename S> constexpr dg_dtype nn_dtype_of() {
    return sizeof(S) == 8 ? DG_F64 : (sizeof(S) == 4 ? DG_F32 : DG_BF16);
}

/* ---- math overloads so one template body serves f32 and f64 ---- */
__device__ __forceinline__ float nn_exp(float x) { return expf(x); }
__device__ __forceinline__ double nn_exp(double x) { return exp(x); }
__device__ __forceinline__ float nn_log(float x) { return logf(x); }
__device__ __forceinline__ double nn_log(double x) { return log(x); }
__device__ __forceinline__ float nn_max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double nn_max(double a, double b) { return fmax(a, b); }
/* the CPU kernels' form: 1 / (1 + exp(-z)) */
template <typename T> __device__ __forceinline__ T nn_sigmoid(T z) { return T(1) / (T(1) + nn_exp(-z)); }

/* Sum of v over the G lanes of a group (G = 8, 16, 32: aligned lanes of one warp; 256: the block),
 * returned to every lane.  smem: kNnThreads / 32 values of A (used when G = 256).  Every thread of
 * the block must call it (it holds barriers for G = 256). */
template <int G, typename A> __device__ __forceinline__ A nn_group_sum(A v, A *smem) {
#pragma unroll
    for (int off = (G < 32 ? G : 32) / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (G <= 32) return v;
    if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = v;
    __syncthreads();
    A t = 0;
#pragma unroll
    for (int w = 0; w < kNnThreads / 32; w++) t += smem[w];
    __syncthreads(); /* smem is rewritten by the next call */
    return t;
}

/* Maximum of v over the G lanes of a group, returned to every lane (same rules as nn_group_sum). */
template <int G, typename A> __device__ __forceinline__ A nn_group_max(A v, A *smem) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = nn_max(v, __shfl_xor_sync(0xffffffffu, v, off));
    if (G == 32) return v;
    if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = v;
    __syncthreads();
    A t = smem[0];
#pragma unroll
    for (int w = 1; w < kNnThreads / 32; w++) t = nn_max(t, smem[w]);
    __syncthreads();
    return t;
}

/* Group size for rows of D elements. */
static inline int nn_group_for(int64_t D) { return D > 1024 ? 256 : 32; }
/* The same for a kernel that moves V elements a lane and takes groups of 8 and 16 too: the fewest
 * lanes that cover a row (a per-head norm of 128 bf16 is 16 units of 8). */
static inline int nn_group_for_units(int64_t D, int V) {
    int64_t units = (D + V - 1) / V;
    return D > 1024 ? 256 : units <= 8 ? 8 : units <= 16 ? 16 : 32;
}
/* Calls launch(std::integral_constant<int, G>()) for G = nn_group_for_units's 8, 16, 32 or 256: a
 * kernel templated on its group size, launched for the size picked at run time. */
template <typename F> static void nn_with_group(int G, F &&launch) {
    if (G == 8) launch(std::integral_constant<int, 8>());
    else if (G == 16) launch(std::integral_constant<int, 16>());
    else if (G == 32) launch(std::integral_constant<int, 32>());
    else launch(std::integral_constant<int, 256>());
}

/* Grid for N rows handled by groups of G threads (the kernels loop over rows). */
static inline unsigned nn_row_grid(int64_t N, int G) { return dg_grid_for(N * (int64_t)G, kNnThreads); }

/* A group-per-row kernel loops
 *     for (int64_t base = blockIdx.x * RPB; base < N; base += gridDim.x * RPB) {
 *         int64_t row = base + threadIdx.x / G;  bool active = row < N;  ... }
 * with RPB = kNnThreads / G rows a block, so that every thread of a block runs the same number of
 * rounds (idle rows still reach the barriers of nn_group_sum; a warp is never split between
 * rows, so the shuffles always see all 32 lanes). */

/* The column-sum blocks: kColW columns by kColLanes row lanes. */
constexpr int kColW = 32, kColLanes = 8;

/* Number of row chunks for a sum over N rows of M columns: about 1M threads in pass one, at least
 * 64 rows (8 a lane) a chunk. */
static inline int64_t nn_col_chunks(int64_t N, int64_t M) {
    int64_t cols = (M + kColW - 1) / kColW * kColW;
    int64_t want = ((int64_t)1 << 20) / ((cols > 0 ? cols : kColW) * kColLanes);
    int64_t most = (N + 63) / 64;
    if (want > most) want = most;
    return want < 1 ? 1 : want;
}

/* The sum of the kColLanes lane values of column threadIdx.x, in lane order; valid in lane 0. */
template <typename A> __device__ __forceinline__ A nn_col_lanes_sum(A v, A (*sm)[kColW + 1]) {
    sm[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    A t = 0;
    if (threadIdx.y == 0)
#pragma unroll
        for (int l = 0; l < kColLanes; l++) t += sm[l][threadIdx.x];
    return t;
}

/* Pass one: part[p, m] = sum_{n in chunk p} term(n, m); block (column tile, chunk p).  TERM is a
 * functor with __device__ A operator()(int64_t n, int64_t m) const (A its accumulation type). */
template <typename A, typename TERM>
__global__ void __launch_bounds__(kColW *kColLanes)
    nn_col_partial_kernel(TERM term, int64_t N, int64_t M, int64_t chunk, A *part) {
    __shared__ A sm[kColLanes][kColW + 1];
    const int64_t m = blockIdx.x * (int64_t)kColW + threadIdx.x, p = blockIdx.y;
    const int64_t n0 = p * chunk, n1 = n0 + chunk < N ? n0 + chunk : N;
    A acc = 0;
    if (m < M)
        for (int64_t n = n0 + threadIdx.y; n < n1; n += kColLanes) acc += term(n, m);
    acc = nn_col_lanes_sum(acc, sm);
    if (threadIdx.y == 0 && m < M) part[p * M + m] = acc;
}

/* Pass two: out[m] = sum_p part[p, m], rounded once to S; block per column tile. */
template <typename S, typename A>
__global__ void __launch_bounds__(kColW *kColLanes) nn_colsum_kernel(int64_t P, int64_t M, const A *part, S *out) {
    __shared__ A sm[kColLanes][kColW + 1];
    const int64_t m = blockIdx.x * (int64_t)kColW + threadIdx.x;
    A acc = 0;
    if (m < M)
        for (int64_t p = threadIdx.y; p < P; p += kColLanes) acc += part[p * M + m];
    acc = nn_col_lanes_sum(acc, sm);
    if (threadIdx.y == 0 && m < M) nn_st(out, m, (nn_compute<S>)acc);
}

/* Launches pass two (also for callers that wrote their own partials). */
template <typename S, typename A>
static int nn_colsum_launch(int64_t P, int64_t M, const A *part, S *out, const char *name) {
    if (M <= 0) return 0;
    nn_colsum_kernel<S, A>
        <<<(unsigned)((M + kColW - 1) / kColW), dim3(kColW, kColLanes), 0, dg_cuda_stream()>>>(P, M, part, out);
    return DG_LAUNCHED(name);
}

/* Pass two alone for double partial sums, added strictly in order of p, into an f32 or f64 out
 * (the optimiser's norms: its fused and unfused paths must add alike). */
int dg_cuda_nn_colsum(dg_dtype dt, int64_t P, int64_t M, const double *part, void *out);

/* Both passes: out[m] = sum_n term(n, m), out of storage type S ([M], contiguous). */
template <typename S, typename TERM>
static int nn_column_sums(const TERM &term, int64_t N, int64_t M, S *out, const char *name) {
    typedef nn_acc<S> A;
    if (M <= 0) return 0;
    int64_t P = nn_col_chunks(N, M), chunk = (N + P - 1) / P;
    if (N == 0) return dg_cuda_fill(nn_dtype_of<S>(), M, out, 0.0);
    A *part = dg_cuda_scratch<A>((size_t)(P * M));
    if (!part) return -1;
    dim3 grid((unsigned)((M + kColW - 1) / kColW), (unsigned)P);
    nn_col_partial_kernel<A, TERM><<<grid, dim3(kColW, kColLanes), 0, dg_cuda_stream()>>>(term, N, M, chunk, part);
    int rc = DG_LAUNCHED(name);
    if (rc == 0) rc = nn_colsum_launch(P, M, part, out, "nn colsum");
    dg_cuda_free(part);
    return rc;
}

/* The same with double partials and an f32 or f64 out named by dt (the terms return double; the
 * gate kernels of kernels/cuda/delta call this form). */
template <typename TERM>
static int nn_column_sums(dg_dtype dt, const TERM &term, int64_t N, int64_t M, void *out, const char *name) {
    if (dt == DG_F32) return nn_column_sums(term, N, M, (float *)out, name);
    return nn_column_sums(term, N, M, (double *)out, name);
}

/* dtype checks shared by the entry points: kernels of f32 and f64 only, and those that also take
 * bf16 storage */
static inline bool nn_float_dt(const char *who, dg_dtype dt) {
    if (dt == DG_F32 || dt == DG_F64) return true;
    dg_error("%s: dtype %s is not supported on CUDA (f32 or f64)", who, dg_dtype_name(dt));
    return false;
}
static inline bool nn_float_or_bf16_dt(const char *who, dg_dtype dt) {
    if (dt == DG_F32 || dt == DG_F64 || dt == DG_BF16) return true;
    dg_error("%s: dtype %s is not supported on CUDA (f32, f64 or bf16)", who, dg_dtype_name(dt));
    return false;
}

#endif
