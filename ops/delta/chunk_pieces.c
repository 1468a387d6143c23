/* The pieces of the chunked algorithm as ops of their own, so each is gradchecked and compared
 * alone (kernels: kernels/cpu/delta/chunk_pieces.h, the same per-chunk code the fused kernels run).
 * Chunks of C tokens start at every sequence start (cu_seqlens, B = 1) or at t = 0 of each batch
 * row; the last chunk of a sequence may be partial.
 *
 *   chunk_local_cumsum   g [B,T,H] or [B,T,H,S] -> G, G_t = sum of g over t's chunk up to t
 *                        (reverse: from t to the chunk's end).  Backward: the other direction.
 *   chunk_scaled_dot_kkt k [B,T,H,K], beta [B,T,HV], G NULL | [B,T,HV] | [B,T,HV,K] (cumulative)
 *                        -> A [B,T,HV,C], A[t,j] = beta_t sum_c k_tc k_jc exp(G_tc - G_jc), j < i
 *                        (i = t's position in its chunk); 0 for j >= i.
 *   solve_tril           A [B,T,HV,C] (strictly lower per chunk) -> (I + A)^-1, same layout.
 *                        Forward by blocked inverses or forward substitution (attrs);
 *                        backward dA = strictly_lower(-Ainv^T dAinv Ainv^T), with Ainv recomputed
 *                        by the variant's method ("blocked" or "subst"), not saved.
 * Device: CPU f32 / f64 (kernels/cpu/delta/chunk_pieces.h) or CUDA f32 / f64 (kernels/cuda/delta/dr_pieces_cuda.h,
 * the same math; cu_seqlens may live on either device, the kernels take a host copy). */
#include "kernels/cpu/delta/chunk_pieces.h"
#include "ops/delta/delta_common.h"

#ifdef DG_HAVE_CUDA
#include "kernels/cuda/delta/dr_pieces_cuda.h"
#else
#define dg_cuda_chunk_local_cumsum(dt, ...) no_cuda(dt)
#define dg_cuda_chunk_scaled_dot_kkt_fwd(dt, ...) no_cuda(dt)
#define dg_cuda_chunk_scaled_dot_kkt_bwd(dt, ...) no_cuda(dt)
#define dg_cuda_solve_tril_fwd(dt, ...) no_cuda(dt)
#define dg_cuda_solve_tril_bwd(dt, ...) no_cuda(dt)
static int no_cuda(dg_dtype dt) {
    (void)dt;
    dg_error("chunk pieces: this build has no CUDA backend");
    return -1;
}
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct piece_attrs {
    int chunk;
    int reverse;       /* chunk_local_cumsum */
    dg_gate_kind gate; /* chunk_scaled_dot_kkt */
    int blocked;       /* solve_tril forward */
} piece_attrs;

#define DPTR(t) ((t) ? dg_data_ptr(t) : NULL)

static dg_tensor *contig(dg_tensor *t) { return t ? dg_contiguous(t) : NULL; }

/* cu_seqlens as a host array (copied from the device when it lives there) */
static const int64_t *cu_ptr(dg_tensor *cu, int64_t *N, int64_t B) {
    *N = cu ? cu->shape[0] - 1 : B;
    if (cu && cu->device != DG_CPU) cu = dg_contiguous(dg_to_device(cu, DG_CPU));
    return cu ? DPTR(cu) : NULL;
}

#define ON_CUDA(t) ((t)->device == DG_CUDA)

static bool check_chunk(const char *op, int chunk) {
    if (chunk == 16 || chunk == 32 || chunk == 64) return true;
    dg_error("%s: chunk_size %d is not supported (16, 32 or 64)", op, chunk);
    return false;
}

/* ---- chunk_local_cumsum ------------------------------------------------------------------------ */

static void cumsum_dims(const dg_tensor *g, int64_t *H, int64_t *S) {
    *H = g->shape[2];
    *S = g->ndim == 4 ? g->shape[3] : 1;
}

