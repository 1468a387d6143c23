/* conv1d: causal depthwise convolution over time (FLA's ShortConvolution / causal_conv1d).
 *   x [B,T,D], w [D,W] (W = 1..8), bias [D] or NULL
 *   p[b,t,d] = bias[d] + sum_{j<W} w[d,j] x[b, t-W+1+j, d]    (zero padding on the left)
 *   y = silu(p) when silu, else p
 * Backward (kernels/cpu/nn_conv1d_impl.h), with dp = dy silu'(p) (p recomputed, nothing saved):
 *   dx[b,s,d] = sum_j w[d,j] dp[b, s+W-1-j, d]  (terms with s+W-1-j < T)
 *   dw[d,j] = sum_{b,t} dp[b,t,d] x[b,t-W+1+j,d],   dbias[d] = sum_{b,t} dp[b,t,d]
 * Device tensors: kernels/cuda/nn_conv1d.cu (the same math; bf16 too). */
#include "ops/nn_common.h"
#include "kernels/cuda/nn_dispatch.h"

#define CONV_MAX_W 8

typedef struct {
    bool silu;
} conv_attrs;

enum { CONV_X, CONV_W, CONV_B };

#define P(t) ((t) ? dg_data_ptr(t) : NULL)

static int conv1d_forward(dg_node *n) {
    const conv_attrs *at = (const conv_attrs *)n->attrs;
    bool fail = false;
    dg_tensor *x = dg_nn_contig(n->in[CONV_X], &fail), *w = dg_nn_contig(n->in[CONV_W], &fail);
    dg_tensor *b = dg_nn_contig(n->in[CONV_B], &fail);
    dg_tensor *y = fail ? NULL : dg_empty_like(x);
    if (!y) return -1;
    int64_t B = x->shape[0], T = x->shape[1], D = x->shape[2], W = w->shape[1];
    int rc;
#ifdef DG_HAVE_CUDA
    if (x->device == DG_CUDA) {
        if (dg_cuda_conv1d_fwd(x->dtype, B, T, D, W, P(x), P(w), P(b), at->silu, P(y))) return -1;
        n->out[0] = y;
        return 0;
    }
#endif
    if (!dg_nn_cpu_float("conv1d", x)) return -1;
    rc = x->dtype == DG_F32 ? dg_nn_conv1d_fwd_f32(B, T, D, W, P(x), P(w), P(b), at->silu, P(y))
                            : dg_nn_conv1d_fwd_f64(B, T, D, W, P(x), P(w), P(b), at->silu, P(y));
    if (rc) {
        dg_error("conv1d: out of host memory for scratch (x %s, w %s)", dg_shp(x), dg_shp(w));
        return -1;
    }
    n->out[0] = y;
    return 0;
}

static int conv1d_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    const conv_attrs *at = (const conv_attrs *)n->attrs;
    bool fail = false;
    dg_tensor *x = dg_nn_contig(n->in[CONV_X], &fail), *w = dg_nn_contig(n->in[CONV_W], &fail);
    dg_tensor *b = dg_nn_contig(n->in[CONV_B], &fail), *dy = dg_nn_contig(gout[0], &fail);
    if (fail) return -1;
    dg_tensor *dx = n->needs_grad[CONV_X] ? dg_empty_like(x) : NULL;
    dg_tensor *dw = n->needs_grad[CONV_W] ? dg_empty_like(w) : NULL;
    dg_tensor *db = n->needs_grad[CONV_B] ? dg_empty_like(b) : NULL;
    if ((n->needs_grad[CONV_X] && !dx) || (n->needs_grad[CONV_W] && !dw) || (n->needs_grad[CONV_B] && !db)) return -1;
    int64_t B = x->shape[0], T = x->shape[1], D = x->shape[2], W = w->shape[1];
#ifdef DG_HAVE_CUDA
    if (x->device == DG_CUDA) {
        if (dg_cuda_conv1d_bwd(x->dtype, B, T, D, W, P(x), P(w), P(b), at->silu, P(dy), P(dx), P(dw), P(db))) return -1;
        gin[CONV_X] = dx;
        gin[CONV_W] = dw;
        gin[CONV_B] = db;
        return 0;
    }
