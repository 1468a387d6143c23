/* CUDA against CPU on the same inputs, driven by the op registry.
 *
 * For every registered op (the delta-rule family excepted: tests/test_cuda_delta_parity.c checks it
 * with the same harness, tests/support/cuda_parity.h, and its own tolerances), every sample of
 * its sampler, every backward variant, and two layouts (the sample's own, which includes
 * transposed views, and every input copied into a storage twice as long with doubled strides):
 * the op runs forward and backward on the CPU and on the GPU from the same values, with the same
 * random output weights W (backward of sum_j <out_j, W_j>), and the outputs and every input
 * gradient are compared by relative error norm ||gpu - cpu|| / ||cpu||:
 *   f32  <= 1e-5   (the two sides differ by rounding only: the device kernels accumulate in
 *                   double where the CPU ones do, cuBLAS runs strict f32 without TF32);
 *   f64  <= 1e-12;
 *   bf16, every registered op (the delta family excepted) whose device kernels take bf16
 *        (bf16 storage, f32 arithmetic; matmul and the network ops): the device in bf16 against
 *        the CPU in f32 from the same bf16-rounded inputs and output weights (samples drawn in
 *        f32, both layouts): <= 2^-8 = 3.9e-3, one bf16 unit roundoff.  Derivation:
 *        the device loads bf16 exactly into f32, computes and sums in f32, and rounds each output
 *        and each gradient once, so each element is off by at most 2^-9 relative (bf16 keeps 8
 *        significant bits: unit roundoff 2^-9) plus the f32-versus-double difference of the sums
 *        (about D 2^-24, under 1e-5 here), and the relative error norm by at most the same;
 *        2^-8 leaves a factor 2 for that f32 part and for cancellation (dx = r (g - x c) of the
 *        norms).  A second rounding (a bf16 intermediate fed back into the sum) would show up
 *        as errors near 2^-8 in the table.  Ops whose device forward or backward refuses
 *        bf16 (an error naming bf16) are listed by name as skipped; the network ops and matmul
 *        must not be among them.  Larger shapes in bf16 too (the same launch shapes as the f32
 *        ones below).
 * Device inputs keep the layout of the host ones (the whole storage is copied and viewed with the
 * same strides), so the strided paths of the device ops are exercised, not only the contiguous
 * ones.  Also: device copies (strided, dtype changes, both directions, fill), the optimiser's
 * AdamW update (bit-identical to the CPU one) and gradient norm, and that nothing leaks.
 * Every test skips where no GPU is present (dg_cuda_available()). */
#include "tests/support/cuda_parity.h"

#include "models/optim.h"

/* The delta-rule family: checked by tests/test_cuda_delta_parity.c. */
static const char *const delta_family[] = {
    "delta_rule",         "gated_delta_rule",     "kda",       "gdn_gate", "kda_gate",
    "chunk_local_cumsum", "chunk_scaled_dot_kkt", "solve_tril"};

static bool is_delta_family(const char *name) {
    for (size_t i = 0; i < sizeof delta_family / sizeof delta_family[0]; i++)
        if (!strcmp(delta_family[i], name)) return true;
    return false;
}

static void parity_all(dg_dtype dt, double tol) {
    dg_test_require_cuda();
    size_t tensors_before = dg_live_tensors(), device_before = dg_live_bytes(DG_CUDA);
    int ops = 0, cases = 0;
    print_message("%-16s %6s %14s %14s   (%s, tolerance %.0e)\n", "op", "cases", "max err out", "max err grad",
                  dg_dtype_name(dt), tol);
    for (int i = 0; i < dg_op_count(); i++) {
        const dg_op_def *def = dg_op_at(i);
        if (is_delta_family(def->name)) continue;
        op_stats st = parity_op(def, dt, tol, 2);
        assert_true(st.cases > 0);
        print_message("%-16s %6d %14.3e %14.3e\n", def->name, st.cases, st.worst_out, st.worst_grad);
        ops++;
        cases += st.cases;
    }
    print_message("%d ops, %d cases: cuda matches cpu in %s\n", ops, cases, dg_dtype_name(dt));
    assert_int_equal(dg_live_tensors(), tensors_before);
    assert_int_equal(dg_live_bytes(DG_CUDA), device_before);
}

