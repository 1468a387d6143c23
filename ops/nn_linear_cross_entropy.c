/* linear_cross_entropy: the LM head and its cross-entropy in one op.  x [..., D] float, w [C, D]
 * (nn.Linear's layout, no bias), targets [...] i64 (x's shape without the last dim); rows whose
 * target equals ignore_index are not scored:
 *   loss = (1/count) sum_{scored n} (lse_n - x_n . w_{t_n}),   lse_n = log sum_c exp(x_n . w_c)
 * the value of cross_entropy(linear(x, w, NULL), targets, ignore_index) (its decomposition here),
 * but the logits [N, C] and their gradient are never held whole: the rows go in chunks of CH rows
 * whose logits fill one reused buffer [CH, C].  Forward, per chunk x_c:
 *   L = x_c w^T (GEMM into the buffer);  lse_c;  the running sum of lse_n - L[n, t_n]
 * and it saves lse [N] and the buffer, which holds the last chunk's logits.  Backward, per chunk
 * from the last to the first, the logits made again but for the last chunk's (one more GEMM for
 * every chunk but the last):
 *   L = x_c w^T;   G = dloss/count (softmax(L) - onehot(t_c)), in place, 0 on ignored rows
 *   dx_c = G w   [CH, D];     dw = sum over chunks of G^T x_c   [C, D]
 * The backward uses the saved buffer up (it becomes G) and drops it: a second backward through the
 * node makes the last chunk's logits again too.
 * Memory: N C logits and N C dlogits (stored by linear + cross_entropy) become CH C, so the head's
 * memory no longer grows with the tokens of a step.  The price is the GEMM made again for N - CH
 * rows: nothing when every row fits one chunk, up to 4/3 of the head's products for many chunks.
 * chunk_rows: CH, or 0 for the rows whose logits take at most DG_LINEAR_CE_CHUNK_BYTES (64 MiB; at
 * least one row): 524 rows of a 32k vocabulary in f32.
 * The CPU kernels: kernels/cpu/nn_linear_cross_entropy_impl.h (f32, f64).  On the device the
 * products go to cuBLAS (dg_cuda_gemm, f32 compute, no TF32) and the chunk's cross-entropy to the
 * kernels of kernels/cuda/nn_cross_entropy.cu: the rows pass writes lse and each row's term into
 * [N] arrays, one more kernel sums the terms in a fixed order into the loss and the count (a
 * device i64 saved for the backward, which reads it and dloss on the device): nothing is read back,
 * so a CUDA graph can capture the op (models/train_graph.c).  bf16 x and w (device only): the
 * logits are accumulated and kept in f32 (the buffer is f32, lse and the loss f32); G is rounded
 * once to bf16 into a second buffer [CH, C] for the two bf16 products; dx is bf16 and dw
 * accumulates over the chunks in f32: under mixed precision, where w is the bf16 cast of an f32
 * master weight, that f32 sum is the master's gradient itself (dg_cast_grad_dtype, ops/op.h), added
 * straight into its .grad (dg_grad_target) as linear's is; else it is rounded once to bf16 at the
 * end. */
#include "ops/nn_common.h"

#include <limits.h>
#ifdef DG_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/nn_cuda.h"
#endif

typedef struct {
    int64_t ignore_index;
    int64_t chunk_rows; /* 0: chosen from DG_LINEAR_CE_CHUNK_BYTES */
} lce_attrs;

enum { LCE_X, LCE_W, LCE_TARGETS };

#define P(t) ((t) ? dg_data_ptr(t) : NULL)

/* the rows of one chunk: chunk_rows, or as many as fit DG_LINEAR_CE_CHUNK_BYTES; at least 1, at
 * most N */
static int64_t chunk_rows(const lce_attrs *at, int64_t N, int64_t C, dg_dtype stat_dt) {
    int64_t ch = at->chunk_rows > 0 ? at->chunk_rows : DG_LINEAR_CE_CHUNK_BYTES / (C * (int64_t)dg_dtype_size(stat_dt));
    if (ch > N) ch = N;
    if (ch > INT_MAX) ch = INT_MAX; /* a BLAS dimension */
    return ch < 1 ? 1 : ch;
}

/* The backward's chunk buffer: the forward's (saved[1]), which holds the last chunk's logits
 * (*have_last), taken from the node since the backward turns it into their gradient; or, when a
 * backward has taken it already, a new one. */
