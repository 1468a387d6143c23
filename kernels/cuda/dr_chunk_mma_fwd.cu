/* The tensor-core chunked delta-rule forward (bf16 storage, gate NONE or HEAD, chunk 64, K and V
 * in {64, 128}); the building blocks are in dr_chunk_mma.cuh.  Same math as the generic kernels
 * (dr_chunk_generic.cu), per chunk of L <= 64 rows, value head hv, G the cumulative head gate:
 *   prep   (block per chunk, head):  A = diag(beta) strictly_lower(K K^T o Gamma)  [mma, exact]
 *          Ai = (I + A)^-1                                    [f32, blocked or substitution]
 *          W = (Ai diag(beta e^G)) K,  U = (Ai diag(beta)) V   [mma, Ai' split]
 *   state  (block per sequence, head; all V columns; chunks in order; S in registers):
 *          V' = U - W S                                        [mma, W and S split]
 *          S <- e^{G_last} S + K^T (e^{G_last - G} o V')       [mma, V' split]
 *          stores S (entering each chunk) and V', both split
 *   out    (block per chunk, head):  O = scale e^G o (Q S) + P V',
 *          P = scale lower_incl(Q K^T o Gamma)                 [mma; P, S, V' split]
 * Also the recompute of the backward (prep with Ai stored, the state pass without hT). */
#include "kernels/cuda/dr_chunk_mma.cuh"

