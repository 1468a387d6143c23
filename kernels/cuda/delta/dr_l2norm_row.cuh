/* The L2 norm of one row held by one warp: r = 1/sqrt(sum x^2 + eps), each lane's E values
 * squared and added in order, then the lanes' sums added by xor shuffles over 16, 8, 4, 2, 1
 * (every lane ends with the same bits: each step adds the same two numbers in every lane).
 * The norm's own kernels (dr_pieces.cu; lane l holds the values E l .. E l + E - 1 of each 32 E of
 * the row) and the chunk kernels that normalise k and q as they load them (dr_chunk_l2norm.cuh,
 * the same lanes) take r from here, so that both give the same bits.
 * xor_shfl(x, off): the warp's xor shuffle (CUDA's, or the host emulation's: dr_chunk_emu.h). */
#ifndef DG_KERNELS_CUDA_DR_L2NORM_ROW_CUH
#define DG_KERNELS_CUDA_DR_L2NORM_ROW_CUH

template <int E, class XorShfl>
__device__ __forceinline__ float l2_rnorm(const float (&v)[E], float eps, XorShfl xor_shfl) {
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < E; i++) ss += v[i] * v[i];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ss += xor_shfl(ss, off);
    return rsqrtf(ss + eps);
}

#endif
