/* The training step as a CUDA graph (models/train_graph.h). */
#include "models/train_graph.h"

#include "core/device_graph.h"
#include "core/internal.h"
#include "models/data_parallel.h"
#include "models/metrics.h"
#include "ops/op.h"
#include "ops/step_log.h"

#include <stdio.h>
#include <stdlib.h>

struct dg_train_graph {
    dg_tensor *in, *tg;  /* the batch's device buffers, i64 [B,T] (kept) */
    dg_tensor *lr;       /* the step's learning rate, f64 [1] on the device, read by AdamW */
    dg_tensor *ring;     /* the steps' records, f64 [DG_STEP_RESULTS, 4] (ops/step_log.h) */
    dg_tensor *count;    /* records written, i64 [1] on the device */
    int64_t queued;      /* steps queued (the device's count once they have run) */
    dg_cuda_graph *exec; /* NULL until captured */
    int eager_steps;     /* steps run before the capture */
};

#ifdef DG_HAVE_CUDA

/* Eager steps before the capture: the first makes what lives across steps (gradients, AdamW's
 * device state and tables, cuBLAS's workspace, kernels' attributes), so that the captured step
 * allocates and frees only its own memory.  On several GPUs the first also learns the order in
 * which the gradients finish and the second puts them in the flat buffer that order gives
 * (data_parallel.h; AdamW's tables follow their new addresses in it), so the capture is the third. */
static int eager_steps_before_capture(void) { return dg_dp_active() ? 2 : 1; }

bool dg_train_graph_usable(const dg_trainer *t) { return t->tc.device == DG_CUDA && !t->profile && !t->profile_ops; }

bool dg_train_graph_captured(const dg_trainer *t) { return t->graph && t->graph->exec; }

void dg_train_graph_free(dg_trainer *t) {
    dg_train_graph *g = t->graph;
    if (!g) return;
    dg_cuda_graph_free(g->exec);
    dg_release(g->in), dg_release(g->tg), dg_release(g->lr);
    dg_release(g->ring), dg_release(g->count);
    free(g);
    t->graph = NULL;
}

/* ids in [0, vocab); targets in [0, vocab) or the ignore index.  Checked on the host, because the
 * captured step's ops cannot read the device to check them (kernels/cuda/graph.cu). */
static int check_batch(const dg_tensor *in, const dg_tensor *tg, int64_t vocab) {
    int64_t val, bad = dg_first_bad_index("train", in, vocab, false, 0, &val);
    if (bad >= 0)
        dg_error("train: input id %lld at flat position %lld of the batch %s is outside the vocabulary [0, %lld)",
                 (long long)val, (long long)bad, dg_shp(in), (long long)vocab);
    if (bad != -1) return -1;
    bad = dg_first_bad_index("train", tg, vocab, true, DG_MQAR_IGNORE, &val);
    if (bad >= 0)
        dg_error("train: target %lld at flat position %lld of the batch %s is outside the vocabulary [0, %lld) and "
                 "not the ignore index %d",
                 (long long)val, (long long)bad, dg_shp(tg), (long long)vocab, DG_MQAR_IGNORE);
    return bad == -1 ? 0 : -1;
}

/* The step's buffers, made once, before any capture. */
static dg_train_graph *buffers(dg_trainer *t, const dg_tensor *in) {
    if (t->graph) return t->graph;
    dg_train_graph *g = calloc(1, sizeof *g);
    if (!g) {
        dg_error("train: out of host memory");
        return NULL;
    }
    t->graph = g;
    g->in = dg_keep(dg_empty_on(in->ndim, in->shape, DG_I64, DG_CUDA));
    g->tg = dg_keep(dg_empty_on(in->ndim, in->shape, DG_I64, DG_CUDA));
    g->lr = dg_keep(dg_empty_on(1, (int64_t[]){1}, DG_F64, DG_CUDA));
    g->ring = dg_keep(dg_empty_on(2, (int64_t[]){DG_STEP_RESULTS, 4}, DG_F64, DG_CUDA));
    g->count = dg_keep(dg_zeros_on(1, (int64_t[]){1}, DG_I64, DG_CUDA));
    return g->in && g->tg && g->lr && g->ring && g->count ? g : NULL;
}

/* The work of one step on the device buffers: forward, backward, clip + AdamW, zeroed gradients,
 * the step's record appended to the ring.  On several GPUs the backward overlaps the buckets'
 * all-reduce and the record holds the mean loss of the ranks and the mean of their stop requests
 * (data_parallel.h).  Run eagerly, or captured (nothing in it reads the device). */
static int body(dg_trainer *t, dg_train_graph *g) {
    dg_scope_begin();
    int rc = -1;
    const bool dp = dg_dp_active();
    dg_tensor *loss = dg_lm_loss(t->lm, g->in, g->tg, DG_MQAR_IGNORE, NULL, NULL);
    if (!loss) goto out;
    if (dp ? dg_dp_step_begin(t->lm->params.n, t->lm->params.t, loss) ||
                 dg_backward_hooked(loss, NULL, dg_dp_leaf_ready, NULL) || dg_dp_step_end()
           : dg_backward(loss, NULL))
        goto out;
    /* the ranks decide on their common (averaged) gradients alone, so that they decide alike */
    dg_adamw_fused_args fa = {.lr_dev = g->lr, .max_norm = t->tc.clip, .loss = dp ? NULL : loss, .norm_out = t->norm};
    if (dg_adamw_step_fused(t->opt, &fa)) goto out;
    dg_adamw_zero_grad(t->opt);
    dg_tensor *sc = dg_dp_scalars();
    rc = dp ? dg_step_log_put_(g->ring, g->count, dg_slice(sc, 0, 0, 1), t->norm, dg_slice(sc, 0, 1, 2))
            : dg_step_log_put_(g->ring, g->count, loss, t->norm, NULL);
out:
    dg_scope_end();
    return rc;
}

