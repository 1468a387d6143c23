/* The generic chunked delta-rule kernels: f32 arithmetic on f32, bf16 or fp16 storage, every gate kind
 * (NONE, HEAD, CHANNEL), chunk 16/32/64, any V, K <= 256.  Each kernel stages its operands in shared
 * memory (stage) and forms its products with blk_mm (dr_chunk_blk_mm.cuh); built with the template
 * argument TC = true, the same kernels run those products on TF32 tensor cores: the TF32 family
 * (16-bit storage, 128 < K <= 256).  The math is that of the CPU kernels
 * (kernels/cpu/delta/dr_chunk_fwd_impl.h, dr_chunk_bwd_impl.h), with FLA's structure of parallel and
 * sequential stages.  Per chunk of L rows (value head hv, key head h = hv / (HV/H)), G the
 * chunk-local cumulative gate and Gamma(i,j) = exp(G_i - G_j) for i >= j (per channel c for
 * CHANNEL gates, where it goes inside the sums over c; every exponent is <= 0, so nothing
 * overflows however strong the decay):
 *   Mkk = strictly_lower(K K^T o Gamma),  A = diag(beta) Mkk,  Ai = (I + A)^-1
 *   W = Ai diag(beta) (exp(G) o K),   U = Ai diag(beta) V,   P = scale lower_incl(Q K^T o Gamma)
 *   state pass: V' = U - W S;  S <- exp(G_last) S + (exp(G_last - G) o K)^T V'
 *   output:     O = scale (exp(G) o Q) S_in + P V'
 * Kernels (one launch each):
 *   prep    block per (chunk, hv):           G, Mkk, A, Ai, W, U, P       (parallel over chunks)
 *   state   block per (seq, hv, V tile):      V', the chunk states S_in   (sequential in chunks)
 *   out     block per (chunk, hv, V tile):    O                            (parallel)
 *   dhu     block per (seq, hv, V tile):      dV', dS (reverse)           (sequential)
 *   dqkwg   block per (chunk, hv):            dq, dk, dW, dG of the output and state terms
 *   wy      block per (chunk, hv):            WY backward: dk, dv, dbeta, dG; dg = rev cumsum dG
 *           (dw_on_chip: dqkwg and wy in one kernel, dW and dG in shared memory where they fit:
 *            K <= 128 at chunk 64, K <= 64 with the per-channel gate; otherwise two kernels with
 *            dW and dG in global scratch)
 *   gva     dq, dk summed over the value heads of each key head, stored in the storage type.
 * Scratch (f32): G [rows,HV,gs]; W [rows,HV,K]; U/V' [rows,HV,V]; P, Ai, Mkk [rows,HV,C];
 * states S_in and dS_out [nchunks,HV,K,V]; dV' [rows,HV,V]; per value head dq, dk [rows,HV,K];
 * unfused: dW [rows,HV,K], dG [rows,HV,gs].
 * This header holds what the forward and the backward share: the gate factors, the per-chunk
 * pointers, prep and the state pass (both run them; the backward to recompute).  The forward
 * (out) is dr_chunk_generic_fwd.cu, the backward (dhu, dqkwg, wy, gva) dr_chunk_generic_bwd.cu.
 * Everything here is in an unnamed namespace: each of the two files has its own copy. */
#ifndef DG_KERNELS_CUDA_DR_CHUNK_GENERIC_CUH
#define DG_KERNELS_CUDA_DR_CHUNK_GENERIC_CUH

#include "kernels/cuda/delta/dr_chunk_blk_mm.cuh"

