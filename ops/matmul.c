/* Batched matmul with transpose flags and broadcast batch dims, through CBLAS.
 *   C[..., M, N] = op(A) op(B),  op(A) = A [..., M, K] or A^T when A is [..., K, M] (trans_a)
 * Backward (PyTorch's rules, with the flags):
 *   dA = dC op(B)^T            (A^T stored: dA = op(B) dC^T)
 *   dB = op(A)^T dC            (B^T stored: dB = dC^T op(A))
 * then summed over broadcast batch dims.  Any operand whose matrix is neither row- nor column-
 * major (unit stride in one of its last two dims) is copied; batch dims may have any stride,
 * including 0 (a broadcast weight is never copied per batch).  A transposed view is column major:
 * it becomes a cuBLAS / CBLAS transpose flag, never a copy.
 *
 * On the device: cuBLAS through dg_cuda_gemm (kernels/cuda/blas.cu), strided batched.  The batch
 * dims are merged where every operand's strides allow (C is contiguous), the innermost merged run
 * becomes one strided batched call (a broadcast operand has batch stride 0) and any outer runs
 * loop on the host: one call in the usual cases ([B,M,K] x [K,N], equal batches).  A weight shared
 * by the whole batch ([B,T,K] x [K,N]) folds the batch into the rows: one [B*T,K] x [K,N] product.
 * f32 (strict, no TF32) and f64.
 *
 * bf16 (device only) is storage: cuBLAS multiplies bf16 operands on the tensor cores with f32
 * accumulation (CUBLAS_COMPUTE_32F) and rounds the product once to bf16.  Backward:
 *   - each gradient is one product accumulated in f32 and rounded once: cuBLAS writes bf16
 *     directly when no batch dims are summed; otherwise the product is written in f32 and the
 *     broadcast sum rounds once (dg_sum_to_shape_as).  A 2-d weight shared by a batch of rows
 *     gets dB from one product over all rows (the batch folded into K), so the batch sum happens
 *     inside the GEMM's f32 accumulator, with no [B, K, N] temporary.
 *   - mixed precision: the bf16 operand made by dg_to_dtype from an f32 tensor (an f32 master
 *     weight cast for the step) receives its gradient in f32, straight from cuBLAS (bf16 operands,
 *     f32 result).  The cast's backward passes an f32 gradient through unchanged, so the master
 *     weight's gradient is the f32 accumulator itself: no bf16 rounding at all, and no
 *     round-to-bf16 and widen-to-f32 passes over it.  The autograd engine adds bf16 and f32
 *     contributions to such a cast in f32 (autograd/engine.c, accumulate_into), so a cast used by
 *     a matmul and by a bf16-only op still sums correctly. */
#include <cblas.h>

#include "kernels/cpu/gemm.h"
#include "ops/op.h"

#include <string.h>
#ifdef DG_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

typedef struct {
    bool ta, tb;
} matmul_attrs;

/* rows/cols of the stored matrix of x, and whether it is transposed in memory */
static bool blas_ready(const dg_tensor *x) {
    int d = x->ndim;
    return (x->stride[d - 1] == 1 && x->stride[d - 2] >= (x->shape[d - 1] > 1 ? x->shape[d - 1] : 1)) ||
           (x->stride[d - 2] == 1 && x->stride[d - 1] >= (x->shape[d - 2] > 1 ? x->shape[d - 2] : 1));
}

#ifdef DG_HAVE_CUDA
/* The batched product on the device into c (contiguous [batch..., M, N], dtype c_dt: a's dtype, or
 * f32 for bf16 operands); a and b are blas_ready. */
