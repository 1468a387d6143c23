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
constexpr int64_t PAD_MAX_GRID = 8192; /* 2M threads: a few rows each at the benchmarks' sizes */

/* dst [A, Bd, Cd] from src [A, Bs, Cs], counted in units U (16, 8, 4 or 2 bytes: the largest that
 * divides both rows and both pointers, pad_copy): dst[a, b, c] = src[a, b, c] where b < Bs and
 * c < Cs, else 0.  A row of dst takes TPR = 2^tpr_log2 consecutive threads (the power of two at or
 * above Cd, at most 32), each its columns c = sub, sub + TPR, ...; the rows go round the grid, and
 * a thread's (a, b) advance by the grid's stride without a division a row. */
template <typename U>
__global__ void __launch_bounds__(PAD_NT)
    pad_box(int64_t A, int Bs, int Cs, int Bd, int Cd, int tpr_log2, const U *__restrict__ src, U *__restrict__ dst) {
    const int tpr = 1 << tpr_log2, sub = threadIdx.x & (tpr - 1);
    const int64_t rows = A * Bd, step = ((int64_t)gridDim.x * PAD_NT) >> tpr_log2;
    int64_t r = ((int64_t)blockIdx.x * PAD_NT + threadIdx.x) >> tpr_log2;
    int64_t a = r / Bd;
    int b = (int)(r - a * Bd);
    const int64_t sa = step / Bd;
    const int sb = (int)(step - sa * Bd);
    for (; r < rows; r += step) {
        const U *s = src + (a * Bs + b) * Cs;
        U *d = dst + r * Cd;
        for (int c = sub; c < Cd; c += tpr) d[c] = b < Bs && c < Cs ? s[c] : U{};
        a += sa, b += sb;
        if (b >= Bd) b -= Bd, a++;
    }
}

template <typename U>
int pad_units(const char *who, int64_t A, int Bs, int Cs, int Bd, int Cd, const void *src, void *dst) {
    int lg = 0;
    while ((1 << lg) < Cd && lg < 5) lg++;
    const int64_t threads = (A * Bd) << lg, grid = (threads + PAD_NT - 1) / PAD_NT;
    return DRC_LAUNCH(who, pad_box<U>,
                      grid < 1              ? 1
                      : grid < PAD_MAX_GRID ? grid
                                            : PAD_MAX_GRID,
                      PAD_NT, 0, A, Bs, Cs, Bd, Cd, lg, (const U *)src, (U *)dst);
}

} // namespace

int pad_copy(const char *who, int64_t A, int Bs, int Cs, int Bd, int Cd, size_t elt, const void *src, void *dst) {
    /* the widest unit of 16, 8, 4 or 2 bytes that both rows' bytes and both pointers are multiples of */
    const uintptr_t bits = (uintptr_t)src | (uintptr_t)dst | (uintptr_t)(Cs * elt) | (uintptr_t)(Cd * elt);
    const size_t u = bits % 16 == 0 ? 16 : bits % 8 == 0 ? 8 : bits % 4 == 0 ? 4 : 2;
    const int cs = (int)(Cs * elt / u), cd = (int)(Cd * elt / u);
    if (u == 16) return pad_units<uint4>(who, A, Bs, cs, Bd, cd, src, dst);
    if (u == 8) return pad_units<uint2>(who, A, Bs, cs, Bd, cd, src, dst);
    if (u == 4) return pad_units<uint32_t>(who, A, Bs, cs, Bd, cd, src, dst);
    return pad_units<uint16_t>(who, A, Bs, cs, Bd, cd, src, dst);
}

} // namespace drc
