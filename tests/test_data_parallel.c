/* Data-parallel training (models/data_parallel.h, tools/launch_gpus.c).
 *
 * On the CPU: the place of a process from the environment, the split of a global batch into the
 * ranks' slices, the rendezvous file (written atomically, waited for with a timeout), and the
 * gradients' buckets (cut in the order of placement, the same order required at every step).
 *
 * On two GPUs (skipped with fewer, or without NCCL): `deltagrad train --gpus 2` against `--gpus 1`
 * on the same global batch, a tiny f32 model for 20 steps.  The two runs see the same sequences and
 * differ only in where the sums run: one GPU sums the gradient over 8 sequences; two GPUs sum over 4
 * each and average the two (ncclAvg), and the per-row kernels may take other paths at another batch
 * size.  Those are roundings of f32 sums, about 1e-7 relative each, so the step-1 gradients agree to
 * about 1e-6 relative.  AdamW divides each moment by its square root, which keeps a relative
 * perturbation of the gradient a relative perturbation of the update (of the same size), and 20 steps
 * of a small model at lr 1e-3 do not amplify it by orders of magnitude.  The tolerances:
 *   - the loss of every step within 1e-4 relative (100x the expected difference);
 *   - the gradient norm of every step within 1e-3 relative (it is a sum over every parameter, and
 *     moves with the parameters' small differences; a mean taken as a sum would be off by 2x);
 *   - every final parameter within 2e-4 absolute: 1% of the 20 * lr that 20 Adam steps of at most
 *     about lr each can move an element, and the distance between the two runs' parameters at most
 *     1% of the distance the 1-GPU run moved from the initialisation.
 * A slice taken wrongly (two ranks on the same rows) changes the step-1 loss by percents. */
#include "core/device.h"
#include "models/checkpoint.h"
#include "models/data_parallel.h"
#include "models/dp_buckets.h"
#include "models/metrics.h"
#include "ops/collective.h"
#include "tests/support/test_support.h"

#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tool[4096];
static char tmpdir[256];

/* ---- on the CPU -------------------------------------------------------------------------------- */

static void test_env_names_the_place(void **state) {
    (void)state;
    int rank = -1, world = -1;
    unsetenv("DG_WORLD");
    unsetenv("DG_RANK");
    assert_int_equal(dg_dp_env(&rank, &world), 0);
    assert_int_equal(rank, 0);
    assert_int_equal(world, 1);
    setenv("DG_WORLD", "4", 1);
    setenv("DG_RANK", "3", 1);
    assert_int_equal(dg_dp_env(&rank, &world), 0);
    assert_int_equal(rank, 3);
    assert_int_equal(world, 4);
    setenv("DG_RANK", "4", 1);
    assert_int_equal(dg_dp_env(&rank, &world), -1);
    assert_error_contains("DG_RANK=4");
    setenv("DG_RANK", "1x", 1);
    assert_int_equal(dg_dp_env(&rank, &world), -1);
    assert_error_contains("DG_RANK=1x");
    unsetenv("DG_RANK");
    assert_int_equal(dg_dp_env(&rank, &world), -1);
    assert_error_contains("DG_RANK is not");
    unsetenv("DG_WORLD");
    setenv("DG_RANK", "0", 1);
    assert_int_equal(dg_dp_env(&rank, &world), -1);
    assert_error_contains("DG_WORLD is not");
    unsetenv("DG_RANK");
    /* a single process is not a data-parallel run */
    assert_int_equal(dg_dp_init(), 0);
    assert_false(dg_dp_active());
    assert_int_equal(dg_dp_world(), 1);
    assert_int_equal(dg_dp_rank(), 0);
}

static void test_slices_cover_the_batch_in_rank_order(void **state) {
    (void)state;
    for (int world = 1; world <= 8; world++)
        for (int64_t per = 1; per <= 3; per++) {
            int64_t next = 0;
            for (int r = 0; r < world; r++) {
                int64_t start = -1, count = -1;
                assert_int_equal(dg_dp_slice(per * world, r, world, &start, &count), 0);
                assert_int_equal(start, next);
                assert_int_equal(count, per);
                next += count;
            }
            assert_int_equal(next, per * world);
        }
    int64_t s, c;
    assert_int_equal(dg_dp_slice(7, 0, 2, &s, &c), -1);
    assert_error_contains("multiple of the number of GPUs");
    assert_int_equal(dg_dp_slice(1, 0, 2, &s, &c), -1);
    assert_error_contains("does not split");
    assert_int_equal(dg_dp_slice(8, 2, 2, &s, &c), -1);
    assert_error_contains("rank 2 of a world of 2");
}