static void test_registry_parity_f32(void **state) { parity_all(DG_F32, 1e-5); }
static void test_registry_parity_f64(void **state) { parity_all(DG_F64, 1e-12); }

/* ---- bf16, registry-driven ---- */

static const double bf16_tol = 0.00390625; /* 2^-8, see the header */

/* the ops whose device kernels take bf16: a refusal from one of them fails the test */
static const char *const takes_bf16[] = {"matmul",       "linear",        "embedding",           "rms_norm",
                                         "add_rms_norm", "l2norm",        "gated_rms_norm",      "conv1d",
                                         "swiglu",       "cross_entropy", "linear_cross_entropy"};

static void test_registry_parity_bf16(void **state) {
    dg_test_require_cuda();
    size_t tensors_before = dg_live_tensors(), device_before = dg_live_bytes(DG_CUDA);
    int ops = 0, cases = 0, skipped = 0;
    print_message("%-16s %6s %14s %14s   (bf16 on cuda vs f32 on cpu, tolerance %.3e)\n", "op", "cases", "max err out",
                  "max err grad", bf16_tol);
    for (int i = 0; i < dg_op_count(); i++) {
        const dg_op_def *def = dg_op_at(i);
        if (is_delta_family(def->name)) continue;
        char refusal[256];
        op_stats st = parity_op_bf16(def, bf16_tol, refusal, sizeof refusal);
        if (refusal[0]) {
            for (size_t k = 0; k < sizeof takes_bf16 / sizeof takes_bf16[0]; k++)
                if (!strcmp(takes_bf16[k], def->name)) fail_msg("%s refuses bf16 on cuda: %s", def->name, refusal);
            print_message("%-16s skipped: refuses bf16 (%s)\n", def->name, refusal);
            skipped++;
            continue;
        }
        assert_true(st.cases > 0);
        print_message("%-16s %6d %14.3e %14.3e\n", def->name, st.cases, st.worst_out, st.worst_grad);
        ops++;
        cases += st.cases;
    }
    print_message("%d ops, %d cases: cuda bf16 matches cpu f32; %d ops skipped (no bf16 on cuda)\n", ops, cases,
                  skipped);
    assert_int_equal(dg_live_tensors(), tensors_before);
    assert_int_equal(dg_live_bytes(DG_CUDA), device_before);
}

/* bf16 on the CPU is refused with a message (the product runs on the device only) */
static void test_matmul_bf16_cpu_refused(void **state) {
    dg_scope_begin();
    dg_tensor *a = as_bf16(dg_ones(DG_SHAPE(2, 3), DG_F32)), *b = as_bf16(dg_ones(DG_SHAPE(3, 2), DG_F32));
    assert_null(dg_matmul(a, b));
    assert_error_contains("cuda only");
    dg_scope_end();
}

/* ---- copies ---- */

