/* Tensor-core building blocks of the fast chunked delta-rule kernels (dr_chunk_mma_*.cu): shared
 * memory tiles of bf16, warp-level tile products on mma.sync m16n8k16 (bf16 operands, f32
 * accumulation), the fragment layout of the accumulators, row and column reductions, and the
 * buffers that pass between the kernels.
 *
 * Precision.  bf16 inputs (q, k, v, dO) enter the products as they are (exact).  A computed f32
 * operand X (W, U, states, the inverse, V', gated products) is split into two bf16 tiles,
 * X = hi + lo with hi = bf16(X), lo = bf16(X - hi) (about 16 significant bits together); a product
 * of two split operands takes three mma passes (hi hi + lo hi + hi lo), of a split and a plain one
 * two.  So the chunked algebra keeps close to f32 accuracy while running on bf16 tensor cores.
 *
 * Plain-bf16 intermediates (as flash-linear-attention stores them): a compile-time choice per
 * gate and operand, Plain<GATE> below.  A plain operand is stored as its hi word only (no lo array
 * written or read; half the bytes) and enters its products in one mma pass less.  What decides
 * it is the relative error norm ||x - ref|| / ||ref|| against the f64 reference (the test's bound
 * for bf16 is 5e-3), measured in the CPU emulator (DRC_EMU), q and k L2-normalised, h0 and dhT
 * present; docs/PERF_KERNELS.md has the tables.  Worst over o, hT, dq, dk, dv, dg, dbeta, dh0:
 *   - HEAD gate, W, U, V' plain: <= 2.5e-3 at K = V = 128, T = 512 and 2048 (split: <= 1.7e-3);
 *     3.3e-3 (dk) in the worst of 100 random draws of the smallest case (B 3, T 1, K 64, V 128;
 *     split: 1.9e-3).  U is then bf16, in the first half of its f32 buffer.
 *   - S stays split: with S plain too, dbeta reached 1.0e-2 (over the bound) and dg 4e-3 in one
 *     of 30 draws of that small case (T = 512, 2048: <= 2.5e-3, which alone had looked safe).
 *   - GATE NONE, W and U plain (on the H100, tests/test_cuda_dr_chunk.c): <= 3.2e-3 (o) at
 *     T = 8192, K = V = 128 (split: 2.5e-3); <= 2.9e-3 in the small cases; delta_rule S1 fwd+bwd
 *     11 % faster.  V' plain too (H100, test_cuda_dr_chunk): o 3.8e-3 at T = 8192 (V' split:
 *     3.2e-3), worst of 40 random T = 1 draws 2.9e-3 (dk, dbeta; split: the same), of 12 T = 130
 *     draws 2.9e-3 (dk; split 2.6e-3); delta_rule fwd+bwd 5 % faster at S1 and S2 (the state pass
 *     stores half the V' bytes and its K^T V' takes one mma pass less, as do the backward's
 *     products with V').  FLA's own delta_rule is 5.4e-3 from ours on the side by side's inputs
 *     (docs/PERF.md).
 *   - dS, dV', Ai, dW stay split for both gates: plain dS and dV' gave 3.4e-3 in dbeta; dS alone
 *     plain fails test_dr_chunk_bf16_draws (worst of 40 random T = 1 draws): dg 5.9e-3 with the
 *     head gate (the last-row term trace(S0^T dS1) cancels), dbeta 6.3e-3 without.
 *   - the output pass f_out reads only the hi words of S and V' for both gates (the split values
 *     still drive the recurrence and the backward): o 2.5e-3 against 1.7e-3 split, without a gate.
 *   - the K = 256 kernels (dr_chunk_k256*.cu) take the same choices but for the states: S and dS
 *     enter their products plain there (K256Plain, dr_chunk_internal.cuh), as in FLA's kernels;
 *     both sides were measured against an f64 recurrence on FLA's benchmark inputs
 *     (bench/fla_side_by_side.py --f64, docs/PERF_KERNELS.md): ours below FLA's error for every
 *     output and gradient, split or plain states alike.  Run at K = 256, the T = 1 draws above
 *     fail the bound with plain states as they do here (dg 3.6e-2, dbeta 1.3e-2; split: dg 5e-5,
 *     dbeta 3.2e-3); FLA's error on such draws is not measured (docs/PERF_KERNELS.md, "K = 256").
 *
 * Tiles: row-major bf16 in shared memory, rows padded by 8 elements (16 bytes) so that the 8 row
 * addresses of an ldmatrix fall in different banks.  Blocks have 8 warps (FNT = 256 threads), the
 * one-block-per-SM kernels 16 (ONE_SM_NTH; they pass the thread count to the helpers); an M x N
 * product (M in {64, 128}) is split by warps (WT): M = 128, 8 warps: warp w takes rows 16w..16w+15,
 * all N columns; M = 64: rows 16(w%4).., columns (w/4)*N/2 .. + N/2 (16 warps: (w/4)*N/4 .. + N/4). */
#ifndef DG_KERNELS_CUDA_DR_CHUNK_MMA_CUH
#define DG_KERNELS_CUDA_DR_CHUNK_MMA_CUH

#include "kernels/cuda/delta/dr_chunk_internal.cuh"

/* The 16-bit operand format: bf16 (the default), or IEEE fp16 where DRC_OPERAND_F16 is defined to 1
 * before this header (dr_chunk_mma_fwd_f16.cu, dr_chunk_mma_bwd_f16.cu compile the head-gate kernels
 * a second time so).  Every 16-bit word of those kernels -- the inputs, the outputs, the hi and lo
 * words of the split operands, the plain intermediates -- is then fp16, and the products run on
 * mma.sync ... f16.f16 with f32 accumulation.  The two builds live in namespaces of their own:
 * DRC_FAST is drc::fast (bf16) or drc::fast_h (fp16). */
