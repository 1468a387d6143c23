/* Elementwise ops: binary arithmetic with numpy broadcasting, scalar ops and unary maps.
 *
 *   add  y = a + b      da = sum_to(g, a),       db = sum_to(g, b)
 *   sub  y = a - b      da = sum_to(g, a),       db = -sum_to(g, b)
 *   mul  y = a * b      da = sum_to(g * b, a),   db = sum_to(g * a, b)
 *   div  y = a / b      da = sum_to(g / b, a),   db = -sum_to(g * y / b, b)
 *   unary y = f(x)      dx = g * f'(x)           (kernels/cpu/elementwise_impl.h lists f')
 * sum_to reduces a broadcast gradient back to the input's shape.
 * Device tensors run the same math through kernels/cuda/elementwise.cu (dg_cuda_binary over the
 * broadcast strides, dg_cuda_unary / dg_cuda_unary_bwd on contiguous arrays), in f32, f64 and, on
 * the device only, bf16: f32 arithmetic and each output and gradient rounded once to bf16 (the
 * broadcast sums of products are formed in f32 and rounded after the sum: binary_backward_bf16). */
#include "kernels/cpu/elementwise.h"
#include "ops/op.h"
#ifdef DG_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h" /* the CUDA kernels: f32, f64 and bf16 on the device */
#endif

#include <string.h>

typedef struct {
    int op;   /* dg_binary_op or dg_unary_op */
    double s; /* scalar of the scalar ops */
} ew_attrs;

/* ---- binary ---- */

static int binary_forward(dg_node *n) {
    const ew_attrs *a = (const ew_attrs *)n->attrs;
    dg_tensor *x = n->in[0], *y = n->in[1];
    int nd;
    int64_t shape[DG_MAX_DIMS];
    dg_broadcast_shapes(x->ndim, x->shape, y->ndim, y->shape, &nd, shape);
    dg_tensor *xe = dg_expand(x, nd, shape), *ye = dg_expand(y, nd, shape);
    dg_tensor *out = dg_empty_on(nd, shape, x->dtype, x->device);
    if (!xe || !ye || !out) return -1;
    if (x->device == DG_CUDA) {
#ifdef DG_HAVE_CUDA
        if (dg_cuda_binary(x->dtype, (dg_binary_op)a->op, nd, shape, dg_data_ptr(xe), xe->stride, dg_data_ptr(ye),
                           ye->stride, dg_data_ptr(out)))
            return -1;
        if (a->op == DG_BIN_DIV && x->dtype != DG_BF16) dg_save(n, out); /* bf16's dy comes from x */
        n->out[0] = out;
        return 0;
#endif
    }
    if (!dg_require_cpu(n->op->name, x)) return -1;
    dg_strided sa = {dg_data_ptr(xe), {0}}, sb = {dg_data_ptr(ye), {0}};
    memcpy(sa.stride, xe->stride, sizeof sa.stride);
    memcpy(sb.stride, ye->stride, sizeof sb.stride);
    if (x->dtype == DG_F32) dg_cpu_binary_f32((dg_binary_op)a->op, nd, shape, sa, sb, dg_data_ptr(out));
    else dg_cpu_binary_f64((dg_binary_op)a->op, nd, shape, sa, sb, dg_data_ptr(out));
    if (a->op == DG_BIN_DIV) dg_save(n, out);
    n->out[0] = out;
    return 0;
}

#ifdef DG_HAVE_CUDA
/* a op b broadcast, as f32, without autograd: the terms of a bf16 gradient kept in f32 until
 * their broadcast sum rounds once (a and b are f32 or bf16, on the device) */
