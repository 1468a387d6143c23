/* The triangular inverse of the chunked kernels' WY form, (I + A)^-1 for a strictly lower A of
 * at most 64 x 64 in shared memory (f32), by a block of NTH = 256 (FNT) or 512 threads: shared by
 * the head-gate prep (dr_chunk_mma_fwd.cu) and the per-channel-gate prep (dr_chunk_kda_mma_fwd.cu).
 *
 * Blocked (what both preps run): the 16 x 16 diagonal blocks by forward substitution on CUDA
 * cores, a lane a column in registers (tri_diag16), then the blocks below them, block row by
 * block row, on tensor cores (tri_merge_row):
 * mma.sync m16n8k16 with f32 accumulation, every f32 operand split into hi + lo 16-bit words as in
 * the rest of the family (split2, dr_chunk_mma.cuh) and multiplied in three passes, hi hi + lo hi
 * + hi lo (about 16 significant bits with bf16 words, 22 with fp16: the W, U products that use the
 * inverse take it as such split words anyway; in the emulator, unit keys, beta < 2, keys up to
 * strongly correlated: ||Y - Y_f64|| / ||Y_f64|| <= 1.7e-5 bf16, 4e-7 fp16, 3.5e-7 the f32 merges
 * before).  The fragments are built straight from the f32 matrices in shared memory (scalar
 * loads, split in registers: no 16-bit copies of A or Y).  As scalar f32 dot products, two shared
 * loads an FMA, the merges would take ~5k warp-level loads a block, about a quarter of the
 * head-gate prep's time (H100, 4096 blocks); as mma they take 208 warp-level loads (4-way bank
 * conflicts: a fragment's elements (g, 2t) lie in bank g + 2t), 48 stores and 96 mma a block.
 * Unblocked (blocked = 0): substitution over the whole matrix, CUDA cores only. */
#ifndef DG_KERNELS_CUDA_DR_CHUNK_TRI_INV_CUH
#define DG_KERNELS_CUDA_DR_CHUNK_TRI_INV_CUH

#include "kernels/cuda/delta/dr_chunk_mma.cuh"

namespace drc {
namespace DRC_FAST {

constexpr int TRI_LD = 65; /* row stride (floats) of the 64 x 64 matrices: conflict-free columns */

/* ---- mma.sync m16n8k16 operands from f32 values, split ----
 * R 32-bit registers of a fragment, each two 16-bit words (the first element in the low half):
 * the hi words of the values in hi, their lo words (x - hi) in lo.  Lane g = lane / 4, t = lane % 4
 * (the PTX layouts, as dr_chunk_emu.h emulates them). */
template <int R> struct SplitFrag { uint32_t hi[R], lo[R]; };

/* (x0, x1) split into register r */
template <int R> __device__ __forceinline__ void split_into(SplitFrag<R> &f, int r, float x0, float x1) {
    uint16_t h0, l0, h1, l1;
    split2(x0, h0, l0);
    split2(x1, h1, l1);
    f.hi[r] = (uint32_t)h0 | ((uint32_t)h1 << 16);
    f.lo[r] = (uint32_t)l0 | ((uint32_t)l1 << 16);
}

/* the A operand (16 x 16, m x k) X(m, k) = x[m * ms + k * ks]:
 *   a0 = X(g, 2t..2t+1)  a1 = X(g+8, 2t..2t+1)  a2 = X(g, 2t+8..2t+9)  a3 = X(g+8, 2t+8..2t+9) */
__device__ __forceinline__ SplitFrag<4> frag_a_split(const float *x, int ms, int ks) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    SplitFrag<4> f;
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const float *p = x + (g + 8 * (r & 1)) * ms + (2 * t + 8 * (r >> 1)) * ks;
        split_into(f, r, p[0], p[ks]);
    }
    return f;
}

/* the B operand (16 x 8, k x n) X(k, n) = x[k * ks + n * ns], zero (x not read) where live is
 * false (live: this lane's column g):  b0 = X(2t..2t+1, g)  b1 = X(2t+8..2t+9, g) */
