/* The triangular inverse of the chunked kernels' WY form, (I + A)^-1 for a strictly lower A of
 * at most 64 x 64 in shared memory (f32), by a block of NTH = 256 (FNT) or 512 threads: shared by
 * the head-gate prep (dr_chunk_mma_fwd.cu) and the per-channel-gate prep (dr_chunk_kda_mma_fwd.cu). */
#ifndef DG_KERNELS_CUDA_DR_CHUNK_TRI_INV_CUH
#define DG_KERNELS_CUDA_DR_CHUNK_TRI_INV_CUH

#include "kernels/cuda/dr_chunk_mma.cuh"

namespace drc {
namespace DRC_FAST {

constexpr int TRI_LD = 65; /* row stride (floats) of the 64 x 64 matrices: conflict-free columns */

/* sum_{t < N} a[t] b[t * ldb] with four independent partial sums (a fixed trip count, unrolled:
 * the merge steps below ran as loops of variable length, with a division and a remainder for each
 * element, and made the inverse instruction-bound: 36k warp instructions a block) */
template <int N> __device__ __forceinline__ float tri_dot(const float *a, const float *b, int ldb) {
    static_assert(N % 4 == 0, "four partial sums");
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma unroll
    for (int t = 0; t < N; t += 4) {
        s0 += a[t] * b[t * ldb];
        s1 += a[t + 1] * b[(t + 1) * ldb];
        s2 += a[t + 2] * b[(t + 2) * ldb];
        s3 += a[t + 3] * b[(t + 3) * ldb];
    }
    return (s0 + s1) + (s2 + s3);
}

/* one block row I (rows I0 .. I0 + 15) of the blocked merge, given the rows above it:
 *   T = A[I, 0:I0] Y[0:I0, 0:I0]   (Y's upper part is zero: the sum may run over all of 0:I0)
 *   Y[I, 0:I0] = -Y_II T            (Y_II lower: the sum may run over the whole diagonal block)
 * T's rows at or past L are set to zero (whatever A holds there), so Y's stay zero. */
template <int I0, int NTH> __device__ __forceinline__ void tri_merge_row(const float *sA, float *sY, float *sT, int L) {
    constexpr int LD = TRI_LD, N = 16 * I0, IT = (N + NTH - 1) / NTH; /* elements, a thread's share */
    const int tid = threadIdx.x;
#pragma unroll
    for (int u = 0; u < IT; u++) {
        const int e = tid + u * NTH, i = I0 + e / I0, c = e % I0;
        if (N % NTH == 0 || e < N) sT[i * LD + c] = i < L ? tri_dot<I0>(sA + i * LD, sY + c, LD) : 0.0f;
    }
    bsync();
#pragma unroll
    for (int u = 0; u < IT; u++) {
        const int e = tid + u * NTH, i = I0 + e / I0, c = e % I0;
        if (N % NTH == 0 || e < N) sY[i * LD + c] = -tri_dot<16>(sY + i * LD + I0, sT + I0 * LD + c, LD);
    }
    bsync();
}

/* (I + A)^-1 of the strictly lower L x L matrix sA into sY (zero on entry), ld TRI_LD; sT scratch.
 * Forward substitution by columns inside diagonal blocks of bs rows (bs = 16 blocked, else 64),
 * then, blocked, the blocks below the diagonal block row by block row (tri_merge_row):
 *   Y_IJ = -Y_II (A[I, J0:I0] Y[J0:I0, J]). */
template <int NTH = FNT>
__device__ __forceinline__ void tri_inv(const float *sA, float *sY, float *sT, int L, int blocked) {
    constexpr int SUB = NTH / FC; /* threads a column: 4 or 8 */
    static_assert(FC == 64 && (SUB == 4 || SUB == 8), "threads a column");
    const int tid = threadIdx.x, bs = blocked ? 16 : FC;
    { /* diagonal blocks, SUB threads (adjacent lanes) a column, each a SUB-th of every dot
       * product; the 32 / SUB columns of a warp lie in one block, so the row loop is the same for
       * the whole warp (shuffles and __syncwarp in it are safe) */
        const int col = tid / SUB, sub = tid % SUB;
        const int b0 = col / bs * bs, i1 = b0 + bs < L ? b0 + bs : L;
        if (sub == 0 && col < L) sY[col * TRI_LD + col] = 1.0f;
        wsync();
        for (int i = b0 + 1; i < i1; i++) {
            float s = 0.0f;
            if (blocked) { /* the block row before i, unrolled (Y_jc = 0 for j < c: the sum may start at b0) */
#pragma unroll
                for (int m = 0; m < 16 / SUB; m++) {
                    const int j = b0 + sub + SUB * m;
                    if (j < i) s += sA[i * TRI_LD + j] * sY[j * TRI_LD + col];
                }
            } else if (i > col) {
                for (int j = col + sub; j < i; j += SUB) s += sA[i * TRI_LD + j] * sY[j * TRI_LD + col];
            }
#pragma unroll
            for (int o = 1; o < SUB; o <<= 1) s += shfl_xor(s, o);
            if (sub == 0 && i > col) sY[i * TRI_LD + col] = -s;
            wsync();
        }
    }
    bsync();
    if (blocked) {
        if (L > 16) tri_merge_row<16, NTH>(sA, sY, sT, L);
        if (L > 32) tri_merge_row<32, NTH>(sA, sY, sT, L);
        if (L > 48) tri_merge_row<48, NTH>(sA, sY, sT, L);
    }
}

} // namespace DRC_FAST
} // namespace drc

#endif
