/* Prep of the TF32 family at K = 256 with the per-channel gate (kda; k256_ok: chunk 64, V a
 * multiple of 64) on 16-bit tensor cores: mma.sync m16n8k16, bf16 operands (fp16 in the
 * DRC_OPERAND_F16 build, dr_chunk_k256_chan_f16.cu; the gated operands of the wide form are bf16
 * words in both builds, as in the K <= 128 KDA kernels: dr_chunk_kda.cuh) and f32 accumulation.
 * It writes what k256_prep writes for the other gates (dr_chunk_k256.cu), for the state passes and
 * the output pass there, and the TF32 dqkwg and wy.  Per chunk of L <= 64 rows and value head hv,
 * G [64 x K] the cumulative per-channel gate (rows >= L hold G_{L-1}), Gl = G_{L-1}, R [K] the middle
 * of each channel's range of G over the chunk:
 *   Gc = G (f32 [rows, HV, K]),  Kd = K o e^{Gl - G},  Qg = scale Q o e^G   [16-bit words, plain]
 *   Mkk = strictly_lower(M),  M_ij = sum_c k_ic k_jc e^{G_ic - G_jc}
 *   P = scale lower_incl(M'),  M'_ij = sum_c q_ic k_jc e^{G_ic - G_jc}
 *       wide form (every channel's span of G <= WIDE_SPAN): by slices of 64 channels,
 *       M = (K o e^{G - R}) (K o e^{R - G})^T, M' = (Q o e^{G - R}) (K o e^{R - G})^T
 *       [mma, the gated operands split into bf16 hi + lo words, three passes]; else f32 sums
 *       element by element (a steeper gate than the wide form takes: rare, slow, exact)
 *   Ai = (I + diag(beta) Mkk)^-1    [f32: tri_inv]
 *   W = Ai' (K o e^G),  U = Ai' V,  Ai' = Ai diag(beta)     [mma, Ai' and K o e^G split; 64 columns
 *                                                             at a time, V's by cp.async, two buffers]
 * Mkk, P, Ai in f32 [rows, HV, 64] (Mkk, Ai where non-NULL), W in 16-bit words, U as o.U says.
 * One block of 16 warps (ONE_SM_NTH) a chunk and value head, one block per SM.  Shared memory: G
 * (f32, 64 x (K + 8)), R, beta, A and Y (f32 64 x 65, the inverse's; Q raw before them), K (16-bit
 * 64 x (K + 8)), and three split 64 x 64 tiles of scratch: the slices of the gated operands, then
 * M and M' in f32, then Ai', a slice of K o e^G and two buffers of V: 187 KB. */
#include "kernels/cuda/delta/dr_chunk_kda.cuh"
#include "kernels/cuda/delta/dr_chunk_tri_inv.cuh"

