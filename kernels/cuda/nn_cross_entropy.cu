/* Cross-entropy on the device (the math of kernels/cpu/nn_cross_entropy_impl.h), logits [N,C],
 * targets [N] (a row whose target is `ignore` is not scored):
 *   lse_n = m_n + log sum_c exp(logits[n,c] - m_n),  m_n = max_c logits[n,c]
 *   loss  = (1/count) sum_{scored n} (lse_n - logits[n,t_n]),  0 when count = 0
 *   dlogits[n,c] = dloss/count (exp(logits[n,c] - lse_n) - [c == t_n]),  0 on ignored rows.
 * Forward: one group per row (nn_util.h) writes lse and the row's term (double scratch); one block
 * then adds the terms in a fixed order (so the loss does not depend on the launch) and writes the
 * loss and the count.  Backward: one thread per element, reading dloss and count from the device
 * (no synchronisation).  Storage S is float, double or bf16; for bf16 the row maximum, the sums
 * and the loss are f32 and lse, the loss and dloss are f32 arrays (dlogits is bf16, rounded once).
 * The rows pass, the loss and the backward are also entry points of their own, which
 * linear_cross_entropy (ops/nn_linear_cross_entropy.c) runs on its chunks of logits. */
#include "kernels/cuda/nn_util.h"

