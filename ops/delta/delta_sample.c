/* Samples of delta_rule, gated_delta_rule and kda for gradcheck, the comparison and the tests.
 * Small enough for element-wise finite differences, and covering: two plain sizes, grouped value
 * heads, packed sequences (with an empty one), a partial last chunk, T = 1, the L2 norm and the gate
 * inside the op, and the recurrent algorithm.
 *
 * Value ranges keep the recurrence well conditioned: k scaled by 1/sqrt(K) (|k|^2 ~ 1/3) unless
 * the op normalises it, beta in (0.1, 0.9), log decays in (-0.5, -0.01). */
#include "ops/delta/delta_common.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct sample_cfg {
    const char *label;
    int64_t B, T, H, HV, K, V;
    int chunk;
    int algorithm;
    bool h0, l2norm, gate_in_kernel, dt_bias;
    int ncu;
    int64_t cu[6];
    bool gated_only;
} sample_cfg;

static const sample_cfg cfgs[] = {
    {"B2 T8 H2 K4 V3, h0", 2, 8, 2, 2, 4, 3, 16, DG_DELTA_CHUNKED, true, false, false, false, 0, {0}, false},
    {"B1 T20 H1 HV2 (GVA) K5 V4, partial last chunk, h0",
     1,
     20,
     1,
     2,
     5,
     4,
     16,
     DG_DELTA_CHUNKED,
     true,
     false,
     false,
     false,
     0,
     {0},
     false},
    {"varlen cu {0,5,5,19} (empty seq), HV2 K3 V3, h0",
     1,
     19,
     1,
     2,
     3,
     3,
     16,
     DG_DELTA_CHUNKED,
     true,
     false,
     false,
     false,
     4,
     {0, 5, 5, 19},
     false},
    {"T=1 B2 H1 HV2 K4 V2, h0", 2, 1, 1, 2, 4, 2, 16, DG_DELTA_CHUNKED, true, false, false, false, 0, {0}, false},
    {"l2norm in op, B1 T10 H2 K4 V3, no h0",
     1,
     10,
     2,
     2,
     4,
     3,
     16,
     DG_DELTA_CHUNKED,
     false,
     true,
     false,
     false,
     0,
     {0},
     false},
    {"gate in op (A_log, dt_bias), B1 T18 HV2 K3 V2, h0",
     1,
     18,
     1,
     2,
     3,
     2,
     16,
     DG_DELTA_CHUNKED,
     true,
     false,
     true,
     true,
     0,
     {0},
     true},
    {"recurrent algorithm, chunk 32, B1 T7 K3 V3, l2norm, h0",
     1,
     7,
     1,
     1,
     3,
     3,
     32,
     DG_DELTA_RECURRENT,
     true,
     true,
     false,
     false,
     0,
     {0},
     false},
    {"chunk 32, two chunks, B1 T40 K3 V2, varlen {0,33,40}",
     1,
     40,
     1,
     1,
     3,
     2,
     32,
     DG_DELTA_CHUNKED,
     false,
     false,
     false,
     false,
     3,
     {0, 33, 40},
     false},
};
#define N_CFGS ((int)(sizeof cfgs / sizeof cfgs[0]))

int dg_delta_sample(const dg_delta_slots *sl, dg_gate_kind gate, int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    /* the index-th config that applies to this op */
    const dg_delta_gate *gt = dg_delta_gate_of(gate);
    const sample_cfg *c = NULL;
    for (int i = 0, seen = 0; gt && i < N_CFGS; i++) {
        if (cfgs[i].gated_only && !gt->gated) continue;
        if (seen++ == index) {
            c = &cfgs[i];
            break;
        }
    }
    if (!c) return 0;
    dg_rng rng = dg_rng_new(seed);
    const int64_t B = c->B, T = c->T, H = c->H, HV = c->HV, K = c->K, V = c->V;
    const int64_t N = c->ncu ? c->ncu - 1 : B;
    const double ks = c->l2norm ? 1.0 : 1.0 / sqrt((double)K);
    dg_tensor *q = dg_rand_range(DG_SHAPE(B, T, H, K), dt, -1, 1, &rng);
    dg_tensor *k = dg_rand_range(DG_SHAPE(B, T, H, K), dt, -ks, ks, &rng);
    dg_tensor *v = dg_rand_range(DG_SHAPE(B, T, HV, V), dt, -1, 1, &rng);
    dg_tensor *beta = dg_rand_range(DG_SHAPE(B, T, HV), dt, 0.1, 0.9, &rng);
    dg_sample_set(s, sl->q, q, true);
    dg_sample_set(s, sl->k, k, true);
    dg_sample_set(s, sl->v, v, true);
    dg_sample_set(s, sl->beta, beta, true);
    if (gt->gated) {
        const double lo = c->gate_in_kernel ? -2.0 : -0.5, hi = c->gate_in_kernel ? 2.0 : -0.01;
        dg_tensor *g = gt->per_channel ? dg_rand_range(DG_SHAPE(B, T, HV, K), dt, lo, hi, &rng)
                                       : dg_rand_range(DG_SHAPE(B, T, HV), dt, lo, hi, &rng);
        dg_sample_set(s, sl->g, g, true);
        if (c->gate_in_kernel) {
            /* -exp(A_log) softplus(a + b) with A_log in (-2.5, -1), a + b in (-3, 1.5): decays in
             * about (-0.4, -0.004) per token */
            dg_sample_set(s, sl->A_log, dg_rand_range(DG_SHAPE(HV), dt, -2.5, -1.0, &rng), true);
            if (c->dt_bias) {
                const int64_t nb = HV * dg_delta_gate_width(gt, K);
                dg_sample_set(s, sl->dt_bias, dg_rand_range(DG_SHAPE(nb), dt, -1.0, -0.5, &rng), true);
            }
        }
    }
    if (c->h0) dg_sample_set(s, sl->h0, dg_rand_range(DG_SHAPE(N, HV, K, V), dt, -0.5, 0.5, &rng), true);
    if (c->ncu) dg_sample_set(s, sl->cu, dg_from_data(DG_SHAPE(c->ncu), DG_I64, c->cu), false);
    dg_delta_attrs at = {.gate = gate,
                         .scale = 1.0 / sqrt((double)K),
                         .chunk = c->chunk,
                         .algorithm = c->algorithm,
                         .l2norm_qk = c->l2norm,
                         .gate_in_kernel = c->gate_in_kernel};
    memcpy(s->attrs, &at, sizeof at);
    snprintf(s->label, sizeof s->label, "%s", c->label);
    return 1;
}