static int cumsum_forward(dg_node *n) {
    const piece_attrs *at = (const piece_attrs *)n->attrs;
    dg_tensor *g = dg_contiguous(n->in[0]), *cu = contig(n->in[1]);
    dg_tensor *out = g ? dg_empty_like(g) : NULL;
    if (!out || (n->in[1] && !cu)) return -1;
    int64_t H, S, N;
    cumsum_dims(g, &H, &S);
    const int64_t *c = cu_ptr(cu, &N, g->shape[0]);
    int rc = ON_CUDA(g) ? dg_cuda_chunk_local_cumsum(g->dtype, g->shape[0], g->shape[1], H, S, c, N, at->chunk,
                                                     at->reverse, DPTR(g), DPTR(out))
             : g->dtype == DG_F32 ? dg_chunk_local_cumsum_fwd_f32(g->shape[0], g->shape[1], H, S, c, N, at->chunk,
                                                                  at->reverse, DPTR(g), DPTR(out))
                                  : dg_chunk_local_cumsum_fwd_f64(g->shape[0], g->shape[1], H, S, c, N, at->chunk,
                                                                  at->reverse, DPTR(g), DPTR(out));
    n->out[0] = out;
    return rc;
}

/* forward: G = L g per chunk (L lower ones, or upper when reversed), so dg = L^T dG */
static int cumsum_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    const piece_attrs *at = (const piece_attrs *)n->attrs;
    dg_tensor *dy = dg_contiguous(gout[0]), *cu = contig(n->in[1]);
    dg_tensor *dx = dy ? dg_empty_like(dy) : NULL;
    if (!dx) return -1;
    int64_t H, S, N;
    cumsum_dims(dy, &H, &S);
    const int64_t *c = cu_ptr(cu, &N, dy->shape[0]);
    int rc = ON_CUDA(dy) ? dg_cuda_chunk_local_cumsum(dy->dtype, dy->shape[0], dy->shape[1], H, S, c, N, at->chunk,
                                                      !at->reverse, DPTR(dy), DPTR(dx))
             : dy->dtype == DG_F32 ? dg_chunk_local_cumsum_bwd_f32(dy->shape[0], dy->shape[1], H, S, c, N, at->chunk,
                                                                   at->reverse, DPTR(dy), DPTR(dx))
                                   : dg_chunk_local_cumsum_bwd_f64(dy->shape[0], dy->shape[1], H, S, c, N, at->chunk,
                                                                   at->reverse, DPTR(dy), DPTR(dx));
    gin[0] = dx;
    return rc;
}

/* from primitives: per chunk of each sequence, G = M g with M the [L,L] lower (upper) ones */
static int cumsum_decompose(const void *attrs, dg_tensor *const *in, dg_tensor **out) {
    const piece_attrs *at = (const piece_attrs *)attrs;
    dg_tensor *g = in[0], *cu = in[1];
    const int64_t B = g->shape[0], T = g->shape[1], N = cu ? cu->shape[0] - 1 : 1;
    int64_t bounds[2] = {0, T}, *c = bounds;
    int64_t cbuf[64];
    if (cu) {
        if (N + 1 > 64 || dg_copy_to_host(cu, cbuf) != 0) {
            dg_error("chunk_local_cumsum: decompose handles at most 63 sequences");
            return -1;
        }
        c = cbuf;
    }
    dg_tensor *parts[256];
    int np = 0;
    const int64_t rest = dg_numel(g) / (B * (T ? T : 1));
    for (int64_t s = 0; s < N; s++)
        for (int64_t t0 = c[s]; t0 < c[s + 1]; t0 += at->chunk) {
            const int64_t L = c[s + 1] - t0 < at->chunk ? c[s + 1] - t0 : at->chunk;
            if (np == 256) {
                dg_error("chunk_local_cumsum: decompose handles at most 256 chunks");
                return -1;
            }
            double m[64 * 64];
            for (int64_t i = 0; i < L; i++)
                for (int64_t j = 0; j < L; j++) m[i * L + j] = at->reverse ? (j >= i) : (j <= i);
            dg_tensor *M = dg_to_dtype(dg_from_data(DG_SHAPE(L, L), DG_F64, m), g->dtype);
            dg_tensor *x = dg_reshape(dg_slice(g, 1, t0, t0 + L), DG_SHAPE(B, L, rest));
            dg_tensor *y = dg_matmul(M, x);
            int64_t shp[DG_MAX_DIMS];
            memcpy(shp, g->shape, sizeof shp);
            shp[1] = L;
            parts[np++] = dg_reshape(y, g->ndim, shp);
        }
    out[0] = np == 1 ? parts[0] : dg_cat(np, parts, 1);
    return out[0] ? 0 : -1;
}