static dg_tensor *last_logits(dg_node *n, int64_t CH, int64_t C, dg_dtype dt, bool *have_last) {
    dg_tensor *buf = n->saved[1];
    *have_last = buf != NULL;
    if (!buf) return dg_empty_on(2, (int64_t[]){CH, C}, dt, n->in[LCE_X]->device);
    n->saved[1] = NULL;
    return dg_autorelease(buf);
}

#ifdef DG_HAVE_CUDA
/* element `i` of contiguous t, for the chunk offsets of device pointers */
static void *at_elem(const dg_tensor *t, int64_t i) {
    return (char *)dg_data_ptr(t) + i * (int64_t)dg_dtype_size(t->dtype);
}

/* buf[rows, C] (stat dtype) = x[r0 .. r0+rows) w^T, accumulated in f32 (f64 for f64) */
static int chunk_logits_cuda(const dg_tensor *x, const dg_tensor *w, int64_t r0, int64_t rows, dg_tensor *buf) {
    int64_t D = w->shape[1], C = w->shape[0];
    return dg_cuda_gemm(x->dtype, buf->dtype, false, true, rows, C, D, 1.0, at_elem(x, r0 * D), D, 0, P(w), D, 0, 0.0,
                        P(buf), C, 0, 1);
}

static int lce_forward_cuda(dg_node *n, const lce_attrs *at, dg_tensor *x, dg_tensor *w, dg_tensor *t, dg_tensor *loss,
                            dg_tensor *lse, int64_t CH) {
    int64_t N = dg_nn_rows(x), C = w->shape[0];
    dg_tensor *cnt = dg_empty_on(0, NULL, DG_I64, x->device);
    dg_tensor *term = dg_empty_on(1, &N, DG_F64, x->device);
    dg_tensor *buf = dg_empty_on(2, (int64_t[]){CH, C}, lse->dtype, x->device);
    if (!cnt || !term || !buf) return -1;
    for (int64_t r0 = 0; r0 < N; r0 += CH) {
        int64_t rows = N - r0 < CH ? N - r0 : CH;
        if (chunk_logits_cuda(x, w, r0, rows, buf) ||
            dg_cuda_cross_entropy_rows(buf->dtype, rows, C, P(buf), at_elem(t, r0), at->ignore_index, at_elem(lse, r0),
                                       at_elem(term, r0)))
            return -1;
    }
    if (dg_cuda_cross_entropy_loss(loss->dtype, N, P(t), at->ignore_index, P(term), P(loss), P(cnt))) return -1;
    dg_save(n, lse);
    dg_save(n, buf); /* the last chunk's logits */
    dg_save(n, cnt);
    return 0;
}

/* dx (x's dtype) and dw (w's, or f32 for the cast of an f32 master) or NULL, written or, with
 * acc_dx / acc_dw, added to; dloss and the count stay on the device */
static int lce_backward_cuda(dg_node *n, const lce_attrs *at, dg_tensor *x, dg_tensor *w, dg_tensor *t,
                             const dg_tensor *dloss, dg_tensor *dx, dg_tensor *dw, bool acc_dx, bool acc_dw) {
    const dg_tensor *lse = n->saved[0], *cnt = n->saved[2];
    int64_t N = dg_nn_rows(x), C = w->shape[0], D = w->shape[1];
    int64_t CH = chunk_rows(at, N, C, lse->dtype);
    bool have_last = false;
    dg_tensor *buf = last_logits(n, CH, C, lse->dtype, &have_last);
    /* G in x's dtype: the buffer itself (in place), or a bf16 copy of it for the bf16 products */
    dg_tensor *g = x->dtype == buf->dtype ? buf : dg_empty_on(2, (int64_t[]){CH, C}, x->dtype, x->device);
    /* dw's sum over chunks: f32 for bf16 products (dw itself when it is f32; a bf16 dw is never a
     * target to add to, lce_backward) */
    dg_dtype acc_dt = x->dtype == DG_BF16 ? DG_F32 : x->dtype;
    dg_tensor *acc = !dw || dw->dtype == acc_dt ? dw : dg_empty_on(2, w->shape, acc_dt, x->device);
    if (!buf || !g || (dw && !acc)) return -1;
    if (acc && N == 0 && !acc_dw && dg_cuda_fill(acc_dt, C * D, P(acc), 0.0)) return -1;
    for (int64_t r0 = N > 0 ? (N - 1) / CH * CH : -1; r0 >= 0; r0 -= CH) { /* the last chunk first */
        int64_t rows = N - r0 < CH ? N - r0 : CH;
        bool first = r0 + rows == N;
        if ((!(first && have_last) && chunk_logits_cuda(x, w, r0, rows, buf)) ||
            dg_cuda_cross_entropy_grad(buf->dtype, g->dtype, rows, C, P(buf), at_elem(t, r0), at->ignore_index,
                                       at_elem(lse, r0), P(dloss), P(cnt), P(g)))
            return -1;
        /* dx_c [rows, D] = G [rows, C] w [C, D] */
        if (dx && dg_cuda_gemm(x->dtype, x->dtype, false, false, rows, D, C, 1.0, P(g), C, 0, P(w), D, 0, acc_dx,
                               at_elem(dx, r0 * D), D, 0, 1))
            return -1;
        /* dw [C, D] (+)= G^T x_c: G stored [rows, C] is op(A)^T */
        if (acc && dg_cuda_gemm(x->dtype, acc_dt, true, false, C, D, rows, 1.0, P(g), C, 0, at_elem(x, r0 * D), D, 0,
                                !first || acc_dw ? 1.0 : 0.0, P(acc), D, 0, 1))
            return -1;
    }
    if (acc && acc != dw && dg_cuda_cast(C * D, dw->dtype, P(dw), acc_dt, P(acc))) return -1;
    return 0;
}
#endif