#ifndef DRC_OPERAND_F16
#define DRC_OPERAND_F16 0
#endif
#if DRC_OPERAND_F16
#define DRC_FAST fast_h
#else
#define DRC_FAST fast
#endif

namespace drc {
namespace DRC_FAST {

/* ---- the operand format's scalars and product ---- */
#if DRC_OPERAND_F16
__host__ __device__ __forceinline__ float op2f(uint16_t h) { return h2f(h); }
__host__ __device__ __forceinline__ uint16_t f2op(float f) { return f2h(f); }
__forceinline__ __device__ void mma_op(float c[4], const uint32_t a[4], const uint32_t b[2]) { mma16816_f16(c, a, b); }
#else
__host__ __device__ __forceinline__ float op2f(uint16_t h) { return bf2f(h); }
__host__ __device__ __forceinline__ uint16_t f2op(float f) { return f2bf(f); }
__forceinline__ __device__ void mma_op(float c[4], const uint32_t a[4], const uint32_t b[2]) { mma16816(c, a, b); }
#endif
/* two values into one 32-bit word, lo in the low half */
__host__ __device__ __forceinline__ uint32_t pack_op2(float lo, float hi) {
    return (uint32_t)f2op(lo) | ((uint32_t)f2op(hi) << 16);
}

constexpr int FNT = 256; /* threads per block */
/* Threads of a block of the kernels that run one block per SM (200-224 KB of shared memory: the
 * qkwy kernels of both families, KDA's prep and output pass): 16 warps.  Latency-bound at one
 * block, they gain from four warps a scheduler instead of two, and each thread's accumulator tiles
 * (WT<64, N, 16>) and the code unrolled over them are half those of 8 warps (128 registers
 * suffice).  Measured against 8 warps: dr_chunk_kda.cuh (KDA), dr_chunk_mma_bwd.cu (qkwy). */
constexpr int ONE_SM_NTH = 512;
constexpr int FC = 64; /* chunk */
constexpr int PAD = 8;
/* value columns per block of the forward passes (f_out, f_state by default): V = 128 runs as two
 * blocks per (sequence, head), so that the 128 (S1) sequence-heads fill two blocks per
 * multiprocessor */
constexpr int BV = 64;

/* multiprocessors of the device (132, an H100 SXM, in the emulation or when it cannot be asked) */
inline int64_t sm_count() {
#ifdef DRC_EMU
    return 132;
#else
    return dg_cuda_sm_count() > 0 ? dg_cuda_sm_count() : 132;
#endif
}

/* Block-steps of a state pass with BV value columns a block: a block runs one (sequence, head,
 * tile) chain, a step per chunk, so the pass is nchunks * HV * V / BV steps of blocks, the longest
 * chain maxc of them in a row.  With equal sequences (batched) steps / maxc = N * HV * V / BV, the
 * number of blocks. */
inline int64_t state_steps(const Geom &G, int BV) { return G.nchunks * G.HV * (G.V / BV); }

/* Value columns per block of the state passes (their BV template argument): 64, or 32 when the
 * blocks of 64 columns would leave multiprocessors idle: when the longest chain is longer than the
 * steps each multiprocessor would run (batched: fewer blocks than SMs).  The passes are chains of
 * dependent chunk steps, one chain per block; with few (sequence, head) pairs (S2: B2 H16, 64 blocks
 * of 64 columns for 132 SMs) 32 columns give twice the chains, each half the work a step (H100,
 * S2: GDN fwd+bwd 14 % faster, delta_rule 20 %).  At S1 (256 blocks of 64) 32 columns are 7 %
 * slower: the W, K loads of a step are repeated by four blocks instead of two.  Packed sequences
 * of mixed lengths (cu_seqlens) count by their longest: the blocks of the short ones are done long
 * before it. */
inline int state_bv(const Geom &G) { return G.V % 64 == 0 && state_steps(G, 64) < G.maxc * sm_count() ? 32 : 64; }

/* Value columns of a block of the backward state passes (b_dhu_ws, KDA's b_dhu): 32 when the
 * blocks of 32 columns all fit on the GPU at once (S2; packed sequences: when the steps of the
 * blocks of 32 columns are no more than the longest chain's on every SM), else 64.  b_dhu_ws runs
 * one block of 512 threads per SM at either; KDA's b_dhu one or two (dhu_prefetch64). */
inline int dhu_bv(const Geom &G) { return G.V % 64 == 0 && state_steps(G, 32) <= G.maxc * sm_count() ? 32 : 64; }

/* bytes of a tile of R rows and Cc columns (bf16) */
__host__ __device__ constexpr int tile_bytes(int R, int Cc) { return R * (Cc + PAD) * 2; }

/* ---- warp tile products ----
 * acc[MT][NT] += A (16 MT x kdim) * B (kdim x 8 NT) for this warp's tile at (m0, n0).
 * A(m, k) = A[m*lda + k] (A_KM false) or A[k*lda + m] (A_KM true: A stored transposed);
 * B(k, n) = B[n*ldb + k] (B_KN false) or B[k*ldb + n] (B_KN true). */
/* the A fragments (16 MT rows x 16 k) and B fragments (16 k x 8 NT columns) of k step k0, by ldmatrix */
template <int MT, bool A_KM>
__device__ __forceinline__ void frag_a(uint32_t (&a)[MT][4], const uint16_t *A, int lda, int m0, int k0) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        if (!A_KM) ldsm_x4(a[mt], A + (m0 + mt * 16 + (lane & 15)) * lda + k0 + (lane >> 4) * 8);
        else ldsm_x4_t(a[mt], A + (k0 + (lane & 7) + (lane >> 4) * 8) * lda + m0 + mt * 16 + ((lane >> 3) & 1) * 8);
    }
}
template <int NT, bool B_KN>
__device__ __forceinline__ void frag_b(uint32_t (&b)[NT][2], const uint16_t *B, int ldb, int n0, int k0) {
    static_assert(NT % 2 == 0, "n tiles in pairs");
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2) {
        uint32_t r[4];
        if (!B_KN) ldsm_x4(r, B + (n0 + nt * 8 + (lane & 7) + (lane >> 4) * 8) * ldb + k0 + ((lane >> 3) & 1) * 8);
        else ldsm_x4_t(r, B + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ldb + n0 + nt * 8 + (lane >> 4) * 8);
        b[nt][0] = r[0], b[nt][1] = r[1], b[nt + 1][0] = r[2], b[nt + 1][1] = r[3];
    }
}

