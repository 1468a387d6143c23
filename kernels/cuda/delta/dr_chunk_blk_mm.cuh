/* Block-wide products of f32 matrices in shared memory, the arithmetic of the generic kernels
 * (dr_chunk_generic.cuh):
 *     Out(i, j) = sum over the terms of sum_{r < kd} A(i, r) B(r, j),    i < M, j < N,
 * each element handed once, by one thread of the block, to the epilogue epi(i, j, x), which stores
 * it, masks it or adds it where the caller wants.  Two forms, chosen at compile time:
 *   TC = false  f32 FMAs, a thread per output element, r in order: the generic family (f32
 *               arithmetic on every storage type; the reference on the GPU).
 *   TC = true   TF32 tensor cores (mma.sync m16n8k8; operands rounded to 10 mantissa bits,
 *               relative 2^-11 against bf16's 2^-8; f32 accumulation): the TF32 family.  A warp
 *               takes output tiles of 16 x 32 in turn (the A fragment of a k step serves four
 *               n tiles), or of 16 x 16 where tiles of 32 columns would leave warps idle.
 * A matrix is a pointer and two strides, A(i, r) = p[i * s0 + r * s1]: a transposed operand is the
 * same array with its strides swapped.  Nothing outside i < M, r < kd, j < N is read (it enters as
 * zero), so the rows and columns past a partial chunk or tile may hold anything.
 * Bank conflicts of the TC loads: a warp reads A at rows g = 0..7 and columns t = 0..3 of a k step
 * (free when s0 = 4 mod 32, s1 = 1, or s0 = 1, s1 = 8 mod 32) and B at rows t, columns g (free when
 * s0 = 8 mod 32, s1 = 1, or s0 = 1, s1 = 4 mod 32); the kernels pad their strides by 4 or 8. */
#ifndef DG_KERNELS_CUDA_DR_CHUNK_BLK_MM_CUH
#define DG_KERNELS_CUDA_DR_CHUNK_BLK_MM_CUH

#include "kernels/cuda/delta/dr_chunk_internal.cuh"

namespace drc {

struct Mat {
    const float *p;
    int s0, s1;
};
/* one product of the sum: A [M, kd] times B [kd, N] (kd = 0: no term) */
struct Term {
    Mat A, B;
    int kd;
};

__device__ __forceinline__ float mat_at(const Mat &m, int i, int r, int ni, int nr) {
    return i < ni && r < nr ? m.p[i * m.s0 + r * m.s1] : 0.0f;
}

/* x - tf32(x) (h: tf32(x)'s bits) rounded to TF32 again: the lo word of the 3xTF32 split */
__device__ __forceinline__ uint32_t tf32_lo(float x, uint32_t h) {
    float hf;
    memcpy(&hf, &h, 4);
    return tf32(x - hf);
}
/* c += a b, or (X3) the 3xTF32 product of the split words: a b + a_lo b + a b_lo (about 21 bits of
 * each operand; the lo words of a, b in al, bl) */
template <bool X3>
__device__ __forceinline__ void mma_tf32_x(float c[4], const uint32_t a[4], const uint32_t al[4], const uint32_t b[2],
                                           const uint32_t bl[2]) {
    mma1688_tf32(c, a, b);
    if (X3) mma1688_tf32(c, al, b), mma1688_tf32(c, a, bl);
}

/* the TC form of one term into a warp's accumulator of 16 rows and nn n tiles of 8 columns at (m0,
 * n0): k steps inside the tile without the bounds tests, the partial ones (the tile's edges) with
 * them; X3: every product as three (mma_tf32_x) */
template <bool X3>
__device__ __forceinline__ void warp_mm_tf32(float (&acc)[4][4], const Term &t, int M, int N, int m0, int n0, int nn) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int k0 = 0;
    if (m0 + 16 <= M && n0 + 8 * nn <= N) {
        const float *A = t.A.p + (m0 + g) * t.A.s0 + q * t.A.s1, *B = t.B.p + q * t.B.s0 + (n0 + g) * t.B.s1;
        const int a8 = 8 * t.A.s0, a4 = 4 * t.A.s1, b4 = 4 * t.B.s0, b8 = 8 * t.B.s1;
        for (; k0 + 8 <= t.kd; k0 += 8, A += 2 * a4, B += 2 * b4) {
            const float af[4] = {A[0], A[a8], A[a4], A[a8 + a4]};
            uint32_t a[4], al[4];
#pragma unroll
            for (int u = 0; u < 4; u++) a[u] = tf32(af[u]), al[u] = X3 ? tf32_lo(af[u], a[u]) : 0u;
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                if (nt >= nn) break;
                const float bf[2] = {B[nt * b8], B[nt * b8 + b4]};
                uint32_t b[2], bl[2];
#pragma unroll
                for (int u = 0; u < 2; u++) b[u] = tf32(bf[u]), bl[u] = X3 ? tf32_lo(bf[u], b[u]) : 0u;
                mma_tf32_x<X3>(acc[nt], a, al, b, bl);
            }
        }
    }
    for (; k0 < t.kd; k0 += 8) {
        const float af[4] = {mat_at(t.A, m0 + g, k0 + q, M, t.kd), mat_at(t.A, m0 + g + 8, k0 + q, M, t.kd),
                             mat_at(t.A, m0 + g, k0 + q + 4, M, t.kd), mat_at(t.A, m0 + g + 8, k0 + q + 4, M, t.kd)};
        uint32_t a[4], al[4];
#pragma unroll
        for (int u = 0; u < 4; u++) a[u] = tf32(af[u]), al[u] = X3 ? tf32_lo(af[u], a[u]) : 0u;
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            const int j = n0 + nt * 8 + g;
            if (nt >= nn || n0 + nt * 8 >= N) break; /* (the same for the whole warp) */
            const float bf[2] = {j < N ? mat_at(t.B, k0 + q, j, t.kd, N) : 0.0f,
                                 j < N ? mat_at(t.B, k0 + q + 4, j, t.kd, N) : 0.0f};
            uint32_t b[2], bl[2];
#pragma unroll
            for (int u = 0; u < 2; u++) b[u] = tf32(bf[u]), bl[u] = X3 ? tf32_lo(bf[u], b[u]) : 0u;
            mma_tf32_x<X3>(acc[nt], a, al, b, bl);
        }
    }
}

