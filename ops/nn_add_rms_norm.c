/* add_rms_norm: a block's residual add and the next RMSNorm in one pass over the rows.
 *   h, y [..., D] (the residual stream and what a mixer or MLP adds to it), w [D] or NULL (ones)
 *   r = h + y,   x = r q w,   q = 1/sqrt(mean_d(r^2) + eps)        outputs x (0) and r (1)
 * Forward saves q [N] (f32 for bf16) and its output r, which the backward reads in place of h and
 * y (the tape keeps only shells of those: bwd_skips_in).  Both outputs may carry a gradient; r
 * reaches them both, so
 *   g = dx w,  dr_total = dr + q (g - r c),  c = q^2 sum_d(g_d r_d) / D,   dh = dy = dr_total,
 *   dw = sum_n dx r q
 * (one array serves as dh and dy).  CPU: kernels/cpu/nn_norm_impl.h; device tensors (f32, f64,
 * bf16): kernels/cuda/nn_norm.cu, the rms_norm kernels with the add folded into their row loads. */
#include "ops/nn_common.h"
#include "kernels/cuda/nn_dispatch.h"

typedef struct {
    double eps;
} add_rms_attrs;

enum { ARN_H, ARN_Y, ARN_W };
enum { ARN_OUT_X, ARN_OUT_R };

#define P(t) ((t) ? dg_data_ptr(t) : NULL)

static int add_rms_norm_forward(dg_node *n) {
    const add_rms_attrs *at = (const add_rms_attrs *)n->attrs;
    bool fail = false;
    dg_tensor *h = dg_nn_contig(n->in[ARN_H], &fail), *y = dg_nn_contig(n->in[ARN_Y], &fail);
    dg_tensor *w = dg_nn_contig(n->in[ARN_W], &fail);
    if (fail) return -1;
    int64_t N = dg_nn_rows(h), D = dg_nn_last(h);
    dg_tensor *x = dg_empty_like(h), *r = dg_empty_like(h);
    dg_tensor *rstd = dg_empty_on(1, &N, dg_nn_stat_dtype(h->dtype), h->device);
    if (!x || !r || !rstd) return -1;
    int rc = 0;
    NN_CALL(rc, h, add_rms_norm_fwd, N, D, P(h), P(y), P(w), at->eps, P(x), P(r), P(rstd));
    if (rc) return -1;
    dg_save(n, rstd);
    dg_save(n, r);
    n->out[ARN_OUT_X] = x;
    n->out[ARN_OUT_R] = r;
    return 0;
}

static int add_rms_norm_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    bool fail = false;
    dg_tensor *r = n->saved[1]; /* made contiguous by the forward */
    dg_tensor *w = dg_nn_contig(n->in[ARN_W], &fail);
    dg_tensor *dx = dg_nn_contig(gout[ARN_OUT_X], &fail), *dr = dg_nn_contig(gout[ARN_OUT_R], &fail);
    if (fail) return -1;
    bool want_r = n->needs_grad[ARN_H] || n->needs_grad[ARN_Y];
    dg_tensor *dr_total = want_r ? dg_empty_like(r) : NULL;
    dg_tensor *dw = n->needs_grad[ARN_W] ? dg_empty_like(w) : NULL;
    if ((want_r && !dr_total) || (n->needs_grad[ARN_W] && !dw)) return -1;
    int64_t N = dg_nn_rows(r), D = dg_nn_last(r);
    int rc = 0;
    NN_CALL(rc, r, add_rms_norm_bwd, N, D, P(r), P(w), P(n->saved[0]), P(dx), P(dr), P(dr_total), P(dw));
    if (rc) return -1;
    /* the engine copies a gradient shared between two inputs before it adds anything into it */
    gin[ARN_H] = n->needs_grad[ARN_H] ? dr_total : NULL;
    gin[ARN_Y] = n->needs_grad[ARN_Y] ? dr_total : NULL;
    gin[ARN_W] = dw;
    return 0;
}

