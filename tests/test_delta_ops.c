/* The delta-rule family through its ops (delta_rule, gated_delta_rule, kda, gdn_gate, kda_gate):
 *  - on every registered sample, in f64: the recurrent algorithm (forward and backward) against the
 *    autograd of the decomposition, and every backward variant with the chunked forward against the
 *    recurrent reference, on o, the final state and every gradient (1e-10 relative);
 *  - the gate fused into the op (use_gate_in_kernel) against the separate gate op; the L2 norm fused
 *    into the op against the same norm from primitives; the fusions' results kept from the forward
 *    for the backward against made again there (the same bits);
 *  - f32 against f64;
 *  - the choice of backward variant: per call, by DG_BACKWARD, and by the algorithm;
 *  - the pieces (chunk_local_cumsum, chunk_scaled_dot_kkt, solve_tril) against a decomposition and
 *    the definition of the inverse;
 *  - bad inputs: each a NULL result and a message naming op, argument and shapes. */
#include "tests/support/test_support.h"

#include "ops/delta/delta_common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- running an op on a sample and collecting everything -------------------------------------- */

#define MAXT 16 /* outputs (2) + gradients (<= 9) */

typedef struct result {
    int n;
    dg_tensor *t[MAXT]; /* kept (released by result_free) */
    const char *name[MAXT];
} result;

static void result_free(result *r) {
    for (int i = 0; i < r->n; i++) dg_release(r->t[i]);
    r->n = 0;
}

/* max |a - b| / max |b| (0 when both are all zeros) */
static double rel_max(const dg_tensor *a, const dg_tensor *b) {
    double den = 0;
    int64_t idx[DG_MAX_DIMS] = {0};
    do {
        den = fmax(den, fabs(dg_get(b, idx)));
    } while (dg_next_index(b->ndim, b->shape, idx));
    double num = dg_test_max_abs_diff(a, b);
    return den > 0 ? num / den : num;
}

/* how: -1 = decomposition, else a backward variant index.  attrs may be changed by the caller.
 * L = sum(o Wo) + sum(hT Wh); r gets o, hT and the gradient of every differentiable input. */
static int run(const dg_op_def *def, const dg_sample *s, const void *attrs, int how, dg_dtype dt, result *r) {
    dg_scope_begin();
    dg_tensor *in[DG_MAX_IO] = {0}, *out[DG_MAX_IO] = {0};
    for (int k = 0; k < def->n_in; k++) {
        if (!s->in[k]) continue;
        in[k] = s->in[k]->dtype == DG_I64 ? s->in[k] : dg_to_dtype(dg_clone(s->in[k]), dt);
        if (s->differentiable[k]) {
            in[k] = dg_clone(in[k]);
            dg_set_requires_grad(in[k], true);
        }
    }
    int rc = how < 0 ? def->decompose(attrs, in, out) : dg_apply(def, attrs, in, out, how);
    if (rc == 0) {
        dg_rng rng = dg_rng_new(77);
        dg_tensor *loss = NULL;
        for (int i = 0; i < def->n_out; i++) {
            /* drawn in f64 so that f32 and f64 runs weigh the outputs alike */
            dg_tensor *w = dg_to_dtype(dg_rand_range(out[i]->ndim, out[i]->shape, DG_F64, -1, 1, &rng), dt);
            dg_tensor *li = dg_sum_all(dg_mul(out[i], w));
            loss = loss ? dg_add(loss, li) : li;
        }
        rc = dg_backward(loss, NULL);
    }
    r->n = 0;
    if (rc == 0) {
        for (int i = 0; i < def->n_out; i++) {
            r->name[r->n] = def->out_names[i];
            r->t[r->n++] = dg_keep(dg_to_dtype(out[i], DG_F64));
        }
        for (int k = 0; k < def->n_in; k++)
            if (s->differentiable[k] && in[k]) {
                r->name[r->n] = def->in_names[k];
                r->t[r->n++] = dg_keep(in[k]->grad ? dg_to_dtype(in[k]->grad, DG_F64) : dg_zeros_like(in[k]));
            }
    }
    dg_scope_end();
    return rc;
}

static double compare(const result *a, const result *b, const char *what, double tol) {
    assert_int_equal(a->n, b->n);
    double worst = 0;
    for (int i = 0; i < a->n; i++) {
        double e = rel_max(a->t[i], b->t[i]);
        if (e > tol) print_message("    %s: %s differs by %.3e (relative to its max)\n", what, a->name[i], e);
        worst = fmax(worst, e);
    }
    return worst;
}

static const char *const family[3] = {"delta_rule", "gated_delta_rule", "kda"};

/* recurrent (forward + backward) against the decomposition's autograd, every sample */
static void test_recurrent_vs_decomposition(void **st) {
    (void)st;
    for (int f = 0; f < 3; f++) {
        const dg_op_def *def = dg_op_find(family[f]);
        assert_non_null(def);
        const int rec = dg_op_variant_find(def, "recurrent");
        assert_true(rec >= 0);
        for (int i = 0;; i++) {
            dg_scope_begin();
            dg_sample s = {0};
            int have = def->sample(i, DG_F64, 1234 + i, &s);
            dg_scope_end();
            if (!have) break;
            dg_delta_attrs at;
            memcpy(&at, s.attrs, sizeof at);
            at.algorithm = DG_DELTA_RECURRENT;
            result ref = {0}, dec = {0};
            assert_int_equal(run(def, &s, &at, rec, DG_F64, &ref), 0);
            assert_int_equal(run(def, &s, &at, -1, DG_F64, &dec), 0);
            double e = compare(&dec, &ref, s.label, 1e-12);
            print_message("  %-16s %-58s decomposition vs recurrent %.1e\n", def->name, s.label, e);
            assert_true(e < 1e-12);
            result_free(&ref);
            result_free(&dec);
            dg_sample_free(&s);
        }
    }
}

