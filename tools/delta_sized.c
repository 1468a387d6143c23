/* The delta-rule ops at sizes, through the public API (see delta_sized.h). */
#include "tools/delta_sized.h"

#include <string.h>

typedef enum { GATE_NONE, GATE_HEAD, GATE_CHANNEL } gate_kind;

static gate_kind gate_of(const dg_op_def *def) {
    return strcmp(def->name, "kda") == 0                ? GATE_CHANNEL
           : strcmp(def->name, "gated_delta_rule") == 0 ? GATE_HEAD
                                                        : GATE_NONE;
}

bool dg_delta_sized_op(const dg_op_def *def) {
    return strcmp(def->name, "delta_rule") == 0 || strcmp(def->name, "gated_delta_rule") == 0 ||
           strcmp(def->name, "kda") == 0;
}

bool dg_delta_sized_gated(const dg_op_def *def) { return gate_of(def) != GATE_NONE; }

/* the index of def's input called name, -1 if it has none */
static int slot(const dg_op_def *def, const char *name) {
    for (int k = 0; k < def->n_in; k++)
        if (def->in_names[k] && strcmp(def->in_names[k], name) == 0) return k;
    return -1;
}

static void put(const dg_op_def *def, dg_tensor **in, bool *diff, const char *name, dg_tensor *t, bool d) {
    int k = slot(def, name);
    if (k < 0) return;
    in[k] = t;
    diff[k] = d;
}

/* the packed layout of --varlen: N = 3 sequences in one row of T = B*T tokens */
static void layout(const dg_delta_size *sz, int64_t *N, int64_t *B, int64_t *T) {
    *N = sz->varlen ? 3 : sz->B;
    *B = sz->varlen ? 1 : sz->B;
    *T = sz->varlen ? sz->B * sz->T : sz->T;
}

int dg_delta_sized_inputs(const dg_op_def *def, const dg_delta_size *sz, dg_dtype dt, dg_tensor **in, bool *diff) {
    const gate_kind gate = gate_of(def);
    int64_t N, B, T;
    layout(sz, &N, &B, &T);
    for (int k = 0; k < DG_MAX_IO; k++) in[k] = NULL, diff[k] = false;
    dg_rng r = dg_rng_new(sz->seed);
    dg_tensor *q = dg_randn(DG_SHAPE(B, T, sz->H, sz->K), dt, &r);
    dg_tensor *k = dg_randn(DG_SHAPE(B, T, sz->H, sz->K), dt, &r);
    if (!sz->l2norm_in_kernel) { /* unit keys keep the recurrence stable (beta |k|^2 < 2) */
        q = dg_l2norm(q, 1e-6);
        k = dg_l2norm(k, 1e-6);
    }
    put(def, in, diff, "q", q, true);
    put(def, in, diff, "k", k, true);
    put(def, in, diff, "v", dg_randn(DG_SHAPE(B, T, sz->HV, sz->V), dt, &r), true);
    put(def, in, diff, "beta", dg_sigmoid(dg_randn(DG_SHAPE(B, T, sz->HV), dt, &r)), true);
    if (gate != GATE_NONE) {
        /* a decay near 1: log sigmoid of N(3, 1); with the gate in the op, the raw a ~ N(0, 1) */
        dg_tensor *a = gate == GATE_HEAD ? dg_randn(DG_SHAPE(B, T, sz->HV), dt, &r)
                                         : dg_randn(DG_SHAPE(B, T, sz->HV, sz->K), dt, &r);
        put(def, in, diff, "g", sz->gate_in_kernel ? a : dg_logsigmoid(dg_add_scalar(a, 3.0)), true);
        if (sz->gate_in_kernel) {
            put(def, in, diff, "A_log", dg_log(dg_rand_range(DG_SHAPE(sz->HV), dt, 1.0, 16.0, &r)), true);
            const int64_t nb = gate == GATE_CHANNEL ? sz->HV * sz->K : sz->HV;
            put(def, in, diff, "dt_bias", dg_mul_scalar(dg_randn(DG_SHAPE(nb), dt, &r), 0.5), true);
        }
    }
    if (sz->initial_state)
        put(def, in, diff, "initial_state", dg_mul_scalar(dg_randn(DG_SHAPE(N, sz->HV, sz->K, sz->V), dt, &r), 0.1),
            true);
    if (sz->varlen) { /* three sequences of uneven length, the middle one not a multiple of a chunk */
        int64_t a = T / 4, b = a + T / 2 + 1;
        put(def, in, diff, "cu_seqlens", dg_from_data(DG_SHAPE(4), DG_I64, (int64_t[]){0, a, b, T}), false);
    }
    for (int i = 0; i < def->n_in; i++)
        if (diff[i] && !in[i]) return -1; /* the message of the failed creation stands */
    return dg_has_error() ? -1 : 0;
}

int dg_delta_sized_call(const dg_op_def *def, const dg_delta_size *sz, dg_tensor *const *x, const char *variant,
                        bool gate_separate, dg_tensor **out) {
    const gate_kind gate = gate_of(def);
#define IN(name) (slot(def, name) >= 0 ? x[slot(def, name)] : NULL)
    dg_delta_opts o = {.initial_state = IN("initial_state"),
                       .output_final_state = sz->initial_state,
                       .chunk_size = sz->chunk,
                       .use_qk_l2norm_in_kernel = sz->l2norm_in_kernel,
                       .cu_seqlens = IN("cu_seqlens"),
                       .backward = variant};
    o.algorithm = variant && strcmp(variant, "recurrent") == 0 ? DG_DELTA_RECURRENT : DG_DELTA_CHUNKED;
    dg_tensor *g = IN("g");
    if (sz->gate_in_kernel && gate != GATE_NONE) {
        if (gate_separate)
            g = gate == GATE_HEAD ? dg_gdn_gate(g, IN("A_log"), IN("dt_bias"))
                                  : dg_kda_gate(g, IN("A_log"), IN("dt_bias"));
        else {
            o.use_gate_in_kernel = true;
            o.A_log = IN("A_log");
            o.dt_bias = IN("dt_bias");
        }
    }
    dg_tensor *hT = NULL, **hTp = sz->initial_state ? &hT : NULL;
    out[0] = gate == GATE_NONE   ? dg_delta_rule(IN("q"), IN("k"), IN("v"), IN("beta"), &o, hTp)
             : gate == GATE_HEAD ? dg_gated_delta_rule(IN("q"), IN("k"), IN("v"), g, IN("beta"), &o, hTp)
                                 : dg_kda(IN("q"), IN("k"), IN("v"), g, IN("beta"), &o, hTp);
#undef IN
    out[1] = hT;
    return out[0] && (!sz->initial_state || hT) ? 0 : -1;
}

double dg_delta_sized_io_elems(const dg_op_def *def, const dg_delta_size *sz) {
    const double tokens = (double)sz->B * (double)sz->T, H = (double)sz->H, HV = (double)sz->HV, K = (double)sz->K,
                 V = (double)sz->V;
    const gate_kind gate = gate_of(def);
    const double per_token = 2 * H * K + 2 * HV * V + HV + (gate == GATE_HEAD ? HV : gate == GATE_CHANNEL ? HV * K : 0);
    const double states = sz->initial_state ? 2.0 * (sz->varlen ? 3.0 : (double)sz->B) * HV * K * V : 0;
    return tokens * per_token + states;
}

double dg_delta_sized_state_elems(const dg_delta_size *sz) {
    return (double)sz->B * (double)sz->T * (double)sz->HV * (double)sz->K * (double)sz->V;
}
