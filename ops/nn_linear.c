/* linear: y[..., out] = x[..., in] w[out, in]^T + b[out]   (PyTorch's nn.Linear layout)
 * The leading dims of x are flattened to N rows; the products go to CBLAS.
 * Backward (kernels/cpu/nn_linear_impl.h):
 *   dx = dy w   [N,in],   dw = dy^T x   [out,in] (summed over every row),   db = sum_n dy
 * On the device: cuBLAS (dg_cuda_gemm; strict f32, no TF32); the bias is broadcast into y first
 * and the product added with beta = 1; db is a column sum (dg_cuda_sum, f64 accumulation).
 * bf16 on the device: the products are bf16 gemms accumulating in f32 (the bias joins the f32 sum
 * before the one rounding of y), and db sums the rows in f32 (dg_cuda_nn_sum_rows), rounded once.
 * Under mixed precision w is the bf16 cast of an f32 master weight, and dw comes out of cuBLAS in
 * f32 (dg_cast_grad_dtype, ops/op.h), added straight into the master's .grad (dg_grad_target). */
#include "ops/nn_common.h"

#include <limits.h>
#ifdef DG_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/nn_cuda.h"

/* y[N,OUT] = x[N,IN] w[OUT,IN]^T (+ b) */
static int linear_fwd_cuda(int64_t N, int64_t IN, int64_t OUT, dg_dtype dt, const void *x, const void *w, const void *b,
                           void *y) {
    if (b && dg_cuda_copy_strided(dg_dtype_size(dt), 2, (int64_t[]){N, OUT}, y, NULL, b, (int64_t[]){0, 1})) return -1;
    return dg_cuda_gemm(dt, dt, false, true, N, OUT, IN, 1.0, x, IN, 0, w, IN, 0, b ? 1.0 : 0.0, y, OUT, 0, 1);
}

static int linear_bwd_cuda(int64_t N, int64_t IN, int64_t OUT, dg_dtype dt, dg_dtype dw_dt, const void *x,
                           const void *w, const void *dy, void *dx, void *dw, void *db, double beta_dx,
                           double beta_dw) {
    /* dx[N,IN] (+)= dy[N,OUT] w[OUT,IN] */
    if (dx && dg_cuda_gemm(dt, dt, false, false, N, IN, OUT, 1.0, dy, OUT, 0, w, IN, 0, beta_dx, dx, IN, 0, 1))
        return -1;
    /* dw[OUT,IN] (+)= dy^T x: dy stored [N,OUT] is op(A)^T */
    if (dw && dg_cuda_gemm(dt, dw_dt, true, false, OUT, IN, N, 1.0, dy, OUT, 0, x, IN, 0, beta_dw, dw, IN, 0, 1))
        return -1;
    /* db[OUT] = sum over rows of dy */
    if (db && dt == DG_BF16) return dg_cuda_nn_sum_rows(dt, N, OUT, dy, db);
    if (db && dg_cuda_sum(dt, 2, (int64_t[]){N, OUT}, dy, NULL, 1u, 1.0, db)) return -1;
    return 0;
}
#endif

enum { LIN_X, LIN_W, LIN_B };