/* every backward variant, with the chunked forward, against the recurrent reference */
static void test_chunked_variants_vs_recurrent(void **st) {
    (void)st;
    for (int f = 0; f < 3; f++) {
        const dg_op_def *def = dg_op_find(family[f]);
        const int rec = dg_op_variant_find(def, "recurrent");
        for (int i = 0;; i++) {
            dg_scope_begin();
            dg_sample s = {0};
            int have = def->sample(i, DG_F64, 99 + i, &s);
            dg_scope_end();
            if (!have) break;
            dg_delta_attrs at;
            memcpy(&at, s.attrs, sizeof at);
            at.algorithm = DG_DELTA_RECURRENT;
            result ref = {0};
            assert_int_equal(run(def, &s, &at, rec, DG_F64, &ref), 0);
            at.algorithm = DG_DELTA_CHUNKED;
            for (int c = 16; c <= 64; c *= 2) {
                at.chunk = c;
                for (int v = 0; v < dg_op_variant_count(def); v++) {
                    result got = {0};
                    int rc = run(def, &s, &at, v, DG_F64, &got);
                    if (rc != 0) fail_msg("%s %s chunk %d: %s", def->name, def->bwd[v].name, c, dg_last_error());
                    double e = compare(&got, &ref, def->bwd[v].name, 1e-10);
                    if (c == 16)
                        print_message("  %-16s %-10s %-50s vs recurrent %.1e\n", def->name, def->bwd[v].name, s.label,
                                      e);
                    assert_true(e < 1e-10);
                    result_free(&got);
                }
            }
            result_free(&ref);
            dg_sample_free(&s);
        }
    }
}

/* f32 against f64, recurrent and (when present) chunked */
static void test_f32_vs_f64(void **st) {
    (void)st;
    for (int f = 0; f < 3; f++) {
        const dg_op_def *def = dg_op_find(family[f]);
        dg_scope_begin();
        dg_sample s = {0};
        assert_true(def->sample(1, DG_F64, 5, &s));
        dg_scope_end();
        for (int algo = 0; algo < 2; algo++) {
            dg_delta_attrs at;
            memcpy(&at, s.attrs, sizeof at);
            at.algorithm = algo;
            const int v = algo == DG_DELTA_RECURRENT ? dg_op_variant_find(def, "recurrent") : 0;
            result r64 = {0}, r32 = {0};
            assert_int_equal(run(def, &s, &at, v, DG_F64, &r64), 0);
            assert_int_equal(run(def, &s, &at, v, DG_F32, &r32), 0);
            double e = compare(&r32, &r64, "f32", 1e-5);
            print_message("  %-16s %-10s f32 vs f64 %.1e\n", def->name, algo ? "recurrent" : "chunked", e);
            assert_true(e < 1e-5);
            result_free(&r64);
            result_free(&r32);
        }
        dg_sample_free(&s);
    }
}

/* ---- fused preprocessing against the separate path --------------------------------------------- */

typedef struct fused_case {
    dg_tensor *q, *k, *v, *a, *beta, *h0, *A, *b;
} fused_case;

static void grads_of(dg_tensor *loss, dg_tensor **xs, int n, dg_tensor **g) {
    assert_int_equal(dg_backward(loss, NULL), 0);
    for (int i = 0; i < n; i++) {
        g[i] = xs[i]->grad ? dg_clone(xs[i]->grad) : NULL;
        dg_zero_grad(xs[i]);
    }
}

static void check_gate_fused(bool kda, dg_delta_algorithm algo) {
    dg_scope_begin();
    dg_rng rng = dg_rng_new(3);
    const int64_t B = 1, T = 21, H = 1, HV = 2, K = 4, V = 3;
    dg_tensor *q = dg_rand_range(DG_SHAPE(B, T, H, K), DG_F64, -1, 1, &rng);
    dg_tensor *k = dg_rand_range(DG_SHAPE(B, T, H, K), DG_F64, -0.5, 0.5, &rng);
    dg_tensor *v = dg_rand_range(DG_SHAPE(B, T, HV, V), DG_F64, -1, 1, &rng);
    dg_tensor *a = kda ? dg_rand_range(DG_SHAPE(B, T, HV, K), DG_F64, -3, 2, &rng)
                       : dg_rand_range(DG_SHAPE(B, T, HV), DG_F64, -3, 2, &rng);
    dg_tensor *beta = dg_rand_range(DG_SHAPE(B, T, HV), DG_F64, 0.1, 0.9, &rng);
    dg_tensor *A = dg_rand_range(DG_SHAPE(HV), DG_F64, -2, 0, &rng);
    dg_tensor *b = dg_rand_range(DG_SHAPE(kda ? HV * K : HV), DG_F64, -1, 0.5, &rng);
    dg_tensor *w = dg_rand_range(DG_SHAPE(B, T, HV, V), DG_F64, -1, 1, &rng);
    dg_tensor *xs[4] = {a, A, b, k};
    for (int i = 0; i < 4; i++) dg_set_requires_grad(xs[i], true);
    dg_delta_opts o = {.algorithm = algo, .chunk_size = 16};
    /* separate: g = gate(a, A_log, dt_bias), then the op on g */
    dg_tensor *g = kda ? dg_kda_gate(a, A, b) : dg_gdn_gate(a, A, b);
    dg_tensor *o1 = kda ? dg_kda(q, k, v, g, beta, &o, NULL) : dg_gated_delta_rule(q, k, v, g, beta, &o, NULL);
    assert_non_null(o1);
    dg_tensor *g1[4], *g2[4];
    grads_of(dg_sum_all(dg_mul(o1, w)), xs, 4, g1);
    /* fused */
    o.use_gate_in_kernel = true;
    o.A_log = A;
    o.dt_bias = b;
    dg_tensor *o2 = kda ? dg_kda(q, k, v, a, beta, &o, NULL) : dg_gated_delta_rule(q, k, v, a, beta, &o, NULL);
    assert_non_null(o2);
    grads_of(dg_sum_all(dg_mul(o2, w)), xs, 4, g2);
    double e = rel_max(o2, o1);
    const char *names[4] = {"da", "dA_log", "ddt_bias", "dk"};
    for (int i = 0; i < 4; i++) {
        assert_non_null(g1[i]);
        assert_non_null(g2[i]);
        double ei = rel_max(g2[i], g1[i]);
        if (ei > 1e-12) print_message("    %s differs by %.2e\n", names[i], ei);
        e = fmax(e, ei);
    }
    print_message("  %s %s: gate fused vs separate op %.1e\n", kda ? "kda" : "gated_delta_rule",
                  algo ? "recurrent" : "chunked", e);
    assert_true(e < 1e-12);
    dg_scope_end();
}

