/* The delta-rule family, token by token, forward and backward (the reference recurrence on the
 * GPU; the chunked kernels are the fast path).  Semantics and layout: kernels/cpu/delta/delta_rule.h.
 *
 * Per sequence n and value head hv (query/key head h = hv / (HV/H)), state S [K,V], per token t:
 *   S'  = D_t S                      D_t = 1 | exp(g_t) | Diag(exp(g_t))    (none, head, channel)
 *   w_t = v_t - S'^T k_t             u_t = beta_t w_t
 *   S_t = S' + k_t u_t^T             o_t = S_t^T (scale q_t)
 *
 * Work split.  The columns of S evolve independently (column j only reads v_t[j]), so a block
 * takes one (sequence, value head, tile of BV columns) and its threads split the tile by columns:
 * KS adjacent lanes of a warp share a column, each holding KT = 16 consecutive rows of it in
 * registers (KS = the power of two >= K/16, so K <= 512; rows past K and columns past V are
 * zero and inert).  The dot products over K (S'^T k, S_t^T q, and in the backward dS^T k) are
 * shuffles over the KS lanes; nothing else is shared in the forward, which needs no barrier.
 *
 * Backward (per token, in reverse; dS is the gradient of S_t, starting from dhT):
 *   o_t = S_t^T (scale q):   dS += scale q do^T;            dq  = scale S_t do
 *   S_t = S' + k u^T:        du = dS^T k;                    dk  = dS u
 *   u = beta (v - S'^T k):   dw = beta du:  dv = dw;         dbeta = du . w
 *                            dS' = dS - k dw^T;              dk -= S' dw
 *   S' = D S:                dg_i = sum_j S'_ij dS'_ij (summed over i too for a head gate)
 *                            dS_{t-1} = D dS'
 * dq, dk, dg and dbeta sum over the columns: within a warp by shuffles, across the block's warps
 * through shared memory (double buffered: one barrier per token), and across the V tiles and the
 * value heads of a group through f32 partial sums in scratch that a second kernel adds up.
 *
 * The states the backward needs, S_{t-1} for every t, are recomputed: a forward pass stores one
 * checkpoint every C tokens; then, for each stretch of C tokens from the last, the stretch is
 * recomputed from its checkpoint (each S_{t-1} stored) and walked backwards.  Checkpoints and the
 * stretch live in scratch owned by the thread that writes them (read back by that same thread,
 * coalesced: float4 r-slices interleaved by thread), so no barrier guards them.
 *
 * Storage of q, k, v, beta, o and their gradients: f32, bf16 or fp16 (__half), f32 arithmetic.
 *
 * Speed (H200, B8 T2048 H=HV=16 K=V=128, head gate, f32): forward 5.1 ms, backward 26.6 ms (bf16
 * storage: 5.4 / 27.8 ms); latency bound, one dependent chain of 2048 steps per block.  Loading
 * the next token's inputs during the current step is slower (6.9 / 39 ms: more registers, fewer
 * resident blocks).  The chunked kernels are the fast path. */
#include "kernels/cuda/cuda_util.h"

#include <math.h>
#include <stdlib.h>