static dg_tensor *wide_binary(dg_binary_op op, dg_tensor *a, dg_tensor *b) {
    if (!a || !b) return NULL;
    int nd;
    int64_t shape[DG_MAX_DIMS];
    dg_broadcast_shapes(a->ndim, a->shape, b->ndim, b->shape, &nd, shape);
    dg_tensor *ae = dg_expand(a, nd, shape), *be = dg_expand(b, nd, shape);
    dg_tensor *out = dg_empty_on(nd, shape, DG_F32, a->device);
    if (!ae || !be || !out ||
        dg_cuda_binary_mixed(a->dtype, b->dtype, DG_F32, op, nd, shape, dg_data_ptr(ae), ae->stride, dg_data_ptr(be),
                             be->stride, dg_data_ptr(out)))
        return NULL;
    return out;
}

/* bf16: each gradient rounded once.  A gradient that is a product and is summed over broadcast
 * dims is formed in f32 and rounded after the sum; without a broadcast it is the bf16 product
 * (one rounding).  dy of div, -g x / y^2, runs in f32 throughout from x (not from the rounded
 * output). */
static int binary_backward_bf16(dg_node *n, dg_tensor *g, dg_tensor **gin) {
    const ew_attrs *a = (const ew_attrs *)n->attrs;
    dg_tensor *x = n->in[0], *y = n->in[1];
    bool x_sum = !dg_same_shape(x, g), y_sum = !dg_same_shape(y, g);
    dg_binary_op op = (dg_binary_op)a->op;
    dg_tensor *gx = NULL, *gy = NULL;
    if (op == DG_BIN_ADD || op == DG_BIN_SUB) {
        if (n->needs_grad[0]) gx = dg_sum_to_shape(g, x->ndim, x->shape);
        if (n->needs_grad[1]) {
            gy = dg_sum_to_shape(g, y->ndim, y->shape);
            if (op == DG_BIN_SUB) gy = dg_neg(gy); /* exact */
        }
    } else {
        dg_binary_op gop = op == DG_BIN_MUL ? DG_BIN_MUL : DG_BIN_DIV; /* dx = g * y or g / y */
        if (n->needs_grad[0])
            gx = x_sum              ? dg_sum_to_shape_as(wide_binary(gop, g, y), x->ndim, x->shape, DG_BF16)
                 : op == DG_BIN_MUL ? dg_mul(g, y)
                                    : dg_div(g, y);
        if (n->needs_grad[1] && op == DG_BIN_MUL)
            gy = y_sum ? dg_sum_to_shape_as(wide_binary(DG_BIN_MUL, g, x), y->ndim, y->shape, DG_BF16) : dg_mul(g, x);
        if (n->needs_grad[1] && op == DG_BIN_DIV) {
            dg_tensor *t = wide_binary(DG_BIN_DIV, wide_binary(DG_BIN_DIV, wide_binary(DG_BIN_MUL, g, x), y), y);
            gy = dg_neg(dg_sum_to_shape_as(t, y->ndim, y->shape, DG_BF16));
        }
    }
    gin[0] = gx, gin[1] = gy;
    return (n->needs_grad[0] && !gin[0]) || (n->needs_grad[1] && !gin[1]) ? -1 : 0;
}
#endif

static int binary_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    const ew_attrs *a = (const ew_attrs *)n->attrs;
    dg_tensor *x = n->in[0], *y = n->in[1], *g = gout[0];
#ifdef DG_HAVE_CUDA
    if (x->dtype == DG_BF16) return binary_backward_bf16(n, g, gin);
#endif
    dg_tensor *gx = NULL, *gy = NULL;
    switch ((dg_binary_op)a->op) {
    case DG_BIN_ADD:
        gx = g;
        gy = g;
        break;
    case DG_BIN_SUB:
        gx = g;
        gy = n->needs_grad[1] ? dg_neg(g) : NULL;
        break;
    case DG_BIN_MUL:
        gx = n->needs_grad[0] ? dg_mul(g, y) : NULL;
        gy = n->needs_grad[1] ? dg_mul(g, x) : NULL;
        break;
    case DG_BIN_DIV: /* d(x/y)/dy = -x/y^2 = -out/y */
        gx = n->needs_grad[0] ? dg_div(g, y) : NULL;
        gy = n->needs_grad[1] ? dg_neg(dg_div(dg_mul(g, n->saved[0]), y)) : NULL;
        break;
    default: break;
    }
    if (n->needs_grad[0]) gin[0] = dg_sum_to_shape(gx, x->ndim, x->shape);
    if (n->needs_grad[1]) gin[1] = dg_sum_to_shape(gy, y->ndim, y->shape);
    return (n->needs_grad[0] && !gin[0]) || (n->needs_grad[1] && !gin[1]) ? -1 : 0;
}