static void test_gate_fused_vs_separate(void **st) {
    (void)st;
    check_gate_fused(false, DG_DELTA_RECURRENT);
    check_gate_fused(true, DG_DELTA_RECURRENT);
    check_gate_fused(false, DG_DELTA_CHUNKED);
    check_gate_fused(true, DG_DELTA_CHUNKED);
}

static dg_tensor *l2n(dg_tensor *x) {
    const int last = 3;
    return dg_mul(x, dg_rsqrt(dg_add_scalar(dg_sum(dg_mul(x, x), 1, &last, true), DG_DELTA_L2NORM_EPS)));
}

static void test_l2norm_fused_vs_separate(void **st) {
    (void)st;
    dg_scope_begin();
    dg_rng rng = dg_rng_new(4);
    const int64_t B = 2, T = 9, H = 2, HV = 4, K = 5, V = 3;
    dg_tensor *q = dg_rand_range(DG_SHAPE(B, T, H, K), DG_F64, -2, 2, &rng);
    dg_tensor *k = dg_rand_range(DG_SHAPE(B, T, H, K), DG_F64, -2, 2, &rng);
    dg_tensor *v = dg_rand_range(DG_SHAPE(B, T, HV, V), DG_F64, -1, 1, &rng);
    dg_tensor *beta = dg_rand_range(DG_SHAPE(B, T, HV), DG_F64, 0.1, 0.9, &rng);
    dg_tensor *w = dg_rand_range(DG_SHAPE(B, T, HV, V), DG_F64, -1, 1, &rng);
    dg_tensor *xs[2] = {q, k};
    dg_set_requires_grad(q, true);
    dg_set_requires_grad(k, true);
    dg_delta_opts o = {.algorithm = DG_DELTA_RECURRENT};
    dg_tensor *o1 = dg_delta_rule(l2n(q), l2n(k), v, beta, &o, NULL), *g1[2], *g2[2];
    assert_non_null(o1);
    grads_of(dg_sum_all(dg_mul(o1, w)), xs, 2, g1);
    o.use_qk_l2norm_in_kernel = true;
    dg_tensor *o2 = dg_delta_rule(q, k, v, beta, &o, NULL);
    assert_non_null(o2);
    grads_of(dg_sum_all(dg_mul(o2, w)), xs, 2, g2);
    double e = fmax(rel_max(o2, o1), fmax(rel_max(g2[0], g1[0]), rel_max(g2[1], g1[1])));
    print_message("  delta_rule: l2norm fused vs primitives %.1e\n", e);
    assert_true(e < 1e-12);
    dg_scope_end();
}

/* The forward keeps the fused preprocessing's results (the normalised q, k, their 1/|x|, the gate)
 * for the backward unless recompute_in_backward (ops/delta/delta_common.c, SAVED_*): both ways give the
 * same bits, for every input's gradient, with both fusions on. */
static void check_keep_vs_recompute(dg_delta_algorithm algo) {
    dg_scope_begin();
    dg_rng rng = dg_rng_new(5);
    const int64_t B = 2, T = 19, H = 2, HV = 4, K = 6, V = 3;
    dg_tensor *q = dg_rand_range(DG_SHAPE(B, T, H, K), DG_F64, -2, 2, &rng);
    dg_tensor *k = dg_rand_range(DG_SHAPE(B, T, H, K), DG_F64, -2, 2, &rng);
    dg_tensor *v = dg_rand_range(DG_SHAPE(B, T, HV, V), DG_F64, -1, 1, &rng);
    dg_tensor *a = dg_rand_range(DG_SHAPE(B, T, HV), DG_F64, -3, 2, &rng);
    dg_tensor *beta = dg_rand_range(DG_SHAPE(B, T, HV), DG_F64, 0.1, 0.9, &rng);
    dg_tensor *A = dg_rand_range(DG_SHAPE(HV), DG_F64, -2, 0, &rng);
    dg_tensor *b = dg_rand_range(DG_SHAPE(HV), DG_F64, -1, 0.5, &rng);
    dg_tensor *w = dg_rand_range(DG_SHAPE(B, T, HV, V), DG_F64, -1, 1, &rng);
    dg_tensor *xs[7] = {q, k, v, a, beta, A, b};
    for (int i = 0; i < 7; i++) dg_set_requires_grad(xs[i], true);
    dg_delta_opts o = {.algorithm = algo,
                       .chunk_size = 16,
                       .use_qk_l2norm_in_kernel = true,
                       .use_gate_in_kernel = true,
                       .A_log = A,
                       .dt_bias = b};
    dg_tensor *out[2], *g[2][7];
    for (int r = 0; r < 2; r++) {
        o.recompute_in_backward = r == 1;
        out[r] = dg_gated_delta_rule(q, k, v, a, beta, &o, NULL);
        assert_non_null(out[r]);
        grads_of(dg_sum_all(dg_mul(out[r], w)), xs, 7, g[r]);
    }
    assert_true(dg_test_max_abs_diff(out[0], out[1]) == 0.0);
    for (int i = 0; i < 7; i++) {
        assert_non_null(g[0][i]);
        assert_non_null(g[1][i]);
        if (dg_test_max_abs_diff(g[0][i], g[1][i]) != 0.0)
            fail_msg("gated_delta_rule %s: gradient of input %d differs between kept and recomputed "
                     "preprocessing by %.3e",
                     algo ? "recurrent" : "chunked", i, dg_test_max_abs_diff(g[0][i], g[1][i]));
    }
    dg_scope_end();
}

static void test_keep_vs_recompute(void **st) {
    (void)st;
    check_keep_vs_recompute(DG_DELTA_RECURRENT);
    check_keep_vs_recompute(DG_DELTA_CHUNKED);
}

/* Without output_final_state the CPU kernels neither make the final state nor take its gradient
 * (dg_delta_attrs.no_final_state): o and every gradient the same bits as with it asked for and left
 * out of the loss (its gradient then all zeros), for each op, both algorithms, with and without h0,
 * sequences of one chunk and of several. */
