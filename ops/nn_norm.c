/* The normalisations over the last dim, x [..., D] seen as N rows (kernels/cpu/nn_norm_impl.h):
 *   rms_norm        y = x r w,            r = 1/sqrt(mean(x^2) + eps),  w [D] or NULL (ones)
 *   gated_rms_norm  y = x r w silu(z),    z like x (FLA's FusedRMSNormGated, norm before gate)
 *   l2norm          y = x r,              r = 1/sqrt(sum(x^2) + eps)    (FLA's l2norm)
 * Forward saves r [N]; backward recomputes the rest from x (and z).
 *   rms:   g = dy w (gated: dy w silu(z)),  dx = r (g - x r^2 mean(g x)),
 *          dw = sum_n dy x r (gated: dy x r silu(z)),  dz = dy x r w silu'(z)
 *   l2:    dx = r (dy - y sum(dy y))
 * Device tensors run the same math in kernels/cuda/nn_norm.cu (NN_CALL picks the kernel, see
 * kernels/cuda/nn_dispatch.h), bf16 included (then r is saved in f32). */
#include "ops/nn_common.h"
#include "kernels/cuda/nn_dispatch.h"

typedef struct {
    double eps;
} norm_attrs;

enum { RMS_X, RMS_W };
enum { GRMS_X, GRMS_Z, GRMS_W };

#define P(t) ((t) ? dg_data_ptr(t) : NULL)

/* a new [N] tensor for r (f32 for bf16 x), and the output like x */
static int norm_alloc(dg_tensor *x, dg_tensor **y, dg_tensor **rstd) {
    int64_t N = dg_nn_rows(x);
    *y = dg_empty_like(x);
    *rstd = dg_empty_on(1, &N, dg_nn_stat_dtype(x->dtype), x->device);
    return *y && *rstd ? 0 : -1;
}

/* ---- rms_norm ---------------------------------------------------------------------------------- */

static int rms_norm_forward(dg_node *n) {
    const norm_attrs *at = (const norm_attrs *)n->attrs;
    bool fail = false;
    dg_tensor *x = dg_nn_contig(n->in[RMS_X], &fail), *w = dg_nn_contig(n->in[RMS_W], &fail), *y, *rstd;
    if (fail || norm_alloc(x, &y, &rstd)) return -1;
    int64_t N = dg_nn_rows(x), D = dg_nn_last(x);
    int rc = 0;
    NN_CALL(rc, x, rms_norm_fwd, N, D, P(x), P(w), at->eps, P(y), P(rstd));
    if (rc) return -1;
    dg_save(n, rstd);
    n->out[0] = y;
    return 0;
}

static int rms_norm_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    bool fail = false;
    dg_tensor *x = dg_nn_contig(n->in[RMS_X], &fail), *w = dg_nn_contig(n->in[RMS_W], &fail);
    dg_tensor *dy = dg_nn_contig(gout[0], &fail), *rstd = n->saved[0];
    if (fail) return -1;
    dg_tensor *dx = n->needs_grad[RMS_X] ? dg_empty_like(x) : NULL;
    dg_tensor *dw = n->needs_grad[RMS_W] ? dg_empty_like(w) : NULL;
    if ((n->needs_grad[RMS_X] && !dx) || (n->needs_grad[RMS_W] && !dw)) return -1;
    int64_t N = dg_nn_rows(x), D = dg_nn_last(x);
    int rc = 0;
    NN_CALL(rc, x, rms_norm_bwd, N, D, P(x), P(w), P(rstd), P(dy), P(dx), P(dw));
    if (rc) return -1;
    gin[RMS_X] = dx;
    gin[RMS_W] = dw;
    return 0;
}

