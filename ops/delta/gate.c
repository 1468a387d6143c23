/* gdn_gate and kda_gate: the decay of Gated DeltaNet and KDA from its raw projection,
 *   g = -exp(A_log) * softplus(a + dt_bias)          (softplus(x) = x above 20, as FLA)
 * gdn_gate: a [B,T,HV], A_log [HV], dt_bias [HV] or NULL                -> g [B,T,HV]
 * kda_gate: a [B,T,HV,K], A_log [HV] (broadcast over K), dt_bias [HV*K] -> g [B,T,HV,K]
 * Backward (kernels/cpu/delta/gate.c): da = dg (-exp(A_log)) softplus'(x), dA_log = sum dg g,
 * ddt_bias = sum over tokens of da.  CPU (kernels/cpu/delta/gate.c) or CUDA (kernels/cuda/delta/dr_pieces.cu),
 * f32 and f64, through delta_kernels.c.  The same kernels run inside gated_delta_rule / kda when
 * use_gate_in_kernel is set; these ops are the separate path the model can take instead. */
#include "ops/delta/delta_common.h"

#include <string.h>

typedef struct gate_attrs {
    int channel; /* 0: GDN (C = 1), 1: KDA (C = K, the last dim of a) */
} gate_attrs;

#define DPTR(t) ((t) ? dg_data_ptr(t) : NULL)

static void gate_dims(const dg_tensor *a, int channel, int64_t *rows, int64_t *HV, int64_t *C) {
    *rows = a->shape[0] * a->shape[1];
    *HV = a->shape[2];
    *C = channel ? a->shape[3] : 1;
}

static int gate_forward(dg_node *n) {
    const gate_attrs *at = (const gate_attrs *)n->attrs;
    dg_tensor *a = dg_contiguous(n->in[0]), *A = dg_contiguous(n->in[1]);
    dg_tensor *b = n->in[2] ? dg_contiguous(n->in[2]) : NULL;
    dg_tensor *g = a ? dg_empty_like(a) : NULL;
    if (!a || !A || (n->in[2] && !b) || !g) return -1;
    int64_t rows, HV, C;
    gate_dims(a, at->channel, &rows, &HV, &C);
    if (dg_delta_k_gate_fwd(n->op->name, a->device, a->dtype, rows, HV, C, DPTR(a), DPTR(A), DPTR(b), DPTR(g)))
        return -1;
    n->out[0] = g;
    return 0;
}

static int gate_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    const gate_attrs *at = (const gate_attrs *)n->attrs;
    dg_tensor *a = dg_contiguous(n->in[0]), *A = dg_contiguous(n->in[1]);
    dg_tensor *b = n->in[2] ? dg_contiguous(n->in[2]) : NULL;
    dg_tensor *dy = dg_contiguous(gout[0]);
    if (!a || !A || (n->in[2] && !b) || !dy) return -1;
    dg_tensor *da = n->needs_grad[0] ? dg_empty_like(a) : NULL;
    dg_tensor *dA = n->needs_grad[1] ? dg_empty_like(A) : NULL;
    dg_tensor *db = b && n->needs_grad[2] ? dg_empty_like(b) : NULL;
    if ((n->needs_grad[0] && !da) || (n->needs_grad[1] && !dA) || (b && n->needs_grad[2] && !db)) return -1;
    int64_t rows, HV, C;
    gate_dims(a, at->channel, &rows, &HV, &C);
    if (dg_delta_k_gate_bwd(n->op->name, a->device, a->dtype, rows, HV, C, DPTR(a), DPTR(A), DPTR(b), DPTR(dy),
                            DPTR(da), DPTR(dA), DPTR(db)))
        return -1;
    gin[0] = da;
    gin[1] = dA;
    gin[2] = db;
    return 0;
}

/* the same function from primitives: -exp(A_log) * softplus(a + dt_bias) */
static int gate_decompose(const void *attrs, dg_tensor *const *in, dg_tensor **out) {
    const gate_attrs *at = (const gate_attrs *)attrs;
    dg_tensor *a = in[0], *A = in[1], *b = in[2];
    if (at->channel) {
        const int64_t HV = a->shape[2], K = a->shape[3];
        A = dg_reshape(A, DG_SHAPE(HV, 1));
        if (b) b = dg_reshape(b, DG_SHAPE(HV, K));
    }
    dg_tensor *x = b ? dg_add(a, b) : a;
    out[0] = dg_mul(dg_neg(dg_exp(A)), dg_softplus(x));
    return out[0] ? 0 : -1;
}

