/* deltagrad train [OPTIONS]: train a model (no options: the default Gated DeltaNet on MQAR).
 * Options: tools/train_flags.c.  With --resume DIR the run's settings come from the checkpoint and
 * options given on the command line override them (model options must match the checkpoint). */
#include "models/checkpoint.h"
#include "models/data_parallel.h"
#include "models/train_graph.h"
#include "models/trainer.h"
#include "tools/commands.h"
#include "tools/launch_gpus.h"
#include "tools/train_flags.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* SIGINT (Ctrl-C) and SIGTERM (schedulers, `docker stop`, `kill`) end the run after the current step,
 * with a checkpoint, and the process exits 128 + the signal's number (130, 143) as a shell reports a
 * killed command, so that a script can tell an interrupted run from a finished one.  A second signal
 * kills at once. */
static volatile sig_atomic_t interrupted;

static void on_stop_signal(int sig) {
    interrupted = sig;
    signal(sig, SIG_DFL);
}

/* Process settings that training needs and that only take effect when the process starts (libgomp
 * and OpenBLAS read them from the environment at load time): if they are unset, set them and
 * re-execute this program once.  Measured on the 2-core machine (docs/TRAINING.md): OpenMP's default
 * active waiting spins on the cores OpenBLAS's threads need (steps 2-3x slower when anything else
 * runs); OpenBLAS's idle threads spin for 2^28 cycles after each GEMM, against the OpenMP threads
 * of the next op (a timeout of 2^4 takes a sixth off a step).  jemalloc's settings are not among them:
 * the library sets those for every program that links it (core/storage.c).  DG_NO_REEXEC=1 turns
 * this off. */
static void tune_process(int argc, char **argv) {
    if (getenv("DG_NO_REEXEC") || getenv("DG_TRAIN_REEXECED")) return;
    bool need = false;
    if (!getenv("OMP_WAIT_POLICY")) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        need = true;
    }
    if (!getenv("OPENBLAS_THREAD_TIMEOUT")) { /* OpenBLAS's idle threads spin 2^28 cycles; 2^4 here */
        setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1);
        need = true;
    }
    if (!need) return;
    setenv("DG_TRAIN_REEXECED", "1", 1);
    char **args = calloc((size_t)argc + 2, sizeof *args);
    if (!args) return;
    args[0] = "deltagrad"; /* main() passes argv + 1: argv[0] is "train" */
    for (int i = 0; i < argc; i++) args[i + 1] = argv[i];
    fflush(NULL);
    execv("/proc/self/exe", args); /* returns only on failure: then go on as we are */
    free(args);
}

/* A new run whose output directory already holds one: refused, naming the three ways on, unless
 * --overwrite (then the old run's files are removed).  0 to go on, -1 refused (message printed). */
static int refuse_existing_run(const char *dir, bool overwrite) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, DG_CKPT_MODEL_FILE);
    if (access(path, F_OK) != 0) return 0;
    if (overwrite) {
        if (dg_ckpt_remove_run(dir) == 0) return 0;
        dg_cmd_say_error("train");
        return -1;
    }
    int64_t step = -1;
    if (dg_ckpt_read_meta(dir, &(dg_model_config){0}, NULL, &step, NULL)) dg_clear_error();
    fprintf(stderr, "train: %s already holds a run", dir);
    if (step >= 0) fprintf(stderr, " (checkpoint at step %lld)", (long long)step);
    fprintf(stderr, ": --resume %s continues it, --overwrite starts over in it, --out DIR trains elsewhere\n", dir);
    return -1;
}