/* BF: the words are bf16, whatever the build's operand format (KDA's fp16 build multiplies the
 * gated operands of its one-reference form as bf16 words: dr_chunk_kda.cuh) */
template <int MT, int NT, bool A_KM, bool B_KN, bool BF = !DRC_OPERAND_F16>
__device__ __forceinline__ void mma_run(float (&acc)[MT][NT][4], const uint16_t *A, int lda, int m0, const uint16_t *B,
                                        int ldb, int n0, int kdim) {
    for (int k0 = 0; k0 < kdim; k0 += 16) {
        uint32_t a[MT][4], b[NT][2];
        frag_a<MT, A_KM>(a, A, lda, m0, k0);
        frag_b<NT, B_KN>(b, B, ldb, n0, k0);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                if constexpr (BF) mma16816(acc[mt][nt], a[mt], b[nt]);
                else mma_op(acc[mt][nt], a[mt], b[nt]);
            }
    }
}

/* a split tile: hi and lo parts, lo at a fixed element offset from hi */
struct Sp {
    uint16_t *hi;
    int lo_off; /* elements */
    __device__ __forceinline__ uint16_t *lo() const { return hi + lo_off; }
};

/* split x split: three passes; split x raw, raw x split: two */
template <int MT, int NT, bool A_KM, bool B_KN, bool BF = !DRC_OPERAND_F16>
__device__ __forceinline__ void mma_ss(float (&acc)[MT][NT][4], Sp A, int lda, int m0, Sp B, int ldb, int n0,
                                       int kdim) {
    mma_run<MT, NT, A_KM, B_KN, BF>(acc, A.hi, lda, m0, B.hi, ldb, n0, kdim);
    mma_run<MT, NT, A_KM, B_KN, BF>(acc, A.lo(), lda, m0, B.hi, ldb, n0, kdim);
    mma_run<MT, NT, A_KM, B_KN, BF>(acc, A.hi, lda, m0, B.lo(), ldb, n0, kdim);
}
/* split x split, A in words of the build's format and B in bf16 words: mma_ss in the bf16 build; in
 * the fp16 build each of A's fragments hi + lo (fp16, about 22 bits) is split again into bf16 words
 * in registers, and the three passes run on bf16 tensor cores (KDA's one-reference gated products,
 * whose gated operand B would leave fp16's range: dr_chunk_kda.cuh) */
template <int MT, int NT, bool A_KM, bool B_KN>
__device__ __forceinline__ void mma_ss_bf(float (&acc)[MT][NT][4], Sp A, int lda, int m0, Sp B, int ldb, int n0,
                                          int kdim) {
#if !DRC_OPERAND_F16
    mma_ss<MT, NT, A_KM, B_KN>(acc, A, lda, m0, B, ldb, n0, kdim);
#else
    for (int k0 = 0; k0 < kdim; k0 += 16) {
        uint32_t ah[MT][4], al[MT][4], bh[NT][2], bl[NT][2];
        frag_a<MT, A_KM>(ah, A.hi, lda, m0, k0);
        frag_a<MT, A_KM>(al, A.lo(), lda, m0, k0);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const float x0 = h2f((uint16_t)ah[mt][r]) + h2f((uint16_t)al[mt][r]);
                const float x1 = h2f((uint16_t)(ah[mt][r] >> 16)) + h2f((uint16_t)(al[mt][r] >> 16));
                const uint16_t h0 = f2bf(x0), h1 = f2bf(x1);
                ah[mt][r] = (uint32_t)h0 | ((uint32_t)h1 << 16);
                al[mt][r] = (uint32_t)f2bf(x0 - bf2f(h0)) | ((uint32_t)f2bf(x1 - bf2f(h1)) << 16);
            }
        frag_b<NT, B_KN>(bh, B.hi, ldb, n0, k0);
        frag_b<NT, B_KN>(bl, B.lo(), ldb, n0, k0);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                mma16816(acc[mt][nt], ah[mt], bh[nt]);
                mma16816(acc[mt][nt], al[mt], bh[nt]);
                mma16816(acc[mt][nt], ah[mt], bl[nt]);
            }
    }