static void test_final_state_unread(void **st) {
    (void)st;
    dg_scope_begin();
    dg_rng rng = dg_rng_new(11);
    const int64_t B = 3, H = 1, HV = 2, K = 5, V = 4;
    for (int op = 0; op < 3; op++)
        for (int algo = 0; algo < 2; algo++)
            for (int with_h0 = 0; with_h0 < 2; with_h0++)
                for (int64_t T = 9; T <= 40; T += 31) {
                    dg_tensor *q = dg_rand_range(DG_SHAPE(B, T, H, K), DG_F64, -1, 1, &rng);
                    dg_tensor *k = dg_rand_range(DG_SHAPE(B, T, H, K), DG_F64, -0.5, 0.5, &rng);
                    dg_tensor *v = dg_rand_range(DG_SHAPE(B, T, HV, V), DG_F64, -1, 1, &rng);
                    dg_tensor *g = op == 2   ? dg_rand_range(DG_SHAPE(B, T, HV, K), DG_F64, -0.5, -0.01, &rng)
                                   : op == 1 ? dg_rand_range(DG_SHAPE(B, T, HV), DG_F64, -0.5, -0.01, &rng)
                                             : NULL;
                    dg_tensor *beta = dg_rand_range(DG_SHAPE(B, T, HV), DG_F64, 0.1, 0.9, &rng);
                    dg_tensor *h0 = with_h0 ? dg_rand_range(DG_SHAPE(B, HV, K, V), DG_F64, -1, 1, &rng) : NULL;
                    dg_tensor *w = dg_rand_range(DG_SHAPE(B, T, HV, V), DG_F64, -1, 1, &rng);
                    dg_tensor *xs[6] = {q, k, v, beta};
                    int n = 4;
                    if (g) xs[n++] = g;
                    if (h0) xs[n++] = h0;
                    for (int i = 0; i < n; i++) dg_set_requires_grad(xs[i], true);
                    dg_delta_opts o = {.algorithm = algo ? DG_DELTA_RECURRENT : DG_DELTA_CHUNKED,
                                       .chunk_size = 16,
                                       .initial_state = h0};
                    dg_tensor *out[2], *gr[2][6];
                    for (int r = 0; r < 2; r++) {
                        dg_tensor *hT = NULL;
                        o.output_final_state = r == 1;
                        out[r] = op == 0   ? dg_delta_rule(q, k, v, beta, &o, &hT)
                                 : op == 1 ? dg_gated_delta_rule(q, k, v, g, beta, &o, &hT)
                                           : dg_kda(q, k, v, g, beta, &o, &hT);
                        assert_non_null(out[r]);
                        assert_true((hT != NULL) == (r == 1));
                        grads_of(dg_sum_all(dg_mul(out[r], w)), xs, n, gr[r]);
                    }
                    if (dg_test_max_abs_diff(out[0], out[1]) != 0.0)
                        fail_msg("%s %s T %lld h0 %d: o differs with the final state left unmade", family[op],
                                 algo ? "recurrent" : "chunked", (long long)T, with_h0);
                    for (int i = 0; i < n; i++) {
                        assert_non_null(gr[0][i]);
                        if (dg_test_max_abs_diff(gr[0][i], gr[1][i]) != 0.0)
                            fail_msg("%s %s T %lld h0 %d: gradient %d differs with the final state left unmade by "
                                     "%.3e",
                                     family[op], algo ? "recurrent" : "chunked", (long long)T, with_h0, i,
                                     dg_test_max_abs_diff(gr[0][i], gr[1][i]));
                    }
                }
    dg_scope_end();
}

/* ---- choosing the backward variant ------------------------------------------------------------- */

/* Each op's variant table (ops/delta/delta_common.h) is its registry entries: the same names in the same
 * order, specs whose algorithm matches the name (recurrent last), a default (bwd[0]) that is a chunked
 * variant with every flag at its default; the benchmark times from the table, the ops run the registry. */
static void test_variant_tables(void **state) {
    (void)state;
    const char *ops[] = {"delta_rule", "gated_delta_rule", "kda"};
    for (int o = 0; o < 3; o++) {
        const dg_op_def *def = dg_op_find(ops[o]);
        const dg_delta_variants *t = dg_delta_variants_of(ops[o]);
        assert_non_null(def);
        assert_non_null(t);
        int n = 0;
        while (n < 6 && def->bwd[n].name) n++;
        assert_int_equal(t->n, n);
        for (int i = 0; i < n; i++) {
            assert_string_equal(t->v[i].name, def->bwd[i].name);
            assert_non_null(t->v[i].desc);
            assert_int_equal(t->v[i].spec.algo == DG_DELTA_RECURRENT, !strcmp(t->v[i].name, "recurrent"));
        }
        const dg_delta_bwd_flags f = t->v[0].spec.flags;
        assert_int_equal(t->v[0].spec.algo, DG_DELTA_CHUNKED);
        assert_false(f.dg_from_partials || f.dw_stored || f.tril_substitution);
    }
    assert_string_equal(dg_delta_variants_of("kda")->v[0].name, "fused");
    assert_null(dg_delta_variants_of("matmul"));
    assert_null(dg_delta_variants_of(NULL));
}