static int lce_forward(dg_node *n) {
    const lce_attrs *at = (const lce_attrs *)n->attrs;
    bool fail = false;
    dg_tensor *x = dg_nn_contig(n->in[LCE_X], &fail), *w = dg_nn_contig(n->in[LCE_W], &fail);
    dg_tensor *t = dg_nn_contig(n->in[LCE_TARGETS], &fail);
    if (fail || !dg_nn_targets_valid("linear_cross_entropy", t, w->shape[0], at->ignore_index, "w", w)) return -1;
    int64_t N = dg_nn_rows(x), C = w->shape[0], D = w->shape[1], count;
    dg_dtype sdt = dg_nn_stat_dtype(x->dtype);
    int64_t CH = chunk_rows(at, N, C, sdt);
    dg_tensor *loss = dg_empty_on(0, NULL, sdt, x->device);
    dg_tensor *lse = dg_empty_on(1, &N, sdt, x->device);
    if (!loss || !lse) return -1;
    n->out[0] = loss;
    if (x->device == DG_CUDA) {
#ifdef DG_HAVE_CUDA
        return lce_forward_cuda(n, at, x, w, t, loss, lse, CH);
#else
        (void)dg_require_cpu("linear_cross_entropy", x);
        return -1;
#endif
    }
    if (!dg_nn_cpu_float("linear_cross_entropy", x)) return -1;
    dg_tensor *buf = dg_empty(2, (int64_t[]){CH, C}, x->dtype);
    if (!buf) return -1;
    if (x->dtype == DG_F32)
        dg_nn_linear_cross_entropy_fwd_f32(N, D, C, CH, P(x), P(w), P(t), at->ignore_index, P(buf), P(loss), P(lse),
                                           &count);
    else
        dg_nn_linear_cross_entropy_fwd_f64(N, D, C, CH, P(x), P(w), P(t), at->ignore_index, P(buf), P(loss), P(lse),
                                           &count);
    dg_save(n, lse);
    dg_save(n, buf); /* the last chunk's logits */
    return 0;
}