static void test_device_copies(void **state) {
    dg_test_require_cuda();
    dg_scope_begin();
    dg_rng rng = dg_rng_new(5);
    dg_tensor *x = dg_randn(DG_SHAPE(3, 4, 5), DG_F64, &rng);
    dg_tensor *xt = dg_permute(x, (int[]){2, 0, 1}); /* [5,3,4], strided */
    /* host strided f64 -> device contiguous f32 (convert on the host side) */
    dg_tensor *d32 = dg_empty_on(DG_SHAPE(5, 3, 4), DG_F32, DG_CUDA);
    assert_int_equal(dg_copy_(d32, xt), 0);
    dg_tensor *h32 = dg_empty(DG_SHAPE(5, 3, 4), DG_F32);
    assert_int_equal(dg_copy_(h32, xt), 0);
    assert_true(dg_test_max_abs_diff(dg_to_device(d32, DG_CPU), h32) == 0);
    /* device strided -> device strided, one dtype */
    dg_tensor *dx = dg_to_device(x, DG_CUDA);
    dg_tensor *dperm = dg_permute(dx, (int[]){2, 0, 1});
    dg_tensor *dst = dg_empty_on(DG_SHAPE(4, 5, 3), DG_F64, DG_CUDA);
    dg_tensor *dst_view = dg_permute(dst, (int[]){1, 2, 0}); /* [5,3,4] view, strided */
    assert_int_equal(dg_copy_(dst_view, dperm), 0);
    assert_true(dg_test_max_abs_diff(dg_to_device(dst_view, DG_CPU), xt) == 0);
    /* device strided f64 -> device strided bf16 and back (cast on the device) */
    dg_tensor *bf = dg_empty_on(DG_SHAPE(4, 5, 3), DG_BF16, DG_CUDA);
    assert_int_equal(dg_copy_(dg_permute(bf, (int[]){1, 2, 0}), dperm), 0);
    dg_tensor *hbf = dg_empty(DG_SHAPE(5, 3, 4), DG_BF16);
    assert_int_equal(dg_copy_(hbf, xt), 0);
    assert_true(dg_test_max_abs_diff(dg_to_device(dg_permute(bf, (int[]){1, 2, 0}), DG_CPU), hbf) == 0);
    /* device strided -> host strided with a dtype change */
    dg_tensor *hdst = dg_empty(DG_SHAPE(4, 5, 3), DG_F32);
    assert_int_equal(dg_copy_(dg_permute(hdst, (int[]){1, 2, 0}), dperm), 0);
    assert_true(dg_test_max_abs_diff(dg_permute(hdst, (int[]){1, 2, 0}), h32) == 0);
    /* fill: contiguous and a strided view */
    dg_tensor *f = dg_zeros_on(DG_SHAPE(4, 6), DG_F32, DG_CUDA);
    assert_int_equal(dg_fill_(dg_slice(f, 1, 2, 5), 2.5), 0);
    dg_tensor *fh = dg_to_device(f, DG_CPU);
    for (int64_t r = 0; r < 4; r++)
        for (int64_t c = 0; c < 6; c++) assert_true(dg_get(fh, (int64_t[]){r, c}) == (c >= 2 && c < 5 ? 2.5 : 0.0));
    assert_int_equal(dg_fill_(f, -1.0), 0);
    assert_true(dg_item(dg_sum_all(f)) == -24.0);
    /* i64 through the device and back */
    dg_tensor *ids = dg_arange(0, 12, 1, DG_I64);
    dg_tensor *idt = dg_permute(dg_reshape(ids, DG_SHAPE(3, 4)), (int[]){1, 0});
    dg_tensor *back = dg_to_device(dg_to_device(idt, DG_CUDA), DG_CPU);
    assert_true(dg_test_max_abs_diff(back, idt) == 0);
    dg_scope_end();
}

/* an id out of range on the device is an error naming it, not a fault */
static void test_device_bad_ids(void **state) {
    dg_test_require_cuda();
    dg_scope_begin();
    dg_tensor *w = dg_to_device(dg_ones(DG_SHAPE(4, 3), DG_F32), DG_CUDA);
    dg_tensor *ids = dg_to_device(dg_from_data(DG_SHAPE(3), DG_I64, (int64_t[]){1, 7, 2}), DG_CUDA);
    assert_null(dg_embedding(w, ids));
    assert_error_contains("id 7");
    dg_tensor *logits = dg_to_device(dg_ones(DG_SHAPE(3, 4), DG_F32), DG_CUDA);
    dg_tensor *t = dg_to_device(dg_from_data(DG_SHAPE(3), DG_I64, (int64_t[]){-100, 0, -3}), DG_CUDA);
    assert_null(dg_cross_entropy(logits, t, -100));
    assert_error_contains("target -3");
    assert_null(dg_linear_cross_entropy(logits, dg_to_device(dg_ones(DG_SHAPE(5, 4), DG_F32), DG_CUDA), t, -100, 2));
    assert_error_contains("linear_cross_entropy: target -3");
    /* the device still works after both */
    assert_true(dg_item(dg_sum_all(logits)) == 12.0);
    dg_scope_end();
}

