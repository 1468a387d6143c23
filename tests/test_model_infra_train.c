/* models/ infrastructure, training side: AdamW against a hand computation, weight-decay names,
 * gradient clipping, the lr schedule, optimiser state files, the metrics CSV, the SVG chart and the
 * progress display. */
#include "tests/model_infra_common.h"

#include "models/atomic_file.h"
#include "models/chart.h"
#include "models/metrics.h"
#include "models/optim.h"
#include "models/safetensors.h"

#include <math.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- AdamW, clipping, schedule ------------------------------------------------------------- */

static dg_tensor *param(const char *name, int n, const float *vals, const float *grads) {
    dg_tensor *p = dg_zeros(DG_SHAPE(n), DG_F32);
    memcpy(p->storage->data, vals, (size_t)n * sizeof(float));
    dg_set_name(p, name);
    if (grads) {
        p->grad = dg_keep(dg_zeros(DG_SHAPE(n), DG_F32));
        memcpy(p->grad->storage->data, grads, (size_t)n * sizeof(float));
    }
    return p;
}

static void test_adamw_matches_hand_computation(void **state) {
    dg_scope_begin();
    const float p0[4] = {0.5f, -1.0f, 2.0f, 0.0f}, g1[4] = {0.1f, -0.2f, 0.0f, 3.0f}, g2[4] = {-0.3f, 0.4f, 1.0f, 0.5f};
    dg_tensor *w = param("model.layers.0.attn.q_proj.weight", 4, p0, g1);
    dg_tensor *nw = param("model.layers.0.attn_norm.weight", 4, p0, g1);
    dg_adamw_config cfg = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    dg_adamw *opt = dg_adamw_new(2, (dg_tensor *[]){w, nw}, &cfg);
    assert_non_null(opt);
    assert_true(opt->decay[0]);
    assert_false(opt->decay[1]);
    const double lr1 = 0.01, lr2 = 0.02;
    assert_int_equal(dg_adamw_step(opt, lr1), 0);
    memcpy(w->grad->storage->data, g2, sizeof g2);
    memcpy(nw->grad->storage->data, g2, sizeof g2);
    assert_int_equal(dg_adamw_step(opt, lr2), 0);
    assert_int_equal(opt->step, 2);
    /* by hand, in double */
    for (int decay = 1; decay >= 0; decay--) {
        const float *got = (decay ? w : nw)->storage->data;
        for (int i = 0; i < 4; i++) {
            double p = p0[i], m = 0, v = 0;
            const float *gs[2] = {g1, g2};
            double lrs[2] = {lr1, lr2};
            for (int t = 1; t <= 2; t++) {
                double g = gs[t - 1][i], lr = lrs[t - 1];
                if (decay) p *= 1 - lr * 0.1;
                m = 0.9 * m + 0.1 * g;
                v = 0.95 * v + 0.05 * g * g;
                double mh = m / (1 - pow(0.9, t)), vh = v / (1 - pow(0.95, t));
                p -= lr * mh / (sqrt(vh) + 1e-8);
            }
            if (fabs(got[i] - p) > 1e-6 * fmax(1.0, fabs(p)))
                fail_msg("decay %d element %d: got %.9g, expected %.9g", decay, i, got[i], p);
        }
    }
    /* first step of a fresh optimiser moves each element by lr * sign(g) (m/sqrt(v) = g/|g|) */
    const float z[3] = {1.0f, 1.0f, 1.0f}, g[3] = {1e-3f, -5.0f, 0.0f};
    dg_tensor *b = param("lm_head.bias", 3, z, g);
    dg_adamw *o2 = dg_adamw_new(1, &b, NULL);
    assert_false(o2->decay[0]);
    assert_int_equal(dg_adamw_step(o2, 0.5), 0);
    const float *bp = b->storage->data;
    assert_true(fabsf(bp[0] - 0.5f) < 1e-5f && fabsf(bp[1] - 1.5f) < 1e-6f && bp[2] == 1.0f);
    /* a bad grad is refused without touching anything */
    dg_release(b->grad);
    b->grad = dg_keep(dg_zeros(DG_SHAPE(4), DG_F32));
    assert_int_equal(dg_adamw_step(o2, 0.5), -1);
    assert_error_contains("grad of parameter 0 (lm_head.bias) is f32 [4] on cpu but the parameter is f32 [3]");
    assert_int_equal(o2->step, 1);
    assert_true(fabsf(bp[1] - 1.5f) < 1e-6f);
    /* parameters that are not f32 host tensors, or repeat a name */
    dg_tensor *d64 = dg_zeros(DG_SHAPE(2), DG_F64);
    assert_null(dg_adamw_new(1, &d64, NULL));
    assert_error_contains("is f64 [2] on cpu");
    assert_null(dg_adamw_new(2, (dg_tensor *[]){w, w}, NULL));
    assert_error_contains("the same tensor");
    dg_adamw_free(opt);
    dg_adamw_free(o2);
    dg_scope_end();
}