static void test_take_slice_is_a_no_op_alone(void **state) {
    (void)state;
    dg_scope_begin();
    dg_tensor *in = dg_zeros(DG_SHAPE(6, 5), DG_I64), *tg = dg_zeros(DG_SHAPE(6, 5), DG_I64);
    dg_tensor *in0 = in, *tg0 = tg;
    assert_int_equal(dg_dp_take_slice(&in, &tg), 0);
    assert_ptr_equal(in, in0);
    assert_ptr_equal(tg, tg0);
    dg_scope_end();
}

static void test_rendezvous_file_round_trip(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/id", tmpdir);
    unsigned char id[DG_COMM_ID_BYTES], back[DG_COMM_ID_BYTES];
    for (int i = 0; i < DG_COMM_ID_BYTES; i++) id[i] = (unsigned char)(i * 37 + 11);
    assert_int_equal(dg_dp_rendezvous_publish(path, id, sizeof id), 0);
    memset(back, 0, sizeof back);
    assert_int_equal(dg_dp_rendezvous_wait(path, back, sizeof back, 1.0), 0);
    assert_memory_equal(id, back, sizeof id);
    /* published again (a new id): replaced whole, never torn */
    id[0] ^= 0xff;
    assert_int_equal(dg_dp_rendezvous_publish(path, id, sizeof id), 0);
    assert_int_equal(dg_dp_rendezvous_wait(path, back, sizeof back, 1.0), 0);
    assert_memory_equal(id, back, sizeof id);
    /* no temporary file is left beside it */
    char tmpname[600];
    snprintf(tmpname, sizeof tmpname, "ls -A %s | grep -c tmp > /dev/null", tmpdir);
    assert_int_not_equal(system(tmpname), 0);
    unlink(path);
}

static void test_rendezvous_wait_times_out_naming_the_file(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/never-written", tmpdir);
    unsigned char id[DG_COMM_ID_BYTES];
    double t0 = dg_progress_now();
    assert_int_equal(dg_dp_rendezvous_wait(path, id, sizeof id, 0.2), -1);
    double waited = dg_progress_now() - t0;
    assert_true(waited >= 0.2 && waited < 5.0);
    assert_error_contains("never-written");
}

static void test_rendezvous_refuses_a_foreign_file(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/foreign", tmpdir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("not a rendezvous\n", f);
    fclose(f);
    unsigned char id[DG_COMM_ID_BYTES];
    assert_int_equal(dg_dp_rendezvous_wait(path, id, sizeof id, 1.0), -1);
    assert_error_contains("is not a rendezvous file");
    unlink(path);
}

static void test_id_from_hex(void **state) {
    (void)state;
    unsigned char id[3];
    assert_int_equal(dg_dp_id_from_hex("00fFa7", id, 3), 0);
    assert_int_equal(id[0], 0x00);
    assert_int_equal(id[1], 0xff);
    assert_int_equal(id[2], 0xa7);
    assert_int_equal(dg_dp_id_from_hex("00ff", id, 3), -1);
    assert_error_contains("6 hex digits");
    assert_int_equal(dg_dp_id_from_hex("00ffg7", id, 3), -1);
    assert_error_contains("'g'");
}

/* ---- the buckets (models/dp_buckets.h) ---------------------------------------------------------- */

/* What launch saw: the concatenation, bucket by bucket, of (param, element) for every element. */
typedef struct {
    int64_t param[64], elem[64], n;
    int64_t fills[16], n_buckets;
} launch_log;

static int log_launch(void *ctx, const dg_dp_seg *segs, int64_t n_segs, int64_t fill) {
    launch_log *l = ctx;
    int64_t at = 0;
    for (int64_t s = 0; s < n_segs; s++) {
        if (segs[s].off != at)
            fail_msg("segment %lld starts at %lld, not %lld", (long long)s, (long long)segs[s].off, (long long)at);
        for (int64_t e = 0; e < segs[s].n; e++) {
            l->param[l->n] = segs[s].param;
            l->elem[l->n++] = segs[s].grad_off + e;
        }
        at += segs[s].n;
    }
    assert_int_equal(at, fill);
    l->fills[l->n_buckets++] = fill;
    return 0;
}

/* Parameters of 5, 3, 10 and 2 elements in buckets of 4, finished in the order 2, 0, 3 (1 never
 * reached): every bucket but the last is full, a gradient larger than the room left is cut across
 * buckets, and the elements arrive in the order of placement, the unreached parameter last. */
