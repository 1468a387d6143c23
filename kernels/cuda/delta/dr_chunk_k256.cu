/* Prep, the state passes and the output pass of the TF32 family at K = 256 on 16-bit tensor cores
 * (gate NONE, HEAD or CHANNEL, chunk 64, V a multiple of 64; k256_ok; the per-channel gate's prep is
 * dr_chunk_k256_chan.cu's): mma.sync m16n8k16 with bf16 operands
 * (fp16 in the DRC_OPERAND_F16 build, dr_chunk_k256_f16.cu) and f32 accumulation, the building
 * blocks of the head-gate kernels (dr_chunk_mma.cuh, dr_chunk_tri_inv.cuh).  They write Gc, P, Ai,
 * Mkk in f32, W in 16-bit words (read only by these kernels), U / V' and the states in f32 where a
 * TF32 kernel reads them (the TF32 output pass of an unaligned o), else 16-bit words (K256Out): a
 * call of 16-bit kernels throughout keeps them in K256Bufs, the states as plain 16-bit words
 * (K256Plain).  A forward given keep leaves that working set for its backward, which then runs
 * neither prep nor the state pass; else the backward recomputes it.  Per chunk of L <= 64 rows,
 * value head hv, G the cumulative head gate:
 *   prep   (block per chunk, head; 8 warps, two blocks per SM):
 *          Mkk = strictly_lower(K K^T o Gamma),  A = diag(beta) Mkk    [mma, exact products]
 *          P = scale lower_incl(Q K^T o Gamma)                        [mma, exact products]
 *          Ai = (I + A)^-1                [f32: diagonal blocks by substitution, merges on mma]
 *          W = (Ai diag(beta e^G)) K,  U = (Ai diag(beta)) V          [mma, Ai' split]
 *   state  (block per sequence, head, 64 value columns; 8 warps, two blocks per SM; chunks in
 *          order, S [256 x 64] in registers, warp w its rows 32w .. 32w + 31):
 *          V' = U - W S                                               [mma, W and S plain]
 *          S <- e^{G_last} S + K^T (e^{G_last - G} o V')              [mma, V' plain]
 *          stores S entering each chunk (16-bit words for the output pass and the backward; f32
 *          for the TF32 output pass) and V' (over U; f32 for the TF32 output pass, else 16-bit
 *          words).
 *   out    (block per chunk, head, 64 value columns):
 *          O = scale e^G o (Q S) + P V'                               [mma, P split; S, V' plain]
 *   dhu    (the backward's state pass; block per sequence, head, 64 value columns, chunks in
 *          reverse, dS [256 x 64] in registers as S above):
 *          dV' = (e^{G_last - G} o K) dS + P^T dO            [mma, dS plain, P split (HEAD: plain)]
 *          dS <- e^{G_last} dS + Q^T (scale e^G o dO) - W^T dV'       [mma, every factor plain]
 * With the per-channel gate (G [rows, K], Gl = G_{L-1}) the gate sits in prep's Kd = K o e^{Gl - G}
 * and Qg = scale Q o e^G (16-bit words, plain) and in a decay per row of the state:
 *   state  S <- diag(e^{Gl}) S + Kd^T V'                (V' = U - W S as above)
 *   out    O = Qg S + P V'
 *   dhu    dV' = Kd dS + P^T dO (P and dS split),  dS <- diag(e^{Gl}) dS + Qg^T dO - W^T dV'
 *          (dS's lo words go through Y after its hi words, a second pass of Kd dS: plain dS put
 *          dbeta at 3.9e-3 of f64 where dhT's gradient dominates it (test_kda_k256, steep gates),
 *          1.4e-3 split; the head gate keeps plain dS, below FLA's error without it)
 * Precision: the computed operands Ai' and P (but P in dhu with the head gate) enter their
 * products split into hi + lo 16-bit words (about 16 significant bits with bf16, 22 with fp16;
 * dr_chunk_mma.cuh), the inputs k, q, v, dO as they are (exact).  W, U and V' are plain 16-bit
 * words (Plain<GATE>, the choice of the K <= 128 kernels, as FLA stores them), and so are the
 * states S and dS wherever they enter a product and dhu's right factors (K256Plain, as FLA's
 * kernels read h, dh, dO and dv; the passes carry the states in f32): one mma pass a product
 * less, and half the bytes and shared-memory reads of those operands.  Against
 * the f64 recurrence these kernels stay below FLA's error on the same inputs, output by output
 * (docs/PERF_KERNELS.md, `fla_side_by_side.py --f64`).
 * Shared memory.  prep: sA, sY (f32 64 x 65, the inverse's), gate and beta, then two bf16 tiles of
 * 64 x 256: K, and X, which holds Q until P is made, then the split Ai' of W and the lo words of
 * the split Ai' of U (its hi words go to sA, dead after the inverse); V comes in tiles of 256 columns
 * into K's place once W is made: 101 KB, two blocks per SM.  state: the K and W tiles, two slots
 * of the gate, S and V' (plain): 114 KB, two blocks per SM; the next chunk's W comes by cp.async
 * once V' is made, its K once the S update is done, its U into L2 during the S update. */
#include "kernels/cuda/delta/dr_chunk_mma.cuh"
#include "kernels/cuda/delta/dr_chunk_tri_inv.cuh"
#include <type_traits>

