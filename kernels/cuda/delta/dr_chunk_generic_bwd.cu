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
 * dSo[c] = dS leaving chunk c.  Smem: dS [K*BV], X [C*K], dVn [C*BV], dO [C*BV], P [C*C], dec [K]. */
template <typename T, int GATE>
__global__ void __launch_bounds__(NT)
    k_dhu(Geom G, int BV, const T *q, const T *k, const float *Gc, const float *W, const float *P, const T *dout,
          const float *dhT, float *dVn, float *dSo, float *dh0) {
    DRC_SMEM(float, sm);
    const int C = G.C, K = G.K, V = G.V, HV = G.HV, tid = threadIdx.x;
    const int NVT = (V + BV - 1) / BV;
    const int vt = (int)(blockIdx.x % NVT), hv = (int)(blockIdx.x / NVT % HV);
    const int64_t n = blockIdx.x / NVT / HV;
    const int j0 = vt * BV, nbv = V - j0 < BV ? V - j0 : BV;
    float *sS = sm, *sX = sS + K * BV, *sV = sX + C * K, *sO = sV + C * BV, *sP = sO + C * BV, *sdec = sP + C * C;
    const int64_t hb = (n * HV + hv) * (int64_t)K * V + j0;
    for (int e = tid; e < K * BV; e += NT) {
        int r = e / BV, j = e % BV;
        sS[e] = dhT && j < nbv ? dhT[hb + (int64_t)r * V + j] : 0.0f;
    }
    int64_t c0, c1;
    seq_chunks(G, n, c0, c1);
    bsync();
    for (int64_t c = c1 - 1; c >= c0; c--) {
        const CP<T> p = cp_at<T>(G, c, hv);
        const int L = p.L;
        const int64_t sb = (c * HV + hv) * (int64_t)K * V + j0;
        for (int e = tid; e < K * BV; e += NT) {
            int r = e / BV, j = e % BV;
            if (j < nbv) dSo[sb + (int64_t)r * V + j] = sS[e];
        }
        const float *Gl = GATE != DG_GATE_NONE ? Gc + p.og + (L - 1) * p.ldg : nullptr;
        for (int e = tid; e < L * K; e += NT) {
            int i = e / K, r = e % K;
            float kk = ldx(k + p.oq + i * p.ldq + r);
            if (GATE != DG_GATE_NONE) kk *= gam<GATE>(Gl, Gc + p.og + i * p.ldg, r);
            sX[e] = kk;
        }
        for (int r = tid; r < K; r += NT) sdec[r] = last_decay<GATE>(Gl, r);
        for (int e = tid; e < L * BV; e += NT) {
            int i = e / BV, j = e % BV;
            sO[e] = j < nbv ? ldx(dout + p.ov + i * p.ldv + j0 + j) : 0.0f;
        }
        for (int e = tid; e < L * C; e += NT) {
            int i = e / C, j = e % C;
            sP[e] = j <= i ? P[p.oc + i * p.ldc + j] : 0.0f;
        }
        bsync();
        for (int e = tid; e < L * BV; e += NT) {
            int i = e / BV, j = e % BV;
            float s = 0.0f;
            for (int m = i; m < L; m++) s += sP[m * C + i] * sO[m * BV + j];
            for (int r = 0; r < K; r++) s += sX[i * K + r] * sS[r * BV + j];
            sV[e] = s;
            if (j < nbv) dVn[p.ov + i * p.ldv + j0 + j] = s;
        }
        bsync();
        for (int e = tid; e < L * K; e += NT) {
            int i = e / K, r = e % K;
            float x = ldx(q + p.oq + i * p.ldq + r);
            if (GATE != DG_GATE_NONE) x *= gexp<GATE>(Gc + p.og + i * p.ldg, r);
            sX[e] = x;
        }
        bsync();
        for (int e = tid; e < K * BV; e += NT) {
            int r = e / BV, j = e % BV;
            float s = 0.0f;
            for (int i = 0; i < L; i++) s += sX[i * K + r] * sO[i * BV + j];
            sS[e] = sdec[r] * sS[e] + G.scale * s;
        }
        bsync();
        for (int e = tid; e < L * K; e += NT) sX[e] = W[p.ok + (e / K) * p.ldk + e % K];
        bsync();
        for (int e = tid; e < K * BV; e += NT) {
            int r = e / BV, j = e % BV;
            float s = 0.0f;
            for (int i = 0; i < L; i++) s += sX[i * K + r] * sV[i * BV + j];
            sS[e] -= s;
        }
        bsync();
    }
    if (dh0)
        for (int e = tid; e < K * BV; e += NT) {
            int r = e / BV, j = e % BV;
            if (j < nbv) dh0[hb + (int64_t)r * V + j] = sS[e];
        }
}