static void test_buckets_follow_the_order_of_placement(void **state) {
    (void)state;
    const int64_t numel[4] = {5, 3, 10, 2};
    launch_log l = {0};
    dg_dp_buckets b;
    assert_int_equal(dg_dp_buckets_init(&b, 4, numel, 4, log_launch, &l), 0);
    dg_dp_buckets_begin(&b);
    assert_int_equal(dg_dp_buckets_place(&b, 2, NULL), 0);
    assert_int_equal(l.n_buckets, 2); /* 10 elements: two full buckets, 2 left open */
    assert_int_equal(dg_dp_buckets_place(&b, 0, NULL), 0);
    assert_int_equal(dg_dp_buckets_place(&b, 2, NULL), 0); /* placed twice: nothing */
    assert_int_equal(dg_dp_buckets_place(&b, 3, NULL), 0);
    assert_int_equal(dg_dp_buckets_end(&b, NULL), 0);
    const int64_t want_param[20] = {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 3, 3, 1, 1, 1};
    const int64_t want_elem[20] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 0, 1, 0, 1, 2};
    assert_int_equal(l.n, 20);
    for (int i = 0; i < 20; i++) {
        assert_int_equal(l.param[i], want_param[i]);
        assert_int_equal(l.elem[i], want_elem[i]);
    }
    assert_int_equal(l.n_buckets, 5);
    for (int i = 0; i < 5; i++) assert_int_equal(l.fills[i], 4);
    /* the next step in the same order cuts the same buckets */
    launch_log l2 = {0};
    b.ctx = &l2;
    dg_dp_buckets_begin(&b);
    assert_int_equal(dg_dp_buckets_place(&b, 2, NULL), 0);
    assert_int_equal(dg_dp_buckets_place(&b, 0, NULL), 0);
    assert_int_equal(dg_dp_buckets_place(&b, 3, NULL), 0);
    assert_int_equal(dg_dp_buckets_end(&b, NULL), 0);
    assert_memory_equal(l.param, l2.param, sizeof l.param);
    assert_memory_equal(l.elem, l2.elem, sizeof l.elem);
    dg_dp_buckets_free(&b);
}

/* A later step that finishes the parameters in another order is stopped, naming both, before the
 * bucket holding the stray parameter is sent. */
static void test_buckets_refuse_another_order(void **state) {
    (void)state;
    const int64_t numel[3] = {4, 4, 4};
    const char *names[3] = {"embed", "w1", "head"};
    launch_log l = {0};
    dg_dp_buckets b;
    assert_int_equal(dg_dp_buckets_init(&b, 3, numel, 8, log_launch, &l), 0);
    dg_dp_buckets_begin(&b);
    assert_int_equal(dg_dp_buckets_place(&b, 2, names), 0);
    assert_int_equal(dg_dp_buckets_place(&b, 1, names), 0);
    assert_int_equal(dg_dp_buckets_end(&b, names), 0);
    assert_int_equal(l.n_buckets, 2);
    dg_dp_buckets_begin(&b);
    assert_int_equal(dg_dp_buckets_place(&b, 2, names), 0);
    assert_int_equal(dg_dp_buckets_place(&b, 0, names), -1);
    assert_error_contains("parameter 0 (embed) where the first step finished 1 (w1)");
    assert_int_equal(l.n_buckets, 2); /* nothing more was sent */
    dg_dp_buckets_free(&b);
    /* a bucket of no elements is refused */
    assert_int_equal(dg_dp_buckets_init(&b, 3, numel, 0, log_launch, &l), -1);
    assert_error_contains("buckets of 0 elements");
}

/* A rank whose rank 0 never writes the file: a clear error after the timeout, not a hang. */
static void test_worker_without_rank0_times_out(void **state) {
    (void)state;
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "cd %s && DG_NO_REEXEC=1 DG_WORLD=2 DG_RANK=1 DG_RENDEZVOUS=%s/absent DG_RENDEZVOUS_TIMEOUT=0.3 "
             "timeout 60 %s train --layers 1 --hidden-size 32 --heads 2 --head-dim 16 --vocab-size 64 --seq-len 64 "
             "--kv-pairs 4 --batch 4 --steps 2 --device cpu --out w 2>&1",
             tmpdir, tmpdir, tool);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char out[8192] = {0};
    size_t got = fread(out, 1, sizeof out - 1, p);
    out[got] = 0;
    int st = pclose(p);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 1);
    if (!strstr(out, "no rendezvous file") || !strstr(out, "absent")) fail_msg("unexpected output: %s", out);
}

