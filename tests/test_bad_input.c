/* Bad input to the foundation ops: NULL inputs, wrong dtypes, wrong shapes.  Each returns NULL with
 * a message naming the op, the argument and the shapes. */
#include "tests/support/test_support.h"

#include "ops/op.h"

#include <string.h>

static dg_tensor *f32(int64_t a, int64_t b) { return dg_zeros(DG_SHAPE(a, b), DG_F32); }

/* Evaluates expr after clearing the error, then asserts NULL and the message. */
#define EXPECT_NULL(expr, msg)      \
    do {                            \
        dg_clear_error();           \
        assert_null(expr);          \
        assert_error_contains(msg); \
    } while (0)

static void test_null_inputs(void **state) {
    dg_scope_begin();
    dg_tensor *x = f32(2, 3);
    EXPECT_NULL(dg_add(NULL, x), "add: a is NULL");
    EXPECT_NULL(dg_sub(x, NULL), "sub: b is NULL");
    EXPECT_NULL(dg_mul(NULL, x), "mul: a is NULL");
    EXPECT_NULL(dg_div(x, NULL), "div: b is NULL");
    EXPECT_NULL(dg_neg(NULL), "neg: a is NULL");
    EXPECT_NULL(dg_exp(NULL), "exp: a is NULL");
    EXPECT_NULL(dg_log(NULL), "log: a is NULL");
    EXPECT_NULL(dg_sqrt(NULL), "sqrt: a is NULL");
    EXPECT_NULL(dg_rsqrt(NULL), "rsqrt: a is NULL");
    EXPECT_NULL(dg_sigmoid(NULL), "sigmoid: a is NULL");
    EXPECT_NULL(dg_logsigmoid(NULL), "logsigmoid: a is NULL");
    EXPECT_NULL(dg_silu(NULL), "silu: a is NULL");
    EXPECT_NULL(dg_softplus(NULL), "softplus: a is NULL");
    EXPECT_NULL(dg_tanh(NULL), "tanh: a is NULL");
    EXPECT_NULL(dg_add_scalar(NULL, 1), "add_scalar: a is NULL");
    EXPECT_NULL(dg_mul_scalar(NULL, 1), "mul_scalar: a is NULL");
    EXPECT_NULL(dg_pow_scalar(NULL, 2), "pow_scalar: a is NULL");
    EXPECT_NULL(dg_sum_all(NULL), "sum: a is NULL");
    EXPECT_NULL(dg_mean(NULL, 0, NULL, false), "mean: a is NULL");
    EXPECT_NULL(dg_matmul(x, NULL), "matmul: b is NULL");
    EXPECT_NULL(dg_reshape(NULL, DG_SHAPE(6)), "reshape: a is NULL");
    EXPECT_NULL(dg_permute(NULL, (int[]){1, 0}), "permute: a is NULL");
    EXPECT_NULL(dg_slice(NULL, 0, 0, 1), "slice: a is NULL");
    EXPECT_NULL(dg_expand(NULL, DG_SHAPE(2, 3)), "expand: a is NULL");
    EXPECT_NULL(dg_cat(2, (dg_tensor *[]){x, NULL}, 0), "cat: tensors[1] is NULL");
    EXPECT_NULL(dg_contiguous(NULL), "contiguous: a is NULL");
    EXPECT_NULL(dg_to_dtype(NULL, DG_F64), "to_dtype: a is NULL");
    /* NULL propagates through a chain without overwriting the first error */
    dg_clear_error();
    assert_null(dg_reshape(x, DG_SHAPE(7)));
    assert_null(dg_exp(dg_sum_all(NULL)));
    assert_error_contains("reshape: a has shape [2,3]");
    dg_scope_end();
}

static void test_wrong_dtypes(void **state) {
    dg_scope_begin();
    dg_tensor *x = f32(2, 3), *i = dg_zeros(DG_SHAPE(2, 3), DG_I64), *d = dg_zeros(DG_SHAPE(2, 3), DG_F64);
    assert_null(dg_exp(i));
    assert_error_contains("exp: a has dtype i64 (shape [2,3]) but a float dtype (f32 or f64) is required");
    assert_null(dg_add(x, d));
    assert_error_contains("add: b has dtype f64 (shape [2,3]) but a has f32 (shape [2,3])");
    assert_null(dg_matmul(x, dg_transpose(d, 0, 1)));
    assert_error_contains("matmul: b has dtype f64 (shape [3,2]) but a has f32 (shape [2,3])");
    assert_null(dg_sum_all(i));
    assert_error_contains("sum: a has dtype i64");
    assert_null(dg_cat(2, (dg_tensor *[]){x, d}, 0));
    assert_error_contains("cat: tensors[1] has dtype f64 (shape [2,3]) but tensors[0] has f32 (shape [2,3])");
    dg_scope_end();
}

/* bf16 is a storage dtype of the device kernels: on the CPU the network ops refuse it, naming op,
 * argument and shape; applied directly (past the typed check), the CPU path refuses it too rather
 * than reading its bits as a float type. */