/* Pointers of the backward stages. */
template <typename T> struct BwdArgs {
    const T *q, *k, *v, *beta, *dout;
    const float *Gc, *P, *Ai, *Mkk, *Vn, *dVn, *Hst, *dSo;
    float *dqv, *dkv; /* [rows,HV,K] */
    float *dWg, *dGg; /* unfused: [rows,HV,K], [rows,HV,gs] */
    T *dv, *dbeta;
    float *dbetaf; /* f32 dbeta instead of dbeta (Io::dbeta32), or NULL */
    float *dg;
    int final_dg;
};

/* ---------------------------------------------------------------- dqkwg for one chunk (block).
 * Writes dq, dk (value head) to dqv, dkv; dW (ld ldw) and dG (ld ldG; the gradient of the
 * cumulative gate, last-row terms included).  Warp per row i; lanes split the inner sums.
 *   (f2) dq = exp(G) o (scale dO S0^T) + scale (dP o Gamma) K,  dP = lower_incl(dO V'^T)
 *   (f6) dk = scale (dP o Gamma)^T Q
 *   (f3) dk += exp(G_last - G) o (V' dS1^T)
 *   (f1) dW = -dV' S0^T
 * Smem: dP [C*C], Gl partials [NW*K], red [2*NW]. */
template <typename T, int GATE>
__device__ void dqkwg_body(const Geom &G, const BwdArgs<T> &a, int64_t c, int hv, float *dW, int64_t ldw, float *dG,
                           int64_t ldG, float *sm) {
    const int C = G.C, K = G.K, V = G.V, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const CP<T> p = cp_at<T>(G, c, hv);
    const int L = p.L;
    const float scale = G.scale;
    float *sDP = sm, *sGl = sDP + C * C, *sred = sGl + NW * K;
    const float *S0 = a.Hst + (c * G.HV + hv) * (int64_t)K * V, *dS1 = a.dSo + (c * G.HV + hv) * (int64_t)K * V;
    const T *qc = a.q + p.oq, *kc = a.k + p.oq, *dO = a.dout + p.ov;
    const float *Vn = a.Vn + p.ov, *dVn = a.dVn + p.ov;
    const float *Gcc = GATE != DG_GATE_NONE ? a.Gc + p.og : nullptr;
    const int partial = GATE != DG_GATE_NONE && !a.final_dg;
    /* dP_il = sum_j dO_ij V'_lj, l <= i (warp per entry) */
    for (int e = warp; e < C * C; e += NW) {
        int i = e / C, l = e % C;
        float s = 0.0f;
        if (l <= i && i < L)
            for (int j = lane; j < V; j += 32) s += ldx(dO + i * p.ldv + j) * Vn[l * p.ldv + j];
        s = warp_sum(s);
        if (lane == 0) sDP[e] = s;
    }
    for (int e = tid; e < NW * K; e += NT) sGl[e] = 0.0f;
    bsync();
    float kf3_head = 0.0f; /* HEAD: this warp's sum of k o f3 */
    for (int i = warp; i < L; i += NW) {
        float rowsum = 0.0f;
        const float *Gi = GATE != DG_GATE_NONE ? Gcc + i * p.ldg : nullptr;
        for (int cc = 0; cc < K; cc++) {
            float f2 = 0.0f, dkd = 0.0f, dw = 0.0f, rp = 0.0f, dkp = 0.0f;
            for (int j = lane; j < V; j += 32) {
                float s0 = S0[(int64_t)cc * V + j];
                f2 += ldx(dO + i * p.ldv + j) * s0;
                dkd += Vn[i * p.ldv + j] * dS1[(int64_t)cc * V + j];
                dw += dVn[i * p.ldv + j] * s0;
            }
            for (int l = lane; l <= i; l += 32)
                rp += sDP[i * C + l] * ldx(kc + l * p.ldq + cc) *
                      (GATE != DG_GATE_NONE ? gam<GATE>(Gi, Gcc + l * p.ldg, cc) : 1.0f);
            for (int m = i + lane; m < L; m += 32)
                dkp += sDP[m * C + i] * ldx(qc + m * p.ldq + cc) *
                       (GATE != DG_GATE_NONE ? gam<GATE>(Gcc + m * p.ldg, Gi, cc) : 1.0f);
            f2 = warp_sum(f2), dkd = warp_sum(dkd), dw = warp_sum(dw);
            rp = scale * warp_sum(rp), dkp = scale * warp_sum(dkp);
            if (lane == 0) {
                const float qv = ldx(qc + i * p.ldq + cc), kv = ldx(kc + i * p.ldq + cc);
                float dqf2 = scale * f2, f3 = dkd;
                if (GATE != DG_GATE_NONE) {
                    dqf2 *= gexp<GATE>(Gi, cc);
                    f3 *= gam<GATE>(Gcc + (L - 1) * p.ldg, Gi, cc);
                }
                const float dq = dqf2 + rp, dk = dkp + f3;
                a.dqv[p.ok + i * p.ldk + cc] = dq;
                a.dkv[p.ok + i * p.ldk + cc] = dk;
                dW[i * ldw + cc] = -dw;
                if (GATE != DG_GATE_NONE) {
                    float contrib;
                    if (!partial) contrib = qv * dq - kv * dk;
                    else if (GATE == DG_GATE_CHANNEL) contrib = qv * dqf2 + qv * rp - kv * dkp - kv * f3;
                    else contrib = qv * dqf2 - kv * f3;
                    if (GATE == DG_GATE_CHANNEL) {
                        dG[i * ldG + cc] = contrib;
                        sGl[warp * K + cc] += kv * f3;
                    } else {
                        rowsum += contrib;
                        kf3_head += kv * f3;
                    }
                }
            }
        }
        if (GATE == DG_GATE_HEAD) {
            float rc = 0.0f; /* partial: rowcol(dP, P) = sum_l dP_il P_il - sum_m dP_mi P_mi */
            if (partial) {
                for (int l = lane; l <= i; l += 32) rc += sDP[i * C + l] * a.P[p.oc + i * p.ldc + l];
                for (int m = i + lane; m < L; m += 32) rc -= sDP[m * C + i] * a.P[p.oc + m * p.ldc + i];
                rc = warp_sum(rc);
            }
            if (lane == 0) dG[i * ldG] = rowsum + rc;
        }
    }
    if (GATE == DG_GATE_HEAD && lane == 0) sred[NW + warp] = kf3_head;
    bsync();
    /* last row: dG_last += sum_i k_i o f3_i + exp(G_last) o rowsum(S0 o dS1) */
    if (GATE == DG_GATE_CHANNEL) {
        const float *Gl = Gcc + (L - 1) * p.ldg;
        for (int cc = warp; cc < K; cc += NW) {
            float t = 0.0f;
            for (int j = lane; j < V; j += 32) t += S0[(int64_t)cc * V + j] * dS1[(int64_t)cc * V + j];
            t = warp_sum(t);
            if (lane == 0) {
                float s = 0.0f;
                for (int w = 0; w < NW; w++) s += sGl[w * K + cc];
                dG[(L - 1) * ldG + cc] += s + expf(Gl[cc]) * t;
            }
        }
    } else if (GATE == DG_GATE_HEAD) {
        float t = 0.0f;
        for (int64_t e = tid; e < (int64_t)K * V; e += NT) t += S0[e] * dS1[e];
        t = warp_sum(t);
        if (lane == 0) sred[warp] = t;
        bsync();
        if (tid == 0) {
            float st = 0.0f, sk = 0.0f;
            for (int w = 0; w < NW; w++) st += sred[w], sk += sred[NW + w];
            dG[(L - 1) * ldG] += sk + expf(Gcc[(L - 1) * p.ldg]) * st;
        }
    }
    bsync();
}

