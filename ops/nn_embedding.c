/* embedding: y[..., :] = weight[ids[...], :],  weight [V,D] float, ids i64 of any shape (up to 5
 * dims), y [..., D].  Backward scatter-adds: dweight[v,:] = sum over positions with id v of dy.
 * ids are not differentiable.  An id outside [0,V) is an error naming the id, its position and V.
 * Device tensors: kernels/cuda/nn_embedding.cu (ids on the device too; they are checked there, one
 * synchronisation per forward; the backward's scatter-add is deterministic, by sorting).  A bf16
 * table on the device gives bf16 rows; its gradient sums in f32 and is rounded once. */
#include "ops/nn_common.h"
#include "kernels/cuda/nn_dispatch.h"

enum { EMB_W, EMB_IDS };

/* ids (contiguous, on the host) all lie in [0,V); else the error names the first bad one */
static bool ids_in_range(const dg_tensor *ids, const dg_tensor *w) {
    int64_t V = w->shape[0], val, bad = dg_first_bad_index("embedding", ids, V, false, 0, &val);
    if (bad == -1) return true;
    if (bad < 0) return false;
    dg_error("embedding: id %lld (ids %s, flat position %lld) is out of range for V = %lld (weight %s)", (long long)val,
             dg_shp(ids), (long long)bad, (long long)V, dg_shp(w));
    return false;
}

static int embedding_forward(dg_node *n) {
    bool fail = false;
    dg_tensor *w = dg_nn_contig(n->in[EMB_W], &fail), *ids = dg_nn_contig(n->in[EMB_IDS], &fail);
    if (fail) return -1;
    int64_t V = w->shape[0], D = w->shape[1], N = dg_numel(ids);
    /* checked by dg_embedding already; again here because tools apply the def directly */
    if (!ids_in_range(ids, w)) return -1;
    int64_t shape[DG_MAX_DIMS];
    memcpy(shape, ids->shape, sizeof(int64_t) * (size_t)ids->ndim);
    shape[ids->ndim] = D;
    dg_tensor *y = dg_empty_on(ids->ndim + 1, shape, w->dtype, w->device);
    if (!y) return -1;
    int rc = 0;
    NN_CALL(rc, w, embedding_fwd, N, V, D, dg_data_ptr(w), dg_data_ptr(ids), dg_data_ptr(y));
    if (rc) return -1;
    n->out[0] = y;
    return 0;
}

static int embedding_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    if (!n->needs_grad[EMB_W]) return 0;
    bool fail = false;
    dg_tensor *ids = dg_nn_contig(n->in[EMB_IDS], &fail), *dy = dg_nn_contig(gout[0], &fail);
    dg_tensor *dw = fail ? NULL : dg_empty_like(n->in[EMB_W]);
    if (!dw) return -1;
    int64_t V = dw->shape[0], D = dw->shape[1], N = dg_numel(ids);
    int rc = 0;
    NN_CALL(rc, dw, embedding_bwd, N, V, D, dg_data_ptr(ids), dg_data_ptr(dy), dg_data_ptr(dw));
    if (rc) return -1;
    gin[EMB_W] = dw;
    return 0;
}

dg_tensor *dg_embedding(dg_tensor *weight, dg_tensor *ids) {
    if (!dg_check_float_or_bf16("embedding", "weight", weight) || !dg_check_not_null("embedding", "ids", ids))
        return NULL;
    if (weight->ndim != 2) {
        dg_error("embedding: weight has shape %s but must be [V,D] (ids %s)", dg_shp(weight), dg_shp(ids));
        return NULL;
    }
    if (ids->dtype != DG_I64) {
        dg_error("embedding: ids has dtype %s (shape %s) but must be i64 (weight %s)", dg_dtype_name(ids->dtype),
                 dg_shp(ids), dg_shp(weight));
        return NULL;
    }
    if (!dg_check_same_device("embedding", "ids", ids, "weight", weight)) return NULL;
    if (ids->ndim + 1 > DG_MAX_DIMS) {
        dg_error("embedding: ids has shape %s; the output [..., D] would exceed %d dims", dg_shp(ids), DG_MAX_DIMS);
        return NULL;
    }
    if (ids->device == DG_CPU) {
        dg_tensor *c = dg_contiguous(ids);
        if (!c || !ids_in_range(c, weight)) return NULL;
    }
    dg_tensor *in[2] = {weight, ids};
    return dg_apply1(&dg_op_embedding, NULL, in);
}

/* Samples: ids [2,3] with repeats into V = 5; 1-D ids into a wider table; a 3-D ids tensor into
 * a weight stored transposed (non-contiguous); every row picked several times (V = 2). */
static int embedding_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    dg_rng rng = dg_rng_new(seed);
    dg_tensor *w, *ids;
    switch (index) {
    case 0:
        w = DG_SAMPLE_RANDN(&rng, dt, 5, 4);
        ids = dg_nn_sample_ids(&rng, DG_SHAPE(2, 3), 5);
        break;
    case 1:
        w = DG_SAMPLE_RANDN(&rng, dt, 9, 7);
        ids = dg_nn_sample_ids(&rng, DG_SHAPE(6), 9);
        break;
    case 2:
        w = dg_nn_sample_transposed(&rng, dt, DG_SHAPE(6, 3), 1.0);
        ids = dg_nn_sample_ids(&rng, DG_SHAPE(2, 2, 3), 6);
        break;
    case 3:
        w = DG_SAMPLE_RANDN(&rng, dt, 2, 5);
        ids = dg_nn_sample_ids(&rng, DG_SHAPE(8), 2);
        break;
    default: return 0;
    }
    snprintf(s->label, sizeof s->label, "weight %s%s ids %s", dg_shp(w), dg_is_contiguous(w) ? "" : " (strided)",
             dg_shp(ids));
    dg_sample_set(s, EMB_W, w, true);
    dg_sample_set(s, EMB_IDS, ids, false);
    return 1;
}

const dg_op_def dg_op_embedding = {.name = "embedding",
                                   .n_in = 2,
                                   .n_out = 1,
                                   .in_names = {"weight", "ids"},
                                   .out_names = {"y"},
                                   .attrs_size = 0,
                                   .forward = embedding_forward,
                                   .bwd = {{"default", embedding_backward}},
                                   .sample = embedding_sample,
                                   .atol_f64 = 1e-7,
                                   .rtol_f64 = 1e-6,
                                   .atol_f32 = 1e-5,
                                   .rtol_f32 = 1e-4};
