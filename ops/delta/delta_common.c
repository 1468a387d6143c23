/* The delta-rule family's shared op machinery (see delta_common.h): validation of the typed entry
 * points, and the forward and backward that prepare contiguous inputs, apply the fused L2 norm and
 * gate, describe the call (dg_delta_call) and run it on the first backend that accepts it
 * (delta_backends.c). */
#include "ops/delta/delta_common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const dg_delta_slots dg_delta_slots_plain = {
    .q = 0, .k = 1, .v = 2, .g = -1, .beta = 3, .h0 = 4, .A_log = -1, .dt_bias = -1, .cu = 5, .n_in = 6};
const dg_delta_slots dg_delta_slots_gated = {
    .q = 0, .k = 1, .v = 2, .g = 3, .beta = 4, .h0 = 5, .A_log = 6, .dt_bias = 7, .cu = 8, .n_in = 9};

const dg_delta_variants *dg_delta_variants_of(const char *op) {
    const dg_delta_gate *gt = dg_delta_gate_of_op(op);
    return gt ? gt->variants : NULL;
}

/* ---- validation ------------------------------------------------------------------------------ */

static bool same_shape4(const dg_tensor *t, int nd, const int64_t *want) {
    if (t->ndim != nd) return false;
    for (int d = 0; d < nd; d++)
        if (t->shape[d] != want[d]) return false;
    return true;
}

