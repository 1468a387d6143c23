/* The tensor-core kda path (per-channel gate, DG_GATE_CHANNEL) of the chunked delta-rule kernels:
 * entry points used by the dispatch in dr_chunk.cu, and the device helper shared by the kda
 * kernels (dr_chunk_kda_mma*.cu).  Built on the tiles and warp products of dr_chunk_mma.cuh.
 *
 * Shapes taken: bf16 or fp16 storage, gate CHANNEL, chunk 64, K and V in {64, 128}; q, k, v (and
 * dout) 16-byte aligned, o 4-byte aligned (checked by the caller); everything else goes to the
 * generic kernels (dr_chunk_generic.cuh).
 *
 * Two builds of the same kernels, as the head-gate ones (dr_chunk_mma.cuh, DRC_OPERAND_F16):
 * namespace kda takes bf16 words (dr_chunk_kda_mma_fwd.cu, _bwd.cu), kda_h fp16 words
 * (dr_chunk_kda_mma_fwd_f16.cu, _bwd_f16.cu); inside them mm:: is the tile and product machinery
 * of the same operand format (fast or fast_h).  fp16's range (largest 65504 = e^{11.1}) is why the
 * wide form below multiplies its gated operands as bf16 words in both builds (WIDE_SPAN).
 *
 * The gate.  g [rows, HV, K] is the per-token, per-channel log decay; G is its cumulative sum
 * inside the chunk (G_i = g_0 + ... + g_i, rows past the chunk's length L hold G_{L-1}).  The
 * in-chunk products carry Gamma_ijc = exp(G_ic - G_jc) (j <= i) inside the sum over channels c:
 *   M_ij = sum_c x_ic k_jc exp(G_ic - G_jc).
 * This is no plain matrix product.  Folding the gate into the operands as x e^{G} and k e^{-G}
 * would overflow (e^{-G} grows along the chunk), so the chunk is cut into four sub-chunks of 16
 * rows and each block of rows I (i in [16I, 16I+16)) takes its own reference row r = 16I:
 *   for j < 16I:  M_ij = sum_c (x_ic e^{G_ic - G_rc}) (k_jc e^{G_rc - G_jc}),
 * where both exponents are <= 0 for decays (g <= 0), so neither factor overflows: the blocks
 * below the diagonal are tensor-core products of two gated operands (split bf16, three passes).
 * The 16 x 16 blocks on the diagonal are summed element by element in f32 with the exact
 * exp(G_ic - G_jc) (a thread per (i, j)).
 *
 * One reference for the whole chunk (the "wide" form).  Any per-channel reference R_c gives
 *   M_ij = sum_c (x_ic e^{G_ic - R_c}) (k_jc e^{R_c - G_jc});
 * the sub-chunk references above only keep the two factors from overflowing.  When every channel's
 * G spans at most WIDE_SPAN over the chunk (max_i G_ic - min_i G_ic <= 80), R_c = the middle of
 * that range bounds both factors by e^{40} (and below by e^{-40}, far from bf16's and f32's
 * e^{-87}; bf16 words in both builds, see WIDE_SPAN), so the whole chunk is ONE tensor-core
 * product of two gated 64-row operands, the diagonal blocks included, with no f32 element loop
 * (the f32 loops of the sub-chunk form cost one exponential a term); even the products above the
 * diagonal, thrown away, stay below e^{80} |x| |k| (no inf).  Each term keeps the split operands'
 * ~16 bits, as in the sub-chunk form, and the f32 sums are of terms whose true values are bounded by
 * |x_ic k_jc| for i >= j.  The test of the span is per chunk and value head (one block), so a
 * chunk with a steeper gate takes the sub-chunk form.  Typical gates are far inside: per-token log
 * decays of about -0.8 (the benchmark's logsigmoid draws) span about 50 over 64 rows. */
