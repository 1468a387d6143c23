/* Training on the GPU (models/trainer.c with --device cuda) against the CPU: the same tiny model
 * from the same seed trained for a few steps on both gives the same loss curve within f32
 * rounding; evaluation agrees; a checkpoint written on the GPU loads on the CPU (bit for bit the
 * device's parameters) and resumes on either device; device memory (live tensors, the
 * cudaMallocAsync pool's used and reserved bytes) is flat over steps; greedy decoding on the GPU
 * matches the CPU.  Every test but the first skips where no GPU is present; the first runs only
 * there (it checks the refusal). */
#include "tests/model_infra_common.h" /* temporary directory, leak check around each test */

#include "models/checkpoint.h"
#include "models/generate.h"
#include "models/train_graph.h"
#include "models/trainer.h"

#include <math.h>

#ifdef DG_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
/* the device's default memory pool, the one kernels/cuda/runtime.cu allocates from with
 * cudaMallocAsync, and its byte counters */
#include <cuda_runtime_api.h>
#endif

/* A tiny MQAR run: 40 tokens with chunks of 16 (two full chunks and a partial one, so chunk
 * boundaries are crossed), 2 layers of one head of 32. */
static dg_train_config tiny_run(const char *out, dg_device dev) {
    dg_train_config tc = dg_train_default_config();
    tc.precision = DG_PRECISION_F32; /* the CPU parity tests; the bf16 tests set bf16 */
    tc.mqar.vocab_size = 32;
    tc.mqar.seq_len = 40;
    tc.mqar.num_kv_pairs = 6;
    tc.eval_examples = 64;
    tc.batch = 16;
    tc.steps = 100;
    tc.warmup = 4;
    tc.lr = 3e-3;
    tc.chunk_size = 16;
    tc.eval_every = 0;
    tc.save_every = 0;
    tc.device = dev;
    snprintf(tc.out_dir, sizeof tc.out_dir, "%s", out);
    return tc;
}

static dg_model_config tiny_model(void) {
    dg_model_config c = dg_model_default_config();
    c.vocab_size = 32;
    c.hidden_size = 32;
    c.num_heads = 1;
    c.head_dim = 32;
    c.intermediate_size = 64;
    return c;
}

static double rel_diff(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-30); }

/* ||a - b|| / ||b|| over every parameter of two models (a on any device, b on the host). */
static double params_rel_err(const dg_lm *a, const dg_lm *b) {
    double num = 0, den = 0;
    assert_int_equal(a->params.n, b->params.n);
    for (int i = 0; i < a->params.n; i++) {
        dg_scope_begin();
        dg_tensor *x = dg_to_device(a->params.t[i], DG_CPU);
        assert_non_null(x);
        const float *p = dg_data_ptr(x), *q = dg_data_ptr(b->params.t[i]);
        for (int64_t j = 0, n = dg_numel(x); j < n; j++) {
            num += ((double)p[j] - q[j]) * ((double)p[j] - q[j]);
            den += (double)q[j] * q[j];
        }
        dg_scope_end();
    }
    return sqrt(num / den);
}

/* without a GPU, --device cuda is refused with a message saying why */
static void test_cuda_refused_without_gpu(void **state) {
    if (dg_cuda_available()) dg_test_skip("checks the refusal without a GPU, and a GPU is present");
    dg_train_config tc = tiny_run(tmp_path("refused"), DG_CUDA);
    dg_model_config mc = tiny_model();
    assert_null(dg_trainer_open(&tc, &mc, NULL));
#ifdef DG_HAVE_CUDA
    assert_error_contains("train: --device cuda: no CUDA device was found");
#else
    assert_error_contains("train: --device cuda: this build has no CUDA backend");
#endif
}

/* The same run on both devices, step by step: the loss and the gradient norm of every step agree
 * within f32 rounding (cuBLAS and the CUDA kernels sum in other orders than OpenBLAS and the CPU
 * kernels; the parameters start identical, the host initialises both).  The limit, 1e-4
 * relative, is the f32 parity limit of the delta-rule family (tests/test_cuda_delta_parity.c);
 * AdamW's first steps move each element by about lr * sign(g), so a rounding difference stays a
 * rounding difference unless a gradient element is within rounding of zero. */