int dg_cmd_train(int argc, char **argv) {
    tune_process(argc, argv);
    bool help;
    const char *resume = dg_train_flags_find_resume(argc, argv, &help);
    if (help) {
        dg_train_flags_help(stdout);
        return 0;
    }
    dg_train_opts o = dg_train_opts_default();
    if (resume) { /* the checkpoint's settings first, then the command line's */
        char *tj = NULL;
        if (dg_ckpt_read_meta(resume, &o.mc, &tj, NULL, NULL)) {
            dg_cmd_say_error("train");
            return 1;
        }
        int r = tj ? dg_train_config_from_json(tj, &o.tc) : 0;
        free(tj);
        if (r) {
            fprintf(stderr, "train: cannot resume from '%s': %s\n", resume, dg_last_error());
            return 1;
        }
        snprintf(o.tc.out_dir, sizeof o.tc.out_dir, "%s", resume);
    }
    if (dg_train_flags_parse(argc, argv, &o)) return 2;
    if (!resume && !o.device_given) /* the GPU when there is one; a resumed run keeps its device */
        o.tc.device = dg_cuda_available() ? DG_CUDA : DG_CPU;
    if (!resume && !o.out_given)
        snprintf(o.tc.out_dir, sizeof o.tc.out_dir, "runs/%s-%s", dg_task_name(o.tc.task), dg_mixer_name(o.mc.mixer));
    if (resume && o.overwrite) {
        fprintf(stderr, "train: --resume continues the run in %s and --overwrite starts it over: give one\n", resume);
        return 2;
    }
    if (!resume && refuse_existing_run(o.tc.out_dir, o.overwrite)) return 2;
    if (o.tc.task == DG_TASK_TEXT && !o.model_given) o.mc.vocab_size = 256;
    if (o.tc.task == DG_TASK_TEXT && o.tc.data[0]) { /* stored absolute: eval and resume work from anywhere */
        char *abs = realpath(o.tc.data, NULL);
        if (abs && strlen(abs) < sizeof o.tc.data) snprintf(o.tc.data, sizeof o.tc.data, "%s", abs);
        free(abs);
    }
    /* several GPUs: this process starts and watches one process a GPU (tools/launch_gpus.c); each of
     * those (DG_WORLD in its environment) joins the others, then trains as below on its slice */
    int rank = 0, world = 1, launched;
    if (dg_dp_env(&rank, &world)) {
        dg_cmd_say_error("train");
        return 2;
    }
    if (world == 1 && dg_launch_gpus(argc, argv, &o, &launched)) return launched;
    if (dg_dp_init() || (o.bf16_all_reduce && dg_dp_set_grad_dtype(DG_BF16))) {
        dg_cmd_say_error("train");
        return 1;
    }
    if (rank > 0) o.quiet = true; /* rank 0 speaks for the run */
    dg_trainer *t = dg_trainer_open(&o.tc, &o.mc, resume);
    if (!t) {
        dg_cmd_say_error("train");
        dg_dp_shutdown();
        return 1;
    }
    t->stop_at = o.stop_at;
    t->quiet = o.quiet;
    t->graph_off = !o.graph;
    t->lm->mixer_opts.keep_delta_work = o.keep_delta_work;
    /* the ranks of several GPUs stop together, after the step at which any of them got the signal */
    t->interrupt = dg_dp_active() ? dg_dp_stop_flag(&interrupted) : &interrupted;
    const dg_model_config *mc = &t->lm->cfg;
    const dg_train_config *tc = &t->tc;
    if (!o.quiet) {
        fprintf(stderr,
                "deltagrad train: %s, %lld layers, d_model %lld, %lld heads x %lld (v %lld x %lld), mlp %lld, "
                "vocab %lld: %.3g M parameters\n",
                dg_mixer_name(mc->mixer), (long long)mc->num_hidden_layers, (long long)mc->hidden_size,
                (long long)mc->num_heads, (long long)mc->head_dim, (long long)dg_model_num_v_heads(mc),
                (long long)dg_model_head_v_dim(mc), (long long)dg_model_intermediate_size(mc),
                (long long)mc->vocab_size, dg_param_count(&t->lm->params) / 1e6);
        if (tc->task == DG_TASK_MQAR)
            fprintf(stderr,
                    "task mqar: seq_len %lld, %lld kv pairs, %lld queries, vocab %lld; held-out %lld examples\n",
                    (long long)tc->mqar.seq_len, (long long)tc->mqar.num_kv_pairs,
                    (long long)dg_mqar_num_queries(&tc->mqar), (long long)tc->mqar.vocab_size,
                    (long long)tc->eval_examples);
        else
            fprintf(stderr, "task text: '%s', seq_len %lld, validation fraction %g\n", tc->data, (long long)tc->seq_len,
                    tc->val_fraction);
        fprintf(stderr,
                "steps %lld, batch %lld, lr %g (warmup %lld, cosine to %g), weight decay %g, clip %g, seed "
                "%llu, %s algorithm on %s in %s%s%s; output %s%s\n",
                (long long)tc->steps, (long long)tc->batch, tc->lr, (long long)tc->warmup, tc->lr * tc->min_lr_ratio,
                tc->weight_decay, tc->clip, (unsigned long long)tc->seed,
                tc->algorithm == DG_DELTA_RECURRENT ? "recurrent" : "chunked", dg_device_name(tc->device),
                dg_dtype_name(dg_train_precision(tc)),
                dg_train_precision(tc) == DG_BF16 ? " (mixed precision: f32 master weights)" : "",
                !dg_train_graph_usable(t) ? ""
                : t->graph_off            ? ", each step launched kernel by kernel (--no-graph)"
                                          : ", the step as a CUDA graph",
                tc->out_dir, t->resumed ? " (resumed)" : "");
        if (t->resumed) fprintf(stderr, "resuming at step %lld\n", (long long)t->step);
    }
    signal(SIGINT, on_stop_signal);
    signal(SIGTERM, on_stop_signal);
    int rc = dg_trainer_run(t);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    if (rc) dg_cmd_say_error("train");
    int64_t step_done = t->step;
    char out_dir[sizeof t->tc.out_dir];
    snprintf(out_dir, sizeof out_dir, "%s", t->tc.out_dir);
    if (t->profile && t->profiled_steps > 0) { /* asked for in the environment: printed even when quiet */
        double n = (double)t->profiled_steps;
        double tot = t->t_data + t->t_fwd + t->t_bwd + t->t_opt;
        fprintf(stderr, "profile (s per step): data %.4f  forward %.4f  backward %.4f  clip+adamw %.4f  total %.4f\n",
                t->t_data / n, t->t_fwd / n, t->t_bwd / n, t->t_opt / n, tot / n);
    }
    if (t->op_steps > 0) dg_profile_report(stderr, t->op_steps);
    int stopped_by = *t->interrupt;
    dg_trainer_free(t);
    dg_dp_shutdown();
    if (rc) return 1;
    if (stopped_by) {
        if (rank == 0)
            fprintf(stderr, "train: interrupted by %s at step %lld, checkpoint saved in %s (exit status %d)\n",
                    stopped_by == SIGINT ? "SIGINT" : "SIGTERM", (long long)step_done, out_dir, 128 + stopped_by);
        return 128 + stopped_by;
    }
    return 0;
}