namespace drc {
namespace DRC_FAST {
namespace {

constexpr int KK = 256;       /* K */
constexpr int LDK = KK + PAD; /* row stride (16-bit words) of the 64 x K tiles */
constexpr int LDF = TRI_LD;   /* row stride (floats) of the f32 64 x 64 matrices */
constexpr int SBV = 64;       /* value columns a block of the state passes */

constexpr int PREP_BYTES = 4 * (2 * 64 * LDF + 2 * 64) + 2 * tile_bytes(64, KK);
/* floats of the state passes' gate: two slots of 64 (HEAD: this chunk's, the next one's), or with the
 * per-channel gate one row Gl [K] (the chunk's last, read only by the S update) */
__host__ __device__ constexpr int gate_floats(int gate) { return gate == DG_GATE_CHANNEL ? KK : 2 * 64; }
__host__ __device__ constexpr int state_bytes(int gate) {
    return 4 * gate_floats(gate) + 2 * tile_bytes(64, KK) + tile_bytes(KK, SBV) + tile_bytes(64, SBV);
}
/* dhu: the gate, X, Y, P split, dO (and its lo words while dS's update reads a split right factor) */
constexpr int DHU_BYTES =
    4 * KK + tile_bytes(64, KK) + tile_bytes(KK, SBV) + (K256Plain::DhuRight ? 3 : 4) * tile_bytes(64, SBV);
constexpr int OUT_BYTES = 4 * 64 + tile_bytes(64, KK) + tile_bytes(KK, SBV) + 3 * tile_bytes(64, SBV);
static_assert(PREP_BYTES + 1024 <= SMEM_MAX / 2 && OUT_BYTES + 1024 <= SMEM_MAX / 2 &&
                  state_bytes(DG_GATE_HEAD) + 1024 <= SMEM_MAX / 2 &&
                  state_bytes(DG_GATE_CHANNEL) + 1024 <= SMEM_MAX / 2 && DHU_BYTES + 1024 <= SMEM_MAX / 2 &&
                  tile_bytes(64, KK) <= tile_bytes(KK, SBV),
              "shared memory");

/* A block of the state passes (forward and backward; FNT threads): sequence n, value head hv (key
 * head h), 64 value columns from v0; the warp's part of the state [256 x 64] (MT m tiles: its rows
 * sm0 .. sm0 + 16 MT - 1, all columns) and of a 64 x 64 tile of V' or dV' (TV); hb: the block's first
 * element in a [N, HV, K, V] state. */
struct StateBlock {
    static constexpr int MT = KK / 16 / (FNT / 32), NT = SBV / 8;
    using TV = WT<64, SBV>;
    int64_t n, hb;
    int hv, h, v0, sm0, vm0, vn0;
    __device__ StateBlock(const Geom &G) {
        const int NVT = G.V / SBV, warp = threadIdx.x >> 5;
        n = chain_seq(G, blockIdx.x / (G.HV * NVT));
        hv = (int)(blockIdx.x / NVT % G.HV), h = hv / G.grp, v0 = (int)(blockIdx.x % NVT) * SBV;
        sm0 = 16 * MT * warp, vm0 = TV::m0(warp), vn0 = TV::n0(warp);
        hb = (n * G.HV + hv) * (int64_t)KK * G.V + v0;
    }
    /* f(row, col, x0&, x1&) over the column pairs (col, col + 1) of the warp's part of the state
     * (the mma.sync m16n8 layout of frag_pairs, m tile by m tile) */
    template <class F> __device__ __forceinline__ void pairs(float (&S)[MT][NT][4], F f, int tid = threadIdx.x) const {
        const int lane = tid & 31, g = lane >> 2, t = lane & 3, r0 = 16 * MT * (tid >> 5);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++)
                    f(r0 + 16 * mt + g + 8 * hh, nt * 8 + 2 * t, S[mt][nt][2 * hh], S[mt][nt][2 * hh + 1]);
    }
    /* f(row, col, value&) over its elements, in the same order */
    template <class F> __device__ __forceinline__ void each(float (&S)[MT][NT][4], F f) const {
        pairs(S, [&](int r, int j, float &x0, float &x1) { f(r, j, x0), f(r, j + 1, x1); });
    }
    /* the warp's part of the state from src (NULL: zero) */
    __device__ void load(float (&S)[MT][NT][4], const float *src, int V) const {
        each(S, [&](int r, int j, float &x) { x = src ? src[hb + (int64_t)r * V + j] : 0.0f; });
    }
    /* and to dst (NULL: nothing) */
    __device__ void store(float (&S)[MT][NT][4], float *dst, int V) const {
        if (dst) each(S, [&](int r, int j, float &x) { dst[hb + (int64_t)r * V + j] = x; });
    }
    /* row r of the state times e^{Gl_r} (the per-channel gate's decay; Gl [K] in shared memory) */
    __device__ __forceinline__ void decay_rows(float (&S)[MT][NT][4], const float *Gl) const {
        const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const float d = expf(Gl[sm0 + 16 * mt + g + 8 * hh]);
#pragma unroll
                for (int nt = 0; nt < NT; nt++) S[mt][nt][2 * hh] *= d, S[mt][nt][2 * hh + 1] *= d;
            }
    }
};

/* the per-channel gate's Gl = G_{L-1} of the chunk at rows r0 .. r0 + L - 1 (Gc's row [K]) into sGl by
 * cp.async, by the thread tid of the FNT that load it; the caller commits and waits */
__device__ __forceinline__ void load_gl_async(const Geom &G, const float *Gc, int64_t r0, int L, int hv, float *sGl,
                                              int tid) {
    if (tid < KK / 4) cp_async16(sGl + 4 * tid, Gc + ((r0 + L - 1) * G.HV + hv) * KK + 4 * tid, true);
}

/* acc (+)= As B for this warp's part (WT<64, 64>) of a 64 x 64 block, As the split 64 x 64 Ai' (row
 * stride 72), B 64 rows of 64 columns at row stride LDK; the rows i < L of the result to element off
 * of dst (row stride ld) */
__device__ __forceinline__ void prep_prod64(Sp As, const uint16_t *B, Words dst, int64_t off, int64_t ld, int L) {
    using T = WT<64, 64>;
    const int warp = threadIdx.x >> 5, m0 = T::m0(warp), n0 = T::n0(warp);
    float acc[1][T::NT][4];
    acc_zero(acc);
    mma_sr<1, T::NT, false, true>(acc, As, 72, m0, B, LDK, n0, 64);
    frag_pairs(acc, m0, n0, [&](int i, int j, float x0, float x1) {
        if (i < L) put_pair(dst, off + i * ld + j, x0, x1);
    });
}

/* this warp's part (WT<64, 64>) of X K^T o Gamma, X and K 64 x 256 tiles, Gamma(i, j) = e^{G_i - G_j}:
 * zero outside i < L and j < i (incl: j <= i); f(i, j, x_ij, x_i,j+1) for each pair of columns */
template <int GATE, class F>
__device__ __forceinline__ void gated_xkt(const uint16_t *sX, const uint16_t *sK, const float *sG, int L, bool incl,
                                          F f) {
    using T = WT<64, 64>;
    const int warp = threadIdx.x >> 5, m0 = T::m0(warp), n0 = T::n0(warp);
    float acc[1][T::NT][4];
    acc_zero(acc);
    mma_run<1, T::NT, false, false>(acc, sX, LDK, m0, sK, LDK, n0, KK);
    frag_pairs(acc, m0, n0, [&](int i, int j, float y0, float y1) {
        float m[2] = {y0, y1};
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const bool in = (incl ? j + e <= i : j + e < i) && i < L; /* (the factor only there: >= 1 above) */
            m[e] = in ? (GATE == DG_GATE_HEAD ? m[e] * expf(sG[i] - sG[j + e]) : m[e]) : 0.0f;
        }
        f(i, j, m[0], m[1]);
    });
}