static void test_variant_selection(void **st) {
    (void)st;
    const dg_op_def *def = dg_op_find("gated_delta_rule");
    dg_scope_begin();
    dg_rng rng = dg_rng_new(5);
    dg_tensor *q = dg_rand_range(DG_SHAPE(1, 4, 1, 3), DG_F64, -1, 1, &rng);
    dg_tensor *v = dg_rand_range(DG_SHAPE(1, 4, 1, 2), DG_F64, -1, 1, &rng);
    dg_tensor *g = dg_rand_range(DG_SHAPE(1, 4, 1), DG_F64, -1, -0.1, &rng);
    dg_tensor *beta = dg_rand_range(DG_SHAPE(1, 4, 1), DG_F64, 0.1, 0.9, &rng);
    dg_set_requires_grad(v, true);
    dg_delta_opts o = {.algorithm = DG_DELTA_RECURRENT};
    unsetenv("DG_BACKWARD");
    /* the recurrent algorithm defaults to the recurrent backward */
    dg_tensor *out = dg_gated_delta_rule(q, q, v, g, beta, &o, NULL);
    assert_non_null(out);
    assert_int_equal(out->node->variant, dg_op_variant_find(def, "recurrent"));
    /* per call */
    o.backward = "dg_partial";
    out = dg_gated_delta_rule(q, q, v, g, beta, &o, NULL);
    assert_int_equal(out->node->variant, dg_op_variant_find(def, "dg_partial"));
    /* by the environment (when the call names none) */
    o.backward = NULL;
    setenv("DG_BACKWARD", "kda:unfused,gated_delta_rule:subst", 1);
    out = dg_gated_delta_rule(q, q, v, g, beta, &o, NULL);
    assert_int_equal(out->node->variant, dg_op_variant_find(def, "subst"));
    /* the call wins over the environment */
    o.backward = "recurrent";
    out = dg_gated_delta_rule(q, q, v, g, beta, &o, NULL);
    assert_int_equal(out->node->variant, dg_op_variant_find(def, "recurrent"));
    unsetenv("DG_BACKWARD");
    /* the chunked algorithm defaults to bwd[0] */
    o.backward = NULL;
    o.algorithm = DG_DELTA_CHUNKED;
    out = dg_gated_delta_rule(q, q, v, g, beta, &o, NULL);
    assert_int_equal(out->node->variant, 0);
    /* kda: fused (bwd[0]), on every device */
    dg_tensor *gk = dg_rand_range(DG_SHAPE(1, 4, 1, 3), DG_F64, -1, -0.1, &rng);
    out = dg_kda(q, q, v, gk, beta, &o, NULL);
    assert_non_null(out);
    assert_int_equal(out->node->variant, dg_op_variant_find(dg_op_find("kda"), "fused"));
    assert_int_equal(out->node->variant, 0);
    /* an unknown name is an error that lists the variants */
    o.backward = "fast";
    assert_null(dg_gated_delta_rule(q, q, v, g, beta, &o, NULL));
    assert_error_contains(
        "gated_delta_rule: backward variant 'fast' does not exist (variants: dg_final, dg_partial, subst, recurrent)");
    /* the final state is handed out only when asked */
    dg_tensor *hT = q;
    o.backward = NULL;
    o.algorithm = DG_DELTA_RECURRENT;
    assert_non_null(dg_gated_delta_rule(q, q, v, g, beta, &o, &hT));
    assert_null(hT);
    o.output_final_state = true;
    assert_non_null(dg_gated_delta_rule(q, q, v, g, beta, &o, &hT));
    assert_non_null(hT);
    assert_int_equal(hT->ndim, 4);
    assert_int_equal(hT->shape[2], 3);
    dg_scope_end();
}

/* ---- bad inputs -------------------------------------------------------------------------------- */

