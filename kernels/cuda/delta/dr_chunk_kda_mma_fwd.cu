/* The tensor-core kda forward (per-channel gate; bf16 storage, fp16 in the build of
 * dr_chunk_kda_mma_fwd_f16.cu; chunk 64, K and V in {64, 128}).
 * Tiles and warp products from dr_chunk_mma.cuh, the gated in-chunk product from dr_chunk_kda.cuh.
 * Same math as the generic kernels (dr_chunk_generic.cuh), per chunk of L <= 64 rows and value head
 * hv, G the cumulative per-channel gate (dr_chunk_kda.cuh), Gl = G_{L-1} its last row:
 *   prep  (block per chunk, head):
 *         A  = diag(beta) strictly_lower(M),  M_ij = sum_c k_ic k_jc e^{G_ic - G_jc}  [gated_tri]
 *         Ai = (I + A)^-1                  [f32, blocks of 16: dr_chunk_tri_inv.cuh]
 *         W  = (Ai diag(beta)) (K o e^G),  U = (Ai diag(beta)) V    [mma, Ai' split]
 *         Kd = K o e^{Gl - G} (split, for the state pass), Gl
 *         P  = scale lower_incl(M'),  M'_ij = sum_c q_ic k_jc e^{G_ic - G_jc}   [gated_tri, the
 *              key-side factors of M's product reused]
 *         Qg = scale Q o e^G        (P and Qg split: the output pass's operands, and the backward's)
 *         for the backward (extras = 1) also: Ai, Mkk = strictly_lower(M) (f32)
 *   state (block per sequence, head, tile of 64 value columns; chunks in order; S in registers):
 *         V' = U - W S                                     [mma, S's hi words]
 *         S <- diag(e^{Gl}) S + Kd^T V'                    [mma; Kd, V' plain]
 *         stores S entering each chunk (split) and V' (plain)
 *   out   (block per chunk, head; 8 warps, two blocks per SM):
 *         O = Qg S + P V'                                  [mma; Qg, P split]
 *         (the gated products are prep's, which has k and the gate loaded and scanned already:
 *         the in-chunk attention P made beside A, as FLA's intra kernel makes Aqk beside Akk)
 * With the L2 norm in the forward (Io::l2k), prep normalises the raw q and k as it loads them and
 * writes them out for the backward (dr_chunk_l2norm.cuh); the later kernels read neither.
 * Every exponent is of a difference G_i - G_j with i >= j (or of G, Gl - G), so <= 0 for decays.
 * Heads of one beta and gate (Geom::vsh > 1, a head split by V, dr_chunk_vsplit.cu): a prep block
 * makes everything but U once for the G.vsh heads and stores it once for them (Bufs, shared_row;
 * U for each, from its v); the state and out passes run per head and read the shared rows.
 * Scratch between the kernels: Bufs (dr_chunk_kda.cuh).
 * prep runs one block per multiprocessor (about 220 KB of shared memory) and is latency-bound, so
 * its blocks have 16 warps (ONE_SM_NTH; dr_chunk_kda.cuh says what that gains); it takes the most
 * time of the three. */
#include <type_traits>

#include "kernels/cuda/delta/dr_chunk_kda.cuh"
#include "kernels/cuda/delta/dr_chunk_l2norm.cuh"
#include "kernels/cuda/delta/dr_chunk_tri_inv.cuh"

