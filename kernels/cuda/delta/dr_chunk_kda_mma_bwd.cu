/* The tensor-core kda backward (per-channel gate; bf16 storage, fp16 in the build of
 * dr_chunk_kda_mma_bwd_f16.cu; chunk 64, K and V in {64, 128}).
 * Recompute by the forward's prep and state kernels (dr_chunk_kda_mma_fwd.cu, with Ai, Mkk,
 * P = scale lower_incl(M') and Qg = scale Q o e^G kept), then, per chunk of L rows, value head hv,
 * G the cumulative per-channel gate, Gl its last row, M / M' the gated K K^T / Q K^T
 * (dr_chunk_kda.cuh):
 *   dhu   (block per sequence, head; chunks in reverse; dS [K x V] in registers):
 *         dV' = P^T dO + Kd dS,  Kd = K o e^{Gl - G}
 *         dS <- diag(e^{Gl}) dS + Qg^T dO - W^T dV';  stores dS leaving each chunk and dV', split
 *   qkwy  (block per chunk, head), part A (the output and state terms):
 *         dq = scale e^G o (dO S0^T) + R(dM', K),  dk = e^{Gl - G} o (V' dS1^T) + C(dM', Q),
 *         dM' = scale lower_incl(dO V'^T),  dW = -dV' S0^T,
 *         dG = q o dq - k o dk,  dG_{L-1} += sum_i k_i o (e^{Gl - G_i} o (V' dS1^T)_i) + e^{Gl} o rowsum(S0 o dS1)
 *         where R(D, Y)_ic = sum_l D_il Y_lc e^{G_ic - G_lc} and C(D, X)_lc = sum_i D_il X_ic e^{G_ic - G_lc}
 *         are the gated products of a lower-triangular D (row side and column side);
 *         part B (the WY backward, dU = dV'):
 *         dAi = lower_incl((dW Kg^T + dU V^T) diag(beta)),  Kg = K o e^G
 *         dKbg = Ai^T dW: dk += beta e^G o dKbg, dG += beta k e^G o dKbg, dbeta += rowsum(Kg o dKbg)
 *         dVb = Ai^T dU: dv = beta o dVb, dbeta += rowsum(V o dVb)
 *         dA = strictly_lower(-(Ai^T dAi) Ai^T): dbeta += rowsum(dA o M), dMkk = diag(beta) dA
 *         dk += R(dMkk, K) + C(dMkk, K),  dG += k o R(dMkk, K) - k o C(dMkk, K)
 *         dg = reverse cumsum of dG over the chunk's rows.
 * The gated products R and C run on the tensor cores with the sub-chunk references of
 * dr_chunk_kda.cuh: for the rows of block I (reference row 16I) R = e^{G - G_16I} o (D_{I,<I}
 * (Y e^{G_16I - G})) plus the diagonal block in f32; for the columns of block J (reference row
 * 16J + 15) C = e^{G_{16J+15} - G} o (D_{>J,J}^T (X e^{G - G_{16J+15}})) plus the diagonal block.
 * dw_on_chip: parts A and B in one kernel, dW kept in shared memory; otherwise two kernels with
 * dW (split), dk and dG through global memory.  Heads of one beta and gate (Geom::vsh > 1, a head
 * split by V, dr_chunk_vsplit.cu): a block of the fused kernel runs part A of each of the G.vsh
 * heads into the same accumulators (dq, dk, dW, dM' and the last-row terms are linear in each
 * head's dO, S0, dS1, V', dV'; the gate factors follow the sums), then part B once, with the heads'
 * dU V^T summed into dAi and each head's dv; it writes dq, dk, dbeta and dg summed over the heads.
 * GVA: dq, dk per block's heads in f32, then summed over the blocks of each key head (heads_sum,
 * with the L2 norm's backward where the call has the norm); with one block's heads a key head qkwy
 * applies the norm's backward to dq and dk in its accumulators before their one rounding
 * (mm::l2norm_bwd_rows, as the head gate's qkwy).
 * The qkwy kernels run one block of 16 warps per multiprocessor (219 KiB of shared memory, 128
 * registers; ONE_SM_NTH).  At 8 warps (255 registers) the fused kernel is the slower of the two: its
 * 206 KB of straight-line code, each instruction run about once per block, does not stay in the
 * instruction cache, and its warps wait for instructions (ncu: 43k cycles a warp, against
 * 0.6k-0.7k for each unfused half of 112-114 KB).  With 16 warps each thread's accumulator tiles
 * are half as wide, and so is the code unrolled over them (135 KB), and the fused kernel takes
 * about 20 % less time than dqkwg + wy (ncu, H100 and H200, S1 = B8 T2048 H16 K=V=128: the dW,
 * dk, dG round trip and the second gate load and scan are gone; dU is in flight during part A,
 * QkL::PFU); fwd+bwd about 10 % less. */
#include <type_traits>

#include "kernels/cuda/delta/dr_chunk_kda.cuh"

