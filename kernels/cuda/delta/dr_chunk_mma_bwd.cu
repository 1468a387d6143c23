/* The tensor-core chunked delta-rule backward (bf16 storage, gate NONE or HEAD, chunk 64, K and
 * V in {64, 128}); building blocks in dr_chunk_mma.cuh, the recompute of W, U, the states and V'
 * in dr_chunk_mma_fwd.cu.  Same math and the same variants as the generic backward
 * (dr_chunk_generic.cuh, after kernels/cpu/delta/dr_chunk_bwd_impl.h):
 *   dhu    (b_dhu_ws: block per sequence, head, tile of 32 or 64 value columns; chunks in
 *          reverse; dS in registers of one group of warps, P^T dO and the loads made ahead of
 *          it by a second group):
 *          dV' = P^T dO + e^{G_last - G} o (K dS)                 P = scale lower(Q K^T o Gamma)
 *          dS <- e^{G_last} dS + Q^T (scale e^G o dO) - W^T dV'
 *          stores dS (leaving each chunk) and dV', split
 *   dqkwg  (block per chunk, head):  dq = scale e^G o (dO S0^T) + (scale dP o Gamma) K,
 *          dP = lower(dO V'^T);  dk = (scale dP o Gamma)^T Q + e^{G_last - G} o (V' dS1^T);
 *          dW = -dV' S0^T; the gate gradient of these (partial terms, or from the final dq, dk)
 *   wy     dAi = lower(dW Kbg^T + dU Vb^T); dKbg = Ai^T dW, dVb = Ai^T dU -> dv, dbeta, dk, dG;
 *          dA = strictly_lower(-Ai^T dAi Ai^T) -> dbeta, dMkk = diag(beta) dA;
 *          dk += (dMkk o Gamma) K + (dMkk o Gamma)^T K;  dg = reverse cumsum of dG
 *   dw_on_chip = 1: dqkwg and wy in one kernel, dW in shared memory; 0: two kernels, dW (split),
 *   the partial dk and dG through global memory.
 * W and V' come plain bf16 for both gates (Plain<GATE>, dr_chunk_mma.cuh):
 * their lo arrays are not read and the products with them take one mma pass less; S, dS, dV', Ai,
 * dW stay split. */
#include <type_traits>

#include "kernels/cuda/delta/dr_chunk_mma.cuh"