#endif
}
template <int MT, int NT, bool A_KM, bool B_KN>
__device__ __forceinline__ void mma_sr(float (&acc)[MT][NT][4], Sp A, int lda, int m0, const uint16_t *B, int ldb,
                                       int n0, int kdim) {
    mma_run<MT, NT, A_KM, B_KN>(acc, A.hi, lda, m0, B, ldb, n0, kdim);
    mma_run<MT, NT, A_KM, B_KN>(acc, A.lo(), lda, m0, B, ldb, n0, kdim);
}
template <int MT, int NT, bool A_KM, bool B_KN>
__device__ __forceinline__ void mma_rs(float (&acc)[MT][NT][4], const uint16_t *A, int lda, int m0, Sp B, int ldb,
                                       int n0, int kdim) {
    mma_run<MT, NT, A_KM, B_KN>(acc, A, lda, m0, B.hi, ldb, n0, kdim);
    mma_run<MT, NT, A_KM, B_KN>(acc, A, lda, m0, B.lo(), ldb, n0, kdim);
}

/* any of the above by flags: AS (BS) = A (B) is split, else only its hi part is read (a raw tile
 * is Sp{ptr, 0}).  Passes: hi hi, then lo hi if AS, then hi lo if BS (the order of mma_ss). */
template <int MT, int NT, bool A_KM, bool B_KN, bool AS, bool BS>
__device__ __forceinline__ void mma_p(float (&acc)[MT][NT][4], Sp A, int lda, int m0, Sp B, int ldb, int n0, int kdim) {
    mma_run<MT, NT, A_KM, B_KN>(acc, A.hi, lda, m0, B.hi, ldb, n0, kdim);
    if (AS) mma_run<MT, NT, A_KM, B_KN>(acc, A.lo(), lda, m0, B.hi, ldb, n0, kdim);
    if (BS) mma_run<MT, NT, A_KM, B_KN>(acc, A.hi, lda, m0, B.lo(), ldb, n0, kdim);
}

/* Which computed operands are plain bf16 (one word, see the top of this file), wherever they are
 * stored, loaded or multiplied.  SChain: S is stored split for the backward, but the state pass's
 * own V' = U - W S reads its hi word only, as FLA's fwd_h multiplies its bf16 h (the errors:
 * docs/PERF_KERNELS.md, "Plain operands") */
template <int GATE> struct Plain { /* (the same for both gates) */
    static constexpr bool W = true, U = true, Vn = true, S = false, SChain = true;
};

/* warp tiling of an M x N output (M in {64, 128}) over NW warps (8: a block of FNT threads; 16:
 * the blocks of 512 of the qkwy kernels and KDA's prep and output pass): warp w takes the rows 16 (w mod M/16) .. + 15 and the S-th part
 * of the columns, S = w div (M/16), of NW / (M/16) parts (NT tiles of 8 columns each) */
template <int M, int N, int NW = FNT / 32> struct WT {
    static constexpr int MW = M / 16, NS = NW / MW; /* warps down the rows, parts of the columns */
    static_assert(NW % MW == 0 && N % (16 * NS) == 0, "warp tiling");
    static constexpr int NT = N / (8 * NS);
    __device__ __forceinline__ static int m0(int w) { return 16 * (w % MW); }
    __device__ __forceinline__ static int n0(int w) { return (w / MW) * (N / NS); }
};

template <int NT> __device__ __forceinline__ void acc_zero(float (&acc)[1][NT][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int q = 0; q < 4; q++) acc[0][nt][q] = 0.0f;
}

/* f(row, col, value&) over this thread's accumulator elements (one m tile) */
template <int NT, class F> __device__ __forceinline__ void frag_each(float (&acc)[1][NT][4], int m0, int n0, F f) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int q = 0; q < 4; q++) f(m0 + g + ((q >> 1) << 3), n0 + nt * 8 + 2 * t + (q & 1), acc[0][nt][q]);
}

/* ---- splitting, stores ---- */
/* x = h + l in the build's operand format, or (BF) in bf16 words */
template <bool BF = !DRC_OPERAND_F16> __device__ __forceinline__ void split2(float x, uint16_t &h, uint16_t &l) {
    h = BF ? f2bf(x) : f2op(x);
    l = BF ? f2bf(x - bf2f(h)) : f2op(x - op2f(h));
}
/* Eight columns a thread, as 16-byte vectors (p 16-byte aligned; the emulation checks it): eight
 * 16-bit words as floats (op8), eight floats (f8), eight floats as their split words (split8,
 * split2), one vector each for hi and lo.  For the element-wise row passes (gating, splitting,
 * copies out): a vector load or store in place of eight word-sized ones, and one index a thread */
__device__ __forceinline__ void check16(const void *p) {
#ifdef DRC_EMU
    if ((uintptr_t)p & 15) {
        fprintf(stderr, "dr_chunk emulation: a 16-byte vector access at %p is not 16-byte aligned\n", p);
        abort();
    }
#else
    (void)p;
#endif
}
__device__ __forceinline__ void op8(const uint16_t *p, float (&x)[8]) {
    check16(p);
    uint16_t w[8];
    const uint4 v = *(const uint4 *)p;
    memcpy(w, &v, 16);
#pragma unroll
    for (int u = 0; u < 8; u++) x[u] = op2f(w[u]);
}
__device__ __forceinline__ void f8(const float *p, float (&x)[8]) {
    check16(p);
    const float4 a = *(const float4 *)p, b = *(const float4 *)(p + 4);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}