namespace {

constexpr int KT = 16; /* rows of a column held by one thread */
constexpr int kMaxK = 32 * KT;

struct DrGeom {
    int64_t T;           /* tokens per batch row (the total T when cu_seqlens) */
    int H, HV, G, K, V;  /* G = HV / H */
    int KS, BV, NT, NVT; /* lanes per column, columns per block, threads, V tiles */
    int C;               /* backward: tokens between checkpoints */
    float scale;
    const int64_t *seq;    /* device [3N]: bos, len, first checkpoint slot; NULL: batched */
    int64_t slots_per_row; /* batched: checkpoint slots per sequence */
};

__device__ __forceinline__ float ld(const float *p) { return *p; }
__device__ __forceinline__ float ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ float ld(const __half *p) { return __half2float(*p); }
__device__ __forceinline__ void st(float *p, float v) { *p = v; }
__device__ __forceinline__ void st(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void st(__half *p, float v) { *p = __float2half_rn(v); }

__device__ __forceinline__ float sum_lanes(float x, int KS) { /* over the KS lanes of a column */
    for (int off = 1; off < KS; off <<= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

/* The block's coordinates: sequence n, value head hv (query/key head h), V tile vt; the thread's
 * column j (c in the block) and first row i0 (lane ks of the column); the sequence's first token,
 * length and first checkpoint slot. */
struct DrBlock {
    int n, hv, h, vt, c, ks, j, i0;
    bool col_ok;
    int64_t bos, len, slot0;
};

__device__ __forceinline__ DrBlock dr_block(const DrGeom &G, int64_t N) {
    DrBlock b;
    const int64_t bid = blockIdx.x;
    b.vt = (int)(bid % G.NVT);
    b.hv = (int)(bid / G.NVT % G.HV);
    b.n = (int)(bid / ((int64_t)G.NVT * G.HV));
    b.h = b.hv / G.G;
    b.c = threadIdx.x / G.KS;
    b.ks = threadIdx.x % G.KS;
    b.j = b.vt * G.BV + b.c;
    b.i0 = b.ks * KT;
    b.col_ok = b.j < G.V;
    if (G.seq) {
        b.bos = G.seq[b.n], b.len = G.seq[N + b.n], b.slot0 = G.seq[2 * N + b.n];
    } else {
        b.bos = (int64_t)b.n * G.T, b.len = G.T, b.slot0 = (int64_t)b.n * G.slots_per_row;
    }
    return b;
}

/* Per-token inputs of the thread's rows and column. */
template <typename T, int GATE> struct DrTok {
    float k[KT], q[KT], e[KT]; /* e: the decay of each row (1 without a gate) */
    float v, beta;
};

template <typename T, int GATE>
__device__ __forceinline__ void load_tok(const DrGeom &G, const DrBlock &b, int64_t tok, const T *q, const T *k,
                                         const T *v, const float *g, const T *beta, DrTok<T, GATE> &x) {
    const int64_t qk = (tok * G.H + b.h) * G.K + b.i0;
    float eh = 1.0f;
    if (GATE == DG_GATE_HEAD) eh = expf(g[tok * G.HV + b.hv]);
    const float *gc = GATE == DG_GATE_CHANNEL ? g + (tok * G.HV + b.hv) * G.K + b.i0 : nullptr;
#pragma unroll
    for (int r = 0; r < KT; r++) {
        bool ok = b.i0 + r < G.K;
        x.k[r] = ok ? ld(k + qk + r) : 0.0f;
        x.q[r] = ok ? ld(q + qk + r) : 0.0f;
        if (GATE == DG_GATE_CHANNEL) x.e[r] = ok ? expf(gc[r]) : 1.0f;
        else x.e[r] = eh;
    }
    x.v = b.col_ok ? ld(v + (tok * G.HV + b.hv) * G.V + b.j) : 0.0f;
    x.beta = ld(beta + tok * G.HV + b.hv);
}

/* One step of the recurrence on the thread's slice of S; returns w = v - S'^T k. */
template <typename T, int GATE>
__device__ __forceinline__ float step(const DrGeom &G, float (&S)[KT], const DrTok<T, GATE> &x) {
    float dot = 0.0f;
#pragma unroll
    for (int r = 0; r < KT; r++) {
        S[r] *= x.e[r];
        dot += S[r] * x.k[r];
    }
    float w = x.v - sum_lanes(dot, G.KS);
    float u = x.beta * w;
#pragma unroll
    for (int r = 0; r < KT; r++) S[r] += x.k[r] * u;
    return w;
}

template <typename T, int GATE>
__global__ void __launch_bounds__(256) dr_fwd_kernel(DrGeom G, int64_t N, const T *q, const T *k, const T *v,
                                                     const float *g, const T *beta, const float *h0, T *o, float *hT) {
    const DrBlock b = dr_block(G, N);

    float S[KT];
    const int64_t hbase = ((int64_t)b.n * G.HV + b.hv) * G.K * G.V + b.j;
#pragma unroll
    for (int r = 0; r < KT; r++) S[r] = h0 && b.col_ok && b.i0 + r < G.K ? h0[hbase + (int64_t)(b.i0 + r) * G.V] : 0.0f;

    for (int64_t t = 0; t < b.len; t++) {
        const int64_t tok = b.bos + t;
        DrTok<T, GATE> x;
        load_tok<T, GATE>(G, b, tok, q, k, v, g, beta, x);
        step<T, GATE>(G, S, x);
        float dot = 0.0f;
#pragma unroll
        for (int r = 0; r < KT; r++) dot += S[r] * x.q[r];
        dot = sum_lanes(dot, G.KS);
        if (o && b.ks == 0 && b.col_ok) st(o + (tok * G.HV + b.hv) * G.V + b.j, G.scale * dot);
    }
    if (hT && b.col_ok) {
#pragma unroll
        for (int r = 0; r < KT; r++)
            if (b.i0 + r < G.K) hT[hbase + (int64_t)(b.i0 + r) * G.V] = S[r];
    }
}

/* Thread-owned scratch: KT floats per thread as KT/4 float4 slices interleaved by thread. */
__device__ __forceinline__ void save_state(float4 *base, int NT, const float (&S)[KT]) {
#pragma unroll
    for (int r4 = 0; r4 < KT / 4; r4++)
        base[(int64_t)r4 * NT + threadIdx.x] = make_float4(S[4 * r4], S[4 * r4 + 1], S[4 * r4 + 2], S[4 * r4 + 3]);
}
__device__ __forceinline__ void load_state(const float4 *base, int NT, float (&S)[KT]) {
#pragma unroll
    for (int r4 = 0; r4 < KT / 4; r4++) {
        float4 f = base[(int64_t)r4 * NT + threadIdx.x];
        S[4 * r4] = f.x, S[4 * r4 + 1] = f.y, S[4 * r4 + 2] = f.z, S[4 * r4 + 3] = f.w;
    }
}

/* Partial sums of one token over this block's columns, per value head and V tile:
 * dq, dk, dg (channel) [tokens, HV, NVT, K]; dbeta, dg (head) [tokens, HV, NVT]. */
struct DrPartials {
    float *dq, *dk, *dg, *dbeta;
};

template <typename T, int GATE>
__global__ void __launch_bounds__(256)
    dr_bwd_kernel(DrGeom G, int64_t N, const T *q, const T *k, const T *v, const float *g, const T *beta,
                  const float *h0, const T *dout, const float *dhT, T *dv, float *dh0, DrPartials P, float4 *ckpt,
                  float4 *stretch) {
    extern __shared__ float red[]; /* [2][warps][3 KP + 2] */
    const DrBlock b = dr_block(G, N);
    const int64_t bid = blockIdx.x;

    const int KP = G.KS * KT, NW = G.NT / 32, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int ROW = 3 * KP + 2;                       /* dq | dk | dg rows | dbeta | dg head */
    const int64_t slot_f4 = (int64_t)G.NT * (KT / 4); /* float4s of one block state */
    float4 *my_ckpt = ckpt + ((b.slot0 * G.HV + b.hv) * G.NVT + b.vt) * slot_f4;
    float4 *my_stretch = stretch + bid * G.C * slot_f4;
    const int64_t hbase = ((int64_t)b.n * G.HV + b.hv) * G.K * G.V + b.j;

    /* pass 1: forward from h0, a checkpoint before every C-th token */
    float S[KT];
#pragma unroll
    for (int r = 0; r < KT; r++) S[r] = h0 && b.col_ok && b.i0 + r < G.K ? h0[hbase + (int64_t)(b.i0 + r) * G.V] : 0.0f;
    for (int64_t t = 0; t < b.len; t++) {
        if (t % G.C == 0) save_state(my_ckpt + t / G.C * G.HV * G.NVT * slot_f4, G.NT, S);
        DrTok<T, GATE> x;
        load_tok<T, GATE>(G, b, b.bos + t, q, k, v, g, beta, x);
        step<T, GATE>(G, S, x);
    }

    /* pass 2: stretches from the last, each recomputed, then walked backwards */
    float dS[KT];
#pragma unroll
    for (int r = 0; r < KT; r++)
        dS[r] = dhT && b.col_ok && b.i0 + r < G.K ? dhT[hbase + (int64_t)(b.i0 + r) * G.V] : 0.0f;
    const int64_t nstretch = (b.len + G.C - 1) / G.C;
    for (int64_t sc = nstretch - 1; sc >= 0; sc--) {
        const int64_t t0 = sc * G.C, t1 = t0 + G.C < b.len ? t0 + G.C : b.len;
        load_state(my_ckpt + sc * G.HV * G.NVT * slot_f4, G.NT, S);
        for (int64_t t = t0; t < t1; t++) {
            save_state(my_stretch + (t - t0) * slot_f4, G.NT, S); /* S_{t-1} */
            DrTok<T, GATE> x;
            load_tok<T, GATE>(G, b, b.bos + t, q, k, v, g, beta, x);
            step<T, GATE>(G, S, x);
        }
        for (int64_t t = t1 - 1; t >= t0; t--) {
            const int64_t tok = b.bos + t;
            DrTok<T, GATE> x;
            load_tok<T, GATE>(G, b, tok, q, k, v, g, beta, x);
            load_state(my_stretch + (t - t0) * slot_f4, G.NT, S);
            /* forward again: S' = D S_{t-1}, w, u */
            float dot = 0.0f;
#pragma unroll
            for (int r = 0; r < KT; r++) {
                S[r] *= x.e[r];
                dot += S[r] * x.k[r];
            }
            const float w = x.v - sum_lanes(dot, G.KS), u = x.beta * w;
            const float dout_j = dout && b.col_ok ? ld(dout + (tok * G.HV + b.hv) * G.V + b.j) : 0.0f;
            /* o_t = S_t^T (scale q): dS += scale q do^T, dq = scale S_t do */
            float pq[KT], pk[KT], pg[KT], du = 0.0f;
#pragma unroll
            for (int r = 0; r < KT; r++) {
                dS[r] += G.scale * x.q[r] * dout_j;
                pq[r] = G.scale * (S[r] + x.k[r] * u) * dout_j;
                du += dS[r] * x.k[r];
            }
            /* S_t = S' + k u^T: du = dS^T k;  u = beta w: dw = beta du, dbeta = du w */
            du = sum_lanes(du, G.KS);
            const float dw = x.beta * du;
            if (dv && b.ks == 0 && b.col_ok) st(dv + (tok * G.HV + b.hv) * G.V + b.j, dw);
            float pb = b.ks == 0 ? du * w : 0.0f, pgh = 0.0f;
#pragma unroll
            for (int r = 0; r < KT; r++) {
                pk[r] = dS[r] * u - S[r] * dw;   /* dk = dS u - S' dw */
                float dSp = dS[r] - x.k[r] * dw; /* dS' = dS - k dw^T */
                pg[r] = S[r] * dSp;              /* dg = S' o dS' */
                pgh += pg[r];
                dS[r] = x.e[r] * dSp; /* S' = D S_{t-1} */
            }
            /* sums over the block's columns: shuffles over the warp's columns, then warps */
            float *buf = red + (t & 1) * NW * ROW + warp * ROW;
            for (int off = G.KS; off < 32; off <<= 1) {
#pragma unroll
                for (int r = 0; r < KT; r++) {
                    pq[r] += __shfl_xor_sync(0xffffffffu, pq[r], off);
                    pk[r] += __shfl_xor_sync(0xffffffffu, pk[r], off);
                    if (GATE == DG_GATE_CHANNEL) pg[r] += __shfl_xor_sync(0xffffffffu, pg[r], off);
                }
            }
            for (int off = 1; off < 32; off <<= 1) {
                pb += __shfl_xor_sync(0xffffffffu, pb, off);
                if (GATE == DG_GATE_HEAD) pgh += __shfl_xor_sync(0xffffffffu, pgh, off);
            }
            if (lane < G.KS) {
#pragma unroll
                for (int r = 0; r < KT; r++) {
                    buf[b.i0 + r] = pq[r];
                    buf[KP + b.i0 + r] = pk[r];
                    buf[2 * KP + b.i0 + r] = GATE == DG_GATE_CHANNEL ? pg[r] : 0.0f;
                }
            }
            if (lane == 0) buf[3 * KP] = pb, buf[3 * KP + 1] = pgh;
            __syncthreads();
            const float *all = red + (t & 1) * NW * ROW;
            const int64_t pt = (tok * G.HV + b.hv) * G.NVT + b.vt; /* partial row */
            for (int e = threadIdx.x; e < ROW; e += G.NT) {
                int part = e < 3 * KP ? e / KP : 3 + (e - 3 * KP), i = e < 3 * KP ? e % KP : 0;
                float *dst = part == 0 ? P.dq : part == 1 ? P.dk : part == 2 ? P.dg : part == 3 ? P.dbeta : P.dg;
                if (!dst || i >= G.K) continue;
                if (part == 2 && GATE != DG_GATE_CHANNEL) continue;
                if (part == 4 && GATE != DG_GATE_HEAD) continue;
                float s = 0.0f;
                for (int wi = 0; wi < NW; wi++) s += all[wi * ROW + e];
                dst[part < 3 ? pt * G.K + i : pt] = s;
            }
            /* the next token writes the other buffer; this one is rewritten only after the next
             * barrier, which every thread reaches after its reads above */
        }
    }
    if (dh0 && b.col_ok) {
#pragma unroll
        for (int r = 0; r < KT; r++)
            if (b.i0 + r < G.K) dh0[hbase + (int64_t)(b.i0 + r) * G.V] = dS[r];
    }
}

/* out[(tok*HO + ho)*L + i] = sum_{a<A} sum_{vt<NVT} part[((tok*HV + ho*A + a)*NVT + vt)*L + i] */
template <typename TO>
__global__ void sum_partials_kernel(int64_t tokens, int HO, int A, int NVT, int L, const float *part, TO *out) {
    const int64_t n = tokens * HO * L;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e % L, th = e / L; /* th = tok * HO + ho */
        const float *p = part + (th * A * NVT) * L + i;
        float s = 0.0f;
        for (int a = 0; a < A * NVT; a++) s += p[(int64_t)a * L];
        st(out + e, s);
    }
}

/* ---- host side ---- */

struct DrPlan {
    DrGeom G;
    int64_t N, tokens, nblocks, max_len;
    int64_t *seq_dev; /* owned scratch, or NULL */
    int64_t nslots;
};

int validate(const char *who, const dg_dr_shape *s, const void *q, const void *k, const void *v, const void *g,
             const void *beta) {
    if (!s) {
        dg_error("%s: shape is NULL", who);
        return -1;
    }
    if (s->B < 1 || s->T < 0 || s->H < 1 || s->HV < 1 || s->K < 1 || s->V < 1) {
        dg_error("%s: sizes B=%lld T=%lld H=%lld HV=%lld K=%lld V=%lld must be positive (T >= 0)", who, (long long)s->B,
                 (long long)s->T, (long long)s->H, (long long)s->HV, (long long)s->K, (long long)s->V);
        return -1;
    }
    if (s->HV % s->H) {
        dg_error("%s: HV=%lld value heads are not a multiple of H=%lld query/key heads", who, (long long)s->HV,
                 (long long)s->H);
        return -1;
    }
    if (s->K > kMaxK || s->V > INT32_MAX || s->HV > INT32_MAX) {
        dg_error("%s: K=%lld is larger than the %d this kernel supports (or V, HV beyond 2^31)", who, (long long)s->K,
                 kMaxK);
        return -1;
    }
    if (s->gate != DG_GATE_NONE && s->gate != DG_GATE_HEAD && s->gate != DG_GATE_CHANNEL) {
        dg_error("%s: unknown gate kind %d", who, (int)s->gate);
        return -1;
    }
    if ((s->gate == DG_GATE_NONE) != (g == nullptr)) {
        dg_error("%s: g is %s but the gate kind is %d", who, g ? "given" : "NULL", (int)s->gate);
        return -1;
    }
    if (!q || !k || !v || !beta) {
        dg_error("%s: q, k, v and beta are required", who);
        return -1;
    }
    if (s->cu_seqlens) {
        if (s->B != 1) {
            dg_error("%s: cu_seqlens needs B = 1, got B=%lld", who, (long long)s->B);
            return -1;
        }
        const int64_t *cu = s->cu_seqlens;
        if (s->N < 1 || cu[0] != 0 || cu[s->N] != s->T) {
            dg_error("%s: cu_seqlens must run from 0 to T=%lld over N=%lld sequences", who, (long long)s->T,
                     (long long)s->N);
            return -1;
        }
        for (int64_t i = 0; i < s->N; i++)
            if (cu[i + 1] < cu[i]) {
                dg_error("%s: cu_seqlens decreases at %lld (%lld then %lld)", who, (long long)i, (long long)cu[i],
                         (long long)cu[i + 1]);
                return -1;
            }
    }
    return 0;
}

/* Geometry, and (cu_seqlens) the per-sequence table on the device.  C: checkpoint interval. */
int plan(const char *who, const dg_dr_shape *s, bool bwd, DrPlan *p) {
    DrGeom &G = p->G;
    G.T = s->T;
    G.H = (int)s->H, G.HV = (int)s->HV, G.G = (int)(s->HV / s->H);
    G.K = (int)s->K, G.V = (int)s->V;
    int KS = 1;
    while (KS * KT < G.K) KS *= 2;
    int cw = 32 / KS; /* columns per warp */
    int bv = 256 / KS;
    int vr = (G.V + cw - 1) / cw * cw;
    G.KS = KS, G.BV = bv < vr ? bv : vr, G.NT = G.BV * KS;
    G.NVT = (G.V + G.BV - 1) / G.BV;
    G.scale = (float)s->scale;
    p->N = s->cu_seqlens ? s->N : s->B;
    p->tokens = s->B * s->T;
    p->nblocks = p->N * G.HV * G.NVT;
    if (p->nblocks > INT32_MAX) {
        dg_error("%s: %lld blocks (sequences x value heads x V tiles) exceed the grid", who, (long long)p->nblocks);
        return -1;
    }
    int64_t maxlen = s->T;
    if (s->cu_seqlens) {
        maxlen = 0;
        for (int64_t i = 0; i < p->N; i++) {
            int64_t l = s->cu_seqlens[i + 1] - s->cu_seqlens[i];
            if (l > maxlen) maxlen = l;
        }
    }
    p->max_len = maxlen;
    int C = 8; /* about sqrt(longest sequence), a power of two in 8..64 */
    while (C < 64 && (int64_t)C * C < maxlen) C *= 2;
    G.C = bwd ? C : 1;
    G.slots_per_row = (s->T + C - 1) / C;
    G.seq = nullptr;
    p->seq_dev = nullptr;
    p->nslots = p->N * G.slots_per_row;
    if (s->cu_seqlens) {
        int64_t N = p->N;
        int64_t *tab = (int64_t *)malloc(sizeof(int64_t) * 3 * N);
        if (!tab) {
            dg_error("%s: out of host memory", who);
            return -1;
        }
        int64_t slot = 0;
        for (int64_t i = 0; i < N; i++) {
            int64_t l = s->cu_seqlens[i + 1] - s->cu_seqlens[i];
            tab[i] = s->cu_seqlens[i], tab[N + i] = l, tab[2 * N + i] = slot;
            slot += (l + C - 1) / C;
        }
        p->nslots = slot;
        p->seq_dev = dg_cuda_scratch<int64_t>(3 * N);
        int rc = p->seq_dev ? dg_cuda_memcpy(p->seq_dev, tab, sizeof(int64_t) * 3 * N, 0) : -1;
        free(tab);
        if (rc) {
            dg_cuda_free(p->seq_dev);
            return -1;
        }
        G.seq = p->seq_dev;
    }
    return 0;
}

template <typename T>
int fwd_impl(const char *who, const dg_dr_shape *s, const T *q, const T *k, const T *v, const float *g, const T *beta,
             const float *h0, T *o, float *hT) {
    if (validate(who, s, q, k, v, g, beta)) return -1;
    if (dg_cuda_init()) return -1;
    DrPlan p;
    if (plan(who, s, false, &p)) return -1;
    if (p.nblocks == 0) return 0;
    cudaStream_t st = dg_cuda_stream();
    unsigned grid = (unsigned)p.nblocks;
    switch (s->gate) {
    case DG_GATE_NONE:
        dr_fwd_kernel<T, DG_GATE_NONE><<<grid, p.G.NT, 0, st>>>(p.G, p.N, q, k, v, g, beta, h0, o, hT);
        break;
    case DG_GATE_HEAD:
        dr_fwd_kernel<T, DG_GATE_HEAD><<<grid, p.G.NT, 0, st>>>(p.G, p.N, q, k, v, g, beta, h0, o, hT);
        break;
    default: dr_fwd_kernel<T, DG_GATE_CHANNEL><<<grid, p.G.NT, 0, st>>>(p.G, p.N, q, k, v, g, beta, h0, o, hT); break;
    }
    int rc = DG_LAUNCHED("dr_recurrent_fwd");
    dg_cuda_free(p.seq_dev);
    return rc;
}

template <typename T, int GATE>
int launch_bwd(const DrPlan &p, size_t smem, const T *q, const T *k, const T *v, const float *g, const T *beta,
               const float *h0, const T *dout, const float *dhT, T *dv, float *dh0, DrPartials P, float4 *ckpt,
               float4 *stretch) {
    auto kern = dr_bwd_kernel<T, GATE>;
    if (smem > 48 * 1024) DG_CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kern<<<(unsigned)p.nblocks, p.G.NT, smem, dg_cuda_stream()>>>(p.G, p.N, q, k, v, g, beta, h0, dout, dhT, dv, dh0, P,
                                                                  ckpt, stretch);
    return DG_LAUNCHED("dr_recurrent_bwd");
}

template <typename TO> int sum_partials(int64_t tokens, int HO, int A, int NVT, int L, const float *part, TO *out) {
    int64_t n = tokens * HO * L;
    if (n == 0) return 0;
    sum_partials_kernel<TO><<<dg_grid_for(n, 256), 256, 0, dg_cuda_stream()>>>(tokens, HO, A, NVT, L, part, out);
    return DG_LAUNCHED("dr_recurrent_bwd sum_partials");
}

template <typename T>
int bwd_impl(const char *who, const dg_dr_shape *s, const T *q, const T *k, const T *v, const float *g, const T *beta,
             const float *h0, const T *dout, const float *dhT, T *dq, T *dk, T *dv, float *dg, T *dbeta, float *dh0) {
    if (validate(who, s, q, k, v, g, beta)) return -1;
    if (dg && !g) {
        dg_error("%s: dg is given but there is no gate", who);
        return -1;
    }
    if (dg_cuda_init()) return -1;
    DrPlan p;
    if (plan(who, s, true, &p)) return -1;
    if (p.nblocks == 0) return 0;
    const DrGeom &G = p.G;
    const int64_t tokens = p.tokens, pr = tokens * G.HV * G.NVT; /* partial rows */
    const int64_t slot_floats = (int64_t)G.NT * KT;
    DrPartials P = {nullptr, nullptr, nullptr, nullptr};
    float4 *ckpt = nullptr, *stretch = nullptr;
    int rc = -1;
    const size_t smem = sizeof(float) * 2 * (G.NT / 32) * (3 * G.KS * KT + 2);
    const bool gchan = s->gate == DG_GATE_CHANNEL;
    if (dq && !(P.dq = dg_cuda_scratch<float>(pr * G.K))) goto done;
    if (dk && !(P.dk = dg_cuda_scratch<float>(pr * G.K))) goto done;
    if (dg && !(P.dg = dg_cuda_scratch<float>(gchan ? pr * G.K : pr))) goto done;
    if (dbeta && !(P.dbeta = dg_cuda_scratch<float>(pr))) goto done;
    if (!(ckpt = dg_cuda_scratch<float4>((p.nslots * G.HV * G.NVT * slot_floats) / 4))) goto done;
    if (!(stretch = dg_cuda_scratch<float4>((p.nblocks * G.C * slot_floats) / 4))) goto done;
    switch (s->gate) {
    case DG_GATE_NONE:
        rc = launch_bwd<T, DG_GATE_NONE>(p, smem, q, k, v, g, beta, h0, dout, dhT, dv, dh0, P, ckpt, stretch);
        break;
    case DG_GATE_HEAD:
        rc = launch_bwd<T, DG_GATE_HEAD>(p, smem, q, k, v, g, beta, h0, dout, dhT, dv, dh0, P, ckpt, stretch);
        break;
    default:
        rc = launch_bwd<T, DG_GATE_CHANNEL>(p, smem, q, k, v, g, beta, h0, dout, dhT, dv, dh0, P, ckpt, stretch);
        break;
    }
    /* dq, dk [tokens, H, K] sum the G value heads of each group and the V tiles; dg, dbeta sum
     * the V tiles */
    if (rc == 0 && dq) rc = sum_partials<T>(tokens, G.H, G.G, G.NVT, G.K, P.dq, dq);
    if (rc == 0 && dk) rc = sum_partials<T>(tokens, G.H, G.G, G.NVT, G.K, P.dk, dk);
    if (rc == 0 && dg) rc = sum_partials<float>(tokens, G.HV, 1, G.NVT, gchan ? G.K : 1, P.dg, dg);
    if (rc == 0 && dbeta) rc = sum_partials<T>(tokens, G.HV, 1, G.NVT, 1, P.dbeta, dbeta);
done:
    dg_cuda_free(P.dq);
    dg_cuda_free(P.dk);
    dg_cuda_free(P.dg);
    dg_cuda_free(P.dbeta);
    dg_cuda_free(ckpt);
    dg_cuda_free(stretch);
    dg_cuda_free(p.seq_dev);
    return rc;
}

/* The 16-bit storage entry points: the caller's uint16_t bits read as H = __nv_bfloat16 (bf16) or
 * __half (IEEE fp16); ld / st convert them to and from f32. */
template <typename H>
int fwd_bits(const char *who, const dg_dr_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
             const float *g, const uint16_t *beta, const float *h0, uint16_t *o, float *hT) {
    typedef const H *P;
    return fwd_impl<H>(who, s, (P)q, (P)k, (P)v, g, (P)beta, h0, (H *)o, hT);
}

template <typename H>
int bwd_bits(const char *who, const dg_dr_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
             const float *g, const uint16_t *beta, const float *h0, const uint16_t *dout, const float *dhT,
             uint16_t *dq, uint16_t *dk, uint16_t *dv, float *dg, uint16_t *dbeta, float *dh0) {
    typedef const H *P;
    return bwd_impl<H>(who, s, (P)q, (P)k, (P)v, g, (P)beta, h0, (P)dout, dhT, (H *)dq, (H *)dk, (H *)dv, dg,
                       (H *)dbeta, dh0);
}

} // namespace

extern "C" {

int dg_cuda_dr_recurrent_fwd_f32(const dg_dr_shape *s, const float *q, const float *k, const float *v, const float *g,
                                 const float *beta, const float *h0, float *o, float *hT) {
    return fwd_impl<float>("cuda dr_recurrent_fwd_f32", s, q, k, v, g, beta, h0, o, hT);
}

int dg_cuda_dr_recurrent_bwd_f32(const dg_dr_shape *s, const float *q, const float *k, const float *v, const float *g,
                                 const float *beta, const float *h0, const float *dout, const float *dhT, float *dq,
                                 float *dk, float *dv, float *dg, float *dbeta, float *dh0) {
    return bwd_impl<float>("cuda dr_recurrent_bwd_f32", s, q, k, v, g, beta, h0, dout, dhT, dq, dk, dv, dg, dbeta, dh0);
}

int dg_cuda_dr_recurrent_fwd_bf16(const dg_dr_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                  const float *g, const uint16_t *beta, const float *h0, uint16_t *o, float *hT) {
    return fwd_bits<__nv_bfloat16>("cuda dr_recurrent_fwd_bf16", s, q, k, v, g, beta, h0, o, hT);
}

int dg_cuda_dr_recurrent_bwd_bf16(const dg_dr_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                  const float *g, const uint16_t *beta, const float *h0, const uint16_t *dout,
                                  const float *dhT, uint16_t *dq, uint16_t *dk, uint16_t *dv, float *dg,
                                  uint16_t *dbeta, float *dh0) {
    return bwd_bits<__nv_bfloat16>("cuda dr_recurrent_bwd_bf16", s, q, k, v, g, beta, h0, dout, dhT, dq, dk, dv, dg,
                                   dbeta, dh0);
}

int dg_cuda_dr_recurrent_fwd_f16(const dg_dr_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                 const float *g, const uint16_t *beta, const float *h0, uint16_t *o, float *hT) {
    return fwd_bits<__half>("cuda dr_recurrent_fwd_f16", s, q, k, v, g, beta, h0, o, hT);
}

int dg_cuda_dr_recurrent_bwd_f16(const dg_dr_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                 const float *g, const uint16_t *beta, const float *h0, const uint16_t *dout,
                                 const float *dhT, uint16_t *dq, uint16_t *dk, uint16_t *dv, float *dg, uint16_t *dbeta,
                                 float *dh0) {
    return bwd_bits<__half>("cuda dr_recurrent_bwd_f16", s, q, k, v, g, beta, h0, dout, dhT, dq, dk, dv, dg, dbeta,
                            dh0);
}

} // extern "C"
