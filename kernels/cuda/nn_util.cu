/* Shared pieces of the network-piece kernels: the second pass of the column sums for double
 * partials, the sum over the rows of a matrix (a bias gradient) and the index check of embedding
 * ids and cross-entropy targets. */
#include "kernels/cuda/capture.h"
#include "kernels/cuda/nn_util.h"

namespace {

/* term(n, m) = x[n, m] */
template <typename S> struct RowTerm {
    const S *x;
    int64_t M;
    __device__ nn_acc<S> operator()(int64_t n, int64_t m) const { return (nn_acc<S>)nn_ld(x, n * M + m); }
};

/* *first = the smallest n with a bad id (unsigned compare: untouched stays at ULLONG_MAX) */
__global__ void bad_index_kernel(int64_t N, const int64_t *ids, int64_t V, bool allow_skip, int64_t skip,
                                 unsigned long long *first) {
    for (int64_t n = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; n < N; n += (int64_t)gridDim.x * blockDim.x) {
        int64_t id = ids[n];
        bool ok = (id >= 0 && id < V) || (allow_skip && id == skip);
        if (!ok) atomicMin(first, (unsigned long long)n);
    }
}

/* out[m] = sum_p part[p, m] strictly in order of p, one thread a column: the optimiser's norms,
 * whose fused and unfused paths add the same partials in the same order */
template <typename S> __global__ void colsum_in_order_kernel(int64_t P, int64_t M, const double *part, S *out) {
    for (int64_t m = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; m < M; m += (int64_t)gridDim.x * blockDim.x) {
        double acc = 0;
        for (int64_t p = 0; p < P; p++) acc += part[p * M + m];
        out[m] = (S)acc;
    }
}

} // namespace

int dg_cuda_nn_colsum(dg_dtype dt, int64_t P, int64_t M, const double *part, void *out) {
    if (M <= 0) return 0;
    unsigned grid = dg_grid_for(M, kNnThreads);
    if (dt == DG_F32) colsum_in_order_kernel<<<grid, kNnThreads, 0, dg_cuda_stream()>>>(P, M, part, (float *)out);
    else colsum_in_order_kernel<<<grid, kNnThreads, 0, dg_cuda_stream()>>>(P, M, part, (double *)out);
    return DG_LAUNCHED("nn colsum in order");
}

extern "C" int dg_cuda_nn_sum_rows(dg_dtype dt, int64_t N, int64_t M, const void *x, void *out) {
    if (!nn_float_or_bf16_dt("cuda sum over rows", dt)) return -1;
    if (N < 0 || M < 0) {
        dg_error("cuda sum over rows: negative size (N %lld, M %lld)", (long long)N, (long long)M);
        return -1;
    }
    if (dg_cuda_init()) return -1;
    switch (dt) {
    case DG_F32: return nn_column_sums(RowTerm<float>{(const float *)x, M}, N, M, (float *)out, "sum over rows");
    case DG_F64: return nn_column_sums(RowTerm<double>{(const double *)x, M}, N, M, (double *)out, "sum over rows");
    default:
        return nn_column_sums(RowTerm<__nv_bfloat16>{(const __nv_bfloat16 *)x, M}, N, M, (__nv_bfloat16 *)out,
                              "sum over rows");
    }
}

extern "C" int dg_cuda_find_bad_index(int64_t N, const int64_t *ids, int64_t V, bool allow_skip, int64_t skip,
                                      int64_t *bad_pos, int64_t *bad_val) {
    *bad_pos = -1;
    *bad_val = 0;
    /* inside a graph capture nothing runs and nothing can be read back: the step's owner checks
     * the indices on the host before each replay (graph.cu) */
    if (N <= 0 || dg_cuda_capturing()) return 0;
    if (dg_cuda_init()) return -1;
    unsigned long long *first = dg_cuda_scratch<unsigned long long>(1);
    if (!first) return -1;
    int rc = DG_CU(cudaMemsetAsync(first, 0xff, sizeof *first, dg_cuda_stream()));
    if (rc == 0) {
        bad_index_kernel<<<dg_grid_for(N, kNnThreads), kNnThreads, 0, dg_cuda_stream()>>>(N, ids, V, allow_skip, skip,
                                                                                          first);
        rc = DG_LAUNCHED("index check");
    }
    unsigned long long pos = ~0ull;
    if (rc == 0) rc = dg_cuda_memcpy(&pos, first, sizeof pos, 1);
    dg_cuda_free(first);
    if (rc == 0 && pos != ~0ull) {
        *bad_pos = (int64_t)pos;
        rc = dg_cuda_memcpy(bad_val, ids + pos, sizeof *bad_val, 1);
    }
    return rc;
}