dg_tensor *dg_rms_norm(dg_tensor *x, dg_tensor *w, double eps) {
    if (!dg_nn_check_x("rms_norm", "x", x) || !dg_nn_check_eps("rms_norm", eps, x)) return NULL;
    if (w && !dg_nn_check_vec("rms_norm", "w", w, dg_nn_last(x), "last dim", "x", x)) return NULL;
    norm_attrs at = {eps};
    dg_tensor *in[2] = {x, w};
    return dg_apply1(&dg_op_rms_norm, &at, in);
}

/* Samples: 2-D with w; 3-D without w; x stored transposed; rows of very different scale (1e-2 to
 * 1e2, so that r varies across rows) with w. */
static int rms_norm_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    dg_rng rng = dg_rng_new(seed);
    dg_tensor *x, *w = NULL;
    norm_attrs at = {1e-5};
    switch (index) {
    case 0:
        x = DG_SAMPLE_RANDN(&rng, dt, 3, 8);
        w = DG_SAMPLE_RAND(&rng, dt, 0.5, 1.5, 8);
        break;
    case 1:
        x = DG_SAMPLE_RANDN(&rng, dt, 2, 3, 16);
        at.eps = 1e-6;
        break;
    case 2:
        x = dg_nn_sample_transposed(&rng, dt, DG_SHAPE(4, 6), 1.0);
        w = DG_SAMPLE_RANDN(&rng, dt, 6);
        break;
    case 3:
        x = DG_SAMPLE_RANDN(&rng, dt, 3, 5);
        for (int64_t i = 0; i < 5; i++) {
            dg_set(x, (int64_t[]){0, i}, dg_get(x, (int64_t[]){0, i}) * 1e-2);
            dg_set(x, (int64_t[]){2, i}, dg_get(x, (int64_t[]){2, i}) * 1e2);
        }
        w = DG_SAMPLE_RANDN(&rng, dt, 5);
        break;
    default: return 0;
    }
    snprintf(s->label, sizeof s->label, "x %s%s%s eps %g", dg_shp(x), dg_is_contiguous(x) ? "" : " (strided)",
             w ? " w" : " no w", at.eps);
    dg_sample_set(s, RMS_X, x, true);
    dg_sample_set(s, RMS_W, w, true);
    memcpy(s->attrs, &at, sizeof at);
    return 1;
}

const dg_op_def dg_op_rms_norm = {.name = "rms_norm",
                                  .n_in = 2,
                                  .n_out = 1,
                                  .in_names = {"x", "w"},
                                  .out_names = {"y"},
                                  .attrs_size = sizeof(norm_attrs),
                                  .forward = rms_norm_forward,
                                  .bwd = {{"default", rms_norm_backward}},
                                  .sample = rms_norm_sample,
                                  .atol_f64 = 1e-7,
                                  .rtol_f64 = 1e-6,
                                  .atol_f32 = 1e-4,
                                  .rtol_f32 = 1e-4};

/* ---- gated_rms_norm ---------------------------------------------------------------------------- */

static int gated_rms_norm_forward(dg_node *n) {
    const norm_attrs *at = (const norm_attrs *)n->attrs;
    bool fail = false;
    dg_tensor *x = dg_nn_contig(n->in[GRMS_X], &fail), *z = dg_nn_contig(n->in[GRMS_Z], &fail);
    dg_tensor *w = dg_nn_contig(n->in[GRMS_W], &fail), *y, *rstd;
    if (fail || norm_alloc(x, &y, &rstd)) return -1;
    int64_t N = dg_nn_rows(x), D = dg_nn_last(x);
    int rc = 0;
    NN_CALL(rc, x, gated_rms_norm_fwd, N, D, P(x), P(z), P(w), at->eps, P(y), P(rstd));
    if (rc) return -1;
    dg_save(n, rstd);
    n->out[0] = y;
    return 0;
}