template <int GATE>
__global__ void __launch_bounds__(FNT, 2) k256_prep(Geom G, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                                    const float *g, const uint16_t *beta, K256Out o, int blocked) {
    DRC_SMEM(float, sm);
    const int HV = G.HV, V = G.V, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const ChunkHead b = chunk_head(G);
    const int hv = b.hv, h = b.h, L = b.L;
    const int64_t r0 = b.r0;
    float *sA = sm, *sY = sA + 64 * LDF, *sG = sY + 64 * LDF, *sb = sG + 64;
    uint16_t *sK = (uint16_t *)(sb + 64), *sX = sK + 64 * LDK;
    /* the gate (warp 0: rows lane, 32 + lane), its loads in flight beside those of q and k */
    float x0 = 0.0f, x1 = 0.0f;
    if (GATE == DG_GATE_HEAD && warp == 0) {
        if (lane < L) x0 = g[(r0 + lane) * HV + hv];
        if (32 + lane < L) x1 = g[(r0 + 32 + lane) * HV + hv];
    }
    load_raw_async<64, KK>(sX, q + (r0 * G.H + h) * KK, (int64_t)G.H * KK, L);
    cp_async_commit();
    load_raw<64, KK>(sK, k + (r0 * G.H + h) * KK, (int64_t)G.H * KK, L);
    if (GATE == DG_GATE_HEAD && warp == 0) { /* G = cumsum(g): to Gc, and to sG with rows >= L holding G_{L-1} */
        const float s0 = warp_scan(x0, lane), s1 = warp_scan(x1, lane) + shfl_idx(s0, 31);
        const float last = L <= 32 ? shfl_idx(s0, L - 1) : shfl_idx(s1, L - 33);
        if (lane < L) o.Gc[(r0 + lane) * HV + hv] = s0;
        if (32 + lane < L) o.Gc[(r0 + 32 + lane) * HV + hv] = s1;
        sG[lane] = lane < L ? s0 : last, sG[32 + lane] = 32 + lane < L ? s1 : last;
    } else if (GATE != DG_GATE_HEAD && tid < 64) {
        sG[tid] = 0.0f;
    }
    if (tid < 64) sb[tid] = tid < L ? op2f(beta[(r0 + tid) * HV + hv]) : 0.0f;
    for (int e = tid; e < 64 * LDF; e += FNT) sY[e] = 0.0f;
    cp_async_wait_all(); /* q */
    bsync();
    const int64_t oc = (r0 * HV + hv) * 64, ldc = (int64_t)HV * 64;
    /* Mkk, A = diag(beta) Mkk */
    gated_xkt<GATE>(sK, sK, sG, L, false, [&](int i, int j, float m0, float m1) {
        sA[i * LDF + j] = sb[i] * m0, sA[i * LDF + j + 1] = sb[i] * m1;
        if (o.Mkk && i < L) *(float2 *)(o.Mkk + oc + i * ldc + j) = make_float2(m0, m1);
    });
    /* P = scale lower_incl(Q K^T o Gamma) */
    gated_xkt<GATE>(sX, sK, sG, L, true, [&](int i, int j, float p0, float p1) {
        if (i < L) *(float2 *)(o.P + oc + i * ldc + j) = make_float2(G.scale * p0, G.scale * p1);
    });
    bsync();
    tri_inv<FNT>(sA, sY, L, blocked);
    if (o.Ai)
        for (int e = tid; e < L * 64; e += FNT) {
            const int i = e / 64, j = e % 64;
            o.Ai[oc + i * ldc + j] = sY[i * LDF + j];
        }
    /* the split Ai' of W in X (Q is dead), of U: hi words in sA (dead), lo words in X after W's;
     * this thread's elements all lie in column tid % 64 */
    const Sp aw{sX, 64 * 72};
    const Sp au = GATE == DG_GATE_HEAD ? Sp{(uint16_t *)sA, (int)(sX + 2 * 64 * 72 - (uint16_t *)sA)} : aw;
    {
        const int jc = tid & 63;
        const float bj = sb[jc], ej = GATE == DG_GATE_HEAD ? expf(sG[jc]) : 1.0f;
#pragma unroll 4
        for (int i = tid >> 6; i < 64; i += FNT / 64) {
            const float y = sY[i * LDF + jc] * bj;
            split2(y * ej, aw.hi[i * 72 + jc], aw.lo()[i * 72 + jc]);
            if (GATE == DG_GATE_HEAD) split2(y, au.hi[i * 72 + jc], au.lo()[i * 72 + jc]);
        }
    }
    bsync();
    /* W = (Ai diag(beta e^G)) K, by 64 columns */
    for (int u = 0; u < KK / 64; u++)
        prep_prod64(aw, sK + 64 * u, Words{(float *)o.W, true}, (r0 * HV + hv) * KK + 64 * u, (int64_t)HV * KK, L);
    /* U = (Ai diag(beta)) V, V by tiles of 256 columns in K's place */
    for (int v0 = 0; v0 < V; v0 += KK) {
        const int nv = V - v0 < KK ? V - v0 : KK, n8 = nv / 8;
        bsync(); /* K's place free (the products above, or the last tile's) */
        for (int e = tid; e < 64 * n8; e += FNT) {
            const int r = e / n8, c8 = e % n8;
            const uint16_t *src = v + ((r0 + r) * HV + hv) * V + v0 + c8 * 8;
            cp_async16(sK + r * LDK + c8 * 8, r < L ? src : v, r < L);
        }
        cp_async_commit();
        cp_async_wait_all();
        bsync();
        for (int u = 0; u < nv / 64; u++)
            prep_prod64(au, sK + 64 * u, o.U, (r0 * HV + hv) * V + v0 + 64 * u, (int64_t)HV * V, L);
    }
}