static void test_cuda_loss_curve_matches_cpu(void **state) {
    dg_test_require_cuda();
    const int K = 8;
    dg_train_config tcc = tiny_run(tmp_path("curve_cpu"), DG_CPU), tcg = tiny_run(tmp_path("curve_gpu"), DG_CUDA);
    dg_model_config mc = tiny_model();
    dg_trainer *c = dg_trainer_open(&tcc, &mc, NULL), *g = dg_trainer_open(&tcg, &mc, NULL);
    assert_non_null(c);
    if (!g) fail_msg("%s", dg_last_error());
    assert_int_equal(dg_lm_device(g->lm), DG_CUDA);
    assert_int_equal(g->opt->m[0]->device, DG_CUDA);
    assert_true(params_rel_err(g->lm, c->lm) == 0); /* the same initial parameters */
    double worst_loss = 0, worst_gn = 0;
    for (int s = 0; s < K; s++) {
        double lc, gc, lg, gg;
        assert_int_equal(dg_trainer_step(c, &lc, &gc), 0);
        if (dg_trainer_step(g, &lg, &gg)) fail_msg("GPU step %d: %s", s + 1, dg_last_error());
        printf("step %d: loss cpu %.9g gpu %.9g (rel %.2e), grad norm cpu %.9g gpu %.9g (rel %.2e)\n", s + 1, lc, lg,
               rel_diff(lg, lc), gc, gg, rel_diff(gg, gc));
        worst_loss = fmax(worst_loss, rel_diff(lg, lc));
        worst_gn = fmax(worst_gn, rel_diff(gg, gc));
    }
    double pe = params_rel_err(g->lm, c->lm);
    printf("after %d steps: worst loss rel diff %.2e, worst grad-norm rel diff %.2e, parameters rel err %.2e\n", K,
           worst_loss, worst_gn, pe);
    if (!(worst_loss <= 1e-4 && worst_gn <= 1e-4))
        fail_msg("GPU loss curve differs from the CPU's: loss %.2e, grad norm %.2e (limit 1e-4)", worst_loss, worst_gn);
    if (!(pe <= 1e-4)) fail_msg("parameters after %d steps differ by %.2e (relative error norm, limit 1e-4)", K, pe);
    /* evaluation on the device: the same loss; accuracy within one query of the host's */
    double elc, eac, elg, eag;
    assert_int_equal(dg_trainer_eval(c, 0, &elc, &eac), 0);
    if (dg_trainer_eval(g, 0, &elg, &eag)) fail_msg("GPU eval: %s", dg_last_error());
    printf("eval: loss cpu %.9g gpu %.9g, accuracy cpu %.6f gpu %.6f\n", elc, elg, eac, eag);
    int64_t queries = tcc.eval_examples * dg_mqar_num_queries(&tcc.mqar);
    assert_true(rel_diff(elg, elc) <= 1e-4);
    assert_true(fabs(eag - eac) <= 1.0 / (double)queries + 1e-12);
    dg_trainer_free(c);
    dg_trainer_free(g);
}

/* A checkpoint written on the GPU: the file holds the device's parameters bit for bit and loads on
 * the CPU; a run resumes from it on the GPU (and on the CPU) with the device's AdamW moments. */