namespace drc {
namespace DRC_KDA {
namespace {

using mm::tile_bytes;
using mm::WT;

/* f(row, col, x&) together over two accumulators of the same layout */
template <int NT, class F>
__device__ __forceinline__ void each2(float (&a)[1][NT][4], float (&b)[1][NT][4], int m0, int n0, F f) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int q = 0; q < 4; q++)
            f(m0 + g + ((q >> 1) << 3), n0 + nt * 8 + 2 * t + (q & 1), a[0][nt][q], b[0][nt][q]);
}

/* ---- gated products of a lower-triangular D (split tile 64 x 64, ld 72, zero above the
 * diagonal and, STRICT, on it) into this warp's accumulator tile of WT<64, K, NTH / 32> ----
 * R(D, Y)_ic = sum_{l <= i} D_il Y_lc e^{G_ic - G_lc}.  Scratch Yb (split, 96 rows): for I = 1..3
 * the rows 8I(I-1) + l, l < 16I, hold Y_l e^{G_16I - G_l}.  Barrier before (inputs) and after. */
template <int K, bool STRICT, int NTH>
__device__ __forceinline__ void gated_R(float (&r)[1][WT<64, K, NTH / 32>::NT][4], Sp D, const uint16_t *Y,
                                        const Gate &gt, unsigned char *scr) {
    constexpr int GS = gstride(K);
    using TK = WT<64, K, NTH / 32>;
    constexpr int LK = K + PAD, NT = TK::NT;
    const float *sG = gt.G;
    const int tid = threadIdx.x, warp = tid >> 5;
    const int m0 = TK::m0(warp), n0 = TK::n0(warp), I = m0 >> 4;
    if (gt.wide) { /* R = e^{G - R} o (D (Y e^{R - G})): rows l > i of D are zero, so l < m0 + 16 */
        const Sp Yb{(uint16_t *)scr, 64 * LK};
        gated_rows<K, NTH>(Yb, Y, gt, -1.0f);
        bsync();
        mm::acc_zero(r);
        mm::mma_ss_bf<1, NT, false, true>(r, D, 72, m0, Yb, LK, n0, m0 + 16);
        mm::frag_each(r, m0, n0, [&](int i, int c, float &x) { x *= kexp(sG[i * GS + c] - gt.R[c]); });
        bsync();
        return;
    }
    const Sp Yb{(uint16_t *)scr, 96 * LK};
    for (int e = tid; e < 96 * (K / 8); e += NTH) {
        const int R = e / (K / 8), c = (e % (K / 8)) * 8;
        const int I = R < 16 ? 1 : R < 48 ? 2 : 3, l = R - 8 * I * (I - 1);
        gated8(Yb, R * LK + c, Y + l * LK + c, sG + 16 * I * GS + c, sG + l * GS + c, 1.0f);
    }
    bsync();
    mm::acc_zero(r);
    if (I > 0) {
        const Sp B{Yb.hi + 8 * I * (I - 1) * LK, Yb.lo_off};
        mm::mma_ss<1, NT, false, true>(r, D, 72, m0, B, LK, n0, 16 * I);
    }
    mm::frag_each(r, m0, n0, [&](int i, int c, float &x) { x *= kexp(sG[i * GS + c] - sG[16 * I * GS + c]); });
    /* the diagonal block, in f32: l outer (not unrolled), so that the unrolled body over this
     * thread's accumulator elements is emitted once (a loop inside each element's body was
     * emitted once per element: half of the fused kernel's 520 KB of code, and ncu found the warps
     * waiting for instructions 46 % of the time) */
    const int i0 = m0 + ((tid & 31) >> 2), i1 = i0 + 8; /* this thread's two rows */
#pragma unroll 1
    for (int l = 16 * I; l < 16 * I + 16; l++) {
        const float d0 = op2f(D.hi[i0 * 72 + l]) + op2f(D.lo()[i0 * 72 + l]);
        const float d1 = op2f(D.hi[i1 * 72 + l]) + op2f(D.lo()[i1 * 72 + l]);
        mm::frag_each(r, m0, n0, [&](int i, int c, float &x) {
            const float t = (i == i0 ? d0 : d1) * op2f(Y[l * LK + c]) * kexp(sG[i * GS + c] - sG[l * GS + c]);
            if (STRICT ? l < i : l <= i) x += t; /* past the diagonal the exponent may overflow: not added */
        });
    }
    bsync();
}

/* C(D, X)_lc = sum_{i >= l} D_il X_ic e^{G_ic - G_lc}.  Scratch Xb (split, 96 rows): for J = 0..2
 * the rows o_J + (i - 16(J+1)), i in [16(J+1), 64), o_J = 0, 48, 80, hold X_i e^{G_i - G_{16J+15}}. */
template <int K, bool STRICT, int NTH>
__device__ __forceinline__ void gated_C(float (&r)[1][WT<64, K, NTH / 32>::NT][4], Sp D, const uint16_t *X,
                                        const Gate &gt, unsigned char *scr) {
    constexpr int GS = gstride(K);
    using TK = WT<64, K, NTH / 32>;
    constexpr int LK = K + PAD, NT = TK::NT;
    const float *sG = gt.G;
    const int tid = threadIdx.x, warp = tid >> 5;
    const int m0 = TK::m0(warp), n0 = TK::n0(warp), J = m0 >> 4;
    if (gt.wide) { /* C = e^{R - G} o (D^T (X e^{G - R})): rows i < l of D^T's sum are zero, so i >= m0 */
        const Sp Xb{(uint16_t *)scr, 64 * LK};
        gated_rows<K, NTH>(Xb, X, gt, 1.0f);
        bsync();
        mm::acc_zero(r);
        const Sp A{D.hi + m0 * 72, D.lo_off};
        const Sp B{Xb.hi + m0 * LK, Xb.lo_off};
        mm::mma_ss_bf<1, NT, true, true>(r, A, 72, m0, B, LK, n0, 64 - m0);
        mm::frag_each(r, m0, n0, [&](int l, int c, float &x) { x *= kexp(gt.R[c] - sG[l * GS + c]); });
        bsync();
        return;
    }
    const Sp Xb{(uint16_t *)scr, 96 * LK};
    for (int e = tid; e < 96 * (K / 8); e += NTH) {
        const int R = e / (K / 8), c = (e % (K / 8)) * 8;
        const int J = R < 48 ? 0 : R < 80 ? 1 : 2, i = 16 * (J + 1) + R - (J == 0 ? 0 : J == 1 ? 48 : 80);
        gated8(Xb, R * LK + c, X + i * LK + c, sG + i * GS + c, sG + (16 * J + 15) * GS + c, 1.0f);
    }
    bsync();
    mm::acc_zero(r);
    if (J < 3) {
        const int i0 = 16 * (J + 1);
        const Sp A{D.hi + i0 * 72, D.lo_off};
        const Sp B{Xb.hi + (J == 0 ? 0 : J == 1 ? 48 : 80) * LK, Xb.lo_off};
        mm::mma_ss<1, NT, true, true>(r, A, 72, m0, B, LK, n0, 64 - i0);
    }
    mm::frag_each(r, m0, n0, [&](int l, int c, float &x) { x *= kexp(sG[(16 * J + 15) * GS + c] - sG[l * GS + c]); });
    /* the diagonal block, in f32, i outer (as in gated_R) */
    const int l0 = m0 + ((tid & 31) >> 2), l1 = l0 + 8; /* this thread's two rows */
#pragma unroll 1
    for (int i = 16 * J; i < 16 * J + 16; i++) {
        const float d0 = op2f(D.hi[i * 72 + l0]) + op2f(D.lo()[i * 72 + l0]);
        const float d1 = op2f(D.hi[i * 72 + l1]) + op2f(D.lo()[i * 72 + l1]);
        mm::frag_each(r, m0, n0, [&](int l, int c, float &x) {
            const float t = (l == l0 ? d0 : d1) * op2f(X[i * LK + c]) * kexp(sG[i * GS + c] - sG[l * GS + c]);
            if (STRICT ? i > l : i >= l) x += t;
        });
    }
    bsync();
}

/* ---- dhu ---- */
/* block per (sequence, value head, tile of BV value columns v0 .. v0 + BV - 1; BV = dhu_bv, 64 or
 * 32): the columns of dS and dV' are independent, as in the state pass */
/* b_dhu either loads each chunk's tiles as it reaches them, two blocks per SM, or prefetches
 * (cp.async) the next chunk's Kd, Qg, W, dO, P and Gl into a second set while it works on this one
 * (Kd, Qg, W plain), one block per SM (two sets do not fit beside a second block at 64 columns).
 * The prefetch makes a step shorter; two blocks make twice the steps at once.  So it prefetches
 * where the longest chain, not the steps each SM runs, sets the pass's time: at 32 columns (all
 * blocks on the GPU at once, S2), and at 64 where the block-steps are no more than the longest
 * chain's on every SM (K1, R1); at S1, with twice that, two blocks are the faster (PERF_KERNELS.md,
 * "The KDA kernels", has the times). */
constexpr bool DHU_PF_OK = KPlain::Kd && KPlain::Qg && KPlain::W;
inline bool dhu_prefetch64(const Geom &G) { return DHU_PF_OK && mm::state_steps(G, 64) <= G.maxc * mm::sm_count(); }

template <int K, int BV, bool PF = false> struct DhuL {
    /* X: Kd, then Qg, then W, one tile when all three are plain */
    static constexpr int X = (KPlain::Kd && KPlain::Qg && KPlain::W ? 1 : 2) * tile_bytes(64, K),
                         O = tile_bytes(64, BV), P = 2 * tile_bytes(64, 64), S = 2 * tile_bytes(K, BV),
                         N = 2 * tile_bytes(64, BV);
    /* PF: per set Gl, Kd, Qg, W, dO, P */
    static constexpr int SET = K * 4 + 3 * tile_bytes(64, K) + O + P;
    static constexpr int bytes = PF ? 2 * SET + S + N : K * 4 + X + O + P + S + N;
};

template <int K, int V, int BV, bool PF>
__global__ void __launch_bounds__(FNT, 2) b_dhu(Geom G, const uint16_t *dout, const float *dhT, float *dh0, Bufs b,
                                                uint16_t *dSh, uint16_t *dSl, uint16_t *dVh, uint16_t *dVl) {
    static_assert(DHU_PF_OK || !PF, "the prefetch's sets hold Kd, Qg, W plain");
    using Lay = DhuL<K, BV, PF>;
    constexpr int NVT = V / BV, LK = K + PAD, LB = BV + PAD;
    DRC_SMEM(float, sm);
    const int HV = G.HV, tid = threadIdx.x, warp = tid >> 5;
    const int64_t HW = shared_heads(G); /* heads a row of Kd, Qg, W, P, Gl */
    const int64_t n = chain_seq(G, blockIdx.x / (HV * NVT));
    const int hv = (int)(blockIdx.x / NVT % HV), v0 = (int)(blockIdx.x % NVT) * BV;
    /* PF: two sets [Gl | Kd | Qg | W | dO | P split], then dS, -dV' split; else Gl, one tile for Kd
     * then Qg then W, dO, P, dS, -dV' */
    unsigned char *B8 = (unsigned char *)sm;
    unsigned char *after = B8 + (PF ? 2 * Lay::SET : K * 4 + Lay::X + Lay::O + Lay::P);
    const Sp sdS{(uint16_t *)after, K * LB};
    const Sp sN{(uint16_t *)(after + Lay::S), 64 * LB};
    /* set st's pieces (PF), or the single layout */
    auto gl_of = [&](int st) { return (float *)(B8 + st * Lay::SET); };
    auto x_of = [&](int st,
                    int which) { /* which: 0 Kd, 1 Qg, 2 W */
                                 return PF ? (uint16_t *)(B8 + st * Lay::SET + K * 4 + which * tile_bytes(64, K))
                                           : (uint16_t *)(B8 + K * 4);
    };
    auto o_of = [&](int st) {
        return (uint16_t *)(B8 + (PF ? st * Lay::SET + K * 4 + 3 * tile_bytes(64, K) : K * 4 + Lay::X));
    };
    auto p_of = [&](int st) {
        return Sp{
            (uint16_t *)(B8 + (PF ? st * Lay::SET + K * 4 + 3 * tile_bytes(64, K) + Lay::O : K * 4 + Lay::X + Lay::O)),
            64 * 72};
    };
    using TS = WT<K, BV>;
    using TV = WT<64, BV>;
    const int sm0 = TS::m0(warp), sn0 = TS::n0(warp), vm0 = TV::m0(warp), vn0 = TV::n0(warp);
    float dS[1][TS::NT][4];
    const int64_t hb = (n * HV + hv) * (int64_t)K * V + v0;
    mm::frag_each(dS, sm0, sn0, [&](int r, int j, float &x) { x = dhT ? dhT[hb + (int64_t)r * V + j] : 0.0f; });
    int64_t c0, c1;
    seq_chunks(G, n, c0, c1);
    auto issue = [&](int64_t cc,
                     int st) { /* PF: chunk cc's set */
                               const Chunk x = seq_chunk(G, n, c0, cc);
                               const int64_t xo = x.r0 * HV + hv, xs = shared_row(G, x.r0, hv);
                               mm::load_raw_async<64, K>(x_of(st, 0), b.Kdh + xs * K, HW * K, x.L);
                               mm::load_raw_async<64, K>(x_of(st, 1), b.Qgh + xs * K, HW * K, x.L);
                               mm::load_raw_async<64, K>(x_of(st, 2), b.Wh + xs * K, HW * K, x.L);
                               mm::load_raw_async<64, BV>(o_of(st), dout + xo * V + v0, (int64_t)HV * V, x.L);
                               const Sp p = p_of(st);
                               mm::load_raw_async<64, 64>(p.hi, b.Ph + xs * 64, HW * 64, x.L);
                               mm::load_raw_async<64, 64>(p.lo(), b.Pl + xs * 64, HW * 64, x.L);
                               if (tid < K / 4)
                                   cp_async16(gl_of(st) + 4 * tid, b.Gl + shared_row(G, cc, hv) * K + 4 * tid, true);
                               cp_async_commit();
    };
    if (PF && c0 < c1) issue(c1 - 1, 0);
    for (int64_t c = c1 - 1; c >= c0; c--) {
        const Chunk ch = seq_chunk(G, n, c0, c);
        const int L = ch.L;
        const int64_t ot = ch.r0 * HV + hv, os = shared_row(G, ch.r0, hv);
        const int st = PF ? (int)((c1 - 1 - c) & 1) : 0;
        const float *sGl = gl_of(st);
        uint16_t *sO = o_of(st);
        const Sp sP = p_of(st);
        const Sp sX{x_of(st, 0), 64 * LK}; /* Kd (without the prefetch: then Qg, then W) */
        if (PF) cp_async_wait_all();       /* this chunk's set; the barrier below shows it to the block */
        else {
            if (KPlain::Kd) mm::load_raw<64, K>(sX.hi, b.Kdh + os * K, HW * K, L);
            else mm::load_split<64, K>(sX, b.Kdh + os * K, b.Kdl + os * K, HW * K, L);
            mm::load_raw<64, BV>(sO, dout + ot * V + v0, (int64_t)HV * V, L);
            mm::load_split<64, 64>(sP, b.Ph + os * 64, b.Pl + os * 64, HW * 64, L);
            if (tid < K) gl_of(0)[tid] = b.Gl[shared_row(G, c, hv) * K + tid];
        }
        const int64_t sb = (c * HV + hv) * (int64_t)K * V + v0;
        mm::frag_pairs(dS, sm0, sn0, [&](int r, int j, float x0, float x1) {
            mm::put_split2(sdS, LB, r, j, x0, x1);
            mm::put_pair_global<true>(dSh, dSl, sb + (int64_t)r * V + j, x0, x1);
        });
        bsync();
        if (PF && c > c0) issue(c - 1, st ^ 1); /* the other set was last read before the previous step's end */
        {                                       /* dV' = P^T dO + Kd dS */
            float acc[1][TV::NT][4];
            mm::acc_zero(acc);
            mm::mma_sr<1, TV::NT, true, true>(acc, sP, 72, vm0, sO, LB, vn0, 64);
            mm::mma_p<1, TV::NT, false, true, !KPlain::Kd, true>(acc, sX, LK, vm0, sdS, LB, vn0, K);
            mm::frag_pairs(acc, vm0, vn0, [&](int i, int j, float x0, float x1) {
                if (i < L) mm::put_pair_global<true>(dVh, dVl, (ot + (int64_t)i * HV) * V + v0 + j, x0, x1);
                mm::put_split2(sN, LB, i, j, -x0, -x1);
            });
        }
        bsync();
        const Sp sQg{PF ? x_of(st, 1) : sX.hi, sX.lo_off}, sW{PF ? x_of(st, 2) : sX.hi, sX.lo_off};
        if (!PF && KPlain::Qg) mm::load_raw<64, K>(sQg.hi, b.Qgh + os * K, HW * K, L);
        else if (!PF) mm::load_split<64, K>(sQg, b.Qgh + os * K, b.Qgl + os * K, HW * K, L);
        mm::frag_each(dS, sm0, sn0, [&](int r, int, float &x) { x *= kexp(sGl[r]); });
        bsync();
        mm::mma_p<1, TS::NT, true, true, !KPlain::Qg, false>(dS, sQg, LK, sm0, Sp{sO, 0}, LB, sn0, 64); /* + Qg^T dO */
        if (!PF) {
            bsync();
            if (KPlain::W) mm::load_raw<64, K>(sW.hi, b.Wh + os * K, HW * K, L);
            else mm::load_split<64, K>(sW, b.Wh + os * K, b.Wl + os * K, HW * K, L);
        }
        bsync();
        mm::mma_p<1, TS::NT, true, true, !KPlain::W, true>(dS, sW, LK, sm0, sN, LB, sn0, 64); /* - W^T dV' */
        bsync();
    }
    if (dh0) mm::frag_each(dS, sm0, sn0, [&](int r, int j, float &x) { dh0[hb + (int64_t)r * V + j] = x; });
}

/* ---- qkwy ---- */
template <int K, int V, int NW> struct QkL {
    static constexpr int tK = tile_bytes(64, K), tV = tile_bytes(64, V), t64 = tile_bytes(64, 64);
    /* persistent: G [64][K], beta, dbeta, red [NW][64], last-row terms [K], column partials [NW][K],
     * references [K], the rows' 1/|q| and 1/|k| [2][64] */
    static constexpr int F32 = (64 * gstride(K) + 64 + 64 + NW * 64 + K + NW * K + K + 128) * 4;
    static constexpr int oK = F32, oQ = oK + tK, oDM = oQ + tK, oZ = oDM + 2 * t64;
    /* Z, part A: S0 / dS1 split, dO raw, dV' then V' split */
    static constexpr int zS = 0, zO = 2 * tile_bytes(K, V), zX = zO + tV, ZA = zX + 2 * tV;
    /* Z, part B: dW split (later T), Kg split (later dAi), dU split, V raw */
    static constexpr int wDW = 0, wKG = 2 * tK, wDU = 4 * tK, wV = wDU + 2 * tV, ZB = wV + tV;
    /* fused, where the places allow (K = V = 128): dU by cp.async into the place of V' (dead once
     * dM' is made, and clear of the scratch of part A's gated products at wKG), in flight during
     * those products; V then at 4 tK (dO's place) */
    static constexpr bool PFU = zX >= wKG + 2 * tile_bytes(96, K) && zX >= 4 * tK + tV;
    static constexpr int wDUf = PFU ? zX : wDU, wVf = PFU ? 4 * tK : wV;
    static constexpr int ZT = 2 * tK + 2 * tile_bytes(96, K); /* dW + gated scratch */
    static constexpr int Z = ZA > ZB ? (ZA > ZT ? ZA : ZT) : (ZB > ZT ? ZB : ZT);
    static constexpr int bytes = oZ + (Z > 64 * K * 4 ? Z : 64 * K * 4);
};

struct QkArgs {
    const uint16_t *q, *k, *v, *beta, *dout;
    const float *g;
    Bufs b;
    const uint16_t *dSh, *dSl, *dVh, *dVl;
    float *dqv, *dkv;    /* [rows, HB, K] per block's heads (GVA; HB = HV / G.vsh fused), or NULL */
    uint16_t *dq, *dk;   /* HB == H: the outputs (else NULL) */
    uint16_t *dWh, *dWl; /* unfused: [rows, HV, K] */
    float *dGg, *dkp;    /* unfused: dG and the partial dk [rows, HV, K] */
    uint16_t *dv, *dbeta;
    float *dbetaf; /* f32 dbeta instead of dbeta (Io::dbeta32), or NULL */
    float *dg;
    const float *rq, *rk; /* with dq, dk: the L2 norm's 1/|x| [rows, H] (q, k normalised), else NULL */
};

/* MODE 0: fused (parts A and B); 1: part A only (dW, dk, dG to global); 2: part B only.  SH (fused
 * only): the block takes the G.vsh value heads of one beta and gate; else one head (its own
 * instance, as the head-gate qkwy) */
template <int K, int V, int MODE, bool SH, int NTH> __global__ void __launch_bounds__(NTH) b_qkwy(Geom G, QkArgs a) {
    static_assert(MODE == 0 || !SH, "heads shared in the fused kernel only");
    constexpr int NW = NTH / 32;
    using Lay = QkL<K, V, NW>;
    constexpr bool PFU = MODE == 0 && Lay::PFU; /* dU in flight from part A to part B (QkL) */
    constexpr int LK = K + PAD, LV = V + PAD;
    constexpr int GS = gstride(K);
    DRC_SMEM(float, sm);
    const int HV = G.HV, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    /* the block's RR value heads hv0 .. hv0 + RR - 1 share k, q, beta and the gate (Geom::vsh) */
    const int RR = SH ? G.vsh : 1, HB = HV / RR;
    const int64_t c = blockIdx.x / HB;
    const int hb = (int)(blockIdx.x % HB), hv0 = hb * RR, h = hv0 / G.grp;
    const Chunk ch = chunk_at(G, c);
    const int L = ch.L;
    const int64_t r0 = ch.r0;
    const int64_t ot0 = r0 * HV + hv0;         /* row r0 of [rows, HV, .] at the first head */
    const int64_t os = shared_row(G, r0, hv0); /* and of what the heads share: Ai, Mkk */
    const int HW = shared_heads(G);
    const int64_t ob = r0 * HB + hb; /* row r0 of [rows, HB, .]: dq, dk, dbeta, dg (the heads' sums) */
    const float scale = G.scale;
    float *sG = sm, *sb = sG + 64 * GS, *sdB = sb + 64, *red = sdB + 64, *sLast = red + NW * 64, *colp = sLast + K;
    float *sR = colp + NW * K, *sr = sR + K;
    unsigned char *B8 = (unsigned char *)sm;
    uint16_t *sK = (uint16_t *)(B8 + Lay::oK), *sQ = (uint16_t *)(B8 + Lay::oQ);
    const Sp sDM{(uint16_t *)(B8 + Lay::oDM), 64 * 72}; /* dM', later Ai, later dMkk */
    unsigned char *Z = B8 + Lay::oZ;
    using TK = WT<64, K, NW>;
    using TV = WT<64, V, NW>;
    using TP = WT<64, 64, NW>;
    const int km0 = TK::m0(warp), kn0 = TK::n0(warp), vm0 = TV::m0(warp), vn0 = TV::n0(warp);
    const int pm0 = TP::m0(warp), pn0 = TP::n0(warp);
    const int64_t ldk = (int64_t)HV * K;

    /* the gate, scanned after the first barrier */
    gate_load<K, NTH>(a.g + os * K, (int64_t)HW * K, L, sG);
    Gate gt{sG, sR, false};
    if (tid < 64) sb[tid] = tid < L ? op2f(a.beta[shared_row(G, r0 + tid, hv0)]) : 0.0f, sdB[tid] = 0.0f;
    mm::l2norm_stage_r(sr, a.rq, a.rk, ob, HB, L); /* for the norm's backward */
    for (int e = tid; e < NW * 64; e += NTH) red[e] = 0.0f;
    for (int e = tid; e < NW * K + K; e += NTH) sLast[e] = 0.0f; /* sLast and colp */
    if (MODE == 2) mm::load_raw<64, K, NTH>(sK, a.k + (r0 * G.H + h) * K, (int64_t)G.H * K, L);
    float dk[1][TK::NT][4], dG[1][TK::NT][4];
    if (MODE != 2) {
        const Sp sS{(uint16_t *)(Z + Lay::zS), K * LV};
        uint16_t *sO = (uint16_t *)(Z + Lay::zO);
        const Sp sXv{(uint16_t *)(Z + Lay::zX), 64 * LV};
        /* the products of each head, summed over the RR heads (each is linear in the head's dO, S0,
         * dS1, V', dV'; the gate factors, the same for all, follow the sums) */
        float dq[1][TK::NT][4], dw[1][TK::NT][4], dp[1][TP::NT][4];
        mm::acc_zero(dq), mm::acc_zero(dw), mm::acc_zero(dk), mm::acc_zero(dp);
#pragma unroll 1
        for (int hr = 0; hr < RR; hr++) {
            const int64_t ot = ot0 + hr, sbase = (c * HV + hv0 + hr) * (int64_t)K * V;
            if (hr) bsync(); /* every warp is past its reads of the last head's tiles */
            mm::load_split<K, V, NTH>(sS, a.b.Sh + sbase, a.b.Sl + sbase, V, K);
            mm::load_raw<64, V, NTH>(sO, a.dout + ot * V, (int64_t)HV * V, L);
            mm::load_split<64, V, NTH>(sXv, a.dVh + ot * V, a.dVl + ot * V, (int64_t)HV * V, L);
            if (!hr) { /* k, q by cp.async, in flight during the first products (waited for with V' below) */
                mm::load_raw_async<64, K, NTH>(sK, a.k + (r0 * G.H + h) * K, (int64_t)G.H * K, L);
                mm::load_raw_async<64, K, NTH>(sQ, a.q + (r0 * G.H + h) * K, (int64_t)G.H * K, L);
                cp_async_commit();
            }
            bsync();
            const int narrow = hr ? 0 : gate_scan<K>(sG, sR);
            mm::mma_rs<1, TK::NT, false, false>(dq, sO, LV, km0, sS, LV, kn0, V);  /* dO S0^T */
            mm::mma_ss<1, TK::NT, false, false>(dw, sXv, LV, km0, sS, LV, kn0, V); /* dV' S0^T */
            if (!hr) gt.wide = !bsync_or(narrow);
            else bsync();
            { /* S0 -> dS1 in place, sLast[r] += e^{Gl_r} sum_j S0_rj dS1_rj; V' into sXv (by cp.async,
               * in flight during the pass; plain: the hi words only, the lo words of dV' left there
               * are not read again) */
                mm::load_sp_async<64, V, !KPlain::Vn, NTH>(sXv, a.b.Vnh + ot * V, a.b.Vnl + ot * V, (int64_t)HV * V, L);
                cp_async_commit();
                constexpr int V8 = V / 8;
                for (int e = tid; e < K * V8; e += NTH) {
                    const int r = e / V8, c8 = (e % V8) * 8;
                    uint16_t *ph = sS.hi + r * LV + c8, *pl = sS.lo() + r * LV + c8;
                    const uint4 xh = *(const uint4 *)(a.dSh + sbase + (int64_t)r * V + c8);
                    const uint4 xl = *(const uint4 *)(a.dSl + sbase + (int64_t)r * V + c8);
                    const uint16_t *uh = (const uint16_t *)&xh, *ul = (const uint16_t *)&xl;
                    float t = 0.0f;
#pragma unroll
                    for (int u = 0; u < 8; u++) t += (op2f(ph[u]) + op2f(pl[u])) * (op2f(uh[u]) + op2f(ul[u]));
#pragma unroll
                    for (int off = 1; off < V8; off <<= 1) t += shfl_xor(t, off); /* the row's V8 lanes */
                    if ((lane & (V8 - 1)) == 0) sLast[r] += kexp(sG[63 * GS + r]) * t;
                    *(uint4 *)ph = xh;
                    *(uint4 *)pl = xl;
                }
                cp_async_wait_all(); /* (k, q,) V' */
            }
            bsync();
            mm::mma_p<1, TK::NT, false, false, !KPlain::Vn, true>(dk, sXv, LV, km0, sS, LV, kn0, V); /* V' dS1^T */
            mm::mma_p<1, TP::NT, false, false, false, !KPlain::Vn>(dp, Sp{sO, 0}, LV, pm0, sXv, LV, pn0,
                                                                   V); /* dO V'^T */
        }
        /* dM' = scale lower_incl(the heads' dO V'^T) */
        mm::store_split<TP::NT>(sDM, 72, pm0, pn0,
                                [&](int i, int l, int nt, int qq) { return l <= i ? scale * dp[0][nt][qq] : 0.0f; });
        /* dq = scale e^G o dQg;  dk = e^{Gl - G} o dKd, its k-weighted column sums for the last row */
        {
            float cs[TK::NT][2];
#pragma unroll
            for (int nt = 0; nt < TK::NT; nt++) cs[nt][0] = cs[nt][1] = 0.0f;
            each2(dq, dk, km0, kn0, [&](int i, int cc, float &x, float &y) {
                x *= scale * kexp(sG[i * GS + cc]);
                y *= kexp(sG[63 * GS + cc] - sG[i * GS + cc]);
            });
            const int gq = lane >> 2, tq = lane & 3;
#pragma unroll
            for (int nt = 0; nt < TK::NT; nt++)
#pragma unroll
                for (int qq = 0; qq < 4; qq++) {
                    const int i = km0 + gq + ((qq >> 1) << 3), cc = kn0 + nt * 8 + 2 * tq + (qq & 1);
                    cs[nt][qq & 1] += op2f(sK[i * LK + cc]) * dk[0][nt][qq];
                }
#pragma unroll
            for (int nt = 0; nt < TK::NT; nt++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    float x = cs[nt][j];
                    x += shfl_xor(x, 4), x += shfl_xor(x, 8), x += shfl_xor(x, 16);
                    if (gq == 0) colp[warp * K + kn0 + nt * 8 + 2 * tq + j] = x;
                }
        }
        bsync();
        if (PFU) { /* dU = dV' for part B */
            const Sp sdU{(uint16_t *)(Z + Lay::wDUf), 64 * LV};
            const int64_t ol = ot0 + RR - 1; /* (the last head's: part B takes the heads from the last) */
            mm::load_sp_async<64, V, true, NTH>(sdU, a.dVh + ol * V, a.dVl + ol * V, (int64_t)HV * V, L);
            cp_async_commit();
        }
        /* dW (split) into its part-B place, over the dead S0 / dS1 */
        if (MODE == 0) {
            const Sp sdW{(uint16_t *)(Z + Lay::wDW), 64 * LK};
            mm::frag_pairs(dw, km0, kn0,
                           [&](int i, int cc, float x0, float x1) { mm::put_split2(sdW, LK, i, cc, -x0, -x1); });
        } else {
            mm::frag_pairs(dw, km0, kn0, [&](int i, int cc, float x0, float x1) {
                if (i < L) mm::put_pair_global<true>(a.dWh, a.dWl, (ot0 + (int64_t)i * HV) * K + cc, -x0, -x1);
            });
        }
        if (tid < K) {
            float s = 0.0f;
#pragma unroll
            for (int w = 0; w < NW; w++) s += colp[w * K + tid];
            sLast[tid] += s;
        }
        /* the gated products of dM': dq += R(dM', K), then dq is final (stored; dG = q o dq);
         * dk += C(dM', Q), dG -= k o dk (+ the last-row terms) */
        {
            float t[1][TK::NT][4];
            gated_R<K, false, NTH>(t, sDM, sK, gt, Z + Lay::wKG);
            each2(dq, t, km0, kn0, [&](int, int, float &x, float &y) { x += y; });
            each2(dG, dq, km0, kn0, [&](int i, int cc, float &x, float &y) { x = op2f(sQ[i * LK + cc]) * y; });
            /* the norm's backward (scratch: colp, dead after the last-row sums) */
            if (a.rq && a.dq) mm::l2norm_bwd_rows<NW>(dq, km0, kn0, sQ, LK, colp, sr);
            mm::frag_pairs(dq, km0, kn0, [&](int i, int cc, float x0, float x1) {
                if (i >= L) return;
                const int64_t off = (ob + (int64_t)i * HB) * K + cc;
                if (a.dq) *(uint32_t *)(a.dq + off) = mm::pack_op2(x0, x1);
                else if (a.dqv) *(float2 *)(a.dqv + off) = make_float2(x0, x1);
            });
            gated_C<K, false, NTH>(t, sDM, sQ, gt, Z + Lay::wKG);
            each2(dk, t, km0, kn0, [&](int, int, float &x, float &y) { x += y; });
        }
        each2(dG, dk, km0, kn0, [&](int i, int cc, float &x, float &y) {
            x -= op2f(sK[i * LK + cc]) * y;
            if (i == L - 1) x += sLast[cc];
        });
        if (MODE == 1) {
            each2(dk, dG, km0, kn0, [&](int i, int cc, float &x, float &y) {
                if (i < L) {
                    a.dkp[(ot0 + (int64_t)i * HV) * K + cc] = x;
                    a.dGg[(ot0 + (int64_t)i * HV) * K + cc] = y;
                }
            });
            return;
        }
    } else {
        const Sp sdW{(uint16_t *)(Z + Lay::wDW), 64 * LK};
        mm::load_split<64, K, NTH>(sdW, a.dWh + ot0 * K, a.dWl + ot0 * K, ldk, L);
        each2(dk, dG, km0, kn0, [&](int i, int cc, float &x, float &y) {
            x = i < L ? a.dkp[(ot0 + (int64_t)i * HV) * K + cc] : 0.0f;
            y = i < L ? a.dGg[(ot0 + (int64_t)i * HV) * K + cc] : 0.0f;
        });
        bsync(); /* g, beta, k in shared memory */
        const int narrow = gate_scan<K>(sG, sR);
        gt.wide = !bsync_or(narrow);
    }

    /* ---- part B: the WY backward ---- */
    const Sp sdW{(uint16_t *)(Z + Lay::wDW), 64 * LK}, sKg{(uint16_t *)(Z + Lay::wKG), 64 * LK};
    const Sp sdU{(uint16_t *)(Z + (PFU ? Lay::wDUf : Lay::wDU)), 64 * LV};
    uint16_t *sV = (uint16_t *)(Z + (PFU ? Lay::wVf : Lay::wV));
    const Sp sAi = sDM;
    const Sp sdAi{(uint16_t *)(Z + Lay::wKG), 64 * 72}, sT{(uint16_t *)(Z + Lay::wDW), 64 * 72};
    for (int e = tid; e < 64 * (K / 8); e += NTH) { /* Kg = K o e^G */
        const int i = e / (K / 8), cc = (e % (K / 8)) * 8;
        gated8<!DRC_OPERAND_F16, false>(sKg, i * LK + cc, sK + i * LK + cc, sG + i * GS + cc, nullptr, 1.0f);
    }
    { /* Ai in two halves of NA values a thread, each loaded into registers before one of the tile
       * loads (dU unless it is in flight already, V) and split after it: the latencies overlap
       * (loaded and split element by element, each store to shared memory kept the next load
       * waiting behind it) */
        constexpr int NA = 64 * 64 / NTH / 2, RS = NTH / 64; /* values a half; rows apart */
        float x[NA];
        const int j = tid & 63, i0 = tid >> 6;
        const float *Ai = a.b.Ai + os * 64 + j;
        const int64_t ol = ot0 + RR - 1; /* the last head's dU, V (part B takes the heads from the last) */
#pragma unroll
        for (int half = 0; half < 2; half++) {
#pragma unroll
            for (int u = 0; u < NA; u++) {
                const int i = i0 + RS * (u + NA * half);
                x[u] = i < L ? Ai[(int64_t)i * HW * 64] : 0.0f;
            }
            if (half == 0 && !PFU) mm::load_split<64, V, NTH>(sdU, a.dVh + ol * V, a.dVl + ol * V, (int64_t)HV * V, L);
            if (half == 1) mm::load_raw<64, V, NTH>(sV, a.v + ol * V, (int64_t)HV * V, L);
#pragma unroll
            for (int u = 0; u < NA; u++) {
                const int i = i0 + RS * (u + NA * half);
                mm::split2(x[u], sAi.hi[i * 72 + j], sAi.lo()[i * 72 + j]);
            }
        }
    }
    if (PFU) cp_async_wait_all(); /* dU */
    bsync();
    /* dVb = Ai^T dU of the head whose dU, v are in sdU, sV (row ot): dv = beta o dVb, dbeta +=
     * rowsum(V o dVb) */
    const auto dvb = [&](int64_t ot) {
        float t[1][TV::NT][4];
        mm::acc_zero(t);
        mm::mma_ss<1, TV::NT, true, true>(t, sAi, 72, vm0, sdU, LV, vn0, 64);
        float rb[2] = {0.0f, 0.0f};
        mm::frag_pairs(t, vm0, vn0, [&](int j, int vv, float x0, float x1) {
            rb[(j - vm0) >> 3] += op2f(sV[j * LV + vv]) * x0 + op2f(sV[j * LV + vv + 1]) * x1;
            if (j < L && a.dv)
                *(uint32_t *)(a.dv + (ot + (int64_t)j * HV) * V + vv) = mm::pack_op2(sb[j] * x0, sb[j] * x1);
        });
        mm::red_rows_put(red, vm0, rb);
    };
    float dai[1][TP::NT][4];
    mm::acc_zero(dai); /* dAi (before the mask and beta): dW Kg^T + the sum of the heads' dU V^T */
    mm::mma_ss<1, TP::NT, false, false>(dai, sdW, LK, pm0, sKg, LK, pn0, K);
    mm::mma_sr<1, TP::NT, false, false>(dai, sdU, LV, pm0, sV, LV, pn0, V);
#pragma unroll 1
    for (int hr = RR - 2; hr >= 0; hr--) { /* each other head's dU, v in turn, once the one after has made its dVb */
        dvb(ot0 + hr + 1);
        bsync();
        mm::load_split<64, V, NTH>(sdU, a.dVh + (ot0 + hr) * V, a.dVl + (ot0 + hr) * V, (int64_t)HV * V, L);
        mm::load_raw<64, V, NTH>(sV, a.v + (ot0 + hr) * V, (int64_t)HV * V, L);
        bsync();
        mm::mma_sr<1, TP::NT, false, false>(dai, sdU, LV, pm0, sV, LV, pn0, V);
    }
    { /* dKbg = Ai^T dW */
        float t[1][TK::NT][4];
        mm::acc_zero(t);
        mm::mma_ss<1, TK::NT, true, true>(t, sAi, 72, km0, sdW, LK, kn0, 64);
        float rb[2] = {0.0f, 0.0f};
        const int gq = lane >> 2, tq = lane & 3;
#pragma unroll
        for (int nt = 0; nt < TK::NT; nt++)
#pragma unroll
            for (int qq = 0; qq < 4; qq++) {
                const int j = km0 + gq + ((qq >> 1) << 3), cc = kn0 + nt * 8 + 2 * tq + (qq & 1);
                const float kg = op2f(sK[j * LK + cc]) * kexp(sG[j * GS + cc]), x = t[0][nt][qq];
                rb[qq >> 1] += kg * x;
                dk[0][nt][qq] += kexp(sG[j * GS + cc]) * sb[j] * x;
                dG[0][nt][qq] += kg * sb[j] * x;
            }
        mm::red_rows_put(red, km0, rb);
    }
    dvb(ot0); /* (the first head's, the last in sdU, sV) */
    bsync();
    mm::store_split<TP::NT>(sdAi, 72, pm0, pn0,
                            [&](int i, int j, int nt, int qq) { return j <= i ? dai[0][nt][qq] * sb[j] : 0.0f; });
    bsync();
    { /* T = Ai^T dAi */
        float t[1][TP::NT][4];
        mm::acc_zero(t);
        mm::mma_ss<1, TP::NT, true, true>(t, sAi, 72, pm0, sdAi, 72, pn0, 64);
        mm::store_split<TP::NT>(sT, 72, pm0, pn0, [&](int, int, int nt, int qq) { return t[0][nt][qq]; });
    }
    bsync();
    { /* dA = -T Ai^T (strictly lower): dbeta += rowsum(dA o M); dMkk = diag(beta) dA, over Ai */
        float t[1][TP::NT][4];
        mm::acc_zero(t);
        mm::mma_ss<1, TP::NT, false, false>(t, sT, 72, pm0, sAi, 72, pn0, 64);
        float rb[2] = {0.0f, 0.0f};
        mm::frag_each(t, pm0, pn0, [&](int i, int j, float &x) {
            x = j < i && i < L ? -x : 0.0f;
            if (j < i && i < L) rb[(i - pm0) >> 3] += x * a.b.Mkk[(os + (int64_t)i * HW) * 64 + j];
            x *= sb[i];
        });
        mm::red_rows_put(red, pm0, rb);
        bsync();
        mm::store_split<TP::NT>(sDM, 72, pm0, pn0, [&](int, int, int nt, int qq) { return t[0][nt][qq]; });
    }
    bsync();
    { /* dk += R(dMkk, K) + C(dMkk, K);  dG += k o R - k o C */
        float t[1][TK::NT][4];
        gated_R<K, true, NTH>(t, sDM, sK, gt, Z);
        each2(dk, t, km0, kn0, [&](int, int, float &x, float &y) { x += y; });
        each2(dG, t, km0, kn0, [&](int i, int cc, float &x, float &y) { x += op2f(sK[i * LK + cc]) * y; });
        gated_C<K, true, NTH>(t, sDM, sK, gt, Z);
        each2(dk, t, km0, kn0, [&](int, int, float &x, float &y) { x += y; });
        each2(dG, t, km0, kn0, [&](int i, int cc, float &x, float &y) { x -= op2f(sK[i * LK + cc]) * y; });
    }
    if (a.rk && a.dk) mm::l2norm_bwd_rows<NW>(dk, km0, kn0, sK, LK, colp, sr + 64);
    mm::frag_pairs(dk, km0, kn0, [&](int i, int cc, float x0, float x1) {
        if (i >= L) return;
        const int64_t off = (ob + (int64_t)i * HB) * K + cc;
        if (a.dk) *(uint32_t *)(a.dk + off) = mm::pack_op2(x0, x1);
        else if (a.dkv) *(float2 *)(a.dkv + off) = make_float2(x0, x1);
    });
    /* dG through shared memory (over Z), dg = its reverse cumsum over the rows */
    float *sdG = (float *)Z;
    mm::frag_each(dG, km0, kn0, [&](int i, int cc, float &x) { sdG[i * K + cc] = x; });
    mm::red_collect<NW>(red, sdB, true);
    bsync();
    if (tid < L && a.dbetaf) a.dbetaf[ob + (int64_t)tid * HB] = sdB[tid];
    else if (tid < L && a.dbeta) a.dbeta[ob + (int64_t)tid * HB] = f2op(sdB[tid]);
    if (tid < K && a.dg) {
        float s = 0.0f;
        for (int i = L - 1; i >= 0; i--) {
            s += sdG[i * K + tid];
            a.dg[(ob + (int64_t)i * HB) * K + tid] = s;
        }
    }
}

/* one qkwy kernel (MODE: 0 fused, 1 dqkwg, 2 wy), a block per chunk and head (fused, G.vsh > 1: per
 * chunk and G.vsh heads of one beta and gate) */
template <int K, int V, int MODE> int qkwy_launch(const char *name, const Geom &G, const QkArgs &a) {
    using Lay = QkL<K, V, ONE_SM_NTH / 32>;
    static_assert(Lay::bytes <= SMEM_MAX, "shared memory");
    if constexpr (MODE == 0)
        if (G.vsh > 1)
            return DRC_LAUNCH(name, (b_qkwy<K, V, 0, true, ONE_SM_NTH>), G.nchunks * G.HV / G.vsh, ONE_SM_NTH,
                              (size_t)Lay::bytes, G, a);
    return DRC_LAUNCH(name, (b_qkwy<K, V, MODE, false, ONE_SM_NTH>), G.nchunks * G.HV, ONE_SM_NTH, (size_t)Lay::bytes,
                      G, a);
}

template <int K, int V>
int bwd_t(const Plan &p, const dg_dr_variant &var, const Io<uint16_t> &io, const Bufs &b, const QkArgs &a,
          uint16_t *dSh, uint16_t *dSl) {
    static_assert(DhuL<K, 64, DHU_PF_OK>::bytes <= SMEM_MAX && DhuL<K, 64>::bytes <= SMEM_MAX / 2 &&
                      DhuL<K, 32, DHU_PF_OK>::bytes <= SMEM_MAX,
                  "shared memory");
    const Geom &G = p.G;
    /* bv, pf: std::integral_constants, the columns and the prefetch */
    const auto dhu = [&](auto bv, auto pf) {
        constexpr int BV = decltype(bv)::value;
        constexpr bool PF = decltype(pf)::value;
        return DRC_LAUNCH("dr_chunk kda dhu", (b_dhu<K, V, BV, PF>), G.N * G.HV * (V / BV), FNT,
                          (size_t)(DhuL<K, BV, PF>::bytes), G, io.dout, io.dhT, io.dh0, b, dSh, dSl, (uint16_t *)a.dVh,
                          (uint16_t *)a.dVl);
    };
    using I32 = std::integral_constant<int, 32>;
    using I64 = std::integral_constant<int, 64>;
    using PF1 = std::integral_constant<bool, DHU_PF_OK>;
    using PF0 = std::integral_constant<bool, false>;
    int rc = mm::dhu_bv(G) == 32 ? dhu(I32{}, PF1{}) : dhu_prefetch64(G) ? dhu(I64{}, PF1{}) : dhu(I64{}, PF0{});
    if (!rc && var.dw_on_chip) rc = qkwy_launch<K, V, 0>("dr_chunk kda qkwy", G, a);
    if (!rc && !var.dw_on_chip) {
        rc = qkwy_launch<K, V, 1>("dr_chunk kda dqkwg", G, a);
        if (!rc) rc = qkwy_launch<K, V, 2>("dr_chunk kda wy", G, a);
    }
    return rc;
}

} // namespace