/* ---- larger shapes ----
 * The samplers' shapes are tiny (rows of at most 16), so the launch shapes that only larger inputs
 * reach get their own cases: rows over 1024 elements (a whole block per row), sums over rows cut
 * into several chunks (dw, dbias, db), many repeated embedding ids, batched products whose batch
 * dims do not merge into one cuBLAS call.  Same comparison, f32, <= 1e-5; and for the ops that
 * take bf16, the device in bf16 against the CPU in f32 from the same rounded inputs, <= 2^-8. */

typedef dg_tensor *(*big_fn)(dg_tensor *const *in);
static dg_tensor *f_rms(dg_tensor *const *in) { return dg_rms_norm(in[0], in[1], 1e-5); }
static dg_tensor *f_grms(dg_tensor *const *in) { return dg_gated_rms_norm(in[0], in[1], in[2], 1e-5); }
static dg_tensor *f_l2(dg_tensor *const *in) { return dg_l2norm(in[0], 1e-6); }
static dg_tensor *f_ce(dg_tensor *const *in) { return dg_cross_entropy(in[0], in[1], -100); }
static dg_tensor *f_lce(dg_tensor *const *in) { return dg_linear_cross_entropy(in[0], in[1], in[2], -100, 96); }
static dg_tensor *f_conv(dg_tensor *const *in) { return dg_conv1d(in[0], in[1], in[2], true); }
static dg_tensor *f_conv_plain(dg_tensor *const *in) { return dg_conv1d(in[0], in[1], NULL, false); }
static dg_tensor *f_emb(dg_tensor *const *in) { return dg_embedding(in[0], in[1]); }
static dg_tensor *f_lin(dg_tensor *const *in) { return dg_linear(in[0], in[1], in[2]); }
static dg_tensor *f_swiglu(dg_tensor *const *in) { return dg_swiglu(in[0], in[1]); }
static dg_tensor *f_sum1(dg_tensor *const *in) { return dg_sum(in[0], 1, (int[]){1}, false); }
static dg_tensor *f_mm(dg_tensor *const *in) { return dg_matmul(in[0], in[1]); }
static dg_tensor *f_arn(dg_tensor *const *in) { return dg_add_rms_norm(in[0], in[1], in[2], 1e-5, NULL); }

/* y = f(in) and the gradients of <y, W> on dev, as host tensors kept (W, bf16-representable for
 * a bf16 run, goes to the device in y's dtype) */
static void run_fn(big_fn f, int n, dg_tensor *const *host, dg_tensor *w, dg_device dev, dg_tensor **y_out,
                   dg_tensor **grads) {
    dg_scope_begin();
    dg_tensor *in[8] = {0};
    for (int k = 0; k < n; k++) {
        in[k] = same_layout_on(host[k], dev);
        if (in[k] && dg_dtype_is_float(in[k]->dtype)) dg_set_requires_grad(in[k], true);
    }
    dg_tensor *y = f(in);
    if (!y) fail_msg("forward on %s failed: %s", dg_device_name(dev), dg_last_error());
    if (w && dg_backward(y, dg_to_dtype(dg_to_device(w, dev), y->dtype)) != 0)
        fail_msg("backward on %s failed: %s", dg_device_name(dev), dg_last_error());
    *y_out = host_kept(y);
    for (int k = 0; k < n; k++) grads[k] = in[k] && in[k]->grad ? host_kept(in[k]->grad) : NULL;
    dg_scope_end();
}