static void test_cuda_checkpoint_loads_on_cpu(void **state) {
    dg_test_require_cuda();
    dg_train_config tc = tiny_run(tmp_path("ck"), DG_CUDA);
    tc.steps = 6;
    dg_model_config mc = tiny_model();
    dg_trainer *g = dg_trainer_open(&tc, &mc, NULL);
    if (!g) fail_msg("%s", dg_last_error());
    g->quiet = true;
    g->stop_at = 3;
    if (dg_trainer_run(g)) fail_msg("GPU run: %s", dg_last_error());
    assert_int_equal(g->step, 3);
    dg_ckpt_model m;
    assert_int_equal(dg_ckpt_load_model(tmp_path("ck"), &m), 0);
    assert_int_equal(dg_lm_device(m.lm), DG_CPU);
    assert_int_equal(m.step, 3);
    assert_true(params_rel_err(g->lm, m.lm) == 0); /* the file holds the device's values exactly */
    /* the CPU model computes what the GPU model does, within f32 rounding */
    dg_scope_begin();
    dg_tensor *in, *tg;
    assert_int_equal(dg_mqar_set_batch(g->heldout, 0, 4, &in, &tg), 4);
    dg_tensor *lg = dg_to_device(dg_lm_forward(g->lm, in, NULL), DG_CPU), *lc = dg_lm_forward(m.lm, in, NULL);
    assert_non_null(lg);
    assert_non_null(lc);
    double e = dg_test_rel_err(lg, lc);
    printf("logits of the GPU model vs the checkpoint loaded on the CPU: rel err %.2e\n", e);
    assert_true(e <= 1e-5);
    dg_scope_end();
    dg_ckpt_model_free(&m);

    /* resume on the GPU: the moments come back onto the device, equal to those of the run */
    dg_trainer *r = dg_trainer_open(&tc, &mc, tmp_path("ck"));
    if (!r) fail_msg("GPU resume: %s", dg_last_error());
    assert_int_equal(r->step, 3);
    assert_int_equal(r->opt->step, 3);
    for (int i = 0; i < r->opt->n; i++) {
        assert_int_equal(r->opt->m[i]->device, DG_CUDA);
        dg_scope_begin();
        dg_tensor *a = dg_to_device(r->opt->v[i], DG_CPU), *b = dg_to_device(g->opt->v[i], DG_CPU);
        assert_memory_equal(dg_data_ptr(a), dg_data_ptr(b), (size_t)dg_numel(a) * sizeof(float));
        dg_scope_end();
    }
    r->quiet = true;
    if (dg_trainer_run(r)) fail_msg("GPU resumed run: %s", dg_last_error());
    assert_int_equal(r->step, 6);
    /* the same 3 steps straight on from the first trainer: resumed == uninterrupted within
     * rounding (bit for bit where the device's kernels are deterministic) */
    g->stop_at = 0;
    snprintf(g->tc.out_dir, sizeof g->tc.out_dir, "%s", tmp_path("ck_straight"));
    if (dg_trainer_run(g)) fail_msg("GPU run: %s", dg_last_error());
    dg_ckpt_model a;
    assert_int_equal(dg_ckpt_load_model(tmp_path("ck"), &a), 0);
    double re = params_rel_err(g->lm, a.lm);
    printf("GPU: 3 steps + resume + 3 steps vs 6 straight: parameters rel err %.2e%s\n", re,
           re == 0 ? " (bit-identical)" : "");
    assert_true(re <= 1e-6);
    dg_ckpt_model_free(&a);
    /* and on the CPU from the GPU's checkpoint */
    dg_train_config tcc = tc;
    tcc.device = DG_CPU;
    dg_trainer *h = dg_trainer_open(&tcc, &mc, tmp_path("ck"));
    if (!h) fail_msg("CPU resume of a GPU checkpoint: %s", dg_last_error());
    assert_int_equal(h->step, 6);
    assert_int_equal(dg_lm_device(h->lm), DG_CPU);
    assert_true(params_rel_err(r->lm, h->lm) == 0);
    dg_trainer_free(h);
    dg_trainer_free(r);
    dg_trainer_free(g);
}

/* Every step allocates and frees the same on the device: over 200 steps (and evaluations) live
 * tensors and bytes, and the pool's used bytes, are equal after every step from the 4th on; the
 * pool reserves nothing more.  In bf16 mixed precision and with the step as a CUDA graph, the
 * defaults on cuda (the graph's memory is its own, allocated once at the capture). */
static void test_cuda_memory_flat(void **state) {
    dg_test_require_cuda();
#ifdef DG_HAVE_CUDA
    dg_train_config tc = tiny_run(tmp_path("flat"), DG_CUDA);
    tc.precision = DG_PRECISION_AUTO;
    dg_model_config mc = tiny_model();
    dg_trainer *t = dg_trainer_open(&tc, &mc, NULL);
    if (!t) fail_msg("%s", dg_last_error());
    cudaMemPool_t pool;
    assert_int_equal(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
    uint64_t used0 = 0, res0 = 0;
    size_t bytes = 0, tensors = 0;
    for (int s = 0; s < 200; s++) { /* ~1 s on an H100 */
        assert_int_equal(dg_trainer_step(t, NULL, NULL), 0);
        if (s % 25 == 3) { /* evaluations in between, as the loop does */
            double el, ea;
            assert_int_equal(dg_trainer_eval(t, 16, &el, &ea), 0);
        }
        assert_int_equal(dg_cuda_synchronize(), 0);
        uint64_t used = 0, res = 0;
        assert_int_equal(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used), cudaSuccess);
        assert_int_equal(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &res), cudaSuccess);
        if (s == 3) {
            bytes = dg_live_bytes(DG_CUDA);
            tensors = dg_live_tensors();
            used0 = used;
            res0 = res;
        } else if (s > 3) {
            assert_int_equal(dg_live_bytes(DG_CUDA), bytes);
            assert_int_equal(dg_live_tensors(), tensors);
            if (used != used0 || res > res0)
                fail_msg("step %d: pool used %llu (was %llu), reserved %llu (was %llu)", s + 1,
                         (unsigned long long)used, (unsigned long long)used0, (unsigned long long)res,
                         (unsigned long long)res0);
        }
    }
    printf("flat: %zu live device bytes, pool used %llu, reserved %llu bytes\n", dg_live_bytes(DG_CUDA),
           (unsigned long long)used0, (unsigned long long)res0);
    dg_trainer_free(t);
