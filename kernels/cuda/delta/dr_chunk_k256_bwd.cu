/* The TF32 family's dqkwg and wy at K = 256 on 16-bit tensor cores (k256_ok: chunk 64, V a multiple
 * of 64; with the per-channel gate dqkwg's gated products in chan_dq_dk below, and wy's in
 * k256c_gamma after wy, dr_chunk_k256_chan_bwd.cu): mma.sync m16n8k16, bf16 operands (fp16 in the
 * DRC_OPERAND_F16 build, dr_chunk_k256_bwd_f16.cu), f32 accumulation; the building blocks of
 * dr_chunk_mma.cuh.
 * They read the working set of prep and the state pass (K256Bufs, the forward's where it kept it:
 * Gc, P, Ai, Mkk in f32, V' in 16-bit words, the states S0 entering each chunk in 16-bit words) and
 * dhu's dV' (f32) and dS1 (the gradient of the state leaving each chunk, 16-bit words) and
 * write what the TF32 kernels k_bwd_dqkwg and k_bwd_wy write (dq, dk per value head in f32, dv,
 * dbeta, dg), dW (hi and lo planes) and the gate's row terms passing between the two through device
 * memory as there; where a key head has one value head, dq (dqkwg) and dk (wy) in the output's
 * 16-bit words too, with the L2 norm's backward (rows_out), instead of heads_sum after them.  Per
 * chunk of L <= 64 rows and value head (dqkwg: a block of 16 warps, one block per SM; wy: 8 warps,
 * two blocks per SM), G the cumulative head gate, Gamma_il = e^{G_i - G_l}:
 *   dqkwg  dP = dO V'^T                  [over V by tiles of 64, in the first K half's steps]
 *          dPs = scale lower_incl(dP) o Gamma
 *          for each half of K (128 columns cc), summing over V by tiles of 64:
 *            dq = scale e^G o (dO S0^T) + dPs K
 *            dk = e^{G_last - G} o (V' dS1^T) + dPs^T Q
 *            dW = -dV' S0^T
 *          HEAD: dG_i = sum_cc q o dq - k o dk (gdn_dg_from_final; else the partial terms
 *          rowcol(dP, P) + q o dq_f2 - k o dk_f3), the last row + sum k o dk_f3 + e^{G_last}
 *          sum S0 o dS1 (the products of the partial form: dr_chunk_generic_bwd.cu)
 *   wy     dUV = dV' V^T,  dVb = Ai^T dV': dv = beta o dVb, dbeta = rowsum(V o dVb)  [V tiles]
 *          dWK = dW K^T                                           [over K by tiles of 64]
 *          dAi = lower_incl(dUV + dWK diag(e^G)) diag(beta)
 *          dA = strictly_lower(-Ai^T dAi Ai^T)  (mma, Ai, dAi and T = Ai^T dAi split)
 *          dbeta += rowsum(dA o Mkk),  dMkk = diag(beta) dA,  HEAD dG += rowcol(dMkk, Mkk)
 *          then by tiles of 64 columns of K: D = Ai^T dW; dbeta (and HEAD dG, times beta) +=
 *          rowsum(e^G o K o D); dk += e^G beta o D + (dMkk o Gamma) K + (dMkk o Gamma)^T K
 *          dg = reverse chunk-local cumsum of dG.
 * Precision: the computed operands dP, dW, Ai, dAi and T, and dV' in wy, enter their products
 * split into hi + lo 16-bit words (dr_chunk_mma.cuh), the inputs q, k, v, dO as they are (exact);
 * V' is plain 16-bit words, as the state pass stores it (Plain<GATE>, as in the K <= 128 kernels),
 * and so are S0 and dS1, dV' in dqkwg's dW and dMkk in dk's products (K256Plain).
 * Shared memory: dqkwg 199 KB (Q, K halves; dPs; two sets of the tiles of a step over K halves and
 * V tiles, S0, dS1 128 x 64, dO, V', dV' 64 x 64: the next step's come by cp.async while
 * this one's are multiplied, dV' in f32 through a staging tile; dP is summed from the first half's
 * dO and V' tiles, so that no pass over V waits on its own loads, and goes through f32 over the
 * set the half's last step read, to dPs before the half's dq and dk need it), wy 102 KB (Ai, dMkk
 * (dAi before it, the staging tile of dV' before that) split; two sets of the tiles of a step over
 * V or K, dV' or dW split and v or k, the next step's by cp.async; dA in f32 over the first set's v
 * tile and the next, dMkk in f32 over its X, for the row sums).  Loads through registers are issued
 * together ahead of their use (Ai; Mkk by rows during dA's product; dk's tile before the products
 * that add to it): one at a time, each would wait on device memory in turn. */
#include "kernels/cuda/delta/dr_chunk_kda.cuh"