namespace {

constexpr int kFinalThreads = 1024;

/* Per row: lse (compute type) and the row's term lse - logits[n, t_n] (accumulation type). */
template <typename S, int G>
__global__ void __launch_bounds__(kNnThreads)
    ce_rows_kernel(int64_t N, int64_t C, const S *logits, const int64_t *targets, int64_t ignore, nn_compute<S> *lse,
                   nn_acc<S> *term) {
    typedef nn_compute<S> T;
    typedef nn_acc<S> A;
    __shared__ A smem[kNnThreads / 32];
    constexpr int RPB = kNnThreads / G;
    const int lane = threadIdx.x % G;
    for (int64_t base = (int64_t)blockIdx.x * RPB; base < N; base += (int64_t)gridDim.x * RPB) {
        int64_t row = base + threadIdx.x / G;
        bool active = row < N;
        int64_t t = active ? targets[row] : ignore;
        bool scored = active && t != ignore;
        const S *xr = logits + (scored ? row : 0) * C;
        A m = -INFINITY;
        if (scored)
            for (int64_t c = lane; c < C; c += G) m = nn_max(m, (A)nn_ld(xr, c));
        m = nn_group_max<G>(m, smem);
        T mt = (T)m;
        A s = 0;
        if (scored)
            for (int64_t c = lane; c < C; c += G) s += (A)nn_exp(nn_ld(xr, c) - mt);
        s = nn_group_sum<G>(s, smem);
        if (!active || lane != 0) continue;
        if (!scored) {
            lse[row] = T(0);
            term[row] = A(0);
            continue;
        }
        T l = (T)((A)mt + nn_log(s));
        lse[row] = l;
        term[row] = (A)l - (A)nn_ld(xr, t);
    }
}

/* one block: loss = sum of the scored terms / count, in a fixed order */
template <typename T, typename A>
__global__ void __launch_bounds__(kFinalThreads)
    ce_final_kernel(int64_t N, const int64_t *targets, int64_t ignore, const A *term, T *loss, int64_t *count) {
    __shared__ A ssum[kFinalThreads];
    __shared__ long long scnt[kFinalThreads];
    A acc = 0;
    long long k = 0;
    for (int64_t n = threadIdx.x; n < N; n += kFinalThreads) {
        if (targets[n] == ignore) continue;
        acc += term[n];
        k++;
    }
    ssum[threadIdx.x] = acc;
    scnt[threadIdx.x] = k;
    __syncthreads();
    for (int half = kFinalThreads / 2; half > 0; half >>= 1) {
        if ((int)threadIdx.x < half) {
            ssum[threadIdx.x] += ssum[threadIdx.x + half];
            scnt[threadIdx.x] += scnt[threadIdx.x + half];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        *count = (int64_t)scnt[0];
        *loss = scnt[0] ? (T)(ssum[0] / (A)scnt[0]) : T(0);
    }
}

/* lse and dloss are of the compute type of the logits' storage S, dlogits of storage O (S, or
 * bf16 for f32 logits: linear_cross_entropy's f32 chunk of a bf16 product).  dlogits may be logits
 * itself when O is S (each element is read before it is written, by the same thread). */
template <typename S, typename O>
__global__ void ce_bwd_kernel(int64_t N, int64_t C, const S *logits, const int64_t *targets, int64_t ignore,
                              const nn_compute<S> *lse, const nn_compute<S> *dloss, const int64_t *count, O *dlogits) {
    typedef nn_compute<S> T;
    int64_t cnt = *count;
    T scale = cnt ? (T)((double)*dloss / (double)cnt) : T(0);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N * C; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = i / C, c = i % C, t = targets[n];
        if (t == ignore || cnt == 0) {
            nn_st(dlogits, i, nn_compute<O>(0));
            continue;
        }
        T v = scale * nn_exp(nn_ld(logits, i) - lse[n]);
        if (c == t) v -= scale;
        nn_st(dlogits, i, (nn_compute<O>)v);
    }
}

/* lse and the per-row terms of rows [0, N) (the rows of a chunk when called on one) */
template <typename S>
int ce_rows(int64_t N, int64_t C, const S *logits, const int64_t *targets, int64_t ignore, nn_compute<S> *lse,
            nn_acc<S> *term) {
    if (N <= 0) return 0;
    cudaStream_t st = dg_cuda_stream();
    int G = nn_group_for(C);
    unsigned grid = nn_row_grid(N, G);
    if (G == 32) ce_rows_kernel<S, 32><<<grid, kNnThreads, 0, st>>>(N, C, logits, targets, ignore, lse, term);
    else ce_rows_kernel<S, 256><<<grid, kNnThreads, 0, st>>>(N, C, logits, targets, ignore, lse, term);
    return DG_LAUNCHED("cross_entropy rows");
}

template <typename T, typename A>
int ce_loss(int64_t N, const int64_t *targets, int64_t ignore, const A *term, T *loss, int64_t *count) {
    ce_final_kernel<T, A><<<1, kFinalThreads, 0, dg_cuda_stream()>>>(N, targets, ignore, term, loss, count);
    return DG_LAUNCHED("cross_entropy loss");
}

template <typename S>
int ce_fwd(int64_t N, int64_t C, const void *logits, const int64_t *targets, int64_t ignore, void *loss, void *lse,
           int64_t *count) {
    typedef nn_compute<S> T;
    typedef nn_acc<S> A;
    A *term = dg_cuda_scratch<A>((size_t)(N > 0 ? N : 1));
    if (!term) return -1;
    int rc = ce_rows<S>(N, C, (const S *)logits, targets, ignore, (T *)lse, term);
    if (rc == 0) rc = ce_loss<T, A>(N, targets, ignore, term, (T *)loss, count);
    dg_cuda_free(term);
    return rc;
}

template <typename S, typename O>
void ce_bwd(int64_t N, int64_t C, const void *logits, const int64_t *targets, int64_t ignore, const void *lse,
            const void *dloss, const int64_t *count, void *dlogits) {
    typedef nn_compute<S> T;
    ce_bwd_kernel<S, O><<<dg_grid_for(N * C, kNnThreads), kNnThreads, 0, dg_cuda_stream()>>>(
        N, C, (const S *)logits, targets, ignore, (const T *)lse, (const T *)dloss, count, (O *)dlogits);
}

/* f32 or f64 (the dtypes of linear_cross_entropy's chunk of logits) */
bool ce_chunk_dt(const char *who, dg_dtype dt) {
    if (dt == DG_F32 || dt == DG_F64) return true;
    dg_error("%s: dtype %s is not supported (f32 or f64)", who, dg_dtype_name(dt));
    return false;
}

} // namespace