/* Out = t1 + t2 (t2.kd = 0: t1 alone) by the block's NTH threads; no barrier inside (the caller
 * puts one between writing an operand and the product that reads it, and after the epilogue's
 * stores where another thread reads them).  X3 (TC): each product as three TF32 ones of split
 * words (3xTF32, about f32's accuracy at three times the mma) */
template <bool TC, int NTH, class Epi, bool X3 = false>
__device__ __forceinline__ void blk_mm2(int M, int N, const Term &t1, const Term &t2, Epi epi) {
    if constexpr (!TC) {
        for (int e = threadIdx.x; e < M * N; e += NTH) {
            const int i = e / N, j = e % N;
            float s = 0.0f;
            for (int r = 0; r < t1.kd; r++) s += t1.A.p[i * t1.A.s0 + r * t1.A.s1] * t1.B.p[r * t1.B.s0 + j * t1.B.s1];
            for (int r = 0; r < t2.kd; r++) s += t2.A.p[i * t2.A.s0 + r * t2.A.s1] * t2.B.p[r * t2.B.s0 + j * t2.B.s1];
            epi(i, j, s);
        }
    } else {
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
        /* tiles of 16 x 32, or of 16 x 16 where those would leave warps idle (a 64 x 64 product) */
        const int nn = (M + 15) / 16 * ((N + 31) / 32) < NTH / 32 ? 2 : 4;
        const int tn = (N + 8 * nn - 1) / (8 * nn), ntile = (M + 15) / 16 * tn;
        for (int w = warp; w < ntile; w += NTH / 32) {
            const int m0 = w / tn * 16, n0 = w % tn * 8 * nn;
            float acc[4][4] = {};
            warp_mm_tf32<X3>(acc, t1, M, N, m0, n0, nn);
            if (t2.kd) warp_mm_tf32<X3>(acc, t2, M, N, m0, n0, nn);
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = m0 + g + 8 * (e >> 1), j = n0 + nt * 8 + 2 * q + (e & 1);
                    if (nt < nn && i < M && j < N) epi(i, j, acc[nt][e]);
                }
        }
    }
}

template <bool TC, int NTH, class Epi> __device__ __forceinline__ void blk_mm(int M, int N, const Term &t, Epi epi) {
    blk_mm2<TC, NTH>(M, N, t, Term{t.A, t.B, 0}, epi);
}
/* blk_mm with the 3xTF32 products (TC) */
template <bool TC, int NTH, class Epi> __device__ __forceinline__ void blk_mm_x3(int M, int N, const Term &t, Epi epi) {
    blk_mm2<TC, NTH, Epi, true>(M, N, t, Term{t.A, t.B, 0}, epi);
}

/* The operands' way into shared memory: rows x cols of a row-major matrix of S (float, or 16-bit
 * bits read through ldx) at src (row stride lds) to dst (row stride ldd), each element x of row i,
 * column c stored as f(i, c, x).  16-byte loads, several in flight a thread, where the row length,
 * the strides and the address allow (element loads one after another leave a multiprocessor's
 * memory pipe nearly idle); element loads otherwise. */
template <int NTH, typename S, class F>
__device__ __forceinline__ void stage(float *dst, int ldd, const S *src, int64_t lds, int rows, int cols, F f) {
    constexpr int VEC = 16 / sizeof(S);
    if (cols % VEC == 0 && lds % VEC == 0 && ((uintptr_t)src & 15) == 0) {
        const int cv = cols / VEC;
#pragma unroll 4
        for (int e = threadIdx.x; e < rows * cv; e += NTH) {
            const int i = e / cv, c = e % cv * VEC;
            const uint4 w = *(const uint4 *)(src + i * lds + c);
            S v[VEC];
            memcpy(v, &w, 16);
#pragma unroll
            for (int k = 0; k < VEC; k++) dst[i * ldd + c + k] = f(i, c + k, ldx(v + k));
        }
    } else {
        for (int e = threadIdx.x; e < rows * cols; e += NTH) {
            const int i = e / cols, c = e % cols;
            dst[i * ldd + c] = f(i, c, ldx(src + i * lds + c));
        }
    }
}
/* stage with the elements as they are */
struct AsIs {
    __device__ __forceinline__ float operator()(int, int, float x) const { return x; }
};

} // namespace drc

#endif