static void test_bad_inputs(void **st) {
    (void)st;
    dg_clear_error();
    dg_scope_begin();
    const size_t live = dg_live_tensors();
    dg_tensor *q = dg_zeros(DG_SHAPE(1, 8, 2, 4), DG_F64), *q5 = dg_zeros(DG_SHAPE(1, 8, 2, 5), DG_F64);
    dg_tensor *v = dg_zeros(DG_SHAPE(1, 8, 4, 3), DG_F64), *v3 = dg_zeros(DG_SHAPE(1, 8, 3, 3), DG_F64);
    dg_tensor *v32 = dg_zeros(DG_SHAPE(1, 8, 4, 3), DG_F32);
    dg_tensor *g = dg_zeros(DG_SHAPE(1, 8, 4), DG_F64), *gk = dg_zeros(DG_SHAPE(1, 8, 4, 4), DG_F64);
    dg_tensor *beta = dg_zeros(DG_SHAPE(1, 8, 4), DG_F64), *beta2 = dg_zeros(DG_SHAPE(1, 7, 4), DG_F64);
    dg_delta_opts o = {0};

    assert_null(dg_gated_delta_rule(q, q5, v, g, beta, &o, NULL));
    assert_error_contains("gated_delta_rule: k has shape [1,8,2,5] but q has [1,8,2,4]");
    assert_null(dg_gated_delta_rule(q, q, v3, g, beta, &o, NULL));
    assert_error_contains("gated_delta_rule: v has shape [1,8,3,3] with HV = 3 value heads, which is not a "
                          "multiple of the H = 2 heads of q [1,8,2,4]");
    assert_null(dg_delta_rule(q, q, v, beta2, &o, NULL));
    assert_error_contains("delta_rule: beta has shape [1,7,4] but [B,T,HV] = [1,8,4] is required");
    assert_null(dg_kda(q, q, v, g, beta, &o, NULL));
    assert_error_contains("kda: g has shape [1,8,4] but [B,T,HV,K] = [1,8,4,4] is required");
    assert_null(dg_gated_delta_rule(q, q, v, gk, beta, &o, NULL));
    assert_error_contains("gated_delta_rule: g has shape [1,8,4,4] but [B,T,HV] = [1,8,4] is required");
    assert_null(dg_gated_delta_rule(q, q, v32, g, beta, &o, NULL));
    assert_error_contains("gated_delta_rule: v has dtype f32");
    assert_null(dg_gated_delta_rule(q, q, v, NULL, beta, &o, NULL));
    assert_error_contains("gated_delta_rule: g is NULL");

    o.chunk_size = 48;
    assert_null(dg_gated_delta_rule(q, q, v, g, beta, &o, NULL));
    assert_error_contains("gated_delta_rule: chunk_size 48 is not supported (16, 32 or 64)");
    o.chunk_size = 0;

    /* cu_seqlens */
    int64_t c_start[3] = {1, 4, 8}, c_dec[4] = {0, 5, 3, 8}, c_end[3] = {0, 4, 7};
    o.cu_seqlens = dg_from_data(DG_SHAPE(3), DG_I64, c_start);
    assert_null(dg_gated_delta_rule(q, q, v, g, beta, &o, NULL));
    assert_error_contains("gated_delta_rule: cu_seqlens [3] = {1,4,8} must start at 0");
    o.cu_seqlens = dg_from_data(DG_SHAPE(4), DG_I64, c_dec);
    assert_null(dg_gated_delta_rule(q, q, v, g, beta, &o, NULL));
    assert_error_contains("gated_delta_rule: cu_seqlens [4] = {0,5,3,8} decreases at index 2 (5 -> 3)");
    o.cu_seqlens = dg_from_data(DG_SHAPE(3), DG_I64, c_end);
    assert_null(dg_kda(q, q, v, gk, beta, &o, NULL));
    assert_error_contains("kda: cu_seqlens [3] = {0,4,7} must end at T = 8, the tokens of q [1,8,2,4]");
    o.cu_seqlens = dg_zeros(DG_SHAPE(3), DG_F64);
    assert_null(dg_kda(q, q, v, gk, beta, &o, NULL));
    assert_error_contains("kda: cu_seqlens has dtype f64 (shape [3]) but i64 is required");
    dg_tensor *q2 = dg_zeros(DG_SHAPE(2, 4, 2, 4), DG_F64), *v2 = dg_zeros(DG_SHAPE(2, 4, 4, 3), DG_F64);
    dg_tensor *b2 = dg_zeros(DG_SHAPE(2, 4, 4), DG_F64);
    int64_t c_ok[3] = {0, 3, 4};
    o.cu_seqlens = dg_from_data(DG_SHAPE(3), DG_I64, c_ok);
    assert_null(dg_delta_rule(q2, q2, v2, b2, &o, NULL));
    assert_error_contains("delta_rule: cu_seqlens [3] is given but q has shape [2,4,2,4] with B = 2");

    /* states: [N,HV,K,V] with N the number of sequences */
    int64_t c3[4] = {0, 2, 5, 8};
    o.cu_seqlens = dg_from_data(DG_SHAPE(4), DG_I64, c3);
    o.initial_state = dg_zeros(DG_SHAPE(1, 4, 4, 3), DG_F64);
    assert_null(dg_gated_delta_rule(q, q, v, g, beta, &o, NULL));
    assert_error_contains("gated_delta_rule: initial_state has shape [1,4,4,3] but [N,HV,K,V] = [3,4,4,3] is "
                          "required (N = 3 sequences in cu_seqlens");
    o.cu_seqlens = NULL;
    o.initial_state = dg_zeros(DG_SHAPE(1, 4, 3, 4), DG_F64);
    assert_null(dg_delta_rule(q, q, v, beta, &o, NULL));
    assert_error_contains("delta_rule: initial_state has shape [1,4,3,4] but [N,HV,K,V] = [1,4,4,3] is required");
    o.initial_state = NULL;

    /* the gate inside the op */
    o.use_gate_in_kernel = true;
    assert_null(dg_gated_delta_rule(q, q, v, g, beta, &o, NULL));
    assert_error_contains("gated_delta_rule: A_log (required by use_gate_in_kernel) is NULL");
    o.A_log = dg_zeros(DG_SHAPE(2), DG_F64);
    assert_null(dg_gated_delta_rule(q, q, v, g, beta, &o, NULL));
    assert_error_contains("gated_delta_rule: A_log has shape [2] but [HV] = [4] is required");
    o.A_log = dg_zeros(DG_SHAPE(4), DG_F64);
    o.dt_bias = dg_zeros(DG_SHAPE(4), DG_F64);
    assert_null(dg_kda(q, q, v, gk, beta, &o, NULL));
    assert_error_contains("kda: dt_bias has shape [4] but [HV*K] = [16] is required");
    assert_null(dg_delta_rule(q, q, v, beta, &o, NULL));
    assert_error_contains("delta_rule: use_gate_in_kernel is set but delta_rule has no gate");
    o.use_gate_in_kernel = false;
    assert_null(dg_gated_delta_rule(q, q, v, g, beta, &o, NULL));
    assert_error_contains("gated_delta_rule: A_log given (shape [4]) but use_gate_in_kernel is not set");
    o.A_log = o.dt_bias = NULL;

    /* gate ops */
    assert_null(dg_gdn_gate(g, dg_zeros(DG_SHAPE(3), DG_F64), NULL));
    assert_error_contains("gdn_gate: A_log has shape [3] but [HV] = [4] is required (a [1,8,4])");
    assert_null(dg_kda_gate(gk, dg_zeros(DG_SHAPE(4), DG_F64), dg_zeros(DG_SHAPE(4), DG_F64)));
    assert_error_contains("kda_gate: dt_bias has shape [4] but [HV*K] = [16] is required (a [1,8,4,4])");
    assert_null(dg_kda_gate(g, dg_zeros(DG_SHAPE(4), DG_F64), NULL));
    assert_error_contains("kda_gate: a has shape [1,8,4] but [B,T,HV,K] is required");

    /* a NULL input keeps the first message */
    assert_null(dg_gated_delta_rule(NULL, q, v, g, beta, &o, NULL));
    assert_error_contains("gated_delta_rule: q is NULL");
    dg_scope_end();
    assert_int_equal(dg_live_tensors(), live);
}

/* ---- the pieces of the chunked algorithm ------------------------------------------------------- */

/* chunk_local_cumsum against its decomposition; solve_tril blocked vs substitution and
 * (I + A) Ainv = I on the output of chunk_scaled_dot_kkt */