static int linear_forward(dg_node *n) {
#ifndef DG_HAVE_CUDA
    if (!dg_require_cpu("linear", n->in[LIN_X])) return -1;
#endif
    bool fail = false;
    dg_tensor *x = dg_nn_contig(n->in[LIN_X], &fail), *w = dg_nn_contig(n->in[LIN_W], &fail);
    dg_tensor *b = dg_nn_contig(n->in[LIN_B], &fail);
    if (fail) return -1;
    int64_t OUT = w->shape[0], IN = w->shape[1], N = dg_nn_rows(x);
    int64_t shape[DG_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = OUT;
    dg_tensor *y = dg_empty_on(x->ndim, shape, x->dtype, x->device);
    if (!y) return -1;
#ifdef DG_HAVE_CUDA
    if (x->device == DG_CUDA) {
        if (linear_fwd_cuda(N, IN, OUT, x->dtype, dg_data_ptr(x), dg_data_ptr(w), b ? dg_data_ptr(b) : NULL,
                            dg_data_ptr(y)))
            return -1;
        n->out[0] = y;
        return 0;
    }
#endif
    if (!dg_nn_cpu_float("linear", x)) return -1;
    if (x->dtype == DG_F32)
        dg_nn_linear_fwd_f32(N, IN, OUT, dg_data_ptr(x), dg_data_ptr(w), b ? dg_data_ptr(b) : NULL, dg_data_ptr(y));
    else dg_nn_linear_fwd_f64(N, IN, OUT, dg_data_ptr(x), dg_data_ptr(w), b ? dg_data_ptr(b) : NULL, dg_data_ptr(y));
    n->out[0] = y;
    return 0;
}

static int linear_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    bool fail = false;
    dg_tensor *x = dg_nn_contig(n->in[LIN_X], &fail), *w = dg_nn_contig(n->in[LIN_W], &fail);
    dg_tensor *dy = dg_nn_contig(gout[0], &fail);
    if (fail) return -1;
    int64_t OUT = w->shape[0], IN = w->shape[1], N = dg_nn_rows(x);
    /* dx and dw go straight into their gradient slots where the engine allows (dg_grad_target):
     * the products add to the sum so far (beta = 1), so no separate pass adds them up (the sum of
     * dx over the projections that share an input; a weight's .grad).  dx is written before dw,
     * as the targets were asked for (x and w may share one slot). */
    bool dx_fresh = false, dw_fresh = false;
    const dg_dtype dw_dt = dg_nn_weight_grad_dtype(x, n->in[LIN_W]);
    dg_tensor *dx_to = dg_grad_target(n, LIN_X, x->dtype, &dx_fresh);
    dg_tensor *dw_to = dg_grad_target(n, LIN_W, dw_dt, &dw_fresh);
    bool acc_dx = dx_to && !dx_fresh, acc_dw = dw_to && !dw_fresh;
    dg_tensor *dx = dx_to ? dx_to : n->needs_grad[LIN_X] ? dg_empty_like(x) : NULL;
    dg_tensor *dw = dw_to ? dw_to : n->needs_grad[LIN_W] ? dg_empty_on(w->ndim, w->shape, dw_dt, w->device) : NULL;
    dg_tensor *db = n->needs_grad[LIN_B] ? dg_empty_like(n->in[LIN_B]) : NULL;
    if ((n->needs_grad[LIN_X] && !dx) || (n->needs_grad[LIN_W] && !dw) || (n->needs_grad[LIN_B] && !db)) return -1;
#define P(t) ((t) ? dg_data_ptr(t) : NULL)
    bool on_device = x->device == DG_CUDA; /* only in builds with CUDA: the forward refused it else */
#ifdef DG_HAVE_CUDA
    if (on_device &&
        linear_bwd_cuda(N, IN, OUT, x->dtype, dw_dt, P(x), P(w), P(dy), P(dx), P(dw), P(db), acc_dx, acc_dw))
        return -1;
#endif
    if (!on_device) {
        if (!dg_nn_cpu_float("linear", x)) return -1;
        if (x->dtype == DG_F32)
            dg_nn_linear_bwd_f32(N, IN, OUT, P(x), P(w), P(dy), P(dx), P(dw), P(db), acc_dx, acc_dw);
        else dg_nn_linear_bwd_f64(N, IN, OUT, P(x), P(w), P(dy), P(dx), P(dw), P(db), acc_dx, acc_dw);
    }
#undef P
    gin[LIN_X] = dx_to ? NULL : dx;
    gin[LIN_W] = dw_to ? NULL : dw;
    gin[LIN_B] = db;
    return 0;
}