template <bool BF = !DRC_OPERAND_F16>
__device__ __forceinline__ void split8(const float (&x)[8], uint4 &hi, uint4 &lo) {
    check16(&hi), check16(&lo);
    uint16_t h[8], l[8];
#pragma unroll
    for (int u = 0; u < 8; u++) split2<BF>(x[u], h[u], l[u]);
    uint4 vh, vl;
    memcpy(&vh, h, 16), memcpy(&vl, l, 16);
    hi = vh, lo = vl;
}
/* the pair (row, col), (row, col+1) of an accumulator into a split tile */
__device__ __forceinline__ void put_split2(Sp t, int ld, int row, int col, float x0, float x1) {
    uint16_t h0, l0, h1, l1;
    split2(x0, h0, l0);
    split2(x1, h1, l1);
    *(uint32_t *)(t.hi + row * ld + col) = (uint32_t)h0 | ((uint32_t)h1 << 16);
    *(uint32_t *)(t.lo() + row * ld + col) = (uint32_t)l0 | ((uint32_t)l1 << 16);
}
/* the same, SPLIT false: the hi words only (plain bf16; t.lo() is not touched) */
template <bool SPLIT> __device__ __forceinline__ void put_sp2(Sp t, int ld, int row, int col, float x0, float x1) {
    if (SPLIT) put_split2(t, ld, row, col, x0, x1);
    else *(uint32_t *)(t.hi + row * ld + col) = pack_op2(x0, x1);
}
/* f(row, col, x0, x1) over the column pairs (col, col+1) of this thread's accumulator tile at
 * (m0, n0) (the mma.sync m16n8 layout: rows g and g + 8, columns 2t, 2t + 1 of each n tile) */
template <int NT, class F> __device__ __forceinline__ void frag_pairs(float (&acc)[1][NT][4], int m0, int n0, F f) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int h = 0; h < 2; h++) f(m0 + g + 8 * h, n0 + nt * 8 + 2 * t, acc[0][nt][2 * h], acc[0][nt][2 * h + 1]);
}
/* this thread's accumulator tile into the tile t (row stride ld): split (hi and lo words), or, split
 * false, its hi words only (a run-time choice, each branch put_sp2's own loop) */
template <int NT>
__device__ __forceinline__ void frag_put_sp(float (&acc)[1][NT][4], int m0, int n0, Sp t, int ld, bool split) {
    if (split) frag_pairs(acc, m0, n0, [&](int r, int j, float x0, float x1) { put_sp2<true>(t, ld, r, j, x0, x1); });
    else frag_pairs(acc, m0, n0, [&](int r, int j, float x0, float x1) { put_sp2<false>(t, ld, r, j, x0, x1); });
}

/* the pair x0, x1 to global memory at off: split into hi (gh) and lo (gl) bf16 words, or, SPLIT
 * false, the hi words only (gl is not written) */
template <bool SPLIT>
__device__ __forceinline__ void put_pair_global(uint16_t *gh, uint16_t *gl, int64_t off, float x0, float x1) {
    if (!SPLIT) {
        *(uint32_t *)(gh + off) = pack_op2(x0, x1);
        return;
    }
    uint16_t h0, l0, h1, l1;
    split2(x0, h0, l0);
    split2(x1, h1, l1);
    *(uint32_t *)(gh + off) = (uint32_t)h0 | ((uint32_t)h1 << 16);
    *(uint32_t *)(gl + off) = (uint32_t)l0 | ((uint32_t)l1 << 16);
}
/* split x into the accumulator-shaped tile: f(row, col) gives the value */
template <int NT, class F> __device__ __forceinline__ void store_split(Sp t, int ld, int m0, int n0, F f) {
    const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int row = m0 + g + 8 * h, col = n0 + nt * 8 + 2 * tq;
            put_split2(t, ld, row, col, f(row, col, nt, 2 * h), f(row, col + 1, nt, 2 * h + 1));
        }
}

/* ---- loads into shared memory (16-byte vectors; rows >= nrow are zero) ----
 * raw tile [R][Cc] from global rows with stride ldg (elements).  Every load of the thread is
 * issued before the first store (a fixed, unrolled trip count), so that their latencies overlap. */
template <int R, int Cc, int NTH = FNT>
__device__ __forceinline__ void load_raw(uint16_t *s, const uint16_t *g, int64_t ldg, int nrow) {
    constexpr int V8 = Cc / 8, N = R * V8, IT = (N + NTH - 1) / NTH;
    uint4 x[IT];
#pragma unroll
    for (int it = 0; it < IT; it++) {
        const int e = threadIdx.x + it * NTH, r = e / V8, c = (e % V8) * 8;
        x[it] = make_uint4(0, 0, 0, 0);
        if ((N % NTH == 0 || e < N) && r < nrow) x[it] = *(const uint4 *)(g + r * ldg + c);
    }
#pragma unroll
    for (int it = 0; it < IT; it++) {
        const int e = threadIdx.x + it * NTH, r = e / V8, c = (e % V8) * 8;
        if (N % NTH == 0 || e < N) *(uint4 *)(s + r * (Cc + PAD) + c) = x[it];
    }
}
/* load_raw by cp.async: the copies are only issued (rows >= nrow zero-filled); the caller commits,
 * waits (cp_async_wait_all) and puts a barrier before the tile is read.  tid: the thread's index
 * among the NTH threads that load the tile (a group of warps of a larger block: see b_dhu_ws) */