__device__ __forceinline__ SplitFrag<2> frag_b_split(const float *x, int ks, int ns, bool live) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    SplitFrag<2> f;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float *p = x + (2 * t + 8 * r) * ks + g * ns;
        split_into(f, r, live ? p[0] : 0.0f, live ? p[ks] : 0.0f);
    }
    return f;
}

/* c += X Y of split operands, three passes: hi hi + lo hi + hi lo (lo lo, 2^-16 of the product
 * with bf16 words, is left out) */
__device__ __forceinline__ void mma_split3(float (&c)[4], const SplitFrag<4> &a, const SplitFrag<2> &b) {
    mma_op(c, a.hi, b.hi);
    mma_op(c, a.lo, b.hi);
    mma_op(c, a.hi, b.lo);
}

/* One block row I (rows I0 .. I0 + 15) of the blocked merge, given the rows above it:
 *   T = A[I, 0:I0] Y[0:I0, 0:I0]   (16 x I0, inner dimension I0)
 *   Y[I, 0:I0] = -Y_II T            (16 x I0, inner dimension 16)
 * on tensor cores, warp w < I0 / 16 taking the 16 columns C = 16w .. 16w + 15 (the other warps wait
 * at the barrier), both products in registers:
 *   T[I, C]^T = Y[0:I0, C]^T A[I, 0:I0]^T   (m: the columns C; n: the rows I, two tiles of 8)
 * over k = 16w .. I0 - 1 only (Y lower by blocks: Y[k, C] = 0 for k < 16w), then
 *   Y[I, C] = -Y_II T[I, C]                 (m: the rows I; n: the columns C, two tiles of 8).
 * T is computed transposed because its accumulator then is, register for register, the B
 * operand of the second product: n tile j of T^T holds at lane (g, t)
 *   c0, c1 = T(I0 + 8j + 2t .. +1, 16w + g),  c2, c3 = T(I0 + 8j + 2t .. +1, 16w + 8 + g),
 * and n tile h of the second product wants b0 = T(I0 + 2t .. +1, 16w + 8h + g), b1 = the same 8
 * rows further: b0 = (c0, c1) (h = 0) or (c2, c3) (h = 1) of tile j = 0, b1 the same of tile 1.
 * No exchange between lanes (nor scratch, nor a barrier) between the two products.
 * T's rows at or past L are zero (the B operand's columns: A is not read there, whatever it
 * holds), so Y's stay zero.  Y's upper part is zero on entry, A's is not read (k < I0 <= rows I).
 * The block's barrier at the end: the next block row reads the rows written here. */
template <int I0> __device__ __forceinline__ void tri_merge_row(const float *sA, float *sY, int L) {
    constexpr int LD = TRI_LD, KB = I0 / 16; /* k steps of 16 */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    if (warp < KB) {
        const int c0 = 16 * warp;
        float tt[2][4] = {}; /* T[I, C]^T, n tile j: the rows I0 + 8j .. I0 + 8j + 7 */
#pragma unroll
        for (int kb = 0; kb < KB; kb++) {
            if (kb < warp) continue; /* Y[16 kb .. 16 kb + 15, C] = 0 */
            const int k0 = 16 * kb;
            const SplitFrag<4> yt = frag_a_split(sY + k0 * LD + c0, 1, LD); /* X(m, k) = Y(k0 + k, c0 + m) */
#pragma unroll
            for (int j = 0; j < 2; j++) { /* X(k, n) = A(I0 + 8j + n, k0 + k) */
                const int i = I0 + 8 * j;
                mma_split3(tt[j], yt, frag_b_split(sA + i * LD + k0, 1, LD, i + g < L));
            }
        }
        const SplitFrag<4> yii = frag_a_split(sY + I0 * LD + I0, LD, 1); /* X(m, k) = Y(I0 + m, I0 + k) */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            SplitFrag<2> tb; /* X(k, n) = T(I0 + k, c0 + 8h + n) */
#pragma unroll
            for (int j = 0; j < 2; j++) split_into(tb, j, tt[j][2 * h], tt[j][2 * h + 1]);
            float y[4] = {};
            mma_split3(y, yii, tb);
            float *o = sY + (I0 + g) * LD + c0 + 8 * h + 2 * t; /* (row g, cols 2t, 2t+1), 8 rows further */
            o[0] = -y[0], o[1] = -y[1], o[8 * LD] = -y[2], o[8 * LD + 1] = -y[3];
        }
    }
    bsync();
}