namespace drc {
namespace DRC_FAST {
namespace {

constexpr int KK = 256;         /* K */
constexpr int KH = 128;         /* columns of K a pass */
constexpr int LH = KH + PAD;    /* row stride of the 64 x 128 tiles */
constexpr int LT = 64 + PAD;    /* row stride of the 64-column tiles */
constexpr int LF = 65;          /* row stride of the f32 64 x 64 matrices */
constexpr int BNT = ONE_SM_NTH; /* threads */
constexpr int BNW = BNT / 32;
using T64 = WT<64, 64, BNW>;
using T128 = WT<64, KH, BNW>;
/* wy: 8 warps, two blocks a multiprocessor (the other block's work hides one block's waits) */
constexpr int WNT = FNT;
constexpr int WNW = WNT / 32;
using W64 = WT<64, 64, WNW>;

constexpr int SPT = 2 * 64 * LT;  /* elements of a split 64 x 64 tile (hi, then lo) */
constexpr int ST = KH * LT;       /* of a 128 x 64 tile of S0 or dS1 (16-bit words, K256Plain) */
constexpr int RED = 4 * BNW * 64; /* bytes of the row reductions */
/* elements of a tile set of dqkwg (DqSet; dV' plain: K256Plain::DwDvn) */
constexpr int DQ_SET = 2 * ST + 2 * 64 * LT + (K256Plain::DwDvn ? 64 * LT : SPT);
/* (and the per-channel gate's references R and last row Gl, K floats each) */
constexpr int DQ_BYTES = 2 * (2 * 64 * LH + SPT + 2 * DQ_SET) + 4 * 64 * 64 + RED + 4 * 3 * 64 + 64 + 4 * 2 * KK;
constexpr int WY_BYTES = 2 * (4 * SPT + 3 * 64 * LT) + 4 * WNW * 64 + 4 * 4 * 64 + 64;
static_assert(DQ_BYTES <= SMEM_MAX && 2 * (WY_BYTES + 1024) <= SMEM_MAX, "shared memory");
static_assert(4 * 64 * LF <= 2 * 2 * 64 * LT && 4 * 64 * LF <= 2 * SPT, "wy's f32 matrices in V, K and X");
static_assert(4 * 64 * 64 <= 2 * SPT, "wy's dV' staging in dMkk's place");
static_assert(4 * 64 * LF <= 2 * 2 * ST, "dP's f32 copy in S0's and dS1's place");
static_assert(2 * 64 * LH <= DQ_SET && RED >= 4 * (4 * KH + KH), "CHANNEL: a split 64 x 128 tile in a tile set; "
                                                                 "the column sums in red");

/* One of dqkwg's two sets of tiles for a step of its loop over K halves and V tiles (one set is
 * worked on while the next step's loads fill the other): S0 and dS1 (128 x 64), V' and dO
 * (64 x 64), dV' (64 x 64, plain: K256Plain::DwDvn; else split), from p on */
struct DqSet {
    uint16_t *S0, *dS1, *Vn, *O;
    Sp dVn;
    __device__ explicit DqSet(uint16_t *p)
        : S0(p), dS1(p + ST), Vn(p + 2 * ST), O(Vn + 64 * LT), dVn{O + 64 * LT, 64 * LT} {}
};

/* f32 tiles through registers (dr_chunk_mma.cuh), by the block's NTH threads */
template <int R, int Cc, int NTH = BNT> using F4 = F32Tile<R, Cc, NTH>;

/* The tiles that come from device memory are asked into L2 ahead of their loads, a 128-byte line a
 * thread (prefetch_l2, dr_chunk_mma.cuh).  dW and dk a tile ahead in wy; the chunk's rows of V',
 * dV', dO (v, dV' in wy), read by several passes over V, all at the start. */
/* rows < nrow of a chunk's V columns (elements of E bytes, V E a multiple of 128) at row stride ld
 * (elements), the lines spread over the block: what the kernels read of V', dV', dO, v over and
 * again, asked for at their start */
template <int NTH, typename E> __device__ __forceinline__ void prefetch_rows(const E *g, int64_t ld, int nrow, int V) {
    const int lpr = V * (int)sizeof(E) / 128;
    for (int t = threadIdx.x; t < nrow * lpr; t += NTH)
        prefetch_l2((const char *)(g + (t / lpr) * ld) + (t % lpr) * 128);
}

/* the chunk's gate (rows >= L: G_{L-1}; NONE: 0) and beta (0 past L) */
template <int GATE>
__device__ __forceinline__ void gate_beta(const Geom &G, const K256Bwd &a, int64_t r0, int L, int hv, float *sG,
                                          float *sb) {
    const int i = threadIdx.x;
    if (i < 64) {
        sG[i] = GATE == DG_GATE_HEAD ? a.Gc[(r0 + (i < L ? i : L - 1)) * G.HV + hv] : 0.0f;
        sb[i] = i < L ? op2f(a.beta[(r0 + i) * G.HV + hv]) : 0.0f;
    }
}

/* the block's chunk c (rows r0 .. r0 + L - 1) and value head hv, and the offsets of row r0 in q, k
 * (oq), in v and the [rows, HV, V] buffers (ov), in the [rows, HV, K] ones (ok) and the [rows, HV,
 * 64] ones (oc) */
struct At {
    int64_t c, r0, oq, ov, ok, oc, ldq, ldv, ldk, ldc; /* (and the row strides) */
    int hv, L;
    __device__ __forceinline__ explicit At(const Geom &G) {
        ldq = (int64_t)G.H * KK, ldv = (int64_t)G.HV * G.V, ldk = (int64_t)G.HV * KK, ldc = (int64_t)G.HV * 64;
        c = blockIdx.x / G.HV, hv = (int)(blockIdx.x % G.HV);
        const Chunk ch = chunk_at(G, c);
        r0 = ch.r0, L = ch.L;
        oq = (r0 * G.H + hv / G.grp) * KK, ov = (r0 * G.HV + hv) * G.V, ok = (r0 * G.HV + hv) * KK;
        oc = (r0 * G.HV + hv) * 64;
    }
};

/* Where the kernels store dq or dk themselves (K256Bwd::dq, dk: one value head a key head), from
 * the chunk's rows i < L of dy, the gradient of the rows the kernels read (f32 at y, row stride ldy,
 * stored by this block before a barrier: they come back from L2), with the L2 norm's backward
 * where rr is given:
 *     dx = r_i (dy - xn (dy . xn)),   r_i = rr[i rstride]
 * (xn the normalised rows: 16-bit words at x, row stride ldx), else dx = dy; out 16-bit words at
 * the same offsets as x (16-byte aligned): one rounding, as heads_sum's.  A warp a row, eight
 * columns a lane; a warp's rows by RB at a time, each batch's loads issued together (it is the
 * block's tail, where nothing else hides a wait on L2).  Not inlined: inlined, it changed the
 * kernels' register allocation (dqkwg with the head gate spilled 92 bytes, not 48). */
template <int NTH, int RB = 4>
__device__ __noinline__ void rows_out(const float *y, int64_t ldy, const uint16_t *x, uint16_t *out, int64_t ldx,
                                      const float *rr, int64_t rstride, int L) {
    constexpr int NW = NTH / 32;
    const int lane = threadIdx.x & 31, c = 8 * lane, warp = threadIdx.x >> 5;
    static_assert(KK == 8 * 32 && 64 % (NW * RB) == 0, "eight columns a lane, whole batches of rows");
    for (int i0 = warp; i0 < 64; i0 += NW * RB) {
        uint4 ya[RB], yb[RB], w[RB];
        float r[RB];
#pragma unroll
        for (int b = 0; b < RB; b++) {
            const int i = i0 + b * NW;
            if (i >= L) continue;
            ya[b] = *(const uint4 *)(y + i * ldy + c), yb[b] = *(const uint4 *)(y + i * ldy + c + 4);
            if (rr) w[b] = *(const uint4 *)(x + i * ldx + c), r[b] = rr[i * rstride];
        }
#pragma unroll
        for (int b = 0; b < RB; b++) {
            const int i = i0 + b * NW;
            if (i >= L) continue;
            float s[8], xn[8];
            memcpy(s, &ya[b], 16), memcpy(s + 4, &yb[b], 16);
            if (rr) {
                const uint32_t wv[4] = {w[b].x, w[b].y, w[b].z, w[b].w};
                float d = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    xn[j] = op2f((uint16_t)(wv[j / 2] >> (16 * (j & 1))));
                    d += s[j] * xn[j];
                }
                d = warp_sum(d);
#pragma unroll
                for (int j = 0; j < 8; j++) s[j] = r[b] * (s[j] - xn[j] * d);
            }
            uint32_t o[4];
#pragma unroll
            for (int j = 0; j < 4; j++) o[j] = pack_op2(s[2 * j], s[2 * j + 1]);
            *(uint4 *)(out + i * ldx + c) = make_uint4(o[0], o[1], o[2], o[3]);
        }
    }
}

namespace kd = DRC_KDA;

/* CHANNEL, for one half of K (G at Gh, its references R and last row Gl; Gamma_ilc = e^{G_ic - G_lc}):
 *   dq = scale e^G o f2 + sum_l dPs_il K_l o Gamma_il,   dk = f3 + sum_m dPs_mj Q_m o Gamma_mj,
 *   f3 = e^{Gl - G} o dkd
 * in place of f2 (dO S0^T) and dkd (V' dS1^T), dPs = scale lower_incl(dP) (split, sDP); colk gets
 * the column sums of k o f3 [4][KH] (one row a row of warps).  Wide form (every channel's span
 * within WIDE_SPAN): dq = e^{G - R} o (scale e^R o f2 + dPs Kt), Kt = K o e^{R - G}, and dk =
 * e^{R - G} o (e^{Gl - R} o dkd + dPs^T Qt), Qt = Q o e^{G - R}: Kt, then Qt, split into bf16 words
 * in scr (64 x KH); else the sums over rows element by element in f32 (steeper gates, rare). */
template <int NT>
__device__ __forceinline__ void chan_dq_dk(const Geom &G, float (&f2)[1][NT][4], float (&dkd)[1][NT][4],
                                           const uint16_t *sQ, const uint16_t *sK, Sp sDP, Sp scr, const float *Gh,
                                           int64_t ldk, const float *R, const float *Gl, float *colk, int L, int m0,
                                           int n0, bool wide) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const kd::ChunkGate gat{Gh, ldk, L};
    float cs[NT][2] = {};
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int i = m0 + g + 8 * (q >> 1), cc = n0 + nt * 8 + 2 * t + (q & 1);
            const float gi = gat(i, cc), f3 = dkd[0][nt][q] * kd::kexp(Gl[cc] - gi);
            cs[nt][q & 1] += op2f(sK[i * LH + cc]) * f3;
            dkd[0][nt][q] = wide ? dkd[0][nt][q] * kd::kexp(Gl[cc] - R[cc]) : f3;
            f2[0][nt][q] *= G.scale * kd::kexp(wide ? R[cc] : gi);
        }
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            float x = cs[nt][j];
            x += shfl_xor(x, 4), x += shfl_xor(x, 8), x += shfl_xor(x, 16);
            if (g == 0) colk[(warp % 4) * KH + n0 + nt * 8 + 2 * t + j] = x;
        }
    if (wide) {
        bsync(); /* scr's tile set read (the loop's last step; the first half's make_dps has a barrier) */
        for (int e = tid; e < 64 * KH; e += BNT) {
            const int i = e / KH, cc = e % KH;
            split2<true>(op2f(sK[i * LH + cc]) * kd::kexp(R[cc] - gat(i, cc)), scr.hi[i * LH + cc],
                         scr.lo()[i * LH + cc]);
        }
        bsync();
        mma_ss_bf<1, NT, false, true>(f2, sDP, LT, m0, scr, LH, n0, 64);
        bsync();
        for (int e = tid; e < 64 * KH; e += BNT) {
            const int i = e / KH, cc = e % KH;
            split2<true>(op2f(sQ[i * LH + cc]) * kd::kexp(gat(i, cc) - R[cc]), scr.hi[i * LH + cc],
                         scr.lo()[i * LH + cc]);
        }
        bsync();
        mma_ss_bf<1, NT, true, true>(dkd, sDP, LT, m0, scr, LH, n0, 64);
        frag_each(f2, m0, n0, [&](int i, int cc, float &x) { x *= kd::kexp(gat(i, cc) - R[cc]); });
        frag_each(dkd, m0, n0, [&](int i, int cc, float &x) { x *= kd::kexp(R[cc] - gat(i, cc)); });
        return;
    }
    const auto dps = [&](int i, int l) { return op2f(sDP.hi[i * LT + l]) + op2f(sDP.lo()[i * LT + l]); };
    frag_each(f2, m0, n0, [&](int i, int cc, float &x) {
        const float gi = gat(i, cc);
        for (int l = 0; l <= i && l < L; l++) x += dps(i, l) * op2f(sK[l * LH + cc]) * kd::kexp(gi - gat(l, cc));
    });
    frag_each(dkd, m0, n0, [&](int i, int cc, float &x) {
        const float gi = gat(i, cc);
        for (int m = i; m < L; m++) x += dps(m, i) * op2f(sQ[m * LH + cc]) * kd::kexp(gat(m, cc) - gi);
    });
}

