/* The delta-rule family on CUDA against the CPU on the same inputs (harness:
 * tests/support/cuda_parity.h).
 *
 *  - registry, f32: every op of the family (delta_rule, gated_delta_rule, kda, gdn_gate, kda_gate,
 *    chunk_local_cumsum, chunk_scaled_dot_kkt, solve_tril), every sample of its sampler, both
 *    layouts, every backward variant: outputs and every gradient, relative error norm <= 1e-4
 *    (the bound for the family: the device kernels sum in other orders, and the chunked
 *    ones invert (I + A) per chunk, so rounding differences are amplified a little);
 *  - registry, f64: the gates and the pieces (which have f64 kernels on the device), <= 1e-12;
 *    the three fused ops refuse f64 on CUDA with a message (checked);
 *  - bf16 and f16 storage (q, k, v, beta 16-bit; gates and states f32) for the three fused ops,
 *    every sample and variant, against the CPU f32 run on the same rounded inputs and weights: the
 *    errors are printed per op (docs/CUDA.md records them) and bounded by BF16_TOL / F16_TOL;
 *  - larger shapes (chunk 64, K = V = 64 and 128, packed sequences, GVA, in-op L2 norm and gate)
 *    in f32, and in bf16 where the tensor-core path runs (chunk 64, K, V in {64, 128});
 *  - bad input: bf16 or f16 on the CPU, f64 on CUDA, f64 gates with bf16 storage, f16 q with a bf16
 *    beta: NULL and a message.
 * DG_PARITY_QUICK=1 (for compute-sanitizer) keeps the small cases only: one layout, no f64, no
 * larger shapes.  Every test skips where no GPU is present. */
#include "tests/support/cuda_parity.h"

#include "ops/delta/delta_common.h"

static const char *const family[] = {"delta_rule",         "gated_delta_rule",     "kda",       "gdn_gate", "kda_gate",
                                     "chunk_local_cumsum", "chunk_scaled_dot_kkt", "solve_tril"};
#define N_FAMILY ((int)(sizeof family / sizeof family[0]))
#define N_FUSED 3 /* the first three: no f64 on the device */

/* bf16 bound on the relative error norm: a few bf16 roundings (2^-9 each) of the outputs and of
 * the in-op normalised q, k, against a reference that rounds only its inputs.  Measured on an H100:
 * at most 4.0e-3 on outputs and 5.1e-3 on gradients over the registry samples,
 * 1.7e-3 .. 3.4e-3 on the larger shapes; the bound leaves a factor 2. */
#define BF16_TOL 1e-2
/* fp16 (11 significant bits against bf16's 8): every rounding 8 times smaller, so the bf16 bound
 * over 8 */
#define F16_TOL (BF16_TOL / 8)
static double tol16(dg_dtype dt) { return dt == DG_F16 ? F16_TOL : BF16_TOL; }

static bool quick(void) {
    const char *e = getenv("DG_PARITY_QUICK");
    return e && e[0] == '1';
}

static void family_parity(int first, int last, dg_dtype dt, double tol) {
    dg_test_require_cuda();
    size_t tensors_before = dg_live_tensors(), device_before = dg_live_bytes(DG_CUDA);
    print_message("%-22s %6s %14s %14s   (%s, tolerance %.0e)\n", "op", "cases", "max err out", "max err grad",
                  dg_dtype_name(dt), tol);
    for (int i = first; i < last; i++) {
        const dg_op_def *def = dg_op_find(family[i]);
        assert_non_null(def);
        op_stats st = parity_op(def, dt, tol, quick() ? 1 : 2);
        assert_true(st.cases > 0);
        print_message("%-22s %6d %14.3e %14.3e\n", def->name, st.cases, st.worst_out, st.worst_grad);
    }
    assert_int_equal(dg_live_tensors(), tensors_before);
    assert_int_equal(dg_live_bytes(DG_CUDA), device_before);
}

static void test_family_f32(void **state) { family_parity(0, N_FAMILY, DG_F32, 1e-4); }

static void test_pieces_f64(void **state) {
    if (quick()) dg_test_skip("left out by DG_PARITY_QUICK=1");
    family_parity(N_FUSED, N_FAMILY, DG_F64, 1e-12);
}

/* ---- 16-bit storage (bf16 or f16: dt) ---- */

static bool is_storage(const dg_delta_slots *sl, int k) {
    return k == sl->q || k == sl->k || k == sl->v || k == sl->beta;
}

