/* The generic chunked delta-rule kernels, backward: prep and the state pass again (dr_chunk_generic.cuh),
 * then dhu, dqkwg and wy (fused or not) and the sums over value heads; the math and the stages are
 * described in dr_chunk_generic.cuh. */
#include "kernels/cuda/delta/dr_chunk_generic.cuh"

namespace drc {
namespace {

/* ---------------------------------------------------------------- dhu, block per (sequence, hv,
 * V tile), chunks in reverse; dS is the gradient of the state leaving the chunk:
 *   dV' = P^T dO + Kd dS                    Kd = exp(G_last - G) o K
 *   dS <- exp(G_last) dS + scale Qg^T dO - W^T dV'      Qg = exp(G) o Q
 * dSo[c] = dS leaving chunk c.  Smem: dS [K x ld_bv], X [C x ld_k] (Kd, then scale Qg, then W),
 * dVn, dO [C x ld_bv], P [C x ld_c], dec [K]. */
inline size_t dhu_smem(const Geom &G, int BV) {
    return sizeof(float) * (size_t)(G.K * ld_bv(BV) + G.C * ld_k(G) + 2 * G.C * ld_bv(BV) + G.C * ld_c(G) + G.K);
}

template <typename T, int GATE, bool TC>
__global__ void __launch_bounds__(NT)
    k_dhu(Geom G, int BV, const T *q, const T *k, const float *Gc, const float *W, const float *P, const T *dout,
          const float *dhT, float *dVn, float *dSo, float *dh0) {
    DRC_SMEM(float, sm);
    const int C = G.C, K = G.K, V = G.V, HV = G.HV, tid = threadIdx.x;
    const int LC = ld_c(G), LK = ld_k(G), LS = ld_bv(BV);
    const int NVT = (V + BV - 1) / BV;
    const int vt = (int)(blockIdx.x % NVT), hv = (int)(blockIdx.x / NVT % HV);
    const int64_t n = chain_seq(G, blockIdx.x / NVT / HV);
    const int j0 = vt * BV, nbv = V - j0 < BV ? V - j0 : BV;
    float *sS = sm, *sX = sS + K * LS, *sV = sX + C * LK, *sO = sV + C * LS, *sP = sO + C * LS, *sdec = sP + C * LC;
    const int64_t hb = (n * HV + hv) * (int64_t)K * V + j0;
    for (int e = tid; e < K * nbv; e += NT) {
        int r = e / nbv, j = e % nbv;
        sS[r * LS + j] = dhT ? dhT[hb + (int64_t)r * V + j] : 0.0f;
    }
    int64_t c0, c1;
    seq_chunks(G, n, c0, c1);
    bsync();
    for (int64_t c = c1 - 1; c >= c0; c--) {
        const CP<T> p = cp_at<T>(G, c, hv);
        const int L = p.L;
        const int64_t sb = (c * HV + hv) * (int64_t)K * V + j0;
        for (int e = tid; e < K * nbv; e += NT) {
            int r = e / nbv, j = e % nbv;
            dSo[sb + (int64_t)r * V + j] = sS[r * LS + j];
        }
        const float *Gl = GATE != DG_GATE_NONE ? Gc + p.og + (L - 1) * p.ldg : nullptr;
        stage<NT>(sX, LK, k + p.oq, p.ldq, L, K, [&](int i, int r, float kk) {
            return GATE != DG_GATE_NONE ? kk * gam<GATE>(Gl, Gc + p.og + i * p.ldg, r) : kk;
        });
        for (int r = tid; r < K; r += NT) sdec[r] = last_decay<GATE>(Gl, r);
        stage<NT>(sO, LS, dout + p.ov + j0, p.ldv, L, nbv, AsIs{});
        stage<NT>(sP, LC, P + p.oc, p.ldc, L, L, [](int i, int j, float x) { return j <= i ? x : 0.0f; });
        bsync();
        blk_mm2<TC, NT>(L, nbv, Term{Mat{sP, 1, LC}, Mat{sO, LS, 1}, L}, Term{Mat{sX, LK, 1}, Mat{sS, LS, 1}, K},
                        [&](int i, int j, float x) {
                            sV[i * LS + j] = x;
                            dVn[p.ov + i * p.ldv + j0 + j] = x;
                        });
        bsync();
        stage<NT>(sX, LK, q + p.oq, p.ldq, L, K, [&](int i, int r, float x) {
            x *= G.scale;
            return GATE != DG_GATE_NONE ? x * gexp<GATE>(Gc + p.og + i * p.ldg, r) : x;
        });
        bsync();
        blk_mm<TC, NT>(K, nbv, Term{Mat{sX, 1, LK}, Mat{sO, LS, 1}, L},
                       [&](int r, int j, float x) { sS[r * LS + j] = sdec[r] * sS[r * LS + j] + x; });
        bsync();
        stage<NT>(sX, LK, W + p.ok, p.ldk, L, K, AsIs{});
        bsync();
        blk_mm<TC, NT>(K, nbv, Term{Mat{sX, 1, LK}, Mat{sV, LS, 1}, L},
                       [&](int r, int j, float x) { sS[r * LS + j] -= x; });
        bsync();
    }
    if (dh0)
        for (int e = tid; e < K * nbv; e += NT) {
            int r = e / nbv, j = e % nbv;
            dh0[hb + (int64_t)r * V + j] = sS[r * LS + j];
        }
}

/* the state pass of the backward: on 16-bit tensor cores where k256 (bwd_gate says when; dS then
 * in 16-bit words to dS16; the per-channel gate's reads prep's Kd and Qg), else k_dhu (dS in f32 to
 * dSo) */
template <typename T, int GATE, bool TC>
int dhu(const Plan &pl, const Io<T> &io, bool k256, const float *Gc, const float *W, const float *P, float *dVn,
        float *dSo, uint16_t *dS16, const uint16_t *Kd, const uint16_t *Qg) {
    const Geom &G = pl.G;
    if constexpr (TC && sizeof(T) == 2) {
        if (k256) {
            const K256Dhu d{Gc, (const uint16_t *)W, P, io.dhT, dVn, dS16, io.dh0, Kd, Qg};
            return is_bf16<T>::value ? fast::k256_dhu(pl, io_bits(io), d) : fast_h::k256_dhu(pl, io_bits(io), d);
        }
    }
    const int BV = tile_bv(G), NVT = (G.V + BV - 1) / BV;
    return DRC_LAUNCH(TC ? "dr_chunk tf32 dhu" : "dr_chunk dhu", (k_dhu<T, GATE, TC>), G.N * G.HV * NVT, NT,
                      dhu_smem(G, BV), G, BV, io.q, io.k, Gc, W, P, io.dout, io.dhT, dVn, dSo, io.dh0);
}

/* Pointers of the backward stages. */
template <typename T> struct BwdArgs {
    const T *q, *k, *v, *beta, *dout;
    const float *Gc, *P, *Ai, *Mkk, *Vn, *dVn, *Hst, *dSo;
    const uint16_t *Sh; /* the 16-bit kernels' states (Hst: the TF32 kernels') */
    uint16_t *dS16;     /* and their dS (in dSo's f32 scratch) */
    Planes dW16;        /* and dW (hi and lo planes, in dWg's) */
    float *dqv, *dkv;   /* [rows,HV,K] */
    float *dWg, *dGg;   /* unfused: [rows,HV,K], [rows,HV,gs] */
    T *dv, *dbeta;
    float *dbetaf; /* f32 dbeta instead of dbeta (Io::dbeta32), or NULL */
    float *dg;
    int final_dg;
};

/* the tiles of dqkwg: KT columns of K (its outputs), VT columns of V (the sums over V) at a time */
__host__ __device__ __forceinline__ int dq_kt(const Geom &G) { return G.K < 64 ? G.K : 64; }
__host__ __device__ __forceinline__ int dq_vt(const Geom &G) { return G.V < 64 ? G.V : 64; }
/* the per-channel gate's references R [K] of the wide form (chan_wide), in dqkwg's and wy's shared memory */
__host__ __device__ inline int64_t chan_ref_floats(const Geom &G) { return G.gate == DG_GATE_CHANNEL ? G.K : 0; }
/* shared-memory floats of dqkwg_body: dP [C x ld_c]; f2, dkd, dw, Q, K [C x (KT + 4)]; dO, V', dV'
 * [C x (VT + 8)]; S0, dS1 [KT x (VT + 8)]; row sums [C], column sums [KT], reduction [2 NW]; R */
__host__ __device__ inline int64_t dqkwg_smem(const Geom &G) {
    const int64_t C = G.C, LT = dq_kt(G) + 4, LV = dq_vt(G) + 8;
    return C * ld_c(G) + 5 * C * LT + 3 * C * LV + 2 * dq_kt(G) * LV + C + dq_kt(G) + 2 * NW + chan_ref_floats(G);
}

/* ---------------------------------------------------------------- dqkwg for one chunk (block).
 * Writes dq, dk (value head) to dqv, dkv; dW (ld ldw) and dG (ld ldG; the gradient of the
 * cumulative gate, last-row terms included).
 *   (f2) dq = exp(G) o (scale dO S0^T) + scale (dP o Gamma) K,  dP = lower_incl(dO V'^T)
 *   (f6) dk = scale (dP o Gamma)^T Q
 *   (f3) dk += exp(G_last - G) o (V' dS1^T)
 *   (f1) dW = -dV' S0^T
 * dP first (summed over tiles of V), then the outputs by tiles of KT columns, each summing its
 * products with S0 and dS1 over tiles of V.  Row and column sums go in a fixed order (no atomics):
 * the results are the same bits from run to run. */
template <typename T, int GATE, bool TC>
__device__ void dqkwg_body(const Geom &G, const BwdArgs<T> &a, int64_t c, int hv, float *dW, int64_t ldw, float *dG,
                           int64_t ldG, float *sm) {
    const int C = G.C, K = G.K, V = G.V, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const CP<T> p = cp_at<T>(G, c, hv);
    const int L = p.L, KT = dq_kt(G), VT = dq_vt(G), LC = ld_c(G), LT = KT + 4, LV = VT + 8;
    const float scale = G.scale;
    float *sDP = sm, *sF2 = sDP + C * LC, *sDKD = sF2 + C * LT, *sDW = sDKD + C * LT, *sQt = sDW + C * LT;
    float *sKt = sQt + C * LT, *sO = sKt + C * LT, *sVn = sO + C * LV, *sdVn = sVn + C * LV, *sS0 = sdVn + C * LV;
    float *sdS1 = sS0 + KT * LV, *sRow = sdS1 + KT * LV, *sCol = sRow + C, *sred = sCol + KT, *sRef = sred + 2 * NW;
    const float *S0 = a.Hst + (c * G.HV + hv) * (int64_t)K * V, *dS1 = a.dSo + (c * G.HV + hv) * (int64_t)K * V;
    const T *qc = a.q + p.oq, *kc = a.k + p.oq, *dO = a.dout + p.ov;
    const float *Vn = a.Vn + p.ov, *dVn = a.dVn + p.ov;
    const float *Gcc = GATE != DG_GATE_NONE ? a.Gc + p.og : nullptr;
    const float *Gl = GATE != DG_GATE_NONE ? Gcc + (L - 1) * p.ldg : nullptr;
    const bool head_partial = GATE == DG_GATE_HEAD && !a.final_dg;
    /* the TF32 family's wide form of the gated dq, dk products (R in sRef) */
    [[maybe_unused]] bool wide = false;
    if constexpr (TC && GATE == DG_GATE_CHANNEL) wide = chan_wide(Gcc, p.ldg, L, K, sRef);
    /* dP_il = sum_j dO_ij V'_lj */
    for (int v0 = 0; v0 < V; v0 += VT) {
        const int nv = V - v0 < VT ? V - v0 : VT;
        stage<NT>(sO, LV, dO + v0, p.ldv, L, nv, AsIs{});
        stage<NT>(sVn, LV, Vn + v0, p.ldv, L, nv, AsIs{});
        bsync();
        blk_mm<TC, NT>(L, L, Term{Mat{sO, LV, 1}, Mat{sVn, 1, LV}, nv},
                       [&](int i, int l, float x) { sDP[i * LC + l] = (v0 ? sDP[i * LC + l] : 0.0f) + x; });
        bsync();
    }
    /* HEAD, partial terms: rowcol(dP, P) = sum_l dP_il P_il - sum_m dP_mi P_mi starts the row sums */
    for (int i = warp; i < L; i += NW) {
        float rc = 0.0f;
        if (head_partial) {
            for (int l = lane; l <= i; l += 32) rc += sDP[i * LC + l] * a.P[p.oc + i * p.ldc + l];
            for (int m = i + lane; m < L; m += 32) rc -= sDP[m * LC + i] * a.P[p.oc + m * p.ldc + i];
            rc = warp_sum(rc);
        }
        if (lane == 0) sRow[i] = rc;
    }
    bsync();
    /* dP masked to l <= i; gate none or head: scale dP o Gamma, the operand of both products */
    for (int e = tid; e < L * L; e += NT) {
        const int i = e / L, l = e % L;
        float x = l <= i ? sDP[i * LC + l] : 0.0f;
        if (GATE != DG_GATE_CHANNEL) x *= scale;
        if (GATE == DG_GATE_HEAD) x *= expf(Gcc[i * p.ldg] - Gcc[l * p.ldg]);
        sDP[i * LC + l] = x;
    }
    float hk = 0.0f, hs = 0.0f; /* HEAD: this thread's sums of k o f3 and of S0 o dS1 */
    for (int cc0 = 0; cc0 < K; cc0 += KT) {
        const int nk = K - cc0 < KT ? K - cc0 : KT;
        stage<NT>(sQt, LT, qc + cc0, p.ldq, L, nk, AsIs{});
        stage<NT>(sKt, LT, kc + cc0, p.ldq, L, nk, AsIs{});
        for (int v0 = 0; v0 < V; v0 += VT) {
            const int nv = V - v0 < VT ? V - v0 : VT;
            stage<NT>(sO, LV, dO + v0, p.ldv, L, nv, AsIs{});
            stage<NT>(sVn, LV, Vn + v0, p.ldv, L, nv, AsIs{});
            stage<NT>(sdVn, LV, dVn + v0, p.ldv, L, nv, AsIs{});
            stage<NT>(sS0, LV, S0 + (int64_t)cc0 * V + v0, V, nk, nv, AsIs{});
            stage<NT>(sdS1, LV, dS1 + (int64_t)cc0 * V + v0, V, nk, nv, AsIs{});
            bsync();
            if (GATE == DG_GATE_HEAD) /* this thread's share of sum S0 o dS1, in a fixed order */
                for (int e = tid; e < nk * nv; e += NT)
                    hs += sS0[(e / nv) * LV + e % nv] * sdS1[(e / nv) * LV + e % nv];
            if (GATE == DG_GATE_CHANNEL) /* the last row's sum_j S0 o dS1 of each column cc */
                for (int cc = tid; cc < nk; cc += NT) {
                    float t = v0 ? sCol[cc] : 0.0f;
                    for (int j = 0; j < nv; j++) t += sS0[cc * LV + j] * sdS1[cc * LV + j];
                    sCol[cc] = t;
                }
            const bool first = v0 == 0;
            const Mat S0t{sS0, 1, LV}, dS1t{sdS1, 1, LV};
            blk_mm<TC, NT>(L, nk, Term{Mat{sO, LV, 1}, S0t, nv},
                           [&](int i, int cc, float x) { sF2[i * LT + cc] = (first ? 0.0f : sF2[i * LT + cc]) + x; });
            blk_mm<TC, NT>(L, nk, Term{Mat{sVn, LV, 1}, dS1t, nv},
                           [&](int i, int cc, float x) { sDKD[i * LT + cc] = (first ? 0.0f : sDKD[i * LT + cc]) + x; });
            blk_mm<TC, NT>(L, nk, Term{Mat{sdVn, LV, 1}, S0t, nv},
                           [&](int i, int cc, float x) { sDW[i * LT + cc] = (first ? 0.0f : sDW[i * LT + cc]) + x; });
            bsync();
        }
        /* dq = scale e^G o f2 + rp; F2 then holds q o (dq, or its f2 term for HEAD's partial terms) */
        const auto fin_q = [&](int i, int cc, float rp) {
            float dqf2 = scale * sF2[i * LT + cc];
            if (GATE != DG_GATE_NONE) dqf2 *= gexp<GATE>(Gcc + i * p.ldg, cc0 + cc);
            const float dq = dqf2 + rp;
            a.dqv[p.ok + i * p.ldk + cc0 + cc] = dq;
            sF2[i * LT + cc] = sQt[i * LT + cc] * (head_partial ? dqf2 : dq);
        };
        /* dk = dkp + f3, f3 = e^{G_last - G} o dkd; dW = -dw; the gate's terms: DKD then holds k o f3 */
        const auto fin_k = [&](int i, int cc, float dkp) {
            float f3 = sDKD[i * LT + cc];
            if (GATE != DG_GATE_NONE) f3 *= gam<GATE>(Gl, Gcc + i * p.ldg, cc0 + cc);
            const float dk = dkp + f3, kv = sKt[i * LT + cc];
            a.dkv[p.ok + i * p.ldk + cc0 + cc] = dk;
            dW[i * ldw + cc0 + cc] = -sDW[i * LT + cc];
            const float contrib = sF2[i * LT + cc] - kv * (head_partial ? f3 : dk);
            if (GATE == DG_GATE_CHANNEL) dG[i * ldG + cc0 + cc] = contrib;
            sF2[i * LT + cc] = contrib;
            sDKD[i * LT + cc] = kv * f3;
        };
        if constexpr (GATE != DG_GATE_CHANNEL) {
            blk_mm<TC, NT>(L, nk, Term{Mat{sDP, LC, 1}, Mat{sKt, LT, 1}, L}, fin_q);
            bsync();
            blk_mm<TC, NT>(L, nk, Term{Mat{sDP, 1, LC}, Mat{sQt, LT, 1}, L}, fin_k);
        } else if (wide) { /* e_ic = e^{G_ic - R_c}:  rp = e o (dP (K / e)),  dkp = (dP^T (Q o e)) / e */
            const auto ge = [&](int i, int cc) { return Gcc[i * p.ldg + cc0 + cc] - sRef[cc0 + cc]; };
            for (int e = tid; e < L * nk; e += NT) sKt[(e / nk) * LT + e % nk] *= expf(-ge(e / nk, e % nk));
            bsync();
            blk_mm_x3<TC, NT>(L, nk, Term{Mat{sDP, LC, 1}, Mat{sKt, LT, 1}, L},
                              [&](int i, int cc, float x) { fin_q(i, cc, scale * expf(ge(i, cc)) * x); });
            bsync();
            stage<NT>(sKt, LT, kc + cc0, p.ldq, L, nk, AsIs{}); /* k again: fin_k reads it */
            for (int e = tid; e < L * nk; e += NT) sQt[(e / nk) * LT + e % nk] *= expf(ge(e / nk, e % nk));
            bsync();
            blk_mm_x3<TC, NT>(L, nk, Term{Mat{sDP, 1, LC}, Mat{sQt, LT, 1}, L},
                              [&](int i, int cc, float x) { fin_k(i, cc, scale * expf(-ge(i, cc)) * x); });
        } else { /* the gate inside the sums over l: f32 FMAs */
            for (int e = tid; e < L * nk; e += NT) {
                const int i = e / nk, cc = e % nk;
                const float *Gi = Gcc + i * p.ldg;
                float rp = 0.0f;
                for (int l = 0; l <= i; l++)
                    rp += sDP[i * LC + l] * sKt[l * LT + cc] * gam<GATE>(Gi, Gcc + l * p.ldg, cc0 + cc);
                fin_q(i, cc, scale * rp);
            }
            bsync();
            for (int e = tid; e < L * nk; e += NT) {
                const int i = e / nk, cc = e % nk;
                const float *Gi = Gcc + i * p.ldg;
                float dkp = 0.0f;
                for (int m = i; m < L; m++)
                    dkp += sDP[m * LC + i] * sQt[m * LT + cc] * gam<GATE>(Gcc + m * p.ldg, Gi, cc0 + cc);
                fin_k(i, cc, scale * dkp);
            }
        }
        bsync();
        if (GATE == DG_GATE_HEAD) {
            for (int i = tid; i < L; i += NT) {
                float s = sRow[i];
                for (int cc = 0; cc < nk; cc++) s += sF2[i * LT + cc], hk += sDKD[i * LT + cc];
                sRow[i] = s;
            }
        } else if (GATE == DG_GATE_CHANNEL) { /* last row: sum_i k o f3 + exp(G_last) o sum_j S0 o dS1 */
            for (int cc = tid; cc < nk; cc += NT) {
                float s = 0.0f;
                for (int i = 0; i < L; i++) s += sDKD[i * LT + cc];
                dG[(L - 1) * ldG + cc0 + cc] += s + expf(Gl[cc0 + cc]) * sCol[cc];
            }
        }
        bsync();
    }
    if (GATE == DG_GATE_HEAD) { /* dG rows; the last row: sum_i k o f3 + exp(G_last) sum S0 o dS1 */
        hk = warp_sum(hk), hs = warp_sum(hs);
        if (lane == 0) sred[warp] = hk, sred[NW + warp] = hs;
        bsync();
        for (int i = tid; i < L; i += NT) {
            float x = sRow[i];
            if (i == L - 1) {
                float sk = 0.0f, st = 0.0f;
                for (int w = 0; w < NW; w++) sk += sred[w], st += sred[NW + w];
                x += sk + expf(Gl[0]) * st;
            }
            dG[i * ldG] = x;
        }
    }
    bsync();
}

/* the tiles of wy: XT columns of K or V at a time */
__host__ __device__ __forceinline__ int wy_xt(const Geom &G) {
    const int m = G.K > G.V ? G.K : G.V;
    return m < 64 ? m : 64;
}
/* shared-memory floats of wy_body: Ai, dAi, T, dA [C x ld_c]; X, Y, R [C x (XT + 8)]; db [C]; the
 * channel references */
__host__ __device__ inline int64_t wy_smem(const Geom &G) {
    return 4 * (int64_t)G.C * ld_c(G) + 3 * (int64_t)G.C * (wy_xt(G) + 8) + G.C + chan_ref_floats(G);
}

/* ---------------------------------------------------------------- WY backward for one chunk
 * (block), from dW (ld ldw) and dU = dV':
 *   dAi = lower_incl(dW Kbg^T + dU Vb^T)        Kbg = diag(beta) exp(G) o K, Vb = diag(beta) V
 *   dKbg = Ai^T dW,  dVb = Ai^T dU:  dv = beta o dVb;  dbeta = rowsum(V o dVb) + rowsum(Kg o dKbg)
 *   dk += exp(G) o (beta o dKbg);  dG += Kg o (beta o dKbg)                Kg = exp(G) o K
 *   dA = strictly_lower(-Ai^T dAi Ai^T);  dbeta += rowsum(dA o Mkk);  dMkk = diag(beta) dA
 *   Mkk = K K^T o Gamma:  dk += (dMkk o Gamma) K + (dMkk o Gamma)^T K, and its dG
 *   dg = reverse chunk-local cumsum of dG.
 * The sums over K and V go by tiles of XT columns (X, Y), the row sums through R in order. */
template <typename T, int GATE, bool TC>
__device__ void wy_body(const Geom &G, const BwdArgs<T> &a, int64_t c, int hv, const float *dW, int64_t ldw, float *dG,
                        int64_t ldG, float *sm) {
    const int C = G.C, K = G.K, V = G.V, HV = G.HV, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const CP<T> p = cp_at<T>(G, c, hv);
    const int L = p.L, LC = ld_c(G), XT = wy_xt(G), LX = XT + 8;
    float *sAi = sm, *sdAi = sAi + C * LC, *sT = sdAi + C * LC, *sdA = sT + C * LC, *sX = sdA + C * LC;
    float *sY = sX + C * LX, *sR = sY + C * LX, *sdb = sR + C * LX, *sRef = sdb + C;
    const T *kc = a.k + p.oq, *vc = a.v + p.ov;
    const float *dU = a.dVn + p.ov;
    const float *Gcc = GATE != DG_GATE_NONE ? a.Gc + p.og : nullptr;
    stage<NT>(sAi, LC, a.Ai + p.oc, p.ldc, L, L, [](int i, int j, float x) { return j <= i ? x : 0.0f; });
    for (int i = tid; i < L; i += NT) sdb[i] = 0.0f;
    const Mat AiT{sAi, 1, LC};
    /* over tiles of K (X = dW, Y = Kg), then of V (X = dU, Y = V): dAi's sums, dKbg and dVb */
    const int nkt = (K + XT - 1) / XT, nvt = (V + XT - 1) / XT;
    for (int t = 0; t < nkt + nvt; t++) {
        const bool kt = t < nkt;
        const int x0 = (kt ? t : t - nkt) * XT, W_ = kt ? K : V, nx = W_ - x0 < XT ? W_ - x0 : XT;
        if (kt) {
            stage<NT>(sX, LX, dW + x0, ldw, L, nx, AsIs{});
            stage<NT>(sY, LX, kc + x0, p.ldq, L, nx, [&](int i, int x, float kg) {
                return GATE != DG_GATE_NONE ? kg * gexp<GATE>(Gcc + i * p.ldg, x0 + x) : kg;
            });
        } else {
            stage<NT>(sX, LX, dU + x0, p.ldv, L, nx, AsIs{});
            stage<NT>(sY, LX, vc + x0, p.ldv, L, nx, AsIs{});
        }
        bsync();
        blk_mm<TC, NT>(L, L, Term{Mat{sX, LX, 1}, Mat{sY, 1, LX}, nx},
                       [&](int i, int j, float x) { sdAi[i * LC + j] = (t ? sdAi[i * LC + j] : 0.0f) + x; });
        /* row j of dKbg (dVb): R = Kg o dKbg (V o dVb) for dbeta; dk, dG (dv) element by element */
        blk_mm<TC, NT>(L, nx, Term{AiT, Mat{sX, LX, 1}, L}, [&](int j, int x, float s) {
            const float bj = ldx(a.beta + p.ob + j * (int64_t)HV), y = sY[j * LX + x];
            sR[j * LX + x] = y * s;
            if (kt) {
                const float e = GATE != DG_GATE_NONE ? gexp<GATE>(Gcc + j * p.ldg, x0 + x) : 1.0f;
                a.dkv[p.ok + j * p.ldk + x0 + x] += e * (bj * s);
                if (GATE == DG_GATE_CHANNEL) dG[j * ldG + x0 + x] += y * (bj * s);
            } else if (a.dv) {
                stx(a.dv + p.ov + j * p.ldv + x0 + x, bj * s);
            }
        });
        bsync();
        for (int j = tid; j < L; j += NT) {
            float s = 0.0f;
            for (int x = 0; x < nx; x++) s += sR[j * LX + x];
            sdb[j] += s;
            if (kt && GATE == DG_GATE_HEAD) dG[j * ldG] += ldx(a.beta + p.ob + j * (int64_t)HV) * s;
        }
        bsync();
    }
    /* dAi = lower_incl(...) diag(beta) */
    for (int e = tid; e < L * L; e += NT) {
        const int i = e / L, j = e % L;
        sdAi[i * LC + j] = j <= i ? sdAi[i * LC + j] * ldx(a.beta + p.ob + j * (int64_t)HV) : 0.0f;
    }
    bsync();
    /* T = Ai^T dAi;  dA = strictly_lower(-T Ai^T) */
    blk_mm<TC, NT>(L, L, Term{AiT, Mat{sdAi, LC, 1}, L}, [&](int i, int j, float x) { sT[i * LC + j] = x; });
    bsync();
    blk_mm<TC, NT>(L, L, Term{Mat{sT, LC, 1}, AiT, L},
                   [&](int i, int j, float x) { sdA[i * LC + j] = j < i ? -x : 0.0f; });
    bsync();
    /* dbeta_i += sum_{j<i} dA_ij Mkk_ij;  dMkk = diag(beta) dA */
    for (int i = warp; i < L; i += NW) {
        const float bi = ldx(a.beta + p.ob + i * (int64_t)HV);
        float s = 0.0f;
        for (int j = lane; j < i; j += 32) {
            s += sdA[i * LC + j] * a.Mkk[p.oc + i * p.ldc + j];
            sdA[i * LC + j] *= bi;
        }
        s = warp_sum(s);
        if (lane == 0) sdb[i] += s;
    }
    bsync();
    /* HEAD: dG_i += sum_j dMkk_ij Mkk_ij - sum_m dMkk_mi Mkk_mi */
    if (GATE == DG_GATE_HEAD)
        for (int i = warp; i < L; i += NW) {
            float s = 0.0f;
            for (int j = lane; j < i; j += 32) s += sdA[i * LC + j] * a.Mkk[p.oc + i * p.ldc + j];
            for (int m = i + 1 + lane; m < L; m += 32) s -= sdA[m * LC + i] * a.Mkk[p.oc + m * p.ldc + i];
            s = warp_sum(s);
            if (lane == 0) dG[i * ldG] += s;
        }
    bsync();
    /* dk += (dMkk o Gamma) K + (dMkk o Gamma)^T K, by tiles of K columns */
    if constexpr (GATE != DG_GATE_CHANNEL) {
        if (GATE == DG_GATE_HEAD)
            for (int e = tid; e < L * L; e += NT) {
                const int i = e / L, j = e % L;
                if (j < i) sdA[i * LC + j] *= expf(Gcc[i * p.ldg] - Gcc[j * p.ldg]);
            }
        for (int x0 = 0; x0 < K; x0 += XT) {
            const int nx = K - x0 < XT ? K - x0 : XT;
            stage<NT>(sY, LX, kc + x0, p.ldq, L, nx, AsIs{});
            bsync();
            blk_mm2<TC, NT>(L, nx, Term{Mat{sdA, LC, 1}, Mat{sY, LX, 1}, L}, Term{Mat{sdA, 1, LC}, Mat{sY, LX, 1}, L},
                            [&](int i, int x, float s) { a.dkv[p.ok + i * p.ldk + x0 + x] += s; });
            bsync();
        }
    } else if (TC && chan_wide(Gcc, p.ldg, L, K, sRef)) {
        /* e_jc = e^{G_jc - R_c}:  rp = e o (dMkk (K / e)),  cp = (dMkk^T (K o e)) / e, by tiles of K
         * columns (X = K / e, Y = K o e; rp through R);  dk += rp + cp, dG += k o (rp - cp) */
        for (int x0 = 0; x0 < K; x0 += XT) {
            const int nx = K - x0 < XT ? K - x0 : XT;
            const auto ge = [&](int i, int x) { return Gcc[i * p.ldg + x0 + x] - sRef[x0 + x]; };
            stage<NT>(sX, LX, kc + x0, p.ldq, L, nx, [&](int i, int x, float kv) { return kv * expf(-ge(i, x)); });
            stage<NT>(sY, LX, kc + x0, p.ldq, L, nx, [&](int i, int x, float kv) { return kv * expf(ge(i, x)); });
            bsync();
            blk_mm_x3<TC, NT>(L, nx, Term{Mat{sdA, LC, 1}, Mat{sX, LX, 1}, L},
                              [&](int i, int x, float s) { sR[i * LX + x] = s; });
            bsync();
            blk_mm_x3<TC, NT>(L, nx, Term{Mat{sdA, 1, LC}, Mat{sY, LX, 1}, L}, [&](int i, int x, float s) {
                const float d = ge(i, x), rp = expf(d) * sR[i * LX + x], cp = expf(-d) * s;
                a.dkv[p.ok + i * p.ldk + x0 + x] += rp + cp;
                dG[i * ldG + x0 + x] += ldx(kc + i * p.ldq + x0 + x) * (rp - cp);
            });
            bsync();
        }
    } else { /* the gate inside the sums: f32 FMAs, and dG from both sides */
        for (int i = warp; i < L; i += NW) {
            const float *Gi = Gcc + i * p.ldg;
            for (int cc = lane; cc < K; cc += 32) {
                float rp = 0.0f, cp = 0.0f;
                for (int j = 0; j < i; j++)
                    rp += sdA[i * LC + j] * ldx(kc + j * p.ldq + cc) * gam<GATE>(Gi, Gcc + j * p.ldg, cc);
                for (int m = i + 1; m < L; m++)
                    cp += sdA[m * LC + i] * ldx(kc + m * p.ldq + cc) * gam<GATE>(Gcc + m * p.ldg, Gi, cc);
                a.dkv[p.ok + i * p.ldk + cc] += rp + cp;
                dG[i * ldG + cc] += ldx(kc + i * p.ldq + cc) * (rp - cp);
            }
        }
        bsync();
    }
    for (int i = tid; i < L; i += NT) {
        if (a.dbetaf) a.dbetaf[p.ob + i * (int64_t)HV] = sdb[i];
        else if (a.dbeta) stx(a.dbeta + p.ob + i * (int64_t)HV, sdb[i]);
    }
    bsync();
    /* dg = reverse cumsum of dG over the chunk */
    if (GATE != DG_GATE_NONE && a.dg)
        for (int cc = tid; cc < G.gs; cc += NT) {
            float acc = 0.0f;
            for (int i = L - 1; i >= 0; i--) {
                acc += dG[i * ldG + cc];
                a.dg[p.og + i * p.ldg + cc] = acc;
            }
        }
}

/* fused: dW [C*K] and dG [C*gs] in shared memory, then the two bodies */
inline int64_t fused_smem(const Geom &G) {
    const int64_t body = dqkwg_smem(G) > wy_smem(G) ? dqkwg_smem(G) : wy_smem(G);
    return (int64_t)G.C * G.K + (int64_t)G.C * G.gs + body;
}
template <typename T, int GATE, bool TC> __global__ void __launch_bounds__(NT) k_bwd_fused(Geom G, BwdArgs<T> a) {
    DRC_SMEM(float, sm);
    const int64_t c = blockIdx.x / G.HV;
    const int hv = (int)(blockIdx.x % G.HV);
    float *sdW = sm, *sdG = sdW + G.C * G.K, *rest = sdG + G.C * G.gs;
    dqkwg_body<T, GATE, TC>(G, a, c, hv, sdW, G.K, sdG, G.gs, rest);
    wy_body<T, GATE, TC>(G, a, c, hv, sdW, G.K, sdG, G.gs, rest);
}

template <typename T, int GATE, bool TC> __global__ void __launch_bounds__(NT) k_bwd_dqkwg(Geom G, BwdArgs<T> a) {
    DRC_SMEM(float, sm);
    const int64_t c = blockIdx.x / G.HV;
    const int hv = (int)(blockIdx.x % G.HV);
    const Chunk ch = chunk_at(G, c);
    const int64_t off = ch.r0 * G.HV + hv;
    dqkwg_body<T, GATE, TC>(G, a, c, hv, a.dWg + off * G.K, (int64_t)G.HV * G.K, G.gs ? a.dGg + off * G.gs : nullptr,
                            (int64_t)G.HV * G.gs, sm);
}

template <typename T, int GATE, bool TC> __global__ void __launch_bounds__(NT) k_bwd_wy(Geom G, BwdArgs<T> a) {
    DRC_SMEM(float, sm);
    const int64_t c = blockIdx.x / G.HV;
    const int hv = (int)(blockIdx.x % G.HV);
    const Chunk ch = chunk_at(G, c);
    const int64_t off = ch.r0 * G.HV + hv;
    wy_body<T, GATE, TC>(G, a, c, hv, a.dWg + off * G.K, (int64_t)G.HV * G.K, G.gs ? a.dGg + off * G.gs : nullptr,
                         (int64_t)G.HV * G.gs, sm);
}

/* ---------------------------------------------------------------- host side */

/* dqkwg and wy on 16-bit tensor cores (dr_chunk_k256_bwd.cu; with the per-channel gate then
 * dr_chunk_k256_chan_bwd.cu's gamma, on dMkk, scratch here), where k256_ok takes the call */
template <typename T> int k256_bwd(const Plan &pl, const BwdArgs<T> &a, const Io<T> &io) {
    const auto u = [](const T *x) { return (const uint16_t *)x; };
    K256Bwd b{u(a.q), u(a.k), u(a.v), u(a.beta), u(a.dout), (const uint16_t *)a.Vn, a.Sh, a.dS16,
              a.Gc,   a.P,    a.Ai,   a.Mkk,     a.dVn};
    b.dqv = a.dqv, b.dkv = a.dkv, b.dG = a.dGg, b.dv = (uint16_t *)a.dv, b.dbeta = (uint16_t *)a.dbeta;
    b.dWh = a.dW16.hi, b.dWl = a.dW16.lo;
    b.dbetaf = a.dbetaf, b.dg = a.dg, b.final_dg = a.final_dg;
    const bool ch = pl.G.gate == DG_GATE_CHANNEL; /* (heads_sum makes its dq, dk after gamma) */
    b.dq = !ch && k256_direct(pl.G, io.dq) ? (uint16_t *)io.dq : nullptr, b.rq = b.dq ? io.rq : nullptr;
    b.dk = !ch && k256_direct(pl.G, io.dk) ? (uint16_t *)io.dk : nullptr, b.rk = b.dk ? io.rk : nullptr;
    b.dMkk = ch ? scratch<float>((size_t)(pl.G.rows * pl.G.HV * 64)) : nullptr;
    const int rc = !ch || b.dMkk ? is_bf16<T>::value ? fast::k256_dqkwg_wy(pl, b) : fast_h::k256_dqkwg_wy(pl, b) : -1;
    release(b.dMkk);
    return rc;
}

template <typename T, int GATE, bool TC>
int bwd_gate(const Plan &pl, const dg_dr_variant &var, const Io<T> &io, const void *kept) {
    const Geom &G = pl.G;
    const int64_t rows = G.rows, HV = G.HV, nst = G.nchunks * HV * G.K * G.V;
    /* dw_on_chip where dW and dG fit in shared memory beside the bodies' tiles (at chunk 64: K <= 128
     * with a head gate, K <= 64 with the per-channel one, whose dG is C x K): else the pair of
     * kernels, the same arithmetic.  (dqkwg's tiles of 64 columns of V against 32, which would let
     * dW stay on chip at K = 256: H100, S3, the pair 25.0 ms against the fused kernel's 29.1) */
    /* K = 256, q, k, v and dO 16-byte aligned, dv 4-byte aligned (wy stores it in pairs): prep, the
     * state pass, dhu, dqkwg and wy on 16-bit tensor cores (dr_chunk_k256.cu, dr_chunk_k256_chan.cu,
     * dr_chunk_k256_bwd.cu, dr_chunk_k256_chan_bwd.cu), on their working set (K256Bufs): the
     * forward's where it kept it, else recomputed into scratch.  dq and dk stored by the 16-bit
     * kernels themselves (k256_direct), but with the per-channel gate (heads_sum after them) */
    const bool k256 = k256_takes<T, GATE, TC>(G, io) && ((uintptr_t)io.dout & 15) == 0 && ((uintptr_t)io.dv & 3) == 0;
    const bool ch = GATE == DG_GATE_CHANNEL;
    const bool direct_q = k256 && !ch && k256_direct(G, io.dq), direct_k = k256 && !ch && k256_direct(G, io.dk);
    const bool fused = !k256 && var.dw_on_chip != 0 && sizeof(float) * fused_smem(G) <= (size_t)SMEM_MAX;
    const bool reuse = k256 && kept && var.solve_tril_blocked; /* (the kept inverse is the blocked one) */
    K256Bufs kb{};
    char *own = nullptr;
    float *Gc = nullptr, *W = nullptr, *U = nullptr, *P = nullptr, *Ai = nullptr, *Mkk = nullptr, *Hst = nullptr;
    float *dSo, *dVn, *dqv, *dkv, *dWg = nullptr, *dGg = nullptr;
    int rc = -1;
    bool ok;
    if (k256) {
        own = carve_into(
            reuse ? const_cast<void *>(kept) : nullptr, [&](Carve &cv) { k256_carve(G, cv, kb, true); }, &ok);
        Gc = kb.Gc, W = (float *)kb.W, U = (float *)kb.Vn, P = kb.P, Ai = kb.Ai, Mkk = kb.Mkk;
    } else {
        W = scratch<float>((size_t)(rows * HV * G.K));
        U = scratch<float>((size_t)(rows * HV * G.V));
        P = scratch<float>((size_t)(rows * HV * G.C));
        Ai = scratch<float>((size_t)(rows * HV * G.C));
        Mkk = scratch<float>((size_t)(rows * HV * G.C));
        Hst = scratch<float>((size_t)nst);
        if (G.gs) Gc = scratch<float>((size_t)(rows * HV * G.gs));
        ok = W && U && P && Ai && Mkk && Hst && (!G.gs || Gc);
    }
    dSo = scratch<float>((size_t)nst);
    dVn = scratch<float>((size_t)(rows * HV * G.V));
    dqv = scratch<float>((size_t)(rows * HV * G.K));
    dkv = scratch<float>((size_t)(rows * HV * G.K));
    if (!fused) {
        dWg = scratch<float>((size_t)(rows * HV * G.K));
        if (G.gs) dGg = scratch<float>((size_t)(rows * HV * G.gs));
    }
    ok = ok && dSo && dVn && dqv && dkv && (fused || (dWg && (!G.gs || dGg)));
    if (ok) {
        BwdArgs<T> a;
        a.q = io.q, a.k = io.k, a.v = io.v, a.beta = io.beta, a.dout = io.dout;
        a.Gc = Gc, a.P = P, a.Ai = Ai, a.Mkk = Mkk, a.Vn = U, a.dVn = dVn, a.Hst = Hst, a.dSo = dSo;
        a.Sh = kb.Sh;
        a.dS16 = k256 ? (uint16_t *)dSo : nullptr, a.dW16 = k256 ? planes_in(dWg, rows * HV * G.K) : Planes{};
        a.dqv = dqv, a.dkv = dkv, a.dWg = dWg, a.dGg = dGg;
        a.dv = io.dv, a.dbeta = io.dbeta, a.dbetaf = io.dbeta32, a.dg = io.dg;
        a.final_dg = var.gdn_dg_from_final;
        rc = 0;
        if (!reuse) {
            const Words Uw{U, k256}, Hw = k256 ? Words{(float *)kb.Sh, true} : Words{Hst, false};
            rc = prep_state<T, GATE, TC>(pl, io, k256, Gc, W, Uw, P, Ai, Mkk, Hw, nullptr, var.solve_tril_blocked,
                                         kb.Kd, kb.Qg);
        }
        if (!rc) rc = dhu<T, GATE, TC>(pl, io, k256, Gc, W, P, dVn, dSo, a.dS16, kb.Kd, kb.Qg);
        if (!rc && fused)
            rc = DRC_LAUNCH(TC ? "dr_chunk tf32 bwd fused" : "dr_chunk bwd fused", (k_bwd_fused<T, GATE, TC>),
                            G.nchunks * HV, NT, sizeof(float) * (size_t)fused_smem(G), G, a);
        if constexpr (TC && sizeof(T) == 2)
            if (!rc && k256) rc = k256_bwd<T>(pl, a, io);
        if (!rc && !fused && !k256) {
            size_t sd = sizeof(float) * (size_t)dqkwg_smem(G), sw = sizeof(float) * (size_t)wy_smem(G);
            rc = DRC_LAUNCH(TC ? "dr_chunk tf32 dqkwg" : "dr_chunk dqkwg", (k_bwd_dqkwg<T, GATE, TC>), G.nchunks * HV,
                            NT, sd, G, a);
            if (!rc)
                rc = DRC_LAUNCH(TC ? "dr_chunk tf32 wy" : "dr_chunk wy", (k_bwd_wy<T, GATE, TC>), G.nchunks * HV, NT,
                                sw, G, a);
        }
        /* summed over value heads, the L2 norm's backward with it (16-bit storage, io.rq / io.rk),
         * unless the K = 256 kernels stored them */
        const int fmt = sizeof(T) == 4 ? VS_F32 : is_bf16<T>::value ? VS_BF16 : VS_F16;
        if (!rc && io.dq && !direct_q)
            rc = heads_sum("dr_chunk gva", rows, G.H, G.grp, G.K, dqv, io.q, io.rq, fmt, io.dq);
        if (!rc && io.dk && !direct_k)
            rc = heads_sum("dr_chunk gva", rows, G.H, G.grp, G.K, dkv, io.k, io.rk, fmt, io.dk);
    }
    if (k256) release(own);
    else release(Gc), release(W), release(U), release(P), release(Ai), release(Mkk), release(Hst);
    release(dSo), release(dVn), release(dqv), release(dkv), release(dWg), release(dGg);
    return rc;
}

} // namespace

template <typename T, bool TC>
int generic_bwd(const Plan &p, const dg_dr_variant &var, const Io<T> &io, const void *kept) {
    switch (p.G.gate) {
    case DG_GATE_NONE: return bwd_gate<T, DG_GATE_NONE, TC>(p, var, io, kept);
    case DG_GATE_HEAD: return bwd_gate<T, DG_GATE_HEAD, TC>(p, var, io, kept);
    default: return bwd_gate<T, DG_GATE_CHANNEL, TC>(p, var, io, kept);
    }
}

template int generic_bwd<float, false>(const Plan &, const dg_dr_variant &, const Io<float> &, const void *);
template int generic_bwd<uint16_t, false>(const Plan &, const dg_dr_variant &, const Io<uint16_t> &, const void *);
template int generic_bwd<f16bits, false>(const Plan &, const dg_dr_variant &, const Io<f16bits> &, const void *);
template int generic_bwd<uint16_t, true>(const Plan &, const dg_dr_variant &, const Io<uint16_t> &, const void *);
template int generic_bwd<f16bits, true>(const Plan &, const dg_dr_variant &, const Io<f16bits> &, const void *);

} // namespace drc
