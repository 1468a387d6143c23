/* A training run: the model, AdamW, the data stream, the schedule, evaluation, checkpoints and the
 * loop that ties them together (metrics CSV, SVG chart, progress display, early stop).
 *
 * One training step is one dg_scope: every tensor it makes is released at its end, so memory stays
 * flat over the run (the CSV's live_mb column shows it).
 *
 * Exact resumption: the state of a run is the parameters, AdamW's moments and step, the step count,
 * and the data generator's Philox state (seed, counter); the schedule is a function of the step, the
 * held-out set is fixed.  A checkpoint stores all of it (models/checkpoint.h), so N steps, a kill,
 * and a resume for N more give the parameters of 2N uninterrupted steps bit for bit (same thread
 * count, same build). */
#ifndef DG_MODELS_TRAINER_H
#define DG_MODELS_TRAINER_H

#include "models/lm.h"
#include "models/mqar.h"
#include "models/optim.h"
#include "models/text_data.h"
#include "models/train_config.h"

#include <signal.h>

/* Consecutive steps with a non-finite loss or gradient after which the run counts as diverged. */
#define DG_DIVERGED_STEPS 10

typedef struct dg_train_graph dg_train_graph; /* models/train_graph.h */

/* What one step gives back: its number (the update count after it), its loss (mean over scored
 * positions), the gradient norm before clipping, and when it finished (seconds on
 * dg_progress_now's clock). */
typedef struct dg_step_result {
    int64_t step;
    double loss, grad_norm, time_s;
} dg_step_result;

/* Steps that may be queued before their results are taken (dg_trainer_results). */
#define DG_STEP_RESULTS 256

typedef struct dg_trainer {
    dg_train_config tc;
    char *train_json; /* tc as JSON (stored in checkpoints) */
    dg_lm *lm;
    dg_adamw *opt;
    dg_tensor *norm;      /* the latest step's gradient norm, f64 [1] on the model's device (kept) */
    dg_rng data_rng;      /* training batches */
    int64_t step;         /* updates made */
    int64_t skipped;      /* steps whose gradient was not finite (no update) */
    dg_mqar_set *heldout; /* task mqar */
    dg_text_data *text;   /* task text */
    dg_lr_schedule sched;
    double elapsed_before; /* training seconds of the run before this process (resumed runs) */
    double best_acc;
    bool resumed;
    /* run-time controls, not part of the run's identity */
    int64_t stop_at;                    /* > 0: save and return after this step (as if killed right after a save) */
    volatile sig_atomic_t *interrupt;   /* set (by SIGINT, SIGTERM): save and return after the current step */
    bool quiet;                         /* no progress display (the final result line is still printed) */
    bool profile;                       /* time the phases of each step (DG_PROFILE=1) */
    double t_data, t_fwd, t_bwd, t_opt; /* seconds per phase when profiling */
    int64_t profiled_steps;
    /* DG_PROFILE=ops: the op profiler (deltagrad.h, dg_profile_*) over every step after the run's
     * first two (warm-up: the memory pool grows, cuBLAS sets up) */
    bool profile_ops;
    int64_t op_steps, op_warmup;
    bool graph_off;        /* --no-graph, or a capture that failed: no CUDA graph, every step eager */
    dg_train_graph *graph; /* the device step's buffers and graph (train_graph.h), NULL before */
    /* steps queued whose results have not been taken: n_device of them still on the device (the
     * graph path's ring), n_host already read (the other paths read each step's at once) */
    int n_device, n_host;
    dg_step_result host_results[DG_STEP_RESULTS];
} dg_trainer;

/* A new run (resume_dir NULL), or one continued from the checkpoint in resume_dir, whose model
 * config must equal mc.  NULL with dg_error. */
dg_trainer *dg_trainer_open(const dg_train_config *tc, const dg_model_config *mc, const char *resume_dir);
/* For evaluation only: the model of the checkpoint in dir_or_file (no optimiser state needed) and the
 * task data of tc.  NULL with dg_error. */
dg_trainer *dg_trainer_open_eval(const dg_train_config *tc, const char *dir_or_file);
void dg_trainer_free(dg_trainer *t);

/* One update.  loss (mean over scored positions) and the gradient norm before clipping, read
 * back at once.  No other step's result may be waiting (dg_trainer_results).  0 or -1. */
int dg_trainer_step(dg_trainer *t, double *loss, double *grad_norm);
/* One update queued: on one GPU (the CUDA graph's path, train_graph.h) nothing is read back and
 * the host goes on while the device works; its result comes with dg_trainer_results.  Elsewhere
 * the step is read back as in dg_trainer_step and its result waits on the host.  At most
 * DG_STEP_RESULTS steps may wait.  0 or -1. */
int dg_trainer_step_queued(dg_trainer *t);
/* The results of the steps queued since the last call, oldest first, into out (room for
 * DG_STEP_RESULTS); waits for the device.  A step whose loss or norm is not finite was skipped (no
 * update) and is counted in t->skipped here.  The number of results, or -1 with dg_error. */
int dg_trainer_results(dg_trainer *t, dg_step_result *out);
/* Held-out loss and accuracy (mqar: the fixed set, queries only; text: up to eval_batches batches of
 * validation windows, next-byte accuracy).  max_examples > 0 caps the examples/windows.  0 or -1. */
int dg_trainer_eval(dg_trainer *t, int64_t max_examples, double *loss, double *acc);
/* Checkpoint into tc.out_dir at the current step; the queued steps' results must have been taken
 * (the checkpoint counts the skipped steps).  0 or -1. */
int dg_trainer_save(dg_trainer *t);
/* The loop up to tc.steps (or the target accuracy, stop_at, an interrupt).  Writes
 * OUT/metrics.csv and OUT/metrics.svg, checkpoints every save_every steps and at the end.
 * 0 (finished, target reached or stopped on request), or -1 with dg_error. */
int dg_trainer_run(dg_trainer *t);

#endif