static void test_pieces(void **st) {
    (void)st;
    const dg_op_def *cs = dg_op_find("chunk_local_cumsum");
    assert_non_null(cs);
    for (int i = 0;; i++) {
        dg_scope_begin();
        dg_sample s = {0};
        int have = cs->sample(i, DG_F64, 8 + i, &s);
        dg_scope_end();
        if (!have) break;
        result a = {0}, b = {0};
        assert_int_equal(run(cs, &s, s.attrs, 0, DG_F64, &a), 0);
        assert_int_equal(run(cs, &s, s.attrs, -1, DG_F64, &b), 0);
        double e = compare(&a, &b, s.label, 1e-14);
        print_message("  chunk_local_cumsum %-40s vs decomposition %.1e\n", s.label, e);
        assert_true(e < 1e-14);
        result_free(&a);
        result_free(&b);
        dg_sample_free(&s);
    }
    dg_scope_begin();
    dg_rng rng = dg_rng_new(6);
    const int64_t T = 45, C = 32;
    int64_t c[3] = {0, 13, 45};
    dg_tensor *cu = dg_from_data(DG_SHAPE(3), DG_I64, c);
    dg_tensor *k = dg_rand_range(DG_SHAPE(1, T, 1, 8), DG_F64, -0.4, 0.4, &rng);
    dg_tensor *beta = dg_rand_range(DG_SHAPE(1, T, 2), DG_F64, 0.1, 0.9, &rng);
    dg_tensor *g = dg_rand_range(DG_SHAPE(1, T, 2, 8), DG_F64, -0.3, 0, &rng);
    dg_tensor *G = dg_chunk_local_cumsum(g, (int)C, false, cu);
    dg_tensor *A = dg_chunk_scaled_dot_kkt(k, beta, G, (int)C, cu);
    dg_tensor *X = dg_solve_tril(A, (int)C, cu, true), *Y = dg_solve_tril(A, (int)C, cu, false);
    assert_non_null(X);
    assert_non_null(Y);
    double e = rel_max(X, Y), worst = 0;
    print_message("  solve_tril blocked vs substitution %.1e\n", e);
    assert_true(e < 1e-13);
    /* per chunk and head: sum_l (I + A)[i,l] Ainv[l,j] = delta_ij, positions relative to chunk starts */
    for (int seq = 0; seq < 2; seq++)
        for (int64_t t0 = c[seq]; t0 < c[seq + 1]; t0 += C) {
            const int64_t L = c[seq + 1] - t0 < C ? c[seq + 1] - t0 : C;
            for (int64_t h = 0; h < 2; h++)
                for (int64_t i = 0; i < L; i++)
                    for (int64_t j = 0; j < L; j++) {
                        double acc = 0;
                        for (int64_t l = 0; l < L; l++) {
                            double al = l == i ? 1 : (l < i ? dg_get(A, (int64_t[]){0, t0 + i, h, l}) : 0);
                            acc += al * dg_get(X, (int64_t[]){0, t0 + l, h, j});
                        }
                        worst = fmax(worst, fabs(acc - (i == j)));
                    }
        }
    print_message("  (I + A) solve_tril(A) - I: max %.1e\n", worst);
    assert_true(worst < 1e-13);
    /* bad inputs of the pieces */
    assert_null(dg_solve_tril(A, 16, cu, true));
    assert_error_contains("solve_tril: A has shape [1,45,2,32] but its last dim must be the chunk size 16");
    assert_null(dg_chunk_local_cumsum(g, 48, false, NULL));
    assert_error_contains("chunk_local_cumsum: chunk_size 48 is not supported (16, 32 or 64)");
    assert_null(dg_chunk_scaled_dot_kkt(k, beta, dg_zeros(DG_SHAPE(1, T, 2, 5), DG_F64), 32, NULL));
    assert_error_contains("chunk_scaled_dot_kkt: g_cumsum has shape [1,45,2,5] but [B,T,HV] = [1,45,2] or "
                          "[B,T,HV,K] = [1,45,2,8] is required");
    int64_t bad[3] = {0, 50, 45};
    assert_null(dg_chunk_scaled_dot_kkt(k, beta, NULL, 32, dg_from_data(DG_SHAPE(3), DG_I64, bad)));
    assert_error_contains("chunk_scaled_dot_kkt: cu_seqlens [3] = {0,50,45} decreases at index 2 (50 -> 45)");
    dg_scope_end();
}

/* ---- the backend table (ops/delta/delta_backends.c) ---------------------------------------------- */

/* the slow-path note of the last call picked (dg_delta_slow_note), "" when none */
static char picked_note[320];

/* the row dg_delta_pick takes for a call of this kind (pointers are never dereferenced: accepts()
 * reads shapes, dtypes and alignment only), or "" when none does */
static const char *picked(dg_device dev, dg_dtype dt, int algorithm, dg_gate_kind gate, int64_t K, int64_t V, int chunk,
                          uintptr_t qaddr, bool force_generic) {
    dg_delta_call c = {
        .op = "test",
        .dtype = dt,
        .device = dev,
        .algorithm = algorithm,
        .s = {.B = 1, .T = 70, .H = 2, .HV = 2, .K = K, .V = V, .N = 1, .gate = gate, .scale = 0.5, .chunk = chunk},
        .q = (const void *)qaddr,
        .k = (const void *)(uintptr_t)512,
        .v = (const void *)(uintptr_t)768,
        .beta = (const void *)(uintptr_t)1024,
        .o = (void *)(uintptr_t)1280,
        .force_generic = force_generic};
    const dg_delta_backend *b = dg_delta_pick(&c);
    dg_clear_error();
    if (!dg_delta_slow_note(b, &c, picked_note, sizeof picked_note)) picked_note[0] = 0;
    return b ? b->name : "";
}

/* Which row takes which call (tensor cores for 16-bit chunk-64 calls of any K <= 256 and V, of any
 * alignment: K, V padded to the kernels' shapes, wide value heads split; TF32 for 128 < K <= 256 at
 * other chunks; the generic kernels otherwise), and a misspelled or mismatched row is an error. */
