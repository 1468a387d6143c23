/* Entry points of the chunked delta-rule CUDA kernels (dr_chunk_cuda.h): which calls each kernel
 * family accepts, argument checks, the chunk plan, the value-head split and the fused L2 norm around
 * the families' kernels: the generic ones (dr_chunk_generic_fwd.cu, dr_chunk_generic_bwd.cu), the tensor-core ones of gate none or
 * head (dr_chunk_mma_fwd.cu / _bwd.cu) and of the per-channel gate (dr_chunk_kda_mma_fwd.cu / _bwd.cu).
 * Around the tensor-core kernels, two moves give them shapes they do not take as they are: K and V
 * padded with zeros (dr_chunk_pad.cu), then a wide value head split into heads of 64 or 128 columns
 * (dr_chunk_vsplit.cu).
 * The choice between the families is not made here: the backend table (ops/delta/delta_backends.c)
 * runs the first row whose accepts() takes the call. */
#include <algorithm>

#include "kernels/cuda/delta/dr_chunk_internal.cuh"
#include "kernels/cuda/delta/dr_chunk_kda.cuh"
#include "kernels/cuda/delta/dr_chunk_l2norm.cuh"
#ifndef DRC_EMU
#include "kernels/cuda/delta/dr_pieces_cuda.h"
#endif

