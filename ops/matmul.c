/* Batched matmul with transpose flags and broadcast batch dims, through CBLAS.
 *   C[..., M, N] = op(A) op(B),  op(A) = A [..., M, K] or A^T when A is [..., K, M] (trans_a)
 * Backward (PyTorch's rules, with the flags):
 *   dA = dC op(B)^T            (A^T stored: dA = op(B) dC^T)
 *   dB = op(A)^T dC            (B^T stored: dB = dC^T op(A))
 * then summed over broadcast batch dims.  Any operand whose matrix is neither row- nor column-
 * major (unit stride in one of its last two dims) is copied; batch dims may have any stride,
 * including 0 (a broadcast weight is never copied per batch). */
#include <cblas.h>

#include "ops/op.h"

#include <string.h>

typedef struct {
    bool ta, tb;
} matmul_attrs;

/* rows/cols of the stored matrix of x, and whether it is transposed in memory */
static bool blas_ready(const dg_tensor *x) {
    int d = x->ndim;
    return (x->stride[d - 1] == 1 && x->stride[d - 2] >= (x->shape[d - 1] > 1 ? x->shape[d - 1] : 1)) ||
           (x->stride[d - 2] == 1 && x->stride[d - 1] >= (x->shape[d - 2] > 1 ? x->shape[d - 2] : 1));
}

static int matmul_forward(dg_node *n) {
    const matmul_attrs *at = (const matmul_attrs *)n->attrs;
    dg_tensor *a = n->in[0], *b = n->in[1];
    if (!dg_require_cpu("matmul", a)) return -1;
    if (!blas_ready(a)) a = dg_clone(a);
    if (!blas_ready(b)) b = dg_clone(b);
    if (!a || !b) return -1;
    int da = a->ndim, db = b->ndim;
    int64_t M = at->ta ? a->shape[da - 1] : a->shape[da - 2], K = at->ta ? a->shape[da - 2] : a->shape[da - 1];
    int64_t N = at->tb ? b->shape[db - 2] : b->shape[db - 1];
    int nb;
    int64_t batch[DG_MAX_DIMS];
    dg_broadcast_shapes(da - 2, a->shape, db - 2, b->shape, &nb, batch);
    int64_t oshape[DG_MAX_DIMS];
    memcpy(oshape, batch, sizeof(int64_t) * (size_t)nb);
    oshape[nb] = M;
    oshape[nb + 1] = N;
    dg_tensor *c = dg_empty_on(nb + 2, oshape, a->dtype, a->device);
    if (!c) return -1;
    int64_t nbatch = 1;
    for (int d = 0; d < nb; d++) nbatch *= batch[d];
    /* per operand: is the stored matrix row-major, and its leading dimension */
    bool arow = a->stride[da - 1] == 1, brow = b->stride[db - 1] == 1;
    int64_t lda = arow ? a->stride[da - 2] : a->stride[da - 1], ldb = brow ? b->stride[db - 2] : b->stride[db - 1];
    if (lda < 1) lda = 1;
    if (ldb < 1) ldb = 1;
    /* op(A) = A^T when (stored transposed) xor (ta) */
    CBLAS_TRANSPOSE tra = (arow != at->ta) ? CblasNoTrans : CblasTrans;
    CBLAS_TRANSPOSE trb = (brow != at->tb) ? CblasNoTrans : CblasTrans;
    /* with column-major storage the matrix seen row-major is X^T, so the flags above already
     * fold storage order and the requested transpose; leading dims are the row-major ones */
    size_t es = dg_dtype_size(a->dtype);
    char *ap = dg_data_ptr(a), *bp = dg_data_ptr(b), *cp = dg_data_ptr(c);
    for (int64_t i = 0; i < nbatch; i++) {
        int64_t rem = i, ao = 0, bo = 0;
        for (int d = nb - 1; d >= 0; d--) {
            int64_t idx = rem % batch[d];
            rem /= batch[d];
            int aj = d - (nb - (da - 2)), bj = d - (nb - (db - 2));
            if (aj >= 0 && a->shape[aj] != 1) ao += idx * a->stride[aj];
            if (bj >= 0 && b->shape[bj] != 1) bo += idx * b->stride[bj];
        }
        if (a->dtype == DG_F32)
            cblas_sgemm(CblasRowMajor, tra, trb, (int)M, (int)N, (int)K, 1.0f, (const float *)(ap + ao * (int64_t)es),
                        (int)lda, (const float *)(bp + bo * (int64_t)es), (int)ldb, 0.0f,
                        (float *)(cp + i * M * N * (int64_t)es), (int)N);
        else
            cblas_dgemm(CblasRowMajor, tra, trb, (int)M, (int)N, (int)K, 1.0, (const double *)(ap + ao * (int64_t)es),
                        (int)lda, (const double *)(bp + bo * (int64_t)es), (int)ldb, 0.0,
                        (double *)(cp + i * M * N * (int64_t)es), (int)N);
    }
    n->out[0] = c;
    return 0;
}