/* ---- on two GPUs ------------------------------------------------------------------------------- */

static bool two_gpus(void) {
#ifdef DG_HAVE_CUDA
    int visible = dg_cuda_device_count();
#else
    int visible = 0;
#endif
    if (visible < 2) {
        dg_test_skip("needs 2 GPUs");
        return false;
    }
    if (!dg_comm_available()) {
        dg_test_skip("needs a CUDA build with NCCL");
        return false;
    }
    return true;
}

#define TINY_GPU                                                                                               \
    "--layers 2 --hidden-size 64 --heads 2 --head-dim 32 --vocab-size 64 --seq-len 64 --kv-pairs 4 --batch 8 " \
    "--eval-examples 32 --eval-every 0 --save-every 0 --lr 1e-3 --warmup 2 --clip 1 --seed 5 --device cuda "   \
    "--precision f32 --quiet"

static void train(const char *out, const char *extra) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cd %s && timeout 300 %s train " TINY_GPU " --out %s %s > %s.log 2>&1", tmpdir, tool, out,
             extra, out);
    int st = system(cmd);
    if (st != 0) {
        char log[700];
        snprintf(log, sizeof log, "cat %s/%s.log", tmpdir, out);
        int shown = system(log);
        (void)shown;
        fail_msg("'%s' failed (status %d)", cmd, st);
    }
}

static dg_csv_table *metrics(const char *run) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s/metrics.csv", tmpdir, run);
    dg_csv_table *t = dg_csv_read(path);
    if (!t) fail_msg("%s", dg_last_error());
    return t;
}

/* Every step's loss and gradient norm of run b against run a (same steps). */
static void compare_curves(const char *a, const char *b) {
    dg_csv_table *ta = metrics(a), *tb = metrics(b);
    assert_int_equal(ta->nrows, tb->nrows);
    int cl = dg_csv_column(ta, "loss"), cg = dg_csv_column(ta, "grad_norm");
    assert_true(cl >= 0 && cg >= 0);
    for (int64_t r = 0; r < ta->nrows; r++) {
        double la = ta->data[r * ta->ncols + cl], lb = tb->data[r * tb->ncols + cl];
        double ga = ta->data[r * ta->ncols + cg], gb = tb->data[r * tb->ncols + cg];
        if (!(fabs(la - lb) <= 1e-4 * fabs(la)))
            fail_msg("step %lld: loss %.9g (%s) vs %.9g (%s)", (long long)r + 1, la, a, lb, b);
        if (!(fabs(ga - gb) <= 1e-3 * fabs(ga)))
            fail_msg("step %lld: gradient norm %.9g (%s) vs %.9g (%s)", (long long)r + 1, ga, a, gb, b);
    }
    dg_csv_table_free(ta);
    dg_csv_table_free(tb);
}

/* The final parameters of run b against run a (each element within max_elem) and against the
 * initialisation. */
static void compare_params(const char *a, const char *b, double max_elem) {
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/%s", tmpdir, a);
    snprintf(pb, sizeof pb, "%s/%s", tmpdir, b);
    dg_ckpt_model ma, mb;
    if (dg_ckpt_load_model(pa, &ma) || dg_ckpt_load_model(pb, &mb)) fail_msg("%s", dg_last_error());
    assert_int_equal(ma.step, mb.step);
    dg_lm *init = dg_lm_new(&ma.lm->cfg, 5, DG_F32); /* --seed 5 */
    assert_non_null(init);
    assert_int_equal(ma.lm->params.n, mb.lm->params.n);
    double max_diff = 0, diff2 = 0, moved2 = 0;
    for (int64_t i = 0; i < ma.lm->params.n; i++) {
        dg_tensor *x = ma.lm->params.t[i], *y = mb.lm->params.t[i], *z = init->params.t[i];
        assert_int_equal(dg_numel(x), dg_numel(y));
        const float *px = dg_data_ptr(x), *py = dg_data_ptr(y), *pz = dg_data_ptr(z);
        for (int64_t k = 0; k < dg_numel(x); k++) {
            double d = fabs((double)px[k] - py[k]), m = (double)px[k] - pz[k];
            if (!(d <= max_diff)) max_diff = d;
            diff2 += d * d;
            moved2 += m * m;
        }
    }
    printf("  %s vs %s: max |difference| %.3g, ||difference|| / ||movement|| %.3g\n", a, b, max_diff,
           sqrt(diff2 / moved2));
    assert_true(moved2 > 0);
    if (!(max_diff <= max_elem))
        fail_msg("a parameter differs by %g (> %g) between %s and %s", max_diff, max_elem, a, b);
    if (!(sqrt(diff2) <= 1e-2 * sqrt(moved2)))
        fail_msg("the runs are %g apart, more than 1%% of the %g the parameters moved", sqrt(diff2), sqrt(moved2));
    dg_lm_free(init);
    dg_ckpt_model_free(&ma);
    dg_ckpt_model_free(&mb);
}

