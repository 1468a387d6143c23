/* The L2 norm of q and k inside the chunked forward (use_qk_l2norm_in_kernel; dr_chunk_cuda.h, the
 * call's l2): the tensor-core forward normalises the rows as it loads them, k in f_prep and q in
 * f_out (head gate), both in KDA's prep, instead of a pass of its own over q and k before it (which read q, k
 * and wrote them again: about 4 % of GDN's fwd+bwd at S1 on an H100).  Each writes the
 * normalised rows and their 1/|x| out for the later kernels and the backward.
 *
 *   r = 1/sqrt(sum_d x_d^2 + eps),  y = round(x r)   (f32 inside, rounded once to the operand format)
 *
 * A warp per row, lane l holding the K / 32 consecutive values at (K / 32) l, r from l2_rnorm
 * (dr_l2norm_row.cuh): the lanes and the order of the norm's own kernel (dr_pieces.cu), so the
 * fused forward gives the bits of that kernel followed by the forward (test_dr_chunk_l2_fused). */
#ifndef DG_KERNELS_CUDA_DR_CHUNK_L2NORM_CUH
#define DG_KERNELS_CUDA_DR_CHUNK_L2NORM_CUH

#include "kernels/cuda/delta/dr_chunk_internal.cuh"
#include "kernels/cuda/delta/dr_l2norm_row.cuh"

namespace drc {

template <int E> struct alignas(2 * E) Row16 { uint16_t h[E]; };

/* One row of K (64 or 128) 16-bit values (F16: fp16 bits, else bf16) at x, normalised by the
 * calling warp: y to ys (shared or global; may be x) and to yg where non-NULL, r to *rg (lane 0)
 * where non-NULL. */
template <int K, bool F16>
__device__ __forceinline__ void l2norm_row(const uint16_t *x, uint16_t *ys, uint16_t *yg, float *rg, float eps) {
    constexpr int E = K / 32;
    static_assert(E == 2 || E == 4, "rows of 64 or 128 values");
    const int lane = (int)threadIdx.x & 31;
    const Row16<E> u = *(const Row16<E> *)(x + E * lane);
    float v[E];
#pragma unroll
    for (int i = 0; i < E; i++) v[i] = F16 ? h2f(u.h[i]) : bf2f(u.h[i]);
    const float r = l2_rnorm(v, eps, [](float a, int off) { return shfl_xor(a, off); });
    Row16<E> y;
#pragma unroll
    for (int i = 0; i < E; i++) y.h[i] = F16 ? f2h(v[i] * r) : f2bf(v[i] * r);
    if (ys) *(Row16<E> *)(ys + E * lane) = y;
    if (yg) *(Row16<E> *)(yg + E * lane) = y;
    if (rg && lane == 0) *rg = r;
}

/* The rows of a shared-memory tile [64][K] (row stride ld) normalised in place by the block's NTH
 * threads, 64 / (NTH / 32) rows a warp, all of a warp's rows at once (unrolled, no branch: their
 * loads, shuffles and square roots overlap; one row after the other, f_prep and f_out waited
 * ~1.3 us a block).  Rows >= L must hold zeros (the loads zero-fill them): they stay zeros.  With
 * yg non-NULL rows i < L also go to yg + i ldg and r to rg[i ldr] (the caller passes NULLs in the
 * blocks that should not write: another value head of the same key head writes the same rows).
 * The caller puts barriers before (the tile loaded) and after. */
template <int K, bool F16, int NTH>
__device__ __forceinline__ void l2norm_tile(uint16_t *s, int ld, int L, float eps, uint16_t *yg, int64_t ldg, float *rg,
                                            int64_t ldr) {
    constexpr int RW = 64 / (NTH / 32);
    const int w = (int)threadIdx.x >> 5;
#pragma unroll
    for (int j = 0; j < RW; j++) {
        const int i = w + j * (NTH / 32);
        uint16_t *row = s + i * ld;
        const bool out = yg && i < L;
        l2norm_row<K, F16>(row, row, out ? yg + i * ldg : nullptr, out && rg ? rg + i * ldr : nullptr, eps);
    }
}

/* A kernel's part of the L2 norm in the forward: on, the rows it loads are raw and it normalises
 * them; the normalised rows [rows, H, K] and their 1/|x| [rows, H] go to y and r where non-NULL,
 * from the first value head of each key head only (the others load the same rows) */
struct L2Rows {
    uint16_t *y;
    float *r;
    float eps;
    int on;
};

/* rows r0 .. r0 + L - 1 of the tile at s (row stride ld), key head hv / G.grp, normalised in
 * place by the block's NTH threads where l2.on (between barriers: the caller's before, this one's
 * after) */
template <int K, bool F16, int NTH>
__device__ __forceinline__ void l2norm_tile_rows(const L2Rows &l2, const Geom &G, uint16_t *s, int ld, int64_t r0,
                                                 int L, int hv) {
    if (!l2.on) return;
    const int h = hv / G.grp;
    const bool w = hv % G.grp == 0;
    l2norm_tile<K, F16, NTH>(s, ld, L, l2.eps, w && l2.y ? l2.y + (r0 * G.H + h) * K : nullptr, (int64_t)G.H * K,
                             w && l2.r ? l2.r + r0 * G.H + h : nullptr, G.H);
    bsync();
}

} // namespace drc

#endif