static void test_weight_decay_names(void **state) {
    const char *no[] = {"model.layers.0.attn.A_log",         "model.layers.3.attn.dt_bias",
                        "model.layers.0.attn_norm.weight",   "model.layers.0.mlp_norm.weight",
                        "model.layers.0.attn.o_norm.weight", "model.norm.weight",
                        "model.layers.1.attn.q_proj.bias",   "A_log"};
    const char *yes[] = {"model.embeddings.weight",
                         "model.layers.0.attn.q_proj.weight",
                         "lm_head.weight",
                         "model.layers.0.attn.q_conv1d.weight",
                         "model.layers.0.mlp.gate_proj.weight",
                         "model.layers.0.attn.f_proj.0.weight",
                         "model.layers.0.attn.b_proj.weight"};
    for (size_t i = 0; i < sizeof no / sizeof *no; i++)
        if (dg_param_decays(no[i], 1)) fail_msg("%s should not decay", no[i]);
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
        if (!dg_param_decays(yes[i], 2)) fail_msg("%s should decay", yes[i]);
    assert_true(dg_param_decays(NULL, 2));
    assert_false(dg_param_decays(NULL, 1));
}

static void test_clip_grad_norm(void **state) {
    dg_scope_begin();
    const float v[3] = {0, 0, 0};
    dg_tensor *a = param("a", 2, v, (float[]){3.0f, 4.0f});
    dg_tensor *b = param("b", 1, v, (float[]){12.0f});
    dg_tensor *c = param("c", 1, v, NULL); /* no grad: counts as zero */
    dg_tensor *ps[3] = {a, b, c};
    assert_true(dg_grad_norm(3, ps) == 13.0);
    assert_true(dg_clip_grad_norm(3, ps, 20.0) == 13.0); /* under the limit: untouched */
    assert_true(((float *)b->grad->storage->data)[0] == 12.0f);
    assert_true(dg_clip_grad_norm(3, ps, 0.0) == 13.0); /* 0 = no clipping */
    assert_true(dg_clip_grad_norm(3, ps, 6.5) == 13.0);
    float coef = (float)(6.5 / (13.0 + 1e-6));
    assert_true(((float *)a->grad->storage->data)[0] == 3.0f * coef);
    assert_true(((float *)b->grad->storage->data)[0] == 12.0f * coef);
    assert_true(fabs(dg_grad_norm(3, ps) - 6.5) < 1e-5);
    ((float *)a->grad->storage->data)[1] = NAN; /* non-finite: reported, grads left alone */
    assert_true(isnan(dg_clip_grad_norm(3, ps, 1.0)));
    assert_true(((float *)b->grad->storage->data)[0] == 12.0f * coef);
    dg_scope_end();
}

