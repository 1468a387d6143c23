/* The deltagrad command-line tool, run as a user runs it: compare gives verdicts and exit
 * statuses, bad values and misspelled ops are refused with status 2 and a message naming what is
 * valid, bench times an op, a run too big for the machine is refused before it starts.
 *
 * The binary is $DG_TOOL, else deltagrad in the build directory above this test program
 * (build/<variant>/tests/test_tools -> build/<variant>/deltagrad). */
#include "tests/support/test_support.h"

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static char tool[4096];

typedef struct run_result {
    int status;      /* the exit status; -1 when the tool did not exit normally */
    char out[65536]; /* stdout and stderr together */
} run_result;

/* Runs `deltagrad ARGS` (with the environment prefix env, e.g. "DG_BACKWARD=x"). */
static void run(run_result *r, const char *env, const char *args) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s %s %s 2>&1", env ? env : "", tool, args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(r->out, 1, sizeof r->out - 1, p);
    r->out[n] = 0;
    int st = pclose(p);
    r->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void expect(const run_result *r, int status, const char *needle) {
    if (r->status != status) fail_msg("exit status %d, expected %d; output:\n%s", r->status, status, r->out);
    if (needle && !strstr(r->out, needle)) fail_msg("output lacks '%s':\n%s", needle, r->out);
}

static int count(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

static run_result r;

static void test_compare_solve_tril(void **state) {
    run(&r, NULL, "compare solve_tril");
    expect(&r, 0, "tolerance: ||x-ref||/||ref|| <= 0.0001");
    assert_int_equal(count(r.out, "  ok\n"), 2); /* blocked and subst */
    assert_null(strstr(r.out, "FAIL"));
    run(&r, NULL, "compare solve_tril --paths subst --dtype f64");
    expect(&r, 0, "tolerance: ||x-ref||/||ref|| <= 1e-06");
    assert_int_equal(count(r.out, "  ok\n"), 1);
}

static void test_compare_delta_rule_at_sizes(void **state) {
    run(&r, NULL, "compare delta_rule --B 1 --T 20 --H 1 --HV 2 --K 8 --V 8 --chunk 16 --warmup 0");
    expect(&r, 0, "B=1 T=20 H=1 HV=2 K=8 V=8 chunk=16");
    assert_int_equal(count(r.out, "  ok\n"), 4); /* chunk, subst, recurrent, decomposition */
    assert_non_null(strstr(r.out, "dinitial_state"));
}

static void test_compare_kda_gate_in_kernel_json(void **state) {
    run(&r, NULL,
        "compare kda --B 2 --T 12 --H 1 --HV 2 --K 4 --V 4 --chunk 16 --gate-in-kernel --varlen --json --warmup 0");
    expect(&r, 0, "\"tolerance\":0.001");
    /* fused, unfused, subst, recurrent, decomposition, gate_separate */
    assert_int_equal(count(r.out, "\"ok\":true"), 6);
    assert_int_equal(count(r.out, "\"ok\":false"), 0);
    assert_non_null(strstr(r.out, "\"ddt_bias\""));
}

static void test_compare_bad_values(void **state) {
    run(&r, NULL, "compare delta_rule --T abc");
    expect(&r, 2, "compare: --T 'abc' is not an integer");
    run(&r, NULL, "compare delta_rule --reps -1");
    expect(&r, 2, "--reps -1 is out of range");
    run(&r, NULL, "compare delta_rule --K 99999999999999999999999");
    expect(&r, 2, "is out of range");
    run(&r, NULL, "compare delta_rule --V 8x");
    expect(&r, 2, "--V '8x' is not an integer");
    run(&r, NULL, "compare delta_rule --chunk 48");
    expect(&r, 2, "--chunk '48' is not one of: 16 32 64");
    run(&r, NULL, "compare delta_rule --frobnicate");
    expect(&r, 2, "unknown option '--frobnicate'");
    run(&r, NULL, "compare solve_tril --T 64");
    expect(&r, 2, "takes its inputs from its sampler");
}

static void test_misspelled_ops(void **state) {
    run(&r, NULL, "compare nosuch");
    expect(&r, 2,
           "no op named 'nosuch' (ops with several backward variants: delta_rule, gated_delta_rule, kda, solve_tril)");
    run(&r, NULL, "compare add");
    expect(&r, 2, "add has one backward variant");
    run(&r, NULL, "ops nosuch");
    expect(&r, 2, "no op named 'nosuch'");
    assert_non_null(strstr(r.out, "solve_tril"));
    run(&r, NULL, "gradcheck nosuch");
    expect(&r, 2, "no op named 'nosuch'");
    run(&r, NULL, "bench nosuch");
    expect(&r, 2, "no op named 'nosuch'");
    run(&r, NULL, "compare kda --paths fused,nosuch");
    expect(&r, 2, "kda has no path 'nosuch' here (paths: fused unfused subst recurrent decomposition)");
    run(&r, "DG_BACKWARD=kda:nosuch", "compare kda");
    expect(&r, 2, "backward variant 'nosuch' does not exist (variants: fused, unfused, subst, recurrent)");
}

static void test_ops_named(void **state) {
    run(&r, NULL, "ops solve_tril");
    expect(&r, 0, "backward variants: blocked (default) subst");
    assert_non_null(strstr(r.out, "outputs: Ainv"));
    assert_null(strstr(r.out, "kda")); /* only the op named */
}

static void test_bench_small_op(void **state) {
    run(&r, NULL, "bench solve_tril --reps 1");
    expect(&r, 0, "after 2 warm-up runs");
    assert_int_equal(count(r.out, "\nblocked "), 3); /* the sampler's three samples */
    assert_int_equal(count(r.out, "\nsubst "), 3);
    run(&r, NULL, "bench solve_tril --reps 0");
    expect(&r, 2, "--reps 0 is out of range");
    run(&r, NULL, "bench --T abc");
    expect(&r, 2, "bench: --T 'abc' is not an integer");
}

static void test_too_big_is_refused(void **state) {
    run(&r, NULL, "bench --T 1000000000");
    expect(&r, 2, "of host memory");
    run(&r, NULL, "compare delta_rule --B 64 --T 100000000");
    expect(&r, 2, "of host memory");
}

int main(int argc, char **argv) {
    const char *env = getenv("DG_TOOL");
    if (env) snprintf(tool, sizeof tool, "%s", env);
    else {
        char self[4096];
        snprintf(self, sizeof self, "%s", argv[0]);
        snprintf(tool, sizeof tool, "%s/../deltagrad", dirname(self));
    }
    unsetenv("DG_BACKWARD");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compare_solve_tril),
        cmocka_unit_test(test_compare_delta_rule_at_sizes),
        cmocka_unit_test(test_compare_kda_gate_in_kernel_json),
        cmocka_unit_test(test_compare_bad_values),
        cmocka_unit_test(test_misspelled_ops),
        cmocka_unit_test(test_ops_named),
        cmocka_unit_test(test_bench_small_op),
        cmocka_unit_test(test_too_big_is_refused),
    };
    return dg_test_run_filtered(tests);
}