template <int GATE> __global__ void __launch_bounds__(BNT, 1) k256_dqkwg(Geom G, K256Bwd a) {
    DRC_SMEM(float, sm);
    constexpr bool CH = GATE == DG_GATE_CHANNEL;
    const int HV = G.HV, V = G.V, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const At at(G);
    const int64_t c = at.c, r0 = at.r0, oq = at.oq, ov = at.ov, ok = at.ok, oc = at.oc, ldv = at.ldv, ldk = at.ldk;
    const int64_t ldq = at.ldq, ldc = at.ldc;
    const int hv = at.hv, L = at.L;
    uint16_t *sQ = (uint16_t *)sm, *sK = sQ + 64 * LH;
    const Sp sDP{sK + 64 * LH, 64 * LT};
    uint16_t *const sets = sDP.hi + SPT; /* two DqSet, set 0 and set 1 */
    const auto set = [&](int i) { return DqSet(sets + i * DQ_SET); };
    float *sdVf = (float *)(sets + 2 * DQ_SET); /* the next step's dV' in f32, by cp.async */
    float *red = sdVf + 64 * 64, *sG = red + BNW * 64, *sRow = sG + 64, *sb = sRow + 64;
    /* CHANNEL: R, Gl [K]; red holds the column sums of k o f3 [4][KH] (a row of warps each) and of
     * S0 o dS1 [KH] */
    float *sR = sb + 64 + 16, *sGl = sR + KK, *colk = red, *colS = red + 4 * KH;
    const float *Gh = CH ? a.Gc + ok : nullptr; /* the chunk's G, row i at Gh[i ldk] */
    const bool head_partial = GATE == DG_GATE_HEAD && !a.final_dg;
    static_assert(Plain<GATE>::Vn, "V' is stored as 16-bit words");
    const int64_t os = (c * HV + hv) * (int64_t)KK * V; /* the chunk's state */
    /* the tiles of K columns cc0 .. cc0 + 127 and V columns v0 .. v0 + 63 by cp.async: S0, dS1, V',
     * dO into set x, dV' (f32) into sdVf (each thread rounds its own words of it into x.dVn) */
    F4<64, 64> dvn;
    const auto issue = [&](const DqSet x, int cc0, int v0) {
        const int64_t o = os + (int64_t)cc0 * V + v0;
        const int t = tid_fresh(); /* (offsets made here, not kept live through the loop) */
        load_raw_async<KH, 64, BNT>(x.S0, a.Sh + o, V, KH, t);
        load_raw_async<KH, 64, BNT>(x.dS1, a.dSh + o, V, KH, t);
        load_raw_async<64, 64, BNT>(x.Vn, a.Vn16 + ov + v0, ldv, L, t);
        load_raw_async<64, 64, BNT>(x.O, a.dout + ov + v0, ldv, L, t);
        dvn.load_async(sdVf, a.dVn + ov + v0, ldv, L, t);
        cp_async_commit();
    };
    prefetch_rows<BNT>(a.Vn16 + ov, ldv, L, V), prefetch_rows<BNT>(a.dout + ov, ldv, L, V);
    prefetch_rows<BNT>(a.dVn + ov, ldv, L, V), prefetch_rows<BNT>(a.q + oq + KH, ldq, L, KH);
    prefetch_rows<BNT>(a.k + oq + KH, ldq, L, KH);
    gate_beta<GATE>(G, a, r0, L, hv, sG, sb);
    bool wide = false;
    if (CH) wide = kd::chan_refs<KK, BNT>(Gh, ldk, L, red, sR, sGl);
    for (int e = tid; e < BNW * 64; e += BNT) red[e] = 0.0f;
    /* the first K half's Q and K and the loop's first tiles */
    load_raw_async<64, KH, BNT>(sQ, a.q + oq, ldq, L), load_raw_async<64, KH, BNT>(sK, a.k + oq, ldq, L);
    issue(set(1), 0, 0);
    /* dP = dO V'^T, summed over the first K half's steps (their dO and V' tiles) */
    const int pm0 = T64::m0(warp), pn0 = T64::n0(warp);
    float dp[1][T64::NT][4];
    acc_zero(dp);
    /* then, from dP in f32 (over the tile set the first half's last step read): HEAD, partial
     * terms: rowcol(dP, P) = sum_l dP_il P_il - sum_m dP_mi P_mi starts the row sums;  dPs = scale
     * lower_incl(dP) o Gamma, split */
    const auto make_dps = [&](float *sDPf) {
        bsync(); /* (the set read) */
        frag_pairs(dp, pm0, pn0,
                   [&](int i, int l, float x0, float x1) { sDPf[i * LF + l] = x0, sDPf[i * LF + l + 1] = x1; });
        bsync();
        for (int i = warp; i < 64; i += BNW) {
            float rc = 0.0f;
            if (head_partial && i < L) {
                for (int l = lane; l <= i; l += 32) rc += sDPf[i * LF + l] * a.P[oc + i * ldc + l];
                for (int m = i + lane; m < L; m += 32) rc -= sDPf[m * LF + i] * a.P[oc + m * ldc + i];
                rc = warp_sum(rc);
            }
            if (lane == 0) sRow[i] = rc;
        }
        for (int e = tid; e < 64 * 64; e += BNT) {
            const int i = e / 64, l = e % 64;
            float x = l <= i && i < L ? G.scale * sDPf[i * LF + l] : 0.0f; /* (CHANNEL: the gate goes
                                                                              * into the operands) */
            if (GATE == DG_GATE_HEAD) x *= expf(sG[i] - sG[l]);
            split2(x, sDP.hi[i * LT + l], sDP.lo()[i * LT + l]);
        }
        bsync();
    };
    const int m0 = T128::m0(warp), n0 = T128::n0(warp), gq = lane >> 2;
    float hk = 0.0f, hs = 0.0f; /* HEAD: this thread's sums of k o f3 and of S0 o dS1 (CHANNEL: hs of
                                 * channel tid / 4 of the half, its part of the 64 columns of a tile) */
    int it = 0;                 /* the step: set 1 at even steps, set 0 at odd */
    for (int cc0 = 0; cc0 < KK; cc0 += KH) {
        if (cc0) load_raw<64, KH, BNT>(sQ, a.q + oq + cc0, ldq, L), load_raw<64, KH, BNT>(sK, a.k + oq + cc0, ldq, L);
        float f2[1][T128::NT][4], dkd[1][T128::NT][4], dw[1][T128::NT][4];
        acc_zero(f2), acc_zero(dkd), acc_zero(dw);
        for (int v0 = 0; v0 < V; v0 += 64, it++) {
            /* this tile set (its loads were issued a step ago), then the next one in flight */
            const DqSet x = set(~it & 1);
            cp_async_wait_all();
            dvn.take(sdVf, tid_fresh());
            dvn.put<!K256Plain::DwDvn>(x.dVn, LT);
            bsync(); /* (the other set and sdVf were last read before this barrier) */
            if (v0 + 64 < V) issue(set(it & 1), cc0, v0 + 64);
            else if (cc0 + KH < KK) issue(set(it & 1), cc0 + KH, 0);
            mma_run<1, T128::NT, false, false>(f2, x.O, LT, m0, x.S0, LT, n0, 64);
            mma_run<1, T128::NT, false, false>(dkd, x.Vn, LT, m0, x.dS1, LT, n0, 64);
            mma_p<1, T128::NT, false, false, !K256Plain::DwDvn, false>(dw, x.dVn, LT, m0, Sp{x.S0, 0}, LT, n0, 64);
            if (!cc0) mma_run<1, T64::NT, false, false>(dp, x.O, LT, pm0, x.Vn, LT, pn0, 64);
            if (GATE == DG_GATE_HEAD) /* sum S0 o dS1, from their 16-bit words */
                for (int e = tid; e < KH * 64; e += BNT) {
                    const int o = e / 64 * LT + e % 64;
                    hs += op2f(x.S0[o]) * op2f(x.dS1[o]);
                }
            if (CH) /* channel tid / 4's sum of S0 o dS1, 16 columns a thread */
#pragma unroll 4
                for (int u = 0; u < 16; u++) {
                    const int o = (tid >> 2) * LT + (tid & 3) * 16 + u;
                    hs += op2f(x.S0[o]) * op2f(x.dS1[o]);
                }
        }
        if (!cc0) make_dps((float *)set(it & 1).S0); /* (the set the last step read) */
        if (CH) {
            chan_dq_dk(G, f2, dkd, sQ, sK, sDP, Sp{set(it & 1).S0, 64 * LH}, Gh + cc0, ldk, sR + cc0, sGl + cc0, colk,
                       L, m0, n0, wide);
            hs += shfl_xor(hs, 1), hs += shfl_xor(hs, 2);
            if ((tid & 3) == 0) colS[tid >> 2] = hs;
            hs = 0.0f;
        } else {
            /* this thread's rows m0 + gq, m0 + gq + 8: e^G, e^{G_last - G} */
            float eg[2], ed[2];
            for (int hh = 0; hh < 2; hh++) {
                const float gi = sG[m0 + gq + 8 * hh];
                eg[hh] = GATE == DG_GATE_HEAD ? expf(gi) : 1.0f;
                ed[hh] = GATE == DG_GATE_HEAD ? expf(sG[63] - gi) : 1.0f;
            }
            float rs[2] = {0.0f, 0.0f};
            /* dq = scale e^G o f2 + dPs K */
            frag_each(f2, m0, n0, [&](int i, int cc, float &x) {
                x *= G.scale * eg[(i - m0) >> 3];
                if (head_partial) rs[(i - m0) >> 3] += op2f(sQ[i * LH + cc]) * x;
            });
            mma_p<1, T128::NT, false, true, true, false>(f2, sDP, LT, m0, Sp{sK, 0}, LH, n0, 64);
            /* dk = e^{G_last - G} o dkd + dPs^T Q */
            frag_each(dkd, m0, n0, [&](int i, int cc, float &x) {
                x *= ed[(i - m0) >> 3];
                if (GATE == DG_GATE_HEAD) {
                    const float kx = op2f(sK[i * LH + cc]) * x;
                    hk += kx;
                    if (head_partial) rs[(i - m0) >> 3] -= kx;
                }
            });
            mma_p<1, T128::NT, true, true, true, false>(dkd, sDP, LT, m0, Sp{sQ, 0}, LH, n0, 64);
            if (GATE == DG_GATE_HEAD && !head_partial) {
                frag_each(f2, m0, n0, [&](int i, int cc, float &x) { rs[(i - m0) >> 3] += op2f(sQ[i * LH + cc]) * x; });
                frag_each(dkd, m0, n0,
                          [&](int i, int cc, float &x) { rs[(i - m0) >> 3] -= op2f(sK[i * LH + cc]) * x; });
            }
            if (GATE == DG_GATE_HEAD) red_rows_put(red, m0, rs);
        }
        frag_pairs(f2, m0, n0, [&](int i, int cc, float x0, float x1) {
            if (i < L) *(float2 *)(a.dqv + ok + i * ldk + cc0 + cc) = make_float2(x0, x1);
        });
        frag_pairs(dkd, m0, n0, [&](int i, int cc, float x0, float x1) {
            if (i < L) *(float2 *)(a.dkv + ok + i * ldk + cc0 + cc) = make_float2(x0, x1);
        });
        frag_pairs(dw, m0, n0, [&](int i, int cc, float x0, float x1) {
            if (i < L) put_pair_global<true>(a.dWh, a.dWl, ok + i * ldk + cc0 + cc, -x0, -x1);
        });
        if (CH) { /* dG_ic = q o dq - k o dk; its last row + sum_i k o f3 + e^{Gl} o sum_j S0 o dS1 */
            frag_pairs(f2, m0, n0, [&](int i, int cc, float x0, float x1) {
                if (i < L)
                    *(float2 *)(a.dG + ok + i * ldk + cc0 + cc) =
                        make_float2(op2f(sQ[i * LH + cc]) * x0, op2f(sQ[i * LH + cc + 1]) * x1);
            });
            frag_pairs(dkd, m0, n0, [&](int i, int cc, float x0, float x1) {
                if (i >= L) return;
                float2 *d = (float2 *)(a.dG + ok + i * ldk + cc0 + cc);
                const float2 y = *d;
                *d = make_float2(y.x - op2f(sK[i * LH + cc]) * x0, y.y - op2f(sK[i * LH + cc + 1]) * x1);
            });
            bsync();
            if (tid < KH) {
                float s = colS[tid] * kd::kexp(sGl[cc0 + tid]);
#pragma unroll
                for (int w = 0; w < 4; w++) s += colk[w * KH + tid];
                a.dG[ok + (L - 1) * ldk + cc0 + tid] += s;
            }
        }
        bsync(); /* Q and K read */
    }
    if (GATE == DG_GATE_HEAD) { /* dG rows; the last row + sum k o f3 + e^{G_last} sum S0 o dS1 */
        red_collect<BNW>(red, sRow, true);
        const float sk = block_sum<BNW>(hk, sb), st = block_sum<BNW>(hs, sb);
        if (tid < L) a.dG[(r0 + tid) * HV + hv] = sRow[tid] + (tid == L - 1 ? sk + expf(sG[63]) * st : 0.0f);
    }
    if (a.dq) /* dq from dy as stored above (the loop's last barrier since) */
        rows_out<BNT>(a.dqv + ok, ldk, a.q + oq, a.dq + oq, ldq, a.rq ? a.rq + r0 * HV + hv : nullptr, HV, L);
}