static int matmul_cuda(const dg_tensor *a, const dg_tensor *b, bool ta, bool tb, dg_tensor *c) {
    int da = a->ndim, db = b->ndim, nb = c->ndim - 2;
    int64_t M = c->shape[nb], N = c->shape[nb + 1], K = ta ? a->shape[da - 2] : a->shape[da - 1];
    bool arow = a->stride[da - 1] == 1, brow = b->stride[db - 1] == 1;
    int64_t lda = arow ? a->stride[da - 2] : a->stride[da - 1], ldb = brow ? b->stride[db - 2] : b->stride[db - 1];
    if (lda < 1) lda = 1;
    if (ldb < 1) ldb = 1;
    /* the stored matrix is op's transpose when (row-major) == (transposed), as in the CPU path */
    bool tra = arow == ta, trb = brow == tb;
    /* batch dims: strides of each operand (0 where broadcast), merged from the inside out */
    int m = 0;
    int64_t size[DG_MAX_DIMS], sa[DG_MAX_DIMS], sb[DG_MAX_DIMS], sc[DG_MAX_DIMS];
    for (int d = 0; d < nb; d++) {
        int64_t len = c->shape[d];
        if (len == 1) continue;
        int aj = d - (nb - (da - 2)), bj = d - (nb - (db - 2));
        int64_t xa = aj >= 0 && a->shape[aj] != 1 ? a->stride[aj] : 0;
        int64_t xb = bj >= 0 && b->shape[bj] != 1 ? b->stride[bj] : 0;
        int64_t xc = c->stride[d];
        if (m > 0 && sa[m - 1] == xa * len && sb[m - 1] == xb * len && sc[m - 1] == xc * len) {
            size[m - 1] *= len;
            sa[m - 1] = xa, sb[m - 1] = xb, sc[m - 1] = xc;
        } else {
            size[m] = len, sa[m] = xa, sb[m] = xb, sc[m] = xc;
            m++;
        }
    }
    int64_t inner = m ? size[m - 1] : 1, outer = 1;
    for (int d = 0; d + 1 < m; d++) outer *= size[d];
    /* b shared by the whole batch (stride 0), and a's rows (op(a) = a, row major) spaced evenly
     * through the batch as c's are: one product of inner * M rows instead of a batch of M-row
     * products (the usual [B, T, K] x [K, N]; one large GEMM keeps the tensor cores busier) */
    if (m == 1 && sb[0] == 0 && !ta && arow && sa[0] == M * lda && sc[0] == M * N) {
        M *= inner;
        inner = 1, m = 0;
    }
    size_t ea = dg_dtype_size(a->dtype), ec = dg_dtype_size(c->dtype);
    const char *ap = dg_data_ptr(a), *bp = dg_data_ptr(b);
    char *cp = dg_data_ptr(c);
    for (int64_t o = 0; o < outer; o++) {
        int64_t rem = o, ao = 0, bo = 0, co = 0;
        for (int d = m - 2; d >= 0; d--) {
            int64_t i = rem % size[d];
            rem /= size[d];
            ao += i * sa[d], bo += i * sb[d], co += i * sc[d];
        }
        if (dg_cuda_gemm(a->dtype, c->dtype, tra, trb, M, N, K, 1.0, ap + ao * (int64_t)ea, lda, m ? sa[m - 1] : 0,
                         bp + bo * (int64_t)ea, ldb, m ? sb[m - 1] : 0, 0.0, cp + co * (int64_t)ec, N,
                         m ? sc[m - 1] : M * N, inner))
            return -1;
    }
    return 0;
}
#endif

/* Output shape [batch..., M, N] of op(a) op(b). */
static int out_shape(const dg_tensor *a, const dg_tensor *b, bool ta, bool tb, int64_t *shape) {
    int da = a->ndim, db = b->ndim, nb;
    dg_broadcast_shapes(da - 2, a->shape, db - 2, b->shape, &nb, shape);
    shape[nb] = ta ? a->shape[da - 1] : a->shape[da - 2];
    shape[nb + 1] = tb ? b->shape[db - 2] : b->shape[db - 1];
    return nb + 2;
}

/* The product without autograd, of dtype out_dt: the device path of forward and of the bf16
 * backward (f32 results of bf16 operands). */
static dg_tensor *matmul_device(dg_tensor *a, dg_tensor *b, bool ta, bool tb, dg_dtype out_dt) {
#ifdef DG_HAVE_CUDA
    if (!blas_ready(a)) a = dg_clone(a);
    if (!blas_ready(b)) b = dg_clone(b);
    if (!a || !b) return NULL;
    int64_t shape[DG_MAX_DIMS];
    int nd = out_shape(a, b, ta, tb, shape);
    dg_tensor *c = dg_empty_on(nd, shape, out_dt, a->device);
    return c && matmul_cuda(a, b, ta, tb, c) == 0 ? c : NULL;
#else
    (void)b, (void)ta, (void)tb, (void)out_dt;
    dg_require_cpu("matmul", a);
    return NULL;
#endif
}

static int matmul_forward(dg_node *n) {
    const matmul_attrs *at = (const matmul_attrs *)n->attrs;
    dg_tensor *a = n->in[0], *b = n->in[1];
    if (a->device != DG_CPU) {
        n->out[0] = matmul_device(a, b, at->ta, at->tb, a->dtype);
        return n->out[0] ? 0 : -1;
    }
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
            dg_cpu_gemm_f32(tra == CblasTrans, trb == CblasTrans, M, N, K, 1.0f, (const float *)(ap + ao * (int64_t)es),
                            lda, (const float *)(bp + bo * (int64_t)es), ldb, 0.0f,
                            (float *)(cp + i * M * N * (int64_t)es), N);
        else
            dg_cpu_gemm_f64(tra == CblasTrans, trb == CblasTrans, M, N, K, 1.0, (const double *)(ap + ao * (int64_t)es),
                            lda, (const double *)(bp + bo * (int64_t)es), ldb, 0.0,
                            (double *)(cp + i * M * N * (int64_t)es), N);
    }
    n->out[0] = c;
    return 0;
}

/* t as [rows, cols] with its batch dims folded into the rows, when t (op(t) = t) is contiguous
 * and has batch dims; NULL otherwise.  A view: no copy. */
static dg_tensor *fold_rows(dg_tensor *t) {
    if (t->ndim <= 2 || !dg_is_contiguous(t)) return NULL;
    int64_t cols = t->shape[t->ndim - 1];
    return dg_reshape(t, 2, (int64_t[]){cols ? dg_numel(t) / cols : 0, cols});
}