namespace drc {
namespace {

constexpr int NT = 512; /* threads of every generic kernel (16 warps: one block a multiprocessor at K = 256) */
constexpr int NW = NT / 32;

/* exp(G_i - G_j) of channel c (G rows with their gate values), exp(G_i), for each gate kind */
template <int GATE> __device__ __forceinline__ float gam(const float *Gi, const float *Gj, int c) {
    if (GATE == DG_GATE_NONE) return 1.0f;
    if (GATE == DG_GATE_HEAD) return expf(Gi[0] - Gj[0]);
    return expf(Gi[c] - Gj[c]);
}
template <int GATE> __device__ __forceinline__ float gexp(const float *Gi, int c) {
    if (GATE == DG_GATE_NONE) return 1.0f;
    if (GATE == DG_GATE_HEAD) return expf(Gi[0]);
    return expf(Gi[c]);
}

/* The per-channel gate's wide form (the kda kernels' one, dr_chunk_kda.cuh), for the TF32 family
 * (TC): where every channel's G spans at most CHAN_WIDE_SPAN over the chunk, R_c = the
 * middle of channel c's range gives
 *   sum_c x_ic k_jc e^{G_ic - G_jc} = sum_c (x_ic e^{G_ic - R_c}) (k_jc e^{R_c - G_jc}),
 * both factors within e^{+-40} of x, k, so the gated product is one product of two staged tiles
 * (blk_mm_x3: 3xTF32, as close to f32 as the element loops it replaces; plain TF32 took dg from
 * 3e-4 to 1.4e-3 of f64 in fp16, over its bound) instead of an exponential and two loads a term.
 * The products above the diagonal, thrown away, stay below e^{80} |x| |k| a term.  A steeper chunk
 * keeps the f32 element loops, exact for any gate, as does the generic family (f32 FMAs: the
 * reference).  chan_wide writes R [K] and tells every thread of the block whether the chunk (L rows
 * of G, stride ldg) takes the wide form (its barrier shows R to the block). */
constexpr float CHAN_WIDE_SPAN = 80.0f;
__device__ __forceinline__ bool chan_wide(const float *Gcc, int64_t ldg, int L, int K, float *R) {
    int steep = 0;
    for (int c = threadIdx.x; c < K; c += NT) {
        float lo = Gcc[c], hi = lo;
        for (int i = 1; i < L; i++) lo = fminf(lo, Gcc[i * ldg + c]), hi = fmaxf(hi, Gcc[i * ldg + c]);
        R[c] = 0.5f * (lo + hi);
        if (!(hi - lo <= CHAN_WIDE_SPAN)) steep = 1;
    }
    return !bsync_or(steep);
}

/* Per (chunk, value head) pointers. */
template <typename T> struct CP {
    int64_t r0;
    int L, hv, h;
    int64_t ldq, ldv, ldg, ldc, ldk; /* H*K, HV*V, HV*gs, HV*C, HV*K */
    int64_t oq, ov, og, oc, ok, ob;  /* offsets of row r0 in q/k, v, G, [.,C], [.,K], beta */
};
template <typename T> __device__ __forceinline__ CP<T> cp_at(const Geom &G, int64_t c, int hv) {
    CP<T> p;
    Chunk ch = chunk_at(G, c);
    p.r0 = ch.r0, p.L = ch.L, p.hv = hv, p.h = hv / G.grp;
    p.ldq = (int64_t)G.H * G.K, p.ldv = (int64_t)G.HV * G.V, p.ldg = (int64_t)G.HV * G.gs;
    p.ldc = (int64_t)G.HV * G.C, p.ldk = (int64_t)G.HV * G.K;
    p.oq = (p.r0 * G.H + p.h) * G.K;
    p.ov = (p.r0 * G.HV + hv) * G.V;
    p.og = (p.r0 * G.HV + hv) * G.gs;
    p.oc = (p.r0 * G.HV + hv) * G.C;
    p.ok = (p.r0 * G.HV + hv) * G.K;
    p.ob = p.r0 * G.HV + hv;
    return p;
}

/* Row strides of the shared-memory tiles (floats): C x C matrices, C x K rows, and the state and
 * value tiles of BV columns (BV + 8: the B operand of blk_mm reads them without bank conflicts) */
__host__ __device__ __forceinline__ int ld_c(const Geom &G) { return G.C + 4; }
__host__ __device__ __forceinline__ int ld_k(const Geom &G) { return G.K + 4; }
__host__ __device__ __forceinline__ int ld_bv(int BV) { return BV + 8; }

/* ---------------------------------------------------------------- prep (forward, and backward
 * recompute): cumsum -> Gc; Mkk, A; Ai; W, U; P.  Smem: b[C], Gh[C]; A, Y, Tmp [C x ld_c]; K
 * [C x ld_k] (raw, then scaled by beta e^G for W); X: Q for P, then V in tiles of prep_vt columns
 * for U. */
__host__ __device__ __forceinline__ int prep_vt(const Geom &G) { return G.V < 256 ? G.V : 256; }
__host__ __device__ __forceinline__ int prep_ldx(const Geom &G) { return (G.K > prep_vt(G) ? G.K : prep_vt(G)) + 4; }
inline size_t prep_smem(const Geom &G) {
    return sizeof(float) * (size_t)(2 * G.C + 3 * G.C * ld_c(G) + G.C * ld_k(G) + G.C * prep_ldx(G));
}

template <typename T, int GATE, bool TC>
__global__ void __launch_bounds__(NT)
    k_prep(Geom G, const T *q, const T *k, const T *v, const float *g, const T *beta, float *Gc, float *W, float *U,
           float *P, float *Ai_out, float *Mkk_out, int blocked) {
    DRC_SMEM(float, sm);
    const int C = G.C, K = G.K, V = G.V, HV = G.HV, tid = threadIdx.x;
    const int LC = ld_c(G), LK = ld_k(G), LX = prep_ldx(G), VT = prep_vt(G);
    const CP<T> p = cp_at<T>(G, blockIdx.x / HV, (int)(blockIdx.x % HV));
    const int L = p.L;
    float *sb = sm, *sh = sb + C, *sA = sh + C, *sY = sA + C * LC, *sT = sY + C * LC, *sK = sT + C * LC;
    float *sX = sK + C * LK;
    const T *kc = k + p.oq, *qc = q + p.oq, *vc = v + p.ov;
    float *Gcc = GATE != DG_GATE_NONE ? Gc + p.og : nullptr;
    /* G = chunk-local cumsum of g */
    if (GATE != DG_GATE_NONE)
        for (int j = tid; j < G.gs; j += NT) {
            float a = 0.0f;
            for (int i = 0; i < L; i++) {
                a += g[p.og + i * p.ldg + j];
                Gcc[i * p.ldg + j] = a;
            }
        }
    for (int i = tid; i < C; i += NT) sb[i] = i < L ? ldx(beta + p.ob + i * (int64_t)HV) : 0.0f;
    for (int e = tid; e < C * LC; e += NT) sA[e] = 0.0f, sY[e] = 0.0f;
    stage<NT>(sK, LK, kc, p.ldq, L, K, AsIs{});
    stage<NT>(sX, LX, qc, p.ldq, L, K, AsIs{});
    bsync();
    for (int i = tid; i < C; i += NT) sh[i] = GATE == DG_GATE_HEAD && i < L ? Gcc[i * p.ldg] : 0.0f;
    bsync();
    /* Mkk_ij = sum_c k_ic k_jc Gamma(i,j,c) (j < i);  A = diag(beta) Mkk;
     * P_ij = scale sum_c q_ic k_jc Gamma(i,j,c) (j <= i) */
    if constexpr (GATE != DG_GATE_CHANNEL) {
        const Mat Kt{sK, 1, LK}; /* K^T */
        blk_mm<TC, NT>(L, L, Term{Mat{sK, LK, 1}, Kt, K}, [&](int i, int j, float m) {
            if (j >= i) return;
            if (GATE == DG_GATE_HEAD) m *= expf(sh[i] - sh[j]);
            if (Mkk_out) Mkk_out[p.oc + i * p.ldc + j] = m;
            sA[i * LC + j] = sb[i] * m;
        });
        blk_mm<TC, NT>(L, L, Term{Mat{sX, LX, 1}, Kt, K}, [&](int i, int j, float m) {
            if (j > i) return;
            if (GATE == DG_GATE_HEAD) m *= expf(sh[i] - sh[j]);
            P[p.oc + i * p.ldc + j] = G.scale * m;
        });
    } else if (TC && chan_wide(Gcc, p.ldg, L, K, sT)) { /* R in sT (free until the inverse) */
        /* X = Q e^{G - R}, K' = K e^{R - G} (in place): P = scale lower_incl(X K'^T); then X = K e^{G - R}:
         * Mkk = strictly_lower(X K'^T); K again for W */
        const float *R = sT;
        for (int e = tid; e < L * K; e += NT) {
            const int i = e / K, c = e % K;
            const float d = Gcc[i * p.ldg + c] - R[c];
            sX[i * LX + c] *= expf(d);
            sK[i * LK + c] *= expf(-d);
        }
        bsync();
        const Mat Kt{sK, 1, LK};
        blk_mm_x3<TC, NT>(L, L, Term{Mat{sX, LX, 1}, Kt, K}, [&](int i, int j, float m) {
            if (j <= i) P[p.oc + i * p.ldc + j] = G.scale * m;
        });
        bsync();
        stage<NT>(sX, LX, kc, p.ldq, L, K, [&](int i, int c, float x) { return x * expf(Gcc[i * p.ldg + c] - R[c]); });
        bsync();
        blk_mm_x3<TC, NT>(L, L, Term{Mat{sX, LX, 1}, Kt, K}, [&](int i, int j, float m) {
            if (j >= i) return;
            if (Mkk_out) Mkk_out[p.oc + i * p.ldc + j] = m;
            sA[i * LC + j] = sb[i] * m;
        });
        bsync();
        stage<NT>(sK, LK, kc, p.ldq, L, K, AsIs{});
    } else { /* the gate inside the sum over c: f32 FMAs */
        for (int e = tid; e < L * L; e += NT) {
            const int i = e / L, j = e % L;
            if (j > i) continue;
            const float *Gi = Gcc + i * p.ldg, *Gj = Gcc + j * p.ldg;
            float m = 0.0f, pq = 0.0f;
            for (int c = 0; c < K; c++) {
                const float gm = expf(Gi[c] - Gj[c]), kj = sK[j * LK + c];
                m += sK[i * LK + c] * kj * gm;
                pq += sX[i * LX + c] * kj * gm;
            }
            if (j < i) {
                if (Mkk_out) Mkk_out[p.oc + i * p.ldc + j] = m;
                sA[i * LC + j] = sb[i] * m;
            }
            P[p.oc + i * p.ldc + j] = G.scale * pq;
        }
    }
    bsync();
    /* Y = (I + A)^-1: forward substitution by columns, Y_ic = delta_ic - sum_{c<=j<i} A_ij Y_jc,
     * either over the whole chunk or inside each 16 x 16 diagonal block (blocked) */
    const int bs = blocked ? 16 : C;
    const int nb = (L + bs - 1) / bs;
    for (int t = tid; t < nb * bs; t += NT) {
        int b0 = t / bs * bs, col = t;
        if (col >= L) continue;
        int i1 = b0 + bs < L ? b0 + bs : L;
        sY[col * LC + col] = 1.0f;
        for (int i = col + 1; i < i1; i++) {
            float s = 0.0f;
            for (int j = col; j < i; j++) s += sA[i * LC + j] * sY[j * LC + col];
            sY[i * LC + col] = -s;
        }
    }
    bsync();
    /* blocked: block rows I = 1.. in order: Y_IJ = -Y_II (A[I, J0:I0] Y[J0:I0, J]) for J < I */
    for (int i0 = bs; blocked && i0 < L; i0 += bs) {
        int i1 = i0 + bs < L ? i0 + bs : L;
        for (int e = tid; e < (i1 - i0) * i0; e += NT) {
            int i = i0 + e / i0, c = e % i0;
            float s = 0.0f;
            for (int m = c; m < i0; m++) s += sA[i * LC + m] * sY[m * LC + c];
            sT[i * LC + c] = s;
        }
        bsync();
        for (int e = tid; e < (i1 - i0) * i0; e += NT) {
            int i = i0 + e / i0, c = e % i0;
            float s = 0.0f;
            for (int m = i0; m <= i; m++) s += sY[i * LC + m] * sT[m * LC + c];
            sY[i * LC + c] = -s;
        }
        bsync();
    }
    if (Ai_out)
        for (int e = tid; e < L * C; e += NT) {
            int i = e / C, j = e % C;
            if (j <= i) Ai_out[p.oc + i * p.ldc + j] = sY[i * LC + j];
        }
    /* W = Y Kbg, Kbg_jc = beta_j exp(G_jc) k_jc (K scaled in place: Mkk and P are done) */
    for (int e = tid; e < L * K; e += NT) {
        const int j = e / K, c = e % K;
        float f = sb[j];
        if (GATE == DG_GATE_HEAD) f *= expf(sh[j]);
        if (GATE == DG_GATE_CHANNEL) f *= expf(Gcc[j * p.ldg + c]);
        sK[j * LK + c] *= f;
    }
    bsync();
    blk_mm<TC, NT>(L, K, Term{Mat{sY, LC, 1}, Mat{sK, LK, 1}, L},
                   [&](int i, int c, float x) { W[p.ok + i * p.ldk + c] = x; });
    /* U = Y Vb, Vb_jv = beta_j v_jv, by tiles of VT columns of V in X (P is done) */
    for (int v0 = 0; v0 < V; v0 += VT) {
        const int nv = V - v0 < VT ? V - v0 : VT;
        stage<NT>(sX, LX, vc + v0, p.ldv, L, nv, [&](int j, int, float x) { return sb[j] * x; });
        bsync();
        blk_mm<TC, NT>(L, nv, Term{Mat{sY, LC, 1}, Mat{sX, LX, 1}, L},
                       [&](int i, int c, float x) { U[p.ov + i * p.ldv + v0 + c] = x; });
        bsync();
    }
}

/* Decay of state row r over chunk (rows 0..L-1): exp(G_last,r) */
template <int GATE> __device__ __forceinline__ float last_decay(const float *Gl, int r) { return gexp<GATE>(Gl, r); }

/* ---------------------------------------------------------------- state pass, block per
 * (sequence n, value head hv, V tile of BV columns).  UV holds U on entry and V' on exit.
 * Smem: S [K x ld_bv], X [C x ld_k] (W, then Kd), Vn [C x ld_bv], dec [K]. */
inline size_t state_smem(const Geom &G, int BV) {
    return sizeof(float) * (size_t)(G.K * ld_bv(BV) + G.C * ld_k(G) + G.C * ld_bv(BV) + G.K);
}

template <typename T, int GATE, bool TC>
__global__ void __launch_bounds__(NT) k_state(Geom G, int BV, const T *k, const float *Gc, const float *W, float *UV,
                                              const float *h0, float *hT, float *Hst) {
    DRC_SMEM(float, sm);
    const int C = G.C, K = G.K, V = G.V, HV = G.HV, tid = threadIdx.x;
    const int LK = ld_k(G), LS = ld_bv(BV);
    const int NVT = (V + BV - 1) / BV;
    const int vt = (int)(blockIdx.x % NVT), hv = (int)(blockIdx.x / NVT % HV);
    const int64_t n = chain_seq(G, blockIdx.x / NVT / HV);
    const int j0 = vt * BV, nbv = V - j0 < BV ? V - j0 : BV;
    float *sS = sm, *sX = sS + K * LS, *sV = sX + C * LK, *sdec = sV + C * LS;
    const int64_t hb = (n * HV + hv) * (int64_t)K * V + j0;
    for (int e = tid; e < K * nbv; e += NT) {
        int r = e / nbv, j = e % nbv;
        sS[r * LS + j] = h0 ? h0[hb + (int64_t)r * V + j] : 0.0f;
    }
    int64_t c0, c1;
    seq_chunks(G, n, c0, c1);
    bsync();
    for (int64_t c = c0; c < c1; c++) {
        const CP<T> p = cp_at<T>(G, c, hv);
        const int L = p.L;
        if (Hst) {
            const int64_t sb = (c * HV + hv) * (int64_t)K * V + j0;
            for (int e = tid; e < K * nbv; e += NT) {
                int r = e / nbv, j = e % nbv;
                Hst[sb + (int64_t)r * V + j] = sS[r * LS + j];
            }
        }
        stage<NT>(sX, LK, W + p.ok, p.ldk, L, K, AsIs{});
        stage<NT>(sV, LS, UV + p.ov + j0, p.ldv, L, nbv, AsIs{}); /* U */
        bsync();
        /* V' = U - W S */
        blk_mm<TC, NT>(L, nbv, Term{Mat{sX, LK, 1}, Mat{sS, LS, 1}, K}, [&](int i, int j, float x) {
            const float s = sV[i * LS + j] - x;
            UV[p.ov + i * p.ldv + j0 + j] = s;
            sV[i * LS + j] = s;
        });
        bsync();
        /* S <- exp(G_last) S + (exp(G_last - G) o K)^T V' */
        const float *Gl = GATE != DG_GATE_NONE ? Gc + p.og + (L - 1) * p.ldg : nullptr;
        stage<NT>(sX, LK, k + p.oq, p.ldq, L, K, [&](int i, int r, float kk) {
            return GATE != DG_GATE_NONE ? kk * gam<GATE>(Gl, Gc + p.og + i * p.ldg, r) : kk;
        });
        for (int r = tid; r < K; r += NT) sdec[r] = last_decay<GATE>(Gl, r);
        bsync();
        blk_mm<TC, NT>(K, nbv, Term{Mat{sX, 1, LK}, Mat{sV, LS, 1}, L},
                       [&](int r, int j, float x) { sS[r * LS + j] = sdec[r] * sS[r * LS + j] + x; });
        bsync();
    }
    if (hT)
        for (int e = tid; e < K * nbv; e += NT) {
            int r = e / nbv, j = e % nbv;
            hT[hb + (int64_t)r * V + j] = sS[r * LS + j];
        }
}

int tile_bv(const Geom &G) { return G.V < 64 ? G.V : 64; }

/* whether the TF32 family runs this call's kernels on 16-bit tensor cores (dr_chunk_k256.cu,
 * dr_chunk_k256_chan.cu, dr_chunk_k256_bwd.cu: K = 256, chunk 64; k256_ok), as far as q, k, v decide:
 * the kernels that also read dO or write o ask for those to be aligned too */
template <typename T, int GATE, bool TC> bool k256_takes(const Geom &G, const Io<T> &io) {
    if constexpr (TC && sizeof(T) == 2) return k256_ok(G, io.q, io.k, io.v);
    else return false;
}

/* prep and the state pass of a call (the forward, and the backward's recompute: Ai and Mkk given,
 * hT NULL): on 16-bit tensor cores where k256 (k256_takes, and what the call's other 16-bit passes
 * ask for: W is then 16-bit words, which only the 16-bit dhu reads), into the TF32 kernels' buffers;
 * U (V' over it) and the states as Words says: 16-bit words (and the states' lo plane) where only
 * 16-bit kernels read them, f32 for the TF32 kernels (whose state pass writes f32 alone); with the
 * per-channel gate the 16-bit prep also writes Kd and Qg [rows, HV, K] (16-bit words, K256Bufs),
 * which the 16-bit passes read */
template <typename T, int GATE, bool TC>
int prep_state(const Plan &pl, const Io<T> &io, bool k256, float *Gc, float *W, Words U, float *P, float *Ai,
               float *Mkk, Words Hst, float *hT, int blocked, uint16_t *Kd = nullptr, uint16_t *Qg = nullptr) {
    const Geom &G = pl.G;
    if constexpr (TC && sizeof(T) == 2) {
        if (k256) {
            const K256Out o{Gc, (uint16_t *)W, U, P, Ai, Mkk, Hst, io.h0, hT, Kd, Qg};
            return is_bf16<T>::value ? fast::k256_prep_state(pl, io_bits(io), o, blocked)
                                     : fast_h::k256_prep_state(pl, io_bits(io), o, blocked);
        }
    }
    const int BV = tile_bv(G), NVT = (G.V + BV - 1) / BV;
    int rc = DRC_LAUNCH(TC ? "dr_chunk tf32 prep" : "dr_chunk prep", (k_prep<T, GATE, TC>), G.nchunks * G.HV, NT,
                        prep_smem(G), G, io.q, io.k, io.v, io.g, io.beta, Gc, W, U.f, P, Ai, Mkk, blocked);
    if (!rc)
        rc = DRC_LAUNCH(TC ? "dr_chunk tf32 state" : "dr_chunk state", (k_state<T, GATE, TC>), G.N * G.HV * NVT, NT,
                        state_smem(G, BV), G, BV, io.k, (const float *)Gc, (const float *)W, U.f, io.h0, hT, Hst.f);
    return rc;
}
/* (the largest shared-memory requests, at C = 64: dqkwg 197248 bytes, dhu 195584 at K = 256, prep
 * 185856 at K = 256 and V >= 256, the fused backward up to the limit (it runs where it fits), all
 * under the 232448 a block may have on sm_90; plan_init rejects K > 256) */

} // namespace
} // namespace drc

#endif
