/* Row-major strided batched matrix products through cuBLAS (column major).
 *
 * A row-major matrix X [r, c] with row stride ld is, read column major, X^T [c, r] with the same
 * leading dimension.  So the row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T:
 * cuBLAS is called with the operands swapped (B first), m = N, n = M, and each operand's own
 * transpose flag:  B stored [K,N] reads column major as B^T [N,K], already op(B)^T (no transpose);
 * B stored [N,K] (trans_b) reads as B [K,N], so it needs the transpose; the same for A.
 *
 * Compute types: f32 uses CUBLAS_COMPUTE_32F with the handle's default math mode, which never
 * uses TF32 (so results match a CPU f32 product to rounding); bf16 operands accumulate in f32. */
#include "kernels/cuda/cuda_util.h"

#include <limits.h>

namespace {

bool fits_int(const char *what, int64_t v) {
    if (v >= 0 && v <= INT_MAX) return true;
    dg_error("cuda gemm: %s = %lld is out of range (0..%d)", what, (long long)v, INT_MAX);
    return false;
}

/* K == 0: the product is empty, C = beta C (beta == 0 writes zeros without reading C). */
template <typename T>
__global__ void scale_c_kernel(int64_t batch, int64_t M, int64_t N, T *C, int64_t ldc, int64_t stride_c, float beta) {
    int64_t n = batch * M * N;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t b = i / (M * N), r = i / N % M, c = i % N;
        T *p = C + b * stride_c + r * ldc + c;
        *p = beta == 0.0f ? T(0.0f) : T(beta * (float)*p);
    }
}

__global__ void scale_c_kernel_f64(int64_t batch, int64_t M, int64_t N, double *C, int64_t ldc, int64_t stride_c,
                                   double beta) {
    int64_t n = batch * M * N;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t b = i / (M * N), r = i / N % M, c = i % N;
        double *p = C + b * stride_c + r * ldc + c;
        *p = beta == 0.0 ? 0.0 : beta * *p;
    }
}

int scale_c(dg_dtype c_dt, int64_t batch, int64_t M, int64_t N, void *C, int64_t ldc, int64_t stride_c, double beta) {
    unsigned grid = dg_grid_for(batch * M * N, 256);
    cudaStream_t s = dg_cuda_stream();
    if (c_dt == DG_F64) scale_c_kernel_f64<<<grid, 256, 0, s>>>(batch, M, N, (double *)C, ldc, stride_c, beta);
    else if (c_dt == DG_F32)
        scale_c_kernel<float><<<grid, 256, 0, s>>>(batch, M, N, (float *)C, ldc, stride_c, (float)beta);
    else
        scale_c_kernel<__nv_bfloat16><<<grid, 256, 0, s>>>(batch, M, N, (__nv_bfloat16 *)C, ldc, stride_c, (float)beta);
    return DG_LAUNCHED("gemm scale_c");
}

} // namespace

extern "C" int dg_cuda_gemm(dg_dtype ab_dt, dg_dtype c_dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                            double alpha, const void *A, int64_t lda, int64_t stride_a, const void *B, int64_t ldb,
                            int64_t stride_b, double beta, void *C, int64_t ldc, int64_t stride_c, int64_t batch) {
    cudaDataType_t ta, tc;
    cublasComputeType_t ct;
    if (ab_dt == DG_F32 && c_dt == DG_F32) {
        ta = tc = CUDA_R_32F, ct = CUBLAS_COMPUTE_32F;
    } else if (ab_dt == DG_F64 && c_dt == DG_F64) {
        ta = tc = CUDA_R_64F, ct = CUBLAS_COMPUTE_64F;
    } else if (ab_dt == DG_BF16 && (c_dt == DG_BF16 || c_dt == DG_F32)) {
        ta = CUDA_R_16BF, tc = c_dt == DG_F32 ? CUDA_R_32F : CUDA_R_16BF, ct = CUBLAS_COMPUTE_32F;
    } else {
        dg_error("cuda gemm: operands %s with result %s are not supported (f32/f32, f64/f64, "
                 "bf16/bf16, bf16/f32)",
                 dg_dtype_name(ab_dt), dg_dtype_name(c_dt));
        return -1;
    }
    if (!fits_int("M", M) || !fits_int("N", N) || !fits_int("K", K) || !fits_int("batch", batch)) return -1;
    /* row strides: at least the row length of each stored matrix */
    int64_t a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
    if (lda < (a_cols > 1 ? a_cols : 1) || ldb < (b_cols > 1 ? b_cols : 1) || ldc < (N > 1 ? N : 1)) {
        dg_error("cuda gemm: row strides lda %lld, ldb %lld, ldc %lld are shorter than the rows "
                 "(%lld, %lld, %lld)",
                 (long long)lda, (long long)ldb, (long long)ldc, (long long)a_cols, (long long)b_cols, (long long)N);
        return -1;
    }
    if (!fits_int("lda", lda) || !fits_int("ldb", ldb) || !fits_int("ldc", ldc)) return -1;
    if (M == 0 || N == 0 || batch == 0) return 0;
    if (K == 0) return dg_cuda_init() ? -1 : scale_c(c_dt, batch, M, N, C, ldc, stride_c, beta);
    cublasHandle_t h = dg_cuda_cublas();
    if (!h) return -1;
    float alpha_f = (float)alpha, beta_f = (float)beta;
    const void *pa = ct == CUBLAS_COMPUTE_64F ? (const void *)&alpha : (const void *)&alpha_f;
    const void *pb = ct == CUBLAS_COMPUTE_64F ? (const void *)&beta : (const void *)&beta_f;
    cublasOperation_t opa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (batch == 1) {
        DG_CUBLAS_TRY(cublasGemmEx(h, opb, opa, (int)N, (int)M, (int)K, pa, B, ta, (int)ldb, A, ta, (int)lda, pb, C, tc,
                                   (int)ldc, ct, CUBLAS_GEMM_DEFAULT));
    } else {
        DG_CUBLAS_TRY(cublasGemmStridedBatchedEx(h, opb, opa, (int)N, (int)M, (int)K, pa, B, ta, (int)ldb,
                                                 (long long)stride_b, A, ta, (int)lda, (long long)stride_a, pb, C, tc,
                                                 (int)ldc, (long long)stride_c, (int)batch, ct, CUBLAS_GEMM_DEFAULT));
    }
    return DG_LAUNCHED("cublas gemm");
}
