/* Sum over a set of dims: out[o] = alpha * sum_r x[kept(o) + reduced(r)].
 *
 * The view is split into the kept dims (in order: the output, contiguous) and the reduced dims;
 * each side is simplified like any strided space (nd_index.h).  M outputs, R terms each.  Two
 * shapes of work, chosen by which side holds the fastest-moving memory direction:
 *   rows    (a reduced dim is innermost, e.g. sum over the last dim): a group of 32 or 256
 *           threads per output strides over its terms, coalesced, then a shuffle/shared reduction;
 *   columns (a kept dim is innermost, e.g. a bias gradient: sum over rows of [N, D]): one thread
 *           per output loops over its terms, and neighbouring threads read neighbouring elements.
 * When M alone cannot fill the device, R is cut into `splits` equal ranges: the first pass
 * writes f64 partial sums [splits, M] to scratch and a second, column pass adds them up.  No
 * atomics, so the result does not depend on the schedule.  Accumulation is in f64 for every
 * input dtype, bf16 included (the kernel is memory bound; the f64 adds are free), and the result
 * is rounded once to the output dtype: a bf16 sum of 10^6 ones is 10^6 rounded to bf16, not the
 * 256 at which a bf16 accumulator stalls.  The output dtype may differ from the input's (f32 terms
 * of a bf16 gradient summed into bf16, or bf16 terms into f32). */