namespace drc {

/* the tensor-core kernels load q, k, v, dout as 16-byte vectors and store o, dv in pairs */
static bool aligned(const void *p, uintptr_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

int plan_init(const char *who, const dg_dr_shape *s, const void *q, const void *k, const void *v, const void *g,
              const void *beta, Plan *p, bool shape_only) {
    memset(p, 0, sizeof *p);
    if (!s) {
        dg_error("%s: shape is NULL", who);
        return -1;
    }
    if (s->B < 1 || s->T < 0 || s->H < 1 || s->HV < 1 || s->K < 1 || s->V < 1) {
        dg_error("%s: B = %lld, T = %lld, H = %lld, HV = %lld, K = %lld, V = %lld (need T >= 0, "
                 "the others >= 1)",
                 who, (long long)s->B, (long long)s->T, (long long)s->H, (long long)s->HV, (long long)s->K,
                 (long long)s->V);
        return -1;
    }
    if (s->HV % s->H) {
        dg_error("%s: HV = %lld value heads is not a multiple of H = %lld", who, (long long)s->HV, (long long)s->H);
        return -1;
    }
    if (s->K > 256 || s->V > (1 << 20) || s->HV > (1 << 20)) {
        dg_error("%s: K = %lld (this kernel supports K <= 256; V, HV <= 2^20)", who, (long long)s->K);
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
            dg_error("%s: cu_seqlens runs from %lld to %lld but must run from 0 to T = %lld", who, (long long)cu[0],
                     (long long)cu[N], (long long)s->T);
            return -1;
        }
        for (int64_t n = 0; n < N; n++)
            if (cu[n + 1] < cu[n]) {
                dg_error("%s: cu_seqlens decreases at %lld (%lld > %lld)", who, (long long)n, (long long)cu[n],
                         (long long)cu[n + 1]);
                return -1;
            }
    } else if (s->N != s->B && s->N != 0) {
        dg_error("%s: N = %lld but B = %lld without cu_seqlens (N must equal B)", who, (long long)s->N,
                 (long long)s->B);
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
    G.vsh = 1;
    G.tab = nullptr;
    if (!s->cu_seqlens) {
        G.nchunks = N * G.cps;
        G.maxc = G.cps;
        return 0;
    }
    const int64_t *cu = s->cu_seqlens;
    int64_t nch = 0, maxc = 0;
    for (int64_t n = 0; n < N; n++) {
        const int64_t c = (cu[n + 1] - cu[n] + C - 1) / C;
        nch += c, maxc = c > maxc ? c : maxc;
    }
    G.nchunks = nch, G.maxc = maxc;
    return 0;
}

int plan_table(const char *who, const dg_dr_shape *s, Plan *p) {
    Geom &G = p->G;
    if (!s->cu_seqlens || G.tab) return 0;
    const int64_t *cu = s->cu_seqlens, C = G.C, N = G.N, nch = G.nchunks;
    int64_t ntab = 2 * nch + 2 * N + 1;
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
    /* the state passes' chains longest first (chain_seq); equal lengths in sequence order */
    int64_t *order = tab + 2 * nch + N + 1;
    for (int64_t n = 0; n < N; n++) order[n] = n;
    const int64_t *first = tab + 2 * nch;
    std::stable_sort(order, order + N,
                     [first](int64_t a, int64_t b) { return first[a + 1] - first[a] > first[b + 1] - first[b]; });
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

void plan_free(Plan *p) {
    release(p->tab_dev);
    p->tab_dev = nullptr;
}

/* ---- the kernel families ---- */

/* Whether a 16-bit shape (bf16 or fp16 words alike) takes family fam's tensor-core kernels as it is */
static bool family_shape(dg_drc_family fam, const Geom &G) {
    if (fam == DG_DRC_KDA_MMA) return kda_ok(G);
    if (fam == DG_DRC_MMA) return fast_ok(G);
    if (fam == DG_DRC_TF32) return G.K > 128 && G.K <= 256;
    return false;
}

/* ---- value heads wider than the tensor-core kernels take (dr_chunk_vsplit.cu) ---- */

/* The geometry of R heads of V / R columns for each value head */
static Geom vsplit_geom(Geom G, int R) {
    G.HV *= R, G.V /= R, G.grp = G.HV / G.H, G.vsh = R;
    return G;
}

/* R > 1 where a head of V columns runs on the tensor-core kernels of fam as R heads of Vs = 128
 * (else 64) columns (V = 256, 384, 512, 192 ...: any multiple of 64 but 64 and 128), 1 where the
 * shape runs as it is (a tensor-core shape already, the generic kernels, or no split makes it one).
 * The families that split (head gate, KDA) take the R heads as Geom::vsh: the work that does not
 * depend on V once for them, beta and the gate read once for them (shared_row). */
static int vsplit_ways(dg_drc_family fam, const Geom &G) {
    if (fam == DG_DRC_GENERIC || fam == DG_DRC_TF32 || family_shape(fam, G)) return 1;
    for (int Vs = 128; Vs >= 64; Vs -= 64) {
        const int R = G.V / Vs;
        if (G.V % Vs == 0 && R > 1 && (int64_t)G.HV * R <= (1 << 20) && family_shape(fam, vsplit_geom(G, R))) return R;
    }
    return 1;
}

/* whether family fam's 16-bit kernels take the shape G as it is or split in value heads */
static bool family_takes(dg_drc_family fam, const Geom &G) { return family_shape(fam, G) || vsplit_ways(fam, G) > 1; }

static dg_dr_shape vsplit_shape(const dg_dr_shape *s, int R) {
    dg_dr_shape s2 = *s;
    s2.HV *= R, s2.V /= R;
    return s2;
}

static const char *const VS_WHO = "dr_chunk vsplit";

/* How one call runs: the name in messages, its shape, the kernel family the backend row chose and
 * whether the tensor-core forward may take the L2 norm in its loads */
struct Run {
    const char *who;
    const dg_dr_shape *s;
    dg_drc_family fam;
    bool l2_fuse;
    int vsh = 1; /* Geom::vsh */
};

/* The forward's L2 norm of q, k: io.q, io.k raw; the normalised rows to q (may be NULL) and k, their
 * 1/|x| to rq, rk (may be NULL) */
template <typename T> struct L2Req {
    T *q, *k;
    float *rq, *rk;
    float eps;
};
/* io: the forward's pointers (q, k, v, g, beta, h0, o, hT); keep / kept: the working set (keep may
 * be NULL, kept always given); l2 NULL, or the norm of io.q, io.k */
template <typename T>
static int fwd(const Run &r, const Io<T> &io, void *keep, bool *kept, const L2Req<T> *l2 = nullptr);
/* io: the backward's pointers (the forward's inputs, dout, dhT, the gradients; rq, rk and dbeta32
 * as Io says); kept: a kept forward's working set, or NULL */
template <typename T> static int bwd(const Run &r, const dg_dr_variant &var, const Io<T> &io, const void *kept);

/* h0 in the split layout for both directions (NULL where the call has none); make returns 0, or -1
 * with dg_error set.  beta and g go to the split shape's kernels as they are: its R heads of a head
 * read one (Geom::vsh = R, shared_row) */
struct VsplitH0 {
    float *h0 = nullptr;
    int make(const Geom &G, int R, const float *h0_) {
        const int64_t NH = G.N * G.HV;
        if (!h0_) return 0;
        h0 = scratch<float>((size_t)(NH * G.K * G.V));
        return h0 ? vsplit_states(VS_WHO, true, NH, G.K, R, G.V / R, h0_, h0) : -1;
    }
    ~VsplitH0() { release(h0); }
};

/* The forward of a shape with vsplit_ways R > 1 (G its geometry): h0 to the R heads, the forward of
 * the split shape (o is already in its layout; beta and g are read as they are), hT back */
template <typename T>
static int fwd_vsplit(const Run &r, const Geom &G, int R, const Io<T> &io, void *keep, bool *kept, const L2Req<T> *l2) {
    const dg_dr_shape s2 = vsplit_shape(r.s, R);
    const int64_t NH = G.N * G.HV;
    VsplitH0 in;
    float *hT2 = io.hT ? scratch<float>((size_t)(NH * G.K * G.V)) : nullptr;
    int rc = io.hT && !hT2 ? -1 : in.make(G, R, io.h0);
    Run r2 = r;
    r2.s = &s2, r2.vsh = R;
    Io<T> io2 = io; /* (q, k: key heads, as they are) */
    io2.h0 = in.h0, io2.hT = hT2;
    if (!rc) rc = fwd<T>(r2, io2, keep, kept, l2);
    if (!rc && io.hT) rc = vsplit_states(VS_WHO, false, NH, G.K, R, G.V / R, hT2, io.hT);
    release(hT2);
    return rc;
}

/* The backward likewise: h0, dhT to the R heads; dbeta and dg summed over them, dh0 back (dq, dk:
 * the split shape's kernels sum over the value heads of a key head; dv is in its layout).  Where
 * the fused qkwy runs (Geom::vsh = R), it sums dbeta and dg over the R heads itself and writes them
 * in the call's layout, and does the WY part once for them; else the kernels give each head's dbeta
 * in f32 (Io::dbeta32) and dg, summed here (dbeta summed from the heads' 16-bit words, rounded
 * twice, was 8.3e-3 from f64 in the worst of 40 T = 1 draws, test_dr_chunk_bf16_draws). */
template <typename T>
static int bwd_vsplit(const Run &r, const Geom &G, int R, const dg_dr_variant &var, const Io<T> &io, const void *kept) {
    const dg_dr_shape s2 = vsplit_shape(r.s, R);
    const int64_t per_head = G.rows * G.HV, NH = G.N * G.HV, nst = NH * G.K * G.V;
    const int Vs = G.V / R;
    const int fmt = is_bf16<T>::value ? VS_BF16 : VS_F16;
    Run r2 = r;
    r2.s = &s2, r2.vsh = R;
    const bool shared = qkwy_heads(r2.vsh, var) > 1; /* (the fused qkwy sums dbeta, dg) */
    const bool sum_dbeta = io.dbeta && !shared, sum_dg = io.dg && !shared;
    VsplitH0 in;
    float *dbeta2 = sum_dbeta ? scratch<float>((size_t)(per_head * R)) : nullptr; /* (f32: summed, then rounded once) */
    float *dg2 = sum_dg ? scratch<float>((size_t)(per_head * R * G.gs)) : nullptr;
    float *dhT2 = io.dhT ? scratch<float>((size_t)nst) : nullptr,
          *dh02 = io.dh0 ? scratch<float>((size_t)nst) : nullptr;
    int rc = (sum_dbeta && !dbeta2) || (sum_dg && !dg2) || (io.dhT && !dhT2) || (io.dh0 && !dh02)
                 ? -1
                 : in.make(G, R, io.h0);
    if (!rc && io.dhT) rc = vsplit_states(VS_WHO, true, NH, G.K, R, Vs, io.dhT, dhT2);
    Io<T> io2 = io;
    io2.h0 = in.h0, io2.dhT = dhT2, io2.dh0 = dh02;
    if (!shared) io2.dg = dg2, io2.dbeta = nullptr, io2.dbeta32 = dbeta2;
    if (!rc) rc = bwd<T>(r2, var, io2, kept);
    if (!rc && sum_dbeta) rc = heads_sum(VS_WHO, per_head, 1, R, 1, dbeta2, nullptr, nullptr, fmt, io.dbeta);
    if (!rc && sum_dg) rc = heads_sum(VS_WHO, per_head, 1, R, G.gs, dg2, nullptr, nullptr, VS_F32, io.dg);
    if (!rc && io.dh0) rc = vsplit_states(VS_WHO, false, NH, G.K, R, Vs, dh02, io.dh0);
    release(dbeta2), release(dg2), release(dhT2), release(dh02);
    return rc;
}

/* ---- K and V the tensor-core kernels do not take: zero padding (dr_chunk_pad.cu) ---- */

/* The K and V a family's 16-bit kernels run a call of geometry G on, padded: K up to the next of 64
 * and 128 (the head-gate and KDA families) or to 256 (the TF32 family, where its 16-bit kernels take
 * the padded shape: k256_ok), V up to a multiple of 64.  K = 0 where padding gives the family none of
 * its kernels' shapes (chunk not 64, K outside the family's range, a gate the family does not take). */
struct PadDims {
    int K = 0, V = 0;
};
static Geom pad_geom(Geom G, PadDims d) {
    G.K = d.K, G.V = d.V;
    if (G.gate == DG_GATE_CHANNEL) G.gs = d.K;
    return G;
}
static PadDims pad_dims(dg_drc_family fam, const Geom &G) {
    PadDims d;
    const bool chan = G.gate == DG_GATE_CHANNEL;
    if (G.C != 64) return d;
    if (fam == DG_DRC_TF32) d.K = G.K > 128 && G.K <= 256 ? 256 : 0;
    else if ((fam == DG_DRC_MMA && !chan) || (fam == DG_DRC_KDA_MMA && chan))
        d.K = G.K <= 64 ? 64 : G.K <= 128 ? 128 : 0;
    if (d.K) d.V = (G.V + 63) / 64 * 64;
    if (fam == DG_DRC_TF32 && d.K && !k256_ok(pad_geom(G, d), nullptr, nullptr, nullptr)) d = PadDims();
    return d;
}

/* The alignments the head-gate and KDA kernels need: q, k, v, dout (and the L2 norm's normalised
 * rows) are loaded as 16-byte vectors, o and dv stored in pairs */
constexpr uintptr_t LOAD_AL = 16, STORE_AL = 4;

/* whether the pointers of io (and l2) are aligned for them (NULL: not used) */
template <typename T> static bool io_aligned(const Io<T> &io, const L2Req<T> *l2 = nullptr) {
    const void *loaded[] = {io.q, io.k, io.v, io.dout, l2 ? l2->q : nullptr, l2 ? l2->k : nullptr};
    for (const void *p : loaded)
        if (!aligned(p, LOAD_AL)) return false;
    return aligned(io.o, STORE_AL) && aligned(io.dv, STORE_AL);
}

/* Whether a 16-bit call of geometry G runs padded to d = pad_dims: where d differs from its K or V,
 * or where its pointers are not aligned as the kernels load and store them (io_aligned; the padded
 * copies are).  The TF32 family's 16-bit kernels at K = 256 need the same (k256_ok, and dout, dv in
 * the backward), else the call would fall to its TF32 kernels, about four times slower; only an o
 * alone unaligned is theirs without copies (the TF32 output pass over the 16-bit prep and state
 * pass). */
template <typename T>
static bool pad_wanted(dg_drc_family fam, const Geom &G, PadDims d, const Io<T> &io, const L2Req<T> *l2 = nullptr) {
    if (!d.K) return false;
    if (d.K != G.K || d.V != G.V) return true;
    Io<T> x = io;
    if (fam == DG_DRC_TF32) x.o = nullptr;
    return !io_aligned(x, l2);
}

static const char *const PAD_WHO = "dr_chunk pad";

/* The padded copies of a call: scratch they own, and the copies in and out (dr_chunk_pad.cu).  An
 * array whose padded shape is its own and which is aligned as the kernels load or store it (al
 * bytes: io_aligned) is used as it is, not copied. */
struct Padded {
    void *own[16] = {};
    int n = 0, rc = 0;
    /* new scratch of count elements (NULL, rc set, when it cannot be had); NULL where want is NULL */
    template <typename E> E *take(const void *want, int64_t count) {
        if (!want || rc) return nullptr;
        E *x = scratch<E>((size_t)count);
        if (!x) rc = -1;
        else own[n++] = x;
        return x;
    }
    /* src [A, Bs, Cs] padded to [A, Bd, Cd]: into new scratch, or src itself; NULL where src is NULL */
    template <typename E> const E *in(const E *src, int64_t A, int Bs, int Cs, int Bd, int Cd, uintptr_t al = 1) {
        if (Bs == Bd && Cs == Cd && aligned(src, al)) return src;
        E *dst = take<E>(src, A * Bd * Cd);
        if (dst) rc = pad_copy(PAD_WHO, A, Bs, Cs, Bd, Cd, sizeof(E), src, dst);
        return dst;
    }
    /* where the kernels write the padded [A, Bd, Cd] of dst [A, Bs, Cs]: new scratch, or dst itself */
    template <typename E> E *place(E *dst, int64_t A, int Bs, int Cs, int Bd, int Cd, uintptr_t al = 1) {
        return Bs == Bd && Cs == Cd && aligned(dst, al) ? dst : take<E>(dst, A * Bd * Cd);
    }
    /* dst [A, Bd, Cd] cropped from src [A, Bs, Cs] (both given, or nothing; nothing where src is dst) */
    template <typename E> void out(const E *src, int64_t A, int Bs, int Cs, int Bd, int Cd, E *dst) {
        if (src && dst && src != dst && !rc) rc = pad_copy(PAD_WHO, A, Bs, Cs, Bd, Cd, sizeof(E), src, dst);
    }
    ~Padded() {
        for (int i = 0; i < n; i++) release(own[i]);
    }
};

template <typename T> static int l2norm_rows(const Geom &G, const T *x, float eps, T *y, float *r);

static dg_dr_shape pad_shape(const dg_dr_shape *s, PadDims d) {
    dg_dr_shape s2 = *s;
    s2.K = d.K, s2.V = d.V;
    return s2;
}

/* The forward of a call padded to d (pad_wanted; G its geometry): the L2 norm (l2 given) by the
 * norm's kernel at the call's own K into l2's rows, then q, k, v, the per-channel gate and h0
 * padded, the forward of the padded shape, o and hT cropped back.  (The norm is taken before the
 * padding, not in the padded kernels' loads: a backward whose forward kept nothing normalises the
 * raw rows again with the norm's kernel at K, and the padded rows' sums of squares would be added
 * in another order: other bits.) */
template <typename T>
static int fwd_pad(const Run &r, const Geom &G, PadDims d, const Io<T> &io, void *keep, bool *kept,
                   const L2Req<T> *l2) {
    const dg_dr_shape s2 = pad_shape(r.s, d);
    Run r2 = r;
    r2.s = &s2;
    const int64_t nq = G.rows * G.H, nv = G.rows * G.HV, NH = G.N * G.HV;
    Padded pb;
    const T *q = io.q, *k = io.k;
    if (l2) {
        T *qn = l2->q ? l2->q : pb.take<T>(io.q, nq * G.K);
        if (pb.rc || l2norm_rows<T>(G, io.q, l2->eps, qn, l2->rq) || l2norm_rows<T>(G, io.k, l2->eps, l2->k, l2->rk))
            return -1;
        q = qn, k = l2->k;
    }
    Io<T> io2 = io;
    io2.q = pb.in<T>(q, nq, 1, G.K, 1, d.K, LOAD_AL);
    io2.k = pb.in<T>(k, nq, 1, G.K, 1, d.K, LOAD_AL);
    io2.v = pb.in<T>(io.v, nv, 1, G.V, 1, d.V, LOAD_AL);
    if (G.gate == DG_GATE_CHANNEL) io2.g = pb.in<float>(io.g, nv, 1, G.K, 1, d.K);
    io2.h0 = pb.in<float>(io.h0, NH, G.K, G.V, d.K, d.V);
    io2.o = pb.place<T>(io.o, nv, 1, G.V, 1, d.V, STORE_AL);
    io2.hT = pb.place<float>(io.hT, NH, G.K, G.V, d.K, d.V);
    if (pb.rc || fwd<T>(r2, io2, keep, kept)) return -1;
    pb.out<T>(io2.o, nv, 1, d.V, 1, G.V, io.o);
    pb.out<float>(io2.hT, NH, d.K, d.V, G.K, G.V, io.hT);
    return pb.rc;
}

/* The backward likewise: the forward's inputs, dout and dhT padded; dq, dk, dv, the per-channel
 * gate's dg and dh0 cropped back (dbeta and the head gate's dg have no padded dimension) */
template <typename T>
static int bwd_pad(const Run &r, const Geom &G, PadDims d, const dg_dr_variant &var, const Io<T> &io,
                   const void *kept) {
    const dg_dr_shape s2 = pad_shape(r.s, d);
    Run r2 = r;
    r2.s = &s2;
    const int64_t nq = G.rows * G.H, nv = G.rows * G.HV, NH = G.N * G.HV;
    const bool chan = G.gate == DG_GATE_CHANNEL;
    Padded pb;
    Io<T> io2 = io;
    io2.q = pb.in<T>(io.q, nq, 1, G.K, 1, d.K, LOAD_AL);
    io2.k = pb.in<T>(io.k, nq, 1, G.K, 1, d.K, LOAD_AL);
    io2.v = pb.in<T>(io.v, nv, 1, G.V, 1, d.V, LOAD_AL);
    io2.dout = pb.in<T>(io.dout, nv, 1, G.V, 1, d.V, LOAD_AL);
    if (chan) io2.g = pb.in<float>(io.g, nv, 1, G.K, 1, d.K);
    io2.h0 = pb.in<float>(io.h0, NH, G.K, G.V, d.K, d.V);
    io2.dhT = pb.in<float>(io.dhT, NH, G.K, G.V, d.K, d.V);
    io2.dq = pb.place<T>(io.dq, nq, 1, G.K, 1, d.K);
    io2.dk = pb.place<T>(io.dk, nq, 1, G.K, 1, d.K);
    io2.dv = pb.place<T>(io.dv, nv, 1, G.V, 1, d.V, STORE_AL);
    if (chan) io2.dg = pb.place<float>(io.dg, nv, 1, G.K, 1, d.K);
    io2.dh0 = pb.place<float>(io.dh0, NH, G.K, G.V, d.K, d.V);
    if (pb.rc) return -1;
    if (bwd<T>(r2, var, io2, kept)) return -1;
    pb.out<T>(io2.dq, nq, 1, d.K, 1, G.K, io.dq);
    pb.out<T>(io2.dk, nq, 1, d.K, 1, G.K, io.dk);
    pb.out<T>(io2.dv, nv, 1, d.V, 1, G.V, io.dv);
    if (chan) pb.out<float>(io2.dg, nv, 1, d.K, 1, G.K, io.dg);
    pb.out<float>(io2.dh0, NH, d.K, d.V, G.K, G.V, io.dh0);
    return pb.rc;
}

#ifdef DRC_EMU
/* The host emulation has no dr_pieces.cu: the norm's rows there go through l2norm_row, which makes
 * the bits of the norm's kernel (dr_l2norm_row.cuh) */
template <int K, bool F16>
__global__ void l2norm_rows_emu(int64_t n, const uint16_t *x, float eps, uint16_t *y, float *r) {
    const int64_t row = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (row < n) l2norm_row<K, F16>(x + row * K, nullptr, y + row * K, r ? r + row : nullptr, eps);
}
/* and rows of any other length D as the norm's kernel for them (dr_pieces.cu: lane l adds the
 * squares of l, l + 32, ..., then the lanes' sums by xor shuffles) */
template <bool F16>
__global__ void l2norm_rows_any_emu(int64_t n, int D, const uint16_t *x, float eps, uint16_t *y, float *r) {
    const int64_t row = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int lane = (int)threadIdx.x & 31;
    if (row >= n) return;
    const uint16_t *xr = x + row * D;
    float ss = 0.0f;
    for (int c = lane; c < D; c += 32) {
        const float v = F16 ? h2f(xr[c]) : bf2f(xr[c]);
        ss += v * v;
    }
    for (int off = 16; off > 0; off >>= 1) ss += shfl_xor(ss, off);
    const float rr = rsqrtf(ss + eps);
    if (r && lane == 0) r[row] = rr;
    for (int c = lane; c < D; c += 32) {
        const float v = (F16 ? h2f(xr[c]) : bf2f(xr[c])) * rr;
        y[row * D + c] = F16 ? f2h(v) : f2bf(v);
    }
}
#endif

/* y = the rows of x normalised, r their 1/|x| (may be NULL): the norm's own kernel */
template <typename T> static int l2norm_rows(const Geom &G, const T *x, float eps, T *y, float *r) {
    constexpr bool f16 = !is_bf16<T>::value;
    const int64_t n = G.rows * G.H;
    const uint16_t *xb = (const uint16_t *)x;
    uint16_t *yb = (uint16_t *)y;
#ifdef DRC_EMU
    const int64_t nb = (n + 7) / 8;
    if (G.K != 64 && G.K != 128)
        return DRC_LAUNCH("dr_chunk l2norm", (l2norm_rows_any_emu<f16>), nb, 256, 0, n, G.K, xb, eps, yb, r);
    return G.K == 64 ? DRC_LAUNCH("dr_chunk l2norm", (l2norm_rows_emu<64, f16>), nb, 256, 0, n, xb, eps, yb, r)
                     : DRC_LAUNCH("dr_chunk l2norm", (l2norm_rows_emu<128, f16>), nb, 256, 0, n, xb, eps, yb, r);
#else
    return f16 ? dg_cuda_dr_l2norm_f16_fwd(n, G.K, xb, eps, yb, r) : dg_cuda_dr_l2norm_bf16_fwd(n, G.K, xb, eps, yb, r);
#endif
}

/* The forward with the L2 norm where the tensor-core kernels (head-gate and KDA families) take it
 * in their loads; elsewhere (the TF32 and generic kernels, l2_norm_first) the norm's kernel first,
 * then the forward of the normalised rows.  Both give the same bits (dr_chunk_l2norm.cuh). */
template <typename T>
static int fwd_l2_first(const Run &r, const Plan &p, const Io<T> &io, void *keep, bool *kept, const L2Req<T> &l2) {
    T *qn = l2.q ? l2.q : scratch<T>((size_t)(p.G.rows * p.G.H * p.G.K));
    int rc = qn ? l2norm_rows<T>(p.G, io.q, l2.eps, qn, l2.rq) : -1;
    if (!rc) rc = l2norm_rows<T>(p.G, io.k, l2.eps, l2.k, l2.rk);
    Io<T> io2 = io;
    io2.q = qn, io2.k = l2.k;
    if (!rc) rc = fwd<T>(r, io2, keep, kept);
    if (!l2.q) release(qn);
    return rc;
}

/* T: float (the generic kernels), uint16_t (bf16 bits) or f16bits (fp16 bits): the tensor-core
 * kernels of r.fam (the backend row checked that they take the call: dg_cuda_dr_chunk_accepts).
 * keep (16-bit storage only; may be NULL): device memory of the family's kept bytes for the working
 * set, *kept set to whether it was filled (the tensor-core families fill it, the generic kernels
 * keep nothing); l2 (16-bit only; may be NULL): io.q, io.k are raw rows, normalised here (L2Req) */
template <typename T> static int fwd(const Run &r, const Io<T> &io_in, void *keep, bool *kept, const L2Req<T> *l2) {
    *kept = false;
    Plan p;
    if (r.s && io_in.q && io_in.k && io_in.v && io_in.beta &&
        !io_in.o) { /* (plan_init names the other NULL pointers first) */
        dg_error("%s: o is NULL", r.who);
        return -1;
    }
    if (plan_init(r.who, r.s, io_in.q, io_in.k, io_in.v, io_in.g, io_in.beta, &p)) return -1;
    if (const PadDims d = pad_dims(r.fam, p.G); sizeof(T) == 2 && pad_wanted(r.fam, p.G, d, io_in, l2)) {
        const int rc = fwd_pad<T>(r, p.G, d, io_in, keep, kept, l2);
        plan_free(&p);
        return rc;
    }
    if (const int R = sizeof(T) == 2 ? vsplit_ways(r.fam, p.G) : 1; R > 1) {
        const int rc = fwd_vsplit<T>(r, p.G, R, io_in, keep, kept, l2);
        plan_free(&p);
        return rc;
    }
    p.G.vsh = r.vsh;
    Io<T> io = io_in;
    int rc;
    if constexpr (sizeof(T) == 2) {
        constexpr bool f16 = !is_bf16<T>::value; /* fp16: the kernels' fp16 builds (fast_h, kda_h) */
        const bool fast = r.fam == DG_DRC_MMA, kda = r.fam == DG_DRC_KDA_MMA, tf32 = r.fam == DG_DRC_TF32;
        if (l2 && !((fast || kda) && r.l2_fuse)) {
            rc = fwd_l2_first<T>(r, p, io, keep, kept, *l2);
            plan_free(&p);
            return rc;
        }
        if (l2) io.l2q = l2->q, io.l2k = l2->k, io.l2rq = l2->rq, io.l2rk = l2->rk, io.l2eps = l2->eps;
        bool filled = false;             /* (the TF32 family: where its 16-bit kernels ran throughout) */
        rc = plan_table(r.who, r.s, &p); /* (only a call that launches the kernels makes it) */
        if (!rc)
            rc = kda    ? (f16 ? kda_h::fwd(p, io_bits(io), keep) : kda::fwd(p, io_bits(io), keep))
                 : fast ? (f16 ? fast_h::fwd(p, io_bits(io), keep) : fast::fwd(p, io_bits(io), keep))
                 : tf32 ? generic_fwd<T, true>(p, io, keep, &filled)
                        : generic_fwd<T>(p, io, nullptr, &filled);
        if (!rc) *kept = keep && (kda || fast || filled);
    } else {
        bool filled;
        rc = plan_table(r.who, r.s, &p);
        if (!rc) rc = generic_fwd<T>(p, io, nullptr, &filled);
    }
    plan_free(&p);
    return rc;
}

template <typename T> static int bwd(const Run &r, const dg_dr_variant &var, const Io<T> &io, const void *kept) {
    Plan p;
    if (io.dg && !io.g) {
        dg_error("%s: dg given but g is NULL", r.who);
        return -1;
    }
    if (r.s && io.q && io.k && io.v && io.beta && !io.dout) {
        dg_error("%s: dout is NULL", r.who);
        return -1;
    }
    if (plan_init(r.who, r.s, io.q, io.k, io.v, io.g, io.beta, &p)) return -1;
    if (const PadDims d = pad_dims(r.fam, p.G); sizeof(T) == 2 && pad_wanted(r.fam, p.G, d, io)) {
        const int rc = bwd_pad<T>(r, p.G, d, var, io, kept);
        plan_free(&p);
        return rc;
    }
    if (const int R = sizeof(T) == 2 ? vsplit_ways(r.fam, p.G) : 1; R > 1) {
        const int rc = bwd_vsplit<T>(r, p.G, R, var, io, kept);
        plan_free(&p);
        return rc;
    }
    if (plan_table(r.who, r.s, &p)) return -1;
    p.G.vsh = r.vsh;
    int rc;
    if constexpr (sizeof(T) == 2) {
        constexpr bool f16 = !is_bf16<T>::value;
        const bool fast = r.fam == DG_DRC_MMA, kda = r.fam == DG_DRC_KDA_MMA, tf32 = r.fam == DG_DRC_TF32;
        rc = kda    ? (f16 ? kda_h::bwd(p, var, io_bits(io), kept) : kda::bwd(p, var, io_bits(io), kept))
             : fast ? (f16 ? fast_h::bwd(p, var, io_bits(io), kept) : fast::bwd(p, var, io_bits(io), kept))
             : tf32 ? generic_bwd<T, true>(p, var, io, kept)
                    : generic_bwd<T>(p, var, io, nullptr);
        /* (the L2 norm's backward, io.rq / io.rk: each path applies it, dr_chunk_heads.cu) */
    } else {
        rc = generic_bwd<T>(p, var, io, nullptr);
    }
    plan_free(&p);
    return rc;
}

/* ---- the entry points on the call descriptor ---- */

static const char *family_name(dg_drc_family fam) {
    return fam == DG_DRC_MMA       ? "tensor cores"
           : fam == DG_DRC_KDA_MMA ? "kda tensor cores"
           : fam == DG_DRC_TF32    ? "tf32 tensor cores"
                                   : "generic";
}

/* The geometry the families' shape tests read, from the shape alone (unchecked: a shape the kernels
 * refuse is refused with its message by the call itself) */
static Geom loose_geom(const dg_dr_shape &s) {
    Geom G;
    memset(&G, 0, sizeof G);
    G.H = (int)s.H, G.HV = (int)s.HV, G.grp = s.H > 0 ? (int)(s.HV / s.H) : 0;
    G.K = (int)s.K, G.V = (int)s.V, G.C = s.chunk, G.gate = (int)s.gate, G.vsh = 1;
    return G;
}

static bool accepts(dg_drc_family fam, const dg_delta_call *c) {
    if (c->device != DG_CUDA || c->algorithm != DG_DELTA_CHUNKED) return false;
    if (c->dtype != DG_F32 && c->dtype != DG_BF16 && c->dtype != DG_F16) return false;
    if (fam == DG_DRC_GENERIC) return true;
    if (c->dtype == DG_F32 || c->force_generic || c->s.K > 256 || c->s.V > (1 << 20) || c->s.H < 1) return false;
    const Geom G = loose_geom(c->s);
    if (fam == DG_DRC_TF32) return family_shape(fam, G); /* (element loads: any alignment) */
    /* (any alignment and any K, V the padding takes to the family's shapes: pad_wanted) */
    const PadDims d = pad_dims(fam, G);
    return d.K && family_takes(fam, pad_geom(G, d));
}

/* names of the entry points by dtype, for messages */
static const char *who_of(const dg_delta_call *c, bool bwd) {
    if (c->dtype == DG_F32) return bwd ? "cuda dr_chunk_bwd_f32" : "cuda dr_chunk_fwd_f32";
    if (c->dtype == DG_F16) return bwd ? "cuda dr_chunk_bwd_f16" : "cuda dr_chunk_fwd_f16";
    return bwd ? "cuda dr_chunk_bwd_bf16" : "cuda dr_chunk_fwd_bf16";
}

/* the call is one this family takes (a named row may be forced on any call) */
static bool check_family(dg_drc_family fam, const dg_delta_call *c, const char *who) {
    if (fam != DG_DRC_GENERIC && fam != DG_DRC_MMA && fam != DG_DRC_KDA_MMA && fam != DG_DRC_TF32) {
        dg_error("%s: unknown kernel family %d", who, (int)fam);
        return false;
    }
    if (c->device != DG_CUDA || (c->dtype != DG_F32 && c->dtype != DG_BF16 && c->dtype != DG_F16)) {
        dg_error("%s: a %s call on %s (these kernels take f32, bf16 or f16 on cuda)", who, dg_dtype_name(c->dtype),
                 dg_device_name(c->device));
        return false;
    }
    if (!accepts(fam, c)) {
        dg_error("%s: the %s kernels do not take this call (%s, gate %d, chunk %d, K = %lld, V = %lld%s)", who,
                 family_name(fam), dg_dtype_name(c->dtype), (int)c->s.gate, c->s.chunk, (long long)c->s.K,
                 (long long)c->s.V, c->force_generic ? ", force_generic set" : "");
        return false;
    }
    return true;
}

/* keep, where given, must be 16-byte aligned (the kernels load and store its buffers as 16-byte
 * vectors) */
static bool keep_ok(const char *who, const void *keep) {
    if (keep && ((uintptr_t)keep & 15) != 0) {
        dg_error("%s: keep %p is not 16-byte aligned", who, keep);
        return false;
    }
    return true;
}

template <typename T> static int fwd_call(dg_drc_family fam, dg_delta_call *c) {
    const char *who = who_of(c, false);
    c->kept = false;
    if (!check_family(fam, c, who) || !keep_ok(who, c->keep)) return -1;
    const Run r{who, &c->s, fam, !c->l2_norm_first};
    typedef const T *P;
    Io<T> io;
    memset(&io, 0, sizeof io);
    io.v = (P)c->v, io.g = (const float *)c->g, io.beta = (P)c->beta, io.h0 = (const float *)c->h0;
    io.o = (T *)c->o, io.hT = (float *)c->hT;
    void *keep = sizeof(T) == 2 ? c->keep : nullptr;
    if (sizeof(T) == 2 && c->l2.on) {
        /* q, k of the call receive the normalised rows of l2.qraw, l2.kraw */
        T *qn = c->l2.for_bwd ? (T *)c->q : nullptr, *kn = (T *)c->k;
        if (!kn) {
            dg_error("%s: k (the normalised rows of the L2 norm) is NULL", who);
            return -1;
        }
        if ((qn && ((const void *)qn == c->l2.qraw || (const void *)qn == c->l2.kraw)) ||
            (const void *)kn == c->l2.qraw || (const void *)kn == c->l2.kraw) {
            dg_error("%s: %s overlaps the raw q or k (the raw rows are read as the normalised ones are written)", who,
                     qn && ((const void *)qn == c->l2.qraw || (const void *)qn == c->l2.kraw) ? "q" : "k");
            return -1;
        }
        io.q = (P)c->l2.qraw, io.k = (P)c->l2.kraw;
        const L2Req<T> l2{qn, kn, c->l2.for_bwd ? (float *)c->l2.rq : nullptr,
                          c->l2.for_bwd ? (float *)c->l2.rk : nullptr, (float)DG_DELTA_L2NORM_EPS};
        return fwd<T>(r, io, keep, &c->kept, &l2);
    }
    if (c->l2.on) {
        dg_error("%s: the f32 kernels do not take the L2 norm in their loads (run the norm's kernel first)", who);
        return -1;
    }
    io.q = (P)c->q, io.k = (P)c->k;
    return fwd<T>(r, io, keep, &c->kept);
}

template <typename T> static int bwd_call(dg_drc_family fam, dg_delta_call *c) {
    const char *who = who_of(c, true);
    c->l2_done = false;
    if (!check_family(fam, c, who)) return -1;
    const Run r{who, &c->s, fam, !c->l2_norm_first};
    typedef const T *P;
    Io<T> io;
    memset(&io, 0, sizeof io);
    io.q = (P)c->q, io.k = (P)c->k, io.v = (P)c->v, io.g = (const float *)c->g, io.beta = (P)c->beta;
    io.h0 = (const float *)c->h0, io.dout = (P)c->dout, io.dhT = (const float *)c->dhT;
    io.dq = (T *)c->dq, io.dk = (T *)c->dk, io.dv = (T *)c->dv, io.dg = (float *)c->dg, io.dbeta = (T *)c->dbeta;
    io.dh0 = (float *)c->dh0;
    /* the 16-bit kernels take the norm's backward with them */
    const bool l2 = sizeof(T) == 2 && c->l2.on && c->l2.rq && c->l2.rk;
    if (l2) io.rq = (const float *)c->l2.rq, io.rk = (const float *)c->l2.rk;
    const void *kept = sizeof(T) == 2 && c->kept ? c->keep : nullptr;
    const int rc = bwd<T>(r, dg_delta_bwd_variant(c->bwd), io, kept);
    c->l2_done = !rc && l2;
    return rc;
}

} // namespace drc

extern "C" {

bool dg_cuda_dr_chunk_accepts(dg_drc_family fam, const dg_delta_call *c) { return drc::accepts(fam, c); }

int64_t dg_cuda_dr_chunk_kept_bytes(dg_drc_family fam, const dg_delta_call *c) {
    if (!drc::accepts(fam, c) || c->dtype == DG_F32 || fam == DG_DRC_GENERIC) return 0;
    drc::Plan p; /* the shape alone decides (the pointers are checked by the calls themselves) */
    if (drc::plan_init("cuda dr_chunk_kept_bytes", &c->s, nullptr, nullptr, nullptr, nullptr, nullptr, &p, true))
        return -1;
    /* the shape the kernels run: padded (where it is), then split */
    const drc::PadDims d = drc::pad_dims(fam, p.G);
    const drc::Geom Gp = d.K ? drc::pad_geom(p.G, d) : p.G, G = drc::vsplit_geom(Gp, drc::vsplit_ways(fam, Gp));
    const size_t n = fam == DG_DRC_KDA_MMA ? drc::kda_kept_bytes(G)
                     : fam == DG_DRC_TF32  ? drc::k256_kept_bytes(G)
                                           : drc::fast_kept_bytes(G);
    drc::plan_free(&p);
    return (int64_t)n;
}

int dg_cuda_dr_chunk_fwd(dg_drc_family fam, dg_delta_call *c) {
    if (!c) {
        dg_error("cuda dr_chunk_fwd: the call is NULL");
        return -1;
    }
    if (c->dtype == DG_F16) return drc::fwd_call<drc::f16bits>(fam, c);
    if (c->dtype == DG_BF16) return drc::fwd_call<uint16_t>(fam, c);
    return drc::fwd_call<float>(fam, c);
}

int dg_cuda_dr_chunk_bwd(dg_drc_family fam, dg_delta_call *c) {
    if (!c) {
        dg_error("cuda dr_chunk_bwd: the call is NULL");
        return -1;
    }
    if (c->dtype == DG_F16) return drc::bwd_call<drc::f16bits>(fam, c);
    if (c->dtype == DG_BF16) return drc::bwd_call<uint16_t>(fam, c);
    return drc::bwd_call<float>(fam, c);
}

} // extern "C"