static int cumsum_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    dg_rng rng = dg_rng_new(seed);
    piece_attrs at = {.chunk = 16};
    dg_tensor *g, *cu = NULL;
    switch (index) {
    case 0: g = dg_rand_range(DG_SHAPE(2, 20, 3), dt, -1, 0, &rng); break;
    case 1: {
        int64_t c[3] = {0, 7, 40};
        g = dg_rand_range(DG_SHAPE(1, 40, 2, 3), dt, -1, 0, &rng);
        cu = dg_from_data(DG_SHAPE(3), DG_I64, c);
        at.chunk = 32;
        at.reverse = 1;
        break;
    }
    case 2: g = dg_rand_range(DG_SHAPE(2, 1, 2), dt, -1, 0, &rng); break;
    default: return 0;
    }
    dg_sample_set(s, 0, g, true);
    if (cu) dg_sample_set(s, 1, cu, false);
    memcpy(s->attrs, &at, sizeof at);
    snprintf(s->label, sizeof s->label, "g %s chunk %d%s%s", dg_shp(g), at.chunk, at.reverse ? " reverse" : "",
             cu ? " varlen {0,7,40}" : "");
    return 1;
}

const dg_op_def dg_op_chunk_local_cumsum = {.name = "chunk_local_cumsum",
                                            .n_in = 2,
                                            .n_out = 1,
                                            .in_names = {"g", "cu_seqlens"},
                                            .out_names = {"g_cumsum"},
                                            .attrs_size = sizeof(piece_attrs),
                                            .forward = cumsum_forward,
                                            .bwd = {{"default", cumsum_backward}},
                                            .decompose = cumsum_decompose,
                                            .sample = cumsum_sample,
                                            .atol_f64 = 1e-7,
                                            .rtol_f64 = 1e-6,
                                            .atol_f32 = 1e-5,
                                            .rtol_f32 = 1e-4};

dg_tensor *dg_chunk_local_cumsum(dg_tensor *g, int chunk_size, bool reverse, dg_tensor *cu_seqlens) {
    const char *op = "chunk_local_cumsum";
    if (!dg_check_float(op, "g", g)) return NULL;
    if (g->ndim != 3 && g->ndim != 4) {
        dg_error("%s: g has shape %s but [B,T,H] or [B,T,H,S] is required", op, dg_shp(g));
        return NULL;
    }
    int64_t N;
    if (!check_chunk(op, chunk_size) || (cu_seqlens && !dg_delta_check_cu(op, cu_seqlens, "g", g, &N))) return NULL;
    piece_attrs at = {.chunk = chunk_size, .reverse = reverse};
    dg_tensor *in[2] = {g, cu_seqlens};
    return dg_apply1(&dg_op_chunk_local_cumsum, &at, in);
}

/* ---- chunk_scaled_dot_kkt ---------------------------------------------------------------------- */

static dg_dr_shape kkt_shape(const piece_attrs *at, dg_tensor *k, dg_tensor *beta, dg_tensor *cu) {
    int64_t N;
    const int64_t *c = cu_ptr(cu, &N, k->shape[0]);
    return (dg_dr_shape){.B = k->shape[0],
                         .T = k->shape[1],
                         .H = k->shape[2],
                         .HV = beta->shape[2],
                         .K = k->shape[3],
                         .V = 1,
                         .cu_seqlens = c,
                         .N = N,
                         .gate = at->gate,
                         .scale = 1,
                         .chunk = at->chunk};
}