/* o, hT and the input gradients of L = <f32(o), W0> + <hT, W1> on dev */
static void run_16(const dg_op_def *def, const void *attrs, dg_tensor *const *in_host, const bool *diff,
                   dg_tensor *const *w, int variant, dg_device dev, run_result *r) {
    dg_scope_begin();
    dg_tensor *in[DG_MAX_IO] = {0}, *out[DG_MAX_IO] = {0};
    for (int k = 0; k < def->n_in; k++) {
        in[k] = same_layout_on(in_host[k], dev);
        if (in[k] && diff[k]) dg_set_requires_grad(in[k], true);
    }
    if (dg_apply(def, attrs, in, out, variant) != 0)
        fail_msg("%s (%s) 16-bit on %s: forward failed: %s", def->name, def->bwd[variant].name, dg_device_name(dev),
                 dg_last_error());
    dg_tensor *loss = dg_add(dg_sum_all(dg_mul(dg_to_dtype(out[0], DG_F32), dg_to_device(w[0], dev))),
                             dg_sum_all(dg_mul(out[1], dg_to_device(w[1], dev))));
    if (!loss || dg_backward(loss, NULL) != 0)
        fail_msg("%s (%s) 16-bit on %s: backward failed: %s", def->name, def->bwd[variant].name, dg_device_name(dev),
                 dg_last_error());
    for (int j = 0; j < 2; j++) r->out[j] = host_kept(out[j]);
    for (int k = 0; k < def->n_in; k++) r->grad[k] = in[k] && diff[k] ? host_kept(in[k]->grad) : NULL;
    dg_scope_end();
}

typedef struct {
    double out, grad;
    int cases;
} stats16;

/* a and b hold the same bits (host tensors of one dtype and shape) */
static void same_bits(const char *what, const char *name, const dg_tensor *a, const dg_tensor *b) {
    if (!a && !b) return;
    if (!a || !b || a->dtype != b->dtype || dg_numel(a) != dg_numel(b) ||
        memcmp(dg_data_ptr(a), dg_data_ptr(b), (size_t)dg_numel(a) * dg_dtype_size(a->dtype)))
        fail_msg("%s: %s differs between the kept and the recomputed working set", what, name);
}

/* One sample (f32 host tensors): storage inputs rounded to dt (bf16 or f16); the CPU runs f32 on the
 * rounded values, the device dt storage; every variant.  The device runs twice, keeping the chunked
 * kernels' working set from the forward for the backward and not (attrs keep_forward): same bits. */
static void case16(dg_dtype dt, const dg_op_def *def, const dg_delta_slots *sl, const char *label, const void *attrs,
                   dg_tensor *const *in32, const bool *diff, uint64_t seed, stats16 *st) {
    const double tol = tol16(dt);
    const char *dn = dg_dtype_name(dt);
    dg_tensor *in_bf[DG_MAX_IO] = {0}, *in_ref[DG_MAX_IO] = {0};
    for (int k = 0; k < def->n_in; k++) {
        in_bf[k] = in_ref[k] = in32[k];
        if (in32[k] && is_storage(sl, k)) {
            in_bf[k] = dg_to_dtype(dg_contiguous(in32[k]), dt);
            in_ref[k] = as_f32(in_bf[k]);
        }
    }
    run_result ref = {0}, gpu = {0};
    dg_rng rng = dg_rng_new(seed);
    dg_no_grad_begin();
    dg_tensor *o = NULL, *outs[DG_MAX_IO] = {0};
    assert_int_equal(dg_apply(def, attrs, in_ref, outs, 0), 0);
    o = outs[0];
    dg_no_grad_end();
    dg_tensor *w[2] = {as_f32(dg_to_dtype(dg_randn(o->ndim, o->shape, DG_F32, &rng), dt)),
                       dg_randn(outs[1]->ndim, outs[1]->shape, DG_F32, &rng)};
    for (int v = 0; v < dg_op_variant_count(def); v++) {
        run_16(def, attrs, in_ref, diff, w, v, DG_CPU, &ref);
        run_16(def, attrs, in_bf, diff, w, v, DG_CUDA, &gpu);
        dg_delta_attrs flip = *(const dg_delta_attrs *)attrs;
        flip.keep_forward = !flip.keep_forward;
        run_result gpu2 = {0};
        run_16(def, &flip, in_bf, diff, w, v, DG_CUDA, &gpu2);
        char what[160];
        snprintf(what, sizeof what, "%s (%s) %s, %s", def->name, def->bwd[v].name, dn, label);
        for (int j = 0; j < 2; j++) same_bits(what, def->out_names[j], gpu.out[j], gpu2.out[j]);
        for (int k = 0; k < def->n_in; k++) same_bits(what, def->in_names[k], gpu.grad[k], gpu2.grad[k]);
        result_free(&gpu2);
        assert_int_equal(gpu.out[0]->dtype, dt);
        assert_int_equal(gpu.out[1]->dtype, DG_F32);
        for (int j = 0; j < 2; j++) {
            double e = dg_test_rel_err(gpu.out[j], ref.out[j]);
            if (!(e <= tol))
                fail_msg("%s (%s) %s, %s: output %s: relative error norm %.3e > %.2e", def->name, def->bwd[v].name, dn,
                         label, def->out_names[j], e, tol);
            st->out = fmax(st->out, e);
        }
        for (int k = 0; k < def->n_in; k++) {
            if (!ref.grad[k] && !gpu.grad[k]) continue;
            if (!ref.grad[k] || !gpu.grad[k])
                fail_msg("%s %s, %s: gradient d%s on one side only", def->name, dn, label, def->in_names[k]);
            assert_int_equal(gpu.grad[k]->dtype, is_storage(sl, k) ? dt : DG_F32);
            double e = dg_test_rel_err(gpu.grad[k], ref.grad[k]);
            if (!(e <= tol))
                fail_msg("%s (%s) %s, %s: gradient d%s: relative error norm %.3e > %.2e", def->name, def->bwd[v].name,
                         dn, label, def->in_names[k], e, tol);
            st->grad = fmax(st->grad, e);
        }
        result_free(&ref);
        result_free(&gpu);
        st->cases++;
    }
}