/* block per (sequence n, value head hv, 64 value columns from v0): the TF32 family's state pass.
 * 8 warps, two blocks per SM (the other block's steps fill this one's waits: each step is a chain
 * W S -> V' -> K^T V'); S [256 x 64] in registers, warp w its rows 32w .. 32w + 31 (two m tiles:
 * the V' fragments of the S update serve both).  One set of tiles: the next chunk's W and gate
 * come by cp.async once this chunk's V' is made (W dead), its K once the S update is done (K dead),
 * each a commit group of its own, so that a step waits for W before W S and for K only before the
 * S update; its U is asked into L2 during the S update and read into V''s accumulator. */
template <int GATE> __global__ void __launch_bounds__(FNT, 2) k256_state(Geom G, const uint16_t *k, K256Out o) {
    constexpr bool CH = GATE == DG_GATE_CHANNEL;
    DRC_SMEM(float, sm);
    const int HV = G.HV, V = G.V, tid = threadIdx.x, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    using SB = StateBlock;
    using TV = SB::TV;
    const SB b(G);
    static_assert(Plain<GATE>::W && Plain<GATE>::Vn && K256Plain::Chain, "W, V' and S enter as 16-bit words");
    const int64_t n = b.n;
    const int hv = b.hv, h = b.h, v0 = b.v0, sm0 = b.sm0, vm0 = b.vm0, vn0 = b.vn0;
    constexpr int LV = SBV + PAD; /* row stride of S's and V''s tiles */
    /* sG [2][64] (this chunk's, the next one's; CHANNEL: Gl [K]); K (CHANNEL: Kd); W; S; e^{G_last - G}
     * o V' (CHANNEL: V') */
    uint16_t *sK = (uint16_t *)(sm + gate_floats(GATE)), *sW = sK + 64 * LDK, *sS = sW + 64 * LDK, *sVn = sS + KK * LV;
    float S[SB::MT][SB::NT][4];
    b.load(S, o.h0, V);
    int64_t c0, c1;
    seq_chunks(G, n, c0, c1);
    /* the next chunk's U asked into L2 during this one's S update, read into V''s accumulator
     * when used (S takes 64 of the 128 registers a thread has at two blocks a SM: none are left to
     * hold U through the S update).  The offsets of the loads are made from tid_fresh() where used
     * (kept live across the loop, 250 bytes of them spilled). */
    auto prefetch_u = [&](int64_t cc) {
        const Chunk x = seq_chunk(G, n, c0, cc);
        const int64_t off = (x.r0 * HV + hv) * V + v0;
        if (o.U.w16) prefetch_tile<64, SBV>((const uint16_t *)o.U.f + off, (int64_t)HV * V, x.L, tid_fresh());
        else prefetch_tile<64, SBV>(o.U.f + off, (int64_t)HV * V, x.L, tid_fresh());
    };
    /* chunk cc's W tile and gate (into slot pair), a commit group */
    auto issue_w = [&](int64_t cc, int pair) {
        const Chunk x = seq_chunk(G, n, c0, cc);
        load_raw_async<64, KK, FNT>(sW, o.W + (x.r0 * HV + hv) * KK, (int64_t)HV * KK, x.L, tid_fresh());
        load_gate_async<GATE>(G, x.r0, x.L, hv, o.Gc, sm + 64 * pair, tid_fresh());
        cp_async_commit();
    };
    /* chunk cc's K tile (CHANNEL: Kd, and Gl for the S update), a commit group */
    auto issue_k = [&](int64_t cc) {
        const Chunk x = seq_chunk(G, n, c0, cc);
        if (CH) {
            load_raw_async<64, KK, FNT>(sK, o.Kd + (x.r0 * HV + hv) * KK, (int64_t)HV * KK, x.L, tid_fresh());
            load_gl_async(G, o.Gc, x.r0, x.L, hv, sm, tid_fresh());
        } else {
            load_raw_async<64, KK, FNT>(sK, k + (x.r0 * G.H + h) * KK, (int64_t)G.H * KK, x.L, tid_fresh());
        }
        cp_async_commit();
    };
    if (c0 < c1) issue_w(c0, 0), issue_k(c0);
    for (int64_t c = c0; c < c1; c++) {
        const Chunk ch = seq_chunk(G, n, c0, c);
        const int L = ch.L, pair = (int)((c - c0) & 1);
        const int64_t r0 = ch.r0;
        const float *sG = sm + (CH ? 0 : 64 * pair);
        /* the state entering the chunk into shared memory as 16-bit words (and out in f32 for the
         * TF32 output pass; its 16-bit words go out from shared memory below) */
        const int64_t sb = (c * HV + hv) * (int64_t)KK * V + v0;
        b.pairs(S, [&](int r, int j, float x0, float x1) {
            put_sp2<false>(Sp{sS, 0}, LV, r, j, x0, x1);
            if (!o.Hst.w16) put_pair(o.Hst, sb + (int64_t)r * V + j, x0, x1);
        });
        cp_async_wait_1(); /* this chunk's W and gate (its K may still be in flight) */
        bsync();
        if (o.Hst.w16) /* the state's 16-bit words out, whole 128-byte lines a warp */
            store_raw<KK, SBV, FNT, 1>((uint16_t *)o.Hst.f + sb, V, sS, tid);
        { /* V' = U - W S: out (over U: f32 or 16-bit words), and e^{G_last - G} o V' into shared memory */
            float eg[2];
            row_decay2<GATE>(sG, vm0, eg);
            float acc[1][TV::NT][4]; /* W S - U */
#pragma unroll
            for (int nt = 0; nt < TV::NT; nt++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int i = vm0 + gq + 8 * hh, j = vn0 + nt * 8 + 2 * tq;
                    const float2 x = i < L ? get_pair(o.U, ((r0 + i) * HV + hv) * V + v0 + j) : make_float2(0, 0);
                    acc[0][nt][2 * hh] = -x.x, acc[0][nt][2 * hh + 1] = -x.y;
                }
#pragma unroll 1
            for (int kq = 0; kq < KK; kq += 64) /* (by 64 rows of S: unrolled over all 256, spills) */
                mma_run<1, TV::NT, false, true>(acc, sW + kq, LDK, vm0, sS + kq * LV, LV, vn0, 64);
#pragma unroll
            for (int nt = 0; nt < TV::NT; nt++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int i = vm0 + gq + 8 * hh, j = vn0 + nt * 8 + 2 * tq;
                    const float y0 = -acc[0][nt][2 * hh], y1 = -acc[0][nt][2 * hh + 1];
                    if (i < L) put_pair(o.U, ((r0 + i) * HV + hv) * V + v0 + j, y0, y1);
                    put_sp2<false>(Sp{sVn, 0}, LV, i, j, eg[hh] * y0, eg[hh] * y1);
                }
        }
        cp_async_wait_all(); /* this chunk's K */
        bsync();
        if (c + 1 < c1) issue_w(c + 1, pair ^ 1), prefetch_u(c + 1); /* W read, the other gate slot free */
        /* S <- e^{G_last} S + K^T (e^{G_last - G} o V')  (CHANNEL: diag(e^{Gl}) S + Kd^T V') */
        if (GATE == DG_GATE_HEAD) {
            const float d = expf(sG[63]);
            b.each(S, [&](int, int, float &x) { x *= d; });
        }
        if (CH) b.decay_rows(S, sG);
        mma_run<SB::MT, SB::NT, true, true>(S, sK, LDK, sm0, sVn, LV, 0, 64);
        bsync();
        if (c + 1 < c1) issue_k(c + 1); /* K read (S and V' are written only after the next step's first barrier) */
    }
    b.store(S, o.hT, V);
}

