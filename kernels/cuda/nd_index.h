/* Internal to the .cu files of kernels/cuda (C++): strided n-d index spaces of up to 6 dims shared
 * by NOP operands, passed to kernels by value.
 *
 * A linear index l over shape[0..ndim) (row major, last dim fastest) maps to the element offset
 * sum_d idx_d * stride[op][d] of each operand.  Before a launch the space is simplified on the
 * host: dims of size 1 are dropped, and dim d is merged into d+1 when every operand has
 * stride[d] == stride[d+1] * shape[d+1] (the usual contiguous case collapses to one dim), so the
 * per-element div/mod cost follows the real layout, not the tensor's rank. */
#ifndef DG_KERNELS_CUDA_ND_INDEX_H
#define DG_KERNELS_CUDA_ND_INDEX_H

#include <stdint.h>

#define DG_ND_MAX 6

template <int NOP> struct DgNd {
    int ndim;
    int64_t shape[DG_ND_MAX];
    int64_t stride[NOP][DG_ND_MAX];
};

/* Builds the simplified space; strides[o] NULL means contiguous over shape.  Returns the number
 * of elements (0 when any dim is 0). */
template <int NOP>
static inline int64_t dg_nd_make(DgNd<NOP> *nd, int ndim, const int64_t *shape, const int64_t *const strides[NOP]) {
    int64_t st[NOP][DG_ND_MAX], n = 1;
    for (int o = 0; o < NOP; o++) {
        int64_t c = 1;
        for (int d = ndim - 1; d >= 0; d--) {
            st[o][d] = strides[o] ? strides[o][d] : c;
            c *= shape[d];
        }
    }
    for (int d = 0; d < ndim; d++) n *= shape[d];
    nd->ndim = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1) continue;
        int k = nd->ndim;
        bool merge = k > 0;
        for (int o = 0; o < NOP && merge; o++) merge = nd->stride[o][k - 1] == st[o][d] * shape[d];
        if (merge) {
            nd->shape[k - 1] *= shape[d];
            for (int o = 0; o < NOP; o++) nd->stride[o][k - 1] = st[o][d];
        } else {
            nd->shape[k] = shape[d];
            for (int o = 0; o < NOP; o++) nd->stride[o][k] = st[o][d];
            nd->ndim++;
        }
    }
    return n;
}

/* The largest |offset| any operand reaches, to choose 32- or 64-bit index arithmetic. */
template <int NOP> static inline int64_t dg_nd_span(const DgNd<NOP> *nd) {
    int64_t m = 0;
    for (int o = 0; o < NOP; o++) {
        int64_t s = 0;
        for (int d = 0; d < nd->ndim; d++)
            s += (nd->shape[d] - 1) * (nd->stride[o][d] < 0 ? -nd->stride[o][d] : nd->stride[o][d]);
        if (s > m) m = s;
    }
    return m;
}

/* Offsets of linear index l in each operand; IT is int32_t when every index fits. */
template <typename IT, int NOP> __device__ __forceinline__ void dg_nd_offsets(const DgNd<NOP> &nd, IT l, IT off[NOP]) {
#pragma unroll
    for (int o = 0; o < NOP; o++) off[o] = 0;
        /* compile-time dims, so that nd stays in the kernel's parameter space (a run-time index
     * would copy it to local memory) */
#pragma unroll
    for (int d = DG_ND_MAX - 1; d >= 0; d--) {
        if (d >= nd.ndim) continue;
        IT s = (IT)nd.shape[d];
        IT i = l % s;
        l /= s;
#pragma unroll
        for (int o = 0; o < NOP; o++) off[o] += i * (IT)nd.stride[o][d];
    }
}

#endif
