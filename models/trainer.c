/* Training runs: state, step, evaluation, checkpoints, the loop (models/trainer.h). */
#include "models/trainer.h"

#include "core/internal.h"
#include "models/atomic_file.h"
#include "models/chart.h"
#include "models/checkpoint.h"
#include "models/data_parallel.h"
#include "models/infra_common.h"
#include "models/memory_estimate.h"
#include "models/metrics.h"
#include "models/safetensors.h"
#include "models/train_graph.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define DATA_SEED_SALT 0x7472616964617461ull /* "traidata": the data stream's seed differs from init's */

static uint64_t data_seed(uint64_t seed) { return dgm_mix64(seed ^ DATA_SEED_SALT); }

/* ---- opening ----------------------------------------------------------------------------------- */

static int parse_u64(const dg_st_file *f, const char *key, uint64_t *out, const char *path) {
    const char *s = dg_st_meta(f, key);
    char *end = NULL;
    errno = 0;
    unsigned long long v = s ? strtoull(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || s[0] == '-') {
        dg_error("checkpoint: '%s': metadata %s is %s%s%s, not an unsigned integer", path, key, s ? "\"" : "",
                 s ? s : "missing", s ? "\"" : "");
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_f64(const dg_st_file *f, const char *key, double *out, const char *path) {
    const char *s = dg_st_meta(f, key);
    char *end = NULL;
    double v = s ? strtod(s, &end) : NAN;
    if (!s || !*s || *end) {
        dg_error("checkpoint: '%s': metadata %s is %s, not a number", path, key, s ? s : "missing");
        return -1;
    }
    *out = v;
    return 0;
}

/* Optimiser state, step, data stream and timers of a checkpoint into t (whose model is loaded). */
static int load_run_state(dg_trainer *t, const char *dir, int64_t step) {
    char path[4096];
    dg_ckpt_optimizer_path(dir, step, path, sizeof path);
    dg_st_file *f = dg_st_read(path);
    if (!f) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s", dg_last_error());
        dg_error_force("checkpoint: cannot resume from '%s' at step %lld: %s", dir, (long long)step, msg);
        return -1;
    }
    uint64_t fstep, seed, counter, skipped;
    double elapsed, best;
    int rc = -1;
    if (parse_u64(f, "deltagrad.train_step", &fstep, path) || parse_u64(f, "deltagrad.rng_seed", &seed, path) ||
        parse_u64(f, "deltagrad.rng_counter", &counter, path) || parse_u64(f, "deltagrad.skipped", &skipped, path) ||
        parse_f64(f, "deltagrad.elapsed_s", &elapsed, path) || parse_f64(f, "deltagrad.best_acc", &best, path))
        goto out;
    if ((int64_t)fstep != step) {
        dg_error("checkpoint: '%s' is the optimiser state of step %llu but the model is at step %lld", path,
                 (unsigned long long)fstep, (long long)step);
        goto out;
    }
    if (dg_adamw_load(t->opt, path)) goto out;
    t->step = step;
    t->skipped = (int64_t)skipped;
    t->data_rng.seed = seed;
    t->data_rng.counter = counter;
    t->elapsed_before = elapsed;
    t->best_acc = best;
    rc = 0;
out:
    dg_st_free(f);
    return rc;
}

/* The held-out MQAR set or the text file of t->tc. */
static int load_task_data(dg_trainer *t) {
    const dg_train_config *tc = &t->tc;
    if (tc->task == DG_TASK_MQAR)
        return (t->heldout = dg_mqar_set_new(&tc->mqar, DG_MQAR_HELDOUT_SEED, tc->eval_examples)) ? 0 : -1;
    if (!(t->text = dg_text_load(tc->data, tc->val_fraction))) return -1;
    int64_t ntr, nva;
    dg_text_split_bytes(t->text, DG_SPLIT_TRAIN, &ntr);
    dg_text_split_bytes(t->text, DG_SPLIT_VAL, &nva);
    if (ntr < tc->seq_len + 1 || nva < tc->seq_len + 1) {
        dg_error("train: '%s' is too small for seq_len %lld: %lld training and %lld validation bytes (each needs at "
                 "least %lld)",
                 tc->data, (long long)tc->seq_len, (long long)ntr, (long long)nva, (long long)tc->seq_len + 1);
        return -1;
    }
    return 0;
}

/* The run's device is usable (the GPU: a CUDA build and a device present). */
static int check_device(dg_device dev, const char *who) {
    if (dev != DG_CUDA || dg_cuda_available()) return 0;
#ifdef DG_HAVE_CUDA
    dg_error("%s: --device cuda: no CUDA device was found (this build has the CUDA backend); --device cpu runs "
             "on the host",
             who);
#else
    dg_error("%s: --device cuda: this build has no CUDA backend (built without nvcc, or with cuda=0); --device "
             "cpu runs on the host",
             who);
#endif
    return -1;
}

/* A run on the host that cannot fit in the memory left is refused before it allocates anything
 * (the machine would otherwise swap or be out of memory, with no message).  On a GPU, a model whose
 * training state alone (parameters, gradients, AdamW's moments) does not fit in the free memory is
 * refused the same way, and so is a step whose activations' floor (every layer's input) does not
 * fit beside it: a batch of a billion sequences is refused at once instead of making its data on
 * the host first.  Activations past that floor are the device allocator's out-of-memory error at
 * the first step, before anything is written. */
static int check_memory(const dg_model_config *mc, const dg_train_config *tc) {
    if (tc->device == DG_CUDA) {
        const bool mixed = dg_train_precision(tc) == DG_BF16;
        double need = dg_train_state_bytes(mc, mixed), avail = dg_cuda_free_bytes();
        if (avail < 0) return 0;
        char n_s[32], a_s[32], f_s[32];
        if (need > avail) {
            dg_error("train: the model's %.4g M parameters need about %s of GPU memory for themselves, their "
                     "gradients and AdamW's two moments (%d bytes each), and the GPU has %s free: train a smaller "
                     "model (on several GPUs each holds all of it)",
                     need / (mixed ? 18 : 16) / 1e6, dg_format_bytes(need, n_s, sizeof n_s), mixed ? 18 : 16,
                     dg_format_bytes(avail, a_s, sizeof a_s));
            return -1;
        }
        /* data-parallel: a GPU runs its slice of the global batch */
        const double floor = dg_train_activation_floor(mc, tc, mixed) / dg_dp_world();
        if (need + floor <= avail) return 0;
        dg_error("train: a step of %lld sequences of %lld tokens keeps at least %s of activations on the GPU (the "
                 "input of each of %lld layers of width %lld) beside the training state's %s, and the GPU has %s "
                 "free; lower --batch or --seq-len",
                 (long long)(tc->batch / dg_dp_world()), (long long)dg_train_seq_len(tc),
                 dg_format_bytes(floor, f_s, sizeof f_s), (long long)mc->num_hidden_layers, (long long)mc->hidden_size,
                 dg_format_bytes(need, n_s, sizeof n_s), dg_format_bytes(avail, a_s, sizeof a_s));
        return -1;
    }
    if (tc->device != DG_CPU) return 0;
    double need = dg_train_memory_estimate(mc, tc), avail = dg_memory_available();
    if (avail < 0 || need <= avail) return 0;
    char n_s[32], a_s[32];
    dg_error("train: this run needs about %s of memory and %s is available: %lld sequences of %lld tokens a step "
             "through %lld layers of width %lld; lower --batch or --seq-len",
             dg_format_bytes(need, n_s, sizeof n_s), dg_format_bytes(avail, a_s, sizeof a_s), (long long)tc->batch,
             (long long)dg_train_seq_len(tc), (long long)mc->num_hidden_layers, (long long)mc->hidden_size);
    return -1;
}

dg_trainer *dg_trainer_open_eval(const dg_train_config *tc, const char *src) {
    if (dg_train_config_validate(tc)) return NULL;
    if (check_device(tc->device, "eval")) return NULL;
    dg_trainer *t = calloc(1, sizeof *t);
    if (!t) {
        dg_error("eval: out of memory");
        return NULL;
    }
    t->tc = *tc;
    t->best_acc = NAN;
    if (tc->threads > 0)
        omp_set_num_threads(tc->threads); /* OpenMP's threads run the BLAS products too (kernels/cpu/gemm.c) */
    dg_ckpt_model m;
    if (dg_ckpt_load_model(src, &m)) goto fail;
    t->lm = m.lm;
    t->step = m.step;
    m.lm = NULL;
    dg_ckpt_model_free(&m);
    if (tc->device != DG_CPU && dg_lm_to_device(t->lm, tc->device)) goto fail;
    if (dg_lm_set_precision(t->lm, dg_train_precision(tc))) goto fail;
    t->lm->mixer_opts.algorithm = tc->algorithm;
    t->lm->mixer_opts.chunk_size = tc->chunk_size;
    if (tc->task == DG_TASK_MQAR && t->lm->cfg.vocab_size < tc->mqar.vocab_size) {
        dg_error("eval: the model's vocab_size %lld is smaller than the MQAR vocabulary %lld",
                 (long long)t->lm->cfg.vocab_size, (long long)tc->mqar.vocab_size);
        goto fail;
    }
    if (tc->task == DG_TASK_TEXT && t->lm->cfg.vocab_size < 256) {
        dg_error("eval: byte-level text needs vocab_size >= 256 (the model has %lld)",
                 (long long)t->lm->cfg.vocab_size);
        goto fail;
    }
    if (load_task_data(t)) goto fail;
    return t;
fail:
    dg_trainer_free(t);
    return NULL;
}

dg_trainer *dg_trainer_open(const dg_train_config *tc, const dg_model_config *mc_in, const char *resume_dir) {
    if (dg_train_config_validate(tc)) return NULL;
    if (check_device(tc->device, "train")) return NULL;
    dg_model_config mc;
    int64_t ck_step = -1;
    char *mpath = NULL; /* the checkpoint's model file, when resuming */
    dg_trainer *t = NULL;
    if (resume_dir) {
        if (dg_ckpt_read_meta(resume_dir, &mc, NULL, &ck_step, &mpath)) return NULL;
        char why[160];
        if (mc_in && !dg_model_config_equal(mc_in, &mc, why, sizeof why)) {
            dg_error("train: cannot resume from '%s': its model differs from the one asked for (%s, checkpoint "
                     "second)",
                     resume_dir, why);
            goto fail;
        }
        if (ck_step < 0) {
            dg_error("train: cannot resume from '%s': the model file has no step (not written by a training run)",
                     resume_dir);
            goto fail;
        }
    } else {
        if (!mc_in) {
            dg_error("train: no model config");
            goto fail;
        }
        mc = *mc_in;
    }
    if (dg_model_config_validate(&mc)) goto fail;
    if (tc->task == DG_TASK_MQAR && mc.vocab_size < tc->mqar.vocab_size) {
        dg_error("train: the model's vocab_size %lld is smaller than the MQAR vocabulary %lld",
                 (long long)mc.vocab_size, (long long)tc->mqar.vocab_size);
        goto fail;
    }
    if (tc->task == DG_TASK_TEXT && mc.vocab_size < 256) {
        dg_error("train: byte-level text needs vocab_size >= 256 (the model has %lld)", (long long)mc.vocab_size);
        goto fail;
    }
    if (check_memory(&mc, tc)) goto fail;
    if (tc->threads > 0)
        omp_set_num_threads(tc->threads); /* OpenMP's threads run the BLAS products too (kernels/cpu/gemm.c) */
    t = calloc(1, sizeof *t);
    if (!t) {
        dg_error("train: out of memory");
        goto fail;
    }
    t->tc = *tc;
    t->best_acc = NAN;
    if (!(t->train_json = dg_train_config_to_json(tc))) goto fail;
    t->lm = dg_lm_new(&mc, tc->seed, DG_F32);
    if (!t->lm) goto fail;
    t->lm->mixer_opts.algorithm = tc->algorithm;
    t->lm->mixer_opts.chunk_size = tc->chunk_size;
    t->lm->mixer_opts.backward = tc->backward[0] ? t->tc.backward : NULL;
    /* initialised on the host (the same parameters for a seed on every device), then moved; the
     * optimiser's moments are made on the parameters' device */
    if (tc->device != DG_CPU && dg_lm_to_device(t->lm, tc->device)) goto fail;
    if (dg_lm_set_precision(t->lm, dg_train_precision(tc))) goto fail;
    dg_adamw_config ac = {
        .beta1 = tc->beta1, .beta2 = tc->beta2, .eps = tc->adam_eps, .weight_decay = tc->weight_decay};
    if (!(t->opt = dg_adamw_new(t->lm->params.n, t->lm->params.t, &ac))) goto fail;
    if (!(t->norm = dg_keep(dg_empty_on(1, (int64_t[]){1}, DG_F64, tc->device)))) goto fail;
    t->data_rng = dg_rng_new(data_seed(tc->seed));
    t->sched = (dg_lr_schedule){
        .peak_lr = tc->lr, .warmup_steps = tc->warmup, .total_steps = tc->steps, .min_lr_ratio = tc->min_lr_ratio};
    if (load_task_data(t)) goto fail;
    if (resume_dir) {
        if (dg_ckpt_load_params(mpath, t->lm) || load_run_state(t, resume_dir, ck_step)) goto fail;
        t->resumed = true;
    }
    free(mpath);
    const char *prof = getenv("DG_PROFILE");
    t->profile_ops = prof && strcmp(prof, "ops") == 0;
    t->profile = prof && prof[0] && strcmp(prof, "0") != 0 && !t->profile_ops;
    return t;
fail:
    free(mpath);
    dg_trainer_free(t);
    return NULL;
}

void dg_trainer_free(dg_trainer *t) {
    if (!t) return;
    if (t->profile_ops) dg_profile_end();
    dg_train_graph_free(t);
    dg_adamw_free(t->opt);
    if (t->norm) dg_release(t->norm);
    dg_lm_free(t->lm);
    dg_mqar_set_free(t->heldout);
    dg_text_free(t->text);
    free(t->train_json);
    free(t);
}

/* ---- one step ---------------------------------------------------------------------------------- */

/* A training batch: inputs and targets i64 [B,T]. */
static int global_batch(dg_trainer *t, dg_tensor **in, dg_tensor **tg) {
    const dg_train_config *tc = &t->tc;
    if (tc->task == DG_TASK_MQAR) return dg_mqar_batch(&tc->mqar, &t->data_rng, tc->batch, in, tg);
    dg_tensor *w = dg_text_batch(t->text, DG_SPLIT_TRAIN, &t->data_rng, tc->batch, tc->seq_len); /* [B,T+1] */
    *in = dg_slice(w, 1, 0, tc->seq_len);
    *tg = dg_slice(w, 1, 1, tc->seq_len + 1);
    return *in && *tg ? 0 : -1;
}

/* This process's batch: the whole one, or on one GPU of several its rows of the same global batch
 * (every rank draws the global batch, so the data stream is that of one process). */
static int next_batch(dg_trainer *t, dg_tensor **in, dg_tensor **tg) {
    return global_batch(t, in, tg) || dg_dp_take_slice(in, tg) ? -1 : 0;
}

/* A step whose loss lv or norm gn is not finite was skipped: the decision the fused step made on
 * the device (several GPUs decide on their common norm alone). */
static void count_skipped(dg_trainer *t, double lv, double gn, bool dp) {
    if (!(isfinite(gn) && (dp || isfinite(lv)))) t->skipped++;
}

/* Steps queued whose results have not been taken (dg_trainer_results). */
static int results_waiting(const dg_trainer *t) { return t->n_device + t->n_host; }

/* A step through the CUDA graph (train_graph.h), queued: the batch drawn here, the rest there. */
static int graph_step(dg_trainer *t) {
    dg_scope_begin();
    dg_tensor *in, *tg;
    int rc = next_batch(t, &in, &tg) || dg_train_graph_step(t, in, tg, dg_lr_at(&t->sched, t->step));
    dg_scope_end();
    if (rc) return -1;
    t->step++;
    t->n_device++;
    return 0;
}

/* A step run op by op (the CPU, several GPUs, profiling), its loss and norm read back at its end. */
static int eager_step(dg_trainer *t, double *loss_out, double *gnorm_out) {
    dg_lm *lm = t->lm;
    int rc = -1;
    double t0 = t->profile ? dg_progress_now() : 0, t1 = 0, t2 = 0, t3 = 0;
    if (t->profile_ops && t->op_warmup++ == 2 && dg_profile_begin(dg_lm_device(lm))) return -1;
    dg_scope_begin();
    dg_tensor *in, *tg;
    dg_profile_region_begin("batch");
    const int brc = next_batch(t, &in, &tg);
    dg_profile_region_end();
    if (brc) goto out;
    if (t->profile) t1 = dg_progress_now();
    /* several GPUs: the flat gradients once their order is known, and this rank's stop request */
    if (dg_dp_step_prepare()) goto out;
    dg_tensor *loss = dg_lm_loss(lm, in, tg, DG_MQAR_IGNORE, NULL, NULL);
    if (!loss) goto out;
#ifdef DG_HAVE_CUDA
    /* profiling a device run: wait for the queued forward so that its time is its own */
    if (t->profile && t->tc.device == DG_CUDA && dg_cuda_synchronize()) goto out;
#endif
    if (t->profile) t2 = dg_progress_now();
    /* several GPUs: the gradients and the loss become the means over the ranks, each bucket of
     * gradients all-reduced as soon as its gradients are final, overlapping the rest of the
     * backward (data_parallel.h) */
    const bool dp = dg_dp_active();
    double lv = NAN;
    if (dg_dp_step_begin(lm->params.n, lm->params.t, loss) ||
        dg_backward_hooked(loss, NULL, dp ? dg_dp_leaf_ready : NULL, NULL))
        goto out;
    if (dp) {
        dg_profile_region_begin("all-reduce");
        const int arc = dg_dp_step_end();
        dg_profile_region_end();
        if (arc) goto out;
    }
#ifdef DG_HAVE_CUDA
    /* profiling a device run: wait for the queued backward so that its time is its own */
    if (t->profile && t->tc.device == DG_CUDA && dg_cuda_synchronize()) goto out;
#endif
    if (t->profile) t3 = dg_progress_now();
    /* the gradient norm, the clip and AdamW in one fused step on the parameters' device: on the GPU
     * it is queued behind the backward and decides there whether the step is skipped (a
     * non-finite norm or loss: no update, the step still counts), so nothing is read back before
     * the whole step is queued */
    /* the ranks decide on their common (averaged) gradients alone, so that they decide alike */
    dg_adamw_fused_args fa = {
        .lr = dg_lr_at(&t->sched, t->step), .max_norm = t->tc.clip, .loss = dp ? NULL : loss, .norm_out = t->norm};
    dg_profile_region_begin("clip + adamw");
    const int orc = dg_adamw_step_fused(t->opt, &fa);
    dg_profile_region_end();
    if (orc) goto out;
    dg_adamw_zero_grad(t->opt);
    /* the step's first read-back: the loss and the norm, to log them (several GPUs: after a wait
     * with a limit, since a rank that died leaves the collectives unfinished) */
    if (!dp) lv = dg_item(loss);
    else if (dg_dp_step_finish(&lv)) goto out;
    *loss_out = lv;
    *gnorm_out = dg_item(t->norm);
    count_skipped(t, lv, *gnorm_out, dp);
    t->step++;
    rc = 0;
out:
    dg_scope_end();
    if (rc == 0 && dg_profile_on()) {
        if (dg_profile_flush()) return -1;
        t->op_steps++;
    }
    if (t->profile && rc == 0) {
        double t4 = dg_progress_now();
        t->t_data += t1 - t0;
        t->t_fwd += t2 - t1;
        t->t_bwd += t3 - t2;
        t->t_opt += t4 - t3;
        t->profiled_steps++;
    }
    return rc;
}

int dg_trainer_step_queued(dg_trainer *t) {
    if (results_waiting(t) >= DG_STEP_RESULTS) {
        dg_error("train: the results of %d steps are waiting; take them (dg_trainer_results) before queueing more",
                 results_waiting(t));
        return -1;
    }
    if (dg_train_graph_usable(t)) return graph_step(t);
    double lv, gn;
    if (eager_step(t, &lv, &gn)) return -1;
    t->host_results[t->n_host++] =
        (dg_step_result){.step = t->step, .loss = lv, .grad_norm = gn, .time_s = dg_progress_now()};
    return 0;
}

int dg_trainer_results(dg_trainer *t, dg_step_result *out) {
    /* a run queues on one path only (dg_train_graph_usable does not change), so the device's
     * results are the last n_device steps */
    const int nd = t->n_device, nh = t->n_host;
    if (nd > 0 && dg_train_graph_read(t, nd, out)) return -1;
    for (int i = 0; i < nd; i++) {
        out[i].step = t->step - nd + 1 + i;
        count_skipped(t, out[i].loss, out[i].grad_norm, dg_dp_active());
    }
    memcpy(out + nd, t->host_results, (size_t)nh * sizeof *out);
    t->n_device = t->n_host = 0;
    return nd + nh;
}

int dg_trainer_step(dg_trainer *t, double *loss_out, double *gnorm_out) {
    if (results_waiting(t) > 0) {
        dg_error("train: the results of %d queued steps are waiting; take them (dg_trainer_results) first",
                 results_waiting(t));
        return -1;
    }
    dg_step_result r[DG_STEP_RESULTS];
    if (dg_trainer_step_queued(t) || dg_trainer_results(t, r) != 1) return -1;
    if (loss_out) *loss_out = r[0].loss;
    if (gnorm_out) *gnorm_out = r[0].grad_norm;
    return 0;
}

/* ---- evaluation -------------------------------------------------------------------------------- */

/* Sums of loss (times scored count) and correct argmax predictions of one batch. */
static int score_batch(const dg_lm *lm, dg_tensor *in, dg_tensor *tg, double *loss_sum, int64_t *correct,
                       int64_t *scored) {
    dg_tensor *logits = NULL, *t = NULL;
    dg_tensor *loss = dg_lm_loss(lm, in, tg, DG_MQAR_IGNORE, &logits, &t);
    if (!loss) return -1;
    /* the argmax on the host (a device model's scored logits, [n,V], are copied back; bf16 logits of
     * mixed precision are widened to f32 first, exactly) */
    if (logits->dtype != DG_F32) logits = dg_to_dtype(dg_detach(logits), DG_F32);
    dg_tensor *lc = logits ? dg_contiguous(logits->device == DG_CPU ? logits : dg_to_device(logits, DG_CPU)) : NULL;
    if (t && t->device != DG_CPU) t = dg_to_device(t, DG_CPU);
    if (!lc || !t) return -1;
    int64_t n = lc->shape[0], V = lc->shape[1];
    const float *p = dg_data_ptr(lc);
    const int64_t *tt = dg_data_ptr(t);
    for (int64_t i = 0; i < n; i++) {
        const float *r = p + i * V;
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (r[v] > r[best]) best = v;
        *correct += best == tt[i];
    }
    *scored += n;
    *loss_sum += dg_item(loss) * (double)n;
    return 0;
}

int dg_trainer_eval(dg_trainer *t, int64_t max_examples, double *loss, double *acc) {
    const dg_train_config *tc = &t->tc;
    int64_t B = tc->batch, correct = 0, scored = 0;
    double loss_sum = 0;
    int rc = 0;
    dg_no_grad_begin();
    if (tc->task == DG_TASK_MQAR) {
        int64_t n = t->heldout->n;
        if (max_examples > 0 && max_examples < n) n = max_examples;
        for (int64_t s = 0; s < n && rc == 0; s += B) {
            dg_scope_begin();
            dg_tensor *in, *tg;
            int64_t cnt = B < n - s ? B : n - s;
            rc = dg_mqar_set_batch(t->heldout, s, cnt, &in, &tg) < 0 ||
                         score_batch(t->lm, in, tg, &loss_sum, &correct, &scored)
                     ? -1
                     : 0;
            dg_scope_end();
        }
    } else {
        int64_t T = tc->seq_len, nw = dg_text_num_windows(t->text, DG_SPLIT_VAL, T);
        int64_t n = nw < tc->eval_batches * B ? nw : tc->eval_batches * B;
        if (max_examples > 0 && max_examples < n) n = max_examples;
        int64_t *buf = malloc((size_t)(B * (T + 1)) * sizeof *buf);
        if (!buf) {
            dg_error("eval: out of memory");
            rc = -1;
        }
        for (int64_t s = 0; s < n && rc == 0; s += B) {
            dg_scope_begin();
            int64_t cnt = B < n - s ? B : n - s;
            int64_t got = dg_text_windows(t->text, DG_SPLIT_VAL, s, cnt, T, buf);
            dg_tensor *w = got > 0 ? dg_from_data(DG_SHAPE(got, T + 1), DG_I64, buf) : NULL;
            rc = w ? score_batch(t->lm, dg_slice(w, 1, 0, T), dg_slice(w, 1, 1, T + 1), &loss_sum, &correct, &scored)
                   : -1;
            dg_scope_end();
        }
        free(buf);
    }
    dg_no_grad_end();
    if (rc) return -1;
    if (scored == 0) {
        dg_error("eval: nothing to score");
        return -1;
    }
    *loss = loss_sum / (double)scored;
    *acc = (double)correct / (double)scored;
    return 0;
}

/* ---- checkpoints ------------------------------------------------------------------------------- */

int dg_trainer_save(dg_trainer *t) {
    if (t->n_device > 0) {
        dg_error("train: save: the results of %d queued steps are still on the device; take them "
                 "(dg_trainer_results) first, so that the checkpoint counts their skipped steps",
                 t->n_device);
        return -1;
    }
    char step_s[32], seed_s[32], ctr_s[32], skip_s[32], el_s[40], best_s[40];
    snprintf(step_s, sizeof step_s, "%lld", (long long)t->step);
    snprintf(seed_s, sizeof seed_s, "%llu", (unsigned long long)t->data_rng.seed);
    snprintf(ctr_s, sizeof ctr_s, "%llu", (unsigned long long)t->data_rng.counter);
    snprintf(skip_s, sizeof skip_s, "%lld", (long long)t->skipped);
    snprintf(el_s, sizeof el_s, "%.17g", t->elapsed_before);
    snprintf(best_s, sizeof best_s, "%.17g", isnan(t->best_acc) ? -1.0 : t->best_acc);
    const char *keys[] = {"deltagrad.train_step", "deltagrad.rng_seed", "deltagrad.rng_counter", "deltagrad.skipped",
                          "deltagrad.elapsed_s",  "deltagrad.best_acc", "deltagrad.train_config"};
    const char *vals[] = {step_s, seed_s, ctr_s, skip_s, el_s, best_s, t->train_json};
    return dg_ckpt_save(t->tc.out_dir, t->lm, t->opt, t->step, t->train_json, 7, keys, vals);
}

/* ---- the loop ---------------------------------------------------------------------------------- */

static int mkdir_p(const char *path) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0777) != 0 && errno != EEXIST) break;
            *p = '/';
        }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
        dg_error("train: cannot create the output directory '%s': %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

enum { C_STEP, C_LR, C_LOSS, C_GNORM, C_TOKS, C_ELAPSED, C_LIVE, C_PEAK, C_EVAL_LOSS, C_EVAL_ACC, C_EVAL_N, NCOLS };
static const char *const csv_cols[NCOLS] = {"step",    "lr",      "loss",      "grad_norm", "tokens_per_s", "elapsed_s",
                                            "live_mb", "peak_mb", "eval_loss", "eval_acc",  "eval_examples"};
#define QUICK_EVAL 250

/* The evaluation of a logged row: its eval columns filled and said.  mqar: a quick look at the
 * first QUICK_EVAL held-out examples; the whole set when that is near the target (it decides the
 * early stop) and at the end; *reached when the whole set is at the target.  0, or -1 (a held-out
 * loss that is not finite is a divergence). */
static int eval_row(dg_trainer *t, dg_progress *pr, double *row, bool last, double *last_acc, bool *reached) {
    const dg_train_config *tc = &t->tc;
    const bool mqar = tc->task == DG_TASK_MQAR;
    double el, ea;
    int64_t n_eval = mqar && !last && QUICK_EVAL < t->heldout->n ? QUICK_EVAL : 0;
    if (dg_trainer_eval(t, n_eval, &el, &ea)) return -1;
    const bool near = mqar && tc->target_acc > 0 && ea >= tc->target_acc - 0.01;
    if (n_eval > 0 && near) {
        n_eval = 0;
        if (dg_trainer_eval(t, 0, &el, &ea)) return -1;
    }
    if (!isfinite(el)) {
        dg_error("train: the run diverged: the held-out loss is %g at step %lld; lower --lr (%g); the last "
                 "checkpoint, if any, is in %s",
                 el, (long long)t->step, tc->lr, tc->out_dir);
        return -1;
    }
    const int64_t n_done = n_eval > 0 ? n_eval : mqar ? t->heldout->n : -1;
    row[C_EVAL_LOSS] = el;
    row[C_EVAL_ACC] = *last_acc = ea;
    row[C_EVAL_N] = (double)n_done;
    if (n_eval == 0 && (isnan(t->best_acc) || ea > t->best_acc)) t->best_acc = ea;
    if (!t->quiet && mqar)
        dg_progress_message(pr, "step %lld  eval loss %.4f  held-out query accuracy %.2f%% (%lld examples)  (%.0fs)",
                            (long long)t->step, el, 100 * ea, (long long)n_done, row[C_ELAPSED]);
    else if (!t->quiet)
        dg_progress_message(pr, "step %lld  validation loss %.4f (%.3f bits/byte)  next-byte accuracy %.2f%%  (%.0fs)",
                            (long long)t->step, el, el / log(2.0), 100 * ea, row[C_ELAPSED]);
    if (mqar && tc->target_acc > 0 && n_eval == 0 && ea >= tc->target_acc) *reached = true;
    return 0;
}

int dg_trainer_run(dg_trainer *t) {
    const dg_train_config *tc = &t->tc;
    /* on several GPUs rank 0 alone writes metrics, charts, checkpoints and the result line; the others
     * train and evaluate alike (so that they stop at the same step) and write nothing */
    bool writer = dg_dp_rank() == 0;
    if (!writer) t->quiet = true;
    if (mkdir_p(tc->out_dir)) return -1;
    /* temporary files of a run killed while it wrote a checkpoint (models/atomic_file.h) */
    int stale = writer ? dg_atomic_remove_stale(tc->out_dir) : 0;
    if (stale < 0) return -1;
    if (stale > 0 && !t->quiet)
        fprintf(stderr, "removed %d temporary file%s left in %s by a killed run\n", stale, stale > 1 ? "s" : "",
                tc->out_dir);
    bool at_target =
        tc->task == DG_TASK_MQAR && tc->target_acc > 0 && !isnan(t->best_acc) && t->best_acc >= tc->target_acc;
    if (t->step >= tc->steps || at_target) { /* a finished run resumed: nothing to train, say where it stands */
        double el, ea;
        if (dg_trainer_eval(t, 0, &el, &ea)) return -1;
        if (writer)
            fprintf(stderr, "the run in %s is complete (step %lld of %lld%s; %s): eval loss %.4f, %s %.2f%%\n",
                    tc->out_dir, (long long)t->step, (long long)tc->steps, at_target ? ", target accuracy reached" : "",
                    at_target ? "a higher --target-acc trains further" : "raise --steps to train further", el,
                    tc->task == DG_TASK_MQAR ? "held-out query accuracy" : "validation next-byte accuracy", 100 * ea);
        return 0;
    }
    char csv_path[1100], svg_path[1100];
    snprintf(csv_path, sizeof csv_path, "%s/metrics.csv", tc->out_dir);
    snprintf(svg_path, sizeof svg_path, "%s/metrics.svg", tc->out_dir);
    dg_csv *csv = writer ? dg_csv_open(csv_path, NCOLS, csv_cols, t->resumed ? t->step : -1) : NULL;
    if (writer && !csv) return -1;
    if (csv && csv->missing_steps > 0)
        fprintf(stderr,
                "note: %s has no rows for %lld of the %lld steps before this resume (first gap: steps "
                "%lld-%lld): the log was cut short or edited; the rows go on from step %lld and the chart "
                "joins across the gap\n",
                csv_path, (long long)csv->missing_steps, (long long)t->step, (long long)csv->missing_from,
                (long long)csv->missing_to, (long long)t->step + 1);
    char title[256];
    snprintf(title, sizeof title, "%s on %s (%lld layers, d=%lld)", dg_mixer_name(t->lm->cfg.mixer),
             dg_task_name(tc->task), (long long)t->lm->cfg.num_hidden_layers, (long long)t->lm->cfg.hidden_size);
    dg_progress pr;
    dg_progress_init(&pr, stderr, t->quiet ? DG_PROGRESS_PLAIN : DG_PROGRESS_AUTO, t->step, tc->steps, tc->log_every);
    int64_t tokens_per_step = tc->batch * dg_train_seq_len(tc);
    double t_start = dg_progress_now(), last_acc = NAN, rate = NAN, t_prev = t_start;
    int rc = 0;
    bool reached = false, stop = false;
#define SAY(...)                                              \
    do {                                                      \
        if (!t->quiet) dg_progress_message(&pr, __VA_ARGS__); \
    } while (0)
    if (tc->task == DG_TASK_MQAR && tc->target_acc > 0 && tc->eval_every > 0) {
        pr.may_stop_early = true; /* the ETA is to the last step: an upper bound */
        SAY("the time shown is an upper bound, to step %lld: it stops sooner if an evaluation "
            "(every %lld steps) reaches %.0f%% held-out accuracy",
            (long long)tc->steps, (long long)tc->eval_every, 100 * tc->target_acc);
    }
    /* Steps are queued and their results taken in runs: at every logged step (log_every), at
     * least once a second, and before an evaluation, a checkpoint or the end.  On one GPU a step
     * then reads nothing back (train_graph.h) and the host stays ahead of the device; each result
     * carries the time its step finished there, so the rows' times are the device's. */
    int64_t nonfinite_streak = 0;
    double t_taken = t_start;
    dg_step_result res[DG_STEP_RESULTS];
    while (t->step < tc->steps && !stop) {
        if (dg_trainer_step_queued(t)) {
            rc = -1;
            break;
        }
        const int64_t s = t->step;
        const bool last = s == tc->steps;
        const bool eval_now = (tc->eval_every > 0 && s % tc->eval_every == 0) || last;
        const bool save_now = tc->save_every > 0 && s % tc->save_every == 0;
        const bool stop_now = (t->stop_at > 0 && s >= t->stop_at) || (t->interrupt && *t->interrupt);
        /* several GPUs take the results at the same steps on every rank (never by the clock): a stop
         * request read there stops them all after the same step (data_parallel.h) */
        const bool by_clock = !dg_dp_active() && dg_progress_now() - t_taken >= 1.0;
        if (!(eval_now || save_now || stop_now || s % tc->log_every == 0 || results_waiting(t) >= DG_STEP_RESULTS ||
              by_clock))
            continue;
        const int n = dg_trainer_results(t, res);
        if (n < 0) {
            rc = -1;
            break;
        }
        t_taken = dg_progress_now();
        double now = t_prev;
        for (int i = 0; i < n && rc == 0; i++) {
            const dg_step_result *r = &res[i];
            /* a step with a non-finite loss or gradient makes no update; a run of them is a
             * divergence, which ends the run as an error before a checkpoint of its weights is
             * written */
            nonfinite_streak = isfinite(r->loss) && isfinite(r->grad_norm) ? 0 : nonfinite_streak + 1;
            if (nonfinite_streak >= DG_DIVERGED_STEPS) {
                dg_error("train: the run diverged: the loss or the gradient was not finite for the last %d steps "
                         "(step %lld: loss %g, gradient norm %g); lower --lr (%g); the last checkpoint, if any, is "
                         "in %s",
                         DG_DIVERGED_STEPS, (long long)r->step, r->loss, r->grad_norm, tc->lr, tc->out_dir);
                rc = -1;
                break;
            }
            now = r->time_s;
            double dt = now - t_prev;
            t_prev = now;
            /* tokens/s smoothed over the last steps (an exponential average of step times) */
            rate = isnan(rate) ? tokens_per_step / dt : 0.9 * rate + 0.1 * (tokens_per_step / dt);
            double row[NCOLS];
            for (int c = 0; c < NCOLS; c++) row[c] = NAN;
            row[C_STEP] = (double)r->step;
            row[C_LR] = dg_lr_at(&t->sched, r->step - 1);
            row[C_LOSS] = r->loss;
            row[C_GNORM] = r->grad_norm;
            row[C_TOKS] = rate;
            row[C_ELAPSED] = t->elapsed_before + (now - t_start);
            row[C_LIVE] = (double)dg_live_bytes(tc->device) / 1e6; /* tensor bytes on the run's device */
            row[C_PEAK] = (double)dg_peak_bytes(tc->device) / 1e6; /* their peak so far (a step's activations) */
            if (r->step == s && eval_now && eval_row(t, &pr, row, last, &last_acc, &reached)) {
                rc = -1;
                break;
            }
            if (!t->quiet) dg_progress_update(&pr, r->step, r->loss, last_acc, rate);
            if (writer && dg_csv_row(csv, row)) {
                rc = -1;
                break;
            }
            if (writer && !isnan(row[C_EVAL_ACC]) && dg_chart_from_csv(csv_path, svg_path, title)) {
                rc = -1;
                break;
            }
        }
        if (rc) break;
        stop = reached || stop_now;
        if (save_now || stop || last) {
            t->elapsed_before += now - t_start;
            t_start = now;
            if (writer && dg_trainer_save(t)) {
                rc = -1;
                break;
            }
        }
    }
    if (!t->quiet) dg_progress_finish(&pr);
    if (csv) dg_csv_close(csv);
    if (writer && rc == 0 && dg_chart_from_csv(csv_path, svg_path, title)) rc = -1;
    if (writer && rc == 0) { /* the result line, --quiet or not */
        double total = t->elapsed_before;
        if (reached)
            fprintf(stderr,
                    "reached %.2f%% held-out query accuracy (target %.0f%%) at step %lld after %.1f s of "
                    "training; checkpoint in %s\n",
                    100 * last_acc, 100 * tc->target_acc, (long long)t->step, total, tc->out_dir);
        else if (t->step < tc->steps)
            fprintf(stderr, "stopped at step %lld of %lld (%.1f s); resume with --resume %s\n", (long long)t->step,
                    (long long)tc->steps, total, tc->out_dir);
        else
            fprintf(stderr, "finished %lld steps in %.1f s: %s %.2f%%%s; checkpoint in %s\n", (long long)t->step, total,
                    tc->task == DG_TASK_MQAR ? "held-out query accuracy" : "validation next-byte accuracy",
                    100 * last_acc,
                    tc->task == DG_TASK_MQAR && tc->target_acc > 0 && !(last_acc >= tc->target_acc)
                        ? " (target not reached)"
                        : "",
                    tc->out_dir);
    }
#undef SAY
    return rc;
}