template <int GATE> __global__ void __launch_bounds__(WNT, 2) k256_wy(Geom G, K256Bwd a) {
    DRC_SMEM(float, sm);
    constexpr bool CH = GATE == DG_GATE_CHANNEL;
    const int HV = G.HV, V = G.V, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const At at(G);
    const int64_t r0 = at.r0, oq = at.oq, ov = at.ov, ok = at.ok, oc = at.oc;
    const int64_t ldq = at.ldq, ldv = at.ldv, ldk = at.ldk, ldc = at.ldc;
    const int L = at.L, hv = at.hv;
    const Sp sAi{(uint16_t *)sm, 64 * LT}, sdM{sAi.hi + SPT, 64 * LT};
    uint16_t *sVv = sdM.hi + SPT; /* (and a 64 x 64 tile after it: room for dA in f32) */
    const Sp sX{sVv + 2 * 64 * LT, 64 * LT}, sX2{sX.hi + SPT, 64 * LT};
    uint16_t *sY2 = sX2.hi + SPT;
    /* The loops over V and K tiles run on two sets of tiles, X (dV' or dW, split) and Y (v or k):
     * set 0 is sX and sVv, set 1 sX2 and sY2; a step's tiles come by cp.async during the step
     * before (dV' in f32 through sdVf, in dMkk's place until dAi, each thread splitting the words
     * it copied itself).  dA in f32 over sVv and the tile after it (from the product T Ai^T, after
     * the loops, to dMkk), dMkk in f32 over sX (after T's last read, to the last loop's first
     * barrier): the first tiles of the last loop come into set 1 meanwhile. */
    float *sdAi = (float *)sVv, *sT = (float *)sX.hi, *sdVf = (float *)sdM.hi, *red = (float *)(sY2 + 64 * LT);
    float *sG = red + WNW * 64, *sb = sG + 64, *sdb = sb + 64, *sdG = sdb + 64;
    const auto setX = [&](int i) { return i ? sX2 : sX; };
    const auto setY = [&](int i) { return i ? sY2 : sVv; };
    F4<64, 64, WNT> dvf;
    /* into set i: the V tile from v0 (dV' into sdVf, v) or the K tile from x0 (dW's planes, k) */
    const auto issue_v = [&](int i, int v0) {
        const int t = tid_fresh();
        dvf.load_async(sdVf, a.dVn + ov + v0, ldv, L, t);
        load_raw_async<64, 64, WNT>(setY(i), a.v + ov + v0, ldv, L, t);
        cp_async_commit();
    };
    const auto issue_k = [&](int i, int x0) {
        const int t = tid_fresh();
        load_raw_async<64, 64, WNT>(setX(i).hi, a.dWh + ok + x0, ldk, L, t);
        load_raw_async<64, 64, WNT>(setX(i).lo(), a.dWl + ok + x0, ldk, L, t);
        load_raw_async<64, 64, WNT>(setY(i), a.k + oq + x0, ldq, L, t);
        cp_async_commit();
    };
    issue_v(0, 0);
    prefetch_rows<WNT>(a.dVn + ov, ldv, L, V), prefetch_rows<WNT>(a.v + ov, ldv, L, V);
    gate_beta<GATE>(G, a, r0, L, hv, sG, sb);
    for (int e = tid; e < WNW * 64; e += WNT) red[e] = 0.0f;
    { /* Ai (lower, rows < L), split; the loads all in flight before the first store */
        constexpr int AIT = 64 * 64 / WNT;
        float ai[AIT];
#pragma unroll
        for (int t = 0; t < AIT; t++) {
            const int e = tid + t * WNT, i = e / 64, j = e % 64;
            ai[t] = j <= i && i < L ? a.Ai[oc + i * ldc + j] : 0.0f;
        }
#pragma unroll
        for (int t = 0; t < AIT; t++) {
            const int e = tid + t * WNT, i = e / 64, j = e % 64;
            split2(ai[t], sAi.hi[i * LT + j], sAi.lo()[i * LT + j]);
        }
    }
    const int pm0 = W64::m0(warp), pn0 = W64::n0(warp), gq = lane >> 2;
    const auto prefetch_dw = [&](int x0) {
        prefetch_tile<64, 64>(a.dWh + ok + x0, ldk, L, tid), prefetch_tile<64, 64>(a.dWl + ok + x0, ldk, L, tid - 64);
    };
    /* step st's set: st & 1, its loads issued during step st - 1; then a barrier (the other set
     * and sdVf were last read before it) */
    int st = 0;
    const auto step_begin = [&](bool v_tile) {
        cp_async_wait_all();
        if (v_tile) dvf.take(sdVf, tid_fresh()), dvf.put(setX(st & 1), LT);
        bsync();
    };
    float duv[1][W64::NT][4];
    acc_zero(duv);
    { /* dUV = dV' V^T;  dVb = Ai^T dV': dv = beta o dVb, dbeta = rowsum(V o dVb) */
        float rs[2] = {0.0f, 0.0f};
        for (int v0 = 0; v0 < V; v0 += 64, st++) {
            step_begin(true);
            if (v0 + 64 < V) issue_v(~st & 1, v0 + 64);
            else issue_k(~st & 1, 0), prefetch_dw(64);
            const Sp x = setX(st & 1);
            const uint16_t *y = setY(st & 1);
            mma_p<1, W64::NT, false, false, true, false>(duv, x, LT, pm0, Sp{(uint16_t *)y, 0}, LT, pn0, 64);
            float dvb[1][W64::NT][4];
            acc_zero(dvb);
            mma_p<1, W64::NT, true, true, true, true>(dvb, sAi, LT, pm0, x, LT, pn0, 64);
            frag_pairs(dvb, pm0, pn0, [&](int j, int c, float s0, float s1) {
                rs[(j - pm0) >> 3] += op2f(y[j * LT + c]) * s0 + op2f(y[j * LT + c + 1]) * s1;
                if (a.dv && j < L) *(uint32_t *)(a.dv + ov + j * ldv + v0 + c) = pack_op2(sb[j] * s0, sb[j] * s1);
            });
        }
        red_rows_put(red, pm0, rs);
    }
    /* CHANNEL: G_jc of the chunk (rows >= L: G_{L-1}) */
    const kd::ChunkGate gch{GATE == DG_GATE_CHANNEL ? a.Gc + ok : nullptr, ldk, L};
    /* dWK = dW K^T  (CHANNEL: dW (K o e^G)^T, K o e^G made in place in 16-bit words) */
    float dwk[1][W64::NT][4];
    acc_zero(dwk);
    for (int x0 = 0; x0 < KK; x0 += 64, st++) {
        step_begin(false);
        if (x0 + 64 < KK) issue_k(~st & 1, x0 + 64);
        if (x0 + 128 < KK) prefetch_dw(x0 + 128);
        if (CH) {
            uint16_t *y = setY(st & 1);
            for (int e = tid; e < 64 * 64; e += WNT) {
                const int j = e / 64, c = e % 64;
                y[j * LT + c] = f2op(op2f(y[j * LT + c]) * kd::kexp(gch(j, x0 + c)));
            }
            bsync();
        }
        mma_p<1, W64::NT, false, false, true, false>(dwk, setX(st & 1), LT, pm0, Sp{setY(st & 1), 0}, LT, pn0, 64);
    }
    /* dAi = lower_incl(dUV + dWK diag(e^G)) diag(beta), split (in dMkk's place, free until dMkk) */
    store_split<W64::NT>(sdM, LT, pm0, pn0, [&](int i, int j, int nt, int q) {
        const float e = GATE == DG_GATE_HEAD ? expf(sG[j]) : 1.0f;
        return j <= i && i < L ? (duv[0][nt][q] + e * dwk[0][nt][q]) * sb[j] : 0.0f;
    });
    red_collect<WNW>(red, sdb, false); /* dbeta's V terms (the rows put above, before the barriers) */
    bsync();
    issue_k(1, 0); /* the last loop's first tiles (set 1: not read from here to there) */
    prefetch_dw(64), prefetch_tile<64, 64>(a.dkv + ok, ldk, L, tid);
    { /* T = Ai^T dAi (split x split; split into X, free between dW's two passes) */
        float acc[1][W64::NT][4];
        acc_zero(acc);
        mma_ss<1, W64::NT, true, true>(acc, sAi, LT, pm0, sdM, LT, pn0, 64);
        store_split<W64::NT>(Sp{sX.hi, 64 * LT}, LT, pm0, pn0, [&](int, int, int nt, int q) { return acc[0][nt][q]; });
    }
    bsync();
    /* Mkk by rows, warp w its rows w + 8r (their loads in flight through dA's product) */
    constexpr int RW = 64 / WNW;
    float mk[RW][2];
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int i = warp + r * WNW, j = lane + 32 * h;
            mk[r][h] = j < i && i < L ? a.Mkk[oc + i * ldc + j] : 0.0f;
        }
    { /* dA = strictly_lower(-T Ai^T), f32 */
        float acc[1][W64::NT][4];
        acc_zero(acc);
        mma_ss<1, W64::NT, false, false>(acc, Sp{sX.hi, 64 * LT}, LT, pm0, sAi, LT, pn0, 64);
        frag_each(acc, pm0, pn0, [&](int i, int j, float &x) { sdAi[i * LF + j] = j < i && i < L ? -x : 0.0f; });
    }
    bsync();
    /* dbeta_i += sum_{j<i} dA_ij Mkk_ij;  dMkk = diag(beta) dA (in T's place); HEAD: dMkk o Mkk over
     * dA, whose row sums less its column sums start dG (dG_i = sum_j dMkk_ij Mkk_ij - sum_m dMkk_mi
     * Mkk_mi) */
