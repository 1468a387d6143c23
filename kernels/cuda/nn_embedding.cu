/* Embedding on the device (the math of kernels/cpu/nn_embedding_impl.h), w [V,D], ids [N], y [N,D]:
 *   forward   y[n,:] = w[ids[n],:]                      (one thread per element)
 *   backward  dw[v,:] = sum_{n: ids[n] = v} dy[n,:]
 * The scatter-add is deterministic and atomic-free: the positions 0..N-1 are sorted by id with
 * CUB's stable radix sort (so each id's positions stay in increasing order), each id's run
 * [start[v], start[v+1]) is found by binary search in the sorted ids, and one thread per (v, d)
 * sums its run in double (f32 for bf16 storage, rounded once to bf16 at the end, so repeated ids
 * lose no bits on the way), neighbouring threads reading neighbouring columns of dy.
 * Scratch: the sorted ids and positions (12 N bytes), CUB's temporary storage, V + 1 offsets. */
#include "kernels/cuda/nn_util.h"

#include <cub/device/device_radix_sort.cuh>

namespace {

/* a plain copy of rows: any storage type, bf16 included, moves bits unchanged */
template <typename T> __global__ void emb_fwd_kernel(int64_t n, int64_t D, const T *w, const int64_t *ids, T *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = w[ids[i / D] * D + i % D];
}

__global__ void iota_kernel(int n, int *p) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = i;
}

/* start[v] = first k with sorted[k] >= v, for v = 0..V */
__global__ void run_start_kernel(int64_t V, int n, const unsigned long long *sorted, int *start) {
    for (int64_t v = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; v <= V; v += (int64_t)gridDim.x * blockDim.x) {
        int lo = 0, hi = n;
        while (lo < hi) {
            int mid = lo + (hi - lo) / 2;
            if (sorted[mid] < (unsigned long long)v) lo = mid + 1;
            else hi = mid;
        }
        start[v] = lo;
    }
}

/* each (v, d) sums its run in the accumulation type (double; f32 for bf16), rounded once */
template <typename S>
__global__ void emb_bwd_kernel(int64_t V, int64_t D, const int *start, const int *pos, const S *dy, S *dw) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < V * D; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t v = i / D, d = i % D;
        nn_acc<S> acc = 0;
        for (int k = start[v]; k < start[v + 1]; k++) acc += (nn_acc<S>)nn_ld(dy, (int64_t)pos[k] * D + d);
        nn_st(dw, i, (nn_compute<S>)acc);
    }
}

int bits_for(int64_t V) {
    int b = 1;
    while (b < 64 && ((int64_t)1 << b) < V) b++;
    return b;
}

} // namespace

extern "C" int dg_cuda_embedding_fwd(dg_dtype dt, int64_t N, int64_t V, int64_t D, const void *w, const int64_t *ids,
                                     void *y) {
    if (!nn_float_or_bf16_dt("cuda embedding", dt)) return -1;
    int64_t n = N * D;
    if (n <= 0) return 0;
    if (dg_cuda_init()) return -1;
    unsigned grid = dg_grid_for(n, kNnThreads);
    if (dt == DG_F32)
        emb_fwd_kernel<float><<<grid, kNnThreads, 0, dg_cuda_stream()>>>(n, D, (const float *)w, ids, (float *)y);
    else if (dt == DG_F64)
        emb_fwd_kernel<double><<<grid, kNnThreads, 0, dg_cuda_stream()>>>(n, D, (const double *)w, ids, (double *)y);
    else
        emb_fwd_kernel<uint16_t>
            <<<grid, kNnThreads, 0, dg_cuda_stream()>>>(n, D, (const uint16_t *)w, ids, (uint16_t *)y);
    (void)V;
    return DG_LAUNCHED("embedding fwd");
}

extern "C" int dg_cuda_embedding_bwd(dg_dtype dt, int64_t N, int64_t V, int64_t D, const int64_t *ids, const void *dy,
                                     void *dw) {
    if (!nn_float_or_bf16_dt("cuda embedding bwd", dt)) return -1;
    if (N < 0 || N > INT32_MAX - 1 || V < 0 || D < 0) {
        dg_error("cuda embedding bwd: N %lld V %lld D %lld out of range (N < 2^31)", (long long)N, (long long)V,
                 (long long)D);
        return -1;
    }
    if (V * D == 0) return 0;
    if (dg_cuda_init()) return -1;
    cudaStream_t st = dg_cuda_stream();
    int n = (int)N;
    /* ids are in [0, V) (checked by the caller): as unsigned keys, only the low bits matter */
    const unsigned long long *keys = (const unsigned long long *)ids;
    unsigned long long *sorted = dg_cuda_scratch<unsigned long long>((size_t)(n > 0 ? n : 1));
    int *pos_in = dg_cuda_scratch<int>((size_t)(n > 0 ? n : 1));
    int *pos = dg_cuda_scratch<int>((size_t)(n > 0 ? n : 1));
    int *start = dg_cuda_scratch<int>((size_t)(V + 1));
    void *tmp = nullptr;
    int rc = sorted && pos_in && pos && start ? 0 : -1;
    if (rc == 0 && n > 0) {
        iota_kernel<<<dg_grid_for(n, kNnThreads), kNnThreads, 0, st>>>(n, pos_in);
        rc = DG_LAUNCHED("embedding iota");
        size_t tmp_bytes = 0;
        int end_bit = bits_for(V);
        if (rc == 0)
            rc = DG_CU(
                cub::DeviceRadixSort::SortPairs(nullptr, tmp_bytes, keys, sorted, pos_in, pos, n, 0, end_bit, st));
        if (rc == 0 && !(tmp = dg_cuda_malloc(tmp_bytes))) rc = -1;
        if (rc == 0)
            rc = DG_CU(cub::DeviceRadixSort::SortPairs(tmp, tmp_bytes, keys, sorted, pos_in, pos, n, 0, end_bit, st));
    }
    if (rc == 0) {
        run_start_kernel<<<dg_grid_for(V + 1, kNnThreads), kNnThreads, 0, st>>>(V, n, sorted, start);
        rc = DG_LAUNCHED("embedding run starts");
    }
    if (rc == 0) {
        unsigned grid = dg_grid_for(V * D, kNnThreads);
        if (dt == DG_F32)
            emb_bwd_kernel<float><<<grid, kNnThreads, 0, st>>>(V, D, start, pos, (const float *)dy, (float *)dw);
        else if (dt == DG_F64)
            emb_bwd_kernel<double><<<grid, kNnThreads, 0, st>>>(V, D, start, pos, (const double *)dy, (double *)dw);
        else
            emb_bwd_kernel<__nv_bfloat16>
                <<<grid, kNnThreads, 0, st>>>(V, D, start, pos, (const __nv_bfloat16 *)dy, (__nv_bfloat16 *)dw);
        rc = DG_LAUNCHED("embedding bwd");
    }
    dg_cuda_free(tmp);
    dg_cuda_free(sorted);
    dg_cuda_free(pos_in);
    dg_cuda_free(pos);
    dg_cuda_free(start);
    return rc;
}
