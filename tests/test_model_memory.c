/* The memory estimate of a training run (models/memory_estimate.h): it follows the measured peak of
 * real steps, and a run that cannot fit is refused before it allocates. */
#include "tests/model_infra_common.h"

#include "models/memory_estimate.h"
#include "models/trainer.h"

#include <math.h>
#include <stdio.h>

/* peak tensor bytes on the host of opening a run and making two steps */
static double measured_peak(const dg_model_config *mc, const dg_train_config *tc) {
    size_t base = dg_live_bytes(DG_CPU);
    dg_reset_peak_bytes(DG_CPU);
    dg_trainer *t = dg_trainer_open(tc, mc, NULL);
    assert_non_null(t);
    double loss, gn;
    assert_int_equal(dg_trainer_step(t, &loss, &gn), 0);
    assert_int_equal(dg_trainer_step(t, &loss, &gn), 0);
    double peak = (double)(dg_peak_bytes(DG_CPU) - base);
    dg_trainer_free(t);
    return peak;
}

static void check(dg_model_config mc, dg_train_config tc, const char *what) {
    tc.device = DG_CPU;
    tc.threads = 1;
    snprintf(tc.out_dir, sizeof tc.out_dir, "%s", tmp_path("run"));
    double est = dg_train_memory_estimate(&mc, &tc), got = measured_peak(&mc, &tc);
    print_message("  %-40s estimate %8.1f MB  measured peak %8.1f MB  ratio %.2f\n", what, est / 1e6, got / 1e6,
                  est / got);
    assert_true(est > 0.75 * got && est < 1.35 * got);
}

static void test_estimate_follows_the_peak(void **state) {
    dg_model_config mc = dg_model_default_config();
    dg_train_config tc = dg_train_default_config();
    tc.eval_examples = 64;
    tc.batch = 8;
    tc.mqar.seq_len = 128;
    check(mc, tc, "default model, 8 x 128");
    tc.mqar.seq_len = 256;
    check(mc, tc, "default model, 8 x 256");
    dg_model_config small = mc;
    small.hidden_size = 64;
    small.num_heads = 2;
    small.head_dim = 32;
    small.num_hidden_layers = 3;
    tc.batch = 16;
    tc.mqar.seq_len = 64;
    tc.mqar.num_kv_pairs = 8;
    check(small, tc, "d 64, 3 layers, 2 heads x 32, 16 x 64");
    tc.algorithm = DG_DELTA_RECURRENT;
    check(small, tc, "the same, recurrent");
    tc.algorithm = DG_DELTA_CHUNKED;
    small.mixer = DG_MIXER_KDA;
    small.use_gate = true;
    check(small, tc, "KDA, d 64, 3 layers");
}

/* The training state from the config alone: 16 bytes a parameter of the built model (18 with its
 * bf16 copies), within the few norm and convolution weights the count leaves out. */
static void test_state_bytes(void **state) {
    dg_model_config mc = dg_model_default_config();
    mc.hidden_size = 256;
    mc.num_heads = 2;
    mc.head_dim = 64;
    dg_train_config tc = dg_train_default_config();
    tc.device = DG_CPU;
    tc.eval_examples = 16;
    snprintf(tc.out_dir, sizeof tc.out_dir, "%s", tmp_path("state"));
    dg_trainer *t = dg_trainer_open(&tc, &mc, NULL);
    assert_non_null(t);
    const double n = (double)dg_param_count(&t->lm->params);
    dg_trainer_free(t);
    print_message("  %.0f parameters; state %.0f and %.0f bytes\n", n, dg_train_state_bytes(&mc, false),
                  dg_train_state_bytes(&mc, true));
    assert_true(fabs(dg_train_state_bytes(&mc, false) / (16 * n) - 1) < 0.02);
    assert_true(fabs(dg_train_state_bytes(&mc, true) / (18 * n) - 1) < 0.02);
}

static void test_too_big_is_refused(void **state) {
    dg_model_config mc = dg_model_default_config();
    dg_train_config tc = dg_train_default_config();
    tc.device = DG_CPU;
    snprintf(tc.out_dir, sizeof tc.out_dir, "%s", tmp_path("big"));
    size_t before = dg_live_bytes(DG_CPU);
    tc.batch = 1000000000;
    assert_null(dg_trainer_open(&tc, &mc, NULL));
    assert_error_contains("lower --batch or --seq-len");
    tc.batch = 64;
    tc.mqar.seq_len = 1000000000;
    assert_null(dg_trainer_open(&tc, &mc, NULL));
    assert_error_contains("this run needs about");
    assert_int_equal(dg_live_bytes(DG_CPU), before); /* refused before allocating */
    assert_true(dg_memory_available() > 0);
    char buf[32];
    assert_string_equal(dg_format_bytes(2.5e9, buf, sizeof buf), "2.5 GB");
    assert_string_equal(dg_format_bytes(3e14, buf, sizeof buf), "300.0 TB");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_estimate_follows_the_peak, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_state_bytes, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_too_big_is_refused, test_setup, test_teardown),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
