/* cross_entropy: logits [..., C] float, targets [...] i64 (logits' shape without the last dim).
 * Rows whose target equals ignore_index are not scored; the loss is the mean over scored rows:
 *   loss = (1/count) sum_{scored n} (lse_n - logits[n, t_n]),   lse_n = log sum_c exp(logits[n,c])
 * computed stably (max subtracted).  count = 0 gives loss 0 and a zero gradient.
 * The output is a 0-dim tensor.  Forward saves lse [N]; backward:
 *   dlogits[n,c] = dloss / count (softmax[n,c] - [c == t_n]),  0 on ignored rows.
 * Device tensors (logits and targets on the device): kernels/cuda/nn_cross_entropy.cu.  The
 * forward checks the targets there (one synchronisation) and also saves the count as a device
 * i64 scalar, so that the backward reads count and dloss on the device without synchronising.
 * bf16 logits (device only) give an f32 loss (and f32 lse) and a bf16 dlogits. */
#include "ops/nn_common.h"
#include "kernels/cuda/nn_dispatch.h"

typedef struct {
    int64_t ignore_index;
} ce_attrs;

enum { CE_LOGITS, CE_TARGETS };

#define P(t) ((t) ? dg_data_ptr(t) : NULL)

/* targets (contiguous) are ignore_index or in [0,C) */
static bool targets_valid(const dg_tensor *t, const dg_tensor *logits, int64_t ignore) {
    return dg_nn_targets_valid("cross_entropy", t, dg_nn_last(logits), ignore, "logits", logits);
}

static int cross_entropy_forward(dg_node *n) {
    const ce_attrs *at = (const ce_attrs *)n->attrs;
    bool fail = false;
    dg_tensor *x = dg_nn_contig(n->in[CE_LOGITS], &fail), *t = dg_nn_contig(n->in[CE_TARGETS], &fail);
    if (fail || !targets_valid(t, x, at->ignore_index)) return -1;
    int64_t N = dg_nn_rows(x), C = dg_nn_last(x), count;
    dg_tensor *loss = dg_empty_on(0, NULL, dg_nn_stat_dtype(x->dtype), x->device);
    dg_tensor *lse = dg_empty_on(1, &N, dg_nn_stat_dtype(x->dtype), x->device);
    if (!loss || !lse) return -1;
    if (x->device == DG_CUDA) {
#ifdef DG_HAVE_CUDA
        dg_tensor *cnt = dg_empty_on(0, NULL, DG_I64, x->device);
        if (!cnt || dg_cuda_cross_entropy_fwd(x->dtype, N, C, P(x), P(t), at->ignore_index, P(loss), P(lse), P(cnt)))
            return -1;
        dg_save(n, lse);
        dg_save(n, cnt);
        n->out[0] = loss;
        return 0;
#else
        (void)dg_require_cpu("cross_entropy", x);
        return -1;
#endif
    }
    if (!dg_nn_cpu_float("cross_entropy", x)) return -1;
    if (x->dtype == DG_F32) dg_nn_cross_entropy_fwd_f32(N, C, P(x), P(t), at->ignore_index, P(loss), P(lse), &count);
    else dg_nn_cross_entropy_fwd_f64(N, C, P(x), P(t), at->ignore_index, P(loss), P(lse), &count);
    dg_save(n, lse);
    n->out[0] = loss;
    return 0;
}

static int cross_entropy_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    const ce_attrs *at = (const ce_attrs *)n->attrs;
    if (!n->needs_grad[CE_LOGITS]) return 0;
    bool fail = false;
    dg_tensor *x = dg_nn_contig(n->in[CE_LOGITS], &fail), *t = dg_nn_contig(n->in[CE_TARGETS], &fail);
    dg_tensor *dx = fail ? NULL : dg_empty_like(x);
    if (!dx) return -1;
    int64_t N = dg_nn_rows(x), C = dg_nn_last(x), count = 0;
#ifdef DG_HAVE_CUDA
    if (x->device == DG_CUDA) {
        /* dloss and the saved count stay on the device */
        if (dg_cuda_cross_entropy_bwd(x->dtype, N, C, P(x), P(t), at->ignore_index, P(n->saved[0]), P(gout[0]),
                                      P(n->saved[1]), P(dx)))
            return -1;
        gin[CE_LOGITS] = dx;
        return 0;
    }
