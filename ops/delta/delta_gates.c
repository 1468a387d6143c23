/* The gate traits of the delta-rule family (delta_gate.h): one row per gate kind. */
#include "ops/delta/delta_gate.h"

#include "ops/delta/delta_common.h"

#include <string.h>

static const dg_delta_gate gates[] = {
    {DG_GATE_NONE, "none", "delta_rule", "S_t = (I - b k k^T) S_{t-1} + b k v^T", false, false, NULL,
     &dg_delta_rule_variants},
    {DG_GATE_HEAD, "head", "gated_delta_rule", "S_t = exp(g_t) (I - b k k^T) S_{t-1} + b k v^T", true, false,
     "gdn_gate", &dg_gated_delta_rule_variants},
    {DG_GATE_CHANNEL, "channel", "kda", "S_t = (I - b k k^T) Diag(exp(g_t)) S_{t-1} + b k v^T", true, true, "kda_gate",
     &dg_kda_variants},
};
enum { N_GATES = sizeof gates / sizeof gates[0] };

int dg_delta_gate_count(void) { return N_GATES; }

const dg_delta_gate *dg_delta_gate_at(int i) { return i >= 0 && i < N_GATES ? &gates[i] : NULL; }

const dg_delta_gate *dg_delta_gate_of(dg_gate_kind kind) {
    for (int i = 0; i < N_GATES; i++)
        if (gates[i].kind == kind) return &gates[i];
    return NULL;
}

const dg_delta_gate *dg_delta_gate_of_op(const char *op) {
    for (int i = 0; op && i < N_GATES; i++)
        if (!strcmp(gates[i].op, op)) return &gates[i];
    return NULL;
}

dg_tensor *dg_delta_gate_decay(const dg_delta_gate *gt, dg_tensor *S, dg_tensor *g_t) {
    if (!gt->gated || !S) return S;
    /* exp(g_t) broadcast over the state's columns V (and, per head, its rows K) */
    const int64_t Bn = S->shape[0], HV = S->shape[1], K = S->shape[2];
    return dg_mul(S, dg_exp(dg_reshape(g_t, DG_SHAPE(Bn, HV, gt->per_channel ? K : 1, 1))));
}