dg_tensor *dg_linear(dg_tensor *x, dg_tensor *w, dg_tensor *b) {
    if (!dg_nn_check_x("linear", "x", x) || !dg_check_not_null("linear", "w", w)) return NULL;
    if (!dg_check_same_dtype("linear", "w", w, "x", x) || !dg_check_same_device("linear", "w", w, "x", x)) return NULL;
    if (w->ndim != 2 || w->shape[1] != dg_nn_last(x)) {
        dg_error("linear: w has shape %s but must be [out,%lld] for x %s (w is [out,in])", dg_shp(w),
                 (long long)dg_nn_last(x), dg_shp(x));
        return NULL;
    }
    if (b && !dg_nn_check_vec("linear", "b", b, w->shape[0], "out features", "w", w)) return NULL;
    if (dg_nn_rows(x) > INT_MAX || w->shape[0] > INT_MAX || w->shape[1] > INT_MAX) {
        dg_error("linear: x %s and w %s exceed the BLAS size limit (%d rows or features)", dg_shp(x), dg_shp(w),
                 INT_MAX);
        return NULL;
    }
    dg_tensor *in[3] = {x, w, b};
    return dg_apply1(&dg_op_linear, NULL, in);
}

/* Samples: plain 2-D with bias; 3-D x without bias; x stored transposed (non-contiguous) with
 * bias; one output feature; ten output features (the CPU runs fewer than 8 without a GEMM:
 * kernels/cpu/nn_linear.c, so this one is the GEMM path's). */
static int linear_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    dg_rng rng = dg_rng_new(seed);
    dg_tensor *x, *w, *b = NULL;
    switch (index) {
    case 0:
        x = DG_SAMPLE_RANDN(&rng, dt, 3, 5);
        w = DG_SAMPLE_RANDN(&rng, dt, 4, 5);
        b = DG_SAMPLE_RANDN(&rng, dt, 4);
        break;
    case 1:
        x = DG_SAMPLE_RANDN(&rng, dt, 2, 3, 6);
        w = DG_SAMPLE_RANDN(&rng, dt, 7, 6);
        break;
    case 2:
        x = dg_nn_sample_transposed(&rng, dt, DG_SHAPE(2, 4, 3), 1.0);
        w = dg_nn_sample_transposed(&rng, dt, DG_SHAPE(5, 3), 1.0);
        b = DG_SAMPLE_RANDN(&rng, dt, 5);
        break;
    case 3:
        x = DG_SAMPLE_RANDN(&rng, dt, 4, 8);
        w = DG_SAMPLE_RANDN(&rng, dt, 1, 8);
        b = DG_SAMPLE_RANDN(&rng, dt, 1);
        break;
    case 4:
        x = DG_SAMPLE_RANDN(&rng, dt, 6, 9);
        w = DG_SAMPLE_RANDN(&rng, dt, 10, 9);
        b = DG_SAMPLE_RANDN(&rng, dt, 10);
        break;
    default: return 0;
    }
    snprintf(s->label, sizeof s->label, "x %s%s w %s%s%s", dg_shp(x), dg_is_contiguous(x) ? "" : " (strided)",
             dg_shp(w), dg_is_contiguous(w) ? "" : " (strided)", b ? " + b" : "");
    dg_sample_set(s, LIN_X, x, true);
    dg_sample_set(s, LIN_W, w, true);
    dg_sample_set(s, LIN_B, b, true);
    return 1;
}

const dg_op_def dg_op_linear = {.name = "linear",
                                .n_in = 3,
                                .n_out = 1,
                                .in_names = {"x", "w", "b"},
                                .out_names = {"y"},
                                .attrs_size = 0,
                                .forward = linear_forward,
                                .bwd = {{"default", linear_backward}},
                                .sample = linear_sample,
                                .atol_f64 = 1e-7,
                                .rtol_f64 = 1e-6,
                                .atol_f32 = 1e-4,
                                .rtol_f32 = 1e-4};