static int gated_rms_norm_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    bool fail = false;
    dg_tensor *x = dg_nn_contig(n->in[GRMS_X], &fail), *z = dg_nn_contig(n->in[GRMS_Z], &fail);
    dg_tensor *w = dg_nn_contig(n->in[GRMS_W], &fail), *dy = dg_nn_contig(gout[0], &fail);
    dg_tensor *rstd = n->saved[0];
    if (fail) return -1;
    dg_tensor *dx = n->needs_grad[GRMS_X] ? dg_empty_like(x) : NULL;
    dg_tensor *dz = n->needs_grad[GRMS_Z] ? dg_empty_like(z) : NULL;
    dg_tensor *dw = n->needs_grad[GRMS_W] ? dg_empty_like(w) : NULL;
    if ((n->needs_grad[GRMS_X] && !dx) || (n->needs_grad[GRMS_Z] && !dz) || (n->needs_grad[GRMS_W] && !dw)) return -1;
    int64_t N = dg_nn_rows(x), D = dg_nn_last(x);
    int rc = 0;
    NN_CALL(rc, x, gated_rms_norm_bwd, N, D, P(x), P(z), P(w), P(rstd), P(dy), P(dx), P(dz), P(dw));
    if (rc) return -1;
    gin[GRMS_X] = dx;
    gin[GRMS_Z] = dz;
    gin[GRMS_W] = dw;
    return 0;
}

/* w may be NULL here too (FLA's elementwise_affine=False) */
dg_tensor *dg_gated_rms_norm(dg_tensor *x, dg_tensor *z, dg_tensor *w, double eps) {
    const char *op = "gated_rms_norm";
    if (!dg_nn_check_x(op, "x", x) || !dg_nn_check_eps(op, eps, x)) return NULL;
    if (!dg_nn_check_like(op, "z", z, "x", x)) return NULL;
    if (w && !dg_nn_check_vec(op, "w", w, dg_nn_last(x), "last dim", "x", x)) return NULL;
    norm_attrs at = {eps};
    dg_tensor *in[3] = {x, z, w};
    return dg_apply1(&dg_op_gated_rms_norm, &at, in);
}

/* Samples: 2-D with w; 3-D without w; z stored transposed; z spread wide (|z| up to ~9) so that
 * silu is far from linear. */
static int gated_rms_norm_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    dg_rng rng = dg_rng_new(seed);
    dg_tensor *x, *z, *w = NULL;
    norm_attrs at = {1e-5};
    switch (index) {
    case 0:
        x = DG_SAMPLE_RANDN(&rng, dt, 3, 8);
        z = DG_SAMPLE_RANDN(&rng, dt, 3, 8);
        w = DG_SAMPLE_RAND(&rng, dt, 0.5, 1.5, 8);
        break;
    case 1:
        x = DG_SAMPLE_RANDN(&rng, dt, 2, 3, 16);
        z = DG_SAMPLE_RANDN(&rng, dt, 2, 3, 16);
        at.eps = 1e-6;
        break;
    case 2:
        x = DG_SAMPLE_RANDN(&rng, dt, 5, 4);
        z = dg_nn_sample_transposed(&rng, dt, DG_SHAPE(5, 4), 1.0);
        w = DG_SAMPLE_RANDN(&rng, dt, 4);
        break;
    case 3:
        x = DG_SAMPLE_RANDN(&rng, dt, 4, 6);
        z = dg_nn_sample_randn(&rng, dt, DG_SHAPE(4, 6), 3.0);
        w = DG_SAMPLE_RANDN(&rng, dt, 6);
        break;
    default: return 0;
    }
    snprintf(s->label, sizeof s->label, "x %s z%s%s eps %g", dg_shp(x), dg_is_contiguous(z) ? "" : " (strided)",
             w ? " w" : " no w", at.eps);
    dg_sample_set(s, GRMS_X, x, true);
    dg_sample_set(s, GRMS_Z, z, true);
    dg_sample_set(s, GRMS_W, w, true);
    memcpy(s->attrs, &at, sizeof at);
    return 1;
}