/* kept: the forward's working set (fwd with keep), so that prep and the state pass are not run
 * again; the tensor-core KDA prep has a single (blocked) inverse, so every variant can use it */
int bwd(const Plan &p, const dg_dr_variant &var, const Io<uint16_t> &io, const void *kept) {
    const Geom &G = p.G;
    const int64_t rows = G.rows, HV = G.HV, nst = G.nchunks * HV * G.K * G.V;
    const int64_t nk = rows * HV * G.K, nv = rows * HV * G.V;
    /* dq, dk, dbeta, dg of HB heads: the fused qkwy sums the G.vsh heads of one beta and gate */
    const int64_t HB = HV / qkwy_heads(G.vsh, var), nkb = rows * HB * G.K;
    Bufs b;
    QkArgs a;
    memset(&a, 0, sizeof a);
    bool have_b;
    char *own = carve_into(
        const_cast<void *>(kept), [&](Carve &cv) { carve(G, cv, b, true); }, &have_b);
    uint16_t *dS = scratch<uint16_t>((size_t)(2 * nst)), *dV = scratch<uint16_t>((size_t)(2 * nv));
    const bool direct = HB == G.H; /* dq, dk straight to the outputs */
    float *dqv = io.dq && !direct ? scratch<float>((size_t)nkb) : nullptr;
    float *dkv = io.dk && !direct ? scratch<float>((size_t)nkb) : nullptr;
    uint16_t *dW = var.dw_on_chip ? nullptr : scratch<uint16_t>((size_t)(2 * nk));
    float *dGk = var.dw_on_chip ? nullptr : scratch<float>((size_t)(2 * nk)); /* dG, partial dk */
    int rc = -1;
    if (have_b && dS && dV && (!io.dq || direct || dqv) && (!io.dk || direct || dkv) &&
        (var.dw_on_chip || (dW && dGk))) {
        a.q = io.q, a.k = io.k, a.v = io.v, a.beta = io.beta, a.dout = io.dout, a.g = io.g, a.b = b;
        a.dSh = dS, a.dSl = dS + nst, a.dVh = dV, a.dVl = dV + nv;
        a.dqv = dqv, a.dkv = dkv, a.dq = direct ? io.dq : nullptr, a.dk = direct ? io.dk : nullptr;
        a.dWh = dW, a.dWl = dW ? dW + nk : nullptr, a.dGg = dGk, a.dkp = dGk ? dGk + nk : nullptr;
        a.dv = io.dv, a.dbeta = io.dbeta, a.dbetaf = io.dbeta32, a.dg = io.dg;
        a.rq = direct ? io.rq : nullptr, a.rk = direct ? io.rk : nullptr;
        rc = kept ? 0 : prep_state(p, io, b, 1);
        if (!rc)
            rc = G.K == 64 ? (G.V == 64 ? bwd_t<64, 64>(p, var, io, b, a, dS, dS + nst)
                                        : bwd_t<64, 128>(p, var, io, b, a, dS, dS + nst))
                           : (G.V == 64 ? bwd_t<128, 64>(p, var, io, b, a, dS, dS + nst)
                                        : bwd_t<128, 128>(p, var, io, b, a, dS, dS + nst));
        /* the L2 norm's backward: with the sums over value heads, else in qkwy's stores */
        const int fmt = DRC_OPERAND_F16 ? VS_F16 : VS_BF16;
        const int grp = (int)(HB / G.H);
        if (!rc && dqv) rc = heads_sum("dr_chunk kda heads", rows, G.H, grp, G.K, dqv, io.q, io.rq, fmt, io.dq);
        if (!rc && dkv) rc = heads_sum("dr_chunk kda heads", rows, G.H, grp, G.K, dkv, io.k, io.rk, fmt, io.dk);
    }
    release(own);
    release(dS), release(dV), release(dqv), release(dkv), release(dW), release(dGk);
    return rc;
}

} // namespace DRC_KDA
} // namespace drc