/* block per (sequence n, value head hv, 64 value columns from v0): the TF32 family's backward state
 * pass (its k_dhu), chunks in reverse, dS [256 x 64] (the gradient of the state leaving the chunk)
 * in registers as S is in k256_state (8 warps, two blocks per SM, warp w its rows 32w .. 32w + 31):
 *   dS[c] = dS                                     (16-bit words, the states' layout; K256Plain)
 *   dV' = (e^{G_last - G} o K) dS + P^T dO                  [mma, dS plain, P split (HEAD: plain)]
 *   dS <- e^{G_last} dS + Q^T (scale e^G o dO) - W^T dV'    [mma, 16-bit words: K256Plain]
 * Shared memory, one set of tiles, each place holding two things in turn: the gate; X (K, then Q
 * once dV' is made); Y (dS's 16-bit words, then W); P split (then -dV'); dO (then scale e^G o dO,
 * made in place: each thread rewrites the words it read): 99 KB, two blocks per SM.  K, dO and
 * the gate come by cp.async at a step's start, Q and W once dV' is made, P through registers; the
 * next chunk's tiles are asked into L2 during the dS update, so that the waits at those two
 * points, which the other block's work covers, are on L2. */
template <int GATE>
__global__ void __launch_bounds__(FNT, 2)
    k256_dhu(Geom G, const uint16_t *q, const uint16_t *k, const uint16_t *dout, K256Dhu d) {
    DRC_SMEM(float, sm);
    constexpr bool CH = GATE == DG_GATE_CHANNEL;
    const int HV = G.HV, V = G.V, tid = threadIdx.x;
    constexpr int LV = SBV + PAD; /* row stride of the 64-column tiles */
    using SB = StateBlock;
    using TV = SB::TV;
    const SB b(G);
    const int64_t n = b.n;
    const int hv = b.hv, h = b.h, v0 = b.v0, sm0 = b.sm0, vm0 = b.vm0, vn0 = b.vn0;
    static_assert(Plain<GATE>::W && K256Plain::Chain, "W and dS enter as 16-bit words");
    float *sG = sm; /* the gate (CHANNEL: Gl [K]) */
    uint16_t *sX = (uint16_t *)(sm + KK), *sY = sX + 64 * LDK;
    /* q and k, or (CHANNEL) Qg and Kd, as the chunk's K-column tiles: base, row offset of r0 and stride */
    const uint16_t *tq = CH ? d.Qg : q, *tk = CH ? d.Kd : k;
    const int64_t ldx = CH ? (int64_t)HV * KK : (int64_t)G.H * KK, hx = CH ? hv : h, nhx = CH ? HV : G.H;
    const Sp sP{sY + KK * LV, 64 * LV};        /* P, then -dV' */
    const Sp sB{sP.hi + 2 * 64 * LV, 64 * LV}; /* dO, then scale e^G o dO (lo words: !DhuRight) */
    float dS[SB::MT][SB::NT][4];
    b.load(dS, d.dhT, V);
    int64_t c0, c1;
    seq_chunks(G, n, c0, c1);
    /* chunk cc's tiles asked into L2 (a line a thread a tile; P's rows are two lines) */
    const auto prefetch = [&](int64_t cc) {
        const Chunk x = seq_chunk(G, n, c0, cc);
        const int t = tid_fresh();
        prefetch_tile<64, KK>(tk + (x.r0 * nhx + hx) * KK, ldx, x.L, t);
        prefetch_tile<64, KK>(tq + (x.r0 * nhx + hx) * KK, ldx, x.L, t);
        prefetch_tile<64, KK>(d.W + (x.r0 * HV + hv) * KK, (int64_t)HV * KK, x.L, t);
        prefetch_tile<64, SBV>(dout + (x.r0 * HV + hv) * V + v0, (int64_t)HV * V, x.L, t);
        prefetch_tile<64, 64>(d.P + (x.r0 * HV + hv) * 64, (int64_t)HV * 64, x.L, t - 64);
    };
    for (int64_t c = c1 - 1; c >= c0; c--) {
        const Chunk ch = seq_chunk(G, n, c0, c);
        const int L = ch.L;
        const int64_t r0 = ch.r0;
        bsync(); /* the last chunk's reads of X (Q), Y (W), P (-dV'), dO (scale e^G o dO) and the gate */
        load_raw_async<64, KK, FNT>(sX, tk + (r0 * nhx + hx) * KK, ldx, L, tid_fresh());
        load_raw_async<64, SBV, FNT>(sB.hi, dout + (r0 * HV + hv) * V + v0, (int64_t)HV * V, L, tid_fresh());
        load_gate_async<GATE>(G, r0, L, hv, d.Gc, sG, tid_fresh());
        if (CH) load_gl_async(G, d.Gc, r0, L, hv, sG, tid_fresh());
        cp_async_commit();
        { /* P, split but with the head gate (prep wrote its rows i < L, zero above the diagonal) */
            F32Tile<64, 64, FNT> pp;
            pp.load(d.P + (r0 * HV + hv) * 64, (int64_t)HV * 64, L);
            pp.put<!K256Plain::dhu_p(GATE)>(sP, LV);
        }
        /* dS leaving the chunk into Y as 16-bit words (out from there below) */
        const int64_t sb = (c * HV + hv) * (int64_t)KK * V + v0;
        b.pairs(
            dS,
            [&](int r, int j, float x0, float x1) {
                put_sp2<false>(Sp{sY, 0}, LV, r, j, x0, x1);
            },
            tid_fresh());
        cp_async_wait_all(); /* K, dO, the gate */
        bsync();
        store_raw<KK, SBV, FNT, 1>(d.dSh + sb, V, sY, tid); /* whole 128-byte lines a warp */
        /* dV' = (e^{G_last - G} o K) dS + P^T dO  (CHANNEL: Kd dS + P^T dO) */
        float acc[1][TV::NT][4];
        acc_zero(acc);
#pragma unroll 1
        for (int kq = 0; kq < KK; kq += 16)
            mma_run<1, TV::NT, false, true>(acc, sX + kq, LDK, vm0, sY + kq * LV, LV, vn0, 16);
        if (CH) { /* and dS's lo words in Y, the same product again */
            bsync();
            b.pairs(
                dS,
                [&](int r, int j, float x0, float x1) {
                    put_sp2<false>(Sp{sY, 0}, LV, r, j, x0 - op2f(f2op(x0)), x1 - op2f(f2op(x1)));
                },
                tid_fresh());
            bsync();
#pragma unroll 1
            for (int kq = 0; kq < KK; kq += 16)
                mma_run<1, TV::NT, false, true>(acc, sX + kq, LDK, vm0, sY + kq * LV, LV, vn0, 16);
        }
        if (GATE == DG_GATE_HEAD) {
            float eg[2];
            row_decay2<GATE>(sG, vm0, eg);
            frag_each(acc, vm0, vn0, [&](int i, int, float &x) { x *= eg[(i - vm0) >> 3]; });
        }
#pragma unroll 1
        for (int kc = 0; kc < 64; kc += 16)
            mma_p<1, TV::NT, true, true, !K256Plain::dhu_p(GATE), false>(acc, Sp{sP.hi + kc * LV, sP.lo_off}, LV, vm0,
                                                                         Sp{sB.hi + kc * LV, 0}, LV, vn0, 16);
        bsync(); /* X (K), Y (dS), P and dO read */
        load_raw_async<64, KK, FNT>(sX, tq + (r0 * nhx + hx) * KK, ldx, L, tid_fresh());
        load_raw_async<64, KK, FNT>(sY, d.W + (r0 * HV + hv) * KK, (int64_t)HV * KK, L, tid_fresh());
        cp_async_commit();
        frag_pairs(acc, vm0, vn0, [&](int i, int j, float y0, float y1) {
            if (i < L) *(float2 *)(d.dVn + ((r0 + i) * HV + hv) * V + v0 + j) = make_float2(y0, y1);
            put_sp2<!K256Plain::DhuRight>(sP, LV, i, j, -y0, -y1);
        });
        /* scale e^G o dO in dO's place (rows >= L: dO is zero there; CHANNEL: in Qg, dO as it is) */
        for (int e = tid; !CH && e < 64 * SBV / 2; e += FNT) {
            const int i = e / (SBV / 2), j = 2 * (e % (SBV / 2));
            const float f = GATE == DG_GATE_HEAD ? G.scale * expf(sG[i]) : G.scale;
            put_sp2<!K256Plain::DhuRight>(sB, LV, i, j, f * op2f(sB.hi[i * LV + j]), f * op2f(sB.hi[i * LV + j + 1]));
        }
        cp_async_wait_all(); /* Q, W */
        bsync();
        if (c > c0) prefetch(c - 1);
        /* dS <- e^{G_last} dS + Q^T (scale e^G o dO) - W^T dV'  (CHANNEL: diag(e^{Gl}) dS + Qg^T dO - W^T dV') */
        if (GATE == DG_GATE_HEAD) {
            const float f = expf(sG[63]);
            b.each(dS, [&](int, int, float &x) { x *= f; });
        }
        if (CH) b.decay_rows(dS, sG);
            /* by 16 rows of the chunk, two at a time (all four at once, or one at a time, spill more) */
#pragma unroll 2
        for (int kc = 0; kc < 64; kc += 16) {
            mma_p<SB::MT, SB::NT, true, true, false, !K256Plain::DhuRight>(dS, Sp{sX + kc * LDK, 0}, LDK, sm0,
                                                                           Sp{sB.hi + kc * LV, sB.lo_off}, LV, 0, 16);
            mma_p<SB::MT, SB::NT, true, true, false, !K256Plain::DhuRight>(dS, Sp{sY + kc * LDK, 0}, LDK, sm0,
                                                                           Sp{sP.hi + kc * LV, sP.lo_off}, LV, 0, 16);
        }
    }
    b.store(dS, d.dh0, V);
}