static int lce_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    const lce_attrs *at = (const lce_attrs *)n->attrs;
    if (!n->needs_grad[LCE_X] && !n->needs_grad[LCE_W]) return 0;
    bool fail = false;
    dg_tensor *x = dg_nn_contig(n->in[LCE_X], &fail), *w = dg_nn_contig(n->in[LCE_W], &fail);
    dg_tensor *t = dg_nn_contig(n->in[LCE_TARGETS], &fail);
    if (fail) return -1;
    int64_t N = dg_nn_rows(x), C = w->shape[0], D = w->shape[1], count = 0;
    /* under mixed precision (bf16 on the device) the f32 master's gradient straight from the sum */
    dg_dtype dw_dt = dg_nn_weight_grad_dtype(x, n->in[LCE_W]);
    /* dx and dw go straight into their gradient slots where the engine allows (dg_grad_target), the
     * products adding to the sum so far, as linear's do; not a bf16 dw (its f32 sum over the chunks
     * is rounded once at the end), nor dw when x and w share one slot (dx and dw are written chunk
     * by chunk, interleaved: dw then goes to a buffer of its own and through gin) */
    bool dx_fresh = false, dw_fresh = false;
    dg_tensor *dx_to = dg_grad_target(n, LCE_X, x->dtype, &dx_fresh);
    dg_tensor *dw_to = dw_dt == DG_BF16 ? NULL : dg_grad_target(n, LCE_W, dw_dt, &dw_fresh);
    if (dw_to && dw_to == dx_to) dw_to = NULL;
    bool acc_dx = dx_to && !dx_fresh, acc_dw = dw_to && !dw_fresh;
    dg_tensor *dx = dx_to ? dx_to : n->needs_grad[LCE_X] ? dg_empty_like(x) : NULL;
    dg_tensor *dw = dw_to ? dw_to : n->needs_grad[LCE_W] ? dg_empty_on(2, w->shape, dw_dt, w->device) : NULL;
    if ((n->needs_grad[LCE_X] && !dx) || (n->needs_grad[LCE_W] && !dw)) return -1;
    gin[LCE_X] = dx_to ? NULL : dx;
    gin[LCE_W] = dw_to ? NULL : dw;
#ifdef DG_HAVE_CUDA
    if (x->device == DG_CUDA) return lce_backward_cuda(n, at, x, w, t, gout[0], dx, dw, acc_dx, acc_dw);
#endif
    if (!dg_nn_cpu_float("linear_cross_entropy", x)) return -1;
    const int64_t *tp = dg_data_ptr(t);
    for (int64_t i = 0; i < N; i++) count += tp[i] != at->ignore_index;
    double dloss = dg_item(gout[0]);
    int64_t CH = chunk_rows(at, N, C, x->dtype);
    bool have_last = false;
    dg_tensor *buf = last_logits(n, CH, C, x->dtype, &have_last);
    if (!buf) return -1;
    if (x->dtype == DG_F32)
        dg_nn_linear_cross_entropy_bwd_f32(N, D, C, CH, P(x), P(w), tp, at->ignore_index, P(n->saved[0]), dloss, count,
                                           P(buf), have_last, P(dx), P(dw), acc_dx, acc_dw);
    else
        dg_nn_linear_cross_entropy_bwd_f64(N, D, C, CH, P(x), P(w), tp, at->ignore_index, P(n->saved[0]), dloss, count,
                                           P(buf), have_last, P(dx), P(dw), acc_dx, acc_dw);
    return 0;
}

/* the reference: the unfused head and cross-entropy, [N, C] logits stored whole */
static int lce_decompose(const void *attrs, dg_tensor *const *in, dg_tensor **out) {
    const lce_attrs *at = (const lce_attrs *)attrs;
    out[0] = dg_cross_entropy(dg_linear(in[LCE_X], in[LCE_W], NULL), in[LCE_TARGETS], at->ignore_index);
    return out[0] ? 0 : -1;
}

dg_tensor *dg_linear_cross_entropy(dg_tensor *x, dg_tensor *w, dg_tensor *targets, int64_t ignore_index,
                                   int64_t chunk_rows) {
    const char *op = "linear_cross_entropy";
    if (!dg_nn_check_x(op, "x", x) || !dg_check_not_null(op, "w", w)) return NULL;
    if (!dg_check_same_dtype(op, "w", w, "x", x) || !dg_check_same_device(op, "w", w, "x", x)) return NULL;
    if (w->ndim != 2 || w->shape[1] != dg_nn_last(x) || w->shape[0] < 1) {
        dg_error("linear_cross_entropy: w has shape %s but must be [C,%lld] with C >= 1 classes for x %s (w is "
                 "[classes, features])",
                 dg_shp(w), (long long)dg_nn_last(x), dg_shp(x));
        return NULL;
    }
    if (!dg_nn_check_targets(op, targets, "x", x)) return NULL;
    if (chunk_rows < 0) {
        dg_error(
            "linear_cross_entropy: chunk_rows is %lld but must be >= 0 (0: chosen from the vocabulary; x %s, w %s)",
            (long long)chunk_rows, dg_shp(x), dg_shp(w));
        return NULL;
    }
    if (w->shape[0] > INT_MAX || w->shape[1] > INT_MAX) {
        dg_error("linear_cross_entropy: w %s exceeds the BLAS size limit (%d classes or features)", dg_shp(w), INT_MAX);
        return NULL;
    }
    if (targets->device == DG_CPU) {
        dg_tensor *c = dg_contiguous(targets);
        if (!c || !dg_nn_targets_valid(op, c, w->shape[0], ignore_index, "w", w)) return NULL;
    }
    lce_attrs at = {ignore_index, chunk_rows};
    dg_tensor *in[3] = {x, w, targets};
    return dg_apply1(&dg_op_linear_cross_entropy, &at, in);
}