#pragma unroll
    for (int r = 0; r < RW; r++) {
        const int i = warp + r * WNW;
        float s = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int j = lane + 32 * h;
            const float x = j < i && i < L ? sdAi[i * LF + j] : 0.0f;
            s += x * mk[r][h];
            sT[i * LF + j] = sb[i] * x;
            if (GATE == DG_GATE_HEAD) sdAi[i * LF + j] = sb[i] * x * mk[r][h];
        }
        s = warp_sum(s);
        if (lane == 0) sdb[i] += s;
    }
    bsync();
    if (CH) /* dMkk out, for k256c_gamma's (dMkk o Gamma) products */
        for (int e = tid; e < L * 64; e += WNT) a.dMkk[oc + (e / 64) * ldc + e % 64] = sT[(e / 64) * LF + e % 64];
    for (int i = warp; i < 64; i += WNW) {
        float s = 0.0f;
        if (GATE == DG_GATE_HEAD && i < L) {
            for (int j = lane; j < 64; j += 32) s += sdAi[i * LF + j] - sdAi[j * LF + i];
            s = warp_sum(s);
        }
        if (lane == 0) sdG[i] = s;
    }
    /* dMkk o Gamma (split, or its hi words: K256Plain::WyDmkk) */
    for (int e = tid; !CH && e < 64 * 64; e += WNT) {
        const int i = e / 64, j = e % 64;
        float x = sT[i * LF + j];
        if (GATE == DG_GATE_HEAD && j < i) x *= expf(sG[i] - sG[j]);
        if (K256Plain::WyDmkk) sdM.hi[i * LT + j] = f2op(x);
        else split2(x, sdM.hi[i * LT + j], sdM.lo()[i * LT + j]);
    }
    /* dk += e^G beta o (Ai^T dW) + (dMkk o Gamma) K + (dMkk o Gamma)^T K;  dbeta, dG += rowsums */
    float eg[2];
    for (int hh = 0; hh < 2; hh++) eg[hh] = GATE == DG_GATE_HEAD ? expf(sG[pm0 + gq + 8 * hh]) : 1.0f;
    float rs[2] = {0.0f, 0.0f};
    for (int x0 = 0, i = 1; x0 < KK; x0 += 64, i ^= 1) { /* (the first tile in set 1) */
        cp_async_wait_all();
        bsync(); /* set 0 free (T and dA, or the last tile's products) */
        if (x0 + 64 < KK) issue_k(i ^ 1, x0 + 64);
        if (x0 + 128 < KK) prefetch_dw(x0 + 128);
        if (x0 + 64 < KK) prefetch_tile<64, 64>(a.dkv + ok + x0 + 64, ldk, L, tid);
        const Sp xw = setX(i);
        const uint16_t *yk = setY(i);
        /* dk's pairs of the tile as they are, loaded ahead of the products (one by one before
         * each store they would wait in turn: the stores may alias the next load) */
        float2 dk0[W64::NT][2];
#pragma unroll
        for (int nt = 0; nt < W64::NT; nt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = pm0 + gq + 8 * h, c = pn0 + nt * 8 + 2 * (lane & 3);
                dk0[nt][h] = r < L ? *(const float2 *)(a.dkv + ok + r * ldk + x0 + c) : make_float2(0.0f, 0.0f);
            }
        float d[1][W64::NT][4];
        acc_zero(d);
        mma_p<1, W64::NT, true, true, true, true>(d, sAi, LT, pm0, xw, LT, pn0, 64);
        frag_each(d, pm0, pn0, [&](int j, int c, float &s) {
            const int hh = (j - pm0) >> 3;
            if (CH) { /* e^G per element; dG += k o e^G beta o D */
                const float e = kd::kexp(gch(j, x0 + c)), kv = op2f(yk[j * LT + c]);
                rs[hh] += e * kv * s;
                s *= e * sb[j];
                if (j < L) a.dG[ok + j * ldk + x0 + c] += kv * s;
                return;
            }
            rs[hh] += eg[hh] * op2f(yk[j * LT + c]) * s;
            s *= eg[hh] * sb[j];
        });
        if (!CH) { /* (CHANNEL: k256c_gamma) */
            mma_p<1, W64::NT, false, true, !K256Plain::WyDmkk, false>(d, sdM, LT, pm0, Sp{(uint16_t *)yk, 0}, LT, pn0,
                                                                      64);
            mma_p<1, W64::NT, true, true, !K256Plain::WyDmkk, false>(d, sdM, LT, pm0, Sp{(uint16_t *)yk, 0}, LT, pn0,
                                                                     64);
        }
#pragma unroll
        for (int nt = 0; nt < W64::NT; nt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = pm0 + gq + 8 * h, c = pn0 + nt * 8 + 2 * (lane & 3);
                const float2 y = dk0[nt][h];
                if (r < L)
                    *(float2 *)(a.dkv + ok + r * ldk + x0 + c) =
                        make_float2(y.x + d[0][nt][2 * h], y.y + d[0][nt][2 * h + 1]);
            }
    }
    red_rows_put(red, pm0, rs);
    bsync();
    red_collect<WNW>(red, sT, false); /* (T's first row: free) */
    bsync();
    if (a.dk) /* dk from dy as stored above */
        rows_out<WNT>(a.dkv + ok, ldk, a.k + oq, a.dk + oq, ldq, a.rk ? a.rk + r0 * HV + hv : nullptr, HV, L);
    if (tid < L) {
        const float db = sdb[tid] + sT[tid];
        if (a.dbetaf) a.dbetaf[(r0 + tid) * HV + hv] = db;
        else if (a.dbeta) a.dbeta[(r0 + tid) * HV + hv] = f2op(db);
        if (GATE == DG_GATE_HEAD) sdG[tid] += sb[tid] * sT[tid] + a.dG[(r0 + tid) * HV + hv];
    }
    bsync();
    /* dg = reverse cumsum of dG over the chunk */
    if (GATE == DG_GATE_HEAD && a.dg && tid == 0) {
        float acc = 0.0f;
        for (int i = L - 1; i >= 0; i--) {
            acc += sdG[i];
            a.dg[(r0 + i) * HV + hv] = acc;
        }
    }
}

} // namespace