static const dg_delta_slots *slots_of(const dg_op_def *def) {
    return strcmp(def->name, "delta_rule") == 0 ? &dg_delta_slots_plain : &dg_delta_slots_gated;
}

static void fused16(dg_dtype dt) {
    dg_test_require_cuda();
    for (int i = 0; i < N_FUSED; i++) {
        const dg_op_def *def = dg_op_find(family[i]);
        stats16 st = {0};
        for (int n = 0; !quick() || n < 3; n++) {
            dg_scope_begin();
            dg_sample s = {0};
            if (def->sample(n, DG_F32, 300 + (uint64_t)n, &s) <= 0) {
                dg_sample_free(&s);
                dg_scope_end();
                break;
            }
            case16(dt, def, slots_of(def), s.label, s.attrs, s.in, s.differentiable, 55 + (uint64_t)n, &st);
            dg_sample_free(&s);
            dg_scope_end();
        }
        print_message("%-18s %s: %3d cases, max rel err out %.3e, grads %.3e (bound %.2e)\n", def->name,
                      dg_dtype_name(dt), st.cases, st.out, st.grad, tol16(dt));
    }
}
static void test_fused_bf16(void **state) { fused16(DG_BF16); }
static void test_fused_f16(void **state) { fused16(DG_F16); }

/* ---- larger shapes ---- */

typedef struct {
    const char *label;
    int64_t B, T, H, HV, K, V;
    bool varlen, l2norm, gate_in_kernel;
} big_cfg;

static const big_cfg bigs[] = {
    {"B2 T200 H2 K=V=64 chunk 64", 2, 200, 2, 2, 64, 64, false, false, false},
    {"varlen {0,70,71,300} H1 HV2 K=V=128, l2norm, gate in op", 1, 300, 1, 2, 128, 128, true, true, true},
    {"B1 T130 H2 HV4 K32 V48, l2norm", 1, 130, 2, 4, 32, 48, false, true, false},
};

