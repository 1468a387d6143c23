/* The per-channel gate's last backward kernel at K = 256 (kda; k256_ok), after k256_dqkwg and
 * k256_wy (dr_chunk_k256_bwd.cu): the products of wy with the gate inside the sum over the chunk's
 * rows, then dg.  Per chunk of L <= 64 rows and value head, G the cumulative per-channel gate,
 * Gamma_ijc = e^{G_ic - G_jc}, dMkk = diag(beta) dA as wy left it (f32 [rows, HV, 64], strictly
 * lower), R_c the middle of channel c's range of G over the chunk:
 *   rp = (dMkk o Gamma) K,  cp = (dMkk o Gamma)^T K      (as sums over rows, per channel)
 *   dk += rp + cp,  dG += k o (rp - cp)                   (dk, dG [rows, HV, K] f32, in place)
 *   dg = the reverse cumsum of dG over the chunk
 * Wide form (every channel's span of G within WIDE_SPAN, dr_chunk_kda.cuh), by tiles of 64 columns
 * of K:  rp = e^{G - R} o (dMkk Kr),  cp = e^{R - G} o (dMkk^T Kl),  Kr = K o e^{R - G}, Kl = K o
 * e^{G - R}  [mma: dMkk plain 16-bit words (K256Plain::WyDmkk), Kr and Kl split into bf16 hi + lo
 * words, in both builds]; else the sums element by element in f32 (steeper gates: rare, slow, exact).
 * Built twice as the other K = 256 kernels are (bf16; fp16 in dr_chunk_k256_chan_bwd_f16.cu, where
 * dMkk is bf16 words too, the products' format).  A block of 8 warps a chunk and value head, 46 KB
 * of shared memory. */
#include "kernels/cuda/delta/dr_chunk_kda.cuh"