template <int R, int Cc, int NTH = FNT>
__device__ __forceinline__ void load_raw_async(uint16_t *s, const uint16_t *g, int64_t ldg, int nrow, int tid) {
    constexpr int V8 = Cc / 8, N = R * V8, IT = (N + NTH - 1) / NTH;
#pragma unroll
    for (int it = 0; it < IT; it++) {
        const int e = tid + it * NTH, r = e / V8, c = (e % V8) * 8;
        if (N % NTH == 0 || e < N) cp_async16(s + r * (Cc + PAD) + c, r < nrow ? g + r * ldg + c : g, r < nrow);
    }
}
template <int R, int Cc, int NTH = FNT>
__device__ __forceinline__ void load_raw_async(uint16_t *s, const uint16_t *g, int64_t ldg, int nrow) {
    load_raw_async<R, Cc, NTH>(s, g, ldg, nrow, (int)threadIdx.x);
}
/* a 128-byte line of device memory asked into L2 (prefetch.global.L2: no registers held, nothing
 * waits for it); prefetch_tile: an R x Cc tile of E at row stride ldg, rows < nrow, a line a thread
 * t in [0, R Cc sizeof(E) / 128) */
__device__ __forceinline__ void prefetch_l2(const void *p) {
#ifdef DRC_EMU
    (void)p;
#else
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}
template <int R, int Cc, typename E>
__device__ __forceinline__ void prefetch_tile(const E *g, int64_t ldg, int nrow, int t) {
    constexpr int LPR = Cc * (int)sizeof(E) / 128; /* lines a row */
    if (t >= 0 && t < R * LPR && t / LPR < nrow) prefetch_l2((const char *)(g + (t / LPR) * ldg) + (t % LPR) * 128);
}
/* raw tile [R][Cc] of shared memory to global rows with stride ldg (elements), 16-byte vectors, by
 * NTH threads (UNROLL of its iterations unrolled: fewer registers where they are short):
 * a warp writes whole 128-byte lines (the accumulator layout would write 16 bytes a row per
 * instruction, eight times as many store instructions) */
template <int R, int Cc, int NTH = FNT, int UNROLL = 4>
__device__ __forceinline__ void store_raw(uint16_t *g, int64_t ldg, const uint16_t *s, int tid) {
    constexpr int V8 = Cc / 8, N = R * V8;
    static_assert(N % NTH == 0, "tile");
#pragma unroll UNROLL
    for (int it = 0; it < N / NTH; it++) {
        const int e = tid + it * NTH, r = e / V8, c = (e % V8) * 8;
        *(uint4 *)(g + r * ldg + c) = *(const uint4 *)(s + r * (Cc + PAD) + c);
    }
}
template <int R, int Cc> __device__ __forceinline__ void store_raw(uint16_t *g, int64_t ldg, const uint16_t *s) {
    store_raw<R, Cc>(g, ldg, s, (int)threadIdx.x);
}
/* split tile from two global bf16 arrays (hi at gh, lo at gl, same layout) */
template <int R, int Cc, int NTH = FNT>
__device__ __forceinline__ void load_split(Sp s, const uint16_t *gh, const uint16_t *gl, int64_t ldg, int nrow) {
    load_raw<R, Cc, NTH>(s.hi, gh, ldg, nrow);
    load_raw<R, Cc, NTH>(s.lo(), gl, ldg, nrow);
}

/* the same, SPLIT false: the hi part only (s.lo() is left as it was, gl is not read) */
template <int R, int Cc, bool SPLIT, int NTH = FNT>
__device__ __forceinline__ void load_sp(Sp s, const uint16_t *gh, const uint16_t *gl, int64_t ldg, int nrow) {
    load_raw<R, Cc, NTH>(s.hi, gh, ldg, nrow);
    if (SPLIT) load_raw<R, Cc, NTH>(s.lo(), gl, ldg, nrow);
}
/* load_sp by cp.async (only issued: the caller commits, waits and puts a barrier before reading) */
template <int R, int Cc, bool SPLIT, int NTH = FNT>
__device__ __forceinline__ void load_sp_async(Sp s, const uint16_t *gh, const uint16_t *gl, int64_t ldg, int nrow) {
    load_raw_async<R, Cc, NTH>(s.hi, gh, ldg, nrow);
    if (SPLIT) load_raw_async<R, Cc, NTH>(s.lo(), gl, ldg, nrow);
}

/* an R x Cc tile of f32 (rows >= nrow zero) from global rows of stride ldg, 16 bytes at a time, IT
 * words a thread of NTH, every load issued before the first use (the tile is held in registers
 * until put); put: split into the hi and lo words of a shared tile at row stride ld (8-byte stores:
 * a warp writes 256 contiguous bytes) */