#endif
    if (!dg_nn_cpu_float("cross_entropy", x)) return -1;
    const int64_t *tp = dg_data_ptr(t);
    for (int64_t i = 0; i < N; i++) count += tp[i] != at->ignore_index;
    double dloss = dg_item(gout[0]);
    if (x->dtype == DG_F32)
        dg_nn_cross_entropy_bwd_f32(N, C, P(x), tp, at->ignore_index, P(n->saved[0]), dloss, count, P(dx));
    else dg_nn_cross_entropy_bwd_f64(N, C, P(x), tp, at->ignore_index, P(n->saved[0]), dloss, count, P(dx));
    gin[CE_LOGITS] = dx;
    return 0;
}

dg_tensor *dg_cross_entropy(dg_tensor *logits, dg_tensor *targets, int64_t ignore_index) {
    const char *op = "cross_entropy";
    if (!dg_nn_check_x(op, "logits", logits) || !dg_nn_check_targets(op, targets, "logits", logits)) return NULL;
    if (dg_nn_last(logits) < 1) {
        dg_error("cross_entropy: logits has shape %s but needs at least one class", dg_shp(logits));
        return NULL;
    }
    if (targets->device == DG_CPU) {
        dg_tensor *c = dg_contiguous(targets);
        if (!c || !targets_valid(c, logits, ignore_index)) return NULL;
    }
    ce_attrs at = {ignore_index};
    dg_tensor *in[2] = {logits, targets};
    return dg_apply1(&dg_op_cross_entropy, &at, in);
}

/* Samples (logits scaled so that softmax is far from uniform):
 *   [5,7] with two ignored rows (-100); [2,3,6] with ignore_index 2 (a real class id used as the
 *   padding id); every target ignored (loss 0, zero gradient); logits stored transposed
 *   (non-contiguous); 1-D logits with a 0-dim target. */
static int cross_entropy_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    dg_rng rng = dg_rng_new(seed);
    dg_tensor *x, *t;
    ce_attrs at = {-100};
    switch (index) {
    case 0:
        x = dg_nn_sample_randn(&rng, dt, DG_SHAPE(5, 7), 3.0);
        t = dg_nn_sample_ids(&rng, DG_SHAPE(5), 7);
        ((int64_t *)dg_data_ptr(t))[1] = -100;
        ((int64_t *)dg_data_ptr(t))[4] = -100;
        break;
    case 1:
        at.ignore_index = 2;
        x = dg_nn_sample_randn(&rng, dt, DG_SHAPE(2, 3, 6), 2.0);
        t = dg_nn_sample_ids(&rng, DG_SHAPE(2, 3), 6);
        ((int64_t *)dg_data_ptr(t))[0] = 2;
        ((int64_t *)dg_data_ptr(t))[3] = 5;
        break;
    case 2:
        x = DG_SAMPLE_RANDN(&rng, dt, 3, 4);
        t = dg_from_data(DG_SHAPE(3), DG_I64, (int64_t[]){-100, -100, -100});
        break;
    case 3:
        x = dg_nn_sample_transposed(&rng, dt, DG_SHAPE(4, 5), 2.0);
        t = dg_nn_sample_ids(&rng, DG_SHAPE(4), 5);
        break;
    case 4:
        x = dg_nn_sample_randn(&rng, dt, DG_SHAPE(6), 2.0);
        t = dg_from_data(0, NULL, DG_I64, (int64_t[]){3});
        break;
    default: return 0;
    }
    if (!x || !t) return 0;
    snprintf(s->label, sizeof s->label, "logits %s%s targets %s ignore %lld", dg_shp(x),
             dg_is_contiguous(x) ? "" : " (strided)", dg_shp(t), (long long)at.ignore_index);
    dg_sample_set(s, CE_LOGITS, x, true);
    dg_sample_set(s, CE_TARGETS, t, false);
    memcpy(s->attrs, &at, sizeof at);
    return 1;
}

const dg_op_def dg_op_cross_entropy = {.name = "cross_entropy",
                                       .n_in = 2,
                                       .n_out = 1,
                                       .in_names = {"logits", "targets"},
                                       .out_names = {"loss"},
                                       .attrs_size = sizeof(ce_attrs),
                                       .forward = cross_entropy_forward,
                                       .bwd = {{"default", cross_entropy_backward}},
                                       .sample = cross_entropy_sample,
                                       .atol_f64 = 1e-7,
                                       .rtol_f64 = 1e-6,
                                       .atol_f32 = 1e-5,
                                       .rtol_f32 = 1e-4};
