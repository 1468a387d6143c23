/* The optimiser's device kernels: the AdamW update (models/optim.c has the math and the CPU twin)
 * and the sum of squares behind the gradient norm.
 *
 * AdamW is written with the round-to-nearest intrinsics (__fmul_rn, __fadd_rn, ...): nvcc would
 * otherwise fuse a multiply and an add into one FMA (one rounding instead of two), while the CPU
 * build (ISO C11: no contraction) rounds each operation.  sqrt and division are IEEE
 * correctly rounded in both.  So the device update equals the CPU update bit for bit.
 *
 * The sum of squares: a fixed grid of blocks (from n alone) writes one double per block, and one
 * block adds those in order, so the result does not depend on the device. */
#include "kernels/cuda/nn_util.h"

namespace {

__global__ void adamw_kernel(int64_t n, float *p, const float *g, float *m, float *v, float shrink, float step_size,
                             float bc2_sqrt, float eps, float b1, float b2, float c1, float c2) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < n; j += (int64_t)gridDim.x * blockDim.x) {
        float gj = g[j];
        float mj = __fadd_rn(__fmul_rn(b1, m[j]), __fmul_rn(c1, gj));                /* b1 m + c1 g */
        float vj = __fadd_rn(__fmul_rn(b2, v[j]), __fmul_rn(__fmul_rn(c2, gj), gj)); /* b2 v + c2 g g */
        m[j] = mj;
        v[j] = vj;
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vj), bc2_sqrt), eps); /* sqrt(v) / bc2_sqrt + eps */
        p[j] = __fsub_rn(__fmul_rn(p[j], shrink), __fdiv_rn(__fmul_rn(step_size, mj), denom));
    }
}

constexpr int kSumBlocks = 1024;

template <typename T> __global__ void __launch_bounds__(kNnThreads) sumsq_kernel(int64_t n, const T *x, double *part) {
    __shared__ double smem[kNnThreads];
    double acc = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        acc += (double)x[i] * (double)x[i];
    smem[threadIdx.x] = acc;
    __syncthreads();
    for (int half = kNnThreads / 2; half > 0; half >>= 1) {
        if ((int)threadIdx.x < half) smem[threadIdx.x] += smem[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = smem[0];
}

} // namespace

extern "C" int dg_cuda_adamw_f32(int64_t n, float *p, const float *g, float *m, float *v, float shrink, float step_size,
                                 float bc2_sqrt, float eps, float b1, float b2, float c1, float c2) {
    if (n <= 0) return 0;
    if (dg_cuda_init()) return -1;
    adamw_kernel<<<dg_grid_for(n, kNnThreads), kNnThreads, 0, dg_cuda_stream()>>>(n, p, g, m, v, shrink, step_size,
                                                                                  bc2_sqrt, eps, b1, b2, c1, c2);
    return DG_LAUNCHED("adamw");
}

extern "C" int dg_cuda_sumsq_many(int count, const dg_dtype *dt, const int64_t *n, const void *const *x, double *out) {
    for (int t = 0; t < count; t++) {
        out[t] = 0;
        if (!nn_float_dt("cuda sumsq", dt[t])) return -1;
    }
    if (count <= 0) return 0;
    if (dg_cuda_init()) return -1;
    /* per tensor: block sums into part, then (one thread, in block order) the total into totals[t] */
    double *part = dg_cuda_scratch<double>((size_t)kSumBlocks);
    double *totals = dg_cuda_scratch<double>((size_t)count);
    cudaStream_t st = dg_cuda_stream();
    int rc = part && totals ? dg_cuda_memset0(totals, sizeof(double) * (size_t)count) : -1;
    for (int t = 0; rc == 0 && t < count; t++) {
        if (n[t] <= 0) continue;
        int64_t blocks = (n[t] + kNnThreads * 8 - 1) / (kNnThreads * 8);
        if (blocks > kSumBlocks) blocks = kSumBlocks;
        if (dt[t] == DG_F32)
            sumsq_kernel<float><<<(unsigned)blocks, kNnThreads, 0, st>>>(n[t], (const float *)x[t], part);
        else sumsq_kernel<double><<<(unsigned)blocks, kNnThreads, 0, st>>>(n[t], (const double *)x[t], part);
        rc = DG_LAUNCHED("sumsq");
        if (rc == 0)
            rc = dg_cuda_nn_colsum(DG_F64, blocks, 1, part, totals + t); /* stream order: part is reused after */
    }
    if (rc == 0) rc = dg_cuda_memcpy(out, totals, sizeof(double) * (size_t)count, 1);
    dg_cuda_free(part);
    dg_cuda_free(totals);
    return rc;
}
