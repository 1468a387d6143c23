/* The tensor-core chunked delta-rule forward (bf16 storage, gate NONE or HEAD, chunk 64, K and V
 * in {64, 128}); the building blocks are in dr_chunk_mma.cuh.  Same math as the generic kernels
 * (dr_chunk_generic.cuh), per chunk of L <= 64 rows, value head hv, G the cumulative head gate:
 *   prep   (block per chunk, head):  A = diag(beta) strictly_lower(K K^T o Gamma)  [mma, exact]
 *          Ai = (I + A)^-1     [f32: diagonal blocks by substitution, merges on tensor cores]
 *          W = (Ai diag(beta e^G)) K,  U = (Ai diag(beta)) V   [mma, Ai' split]
 *   state  (block per sequence, head, tile of BV = 64 value columns; chunks in order; S in
 *          registers):
 *          V' = U - W S                                        [mma, S's hi words]
 *          S <- e^{G_last} S + K^T (e^{G_last - G} o V')       [mma]
 *          stores S (entering each chunk, split) and V'
 *   out    (block per chunk, head, all V value columns):  O = scale e^G o (Q S) + P V',
 *          P = scale lower_incl(Q K^T o Gamma)                 [mma; P split, S and V' hi only]
 * W, U and V' are plain bf16 (Plain<GATE>, dr_chunk_mma.cuh: for both gates; U
 * instead of f32): one word stored, one mma pass less for each of them in every product.
 * Also the recompute of the backward (prep with Ai stored, the state pass without hT).
 * Heads of one beta and gate (Geom::vsh > 1, a head split by V, dr_chunk_vsplit.cu): a prep block
 * makes A, Ai and W once for the G.vsh heads (U for each; W, Ai and the gate stored for each), an out
 * block P once (O for each).
 * With the L2 norm in the forward (Io::l2k), prep normalises the raw k as it loads it and out the
 * raw q (dr_chunk_l2norm.cuh); the state pass and out read the normalised k that prep wrote. */
#include <type_traits>

#include "kernels/cuda/delta/dr_chunk_l2norm.cuh"
#include "kernels/cuda/delta/dr_chunk_mma.cuh"
#include "kernels/cuda/delta/dr_chunk_tri_inv.cuh"

