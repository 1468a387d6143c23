/* The generic chunked delta-rule kernels, forward: prep, the state pass (dr_chunk_generic.cuh) and the
 * output; the math and the stages are described in dr_chunk_generic.cuh.  TC: the same kernels with
 * their products on TF32 tensor cores (the TF32 family, dr_chunk_blk_mm.cuh). */
#include "kernels/cuda/delta/dr_chunk_generic.cuh"

namespace drc {
namespace {

/* ---------------------------------------------------------------- output, block per (chunk, hv,
 * V tile): O = scale (exp(G) o Q) S_in + P V'.  Smem: Qg [C x ld_k], S [K x ld_bv], P [C x ld_c],
 * Vn [C x ld_bv]. */
inline size_t out_smem(const Geom &G, int BV) {
    return sizeof(float) * (size_t)(G.C * ld_k(G) + G.K * ld_bv(BV) + G.C * ld_c(G) + G.C * ld_bv(BV));
}

template <typename T, int GATE, bool TC>
__global__ void __launch_bounds__(NT)
    k_out(Geom G, int BV, const T *q, const float *Gc, const float *P, const float *Vn, const float *Hst, T *o) {
    DRC_SMEM(float, sm);
    const int C = G.C, K = G.K, V = G.V, HV = G.HV;
    const int LC = ld_c(G), LK = ld_k(G), LS = ld_bv(BV);
    const int NVT = (V + BV - 1) / BV;
    const int vt = (int)(blockIdx.x % NVT), hv = (int)(blockIdx.x / NVT % HV);
    const int64_t c = blockIdx.x / NVT / HV;
    const int j0 = vt * BV, nbv = V - j0 < BV ? V - j0 : BV;
    const CP<T> p = cp_at<T>(G, c, hv);
    const int L = p.L;
    float *sQ = sm, *sS = sQ + C * LK, *sP = sS + K * LS, *sV = sP + C * LC;
    stage<NT>(sQ, LK, q + p.oq, p.ldq, L, K, [&](int i, int r, float x) {
        x *= G.scale;
        return GATE != DG_GATE_NONE ? x * gexp<GATE>(Gc + p.og + i * p.ldg, r) : x;
    });
    stage<NT>(sS, LS, Hst + (c * HV + hv) * (int64_t)K * V + j0, V, K, nbv, AsIs{});
    stage<NT>(sP, LC, P + p.oc, p.ldc, L, L, [](int i, int j, float x) { return j <= i ? x : 0.0f; });
    stage<NT>(sV, LS, Vn + p.ov + j0, p.ldv, L, nbv, AsIs{});
    bsync();
    blk_mm2<TC, NT>(L, nbv, Term{Mat{sQ, LK, 1}, Mat{sS, LS, 1}, K}, Term{Mat{sP, LC, 1}, Mat{sV, LS, 1}, L},
                    [&](int i, int j, float x) { stx(o + p.ov + i * p.ldv + j0 + j, x); });
}

/* ---------------------------------------------------------------- host side */

template <typename T, int GATE, bool TC> int fwd_gate(const Plan &pl, const Io<T> &io) {
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
        /* prep, the state pass and the output pass on 16-bit tensor cores (dr_chunk_k256.cu), V' and
         * the states as 16-bit words where the output pass, which reads only those, is one of them.
         * (With an o that takes the TF32 output pass, U stays f32 in the state pass: o and hT then
         * differ at the rounding level from an aligned call's, whose U is 16-bit words.) */
        const bool k256 = k256_takes<T, GATE, TC>(G, io), out16 = k256 && ((uintptr_t)io.o & 3) == 0;
        rc = prep_state<T, GATE, TC>(pl, io, k256, Gc, W, U, P, nullptr, nullptr, Hst, io.hT, 1, out16, out16);
        if constexpr (TC && sizeof(T) == 2 && GATE != DG_GATE_CHANNEL) {
            const auto h16 = [](const float *x) { return (const uint16_t *)x; };
            if (!rc && out16)
                rc = is_bf16<T>::value ? fast::k256_out(pl, io_bits(io), Gc, P, h16(U), h16(Hst))
                                       : fast_h::k256_out(pl, io_bits(io), Gc, P, h16(U), h16(Hst));
        }
        if (!rc && !out16)
            rc = DRC_LAUNCH(TC ? "dr_chunk tf32 out" : "dr_chunk out", (k_out<T, GATE, TC>), G.nchunks * HV * NVT, NT,
                            out_smem(G, BV), G, BV, io.q, (const float *)Gc, (const float *)P, (const float *)U,
                            (const float *)Hst, io.o);
    }
    release(Gc), release(W), release(U), release(P), release(Hst);
    return rc;
}

} // namespace

template <typename T, bool TC> int generic_fwd(const Plan &p, const Io<T> &io) {
    switch (p.G.gate) {
    case DG_GATE_NONE: return fwd_gate<T, DG_GATE_NONE, TC>(p, io);
    case DG_GATE_HEAD: return fwd_gate<T, DG_GATE_HEAD, TC>(p, io);
    default: return fwd_gate<T, DG_GATE_CHANNEL, TC>(p, io);
    }
}

template int generic_fwd<float, false>(const Plan &, const Io<float> &);
template int generic_fwd<uint16_t, false>(const Plan &, const Io<uint16_t> &);
template int generic_fwd<f16bits, false>(const Plan &, const Io<f16bits> &);
template int generic_fwd<uint16_t, true>(const Plan &, const Io<uint16_t> &);
template int generic_fwd<f16bits, true>(const Plan &, const Io<f16bits> &);

} // namespace drc