/* f on the CPU and on the device from the same host inputs; bf16: the device gets the float
 * inputs rounded to bf16, the CPU the same rounded values in f32, and the tolerance is 2^-8 */
static void big_case_at(const char *name, big_fn f, int n, dg_tensor *const *host, bool bf16) {
    double tol = bf16 ? bf16_tol : 1e-5;
    dg_tensor *yc, *yg, *gc[8] = {0}, *gg[8] = {0}, *dev_in[8] = {0}, *ref_in[8] = {0};
    for (int k = 0; k < n; k++) {
        bool round = bf16 && host[k] && host[k]->dtype == DG_F32;
        dev_in[k] = round ? as_bf16(host[k]) : host[k];
        ref_in[k] = round ? as_f32(dev_in[k]) : host[k];
    }
    run_fn(f, n, ref_in, NULL, DG_CPU, &yc, gc);
    dg_rng rng = dg_rng_new(4242);
    dg_tensor *w = dg_randn(yc->ndim, yc->shape, DG_F32, &rng);
    if (bf16) w = as_f32(as_bf16(w));
    dg_release(yc);
    run_fn(f, n, ref_in, w, DG_CPU, &yc, gc);
    run_fn(f, n, dev_in, w, DG_CUDA, &yg, gg);
    double e = dg_test_rel_err(yg, yc), eg = 0;
    if (!(e <= tol)) fail_msg("%s: output differs: relative error norm %.3e", name, e);
    for (int k = 0; k < n; k++) {
        if (!gc[k] && !gg[k]) continue;
        if (!gc[k] || !gg[k]) fail_msg("%s: gradient %d present on one device only", name, k);
        double ek = dg_test_rel_err(gg[k], gc[k]);
        if (!(ek <= tol)) fail_msg("%s: gradient %d differs: relative error norm %.3e", name, k, ek);
        if (ek > eg) eg = ek;
        dg_release(gc[k]);
        dg_release(gg[k]);
    }
    print_message("%-40s %s out %.3e  grads %.3e\n", name, bf16 ? "bf16" : "f32 ", e, eg);
    dg_release(yc);
    dg_release(yg);
}

static void big_case(const char *name, big_fn f, int n, dg_tensor *const *host) {
    big_case_at(name, f, n, host, false);
    if (f != f_sum1) big_case_at(name, f, n, host, true); /* sum is not one of the ops that take bf16 */
}

static dg_tensor *ids_below(dg_rng *rng, int ndim, const int64_t *shape, int64_t hi, int64_t every_ignored) {
    dg_tensor *t = dg_empty(ndim, shape, DG_I64);
    int64_t *p = dg_data_ptr(t);
    for (int64_t i = 0; i < dg_numel(t); i++)
        p[i] = every_ignored && i % every_ignored == 0 ? -100 : (int64_t)(dg_rng_u32(rng) % (uint32_t)hi);
    return t;
}