/* Samples (x scaled so that softmax is far from uniform), with chunks smaller than the rows so that
 * several chunks and a shorter last one run:
 *   x [5,4], w [7,4], two ignored rows (-100), chunks of 2 (2+2+1);
 *   x [2,3,4], w [6,4], ignore_index 2 (a real class id as the padding id), chunks of 4 (4+2);
 *   every target ignored (loss 0, zero gradients), chunks of 2;
 *   x and w stored transposed (non-contiguous), the chunk chosen by size (one chunk);
 *   x [7,3], w [10,3], one row per chunk. */
static int lce_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    dg_rng rng = dg_rng_new(seed);
    dg_tensor *x, *w, *t;
    lce_attrs at = {-100, 2};
    switch (index) {
    case 0:
        x = dg_nn_sample_randn(&rng, dt, DG_SHAPE(5, 4), 1.5);
        w = DG_SAMPLE_RANDN(&rng, dt, 7, 4);
        t = dg_nn_sample_ids(&rng, DG_SHAPE(5), 7);
        ((int64_t *)dg_data_ptr(t))[1] = -100;
        ((int64_t *)dg_data_ptr(t))[4] = -100;
        break;
    case 1:
        at = (lce_attrs){2, 4};
        x = dg_nn_sample_randn(&rng, dt, DG_SHAPE(2, 3, 4), 1.5);
        w = DG_SAMPLE_RANDN(&rng, dt, 6, 4);
        t = dg_nn_sample_ids(&rng, DG_SHAPE(2, 3), 6);
        ((int64_t *)dg_data_ptr(t))[0] = 2;
        ((int64_t *)dg_data_ptr(t))[3] = 5;
        break;
    case 2:
        x = DG_SAMPLE_RANDN(&rng, dt, 3, 4);
        w = DG_SAMPLE_RANDN(&rng, dt, 5, 4);
        t = dg_from_data(DG_SHAPE(3), DG_I64, (int64_t[]){-100, -100, -100});
        break;
    case 3:
        at.chunk_rows = 0;
        x = dg_nn_sample_transposed(&rng, dt, DG_SHAPE(4, 5), 1.5);
        w = dg_nn_sample_transposed(&rng, dt, DG_SHAPE(6, 5), 1.0);
        t = dg_nn_sample_ids(&rng, DG_SHAPE(4), 6);
        break;
    case 4:
        at.chunk_rows = 1;
        x = dg_nn_sample_randn(&rng, dt, DG_SHAPE(7, 3), 1.5);
        w = DG_SAMPLE_RANDN(&rng, dt, 10, 3);
        t = dg_nn_sample_ids(&rng, DG_SHAPE(7), 10);
        break;
    default: return 0;
    }
    if (!x || !w || !t) return 0;
    snprintf(s->label, sizeof s->label, "x %s%s w %s targets %s ignore %lld chunk %lld", dg_shp(x),
             dg_is_contiguous(x) ? "" : " (strided)", dg_shp(w), dg_shp(t), (long long)at.ignore_index,
             (long long)at.chunk_rows);
    dg_sample_set(s, LCE_X, x, true);
    dg_sample_set(s, LCE_W, w, true);
    dg_sample_set(s, LCE_TARGETS, t, false);
    memcpy(s->attrs, &at, sizeof at);
    return 1;
}

const dg_op_def dg_op_linear_cross_entropy = {.name = "linear_cross_entropy",
                                              .n_in = 3,
                                              .n_out = 1,
                                              .in_names = {"x", "w", "targets"},
                                              .out_names = {"loss"},
                                              .attrs_size = sizeof(lce_attrs),
                                              .forward = lce_forward,
                                              .bwd = {{"default", lce_backward}},
                                              .decompose = lce_decompose,
                                              .sample = lce_sample,
                                              .atol_f64 = 1e-7,
                                              .rtol_f64 = 1e-6,
                                              .atol_f32 = 1e-4,
                                              .rtol_f32 = 1e-4};