namespace drc {
namespace DRC_KDA {
namespace {

using mm::tile_bytes;
using mm::WT;

template <int K, int V> struct PrepL {
    static constexpr int F32 = (64 * gstride(K) + 64 + 2 * 64 * LDF + K) * 4; /* G, beta, A, Y, R */
    static constexpr int RAW = 2 * tile_bytes(64, K) + tile_bytes(64, V);
    static constexpr int S1 = tri_scratch_bytes<K>();
    static constexpr int S2 = 2 * tile_bytes(64, 64) + 2 * tile_bytes(64, K);
    static constexpr int bytes = F32 + RAW + (S1 > S2 ? S1 : S2);
};

/* SH: the block takes the G.vsh value heads of one beta and gate (a head split by V,
 * dr_chunk_vsplit.cu); else one head (its own instance, as the head-gate prep) */
template <int K, int V, int NTH, bool SH>
__global__ void __launch_bounds__(NTH)
    kp(Geom G, const uint16_t *q, const uint16_t *k, const uint16_t *v, const float *g, const uint16_t *beta, Bufs b,
       int extras, L2Rows lq, L2Rows lk) {
    using Lay = PrepL<K, V>;
    constexpr int LK = K + PAD, LV = V + PAD;
    constexpr int GS = gstride(K);
    DRC_SMEM(float, sm);
    const int HV = G.HV, tid = threadIdx.x, warp = tid >> 5;
    /* the block's RR value heads hv .. hv + RR - 1 share k, q, beta and the gate, so everything but
     * U does not depend on the head: made and stored once for them (rows os, HW heads a row:
     * shared_row); U for each head, from its v */
    const int RR = SH ? G.vsh : 1, HW = shared_heads(G);
    const int64_t c = blockIdx.x / (HV / RR);
    const int hv = (int)(blockIdx.x % (HV / RR)) * RR, h = hv / G.grp;
    const Chunk ch = chunk_at(G, c);
    const int L = ch.L;
    const int64_t r0 = ch.r0, ot = r0 * HV + hv, os = shared_row(G, r0, hv);
    float *sG = sm, *sb = sG + 64 * GS, *sA = sb + 64, *sY = sA + 64 * LDF, *sR = sY + 64 * LDF;
    unsigned char *B8 = (unsigned char *)sm;
    uint16_t *sK = (uint16_t *)(B8 + Lay::F32), *sV = sK + 64 * LK, *sQ = sV + 64 * LV;
    unsigned char *scr = B8 + Lay::F32 + Lay::RAW;
    const Sp sAi{(uint16_t *)scr, 64 * 72};
    const Sp sKg{(uint16_t *)(scr + 2 * tile_bytes(64, 64)), 64 * LK};

    /* the gate, k and q by cp.async in one group, all in flight at once (the block is alone on its
     * multiprocessor: loads waited for one after another left it idle); v in a second group, in
     * flight through the gated products and the inverse (waited for before U) */
    gate_load_async<K, NTH>(g + os * K, (int64_t)HW * K, L, sG);
    mm::load_raw_async<64, K, NTH>(sK, k + (r0 * G.H + h) * K, (int64_t)G.H * K, L);
    mm::load_raw_async<64, K, NTH>(sQ, q + (r0 * G.H + h) * K, (int64_t)G.H * K, L);
    cp_async_commit();
    mm::load_raw_async<64, V, NTH>(sV, v + ot * V, (int64_t)HV * V, L);
    cp_async_commit();
    if (tid < 64) sb[tid] = tid < L ? op2f(beta[shared_row(G, r0 + tid, hv)]) : 0.0f;
    cp_async_wait_1(); /* the gate, k, q */
    bsync();
    l2norm_tile_rows<K, DRC_OPERAND_F16 != 0, NTH>(lk, G, sK, LK, r0, L, hv);
    l2norm_tile_rows<K, DRC_OPERAND_F16 != 0, NTH>(lq, G, sQ, LK, r0, L, hv);
    const int narrow = gate_scan<K>(sG, sR);
    const Gate gt{sG, sR, !bsync_or(narrow)};
    if (tid < K) b.Gl[shared_row(G, c, hv) * K + tid] = sG[63 * GS + tid];
    { /* P = scale lower_incl(M') and Qg = scale Q o e^G (split): the output pass's operands, out
       * as 16-byte vectors of eight columns (stored a word at a time, these and Kd below were a
       * store instruction and its 64-bit address arithmetic an element) */
        gated_tri<K, false, NTH>(sQ, sK, gt, sY, scr);
        bsync();
        for (int e = tid; e < L * 8; e += NTH) {
            const int i = e >> 3, j = (e & 7) * 8;
            const int64_t o = (os + (int64_t)i * HW) * 64 + j;
            float x[8];
#pragma unroll
            for (int u = 0; u < 8; u++) x[u] = G.scale * sY[i * LDF + j + u];
            mm::split8(x, *(uint4 *)(b.Ph + o), *(uint4 *)(b.Pl + o));
        }
        for (int e = tid; e < L * (K / 8); e += NTH) {
            const int i = e / (K / 8), cc = (e % (K / 8)) * 8;
            const int64_t o = (os + (int64_t)i * HW) * K + cc;
            float x[8], gi[8];
            mm::op8(sQ + i * LK + cc, x), mm::f8(sG + i * GS + cc, gi);
#pragma unroll
            for (int u = 0; u < 8; u++) x[u] = G.scale * x[u] * kexp(gi[u]);
            mm::split8(x, *(uint4 *)(b.Qgh + o), *(uint4 *)(b.Qgl + o));
        }
        bsync();
    }
    gated_tri<K, true, NTH, false>(sK, sK, gt, sA, scr); /* the key-side factors of P's product */
    bsync();
    for (int e = tid; e < 64 * 16; e += NTH) {  /* four columns a thread: Mkk out (16-byte vectors), then */
        const int i = e >> 4, j = (e & 15) * 4; /* A = diag(beta) M; tri_inv's output starts at zero */
        float *r = sA + i * LDF + j, *y = sY + i * LDF + j;
        if (extras && i < L) *(float4 *)(b.Mkk + (os + (int64_t)i * HW) * 64 + j) = make_float4(r[0], r[1], r[2], r[3]);
#pragma unroll
        for (int u = 0; u < 4; u++) r[u] *= sb[i], y[u] = 0.0f;
    }
    bsync();
    static_assert(LDF == mm::TRI_LD, "tri_inv's layout");
    mm::tri_inv<NTH>(sA, sY, L, 1);
    if (extras) mm::tri_rows_out<NTH>(b.Ai + os * 64, (int64_t)HW * 64, sY, L);
    /* Ai' = Ai diag(beta), K o e^G: split tiles (over the scratch of gated_tri) */
    for (int e = tid; e < 64 * 8; e += NTH) { /* eight columns a thread (sY's rows are not 16-byte aligned) */
        const int i = e >> 3, j = (e & 7) * 8;
        float x[8], bj[8];
        mm::f8(sb + j, bj);
#pragma unroll
        for (int u = 0; u < 8; u++) x[u] = sY[i * LDF + j + u] * bj[u];
        mm::split8(x, *(uint4 *)(sAi.hi + i * 72 + j), *(uint4 *)(sAi.lo() + i * 72 + j));
    }
    for (int e = tid; e < 64 * (K / 8); e += NTH) {
        const int i = e / (K / 8), cc = (e % (K / 8)) * 8;
        float kv[8], x[8], gl[8], gi[8];
        gated8<!DRC_OPERAND_F16, false>(sKg, i * LK + cc, sK + i * LK + cc, sG + i * GS + cc, nullptr, 1.0f, kv);
        if (i < L) { /* Kd = K o e^{Gl - G} */
            const int64_t o = (os + (int64_t)i * HW) * K + cc;
            mm::f8(sG + 63 * GS + cc, gl), mm::f8(sG + i * GS + cc, gi);
#pragma unroll
            for (int u = 0; u < 8; u++) x[u] = kv[u] * kexp(gl[u] - gi[u]);
            uint4 hh, ll;
            mm::split8(x, hh, ll);
            *(uint4 *)(b.Kdh + o) = hh;
            if (!KPlain::Kd) *(uint4 *)(b.Kdl + o) = ll;
        }
    }
    cp_async_wait_all(); /* v */
    bsync();
    { /* W = Ai' (K o e^G) */
        using T = WT<64, K, NTH / 32>;
        float acc[1][T::NT][4];
        mm::acc_zero(acc);
        const int m0 = T::m0(warp), n0 = T::n0(warp);
        mm::mma_ss<1, T::NT, false, true>(acc, sAi, 72, m0, sKg, LK, n0, 64);
        mm::frag_pairs(acc, m0, n0, [&](int i, int j, float x0, float x1) {
            if (i < L) mm::put_pair_global<!KPlain::W>(b.Wh, b.Wl, (os + (int64_t)i * HW) * K + j, x0, x1);
        });
    }
#pragma unroll 1
    for (int hr = 0; hr < RR; hr++) { /* U = Ai' V of head hv + hr */
        if (hr) {                     /* its v, once every warp is past its reads of the last head's */
            bsync();
            mm::load_raw<64, V, NTH>(sV, v + (ot + hr) * V, (int64_t)HV * V, L);
            bsync();
        }
        using T = WT<64, V, NTH / 32>;
        float acc[1][T::NT][4];
        mm::acc_zero(acc);
        const int m0 = T::m0(warp), n0 = T::n0(warp);
        mm::mma_sr<1, T::NT, false, true>(acc, sAi, 72, m0, sV, LV, n0, 64);
        const int64_t ou = ot + hr;
        mm::frag_pairs(acc, m0, n0, [&](int i, int j, float x0, float x1) {
            if (i >= L) return;
            if (KPlain::U) *(uint32_t *)((uint16_t *)b.U + (ou + (int64_t)i * HV) * V + j) = mm::pack_op2(x0, x1);
            else *(float2 *)(b.U + (ou + (int64_t)i * HV) * V + j) = make_float2(x0, x1);
        });
    }
}

/* Whether ks prefetches (cp.async) the next chunk's W, Kd, U and Gl into a second set of tiles
 * while it works on this one, as the head-gate state pass (dr_chunk_mma_fwd.cu, state_prefetch):
 * with 32 value columns a block (S2), W, Kd and U plain */
template <int BV> constexpr bool ks_prefetch() { return BV == 32 && KPlain::W && KPlain::Kd && KPlain::U; }

/* W, then Kd, share one split tile, so that two blocks fit on a multiprocessor; with the prefetch
 * two sets of (Gl, W, Kd, U), still two blocks per SM at BV = 32 */
template <int K, int BV, bool PF = false> struct StateL {
    static constexpr int SET = 2 * tile_bytes(64, K) + tile_bytes(64, BV); /* PF: W, Kd, U */
    static constexpr int bytes = PF ? 2 * K * 4 + 2 * SET + 2 * tile_bytes(K, BV) + 2 * tile_bytes(64, BV)
                                    : K * 4 + 2 * tile_bytes(64, K) + 2 * tile_bytes(K, BV) + 2 * tile_bytes(64, BV);
};

/* block per (sequence, value head, tile of BV value columns v0 .. v0 + BV - 1; BV = state_bv, 64 or
 * 32): the columns of S and V' are independent, so V = 128 runs as two (or four) blocks per
 * (sequence, head) (256 blocks at S1 instead of 128, two per multiprocessor; 128 of 32 columns
 * at S2), as the head-gate state pass (dr_chunk_mma_fwd.cu) */
template <int K, int V, int BV>
__global__ void __launch_bounds__(FNT, 2) ks(Geom G, Bufs b, const float *h0, float *hT) {
    constexpr int NVT = V / BV, LK = K + PAD, LB = BV + PAD;
    constexpr bool PF = ks_prefetch<BV>();
    using Lay = StateL<K, BV, PF>;
    DRC_SMEM(float, sm);
    const int HV = G.HV, HW = shared_heads(G), warp = threadIdx.x >> 5, tid = threadIdx.x, lane = tid & 31,
              gq = lane >> 2, tq = lane & 3;
    const int64_t n = chain_seq(G, blockIdx.x / (HV * NVT));
    const int hv = (int)(blockIdx.x / NVT % HV), v0 = (int)(blockIdx.x % NVT) * BV;
    /* Gl [K] (PF: two), then W / Kd split (PF: two sets of plain W, Kd, U), S split, V' split */
    unsigned char *base = (unsigned char *)(sm + (PF ? 2 * K : K));
    const Sp sS{(uint16_t *)(base + (PF ? 2 * Lay::SET : 2 * tile_bytes(64, K))), K * LB};
    const Sp sVn{sS.hi + 2 * K * LB, 64 * LB};
    using TS = WT<K, BV>;
    using TV = WT<64, BV>;
    const int sm0 = TS::m0(warp), sn0 = TS::n0(warp), vm0 = TV::m0(warp), vn0 = TV::n0(warp);
    float S[1][TS::NT][4];
    const int64_t hb = (n * HV + hv) * (int64_t)K * V + v0;
    mm::frag_each(S, sm0, sn0, [&](int r, int j, float &x) { x = h0 ? h0[hb + (int64_t)r * V + j] : 0.0f; });
    int64_t c0, c1;
    seq_chunks(G, n, c0, c1);
    auto issue = [&](int64_t cc,
                     int st) { /* PF: chunk cc's W, Kd, U, Gl into set st */
                               const Chunk x = seq_chunk(G, n, c0, cc);
                               const int64_t xo = x.r0 * HV + hv, xs = shared_row(G, x.r0, hv);
                               uint16_t *t = (uint16_t *)(base + st * Lay::SET);
                               mm::load_raw_async<64, K>(t, b.Wh + xs * K, (int64_t)HW * K, x.L);
                               mm::load_raw_async<64, K>(t + 64 * LK, b.Kdh + xs * K, (int64_t)HW * K, x.L);
                               mm::load_raw_async<64, BV>(t + 2 * 64 * LK, (const uint16_t *)b.U + xo * V + v0,
                                                          (int64_t)HV * V, x.L);
                               if (tid < K / 4)
                                   cp_async16(sm + st * K + 4 * tid, b.Gl + shared_row(G, cc, hv) * K + 4 * tid, true);
                               cp_async_commit();
    };
    if (PF && c0 < c1) issue(c0, 0);
    for (int64_t c = c0; c < c1; c++) {
        const Chunk ch = seq_chunk(G, n, c0, c);
        const int L = ch.L;
        const int64_t ot = ch.r0 * HV + hv, os = shared_row(G, ch.r0, hv);
        const int st = PF ? (int)((c - c0) & 1) : 0;
        float *sGl = sm + st * K;
        uint16_t *set = (uint16_t *)(base + st * Lay::SET);
        const Sp sX{set, 64 * LK};              /* W, then Kd (PF: W; Kd in the next tile) */
        const uint16_t *sU = set + 2 * 64 * LK; /* PF */
        if (PF) cp_async_wait_all();            /* this chunk's set; the barrier below shows it to the block */
        else {
            if (KPlain::W) mm::load_raw<64, K>(sX.hi, b.Wh + os * K, (int64_t)HW * K, L);
            else mm::load_split<64, K>(sX, b.Wh + os * K, b.Wl + os * K, (int64_t)HW * K, L);
            if (tid < K) sGl[tid] = b.Gl[shared_row(G, c, hv) * K + tid];
        }
        /* the state entering the chunk: split into shared memory, then out as 16-byte vectors */
        const int64_t sb = (c * HV + hv) * (int64_t)K * V + v0;
        /* (lo words where read: by the backward, not by SChain's W S) */
        mm::frag_put_sp(S, sm0, sn0, sS, LB, b.Sl || !KPlain::SChain);
        bsync();
        if (PF && c + 1 < c1) issue(c + 1, st ^ 1); /* the other set was last read before the previous step's end */
        mm::store_raw<K, BV>(b.Sh + sb, V, sS.hi);
        if (b.Sl) mm::store_raw<K, BV>(b.Sl + sb, V, sS.lo()); /* (for the backward) */
        { /* V' = U - W S; this thread's U pairs are loaded before the product */
            float2 u[TV::NT][2];
#pragma unroll
            for (int nt = 0; nt < TV::NT; nt++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int i = vm0 + gq + 8 * hh, j = vn0 + nt * 8 + 2 * tq;
                    const int64_t off = (ot + (int64_t)i * HV) * V + v0 + j;
                    if (i >= L) u[nt][hh] = make_float2(0.0f, 0.0f);
                    else if (PF) {
                        const uint32_t w = *(const uint32_t *)(sU + i * LB + j);
                        u[nt][hh] = make_float2(op2f((uint16_t)w), op2f((uint16_t)(w >> 16)));
                    } else if (KPlain::U) {
                        const uint32_t w = *(const uint32_t *)((const uint16_t *)b.U + off);
                        u[nt][hh] = make_float2(op2f((uint16_t)w), op2f((uint16_t)(w >> 16)));
                    } else u[nt][hh] = *(const float2 *)(b.U + off);
                }
            float acc[1][TV::NT][4];
            mm::acc_zero(acc);
            mm::mma_p<1, TV::NT, false, true, !KPlain::W, !KPlain::SChain>(acc, sX, LK, vm0, sS, LB, vn0, K);
#pragma unroll
            for (int nt = 0; nt < TV::NT; nt++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int i = vm0 + gq + 8 * hh, j = vn0 + nt * 8 + 2 * tq;
                    float y0 = 0.0f, y1 = 0.0f;
                    if (i < L) {
                        y0 = u[nt][hh].x - acc[0][nt][2 * hh], y1 = u[nt][hh].y - acc[0][nt][2 * hh + 1];
                        mm::put_pair_global<!KPlain::Vn>(b.Vnh, b.Vnl, (ot + (int64_t)i * HV) * V + v0 + j, y0, y1);
                    }
                    mm::put_sp2<!KPlain::Vn>(sVn, LB, i, j, y0, y1);
                }
        }
        bsync();
        const Sp sKd = PF ? Sp{set + 64 * LK, 0} : sX; /* PF: prefetched with W */
        if (!PF && KPlain::Kd) mm::load_raw<64, K>(sX.hi, b.Kdh + os * K, (int64_t)HW * K, L); /* W is dead */
        else if (!PF) mm::load_split<64, K>(sX, b.Kdh + os * K, b.Kdl + os * K, (int64_t)HW * K, L);
        /* S <- diag(e^{Gl}) S + Kd^T V' */
        mm::frag_each(S, sm0, sn0, [&](int r, int, float &x) { x *= kexp(sGl[r]); });
        bsync();
        mm::mma_p<1, TS::NT, true, true, !KPlain::Kd, !KPlain::Vn>(S, sKd, LK, sm0, sVn, LB, sn0, 64);
        bsync();
    }
    if (hT) mm::frag_each(S, sm0, sn0, [&](int r, int j, float &x) { hT[hb + (int64_t)r * V + j] = x; });
}

/* Qg split, P split, S, V' (one word each where plain) */
template <int K, int V> struct OutL {
    static constexpr int S = (KPlain::OutS ? 1 : 2) * tile_bytes(K, V);
    static constexpr int bytes =
        2 * tile_bytes(64, K) + 2 * tile_bytes(64, 64) + S + (KPlain::Vn ? 1 : 2) * tile_bytes(64, V);
};

/* block per (chunk, value head): every operand made by prep and the state pass, loaded at once */
template <int K, int V> __global__ void __launch_bounds__(FNT, 2) ko(Geom G, Bufs b, uint16_t *o) {
    constexpr int LK = K + PAD, LV = V + PAD;
    DRC_SMEM(uint16_t, sm);
    const int HV = G.HV, warp = threadIdx.x >> 5;
    const int64_t c = blockIdx.x / HV;
    const int hv = (int)(blockIdx.x % HV);
    const Chunk ch = chunk_at(G, c);
    const int L = ch.L;
    const int64_t ot = ch.r0 * HV + hv, os = shared_row(G, ch.r0, hv), sb = (c * HV + hv) * (int64_t)K * V;
    const int64_t HW = shared_heads(G); /* heads a row of Qg, P */
    const Sp sQg{sm, 64 * LK};
    const Sp sP{sm + 2 * 64 * LK, 64 * 72};
    const Sp sS{sP.hi + 2 * 64 * 72, K * LV};
    const Sp sVn{(uint16_t *)((unsigned char *)sS.hi + OutL<K, V>::S), 64 * LV};
    mm::load_sp_async<64, K, true>(sQg, b.Qgh + os * K, b.Qgl + os * K, HW * K, L);
    mm::load_sp_async<64, 64, true>(sP, b.Ph + os * 64, b.Pl + os * 64, HW * 64, L);
    mm::load_sp_async<K, V, !KPlain::OutS>(sS, b.Sh + sb, KPlain::OutS ? nullptr : b.Sl + sb, V, K);
    mm::load_sp_async<64, V, !KPlain::Vn>(sVn, b.Vnh + ot * V, b.Vnl + ot * V, (int64_t)HV * V, L);
    cp_async_commit();
    cp_async_wait_all();
    bsync();
    using T = WT<64, V>;
    float acc[1][T::NT][4];
    mm::acc_zero(acc);
    const int m0 = T::m0(warp), n0 = T::n0(warp);
    mm::mma_p<1, T::NT, false, true, true, !KPlain::OutS>(acc, sQg, LK, m0, sS, LV, n0, K);
    mm::mma_p<1, T::NT, false, true, true, !KPlain::Vn>(acc, sP, 72, m0, sVn, LV, n0, 64);
    mm::frag_pairs(acc, m0, n0, [&](int i, int j, float x0, float x1) {
        if (i < L) *(uint32_t *)(o + (ot + (int64_t)i * HV) * V + j) = mm::pack_op2(x0, x1);
    });
}

template <int K, int V> int prep_state_t(const Plan &p, const Io<uint16_t> &io, const Bufs &b, int extras) {
    static_assert(PrepL<K, V>::bytes <= SMEM_MAX && StateL<K, 64>::bytes <= SMEM_MAX / 2 &&
                      StateL<K, 32, ks_prefetch<32>()>::bytes <= SMEM_MAX / 2,
                  "shared memory");
    const Geom &G = p.G;
    const int l2 = io.l2k != nullptr;
    const auto prep = [&](auto sh) { /* sh: std::bool_constant, kp's SH */
                                     constexpr bool SH = decltype(sh)::value;
                                     return DRC_LAUNCH("dr_chunk kda prep", (kp<K, V, ONE_SM_NTH, SH>),
                                                       G.nchunks * G.HV / (SH ? G.vsh : 1), ONE_SM_NTH,
                                                       (size_t)(PrepL<K, V>::bytes), G, io.q, io.k, io.v, io.g, io.beta,
                                                       b, extras, L2Rows{io.l2q, io.l2rq, io.l2eps, l2},
                                                       L2Rows{io.l2k, io.l2rk, io.l2eps, l2});
    };
    int rc = G.vsh > 1 ? prep(std::true_type{}) : prep(std::false_type{});
    if (!rc && mm::state_bv(G) == 32)
        rc = DRC_LAUNCH("dr_chunk kda state", (ks<K, V, 32>), G.N * G.HV * (V / 32), FNT,
                        (size_t)(StateL<K, 32, ks_prefetch<32>()>::bytes), G, b, io.h0, io.hT);
    else if (!rc)
        rc = DRC_LAUNCH("dr_chunk kda state", (ks<K, V, 64>), G.N * G.HV * (V / 64), FNT,
                        (size_t)(StateL<K, 64>::bytes), G, b, io.h0, io.hT);
    return rc;
}

template <int K, int V> int out_t(const Plan &p, const Io<uint16_t> &io, const Bufs &b) {
    static_assert(OutL<K, V>::bytes <= SMEM_MAX / 2, "shared memory: two blocks a multiprocessor");
    const Geom &G = p.G;
    return DRC_LAUNCH("dr_chunk kda out", (ko<K, V>), G.nchunks * G.HV, FNT, (size_t)(OutL<K, V>::bytes), G, b, io.o);
}

} // namespace

int prep_state(const Plan &p, const Io<uint16_t> &io, const Bufs &b, int extras) {
    const Geom &G = p.G;
    return G.K == 64 ? (G.V == 64 ? prep_state_t<64, 64>(p, io, b, extras) : prep_state_t<64, 128>(p, io, b, extras))
                     : (G.V == 64 ? prep_state_t<128, 64>(p, io, b, extras) : prep_state_t<128, 128>(p, io, b, extras));
}

void carve(const Geom &G, Carve &cv, Bufs &b, bool bwd) {
    /* what does not depend on V: once for the G.vsh heads that share it (shared_row) */
    const int64_t HW = shared_heads(G), nk = G.rows * HW * G.K, n64 = G.rows * HW * 64;
    const int64_t nv = G.rows * G.HV * G.V, nst = G.nchunks * G.HV * G.K * G.V;
    memset(&b, 0, sizeof b); /* plain operands keep NULL lo pointers */
    b.Wh = cv.take<uint16_t>(nk);
    if (!KPlain::W) b.Wl = cv.take<uint16_t>(nk);
    b.Kdh = cv.take<uint16_t>(nk);
    if (!KPlain::Kd) b.Kdl = cv.take<uint16_t>(nk);
    b.U = cv.take<float>(KPlain::U ? (nv + 1) / 2 : nv);
    b.Gl = cv.take<float>(G.nchunks * HW * G.K);
    b.Vnh = cv.take<uint16_t>(nv);
    if (!KPlain::Vn) b.Vnl = cv.take<uint16_t>(nv);
    b.Sh = cv.take<uint16_t>(nst);
    b.Qgh = cv.take<uint16_t>(nk), b.Qgl = cv.take<uint16_t>(nk);
    b.Ph = cv.take<uint16_t>(n64), b.Pl = cv.take<uint16_t>(n64);
    static_assert(KPlain::OutS, "a forward alone makes no lo words of S for the output pass to read");
    if (bwd) { /* what only the backward reads: the output pass reads S's hi words (KPlain::OutS) */
        b.Sl = cv.take<uint16_t>(nst);
        b.Ai = cv.take<float>(n64), b.Mkk = cv.take<float>(n64);
    }
}

/* keep: the backward's working set is made (prep with its extras) into keep and left there */
int fwd(const Plan &p, const Io<uint16_t> &io, void *keep) {
    const Geom &G = p.G;
    const bool bwd = keep != nullptr;
    Bufs b;
    bool ok;
    char *own = carve_into(
        keep, [&](Carve &cv) { carve(G, cv, b, bwd); }, &ok);
    if (!ok) return -1;
    int rc = prep_state(p, io, b, bwd ? 1 : 0);
    if (!rc)
        rc = G.K == 64 ? (G.V == 64 ? out_t<64, 64>(p, io, b) : out_t<64, 128>(p, io, b))
                       : (G.V == 64 ? out_t<128, 64>(p, io, b) : out_t<128, 128>(p, io, b));
    release(own);
    return rc;
}

} // namespace DRC_KDA

#if !DRC_OPERAND_F16 /* the same for both operand formats: defined once, in the bf16 build */
bool kda_ok(const Geom &G) {
    return G.C == 64 && G.gate == DG_GATE_CHANNEL && (G.K == 64 || G.K == 128) && (G.V == 64 || G.V == 128);
}

size_t kda_kept_bytes(const Geom &G) {
    kda::Bufs b;
    return carve_bytes([&](Carve &cv) { kda::carve(G, cv, b, true); });
}
#endif

} // namespace drc
