/* Zero padding of K and V, so that the tensor-core kernels (K in {64, 128, 256}, V a multiple of 64)
 * take a 16-bit call of any K <= 256 and any V (dr_chunk.cu decides, pad_dims, and calls this
 * around the kernels of the padded shape).
 *
 * Why it is exact.  Pad the key channels K -> Kp and the value columns V -> Vp with zeros: q, k
 * [rows, H, K] -> [rows, H, Kp], the per-channel gate g [rows, HV, K] -> [rows, HV, Kp] (zero: no
 * decay), v and dout [rows, HV, V] -> [rows, HV, Vp], h0 and dhT [N, HV, K, V] -> [N, HV, Kp, Vp].
 * In the recurrence
 *     S_t = e^{g_t} S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T,   o_t = S_t^T q_t
 * a padded row c of S (k_tc = 0, h0 row c = 0) stays zero, so S^T k, S^T q and every real entry of
 * S and o are those of the unpadded call; a padded column of S (v column 0, h0 column 0) stays zero
 * and gives a zero column of o.  The backward is the transposed map: dout's padded columns are zero,
 * so dS and dV' have zero padded columns and rows, and dq, dk, dv, dg, dbeta, dh0 on the real entries
 * are the unpadded call's (dbeta and dg sum over the columns, whose padded terms are zero; the L2
 * norm's dot products dy . xn see xn = 0 on the padded channels).  The padded entries of the
 * gradients are dropped (cropped).  The copies cost a pass over each array; the padded kernels do
 * the work of the padded shape (FLA's kernels pad K and V to a power of two in their tiles alike).
 *
 * The staged copies are also what makes a call whose rows are not 16-byte aligned take the
 * tensor-core kernels: the copies are aligned. */
#include "kernels/cuda/delta/dr_chunk_internal.cuh"

namespace drc {
namespace {

constexpr int PAD_NT = 256;

constexpr int PAD_ROWS = PAD_NT / 32; /* a warp a row of Cd elements */

inline int64_t pad_grid(int64_t rows) {
    const int64_t g = (rows + PAD_ROWS - 1) / PAD_ROWS;
    return g < 1 ? 1 : g < 8192 ? g : 8192;
}

/* dst [A, Bd, Cd] from src [A, Bs, Cs]: dst[a, b, c] = src[a, b, c] where b < Bs and c < Cs, else 0.
 * Warp w of the grid takes the rows (a, b) = w, w + the grid's warps, ... and its lanes the columns. */
template <typename E>
__global__ void __launch_bounds__(PAD_NT)
    pad_box(int64_t A, int Bs, int Cs, int Bd, int Cd, const E *__restrict__ src, E *__restrict__ dst) {
    const int lane = threadIdx.x & 31;
    const int64_t rows = A * Bd, step = (int64_t)gridDim.x * PAD_ROWS;
    for (int64_t r = blockIdx.x * (int64_t)PAD_ROWS + (threadIdx.x >> 5); r < rows; r += step) {
        const int64_t a = r / Bd;
        const int b = (int)(r - a * Bd);
        const E *s = b < Bs ? src + (a * Bs + b) * Cs : nullptr;
        E *d = dst + r * Cd;
        for (int c = lane; c < Cd; c += 32) d[c] = s && c < Cs ? s[c] : E(0);
    }
}

} // namespace

int pad_copy(const char *who, int64_t A, int Bs, int Cs, int Bd, int Cd, size_t elt, const void *src, void *dst) {
    const int64_t grid = pad_grid(A * Bd);
    if (elt == 2)
        return DRC_LAUNCH(who, pad_box<uint16_t>, grid, PAD_NT, 0, A, Bs, Cs, Bd, Cd, (const uint16_t *)src,
                          (uint16_t *)dst);
    return DRC_LAUNCH(who, pad_box<float>, grid, PAD_NT, 0, A, Bs, Cs, Bd, Cd, (const float *)src, (float *)dst);
}

} // namespace drc