#endif
}

/* The gradient of every parameter (the loss of one batch, a 2-layer model in bf16 mixed precision
 * against the same model in f32 on the GPU, the same parameters and batch), compared by the
 * relative error norm over all of them: bf16 keeps 8 significant bits (unit roundoff u = 2^-9);
 * the forward and backward round each activation and gradient once per op, a dozen ops deep per
 * layer, and the errors add like a random walk, so the limit is 16 u = 3.1e-2 on the whole
 * gradient.  The loss, f32 in both, agrees within the same bound. */
static void test_cuda_bf16_gradients_follow_f32(void **state) {
    dg_test_require_cuda();
    dg_model_config mc = tiny_model();
    mc.hidden_size = 64;
    mc.head_dim = 64;
    mc.intermediate_size = 128;
    dg_lm *lm = dg_lm_new(&mc, 11, DG_F32);
    assert_non_null(lm);
    if (dg_lm_to_device(lm, DG_CUDA)) fail_msg("%s", dg_last_error());
    dg_mqar_config q = tiny_run("unused", DG_CUDA).mqar;
    dg_mqar_set *set = dg_mqar_set_new(&q, 5, 32);
    assert_non_null(set);
    const int n = lm->params.n;
    dg_tensor **g32 = calloc((size_t)n, sizeof *g32);
    double loss[2];
    for (int pass = 0; pass < 2; pass++) {
        assert_int_equal(dg_lm_set_precision(lm, pass == 0 ? DG_F32 : DG_BF16), 0);
        dg_scope_begin();
        dg_tensor *in, *tg;
        assert_int_equal(dg_mqar_set_batch(set, 0, 32, &in, &tg), 32);
        dg_tensor *l = dg_lm_loss(lm, in, tg, DG_MQAR_IGNORE, NULL, NULL);
        if (!l) fail_msg("%s", dg_last_error());
        assert_int_equal(l->dtype, DG_F32);
        loss[pass] = dg_item(l);
        if (dg_backward(l, NULL)) fail_msg("%s", dg_last_error());
        dg_scope_end();
        for (int i = 0; i < n; i++) {
            dg_tensor *g = lm->params.t[i]->grad;
            assert_non_null(g);
            assert_int_equal(g->dtype, DG_F32);
            if (pass == 0) {
                g32[i] = dg_keep(dg_to_device(g, DG_CPU));
                dg_fill_(g, 0.0);
            }
        }
    }
    double num = 0, den = 0, worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < n; i++) {
        dg_scope_begin();
        dg_tensor *b = dg_to_device(lm->params.t[i]->grad, DG_CPU);
        const float *x = dg_data_ptr(b), *y = dg_data_ptr(g32[i]);
        double pn = 0, pd = 0;
        for (int64_t j = 0, m = dg_numel(b); j < m; j++) {
            pn += ((double)x[j] - y[j]) * ((double)x[j] - y[j]);
            pd += (double)y[j] * y[j];
        }
        num += pn;
        den += pd;
        if (pd > 0 && sqrt(pn / pd) > worst) {
            worst = sqrt(pn / pd);
            worst_name = lm->params.t[i]->name;
        }
        dg_scope_end();
        dg_release(g32[i]);
    }
    free(g32);
    double e = sqrt(num / den), el = rel_diff(loss[1], loss[0]);
    printf("bf16 vs f32: loss %.7f vs %.7f (rel %.2e); gradients rel err %.2e (worst parameter %s: %.2e)\n", loss[1],
           loss[0], el, e, worst_name, worst);
    if (!(e <= 3.1e-2 && el <= 3.1e-2))
        fail_msg("bf16 gradients differ from f32 by %.2e, loss by %.2e (limit 16 u = 3.1e-2)", e, el);
    dg_mqar_set_free(set);
    dg_lm_free(lm);
}