/* The product c (the gradient of operand x, before any broadcast sum) as x's gradient: cuBLAS
 * writes it in dt directly when no batch dims are summed (one rounding for bf16); otherwise it is
 * made in f32 and summed, rounding once to dt. */
static dg_tensor *bf16_operand_grad(dg_tensor *p, dg_tensor *q, bool tp, bool tq, const dg_tensor *x, dg_dtype dt) {
    int64_t shape[DG_MAX_DIMS];
    int nd = out_shape(p, q, tp, tq, shape);
    bool same = nd == x->ndim && memcmp(shape, x->shape, sizeof(int64_t) * (size_t)nd) == 0;
    if (same) return matmul_device(p, q, tp, tq, dt);
    return dg_sum_to_shape_as(matmul_device(p, q, tp, tq, DG_F32), x->ndim, x->shape, dt);
}

/* bf16: products accumulate in f32; each gradient is rounded once to bf16 (or kept in f32 for the
 * bf16 cast of an f32 tensor).  A weight b [K, N] shared by a batch of rows gets its gradient
 * from one product over all rows (the batch folded into K), not a batch of products and a sum. */
static int matmul_backward_bf16(dg_node *n, dg_tensor *g, dg_tensor **gin) {
    const matmul_attrs *at = (const matmul_attrs *)n->attrs;
    dg_tensor *a = n->in[0], *b = n->in[1];
    if (n->needs_grad[0]) {
        dg_dtype dt = dg_cast_grad_dtype(a);
        gin[0] = at->ta ? bf16_operand_grad(b, g, at->tb, true, a, dt) : bf16_operand_grad(g, b, false, !at->tb, a, dt);
        if (!gin[0]) return -1;
    }
    if (n->needs_grad[1]) {
        dg_dtype dt = dg_cast_grad_dtype(b);
        dg_tensor *af = b->ndim == 2 && !at->ta ? fold_rows(a) : NULL, *gf = af ? fold_rows(g) : NULL;
        if (af && gf) gin[1] = at->tb ? matmul_device(gf, af, true, false, dt) : matmul_device(af, gf, true, false, dt);
        else
            gin[1] =
                at->tb ? bf16_operand_grad(g, a, true, at->ta, b, dt) : bf16_operand_grad(a, g, !at->ta, false, b, dt);
        if (!gin[1]) return -1;
    }
    return 0;
}

static int matmul_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    const matmul_attrs *at = (const matmul_attrs *)n->attrs;
    dg_tensor *a = n->in[0], *b = n->in[1], *g = gout[0];
    if (a->dtype == DG_BF16) return matmul_backward_bf16(n, g, gin);
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
    if (!dg_check_float_or_bf16("matmul", "a", a) || !dg_check_float_or_bf16("matmul", "b", b)) return NULL;
    if (!dg_check_same_dtype("matmul", "b", b, "a", a) || !dg_check_same_device("matmul", "b", b, "a", a)) return NULL;
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
    case 0:
        a = DG_SAMPLE_RANDN(&rng, dt, 3, 4);
        b = DG_SAMPLE_RANDN(&rng, dt, 4, 5);
        break;
    case 1:
        a = DG_SAMPLE_RANDN(&rng, dt, 2, 3, 4);
        b = DG_SAMPLE_RANDN(&rng, dt, 4, 2);
        break; /* broadcast b */
    case 2:
        at = (matmul_attrs){true, false};
        a = DG_SAMPLE_RANDN(&rng, dt, 2, 4, 3);
        b = DG_SAMPLE_RANDN(&rng, dt, 2, 4, 5);
        break;
    case 3:
        at = (matmul_attrs){false, true};
        a = DG_SAMPLE_RANDN(&rng, dt, 2, 1, 3, 4);
        b = DG_SAMPLE_RANDN(&rng, dt, 3, 5, 4);
        break;
    case 4:
        at = (matmul_attrs){true, true};
        a = DG_SAMPLE_RANDN(&rng, dt, 4, 3);
        b = DG_SAMPLE_RANDN(&rng, dt, 5, 4);
        break;
    default: return 0;
    }
    snprintf(s->label, sizeof s->label, "%s%s x %s%s", dg_shp(a), at.ta ? "^T" : "", dg_shp(b), at.tb ? "^T" : "");
    dg_sample_set(s, 0, a, true);
    dg_sample_set(s, 1, b, true);
    memcpy(s->attrs, &at, sizeof at);
    return 1;
}

const dg_op_def dg_op_matmul = {.name = "matmul",
                                .n_in = 2,
                                .n_out = 1,
                                .in_names = {"a", "b"},
                                .out_names = {"out"},
                                .attrs_size = sizeof(matmul_attrs),
                                .forward = matmul_forward,
                                .bwd = {{"default", matmul_backward}},
                                .sample = matmul_sample,
                                .atol_f64 = 1e-7,
                                .rtol_f64 = 1e-6,
                                .atol_f32 = 1e-4,
                                .rtol_f32 = 1e-4};
