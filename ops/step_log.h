/* The per-step log of a training run kept on the run's device: each step appends its loss, its
 * gradient norm and the time it finished to a ring of records, and the host reads a run of steps
 * at once (models/train_graph.c), so that a step on the GPU reads nothing back.
 *
 * ring: f64 [R, 4], one record a row: (loss, norm, time in seconds, flag); count: i64 [1], the
 * records written so far.  The flag is a number the step computed on the device for the host to
 * see with the rest (the mean of several GPUs' stop requests: models/data_parallel.h), or 0.  Step n's record is row n mod R.  The time is the device's own clock: the GPU's
 * global timer (nanoseconds, read by the kernel as it runs, so after everything queued before it),
 * the host's monotonic clock on the CPU.  Only differences of times mean anything. */
#ifndef DG_OPS_STEP_LOG_H
#define DG_OPS_STEP_LOG_H

#include "core/internal.h"

/* Appends (loss, norm, now, flag) to ring at count mod R and adds 1 to count, on the tensors'
 * device, queued like any kernel.  loss and flag (NULL: 0): one f32 or f64 element each; norm: one
 * f64 element; all on one device, contiguous.  0, or -1 with dg_error naming the argument and
 * nothing queued. */
int dg_step_log_put_(dg_tensor *ring, dg_tensor *count, const dg_tensor *loss, const dg_tensor *norm,
                     const dg_tensor *flag);

#endif
