/* The registry drives the checks: every listed op is built under its name, and every op's every
 * backward variant passes gradcheck in f64 on its samples (contiguous and strided inputs). */
#include "tests/support/test_support.h"

#include "ops/gradcheck.h"

#include <stdlib.h>
#include <string.h>

/* The registry references every listed op, so a listed op that is not built fails the link; what
 * is left to check is that each definition carries the name it is listed under. */
static const char *const listed_names[] = {
#define DG_OP(name) #name,
#include "ops/registry_list.h"
#undef DG_OP
};

static void test_every_listed_op_is_built(void **state) {
    int n = (int)(sizeof listed_names / sizeof listed_names[0]);
    assert_int_equal(dg_op_count(), n);
    for (int i = 0; i < n; i++)
        if (strcmp(dg_op_at(i)->name, listed_names[i]) != 0)
            fail_msg("ops/registry_list.h lists %s but its definition is named %s", listed_names[i], dg_op_at(i)->name);
    assert_true(dg_op_count() >= 40);
}

static void test_every_op_has_sampler_and_tolerances(void **state) {
    for (int i = 0; i < dg_op_count(); i++) {
        const dg_op_def *d = dg_op_at(i);
        if (!d->sample || !d->forward || dg_op_variant_count(d) == 0 || d->atol_f64 <= 0 || d->rtol_f64 <= 0)
            fail_msg("op %s lacks a sampler, forward, backward or tolerances", d->name);
        assert_ptr_equal(dg_op_find(d->name), d);
    }
}

static void test_gradcheck_every_op(void **state) {
    dg_gradcheck_report rep = {0};
    for (int i = 0; i < dg_op_count(); i++) dg_gradcheck_op(dg_op_at(i), 1, &rep);
    if (rep.n_failed) {
        dg_gradcheck_print(&rep, stdout);
        fail_msg("%d gradcheck rows failed", rep.n_failed);
    }
    print_message("gradcheck: %d rows over %d ops, all ok\n", rep.n, dg_op_count());
    dg_gradcheck_report_free(&rep);
}

static void test_backward_env_selects_variant(void **state) {
    for (int i = 0; i < dg_op_count(); i++) {
        const dg_op_def *d = dg_op_at(i);
        int nv = dg_op_variant_count(d);
        if (nv < 2) continue;
        char env[128];
        snprintf(env, sizeof env, "add:default,%s:%s", d->name, d->bwd[nv - 1].name);
        setenv("DG_BACKWARD", env, 1);
        assert_int_equal(dg_op_default_variant(d), nv - 1);
        assert_int_equal(dg_op_default_variant(dg_op_find("mul")), 0); /* not named: the default */
    }
    unsetenv("DG_BACKWARD");
}

/* A misspelled op or variant in DG_BACKWARD is an error naming the valid choices, for every op
 * (not a silent fall-back to the default), and dg_apply refuses to run. */
static void test_backward_env_misspelled(void **state) {
    const dg_op_def *kda = dg_op_find("kda"), *mul = dg_op_find("mul");
    assert_non_null(kda);
    setenv("DG_BACKWARD", "kda:nosuch", 1);
    assert_int_equal(dg_op_env_variant(kda), -2);
    assert_non_null(strstr(dg_last_error(), "DG_BACKWARD: kda: backward variant 'nosuch' does not exist"));
    assert_non_null(strstr(dg_last_error(), kda->bwd[0].name));
    assert_int_equal(dg_op_default_variant(mul), -1); /* another op fails too */
    dg_scope_begin();
    dg_tensor *a = dg_ones(DG_SHAPE(2), DG_F32);
    assert_null(dg_mul(a, a));
    dg_scope_end();
    dg_clear_error(); /* the first message is kept until cleared */
    setenv("DG_BACKWARD", "kdaa:fused", 1);
    assert_int_equal(dg_op_env_variant(mul), -2);
    assert_non_null(strstr(dg_last_error(), "no op named 'kdaa'"));
    assert_non_null(strstr(dg_last_error(), "gated_delta_rule"));
    dg_clear_error(); /* the first message is kept until cleared */
    setenv("DG_BACKWARD", "kda", 1);
    assert_int_equal(dg_op_env_variant(mul), -2);
    assert_non_null(strstr(dg_last_error(), "not op:variant"));
    dg_clear_error(); /* the first message is kept until cleared */
    setenv("DG_BACKWARD", "kda:unfused,", 1);
    assert_int_equal(dg_op_env_variant(kda), dg_op_variant_find(kda, "unfused"));
    unsetenv("DG_BACKWARD");
    dg_clear_error();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_listed_op_is_built), cmocka_unit_test(test_every_op_has_sampler_and_tolerances),
        cmocka_unit_test(test_gradcheck_every_op),       cmocka_unit_test(test_backward_env_selects_variant),
        cmocka_unit_test(test_backward_env_misspelled),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