static void test_backend_table(void **state) {
    (void)state;
    const uintptr_t al = 256;
    assert_string_equal(picked(DG_CPU, DG_F64, DG_DELTA_CHUNKED, DG_GATE_HEAD, 16, 16, 16, al, false), "cpu_chunk");
    assert_string_equal(picked(DG_CPU, DG_F32, DG_DELTA_RECURRENT, DG_GATE_NONE, 16, 16, 16, al, false),
                        "cpu_recurrent");
    assert_string_equal(picked(DG_CPU, DG_BF16, DG_DELTA_CHUNKED, DG_GATE_HEAD, 16, 16, 16, al, false), "");
#ifdef DG_HAVE_CUDA
    const uintptr_t odd = 258; /* not 16-byte aligned */
    const struct {
        dg_dtype dt;
        int algorithm;
        dg_gate_kind gate;
        int64_t K, V;
        int chunk;
        uintptr_t q;
        bool force_generic;
        const char *row;
    } cases[] = {
        {DG_BF16, DG_DELTA_CHUNKED, DG_GATE_HEAD, 128, 128, 64, al, false, "cuda_chunk_mma"},
        {DG_BF16, DG_DELTA_CHUNKED, DG_GATE_NONE, 64, 64, 64, al, false, "cuda_chunk_mma"},
        {DG_F16, DG_DELTA_CHUNKED, DG_GATE_HEAD, 128, 128, 64, al, false, "cuda_chunk_mma"},
        {DG_BF16, DG_DELTA_CHUNKED, DG_GATE_HEAD, 128, 256, 64, al, false, "cuda_chunk_mma"}, /* split heads */
        {DG_BF16, DG_DELTA_CHUNKED, DG_GATE_CHANNEL, 128, 128, 64, al, false, "cuda_chunk_kda_mma"},
        {DG_BF16, DG_DELTA_CHUNKED, DG_GATE_CHANNEL, 64, 192, 64, al, false, "cuda_chunk_kda_mma"},
        {DG_F16, DG_DELTA_CHUNKED, DG_GATE_CHANNEL, 128, 128, 64, al, false, "cuda_chunk_kda_mma"},
        {DG_BF16, DG_DELTA_CHUNKED, DG_GATE_HEAD, 256, 256, 64, al, false, "cuda_chunk_tf32"},
        {DG_F16, DG_DELTA_CHUNKED, DG_GATE_HEAD, 256, 256, 64, al, false, "cuda_chunk_tf32"},
        {DG_F16, DG_DELTA_CHUNKED, DG_GATE_CHANNEL, 192, 40, 32, odd, false, "cuda_chunk_tf32"},
        {DG_BF16, DG_DELTA_CHUNKED, DG_GATE_HEAD, 256, 256, 64, al, true, "cuda_chunk_generic"},
        {DG_F32, DG_DELTA_CHUNKED, DG_GATE_HEAD, 256, 256, 64, al, false, "cuda_chunk_generic"},
        {DG_BF16, DG_DELTA_CHUNKED, DG_GATE_HEAD, 128, 96, 64, al, false, "cuda_chunk_mma"}, /* V padded */
        {DG_BF16, DG_DELTA_CHUNKED, DG_GATE_HEAD, 96, 80, 64, al, false, "cuda_chunk_mma"},  /* K, V padded */
        {DG_BF16, DG_DELTA_CHUNKED, DG_GATE_NONE, 32, 200, 64, al, false, "cuda_chunk_mma"}, /* padded, split */
        {DG_BF16, DG_DELTA_CHUNKED, DG_GATE_CHANNEL, 100, 40, 64, al, false, "cuda_chunk_kda_mma"},
        {DG_F16, DG_DELTA_CHUNKED, DG_GATE_CHANNEL, 128, 128, 64, odd, false, "cuda_chunk_kda_mma"},
        {DG_BF16, DG_DELTA_CHUNKED, DG_GATE_NONE, 200, 72, 64, al, false, "cuda_chunk_tf32"}, /* to K = 256 */
        {DG_BF16, DG_DELTA_CHUNKED, DG_GATE_HEAD, 128, 128, 32, al, false, "cuda_chunk_generic"},
        {DG_BF16, DG_DELTA_CHUNKED, DG_GATE_HEAD, 128, 128, 64, odd, false, "cuda_chunk_mma"}, /* aligned copies */
        {DG_BF16, DG_DELTA_CHUNKED, DG_GATE_HEAD, 128, 128, 64, al, true, "cuda_chunk_generic"},
        {DG_F32, DG_DELTA_CHUNKED, DG_GATE_HEAD, 128, 128, 64, al, false, "cuda_chunk_generic"},
        {DG_BF16, DG_DELTA_RECURRENT, DG_GATE_HEAD, 128, 128, 64, al, false, "cuda_recurrent"},
        {DG_F64, DG_DELTA_CHUNKED, DG_GATE_HEAD, 16, 16, 16, al, false, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = picked(DG_CUDA, cases[i].dt, cases[i].algorithm, cases[i].gate, cases[i].K, cases[i].V,
                                 cases[i].chunk, cases[i].q, cases[i].force_generic);
        if (strcmp(got, cases[i].row))
            fail_msg("case %zu (%s K=%lld V=%lld chunk %d): row '%s', expected '%s'", i, dg_dtype_name(cases[i].dt),
                     (long long)cases[i].K, (long long)cases[i].V, cases[i].chunk, got, cases[i].row);
        /* a 16-bit call that lands on the generic kernels unasked gets its one line */
        const bool slow = !strcmp(cases[i].row, "cuda_chunk_generic") &&
                          (cases[i].dt == DG_BF16 || cases[i].dt == DG_F16) && !cases[i].force_generic;
        if (slow != (picked_note[0] != 0))
            fail_msg("case %zu: note '%s', expected %s", i, picked_note, slow ? "one" : "none");
    }
    picked(DG_CUDA, DG_BF16, DG_DELTA_CHUNKED, DG_GATE_HEAD, 128, 96, 32, al, false);
    assert_non_null(strstr(picked_note, "test in bf16 with K = 128, V = 96, chunk 32 runs on the generic"));
#endif
    /* a misspelled row is an error that lists the rows */
    dg_clear_error();
    assert_null(dg_delta_backend_named("cuda_chunk_nosuch"));
    assert_non_null(strstr(dg_last_error(), "cuda_chunk_nosuch"));
    assert_non_null(strstr(dg_last_error(), "cpu_chunk"));
    dg_clear_error();
    assert_null(dg_delta_backend_named(NULL));
    dg_clear_error();
    for (int i = 0; i < dg_delta_backend_count(); i++)
        assert_ptr_equal(dg_delta_backend_named(dg_delta_backend_at(i)->name), dg_delta_backend_at(i));
    assert_null(dg_delta_backend_at(dg_delta_backend_count()));
    /* a row forced on a call it does not take is an error, before any kernel runs */
    const dg_delta_backend *rec = dg_delta_backend_named("cpu_recurrent");
    assert_non_null(rec);
    dg_delta_call c = {.op = "test",
                       .dtype = DG_F64,
                       .device = DG_CPU,
                       .algorithm = DG_DELTA_CHUNKED,
                       .s = {.B = 1, .T = 4, .H = 1, .HV = 1, .K = 2, .V = 2, .N = 1, .scale = 1, .chunk = 16}};
    assert_int_equal(dg_delta_fwd(rec, &c), -1);
    assert_non_null(strstr(dg_last_error(), "cpu_recurrent does not take this call"));
    dg_clear_error();
    assert_int_equal(dg_delta_bwd(rec, &c), -1);
    dg_clear_error();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_variant_selection),
        cmocka_unit_test(test_variant_tables),
        cmocka_unit_test(test_recurrent_vs_decomposition),
        cmocka_unit_test(test_chunked_variants_vs_recurrent),
        cmocka_unit_test(test_f32_vs_f64),
        cmocka_unit_test(test_gate_fused_vs_separate),
        cmocka_unit_test(test_l2norm_fused_vs_separate),
        cmocka_unit_test(test_keep_vs_recompute),
        cmocka_unit_test(test_final_state_unread),
        cmocka_unit_test(test_pieces),
        cmocka_unit_test(test_backend_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