static void test_lr_schedule(void **state) {
    dg_lr_schedule s = {.peak_lr = 1.0, .warmup_steps = 10, .total_steps = 110, .min_lr_ratio = 0.1};
    assert_true(fabs(dg_lr_at(&s, 0) - 0.1) < 1e-15);
    assert_true(fabs(dg_lr_at(&s, 4) - 0.5) < 1e-15);
    assert_true(fabs(dg_lr_at(&s, 9) - 1.0) < 1e-15);
    assert_true(fabs(dg_lr_at(&s, 10) - 1.0) < 1e-15);
    assert_true(fabs(dg_lr_at(&s, 60) - 0.55) < 1e-15); /* half way: 0.1 + 0.9 * 0.5 */
    assert_true(fabs(dg_lr_at(&s, 35) - (0.1 + 0.45 * (1 + cos(M_PI * 0.25)))) < 1e-15);
    assert_true(fabs(dg_lr_at(&s, 110) - 0.1) < 1e-15);
    assert_true(fabs(dg_lr_at(&s, 5000) - 0.1) < 1e-15);
    for (int64_t t = 11; t < 110; t++) assert_true(dg_lr_at(&s, t) < dg_lr_at(&s, t - 1));
    dg_lr_schedule nw = {.peak_lr = 3e-3, .warmup_steps = 0, .total_steps = 100, .min_lr_ratio = 0.0};
    assert_true(dg_lr_at(&nw, 0) == 3e-3);
    assert_true(fabs(dg_lr_at(&nw, 100)) < 1e-18);
}

static void test_adamw_state_round_trip(void **state) {
    dg_scope_begin();
    const float p0[5] = {0.1f, 0.2f, -0.3f, 0.4f, 0.5f}, g[5] = {0.5f, -0.1f, 0.2f, 0.3f, -1.0f};
    dg_tensor *a1 = param("model.layers.0.attn.A_log", 5, p0, g), *w1 = param("lm_head.weight", 5, p0, g);
    dg_tensor *a2 = param("model.layers.0.attn.A_log", 5, p0, g), *w2 = param("lm_head.weight", 5, p0, g);
    dg_adamw *o1 = dg_adamw_new(2, (dg_tensor *[]){a1, w1}, NULL);
    for (int s = 0; s < 3; s++) assert_int_equal(dg_adamw_step(o1, 1e-2 * (s + 1)), 0);
    const char *path = tmp_path("optim.safetensors");
    assert_int_equal(dg_adamw_save(o1, path, 1, (const char *[]){"run"}, (const char *[]){"test"}), 0);
    /* a second optimiser over parameters with the same values continues bit-identically */
    memcpy(a2->storage->data, a1->storage->data, sizeof p0);
    memcpy(w2->storage->data, w1->storage->data, sizeof p0);
    dg_adamw *o2 = dg_adamw_new(2, (dg_tensor *[]){a2, w2}, NULL);
    assert_int_equal(dg_adamw_load(o2, path), 0);
    assert_int_equal(o2->step, 3);
    for (int s = 0; s < 2; s++) {
        assert_int_equal(dg_adamw_step(o1, 0.05), 0);
        assert_int_equal(dg_adamw_step(o2, 0.05), 0);
    }
    assert_memory_equal(a1->storage->data, a2->storage->data, sizeof p0);
    assert_memory_equal(w1->storage->data, w2->storage->data, sizeof p0);
    assert_memory_equal(o1->v[1]->storage->data, o2->v[1]->storage->data, sizeof p0);
    dg_st_file *f = dg_st_read(path);
    assert_string_equal(dg_st_meta(f, "step"), "3");
    assert_string_equal(dg_st_meta(f, "run"), "test");
    assert_non_null(dg_st_get(f, "exp_avg_sq.lm_head.weight"));
    dg_st_free(f);

    /* mismatched parameters: refused, state unchanged */
    dg_tensor *big = param("lm_head.weight", 3, p0, g), *other = param("other", 5, p0, g);
    dg_adamw *o3 = dg_adamw_new(2, (dg_tensor *[]){a2, big}, NULL);
    assert_int_equal(dg_adamw_load(o3, path), -1);
    assert_error_contains("\"exp_avg.lm_head.weight\" is f32 [5] but parameter \"lm_head.weight\" is f32 [3]");
    assert_int_equal(o3->step, 0);
    assert_true(((float *)o3->m[0]->storage->data)[0] == 0.0f); /* the first moment was not loaded either */
    dg_adamw *o4 = dg_adamw_new(2, (dg_tensor *[]){a2, other}, NULL);
    assert_int_equal(dg_adamw_load(o4, path), -1);
    assert_error_contains("has no tensor \"exp_avg.other\" for parameter \"other\"");
    dg_adamw *o5 = dg_adamw_new(1, &a2, NULL);
    assert_int_equal(dg_adamw_load(o5, path), -1);
    assert_error_contains("holds 4 moment tensors but the optimiser has 1 parameters");
    /* a checkpoint that is not an optimiser state */
    dg_tensor *x = dg_zeros(DG_SHAPE(1), DG_F32);
    assert_int_equal(dg_st_write(tmp_path("model.safetensors"), 1, (const char *[]){"x"}, &x, 0, NULL, NULL), 0);
    assert_int_equal(dg_adamw_load(o5, tmp_path("model.safetensors")), -1);
    assert_error_contains("is not a deltagrad AdamW state");
    dg_adamw_free(o1);
    dg_adamw_free(o2);
    dg_adamw_free(o3);
    dg_adamw_free(o4);
    dg_adamw_free(o5);
    dg_scope_end();
}

