/* Cross-entropy on the device (the math of kernels/cpu/nn_cross_entropy_impl.h), logits [N,C],
 * targets [N] (a row whose target is `ignore` is not scored):
 *   lse_n = m_n + log sum_c exp(logits[n,c] - m_n),  m_n = max_c logits[n,c]
 *   loss  = (1/count) sum_{scored n} (lse_n - logits[n,t_n]),  0 when count = 0
 *   dlogits[n,c] = dloss/count (exp(logits[n,c] - lse_n) - [c == t_n]),  0 on ignored rows.
 * Forward: one group per row (nn_util.h) writes lse and the row's term (double scratch); one block
 * then adds the terms in a fixed order (so the loss does not depend on the launch) and writes the
 * loss and the count.  Backward: one thread per element, reading dloss and count from the device
 * (no synchronisation). */
#include "kernels/cuda/nn_util.h"

namespace {

constexpr int kFinalThreads = 1024;

template <typename T, int G>
__global__ void __launch_bounds__(kNnThreads)
    ce_rows_kernel(int64_t N, int64_t C, const T *logits, const int64_t *targets, int64_t ignore, T *lse,
                   double *term) {
    __shared__ double smem[kNnThreads / 32];
    constexpr int RPB = kNnThreads / G;
    const int lane = threadIdx.x % G;
    for (int64_t base = (int64_t)blockIdx.x * RPB; base < N; base += (int64_t)gridDim.x * RPB) {
        int64_t row = base + threadIdx.x / G;
        bool active = row < N;
        int64_t t = active ? targets[row] : ignore;
        bool scored = active && t != ignore;
        const T *xr = logits + (scored ? row : 0) * C;
        double m = -INFINITY;
        if (scored)
            for (int64_t c = lane; c < C; c += G) m = fmax(m, (double)xr[c]);
        m = nn_group_max<G>(m, smem);
        T mt = (T)m;
        double s = 0;
        if (scored)
            for (int64_t c = lane; c < C; c += G) s += (double)nn_exp(xr[c] - mt);
        s = nn_group_sum<G>(s, smem);
        if (!active || lane != 0) continue;
        if (!scored) {
            lse[row] = T(0);
            term[row] = 0.0;
            continue;
        }
        T l = (T)((double)mt + log(s));
        lse[row] = l;
        term[row] = (double)l - (double)xr[t];
    }
}

/* one block: loss = sum of the scored terms / count, in a fixed order */
template <typename T>
__global__ void __launch_bounds__(kFinalThreads)
    ce_final_kernel(int64_t N, const int64_t *targets, int64_t ignore, const double *term, T *loss, int64_t *count) {
    __shared__ double ssum[kFinalThreads];
    __shared__ long long scnt[kFinalThreads];
    double acc = 0;
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
        *loss = scnt[0] ? (T)(ssum[0] / (double)scnt[0]) : T(0);
    }
}

template <typename T>
__global__ void ce_bwd_kernel(int64_t N, int64_t C, const T *logits, const int64_t *targets, int64_t ignore,
                              const T *lse, const T *dloss, const int64_t *count, T *dlogits) {
    int64_t cnt = *count;
    T scale = cnt ? (T)((double)*dloss / (double)cnt) : T(0);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N * C; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = i / C, c = i % C, t = targets[n];
        if (t == ignore || cnt == 0) {
            dlogits[i] = T(0);
            continue;
        }
        T v = scale * nn_exp(logits[i] - lse[n]);
        if (c == t) v -= scale;
        dlogits[i] = v;
    }
}

template <typename T>
int ce_fwd(int64_t N, int64_t C, const T *logits, const int64_t *targets, int64_t ignore, T *loss, T *lse,
           int64_t *count) {
    cudaStream_t st = dg_cuda_stream();
    double *term = dg_cuda_scratch<double>((size_t)(N > 0 ? N : 1));
    if (!term) return -1;
    int rc = 0;
    if (N > 0) {
        int G = nn_group_for(C);
        unsigned grid = nn_row_grid(N, G);
        if (G == 32) ce_rows_kernel<T, 32><<<grid, kNnThreads, 0, st>>>(N, C, logits, targets, ignore, lse, term);
        else ce_rows_kernel<T, 256><<<grid, kNnThreads, 0, st>>>(N, C, logits, targets, ignore, lse, term);
        rc = DG_LAUNCHED("cross_entropy rows");
    }
    if (rc == 0) {
        ce_final_kernel<T><<<1, kFinalThreads, 0, st>>>(N, targets, ignore, term, loss, count);
        rc = DG_LAUNCHED("cross_entropy loss");
    }
    dg_cuda_free(term);
    return rc;
}

} // namespace

extern "C" int dg_cuda_cross_entropy_fwd(dg_dtype dt, int64_t N, int64_t C, const void *logits, const int64_t *targets,
                                         int64_t ignore, void *loss, void *lse, int64_t *count) {
    if (!nn_float_dt("cuda cross_entropy", dt)) return -1;
    if (N < 0 || C < 1) {
        dg_error("cuda cross_entropy: bad sizes N %lld C %lld", (long long)N, (long long)C);
        return -1;
    }
    if (dg_cuda_init()) return -1;
    if (dt == DG_F32)
        return ce_fwd<float>(N, C, (const float *)logits, targets, ignore, (float *)loss, (float *)lse, count);
    return ce_fwd<double>(N, C, (const double *)logits, targets, ignore, (double *)loss, (double *)lse, count);
}

extern "C" int dg_cuda_cross_entropy_bwd(dg_dtype dt, int64_t N, int64_t C, const void *logits, const int64_t *targets,
                                         int64_t ignore, const void *lse, const void *dloss, const int64_t *count,
                                         void *dlogits) {
    if (!nn_float_dt("cuda cross_entropy bwd", dt)) return -1;
    if (N * C <= 0) return 0;
    if (dg_cuda_init()) return -1;
    unsigned grid = dg_grid_for(N * C, kNnThreads);
    cudaStream_t st = dg_cuda_stream();
    if (dt == DG_F32)
        ce_bwd_kernel<float><<<grid, kNnThreads, 0, st>>>(N, C, (const float *)logits, targets, ignore,
                                                          (const float *)lse, (const float *)dloss, count,
                                                          (float *)dlogits);
    else
        ce_bwd_kernel<double><<<grid, kNnThreads, 0, st>>>(N, C, (const double *)logits, targets, ignore,
                                                           (const double *)lse, (const double *)dloss, count,
                                                           (double *)dlogits);
    return DG_LAUNCHED("cross_entropy bwd");
}