/* block per (chunk, value head hv, up to OVT tiles of 64 value columns from t0): the TF32
 * family's output pass,
 *   O = scale e^G o (Q S) + P V'                  [mma, P split; S, V' plain; Q exact]
 * S the state entering the chunk and V' as the state pass left them in 16-bit words (Hst16, Vn16), P
 * as prep left it (f32).  Q, the first tile's S and V' come by cp.async, in flight while P comes
 * through registers and is split into shared memory: 99 KB, two blocks per SM.  Q and P serve the
 * block's tiles in turn (at S3 a tile a block moved 2.9 GB from L2, which ran at 71 % of its
 * peak; four a block took 0.62 ms against 0.69 with two and 0.88 with one; at L1, eight 0.240
 * against four's 0.248); the next tile's S comes once Q S is made, its V' once P V' is. */
constexpr int OVT = 8;
template <int GATE>
__global__ void __launch_bounds__(FNT, 2)
    k256_out(Geom G, const uint16_t *q, const float *Gc, const float *P, const uint16_t *Vn16, const uint16_t *Hst16,
             const uint16_t *Qg, uint16_t *out) {
    constexpr bool CH = GATE == DG_GATE_CHANNEL; /* (Q is then prep's Qg = scale Q o e^G) */
    DRC_SMEM(float, sm);
    constexpr int LV = SBV + PAD;
    const int HV = G.HV, V = G.V, tid = threadIdx.x, warp = tid >> 5, NVT = V / SBV, NB = (NVT + OVT - 1) / OVT;
    const int64_t c = blockIdx.x / (HV * NB);
    const int hv = (int)(blockIdx.x / NB % HV), h = hv / G.grp, t0 = (int)(blockIdx.x % NB) * OVT;
    const int nt = NVT - t0 < OVT ? NVT - t0 : OVT;
    const Chunk ch = chunk_at(G, c);
    const int L = ch.L;
    const int64_t r0 = ch.r0;
    float *sG = sm;
    uint16_t *sQ = (uint16_t *)(sm + 64), *sS = sQ + 64 * LDK, *sV = sS + KK * LV;
    const Sp sP{sV + 64 * LV, 64 * LV};
    using T = WT<64, SBV>;
    const int m0 = T::m0(warp), n0 = T::n0(warp);
    const uint16_t *gS = Hst16 + (c * HV + hv) * (int64_t)KK * V, *gV = Vn16 + (r0 * HV + hv) * V;
    if (CH) load_raw_async<64, KK>(sQ, Qg + (r0 * HV + hv) * KK, (int64_t)HV * KK, L);
    else load_raw_async<64, KK>(sQ, q + (r0 * G.H + h) * KK, (int64_t)G.H * KK, L);
    load_raw_async<KK, SBV>(sS, gS + t0 * SBV, V, KK);
    load_raw_async<64, SBV>(sV, gV + t0 * SBV, (int64_t)HV * V, L);
    cp_async_commit();
    if (GATE == DG_GATE_HEAD && tid < 64) sG[tid] = tid < L ? Gc[(r0 + tid) * HV + hv] : 0.0f;
    { /* P (prep wrote its rows i < L, zero above the diagonal), split */
        F32Tile<64, 64> pr;
        pr.load(P + (r0 * HV + hv) * 64, (int64_t)HV * 64, L);
        pr.put(sP, LV);
    }
    cp_async_wait_all(); /* Q, S, V' */
    bsync();
    for (int t = 0; t < nt; t++) {
        const int v0 = (t0 + t) * SBV;
        if (t) cp_async_wait_1(), bsync(); /* this tile's S (its V' may be in flight) */
        float acc[1][T::NT][4];
        acc_zero(acc);
        mma_run<1, T::NT, false, true>(acc, sQ, LDK, m0, sS, LV, n0, KK);
        if (t + 1 < nt) { /* S read: the next tile's */
            bsync();
            load_raw_async<KK, SBV>(sS, gS + v0 + SBV, V, KK);
            cp_async_commit();
        }
        /* scale e^G o (Q S), then + P V' */
        if (!CH)
            frag_each(acc, m0, n0,
                      [&](int i, int, float &x) { x *= GATE == DG_GATE_HEAD ? G.scale * expf(sG[i]) : G.scale; });
        if (t) cp_async_wait_all(), bsync(); /* this tile's V' */
        mma_p<1, T::NT, false, true, true, false>(acc, sP, LV, m0, Sp{sV, 0}, LV, n0, 64);
        frag_pairs(acc, m0, n0, [&](int i, int j, float x0, float x1) {
            if (i < L) *(uint32_t *)(out + ((r0 + i) * HV + hv) * V + v0 + j) = pack_op2(x0, x1);
        });
        if (t + 1 < nt) { /* V' read: the next tile's */
            bsync();
            load_raw_async<64, SBV>(sV, gV + v0 + SBV, (int64_t)HV * V, L);
            cp_async_commit();
        }
    }
}

} // namespace