/* The capture of the step (which queues nothing that runs) and its first launch.  A capture that
 * fails leaves the run without a graph: one note, then the step runs eagerly. */
static int capture(dg_trainer *t, dg_train_graph *g) {
    if (dg_cuda_graph_begin()) return -1;
    const int brc = body(t, g);
    char inner[600];
    snprintf(inner, sizeof inner, "%s", brc ? dg_last_error() : "");
    dg_clear_error();
    g->exec = dg_cuda_graph_end();
    if (!brc && g->exec) return dg_cuda_graph_launch(g->exec);
    char note[1200];
    snprintf(note, sizeof note, "the training step could not be captured in a CUDA graph (%s); it runs without one",
             brc ? inner : dg_last_error());
    dg_clear_error();
    dg_note_once(note);
    dg_cuda_graph_free(g->exec);
    g->exec = NULL;
    t->graph_off = true;
    return body(t, g);
}

int dg_train_graph_step(dg_trainer *t, dg_tensor *in, dg_tensor *tg, double lr) {
    dg_scope_begin();
    dg_train_graph *g = buffers(t, in);
    dg_tensor *ic = dg_contiguous(in), *tc = dg_contiguous(tg);
    int rc = g && ic && tc && dg_same_shape(ic, g->in) ? 0 : -1;
    if (!rc && !dg_same_shape(tc, g->tg)) rc = -1;
    if (rc && g && ic && tc)
        dg_error("train: the batch %s / %s differs in shape from the run's first, %s: the device step takes one shape",
                 dg_shp(ic), dg_shp(tc), dg_shp(g->in));
    if (!rc) rc = check_batch(ic, tc, t->lm->cfg.vocab_size);
    /* the uploads are queued ahead of the step and do not wait for the device */
    if (!rc) rc = dg_copy_(g->in, ic) || dg_copy_(g->tg, tc);
    if (!rc) rc = dg_cuda_memcpy(dg_data_ptr(g->lr), &lr, sizeof lr, 0);
    /* several GPUs: the flat gradients once their order is known, and this rank's stop request,
     * both queued outside the step (data_parallel.h) */
    if (!rc) rc = dg_dp_step_prepare();
    dg_scope_end();
    if (rc) return -1;
    if (g->exec) rc = dg_cuda_graph_launch(g->exec);
    else if (t->graph_off) rc = body(t, g);
    else if (g->eager_steps < eager_steps_before_capture()) rc = body(t, g), g->eager_steps++;
    else rc = capture(t, g);
    if (rc || dg_dp_mark_step()) return -1; /* several GPUs: the step's end, for the read's wait */
    g->queued++;
    return 0;
}

int dg_train_graph_read(dg_trainer *t, int n, dg_step_result *out) {
    dg_train_graph *g = t->graph;
    if (!g || n < 1 || n > DG_STEP_RESULTS || n > g->queued) {
        dg_error("train: the records of %d steps were asked for, of the %lld steps queued (at most %d are kept)", n,
                 (long long)(g ? g->queued : 0), DG_STEP_RESULTS);
        return -1;
    }
    double rows[DG_STEP_RESULTS][4];
    /* the copy waits for the queued steps (on several GPUs first a wait with a limit: a rank that
     * died leaves the collectives unfinished); the host's clock right after it stands for the
     * device's time of the last record, and the earlier ones are placed by their differences */
    if (dg_dp_wait() || dg_cuda_memcpy(rows, dg_data_ptr(g->ring), sizeof rows, 1)) return -1;
    const double now = dg_progress_now();
    const double *last = rows[(g->queued - 1) % DG_STEP_RESULTS];
    for (int i = 0; i < n; i++) {
        const double *r = rows[(g->queued - n + i) % DG_STEP_RESULTS];
        out[i].loss = r[0];
        out[i].grad_norm = r[1];
        out[i].time_s = now - (last[2] - r[2]);
        dg_dp_note_stop(r[3]); /* several GPUs: some rank asked to stop (0 on one) */
    }
    return 0;
}

#else /* no CUDA: a run on the CPU never takes this path */

bool dg_train_graph_usable(const dg_trainer *t) {
    (void)t;
    return false;
}

bool dg_train_graph_captured(const dg_trainer *t) {
    (void)t;
    return false;
}

void dg_train_graph_free(dg_trainer *t) { (void)t; }

int dg_train_graph_step(dg_trainer *t, dg_tensor *in, dg_tensor *tg, double lr) {
    (void)t, (void)in, (void)tg, (void)lr;
    dg_error("train: CUDA graphs need a build with the CUDA backend");
    return -1;
}

int dg_train_graph_read(dg_trainer *t, int n, dg_step_result *out) {
    (void)t, (void)n, (void)out;
    dg_error("train: CUDA graphs need a build with the CUDA backend");
    return -1;
}

#endif