static dg_tensor *binary(const char *name, const dg_op_def *def, dg_binary_op op, dg_tensor *x, dg_tensor *y) {
    if (!dg_check_float_or_bf16(name, "a", x) || !dg_check_float_or_bf16(name, "b", y)) return NULL;
    if (!dg_check_same_dtype(name, "b", y, "a", x) || !dg_check_same_device(name, "b", y, "a", x)) return NULL;
    int nd;
    int64_t shape[DG_MAX_DIMS];
    if (dg_broadcast_shapes(x->ndim, x->shape, y->ndim, y->shape, &nd, shape) != 0 || nd > DG_MAX_DIMS) {
        dg_error("%s: b has shape %s which does not broadcast with a %s", name, dg_shp(y), dg_shp(x));
        return NULL;
    }
    ew_attrs at = {op, 0};
    dg_tensor *in[2] = {x, y};
    return dg_apply1(def, &at, in);
}

/* Samples: same shapes, a broadcast against lower rank, and both operands stretched. */
static int binary_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s, dg_binary_op op) {
    dg_rng rng = dg_rng_new(seed);
    dg_tensor *a, *b;
    double lo = op == DG_BIN_DIV ? 0.5 : -1.0;
    switch (index) {
    case 0:
        a = DG_SAMPLE_RANDN(&rng, dt, 3, 4);
        b = DG_SAMPLE_RAND(&rng, dt, lo, 2.0, 3, 4);
        break;
    case 1:
        a = DG_SAMPLE_RANDN(&rng, dt, 2, 3, 5);
        b = DG_SAMPLE_RAND(&rng, dt, lo, 2.0, 5);
        break;
    case 2:
        a = DG_SAMPLE_RANDN(&rng, dt, 2, 1, 4);
        b = DG_SAMPLE_RAND(&rng, dt, lo, 2.0, 3, 1);
        break;
    default: return 0;
    }
    snprintf(s->label, sizeof s->label, "%s %s", dg_shp(a), dg_shp(b));
    dg_sample_set(s, 0, a, true);
    dg_sample_set(s, 1, b, true);
    ew_attrs at = {op, 0};
    memcpy(s->attrs, &at, sizeof at);
    return 1;
}

#define BINARY_OP(NAME, OP)                                                     \
    static int NAME##_sample(int i, dg_dtype dt, uint64_t seed, dg_sample *s) { \
        return binary_sample(i, dt, seed, s, OP);                               \
    }                                                                           \
    const dg_op_def dg_op_##NAME = {.name = #NAME,                              \
                                    .n_in = 2,                                  \
                                    .n_out = 1,                                 \
                                    .in_names = {"a", "b"},                     \
                                    .out_names = {"out"},                       \
                                    .attrs_size = sizeof(ew_attrs),             \
                                    .forward = binary_forward,                  \
                                    .bwd = {{"default", binary_backward}},      \
                                    .sample = NAME##_sample,                    \
                                    .atol_f64 = 1e-7,                           \
                                    .rtol_f64 = 1e-6,                           \
                                    .atol_f32 = 1e-5,                           \
                                    .rtol_f32 = 1e-4};                          \
    dg_tensor *dg_##NAME(dg_tensor *a, dg_tensor *b) { return binary(#NAME, &dg_op_##NAME, OP, a, b); }

BINARY_OP(add, DG_BIN_ADD)
BINARY_OP(sub, DG_BIN_SUB)
BINARY_OP(mul, DG_BIN_MUL)
BINARY_OP(div, DG_BIN_DIV)