/* ---------------------------------------------------------------- WY backward for one chunk
 * (block), from dW (ld ldw) and dU = dV':
 *   dAi = lower_incl(dW Kbg^T + dU Vb^T)        Kbg = diag(beta) exp(G) o K, Vb = diag(beta) V
 *   dKbg = Ai^T dW,  dVb = Ai^T dU:  dv = beta o dVb;  dbeta = rowsum(V o dVb) + rowsum(Kg o dKbg)
 *   dk += exp(G) o (beta o dKbg);  dG += Kg o (beta o dKbg)                Kg = exp(G) o K
 *   dA = strictly_lower(-Ai^T dAi Ai^T);  dbeta += rowsum(dA o Mkk);  dMkk = diag(beta) dA
 *   Mkk = K K^T o Gamma:  dk += (dMkk o Gamma) K + (dMkk o Gamma)^T K, and its dG
 *   dg = reverse chunk-local cumsum of dG.
 * Smem: Ai, dAi, T, dA [C*C], db [C]. */
template <typename T, int GATE>
__device__ void wy_body(const Geom &G, const BwdArgs<T> &a, int64_t c, int hv, const float *dW, int64_t ldw, float *dG,
                        int64_t ldG, float *sm) {
    const int C = G.C, K = G.K, V = G.V, HV = G.HV, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const CP<T> p = cp_at<T>(G, c, hv);
    const int L = p.L;
    float *sAi = sm, *sdAi = sAi + C * C, *sT = sdAi + C * C, *sdA = sT + C * C, *sdb = sdA + C * C;
    const T *kc = a.k + p.oq, *vc = a.v + p.ov;
    const float *dU = a.dVn + p.ov;
    const float *Gcc = GATE != DG_GATE_NONE ? a.Gc + p.og : nullptr;
    for (int e = tid; e < C * C; e += NT) {
        int i = e / C, j = e % C;
        sAi[e] = j <= i && i < L ? a.Ai[p.oc + i * p.ldc + j] : 0.0f;
    }
    /* dAi_ij = sum_c dW_ic Kbg_jc + sum_v dU_iv Vb_jv, j <= i (warp per entry) */
    for (int e = warp; e < C * C; e += NW) {
        int i = e / C, j = e % C;
        float s = 0.0f;
        if (j <= i && i < L) {
            const float bj = ldx(a.beta + p.ob + j * (int64_t)HV);
            for (int cc = lane; cc < K; cc += 32) {
                float kb = ldx(kc + j * p.ldq + cc);
                if (GATE != DG_GATE_NONE) kb *= gexp<GATE>(Gcc + j * p.ldg, cc);
                s += dW[i * ldw + cc] * kb;
            }
            for (int vv = lane; vv < V; vv += 32) s += dU[i * p.ldv + vv] * ldx(vc + j * p.ldv + vv);
            s *= bj;
        }
        s = warp_sum(s);
        if (lane == 0) sdAi[e] = s;
    }
    bsync();
    /* row j: dKbg, dVb -> dv, dbeta, dk, dG */
    for (int j = warp; j < L; j += NW) {
        const float bj = ldx(a.beta + p.ob + j * (int64_t)HV);
        float db = 0.0f, dgr = 0.0f;
        for (int vv = lane; vv < V; vv += 32) {
            float s = 0.0f;
            for (int i = j; i < L; i++) s += sAi[i * C + j] * dU[i * p.ldv + vv];
            db += ldx(vc + j * p.ldv + vv) * s;
            if (a.dv) stx(a.dv + p.ov + j * p.ldv + vv, bj * s);
        }
        for (int cc = lane; cc < K; cc += 32) {
            float s = 0.0f;
            for (int i = j; i < L; i++) s += sAi[i * C + j] * dW[i * ldw + cc];
            const float kv = ldx(kc + j * p.ldq + cc);
            const float e = GATE != DG_GATE_NONE ? gexp<GATE>(Gcc + j * p.ldg, cc) : 1.0f;
            db += kv * e * s;
            const float rp = e * (bj * s);
            a.dkv[p.ok + j * p.ldk + cc] += rp;
            if (GATE == DG_GATE_CHANNEL) dG[j * ldG + cc] += kv * rp;
            if (GATE == DG_GATE_HEAD) dgr += kv * rp;
        }
        db = warp_sum(db);
        if (GATE == DG_GATE_HEAD) dgr = warp_sum(dgr);
        if (lane == 0) {
            sdb[j] = db;
            if (GATE == DG_GATE_HEAD) dG[j * ldG] += dgr;
        }
    }
    /* T = Ai^T dAi (dAi lower incl. diagonal) */
    for (int e = tid; e < C * C; e += NT) {
        int i = e / C, j = e % C, m0 = i > j ? i : j;
        float s = 0.0f;
        for (int m = m0; m < L; m++) s += sAi[m * C + i] * sdAi[m * C + j];
        sT[e] = s;
    }
    bsync();
    /* dA_ij = -sum_{m<=j} T_im Ai_jm, j < i */
    for (int e = tid; e < C * C; e += NT) {
        int i = e / C, j = e % C;
        float s = 0.0f;
        if (j < i && i < L)
            for (int m = 0; m <= j; m++) s += sT[i * C + m] * sAi[j * C + m];
        sdA[e] = -s;
    }
    bsync();
    /* dbeta_i += sum_{j<i} dA_ij Mkk_ij;  dMkk = diag(beta) dA */
    for (int i = warp; i < L; i += NW) {
        const float bi = ldx(a.beta + p.ob + i * (int64_t)HV);
        float s = 0.0f;
        for (int j = lane; j < i; j += 32) {
            s += sdA[i * C + j] * a.Mkk[p.oc + i * p.ldc + j];
            sdA[i * C + j] *= bi;
        }
        s = warp_sum(s);
        if (lane == 0) sdb[i] += s;
    }
    bsync();
    /* dk += (dMkk o Gamma) K + (dMkk o Gamma)^T K;  dG from both sides */
    for (int i = warp; i < L; i += NW) {
        const float *Gi = GATE != DG_GATE_NONE ? Gcc + i * p.ldg : nullptr;
        for (int cc = lane; cc < K; cc += 32) {
            float rp = 0.0f, cp = 0.0f;
            for (int j = 0; j < i; j++)
                rp += sdA[i * C + j] * ldx(kc + j * p.ldq + cc) *
                      (GATE != DG_GATE_NONE ? gam<GATE>(Gi, Gcc + j * p.ldg, cc) : 1.0f);
            for (int m = i + 1; m < L; m++)
                cp += sdA[m * C + i] * ldx(kc + m * p.ldq + cc) *
                      (GATE != DG_GATE_NONE ? gam<GATE>(Gcc + m * p.ldg, Gi, cc) : 1.0f);
            a.dkv[p.ok + i * p.ldk + cc] += rp + cp;
            if (GATE == DG_GATE_CHANNEL) dG[i * ldG + cc] += ldx(kc + i * p.ldq + cc) * (rp - cp);
        }
        if (GATE == DG_GATE_HEAD) {
            float s = 0.0f;
            for (int j = lane; j < i; j += 32) s += sdA[i * C + j] * a.Mkk[p.oc + i * p.ldc + j];
            for (int m = i + 1 + lane; m < L; m += 32) s -= sdA[m * C + i] * a.Mkk[p.oc + m * p.ldc + i];
            s = warp_sum(s);
            if (lane == 0) dG[i * ldG] += s;
        }
        if (lane == 0 && a.dbetaf) a.dbetaf[p.ob + i * (int64_t)HV] = sdb[i];
        else if (lane == 0 && a.dbeta) stx(a.dbeta + p.ob + i * (int64_t)HV, sdb[i]);
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

/* shared-memory floats of dqkwg_body and wy_body */
__host__ __device__ inline int64_t dqkwg_smem(const Geom &G) { return (int64_t)G.C * G.C + NW * G.K + 2 * NW; }
__host__ __device__ inline int64_t wy_smem(const Geom &G) { return 4 * (int64_t)G.C * G.C + G.C; }

/* fused: dW [C*K] and dG [C*gs] in shared memory, then the two bodies */
template <typename T, int GATE> __global__ void __launch_bounds__(NT) k_bwd_fused(Geom G, BwdArgs<T> a) {
    DRC_SMEM(float, sm);
    const int64_t c = blockIdx.x / G.HV;
    const int hv = (int)(blockIdx.x % G.HV);
    float *sdW = sm, *sdG = sdW + G.C * G.K, *rest = sdG + G.C * G.gs;
    dqkwg_body<T, GATE>(G, a, c, hv, sdW, G.K, sdG, G.gs, rest);
    wy_body<T, GATE>(G, a, c, hv, sdW, G.K, sdG, G.gs, rest);
}

template <typename T, int GATE> __global__ void __launch_bounds__(NT) k_bwd_dqkwg(Geom G, BwdArgs<T> a) {
    DRC_SMEM(float, sm);
    const int64_t c = blockIdx.x / G.HV;
    const int hv = (int)(blockIdx.x % G.HV);
    const Chunk ch = chunk_at(G, c);
    const int64_t off = ch.r0 * G.HV + hv;
    dqkwg_body<T, GATE>(G, a, c, hv, a.dWg + off * G.K, (int64_t)G.HV * G.K, G.gs ? a.dGg + off * G.gs : nullptr,
                        (int64_t)G.HV * G.gs, sm);
}

template <typename T, int GATE> __global__ void __launch_bounds__(NT) k_bwd_wy(Geom G, BwdArgs<T> a) {
    DRC_SMEM(float, sm);
    const int64_t c = blockIdx.x / G.HV;
    const int hv = (int)(blockIdx.x % G.HV);
    const Chunk ch = chunk_at(G, c);
    const int64_t off = ch.r0 * G.HV + hv;
    wy_body<T, GATE>(G, a, c, hv, a.dWg + off * G.K, (int64_t)G.HV * G.K, G.gs ? a.dGg + off * G.gs : nullptr,
                     (int64_t)G.HV * G.gs, sm);
}

/* ---------------------------------------------------------------- host side */

template <typename T, int GATE> int bwd_gate(const Plan &pl, const dg_dr_variant &var, const Io<T> &io) {
    const Geom &G = pl.G;
    const int64_t rows = G.rows, HV = G.HV, nst = G.nchunks * HV * G.K * G.V;
    const int BV = tile_bv(G), NVT = (G.V + BV - 1) / BV;
    const bool fused = var.dw_on_chip != 0;
    float *Gc = nullptr, *W, *U, *P, *Ai, *Mkk, *Hst, *dSo, *dVn, *dqv, *dkv, *dWg = nullptr, *dGg = nullptr;
    int rc = -1;
    W = scratch<float>((size_t)(rows * HV * G.K));
    U = scratch<float>((size_t)(rows * HV * G.V));
    P = scratch<float>((size_t)(rows * HV * G.C));
    Ai = scratch<float>((size_t)(rows * HV * G.C));
    Mkk = scratch<float>((size_t)(rows * HV * G.C));
    Hst = scratch<float>((size_t)nst);
    dSo = scratch<float>((size_t)nst);
    dVn = scratch<float>((size_t)(rows * HV * G.V));
    dqv = scratch<float>((size_t)(rows * HV * G.K));
    dkv = scratch<float>((size_t)(rows * HV * G.K));
    if (G.gs) Gc = scratch<float>((size_t)(rows * HV * G.gs));
    if (!fused) {
        dWg = scratch<float>((size_t)(rows * HV * G.K));
        if (G.gs) dGg = scratch<float>((size_t)(rows * HV * G.gs));
    }
    bool ok = W && U && P && Ai && Mkk && Hst && dSo && dVn && dqv && dkv && (!G.gs || Gc) &&
              (fused || (dWg && (!G.gs || dGg)));
    if (ok) {
        size_t sm1 = sizeof(float) * (size_t)(2 * G.C + 3 * G.C * G.C);
        size_t sm2 = sizeof(float) * (size_t)(G.K * BV + G.C * G.K + G.C * BV + G.K);
        size_t sm4 = sizeof(float) * (size_t)(G.K * BV + G.C * G.K + 2 * G.C * BV + G.C * G.C + G.K);
        int64_t body = dqkwg_smem(G) > wy_smem(G) ? dqkwg_smem(G) : wy_smem(G);
        size_t sm5 = sizeof(float) * (size_t)(G.C * G.K + G.C * G.gs + body);
        BwdArgs<T> a;
        a.q = io.q, a.k = io.k, a.v = io.v, a.beta = io.beta, a.dout = io.dout;
        a.Gc = Gc, a.P = P, a.Ai = Ai, a.Mkk = Mkk, a.Vn = U, a.dVn = dVn, a.Hst = Hst, a.dSo = dSo;
        a.dqv = dqv, a.dkv = dkv, a.dWg = dWg, a.dGg = dGg;
        a.dv = io.dv, a.dbeta = io.dbeta, a.dbetaf = io.dbeta32, a.dg = io.dg;
        a.final_dg = var.gdn_dg_from_final;
        rc = DRC_LAUNCH("dr_chunk prep", (k_prep<T, GATE>), G.nchunks * HV, NT, sm1, G, io.q, io.k, io.v, io.g, io.beta,
                        Gc, W, U, P, Ai, Mkk, var.solve_tril_blocked);
        if (!rc)
            rc = DRC_LAUNCH("dr_chunk state", (k_state<T, GATE>), G.N * HV * NVT, NT, sm2, G, BV, io.k,
                            (const float *)Gc, (const float *)W, U, io.h0, (float *)nullptr, Hst);
        if (!rc)
            rc = DRC_LAUNCH("dr_chunk dhu", (k_dhu<T, GATE>), G.N * HV * NVT, NT, sm4, G, BV, io.q, io.k,
                            (const float *)Gc, (const float *)W, (const float *)P, io.dout, io.dhT, dVn, dSo, io.dh0);
        if (!rc && fused) rc = DRC_LAUNCH("dr_chunk bwd fused", (k_bwd_fused<T, GATE>), G.nchunks * HV, NT, sm5, G, a);
        if (!rc && !fused) {
            size_t sd = sizeof(float) * (size_t)dqkwg_smem(G), sw = sizeof(float) * (size_t)wy_smem(G);
            rc = DRC_LAUNCH("dr_chunk dqkwg", (k_bwd_dqkwg<T, GATE>), G.nchunks * HV, NT, sd, G, a);
            if (!rc) rc = DRC_LAUNCH("dr_chunk wy", (k_bwd_wy<T, GATE>), G.nchunks * HV, NT, sw, G, a);
        }
        /* summed over value heads, the L2 norm's backward with it (16-bit storage, io.rq / io.rk) */
        const int fmt = sizeof(T) == 4 ? VS_F32 : is_bf16<T>::value ? VS_BF16 : VS_F16;
        if (!rc && io.dq) rc = heads_sum("dr_chunk gva", rows, G.H, G.grp, G.K, dqv, io.q, io.rq, fmt, io.dq);
        if (!rc && io.dk) rc = heads_sum("dr_chunk gva", rows, G.H, G.grp, G.K, dkv, io.k, io.rk, fmt, io.dk);
    }
    release(Gc), release(W), release(U), release(P), release(Ai), release(Mkk), release(Hst);
    release(dSo), release(dVn), release(dqv), release(dkv), release(dWg), release(dGg);
    return rc;
}

} // namespace

template <typename T> int generic_bwd(const Plan &p, const dg_dr_variant &var, const Io<T> &io) {
    switch (p.G.gate) {
    case DG_GATE_NONE: return bwd_gate<T, DG_GATE_NONE>(p, var, io);
    case DG_GATE_HEAD: return bwd_gate<T, DG_GATE_HEAD>(p, var, io);
    default: return bwd_gate<T, DG_GATE_CHANNEL>(p, var, io);
    }
}

template int generic_bwd<float>(const Plan &, const dg_dr_variant &, const Io<float> &);
template int generic_bwd<uint16_t>(const Plan &, const dg_dr_variant &, const Io<uint16_t> &);
template int generic_bwd<f16bits>(const Plan &, const dg_dr_variant &, const Io<f16bits> &);

} // namespace drc