/* Every parameter of a and b (on any devices) equal bit for bit. */
static bool params_identical(const dg_lm *a, const dg_lm *b) {
    assert_int_equal(a->params.n, b->params.n);
    bool same = true;
    for (int i = 0; i < a->params.n && same; i++) {
        dg_scope_begin();
        dg_tensor *x = dg_to_device(a->params.t[i], DG_CPU), *y = dg_to_device(b->params.t[i], DG_CPU);
        assert_true(x && y);
        same = !memcmp(dg_data_ptr(x), dg_data_ptr(y), (size_t)dg_numel(x) * dg_dtype_size(x->dtype));
        dg_scope_end();
    }
    return same;
}

/* The step as a CUDA graph (models/train_graph.h) replays the step it captured exactly: the same
 * run with the graph and with --no-graph (the same kernels on the same buffers, launched one by
 * one) gives the same loss and gradient norm at every step and the same parameters, bit for bit:
 * step 1 eager, step 2 captured and launched, steps 3-8 replays; bf16 mixed precision, MQAR with
 * its ignored positions.  The graph's steps are queued with nothing read back and their results
 * taken at once from the device's log ring (times in order); the eager run reads each step's. */
static void test_cuda_graph_replays_exactly(void **state) {
    dg_test_require_cuda();
    dg_train_config tg = tiny_run(tmp_path("graph"), DG_CUDA), te = tiny_run(tmp_path("eager"), DG_CUDA);
    tg.precision = te.precision = DG_PRECISION_BF16;
    dg_model_config mc = tiny_model();
    dg_trainer *g = dg_trainer_open(&tg, &mc, NULL), *e = dg_trainer_open(&te, &mc, NULL);
    if (!g || !e) fail_msg("%s", dg_last_error());
    e->graph_off = true;
    enum { STEPS = 8 };
    for (int s = 0; s < STEPS; s++) {
        if (dg_trainer_step_queued(g)) fail_msg("step %d: %s", s + 1, dg_last_error());
        assert_int_equal(dg_train_graph_captured(g), s >= 1);
    }
    /* a checkpoint waits until the queued steps' results are taken */
    assert_int_equal(dg_trainer_save(g), -1);
    dg_clear_error();
    dg_step_result r[DG_STEP_RESULTS];
    assert_int_equal(dg_trainer_results(g, r), STEPS);
    for (int s = 0; s < STEPS; s++) {
        double le, ge;
        if (dg_trainer_step(e, &le, &ge)) fail_msg("step %d: %s", s + 1, dg_last_error());
        printf("step %d: loss graph %.9g eager %.9g, grad norm graph %.9g eager %.9g\n", s + 1, r[s].loss, le,
               r[s].grad_norm, ge);
        assert_int_equal(r[s].step, s + 1);
        if (!(r[s].loss == le && r[s].grad_norm == ge))
            fail_msg("step %d: the graph's loss or norm differs from the eager step's", s + 1);
        assert_true(isfinite(le) && isfinite(ge));
        if (s > 0 && !(r[s].time_s > r[s - 1].time_s))
            fail_msg("step %d finished at %.6f s, not after step %d (%.6f s)", s + 1, r[s].time_s, s, r[s - 1].time_s);
    }
    assert_false(dg_train_graph_captured(e));
    assert_true(params_identical(g->lm, e->lm));
    assert_int_equal(dg_trainer_results(g, r), 0);
    dg_trainer_free(g);
    dg_trainer_free(e);
}

/* bf16 mixed precision resumes exactly: 3 steps + checkpoint + resume + 3 steps gives the
 * parameters of 6 straight steps (the master weights and moments are f32 in the checkpoint; the
 * device kernels are deterministic). */