static int kkt_forward(dg_node *n) {
    const piece_attrs *at = (const piece_attrs *)n->attrs;
    dg_tensor *k = dg_contiguous(n->in[0]), *beta = dg_contiguous(n->in[1]);
    dg_tensor *g = contig(n->in[2]), *cu = contig(n->in[3]);
    if (!k || !beta || (n->in[2] && !g) || (n->in[3] && !cu)) return -1;
    dg_dr_shape s = kkt_shape(at, k, beta, cu);
    dg_tensor *A = dg_empty_on(DG_SHAPE(s.B, s.T, s.HV, at->chunk), k->dtype, k->device);
    if (!A) return -1;
    int rc = ON_CUDA(k) ? dg_cuda_chunk_scaled_dot_kkt_fwd(k->dtype, &s, DPTR(k), DPTR(beta), DPTR(g), DPTR(A))
             : k->dtype == DG_F32 ? dg_chunk_scaled_dot_kkt_fwd_f32(&s, DPTR(k), DPTR(beta), DPTR(g), DPTR(A))
                                  : dg_chunk_scaled_dot_kkt_fwd_f64(&s, DPTR(k), DPTR(beta), DPTR(g), DPTR(A));
    n->out[0] = A;
    return rc;
}

static int kkt_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    const piece_attrs *at = (const piece_attrs *)n->attrs;
    dg_tensor *k = dg_contiguous(n->in[0]), *beta = dg_contiguous(n->in[1]);
    dg_tensor *g = contig(n->in[2]), *cu = contig(n->in[3]), *dA = dg_contiguous(gout[0]);
    if (!k || !beta || (n->in[2] && !g) || !dA) return -1;
    dg_dr_shape s = kkt_shape(at, k, beta, cu);
    dg_tensor *dk = n->needs_grad[0] ? dg_empty_like(k) : NULL;
    dg_tensor *db = n->needs_grad[1] ? dg_empty_like(beta) : NULL;
    dg_tensor *dg = g && n->needs_grad[2] ? dg_empty_like(g) : NULL;
    int rc =
        ON_CUDA(k) ? dg_cuda_chunk_scaled_dot_kkt_bwd(k->dtype, &s, DPTR(k), DPTR(beta), DPTR(g), DPTR(dA), DPTR(dk),
                                                      DPTR(db), DPTR(dg))
        : k->dtype == DG_F32
            ? dg_chunk_scaled_dot_kkt_bwd_f32(&s, DPTR(k), DPTR(beta), DPTR(g), DPTR(dA), DPTR(dk), DPTR(db), DPTR(dg))
            : dg_chunk_scaled_dot_kkt_bwd_f64(&s, DPTR(k), DPTR(beta), DPTR(g), DPTR(dA), DPTR(dk), DPTR(db), DPTR(dg));
    gin[0] = dk;
    gin[1] = db;
    gin[2] = dg;
    return rc;
}

/* k [B,T,H,K] (scaled by 1/sqrt(K)), beta (0.1, 0.9), G a chunk-local cumsum of log decays in
 * (-0.5, 0): decreasing inside each chunk, as the ops feed it */