extern "C" int dg_cuda_cross_entropy_fwd(dg_dtype dt, int64_t N, int64_t C, const void *logits, const int64_t *targets,
                                         int64_t ignore, void *loss, void *lse, int64_t *count) {
    if (!nn_float_or_bf16_dt("cuda cross_entropy", dt)) return -1;
    if (N < 0 || C < 1) {
        dg_error("cuda cross_entropy: bad sizes N %lld C %lld", (long long)N, (long long)C);
        return -1;
    }
    if (dg_cuda_init()) return -1;
    if (dt == DG_F32) return ce_fwd<float>(N, C, logits, targets, ignore, loss, lse, count);
    if (dt == DG_F64) return ce_fwd<double>(N, C, logits, targets, ignore, loss, lse, count);
    return ce_fwd<__nv_bfloat16>(N, C, logits, targets, ignore, loss, lse, count);
}

extern "C" int dg_cuda_cross_entropy_grad(dg_dtype dt, dg_dtype out_dt, int64_t N, int64_t C, const void *logits,
                                          const int64_t *targets, int64_t ignore, const void *lse, const void *dloss,
                                          const int64_t *count, void *dlogits) {
    if (!nn_float_or_bf16_dt("cuda cross_entropy bwd", dt)) return -1;
    if (out_dt != dt && !(dt == DG_F32 && out_dt == DG_BF16)) {
        dg_error("cuda cross_entropy bwd: logits %s with dlogits %s are not supported (the same dtype, or f32 "
                 "with bf16)",
                 dg_dtype_name(dt), dg_dtype_name(out_dt));
        return -1;
    }
    if (N * C <= 0) return 0;
    if (dg_cuda_init()) return -1;
    if (dt == DG_F32 && out_dt == DG_BF16)
        ce_bwd<float, __nv_bfloat16>(N, C, logits, targets, ignore, lse, dloss, count, dlogits);
    else if (dt == DG_F32) ce_bwd<float, float>(N, C, logits, targets, ignore, lse, dloss, count, dlogits);
    else if (dt == DG_F64) ce_bwd<double, double>(N, C, logits, targets, ignore, lse, dloss, count, dlogits);
    else ce_bwd<__nv_bfloat16, __nv_bfloat16>(N, C, logits, targets, ignore, lse, dloss, count, dlogits);
    return DG_LAUNCHED("cross_entropy bwd");
}

extern "C" int dg_cuda_cross_entropy_bwd(dg_dtype dt, int64_t N, int64_t C, const void *logits, const int64_t *targets,
                                         int64_t ignore, const void *lse, const void *dloss, const int64_t *count,
                                         void *dlogits) {
    return dg_cuda_cross_entropy_grad(dt, dt, N, C, logits, targets, ignore, lse, dloss, count, dlogits);
}

extern "C" int dg_cuda_cross_entropy_rows(dg_dtype dt, int64_t N, int64_t C, const void *logits, const int64_t *targets,
                                          int64_t ignore, void *lse, double *term) {
    if (!ce_chunk_dt("cuda cross_entropy rows", dt)) return -1;
    if (N < 0 || C < 1) {
        dg_error("cuda cross_entropy rows: bad sizes N %lld C %lld", (long long)N, (long long)C);
        return -1;
    }
    if (dg_cuda_init()) return -1;
    if (dt == DG_F32) return ce_rows<float>(N, C, (const float *)logits, targets, ignore, (float *)lse, term);
    return ce_rows<double>(N, C, (const double *)logits, targets, ignore, (double *)lse, term);
}

extern "C" int dg_cuda_cross_entropy_loss(dg_dtype dt, int64_t N, const int64_t *targets, int64_t ignore,
                                          const double *term, void *loss, int64_t *count) {
    if (!ce_chunk_dt("cuda cross_entropy loss", dt)) return -1;
    if (dg_cuda_init()) return -1;
    if (dt == DG_F32) return ce_loss<float, double>(N, targets, ignore, term, (float *)loss, count);
    return ce_loss<double, double>(N, targets, ignore, term, (double *)loss, count);
}