static void test_larger_shapes(void **state) {
    dg_test_require_cuda();
    dg_scope_begin();
    dg_rng r = dg_rng_new(31);
#define RN(...) dg_randn(DG_SHAPE(__VA_ARGS__), DG_F32, &r)
    big_case("rms_norm [40,2048] (block per row)", f_rms, 2, (dg_tensor *[]){RN(40, 2048), RN(2048)});
    big_case("rms_norm [5000,24] (dw in 313 chunks)", f_rms, 2, (dg_tensor *[]){RN(5000, 24), RN(24)});
    big_case("gated_rms_norm [40,1500]", f_grms, 3, (dg_tensor *[]){RN(40, 1500), RN(40, 1500), RN(1500)});
    big_case("l2norm [33,1100]", f_l2, 1, (dg_tensor *[]){RN(33, 1100)});
    big_case("cross_entropy [64,3000]", f_ce, 2,
             (dg_tensor *[]){dg_mul_scalar(RN(64, 3000), 3.0), ids_below(&r, DG_SHAPE(64), 3000, 7)});
    big_case("cross_entropy [2000,10]", f_ce, 2, (dg_tensor *[]){RN(2000, 10), ids_below(&r, DG_SHAPE(2000), 10, 5)});
    big_case("linear_cross_entropy [300,64] x [3000,64] (chunks of 96)", f_lce, 3,
             (dg_tensor *[]){RN(300, 64), dg_mul_scalar(RN(3000, 64), 0.3), ids_below(&r, DG_SHAPE(300), 3000, 7)});
    big_case("conv1d [3,400,48] W 4 (dw in chunks)", f_conv, 3, (dg_tensor *[]){RN(3, 400, 48), RN(48, 4), RN(48)});
    /* the device kernel's tiles: 128 channels by 64 steps, windows of at most 4 or 8 */
    big_case("conv1d [2,200,300] W 4 (3 channel blocks, 4 tiles)", f_conv, 3,
             (dg_tensor *[]){RN(2, 200, 300), RN(300, 4), RN(300)});
    big_case("conv1d [2,130,70] W 7, plain", f_conv_plain, 2, (dg_tensor *[]){RN(2, 130, 70), RN(70, 7)});
    big_case("conv1d [1,70,5] W 8 (window across tiles)", f_conv, 3, (dg_tensor *[]){RN(1, 70, 5), RN(5, 8), RN(5)});
    big_case("conv1d [3,64,130] W 1", f_conv, 3, (dg_tensor *[]){RN(3, 64, 130), RN(130, 1), RN(130)});
    big_case("conv1d [2,150,1040] W 4 (9 channel blocks, the last partial)", f_conv, 3,
             (dg_tensor *[]){RN(2, 150, 1040), RN(1040, 4), RN(1040)});
    big_case("conv1d [1,70,16] W 8 (16 channels, window across tiles)", f_conv, 3,
             (dg_tensor *[]){RN(1, 70, 16), RN(16, 8), RN(16)});
    big_case("conv1d [16,2200,256] W 4 (35 tiles a sequence, the last partial)", f_conv, 3,
             (dg_tensor *[]){RN(16, 2200, 256), RN(256, 4), RN(256)});
    big_case("embedding [50,64] x 4000 ids", f_emb, 2,
             (dg_tensor *[]){RN(50, 64), ids_below(&r, DG_SHAPE(40, 100), 50, 0)});
    big_case("linear [300,70] x [90,70]", f_lin, 3, (dg_tensor *[]){RN(300, 70), RN(90, 70), RN(90)});
    big_case("swiglu [300,700]", f_swiglu, 2, (dg_tensor *[]){RN(300, 700), RN(300, 700)});
    big_case("sum over dim 1 of [64,5000]", f_sum1, 1, (dg_tensor *[]){RN(64, 5000)});
    big_case("matmul [4,3,64,32] x [3,32,48] (4 calls)", f_mm, 2, (dg_tensor *[]){RN(4, 3, 64, 32), RN(3, 32, 48)});
    big_case("matmul [2,5,64,32] x [32,16] (1 call)", f_mm, 2, (dg_tensor *[]){RN(2, 5, 64, 32), RN(32, 16)});
    big_case("add_rms_norm [40,2048] (block per row)", f_arn, 3, (dg_tensor *[]){RN(40, 2048), RN(40, 2048), RN(2048)});
    big_case("add_rms_norm [3000,64] (dw in chunks)", f_arn, 3, (dg_tensor *[]){RN(3000, 64), RN(3000, 64), RN(64)});
#undef RN
    dg_scope_end();
}

/* ---- optimiser ---- */

static dg_tensor *param(const char *name, dg_tensor *host, dg_device dev) {
    dg_tensor *p = dg_keep(dg_clone(dg_to_device(host, dev)));
    dg_set_name(p, name);
    return p;
}