namespace drc {
namespace DRC_FAST {
namespace {

namespace kd = DRC_KDA;
constexpr int KK = 256;             /* K */
constexpr int LDK = KK + PAD;       /* row stride of the K tile */
constexpr int LDF = TRI_LD;         /* row stride (floats) of the f32 64 x 64 matrices */
constexpr int GS = kd::gstride(KK); /* row stride (floats) of G */
constexpr int LS = 72;              /* row stride of the 64 x 64 scratch tiles */
constexpr int SPT = 2 * 64 * LS;    /* elements of a split 64 x 64 tile */
constexpr int CNT = ONE_SM_NTH;     /* threads */
using T64 = WT<64, 64, CNT / 32>;
constexpr int CP_BYTES = 4 * (64 * GS + KK + 64 + 2 * 64 * LDF) + tile_bytes(64, KK) + 2 * 3 * SPT;
static_assert(CP_BYTES <= SMEM_MAX, "shared memory");
static_assert(2 * 64 * LDF * 4 >= 64 * KK * 2, "Q (raw, row stride K) in A's and Y's place");
static_assert(2 * 64 * LDF * 4 <= 2 * 2 * SPT, "M and M' (f32) in the first two scratch tiles");

__global__ void __launch_bounds__(CNT, 1) k256c_prep(Geom G, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                                     const float *g, const uint16_t *beta, K256Out o, int blocked) {
    DRC_SMEM(float, sm);
    const ChunkHead b = chunk_head(G);
    const int HV = G.HV, V = G.V, L = b.L, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    /* row r0's offsets: in the [rows, HV, .] buffers (times their last extent), in q and k */
    const int64_t r0 = b.r0, ot = r0 * HV + b.hv, oc = ot * 64, ldc = (int64_t)HV * 64, oqk = (r0 * G.H + b.h) * KK;
    float *sG = sm, *sR = sG + 64 * GS, *sb = sR + KK, *sA = sb + 64, *sY = sA + 64 * LDF;
    uint16_t *sQ = (uint16_t *)sA; /* Q raw [64][K], until M' is made */
    uint16_t *sK = (uint16_t *)(sY + 64 * LDF), *scr = sK + 64 * LDK;
    float *sM = (float *)scr, *sP = sM + 64 * LDF; /* M and M' in f32, over the first two scratch tiles */
    uint16_t *sVb[2] = {scr + 2 * SPT, scr + 2 * SPT + 64 * LS};
    const int m0 = T64::m0(warp), n0 = T64::n0(warp);

    /* the log decays, beta, Q (cp.async) and K */
    kd::gate_load<KK, CNT>(g + ot * KK, (int64_t)HV * KK, L, sG);
    if (tid < 64) sb[tid] = tid < L ? op2f(beta[ot + (int64_t)tid * HV]) : 0.0f;
    for (int e = tid; e < 64 * KK / 8; e += CNT) {
        const int r = e / (KK / 8), c8 = e % (KK / 8);
        const uint16_t *src = q + oqk + (int64_t)r * G.H * KK + 8 * c8;
        cp_async16(sQ + r * KK + 8 * c8, r < L ? src : q, r < L);
    }
    cp_async_commit();
    load_raw<64, KK, CNT>(sK, k + oqk, (int64_t)G.H * KK, L);
    cp_async_wait_all();
    bsync();
    const int narrow = kd::gate_scan<KK>(sG, sR);
    const bool wide = !bsync_or(narrow);

    /* Gc, Kd = K o e^{Gl - G}, Qg = scale Q o e^G (rows < L), by pairs of channels */
    for (int e = tid; e < L * KK / 2; e += CNT) {
        const int i = e / (KK / 2), cc = 2 * (e % (KK / 2));
        const float g0 = sG[i * GS + cc], g1 = sG[i * GS + cc + 1];
        const int64_t off = (ot + (int64_t)i * HV) * KK + cc;
        *(float2 *)(o.Gc + off) = make_float2(g0, g1);
        *(uint32_t *)(o.Kd + off) = pack_op2(op2f(sK[i * LDK + cc]) * kd::kexp(sG[63 * GS + cc] - g0),
                                             op2f(sK[i * LDK + cc + 1]) * kd::kexp(sG[63 * GS + cc + 1] - g1));
        *(uint32_t *)(o.Qg + off) = pack_op2(G.scale * op2f(sQ[i * KK + cc]) * kd::kexp(g0),
                                             G.scale * op2f(sQ[i * KK + cc + 1]) * kd::kexp(g1));
    }

    /* M (strictly lower) and M' (lower, diagonal included) into sM, sP */
    if (wide) {
        const Sp Xa{scr, 64 * LS}, Ka{scr + SPT, 64 * LS}, Kb{scr + 2 * SPT, 64 * LS};
        float am[1][T64::NT][4], ap[1][T64::NT][4];
        acc_zero(am), acc_zero(ap);
        for (int c0 = 0; c0 < KK; c0 += 64) {
            bsync(); /* the last slice's products read (the first time: Q and K in) */
            for (int e = tid; e < 64 * 64; e += CNT) {
                const int i = e >> 6, cc = e & 63, cg = c0 + cc;
                const float d = sG[i * GS + cg] - sR[cg], ep = kd::kexp(d), em = kd::kexp(-d);
                const float kv = op2f(sK[i * LDK + cg]), qv = op2f(sQ[i * KK + cg]);
                split2<true>(qv * ep, Xa.hi[i * LS + cc], Xa.lo()[i * LS + cc]);
                split2<true>(kv * ep, Ka.hi[i * LS + cc], Ka.lo()[i * LS + cc]);
                split2<true>(kv * em, Kb.hi[i * LS + cc], Kb.lo()[i * LS + cc]);
            }
            bsync();
            if (n0 <= m0) { /* (warp tiles above the diagonal: nothing) */
                mma_ss<1, T64::NT, false, false, true>(am, Ka, LS, m0, Kb, LS, n0, 64);
                mma_ss<1, T64::NT, false, false, true>(ap, Xa, LS, m0, Kb, LS, n0, 64);
            }
        }
        bsync(); /* the scratch read: M and M' over it */
        frag_each(am, m0, n0, [&](int i, int j, float &x) { sM[i * LDF + j] = j < i ? x : 0.0f; });
        frag_each(ap, m0, n0, [&](int i, int j, float &x) { sP[i * LDF + j] = j <= i ? x : 0.0f; });
    } else { /* element by element: a thread an (i, j), the channels from lane on (banks apart) */
        for (int e = tid; e < 64 * 64; e += CNT) {
            const int i = e >> 6, j = e & 63;
            float s = 0.0f, t = 0.0f;
            if (j <= i && i < L)
                for (int u = 0; u < KK; u++) {
                    const int cg = (u + lane) & (KK - 1);
                    const float kj = op2f(sK[j * LDK + cg]) * kd::kexp(sG[i * GS + cg] - sG[j * GS + cg]);
                    s += op2f(sK[i * LDK + cg]) * kj, t += op2f(sQ[i * KK + cg]) * kj;
                }
            sM[i * LDF + j] = j < i ? s : 0.0f, sP[i * LDF + j] = t;
        }
    }
    bsync(); /* M, M' made; Q read (A and Y free) */
    /* V's first 64 columns by cp.async, in flight through the inverse and W */
    const auto issue_v = [&](int u) {
        load_raw_async<64, 64, CNT>(sVb[u & 1], v + ot * V + 64 * u, (int64_t)HV * V, L);
        cp_async_commit();
    };
    issue_v(0);
    /* Mkk, P out; A = diag(beta) Mkk; Y = 0 (tri_inv's output starts at zero) */
    for (int e = tid; e < 64 * 64; e += CNT) {
        const int i = e >> 6, j = e & 63;
        const float m = sM[i * LDF + j];
        sA[i * LDF + j] = sb[i] * m, sY[i * LDF + j] = 0.0f;
        if (i < L) {
            if (o.Mkk) o.Mkk[oc + i * ldc + j] = m;
            o.P[oc + i * ldc + j] = G.scale * sP[i * LDF + j];
        }
    }
    bsync();
    tri_inv<CNT>(sA, sY, L, blocked);
    /* Ai out; Ai' = Ai diag(beta), split, into the first scratch tile */
    const Sp aw{scr, 64 * LS}, kg{scr + SPT, 64 * LS};
    for (int e = tid; e < 64 * 64; e += CNT) {
        const int i = e >> 6, j = e & 63;
        const float y = sY[i * LDF + j];
        if (o.Ai && i < L) o.Ai[oc + i * ldc + j] = y;
        split2(y * sb[j], aw.hi[i * LS + j], aw.lo()[i * LS + j]);
    }
    /* W = Ai' (K o e^G), by 64 columns of K */
    for (int c0 = 0; c0 < KK; c0 += 64) {
        bsync(); /* Ai' made (the first time), the last slice's product read */
        for (int e = tid; e < 64 * 64; e += CNT) {
            const int i = e >> 6, cc = e & 63;
            split2(op2f(sK[i * LDK + c0 + cc]) * kd::kexp(sG[i * GS + c0 + cc]), kg.hi[i * LS + cc],
                   kg.lo()[i * LS + cc]);
        }
        bsync();
        float acc[1][T64::NT][4];
        acc_zero(acc);
        mma_ss<1, T64::NT, false, true>(acc, aw, LS, m0, kg, LS, n0, 64);
        frag_pairs(acc, m0, n0, [&](int i, int j, float x0, float x1) {
            if (i < L) *(uint32_t *)(o.W + (ot + (int64_t)i * HV) * KK + c0 + j) = pack_op2(x0, x1);
        });
    }
    /* U = Ai' V, by 64 columns of V, the next ones' loads in flight during each product */
    for (int u = 0; u < V / 64; u++) {
        cp_async_wait_all(); /* V's columns 64u .. */
        bsync();             /* ... in; the other buffer's last product read */
        if (64 * (u + 1) < V) issue_v(u + 1);
        float acc[1][T64::NT][4];
        acc_zero(acc);
        mma_sr<1, T64::NT, false, true>(acc, aw, LS, m0, sVb[u & 1], LS, n0, 64);
        frag_pairs(acc, m0, n0, [&](int i, int j, float x0, float x1) {
            if (i < L) put_pair(o.U, (ot + (int64_t)i * HV) * V + 64 * u + j, x0, x1);
        });
    }
}

} // namespace

int k256_chan_prep(const Plan &p, const Io<uint16_t> &io, const K256Out &o, int blocked) {
    const Geom &G = p.G;
    return DRC_LAUNCH("dr_chunk k256 prep", k256c_prep, G.nchunks * G.HV, CNT, (size_t)CP_BYTES, G, io.q, io.k, io.v,
                      io.g, io.beta, o, blocked);
}

} // namespace DRC_FAST
} // namespace drc