static void test_bf16_on_cpu_refused(void **state) {
    dg_scope_begin();
    dg_tensor *xb = dg_to_dtype(f32(2, 4), DG_BF16), *wb = dg_to_dtype(dg_ones(DG_SHAPE(4), DG_F32), DG_BF16);
    dg_tensor *ids = dg_zeros(DG_SHAPE(2), DG_I64), *r = NULL;
    const char *tail = "has dtype bf16 (shape [2,4]) on cpu; bf16 runs on cuda only";
    char msg[160];
#define EXPECT_BF16_REFUSED(expr, op, arg)                     \
    do {                                                       \
        snprintf(msg, sizeof msg, "%s: %s %s", op, arg, tail); \
        EXPECT_NULL(expr, msg);                                \
    } while (0)
    EXPECT_BF16_REFUSED(dg_rms_norm(xb, wb, 1e-5), "rms_norm", "x");
    EXPECT_BF16_REFUSED(dg_gated_rms_norm(xb, xb, wb, 1e-5), "gated_rms_norm", "x");
    EXPECT_BF16_REFUSED(dg_l2norm(xb, 1e-6), "l2norm", "x");
    EXPECT_BF16_REFUSED(dg_add_rms_norm(xb, xb, wb, 1e-5, &r), "add_rms_norm", "h");
    assert_null(r);
    EXPECT_BF16_REFUSED(dg_swiglu(xb, xb), "swiglu", "gate");
    EXPECT_BF16_REFUSED(dg_linear(xb, dg_to_dtype(f32(3, 4), DG_BF16), NULL), "linear", "x");
    EXPECT_BF16_REFUSED(dg_cross_entropy(xb, ids, -100), "cross_entropy", "logits");
    EXPECT_BF16_REFUSED(dg_linear_cross_entropy(xb, dg_to_dtype(f32(3, 4), DG_BF16), ids, -100, 0),
                        "linear_cross_entropy", "x");
    EXPECT_BF16_REFUSED(dg_embedding(xb, ids), "embedding", "weight");
    snprintf(msg, sizeof msg, "conv1d: x has dtype bf16 (shape [1,2,4]) on cpu; bf16 runs on cuda only");
    EXPECT_NULL(dg_conv1d(dg_reshape(xb, DG_SHAPE(1, 2, 4)), dg_to_dtype(f32(4, 2), DG_BF16), NULL, true), msg);
#undef EXPECT_BF16_REFUSED
    dg_tensor *out[2] = {NULL, NULL};
    dg_clear_error();
    assert_int_not_equal(dg_apply(&dg_op_rms_norm, &(double){1e-5}, (dg_tensor *[]){xb, wb}, out, -1), 0);
    assert_error_contains("rms_norm_fwd: [2,4] has dtype bf16 on the cpu, whose kernels take f32 or f64");
    dg_clear_error();
    assert_int_not_equal(dg_apply(&dg_op_add_rms_norm, &(double){1e-5}, (dg_tensor *[]){xb, xb, wb}, out, -1), 0);
    assert_error_contains("add_rms_norm_fwd: [2,4] has dtype bf16 on the cpu");
    dg_scope_end();
}

static void test_wrong_shapes(void **state) {
    dg_scope_begin();
    dg_tensor *x = f32(2, 3);
    assert_null(dg_mul(x, f32(3, 2)));
    assert_error_contains("mul: b has shape [3,2] which does not broadcast with a [2,3]");
    assert_null(dg_matmul(x, f32(2, 3)));
    assert_error_contains("matmul: inner dims differ: a [2,3] has 3, b [2,3] has 2");
    assert_null(dg_matmul(dg_zeros(DG_SHAPE(3), DG_F32), x));
    assert_error_contains("matmul: a [3] and b [2,3] must have at least 2 dims");
    assert_null(dg_matmul(dg_zeros(DG_SHAPE(2, 2, 3), DG_F32), dg_zeros(DG_SHAPE(3, 3, 4), DG_F32)));
    assert_error_contains("matmul: batch dims of a [2,2,3] and b [3,3,4] do not broadcast");
    assert_null(dg_permute(x, (int[]){0, 0}));
    assert_error_contains("permute: perm is not a permutation of the 2 dims of a [2,3]");
    assert_null(dg_slice(x, 1, 2, 5));
    assert_error_contains("slice: [2, 5) is outside dim 1 of a [2,3]");
    assert_null(dg_slice(x, 3, 0, 1));
    assert_error_contains("slice: dim 3 out of range for a [2,3]");
    assert_null(dg_expand(x, DG_SHAPE(4, 3)));
    assert_error_contains("expand: a has shape [2,3] which cannot be broadcast to [4,3]");
    assert_null(dg_cat(2, (dg_tensor *[]){x, f32(2, 4)}, 0));
    assert_error_contains("cat: tensors[1] has shape [2,4] but tensors[0] has [2,3] (cat along dim 0)");
    assert_null(dg_sum(x, 1, (int[]){2}, false));
    assert_error_contains("sum: dim 2 out of range for a [2,3]");
    assert_null(dg_transpose(x, 0, 5));
    assert_error_contains("transpose: dims (0, 5) out of range for a [2,3]");
    assert_int_not_equal(dg_backward(x, NULL), 0);
    assert_error_contains("backward: loss [2,3] does not require grad");
    dg_scope_end();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_null_inputs),
        cmocka_unit_test(test_wrong_dtypes),
        cmocka_unit_test(test_bf16_on_cpu_refused),
        cmocka_unit_test(test_wrong_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