#endif
    if (!dg_nn_cpu_float("conv1d", x)) return -1;
    int rc = x->dtype == DG_F32
                 ? dg_nn_conv1d_bwd_f32(B, T, D, W, P(x), P(w), P(b), at->silu, P(dy), P(dx), P(dw), P(db))
                 : dg_nn_conv1d_bwd_f64(B, T, D, W, P(x), P(w), P(b), at->silu, P(dy), P(dx), P(dw), P(db));
    if (rc) {
        dg_error("conv1d: out of host memory for scratch in backward (x %s, w %s)", dg_shp(x), dg_shp(w));
        return -1;
    }
    gin[CONV_X] = dx;
    gin[CONV_W] = dw;
    gin[CONV_B] = db;
    return 0;
}

dg_tensor *dg_conv1d(dg_tensor *x, dg_tensor *w, dg_tensor *bias, bool silu) {
    if (!dg_check_float_or_bf16("conv1d", "x", x) || !dg_check_not_null("conv1d", "w", w)) return NULL;
    if (x->ndim != 3) {
        dg_error("conv1d: x has shape %s but must be [B,T,D] (w %s)", dg_shp(x), dg_shp(w));
        return NULL;
    }
    if (!dg_check_same_dtype("conv1d", "w", w, "x", x) || !dg_check_same_device("conv1d", "w", w, "x", x)) return NULL;
    if (w->ndim != 2 || w->shape[0] != x->shape[2] || w->shape[1] < 1 || w->shape[1] > CONV_MAX_W) {
        dg_error("conv1d: w has shape %s but must be [D,W] with D = %lld and W in 1..%d (x %s)", dg_shp(w),
                 (long long)x->shape[2], CONV_MAX_W, dg_shp(x));
        return NULL;
    }
    if (bias && !dg_nn_check_vec("conv1d", "bias", bias, x->shape[2], "channels D =", "x", x)) return NULL;
    conv_attrs at = {silu};
    dg_tensor *in[3] = {x, w, bias};
    return dg_apply1(&dg_op_conv1d, &at, in);
}

/* Samples: W 4 with bias and silu (the GDN default); W 1, no bias, no silu; W 8 > T (taps that
 * read only padding); x a [B,D,T] tensor seen as [B,T,D] (non-contiguous) with W 3 and silu. */
static int conv1d_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    dg_rng rng = dg_rng_new(seed);
    dg_tensor *x, *w, *b = NULL;
    conv_attrs at = {true};
    switch (index) {
    case 0:
        x = DG_SAMPLE_RANDN(&rng, dt, 2, 6, 3);
        w = DG_SAMPLE_RANDN(&rng, dt, 3, 4);
        b = DG_SAMPLE_RANDN(&rng, dt, 3);
        break;
    case 1:
        x = DG_SAMPLE_RANDN(&rng, dt, 1, 7, 5);
        w = DG_SAMPLE_RANDN(&rng, dt, 5, 1);
        at.silu = false;
        break;
    case 2:
        x = DG_SAMPLE_RANDN(&rng, dt, 2, 4, 3);
        w = DG_SAMPLE_RANDN(&rng, dt, 3, 8);
        b = DG_SAMPLE_RANDN(&rng, dt, 3);
        break;
    case 3:
        x = dg_nn_sample_transposed(&rng, dt, DG_SHAPE(2, 5, 4), 1.0);
        w = DG_SAMPLE_RANDN(&rng, dt, 4, 3);
        at.silu = true;
        break;
    default: return 0;
    }
    snprintf(s->label, sizeof s->label, "x %s%s w %s%s%s", dg_shp(x), dg_is_contiguous(x) ? "" : " (strided)",
             dg_shp(w), b ? " bias" : "", at.silu ? " silu" : "");
    dg_sample_set(s, CONV_X, x, true);
    dg_sample_set(s, CONV_W, w, true);
    dg_sample_set(s, CONV_B, b, true);
    memcpy(s->attrs, &at, sizeof at);
    return 1;
}

const dg_op_def dg_op_conv1d = {.name = "conv1d",
                                .n_in = 3,
                                .n_out = 1,
                                .in_names = {"x", "w", "bias"},
                                .out_names = {"y"},
                                .attrs_size = sizeof(conv_attrs),
                                .forward = conv1d_forward,
                                .bwd = {{"default", conv1d_backward}},
                                .sample = conv1d_sample,
                                .atol_f64 = 1e-7,
                                .rtol_f64 = 1e-6,
                                .atol_f32 = 1e-4,
                                .rtol_f32 = 1e-4};