/* ---- unary ---- */

/* neg, add_scalar, mul_scalar: the backward reads neither x nor y (a shell of x is enough) */
#define UNARY_CONSTANT_DERIVATIVE(OP) \
    ((OP) == DG_UN_NEG || (OP) == DG_UN_ADD_SCALAR || (OP) == DG_UN_MUL_SCALAR ? 1u : 0u)

/* What the derivative of op reads: the input x (log, pow, logsigmoid, silu, softplus), the output y
 * (exp, sqrt, rsqrt, sigmoid, tanh) or neither (neg, add_scalar, mul_scalar).  bf16 recomputes
 * from x in f32 wherever f' is not constant (its y is rounded). */
static void unary_reads(dg_unary_op op, dg_dtype dt, bool *x, bool *y) {
    const bool constant = UNARY_CONSTANT_DERIVATIVE(op);
    const bool of_y =
        op == DG_UN_EXP || op == DG_UN_SQRT || op == DG_UN_RSQRT || op == DG_UN_SIGMOID || op == DG_UN_TANH;
    *y = !constant && of_y && dt != DG_BF16;
    *x = !constant && !*y;
}

static int unary_forward(dg_node *n) {
    const ew_attrs *a = (const ew_attrs *)n->attrs;
    dg_tensor *x = dg_contiguous(n->in[0]);
    dg_tensor *y = x ? dg_empty_like(x) : NULL;
    if (!y) return -1;
    if (x->device == DG_CUDA) {
#ifdef DG_HAVE_CUDA
        if (dg_cuda_unary(x->dtype, (dg_unary_op)a->op, dg_numel(x), dg_data_ptr(x), dg_data_ptr(y), a->s)) return -1;
#else
        (void)dg_require_cpu(n->op->name, x);
        return -1;
#endif
    } else if (x->dtype == DG_F32)
        dg_cpu_unary_f32((dg_unary_op)a->op, a->s, dg_numel(x), dg_data_ptr(x), dg_data_ptr(y));
    else dg_cpu_unary_f64((dg_unary_op)a->op, a->s, dg_numel(x), dg_data_ptr(x), dg_data_ptr(y));
    bool keep_x, keep_y;
    unary_reads((dg_unary_op)a->op, x->dtype, &keep_x, &keep_y);
    dg_save(n, keep_x ? x : NULL); /* saved[0]: x or NULL, saved[1]: y or NULL */
    dg_save(n, keep_y ? y : NULL);
    n->out[0] = y;
    return 0;
}

static int unary_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    const ew_attrs *a = (const ew_attrs *)n->attrs;
    dg_tensor *x = n->saved[0], *y = n->saved[1], *g = dg_contiguous(gout[0]);
    dg_tensor *dx = g ? dg_empty_like(g) : NULL;
    if (!dx) return -1;
    const void *xp = x ? dg_data_ptr(x) : NULL, *yp = y ? dg_data_ptr(y) : NULL;
    if (g->device == DG_CUDA) {
#ifdef DG_HAVE_CUDA
        if (dg_cuda_unary_bwd(g->dtype, (dg_unary_op)a->op, dg_numel(g), xp, yp, dg_data_ptr(g), dg_data_ptr(dx), a->s))
            return -1;
#endif
    } else if (g->dtype == DG_F32)
        dg_cpu_unary_bwd_f32((dg_unary_op)a->op, a->s, dg_numel(g), xp, yp, dg_data_ptr(g), dg_data_ptr(dx));
    else dg_cpu_unary_bwd_f64((dg_unary_op)a->op, a->s, dg_numel(g), xp, yp, dg_data_ptr(g), dg_data_ptr(dx));
    gin[0] = dx;
    return 0;
}

static dg_tensor *unary(const char *name, const dg_op_def *def, dg_unary_op op, double s, dg_tensor *x) {
    if (!dg_check_float_or_bf16(name, "a", x)) return NULL;
    ew_attrs at = {op, s};
    return dg_apply1(def, &at, &x);
}