namespace drc {
namespace DRC_FAST {
namespace {

/* X = scale e^G o dO (split), by the FNT threads of a group (tid: the index among them), eight
 * columns a thread as 16-byte vectors (op8, split8); sEg: e^{G_i} of the rows */
template <int GATE, int BV>
__device__ __forceinline__ void dhu_make_x(Sp sX, const uint16_t *sO, const float *sEg, float scale, int tid) {
    for (int e = tid; e < 64 * (BV / 8); e += FNT) {
        const int i = e / (BV / 8), j = (e % (BV / 8)) * 8;
        float x[8];
        op8(sO + i * (BV + PAD) + j, x);
#pragma unroll
        for (int u = 0; u < 8; u++) {
            x[u] = scale * x[u];
            if (GATE == DG_GATE_HEAD) x[u] *= sEg[i];
        }
        split8(x, *(uint4 *)(sX.hi + i * (BV + PAD) + j), *(uint4 *)(sX.lo() + i * (BV + PAD) + j));
    }
}

/* b_dhu_ws's shared memory.  Two slots, a chunk each, filled by the maker and read by the chain:
 * the gate G and the factors e^{G_i}, e^{G_last - G_i} of its rows, q, k, dO and dVl (f32, in the accumulator fragments' order [warp][n tile][4][lane], so
 * that the chain's warp w reads what the maker's warp w wrote, without bank conflicts); the
 * chain's W tiles (plain; NW = 2 where they fit, BV = 32: a step's in tile step & 1, loaded from the
 * step's start; else one, loaded once the step's first barrier shows the last step's W^T dV'
 * done), dS, X and -dV' (split); the maker's P (split); the mbarriers. */
template <int K, int BV> struct DhuWsSmem {
    static constexpr int G = 3 * 64 * 4, QK = 2 * tile_bytes(64, K), O = tile_bytes(64, BV), DVL = 64 * BV * 4;
    static constexpr int SLOT = G + QK + O + DVL;
    static constexpr int W = tile_bytes(64, K), DS = 2 * tile_bytes(K, BV), XN = 2 * tile_bytes(64, BV);
    static constexpr int P = 2 * tile_bytes(64, 64); /* the maker's */
    static constexpr int MB = 4 * 8;                 /* mbarriers: slot s filled (2), slot s free again (2) */
    static constexpr int NW = 2 * SLOT + 2 * W + DS + 2 * XN + P + MB <= SMEM_MAX ? 2 : 1;
    static constexpr int CHAIN = NW * W + DS + 2 * XN; /* the chain's: W, dS, X, -dV' */
    static constexpr int bytes = 2 * SLOT + CHAIN + P + MB;
};

/* The backward state pass, block per (sequence, value head, tile of BV value columns v0 ..; BV =
 * dhu_bv: 32 when all blocks fit on the GPU at once, S2, else 64, S1), one block of 512 threads
 * per SM, its intra-chunk part made by a second group of warps.  Same outputs, bit for bit, as a
 * single group of warps doing all of it (the same products in the same order).
 *   maker (warps 8-15), up to two chunks ahead of the chain: loads chunk c's q, k, dO and gate
 *        into a slot and makes dVl = P^T dO, P = scale lower(Q K^T o Gamma): nothing of it
 *        depends on dS
 *   chain (warps 0-7), per chunk c in reverse, the dependent recurrence:
 *        dV' = dVl + e^{G_last - G} o (K dS);   dS <- e^{G_last} dS + Q^T X - W^T dV',
 *        X = scale e^G o dO
 * The chain loads W itself (cp.async, waited for before W^T dV'), stores dV' (at 32 columns before
 * it makes X; at 64 as rows after the step's last product, DV_ROWS below), and so waits for no
 * load and makes no P: three barriers of its 256 threads a step, against six of the whole block
 * for a single group (H100, head gate, ncu: 23 % less time at S2, 7 % at S1 with 64 columns, 256
 * blocks in two waves; 32 columns at S1, 512 blocks in four waves, are slower).  Slower at S2:
 * W loaded by the maker (whose loads are waited for at once), the chain's step in two barriers
 * (Q^T X before dV' is stored), X made by the maker; one mbarrier arrival a warp (after
 * __syncwarp) instead of one a thread is no faster, and the race check does not follow it.
 * Hand-over by mbarriers (the sanitizer's race check follows them; a bar.arrive / bar.sync pair
 * across the groups it does not): full[s] completes a phase when the maker's 256 threads have
 * filled slot s, empty[s] when the chain's 256 threads have read it for the last time; the u-th
 * use of slot s (chunk c1 - 1 - (2u + s)) waits for phase u of full[s] (chain) and, from u = 1,
 * phase u - 1 of empty[s] (maker).  Within a group, named barriers: B_CHAIN, B_MAKER. */
template <int K, int V, int GATE, int BV>
__global__ void __launch_bounds__(2 * FNT, 1)
    b_dhu_ws(Geom G, const uint16_t *q, const uint16_t *k, const uint16_t *dout, const float *dhT, float *dh0,
             FastBufs b, uint16_t *dSh, uint16_t *dSl, uint16_t *dVh, uint16_t *dVl) {
    static_assert(Plain<GATE>::W, "the chain loads W plain");
    using L_ = DhuWsSmem<K, BV>;
    enum { B_CHAIN = 1, B_MAKER = 2 };
    DRC_SMEM(float, sm);
    constexpr int NVT = V / BV;
    const int HV = G.HV, tid = threadIdx.x & (FNT - 1), warp = tid >> 5, lane = tid & 31;
    const int64_t n = chain_seq(G, blockIdx.x / (HV * NVT));
    const int hv = (int)(blockIdx.x / NVT % HV), h = hv / G.grp, v0 = (int)(blockIdx.x % NVT) * BV;
    /* slot s at sm + s SLOT: gate G [64] f32, e^{G_i} [64], e^{G_last - G_i} [64], q, k [64][K + PAD],
     * dO [64][BV + PAD], dVl */
    struct Slot {
        float *g; /* (e^{G_i} at g + 64, e^{G_last - G_i} at g + 128) */
        uint16_t *q, *k, *o;
        float *dvl;
    };
    auto slot = [&](int s) {
        unsigned char *p = (unsigned char *)sm + s * L_::SLOT;
        uint16_t *t = (uint16_t *)(p + L_::G);
        return Slot{(float *)p, t, t + 64 * (K + PAD), t + 2 * 64 * (K + PAD), (float *)(p + L_::G + L_::QK + L_::O)};
    };
    unsigned char *own = (unsigned char *)sm + 2 * L_::SLOT; /* the chain's W, dS, X, -dV'; the maker's P */
    uint64_t *full = (uint64_t *)(own + L_::CHAIN + L_::P), *empty = full + 2;
    if (threadIdx.x == 0)
        for (int s = 0; s < 2; s++) mbar_init(full + s, FNT), mbar_init(empty + s, FNT);
    bsync(); /* the mbarriers are set up (the last barrier of the whole block) */
    using TS = WT<K, BV>;
    using TV = WT<64, BV>;
    using TP = WT<64, 64>;
    const int vm0 = TV::m0(warp), vn0 = TV::n0(warp);
    constexpr int DVL_WARP = TV::NT * 4 * 32; /* a warp's part of dVl */
    const float scale = G.scale;
    int64_t c0, c1;
    seq_chunks(G, n, c0, c1);
    if (threadIdx.x >= FNT) { /* the maker */
        const Sp sP{(uint16_t *)(own + L_::CHAIN), 64 * (64 + PAD)};
        const int pm0 = TP::m0(warp), pn0 = TP::n0(warp);
        for (int64_t c = c1 - 1; c >= c0; c--) {
            const int step = (int)(c1 - 1 - c), s = step & 1, u = step >> 1;
            const Chunk x = seq_chunk(G, n, c0, c);
            const Slot S = slot(s);
            const int64_t ot = x.r0 * HV + hv;
            if (u > 0) mbar_wait(empty + s, (u - 1) & 1); /* the chain is done with chunk c + 2 */
            load_raw_async<64, K>(S.q, q + (x.r0 * G.H + h) * K, (int64_t)G.H * K, x.L, tid);
            load_raw_async<64, K>(S.k, k + (x.r0 * G.H + h) * K, (int64_t)G.H * K, x.L, tid);
            load_raw_async<64, BV>(S.o, dout + ot * V + v0, (int64_t)HV * V, x.L, tid);
            load_gate_async<GATE>(G, x.r0, x.L, hv, b.Gc, S.g, tid);
            cp_async_commit();
            cp_async_wait_all();
            nsync(B_MAKER, FNT); /* the slot is in; every maker warp is done with the last P */
            {                    /* P (stored [m][i]) */
                float acc[1][TP::NT][4];
                acc_zero(acc);
                mma_run<1, TP::NT, false, false>(acc, S.q, K + PAD, pm0, S.k, K + PAD, pn0, K);
                store_split<TP::NT>(sP, 64 + PAD, pm0, pn0, [&](int m, int i, int nt, int qq) {
                    if (i > m) return 0.0f;
                    float v = scale * acc[0][nt][qq];
                    if (GATE == DG_GATE_HEAD) v *= expf(S.g[m] - S.g[i]);
                    return v;
                });
            }
            nsync(B_MAKER, FNT);
            float a1[1][TV::NT][4];
            acc_zero(a1);
            mma_sr<1, TV::NT, true, true>(a1, sP, 64 + PAD, vm0, S.o, BV + PAD, vn0, 64);
            float *d = S.dvl + warp * DVL_WARP;
#pragma unroll
            for (int nt = 0; nt < TV::NT; nt++)
#pragma unroll
                for (int qq = 0; qq < 4; qq++) d[(nt * 4 + qq) * 32 + lane] = a1[0][nt][qq];
            if (GATE == DG_GATE_HEAD && tid < 64) { /* the chain's gate factors (made once a row here, not
                                                     * per element in the chain's step) */
                S.g[64 + tid] = expf(S.g[tid]);
                S.g[128 + tid] = expf(S.g[63] - S.g[tid]);
            }
            mbar_arrive(full + s); /* slot s is filled, as far as this thread goes */
        }
        return;
    }
    /* the chain */
    constexpr int NW = L_::NW;
    uint16_t *sW = (uint16_t *)own; /* NW tiles: a step's in tile step % NW */
    const Sp sdS{(uint16_t *)(own + NW * L_::W), K * (BV + PAD)};
    const Sp sX{(uint16_t *)(own + NW * L_::W + L_::DS), 64 * (BV + PAD)};
    const Sp sN{(uint16_t *)(own + NW * L_::W + L_::DS + L_::XN), 64 * (BV + PAD)};
    /* dV' to memory: at 64 columns (S1) from -dV' in sN at the step's end, 16-byte rows with the
     * sign bits flipped back (split2 is odd: the values put_pair_global would store, a lo word of
     * exactly zero coming back as -0): off the chain's path between K dS and the next barrier
     * (H100, S1: 9 % less time in dhu).  At 32 (S2, 128 steps a chain) pair by pair from the
     * fragments: rows there are no faster at the step's end and slower mid-step, nor is storing
     * dS after Q^T X instead any faster */
    constexpr bool DV_ROWS = BV == 64;
    const int sm0 = TS::m0(warp), sn0 = TS::n0(warp);
    float dS[1][TS::NT][4];
    const int64_t hb = (n * HV + hv) * (int64_t)K * V + v0;
    frag_each(dS, sm0, sn0, [&](int r, int j, float &x) { x = dhT ? dhT[hb + (int64_t)r * V + j] : 0.0f; });
    for (int64_t c = c1 - 1; c >= c0; c--) {
        const int step = (int)(c1 - 1 - c), s = step & 1;
        const Chunk ch = seq_chunk(G, n, c0, c);
        const int L = ch.L;
        const int64_t r0 = ch.r0;
        const Slot S = slot(s);
        uint16_t *w = sW + (step % NW) * 64 * (K + PAD);
        const uint16_t *wg = b.Wh + (r0 * HV + hv) * K;
        if (NW == 2) { /* this tile was last read two steps ago, before the last step's first barrier */
            load_raw_async<64, K>(w, wg, (int64_t)HV * K, L);
            cp_async_commit();
        }
        mbar_wait(full + s, (step >> 1) & 1); /* the slot is filled */
        const int64_t sb = (c * HV + hv) * (int64_t)K * V + v0;
        frag_pairs(dS, sm0, sn0, [&](int r, int j, float x0, float x1) { put_split2(sdS, BV + PAD, r, j, x0, x1); });
        nsync(B_CHAIN, FNT);
        if (NW == 1) { /* the one tile: the barrier above shows the last step's W^T dV' done */
            load_raw_async<64, K>(w, wg, (int64_t)HV * K, L);
            cp_async_commit();
        }
        store_raw<K, BV>(dSh + sb, V, sdS.hi);
        store_raw<K, BV>(dSl + sb, V, sdS.lo());
        float nv[1][TV::NT][4]; /* -dV' (this thread's fragment) */
        {                       /* dV' = dVl + e^{G_last - G} o (K dS), stored */
            float a2[1][TV::NT][4];
            acc_zero(a2);
            mma_rs<1, TV::NT, false, true>(a2, S.k, K + PAD, vm0, sdS, BV + PAD, vn0, K);
            const float *d = S.dvl + warp * DVL_WARP;
            const int g = lane >> 2, t = lane & 3;
#pragma unroll
            for (int nt = 0; nt < TV::NT; nt++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int i = vm0 + g + 8 * hh, j = vn0 + nt * 8 + 2 * t;
                    const float e = GATE == DG_GATE_HEAD ? S.g[128 + i] : 1.0f;
                    const float x0 = d[(nt * 4 + 2 * hh) * 32 + lane] + e * a2[0][nt][2 * hh];
                    const float x1 = d[(nt * 4 + 2 * hh + 1) * 32 + lane] + e * a2[0][nt][2 * hh + 1];
                    if (!DV_ROWS && i < L) put_pair_global<true>(dVh, dVl, ((r0 + i) * HV + hv) * V + v0 + j, x0, x1);
                    nv[0][nt][2 * hh] = -x0, nv[0][nt][2 * hh + 1] = -x1;
                }
        }
        dhu_make_x<GATE, BV>(sX, S.o, S.g + 64, scale, tid);
        if (GATE == DG_GATE_HEAD) {
            const float e = S.g[64 + 63];
            frag_each(dS, sm0, sn0, [&](int, int, float &x) { x *= e; });
        }
        nsync(B_CHAIN, FNT);
        mma_rs<1, TS::NT, true, true>(dS, S.q, K + PAD, sm0, sX, BV + PAD, sn0, 64); /* + Q^T X */
        mbar_arrive(empty + s); /* this thread's last read of the slot */
        cp_async_wait_all();    /* W */
        frag_pairs(nv, vm0, vn0, [&](int i, int j, float x0, float x1) { put_split2(sN, BV + PAD, i, j, x0, x1); });
        nsync(B_CHAIN, FNT);
        mma_p<1, TS::NT, true, true, false, true>(dS, Sp{w, 0}, K + PAD, sm0, sN, BV + PAD, sn0, 64); /* - W^T dV' */
        if (DV_ROWS) /* (sN is written again after two barriers of the next step) */
            for (int e = tid; e < L * (BV / 8); e += FNT) {
                const int r = e / (BV / 8), c8 = (e % (BV / 8)) * 8;
                const int64_t go = ((r0 + r) * HV + hv) * V + v0 + c8;
                uint4 h = *(const uint4 *)(sN.hi + r * (BV + PAD) + c8),
                      l = *(const uint4 *)(sN.lo() + r * (BV + PAD) + c8);
                h.x ^= 0x80008000u, h.y ^= 0x80008000u, h.z ^= 0x80008000u, h.w ^= 0x80008000u;
                l.x ^= 0x80008000u, l.y ^= 0x80008000u, l.z ^= 0x80008000u, l.w ^= 0x80008000u;
                *(uint4 *)(dVh + go) = h;
                *(uint4 *)(dVl + go) = l;
            }
    }
    if (dh0) frag_each(dS, sm0, sn0, [&](int r, int j, float &x) { dh0[hb + (int64_t)r * V + j] = x; });
}

/* ---- dqkwg + WY ---- */
#ifndef DRC_AIB
#define DRC_AIB 4
#endif
#ifndef DRC_DSB
#define DRC_DSB 2
#endif
constexpr int AIB = DRC_AIB, DSB = DRC_DSB; /* load batches (registers: the accumulators are live) */
template <int K, int V, int NW> struct QkSmem {
    static constexpr int T64 = 2 * tile_bytes(64, 64);
    /* G, beta, dG, dbeta [64]; redg, redb [NW][64]; block_sum's scratch [16]; the rows' 1/|q|, 1/|k| [2][64] */
    static constexpr int F32 = (4 * 64 + 2 * NW * 64 + 16 + 128) * 4;
    static constexpr int X1 = 2 * tile_bytes(K, V) > 3 * T64 ? 2 * tile_bytes(K, V) : 3 * T64;
    static constexpr int X2 = 2 * (tile_bytes(64, V) > tile_bytes(64, K) ? tile_bytes(64, V) : tile_bytes(64, K));
    static constexpr int X3 = 2 * tile_bytes(64, V);
    static constexpr int X4 = tile_bytes(64, V);
    static constexpr int X5 = tile_bytes(64, K);
    static constexpr int o1 = F32, o2 = o1 + X1, o3 = o2 + X2, o4 = o3 + X3, o5 = o4 + X4, o6 = o5 + X5, o7 = o6 + X5;
    static constexpr int bytes = o7 + T64;
};

struct QkArgs {
    const uint16_t *q, *k, *v, *beta, *dout;
    FastBufs b;
    const uint16_t *dSh, *dSl, *dVh, *dVl;
    float *dqv, *dkv;    /* [rows, HB, K] per head of the fused kernel's blocks (HB = HV / G.vsh) */
    uint16_t *dq, *dk;   /* HB == H: the outputs, written directly (else NULL) */
    uint16_t *dWh, *dWl; /* unfused: [rows, HV, K] */
    float *dGg;          /* unfused: [rows, HV] */
    uint16_t *dv, *dbeta;
    float *dbetaf; /* f32 dbeta instead of dbeta (Io::dbeta32), or NULL */
    float *dg;
    int final_dg;
    const float *rq, *rk; /* with dq, dk direct: the L2 norm's 1/|x| [rows, H] (q, k normalised), else NULL */
};

/* MODE 0: fused; 1: dqkwg only (dW, dk, dG to global); 2: WY only (from them).  SH (fused only): the
 * block takes the G.vsh heads of one beta and gate; else one head (its own instance: a loop over a
 * run-time count of heads made the one-head kernel 11 % slower at S1, H200) */
template <int K, int V, int GATE, int MODE, bool SH, int NTH>
__global__ void __launch_bounds__(NTH) b_qkwy(Geom G, QkArgs a) {
    constexpr int NW = NTH / 32;
    static_assert(NW <= 16, "block_sum's scratch");
    using S_ = QkSmem<K, V, NW>;
    DRC_SMEM(float, sm);
    const int HV = G.HV, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    /* the block's RR value heads hv0 .. hv0 + RR - 1 share beta and the gate (Geom::vsh; fused only) */
    static_assert(MODE == 0 || !SH, "heads shared in the fused kernel only");
    const int RR = SH ? G.vsh : 1, HB = HV / RR;
    const int64_t c = blockIdx.x / HB;
    const int hb = (int)(blockIdx.x % HB), hv0 = hb * RR, h = hv0 / G.grp;
    const Chunk ch = chunk_at(G, c);
    const int L = ch.L;
    const int64_t r0 = ch.r0;
    const float scale = G.scale;
    float *sG = sm, *sb = sG + 64, *sdG = sb + 64, *sdB = sdG + 64, *redg = sdB + 64, *redb = redg + NW * 64,
          *scr = redb + NW * 64, *sr = scr + 16;
    unsigned char *B8 = (unsigned char *)sm;
    const Sp sS{(uint16_t *)(B8 + S_::o1), K * (V + PAD)};
    const Sp sAi{(uint16_t *)(B8 + S_::o1), 64 * 72};
    const Sp sdAi{(uint16_t *)(B8 + S_::o1 + S_::T64), 64 * 72};
    const Sp sT{(uint16_t *)(B8 + S_::o1 + 2 * S_::T64), 64 * 72};
    /* MODE 0: Ai as loaded, in sdAi's and sT's place: rows of 64 f32 copied as 128 16-bit words
     * into padded tile rows, so AIF_LD floats a row */
    uint16_t *sAiF = (uint16_t *)(B8 + S_::o1 + S_::T64);
    constexpr int AIF_LD = (128 + PAD) / 2;
    static_assert(64 * (128 + PAD) * 2 <= 2 * S_::T64, "Ai staging in sdAi, sT");
    const Sp sVn{(uint16_t *)(B8 + S_::o2), 64 * (V + PAD)};
    const Sp sdW{(uint16_t *)(B8 + S_::o2), 64 * (K + PAD)};
    const Sp sdV{(uint16_t *)(B8 + S_::o3), 64 * (V + PAD)};
    uint16_t *sO = (uint16_t *)(B8 + S_::o4), *sV = sO; /* dO, later v */
    uint16_t *sQ = (uint16_t *)(B8 + S_::o5), *sK = (uint16_t *)(B8 + S_::o6);
    const Sp sDP{(uint16_t *)(B8 + S_::o7), 64 * 72};
    using TK = WT<64, K, NW>;
    using TV = WT<64, V, NW>;
    using TP = WT<64, 64, NW>;
    const int km0 = TK::m0(warp), kn0 = TK::n0(warp), vm0 = TV::m0(warp), vn0 = TV::n0(warp);
    const int pm0 = TP::m0(warp), pn0 = TP::n0(warp);
    const int64_t ot0 = r0 * HV + hv0; /* row r0 of [rows, HV, .] at the first head (the gate Gc, Ai) */
    const int64_t ob = r0 * HB + hb;   /* row r0 of [rows, HB, .]: dq, dk, dbeta, dg (the heads' sums) */
    constexpr bool HEAD = GATE == DG_GATE_HEAD;
    constexpr bool PV = Plain<GATE>::Vn, PS = Plain<GATE>::S; /* plain bf16 (dS1, which replaces S, is split) */
    const int partial = HEAD && !a.final_dg;

    for (int e = tid; e < 2 * NW * 64; e += NTH) redg[e] = 0.0f;
    if (MODE == 2) {
        load_raw<64, K, NTH>(sK, a.k + (r0 * G.H + h) * K, (int64_t)G.H * K, L);
        load_split<64, V, NTH>(sdV, a.dVh + ot0 * V, a.dVl + ot0 * V, (int64_t)HV * V, L);
    }
    load_gate_beta<GATE>(G, r0, L, hv0, a.b.Gc, a.beta, sG, sb);
    if (tid < 64) sdG[tid] = 0.0f, sdB[tid] = 0.0f;
    l2norm_stage_r(sr, a.rq, a.rk, ob, HB, L); /* for the norm's backward */
    float dk[1][TK::NT][4];
    acc_zero(dk);

    if (MODE != 2) {
        /* phases A to C of each head, summed over the RR heads (each product is linear in the
         * head's dO, S0, dS1, V', dV'; the gate factors, the same for all, follow the sums) */
        float dq[1][TK::NT][4], dw[1][TK::NT][4], dp[1][TP::NT][4];
        acc_zero(dq), acc_zero(dw), acc_zero(dp);
        float tr = 0.0f; /* HEAD: trace(S0^T dS1) */
#pragma unroll 1
        for (int r = 0; r < RR; r++) {
            const int64_t ot = ot0 + r, sbase = (c * HV + hv0 + r) * (int64_t)K * V;
            if (r) bsync(); /* every warp is past its reads of the last head's tiles */
            /* what phase A reads, then (k, q once) V' by cp.async, in flight during phase A */
            load_raw<64, V, NTH>(sO, a.dout + ot * V, (int64_t)HV * V, L);
            load_sp<K, V, !PS, NTH>(sS, a.b.Sh + sbase, a.b.Sl + sbase, V, K);
            load_split<64, V, NTH>(sdV, a.dVh + ot * V, a.dVl + ot * V, (int64_t)HV * V, L);
            if (!r) {
                load_raw_async<64, K, NTH>(sK, a.k + (r0 * G.H + h) * K, (int64_t)G.H * K, L);
                load_raw_async<64, K, NTH>(sQ, a.q + (r0 * G.H + h) * K, (int64_t)G.H * K, L);
            }
            load_sp_async<64, V, !PV, NTH>(sVn, a.b.Vnh + ot * V, a.b.Vnl + ot * V, (int64_t)HV * V, L);
            cp_async_commit();
            bsync();
            /* A: dQg = dO S0^T;  dW' = dV' S0^T  (dW = -dW') */
            mma_p<1, TK::NT, false, false, false, !PS>(dq, Sp{sO, 0}, V + PAD, km0, sS, V + PAD, kn0, V);
            mma_p<1, TK::NT, false, false, true, !PS>(dw, sdV, V + PAD, km0, sS, V + PAD, kn0, V);
            cp_async_wait_all(); /* k, q, V' (the barrier shows them to the block) */
            bsync();
            /* S0 -> dS1 in place.  The head gate's trace(S0^T dS1) needs both, so it loads dS1 into
             * registers, adds the trace and stores it over S0, then B; without a gate (no trace)
             * dS1 comes by cp.async, in flight during C, which does not read it, and B follows C
             * (ncu, H100, delta_rule S1: 5 % of qkwy's stall samples were those loads' wait) */
            const auto phase_b = [&] { /* B: dKd = V' dS1^T */
                                       mma_p<1, TK::NT, false, false, !PV, true>(dk, sVn, V + PAD, km0, sS, V + PAD,
                                                                                 kn0, V);
            };
            if (!HEAD) {
                load_raw_async<K, V, NTH>(sS.hi, a.dSh + sbase, V, K);
                load_raw_async<K, V, NTH>(sS.lo(), a.dSl + sbase, V, K);
                cp_async_commit();
            } else { /* (fixed trip count, loads in batches of 4 vector pairs: their latencies overlap) */
                constexpr int V8 = V / 8, IT = K * V8 / NTH, BT = IT < DSB ? IT : DSB;
                static_assert(K * V8 % NTH == 0 && IT % BT == 0, "tile");
                float trr = 0.0f;
#pragma unroll 1
                for (int b0 = 0; b0 < IT; b0 += BT) {
                    uint4 dh[BT], dl[BT];
#pragma unroll
                    for (int u = 0; u < BT; u++) {
                        const int e = tid + (b0 + u) * NTH, rr = e / V8, c8 = (e % V8) * 8;
                        dh[u] = *(const uint4 *)(a.dSh + sbase + (int64_t)rr * V + c8);
                        dl[u] = *(const uint4 *)(a.dSl + sbase + (int64_t)rr * V + c8);
                    }
#pragma unroll
                    for (int u = 0; u < BT; u++) {
                        const int e = tid + (b0 + u) * NTH, rr = e / V8, c8 = (e % V8) * 8;
                        uint16_t *ph = sS.hi + rr * (V + PAD) + c8, *pl = sS.lo() + rr * (V + PAD) + c8;
                        uint16_t xh[8], xl[8]; /* (memcpy: no type punning through pointers) */
                        memcpy(xh, &dh[u], 16), memcpy(xl, &dl[u], 16);
#pragma unroll
                        for (int w = 0; w < 8; w++) /* (plain S0: no lo word was loaded) */
                            trr += (op2f(ph[w]) + (PS ? 0.0f : op2f(pl[w]))) * (op2f(xh[w]) + op2f(xl[w]));
                        *(uint4 *)ph = dh[u];
                        *(uint4 *)pl = dl[u];
                    }
                }
                tr += block_sum<NW>(trr, scr); /* (its barriers show dS1 to the block) */
                phase_b();
            }
            /* C: dP = lower(dO V'^T), summed over the heads, P = scale Q K^T o Gamma */
            mma_p<1, TP::NT, false, false, false, !PV>(dp, Sp{sO, 0}, V + PAD, pm0, sVn, V + PAD, pn0, V);
            if (r == RR - 1) { /* the sum made: dPs = scale dP o Gamma (split), partial rowcol(dP, P) */
                float pp[1][TP::NT][4];
                acc_zero(pp);
                if (partial) mma_run<1, TP::NT, false, false>(pp, sQ, K + PAD, pm0, sK, K + PAD, pn0, K);
                float rs[2] = {0.0f, 0.0f}, cs[TP::NT][2];
#pragma unroll
                for (int nt = 0; nt < TP::NT; nt++) cs[nt][0] = cs[nt][1] = 0.0f;
                store_split<TP::NT>(sDP, 72, pm0, pn0, [&](int i, int l, int nt, int qq) {
                    if (l > i) return 0.0f;
                    const float gam = HEAD ? expf(sG[i] - sG[l]) : 1.0f;
                    if (partial) { /* rowcol(dP, P): +dP_il P_il to row i, - to column l */
                        const float tt = dp[0][nt][qq] * scale * gam * pp[0][nt][qq];
                        rs[qq >> 1] += tt;
                        cs[nt][qq & 1] -= tt;
                    }
                    return scale * gam * dp[0][nt][qq];
                });
                if (partial) {
                    red_rows_put(redg, pm0, rs);
                    red_cols_put<TP::NT>(redg, pn0, cs);
                }
            }
            if (!HEAD) {
                cp_async_wait_all(); /* dS1 (the barrier shows it to the block) */
                bsync();
                phase_b();
            }
        }
        /* dq = scale e^G o dQg (+ partial dG term);  dk = e^{G_last - G} o dKd (f3) */
        float skf3 = 0.0f;
        {
            float rs[2] = {0.0f, 0.0f};
            /* the gate factors of this thread's two rows, km0 + g and + 8: two exponentials each
             * instead of one an element */
            float fq[2] = {scale, scale}, fk[2] = {1.0f, 1.0f};
            if (HEAD)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const float gi = sG[km0 + gq + 8 * hh];
                    fq[hh] = scale * expf(gi), fk[hh] = expf(sG[63] - gi);
                }
            frag_each(dq, km0, kn0, [&](int i, int cc, float &x) {
                x *= fq[(i - km0) >> 3];
                if (partial) rs[(i - km0) >> 3] += op2f(sQ[i * (K + PAD) + cc]) * x;
            });
            frag_each(dk, km0, kn0, [&](int i, int cc, float &x) {
                if (HEAD) x *= fk[(i - km0) >> 3];
                const float t = op2f(sK[i * (K + PAD) + cc]) * x;
                skf3 += t;
                if (partial) rs[(i - km0) >> 3] -= t;
            });
            if (partial) red_rows_put(redg, km0, rs);
        }
        bsync();
        if (MODE == 0) { /* every warp is past its reads of dO and of S0 / dS1: v (of the last head, whose
                          * dV' is in sdV) for the WY part into dO's place, Ai (f32 rows of 64, as rows of
                          * 128 16-bit words) into S's behind sAi, in flight while dq, dk are made (waited
                          * for where the WY part starts) */
            load_raw_async<64, V, NTH>(sV, a.v + (ot0 + RR - 1) * V, (int64_t)HV * V, L);
            load_raw_async<64, 128, NTH>(sAiF, (const uint16_t *)(a.b.Ai + ot0 * 64), (int64_t)HV * 128, L);
            cp_async_commit();
        }
        mma_sr<1, TK::NT, false, true>(dq, sDP, 72, km0, sK, K + PAD, kn0, 64);
        mma_sr<1, TK::NT, true, true>(dk, sDP, 72, km0, sQ, K + PAD, kn0, 64);
        if (HEAD && !partial) { /* dG from the final dq, dk: dG = rowsum(q o dq) - rowsum(k o dk) */
            float rs[2] = {0.0f, 0.0f};
            frag_each(dq, km0, kn0,
                      [&](int i, int cc, float &x) { rs[(i - km0) >> 3] += op2f(sQ[i * (K + PAD) + cc]) * x; });
            frag_each(dk, km0, kn0,
                      [&](int i, int cc, float &x) { rs[(i - km0) >> 3] -= op2f(sK[i * (K + PAD) + cc]) * x; });
            red_rows_put(redg, km0, rs);
        }
        if (HEAD) skf3 = block_sum<NW>(skf3, scr); /* (barriers) */
        else bsync();
        if (HEAD) {
            red_collect<NW>(redg, sdG, true);
            bsync();
            if (tid == 0) sdG[L - 1] += skf3 + expf(sG[63]) * tr;
        }
        /* dq is final; redg (collected above, or never used) is the norm's scratch, zeroed again in
         * part B before its next use */
        if (a.rq && a.dq) l2norm_bwd_rows<NW>(dq, km0, kn0, sQ, K + PAD, redg, sr);
        frag_pairs(dq, km0, kn0, [&](int i, int cc, float x0, float x1) {
            if (i >= L) return;
            const int64_t off = (ob + (int64_t)i * HB) * K + cc;
            if (a.dq) *(uint32_t *)(a.dq + off) = pack_op2(x0, x1);
            else if (a.dqv) *(float2 *)(a.dqv + off) = make_float2(x0, x1);
        });
        /* dW = -dW' */
        if (MODE == 0) {
            frag_pairs(dw, km0, kn0,
                       [&](int i, int cc, float x0, float x1) { put_split2(sdW, K + PAD, i, cc, -x0, -x1); });
        } else {
            frag_pairs(dw, km0, kn0, [&](int i, int cc, float x0, float x1) {
                if (i < L) put_pair_global<true>(a.dWh, a.dWl, (ot0 + (int64_t)i * HV) * K + cc, -x0, -x1);
            });
            frag_pairs(dk, km0, kn0, [&](int i, int cc, float x0, float x1) {
                if (i < L) *(float2 *)(a.dkv + (ot0 + (int64_t)i * HV) * K + cc) = make_float2(x0, x1);
            });
            bsync();
            if (HEAD && tid < L) a.dGg[ot0 + (int64_t)tid * HV] = sdG[tid];
            return;
        }
    } else {
        load_split<64, K, NTH>(sdW, a.dWh + ot0 * K, a.dWl + ot0 * K, (int64_t)HV * K, L);
        frag_each(dk, km0, kn0,
                  [&](int i, int cc, float &x) { x = i < L ? a.dkv[(ot0 + (int64_t)i * HV) * K + cc] : 0.0f; });
        if (HEAD && tid < L) sdG[tid] = a.dGg[ot0 + (int64_t)tid * HV];
    }