/* The four diagonal 16 x 16 blocks Y_BB = (I + A_BB)^-1 of the blocked inverse, by the first 64
 * threads: a half warp a block, a lane a column c of Y_BB, held in registers and made row by row,
 *   Y(i, c) = [i = c] - sum_{b0 <= j < i} A(i, j) Y(j, c)
 * (A's row i is read by the 16 lanes at once: a broadcast).  No shuffles and no barrier: it was
 * four threads a column with a shuffle sum and a __syncwarp at each of the 15 rows.  Rows and
 * columns at or past L are zero. */
__device__ __forceinline__ void tri_diag16(const float *sA, float *sY, int L) {
    if (threadIdx.x >= 64) return;
    const int cl = threadIdx.x & 15, b0 = 16 * (int)(threadIdx.x >> 4), c = b0 + cl;
    const float *a = sA + b0 * TRI_LD + b0;
    float y[16];
#pragma unroll
    for (int i = 0; i < 16; i++) {
        float s = i == cl ? 1.0f : 0.0f;
#pragma unroll
        for (int j = 0; j < i; j++) s -= a[i * TRI_LD + j] * y[j];
        y[i] = b0 + i < L && c < L ? s : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 16; i++) sY[(b0 + i) * TRI_LD + c] = y[i];
}

/* (I + A)^-1 of the strictly lower L x L matrix sA into sY (zero on entry), ld TRI_LD (no scratch:
 * the merges run in registers).  Blocked: the diagonal 16 x 16 blocks (tri_diag16), then the
 * blocks below them block row by block row (tri_merge_row): Y_IJ = -Y_II (A[I, J0:I0] Y[J0:I0, J]).
 * Unblocked (the substitution variant): forward substitution by columns over the whole matrix,
 * SUB threads (adjacent lanes) a column, each a SUB-th of every dot product. */
template <int NTH = FNT> __device__ __forceinline__ void tri_inv(const float *sA, float *sY, int L, int blocked) {
    constexpr int SUB = NTH / FC; /* threads a column: 4 or 8 */
    static_assert(FC == 64 && (SUB == 4 || SUB == 8), "threads a column");
    static_assert(NTH / 32 >= 3, "the merges' warps");
    if (blocked) {
        tri_diag16(sA, sY, L);
        bsync();
        if (L > 16) tri_merge_row<16>(sA, sY, L);
        if (L > 32) tri_merge_row<32>(sA, sY, L);
        if (L > 48) tri_merge_row<48>(sA, sY, L);
        return;
    }
    /* the columns of a warp are 32 / SUB adjacent ones: the row loop is the same for the whole
     * warp (shuffles and __syncwarp in it are safe) */
    const int tid = threadIdx.x, col = tid / SUB, sub = tid % SUB;
    if (sub == 0 && col < L) sY[col * TRI_LD + col] = 1.0f;
    wsync();
    for (int i = 1; i < L; i++) {
        float s = 0.0f;
        if (i > col)
            for (int j = col + sub; j < i; j += SUB) s += sA[i * TRI_LD + j] * sY[j * TRI_LD + col];
#pragma unroll
        for (int o = 1; o < SUB; o <<= 1) s += shfl_xor(s, o);
        if (sub == 0 && i > col) sY[i * TRI_LD + col] = -s;
        wsync();
    }
    bsync();
}

/* rows < L of a 64 x 64 matrix of shared memory (TRI_LD) to device rows of 64 floats at stride ld
 * (floats), 16-byte vectors of four columns, by the block's NTH threads (KDA's prep; the head-gate
 * prep keeps its copy of a float a thread, measured the faster there: PERF_KERNELS.md) */
template <int NTH> __device__ __forceinline__ void tri_rows_out(float *g, int64_t ld, const float *s, int L) {
    for (int e = threadIdx.x; e < L * 16; e += NTH) {
        const int i = e >> 4, j = (e & 15) * 4;
        const float *r = s + i * TRI_LD + j;
        *(float4 *)(g + i * ld + j) = make_float4(r[0], r[1], r[2], r[3]);
    }
}

} // namespace DRC_FAST
} // namespace drc

#endif