static int kkt_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    dg_rng rng = dg_rng_new(seed);
    int64_t B, T, H, HV, K;
    piece_attrs at = {.chunk = 16};
    int64_t c[3] = {0, 5, 37};
    bool varlen = false;
    switch (index) {
    case 0: B = 2, T = 20, H = 1, HV = 2, K = 4, at.gate = DG_GATE_HEAD; break;
    case 1: B = 1, T = 37, H = 2, HV = 2, K = 3, at.gate = DG_GATE_CHANNEL, at.chunk = 32, varlen = true; break;
    case 2: B = 1, T = 18, H = 1, HV = 1, K = 5, at.gate = DG_GATE_NONE; break;
    default: return 0;
    }
    const double ks = 1.0 / sqrt((double)K);
    dg_tensor *k = dg_rand_range(DG_SHAPE(B, T, H, K), dt, -ks, ks, &rng);
    dg_sample_set(s, 0, k, true);
    dg_sample_set(s, 1, dg_rand_range(DG_SHAPE(B, T, HV), dt, 0.1, 0.9, &rng), true);
    dg_tensor *cu = varlen ? dg_from_data(DG_SHAPE(3), DG_I64, c) : NULL;
    if (at.gate != DG_GATE_NONE) {
        dg_tensor *g = at.gate == DG_GATE_HEAD ? dg_rand_range(DG_SHAPE(B, T, HV), dt, -0.5, -0.01, &rng)
                                               : dg_rand_range(DG_SHAPE(B, T, HV, K), dt, -0.5, -0.01, &rng);
        dg_no_grad_begin();
        dg_tensor *G = dg_chunk_local_cumsum(g, at.chunk, false, cu);
        dg_no_grad_end();
        dg_sample_set(s, 2, G, true);
    }
    if (cu) dg_sample_set(s, 3, cu, false);
    memcpy(s->attrs, &at, sizeof at);
    snprintf(s->label, sizeof s->label, "k %s HV %lld, %s gate, chunk %d%s", dg_shp(k), (long long)HV,
             at.gate == DG_GATE_NONE   ? "no"
             : at.gate == DG_GATE_HEAD ? "head"
                                       : "channel",
             at.chunk, varlen ? ", varlen {0,5,37}" : "");
    return 1;
}

const dg_op_def dg_op_chunk_scaled_dot_kkt = {.name = "chunk_scaled_dot_kkt",
                                              .n_in = 4,
                                              .n_out = 1,
                                              .in_names = {"k", "beta", "g_cumsum", "cu_seqlens"},
                                              .out_names = {"A"},
                                              .attrs_size = sizeof(piece_attrs),
                                              .forward = kkt_forward,
                                              .bwd = {{"default", kkt_backward}},
                                              .sample = kkt_sample,
                                              .atol_f64 = 1e-7,
                                              .rtol_f64 = 1e-6,
                                              .atol_f32 = 1e-5,
                                              .rtol_f32 = 1e-4};

dg_tensor *dg_chunk_scaled_dot_kkt(dg_tensor *k, dg_tensor *beta, dg_tensor *g_cumsum, int chunk_size,
                                   dg_tensor *cu_seqlens) {
    const char *op = "chunk_scaled_dot_kkt";
    if (!dg_check_float(op, "k", k) || !dg_check_float(op, "beta", beta)) return NULL;
    if (!dg_check_same_dtype(op, "beta", beta, "k", k) || !dg_check_same_device(op, "beta", beta, "k", k)) return NULL;
    if (!dg_check_ndim(op, "k", k, 4) || !dg_check_ndim(op, "beta", beta, 3)) return NULL;
    const int64_t B = k->shape[0], T = k->shape[1], H = k->shape[2], K = k->shape[3], HV = beta->shape[2];
    if (beta->shape[0] != B || beta->shape[1] != T || HV < H || HV % H != 0) {
        dg_error("%s: beta has shape %s but [B,T,HV] with B, T of k %s and HV a multiple of H = %lld is required", op,
                 dg_shp(beta), dg_shp(k), (long long)H);
        return NULL;
    }
    dg_gate_kind gate = DG_GATE_NONE;
    if (g_cumsum) {
        if (!dg_check_float(op, "g_cumsum", g_cumsum) || !dg_check_same_dtype(op, "g_cumsum", g_cumsum, "k", k))
            return NULL;
        const bool head =
            g_cumsum->ndim == 3 && g_cumsum->shape[0] == B && g_cumsum->shape[1] == T && g_cumsum->shape[2] == HV;
        const bool chan = g_cumsum->ndim == 4 && g_cumsum->shape[0] == B && g_cumsum->shape[1] == T &&
                          g_cumsum->shape[2] == HV && g_cumsum->shape[3] == K;
        if (!head && !chan) {
            dg_error("%s: g_cumsum has shape %s but [B,T,HV] = [%lld,%lld,%lld] or [B,T,HV,K] = [%lld,%lld,%lld,%lld] "
                     "is required (k %s, beta %s)",
                     op, dg_shp(g_cumsum), (long long)B, (long long)T, (long long)HV, (long long)B, (long long)T,
                     (long long)HV, (long long)K, dg_shp(k), dg_shp(beta));
            return NULL;
        }
        gate = head ? DG_GATE_HEAD : DG_GATE_CHANNEL;
    }
    int64_t N;
    if (!check_chunk(op, chunk_size) || (cu_seqlens && !dg_delta_check_cu(op, cu_seqlens, "k", k, &N))) return NULL;
    piece_attrs at = {.chunk = chunk_size, .gate = gate};
    dg_tensor *in[4] = {k, beta, g_cumsum, cu_seqlens};
    return dg_apply1(&dg_op_chunk_scaled_dot_kkt, &at, in);
}

