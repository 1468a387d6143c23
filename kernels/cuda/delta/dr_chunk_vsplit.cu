/* A value head of V = R Vs columns run as R heads of Vs columns (Vs in {64, 128}), so that the
 * tensor-core kernels (V in {64, 128}) take heads of any V that is a multiple of 64 (dr_chunk.cu
 * decides, vsplit_ways, and calls these around the kernels of the split shape).
 *
 * Why it is exact.  The columns of the state evolve independently:
 *     S_t = S_{t-1} (I - beta_t k_t k_t^T) + beta_t k_t v_t^T   (and o_t = S_t^T q_t, gated alike)
 * column j of S_t depends on column j of S_{t-1} and of v_t only; the output column j likewise.  So
 * a head with V columns is R heads of V / R columns that share its key head, its beta and its gate:
 * exactly the grouped-value (GVA) layout the kernels already take, HV R value heads over H key heads
 * (value head hv R + j belongs to key head (hv R + j) / (grp R) = hv / grp).  The backward is linear
 * in the R heads' output gradients: dq, dk are sums over the value heads of a key head, which the
 * kernels make already; dbeta, dg are summed over the R heads (below, or by the fused qkwy
 * itself); dv is per column.  What does not depend on V (A, its inverse, W; KDA's gated products;
 * the WY part of the backward) the head-gate and KDA families make once for the R heads
 * (Geom::vsh).  The generic and TF32 families take any V as it is.
 *
 * Memory: v, o, dv, dout [rows, HV, V] are [rows, HV R, Vs] as they lie, and q, k, dq, dk and the
 * norm's 1/|x| do not change; beta [rows, HV] and g [rows, HV, gs] neither: the kernels read the
 * one of a split head's R heads at shared_row (Geom::vsh = R).  What moves (each a pass over a small
 * array, or over the states):
 *   dbeta, dg [rows, HV R, .] (f32)        -> [rows, HV, .]: the R heads' gradients summed in f32,
 *                                             dbeta then rounded once to its 16-bit words (heads_sum,
 *                                             dr_chunk_heads.cu: groups of R heads), where the
 *                                             kernels do not sum them (the unfused qkwy)
 *   h0, dhT [N, HV, K, V] = [NH, K, R, Vs] -> [NH, R, K, Vs] = [N, HV R, K, Vs], and hT, dh0 back */
#include "kernels/cuda/delta/dr_chunk_internal.cuh"

namespace drc {
namespace {

constexpr int VS_NT = 256;

inline int64_t vs_grid(int64_t n) { return n / VS_NT + 1 < 4096 ? n / VS_NT + 1 : 4096; }

/* states: TO_SPLIT  dst [NH, R, K, Vs] from src [NH, K, R, Vs];  else the other way round */
template <bool TO_SPLIT>
__global__ void __launch_bounds__(VS_NT) vs_states(int64_t NH, int K, int R, int Vs, const float *src, float *dst) {
    const int64_t n = NH * K * R * Vs;
    for (int64_t e = blockIdx.x * (int64_t)VS_NT + threadIdx.x; e < n; e += (int64_t)gridDim.x * VS_NT) {
        const int c = (int)(e % Vs);
        int64_t t = e / Vs;
        /* e as [NH][A][B][Vs] with (A, B) = (R, K) when TO_SPLIT, else (K, R) */
        const int b = (int)(t % (TO_SPLIT ? K : R));
        t /= TO_SPLIT ? K : R;
        const int a = (int)(t % (TO_SPLIT ? R : K));
        const int64_t nh = t / (TO_SPLIT ? R : K);
        dst[e] = src[((nh * (TO_SPLIT ? K : R) + b) * (TO_SPLIT ? R : K) + a) * Vs + c];
    }
}

} // namespace

int vsplit_states(const char *who, bool to_split, int64_t NH, int K, int R, int Vs, const float *src, float *dst) {
    const int64_t grid = vs_grid(NH * K * R * Vs);
    if (to_split) return DRC_LAUNCH(who, vs_states<true>, grid, VS_NT, 0, NH, K, R, Vs, src, dst);
    return DRC_LAUNCH(who, vs_states<false>, grid, VS_NT, 0, NH, K, R, Vs, src, dst);
}

} // namespace drc