/* Inputs inside each function's domain: positive where log, sqrt, rsqrt or a real power need it. */
static int unary_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s, dg_unary_op op, double scalar) {
    dg_rng rng = dg_rng_new(seed);
    bool positive = op == DG_UN_LOG || op == DG_UN_SQRT || op == DG_UN_RSQRT || op == DG_UN_POW_SCALAR;
    dg_tensor *a;
    switch (index) {
    case 0: a = positive ? DG_SAMPLE_RAND(&rng, dt, 0.5, 2.0, 7) : DG_SAMPLE_RANDN(&rng, dt, 7); break;
    case 1: /* bf16: scaled in f32 on the host (bf16 arithmetic is the device's), then rounded */
        a = positive ? DG_SAMPLE_RAND(&rng, dt, 0.5, 2.0, 3, 4, 5)
                     : dg_to_dtype(dg_mul_scalar(DG_SAMPLE_RANDN(&rng, dt == DG_BF16 ? DG_F32 : dt, 3, 4, 5), 3.0), dt);
        break;
    default: return 0;
    }
    snprintf(s->label, sizeof s->label, "%s", dg_shp(a));
    dg_sample_set(s, 0, a, true);
    ew_attrs at = {op, scalar};
    memcpy(s->attrs, &at, sizeof at);
    return 1;
}

#define UNARY_DEF(NAME, OP, SCALAR)                                                \
    static int NAME##_sample(int i, dg_dtype dt, uint64_t seed, dg_sample *s) {    \
        return unary_sample(i, dt, seed, s, OP, SCALAR);                           \
    }                                                                              \
    const dg_op_def dg_op_##NAME = {.name = #NAME,                                 \
                                    .n_in = 1,                                     \
                                    .n_out = 1,                                    \
                                    .in_names = {"a"},                             \
                                    .out_names = {"out"},                          \
                                    .attrs_size = sizeof(ew_attrs),                \
                                    .forward = unary_forward,                      \
                                    .bwd = {{"default", unary_backward}},          \
                                    .bwd_skips_in = UNARY_CONSTANT_DERIVATIVE(OP), \
                                    .sample = NAME##_sample,                       \
                                    .atol_f64 = 1e-7,                              \
                                    .rtol_f64 = 1e-6,                              \
                                    .atol_f32 = 1e-5,                              \
                                    .rtol_f32 = 1e-4};
#define UNARY_OP(NAME, OP) \
    UNARY_DEF(NAME, OP, 0) \
    dg_tensor *dg_##NAME(dg_tensor *a) { return unary(#NAME, &dg_op_##NAME, OP, 0, a); }
#define SCALAR_OP(NAME, OP, SAMPLE_SCALAR) \
    UNARY_DEF(NAME, OP, SAMPLE_SCALAR)     \
    dg_tensor *dg_##NAME(dg_tensor *a, double s) { return unary(#NAME, &dg_op_##NAME, OP, s, a); }

UNARY_OP(neg, DG_UN_NEG)
SCALAR_OP(add_scalar, DG_UN_ADD_SCALAR, 0.7)
SCALAR_OP(mul_scalar, DG_UN_MUL_SCALAR, -1.3)
SCALAR_OP(pow_scalar, DG_UN_POW_SCALAR, 1.7)
UNARY_OP(exp, DG_UN_EXP)
UNARY_OP(log, DG_UN_LOG)
UNARY_OP(sqrt, DG_UN_SQRT)
UNARY_OP(rsqrt, DG_UN_RSQRT)
UNARY_OP(sigmoid, DG_UN_SIGMOID)
UNARY_OP(logsigmoid, DG_UN_LOGSIGMOID)
UNARY_OP(silu, DG_UN_SILU)
UNARY_OP(softplus, DG_UN_SOFTPLUS)
UNARY_OP(tanh, DG_UN_TANH)