    /* ---- WY backward ---- */
    if (MODE == 0) { /* v and Ai (issued after phase C) */
        cp_async_wait_all();
        bsync();
        if (a.rq && a.dq)
            for (int e = tid; e < NW * 64; e += NTH) redg[e] = 0.0f; /* (the barrier below before its next use) */
        for (int e = tid; e < 64 * 8; e += NTH) {                    /* eight columns a thread, 16-byte vectors */
            const int i = e >> 3, j = (e & 7) * 8;
            float x[8];
            f8((const float *)sAiF + i * AIF_LD + j, x);
            split8(x, *(uint4 *)(sAi.hi + i * 72 + j), *(uint4 *)(sAi.lo() + i * 72 + j));
        }
    } else load_raw<64, V, NTH>(sV, a.v + ot0 * V, (int64_t)HV * V, L);
#pragma unroll 1
    for (int u0 = 0; MODE != 0 && u0 < 64 * 64 / NTH;
         u0 += AIB) { /* (loads in batches of AIB; MODE 0 split Ai above) */
        float x[AIB];
#pragma unroll
        for (int u = 0; u < AIB; u++) {
            const int e = tid + (u0 + u) * NTH, i = e / 64, j = e % 64;
            x[u] = i < L ? a.b.Ai[(ot0 + (int64_t)i * HV) * 64 + j] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < AIB; u++) {
            const int e = tid + (u0 + u) * NTH, i = e / 64, j = e % 64;
            split2(x[u], sAi.hi[i * 72 + j], sAi.lo()[i * 72 + j]);
        }
    }
    bsync();
    /* dVb = Ai^T dU of the head whose dU, v are in sdV, sV (row ot): dv = beta o dVb;
     * dbeta += rowsum(v o dVb) */
    const auto dvb = [&](int64_t ot) {
        float acc[1][TV::NT][4];
        acc_zero(acc);
        mma_ss<1, TV::NT, true, true>(acc, sAi, 72, vm0, sdV, V + PAD, vn0, 64);
        float rb[2] = {0.0f, 0.0f};
        frag_pairs(acc, vm0, vn0, [&](int j, int vv, float x0, float x1) {
            rb[(j - vm0) >> 3] += op2f(sV[j * (V + PAD) + vv]) * x0 + op2f(sV[j * (V + PAD) + vv + 1]) * x1;
            if (j < L && a.dv) *(uint32_t *)(a.dv + (ot + (int64_t)j * HV) * V + vv) = pack_op2(sb[j] * x0, sb[j] * x1);
        });
        red_rows_put(redb, vm0, rb);
    };
    { /* dAi = lower((dW K^T) diag(e^G) + sum of the heads' dU V^T) diag(beta): the last head's dU, v
       * are in sdV, sV; each other head's come in turn, once the one before has made its dVb */
        float acc[1][TP::NT][4];
        acc_zero(acc);
        mma_sr<1, TP::NT, false, false>(acc, sdW, K + PAD, pm0, sK, K + PAD, pn0, K);
        if (HEAD) frag_each(acc, pm0, pn0, [&](int, int j, float &x) { x *= expf(sG[j]); });
        mma_sr<1, TP::NT, false, false>(acc, sdV, V + PAD, pm0, sV, V + PAD, pn0, V);
#pragma unroll 1
        for (int r = RR - 2; r >= 0; r--) {
            dvb(ot0 + r + 1);
            bsync();
            load_split<64, V, NTH>(sdV, a.dVh + (ot0 + r) * V, a.dVl + (ot0 + r) * V, (int64_t)HV * V, L);
            load_raw<64, V, NTH>(sV, a.v + (ot0 + r) * V, (int64_t)HV * V, L);
            bsync();
            mma_sr<1, TP::NT, false, false>(acc, sdV, V + PAD, pm0, sV, V + PAD, pn0, V);
        }
        store_split<TP::NT>(sdAi, 72, pm0, pn0,
                            [&](int i, int j, int nt, int qq) { return j <= i ? acc[0][nt][qq] * sb[j] : 0.0f; });
    }
    { /* dKbg = Ai^T dW: dk += e^G beta o dKbg; dbeta += rowsum(e^G k o dKbg); dG += rowsum(k o rp) */
        float acc[1][TK::NT][4];
        acc_zero(acc);
        mma_ss<1, TK::NT, true, true>(acc, sAi, 72, km0, sdW, K + PAD, kn0, 64);
        float rb[2] = {0.0f, 0.0f}, rg[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < TK::NT; nt++)
#pragma unroll
            for (int qq = 0; qq < 4; qq++) {
                const int j = km0 + gq + ((qq >> 1) << 3), cc = kn0 + nt * 8 + 2 * tq + (qq & 1);
                const float e = HEAD ? expf(sG[j]) : 1.0f, kv = op2f(sK[j * (K + PAD) + cc]);
                const float x = acc[0][nt][qq], rp = e * sb[j] * x;
                rb[qq >> 1] += e * kv * x;
                rg[qq >> 1] += kv * rp;
                dk[0][nt][qq] += rp;
            }
        red_rows_put(redb, km0, rb);
        if (HEAD) red_rows_put(redg, km0, rg);
    }
    dvb(ot0); /* (the first head's, the last in sdV, sV) */
    bsync();
    { /* T = Ai^T dAi */
        float acc[1][TP::NT][4];
        acc_zero(acc);
        mma_ss<1, TP::NT, true, true>(acc, sAi, 72, pm0, sdAi, 72, pn0, 64);
        store_split<TP::NT>(sT, 72, pm0, pn0, [&](int, int, int nt, int qq) { return acc[0][nt][qq]; });
    }
    bsync();
    { /* dA = -T Ai^T (strictly lower); Mkk = K K^T o Gamma; dbeta, dMkk, dG (rowcol) */
        float acc[1][TP::NT][4], mk[1][TP::NT][4];
        acc_zero(acc), acc_zero(mk);
        mma_ss<1, TP::NT, false, false>(acc, sT, 72, pm0, sAi, 72, pn0, 64);
        mma_run<1, TP::NT, false, false>(mk, sK, K + PAD, pm0, sK, K + PAD, pn0, K);
        float rb[2] = {0.0f, 0.0f}, rg[2] = {0.0f, 0.0f}, cg[TP::NT][2];
#pragma unroll
        for (int nt = 0; nt < TP::NT; nt++) cg[nt][0] = cg[nt][1] = 0.0f;
        store_split<TP::NT>(sDP, 72, pm0, pn0, [&](int i, int j, int nt, int qq) {
            if (j >= i) return 0.0f;
            const float gam = HEAD ? expf(sG[i] - sG[j]) : 1.0f;
            const float dA = -acc[0][nt][qq], M = mk[0][nt][qq] * gam;
            rb[qq >> 1] += dA * M;
            const float dM = sb[i] * dA;
            if (HEAD) {
                rg[qq >> 1] += dM * M;
                cg[nt][qq & 1] -= dM * M;
            }
            return dM * gam;
        });
        red_rows_put(redb, pm0, rb);
        if (HEAD) {
            red_rows_put(redg, pm0, rg);
            red_cols_put<TP::NT>(redg, pn0, cg);
        }
    }
    bsync();
    /* dk += (dMkk o Gamma) K + (dMkk o Gamma)^T K */
    mma_sr<1, TK::NT, false, true>(dk, sDP, 72, km0, sK, K + PAD, kn0, 64);
    mma_sr<1, TK::NT, true, true>(dk, sDP, 72, km0, sK, K + PAD, kn0, 64);
    red_collect<NW>(redb, sdB, true);
    if (HEAD) red_collect<NW>(redg, sdG, true);
    bsync();
    if (a.rk && a.dk) l2norm_bwd_rows<NW>(dk, km0, kn0, sK, K + PAD, redb, sr + 64);
    frag_pairs(dk, km0, kn0, [&](int i, int cc, float x0, float x1) {
        if (i >= L) return;
        const int64_t off = (ob + (int64_t)i * HB) * K + cc;
        if (a.dk) *(uint32_t *)(a.dk + off) = pack_op2(x0, x1);
        else if (a.dkv) *(float2 *)(a.dkv + off) = make_float2(x0, x1);
    });
    if (tid < L && a.dbetaf) a.dbetaf[ob + (int64_t)tid * HB] = sdB[tid];
    else if (tid < L && a.dbeta) a.dbeta[ob + (int64_t)tid * HB] = f2op(sdB[tid]);
    if (HEAD && tid == 0 && a.dg) {
        float acc = 0.0f;
        for (int i = L - 1; i >= 0; i--) {
            acc += sdG[i];
            a.dg[ob + (int64_t)i * HB] = acc;
        }
    }
}

/* one qkwy kernel (MODE: 0 fused, 1 dqkwg, 2 wy), a block of ONE_SM_NTH threads (16 warps) per
 * chunk and head (fused, G.vsh > 1: per chunk and G.vsh heads of one beta and gate).  Against 8
 * warps (H100, S1, ncu): the fused head-gate qkwy takes 6 % less time, GDN's fwd+bwd 3 % less at S1
 * and S2; delta_rule's qkwy 2 % less, its fwd+bwd under 2 %.  At K = 64 without a gate the blocks
 * have 8 warps (FNT): there the faster of the two, with the head gate the slower (PERF_KERNELS.md,
 * "Blocks and occupancy"). */
template <int K, int V, int GATE, int MODE> int qkwy_launch(const char *name, const Geom &G, const QkArgs &a) {
    constexpr int NTH = K == 64 && GATE == DG_GATE_NONE ? FNT : ONE_SM_NTH;
    using Lay = QkSmem<K, V, NTH / 32>;
    static_assert(Lay::bytes <= SMEM_MAX, "shared memory");
    if constexpr (MODE == 0)
        if (G.vsh > 1)
            return DRC_LAUNCH(name, (b_qkwy<K, V, GATE, 0, true, NTH>), G.nchunks * G.HV / G.vsh, NTH,
                              (size_t)Lay::bytes, G, a);
    return DRC_LAUNCH(name, (b_qkwy<K, V, GATE, MODE, false, NTH>), G.nchunks * G.HV, NTH, (size_t)Lay::bytes, G, a);
}

template <int K, int V, int GATE>
int bwd_t(const Plan &p, const dg_dr_variant &var, const Io<uint16_t> &io, const FastBufs &b, QkArgs &a, uint16_t *dSh,
          uint16_t *dSl) {
    static_assert(DhuWsSmem<K, 32>::bytes <= SMEM_MAX && DhuWsSmem<K, 64>::bytes <= SMEM_MAX, "shared memory");
    const Geom &G = p.G;
    const auto dhu = [&](auto bv) { /* bv: std::integral_constant of the value columns a block */
                                    constexpr int C = decltype(bv)::value;
                                    return DRC_LAUNCH("dr_chunk mma dhu", (b_dhu_ws<K, V, GATE, C>),
                                                      G.N * G.HV * (V / C), 2 * FNT, (size_t)(DhuWsSmem<K, C>::bytes),
                                                      G, io.q, io.k, io.dout, io.dhT, io.dh0, b, dSh, dSl,
                                                      (uint16_t *)a.dVh, (uint16_t *)a.dVl);
    };
    int rc = dhu_bv(G) == 32 ? dhu(std::integral_constant<int, 32>{}) : dhu(std::integral_constant<int, 64>{});
    if (!rc && var.dw_on_chip) rc = qkwy_launch<K, V, GATE, 0>("dr_chunk mma qkwy", G, a);
    if (!rc && !var.dw_on_chip) {
        rc = qkwy_launch<K, V, GATE, 1>("dr_chunk mma dqkwg", G, a);
        if (!rc) rc = qkwy_launch<K, V, GATE, 2>("dr_chunk mma wy", G, a);
    }
    return rc;
}

} // namespace

#define DRC_FAST_DISPATCH_B(fn, ...)                                                                \
    (G.K == 64 ? (G.V == 64 ? (G.gate ? fn<64, 64, 1>(__VA_ARGS__) : fn<64, 64, 0>(__VA_ARGS__))    \
                            : (G.gate ? fn<64, 128, 1>(__VA_ARGS__) : fn<64, 128, 0>(__VA_ARGS__))) \
               : (G.V == 64 ? (G.gate ? fn<128, 64, 1>(__VA_ARGS__) : fn<128, 64, 0>(__VA_ARGS__))  \
                            : (G.gate ? fn<128, 128, 1>(__VA_ARGS__) : fn<128, 128, 0>(__VA_ARGS__))))

} // namespace DRC_FAST