/* ---- solve_tril -------------------------------------------------------------------------------- */

static dg_dr_shape tril_shape(const piece_attrs *at, dg_tensor *A, dg_tensor *cu) {
    int64_t N;
    const int64_t *c = cu_ptr(cu, &N, A->shape[0]);
    return (dg_dr_shape){.B = A->shape[0],
                         .T = A->shape[1],
                         .H = A->shape[2],
                         .HV = A->shape[2],
                         .K = 1,
                         .V = 1,
                         .cu_seqlens = c,
                         .N = N,
                         .gate = DG_GATE_NONE,
                         .scale = 1,
                         .chunk = at->chunk};
}

static int tril_forward(dg_node *n) {
    const piece_attrs *at = (const piece_attrs *)n->attrs;
    dg_tensor *A = dg_contiguous(n->in[0]), *cu = contig(n->in[1]);
    dg_tensor *Ai = A ? dg_empty_like(A) : NULL;
    if (!Ai || (n->in[1] && !cu)) return -1;
    dg_dr_shape s = tril_shape(at, A, cu);
    int rc = ON_CUDA(A)           ? dg_cuda_solve_tril_fwd(A->dtype, &s, at->blocked, DPTR(A), DPTR(Ai))
             : A->dtype == DG_F32 ? dg_solve_tril_fwd_f32(&s, at->blocked, DPTR(A), DPTR(Ai))
                                  : dg_solve_tril_fwd_f64(&s, at->blocked, DPTR(A), DPTR(Ai));
    n->out[0] = Ai;
    return rc;
}

/* forward: Ainv = (I + A)^-1, so d(Ainv) = -Ainv dA Ainv and dA = -Ainv^T dAinv Ainv^T (strictly
 * lower part).  Ainv is recomputed here by the variant's method rather than saved. */
static int tril_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin, int blocked) {
    const piece_attrs *at = (const piece_attrs *)n->attrs;
    dg_tensor *A = dg_contiguous(n->in[0]), *cu = contig(n->in[1]), *dY = dg_contiguous(gout[0]);
    dg_tensor *Ai = A ? dg_empty_like(A) : NULL, *dA = A ? dg_empty_like(A) : NULL;
    if (!Ai || !dA || !dY) return -1;
    dg_dr_shape s = tril_shape(at, A, cu);
    int rc = ON_CUDA(A)           ? dg_cuda_solve_tril_fwd(A->dtype, &s, blocked, DPTR(A), DPTR(Ai))
             : A->dtype == DG_F32 ? dg_solve_tril_fwd_f32(&s, blocked, DPTR(A), DPTR(Ai))
                                  : dg_solve_tril_fwd_f64(&s, blocked, DPTR(A), DPTR(Ai));
    if (rc == 0)
        rc = ON_CUDA(A)           ? dg_cuda_solve_tril_bwd(A->dtype, &s, DPTR(Ai), DPTR(dY), DPTR(dA))
             : A->dtype == DG_F32 ? dg_solve_tril_bwd_f32(&s, DPTR(Ai), DPTR(dY), DPTR(dA))
                                  : dg_solve_tril_bwd_f64(&s, DPTR(Ai), DPTR(dY), DPTR(dA));
    gin[0] = dA;
    return rc;
}
static int tril_bwd_blocked(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    return tril_backward(n, gout, gin, 1);
}
static int tril_bwd_subst(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    return tril_backward(n, gout, gin, 0);
}