/* the inputs of one larger case, f32 on the host, in the op's slots */
static void big_inputs(const big_cfg *c, const dg_op_def *def, dg_gate_kind gate, dg_rng *r, dg_tensor **in, bool *diff,
                       dg_delta_attrs *at) {
    const dg_delta_slots *sl = slots_of(def);
    int64_t N = c->varlen ? 3 : c->B;
    double ks = c->l2norm ? 1.0 : 1.0 / sqrt((double)c->K);
    in[sl->q] = dg_rand_range(DG_SHAPE(c->B, c->T, c->H, c->K), DG_F32, -1, 1, r);
    in[sl->k] = dg_rand_range(DG_SHAPE(c->B, c->T, c->H, c->K), DG_F32, -ks, ks, r);
    in[sl->v] = dg_rand_range(DG_SHAPE(c->B, c->T, c->HV, c->V), DG_F32, -1, 1, r);
    in[sl->beta] = dg_rand_range(DG_SHAPE(c->B, c->T, c->HV), DG_F32, 0.1, 0.9, r);
    in[sl->h0] = dg_rand_range(DG_SHAPE(N, c->HV, c->K, c->V), DG_F32, -0.5, 0.5, r);
    bool gik = c->gate_in_kernel && gate != DG_GATE_NONE;
    if (gate != DG_GATE_NONE) {
        double lo = gik ? -2 : -0.2, hi = gik ? 2 : -0.01;
        in[sl->g] = gate == DG_GATE_HEAD ? dg_rand_range(DG_SHAPE(c->B, c->T, c->HV), DG_F32, lo, hi, r)
                                         : dg_rand_range(DG_SHAPE(c->B, c->T, c->HV, c->K), DG_F32, lo, hi, r);
    }
    if (gik) {
        in[sl->A_log] = dg_rand_range(DG_SHAPE(c->HV), DG_F32, -2.5, -1.0, r);
        in[sl->dt_bias] = dg_rand_range(DG_SHAPE(gate == DG_GATE_HEAD ? c->HV : c->HV * c->K), DG_F32, -1, -0.5, r);
    }
    if (c->varlen) in[sl->cu] = dg_from_data(DG_SHAPE(4), DG_I64, (int64_t[]){0, 70, 71, 300});
    for (int k = 0; k < def->n_in; k++) diff[k] = in[k] && k != sl->cu;
    *at = (dg_delta_attrs){.gate = gate,
                           .scale = 1.0 / sqrt((double)c->K),
                           .chunk = 64,
                           .algorithm = DG_DELTA_CHUNKED,
                           .l2norm_qk = c->l2norm,
                           .gate_in_kernel = gik};
}

static void test_larger_shapes(void **state) {
    dg_test_require_cuda();
    if (quick()) dg_test_skip("left out by DG_PARITY_QUICK=1");
    for (int i = 0; i < N_FUSED; i++) {
        const dg_op_def *def = dg_op_find(family[i]);
        dg_gate_kind gate = i == 0 ? DG_GATE_NONE : i == 1 ? DG_GATE_HEAD : DG_GATE_CHANNEL;
        for (size_t c = 0; c < sizeof bigs / sizeof bigs[0]; c++) {
            dg_scope_begin();
            dg_rng r = dg_rng_new(900 + c);
            dg_tensor *in[DG_MAX_IO] = {0};
            bool diff[DG_MAX_IO] = {0};
            dg_delta_attrs at;
            big_inputs(&bigs[c], def, gate, &r, in, diff, &at);
            dg_sample s = {0};
            snprintf(s.label, sizeof s.label, "%s", bigs[c].label);
            memcpy(s.attrs, &at, sizeof at);
            double worst = 0;
            for (int v = 0; v < dg_op_variant_count(def); v++) {
                run_result cpu = {0}, gpu = {0};
                dg_tensor *w[DG_MAX_IO] = {0};
                dg_rng wr = dg_rng_new(17);
                const int64_t N = bigs[c].varlen ? 3 : bigs[c].B;
                w[0] = dg_randn(DG_SHAPE(bigs[c].B, bigs[c].T, bigs[c].HV, bigs[c].V), DG_F32, &wr);
                w[1] = dg_randn(DG_SHAPE(N, bigs[c].HV, bigs[c].K, bigs[c].V), DG_F32, &wr);
                run_op(def, &s, in, diff, w, v, DG_CPU, &cpu);
                run_op(def, &s, in, diff, w, v, DG_CUDA, &gpu);
                for (int j = 0; j < 2; j++)
                    check_close(def, &s, 0, def->out_names[j], gpu.out[j], cpu.out[j], 1e-4, &worst);
                for (int k = 0; k < def->n_in; k++)
                    check_close(def, &s, 0, def->in_names[k], gpu.grad[k], cpu.grad[k], 1e-4, &worst);
                result_free(&cpu);
                result_free(&gpu);
            }
            /* bf16 and f16 on the same inputs: the tensor-core path where it applies (gate NONE or
             * HEAD, K, V in {64, 128}; KDA in bf16 too), the generic one otherwise */
            stats16 bs = {0}, hs = {0};
            case16(DG_BF16, def, slots_of(def), bigs[c].label, &at, in, diff, 71, &bs);
            case16(DG_F16, def, slots_of(def), bigs[c].label, &at, in, diff, 71, &hs);
            print_message("%-18s %-58s f32 max err %.3e | bf16 out %.3e grads %.3e | f16 out %.3e grads %.3e\n",
                          def->name, bigs[c].label, worst, bs.out, bs.grad, hs.out, hs.grad);
            dg_scope_end();
        }
    }
}