static void test_adamw_matches_cpu_bitwise(void **state) {
    dg_test_require_cuda();
    dg_rng rng = dg_rng_new(11);
    dg_scope_begin();
    dg_tensor *w0 = dg_randn(DG_SHAPE(37, 19), DG_F32, &rng), *n0 = dg_randn(DG_SHAPE(19), DG_F32, &rng);
    dg_tensor *pc[2] = {param("layer.w", w0, DG_CPU), param("layer.norm", n0, DG_CPU)};
    dg_tensor *pg[2] = {param("layer.w", w0, DG_CUDA), param("layer.norm", n0, DG_CUDA)};
    dg_adamw_config cfg = dg_adamw_default_config();
    cfg.weight_decay = 0.1;
    dg_adamw *oc = dg_adamw_new(2, pc, &cfg), *og = dg_adamw_new(2, pg, &cfg);
    assert_non_null(oc);
    assert_non_null(og);
    for (int step = 0; step < 4; step++) {
        for (int i = 0; i < 2; i++) {
            dg_tensor *g = dg_mul_scalar(dg_randn(pc[i]->ndim, pc[i]->shape, DG_F32, &rng), step == 3 ? 100.0 : 1.0);
            dg_release(pc[i]->grad);
            dg_release(pg[i]->grad);
            pc[i]->grad = dg_keep(dg_clone(g));
            pg[i]->grad = dg_keep(dg_clone(dg_to_device(g, DG_CUDA)));
        }
        double nc = dg_grad_norm(2, pc), ng = dg_grad_norm(2, pg);
        assert_true(fabs(nc - ng) <= 1e-12 * nc);
        if (step == 3) { /* clipping scales every gradient the same way */
            double cc = dg_clip_grad_norm(2, pc, 1.0), cg = dg_clip_grad_norm(2, pg, 1.0);
            assert_true(fabs(cc - cg) <= 1e-12 * cc);
            for (int i = 0; i < 2; i++)
                assert_true(dg_test_rel_err(dg_to_device(pg[i]->grad, DG_CPU), pc[i]->grad) <= 1e-6);
            for (int i = 0; i < 2; i++) assert_int_equal(dg_copy_(pg[i]->grad, pc[i]->grad), 0); /* same inputs again */
        }
        assert_int_equal(dg_adamw_step(oc, 1e-2), 0);
        assert_int_equal(dg_adamw_step(og, 1e-2), 0);
        for (int i = 0; i < 2; i++) {
            size_t bytes = (size_t)dg_numel(pc[i]) * 4;
            dg_tensor *hp = dg_to_device(pg[i], DG_CPU), *hm = dg_to_device(og->m[i], DG_CPU),
                      *hv = dg_to_device(og->v[i], DG_CPU);
            if (memcmp(dg_data_ptr(hp), dg_data_ptr(pc[i]), bytes) ||
                memcmp(dg_data_ptr(hm), dg_data_ptr(oc->m[i]), bytes) ||
                memcmp(dg_data_ptr(hv), dg_data_ptr(oc->v[i]), bytes))
                fail_msg("adamw step %d: parameter %s differs from the CPU update (rel err %.3e)", step, pc[i]->name,
                         dg_test_rel_err(hp, pc[i]));
        }
    }
    dg_adamw_zero_grad(og);
    assert_true(dg_grad_norm(2, pg) == 0.0);
    dg_adamw_free(oc);
    dg_adamw_free(og);
    for (int i = 0; i < 2; i++) {
        dg_release(pc[i]);
        dg_release(pg[i]);
    }
    dg_scope_end();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_copies),       cmocka_unit_test(test_registry_parity_f32),
        cmocka_unit_test(test_registry_parity_f64), cmocka_unit_test(test_registry_parity_bf16),
        cmocka_unit_test(test_larger_shapes),       cmocka_unit_test(test_matmul_bf16_cpu_refused),
        cmocka_unit_test(test_device_bad_ids),      cmocka_unit_test(test_adamw_matches_cpu_bitwise),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