static void test_cuda_bf16_resume_exact(void **state) {
    dg_test_require_cuda();
    dg_train_config tc = tiny_run(tmp_path("bf"), DG_CUDA);
    tc.precision = DG_PRECISION_BF16;
    tc.steps = 6;
    dg_model_config mc = tiny_model();
    dg_trainer *g = dg_trainer_open(&tc, &mc, NULL);
    if (!g) fail_msg("%s", dg_last_error());
    assert_int_equal(dg_lm_precision(g->lm), DG_BF16);
    g->quiet = true;
    g->stop_at = 3;
    if (dg_trainer_run(g)) fail_msg("GPU run: %s", dg_last_error());
    dg_trainer *r = dg_trainer_open(&tc, &mc, tmp_path("bf"));
    if (!r) fail_msg("GPU resume: %s", dg_last_error());
    assert_int_equal(dg_lm_precision(r->lm), DG_BF16);
    r->quiet = true;
    if (dg_trainer_run(r)) fail_msg("GPU resumed run: %s", dg_last_error());
    g->stop_at = 0;
    snprintf(g->tc.out_dir, sizeof g->tc.out_dir, "%s", tmp_path("bf_straight"));
    if (dg_trainer_run(g)) fail_msg("GPU run: %s", dg_last_error());
    dg_ckpt_model a; /* the resumed run's parameters, as its checkpoint holds them (on the host) */
    assert_int_equal(dg_ckpt_load_model(tmp_path("bf"), &a), 0);
    assert_int_equal(a.step, 6);
    double re = params_rel_err(g->lm, a.lm);
    printf("bf16: 3 steps + resume + 3 steps vs 6 straight: parameters rel err %.2e\n", re);
    assert_true(re == 0);
    dg_ckpt_model_free(&a);
    dg_trainer_free(r);
    dg_trainer_free(g);
}

/* bf16 is refused on the CPU with the reason */
static void test_bf16_refused_on_cpu(void **state) {
    dg_train_config tc = tiny_run(tmp_path("bfcpu"), DG_CPU);
    tc.precision = DG_PRECISION_BF16;
    dg_model_config mc = tiny_model();
    assert_null(dg_trainer_open(&tc, &mc, NULL));
    assert_error_contains("bf16 mixed precision needs f32 parameters on cuda");
}

/* Greedy decoding with the carried state on the GPU gives the CPU's tokens and logits. */
static void test_cuda_generate_matches_cpu(void **state) {
    dg_test_require_cuda();
    dg_model_config mc = tiny_model();
    dg_lm *c = dg_lm_new(&mc, 7, DG_F32), *g = dg_lm_new(&mc, 7, DG_F32);
    assert_non_null(c);
    assert_non_null(g);
    if (dg_lm_to_device(g, DG_CUDA)) fail_msg("%s", dg_last_error());
    enum { NP = 21, NEW = 12 };
    int64_t prompt[NP], tok_c[NEW], tok_g[NEW];
    for (int i = 0; i < NP; i++) prompt[i] = (i * 7 + 3) % 32;
    double *lc = malloc(NEW * 32 * sizeof *lc), *lg = malloc(NEW * 32 * sizeof *lg);
    dg_sample_opts so = {.temperature = 0, .use_cache = true};
    dg_rng r1 = dg_rng_new(1), r2 = dg_rng_new(1);
    assert_int_equal(dg_generate(c, prompt, NP, NEW, &so, &r1, tok_c, lc, NULL, NULL), NEW);
    if (dg_generate(g, prompt, NP, NEW, &so, &r2, tok_g, lg, NULL, NULL) != NEW) fail_msg("%s", dg_last_error());
    double num = 0, den = 0;
    for (int i = 0; i < NEW * 32; i++) {
        num += (lg[i] - lc[i]) * (lg[i] - lc[i]);
        den += lc[i] * lc[i];
    }
    printf("generate: logits rel err %.2e\n", sqrt(num / den));
    assert_true(sqrt(num / den) <= 1e-5);
    assert_memory_equal(tok_c, tok_g, sizeof tok_c);
    free(lc);
    free(lg);
    dg_lm_free(c);
    dg_lm_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_cuda_refused_without_gpu, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_cuda_loss_curve_matches_cpu, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_cuda_checkpoint_loads_on_cpu, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_cuda_memory_flat, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_cuda_generate_matches_cpu, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_cuda_bf16_gradients_follow_f32, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_cuda_bf16_resume_exact, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_cuda_graph_replays_exactly, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_bf16_refused_on_cpu, test_setup, test_teardown),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