#ifndef DG_KERNELS_CUDA_DR_CHUNK_KDA_CUH
#define DG_KERNELS_CUDA_DR_CHUNK_KDA_CUH

#include "kernels/cuda/delta/dr_chunk_mma.cuh"

namespace drc {

/* whether the kda tensor-core path takes this shape (16-bit calls; pointer alignment aside) */
bool kda_ok(const Geom &G);
/* keep / kept: the forward's working set kept for the backward, as fast::fwd / fast::bwd
 * (dr_chunk_internal.cuh); kda_kept_bytes is its size (the same in both operand formats).
 * kda:: takes bf16 words, kda_h:: fp16 words (the f16bits of the caller passed as uint16_t) */
size_t kda_kept_bytes(const Geom &G);
namespace kda {
int fwd(const Plan &p, const Io<uint16_t> &io, void *keep);
int bwd(const Plan &p, const dg_dr_variant &var, const Io<uint16_t> &io, const void *kept);
} // namespace kda
namespace kda_h {
int fwd(const Plan &p, const Io<uint16_t> &io, void *keep);
int bwd(const Plan &p, const dg_dr_variant &var, const Io<uint16_t> &io, const void *kept);
} // namespace kda_h

#if DRC_OPERAND_F16
#define DRC_KDA kda_h
#else
#define DRC_KDA kda
#endif

namespace DRC_KDA {

namespace mm = DRC_FAST; /* the tiles and products of this build's operand format */
using mm::f2op;
using mm::op2f;

/* e^x for the gate factors: ex2.approx of x log2(e) (two instructions; expf is about eight). Its
 * relative error, about |x| 1e-7 + 2 ulp, is far below the bf16 rounding of the operands it
 * scales (|x| <= 40 in the wide form; where the sub-chunk form goes further the factors are tiny or
 * underflow, as with expf).  The fused qkwy runs ~145 KB of code per block and waits for
 * instruction fetch (dr_chunk_kda_mma_bwd.cu): a few hundred expf a thread were a tenth of it. */
#ifdef DRC_EMU
inline float kexp(float x) { return expf(x); }
#else
__device__ __forceinline__ float kexp(float x) { return __expf(x); }
#endif

using mm::FNT;
using mm::ONE_SM_NTH;
using mm::PAD;
using mm::Sp;

constexpr int LDF = 65; /* row stride of the f32 64 x 64 matrices */
/* The KDA kernels that run one block per SM (prep kp, the qkwy kernels) have ONE_SM_NTH threads
 * (dr_chunk_mma.cuh): against 8 warps (ncu, S1) kp, dqkwg and wy take 12-19 % less time, the fused
 * qkwy 40 % less (its 206 KB of code at 8 warps did not stay in the instruction cache, and its warps
 * stalled on instruction fetch; 135 KB at 16).  The state passes (ks, b_dhu) and the output pass
 * (ko, two blocks per SM) keep FNT. */
/* Row stride (floats) of the cumulative gate tile sG [64][gstride(K)] in shared memory: K + 8,
 * not K.  The kernels read it in the mma accumulator layout, where the lanes of one access sit
 * on eight rows (g = lane / 4) and four column pairs: with a stride of K (a multiple of the 32
 * banks) the eight rows share a bank (an 8-way conflict, measured by ncu as 20-26 % excess
 * shared-memory wavefronts in prep, out and qkwy); K + 8 puts them 8 banks apart. */
__host__ __device__ constexpr int gstride(int K) { return K + 8; }

/* Which of the KDA intermediates are plain bf16 (one word; the others are split hi + lo, see
 * dr_chunk_mma.cuh), as Plain<GATE> is for the head gate: W, U, Kd = K o e^{Gl - G}, V', Qg =
 * scale Q o e^G in the backward's state pass (the output pass multiplies it split); OutS: the output pass reads only the hi words of S; SChain: so does the state pass's V' = U - W S (as Plain<GATE>::SChain).  Errors (relative error norm against the f64
 * reference, CPU emulator, tests/test_cuda_dr_chunk_kda.c's cases; bound 5e-3): see
 * docs/PERF_KERNELS.md, "KDA plain operands". */
struct KPlain {
    static constexpr bool W = true, U = true, Kd = true, Vn = true, OutS = true, Qg = true, SChain = true;
};

/* Scratch between the kernels of one call; split operands as hi/lo pairs of bf16, plain ones
 * (KPlain) as the hi words alone (their lo pointers are NULL).  Forward: W, Kd, Qg = scale Q o e^G
 * (split; the backward reads its hi words, KPlain::Qg) [rows, HW, K]; U [rows, HV, V] (bf16 when
 * plain, else f32); Gl f32 [nchunks, HW, K]; V' [rows, HV, V]; S [nchunks, HV, K, V]; P = scale
 * lower_incl(M') split [rows, HW, 64].  For the backward also S's lo words and Ai, Mkk f32
 * [rows, HW, 64].  HW = shared_heads(G): what does not depend on V is one for the G.vsh heads of a
 * split head (shared_row), the rest each head's. */
struct Bufs {
    uint16_t *Wh, *Wl, *Kdh, *Kdl;
    float *U, *Gl;                 /* U: f32, or bf16 in its first half (KPlain::U) */
    uint16_t *Vnh, *Vnl, *Sh, *Sl; /* Sl: backward only */
    float *Ai, *Mkk;               /* backward only */
    uint16_t *Ph, *Pl, *Qgh, *Qgl;
};
/* b's buffers carved from cv (dr_chunk_internal.cuh); bwd: with the backward's extras (S's lo
 * words, Ai, Mkk), which a forward that keeps its working set for the backward makes too;
 * without them (a forward alone) the state pass stores S's hi words only, as the output pass reads */
void carve(const Geom &G, Carve &cv, Bufs &b, bool bwd);
/* launches prep and the state pass into b (allocated by the caller); hT written when io.hT is set.
 * extras: 0 the forward's buffers only; 1 also Ai and Mkk (for the backward: a forward that keeps
 * its working set, or the backward's recompute) */
int prep_state(const Plan &p, const Io<uint16_t> &io, const Bufs &b, int extras);

/* scratch of gated_tri: two split tiles, 64 and 96 rows of K (+PAD) columns */
template <int K> __host__ __device__ constexpr int tri_scratch_bytes() {
    return 2 * mm::tile_bytes(64, K) + 2 * mm::tile_bytes(96, K);
}

/* The cumulative gate G of a chunk in shared memory, sG [64][gstride(K)], in two steps around the
 * caller's loads: gate_load puts the chunk's log decays g (rows i < L; 0 past them) into sG, every
 * thread loading its share at once (a scan that loads row after row waits for device memory 64
 * times in a row: at one block per multiprocessor that was most of prep's, out's and qkwy's time);
 * after a barrier, gate_scan sums each channel down the rows in place (thread c < K takes channel c;
 * rows >= L end up holding G_{L-1}) and writes sR[c] = the middle of channel c's range of G. It
 * returns 1 on a thread whose channel spans more than WIDE_SPAN (or is not finite), else 0: the
 * caller's next barrier is bsync_or of it, which tells whether the chunk takes the sub-chunk form.
 * NTH: the threads of the block (FNT, or ONE_SM_NTH). */
/* The span the wide form takes: factors within e^{+-40}, as bf16 words in both builds (fp16 words
 * would overflow past e^{11.1}).  In the fp16 build the other operand of the backward's wide
 * products (dM', dMkk, split fp16 words) is split again into bf16 words in registers (mma_ss_bf):
 * each product keeps about 16 bits, as in the bf16 build, far below an fp16 result's rounding. */
constexpr float WIDE_SPAN = 80.0f;
template <int K, int NTH = FNT>
__device__ __forceinline__ void gate_load(const float *g, int64_t ld, int L, float *sG) {
    constexpr int GS = gstride(K);
#pragma unroll 8
    for (int e = threadIdx.x; e < 64 * K; e += NTH) {
        const int i = e / K, c = e % K;
        sG[i * GS + c] = i < L ? g[i * ld + c] : 0.0f;
    }
}
/* gate_load by cp.async, 16 bytes a copy (rows >= L zero-filled), where g is 16-byte aligned (the
 * caller commits and waits); else gate_load's own loads.  K is a multiple of 4, so every row is. */
template <int K, int NTH = FNT>
__device__ __forceinline__ void gate_load_async(const float *g, int64_t ld, int L, float *sG) {
    constexpr int GS = gstride(K), K4 = K / 4;
    static_assert(K % 4 == 0 && GS % 4 == 0, "16-byte rows");
    if ((uintptr_t)g & 15) return gate_load<K, NTH>(g, ld, L, sG);
    for (int e = threadIdx.x; e < 64 * K4; e += NTH) {
        const int i = e / K4, c = 4 * (e % K4);
        cp_async16(sG + i * GS + c, g + (i < L ? i * ld + c : 0), i < L);
    }
}
template <int K> __device__ __forceinline__ int gate_scan(float *sG, float *sR) {
    constexpr int GS = gstride(K);
    const int c = threadIdx.x;
    if (c >= K) return 0;
    float a = 0.0f, lo = 0.0f, hi = 0.0f;
#pragma unroll 16
    for (int i = 0; i < 64; i++) {
        a += sG[i * GS + c];
        sG[i * GS + c] = a;
        lo = i ? fminf(lo, a) : a, hi = i ? fmaxf(hi, a) : a;
    }
    sR[c] = 0.5f * (lo + hi);
    return !(hi - lo <= WIDE_SPAN);
}

/* The chunk's references from G in device memory (row i at Gh[i ldk], rows < L), as gate_scan makes
 * them in shared memory: R_c = the middle of channel c's range of G and Gl_c = G_{L-1,c} into sR,
 * sGl [K]; whether every channel spans at most WIDE_SPAN (the wide form), block-wide.  NTH threads
 * (a multiple of K); scr: 2 NTH floats. */
template <int K, int NTH>
__device__ __forceinline__ bool chan_refs(const float *Gh, int64_t ldk, int L, float *scr, float *sR, float *sGl) {
    constexpr int RS = NTH / K; /* threads a channel */
    static_assert(NTH % K == 0, "threads a channel");
    const int c = threadIdx.x % K, h = threadIdx.x / K;
    float lo = INFINITY, hi = -INFINITY;
#pragma unroll 8
    for (int i = h; i < L; i += RS) {
        const float x = Gh[i * ldk + c];
        lo = fminf(lo, x), hi = fmaxf(hi, x);
    }
    scr[2 * h * K + c] = lo, scr[(2 * h + 1) * K + c] = hi;
    bsync();
    int narrow = 0;
    if (threadIdx.x < K) {
        float l = scr[c], u = scr[K + c];
        for (int j = 1; j < RS; j++) l = fminf(l, scr[2 * j * K + c]), u = fmaxf(u, scr[(2 * j + 1) * K + c]);
        sR[c] = 0.5f * (l + u), sGl[c] = Gh[(L - 1) * ldk + c];
        narrow = !(u - l <= WIDE_SPAN);
    }
    return !bsync_or(narrow);
}

/* A chunk's cumulative gate in device memory, G [rows, ld apart], read at row i and channel c with
 * the rows past the chunk's L (the padding rows of a partial chunk) read at row L - 1, so that their
 * factors stay finite (their operands are zero) */
struct ChunkGate {
    const float *G;
    int64_t ld;
    int L;
    __device__ __forceinline__ float operator()(int i, int c) const { return G[(i < L ? i : L - 1) * ld + c]; }
};

/* The chunk's gate as the gated products take it: G [64][gstride(K)], the references R [K], and
 * whether the wide form applies (see the top of this file) */
struct Gate {
    const float *G, *R;
    bool wide;
};

/* Eight columns of a gated row: x o e^{s (a - b)} (HB false: e^{s a}), split (BF: bf16 words in
 * both builds) into T at offset t; x, a, b, T + t: eight 16-bit words, floats, floats, words, each
 * 16-byte aligned (op8, f8, split8); xv: x's values, for the caller's further use */
template <bool BF = !DRC_OPERAND_F16, bool HB = true>
__device__ __forceinline__ void gated8(Sp T, int t, const uint16_t *x, const float *a, const float *b, float s,
                                       float (&xv)[8]) {
    float av[8], bv[8], y[8];
    mm::op8(x, xv);
    mm::f8(a, av);
    if (HB) mm::f8(b, bv);
#pragma unroll
    for (int u = 0; u < 8; u++) y[u] = xv[u] * kexp(HB ? s * (av[u] - bv[u]) : s * av[u]);
    mm::split8<BF>(y, *(uint4 *)(T.hi + t), *(uint4 *)(T.lo() + t));
}
/* the same, x's values not wanted */
template <bool BF = !DRC_OPERAND_F16, bool HB = true>
__device__ __forceinline__ void gated8(Sp T, int t, const uint16_t *x, const float *a, const float *b, float s) {
    float xv[8];
    gated8<BF, HB>(T, t, x, a, b, s, xv);
}

/* Wide form: T[i] = X[i] o e^{s (G_i - R)} for rows i < 64, split into T (K + PAD columns) as bf16
 * words (in both builds, WIDE_SPAN); s = +1 (query side) or -1 (key side), by the block's NTH
 * threads.  No barrier. */
template <int K, int NTH = FNT>
__device__ __forceinline__ void gated_rows(Sp T, const uint16_t *X, const Gate &gt, float s) {
    constexpr int LD = K + PAD, GS = gstride(K);
    for (int e = threadIdx.x; e < 64 * (K / 8); e += NTH) {
        const int i = e / (K / 8), c = (e % (K / 8)) * 8;
        gated8<true>(T, i * LD + c, X + i * LD + c, gt.G + i * GS + c, gt.R + c, s);
    }
}

/* out[i*LDF + j] = sum_c X_ic Kt_jc exp(G_ic - G_jc) for j < i (STRICT) or j <= i, 0 above the
 * diagonal; i, j < 64.  X, Kt: raw 16-bit tiles [64][K + PAD]; gt: the chunk's gate (wide: its span
 * within WIDE_SPAN); scr: scratch of tri_scratch_bytes<K>() bytes; NTH: the block's threads (at
 * least 6 warps).  Starts and ends with a barrier-free state: the caller puts a barrier before
 * (inputs written) and after (out read).  KB false: Kb is taken as it is in scr, made by the
 * previous call with the same Kt and gate (the key-side factors do not depend on X).
 * Layout of the scratch: Xa (split, 64 rows): row i >= 16 holds X_i e^{G_i - G_{16(i/16)}};
 * Kb (split, 96 rows): for I = 1, 2, 3 the rows 8I(I-1) + j, j < 16I, hold Kt_j e^{G_{16I} - G_j}. */
template <int K, bool STRICT, int NTH = FNT, bool KB = true>
__device__ __forceinline__ void gated_tri(const uint16_t *X, const uint16_t *Kt, const Gate &gt, float *out,
                                          unsigned char *scr) {
    constexpr int LD = K + PAD;
    constexpr int GS = gstride(K);
    const float *sG = gt.G;
    const Sp Xa{(uint16_t *)scr, 64 * LD};
    const Sp Kb{(uint16_t *)(scr + 2 * mm::tile_bytes(64, K)), 96 * LD};
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (gt.wide) { /* one product X e^{G - R} (Kt e^{R - G})^T, masked; warp tiles above the diagonal skip it;
                    * bf16 words in both builds */
        using T = mm::WT<64, 64, NTH / 32>;
        gated_rows<K, NTH>(Xa, X, gt, 1.0f);
        if (KB) gated_rows<K, NTH>(Kb, Kt, gt, -1.0f);
        bsync();
        float acc[1][T::NT][4];
        const int m0 = T::m0(warp), n0 = T::n0(warp);
        mm::acc_zero(acc);
        if (n0 <= m0 + 15) mm::mma_ss<1, T::NT, false, false, true>(acc, Xa, LD, m0, Kb, LD, n0, K);
        mm::frag_each(acc, m0, n0,
                      [&](int i, int j, float &x) { out[i * LDF + j] = (STRICT ? j < i : j <= i) ? x : 0.0f; });
        return;
    }
    for (int e = tid; e < 48 * (K / 8); e += NTH) {
        const int i = 16 + e / (K / 8), c = (e % (K / 8)) * 8, r = i & ~15;
        gated8(Xa, i * LD + c, X + i * LD + c, sG + i * GS + c, sG + r * GS + c, 1.0f);
    }
    for (int e = tid; KB && e < 96 * (K / 8); e += NTH) {
        const int R = e / (K / 8), c = (e % (K / 8)) * 8;
        const int I = R < 16 ? 1 : R < 48 ? 2 : 3, j = R - 8 * I * (I - 1);
        gated8(Kb, R * LD + c, Kt + j * LD + c, sG + 16 * I * GS + c, sG + j * GS + c, 1.0f);
    }
    /* blocks above the diagonal: zero */
    for (int e = tid; e < 64 * 64; e += NTH) {
        const int i = e >> 6, j = e & 63;
        if ((j >> 4) > (i >> 4)) out[i * LDF + j] = 0.0f;
    }
    bsync();
    /* blocks below the diagonal: warp w < 6 takes (I, J) = (1,0) (2,0) (2,1) (3,0) (3,1) (3,2) */
    if (warp < 6) {
        const int I = warp == 0 ? 1 : warp < 3 ? 2 : 3, J = warp - (I * (I - 1)) / 2;
        float acc[1][2][4];
        mm::acc_zero(acc);
        const Sp B{Kb.hi + 8 * I * (I - 1) * LD, Kb.lo_off};
        mm::mma_ss<1, 2, false, false>(acc, Xa, LD, 16 * I, B, LD, 16 * J, K);
        mm::frag_each(acc, 16 * I, 16 * J, [&](int i, int j, float &x) { out[i * LDF + j] = x; });
    }
    /* the diagonal blocks, element by element in f32: a thread per (i, j), j <= i in one block
     * (136 pairs a block); the channels in an order that starts at lane - 8i, so that the lanes of
     * a warp read row i of sG (stride K + 8: bank 8i + c) in different banks */
    for (int p = tid; p < 4 * 136; p += NTH) {
        const int D = p / 136, t = p % 136;
        int a = 0;
        while ((a + 1) * (a + 2) / 2 <= t) a++;
        const int bb = t - a * (a + 1) / 2, i = 16 * D + a, j = 16 * D + bb;
        float s = 0.0f;
        if (!(STRICT && bb == a)) {
            const uint16_t *xi = X + i * LD, *kj = Kt + j * LD;
            const float *gi = sG + i * GS, *gj = sG + j * GS;
#pragma unroll 4
            for (int u = 0; u < K; u++) {
                const int c = (u + lane - 8 * i) & (K - 1);
                s += op2f(xi[c]) * op2f(kj[c]) * kexp(gi[c] - gj[c]);
            }
        }
        out[i * LDF + j] = s;
        if (bb < a) out[j * LDF + i] = 0.0f;
    }
}

} // namespace DRC_KDA
} // namespace drc

#endif