namespace drc {
namespace DRC_FAST {
namespace {

namespace kd = DRC_KDA;
constexpr int KK = 256;          /* K */
constexpr int LT = 64 + PAD;     /* row stride of the 64 x 64 tiles */
constexpr int SPT = 2 * 64 * LT; /* elements of a split 64 x 64 tile */
using T64 = WT<64, 64>;
/* dMkk (bf16 words), Kr and Kl (split); R, Gl [K]; chan_refs' scratch [2 FNT] (over Kr) */
constexpr int GM_BYTES = 2 * (64 * LT + 2 * SPT) + 4 * 2 * KK;
static_assert(2 * SPT * 2 >= 4 * 2 * FNT, "chan_refs' scratch over Kr and Kl");

__global__ void __launch_bounds__(FNT) k256c_gamma(Geom G, K256Bwd a) {
    DRC_SMEM(float, sm);
    const ChunkHead b = chunk_head(G);
    const int HV = G.HV, L = b.L, tid = threadIdx.x, warp = tid >> 5, gq = (tid & 31) >> 2, tq = tid & 3;
    /* row r0's offsets: in the [rows, HV, K] buffers, in k, in the [rows, HV, 64] ones */
    const int64_t ok = (b.r0 * HV + b.hv) * KK, ldk = (int64_t)HV * KK, oq = (b.r0 * G.H + b.h) * KK;
    const int64_t ldq = (int64_t)G.H * KK, oc = (b.r0 * HV + b.hv) * 64, ldc = (int64_t)HV * 64;
    uint16_t *sM = (uint16_t *)sm;
    const Sp Kr{sM + 64 * LT, 64 * LT}, Kl{Kr.hi + SPT, 64 * LT};
    float *sR = (float *)(Kl.hi + SPT), *sGl = sR + KK;
    const float *Gh = a.Gc + ok;
    const kd::ChunkGate gat{Gh, ldk, L};
    const bool wide = kd::chan_refs<KK, FNT>(Gh, ldk, L, (float *)Kr.hi, sR, sGl);
    for (int e = tid; e < 64 * 64; e += FNT) {
        const int i = e / 64, j = e % 64;
        sM[i * LT + j] = f2bf(i < L ? a.dMkk[oc + i * ldc + j] : 0.0f);
    }
    bsync(); /* dMkk in */
    if (wide) {
        const int m0 = T64::m0(warp), n0 = T64::n0(warp);
        for (int x0 = 0; x0 < KK; x0 += 64) {
            if (x0) bsync(); /* the last tile's products read Kr and Kl */
            for (int e = tid; e < 64 * 64; e += FNT) {
                const int j = e / 64, c = e % 64;
                const float kv = j < L ? op2f(a.k[oq + j * ldq + x0 + c]) : 0.0f, d = gat(j, x0 + c) - sR[x0 + c];
                split2<true>(kv * kd::kexp(-d), Kr.hi[j * LT + c], Kr.lo()[j * LT + c]);
                split2<true>(kv * kd::kexp(d), Kl.hi[j * LT + c], Kl.lo()[j * LT + c]);
            }
            bsync();
            float rp[1][T64::NT][4], cp[1][T64::NT][4];
            acc_zero(rp), acc_zero(cp);
            mma_run<1, T64::NT, false, true, true>(rp, sM, LT, m0, Kr.hi, LT, n0, 64);
            mma_run<1, T64::NT, false, true, true>(rp, sM, LT, m0, Kr.lo(), LT, n0, 64);
            mma_run<1, T64::NT, true, true, true>(cp, sM, LT, m0, Kl.hi, LT, n0, 64);
            mma_run<1, T64::NT, true, true, true>(cp, sM, LT, m0, Kl.lo(), LT, n0, 64);
#pragma unroll
            for (int nt = 0; nt < T64::NT; nt++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int i = m0 + gq + 8 * (q >> 1), c = n0 + nt * 8 + 2 * tq + (q & 1);
                    if (i >= L) continue;
                    const float d = gat(i, x0 + c) - sR[x0 + c];
                    const float r = kd::kexp(d) * rp[0][nt][q], s = kd::kexp(-d) * cp[0][nt][q];
                    const int64_t o = ok + i * ldk + x0 + c;
                    a.dkv[o] += r + s;
                    a.dG[o] += op2f(a.k[oq + i * ldq + x0 + c]) * (r - s);
                }
        }
    } else { /* the gate inside the sums over rows: f32, a thread an (i, c) */
        for (int e = tid; e < L * KK; e += FNT) {
            const int i = e / KK, c = e % KK;
            const float gi = gat(i, c);
            float r = 0.0f, s = 0.0f;
            for (int j = 0; j < i; j++)
                r += bf2f(sM[i * LT + j]) * op2f(a.k[oq + j * ldq + c]) * kd::kexp(gi - gat(j, c));
            for (int m = i + 1; m < L; m++)
                s += bf2f(sM[m * LT + i]) * op2f(a.k[oq + m * ldq + c]) * kd::kexp(gat(m, c) - gi);
            const int64_t o = ok + i * ldk + c;
            a.dkv[o] += r + s;
            a.dG[o] += op2f(a.k[oq + i * ldq + c]) * (r - s);
        }
    }
    bsync(); /* dG complete (this block's stores, seen by its threads after the barrier) */
    if (a.dg)
        for (int c = tid; c < KK; c += FNT) {
            float acc = 0.0f;
            for (int i = L - 1; i >= 0; i--) {
                acc += a.dG[ok + i * ldk + c];
                a.dg[ok + i * ldk + c] = acc;
            }
        }
}

} // namespace

int k256_chan_gamma(const Plan &p, const K256Bwd &a) {
    const Geom &G = p.G;
    return DRC_LAUNCH("dr_chunk k256 gamma", k256c_gamma, G.nchunks * G.HV, FNT, (size_t)GM_BYTES, G, a);
}

} // namespace DRC_FAST
} // namespace drc