/* ---- metrics, chart, progress ------------------------------------------------------------------ */

static void test_metrics_csv_and_chart(void **state) {
    const char *path = tmp_path("metrics.csv");
    const char *cols[5] = {"step", "loss", "acc", "eval_loss", "eval_acc"};
    dg_csv *c = dg_csv_open(path, 5, cols, -1);
    assert_non_null(c);
    for (int s = 1; s <= 300; s++) {
        double ev = s % 50 == 0;
        double row[5] = {s, 5.0 * exp(-s / 30.0) + 1e-3, 1 - exp(-s / 80.0), ev ? 5.5 * exp(-s / 30.0) : NAN,
                         ev ? 1 - exp(-s / 70.0) : NAN};
        assert_int_equal(dg_csv_row(c, row), 0);
    }
    dg_csv_close(c);
    /* a run killed mid-line after its checkpoint at step 200: resume drops rows > 200 and the torn line */
    FILE *f = fopen(path, "ab");
    fputs("301,0.5,0.", f);
    fclose(f);
    c = dg_csv_open(path, 5, cols, 200);
    assert_non_null(c);
    assert_int_equal(c->missing_steps, 0); /* rows 1..200 all there */
    assert_int_equal(dg_csv_row(c, (double[]){201, 0.25, 0.5, NAN, NAN}), 0);
    dg_csv_close(c);
    dg_csv_table *t = dg_csv_read(path);
    assert_non_null(t);
    assert_int_equal(t->ncols, 5);
    assert_int_equal(t->nrows, 201);
    assert_int_equal(dg_csv_column(t, "eval_acc"), 4);
    assert_true(t->data[199 * 5 + 0] == 200);
    assert_true(t->data[200 * 5 + 1] == 0.25);
    assert_true(isnan(t->data[200 * 5 + 3]));
    assert_true(fabs(t->data[149 * 5 + 3] - 5.5 * exp(-150 / 30.0)) < 1e-9);
    dg_csv_table_free(t);
    /* resuming a log with other columns is refused */
    assert_null(dg_csv_open(path, 2, (const char *[]){"step", "loss"}, 10));
    assert_error_contains("has the columns \"step,loss,acc,eval_loss,eval_acc\", expected \"step,loss\"");
    assert_null(dg_csv_open(path, 2, (const char *[]){"step", "a,b"}, -1));
    assert_error_contains("holds a comma");

    const char *svg = tmp_path("metrics.svg");
    assert_int_equal(dg_chart_from_csv(path, svg, "MQAR <test> & chart"), 0);
    size_t n;
    char *text = (char *)read_bytes(svg, &n);
    text[n] = 0;
    assert_true(strncmp(text, "<svg ", 5) == 0);
    assert_non_null(strstr(text, "MQAR &lt;test&gt; &amp; chart"));
    assert_non_null(strstr(text, ">eval_acc</text>"));
    assert_non_null(strstr(text, "loss (log scale)"));
    assert_non_null(strstr(text, ">0.2</text>")); /* accuracy ticks 0, 0.2, ... 1 */
    assert_non_null(strstr(text, ">200</text>")); /* step ticks */
    assert_non_null(strstr(text, "<polyline"));
    assert_non_null(strstr(text, "<circle")); /* the few eval points get markers */
    assert_non_null(strstr(text, "</svg>\n"));
    int polylines = 0;
    for (char *p = text; (p = strstr(p, "<polyline")); p++) polylines++;
    assert_int_equal(polylines, 4);
    free(text);
    assert_int_equal(dg_chart_from_csv(tmp_path("missing.csv"), svg, "x"), -1);
    assert_error_contains("cannot read");
}