const dg_op_def dg_op_gated_rms_norm = {.name = "gated_rms_norm",
                                        .n_in = 3,
                                        .n_out = 1,
                                        .in_names = {"x", "z", "w"},
                                        .out_names = {"y"},
                                        .attrs_size = sizeof(norm_attrs),
                                        .forward = gated_rms_norm_forward,
                                        .bwd = {{"default", gated_rms_norm_backward}},
                                        .sample = gated_rms_norm_sample,
                                        .atol_f64 = 1e-7,
                                        .rtol_f64 = 1e-6,
                                        .atol_f32 = 1e-4,
                                        .rtol_f32 = 1e-4};

/* ---- l2norm ------------------------------------------------------------------------------------ */

static int l2norm_forward(dg_node *n) {
    const norm_attrs *at = (const norm_attrs *)n->attrs;
    dg_tensor *x = dg_contiguous(n->in[0]), *y, *rstd;
    if (!x || norm_alloc(x, &y, &rstd)) return -1;
    int64_t N = dg_nn_rows(x), D = dg_nn_last(x);
    int rc = 0;
    NN_CALL(rc, x, l2norm_fwd, N, D, P(x), at->eps, P(y), P(rstd));
    if (rc) return -1;
    dg_save(n, rstd);
    n->out[0] = y;
    return 0;
}

static int l2norm_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    if (!n->needs_grad[0]) return 0;
    bool fail = false;
    dg_tensor *x = dg_nn_contig(n->in[0], &fail), *dy = dg_nn_contig(gout[0], &fail), *rstd = n->saved[0];
    dg_tensor *dx = fail ? NULL : dg_empty_like(x);
    if (!dx) return -1;
    int64_t N = dg_nn_rows(x), D = dg_nn_last(x);
    int rc = 0;
    NN_CALL(rc, x, l2norm_bwd, N, D, P(x), P(rstd), P(dy), P(dx));
    if (rc) return -1;
    gin[0] = dx;
    return 0;
}

dg_tensor *dg_l2norm(dg_tensor *x, double eps) {
    if (!dg_nn_check_x("l2norm", "x", x) || !dg_nn_check_eps("l2norm", eps, x)) return NULL;
    norm_attrs at = {eps};
    dg_tensor *in[1] = {x};
    return dg_apply1(&dg_op_l2norm, &at, in);
}

/* Samples: 2-D; 4-D heads layout [B,T,H,K]; x stored transposed; one short row of tiny values
 * where eps matters (sum x^2 ~ eps). */
static int l2norm_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    dg_rng rng = dg_rng_new(seed);
    dg_tensor *x;
    norm_attrs at = {1e-6};
    switch (index) {
    case 0: x = DG_SAMPLE_RANDN(&rng, dt, 3, 8); break;
    case 1: x = DG_SAMPLE_RANDN(&rng, dt, 2, 3, 2, 16); break;
    case 2: x = dg_nn_sample_transposed(&rng, dt, DG_SHAPE(5, 4), 1.0); break;
    case 3:
        x = dg_nn_sample_randn(&rng, dt, DG_SHAPE(2, 3), 1e-3);
        at.eps = 1e-5;
        break;
    default: return 0;
    }
    snprintf(s->label, sizeof s->label, "x %s%s eps %g", dg_shp(x), dg_is_contiguous(x) ? "" : " (strided)", at.eps);
    dg_sample_set(s, 0, x, true);
    memcpy(s->attrs, &at, sizeof at);
    return 1;
}

const dg_op_def dg_op_l2norm = {.name = "l2norm",
                                .n_in = 1,
                                .n_out = 1,
                                .in_names = {"x"},
                                .out_names = {"y"},
                                .attrs_size = sizeof(norm_attrs),
                                .forward = l2norm_forward,
                                .bwd = {{"default", l2norm_backward}},
                                .sample = l2norm_sample,
                                .atol_f64 = 1e-7,
                                .rtol_f64 = 1e-6,
                                .atol_f32 = 1e-4,
                                .rtol_f32 = 1e-4};