/* ---- refusals ---- */

static void test_bad_dtypes(void **state) {
    dg_scope_begin();
    dg_rng r = dg_rng_new(3);
    dg_tensor *q = dg_rand_range(DG_SHAPE(1, 4, 1, 4), DG_F32, -1, 1, &r);
    dg_tensor *v = dg_rand_range(DG_SHAPE(1, 4, 1, 4), DG_F32, -1, 1, &r);
    dg_tensor *b = dg_rand_range(DG_SHAPE(1, 4, 1), DG_F32, 0.1, 0.9, &r);
    dg_tensor *g = dg_rand_range(DG_SHAPE(1, 4, 1), DG_F32, -0.5, -0.1, &r);
    /* bf16 on the cpu */
    assert_null(dg_delta_rule(as_bf16(q), as_bf16(q), as_bf16(v), as_bf16(b), NULL, NULL));
    assert_error_contains("bf16 inputs run on cuda only");
    dg_tensor *qh = dg_to_dtype(q, DG_F16), *vh = dg_to_dtype(v, DG_F16), *bh = dg_to_dtype(b, DG_F16);
    assert_null(dg_delta_rule(qh, qh, vh, bh, NULL, NULL));
    assert_error_contains("f16 inputs run on cuda only");
    if (dg_cuda_available()) {
#define D(t) dg_to_device(t, DG_CUDA)
        /* f64 on cuda */
        dg_tensor *q64 = dg_to_dtype(q, DG_F64), *v64 = dg_to_dtype(v, DG_F64), *b64 = dg_to_dtype(b, DG_F64);
        assert_null(dg_delta_rule(D(q64), D(q64), D(v64), D(b64), NULL, NULL));
        assert_error_contains("f64 inputs are not supported on cuda");
        /* bf16 storage with an f64 gate, and with a bf16 gate */
        dg_tensor *qb = D(as_bf16(q)), *vb = D(as_bf16(v)), *bb = D(as_bf16(b));
        assert_null(dg_gated_delta_rule(qb, qb, vb, D(dg_to_dtype(g, DG_F64)), bb, NULL, NULL));
        assert_error_contains("gates and states must be f32");
        assert_null(dg_gated_delta_rule(qb, qb, vb, D(as_bf16(g)), bb, NULL, NULL));
        assert_error_contains("gates and states must be f32");
        /* mixed devices */
        assert_null(dg_gated_delta_rule(D(q), D(q), D(v), g, D(b), NULL, NULL));
        assert_error_contains("g");
        /* and the right dtypes pass */
        dg_tensor *o = dg_gated_delta_rule(qb, qb, vb, D(g), bb, NULL, NULL);
        assert_non_null(o);
        assert_int_equal(o->dtype, DG_BF16);
        /* kda's chunked default on CUDA is its fused backward, as on the CPU (the faster on both) */
        dg_tensor *gk = dg_rand_range(DG_SHAPE(1, 4, 1, 4), DG_F32, -0.5, -0.1, &r);
        dg_tensor *vr = dg_clone(D(v));
        dg_set_requires_grad(vr, true);
        dg_tensor *ok = dg_kda(D(q), D(q), vr, D(gk), D(b), NULL, NULL);
        assert_non_null(ok);
        assert_int_equal(ok->node->variant, dg_op_variant_find(dg_op_find("kda"), "fused"));
        dg_tensor *qh = D(dg_to_dtype(q, DG_F16)), *vh = D(dg_to_dtype(v, DG_F16)), *bh = D(dg_to_dtype(b, DG_F16));
        o = dg_gated_delta_rule(qh, qh, vh, D(g), bh, NULL, NULL);
        assert_non_null(o);
        assert_int_equal(o->dtype, DG_F16);
        /* f16 with a bf16 beta: one storage dtype for q, k, v, beta */
        assert_null(dg_gated_delta_rule(qh, qh, vh, D(g), bb, NULL, NULL));
        assert_error_contains("beta");
#undef D
    }
    dg_scope_end();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_dtypes), cmocka_unit_test(test_family_f32), cmocka_unit_test(test_pieces_f64),
        cmocka_unit_test(test_fused_bf16), cmocka_unit_test(test_fused_f16),  cmocka_unit_test(test_larger_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
