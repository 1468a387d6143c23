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

/* K = 256 on 16-bit tensor cores throughout (prep, the state pass and the output pass of
 * dr_chunk_k256.cu): their working set (K256Bufs) in keep, left there for the backward, or in
 * scratch when keep is NULL (then without what only the backward reads: Ai, Mkk, the states' lo
 * plane) */
template <typename T, int GATE> int fwd_k256(const Plan &pl, const Io<T> &io, void *keep) {
    K256Bufs b;
    bool ok;
    char *own = carve_into(
        keep, [&](Carve &cv) { k256_carve(pl.G, cv, b, keep != nullptr); }, &ok);
    if (!ok) return -1;
    int rc = prep_state<T, GATE, true>(pl, io, true, b.Gc, (float *)b.W, Words{(float *)b.Vn, true}, b.P, b.Ai, b.Mkk,
                                       Words{(float *)b.Sh, true}, io.hT, 1, b.Kd, b.Qg);
    if (!rc)
        rc = is_bf16<T>::value ? fast::k256_out(pl, io_bits(io), b.Gc, b.P, b.Vn, b.Sh, b.Qg)
                               : fast_h::k256_out(pl, io_bits(io), b.Gc, b.P, b.Vn, b.Sh, b.Qg);
    release(own);
    return rc;
}

template <typename T, int GATE, bool TC> int fwd_gate(const Plan &pl, const Io<T> &io, void *keep, bool *kept) {
    const Geom &G = pl.G;
    const int64_t rows = G.rows, HV = G.HV;
    const int BV = tile_bv(G), NVT = (G.V + BV - 1) / BV;
    /* 16-bit kernels throughout where k256_takes the call and o is 4-byte aligned (the output pass
     * stores it in pairs) */
    const bool k256 = k256_takes<T, GATE, TC>(G, io);
    if constexpr (TC && sizeof(T) == 2) {
        if (k256 && ((uintptr_t)io.o & 3) == 0) {
            const int rc = fwd_k256<T, GATE>(pl, io, keep);
            *kept = !rc && keep;
            return rc;
        }
    }
    float *Gc = nullptr, *W, *U, *P, *Hst;
    int rc = -1;
    W = scratch<float>((size_t)(rows * HV * G.K));
    U = scratch<float>((size_t)(rows * HV * G.V));
    P = scratch<float>((size_t)(rows * HV * G.C));
    Hst = scratch<float>((size_t)(G.nchunks * HV * G.K * G.V));
    if (G.gs) Gc = scratch<float>((size_t)(rows * HV * G.gs));
    /* the per-channel gate's Kd and Qg, which the 16-bit prep writes */
    const bool kq = k256 && GATE == DG_GATE_CHANNEL;
    uint16_t *Kd = kq ? scratch<uint16_t>((size_t)(rows * HV * G.K)) : nullptr;
    uint16_t *Qg = kq ? scratch<uint16_t>((size_t)(rows * HV * G.K)) : nullptr;
    if (W && U && P && Hst && (!G.gs || Gc) && (!kq || (Kd && Qg))) {
        /* the generic (or TF32) kernels, f32 buffers; at K = 256 with an o that takes the TF32 output
         * pass, the 16-bit prep and state pass before it (W 16-bit words; U and the states f32: o and
         * hT then differ at the rounding level from an aligned call's, whose U is 16-bit words) */
        rc = prep_state<T, GATE, TC>(pl, io, k256, Gc, W, Words{U, false}, P, nullptr, nullptr, Words{Hst, false},
                                     io.hT, 1, Kd, Qg);
        if (!rc)
            rc = DRC_LAUNCH(TC ? "dr_chunk tf32 out" : "dr_chunk out", (k_out<T, GATE, TC>), G.nchunks * HV * NVT, NT,
                            out_smem(G, BV), G, BV, io.q, (const float *)Gc, (const float *)P, (const float *)U,
                            (const float *)Hst, io.o);
    }
    release(Gc), release(W), release(U), release(P), release(Hst), release(Kd), release(Qg);
    return rc;
}

} // namespace

template <typename T, bool TC> int generic_fwd(const Plan &p, const Io<T> &io, void *keep, bool *kept) {
    *kept = false;
    switch (p.G.gate) {
    case DG_GATE_NONE: return fwd_gate<T, DG_GATE_NONE, TC>(p, io, keep, kept);
    case DG_GATE_HEAD: return fwd_gate<T, DG_GATE_HEAD, TC>(p, io, keep, kept);
    default: return fwd_gate<T, DG_GATE_CHANNEL, TC>(p, io, keep, kept);
    }
}

template int generic_fwd<float, false>(const Plan &, const Io<float> &, void *, bool *);
template int generic_fwd<uint16_t, false>(const Plan &, const Io<uint16_t> &, void *, bool *);
template int generic_fwd<f16bits, false>(const Plan &, const Io<f16bits> &, void *, bool *);
template int generic_fwd<uint16_t, true>(const Plan &, const Io<uint16_t> &, void *, bool *);
template int generic_fwd<f16bits, true>(const Plan &, const Io<f16bits> &, void *, bool *);

} // namespace drc