/* A: strictly lower entries in (-0.2, 0.2) (what solve_tril reads); the rest is ignored */
static int tril_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    dg_rng rng = dg_rng_new(seed);
    piece_attrs at = {.chunk = 16, .blocked = 1};
    dg_tensor *A, *cu = NULL;
    switch (index) {
    case 0: A = dg_rand_range(DG_SHAPE(1, 20, 2, 16), dt, -0.2, 0.2, &rng); break;
    case 1: {
        int64_t c[3] = {0, 9, 45};
        A = dg_rand_range(DG_SHAPE(1, 45, 1, 32), dt, -0.2, 0.2, &rng);
        cu = dg_from_data(DG_SHAPE(3), DG_I64, c);
        at.chunk = 32;
        at.blocked = 0;
        break;
    }
    case 2: A = dg_rand_range(DG_SHAPE(1, 64, 1, 64), dt, -0.1, 0.1, &rng), at.chunk = 64; break;
    default: return 0;
    }
    dg_sample_set(s, 0, A, true);
    if (cu) dg_sample_set(s, 1, cu, false);
    memcpy(s->attrs, &at, sizeof at);
    snprintf(s->label, sizeof s->label, "A %s chunk %d %s%s", dg_shp(A), at.chunk,
             at.blocked ? "blocked" : "substitution", cu ? ", varlen {0,9,45}" : "");
    return 1;
}

const dg_op_def dg_op_solve_tril = {.name = "solve_tril",
                                    .n_in = 2,
                                    .n_out = 1,
                                    .in_names = {"A", "cu_seqlens"},
                                    .out_names = {"Ainv"},
                                    .attrs_size = sizeof(piece_attrs),
                                    .forward = tril_forward,
                                    .bwd = {{"blocked", tril_bwd_blocked}, {"subst", tril_bwd_subst}},
                                    .sample = tril_sample,
                                    .atol_f64 = 1e-7,
                                    .rtol_f64 = 1e-6,
                                    .atol_f32 = 1e-5,
                                    .rtol_f32 = 1e-4};

dg_tensor *dg_solve_tril(dg_tensor *A, int chunk_size, dg_tensor *cu_seqlens, bool blocked) {
    const char *op = "solve_tril";
    if (!dg_check_float(op, "A", A) || !dg_check_ndim(op, "A", A, 4)) return NULL;
    int64_t N;
    if (!check_chunk(op, chunk_size) || (cu_seqlens && !dg_delta_check_cu(op, cu_seqlens, "A", A, &N))) return NULL;
    if (A->shape[3] != chunk_size) {
        dg_error("%s: A has shape %s but its last dim must be the chunk size %d ([B,T,HV,C])", op, dg_shp(A),
                 chunk_size);
        return NULL;
    }
    piece_attrs at = {.chunk = chunk_size, .blocked = blocked};
    dg_tensor *in[2] = {A, cu_seqlens};
    /* the backward recomputes the inverse by the forward's method unless DG_BACKWARD says otherwise */
    int variant = -1;
    const char *env = getenv("DG_BACKWARD");
    if (!env || !strstr(env, "solve_tril:")) variant = blocked ? 0 : 1;
    dg_tensor *out[1] = {NULL};
    return dg_apply(&dg_op_solve_tril, &at, in, out, variant) == 0 ? out[0] : NULL;
}