dg_tensor *dg_add_rms_norm(dg_tensor *h, dg_tensor *y, dg_tensor *w, double eps, dg_tensor **r_out) {
    const char *op = "add_rms_norm";
    if (r_out) *r_out = NULL;
    if (!dg_nn_check_x(op, "h", h) || !dg_nn_check_eps(op, eps, h)) return NULL;
    if (!dg_nn_check_like(op, "y", y, "h", h)) return NULL;
    if (w && !dg_nn_check_vec(op, "w", w, dg_nn_last(h), "last dim", "h", h)) return NULL;
    add_rms_attrs at = {eps};
    dg_tensor *in[3] = {h, y, w}, *out[2] = {NULL, NULL};
    if (dg_apply(&dg_op_add_rms_norm, &at, in, out, -1) != 0) return NULL;
    if (r_out) *r_out = out[ARN_OUT_R];
    return out[ARN_OUT_X];
}

/* Samples: 2-D with w; 3-D without w; y stored transposed; rows of very different scale (1e-2 to
 * 1e2, so that q varies across rows) where y nearly cancels h in one row. */
static int add_rms_norm_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    dg_rng rng = dg_rng_new(seed);
    dg_tensor *h, *y, *w = NULL;
    add_rms_attrs at = {1e-5};
    switch (index) {
    case 0:
        h = DG_SAMPLE_RANDN(&rng, dt, 3, 8);
        y = DG_SAMPLE_RANDN(&rng, dt, 3, 8);
        w = DG_SAMPLE_RAND(&rng, dt, 0.5, 1.5, 8);
        break;
    case 1:
        h = DG_SAMPLE_RANDN(&rng, dt, 2, 3, 16);
        y = dg_nn_sample_randn(&rng, dt, DG_SHAPE(2, 3, 16), 0.3);
        at.eps = 1e-6;
        break;
    case 2:
        h = DG_SAMPLE_RANDN(&rng, dt, 4, 6);
        y = dg_nn_sample_transposed(&rng, dt, DG_SHAPE(4, 6), 1.0);
        w = DG_SAMPLE_RANDN(&rng, dt, 6);
        break;
    case 3:
        h = DG_SAMPLE_RANDN(&rng, dt, 3, 5);
        y = DG_SAMPLE_RANDN(&rng, dt, 3, 5);
        for (int64_t i = 0; i < 5; i++) {
            double hv = dg_get(h, (int64_t[]){0, i});
            dg_set(h, (int64_t[]){0, i}, hv * 1e-2);
            dg_set(y, (int64_t[]){0, i}, -hv * 0.5e-2);
            dg_set(h, (int64_t[]){2, i}, dg_get(h, (int64_t[]){2, i}) * 1e2);
        }
        w = DG_SAMPLE_RANDN(&rng, dt, 5);
        break;
    default: return 0;
    }
    snprintf(s->label, sizeof s->label, "h %s y%s%s eps %g", dg_shp(h), dg_is_contiguous(y) ? "" : " (strided)",
             w ? " w" : " no w", at.eps);
    dg_sample_set(s, ARN_H, h, true);
    dg_sample_set(s, ARN_Y, y, true);
    dg_sample_set(s, ARN_W, w, true);
    memcpy(s->attrs, &at, sizeof at);
    return 1;
}

const dg_op_def dg_op_add_rms_norm = {.name = "add_rms_norm",
                                      .n_in = 3,
                                      .n_out = 2,
                                      .in_names = {"h", "y", "w"},
                                      .out_names = {"x", "r"},
                                      .attrs_size = sizeof(add_rms_attrs),
                                      .forward = add_rms_norm_forward,
                                      .bwd = {{"default", add_rms_norm_backward}},
                                      .bwd_skips_in = 1u << ARN_H | 1u << ARN_Y,
                                      .sample = add_rms_norm_sample,
                                      .atol_f64 = 1e-7,
                                      .rtol_f64 = 1e-6,
                                      .atol_f32 = 1e-4,
                                      .rtol_f32 = 1e-4};
