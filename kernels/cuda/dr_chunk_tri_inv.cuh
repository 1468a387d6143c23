/* The triangular inverse of the chunked kernels' WY form, (I + A)^-1 for a strictly lower A of
 * at most 64 x 64 in shared memory (f32), by a block of FNT = 256 threads: shared by the head-gate
 * prep (dr_chunk_mma_fwd.cu) and the per-channel-gate prep (dr_chunk_kda_mma_fwd.cu). */
#ifndef DG_KERNELS_CUDA_DR_CHUNK_TRI_INV_CUH
#define DG_KERNELS_CUDA_DR_CHUNK_TRI_INV_CUH

#include "kernels/cuda/dr_chunk_mma.cuh"

namespace drc {
namespace DRC_FAST {

constexpr int TRI_LD = 65; /* row stride (floats) of the 64 x 64 matrices: conflict-free columns */

/* sum_{t < n} a[t] b[t * ldb] with four independent partial sums: the dot products of the merge
 * steps below are up to 48 long and ran as one dependent chain of shared-memory loads and adds,
 * which at one or two blocks per multiprocessor nothing else hid */
__device__ __forceinline__ float tri_dot(const float *a, const float *b, int ldb, int n) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    int t = 0;
    for (; t + 4 <= n; t += 4) {
        s0 += a[t] * b[t * ldb];
        s1 += a[t + 1] * b[(t + 1) * ldb];
        s2 += a[t + 2] * b[(t + 2) * ldb];
        s3 += a[t + 3] * b[(t + 3) * ldb];
    }
    for (; t < n; t++) s0 += a[t] * b[t * ldb];
    return (s0 + s1) + (s2 + s3);
}

/* (I + A)^-1 of the strictly lower L x L matrix sA into sY (zero on entry), ld TRI_LD; sT scratch.
 * Forward substitution by columns inside diagonal blocks of bs rows (bs = 16 blocked, else 64),
 * then, blocked, the blocks below the diagonal block row by block row:
 *   Y_IJ = -Y_II (A[I, J0:I0] Y[J0:I0, J]). */
__device__ __forceinline__ void tri_inv(const float *sA, float *sY, float *sT, int L, int blocked) {
    const int tid = threadIdx.x, bs = blocked ? 16 : FC;
    static_assert(FNT == 4 * FC, "four threads a column");
    { /* diagonal blocks, four threads (adjacent lanes) a column, each a quarter of every dot
       * product; the 8 columns of a warp lie in one block, so the row loop is the same for
       * the whole warp (shuffles and __syncwarp in it are safe) */
        const int col = tid >> 2, sub = tid & 3;
        const int b0 = col / bs * bs, i1 = b0 + bs < L ? b0 + bs : L;
        if (sub == 0 && col < L) sY[col * TRI_LD + col] = 1.0f;
        wsync();
        for (int i = b0 + 1; i < i1; i++) {
            float s = 0.0f;
            if (i > col)
                for (int j = col + sub; j < i; j += 4) s += sA[i * TRI_LD + j] * sY[j * TRI_LD + col];
            s += shfl_xor(s, 1);
            s += shfl_xor(s, 2);
            if (sub == 0 && i > col) sY[i * TRI_LD + col] = -s;
            wsync();
        }
    }
    bsync();
    for (int i0 = bs; blocked && i0 < L; i0 += bs) {
        int i1 = i0 + bs < L ? i0 + bs : L;
        for (int e = tid; e < (i1 - i0) * i0; e += FNT) { /* T = A[I, c:I0] Y[c:I0, J] */
            int i = i0 + e / i0, c = e % i0;
            sT[i * TRI_LD + c] = tri_dot(sA + i * TRI_LD + c, sY + c * TRI_LD + c, TRI_LD, i0 - c);
        }
        bsync();
        for (int e = tid; e < (i1 - i0) * i0; e += FNT) { /* Y_IJ = -Y_II T */
            int i = i0 + e / i0, c = e % i0;
            sY[i * TRI_LD + c] = -tri_dot(sY + i * TRI_LD + i0, sT + i0 * TRI_LD + c, TRI_LD, i - i0 + 1);
        }
        bsync();
    }
}

} // namespace DRC_FAST
} // namespace drc

#endif
