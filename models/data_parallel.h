/* Data-parallel training: one process a GPU, each holding a whole replica of the model.  Every step
 * each rank takes its own rows of the step's global batch (the same global batch that one process
 * would train on, cut in `world` equal slices in rank order), runs forward and backward on them,
 * and the ranks replace their gradients by the mean over the ranks before clipping and AdamW.  Each
 * rank's loss is the mean over its slice, and the slices are of equal size, so the mean of the
 * ranks' gradients is the gradient of the global batch's mean loss: N GPUs with a global batch B
 * follow one GPU with batch B, up to the order of the sums.  Every rank then makes the same update
 * on the same parameters, so the replicas stay equal without ever being compared.
 *
 * How processes meet (docs/MULTI_GPU.md): the environment names this process's place,
 *   DG_WORLD          the number of ranks (absent or 1: a single process, nothing here is active)
 *   DG_RANK           this process's rank, 0 .. DG_WORLD-1
 *   DG_CUDA_DEVICE    the GPU it uses (the CUDA runtime reads it; the launcher sets the rank)
 *   DG_RENDEZVOUS     a file through which rank 0 hands the communicator's id to the others, or
 *   DG_NCCL_ID        the id itself (hex), when an outside launcher made it
 *   DG_DP_TIMEOUT     seconds a rank waits for the others in a collective before it gives up (300)
 *   DG_RENDEZVOUS_TIMEOUT  seconds a rank waits for the rendezvous file (60)
 *   DG_DP_BUCKET_MB   megabytes of gradients a bucket of the all-reduce holds (25)
 * `deltagrad train --gpus N` (tools/launch_gpus.c) sets them for the N processes it starts.
 *
 * The state is the process's (one communicator a process), so the trainer's code stays that of one
 * GPU with three calls: take the slice, all-reduce the gradients, agree on stopping. */
#ifndef DG_MODELS_DATA_PARALLEL_H
#define DG_MODELS_DATA_PARALLEL_H

#include "deltagrad.h"

#include <signal.h>
#include <stddef.h>

/* Gradients travel in buckets of DG_DP_BUCKET_MB megabytes (25 by default, as PyTorch DDP's
 * bucket_cap_mb): a bucket is packed from the gradients, all-reduced and unpacked, so the extra
 * device memory is one bucket, not a copy of every gradient. */
#define DG_DP_BUCKET_MB_DEFAULT 25

/* The place of this process from DG_WORLD and DG_RANK (both absent: rank 0 of 1).  0, or -1 with
 * dg_error naming the variable that is malformed or out of range. */
int dg_dp_env(int *rank, int *world);

/* The rows [*start, *start + *count) of a global batch of `batch` rows that rank takes; batch must be
 * a multiple of world (equal slices keep the mean of the ranks' means the global mean).  0, or -1
 * with dg_error. */
int dg_dp_slice(int64_t batch, int rank, int world, int64_t *start, int64_t *count);

/* The rendezvous file: rank 0 writes the n bytes of id to path atomically (a temporary file renamed
 * over it), the others wait for it, polling, at most timeout_s seconds, then fail with a message
 * naming the file.  0, or -1 with dg_error. */
int dg_dp_rendezvous_publish(const char *path, const unsigned char *id, size_t n);
int dg_dp_rendezvous_wait(const char *path, unsigned char *id, size_t n, double timeout_s);
/* id[0..n) from 2n hex digits.  0, or -1 with dg_error. */
int dg_dp_id_from_hex(const char *hex, unsigned char *id, size_t n);

/* Joins the run the environment describes: the rendezvous, then the communicator of the ranks on
 * this process's GPU.  A single process: nothing to do.  0, or -1 with dg_error. */
int dg_dp_init(void);
/* Whether this process is one rank of several (after dg_dp_init). */
bool dg_dp_active(void);
int dg_dp_rank(void);  /* 0 when not active */
int dg_dp_world(void); /* 1 when not active */

/* Replaces *in and *tg, a global batch [B, ...], by this rank's rows of it (dg_dp_slice).  Not active:
 * leaves them.  0, or -1 with dg_error. */