/* "{0,5,19}" (the first 12 values) */
static const char *values_text(const int64_t *c, int64_t n, char *buf, size_t len) {
    size_t at = 0;
    at += (size_t)snprintf(buf + at, len - at, "{");
    for (int64_t i = 0; i < n && i < 12 && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%lld", i ? "," : "", (long long)c[i]);
    if (at < len) snprintf(buf + at, len - at, "%s}", n > 12 ? ",..." : "");
    return buf;
}

/* q: f32 or f64, or bf16 / f16 on cuda (f64 on cuda is refused: no device kernel) */
static bool check_q(const char *op, const dg_tensor *q) {
    if (!dg_check_not_null(op, "q", q)) return false;
    if (!dg_delta_storage16(q->dtype) && !dg_check_float(op, "q", q)) return false;
    if (dg_delta_dtype_ok(op, q->device, q->dtype)) return true;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", dg_last_error());
    dg_error("%s (q is %s %s on %s)", msg, dg_shp(q), dg_dtype_name(q->dtype), dg_device_name(q->device));
    return false;
}

/* k, v, beta: q's dtype and device */
static bool check_other(const char *op, const char *arg, const dg_tensor *t, const dg_tensor *q) {
    if (!dg_check_not_null(op, arg, t)) return false;
    return dg_check_same_dtype(op, arg, t, "q", q) && dg_check_same_device(op, arg, t, "q", q);
}

/* g, initial_state, A_log, dt_bias: q's dtype, or f32 when q is bf16 / f16 (gates and states stay
 * f32) */
static bool check_state(const char *op, const char *arg, const dg_tensor *t, const dg_tensor *q) {
    if (!dg_check_not_null(op, arg, t)) return false;
    if (dg_delta_storage16(q->dtype)) {
        if (t->dtype != DG_F32) {
            dg_error("%s: %s has dtype %s (shape %s) but q is %s %s: gates and states must be f32", op, arg,
                     dg_dtype_name(t->dtype), dg_shp(t), dg_dtype_name(q->dtype), dg_shp(q));
            return false;
        }
        return dg_check_same_device(op, arg, t, "q", q);
    }
    return check_other(op, arg, t, q);
}

/* cu_seqlens: i64 [N+1], B = 1, starts at 0, never decreases, ends at T (ref is [B,T,...]). */
bool dg_delta_check_cu(const char *op, const dg_tensor *cu, const char *ref_name, const dg_tensor *q, int64_t *N) {
    if (!dg_check_dtype(op, "cu_seqlens", cu, DG_I64) || !dg_check_ndim(op, "cu_seqlens", cu, 1)) return false;
    const int64_t n = cu->shape[0], B = q->shape[0], T = q->shape[1];
    if (n < 2) {
        dg_error("%s: cu_seqlens has shape %s but needs at least 2 offsets (one sequence)", op, dg_shp(cu));
        return false;
    }
    if (B != 1) {
        dg_error("%s: cu_seqlens %s is given but %s has shape %s with B = %lld; packed sequences "
                 "need B = 1",
                 op, dg_shp(cu), ref_name, dg_shp(q), (long long)B);
        return false;
    }
    int64_t *c = malloc(sizeof(int64_t) * (size_t)n);
    if (!c || dg_copy_to_host(cu, c) != 0) {
        free(c);
        dg_error("%s: cannot read cu_seqlens %s", op, dg_shp(cu));
        return false;
    }
    char buf[256];
    bool ok = true;
    if (c[0] != 0) {
        dg_error("%s: cu_seqlens %s = %s must start at 0", op, dg_shp(cu), values_text(c, n, buf, sizeof buf));
        ok = false;
    }
    for (int64_t i = 1; ok && i < n; i++)
        if (c[i] < c[i - 1]) {
            dg_error("%s: cu_seqlens %s = %s decreases at index %lld (%lld -> %lld)", op, dg_shp(cu),
                     values_text(c, n, buf, sizeof buf), (long long)i, (long long)c[i - 1], (long long)c[i]);
            ok = false;
        }
    if (ok && c[n - 1] != T) {
        dg_error("%s: cu_seqlens %s = %s must end at T = %lld, the tokens of %s %s", op, dg_shp(cu),
                 values_text(c, n, buf, sizeof buf), (long long)T, ref_name, dg_shp(q));
        ok = false;
    }
    free(c);
    *N = n - 1;
    return ok;
}

bool dg_delta_validate(const char *op, dg_gate_kind gate, dg_tensor *q, dg_tensor *k, dg_tensor *v, dg_tensor *g,
                       dg_tensor *beta, const dg_delta_opts *opts, dg_delta_attrs *at, int64_t *N) {
    static const dg_delta_opts defaults = {0};
    if (!opts) opts = &defaults;
    const dg_delta_gate *gt = dg_delta_gate_of(gate);
    if (!gt) {
        dg_error("%s: unknown gate kind %d", op, (int)gate);
        return false;
    }
    if (!check_q(op, q)) return false;
    if (!check_other(op, "k", k, q) || !check_other(op, "v", v, q) || !check_other(op, "beta", beta, q)) return false;
    if (gt->gated && !check_state(op, "g", g, q)) return false;
    if (!dg_check_ndim(op, "q", q, 4) || !dg_check_ndim(op, "v", v, 4)) return false;
    if (!dg_same_shape(k, q)) {
        dg_error("%s: k has shape %s but q has %s", op, dg_shp(k), dg_shp(q));
        return false;
    }
    const int64_t B = q->shape[0], T = q->shape[1], H = q->shape[2], K = q->shape[3];
    if (v->shape[0] != B || v->shape[1] != T) {
        dg_error("%s: v has shape %s but q has %s (B and T must match)", op, dg_shp(v), dg_shp(q));
        return false;
    }
    const int64_t HV = v->shape[2], V = v->shape[3];
    if (T < 1 || H < 1 || K < 1 || V < 1) {
        dg_error("%s: q has shape %s and v %s; T, H, K and V must be at least 1", op, dg_shp(q), dg_shp(v));
        return false;
    }
    if (HV < H || HV % H != 0) {
        dg_error("%s: v has shape %s with HV = %lld value heads, which is not a multiple of the H = "
                 "%lld heads of q %s",
                 op, dg_shp(v), (long long)HV, (long long)H, dg_shp(q));
        return false;
    }
    const int64_t bshape[3] = {B, T, HV};
    if (!same_shape4(beta, 3, bshape)) {
        dg_error("%s: beta has shape %s but [B,T,HV] = %s is required (q %s, v %s)", op, dg_shp(beta),
                 dg_shape_text(3, bshape), dg_shp(q), dg_shp(v));
        return false;
    }
    if (gt->gated) {
        const int64_t gshape[4] = {B, T, HV, K};
        const int gnd = dg_delta_gate_ndim(gt);
        if (!same_shape4(g, gnd, gshape)) {
            dg_error("%s: g has shape %s but %s = %s is required (q %s, v %s)", op, dg_shp(g),
                     dg_delta_gate_shape_text(gt), dg_shape_text(gnd, gshape), dg_shp(q), dg_shp(v));
            return false;
        }
    }
    /* options */
    int chunk = opts->chunk_size ? opts->chunk_size : 64;
    if (chunk != 16 && chunk != 32 && chunk != 64) {
        dg_error("%s: chunk_size %d is not supported (16, 32 or 64)", op, opts->chunk_size);
        return false;
    }
    if (opts->algorithm != DG_DELTA_CHUNKED && opts->algorithm != DG_DELTA_RECURRENT) {
        dg_error("%s: algorithm %d is not one of DG_DELTA_CHUNKED, DG_DELTA_RECURRENT", op, (int)opts->algorithm);
        return false;
    }
    double scale = opts->scale == 0 ? 1.0 / sqrt((double)K) : opts->scale;
    if (!isfinite(scale)) {
        dg_error("%s: scale %g is not finite", op, opts->scale);
        return false;
    }
    if (opts->use_gate_in_kernel) {
        if (!gt->gate_op) {
            dg_error("%s: use_gate_in_kernel is set but %s has no gate", op, op);
            return false;
        }
        if (!dg_check_not_null(op, "A_log (required by use_gate_in_kernel)", opts->A_log) ||
            !check_state(op, "A_log", opts->A_log, q))
            return false;
        const int64_t ashape[1] = {HV};
        if (!same_shape4(opts->A_log, 1, ashape)) {
            dg_error("%s: A_log has shape %s but [HV] = %s is required (v %s)", op, dg_shp(opts->A_log),
                     dg_shape_text(1, ashape), dg_shp(v));
            return false;
        }
        if (opts->dt_bias) {
            if (!check_state(op, "dt_bias", opts->dt_bias, q)) return false;
            const int64_t dshape[1] = {HV * dg_delta_gate_width(gt, K)};
            if (!same_shape4(opts->dt_bias, 1, dshape)) {
                dg_error("%s: dt_bias has shape %s but %s = %s is required (q %s, v %s)", op, dg_shp(opts->dt_bias),
                         gt->per_channel ? "[HV*K]" : "[HV]", dg_shape_text(1, dshape), dg_shp(q), dg_shp(v));
                return false;
            }
        }
    } else if (opts->A_log || opts->dt_bias) {
        dg_error("%s: %s given (shape %s) but use_gate_in_kernel is not set", op, opts->A_log ? "A_log" : "dt_bias",
                 dg_shp(opts->A_log ? opts->A_log : opts->dt_bias));
        return false;
    }
    *N = B;
    if (opts->cu_seqlens && !dg_delta_check_cu(op, opts->cu_seqlens, "q", q, N)) return false;
    if (opts->initial_state) {
        if (!check_state(op, "initial_state", opts->initial_state, q)) return false;
        const int64_t hshape[4] = {*N, HV, K, V};
        if (!same_shape4(opts->initial_state, 4, hshape)) {
            dg_error("%s: initial_state has shape %s but [N,HV,K,V] = %s is required (N = %lld %s; q %s, v %s)", op,
                     dg_shp(opts->initial_state), dg_shape_text(4, hshape), (long long)*N,
                     opts->cu_seqlens ? "sequences in cu_seqlens" : "batch size", dg_shp(q), dg_shp(v));
            return false;
        }
    }
    memset(at, 0, sizeof *at);
    at->gate = gate;
    at->scale = scale;
    at->chunk = chunk;
    at->algorithm = opts->algorithm;
    at->l2norm_qk = opts->use_qk_l2norm_in_kernel;
    at->gate_in_kernel = opts->use_gate_in_kernel;
    at->keep_forward = !opts->recompute_in_backward;
    at->no_final_state = !opts->output_final_state;
    return true;
}

/* ---- preparation shared by forward and backward ----------------------------------------------- */

typedef struct prep {
    dg_dr_shape s;
    dg_device dev;
    dg_dtype dt;            /* storage dtype of q, k, v, beta, o: f32 / f64, or bf16 / f16 on cuda */
    dg_dtype st;            /* dtype of the gates and states: dt, or f32 with bf16 / f16 storage */
    dg_tensor *q, *k;       /* what the kernel reads (normalised when l2norm_qk) */
    dg_tensor *qraw, *kraw; /* contiguous inputs */
    dg_tensor *rq, *rk;     /* 1/|q|, 1/|k| per row (l2norm_qk), dtype st */
    dg_tensor *v, *beta, *h0;
    dg_tensor *g;                   /* the log decay the kernel reads */
    dg_tensor *a, *A_log, *dt_bias; /* gate_in_kernel: raw a (the g input) and the parameters */
    int64_t gate_c;                 /* gate values per token and value head: 0, 1 (GDN) or K (KDA) */
} prep;

#define DPTR(t) ((t) ? dg_data_ptr(t) : NULL)

/* The call descriptor's fields that forward and backward both take from the prepared inputs: the
 * shape, dtypes, device, algorithm, q k v g beta h0 and the L2 norm's row scales; each adds its own
 * outputs (and the backward its flags and gradients). */
static dg_delta_call call_on(const prep *p, const char *op, dg_delta_algorithm algorithm, bool l2norm_qk) {
    return (dg_delta_call){.op = op,
                           .s = p->s,
                           .dtype = p->dt,
                           .device = p->dev,
                           .algorithm = algorithm,
                           .q = DPTR(p->q),
                           .k = DPTR(p->k),
                           .v = DPTR(p->v),
                           .g = DPTR(p->g),
                           .beta = DPTR(p->beta),
                           .h0 = DPTR(p->h0),
                           .l2 = {.on = l2norm_qk, .rq = DPTR(p->rq), .rk = DPTR(p->rk)}};
}

static dg_tensor *in_at(dg_node *n, int slot) { return slot >= 0 ? n->in[slot] : NULL; }

static dg_tensor *contig(dg_tensor *t) { return t ? dg_contiguous(t) : NULL; }

/* every input on q's device, in the dtypes the kernels take (the typed entry point checked this;
 * ops applied from the registry come here unchecked) */
static bool prep_check(dg_node *n, const dg_delta_slots *sl, dg_device dev, dg_dtype dt, dg_dtype st) {
    const char *op = n->op->name;
    if (!dg_delta_dtype_ok(op, dev, dt)) return false;
    for (int i = 0; i < sl->n_in; i++) {
        const dg_tensor *t = n->in[i];
        if (!t || i == sl->cu) continue;
        const bool storage = i == sl->q || i == sl->k || i == sl->v || i == sl->beta;
        const dg_dtype want = storage ? dt : st;
        if (t->device != dev || t->dtype != want) {
            dg_error("%s: input '%s' %s is %s on %s but %s on %s is required (q is %s on %s)", op, n->op->in_names[i],
                     dg_shp(t), dg_dtype_name(t->dtype), dg_device_name(t->device), dg_dtype_name(want),
                     dg_device_name(dev), dg_dtype_name(dt), dg_device_name(dev));
            return false;
        }
    }
    return true;
}

/* What the forward saves for the backward (node->saved) when it keeps its work (recording, and
 * keep_forward): every slot, NULL where there is nothing: the chunked kernels' working set (CUDA,
 * 16-bit storage, dr_chunk_cuda.h), and the fused preprocessing's results, so that the backward
 * does not make them again: the normalised q, k and their 1/|x| (use_qk_l2norm_in_kernel), the
 * gate (use_gate_in_kernel).  The backward then reads the same bits the forward used. */
enum { SAVED_KEEP, SAVED_Q, SAVED_K, SAVED_RQ, SAVED_RK, SAVED_G, SAVED_N };

static bool saved_work(const dg_node *n) { return n->n_saved == SAVED_N; }

/* norm: run the L2 norm of q, k here (use_qk_l2norm_in_kernel); false: only make room for its
 * results (p->q, p->k, p->rq, p->rk), the forward fills them (dg_delta_call.l2) */
static int prep_inputs(dg_node *n, const dg_delta_slots *sl, prep *p, bool norm) {
    const dg_delta_attrs *at = (const dg_delta_attrs *)n->attrs;
    const bool saved = saved_work(n); /* the backward of a forward that kept its work */
    const char *op = n->op->name;
    memset(p, 0, sizeof *p);
    p->dev = n->in[sl->q]->device;
    p->dt = n->in[sl->q]->dtype;
    p->st = dg_delta_storage16(p->dt) ? DG_F32 : p->dt;
    if (!prep_check(n, sl, p->dev, p->dt, p->st)) return -1;
    p->qraw = contig(n->in[sl->q]);
    p->kraw = contig(n->in[sl->k]);
    p->v = contig(n->in[sl->v]);
    p->beta = contig(n->in[sl->beta]);
    p->h0 = contig(n->in[sl->h0]);
    dg_tensor *gin = contig(in_at(n, sl->g));
    /* the kernels take cu_seqlens as a host array */
    dg_tensor *cu = in_at(n, sl->cu);
    if (cu) cu = contig(cu->device == DG_CPU ? cu : dg_to_device(cu, DG_CPU));
    if (!p->qraw || !p->kraw || !p->v || !p->beta || (in_at(n, sl->cu) && !cu)) return -1;
    const int64_t B = p->qraw->shape[0], T = p->qraw->shape[1], H = p->qraw->shape[2];
    const int64_t K = p->qraw->shape[3], HV = p->v->shape[2], V = p->v->shape[3];
    p->s = (dg_dr_shape){.B = B,
                         .T = T,
                         .H = H,
                         .HV = HV,
                         .K = K,
                         .V = V,
                         .cu_seqlens = cu ? dg_data_ptr(cu) : NULL,
                         .N = cu ? cu->shape[0] - 1 : B,
                         .gate = at->gate,
                         .scale = at->scale,
                         .chunk = at->chunk};
    if (at->l2norm_qk && saved) {
        p->q = n->saved[SAVED_Q], p->k = n->saved[SAVED_K];
        p->rq = n->saved[SAVED_RQ], p->rk = n->saved[SAVED_RK];
    } else if (at->l2norm_qk) {
        const int64_t rows = B * T * H;
        p->q = dg_empty_like(p->qraw);
        p->k = dg_empty_like(p->kraw);
        p->rq = dg_empty_on(DG_SHAPE(rows), p->st, p->dev);
        p->rk = dg_empty_on(DG_SHAPE(rows), p->st, p->dev);
        if (!p->q || !p->k || !p->rq || !p->rk) return -1;
        if (norm && (dg_delta_k_l2norm_fwd(op, p->dev, p->dt, rows, K, DPTR(p->qraw), DPTR(p->q), DPTR(p->rq)) ||
                     dg_delta_k_l2norm_fwd(op, p->dev, p->dt, rows, K, DPTR(p->kraw), DPTR(p->k), DPTR(p->rk))))
            return -1;
    } else {
        p->q = p->qraw;
        p->k = p->kraw;
    }
    p->gate_c = dg_delta_gate_width(dg_delta_gate_of(at->gate), K);
    if (at->gate_in_kernel) {
        p->a = gin;
        p->A_log = contig(n->in[sl->A_log]);
        p->dt_bias = contig(n->in[sl->dt_bias]);
        if (saved) {
            p->g = n->saved[SAVED_G];
        } else {
            p->g = p->a && p->A_log ? dg_empty_like(p->a) : NULL;
            if (!p->g) return -1;
            if (dg_delta_k_gate_fwd(op, p->dev, p->st, B * T, HV, p->gate_c, DPTR(p->a), DPTR(p->A_log),
                                    DPTR(p->dt_bias), DPTR(p->g)))
                return -1;
        }
    } else {
        p->g = gin;
    }
    return 0;
}

/* Whether the kernels skip the final state (dg_delta_attrs.no_final_state).  Only on the CPU: the
 * CUDA rows take NULL hT and dhT too, but they keep making it here, as they are tested. */
static bool skip_final_state(const dg_delta_attrs *at, const prep *p) { return at->no_final_state && p->dev == DG_CPU; }

/* ---- forward ----------------------------------------------------------------------------------- */

int dg_delta_forward(dg_node *n, const dg_delta_slots *sl) {
    const dg_delta_attrs *at = (const dg_delta_attrs *)n->attrs;
    prep p;
    if (prep_inputs(n, sl, &p, false) != 0) return -1;
    const dg_dr_shape *s = &p.s;
    dg_tensor *o = dg_empty_on(DG_SHAPE(s->B, s->T, s->HV, s->V), p.dt, p.dev);
    dg_tensor *hT = dg_empty_on(DG_SHAPE(s->N, s->HV, s->K, s->V), p.st, p.dev);
    if (!o || !hT) return -1;
    const bool save = n->recording && at->keep_forward;
    /* p.q, p.k: the normalised rows, made by the call (q only where the backward will read it) */
    dg_delta_call c = call_on(&p, n->op->name, at->algorithm, at->l2norm_qk);
    c.o = DPTR(o);
    c.hT = skip_final_state(at, &p) ? NULL : DPTR(hT); /* then hT is left unwritten: nothing reads it */
    c.l2.qraw = DPTR(p.qraw);
    c.l2.kraw = DPTR(p.kraw);
    c.l2.for_bwd = save;
    const dg_delta_backend *b = dg_delta_pick(&c);
    if (!b) return -1;
    char note[320];
    if (dg_delta_slow_note(b, &c, note, sizeof note)) dg_note_once(note);
    /* the kernels' working set, kept for the backward (node->saved[SAVED_KEEP]) where they can */
    dg_tensor *keep = NULL;
    if (save) {
        const int64_t bytes = dg_delta_kept_bytes(b, &c);
        if (bytes < 0) return -1;
        if (bytes > 0 && !(keep = dg_empty_on(DG_SHAPE((bytes + 3) / 4), DG_I32, p.dev))) return -1;
        c.keep = DPTR(keep);
    }
    if (dg_delta_fwd(b, &c)) return -1;
    const bool kept = c.kept;
    if (save) {
        dg_tensor *slot[SAVED_N] = {[SAVED_KEEP] = kept ? keep : NULL, [SAVED_G] = at->gate_in_kernel ? p.g : NULL};
        if (at->l2norm_qk) slot[SAVED_Q] = p.q, slot[SAVED_K] = p.k, slot[SAVED_RQ] = p.rq, slot[SAVED_RK] = p.rk;
        for (int i = 0; i < SAVED_N; i++) dg_save(n, slot[i]);
    }
    n->out[0] = o;
    n->out[1] = hT;
    return 0;
}

/* ---- backward ---------------------------------------------------------------------------------- */

static dg_tensor *maybe_empty(bool want, const dg_tensor *like) { return want ? dg_empty_like(like) : NULL; }

int dg_delta_backward(dg_node *n, const dg_delta_slots *sl, const dg_delta_bwd_spec *spec, dg_tensor *const *gout,
                      dg_tensor **gin) {
    const dg_delta_attrs *at = (const dg_delta_attrs *)n->attrs;
    const char *op = n->op->name;
    prep p;
    if (prep_inputs(n, sl, &p, true) != 0) return -1;
    const dg_dr_shape *s = &p.s;
    bool *ng = n->needs_grad;
    const bool want_g = sl->g >= 0 && ng[sl->g];
    const bool want_A = at->gate_in_kernel && ng[sl->A_log];
    const bool want_dt = at->gate_in_kernel && sl->dt_bias >= 0 && n->in[sl->dt_bias] && ng[sl->dt_bias];
    const bool want_h0 = n->in[sl->h0] && ng[sl->h0];
    /* the kernel's dg is needed for the raw a as well as for A_log and dt_bias */
    const bool kern_dg = dg_delta_gate_of(at->gate)->gated && (want_g || want_A || want_dt);
    dg_tensor *dout = contig(gout[0]), *dhT = contig(gout[1]);
    if (!dout || !dhT) return -1;
    /* the forward's kept working set (chunked kernels only; the recurrent variant ignores it) */
    void *kept = saved_work(n) && spec->algo == DG_DELTA_CHUNKED ? DPTR(n->saved[SAVED_KEEP]) : NULL;
    if (dout->dtype != p.dt || dhT->dtype != p.st || dout->device != p.dev || dhT->device != p.dev) {
        dg_error("%s: output gradients %s %s on %s, %s %s on %s do not match the outputs (%s, %s on %s)", op,
                 dg_shp(dout), dg_dtype_name(dout->dtype), dg_device_name(dout->device), dg_shp(dhT),
                 dg_dtype_name(dhT->dtype), dg_device_name(dhT->device), dg_dtype_name(p.dt), dg_dtype_name(p.st),
                 dg_device_name(p.dev));
        return -1;
    }
    dg_tensor *dq = maybe_empty(ng[sl->q], p.q), *dk = maybe_empty(ng[sl->k], p.k);
    dg_tensor *dv = maybe_empty(ng[sl->v], p.v), *dbeta = maybe_empty(ng[sl->beta], p.beta);
    dg_tensor *dg = maybe_empty(kern_dg, p.g), *dh0 = maybe_empty(want_h0, p.h0);
    dg_delta_call c = call_on(&p, op, spec->algo, at->l2norm_qk);
    c.bwd = spec->flags;
    c.dout = DPTR(dout);
    c.dhT = skip_final_state(at, &p) ? NULL : DPTR(dhT); /* the zeros the engine made for the unread hT */
    c.dq = DPTR(dq);
    c.dk = DPTR(dk);
    c.dv = DPTR(dv);
    c.dg = DPTR(dg);
    c.dbeta = DPTR(dbeta);
    c.dh0 = DPTR(dh0);
    c.keep = kept;
    c.kept = kept != NULL;
    if (dg_delta_bwd(NULL, &c)) return -1;
    /* (the 16-bit CUDA chunked kernels took the norm's backward with them: c.l2_done) */
    /* forward: qn = q / sqrt(|q|^2 + eps) (and k); dq = r (dqn - qn (dqn . qn)) */
    if (at->l2norm_qk && !c.l2_done) {
        const int64_t rows = s->B * s->T * s->H;
        dg_tensor *dqr = maybe_empty(dq != NULL, p.qraw), *dkr = maybe_empty(dk != NULL, p.kraw);
        if ((dq && !dqr) || (dk && !dkr)) return -1;
        if (dq && dg_delta_k_l2norm_bwd(op, p.dev, p.dt, rows, s->K, DPTR(p.qraw), DPTR(p.rq), DPTR(dq), DPTR(dqr)))
            return -1;
        if (dk && dg_delta_k_l2norm_bwd(op, p.dev, p.dt, rows, s->K, DPTR(p.kraw), DPTR(p.rk), DPTR(dk), DPTR(dkr)))
            return -1;
        dq = dqr;
        dk = dkr;
    }
    /* forward: g = -exp(A_log) softplus(a + dt_bias); dg above is the gradient of that g */
    if (at->gate_in_kernel && dg) {
        dg_tensor *da = maybe_empty(want_g, p.a);
        dg_tensor *dA = maybe_empty(want_A, p.A_log), *ddt = maybe_empty(want_dt, p.dt_bias);
        if (dg_delta_k_gate_bwd(op, p.dev, p.st, s->B * s->T, s->HV, p.gate_c, DPTR(p.a), DPTR(p.A_log),
                                DPTR(p.dt_bias), DPTR(dg), DPTR(da), DPTR(dA), DPTR(ddt)))
            return -1;
        if (want_A) gin[sl->A_log] = dA;
        if (want_dt) gin[sl->dt_bias] = ddt;
        dg = da;
    }
    if (ng[sl->q]) gin[sl->q] = dq;
    if (ng[sl->k]) gin[sl->k] = dk;
    if (ng[sl->v]) gin[sl->v] = dv;
    if (ng[sl->beta]) gin[sl->beta] = dbeta;
    if (want_g) gin[sl->g] = dg;
    if (want_h0) gin[sl->h0] = dh0;
    for (int i = 0; i < sl->n_in; i++)
        if (ng[i] && i != sl->cu && !gin[i]) {
            dg_error("%s: backward could not make the gradient of input %d '%s'", op, i, n->op->in_names[i]);
            return -1;
        }
    return 0;
}

/* ---- the typed entry points' body -------------------------------------------------------------- */

int dg_delta_recurrent_variant(const dg_op_def *def) { return dg_op_variant_find(def, "recurrent"); }

dg_tensor *dg_delta_run_op(const dg_op_def *def, const dg_delta_slots *sl, dg_gate_kind gate, dg_tensor *q,
                           dg_tensor *k, dg_tensor *v, dg_tensor *g, dg_tensor *beta, const dg_delta_opts *opts,
                           dg_tensor **final_state) {
    static const dg_delta_opts defaults = {0};
    if (final_state) *final_state = NULL;
    if (!opts) opts = &defaults;
    dg_delta_attrs at;
    int64_t N;
    if (!dg_delta_validate(def->name, gate, q, k, v, g, beta, opts, &at, &N)) return NULL;
    int variant = -1;
    if (opts->backward) {
        variant = dg_op_variant_lookup(def, opts->backward, def->name);
        if (variant < 0) return NULL;
    } else {
        const int env = dg_op_env_variant(def);
        if (env == -2) return NULL;
        /* resolved here, so that dg_apply does not read DG_BACKWARD a second time */
        if (env >= 0) variant = env;
        else if (at.algorithm == DG_DELTA_RECURRENT) variant = dg_delta_recurrent_variant(def);
        else variant = 0;
    }
    dg_tensor *in[DG_MAX_IO] = {0};
    in[sl->q] = q;
    in[sl->k] = k;
    in[sl->v] = v;
    if (sl->g >= 0) in[sl->g] = g;
    in[sl->beta] = beta;
    in[sl->h0] = opts->initial_state;
    if (sl->A_log >= 0) in[sl->A_log] = opts->A_log;
    if (sl->dt_bias >= 0) in[sl->dt_bias] = opts->dt_bias;
    in[sl->cu] = opts->cu_seqlens;
    dg_tensor *out[DG_MAX_IO] = {0};
    if (dg_apply(def, &at, in, out, variant) != 0) return NULL;
    if (final_state && opts->output_final_state) *final_state = out[1];
    return out[0];
}
