/* swiglu: y = silu(gate) up, gate and up of one shape (the MLP of GatedDeltaNet's blocks).
 *   dgate = dy up silu'(gate),  silu'(g) = s (1 + g (1 - s)), s = sigmoid(g);   dup = dy silu(gate)
 * Device tensors: kernels/cuda/nn_swiglu.cu (the same math; bf16 too). */
#include "ops/nn_common.h"
#include "kernels/cuda/nn_dispatch.h"

enum { SW_GATE, SW_UP };

#define P(t) ((t) ? dg_data_ptr(t) : NULL)

static int swiglu_forward(dg_node *n) {
    bool fail = false;
    dg_tensor *g = dg_nn_contig(n->in[SW_GATE], &fail), *u = dg_nn_contig(n->in[SW_UP], &fail);
    dg_tensor *y = fail ? NULL : dg_empty_like(g);
    if (!y) return -1;
    int rc = 0;
    NN_CALL(rc, g, swiglu_fwd, dg_numel(g), P(g), P(u), P(y));
    if (rc) return -1;
    n->out[0] = y;
    return 0;
}

static int swiglu_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    bool fail = false;
    dg_tensor *g = dg_nn_contig(n->in[SW_GATE], &fail), *u = dg_nn_contig(n->in[SW_UP], &fail);
    dg_tensor *dy = dg_nn_contig(gout[0], &fail);
    if (fail) return -1;
    dg_tensor *dg = n->needs_grad[SW_GATE] ? dg_empty_like(g) : NULL;
    dg_tensor *du = n->needs_grad[SW_UP] ? dg_empty_like(u) : NULL;
    if ((n->needs_grad[SW_GATE] && !dg) || (n->needs_grad[SW_UP] && !du)) return -1;
    int rc = 0;
    NN_CALL(rc, g, swiglu_bwd, dg_numel(g), P(g), P(u), P(dy), P(dg), P(du));
    if (rc) return -1;
    gin[SW_GATE] = dg;
    gin[SW_UP] = du;
    return 0;
}

dg_tensor *dg_swiglu(dg_tensor *gate, dg_tensor *up) {
    if (!dg_check_float_or_bf16("swiglu", "gate", gate) || !dg_nn_check_like("swiglu", "up", up, "gate", gate))
        return NULL;
    dg_tensor *in[2] = {gate, up};
    return dg_apply1(&dg_op_swiglu, NULL, in);
}

/* Samples: 2-D; 3-D with gate spread wide (|gate| up to ~12, both tails of silu); up stored
 * transposed (non-contiguous). */
static int swiglu_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    dg_rng rng = dg_rng_new(seed);
    dg_tensor *g, *u;
    switch (index) {
    case 0:
        g = DG_SAMPLE_RANDN(&rng, dt, 3, 4);
        u = DG_SAMPLE_RANDN(&rng, dt, 3, 4);
        break;
    case 1:
        g = dg_nn_sample_randn(&rng, dt, DG_SHAPE(2, 3, 5), 4.0);
        u = DG_SAMPLE_RANDN(&rng, dt, 2, 3, 5);
        break;
    case 2:
        g = DG_SAMPLE_RANDN(&rng, dt, 4, 6);
        u = dg_nn_sample_transposed(&rng, dt, DG_SHAPE(4, 6), 1.0);
        break;
    default: return 0;
    }
    snprintf(s->label, sizeof s->label, "gate %s up%s", dg_shp(g), dg_is_contiguous(u) ? "" : " (strided)");
    dg_sample_set(s, SW_GATE, g, true);
    dg_sample_set(s, SW_UP, u, true);
    return 1;
}

const dg_op_def dg_op_swiglu = {.name = "swiglu",
                                .n_in = 2,
                                .n_out = 1,
                                .in_names = {"gate", "up"},
                                .out_names = {"y"},
                                .attrs_size = 0,
                                .forward = swiglu_forward,
                                .bwd = {{"default", swiglu_backward}},
                                .sample = swiglu_sample,
                                .atol_f64 = 1e-7,
                                .rtol_f64 = 1e-6,
                                .atol_f32 = 1e-5,
                                .rtol_f32 = 1e-4};