/* kept: the forward's working set (DRC_FAST::fwd with keep, blocked inverse); the substitution variant
 * recomputes it with its own inverse */
int DRC_FAST::bwd(const Plan &p, const dg_dr_variant &var, const Io<uint16_t> &io, const void *kept) {
    using namespace DRC_FAST;
    const Geom &G = p.G;
    const int64_t rows = G.rows, HV = G.HV, nst = G.nchunks * HV * G.K * G.V;
    const int64_t nk = rows * HV * G.K, nv = rows * HV * G.V;
    /* dq, dk, dbeta, dg of HB heads: the fused qkwy sums the G.vsh heads of one beta and gate */
    const int64_t HB = HV / qkwy_heads(G.vsh, var), nkb = rows * HB * G.K;
    if (!var.solve_tril_blocked) kept = nullptr;
    FastBufs b;
    QkArgs a;
    memset(&a, 0, sizeof a);
    uint16_t *dS = nullptr, *dV = nullptr, *dW = nullptr;
    float *dqv = nullptr, *dkv = nullptr, *dGg = nullptr;
    bool have_b;
    char *own = carve_into(
        const_cast<void *>(kept), [&](Carve &cv) { fast_carve(G, cv, b, true); }, &have_b);
    dS = scratch<uint16_t>((size_t)(2 * nst));
    dV = scratch<uint16_t>((size_t)(2 * nv));
    const bool direct = HB == G.H; /* dq, dk straight to the outputs */
    const bool want_dq = io.dq && !direct, want_dkv = !direct || !var.dw_on_chip;
    if (want_dq) dqv = scratch<float>((size_t)nkb);
    if (want_dkv) dkv = scratch<float>((size_t)nkb);
    if (!var.dw_on_chip) {
        dW = scratch<uint16_t>((size_t)(2 * nk));
        dGg = G.gate ? scratch<float>((size_t)(rows * HV)) : nullptr;
    }
    int rc = -1;
    if (have_b && dS && dV && (!want_dq || dqv) && (!want_dkv || dkv) && (var.dw_on_chip || (dW && (!G.gate || dGg)))) {
        a.q = io.q, a.k = io.k, a.v = io.v, a.beta = io.beta, a.dout = io.dout, a.b = b;
        a.dSh = dS, a.dSl = dS + nst, a.dVh = dV, a.dVl = dV + nv;
        a.dqv = dqv, a.dkv = dkv, a.dWh = dW, a.dWl = dW ? dW + nk : nullptr, a.dGg = dGg;
        a.dq = direct ? io.dq : nullptr, a.dk = direct ? io.dk : nullptr;
        a.dv = io.dv, a.dbeta = io.dbeta, a.dbetaf = io.dbeta32, a.dg = io.dg, a.final_dg = var.gdn_dg_from_final;
        a.rq = direct ? io.rq : nullptr, a.rk = direct ? io.rk : nullptr;
        rc = kept ? 0 : fast_prep_state(p, io, b, var.solve_tril_blocked);
        if (!rc) rc = DRC_FAST_DISPATCH_B(bwd_t, p, var, io, b, a, dS, dS + nst);
        const int fmt = DRC_OPERAND_F16 ? VS_F16 : VS_BF16; /* (the norm's backward with the sums) */
        if (!rc && io.dq && !direct)
            rc = heads_sum("dr_chunk mma gva", rows, G.H, (int)(HB / G.H), G.K, dqv, io.q, io.rq, fmt, io.dq);
        if (!rc && io.dk && !direct)
            rc = heads_sum("dr_chunk mma gva", rows, G.H, (int)(HB / G.H), G.K, dkv, io.k, io.rk, fmt, io.dk);
    }
    release(own);
    release(dS), release(dV), release(dqv), release(dkv), release(dW), release(dGg);
    return rc;
}

} // namespace drc