/* f(gate) with the call's gate as a constant (std::integral_constant) */
template <class F> int by_gate(int gate, F f) {
    switch (gate) {
    case DG_GATE_HEAD: return f(std::integral_constant<int, DG_GATE_HEAD>{});
    case DG_GATE_CHANNEL: return f(std::integral_constant<int, DG_GATE_CHANNEL>{});
    default: return f(std::integral_constant<int, DG_GATE_NONE>{});
    }
}

int k256_prep_state(const Plan &p, const Io<uint16_t> &io, const K256Out &o, int blocked) {
    const Geom &G = p.G;
    int rc = G.gate == DG_GATE_CHANNEL ? k256_chan_prep(p, io, o, blocked)
             : G.gate == DG_GATE_HEAD
                 ? DRC_LAUNCH("dr_chunk k256 prep", (k256_prep<DG_GATE_HEAD>), G.nchunks * G.HV, FNT,
                              (size_t)PREP_BYTES, G, io.q, io.k, io.v, io.g, io.beta, o, blocked)
                 : DRC_LAUNCH("dr_chunk k256 prep", (k256_prep<DG_GATE_NONE>), G.nchunks * G.HV, FNT,
                              (size_t)PREP_BYTES, G, io.q, io.k, io.v, io.g, io.beta, o, blocked);
    if (rc) return rc;
    const int64_t grid = G.N * G.HV * (G.V / SBV);
    return by_gate(G.gate, [&](auto gc) {
        constexpr int GT = decltype(gc)::value;
        return DRC_LAUNCH("dr_chunk k256 state", (k256_state<GT>), grid, FNT, (size_t)state_bytes(GT), G, io.k, o);
    });
}