template <int R, int Cc, int NTH = FNT> struct F32Tile {
    static constexpr int N = R * Cc / 4, IT = N / NTH;
    static_assert(N % NTH == 0, "tile");
    uint4 x[IT];
    __device__ __forceinline__ void load(const float *g, int64_t ldg, int nrow) {
#pragma unroll
        for (int it = 0; it < IT; it++) {
            const int e = threadIdx.x + it * NTH, r = e / (Cc / 4), c = (e % (Cc / 4)) * 4;
            x[it] = r < nrow ? *(const uint4 *)(g + r * ldg + c) : make_uint4(0, 0, 0, 0);
        }
    }
    /* the same words by cp.async into st (R Cc floats, this thread's 16 bytes where load holds
     * them), and (after the thread's own cp_async_wait: no barrier) into the registers; tid:
     * threadIdx.x (or tid_fresh()) */
    __device__ __forceinline__ void load_async(float *st, const float *g, int64_t ldg, int nrow, int tid) const {
#pragma unroll
        for (int it = 0; it < IT; it++) {
            const int e = tid + it * NTH, r = e / (Cc / 4), c = (e % (Cc / 4)) * 4;
            cp_async16(st + 4 * e, r < nrow ? g + r * ldg + c : g, r < nrow);
        }
    }
    __device__ __forceinline__ void take(const float *st, int tid) {
#pragma unroll
        for (int it = 0; it < IT; it++) x[it] = *(const uint4 *)(st + 4 * (tid + it * NTH));
    }
    __device__ __forceinline__ void get(int it, float (&f)[4]) const { memcpy(f, &x[it], 16); }
    /* SPLIT false: the hi words only (s.lo() is not touched) */
    template <bool SPLIT = true> __device__ __forceinline__ void put(Sp s, int ld) const {
#pragma unroll
        for (int it = 0; it < IT; it++) {
            const int e = threadIdx.x + it * NTH, r = e / (Cc / 4), c = (e % (Cc / 4)) * 4;
            float f[4];
            get(it, f);
            uint16_t hi[4], lo[4];
#pragma unroll
            for (int m = 0; m < 4; m++) split2(f[m], hi[m], lo[m]);
            uint64_t hw, lw;
            memcpy(&hw, hi, 8), memcpy(&lw, lo, 8);
            *(uint64_t *)(s.hi + r * ld + c) = hw;
            if (SPLIT) *(uint64_t *)(s.lo() + r * ld + c) = lw;
        }
    }
};

/* ---- reductions over the accumulator tile (deterministic: fixed order) ----
 * red is [warps][64] floats in shared memory, zero on entry to each round. */
/* The warp's slot is read-modified-written by different lanes in the two functions below (rows:
 * lanes with t = 0; columns: lanes with g = 0), so a put starts with __syncwarp(): a shuffle
 * converges the lanes but does not order their shared-memory accesses (racecheck found the hazard
 * between a row put and a column put of one warp, b_qkwy with the head gate). */
/* rows: rs[h] is this thread's sum for row m0 + g + 8h; adds across the quad and writes the
 * warp's slot */
__device__ __forceinline__ void red_rows_put(float *red, int m0, float (&rs)[2]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    wsync();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float x = rs[h];
        x += shfl_xor(x, 1);
        x += shfl_xor(x, 2);
        if (t == 0) red[warp * 64 + m0 + g + 8 * h] += x;
    }
}
/* columns: cs[nt][j] is this thread's sum for column n0 + 8nt + 2t + j (over its rows) */
template <int NT> __device__ __forceinline__ void red_cols_put(float *red, int n0, float (&cs)[NT][2]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    wsync();
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            float x = cs[nt][j];
            x += shfl_xor(x, 4);
            x += shfl_xor(x, 8);
            x += shfl_xor(x, 16);
            if (g == 0) red[warp * 64 + n0 + nt * 8 + 2 * t + j] += x;
        }
}
/* after a barrier: dst[i] (+)= sum over warps of red[w][i], i < 64; red zeroed again.  The caller
 * puts a barrier after it before red or dst are used again. */
template <int NW = FNT / 32> __device__ __forceinline__ void red_collect(float *red, float *dst, bool add) {
    const int i = threadIdx.x;
    if (i < 64) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++) {
            s += red[w * 64 + i];
            red[w * 64 + i] = 0.0f;
        }
        dst[i] = add ? dst[i] + s : s;
    }
}

/* The L2 norm's backward folded into the store of dq or dk (acc: this thread's accumulator tile of
 * WT<64, ., NW> holding the gradient dy of the normalised rows xn, which sX holds with row stride
 * ld): dy becomes dx = r (dy - xn (dy . xn)), r = sr[i] (shared: the rows' 1/|x|, staged by
 * l2norm_stage_r with the block's first loads, zero past the chunk's rows: loaded from device memory
 * here, its latency stood bare in a block alone on its SM), before the one rounding of the store
 * (a separate pass over stored dq, dk would round them twice).  One barrier: each warp stores its
 * partial row sums into its own slots of scr ([NW][64] floats, any contents on entry, left holding
 * them), then each thread adds the slots of the warps that share its rows (warps w = its own mod
 * 4, in order: the bits do not depend on the kernel that calls it).  The caller makes sure no
 * thread still reads scr when this starts and puts a barrier before scr is written again. */
template <int NW, int NT>
__device__ __forceinline__ void l2norm_bwd_rows(float (&acc)[1][NT][4], int m0, int n0, const uint16_t *sX, int ld,
                                                float *scr, const float *sr) {
    constexpr int MW = 4; /* warps down the 64 rows (WT<64, ., NW>::MW) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int i0 = m0 + g, i1 = i0 + 8; /* this thread's two rows */
    float rs[2] = {0.0f, 0.0f};
    frag_each(acc, m0, n0, [&](int i, int cc, float &x) { rs[(i - m0) >> 3] += op2f(sX[i * ld + cc]) * x; });
#pragma unroll
    for (int h = 0; h < 2; h++) {
        rs[h] += shfl_xor(rs[h], 1);
        rs[h] += shfl_xor(rs[h], 2);
        if (t == 0) scr[warp * 64 + i0 + 8 * h] = rs[h];
    }
    bsync();
    float s[2] = {0.0f, 0.0f};
#pragma unroll
    for (int w = warp % MW; w < NW; w += MW) s[0] += scr[w * 64 + i0], s[1] += scr[w * 64 + i1];
    const float r[2] = {sr[i0], sr[i1]};
    frag_each(acc, m0, n0, [&](int i, int cc, float &x) {
        const int h = (i - m0) >> 3;
        x = r[h] * (x - op2f(sX[i * ld + cc]) * s[h]);
    });
}