static int matmul_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    const matmul_attrs *at = (const matmul_attrs *)n->attrs;
    dg_tensor *a = n->in[0], *b = n->in[1], *g = gout[0];
    if (n->needs_grad[0]) {
        dg_tensor *ga = at->ta ? dg_matmul_t(b, g, at->tb, true) : dg_matmul_t(g, b, false, !at->tb);
        if (!(gin[0] = dg_sum_to_shape(ga, a->ndim, a->shape))) return -1;
    }
    if (n->needs_grad[1]) {
        dg_tensor *gb = at->tb ? dg_matmul_t(g, a, true, at->ta) : dg_matmul_t(a, g, !at->ta, false);
        if (!(gin[1] = dg_sum_to_shape(gb, b->ndim, b->shape))) return -1;
    }
    return 0;
}

dg_tensor *dg_matmul_t(dg_tensor *a, dg_tensor *b, bool ta, bool tb) {
    if (!dg_check_float("matmul", "a", a) || !dg_check_float("matmul", "b", b)) return NULL;
    if (!dg_check_same_dtype("matmul", "b", b, "a", a) || !dg_check_same_device("matmul", "b", b, "a", a))
        return NULL;
    if (a->ndim < 2 || b->ndim < 2) {
        dg_error("matmul: a %s and b %s must have at least 2 dims", dg_shp(a), dg_shp(b));
        return NULL;
    }
    int64_t ka = ta ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1];
    int64_t kb = tb ? b->shape[b->ndim - 1] : b->shape[b->ndim - 2];
    if (ka != kb) {
        dg_error("matmul: inner dims differ: a %s%s has %lld, b %s%s has %lld", dg_shp(a), ta ? " (transposed)" : "",
                 (long long)ka, dg_shp(b), tb ? " (transposed)" : "", (long long)kb);
        return NULL;
    }
    int nb;
    int64_t batch[DG_MAX_DIMS];
    if (dg_broadcast_shapes(a->ndim - 2, a->shape, b->ndim - 2, b->shape, &nb, batch) != 0 || nb + 2 > DG_MAX_DIMS) {
        dg_error("matmul: batch dims of a %s and b %s do not broadcast", dg_shp(a), dg_shp(b));
        return NULL;
    }
    matmul_attrs at = {ta, tb};
    dg_tensor *in[2] = {a, b};
    return dg_apply1(&dg_op_matmul, &at, in);
}

dg_tensor *dg_matmul(dg_tensor *a, dg_tensor *b) { return dg_matmul_t(a, b, false, false); }

static int matmul_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    dg_rng rng = dg_rng_new(seed);
    matmul_attrs at = {false, false};
    dg_tensor *a, *b;
    switch (index) {
    case 0: a = DG_SAMPLE_RANDN(&rng, dt, 3, 4); b = DG_SAMPLE_RANDN(&rng, dt, 4, 5); break;
    case 1: a = DG_SAMPLE_RANDN(&rng, dt, 2, 3, 4); b = DG_SAMPLE_RANDN(&rng, dt, 4, 2); break; /* broadcast b */
    case 2: at = (matmul_attrs){true, false}; a = DG_SAMPLE_RANDN(&rng, dt, 2, 4, 3); b = DG_SAMPLE_RANDN(&rng, dt, 2, 4, 5); break;
    case 3: at = (matmul_attrs){false, true}; a = DG_SAMPLE_RANDN(&rng, dt, 2, 1, 3, 4); b = DG_SAMPLE_RANDN(&rng, dt, 3, 5, 4); break;
    case 4: at = (matmul_attrs){true, true}; a = DG_SAMPLE_RANDN(&rng, dt, 4, 3); b = DG_SAMPLE_RANDN(&rng, dt, 5, 4); break;
    default: return 0;
    }
    snprintf(s->label, sizeof s->label, "%s%s x %s%s", dg_shp(a), at.ta ? "^T" : "", dg_shp(b), at.tb ? "^T" : "");
    dg_sample_set(s, 0, a, true);
    dg_sample_set(s, 1, b, true);
    memcpy(s->attrs, &at, sizeof at);
    return 1;
}

const dg_op_def dg_op_matmul = {.name = "matmul", .n_in = 2, .n_out = 1, .in_names = {"a", "b"},
                                .out_names = {"out"}, .attrs_size = sizeof(matmul_attrs),
                                .forward = matmul_forward, .bwd = {{"default", matmul_backward}},
                                .sample = matmul_sample, .atol_f64 = 1e-7, .rtol_f64 = 1e-6,
                                .atol_f32 = 1e-4, .rtol_f32 = 1e-4};