static char *capture(FILE *f) {
    fflush(f);
    long n = ftell(f);
    rewind(f);
    char *s = calloc(1, (size_t)n + 1);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return s;
}

/* a log cut short (or with rows taken out) is resumed with its gap counted, not silently */
static void test_metrics_gap_detected(void **state) {
    const char *path = tmp_path("gap.csv");
    const char *cols[2] = {"step", "loss"};
    FILE *f = fopen(path, "wb");
    fputs("step,loss\n1,4\n2,3.5\n3,3\n5,2.5\n", f); /* step 4 missing, and 6..8 cut off */
    fclose(f);
    dg_csv *c = dg_csv_open(path, 2, cols, 8);
    assert_non_null(c);
    assert_int_equal(c->missing_steps, 4);
    assert_int_equal(c->missing_from, 4);
    assert_int_equal(c->missing_to, 4);
    dg_csv_close(c);
    /* the log gone altogether: every step before the resume is missing */
    unlink(path);
    c = dg_csv_open(path, 2, cols, 8);
    assert_non_null(c);
    assert_int_equal(c->missing_steps, 8);
    assert_int_equal(c->missing_from, 1);
    assert_int_equal(c->missing_to, 8);
    dg_csv_close(c);
}

/* temporary files of killed writers are removed; a live process's and other files are kept */
static void test_stale_tmp_removed(void **state) {
    const char *dir = tmp_path("stale");
    mkdir(dir, 0777);
    char dead[600], mine[600], live[600], other[600], odd[600];
    pid_t child = fork(); /* a PID that is certainly gone: a child that has exited and been reaped */
    if (child == 0) _exit(0);
    waitpid(child, NULL, 0);
    snprintf(dead, sizeof dead, "%s/.model.safetensors.tmp-%ld-0", dir, (long)child);
    snprintf(mine, sizeof mine, "%s/.config.json.tmp-%ld-3", dir, (long)getpid());
    snprintf(live, sizeof live, "%s/.metrics.csv.tmp-%ld-1", dir, (long)getppid());
    snprintf(other, sizeof other, "%s/notes.tmp-1-1", dir);
    snprintf(odd, sizeof odd, "%s/.x.tmp-12-a", dir);
    const char *all[] = {dead, mine, live, other, odd};
    for (int i = 0; i < 5; i++) fclose(fopen(all[i], "wb"));
    assert_int_equal(dg_atomic_remove_stale(dir), 2);
    assert_int_equal(access(dead, F_OK), -1);
    assert_int_equal(access(mine, F_OK), -1);
    assert_int_equal(access(live, F_OK), 0);
    assert_int_equal(access(other, F_OK), 0);
    assert_int_equal(access(odd, F_OK), 0);
    for (int i = 0; i < 5; i++) unlink(all[i]);
    rmdir(dir);
    assert_int_equal(dg_atomic_remove_stale(dir), -1);
    assert_error_contains("cannot read the directory");
}