/* l2norm_bwd_rows's sr, staged with the block's first loads: sr[0 .. 63] the rows' 1/|q| from rq,
 * sr[64 .. 127] their 1/|k| from rk (row i at base + i stride), zero past the chunk's L rows; a
 * NULL source leaves its half unwritten (its fold does not run).  Blocks of 128 threads or more. */
__device__ __forceinline__ void l2norm_stage_r(float *sr, const float *rq, const float *rk, int64_t base,
                                               int64_t stride, int L) {
    const int tid = (int)threadIdx.x, i = tid & 63;
    const float *r = tid < 64 ? rq : rk;
    if (tid < 128 && r) sr[tid] = i < L ? r[base + (int64_t)i * stride] : 0.0f;
}

/* sum over the block of NW warps of one value per thread (after which every thread has it);
 * scratch: NW floats */
template <int NW = FNT / 32> __device__ __forceinline__ float block_sum(float x, float *scr) {
    x = warp_sum(x);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) scr[warp] = x;
    bsync();
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < NW; w++) s += scr[w];
    bsync();
    return s;
}

/* the chunk's gate G (cumulative, prep's Gc [rows, HV]; rows >= L hold G_{L-1} so that G_i - G_j
 * <= 0 for j <= i) and beta (0 past L; shared_row) into shared memory; GATE NONE: G = 0 */
template <int GATE>
__device__ __forceinline__ void load_gate_beta(const Geom &G, int64_t r0, int L, int hv, const float *Gc,
                                               const uint16_t *beta, float *sG, float *sb) {
    const int i = threadIdx.x;
    if (i < FC) {
        int ii = i < L ? i : L - 1;
        sG[i] = GATE == DG_GATE_HEAD ? Gc[(r0 + ii) * G.HV + hv] : 0.0f;
        if (sb) sb[i] = i < L ? op2f(beta[shared_row(G, r0 + i, hv)]) : 0.0f;
    }
}
/* e^{G_last - G_i} for this thread's two rows of an accumulator tile at row m0 (m0 + g, m0 + g + 8),
 * from the chunk's gate in shared memory as load_gate_beta leaves it (G_last = sG[63]); 1 for GATE
 * NONE */
template <int GATE> __device__ __forceinline__ void row_decay2(const float *sG, int m0, float (&eg)[2]) {
    const int g = (threadIdx.x & 31) >> 2;
    eg[0] = eg[1] = 1.0f;
    if (GATE == DG_GATE_HEAD) {
        const float gl = sG[63];
        eg[0] = expf(gl - sG[m0 + g]), eg[1] = expf(gl - sG[m0 + g + 8]);
    }
}
/* load_gate_beta's gate by cp.async, HEAD only (GATE NONE: nothing; the gate is not read), by the
 * thread tid of the group that loads it; the caller commits and waits */
template <int GATE>
__device__ __forceinline__ void load_gate_async(const Geom &G, int64_t r0, int L, int hv, const float *Gc, float *sG,
                                                int tid) {
    if (GATE == DG_GATE_HEAD && tid < FC) cp_async4(sG + tid, Gc + (r0 + (tid < L ? tid : L - 1)) * G.HV + hv);
}

/* the pair (x0, x1) to element off of b (f32, or 16-bit words), and back */
__device__ __forceinline__ void put_pair(Words b, int64_t off, float x0, float x1) {
    if (b.w16) *(uint32_t *)((uint16_t *)b.f + off) = pack_op2(x0, x1);
    else *(float2 *)(b.f + off) = make_float2(x0, x1);
}
__device__ __forceinline__ float2 get_pair(Words b, int64_t off) {
    if (!b.w16) return *(const float2 *)(b.f + off);
    const uint32_t w = *(const uint32_t *)((const uint16_t *)b.f + off);
    return make_float2(op2f((uint16_t)(w & 0xffffu)), op2f((uint16_t)(w >> 16)));
}

/* Buffers of the fast path, per call.  Layouts: [rows, HV, .] per token and value head; states
 * [nchunks, HV, K, V]; hi/lo pairs of bf16 for the split operands. */
struct FastBufs {
    float *Gc;           /* [rows, HV] cumulative gate (HEAD only) */
    uint16_t *Wh, *Wl;   /* [rows, HV, K] */
    float *U;            /* [rows, HV, V] */
    uint16_t *Vnh, *Vnl; /* [rows, HV, V]  V' */
    uint16_t *Sh, *Sl;   /* [nchunks, HV, K, V]  state entering each chunk (Sl: backward only) */
    float *Ai;           /* [rows, HV, 64] (I + A)^-1, backward only */
};

/* b's buffers carved from cv (dr_chunk_internal.cuh); for_bwd: with what only the backward reads,
 * Ai and the lo words of S (the backward's, and a forward's that keeps its working set for the
 * backward); without them Ai and Sl are NULL and the state pass stores S's hi words only, all the
 * output pass reads (a forward alone: 134 MB less written at S1) */
void fast_carve(const Geom &G, Carve &cv, FastBufs &b, bool for_bwd);
/* launches prep and the state pass into b (allocated by the caller); Ai stored when b.Ai is set,
 * hT written when io.hT is */
int fast_prep_state(const Plan &p, const Io<uint16_t> &io, const FastBufs &b, int blocked);

} // namespace DRC_FAST
} // namespace drc

#endif