int dg_dp_take_slice(dg_tensor **in, dg_tensor **tg);

/* What the gradients travel and are averaged in: DG_F32 (the default: the mean is that of the f32
 * gradients, up to the order of the sums) or DG_BF16 (half the bytes; each rank's gradient and the
 * mean are rounded to bf16, as PyTorch DDP's bf16 compression hook does; the optimiser still works
 * in f32).  0, or -1 with dg_error. */
int dg_dp_set_grad_dtype(dg_dtype dt);

/* A step's all-reduce, overlapped with the backward.  Afterwards each parameter's gradient (f32,
 * contiguous, on the GPU; a parameter without one counts as zeros and still gets none) is the mean
 * over the ranks of that gradient, the loss is the mean of the ranks' losses, and the ranks agree
 * on stopping (see dg_dp_stop_flag):
 *
 *   dg_dp_step_prepare()                before the forward: this rank's stop request written on
 *                                       the device, queued; from the second step on, the gradients
 *                                       become views into one flat buffer (made once)
 *   dg_dp_step_begin(n, params, loss)   after the forward: queues the loss's and the stop request's
 *                                       small collective
 *   dg_backward_hooked(loss, NULL, dg_dp_leaf_ready, NULL)
 *                                       each gradient joins the open bucket as soon as it is final;
 *                                       a full bucket is all-reduced on the side stream while the
 *                                       backward goes on
 *   dg_dp_step_end()                    the parameters not reached, the last bucket; the device's
 *                                       stream waits for the side stream from here on
 *   ... the optimiser, queued ...
 *   dg_dp_step_finish(&loss)            waits for all of it (at most DG_DP_TIMEOUT, else an error)
 *                                       and reads the mean loss and the stop request
 *
 * Between dg_dp_step_prepare and dg_dp_step_end nothing reads the device, so the step can be
 * captured in a CUDA graph (models/train_graph.c), which then reads dg_dp_scalars on the device
 * instead of calling dg_dp_step_finish, and after dg_dp_wait hands each step's mean stop request
 * to dg_dp_note_stop.
 *
 * The buckets are cut in the order the gradients become final (the reverse of the forward), the
 * same on every rank, so every rank issues the same collectives in the same order.  Not active:
 * nothing.  Each returns 0, or -1 with dg_error. */
int dg_dp_step_prepare(void);
int dg_dp_step_begin(int64_t n, dg_tensor *const *params, dg_tensor *loss);
int dg_dp_leaf_ready(dg_tensor *leaf, void *ctx);
int dg_dp_step_end(void);
int dg_dp_step_finish(double *loss);
/* The step's f32 [2] on the GPU, after dg_dp_step_end in stream order: the mean of the ranks'
 * losses and the mean of their stop requests (each 0 or 1).  NULL when not active. */
dg_tensor *dg_dp_scalars(void);
/* dg_dp_mark_step after each queued step; dg_dp_wait waits for everything queued on this rank's
 * GPU, giving up when no step has finished for DG_DP_TIMEOUT (a rank that died leaves its
 * collectives unfinished: an error, not a hang; a long queue that advances is no error).  Wait at
 * least once every 256 steps.  Not active: nothing. */
int dg_dp_mark_step(void);
int dg_dp_wait(void);
/* A step's mean stop request read back: above 0, some rank asked, and every rank stops after the
 * step at which this is read (the caller reads at the same step on every rank). */
void dg_dp_note_stop(double mean_request);

/* Stopping on a signal must happen at the same step on every rank, or the ranks that go on wait for
 * the ones that stopped.  The signal handler sets *local (this rank's request); each
 * step shares the requests, and the flag returned here becomes non-zero on every
 * rank after the same step once any rank asked.  The trainer reads the returned flag. */
volatile sig_atomic_t *dg_dp_stop_flag(volatile sig_atomic_t *local);

/* Leaves the run (frees the communicator).  Safe to call when not active. */
void dg_dp_shutdown(void);

#endif