namespace drc {
namespace DRC_FAST {
namespace {

constexpr int LDF = 65; /* row stride of the f32 64 x 64 matrices */

/* rows r0 .. r0 + L - 1 of the tile at s, key head h, normalised in place where l2.on (the
 * block's FNT threads; dr_chunk_l2norm.cuh) */
template <int K>
__device__ __forceinline__ void l2norm_tile_on(const L2Rows &l2, const Geom &G, uint16_t *s, int64_t r0, int L,
                                               int hv) {
    l2norm_tile_rows<K, DRC_OPERAND_F16 != 0, FNT>(l2, G, s, K + PAD, r0, L, hv);
}

static_assert(LDF == TRI_LD, "the layout of tri_inv (dr_chunk_tri_inv.cuh)");

template <int K, int V> struct PrepSmem {
    static_assert(64 * K * 2 <= 64 * LDF * 4 && 64 * V <= 3 * 64 * LDF, "W, U staging in sA, sY, sT");
    static constexpr int f32s = 3 * 64 * LDF + 2 * 64;
    static constexpr int bytes = f32s * 4 + tile_bytes(64, K) + tile_bytes(64, V) + 2 * tile_bytes(64, 64);
};

/* SH: the block takes the G.vsh heads of one beta and gate; else one head (its own instance: a
 * loop over a run-time count of heads made the one-head prep 7 % slower at S1, H200) */
template <int K, int V, int GATE, bool SH>
__global__ void __launch_bounds__(FNT, 2) /* two blocks per SM (shared memory allows two at K = V = 128) */
    f_prep(Geom G, const uint16_t *k, const uint16_t *v, const float *g, const uint16_t *beta, FastBufs b, int blocked,
           int store_ai, L2Rows l2) {
    constexpr bool PW = Plain<GATE>::W, PU = Plain<GATE>::U; /* plain bf16 */
    DRC_SMEM(float, sm);
    const int HV = G.HV, tid = threadIdx.x, warp = tid >> 5;
    /* the block's RR = G.vsh value heads hv .. hv + RR - 1 share beta and the gate, so A, Ai and W:
     * made once, stored for each head; U for each */
    const int RR = SH ? G.vsh : 1;
    const int64_t c = blockIdx.x / (HV / RR);
    const int hv = (int)(blockIdx.x % (HV / RR)) * RR, h = hv / G.grp;
    const Chunk ch = chunk_at(G, c);
    const int L = ch.L;
    const int64_t r0 = ch.r0;
    float *sA = sm, *sY = sA + 64 * LDF, *sT = sY + 64 * LDF, *sG = sT + 64 * LDF, *sb = sG + 64;
    uint16_t *sK = (uint16_t *)(sb + 64), *sV = sK + 64 * (K + PAD);
    const Sp sAs{sV + 64 * (V + PAD), 64 * (64 + PAD)};
    /* the gate (warp 0: rows lane, 32 + lane), its loads in flight beside those of v and k */
    const int lane = tid & 31;
    float x0 = 0.0f, x1 = 0.0f;
    if (GATE == DG_GATE_HEAD && warp == 0) {
        if (lane < L) x0 = g[shared_row(G, r0 + lane, hv)];
        if (32 + lane < L) x1 = g[shared_row(G, r0 + 32 + lane, hv)];
    }
    /* v by cp.async, in flight through K K^T and the inverse (waited for before U) */
    load_raw_async<64, V>(sV, v + (r0 * HV + hv) * V, (int64_t)HV * V, L);
    cp_async_commit();
    load_raw<64, K>(sK, k + (r0 * G.H + h) * K, (int64_t)G.H * K, L);
    if (GATE == DG_GATE_HEAD && warp == 0) { /* G = cumsum(g) over the chunk, to Gc and (rows >= L
                                              * holding G_{L-1}, as load_gate_beta) to sG */
        const float s0 = warp_scan(x0, lane), s1 = warp_scan(x1, lane) + shfl_idx(s0, 31);
        const float last = L <= 32 ? shfl_idx(s0, L - 1) : shfl_idx(s1, L - 33);
        for (int r = 0; r < RR; r++) {
            if (lane < L) b.Gc[(r0 + lane) * HV + hv + r] = s0;
            if (32 + lane < L) b.Gc[(r0 + 32 + lane) * HV + hv + r] = s1;
        }
        sG[lane] = lane < L ? s0 : last, sG[32 + lane] = 32 + lane < L ? s1 : last;
    } else if (GATE != DG_GATE_HEAD && tid < FC) {
        sG[tid] = 0.0f;
    }
    if (tid < FC) sb[tid] = tid < L ? op2f(beta[shared_row(G, r0 + tid, hv)]) : 0.0f;
    for (int e = tid; e < 64 * LDF; e += FNT) sY[e] = 0.0f;
    bsync();
    l2norm_tile_on<K>(l2, G, sK, r0, L, hv);
    { /* A = diag(beta) strictly_lower(K K^T o Gamma) */
        using T = WT<64, 64>;
        float acc[1][T::NT][4];
        acc_zero(acc);
        const int m0 = T::m0(warp), n0 = T::n0(warp);
        mma_run<1, T::NT, false, false>(acc, sK, K + PAD, m0, sK, K + PAD, n0, K);
        frag_each(acc, m0, n0, [&](int i, int j, float &x) {
            float a = 0.0f;
            if (j < i && i < L) {
                a = x * sb[i];
                if (GATE == DG_GATE_HEAD) a *= expf(sG[i] - sG[j]);
            }
            sA[i * LDF + j] = a;
        });
    }
    bsync();
    tri_inv(sA, sY, L, blocked);
    if (store_ai)
        for (int e = tid; e < L * 64; e += FNT) {
            int i = e / 64, j = e % 64;
            for (int r = 0; r < RR; r++) b.Ai[((r0 + i) * HV + hv + r) * 64 + j] = sY[i * LDF + j];
        }
    /* W = (Ai diag(beta e^G)) K  (this thread's elements all lie in column tid % 64) */
    const int jc = tid & 63;
    const float bj = sb[jc], ej = GATE == DG_GATE_HEAD ? expf(sG[jc]) : 1.0f;
#pragma unroll 4
    for (int i = tid >> 6; i < 64; i += FNT / 64) {
        float x = sY[i * LDF + jc] * bj;
        if (GATE == DG_GATE_HEAD) x *= ej;
        split2(x, sAs.hi[i * 72 + jc], sAs.lo()[i * 72 + jc]);
    }
    bsync();
    {
        using T = WT<64, K>;
        float acc[1][T::NT][4];
        acc_zero(acc);
        const int m0 = T::m0(warp), n0 = T::n0(warp);
        mma_sr<1, T::NT, false, true>(acc, sAs, 72, m0, sK, K + PAD, n0, 64);
        /* staged split in sA, sT (dead after tri_inv; plain: sA only), rows of K unpadded with the
         * 16-byte chunks swizzled (chunk c of row i at c ^ (i & 7): conflict-free), then stored as
         * vectors */
        frag_pairs(acc, m0, n0, [&](int i, int j, float x0, float x1) {
            const int o = i * K + (((j >> 3) ^ (i & 7)) << 3) + (j & 7);
            if (PW) {
                *(uint32_t *)((uint16_t *)sA + o) = pack_op2(x0, x1);
                return;
            }
            uint16_t h0, l0, h1, l1;
            split2(x0, h0, l0);
            split2(x1, h1, l1);
            *(uint32_t *)((uint16_t *)sA + o) = (uint32_t)h0 | ((uint32_t)h1 << 16);
            *(uint32_t *)((uint16_t *)sT + o) = (uint32_t)l0 | ((uint32_t)l1 << 16);
        });
    }
    bsync();
    for (int e = tid; e < L * (K / 8); e += FNT) {
        const int r = e / (K / 8), c8 = e % (K / 8), o = r * K + ((c8 ^ (r & 7)) << 3);
        const uint4 wh = *(const uint4 *)((const uint16_t *)sA + o), wl = *(const uint4 *)((const uint16_t *)sT + o);
        for (int rr = 0; rr < RR; rr++) {
            const int64_t go = ((r0 + r) * HV + hv + rr) * K + c8 * 8;
            *(uint4 *)(b.Wh + go) = wh;
            if (!PW) *(uint4 *)(b.Wl + go) = wl;
        }
    }
    /* U = (Ai diag(beta)) V */
#pragma unroll 4
    for (int i = tid >> 6; i < 64; i += FNT / 64)
        split2(sY[i * LDF + jc] * bj, sAs.hi[i * 72 + jc], sAs.lo()[i * 72 + jc]);
    cp_async_wait_all(); /* v */
    bsync();
#pragma unroll 1
    for (int ru = 0; ru < RR; ru++) {
        if (ru) { /* the next head's v, once every warp is past the last U's staging */
            bsync();
            load_raw<64, V>(sV, v + (r0 * HV + hv + ru) * V, (int64_t)HV * V, L);
            bsync();
        }
        {
            using T = WT<64, V>;
            float acc[1][T::NT][4];
            acc_zero(acc);
            const int m0 = T::m0(warp), n0 = T::n0(warp);
            mma_sr<1, T::NT, false, true>(acc, sAs, 72, m0, sV, V + PAD, n0, 64);
            /* staged in sA, sY, sT (dead now; W's copy above read sA, sT before the last barrier),
             * rows of V floats (plain: V bf16, swizzled as W) with the 16-byte chunks swizzled, then
             * stored as 16-byte vectors */
            frag_pairs(acc, m0, n0, [&](int i, int j, float x0, float x1) {
                if (PU)
                    *(uint32_t *)((uint16_t *)sA + i * V + (((j >> 3) ^ (i & 7)) << 3) + (j & 7)) = pack_op2(x0, x1);
                else *(float2 *)(sA + i * V + (((j >> 2) ^ (i & 7)) << 2) + (j & 3)) = make_float2(x0, x1);
            });
        }
        bsync();
        if (PU) { /* U bf16 [rows, HV, V] in the first half of the f32 buffer b.U */
            uint16_t *Ub = (uint16_t *)b.U;
            for (int e = tid; e < L * (V / 8); e += FNT) {
                const int r = e / (V / 8), c8 = e % (V / 8);
                *(uint4 *)(Ub + ((r0 + r) * HV + hv + ru) * V + c8 * 8) =
                    *(const uint4 *)((const uint16_t *)sA + r * V + ((c8 ^ (r & 7)) << 3));
            }
        } else {
            for (int e = tid; e < L * (V / 4); e += FNT) {
                const int r = e / (V / 4), c4 = e % (V / 4);
                *(uint4 *)(b.U + ((r0 + r) * HV + hv + ru) * V + c4 * 4) =
                    *(const uint4 *)(sA + r * V + ((c4 ^ (r & 7)) << 2));
            }
        }
    }
}

/* a pair (col, col+1) of U as f_state holds it: f32, or two bf16 when plain (converted where used) */
template <bool PL> struct UPair { using type = float2; };
template <> struct UPair<true> { using type = uint32_t; };

/* Whether f_state loads the next chunk's W, K and gate (cp.async, into a second set of tiles)
 * while it works on this one, so that a chunk step waits for no load from device memory; W and U
 * must be plain (one tile each).  With 32 value columns a block (few sequence-heads, S2: 128 chunk
 * steps one after another per block) U is prefetched too (state_prefetch_u), and two sets still
 * leave two blocks per SM.  With 64 (S1) the second set fits beside two blocks per SM only with V'
 * in S's place (state_vn_in_s: one barrier more a step) and U loaded from device memory into
 * registers as without the prefetch.  H100, S2: W and K prefetched, GDN's forward takes 3.5 % less. */
template <int GATE, int BV> constexpr bool state_prefetch() {
    return (BV == 32 || BV == 64) && Plain<GATE>::W && Plain<GATE>::U;
}
template <int GATE, int BV> constexpr bool state_prefetch_u() { return BV == 32 && state_prefetch<GATE, BV>(); }
template <int GATE, int BV> constexpr bool state_vn_in_s() { return BV == 64 && state_prefetch<GATE, BV>(); }

template <int K, int BV, bool PF = false, bool PFU = false, bool VNS = false>
struct StateSmem { /* BV: the value columns of a block (state_bv) */
    static_assert(!VNS || 64 <= K, "V' in S's place");
    static constexpr int bytes = (PF ? 2 * 64 * 4 : 64 * 4) + (PF ? 4 * tile_bytes(64, K) : 3 * tile_bytes(64, K)) +
                                 2 * tile_bytes(K, BV) + (VNS ? 0 : 2 * tile_bytes(64, BV)) +
                                 (PFU ? 2 * tile_bytes(64, BV) : 0);
};
template <int K, int GATE, int BV> constexpr int state_smem() {
    return StateSmem<K, BV, state_prefetch<GATE, BV>(), state_prefetch_u<GATE, BV>(), state_vn_in_s<GATE, BV>()>::bytes;
}

/* block per (sequence, value head, tile of BV value columns v0 .. v0 + BV - 1): the columns of S
 * and V' are independent, so V / BV blocks share a (sequence, head), each loading the same W, K
 * (adjacent block indices, so the second load mostly hits L2) */
template <int K, int V, int GATE, int BV>
__global__ void __launch_bounds__(FNT, 2) f_state(Geom G, const uint16_t *k, FastBufs b, const float *h0, float *hT) {
    constexpr bool PW = Plain<GATE>::W, PU = Plain<GATE>::U, PS = Plain<GATE>::S, PV = Plain<GATE>::Vn;
    constexpr bool PF = state_prefetch<GATE, BV>(), PFU = state_prefetch_u<GATE, BV>(), VNS = state_vn_in_s<GATE, BV>();
    DRC_SMEM(float, sm);
    constexpr int NVT = V / BV, T = 64 * (K + PAD);
    const int HV = G.HV, warp = threadIdx.x >> 5;
    const int64_t n = chain_seq(G, blockIdx.x / (HV * NVT));
    const int hv = (int)(blockIdx.x / NVT % HV), h = hv / G.grp, v0 = (int)(blockIdx.x % NVT) * BV;
    /* the gate [64] (two with the prefetch); W (split: two tiles), K; with the prefetch two sets
     * (plain W, K, and U after V'), chunk c in set c - c0 mod 2 */
    uint16_t *base = (uint16_t *)(sm + (PF ? 128 : 64));
    const Sp sS{base + (PF ? 4 : 3) * T, K * (BV + PAD)};
    const Sp sVn{VNS ? sS.hi : sS.hi + 2 * K * (BV + PAD), 64 * (BV + PAD)};
    uint16_t *sU0 = sS.hi + 2 * K * (BV + PAD) + (VNS ? 0 : 2 * 64 * (BV + PAD)); /* PFU: U of set 0, then of set 1 */
    using TS = WT<K, BV>;
    using TV = WT<64, BV>;
    const int sm0 = TS::m0(warp), sn0 = TS::n0(warp), vm0 = TV::m0(warp), vn0 = TV::n0(warp);
    float S[1][TS::NT][4];
    const int64_t hb = (n * HV + hv) * (int64_t)K * V + v0;
    frag_each(S, sm0, sn0, [&](int r, int j, float &x) { x = h0 ? h0[hb + (int64_t)r * V + j] : 0.0f; });
    int64_t c0, c1;
    seq_chunks(G, n, c0, c1);
    /* this thread's index for the tile copies of a step.  BV = 64: read where used, so that the
     * offsets made from it are not kept live across the step (kept live, they are spilled and
     * reloaded: see tid_fresh); BV = 32 has the registers, and a longer chain of steps (S2: 128)
     * that the offsets' arithmetic would lengthen (H100, S2: about 1 % of the forward) */
    const auto copy_tid = [] { return BV == 64 ? tid_fresh() : (int)threadIdx.x; };
    auto issue = [&](int64_t cc,
                     int pair) { /* the prefetch of chunk cc's W, K, U and gate */
                                 const Chunk x = seq_chunk(G, n, c0, cc);
                                 const int t = copy_tid();
                                 load_raw_async<64, K>(base + 2 * pair * T, b.Wh + (x.r0 * HV + hv) * K,
                                                       (int64_t)HV * K, x.L, t);
                                 load_raw_async<64, K>(base + (2 * pair + 1) * T, k + (x.r0 * G.H + h) * K,
                                                       (int64_t)G.H * K, x.L, t);
                                 if (PFU)
                                     load_raw_async<64, BV>(sU0 + pair * 64 * (BV + PAD),
                                                            (const uint16_t *)b.U + (x.r0 * HV + hv) * V + v0,
                                                            (int64_t)HV * V, x.L, t);
                                 load_gate_async<GATE>(G, x.r0, x.L, hv, b.Gc, sm + 64 * pair, (int)threadIdx.x);
                                 cp_async_commit();
    };
    if (PF && c0 < c1) issue(c0, 0);
    for (int64_t c = c0; c < c1; c++) {
        const Chunk ch = seq_chunk(G, n, c0, c);
        const int L = ch.L;
        const int64_t r0 = ch.r0;
        const int pair = PF ? (int)((c - c0) & 1) : 0;
        float *sG = sm + 64 * pair;
        const uint16_t *sU = sU0 + pair * 64 * (BV + PAD);
        const Sp sW{base + 2 * pair * T, PF ? 0 : T};
        uint16_t *sK = PF ? base + (2 * pair + 1) * T : base + 2 * T;
        /* this thread's U pairs (U from device memory: loaded first, so that their latency passes
         * under the barrier and S's stores; loaded just before W S, they are waited for after it:
         * ncu, H100, S1, 9 % of the stall samples) */
        const int lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
        typename UPair<PU>::type u[TV::NT][2];
        if constexpr (!PFU) {
#pragma unroll
            for (int nt = 0; nt < TV::NT; nt++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int i = vm0 + gq + 8 * hh, j = vn0 + nt * 8 + 2 * tq;
                    const int64_t off = ((r0 + i) * HV + hv) * V + v0 + j;
                    if constexpr (PU) u[nt][hh] = i < L ? *(const uint32_t *)((const uint16_t *)b.U + off) : 0u;
                    else u[nt][hh] = i < L ? *(const float2 *)(b.U + off) : make_float2(0.0f, 0.0f);
                }
        }
        if (PF) cp_async_wait_all(); /* this chunk's pair; the barrier below shows it to the block */
        else {
            load_sp<64, K, !PW>(sW, b.Wh + (r0 * HV + hv) * K, b.Wl + (r0 * HV + hv) * K, (int64_t)HV * K, L);
            load_raw<64, K>(sK, k + (r0 * G.H + h) * K, (int64_t)G.H * K, L);
        }
        if (!PF) load_gate_beta<GATE>(G, r0, L, hv, b.Gc, nullptr, sG, nullptr);
        /* the state entering the chunk: split (or plain), into shared memory and out */
        const int64_t sb = (c * HV + hv) * (int64_t)K * V + v0;
        /* (lo words where read: by the backward, not by SChain's W S) */
        frag_put_sp(S, sm0, sn0, sS, BV + PAD, !PS && (b.Sl || !Plain<GATE>::SChain));
        bsync();
        if (PF && c + 1 < c1) issue(c + 1, pair ^ 1); /* the other pair was last read before the previous step's end */
        {
            const int t = copy_tid();
            store_raw<K, BV>(b.Sh + sb, V, sS.hi, t);
            if (!PS && b.Sl) store_raw<K, BV>(b.Sl + sb, V, sS.lo(), t); /* (for the backward) */
        }
        { /* V' = U - W S;  shared: e^{G_last - G} o V'.  U prefetched into shared memory is read
           * here, before the product (read between the V' stores, it would wait one load after
           * another: the compiler cannot move a load above a store that may alias it) */
            if constexpr (PFU) {
#pragma unroll
                for (int nt = 0; nt < TV::NT; nt++)
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) {
                        const int i = vm0 + gq + 8 * hh, j = vn0 + nt * 8 + 2 * tq;
                        u[nt][hh] = *(const uint32_t *)(sU + i * (BV + PAD) + j); /* 0 past L */
                    }
            }
            /* the gate factors of this thread's two rows, e^{G_last - G_i}, made before the product
             * (read after it, sG waits behind the barrier and the exponentials are made per
             * element: ncu, H100, S1, 8 % of f_state's stall samples on those loads) */
            float eg[2];
            row_decay2<GATE>(sG, vm0, eg);
            float acc[1][TV::NT][4];
            acc_zero(acc);
            mma_p<1, TV::NT, false, true, !PW, !Plain<GATE>::SChain>(acc, sW, K + PAD, vm0, sS, BV + PAD, vn0, K);
            if (VNS) bsync(); /* every warp is past its reads of S: V' takes its place */
#pragma unroll
            for (int nt = 0; nt < TV::NT; nt++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int i = vm0 + gq + 8 * hh, j = vn0 + nt * 8 + 2 * tq;
                    float y0 = 0.0f, y1 = 0.0f;
                    if (i < L) {
                        float2 uu;
                        if constexpr (PU)
                            uu = make_float2(op2f((uint16_t)u[nt][hh]), op2f((uint16_t)(u[nt][hh] >> 16)));
                        else uu = u[nt][hh];
                        y0 = uu.x - acc[0][nt][2 * hh], y1 = uu.y - acc[0][nt][2 * hh + 1];
                        put_pair_global<!PV>(b.Vnh, b.Vnl, ((r0 + i) * HV + hv) * V + v0 + j, y0, y1);
                    }
                    put_sp2<!PV>(sVn, BV + PAD, i, j, eg[hh] * y0, eg[hh] * y1);
                }
        }
        bsync();
        /* S <- e^{G_last} S + K^T (e^{G_last - G} o V') */
        if (GATE == DG_GATE_HEAD) {
            const float d = expf(sG[63]);
            frag_each(S, sm0, sn0, [&](int, int, float &x) { x *= d; });
        }
        mma_p<1, TS::NT, true, true, false, !PV>(S, Sp{sK, 0}, K + PAD, sm0, sVn, BV + PAD, sn0, 64);
        bsync();
    }
    if (hT) frag_each(S, sm0, sn0, [&](int r, int j, float &x) { hT[hb + (int64_t)r * V + j] = x; });
}

template <int K, int OB> struct OutSmem { /* OB: the value columns of a block */
    static constexpr int bytes =
        64 * 4 + 2 * tile_bytes(64, K) + tile_bytes(K, OB) + tile_bytes(64, OB) + 2 * tile_bytes(64, 64);
};

/* block per (chunk, value head, tile of OB value columns; out_cols: all of them, so that
 * each block loads Q, K and makes P once: with S and V' plain two blocks of V = 128 columns still
 * fit on a multiprocessor).  S and V' enter as their hi words only, for both gates
 * (dr_chunk_mma.cuh: o 2.5e-3 against 1.7e-3 split; the lo arrays, where written, are for the
 * backward): Q S takes one mma pass, P V' two (P split). */
template <int V> constexpr int out_cols() { return V; }

template <int K, int V, int GATE, bool SH>
__global__ void __launch_bounds__(FNT, 2)
    f_out(Geom G, const uint16_t *q, const uint16_t *k, FastBufs b, uint16_t *o, L2Rows l2) {
    DRC_SMEM(float, sm);
    constexpr int OB = out_cols<V>(), NVT = V / OB;
    const int HV = G.HV, warp = threadIdx.x >> 5;
    /* SH: the block's RR = G.vsh heads share the gate, so P: made once, then each head's O */
    const int RR = SH ? G.vsh : 1, HB = HV / RR;
    const int64_t c = blockIdx.x / (HB * NVT);
    const int hv0 = (int)(blockIdx.x / NVT % HB) * RR, h = hv0 / G.grp, v0 = (int)(blockIdx.x % NVT) * OB;
    const Chunk ch = chunk_at(G, c);
    const int L = ch.L;
    const int64_t r0 = ch.r0;
    float *sG = sm;
    uint16_t *sQ = (uint16_t *)(sG + 64), *sK = sQ + 64 * (K + PAD);
    uint16_t *sS = sK + 64 * (K + PAD), *sVn = sS + K * (OB + PAD);
    const Sp sP{sVn + 64 * (OB + PAD), 64 * 72};
    /* head hv's S and V' by cp.async */
    const auto load_sv = [&](int hv) {
        load_raw_async<K, OB>(sS, b.Sh + (c * HV + hv) * (int64_t)K * V + v0, V, K);
        load_raw_async<64, OB>(sVn, b.Vnh + (r0 * HV + hv) * V + v0, (int64_t)HV * V, L);
        cp_async_commit();
    };
    /* by cp.async, all in flight at once: Q, K (waited for before P), then S and V' (in flight
     * while P is made, waited for after it).  Q and K loaded through registers were two round
     * trips to memory, one after the other */
    load_raw_async<64, K>(sQ, q + (r0 * G.H + h) * K, (int64_t)G.H * K, L);
    load_raw_async<64, K>(sK, k + (r0 * G.H + h) * K, (int64_t)G.H * K, L);
    cp_async_commit();
    load_sv(hv0);
    load_gate_beta<GATE>(G, r0, L, hv0, b.Gc, nullptr, sG, nullptr);
    cp_async_wait_1(); /* Q, K */
    bsync();
    l2norm_tile_on<K>(v0 == 0 ? l2 : L2Rows{nullptr, nullptr, l2.eps, l2.on}, G, sQ, r0, L, hv0); /* (one writes) */
    const float scale = G.scale;
    { /* P = scale lower_incl(Q K^T o Gamma) */
        using T = WT<64, 64>;
        float acc[1][T::NT][4];
        acc_zero(acc);
        const int m0 = T::m0(warp), n0 = T::n0(warp);
        mma_run<1, T::NT, false, false>(acc, sQ, K + PAD, m0, sK, K + PAD, n0, K);
        store_split<T::NT>(sP, 72, m0, n0, [&](int i, int j, int nt, int qq) {
            if (j > i) return 0.0f;
            float x = scale * acc[0][nt][qq];
            if (GATE == DG_GATE_HEAD) x *= expf(sG[i] - sG[j]);
            return x;
        });
    }
#pragma unroll 1
    for (int r = 0; r < RR; r++) {
        const int hv = hv0 + r;
        if (r) { /* every warp is past its reads of the last head's S, V' */
            bsync();
            load_sv(hv);
        }
        cp_async_wait_all(); /* S, V' */
        bsync();
        using T = WT<64, OB>;
        float acc[1][T::NT][4];
        acc_zero(acc);
        const int m0 = T::m0(warp), n0 = T::n0(warp);
        mma_run<1, T::NT, false, true>(acc, sQ, K + PAD, m0, sS, OB + PAD, n0, K);
        frag_each(acc, m0, n0, [&](int i, int, float &x) { x *= GATE == DG_GATE_HEAD ? scale * expf(sG[i]) : scale; });
        mma_sr<1, T::NT, false, true>(acc, sP, 72, m0, sVn, OB + PAD, n0, 64);
        frag_pairs(acc, m0, n0, [&](int i, int j, float x0, float x1) {
            if (i < L) *(uint32_t *)(o + ((r0 + i) * HV + hv) * V + v0 + j) = pack_op2(x0, x1);
        });
    }
}

template <int K, int V, int GATE>
int prep_state_t(const Plan &p, const Io<uint16_t> &io, const FastBufs &b, int blocked) {
    static_assert(PrepSmem<K, V>::bytes <= SMEM_MAX && state_smem<K, GATE, BV>() + 1024 <= SMEM_MAX / 2 &&
                      state_smem<K, GATE, 32>() + 1024 <= SMEM_MAX / 2 &&
                      OutSmem<K, out_cols<V>()>::bytes + 1024 <= SMEM_MAX / 2,
                  "shared memory (the state pass and out: two blocks per SM)");
    const Geom &G = p.G;
    const L2Rows l2{io.l2k, io.l2rk, io.l2eps, io.l2k != nullptr};
    const auto prep = [&](auto sh) { /* sh: std::bool_constant, f_prep's SH */
                                     return DRC_LAUNCH("dr_chunk mma prep", (f_prep<K, V, GATE, decltype(sh)::value>),
                                                       G.nchunks * G.HV / G.vsh, FNT, (size_t)(PrepSmem<K, V>::bytes),
                                                       G, io.k, io.v, io.g, io.beta, b, blocked, b.Ai ? 1 : 0, l2);
    };
    int rc = G.vsh > 1 ? prep(std::true_type{}) : prep(std::false_type{});
    const uint16_t *kn = io.l2k ? io.l2k : io.k; /* what the later kernels read */
    if (!rc && state_bv(G) == 32)
        rc = DRC_LAUNCH("dr_chunk mma state", (f_state<K, V, GATE, 32>), G.N * G.HV * (V / 32), FNT,
                        (size_t)(state_smem<K, GATE, 32>()), G, kn, b, io.h0, io.hT);
    else if (!rc)
        rc = DRC_LAUNCH("dr_chunk mma state", (f_state<K, V, GATE, BV>), G.N * G.HV * (V / BV), FNT,
                        (size_t)(state_smem<K, GATE, BV>()), G, kn, b, io.h0, io.hT);
    return rc;
}

template <int K, int V, int GATE> int out_t(const Plan &p, const Io<uint16_t> &io, const FastBufs &b) {
    const Geom &G = p.G;
    const L2Rows l2{io.l2q, io.l2rq, io.l2eps, io.l2k != nullptr};
    const auto out = [&](auto sh) { /* sh: std::bool_constant, f_out's SH */
                                    return DRC_LAUNCH("dr_chunk mma out", (f_out<K, V, GATE, decltype(sh)::value>),
                                                      G.nchunks * G.HV / G.vsh * (V / out_cols<V>()), FNT,
                                                      (size_t)(OutSmem<K, out_cols<V>()>::bytes), G, io.q,
                                                      io.l2k ? io.l2k : io.k, b, io.o, l2);
    };
    return G.vsh > 1 ? out(std::true_type{}) : out(std::false_type{});
}

} // namespace

#define DRC_FAST_DISPATCH(fn, ...)                                                                  \
    (G.K == 64 ? (G.V == 64 ? (G.gate ? fn<64, 64, 1>(__VA_ARGS__) : fn<64, 64, 0>(__VA_ARGS__))    \
                            : (G.gate ? fn<64, 128, 1>(__VA_ARGS__) : fn<64, 128, 0>(__VA_ARGS__))) \
               : (G.V == 64 ? (G.gate ? fn<128, 64, 1>(__VA_ARGS__) : fn<128, 64, 0>(__VA_ARGS__))  \
                            : (G.gate ? fn<128, 128, 1>(__VA_ARGS__) : fn<128, 128, 0>(__VA_ARGS__))))

int fast_prep_state(const Plan &p, const Io<uint16_t> &io, const FastBufs &b, int blocked) {
    const Geom &G = p.G;
    return DRC_FAST_DISPATCH(prep_state_t, p, io, b, blocked);
}

void fast_carve(const Geom &G, Carve &cv, FastBufs &b, bool for_bwd) {
    const int64_t rows = G.rows, HV = G.HV, nst = G.nchunks * HV * G.K * G.V;
    const int64_t nk = rows * HV * G.K, nv = rows * HV * G.V;
    /* plain operands (Plain<GATE>) get no lo array (their lo pointer aliases the hi one, and no
     * kernel touches it) and plain U is bf16: 0.54 GB at S1 with the head gate against 0.74 with
     * every operand split (and as much without a gate, where V' is plain too) */
    const bool head = G.gate == DG_GATE_HEAD;
    const bool pw = head ? Plain<DG_GATE_HEAD>::W : Plain<DG_GATE_NONE>::W;
    const bool pu = head ? Plain<DG_GATE_HEAD>::U : Plain<DG_GATE_NONE>::U;
    const bool pv = head ? Plain<DG_GATE_HEAD>::Vn : Plain<DG_GATE_NONE>::Vn;
    const bool ps = head ? Plain<DG_GATE_HEAD>::S : Plain<DG_GATE_NONE>::S;
    memset(&b, 0, sizeof b);
    b.Gc = G.gate ? cv.take<float>(rows * HV) : nullptr;
    b.Wh = cv.take<uint16_t>(pw ? nk : 2 * nk);
    b.U = pu ? reinterpret_cast<float *>(cv.take<uint16_t>(nv)) : cv.take<float>(nv);
    b.Vnh = cv.take<uint16_t>(pv ? nv : 2 * nv);
    const bool sl = !ps && for_bwd; /* a lo array of S, written and read */
    b.Sh = cv.take<uint16_t>(sl ? 2 * nst : nst);
    b.Ai = for_bwd ? cv.take<float>(rows * HV * 64) : nullptr;
    if (!cv.base) return;
    b.Wl = pw ? b.Wh : b.Wh + nk, b.Vnl = pv ? b.Vnh : b.Vnh + nv;
    b.Sl = ps ? b.Sh : sl ? b.Sh + nst : nullptr;
}

} // namespace DRC_FAST

#if !DRC_OPERAND_F16 /* the same for both operand formats: defined once, in the bf16 build */
bool fast_ok(const Geom &G) {
    return G.C == 64 && (G.gate == DG_GATE_NONE || G.gate == DG_GATE_HEAD) && (G.K == 64 || G.K == 128) &&
           (G.V == 64 || G.V == 128);
}

size_t fast_kept_bytes(const Geom &G) {
    fast::FastBufs b; /* (fast_h's buffers are the same) */
    return carve_bytes([&](Carve &cv) { fast::fast_carve(G, cv, b, true); });
}
#endif

/* keep: the working set, with Ai, made into keep and left there for the backward (DRC_FAST::bwd) */
int DRC_FAST::fwd(const Plan &p, const Io<uint16_t> &io, void *keep) {
    using namespace DRC_FAST;
    const Geom &G = p.G;
    FastBufs b;
    bool ok;
    char *own = carve_into(
        keep, [&](Carve &cv) { fast_carve(G, cv, b, keep != nullptr); }, &ok);
    if (!ok) return -1;
    int rc = fast_prep_state(p, io, b, 1);
    if (!rc) rc = DRC_FAST_DISPATCH(out_t, p, io, b);
    release(own);
    return rc;
}

} // namespace drc