namespace drc {
namespace fast {
namespace {

constexpr int LDF = 65; /* row stride of the f32 64 x 64 matrices */

/* (I + A)^-1 of the strictly lower L x L matrix sA into sY (zero on entry), ld LDF; sT scratch.
 * Forward substitution by columns inside diagonal blocks of bs rows (bs = 16 blocked, else 64),
 * then, blocked, the blocks below the diagonal block row by block row:
 *   Y_IJ = -Y_II (A[I, J0:I0] Y[J0:I0, J]). */
__device__ void tri_inv(const float *sA, float *sY, float *sT, int L, int blocked) {
    const int tid = threadIdx.x, bs = blocked ? 16 : FC;
    for (int col = tid; col < L; col += FNT) {
        int b0 = col / bs * bs, i1 = b0 + bs < L ? b0 + bs : L;
        sY[col * LDF + col] = 1.0f;
        for (int i = col + 1; i < i1; i++) {
            float s = 0.0f;
            for (int j = col; j < i; j++) s += sA[i * LDF + j] * sY[j * LDF + col];
            sY[i * LDF + col] = -s;
        }
    }
    bsync();
    for (int i0 = bs; blocked && i0 < L; i0 += bs) {
        int i1 = i0 + bs < L ? i0 + bs : L;
        for (int e = tid; e < (i1 - i0) * i0; e += FNT) {
            int i = i0 + e / i0, c = e % i0;
            float s = 0.0f;
            for (int m = c; m < i0; m++) s += sA[i * LDF + m] * sY[m * LDF + c];
            sT[i * LDF + c] = s;
        }
        bsync();
        for (int e = tid; e < (i1 - i0) * i0; e += FNT) {
            int i = i0 + e / i0, c = e % i0;
            float s = 0.0f;
            for (int m = i0; m <= i; m++) s += sY[i * LDF + m] * sT[m * LDF + c];
            sY[i * LDF + c] = -s;
        }
        bsync();
    }
}

/* f(row, col, x0, x1) over the pairs (col, col+1) of this thread's accumulator */
template <int NT, class F>
__device__ __forceinline__ void frag_pairs(float (&acc)[1][NT][4], int m0, int n0, F f) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            f(m0 + g + 8 * h, n0 + nt * 8 + 2 * t, acc[0][nt][2 * h], acc[0][nt][2 * h + 1]);
}

__device__ __forceinline__ void put_pair_global(uint16_t *gh, uint16_t *gl, int64_t off, float x0,
                                                float x1) {
    uint16_t h0, l0, h1, l1;
    split2(x0, h0, l0);
    split2(x1, h1, l1);
    *(uint32_t *)(gh + off) = (uint32_t)h0 | ((uint32_t)h1 << 16);
    *(uint32_t *)(gl + off) = (uint32_t)l0 | ((uint32_t)l1 << 16);
}

template <int K, int V> struct PrepSmem {
    static constexpr int f32s = 3 * 64 * LDF + 2 * 64;
    static constexpr int bytes = f32s * 4 + tile_bytes(64, K) + tile_bytes(64, V) + 2 * tile_bytes(64, 64);
};

template <int K, int V, int GATE>
__global__ void __launch_bounds__(FNT)
    f_prep(Geom G, const uint16_t *k, const uint16_t *v, const float *g, const uint16_t *beta,
           FastBufs b, int blocked, int store_ai) {
    DRC_SMEM(float, sm);
    const int HV = G.HV, tid = threadIdx.x, warp = tid >> 5;
    const int64_t c = blockIdx.x / HV;
    const int hv = (int)(blockIdx.x % HV), h = hv / G.grp;
    const Chunk ch = chunk_at(G, c);
    const int L = ch.L;
    const int64_t r0 = ch.r0;
    float *sA = sm, *sY = sA + 64 * LDF, *sT = sY + 64 * LDF, *sG = sT + 64 * LDF, *sb = sG + 64;
    uint16_t *sK = (uint16_t *)(sb + 64), *sV = sK + 64 * (K + PAD);
    const Sp sAs{sV + 64 * (V + PAD), 64 * (64 + PAD)};
    if (GATE == DG_GATE_HEAD && tid == 0) {
        float a = 0.0f;
        for (int i = 0; i < L; i++) {
            a += g[(r0 + i) * HV + hv];
            b.Gc[(r0 + i) * HV + hv] = a;
        }
    }
    load_raw<64, K>(sK, k + (r0 * G.H + h) * K, (int64_t)G.H * K, L);
    load_raw<64, V>(sV, v + (r0 * HV + hv) * V, (int64_t)HV * V, L);
    for (int e = tid; e < 64 * LDF; e += FNT) sY[e] = 0.0f;
    bsync();
    load_gate_beta<GATE>(G, r0, L, hv, b.Gc, beta, sG, sb);
    bsync();
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
    tri_inv(sA, sY, sT, L, blocked);
    if (store_ai)
        for (int e = tid; e < L * 64; e += FNT) {
            int i = e / 64, j = e % 64;
            b.Ai[((r0 + i) * HV + hv) * 64 + j] = sY[i * LDF + j];
        }
    /* W = (Ai diag(beta e^G)) K */
    for (int e = tid; e < 64 * 64; e += FNT) {
        int i = e / 64, j = e % 64;
        float x = sY[i * LDF + j] * sb[j];
        if (GATE == DG_GATE_HEAD) x *= expf(sG[j]);
        split2(x, sAs.hi[i * 72 + j], sAs.lo()[i * 72 + j]);
    }
    bsync();
    {
        using T = WT<64, K>;
        float acc[1][T::NT][4];
        acc_zero(acc);
        const int m0 = T::m0(warp), n0 = T::n0(warp);
        mma_sr<1, T::NT, false, true>(acc, sAs, 72, m0, sK, K + PAD, n0, 64);
        frag_pairs(acc, m0, n0, [&](int i, int j, float x0, float x1) {
            if (i < L) put_pair_global(b.Wh, b.Wl, ((r0 + i) * HV + hv) * K + j, x0, x1);
        });
    }
    bsync();
    /* U = (Ai diag(beta)) V */
    for (int e = tid; e < 64 * 64; e += FNT) {
        int i = e / 64, j = e % 64;
        split2(sY[i * LDF + j] * sb[j], sAs.hi[i * 72 + j], sAs.lo()[i * 72 + j]);
    }
    bsync();
    {
        using T = WT<64, V>;
        float acc[1][T::NT][4];
        acc_zero(acc);
        const int m0 = T::m0(warp), n0 = T::n0(warp);
        mma_sr<1, T::NT, false, true>(acc, sAs, 72, m0, sV, V + PAD, n0, 64);
        frag_pairs(acc, m0, n0, [&](int i, int j, float x0, float x1) {
            if (i < L) *(float2 *)(b.U + ((r0 + i) * HV + hv) * V + j) = make_float2(x0, x1);
        });
    }
}

template <int K, int V> struct StateSmem {
    static constexpr int bytes = 64 * 4 + 2 * tile_bytes(64, K) + tile_bytes(64, K) +
                                 2 * tile_bytes(K, V) + 2 * tile_bytes(64, V);
};

/* block per (sequence, value head) */
template <int K, int V, int GATE>
__global__ void __launch_bounds__(FNT)
    f_state(Geom G, const uint16_t *k, FastBufs b, const float *h0, float *hT) {
    DRC_SMEM(float, sm);
    const int HV = G.HV, warp = threadIdx.x >> 5;
    const int64_t n = blockIdx.x / HV;
    const int hv = (int)(blockIdx.x % HV), h = hv / G.grp;
    float *sG = sm;
    uint16_t *base = (uint16_t *)(sG + 64);
    const Sp sW{base, 64 * (K + PAD)};
    uint16_t *sK = base + 2 * 64 * (K + PAD);
    const Sp sS{sK + 64 * (K + PAD), K * (V + PAD)};
    const Sp sVn{sS.hi + 2 * K * (V + PAD), 64 * (V + PAD)};
    using TS = WT<K, V>;
    using TV = WT<64, V>;
    const int sm0 = TS::m0(warp), sn0 = TS::n0(warp), vm0 = TV::m0(warp), vn0 = TV::n0(warp);
    float S[1][TS::NT][4];
    const int64_t hb = (n * HV + hv) * (int64_t)K * V;
    frag_each(S, sm0, sn0, [&](int r, int j, float &x) { x = h0 ? h0[hb + (int64_t)r * V + j] : 0.0f; });
    int64_t c0, c1;
    seq_chunks(G, n, c0, c1);
    for (int64_t c = c0; c < c1; c++) {
        const Chunk ch = chunk_at(G, c);
        const int L = ch.L;
        const int64_t r0 = ch.r0;
        load_split<64, K>(sW, b.Wh + (r0 * HV + hv) * K, b.Wl + (r0 * HV + hv) * K, (int64_t)HV * K, L);
        load_raw<64, K>(sK, k + (r0 * G.H + h) * K, (int64_t)G.H * K, L);
        load_gate_beta<GATE>(G, r0, L, hv, b.Gc, nullptr, sG, nullptr);
        /* the state entering the chunk: split, into shared memory and out */
        const int64_t sb = (c * HV + hv) * (int64_t)K * V;
        frag_pairs(S, sm0, sn0, [&](int r, int j, float x0, float x1) {
            put_split2(sS, V + PAD, r, j, x0, x1);
            put_pair_global(b.Sh, b.Sl, sb + (int64_t)r * V + j, x0, x1);
        });
        bsync();
        { /* V' = U - W S;  shared: e^{G_last - G} o V' */
            float acc[1][TV::NT][4];
            acc_zero(acc);
            mma_ss<1, TV::NT, false, true>(acc, sW, K + PAD, vm0, sS, V + PAD, vn0, K);
            const float gl = sG[63];
            frag_pairs(acc, vm0, vn0, [&](int i, int j, float x0, float x1) {
                float v0 = 0.0f, v1 = 0.0f;
                if (i < L) {
                    const int64_t off = ((r0 + i) * HV + hv) * V + j;
                    const float2 u = *(const float2 *)(b.U + off);
                    v0 = u.x - x0, v1 = u.y - x1;
                    put_pair_global(b.Vnh, b.Vnl, off, v0, v1);
                }
                const float e = GATE == DG_GATE_HEAD ? expf(gl - sG[i]) : 1.0f;
                put_split2(sVn, V + PAD, i, j, e * v0, e * v1);
            });
        }
        bsync();
        /* S <- e^{G_last} S + K^T (e^{G_last - G} o V') */
        if (GATE == DG_GATE_HEAD) {
            const float d = expf(sG[63]);
            frag_each(S, sm0, sn0, [&](int, int, float &x) { x *= d; });
        }
        mma_rs<1, TS::NT, true, true>(S, sK, K + PAD, sm0, sVn, V + PAD, sn0, 64);
        bsync();
    }
    if (hT) frag_each(S, sm0, sn0, [&](int r, int j, float &x) { hT[hb + (int64_t)r * V + j] = x; });
}

template <int K, int V> struct OutSmem {
    static constexpr int bytes = 64 * 4 + 2 * tile_bytes(64, K) + 2 * tile_bytes(K, V) +
                                 2 * tile_bytes(64, V) + 2 * tile_bytes(64, 64);
};

/* block per (chunk, value head) */
template <int K, int V, int GATE>
__global__ void __launch_bounds__(FNT)
    f_out(Geom G, const uint16_t *q, const uint16_t *k, FastBufs b, uint16_t *o) {
    DRC_SMEM(float, sm);
    const int HV = G.HV, warp = threadIdx.x >> 5;
    const int64_t c = blockIdx.x / HV;
    const int hv = (int)(blockIdx.x % HV), h = hv / G.grp;
    const Chunk ch = chunk_at(G, c);
    const int L = ch.L;
    const int64_t r0 = ch.r0;
    float *sG = sm;
    uint16_t *sQ = (uint16_t *)(sG + 64), *sK = sQ + 64 * (K + PAD);
    const Sp sS{sK + 64 * (K + PAD), K * (V + PAD)};
    const Sp sVn{sS.hi + 2 * K * (V + PAD), 64 * (V + PAD)};
    const Sp sP{sVn.hi + 2 * 64 * (V + PAD), 64 * 72};
    load_raw<64, K>(sQ, q + (r0 * G.H + h) * K, (int64_t)G.H * K, L);
    load_raw<64, K>(sK, k + (r0 * G.H + h) * K, (int64_t)G.H * K, L);
    const int64_t sb = (c * HV + hv) * (int64_t)K * V;
    load_split<K, V>(sS, b.Sh + sb, b.Sl + sb, V, K);
    load_split<64, V>(sVn, b.Vnh + (r0 * HV + hv) * V, b.Vnl + (r0 * HV + hv) * V, (int64_t)HV * V, L);
    load_gate_beta<GATE>(G, r0, L, hv, b.Gc, nullptr, sG, nullptr);
    bsync();
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
    bsync();
    {
        using T = WT<64, V>;
        float acc[1][T::NT][4];
        acc_zero(acc);
        const int m0 = T::m0(warp), n0 = T::n0(warp);
        mma_rs<1, T::NT, false, true>(acc, sQ, K + PAD, m0, sS, V + PAD, n0, K);
        frag_each(acc, m0, n0, [&](int i, int, float &x) {
            x *= GATE == DG_GATE_HEAD ? scale * expf(sG[i]) : scale;
        });
        mma_ss<1, T::NT, false, true>(acc, sP, 72, m0, sVn, V + PAD, n0, 64);
        frag_pairs(acc, m0, n0, [&](int i, int j, float x0, float x1) {
            if (i < L) *(uint32_t *)(o + ((r0 + i) * HV + hv) * V + j) = pack_bf2(x0, x1);
        });
    }
}

template <int K, int V, int GATE>
int prep_state_t(const Plan &p, const Io<uint16_t> &io, const FastBufs &b, int blocked, bool bwd) {
    static_assert(PrepSmem<K, V>::bytes <= SMEM_MAX && StateSmem<K, V>::bytes <= SMEM_MAX &&
                      OutSmem<K, V>::bytes <= SMEM_MAX, "shared memory");
    const Geom &G = p.G;
    int rc = DRC_LAUNCH("dr_chunk mma prep", (f_prep<K, V, GATE>), G.nchunks * G.HV, FNT,
                        (size_t)(PrepSmem<K, V>::bytes), G, io.k, io.v, io.g, io.beta, b, blocked,
                        bwd ? 1 : 0);
    if (!rc)
        rc = DRC_LAUNCH("dr_chunk mma state", (f_state<K, V, GATE>), G.N * G.HV, FNT,
                        (size_t)(StateSmem<K, V>::bytes), G, io.k, b, io.h0, bwd ? (float *)nullptr : io.hT);
    return rc;
}

template <int K, int V, int GATE> int out_t(const Plan &p, const Io<uint16_t> &io, const FastBufs &b) {
    const Geom &G = p.G;
    return DRC_LAUNCH("dr_chunk mma out", (f_out<K, V, GATE>), G.nchunks * G.HV, FNT,
                      (size_t)(OutSmem<K, V>::bytes), G, io.q, io.k, b, io.o);
}

} // namespace

#define DRC_FAST_DISPATCH(fn, ...)                                                                 \
    (G.K == 64 ? (G.V == 64 ? (G.gate ? fn<64, 64, 1>(__VA_ARGS__) : fn<64, 64, 0>(__VA_ARGS__))       \
                            : (G.gate ? fn<64, 128, 1>(__VA_ARGS__) : fn<64, 128, 0>(__VA_ARGS__)))    \
               : (G.V == 64 ? (G.gate ? fn<128, 64, 1>(__VA_ARGS__) : fn<128, 64, 0>(__VA_ARGS__))     \
                            : (G.gate ? fn<128, 128, 1>(__VA_ARGS__) : fn<128, 128, 0>(__VA_ARGS__))))

int fast_prep_state(const Plan &p, const Io<uint16_t> &io, const FastBufs &b, int blocked, bool bwd) {
    const Geom &G = p.G;
    return DRC_FAST_DISPATCH(prep_state_t, p, io, b, blocked, bwd);
}

} // namespace fast