static dg_tensor *gate_call(const dg_op_def *def, int channel, dg_tensor *a, dg_tensor *A_log, dg_tensor *dt_bias) {
    const char *op = def->name;
    if (!dg_check_float(op, "a", a) || !dg_check_float(op, "A_log", A_log)) return NULL;
    if (!dg_check_same_dtype(op, "A_log", A_log, "a", a) || !dg_check_same_device(op, "A_log", A_log, "a", a))
        return NULL;
    if (dt_bias && (!dg_check_float(op, "dt_bias", dt_bias) || !dg_check_same_dtype(op, "dt_bias", dt_bias, "a", a) ||
                    !dg_check_same_device(op, "dt_bias", dt_bias, "a", a)))
        return NULL;
    if (a->ndim != (channel ? 4 : 3)) {
        dg_error("%s: a has shape %s but %s is required", op, dg_shp(a), channel ? "[B,T,HV,K]" : "[B,T,HV]");
        return NULL;
    }
    const int64_t HV = a->shape[2], C = channel ? a->shape[3] : 1;
    if (A_log->ndim != 1 || A_log->shape[0] != HV) {
        dg_error("%s: A_log has shape %s but [HV] = [%lld] is required (a %s)", op, dg_shp(A_log), (long long)HV,
                 dg_shp(a));
        return NULL;
    }
    if (dt_bias && (dt_bias->ndim != 1 || dt_bias->shape[0] != HV * C)) {
        dg_error("%s: dt_bias has shape %s but %s = [%lld] is required (a %s)", op, dg_shp(dt_bias),
                 channel ? "[HV*K]" : "[HV]", (long long)(HV * C), dg_shp(a));
        return NULL;
    }
    gate_attrs at = {channel};
    dg_tensor *in[3] = {a, A_log, dt_bias};
    return dg_apply1(def, &at, in);
}

/* a spans (-6, 6) around the bias, and one sample pushes a + dt_bias past the softplus threshold */
static int gate_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s, int channel) {
    dg_rng rng = dg_rng_new(seed);
    int64_t B, T, HV, K = 1;
    bool bias = true;
    double lo = -6, hi = 6;
    switch (index) {
    case 0: B = 2, T = 3, HV = 2, K = 3; break;
    case 1: B = 1, T = 9, HV = 3, K = 4; break;
    case 2: B = 1, T = 4, HV = 2, K = 2, bias = false; break;
    case 3: B = 1, T = 3, HV = 1, K = 2, lo = 21, hi = 30; break; /* softplus(x) = x */
    default: return 0;
    }
    dg_tensor *a = channel ? dg_rand_range(DG_SHAPE(B, T, HV, K), dt, lo, hi, &rng)
                           : dg_rand_range(DG_SHAPE(B, T, HV), dt, lo, hi, &rng);
    dg_sample_set(s, 0, a, true);
    dg_sample_set(s, 1, dg_rand_range(DG_SHAPE(HV), dt, -1, 1.5, &rng), true);
    if (bias) dg_sample_set(s, 2, dg_rand_range(DG_SHAPE(channel ? HV * K : HV), dt, -1, 0.5, &rng), true);
    gate_attrs at = {channel};
    memcpy(s->attrs, &at, sizeof at);
    snprintf(s->label, sizeof s->label, "a %s%s%s", dg_shp(a), bias ? "" : ", no dt_bias",
             lo > 20 ? ", a + dt_bias > 20" : "");
    return 1;
}

static int gdn_sample(int i, dg_dtype dt, uint64_t seed, dg_sample *s) { return gate_sample(i, dt, seed, s, 0); }
static int kda_sample(int i, dg_dtype dt, uint64_t seed, dg_sample *s) { return gate_sample(i, dt, seed, s, 1); }

const dg_op_def dg_op_gdn_gate = {.name = "gdn_gate",
                                  .n_in = 3,
                                  .n_out = 1,
                                  .in_names = {"a", "A_log", "dt_bias"},
                                  .out_names = {"g"},
                                  .attrs_size = sizeof(gate_attrs),
                                  .forward = gate_forward,
                                  .bwd = {{"default", gate_backward}},
                                  .decompose = gate_decompose,
                                  .sample = gdn_sample,
                                  .atol_f64 = 1e-7,
                                  .rtol_f64 = 1e-6,
                                  .atol_f32 = 1e-5,
                                  .rtol_f32 = 1e-4};

const dg_op_def dg_op_kda_gate = {.name = "kda_gate",
                                  .n_in = 3,
                                  .n_out = 1,
                                  .in_names = {"a", "A_log", "dt_bias"},
                                  .out_names = {"g"},
                                  .attrs_size = sizeof(gate_attrs),
                                  .forward = gate_forward,
                                  .bwd = {{"default", gate_backward}},
                                  .decompose = gate_decompose,
                                  .sample = kda_sample,
                                  .atol_f64 = 1e-7,
                                  .rtol_f64 = 1e-6,
                                  .atol_f32 = 1e-5,
                                  .rtol_f32 = 1e-4};

dg_tensor *dg_gdn_gate(dg_tensor *a, dg_tensor *A_log, dg_tensor *dt_bias) {
    return gate_call(&dg_op_gdn_gate, 0, a, A_log, dt_bias);
}
dg_tensor *dg_kda_gate(dg_tensor *a, dg_tensor *A_log, dg_tensor *dt_bias) {
    return gate_call(&dg_op_kda_gate, 1, a, A_log, dt_bias);
}