int k256_dqkwg_wy(const Plan &p, const K256Bwd &a) {
    const Geom &G = p.G;
    const bool head = G.gate == DG_GATE_HEAD;
    const int64_t grid = G.nchunks * G.HV;
    if (G.gate == DG_GATE_CHANNEL) { /* then the (dMkk o Gamma) products and dg in k256c_gamma */
        int rc = DRC_LAUNCH("dr_chunk k256 dqkwg", (k256_dqkwg<DG_GATE_CHANNEL>), grid, BNT, (size_t)DQ_BYTES, G, a);
        if (!rc) rc = DRC_LAUNCH("dr_chunk k256 wy", (k256_wy<DG_GATE_CHANNEL>), grid, WNT, (size_t)WY_BYTES, G, a);
        return rc ? rc : k256_chan_gamma(p, a);
    }
    int rc = head ? DRC_LAUNCH("dr_chunk k256 dqkwg", (k256_dqkwg<DG_GATE_HEAD>), grid, BNT, (size_t)DQ_BYTES, G, a)
                  : DRC_LAUNCH("dr_chunk k256 dqkwg", (k256_dqkwg<DG_GATE_NONE>), grid, BNT, (size_t)DQ_BYTES, G, a);
    if (rc) return rc;
    return head ? DRC_LAUNCH("dr_chunk k256 wy", (k256_wy<DG_GATE_HEAD>), grid, WNT, (size_t)WY_BYTES, G, a)
                : DRC_LAUNCH("dr_chunk k256 wy", (k256_wy<DG_GATE_NONE>), grid, WNT, (size_t)WY_BYTES, G, a);
}

} // namespace DRC_FAST
} // namespace drc
