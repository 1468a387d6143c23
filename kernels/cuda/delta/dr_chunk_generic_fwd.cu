/* The generic chunked delta-rule kernels, forward: prep, the state pass (dr_chunk_generic.cuh) and the
 * output; the math and the stages are described in dr_chunk_generic.cuh. */
#include "kernels/cuda/delta/dr_chunk_generic.cuh"

namespace drc {
namespace {

/* ---------------------------------------------------------------- output, block per (chunk, hv,
 * V tile): O = scale (exp(G) o Q) S_in + P V'.  Smem: Qg [C*K], S [K*BV], P [C*C], Vn [C*BV]. */
template <typename T, int GATE>
__global__ void __launch_bounds__(NT)
    k_out(Geom G, int BV, const T *q, const float *Gc, const float *P, const float *Vn, const float *Hst, T *o) {
    DRC_SMEM(float, sm);
    const int C = G.C, K = G.K, V = G.V, HV = G.HV, tid = threadIdx.x;
    const int NVT = (V + BV - 1) / BV;
    const int vt = (int)(blockIdx.x % NVT), hv = (int)(blockIdx.x / NVT % HV);
    const int64_t c = blockIdx.x / NVT / HV;
    const int j0 = vt * BV, nbv = V - j0 < BV ? V - j0 : BV;
    const CP<T> p = cp_at<T>(G, c, hv);
    const int L = p.L;
    float *sQ = sm, *sS = sQ + C * K, *sP = sS + K * BV, *sV = sP + C * C;
    for (int e = tid; e < L * K; e += NT) {
        int i = e / K, r = e % K;
        float x = G.scale * ldx(q + p.oq + i * p.ldq + r);
        if (GATE != DG_GATE_NONE) x *= gexp<GATE>(Gc + p.og + i * p.ldg, r);
        sQ[e] = x;
    }
    const int64_t sb = (c * HV + hv) * (int64_t)K * V + j0;
    for (int e = tid; e < K * BV; e += NT) {
        int r = e / BV, j = e % BV;
        sS[e] = j < nbv ? Hst[sb + (int64_t)r * V + j] : 0.0f;
    }
    for (int e = tid; e < L * C; e += NT) {
        int i = e / C, j = e % C;
        sP[e] = j <= i ? P[p.oc + i * p.ldc + j] : 0.0f;
    }
    for (int e = tid; e < L * BV; e += NT) {
        int i = e / BV, j = e % BV;
        sV[e] = j < nbv ? Vn[p.ov + i * p.ldv + j0 + j] : 0.0f;
    }
    bsync();
    for (int e = tid; e < L * nbv; e += NT) {
        int i = e / nbv, j = e % nbv;
        float s = 0.0f;
        for (int r = 0; r < K; r++) s += sQ[i * K + r] * sS[r * BV + j];
        for (int l = 0; l <= i; l++) s += sP[i * C + l] * sV[l * BV + j];
        stx(o + p.ov + i * p.ldv + j0 + j, s);
    }
}

/* ---------------------------------------------------------------- host side */

template <typename T, int GATE> int fwd_gate(const Plan &pl, const Io<T> &io) {
    const Geom &G = pl.G;
    const int64_t rows = G.rows, HV = G.HV;
    const int BV = tile_bv(G), NVT = (G.V + BV - 1) / BV;
    float *Gc = nullptr, *W, *U, *P, *Hst;
    int rc = -1;
    W = scratch<float>((size_t)(rows * HV * G.K));
    U = scratch<float>((size_t)(rows * HV * G.V));
    P = scratch<float>((size_t)(rows * HV * G.C));
    Hst = scratch<float>((size_t)(G.nchunks * HV * G.K * G.V));
    if (G.gs) Gc = scratch<float>((size_t)(rows * HV * G.gs));
    if (W && U && P && Hst && (!G.gs || Gc)) {
        size_t sm1 = sizeof(float) * (size_t)(2 * G.C + 3 * G.C * G.C);
        size_t sm2 = sizeof(float) * (size_t)(G.K * BV + G.C * G.K + G.C * BV + G.K);
        size_t sm3 = sizeof(float) * (size_t)(G.C * G.K + G.K * BV + G.C * G.C + G.C * BV);
        rc = DRC_LAUNCH("dr_chunk prep", (k_prep<T, GATE>), G.nchunks * HV, NT, sm1, G, io.q, io.k, io.v, io.g, io.beta,
                        Gc, W, U, P, (float *)nullptr, (float *)nullptr, 1);
        if (!rc)
            rc = DRC_LAUNCH("dr_chunk state", (k_state<T, GATE>), G.N * HV * NVT, NT, sm2, G, BV, io.k,
                            (const float *)Gc, (const float *)W, U, io.h0, io.hT, Hst);
        if (!rc)
            rc = DRC_LAUNCH("dr_chunk out", (k_out<T, GATE>), G.nchunks * HV * NVT, NT, sm3, G, BV, io.q,
                            (const float *)Gc, (const float *)P, (const float *)U, (const float *)Hst, io.o);
    }
    release(Gc), release(W), release(U), release(P), release(Hst);
    return rc;
}

} // namespace

template <typename T> int generic_fwd(const Plan &p, const Io<T> &io) {
    switch (p.G.gate) {
    case DG_GATE_NONE: return fwd_gate<T, DG_GATE_NONE>(p, io);
    case DG_GATE_HEAD: return fwd_gate<T, DG_GATE_HEAD>(p, io);
    default: return fwd_gate<T, DG_GATE_CHANNEL>(p, io);
    }
}

template int generic_fwd<float>(const Plan &, const Io<float> &);
template int generic_fwd<uint16_t>(const Plan &, const Io<uint16_t> &);
template int generic_fwd<f16bits>(const Plan &, const Io<f16bits> &);

} // namespace drc