/* The 1-GPU run "one" of 20 steps, trained once for every test that compares against it. */
static void train_one(void) {
    char done[600];
    snprintf(done, sizeof done, "%s/one/model.safetensors", tmpdir);
    if (access(done, F_OK) != 0) train("one", "--steps 20 --gpus 1");
}

/* run: 20 steps on two GPUs with the options extra, against "one" (each parameter within max_elem). */
static void two_follow_one(const char *run, const char *extra, double max_elem) {
    if (!two_gpus()) return;
    train_one();
    char opts[256];
    snprintf(opts, sizeof opts, "--steps 20 --gpus 2 %s", extra);
    train(run, opts);
    compare_curves("one", run);
    compare_params("one", run, max_elem);
}

static void test_two_gpus_follow_one(void **state) {
    (void)state;
    two_follow_one("two", "", 2e-4);
}

/* The gradients averaged in bf16 (--bf16-all-reduce): each rank's gradient is rounded to bf16
 * before the mean, and the mean after it.  Where the ranks' gradients nearly cancel, the mean's
 * error is 2^-9 of the ranks' gradients, not of the mean, so an element can take a different
 * AdamW update (whose size is about lr whatever the gradient's): single elements may differ by up
 * to the 20 * lr = 2e-2 that 20 steps can move them, which is the bound per element here.  Taken
 * over all the parameters the roundings stay small: the loss and gradient-norm curves keep the f32
 * bounds (1e-4 and 1e-3 relative), and the runs' distance stays within 1% of the distance the
 * parameters moved. */
static void test_bf16_all_reduce_follows_one(void **state) {
    (void)state;
    two_follow_one("two_bf16", "--bf16-all-reduce", 2e-2);
}

/* A run checkpointed on two GPUs resumes on one (and the other way), and ends where one GPU ends. */
static void test_checkpoint_resumes_on_another_count(void **state) {
    (void)state;
    if (!two_gpus()) return;
    train_one();
    train("two_then_one", "--steps 20 --stop-at 10 --gpus 2");
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cd %s && timeout 300 %s train --resume two_then_one --gpus 1 --quiet > r1.log 2>&1",
             tmpdir, tool);
    assert_int_equal(system(cmd), 0);
    compare_params("one", "two_then_one", 2e-4);
    train("one_then_two", "--steps 20 --stop-at 10 --gpus 1");
    snprintf(cmd, sizeof cmd, "cd %s && timeout 300 %s train --resume one_then_two --gpus 2 --quiet > r2.log 2>&1",
             tmpdir, tool);
    assert_int_equal(system(cmd), 0);
    compare_params("one", "one_then_two", 2e-4);
}

int main(int argc, char **argv) {
    (void)argc;
    const char *env = getenv("DG_BIN");
    if (env) snprintf(tool, sizeof tool, "%s", env);
    else {
        char self[4096];
        snprintf(self, sizeof self, "%s", argv[0]);
        snprintf(tool, sizeof tool, "%s/../deltagrad", dirname(self));
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/dg-dp.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(tmpdir)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_env_names_the_place),
        cmocka_unit_test(test_slices_cover_the_batch_in_rank_order),
        cmocka_unit_test(test_take_slice_is_a_no_op_alone),
        cmocka_unit_test(test_rendezvous_file_round_trip),
        cmocka_unit_test(test_rendezvous_wait_times_out_naming_the_file),
        cmocka_unit_test(test_rendezvous_refuses_a_foreign_file),
        cmocka_unit_test(test_id_from_hex),
        cmocka_unit_test(test_buckets_follow_the_order_of_placement),
        cmocka_unit_test(test_buckets_refuse_another_order),
        cmocka_unit_test(test_worker_without_rank0_times_out),
        cmocka_unit_test(test_two_gpus_follow_one),
        cmocka_unit_test(test_bf16_all_reduce_follows_one),
        cmocka_unit_test(test_checkpoint_resumes_on_another_count),
    };
    int rc = dg_test_run_filtered(tests);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd)) rc = rc ? rc : 1;
    return rc;
}