static void test_progress(void **state) {
    char buf[32];
    assert_string_equal(dg_format_duration(5.2, buf, sizeof buf), "5s");
    assert_string_equal(dg_format_duration(185, buf, sizeof buf), "3m05s");
    assert_string_equal(dg_format_duration(3720, buf, sizeof buf), "1h02m");
    assert_string_equal(dg_format_duration(NAN, buf, sizeof buf), "?");

    /* plain: a line every log_every steps and at the end, with ETA from the rate so far */
    FILE *f = tmpfile();
    dg_progress p;
    dg_progress_init(&p, f, DG_PROGRESS_PLAIN, 0, 100, 10);
    double t0 = p.t_start;
    for (int s = 1; s <= 100; s++) dg_progress_update_at(&p, s, 1.0 / s, 0.5, 12345, t0 + 0.5 * s);
    dg_progress_message(&p, "eval acc %.2f", 0.99);
    dg_progress_finish(&p);
    char *out = capture(f);
    int lines = 0;
    for (char *q = out; *q; q++) lines += *q == '\n';
    assert_int_equal(lines, 11);
    assert_non_null(strstr(out, "step 10/100 loss 0.1000 acc 0.5000 tok/s 12345 elapsed 5s eta 45s\n"));
    assert_non_null(strstr(out, "step 100/100 loss 0.0100"));
    assert_null(strchr(out, '\r'));
    free(out);

    /* terminal: \r redraws, throttled, a bar, ETA; messages clear the line */
    f = tmpfile();
    dg_progress_init(&p, f, DG_PROGRESS_TTY, 50, 150, 10);
    p.columns = 120;
    t0 = p.t_start;
    for (int s = 51; s <= 150; s++)
        dg_progress_update_at(&p, s, 2.0, s == 100 ? NAN : 0.25, 2.5e4, t0 + 0.02 * (s - 50));
    dg_progress_message(&p, "checkpoint");
    dg_progress_finish(&p);
    out = capture(f);
    int redraws = 0;
    for (char *q = out; *q; q++) redraws += *q == '\r';
    assert_true(redraws >= 15 && redraws <= 25); /* 2 s of updates at most 10 per second, plus the last */
    assert_non_null(strstr(out, "\rstep 150/150 ["));
    assert_non_null(strstr(out, "] 100% | loss 2.0000 | acc 25.0% | 25k tok/s | took 2s\033[K"));
    assert_non_null(strstr(out, "| ETA "));
    assert_non_null(strstr(out, "\r\033[Kcheckpoint\n"));
    assert_null(strstr(out, "at most"));
    for (char *q = strtok(out, "\r\n"); q; q = strtok(NULL, "\r\n")) assert_true(strlen(q) < 120 + 4);
    free(out);

    /* a run that may stop early (an accuracy target): the time to the last step is shown as a bound */
    f = tmpfile();
    dg_progress_init(&p, f, DG_PROGRESS_TTY, 0, 100, 10);
    p.may_stop_early = true;
    t0 = p.t_start;
    dg_progress_update_at(&p, 10, 2.0, 0.5, 1e4, t0 + 1.0);
    dg_progress_finish(&p);
    out = capture(f);
    assert_non_null(strstr(out, "| at most 9s\033[K"));
    assert_null(strstr(out, "ETA"));
    free(out);
    f = tmpfile();
    dg_progress_init(&p, f, DG_PROGRESS_PLAIN, 0, 100, 10);
    p.may_stop_early = true;
    t0 = p.t_start;
    dg_progress_update_at(&p, 10, 2.0, 0.5, 1e4, t0 + 1.0);
    out = capture(f);
    assert_non_null(strstr(out, " elapsed 1s eta<= 9s\n"));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_adamw_matches_hand_computation, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_weight_decay_names, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_clip_grad_norm, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_lr_schedule, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_adamw_state_round_trip, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_metrics_csv_and_chart, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_metrics_gap_detected, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_stale_tmp_removed, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_progress, test_setup, test_teardown),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