#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/nd_index.h"

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ double to_acc(float v) { return (double)v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ double to_acc(__nv_bfloat16 v) { return (double)__bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_acc(double v) { return (T)v; }
/* one rounding from f64 to bf16 (to nearest even) */
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(double v) { return __double2bfloat16(v); }

/* sum of x[red(r)] for r = r0, r0 + step, ... < r1; four loads in flight per round */
template <typename TIn, typename IT>
__device__ __forceinline__ double sum_range(const DgNd<1> &red, const TIn *x, int64_t r0, int64_t r1, int step) {
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    int64_t r = r0;
    for (; r + 3 * (int64_t)step < r1; r += 4 * (int64_t)step) {
        IT o0[1], o1[1], o2[1], o3[1];
        dg_nd_offsets<IT, 1>(red, (IT)r, o0);
        dg_nd_offsets<IT, 1>(red, (IT)(r + step), o1);
        dg_nd_offsets<IT, 1>(red, (IT)(r + 2 * step), o2);
        dg_nd_offsets<IT, 1>(red, (IT)(r + 3 * step), o3);
        TIn v0 = x[o0[0]], v1 = x[o1[0]], v2 = x[o2[0]], v3 = x[o3[0]];
        a0 += to_acc(v0), a1 += to_acc(v1), a2 += to_acc(v2), a3 += to_acc(v3);
    }
    for (; r < r1; r += step) {
        IT o[1];
        dg_nd_offsets<IT, 1>(red, (IT)r, o);
        a0 += to_acc(x[o[0]]);
    }
    return (a0 + a1) + (a2 + a3);
}

/* One group of G threads per (split p, output o), o fastest. */
template <typename TIn, typename TOut, typename IT, int G>
__global__ void __launch_bounds__(kThreads)
    sum_rows_kernel(DgNd<1> kept, DgNd<1> red, int64_t M, int64_t R, int64_t rchunk, int64_t groups, const TIn *x,
                    TOut *out, double alpha) {
    constexpr int kGroupsPerBlock = kThreads / G;
    __shared__ double warp_sums[kThreads / 32];
    int lane = threadIdx.x % G;
    /* every thread of a block runs the same number of rounds, so that the barrier below is
     * reached by all of them */
    for (int64_t base = (int64_t)blockIdx.x * kGroupsPerBlock; base < groups;
         base += (int64_t)gridDim.x * kGroupsPerBlock) {
        int64_t grp = base + threadIdx.x / G;
        double acc = 0;
        if (grp < groups) {
            int64_t o = grp % M, p = grp / M;
            IT ko[1];
            dg_nd_offsets<IT, 1>(kept, (IT)o, ko);
            int64_t r0 = p * rchunk, r1 = r0 + rchunk < R ? r0 + rchunk : R;
            acc = sum_range<TIn, IT>(red, x + ko[0], r0 + lane, r1, G);
        }
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (G > 32) {
            if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
            __syncthreads();
            if (threadIdx.x == 0) {
                double t = 0;
                for (int w = 0; w < kThreads / 32; w++) t += warp_sums[w];
                acc = t;
            }
            __syncthreads(); /* warp_sums is rewritten in the next round */
        }
        if (lane == 0 && grp < groups) out[grp] = from_acc<TOut>(alpha * acc);
    }
}

/* One thread per (split p, output o), o fastest. */
template <typename TIn, typename TOut, typename IT>
__global__ void __launch_bounds__(kThreads)
    sum_cols_kernel(DgNd<1> kept, DgNd<1> red, int64_t M, int64_t R, int64_t rchunk, int64_t items, const TIn *x,
                    TOut *out, double alpha) {
    for (int64_t it = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; it < items;
         it += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = it % M, p = it / M;
        IT ko[1];
        dg_nd_offsets<IT, 1>(kept, (IT)o, ko);
        int64_t r0 = p * rchunk, r1 = r0 + rchunk < R ? r0 + rchunk : R;
        double acc = sum_range<TIn, IT>(red, x + ko[0], r0, r1, 1);
        out[it] = from_acc<TOut>(alpha * acc);
    }
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t min_abs_stride(const DgNd<1> &nd) {
    int64_t m = INT64_MAX;
    for (int d = 0; d < nd.ndim; d++) {
        int64_t s = nd.stride[0][d] < 0 ? -nd.stride[0][d] : nd.stride[0][d];
        if (s < m) m = s;
    }
    return m;
}

/* One pass: out [splits, M] (TOut) from x. */
template <typename TIn, typename TOut>
int sum_pass(const DgNd<1> &kept, const DgNd<1> &red, int64_t M, int64_t R, int64_t splits, bool rows, int G,
             const TIn *x, TOut *out, double alpha) {
    int64_t rchunk = cdiv(R, splits);
    bool small = M * splits < INT32_MAX && R < INT32_MAX && dg_nd_span(&kept) + dg_nd_span(&red) < INT32_MAX;
    cudaStream_t s = dg_cuda_stream();
    int64_t groups = M * splits;
    if (rows) {
        unsigned grid = dg_grid_for(groups * G, kThreads);
#define DG_ROWS(IT, GG) \
    sum_rows_kernel<TIn, TOut, IT, GG><<<grid, kThreads, 0, s>>>(kept, red, M, R, rchunk, groups, x, out, alpha)
        if (G == 32) {
            if (small) DG_ROWS(int32_t, 32);
            else DG_ROWS(int64_t, 32);
        } else {
            if (small) DG_ROWS(int32_t, 256);
            else DG_ROWS(int64_t, 256);
        }
#undef DG_ROWS
    } else {
        unsigned grid = dg_grid_for(groups, kThreads);
        if (small)
            sum_cols_kernel<TIn, TOut, int32_t>
                <<<grid, kThreads, 0, s>>>(kept, red, M, R, rchunk, groups, x, out, alpha);
        else
            sum_cols_kernel<TIn, TOut, int64_t>
                <<<grid, kThreads, 0, s>>>(kept, red, M, R, rchunk, groups, x, out, alpha);
    }
    return DG_LAUNCHED(rows ? "sum_rows" : "sum_cols");
}

template <typename TIn, typename TOut>
int sum_impl(int ndim, const int64_t *shape, const TIn *x, const int64_t *xstride, unsigned mask, double alpha,
             dg_dtype out_dt, TOut *out) {
    int64_t cst[DG_ND_MAX];
    int64_t ks[DG_ND_MAX], kst[DG_ND_MAX], rs[DG_ND_MAX], rst[DG_ND_MAX];
    int nk = 0, nr = 0;
    int64_t c = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        cst[d] = xstride ? xstride[d] : c;
        c *= shape[d];
    }
    int64_t M = 1, R = 1;
    for (int d = 0; d < ndim; d++) {
        if (mask >> d & 1u) {
            rs[nr] = shape[d], rst[nr++] = cst[d], R *= shape[d];
        } else {
            ks[nk] = shape[d], kst[nk++] = cst[d], M *= shape[d];
        }
    }
    if (M == 0) return 0;
    if (dg_cuda_init()) return -1;
    if (R == 0) return dg_cuda_fill(out_dt, M, out, 0.0);
    DgNd<1> kept, red;
    const int64_t *kp[1] = {kst}, *rp[1] = {rst};
    dg_nd_make<1>(&kept, nk, ks, kp);
    dg_nd_make<1>(&red, nr, rs, rp);

    bool rows = red.ndim > 0 && min_abs_stride(red) < min_abs_stride(kept);
    int G = rows && R >= 4096 ? 256 : 32;
    int64_t sms = dg_cuda_sm_count();
    int64_t splits = 1;
    if (rows) {
        /* enough groups for about 8 blocks per multiprocessor, at least 32 terms per thread */
        int64_t want = cdiv(8 * sms * kThreads, M * G);
        int64_t most = R / (G * 32);
        splits = want < most ? want : most;
    } else {
        int64_t want = cdiv(8 * sms * kThreads, M);
        int64_t most = R / 32;
        splits = want < most ? want : most;
    }
    if (splits < 1) splits = 1;
    if (splits == 1) return sum_pass<TIn, TOut>(kept, red, M, R, 1, rows, G, x, out, alpha);

    double *part = dg_cuda_scratch<double>((size_t)(splits * M));
    if (!part) return -1;
    int rc = sum_pass<TIn, double>(kept, red, M, R, splits, rows, G, x, part, 1.0);
    if (rc == 0) {
        /* part [splits, M] summed over splits: a column pass */
        DgNd<1> k2, r2;
        int64_t one = 1, sm = M;
        const int64_t *kp2[1] = {&one}, *rp2[1] = {&sm};
        dg_nd_make<1>(&k2, 1, &M, kp2);
        dg_nd_make<1>(&r2, 1, &splits, rp2);
        rc = sum_pass<double, TOut>(k2, r2, M, splits, 1, false, 32, part, out, alpha);
    }
    dg_cuda_free(part);
    return rc;
}

template <typename TIn>
int sum_to(int ndim, const int64_t *shape, const TIn *x, const int64_t *xstride, unsigned mask, double alpha,
           dg_dtype out_dt, void *out) {
    switch (out_dt) {
    case DG_F32: return sum_impl<TIn, float>(ndim, shape, x, xstride, mask, alpha, out_dt, (float *)out);
    case DG_F64: return sum_impl<TIn, double>(ndim, shape, x, xstride, mask, alpha, out_dt, (double *)out);
    default: return sum_impl<TIn, __nv_bfloat16>(ndim, shape, x, xstride, mask, alpha, out_dt, (__nv_bfloat16 *)out);
    }
}

} // namespace

extern "C" int dg_cuda_sum_mixed(dg_dtype x_dt, dg_dtype out_dt, int ndim, const int64_t *shape, const void *x,
                                 const int64_t *xstride, unsigned reduce_mask, double alpha, void *out) {
    bool known = (x_dt == DG_F32 || x_dt == DG_F64 || x_dt == DG_BF16) &&
                 (out_dt == DG_F32 || out_dt == DG_F64 || out_dt == DG_BF16);
    /* f64 only with f64: a mixed f64 sum is never wanted and would hide a dtype mistake */
    if (!known || ((x_dt == DG_F64) != (out_dt == DG_F64))) {
        dg_error("cuda sum: input %s with result %s is not supported on CUDA (f32, f64 or bf16; f32 and bf16 "
                 "mix)",
                 dg_dtype_name(x_dt), dg_dtype_name(out_dt));
        return -1;
    }
    if (ndim < 0 || ndim > DG_ND_MAX) {
        dg_error("cuda sum: %d dims, at most %d are supported", ndim, DG_ND_MAX);
        return -1;
    }
    if (reduce_mask >> ndim) {
        dg_error("cuda sum: reduce mask 0x%x names a dim beyond the %d of the input", reduce_mask, ndim);
        return -1;
    }
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0) {
            dg_error("cuda sum: negative size %lld in dim %d", (long long)shape[d], d);
            return -1;
        }
    switch (x_dt) {
    case DG_F32: return sum_to<float>(ndim, shape, (const float *)x, xstride, reduce_mask, alpha, out_dt, out);
    case DG_F64: return sum_to<double>(ndim, shape, (const double *)x, xstride, reduce_mask, alpha, out_dt, out);
    default:
        return sum_to<__nv_bfloat16>(ndim, shape, (const __nv_bfloat16 *)x, xstride, reduce_mask, alpha, out_dt, out);
    }
}

extern "C" int dg_cuda_sum(dg_dtype dt, int ndim, const int64_t *shape, const void *x, const int64_t *xstride,
                           unsigned reduce_mask, double alpha, void *out) {
    return dg_cuda_sum_mixed(dt, dt, ndim, shape, x, xstride, reduce_mask, alpha, out);
}