bool fast_ok(const Geom &G) {
    return G.C == 64 && (G.gate == DG_GATE_NONE || G.gate == DG_GATE_HEAD) &&
           (G.K == 64 || G.K == 128) && (G.V == 64 || G.V == 128);
}

int fast_fwd(const Plan &p, const Io<uint16_t> &io) {
    using namespace fast;
    const Geom &G = p.G;
    const int64_t rows = G.rows, HV = G.HV, nst = G.nchunks * HV * G.K * G.V;
    FastBufs b;
    memset(&b, 0, sizeof b);
    b.Gc = G.gate ? scratch<float>((size_t)(rows * HV)) : nullptr;
    b.Wh = scratch<uint16_t>((size_t)(2 * rows * HV * G.K));
    b.U = scratch<float>((size_t)(rows * HV * G.V));
    b.Vnh = scratch<uint16_t>((size_t)(2 * rows * HV * G.V));
    b.Sh = scratch<uint16_t>((size_t)(2 * nst));
    int rc = -1;
    if ((!G.gate || b.Gc) && b.Wh && b.U && b.Vnh && b.Sh) {
        b.Wl = b.Wh + rows * HV * G.K;
        b.Vnl = b.Vnh + rows * HV * G.V;
        b.Sl = b.Sh + nst;
        rc = fast_prep_state(p, io, b, 1, false);
        if (!rc) rc = DRC_FAST_DISPATCH(out_t, p, io, b);
    }
    release(b.Gc), release(b.Wh), release(b.U), release(b.Vnh), release(b.Sh);
    return rc;
}

} // namespace drc
