/* Entry points of the chunked delta-rule CUDA kernels (dr_chunk_cuda.h): argument checks, the
 * chunk plan, and the choice between the generic kernels (dr_chunk_generic.cu) and the tensor-core
 * kernels (dr_chunk_mma_fwd.cu / _bwd.cu for gate none or head, dr_chunk_kda_mma_fwd.cu / _bwd.cu for
 * per-channel gates). */
#include "kernels/cuda/delta/dr_chunk_internal.cuh"
#include "kernels/cuda/delta/dr_chunk_kda.cuh"
#include "kernels/cuda/delta/dr_chunk_l2norm.cuh"
#ifndef DRC_EMU
#include "kernels/cuda/delta/dr_pieces_cuda.h"
#endif

namespace drc {

static int g_force_generic = 0;
static int g_l2_fuse = 1; /* the L2 norm in the tensor-core forward (dg_cuda_dr_chunk_l2_fuse) */

/* the tensor-core kernels load q, k, v, dout as 16-byte vectors and store o, dv in pairs */
static bool aligned(const void *p, uintptr_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

int plan_init(const char *who, const dg_dr_shape *s, const void *q, const void *k, const void *v,
              const void *g, const void *beta, Plan *p, bool shape_only) {
    memset(p, 0, sizeof *p);
    if (!s) {
        dg_error("%s: shape is NULL", who);
        return -1;
    }
    if (s->B < 1 || s->T < 0 || s->H < 1 || s->HV < 1 || s->K < 1 || s->V < 1) {
        dg_error("%s: B = %lld, T = %lld, H = %lld, HV = %lld, K = %lld, V = %lld (need T >= 0, "
                 "the others >= 1)", who, (long long)s->B, (long long)s->T, (long long)s->H,
                 (long long)s->HV, (long long)s->K, (long long)s->V);
        return -1;
    }
    if (s->HV % s->H) {
        dg_error("%s: HV = %lld value heads is not a multiple of H = %lld", who, (long long)s->HV,
                 (long long)s->H);
        return -1;
    }
    if (s->K > 256 || s->V > (1 << 20) || s->HV > (1 << 20)) {
        dg_error("%s: K = %lld (this kernel supports K <= 256; V, HV <= 2^20)", who,
                 (long long)s->K);
        return -1;
    }
    if (s->chunk != 16 && s->chunk != 32 && s->chunk != 64) {
        dg_error("%s: chunk is %d but must be 16, 32 or 64", who, s->chunk);
        return -1;
    }
    if (s->gate != DG_GATE_NONE && s->gate != DG_GATE_HEAD && s->gate != DG_GATE_CHANNEL) {
        dg_error("%s: unknown gate kind %d", who, (int)s->gate);
        return -1;
    }
    if (!shape_only && (!q || !k || !v || !beta)) {
        dg_error("%s: %s is NULL", who, !q ? "q" : !k ? "k" : !v ? "v" : "beta");
        return -1;
    }
    if (!shape_only && (s->gate == DG_GATE_NONE) != (g == nullptr)) {
        dg_error("%s: g is %s but the gate kind is %d", who, g ? "given" : "NULL", (int)s->gate);
        return -1;
    }
    const int64_t C = s->chunk;
    int64_t N = s->B;
    if (s->cu_seqlens) {
        N = s->N;
        const int64_t *cu = s->cu_seqlens;
        if (s->B != 1) {
            dg_error("%s: cu_seqlens given with B = %lld (must be 1)", who, (long long)s->B);
            return -1;
        }
        if (N < 1) {
            dg_error("%s: cu_seqlens given with N = %lld sequences (need >= 1)", who, (long long)N);
            return -1;
        }
        if (cu[0] != 0 || cu[N] != s->T) {
            dg_error("%s: cu_seqlens runs from %lld to %lld but must run from 0 to T = %lld", who,
                     (long long)cu[0], (long long)cu[N], (long long)s->T);
            return -1;
        }
        for (int64_t n = 0; n < N; n++)
            if (cu[n + 1] < cu[n]) {
                dg_error("%s: cu_seqlens decreases at %lld (%lld > %lld)", who, (long long)n,
                         (long long)cu[n], (long long)cu[n + 1]);
                return -1;
            }
    } else if (s->N != s->B && s->N != 0) {
        dg_error("%s: N = %lld but B = %lld without cu_seqlens (N must equal B)", who,
                 (long long)s->N, (long long)s->B);
        return -1;
    }
#ifndef DRC_EMU
    if (dg_cuda_init()) return -1; /* after the argument checks: those work without a GPU */
#endif
    Geom &G = p->G;
    G.T = s->T;
    G.N = N;
    G.rows = s->B * s->T;
    G.H = (int)s->H, G.HV = (int)s->HV, G.grp = (int)(s->HV / s->H);
    G.K = (int)s->K, G.V = (int)s->V, G.C = (int)C;
    G.gate = (int)s->gate;
    G.gs = s->gate == DG_GATE_NONE ? 0 : s->gate == DG_GATE_HEAD ? 1 : G.K;
    G.scale = (float)s->scale;
    G.cps = (int)((s->T + C - 1) / C);
    G.tab = nullptr;
    if (!s->cu_seqlens) {
        G.nchunks = N * G.cps;
        return 0;
    }
    const int64_t *cu = s->cu_seqlens;
    int64_t nch = 0;
    for (int64_t n = 0; n < N; n++) nch += (cu[n + 1] - cu[n] + C - 1) / C;
    G.nchunks = nch;
    if (shape_only) return 0;
    int64_t ntab = 2 * nch + N + 1;
    int64_t *tab = (int64_t *)malloc(sizeof(int64_t) * (size_t)ntab);
    if (!tab) {
        dg_error("%s: out of host memory for the chunk table", who);
        return -1;
    }
    int64_t c = 0;
    for (int64_t n = 0; n < N; n++) {
        tab[2 * nch + n] = c;
        for (int64_t r0 = cu[n]; r0 < cu[n + 1]; r0 += C, c++) {
            tab[c] = r0;
            tab[nch + c] = cu[n + 1] - r0 < C ? cu[n + 1] - r0 : C;
        }
    }
    tab[2 * nch + N] = c;
    p->tab_dev = scratch<int64_t>((size_t)ntab);
    int rc = p->tab_dev ? upload(p->tab_dev, tab, sizeof(int64_t) * (size_t)ntab) : -1;
    free(tab);
    if (rc) {
        release(p->tab_dev);
        p->tab_dev = nullptr;
        return -1;
    }
    G.tab = p->tab_dev;
    return 0;
}

int l2norm_bwd_after(const Geom &G, bool f16, const Io<uint16_t> &io) {
    const int64_t n = G.rows * G.H, D = G.K;
    for (int w = 0; w < 2; w++) {
        const float *r = w ? io.rk : io.rq;
        const uint16_t *xn = w ? io.k : io.q;
        uint16_t *d = w ? io.dk : io.dq;
        if (!r || !d) continue;
#ifdef DRC_EMU
        auto ld = [f16](uint16_t h) { return f16 ? h2f(h) : bf2f(h); };
        for (int64_t i = 0; i < n; i++) {
            const uint16_t *x = xn + i * D;
            uint16_t *y = d + i * D;
            float dot = 0.0f;
            for (int64_t c = 0; c < D; c++) dot += ld(y[c]) * ld(x[c]);
            for (int64_t c = 0; c < D; c++) {
                const float v = r[i] * (ld(y[c]) - ld(x[c]) * dot);
                y[c] = f16 ? f2h(v) : f2bf(v);
            }
        }
#else
        if (dg_cuda_dr_l2norm16_bwd_xn(f16, n, D, xn, r, d, d)) return -1;
#endif
    }
    return 0;
}

void plan_free(Plan *p) {
    release(p->tab_dev);
    p->tab_dev = nullptr;
}

/* ---- value heads wider than the tensor-core kernels take (dr_chunk_vsplit.cu) ---- */

/* Whether a 16-bit shape (f16: fp16 words) takes a tensor-core path as it is */
static bool mma_shape(const Geom &G, bool f16) {
    return G.gate == DG_GATE_CHANNEL ? !f16 && kda_ok(G) : fast_ok(G);
}

/* The geometry of R heads of V / R columns for each value head */
static Geom vsplit_geom(Geom G, int R) {
    G.HV *= R, G.V /= R, G.grp = G.HV / G.H;
    return G;
}

/* R > 1 where a head of V columns runs on the tensor-core kernels as R heads of Vs = 128 (else 64)
 * columns (V = 256, 384, 512, 192 ...: any multiple of 64 but 64 and 128), 1 where the shape runs
 * as it is (a tensor-core shape already, the generic kernels forced, or no split makes it one) */
static int vsplit_ways(const Geom &G, bool f16) {
    if (g_force_generic || mma_shape(G, f16)) return 1;
    for (int Vs = 128; Vs >= 64; Vs -= 64) {
        const int R = G.V / Vs;
        if (G.V % Vs == 0 && R > 1 && (int64_t)G.HV * R <= (1 << 20) && mma_shape(vsplit_geom(G, R), f16)) return R;
    }
    return 1;
}

static dg_dr_shape vsplit_shape(const dg_dr_shape *s, int R) {
    dg_dr_shape s2 = *s;
    s2.HV *= R, s2.V /= R;
    return s2;
}

static const char *const VS_WHO = "dr_chunk vsplit";

/* The forward's L2 norm of q, k (dg_cuda_dr_chunk_fwd_l2_*): q, k raw; the normalised rows to q
 * (may be NULL) and k, their 1/|x| to rq, rk (may be NULL) */
template <typename T> struct L2Req {
    T *q, *k;
    float *rq, *rk;
    float eps;
};
template <typename T>
static int fwd(const char *who, const dg_dr_shape *s, const T *q, const T *k, const T *v, const float *g,
               const T *beta, const float *h0, T *o, float *hT, void *keep = nullptr, int *kept = nullptr,
               const L2Req<T> *l2 = nullptr);
template <typename T>
static int bwd(const char *who, const dg_dr_shape *s, const dg_dr_variant *var, const T *q, const T *k, const T *v,
               const float *g, const T *beta, const float *h0, const T *dout, const float *dhT, T *dq, T *dk, T *dv,
               float *dg, T *dbeta, float *dh0, const void *kept = nullptr, const float *rq = nullptr,
               const float *rk = nullptr, float *dbeta32 = nullptr);

/* The inputs both directions take to the R heads: beta and g repeated, h0 to the split layout
 * (each NULL where the call has none); make returns 0, or -1 with dg_error set */
template <typename T> struct VsplitIn {
    T *beta = nullptr;
    float *g = nullptr, *h0 = nullptr;
    int make(const Geom &G, int R, const T *beta_, const float *g_, const float *h0_) {
        const int64_t per_head = G.rows * G.HV, NH = G.N * G.HV;
        beta = scratch<T>((size_t)(per_head * R));
        g = g_ ? scratch<float>((size_t)(per_head * R * G.gs)) : nullptr;
        h0 = h0_ ? scratch<float>((size_t)(NH * G.K * G.V)) : nullptr;
        if (!beta || (g_ && !g) || (h0_ && !h0)) return -1;
        int rc = vsplit_repeat(VS_WHO, per_head, R, 1, 2, beta_, beta);
        if (!rc && g_) rc = vsplit_repeat(VS_WHO, per_head, R, G.gs, 4, g_, g);
        if (!rc && h0_) rc = vsplit_states(VS_WHO, true, NH, G.K, R, G.V / R, h0_, h0);
        return rc;
    }
    ~VsplitIn() { release(beta), release(g), release(h0); }
};

/* The forward of a shape with vsplit_ways R > 1 (G its geometry): beta, g and h0 to the R heads,
 * the forward of the split shape (o is already in its layout), hT back */
template <typename T>
static int fwd_vsplit(const char *who, const dg_dr_shape *s, const Geom &G, int R, const T *q, const T *k, const T *v,
                      const float *g, const T *beta, const float *h0, T *o, float *hT, void *keep, int *kept,
                      const L2Req<T> *l2) {
    const dg_dr_shape s2 = vsplit_shape(s, R);
    const int64_t NH = G.N * G.HV;
    VsplitIn<T> in;
    float *hT2 = hT ? scratch<float>((size_t)(NH * G.K * G.V)) : nullptr;
    int rc = hT && !hT2 ? -1 : in.make(G, R, beta, g, h0);
    if (!rc) rc = fwd<T>(who, &s2, q, k, v, in.g, in.beta, in.h0, o, hT2, keep, kept, l2); /* (q, k: key heads, as they are) */
    if (!rc && hT) rc = vsplit_states(VS_WHO, false, NH, G.K, R, G.V / R, hT2, hT);
    release(hT2);
    return rc;
}

/* The backward likewise: beta, g, h0, dhT to the R heads; dbeta (taken in f32 from the kernels,
 * Io::dbeta32) and dg summed over them, dh0 back (dq, dk: the split shape's kernels sum over the
 * value heads of a key head; dv is in its layout).  dbeta summed from the heads' 16-bit words,
 * rounded twice, was 8.3e-3 from f64 in the worst of 40 T = 1 draws (test_dr_chunk_bf16_draws). */
template <typename T>
static int bwd_vsplit(const char *who, const dg_dr_shape *s, const Geom &G, int R, const dg_dr_variant *var,
                      const T *q, const T *k, const T *v, const float *g, const T *beta, const float *h0,
                      const T *dout, const float *dhT, T *dq, T *dk, T *dv, float *dg, T *dbeta, float *dh0,
                      const void *kept, const float *rq, const float *rk) {
    const dg_dr_shape s2 = vsplit_shape(s, R);
    const int64_t per_head = G.rows * G.HV, NH = G.N * G.HV, nst = NH * G.K * G.V;
    const int Vs = G.V / R;
    const int fmt = is_bf16<T>::value ? VS_BF16 : VS_F16;
    VsplitIn<T> in;
    float *dbeta2 = dbeta ? scratch<float>((size_t)(per_head * R)) : nullptr; /* (f32: summed, then rounded once) */
    float *dg2 = dg ? scratch<float>((size_t)(per_head * R * G.gs)) : nullptr;
    float *dhT2 = dhT ? scratch<float>((size_t)nst) : nullptr, *dh02 = dh0 ? scratch<float>((size_t)nst) : nullptr;
    int rc = (dbeta && !dbeta2) || (dg && !dg2) || (dhT && !dhT2) || (dh0 && !dh02) ? -1 : in.make(G, R, beta, g, h0);
    if (!rc && dhT) rc = vsplit_states(VS_WHO, true, NH, G.K, R, Vs, dhT, dhT2);
    if (!rc)
        rc = bwd<T>(who, &s2, var, q, k, v, in.g, in.beta, in.h0, dout, dhT2, dq, dk, dv, dg2, nullptr, dh02, kept, rq,
                    rk, dbeta2);
    if (!rc && dbeta) rc = heads_sum(VS_WHO, per_head, 1, R, 1, dbeta2, nullptr, nullptr, fmt, dbeta);
    if (!rc && dg) rc = heads_sum(VS_WHO, per_head, 1, R, G.gs, dg2, nullptr, nullptr, VS_F32, dg);
    if (!rc && dh0) rc = vsplit_states(VS_WHO, false, NH, G.K, R, Vs, dh02, dh0);
    release(dbeta2), release(dg2), release(dhT2), release(dh02);
    return rc;
}

#ifdef DRC_EMU
/* The host emulation has no dr_pieces.cu: the norm's rows there go through l2norm_row, which makes
 * the bits of the norm's kernel (dr_l2norm_row.cuh) */
template <int K, bool F16>
__global__ void l2norm_rows_emu(int64_t n, const uint16_t *x, float eps, uint16_t *y, float *r) {
    const int64_t row = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (row < n) l2norm_row<K, F16>(x + row * K, nullptr, y + row * K, r ? r + row : nullptr, eps);
}
#endif

/* y = the rows of x normalised, r their 1/|x| (may be NULL): the norm's own kernel */
template <typename T> static int l2norm_rows(const Geom &G, const T *x, float eps, T *y, float *r) {
    constexpr bool f16 = !is_bf16<T>::value;
    const int64_t n = G.rows * G.H;
    const uint16_t *xb = (const uint16_t *)x;
    uint16_t *yb = (uint16_t *)y;
#ifdef DRC_EMU
    if (G.K != 64 && G.K != 128) {
        dg_error("dr_chunk l2norm (emulation): K = %d (64 or 128 only)", G.K);
        return -1;
    }
    const int64_t nb = (n + 7) / 8;
    return G.K == 64 ? DRC_LAUNCH("dr_chunk l2norm", (l2norm_rows_emu<64, f16>), nb, 256, 0, n, xb, eps, yb, r)
                     : DRC_LAUNCH("dr_chunk l2norm", (l2norm_rows_emu<128, f16>), nb, 256, 0, n, xb, eps, yb, r);
#else
    return f16 ? dg_cuda_dr_l2norm_f16_fwd(n, G.K, xb, eps, yb, r) : dg_cuda_dr_l2norm_bf16_fwd(n, G.K, xb, eps, yb, r);
#endif
}

/* The forward with the L2 norm where the tensor-core kernels (gate NONE / HEAD) take it in their
 * loads; elsewhere (KDA, the generic kernels, g_l2_fuse off) the norm's kernel first, then the
 * forward of the normalised rows.  Both give the same bits (dr_chunk_l2norm.cuh). */
template <typename T>
static int fwd_l2_first(const char *who, const dg_dr_shape *s, const Plan &p, const T *q, const T *k, const T *v,
                        const float *g, const T *beta, const float *h0, T *o, float *hT, void *keep, int *kept,
                        const L2Req<T> &l2) {
    T *qn = l2.q ? l2.q : scratch<T>((size_t)(p.G.rows * p.G.H * p.G.K));
    int rc = qn ? l2norm_rows<T>(p.G, q, l2.eps, qn, l2.rq) : -1;
    if (!rc) rc = l2norm_rows<T>(p.G, k, l2.eps, l2.k, l2.rk);
    if (!rc) rc = fwd<T>(who, s, qn, l2.k, v, g, beta, h0, o, hT, keep, kept);
    if (!l2.q) release(qn);
    return rc;
}

/* T: float (the generic kernels), uint16_t (bf16 bits) or f16bits (fp16 bits): the tensor-core
 * paths where the shape and alignment allow (fp16: gate NONE or HEAD only, fast_h).
 * keep (16-bit storage only; may be NULL): device memory of kept_bytes(s) bytes for the working set, *kept
 * set to whether it was filled (the tensor-core paths fill it, the generic path keeps nothing);
 * l2 (16-bit only; may be NULL): q, k are raw rows, normalised here (L2Req) */
template <typename T>
static int fwd(const char *who, const dg_dr_shape *s, const T *q, const T *k, const T *v,
               const float *g, const T *beta, const float *h0, T *o, float *hT, void *keep,
               int *kept, const L2Req<T> *l2) {
    if (kept) *kept = 0;
    Plan p;
    if (s && q && k && v && beta && !o) { /* (plan_init names the other NULL pointers first) */
        dg_error("%s: o is NULL", who);
        return -1;
    }
    if (plan_init(who, s, q, k, v, g, beta, &p)) return -1;
    if (const int R = sizeof(T) == 2 ? vsplit_ways(p.G, !is_bf16<T>::value) : 1; R > 1) {
        const int rc = fwd_vsplit<T>(who, s, p.G, R, q, k, v, g, beta, h0, o, hT, keep, kept, l2);
        plan_free(&p);
        return rc;
    }
    Io<T> io;
    memset(&io, 0, sizeof io);
    io.q = q, io.k = k, io.v = v, io.g = g, io.beta = beta, io.h0 = h0, io.o = o, io.hT = hT;
    int rc;
    const bool al = aligned(q, 16) && aligned(k, 16) && aligned(v, 16) && aligned(o, 4);
    if constexpr (sizeof(T) == 2) {
        constexpr bool f16 = !is_bf16<T>::value; /* fp16: the head-gate kernels' fp16 build; KDA generic */
        const bool fast = !g_force_generic && fast_ok(p.G) && al;
        const bool kda = !f16 && !g_force_generic && kda_ok(p.G) && al; /* per-channel gate: dr_chunk_kda*.cu */
        if (l2 && !(fast && g_l2_fuse && aligned(l2->k, 16) && aligned(l2->q, 16))) {
            rc = fwd_l2_first<T>(who, s, p, q, k, v, g, beta, h0, o, hT, keep, kept, *l2);
            plan_free(&p);
            return rc;
        }
        if (l2) io.l2q = l2->q, io.l2k = l2->k, io.l2rq = l2->rq, io.l2rk = l2->rk, io.l2eps = l2->eps;
        rc = kda    ? kda_fwd(p, io_bits(io), keep)
             : fast ? (f16 ? fast_h::fwd(p, io_bits(io), keep) : fast::fwd(p, io_bits(io), keep))
                    : generic_fwd<T>(p, io);
        if (!rc && kept) *kept = keep && (kda || fast);
    } else {
        rc = generic_fwd<T>(p, io);
    }
    plan_free(&p);
    return rc;
}

template <typename T>
static int bwd(const char *who, const dg_dr_shape *s, const dg_dr_variant *var, const T *q,
               const T *k, const T *v, const float *g, const T *beta, const float *h0,
               const T *dout, const float *dhT, T *dq, T *dk, T *dv, float *dg, T *dbeta,
               float *dh0, const void *kept, const float *rq, const float *rk, float *dbeta32) {
    Plan p;
    if (dg && !g) {
        dg_error("%s: dg given but g is NULL", who);
        return -1;
    }
    if (s && q && k && v && beta && !dout) {
        dg_error("%s: dout is NULL", who);
        return -1;
    }
    if (plan_init(who, s, q, k, v, g, beta, &p)) return -1;
    if (const int R = sizeof(T) == 2 ? vsplit_ways(p.G, !is_bf16<T>::value) : 1; R > 1) {
        const int rc = bwd_vsplit<T>(who, s, p.G, R, var, q, k, v, g, beta, h0, dout, dhT, dq, dk, dv, dg, dbeta,
                                     dh0, kept, rq, rk);
        plan_free(&p);
        return rc;
    }
    dg_dr_variant dv0 = {1, 1, 1};
    if (!var) var = &dv0;
    Io<T> io;
    memset(&io, 0, sizeof io);
    io.q = q, io.k = k, io.v = v, io.g = g, io.beta = beta, io.h0 = h0, io.dout = dout;
    io.dhT = dhT, io.dq = dq, io.dk = dk, io.dv = dv, io.dg = dg, io.dbeta = dbeta, io.dh0 = dh0;
    io.rq = rq, io.rk = rk, io.dbeta32 = dbeta32;
    int rc;
    const bool al = aligned(q, 16) && aligned(k, 16) && aligned(v, 16) && aligned(dout, 16) && aligned(dv, 4);
    if constexpr (sizeof(T) == 2) {
        constexpr bool f16 = !is_bf16<T>::value;
        const bool fast = !g_force_generic && fast_ok(p.G) && al;
        const bool kda = !f16 && !g_force_generic && kda_ok(p.G) && al;
        rc = kda    ? kda_bwd(p, *var, io_bits(io), kept)
             : fast ? (f16 ? fast_h::bwd(p, *var, io_bits(io), kept) : fast::bwd(p, *var, io_bits(io), kept))
                    : generic_bwd<T>(p, *var, io);
        /* (the L2 norm's backward, io.rq / io.rk: each path applies it, dr_chunk_heads.cu) */
    } else {
        rc = generic_bwd<T>(p, *var, io);
    }
    plan_free(&p);
    return rc;
}

} // namespace drc

extern "C" {

int dg_cuda_dr_chunk_fwd_f32(const dg_dr_shape *s, const float *q, const float *k, const float *v,
                             const float *g, const float *beta, const float *h0, float *o,
                             float *hT) {
    return drc::fwd<float>("cuda dr_chunk_fwd_f32", s, q, k, v, g, beta, h0, o, hT);
}

int dg_cuda_dr_chunk_bwd_f32(const dg_dr_shape *s, const dg_dr_variant *var, const float *q,
                             const float *k, const float *v, const float *g, const float *beta,
                             const float *h0, const float *dout, const float *dhT, float *dq,
                             float *dk, float *dv, float *dg, float *dbeta, float *dh0) {
    return drc::bwd<float>("cuda dr_chunk_bwd_f32", s, var, q, k, v, g, beta, h0, dout, dhT, dq,
                           dk, dv, dg, dbeta, dh0);
}

int dg_cuda_dr_chunk_fwd_bf16(const dg_dr_shape *s, const uint16_t *q, const uint16_t *k,
                              const uint16_t *v, const float *g, const uint16_t *beta,
                              const float *h0, uint16_t *o, float *hT) {
    return drc::fwd<uint16_t>("cuda dr_chunk_fwd_bf16", s, q, k, v, g, beta, h0, o, hT);
}

int dg_cuda_dr_chunk_bwd_bf16(const dg_dr_shape *s, const dg_dr_variant *var, const uint16_t *q,
                              const uint16_t *k, const uint16_t *v, const float *g,
                              const uint16_t *beta, const float *h0, const uint16_t *dout,
                              const float *dhT, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                              float *dg, uint16_t *dbeta, float *dh0) {
    return drc::bwd<uint16_t>("cuda dr_chunk_bwd_bf16", s, var, q, k, v, g, beta, h0, dout, dhT,
                              dq, dk, dv, dg, dbeta, dh0);
}

/* fp16: the same kernels instantiated for f16bits (the generic path, f32 arithmetic) */
int dg_cuda_dr_chunk_fwd_f16(const dg_dr_shape *s, const uint16_t *q, const uint16_t *k,
                             const uint16_t *v, const float *g, const uint16_t *beta,
                             const float *h0, uint16_t *o, float *hT) {
    typedef const drc::f16bits *P;
    return drc::fwd<drc::f16bits>("cuda dr_chunk_fwd_f16", s, (P)q, (P)k, (P)v, g, (P)beta, h0,
                                  (drc::f16bits *)o, hT);
}

int dg_cuda_dr_chunk_bwd_f16(const dg_dr_shape *s, const dg_dr_variant *var, const uint16_t *q,
                             const uint16_t *k, const uint16_t *v, const float *g,
                             const uint16_t *beta, const float *h0, const uint16_t *dout,
                             const float *dhT, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                             float *dg, uint16_t *dbeta, float *dh0) {
    typedef const drc::f16bits *P;
    typedef drc::f16bits *W;
    return drc::bwd<drc::f16bits>("cuda dr_chunk_bwd_f16", s, var, (P)q, (P)k, (P)v, g, (P)beta, h0,
                                  (P)dout, dhT, (W)dq, (W)dk, (W)dv, dg, (W)dbeta, dh0);
}

/* f16 = the fp16 calls' (no KDA tensor-core path) */
static int64_t kept_bytes(const char *who, const dg_dr_shape *s, bool f16) {
    drc::Plan p; /* the shape alone decides (the pointers are checked by the calls themselves) */
    if (drc::plan_init(who, s, nullptr, nullptr, nullptr, nullptr, nullptr, &p, true)) return -1;
    size_t n = 0;
    const drc::Geom G = drc::vsplit_geom(p.G, drc::vsplit_ways(p.G, f16)); /* (the shape the kernels run) */
    if (!drc::g_force_generic)
        n = !f16 && drc::kda_ok(G) ? drc::kda_kept_bytes(G) : drc::fast_ok(G) ? drc::fast_kept_bytes(G) : 0;
    drc::plan_free(&p);
    return (int64_t)n;
}

int64_t dg_cuda_dr_chunk_kept_bytes(const dg_dr_shape *s) {
    return kept_bytes("cuda dr_chunk_kept_bytes", s, false);
}

int64_t dg_cuda_dr_chunk_kept_bytes_f16(const dg_dr_shape *s) {
    return kept_bytes("cuda dr_chunk_kept_bytes_f16", s, true);
}

/* keep must be given and 16-byte aligned (the kernels load and store its buffers as 16-byte vectors) */
static bool keep_ok(const char *who, const void *keep, const int *kept) {
    if (!keep || !kept) {
        dg_error("%s: %s is NULL", who, !keep ? "keep" : "kept");
        return false;
    }
    if (((uintptr_t)keep & 15) != 0) {
        dg_error("%s: keep %p is not 16-byte aligned", who, keep);
        return false;
    }
    return true;
}

int dg_cuda_dr_chunk_fwd_bf16_keep(const dg_dr_shape *s, const uint16_t *q, const uint16_t *k,
                                   const uint16_t *v, const float *g, const uint16_t *beta,
                                   const float *h0, uint16_t *o, float *hT, void *keep, int *kept) {
    const char *who = "cuda dr_chunk_fwd_bf16_keep";
    if (!keep_ok(who, keep, kept)) return -1;
    return drc::fwd<uint16_t>(who, s, q, k, v, g, beta, h0, o, hT, keep, kept);
}

int dg_cuda_dr_chunk_bwd_bf16_kept(const dg_dr_shape *s, const dg_dr_variant *var, const uint16_t *q,
                                   const uint16_t *k, const uint16_t *v, const float *g,
                                   const uint16_t *beta, const float *h0, const uint16_t *dout,
                                   const float *dhT, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                                   float *dg, uint16_t *dbeta, float *dh0, const void *kept, const float *rq,
                                   const float *rk) {
    return drc::bwd<uint16_t>("cuda dr_chunk_bwd_bf16_kept", s, var, q, k, v, g, beta, h0, dout, dhT,
                              dq, dk, dv, dg, dbeta, dh0, kept, rq, rk);
}

int dg_cuda_dr_chunk_fwd_f16_keep(const dg_dr_shape *s, const uint16_t *q, const uint16_t *k,
                                  const uint16_t *v, const float *g, const uint16_t *beta,
                                  const float *h0, uint16_t *o, float *hT, void *keep, int *kept) {
    const char *who = "cuda dr_chunk_fwd_f16_keep";
    if (!keep_ok(who, keep, kept)) return -1;
    typedef const drc::f16bits *P;
    return drc::fwd<drc::f16bits>(who, s, (P)q, (P)k, (P)v, g, (P)beta, h0, (drc::f16bits *)o, hT, keep, kept);
}

int dg_cuda_dr_chunk_bwd_f16_kept(const dg_dr_shape *s, const dg_dr_variant *var, const uint16_t *q,
                                  const uint16_t *k, const uint16_t *v, const float *g,
                                  const uint16_t *beta, const float *h0, const uint16_t *dout,
                                  const float *dhT, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                                  float *dg, uint16_t *dbeta, float *dh0, const void *kept, const float *rq,
                                  const float *rk) {
    typedef const drc::f16bits *P;
    typedef drc::f16bits *W;
    return drc::bwd<drc::f16bits>("cuda dr_chunk_bwd_f16_kept", s, var, (P)q, (P)k, (P)v, g, (P)beta, h0,
                                  (P)dout, dhT, (W)dq, (W)dk, (W)dv, dg, (W)dbeta, dh0, kept, rq, rk);
}

int dg_cuda_dr_chunk_force_generic(int on) {
    int old = drc::g_force_generic;
    drc::g_force_generic = on ? 1 : 0;
    return old;
}

int dg_cuda_dr_chunk_l2_fuse(int on) {
    int old = drc::g_l2_fuse;
    drc::g_l2_fuse = on ? 1 : 0;
    return old;
}

} // extern "C"

namespace drc {
/* the checks of the _l2 entry points (keep optional), then fwd with the norm */
template <typename T>
static int fwd_l2_entry(const char *who, const dg_dr_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                        const float *g, const uint16_t *beta, const float *h0, uint16_t *o, float *hT, void *keep,
                        int *kept, double eps, uint16_t *qn, uint16_t *kn, float *rq, float *rk) {
    if (kept) *kept = 0;
    if (keep && !keep_ok(who, keep, kept)) return -1;
    if (!kn) {
        dg_error("%s: kn (the normalised k) is NULL", who);
        return -1;
    }
    if (!(eps >= 0.0) || !(eps < 1e30)) {
        dg_error("%s: eps = %g (need a finite eps >= 0)", who, eps);
        return -1;
    }
    if ((qn && (qn == q || qn == k)) || kn == q || kn == k) {
        dg_error("%s: %s overlaps q or k (the raw rows are read as the normalised ones are written)", who,
                 qn && (qn == q || qn == k) ? "qn" : "kn");
        return -1;
    }
    typedef const T *P;
    const L2Req<T> l2{(T *)qn, (T *)kn, rq, rk, (float)eps};
    return fwd<T>(who, s, (P)q, (P)k, (P)v, g, (P)beta, h0, (T *)o, hT, keep, kept, &l2);
}
} // namespace drc

extern "C" {

int dg_cuda_dr_chunk_fwd_l2_bf16(const dg_dr_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                 const float *g, const uint16_t *beta, const float *h0, uint16_t *o, float *hT,
                                 void *keep, int *kept, double eps, uint16_t *qn, uint16_t *kn, float *rq, float *rk) {
    return drc::fwd_l2_entry<uint16_t>("cuda dr_chunk_fwd_l2_bf16", s, q, k, v, g, beta, h0, o, hT, keep, kept, eps,
                                       qn, kn, rq, rk);
}

int dg_cuda_dr_chunk_fwd_l2_f16(const dg_dr_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                const float *g, const uint16_t *beta, const float *h0, uint16_t *o, float *hT,
                                void *keep, int *kept, double eps, uint16_t *qn, uint16_t *kn, float *rq, float *rk) {
    return drc::fwd_l2_entry<drc::f16bits>("cuda dr_chunk_fwd_l2_f16", s, q, k, v, g, beta, h0, o, hT, keep, kept,
                                           eps, qn, kn, rq, rk);
}

} // extern "C"
