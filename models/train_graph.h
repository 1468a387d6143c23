/* The training step as a CUDA graph: on each GPU with static shapes (every step's batch has the same
 * shape), the step is captured once and each later step is one launch of the graph, so the host's
 * cost of launching several hundred kernels a step vanishes.  `deltagrad train --no-graph`
 * (t->graph_off) runs the same step eagerly every time: the same kernels on the same buffers, so
 * the same bits.
 *
 * The step reads its batch from device buffers that live as long as the run: each step checks
 * the batch on the host (ids and targets inside the vocabulary, or the ignore index), uploads it
 * and the step's learning rate into them, then runs the step: eagerly for the first
 * (which makes the gradients, AdamW's tables and the rest that lives across steps), captured and
 * launched for the second, launched for every later one.  Inside it nothing is read back: the
 * loss goes to a device scalar, the norm to the trainer's; both are read after the launch.  The
 * loss is scored over every position with the ignored ones skipped on the device (MQAR's queries:
 * the same loss as the host-gathered path of dg_lm_loss, from a larger head product).
 *
 * On several GPUs the step is the same with the data-parallel all-reduce in it (data_parallel.h):
 * the buckets' collectives on the communicator's side stream, forked from and joined back into the
 * captured stream, so the graph holds them too; the record holds the ranks' mean loss and the mean
 * of their stop requests, and a read first waits for the device with a limit (a rank that died
 * leaves its collectives unfinished).  Two eager steps come first there: the first learns the order
 * in which the gradients finish, the second moves them into the flat buffer of that order.
 *
 * A capture that fails (something in the step read the device) prints one note and the run goes
 * on without a graph.  Not used under DG_PROFILE (which times phases and ops on the host). */
#ifndef DG_MODELS_TRAIN_GRAPH_H
#define DG_MODELS_TRAIN_GRAPH_H

#include "models/trainer.h"

/* Whether t's steps take this path (captured, or eagerly with graph_off): cuda, no profiling. */
bool dg_train_graph_usable(const dg_trainer *t);
/* One step on the host batch in, tg (i64 [B,T]) at learning rate lr, queued: nothing is read back
 * and the host does not wait for the device (except for a slot of the upload ring).  0 or -1 with
 * dg_error. */
int dg_train_graph_step(dg_trainer *t, dg_tensor *in, dg_tensor *tg, double lr);
/* The records of the last n steps queued (1 <= n <= DG_STEP_RESULTS), oldest first: out[i]'s loss,
 * grad_norm and time_s (when the step finished on the device, on dg_progress_now's clock); step
 * is left to the caller.  One copy from the device, which waits for the queued work.  0 or -1. */
int dg_train_graph_read(dg_trainer *t, int n, dg_step_result *out);
/* Whether the step has been captured (its later steps are launches of the graph). */
bool dg_train_graph_captured(const dg_trainer *t);
/* The graph and its buffers (t->graph) released. */
void dg_train_graph_free(dg_trainer *t);

#endif