int k256_dhu(const Plan &p, const Io<uint16_t> &io, const K256Dhu &d) {
    const Geom &G = p.G;
    const int64_t grid = G.N * G.HV * (G.V / SBV);
    return by_gate(G.gate, [&](auto gc) {
        constexpr int GT = decltype(gc)::value;
        return DRC_LAUNCH("dr_chunk k256 dhu", (k256_dhu<GT>), grid, FNT, (size_t)DHU_BYTES, G, io.q, io.k, io.dout, d);
    });
}

int k256_out(const Plan &p, const Io<uint16_t> &io, const float *Gc, const float *P, const uint16_t *Vn16,
             const uint16_t *Hst16, const uint16_t *Qg) {
    const Geom &G = p.G;
    const int64_t grid = G.nchunks * G.HV * ((G.V / SBV + OVT - 1) / OVT);
    return by_gate(G.gate, [&](auto gc) {
        constexpr int GT = decltype(gc)::value;
        return DRC_LAUNCH("dr_chunk k256 out", (k256_out<GT>), grid, FNT, (size_t)OUT_BYTES, G, io.q, Gc, P, Vn16,
                          Hst16, Qg, io.o);
    });
}

} // namespace DRC_FAST

#if !DRC_OPERAND_F16 /* the same for both operand formats: defined once, in the bf16 build */
void k256_carve(const Geom &G, Carve &cv, K256Bufs &b, bool for_bwd) {
    const int64_t rows = G.rows, HV = G.HV, nst = G.nchunks * HV * G.K * G.V;
    const bool ch = G.gate == DG_GATE_CHANNEL;
    b.Gc = G.gs ? cv.take<float>(rows * HV * G.gs) : nullptr;
    b.W = cv.take<uint16_t>(rows * HV * G.K);
    b.Kd = ch ? cv.take<uint16_t>(rows * HV * G.K) : nullptr;
    b.Qg = ch ? cv.take<uint16_t>(rows * HV * G.K) : nullptr;
    b.Vn = cv.take<uint16_t>(rows * HV * G.V);
    b.P = cv.take<float>(rows * HV * 64);
    b.Ai = for_bwd ? cv.take<float>(rows * HV * 64) : nullptr;
    b.Mkk = for_bwd ? cv.take<float>(rows * HV * 64) : nullptr;
    b.Sh = cv.take<uint16_t>(nst);
}

size_t k256_kept_bytes(const Geom &G) {
    if (!k256_ok(G, nullptr, nullptr, nullptr)) return 0;
    K256Bufs b;
    return carve_bytes([&](Carve &cv) { k256_carve(G, cv, b, true); });
}

bool k256_ok(const Geom &G, const void *q, const void *k, const void *v) {
    static const char *off = getenv("DG_DRC_K256_OFF");
    if (off && *off && strcmp(off, "0")) return false;
    return G.C == 64 && G.K == 256 && G.V % 64 == 0 && (((uintptr_t)q | (uintptr_t)k | (uintptr_t)v) & 15) == 0;
}
#endif

} // namespace drc
